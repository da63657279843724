/* cuda-blas.cu - the CUDA "blas" kernels on cuBLASLt: "matmul" (MatMul, Gemm, com.tensord FusedMatMul /
 * FusedGemm: Y = act(alpha * op(A) op(B) + beta * C)) and "grad_matmul" (MatMulGrad: dA = dY B^T, dB = A^T dY),
 * plus cuda_blas_peak_tflops, the plain-cuBLASLt reference the matmul benchmark compares against.
 *
 * Row-major tensors on a column-major library: a row-major (R, C) buffer is, read column-major, the (C, R)
 * matrix of its transpose. So Y = op(A) op(B) (row-major, m x n) is computed as Y^T = op(B)^T op(A)^T in
 * column-major: cuBLASLt's "A" is our B buffer, its "B" is our A buffer, its D (n rows, m cols, ld n) is Y, and the
 * transpose flags carry over unchanged (blas_mm_create). Every operand is dense, so each leading dimension is the
 * row-major width of the buffer as stored. A bias epilogue vector runs along D's rows, i.e. along Y's columns: a
 * per-output-column bias [N] is exactly cuBLASLt's bias.
 *
 * Batch dims (MatMul, numpy broadcasting): a B without batch dims (a shared weight) folds A's batch into M, one
 * GEMM; the longest trailing run of batch dims equal in A and B is one strided-batched GEMM; batch dims before
 * that run (broadcast ones) are a host loop of such GEMMs over pointer offsets. MatMulGrad: a shared B gives dB
 * from one GEMM over A's flattened rows; equal batch dims are strided batched; anything else is a zeroed output
 * and a loop of accumulating (beta = 1) GEMMs, as the CPU kernel does (fp32 outputs only).
 *
 * Precision: fp32 tensors use CUBLAS_COMPUTE_32F (32F_FAST_TF32 with ctx->tf32); fp16/bf16 tensors, or
 * c->compute = F16/BF16, multiply 16-bit operands with fp32 accumulation and store in the output's dtype. fp32
 * operands of a 16-bit compute are converted into the workspace on every exec, except a constant B
 * (const_mask bit 1), converted once in init into cuda_mem_alloc memory.
 *
 * State made in init and never rebuilt in exec: descriptors, layouts, the heuristic's algorithm. The algorithm is
 * chosen for the pointer alignment seen at init; exec re-asks the heuristic (host only) if a later pointer is less
 * aligned. C and activations cuBLASLt's epilogues do not express exactly (C not a per-column vector with
 * beta == 1, Leaky ReLU, GELU-erf, ...) run in blas_post, one fused pass over Y after the GEMM.
 */
#include "cuda-impl.h"
#include "cuda-blas-peak.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "../krn-nn.h"
}

#define BLAS_THREADS 256
#define BLAS_MAX_CALLS (1 << 16)   /* GEMM calls in one exec beyond which the loop paths are refused */
#define BLAS_WS_ALIGN 256

static size_t blas_round_up(size_t n) { return (n + BLAS_WS_ALIGN - 1) / BLAS_WS_ALIGN * BLAS_WS_ALIGN; }

static int blas_float_dt(eng_dtype dt) {
    return dt == ENG_DTYPE_F32 || dt == ENG_DTYPE_F16 || dt == ENG_DTYPE_BF16;
}

static cudaDataType_t blas_cuda_dt(eng_dtype dt) {
    return dt == ENG_DTYPE_F16 ? CUDA_R_16F : dt == ENG_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

static const char *blas_dt_name(eng_dtype dt) {
    return dt == ENG_DTYPE_F16 ? "f16" : dt == ENG_DTYPE_BF16 ? "bf16" : "f32";
}

/* Largest power of two <= 256 dividing the pointer and every extra byte offset (strides of batched operands). */
static unsigned blas_align(const void *p, uint64_t off1, uint64_t off2) {
    uint64_t v = (uint64_t)(uintptr_t)p | off1 | off2 | BLAS_WS_ALIGN;
    return (unsigned)(v & (~v + 1));
}

/* ---- device helpers ---- */

template <typename T> __device__ __forceinline__ float blas_ld(const T *p);
template <> __device__ __forceinline__ float blas_ld<float>(const float *p) { return *p; }
template <> __device__ __forceinline__ float blas_ld<__half>(const __half *p) { return __half2float(*p); }
template <> __device__ __forceinline__ float blas_ld<__nv_bfloat16>(const __nv_bfloat16 *p) { return __bfloat162float(*p); }

template <typename T> __device__ __forceinline__ T blas_from_f(float v);
template <> __device__ __forceinline__ float blas_from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half blas_from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 blas_from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

/* 4 consecutive elements at p (aligned to 4 elements) as floats, and back. */
__device__ __forceinline__ void blas_ld4(const float *p, float *v) {
    float4 q = *(const float4 *)p;
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
}
__device__ __forceinline__ void blas_st4(float *p, const float *v) { *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]); }
__device__ __forceinline__ void blas_ld4(const __half *p, float *v) {
    uint2 q = *(const uint2 *)p;
    float2 a = __half22float2(*(const __half2 *)&q.x), b = __half22float2(*(const __half2 *)&q.y);
    v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
}
__device__ __forceinline__ void blas_st4(__half *p, const float *v) {
    __half2 a = __floats2half2_rn(v[0], v[1]), b = __floats2half2_rn(v[2], v[3]);
    uint2 q;
    q.x = *(const unsigned *)&a, q.y = *(const unsigned *)&b;
    *(uint2 *)p = q;
}
__device__ __forceinline__ void blas_ld4(const __nv_bfloat16 *p, float *v) {
    uint2 q = *(const uint2 *)p;
    float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)&q.x), b = __bfloat1622float2(*(const __nv_bfloat162 *)&q.y);
    v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
}
__device__ __forceinline__ void blas_st4(__nv_bfloat16 *p, const float *v) {
    __nv_bfloat162 a = __floats2bfloat162_rn(v[0], v[1]), b = __floats2bfloat162_rn(v[2], v[3]);
    uint2 q;
    q.x = *(const unsigned *)&a, q.y = *(const unsigned *)&b;
    *(uint2 *)p = q;
}

/* ---- f32 -> f16/bf16 operand conversion ---- */

template <typename T> __global__ void blas_cvt(const float *__restrict__ x, T *__restrict__ y, int64_t n, int vec) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x, t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t n4 = vec ? n / 4 : 0;
    for (int64_t g = t; g < n4; g += stride) {
        float v[4];
        blas_ld4(x + 4 * g, v);
        blas_st4(y + 4 * g, v);
    }
    for (int64_t i = 4 * n4 + t; i < n; i += stride) y[i] = blas_from_f<T>(x[i]);
}

/* y (n elements of dt, f16 or bf16) <- x (float32), queued on stream. */
static eng_status blas_convert(const float *x, void *y, eng_dtype dt, int64_t n, cudaStream_t stream) {
    if (n <= 0) return ENG_STATUS_OK;
    int vec = ((uintptr_t)x % 16 == 0) && ((uintptr_t)y % 8 == 0);
    unsigned grid = cuda_grid(vec ? (n + 3) / 4 : n, BLAS_THREADS);
    if (dt == ENG_DTYPE_BF16) blas_cvt<__nv_bfloat16><<<grid, BLAS_THREADS, 0, stream>>>(x, (__nv_bfloat16 *)y, n, vec);
    else blas_cvt<__half><<<grid, BLAS_THREADS, 0, stream>>>(x, (__half *)y, n, vec);
    CUDA_LAUNCHED("blas_cvt");
    return ENG_STATUS_OK;
}

