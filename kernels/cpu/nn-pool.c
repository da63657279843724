/* nn-pool.c - MaxPool (with optional Indices), AveragePool, LpPool and the Global* forms on the CPU.
 *
 * One loop nest over 1-3 spatial dims (shapes padded to 3-D with 1s), parallel over (n, c) planes.
 * Padding semantics follow onnxruntime: padded cells never win a max; AveragePool divides by the number of
 * real cells, or with count_include_pad by the cells inside [-pad_begin, in + pad_end) (so ceil_mode windows
 * that run past the end padding are clipped). Indices are flat offsets into X in row-major (storage_order 0)
 * or column-major (1) spatial order, counting the batch and channel planes before them.
 * Types: float32/float64/float16 for all; int8/uint8 for MaxPool.
 */
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dnnl.h>

#include "../kernel.h"
#include "../krn-nn.h"

typedef struct pool_geo {
    int64_t planes, in[3], out[3], k[3], s[3], d[3], pb[3], pe[3];
} pool_geo;

static void pool_geo_get(const krn_pool_params *p, const eng_tensor *x, const eng_tensor *y, pool_geo *g) {
    int nsp = p->nspatial, off = 3 - nsp;
    g->planes = x->dims[0] * x->dims[1];
    for (int i = 0; i < 3; i++) g->in[i] = g->out[i] = g->k[i] = g->s[i] = g->d[i] = 1, g->pb[i] = g->pe[i] = 0;
    for (int i = 0; i < nsp; i++) {
        g->in[off + i] = x->dims[2 + i];
        g->out[off + i] = y->dims[2 + i];
        g->k[off + i] = p->kernel[i];
        g->s[off + i] = p->strides[i];
        g->d[off + i] = p->dilations[i];
        g->pb[off + i] = p->pads[i];
        g->pe[off + i] = p->pads[nsp + i];
    }
}

/* Cells of window (start o*s - pb, k cells, step d) counted by count_include_pad: inside [-pb, in + pe). */
static inline int64_t pool_padded_count(int64_t start, int64_t k, int64_t d, int64_t lo, int64_t hi) {
    int64_t n = 0;
    for (int64_t j = 0; j < k; j++) {
        int64_t i = start + j * d;
        n += i >= lo && i < hi;
    }
    return n;
}

