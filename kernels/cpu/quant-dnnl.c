/* quant-dnnl.c - MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv on oneDNN's int8 primitives (u8/s8
 * activations, s8 weights, s32 accumulation); quant.c's reference loops are the fallback.
 *
 * How the ONNX formulas (kernels/krn-quant.h) map onto oneDNN 2.6:
 *   - Weights: W' = W - w_zp (per tensor, or per output channel / column of B) must fit int8. When W and its
 *     zero point are constant (const_mask) W' is computed once in init and reordered into oneDNN's packed
 *     layout. That covers int8 weights with zero point 0 and uint8 weights whose zero point brings them into
 *     [-128, 127] (e.g. zero point 128); other uint8 weights stay on the reference loops. A non-constant W runs
 *     only as int8 without a zero point (passed plain on every run).
 *   - Integer outputs (MatMulInteger, ConvInteger): the primitive computes X * W' with no attributes, an exact
 *     int32 accumulation that wraps as ONNX's int32 does (VNNI's vpdpbusd has no int16 intermediates). The
 *     activation zero point is subtracted afterwards in uint32 arithmetic, Y -= x_zp * S, with S the column sums
 *     of W' (matmul) or, for conv, the sums of W' over the taps that read inside X at each output position
 *     (padding contributes x - x_zp = 0 there, not -x_zp). oneDNN's own src zero point is not used for these: it
 *     compensates in float32 and drops bits above 2^24. Result: bit-identical to the reference loops.
 *   - QLinear outputs: oneDNN applies the src zero point, the int32 bias (QLinearConv), the output scales
 *     a_scale * w_scale[j] / y_scale (the same float32 expression as the reference) and the dst zero point, then
 *     rounds to nearest even and saturates. It does so in float32 where the reference uses double, and adds y_zp
 *     before rounding where the reference adds it after, so an output may sit one quantization step away, only
 *     when the exact value lies within float32 rounding of a .5 boundary (or exactly on one, with an odd y_zp).
 *     That holds while |accumulator| < 2^24 (exact in float32); past that, float32 cancellation between the raw
 *     product and the zero point compensation can add further steps.
 *   - On a CPU without VNNI oneDNN's u8*s8 kernels go through saturating int16 sums (vpmaddubsw): the fast path is
 *     refused there and the reference loops run.
 * Reference fallback (describe() says why and reports it slow): per-row zero point or scale of A, weights that
 * leave int8 after the shift, non-constant scales or weight zero points, empty tensors, non-plain layouts,
 * shapes oneDNN refuses. describe() on the fast path names oneDNN's implementation; slow only if it is "ref".
 * State is per plan (one request at a time), like every oneDNN kernel here: user scratchpad, zero point cells.
 */
#include <dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernel.h"
#include "../krn-quant.h"

eng_status krn_cpu_qmatmul_ref(krn_call *c); /* quant.c */
eng_status krn_cpu_qconv_ref(krn_call *c);

typedef struct qd_state {
    int fast;                /* 0: the reference loops run (desc says why) */
    char desc[192];
    int slow, reorders;
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t prim;
    dnnl_memory_t msrc, mwei, mdst, mbias, mscratch, mzsrc, mzdst, mpobias; /* mpobias: to_float's bias post-op */
    krn_dnnl_reorder rsrc, rdst; /* conv: plain <-> the layouts the primitive chose (counted reorders) */
    krn_dnnl_reorder rwei;       /* conv with non-constant W: plain -> oneDNN's layout on every run */
    void *tsrc, *tdst, *twei;
    void *wpack;             /* W' in oneDNN's layout (constant weights) */
    int wconst;
    int zsrc_arg, zdst_arg;  /* QLinear: runtime zero points attached to the primitive */
    int32_t zs, zd;          /* their values for the current run (mzsrc / mzdst point here) */
    int comp;                /* integer output: Y -= x_zp * S after the primitive */
    int32_t *S;              /* matmul: (nbb, N) column sums of W'; conv: (M, out spatial) tap sums */
    int ixzp;                /* input index of the activation zero point */
    /* matmul geometry: batch dims right-aligned to rank r */
    int r;
    int64_t ab[ENG_MAX_DIMS], bb[ENG_MAX_DIMS], yb[ENG_MAX_DIMS], nbatch, nbb, M, N, K;
    /* conv geometry (spatial padded to 3 with leading 1s) */
    int64_t cN, cC, cM, cG, in[3], out[3], k[3], st[3], dl[3], pb[3];
} qd_state;

static void qd_clear(qd_state *s) {
    if (s->prim) dnnl_primitive_destroy(s->prim);
    if (s->pd) dnnl_primitive_desc_destroy(s->pd);
    dnnl_memory_t *ms[] = {&s->msrc, &s->mwei, &s->mdst, &s->mbias, &s->mscratch, &s->mzsrc, &s->mzdst, &s->mpobias};
    for (size_t i = 0; i < sizeof ms / sizeof *ms; i++)
        if (*ms[i]) dnnl_memory_destroy(*ms[i]);
    krn_dnnl_reorder_free(&s->rsrc);
    krn_dnnl_reorder_free(&s->rdst);
    krn_dnnl_reorder_free(&s->rwei);
    eng_free(s->twei);
    eng_free(s->tsrc);
    eng_free(s->tdst);
    eng_free(s->wpack);
    free(s->S);
    memset(s, 0, sizeof *s);
}

void krn_cpu_qdnnl_free(void *state) {
    if (!state) return;
    qd_clear(state);
    free(state);
}

