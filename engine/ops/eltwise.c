/* eltwise.c - the "eltwise" op family: unary math and activations, broadcasting binary ops (arithmetic,
 * comparison, logic, Pow, Mod, BitShift, PRelu), variadic Sum/Mean/Min/Max, Where, Clip, Cast, CastLike.
 *
 * prepare maps the op type to a kernel op code (kernels/krn-eltwise.h) and parses attributes; infer checks
 * dtypes and computes the numpy-broadcast output shape. Old forms: Add/Sub/Mul/Div/Pow/logic/compare ops of
 * opset < 7 with broadcast=1 align input B at `axis` (infer stores B's effective dims in the params);
 * PRelu < 7 with a [C] slope aligns it at axis 1; Clip < 11 takes min/max attributes. Infer only writes values
 * derived from shapes, so it may run again with the same params.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/krn-eltwise.h"
#include "op.h"

/* dtype classes accepted by an op */
enum { EW_T_FLOAT = 1, EW_T_SINT = 2, EW_T_UINT = 4, EW_T_BOOL = 8 };
#define EW_T_INT (EW_T_SINT | EW_T_UINT)
#define EW_T_NUM (EW_T_FLOAT | EW_T_INT)

static int ew_dtype_class(eng_dtype dt) {
    switch (dt) {
    case ENG_DTYPE_F16: case ENG_DTYPE_BF16: case ENG_DTYPE_F32: case ENG_DTYPE_F64: return EW_T_FLOAT;
    case ENG_DTYPE_I8: case ENG_DTYPE_I16: case ENG_DTYPE_I32: case ENG_DTYPE_I64: return EW_T_SINT;
    case ENG_DTYPE_U8: case ENG_DTYPE_U16: case ENG_DTYPE_U32: case ENG_DTYPE_U64: return EW_T_UINT;
    case ENG_DTYPE_BOOL: return EW_T_BOOL;
    default: return 0;
    }
}

static eng_status ew_check_dtype(const eng_op_ctx *c, int i, int classes) {
    eng_dtype dt = c->in[i].dtype;
    if (!(ew_dtype_class(dt) & classes))
        return eng_err(ENG_STATUS_UNSUPPORTED, "%s: input %d has unsupported dtype %s", c->node->op_type, i,
                       eng_dtype_name(dt));
    return ENG_STATUS_OK;
}

static void *ew_params(eng_op_ctx *c, size_t sz) {
    c->params = calloc(1, sz);
    if (!c->params) eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s params", c->node->op_type);
    return c->params;
}

/* ---------------------------------------------------------------- unary */

static const struct { const char *name; int act; int classes; } ew_unary_ops[] = {
    {"Sqrt", KRN_ACT_SQRT, EW_T_FLOAT}, {"Reciprocal", KRN_ACT_RECIPROCAL, EW_T_FLOAT},
    {"Exp", KRN_ACT_EXP, EW_T_FLOAT}, {"Log", KRN_ACT_LOG, EW_T_FLOAT},
    {"Abs", KRN_ACT_ABS, EW_T_NUM}, {"Neg", KRN_ACT_NEG, EW_T_FLOAT | EW_T_SINT},
    {"Floor", KRN_ACT_FLOOR, EW_T_FLOAT}, {"Ceil", KRN_ACT_CEIL, EW_T_FLOAT}, {"Round", KRN_ACT_ROUND, EW_T_FLOAT},
    {"Sign", KRN_ACT_SIGN, EW_T_NUM}, {"Erf", KRN_ACT_ERF, EW_T_FLOAT}, {"Tanh", KRN_ACT_TANH, EW_T_FLOAT},
    {"Sigmoid", KRN_ACT_SIGMOID, EW_T_FLOAT}, {"Sin", KRN_ACT_SIN, EW_T_FLOAT}, {"Cos", KRN_ACT_COS, EW_T_FLOAT},
    {"Tan", KRN_ACT_TAN, EW_T_FLOAT}, {"Asin", KRN_ACT_ASIN, EW_T_FLOAT}, {"Acos", KRN_ACT_ACOS, EW_T_FLOAT},
    {"Atan", KRN_ACT_ATAN, EW_T_FLOAT}, {"Sinh", KRN_ACT_SINH, EW_T_FLOAT}, {"Cosh", KRN_ACT_COSH, EW_T_FLOAT},
    {"Asinh", KRN_ACT_ASINH, EW_T_FLOAT}, {"Acosh", KRN_ACT_ACOSH, EW_T_FLOAT}, {"Atanh", KRN_ACT_ATANH, EW_T_FLOAT},
    {"IsNaN", KRN_ACT_ISNAN, EW_T_FLOAT}, {"IsInf", KRN_ACT_ISINF, EW_T_FLOAT}, {"Not", KRN_ACT_NOT, EW_T_BOOL},
    {"Relu", KRN_ACT_RELU, EW_T_FLOAT | EW_T_SINT}, {"LeakyRelu", KRN_ACT_LEAKY_RELU, EW_T_FLOAT},
    {"Elu", KRN_ACT_ELU, EW_T_FLOAT}, {"Selu", KRN_ACT_SELU, EW_T_FLOAT}, {"Celu", KRN_ACT_CELU, EW_T_FLOAT},
    {"Gelu", KRN_ACT_GELU, EW_T_FLOAT}, {"HardSigmoid", KRN_ACT_HARD_SIGMOID, EW_T_FLOAT},
    {"HardSwish", KRN_ACT_HARD_SWISH, EW_T_FLOAT}, {"Softplus", KRN_ACT_SOFTPLUS, EW_T_FLOAT},
    {"Softsign", KRN_ACT_SOFTSIGN, EW_T_FLOAT}, {"ThresholdedRelu", KRN_ACT_THRESHOLDED_RELU, EW_T_FLOAT},
    {"Shrink", KRN_ACT_SHRINK, EW_T_FLOAT}, {"Mish", KRN_ACT_MISH, EW_T_FLOAT},
    {"Silu", KRN_ACT_SILU, EW_T_FLOAT}, /* com.tensord: x * sigmoid(x) (training graphs, eng_graph_fuse_act_ops) */
};

