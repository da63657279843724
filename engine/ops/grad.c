/* grad.c - op definitions of the internal "com.tensord" gradient ops that engine/train/autodiff.c emits, and of
 * TrainingDropout (what eng_graph_set_training turns Dropout into).
 *
 * A gradient op "<Fwd>Grad" carries the attributes of its forward node and resolves them with the forward op's
 * own prepare + infer (grad_fwd below) on the forward's input shapes, so pads, axes and slices mean exactly
 * what they meant going forward; the kernel gets the forward's resolved krn params (krn-grad.h). Infer also
 * checks that dy has the forward output's shape. Kernels are float32 (FillLike and ReduceToShape: any float).
 */
#include <stdlib.h>
#include <string.h>

#include "../../kernels/krn-grad.h"
#include "op.h"

static void *grad_params(eng_op_ctx *c, size_t n) {
    c->params = calloc(1, n);
    if (!c->params) eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s params", c->node->op_type);
    return c->params;
}

static eng_status grad_check_f32(const eng_tensor *t, const char *what) {
    if (t->dtype != ENG_DTYPE_F32)
        return eng_err(ENG_STATUS_UNSUPPORTED, "input '%s' has dtype %s; gradient kernels take float32", what,
                       eng_dtype_name(t->dtype));
    return ENG_STATUS_OK;
}

static eng_status grad_check_same(const eng_tensor *a, const eng_tensor *b, const char *an, const char *bn) {
    if (!eng_shape_equal(a, b)) {
        char x[128], y[128];
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "'%s' has shape %s, expected %s (shape of %s)", an,
                       eng_shape_str(a->dims, a->ndim, x, sizeof x), eng_shape_str(b->dims, b->ndim, y, sizeof y), bn);
    }
    return ENG_STATUS_OK;
}

static void grad_set_like(eng_op_ctx *c, int out, const eng_tensor *t, eng_dtype dt) {
    c->out[out].dtype = dt;
    c->out[out].ndim = t->ndim;
    memcpy(c->out[out].dims, t->dims, sizeof t->dims);
}

/* Run the forward op `op` (default domain) on inputs in[0..nin) as if it were this node with nout outputs;
 * copy its resolved params (size bytes) into dst and its output 0 shape into *y (if y). */
static eng_status grad_fwd(eng_op_ctx *c, const char *op, eng_tensor *in, int nin, int nout, void *dst, size_t size,
                           eng_tensor *y) {
    const eng_op_def *d = eng_op_find("", op);
    if (!d) return eng_err(ENG_STATUS_INTERNAL, "forward op '%s' is not registered", op);
    eng_node fake = *c->node;
    fake.op_type = (char *)op;
    fake.domain = (char *)"";
    fake.nin = nin;
    fake.nout = nout;
    eng_tensor out[8];
    memset(out, 0, sizeof out);
    eng_op_ctx fc = {.graph = c->graph, .node = &fake, .opset = c->opset, .in = in, .nin = nin, .out = out, .nout = nout};
    eng_status st = d->prepare ? d->prepare(&fc) : ENG_STATUS_OK;
    if (st == ENG_STATUS_OK) st = d->infer(&fc);
    if (st == ENG_STATUS_OK && dst) memcpy(dst, fc.params, size);
    if (st == ENG_STATUS_OK && y) *y = out[0];
    if (fc.params) {
        if (d->free_params) d->free_params(fc.params);
        else free(fc.params);
    }
    return st;
}

static eng_status grad_fwd_checked(eng_op_ctx *c, const char *op, eng_tensor *in, int nin, int nout, void *dst,
                                   size_t size) {
    eng_tensor y;
    eng_status st = grad_fwd(c, op, in, nin, nout, dst, size, &y);
    if (st == ENG_STATUS_NEEDS_DATA) return st;
    if (st != ENG_STATUS_OK) return eng_err_prefix(st, "forward %s: ", op);
    return grad_check_same(&c->in[0], &y, "dy", "the forward output");
}

/* ---- FillLike(x; value) ---- */

