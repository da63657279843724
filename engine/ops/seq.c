/* seq.c - the sequence ops: SequenceEmpty, SequenceConstruct, SequenceInsert, SequenceAt, SequenceErase,
 * SequenceLength, ConcatFromSequence, SplitToSequence (opset 11+), the ones exporters pair with Loop.
 *
 * Sequences are one-block values (engine/ir/seq.h). What these ops produce is known only when they run, so they
 * make their plan dynamic (infer: NEEDS_DATA) and allocate their outputs (ENG_OP_ALLOCATES). They move bytes on the
 * host only and are their own kernels (eng_op_def.engine_kernel): a device plan runs them on the CPU.
 */
#include <stdlib.h>
#include <string.h>

#include "../../kernels/kernel.h"
#include "../ir/seq.h"
#include "op.h"

enum { SEQ_EMPTY, SEQ_CONSTRUCT, SEQ_INSERT, SEQ_AT, SEQ_ERASE, SEQ_LENGTH, SEQ_CONCAT, SEQ_SPLIT };

typedef struct seq_params {
    int op;
    eng_dtype dtype;  /* SequenceEmpty */
    int64_t axis;     /* ConcatFromSequence, SplitToSequence */
    int new_axis;     /* ConcatFromSequence */
    int keepdims;     /* SplitToSequence */
} seq_params;

static const struct { const char *name; int op; } seq_names[] = {
    {"SequenceEmpty", SEQ_EMPTY},   {"SequenceConstruct", SEQ_CONSTRUCT}, {"SequenceInsert", SEQ_INSERT},
    {"SequenceAt", SEQ_AT},         {"SequenceErase", SEQ_ERASE},         {"SequenceLength", SEQ_LENGTH},
    {"ConcatFromSequence", SEQ_CONCAT}, {"SplitToSequence", SEQ_SPLIT},
};

static eng_status seq_prepare(eng_op_ctx *c) {
    seq_params *p = calloc(1, sizeof *p);
    if (!p) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    c->params = p;
    for (size_t i = 0; i < sizeof seq_names / sizeof seq_names[0]; i++)
        if (strcmp(c->node->op_type, seq_names[i].name) == 0) p->op = seq_names[i].op;
    static const int lo[] = {0, 1, 2, 2, 1, 1, 1, 1}, hi[] = {0, -1, 3, 2, 2, 1, 1, 2};
    if (p->op == SEQ_EMPTY) {
        if (c->nin != 0) return eng_err(ENG_STATUS_INVALID_MODEL, "expected no inputs, got %d", c->nin);
    } else {
        ENG_TRY(eng_op_check_arity(c, lo[p->op], hi[p->op]));
    }
    p->dtype = (eng_dtype)eng_node_attr_int(c->node, "dtype", ENG_DTYPE_F32);
    if (p->op == SEQ_EMPTY && eng_dtype_size(p->dtype) == 0)
        return eng_err(ENG_STATUS_UNSUPPORTED, "attribute 'dtype' = %s is not supported", eng_dtype_name(p->dtype));
    p->axis = eng_node_attr_int(c->node, "axis", 0);
    p->new_axis = eng_node_attr_int(c->node, "new_axis", 0) != 0;
    p->keepdims = eng_node_attr_int(c->node, "keepdims", 1) != 0;
    if (p->op == SEQ_CONCAT && !eng_node_attr(c->node, "axis"))
        return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'axis' is required");
    return ENG_STATUS_OK;
}

static eng_status seq_infer(eng_op_ctx *c) {
    (void)c;
    return ENG_STATUS_NEEDS_DATA;
}

static eng_status seq_input(const krn_call *c, int i, const eng_seq **out) {
    if (!(*out = eng_seq_get(&c->in[i])))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input %d: expected a sequence, got %s", i,
                       eng_dtype_name(c->in[i].dtype));
    return ENG_STATUS_OK;
}

/* Position input i (a scalar integer) normalised into [0, n] (insert: n allowed) or [0, n). */
static eng_status seq_position(const krn_call *c, int i, int64_t n, int insert, int64_t dflt, int64_t *out) {
    if (i >= c->nin || c->in[i].dtype == ENG_DTYPE_UNDEFINED) {
        *out = dflt;
        return ENG_STATUS_OK;
    }
    const eng_tensor *t = &c->in[i];
    if (!eng_dtype_is_int(t->dtype) || eng_tensor_numel(t) != 1)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'position': expected one integer, got %s",
                       eng_dtype_name(t->dtype));
    int64_t pos = eng_tensor_get_i64(t, 0), hi = insert ? n : n - 1;
    if (pos < -n || pos > hi)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "position %lld is out of range for a sequence of %lld elements",
                       (long long)pos, (long long)n);
    *out = pos < 0 ? pos + n : pos;
    return ENG_STATUS_OK;
}

