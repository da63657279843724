/* tensor-index.c - CPU kernels of the "tensor" family driven by index or mask tensors: Gather, GatherElements,
 * GatherND, ScatterElements (and deprecated Scatter), ScatterND, OneHot, Compress, NonZero, ReverseSequence.
 *
 * Invariants: every index read from a tensor is range-checked against the dim it addresses before any byte
 * moves; negative indices count from the end; an out-of-range index fails with INVALID_ARGUMENT naming the input,
 * the index value, its flat position and the valid range (outputs are then unspecified). Data is moved by
 * element size; reductions (Scatter*) compute in the element's own type (f16/bf16 through float).
 */
#include <stdlib.h>
#include <string.h>

#include "../kernel.h"
#include "../krn-tensor.h"

#define KRN_IDX_PAR_BYTES ((int64_t)1 << 16)

static inline int64_t krn_idx_at(const eng_tensor *t, int64_t i) {
    switch (t->dtype) {
    case ENG_DTYPE_I64: return ((const int64_t *)t->data)[i];
    case ENG_DTYPE_I32: return ((const int32_t *)t->data)[i];
    default: return eng_tensor_get_i64(t, i);
    }
}

static eng_status krn_idx_range_err(const char *what, int64_t v, int64_t pos, int64_t n) {
    return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input '%s': index %lld at position %lld is out of range [%lld, %lld)",
                   what, (long long)v, (long long)pos, (long long)-n, (long long)n);
}

/* Normalised index or -1 when outside [-n, n). */
static inline int64_t krn_norm_idx(int64_t v, int64_t n) {
    if (v < 0) v += n;
    return (v < 0 || v >= n) ? -1 : v;
}

static void krn_strides_of(const int64_t *dims, int n, int64_t *st) {
    int64_t s = 1;
    for (int i = n - 1; i >= 0; i--) {
        st[i] = s;
        s *= dims[i];
    }
}

eng_status krn_cpu_gather_exec(krn_call *c) {
    const krn_gather_params *p = c->params;
    const eng_tensor *x = &c->in[0], *ind = &c->in[1];
    eng_tensor *o = &c->out[0];
    size_t es = eng_dtype_size(x->dtype);
    int64_t outer = 1, inner = (int64_t)es, n = x->dims[p->axis], ni = eng_tensor_numel(ind);
    for (int i = 0; i < p->axis; i++) outer *= x->dims[i];
    for (int i = p->axis + 1; i < x->ndim; i++) inner *= x->dims[i];
    if (ni == 0 || outer == 0 || inner == 0) return ENG_STATUS_OK;
    int64_t *iv = malloc((size_t)ni * sizeof *iv);
    if (!iv) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "gather: %lld indices", (long long)ni);
    for (int64_t j = 0; j < ni; j++) {
        int64_t v = krn_idx_at(ind, j), k = krn_norm_idx(v, n);
        if (k < 0) {
            free(iv);
            return krn_idx_range_err("indices", v, j, n);
        }
        iv[j] = k;
    }
    const char *src = x->data;
    char *dst = o->data;
    int64_t work = outer * ni;
    int par = work > 1 && work * inner >= KRN_IDX_PAR_BYTES && c->nthreads > 1;
#pragma omp parallel for num_threads(c->nthreads) if (par) schedule(static)
    for (int64_t w = 0; w < work; w++) {
        int64_t k = w / ni, j = w - k * ni;
        memcpy(dst + w * inner, src + (k * n + iv[j]) * inner, (size_t)inner);
    }
    free(iv);
    return ENG_STATUS_OK;
}

/* Source/target element offset in `x` for element `e` of `ind` (same rank) with axis replaced by the index.
 * Returns -1 (and the raw index in *bad) when the index is out of range. */
static inline int64_t krn_elem_offset(const eng_tensor *x, const int64_t *xst, const eng_tensor *ind, int axis,
                                      int64_t e, int64_t *bad) {
    int64_t rem = e, off = 0;
    for (int d = ind->ndim - 1; d >= 0; d--) {
        int64_t q = rem / ind->dims[d], i = rem - q * ind->dims[d];
        rem = q;
        if (d == axis) {
            int64_t v = krn_idx_at(ind, e);
            i = krn_norm_idx(v, x->dims[d]);
            if (i < 0) {
                *bad = v;
                return -1;
            }
        }
        off += i * xst[d];
    }
    return off;
}

