/* cuda-blas-peak.h - the plain-cuBLASLt reference the matmul benchmark compares tensord's "matmul" kernel
 * against (kernels/cuda/cuda-blas.cu). Plain C: the benchmark finds it in build/libtensord_cuda.so with dlsym
 * (CUDA_BLAS_PEAK_SYMBOL) or links the plugin.
 */
#ifndef CUDA_BLAS_PEAK_H
#define CUDA_BLAS_PEAK_H

#ifdef __cplusplus
extern "C" {
#endif
#include "../../engine/ir/tensor.h"

/* TFLOP/s of one plain cublasLtMatmul, D (m, n) = A (m, k) B (k, n), dt = ENG_DTYPE_F16 or ENG_DTYPE_BF16 in and
 * out with fp32 accumulation, timed with CUDA events over `iters` runs (after 3 warm-up runs) on its own stream
 * and cuBLASLt handle on `device`. Blocks until done; allocates and frees its own buffers; restores the calling
 * thread's current device. INVALID_ARGUMENT for other dtypes or sizes <= 0. */
eng_status cuda_blas_peak_tflops(int device, int m, int n, int k, eng_dtype dt, int iters, double *tflops);
typedef eng_status (*cuda_blas_peak_tflops_fn)(int device, int m, int n, int k, eng_dtype dt, int iters, double *tflops);
#define CUDA_BLAS_PEAK_SYMBOL "cuda_blas_peak_tflops"

#ifdef __cplusplus
}
#endif

#endif
