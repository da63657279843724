/* grad-lowp.c - the gradients of matmuls and convolutions in bf16 (mixed-precision training), on oneDNN's bf16
 * kernels with fp32 accumulation; outputs in the plan's dtype (fp32, or bf16 where the precision pass stored
 * them so). The fp32 kernels (grad-nn.c: OpenBLAS) stay for everything these do not take.
 *
 * MatMulGrad: dA = dY B^T and dB = A^T dY on the bf16 matmul (brgemm); fp32 plans use the same primitives in f32.
 * Shapes taken (compute_ok): B of rank 2 (a dense layer's kernel: A's leading dims collapse into rows, so dB sums
 * over the whole batch in one product), or A and B of the same rank >= 3 with equal batch dims (attention's
 * batched products). Anything else (broadcast batch dims, 1-D operands) keeps the fp32 sgemm kernel.
 * Each float32 operand is converted to bf16 once per run (a counted reorder into a buffer of the same layout);
 * the transposes are strides on those buffers, which oneDNN's brgemm reads directly.
 */
#include <dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernel.h"
#include "../krn-grad.h"
#include "../krn-nn.h"
#include "nn-conv-impl.h"

eng_status krn_cpu_grad_matmul_exec(krn_call *c);
eng_status krn_cpu_grad_conv_exec(krn_call *c);
int krn_cpu_dw_conv_grad_takes(const krn_call *c, const krn_conv_params *p);
int krn_cpu_dw_conv_grad_weights(const krn_call *c, const krn_conv_params *p, float *dw, float *db);

enum { GM_DY = 0, GM_A = 1, GM_B = 2 };

typedef struct gm_prim {
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t prim;
    dnnl_memory_t msrc, mwei, mdst, mscratch;
} gm_prim;

typedef struct gm_state {
    krn_dnnl_reorder cv[3]; /* f32 -> bf16 of dy, A, B (when given in f32) */
    void *buf[3];
    gm_prim p[2];           /* dA, dB (prim NULL when that output is omitted) */
    char desc[160];
} gm_state;

static void gm_prim_free(gm_prim *p) {
    if (p->prim) dnnl_primitive_destroy(p->prim);
    if (p->pd) dnnl_primitive_desc_destroy(p->pd);
    if (p->msrc) dnnl_memory_destroy(p->msrc);
    if (p->mwei) dnnl_memory_destroy(p->mwei);
    if (p->mdst) dnnl_memory_destroy(p->mdst);
    if (p->mscratch) dnnl_memory_destroy(p->mscratch);
}

static void gm_free(void *v) {
    gm_state *s = v;
    if (!s) return;
    for (int i = 0; i < 3; i++) {
        krn_dnnl_reorder_free(&s->cv[i]);
        eng_free(s->buf[i]);
    }
    gm_prim_free(&s->p[0]);
    gm_prim_free(&s->p[1]);
    free(s);
}

/* Rows / inner / cols of the products: dY (.., M, N), A (.., M, K), B (.., K, N); nb batch dims (0 when B has rank
 * 2 and A's leading dims fold into M). */
typedef struct gm_geo {
    int nb;
    int64_t batch[ENG_MAX_DIMS];
    int64_t M, K, N;
} gm_geo;

static int gm_geo_get(const krn_call *c, gm_geo *g) {
    const eng_tensor *a = &c->in[GM_A], *b = &c->in[GM_B];
    memset(g, 0, sizeof *g);
    if (a->ndim < 2 || b->ndim < 2 || a->dims[a->ndim - 1] != b->dims[b->ndim - 2]) return 0;
    g->K = a->dims[a->ndim - 1], g->N = b->dims[b->ndim - 1];
    if (b->ndim == 2) {
        g->M = eng_tensor_numel(a) / (g->K ? g->K : 1);
        return 1;
    }
    if (a->ndim != b->ndim || a->ndim - 2 > DNNL_MAX_NDIMS - 2) return 0;
    for (int d = 0; d < a->ndim - 2; d++) {
        if (a->dims[d] != b->dims[d]) return 0;
        g->batch[g->nb++] = a->dims[d];
    }
    g->M = a->dims[a->ndim - 2];
    return 1;
}

