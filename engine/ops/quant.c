/* quant.c - the "quant" op family: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger,
 * ConvInteger, QLinearMatMul and QLinearConv (default domain, opsets 10..), and com.microsoft's QLinearAdd and
 * QLinearMul: the ops that onnxruntime's quantize_static (QDQ and QOperator formats) and quantize_dynamic write.
 *
 * prepare checks arity and parses attributes; infer checks every scale and zero point (dtype, and shape:
 * per tensor, or one entry per channel of the axis that op allows) and names the offending input with both its
 * ONNX name and its graph value name, then sets output dtypes and shapes. Kernels (kernels/cpu/quant.c) trust
 * what infer checked.
 *
 * The integer matmul and conv do not re-implement MatMul/Conv shape rules: they run the float op's own
 * prepare/infer (looked up with eng_op_find) on a view of the data inputs as float32, and keep that op's params.
 * engine/ops/nn.c documents that its Conv params struct starts with krn_conv_params, which ConvInteger and
 * QLinearConv copy into their kernel params after each infer.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/krn-quant.h"
#include "op.h"

/* "y_scale ('conv1.scale')": the ONNX input name and the graph's value name, into buf. */
static const char *q_in_name(const eng_op_ctx *c, int i, const char *spec, char *buf, size_t n) {
    const char *v = "";
    if (c->graph && c->node && i < c->node->nin && c->node->inputs[i] >= 0) v = c->graph->values[c->node->inputs[i]].name;
    snprintf(buf, n, "%s ('%s')", spec, v ? v : "");
    return buf;
}

static int q_is_8bit(eng_dtype dt) { return dt == ENG_DTYPE_U8 || dt == ENG_DTYPE_I8; }

static int q_is_single(const eng_tensor *t) { return t->ndim == 0 || (t->ndim == 1 && t->dims[0] == 1); }

/* Input i must be an 8-bit integer tensor (uint8 or int8). */
static eng_status q_check_8bit(const eng_op_ctx *c, int i, const char *spec) {
    char nb[160];
    const eng_tensor *t = &c->in[i];
    if (!q_is_8bit(t->dtype))
        return eng_err(ENG_STATUS_UNSUPPORTED, "input %s: expected uint8 or int8, got %s",
                       q_in_name(c, i, spec, nb, sizeof nb), eng_dtype_name(t->dtype));
    return ENG_STATUS_OK;
}

/* Scale or zero point at input i: dtype `want` (UNDEFINED: uint8 or int8), and one element (a scalar or [1]),
 * or, when per > 0, a 1-D tensor of `per` elements (`per_what` says what they run along). Omitted inputs pass
 * when `optional`. */
static eng_status q_check_param(const eng_op_ctx *c, int i, const char *spec, eng_dtype want, int64_t per,
                                const char *per_what, int optional) {
    char nb[160], s1[96];
    if (!eng_op_has_input(c, i)) {
        if (optional) return ENG_STATUS_OK;
        return eng_err(ENG_STATUS_INVALID_MODEL, "input %s is required", q_in_name(c, i, spec, nb, sizeof nb));
    }
    const eng_tensor *t = &c->in[i];
    if (want == ENG_DTYPE_UNDEFINED ? !q_is_8bit(t->dtype) : t->dtype != want)
        return eng_err(want == ENG_DTYPE_UNDEFINED ? ENG_STATUS_UNSUPPORTED : ENG_STATUS_INVALID_MODEL,
                       "input %s: expected dtype %s, got %s", q_in_name(c, i, spec, nb, sizeof nb),
                       want == ENG_DTYPE_UNDEFINED ? "uint8 or int8" : eng_dtype_name(want), eng_dtype_name(t->dtype));
    if (q_is_single(t) || (per > 0 && t->ndim == 1 && t->dims[0] == per)) return ENG_STATUS_OK;
    if (per > 0)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input %s has shape %s: expected a scalar or [%lld] (one per %s)",
                       q_in_name(c, i, spec, nb, sizeof nb), eng_shape_str(t->dims, t->ndim, s1, sizeof s1),
                       (long long)per, per_what);
    return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input %s has shape %s: expected a scalar (per-tensor quantization)",
                   q_in_name(c, i, spec, nb, sizeof nb), eng_shape_str(t->dims, t->ndim, s1, sizeof s1));
}