typedef struct ew_unary_op {
    krn_unary_params k; /* first: what the kernel sees */
    int classes;
} ew_unary_op;

static eng_status unary_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 1, 1));
    ew_unary_op *p = ew_params(c, sizeof *p);
    if (!p) return ENG_STATUS_OUT_OF_MEMORY;
    const eng_node *n = c->node;
    size_t i, nops = sizeof ew_unary_ops / sizeof ew_unary_ops[0];
    for (i = 0; i < nops; i++)
        if (!strcmp(ew_unary_ops[i].name, n->op_type)) break;
    if (i == nops) return eng_err(ENG_STATUS_INTERNAL, "%s is not a unary eltwise op", n->op_type);
    p->k.op = ew_unary_ops[i].act;
    p->classes = ew_unary_ops[i].classes;
    switch (p->k.op) {
    case KRN_ACT_LEAKY_RELU: p->k.alpha = eng_node_attr_float(n, "alpha", 0.01f); break;
    case KRN_ACT_ELU: case KRN_ACT_CELU: case KRN_ACT_THRESHOLDED_RELU:
        p->k.alpha = eng_node_attr_float(n, "alpha", 1.0f);
        if (p->k.op == KRN_ACT_CELU && p->k.alpha == 0.0f) return eng_err(ENG_STATUS_INVALID_MODEL, "Celu alpha must not be 0");
        break;
    case KRN_ACT_SELU:
        p->k.alpha = eng_node_attr_float(n, "alpha", 1.67326319217681884765625f);
        p->k.beta = eng_node_attr_float(n, "gamma", 1.05070102214813232421875f);
        break;
    case KRN_ACT_HARD_SIGMOID:
        p->k.alpha = eng_node_attr_float(n, "alpha", 0.2f);
        p->k.beta = eng_node_attr_float(n, "beta", 0.5f);
        break;
    case KRN_ACT_SHRINK:
        p->k.alpha = eng_node_attr_float(n, "bias", 0.0f);
        p->k.beta = eng_node_attr_float(n, "lambd", 0.5f);
        break;
    case KRN_ACT_ISINF:
        p->k.alpha = (float)eng_node_attr_int(n, "detect_positive", 1);
        p->k.beta = (float)eng_node_attr_int(n, "detect_negative", 1);
        break;
    case KRN_ACT_GELU: {
        const char *a = eng_node_attr_str(n, "approximate", "none");
        if (!strcmp(a, "tanh")) p->k.op = KRN_ACT_GELU_TANH;
        else if (strcmp(a, "none") != 0)
            return eng_err(ENG_STATUS_INVALID_MODEL, "Gelu approximate '%s' is not 'none' or 'tanh'", a);
        break;
    }
    default: break;
    }
    return ENG_STATUS_OK;
}