#define POOL_IMPL(NAME, T, LOAD, STORE, LOWEST)                                                                \
    static void NAME(const krn_call *c, const pool_geo *g) {                                                   \
        const krn_pool_params *p = c->params;                                                                  \
        const T *X = c->in[0].data;                                                                            \
        T *Y = c->out[0].data;                                                                                 \
        int64_t *I = c->nout > 1 ? c->out[1].data : NULL;                                                      \
        int64_t isz = g->in[0] * g->in[1] * g->in[2], osz = g->out[0] * g->out[1] * g->out[2];                 \
        int kind = p->kind, cip = p->count_include_pad, colmaj = p->storage_order == 1;                        \
        double pw = p->p;                                                                                      \
        _Pragma("omp parallel for num_threads(c->nthreads) schedule(static) if (g->planes * osz > 4096)")      \
        for (int64_t pl = 0; pl < g->planes; pl++) {                                                           \
            const T *xp = X + pl * isz;                                                                        \
            for (int64_t o0 = 0; o0 < g->out[0]; o0++)                                                         \
                for (int64_t o1 = 0; o1 < g->out[1]; o1++)                                                     \
                    for (int64_t o2 = 0; o2 < g->out[2]; o2++) {                                               \
                        int64_t s0 = o0 * g->s[0] - g->pb[0], s1 = o1 * g->s[1] - g->pb[1];                    \
                        int64_t s2 = o2 * g->s[2] - g->pb[2];                                                  \
                        double acc = kind == KRN_POOL_MAX ? (double)(LOWEST) : 0.0;                            \
                        int64_t cnt = 0, best = -1;                                                            \
                        for (int64_t k0 = 0; k0 < g->k[0]; k0++) {                                             \
                            int64_t i0 = s0 + k0 * g->d[0];                                                    \
                            if (i0 < 0 || i0 >= g->in[0]) continue;                                            \
                            for (int64_t k1 = 0; k1 < g->k[1]; k1++) {                                         \
                                int64_t i1 = s1 + k1 * g->d[1];                                                \
                                if (i1 < 0 || i1 >= g->in[1]) continue;                                        \
                                for (int64_t k2 = 0; k2 < g->k[2]; k2++) {                                     \
                                    int64_t i2 = s2 + k2 * g->d[2];                                            \
                                    if (i2 < 0 || i2 >= g->in[2]) continue;                                    \
                                    int64_t idx = (i0 * g->in[1] + i1) * g->in[2] + i2;                        \
                                    double v = LOAD(xp[idx]);                                                  \
                                    if (kind == KRN_POOL_MAX) {                                                \
                                        if (v > acc || best < 0) acc = v, best = idx;                          \
                                    } else if (kind == KRN_POOL_AVG) acc += v;                                 \
                                    else acc += pw == 2.0 ? v * v : pow(fabs(v), pw);                          \
                                    cnt++;                                                                     \
                                }                                                                              \
                            }                                                                                  \
                        }                                                                                      \
                        int64_t oi = pl * osz + (o0 * g->out[1] + o1) * g->out[2] + o2;                        \
                        if (kind == KRN_POOL_AVG) {                                                            \
                            if (cip)                                                                           \
                                cnt = pool_padded_count(s0, g->k[0], g->d[0], -g->pb[0], g->in[0] + g->pe[0]) * \
                                      pool_padded_count(s1, g->k[1], g->d[1], -g->pb[1], g->in[1] + g->pe[1]) * \
                                      pool_padded_count(s2, g->k[2], g->d[2], -g->pb[2], g->in[2] + g->pe[2]); \
                            acc = cnt ? acc / (double)cnt : 0.0;                                               \
                        } else if (kind == KRN_POOL_LP) {                                                      \
                            acc = pw == 2.0 ? sqrt(acc) : pow(acc, 1.0 / pw);                                  \
                        }                                                                                      \
                        Y[oi] = STORE(acc);                                                                    \
                        if (I) {                                                                               \
                            int64_t bi = best < 0 ? 0 : best;                                                  \
                            if (colmaj) {                                                                      \
                                int64_t i2 = bi % g->in[2], r = bi / g->in[2];                                 \
                                int64_t i1 = r % g->in[1], i0 = r / g->in[1];                                  \
                                bi = (i2 * g->in[1] + i1) * g->in[0] + i0;                                     \
                            }                                                                                  \
                            I[oi] = pl * isz + bi;                                                             \
                        }                                                                                      \
                    }                                                                                          \
        }                                                                                                      \
    }

#define POOL_ID(v) (v)
#define POOL_F16_LOAD(v) ((double)eng_f16_to_f32(v))
#define POOL_F16_STORE(v) eng_f32_to_f16((float)(v))
#define POOL_F32_STORE(v) ((float)(v))
#define POOL_I8_STORE(v) ((int8_t)(v))
#define POOL_U8_STORE(v) ((uint8_t)(v))

POOL_IMPL(pool_ref_f64, double, POOL_ID, POOL_ID, -DBL_MAX)
POOL_IMPL(pool_ref_f16, uint16_t, POOL_F16_LOAD, POOL_F16_STORE, -65504.0)
POOL_IMPL(pool_ref_i8, int8_t, POOL_ID, POOL_I8_STORE, -128)
POOL_IMPL(pool_ref_u8, uint8_t, POOL_ID, POOL_U8_STORE, 0)
POOL_IMPL(pool_ref_f32, float, POOL_ID, POOL_F32_STORE, -FLT_MAX)

/* The common 2-D MaxPool without padding/dilation/indices whose windows lie inside X (pool_max2d_f32_fast). */
static int pool_max2d_plain_fits(const krn_call *c, const pool_geo *g) {
    const krn_pool_params *p = c->params;
    if (p->kind != KRN_POOL_MAX || c->nout > 1 || g->d[1] != 1 || g->d[2] != 1 || g->pb[1] || g->pb[2] ||
        g->in[0] != 1 || g->k[0] != 1)
        return 0;
    return (g->out[1] - 1) * g->s[1] + g->k[1] <= g->in[1] && (g->out[2] - 1) * g->s[2] + g->k[2] <= g->in[2];
}

