/* norm.c - softmax and normalisation ops of the reduce family: Softmax, LogSoftmax, Hardmax,
 * BatchNormalization, LayerNormalization, InstanceNormalization, LRN, MeanVarianceNormalization.
 *
 * Listed in eng_ops_reduce (reduce.c). prepare parses attributes with their opset-dependent defaults
 * (Softmax-1..12 coerce to 2-D at axis 1, 13+ normalise along axis -1; BatchNormalization spatial/is_test
 * before opset 9/7, training_mode from 14); infer resolves the (outer, n, inner) views the kernels use.
 * All of these ops take floating-point tensors only.
 */
#include <stdlib.h>
#include <string.h>

#include "../../kernels/krn-reduce.h"
#include "op.h"

static eng_status norm_check_float(const eng_tensor *t, const char *what) {
    if (!eng_dtype_is_float(t->dtype))
        return eng_err(ENG_STATUS_UNSUPPORTED, "input '%s' has dtype %s; expected a floating-point type", what,
                       eng_dtype_name(t->dtype));
    return ENG_STATUS_OK;
}

static void *norm_params_new(eng_op_ctx *c, size_t n) {
    c->params = calloc(1, n);
    if (!c->params) eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s params", c->node->op_type);
    return c->params;
}

/* ---- Softmax / LogSoftmax / Hardmax ---- */

eng_status eng_norm_softmax_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 1, 1));
    krn_softmax_params *p = norm_params_new(c, sizeof *p);
    if (!p) return ENG_STATUS_OUT_OF_MEMORY;
    const char *op = c->node->op_type;
    p->kind = strcmp(op, "LogSoftmax") == 0 ? KRN_SOFTMAX_LOG : strcmp(op, "Hardmax") == 0 ? KRN_SOFTMAX_HARD : KRN_SOFTMAX;
    p->coerce_2d = c->opset < 13;
    p->axis_attr = eng_node_attr_int(c->node, "axis", p->coerce_2d ? 1 : -1);
    return ENG_STATUS_OK;
}

eng_status eng_norm_softmax_infer(eng_op_ctx *c) {
    krn_softmax_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    ENG_TRY(norm_check_float(x, "input"));
    int axis = 0;
    if (x->ndim == 0) {
        p->outer = p->n = p->inner = 1;
    } else {
        ENG_TRY(eng_norm_axis(p->axis_attr, x->ndim, &axis));
        p->outer = eng_shape_numel(x->dims, axis);
        if (p->coerce_2d) {
            p->n = eng_shape_numel(x->dims + axis, x->ndim - axis);
            p->inner = 1;
        } else {
            p->n = x->dims[axis];
            p->inner = eng_shape_numel(x->dims + axis + 1, x->ndim - axis - 1);
        }
    }
    eng_op_same_as_input(c, 0, 0);
    return ENG_STATUS_OK;
}

/* ---- BatchNormalization ---- */

eng_status eng_norm_batchnorm_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 5, 5));
    krn_batchnorm_params *p = norm_params_new(c, sizeof *p);
    if (!p) return ENG_STATUS_OUT_OF_MEMORY;
    p->epsilon = eng_node_attr_float(c->node, "epsilon", 1e-5f);
    p->momentum = eng_node_attr_float(c->node, "momentum", 0.9f);
    p->spatial = c->opset < 9 ? eng_node_attr_int(c->node, "spatial", 1) != 0 : 1;
    if (c->opset >= 14) p->training = eng_node_attr_int(c->node, "training_mode", 0) != 0;
    else if (c->opset < 7) p->training = eng_node_attr_int(c->node, "is_test", 0) == 0 && c->nout > 1;
    else p->training = c->nout > 1;
    if (!p->training && c->nout > 1 && c->opset >= 14)
        return eng_err(ENG_STATUS_INVALID_MODEL, "%d outputs requested with training_mode=0 (expected 1)", c->nout);
    if (c->nout > 5) return eng_err(ENG_STATUS_INVALID_MODEL, "%d outputs, at most 5", c->nout);
    return ENG_STATUS_OK;
}