static eng_status unary_infer(eng_op_ctx *c) {
    const ew_unary_op *p = c->params;
    ENG_TRY(ew_check_dtype(c, 0, p->classes));
    eng_op_same_as_input(c, 0, 0);
    if (p->k.op == KRN_ACT_ISNAN || p->k.op == KRN_ACT_ISINF) c->out[0].dtype = ENG_DTYPE_BOOL;
    return ENG_STATUS_OK;
}

/* ---------------------------------------------------------------- binary */

static const struct { const char *name; int op; int classes; int cmp; } ew_binary_ops[] = {
    {"Add", KRN_BIN_ADD, EW_T_NUM, 0}, {"Sub", KRN_BIN_SUB, EW_T_NUM, 0}, {"Mul", KRN_BIN_MUL, EW_T_NUM, 0},
    {"Div", KRN_BIN_DIV, EW_T_NUM, 0}, {"Pow", KRN_BIN_POW, EW_T_NUM, 0}, {"Mod", KRN_BIN_MOD, EW_T_NUM, 0},
    {"BitShift", KRN_BIN_SHL, EW_T_UINT, 0}, {"Equal", KRN_BIN_EQ, EW_T_NUM | EW_T_BOOL, 1},
    {"Greater", KRN_BIN_GT, EW_T_NUM, 1}, {"Less", KRN_BIN_LT, EW_T_NUM, 1},
    {"GreaterOrEqual", KRN_BIN_GE, EW_T_NUM, 1}, {"LessOrEqual", KRN_BIN_LE, EW_T_NUM, 1},
    {"And", KRN_BIN_AND, EW_T_BOOL, 1}, {"Or", KRN_BIN_OR, EW_T_BOOL, 1}, {"Xor", KRN_BIN_XOR, EW_T_BOOL, 1},
    {"PRelu", KRN_BIN_PRELU, EW_T_FLOAT | EW_T_SINT, 0},
};

typedef struct ew_binary_op {
    krn_binary_params k; /* first: what the kernel sees */
    int classes, cmp;
    int old_bcast;       /* opset < 7 broadcast=1 */
    int64_t axis;
    int has_axis;
} ew_binary_op;

static eng_status binary_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 2, 2));
    ew_binary_op *p = ew_params(c, sizeof *p);
    if (!p) return ENG_STATUS_OUT_OF_MEMORY;
    const eng_node *n = c->node;
    size_t i, nops = sizeof ew_binary_ops / sizeof ew_binary_ops[0];
    for (i = 0; i < nops; i++)
        if (!strcmp(ew_binary_ops[i].name, n->op_type)) break;
    if (i == nops) return eng_err(ENG_STATUS_INTERNAL, "%s is not a binary eltwise op", n->op_type);
    p->k.op = ew_binary_ops[i].op;
    p->k.layout = (int)eng_node_attr_int(n, "layout", 0); /* set by engine/plan/fuse.c's layout pass */
    p->classes = ew_binary_ops[i].classes;
    p->cmp = ew_binary_ops[i].cmp;
    if (p->k.op == KRN_BIN_MOD && eng_node_attr_int(n, "fmod", 0)) p->k.op = KRN_BIN_FMOD;
    if (p->k.op == KRN_BIN_SHL) {
        const char *d = eng_node_attr_str(n, "direction", "");
        if (!strcmp(d, "RIGHT")) p->k.op = KRN_BIN_SHR;
        else if (strcmp(d, "LEFT") != 0)
            return eng_err(ENG_STATUS_INVALID_MODEL, "BitShift direction '%s' is not LEFT or RIGHT", d);
    }
    if (c->opset < 7 && p->k.op != KRN_BIN_PRELU && eng_node_attr_int(n, "broadcast", 0)) {
        p->old_bcast = 1;
        p->has_axis = eng_node_attr(n, "axis") != NULL;
        p->axis = eng_node_attr_int(n, "axis", 0);
    }
    return ENG_STATUS_OK;
}

