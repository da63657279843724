/* nn.c - the "nn" op family: MatMul, Gemm, Conv, ConvTranspose, MaxPool/AveragePool/LpPool and their Global
 * forms, plus the internal com.tensord ops that engine/plan/fuse.c creates (FusedConv, FusedMatMul, FusedGemm) and
 * engine/plan/fuse-attn.c's FusedAttention (kernels/krn-attn.h).
 *
 * prepare parses attributes into the kernel params of kernels/krn-nn.h (wrapped in a struct whose first member
 * is the kernel params, so the kernel sees exactly krn_*_params); infer resolves kernel shapes from W, auto_pad
 * into explicit pads and the output shapes. Params are per plan and infer may run again with the same params
 * (dynamic plans): infer only writes values derived from shapes, never accumulates.
 * Fused-op attributes: "act" (int krn_nn_act), "act_alpha", "act_beta" (floats).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/krn-attn.h"
#include "../../kernels/krn-nn.h"
#include "op.h"

enum { NN_PAD_NOTSET = 0, NN_PAD_SAME_UPPER, NN_PAD_SAME_LOWER, NN_PAD_VALID };

static eng_status nn_parse_auto_pad(const eng_node *n, int *out) {
    const char *s = eng_node_attr_str(n, "auto_pad", "NOTSET");
    if (!strcmp(s, "NOTSET") || !*s) *out = NN_PAD_NOTSET;
    else if (!strcmp(s, "SAME_UPPER")) *out = NN_PAD_SAME_UPPER;
    else if (!strcmp(s, "SAME_LOWER")) *out = NN_PAD_SAME_LOWER;
    else if (!strcmp(s, "VALID")) *out = NN_PAD_VALID;
    else return eng_err(ENG_STATUS_INVALID_MODEL, "auto_pad '%s' is not NOTSET, SAME_UPPER, SAME_LOWER or VALID", s);
    return ENG_STATUS_OK;
}

/* Reads an optional ints attribute of up to `max` entries; *n = -1 when absent. */
static eng_status nn_ints_attr(const eng_node *node, const char *name, int64_t *dst, int max, int *n) {
    const int64_t *v;
    int k = eng_node_attr_ints(node, name, &v);
    *n = k;
    if (k < 0) return ENG_STATUS_OK;
    if (k > max) return eng_err(ENG_STATUS_UNSUPPORTED, "attribute %s has %d entries; at most %d supported", name, k, max);
    memcpy(dst, v, (size_t)k * sizeof *v);
    return ENG_STATUS_OK;
}

void eng_nn_act_attrs(const eng_node *n, krn_nn_act_params *a) {
    a->kind = (int)eng_node_attr_int(n, "act", KRN_NN_ACT_NONE);
    a->alpha = eng_node_attr_float(n, "act_alpha", 0.f);
    a->beta = eng_node_attr_float(n, "act_beta", 0.f);
}

/* ---------------------------------------------------------------- Conv / ConvTranspose */

typedef struct nn_conv_op {
    krn_conv_params k; /* first: what the kernel sees */
    int auto_pad;
    int nkshape, npads, nstrides, ndil, noutpad, noutshape;
    int64_t kshape[KRN_NN_MAX_SPATIAL], pads[2 * KRN_NN_MAX_SPATIAL], strides[KRN_NN_MAX_SPATIAL];
    int64_t dil[KRN_NN_MAX_SPATIAL], outpad[KRN_NN_MAX_SPATIAL], outshape[KRN_NN_MAX_SPATIAL + 2];
} nn_conv_op;