/* Fast paths for pool_max2d_plain_fits: plain compares over each window (float32, and the uint8 / int8 MaxPool of
 * quantized CNNs, where the generic loops cost ~10x more). */
#define POOL_MAX2D_FAST(NAME, T)                                                                                   \
    static int NAME(const krn_call *c, const pool_geo *g) {                                                        \
        if (!pool_max2d_plain_fits(c, g)) return 0;                                                                \
        const T *X = c->in[0].data;                                                                                \
        T *Y = c->out[0].data;                                                                                     \
        int64_t H = g->in[1], W = g->in[2], OH = g->out[1], OW = g->out[2], KH = g->k[1], KW = g->k[2];            \
        int64_t SH = g->s[1], SW = g->s[2];                                                                        \
        _Pragma("omp parallel for num_threads(c->nthreads) schedule(static) if (g->planes * OH * OW > 16384)")    \
        for (int64_t pl = 0; pl < g->planes; pl++) {                                                               \
            const T *xp = X + pl * H * W;                                                                          \
            T *yp = Y + pl * OH * OW;                                                                              \
            for (int64_t oh = 0; oh < OH; oh++)                                                                    \
                for (int64_t ow = 0; ow < OW; ow++) {                                                              \
                    const T *w0 = xp + oh * SH * W + ow * SW;                                                      \
                    T m = w0[0];                                                                                   \
                    for (int64_t kh = 0; kh < KH; kh++)                                                            \
                        for (int64_t kw = 0; kw < KW; kw++) {                                                      \
                            T v = w0[kh * W + kw];                                                                 \
                            m = v > m ? v : m;                                                                     \
                        }                                                                                          \
                    yp[oh * OW + ow] = m;                                                                          \
                }                                                                                                  \
        }                                                                                                          \
        return 1;                                                                                                  \
    }

POOL_MAX2D_FAST(pool_max2d_f32_fast, float)
POOL_MAX2D_FAST(pool_max2d_u8_fast, uint8_t)
POOL_MAX2D_FAST(pool_max2d_i8_fast, int8_t)

/* X in the BLOCKED layout (nChw16c when C % 16 == 0, else NHWC): offset of element (n, c, h, w). */
static inline int64_t pool_blk_off(int64_t n, int64_t ch, int64_t h, int64_t w, int64_t C, int64_t H, int64_t W) {
    if (krn_nn_blocked16(C)) return (((n * (C / 16) + ch / 16) * H + h) * W + w) * 16 + ch % 16;
    return ((n * H + h) * W + w) * C + ch;
}

#ifdef __AVX512F__
/* Transpose a 16x16 float block in registers: r[i] element j becomes r[j] element i. Interleave 32-bit then
 * 64-bit elements within 128-bit lanes, then gather 128-bit lanes twice. */
static inline void krn_transpose16(__m512 *r) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) { /* r[i + k], lane L: column 4L + k of rows i..i+3 */
        __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
        __m512d c = _mm512_castps_pd(t[i + 2]), d = _mm512_castps_pd(t[i + 3]);
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0x88);
        t[4 + i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0xdd);
        t[8 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0x88);
        t[12 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0xdd);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
        r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xdd);
        r[4 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0x88);
        r[12 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0xdd);
    }
}

