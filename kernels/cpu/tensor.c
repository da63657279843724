/* tensor.c - CPU kernels of the "tensor" family: pure data movement (Transpose, Concat, Split, Slice, Expand,
 * Tile, Dropout copy, DepthToSpace/SpaceToDepth) and shape/constant producers (Shape, Size, Constant,
 * ConstantOfShape), plus the family's kernel table.
 *
 * Everything here moves raw bytes by element size, so every fixed-size dtype works. Shapes and all resolved
 * parameters come from the engine (krn-tensor.h); kernels trust them (the engine validated them against the
 * input shapes). The index-driven kernels live in tensor-index.c, Pad/Trilu/etc. in tensor-fill.c, Resize in
 * tensor-resize.c.
 */
#include <omp.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "../kernel.h"
#include "../krn-tensor.h"
#include "../krn-transpose-view.h"

/* Copies smaller than this many bytes stay on one thread. */
#define KRN_TENSOR_PAR_BYTES ((int64_t)1 << 17)

static inline void krn_elem_copy(char *d, const char *s, size_t es) {
    switch (es) {
    case 1: *d = *s; break;
    case 2: memcpy(d, s, 2); break;
    case 4: memcpy(d, s, 4); break;
    case 8: memcpy(d, s, 8); break;
    default: memcpy(d, s, es); break;
    }
}

/* n elements from s (element stride ss, may be 0 or negative) to dense d. */
static void krn_row_copy(char *d, const char *s, int64_t n, int64_t ss, size_t es) {
#define KRN_ROW(T)                                                                                                 \
    do {                                                                                                           \
        T *dd = (T *)d;                                                                                            \
        const T *sp = (const T *)s;                                                                                \
        for (int64_t i = 0; i < n; i++) dd[i] = sp[i * ss];                                                        \
    } while (0)
    switch (es) {
    case 1: KRN_ROW(uint8_t); break;
    case 2: KRN_ROW(uint16_t); break;
    case 4: KRN_ROW(uint32_t); break;
    case 8: KRN_ROW(uint64_t); break;
    default:
        for (int64_t i = 0; i < n; i++) memcpy(d + i * es, s + i * ss * (int64_t)es, es);
    }
#undef KRN_ROW
}

/* Rows [lo, hi) of a merged strided view (n dims; the last is the row): decompose lo once, then step an odometer. */
static void krn_strided_rows(void *dst, const void *src, size_t es, int n, const int64_t *d, const int64_t *s,
                             int64_t lo, int64_t hi) {
    const int64_t inner = d[n - 1], is = s[n - 1];
    const size_t rowb = (size_t)inner * es;
    int64_t idx[KRN_TENSOR_MAX_VIEW], rem = lo, off = 0;
    for (int k = n - 2; k >= 0; k--) {
        idx[k] = rem % d[k];
        off += idx[k] * s[k];
        rem /= d[k];
    }
    char *dp = (char *)dst + (size_t)lo * rowb;
    for (int64_t o = lo; o < hi; o++, dp += rowb) {
        const char *sp = (const char *)src + off * (int64_t)es;
        if (is == 1) memcpy(dp, sp, rowb);
        else krn_row_copy(dp, sp, inner, is, es);
        for (int k = n - 2; k >= 0; k--) {
            off += s[k];
            if (++idx[k] < d[k]) break;
            off -= idx[k] * s[k];
            idx[k] = 0;
        }
    }
}

