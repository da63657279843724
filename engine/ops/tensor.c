/* tensor.c - the "tensor" op family's table (data movement and shape ops) and its shape-only ops: Identity,
 * Dropout (inference), Flatten, Reshape, Squeeze, Unsqueeze, Shape, Size, Constant, ConstantOfShape, Range,
 * EyeLike. The movement ops (Transpose, Concat, Split, Slice, Expand, Tile, Pad, ...) are in tensor-move.c,
 * the index-driven ones (Gather*, Scatter*, OneHot, Compress, NonZero, ReverseSequence) in tensor-index.c,
 * Resize/Upsample in tensor-resize.c.
 *
 * Invariants: prepare parses attributes only (opset-dependent forms: Reshape-1 `shape`, Squeeze/Unsqueeze-1..12
 * `axes`, Dropout-1..11 `ratio`, Shape-15 start/end); infer reads value inputs (shape, axes, start/limit/delta)
 * from data and returns NEEDS_DATA when they are not known yet. Reshape/Flatten/Squeeze/Unsqueeze/Identity are
 * ALIAS ops: no kernel runs, so their infer is the whole op.
 */
#include <stdlib.h>
#include <string.h>

#include "../../kernels/krn-tensor.h"
#include "op.h"

/* ---- shared helpers (also used by tensor-move.c, tensor-index.c, tensor-resize.c) ---- */

/* Read 1-D (or scalar) integer input i into out[0..max). *n gets the count. NEEDS_DATA when its value is unknown;
 * INVALID_ARGUMENT (naming `what`) when it is not an integer tensor or has more than max entries. */
eng_status eng_tensor_op_read_ints(const eng_op_ctx *c, int i, const char *what, int64_t *out, int max, int *n) {
    const eng_tensor *t = &c->in[i];
    if (!t->data && eng_tensor_numel(t) != 0) return ENG_STATUS_NEEDS_DATA;
    if (t->dtype != ENG_DTYPE_I64 && t->dtype != ENG_DTYPE_I32)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input '%s' must be int64 or int32, got %s", what,
                       eng_dtype_name(t->dtype));
    if (t->ndim > 1)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input '%s' must be 1-D, got rank %d", what, t->ndim);
    int64_t k = eng_tensor_numel(t);
    if (k > max)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input '%s' has %lld entries, at most %d allowed", what,
                       (long long)k, max);
    for (int64_t j = 0; j < k; j++) out[j] = eng_tensor_get_i64(t, j);
    *n = (int)k;
    return ENG_STATUS_OK;
}

/* Dtype check for data-movement ops: anything with a fixed element size. */
eng_status eng_tensor_op_check_dtype(const eng_tensor *t, const char *what) {
    if (!eng_dtype_size(t->dtype))
        return eng_err(ENG_STATUS_UNSUPPORTED, "input '%s' has dtype %s, which this op cannot hold", what,
                       eng_dtype_name(t->dtype));
    return ENG_STATUS_OK;
}

void *eng_tensor_op_params(eng_op_ctx *c, size_t size) {
    c->params = calloc(1, size);
    if (!c->params) eng_err(ENG_STATUS_OUT_OF_MEMORY, "%zu bytes of params", size);
    return c->params;
}

static eng_status set_out(eng_op_ctx *c, int j, eng_dtype dt, int ndim, const int64_t *dims) {
    if (ndim > ENG_MAX_DIMS)
        return eng_err(ENG_STATUS_UNSUPPORTED, "output %d would have rank %d, more than %d", j, ndim, ENG_MAX_DIMS);
    c->out[j].dtype = dt;
    c->out[j].ndim = ndim;
    for (int i = 0; i < ndim; i++) c->out[j].dims[i] = dims[i];
    return ENG_STATUS_OK;
}

/* ---- Identity ---- */

static eng_status identity_prepare(eng_op_ctx *c) { return eng_op_check_arity(c, 1, 1); }

static eng_status identity_infer(eng_op_ctx *c) {
    ENG_TRY(eng_tensor_op_check_dtype(&c->in[0], "input"));
    eng_op_same_as_input(c, 0, 0);
    return ENG_STATUS_OK;
}

/* ---- Dropout (inference) ---- */

