/* tensor-move.c - "tensor" family ops that move data without index tensors: Transpose, Concat, Split, Slice,
 * Expand, Tile, Pad, Trilu, DepthToSpace/SpaceToDepth (their defs are listed in tensor.c).
 *
 * Invariants: infer resolves every attribute and value input against the actual input shape into the kernel's
 * params (krn-tensor.h): normalised axes, full-rank perms, clamped slice starts and steps, pads expanded to all
 * dims. The kernels trust these, so every bound is checked here. Old opset forms handled: Slice-1 attrs, Split-2
 * `split` attr and Split-18 `num_outputs`, Pad-2 `pads`/`value` attrs (Pad-1 `paddings`), Pad-18 `axes` input.
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

static char *shape_s(const eng_tensor *t, char *b, size_t n) { return eng_shape_str(t->dims, t->ndim, b, n); }

/* ---- Transpose ---- */

eng_status eng_tensor_transpose_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 1, 1));
    NEW_PARAMS(krn_transpose_params);
    return ENG_STATUS_OK;
}

eng_status eng_tensor_transpose_infer(eng_op_ctx *c) {
    krn_transpose_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    ENG_TRY(eng_tensor_op_check_dtype(x, "data"));
    const int64_t *perm = NULL;
    int n = eng_node_attr_ints(c->node, "perm", &perm), r = x->ndim;
    if (n >= 0 && n != r)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "attribute 'perm' has %d entries, input has rank %d", n, r);
    unsigned seen = 0;
    for (int k = 0; k < r; k++) {
        int64_t a = n >= 0 ? perm[k] : r - 1 - k;
        if (a < 0 || a >= r || (seen >> a & 1u))
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "attribute 'perm' is not a permutation of 0..%d (perm[%d] = %lld)",
                           r - 1, k, (long long)a);
        seen |= 1u << a;
        p->perm[k] = (int)a;
        c->out[0].dims[k] = x->dims[a];
    }
    c->out[0].dtype = x->dtype;
    c->out[0].ndim = r;
    return ENG_STATUS_OK;
}

/* ---- Concat ---- */

eng_status eng_tensor_concat_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 1, -1));
    NEW_PARAMS(krn_axis_params);
    return ENG_STATUS_OK;
}

eng_status eng_tensor_concat_infer(eng_op_ctx *c) {
    krn_axis_params *p = c->params;
    const eng_tensor *x0 = &c->in[0];
    ENG_TRY(eng_tensor_op_check_dtype(x0, "inputs[0]"));
    if (c->opset >= 4 && !eng_node_attr(c->node, "axis"))
        return eng_err(ENG_STATUS_INVALID_MODEL, "Concat needs attribute 'axis'");
    int r = x0->ndim, axis;
    ENG_TRY(eng_norm_axis(eng_node_attr_int(c->node, "axis", 1), r, &axis));
    int64_t total = 0;
    for (int i = 0; i < c->nin; i++) {
        const eng_tensor *x = &c->in[i];
        char a[96], b[96];
        if (x->dtype != x0->dtype || x->ndim != r)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "inputs[%d] is %s %s, inputs[0] is %s %s", i,
                           eng_dtype_name(x->dtype), shape_s(x, a, sizeof a), eng_dtype_name(x0->dtype),
                           shape_s(x0, b, sizeof b));
        for (int d = 0; d < r; d++)
            if (d != axis && x->dims[d] != x0->dims[d])
                return eng_err(ENG_STATUS_INVALID_ARGUMENT, "inputs[%d] has shape %s, inputs[0] %s: they differ off axis %d",
                               i, shape_s(x, a, sizeof a), shape_s(x0, b, sizeof b), axis);
        total += x->dims[axis];
    }
    p->axis = axis;
    eng_op_same_as_input(c, 0, 0);
    c->out[0].dims[axis] = total;
    return ENG_STATUS_OK;
}

/* ---- Split ---- */

