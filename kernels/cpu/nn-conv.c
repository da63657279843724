/* nn-conv.c - Conv / com.tensord FusedConv: oneDNN for float32, reference loops for float64 and as fallback
 * (ConvTranspose is nn-deconv.c).
 *
 * float32 Conv: the oneDNN primitive is built in init with the source/destination layouts the plan chose
 * (plain NC[D][H]W, or BLOCKED from engine/plan/fuse.c's layout pass), weights in the layout oneDNN prefers
 * (constant weights reordered once in init; non-constant ones passed plain), bias, and post-ops in ONNX order:
 * residual add (binary post-op reading Z in place) then the activation.
 * Never a silent slow kernel: after creating the primitive its implementation is read back; if oneDNN only has
 * its reference kernel (or its im2col GEMM) for those layouts, the primitive is rebuilt with format `any` for X,
 * then Y, then both, and the best-ranked one is kept, with counted reorders from and to the plan's layouts
 * around it (describe() reports the implementation, the layouts and the reorders; the planner names the node
 * if a reference kernel is all there is).
 * Reference loops accumulate in double, cover 1-3 spatial dims by padding shapes to 3-D (missing dims are 1),
 * and handle anything oneDNN refuses (a residual Z that oneDNN cannot broadcast, for example).
 */
#include <dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernel.h"
#include "../krn-nn.h"
#include "nn-conv-impl.h"

typedef struct conv_state {
    int use_dnnl;
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t prim;
    dnnl_memory_t msrc, mwei, mbias, mdst, mres, mscratch;
    int res_sum;   /* residual as a sum post-op: Z is copied into Y before the primitive runs (Winograd) */
    void *wpack;
    int wconst;
    /* conv + MaxPool (params->pool): the batch runs in sub-batches of nb images; each sub-batch's conv output
     * (nChw16c) lands in `scratch`, small enough to stay in cache, and is pooled from there into Y. */
    struct conv_state *sub[2]; /* primitives for nb images and for the last N % nb images */
    int64_t nb, Hc, Wc;
    float *scratch;
    /* Layout negotiation fallback: when the layouts the plan fixed (x_layout/y_layout) only have a oneDNN
     * reference kernel, the primitive is rebuilt with format `any` and X / Y (and a residual Z) go through
     * counted reorders into the layouts it chose (tsrc/tdst). */
    krn_dnnl_reorder rsrc, rdst, rres;
    void *tsrc, *tdst;
    char desc[192];
    int slow;
    size_t zbytes; /* the residual Z's bytes in its layout (padded ones included) */
    /* fused 3x3 depthwise conv (params->dw_stride): its weights and bias as oneDNN post-op arguments, or, where
     * oneDNN has no fast fused kernel, dw_split with sub[0] the 1x1 conv into `scratch` and sub[1] the depthwise */
    dnnl_memory_t mdw_w, mdw_b;
    void *dw_wpack;
    float *dw_bzero;
    int dw_split;
    /* compute bf16 with weights that change between runs (training): they are converted on every exec */
    krn_dnnl_reorder rwei;
    void *twei;
} conv_state;

void krn_cpu_conv_free(void *p);

/* Free everything s holds and zero it (s itself stays). */
static void conv_clear(conv_state *s) {
    krn_cpu_conv_free(s->sub[0]);
    krn_cpu_conv_free(s->sub[1]);
    eng_free(s->scratch);
    krn_dnnl_reorder_free(&s->rsrc);
    krn_dnnl_reorder_free(&s->rdst);
    krn_dnnl_reorder_free(&s->rres);
    krn_dnnl_reorder_free(&s->rwei);
    eng_free(s->twei);
    eng_free(s->tsrc);
    eng_free(s->tdst);
    if (s->prim) dnnl_primitive_destroy(s->prim);
    if (s->pd) dnnl_primitive_desc_destroy(s->pd);
    if (s->msrc) dnnl_memory_destroy(s->msrc);
    if (s->mwei) dnnl_memory_destroy(s->mwei);
    if (s->mbias) dnnl_memory_destroy(s->mbias);
    if (s->mdst) dnnl_memory_destroy(s->mdst);
    if (s->mres) dnnl_memory_destroy(s->mres);
    if (s->mscratch) dnnl_memory_destroy(s->mscratch);
    eng_free(s->wpack);
    if (s->mdw_w) dnnl_memory_destroy(s->mdw_w);
    if (s->mdw_b) dnnl_memory_destroy(s->mdw_b);
    eng_free(s->dw_wpack);
    free(s->dw_bzero);
    memset(s, 0, sizeof *s);
}

void krn_cpu_conv_free(void *p) {
    if (!p) return;
    conv_clear(p);
    free(p);
}


/* Winograd F(4x4, 3x3) (oneDNN) for 3x3 stride-1 convs with at least 32 input and output channels: measured
 * 1.3-1.8x faster than the direct kernel there, slower below 32 channels. Its rounding differs from direct
 * convolution by ~1e-6 relative. TENSORD_CONV_WINOGRAD=0 turns it off. */
static int conv_want_winograd(const krn_call *c) {
    const krn_conv_params *p = c->params;
    const eng_tensor *x = &c->in[0], *y = &c->out[0];
    const char *e = getenv("TENSORD_CONV_WINOGRAD");
    if ((e && *e == '0') || c->compute) return 0; /* oneDNN's Winograd is fp32 only */
    return p->nspatial == 2 && p->group == 1 && p->kernel[0] == 3 && p->kernel[1] == 3 && p->strides[0] == 1 &&
           p->strides[1] == 1 && p->dilations[0] == 1 && p->dilations[1] == 1 && x->dims[1] >= 32 && y->dims[1] >= 32;
}