static eng_status nn_conv_prepare_common(eng_op_ctx *c, int transposed, int fused) {
    ENG_TRY(eng_op_check_arity(c, 2, fused ? 6 : 3));
    nn_conv_op *p = calloc(1, sizeof *p);
    if (!p) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "conv params");
    c->params = p;
    const eng_node *n = c->node;
    p->k.transposed = transposed;
    p->k.group = eng_node_attr_int(n, "group", 1);
    if (p->k.group < 1) return eng_err(ENG_STATUS_INVALID_MODEL, "group %lld must be >= 1", (long long)p->k.group);
    ENG_TRY(nn_parse_auto_pad(n, &p->auto_pad));
    ENG_TRY(nn_ints_attr(n, "kernel_shape", p->kshape, KRN_NN_MAX_SPATIAL, &p->nkshape));
    ENG_TRY(nn_ints_attr(n, "pads", p->pads, 2 * KRN_NN_MAX_SPATIAL, &p->npads));
    ENG_TRY(nn_ints_attr(n, "strides", p->strides, KRN_NN_MAX_SPATIAL, &p->nstrides));
    ENG_TRY(nn_ints_attr(n, "dilations", p->dil, KRN_NN_MAX_SPATIAL, &p->ndil));
    if (transposed) {
        ENG_TRY(nn_ints_attr(n, "output_padding", p->outpad, KRN_NN_MAX_SPATIAL, &p->noutpad));
        ENG_TRY(nn_ints_attr(n, "output_shape", p->outshape, KRN_NN_MAX_SPATIAL + 2, &p->noutshape));
    }
    p->k.x_layout = (int)eng_node_attr_int(n, "x_layout", 0);
    p->k.y_layout = (int)eng_node_attr_int(n, "y_layout", 0);
    if (fused) {
        eng_nn_act_attrs(n, &p->k.act);
        p->k.has_residual = c->nin > 3 && c->node->inputs[3] >= 0;
        p->k.dw_stride = (int)eng_node_attr_int(n, "dw_stride", 0);
        p->k.dw_act.kind = (int)eng_node_attr_int(n, "dw_act", KRN_NN_ACT_NONE);
        p->k.dw_act.alpha = eng_node_attr_float(n, "dw_act_alpha", 0.f);
        p->k.dw_act.beta = eng_node_attr_float(n, "dw_act_beta", 0.f);
        if (p->k.dw_stride && (p->k.dw_stride > 2 || p->k.has_residual || c->nin < 5 || c->node->inputs[4] < 0))
            return eng_err(ENG_STATUS_INVALID_MODEL, "fused depthwise conv needs stride 1 or 2, its W and no residual");
        const int64_t *pk = NULL, *ps = NULL;
        int npk = eng_node_attr_ints(n, "pool_kernel", &pk), nps = eng_node_attr_ints(n, "pool_strides", &ps);
        if (npk >= 0) { /* engine/plan/fuse.c folded a following 2-D MaxPool (no pads, no dilation) into this conv */
            if (npk != 2 || nps != 2 || p->k.has_residual)
                return eng_err(ENG_STATUS_INVALID_MODEL, "fused pool needs 2-D pool_kernel and pool_strides and no residual");
            for (int i = 0; i < 2; i++) {
                if (pk[i] < 1 || ps[i] < 1) return eng_err(ENG_STATUS_INVALID_MODEL, "fused pool kernel/strides must be >= 1");
                p->k.pool_kernel[i] = pk[i];
                p->k.pool_strides[i] = ps[i];
            }
            p->k.pool = 1;
        }
    }
    return ENG_STATUS_OK;
}

static eng_status nn_conv_prepare(eng_op_ctx *c) { return nn_conv_prepare_common(c, 0, 0); }
static eng_status nn_fconv_prepare(eng_op_ctx *c) { return nn_conv_prepare_common(c, 0, 1); }
static eng_status nn_convt_prepare(eng_op_ctx *c) { return nn_conv_prepare_common(c, 1, 0); }