eng_status eng_tensor_split_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 1, 2));
    NEW_PARAMS(krn_axis_params);
    return ENG_STATUS_OK;
}

eng_status eng_tensor_split_infer(eng_op_ctx *c) {
    krn_axis_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    ENG_TRY(eng_tensor_op_check_dtype(x, "input"));
    int axis;
    ENG_TRY(eng_norm_axis(eng_node_attr_int(c->node, "axis", 0), x->ndim, &axis));
    int64_t dim = x->dims[axis], sizes[ENG_OP_MAX_IO];
    int n = -1;
    if (eng_op_has_input(c, 1)) {
        ENG_TRY(eng_tensor_op_read_ints(c, 1, "split", sizes, ENG_OP_MAX_IO, &n));
        if (n == 0) n = -1; /* an empty 'split' means equal parts */
    } else if (c->opset < 13) {
        const int64_t *s = NULL;
        n = eng_node_attr_ints(c->node, "split", &s);
        if (n > ENG_OP_MAX_IO) return eng_err(ENG_STATUS_UNSUPPORTED, "Split into %d parts", n);
        if (n > 0) memcpy(sizes, s, (size_t)n * sizeof *s);
        if (n == 0) n = -1;
    }
    if (n < 0) {
        int64_t parts = c->nout;
        if (c->opset >= 18 && eng_node_attr(c->node, "num_outputs")) {
            parts = eng_node_attr_int(c->node, "num_outputs", c->nout);
            if (parts != c->nout)
                return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'num_outputs' = %lld but the node has %d outputs",
                               (long long)parts, c->nout);
            int64_t chunk = (dim + parts - 1) / parts;
            for (int j = 0; j < parts; j++) {
                int64_t lo = chunk * j, hi = lo + chunk < dim ? lo + chunk : dim;
                sizes[j] = hi > lo ? hi - lo : 0;
            }
        } else {
            if (dim % parts)
                return eng_err(ENG_STATUS_INVALID_ARGUMENT, "axis %d of size %lld does not split evenly into %lld outputs",
                               axis, (long long)dim, (long long)parts);
            for (int j = 0; j < parts; j++) sizes[j] = dim / parts;
        }
        n = (int)parts;
    }
    if (n != c->nout)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "'split' has %d entries but the node has %d outputs", n, c->nout);
    int64_t sum = 0;
    for (int j = 0; j < n; j++) {
        if (sizes[j] < 0)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "'split'[%d] = %lld is negative", j, (long long)sizes[j]);
        sum += sizes[j];
    }
    if (sum != dim)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "'split' sums to %lld, axis %d has size %lld", (long long)sum, axis,
                       (long long)dim);
    p->axis = axis;
    for (int j = 0; j < n; j++) {
        eng_op_same_as_input(c, 0, j);
        c->out[j].dims[axis] = sizes[j];
    }
    return ENG_STATUS_OK;
}

/* ---- Slice ---- */

eng_status eng_tensor_slice_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, c->opset < 10 ? 1 : 3, c->opset < 10 ? 1 : 5));
    NEW_PARAMS(krn_slice_params);
    return ENG_STATUS_OK;
}

static int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