static eng_status dropout_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 1, 3));
    krn_dropout_params *p = eng_tensor_op_params(c, sizeof *p);
    if (!p) return ENG_STATUS_OUT_OF_MEMORY;
    p->ratio = c->opset < 12 ? eng_node_attr_float(c->node, "ratio", 0.5f) : 0.5f;
    return ENG_STATUS_OK;
}

static eng_status dropout_infer(eng_op_ctx *c) {
    const krn_dropout_params *p = c->params;
    ENG_TRY(eng_tensor_op_check_dtype(&c->in[0], "data"));
    double ratio = p->ratio;
    if (eng_op_has_input(c, 1) && c->in[1].data) ratio = eng_tensor_get_f64(&c->in[1], 0);
    if (eng_op_has_input(c, 2) && c->in[2].data && eng_tensor_get_i64(&c->in[2], 0) != 0 && ratio > 0)
        return eng_err(ENG_STATUS_UNSUPPORTED, "training-mode Dropout (training_mode=true, ratio=%g) is not supported",
                       ratio);
    eng_op_same_as_input(c, 0, 0);
    if (c->nout > 1) {
        eng_op_same_as_input(c, 0, 1);
        if (c->opset >= 10) c->out[1].dtype = ENG_DTYPE_BOOL;
    }
    return ENG_STATUS_OK;
}

/* ---- Flatten ---- */

static eng_status flatten_prepare(eng_op_ctx *c) { return eng_op_check_arity(c, 1, 1); }

static eng_status flatten_infer(eng_op_ctx *c) {
    const eng_tensor *x = &c->in[0];
    int64_t axis = eng_node_attr_int(c->node, "axis", 1);
    if (axis < -x->ndim || axis > x->ndim)
        return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'axis' = %lld is out of range [%d, %d] for rank %d",
                       (long long)axis, -x->ndim, x->ndim, x->ndim);
    if (axis < 0) axis += x->ndim;
    int64_t d[2] = {1, 1};
    for (int i = 0; i < x->ndim; i++) d[i < axis ? 0 : 1] *= x->dims[i];
    return set_out(c, 0, x->dtype, 2, d);
}

/* ---- Reshape ---- */

static eng_status reshape_prepare(eng_op_ctx *c) { return eng_op_check_arity(c, c->opset < 5 ? 1 : 2, 2); }

static eng_status reshape_infer(eng_op_ctx *c) {
    const eng_tensor *x = &c->in[0];
    int64_t shape[ENG_MAX_DIMS];
    int n = 0;
    if (c->opset < 5) {
        const int64_t *s = NULL;
        n = eng_node_attr_ints(c->node, "shape", &s);
        if (n < 0) return eng_err(ENG_STATUS_INVALID_MODEL, "Reshape-1 needs attribute 'shape'");
        if (n > ENG_MAX_DIMS) return eng_err(ENG_STATUS_UNSUPPORTED, "shape of rank %d exceeds %d", n, ENG_MAX_DIMS);
        memcpy(shape, s, (size_t)n * sizeof *s);
    } else
        ENG_TRY(eng_tensor_op_read_ints(c, 1, "shape", shape, ENG_MAX_DIMS, &n));
    int allowzero = eng_node_attr_int(c->node, "allowzero", 0) != 0;
    int64_t known = 1, in_numel = eng_tensor_numel(x);
    int neg = -1;
    for (int i = 0; i < n; i++) {
        if (shape[i] == -1) {
            if (neg >= 0) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'shape' has more than one -1");
            neg = i;
            continue;
        }
        if (shape[i] == 0 && !allowzero) {
            if (i >= x->ndim)
                return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'shape'[%d] = 0 copies a dim the rank-%d input lacks",
                               i, x->ndim);
            shape[i] = x->dims[i];
        }
        if (shape[i] < 0)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'shape'[%d] = %lld is negative", i, (long long)shape[i]);
        if (__builtin_mul_overflow(known, shape[i], &known))
            return eng_err(ENG_STATUS_OUT_OF_MEMORY, "input 'shape' has an element count that overflows int64");
    }
    if (neg >= 0) {
        if (known == 0 || in_numel % known != 0) {
            char b[96];
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "cannot infer the -1 of 'shape' for an input of shape %s",
                           eng_shape_str(x->dims, x->ndim, b, sizeof b));
        }
        shape[neg] = in_numel / known;
        known *= shape[neg];
    }
    if (known != in_numel) {
        char a[96], b[96];
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "cannot reshape input of shape %s (%lld elements) to %s",
                       eng_shape_str(x->dims, x->ndim, a, sizeof a), (long long)in_numel,
                       eng_shape_str(shape, n, b, sizeof b));
    }
    return set_out(c, 0, x->dtype, n, shape);
}

