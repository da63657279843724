/* tensor-index.c - "tensor" family ops driven by index or mask tensors: Gather, GatherElements, GatherND,
 * ScatterElements / Scatter (opset 9-10 name), ScatterND, OneHot, Compress, NonZero, ReverseSequence (defs in
 * tensor.c).
 *
 * Invariants: infer checks ranks and index dtypes and resolves axes into params; the VALUES of index tensors
 * are range-checked by the kernels (they are run-time data), so no out-of-range index ever reads or writes out
 * of bounds. Output shapes that depend on values (OneHot depth, Compress condition, NonZero count) are read from
 * data here, NEEDS_DATA when not yet known.
 */
#include <stdlib.h>
#include <string.h>

#include "../../kernels/krn-tensor.h"
#include "op.h"

eng_status eng_tensor_op_read_ints(const eng_op_ctx *c, int i, const char *what, int64_t *out, int max, int *n);
eng_status eng_tensor_op_check_dtype(const eng_tensor *t, const char *what);
void *eng_tensor_op_params(eng_op_ctx *c, size_t size);

#define NEW_PARAMS(T)                                                                                              \
    T *p = eng_tensor_op_params(c, sizeof(T));                                                                     \
    if (!p) return ENG_STATUS_OUT_OF_MEMORY

static eng_status check_index_dtype(const eng_tensor *t, const char *what) {
    if (t->dtype != ENG_DTYPE_I64 && t->dtype != ENG_DTYPE_I32)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input '%s' must be int32 or int64, got %s", what,
                       eng_dtype_name(t->dtype));
    return ENG_STATUS_OK;
}

static eng_status set_rank(eng_op_ctx *c, int r) {
    if (r > ENG_MAX_DIMS) return eng_err(ENG_STATUS_UNSUPPORTED, "output rank %d exceeds %d", r, ENG_MAX_DIMS);
    c->out[0].ndim = r;
    return ENG_STATUS_OK;
}

/* ---- Gather family ---- */

eng_status eng_tensor_gather_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 2, 2));
    NEW_PARAMS(krn_gather_params);
    return ENG_STATUS_OK;
}

eng_status eng_tensor_gather_infer(eng_op_ctx *c) {
    krn_gather_params *p = c->params;
    const eng_tensor *x = &c->in[0], *ind = &c->in[1];
    ENG_TRY(eng_tensor_op_check_dtype(x, "data"));
    ENG_TRY(check_index_dtype(ind, "indices"));
    if (x->ndim < 1) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'data' must have rank >= 1");
    int axis;
    ENG_TRY(eng_norm_axis(eng_node_attr_int(c->node, "axis", 0), x->ndim, &axis));
    p->axis = axis;
    eng_tensor *o = &c->out[0];
    ENG_TRY(set_rank(c, x->ndim - 1 + ind->ndim));
    int k = 0;
    for (int i = 0; i < axis; i++) o->dims[k++] = x->dims[i];
    for (int i = 0; i < ind->ndim; i++) o->dims[k++] = ind->dims[i];
    for (int i = axis + 1; i < x->ndim; i++) o->dims[k++] = x->dims[i];
    o->dtype = x->dtype;
    if (x->dims[axis] == 0 && eng_tensor_numel(ind) > 0)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "gathering from empty axis %d", axis);
    return ENG_STATUS_OK;
}

eng_status eng_tensor_gather_elements_prepare(eng_op_ctx *c) { return eng_tensor_gather_prepare(c); }

eng_status eng_tensor_gather_elements_infer(eng_op_ctx *c) {
    krn_gather_params *p = c->params;
    const eng_tensor *x = &c->in[0], *ind = &c->in[1];
    ENG_TRY(eng_tensor_op_check_dtype(x, "data"));
    ENG_TRY(check_index_dtype(ind, "indices"));
    if (x->ndim < 1 || ind->ndim != x->ndim)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'indices' has rank %d, 'data' rank %d: must be equal and >= 1",
                       ind->ndim, x->ndim);
    int axis;
    ENG_TRY(eng_norm_axis(eng_node_attr_int(c->node, "axis", 0), x->ndim, &axis));
    for (int d = 0; d < x->ndim; d++)
        if (d != axis && ind->dims[d] > x->dims[d])
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'indices' dim %d (%lld) exceeds data's (%lld)", d,
                           (long long)ind->dims[d], (long long)x->dims[d]);
    p->axis = axis;
    eng_op_same_as_input(c, 1, 0);
    c->out[0].dtype = x->dtype;
    return ENG_STATUS_OK;
}