eng_status eng_tensor_slice_infer(eng_op_ctx *c) {
    krn_slice_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    ENG_TRY(eng_tensor_op_check_dtype(x, "data"));
    int r = x->ndim, ns, ne, na = -1, nst = -1;
    int64_t starts[ENG_MAX_DIMS], ends[ENG_MAX_DIMS], axes[ENG_MAX_DIMS], steps[ENG_MAX_DIMS];
    if (c->opset < 10) {
        const int64_t *s = NULL, *e = NULL, *a = NULL;
        ns = eng_node_attr_ints(c->node, "starts", &s);
        ne = eng_node_attr_ints(c->node, "ends", &e);
        na = eng_node_attr_ints(c->node, "axes", &a);
        if (ns < 0 || ne < 0) return eng_err(ENG_STATUS_INVALID_MODEL, "Slice-1 needs attributes 'starts' and 'ends'");
        if (ns > r || ne > r || na > r)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "Slice attributes have more entries than the rank %d", r);
        memcpy(starts, s, (size_t)ns * sizeof *s);
        memcpy(ends, e, (size_t)ne * sizeof *e);
        if (na >= 0) memcpy(axes, a, (size_t)na * sizeof *a);
    } else {
        ENG_TRY(eng_tensor_op_read_ints(c, 1, "starts", starts, ENG_MAX_DIMS, &ns));
        ENG_TRY(eng_tensor_op_read_ints(c, 2, "ends", ends, ENG_MAX_DIMS, &ne));
        if (eng_op_has_input(c, 3)) ENG_TRY(eng_tensor_op_read_ints(c, 3, "axes", axes, ENG_MAX_DIMS, &na));
        if (eng_op_has_input(c, 4)) ENG_TRY(eng_tensor_op_read_ints(c, 4, "steps", steps, ENG_MAX_DIMS, &nst));
    }
    if (ne != ns || (na >= 0 && na != ns) || (nst >= 0 && nst != ns))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "starts/ends/axes/steps have %d/%d/%d/%d entries; they must agree",
                       ns, ne, na, nst);
    if (ns > r) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%d slice entries for rank %d", ns, r);
    unsigned done = 0;
    for (int d = 0; d < r; d++) {
        p->starts[d] = 0;
        p->steps[d] = 1;
        c->out[0].dims[d] = x->dims[d];
    }
    for (int k = 0; k < ns; k++) {
        int a = k;
        if (na >= 0) ENG_TRY(eng_norm_axis(axes[k], r, &a));
        if (done >> a & 1u) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "'axes' repeats axis %d", a);
        done |= 1u << a;
        int64_t st = nst >= 0 ? steps[k] : 1, dim = x->dims[a];
        if (st == 0) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "'steps'[%d] is 0", k);
        int64_t s = clamp64(starts[k], -dim - 1, dim + 1), e = clamp64(ends[k], -dim - 1, dim + 1), cnt;
        if (s < 0) s += dim;
        if (e < 0) e += dim;
        if (st > 0) {
            s = clamp64(s, 0, dim);
            e = clamp64(e, 0, dim);
            cnt = e > s ? (e - s + st - 1) / st : 0;
        } else {
            s = clamp64(s, 0, dim - 1);
            e = clamp64(e, -1, dim - 1);
            cnt = s > e ? (s - e + (-st) - 1) / (-st) : 0;
        }
        if (cnt == 0) s = 0;
        p->starts[a] = s;
        p->steps[a] = st;
        c->out[0].dims[a] = cnt;
    }
    c->out[0].dtype = x->dtype;
    c->out[0].ndim = r;
    return ENG_STATUS_OK;
}

/* ---- Expand / Tile ---- */

eng_status eng_tensor_expand_prepare(eng_op_ctx *c) { return eng_op_check_arity(c, 2, 2); }

eng_status eng_tensor_expand_infer(eng_op_ctx *c) {
    const eng_tensor *x = &c->in[0];
    ENG_TRY(eng_tensor_op_check_dtype(x, "input"));
    eng_tensor s = {.dtype = x->dtype};
    int n;
    ENG_TRY(eng_tensor_op_read_ints(c, 1, "shape", s.dims, ENG_MAX_DIMS, &n));
    s.ndim = n;
    for (int i = 0; i < n; i++)
        if (s.dims[i] < 0)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'shape'[%d] = %lld is negative", i, (long long)s.dims[i]);
    const eng_tensor *ts[2] = {x, &s};
    ENG_TRY(eng_broadcast_shapes(ts, 2, &c->out[0]));
    c->out[0].dtype = x->dtype;
    size_t nb;
    return eng_tensor_nbytes_checked(&c->out[0], "output", &nb);
}