void krn_cpu_maxpool2d_blocked16(const float *X, float *Y, int64_t N, int64_t C, int64_t H, int64_t W, int64_t OH,
                                 int64_t OW, int64_t KH, int64_t KW, int64_t SH, int64_t SW, int nthreads) {
    int64_t CB = C / 16;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (N * CB * OH * OW > 2048)
    for (int64_t nb = 0; nb < N * CB; nb++) {
        const float *xb = X + nb * H * W * 16;
        int64_t n = nb / CB, cb = nb % CB;
        float *yb = Y + (n * C + cb * 16) * OH * OW;
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow0 = 0; ow0 < OW; ow0 += 16) { /* 16 outputs x 16 channels, transposed to 16 rows */
                int64_t cnt = OW - ow0 < 16 ? OW - ow0 : 16;
                __m512 v[16];
                for (int64_t o = 0; o < cnt; o++) {
                    const float *w0 = xb + (oh * SH * W + (ow0 + o) * SW) * 16;
                    __m512 acc = _mm512_loadu_ps(w0);
                    for (int64_t kh = 0; kh < KH; kh++)
                        for (int64_t kw = kh ? 0 : 1; kw < KW; kw++)
                            acc = _mm512_max_ps(acc, _mm512_loadu_ps(w0 + (kh * W + kw) * 16));
                    v[o] = acc;
                }
                for (int64_t o = cnt; o < 16; o++) v[o] = _mm512_setzero_ps();
                krn_transpose16(v);
                __mmask16 m = (__mmask16)((1u << cnt) - 1);
                float *yr = yb + oh * OW + ow0;
                for (int j = 0; j < 16; j++) _mm512_mask_storeu_ps(yr + j * OH * OW, m, v[j]);
            }
    }
}
#else
/* Built without AVX-512 (a portable build: ARCH=x86-64-v3, the Docker image): the same windows, 16 channels as a
 * plain loop; `acc > v ? acc : v` is _mm512_max_ps's rule, NaNs included. */
void krn_cpu_maxpool2d_blocked16(const float *X, float *Y, int64_t N, int64_t C, int64_t H, int64_t W, int64_t OH,
                                 int64_t OW, int64_t KH, int64_t KW, int64_t SH, int64_t SW, int nthreads) {
    int64_t CB = C / 16;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (N * CB * OH * OW > 2048)
    for (int64_t nb = 0; nb < N * CB; nb++) {
        const float *xb = X + nb * H * W * 16;
        int64_t n = nb / CB, cb = nb % CB;
        float *yb = Y + (n * C + cb * 16) * OH * OW;
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                const float *w0 = xb + (oh * SH * W + ow * SW) * 16;
                float acc[16];
                memcpy(acc, w0, sizeof acc);
                for (int64_t kh = 0; kh < KH; kh++)
                    for (int64_t kw = kh ? 0 : 1; kw < KW; kw++)
                        for (int j = 0; j < 16; j++) {
                            float v = w0[(kh * W + kw) * 16 + j];
                            acc[j] = acc[j] > v ? acc[j] : v;
                        }
                for (int j = 0; j < 16; j++) yb[j * OH * OW + oh * OW + ow] = acc[j];
            }
    }
}
#endif

/* nChw16c float32 MaxPool without padding/dilation, and GlobalAveragePool/GlobalMaxPool: 16 channels a vector. */
static int pool_blocked16_fast(const krn_call *c, const pool_geo *g) {
    const krn_pool_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    int64_t N = x->dims[0], C = x->dims[1], H = g->in[1], W = g->in[2], OH = g->out[1], OW = g->out[2];
    if (!krn_nn_blocked16(C) || c->nout > 1 || g->in[0] != 1) return 0;
    int gmax = p->kind == KRN_POOL_MAX, gavg = p->kind == KRN_POOL_AVG;
    if (!p->global && !(gmax && !g->pb[1] && !g->pb[2] && g->d[1] == 1 && g->d[2] == 1 &&
                        (OH - 1) * g->s[1] + g->k[1] <= H && (OW - 1) * g->s[2] + g->k[2] <= W))
        return 0;
    if (p->global && !gmax && !gavg) return 0;
    const float *X = x->data;
    float *Y = c->out[0].data;
    if (!p->global) {
        krn_cpu_maxpool2d_blocked16(X, Y, N, C, H, W, OH, OW, g->k[1], g->k[2], g->s[1], g->s[2], c->nthreads);
        return 1;
    }
    int64_t CB = C / 16;
#pragma omp parallel for num_threads(c->nthreads) schedule(static) if (N * CB > 64)
    for (int64_t nb = 0; nb < N * CB; nb++) {
        const float *xb = X + nb * H * W * 16;
        int64_t n = nb / CB, cb = nb % CB;
        float *yb = Y + (n * C + cb * 16);
#ifdef __AVX512F__
        __m512 acc = gmax ? _mm512_set1_ps(-FLT_MAX) : _mm512_setzero_ps();
        for (int64_t i = 0; i < H * W; i++) {
            __m512 v = _mm512_loadu_ps(xb + i * 16);
            acc = gmax ? _mm512_max_ps(acc, v) : _mm512_add_ps(acc, v);
        }
        if (gavg) acc = _mm512_mul_ps(acc, _mm512_set1_ps(1.f / (float)(H * W)));
        _mm512_storeu_ps(yb, acc); /* global output is [N, C, 1, 1]: 16 consecutive channels */
#else /* the same, 16 channels as a plain loop (see krn_cpu_maxpool2d_blocked16) */
        float acc[16];
        for (int j = 0; j < 16; j++) acc[j] = gmax ? -FLT_MAX : 0.f;
        for (int64_t i = 0; i < H * W; i++)
            for (int j = 0; j < 16; j++) {
                float v = xb[i * 16 + j];
                acc[j] = gmax ? (acc[j] > v ? acc[j] : v) : acc[j] + v;
            }
        for (int j = 0; j < 16; j++) yb[j] = gavg ? acc[j] * (1.f / (float)(H * W)) : acc[j];
#endif
    }
    return 1;
}

