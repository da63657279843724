/* reduce-arg.c - CPU kernels for ArgMax/ArgMin, TopK and CumSum (listed in krn_cpu_reduce_kernels).
 *
 * All three view the input as (outer, n, inner) around one axis and compute in a work type (float, double or
 * int64; other dtypes are converted into scratch first). When inner > 1 the loops run over contiguous rows of
 * `inner` elements, never strided columns. ArgMax/ArgMin ties: first index, or last with select_last_index.
 * TopK: ties keep the lower index first; values are copied from the input bytes by index, so no precision
 * is lost for any dtype.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernel.h"
#include "../krn-reduce.h"
#include "reduce-math.h"

eng_status krn_cpu_argreduce_exec(krn_call *c);
eng_status krn_cpu_topk_exec(krn_call *c);
eng_status krn_cpu_cumsum_exec(krn_call *c);

static void arg_split(const eng_tensor *x, int axis, int64_t *outer, int64_t *n, int64_t *inner) {
    *outer = eng_shape_numel(x->dims, axis);
    *n = x->dims[axis];
    *inner = eng_shape_numel(x->dims + axis + 1, x->ndim - axis - 1);
}

/* ---- ArgMax / ArgMin ---- */

/* better(a, b): a should replace the current best b. */
#define ARG_DEFINE(T, SFX)                                                                                       \
    static eng_status arg_run_##SFX(const T *x, int64_t *y, int64_t outer, int64_t n, int64_t inner, int is_min, \
                                    int last, int nt) {                                                          \
        T *best = NULL;                                                                                          \
        if (inner > 1) {                                                                                         \
            best = eng_alloc((size_t)(inner * outer) * sizeof(T));                                               \
            if (!best) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "argmax scratch of %lld", (long long)(inner * outer)); \
        }                                                                                                        \
        _Pragma("omp parallel for num_threads(nt) if(outer * n * inner > 65536) schedule(static)")                \
        for (int64_t o = 0; o < outer; o++) {                                                                    \
            const T *xo = x + o * n * inner;                                                                     \
            int64_t *yo = y + o * inner;                                                                         \
            if (inner == 1) {                                                                                    \
                T b = xo[0];                                                                                     \
                int64_t bi = 0;                                                                                  \
                for (int64_t i = 1; i < n; i++) {                                                                \
                    T v = xo[i];                                                                                 \
                    int take = is_min ? (last ? v <= b : v < b) : (last ? v >= b : v > b);                       \
                    if (take) b = v, bi = i;                                                                     \
                }                                                                                                \
                yo[0] = bi;                                                                                      \
                continue;                                                                                        \
            }                                                                                                    \
            T *bo = best + o * inner;                                                                            \
            for (int64_t j = 0; j < inner; j++) bo[j] = xo[j], yo[j] = 0;                                        \
            for (int64_t i = 1; i < n; i++) {                                                                    \
                const T *xr = xo + i * inner;                                                                    \
                for (int64_t j = 0; j < inner; j++) {                                                            \
                    T v = xr[j];                                                                                 \
                    int take = is_min ? (last ? v <= bo[j] : v < bo[j]) : (last ? v >= bo[j] : v > bo[j]);       \
                    if (take) bo[j] = v, yo[j] = i;                                                              \
                }                                                                                                \
            }                                                                                                    \
        }                                                                                                        \
        eng_free(best);                                                                                          \
        return ENG_STATUS_OK;                                                                                    \
    }

ARG_DEFINE(float, f32)
ARG_DEFINE(double, f64)
ARG_DEFINE(int64_t, i64)

eng_status krn_cpu_argreduce_exec(krn_call *c) {
    const krn_arg_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    int64_t outer, n, inner;
    arg_split(x, p->axis, &outer, &n, &inner);
    if (n == 0 || outer * inner == 0) return ENG_STATUS_OK;
    eng_dtype wt = krn_red_work_dtype(x->dtype);
    int owned;
    const void *xw = krn_red_as(x, wt, &owned);
    if (!xw) return ENG_STATUS_OUT_OF_MEMORY;
    int64_t *y = c->out[0].data;
    eng_status st;
    if (wt == ENG_DTYPE_F32) st = arg_run_f32(xw, y, outer, n, inner, p->is_min, p->select_last_index, c->nthreads);
    else if (wt == ENG_DTYPE_F64) st = arg_run_f64(xw, y, outer, n, inner, p->is_min, p->select_last_index, c->nthreads);
    else st = arg_run_i64(xw, y, outer, n, inner, p->is_min, p->select_last_index, c->nthreads);
    if (owned) eng_free((void *)xw);
    return st;
}

/* ---- TopK ---- */

typedef struct topk_item_f { double v; int64_t i; } topk_item_f;
typedef struct topk_item_i { int64_t v; int64_t i; } topk_item_i;

static int topk_cmp_f_desc(const void *a, const void *b) {
    const topk_item_f *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}
static int topk_cmp_f_asc(const void *a, const void *b) {
    const topk_item_f *x = a, *y = b;
    if (x->v != y->v) return x->v < y->v ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}
static int topk_cmp_i_desc(const void *a, const void *b) {
    const topk_item_i *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}
