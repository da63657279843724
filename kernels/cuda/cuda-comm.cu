/* cuda-comm.cu - the CUDA backend's collectives (krn_backend.comm_*): NCCL communicators over the process's GPUs
 * (ncclCommInitAll), an in-place float sum all-reduce per rank on its context's stream, each rank's buffer first
 * scaled by its prescale (a replica's share of the batch). Without NCCL at build time (TENSORD_NCCL=0) comm_new
 * refuses with the reason, and the trainer all-reduces through host memory instead. */
#include "cuda-impl.h"
#include "../backend-impl.h"

#include <stdlib.h>

#if TENSORD_NCCL
#include <nccl.h>

struct krn_comm {
    int n;
    ncclComm_t *comms;
};

__global__ void comm_scale(float *__restrict__ b, long long n, float s) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        b[i] *= s;
}

extern "C" eng_status cuda_comm_new(int n, const int *devices, krn_comm **out) {
    *out = NULL;
    krn_comm *cm = (krn_comm *)calloc(1, sizeof *cm);
    if (cm) cm->comms = (ncclComm_t *)calloc((size_t)n, sizeof *cm->comms);
    if (!cm || !cm->comms) {
        if (cm) free(cm->comms);
        free(cm);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "cuda: out of memory for an NCCL communicator of %d ranks", n);
    }
    ncclResult_t r = ncclCommInitAll(cm->comms, n, devices);
    if (r != ncclSuccess) {
        free(cm->comms);
        free(cm);
        return eng_err(ENG_STATUS_INTERNAL, "NCCL: ncclCommInitAll over %d devices: %s", n, ncclGetErrorString(r));
    }
    cm->n = n;
    *out = cm;
    return ENG_STATUS_OK;
}

extern "C" eng_status cuda_comm_allreduce(krn_comm *cm, int rank, krn_ctx *c, float *buf, size_t n, float prescale) {
    cuda_ctx *x = (cuda_ctx *)c;
    if (rank < 0 || rank >= cm->n) return eng_err(ENG_STATUS_INTERNAL, "NCCL: rank %d of %d", rank, cm->n);
    CUDA_TRY("all-reduce", cudaSetDevice(x->device));
    if (prescale != 1.0f && n) {
        comm_scale<<<cuda_grid((long long)n, 256), 256, 0, x->stream>>>(buf, (long long)n, prescale);
        CUDA_LAUNCHED("all-reduce prescale");
    }
    ncclResult_t r = ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, cm->comms[rank], x->stream);
    if (r != ncclSuccess)
        return eng_err(ENG_STATUS_INTERNAL, "NCCL: all-reduce of %zu floats on cuda:%d (rank %d): %s", n, x->device, rank,
                       ncclGetErrorString(r));
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
