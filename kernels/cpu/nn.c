/* nn.c - the CPU nn kernel table and the matmul kernel behind MatMul, Gemm, FusedMatMul and FusedGemm.
 *
 * Y = act(alpha * op(A) op(B) + beta * C), MatMul batch dims broadcast numpy-style.
 * float32 paths, chosen once in init:
 *   - oneDNN matmul (default): constant B is reordered once into oneDNN's preferred layout with alpha folded in;
 *     a constant C is pre-scaled by beta and passed as bias (any shape broadcastable to Y); the activation is a
 *     post-op. Batch dims of B that are all 1 are collapsed into M so one 2-D primitive runs.
 *   - small-M / narrow-N GEMV (M <= 4 or N <= 32, constant B): hand-written AVX-512 loop over B pre-packed in 16-column panels; for
 *     batch-1 MLPs it beats both oneDNN and OpenBLAS because per-call overhead dominates.
 *   - OpenBLAS sgemm per batch element for what oneDNN refuses.
 * Other dtypes (f64, i32, i64, u32, u64) run a reference triple loop.
 */
#include <cblas.h>
#include <dnnl.h>
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernel.h"
#include "../krn-nn.h"

extern eng_status krn_cpu_conv_init(krn_call *c);
extern eng_status krn_cpu_conv_exec(krn_call *c);
extern void krn_cpu_conv_free(void *s);
extern void krn_cpu_conv_describe(const krn_call *c, krn_impl_info *info);
extern int krn_cpu_conv_compute_ok(const krn_call *c, eng_dtype dt);
extern eng_status krn_cpu_deconv_init(krn_call *c);
extern eng_status krn_cpu_deconv_exec(krn_call *c);
extern void krn_cpu_deconv_free(void *s);
extern void krn_cpu_deconv_describe(const krn_call *c, krn_impl_info *info);
extern eng_status krn_cpu_pool_exec(krn_call *c);
extern eng_status krn_cpu_pool_init(krn_call *c);
extern void krn_cpu_pool_free(void *s);
extern void krn_cpu_pool_describe(const krn_call *c, krn_impl_info *info);
extern int krn_cpu_pool_io_ok(const krn_call *c, eng_dtype dt);

enum { MM_REF = 0, MM_DNNL, MM_BLAS, MM_GEMV };

typedef struct mm_state {
    int mode;
    int64_t M, K, N, batch; /* for GEMV / collapsed 2-D */
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t prim;
    dnnl_memory_t msrc, mwei, mbias, mdst, mscratch;
    void *wpack;          /* packed constant weights (oneDNN layout or GEMV panels), owned */
    /* compute bf16: A (and a B that changes between runs) converted from float32 on every exec */
    krn_dnnl_reorder ra, rb;
    void *ta, *tb;
    float *bias;          /* beta * C when C is constant (owned), else NULL (C read at exec) */
    int bias_arg;         /* bias memory is bound */
} mm_state;

static void mm_free(void *p) {
    mm_state *s = p;
    if (!s) return;
    if (s->prim) dnnl_primitive_destroy(s->prim);
    if (s->pd) dnnl_primitive_desc_destroy(s->pd);
    if (s->msrc) dnnl_memory_destroy(s->msrc);
    if (s->mwei) dnnl_memory_destroy(s->mwei);
    if (s->mbias) dnnl_memory_destroy(s->mbias);
    if (s->mdst) dnnl_memory_destroy(s->mdst);
    if (s->mscratch) dnnl_memory_destroy(s->mscratch);
    eng_free(s->wpack);
    eng_free(s->bias);
    krn_dnnl_reorder_free(&s->ra);
    krn_dnnl_reorder_free(&s->rb);
    eng_free(s->ta);
    eng_free(s->tb);
    free(s);
}

/* Shapes padded to the output rank (>= 2): A -> (..., M, K), B -> (..., K, N), Y -> (..., M, N). */
typedef struct mm_shapes {
    int r;
    int64_t a[ENG_MAX_DIMS], b[ENG_MAX_DIMS], y[ENG_MAX_DIMS];
    int64_t M, K, N;
} mm_shapes;

