/* nn-deconv.c - ConvTranspose: oneDNN's deconvolution primitive for float32, reference loops for float64 and
 * for whatever oneDNN refuses.
 *
 * Geometry comes resolved from engine/ops/nn.c's infer: output_padding and output_shape are already folded into
 * pads and Y's dims, so Y = s*(X-1) + output_padding + ext - pads along each spatial dim (ext = (k-1)*d+1).
 * oneDNN reads that as a forward conv over Y (floor((Y + pads - ext) / s) + 1 == X), which holds for any
 * output_padding < stride; other geometries (an output_shape larger than the natural size) take the loops.
 * ONNX's W is (C, M/group, k...): for oneDNN that is the plain tag "iohw" (group 1, weights (M, C, k...)) or
 * "giohw" (weights (G, M/G, C/G, k...)), in 1-3 spatial dims. W is always handed to oneDNN in the layout it
 * chooses: a constant W is reordered once in init, a non-constant one on every exec (a counted reorder) unless
 * that layout is ONNX's own.
 * X and Y stay plain; if oneDNN has only a reference kernel for plain X/Y (or, in 2-D, only its GEMM-based one),
 * the primitive is rebuilt with format `any` for them and X/Y go through counted reorders; if that gives nothing
 * better the plain one is kept. describe() reports the implementation, layouts and reorders, and marks reference
 * kernels (oneDNN's, or the loops here for float32) slow: the planner says so once per plan step on stderr.
 * TENSORD_CONV_REF (set, any value) forces the reference loops, as it does for Conv; TENSORD_CONV_KEEP_REF keeps
 * a oneDNN reference kernel without trying other layouts.
 * Reference loops: scatter form y[n, g*Mg+m, i*s-pb+k*d] += x[n, g*Cg+c, i] * W[g*Cg+c, m, k], parallel over
 * (n, output channel), 1-3 spatial dims padded to 3-D (missing dims are 1).
 * State: one primitive and its buffers per node and plan; exec reuses them, so one exec at a time.
 */
#include <dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernel.h"
#include "../krn-nn.h"
#include "nn-conv-impl.h"

eng_status krn_cpu_deconv_init(krn_call *c);
eng_status krn_cpu_deconv_exec(krn_call *c);
void krn_cpu_deconv_free(void *state);
void krn_cpu_deconv_describe(const krn_call *c, krn_impl_info *info);

typedef struct deconv_state {
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t prim;
    dnnl_memory_t msrc, mwei, mbias, mdst, mscratch;
    int wconst;                      /* W reordered once in init; else rwei runs on every exec, or W is read in
                                        place when the primitive takes ONNX's layout as it is */
    void *wpack;                     /* W in the primitive's layout (owned); NULL when read in place */
    krn_dnnl_reorder rsrc, rdst, rwei;
    void *tsrc, *tdst;               /* X / Y in the primitive's layouts when they are not plain (owned) */
    char desc[192];
    int slow;
} deconv_state;

/* Free everything s holds and zero it (s itself stays). */
static void deconv_clear(deconv_state *s) {
    krn_dnnl_reorder_free(&s->rsrc);
    krn_dnnl_reorder_free(&s->rdst);
    krn_dnnl_reorder_free(&s->rwei);
    if (s->prim) dnnl_primitive_destroy(s->prim);
    if (s->pd) dnnl_primitive_desc_destroy(s->pd);
    if (s->msrc) dnnl_memory_destroy(s->msrc);
    if (s->mwei) dnnl_memory_destroy(s->mwei);
    if (s->mbias) dnnl_memory_destroy(s->mbias);
    if (s->mdst) dnnl_memory_destroy(s->mdst);
    if (s->mscratch) dnnl_memory_destroy(s->mscratch);
    eng_free(s->wpack);
    eng_free(s->tsrc);
    eng_free(s->tdst);
    memset(s, 0, sizeof *s);
}

void krn_cpu_deconv_free(void *state) {
    if (!state) return;
    deconv_clear(state);
    free(state);
}

/* ONNX W as oneDNN weights, by weights rank: (M, C, k...) stored C-major ("iw", "iohw", "iodhw") or, with
 * groups, (G, M/G, C/G, k...) stored (G, C/G, M/G, k...) ("giow", "giohw", "giodhw"). */