void krn_cpu_strided_copy(void *dst, const void *src, size_t es, int ndim, const int64_t *dims,
                          const int64_t *sstrides, int nthreads) {
    int64_t d[KRN_TENSOR_MAX_VIEW], s[KRN_TENSOR_MAX_VIEW];
    int n = 0;
    int64_t total = 1;
    for (int i = 0; i < ndim; i++) {
        total *= dims[i];
        if (dims[i] == 1) continue;
        if (n > 0 && s[n - 1] == sstrides[i] * dims[i]) {
            d[n - 1] *= dims[i];
            s[n - 1] = sstrides[i];
        } else {
            d[n] = dims[i];
            s[n] = sstrides[i];
            n++;
        }
    }
    if (total <= 0) return;
    if (n == 0) {
        krn_elem_copy(dst, src, es);
        return;
    }
    const int64_t inner = d[n - 1], outer = total / inner;
    const int par = outer > 1 && total * (int64_t)es >= KRN_TENSOR_PAR_BYTES && nthreads > 1;
#pragma omp parallel num_threads(nthreads) if (par)
    {
        int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
        int64_t lo = outer * t / nt, hi = outer * (t + 1) / nt;
        krn_strided_rows(dst, src, es, n, d, s, lo, hi);
    }
}

#ifdef __AVX2__
/* 8x8 block of 4-byte elements: d[r * ds + c] = s[c * ss + r] for r, c in [0, 8). */
static inline void krn_transpose8x8_f32(const float *s, int64_t ss, float *d, int64_t ds) {
    __m256 r0 = _mm256_loadu_ps(s + 0 * ss), r1 = _mm256_loadu_ps(s + 1 * ss), r2 = _mm256_loadu_ps(s + 2 * ss),
           r3 = _mm256_loadu_ps(s + 3 * ss), r4 = _mm256_loadu_ps(s + 4 * ss), r5 = _mm256_loadu_ps(s + 5 * ss),
           r6 = _mm256_loadu_ps(s + 6 * ss), r7 = _mm256_loadu_ps(s + 7 * ss);
    __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
           t3 = _mm256_unpackhi_ps(r2, r3), t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
           t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
           u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
           u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
           u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    _mm256_storeu_ps(d + 0 * ds, _mm256_permute2f128_ps(u0, u4, 0x20));
    _mm256_storeu_ps(d + 1 * ds, _mm256_permute2f128_ps(u1, u5, 0x20));
    _mm256_storeu_ps(d + 2 * ds, _mm256_permute2f128_ps(u2, u6, 0x20));
    _mm256_storeu_ps(d + 3 * ds, _mm256_permute2f128_ps(u3, u7, 0x20));
    _mm256_storeu_ps(d + 4 * ds, _mm256_permute2f128_ps(u0, u4, 0x31));
    _mm256_storeu_ps(d + 5 * ds, _mm256_permute2f128_ps(u1, u5, 0x31));
    _mm256_storeu_ps(d + 6 * ds, _mm256_permute2f128_ps(u2, u6, 0x31));
    _mm256_storeu_ps(d + 7 * ds, _mm256_permute2f128_ps(u3, u7, 0x31));
}
#endif

/* Tiled copy for a transpose whose innermost output axis is not the innermost source axis.
 * Output dims od[0..n-1] with source strides ss[k]; ss[b] == 1 for the source-innermost axis b != n-1. */
