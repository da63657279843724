/* data-loader.c - the shuffling, batching loader with an optional background prefetch thread (see data.h).
 *
 * The batch sequence is a pure function of (dataset, opts): batch (epoch e, step s) holds rows
 * perm_e[s*B .. min((s+1)*B, n)), where perm_e is the identity without shuffle and otherwise
 * eng_rng_permutation seeded with seed + e. So seek() only moves a cursor, and the thread changes timing, never
 * content.
 *
 * Slots: prefetch + 1 batch buffers (each column's rows for B examples). A slot is FREE, FILLING (the producer
 * owns it, outside the lock), READY (queued in production order) or HELD (returned to the caller, valid until
 * the next call). The producer fills FREE slots in sequence order; seek() bumps a generation counter, frees
 * READY and HELD slots and repositions both cursors, and a slot that was FILLING under an older generation is
 * dropped when it completes. Without prefetch the caller fills the single slot itself. free() stops and joins
 * the thread before freeing anything.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "data-impl.h"

enum { ENG_SLOT_FREE, ENG_SLOT_FILLING, ENG_SLOT_READY, ENG_SLOT_HELD };

typedef struct eng_slot {
    int state;
    int64_t epoch, step, rows;
    eng_tensor *cols; /* [B, ...] each; data eng_alloc'd */
} eng_slot;

/* Permutation cache for one epoch (one per side: producer thread, and caller without a thread). */
typedef struct eng_perm {
    int64_t epoch; /* -1: none */
    int64_t *idx;
} eng_perm;

struct eng_loader {
    const eng_dataset *d;
    eng_loader_opts o;
    int64_t n, steps;
    eng_slot *slots;
    int nslots;
    /* caller cursor: the next batch the caller will get */
    int64_t epoch, step;
    eng_perm cperm;
    /* thread state, under mu */
    int threaded, stop;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv_free, cv_ready;
    uint64_t gen;
    int64_t pepoch, pstep; /* the producer's next batch */
    int *queue;            /* READY slots in order: ring of nslots */
    int qhead, qlen;
    eng_perm pperm;
};

static const int64_t *eng_perm_get(const eng_loader *l, eng_perm *p, int64_t epoch) {
    if (p->epoch != epoch) {
        if (l->o.shuffle) {
            eng_rng r;
            eng_rng_seed(&r, l->o.seed + (uint64_t)epoch);
            eng_rng_permutation(&r, p->idx, l->n);
        } else if (p->epoch == -1) {
            for (int64_t i = 0; i < l->n; i++) p->idx[i] = i;
        }
        p->epoch = epoch;
    }
    return p->idx;
}

static void eng_slot_fill(const eng_loader *l, eng_perm *p, eng_slot *s, int64_t epoch, int64_t step) {
    const int64_t *perm = eng_perm_get(l, p, epoch);
    int64_t start = step * l->o.batch_size, rows = l->n - start < l->o.batch_size ? l->n - start : l->o.batch_size;
    for (int c = 0; c < l->d->ncols; c++) {
        eng_data_gather(&l->d->cols[c].t, perm + start, rows, s->cols[c].data);
        s->cols[c].dims[0] = rows;
    }
    s->epoch = epoch;
    s->step = step;
    s->rows = rows;
}

static void eng_batch_from(const eng_loader *l, const eng_slot *s, eng_batch *b) {
    b->cols = s->cols;
    b->ncols = l->d->ncols;
    b->rows = s->rows;
    b->epoch = s->epoch;
    b->step = s->step;
}

