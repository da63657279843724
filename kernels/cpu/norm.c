/* norm.c - CPU kernels for Softmax/LogSoftmax/Hardmax and LayerNormalization (Transformer hot path).
 *
 * Both work on (outer, n, inner) views. The hot case is inner = 1 (last axis, rows of 128..4096 floats):
 * each row is a few contiguous passes written for gcc to vectorise (omp simd reductions, krn_red_expf), and
 * rows are spread over OpenMP threads once rows * cols is large. Softmax with inner > 1 keeps per-column
 * running max/sum vectors of `inner` elements so every loop is still contiguous. float and double compute
 * natively; f16/bf16 go through a float scratch copy. Hardmax marks the first maximum.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernel.h"
#include "../krn-reduce.h"
#include "reduce-math.h"

eng_status krn_cpu_softmax_exec(krn_call *c);
eng_status krn_cpu_layernorm_exec(krn_call *c);

#define NORM_PAR_MIN 16384 /* elements below which a kernel stays on one thread */

static inline double norm_exp_f64(double v) { return exp(v); }

/* ---- Softmax family ---- */

/* The row kernel each type's run uses (token-pasted as SOFTMAX_ROW_<sfx>). */
#if defined(__AVX512F__)
static void softmax_row512(const float *restrict x, float *restrict y, int64_t n, int kind);
#define SOFTMAX_ROW_f32 softmax_row512
#else
#define SOFTMAX_ROW_f32 softmax_row_f32
#endif
#define SOFTMAX_ROW_f64 softmax_row_f64

#define SOFTMAX_DEFINE(T, SFX, EXP, LOG)                                                                         \
    static void softmax_row_##SFX(const T *restrict x, T *restrict y, int64_t n, int kind) {                     \
        T m = x[0];                                                                                              \
        int64_t am = 0;                                                                                          \
        if (kind == KRN_SOFTMAX_HARD) {                                                                          \
            for (int64_t i = 1; i < n; i++)                                                                      \
                if (x[i] > m) m = x[i], am = i;                                                                  \
            memset(y, 0, (size_t)n * sizeof(T));                                                                 \
            y[am] = 1;                                                                                           \
            return;                                                                                              \
        }                                                                                                        \
        _Pragma("omp simd reduction(max : m)") for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;           \
        T s = 0;                                                                                                 \
        if (kind == KRN_SOFTMAX_LOG) {                                                                           \
            _Pragma("omp simd reduction(+ : s)") for (int64_t i = 0; i < n; i++) s += EXP(x[i] - m);              \
            T l = m + LOG(s);                                                                                    \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) y[i] = x[i] - l;                                  \
            return;                                                                                              \
        }                                                                                                        \
        _Pragma("omp simd reduction(+ : s)") for (int64_t i = 0; i < n; i++) {                                    \
            T e = EXP(x[i] - m);                                                                                 \
            y[i] = e;                                                                                            \
            s += e;                                                                                              \
        }                                                                                                        \
        T inv = (T)1 / s;                                                                                        \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) y[i] *= inv;                                          \
    }                                                                                                            \
    /* One (n, inner) block; scratch holds 2 * inner elements. */                                                \
    static void softmax_block_##SFX(const T *restrict x, T *restrict y, int64_t n, int64_t inner, int kind,      \
                                    T *restrict scratch) {                                                       \
        T *m = scratch, *s = scratch + inner;                                                                    \
        memcpy(m, x, (size_t)inner * sizeof(T));                                                                 \
        for (int64_t i = 1; i < n; i++) {                                                                        \
            const T *xr = x + i * inner;                                                                         \
            for (int64_t j = 0; j < inner; j++) m[j] = xr[j] > m[j] ? xr[j] : m[j];                              \
        }                                                                                                        \
        if (kind == KRN_SOFTMAX_HARD) {                                                                          \
            memset(y, 0, (size_t)(n * inner) * sizeof(T));                                                       \
            for (int64_t j = 0; j < inner; j++) s[j] = 0;                                                        \
            for (int64_t i = 0; i < n; i++)                                                                      \
                for (int64_t j = 0; j < inner; j++)                                                              \
                    if (s[j] == 0 && x[i * inner + j] == m[j]) y[i * inner + j] = 1, s[j] = 1;                   \
            return;                                                                                              \
        }                                                                                                        \
        for (int64_t j = 0; j < inner; j++) s[j] = 0;                                                            \
        for (int64_t i = 0; i < n; i++) {                                                                        \
            const T *xr = x + i * inner;                                                                         \
            T *yr = y + i * inner;                                                                               \
            _Pragma("omp simd") for (int64_t j = 0; j < inner; j++) {                                            \
                T e = EXP(xr[j] - m[j]);                                                                         \
                yr[j] = e;                                                                                       \
                s[j] += e;                                                                                       \
            }                                                                                                    \
        }                                                                                                        \
        if (kind == KRN_SOFTMAX_LOG) {                                                                           \
            for (int64_t j = 0; j < inner; j++) s[j] = m[j] + LOG(s[j]);                                         \
            for (int64_t i = 0; i < n; i++)                                                                      \
                for (int64_t j = 0; j < inner; j++) y[i * inner + j] = x[i * inner + j] - s[j];                  \
            return;                                                                                              \
        }                                                                                                        \
        for (int64_t j = 0; j < inner; j++) s[j] = (T)1 / s[j];                                                  \
        for (int64_t i = 0; i < n; i++)                                                                          \
            for (int64_t j = 0; j < inner; j++) y[i * inner + j] *= s[j];                                        \
    }                                                                                                            \
    static eng_status softmax_run_##SFX(const T *x, T *y, const krn_softmax_params *p, int nt) {                 \
        int64_t outer = p->outer, n = p->n, inner = p->inner;                                                    \
        int par = outer > 1 && outer * n * inner >= NORM_PAR_MIN;                                                \
        if (inner == 1) {                                                                                        \
            _Pragma("omp parallel for num_threads(nt) if(par) schedule(static)")                                  \
            for (int64_t o = 0; o < outer; o++) SOFTMAX_ROW_##SFX(x + o * n, y + o * n, n, p->kind);             \
            return ENG_STATUS_OK;                                                                                \
        }                                                                                                        \
        eng_status st = ENG_STATUS_OK;                                                                           \
        _Pragma("omp parallel num_threads(nt) if(par)")                                                           \
        {                                                                                                        \
            T *scratch = malloc((size_t)(2 * inner) * sizeof(T));                                                \
            if (!scratch) {                                                                                      \
                _Pragma("omp critical") st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "softmax scratch");               \
            }                                                                                                    \
            _Pragma("omp for schedule(static)")                                                                   \
            for (int64_t o = 0; o < outer; o++)                                                                  \
                if (scratch) softmax_block_##SFX(x + o * n * inner, y + o * n * inner, n, inner, p->kind, scratch); \
            free(scratch);                                                                                       \
        }                                                                                                        \
        return st;                                                                                               \
    }