/* Fill strides/dilations/kernel and check the explicit attribute lengths against nsp. */
static eng_status nn_conv_spatial(nn_conv_op *p, const eng_tensor *w, int nsp) {
    krn_conv_params *k = &p->k;
    k->nspatial = nsp;
    if ((p->nstrides >= 0 && p->nstrides != nsp) || (p->ndil >= 0 && p->ndil != nsp) ||
        (p->npads >= 0 && p->npads != 2 * nsp) || (p->nkshape >= 0 && p->nkshape != nsp))
        return eng_err(ENG_STATUS_INVALID_MODEL, "strides/dilations/pads/kernel_shape lengths do not match %d spatial dims", nsp);
    for (int i = 0; i < nsp; i++) {
        k->kernel[i] = w->dims[2 + i];
        if (p->nkshape >= 0 && p->kshape[i] != k->kernel[i])
            return eng_err(ENG_STATUS_INVALID_MODEL, "kernel_shape[%d]=%lld but W has %lld", i, (long long)p->kshape[i],
                           (long long)k->kernel[i]);
        k->strides[i] = p->nstrides >= 0 ? p->strides[i] : 1;
        k->dilations[i] = p->ndil >= 0 ? p->dil[i] : 1;
        k->output_padding[i] = p->noutpad >= 0 ? p->outpad[i] : 0;
        if (k->strides[i] < 1 || k->dilations[i] < 1 || k->kernel[i] < 1)
            return eng_err(ENG_STATUS_INVALID_MODEL, "strides, dilations and kernel dims must be >= 1");
    }
    for (int i = 0; i < 2 * nsp; i++) {
        k->pads[i] = p->npads >= 0 ? p->pads[i] : 0;
        if (k->pads[i] < 0) return eng_err(ENG_STATUS_INVALID_MODEL, "negative pads are not valid");
    }
    return ENG_STATUS_OK;
}

/* SAME_* padding for a forward window op: out = ceil(in / stride). */
static void nn_same_pads(int mode, int64_t in, int64_t k, int64_t s, int64_t d, int64_t *pb, int64_t *pe) {
    int64_t out = (in + s - 1) / s;
    int64_t total = (out - 1) * s + (k - 1) * d + 1 - in;
    if (total < 0) total = 0;
    *pb = mode == NN_PAD_SAME_UPPER ? total / 2 : total - total / 2;
    *pe = total - *pb;
}

