/* reduce.c - the reduce op family's table and its reduction ops: ReduceX, ArgMax/ArgMin, TopK, CumSum.
 *
 * eng_ops_reduce lists every op of the family; the softmax/normalisation ops live in norm.c and the losses,
 * Einsum and Det in reduce-loss.c, whose prepare/infer functions are declared below. Invariants: prepare only
 * parses attributes (opset-dependent forms: axes attribute before opset 13 for ReduceSum and 18 for the other
 * ReduceX, TopK-1 `k` attribute); infer resolves axes against the input rank into the params (axis masks,
 * k) and reads value inputs (axes, K) from data, returning NEEDS_DATA when they are not yet known.
 */
#include <stdlib.h>
#include <string.h>

#include "../../kernels/krn-reduce.h"
#include "op.h"

/* ---- ops defined in norm.c and reduce-loss.c ---- */
eng_status eng_norm_softmax_prepare(eng_op_ctx *c);
eng_status eng_norm_softmax_infer(eng_op_ctx *c);
eng_status eng_norm_batchnorm_prepare(eng_op_ctx *c);
eng_status eng_norm_batchnorm_infer(eng_op_ctx *c);
eng_status eng_norm_layernorm_prepare(eng_op_ctx *c);
eng_status eng_norm_layernorm_infer(eng_op_ctx *c);
eng_status eng_norm_instnorm_prepare(eng_op_ctx *c);
eng_status eng_norm_instnorm_infer(eng_op_ctx *c);
eng_status eng_norm_lrn_prepare(eng_op_ctx *c);
eng_status eng_norm_lrn_infer(eng_op_ctx *c);
eng_status eng_norm_mvn_prepare(eng_op_ctx *c);
eng_status eng_norm_mvn_infer(eng_op_ctx *c);
eng_status eng_reduce_loss_prepare(eng_op_ctx *c);
eng_status eng_reduce_loss_infer(eng_op_ctx *c);
eng_status eng_reduce_einsum_prepare(eng_op_ctx *c);
eng_status eng_reduce_einsum_infer(eng_op_ctx *c);
eng_status eng_reduce_det_infer(eng_op_ctx *c);

static int reduce_dtype_numeric(eng_dtype dt) {
    return eng_dtype_is_float(dt) || eng_dtype_is_int(dt);
}

/* ---- ReduceX ---- */

static const struct { const char *name; krn_reduce_op op; } reduce_ops[] = {
    {"ReduceSum", KRN_REDUCE_SUM},     {"ReduceMean", KRN_REDUCE_MEAN},     {"ReduceMax", KRN_REDUCE_MAX},
    {"ReduceMin", KRN_REDUCE_MIN},     {"ReduceProd", KRN_REDUCE_PROD},     {"ReduceL1", KRN_REDUCE_L1},
    {"ReduceL2", KRN_REDUCE_L2},       {"ReduceLogSum", KRN_REDUCE_LOGSUM}, {"ReduceLogSumExp", KRN_REDUCE_LOGSUMEXP},
    {"ReduceSumSquare", KRN_REDUCE_SUMSQUARE},
};

static eng_status reduce_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 1, 2));
    krn_reduce_params *p = calloc(1, sizeof *p);
    if (!p) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "reduce params");
    c->params = p;
    p->op = KRN_REDUCE_SUM;
    for (size_t i = 0; i < sizeof reduce_ops / sizeof reduce_ops[0]; i++)
        if (strcmp(c->node->op_type, reduce_ops[i].name) == 0) p->op = reduce_ops[i].op;
    p->keepdims = eng_node_attr_int(c->node, "keepdims", 1) != 0;
    p->noop_with_empty_axes = eng_node_attr_int(c->node, "noop_with_empty_axes", 0) != 0;
    int input_opset = p->op == KRN_REDUCE_SUM ? 13 : 18;
    p->axes_from_input = c->opset >= input_opset;
    const int64_t *axes = NULL;
    int n = eng_node_attr_ints(c->node, "axes", &axes);
    p->naxes_attr = -1;
    if (n >= 0) {
        if (n > ENG_MAX_DIMS) return eng_err(ENG_STATUS_INVALID_MODEL, "axes attribute has %d entries (max %d)", n, ENG_MAX_DIMS);
        p->naxes_attr = n;
        memcpy(p->axes_attr, axes, (size_t)n * sizeof *axes);
    }
    return ENG_STATUS_OK;
}