/* A zero point's dtype must be the dtype of the tensor it belongs to (input `of`, or output dtype `of_dt`). */
static eng_status q_check_zp_dtype(const eng_op_ctx *c, int zp, const char *zp_spec, eng_dtype of_dt, const char *of_what) {
    char nb[160];
    if (eng_op_has_input(c, zp) && c->in[zp].dtype != of_dt)
        return eng_err(ENG_STATUS_INVALID_MODEL, "input %s is %s but %s is %s: a zero point has its tensor's dtype",
                       q_in_name(c, zp, zp_spec, nb, sizeof nb), eng_dtype_name(c->in[zp].dtype), of_what,
                       eng_dtype_name(of_dt));
    return ENG_STATUS_OK;
}

/* ---------------------------------------------------------------- QuantizeLinear / DequantizeLinear */

typedef struct q_qdq_op {
    krn_qdq_params k; /* first: what the kernel sees */
    int64_t axis;     /* the attribute, normalised per input rank in infer */
    eng_dtype out_dt; /* QuantizeLinear's output_dtype attribute (opset 21), UNDEFINED when absent */
} q_qdq_op;

static eng_status q_qdq_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 2, 3));
    q_qdq_op *p = calloc(1, sizeof *p);
    if (!p) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "quantize params");
    c->params = p;
    p->axis = eng_node_attr_int(c->node, "axis", 1);
    p->out_dt = (eng_dtype)eng_node_attr_int(c->node, "output_dtype", 0);
    int64_t block = eng_node_attr_int(c->node, "block_size", 0);
    if (block != 0)
        return eng_err(ENG_STATUS_UNSUPPORTED, "block_size %lld: blocked quantization is not supported", (long long)block);
    return ENG_STATUS_OK;
}

/* Shared scale/zero-point checks; sets p->k.axis (-1 per tensor). names: x, scale, zero point. */
static eng_status q_qdq_check(eng_op_ctx *c, q_qdq_op *p, const char *xs, const char *ss, const char *zs) {
    const eng_tensor *x = &c->in[0], *s = &c->in[1];
    p->k.axis = -1;
    int64_t per = 0;
    if (!q_is_single(s)) { /* per-axis: the axis must exist in x */
        int ax;
        if (eng_norm_axis(p->axis, x->ndim, &ax) != ENG_STATUS_OK) {
            char nb[160], s1[96], s2[96];
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input %s has shape %s but axis %lld is not an axis of %s %s",
                           q_in_name(c, 1, ss, nb, sizeof nb), eng_shape_str(s->dims, s->ndim, s1, sizeof s1),
                           (long long)p->axis, xs, eng_shape_str(x->dims, x->ndim, s2, sizeof s2));
        }
        p->k.axis = ax;
        per = x->dims[ax];
    }
    char what[64];
    snprintf(what, sizeof what, "index of %s's axis %d", xs, p->k.axis);
    ENG_TRY(q_check_param(c, 1, ss, ENG_DTYPE_F32, per, what, 0));
    if (eng_op_has_input(c, 2)) {
        const eng_tensor *z = &c->in[2];
        ENG_TRY(q_check_param(c, 2, zs, z->dtype == ENG_DTYPE_I32 ? ENG_DTYPE_I32 : ENG_DTYPE_UNDEFINED, per, what, 1));
        if (!(q_is_single(z) && q_is_single(s)) && !eng_shape_equal(z, s)) {
            char nb[160], s1[96], s2[96];
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input %s has shape %s but the scale has shape %s",
                           q_in_name(c, 2, zs, nb, sizeof nb), eng_shape_str(z->dims, z->ndim, s1, sizeof s1),
                           eng_shape_str(s->dims, s->ndim, s2, sizeof s2));
        }
    }
    return ENG_STATUS_OK;
}

static eng_status q_quantize_infer(eng_op_ctx *c) {
    q_qdq_op *p = c->params;
    char nb[160];
    if (c->in[0].dtype != ENG_DTYPE_F32)
        return eng_err(ENG_STATUS_UNSUPPORTED, "input %s: expected float32, got %s", q_in_name(c, 0, "x", nb, sizeof nb),
                       eng_dtype_name(c->in[0].dtype));
    ENG_TRY(q_qdq_check(c, p, "x", "y_scale", "y_zero_point"));
    eng_dtype dt = eng_op_has_input(c, 2) ? c->in[2].dtype : p->out_dt ? p->out_dt : ENG_DTYPE_U8;
    if (!q_is_8bit(dt))
        return eng_err(ENG_STATUS_UNSUPPORTED, "output dtype %s: uint8 and int8 are supported", eng_dtype_name(dt));
    if (p->out_dt && p->out_dt != dt)
        return eng_err(ENG_STATUS_INVALID_MODEL, "output_dtype %s differs from input %s's dtype %s",
                       eng_dtype_name(p->out_dt), q_in_name(c, 2, "y_zero_point", nb, sizeof nb), eng_dtype_name(dt));
    eng_op_same_as_input(c, 0, 0);
    c->out[0].dtype = dt;
    return ENG_STATUS_OK;
}