/* ---- Squeeze / Unsqueeze ---- */

static eng_status squeeze_prepare(eng_op_ctx *c) { return eng_op_check_arity(c, 1, 2); }

/* axes from the attribute (opset < 13) or input 1; *n = -1 when absent. */
static eng_status read_axes(eng_op_ctx *c, int64_t *axes, int *n) {
    *n = -1;
    if (c->opset < 13) {
        const int64_t *a = NULL;
        int k = eng_node_attr_ints(c->node, "axes", &a);
        if (k > ENG_MAX_DIMS * 2) return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'axes' has %d entries", k);
        if (k >= 0) memcpy(axes, a, (size_t)k * sizeof *a);
        *n = k;
        return ENG_STATUS_OK;
    }
    if (!eng_op_has_input(c, 1)) return ENG_STATUS_OK;
    return eng_tensor_op_read_ints(c, 1, "axes", axes, ENG_MAX_DIMS * 2, n);
}

static eng_status squeeze_infer(eng_op_ctx *c) {
    const eng_tensor *x = &c->in[0];
    int64_t axes[ENG_MAX_DIMS * 2], d[ENG_MAX_DIMS];
    int n, drop[ENG_MAX_DIMS] = {0};
    ENG_TRY(read_axes(c, axes, &n));
    if (n < 0) {
        for (int i = 0; i < x->ndim; i++) drop[i] = x->dims[i] == 1;
    } else
        for (int k = 0; k < n; k++) {
            int a;
            ENG_TRY(eng_norm_axis(axes[k], x->ndim, &a));
            if (x->dims[a] != 1)
                return eng_err(ENG_STATUS_INVALID_ARGUMENT, "cannot squeeze axis %d of size %lld (must be 1)", a,
                               (long long)x->dims[a]);
            drop[a] = 1;
        }
    int m = 0;
    for (int i = 0; i < x->ndim; i++)
        if (!drop[i]) d[m++] = x->dims[i];
    return set_out(c, 0, x->dtype, m, d);
}

static eng_status unsqueeze_prepare(eng_op_ctx *c) { return eng_op_check_arity(c, c->opset < 13 ? 1 : 2, 2); }

static eng_status unsqueeze_infer(eng_op_ctx *c) {
    const eng_tensor *x = &c->in[0];
    int64_t axes[ENG_MAX_DIMS * 2], d[ENG_MAX_DIMS];
    int n;
    ENG_TRY(read_axes(c, axes, &n));
    if (n < 0) return eng_err(ENG_STATUS_INVALID_MODEL, "Unsqueeze needs 'axes'");
    int r = x->ndim + n, ins[ENG_MAX_DIMS * 3] = {0};
    if (r > ENG_MAX_DIMS) return eng_err(ENG_STATUS_UNSUPPORTED, "output rank %d exceeds %d", r, ENG_MAX_DIMS);
    for (int k = 0; k < n; k++) {
        int a;
        ENG_TRY(eng_norm_axis(axes[k], r, &a));
        if (ins[a]) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "'axes' repeats axis %d", a);
        ins[a] = 1;
    }
    for (int i = 0, j = 0; i < r; i++) d[i] = ins[i] ? 1 : x->dims[j++];
    return set_out(c, 0, x->dtype, r, d);
}

/* ---- Shape / Size ---- */

static eng_status shape_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 1, 1));
    return eng_tensor_op_params(c, sizeof(krn_shape_params)) ? ENG_STATUS_OK : ENG_STATUS_OUT_OF_MEMORY;
}

static eng_status shape_infer(eng_op_ctx *c) {
    krn_shape_params *p = c->params;
    int64_t r = c->in[0].ndim, s = 0, e = r;
    if (c->opset >= 15) {
        s = eng_node_attr_int(c->node, "start", 0);
        e = eng_node_attr_int(c->node, "end", r);
    }
    if (s < 0) s += r;
    if (e < 0) e += r;
    s = s < 0 ? 0 : (s > r ? r : s);
    e = e < 0 ? 0 : (e > r ? r : e);
    if (e < s) e = s;
    p->start = s;
    p->end = e;
    int64_t n = e - s;
    return set_out(c, 0, ENG_DTYPE_I64, 1, &n);
}