static eng_status fill_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 1, 1));
    krn_fill_params *p = grad_params(c, sizeof *p);
    if (!p) return ENG_STATUS_OUT_OF_MEMORY;
    p->value = eng_node_attr_float(c->node, "value", 0.0f);
    return ENG_STATUS_OK;
}

static eng_status fill_infer(eng_op_ctx *c) {
    if (!eng_dtype_is_float(c->in[0].dtype))
        return eng_err(ENG_STATUS_UNSUPPORTED, "FillLike of dtype %s", eng_dtype_name(c->in[0].dtype));
    eng_op_same_as_input(c, 0, 0);
    return ENG_STATUS_OK;
}

/* ---- ReduceToShape(dy, like) ---- */

static eng_status rts_prepare(eng_op_ctx *c) { return eng_op_check_arity(c, 2, 2); }

static eng_status rts_infer(eng_op_ctx *c) {
    const eng_tensor *dy = &c->in[0], *like = &c->in[1];
    if (!eng_dtype_is_float(dy->dtype))
        return eng_err(ENG_STATUS_UNSUPPORTED, "ReduceToShape of dtype %s", eng_dtype_name(dy->dtype));
    int off = dy->ndim - like->ndim;
    for (int i = 0; i < like->ndim; i++)
        if (off < 0 || (like->dims[i] != 1 && like->dims[i] != dy->dims[off + i])) {
            char a[128], b[128];
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "gradient shape %s does not reduce to %s",
                           eng_shape_str(dy->dims, dy->ndim, a, sizeof a), eng_shape_str(like->dims, like->ndim, b, sizeof b));
        }
    grad_set_like(c, 0, like, dy->dtype);
    return ENG_STATUS_OK;
}

/* ---- activation gradients: (dy, x or y [, min, max]) ---- */

static eng_status act_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 2, 4));
    krn_act_grad_params *p = grad_params(c, sizeof *p);
    if (!p) return ENG_STATUS_OUT_OF_MEMORY;
    static const char *names[] = {"ReluGrad", "LeakyReluGrad", "GeluGrad", "ErfGrad", "SigmoidGrad", "TanhGrad", "ClipGrad",
                                  "SiluGrad"};
    p->kind = -1;
    for (int i = 0; i < (int)(sizeof names / sizeof *names); i++)
        if (!strcmp(c->node->op_type, names[i])) p->kind = i;
    if (p->kind < 0) return eng_err(ENG_STATUS_INTERNAL, "unknown activation gradient %s", c->node->op_type);
    p->alpha = eng_node_attr_float(c->node, "alpha", 0.01f);
    p->gelu_tanh = !strcmp(eng_node_attr_str(c->node, "approximate", "none"), "tanh");
    p->clip_min = eng_node_attr_float(c->node, "min", -3.402823466e38f);
    p->clip_max = eng_node_attr_float(c->node, "max", 3.402823466e38f);
    return ENG_STATUS_OK;
}

static eng_status act_infer(eng_op_ctx *c) {
    ENG_TRY(grad_check_f32(&c->in[0], "dy"));
    ENG_TRY(grad_check_f32(&c->in[1], "x"));
    ENG_TRY(grad_check_same(&c->in[0], &c->in[1], "dy", "x"));
    for (int i = 2; i < c->nin; i++)
        if (eng_op_has_input(c, i) && eng_tensor_numel(&c->in[i]) != 1)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "Clip bound %d is not a scalar", i);
    eng_op_same_as_input(c, 0, 0);
    return ENG_STATUS_OK;
}

/* ---- SoftmaxGrad / LogSoftmaxGrad (dy, y) ---- */

static eng_status softmax_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 2, 2));
    krn_softmax_grad_params *p = grad_params(c, sizeof *p);
    if (!p) return ENG_STATUS_OUT_OF_MEMORY;
    p->log = !strcmp(c->node->op_type, "LogSoftmaxGrad");
    return ENG_STATUS_OK;
}