static eng_status q_dequantize_infer(eng_op_ctx *c) {
    q_qdq_op *p = c->params;
    eng_dtype dt = c->in[0].dtype;
    char nb[160];
    if (!q_is_8bit(dt) && dt != ENG_DTYPE_I32)
        return eng_err(ENG_STATUS_UNSUPPORTED, "input %s: expected uint8, int8 or int32, got %s",
                       q_in_name(c, 0, "x", nb, sizeof nb), eng_dtype_name(dt));
    ENG_TRY(q_qdq_check(c, p, "x", "x_scale", "x_zero_point"));
    ENG_TRY(q_check_zp_dtype(c, 2, "x_zero_point", dt, "x"));
    eng_op_same_as_input(c, 0, 0);
    c->out[0].dtype = ENG_DTYPE_F32;
    return ENG_STATUS_OK;
}

/* ---------------------------------------------------------------- DynamicQuantizeLinear */

static eng_status q_dynamic_prepare(eng_op_ctx *c) { return eng_op_check_arity(c, 1, 1); }

static eng_status q_dynamic_infer(eng_op_ctx *c) {
    char nb[160];
    if (c->in[0].dtype != ENG_DTYPE_F32)
        return eng_err(ENG_STATUS_UNSUPPORTED, "input %s: expected float32, got %s", q_in_name(c, 0, "x", nb, sizeof nb),
                       eng_dtype_name(c->in[0].dtype));
    eng_op_same_as_input(c, 0, 0);
    c->out[0].dtype = ENG_DTYPE_U8;
    for (int i = 1; i < c->nout && i < 3; i++) {
        c->out[i].dtype = i == 1 ? ENG_DTYPE_F32 : ENG_DTYPE_U8;
        c->out[i].ndim = 0;
    }
    return ENG_STATUS_OK;
}

/* ---------------------------------------------------------------- integer MatMul / Conv */

typedef struct q_mm_op {
    krn_qmatmul_params k;
    const eng_op_def *fdef; /* MatMul, for shape rules */
    void *fparams;
} q_mm_op;

typedef struct q_conv_op {
    krn_qconv_params k;
    const eng_op_def *fdef; /* Conv, for attributes and shape rules */
    void *fparams;
} q_conv_op;

static void q_fparams_free(const eng_op_def *d, void *p) {
    if (!p) return;
    if (d && d->free_params) d->free_params(p);
    else free(p);
}
static void q_mm_free(void *p) {
    q_mm_op *o = p;
    if (o) q_fparams_free(o->fdef, o->fparams);
    free(o);
}
static void q_conv_free(void *p) {
    q_conv_op *o = p;
    if (o) q_fparams_free(o->fdef, o->fparams);
    free(o);
}

/* Run the float op `def`'s prepare on this node with only its two data inputs; *params gets its params. */
static eng_status q_float_prepare(eng_op_ctx *c, const char *op_type, const eng_op_def **def, void **params) {
    *def = eng_op_find("", op_type);
    if (!*def) return eng_err(ENG_STATUS_INTERNAL, "no %s op to borrow shape rules from", op_type);
    eng_op_ctx sub = *c;
    sub.nin = 2;
    sub.params = NULL;
    eng_status st = (*def)->prepare ? (*def)->prepare(&sub) : ENG_STATUS_OK;
    *params = sub.params;
    return st;
}

/* Run the float op's infer on inputs ia, ib viewed as float32; output 0 gets its shape and dtype `dt`. */
static eng_status q_float_infer(eng_op_ctx *c, const eng_op_def *def, void *params, int ia, int ib, eng_dtype dt) {
    eng_tensor in[2] = {c->in[ia], c->in[ib]}, out = {0};
    in[0].dtype = in[1].dtype = ENG_DTYPE_F32;
    in[0].data = in[1].data = NULL;
    eng_op_ctx sub = *c;
    sub.in = in;
    sub.nin = 2;
    sub.out = &out;
    sub.nout = 1;
    sub.params = params;
    ENG_TRY(def->infer(&sub));
    c->out[0] = out;
    c->out[0].dtype = dt;
    return ENG_STATUS_OK;
}