static eng_status conv_dnnl_build_alg(krn_call *c, conv_state *s, dnnl_alg_kind_t alg, int any_io);

/* 0: oneDNN's reference kernel; 1: its im2col + GEMM convolution (plain layouts, several times slower than the
 * direct kernels in blocked ones); 2: a direct / 1x1 / depthwise / Winograd kernel (jit, brgconv). */
static int conv_impl_rank(const_dnnl_primitive_desc_t pd) {
    const char *impl = krn_dnnl_impl_name(pd);
    if (!strncmp(impl, "ref", 3)) return 0;
    return strstr(impl, "gemm") ? 1 : 2;
}

/* Build into the zeroed *s; on failure nothing is left in it. */
static eng_status conv_try_build(krn_call *c, conv_state *s, dnnl_alg_kind_t alg, int any_io) {
    eng_status st = conv_dnnl_build_alg(c, s, alg, any_io);
    if (st != ENG_STATUS_OK) conv_clear(s);
    return st;
}

/* Winograd where it pays, else direct with the plan's layouts; if oneDNN only has a reference kernel for those
 * layouts, direct again with format `any` for X and Y and counted reorders (never a silent reference kernel). */
static eng_status conv_dnnl_build(krn_call *c, conv_state *s);

/* The fused 1x1 + depthwise pair as two primitives: the 1x1 conv into a blocked scratch buffer (sub[0]), then
 * the depthwise conv from it (sub[1]), for where oneDNN has no fast fused kernel. */
static eng_status conv_dw_split_build(krn_call *c, conv_state *s) {
    const krn_conv_params *p = c->params;
    const eng_tensor *x = &c->in[0], *y = &c->out[0];
    krn_conv_params p1 = *p, p2 = *p;
    p1.dw_stride = 0, p1.y_layout = KRN_NN_LAYOUT_BLOCKED;
    memset(&p2, 0, sizeof p2);
    p2.nspatial = 2, p2.group = y->dims[1], p2.act = p->dw_act, p2.x_layout = KRN_NN_LAYOUT_BLOCKED, p2.y_layout = p->y_layout;
    for (int i = 0; i < 2; i++) {
        p2.kernel[i] = 3, p2.strides[i] = p->dw_stride, p2.dilations[i] = 1;
        p2.pads[i] = p2.pads[2 + i] = 1;
    }
    eng_tensor mid = *y;
    mid.dims[2] = x->dims[2], mid.dims[3] = x->dims[3];
    s->scratch = eng_alloc((size_t)eng_tensor_numel(&mid) * sizeof(float)); /* M % 16 == 0: nChw16c, no padding */
    if (!s->scratch) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "depthwise conv scratch");
    mid.data = s->scratch;
    eng_tensor in1[3] = {c->in[0], c->in[1], c->nin > 2 ? c->in[2] : (eng_tensor){0}};
    eng_tensor in2[3] = {mid, c->in[4], c->nin > 5 ? c->in[5] : (eng_tensor){0}};
    krn_call c1 = *c, c2 = *c;
    c1.params = &p1, c1.in = in1, c1.nin = 3, c1.out = &mid, c1.const_mask = c->const_mask & 6u;
    c2.params = &p2, c2.in = in2, c2.nin = 3, c2.const_mask = ((c->const_mask >> 4) & 1u) << 1 | ((c->const_mask >> 5) & 1u) << 2;
    for (int k = 0; k < 2; k++)
        if (!(s->sub[k] = calloc(1, sizeof *s->sub[k]))) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "conv state");
    ENG_TRY(conv_dnnl_build(&c1, s->sub[0]));
    ENG_TRY(conv_dnnl_build(&c2, s->sub[1]));
    s->dw_split = s->use_dnnl = 1;
    return ENG_STATUS_OK;
}

static eng_status conv_dnnl_build(krn_call *c, conv_state *s) {
    const krn_conv_params *pp = c->params;
    if (pp->dw_stride) { /* fused 1x1 + depthwise: one primitive where oneDNN has a fast one, else two */
        if (!getenv("TENSORD_CONV_DW_SPLIT") && conv_try_build(c, s, dnnl_convolution_direct, 0) == ENG_STATUS_OK) {
            if (conv_impl_rank(s->pd) == 2) return ENG_STATUS_OK;
            if (getenv("TENSORD_NN_DEBUG")) fprintf(stderr, "conv+dw: oneDNN fused kernel is %s\n", krn_dnnl_impl_name(s->pd));
            conv_clear(s);
        } else if (getenv("TENSORD_NN_DEBUG")) {
            fprintf(stderr, "conv+dw: no fused kernel (%s)\n", eng_last_error());
        }
        eng_err_clear();
        return conv_dw_split_build(c, s);
    }
    if (conv_want_winograd(c)) {
        if (conv_try_build(c, s, dnnl_convolution_winograd, 0) == ENG_STATUS_OK) return ENG_STATUS_OK;
        eng_err_clear(); /* oneDNN has no Winograd kernel for this shape or machine: go direct */
    }
    ENG_TRY(conv_try_build(c, s, dnnl_convolution_direct, 0));
    if (conv_impl_rank(s->pd) == 2 || getenv("TENSORD_CONV_KEEP_REF")) return ENG_STATUS_OK;
    /* free X's layout (one reorder in), Y's (one out), then both; keep the best-ranked, fewest reorders first */
    for (int any_io = 1; any_io <= 3; any_io++) {
        conv_state any = {0};
        if (conv_try_build(c, &any, dnnl_convolution_direct, any_io) != ENG_STATUS_OK) {
            eng_err_clear();
            continue;
        }
        if (conv_impl_rank(any.pd) <= conv_impl_rank(s->pd)) {
            conv_clear(&any);
            continue;
        }
        conv_clear(s);
        *s = any;
        if (conv_impl_rank(s->pd) == 2) break;
    }
    return ENG_STATUS_OK; /* if still a reference kernel, no faster one exists here; describe() marks it slow */
}

