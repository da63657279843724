/* cuda-comm.cu - the CUDA backend's collectives (krn_backend.comm_*): NCCL communicators over the process's GPUs
 * (ncclCommInitAll), or spanning processes and hosts (comm_id_new / comm_new_ranks: ncclGetUniqueId in global rank
 * 0's process, the id handed out by engine/train/rendezvous.c, then ncclCommInitRank for each local GPU inside one
 * ncclGroupStart/End); an in-place float sum all-reduce per local rank on its context's stream, each rank's buffer
 * first scaled by its prescale (a replica's share of the batch). Without NCCL at build time (TENSORD_NCCL=0) the
 * constructors refuse with the reason, and the trainer all-reduces through host memory (and MPI) instead.
 *
 * Invariant: cm->comms[i] is local rank i's communicator (global rank first + i), on device devices[i]. */
#include "cuda-impl.h"
#include "../backend-impl.h"

#include <stdlib.h>
#include <string.h>

#if TENSORD_NCCL
#include <nccl.h>

struct krn_comm {
    int n;             /* local ranks */
    int first, nranks; /* global rank of comms[0]; ranks in all (n for ncclCommInitAll) */
    ncclComm_t *comms;
};

static_assert(sizeof(ncclUniqueId) == KRN_COMM_ID_BYTES, "krn_comm_id holds an ncclUniqueId");

__global__ void comm_scale(float *__restrict__ b, long long n, float s) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        b[i] *= s;
}

/* A communicator's host part with room for n local ranks' NCCL handles (none made yet). */
static eng_status comm_alloc(int n, krn_comm **out) {
    krn_comm *cm = (krn_comm *)calloc(1, sizeof *cm);
    if (cm) cm->comms = (ncclComm_t *)calloc((size_t)n, sizeof *cm->comms);
    if (!cm || !cm->comms) {
        if (cm) free(cm->comms);
        free(cm);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "cuda: out of memory for an NCCL communicator of %d local ranks", n);
    }
    *out = cm;
    return ENG_STATUS_OK;
}

extern "C" eng_status cuda_comm_new(int n, const int *devices, krn_comm **out) {
    *out = NULL;
    krn_comm *cm = NULL;
    ENG_TRY(comm_alloc(n, &cm));
    ncclResult_t r = ncclCommInitAll(cm->comms, n, devices);
    if (r != ncclSuccess) {
        free(cm->comms);
        free(cm);
        return eng_err(ENG_STATUS_INTERNAL, "NCCL: ncclCommInitAll over %d devices: %s", n, ncclGetErrorString(r));
    }
    cm->n = n;
    cm->nranks = n;
    *out = cm;
    return ENG_STATUS_OK;
}

extern "C" eng_status cuda_comm_id_new(krn_comm_id *id) {
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess)
        return eng_err(ENG_STATUS_INTERNAL, "NCCL: ncclGetUniqueId (global rank 0): %s%s%s", ncclGetErrorString(r),
                       ncclGetLastError(NULL)[0] ? ": " : "", ncclGetLastError(NULL));
    memcpy(id->bytes, &u, sizeof u);
    return ENG_STATUS_OK;
}

/* One ncclCommInitRank per local GPU inside a group (a process holding several ranks must join them together, or
 * the first would wait for the others forever). Blocks until all nranks ranks of every process joined. */
extern "C" eng_status cuda_comm_new_ranks(const krn_comm_id *id, int nranks, int first, int nlocal, const int *devices,
                                          krn_comm **out) {
    *out = NULL;
    krn_comm *cm = NULL;
    ENG_TRY(comm_alloc(nlocal, &cm));
    ncclUniqueId u;
    memcpy(&u, id->bytes, sizeof u);
    int prev = 0;
    (void)cudaGetDevice(&prev);
    eng_status st = ENG_STATUS_OK;
    ncclResult_t r = ncclGroupStart();
    int bad = -1; /* the local rank whose call failed, -1: the group */
    for (int i = 0; i < nlocal && r == ncclSuccess; i++) {
        cudaError_t e = cudaSetDevice(devices[i]);
        if (e != cudaSuccess) {
            st = eng_err(ENG_STATUS_INTERNAL, "NCCL: global rank %d on cuda:%d: cudaSetDevice: %s", first + i, devices[i],
                         cudaGetErrorString(e));
            break;
        }
        r = ncclCommInitRank(&cm->comms[i], nranks, u, first + i);
        if (r != ncclSuccess) bad = i;
    }
    ncclResult_t g = ncclGroupEnd();
    if (r == ncclSuccess) r = g;
    (void)cudaSetDevice(prev);
    if (st == ENG_STATUS_OK && r != ncclSuccess) {
        const char *last = ncclGetLastError(NULL);
        if (bad >= 0)
            st = eng_err(ENG_STATUS_INTERNAL, "NCCL: ncclCommInitRank of global rank %d of %d on cuda:%d: %s%s%s", first + bad,
                         nranks, devices[bad], ncclGetErrorString(r), last && last[0] ? ": " : "", last ? last : "");
        else
            st = eng_err(ENG_STATUS_INTERNAL, "NCCL: joining global ranks %d..%d of %d on cuda:%d..cuda:%d: %s%s%s", first,
                         first + nlocal - 1, nranks, devices[0], devices[nlocal - 1], ncclGetErrorString(r),
                         last && last[0] ? ": " : "", last ? last : "");
    }
    if (st != ENG_STATUS_OK) {
        for (int i = 0; i < nlocal; i++)
            if (cm->comms[i]) ncclCommAbort(cm->comms[i]);
        free(cm->comms);
        free(cm);
        return st;
    }
    cm->n = nlocal;
    cm->first = first;
    cm->nranks = nranks;
    *out = cm;
    return ENG_STATUS_OK;
}