static void *eng_loader_thread(void *arg) {
    eng_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        int si = -1;
        while (!l->stop) {
            for (int i = 0; i < l->nslots && si < 0; i++)
                if (l->slots[i].state == ENG_SLOT_FREE) si = i;
            if (si >= 0) break;
            pthread_cond_wait(&l->cv_free, &l->mu);
        }
        if (l->stop) break;
        if (l->pstep >= l->steps) {
            l->pepoch++;
            l->pstep = 0;
        }
        int64_t e = l->pepoch, s = l->pstep++;
        uint64_t gen = l->gen;
        eng_slot *slot = &l->slots[si];
        slot->state = ENG_SLOT_FILLING;
        pthread_mutex_unlock(&l->mu);
        eng_slot_fill(l, &l->pperm, slot, e, s);
        pthread_mutex_lock(&l->mu);
        if (gen == l->gen && !l->stop) {
            slot->state = ENG_SLOT_READY;
            l->queue[(l->qhead + l->qlen++) % l->nslots] = si;
            pthread_cond_signal(&l->cv_ready);
        } else {
            slot->state = ENG_SLOT_FREE;
        }
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

int64_t eng_loader_steps_per_epoch(const eng_loader *l) { return l ? l->steps : 0; }

eng_status eng_loader_new(const eng_dataset *d, const eng_loader_opts *o, eng_loader **out) {
    if (!out) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "eng_loader_new: NULL output");
    *out = NULL;
    if (!d || !o || d->ncols < 1 || d->n < 1)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "eng_loader_new: %s", !d || !o ? "NULL argument"
                                                                                   : "the dataset is empty");
    if (o->batch_size < 1)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: batch size %lld must be >= 1", d->source,
                       (long long)o->batch_size);
    if (o->prefetch < 0 || o->prefetch > 64)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: prefetch %d is outside [0, 64]", d->source, o->prefetch);
    int64_t steps = o->drop_remainder ? d->n / o->batch_size : (d->n + o->batch_size - 1) / o->batch_size;
    if (steps < 1)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: %lld examples make no full batch of %lld (drop_remainder)",
                       d->source, (long long)d->n, (long long)o->batch_size);
    int64_t b = o->batch_size < d->n ? o->batch_size : d->n;
    eng_loader *l = calloc(1, sizeof *l);
    if (!l) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: out of memory for the loader", d->source);
    l->d = d;
    l->o = *o;
    l->n = d->n;
    l->steps = steps;
    l->nslots = o->prefetch + 1;
    l->cperm.epoch = l->pperm.epoch = -1;
    l->slots = calloc((size_t)l->nslots, sizeof *l->slots);
    l->queue = calloc((size_t)l->nslots, sizeof *l->queue);
    l->cperm.idx = malloc((size_t)d->n * sizeof(int64_t));
    if (o->prefetch) l->pperm.idx = malloc((size_t)d->n * sizeof(int64_t));
    eng_status st = ENG_STATUS_OK;
    if (!l->slots || !l->queue || !l->cperm.idx || (o->prefetch && !l->pperm.idx))
        st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: out of memory for the loader", d->source);
    for (int i = 0; i < l->nslots && st == ENG_STATUS_OK; i++) {
        if (!(l->slots[i].cols = calloc((size_t)d->ncols, sizeof(eng_tensor)))) {
            st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: out of memory for the loader", d->source);
            break;
        }
        for (int c = 0; c < d->ncols && st == ENG_STATUS_OK; c++) {
            eng_tensor *t = &l->slots[i].cols[c];
            *t = d->cols[c].t;
            t->dims[0] = b;
            t->data = eng_alloc(eng_tensor_nbytes(t) ? eng_tensor_nbytes(t) : 1);
            if (!t->data)
                st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: cannot allocate a batch of column '%s'", d->source,
                             d->cols[c].name);
        }
    }
    if (st == ENG_STATUS_OK && o->prefetch) {
        pthread_mutex_init(&l->mu, NULL);
        pthread_cond_init(&l->cv_free, NULL);
        pthread_cond_init(&l->cv_ready, NULL);
        l->threaded = 1;
        if (pthread_create(&l->th, NULL, eng_loader_thread, l) != 0) {
            l->threaded = 0;
            pthread_mutex_destroy(&l->mu);
            pthread_cond_destroy(&l->cv_free);
            pthread_cond_destroy(&l->cv_ready);
            st = eng_err(ENG_STATUS_INTERNAL, "%s: cannot start the prefetch thread", d->source);
        }
    }
    if (st != ENG_STATUS_OK) {
        eng_loader_free(&l);
        return st;
    }
    *out = l;
    return ENG_STATUS_OK;
}