/* Describe the primitive in s->desc: implementation, the layouts it runs in, and the reorders around it. */
static void conv_describe_state(conv_state *s) {
    char a[48], b[48], d[48];
    krn_dnnl_md_str(dnnl_primitive_desc_query_md(s->pd, dnnl_query_src_md, 0), a, sizeof a);
    krn_dnnl_md_str(dnnl_primitive_desc_query_md(s->pd, dnnl_query_weights_md, 0), b, sizeof b);
    krn_dnnl_md_str(dnnl_primitive_desc_query_md(s->pd, dnnl_query_dst_md, 0), d, sizeof d);
    char t[512];
    snprintf(t, sizeof t, "%s src %s wei %s dst %s%s%s%s", krn_dnnl_impl_name(s->pd), a, b, d,
             s->rsrc.prim ? " +reorder(src)" : "", s->rdst.prim ? " +reorder(dst)" : "",
             s->rres.prim ? " +reorder(residual)" : "");
    krn_str_copy(s->desc, sizeof s->desc, t);
    s->slow = krn_dnnl_is_ref(s->pd);
}

/* any_io: bit 0 asks for X in format `any`, bit 1 for Y (counted reorders from/to the plan's layouts). */
static eng_status conv_dnnl_build_alg(krn_call *c, conv_state *s, dnnl_alg_kind_t alg, int any_io) {
    const krn_conv_params *p = c->params;
    const eng_tensor *x = &c->in[0], *w = &c->in[1], *y = &c->out[0];
    int nsp = p->nspatial, nd = nsp + 2;
    int64_t G = p->group, M = y->dims[1];
    dnnl_dims_t sd, wd, bd, dd, st, dl, pl, pr, fd;
    for (int i = 0; i < nd; i++) sd[i] = x->dims[i], dd[i] = fd[i] = y->dims[i];
    int dw = p->dw_stride > 0 && nd == 4;
    if (dw) dd[2] = x->dims[2], dd[3] = x->dims[3]; /* the 1x1 conv's own output; Y (fd) is the depthwise one's */
    int wnd = G > 1 ? nd + 1 : nd;
    if (G > 1) {
        wd[0] = G, wd[1] = M / G, wd[2] = x->dims[1] / G;
        for (int i = 0; i < nsp; i++) wd[3 + i] = w->dims[2 + i];
    } else {
        for (int i = 0; i < nd; i++) wd[i] = w->dims[i];
    }
    bd[0] = M;
    for (int i = 0; i < nsp; i++) {
        st[i] = p->strides[i];
        dl[i] = p->dilations[i] - 1;
        pl[i] = p->pads[i];
        pr[i] = p->pads[nsp + i];
    }
    dnnl_memory_desc_t smd, wmd_any, wplain, bmd, dmd, rmd;
    dnnl_format_tag_t stag = conv_plain_tags[nd], dtag = conv_plain_tags[nd];
    if (nd == 4 && p->x_layout == KRN_NN_LAYOUT_BLOCKED) stag = krn_nn_blocked16(sd[1]) ? dnnl_nChw16c : dnnl_nhwc;
    if (nd == 4 && p->y_layout == KRN_NN_LAYOUT_BLOCKED) dtag = krn_nn_blocked16(dd[1]) ? dnnl_nChw16c : dnnl_nhwc;
    if (nd == 4 && p->x_layout == KRN_NN_LAYOUT_BLOCKED16_PADDED) stag = dnnl_nChw16c;
    if (nd == 4 && p->y_layout == KRN_NN_LAYOUT_BLOCKED16_PADDED) dtag = dnnl_nChw16c;
    /* the plan's dtypes (f32, or bf16 activations in a bf16 plan) and the one the primitive multiplies in */
    dnnl_data_type_t xdt = krn_dnnl_dt(x->dtype), ydt = krn_dnnl_dt(y->dtype), cdt = c->compute ? krn_dnnl_dt(c->compute) : dnnl_f32;
    if (xdt == dnnl_data_type_undef || ydt == dnnl_data_type_undef || cdt == dnnl_data_type_undef)
        return eng_err(ENG_STATUS_UNSUPPORTED, "conv: no oneDNN path for %s in, %s out", eng_dtype_name(x->dtype), eng_dtype_name(y->dtype));
    KRN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&smd, nd, sd, xdt, stag));
    KRN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&dmd, nd, fd, ydt, dtag));
    dnnl_memory_desc_t smd_op, dmd_op; /* what the primitive is asked for */
    KRN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&smd_op, nd, sd, cdt, (any_io & 1) ? dnnl_format_tag_any : stag));
    KRN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&dmd_op, nd, dd, ydt, (any_io & 2) ? dnnl_format_tag_any : dtag));
    KRN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&wplain, wnd, wd, dnnl_f32, conv_plain_tags[wnd]));
    s->wconst = (c->const_mask >> 1) & 1;
    /* weights in the layout the kernel wants: constant ones reordered once; others (training) on every exec, a
     * small reorder that buys a direct kernel instead of im2col + GEMM */
    if (s->wconst || cdt != dnnl_f32 || any_io) KRN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&wmd_any, wnd, wd, cdt, dnnl_format_tag_any));
    else wmd_any = wplain;
    int has_b = c->nin > 2 && c->in[2].dtype != ENG_DTYPE_UNDEFINED;
    KRN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&bmd, 1, bd, dnnl_f32, dnnl_a));
    dnnl_convolution_desc_t cd;
    KRN_DNNL_CHECK(dnnl_dilated_convolution_forward_desc_init(&cd, dnnl_forward_inference, alg, &smd_op,
                                                              &wmd_any, has_b ? &bmd : NULL, &dmd_op, st, dl, pl, pr));
    dnnl_post_ops_t po;
    if (dnnl_post_ops_create(&po) != dnnl_success) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "conv post-ops");
    eng_status est = ENG_STATUS_OK;
    int has_res = p->has_residual && c->nin > 3 && c->in[3].dtype != ENG_DTYPE_UNDEFINED;
    if (has_res) {
        const eng_tensor *z = &c->in[3];
        dnnl_dims_t zd;
        for (int i = 0; i < nd; i++) zd[i] = 1;
        for (int i = 0; i < z->ndim; i++) zd[nd - z->ndim + i] = z->dims[i];
        dnnl_format_tag_t ztag = conv_plain_tags[nd];
        if (p->y_layout != KRN_NN_LAYOUT_PLAIN && z->ndim == nd) ztag = dtag;
        if (z->ndim > nd || krn_dnnl_dt(z->dtype) == dnnl_data_type_undef ||
            dnnl_memory_desc_init_by_tag(&rmd, nd, zd, krn_dnnl_dt(z->dtype), ztag) != dnnl_success)
            est = ENG_STATUS_UNSUPPORTED;
        else if ((any_io & 2) && z->ndim == nd && eng_shape_equal(z, y)) { /* Z is reordered into Y's chosen layout */
            s->res_sum = 1;
            if (dnnl_post_ops_append_sum(po, 1.f) != dnnl_success) est = ENG_STATUS_UNSUPPORTED;
        } else if (alg == dnnl_convolution_winograd) { /* Winograd takes no binary post-op: Z goes into Y first */
            s->res_sum = z->ndim == nd && ztag == dtag && eng_shape_equal(z, y);
            if (!s->res_sum || dnnl_post_ops_append_sum(po, 1.f) != dnnl_success) est = ENG_STATUS_UNSUPPORTED;
        } else if (dnnl_post_ops_append_binary(po, dnnl_binary_add, &rmd) != dnnl_success)
            est = ENG_STATUS_UNSUPPORTED;
        if (est == ENG_STATUS_OK) s->zbytes = dnnl_memory_desc_get_size(&rmd);
    }
    if (est != ENG_STATUS_OK) {
        dnnl_post_ops_destroy(po);
        return est;
    }
    if (dw && est == ENG_STATUS_OK) { /* 1x1 activation, then the depthwise conv, whose activation comes last */
        est = krn_dnnl_append_act(po, &p->act);
        dnnl_status_t ds = p->dw_stride == 1 ? dnnl_post_ops_append_dw_k3s1p1(po, dnnl_f32, dnnl_f32, dnnl_f32, 0, 0, NULL)
                                             : dnnl_post_ops_append_dw_k3s2p1(po, dnnl_f32, dnnl_f32, dnnl_f32, 0, 0, NULL);
        if (est == ENG_STATUS_OK && ds != dnnl_success) est = krn_dnnl_fail(ds, "dnnl_post_ops_append_dw", __func__, __FILE__, __LINE__);
        if (est != ENG_STATUS_OK) {
            dnnl_post_ops_destroy(po);
            return est;
        }
    }
    ENG_TRY(krn_dnnl_prim(&cd, po, dw ? &p->dw_act : &p->act, &s->pd, &s->prim, &s->mscratch));
    dnnl_engine_t eng;
    ENG_TRY(krn_dnnl_engine(&eng));
    const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(s->pd, dnnl_query_weights_md, 0);
    if (s->wconst) {
        ENG_TRY(krn_dnnl_reorder_new(&wplain, w->data, wmd, &s->wpack));
        KRN_DNNL_CHECK(dnnl_memory_create(&s->mwei, wmd, eng, s->wpack));
    } else {
        KRN_DNNL_CHECK(dnnl_memory_create(&s->mwei, wmd, eng, DNNL_MEMORY_NONE));
        ENG_TRY(krn_dnnl_io_reorder(&wplain, wmd, 1, &s->rwei, &s->twei)); /* bf16 or a blocked layout: every exec */
    }
    const dnnl_memory_desc_t *psrc = dnnl_primitive_desc_query_md(s->pd, dnnl_query_src_md, 0);
    const dnnl_memory_desc_t *pdst = dnnl_primitive_desc_query_md(s->pd, dnnl_query_dst_md, 0);
    ENG_TRY(krn_dnnl_io_reorder(&smd, psrc, 1, &s->rsrc, &s->tsrc));
    ENG_TRY(krn_dnnl_io_reorder(&dmd, pdst, 0, &s->rdst, &s->tdst));
    if (has_res && s->res_sum && !dnnl_memory_desc_equal(pdst, &rmd)) ENG_TRY(krn_dnnl_reorder_init(&s->rres, &rmd, pdst));
    KRN_DNNL_CHECK(dnnl_memory_create(&s->msrc, psrc, eng, DNNL_MEMORY_NONE));
    KRN_DNNL_CHECK(dnnl_memory_create(&s->mdst, pdst, eng, DNNL_MEMORY_NONE));
    if (has_b) KRN_DNNL_CHECK(dnnl_memory_create(&s->mbias, &bmd, eng, DNNL_MEMORY_NONE));
    if (has_res && !s->res_sum) KRN_DNNL_CHECK(dnnl_memory_create(&s->mres, &rmd, eng, DNNL_MEMORY_NONE));
    if (dw) {
        if (!((c->const_mask >> 4) & 1)) return eng_err(ENG_STATUS_UNSUPPORTED, "fused depthwise conv needs a constant W");
        const dnnl_memory_desc_t *dwm = dnnl_primitive_desc_query_md(s->pd, dnnl_query_exec_arg_md, DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_WEIGHTS);
        const dnnl_memory_desc_t *dbm = dnnl_primitive_desc_query_md(s->pd, dnnl_query_exec_arg_md, DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_BIAS);
        if (!dwm || !dbm || !dwm->ndims) return eng_err(ENG_STATUS_UNSUPPORTED, "oneDNN kept no depthwise post-op");
        dnnl_dims_t gd = {fd[1], 1, 1, 3, 3};
        dnnl_memory_desc_t gplain;
        KRN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&gplain, 5, gd, dnnl_f32, dnnl_goihw));
        ENG_TRY(krn_dnnl_reorder_new(&gplain, c->in[4].data, dwm, &s->dw_wpack));
        KRN_DNNL_CHECK(dnnl_memory_create(&s->mdw_w, dwm, eng, s->dw_wpack));
        int has_db = c->nin > 5 && c->in[5].dtype != ENG_DTYPE_UNDEFINED;
        if (!has_db && !(s->dw_bzero = calloc((size_t)fd[1], sizeof(float))))
            return eng_err(ENG_STATUS_OUT_OF_MEMORY, "fused depthwise conv bias");
        KRN_DNNL_CHECK(dnnl_memory_create(&s->mdw_b, dbm, eng, has_db ? DNNL_MEMORY_NONE : s->dw_bzero));
    }
    s->use_dnnl = 1;
    conv_describe_state(s);
    if (dw) {
        char t[sizeof s->desc + 16];
        snprintf(t, sizeof t, "%s +dw3x3s%d", s->desc, p->dw_stride);
        krn_str_copy(s->desc, sizeof s->desc, t);
    }
    return ENG_STATUS_OK;
}