static eng_status softmax_infer(eng_op_ctx *c) {
    krn_softmax_grad_params *p = c->params;
    ENG_TRY(grad_check_f32(&c->in[0], "dy"));
    ENG_TRY(grad_check_f32(&c->in[1], "y"));
    ENG_TRY(grad_fwd_checked(c, p->log ? "LogSoftmax" : "Softmax", &c->in[1], 1, 1, &p->sm, sizeof p->sm));
    eng_op_same_as_input(c, 0, 0);
    return ENG_STATUS_OK;
}

/* ---- ConvGrad (dy, x, w) -> dx, dw, db ---- */

static eng_status conv_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 3, 3));
    if (c->nout > 3) return eng_err(ENG_STATUS_INVALID_MODEL, "%d outputs, at most 3", c->nout);
    return grad_params(c, sizeof(krn_conv_grad_params)) ? ENG_STATUS_OK : ENG_STATUS_OUT_OF_MEMORY;
}

static eng_status conv_infer(eng_op_ctx *c) {
    krn_conv_grad_params *p = c->params;
    for (int i = 0; i < 3; i++) ENG_TRY(grad_check_f32(&c->in[i], i == 0 ? "dy" : i == 1 ? "x" : "w"));
    ENG_TRY(grad_fwd_checked(c, "Conv", &c->in[1], 2, 1, &p->conv, sizeof p->conv));
    grad_set_like(c, 0, &c->in[1], ENG_DTYPE_F32);
    if (c->nout > 1) grad_set_like(c, 1, &c->in[2], ENG_DTYPE_F32);
    if (c->nout > 2) {
        c->out[2].dtype = ENG_DTYPE_F32;
        c->out[2].ndim = 1;
        c->out[2].dims[0] = c->in[2].dims[0];
    }
    return ENG_STATUS_OK;
}

/* ---- MaxPoolGrad / AveragePoolGrad / GlobalAveragePoolGrad / GlobalMaxPoolGrad (dy, x) ---- */

static eng_status pool_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 2, 2));
    return grad_params(c, sizeof(krn_pool_grad_params)) ? ENG_STATUS_OK : ENG_STATUS_OUT_OF_MEMORY;
}

static eng_status pool_infer(eng_op_ctx *c) {
    krn_pool_grad_params *p = c->params;
    char fwd[64];
    size_t n = strlen(c->node->op_type);
    if (n < 5 || n - 4 >= sizeof fwd) return eng_err(ENG_STATUS_INTERNAL, "bad pool gradient %s", c->node->op_type);
    memcpy(fwd, c->node->op_type, n - 4);
    fwd[n - 4] = 0;
    ENG_TRY(grad_check_f32(&c->in[0], "dy"));
    ENG_TRY(grad_check_f32(&c->in[1], "x"));
    ENG_TRY(grad_fwd_checked(c, fwd, &c->in[1], 1, 1, &p->pool, sizeof p->pool));
    if (p->pool.x_layout != KRN_NN_LAYOUT_PLAIN) return eng_err(ENG_STATUS_UNSUPPORTED, "blocked layout");
    p->relu = p->pool.kind == KRN_POOL_MAX && eng_node_attr_int(c->node, "fused_relu", 0) != 0;
    grad_set_like(c, 0, &c->in[1], ENG_DTYPE_F32);
    return ENG_STATUS_OK;
}

/* ---- MatMulGrad (dy, A, B) -> dA, dB ---- */

static eng_status matmul_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 3, 3));
    if (c->nout > 2) return eng_err(ENG_STATUS_INVALID_MODEL, "%d outputs, at most 2", c->nout);
    return ENG_STATUS_OK;
}

static eng_status matmul_infer(eng_op_ctx *c) {
    for (int i = 0; i < 3; i++) ENG_TRY(grad_check_f32(&c->in[i], i == 0 ? "dy" : i == 1 ? "A" : "B"));
    if (c->in[1].ndim < 1 || c->in[2].ndim < 1) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "MatMul of a scalar");
    ENG_TRY(grad_fwd_checked(c, "MatMul", &c->in[1], 2, 1, NULL, 0));
    grad_set_like(c, 0, &c->in[1], ENG_DTYPE_F32);
    if (c->nout > 1) grad_set_like(c, 1, &c->in[2], ENG_DTYPE_F32);
    return ENG_STATUS_OK;
}

