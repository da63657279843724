/* batcher.c - dynamic batching for one model version (see batcher.h).
 *
 * Invariants: every queued request is in exactly one place — the FIFO queue (not yet taken), or a
 * worker's batch (taken; the submitter waits for it to finish, a deadline no longer applies). queued_rows
 * is the sum of rows in the FIFO. A blocking submitter only returns after its request left both places, so
 * the worker never writes into a request whose caller is gone. An asynchronous request (heap-allocated, no
 * waiter) is completed by the worker: its callback runs outside the lock, then the worker frees it; one whose
 * deadline passes in the queue, or whose caller cancels it, is taken out by a worker: the one waiting for the
 * open batch to fill wakes at the earliest queued deadline, and every BT_CANCEL_POLL_US while a cancellable
 * request is queued; otherwise the worker that next forms a batch.
 */
#include "batcher.h"
#include "../engine/plan/plan.h"

#include <errno.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct bt_req {
    const srv_tensors *in;
    srv_tensors *out;
    int64_t rows;
    int64_t enq_us;
    int done;
    srv_code code;
    srv_error err;
    pthread_cond_t cv;    /* signalled when done: each submitter wakes only for its own request */
    srv_batch_done_fn async_done; /* non-NULL: asynchronous (see batcher.h); the worker completes and frees it */
    void *async_arg;
    int64_t deadline_us;
    int64_t run_deadline_us; /* the deadline ops that loop stop at once it runs (sync requests too; 0 none) */
    const atomic_int *cancel; /* asynchronous only: non-zero once the caller gave up (a cancelled gRPC call) */
    struct bt_req *next;
} bt_req;

struct srv_batcher {
    srv_batch_opts o;
    srv_batch_run_fn run;
    srv_batch_observe_fn observe;
    void *ctx;
    pthread_mutex_t mu;
    pthread_cond_t work;  /* queue changed or stopping */
    bt_req *head, *tail;
    int64_t queued_rows;
    int stopping;
    pthread_t *threads;
    int nthreads;
};

void srv_batch_opts_default(srv_batch_opts *o) {
    memset(o, 0, sizeof *o);
    o->max_batch_size = 32;
    o->batch_timeout_micros = 1000;
    o->max_enqueued_batches = 100;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    o->num_batch_threads = n > 0 ? n : 1;
}

/* Can b's inputs be stacked with a's? Same names, dtypes, ranks and dims after dim 0. */
static int bt_compatible(const srv_tensors *a, const srv_tensors *b) {
    if (a->n != b->n) return 0;
    for (int i = 0; i < a->n; i++) {
        int j = srv_tensors_find(b, a->names[i]);
        if (j < 0) return 0;
        const eng_tensor *x = &a->t[i], *y = &b->t[j];
        if (x->dtype != y->dtype || x->ndim != y->ndim) return 0;
        for (int d = 1; d < x->ndim; d++)
            if (x->dims[d] != y->dims[d]) return 0;
    }
    return 1;
}

static void bt_abstime(int64_t us_from_now, struct timespec *ts) {
    clock_gettime(CLOCK_REALTIME, ts);
    int64_t ns = (int64_t)ts->tv_nsec + (us_from_now % 1000000) * 1000;
    ts->tv_sec += (time_t)(us_from_now / 1000000 + ns / 1000000000);
    ts->tv_nsec = (long)(ns % 1000000000);
}

static int64_t bt_pad_to(const srv_batcher *b, int64_t rows) {
    for (int i = 0; i < b->o.nallowed; i++)
        if (b->o.allowed_batch_sizes[i] >= rows) return b->o.allowed_batch_sizes[i];
    return rows;
}

/* Rows in the queue that could join a batch started by head (FIFO order, fitting max_batch_size). */
static int64_t bt_joinable_rows(const srv_batcher *b) {
    int64_t rows = 0;
    for (bt_req *r = b->head; r; r = r->next)
        if (bt_compatible(b->head->in, r->in) && rows + r->rows <= b->o.max_batch_size) rows += r->rows;
    return rows;
}