static eng_status binary_infer(eng_op_ctx *c) {
    ew_binary_op *p = c->params;
    const eng_tensor *a = &c->in[0], *b = &c->in[1];
    char s1[128], s2[128];
    ENG_TRY(ew_check_dtype(c, 0, p->classes));
    if (p->k.op == KRN_BIN_POW) ENG_TRY(ew_check_dtype(c, 1, EW_T_NUM));
    else if (a->dtype != b->dtype)
        return eng_err(ENG_STATUS_INVALID_MODEL, "%s: input dtypes differ (A %s, B %s)", c->node->op_type,
                       eng_dtype_name(a->dtype), eng_dtype_name(b->dtype));
    p->k.b_override = 0;
    eng_tensor bview = *b;
    if (p->old_bcast) {
        /* B's dims align with A's starting at axis (default: suffix) */
        int64_t axis = p->has_axis ? p->axis : a->ndim - b->ndim;
        if (axis < 0) axis += a->ndim;
        if (axis < 0 || axis + b->ndim > a->ndim)
            return eng_err(ENG_STATUS_INVALID_MODEL, "%s: broadcast axis %lld does not fit B %s into A %s",
                           c->node->op_type, (long long)p->axis, eng_shape_str(b->dims, b->ndim, s1, sizeof s1),
                           eng_shape_str(a->dims, a->ndim, s2, sizeof s2));
        int nd = a->ndim;
        bview.ndim = nd;
        for (int d = 0; d < nd; d++)
            bview.dims[d] = (d >= axis && d < axis + b->ndim) ? b->dims[d - axis] : 1;
    } else if (p->k.op == KRN_BIN_PRELU && b->ndim == 1 && a->ndim >= 2 && b->dims[0] == a->dims[1] &&
               b->dims[0] != 1 && (c->opset < 7 || b->dims[0] != a->dims[a->ndim - 1])) {
        /* PRelu-6 style per-channel slope [C] on [N, C, ...] */
        bview.ndim = a->ndim - 1;
        for (int d = 0; d < bview.ndim; d++) bview.dims[d] = d == 0 ? b->dims[0] : 1;
    }
    if (bview.ndim != b->ndim || memcmp(bview.dims, b->dims, sizeof(int64_t) * (size_t)b->ndim) != 0) {
        p->k.b_override = 1;
        p->k.b_ndim = bview.ndim;
        memcpy(p->k.b_dims, bview.dims, sizeof p->k.b_dims);
    }
    const eng_tensor *ts[2] = {a, &bview};
    eng_tensor out = {0};
    ENG_TRY(eng_broadcast_shapes(ts, 2, &out));
    if (p->k.op == KRN_BIN_PRELU && !(out.ndim == a->ndim && eng_shape_equal(&out, a)))
        return eng_err(ENG_STATUS_INVALID_MODEL, "PRelu: slope %s does not broadcast to X %s",
                       eng_shape_str(b->dims, b->ndim, s1, sizeof s1), eng_shape_str(a->dims, a->ndim, s2, sizeof s2));
    c->out[0].ndim = out.ndim;
    memcpy(c->out[0].dims, out.dims, sizeof out.dims);
    c->out[0].dtype = p->cmp ? ENG_DTYPE_BOOL : a->dtype;
    return ENG_STATUS_OK;
}

/* ---------------------------------------------------------------- variadic */

static eng_status variadic_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 1, -1));
    krn_variadic_params *p = ew_params(c, sizeof *p);
    if (!p) return ENG_STATUS_OUT_OF_MEMORY;
    const char *t = c->node->op_type;
    p->op = !strcmp(t, "Min") ? KRN_BIN_MIN : !strcmp(t, "Max") ? KRN_BIN_MAX : KRN_BIN_ADD;
    p->mean = !strcmp(t, "Mean");
    return ENG_STATUS_OK;
}

static eng_status variadic_infer(eng_op_ctx *c) {
    const krn_variadic_params *p = c->params;
    const eng_tensor *ts[ENG_OP_MAX_IO];
    if (c->nin > ENG_OP_MAX_IO)
        return eng_err(ENG_STATUS_UNSUPPORTED, "%s with %d inputs (at most %d)", c->node->op_type, c->nin, ENG_OP_MAX_IO);
    int classes = p->op == KRN_BIN_ADD ? EW_T_FLOAT | (p->mean ? 0 : EW_T_INT) : EW_T_NUM;
    for (int i = 0; i < c->nin; i++) {
        if (!eng_op_has_input(c, i))
            return eng_err(ENG_STATUS_INVALID_MODEL, "%s: input %d is omitted", c->node->op_type, i);
        ENG_TRY(ew_check_dtype(c, i, classes));
        if (c->in[i].dtype != c->in[0].dtype)
            return eng_err(ENG_STATUS_INVALID_MODEL, "%s: input %d is %s, input 0 is %s", c->node->op_type, i,
                           eng_dtype_name(c->in[i].dtype), eng_dtype_name(c->in[0].dtype));
        ts[i] = &c->in[i];
    }
    eng_tensor out = {0};
    ENG_TRY(eng_broadcast_shapes(ts, c->nin, &out));
    c->out[0].dtype = c->in[0].dtype;
    c->out[0].ndim = out.ndim;
    memcpy(c->out[0].dims, out.dims, sizeof out.dims);
    return ENG_STATUS_OK;
}

