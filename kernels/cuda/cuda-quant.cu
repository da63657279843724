/* cuda-quant.cu - the "quant" family on CUDA: quantize_linear, dequantize_linear, dynamic_quantize_linear,
 * qlinear_binary (com.microsoft QLinearAdd / QLinearMul), matmul_integer (MatMulInteger, QLinearMatMul,
 * com.microsoft MatMulIntegerToFloat) and conv_integer (ConvInteger, QLinearConv). Same names, params, inputs and
 * outputs as kernels/cpu/quant.c; its reference loops are what these match (krn-quant.h has the formulas).
 * The CPU-only "matmul_integer_ref" / "conv_integer_ref" names are not here (the planner keeps them on the CPU).
 *
 * Scales and zero points are device tensors: kernels read them on the device, so nothing waits for the host.
 * DynamicQuantizeLinear reduces min/max into per-block partials (workspace), and its second kernel reduces those
 * again in every block, derives scale and zero point there and quantizes (two launches, no host round trip).
 *
 * Integer matmul / conv (cuda-quant-dev.h): operands are prepared as int8 rows with K contiguous, K padded with
 * zeros to K4 (a multiple of 4): A8 (R, K4) from A (matmul) or from im2col (conv, one output position per row), and
 * Bt8 (Np, K4) from B transposed (matmul) or W (conv, its rows are already K-contiguous), Np = N rounded up to 4.
 * uint8 operands become int8 by XOR 0x80 (v - 128) and their zero points are shifted alike, so one signed GEMM
 * serves every dtype pair. D = A8 Bt8^T in int32 runs on cuBLASLt (CUBLAS_COMPUTE_32I, CUDA_R_8I operands in its
 * "TN" regular ordering: both K-contiguous, m = Np and k = K4 multiples of 4, lda = ldb = K4, ldc = Np, 4-byte
 * aligned pointers) when its heuristic has an algorithm, else on this file's tiled __dp4a kernel. Zero points
 * are applied afterwards by the row/column-sum correction
 *     sum (a - az)(b - bz) = sum a'b' - az' colsum(b') - bz' rowsum(a') + K az' bz'
 * in uint32 arithmetic: exact modulo 2^32, which is what the CPU's int64 accumulation wrapped to int32 gives. The
 * epilogue kernel also writes the output: int32, requantized 8-bit (double, as the CPU reference), or float32
 * with bias and activation (MatMulIntegerToFloat). Padding taps of a conv read x's zero point, so they add 0.
 * Raw GEMM sums stay within int32 (K4 <= 131071 for cuBLASLt, so its accumulation mode does not matter);
 * __dp4a wraps. Float and requantized outputs need the true accumulator, which fits int32 while
 * K <= 33025 (|a - az|, |b - bz| <= 255): larger K is refused for them.
 * Constant B / W (const_mask) is prepared once in init into cuda_mem_alloc memory; otherwise on every exec into
 * the workspace. Big convs run in chunks of images so im2col stays within QZ_CONV_WS_CAP of workspace.
 *
 * supports() refuses: dtypes the CPU kernels do not take, transposed / fused (residual, pool, depthwise,
 * activation) convs, layouts other than plain and, for 2-D convs, channels-last, empty reductions (K = 0), float or
 * requantized outputs with K > 33025.
 *
 * Known differences from the CPU: QLinearAdd/Mul compute the documented float32 expression with no FMA; the CPU's
 * AVX-512 loop may be contracted by GCC (-ffp-contract=fast), so a value exactly at a rounding tie may differ by one
 * step. MatMulIntegerToFloat's float outputs match within float rounding (oneDNN's path rounds differently anyway).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-impl.h"
extern "C" {
#include "../krn-nn.h"
#include "../krn-quant.h"
}
#include "cuda-quant-dev.h"

#define QZ_WS_ALIGN 256
#define QZ_KMAX_EXACT 33025      /* largest K whose true accumulator fits int32: 255 * 255 * K < 2^31 */
#define QZ_KMAX_LT 131071        /* largest K4 whose raw int8 sums fit int32: 128 * 128 * K4 < 2^31 */
#define QZ_CONV_WS_CAP ((size_t)256 << 20)

static size_t qz_round_up(size_t n) { return (n + QZ_WS_ALIGN - 1) / QZ_WS_ALIGN * QZ_WS_ALIGN; }
static int qz_8bit(eng_dtype dt) { return dt == ENG_DTYPE_U8 || dt == ENG_DTYPE_I8; }
/* Input i when given (an omitted optional input has dtype UNDEFINED), else NULL. */
static const eng_tensor *qz_in(const krn_call *c, int i) {
    return i >= 0 && i < c->nin && c->in[i].dtype != ENG_DTYPE_UNDEFINED ? &c->in[i] : NULL;
}
static int qz_dt(const eng_tensor *t) { return t ? (int)t->dtype : (int)ENG_DTYPE_UNDEFINED; }
static const void *qz_ptr(const eng_tensor *t) { return t ? t->data : NULL; }
/* A scale / zero point with one element, or n (n > 1). */
static int qz_one_or(const eng_tensor *t, int64_t n) {
    int64_t k = eng_tensor_numel(t);
    return k == 1 || (n > 1 && k == n);
}
static int qz_per(const eng_tensor *t) { return t && eng_tensor_numel(t) > 1; }
static unsigned qz_grid3(int64_t n) { return (unsigned)(n < 1 ? 1 : n > 65535 ? 65535 : n); }

/* ======================================================================== QuantizeLinear / DequantizeLinear */

static int qdq_check(const krn_call *c, int quant) {
    const krn_qdq_params *p = (const krn_qdq_params *)c->params;
    if (!p || c->nin < 2 || c->nin > 3 || c->nout != 1) return 0;
    const eng_tensor *x = &c->in[0], *s = &c->in[1], *z = qz_in(c, 2), *y = &c->out[0];
    if (s->dtype != ENG_DTYPE_F32) return 0;
    if (quant) {
        if (x->dtype != ENG_DTYPE_F32 || !qz_8bit(y->dtype) || (z && z->dtype != y->dtype)) return 0;
    } else {
        if (!(qz_8bit(x->dtype) || x->dtype == ENG_DTYPE_I32) || y->dtype != ENG_DTYPE_F32 || (z && z->dtype != x->dtype))
            return 0;
    }
    if (eng_tensor_numel(y) != eng_tensor_numel(x)) return 0;
    int64_t C = 1;
    if (p->axis >= 0) {
        if (p->axis >= x->ndim) return 0;
        C = x->dims[p->axis];
    }
    return qz_one_or(s, C) && (!z || qz_one_or(z, C));
}

static int qdq_supports_q(const krn_call *c) { return qdq_check(c, 1); }
static int qdq_supports_dq(const krn_call *c) { return qdq_check(c, 0); }