static int topk_cmp_i_asc(const void *a, const void *b) {
    const topk_item_i *x = a, *y = b;
    if (x->v != y->v) return x->v < y->v ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

eng_status krn_cpu_topk_exec(krn_call *c) {
    const krn_topk_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    int64_t outer, n, inner, k = p->k;
    arg_split(x, p->axis, &outer, &n, &inner);
    if (k == 0 || outer * inner == 0) return ENG_STATUS_OK;
    int is_int = eng_dtype_is_int(x->dtype);
    eng_dtype wt = is_int ? ENG_DTYPE_I64 : ENG_DTYPE_F64;
    int owned;
    const void *xw = krn_red_as(x, wt, &owned);
    if (!xw) return ENG_STATUS_OUT_OF_MEMORY;
    size_t es = eng_dtype_size(x->dtype);
    const char *xb = x->data;
    char *vb = c->out[0].data;
    int64_t *ib = c->out[1].data;
    int nt = c->nthreads;
    int64_t slices = outer * inner;
    eng_status st = ENG_STATUS_OK;
#pragma omp parallel num_threads(nt) if (slices * n > 65536)
    {
        void *items = malloc((size_t)n * 16);
        if (!items) {
#pragma omp critical
            st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "TopK scratch of %lld items", (long long)n);
        }
#pragma omp for schedule(static)
        for (int64_t s = 0; s < slices; s++) {
            if (!items) continue;
            int64_t o = s / inner, j = s % inner, base = o * n * inner + j;
            if (is_int) {
                topk_item_i *it = items;
                const int64_t *xi = xw;
                for (int64_t i = 0; i < n; i++) it[i].v = xi[base + i * inner], it[i].i = i;
                qsort(it, (size_t)n, sizeof *it, p->largest ? topk_cmp_i_desc : topk_cmp_i_asc);
            } else {
                topk_item_f *it = items;
                const double *xf = xw;
                for (int64_t i = 0; i < n; i++) it[i].v = xf[base + i * inner], it[i].i = i;
                qsort(it, (size_t)n, sizeof *it, p->largest ? topk_cmp_f_desc : topk_cmp_f_asc);
            }
            for (int64_t r = 0; r < k; r++) {
                int64_t src = is_int ? ((topk_item_i *)items)[r].i : ((topk_item_f *)items)[r].i;
                int64_t dst = o * k * inner + r * inner + j;
                memcpy(vb + dst * es, xb + (base + src * inner) * es, es);
                ib[dst] = src;
            }
        }
        free(items);
    }
    if (owned) eng_free((void *)xw);
    return st;
}

/* ---- CumSum ---- */

#define CUMSUM_DEFINE(T, SFX)                                                                                    \
    static void cumsum_run_##SFX(const T *x, T *y, int64_t outer, int64_t n, int64_t inner, int excl, int rev,   \
                                 int nt) {                                                                       \
        _Pragma("omp parallel for num_threads(nt) if(outer * n * inner > 65536) schedule(static)")                \
        for (int64_t o = 0; o < outer; o++) {                                                                    \
            const T *xo = x + o * n * inner;                                                                     \
            T *yo = y + o * n * inner;                                                                           \
            if (inner == 1) {                                                                                    \
                T acc = 0;                                                                                       \
                for (int64_t t = 0; t < n; t++) {                                                                \
                    int64_t i = rev ? n - 1 - t : t;                                                             \
                    if (excl) yo[i] = acc, acc += xo[i];                                                         \
                    else acc += xo[i], yo[i] = acc;                                                              \
                }                                                                                                \
                continue;                                                                                        \
            }                                                                                                    \
            const T *prev_x = NULL;                                                                              \
            T *prev_y = NULL;                                                                                    \
            for (int64_t t = 0; t < n; t++) {                                                                    \
                int64_t i = rev ? n - 1 - t : t;                                                                 \
                const T *xr = xo + i * inner;                                                                    \
                T *yr = yo + i * inner;                                                                          \
                if (!prev_y) {                                                                                   \
                    for (int64_t j = 0; j < inner; j++) yr[j] = excl ? (T)0 : xr[j];                             \
                } else if (excl) {                                                                               \
                    for (int64_t j = 0; j < inner; j++) yr[j] = prev_y[j] + prev_x[j];                           \
                } else {                                                                                         \
                    for (int64_t j = 0; j < inner; j++) yr[j] = prev_y[j] + xr[j];                               \
                }                                                                                                \
                prev_x = xr, prev_y = yr;                                                                        \
            }                                                                                                    \
        }                                                                                                        \
    }

CUMSUM_DEFINE(float, f32)
CUMSUM_DEFINE(double, f64)
CUMSUM_DEFINE(int64_t, i64)

eng_status krn_cpu_cumsum_exec(krn_call *c) {
    const krn_cumsum_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    eng_tensor *y = &c->out[0];
    int64_t a = eng_tensor_get_i64(&c->in[1], 0);
    if (a < -x->ndim || a >= x->ndim)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'axis' = %lld is out of range for rank %d", (long long)a, x->ndim);
    int axis = (int)(a < 0 ? a + x->ndim : a);
    int64_t outer, n, inner;
    arg_split(x, axis, &outer, &n, &inner);
    if (outer * n * inner == 0) return ENG_STATUS_OK;
    eng_dtype wt = krn_red_work_dtype(x->dtype);
    int xo, yo;
    const void *xw = krn_red_as(x, wt, &xo);
    if (!xw) return ENG_STATUS_OUT_OF_MEMORY;
    void *yw = krn_red_out(y, wt, &yo);
    if (!yw) {
        if (xo) eng_free((void *)xw);
        return ENG_STATUS_OUT_OF_MEMORY;
    }
    if (wt == ENG_DTYPE_F32) cumsum_run_f32(xw, yw, outer, n, inner, p->exclusive, p->reverse, c->nthreads);
    else if (wt == ENG_DTYPE_F64) cumsum_run_f64(xw, yw, outer, n, inner, p->exclusive, p->reverse, c->nthreads);
    else cumsum_run_i64(xw, yw, outer, n, inner, p->exclusive, p->reverse, c->nthreads);
    if (xo) eng_free((void *)xw);
    return krn_red_out_done(y, yw, wt, yo, ENG_STATUS_OK);
}