static const dnnl_format_tag_t deconv_wtag_nogroup[6] = {0, 0, 0, dnnl_bac, dnnl_iohw, dnnl_iodhw};
static const dnnl_format_tag_t deconv_wtag_group[7] = {0, 0, 0, 0, dnnl_acbd, dnnl_giohw, dnnl_giodhw};

/* 1 if oneDNN's deconvolution can express the resolved geometry (see the file comment). */
static int conv_geometry_ok(const krn_conv_params *p, const eng_tensor *x, const eng_tensor *y) {
    for (int i = 0; i < p->nspatial; i++) {
        int64_t ext = (p->kernel[i] - 1) * p->dilations[i] + 1;
        int64_t v = y->dims[2 + i] + p->pads[i] + p->pads[p->nspatial + i] - ext;
        if (v < 0 || v / p->strides[i] + 1 != x->dims[2 + i]) return 0;
    }
    return 1;
}

static void deconv_describe_state(deconv_state *s) {
    char a[48], b[48], d[48];
    krn_dnnl_md_str(dnnl_primitive_desc_query_md(s->pd, dnnl_query_src_md, 0), a, sizeof a);
    krn_dnnl_md_str(dnnl_primitive_desc_query_md(s->pd, dnnl_query_weights_md, 0), b, sizeof b);
    krn_dnnl_md_str(dnnl_primitive_desc_query_md(s->pd, dnnl_query_dst_md, 0), d, sizeof d);
    int len = snprintf(s->desc, sizeof s->desc, "%.48s src %s wei %s dst %s%s%s%s", krn_dnnl_impl_name(s->pd), a, b,
                       d, s->rsrc.prim ? " +reorder(src)" : "", s->rdst.prim ? " +reorder(dst)" : "",
                       s->rwei.prim ? " +reorder(wei)" : "");
    if (len >= (int)sizeof s->desc) memcpy(s->desc + sizeof s->desc - 4, "...", 4);
    s->slow = krn_dnnl_is_ref(s->pd);
}

/* Build the primitive into the zeroed *s: X/Y plain (any_io = 0) or in the layouts oneDNN picks (any_io = 1).
 * On failure s may hold partial state: the caller clears it. */