/* Conv output dims (before the fused pool) for spatial dim i. */
static int64_t conv_out_dim(const krn_conv_params *p, int64_t in, int i) {
    int64_t ext = (p->kernel[i] - 1) * p->dilations[i] + 1;
    return (in + p->pads[i] + p->pads[p->nspatial + i] - ext) / p->strides[i] + 1;
}

#define CONV_POOL_SCRATCH_BYTES (2048 * 1024)

static eng_status conv_pool_build(krn_call *c, conv_state *s) {
    const krn_conv_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    int64_t N = x->dims[0], M = c->out[0].dims[1];
    if (p->nspatial != 2 || !krn_nn_blocked16(M) || !krn_lowp_io(x->dtype) || (x->dtype != ENG_DTYPE_F32 && !c->compute) ||
        c->out[0].dtype != ENG_DTYPE_F32 || (p->has_residual && c->nin > 3))
        return eng_err(ENG_STATUS_INTERNAL, "conv+pool fusion needs a 2-D float32 conv with channels %% 16 == 0");
    s->Hc = conv_out_dim(p, x->dims[2], 0);
    s->Wc = conv_out_dim(p, x->dims[3], 1);
    int64_t img = M * s->Hc * s->Wc * (int64_t)sizeof(float), nb = CONV_POOL_SCRATCH_BYTES / (img ? img : 1);
    if (nb < 1) nb = 1;
    if (nb > N) nb = N;
    for (int64_t d = nb; d >= (nb + 1) / 2; d--) /* prefer a sub-batch that divides N: one primitive */
        if (N % d == 0) {
            nb = d;
            break;
        }
    s->nb = nb;
    s->scratch = eng_alloc((size_t)(nb * img));
    if (!s->scratch) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "conv+pool scratch");
    krn_conv_params pp = *p;
    pp.pool = 0;
    pp.y_layout = KRN_NN_LAYOUT_BLOCKED;
    for (int k = 0; k < 2; k++) {
        int64_t rows = k == 0 ? nb : N % nb;
        if (rows == 0) continue;
        eng_tensor in[3];
        for (int i = 0; i < c->nin && i < 3; i++) in[i] = c->in[i];
        in[0].dims[0] = rows;
        eng_tensor out = c->out[0];
        out.dims[0] = rows;
        out.dims[2] = s->Hc;
        out.dims[3] = s->Wc;
        krn_call c2 = *c;
        c2.params = &pp;
        c2.in = in;
        c2.nin = c->nin < 3 ? c->nin : 3;
        c2.out = &out;
        s->sub[k] = calloc(1, sizeof *s->sub[k]);
        if (!s->sub[k]) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "conv state");
        ENG_TRY(conv_dnnl_build(&c2, s->sub[k]));
    }
    s->use_dnnl = 1;
    return ENG_STATUS_OK;
}