static eng_status nn_conv_infer(eng_op_ctx *c) {
    nn_conv_op *p = c->params;
    krn_conv_params *k = &p->k;
    const eng_tensor *x = &c->in[0], *w = &c->in[1];
    if (x->dtype != ENG_DTYPE_F32 && x->dtype != ENG_DTYPE_F64)
        return eng_err(ENG_STATUS_UNSUPPORTED, "X dtype %s (float32/float64 supported)", eng_dtype_name(x->dtype));
    if (w->dtype != x->dtype)
        return eng_err(ENG_STATUS_INVALID_MODEL, "W dtype %s differs from X dtype %s", eng_dtype_name(w->dtype),
                       eng_dtype_name(x->dtype));
    int nsp = x->ndim - 2;
    if (nsp < 1 || nsp > KRN_NN_MAX_SPATIAL || w->ndim != x->ndim)
        return eng_err(ENG_STATUS_UNSUPPORTED, "X rank %d, W rank %d: need equal ranks 3..5", x->ndim, w->ndim);
    ENG_TRY(nn_conv_spatial(p, w, nsp));
    int64_t G = k->group, C = x->dims[1], M;
    if (!k->transposed) {
        M = w->dims[0];
        if (w->dims[1] * G != C || M % G)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "X has %lld channels, W is (%lld, %lld, ...) with group %lld",
                           (long long)C, (long long)M, (long long)w->dims[1], (long long)G);
    } else {
        M = w->dims[1] * G;
        if (w->dims[0] != C || C % G)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "X has %lld channels, W is (%lld, %lld, ...) with group %lld",
                           (long long)C, (long long)w->dims[0], (long long)w->dims[1], (long long)G);
    }
    if (eng_op_has_input(c, 2) && (c->in[2].dtype != x->dtype || eng_tensor_numel(&c->in[2]) != M || c->in[2].ndim != 1))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "B must be a 1-D %s tensor of %lld elements", eng_dtype_name(x->dtype),
                       (long long)M);
    eng_tensor *y = &c->out[0];
    y->dtype = x->dtype;
    y->ndim = x->ndim;
    y->dims[0] = x->dims[0];
    y->dims[1] = M;
    for (int i = 0; i < nsp; i++) {
        int64_t in = x->dims[2 + i], s = k->strides[i], d = k->dilations[i], kk = k->kernel[i];
        int64_t ext = (kk - 1) * d + 1, out;
        if (!k->transposed) {
            if (p->auto_pad == NN_PAD_VALID) k->pads[i] = k->pads[nsp + i] = 0;
            else if (p->auto_pad != NN_PAD_NOTSET) nn_same_pads(p->auto_pad, in, kk, s, d, &k->pads[i], &k->pads[nsp + i]);
            out = (in + k->pads[i] + k->pads[nsp + i] - ext) / s + 1;
        } else {
            int64_t want = -1;
            if (p->noutshape >= nsp) want = p->outshape[p->noutshape - nsp + i];
            else if (p->auto_pad == NN_PAD_SAME_UPPER || p->auto_pad == NN_PAD_SAME_LOWER) want = in * s;
            if (want >= 0) {
                int64_t total = s * (in - 1) + k->output_padding[i] + ext - want;
                if (total < 0) total = 0; /* onnxruntime: a larger output_shape leaves the tail bias-only */
                if (p->auto_pad == NN_PAD_SAME_UPPER) {
                    k->pads[i] = total / 2;
                    k->pads[nsp + i] = total - total / 2;
                } else {
                    k->pads[i] = total - total / 2;
                    k->pads[nsp + i] = total / 2;
                }
                out = want;
            } else {
                if (p->auto_pad == NN_PAD_VALID) k->pads[i] = k->pads[nsp + i] = 0;
                out = s * (in - 1) + k->output_padding[i] + ext - k->pads[i] - k->pads[nsp + i];
            }
        }
        if (out < 1 && in > 0)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "spatial dim %d: input %lld gives empty output", i, (long long)in);
        y->dims[2 + i] = out < 0 ? 0 : out;
    }
    if (k->has_residual && eng_op_has_input(c, 3)) {
        const eng_tensor *z = &c->in[3];
        const eng_tensor *ts[2] = {y, z};
        eng_tensor b;
        ENG_TRY(eng_broadcast_shapes(ts, 2, &b));
        if (z->dtype != y->dtype || !eng_shape_equal(&b, y))
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "fused residual input does not broadcast into the conv output");
    }
    if (k->dw_stride) { /* the fused 3x3 depthwise conv (pads 1) after this 1x1 one */
        const eng_tensor *wd = &c->in[4];
        if (nsp != 2 || x->dtype != ENG_DTYPE_F32 || wd->ndim != 4 || wd->dims[0] != M || wd->dims[1] != 1 ||
            wd->dims[2] != 3 || wd->dims[3] != 3 || (eng_op_has_input(c, 5) && eng_tensor_numel(&c->in[5]) != M))
            return eng_err(ENG_STATUS_INVALID_MODEL, "fused depthwise conv: W must be (%lld, 1, 3, 3) and B (%lld)",
                           (long long)M, (long long)M);
        for (int i = 0; i < 2; i++) y->dims[2 + i] = (y->dims[2 + i] - 1) / k->dw_stride + 1;
    }
    if (k->pool) {
        if (nsp != 2 || x->dtype != ENG_DTYPE_F32)
            return eng_err(ENG_STATUS_INVALID_MODEL, "fused conv+pool needs a 2-D float32 conv");
        for (int i = 0; i < 2; i++) {
            int64_t in = y->dims[2 + i];
            if (in < k->pool_kernel[i]) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "fused pool window larger than the conv output");
            y->dims[2 + i] = (in - k->pool_kernel[i]) / k->pool_strides[i] + 1;
        }
    }
    return ENG_STATUS_OK;
}

/* ---------------------------------------------------------------- pooling */

typedef struct nn_pool_op {
    krn_pool_params k;
    int auto_pad, ceil_mode;
    int nkshape, npads, nstrides, ndil;
    int64_t kshape[KRN_NN_MAX_SPATIAL], pads[2 * KRN_NN_MAX_SPATIAL], strides[KRN_NN_MAX_SPATIAL], dil[KRN_NN_MAX_SPATIAL];
} nn_pool_op;