/* The three integer matmuls' prepare: their input layout (krn-quant.h) and arity; MatMulIntegerToFloat also takes
 * the "act" attrs the load-time fusion sets (engine/plan/fuse.c). */
enum { Q_MM_INTEGER, Q_MM_QLINEAR, Q_MM_TO_FLOAT };

static eng_status q_mm_prepare_common(eng_op_ctx *c, int kind) {
    static const int lo[] = {2, 8, 4}, hi[] = {4, 8, 7};
    ENG_TRY(eng_op_check_arity(c, lo[kind], hi[kind]));
    q_mm_op *p = calloc(1, sizeof *p);
    if (!p) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "matmul params");
    c->params = p;
    p->k.qlinear = kind == Q_MM_QLINEAR;
    p->k.to_float = kind == Q_MM_TO_FLOAT;
    if (p->k.to_float) eng_nn_act_attrs(c->node, &p->k.act);
    return q_float_prepare(c, "MatMul", &p->fdef, &p->fparams);
}
static eng_status q_matmul_integer_prepare(eng_op_ctx *c) { return q_mm_prepare_common(c, Q_MM_INTEGER); }
static eng_status q_mm_to_float_prepare(eng_op_ctx *c) { return q_mm_prepare_common(c, Q_MM_TO_FLOAT); }
static eng_status q_qlinear_matmul_prepare(eng_op_ctx *c) { return q_mm_prepare_common(c, Q_MM_QLINEAR); }

/* Rows of A (M) and columns of B (N) as MatMul sees them (1 for a 1-D operand). */
static int64_t q_rows(const eng_tensor *a) { return a->ndim >= 2 ? a->dims[a->ndim - 2] : 1; }
static int64_t q_cols(const eng_tensor *b) { return b->ndim >= 2 ? b->dims[b->ndim - 1] : 1; }

static eng_status q_matmul_integer_infer(eng_op_ctx *c) {
    q_mm_op *p = c->params;
    ENG_TRY(q_check_8bit(c, 0, "A"));
    ENG_TRY(q_check_8bit(c, 1, "B"));
    ENG_TRY(q_check_param(c, 2, "a_zero_point", c->in[0].dtype, q_rows(&c->in[0]), "row of A", 1));
    ENG_TRY(q_check_param(c, 3, "b_zero_point", c->in[1].dtype, q_cols(&c->in[1]), "column of B", 1));
    return q_float_infer(c, p->fdef, p->fparams, 0, 1, ENG_DTYPE_I32);
}

static eng_status q_mm_to_float_infer(eng_op_ctx *c) {
    q_mm_op *p = c->params;
    ENG_TRY(q_check_8bit(c, 0, "A"));
    ENG_TRY(q_check_8bit(c, 1, "B"));
    int64_t N = q_cols(&c->in[1]);
    ENG_TRY(q_check_param(c, 2, "a_scale", ENG_DTYPE_F32, 0, NULL, 0));
    ENG_TRY(q_check_param(c, 3, "b_scale", ENG_DTYPE_F32, N, "column of B", 0));
    ENG_TRY(q_check_param(c, 4, "a_zero_point", c->in[0].dtype, 0, NULL, 1));
    ENG_TRY(q_check_param(c, 5, "b_zero_point", c->in[1].dtype, N, "column of B", 1));
    if (eng_op_has_input(c, 6)) {
        const eng_tensor *b = &c->in[6];
        char nb[160], s1[96];
        if (b->dtype != ENG_DTYPE_F32 || b->ndim != 1 || b->dims[0] != N)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input %s is %s %s: expected float32 [%lld] (one per column of B)",
                           q_in_name(c, 6, "bias", nb, sizeof nb), eng_dtype_name(b->dtype),
                           eng_shape_str(b->dims, b->ndim, s1, sizeof s1), (long long)N);
    }
    return q_float_infer(c, p->fdef, p->fparams, 0, 1, ENG_DTYPE_F32);
}