/* ---- BatchNormalizationGrad (dy, x, scale, mean, var) -> dx, dscale, dB ---- */

static eng_status bn_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 5, 5));
    if (c->nout > 3) return eng_err(ENG_STATUS_INVALID_MODEL, "%d outputs, at most 3", c->nout);
    krn_bn_grad_params *p = grad_params(c, sizeof *p);
    if (!p) return ENG_STATUS_OUT_OF_MEMORY;
    p->epsilon = eng_node_attr_float(c->node, "epsilon", 1e-5f);
    p->training = eng_node_attr_int(c->node, "training_mode", 1) != 0;
    return ENG_STATUS_OK;
}

static eng_status bn_infer(eng_op_ctx *c) {
    static const char *names[5] = {"dy", "X", "scale", "mean", "var"};
    for (int i = 0; i < 5; i++) ENG_TRY(grad_check_f32(&c->in[i], names[i]));
    ENG_TRY(grad_check_same(&c->in[0], &c->in[1], "dy", "X"));
    if (c->in[1].ndim < 2) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "X has rank %d, expected (N, C, ...)", c->in[1].ndim);
    for (int i = 2; i < 5; i++)
        if (eng_tensor_numel(&c->in[i]) != c->in[1].dims[1])
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "'%s' has %lld elements, expected C = %lld", names[i],
                           (long long)eng_tensor_numel(&c->in[i]), (long long)c->in[1].dims[1]);
    grad_set_like(c, 0, &c->in[1], ENG_DTYPE_F32);
    for (int j = 1; j < c->nout; j++) grad_set_like(c, j, &c->in[2], ENG_DTYPE_F32);
    return ENG_STATUS_OK;
}

/* ---- LayerNormalizationGrad (dy, x, scale) -> dx, dscale, dB (normalised dims) ---- */

static eng_status ln_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 3, 3));
    if (c->nout > 3) return eng_err(ENG_STATUS_INVALID_MODEL, "%d outputs, at most 3", c->nout);
    return grad_params(c, sizeof(krn_ln_grad_params)) ? ENG_STATUS_OK : ENG_STATUS_OUT_OF_MEMORY;
}

static eng_status ln_infer(eng_op_ctx *c) {
    krn_ln_grad_params *p = c->params;
    for (int i = 0; i < 3; i++) ENG_TRY(grad_check_f32(&c->in[i], i == 0 ? "dy" : i == 1 ? "X" : "Scale"));
    ENG_TRY(grad_fwd_checked(c, "LayerNormalization", &c->in[1], 2, 1, &p->ln, sizeof p->ln));
    p->scale_numel = eng_tensor_numel(&c->in[2]);
    grad_set_like(c, 0, &c->in[1], ENG_DTYPE_F32);
    for (int j = 1; j < c->nout; j++) {
        c->out[j].dtype = ENG_DTYPE_F32;
        c->out[j].ndim = c->in[1].ndim - p->ln.axis;
        for (int d = p->ln.axis; d < c->in[1].ndim; d++) c->out[j].dims[d - p->ln.axis] = c->in[1].dims[d];
    }
    return ENG_STATUS_OK;
}

/* ---- GatherGrad (dy, indices, like) ---- */

static eng_status gather_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 3, 3));
    return grad_params(c, sizeof(krn_gather_params)) ? ENG_STATUS_OK : ENG_STATUS_OUT_OF_MEMORY;
}

static eng_status gather_infer(eng_op_ctx *c) {
    ENG_TRY(grad_check_f32(&c->in[0], "dy"));
    eng_tensor in[2] = {c->in[2], c->in[1]};
    in[0].dtype = c->in[0].dtype;
    ENG_TRY(grad_fwd_checked(c, "Gather", in, 2, 1, c->params, sizeof(krn_gather_params)));
    grad_set_like(c, 0, &c->in[2], ENG_DTYPE_F32);
    return ENG_STATUS_OK;
}

/* ---- SliceGrad (dy, x, starts, ends, axes, steps) ---- */