eng_status eng_loader_next(eng_loader *l, eng_batch *b, int *end) {
    if (!l || !b || !end) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "eng_loader_next: NULL argument");
    memset(b, 0, sizeof *b);
    *end = 0;
    if (!l->threaded) {
        if (l->step >= l->steps) {
            l->epoch++;
            l->step = 0;
            *end = 1;
            return ENG_STATUS_OK;
        }
        eng_slot_fill(l, &l->cperm, &l->slots[0], l->epoch, l->step++);
        eng_batch_from(l, &l->slots[0], b);
        return ENG_STATUS_OK;
    }
    pthread_mutex_lock(&l->mu);
    for (int i = 0; i < l->nslots; i++)
        if (l->slots[i].state == ENG_SLOT_HELD) {
            l->slots[i].state = ENG_SLOT_FREE;
            pthread_cond_signal(&l->cv_free);
        }
    if (l->step >= l->steps) {
        l->epoch++;
        l->step = 0;
        *end = 1;
        pthread_mutex_unlock(&l->mu);
        return ENG_STATUS_OK;
    }
    while (l->qlen == 0) pthread_cond_wait(&l->cv_ready, &l->mu);
    int si = l->queue[l->qhead];
    l->qhead = (l->qhead + 1) % l->nslots;
    l->qlen--;
    eng_slot *s = &l->slots[si];
    eng_status st = ENG_STATUS_OK;
    if (s->epoch != l->epoch || s->step != l->step) { /* cannot happen: seek flushes the queue */
        s->state = ENG_SLOT_FREE;
        pthread_cond_signal(&l->cv_free);
        st = eng_err(ENG_STATUS_INTERNAL, "%s: loader expected batch (%lld, %lld), the thread made (%lld, %lld)",
                     l->d->source, (long long)l->epoch, (long long)l->step, (long long)s->epoch, (long long)s->step);
    } else {
        s->state = ENG_SLOT_HELD;
        l->step++;
        eng_batch_from(l, s, b);
    }
    pthread_mutex_unlock(&l->mu);
    return st;
}

eng_status eng_loader_seek(eng_loader *l, int64_t epoch, int64_t step) {
    if (!l) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "eng_loader_seek: NULL loader");
    if (epoch < 0 || step < 0 || step > l->steps)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: cannot seek to epoch %lld step %lld (%lld steps per epoch)",
                       l->d->source, (long long)epoch, (long long)step, (long long)l->steps);
    if (!l->threaded) {
        l->epoch = epoch;
        l->step = step;
        return ENG_STATUS_OK;
    }
    pthread_mutex_lock(&l->mu);
    for (int i = 0; i < l->nslots; i++)
        if (l->slots[i].state == ENG_SLOT_HELD || l->slots[i].state == ENG_SLOT_READY) l->slots[i].state = ENG_SLOT_FREE;
    l->qhead = l->qlen = 0;
    l->gen++;
    l->epoch = l->pepoch = epoch;
    l->step = l->pstep = step;
    pthread_cond_broadcast(&l->cv_free);
    pthread_mutex_unlock(&l->mu);
    return ENG_STATUS_OK;
}

void eng_loader_free(eng_loader **lp) {
    if (!lp || !*lp) return;
    eng_loader *l = *lp;
    if (l->threaded) {
        pthread_mutex_lock(&l->mu);
        l->stop = 1;
        pthread_cond_broadcast(&l->cv_free);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->th, NULL);
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->cv_free);
        pthread_cond_destroy(&l->cv_ready);
    }
    for (int i = 0; l->slots && i < l->nslots; i++) {
        for (int c = 0; l->slots[i].cols && c < l->d->ncols; c++) eng_free(l->slots[i].cols[c].data);
        free(l->slots[i].cols);
    }
    free(l->slots);
    free(l->queue);
    free(l->cperm.idx);
    free(l->pperm.idx);
    free(l);
    *lp = NULL;
}