static eng_status size_prepare(eng_op_ctx *c) { return eng_op_check_arity(c, 1, 1); }

static eng_status size_infer(eng_op_ctx *c) { return set_out(c, 0, ENG_DTYPE_I64, 0, NULL); }

/* ---- Constant / ConstantOfShape ---- */

static void constant_free(void *params) {
    krn_constant_params *p = params;
    if (p) eng_free(p->value.data);
    free(p);
}

/* Fill p->value with n elements of dtype dt copied from src (n may be 0). */
static eng_status constant_set(krn_constant_params *p, eng_dtype dt, int ndim, const int64_t *dims, const void *src) {
    p->value.dtype = dt;
    p->value.ndim = ndim;
    for (int i = 0; i < ndim; i++) p->value.dims[i] = dims[i];
    size_t nb;
    ENG_TRY(eng_tensor_nbytes_checked(&p->value, "attribute 'value'", &nb));
    p->value.data = eng_alloc(nb ? nb : 1);
    if (!p->value.data) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "constant of %zu bytes", nb);
    if (nb) memcpy(p->value.data, src, nb);
    return ENG_STATUS_OK;
}

static eng_status constant_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 0, 0));
    krn_constant_params *p = eng_tensor_op_params(c, sizeof *p);
    if (!p) return ENG_STATUS_OUT_OF_MEMORY;
    const eng_attr *a;
    if ((a = eng_node_attr(c->node, "value")) != NULL) {
        if (a->type != ENG_ATTR_TENSOR) return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'value' is not a tensor");
        if (!eng_dtype_size(a->t.dtype))
            return eng_err(ENG_STATUS_UNSUPPORTED, "Constant of dtype %s", eng_dtype_name(a->t.dtype));
        return constant_set(p, a->t.dtype, a->t.ndim, a->t.dims, a->t.data);
    }
    if ((a = eng_node_attr(c->node, "value_float")) != NULL) return constant_set(p, ENG_DTYPE_F32, 0, NULL, &a->f);
    if ((a = eng_node_attr(c->node, "value_int")) != NULL) return constant_set(p, ENG_DTYPE_I64, 0, NULL, &a->i);
    if ((a = eng_node_attr(c->node, "value_floats")) != NULL) {
        int64_t n = a->n;
        return constant_set(p, ENG_DTYPE_F32, 1, &n, a->floats);
    }
    if ((a = eng_node_attr(c->node, "value_ints")) != NULL) {
        int64_t n = a->n;
        return constant_set(p, ENG_DTYPE_I64, 1, &n, a->ints);
    }
    if (eng_node_attr(c->node, "sparse_value"))
        return eng_err(ENG_STATUS_UNSUPPORTED, "Constant with a sparse_value attribute");
    if (eng_node_attr(c->node, "value_string") || eng_node_attr(c->node, "value_strings"))
        return eng_err(ENG_STATUS_UNSUPPORTED, "Constant of strings");
    return eng_err(ENG_STATUS_INVALID_MODEL, "Constant has none of value, value_float(s), value_int(s)");
}

static eng_status constant_infer(eng_op_ctx *c) {
    const krn_constant_params *p = c->params;
    return set_out(c, 0, p->value.dtype, p->value.ndim, p->value.dims);
}

static eng_status cos_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 1, 1));
    krn_constant_params *p = eng_tensor_op_params(c, sizeof *p);
    if (!p) return ENG_STATUS_OUT_OF_MEMORY;
    const eng_attr *a = eng_node_attr(c->node, "value");
    if (!a) {
        float z = 0;
        return constant_set(p, ENG_DTYPE_F32, 0, NULL, &z);
    }
    if (a->type != ENG_ATTR_TENSOR || eng_tensor_numel(&a->t) != 1 || !eng_dtype_size(a->t.dtype))
        return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'value' must be a one-element numeric tensor");
    return constant_set(p, a->t.dtype, 0, NULL, a->t.data);
}