static eng_status conv_run_prim(conv_state *s, dnnl_stream_t stream, const void *src, void *dst_out, const krn_call *c) {
    void *dst = s->tdst ? s->tdst : dst_out;
    if (s->tsrc) {
        ENG_TRY(krn_dnnl_reorder_run(&s->rsrc, stream, src, s->tsrc));
        src = s->tsrc;
    }
    if (s->rres.prim) ENG_TRY(krn_dnnl_reorder_run(&s->rres, stream, c->in[3].data, dst));
    KRN_DNNL_CHECK(dnnl_memory_set_data_handle(s->msrc, (void *)src));
    KRN_DNNL_CHECK(dnnl_memory_set_data_handle(s->mdst, dst));
    if (s->twei) {
        ENG_TRY(krn_dnnl_reorder_run(&s->rwei, stream, c->in[1].data, s->twei));
        KRN_DNNL_CHECK(dnnl_memory_set_data_handle(s->mwei, s->twei));
    } else if (!s->wconst) {
        KRN_DNNL_CHECK(dnnl_memory_set_data_handle(s->mwei, c->in[1].data));
    }
    dnnl_exec_arg_t args[8] = {{DNNL_ARG_SRC, s->msrc}, {DNNL_ARG_WEIGHTS, s->mwei}, {DNNL_ARG_DST, s->mdst}};
    int na = 3;
    if (s->mscratch) args[na].arg = DNNL_ARG_SCRATCHPAD, args[na++].memory = s->mscratch;
    if (s->res_sum && !s->rres.prim && c->in[3].data != dst) memcpy(dst, c->in[3].data, s->zbytes);
    if (s->mbias) {
        KRN_DNNL_CHECK(dnnl_memory_set_data_handle(s->mbias, c->in[2].data));
        args[na].arg = DNNL_ARG_BIAS, args[na++].memory = s->mbias;
    }
    if (s->mdw_w) {
        if (!s->dw_bzero) KRN_DNNL_CHECK(dnnl_memory_set_data_handle(s->mdw_b, c->in[5].data));
        args[na].arg = DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_WEIGHTS, args[na++].memory = s->mdw_w;
        args[na].arg = DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_BIAS, args[na++].memory = s->mdw_b;
    }
    if (s->mres) {
        KRN_DNNL_CHECK(dnnl_memory_set_data_handle(s->mres, c->in[3].data));
        args[na].arg = DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, args[na++].memory = s->mres;
    }
    KRN_DNNL_CHECK(dnnl_primitive_execute(s->prim, stream, na, args));
    if (s->tdst) ENG_TRY(krn_dnnl_reorder_run(&s->rdst, stream, s->tdst, dst_out));
    KRN_DNNL_CHECK(dnnl_stream_wait(stream));
    return ENG_STATUS_OK;
}