/* ---------------------------------------------------------------- Where */

static eng_status where_prepare(eng_op_ctx *c) { return eng_op_check_arity(c, 3, 3); }

static eng_status where_infer(eng_op_ctx *c) {
    if (c->in[0].dtype != ENG_DTYPE_BOOL)
        return eng_err(ENG_STATUS_INVALID_MODEL, "Where: condition is %s, expected bool", eng_dtype_name(c->in[0].dtype));
    if (c->in[1].dtype != c->in[2].dtype)
        return eng_err(ENG_STATUS_INVALID_MODEL, "Where: X is %s but Y is %s", eng_dtype_name(c->in[1].dtype),
                       eng_dtype_name(c->in[2].dtype));
    if (!eng_dtype_size(c->in[1].dtype))
        return eng_err(ENG_STATUS_UNSUPPORTED, "Where on %s", eng_dtype_name(c->in[1].dtype));
    const eng_tensor *ts[3] = {&c->in[0], &c->in[1], &c->in[2]};
    eng_tensor out = {0};
    ENG_TRY(eng_broadcast_shapes(ts, 3, &out));
    c->out[0].dtype = c->in[1].dtype;
    c->out[0].ndim = out.ndim;
    memcpy(c->out[0].dims, out.dims, sizeof out.dims);
    return ENG_STATUS_OK;
}

/* ---------------------------------------------------------------- Clip */

static eng_status clip_prepare(eng_op_ctx *c) {
    krn_clip_params *p = ew_params(c, sizeof *p);
    if (!p) return ENG_STATUS_OUT_OF_MEMORY;
    if (c->opset >= 11) {
        ENG_TRY(eng_op_check_arity(c, 1, 3));
        p->from_inputs = 1;
    } else {
        ENG_TRY(eng_op_check_arity(c, 1, 1));
        p->min = eng_node_attr_float(c->node, "min", -FLT_MAX);
        p->max = eng_node_attr_float(c->node, "max", FLT_MAX);
    }
    return ENG_STATUS_OK;
}

static eng_status clip_infer(eng_op_ctx *c) {
    ENG_TRY(ew_check_dtype(c, 0, EW_T_NUM));
    for (int i = 1; i < c->nin; i++) {
        if (!eng_op_has_input(c, i)) continue;
        if (c->in[i].dtype != c->in[0].dtype)
            return eng_err(ENG_STATUS_INVALID_MODEL, "Clip: %s is %s but input is %s", i == 1 ? "min" : "max",
                           eng_dtype_name(c->in[i].dtype), eng_dtype_name(c->in[0].dtype));
        if (eng_tensor_numel(&c->in[i]) > 1) {
            char s[128];
            return eng_err(ENG_STATUS_INVALID_MODEL, "Clip: %s must be a scalar, got shape %s", i == 1 ? "min" : "max",
                           eng_shape_str(c->in[i].dims, c->in[i].ndim, s, sizeof s));
        }
    }
    eng_op_same_as_input(c, 0, 0);
    return ENG_STATUS_OK;
}

/* ---------------------------------------------------------------- Cast / CastLike */

static eng_status cast_prepare(eng_op_ctx *c) {
    int like = !strcmp(c->node->op_type, "CastLike");
    ENG_TRY(eng_op_check_arity(c, like ? 2 : 1, like ? 2 : 1));
    krn_cast_params *p = ew_params(c, sizeof *p);
    if (!p) return ENG_STATUS_OUT_OF_MEMORY;
    if (!like) {
        const eng_attr *a = eng_node_attr(c->node, "to");
        if (!a) return eng_err(ENG_STATUS_INVALID_MODEL, "Cast: attribute 'to' is missing");
        if (a->type == ENG_ATTR_STRING) { /* Cast-1 spelled the type as a string */
            eng_dtype dt = eng_dtype_parse(a->s);
            if (dt == ENG_DTYPE_UNDEFINED)
                return eng_err(ENG_STATUS_UNSUPPORTED, "Cast: target type '%s' is not supported", a->s);
            p->to = dt;
        } else {
            p->to = (int)a->i;
        }
    }
    return ENG_STATUS_OK;
}