void krn_cpu_qdnnl_describe(const krn_call *c, krn_impl_info *info) {
    const qd_state *s = c->state;
    memset(info, 0, sizeof *info);
    if (!s) {
        krn_str_copy(info->impl, sizeof info->impl, "reference C int8 loops");
        info->slow = 1;
        return;
    }
    krn_str_copy(info->impl, sizeof info->impl, s->desc);
    info->slow = s->slow;
    info->reorders = s->reorders;
}

/* ---------------------------------------------------------------- helpers */

/* Input i, or NULL when the optional input is omitted. */
static const eng_tensor *qd_in(const krn_call *c, int i) {
    return i >= 0 && i < c->nin && c->in[i].dtype != ENG_DTYPE_UNDEFINED ? &c->in[i] : NULL;
}
static int qd_const(const krn_call *c, int i) { return i < 32 && ((c->const_mask >> i) & 1u); }

static int32_t qd_at_i(const eng_tensor *t, int64_t i) {
    if (!t || !t->data) return 0;
    if (eng_tensor_numel(t) == 1) i = 0;
    switch (t->dtype) {
    case ENG_DTYPE_U8: return ((const uint8_t *)t->data)[i];
    case ENG_DTYPE_I8: return ((const int8_t *)t->data)[i];
    case ENG_DTYPE_I32: return ((const int32_t *)t->data)[i];
    default: return 0;
    }
}
static float qd_at_f(const eng_tensor *t, int64_t i) { return ((const float *)t->data)[eng_tensor_numel(t) == 1 ? 0 : i]; }

/* 1 when zero point input i is omitted, or constant and all zero (nothing to apply). */
static int qd_zp_none(const krn_call *c, int i) {
    const eng_tensor *z = qd_in(c, i);
    if (!z) return 1;
    if (!qd_const(c, i) || !z->data) return 0;
    for (int64_t j = 0; j < eng_tensor_numel(z); j++)
        if (qd_at_i(z, j)) return 0;
    return 1;
}

static dnnl_data_type_t qd_dt(eng_dtype d) {
    return d == ENG_DTYPE_U8 ? dnnl_u8 : d == ENG_DTYPE_I8 ? dnnl_s8 : d == ENG_DTYPE_I32 ? dnnl_s32 : d == ENG_DTYPE_F32 ? dnnl_f32 : dnnl_data_type_undef;
}

static const dnnl_format_tag_t qd_plain[] = {dnnl_format_tag_undef, dnnl_a, dnnl_ab, dnnl_abc, dnnl_abcd, dnnl_abcde,
                                             dnnl_abcdef, dnnl_abcdefg, dnnl_abcdefgh, dnnl_abcdefghi, dnnl_abcdefghij};

/* Also the switch TENSORD_QUANT_REF=1, which keeps every integer matmul/conv on the reference loops (benchmarks). */
static eng_status qd_isa_check(void) {
    const char *e = getenv("TENSORD_QUANT_REF");
    if (e && *e && *e != '0') return eng_err(ENG_STATUS_UNSUPPORTED, "TENSORD_QUANT_REF is set");
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    if (!((unsigned)isa & ((unsigned)dnnl_cpu_isa_avx512_core_vnni & ~(unsigned)dnnl_cpu_isa_avx512_core)) &&
        !((unsigned)isa & ((unsigned)dnnl_cpu_isa_avx2_vnni & ~(unsigned)dnnl_cpu_isa_avx2)))
        return eng_err(ENG_STATUS_UNSUPPORTED, "no VNNI on this CPU (oneDNN int8 would saturate int16 sums)");
    return ENG_STATUS_OK;
}

/* W - zp into dst as int8; zp per tensor or per index (i / inner) % C. 0 when a value leaves [-128, 127]. */
static int qd_shift_weights(const eng_tensor *w, const eng_tensor *zp, int64_t C, int64_t inner, int8_t *dst) {
    int64_t n = eng_tensor_numel(w);
    int per = zp && zp->data && eng_tensor_numel(zp) > 1;
    for (int64_t i = 0; i < n; i++) {
        int32_t v = qd_at_i(w, i) - (zp ? qd_at_i(zp, per ? (i / inner) % C : 0) : 0);
        if (v < -128 || v > 127) return 0;
        dst[i] = (int8_t)v;
    }
    return 1;
}

/* Create pd + primitive + user scratchpad from op_desc and attr (attr is kept by the caller). */
static eng_status qd_prim(const void *op_desc, const_dnnl_primitive_attr_t attr, qd_state *s) {
    dnnl_engine_t eng;
    ENG_TRY(krn_dnnl_engine(&eng));
    KRN_DNNL_CHECK(dnnl_primitive_desc_create(&s->pd, op_desc, attr, eng, NULL));
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(s->pd, dnnl_query_scratchpad_md, 0);
    if (smd && dnnl_memory_desc_get_size(smd) > 0) KRN_DNNL_CHECK(dnnl_memory_create(&s->mscratch, smd, eng, DNNL_MEMORY_ALLOCATE));
    KRN_DNNL_CHECK(dnnl_primitive_create(&s->prim, s->pd));
    return ENG_STATUS_OK;
}

/* Attributes shared by matmul and conv: user scratchpad; for QLinear the output scales (from constant scale
 * inputs isx, isw, isy; mask selects the per-channel dim) and runtime zero points on src / dst. */