static eng_status seq_alloc(eng_tensor *o, const eng_tensor *like) {
    *o = *like;
    o->data = NULL;
    return eng_tensor_alloc_data(o, "output");
}

static eng_status seq_concat(const seq_params *p, const eng_seq *s, eng_tensor *o) {
    if (s->n == 0) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "cannot concatenate an empty sequence");
    const eng_tensor *e0 = &s->items[0];
    int rank = e0->ndim + p->new_axis, axis;
    ENG_TRY(eng_norm_axis(p->axis, rank, &axis));
    eng_tensor out = {.dtype = e0->dtype, .ndim = rank};
    char a[160], b[160];
    for (int64_t i = 0; i < s->n; i++) {
        const eng_tensor *e = &s->items[i];
        int bad = e->ndim != e0->ndim;
        for (int d = 0; d < e0->ndim && !bad; d++)
            if (p->new_axis || d != axis) bad = e->dims[d] != e0->dims[d];
        if (bad)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "sequence element %lld has shape %s; element 0 has %s (they must "
                           "agree except along axis %d)", (long long)i, eng_shape_str(e->dims, e->ndim, a, sizeof a),
                           eng_shape_str(e0->dims, e0->ndim, b, sizeof b), axis);
    }
    if (p->new_axis) {
        for (int d = 0, k = 0; d < rank; d++) out.dims[d] = d == axis ? s->n : e0->dims[k++];
    } else {
        memcpy(out.dims, e0->dims, sizeof out.dims);
        out.dims[axis] = 0;
        for (int64_t i = 0; i < s->n; i++) out.dims[axis] += s->items[i].dims[axis];
    }
    ENG_TRY(seq_alloc(o, &out));
    size_t es = eng_dtype_size(out.dtype);
    int64_t outer = eng_shape_numel(out.dims, axis);
    size_t row = (size_t)eng_shape_numel(out.dims + axis, rank - axis) * es, off = 0;
    for (int64_t i = 0; i < s->n; i++) {
        const eng_tensor *e = &s->items[i];
        size_t chunk = p->new_axis ? eng_tensor_nbytes(e) / (size_t)(outer ? outer : 1)
                                   : (size_t)eng_shape_numel(e->dims + axis, e->ndim - axis) * es;
        for (int64_t r = 0; r < outer; r++)
            memcpy((char *)o->data + (size_t)r * row + off, (const char *)e->data + (size_t)r * chunk, chunk);
        off += chunk;
    }
    return ENG_STATUS_OK;
}

static eng_status seq_split(const seq_params *p, const krn_call *c, eng_tensor *o) {
    const eng_tensor *x = &c->in[0];
    int axis;
    ENG_TRY(eng_norm_axis(p->axis, x->ndim, &axis));
    if (x->ndim == 0) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input: cannot split a scalar");
    int64_t len = x->dims[axis], n = 0;
    int64_t *sizes = NULL;
    const eng_tensor *sp = c->nin > 1 && c->in[1].dtype != ENG_DTYPE_UNDEFINED ? &c->in[1] : NULL;
    int squeeze = 0;
    if (!sp) {
        n = len;
        squeeze = !p->keepdims;
    } else if (!eng_dtype_is_int(sp->dtype) || sp->ndim > 1) {
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'split': expected an integer scalar or 1-D tensor, got %s",
                       eng_dtype_name(sp->dtype));
    } else if (sp->ndim == 0) {
        int64_t k = eng_tensor_get_i64(sp, 0);
        if (k <= 0) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'split' = %lld; expected > 0", (long long)k);
        n = len ? (len + k - 1) / k : 0;
    } else {
        n = eng_tensor_numel(sp);
    }
    if (n > ENG_SEQ_MAX_ITEMS) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%lld pieces exceed the limit", (long long)n);
    sizes = malloc(((size_t)n + 1) * sizeof *sizes);
    eng_tensor *items = malloc(((size_t)n + 1) * sizeof *items);
    char **bufs = calloc((size_t)n + 1, sizeof *bufs);
    eng_status st = ENG_STATUS_OK;
    if (!sizes || !items || !bufs) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    int64_t total = 0;
    for (int64_t i = 0; i < n && st == ENG_STATUS_OK; i++) {
        if (!sp) sizes[i] = 1;
        else if (sp->ndim == 0) {
            int64_t k = eng_tensor_get_i64(sp, 0);
            sizes[i] = total + k > len ? len - total : k;
        } else sizes[i] = eng_tensor_get_i64(sp, i);
        if (sizes[i] < 0) st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'split'[%lld] = %lld is negative", (long long)i,
                                       (long long)sizes[i]);
        total += sizes[i];
    }
    if (st == ENG_STATUS_OK && total != len)
        st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'split' sums to %lld; axis %d has %lld", (long long)total, axis,
                     (long long)len);
    size_t es = eng_dtype_size(x->dtype);
    int64_t outer = eng_shape_numel(x->dims, axis);
    size_t inner = (size_t)eng_shape_numel(x->dims + axis + 1, x->ndim - axis - 1) * es;
    int64_t at = 0;
    for (int64_t i = 0; i < n && st == ENG_STATUS_OK; i++) {
        eng_tensor *it = &items[i];
        *it = *x;
        it->dims[axis] = sizes[i];
        size_t chunk = (size_t)sizes[i] * inner;
        if (!(bufs[i] = eng_alloc((size_t)outer * chunk + 1))) {
            st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
            break;
        }
        for (int64_t r = 0; r < outer; r++)
            memcpy(bufs[i] + (size_t)r * chunk, (const char *)x->data + ((size_t)r * (size_t)len + (size_t)at) * inner, chunk);
        it->data = bufs[i];
        if (squeeze) {
            for (int d = axis; d < it->ndim - 1; d++) it->dims[d] = it->dims[d + 1];
            it->ndim--;
        }
        at += sizes[i];
    }
    if (st == ENG_STATUS_OK) st = eng_seq_make(x->dtype, items, n, o);
    for (int64_t i = 0; bufs && i < n; i++) eng_free(bufs[i]);
    free(bufs);
    free(items);
    free(sizes);
    return st;
}