eng_status eng_norm_batchnorm_infer(eng_op_ctx *c) {
    krn_batchnorm_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    static const char *names[5] = {"X", "scale", "B", "input_mean", "input_var"};
    for (int i = 0; i < 5; i++) ENG_TRY(norm_check_float(&c->in[i], names[i]));
    if (x->ndim < 2) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'X' has rank %d, expected (N, C, ...)", x->ndim);
    p->n = x->dims[0];
    p->c = x->dims[1];
    p->spatial_size = eng_shape_numel(x->dims + 2, x->ndim - 2);
    int64_t want = p->spatial ? p->c : p->c * p->spatial_size;
    for (int i = 1; i < 5; i++) {
        int64_t got = eng_tensor_numel(&c->in[i]);
        if (got != want && !(p->spatial == 0 && got == p->c))
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input '%s' has %lld elements, expected %lld (channels of X)",
                           names[i], (long long)got, (long long)want);
        if (c->in[i].dtype != c->in[1].dtype && i > 1 && i < 3)
            return eng_err(ENG_STATUS_INVALID_MODEL, "input '%s' dtype %s differs from scale's %s", names[i],
                           eng_dtype_name(c->in[i].dtype), eng_dtype_name(c->in[1].dtype));
    }
    if (p->training && !p->spatial)
        return eng_err(ENG_STATUS_UNSUPPORTED, "training mode with spatial=0");
    eng_op_same_as_input(c, 0, 0);
    for (int j = 1; j < c->nout; j++) eng_op_same_as_input(c, j <= 2 ? j + 2 : 3, j);
    return ENG_STATUS_OK;
}

/* ---- LayerNormalization ---- */

eng_status eng_norm_layernorm_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 2, 3));
    if (c->nout > 3) return eng_err(ENG_STATUS_INVALID_MODEL, "%d outputs, at most 3", c->nout);
    krn_layernorm_params *p = norm_params_new(c, sizeof *p);
    if (!p) return ENG_STATUS_OUT_OF_MEMORY;
    p->axis_attr = eng_node_attr_int(c->node, "axis", -1);
    p->epsilon = eng_node_attr_float(c->node, "epsilon", 1e-5f);
    p->stash_type = (int)eng_node_attr_int(c->node, "stash_type", 1);
    return ENG_STATUS_OK;
}

/* Is `t` broadcastable (numpy rules) to the trailing dims `dims[0..n)`? */
static int norm_broadcastable_to(const eng_tensor *t, const int64_t *dims, int n) {
    if (t->ndim > n) return 0;
    for (int i = 0; i < t->ndim; i++) {
        int64_t a = t->dims[t->ndim - 1 - i], b = dims[n - 1 - i];
        if (a != 1 && a != b) return 0;
    }
    return 1;
}

eng_status eng_norm_layernorm_infer(eng_op_ctx *c) {
    krn_layernorm_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    ENG_TRY(norm_check_float(x, "X"));
    ENG_TRY(norm_check_float(&c->in[1], "Scale"));
    if (eng_op_has_input(c, 2)) ENG_TRY(norm_check_float(&c->in[2], "B"));
    if (x->ndim == 0) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'X' is a scalar");
    ENG_TRY(eng_norm_axis(p->axis_attr, x->ndim, &p->axis));
    p->rows = eng_shape_numel(x->dims, p->axis);
    p->cols = eng_shape_numel(x->dims + p->axis, x->ndim - p->axis);
    for (int i = 1; i < 3; i++) {
        if (!eng_op_has_input(c, i)) continue;
        if (!norm_broadcastable_to(&c->in[i], x->dims + p->axis, x->ndim - p->axis)) {
            char a[128], b[128];
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input '%s' shape %s does not broadcast to X's normalised dims %s",
                           i == 1 ? "Scale" : "B", eng_shape_str(c->in[i].dims, c->in[i].ndim, a, sizeof a),
                           eng_shape_str(x->dims + p->axis, x->ndim - p->axis, b, sizeof b));
        }
    }
    eng_op_same_as_input(c, 0, 0);
    for (int j = 1; j < c->nout; j++) {
        eng_op_same_as_input(c, 0, j);
        for (int d = p->axis; d < x->ndim; d++) c->out[j].dims[d] = 1;
        c->out[j].dtype = p->stash_type == 1 ? ENG_DTYPE_F32 : x->dtype;
    }
    return ENG_STATUS_OK;
}