/* Copy a BLOCKED 4-D float32 X into plain NCHW. */
static void pool_unblock(const eng_tensor *x, float *dst, int nthreads) {
    int64_t N = x->dims[0], C = x->dims[1], H = x->dims[2], W = x->dims[3];
    const float *X = x->data;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t nc = 0; nc < N * C; nc++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t w = 0; w < W; w++)
                dst[(nc * H + h) * W + w] = X[pool_blk_off(nc / C, nc % C, h, w, C, H, W)];
}

/* ---- BLOCKED -> BLOCKED (non-global; the layout pass only asks for it with a BLOCKED X): a oneDNN pooling
 * primitive in the activation's layout, or, where oneDNN has no fast kernel for it, the plain result of the
 * paths below reordered into the blocked layout (a counted reorder). Global pools write [N,C,1,1], the same
 * bytes in every layout, so they need neither. ---- */

typedef struct pool_state {
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t prim;
    dnnl_memory_t msrc, mdst, mscratch;
    krn_dnnl_reorder rdst; /* fallback: plain tmp -> blocked Y */
    float *tmp;
    char desc[160];
} pool_state;

void krn_cpu_pool_free(void *v) {
    pool_state *s = v;
    if (!s) return;
    if (s->prim) dnnl_primitive_destroy(s->prim);
    if (s->pd) dnnl_primitive_desc_destroy(s->pd);
    if (s->msrc) dnnl_memory_destroy(s->msrc);
    if (s->mdst) dnnl_memory_destroy(s->mdst);
    if (s->mscratch) dnnl_memory_destroy(s->mscratch);
    krn_dnnl_reorder_free(&s->rdst);
    eng_free(s->tmp);
    free(s);
}

/* oneDNN pooling with X and Y both in `tag` (nChw16c / NHWC for BLOCKED, NCHW for plain). UNSUPPORTED when
 * oneDNN has only its reference kernel or cannot express the pads (count_include_pad with ceil_mode). */