eng_status krn_cpu_gather_elements_exec(krn_call *c) {
    const krn_gather_params *p = c->params;
    const eng_tensor *x = &c->in[0], *ind = &c->in[1];
    eng_tensor *o = &c->out[0];
    size_t es = eng_dtype_size(x->dtype);
    int64_t xst[ENG_MAX_DIMS], n = eng_tensor_numel(ind);
    krn_strides_of(x->dims, x->ndim, xst);
    for (int64_t e = 0; e < n; e++) {
        int64_t bad = 0, off = krn_elem_offset(x, xst, ind, p->axis, e, &bad);
        if (off < 0) return krn_idx_range_err("indices", bad, e, x->dims[p->axis]);
        memcpy((char *)o->data + e * es, (const char *)x->data + off * es, es);
    }
    return ENG_STATUS_OK;
}

/* Offsets (elements, within one batch of data) of the slices GatherND/ScatterND address. */
static eng_status krn_nd_offsets(const eng_tensor *data, const eng_tensor *ind, int b, int64_t nbatch, int64_t nidx,
                                 int64_t *offs) {
    int q = ind->ndim, k = (int)ind->dims[q - 1];
    int64_t dst[ENG_MAX_DIMS];
    krn_strides_of(data->dims + b, data->ndim - b, dst);
    for (int64_t j = 0; j < nbatch * nidx; j++) {
        int64_t off = 0;
        for (int t = 0; t < k; t++) {
            int64_t v = krn_idx_at(ind, j * k + t), n = data->dims[b + t], i = krn_norm_idx(v, n);
            if (i < 0) return krn_idx_range_err("indices", v, j * k + t, n);
            off += i * dst[t];
        }
        offs[j] = off;
    }
    return ENG_STATUS_OK;
}

eng_status krn_cpu_gather_nd_exec(krn_call *c) {
    const krn_gather_params *p = c->params;
    const eng_tensor *x = &c->in[0], *ind = &c->in[1];
    eng_tensor *o = &c->out[0];
    size_t es = eng_dtype_size(x->dtype);
    int b = p->batch_dims, q = ind->ndim, k = (int)ind->dims[q - 1];
    int64_t nbatch = 1, nidx = 1, slice = (int64_t)es, bstride = 1;
    for (int i = 0; i < b; i++) nbatch *= x->dims[i];
    for (int i = b; i < x->ndim; i++) bstride *= x->dims[i];
    for (int i = b; i < q - 1; i++) nidx *= ind->dims[i];
    for (int i = b + k; i < x->ndim; i++) slice *= x->dims[i];
    if (nbatch * nidx == 0 || slice == 0) return ENG_STATUS_OK;
    int64_t *offs = malloc((size_t)(nbatch * nidx) * sizeof *offs);
    if (!offs) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "gather_nd: %lld index tuples", (long long)(nbatch * nidx));
    eng_status st = krn_nd_offsets(x, ind, b, nbatch, nidx, offs);
    if (st == ENG_STATUS_OK) {
        for (int64_t j = 0; j < nbatch * nidx; j++)
            memcpy((char *)o->data + j * slice, (const char *)x->data + ((j / nidx) * bstride + offs[j]) * es,
                   (size_t)slice);
    }
    free(offs);
    return st;
}

/* *d = reduce(*d, *s) for one element of dtype dt. */
static void krn_reduce_elem(eng_dtype dt, void *d, const void *s, krn_scatter_reduce r) {
#define KRN_RED(T)                                                                                                 \
    do {                                                                                                           \
        T a, b;                                                                                                    \
        memcpy(&a, d, sizeof a);                                                                                   \
        memcpy(&b, s, sizeof b);                                                                                   \
        switch (r) {                                                                                               \
        case KRN_SCATTER_ADD: a = (T)(a + b); break;                                                                \
        case KRN_SCATTER_MUL: a = (T)(a * b); break;                                                                \
        case KRN_SCATTER_MAX: a = b > a ? b : a; break;                                                             \
        case KRN_SCATTER_MIN: a = b < a ? b : a; break;                                                             \
        default: a = b;                                                                                            \
        }                                                                                                          \
        memcpy(d, &a, sizeof a);                                                                                   \
    } while (0)
    switch (dt) {
    case ENG_DTYPE_F32: KRN_RED(float); break;
    case ENG_DTYPE_F64: KRN_RED(double); break;
    case ENG_DTYPE_I8: KRN_RED(int8_t); break;
    case ENG_DTYPE_U8: KRN_RED(uint8_t); break;
    case ENG_DTYPE_I16: KRN_RED(int16_t); break;
    case ENG_DTYPE_U16: KRN_RED(uint16_t); break;
    case ENG_DTYPE_I32: KRN_RED(int32_t); break;
    case ENG_DTYPE_U32: KRN_RED(uint32_t); break;
    case ENG_DTYPE_I64: KRN_RED(int64_t); break;
    case ENG_DTYPE_U64: KRN_RED(uint64_t); break;
    case ENG_DTYPE_BOOL: {
        uint8_t a = *(uint8_t *)d, b = *(const uint8_t *)s;
        if (r == KRN_SCATTER_ADD || r == KRN_SCATTER_MAX) a = a || b;
        else if (r == KRN_SCATTER_MUL || r == KRN_SCATTER_MIN) a = a && b;
        else a = b;
        *(uint8_t *)d = a;
        break;
    }
    case ENG_DTYPE_F16:
    case ENG_DTYPE_BF16: {
        uint16_t ha, hb;
        memcpy(&ha, d, 2);
        memcpy(&hb, s, 2);
        int bf = dt == ENG_DTYPE_BF16;
        float a = bf ? eng_bf16_to_f32(ha) : eng_f16_to_f32(ha), b = bf ? eng_bf16_to_f32(hb) : eng_f16_to_f32(hb);
        switch (r) {
        case KRN_SCATTER_ADD: a += b; break;
        case KRN_SCATTER_MUL: a *= b; break;
        case KRN_SCATTER_MAX: a = b > a ? b : a; break;
        case KRN_SCATTER_MIN: a = b < a ? b : a; break;
        default: a = b;
        }
        ha = bf ? eng_f32_to_bf16(a) : eng_f32_to_f16(a);
        memcpy(d, &ha, 2);
        break;
    }
    default: break;
    }
#undef KRN_RED
}