static eng_status qd_attr(krn_call *c, qd_state *s, int qlinear, int isx, int isw, int isy, int izx, int izy,
                          int64_t nch, int mask, dnnl_primitive_attr_t *out) {
    *out = NULL;
    float *sc = NULL;
    int64_t nsc = 1;
    if (qlinear) {
        if (!qd_const(c, isx) || !qd_const(c, isw) || (isy >= 0 && !qd_const(c, isy)))
            return eng_err(ENG_STATUS_UNSUPPORTED, "scales are not constant");
        nsc = eng_tensor_numel(&c->in[isw]) > 1 ? nch : 1;
        if (!(sc = malloc((size_t)nsc * sizeof *sc))) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "output scales");
        float xs = qd_at_f(&c->in[isx], 0), ys = isy >= 0 ? qd_at_f(&c->in[isy], 0) : 1.f; /* isy -1: float out */
        for (int64_t j = 0; j < nsc; j++) sc[j] = xs * qd_at_f(&c->in[isw], j) / ys; /* as the reference computes it */
    }
    dnnl_primitive_attr_t a;
    if (dnnl_primitive_attr_create(&a) != dnnl_success) {
        free(sc);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "oneDNN attributes");
    }
    const int32_t rt = DNNL_RUNTIME_S32_VAL;
    dnnl_status_t st = dnnl_primitive_attr_set_scratchpad_mode(a, dnnl_scratchpad_mode_user);
    if (qlinear && st == dnnl_success) st = dnnl_primitive_attr_set_output_scales(a, nsc, nsc > 1 ? mask : 0, sc);
    if (qlinear && st == dnnl_success && !qd_zp_none(c, izx)) {
        s->zsrc_arg = 1;
        st = dnnl_primitive_attr_set_zero_points(a, DNNL_ARG_SRC, 1, 0, &rt);
    }
    if (qlinear && st == dnnl_success && !qd_zp_none(c, izy)) {
        s->zdst_arg = 1;
        st = dnnl_primitive_attr_set_zero_points(a, DNNL_ARG_DST, 1, 0, &rt);
    }
    free(sc);
    if (st != dnnl_success) {
        dnnl_primitive_attr_destroy(a);
        return krn_dnnl_fail(st, "int8 attributes", __func__, __FILE__, __LINE__);
    }
    *out = a;
    return ENG_STATUS_OK;
}

/* Zero point cells (one s32 each) passed as DNNL_ARG_ATTR_ZERO_POINTS at every run. */
static eng_status qd_zp_mems(qd_state *s) {
    dnnl_engine_t eng;
    ENG_TRY(krn_dnnl_engine(&eng));
    dnnl_memory_desc_t zmd;
    dnnl_dims_t one = {1};
    KRN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&zmd, 1, one, dnnl_s32, dnnl_a));
    if (s->zsrc_arg) KRN_DNNL_CHECK(dnnl_memory_create(&s->mzsrc, &zmd, eng, &s->zs));
    if (s->zdst_arg) KRN_DNNL_CHECK(dnnl_memory_create(&s->mzdst, &zmd, eng, &s->zd));
    return ENG_STATUS_OK;
}

static void qd_describe_state(qd_state *s, const char *extra) {
    char a[48], b[48], d[48], t[512];
    krn_dnnl_md_str(dnnl_primitive_desc_query_md(s->pd, dnnl_query_src_md, 0), a, sizeof a);
    krn_dnnl_md_str(dnnl_primitive_desc_query_md(s->pd, dnnl_query_weights_md, 0), b, sizeof b);
    krn_dnnl_md_str(dnnl_primitive_desc_query_md(s->pd, dnnl_query_dst_md, 0), d, sizeof d);
    snprintf(t, sizeof t, "%s int8 src %s wei %s dst %s%s%s%s%s%s", krn_dnnl_impl_name(s->pd), a, b, d,
             s->rsrc.prim ? " +reorder(src)" : "", s->rdst.prim ? " +reorder(dst)" : "",
             s->rwei.prim ? " +reorder(wei)" : "", s->comp ? " +zero-point compensation" : "", extra);
    krn_str_copy(s->desc, sizeof s->desc, t);
    s->slow = krn_dnnl_is_ref(s->pd);
    s->reorders = (s->rsrc.prim != NULL) + (s->rdst.prim != NULL) + (s->rwei.prim != NULL);
}

/* After a failed build: the reference loops, and why. */
static void qd_fallback(qd_state *s, const char *op) {
    char why[160];
    krn_str_copy(why, sizeof why, eng_last_error());
    eng_err_clear();
    qd_clear(s);
    char t[256];
    snprintf(t, sizeof t, "reference C int8 loops (%s: %s)", op, why[0] ? why : "no oneDNN int8 path");
    krn_str_copy(s->desc, sizeof s->desc, t);
    s->slow = 1;
}

static eng_status qd_run(qd_state *s, const krn_call *c, const void *src, void *dst, const void *wei, const void *bias,
                         const void *po_bias) {
    dnnl_stream_t stream;
    ENG_TRY(krn_dnnl_stream(&stream));
    krn_dnnl_set_threads(c->nthreads);
    void *pdst = s->tdst ? s->tdst : dst;
    if (s->tsrc) {
        ENG_TRY(krn_dnnl_reorder_run(&s->rsrc, stream, src, s->tsrc));
        src = s->tsrc;
    }
    KRN_DNNL_CHECK(dnnl_memory_set_data_handle(s->msrc, (void *)src));
    KRN_DNNL_CHECK(dnnl_memory_set_data_handle(s->mdst, pdst));
    if (s->twei) {
        ENG_TRY(krn_dnnl_reorder_run(&s->rwei, stream, wei, s->twei));
        wei = s->twei;
    }
    if (!s->wconst) KRN_DNNL_CHECK(dnnl_memory_set_data_handle(s->mwei, (void *)wei));
    dnnl_exec_arg_t args[8] = {{DNNL_ARG_SRC, s->msrc}, {DNNL_ARG_WEIGHTS, s->mwei}, {DNNL_ARG_DST, s->mdst}};
    int na = 3;
    if (s->mscratch) args[na].arg = DNNL_ARG_SCRATCHPAD, args[na++].memory = s->mscratch;
    if (s->mbias) {
        KRN_DNNL_CHECK(dnnl_memory_set_data_handle(s->mbias, (void *)bias));
        args[na].arg = DNNL_ARG_BIAS, args[na++].memory = s->mbias;
    }
    if (s->mpobias) {
        KRN_DNNL_CHECK(dnnl_memory_set_data_handle(s->mpobias, (void *)po_bias));
        args[na].arg = DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, args[na++].memory = s->mpobias;
    }
    if (s->mzsrc) args[na].arg = DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, args[na++].memory = s->mzsrc;
    if (s->mzdst) args[na].arg = DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST, args[na++].memory = s->mzdst;
    KRN_DNNL_CHECK(dnnl_primitive_execute(s->prim, stream, na, args));
    if (s->tdst) ENG_TRY(krn_dnnl_reorder_run(&s->rdst, stream, s->tdst, dst));
    KRN_DNNL_CHECK(dnnl_stream_wait(stream));
    return ENG_STATUS_OK;
}