static eng_status deconv_build_into(krn_call *c, deconv_state *s, int any_io) {
    const krn_conv_params *p = c->params;
    const eng_tensor *x = &c->in[0], *w = &c->in[1], *y = &c->out[0];
    int nsp = p->nspatial, nd = nsp + 2;
    int64_t G = p->group, C = x->dims[1], M = y->dims[1];
    if (!conv_geometry_ok(p, x, y))
        return eng_err(ENG_STATUS_UNSUPPORTED, "ConvTranspose geometry oneDNN cannot express (output larger than natural)");
    dnnl_dims_t sd, wd, bd, dd, st, dl, pl, pr;
    for (int i = 0; i < nd; i++) sd[i] = x->dims[i], dd[i] = y->dims[i];
    int wnd = G > 1 ? nd + 1 : nd;
    if (G > 1) {
        wd[0] = G, wd[1] = M / G, wd[2] = C / G;
        for (int i = 0; i < nsp; i++) wd[3 + i] = w->dims[2 + i];
    } else {
        wd[0] = M, wd[1] = C;
        for (int i = 0; i < nsp; i++) wd[2 + i] = w->dims[2 + i];
    }
    bd[0] = M;
    for (int i = 0; i < nsp; i++) {
        st[i] = p->strides[i];
        dl[i] = p->dilations[i] - 1;
        pl[i] = p->pads[i];
        pr[i] = p->pads[nsp + i];
    }
    dnnl_format_tag_t stag = conv_plain_tags[nd], dtag = conv_plain_tags[nd];
    if (nd == 4 && p->x_layout == KRN_NN_LAYOUT_BLOCKED) stag = krn_nn_blocked16(sd[1]) ? dnnl_nChw16c : dnnl_nhwc;
    if (nd == 4 && p->y_layout == KRN_NN_LAYOUT_BLOCKED) dtag = krn_nn_blocked16(dd[1]) ? dnnl_nChw16c : dnnl_nhwc;
    dnnl_memory_desc_t smd, dmd, smd_op, dmd_op, wplain, wany, bmd;
    KRN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&smd, nd, sd, dnnl_f32, stag));
    KRN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&dmd, nd, dd, dnnl_f32, dtag));
    smd_op = smd, dmd_op = dmd;
    if (any_io) {
        KRN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&smd_op, nd, sd, dnnl_f32, dnnl_format_tag_any));
        KRN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&dmd_op, nd, dd, dnnl_f32, dnnl_format_tag_any));
    }
    KRN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&wplain, wnd, wd, dnnl_f32,
                                                G > 1 ? deconv_wtag_group[wnd] : deconv_wtag_nogroup[wnd]));
    KRN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&wany, wnd, wd, dnnl_f32, dnnl_format_tag_any));
    KRN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&bmd, 1, bd, dnnl_f32, dnnl_a));
    int has_b = c->nin > 2 && c->in[2].dtype != ENG_DTYPE_UNDEFINED;
    dnnl_deconvolution_desc_t desc;
    KRN_DNNL_CHECK(dnnl_dilated_deconvolution_forward_desc_init(&desc, dnnl_forward_inference, dnnl_deconvolution_direct,
                                                                &smd_op, &wany, has_b ? &bmd : NULL, &dmd_op, st, dl,
                                                                pl, pr));
    ENG_TRY(krn_dnnl_prim(&desc, NULL, &p->act, &s->pd, &s->prim, &s->mscratch));
    dnnl_engine_t eng;
    ENG_TRY(krn_dnnl_engine(&eng));
    const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(s->pd, dnnl_query_weights_md, 0);
    s->wconst = (c->const_mask >> 1) & 1;
    if (s->wconst) {
        ENG_TRY(krn_dnnl_reorder_new(&wplain, w->data, wmd, &s->wpack));
    } else if (!dnnl_memory_desc_equal(wmd, &wplain)) {
        ENG_TRY(krn_dnnl_reorder_init(&s->rwei, &wplain, wmd));
        size_t wsz = dnnl_memory_desc_get_size(wmd);
        if (!(s->wpack = eng_alloc(wsz ? wsz : 64))) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "ConvTranspose weights");
    }
    KRN_DNNL_CHECK(dnnl_memory_create(&s->mwei, wmd, eng, s->wpack ? s->wpack : DNNL_MEMORY_NONE));
    const dnnl_memory_desc_t *psrc = dnnl_primitive_desc_query_md(s->pd, dnnl_query_src_md, 0);
    const dnnl_memory_desc_t *pdst = dnnl_primitive_desc_query_md(s->pd, dnnl_query_dst_md, 0);
    ENG_TRY(krn_dnnl_io_reorder(&smd, psrc, 1, &s->rsrc, &s->tsrc));
    ENG_TRY(krn_dnnl_io_reorder(&dmd, pdst, 0, &s->rdst, &s->tdst));
    KRN_DNNL_CHECK(dnnl_memory_create(&s->msrc, psrc, eng, DNNL_MEMORY_NONE));
    KRN_DNNL_CHECK(dnnl_memory_create(&s->mdst, pdst, eng, DNNL_MEMORY_NONE));
    if (has_b) KRN_DNNL_CHECK(dnnl_memory_create(&s->mbias, &bmd, eng, DNNL_MEMORY_NONE));
    deconv_describe_state(s);
    return ENG_STATUS_OK;
}

static eng_status deconv_try_build(krn_call *c, deconv_state *s, int any_io) {
    eng_status st = deconv_build_into(c, s, any_io);
    if (st != ENG_STATUS_OK) deconv_clear(s);
    return st;
}

/* 1 if impl is one of oneDNN's GEMM-based (im2col) kernels, e.g. "x64:gemm:jit". */
static int deconv_is_gemm(const_dnnl_primitive_desc_t pd) { return strstr(krn_dnnl_impl_name(pd), "gemm") != NULL; }

/* Plain X/Y first; a reference kernel there is retried with X/Y in oneDNN's layouts (see the file comment). So
 * is a 2-D GEMM-based one: measured (AVX-512, 2 threads, reorders included) the blocked direct kernels were
 * 15-30% faster for k4 s2 deconvs (64->32 at 32x32, 256->128 at 16x16, depthwise 64 at 32x32), while for 3-D
 * the GEMM kernel on plain layouts was faster, so 3-D keeps it. */