static eng_status seq_exec(krn_call *c) {
    const seq_params *p = c->params;
    const eng_seq *s = NULL;
    eng_tensor *o = &c->out[0];
    if (p->op != SEQ_EMPTY && p->op != SEQ_CONSTRUCT && p->op != SEQ_SPLIT) ENG_TRY(seq_input(c, 0, &s));
    switch (p->op) {
    case SEQ_EMPTY: return eng_seq_make(p->dtype, NULL, 0, o);
    case SEQ_CONSTRUCT: return eng_seq_make(c->in[0].dtype, c->in, c->nin, o);
    case SEQ_LENGTH: {
        eng_tensor t = {.dtype = ENG_DTYPE_I64, .ndim = 0};
        ENG_TRY(seq_alloc(o, &t));
        *(int64_t *)o->data = s->n;
        return ENG_STATUS_OK;
    }
    case SEQ_AT: {
        int64_t pos;
        ENG_TRY(seq_position(c, 1, s->n, 0, 0, &pos));
        ENG_TRY(seq_alloc(o, &s->items[pos]));
        memcpy(o->data, s->items[pos].data, eng_tensor_nbytes(&s->items[pos]));
        return ENG_STATUS_OK;
    }
    case SEQ_INSERT:
    case SEQ_ERASE: {
        int ins = p->op == SEQ_INSERT;
        int64_t pos;
        if (!ins && s->n == 0) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "cannot erase from an empty sequence");
        ENG_TRY(seq_position(c, ins ? 2 : 1, s->n, ins, ins ? s->n : s->n - 1, &pos));
        eng_dtype elem = s->elem;
        if (ins && (s->n == 0 || elem == ENG_DTYPE_UNDEFINED)) elem = c->in[1].dtype;
        if (ins && c->in[1].dtype != elem)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'tensor' has dtype %s; the sequence holds %s",
                           eng_dtype_name(c->in[1].dtype), eng_dtype_name(elem));
        int64_t n = s->n + (ins ? 1 : -1);
        eng_tensor *items = malloc(((size_t)n + 1) * sizeof *items);
        if (!items) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
        for (int64_t i = 0, k = 0; i < s->n; i++) {
            if (ins && i == pos) items[k++] = c->in[1];
            if (!ins && i == pos) continue;
            items[k++] = s->items[i];
        }
        if (ins && pos == s->n) items[n - 1] = c->in[1];
        eng_status st = eng_seq_make(elem, items, n, o);
        free(items);
        return st;
    }
    case SEQ_CONCAT: return seq_concat(p, s, o);
    case SEQ_SPLIT: return seq_split(p, c, o);
    }
    return eng_err(ENG_STATUS_INTERNAL, "unknown sequence op");
}

static const krn_kernel seq_kernel = {.name = "sequence", .exec = seq_exec};

#define SEQ_OP(name) {name, "", "sequence", ENG_OP_ALLOCATES, seq_prepare, seq_infer, NULL, &seq_kernel}

const eng_op_def eng_ops_seq[] = {
    SEQ_OP("SequenceEmpty"),  SEQ_OP("SequenceConstruct"), SEQ_OP("SequenceInsert"),     SEQ_OP("SequenceAt"),
    SEQ_OP("SequenceErase"),  SEQ_OP("SequenceLength"),    SEQ_OP("ConcatFromSequence"), SEQ_OP("SplitToSequence"),
    {NULL},
};
