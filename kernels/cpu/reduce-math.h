/* reduce-math.h - vectorisable math helpers shared by the CPU reduce-family kernels (internal header).
 *
 * krn_red_expf: exp(x) for float with ~2 ulp relative error over [-87, 88] (inputs are clamped to that range,
 * so exp(-inf) gives ~1e-38 rather than 0), written with plain arithmetic so that gcc vectorises loops that
 * call it (AVX-512 under -O3 -march=native). Also the collapsed-shape description the reduction kernels walk.
 */
#ifndef KRN_CPU_REDUCE_MATH_H
#define KRN_CPU_REDUCE_MATH_H

#include <stdint.h>
#include <string.h>

#include "../../engine/ir/tensor.h"

static inline __attribute__((always_inline)) float krn_red_expf(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    /* k = round(x / ln2) via the 1.5 * 2^23 trick: the low mantissa bits of t hold k in two's complement */
    float t = x * 1.44269504089f + 12582912.0f;
    uint32_t ki;
    memcpy(&ki, &t, sizeof ki);
    float k = t - 12582912.0f;
    float r = x - k * 0.693145752f;
    r = r - k * 1.42860677e-6f;
    float p = 1.38888892e-3f;
    p = p * r + 8.33333377e-3f;
    p = p * r + 4.16666716e-2f;
    p = p * r + 1.66666672e-1f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    uint32_t e = (ki + 127u) << 23;
    float s;
    memcpy(&s, &e, sizeof s);
    return p * s;
}

#if defined(__AVX512F__)
#include <immintrin.h>
/* 16-lane exp: same polynomial as krn_red_expf, 2^k applied with vscalefps (exp(-inf) and underflow give 0). */
static inline __attribute__((always_inline)) __m512 krn_red_exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    x = _mm512_min_ps(x, _mm512_set1_ps(88.5f));
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504089f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.38888892e-3f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.33333377e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.16666716e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.66666672e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, k);
}
#endif

/* A shape with size-1 dims dropped and neighbouring dims of the same kind (reduced or kept) merged. */
typedef struct krn_red_shape {
    int nd;
    int64_t n[ENG_MAX_DIMS];
    int red[ENG_MAX_DIMS];        /* 1: reduced dim */
    int64_t istride[ENG_MAX_DIMS];/* input element strides */
    int64_t ostride[ENG_MAX_DIMS];/* output element strides, 0 on reduced dims */
    int64_t count;                /* elements reduced into each output */
    int64_t out_numel;
} krn_red_shape;

static inline void krn_red_shape_init(krn_red_shape *s, const int64_t *dims, int ndim, unsigned mask) {
    s->nd = 0;
    s->count = 1;
    s->out_numel = 1;
    for (int d = 0; d < ndim; d++) {
        int r = (mask >> d) & 1u;
        if (r) s->count *= dims[d];
        else s->out_numel *= dims[d];
        if (dims[d] == 1) continue;
        if (s->nd > 0 && s->red[s->nd - 1] == r) {
            s->n[s->nd - 1] *= dims[d];
        } else {
            s->n[s->nd] = dims[d];
            s->red[s->nd] = r;
            s->nd++;
        }
    }
    int64_t is = 1, os = 1;
    for (int d = s->nd - 1; d >= 0; d--) {
        s->istride[d] = is;
        is *= s->n[d];
        s->ostride[d] = s->red[d] ? 0 : os;
        if (!s->red[d]) os *= s->n[d];
    }
}

/* The type a kernel computes in: f64 for f64, f32 for other floats, i64 for integers. */
static inline eng_dtype krn_red_work_dtype(eng_dtype dt) {
    if (dt == ENG_DTYPE_F64) return ENG_DTYPE_F64;
    if (eng_dtype_is_float(dt)) return ENG_DTYPE_F32;
    return ENG_DTYPE_I64;
}

/* t's data in dtype wt: t->data itself when it already is, else a converted eng_alloc'd copy (*owned = 1).
 * NULL on failure, with the error recorded. */
static inline void *krn_red_as(const eng_tensor *t, eng_dtype wt, int *owned) {
    *owned = 0;
    if (t->dtype == wt) return t->data;
    int64_t n = eng_tensor_numel(t);
    void *w = eng_alloc((size_t)(n > 0 ? n : 1) * eng_dtype_size(wt));
    if (!w) {
        eng_err(ENG_STATUS_OUT_OF_MEMORY, "scratch copy of %lld elements", (long long)n);
        return NULL;
    }
    if (eng_convert(t->data, t->dtype, w, wt, n) != ENG_STATUS_OK) {
        eng_free(w);
        return NULL;
    }
    *owned = 1;
    return w;
}

/* Scratch output in dtype wt for tensor t (t->data itself when t already has dtype wt). */
static inline void *krn_red_out(eng_tensor *t, eng_dtype wt, int *owned) {
    *owned = 0;
    if (t->dtype == wt) return t->data;
    int64_t n = eng_tensor_numel(t);
    void *w = eng_alloc((size_t)(n > 0 ? n : 1) * eng_dtype_size(wt));
    if (!w) eng_err(ENG_STATUS_OUT_OF_MEMORY, "scratch output of %lld elements", (long long)n);
    *owned = w != NULL;
    return w;
}

/* Write back a scratch output made by krn_red_out and free it. */
static inline eng_status krn_red_out_done(eng_tensor *t, void *w, eng_dtype wt, int owned, eng_status st) {
    if (!owned) return st;
    if (st == ENG_STATUS_OK) st = eng_convert(w, wt, t->data, t->dtype, eng_tensor_numel(t));
    eng_free(w);
    return st;
}

#endif