eng_status eng_tensor_gather_nd_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 2, 2));
    NEW_PARAMS(krn_gather_params);
    p->batch_dims = (int)eng_node_attr_int(c->node, "batch_dims", 0);
    return ENG_STATUS_OK;
}

/* Common GatherND/ScatterND index-shape checks; returns k (index tuple length) in *kk. */
static eng_status nd_check(const eng_tensor *x, const eng_tensor *ind, int b, int *kk) {
    ENG_TRY(check_index_dtype(ind, "indices"));
    if (ind->dtype != ENG_DTYPE_I64)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'indices' must be int64, got %s", eng_dtype_name(ind->dtype));
    int q = ind->ndim, r = x->ndim;
    if (q < 1 || r < 1) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "'data' and 'indices' must have rank >= 1");
    if (b < 0 || b >= q || b >= r)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "batch_dims %d must be < rank of indices (%d) and data (%d)", b, q, r);
    int64_t k = ind->dims[q - 1];
    if (k < 1 || k > r - b)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "indices' last dim %lld must be in [1, %d]", (long long)k, r - b);
    for (int i = 0; i < b; i++)
        if (ind->dims[i] != x->dims[i])
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "batch dim %d: indices %lld vs data %lld", i,
                           (long long)ind->dims[i], (long long)x->dims[i]);
    *kk = (int)k;
    return ENG_STATUS_OK;
}

eng_status eng_tensor_gather_nd_infer(eng_op_ctx *c) {
    const krn_gather_params *p = c->params;
    const eng_tensor *x = &c->in[0], *ind = &c->in[1];
    ENG_TRY(eng_tensor_op_check_dtype(x, "data"));
    int k, q = ind->ndim, b = p->batch_dims;
    ENG_TRY(nd_check(x, ind, b, &k));
    eng_tensor *o = &c->out[0];
    ENG_TRY(set_rank(c, q - 1 + x->ndim - b - k));
    int j = 0;
    for (int i = 0; i < q - 1; i++) o->dims[j++] = ind->dims[i];
    for (int i = b + k; i < x->ndim; i++) o->dims[j++] = x->dims[i];
    o->dtype = x->dtype;
    return ENG_STATUS_OK;
}

/* ---- Scatter family ---- */

static eng_status scatter_common_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 3, 3));
    NEW_PARAMS(krn_scatter_params);
    const char *r = eng_node_attr_str(c->node, "reduction", "none");
    if (strcmp(r, "none") == 0) p->reduction = KRN_SCATTER_NONE;
    else if (strcmp(r, "add") == 0) p->reduction = KRN_SCATTER_ADD;
    else if (strcmp(r, "mul") == 0) p->reduction = KRN_SCATTER_MUL;
    else if (strcmp(r, "max") == 0) p->reduction = KRN_SCATTER_MAX;
    else if (strcmp(r, "min") == 0) p->reduction = KRN_SCATTER_MIN;
    else return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'reduction' = '%s' (expected none/add/mul/max/min)", r);
    return ENG_STATUS_OK;
}

eng_status eng_tensor_scatter_elements_prepare(eng_op_ctx *c) { return scatter_common_prepare(c); }