static int gm_compute_ok(const krn_call *c, eng_dtype dt) {
    gm_geo g;
    if (dt != ENG_DTYPE_BF16 || c->nin != 3) return 0;
    for (int i = 0; i < 3; i++)
        if (!krn_lowp_io(c->in[i].dtype)) return 0;
    for (int i = 0; i < c->nout; i++)
        if (c->out[i].dtype != ENG_DTYPE_UNDEFINED && !krn_lowp_io(c->out[i].dtype)) return 0;
    return gm_geo_get(c, &g) && g.M > 0 && g.K > 0 && g.N > 0;
}

/* A matrix desc (batch dims, then rows x cols) over a row-major (.., R, C) buffer, read transposed when t. */
static eng_status gm_md(dnnl_memory_desc_t *md, const gm_geo *g, int64_t rows, int64_t cols, int t, dnnl_data_type_t dt) {
    int nd = g->nb + 2;
    dnnl_dims_t dims, st;
    for (int d = 0; d < g->nb; d++) dims[d] = g->batch[d];
    dims[nd - 2] = t ? cols : rows, dims[nd - 1] = t ? rows : cols;
    st[nd - 1] = t ? cols : 1;
    st[nd - 2] = t ? 1 : cols;
    int64_t s = rows * cols;
    for (int d = g->nb - 1; d >= 0; d--) st[d] = s, s *= g->batch[d];
    KRN_DNNL_CHECK(dnnl_memory_desc_init_by_strides(md, nd, dims, dt, st));
    return ENG_STATUS_OK;
}

static eng_status gm_build(gm_prim *p, const dnnl_memory_desc_t *src, const dnnl_memory_desc_t *wei,
                           const dnnl_memory_desc_t *dst) {
    dnnl_matmul_desc_t md;
    KRN_DNNL_CHECK(dnnl_matmul_desc_init(&md, src, wei, NULL, dst));
    ENG_TRY(krn_dnnl_prim(&md, NULL, NULL, &p->pd, &p->prim, &p->mscratch));
    if (krn_dnnl_is_ref(p->pd))
        return eng_err(ENG_STATUS_UNSUPPORTED, "oneDNN has only a reference bf16 matmul for this gradient");
    dnnl_engine_t eng;
    ENG_TRY(krn_dnnl_engine(&eng));
    KRN_DNNL_CHECK(dnnl_memory_create(&p->msrc, src, eng, DNNL_MEMORY_NONE));
    KRN_DNNL_CHECK(dnnl_memory_create(&p->mwei, wei, eng, DNNL_MEMORY_NONE));
    KRN_DNNL_CHECK(dnnl_memory_create(&p->mdst, dst, eng, DNNL_MEMORY_NONE));
    return ENG_STATUS_OK;
}

static eng_status gm_init_state(krn_call *c, gm_state *s) {
    gm_geo g;
    gm_geo_get(c, &g);
    const dnnl_data_type_t cdt = c->compute == ENG_DTYPE_BF16 ? dnnl_bf16 : dnnl_f32;
    /* the three operands as stored, and as bf16 buffers of the same layout */
    int64_t rows[3] = {g.M, g.M, g.K}, cols[3] = {g.N, g.K, g.N};
    dnnl_memory_desc_t bf[3];
    for (int i = 0; i < 3; i++) {
        dnnl_memory_desc_t plain;
        ENG_TRY(gm_md(&plain, &g, rows[i], cols[i], 0, krn_dnnl_dt(c->in[i].dtype)));
        ENG_TRY(gm_md(&bf[i], &g, rows[i], cols[i], 0, cdt));
        ENG_TRY(krn_dnnl_io_reorder(&plain, &bf[i], 1, &s->cv[i], &s->buf[i]));
    }
    if (c->nout > 0 && c->out[0].dtype != ENG_DTYPE_UNDEFINED) { /* dA (M, K) = dY (M, N) . B^T (N, K) */
        dnnl_memory_desc_t bt, da;
        ENG_TRY(gm_md(&bt, &g, g.K, g.N, 1, cdt));
        ENG_TRY(gm_md(&da, &g, g.M, g.K, 0, krn_dnnl_dt(c->out[0].dtype)));
        ENG_TRY(gm_build(&s->p[0], &bf[GM_DY], &bt, &da));
    }
    if (c->nout > 1 && c->out[1].dtype != ENG_DTYPE_UNDEFINED) { /* dB (K, N) = A^T (K, M) . dY (M, N) */
        dnnl_memory_desc_t at, db;
        ENG_TRY(gm_md(&at, &g, g.M, g.K, 1, cdt));
        ENG_TRY(gm_md(&db, &g, g.K, g.N, 0, krn_dnnl_dt(c->out[1].dtype)));
        ENG_TRY(gm_build(&s->p[1], &at, &bf[GM_DY], &db));
    }
    const gm_prim *any = s->p[0].pd ? &s->p[0] : &s->p[1];
    snprintf(s->desc, sizeof s->desc, "%s (%s dA, dB)%s", any->pd ? krn_dnnl_impl_name(any->pd) : "-",
             cdt == dnnl_bf16 ? "bf16" : "f32",
             s->buf[0] || s->buf[1] || s->buf[2] ? " +convert" : "");
    return ENG_STATUS_OK;
}