/* ---------------------------------------------------------------- MatMulInteger / QLinearMatMul */

/* Column sums of each of the nbb int8 (K, N) matrices in w into S (nbb, N). */
static void qd_colsums(const int8_t *w, int64_t nbb, int64_t K, int64_t N, int32_t *S) {
    for (int64_t b = 0; b < nbb; b++) {
        int32_t *s = S + b * N;
        memset(s, 0, (size_t)N * sizeof *s);
        for (int64_t k = 0; k < K; k++)
            for (int64_t j = 0; j < N; j++) s[j] += w[(b * K + k) * N + j];
    }
}

static eng_status qd_mm_build(krn_call *c, qd_state *s) {
    const krn_qmatmul_params *p = c->params;
    int q = p->qlinear, tf = p->to_float, ia = 0, ib = q ? 3 : 1, izb = q || tf ? 5 : 3;
    const eng_tensor *A = &c->in[ia], *B = &c->in[ib], *Y = &c->out[0];
    s->ixzp = tf ? 4 : 2;
    const eng_tensor *azp = qd_in(c, s->ixzp), *bzp = qd_in(c, izb);
    ENG_TRY(qd_isa_check());
    if (!eng_tensor_numel(A) || !eng_tensor_numel(B) || !eng_tensor_numel(Y))
        return eng_err(ENG_STATUS_UNSUPPORTED, "empty operand");
    if (azp && eng_tensor_numel(azp) > 1) return eng_err(ENG_STATUS_UNSUPPORTED, "per-row zero point of A");
    if (q && eng_tensor_numel(&c->in[1]) > 1) return eng_err(ENG_STATUS_UNSUPPORTED, "per-row scale of A");
    const eng_tensor *pob = tf ? qd_in(c, 6) : NULL; /* to_float's bias: a binary add post-op after the scales */
    s->K = A->dims[A->ndim - 1];
    s->M = A->ndim >= 2 ? A->dims[A->ndim - 2] : 1;
    s->N = B->ndim >= 2 ? B->dims[B->ndim - 1] : 1;
    int na = A->ndim > 2 ? A->ndim - 2 : 0, nb = B->ndim > 2 ? B->ndim - 2 : 0;
    s->r = na > nb ? na : nb;
    s->nbatch = s->nbb = 1;
    for (int d = 0; d < s->r; d++) {
        s->ab[d] = d < s->r - na ? 1 : A->dims[d - (s->r - na)];
        s->bb[d] = d < s->r - nb ? 1 : B->dims[d - (s->r - nb)];
        s->yb[d] = s->ab[d] > s->bb[d] ? s->ab[d] : s->bb[d];
        s->nbatch *= s->yb[d];
        s->nbb *= s->bb[d];
    }
    if (nb == 0 && s->r > 0) { /* a 2-D B (a dense layer's weights): A's batch dims fold into its rows, so oneDNN
                                  * takes one 2-D product with B packed in its blocked layout */
        s->M *= s->nbatch;
        s->r = 0;
        s->nbatch = s->nbb = 1;
    }
    int nd = s->r + 2;
    if (nd > DNNL_MAX_NDIMS || nd > 10) return eng_err(ENG_STATUS_UNSUPPORTED, "rank %d", nd);
    if (eng_tensor_numel(Y) != s->nbatch * s->M * s->N)
        return eng_err(ENG_STATUS_INTERNAL, "integer matmul: output has %lld elements, expected %lld",
                       (long long)eng_tensor_numel(Y), (long long)(s->nbatch * s->M * s->N));
    dnnl_dims_t ad, bd, yd;
    for (int d = 0; d < s->r; d++) ad[d] = s->ab[d], bd[d] = s->bb[d], yd[d] = s->yb[d];
    ad[nd - 2] = s->M, ad[nd - 1] = s->K, bd[nd - 2] = s->K, bd[nd - 1] = s->N, yd[nd - 2] = s->M, yd[nd - 1] = s->N;

    /* weights: W' = B - b_zp, constant -> packed once; otherwise int8 with no zero point, passed plain */
    s->wconst = qd_const(c, ib) && (!bzp || qd_const(c, izb));
    int8_t *wsh = NULL;
    if (s->wconst) {
        if (!(wsh = malloc((size_t)eng_tensor_numel(B)))) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "shifted B");
        if (!qd_shift_weights(B, bzp, s->N, 1, wsh)) {
            free(wsh);
            return eng_err(ENG_STATUS_UNSUPPORTED, "B - b_zero_point leaves int8");
        }
    } else if (B->dtype != ENG_DTYPE_I8 || !qd_zp_none(c, izb)) {
        return eng_err(ENG_STATUS_UNSUPPORTED, "non-constant B that is not int8 without zero point");
    }
    eng_status est = ENG_STATUS_OK;
    if (!q && !tf && !qd_zp_none(c, 2)) { /* integer output with an A zero point: Y -= a_zp * colsum(W') */
        s->comp = 1;
        if (!(s->S = malloc((size_t)(s->nbb * s->N) * sizeof *s->S))) est = eng_err(ENG_STATUS_OUT_OF_MEMORY, "column sums");
        else if (wsh) qd_colsums(wsh, s->nbb, s->K, s->N, s->S);
    }
    dnnl_primitive_attr_t attr = NULL;
    if (est == ENG_STATUS_OK)
        est = tf ? qd_attr(c, s, 1, 2, 3, -1, 4, -1, s->N, 1 << (nd - 1), &attr)
                 : qd_attr(c, s, q, 1, 4, 6, 2, 7, s->N, 1 << (nd - 1), &attr);
    dnnl_memory_desc_t pomd;
    if (est == ENG_STATUS_OK && (pob || (tf && p->act.kind != KRN_NN_ACT_NONE))) { /* bias, then the activation */
        dnnl_dims_t pd;
        for (int d = 0; d < nd; d++) pd[d] = 1;
        pd[nd - 1] = s->N;
        dnnl_post_ops_t po = NULL;
        dnnl_status_t ps = dnnl_memory_desc_init_by_tag(&pomd, nd, pd, dnnl_f32, qd_plain[nd]);
        if (ps == dnnl_success) ps = dnnl_post_ops_create(&po);
        if (ps == dnnl_success && pob) ps = dnnl_post_ops_append_binary(po, dnnl_binary_add, &pomd);
        if (ps != dnnl_success) est = krn_dnnl_fail(ps, "int8 matmul bias post-op", __func__, __FILE__, __LINE__);
        if (est == ENG_STATUS_OK) est = krn_dnnl_append_act(po, &p->act);
        if (est == ENG_STATUS_OK && dnnl_primitive_attr_set_post_ops(attr, po) != dnnl_success)
            est = eng_err(ENG_STATUS_INTERNAL, "int8 matmul post-ops");
        if (po) dnnl_post_ops_destroy(po);
    }
    dnnl_memory_desc_t amd, bmd, bplain, ymd;
    dnnl_matmul_desc_t md;
    dnnl_status_t ds = dnnl_success;
    if (est == ENG_STATUS_OK) {
        ds = dnnl_memory_desc_init_by_tag(&amd, nd, ad, qd_dt(A->dtype), qd_plain[nd]);
        if (ds == dnnl_success) ds = dnnl_memory_desc_init_by_tag(&bplain, nd, bd, dnnl_s8, qd_plain[nd]);
        if (ds == dnnl_success) ds = dnnl_memory_desc_init_by_tag(&bmd, nd, bd, dnnl_s8, s->wconst ? dnnl_format_tag_any : qd_plain[nd]);
        if (ds == dnnl_success) ds = dnnl_memory_desc_init_by_tag(&ymd, nd, yd, qd_dt(Y->dtype), qd_plain[nd]);
        if (ds == dnnl_success) ds = dnnl_matmul_desc_init(&md, &amd, &bmd, NULL, &ymd);
        if (ds != dnnl_success) est = krn_dnnl_fail(ds, "int8 matmul desc", __func__, __FILE__, __LINE__);
    }
    if (est == ENG_STATUS_OK) est = qd_prim(&md, attr, s);
    if (attr) dnnl_primitive_attr_destroy(attr);
    dnnl_engine_t eng = NULL;
    if (est == ENG_STATUS_OK) est = krn_dnnl_engine(&eng);
    if (est == ENG_STATUS_OK) {
        const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(s->pd, dnnl_query_weights_md, 0);
        if (s->wconst) est = krn_dnnl_reorder_new(&bplain, wsh, wmd, &s->wpack);
        if (est == ENG_STATUS_OK && dnnl_memory_create(&s->mwei, wmd, eng, s->wconst ? s->wpack : DNNL_MEMORY_NONE) != dnnl_success)
            est = eng_err(ENG_STATUS_INTERNAL, "int8 matmul weights memory");
    }
    free(wsh);
    ENG_TRY(est);
    KRN_DNNL_CHECK(dnnl_memory_create(&s->msrc, &amd, eng, DNNL_MEMORY_NONE));
    KRN_DNNL_CHECK(dnnl_memory_create(&s->mdst, &ymd, eng, DNNL_MEMORY_NONE));
    if (pob) KRN_DNNL_CHECK(dnnl_memory_create(&s->mpobias, &pomd, eng, DNNL_MEMORY_NONE));
    ENG_TRY(qd_zp_mems(s));
    s->fast = 1;
    qd_describe_state(s, tf ? " (float out)" : "");
    return ENG_STATUS_OK;
}