void krn_cpu_conv_describe(const krn_call *c, krn_impl_info *info) {
    const conv_state *s = c->state;
    memset(info, 0, sizeof *info);
    if (s && s->dw_split) {
        char t[2 * sizeof s->desc + 32];
        snprintf(t, sizeof t, "%s, then %s", s->sub[0]->desc, s->sub[1]->desc);
        krn_str_copy(info->impl, sizeof info->impl, t);
        info->slow = s->sub[0]->slow || s->sub[1]->slow;
        info->reorders = !!s->sub[0]->rsrc.prim + !!s->sub[0]->rdst.prim + !!s->sub[1]->rsrc.prim + !!s->sub[1]->rdst.prim;
        return;
    }
    if (s && s->sub[0]) {
        char t[sizeof s->desc + 32];
        snprintf(t, sizeof t, "%s +maxpool(blocked)", s->sub[0]->desc);
        krn_str_copy(info->impl, sizeof info->impl, t);
        info->slow = s->sub[0]->slow || (s->sub[1] && s->sub[1]->slow);
        s = s->sub[0];
    } else if (s && s->use_dnnl) {
        snprintf(info->impl, sizeof info->impl, "%s", s->desc);
        info->slow = s->slow;
    } else {
        snprintf(info->impl, sizeof info->impl, "reference loops (%s)", eng_dtype_name(c->out[0].dtype));
        info->slow = c->out[0].dtype == ENG_DTYPE_F32 && eng_tensor_numel(&c->out[0]) > 0;
        return;
    }
    info->reorders = !!s->rsrc.prim + !!s->rdst.prim + !!s->rres.prim;
}

static eng_status conv_pool_exec(krn_call *c, conv_state *s, dnnl_stream_t stream) {
    const krn_conv_params *p = c->params;
    const eng_tensor *x = &c->in[0], *y = &c->out[0];
    int64_t N = x->dims[0], M = y->dims[1], OH = y->dims[2], OW = y->dims[3];
    size_t xin = (size_t)(x->dims[1] * x->dims[2] * x->dims[3]), yimg = (size_t)(M * OH * OW);
    for (int64_t n0 = 0; n0 < N; n0 += s->nb) {
        int64_t rows = N - n0 < s->nb ? N - n0 : s->nb;
        conv_state *sub = rows == s->nb ? s->sub[0] : s->sub[1];
        ENG_TRY(conv_run_prim(sub, stream, (const float *)x->data + (size_t)n0 * xin, s->scratch, c));
        krn_cpu_maxpool2d_blocked16(s->scratch, (float *)y->data + (size_t)n0 * yimg, rows, M, s->Hc, s->Wc, OH, OW,
                                    p->pool_kernel[0], p->pool_kernel[1], p->pool_strides[0], p->pool_strides[1],
                                    c->nthreads);
    }
    return ENG_STATUS_OK;
}