static void mm_shapes_get(const krn_call *c, mm_shapes *s) {
    const krn_matmul_params *p = c->params;
    const eng_tensor *A = &c->in[0], *B = &c->in[1];
    if (p->gemm) {
        s->r = 2;
        s->M = p->trans_a ? A->dims[1] : A->dims[0];
        s->K = p->trans_a ? A->dims[0] : A->dims[1];
        s->N = p->trans_b ? B->dims[0] : B->dims[1];
        s->a[0] = s->M, s->a[1] = s->K, s->b[0] = s->K, s->b[1] = s->N, s->y[0] = s->M, s->y[1] = s->N;
        return;
    }
    int ra = A->ndim < 2 ? 2 : A->ndim, rb = B->ndim < 2 ? 2 : B->ndim;
    int r = ra > rb ? ra : rb;
    s->r = r;
    for (int i = 0; i < r; i++) s->a[i] = s->b[i] = 1;
    if (A->ndim == 1) s->a[r - 1] = A->dims[0];
    else memcpy(s->a + r - A->ndim, A->dims, (size_t)A->ndim * sizeof(int64_t));
    if (B->ndim == 1) s->b[r - 2] = B->dims[0];
    else memcpy(s->b + r - B->ndim, B->dims, (size_t)B->ndim * sizeof(int64_t));
    for (int i = 0; i < r - 2; i++) s->y[i] = s->a[i] > s->b[i] ? s->a[i] : s->b[i];
    s->M = s->a[r - 2], s->K = s->a[r - 1], s->N = s->b[r - 1];
    s->y[r - 2] = s->M, s->y[r - 1] = s->N;
}

/* Offsets (in elements) of batch element `bi` of Y into A and B, with broadcasting. */
static void mm_batch_offsets(const mm_shapes *s, int64_t bi, int64_t *oa, int64_t *ob) {
    int64_t sa = s->M * s->K, sb = s->K * s->N, ra = 0, rb = 0;
    for (int d = s->r - 3; d >= 0; d--) {
        int64_t i = bi % s->y[d];
        bi /= s->y[d];
        if (s->a[d] != 1) ra += i * sa;
        if (s->b[d] != 1) rb += i * sb;
        sa *= s->a[d];
        sb *= s->b[d];
    }
    *oa = ra, *ob = rb;
}

/* Broadcast C (any shape unidirectionally broadcastable to (M, N) / Y) into y, scaled by beta. */
static void mm_fill_c_f32(float *y, const eng_tensor *C, const int64_t *ydims, int r, float beta) {
    int64_t cd[ENG_MAX_DIMS], st[ENG_MAX_DIMS], n = 1, acc = 1;
    for (int i = 0; i < r; i++) cd[i] = 1;
    memcpy(cd + r - C->ndim, C->dims, (size_t)C->ndim * sizeof(int64_t));
    for (int i = r - 1; i >= 0; i--) {
        st[i] = cd[i] == 1 ? 0 : acc;
        acc *= cd[i];
        n *= ydims[i];
    }
    const float *cp = C->data;
    for (int64_t i = 0; i < n; i++) {
        int64_t rem = i, off = 0;
        for (int d = r - 1; d >= 0; d--) {
            off += (rem % ydims[d]) * st[d];
            rem /= ydims[d];
        }
        y[i] = beta * cp[off];
    }
}

/* ---- GEMV for tiny M: B packed as ceil(N/16) panels of (K, 16) ---- */

#define MM_GEMV_MAX_M 4

static eng_status mm_gemv_pack(mm_state *s, const float *B, int trans_b, float alpha) {
    int64_t K = s->K, N = s->N, np = (N + 15) / 16;
    float *w = eng_alloc((size_t)(np * K * 16) * sizeof(float));
    if (!w) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "matmul: packing B (%lld x %lld)", (long long)K, (long long)N);
    for (int64_t p = 0; p < np; p++)
        for (int64_t k = 0; k < K; k++)
            for (int64_t j = 0; j < 16; j++) {
                int64_t n = p * 16 + j;
                float v = n < N ? (trans_b ? B[n * K + k] : B[k * N + n]) : 0.f;
                w[(p * K + k) * 16 + j] = alpha * v;
            }
    s->wpack = w;
    return ENG_STATUS_OK;
}

/* Rows are taken MM_GEMV_MR at a time so that one load of a packed B vector feeds MR independent FMA chains
 * (one per row): B streams from cache once per row block instead of once per row. */
#define MM_GEMV_MR 8