extern "C" eng_status cuda_comm_allreduce(krn_comm *cm, int rank, krn_ctx *c, float *buf, size_t n, float prescale) {
    cuda_ctx *x = (cuda_ctx *)c;
    if (rank < 0 || rank >= cm->n)
        return eng_err(ENG_STATUS_INTERNAL, "NCCL: local rank %d of %d (of %d ranks in all)", rank, cm->n, cm->nranks);
    CUDA_TRY("all-reduce", cudaSetDevice(x->device));
    if (prescale != 1.0f && n) {
        comm_scale<<<cuda_grid((long long)n, 256), 256, 0, x->stream>>>(buf, (long long)n, prescale);
        CUDA_LAUNCHED("all-reduce prescale");
    }
    ncclResult_t r = ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, cm->comms[rank], x->stream);
    if (r != ncclSuccess)
        return eng_err(ENG_STATUS_INTERNAL, "NCCL: all-reduce of %zu floats on cuda:%d (global rank %d of %d): %s", n,
                       x->device, cm->first + rank, cm->nranks, ncclGetErrorString(r));
    return ENG_STATUS_OK;
}

extern "C" void cuda_comm_free(krn_comm *cm) {
    for (int i = 0; i < cm->n; i++)
        if (cm->comms[i]) ncclCommDestroy(cm->comms[i]);
    free(cm->comms);
    free(cm);
}
#else
extern "C" eng_status cuda_comm_new(int n, const int *devices, krn_comm **out) {
    *out = NULL;
    return eng_err(ENG_STATUS_UNSUPPORTED, "this build has no NCCL (nccl.h was not found at build time)");
}
extern "C" eng_status cuda_comm_allreduce(krn_comm *cm, int rank, krn_ctx *c, float *buf, size_t n, float prescale) {
    return eng_err(ENG_STATUS_UNSUPPORTED, "this build has no NCCL");
}
extern "C" void cuda_comm_free(krn_comm *cm) {}
extern "C" eng_status cuda_comm_id_new(krn_comm_id *id) {
    return eng_err(ENG_STATUS_UNSUPPORTED, "this build has no NCCL (nccl.h was not found at build time): no collectives "
                                           "across processes on cuda");
}
extern "C" eng_status cuda_comm_new_ranks(const krn_comm_id *id, int nranks, int first, int nlocal, const int *devices,
                                          krn_comm **out) {
    *out = NULL;
    return eng_err(ENG_STATUS_UNSUPPORTED, "this build has no NCCL: global ranks %d..%d of %d cannot join", first,
                   first + nlocal - 1, nranks);
}
#endif

/* ---- bucketed collectives: a gradient bucket's all-reduces as one NCCL group on the context's stream (the trainer's
 * communication stream, which waits for the backward pass's event first). Each buffer is prescaled on the stream,
 * then ncclGroupStart, one ncclAllReduce per buffer, ncclGroupEnd: NCCL launches the bucket as one operation. A
 * failure inside the group still ends the group (NCCL requires it) and is reported naming the bucket's first failing
 * buffer. */
#if TENSORD_NCCL
extern "C" eng_status cuda_comm_allreduce_many(krn_comm *cm, int rank, krn_ctx *c, float *const *bufs, const size_t *ns,
                                               int count, float prescale) {
    cuda_ctx *x = (cuda_ctx *)c;
    if (rank < 0 || rank >= cm->n) return eng_err(ENG_STATUS_INTERNAL, "NCCL: rank %d of %d", rank, cm->n);
    CUDA_TRY("bucket all-reduce", cudaSetDevice(x->device));
    for (int j = 0; j < count && prescale != 1.0f; j++)
        if (ns[j]) {
            comm_scale<<<cuda_grid((long long)ns[j], 256), 256, 0, x->stream>>>(bufs[j], (long long)ns[j], prescale);
            CUDA_LAUNCHED("bucket all-reduce prescale");
        }
    ncclResult_t r = ncclGroupStart(), bad = ncclSuccess;
    if (r != ncclSuccess)
        return eng_err(ENG_STATUS_INTERNAL, "NCCL: ncclGroupStart on cuda:%d (rank %d): %s", x->device, rank,
                       ncclGetErrorString(r));
    int badj = -1;
    for (int j = 0; j < count; j++) {
        r = ncclAllReduce(bufs[j], bufs[j], ns[j], ncclFloat32, ncclSum, cm->comms[rank], x->stream);
        if (r != ncclSuccess && bad == ncclSuccess) bad = r, badj = j;
    }
    r = ncclGroupEnd();
    if (bad != ncclSuccess)
        return eng_err(ENG_STATUS_INTERNAL, "NCCL: bucket all-reduce %d of %d (%zu floats) on cuda:%d (rank %d): %s",
                       badj + 1, count, ns[badj], x->device, rank, ncclGetErrorString(bad));
    if (r != ncclSuccess)
        return eng_err(ENG_STATUS_INTERNAL, "NCCL: ncclGroupEnd of a bucket of %d all-reduces on cuda:%d (rank %d): %s",
                       count, x->device, rank, ncclGetErrorString(r));
    return ENG_STATUS_OK;
}
#else
extern "C" eng_status cuda_comm_allreduce_many(krn_comm *cm, int rank, krn_ctx *c, float *const *bufs, const size_t *ns,
                                               int count, float prescale) {
    return eng_err(ENG_STATUS_UNSUPPORTED, "this build has no NCCL");
}
#endif