/* compute_ok: bf16 on oneDNN's bf16 kernels, float32 or bf16 activations in and out (a fused MaxPool reads the
 * conv's float32 output), float32 weights (converted once when constant, every run when not); not the fused
 * 1x1 + depthwise pair. */
int krn_cpu_conv_compute_ok(const krn_call *c, eng_dtype dt) {
    const krn_conv_params *p = c->params;
    if (dt != ENG_DTYPE_BF16 || !p || p->dw_stride || p->nspatial < 1 || p->nspatial > 3) return 0;
    if (p->pool && (p->nspatial != 2 || c->out[0].dtype != ENG_DTYPE_F32 || p->has_residual)) return 0; /* pools f32 */
    if (c->nin < 2 || !krn_lowp_io(c->in[0].dtype) || c->in[1].dtype != ENG_DTYPE_F32 || !krn_lowp_io(c->out[0].dtype))
        return 0;
    if (c->nin > 2 && c->in[2].dtype != ENG_DTYPE_UNDEFINED && c->in[2].dtype != ENG_DTYPE_F32) return 0;
    if (p->has_residual && c->nin > 3 && c->in[3].dtype != ENG_DTYPE_UNDEFINED && !krn_lowp_io(c->in[3].dtype)) return 0;
    return eng_tensor_numel(&c->out[0]) > 0 && eng_tensor_numel(&c->in[0]) > 0;
}

eng_status krn_cpu_conv_init(krn_call *c) {
    if (c->compute && !krn_cpu_conv_compute_ok(c, c->compute))
        return eng_err(ENG_STATUS_INTERNAL, "conv cannot compute in %s here", eng_dtype_name(c->compute));
    if ((c->in[0].dtype != ENG_DTYPE_F32 && !c->compute) || eng_tensor_numel(&c->out[0]) == 0 || eng_tensor_numel(&c->in[0]) == 0)
        return ENG_STATUS_OK;
    const krn_conv_params *p = c->params;
    if (p->pool) {
        conv_state *s = calloc(1, sizeof *s);
        if (!s) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "conv state");
        krn_dnnl_set_threads(c->nthreads);
        eng_status st = conv_pool_build(c, s);
        if (st != ENG_STATUS_OK) {
            krn_cpu_conv_free(s);
            return st;
        }
        c->state = s;
        return ENG_STATUS_OK;
    }
    conv_state *s = calloc(1, sizeof *s);
    if (!s) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "conv state");
    krn_dnnl_set_threads(c->nthreads);
    eng_status st = conv_dnnl_build(c, s);
    if (st == ENG_STATUS_OK && (getenv("TENSORD_CONV_REF") == NULL || p->x_layout || p->y_layout || p->dw_stride)) {
        c->state = s;
        return ENG_STATUS_OK;
    }
    krn_cpu_conv_free(s);
    if (st == ENG_STATUS_OUT_OF_MEMORY) return st;
    if (c->compute) /* no reference loops in bf16 */
        return eng_err_prefix(st, "oneDNN has no %s convolution for this shape: ", eng_dtype_name(c->compute));
    if (p->x_layout || p->y_layout) return st; /* reference loops only read/write plain layouts */
    if (p->dw_stride) return st != ENG_STATUS_OK ? st : eng_err(ENG_STATUS_UNSUPPORTED, "fused depthwise conv needs oneDNN");
    if (st != ENG_STATUS_OK && getenv("TENSORD_NN_DEBUG")) fprintf(stderr, "conv: oneDNN refused (%s); reference loops\n", eng_last_error());
    eng_err_clear();
    return ENG_STATUS_OK; /* reference loops */
}

/* ---- reference ---- */


/* Residual Z (broadcast into Y's shape) element for flat Y index i. */
static double conv_res_get(const eng_tensor *z, const eng_tensor *y, int64_t i) {
    int64_t off = 0, acc = 1;
    for (int d = y->ndim - 1; d >= 0; d--) {
        int64_t idx = i % y->dims[d];
        i /= y->dims[d];
        int zd = d - (y->ndim - z->ndim);
        if (zd >= 0) {
            if (z->dims[zd] != 1) off += idx * acc;
            acc *= z->dims[zd];
        }
    }
    return eng_tensor_get_f64(z, off);
}