/* fp32 takes the same oneDNN matmuls where the shapes allow (brgemm: several times OpenBLAS's per-batch sgemm on
 * a transformer's gradients), else the sgemm kernel (grad-nn.c, no state). */
static int gm_f32_ok(const krn_call *c) {
    gm_geo g;
    if (c->nin != 3 || getenv("TENSORD_GRAD_SGEMM")) return 0;
    for (int i = 0; i < 3; i++)
        if (c->in[i].dtype != ENG_DTYPE_F32) return 0;
    return gm_geo_get(c, &g) && g.M > 0 && g.K > 0 && g.N > 0;
}

static eng_status gm_init(krn_call *c) {
    if (!c->compute && !gm_f32_ok(c)) return ENG_STATUS_OK;
    if (c->compute && !gm_compute_ok(c, c->compute))
        return eng_err(ENG_STATUS_INTERNAL, "MatMulGrad cannot compute in %s here", eng_dtype_name(c->compute));
    gm_state *s = calloc(1, sizeof *s);
    if (!s) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "MatMulGrad state");
    krn_dnnl_set_threads(c->nthreads);
    eng_status st = gm_init_state(c, s);
    if (st != ENG_STATUS_OK) {
        gm_free(s);
        if (!c->compute) { /* fp32: the sgemm kernel takes what oneDNN did not */
            eng_err_clear();
            return ENG_STATUS_OK;
        }
        return st;
    }
    c->state = s;
    return ENG_STATUS_OK;
}

static eng_status gm_run(gm_prim *p, dnnl_stream_t stream, const void *src, const void *wei, void *dst) {
    if (!p->prim) return ENG_STATUS_OK;
    KRN_DNNL_CHECK(dnnl_memory_set_data_handle(p->msrc, (void *)src));
    KRN_DNNL_CHECK(dnnl_memory_set_data_handle(p->mwei, (void *)wei));
    KRN_DNNL_CHECK(dnnl_memory_set_data_handle(p->mdst, dst));
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, p->msrc}, {DNNL_ARG_WEIGHTS, p->mwei}, {DNNL_ARG_DST, p->mdst}};
    int na = 3;
    if (p->mscratch) args[na].arg = DNNL_ARG_SCRATCHPAD, args[na++].memory = p->mscratch;
    KRN_DNNL_CHECK(dnnl_primitive_execute(p->prim, stream, na, args));
    return ENG_STATUS_OK;
}

static eng_status gm_exec(krn_call *c) {
    gm_state *s = c->state;
    if (!s) return krn_cpu_grad_matmul_exec(c);
    dnnl_stream_t stream;
    ENG_TRY(krn_dnnl_stream(&stream));
    krn_dnnl_set_threads(c->nthreads);
    const void *op[3];
    for (int i = 0; i < 3; i++) {
        op[i] = c->in[i].data;
        if (s->buf[i]) {
            ENG_TRY(krn_dnnl_reorder_run(&s->cv[i], stream, op[i], s->buf[i]));
            op[i] = s->buf[i];
        }
    }
    ENG_TRY(gm_run(&s->p[0], stream, op[GM_DY], op[GM_B], c->nout > 0 ? c->out[0].data : NULL));
    ENG_TRY(gm_run(&s->p[1], stream, op[GM_A], op[GM_DY], c->nout > 1 ? c->out[1].data : NULL));
    KRN_DNNL_CHECK(dnnl_stream_wait(stream));
    return ENG_STATUS_OK;
}

static void gm_describe(const krn_call *c, krn_impl_info *info) {
    const gm_state *s = c->state;
    memset(info, 0, sizeof *info);
    if (!s) {
        krn_str_copy(info->impl, sizeof info->impl, "openblas sgemm");
        return;
    }
    krn_str_copy(info->impl, sizeof info->impl, s->desc);
    info->reorders = !!s->buf[0] + !!s->buf[1] + !!s->buf[2];
}