#ifdef __AVX512F__
#define MM_GEMV_ISA "avx512"
static void mm_gemv_run(const mm_state *s, const float *A, float *Y, const float *bias, const krn_nn_act_params *act,
                        int nthreads) {
    const int64_t M = s->M, K = s->K, N = s->N, np = (N + 15) / 16, mb = (M + MM_GEMV_MR - 1) / MM_GEMV_MR;
    const float *W = s->wpack;
    int relu = act->kind == KRN_NN_ACT_RELU && act->alpha == 0.f;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (np * M * K > 8192)
    for (int64_t pm = 0; pm < np * mb; pm++) {
        int64_t p = pm / mb, m0 = (pm % mb) * MM_GEMV_MR;
        int64_t rows = M - m0 < MM_GEMV_MR ? M - m0 : MM_GEMV_MR;
        const float *wp = W + p * K * 16;
        int64_t n0 = p * 16, cnt = N - n0 < 16 ? N - n0 : 16;
        __mmask16 mk = (__mmask16)((1u << cnt) - 1);
        const float *a = A + m0 * K;
        __m512 acc[MM_GEMV_MR];
        for (int r = 0; r < MM_GEMV_MR; r++) acc[r] = _mm512_setzero_ps();
        if (rows == MM_GEMV_MR) {
            for (int64_t k = 0; k < K; k++) {
                __m512 w = _mm512_load_ps(wp + k * 16);
                for (int r = 0; r < MM_GEMV_MR; r++) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(a[r * K + k]), w, acc[r]);
            }
        } else { /* a partial block (and M = 1..7): one row at a time, four FMA chains over k */
            for (int64_t r = 0; r < rows; r++) {
                const float *ar = a + r * K;
                __m512 c0 = _mm512_setzero_ps(), c1 = _mm512_setzero_ps(), c2 = _mm512_setzero_ps(),
                       c3 = _mm512_setzero_ps();
                int64_t k = 0;
                for (; k + 4 <= K; k += 4) {
                    c0 = _mm512_fmadd_ps(_mm512_set1_ps(ar[k]), _mm512_load_ps(wp + k * 16), c0);
                    c1 = _mm512_fmadd_ps(_mm512_set1_ps(ar[k + 1]), _mm512_load_ps(wp + (k + 1) * 16), c1);
                    c2 = _mm512_fmadd_ps(_mm512_set1_ps(ar[k + 2]), _mm512_load_ps(wp + (k + 2) * 16), c2);
                    c3 = _mm512_fmadd_ps(_mm512_set1_ps(ar[k + 3]), _mm512_load_ps(wp + (k + 3) * 16), c3);
                }
                for (; k < K; k++) c0 = _mm512_fmadd_ps(_mm512_set1_ps(ar[k]), _mm512_load_ps(wp + k * 16), c0);
                acc[r] = _mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3));
            }
        }
        __m512 bv = bias ? _mm512_maskz_loadu_ps(mk, bias + n0) : _mm512_setzero_ps();
        for (int r = 0; r < rows; r++) {
            __m512 v = _mm512_add_ps(acc[r], bv);
            if (relu) v = _mm512_max_ps(v, _mm512_setzero_ps());
            _mm512_mask_storeu_ps(Y + (m0 + r) * N + n0, mk, v);
        }
    }
    if (act->kind != KRN_NN_ACT_NONE && !relu) krn_nn_act_apply_f32(Y, M * N, act, 1);
}
#else
/* Built without AVX-512 (a portable build: ARCH=x86-64-v3, the Docker image): the same panels, one row at a
 * time, 16 lanes as a plain loop the compiler vectorises for the target. */
#define MM_GEMV_ISA "portable"
static void mm_gemv_run(const mm_state *s, const float *A, float *Y, const float *bias, const krn_nn_act_params *act,
                        int nthreads) {
    const int64_t M = s->M, K = s->K, N = s->N, np = (N + 15) / 16;
    const float *W = s->wpack;
    int relu = act->kind == KRN_NN_ACT_RELU && act->alpha == 0.f;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (np * M * K > 8192)
    for (int64_t pm = 0; pm < np * M; pm++) {
        int64_t p = pm / M, m = pm % M, n0 = p * 16, cnt = N - n0 < 16 ? N - n0 : 16;
        const float *wp = W + p * K * 16, *a = A + m * K;
        float acc[16] = {0};
        for (int64_t k = 0; k < K; k++)
            for (int j = 0; j < 16; j++) acc[j] += a[k] * wp[k * 16 + j];
        for (int64_t j = 0; j < cnt; j++) {
            float v = acc[j] + (bias ? bias[n0 + j] : 0.f);
            Y[m * N + n0 + j] = relu && !(v > 0.f) ? 0.f : v;
        }
    }
    if (act->kind != KRN_NN_ACT_NONE && !relu) krn_nn_act_apply_f32(Y, M * N, act, 1);
}
#endif

/* ---- oneDNN path ---- */