static eng_status deconv_build(krn_call *c, deconv_state *s) {
    const krn_conv_params *p = c->params;
    ENG_TRY(deconv_try_build(c, s, 0));
    int ref = krn_dnnl_is_ref(s->pd);
    if (ref && getenv("TENSORD_CONV_KEEP_REF")) return ENG_STATUS_OK;
    if (!ref && !(p->nspatial == 2 && deconv_is_gemm(s->pd))) return ENG_STATUS_OK;
    deconv_state any = {0};
    if (deconv_try_build(c, &any, 1) == ENG_STATUS_OK && !krn_dnnl_is_ref(any.pd) && (ref || !deconv_is_gemm(any.pd))) {
        deconv_clear(s);
        *s = any;
        return ENG_STATUS_OK;
    }
    deconv_clear(&any); /* nothing better in other layouts: keep the plain one (describe() marks a ref kernel slow) */
    eng_err_clear();
    return ENG_STATUS_OK;
}

eng_status krn_cpu_deconv_init(krn_call *c) {
    if (c->in[0].dtype != ENG_DTYPE_F32 || eng_tensor_numel(&c->out[0]) == 0 || eng_tensor_numel(&c->in[0]) == 0)
        return ENG_STATUS_OK;
    const krn_conv_params *p = c->params;
    int plain = !p->x_layout && !p->y_layout;
    if (getenv("TENSORD_CONV_REF") && plain) return ENG_STATUS_OK;
    deconv_state *s = calloc(1, sizeof *s);
    if (!s) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "ConvTranspose state");
    krn_dnnl_set_threads(c->nthreads);
    eng_status st = deconv_build(c, s);
    if (st == ENG_STATUS_OK) {
        if (getenv("TENSORD_NN_DEBUG")) fprintf(stderr, "conv_transpose: %s\n", s->desc);
        c->state = s;
        return ENG_STATUS_OK;
    }
    krn_cpu_deconv_free(s);
    if (st == ENG_STATUS_OUT_OF_MEMORY || !plain) return st; /* the reference loops read/write plain layouts only */
    if (getenv("TENSORD_NN_DEBUG")) fprintf(stderr, "conv_transpose: oneDNN refused (%s); reference loops\n", eng_last_error());
    eng_err_clear();
    return ENG_STATUS_OK;
}

void krn_cpu_deconv_describe(const krn_call *c, krn_impl_info *info) {
    const deconv_state *s = c->state;
    memset(info, 0, sizeof *info);
    if (!s) {
        snprintf(info->impl, sizeof info->impl, "reference loops (%s)", eng_dtype_name(c->out[0].dtype));
        info->slow = c->out[0].dtype == ENG_DTYPE_F32 && eng_tensor_numel(&c->out[0]) > 0;
        return;
    }
    snprintf(info->impl, sizeof info->impl, "%s", s->desc);
    info->slow = s->slow;
    info->reorders = !!s->rsrc.prim + !!s->rdst.prim + !!s->rwei.prim;
}

/* ---- reference ---- */

#define DECONV_REF_IMPL(NAME, T)                                                                               \
    static void NAME(const krn_call *c, const conv_geo *g) {                                                 \
        const T *X = c->in[0].data, *W = c->in[1].data;                                                        \
        const T *B = c->nin > 2 ? c->in[2].data : NULL;                                                        \
        T *Y = c->out[0].data;                                                                                 \
        int64_t osz = g->out[0] * g->out[1] * g->out[2], isz = g->in[0] * g->in[1] * g->in[2];                 \
        int64_t ksz = g->k[0] * g->k[1] * g->k[2];                                                             \
        _Pragma("omp parallel for num_threads(c->nthreads) schedule(static)")                                  \
        for (int64_t nm = 0; nm < g->N * g->M; nm++) {                                                         \
            int64_t n = nm / g->M, m = nm % g->M, grp = m / g->Mg, mg = m % g->Mg;                             \
            T *yp = Y + nm * osz;                                                                              \
            for (int64_t i = 0; i < osz; i++) yp[i] = B ? B[m] : (T)0;                                         \
            for (int64_t ci = 0; ci < g->Cg; ci++) {                                                           \
                int64_t cin = grp * g->Cg + ci;                                                                \
                const T *xp = X + (n * g->C + cin) * isz;                                                      \
                const T *wp = W + (cin * g->Mg + mg) * ksz;                                                    \
                for (int64_t i0 = 0; i0 < g->in[0]; i0++)                                                      \
                    for (int64_t i1 = 0; i1 < g->in[1]; i1++)                                                  \
                        for (int64_t i2 = 0; i2 < g->in[2]; i2++) {                                            \
                            T xv = xp[(i0 * g->in[1] + i1) * g->in[2] + i2];                                   \
                            for (int64_t k0 = 0; k0 < g->k[0]; k0++) {                                         \
                                int64_t o0 = i0 * g->s[0] - g->pb[0] + k0 * g->d[0];                           \
                                if (o0 < 0 || o0 >= g->out[0]) continue;                                       \
                                for (int64_t k1 = 0; k1 < g->k[1]; k1++) {                                     \
                                    int64_t o1 = i1 * g->s[1] - g->pb[1] + k1 * g->d[1];                       \
                                    if (o1 < 0 || o1 >= g->out[1]) continue;                                   \
                                    for (int64_t k2 = 0; k2 < g->k[2]; k2++) {                                 \
                                        int64_t o2 = i2 * g->s[2] - g->pb[2] + k2 * g->d[2];                   \
                                        if (o2 < 0 || o2 >= g->out[2]) continue;                               \
                                        yp[(o0 * g->out[1] + o1) * g->out[2] + o2] +=                          \
                                            xv * wp[(k0 * g->k[1] + k1) * g->k[2] + k2];                       \
                                    }                                                                          \
                                }                                                                              \
                            }                                                                                  \
                        }                                                                                      \
            }                                                                                                  \
        }                                                                                                      \
    }