/* ---- ConvGrad(dy, x, w) -> dx, dw, db: oneDNN's backward-data and backward-weights convolutions, in bf16 (a bf16
 * plan) or float32, built with a forward-training primitive as their hint; every operand in the layouts oneDNN
 * picks (format `any`), reached by counted reorders from the plan's plain tensors (the conversion to bf16
 * included); dw / db accumulate and come out in float32. A float32 ConvGrad that oneDNN can only run with its
 * reference kernel, or whose C*K is small enough for grad-nn.c's register-tiled dw (first layers), stays on
 * im2col + sgemm (grad-nn.c). ---- */

typedef struct cg_io {
    krn_dnnl_reorder r;
    void *buf;
} cg_io;

typedef struct cg_state {
    dnnl_primitive_desc_t fwd, bd, bw;
    dnnl_primitive_t pbd, pbw;
    dnnl_memory_t sbd, sbw; /* scratchpads */
    dnnl_memory_t m[7];     /* bd: diff_dst, weights, diff_src; bw: src, diff_dst, diff_weights, diff_bias */
    cg_io io[7];            /* reorders into / out of those, where the plan's layout or dtype differs */
    int own_dw;             /* depthwise dW / dB by krn_cpu_dw_conv_grad_weights instead of a gemm primitive */
    int dy_shared;          /* both primitives take dy in the same layout: converted once, for backward-data */
    char desc[192];
} cg_state;

enum { CG_BD_DY, CG_BD_W, CG_BD_DX, CG_BW_X, CG_BW_DY, CG_BW_DW, CG_BW_DB };

static void cg_free(void *v) {
    cg_state *s = v;
    if (!s) return;
    if (s->pbd) dnnl_primitive_destroy(s->pbd);
    if (s->pbw) dnnl_primitive_destroy(s->pbw);
    if (s->fwd) dnnl_primitive_desc_destroy(s->fwd);
    if (s->bd) dnnl_primitive_desc_destroy(s->bd);
    if (s->bw) dnnl_primitive_desc_destroy(s->bw);
    if (s->sbd) dnnl_memory_destroy(s->sbd);
    if (s->sbw) dnnl_memory_destroy(s->sbw);
    for (int i = 0; i < 7; i++) {
        if (s->m[i]) dnnl_memory_destroy(s->m[i]);
        krn_dnnl_reorder_free(&s->io[i].r);
        eng_free(s->io[i].buf);
    }
    free(s);
}

/* Shapes and dtypes oneDNN's ConvGrad takes here: plain layouts, 1-3 spatial dims, float32 or bf16 tensors. */
static int cg_shapes_ok(const krn_call *c) {
    const krn_conv_params *p = c->params ? &((const krn_conv_grad_params *)c->params)->conv : NULL;
    if (!p || c->nin != 3 || p->x_layout || p->y_layout) return 0;
    int nsp = c->in[1].ndim - 2;
    if (nsp < 1 || nsp > 3 || c->in[0].ndim != c->in[1].ndim || c->in[2].ndim != c->in[1].ndim) return 0;
    for (int i = 0; i < 3; i++)
        if (!krn_lowp_io(c->in[i].dtype) || eng_tensor_numel(&c->in[i]) == 0) return 0;
    for (int i = 0; i < c->nout; i++)
        if (c->out[i].dtype != ENG_DTYPE_UNDEFINED && (i == 0 ? !krn_lowp_io(c->out[i].dtype) : c->out[i].dtype != ENG_DTYPE_F32))
            return 0;
    return 1;
}

static int cg_compute_ok(const krn_call *c, eng_dtype dt) { return dt == ENG_DTYPE_BF16 && cg_shapes_ok(c); }

/* The plan's md of a tensor: plain, its own dtype; weights grouped (G, M/G, C/G, k...) when G > 1. */
static eng_status cg_plain_md(dnnl_memory_desc_t *md, const eng_tensor *t, int64_t G) {
    dnnl_dims_t d;
    int nd = t->ndim;
    if (G > 1) {
        d[0] = G, d[1] = t->dims[0] / G;
        for (int i = 1; i < nd; i++) d[i + 1] = t->dims[i];
        nd++;
    } else {
        for (int i = 0; i < nd; i++) d[i] = t->dims[i];
    }
    KRN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(md, nd, d, krn_dnnl_dt(t->dtype), conv_plain_tags[nd]));
    return ENG_STATUS_OK;
}