static eng_status mm_dnnl_build(krn_call *c, mm_state *s, const mm_shapes *sh) {
    const krn_matmul_params *p = c->params;
    const eng_tensor *C = p->has_bias && c->in[2].dtype != ENG_DTYPE_UNDEFINED ? &c->in[2] : NULL;
    int bconst = (c->const_mask >> 1) & 1, cconst = C && ((c->const_mask >> 2) & 1);
    if (!bconst && p->alpha != 1.f) return ENG_STATUS_UNSUPPORTED;
    if (C && !cconst && p->beta != 1.f) return ENG_STATUS_UNSUPPORTED;
    int r = sh->r;
    int collapse = 1;
    for (int i = 0; i < r - 2; i++)
        if (sh->b[i] != 1) collapse = 0;
    if (p->gemm) collapse = 0;
    dnnl_dims_t ad = {0}, bd = {0}, yd = {0}, cd = {0};
    if (r > DNNL_MAX_NDIMS) return ENG_STATUS_UNSUPPORTED;
    int nd;
    if (collapse) {
        int64_t mt = sh->M;
        for (int i = 0; i < r - 2; i++) mt *= sh->a[i];
        nd = 2;
        ad[0] = mt, ad[1] = sh->K, bd[0] = sh->K, bd[1] = sh->N, yd[0] = mt, yd[1] = sh->N;
    } else {
        nd = r;
        for (int i = 0; i < r; i++) ad[i] = sh->a[i], bd[i] = sh->b[i], yd[i] = sh->y[i];
    }
    if (nd > 6) return ENG_STATUS_UNSUPPORTED;
    s->M = yd[nd - 2], s->K = sh->K, s->N = sh->N;
    dnnl_memory_desc_t amd, bmd, ymd, bplain, cmd;
    dnnl_dims_t ast, bst;
    /* row-major strides; Gemm transposes are expressed as swapped strides */
    ast[nd - 1] = 1, bst[nd - 1] = 1;
    for (int i = nd - 2; i >= 0; i--) ast[i] = ast[i + 1] * ad[i + 1], bst[i] = bst[i + 1] * bd[i + 1];
    if (p->gemm && p->trans_a) ast[0] = 1, ast[1] = sh->M;
    if (p->gemm && p->trans_b) bst[0] = 1, bst[1] = sh->K;
    /* the plan's dtypes (f32; bf16 activations in a bf16 plan) and the one the primitive multiplies in */
    dnnl_data_type_t adt = krn_dnnl_dt(c->in[0].dtype), bdt = krn_dnnl_dt(c->in[1].dtype), ydt = krn_dnnl_dt(c->out[0].dtype);
    dnnl_data_type_t cdt = c->compute ? krn_dnnl_dt(c->compute) : dnnl_f32;
    if (adt == dnnl_data_type_undef || bdt == dnnl_data_type_undef || ydt == dnnl_data_type_undef) return ENG_STATUS_UNSUPPORTED;
    dnnl_memory_desc_t aplain, bop;
    KRN_DNNL_CHECK(dnnl_memory_desc_init_by_strides(&aplain, nd, ad, adt, ast));
    KRN_DNNL_CHECK(dnnl_memory_desc_init_by_strides(&amd, nd, ad, cdt, ast));
    KRN_DNNL_CHECK(dnnl_memory_desc_init_by_strides(&bplain, nd, bd, bdt, bst));
    KRN_DNNL_CHECK(dnnl_memory_desc_init_by_strides(&bop, nd, bd, cdt, bst));
    if (bconst) KRN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&bmd, nd, bd, cdt, dnnl_format_tag_any));
    else bmd = bop;
    dnnl_format_tag_t tags[7] = {dnnl_format_tag_undef, dnnl_a, dnnl_ab, dnnl_abc, dnnl_abcd, dnnl_abcde, dnnl_abcdef};
    KRN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&ymd, nd, yd, ydt, tags[nd]));
    const dnnl_memory_desc_t *cmdp = NULL;
    if (C) {
        for (int i = 0; i < nd; i++) cd[i] = 1;
        if (collapse) {
            for (int i = 0; i < C->ndim - 1; i++)
                if (C->dims[i] != 1) return ENG_STATUS_UNSUPPORTED;
            cd[1] = C->ndim ? C->dims[C->ndim - 1] : 1;
        } else {
            if (C->ndim > nd) return ENG_STATUS_UNSUPPORTED;
            for (int i = 0; i < C->ndim; i++) cd[nd - C->ndim + i] = C->dims[i];
        }
        KRN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&cmd, nd, cd, dnnl_f32, tags[nd]));
        cmdp = &cmd;
    }
    dnnl_matmul_desc_t md;
    KRN_DNNL_CHECK(dnnl_matmul_desc_init(&md, &amd, &bmd, cmdp, &ymd));
    ENG_TRY(krn_dnnl_prim(&md, NULL, &p->act, &s->pd, &s->prim, &s->mscratch));
    dnnl_engine_t eng;
    ENG_TRY(krn_dnnl_engine(&eng));
    const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(s->pd, dnnl_query_weights_md, 0);
    if (bconst) {
        const float *B = c->in[1].data;
        float *tmp = NULL;
        if (p->alpha != 1.f) {
            int64_t n = eng_tensor_numel(&c->in[1]);
            tmp = eng_alloc((size_t)n * sizeof(float));
            if (!tmp) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "matmul: scaling B");
            for (int64_t i = 0; i < n; i++) tmp[i] = p->alpha * B[i];
            B = tmp;
        }
        eng_status st = krn_dnnl_reorder_new(&bplain, B, wmd, &s->wpack);
        eng_free(tmp);
        ENG_TRY(st);
        KRN_DNNL_CHECK(dnnl_memory_create(&s->mwei, wmd, eng, s->wpack));
    } else {
        KRN_DNNL_CHECK(dnnl_memory_create(&s->mwei, wmd, eng, DNNL_MEMORY_NONE));
        ENG_TRY(krn_dnnl_io_reorder(&bplain, wmd, 1, &s->rb, &s->tb));
    }
    ENG_TRY(krn_dnnl_io_reorder(&aplain, &amd, 1, &s->ra, &s->ta));
    KRN_DNNL_CHECK(dnnl_memory_create(&s->msrc, &amd, eng, DNNL_MEMORY_NONE));
    KRN_DNNL_CHECK(dnnl_memory_create(&s->mdst, &ymd, eng, DNNL_MEMORY_NONE));
    if (C) {
        void *h = DNNL_MEMORY_NONE;
        if (cconst && p->beta != 1.f) {
            int64_t n = eng_tensor_numel(C);
            s->bias = eng_alloc((size_t)n * sizeof(float));
            if (!s->bias) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "matmul: scaling C");
            for (int64_t i = 0; i < n; i++) s->bias[i] = p->beta * ((const float *)C->data)[i];
            h = s->bias;
        }
        KRN_DNNL_CHECK(dnnl_memory_create(&s->mbias, &cmd, eng, h));
        s->bias_arg = 1;
    }
    s->mode = MM_DNNL;
    return ENG_STATUS_OK;
}