static void krn_transpose_tiled(const char *src, char *dst, size_t es, int n, const int64_t *od, const int64_t *ss,
                                int b, int nthreads) {
    enum { T = 32 };
    int64_t ostr[KRN_TENSOR_MAX_VIEW];
    ostr[n - 1] = 1;
    for (int k = n - 2; k >= 0; k--) ostr[k] = ostr[k + 1] * od[k + 1];
    int oth[KRN_TENSOR_MAX_VIEW], no = 0;
    int64_t outer = 1;
    for (int k = 0; k < n - 1; k++)
        if (k != b) {
            oth[no++] = k;
            outer *= od[k];
        }
    const int64_t R = od[b], C = od[n - 1], sa = ss[n - 1], ob = ostr[b];
    const int64_t nbr = (R + T - 1) / T, nbc = (C + T - 1) / T, ntile = outer * nbr * nbc;
    const int64_t total = outer * R * C;
    const int par = ntile > 1 && total * (int64_t)es >= KRN_TENSOR_PAR_BYTES && nthreads > 1;
#pragma omp parallel for num_threads(nthreads) if (par) schedule(static)
    for (int64_t t = 0; t < ntile; t++) {
        int64_t tc = t % nbc, tr = (t / nbc) % nbr, o = t / (nbc * nbr);
        int64_t soff = 0, doff = 0, rem = o;
        for (int j = no - 1; j >= 0; j--) {
            int k = oth[j];
            int64_t q = rem / od[k], i = rem - q * od[k];
            soff += i * ss[k];
            doff += i * ostr[k];
            rem = q;
        }
        int64_t r0 = tr * T, r1 = r0 + T < R ? r0 + T : R;
        int64_t c0 = tc * T, c1 = c0 + T < C ? c0 + T : C;
#define KRN_TILE(TY)                                                                                               \
    do {                                                                                                           \
        const TY *sp = (const TY *)src + soff;                                                                     \
        TY *dp = (TY *)dst + doff;                                                                                 \
        for (int64_t r = r0; r < r1; r++)                                                                          \
            for (int64_t c = c0; c < c1; c++) dp[r * ob + c] = sp[c * sa + r];                                     \
    } while (0)
        switch (es) {
        case 1: KRN_TILE(uint8_t); break;
        case 2: KRN_TILE(uint16_t); break;
        case 4:
#ifdef __AVX2__
            {
                const uint32_t *sp = (const uint32_t *)src + soff;
                uint32_t *dp = (uint32_t *)dst + doff;
                const int64_t r8 = r0 + ((r1 - r0) & ~(int64_t)7), c8 = c0 + ((c1 - c0) & ~(int64_t)7);
                for (int64_t r = r0; r < r8; r += 8)
                    for (int64_t cc = c0; cc < c8; cc += 8)
                        krn_transpose8x8_f32((const float *)sp + cc * sa + r, sa, (float *)dp + r * ob + cc, ob);
                for (int64_t r = r0; r < r1; r++)
                    for (int64_t cc = r < r8 ? c8 : c0; cc < c1; cc++) dp[r * ob + cc] = sp[cc * sa + r];
            }
#else
            KRN_TILE(uint32_t);
#endif
            break;
        case 8: KRN_TILE(uint64_t); break;
        default:
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++)
                    memcpy(dst + (doff + r * ob + c) * es, src + (soff + c * sa + r) * es, es);
        }
#undef KRN_TILE
    }
}

eng_status krn_cpu_transpose(const void *src, void *dst, size_t es, int ndim, const int64_t *dims, const int *perm,
                             int nthreads) {
    krn_transpose_view v;
    ENG_TRY(krn_transpose_view_make(ndim, dims, perm, KRN_TENSOR_MAX_VIEW, "transpose", &v));
    if (v.total <= 0) return ENG_STATUS_OK;
    if (v.ng == 0) krn_elem_copy(dst, src, es);
    else if (v.b == v.ng - 1) krn_cpu_strided_copy(dst, src, es, v.ng, v.od, v.os, nthreads);
    else krn_transpose_tiled(src, dst, es, v.ng, v.od, v.os, v.b, nthreads);
    return ENG_STATUS_OK;
}

static void krn_strides(const eng_tensor *t, int64_t *st) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        st[i] = s;
        s *= t->dims[i];
    }
}

static eng_status krn_transpose_exec(krn_call *c) {
    const krn_transpose_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    return krn_cpu_transpose(x->data, c->out[0].data, eng_dtype_size(x->dtype), x->ndim, x->dims, p->perm,
                             c->nthreads);
}