eng_status eng_tensor_tile_prepare(eng_op_ctx *c) {
    if (c->opset < 6) return eng_err(ENG_STATUS_UNSUPPORTED, "Tile-1 (tiles/axis inputs)");
    return eng_op_check_arity(c, 2, 2);
}

eng_status eng_tensor_tile_infer(eng_op_ctx *c) {
    const eng_tensor *x = &c->in[0];
    ENG_TRY(eng_tensor_op_check_dtype(x, "input"));
    int64_t rep[ENG_MAX_DIMS];
    int n;
    ENG_TRY(eng_tensor_op_read_ints(c, 1, "repeats", rep, ENG_MAX_DIMS, &n));
    if (n != x->ndim)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'repeats' has %d entries, input has rank %d", n, x->ndim);
    eng_op_same_as_input(c, 0, 0);
    for (int i = 0; i < n; i++) {
        if (rep[i] < 0)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'repeats'[%d] = %lld is negative", i, (long long)rep[i]);
        if (x->dims[i] && rep[i] > INT64_MAX / x->dims[i])
            return eng_err(ENG_STATUS_OUT_OF_MEMORY, "Tile output dim %d overflows", i);
        c->out[0].dims[i] = x->dims[i] * rep[i];
    }
    size_t nb;
    return eng_tensor_nbytes_checked(&c->out[0], "output", &nb);
}

/* ---- Pad ---- */

eng_status eng_tensor_pad_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 1, c->opset < 11 ? 1 : 4));
    NEW_PARAMS(krn_pad_params);
    const char *mode = eng_node_attr_str(c->node, "mode", "constant");
    if (strcmp(mode, "constant") == 0) p->mode = KRN_PAD_CONSTANT;
    else if (strcmp(mode, "reflect") == 0) p->mode = KRN_PAD_REFLECT;
    else if (strcmp(mode, "edge") == 0) p->mode = KRN_PAD_EDGE;
    else if (strcmp(mode, "wrap") == 0) p->mode = KRN_PAD_WRAP;
    else return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'mode' = '%s' (expected constant, reflect, edge, wrap)", mode);
    p->value = c->opset < 11 ? eng_node_attr_float(c->node, "value", 0.0f) : 0.0;
    return ENG_STATUS_OK;
}

eng_status eng_tensor_pad_infer(eng_op_ctx *c) {
    krn_pad_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    ENG_TRY(eng_tensor_op_check_dtype(x, "data"));
    int r = x->ndim, np, na = -1;
    int64_t pads[4 * ENG_MAX_DIMS], axes[2 * ENG_MAX_DIMS];
    if (c->opset < 11) {
        const int64_t *a = NULL;
        np = eng_node_attr_ints(c->node, c->opset < 2 ? "paddings" : "pads", &a);
        if (np < 0) return eng_err(ENG_STATUS_INVALID_MODEL, "Pad needs attribute 'pads'");
        if (np > 2 * ENG_MAX_DIMS) return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'pads' has %d entries", np);
        memcpy(pads, a, (size_t)np * sizeof *a);
    } else {
        ENG_TRY(eng_tensor_op_read_ints(c, 1, "pads", pads, 4 * ENG_MAX_DIMS, &np));
        if (eng_op_has_input(c, 3)) ENG_TRY(eng_tensor_op_read_ints(c, 3, "axes", axes, 2 * ENG_MAX_DIMS, &na));
        if (eng_op_has_input(c, 2) && c->in[2].dtype != x->dtype)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'constant_value' is %s, data is %s",
                           eng_dtype_name(c->in[2].dtype), eng_dtype_name(x->dtype));
    }
    int nax = na >= 0 ? na : r;
    if (np != 2 * nax)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "'pads' has %d entries, expected %d (2 x %s %d)", np, 2 * nax,
                       na >= 0 ? "axes" : "rank", nax);
    for (int i = 0; i < 2 * r; i++) p->pads[i] = 0;
    for (int k = 0; k < nax; k++) {
        int a = k;
        if (na >= 0) ENG_TRY(eng_norm_axis(axes[k], r, &a));
        p->pads[a] = pads[k];
        p->pads[r + a] = pads[nax + k];
    }
    eng_op_same_as_input(c, 0, 0);
    for (int d = 0; d < r; d++) {
        int64_t od = x->dims[d] + p->pads[d] + p->pads[r + d];
        if (od < 0)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "pads %lld,%lld make axis %d (size %lld) negative",
                           (long long)p->pads[d], (long long)p->pads[r + d], d, (long long)x->dims[d]);
        if (p->mode != KRN_PAD_CONSTANT && x->dims[d] == 0 && od > 0)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "cannot pad empty axis %d in a non-constant mode", d);
        c->out[0].dims[d] = od;
    }
    size_t nb;
    return eng_tensor_nbytes_checked(&c->out[0], "output", &nb);
}