/* The tiny-M / narrow-N case the GEMV panels serve (faster than oneDNN there). */
static int mm_gemv_fits(const krn_call *c, const mm_shapes *sh) {
    const krn_matmul_params *p = c->params;
    int64_t mt = eng_tensor_numel(&c->out[0]) / (sh->N ? sh->N : 1);
    int bconst = (c->const_mask >> 1) & 1;
    int brank2 = p->gemm || c->in[1].ndim <= 2;
    const eng_tensor *C = p->has_bias && c->in[2].dtype != ENG_DTYPE_UNDEFINED ? &c->in[2] : NULL;
    int c_rowvec = !C || (C->ndim >= 1 && C->dims[C->ndim - 1] == sh->N && eng_tensor_numel(C) == sh->N);
    if (C && C->ndim > 1 && !p->gemm) c_rowvec = c_rowvec && C->ndim <= c->out[0].ndim;
    return bconst && brank2 && !(p->gemm && p->trans_a) && (mt <= MM_GEMV_MAX_M || (sh->N <= 32 && mt <= 4096)) &&
           sh->K > 0 && sh->N > 0 && c_rowvec && (!C || p->beta == 1.f || ((c->const_mask >> 2) & 1)) &&
           getenv("TENSORD_MM_NO_GEMV") == NULL;
}

/* compute_ok: bf16 on oneDNN's bf16 matmul, float32 or bf16 A / B / Y, float32 bias; not where the float32
 * GEMV panels are faster (batch-1 heads) nor where oneDNN takes no matmul (rank > 6, alpha on a variable B). */
static int mm_compute_ok(const krn_call *c, eng_dtype dt) {
    const krn_matmul_params *p = c->params;
    if (dt != ENG_DTYPE_BF16 || !p || c->nin < 2 || !krn_lowp_io(c->in[0].dtype) || !krn_lowp_io(c->in[1].dtype) ||
        !krn_lowp_io(c->out[0].dtype) || c->out[0].ndim > 6 || c->out[0].ndim < 2)
        return 0;
    const eng_tensor *C = p->has_bias && c->nin > 2 && c->in[2].dtype != ENG_DTYPE_UNDEFINED ? &c->in[2] : NULL;
    /* oneDNN 2.6 has only its reference kernel for a full [M, N] or scalar bias: a per-column bias only */
    if (C && (C->dtype != ENG_DTYPE_F32 || C->ndim > c->out[0].ndim || C->ndim < 1 ||
              C->dims[C->ndim - 1] != c->out[0].dims[c->out[0].ndim - 1] || eng_tensor_numel(C) != C->dims[C->ndim - 1] ||
              C->dims[C->ndim - 1] < 2))
        return 0;
    if (!((c->const_mask >> 1) & 1) && p->alpha != 1.f) return 0;
    if (C && !((c->const_mask >> 2) & 1) && p->beta != 1.f) return 0;
    mm_shapes sh;
    mm_shapes_get(c, &sh);
    if (sh.M <= 0 || sh.N <= 0 || sh.K <= 0) return 0;
    /* a B that changes every run is converted every run: batched products of two activations (attention's
     * Q K^T and P V) do not pay below 128 on a side (BERT-base's 64-wide heads ran 4x slower in bf16), and a
     * fed weight (training) does not below 2^20 multiply-adds. TENSORD_LOWP_ALL=1 (tests/test_ops.c) takes
     * every shape the bf16 kernel computes correctly, paying or not, so that small cases check it too. */
    static int all = -1;
    if (all < 0) all = getenv("TENSORD_LOWP_ALL") != NULL;
    if (all) return 1;
    if (!((c->const_mask >> 1) & 1) && c->in[1].dtype == ENG_DTYPE_F32) {
        int batched = 0;
        for (int i = 0; i < sh.r - 2; i++) batched |= sh.b[i] != 1;
        if (batched ? sh.M < 128 || sh.N < 128 || sh.K < 128 : (double)sh.M * sh.N * sh.K < 1048576.0) return 0;
    }
    return !mm_gemv_fits(c, &sh);
}