static eng_status q_qlinear_matmul_infer(eng_op_ctx *c) {
    q_mm_op *p = c->params;
    ENG_TRY(q_check_8bit(c, 0, "a"));
    ENG_TRY(q_check_8bit(c, 3, "b"));
    int64_t M = q_rows(&c->in[0]), N = q_cols(&c->in[3]);
    ENG_TRY(q_check_param(c, 1, "a_scale", ENG_DTYPE_F32, M, "row of a", 0));
    ENG_TRY(q_check_param(c, 2, "a_zero_point", c->in[0].dtype, M, "row of a", 1));
    ENG_TRY(q_check_param(c, 4, "b_scale", ENG_DTYPE_F32, N, "column of b", 0));
    ENG_TRY(q_check_param(c, 5, "b_zero_point", c->in[3].dtype, N, "column of b", 1));
    ENG_TRY(q_check_param(c, 6, "y_scale", ENG_DTYPE_F32, 0, NULL, 0));
    ENG_TRY(q_check_param(c, 7, "y_zero_point", ENG_DTYPE_UNDEFINED, 0, NULL, 1));
    eng_dtype dt = eng_op_has_input(c, 7) ? c->in[7].dtype : c->in[0].dtype;
    return q_float_infer(c, p->fdef, p->fparams, 0, 3, dt);
}

static eng_status q_conv_prepare_common(eng_op_ctx *c, int qlinear) {
    ENG_TRY(eng_op_check_arity(c, qlinear ? 8 : 2, qlinear ? 9 : 4));
    q_conv_op *p = calloc(1, sizeof *p);
    if (!p) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "conv params");
    c->params = p;
    p->k.qlinear = qlinear;
    return q_float_prepare(c, "Conv", &p->fdef, &p->fparams);
}
static eng_status q_conv_integer_prepare(eng_op_ctx *c) { return q_conv_prepare_common(c, 0); }
static eng_status q_qlinear_conv_prepare(eng_op_ctx *c) { return q_conv_prepare_common(c, 1); }

/* Conv's infer (attributes, pads, output shape), then its resolved krn_conv_params into ours. */
static eng_status q_conv_geometry(eng_op_ctx *c, q_conv_op *p, int ix, int iw, eng_dtype dt) {
    ENG_TRY(q_float_infer(c, p->fdef, p->fparams, ix, iw, dt));
    p->k.conv = *(const krn_conv_params *)p->fparams; /* nn.c: its Conv params begin with krn_conv_params */
    return ENG_STATUS_OK;
}

static eng_status q_conv_integer_infer(eng_op_ctx *c) {
    q_conv_op *p = c->params;
    ENG_TRY(q_check_8bit(c, 0, "x"));
    ENG_TRY(q_check_8bit(c, 1, "w"));
    int64_t M = c->in[1].ndim >= 1 ? c->in[1].dims[0] : 0;
    ENG_TRY(q_check_param(c, 2, "x_zero_point", c->in[0].dtype, 0, NULL, 1));
    ENG_TRY(q_check_param(c, 3, "w_zero_point", c->in[1].dtype, M, "output channel", 1));
    return q_conv_geometry(c, p, 0, 1, ENG_DTYPE_I32);
}

static eng_status q_qlinear_conv_infer(eng_op_ctx *c) {
    q_conv_op *p = c->params;
    ENG_TRY(q_check_8bit(c, 0, "x"));
    ENG_TRY(q_check_8bit(c, 3, "w"));
    int64_t M = c->in[3].ndim >= 1 ? c->in[3].dims[0] : 0;
    ENG_TRY(q_check_param(c, 1, "x_scale", ENG_DTYPE_F32, 0, NULL, 0));
    ENG_TRY(q_check_param(c, 2, "x_zero_point", c->in[0].dtype, 0, NULL, 1));
    ENG_TRY(q_check_param(c, 4, "w_scale", ENG_DTYPE_F32, M, "output channel", 0));
    ENG_TRY(q_check_param(c, 5, "w_zero_point", c->in[3].dtype, M, "output channel", 1));
    ENG_TRY(q_check_param(c, 6, "y_scale", ENG_DTYPE_F32, 0, NULL, 0));
    ENG_TRY(q_check_param(c, 7, "y_zero_point", ENG_DTYPE_UNDEFINED, 0, NULL, 1));
    if (eng_op_has_input(c, 8)) {
        const eng_tensor *b = &c->in[8];
        char nb[160], s1[96];
        if (b->dtype != ENG_DTYPE_I32 || b->ndim != 1 || b->dims[0] != M)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input %s is %s %s: expected int32 [%lld] (one per output channel)",
                           q_in_name(c, 8, "B", nb, sizeof nb), eng_dtype_name(b->dtype),
                           eng_shape_str(b->dims, b->ndim, s1, sizeof s1), (long long)M);
    }
    eng_dtype dt = eng_op_has_input(c, 7) ? c->in[7].dtype : c->in[0].dtype;
    return q_conv_geometry(c, p, 0, 3, dt);
}