/* ---- bias / activation pass over Y ---- */

/* Where C sits relative to Y (both row-major; C broadcasts to Y's shape). */
enum { POST_C_NONE = 0, POST_C_SCALAR, POST_C_ROW, POST_C_COL, POST_C_FULL, POST_C_GENERAL };

typedef struct blas_post_args {
    int64_t n;                 /* elements of Y */
    int64_t N, M;              /* Y's last two dims (ROW: c[i % N]; COL: c[(i / N) % M]) */
    int cmode;
    int nd;                    /* GENERAL: Y's rank, dims and C's strides per Y dim (0 where broadcast) */
    int64_t ydims[ENG_MAX_DIMS];
    int64_t cstr[ENG_MAX_DIMS];
    float beta;
    int act;
    float act_alpha, act_beta;
} blas_post_args;

template <typename TC> __device__ __forceinline__ float blas_post_c(const TC *c, int64_t i, const blas_post_args &a) {
    switch (a.cmode) {
    case POST_C_SCALAR: return blas_ld(c);
    case POST_C_ROW: return blas_ld(c + i % a.N);
    case POST_C_COL: return blas_ld(c + (i / a.N) % a.M);
    case POST_C_FULL: return blas_ld(c + i);
    case POST_C_GENERAL: {
        int64_t off = 0;
        for (int d = a.nd - 1; d >= 0; d--) {
            off += (i % a.ydims[d]) * a.cstr[d];
            i /= a.ydims[d];
        }
        return blas_ld(c + off);
    }
    default: return 0.f;
    }
}

/* y = act(y + beta * C) in place; vec: y is aligned to 4 elements (4 per thread and step). */
template <typename T, typename TC>
__global__ void blas_post(T *__restrict__ y, const TC *__restrict__ c, blas_post_args a, int vec) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x, t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t n4 = vec ? a.n / 4 : 0;
    for (int64_t g = t; g < n4; g += stride) {
        int64_t i = 4 * g;
        float v[4];
        blas_ld4(y + i, v);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float s = v[j];
            if (a.cmode != POST_C_NONE) s += a.beta * blas_post_c(c, i + j, a);
            v[j] = cuda_act(s, a.act, a.act_alpha, a.act_beta);
        }
        blas_st4(y + i, v);
    }
    for (int64_t i = 4 * n4 + t; i < a.n; i += stride) {
        float s = blas_ld(y + i);
        if (a.cmode != POST_C_NONE) s += a.beta * blas_post_c(c, i, a);
        y[i] = blas_from_f<T>(cuda_act(s, a.act, a.act_alpha, a.act_beta));
    }
}

template <typename T>
static void blas_post_launch_t(T *y, const void *c, eng_dtype cdt, const blas_post_args &a, int vec, unsigned grid,
                               cudaStream_t st) {
    if (cdt == ENG_DTYPE_F16) blas_post<T, __half><<<grid, BLAS_THREADS, 0, st>>>(y, (const __half *)c, a, vec);
    else if (cdt == ENG_DTYPE_BF16) blas_post<T, __nv_bfloat16><<<grid, BLAS_THREADS, 0, st>>>(y, (const __nv_bfloat16 *)c, a, vec);
    else blas_post<T, float><<<grid, BLAS_THREADS, 0, st>>>(y, (const float *)c, a, vec);
}

static eng_status blas_post_launch(void *y, eng_dtype ydt, const void *c, eng_dtype cdt, const blas_post_args &a,
                                   cudaStream_t st) {
    if (a.n <= 0) return ENG_STATUS_OK;
    int vec = (uintptr_t)y % (4 * (ydt == ENG_DTYPE_F32 ? 4 : 2)) == 0;
    unsigned grid = cuda_grid(vec ? (a.n + 3) / 4 : a.n, BLAS_THREADS);
    if (ydt == ENG_DTYPE_F16) blas_post_launch_t((__half *)y, c, cdt, a, vec, grid, st);
    else if (ydt == ENG_DTYPE_BF16) blas_post_launch_t((__nv_bfloat16 *)y, c, cdt, a, vec, grid, st);
    else blas_post_launch_t((float *)y, c, cdt, a, vec, grid, st);
    CUDA_LAUNCHED("blas_post");
    return ENG_STATUS_OK;
}

/* ---- one cuBLASLt product, described in row-major terms ---- */

/* Y (m, n) = alpha op(A) (m, k) op(B) (k, n) [+ beta C, C laid out as Y], `count` times at element strides sa,
 * sb, sy (strided batch; count 1: strides unused). A is stored (ta ? k x m : m x k), B (tb ? n x k : k x n), all
 * dense row-major. Descriptors, layouts and the chosen algorithm are made once (blas_mm_create). */
typedef struct blas_mm {
    int64_t m, n, k;
    int ta, tb, count;
    int64_t sa, sb, sy;
    eng_dtype adt, bdt, ydt;       /* operand dtypes as cuBLASLt reads them, output dtype */
    cublasComputeType_t ct;
    uint32_t epi;                  /* cublasLtEpilogue_t */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc; /* cuBLASLt's A (our B), B (our A), C = D (Y) */
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulAlgo_t algo;
    size_t ws_limit;
    unsigned al[4];                /* alignment (bytes) the algorithm was chosen for: our A, B, Y/C, bias */
    const void *bias;              /* the bias pointer set on op */
    int built;
} blas_mm;

static void blas_mm_destroy(blas_mm *g) {
    if (g->pref) cublasLtMatmulPreferenceDestroy(g->pref);
    if (g->la) cublasLtMatrixLayoutDestroy(g->la);
    if (g->lb) cublasLtMatrixLayoutDestroy(g->lb);
    if (g->lc) cublasLtMatrixLayoutDestroy(g->lc);
    if (g->op) cublasLtMatmulDescDestroy(g->op);
    g->pref = NULL, g->la = g->lb = g->lc = NULL, g->op = NULL, g->built = 0;
}