eng_status eng_tensor_scatter_elements_infer(eng_op_ctx *c) {
    krn_scatter_params *p = c->params;
    const eng_tensor *x = &c->in[0], *ind = &c->in[1], *u = &c->in[2];
    ENG_TRY(eng_tensor_op_check_dtype(x, "data"));
    ENG_TRY(check_index_dtype(ind, "indices"));
    if (!eng_shape_equal(ind, u) || u->dtype != x->dtype || ind->ndim != x->ndim || x->ndim < 1) {
        char a[96], b[96];
        return eng_err(ENG_STATUS_INVALID_ARGUMENT,
                       "input 'updates' (%s %s) must match 'indices' shape %s, the rank and dtype of 'data' (%s)",
                       eng_dtype_name(u->dtype), eng_shape_str(u->dims, u->ndim, a, sizeof a),
                       eng_shape_str(ind->dims, ind->ndim, b, sizeof b), eng_dtype_name(x->dtype));
    }
    int axis;
    ENG_TRY(eng_norm_axis(eng_node_attr_int(c->node, "axis", 0), x->ndim, &axis));
    for (int d = 0; d < x->ndim; d++)
        if (d != axis && ind->dims[d] > x->dims[d])
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'indices' dim %d (%lld) exceeds data's (%lld)", d,
                           (long long)ind->dims[d], (long long)x->dims[d]);
    p->axis = axis;
    eng_op_same_as_input(c, 0, 0);
    return ENG_STATUS_OK;
}

eng_status eng_tensor_scatter_nd_prepare(eng_op_ctx *c) { return scatter_common_prepare(c); }

eng_status eng_tensor_scatter_nd_infer(eng_op_ctx *c) {
    const eng_tensor *x = &c->in[0], *ind = &c->in[1], *u = &c->in[2];
    ENG_TRY(eng_tensor_op_check_dtype(x, "data"));
    int k, q = ind->ndim;
    ENG_TRY(nd_check(x, ind, 0, &k));
    /* updates shape = indices.shape[:-1] + data.shape[k:] */
    int ur = q - 1 + x->ndim - k, ok = u->ndim == ur && u->dtype == x->dtype;
    for (int i = 0; ok && i < q - 1; i++) ok = u->dims[i] == ind->dims[i];
    for (int i = k; ok && i < x->ndim; i++) ok = u->dims[q - 1 + i - k] == x->dims[i];
    if (!ok) {
        char a[96];
        return eng_err(ENG_STATUS_INVALID_ARGUMENT,
                       "input 'updates' (%s %s) must be indices.shape[:-1] + data.shape[%d:] of dtype %s",
                       eng_dtype_name(u->dtype), eng_shape_str(u->dims, u->ndim, a, sizeof a), k,
                       eng_dtype_name(x->dtype));
    }
    eng_op_same_as_input(c, 0, 0);
    return ENG_STATUS_OK;
}

/* ---- OneHot ---- */

eng_status eng_tensor_onehot_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 3, 3));
    NEW_PARAMS(krn_axis_params);
    return ENG_STATUS_OK;
}

eng_status eng_tensor_onehot_infer(eng_op_ctx *c) {
    krn_axis_params *p = c->params;
    const eng_tensor *ind = &c->in[0], *depth = &c->in[1], *vals = &c->in[2];
    if (!eng_dtype_size(ind->dtype) || !eng_dtype_size(vals->dtype))
        return eng_err(ENG_STATUS_UNSUPPORTED, "OneHot of %s indices / %s values", eng_dtype_name(ind->dtype),
                       eng_dtype_name(vals->dtype));
    if (eng_tensor_numel(vals) != 2)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'values' must hold 2 elements [off, on], got %lld",
                       (long long)eng_tensor_numel(vals));
    if (eng_tensor_numel(depth) != 1) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'depth' must be a scalar");
    if (!depth->data) return ENG_STATUS_NEEDS_DATA;
    int64_t d = eng_dtype_is_float(depth->dtype) ? (int64_t)eng_tensor_get_f64(depth, 0) : eng_tensor_get_i64(depth, 0);
    if (d < 1) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'depth' = %lld must be positive", (long long)d);
    int r = ind->ndim + 1, axis;
    ENG_TRY(eng_norm_axis(eng_node_attr_int(c->node, "axis", -1), r, &axis));
    ENG_TRY(set_rank(c, r));
    p->axis = axis;
    eng_tensor *o = &c->out[0];
    for (int i = 0, j = 0; i < r; i++) o->dims[i] = i == axis ? d : ind->dims[j++];
    o->dtype = vals->dtype;
    size_t nb;
    return eng_tensor_nbytes_checked(o, "output", &nb);
}

/* ---- Compress ---- */

eng_status eng_tensor_compress_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 2, 2));
    NEW_PARAMS(krn_axis_params);
    return ENG_STATUS_OK;
}