static eng_status cast_infer(eng_op_ctx *c) {
    krn_cast_params *p = c->params;
    if (!strcmp(c->node->op_type, "CastLike")) p->to = c->in[1].dtype;
    eng_dtype to = (eng_dtype)p->to;
    if (!eng_dtype_size(to))
        return eng_err(ENG_STATUS_UNSUPPORTED, "%s: target type %s is not supported", c->node->op_type,
                       eng_dtype_name(to));
    if (!eng_dtype_size(c->in[0].dtype))
        return eng_err(ENG_STATUS_UNSUPPORTED, "%s: input type %s is not supported", c->node->op_type,
                       eng_dtype_name(c->in[0].dtype));
    eng_op_same_as_input(c, 0, 0);
    c->out[0].dtype = to;
    return ENG_STATUS_OK;
}

#define EW_UNARY(name) {name, "", "eltwise_unary", 0, unary_prepare, unary_infer, NULL}
#define EW_BINARY(name) {name, "", "eltwise_binary", 0, binary_prepare, binary_infer, NULL}
#define EW_VARIADIC(name) {name, "", "eltwise_variadic", 0, variadic_prepare, variadic_infer, NULL}

const eng_op_def eng_ops_eltwise[] = {
    EW_UNARY("Sqrt"), EW_UNARY("Reciprocal"), EW_UNARY("Exp"), EW_UNARY("Log"), EW_UNARY("Abs"), EW_UNARY("Neg"),
    EW_UNARY("Floor"), EW_UNARY("Ceil"), EW_UNARY("Round"), EW_UNARY("Sign"), EW_UNARY("Erf"), EW_UNARY("Tanh"),
    EW_UNARY("Sigmoid"), EW_UNARY("Sin"), EW_UNARY("Cos"), EW_UNARY("Tan"), EW_UNARY("Asin"), EW_UNARY("Acos"),
    EW_UNARY("Atan"), EW_UNARY("Sinh"), EW_UNARY("Cosh"), EW_UNARY("Asinh"), EW_UNARY("Acosh"), EW_UNARY("Atanh"),
    EW_UNARY("IsNaN"), EW_UNARY("IsInf"), EW_UNARY("Not"), EW_UNARY("Relu"), EW_UNARY("LeakyRelu"), EW_UNARY("Elu"),
    EW_UNARY("Selu"), EW_UNARY("Celu"), EW_UNARY("Gelu"), EW_UNARY("HardSigmoid"), EW_UNARY("HardSwish"),
    EW_UNARY("Softplus"), EW_UNARY("Softsign"), EW_UNARY("ThresholdedRelu"), EW_UNARY("Shrink"), EW_UNARY("Mish"),
    {"Silu", "com.tensord", "eltwise_unary", 0, unary_prepare, unary_infer, NULL},
    EW_BINARY("Add"), EW_BINARY("Sub"), EW_BINARY("Mul"), EW_BINARY("Div"), EW_BINARY("Pow"), EW_BINARY("Mod"),
    EW_BINARY("BitShift"), EW_BINARY("Equal"), EW_BINARY("Greater"), EW_BINARY("Less"), EW_BINARY("GreaterOrEqual"),
    EW_BINARY("LessOrEqual"), EW_BINARY("And"), EW_BINARY("Or"), EW_BINARY("Xor"), EW_BINARY("PRelu"),
    EW_VARIADIC("Sum"), EW_VARIADIC("Mean"), EW_VARIADIC("Min"), EW_VARIADIC("Max"),
    {"Where", "", "eltwise_where", 0, where_prepare, where_infer, NULL},
    {"Clip", "", "eltwise_clip", 0, clip_prepare, clip_infer, NULL},
    {"Cast", "", "eltwise_cast", 0, cast_prepare, cast_infer, NULL},
    {"CastLike", "", "eltwise_cast", 0, cast_prepare, cast_infer, NULL},
    {NULL},
};