static eng_status blas_layout(cublasLtMatrixLayout_t *l, eng_dtype dt, int64_t rows, int64_t cols, int count,
                              int64_t stride, const char *what) {
    CUBLAS_TRY(what, cublasLtMatrixLayoutCreate(l, blas_cuda_dt(dt), (uint64_t)rows, (uint64_t)cols, rows));
    if (count > 1) {
        int32_t bc = count;
        CUBLAS_TRY(what, cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
        CUBLAS_TRY(what, cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
    }
    return ENG_STATUS_OK;
}

/* Ask the heuristic for the best algorithm at alignments al (our A, B, Y/C, bias). */
static eng_status blas_mm_pick(cublasLtHandle_t lt, blas_mm *g, const unsigned al[4], const char *what) {
    uint32_t a_al = al[1], b_al = al[0], cd_al = al[2]; /* cuBLASLt's A is our B */
    uint64_t ws = g->ws_limit;
    CUBLAS_TRY(what, cublasLtMatmulPreferenceSetAttribute(g->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    CUBLAS_TRY(what, cublasLtMatmulPreferenceSetAttribute(g->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a_al, sizeof a_al));
    CUBLAS_TRY(what, cublasLtMatmulPreferenceSetAttribute(g->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &b_al, sizeof b_al));
    CUBLAS_TRY(what, cublasLtMatmulPreferenceSetAttribute(g->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &cd_al, sizeof cd_al));
    CUBLAS_TRY(what, cublasLtMatmulPreferenceSetAttribute(g->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &cd_al, sizeof cd_al));
    cublasLtMatmulHeuristicResult_t r;
    int nr = 0;
    memset(&r, 0, sizeof r);
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(lt, g->op, g->la, g->lb, g->lc, g->lc, g->pref, 1, &r, &nr);
    if (s != CUBLAS_STATUS_SUCCESS || nr < 1 || r.state != CUBLAS_STATUS_SUCCESS)
        return eng_err(ENG_STATUS_UNSUPPORTED,
                       "cuda %s: cuBLASLt has no algorithm for %s x %s -> %s m=%lld n=%lld k=%lld batch=%d epilogue=%u "
                       "(status %d, %d results)",
                       what, blas_dt_name(g->adt), blas_dt_name(g->bdt), blas_dt_name(g->ydt), (long long)g->m,
                       (long long)g->n, (long long)g->k, g->count, (unsigned)g->epi, (int)s, nr);
    g->algo = r.algo;
    memcpy(g->al, al, sizeof g->al);
    return ENG_STATUS_OK;
}

/* Build g's descriptors (its problem fields set) and choose the algorithm for the given alignments. */
static eng_status blas_mm_create(cublasLtHandle_t lt, blas_mm *g, const void *bias, const unsigned al[4], const char *what) {
    CUBLAS_TRY(what, cublasLtMatmulDescCreate(&g->op, g->ct, CUDA_R_32F));
    int32_t opa = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_TRY(what, cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CUBLAS_TRY(what, cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    uint32_t epi = g->epi;
    CUBLAS_TRY(what, cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (g->epi & CUBLASLT_EPILOGUE_BIAS) {
        int64_t bstride = 0; /* one bias vector for every batch element */
        g->bias = bias;
        CUBLAS_TRY(what, cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
        if (g->count > 1)
            CUBLAS_TRY(what, cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &bstride, sizeof bstride));
    }
    /* column-major views of the row-major buffers (see the top of the file): stored (rows, cols) swapped */
    ENG_TRY(blas_layout(&g->la, g->bdt, g->tb ? g->k : g->n, g->tb ? g->n : g->k, g->count, g->sb, what));
    ENG_TRY(blas_layout(&g->lb, g->adt, g->ta ? g->m : g->k, g->ta ? g->k : g->m, g->count, g->sa, what));
    ENG_TRY(blas_layout(&g->lc, g->ydt, g->n, g->m, g->count, g->sy, what));
    CUBLAS_TRY(what, cublasLtMatmulPreferenceCreate(&g->pref));
    ENG_TRY(blas_mm_pick(lt, g, al, what));
    g->built = 1;
    return ENG_STATUS_OK;
}

/* Queue one product on stream. C: NULL (beta must be 0) or laid out as Y. Re-picks the algorithm (host only) if a
 * pointer is less aligned than at init. */
static eng_status blas_mm_run(cublasLtHandle_t lt, blas_mm *g, float alpha, float beta, const void *A, const void *B,
                              const void *C, void *Y, const void *bias, void *ws, cudaStream_t stream, const char *what) {
    size_t ea = eng_dtype_size(g->adt), eb = eng_dtype_size(g->bdt), ey = eng_dtype_size(g->ydt);
    int batched = g->count > 1;
    unsigned now[4] = {blas_align(A, batched ? g->sa * ea : 0, 0), blas_align(B, batched ? g->sb * eb : 0, 0),
                       blas_align(Y, batched ? g->sy * ey : 0, (uint64_t)(uintptr_t)(C ? C : Y)), blas_align(bias, 0, 0)};
    if ((g->epi & CUBLASLT_EPILOGUE_BIAS) && bias != g->bias) {
        g->bias = bias;
        CUBLAS_TRY(what, cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    }
    int repick = 0;
    unsigned al[4];
    for (int i = 0; i < 4; i++) {
        al[i] = now[i] < g->al[i] ? now[i] : g->al[i];
        repick |= now[i] < g->al[i];
    }
    if (repick) ENG_TRY(blas_mm_pick(lt, g, al, what));
    CUBLAS_TRY(what, cublasLtMatmul(lt, g->op, &alpha, B, g->la, A, g->lb, &beta, C ? C : Y, g->lc, Y, g->lc, &g->algo,
                                    ws, g->ws_limit, stream));
    return ENG_STATUS_OK;
}

static cublasComputeType_t blas_compute_type(const cuda_ctx *x, eng_dtype op_dt) {
    return op_dt == ENG_DTYPE_F32 && x->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

static size_t blas_ws_limit(const cuda_ctx *x) { return x->sm >= 90 ? ((size_t)32 << 20) : ((size_t)8 << 20); }

/* The dtype operands are multiplied in: c->compute's 16-bit dtype, else the tensors' own (UNDEFINED when the
 * dtypes of ins[]/outs given do not allow it). */
static eng_dtype blas_op_dtype(eng_dtype compute, const eng_dtype *dts, int n) {
    if (compute == ENG_DTYPE_F16 || compute == ENG_DTYPE_BF16) {
        for (int i = 0; i < n; i++)
            if (dts[i] != ENG_DTYPE_UNDEFINED && dts[i] != ENG_DTYPE_F32 && dts[i] != compute) return ENG_DTYPE_UNDEFINED;
        return compute;
    }
    if (compute != ENG_DTYPE_UNDEFINED && compute != ENG_DTYPE_F32) return ENG_DTYPE_UNDEFINED;
    eng_dtype d = ENG_DTYPE_UNDEFINED;
    for (int i = 0; i < n; i++) {
        if (dts[i] == ENG_DTYPE_UNDEFINED) continue;
        if (!blas_float_dt(dts[i]) || (d != ENG_DTYPE_UNDEFINED && dts[i] != d)) return ENG_DTYPE_UNDEFINED;
        d = dts[i];
    }
    return d;
}

/* ======================================================================== matmul */

/* cmode: how C reaches Y */
enum { MM_C_NONE = 0, MM_C_EPI, MM_C_GEMM, MM_C_POST };

/* Everything about a matmul call decided from shapes, dtypes and params alone (supports / compute_ok / init). */
typedef struct mm_geo {
    int r;                                     /* CPU kernel's padded rank (>= 2) */
    int64_t a[ENG_MAX_DIMS], b[ENG_MAX_DIMS], y[ENG_MAX_DIMS];
    int64_t M, N, K;                           /* M folded over A's batch when B has none */
    int fold;
    int count;                                 /* strided batch of one GEMM call */
    int nouter;                                /* leading batch dims looped on the host */
    int64_t calls;
    int64_t od[ENG_MAX_DIMS], osa[ENG_MAX_DIMS], osb[ENG_MAX_DIMS]; /* outer dims; A / B element strides */
    eng_dtype op_dt;                           /* operand dtype cuBLASLt reads */
    eng_dtype ydt, cdt;
    int has_c, cmode, pmode;                   /* MM_C_*, POST_C_* */
    int act_epi;                               /* the activation is a cuBLASLt epilogue */
} mm_geo;

static int mm_geo_get(const krn_call *c, eng_dtype compute, mm_geo *g) {
    const krn_matmul_params *p = (const krn_matmul_params *)c->params;
    memset(g, 0, sizeof *g);
    if (!p || c->nin < 2 || c->nout < 1) return 0;
    const eng_tensor *A = &c->in[0], *B = &c->in[1], *Y = &c->out[0];
    const eng_tensor *C = p->has_bias && c->nin > 2 && c->in[2].dtype != ENG_DTYPE_UNDEFINED ? &c->in[2] : NULL;
    eng_dtype dts[3] = {A->dtype, B->dtype, Y->dtype};
    g->op_dt = blas_op_dtype(compute, dts, 3);
    if (g->op_dt == ENG_DTYPE_UNDEFINED) return 0;
    g->ydt = Y->dtype;
    if (p->act.kind < KRN_NN_ACT_NONE || p->act.kind > KRN_NN_ACT_HARD_SWISH) return 0;
    if (C && p->beta != 0.f) {
        if (!blas_float_dt(C->dtype)) return 0;
        g->has_c = 1, g->cdt = C->dtype;
    }
    /* shapes as the CPU kernel pads them: A (.., M, K), B (.., K, N), Y (.., M, N) */
    if (p->gemm) {
        if (A->ndim != 2 || B->ndim != 2) return 0;
        g->r = 2;
        g->M = p->trans_a ? A->dims[1] : A->dims[0];
        g->K = p->trans_a ? A->dims[0] : A->dims[1];
        g->N = p->trans_b ? B->dims[0] : B->dims[1];
    } else {
        if (A->ndim < 1 || B->ndim < 1 || p->trans_a || p->trans_b) return 0;
        int ra = A->ndim < 2 ? 2 : A->ndim, rb = B->ndim < 2 ? 2 : B->ndim, r = ra > rb ? ra : rb;
        g->r = r;
        for (int i = 0; i < r; i++) g->a[i] = g->b[i] = 1;
        if (A->ndim == 1) g->a[r - 1] = A->dims[0];
        else memcpy(g->a + r - A->ndim, A->dims, (size_t)A->ndim * sizeof(int64_t));
        if (B->ndim == 1) g->b[r - 2] = B->dims[0];
        else memcpy(g->b + r - B->ndim, B->dims, (size_t)B->ndim * sizeof(int64_t));
        for (int i = 0; i < r - 2; i++) {
            if (g->a[i] != g->b[i] && g->a[i] != 1 && g->b[i] != 1) return 0;
            g->y[i] = g->a[i] > g->b[i] ? g->a[i] : g->b[i];
        }
        g->M = g->a[r - 2], g->K = g->a[r - 1], g->N = g->b[r - 1];
        if (g->b[r - 2] != g->K) return 0;
    }
    if (g->M < 0 || g->N < 0 || g->K < 0) return 0;
    /* batch: fold, strided run, host loop */
    int nb = g->r - 2;
    g->fold = 1;
    for (int i = 0; i < nb; i++) g->fold &= g->b[i] == 1;
    g->count = 1, g->calls = 1;
    if (g->fold) {
        for (int i = 0; i < nb; i++) g->M *= g->a[i];
    } else {
        int q = nb;
        while (q > 0 && g->a[q - 1] == g->b[q - 1]) q--;
        int64_t cnt = 1;
        for (int i = q; i < nb; i++) cnt *= g->y[i];
        if (cnt > INT32_MAX) return 0;
        g->count = (int)cnt;
        int64_t sa = g->M * g->K * cnt, sb = g->K * g->N * cnt;
        g->nouter = q;
        for (int i = q - 1; i >= 0; i--) {
            g->od[i] = g->y[i];
            g->osa[i] = g->a[i] == 1 ? 0 : sa;
            g->osb[i] = g->b[i] == 1 ? 0 : sb;
            sa *= g->a[i], sb *= g->b[i];
            g->calls *= g->y[i];
        }
        if (g->calls > BLAS_MAX_CALLS) return 0;
    }
    /* C: which broadcast it is, and whether cuBLASLt takes it (one call: epilogue bias or its C operand) */
    if (g->has_c) {
        int64_t cn = eng_tensor_numel(C), yn = eng_tensor_numel(Y);
        int yr = Y->ndim;
        int64_t ylast = yr ? Y->dims[yr - 1] : 1, yprev = yr > 1 ? Y->dims[yr - 2] : 1;
        if (C->ndim > yr && cn != 1) return 0;
        if (cn == 1) g->pmode = POST_C_SCALAR;
        else if (cn == yn) g->pmode = POST_C_FULL;
        else if (C->ndim >= 1 && C->dims[C->ndim - 1] == ylast && cn == ylast) g->pmode = POST_C_ROW;
        else if (yr >= 2 && C->ndim >= 2 && C->dims[C->ndim - 1] == 1 && C->dims[C->ndim - 2] == yprev && cn == yprev)
            g->pmode = POST_C_COL;
        else g->pmode = POST_C_GENERAL;
        g->cmode = MM_C_POST;
        if (g->K > 0 && g->calls == 1 && g->cdt == g->ydt) {
            /* the epilogue's vector runs along the GEMM's N: Y's last dim only when B is not 1-D */
            if (g->pmode == POST_C_ROW && p->beta == 1.f && B->ndim >= 2 && ylast == g->N) g->cmode = MM_C_EPI;
            else if (g->pmode == POST_C_FULL) g->cmode = MM_C_GEMM;
        }
    }
    /* cuBLASLt's RELU is max(x, 0), its GELU the tanh approximation: exact matches only, and only where nothing
     * outside the GEMM comes between the product and the activation */
    if (g->K > 0 && g->calls == 1 && (g->cmode == MM_C_NONE || g->cmode == MM_C_EPI))
        g->act_epi = (p->act.kind == KRN_NN_ACT_RELU && p->act.alpha == 0.f) || p->act.kind == KRN_NN_ACT_GELU_TANH;
    return 1;
}

typedef struct mm_state {
    mm_geo geo;
    blas_mm mm;
    int device;
    int conv_a, conv_b;        /* convert A / B from f32 on every exec */
    void *bpack;               /* constant B converted once (cuda_mem_alloc), or NULL */
    size_t ws_total, off_a, off_b;
    int post;                  /* run blas_post after the GEMMs */
    blas_post_args pa;
    eng_dtype adt_in;
} mm_state;

static void mm_free(void *v) {
    mm_state *s = (mm_state *)v;
    if (!s) return;
    blas_mm_destroy(&s->mm);
    if (s->bpack) cuda_mem_free(s->device, s->bpack);
    free(s);
}

static eng_status mm_init_state(krn_call *c, mm_state *s) {
    const krn_matmul_params *p = (const krn_matmul_params *)c->params;
    cuda_ctx *x = CUDA_CTX(c);
    mm_geo *g = &s->geo;
    if (!x) return eng_err(ENG_STATUS_INTERNAL, "cuda matmul: no CUDA context at init");
    if (!mm_geo_get(c, c->compute, g))
        return eng_err(ENG_STATUS_UNSUPPORTED, "cuda matmul: call not supported (%s x %s -> %s, compute %s)",
                       eng_dtype_name(c->in[0].dtype), eng_dtype_name(c->in[1].dtype), eng_dtype_name(c->out[0].dtype),
                       eng_dtype_name(c->compute));
    s->device = x->device;
    const eng_tensor *A = &c->in[0], *B = &c->in[1], *Y = &c->out[0];
    const eng_tensor *C = g->has_c ? &c->in[2] : NULL;
    int64_t yn = eng_tensor_numel(Y);
    /* the pass after the GEMM */
    memset(&s->pa, 0, sizeof s->pa);
    s->pa.n = yn;
    s->pa.N = Y->ndim ? Y->dims[Y->ndim - 1] : 1;
    s->pa.M = Y->ndim > 1 ? Y->dims[Y->ndim - 2] : 1;
    s->pa.beta = p->beta;
    s->pa.act = p->act.kind, s->pa.act_alpha = p->act.alpha, s->pa.act_beta = p->act.beta;
    if (C && (g->cmode == MM_C_POST || g->K == 0)) {
        s->pa.cmode = g->pmode;
        if (g->pmode == POST_C_GENERAL) {
            s->pa.nd = Y->ndim;
            int64_t acc = 1;
            for (int i = Y->ndim - 1; i >= 0; i--) {
                int ci = i - (Y->ndim - C->ndim);
                int64_t cd = ci >= 0 ? C->dims[ci] : 1;
                s->pa.ydims[i] = Y->dims[i];
                s->pa.cstr[i] = cd == 1 ? 0 : acc;
                acc *= cd;
            }
        }
    }
    if (g->act_epi && g->K > 0) s->pa.act = KRN_NN_ACT_NONE;
    s->post = s->pa.cmode != POST_C_NONE || s->pa.act != KRN_NN_ACT_NONE;
    if (yn == 0 || g->K == 0) return ENG_STATUS_OK; /* exec: nothing, or zeros then the post pass */
    /* operands in the compute dtype */
    s->adt_in = A->dtype;
    s->conv_a = A->dtype != g->op_dt;
    int bconst = (c->const_mask >> 1) & 1;
    size_t ws_lt = blas_ws_limit(x), off = blas_round_up(ws_lt);
    if (B->dtype != g->op_dt) {
        if (bconst) {
            ENG_TRY(cuda_mem_alloc(x->device, (size_t)eng_tensor_numel(B) * 2, &s->bpack));
            ENG_TRY(blas_convert((const float *)B->data, s->bpack, g->op_dt, eng_tensor_numel(B), x->stream));
        } else {
            s->conv_b = 1;
        }
    }
    if (s->conv_a) s->off_a = off, off += blas_round_up((size_t)eng_tensor_numel(A) * 2);
    if (s->conv_b) s->off_b = off, off += blas_round_up((size_t)eng_tensor_numel(B) * 2);
    s->ws_total = off;
    void *ws;
    ENG_TRY(cuda_ctx_workspace(x, s->ws_total, &ws));
    /* the product */
    blas_mm *m = &s->mm;
    m->m = g->M, m->n = g->N, m->k = g->K;
    m->ta = p->gemm && p->trans_a, m->tb = p->gemm && p->trans_b;
    m->count = g->count;
    m->sa = g->M * g->K, m->sb = g->K * g->N, m->sy = g->M * g->N;
    m->adt = m->bdt = g->op_dt, m->ydt = g->ydt;
    m->ct = blas_compute_type(x, g->op_dt);
    m->ws_limit = ws_lt;
    uint32_t epi = 0; /* RELU | BIAS == RELU_BIAS, GELU | BIAS == GELU_BIAS; DEFAULT (1) is no bit of them */
    if (g->act_epi) epi = (uint32_t)(p->act.kind == KRN_NN_ACT_RELU ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_GELU);
    if (g->cmode == MM_C_EPI) epi |= (uint32_t)CUBLASLT_EPILOGUE_BIAS;
    m->epi = epi ? epi : (uint32_t)CUBLASLT_EPILOGUE_DEFAULT;
    /* alignment: of the pointers now, and of every batch element / loop offset */
    size_t eo = eng_dtype_size(g->op_dt), ey = eng_dtype_size(g->ydt);
    const void *pa = s->conv_a ? (const char *)ws + s->off_a : A->data;
    const void *pb = s->bpack ? s->bpack : s->conv_b ? (const char *)ws + s->off_b : B->data;
    unsigned al[4] = {blas_align(pa, m->sa * eo, 0), blas_align(pb, m->sb * eo, 0),
                      blas_align(Y->data, m->sy * ey, C && g->cmode == MM_C_GEMM ? (uint64_t)(uintptr_t)C->data : 0),
                      blas_align(C ? C->data : NULL, 0, 0)};
    eng_status st = blas_mm_create(x->lt, m, C ? C->data : NULL, al, "matmul");
    if (st != ENG_STATUS_OK && st != ENG_STATUS_OUT_OF_MEMORY && m->epi != (uint32_t)CUBLASLT_EPILOGUE_DEFAULT) {
        /* no algorithm with the epilogue: plain GEMM, bias and activation in the post pass */
        eng_err_clear();
        blas_mm_destroy(m);
        m->epi = (uint32_t)CUBLASLT_EPILOGUE_DEFAULT;
        if (g->cmode == MM_C_EPI) g->cmode = MM_C_POST, s->pa.cmode = g->pmode;
        g->act_epi = 0;
        s->pa.act = p->act.kind;
        s->post = s->pa.cmode != POST_C_NONE || s->pa.act != KRN_NN_ACT_NONE;
        st = blas_mm_create(x->lt, m, NULL, al, "matmul");
    }
    return st;
}

static eng_status mm_init(krn_call *c) {
    mm_state *s = (mm_state *)calloc(1, sizeof *s);
    if (!s) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "cuda matmul state");
    eng_status st = mm_init_state(c, s);
    if (st != ENG_STATUS_OK) {
        mm_free(s);
        return st;
    }
    c->state = s;
    return ENG_STATUS_OK;
}

static eng_status mm_exec(krn_call *c) {
    const krn_matmul_params *p = (const krn_matmul_params *)c->params;
    mm_state *s = (mm_state *)c->state;
    cuda_ctx *x = CUDA_CTX(c);
    if (!s) return eng_err(ENG_STATUS_INTERNAL, "cuda matmul: exec without init");
    const mm_geo *g = &s->geo;
    eng_tensor *Y = &c->out[0];
    if (s->pa.n == 0) return ENG_STATUS_OK;
    const void *cdata = g->has_c ? c->in[2].data : NULL;
    if (g->K == 0) {
        CUDA_TRY("matmul", cudaMemsetAsync(Y->data, 0, eng_tensor_nbytes(Y), x->stream));
    } else {
        void *ws;
        ENG_TRY(cuda_ctx_workspace(x, s->ws_total, &ws));
        const void *A = c->in[0].data, *B = s->bpack ? s->bpack : c->in[1].data;
        if (s->conv_a) {
            void *t = (char *)ws + s->off_a;
            ENG_TRY(blas_convert((const float *)A, t, g->op_dt, eng_tensor_numel(&c->in[0]), x->stream));
            A = t;
        }
        if (s->conv_b) {
            void *t = (char *)ws + s->off_b;
            ENG_TRY(blas_convert((const float *)B, t, g->op_dt, eng_tensor_numel(&c->in[1]), x->stream));
            B = t;
        }
        size_t eo = eng_dtype_size(g->op_dt), ey = eng_dtype_size(g->ydt);
        const void *gc = g->cmode == MM_C_GEMM ? cdata : NULL;
        const void *bias = g->cmode == MM_C_EPI ? cdata : NULL;
        float beta = gc ? p->beta : 0.f;
        int64_t idx[ENG_MAX_DIMS] = {0}, oa = 0, ob = 0, ystep = g->M * g->N * (int64_t)g->count;
        for (int64_t call = 0; call < g->calls; call++) {
            ENG_TRY(blas_mm_run(x->lt, &s->mm, p->alpha, beta, (const char *)A + oa * eo, (const char *)B + ob * eo, gc,
                                (char *)Y->data + call * ystep * ey, bias, ws, x->stream, "matmul"));
            for (int d = g->nouter - 1; d >= 0; d--) { /* next outer index, broadcast offsets */
                oa += g->osa[d], ob += g->osb[d];
                if (++idx[d] < g->od[d]) break;
                oa -= g->osa[d] * idx[d], ob -= g->osb[d] * idx[d];
                idx[d] = 0;
            }
        }
    }
    if (s->post) ENG_TRY(blas_post_launch(Y->data, g->ydt, cdata, g->cdt, s->pa, x->stream));
    return ENG_STATUS_OK;
}

static const char *mm_epi_name(uint32_t e) {
    switch (e) {
    case CUBLASLT_EPILOGUE_BIAS: return "bias";
    case CUBLASLT_EPILOGUE_RELU: return "relu";
    case CUBLASLT_EPILOGUE_GELU: return "gelu";
    case CUBLASLT_EPILOGUE_RELU_BIAS: return "bias_relu";
    case CUBLASLT_EPILOGUE_GELU_BIAS: return "bias_gelu";
    default: return "none";
    }
}

static void mm_describe(const krn_call *c, krn_impl_info *info) {
    const mm_state *s = (const mm_state *)c->state;
    memset(info, 0, sizeof *info);
    if (!s) {
        krn_str_copy(info->impl, sizeof info->impl, "cublasLt (no state)");
        return;
    }
    const mm_geo *g = &s->geo;
    snprintf(info->impl, sizeof info->impl, "cublasLt %s%s M=%lld N=%lld K=%lld batch=%d%s epilogue=%s%s%s%s%s",
             blas_dt_name(g->op_dt), s->mm.ct == CUBLAS_COMPUTE_32F_FAST_TF32 ? "(tf32)" : "", (long long)g->M,
             (long long)g->N, (long long)g->K, g->count, g->calls > 1 ? " loop" : "",
             mm_epi_name(s->mm.built ? s->mm.epi : 0), g->cmode == MM_C_GEMM ? " +C" : "",
             s->post ? " +post(bias/act)" : "", s->conv_a ? " +convert(A)" : "", s->conv_b ? " +convert(B)" : "");
    if (g->calls > 1) {
        size_t n = strlen(info->impl);
        snprintf(info->impl + n, sizeof info->impl - n, " calls=%lld", (long long)g->calls);
    }
    info->reorders = s->conv_a + s->conv_b;
}

static int mm_supports(const krn_call *c) {
    mm_geo g;
    return mm_geo_get(c, c->compute, &g);
}

static int mm_compute_ok(const krn_call *c, eng_dtype dt) {
    mm_geo g;
    if (dt != ENG_DTYPE_BF16 && dt != ENG_DTYPE_F16) return 0;
    return mm_geo_get(c, dt, &g);
}

/* ======================================================================== grad_matmul */

enum { GM_DY = 0, GM_A = 1, GM_B = 2 };
enum { GM_FOLD = 0, GM_BATCHED, GM_LOOP };

/* MatMulGrad (dY, A, B) -> dA (like A), dB (like B); either output may be omitted. */
typedef struct gm_geo {
    int mode;
    int64_t M, K, N;                            /* M: A's rows (folded over its batch in GM_FOLD) */
    int count;                                  /* GM_BATCHED */
    int r;                                      /* GM_LOOP: broadcast batch dims and per-operand strides */
    int64_t bd[ENG_MAX_DIMS], sa[ENG_MAX_DIMS], sb[ENG_MAX_DIMS];
    int64_t calls;
    eng_dtype op_dt;
    int want[2];                                /* dA, dB asked for */
} gm_geo;

static int gm_geo_get(const krn_call *c, eng_dtype compute, gm_geo *g) {
    memset(g, 0, sizeof *g);
    if (c->nin != 3 || c->nout < 1 || c->nout > 2) return 0;
    const eng_tensor *dy = &c->in[GM_DY], *at = &c->in[GM_A], *bt = &c->in[GM_B];
    if (at->ndim < 1 || bt->ndim < 1) return 0;
    for (int j = 0; j < c->nout; j++) g->want[j] = c->out[j].dtype != ENG_DTYPE_UNDEFINED;
    eng_dtype dts[5] = {dy->dtype, at->dtype, bt->dtype, g->want[0] ? c->out[0].dtype : ENG_DTYPE_UNDEFINED,
                        c->nout > 1 && g->want[1] ? c->out[1].dtype : ENG_DTYPE_UNDEFINED};
    g->op_dt = blas_op_dtype(compute, dts, 5);
    if (g->op_dt == ENG_DTYPE_UNDEFINED) return 0;
    int a1 = at->ndim == 1, b1 = bt->ndim == 1;
    g->M = a1 ? 1 : at->dims[at->ndim - 2], g->K = at->dims[at->ndim - 1], g->N = b1 ? 1 : bt->dims[bt->ndim - 1];
    if ((b1 ? bt->dims[0] : bt->dims[bt->ndim - 2]) != g->K) return 0;
    int ra = a1 ? 0 : at->ndim - 2, rb = b1 ? 0 : bt->ndim - 2, r = ra > rb ? ra : rb;
    int64_t stA = 1, stB = 1, nb = 1;
    int bshared = 1, equal = 1;
    g->r = r;
    for (int d = r - 1; d >= 0; d--) {
        int ia = d - (r - ra), ib = d - (r - rb);
        int64_t da = ia >= 0 ? at->dims[ia] : 1, db = ib >= 0 ? bt->dims[ib] : 1;
        if (da != db && da != 1 && db != 1) return 0;
        g->bd[d] = da > db ? da : db;
        g->sa[d] = da == 1 ? 0 : stA;
        g->sb[d] = db == 1 ? 0 : stB;
        stA *= da, stB *= db, nb *= g->bd[d];
        bshared &= db == 1;
        equal &= da == db;
    }
    if (eng_tensor_numel(dy) != nb * g->M * g->N) return 0;
    g->calls = 1;
    if (bshared) {
        g->mode = GM_FOLD;
        g->M *= nb; /* every A batch row against the one B */
    } else if (equal) {
        if (nb > INT32_MAX) return 0;
        g->mode = GM_BATCHED, g->count = (int)nb;
    } else {
        g->mode = GM_LOOP, g->calls = nb;
        if (nb > BLAS_MAX_CALLS) return 0;
        /* accumulating GEMMs (beta = 1) over broadcast batch: fp32 outputs only */
        for (int j = 0; j < c->nout; j++)
            if (g->want[j] && c->out[j].dtype != ENG_DTYPE_F32) return 0;
    }
    return 1;
}

typedef struct gm_state {
    gm_geo geo;
    blas_mm mm[2];             /* dA = dY B^T, dB = A^T dY (built when wanted and non-empty) */
    int zero[2];               /* output to be zeroed: an empty inner dim, or the loop's accumulation */
    int conv[3];               /* dY, A, B converted from f32 on every exec */
    size_t off[3], ws_total;
} gm_state;

static void gm_free(void *v) {
    gm_state *s = (gm_state *)v;
    if (!s) return;
    blas_mm_destroy(&s->mm[0]);
    blas_mm_destroy(&s->mm[1]);
    free(s);
}

static eng_status gm_init_state(krn_call *c, gm_state *s) {
    cuda_ctx *x = CUDA_CTX(c);
    gm_geo *g = &s->geo;
    if (!x) return eng_err(ENG_STATUS_INTERNAL, "cuda grad_matmul: no CUDA context at init");
    if (!gm_geo_get(c, c->compute, g))
        return eng_err(ENG_STATUS_UNSUPPORTED, "cuda grad_matmul: call not supported (A %s, B %s, compute %s)",
                       eng_dtype_name(c->in[GM_A].dtype), eng_dtype_name(c->in[GM_B].dtype), eng_dtype_name(c->compute));
    size_t ws_lt = blas_ws_limit(x), off = blas_round_up(ws_lt);
    /* per output: the product's (m, n, k), operands (row-major "A" and "B" of blas_mm) and transposes */
    int64_t pm[2] = {g->M, g->K}, pn[2] = {g->K, g->N}, pk[2] = {g->N, g->M};
    int need[3] = {0, 0, 0};
    for (int j = 0; j < 2; j++) {
        if (!g->want[j] || eng_tensor_numel(&c->out[j]) == 0) continue;
        if (pk[j] == 0 || g->mode == GM_LOOP) s->zero[j] = 1;
        if (pk[j] == 0) continue;
        need[GM_DY] = 1, need[j == 0 ? GM_B : GM_A] = 1;
        s->mm[j].built = -1; /* to build below */
    }
    for (int i = 0; i < 3; i++)
        if (need[i] && c->in[i].dtype != g->op_dt) {
            s->conv[i] = 1, s->off[i] = off;
            off += blas_round_up((size_t)eng_tensor_numel(&c->in[i]) * 2);
        }
    s->ws_total = off;
    void *ws;
    ENG_TRY(cuda_ctx_workspace(x, s->ws_total, &ws));
    size_t eo = eng_dtype_size(g->op_dt);
    for (int j = 0; j < 2; j++) {
        blas_mm *m = &s->mm[j];
        if (m->built != -1) continue;
        m->built = 0;
        m->m = pm[j], m->n = pn[j], m->k = pk[j];
        /* dA (M, K) = dY (M, N) . B^T, B stored (K, N): tb. dB (K, N) = A^T . dY, A stored (M, K): ta. */
        m->ta = j == 1, m->tb = j == 0;
        m->count = g->mode == GM_BATCHED ? g->count : 1;
        int64_t s_dy = g->M * g->N, s_a = g->M * g->K, s_b = g->K * g->N;
        m->sa = j == 0 ? s_dy : s_a;
        m->sb = j == 0 ? s_b : s_dy;
        m->sy = j == 0 ? s_a : s_b;
        m->adt = m->bdt = g->op_dt, m->ydt = c->out[j].dtype;
        m->ct = blas_compute_type(x, g->op_dt);
        m->epi = (uint32_t)CUBLASLT_EPILOGUE_DEFAULT;
        m->ws_limit = ws_lt;
        int ia = j == 0 ? GM_DY : GM_A, ib = j == 0 ? GM_B : GM_DY;
        const void *pa = s->conv[ia] ? (const char *)ws + s->off[ia] : c->in[ia].data;
        const void *pb = s->conv[ib] ? (const char *)ws + s->off[ib] : c->in[ib].data;
        /* batch and loop offsets are multiples of one matrix */
        unsigned al[4] = {blas_align(pa, m->sa * eo, 0), blas_align(pb, m->sb * eo, 0),
                          blas_align(c->out[j].data, m->sy * eng_dtype_size(m->ydt), 0), BLAS_WS_ALIGN};
        ENG_TRY(blas_mm_create(x->lt, m, NULL, al, "grad_matmul"));
    }
    return ENG_STATUS_OK;
}

static eng_status gm_init(krn_call *c) {
    gm_state *s = (gm_state *)calloc(1, sizeof *s);
    if (!s) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "cuda grad_matmul state");
    eng_status st = gm_init_state(c, s);
    if (st != ENG_STATUS_OK) {
        gm_free(s);
        return st;
    }
    c->state = s;
    return ENG_STATUS_OK;
}

static eng_status gm_exec(krn_call *c) {
    gm_state *s = (gm_state *)c->state;
    cuda_ctx *x = CUDA_CTX(c);
    if (!s) return eng_err(ENG_STATUS_INTERNAL, "cuda grad_matmul: exec without init");
    const gm_geo *g = &s->geo;
    void *out[2];
    for (int j = 0; j < 2; j++) {
        out[j] = j < c->nout && g->want[j] ? c->out[j].data : NULL;
        if (out[j] && s->zero[j]) CUDA_TRY("grad_matmul", cudaMemsetAsync(out[j], 0, eng_tensor_nbytes(&c->out[j]), x->stream));
    }
    int run[2] = {out[0] && s->mm[0].built, out[1] && s->mm[1].built};
    if (!run[0] && !run[1]) return ENG_STATUS_OK;
    void *ws;
    ENG_TRY(cuda_ctx_workspace(x, s->ws_total, &ws));
    const void *op[3];
    for (int i = 0; i < 3; i++) {
        op[i] = c->in[i].data;
        int used = i == GM_DY || (i == GM_B && run[0]) || (i == GM_A && run[1]);
        if (s->conv[i] && used) {
            void *t = (char *)ws + s->off[i];
            ENG_TRY(blas_convert((const float *)op[i], t, g->op_dt, eng_tensor_numel(&c->in[i]), x->stream));
            op[i] = t;
        }
    }
    size_t eo = eng_dtype_size(g->op_dt);
    if (g->mode != GM_LOOP) {
        if (run[0]) ENG_TRY(blas_mm_run(x->lt, &s->mm[0], 1.f, 0.f, op[GM_DY], op[GM_B], NULL, out[0], NULL, ws, x->stream, "grad_matmul"));
        if (run[1]) ENG_TRY(blas_mm_run(x->lt, &s->mm[1], 1.f, 0.f, op[GM_A], op[GM_DY], NULL, out[1], NULL, ws, x->stream, "grad_matmul"));
        return ENG_STATUS_OK;
    }
    /* broadcast batch: the CPU kernel's walk, each output slice accumulating (beta = 1) into zeroed outputs */
    int64_t idx[ENG_MAX_DIMS] = {0}, oa = 0, ob = 0;
    int64_t mk = g->M * g->K, kn = g->K * g->N, mn = g->M * g->N;
    for (int64_t i = 0; i < g->calls; i++) {
        const char *dyb = (const char *)op[GM_DY] + i * mn * eo;
        if (run[0])
            ENG_TRY(blas_mm_run(x->lt, &s->mm[0], 1.f, 1.f, dyb, (const char *)op[GM_B] + ob * kn * eo,
                                (float *)out[0] + oa * mk, (float *)out[0] + oa * mk, NULL, ws, x->stream, "grad_matmul"));
        if (run[1])
            ENG_TRY(blas_mm_run(x->lt, &s->mm[1], 1.f, 1.f, (const char *)op[GM_A] + oa * mk * eo, dyb,
                                (float *)out[1] + ob * kn, (float *)out[1] + ob * kn, NULL, ws, x->stream, "grad_matmul"));
        for (int d = g->r - 1; d >= 0; d--) {
            oa += g->sa[d], ob += g->sb[d];
            if (++idx[d] < g->bd[d]) break;
            oa -= g->sa[d] * idx[d], ob -= g->sb[d] * idx[d];
            idx[d] = 0;
        }
    }
    return ENG_STATUS_OK;
}

static void gm_describe(const krn_call *c, krn_impl_info *info) {
    const gm_state *s = (const gm_state *)c->state;
    memset(info, 0, sizeof *info);
    if (!s) {
        krn_str_copy(info->impl, sizeof info->impl, "cublasLt (no state)");
        return;
    }
    const gm_geo *g = &s->geo;
    static const char *modes[3] = {"folded", "batched", "loop"};
    snprintf(info->impl, sizeof info->impl, "cublasLt %s%s dA/dB %s M=%lld N=%lld K=%lld batch=%d calls=%lld%s%s",
             blas_dt_name(g->op_dt),
             (s->mm[0].built ? s->mm[0].ct : s->mm[1].ct) == CUBLAS_COMPUTE_32F_FAST_TF32 ? "(tf32)" : "",
             modes[g->mode], (long long)g->M, (long long)g->N, (long long)g->K, g->mode == GM_BATCHED ? g->count : 1,
             (long long)g->calls, s->mm[0].built ? " dA" : "", s->mm[1].built ? " dB" : "");
    if (s->conv[0] + s->conv[1] + s->conv[2]) {
        size_t n = strlen(info->impl);
        snprintf(info->impl + n, sizeof info->impl - n, " +convert");
    }
    info->reorders = s->conv[0] + s->conv[1] + s->conv[2];
}

static int gm_supports(const krn_call *c) {
    gm_geo g;
    return gm_geo_get(c, c->compute, &g);
}

static int gm_compute_ok(const krn_call *c, eng_dtype dt) {
    gm_geo g;
    if (dt != ENG_DTYPE_BF16 && dt != ENG_DTYPE_F16) return 0;
    return gm_geo_get(c, dt, &g);
}

/* ======================================================================== peak reference */

__global__ void blas_fill_rand(uint16_t *p, int64_t n, int bf16) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(i >> 32);
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        float v = (float)(h & 0xffff) / 32768.f - 1.f; /* [-1, 1) */
        if (bf16) {
            __nv_bfloat16 b = __float2bfloat16_rn(v);
            p[i] = *(const uint16_t *)&b;
        } else {
            __half b = __float2half_rn(v);
            p[i] = *(const uint16_t *)&b;
        }
    }
}

/* TFLOP/s of a plain cublasLtMatmul, D (m, n) = A (m, k) B (k, n) column-major, fp16 or bf16 in and out, fp32
 * accumulation, timed with CUDA events over `iters` runs after 3 warm-up runs, on its own stream and handle on
 * `device`. Synchronises (a benchmark, not a kernel); restores the caller's current device. */
extern "C" __attribute__((visibility("default"))) eng_status cuda_blas_peak_tflops(int device, int m, int n, int k, eng_dtype dt, int iters, double *tflops) {
    if (dt != ENG_DTYPE_F16 && dt != ENG_DTYPE_BF16)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "cuda_blas_peak_tflops: dtype %s, expected float16 or bfloat16",
                       eng_dtype_name(dt));
    if (m <= 0 || n <= 0 || k <= 0 || iters <= 0 || !tflops)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "cuda_blas_peak_tflops: m=%d n=%d k=%d iters=%d", m, n, k, iters);
    int prev = 0;
    CUDA_TRY("peak_tflops", cudaGetDevice(&prev));
    CUDA_TRY("peak_tflops", cudaSetDevice(device));
    eng_status st = ENG_STATUS_OK;
    cudaStream_t stream = NULL;
    cublasLtHandle_t lt = NULL;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    void *a = NULL, *b = NULL, *d = NULL, *ws = NULL;
    size_t ws_bytes = (size_t)32 << 20;
    cudaDataType_t cdt = blas_cuda_dt(dt);
    float alpha = 1.f, beta = 0.f, ms = 0.f;
    cublasLtMatmulHeuristicResult_t r;
    int nr = 0;
    cudaError_t ce;
    cublasStatus_t cs;
#define PEAK_CUDA(expr) do { ce = (expr); if (ce != cudaSuccess) { st = CUDA_ERR("peak_tflops", ce); goto done; } } while (0)
#define PEAK_BLAS(expr) do { cs = (expr); if (cs != CUBLAS_STATUS_SUCCESS) { \
        st = eng_err(ENG_STATUS_INTERNAL, "cuda peak_tflops: %s: cuBLASLt status %d", #expr, (int)cs); goto done; } } while (0)
    PEAK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    PEAK_BLAS(cublasLtCreate(&lt));
    PEAK_CUDA(cudaMalloc(&a, (size_t)m * k * 2));
    PEAK_CUDA(cudaMalloc(&b, (size_t)k * n * 2));
    PEAK_CUDA(cudaMalloc(&d, (size_t)m * n * 2));
    PEAK_CUDA(cudaMalloc(&ws, ws_bytes));
    blas_fill_rand<<<cuda_grid((long long)m * k, BLAS_THREADS), BLAS_THREADS, 0, stream>>>((uint16_t *)a, (int64_t)m * k, dt == ENG_DTYPE_BF16);
    PEAK_CUDA(cudaGetLastError());
    blas_fill_rand<<<cuda_grid((long long)k * n, BLAS_THREADS), BLAS_THREADS, 0, stream>>>((uint16_t *)b, (int64_t)k * n, dt == ENG_DTYPE_BF16);
    PEAK_CUDA(cudaGetLastError());
    PEAK_BLAS(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    PEAK_BLAS(cublasLtMatrixLayoutCreate(&la, cdt, (uint64_t)m, (uint64_t)k, m));
    PEAK_BLAS(cublasLtMatrixLayoutCreate(&lb, cdt, (uint64_t)k, (uint64_t)n, k));
    PEAK_BLAS(cublasLtMatrixLayoutCreate(&lc, cdt, (uint64_t)m, (uint64_t)n, m));
    PEAK_BLAS(cublasLtMatmulPreferenceCreate(&pref));
    PEAK_BLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
    memset(&r, 0, sizeof r);
    PEAK_BLAS(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &r, &nr));
    if (nr < 1) {
        st = eng_err(ENG_STATUS_UNSUPPORTED, "cuda peak_tflops: cuBLASLt has no algorithm for %s m=%d n=%d k=%d",
                     eng_dtype_name(dt), m, n, k);
        goto done;
    }
    for (int i = 0; i < 3; i++)
        PEAK_BLAS(cublasLtMatmul(lt, op, &alpha, a, la, b, lb, &beta, d, lc, d, lc, &r.algo, ws, ws_bytes, stream));
    PEAK_CUDA(cudaEventCreate(&e0));
    PEAK_CUDA(cudaEventCreate(&e1));
    PEAK_CUDA(cudaEventRecord(e0, stream));
    for (int i = 0; i < iters; i++)
        PEAK_BLAS(cublasLtMatmul(lt, op, &alpha, a, la, b, lb, &beta, d, lc, d, lc, &r.algo, ws, ws_bytes, stream));
    PEAK_CUDA(cudaEventRecord(e1, stream));
    PEAK_CUDA(cudaEventSynchronize(e1));
    PEAK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    *tflops = ms > 0.f ? 2.0 * m * n * (double)k * iters / ((double)ms * 1e-3) / 1e12 : 0.0;
done:
#undef PEAK_CUDA
#undef PEAK_BLAS
    if (stream) cudaStreamSynchronize(stream);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (op) cublasLtMatmulDescDestroy(op);
    if (a) cudaFree(a);
    if (b) cudaFree(b);
    if (d) cudaFree(d);
    if (ws) cudaFree(ws);
    if (lt) cublasLtDestroy(lt);
    if (stream) cudaStreamDestroy(stream);
    cudaSetDevice(prev);
    return st;
}

extern "C" const krn_kernel krn_cuda_blas_kernels[] = {
    {.name = "matmul", .init = mm_init, .exec = mm_exec, .free_state = mm_free, .describe = mm_describe,
     .compute_ok = mm_compute_ok, .io_ok = NULL, .supports = mm_supports},
    {.name = "grad_matmul", .init = gm_init, .exec = gm_exec, .free_state = gm_free, .describe = gm_describe,
     .compute_ok = gm_compute_ok, .io_ok = NULL, .supports = gm_supports},
    {NULL},
};