/* ---- Trilu ---- */

eng_status eng_tensor_trilu_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 1, 2));
    NEW_PARAMS(krn_trilu_params);
    p->upper = eng_node_attr_int(c->node, "upper", 1) != 0;
    return ENG_STATUS_OK;
}

eng_status eng_tensor_trilu_infer(eng_op_ctx *c) {
    const eng_tensor *x = &c->in[0];
    ENG_TRY(eng_tensor_op_check_dtype(x, "input"));
    if (x->ndim < 2) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'input' must have rank >= 2, got %d", x->ndim);
    if (eng_op_has_input(c, 1) && eng_tensor_numel(&c->in[1]) != 1)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'k' must be a scalar");
    eng_op_same_as_input(c, 0, 0);
    return ENG_STATUS_OK;
}

/* ---- DepthToSpace / SpaceToDepth ---- */

eng_status eng_tensor_depth_space_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 1, 1));
    NEW_PARAMS(krn_depth_space_params);
    p->blocksize = eng_node_attr_int(c->node, "blocksize", 0);
    if (p->blocksize <= 0)
        return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'blocksize' must be positive, got %lld",
                       (long long)p->blocksize);
    if (strcmp(c->node->op_type, "SpaceToDepth") == 0) p->mode = 2;
    else {
        const char *m = eng_node_attr_str(c->node, "mode", "DCR");
        if (strcmp(m, "DCR") == 0) p->mode = 0;
        else if (strcmp(m, "CRD") == 0) p->mode = 1;
        else return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'mode' = '%s' (expected DCR or CRD)", m);
    }
    return ENG_STATUS_OK;
}

eng_status eng_tensor_depth_space_infer(eng_op_ctx *c) {
    const krn_depth_space_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    ENG_TRY(eng_tensor_op_check_dtype(x, "input"));
    char a[96];
    if (x->ndim != 4) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input must be 4-D (NCHW), got %s", shape_s(x, a, sizeof a));
    int64_t b = p->blocksize;
    eng_op_same_as_input(c, 0, 0);
    if (p->mode == 2) {
        if (x->dims[2] % b || x->dims[3] % b)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input %s: H and W must be multiples of blocksize %lld",
                           shape_s(x, a, sizeof a), (long long)b);
        c->out[0].dims[1] = x->dims[1] * b * b;
        c->out[0].dims[2] = x->dims[2] / b;
        c->out[0].dims[3] = x->dims[3] / b;
    } else {
        if (x->dims[1] % (b * b))
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input %s: C must be a multiple of blocksize^2 = %lld",
                           shape_s(x, a, sizeof a), (long long)(b * b));
        c->out[0].dims[1] = x->dims[1] / (b * b);
        c->out[0].dims[2] = x->dims[2] * b;
        c->out[0].dims[3] = x->dims[3] * b;
    }
    return ENG_STATUS_OK;
}