/* ---------------------------------------------------------------- com.microsoft QLinearAdd / QLinearMul */

static eng_status q_binary_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 7, 8));
    krn_qbinary_params *p = calloc(1, sizeof *p);
    if (!p) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "QLinear binary params");
    p->mul = strcmp(c->node->op_type, "QLinearMul") == 0;
    c->params = p;
    return ENG_STATUS_OK;
}

/* The int8 layout pass (fuse-qdq.c) marks with nhwc = 1 a QLinearAdd whose operands it stores channels last. */
static int q_binary_nhwc(const eng_op_ctx *c) { return c->node && eng_node_attr_int(c->node, "nhwc", 0) != 0; }

static eng_status q_binary_infer(eng_op_ctx *c) {
    static const char *spec[8] = {"A", "A_scale", "A_zero_point", "B", "B_scale", "B_zero_point", "C_scale", "C_zero_point"};
    ENG_TRY(q_check_8bit(c, 0, spec[0]));
    eng_dtype dt = c->in[0].dtype;
    if (c->in[3].dtype != dt) {
        char nb[160];
        return eng_err(ENG_STATUS_INVALID_MODEL, "input %s is %s but A is %s: both operands have one dtype",
                       q_in_name(c, 3, spec[3], nb, sizeof nb), eng_dtype_name(c->in[3].dtype), eng_dtype_name(dt));
    }
    for (int i = 1; i < 8; i++) {
        if (i == 3) continue;
        int zp = i == 2 || i == 5 || i == 7;
        ENG_TRY(q_check_param(c, i, spec[i], zp ? dt : ENG_DTYPE_F32, 0, NULL, zp));
    }
    if (q_binary_nhwc(c) && !eng_shape_equal(&c->in[0], &c->in[3])) {
        char s1[96], s2[96];
        return eng_err(ENG_STATUS_UNSUPPORTED, "A %s and B %s differ, but the int8 layout pass stored them channels last, "
                       "where broadcasting cannot run (TENSORD_NO_INT8_NHWC=1 turns that pass off)",
                       eng_shape_str(c->in[0].dims, c->in[0].ndim, s1, sizeof s1),
                       eng_shape_str(c->in[3].dims, c->in[3].ndim, s2, sizeof s2));
    }
    const eng_tensor *ts[2] = {&c->in[0], &c->in[3]};
    eng_tensor out = {0};
    ENG_TRY(eng_broadcast_shapes(ts, 2, &out));
    c->out[0] = out;
    c->out[0].dtype = dt;
    return ENG_STATUS_OK;
}

const eng_op_def eng_ops_quant[] = {
    {"QuantizeLinear", "", "quantize_linear", 0, q_qdq_prepare, q_quantize_infer, NULL},
    {"DequantizeLinear", "", "dequantize_linear", 0, q_qdq_prepare, q_dequantize_infer, NULL},
    {"DynamicQuantizeLinear", "", "dynamic_quantize_linear", 0, q_dynamic_prepare, q_dynamic_infer, NULL},
    {"MatMulInteger", "", "matmul_integer", 0, q_matmul_integer_prepare, q_matmul_integer_infer, q_mm_free},
    {"QLinearMatMul", "", "matmul_integer", 0, q_qlinear_matmul_prepare, q_qlinear_matmul_infer, q_mm_free},
    {"ConvInteger", "", "conv_integer", 0, q_conv_integer_prepare, q_conv_integer_infer, q_conv_free},
    {"QLinearConv", "", "conv_integer", 0, q_qlinear_conv_prepare, q_qlinear_conv_infer, q_conv_free},
    {"MatMulIntegerToFloat", "com.microsoft", "matmul_integer", 0, q_mm_to_float_prepare, q_mm_to_float_infer, q_mm_free},
    {"QLinearAdd", "com.microsoft", "qlinear_binary", 0, q_binary_prepare, q_binary_infer, NULL},
    {"QLinearMul", "com.microsoft", "qlinear_binary", 0, q_binary_prepare, q_binary_infer, NULL},
    {NULL},
};