static eng_status mm_init(krn_call *c) {
    const krn_matmul_params *p = c->params;
    if (c->compute && !mm_compute_ok(c, c->compute))
        return eng_err(ENG_STATUS_INTERNAL, "matmul cannot compute in %s here", eng_dtype_name(c->compute));
    if (c->in[0].dtype != ENG_DTYPE_F32 && !c->compute) return ENG_STATUS_OK; /* reference path, no state */
    mm_state *s = calloc(1, sizeof *s);
    if (!s) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "matmul state");
    c->state = s;
    krn_dnnl_set_threads(c->nthreads);
    mm_shapes sh;
    mm_shapes_get(c, &sh);
    int64_t mt = eng_tensor_numel(&c->out[0]) / (sh.N ? sh.N : 1);
    const eng_tensor *C = p->has_bias && c->in[2].dtype != ENG_DTYPE_UNDEFINED ? &c->in[2] : NULL;
    /* Tiny M or narrow N (classifier heads) with constant B: GEMV panels; oneDNN's brgemm is slow for N < 16. */
    if (!c->compute && mm_gemv_fits(c, &sh)) {
        s->M = mt, s->K = sh.K, s->N = sh.N;
        ENG_TRY(mm_gemv_pack(s, c->in[1].data, p->gemm && p->trans_b, p->alpha));
        if (C && p->beta != 1.f) {
            s->bias = eng_alloc((size_t)sh.N * sizeof(float));
            if (!s->bias) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "matmul: scaling C");
            for (int64_t i = 0; i < sh.N; i++) s->bias[i] = p->beta * ((const float *)C->data)[i];
        }
        s->mode = MM_GEMV;
        return ENG_STATUS_OK;
    }
    if (sh.M > 0 && sh.N > 0 && sh.K > 0 && eng_tensor_numel(&c->out[0]) > 0) {
        eng_status st = mm_dnnl_build(c, s, &sh);
        /* oneDNN's reference matmul is never kept: OpenBLAS's sgemm is the faster fallback */
        if (st == ENG_STATUS_OK && (!krn_dnnl_is_ref(s->pd) || getenv("TENSORD_MM_KEEP_REF"))) return st;
        if (st == ENG_STATUS_OUT_OF_MEMORY) return st;
        if (c->compute) /* no OpenBLAS / reference path in bf16: refuse rather than run slowly */
            return st != ENG_STATUS_OK ? eng_err_prefix(st, "oneDNN has no %s matmul for these shapes: ", eng_dtype_name(c->compute))
                                       : eng_err(ENG_STATUS_UNSUPPORTED, "oneDNN has only a reference %s matmul for these shapes", eng_dtype_name(c->compute));
        eng_err_clear();
        mm_free(s);
        s = calloc(1, sizeof *s);
        c->state = s;
        if (!s) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "matmul state");
    }
    s->mode = MM_BLAS;
    return ENG_STATUS_OK;
}

static eng_status mm_exec_blas(krn_call *c) {
    const krn_matmul_params *p = c->params;
    mm_shapes sh;
    mm_shapes_get(c, &sh);
    const float *A = c->in[0].data, *B = c->in[1].data;
    float *Y = c->out[0].data;
    int64_t nb = 1;
    for (int i = 0; i < sh.r - 2; i++) nb *= sh.y[i];
    float beta = 0.f;
    if (p->has_bias && c->in[2].data && p->beta != 0.f) {
        mm_fill_c_f32(Y, &c->in[2], sh.y, sh.r, 1.f);
        beta = p->beta;
    }
    if (sh.K == 0 && beta == 0.f) memset(Y, 0, (size_t)(nb * sh.M * sh.N) * sizeof(float));
    else if (sh.M > 0 && sh.N > 0)
        for (int64_t bi = 0; bi < nb; bi++) {
            int64_t oa, ob;
            mm_batch_offsets(&sh, bi, &oa, &ob);
            cblas_sgemm(CblasRowMajor, p->trans_a ? CblasTrans : CblasNoTrans, p->trans_b ? CblasTrans : CblasNoTrans,
                        (int)sh.M, (int)sh.N, (int)sh.K, p->alpha, A + oa, p->trans_a ? (int)sh.M : (int)sh.K, B + ob,
                        p->trans_b ? (int)sh.K : (int)sh.N, beta, Y + bi * sh.M * sh.N, (int)sh.N);
        }
    else if (beta != 0.f && sh.K == 0) {
        /* Y already holds C; scale it */
        for (int64_t i = 0; i < nb * sh.M * sh.N; i++) Y[i] *= p->beta;
    }
    krn_nn_act_apply_f32(Y, eng_tensor_numel(&c->out[0]), &p->act, c->nthreads);
    return ENG_STATUS_OK;
}