/* Concat: out rows of prod(dims[axis:]) per input, interleaved over prod(dims[:axis]) outer blocks. */
static eng_status krn_concat_exec(krn_call *c) {
    const krn_axis_params *p = c->params;
    eng_tensor *o = &c->out[0];
    size_t es = eng_dtype_size(o->dtype);
    int64_t outer = 1;
    for (int i = 0; i < p->axis; i++) outer *= o->dims[i];
    int64_t orow = 0, boff = 0;
    int nin = c->nin;
    for (int i = 0; i < nin; i++) {
        int64_t r = (int64_t)es;
        for (int d = p->axis; d < c->in[i].ndim; d++) r *= c->in[i].dims[d];
        orow += r;
    }
    int64_t total = orow * outer;
    int par = total >= KRN_TENSOR_PAR_BYTES && c->nthreads > 1;
    for (int i = 0; i < nin; i++) {
        const eng_tensor *x = &c->in[i];
        int64_t r = (int64_t)es;
        for (int d = p->axis; d < x->ndim; d++) r *= x->dims[d];
        if (r > 0 && outer > 0) {
            const char *s = x->data;
            char *dptr = (char *)o->data + boff;
#pragma omp parallel for num_threads(c->nthreads) if (par && outer > 1) schedule(static)
            for (int64_t k = 0; k < outer; k++) memcpy(dptr + k * orow, s + k * r, (size_t)r);
        }
        boff += r;
    }
    return ENG_STATUS_OK;
}

static eng_status krn_split_exec(krn_call *c) {
    const krn_axis_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    size_t es = eng_dtype_size(x->dtype);
    int64_t outer = 1, irow = (int64_t)es;
    for (int i = 0; i < p->axis; i++) outer *= x->dims[i];
    for (int i = p->axis; i < x->ndim; i++) irow *= x->dims[i];
    int par = irow * outer >= KRN_TENSOR_PAR_BYTES && c->nthreads > 1;
    int64_t boff = 0;
    for (int j = 0; j < c->nout; j++) {
        eng_tensor *o = &c->out[j];
        int64_t r = (int64_t)es;
        for (int d = p->axis; d < o->ndim; d++) r *= o->dims[d];
        if (o->data && r > 0 && outer > 0) {
            const char *s = (const char *)x->data + boff;
            char *dptr = o->data;
#pragma omp parallel for num_threads(c->nthreads) if (par && outer > 1) schedule(static)
            for (int64_t k = 0; k < outer; k++) memcpy(dptr + k * r, s + k * irow, (size_t)r);
        }
        boff += r;
    }
    return ENG_STATUS_OK;
}

static eng_status krn_slice_exec(krn_call *c) {
    const krn_slice_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    eng_tensor *o = &c->out[0];
    size_t es = eng_dtype_size(x->dtype);
    if (eng_tensor_numel(o) <= 0) return ENG_STATUS_OK;
    int64_t st[ENG_MAX_DIMS], ss[ENG_MAX_DIMS], base = 0;
    krn_strides(x, st);
    for (int i = 0; i < x->ndim; i++) {
        base += p->starts[i] * st[i];
        ss[i] = p->steps[i] * st[i];
    }
    krn_cpu_strided_copy(o->data, (const char *)x->data + base * (int64_t)es, es, o->ndim, o->dims, ss, c->nthreads);
    return ENG_STATUS_OK;
}

static eng_status krn_expand_exec(krn_call *c) {
    const eng_tensor *x = &c->in[0];
    eng_tensor *o = &c->out[0];
    size_t es = eng_dtype_size(x->dtype);
    if (eng_tensor_numel(o) <= 0) return ENG_STATUS_OK;
    int64_t st[ENG_MAX_DIMS], ss[ENG_MAX_DIMS];
    krn_strides(x, st);
    int off = o->ndim - x->ndim;
    for (int i = 0; i < o->ndim; i++) ss[i] = (i < off || x->dims[i - off] == 1) ? 0 : st[i - off];
    krn_cpu_strided_copy(o->data, x->data, es, o->ndim, o->dims, ss, c->nthreads);
    return ENG_STATUS_OK;
}