static eng_status slice_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 2, 6));
    return grad_params(c, sizeof(krn_slice_params)) ? ENG_STATUS_OK : ENG_STATUS_OUT_OF_MEMORY;
}

static eng_status slice_infer(eng_op_ctx *c) {
    ENG_TRY(grad_check_f32(&c->in[0], "dy"));
    ENG_TRY(grad_fwd_checked(c, "Slice", &c->in[1], c->nin - 1, 1, c->params, sizeof(krn_slice_params)));
    grad_set_like(c, 0, &c->in[1], ENG_DTYPE_F32);
    return ENG_STATUS_OK;
}

/* ---- ConcatGrad (dy, x0..xk) -> dx0..dxk ---- */

static eng_status concat_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 2, -1));
    if (c->nout != c->nin - 1)
        return eng_err(ENG_STATUS_INVALID_MODEL, "%d outputs for %d concatenated inputs", c->nout, c->nin - 1);
    return grad_params(c, sizeof(krn_axis_params)) ? ENG_STATUS_OK : ENG_STATUS_OUT_OF_MEMORY;
}

static eng_status concat_infer(eng_op_ctx *c) {
    ENG_TRY(grad_check_f32(&c->in[0], "dy"));
    ENG_TRY(grad_fwd_checked(c, "Concat", &c->in[1], c->nin - 1, 1, c->params, sizeof(krn_axis_params)));
    for (int j = 0; j < c->nout; j++) grad_set_like(c, j, &c->in[j + 1], ENG_DTYPE_F32);
    return ENG_STATUS_OK;
}

/* ---- ReduceSumGrad / ReduceMeanGrad (dy, x [, axes]) ---- */

static eng_status reduce_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 2, 3));
    krn_reduce_grad_params *p = grad_params(c, sizeof *p);
    if (!p) return ENG_STATUS_OUT_OF_MEMORY;
    p->mean = !strcmp(c->node->op_type, "ReduceMeanGrad");
    return ENG_STATUS_OK;
}

static eng_status reduce_infer(eng_op_ctx *c) {
    krn_reduce_grad_params *p = c->params;
    ENG_TRY(grad_check_f32(&c->in[0], "dy"));
    ENG_TRY(grad_fwd_checked(c, p->mean ? "ReduceMean" : "ReduceSum", &c->in[1], c->nin - 1, 1, &p->red, sizeof p->red));
    grad_set_like(c, 0, &c->in[1], ENG_DTYPE_F32);
    return ENG_STATUS_OK;
}

/* ---- TrainingDropout (x) -> y, mask; DropoutGrad (dy, mask) ---- */

static eng_status tdrop_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 1, 2));
    krn_dropout_train_params *p = grad_params(c, sizeof *p);
    if (!p) return ENG_STATUS_OUT_OF_MEMORY;
    p->ratio = eng_node_attr_float(c->node, "ratio", 0.5f);
    p->seed = eng_node_attr_int(c->node, "seed", 0);
    if (!(p->ratio >= 0 && p->ratio < 1))
        return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'ratio' = %g is outside [0, 1)", p->ratio);
    return ENG_STATUS_OK;
}

static eng_status tdrop_infer(eng_op_ctx *c) {
    if (!strcmp(c->node->op_type, "DropoutGrad")) {
        ENG_TRY(grad_check_f32(&c->in[0], "dy"));
        ENG_TRY(grad_check_same(&c->in[0], &c->in[1], "dy", "mask"));
        if (c->in[1].dtype != ENG_DTYPE_BOOL) return eng_err(ENG_STATUS_INVALID_MODEL, "mask must be bool");
        eng_op_same_as_input(c, 0, 0);
        return ENG_STATUS_OK;
    }
    ENG_TRY(grad_check_f32(&c->in[0], "data"));
    eng_op_same_as_input(c, 0, 0);
    if (c->nout > 1) grad_set_like(c, 1, &c->in[0], ENG_DTYPE_BOOL);
    return ENG_STATUS_OK;
}

/* ---- SoftmaxCrossEntropyLossGrad / NegativeLogLikelihoodLossGrad ---- */