SOFTMAX_DEFINE(float, f32, krn_red_expf, logf)

#if defined(__AVX512F__)
/* AVX-512 softmax/log-softmax of one row: masked tails, two accumulators, vscalefps exp. */
static void softmax_row512(const float *restrict x, float *restrict y, int64_t n, int kind) {
    if (kind == KRN_SOFTMAX_HARD || n < 16) {
        softmax_row_f32(x, y, n, kind);
        return;
    }
    int64_t nv = n & ~(int64_t)15;
    __mmask16 tail = (__mmask16)((1u << (n - nv)) - 1u);
    __m512 m0 = _mm512_loadu_ps(x), m1 = m0;
    int64_t i = 16;
    for (; i + 32 <= nv; i += 32) {
        m0 = _mm512_max_ps(m0, _mm512_loadu_ps(x + i));
        m1 = _mm512_max_ps(m1, _mm512_loadu_ps(x + i + 16));
    }
    for (; i < nv; i += 16) m0 = _mm512_max_ps(m0, _mm512_loadu_ps(x + i));
    if (tail) m1 = _mm512_mask_max_ps(m1, tail, m1, _mm512_maskz_loadu_ps(tail, x + nv));
    __m512 vm = _mm512_set1_ps(_mm512_reduce_max_ps(_mm512_max_ps(m0, m1)));
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int store = kind == KRN_SOFTMAX;
    for (i = 0; i + 32 <= nv; i += 32) {
        __m512 e0 = krn_red_exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm));
        __m512 e1 = krn_red_exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i + 16), vm));
        if (store) _mm512_storeu_ps(y + i, e0), _mm512_storeu_ps(y + i + 16, e1);
        s0 = _mm512_add_ps(s0, e0);
        s1 = _mm512_add_ps(s1, e1);
    }
    for (; i < nv; i += 16) {
        __m512 e0 = krn_red_exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm));
        if (store) _mm512_storeu_ps(y + i, e0);
        s0 = _mm512_add_ps(s0, e0);
    }
    if (tail) {
        __m512 e1 = _mm512_maskz_mov_ps(tail, krn_red_exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, x + nv), vm)));
        if (store) _mm512_mask_storeu_ps(y + nv, tail, e1);
        s1 = _mm512_add_ps(s1, e1);
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
    if (kind == KRN_SOFTMAX_LOG) {
        __m512 l = _mm512_set1_ps(_mm512_cvtss_f32(vm) + logf(s));
        for (i = 0; i < nv; i += 16) _mm512_storeu_ps(y + i, _mm512_sub_ps(_mm512_loadu_ps(x + i), l));
        if (tail) _mm512_mask_storeu_ps(y + nv, tail, _mm512_sub_ps(_mm512_maskz_loadu_ps(tail, x + nv), l));
        return;
    }
    __m512 inv = _mm512_set1_ps(1.0f / s);
    for (i = 0; i < nv; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(y + i), inv));
    if (tail) _mm512_mask_storeu_ps(y + nv, tail, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, y + nv), inv));
}
#endif
SOFTMAX_DEFINE(double, f64, norm_exp_f64, log)