static void qdq_args(const krn_call *c, qz_qdq_args *a) {
    const krn_qdq_params *p = (const krn_qdq_params *)c->params;
    const eng_tensor *x = &c->in[0], *z = qz_in(c, 2);
    memset(a, 0, sizeof *a);
    a->n = eng_tensor_numel(x);
    a->inner = 1, a->C = 1;
    if (p->axis >= 0) {
        for (int d = p->axis + 1; d < x->ndim; d++) a->inner *= x->dims[d];
        a->C = x->dims[p->axis];
    }
    a->sper = qz_per(&c->in[1]);
    a->zper = qz_per(z);
    a->zdt = qz_dt(z);
    a->xdt = x->dtype;
    a->s8 = c->out[0].dtype == ENG_DTYPE_I8;
    if (a->inner < 1) a->inner = 1;
    if (a->C < 1) a->C = 1;
}

static eng_status qdq_exec_q(krn_call *c) {
    cuda_ctx *x = CUDA_CTX(c);
    qz_qdq_args a;
    qdq_args(c, &a);
    if (a.n <= 0) return ENG_STATUS_OK;
    const void *xp = c->in[0].data;
    void *yp = c->out[0].data;
    a.vec = (uintptr_t)xp % 16 == 0 && (uintptr_t)yp % 4 == 0 && (!(a.sper || a.zper) || a.inner % 4 == 0);
    qz_quantize_kernel<<<cuda_grid(a.vec ? (a.n + 3) / 4 : a.n, QZ_THREADS), QZ_THREADS, 0, x->stream>>>(
        (const float *)xp, (const float *)c->in[1].data, qz_ptr(qz_in(c, 2)), (uint8_t *)yp, a);
    CUDA_LAUNCHED("quantize_linear");
    return ENG_STATUS_OK;
}

static eng_status qdq_exec_dq(krn_call *c) {
    cuda_ctx *x = CUDA_CTX(c);
    qz_qdq_args a;
    qdq_args(c, &a);
    if (a.n <= 0) return ENG_STATUS_OK;
    const void *xp = c->in[0].data;
    void *yp = c->out[0].data;
    a.vec = a.xdt != ENG_DTYPE_I32 && (uintptr_t)xp % 4 == 0 && (uintptr_t)yp % 16 == 0 &&
            (!(a.sper || a.zper) || a.inner % 4 == 0);
    qz_dequantize_kernel<<<cuda_grid(a.vec ? (a.n + 3) / 4 : a.n, QZ_THREADS), QZ_THREADS, 0, x->stream>>>(
        xp, (const float *)c->in[1].data, qz_ptr(qz_in(c, 2)), (float *)yp, a);
    CUDA_LAUNCHED("dequantize_linear");
    return ENG_STATUS_OK;
}

/* ======================================================================== DynamicQuantizeLinear */

static int dyn_supports(const krn_call *c) {
    if (c->nin != 1 || c->nout < 1 || c->nout > 3) return 0;
    if (c->in[0].dtype != ENG_DTYPE_F32 || c->out[0].dtype != ENG_DTYPE_U8) return 0;
    if (eng_tensor_numel(&c->out[0]) != eng_tensor_numel(&c->in[0])) return 0;
    if (c->nout > 1 && c->out[1].dtype != ENG_DTYPE_UNDEFINED && (c->out[1].dtype != ENG_DTYPE_F32 || eng_tensor_numel(&c->out[1]) != 1))
        return 0;
    if (c->nout > 2 && c->out[2].dtype != ENG_DTYPE_UNDEFINED && (c->out[2].dtype != ENG_DTYPE_U8 || eng_tensor_numel(&c->out[2]) != 1))
        return 0;
    return 1;
}

static eng_status dyn_exec(krn_call *c) {
    cuda_ctx *x = CUDA_CTX(c);
    int64_t n = eng_tensor_numel(&c->in[0]);
    const float *xp = (const float *)c->in[0].data;
    uint8_t *yp = (uint8_t *)c->out[0].data;
    float *ys = c->nout > 1 ? (float *)c->out[1].data : NULL;
    uint8_t *yz = c->nout > 2 ? (uint8_t *)c->out[2].data : NULL;
    if (n < 0) n = 0;
    void *ws;
    ENG_TRY(cuda_ctx_workspace(x, 2 * QZ_DYN_PARTS * sizeof(float), &ws));
    int vec_in = (uintptr_t)xp % 16 == 0, vec = vec_in && (uintptr_t)yp % 4 == 0;
    unsigned parts = cuda_grid(vec_in ? (n + 3) / 4 : n, QZ_THREADS);
    if (parts > QZ_DYN_PARTS) parts = QZ_DYN_PARTS;
    qz_dyn_minmax<<<parts, QZ_THREADS, 0, x->stream>>>(xp, n, vec_in, (float *)ws);
    CUDA_LAUNCHED("dynamic_quantize_linear (min/max)");
    unsigned blocks = cuda_grid(vec ? (n + 3) / 4 : n, QZ_THREADS);
    if (blocks > QZ_DYN_PARTS) blocks = QZ_DYN_PARTS;
    qz_dyn_apply<<<blocks, QZ_THREADS, 0, x->stream>>>(xp, n, vec, (const float *)ws, (int)parts, yp, ys, yz);
    CUDA_LAUNCHED("dynamic_quantize_linear");
    return ENG_STATUS_OK;
}

/* ======================================================================== QLinearAdd / QLinearMul */

/* y's dims with a's and b's strides (0 where broadcast), size-1 dims dropped and mergeable neighbours merged. */
static int bin_args(const krn_call *c, qz_bin_args *k) {
    const krn_qbinary_params *p = (const krn_qbinary_params *)c->params;
    memset(k, 0, sizeof *k);
    if (!p || c->nin < 7 || c->nin > 8 || c->nout != 1) return 0;
    const eng_tensor *a = &c->in[0], *b = &c->in[3], *y = &c->out[0];
    if (!qz_8bit(a->dtype) || b->dtype != a->dtype || y->dtype != a->dtype) return 0;
    for (int i = 1; i < c->nin; i++) {
        if (i == 3) continue;
        const eng_tensor *t = qz_in(c, i);
        int zp = i == 2 || i == 5 || i == 7;
        if (!t) {
            if (!zp) return 0;
            continue;
        }
        if (t->dtype != (zp ? a->dtype : ENG_DTYPE_F32) || eng_tensor_numel(t) != 1) return 0;
    }
    int r = y->ndim;
    if (a->ndim > r || b->ndim > r || r > QZ_MAX_DIMS) return 0;
    k->n = eng_tensor_numel(y);
    k->mul = p->mul, k->s8 = y->dtype == ENG_DTYPE_I8;
    k->zadt = qz_dt(qz_in(c, 2)), k->zbdt = qz_dt(qz_in(c, 5)), k->zcdt = qz_dt(qz_in(c, 7));
    if (eng_shape_equal(a, y) && eng_shape_equal(b, y)) {
        k->flat = 1;
        return 1;
    }
    int64_t yd[QZ_MAX_DIMS], sa[QZ_MAX_DIMS], sb[QZ_MAX_DIMS], st_a = 1, st_b = 1;
    for (int d = r - 1; d >= 0; d--) {
        int da = d - (r - a->ndim), db = d - (r - b->ndim);
        int64_t ea = da >= 0 ? a->dims[da] : 1, eb = db >= 0 ? b->dims[db] : 1;
        if ((ea != 1 && ea != y->dims[d]) || (eb != 1 && eb != y->dims[d])) return 0;
        yd[d] = y->dims[d];
        sa[d] = ea == 1 ? 0 : st_a, sb[d] = eb == 1 ? 0 : st_b;
        st_a *= ea, st_b *= eb;
    }
    int nd = 0; /* collapsed, outermost first */
    for (int d = 0; d < r; d++) {
        if (yd[d] == 1) continue;
        if (nd > 0 && k->sa[nd - 1] == sa[d] * yd[d] && k->sb[nd - 1] == sb[d] * yd[d]) {
            k->yd[nd - 1] *= yd[d], k->sa[nd - 1] = sa[d], k->sb[nd - 1] = sb[d];
            continue;
        }
        k->yd[nd] = yd[d], k->sa[nd] = sa[d], k->sb[nd] = sb[d];
        nd++;
    }
    k->nd = nd;
    return 1;
}

