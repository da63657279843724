/* allreduce.c - eng_comm for ranks that are threads of one process (see allreduce.h).
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
#include "allreduce.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../ir/tensor.h"

struct eng_comm {
    int size;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    uint64_t generation;
    float **bufs;      /* size entries: the buffer each rank published */
    int64_t *ns;       /* size entries: the n each rank passed */
    float *scratch;    /* reduced result, cap floats */
    int64_t cap;
    int bad;           /* set by the last arriver when the ranks disagree on n or scratch allocation failed */
};

eng_status eng_comm_new_threads(int size, eng_comm **out) {
    *out = NULL;
    if (size < 1 || size > 4096) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "communicator size %d out of range [1, 4096]", size);
    eng_comm *c = calloc(1, sizeof *c);
    if (!c) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    c->size = size;
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
    *out = c;
    return ENG_STATUS_OK;
}

void eng_comm_free(eng_comm **cp) {
    if (!cp || !*cp) return;
    eng_comm *c = *cp;
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c->bufs);
    free(c->ns);
    eng_free(c->scratch);
    free(c);
    *cp = NULL;
}

int eng_comm_size(const eng_comm *c) { return c->size; }

/* Barrier; the last thread to arrive runs `last` (under the mutex) before releasing the others. */
static void comm_wait(eng_comm *c, void (*last)(eng_comm *)) {
    pthread_mutex_lock(&c->mu);
    uint64_t gen = c->generation;
    if (++c->arrived == c->size) {
        if (last) last(c);
        c->arrived = 0;
        c->generation++;
        pthread_cond_broadcast(&c->cv);
    } else {
        while (gen == c->generation) pthread_cond_wait(&c->cv, &c->mu);
    }
    pthread_mutex_unlock(&c->mu);
}

static void comm_prepare(eng_comm *c) {
    c->bad = 0;
    for (int r = 1; r < c->size; r++)
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

void eng_comm_barrier(eng_comm *c, int rank) {
    (void)rank;
    comm_wait(c, NULL);
}

eng_status eng_comm_allreduce(eng_comm *c, int rank, float *buf, int64_t n, int mean) {
    if (rank < 0 || rank >= c->size) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "rank %d out of range [0, %d)", rank, c->size);
    if (c->size == 1) {
        return ENG_STATUS_OK; /* the mean or sum of one buffer is itself */
    }
    c->bufs[rank] = buf;
    c->ns[rank] = n < 0 ? 0 : n;
    comm_wait(c, comm_prepare);
    int bad = c->bad;
    if (!bad) {
        int64_t per = (n + c->size - 1) / c->size;
        int64_t lo = per * rank, hi = lo + per < n ? lo + per : n;
        float inv = 1.0f / (float)c->size;
        for (int64_t i = lo; i < hi; i++) {
            float s = c->bufs[0][i];
            for (int r = 1; r < c->size; r++) s += c->bufs[r][i];
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