static eng_status cos_infer(eng_op_ctx *c) {
    const krn_constant_params *p = c->params;
    int64_t d[ENG_MAX_DIMS];
    int n;
    ENG_TRY(eng_tensor_op_read_ints(c, 0, "input", d, ENG_MAX_DIMS, &n));
    for (int i = 0; i < n; i++)
        if (d[i] < 0)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'input'[%d] = %lld is negative", i, (long long)d[i]);
    ENG_TRY(set_out(c, 0, p->value.dtype, n, d));
    size_t nb;
    return eng_tensor_nbytes_checked(&c->out[0], "output", &nb);
}

/* ---- Range ---- */

static eng_status range_prepare(eng_op_ctx *c) { return eng_op_check_arity(c, 3, 3); }

static eng_status range_infer(eng_op_ctx *c) {
    static const char *names[3] = {"start", "limit", "delta"};
    eng_dtype dt = c->in[0].dtype;
    if (dt != ENG_DTYPE_F32 && dt != ENG_DTYPE_F64 && dt != ENG_DTYPE_I16 && dt != ENG_DTYPE_I32 && dt != ENG_DTYPE_I64)
        return eng_err(ENG_STATUS_UNSUPPORTED, "Range of dtype %s", eng_dtype_name(dt));
    for (int i = 0; i < 3; i++) {
        if (c->in[i].dtype != dt)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input '%s' has dtype %s, expected %s like 'start'", names[i],
                           eng_dtype_name(c->in[i].dtype), eng_dtype_name(dt));
        if (eng_tensor_numel(&c->in[i]) != 1)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input '%s' must be a scalar", names[i]);
    }
    for (int i = 0; i < 3; i++)
        if (!c->in[i].data) return ENG_STATUS_NEEDS_DATA;
    int64_t n;
    if (eng_dtype_is_float(dt)) {
        double s = eng_tensor_get_f64(&c->in[0], 0), l = eng_tensor_get_f64(&c->in[1], 0),
               d = eng_tensor_get_f64(&c->in[2], 0);
        if (d == 0 || d != d) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'delta' is %g", d);
        double q = __builtin_ceil((l - s) / d);
        if (!(q < 4e18)) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "Range of %g elements", q);
        n = q > 0 ? (int64_t)q : 0;
    } else {
        int64_t s = eng_tensor_get_i64(&c->in[0], 0), l = eng_tensor_get_i64(&c->in[1], 0),
                d = eng_tensor_get_i64(&c->in[2], 0);
        if (d == 0) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'delta' is 0");
        double q = __builtin_ceil(((double)l - (double)s) / (double)d);
        n = q > 0 ? (int64_t)q : 0;
        if (n > 0) { /* exact integer ceil */
            int64_t span = l - s;
            n = d > 0 ? (span + d - 1) / d : (-span + -d - 1) / -d;
            if (n < 0) n = 0;
        }
    }
    ENG_TRY(set_out(c, 0, dt, 1, &n));
    size_t nb;
    return eng_tensor_nbytes_checked(&c->out[0], "output", &nb);
}

/* ---- EyeLike ---- */

static eng_status eyelike_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 1, 1));
    krn_eyelike_params *p = eng_tensor_op_params(c, sizeof *p);
    if (!p) return ENG_STATUS_OUT_OF_MEMORY;
    p->k = eng_node_attr_int(c->node, "k", 0);
    return ENG_STATUS_OK;
}

static eng_status eyelike_infer(eng_op_ctx *c) {
    if (c->in[0].ndim != 2)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'input' must be 2-D, got rank %d", c->in[0].ndim);
    eng_dtype dt = (eng_dtype)eng_node_attr_int(c->node, "dtype", c->in[0].dtype);
    if (!eng_dtype_size(dt) || dt == ENG_DTYPE_UNDEFINED)
        return eng_err(ENG_STATUS_UNSUPPORTED, "EyeLike of dtype %s", eng_dtype_name(dt));
    return set_out(c, 0, dt, 2, c->in[0].dims);
}

/* ---- ops defined in tensor-move.c, tensor-index.c, tensor-resize.c ---- */
#define ENG_TENSOR_DECL(name)                                                                                      \
    eng_status eng_tensor_##name##_prepare(eng_op_ctx *c);                                                         \
    eng_status eng_tensor_##name##_infer(eng_op_ctx *c);