/* Run one batch (no lock held): concatenate, pad, run, split. Sets code/err on every request. */
static void bt_run_batch(srv_batcher *b, bt_req **reqs, int n, int64_t rows) {
    const srv_tensors *first = reqs[0]->in;
    int64_t padded = bt_pad_to(b, rows);
    srv_tensors in = {0}, out = {0};
    srv_error err = {0};
    srv_code code = SRV_OK;
    for (int i = 0; i < first->n && code == SRV_OK; i++) {
        eng_tensor t = first->t[i];
        t.dims[0] = padded;
        size_t nb;
        if (eng_tensor_nbytes_checked(&t, first->names[i], &nb) != ENG_STATUS_OK) {
            code = srv_err_from_eng(&err, ENG_STATUS_OUT_OF_MEMORY, "batch: ");
            break;
        }
        size_t row_bytes = t.dims[0] ? nb / (size_t)t.dims[0] : 0;
        t.data = eng_alloc(nb ? nb : 1);
        if (!t.data) {
            code = srv_err(&err, SRV_RESOURCE_EXHAUSTED, "batch: cannot allocate %zu bytes for input '%s'", nb, first->names[i]);
            break;
        }
        size_t off = 0;
        for (int k = 0; k < n; k++) {
            int j = srv_tensors_find(reqs[k]->in, first->names[i]);
            size_t len = row_bytes * (size_t)reqs[k]->rows;
            memcpy((char *)t.data + off, reqs[k]->in->t[j].data, len);
            off += len;
        }
        for (int64_t r = rows; r < padded; r++) /* pad by repeating the last real row */
            memcpy((char *)t.data + (size_t)r * row_bytes, (char *)t.data + (size_t)(rows - 1) * row_bytes, row_bytes);
        if (srv_tensors_add(&in, first->names[i], &t) != 0) {
            eng_free(t.data);
            code = srv_err(&err, SRV_RESOURCE_EXHAUSTED, "out of memory");
        }
    }
    /* ops that loop (Loop, Scan) stop at the batch's deadline: the latest of its requests' (none if one has none) */
    int64_t dl = 0;
    int none = 0;
    for (int k = 0; k < n; k++) {
        if (reqs[k]->run_deadline_us <= 0) none = 1;
        else if (reqs[k]->run_deadline_us > dl) dl = reqs[k]->run_deadline_us;
    }
    eng_run_set_deadline(none ? 0 : dl);
    if (code == SRV_OK) code = b->run(b->ctx, &in, &out, &err);
    eng_run_set_deadline(0);
    for (int i = 0; code == SRV_OK && i < out.n; i++)
        if (out.t[i].ndim < 1 || out.t[i].dims[0] != padded)
            code = srv_err(&err, SRV_INVALID_ARGUMENT,
                           "batching: output '%s' has %lld rows for a batch of %lld; the model must keep dim 0 as the batch",
                           out.names[i], (long long)(out.t[i].ndim ? out.t[i].dims[0] : 0), (long long)padded);
    int64_t off = 0;
    for (int k = 0; k < n; k++) {
        bt_req *r = reqs[k];
        r->code = code;
        if (code != SRV_OK) {
            r->err = err;
            continue;
        }
        for (int i = 0; i < out.n && r->code == SRV_OK; i++) {
            eng_tensor t = out.t[i];
            size_t row_bytes = eng_tensor_nbytes(&t) / (size_t)padded;
            t.dims[0] = r->rows;
            t.data = eng_alloc(row_bytes * (size_t)r->rows + 1);
            if (!t.data) {
                r->code = srv_err(&r->err, SRV_RESOURCE_EXHAUSTED, "out of memory");
                break;
            }
            memcpy(t.data, (char *)out.t[i].data + (size_t)off * row_bytes, row_bytes * (size_t)r->rows);
            if (srv_tensors_add(r->out, out.names[i], &t) != 0) {
                eng_free(t.data);
                r->code = srv_err(&r->err, SRV_RESOURCE_EXHAUSTED, "out of memory");
            }
        }
        off += r->rows;
    }
    srv_tensors_free(&in);
    srv_tensors_free(&out);
}