/* ScatterElements / Scatter: out = data; out[idx-replaced position of e] (reduce)= updates[e], in order. */
eng_status krn_cpu_scatter_elements_exec(krn_call *c) {
    const krn_scatter_params *p = c->params;
    const eng_tensor *x = &c->in[0], *ind = &c->in[1], *upd = &c->in[2];
    eng_tensor *o = &c->out[0];
    size_t es = eng_dtype_size(x->dtype), nb = eng_tensor_nbytes(x);
    if (nb) memcpy(o->data, x->data, nb);
    int64_t xst[ENG_MAX_DIMS], n = eng_tensor_numel(ind);
    krn_strides_of(x->dims, x->ndim, xst);
    for (int64_t e = 0; e < n; e++) {
        int64_t bad = 0, off = krn_elem_offset(x, xst, ind, p->axis, e, &bad);
        if (off < 0) return krn_idx_range_err("indices", bad, e, x->dims[p->axis]);
        char *d = (char *)o->data + off * es;
        const char *s = (const char *)upd->data + e * es;
        if (p->reduction == KRN_SCATTER_NONE) memcpy(d, s, es);
        else krn_reduce_elem(x->dtype, d, s, p->reduction);
    }
    return ENG_STATUS_OK;
}

eng_status krn_cpu_scatter_nd_exec(krn_call *c) {
    const krn_scatter_params *p = c->params;
    const eng_tensor *x = &c->in[0], *ind = &c->in[1], *upd = &c->in[2];
    eng_tensor *o = &c->out[0];
    size_t es = eng_dtype_size(x->dtype), nb = eng_tensor_nbytes(x);
    if (nb) memcpy(o->data, x->data, nb);
    int q = ind->ndim, k = (int)ind->dims[q - 1];
    int64_t nidx = 1, slice = 1;
    for (int i = 0; i < q - 1; i++) nidx *= ind->dims[i];
    for (int i = k; i < x->ndim; i++) slice *= x->dims[i];
    if (nidx == 0 || slice == 0) return ENG_STATUS_OK;
    int64_t *offs = malloc((size_t)nidx * sizeof *offs);
    if (!offs) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "scatter_nd: %lld index tuples", (long long)nidx);
    eng_status st = krn_nd_offsets(x, ind, 0, 1, nidx, offs);
    if (st == ENG_STATUS_OK) {
        for (int64_t j = 0; j < nidx; j++) {
            char *d = (char *)o->data + offs[j] * es;
            const char *s = (const char *)upd->data + j * slice * es;
            if (p->reduction == KRN_SCATTER_NONE) memcpy(d, s, (size_t)slice * es);
            else
                for (int64_t e = 0; e < slice; e++) krn_reduce_elem(x->dtype, d + e * es, s + e * es, p->reduction);
        }
    }
    free(offs);
    return st;
}

/* OneHot: out has indices' shape with depth inserted at axis; on/off values from input 2 ([off, on]).
 * Indices outside [-depth, depth) give an all-off vector (ONNX semantics), not an error. */