eng_status krn_cpu_qmatmul_init(krn_call *c) {
    qd_state *s = calloc(1, sizeof *s);
    if (!s) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "int8 matmul state");
    c->state = s;
    if (qd_mm_build(c, s) != ENG_STATUS_OK) qd_fallback(s, "matmul");
    return ENG_STATUS_OK;
}

eng_status krn_cpu_qmatmul_exec(krn_call *c) {
    qd_state *s = c->state;
    if (!s || !s->fast) return krn_cpu_qmatmul_ref(c);
    const krn_qmatmul_params *p = c->params;
    int ib = p->qlinear ? 3 : 1;
    if (s->zsrc_arg) s->zs = qd_at_i(&c->in[s->ixzp], 0);
    if (s->zdst_arg) s->zd = qd_at_i(&c->in[7], 0);
    ENG_TRY(qd_run(s, c, c->in[0].data, c->out[0].data, c->in[ib].data, NULL, s->mpobias ? c->in[6].data : NULL));
    int32_t xz = s->comp ? qd_at_i(&c->in[s->ixzp], 0) : 0;
    if (!xz) return ENG_STATUS_OK;
    if (!s->wconst) qd_colsums(c->in[ib].data, s->nbb, s->K, s->N, s->S);
    uint32_t *y = c->out[0].data;
    int64_t rows = s->nbatch * s->M, N = s->N, M = s->M;
    int nt = c->nthreads > 0 ? c->nthreads : 1;
#pragma omp parallel for num_threads(nt) if (nt > 1 && rows * N > 65536)
    for (int64_t row = 0; row < rows; row++) {
        const int32_t *S = s->S + krn_q_batch_off(s->bb, s->yb, s->r, row / M) * N;
        uint32_t *yr = y + row * N;
        for (int64_t j = 0; j < N; j++) yr[j] -= (uint32_t)xz * (uint32_t)S[j];
    }
    return ENG_STATUS_OK;
}