static eng_status pool_dnnl_build(krn_call *c, pool_state *s, dnnl_format_tag_t tag) {
    const krn_pool_params *p = c->params;
    const eng_tensor *x = &c->in[0], *y = &c->out[0];
    if (p->kind == KRN_POOL_LP || p->nspatial != 2) return ENG_STATUS_UNSUPPORTED;
    dnnl_dims_t sd, dd, st, kd, dl, pl, pr;
    for (int i = 0; i < 4; i++) sd[i] = x->dims[i], dd[i] = y->dims[i];
    for (int i = 0; i < 2; i++) {
        int64_t ext = (p->kernel[i] - 1) * p->dilations[i] + 1;
        st[i] = p->strides[i], kd[i] = p->kernel[i], dl[i] = p->dilations[i] - 1;
        pl[i] = p->pads[i], pr[i] = p->pads[2 + i];
        if ((sd[2 + i] + pl[i] + pr[i] - ext) / st[i] + 1 != dd[2 + i]) { /* ceil_mode: extend the end padding */
            if (p->kind == KRN_POOL_AVG && p->count_include_pad) return ENG_STATUS_UNSUPPORTED;
            pr[i] = (dd[2 + i] - 1) * st[i] + ext - sd[2 + i] - pl[i];
        }
    }
    dnnl_memory_desc_t smd, dmd;
    dnnl_data_type_t dt = x->dtype == ENG_DTYPE_U8 ? dnnl_u8 : x->dtype == ENG_DTYPE_I8 ? dnnl_s8
                          : x->dtype == ENG_DTYPE_BF16 ? dnnl_bf16 : dnnl_f32;
    if (dt != dnnl_f32 && p->kind != KRN_POOL_MAX) return ENG_STATUS_UNSUPPORTED; /* integer averages: ONNX rounds differently */
    dnnl_data_type_t ddt = y->dtype == ENG_DTYPE_BF16 ? dnnl_bf16 : y->dtype == ENG_DTYPE_F32 && dt == dnnl_bf16 ? dnnl_f32 : dt;
    KRN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&smd, 4, sd, dt, tag));
    KRN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&dmd, 4, dd, ddt, tag));
    dnnl_alg_kind_t alg = p->kind == KRN_POOL_MAX ? dnnl_pooling_max
                          : p->count_include_pad ? dnnl_pooling_avg_include_padding : dnnl_pooling_avg_exclude_padding;
    dnnl_pooling_v2_desc_t pdsc;
    KRN_DNNL_CHECK(dnnl_pooling_v2_forward_desc_init(&pdsc, dnnl_forward_inference, alg, &smd, &dmd, st, kd, dl, pl, pr));
    ENG_TRY(krn_dnnl_prim(&pdsc, NULL, NULL, &s->pd, &s->prim, &s->mscratch));
    if (krn_dnnl_is_ref(s->pd)) return ENG_STATUS_UNSUPPORTED;
    dnnl_engine_t eng;
    ENG_TRY(krn_dnnl_engine(&eng));
    KRN_DNNL_CHECK(dnnl_memory_create(&s->msrc, &smd, eng, DNNL_MEMORY_NONE));
    KRN_DNNL_CHECK(dnnl_memory_create(&s->mdst, &dmd, eng, DNNL_MEMORY_NONE));
    char t[32];
    krn_dnnl_md_str(&smd, t, sizeof t);
    snprintf(s->desc, sizeof s->desc, "%s src %s dst %s", krn_dnnl_impl_name(s->pd), t, t);
    return ENG_STATUS_OK;
}