eng_status krn_cpu_softmax_exec(krn_call *c) {
    const krn_softmax_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    eng_tensor *y = &c->out[0];
    if (p->outer * p->n * p->inner == 0) return ENG_STATUS_OK;
    if (x->dtype == ENG_DTYPE_F32) return softmax_run_f32(x->data, y->data, p, c->nthreads);
    if (x->dtype == ENG_DTYPE_F64) return softmax_run_f64(x->data, y->data, p, c->nthreads);
    int xo, yo;
    const float *xw = krn_red_as(x, ENG_DTYPE_F32, &xo);
    if (!xw) return ENG_STATUS_OUT_OF_MEMORY;
    float *yw = krn_red_out(y, ENG_DTYPE_F32, &yo);
    eng_status st = yw ? softmax_run_f32(xw, yw, p, c->nthreads) : ENG_STATUS_OUT_OF_MEMORY;
    if (xo) eng_free((void *)xw);
    return yw ? krn_red_out_done(y, yw, ENG_DTYPE_F32, yo, st) : st;
}

/* ---- LayerNormalization ---- */

/* Expand `t` (numpy-broadcastable to dims[0..nd)) into a dense vector of numel(dims) work-type values. */
static void *norm_expand(const eng_tensor *t, const int64_t *dims, int nd, int64_t cols, eng_dtype wt) {
    void *w = eng_alloc((size_t)(cols > 0 ? cols : 1) * eng_dtype_size(wt));
    if (!w) {
        eng_err(ENG_STATUS_OUT_OF_MEMORY, "layer norm scale/bias expansion of %lld", (long long)cols);
        return NULL;
    }
    eng_tensor v = {wt, 1, {cols}, w};
    int64_t idx[ENG_MAX_DIMS] = {0};
    for (int64_t j = 0; j < cols; j++) {
        int64_t src = 0;
        for (int d = nd - t->ndim; d < nd; d++) {
            int td = d - (nd - t->ndim);
            src = src * t->dims[td] + (t->dims[td] == 1 ? 0 : idx[d]);
        }
        eng_tensor_set_f64(&v, j, eng_tensor_get_f64(t, src));
        for (int d = nd - 1; d >= 0; d--) {
            if (++idx[d] < dims[d]) break;
            idx[d] = 0;
        }
    }
    return w;
}

#define LAYERNORM_DEFINE(T, SFX, SQRT)                                                                           \
    static void layernorm_run_##SFX(const T *x, T *y, const T *sc, const T *bi, double *mean_out,               \
                                    double *istd_out, int64_t rows, int64_t cols, T eps, int nt) {               \
        int par = rows > 1 && rows * cols >= NORM_PAR_MIN;                                                       \
        _Pragma("omp parallel for num_threads(nt) if(par) schedule(static)")                                      \
        for (int64_t r = 0; r < rows; r++) {                                                                     \
            const T *restrict xr = x + r * cols;                                                                 \
            T *restrict yr = y + r * cols;                                                                       \
            T s = 0, q = 0;                                                                                      \
            _Pragma("omp simd reduction(+ : s)") for (int64_t j = 0; j < cols; j++) s += xr[j];                   \
            T mean = s / (T)cols;                                                                                \
            _Pragma("omp simd reduction(+ : q)") for (int64_t j = 0; j < cols; j++) {                            \
                T d = xr[j] - mean;                                                                              \
                q += d * d;                                                                                      \
            }                                                                                                    \
            T inv = (T)1 / SQRT(q / (T)cols + eps);                                                              \
            if (bi) {                                                                                            \
                _Pragma("omp simd") for (int64_t j = 0; j < cols; j++) yr[j] = (xr[j] - mean) * inv * sc[j] + bi[j]; \
            } else {                                                                                             \
                _Pragma("omp simd") for (int64_t j = 0; j < cols; j++) yr[j] = (xr[j] - mean) * inv * sc[j];     \
            }                                                                                                    \
            if (mean_out) mean_out[r] = mean;                                                                    \
            if (istd_out) istd_out[r] = inv;                                                                     \
        }                                                                                                        \
    }