static int bin_supports(const krn_call *c) {
    qz_bin_args k;
    return bin_args(c, &k);
}

static eng_status bin_exec(krn_call *c) {
    cuda_ctx *x = CUDA_CTX(c);
    qz_bin_args k;
    if (!bin_args(c, &k))
        return eng_err(ENG_STATUS_UNSUPPORTED, "cuda qlinear_binary: call not supported (%s)", eng_dtype_name(c->in[0].dtype));
    if (k.n <= 0) return ENG_STATUS_OK;
    const void *a = c->in[0].data, *b = c->in[3].data;
    void *y = c->out[0].data;
    k.vec = k.flat && ((uintptr_t)a | (uintptr_t)b | (uintptr_t)y) % 4 == 0;
    qz_binary_kernel<<<cuda_grid(k.vec ? (k.n + 3) / 4 : k.n, QZ_THREADS), QZ_THREADS, 0, x->stream>>>(
        (const uint8_t *)a, (const float *)c->in[1].data, qz_ptr(qz_in(c, 2)), (const uint8_t *)b,
        (const float *)c->in[4].data, qz_ptr(qz_in(c, 5)), (const float *)c->in[6].data, qz_ptr(qz_in(c, 7)),
        (uint8_t *)y, k);
    CUDA_LAUNCHED("qlinear_binary");
    return ENG_STATUS_OK;
}

static eng_status bin_init(krn_call *c) { /* no state: lets the planner record describe()'s line */
    (void)c;
    return ENG_STATUS_OK;
}

static void bin_describe(const krn_call *c, krn_impl_info *info) {
    qz_bin_args k;
    memset(info, 0, sizeof *info);
    bin_args(c, &k);
    snprintf(info->impl, sizeof info->impl, "cuda int8 elementwise %s (float32 rescale, as MLAS)%s",
             k.flat ? "same-shape" : "broadcast", k.flat ? "" : " strided");
}

/* ======================================================================== the int8 GEMM both families share */

/* D[b] (R, Np; ld Np) = A8[b] (R, K4) . Bt8[b] (Np, K4)^T for b < count, element strides sa, sb, sd. */
typedef struct qz_gemm {
    int64_t R, Np, K4, count, sa, sb, sd;
    int lt;                            /* 1: cuBLASLt, 0: the __dp4a kernel */
    char why[160];                     /* why not cuBLASLt */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc; /* cuBLASLt's A (Bt8), B (A8), C = D */
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulAlgo_t algo;
    size_t ws_limit;
    unsigned al[3];                    /* alignment (bytes) the algorithm was chosen for: A8, Bt8, D */
} qz_gemm;

static void qz_gemm_destroy(qz_gemm *g) {
    if (g->pref) cublasLtMatmulPreferenceDestroy(g->pref);
    if (g->la) cublasLtMatrixLayoutDestroy(g->la);
    if (g->lb) cublasLtMatrixLayoutDestroy(g->lb);
    if (g->lc) cublasLtMatrixLayoutDestroy(g->lc);
    if (g->op) cublasLtMatmulDescDestroy(g->op);
    g->pref = NULL, g->la = g->lb = g->lc = NULL, g->op = NULL, g->lt = 0;
}

static size_t qz_lt_ws(const cuda_ctx *x) { return x->sm >= 90 ? ((size_t)32 << 20) : ((size_t)8 << 20); }

/* Largest power of two <= 256 dividing p and the batch stride in bytes. */
static unsigned qz_align(const void *p, uint64_t stride_bytes) {
    uint64_t v = (uint64_t)(uintptr_t)p | stride_bytes | QZ_WS_ALIGN;
    return (unsigned)(v & (~v + 1));
}