static eng_status nn_pool_prepare_common(eng_op_ctx *c, int kind, int global) {
    ENG_TRY(eng_op_check_arity(c, 1, 1));
    nn_pool_op *p = calloc(1, sizeof *p);
    if (!p) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "pool params");
    c->params = p;
    const eng_node *n = c->node;
    p->k.kind = kind;
    p->k.global = global;
    p->k.p = 2.f;
    if (kind == KRN_POOL_LP) {
        const eng_attr *a = eng_node_attr(n, "p");
        if (a) p->k.p = a->type == ENG_ATTR_FLOAT ? a->f : (float)a->i;
    }
    p->k.x_layout = (int)eng_node_attr_int(n, "x_layout", 0);
    p->k.y_layout = (int)eng_node_attr_int(n, "y_layout", 0);
    if (global) return ENG_STATUS_OK;
    ENG_TRY(nn_parse_auto_pad(n, &p->auto_pad));
    ENG_TRY(nn_ints_attr(n, "kernel_shape", p->kshape, KRN_NN_MAX_SPATIAL, &p->nkshape));
    if (p->nkshape < 1) return eng_err(ENG_STATUS_INVALID_MODEL, "kernel_shape is required");
    ENG_TRY(nn_ints_attr(n, "pads", p->pads, 2 * KRN_NN_MAX_SPATIAL, &p->npads));
    ENG_TRY(nn_ints_attr(n, "strides", p->strides, KRN_NN_MAX_SPATIAL, &p->nstrides));
    ENG_TRY(nn_ints_attr(n, "dilations", p->dil, KRN_NN_MAX_SPATIAL, &p->ndil));
    p->ceil_mode = (int)eng_node_attr_int(n, "ceil_mode", 0);
    p->k.count_include_pad = (int)eng_node_attr_int(n, "count_include_pad", 0);
    p->k.storage_order = (int)eng_node_attr_int(n, "storage_order", 0);
    if (c->nout > 1 && kind != KRN_POOL_MAX) return eng_err(ENG_STATUS_INVALID_MODEL, "only MaxPool has an Indices output");
    return ENG_STATUS_OK;
}

static eng_status nn_maxpool_prepare(eng_op_ctx *c) { return nn_pool_prepare_common(c, KRN_POOL_MAX, 0); }
static eng_status nn_avgpool_prepare(eng_op_ctx *c) { return nn_pool_prepare_common(c, KRN_POOL_AVG, 0); }
static eng_status nn_lppool_prepare(eng_op_ctx *c) { return nn_pool_prepare_common(c, KRN_POOL_LP, 0); }
static eng_status nn_gmaxpool_prepare(eng_op_ctx *c) { return nn_pool_prepare_common(c, KRN_POOL_MAX, 1); }
static eng_status nn_gavgpool_prepare(eng_op_ctx *c) { return nn_pool_prepare_common(c, KRN_POOL_AVG, 1); }
static eng_status nn_glppool_prepare(eng_op_ctx *c) { return nn_pool_prepare_common(c, KRN_POOL_LP, 1); }