/* Unlink the queued request *pp (prev: the one before it, NULL at the head); lock held. Returns it. */
static bt_req *bt_unlink(srv_batcher *b, bt_req **pp, bt_req *prev) {
    bt_req *r = *pp;
    *pp = r->next;
    if (b->tail == r) b->tail = prev;
    b->queued_rows -= r->rows;
    return r;
}

#define BT_CANCEL_POLL_US 10000

/* Take every asynchronous request whose deadline passed or whose caller cancelled it out of the queue (lock
 * held); returns them as a list. */
static bt_req *bt_take_expired(srv_batcher *b) {
    bt_req *list = NULL, **lt = &list, **pp = &b->head, *prev = NULL;
    int64_t now = 0;
    while (*pp) {
        bt_req *r = *pp;
        int gone = r->cancel ? atomic_load(r->cancel) : 0;
        int late = r->deadline_us > 0 && (now ? now : (now = srv_now_us())) >= r->deadline_us;
        if (r->async_done && (gone || late)) {
            bt_unlink(b, pp, prev);
            r->code = late || gone == SRV_CANCEL_DEADLINE
                          ? srv_err(&r->err, SRV_DEADLINE_EXCEEDED, "deadline exceeded while waiting in the batching queue")
                          : srv_err(&r->err, SRV_CANCELLED, "the client cancelled the request while it waited in the "
                                                            "batching queue");
            *lt = r, lt = &r->next;
        } else {
            prev = r;
            pp = &r->next;
        }
    }
    *lt = NULL;
    return list;
}

/* How long until a queued asynchronous request must leave the queue (its deadline; BT_CANCEL_POLL_US for one
 * that can be cancelled; 0: one must leave now), or -1 when none can (lock held). */
static int64_t bt_wake_us(const srv_batcher *b, int64_t now) {
    int64_t best = -1;
    for (const bt_req *r = b->head; r; r = r->next) {
        if (!r->async_done) continue;
        if (r->cancel) {
            if (atomic_load(r->cancel)) return 0;
            if (best < 0 || BT_CANCEL_POLL_US < best) best = BT_CANCEL_POLL_US;
        }
        if (r->deadline_us > 0) {
            int64_t d = r->deadline_us - now;
            if (d <= 0) return 0;
            if (best < 0 || d < best) best = d;
        }
    }
    return best;
}

/* Run the callbacks of a list of finished asynchronous requests and free them (no lock held). */
static void bt_complete_async(bt_req *r) {
    while (r) {
        bt_req *next = r->next;
        r->async_done(r->async_arg, r->code, &r->err);
        free(r);
        r = next;
    }
}

/* Answer the requests that must leave the queue (expired, cancelled); lock held, dropped while they complete. */
static void bt_sweep(srv_batcher *b) {
    bt_req *expired = bt_take_expired(b);
    if (!expired) return;
    pthread_mutex_unlock(&b->mu);
    bt_complete_async(expired);
    pthread_mutex_lock(&b->mu);
}