#define CONV_REF_IMPL(NAME, T)                                                                                 \
    static void NAME(const krn_call *c, const conv_geo *g) {                                                   \
        const T *X = c->in[0].data, *W = c->in[1].data;                                                        \
        const T *B = c->nin > 2 ? c->in[2].data : NULL;                                                        \
        T *Y = c->out[0].data;                                                                                 \
        int64_t osz = g->out[0] * g->out[1] * g->out[2], isz = g->in[0] * g->in[1] * g->in[2];                 \
        int64_t ksz = g->k[0] * g->k[1] * g->k[2];                                                             \
        _Pragma("omp parallel for num_threads(c->nthreads) schedule(static)")                                  \
        for (int64_t nm = 0; nm < g->N * g->M; nm++) {                                                         \
            int64_t n = nm / g->M, m = nm % g->M, grp = m / g->Mg;                                             \
            for (int64_t o0 = 0; o0 < g->out[0]; o0++)                                                         \
                for (int64_t o1 = 0; o1 < g->out[1]; o1++)                                                     \
                    for (int64_t o2 = 0; o2 < g->out[2]; o2++) {                                               \
                        double acc = B ? (double)B[m] : 0.0;                                                   \
                        for (int64_t ci = 0; ci < g->Cg; ci++) {                                               \
                            const T *xp = X + (n * g->C + grp * g->Cg + ci) * isz;                             \
                            const T *wp = W + (m * g->Cg + ci) * ksz;                                          \
                            for (int64_t k0 = 0; k0 < g->k[0]; k0++) {                                         \
                                int64_t i0 = o0 * g->s[0] - g->pb[0] + k0 * g->d[0];                           \
                                if (i0 < 0 || i0 >= g->in[0]) continue;                                        \
                                for (int64_t k1 = 0; k1 < g->k[1]; k1++) {                                     \
                                    int64_t i1 = o1 * g->s[1] - g->pb[1] + k1 * g->d[1];                       \
                                    if (i1 < 0 || i1 >= g->in[1]) continue;                                    \
                                    for (int64_t k2 = 0; k2 < g->k[2]; k2++) {                                 \
                                        int64_t i2 = o2 * g->s[2] - g->pb[2] + k2 * g->d[2];                   \
                                        if (i2 < 0 || i2 >= g->in[2]) continue;                                \
                                        acc += (double)xp[(i0 * g->in[1] + i1) * g->in[2] + i2] *              \
                                               (double)wp[(k0 * g->k[1] + k1) * g->k[2] + k2];                 \
                                    }                                                                          \
                                }                                                                              \
                            }                                                                                  \
                        }                                                                                      \
                        Y[nm * osz + (o0 * g->out[1] + o1) * g->out[2] + o2] = (T)acc;                         \
                    }                                                                                          \
        }                                                                                                      \
    }

CONV_REF_IMPL(conv_ref_f32, float)
CONV_REF_IMPL(conv_ref_f64, double)

static eng_status conv_exec_ref(krn_call *c) {
    const krn_conv_params *p = c->params;
    conv_geo g;
    conv_geo_get(p, &c->in[0], &c->out[0], &g);
    eng_tensor *y = &c->out[0];
    int64_t n = eng_tensor_numel(y);
    if (n == 0) return ENG_STATUS_OK;
    int has_res = p->has_residual && c->nin > 3 && c->in[3].data;
    if (y->dtype == ENG_DTYPE_F32) {
        conv_ref_f32(c, &g);
        float *Y = y->data;
        if (has_res)
            for (int64_t i = 0; i < n; i++) Y[i] += (float)conv_res_get(&c->in[3], y, i);
        krn_nn_act_apply_f32(Y, n, &p->act, c->nthreads);
    } else if (y->dtype == ENG_DTYPE_F64) {
        conv_ref_f64(c, &g);
        double *Y = y->data;
        if (has_res)
            for (int64_t i = 0; i < n; i++) Y[i] += conv_res_get(&c->in[3], y, i);
        krn_nn_act_apply_f64(Y, n, &p->act);
    } else {
        return eng_err(ENG_STATUS_UNSUPPORTED, "conv dtype %s", eng_dtype_name(y->dtype));
    }
    return ENG_STATUS_OK;
}

static eng_status conv_dw_split_exec(krn_call *c, conv_state *s, dnnl_stream_t stream) {
    eng_tensor mid = c->out[0];
    mid.data = s->scratch;
    mid.dims[2] = c->in[0].dims[2], mid.dims[3] = c->in[0].dims[3];
    eng_tensor in1[3] = {c->in[0], c->in[1], c->nin > 2 ? c->in[2] : (eng_tensor){0}};
    eng_tensor in2[3] = {mid, c->in[4], c->nin > 5 ? c->in[5] : (eng_tensor){0}};
    krn_call c1 = *c, c2 = *c;
    c1.in = in1, c1.nin = 3, c2.in = in2, c2.nin = 3;
    ENG_TRY(conv_run_prim(s->sub[0], stream, c->in[0].data, s->scratch, &c1));
    return conv_run_prim(s->sub[1], stream, s->scratch, c->out[0].data, &c2);
}

eng_status krn_cpu_conv_exec(krn_call *c) {
    conv_state *s = c->state;
    const krn_conv_params *p = c->params;
    if (p->pool && (!s || !s->sub[0]))
        return eng_err(ENG_STATUS_INTERNAL, "conv+pool kernel has no primitive (dtype %s)", eng_dtype_name(c->in[0].dtype));
    if ((!s || !s->use_dnnl) && c->compute) return eng_err(ENG_STATUS_INTERNAL, "conv: no %s primitive", eng_dtype_name(c->compute));
    if (!s || !s->use_dnnl) return conv_exec_ref(c);
    dnnl_stream_t stream;
    ENG_TRY(krn_dnnl_stream(&stream));
    krn_dnnl_set_threads(c->nthreads);
    if (p->pool) return conv_pool_exec(c, s, stream);
    if (s->dw_split) return conv_dw_split_exec(c, s, stream);
    return conv_run_prim(s, stream, c->in[0].data, c->out[0].data, c);
}