/* Fold a list of (possibly negative) axes into a mask; duplicates and out-of-range axes are errors. */
static eng_status reduce_axes_mask(const int64_t *axes, int n, int rank, unsigned *mask) {
    *mask = 0;
    for (int i = 0; i < n; i++) {
        int a;
        if (axes[i] < -rank || axes[i] >= rank || rank == 0)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "axes[%d] = %lld is out of range for rank %d", i,
                           (long long)axes[i], rank);
        a = (int)(axes[i] < 0 ? axes[i] + rank : axes[i]);
        if (*mask & (1u << a))
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "axes[%d] = %lld repeats an axis", i, (long long)axes[i]);
        *mask |= 1u << a;
    }
    return ENG_STATUS_OK;
}

static eng_status reduce_infer(eng_op_ctx *c) {
    krn_reduce_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    if (!reduce_dtype_numeric(x->dtype))
        return eng_err(ENG_STATUS_UNSUPPORTED, "input 'data' has dtype %s; reductions take numeric tensors",
                       eng_dtype_name(x->dtype));
    int rank = x->ndim;
    int64_t axes[ENG_MAX_DIMS];
    int naxes = 0;
    if (p->axes_from_input && eng_op_has_input(c, 1)) {
        const eng_tensor *a = &c->in[1];
        if (a->dtype != ENG_DTYPE_I64 && a->dtype != ENG_DTYPE_I32)
            return eng_err(ENG_STATUS_INVALID_MODEL, "input 'axes' has dtype %s, expected int64", eng_dtype_name(a->dtype));
        int64_t na = eng_tensor_numel(a);
        if (na > ENG_MAX_DIMS)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'axes' has %lld entries for rank %d", (long long)na, rank);
        if (na > 0 && !a->data) return ENG_STATUS_NEEDS_DATA;
        for (int64_t i = 0; i < na; i++) axes[naxes++] = eng_tensor_get_i64(a, i);
    } else if (!p->axes_from_input && p->naxes_attr >= 0) {
        naxes = p->naxes_attr;
        memcpy(axes, p->axes_attr, (size_t)naxes * sizeof axes[0]);
    }
    if (naxes == 0) {
        p->axis_mask = p->noop_with_empty_axes ? 0u : (rank ? (1u << rank) - 1u : 0u);
    } else {
        ENG_TRY(reduce_axes_mask(axes, naxes, rank, &p->axis_mask));
    }
    eng_tensor *y = &c->out[0];
    y->dtype = x->dtype;
    y->ndim = 0;
    for (int d = 0; d < rank; d++) {
        if (p->axis_mask & (1u << d)) {
            if (p->keepdims) y->dims[y->ndim++] = 1;
        } else {
            y->dims[y->ndim++] = x->dims[d];
        }
    }
    return ENG_STATUS_OK;
}

/* ---- ArgMax / ArgMin ---- */

static eng_status arg_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 1, 1));
    krn_arg_params *p = calloc(1, sizeof *p);
    if (!p) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "argmax params");
    c->params = p;
    p->is_min = strcmp(c->node->op_type, "ArgMin") == 0;
    p->keepdims = eng_node_attr_int(c->node, "keepdims", 1) != 0;
    p->select_last_index = eng_node_attr_int(c->node, "select_last_index", 0) != 0;
    p->axis_attr = eng_node_attr_int(c->node, "axis", 0);
    return ENG_STATUS_OK;
}