static eng_status qz_layout(cublasLtMatrixLayout_t *l, cudaDataType_t dt, int64_t rows, int64_t cols, int64_t ld,
                            int64_t count, int64_t stride, const char *what) {
    CUBLAS_TRY(what, cublasLtMatrixLayoutCreate(l, dt, (uint64_t)rows, (uint64_t)cols, ld));
    if (count > 1) {
        int32_t bc = (int32_t)count;
        CUBLAS_TRY(what, cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
        CUBLAS_TRY(what, cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
    }
    return ENG_STATUS_OK;
}

static eng_status qz_lt_pick(cublasLtHandle_t lt, qz_gemm *g, const unsigned al[3], const char *what) {
    uint32_t a_al = al[1], b_al = al[0], cd_al = al[2]; /* cuBLASLt's A is Bt8 */
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
        return eng_err(ENG_STATUS_UNSUPPORTED, "cuBLASLt has no int8 algorithm for m=%lld n=%lld k=%lld batch=%lld (status %d, %d results)",
                       (long long)g->Np, (long long)g->R, (long long)g->K4, (long long)g->count, (int)s, nr);
    g->algo = r.algo;
    memcpy(g->al, al, sizeof g->al);
    return ENG_STATUS_OK;
}

static eng_status qz_lt_create(cublasLtHandle_t lt, qz_gemm *g, const unsigned al[3], const char *what) {
    CUBLAS_TRY(what, cublasLtMatmulDescCreate(&g->op, CUBLAS_COMPUTE_32I, CUDA_R_32I));
    int32_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N; /* "TN": both operands K-contiguous */
    CUBLAS_TRY(what, cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_TRY(what, cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    ENG_TRY(qz_layout(&g->la, CUDA_R_8I, g->K4, g->Np, g->K4, g->count, g->sb, what));
    ENG_TRY(qz_layout(&g->lb, CUDA_R_8I, g->K4, g->R, g->K4, g->count, g->sa, what));
    ENG_TRY(qz_layout(&g->lc, CUDA_R_32I, g->Np, g->R, g->Np, g->count, g->sd, what));
    CUBLAS_TRY(what, cublasLtMatmulPreferenceCreate(&g->pref));
    return qz_lt_pick(lt, g, al, what);
}

/* Choose cuBLASLt (an algorithm for these pointers' alignment) or the __dp4a kernel. Fields R..sd set. */
static eng_status qz_gemm_init(cuda_ctx *x, qz_gemm *g, const void *A8, const void *B8, const void *D, const char *what) {
    g->ws_limit = qz_lt_ws(x);
    g->lt = 0;
    if (g->K4 > QZ_KMAX_LT) {
        snprintf(g->why, sizeof g->why, "K %lld beyond cuBLASLt's exact int32 range", (long long)g->K4);
        return ENG_STATUS_OK;
    }
    if (g->count > INT32_MAX) {
        snprintf(g->why, sizeof g->why, "batch %lld", (long long)g->count);
        return ENG_STATUS_OK;
    }
    unsigned al[3] = {qz_align(A8, (uint64_t)g->sa), qz_align(B8, (uint64_t)g->sb), qz_align(D, (uint64_t)g->sd * 4)};
    eng_status st = qz_lt_create(x->lt, g, al, what);
    if (st == ENG_STATUS_OUT_OF_MEMORY) return st;
    if (st != ENG_STATUS_OK) {
        krn_str_copy(g->why, sizeof g->why, eng_last_error());
        eng_err_clear();
        qz_gemm_destroy(g);
        return ENG_STATUS_OK;
    }
    g->lt = 1;
    return ENG_STATUS_OK;
}

static eng_status qz_gemm_run(cuda_ctx *x, qz_gemm *g, const int8_t *A8, const int8_t *B8, int32_t *D, void *ws, const char *what) {
    if (g->lt) {
        unsigned now[3] = {qz_align(A8, (uint64_t)g->sa), qz_align(B8, (uint64_t)g->sb), qz_align(D, (uint64_t)g->sd * 4)};
        unsigned al[3];
        int repick = 0;
        for (int i = 0; i < 3; i++) {
            al[i] = now[i] < g->al[i] ? now[i] : g->al[i];
            repick |= now[i] < g->al[i];
        }
        if (repick) ENG_TRY(qz_lt_pick(x->lt, g, al, what));
        const int32_t alpha = 1, beta = 0;
        CUBLAS_TRY(what, cublasLtMatmul(x->lt, g->op, &alpha, B8, g->la, A8, g->lb, &beta, D, g->lc, D, g->lc, &g->algo, ws,
                                        g->ws_limit, x->stream));
        return ENG_STATUS_OK;
    }
    dim3 grid(qz_grid3((g->Np + QZ_BN - 1) / QZ_BN), qz_grid3((g->R + QZ_BM - 1) / QZ_BM), qz_grid3(g->count));
    qz_gemm_dp4a<<<grid, 256, 0, x->stream>>>(A8, B8, D, g->R, g->Np, g->K4, g->count, g->sa, g->sb, g->sd);
    CUDA_LAUNCHED(what);
    return ENG_STATUS_OK;
}

static eng_status qz_epilogue_run(cuda_ctx *x, const int32_t *D, void *y, const qz_epi_args &e, const char *what) {
    if (e.R <= 0 || e.C <= 0 || e.count <= 0) return ENG_STATUS_OK;
    dim3 grid(qz_grid3((e.C + 31) / 32), qz_grid3((e.R + 31) / 32), qz_grid3(e.count)), block(32, 8);
    qz_epilogue<<<grid, block, 0, x->stream>>>(D, y, e);
    CUDA_LAUNCHED(what);
    return ENG_STATUS_OK;
}

static eng_status qz_rows8_run(cuda_ctx *x, const void *src, int64_t K, int64_t K4, int64_t Rr, int64_t Rp, int64_t count,
                               const qz_bdims &bd, uint32_t flip, int64_t perm_cg, int8_t *dst, int32_t *sums, const char *what) {
    int64_t rows = count * Rp;
    if (rows <= 0) return ENG_STATUS_OK;
    qz_rows8<<<cuda_grid(rows * 32, QZ_THREADS), QZ_THREADS, 0, x->stream>>>((const uint8_t *)src, K, K4, Rr, Rp, count, bd,
                                                                               flip, perm_cg, dst, sums);
    CUDA_LAUNCHED(what);
    return ENG_STATUS_OK;
}

static void qz_gemm_describe(const qz_gemm *g, char *buf, size_t n) {
    if (g->lt) snprintf(buf, n, "cublasLt int8 (COMPUTE_32I, TN)");
    else snprintf(buf, n, "dp4a tiles (%.100s)", g->why[0] ? g->why : "no cuBLASLt");
}

/* ======================================================================== matmul_integer */

/* Everything decided from shapes, dtypes and params alone. */
typedef struct qmm_geo {
    int q, tf;
    int ib, iaz, ibz, ias, ibs;   /* input indices (-1: none) */
    int r;
    qz_bdims abd, bbd;            /* A's / B's batch dims against the output's */
    int64_t nbatch, M, N, K, K4, Np;
    int fold;                     /* B has no batch (all 1): A's batch folds into the rows, one GEMM */
    int64_t R, count;             /* GEMM rows per batch, batches */
    eng_dtype adt, bdt, ydt;
} qmm_geo;

static int qmm_geo_get(const krn_call *c, qmm_geo *g) {
    const krn_qmatmul_params *p = (const krn_qmatmul_params *)c->params;
    memset(g, 0, sizeof *g);
    if (!p || c->nout != 1 || (p->qlinear && p->to_float)) return 0;
    g->q = p->qlinear, g->tf = p->to_float;
    if (g->q) {
        if (c->nin != 8) return 0;
        g->ib = 3, g->ias = 1, g->iaz = 2, g->ibs = 4, g->ibz = 5;
    } else if (g->tf) {
        if (c->nin < 4 || c->nin > 7) return 0;
        g->ib = 1, g->ias = 2, g->ibs = 3, g->iaz = 4, g->ibz = 5;
    } else {
        if (c->nin < 2 || c->nin > 4) return 0;
        g->ib = 1, g->ias = g->ibs = -1, g->iaz = 2, g->ibz = 3;
    }
    const eng_tensor *A = &c->in[0], *B = &c->in[g->ib], *Y = &c->out[0];
    g->adt = A->dtype, g->bdt = B->dtype, g->ydt = Y->dtype;
    if (!qz_8bit(A->dtype) || !qz_8bit(B->dtype) || A->ndim < 1 || B->ndim < 1) return 0;
    g->K = A->dims[A->ndim - 1];
    g->M = A->ndim >= 2 ? A->dims[A->ndim - 2] : 1;
    g->N = B->ndim >= 2 ? B->dims[B->ndim - 1] : 1;
    if ((B->ndim >= 2 ? B->dims[B->ndim - 2] : B->dims[0]) != g->K || g->K < 1 || g->M < 0 || g->N < 0) return 0;
    int na = A->ndim > 2 ? A->ndim - 2 : 0, nb = B->ndim > 2 ? B->ndim - 2 : 0;
    g->r = na > nb ? na : nb;
    if (g->r > QZ_MAX_DIMS) return 0;
    g->nbatch = 1, g->fold = 1;
    g->abd.r = g->bbd.r = g->r;
    for (int d = 0; d < g->r; d++) {
        int64_t a = d < g->r - na ? 1 : A->dims[d - (g->r - na)], b = d < g->r - nb ? 1 : B->dims[d - (g->r - nb)];
        if (a != b && a != 1 && b != 1) return 0;
        int64_t y = a > b ? a : b;
        g->abd.bd[d] = a, g->bbd.bd[d] = b, g->abd.yd[d] = g->bbd.yd[d] = y;
        g->nbatch *= y;
        g->fold &= b == 1;
    }
    if (eng_tensor_numel(Y) != g->nbatch * g->M * g->N) return 0;
    /* scales, zero points, bias */
    const eng_tensor *az = qz_in(c, g->iaz), *bz = qz_in(c, g->ibz);
    if (az && (az->dtype != A->dtype || !qz_one_or(az, g->tf ? 1 : g->M))) return 0;
    if (bz && (bz->dtype != B->dtype || !qz_one_or(bz, g->N))) return 0;
    if (g->q || g->tf) {
        if (g->K > QZ_KMAX_EXACT) return 0;
        const eng_tensor *as = qz_in(c, g->ias), *bs = qz_in(c, g->ibs);
        if (!as || !bs || as->dtype != ENG_DTYPE_F32 || bs->dtype != ENG_DTYPE_F32) return 0;
        if (!qz_one_or(as, g->tf ? 1 : g->M) || !qz_one_or(bs, g->N)) return 0;
    }
    if (g->q) {
        const eng_tensor *ys = qz_in(c, 6), *yz = qz_in(c, 7);
        if (!ys || ys->dtype != ENG_DTYPE_F32 || eng_tensor_numel(ys) != 1) return 0;
        if (yz && (!qz_8bit(yz->dtype) || eng_tensor_numel(yz) != 1 || yz->dtype != Y->dtype)) return 0;
        if (!qz_8bit(Y->dtype)) return 0;
    } else if (g->tf) {
        const eng_tensor *bias = qz_in(c, 6);
        if (bias && (bias->dtype != ENG_DTYPE_F32 || eng_tensor_numel(bias) != g->N)) return 0;
        if (Y->dtype != ENG_DTYPE_F32 || p->act.kind < KRN_NN_ACT_NONE || p->act.kind > KRN_NN_ACT_HARD_SWISH) return 0;
    } else if (Y->dtype != ENG_DTYPE_I32) {
        return 0;
    }
    g->K4 = (g->K + 3) / 4 * 4;
    g->Np = (g->N + 3) / 4 * 4;
    g->R = g->fold ? g->nbatch * g->M : g->M;
    g->count = g->fold ? 1 : g->nbatch;
    return 1;
}

typedef struct qmm_state {
    qmm_geo geo;
    qz_gemm gemm;
    int device;
    int bconst;                 /* Bt8 and its column sums prepared once, in bpack */
    void *bpack;
    int dy;                     /* D is Y itself (int32 / float32 output with N % 4 == 0) */
    size_t off_a, off_rs, off_b, off_cs, off_d, ws_total;
} qmm_state;

static void qmm_free(void *v) {
    qmm_state *s = (qmm_state *)v;
    if (!s) return;
    qz_gemm_destroy(&s->gemm);
    if (s->bpack) cuda_mem_free(s->device, s->bpack);
    free(s);
}

/* Bt8 (count or 1, Np, K4) and column sums from B into b8 / cs. */
static eng_status qmm_prep_b(cuda_ctx *x, const qmm_geo *g, const void *B, int8_t *b8, int32_t *cs) {
    int64_t nb = g->count;
    if (g->Np * g->K4 * nb == 0) return ENG_STATUS_OK;
    CUDA_TRY("matmul_integer (column sums)", cudaMemsetAsync(cs, 0, (size_t)(nb * g->Np) * sizeof(int32_t), x->stream));
    qz_bdims bd = g->bbd;
    if (g->fold) bd.r = 0; /* one B matrix */
    dim3 grid(qz_grid3((g->Np + 31) / 32), qz_grid3((g->K4 + 31) / 32), qz_grid3(nb)), block(32, 8);
    qz_transpose8<<<grid, block, 0, x->stream>>>((const uint8_t *)B, g->K, g->N, g->K4, g->Np, nb, bd,
                                                 g->bdt == ENG_DTYPE_U8 ? 0x80u : 0u, b8, cs);
    CUDA_LAUNCHED("matmul_integer (B)");
    return ENG_STATUS_OK;
}

static eng_status qmm_init_state(krn_call *c, qmm_state *s) {
    cuda_ctx *x = CUDA_CTX(c);
    qmm_geo *g = &s->geo;
    if (!x) return eng_err(ENG_STATUS_INTERNAL, "cuda matmul_integer: no CUDA context at init");
    if (!qmm_geo_get(c, g))
        return eng_err(ENG_STATUS_UNSUPPORTED, "cuda matmul_integer: call not supported (A %s, %d inputs -> %s)",
                       c->nin > 0 ? eng_dtype_name(c->in[0].dtype) : "none", c->nin,
                       c->nout > 0 ? eng_dtype_name(c->out[0].dtype) : "none");
    s->device = x->device;
    if (eng_tensor_numel(&c->out[0]) == 0) return ENG_STATUS_OK;
    size_t bbytes = (size_t)(g->count * g->Np * g->K4), csbytes = (size_t)(g->count * g->Np) * sizeof(int32_t);
    s->bconst = (c->const_mask >> g->ib) & 1u;
    s->dy = !g->q && g->Np == g->N;
    size_t off = qz_round_up(qz_lt_ws(x));
    s->off_a = off, off += qz_round_up((size_t)(g->nbatch * g->M * g->K4));
    s->off_rs = off, off += qz_round_up((size_t)(g->nbatch * g->M) * sizeof(int32_t));
    if (!s->bconst) {
        s->off_b = off, off += qz_round_up(bbytes);
        s->off_cs = off, off += qz_round_up(csbytes);
    }
    if (!s->dy) s->off_d = off, off += qz_round_up((size_t)(g->count * g->R * g->Np) * sizeof(int32_t));
    s->ws_total = off;
    void *ws;
    ENG_TRY(cuda_ctx_workspace(x, s->ws_total, &ws));
    char *w = (char *)ws;
    if (s->bconst) {
        ENG_TRY(cuda_mem_alloc(x->device, qz_round_up(bbytes) + csbytes, &s->bpack));
        ENG_TRY(qmm_prep_b(x, g, c->in[g->ib].data, (int8_t *)s->bpack, (int32_t *)((char *)s->bpack + qz_round_up(bbytes))));
    }
    qz_gemm *m = &s->gemm;
    m->R = g->R, m->Np = g->Np, m->K4 = g->K4, m->count = g->count;
    m->sa = g->R * g->K4, m->sb = g->Np * g->K4, m->sd = g->R * g->Np;
    const void *b8 = s->bconst ? s->bpack : w + s->off_b;
    const void *d = s->dy ? c->out[0].data : w + s->off_d;
    return qz_gemm_init(x, m, w + s->off_a, b8, d, "matmul_integer");
}

static eng_status qmm_init(krn_call *c) {
    qmm_state *s = (qmm_state *)calloc(1, sizeof *s);
    if (!s) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "cuda matmul_integer state");
    eng_status st = qmm_init_state(c, s);
    if (st != ENG_STATUS_OK) {
        qmm_free(s);
        return st;
    }
    c->state = s;
    return ENG_STATUS_OK;
}

static eng_status qmm_exec(krn_call *c) {
    const krn_qmatmul_params *p = (const krn_qmatmul_params *)c->params;
    qmm_state *s = (qmm_state *)c->state;
    cuda_ctx *x = CUDA_CTX(c);
    if (!s) return eng_err(ENG_STATUS_INTERNAL, "cuda matmul_integer: exec without init");
    const qmm_geo *g = &s->geo;
    if (eng_tensor_numel(&c->out[0]) == 0) return ENG_STATUS_OK;
    void *ws;
    ENG_TRY(cuda_ctx_workspace(x, s->ws_total, &ws));
    char *w = (char *)ws;
    int8_t *a8 = (int8_t *)(w + s->off_a), *b8;
    int32_t *rs = (int32_t *)(w + s->off_rs), *cs;
    if (s->bconst) {
        b8 = (int8_t *)s->bpack;
        cs = (int32_t *)((char *)s->bpack + qz_round_up((size_t)(g->count * g->Np * g->K4)));
    } else {
        b8 = (int8_t *)(w + s->off_b), cs = (int32_t *)(w + s->off_cs);
        ENG_TRY(qmm_prep_b(x, g, c->in[g->ib].data, b8, cs));
    }
    /* A8 for every output batch (fold: A's batch is the output's), row sums */
    ENG_TRY(qz_rows8_run(x, c->in[0].data, g->K, g->K4, g->M, g->M, g->nbatch, g->abd, g->adt == ENG_DTYPE_U8 ? 0x80u : 0u, 0,
                         a8, rs, "matmul_integer (A)"));
    int32_t *d = s->dy ? (int32_t *)c->out[0].data : (int32_t *)(w + s->off_d);
    ENG_TRY(qz_gemm_run(x, &s->gemm, a8, b8, d, ws, "matmul_integer"));
    qz_epi_args e;
    memset(&e, 0, sizeof e);
    e.mode = g->q ? QZ_OUT_Q8 : g->tf ? QZ_OUT_F32 : QZ_OUT_I32;
    e.s8 = g->ydt == ENG_DTYPE_I8;
    e.R = g->R, e.C = g->N, e.ldd = g->Np, e.count = g->count, e.sd = g->R * g->Np, e.K = g->K;
    const eng_tensor *az = qz_in(c, g->iaz), *bz = qz_in(c, g->ibz);
    e.az = qz_ptr(az), e.azdt = qz_dt(az), e.azper = qz_per(az), e.ashift = g->adt == ENG_DTYPE_U8 ? 128 : 0;
    e.bz = qz_ptr(bz), e.bzdt = qz_dt(bz), e.bzper = qz_per(bz), e.bshift = g->bdt == ENG_DTYPE_U8 ? 128 : 0;
    e.rs = rs, e.cs = cs;
    e.Mrow = g->M;
    if (g->q || g->tf) {
        const eng_tensor *as = &c->in[g->ias], *bs = &c->in[g->ibs];
        e.as = (const float *)as->data, e.asper = qz_per(as);
        e.bs = (const float *)bs->data, e.bsper = qz_per(bs);
    }
    if (g->q) {
        const eng_tensor *yz = qz_in(c, 7);
        e.ys = (const float *)c->in[6].data, e.yz = qz_ptr(yz), e.yzdt = qz_dt(yz);
    }
    if (g->tf) {
        const eng_tensor *bias = qz_in(c, 6);
        e.fbias = bias ? (const float *)bias->data : NULL;
        e.act = p->act.kind, e.act_a = p->act.alpha, e.act_b = p->act.beta;
    }
    e.coff = 0, e.ybs = g->R * g->N, e.yld = g->N;
    return qz_epilogue_run(x, d, c->out[0].data, e, "matmul_integer (epilogue)");
}

static void qmm_describe(const krn_call *c, krn_impl_info *info) {
    const qmm_state *s = (const qmm_state *)c->state;
    memset(info, 0, sizeof *info);
    if (!s) {
        krn_str_copy(info->impl, sizeof info->impl, "cuda int8 gemm (no state)");
        return;
    }
    const qmm_geo *g = &s->geo;
    char gm[128], t[512];
    qz_gemm_describe(&s->gemm, gm, sizeof gm);
    snprintf(t, sizeof t, "%s M=%lld N=%lld K=%lld batch=%lld%s -> %s +rows(A)%s +epilogue(zero points)",
             gm, (long long)g->R, (long long)g->N, (long long)g->K, (long long)g->count, g->fold ? " folded" : "",
             g->q ? "int8 requantized" : g->tf ? "f32" : "int32", s->bconst ? "" : " +transpose(B)");
    krn_str_copy(info->impl, sizeof info->impl, t);
    info->slow = !s->gemm.lt;
    info->reorders = 1 + !s->bconst;
}

static int qmm_supports(const krn_call *c) {
    qmm_geo g;
    return qmm_geo_get(c, &g);
}

/* ======================================================================== conv_integer */

typedef struct qcv_geo {
    int q;
    int iw, ixz, iwz;
    qz_conv_geo cg;
    int nsp;
    int nhwc_y;
    int64_t K4, Mgp;
    eng_dtype xdt, wdt, ydt;
} qcv_geo;

static int qcv_geo_get(const krn_call *c, qcv_geo *g) {
    const krn_qconv_params *p = (const krn_qconv_params *)c->params;
    memset(g, 0, sizeof *g);
    if (!p || c->nout != 1) return 0;
    const krn_conv_params *k = &p->conv;
    g->q = p->qlinear;
    if (g->q ? (c->nin < 8 || c->nin > 9) : (c->nin < 2 || c->nin > 4)) return 0;
    g->iw = g->q ? 3 : 1, g->ixz = 2, g->iwz = g->q ? 5 : 3;
    const eng_tensor *X = &c->in[0], *W = &c->in[g->iw], *Y = &c->out[0];
    int nsp = k->nspatial;
    g->nsp = nsp;
    if (nsp < 1 || nsp > 3 || X->ndim != nsp + 2 || W->ndim != nsp + 2 || Y->ndim != nsp + 2 || k->transposed) return 0;
    if (k->has_residual || k->pool || k->dw_stride || k->act.kind != KRN_NN_ACT_NONE) return 0;
    if (k->x_layout != KRN_NN_LAYOUT_PLAIN && !(k->x_layout == KRN_NN_LAYOUT_NHWC && nsp == 2)) return 0;
    if (k->y_layout != KRN_NN_LAYOUT_PLAIN && !(k->y_layout == KRN_NN_LAYOUT_NHWC && nsp == 2)) return 0;
    if (!qz_8bit(X->dtype) || !qz_8bit(W->dtype)) return 0;
    g->xdt = X->dtype, g->wdt = W->dtype, g->ydt = Y->dtype;
    qz_conv_geo *q = &g->cg;
    q->N = X->dims[0], q->C = X->dims[1], q->M = W->dims[0], q->G = k->group;
    if (q->G < 1 || q->C % q->G || q->M % q->G || W->dims[1] * q->G != q->C || Y->dims[0] != q->N || Y->dims[1] != q->M)
        return 0;
    q->Cg = q->C / q->G, q->Mg = q->M / q->G;
    for (int i = 0; i < 3; i++) {
        int d = i - (3 - nsp);
        q->in[i] = d < 0 ? 1 : X->dims[2 + d];
        q->out[i] = d < 0 ? 1 : Y->dims[2 + d];
        q->k[i] = d < 0 ? 1 : W->dims[2 + d];
        q->s[i] = d < 0 ? 1 : k->strides[d];
        q->d[i] = d < 0 ? 1 : k->dilations[d];
        q->pb[i] = d < 0 ? 0 : k->pads[d];
        if (q->k[i] < 1 || q->s[i] < 1 || q->d[i] < 1) return 0;
    }
    q->ksz = q->k[0] * q->k[1] * q->k[2];
    q->osz = q->out[0] * q->out[1] * q->out[2];
    q->K = q->Cg * q->ksz;
    q->nhwc_x = k->x_layout == KRN_NN_LAYOUT_NHWC;
    g->nhwc_y = k->y_layout == KRN_NN_LAYOUT_NHWC;
    if (q->K < 1) return 0;
    const eng_tensor *xz = qz_in(c, g->ixz), *wz = qz_in(c, g->iwz);
    if (xz && (xz->dtype != X->dtype || eng_tensor_numel(xz) != 1)) return 0;
    if (wz && (wz->dtype != W->dtype || !qz_one_or(wz, q->M))) return 0;
    if (g->q) {
        if (q->K > QZ_KMAX_EXACT || !qz_8bit(Y->dtype)) return 0;
        const eng_tensor *xs = qz_in(c, 1), *ws = qz_in(c, 4), *ys = qz_in(c, 6), *yz = qz_in(c, 7), *b = qz_in(c, 8);
        if (!xs || !ws || !ys || xs->dtype != ENG_DTYPE_F32 || ws->dtype != ENG_DTYPE_F32 || ys->dtype != ENG_DTYPE_F32) return 0;
        if (eng_tensor_numel(xs) != 1 || !qz_one_or(ws, q->M) || eng_tensor_numel(ys) != 1) return 0;
        if (yz && (yz->dtype != Y->dtype || eng_tensor_numel(yz) != 1)) return 0;
        if (b && (b->dtype != ENG_DTYPE_I32 || eng_tensor_numel(b) != q->M)) return 0;
    } else if (Y->dtype != ENG_DTYPE_I32) {
        return 0;
    }
    g->K4 = (q->K + 3) / 4 * 4;
    g->Mgp = (q->Mg + 3) / 4 * 4;
    return 1;
}

typedef struct qcv_state {
    qcv_geo geo;
    qz_gemm gemm;
    int device;
    int wconst;
    void *wpack;                /* constant W: Wt8 (G, Mgp, K4) then its row sums (G, Mgp) */
    int64_t nc;                 /* images per chunk (divides N) */
    size_t off_a, off_rs, off_w, off_cs, off_d, ws_total;
} qcv_state;

static void qcv_free(void *v) {
    qcv_state *s = (qcv_state *)v;
    if (!s) return;
    qz_gemm_destroy(&s->gemm);
    if (s->wpack) cuda_mem_free(s->device, s->wpack);
    free(s);
}

static eng_status qcv_prep_w(cuda_ctx *x, const qcv_geo *g, const void *W, int8_t *w8, int32_t *cs) {
    qz_bdims none;
    memset(&none, 0, sizeof none);
    const qz_conv_geo *q = &g->cg;
    return qz_rows8_run(x, W, q->K, g->K4, q->Mg, g->Mgp, q->G, none, g->wdt == ENG_DTYPE_U8 ? 0x80u : 0u,
                        q->nhwc_x ? q->Cg : 0, w8, cs, "conv_integer (W)");
}

static eng_status qcv_init_state(krn_call *c, qcv_state *s) {
    cuda_ctx *x = CUDA_CTX(c);
    qcv_geo *g = &s->geo;
    if (!x) return eng_err(ENG_STATUS_INTERNAL, "cuda conv_integer: no CUDA context at init");
    if (!qcv_geo_get(c, g))
        return eng_err(ENG_STATUS_UNSUPPORTED, "cuda conv_integer: call not supported (x %s, %d inputs -> %s)",
                       c->nin > 0 ? eng_dtype_name(c->in[0].dtype) : "none", c->nin,
                       c->nout > 0 ? eng_dtype_name(c->out[0].dtype) : "none");
    s->device = x->device;
    const qz_conv_geo *q = &g->cg;
    if (eng_tensor_numel(&c->out[0]) == 0) return ENG_STATUS_OK;
    size_t wbytes = (size_t)(q->G * g->Mgp * g->K4), csbytes = (size_t)(q->G * g->Mgp) * sizeof(int32_t);
    s->wconst = (c->const_mask >> g->iw) & 1u;
    /* images per chunk: the largest divisor of N whose im2col, row sums and D fit the cap (at least 1) */
    size_t per = (size_t)(q->G * q->osz) * ((size_t)g->K4 + 4 + (size_t)g->Mgp * 4);
    s->nc = 1;
    for (int64_t d = q->N; d >= 1; d--)
        if (q->N % d == 0 && (size_t)d * per <= QZ_CONV_WS_CAP) {
            s->nc = d;
            break;
        }
    int64_t R = s->nc * q->osz;
    size_t off = qz_round_up(qz_lt_ws(x));
    s->off_a = off, off += qz_round_up((size_t)(q->G * R * g->K4));
    s->off_rs = off, off += qz_round_up((size_t)(q->G * R) * sizeof(int32_t));
    if (!s->wconst) {
        s->off_w = off, off += qz_round_up(wbytes);
        s->off_cs = off, off += qz_round_up(csbytes);
    }
    s->off_d = off, off += qz_round_up((size_t)(q->G * R * g->Mgp) * sizeof(int32_t));
    s->ws_total = off;
    void *ws;
    ENG_TRY(cuda_ctx_workspace(x, s->ws_total, &ws));
    char *w = (char *)ws;
    if (s->wconst) {
        ENG_TRY(cuda_mem_alloc(x->device, qz_round_up(wbytes) + csbytes, &s->wpack));
        ENG_TRY(qcv_prep_w(x, g, c->in[g->iw].data, (int8_t *)s->wpack, (int32_t *)((char *)s->wpack + qz_round_up(wbytes))));
    }
    qz_gemm *m = &s->gemm;
    m->R = R, m->Np = g->Mgp, m->K4 = g->K4, m->count = q->G;
    m->sa = R * g->K4, m->sb = g->Mgp * g->K4, m->sd = R * g->Mgp;
    return qz_gemm_init(x, m, w + s->off_a, s->wconst ? s->wpack : w + s->off_w, w + s->off_d, "conv_integer");
}

static eng_status qcv_init(krn_call *c) {
    qcv_state *s = (qcv_state *)calloc(1, sizeof *s);
    if (!s) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "cuda conv_integer state");
    eng_status st = qcv_init_state(c, s);
    if (st != ENG_STATUS_OK) {
        qcv_free(s);
        return st;
    }
    c->state = s;
    return ENG_STATUS_OK;
}

static eng_status qcv_exec(krn_call *c) {
    qcv_state *s = (qcv_state *)c->state;
    cuda_ctx *x = CUDA_CTX(c);
    if (!s) return eng_err(ENG_STATUS_INTERNAL, "cuda conv_integer: exec without init");
    const qcv_geo *g = &s->geo;
    const qz_conv_geo *q = &g->cg;
    if (eng_tensor_numel(&c->out[0]) == 0) return ENG_STATUS_OK;
    void *ws;
    ENG_TRY(cuda_ctx_workspace(x, s->ws_total, &ws));
    char *w = (char *)ws;
    int8_t *a8 = (int8_t *)(w + s->off_a), *w8;
    int32_t *rs = (int32_t *)(w + s->off_rs), *cs, *d = (int32_t *)(w + s->off_d);
    if (s->wconst) {
        w8 = (int8_t *)s->wpack;
        cs = (int32_t *)((char *)s->wpack + qz_round_up((size_t)(q->G * g->Mgp * g->K4)));
    } else {
        w8 = (int8_t *)(w + s->off_w), cs = (int32_t *)(w + s->off_cs);
        ENG_TRY(qcv_prep_w(x, g, c->in[g->iw].data, w8, cs));
    }
    const eng_tensor *xz = qz_in(c, g->ixz), *wz = qz_in(c, g->iwz);
    uint32_t xflip = g->xdt == ENG_DTYPE_U8 ? 0x80u : 0u;
    qz_epi_args e;
    memset(&e, 0, sizeof e);
    e.mode = g->q ? QZ_OUT_Q8 : QZ_OUT_I32;
    e.s8 = g->ydt == ENG_DTYPE_I8;
    e.R = s->nc * q->osz, e.C = q->Mg, e.ldd = g->Mgp, e.count = q->G, e.sd = e.R * g->Mgp, e.K = q->K;
    e.az = qz_ptr(xz), e.azdt = qz_dt(xz), e.azper = 0, e.ashift = g->xdt == ENG_DTYPE_U8 ? 128 : 0;
    e.bz = qz_ptr(wz), e.bzdt = qz_dt(wz), e.bzper = qz_per(wz), e.bshift = g->wdt == ENG_DTYPE_U8 ? 128 : 0;
    e.rs = rs, e.cs = cs, e.Mrow = 1;
    if (g->q) {
        const eng_tensor *yz = qz_in(c, 7), *b = qz_in(c, 8);
        e.as = (const float *)c->in[1].data, e.bs = (const float *)c->in[4].data, e.bsper = qz_per(&c->in[4]);
        e.ys = (const float *)c->in[6].data, e.yz = qz_ptr(yz), e.yzdt = qz_dt(yz);
        e.ibias = b ? (const int32_t *)b->data : NULL;
    }
    e.coff = q->Mg;
    if (g->nhwc_y) e.ybs = 0, e.yld = q->M;
    else e.trans = 1, e.ohw = q->osz, e.ych = q->M;
    size_t yes = g->q ? 1 : 4;
    int64_t xper = q->C * q->in[0] * q->in[1] * q->in[2], yper = q->M * q->osz, rows = q->G * e.R;
    for (int64_t n0 = 0; n0 < q->N; n0 += s->nc) {
        const uint8_t *xp = (const uint8_t *)c->in[0].data + n0 * xper;
        qz_im2col<<<cuda_grid(rows * 32, QZ_THREADS), QZ_THREADS, 0, x->stream>>>(xp, e.az, e.azdt, *q, s->nc, g->K4, xflip, a8, rs);
        CUDA_LAUNCHED("conv_integer (im2col)");
        ENG_TRY(qz_gemm_run(x, &s->gemm, a8, w8, d, ws, "conv_integer"));
        ENG_TRY(qz_epilogue_run(x, d, (char *)c->out[0].data + (size_t)(n0 * yper) * yes, e, "conv_integer (epilogue)"));
    }
    return ENG_STATUS_OK;
}

static void qcv_describe(const krn_call *c, krn_impl_info *info) {
    const qcv_state *s = (const qcv_state *)c->state;
    memset(info, 0, sizeof *info);
    if (!s) {
        krn_str_copy(info->impl, sizeof info->impl, "cuda int8 im2col + gemm (no state)");
        return;
    }
    const qcv_geo *g = &s->geo;
    char gm[128], t[512];
    qz_gemm_describe(&s->gemm, gm, sizeof gm);
    snprintf(t, sizeof t, "im2col%s + %s groups=%lld K=%lld images/chunk=%lld -> %s %s%s",
             g->cg.nhwc_x ? "(nhwc)" : "", gm, (long long)g->cg.G, (long long)g->cg.K, (long long)s->nc,
             g->q ? "int8 requantized" : "int32", g->nhwc_y ? "nhwc" : "nchw", s->wconst ? "" : " +prep(W)");
    krn_str_copy(info->impl, sizeof info->impl, t);
    info->slow = !s->gemm.lt;
    info->reorders = 1 + !s->wconst;
}

static int qcv_supports(const krn_call *c) {
    qcv_geo g;
    return qcv_geo_get(c, &g);
}

/* ======================================================================== table */

extern "C" const krn_kernel krn_cuda_quant_kernels[] = {
    {.name = "quantize_linear", .init = NULL, .exec = qdq_exec_q, .free_state = NULL, .describe = NULL,
     .compute_ok = NULL, .io_ok = NULL, .supports = qdq_supports_q, .check = NULL},
    {.name = "dequantize_linear", .init = NULL, .exec = qdq_exec_dq, .free_state = NULL, .describe = NULL,
     .compute_ok = NULL, .io_ok = NULL, .supports = qdq_supports_dq, .check = NULL},
    {.name = "dynamic_quantize_linear", .init = NULL, .exec = dyn_exec, .free_state = NULL, .describe = NULL,
     .compute_ok = NULL, .io_ok = NULL, .supports = dyn_supports, .check = NULL},
    {.name = "matmul_integer", .init = qmm_init, .exec = qmm_exec, .free_state = qmm_free, .describe = qmm_describe,
     .compute_ok = NULL, .io_ok = NULL, .supports = qmm_supports, .check = NULL},
    {.name = "conv_integer", .init = qcv_init, .exec = qcv_exec, .free_state = qcv_free, .describe = qcv_describe,
     .compute_ok = NULL, .io_ok = NULL, .supports = qcv_supports, .check = NULL},
    {.name = "qlinear_binary", .init = bin_init, .exec = bin_exec, .free_state = NULL, .describe = bin_describe,
     .compute_ok = NULL, .io_ok = NULL, .supports = bin_supports, .check = NULL},
    {NULL},
};