static eng_status nn_pool_infer(eng_op_ctx *c) {
    nn_pool_op *p = c->params;
    krn_pool_params *k = &p->k;
    const eng_tensor *x = &c->in[0];
    eng_dtype dt = x->dtype;
    int ok = dt == ENG_DTYPE_F32 || dt == ENG_DTYPE_F64 || dt == ENG_DTYPE_F16 ||
             (k->kind == KRN_POOL_MAX && (dt == ENG_DTYPE_I8 || dt == ENG_DTYPE_U8));
    if (!ok) return eng_err(ENG_STATUS_UNSUPPORTED, "X dtype %s", eng_dtype_name(dt));
    int nsp = x->ndim - 2;
    if (nsp < 1 || nsp > KRN_NN_MAX_SPATIAL)
        return eng_err(ENG_STATUS_UNSUPPORTED, "X rank %d (3..5 supported)", x->ndim);
    k->nspatial = nsp;
    eng_tensor *y = &c->out[0];
    y->dtype = dt;
    y->ndim = x->ndim;
    y->dims[0] = x->dims[0];
    y->dims[1] = x->dims[1];
    if (k->global) {
        for (int i = 0; i < nsp; i++) {
            k->kernel[i] = x->dims[2 + i];
            k->strides[i] = k->dilations[i] = 1;
            k->pads[i] = k->pads[nsp + i] = 0;
            y->dims[2 + i] = 1;
        }
        return ENG_STATUS_OK;
    }
    if (p->nkshape != nsp || (p->nstrides >= 0 && p->nstrides != nsp) || (p->ndil >= 0 && p->ndil != nsp) ||
        (p->npads >= 0 && p->npads != 2 * nsp))
        return eng_err(ENG_STATUS_INVALID_MODEL, "kernel_shape/strides/dilations/pads lengths do not match %d spatial dims", nsp);
    for (int i = 0; i < nsp; i++) {
        int64_t in = x->dims[2 + i], kk = p->kshape[i];
        int64_t s = p->nstrides >= 0 ? p->strides[i] : 1, d = p->ndil >= 0 ? p->dil[i] : 1;
        if (kk < 1 || s < 1 || d < 1) return eng_err(ENG_STATUS_INVALID_MODEL, "kernel, strides and dilations must be >= 1");
        k->kernel[i] = kk;
        k->strides[i] = s;
        k->dilations[i] = d;
        int64_t ext = (kk - 1) * d + 1, out;
        if (p->auto_pad == NN_PAD_SAME_UPPER || p->auto_pad == NN_PAD_SAME_LOWER) {
            nn_same_pads(p->auto_pad, in, kk, s, d, &k->pads[i], &k->pads[nsp + i]);
            out = (in + s - 1) / s;
        } else if (p->auto_pad == NN_PAD_VALID) {
            k->pads[i] = k->pads[nsp + i] = 0;
            out = p->ceil_mode ? (in - ext + s) / s : (in - ext) / s + 1;
            if (in - ext < 0) out = 0;
        } else {
            k->pads[i] = p->npads >= 0 ? p->pads[i] : 0;
            k->pads[nsp + i] = p->npads >= 0 ? p->pads[nsp + i] : 0;
            int64_t span = in + k->pads[i] + k->pads[nsp + i] - ext;
            if (span < 0) out = 0;
            else if (p->ceil_mode) {
                out = (span + s - 1) / s + 1;
                if ((out - 1) * s >= in + k->pads[i]) out--; /* last window must start inside input or left pad */
            } else out = span / s + 1;
        }
        if (out < 1) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "spatial dim %d: input %lld gives empty output", i, (long long)in);
        y->dims[2 + i] = out;
    }
    if (c->nout > 1 && c->node->outputs[1] >= 0) {
        c->out[1] = *y;
        c->out[1].dtype = ENG_DTYPE_I64;
    }
    return ENG_STATUS_OK;
}

/* ---------------------------------------------------------------- MatMul / Gemm */

static eng_status nn_matmul_prepare_common(eng_op_ctx *c, int gemm, int fused) {
    ENG_TRY(eng_op_check_arity(c, 2, gemm || fused ? 3 : 2));
    krn_matmul_params *p = calloc(1, sizeof *p);
    if (!p) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "matmul params");
    c->params = p;
    const eng_node *n = c->node;
    p->gemm = gemm;
    p->alpha = 1.f;
    p->beta = 1.f;
    if (gemm) {
        p->trans_a = (int)eng_node_attr_int(n, "transA", 0);
        p->trans_b = (int)eng_node_attr_int(n, "transB", 0);
        p->alpha = eng_node_attr_float(n, "alpha", 1.f);
        p->beta = eng_node_attr_float(n, "beta", 1.f);
    }
    if (fused) eng_nn_act_attrs(n, &p->act);
    p->has_bias = c->nin > 2 && n->inputs[2] >= 0;
    return ENG_STATUS_OK;
}

static eng_status nn_matmul_prepare(eng_op_ctx *c) { return nn_matmul_prepare_common(c, 0, 0); }
static eng_status nn_fmatmul_prepare(eng_op_ctx *c) { return nn_matmul_prepare_common(c, 0, 1); }
static eng_status nn_gemm_prepare(eng_op_ctx *c) { return nn_matmul_prepare_common(c, 1, 0); }
static eng_status nn_fgemm_prepare(eng_op_ctx *c) { return nn_matmul_prepare_common(c, 1, 1); }