#define MM_REF_IMPL(NAME, T)                                                                                   \
    static void NAME(const krn_call *c, const mm_shapes *sh) {                                                 \
        const krn_matmul_params *p = c->params;                                                                \
        const T *A = c->in[0].data, *B = c->in[1].data;                                                        \
        T *Y = c->out[0].data;                                                                                 \
        int64_t nb = 1, M = sh->M, N = sh->N, K = sh->K;                                                       \
        for (int i = 0; i < sh->r - 2; i++) nb *= sh->y[i];                                                    \
        const eng_tensor *C = p->has_bias && c->in[2].data ? &c->in[2] : NULL;                                 \
        int64_t cst[ENG_MAX_DIMS] = {0}, acc = 1;                                                              \
        if (C)                                                                                                 \
            for (int i = C->ndim - 1; i >= 0; i--) {                                                           \
                cst[sh->r - C->ndim + i] = C->dims[i] == 1 ? 0 : acc;                                          \
                acc *= C->dims[i];                                                                             \
            }                                                                                                  \
        for (int64_t bi = 0; bi < nb; bi++) {                                                                  \
            int64_t oa, ob, coff = 0, rem = bi;                                                                \
            mm_batch_offsets(sh, bi, &oa, &ob);                                                                \
            for (int d = sh->r - 3; d >= 0; d--) {                                                             \
                coff += (rem % sh->y[d]) * cst[d];                                                             \
                rem /= sh->y[d];                                                                               \
            }                                                                                                  \
            for (int64_t m = 0; m < M; m++)                                                                    \
                for (int64_t n = 0; n < N; n++) {                                                              \
                    T s = 0;                                                                                   \
                    for (int64_t k = 0; k < K; k++) {                                                          \
                        T a = p->trans_a ? A[oa + k * M + m] : A[oa + m * K + k];                              \
                        T b = p->trans_b ? B[ob + n * K + k] : B[ob + k * N + n];                              \
                        s += a * b;                                                                            \
                    }                                                                                          \
                    if (p->gemm) s = (T)(p->alpha * s);                                                        \
                    if (C) {                                                                                   \
                        T cv = ((const T *)C->data)[coff + m * cst[sh->r - 2] + n * cst[sh->r - 1]];           \
                        s += p->gemm ? (T)(p->beta * cv) : cv;                                                 \
                    }                                                                                          \
                    Y[(bi * M + m) * N + n] = s;                                                               \
                }                                                                                              \
        }                                                                                                      \
    }

MM_REF_IMPL(mm_ref_f64, double)
MM_REF_IMPL(mm_ref_i32, int32_t)
MM_REF_IMPL(mm_ref_i64, int64_t)
MM_REF_IMPL(mm_ref_u32, uint32_t)
MM_REF_IMPL(mm_ref_u64, uint64_t)
MM_REF_IMPL(mm_ref_f32, float)