LAYERNORM_DEFINE(float, f32, sqrtf)
LAYERNORM_DEFINE(double, f64, sqrt)

/* io_ok (kernel.h): x and y may be bf16 (converted to and from float32 rows: the statistics, the scale and the
 * shift stay float32); the statistics outputs stay float32. */
int krn_cpu_layernorm_io_ok(const krn_call *c, eng_dtype dt) {
    if (dt != ENG_DTYPE_BF16 || c->nin < 2) return 0;
    for (int i = 0; i < c->nin; i++) {
        eng_dtype t = c->in[i].dtype;
        if (t != ENG_DTYPE_UNDEFINED && t != ENG_DTYPE_F32 && !(i == 0 && t == ENG_DTYPE_BF16)) return 0;
    }
    for (int i = 0; i < c->nout; i++) {
        eng_dtype t = c->out[i].dtype;
        if (t != ENG_DTYPE_UNDEFINED && t != ENG_DTYPE_F32 && !(i == 0 && t == ENG_DTYPE_BF16)) return 0;
    }
    return 1;
}

eng_status krn_cpu_layernorm_exec(krn_call *c) {
    const krn_layernorm_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    eng_tensor *y = &c->out[0];
    int64_t rows = p->rows, cols = p->cols;
    if (rows * cols == 0) return ENG_STATUS_OK;
    eng_dtype wt = x->dtype == ENG_DTYPE_F64 ? ENG_DTYPE_F64 : ENG_DTYPE_F32;
    const int64_t *nd_dims = x->dims + p->axis;
    int nd = x->ndim - p->axis;
    eng_status st = ENG_STATUS_OK;
    void *xw = NULL, *yw = NULL, *sc = NULL, *bi = NULL;
    int xo = 0, yo = 0, so = 0, bo = 0;
    double *stats = NULL;
    const eng_tensor *s = &c->in[1], *b = c->nin > 2 && c->in[2].data ? &c->in[2] : NULL;
    if (s->dtype == wt && eng_tensor_numel(s) == cols) sc = s->data;
    else if (!(sc = norm_expand(s, nd_dims, nd, cols, wt))) return ENG_STATUS_OUT_OF_MEMORY;
    else so = 1;
    if (b) {
        if (b->dtype == wt && eng_tensor_numel(b) == cols) bi = b->data;
        else if (!(bi = norm_expand(b, nd_dims, nd, cols, wt))) st = ENG_STATUS_OUT_OF_MEMORY;
        else bo = 1;
    }
    int want_stats = (c->nout > 1 && c->out[1].data) || (c->nout > 2 && c->out[2].data);
    if (st == ENG_STATUS_OK && want_stats && !(stats = malloc((size_t)rows * 2 * sizeof *stats)))
        st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "layer norm statistics for %lld rows", (long long)rows);
    if (st == ENG_STATUS_OK && !(xw = krn_red_as(x, wt, &xo))) st = ENG_STATUS_OUT_OF_MEMORY;
    if (st == ENG_STATUS_OK && !(yw = krn_red_out(y, wt, &yo))) st = ENG_STATUS_OUT_OF_MEMORY;
    if (st == ENG_STATUS_OK) {
        double *mo = stats, *io = stats ? stats + rows : NULL;
        if (wt == ENG_DTYPE_F32) layernorm_run_f32(xw, yw, sc, bi, mo, io, rows, cols, p->epsilon, c->nthreads);
        else layernorm_run_f64(xw, yw, sc, bi, mo, io, rows, cols, p->epsilon, c->nthreads);
        st = krn_red_out_done(y, yw, wt, yo, st);
        yo = 0;
        for (int j = 1; j < 3 && stats; j++)
            if (j < c->nout && c->out[j].data)
                st = st ? st : eng_convert(stats + (j - 1) * rows, ENG_DTYPE_F64, c->out[j].data, c->out[j].dtype, rows);
    }
    if (yo) eng_free(yw);
    if (xo) eng_free(xw);
    if (so) eng_free(sc);
    if (bo) eng_free(bi);
    free(stats);
    return st;
}