static int nn_mm_dtype_ok(eng_dtype dt) {
    return dt == ENG_DTYPE_F32 || dt == ENG_DTYPE_F64 || dt == ENG_DTYPE_I32 || dt == ENG_DTYPE_I64 ||
           dt == ENG_DTYPE_U32 || dt == ENG_DTYPE_U64;
}

static eng_status nn_matmul_infer(eng_op_ctx *c) {
    krn_matmul_params *p = c->params;
    const eng_tensor *a = &c->in[0], *b = &c->in[1];
    char s1[96], s2[96];
    if (!nn_mm_dtype_ok(a->dtype)) return eng_err(ENG_STATUS_UNSUPPORTED, "dtype %s", eng_dtype_name(a->dtype));
    if (b->dtype != a->dtype)
        return eng_err(ENG_STATUS_INVALID_MODEL, "A is %s but B is %s", eng_dtype_name(a->dtype), eng_dtype_name(b->dtype));
    eng_tensor *y = &c->out[0];
    y->dtype = a->dtype;
    if (p->gemm) {
        if (a->ndim != 2 || b->ndim != 2)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "Gemm needs 2-D A and B, got %s and %s",
                           eng_shape_str(a->dims, a->ndim, s1, sizeof s1), eng_shape_str(b->dims, b->ndim, s2, sizeof s2));
        int64_t M = p->trans_a ? a->dims[1] : a->dims[0], K = p->trans_a ? a->dims[0] : a->dims[1];
        int64_t K2 = p->trans_b ? b->dims[1] : b->dims[0], N = p->trans_b ? b->dims[0] : b->dims[1];
        if (K != K2)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "Gemm inner dims differ: A %s (transA=%d), B %s (transB=%d)",
                           eng_shape_str(a->dims, a->ndim, s1, sizeof s1), p->trans_a,
                           eng_shape_str(b->dims, b->ndim, s2, sizeof s2), p->trans_b);
        y->ndim = 2;
        y->dims[0] = M;
        y->dims[1] = N;
    } else {
        if (a->ndim < 1 || b->ndim < 1) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "MatMul inputs must have rank >= 1");
        int64_t K = a->dims[a->ndim - 1], K2 = b->ndim == 1 ? b->dims[0] : b->dims[b->ndim - 2];
        if (K != K2)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "MatMul inner dims differ: %s x %s",
                           eng_shape_str(a->dims, a->ndim, s1, sizeof s1), eng_shape_str(b->dims, b->ndim, s2, sizeof s2));
        eng_tensor ba = {0}, bb = {0}, bo;
        ba.ndim = a->ndim > 2 ? a->ndim - 2 : 0;
        bb.ndim = b->ndim > 2 ? b->ndim - 2 : 0;
        memcpy(ba.dims, a->dims, (size_t)ba.ndim * sizeof(int64_t));
        memcpy(bb.dims, b->dims, (size_t)bb.ndim * sizeof(int64_t));
        const eng_tensor *ts[2] = {&ba, &bb};
        if (eng_broadcast_shapes(ts, 2, &bo) != ENG_STATUS_OK)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "MatMul batch dims do not broadcast: %s x %s",
                           eng_shape_str(a->dims, a->ndim, s1, sizeof s1), eng_shape_str(b->dims, b->ndim, s2, sizeof s2));
        y->ndim = bo.ndim;
        memcpy(y->dims, bo.dims, (size_t)bo.ndim * sizeof(int64_t));
        if (a->ndim >= 2) y->dims[y->ndim++] = a->dims[a->ndim - 2];
        if (b->ndim >= 2) y->dims[y->ndim++] = b->dims[b->ndim - 1];
    }
    if (p->has_bias && eng_op_has_input(c, 2)) {
        const eng_tensor *cc = &c->in[2];
        if (cc->dtype != a->dtype)
            return eng_err(ENG_STATUS_INVALID_MODEL, "C is %s but A is %s", eng_dtype_name(cc->dtype), eng_dtype_name(a->dtype));
        const eng_tensor *ts[2] = {y, cc};
        eng_tensor bo;
        if (eng_broadcast_shapes(ts, 2, &bo) != ENG_STATUS_OK || !eng_shape_equal(&bo, y))
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "C %s does not broadcast to the output %s",
                           eng_shape_str(cc->dims, cc->ndim, s1, sizeof s1), eng_shape_str(y->dims, y->ndim, s2, sizeof s2));
    }
    return ENG_STATUS_OK;
}