eng_status krn_cpu_pool_init(krn_call *c) {
    const krn_pool_params *p = c->params;
    int int8 = c->in[0].dtype == ENG_DTYPE_U8 || c->in[0].dtype == ENG_DTYPE_I8; /* int8 stems' MaxPool */
    if (p->global || c->nout > 1 || eng_tensor_numel(&c->out[0]) == 0 ||
        (c->in[0].dtype != ENG_DTYPE_F32 && c->in[0].dtype != ENG_DTYPE_BF16 && !int8))
        return ENG_STATUS_OK;
    if (p->x_layout == KRN_NN_LAYOUT_NHWC || p->y_layout == KRN_NN_LAYOUT_NHWC) { /* the int8 layout pass's stem */
        if (!int8 || p->x_layout != p->y_layout || p->nspatial != 2)
            return eng_err(ENG_STATUS_INTERNAL, "channels-last pooling is for 2-D uint8/int8 MaxPool in and out");
        pool_state *s = calloc(1, sizeof *s);
        if (!s) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "pool state");
        krn_dnnl_set_threads(c->nthreads);
        eng_status st = pool_dnnl_build(c, s, dnnl_nhwc);
        if (st != ENG_STATUS_OK) {
            krn_cpu_pool_free(s);
            return eng_err_prefix(st, "int8 MaxPool, channels last: ");
        }
        c->state = s;
        return ENG_STATUS_OK;
    }
    if (p->y_layout != KRN_NN_LAYOUT_BLOCKED) {
        /* plain -> plain 2-D pools that the fast loop does not take (padding, AveragePool): oneDNN's kernel */
        pool_geo g;
        pool_geo_get(p, &c->in[0], &c->out[0], &g);
        if (p->x_layout != KRN_NN_LAYOUT_PLAIN || p->nspatial != 2 || pool_max2d_plain_fits(c, &g)) return ENG_STATUS_OK;
        pool_state *s = calloc(1, sizeof *s);
        if (!s) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "pool state");
        krn_dnnl_set_threads(c->nthreads);
        eng_status st = pool_dnnl_build(c, s, dnnl_nchw);
        if (st == ENG_STATUS_OK) c->state = s;
        else krn_cpu_pool_free(s);
        if (st == ENG_STATUS_OUT_OF_MEMORY) return st;
        eng_err_clear();
        return ENG_STATUS_OK;
    }
    int bf16 = c->in[0].dtype == ENG_DTYPE_BF16 || c->out[0].dtype == ENG_DTYPE_BF16; /* krn_cpu_pool_io_ok's case */
    if ((c->in[0].dtype != ENG_DTYPE_F32 && c->in[0].dtype != ENG_DTYPE_BF16) || c->in[0].ndim != 4 ||
        p->x_layout != KRN_NN_LAYOUT_BLOCKED)
        return eng_err(ENG_STATUS_INTERNAL, "blocked pool output needs a blocked 4-D float32 or bfloat16 input");
    pool_state *s = calloc(1, sizeof *s);
    if (!s) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "pool state");
    c->state = s;
    krn_dnnl_set_threads(c->nthreads);
    eng_status st = pool_dnnl_build(c, s, krn_nn_blocked16(c->in[0].dims[1]) ? dnnl_nChw16c : dnnl_nhwc);
    if (st == ENG_STATUS_OK) return st;
    if (st == ENG_STATUS_OUT_OF_MEMORY) return st;
    if (bf16) return eng_err_prefix(st != ENG_STATUS_OK ? st : ENG_STATUS_UNSUPPORTED, "bf16 pooling: ");
    eng_err_clear();
    krn_cpu_pool_free(s);
    s = calloc(1, sizeof *s);
    c->state = s;
    if (!s) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "pool state");
    const eng_tensor *y = &c->out[0];
    dnnl_dims_t dd;
    for (int i = 0; i < 4; i++) dd[i] = y->dims[i];
    dnnl_memory_desc_t pmd, bmd;
    KRN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&pmd, 4, dd, dnnl_f32, dnnl_nchw));
    KRN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&bmd, 4, dd, dnnl_f32, krn_nn_blocked16(dd[1]) ? dnnl_nChw16c : dnnl_nhwc));
    ENG_TRY(krn_dnnl_reorder_init(&s->rdst, &pmd, &bmd));
    if (!(s->tmp = eng_alloc(eng_tensor_nbytes(y)))) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "pool: blocked output");
    snprintf(s->desc, sizeof s->desc, "tensord loops +reorder(dst)");
    return ENG_STATUS_OK;
}

/* io_ok (kernel.h): a 2-D pool in the blocked layout with bf16 in and out runs on oneDNN's bf16 pooling (2:
 * natively). */
int krn_cpu_pool_io_ok(const krn_call *c, eng_dtype dt) {
    const krn_pool_params *p = c->params;
    return 2 * (dt == ENG_DTYPE_BF16 && p && !p->global && c->nout == 1 && p->nspatial == 2 && p->kind != KRN_POOL_LP &&
           p->x_layout == KRN_NN_LAYOUT_BLOCKED && p->y_layout == KRN_NN_LAYOUT_BLOCKED &&
           (c->in[0].dtype == ENG_DTYPE_F32 || c->in[0].dtype == ENG_DTYPE_BF16) &&
           (c->out[0].dtype == ENG_DTYPE_F32 || c->out[0].dtype == ENG_DTYPE_BF16));
}