static eng_status arg_infer(eng_op_ctx *c) {
    krn_arg_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    if (!reduce_dtype_numeric(x->dtype))
        return eng_err(ENG_STATUS_UNSUPPORTED, "input 'data' has dtype %s", eng_dtype_name(x->dtype));
    if (x->ndim == 0) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'data' is a scalar; %s needs rank >= 1", c->node->op_type);
    ENG_TRY(eng_norm_axis(p->axis_attr, x->ndim, &p->axis));
    if (x->dims[p->axis] == 0)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'data' has size 0 along axis %d", p->axis);
    eng_tensor *y = &c->out[0];
    y->dtype = ENG_DTYPE_I64;
    y->ndim = 0;
    for (int d = 0; d < x->ndim; d++) {
        if (d == p->axis) {
            if (p->keepdims) y->dims[y->ndim++] = 1;
        } else {
            y->dims[y->ndim++] = x->dims[d];
        }
    }
    return ENG_STATUS_OK;
}

/* ---- TopK ---- */

static eng_status topk_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, c->opset >= 10 ? 2 : 1, c->opset >= 10 ? 2 : 1));
    if (c->nout != 2) return eng_err(ENG_STATUS_INVALID_MODEL, "TopK has %d outputs, expected 2", c->nout);
    krn_topk_params *p = calloc(1, sizeof *p);
    if (!p) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "topk params");
    c->params = p;
    p->k_from_input = c->opset >= 10;
    p->k_attr = eng_node_attr_int(c->node, "k", -1);
    if (!p->k_from_input && p->k_attr < 0) return eng_err(ENG_STATUS_INVALID_MODEL, "TopK-1 needs attribute 'k' >= 0");
    p->axis_attr = eng_node_attr_int(c->node, "axis", -1);
    p->largest = eng_node_attr_int(c->node, "largest", 1) != 0;
    p->sorted = eng_node_attr_int(c->node, "sorted", 1) != 0;
    return ENG_STATUS_OK;
}

static eng_status topk_infer(eng_op_ctx *c) {
    krn_topk_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    if (!reduce_dtype_numeric(x->dtype))
        return eng_err(ENG_STATUS_UNSUPPORTED, "input 'X' has dtype %s", eng_dtype_name(x->dtype));
    if (x->ndim == 0) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'X' is a scalar; TopK needs rank >= 1");
    ENG_TRY(eng_norm_axis(p->axis_attr, x->ndim, &p->axis));
    int64_t k = p->k_attr;
    if (p->k_from_input) {
        const eng_tensor *kt = &c->in[1];
        if (kt->dtype != ENG_DTYPE_I64 && kt->dtype != ENG_DTYPE_I32)
            return eng_err(ENG_STATUS_INVALID_MODEL, "input 'K' has dtype %s, expected int64", eng_dtype_name(kt->dtype));
        if (eng_tensor_numel(kt) != 1)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'K' has %lld elements, expected 1", (long long)eng_tensor_numel(kt));
        if (!kt->data) return ENG_STATUS_NEEDS_DATA;
        k = eng_tensor_get_i64(kt, 0);
    }
    if (k < 0 || k > x->dims[p->axis])
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "K = %lld is out of range [0, %lld] for axis %d", (long long)k,
                       (long long)x->dims[p->axis], p->axis);
    p->k = k;
    for (int j = 0; j < 2; j++) {
        eng_op_same_as_input(c, 0, j);
        c->out[j].dims[p->axis] = k;
    }
    c->out[1].dtype = ENG_DTYPE_I64;
    return ENG_STATUS_OK;
}

/* ---- CumSum ---- */

static eng_status cumsum_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 2, 2));
    krn_cumsum_params *p = calloc(1, sizeof *p);
    if (!p) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "cumsum params");
    c->params = p;
    p->exclusive = eng_node_attr_int(c->node, "exclusive", 0) != 0;
    p->reverse = eng_node_attr_int(c->node, "reverse", 0) != 0;
    return ENG_STATUS_OK;
}