/* md with t's dims (grouped for weights), dtype dt, format `any`. */
static eng_status cg_any_md(dnnl_memory_desc_t *md, const dnnl_memory_desc_t *plain, dnnl_data_type_t dt) {
    KRN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(md, plain->ndims, plain->dims, dt, dnnl_format_tag_any));
    return ENG_STATUS_OK;
}

static eng_status cg_mem(cg_state *s, int k, const dnnl_memory_desc_t *plan, const dnnl_memory_desc_t *prim, int input) {
    dnnl_engine_t eng;
    ENG_TRY(krn_dnnl_engine(&eng));
    ENG_TRY(krn_dnnl_io_reorder(plan, prim, input, &s->io[k].r, &s->io[k].buf));
    KRN_DNNL_CHECK(dnnl_memory_create(&s->m[k], prim, eng, s->io[k].buf ? s->io[k].buf : DNNL_MEMORY_NONE));
    return ENG_STATUS_OK;
}

static eng_status cg_scratch(const_dnnl_primitive_desc_t pd, dnnl_memory_t *m) {
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    if (!smd || dnnl_memory_desc_get_size(smd) == 0) return ENG_STATUS_OK;
    dnnl_engine_t eng;
    ENG_TRY(krn_dnnl_engine(&eng));
    KRN_DNNL_CHECK(dnnl_memory_create(m, smd, eng, DNNL_MEMORY_ALLOCATE));
    return ENG_STATUS_OK;
}

static eng_status cg_pd(dnnl_primitive_desc_t *pd, const void *desc, const_dnnl_primitive_desc_t hint) {
    dnnl_engine_t eng;
    ENG_TRY(krn_dnnl_engine(&eng));
    dnnl_primitive_attr_t a;
    KRN_DNNL_CHECK(dnnl_primitive_attr_create(&a));
    dnnl_status_t st = dnnl_primitive_attr_set_scratchpad_mode(a, dnnl_scratchpad_mode_user);
    if (st == dnnl_success) st = dnnl_primitive_desc_create(pd, desc, a, eng, hint);
    dnnl_primitive_attr_destroy(a);
    if (st != dnnl_success) {
        *pd = NULL;
        return krn_dnnl_fail(st, "dnnl_primitive_desc_create", __func__, __FILE__, __LINE__);
    }
    if (krn_dnnl_is_ref(*pd)) return eng_err(ENG_STATUS_UNSUPPORTED, "oneDNN has only a reference conv gradient here");
    return ENG_STATUS_OK;
}

