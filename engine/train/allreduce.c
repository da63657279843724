/* allreduce.c - the communicator interface's dispatch, and eng_comm for ranks that are threads of one process (see
 * allreduce.h).
 *
 * Algorithm: every rank publishes its buffer pointer and meets the others at a barrier; each rank then reduces
 * its own contiguous slice of the vector into a shared scratch buffer, summing rank 0, 1, ..., R-1 in that
 * order (so the result is bit-identical whatever the thread timing); a second barrier; each rank copies the
 * whole result back into its buffer; a third barrier keeps the scratch buffer and the published pointers
 * alive until every rank has copied. The last rank to reach the first barrier checks that all ranks passed
 * the same n and sizes the scratch buffer (under the mutex, while nobody reads it).
 *
 * Invariants: one allreduce or barrier in flight per communicator (all ranks call the same sequence of
 * collectives, as with MPI/NCCL); rank indices are 0..size-1, each used by exactly one thread.
 */
#include "allreduce-impl.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../ir/tensor.h"

typedef struct comm_threads {
    eng_comm base;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    uint64_t generation;
    float **bufs;      /* size entries: the buffer each rank published */
    int64_t *ns;       /* size entries: the n each rank passed */
    float *scratch;    /* reduced result, cap floats */
    int64_t cap;
    int bad;           /* set by the last arriver when the ranks disagree on n or scratch allocation failed */
    const void *src;   /* a broadcast's source: rank 0's buffer */
    size_t src_n;
} comm_threads;

static const eng_comm_ops threads_ops;

eng_status eng_comm_new_threads(int size, eng_comm **out) {
    *out = NULL;
    if (size < 1 || size > 4096) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "communicator size %d out of range [1, 4096]", size);
    comm_threads *c = calloc(1, sizeof *c);
    if (!c) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    c->base = (eng_comm){.ops = &threads_ops, .size = size, .rank = -1};
    c->bufs = calloc((size_t)size, sizeof *c->bufs);
    c->ns = calloc((size_t)size, sizeof *c->ns);
    if (!c->bufs || !c->ns) {
        free(c->bufs);
        free(c->ns);
        free(c);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    *out = &c->base;
    return ENG_STATUS_OK;
}

static void threads_free(eng_comm *cc) {
    comm_threads *c = (comm_threads *)cc;
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c->bufs);
    free(c->ns);
    eng_free(c->scratch);
    free(c);
}

/* ---- the interface ---- */

void eng_comm_free(eng_comm **cp) {
    if (!cp || !*cp) return;
    (*cp)->ops->free(*cp);
    *cp = NULL;
}

int eng_comm_size(const eng_comm *c) { return c->size; }
int eng_comm_rank(const eng_comm *c) { return c->rank; }
const char *eng_comm_kind(const eng_comm *c) { return c->ops->kind; }

eng_status eng_comm_allreduce(eng_comm *c, int rank, float *buf, int64_t n, int mean) {
    if (rank < 0 || rank >= c->size) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "rank %d out of range [0, %d)", rank, c->size);
    if (c->rank >= 0 && rank != c->rank)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "rank %d: this process is rank %d of the %s communicator", rank, c->rank,
                       c->ops->kind);
    if (c->size == 1) return ENG_STATUS_OK; /* the mean or sum of one buffer is itself */
    return c->ops->allreduce(c, rank, buf, n, mean);
}

void eng_comm_barrier(eng_comm *c, int rank) {
    if (c->size > 1) c->ops->barrier(c, rank);
}

eng_status eng_comm_bcast(eng_comm *c, int rank, void *buf, size_t nbytes) {
    if (rank < 0 || rank >= c->size) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "rank %d out of range [0, %d)", rank, c->size);
    if (c->rank >= 0 && rank != c->rank)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "rank %d: this process is rank %d of the %s communicator", rank, c->rank,
                       c->ops->kind);
    if (c->size == 1) return ENG_STATUS_OK;
    if (!c->ops->bcast) return eng_err(ENG_STATUS_UNSUPPORTED, "the %s communicator has no broadcast", c->ops->kind);
    return c->ops->bcast(c, rank, buf, nbytes);
}

/* ---- threads ---- */

/* Barrier; the last thread to arrive runs `last` (under the mutex) before releasing the others. */
static void comm_wait(comm_threads *c, void (*last)(comm_threads *)) {
    pthread_mutex_lock(&c->mu);
    uint64_t gen = c->generation;
    if (++c->arrived == c->base.size) {
        if (last) last(c);
        c->arrived = 0;
        c->generation++;
        pthread_cond_broadcast(&c->cv);
    } else {
        while (gen == c->generation) pthread_cond_wait(&c->cv, &c->mu);
    }
    pthread_mutex_unlock(&c->mu);
}

static void comm_prepare(comm_threads *c) {
    c->bad = 0;
    for (int r = 1; r < c->base.size; r++)
        if (c->ns[r] != c->ns[0]) c->bad = 1;
    if (c->bad || c->ns[0] <= c->cap) return;
    float *s = eng_alloc((size_t)c->ns[0] * sizeof(float));
    if (!s) {
        c->bad = 2;
        return;
    }
    eng_free(c->scratch);
    c->scratch = s;
    c->cap = c->ns[0];
}

static void threads_barrier(eng_comm *cc, int rank) {
    (void)rank;
    comm_wait((comm_threads *)cc, NULL);
}

static eng_status threads_allreduce(eng_comm *cc, int rank, float *buf, int64_t n, int mean) {
    comm_threads *c = (comm_threads *)cc;
    int size = c->base.size;
    c->bufs[rank] = buf;
    c->ns[rank] = n < 0 ? 0 : n;
    comm_wait(c, comm_prepare);
    int bad = c->bad;
    if (!bad) {
        int64_t per = (n + size - 1) / size;
        int64_t lo = per * rank, hi = lo + per < n ? lo + per : n;
        float inv = 1.0f / (float)size;
        for (int64_t i = lo; i < hi; i++) {
            float s = c->bufs[0][i];
            for (int r = 1; r < size; r++) s += c->bufs[r][i];
            c->scratch[i] = mean ? s * inv : s;
        }
    }
    comm_wait(c, NULL);
    if (!bad && n > 0) memcpy(buf, c->scratch, (size_t)n * sizeof(float));
    comm_wait(c, NULL);
    if (bad == 1)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "allreduce: ranks passed different element counts (rank %d: %lld)", rank,
                       (long long)n);
    if (bad) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "allreduce: out of memory for %lld floats", (long long)n);
    return ENG_STATUS_OK;
}

/* Rank 0 publishes its buffer; the others copy it between two barriers (which keep it alive while they read). */
static eng_status threads_bcast(eng_comm *cc, int rank, void *buf, size_t nbytes) {
    comm_threads *c = (comm_threads *)cc;
    if (rank == 0) c->src = buf, c->src_n = nbytes;
    comm_wait(c, NULL);
    int bad = c->src_n != nbytes;
    if (rank != 0 && !bad && nbytes) memcpy(buf, c->src, nbytes);
    comm_wait(c, NULL);
    if (bad)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "broadcast: rank 0 sent %zu bytes, rank %d expected %zu", c->src_n,
                       rank, nbytes);
    return ENG_STATUS_OK;
}

static const eng_comm_ops threads_ops = {.kind = "threads", .allreduce = threads_allreduce, .barrier = threads_barrier,
                                         .bcast = threads_bcast, .free = threads_free};