ENG_TENSOR_DECL(transpose)
ENG_TENSOR_DECL(concat)
ENG_TENSOR_DECL(split)
ENG_TENSOR_DECL(slice)
ENG_TENSOR_DECL(expand)
ENG_TENSOR_DECL(tile)
ENG_TENSOR_DECL(pad)
ENG_TENSOR_DECL(trilu)
ENG_TENSOR_DECL(depth_space)
ENG_TENSOR_DECL(gather)
ENG_TENSOR_DECL(gather_elements)
ENG_TENSOR_DECL(gather_nd)
ENG_TENSOR_DECL(scatter_elements)
ENG_TENSOR_DECL(scatter_nd)
ENG_TENSOR_DECL(onehot)
ENG_TENSOR_DECL(compress)
ENG_TENSOR_DECL(nonzero)
ENG_TENSOR_DECL(reverse_sequence)
ENG_TENSOR_DECL(resize)
#undef ENG_TENSOR_DECL

#define ENG_TENSOR_DEF(op, kernel, name) {op, "", kernel, 0, eng_tensor_##name##_prepare, eng_tensor_##name##_infer, NULL}

const eng_op_def eng_ops_tensor[] = {
    {"Identity", "", NULL, ENG_OP_ALIAS, identity_prepare, identity_infer, NULL},
    {"Dropout", "", "dropout", 0, dropout_prepare, dropout_infer, NULL},
    {"Flatten", "", NULL, ENG_OP_ALIAS, flatten_prepare, flatten_infer, NULL},
    {"Reshape", "", NULL, ENG_OP_ALIAS, reshape_prepare, reshape_infer, NULL},
    {"Squeeze", "", NULL, ENG_OP_ALIAS, squeeze_prepare, squeeze_infer, NULL},
    {"Unsqueeze", "", NULL, ENG_OP_ALIAS, unsqueeze_prepare, unsqueeze_infer, NULL},
    {"Shape", "", "shape", ENG_OP_SHAPE_ONLY, shape_prepare, shape_infer, NULL},
    {"Size", "", "size", ENG_OP_SHAPE_ONLY, size_prepare, size_infer, NULL},
    {"Constant", "", "constant", 0, constant_prepare, constant_infer, constant_free},
    {"ConstantOfShape", "", "constant_of_shape", 0, cos_prepare, cos_infer, constant_free},
    {"Range", "", "range", 0, range_prepare, range_infer, NULL},
    {"EyeLike", "", "eyelike", 0, eyelike_prepare, eyelike_infer, NULL},
    ENG_TENSOR_DEF("Transpose", "transpose", transpose),
    ENG_TENSOR_DEF("Concat", "concat", concat),
    ENG_TENSOR_DEF("Split", "split", split),
    ENG_TENSOR_DEF("Slice", "slice", slice),
    ENG_TENSOR_DEF("Expand", "expand", expand),
    ENG_TENSOR_DEF("Tile", "tile", tile),
    ENG_TENSOR_DEF("Pad", "pad", pad),
    ENG_TENSOR_DEF("Trilu", "trilu", trilu),
    ENG_TENSOR_DEF("DepthToSpace", "depth_space", depth_space),
    ENG_TENSOR_DEF("SpaceToDepth", "depth_space", depth_space),
    ENG_TENSOR_DEF("Gather", "gather", gather),
    ENG_TENSOR_DEF("GatherElements", "gather_elements", gather_elements),
    ENG_TENSOR_DEF("GatherND", "gather_nd", gather_nd),
    ENG_TENSOR_DEF("ScatterElements", "scatter_elements", scatter_elements),
    ENG_TENSOR_DEF("Scatter", "scatter_elements", scatter_elements),
    ENG_TENSOR_DEF("ScatterND", "scatter_nd", scatter_nd),
    ENG_TENSOR_DEF("OneHot", "onehot", onehot),
    ENG_TENSOR_DEF("Compress", "compress", compress),
    ENG_TENSOR_DEF("NonZero", "nonzero", nonzero),
    ENG_TENSOR_DEF("ReverseSequence", "reverse_sequence", reverse_sequence),
    ENG_TENSOR_DEF("Resize", "resize", resize),
    ENG_TENSOR_DEF("Upsample", "resize", resize),
    {NULL},
};