static eng_status cg_build(krn_call *c, cg_state *s, dnnl_data_type_t dt) {
    const krn_conv_params *p = &((const krn_conv_grad_params *)c->params)->conv;
    const eng_tensor *dy = &c->in[0], *x = &c->in[1], *w = &c->in[2];
    int nsp = x->ndim - 2;
    int64_t G = p->group > 0 ? p->group : 1;
    dnnl_dims_t st, dl, pl, pr;
    for (int i = 0; i < nsp; i++) {
        st[i] = p->strides[i], dl[i] = p->dilations[i] - 1, pl[i] = p->pads[i], pr[i] = p->pads[nsp + i];
    }
    dnnl_memory_desc_t xp, wp, dyp, xa, wa, dya, dxa, dwa, bmd;
    ENG_TRY(cg_plain_md(&xp, x, 1));
    ENG_TRY(cg_plain_md(&wp, w, G));
    ENG_TRY(cg_plain_md(&dyp, dy, 1));
    ENG_TRY(cg_any_md(&xa, &xp, dt));
    ENG_TRY(cg_any_md(&wa, &wp, dt));
    ENG_TRY(cg_any_md(&dya, &dyp, dt));
    int want_dx = c->nout > 0 && c->out[0].dtype != ENG_DTYPE_UNDEFINED;
    int want_dw = c->nout > 1 && c->out[1].dtype != ENG_DTYPE_UNDEFINED;
    int want_db = c->nout > 2 && c->out[2].dtype != ENG_DTYPE_UNDEFINED;
    ENG_TRY(cg_any_md(&dxa, &xp, want_dx ? krn_dnnl_dt(c->out[0].dtype) : dnnl_f32));
    ENG_TRY(cg_any_md(&dwa, &wp, dnnl_f32));
    dnnl_dims_t bd = {w->dims[0]};
    KRN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&bmd, 1, bd, dnnl_f32, dnnl_a));
    dnnl_convolution_desc_t fd, bdd, bwd;
    KRN_DNNL_CHECK(dnnl_dilated_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct, &xa, &wa,
                                                              want_db ? &bmd : NULL, &dya, st, dl, pl, pr));
    ENG_TRY(cg_pd(&s->fwd, &fd, NULL));
    const char *impl = "-";
    if (want_dx) {
        KRN_DNNL_CHECK(dnnl_dilated_convolution_backward_data_desc_init(&bdd, dnnl_convolution_direct, &dxa, &wa, &dya, st, dl, pl, pr));
        ENG_TRY(cg_pd(&s->bd, &bdd, s->fwd));
        KRN_DNNL_CHECK(dnnl_primitive_create(&s->pbd, s->bd));
        ENG_TRY(cg_scratch(s->bd, &s->sbd));
        dnnl_memory_desc_t dxp;
        ENG_TRY(cg_plain_md(&dxp, &c->out[0], 1));
        ENG_TRY(cg_mem(s, CG_BD_DY, &dyp, dnnl_primitive_desc_query_md(s->bd, dnnl_query_diff_dst_md, 0), 1));
        ENG_TRY(cg_mem(s, CG_BD_W, &wp, dnnl_primitive_desc_query_md(s->bd, dnnl_query_weights_md, 0), 1));
        ENG_TRY(cg_mem(s, CG_BD_DX, &dxp, dnnl_primitive_desc_query_md(s->bd, dnnl_query_diff_src_md, 0), 0));
        impl = krn_dnnl_impl_name(s->bd);
    }
    /* depthwise 2-D float32: dW / dB by our kernel (krn_cpu_dw_conv_grad_weights); oneDNN 2.6 has a fast one only
     * for 3x3 (and only in nChw16c, which costs two more reorders), else a per-group gemm 15-50x slower */
    s->own_dw = (want_dw || want_db) && dt == dnnl_f32 && krn_cpu_dw_conv_grad_takes(c, p);
    if (!s->own_dw && (want_dw || want_db)) {
        /* grouped 2-D: ask for the channel-blocked layout first; with `any` and the forward's NHWC hint oneDNN 2.6
         * settles for its per-group gemm */
        if (G > 1 && nsp == 2 && x->dims[1] % 16 == 0 && w->dims[0] % 16 == 0) {
            dnnl_memory_desc_t xb = xa, dyb = dya;
            KRN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&xb, xa.ndims, xa.dims, xa.data_type, dnnl_aBcd16b));
            KRN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&dyb, dya.ndims, dya.dims, dya.data_type, dnnl_aBcd16b));
            KRN_DNNL_CHECK(dnnl_dilated_convolution_backward_weights_desc_init(&bwd, dnnl_convolution_direct, &xb, &dwa,
                                                                               want_db ? &bmd : NULL, &dyb, st, dl, pl, pr));
            if (cg_pd(&s->bw, &bwd, s->fwd) != ENG_STATUS_OK || strstr(krn_dnnl_impl_name(s->bw), "gemm")) {
                if (s->bw) dnnl_primitive_desc_destroy(s->bw);
                s->bw = NULL;
            }
        }
        KRN_DNNL_CHECK(dnnl_dilated_convolution_backward_weights_desc_init(&bwd, dnnl_convolution_direct, &xa, &dwa,
                                                                           want_db ? &bmd : NULL, &dya, st, dl, pl, pr));
        if (!s->bw) ENG_TRY(cg_pd(&s->bw, &bwd, s->fwd));
        KRN_DNNL_CHECK(dnnl_primitive_create(&s->pbw, s->bw));
        ENG_TRY(cg_scratch(s->bw, &s->sbw));
        ENG_TRY(cg_mem(s, CG_BW_X, &xp, dnnl_primitive_desc_query_md(s->bw, dnnl_query_src_md, 0), 1));
        const dnnl_memory_desc_t *bwdy = dnnl_primitive_desc_query_md(s->bw, dnnl_query_diff_dst_md, 0);
        s->dy_shared = s->pbd && s->io[CG_BD_DY].r.prim &&
                       dnnl_memory_desc_equal(dnnl_primitive_desc_query_md(s->bd, dnnl_query_diff_dst_md, 0), bwdy);
        if (s->dy_shared) { /* the layout backward-data converted dy into: read it from there */
            dnnl_engine_t eng;
            ENG_TRY(krn_dnnl_engine(&eng));
            KRN_DNNL_CHECK(dnnl_memory_create(&s->m[CG_BW_DY], bwdy, eng, s->io[CG_BD_DY].buf));
        } else {
            ENG_TRY(cg_mem(s, CG_BW_DY, &dyp, bwdy, 1));
        }
        dnnl_memory_desc_t dwp;
        ENG_TRY(cg_plain_md(&dwp, want_dw ? &c->out[1] : w, G));
        dwp.data_type = dnnl_f32;
        ENG_TRY(cg_mem(s, CG_BW_DW, &dwp, dnnl_primitive_desc_query_md(s->bw, dnnl_query_diff_weights_md, 0), 0));
        if (!want_dw && !s->io[CG_BW_DW].buf) { /* dw omitted but the primitive writes it: give it a buffer */
            size_t n = dnnl_memory_desc_get_size(&dwp);
            if (!(s->io[CG_BW_DW].buf = eng_alloc(n ? n : 64))) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "ConvGrad dw");
        }
        if (want_db) {
            dnnl_engine_t eng;
            ENG_TRY(krn_dnnl_engine(&eng));
            KRN_DNNL_CHECK(dnnl_memory_create(&s->m[CG_BW_DB], &bmd, eng, DNNL_MEMORY_NONE));
        }
        if (!want_dx) impl = krn_dnnl_impl_name(s->bw);
    }
    if (s->own_dw && !want_dx) impl = "depthwise dW";
    int nre = 0;
    for (int i = 0; i < 7; i++) nre += s->io[i].r.prim != NULL;
    snprintf(s->desc, sizeof s->desc, "%s (%s dx, dw%s) +%d reorders", impl, dt == dnnl_bf16 ? "bf16" : "f32",
             s->own_dw ? " depthwise own" : "", nre);
    return ENG_STATUS_OK;
}