/* ---------------------------------------------------------------- ConvInteger / QLinearConv */

/* S[m][o]: the sum of W'[m] (int8, (M, C/G, k0, k1, k2)) over the taps of output position o that read inside
 * the input, channels summed first; cost M * taps * outputs. */
static int qd_conv_sums(const qd_state *s, const int8_t *w) {
    int64_t ksz = s->k[0] * s->k[1] * s->k[2], cg = s->cC / s->cG, osz = s->out[0] * s->out[1] * s->out[2];
    int32_t *ws = malloc((size_t)ksz * sizeof *ws);
    if (!ws) return 0;
    for (int64_t m = 0; m < s->cM; m++) {
        memset(ws, 0, (size_t)ksz * sizeof *ws);
        for (int64_t ci = 0; ci < cg; ci++)
            for (int64_t t = 0; t < ksz; t++) ws[t] += w[(m * cg + ci) * ksz + t];
        int32_t *S = s->S + m * osz;
        for (int64_t o0 = 0; o0 < s->out[0]; o0++)
            for (int64_t o1 = 0; o1 < s->out[1]; o1++)
                for (int64_t o2 = 0; o2 < s->out[2]; o2++) {
                    uint32_t sum = 0;
                    for (int64_t k0 = 0; k0 < s->k[0]; k0++) {
                        int64_t i0 = o0 * s->st[0] - s->pb[0] + k0 * s->dl[0];
                        if (i0 < 0 || i0 >= s->in[0]) continue;
                        for (int64_t k1 = 0; k1 < s->k[1]; k1++) {
                            int64_t i1 = o1 * s->st[1] - s->pb[1] + k1 * s->dl[1];
                            if (i1 < 0 || i1 >= s->in[1]) continue;
                            for (int64_t k2 = 0; k2 < s->k[2]; k2++) {
                                int64_t i2 = o2 * s->st[2] - s->pb[2] + k2 * s->dl[2];
                                if (i2 < 0 || i2 >= s->in[2]) continue;
                                sum += (uint32_t)ws[(k0 * s->k[1] + k1) * s->k[2] + k2];
                            }
                        }
                    }
                    S[(o0 * s->out[1] + o1) * s->out[2] + o2] = (int32_t)sum;
                }
    }
    free(ws);
    return 1;
}

/* 0: oneDNN's reference kernel; 1: its im2col + GEMM path; 2: a direct / brgemm kernel. */
static int qd_conv_rank(const_dnnl_primitive_desc_t pd) {
    const char *impl = krn_dnnl_impl_name(pd);
    if (!strncmp(impl, "ref", 3)) return 0;
    return strstr(impl, "gemm") ? 1 : 2;
}