static eng_status cumsum_infer(eng_op_ctx *c) {
    const eng_tensor *x = &c->in[0], *a = &c->in[1];
    if (!reduce_dtype_numeric(x->dtype))
        return eng_err(ENG_STATUS_UNSUPPORTED, "input 'x' has dtype %s", eng_dtype_name(x->dtype));
    if (a->dtype != ENG_DTYPE_I64 && a->dtype != ENG_DTYPE_I32)
        return eng_err(ENG_STATUS_INVALID_MODEL, "input 'axis' has dtype %s, expected int32 or int64", eng_dtype_name(a->dtype));
    if (eng_tensor_numel(a) != 1)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'axis' has %lld elements, expected 1", (long long)eng_tensor_numel(a));
    if (x->ndim == 0) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'x' is a scalar; CumSum needs rank >= 1");
    if (a->data) {
        int axis;
        ENG_TRY(eng_norm_axis(eng_tensor_get_i64(a, 0), x->ndim, &axis));
    }
    eng_op_same_as_input(c, 0, 0);
    return ENG_STATUS_OK;
}

/* ---- the family table ---- */

#define REDUCE_DEF(name) {name, "", "reduce", 0, reduce_prepare, reduce_infer, NULL}

const eng_op_def eng_ops_reduce[] = {
    REDUCE_DEF("ReduceSum"),
    REDUCE_DEF("ReduceMean"),
    REDUCE_DEF("ReduceMax"),
    REDUCE_DEF("ReduceMin"),
    REDUCE_DEF("ReduceProd"),
    REDUCE_DEF("ReduceL1"),
    REDUCE_DEF("ReduceL2"),
    REDUCE_DEF("ReduceLogSum"),
    REDUCE_DEF("ReduceLogSumExp"),
    REDUCE_DEF("ReduceSumSquare"),
    {"ArgMax", "", "argreduce", 0, arg_prepare, arg_infer, NULL},
    {"ArgMin", "", "argreduce", 0, arg_prepare, arg_infer, NULL},
    {"TopK", "", "topk", 0, topk_prepare, topk_infer, NULL},
    {"CumSum", "", "cumsum", 0, cumsum_prepare, cumsum_infer, NULL},
    {"Softmax", "", "softmax", 0, eng_norm_softmax_prepare, eng_norm_softmax_infer, NULL},
    {"LogSoftmax", "", "softmax", 0, eng_norm_softmax_prepare, eng_norm_softmax_infer, NULL},
    {"Hardmax", "", "softmax", 0, eng_norm_softmax_prepare, eng_norm_softmax_infer, NULL},
    {"BatchNormalization", "", "batchnorm", 0, eng_norm_batchnorm_prepare, eng_norm_batchnorm_infer, NULL},
    {"LayerNormalization", "", "layernorm", 0, eng_norm_layernorm_prepare, eng_norm_layernorm_infer, NULL},
    {"InstanceNormalization", "", "instnorm", 0, eng_norm_instnorm_prepare, eng_norm_instnorm_infer, NULL},
    {"LRN", "", "lrn", 0, eng_norm_lrn_prepare, eng_norm_lrn_infer, NULL},
    {"MeanVarianceNormalization", "", "mvn", 0, eng_norm_mvn_prepare, eng_norm_mvn_infer, NULL},
    {"NegativeLogLikelihoodLoss", "", "loss", 0, eng_reduce_loss_prepare, eng_reduce_loss_infer, NULL},
    {"SoftmaxCrossEntropyLoss", "", "loss", 0, eng_reduce_loss_prepare, eng_reduce_loss_infer, NULL},
    {"Einsum", "", "einsum", 0, eng_reduce_einsum_prepare, eng_reduce_einsum_infer, NULL},
    {"Det", "", "det", 0, NULL, eng_reduce_det_infer, NULL},
    {NULL},
};