static eng_status mm_exec(krn_call *c) {
    const krn_matmul_params *p = c->params;
    mm_state *s = c->state;
    if (eng_tensor_numel(&c->out[0]) == 0) return ENG_STATUS_OK;
    if (s && s->mode == MM_GEMV) {
        const float *bias = s->bias;
        if (!bias && p->has_bias && c->in[2].data) bias = c->in[2].data;
        mm_gemv_run(s, c->in[0].data, c->out[0].data, bias, &p->act, c->nthreads);
        return ENG_STATUS_OK;
    }
    if (s && s->mode == MM_DNNL) {
        dnnl_stream_t stream;
        ENG_TRY(krn_dnnl_stream(&stream));
        krn_dnnl_set_threads(c->nthreads);
        const void *a = c->in[0].data, *b = c->in[1].data;
        if (s->ta) {
            ENG_TRY(krn_dnnl_reorder_run(&s->ra, stream, a, s->ta));
            a = s->ta;
        }
        if (s->tb) {
            ENG_TRY(krn_dnnl_reorder_run(&s->rb, stream, b, s->tb));
            b = s->tb;
        }
        KRN_DNNL_CHECK(dnnl_memory_set_data_handle(s->msrc, (void *)a));
        KRN_DNNL_CHECK(dnnl_memory_set_data_handle(s->mdst, c->out[0].data));
        if (!((c->const_mask >> 1) & 1)) KRN_DNNL_CHECK(dnnl_memory_set_data_handle(s->mwei, (void *)b));
        if (s->bias_arg && !s->bias) KRN_DNNL_CHECK(dnnl_memory_set_data_handle(s->mbias, c->in[2].data));
        dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, s->msrc}, {DNNL_ARG_WEIGHTS, s->mwei}, {DNNL_ARG_DST, s->mdst}};
        int na = 3;
        if (s->bias_arg) args[na].arg = DNNL_ARG_BIAS, args[na++].memory = s->mbias;
        if (s->mscratch) args[na].arg = DNNL_ARG_SCRATCHPAD, args[na++].memory = s->mscratch;
        KRN_DNNL_CHECK(dnnl_primitive_execute(s->prim, stream, na, args));
        KRN_DNNL_CHECK(dnnl_stream_wait(stream));
        return ENG_STATUS_OK;
    }
    if (s && s->mode == MM_BLAS) return mm_exec_blas(c);
    mm_shapes sh;
    mm_shapes_get(c, &sh);
    switch (c->in[0].dtype) {
    case ENG_DTYPE_F32: mm_ref_f32(c, &sh); krn_nn_act_apply_f32(c->out[0].data, eng_tensor_numel(&c->out[0]), &p->act, 1); break;
    case ENG_DTYPE_F64: mm_ref_f64(c, &sh); krn_nn_act_apply_f64(c->out[0].data, eng_tensor_numel(&c->out[0]), &p->act); break;
    case ENG_DTYPE_I32: mm_ref_i32(c, &sh); break;
    case ENG_DTYPE_I64: mm_ref_i64(c, &sh); break;
    case ENG_DTYPE_U32: mm_ref_u32(c, &sh); break;
    case ENG_DTYPE_U64: mm_ref_u64(c, &sh); break;
    default: return eng_err(ENG_STATUS_UNSUPPORTED, "matmul dtype %s", eng_dtype_name(c->in[0].dtype));
    }
    return ENG_STATUS_OK;
}

static void mm_describe(const krn_call *c, krn_impl_info *info) {
    const mm_state *s = c->state;
    memset(info, 0, sizeof *info);
    if (s && s->mode == MM_GEMV) snprintf(info->impl, sizeof info->impl, "gemv panels (" MM_GEMV_ISA ")");
    else if (s && s->mode == MM_BLAS) snprintf(info->impl, sizeof info->impl, "openblas sgemm");
    else if (s && s->mode == MM_DNNL) {
        char a[48], b[48];
        krn_dnnl_md_str(dnnl_primitive_desc_query_md(s->pd, dnnl_query_weights_md, 0), b, sizeof b);
        krn_dnnl_md_str(dnnl_primitive_desc_query_md(s->pd, dnnl_query_src_md, 0), a, sizeof a);
        snprintf(info->impl, sizeof info->impl, "%s src %s wei %s%s%s", krn_dnnl_impl_name(s->pd), a, b,
                 s->ta ? " +convert(A)" : "", s->tb ? " +convert(B)" : "");
        info->slow = krn_dnnl_is_ref(s->pd);
        info->reorders = !!s->ta + !!s->tb;
    } else {
        snprintf(info->impl, sizeof info->impl, "reference loops (%s)", eng_dtype_name(c->in[0].dtype));
        info->slow = c->in[0].dtype == ENG_DTYPE_F32 && eng_tensor_numel(&c->out[0]) > 0;
    }
}

static eng_status mm_init_checked(krn_call *c) {
    eng_status st = mm_init(c);
    if (st != ENG_STATUS_OK) {
        mm_free(c->state);
        c->state = NULL;
    }
    return st;
}

const krn_kernel krn_cpu_nn_kernels[] = {
    {"matmul", mm_init_checked, mm_exec, mm_free, mm_describe, mm_compute_ok},
    {"conv", krn_cpu_conv_init, krn_cpu_conv_exec, krn_cpu_conv_free, krn_cpu_conv_describe, krn_cpu_conv_compute_ok},
    {"conv_transpose", krn_cpu_deconv_init, krn_cpu_deconv_exec, krn_cpu_deconv_free, krn_cpu_deconv_describe},
    {"pool", krn_cpu_pool_init, krn_cpu_pool_exec, krn_cpu_pool_free, krn_cpu_pool_describe, NULL, krn_cpu_pool_io_ok},
    {NULL},
};