static eng_status loss_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 3, 5));
    return grad_params(c, sizeof(krn_loss_grad_params)) ? ENG_STATUS_OK : ENG_STATUS_OUT_OF_MEMORY;
}

static eng_status loss_infer(eng_op_ctx *c) {
    krn_loss_grad_params *p = c->params;
    int sce = !strncmp(c->node->op_type, "SoftmaxCrossEntropyLoss", 23);
    ENG_TRY(grad_check_f32(&c->in[0], "dloss"));
    ENG_TRY(grad_check_f32(&c->in[1], "scores"));
    int nfwd = eng_op_has_input(c, 3) ? 3 : 2;
    ENG_TRY(grad_fwd_checked(c, sce ? "SoftmaxCrossEntropyLoss" : "NegativeLogLikelihoodLoss", &c->in[1], nfwd, 1,
                             &p->loss, sizeof p->loss));
    if (eng_op_has_input(c, 4)) {
        if (!sce) return eng_err(ENG_STATUS_INVALID_MODEL, "dlog_prob input on a NegativeLogLikelihoodLoss gradient");
        ENG_TRY(grad_check_f32(&c->in[4], "dlog_prob"));
        ENG_TRY(grad_check_same(&c->in[4], &c->in[1], "dlog_prob", "scores"));
    }
    grad_set_like(c, 0, &c->in[1], ENG_DTYPE_F32);
    return ENG_STATUS_OK;
}

#define GRAD_OP(name, kernel, flags, fn) {name, "com.tensord", kernel, flags, fn##_prepare, fn##_infer, NULL}

const eng_op_def eng_ops_grad[] = {
    GRAD_OP("FillLike", "grad_fill", ENG_OP_SHAPE_ONLY, fill),
    GRAD_OP("ReduceToShape", "grad_reduce_to_shape", ENG_OP_ALIAS_SAME, rts),
    GRAD_OP("ReluGrad", "grad_act", 0, act),
    GRAD_OP("LeakyReluGrad", "grad_act", 0, act),
    GRAD_OP("GeluGrad", "grad_act", 0, act),
    GRAD_OP("SiluGrad", "grad_act", 0, act),
    GRAD_OP("ErfGrad", "grad_act", 0, act),
    GRAD_OP("SigmoidGrad", "grad_act", 0, act),
    GRAD_OP("TanhGrad", "grad_act", 0, act),
    GRAD_OP("ClipGrad", "grad_act", 0, act),
    GRAD_OP("SoftmaxGrad", "grad_softmax", 0, softmax),
    GRAD_OP("LogSoftmaxGrad", "grad_softmax", 0, softmax),
    GRAD_OP("ConvGrad", "grad_conv", 0, conv),
    GRAD_OP("MaxPoolGrad", "grad_pool", 0, pool),
    GRAD_OP("AveragePoolGrad", "grad_pool", 0, pool),
    GRAD_OP("GlobalAveragePoolGrad", "grad_pool", 0, pool),
    GRAD_OP("GlobalMaxPoolGrad", "grad_pool", 0, pool),
    GRAD_OP("MatMulGrad", "grad_matmul", 0, matmul),
    GRAD_OP("BatchNormalizationGrad", "grad_batchnorm", 0, bn),
    GRAD_OP("LayerNormalizationGrad", "grad_layernorm", 0, ln),
    GRAD_OP("GatherGrad", "grad_gather", 0, gather),
    GRAD_OP("SliceGrad", "grad_slice", 0, slice),
    GRAD_OP("ConcatGrad", "grad_concat", 0, concat),
    GRAD_OP("ReduceSumGrad", "grad_reduce", 0, reduce),
    GRAD_OP("ReduceMeanGrad", "grad_reduce", 0, reduce),
    GRAD_OP("TrainingDropout", "training_dropout", ENG_OP_RANDOM, tdrop),
    GRAD_OP("DropoutGrad", "grad_dropout", 0, tdrop),
    GRAD_OP("SoftmaxCrossEntropyLossGrad", "grad_loss", 0, loss),
    GRAD_OP("NegativeLogLikelihoodLossGrad", "grad_loss", 0, loss),
    {NULL},
};