/* Tile as a strided copy: output dim k = repeats_k * d_k is viewed as (repeats_k, d_k) with strides (0, stride_k). */
static eng_status krn_tile_exec(krn_call *c) {
    const eng_tensor *x = &c->in[0];
    eng_tensor *o = &c->out[0];
    size_t es = eng_dtype_size(x->dtype);
    if (eng_tensor_numel(o) <= 0) return ENG_STATUS_OK;
    int64_t st[ENG_MAX_DIMS], vd[KRN_TENSOR_MAX_VIEW], vs[KRN_TENSOR_MAX_VIEW];
    krn_strides(x, st);
    for (int i = 0; i < x->ndim; i++) {
        vd[2 * i] = o->dims[i] / x->dims[i];
        vs[2 * i] = 0;
        vd[2 * i + 1] = x->dims[i];
        vs[2 * i + 1] = st[i];
    }
    krn_cpu_strided_copy(o->data, x->data, es, 2 * x->ndim, vd, vs, c->nthreads);
    return ENG_STATUS_OK;
}

/* Inference Dropout: output 0 = input; mask (output 1, if requested) all true. Training with ratio > 0 is refused. */
static eng_status krn_dropout_exec(krn_call *c) {
    const krn_dropout_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    double ratio = p ? p->ratio : 0.5;
    if (c->nin > 1 && c->in[1].data) ratio = eng_tensor_get_f64(&c->in[1], 0);
    if (c->nin > 2 && c->in[2].data && eng_tensor_get_i64(&c->in[2], 0) != 0 && ratio > 0)
        return eng_err(ENG_STATUS_UNSUPPORTED, "training-mode Dropout (training_mode=true, ratio=%g) is not supported",
                       ratio);
    size_t nb = eng_tensor_nbytes(x);
    if (nb) memcpy(c->out[0].data, x->data, nb);
    if (c->nout > 1 && c->out[1].data) {
        eng_tensor *m = &c->out[1];
        int64_t n = eng_tensor_numel(m);
        if (m->dtype == ENG_DTYPE_BOOL) memset(m->data, 1, (size_t)n);
        else
            for (int64_t i = 0; i < n; i++) eng_tensor_set_f64(m, i, 1.0);
    }
    return ENG_STATUS_OK;
}

static eng_status krn_shape_exec(krn_call *c) {
    const krn_shape_params *p = c->params;
    int64_t *o = c->out[0].data;
    for (int64_t i = p->start; i < p->end; i++) o[i - p->start] = c->in[0].dims[i];
    return ENG_STATUS_OK;
}

static eng_status krn_size_exec(krn_call *c) {
    *(int64_t *)c->out[0].data = eng_tensor_numel(&c->in[0]);
    return ENG_STATUS_OK;
}

static eng_status krn_constant_exec(krn_call *c) {
    const krn_constant_params *p = c->params;
    size_t nb = eng_tensor_nbytes(&c->out[0]);
    if (nb) memcpy(c->out[0].data, p->value.data, nb);
    return ENG_STATUS_OK;
}

static eng_status krn_constant_of_shape_exec(krn_call *c) {
    const krn_constant_params *p = c->params;
    eng_tensor *o = &c->out[0];
    size_t es = eng_dtype_size(o->dtype);
    int64_t n = eng_tensor_numel(o);
    char *d = o->data;
    int zero = 1;
    for (size_t i = 0; i < es; i++)
        if (((const char *)p->value.data)[i]) zero = 0;
    if (zero) memset(d, 0, (size_t)n * es);
    else
        for (int64_t i = 0; i < n; i++) krn_elem_copy(d + i * es, p->value.data, es);
    return ENG_STATUS_OK;
}

