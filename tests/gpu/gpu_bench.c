/* gpu_bench.c - the CUDA backend's matmul kernel against a plain cuBLASLt call, on the same card in the same run
 * (issue 14: fp16/bf16 matmul at >= 70% of plain cuBLASLt's TFLOP/s). Run by tests/gpu/run.sh.
 *
 *   gpu_bench [--device cuda:0] [--size 8192] [--iters 20]
 *
 * For fp16 and bf16: allocates A [M,K], B [K,N], C [M,N] on the device through the backend's buffers, runs the
 * backend's "matmul" kernel (the one a plan's MatMul node gets) init once and exec `iters` times after 3 warm-ups,
 * timed with the context's sync around them; then the plugin's cuda_blas_peak_tflops (a bare cublasLtMatmul of the
 * same shape and dtype, its own handle and stream, timed with CUDA events). Prints one JSON line per dtype:
 *   {"dtype": "bf16", "m": .., "tensord_tflops": .., "cublaslt_tflops": .., "ratio": ..}
 * Exit status 0 when both ran, 1 otherwise (no device: says why).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend-impl.h"
#include "kernels/krn-nn.h"

typedef eng_status (*peak_fn)(int device, int m, int n, int k, eng_dtype dt, int iters, double *tflops);

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int bench(const krn_backend *b, int dev, int m, eng_dtype dt, int iters, peak_fn peak) {
    int64_t n = m, k = m;
    size_t es = eng_dtype_size(dt);
    krn_ctx *ctx = NULL;
    void *A = NULL, *B = NULL, *C = NULL;
    eng_status st = krn_ctx_new(b, dev, &ctx);
    if (st == ENG_STATUS_OK) st = krn_buf_alloc(b, ctx, (size_t)m * k * es, &A);
    if (st == ENG_STATUS_OK) st = krn_buf_alloc(b, ctx, (size_t)k * n * es, &B);
    if (st == ENG_STATUS_OK) st = krn_buf_alloc(b, ctx, (size_t)m * n * es, &C);
    /* operands: a repeating pattern of small values (finite in fp16, no denormals) */
    uint16_t *h = malloc((size_t)m * k * es);
    if (st == ENG_STATUS_OK && !h) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "host buffer");
    for (int64_t i = 0; st == ENG_STATUS_OK && i < (int64_t)m * k; i++) {
        float v = (float)((i * 7919) % 17 - 8) / 16.0f;
        h[i] = dt == ENG_DTYPE_F16 ? eng_f32_to_f16(v) : eng_f32_to_bf16(v);
    }
    if (st == ENG_STATUS_OK) st = krn_buf_set(b, ctx, A, h, (size_t)m * k * es);
    if (st == ENG_STATUS_OK) st = krn_buf_set(b, ctx, B, h, (size_t)k * n * es);
    if (st == ENG_STATUS_OK) st = krn_ctx_sync(b, ctx);
    const krn_kernel *kr = krn_backend_find(b, "matmul");
    if (st == ENG_STATUS_OK && !kr) st = eng_err(ENG_STATUS_NOT_FOUND, "backend %s has no matmul kernel", krn_backend_name(b));
    krn_matmul_params prm = {.alpha = 1.0f, .beta = 1.0f};
    eng_tensor in[3] = {{.dtype = dt, .ndim = 2, .dims = {m, k}, .data = A}, {.dtype = dt, .ndim = 2, .dims = {k, n}, .data = B}};
    eng_tensor out = {.dtype = dt, .ndim = 2, .dims = {m, n}, .data = C};
    krn_call c = {.params = &prm, .in = in, .nin = 2, .out = &out, .nout = 1, .nthreads = 1, .ctx = ctx};
    if (st == ENG_STATUS_OK && kr->supports && !kr->supports(&c))
        st = eng_err(ENG_STATUS_UNSUPPORTED, "the matmul kernel refuses %s [%d,%d]x[%d,%d]", eng_dtype_name(dt), m, m, m, m);
    if (st == ENG_STATUS_OK && kr->init) st = kr->init(&c);
    for (int i = 0; st == ENG_STATUS_OK && i < 3; i++) st = kr->exec(&c);
    if (st == ENG_STATUS_OK) st = krn_ctx_sync(b, ctx);
    double t0 = now_s();
    for (int i = 0; st == ENG_STATUS_OK && i < iters; i++) st = kr->exec(&c);
    if (st == ENG_STATUS_OK) st = krn_ctx_sync(b, ctx);
    double secs = now_s() - t0, ours = 0, ref = 0;
    if (st == ENG_STATUS_OK) ours = 2.0 * m * n * k * iters / secs / 1e12;
    if (st == ENG_STATUS_OK) st = peak(dev, m, (int)n, (int)k, dt, iters, &ref);
    if (kr && kr->free_state && c.state) kr->free_state(c.state);
    krn_buf_free(b, ctx, A);
    krn_buf_free(b, ctx, B);
    krn_buf_free(b, ctx, C);
    krn_ctx_free(b, &ctx);
    free(h);
    const char *dn = dt == ENG_DTYPE_F16 ? "fp16" : "bf16";
    if (st != ENG_STATUS_OK) {
        printf("{\"dtype\": \"%s\", \"m\": %d, \"error\": \"%s\"}\n", dn, m, eng_last_error());
        return 1;
    }
    printf("{\"dtype\": \"%s\", \"m\": %d, \"tensord_tflops\": %.1f, \"cublaslt_tflops\": %.1f, \"ratio\": %.3f}\n", dn, m,
           ours, ref, ref > 0 ? ours / ref : 0);
    return 0;
}

int main(int argc, char **argv) {
    const char *spec = "cuda:0";
    int m = 8192, iters = 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--device")) spec = argv[i + 1];
        else if (!strcmp(argv[i], "--size")) m = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--iters")) iters = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: gpu_bench [--device cuda:0] [--size 8192] [--iters 20]\n");
            return 2;
        }
    }
    const krn_backend *b;
    int dev;
    if (krn_backend_by_name(spec, &b, &dev) != ENG_STATUS_OK) {
        fprintf(stderr, "gpu_bench: %s\n", eng_last_error());
        return 1;
    }
    peak_fn peak = (peak_fn)krn_cuda_plugin_symbol("cuda_blas_peak_tflops");
    if (!peak) {
        fprintf(stderr, "gpu_bench: the CUDA plugin has no cuda_blas_peak_tflops\n");
        return 1;
    }
    int rc = bench(b, dev, m, ENG_DTYPE_F16, iters, peak);
    rc |= bench(b, dev, m, ENG_DTYPE_BF16, iters, peak);
    return rc;
}