DECONV_REF_IMPL(deconv_ref_f32, float)
DECONV_REF_IMPL(deconv_ref_f64, double)

static eng_status deconv_exec_ref(krn_call *c) {
    const krn_conv_params *p = c->params;
    eng_tensor *y = &c->out[0];
    conv_geo g;
    conv_geo_get(p, &c->in[0], y, &g);
    int64_t n = eng_tensor_numel(y);
    if (n == 0) return ENG_STATUS_OK;
    if (p->x_layout || p->y_layout)
        return eng_err(ENG_STATUS_INTERNAL, "ConvTranspose reference loops need plain layouts (x_layout %d, y_layout %d)",
                       p->x_layout, p->y_layout);
    if (y->dtype == ENG_DTYPE_F32) {
        deconv_ref_f32(c, &g);
        krn_nn_act_apply_f32(y->data, n, &p->act, c->nthreads);
    } else if (y->dtype == ENG_DTYPE_F64) {
        deconv_ref_f64(c, &g);
        krn_nn_act_apply_f64(y->data, n, &p->act);
    } else {
        return eng_err(ENG_STATUS_UNSUPPORTED, "ConvTranspose dtype %s", eng_dtype_name(y->dtype));
    }
    return ENG_STATUS_OK;
}

eng_status krn_cpu_deconv_exec(krn_call *c) {
    deconv_state *s = c->state;
    if (!s) return deconv_exec_ref(c);
    dnnl_stream_t stream;
    ENG_TRY(krn_dnnl_stream(&stream));
    krn_dnnl_set_threads(c->nthreads);
    const void *src = c->in[0].data;
    void *dst = s->tdst ? s->tdst : c->out[0].data;
    if (s->tsrc) {
        ENG_TRY(krn_dnnl_reorder_run(&s->rsrc, stream, src, s->tsrc));
        src = s->tsrc;
    }
    if (s->rwei.prim) ENG_TRY(krn_dnnl_reorder_run(&s->rwei, stream, c->in[1].data, s->wpack));
    else if (!s->wconst) KRN_DNNL_CHECK(dnnl_memory_set_data_handle(s->mwei, c->in[1].data)); /* W read in place */
    KRN_DNNL_CHECK(dnnl_memory_set_data_handle(s->msrc, (void *)src));
    KRN_DNNL_CHECK(dnnl_memory_set_data_handle(s->mdst, dst));
    dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, s->msrc}, {DNNL_ARG_WEIGHTS, s->mwei}, {DNNL_ARG_DST, s->mdst}};
    int na = 3;
    if (s->mscratch) args[na].arg = DNNL_ARG_SCRATCHPAD, args[na++].memory = s->mscratch;
    if (s->mbias) {
        KRN_DNNL_CHECK(dnnl_memory_set_data_handle(s->mbias, c->in[2].data));
        args[na].arg = DNNL_ARG_BIAS, args[na++].memory = s->mbias;
    }
    KRN_DNNL_CHECK(dnnl_primitive_execute(s->prim, stream, na, args));
    if (s->tdst) ENG_TRY(krn_dnnl_reorder_run(&s->rdst, stream, s->tdst, c->out[0].data));
    KRN_DNNL_CHECK(dnnl_stream_wait(stream));
    return ENG_STATUS_OK;
}