/* float32: whether oneDNN should run it (else im2col + sgemm, grad-nn.c): plain float32 operands, and a grouped
 * convolution or a weight gradient wider than grad-nn.c's register-tiled first-layer case. */
static int cg_f32_wanted(const krn_call *c) {
    if (getenv("TENSORD_CONVGRAD_IM2COL") || !cg_shapes_ok(c)) return 0;
    for (int i = 0; i < 3; i++)
        if (c->in[i].dtype != ENG_DTYPE_F32) return 0;
    const krn_conv_params *p = &((const krn_conv_grad_params *)c->params)->conv;
    int64_t G = p->group > 0 ? p->group : 1, ck = c->in[1].dims[1] / G;
    for (int d = 2; d < c->in[2].ndim; d++) ck *= c->in[2].dims[d];
    return G > 1 || ck > KRN_CONV_DW_SMALL_MAX_CK; /* grouped / depthwise: oneDNN's dw kernels, never per group */
}

static eng_status cg_init(krn_call *c) {
    if (!c->compute && !cg_f32_wanted(c)) return ENG_STATUS_OK; /* im2col + sgemm (grad-nn.c), no state */
    if (c->compute && !cg_compute_ok(c, c->compute))
        return eng_err(ENG_STATUS_INTERNAL, "ConvGrad cannot compute in %s here", eng_dtype_name(c->compute));
    cg_state *s = calloc(1, sizeof *s);
    if (!s) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "ConvGrad state");
    krn_dnnl_set_threads(c->nthreads);
    eng_status st = cg_build(c, s, c->compute ? dnnl_bf16 : dnnl_f32);
    if (st != ENG_STATUS_OK) {
        cg_free(s);
        if (!c->compute) return ENG_STATUS_OK; /* float32: oneDNN has no fast kernel for it; im2col + sgemm does */
        return eng_err_prefix(st, "bf16 ConvGrad: ");
    }
    c->state = s;
    return ENG_STATUS_OK;
}

/* Bind memory k to `data` (through its reorder when it has one: inputs are converted now, outputs later). */
static eng_status cg_in(cg_state *s, int k, dnnl_stream_t stream, const void *data) {
    if (s->io[k].r.prim) return krn_dnnl_reorder_run(&s->io[k].r, stream, data, s->io[k].buf);
    KRN_DNNL_CHECK(dnnl_memory_set_data_handle(s->m[k], (void *)data));
    return ENG_STATUS_OK;
}