static void *bt_worker(void *arg) {
    srv_batcher *b = arg;
    bt_req **batch = malloc((size_t)(b->o.max_batch_size + 1) * sizeof *batch);
    pthread_mutex_lock(&b->mu);
    while (batch) {
        while (!b->head && !b->stopping) pthread_cond_wait(&b->work, &b->mu);
        if (!b->head) break; /* stopping and drained */
        /* wait for the batch to fill, up to batch_timeout_micros after the oldest request arrived */
        while (!b->stopping && b->head && bt_joinable_rows(b) < b->o.max_batch_size) {
            int64_t now = srv_now_us(), left = b->head->enq_us + b->o.batch_timeout_micros - now;
            if (left <= 0) break;
            int64_t wake = bt_wake_us(b, now);
            if (wake == 0) { /* one must leave now: answer it, then wait on for the rest */
                bt_sweep(b);
                continue;
            }
            if (wake > 0 && wake < left) left = wake;
            struct timespec ts;
            bt_abstime(left, &ts);
            pthread_cond_timedwait(&b->work, &b->mu, &ts);
        }
        bt_sweep(b);
        if (!b->head) continue; /* another worker took it, or it expired */
        const srv_tensors *lead = b->head->in;
        int n = 0;
        int64_t rows = 0, queue_us = srv_now_us() - b->head->enq_us;
        bt_req **pp = &b->head, *prev = NULL;
        while (*pp) {
            bt_req *r = *pp;
            if (n < b->o.max_batch_size && rows + r->rows <= b->o.max_batch_size && bt_compatible(lead, r->in)) {
                batch[n++] = bt_unlink(b, pp, prev);
                rows += r->rows;
            } else {
                prev = r;
                pp = &r->next;
            }
        }
        pthread_mutex_unlock(&b->mu);
        bt_run_batch(b, batch, n, rows);
        if (b->observe) b->observe(b->ctx, rows, bt_pad_to(b, rows), queue_us);
        bt_req *async = NULL, **at = &async;
        int nsync = 0;
        for (int k = 0; k < n; k++) { /* asynchronous ones to a list (freed as they complete), waiters kept */
            if (batch[k]->async_done) *at = batch[k], at = &batch[k]->next;
            else batch[nsync++] = batch[k];
        }
        *at = NULL;
        bt_complete_async(async);
        pthread_mutex_lock(&b->mu);
        for (int k = 0; k < nsync; k++) {
            batch[k]->done = 1;
            pthread_cond_signal(&batch[k]->cv);
        }
    }
    pthread_mutex_unlock(&b->mu);
    free(batch);
    return NULL;
}

srv_batcher *srv_batcher_new(const srv_batch_opts *o, srv_batch_run_fn run, srv_batch_observe_fn observe, void *ctx) {
    srv_batcher *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->o = *o;
    if (b->o.max_batch_size < 1) b->o.max_batch_size = 1;
    if (b->o.max_enqueued_batches < 1) b->o.max_enqueued_batches = 1;
    if (b->o.num_batch_threads < 1) b->o.num_batch_threads = 1;
    b->run = run;
    b->observe = observe;
    b->ctx = ctx;
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->work, NULL);
    b->threads = calloc((size_t)b->o.num_batch_threads, sizeof *b->threads);
    if (!b->threads) {
        free(b);
        return NULL;
    }
    for (int i = 0; i < b->o.num_batch_threads; i++) {
        if (pthread_create(&b->threads[i], NULL, bt_worker, b) != 0) break;
        b->nthreads++;
    }
    if (b->nthreads == 0) {
        free(b->threads);
        free(b);
        return NULL;
    }
    return b;
}

/* Row count of a request (every input rank >= 1, the same dim 0, within max_batch_size). */
static srv_code bt_rows(const srv_batcher *b, const srv_tensors *in, int64_t *out_rows, srv_error *err) {
    if (in->n == 0) return srv_err(err, SRV_INVALID_ARGUMENT, "batching needs at least one input");
    int64_t rows = -1;
    for (int i = 0; i < in->n; i++) {
        if (in->t[i].ndim < 1)
            return srv_err(err, SRV_INVALID_ARGUMENT, "batching: input '%s' is a scalar; batched inputs need a batch dimension",
                           in->names[i]);
        if (rows >= 0 && in->t[i].dims[0] != rows)
            return srv_err(err, SRV_INVALID_ARGUMENT, "batching: input '%s' has %lld rows, other inputs have %lld",
                           in->names[i], (long long)in->t[i].dims[0], (long long)rows);
        rows = in->t[i].dims[0];
    }
    if (rows < 1) return srv_err(err, SRV_INVALID_ARGUMENT, "batching: a request needs at least one row");
    if (rows > b->o.max_batch_size)
        return srv_err(err, SRV_INVALID_ARGUMENT, "batching: request of %lld rows is larger than max_batch_size %lld",
                       (long long)rows, (long long)b->o.max_batch_size);
    *out_rows = rows;
    return SRV_OK;
}