/* One attempt at the primitive; any_io: X and Y in format `any` (counted reorders from / to plain). */
static eng_status qd_conv_try(krn_call *c, qd_state *s, const int8_t *wsh, int any_io) {
    const krn_qconv_params *p = c->params;
    const krn_conv_params *k = &p->conv;
    int q = p->qlinear, iw = q ? 3 : 1;
    const eng_tensor *X = &c->in[0], *W = &c->in[iw], *Y = &c->out[0];
    int nsp = k->nspatial, nd = nsp + 2;
    dnnl_dims_t sd, wd, dd, bd, st, dl, pl, pr;
    for (int i = 0; i < nd; i++) sd[i] = X->dims[i], dd[i] = Y->dims[i];
    int wnd = s->cG > 1 ? nd + 1 : nd;
    if (s->cG > 1) {
        wd[0] = s->cG, wd[1] = s->cM / s->cG, wd[2] = s->cC / s->cG;
        for (int i = 0; i < nsp; i++) wd[3 + i] = W->dims[2 + i];
    } else {
        for (int i = 0; i < nd; i++) wd[i] = W->dims[i];
    }
    bd[0] = s->cM;
    for (int i = 0; i < nsp; i++) {
        st[i] = k->strides[i];
        dl[i] = k->dilations[i] - 1;
        pl[i] = k->pads[i];
        pr[i] = k->pads[nsp + i];
    }
    const eng_tensor *B = q ? qd_in(c, 8) : NULL;
    dnnl_primitive_attr_t attr = NULL;
    ENG_TRY(qd_attr(c, s, q, 1, 4, 6, 2, 7, s->cM, 1 << 1, &attr));
    dnnl_memory_desc_t smd, smd_op, wplain, wmd_op, dmd, dmd_op, bmd;
    dnnl_convolution_desc_t cd;
    /* the plan's layouts: plain, or channels last where the int8 layout pass chose it (4-D only) */
    dnnl_format_tag_t xtag = k->x_layout == KRN_NN_LAYOUT_NHWC ? dnnl_nhwc : qd_plain[nd];
    dnnl_format_tag_t ytag = k->y_layout == KRN_NN_LAYOUT_NHWC ? dnnl_nhwc : qd_plain[nd];
    dnnl_status_t ds = dnnl_memory_desc_init_by_tag(&smd, nd, sd, qd_dt(X->dtype), xtag);
    if (ds == dnnl_success) ds = dnnl_memory_desc_init_by_tag(&dmd, nd, dd, qd_dt(Y->dtype), ytag);
    if (ds == dnnl_success) ds = dnnl_memory_desc_init_by_tag(&smd_op, nd, sd, qd_dt(X->dtype), any_io ? dnnl_format_tag_any : xtag);
    if (ds == dnnl_success) ds = dnnl_memory_desc_init_by_tag(&dmd_op, nd, dd, qd_dt(Y->dtype), any_io ? dnnl_format_tag_any : ytag);
    if (ds == dnnl_success) ds = dnnl_memory_desc_init_by_tag(&wplain, wnd, wd, dnnl_s8, qd_plain[wnd]);
    if (ds == dnnl_success) ds = dnnl_memory_desc_init_by_tag(&wmd_op, wnd, wd, dnnl_s8, dnnl_format_tag_any);
    if (ds == dnnl_success) ds = dnnl_memory_desc_init_by_tag(&bmd, 1, bd, dnnl_s32, dnnl_a);
    if (ds == dnnl_success)
        ds = dnnl_dilated_convolution_forward_desc_init(&cd, dnnl_forward_inference, dnnl_convolution_direct, &smd_op, &wmd_op,
                                                        B ? &bmd : NULL, &dmd_op, st, dl, pl, pr);
    eng_status est = ds == dnnl_success ? qd_prim(&cd, attr, s) : krn_dnnl_fail(ds, "int8 conv desc", __func__, __FILE__, __LINE__);
    dnnl_primitive_attr_destroy(attr);
    ENG_TRY(est);
    dnnl_engine_t eng;
    ENG_TRY(krn_dnnl_engine(&eng));
    const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(s->pd, dnnl_query_weights_md, 0);
    if (s->wconst) ENG_TRY(krn_dnnl_reorder_new(&wplain, wsh, wmd, &s->wpack));
    else ENG_TRY(krn_dnnl_io_reorder(&wplain, wmd, 1, &s->rwei, &s->twei)); /* oneDNN's int8 kernels want packed W */
    KRN_DNNL_CHECK(dnnl_memory_create(&s->mwei, wmd, eng, s->wconst ? s->wpack : DNNL_MEMORY_NONE));
    const dnnl_memory_desc_t *psrc = dnnl_primitive_desc_query_md(s->pd, dnnl_query_src_md, 0);
    const dnnl_memory_desc_t *pdst = dnnl_primitive_desc_query_md(s->pd, dnnl_query_dst_md, 0);
    ENG_TRY(krn_dnnl_io_reorder(&smd, psrc, 1, &s->rsrc, &s->tsrc));
    ENG_TRY(krn_dnnl_io_reorder(&dmd, pdst, 0, &s->rdst, &s->tdst));
    KRN_DNNL_CHECK(dnnl_memory_create(&s->msrc, psrc, eng, DNNL_MEMORY_NONE));
    KRN_DNNL_CHECK(dnnl_memory_create(&s->mdst, pdst, eng, DNNL_MEMORY_NONE));
    if (B) KRN_DNNL_CHECK(dnnl_memory_create(&s->mbias, &bmd, eng, DNNL_MEMORY_NONE));
    ENG_TRY(qd_zp_mems(s));
    return ENG_STATUS_OK;
}

/* Keep the geometry, the weight flags and S of *s; drop its oneDNN objects (another attempt follows). */
static void qd_conv_drop_prim(qd_state *s) {
    qd_state keep = *s;
    keep.S = NULL;
    keep.pd = NULL, keep.prim = NULL, keep.msrc = keep.mwei = keep.mdst = keep.mbias = keep.mscratch = NULL;
    keep.mzsrc = keep.mzdst = NULL, keep.tsrc = keep.tdst = keep.twei = keep.wpack = NULL;
    memset(&keep.rsrc, 0, sizeof keep.rsrc), memset(&keep.rdst, 0, sizeof keep.rdst), memset(&keep.rwei, 0, sizeof keep.rwei);
    keep.zsrc_arg = keep.zdst_arg = 0;
    int32_t *S = s->S;
    s->S = NULL;
    qd_clear(s);
    *s = keep;
    s->S = S;
}