/* com.tensord FusedAttention (Q, KT, V[, M]): attributes "scale" (float, 1), "scale_div" (int, 0). */
static eng_status nn_attn_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 3, 4));
    krn_attn_params *p = calloc(1, sizeof *p);
    if (!p) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    p->scale = eng_node_attr_float(c->node, "scale", 1.0f);
    p->scale_div = eng_node_attr_int(c->node, "scale_div", 0) != 0;
    p->has_mask = eng_op_has_input(c, 3);
    c->params = p;
    if (p->scale_div && p->scale == 0.0f) return eng_err(ENG_STATUS_INVALID_MODEL, "FusedAttention divides by a scale of 0");
    return ENG_STATUS_OK;
}

static eng_status nn_attn_infer(eng_op_ctx *c) {
    const krn_attn_params *p = c->params;
    eng_dtype t = c->in[0].dtype;
    if (t != ENG_DTYPE_F32 && t != ENG_DTYPE_F64 && t != ENG_DTYPE_F16 && t != ENG_DTYPE_BF16)
        return eng_err(ENG_STATUS_UNSUPPORTED, "dtype %s", eng_dtype_name(t));
    if (c->in[1].dtype != t || c->in[2].dtype != t || (p->has_mask && c->in[3].dtype != t))
        return eng_err(ENG_STATUS_INVALID_MODEL, "Q is %s but KT is %s, V %s%s%s", eng_dtype_name(t),
                       eng_dtype_name(c->in[1].dtype), eng_dtype_name(c->in[2].dtype), p->has_mask ? ", the mask " : "",
                       p->has_mask ? eng_dtype_name(c->in[3].dtype) : "");
    krn_attn_view w;
    eng_tensor *y = &c->out[0];
    y->dtype = t;
    return krn_attn_view_make(&c->in[0], &c->in[1], &c->in[2], p->has_mask ? &c->in[3] : NULL, &w, y->dims, &y->ndim);
}

const eng_op_def eng_ops_nn[] = {
    {"MatMul", "", "matmul", 0, nn_matmul_prepare, nn_matmul_infer, NULL},
    {"Gemm", "", "matmul", 0, nn_gemm_prepare, nn_matmul_infer, NULL},
    {"Conv", "", "conv", 0, nn_conv_prepare, nn_conv_infer, NULL},
    {"ConvTranspose", "", "conv_transpose", 0, nn_convt_prepare, nn_conv_infer, NULL},
    {"MaxPool", "", "pool", 0, nn_maxpool_prepare, nn_pool_infer, NULL},
    {"AveragePool", "", "pool", 0, nn_avgpool_prepare, nn_pool_infer, NULL},
    {"LpPool", "", "pool", 0, nn_lppool_prepare, nn_pool_infer, NULL},
    {"GlobalMaxPool", "", "pool", 0, nn_gmaxpool_prepare, nn_pool_infer, NULL},
    {"GlobalAveragePool", "", "pool", 0, nn_gavgpool_prepare, nn_pool_infer, NULL},
    {"GlobalLpPool", "", "pool", 0, nn_glppool_prepare, nn_pool_infer, NULL},
    {"FusedConv", "com.tensord", "conv", 0, nn_fconv_prepare, nn_conv_infer, NULL},
    {"FusedMatMul", "com.tensord", "matmul", 0, nn_fmatmul_prepare, nn_matmul_infer, NULL},
    {"FusedGemm", "com.tensord", "matmul", 0, nn_fgemm_prepare, nn_matmul_infer, NULL},
    {"FusedAttention", "com.tensord", "attention", 0, nn_attn_prepare, nn_attn_infer, NULL},
    {NULL},
};