/* Append r to the queue unless stopping or full (lock held). */
static srv_code bt_enqueue(srv_batcher *b, bt_req *r, srv_error *err) {
    if (b->stopping) return srv_err(err, SRV_UNAVAILABLE, "the model version is being unloaded");
    if (b->queued_rows + r->rows > b->o.max_enqueued_batches * b->o.max_batch_size)
        return srv_err(err, SRV_RESOURCE_EXHAUSTED, "batching queue is full (%lld rows queued, limit %lld)",
                       (long long)b->queued_rows, (long long)(b->o.max_enqueued_batches * b->o.max_batch_size));
    if (b->tail) b->tail->next = r;
    else b->head = r;
    b->tail = r;
    b->queued_rows += r->rows;
    pthread_cond_broadcast(&b->work);
    return SRV_OK;
}

void srv_batcher_submit_async(srv_batcher *b, const srv_tensors *in, srv_tensors *out, int64_t deadline_us,
                              const atomic_int *cancel, srv_batch_done_fn done, void *arg) {
    srv_error err = {0};
    int64_t rows = 0;
    srv_code c = bt_rows(b, in, &rows, &err);
    bt_req *r = c == SRV_OK ? calloc(1, sizeof *r) : NULL;
    if (c == SRV_OK && !r) c = srv_err(&err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    if (c == SRV_OK) {
        *r = (bt_req){.in = in, .out = out, .rows = rows, .enq_us = srv_now_us(), .async_done = done,
                      .async_arg = arg, .deadline_us = deadline_us, .run_deadline_us = deadline_us, .cancel = cancel};
        pthread_mutex_lock(&b->mu);
        c = bt_enqueue(b, r, &err);
        pthread_mutex_unlock(&b->mu);
        if (c == SRV_OK) return;
        free(r);
    }
    done(arg, c, &err);
}

srv_code srv_batcher_submit(srv_batcher *b, const srv_tensors *in, srv_tensors *out, int64_t deadline_us,
                            srv_error *err) {
    int64_t rows = 0;
    srv_code c0 = bt_rows(b, in, &rows, err);
    if (c0 != SRV_OK) return c0;
    bt_req r = {.in = in, .out = out, .rows = rows, .enq_us = srv_now_us(), .run_deadline_us = deadline_us};
    pthread_cond_init(&r.cv, NULL);
    pthread_mutex_lock(&b->mu);
    c0 = bt_enqueue(b, &r, err);
    if (c0 != SRV_OK) {
        pthread_mutex_unlock(&b->mu);
        pthread_cond_destroy(&r.cv);
        return c0;
    }
    int timed_out = 0;
    while (!r.done) {
        if (deadline_us > 0) {
            int64_t left = deadline_us - srv_now_us();
            if (left <= 0) { /* take it out if still waiting in the queue; else a worker has it: wait for that */
                bt_req **pp = &b->head, *prev = NULL;
                while (*pp && *pp != &r) prev = *pp, pp = &(*pp)->next;
                if (*pp) {
                    bt_unlink(b, pp, prev);
                    timed_out = 1;
                    break;
                }
            }
            if (left > 0) {
                struct timespec ts;
                bt_abstime(left, &ts);
                pthread_cond_timedwait(&r.cv, &b->mu, &ts);
                continue;
            }
        }
        pthread_cond_wait(&r.cv, &b->mu);
    }
    pthread_mutex_unlock(&b->mu);
    pthread_cond_destroy(&r.cv);
    if (timed_out) return srv_err(err, SRV_DEADLINE_EXCEEDED, "deadline exceeded while waiting in the batching queue");
    if (r.code != SRV_OK && err) *err = r.err;
    return r.code;
}

void srv_batcher_free(srv_batcher **bp) {
    if (!bp || !*bp) return;
    srv_batcher *b = *bp;
    pthread_mutex_lock(&b->mu);
    b->stopping = 1;
    pthread_cond_broadcast(&b->work);
    pthread_mutex_unlock(&b->mu);
    for (int i = 0; i < b->nthreads; i++) pthread_join(b->threads[i], NULL);
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->work);
    free(b->threads);
    free(b);
    *bp = NULL;
}