eng_status eng_tensor_compress_infer(eng_op_ctx *c) {
    krn_axis_params *p = c->params;
    const eng_tensor *x = &c->in[0], *cond = &c->in[1];
    ENG_TRY(eng_tensor_op_check_dtype(x, "input"));
    if (cond->ndim != 1)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'condition' must be 1-D, got rank %d", cond->ndim);
    int64_t n;
    eng_tensor *o = &c->out[0];
    if (eng_node_attr(c->node, "axis")) {
        int axis;
        ENG_TRY(eng_norm_axis(eng_node_attr_int(c->node, "axis", 0), x->ndim, &axis));
        p->axis = axis;
        n = x->dims[axis];
        eng_op_same_as_input(c, 0, 0);
    } else {
        p->axis = -1;
        n = eng_tensor_numel(x);
        o->dtype = x->dtype;
        o->ndim = 1;
    }
    if (eng_tensor_numel(cond) > n)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'condition' has %lld entries, more than the %lld selectable",
                       (long long)eng_tensor_numel(cond), (long long)n);
    if (!cond->data && eng_tensor_numel(cond) > 0) return ENG_STATUS_NEEDS_DATA;
    int64_t cnt = 0;
    for (int64_t j = 0; j < eng_tensor_numel(cond); j++) cnt += eng_tensor_get_i64(cond, j) != 0;
    o->dims[p->axis < 0 ? 0 : p->axis] = cnt;
    return ENG_STATUS_OK;
}

/* ---- NonZero ---- */

eng_status eng_tensor_nonzero_prepare(eng_op_ctx *c) { return eng_op_check_arity(c, 1, 1); }

eng_status eng_tensor_nonzero_infer(eng_op_ctx *c) {
    const eng_tensor *x = &c->in[0];
    ENG_TRY(eng_tensor_op_check_dtype(x, "X"));
    int64_t n = eng_tensor_numel(x), cnt = 0;
    if (!x->data && n > 0) return ENG_STATUS_NEEDS_DATA;
    size_t es = eng_dtype_size(x->dtype);
    for (int64_t i = 0; i < n; i++) {
        if (eng_dtype_is_float(x->dtype)) cnt += eng_tensor_get_f64(x, i) != 0.0;
        else {
            const unsigned char *b = (const unsigned char *)x->data + i * es;
            int nz = 0;
            for (size_t k = 0; k < es; k++) nz |= b[k] != 0;
            cnt += nz;
        }
    }
    c->out[0].dtype = ENG_DTYPE_I64;
    c->out[0].ndim = 2;
    c->out[0].dims[0] = x->ndim;
    c->out[0].dims[1] = cnt;
    return ENG_STATUS_OK;
}

/* ---- ReverseSequence ---- */

eng_status eng_tensor_reverse_sequence_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 2, 2));
    NEW_PARAMS(krn_revseq_params);
    p->batch_axis = (int)eng_node_attr_int(c->node, "batch_axis", 1);
    p->time_axis = (int)eng_node_attr_int(c->node, "time_axis", 0);
    if (!((p->batch_axis == 0 && p->time_axis == 1) || (p->batch_axis == 1 && p->time_axis == 0)))
        return eng_err(ENG_STATUS_INVALID_MODEL, "batch_axis %d / time_axis %d must be 0 and 1 in some order",
                       p->batch_axis, p->time_axis);
    return ENG_STATUS_OK;
}

eng_status eng_tensor_reverse_sequence_infer(eng_op_ctx *c) {
    const krn_revseq_params *p = c->params;
    const eng_tensor *x = &c->in[0], *lens = &c->in[1];
    ENG_TRY(eng_tensor_op_check_dtype(x, "input"));
    ENG_TRY(check_index_dtype(lens, "sequence_lens"));
    if (x->ndim < 2) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'input' must have rank >= 2");
    if (lens->ndim != 1 || lens->dims[0] != x->dims[p->batch_axis])
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'sequence_lens' must be 1-D of the batch size %lld",
                       (long long)x->dims[p->batch_axis]);
    eng_op_same_as_input(c, 0, 0);
    return ENG_STATUS_OK;
}