static eng_status qd_conv_build(krn_call *c, qd_state *s) {
    const krn_qconv_params *p = c->params;
    const krn_conv_params *k = &p->conv;
    int q = p->qlinear, iw = q ? 3 : 1, izw = q ? 5 : 3;
    const eng_tensor *X = &c->in[0], *W = &c->in[iw], *Y = &c->out[0], *wzp = qd_in(c, izw);
    s->ixzp = 2;
    ENG_TRY(qd_isa_check());
    int nsp = k->nspatial;
    if (nsp < 1 || nsp > 3 || X->ndim != nsp + 2 || W->ndim != nsp + 2 || Y->ndim != nsp + 2 || k->transposed)
        return eng_err(ENG_STATUS_UNSUPPORTED, "conv ranks");
    int nhwc_ok = (!k->x_layout || k->x_layout == KRN_NN_LAYOUT_NHWC) && (!k->y_layout || k->y_layout == KRN_NN_LAYOUT_NHWC);
    if (!nhwc_ok || ((k->x_layout || k->y_layout) && (nsp != 2 || !q)) || k->has_residual || k->pool || k->dw_stride || k->act.kind)
        return eng_err(ENG_STATUS_UNSUPPORTED, "non-plain layout or fusion");
    if (!eng_tensor_numel(X) || !eng_tensor_numel(W) || !eng_tensor_numel(Y)) return eng_err(ENG_STATUS_UNSUPPORTED, "empty operand");
    s->cN = X->dims[0], s->cC = X->dims[1], s->cM = W->dims[0], s->cG = k->group;
    if (s->cG < 1 || s->cC % s->cG || s->cM % s->cG || W->dims[1] * s->cG != s->cC || Y->dims[1] != s->cM)
        return eng_err(ENG_STATUS_UNSUPPORTED, "channels do not match group %lld", (long long)s->cG);
    for (int i = 0; i < 3; i++) {
        int d = i - (3 - nsp);
        s->in[i] = d < 0 ? 1 : X->dims[2 + d];
        s->out[i] = d < 0 ? 1 : Y->dims[2 + d];
        s->k[i] = d < 0 ? 1 : W->dims[2 + d];
        s->st[i] = d < 0 ? 1 : k->strides[d];
        s->dl[i] = d < 0 ? 1 : k->dilations[d];
        s->pb[i] = d < 0 ? 0 : k->pads[d];
    }
    s->wconst = qd_const(c, iw) && (!wzp || qd_const(c, izw));
    int8_t *wsh = NULL;
    if (s->wconst) {
        if (!(wsh = malloc((size_t)eng_tensor_numel(W)))) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "shifted W");
        if (!qd_shift_weights(W, wzp, s->cM, eng_tensor_numel(W) / s->cM, wsh)) {
            free(wsh);
            return eng_err(ENG_STATUS_UNSUPPORTED, "W - w_zero_point leaves int8");
        }
    } else if (W->dtype != ENG_DTYPE_I8 || !qd_zp_none(c, izw)) {
        return eng_err(ENG_STATUS_UNSUPPORTED, "non-constant W that is not int8 without zero point");
    }
    eng_status est = ENG_STATUS_OK;
    if (!q && !qd_zp_none(c, 2)) { /* integer output with an x zero point: Y -= x_zp * S */
        s->comp = 1;
        int64_t osz = s->out[0] * s->out[1] * s->out[2];
        if (!(s->S = malloc((size_t)(s->cM * osz) * sizeof *s->S))) est = eng_err(ENG_STATUS_OUT_OF_MEMORY, "tap sums");
        else if (wsh && !qd_conv_sums(s, wsh)) est = eng_err(ENG_STATUS_OUT_OF_MEMORY, "tap sums");
    }
    /* plain layouts first; if oneDNN has only its reference or GEMM kernel for them, let it choose X / Y's
     * (counted reorders), and keep whichever ranks higher */
    if (est == ENG_STATUS_OK) {
        est = qd_conv_try(c, s, wsh, 0);
        int rank0 = est == ENG_STATUS_OK ? qd_conv_rank(s->pd) : -1;
        if (est != ENG_STATUS_OUT_OF_MEMORY && rank0 < 2) {
            eng_err_clear();
            qd_conv_drop_prim(s);
            eng_status e1 = qd_conv_try(c, s, wsh, 1);
            if (e1 == ENG_STATUS_OK && qd_conv_rank(s->pd) > rank0) {
                est = ENG_STATUS_OK;
            } else if (rank0 >= 0) {
                eng_err_clear();
                qd_conv_drop_prim(s);
                est = qd_conv_try(c, s, wsh, 0);
            } else {
                est = e1;
            }
        }
    }
    free(wsh);
    ENG_TRY(est);
    s->fast = 1;
    qd_describe_state(s, "");
    return ENG_STATUS_OK;
}

eng_status krn_cpu_qconv_init(krn_call *c) {
    qd_state *s = calloc(1, sizeof *s);
    if (!s) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "int8 conv state");
    c->state = s;
    const krn_conv_params *k = &((const krn_qconv_params *)c->params)->conv;
    eng_status st = qd_conv_build(c, s);
    if (st != ENG_STATUS_OK && (k->x_layout || k->y_layout)) { /* the reference loops read only plain layouts */
        krn_cpu_qdnnl_free(s);
        c->state = NULL;
        return eng_err_prefix(st, "int8 conv with channels-last activations: ");
    }
    if (st != ENG_STATUS_OK) qd_fallback(s, "conv");
    return ENG_STATUS_OK;
}

eng_status krn_cpu_qconv_exec(krn_call *c) {
    qd_state *s = c->state;
    if (!s || !s->fast) return krn_cpu_qconv_ref(c);
    const krn_qconv_params *p = c->params;
    int iw = p->qlinear ? 3 : 1;
    if (s->zsrc_arg) s->zs = qd_at_i(&c->in[s->ixzp], 0);
    if (s->zdst_arg) s->zd = qd_at_i(&c->in[7], 0);
    const void *bias = s->mbias ? c->in[8].data : NULL;
    ENG_TRY(qd_run(s, c, c->in[0].data, c->out[0].data, c->in[iw].data, bias, NULL));
    int32_t xz = s->comp ? qd_at_i(&c->in[s->ixzp], 0) : 0;
    if (!xz) return ENG_STATUS_OK;
    if (!s->wconst && !qd_conv_sums(s, c->in[iw].data)) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "tap sums");
    uint32_t *y = c->out[0].data;
    int64_t osz = s->out[0] * s->out[1] * s->out[2], planes = s->cN * s->cM;
    int nt = c->nthreads > 0 ? c->nthreads : 1;
#pragma omp parallel for num_threads(nt) if (nt > 1 && planes * osz > 65536)
    for (int64_t nm = 0; nm < planes; nm++) {
        const int32_t *S = s->S + (nm % s->cM) * osz;
        uint32_t *yp = y + nm * osz;
        for (int64_t i = 0; i < osz; i++) yp[i] -= (uint32_t)xz * (uint32_t)S[i];
    }
    return ENG_STATUS_OK;
}
