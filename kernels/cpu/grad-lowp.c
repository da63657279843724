/* grad-lowp.c - MatMulGrad in bf16 (mixed-precision training): dA = dY B^T and dB = A^T dY on oneDNN's bf16
 * matmul (brgemm, fp32 accumulation), with dA / dB written in the plan's dtype (fp32, or bf16 where the
 * precision pass stored them so).
 *
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
#include "../krn-nn.h"

eng_status krn_cpu_grad_matmul_exec(krn_call *c);

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
    /* the three operands as stored, and as bf16 buffers of the same layout */
    int64_t rows[3] = {g.M, g.M, g.K}, cols[3] = {g.N, g.K, g.N};
    dnnl_memory_desc_t bf[3];
    for (int i = 0; i < 3; i++) {
        dnnl_memory_desc_t plain;
        ENG_TRY(gm_md(&plain, &g, rows[i], cols[i], 0, krn_dnnl_dt(c->in[i].dtype)));
        ENG_TRY(gm_md(&bf[i], &g, rows[i], cols[i], 0, dnnl_bf16));
        ENG_TRY(krn_dnnl_io_reorder(&plain, &bf[i], 1, &s->cv[i], &s->buf[i]));
    }
    if (c->nout > 0 && c->out[0].dtype != ENG_DTYPE_UNDEFINED) { /* dA (M, K) = dY (M, N) . B^T (N, K) */
        dnnl_memory_desc_t bt, da;
        ENG_TRY(gm_md(&bt, &g, g.K, g.N, 1, dnnl_bf16));
        ENG_TRY(gm_md(&da, &g, g.M, g.K, 0, krn_dnnl_dt(c->out[0].dtype)));
        ENG_TRY(gm_build(&s->p[0], &bf[GM_DY], &bt, &da));
    }
    if (c->nout > 1 && c->out[1].dtype != ENG_DTYPE_UNDEFINED) { /* dB (K, N) = A^T (K, M) . dY (M, N) */
        dnnl_memory_desc_t at, db;
        ENG_TRY(gm_md(&at, &g, g.M, g.K, 1, dnnl_bf16));
        ENG_TRY(gm_md(&db, &g, g.K, g.N, 0, krn_dnnl_dt(c->out[1].dtype)));
        ENG_TRY(gm_build(&s->p[1], &at, &bf[GM_DY], &db));
    }
    const gm_prim *any = s->p[0].pd ? &s->p[0] : &s->p[1];
    snprintf(s->desc, sizeof s->desc, "%s (bf16 dA, dB)%s", any->pd ? krn_dnnl_impl_name(any->pd) : "-",
             s->buf[0] || s->buf[1] || s->buf[2] ? " +convert" : "");
    return ENG_STATUS_OK;
}

static eng_status gm_init(krn_call *c) {
    if (!c->compute) return ENG_STATUS_OK; /* fp32: the sgemm kernel, no state */
    if (!gm_compute_ok(c, c->compute))
        return eng_err(ENG_STATUS_INTERNAL, "MatMulGrad cannot compute in %s here", eng_dtype_name(c->compute));
    gm_state *s = calloc(1, sizeof *s);
    if (!s) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "MatMulGrad state");
    krn_dnnl_set_threads(c->nthreads);
    eng_status st = gm_init_state(c, s);
    if (st != ENG_STATUS_OK) {
        gm_free(s);
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

const krn_kernel krn_cpu_grad_lowp_kernels[] = {
    {"grad_matmul", gm_init, gm_exec, gm_free, gm_describe, gm_compute_ok},
    {NULL},
};