/* DepthToSpace / SpaceToDepth as a 6-D transpose of the NCHW input. */
static eng_status krn_depth_space_exec(krn_call *c) {
    const krn_depth_space_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    int64_t N = x->dims[0], C = x->dims[1], H = x->dims[2], W = x->dims[3], b = p->blocksize;
    int64_t d[6];
    int perm[6];
    if (p->mode == 0) { /* DCR: [N, b, b, C/b^2, H, W] -> [N, C/b^2, H, b, W, b] */
        int64_t v[6] = {N, b, b, C / (b * b), H, W};
        int q[6] = {0, 3, 4, 1, 5, 2};
        memcpy(d, v, sizeof d);
        memcpy(perm, q, sizeof perm);
    } else if (p->mode == 1) { /* CRD: [N, C/b^2, b, b, H, W] -> [N, C/b^2, H, b, W, b] */
        int64_t v[6] = {N, C / (b * b), b, b, H, W};
        int q[6] = {0, 1, 4, 2, 5, 3};
        memcpy(d, v, sizeof d);
        memcpy(perm, q, sizeof perm);
    } else { /* SpaceToDepth: [N, C, H/b, b, W/b, b] -> [N, b, b, C, H/b, W/b] */
        int64_t v[6] = {N, C, H / b, b, W / b, b};
        int q[6] = {0, 3, 5, 1, 2, 4};
        memcpy(d, v, sizeof d);
        memcpy(perm, q, sizeof perm);
    }
    return krn_cpu_transpose(x->data, c->out[0].data, eng_dtype_size(x->dtype), 6, d, perm, c->nthreads);
}

/* tensor-index.c / tensor-fill.c / tensor-resize.c */
eng_status krn_cpu_gather_exec(krn_call *c);
eng_status krn_cpu_gather_elements_exec(krn_call *c);
eng_status krn_cpu_gather_nd_exec(krn_call *c);
eng_status krn_cpu_scatter_elements_exec(krn_call *c);
eng_status krn_cpu_scatter_nd_exec(krn_call *c);
eng_status krn_cpu_onehot_exec(krn_call *c);
eng_status krn_cpu_compress_exec(krn_call *c);
eng_status krn_cpu_nonzero_exec(krn_call *c);
eng_status krn_cpu_reverse_sequence_exec(krn_call *c);
eng_status krn_cpu_pad_exec(krn_call *c);
eng_status krn_cpu_trilu_exec(krn_call *c);
eng_status krn_cpu_eyelike_exec(krn_call *c);
eng_status krn_cpu_range_exec(krn_call *c);
eng_status krn_cpu_resize_exec(krn_call *c);

const krn_kernel krn_cpu_tensor_kernels[] = {
    {"transpose", NULL, krn_transpose_exec, NULL},
    {"concat", NULL, krn_concat_exec, NULL},
    {"split", NULL, krn_split_exec, NULL},
    {"slice", NULL, krn_slice_exec, NULL},
    {"expand", NULL, krn_expand_exec, NULL},
    {"tile", NULL, krn_tile_exec, NULL},
    {"dropout", NULL, krn_dropout_exec, NULL},
    {"shape", NULL, krn_shape_exec, NULL},
    {"size", NULL, krn_size_exec, NULL},
    {"constant", NULL, krn_constant_exec, NULL},
    {"constant_of_shape", NULL, krn_constant_of_shape_exec, NULL},
    {"depth_space", NULL, krn_depth_space_exec, NULL},
    {"gather", NULL, krn_cpu_gather_exec, NULL},
    {"gather_elements", NULL, krn_cpu_gather_elements_exec, NULL},
    {"gather_nd", NULL, krn_cpu_gather_nd_exec, NULL},
    {"scatter_elements", NULL, krn_cpu_scatter_elements_exec, NULL},
    {"scatter_nd", NULL, krn_cpu_scatter_nd_exec, NULL},
    {"onehot", NULL, krn_cpu_onehot_exec, NULL},
    {"compress", NULL, krn_cpu_compress_exec, NULL},
    {"nonzero", NULL, krn_cpu_nonzero_exec, NULL},
    {"reverse_sequence", NULL, krn_cpu_reverse_sequence_exec, NULL},
    {"pad", NULL, krn_cpu_pad_exec, NULL},
    {"trilu", NULL, krn_cpu_trilu_exec, NULL},
    {"eyelike", NULL, krn_cpu_eyelike_exec, NULL},
    {"range", NULL, krn_cpu_range_exec, NULL},
    {"resize", NULL, krn_cpu_resize_exec, NULL},
    {NULL},
};