static eng_status cg_exec(krn_call *c) {
    cg_state *s = c->state;
    if (!s) return krn_cpu_grad_conv_exec(c);
    dnnl_stream_t stream;
    ENG_TRY(krn_dnnl_stream(&stream));
    krn_dnnl_set_threads(c->nthreads);
    if (s->pbd) {
        ENG_TRY(cg_in(s, CG_BD_DY, stream, c->in[0].data));
        ENG_TRY(cg_in(s, CG_BD_W, stream, c->in[2].data));
        if (!s->io[CG_BD_DX].r.prim) KRN_DNNL_CHECK(dnnl_memory_set_data_handle(s->m[CG_BD_DX], c->out[0].data));
        dnnl_exec_arg_t a[4] = {{DNNL_ARG_DIFF_DST, s->m[CG_BD_DY]}, {DNNL_ARG_WEIGHTS, s->m[CG_BD_W]},
                                {DNNL_ARG_DIFF_SRC, s->m[CG_BD_DX]}, {DNNL_ARG_SCRATCHPAD, s->sbd}};
        KRN_DNNL_CHECK(dnnl_primitive_execute(s->pbd, stream, s->sbd ? 4 : 3, a));
        if (s->io[CG_BD_DX].r.prim) ENG_TRY(krn_dnnl_reorder_run(&s->io[CG_BD_DX].r, stream, s->io[CG_BD_DX].buf, c->out[0].data));
    }
    if (s->own_dw) {
        const krn_conv_params *p = &((const krn_conv_grad_params *)c->params)->conv;
        float *dw = c->nout > 1 ? c->out[1].data : NULL, *db = c->nout > 2 ? c->out[2].data : NULL;
        if ((dw || db) && !krn_cpu_dw_conv_grad_weights(c, p, dw, db))
            return eng_err(ENG_STATUS_OUT_OF_MEMORY, "depthwise ConvGrad: packing buffers"); /* shape checked at init */
    }
    if (s->pbw) {
        void *dw = c->nout > 1 && c->out[1].data ? c->out[1].data : s->io[CG_BW_DW].buf;
        ENG_TRY(cg_in(s, CG_BW_X, stream, c->in[1].data));
        if (!s->dy_shared) ENG_TRY(cg_in(s, CG_BW_DY, stream, c->in[0].data));
        if (!s->io[CG_BW_DW].r.prim) KRN_DNNL_CHECK(dnnl_memory_set_data_handle(s->m[CG_BW_DW], dw));
        dnnl_exec_arg_t a[5] = {{DNNL_ARG_SRC, s->m[CG_BW_X]}, {DNNL_ARG_DIFF_DST, s->m[CG_BW_DY]},
                                {DNNL_ARG_DIFF_WEIGHTS, s->m[CG_BW_DW]}};
        int na = 3;
        if (s->m[CG_BW_DB]) {
            KRN_DNNL_CHECK(dnnl_memory_set_data_handle(s->m[CG_BW_DB], c->out[2].data));
            a[na].arg = DNNL_ARG_DIFF_BIAS, a[na++].memory = s->m[CG_BW_DB];
        }
        if (s->sbw) a[na].arg = DNNL_ARG_SCRATCHPAD, a[na++].memory = s->sbw;
        KRN_DNNL_CHECK(dnnl_primitive_execute(s->pbw, stream, na, a));
        if (s->io[CG_BW_DW].r.prim && c->nout > 1 && c->out[1].data)
            ENG_TRY(krn_dnnl_reorder_run(&s->io[CG_BW_DW].r, stream, s->io[CG_BW_DW].buf, c->out[1].data));
    }
    KRN_DNNL_CHECK(dnnl_stream_wait(stream));
    return ENG_STATUS_OK;
}

static void cg_describe(const krn_call *c, krn_impl_info *info) {
    const cg_state *s = c->state;
    memset(info, 0, sizeof *info);
    if (!s) {
        krn_str_copy(info->impl, sizeof info->impl, "im2col + openblas sgemm");
        return;
    }
    krn_str_copy(info->impl, sizeof info->impl, s->desc);
    for (int i = 0; i < 7; i++) info->reorders += s->io[i].r.prim != NULL;
}

const krn_kernel krn_cpu_grad_lowp_kernels[] = {
    {"grad_matmul", gm_init, gm_exec, gm_free, gm_describe, gm_compute_ok},
    {"grad_conv", cg_init, cg_exec, cg_free, cg_describe, cg_compute_ok},
    {NULL},
};