/* ---- InstanceNormalization ---- */

eng_status eng_norm_instnorm_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 3, 3));
    krn_instnorm_params *p = norm_params_new(c, sizeof *p);
    if (!p) return ENG_STATUS_OUT_OF_MEMORY;
    p->epsilon = eng_node_attr_float(c->node, "epsilon", 1e-5f);
    return ENG_STATUS_OK;
}

eng_status eng_norm_instnorm_infer(eng_op_ctx *c) {
    const eng_tensor *x = &c->in[0];
    ENG_TRY(norm_check_float(x, "input"));
    ENG_TRY(norm_check_float(&c->in[1], "scale"));
    ENG_TRY(norm_check_float(&c->in[2], "B"));
    if (x->ndim < 2) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input has rank %d, expected (N, C, D...)", x->ndim);
    for (int i = 1; i < 3; i++)
        if (eng_tensor_numel(&c->in[i]) != x->dims[1])
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input '%s' has %lld elements, expected C = %lld",
                           i == 1 ? "scale" : "B", (long long)eng_tensor_numel(&c->in[i]), (long long)x->dims[1]);
    eng_op_same_as_input(c, 0, 0);
    return ENG_STATUS_OK;
}

/* ---- LRN ---- */

eng_status eng_norm_lrn_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 1, 1));
    krn_lrn_params *p = norm_params_new(c, sizeof *p);
    if (!p) return ENG_STATUS_OUT_OF_MEMORY;
    p->alpha = eng_node_attr_float(c->node, "alpha", 1e-4f);
    p->beta = eng_node_attr_float(c->node, "beta", 0.75f);
    p->bias = eng_node_attr_float(c->node, "bias", 1.0f);
    p->size = eng_node_attr_int(c->node, "size", 0);
    if (p->size <= 0) return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'size' must be > 0, got %lld", (long long)p->size);
    return ENG_STATUS_OK;
}

eng_status eng_norm_lrn_infer(eng_op_ctx *c) {
    const eng_tensor *x = &c->in[0];
    ENG_TRY(norm_check_float(x, "X"));
    if (x->ndim < 2) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'X' has rank %d, expected (N, C, D...)", x->ndim);
    eng_op_same_as_input(c, 0, 0);
    return ENG_STATUS_OK;
}

/* ---- MeanVarianceNormalization ---- */

eng_status eng_norm_mvn_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 1, 1));
    krn_mvn_params *p = norm_params_new(c, sizeof *p);
    if (!p) return ENG_STATUS_OUT_OF_MEMORY;
    const int64_t *axes = NULL;
    int n = eng_node_attr_ints(c->node, "axes", &axes);
    if (n < 0) {
        static const int64_t dflt[3] = {0, 2, 3};
        n = 3;
        axes = dflt;
    }
    if (n > ENG_MAX_DIMS) return eng_err(ENG_STATUS_INVALID_MODEL, "axes attribute has %d entries", n);
    p->naxes_attr = n;
    memcpy(p->axes_attr, axes, (size_t)n * sizeof *axes);
    return ENG_STATUS_OK;
}

eng_status eng_norm_mvn_infer(eng_op_ctx *c) {
    krn_mvn_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    ENG_TRY(norm_check_float(x, "X"));
    p->axis_mask = 0;
    for (int i = 0; i < p->naxes_attr; i++) {
        int a;
        ENG_TRY(eng_norm_axis(p->axes_attr[i], x->ndim, &a));
        p->axis_mask |= 1u << a;
    }
    eng_op_same_as_input(c, 0, 0);
    return ENG_STATUS_OK;
}
