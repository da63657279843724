/* cuda-impl.h - what the CUDA backend's kernel files share: the execution context, the error macros, launch
 * helpers. Compiled by nvcc only (build/libtensord_cuda.so, the plugin kernels/backend.c loads).
 *
 * A kernel of this backend gets krn_call.ctx = a cuda_ctx*, and its in/out data are device pointers (the planner
 * placed and copied them). It queues its work on ctx->stream and returns without synchronising; errors of the
 * launch itself (cudaGetLastError, a cuBLASLt/cuDNN status) are returned at once as an eng_status whose message
 * names the kernel and the CUDA error; asynchronous faults surface at the plan's sync. It never exits or aborts.
 * State made by init (descriptors, algorithm choices, a packed weight) lives in c->state, with free_state.
 */
#ifndef KRN_CUDA_IMPL_H
#define KRN_CUDA_IMPL_H

#include <cuda_runtime.h>
#include <cublasLt.h>
#include <cudnn.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "../kernel.h"
#ifdef __cplusplus
}
#endif

typedef struct cuda_ctx {
    int device;
    cudaStream_t stream;
    cublasLtHandle_t lt;       /* created with the context */
    cudnnHandle_t dnn;         /* bound to stream */
    void *workspace;           /* device scratch for cuBLASLt / cuDNN, ws_bytes long; kernels may grow it with
                                * cuda_ctx_workspace (outside a CUDA graph capture) */
    size_t ws_bytes;
    int tf32;                  /* TENSORD_CUDA_TF32=1: fp32 matmuls and convolutions may use TF32 tensor cores */
    int sm;                    /* compute capability, e.g. 90 */
} cuda_ctx;

#define CUDA_CTX(c) ((cuda_ctx *)(c)->ctx)

#ifdef __cplusplus
extern "C" {
#endif
/* Device scratch of at least n bytes on ctx (grows; cuda-backend.cu). */
eng_status cuda_ctx_workspace(cuda_ctx *x, size_t n, void **out);
/* Caching allocator (cuda-alloc.cu): device memory for kernel state (packed weights); no cudaMalloc on the
 * request path once warm. */
eng_status cuda_mem_alloc(int device, size_t nbytes, void **out);
void cuda_mem_free(int device, void *p);
#ifdef __cplusplus
}
#endif

#ifdef __cplusplus
extern "C" {
#endif
/* Status from a failed CUDA runtime call on device dev (dev < 0: the calling thread's current device, and the message
 * says "cuda <what>" as a kernel's does), naming `what` and the CUDA error; clears the thread's last error. A sticky
 * error (cuda_error_is_sticky: an illegal address, a launch failure, ...) also marks the device lost process-wide
 * (the backend's device_lost hook; the first such error is kept as the reason), and its message says so. Every
 * failure path of this backend that holds a cudaError_t goes through here (cuda-backend.cu). */
eng_status cuda_error(int dev, const char *what, cudaError_t e);
int cuda_error_is_sticky(cudaError_t e);
#ifdef __cplusplus
}
#endif

/* Status from a CUDA runtime error, naming `what` (the kernel) and the CUDA error (cuda_error: a sticky one loses the
 * device). */
#define CUDA_ERR(what, e) cuda_error(-1, (what), (e))
#define CUDA_TRY(what, expr) do { cudaError_t e__ = (expr); if (e__ != cudaSuccess) return CUDA_ERR(what, e__); } while (0)
/* As CUDA_TRY for runtime calls about device dev (messages name it as cuda:N). */
#define CUDA_DEV_TRY(dev, what, expr) do { cudaError_t e__ = (expr); if (e__ != cudaSuccess) return cuda_error((dev), (what), e__); } while (0)
/* After a <<<>>> launch. */
#define CUDA_LAUNCHED(what) do { cudaError_t e__ = cudaGetLastError(); if (e__ != cudaSuccess) return CUDA_ERR(what, e__); } while (0)
#define CUBLAS_TRY(what, expr) do { cublasStatus_t s__ = (expr); if (s__ != CUBLAS_STATUS_SUCCESS) \
    return eng_err(ENG_STATUS_INTERNAL, "cuda %s: cuBLASLt status %d", (what), (int)s__); } while (0)
#define CUDNN_TRY(what, expr) do { cudnnStatus_t s__ = (expr); if (s__ != CUDNN_STATUS_SUCCESS) \
    return eng_err(ENG_STATUS_INTERNAL, "cuda %s: cuDNN %s", (what), cudnnGetErrorString(s__)); } while (0)

#ifdef __CUDACC__
#include "../krn-nn.h"
/* A fused activation (krn_nn_act) on one float: the CPU's krn_act1_f32 (kernels/cpu/dnnl.c KRN_ACT_BODY), term for
 * term; the epilogues of matmul, conv and the integer kernels share it. */
__device__ __forceinline__ float cuda_act(float v, int kind, float al, float be) {
    switch (kind) {
    case KRN_NN_ACT_RELU: return v > 0.f ? v : v * al;
    case KRN_NN_ACT_CLIP: return v < al ? al : v > be ? be : v;
    case KRN_NN_ACT_SIGMOID: return 1.f / (1.f + expf(-v));
    case KRN_NN_ACT_TANH: return tanhf(v);
    case KRN_NN_ACT_HARD_SIGMOID: {
        float h = al * v + be;
        return h < 0.f ? 0.f : h > 1.f ? 1.f : h;
    }
    case KRN_NN_ACT_GELU_ERF: return 0.5f * v * (1.f + erff(v * 0.70710678118654752440f));
    case KRN_NN_ACT_GELU_TANH: return 0.5f * v * (1.f + tanhf(0.79788456080286535588f * (v + 0.044715f * v * v * v)));
    case KRN_NN_ACT_ELU: return v >= 0.f ? v : al * (expf(v) - 1.f);
    case KRN_NN_ACT_SWISH: return v / (1.f + expf(-al * v));
    case KRN_NN_ACT_HARD_SWISH: {
        float h = v / 6.f + 0.5f;
        return v * (h < 0.f ? 0.f : h > 1.f ? 1.f : h);
    }
    default: return v;
    }
}
#endif

/* Grid for n elements with `threads` per block, capped (kernels loop with a grid stride). */
static inline unsigned cuda_grid(long long n, int threads) {
    long long b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > 65535LL * 32) b = 65535LL * 32;
    return (unsigned)b;
}

#endif