void krn_cpu_pool_describe(const krn_call *c, krn_impl_info *info) {
    const pool_state *s = c->state;
    memset(info, 0, sizeof *info);
    if (s) {
        snprintf(info->impl, sizeof info->impl, "%s", s->desc);
        info->reorders = s->rdst.prim != NULL;
    } else {
        const krn_pool_params *p = c->params;
        snprintf(info->impl, sizeof info->impl, "tensord loops%s", p->x_layout == KRN_NN_LAYOUT_BLOCKED ? " (blocked X)" : "");
    }
}

static eng_status pool_exec_plain_y(krn_call *c);

eng_status krn_cpu_pool_exec(krn_call *c) {
    pool_state *s = c->state;
    if (!s || eng_tensor_numel(&c->out[0]) == 0) return pool_exec_plain_y(c);
    dnnl_stream_t stream;
    ENG_TRY(krn_dnnl_stream(&stream));
    krn_dnnl_set_threads(c->nthreads);
    if (s->prim) {
        KRN_DNNL_CHECK(dnnl_memory_set_data_handle(s->msrc, c->in[0].data));
        KRN_DNNL_CHECK(dnnl_memory_set_data_handle(s->mdst, c->out[0].data));
        dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, s->msrc}, {DNNL_ARG_DST, s->mdst}};
        int na = 2;
        if (s->mscratch) args[na].arg = DNNL_ARG_SCRATCHPAD, args[na++].memory = s->mscratch;
        KRN_DNNL_CHECK(dnnl_primitive_execute(s->prim, stream, na, args));
    } else {
        eng_tensor yt = c->out[0];
        yt.data = s->tmp;
        krn_call c2 = *c;
        c2.out = &yt;
        c2.state = NULL;
        ENG_TRY(pool_exec_plain_y(&c2));
        ENG_TRY(krn_dnnl_reorder_run(&s->rdst, stream, s->tmp, c->out[0].data));
    }
    KRN_DNNL_CHECK(dnnl_stream_wait(stream));
    return ENG_STATUS_OK;
}

/* Y in plain NCHW (or a Global* output, the same bytes in every layout); X plain or BLOCKED. */
static eng_status pool_exec_plain_y(krn_call *c) {
    const krn_pool_params *p = c->params;
    pool_geo g;
    pool_geo_get(p, &c->in[0], &c->out[0], &g);
    if (eng_tensor_numel(&c->out[0]) == 0) return ENG_STATUS_OK;
    if (p->x_layout == KRN_NN_LAYOUT_BLOCKED) {
        if (c->in[0].dtype != ENG_DTYPE_F32 || c->in[0].ndim != 4)
            return eng_err(ENG_STATUS_INTERNAL, "blocked pool input must be 4-D float32");
        if (pool_blocked16_fast(c, &g)) return ENG_STATUS_OK;
        float *tmp = eng_alloc(eng_tensor_nbytes(&c->in[0]));
        if (!tmp) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "pool: unblocking X");
        pool_unblock(&c->in[0], tmp, c->nthreads);
        eng_tensor xin = c->in[0];
        xin.data = tmp;
        krn_pool_params pp = *p;
        pp.x_layout = KRN_NN_LAYOUT_PLAIN;
        krn_call c2 = *c;
        c2.in = &xin;
        c2.params = &pp;
        eng_status st = pool_exec_plain_y(&c2);
        eng_free(tmp);
        return st;
    }
    switch (c->in[0].dtype) {
    case ENG_DTYPE_F32:
        if (!pool_max2d_f32_fast(c, &g)) pool_ref_f32(c, &g);
        break;
    case ENG_DTYPE_F64: pool_ref_f64(c, &g); break;
    case ENG_DTYPE_F16: pool_ref_f16(c, &g); break;
    case ENG_DTYPE_I8:
        if (!pool_max2d_i8_fast(c, &g)) pool_ref_i8(c, &g);
        break;
    case ENG_DTYPE_U8:
        if (!pool_max2d_u8_fast(c, &g)) pool_ref_u8(c, &g);
        break;
    default: return eng_err(ENG_STATUS_UNSUPPORTED, "pool dtype %s", eng_dtype_name(c->in[0].dtype));
    }
    return ENG_STATUS_OK;
}