eng_status krn_cpu_onehot_exec(krn_call *c) {
    const krn_axis_params *p = c->params;
    const eng_tensor *ind = &c->in[0], *vals = &c->in[2];
    eng_tensor *o = &c->out[0];
    size_t es = eng_dtype_size(o->dtype);
    int64_t depth = o->dims[p->axis], outer = 1, inner = 1;
    for (int i = 0; i < p->axis; i++) outer *= o->dims[i];
    for (int i = p->axis + 1; i < o->ndim; i++) inner *= o->dims[i];
    const char *off = vals->data, *on = (const char *)vals->data + es;
    char *d = o->data;
    int64_t n = eng_tensor_numel(o);
    for (int64_t i = 0; i < n; i++) memcpy(d + i * es, off, es);
    for (int64_t a = 0; a < outer; a++)
        for (int64_t i = 0; i < inner; i++) {
            int64_t v = eng_dtype_is_float(ind->dtype) ? (int64_t)eng_tensor_get_f64(ind, a * inner + i)
                                                        : krn_idx_at(ind, a * inner + i);
            int64_t k = krn_norm_idx(v, depth);
            if (k >= 0) memcpy(d + ((a * depth + k) * inner + i) * es, on, es);
        }
    return ENG_STATUS_OK;
}

/* Compress: keep the slices along axis whose condition entry is true (axis -1: the flattened input). */
eng_status krn_cpu_compress_exec(krn_call *c) {
    const krn_axis_params *p = c->params;
    const eng_tensor *x = &c->in[0], *cond = &c->in[1];
    size_t es = eng_dtype_size(x->dtype);
    int64_t outer = 1, n, inner = (int64_t)es;
    if (p->axis < 0) n = eng_tensor_numel(x);
    else {
        n = x->dims[p->axis];
        for (int i = 0; i < p->axis; i++) outer *= x->dims[i];
        for (int i = p->axis + 1; i < x->ndim; i++) inner *= x->dims[i];
    }
    int64_t nc = eng_tensor_numel(cond);
    if (nc > n) nc = n;
    char *d = c->out[0].data;
    const char *s = x->data;
    for (int64_t a = 0; a < outer; a++)
        for (int64_t j = 0; j < nc; j++)
            if (eng_tensor_get_i64(cond, j)) {
                memcpy(d, s + (a * n + j) * inner, (size_t)inner);
                d += inner;
            }
    return ENG_STATUS_OK;
}

static inline int krn_is_nonzero(const eng_tensor *x, int64_t i, size_t es) {
    if (eng_dtype_is_float(x->dtype)) return eng_tensor_get_f64(x, i) != 0.0;
    const unsigned char *b = (const unsigned char *)x->data + i * es;
    for (size_t k = 0; k < es; k++)
        if (b[k]) return 1;
    return 0;
}

/* NonZero: out (rank, nnz) int64, coordinates in row-major order. nnz was counted by infer. */
eng_status krn_cpu_nonzero_exec(krn_call *c) {
    const eng_tensor *x = &c->in[0];
    eng_tensor *o = &c->out[0];
    size_t es = eng_dtype_size(x->dtype);
    int64_t n = eng_tensor_numel(x), nnz = o->ndim == 2 ? o->dims[1] : 0, j = 0;
    int r = x->ndim;
    int64_t *d = o->data;
    for (int64_t i = 0; i < n && j < nnz; i++) {
        if (!krn_is_nonzero(x, i, es)) continue;
        int64_t rem = i;
        for (int k = r - 1; k >= 0; k--) {
            d[k * nnz + j] = rem % x->dims[k];
            rem /= x->dims[k];
        }
        if (r == 0) (void)0;
        j++;
    }
    if (j != nnz)
        return eng_err(ENG_STATUS_INTERNAL, "nonzero: counted %lld nonzeros at plan time, found %lld", (long long)nnz,
                       (long long)j);
    return ENG_STATUS_OK;
}

eng_status krn_cpu_reverse_sequence_exec(krn_call *c) {
    const krn_revseq_params *p = c->params;
    const eng_tensor *x = &c->in[0], *lens = &c->in[1];
    size_t es = eng_dtype_size(x->dtype);
    int64_t T = x->dims[p->time_axis], B = x->dims[p->batch_axis], inner = (int64_t)es;
    for (int i = 2; i < x->ndim; i++) inner *= x->dims[i];
    for (int64_t b = 0; b < B; b++) {
        int64_t len = krn_idx_at(lens, b);
        if (len < 0 || len > T)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT,
                           "input 'sequence_lens': value %lld at position %lld is out of range [0, %lld]",
                           (long long)len, (long long)b, (long long)T);
        for (int64_t t = 0; t < T; t++) {
            int64_t s = t < len ? len - 1 - t : t;
            int64_t doff = p->time_axis == 0 ? t * B + b : b * T + t;
            int64_t soff = p->time_axis == 0 ? s * B + b : b * T + s;
            memcpy((char *)c->out[0].data + doff * inner, (const char *)x->data + soff * inner, (size_t)inner);
        }
    }
    return ENG_STATUS_OK;
}
