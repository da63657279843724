/* quant.c - CPU reference kernels of the "quant" family (see kernels/krn-quant.h for the formulas).
 *
 * Plain C, written to be read and to match ONNX's reference implementation bit for bit:
 *   - rounding is round-half-to-even (nearbyint under the default FE_TONEAREST mode), then saturation to the
 *     output type's range; NaN quantizes to the zero point;
 *   - QuantizeLinear divides in float32 (x / scale), as ONNX and onnxruntime do;
 *   - the integer matmul/conv subtract zero points once into int32 copies of the operands, accumulate in int64
 *     and store int32; QLinear* requantize in double with the float32 multiplier (s_in * s_w) / s_y, which is
 *     what numpy computes for ONNX's reference (int32 * float32 promotes to float64).
 * MatMulInteger / ConvInteger / QLinear* normally run on oneDNN's int8 primitives (quant-dnnl.c); these loops
 * are their reference and their fallback.
 * Per-channel tensors are read through q_at (one element: per tensor). Kernels only see shapes engine/ops/quant.c
 * checked; they still refuse what they cannot index rather than read out of bounds.
 */
#ifdef __AVX512F__
#include <immintrin.h>
#endif
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernel.h"
#include "../krn-quant.h"

/* Element i of an integer or float32 tensor, or element 0 when it has one element; 0 when omitted. */
static inline int32_t q_at_i(const eng_tensor *t, int64_t i) {
    if (!t->data) return 0;
    if (eng_tensor_numel(t) == 1) i = 0;
    switch (t->dtype) {
    case ENG_DTYPE_U8: return ((const uint8_t *)t->data)[i];
    case ENG_DTYPE_I8: return ((const int8_t *)t->data)[i];
    case ENG_DTYPE_I32: return ((const int32_t *)t->data)[i];
    default: return 0;
    }
}
static inline float q_at_f(const eng_tensor *t, int64_t i) {
    if (eng_tensor_numel(t) == 1) i = 0;
    return ((const float *)t->data)[i];
}

static void q_range(eng_dtype dt, int32_t *lo, int32_t *hi) {
    if (dt == ENG_DTYPE_I8) *lo = -128, *hi = 127;
    else *lo = 0, *hi = 255;
}

/* round_half_even(v) + zp, saturated to [lo, hi]; NaN gives zp. */
static inline int32_t q_round_sat(double v, int32_t zp, int32_t lo, int32_t hi) {
    if (v != v) return zp < lo ? lo : zp > hi ? hi : zp;
    double r = nearbyint(v) + zp;
    return r < lo ? lo : r > hi ? hi : (int32_t)r;
}

static inline void q_store(eng_tensor *t, int64_t i, int32_t v) {
    if (t->dtype == ENG_DTYPE_I8) ((int8_t *)t->data)[i] = (int8_t)v;
    else ((uint8_t *)t->data)[i] = (uint8_t)v;
}

/* y[0..n) = saturate(round_half_even(x / sc) + zp) as int8 (s8) or uint8; NaN gives zp. The float32 division,
 * rounding and saturation of q_round_sat, 16 at a time: bit-identical to it (the +zp is exact in float while
 * |x / sc| < 2^24, and beyond that both saturate). */
static void q_quantize_run(const float *x, void *y, int64_t n, float sc, int32_t zp, int s8) {
    int32_t lo = s8 ? -128 : 0, hi = s8 ? 127 : 255;
    int64_t i = 0;
#ifdef __AVX512F__
    const __m512 vs = _mm512_set1_ps(sc), vz = _mm512_set1_ps((float)zp), vlo = _mm512_set1_ps((float)lo),
                 vhi = _mm512_set1_ps((float)hi);
    const __m512 vzs = _mm512_set1_ps((float)(zp < lo ? lo : zp > hi ? hi : zp));
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_div_ps(_mm512_loadu_ps(x + i), vs);
        __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        v = _mm512_add_ps(_mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), vz);
        v = _mm512_mask_mov_ps(_mm512_min_ps(_mm512_max_ps(v, vlo), vhi), nan, vzs);
        _mm_storeu_si128((__m128i *)((char *)y + i), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
    }
#endif
    for (; i < n; i++) {
        int32_t q = q_round_sat(x[i] / sc, zp, lo, hi);
        if (s8) ((int8_t *)y)[i] = (int8_t)q;
        else ((uint8_t *)y)[i] = (uint8_t)q;
    }
}

/* y[0..n) = (x - zp) * sc for 8-bit x (int8 when s8), as the formula (exact int subtraction, one float32 rounding
 * of the product), 16 at a time. */
static void q_dequantize_run(const void *x, float *y, int64_t n, float sc, int32_t zp, int s8) {
    int64_t i = 0;
#ifdef __AVX512F__
    const __m512 vs = _mm512_set1_ps(sc);
    const __m512i vz = _mm512_set1_epi32(zp);
    for (; i + 16 <= n; i += 16) {
        __m128i b = _mm_loadu_si128((const __m128i *)((const char *)x + i));
        __m512i v = _mm512_sub_epi32(s8 ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b), vz);
        _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_cvtepi32_ps(v), vs));
    }
#endif
    for (; i < n; i++) y[i] = (float)((s8 ? ((const int8_t *)x)[i] : ((const uint8_t *)x)[i]) - zp) * sc;
}

/* Split x's elements around `axis` (-1: none): outer x C x inner. */
static void q_axis_split(const eng_tensor *x, int axis, int64_t *outer, int64_t *C, int64_t *inner) {
    *outer = 1, *C = 1, *inner = 1;
    if (axis < 0) {
        *inner = eng_tensor_numel(x);
        return;
    }
    for (int d = 0; d < x->ndim; d++) {
        if (d < axis) *outer *= x->dims[d];
        else if (d > axis) *inner *= x->dims[d];
    }
    *C = x->dims[axis];
}

/* ---------------------------------------------------------------- QuantizeLinear / DequantizeLinear */

static eng_status q_quantize_exec(krn_call *c) {
    const krn_qdq_params *p = c->params;
    const eng_tensor *x = &c->in[0], *s = &c->in[1], *z = c->nin > 2 ? &c->in[2] : NULL;
    eng_tensor *y = &c->out[0];
    int32_t lo, hi;
    q_range(y->dtype, &lo, &hi);
    int64_t outer, C, inner;
    q_axis_split(x, p->axis, &outer, &C, &inner);
    const float *xd = x->data;
    int s8 = y->dtype == ENG_DTYPE_I8;
    (void)lo, (void)hi;
    if (outer * C == 1) { /* per tensor: chunks of the flat run across threads */
        const int64_t chunk = 1 << 16, nch = (inner + chunk - 1) / chunk;
        float sc = q_at_f(s, 0);
        int32_t zp = z ? q_at_i(z, 0) : 0;
#pragma omp parallel for num_threads(c->nthreads > 0 ? c->nthreads : 1) if (nch > 1) schedule(static)
        for (int64_t k = 0; k < nch; k++) {
            int64_t b = k * chunk, e = b + chunk < inner ? b + chunk : inner;
            q_quantize_run(xd + b, (char *)y->data + b, e - b, sc, zp, s8);
        }
        return ENG_STATUS_OK;
    }
    for (int64_t o = 0; o < outer; o++)
        for (int64_t ch = 0; ch < C; ch++) {
            int64_t base = (o * C + ch) * inner;
            q_quantize_run(xd + base, (char *)y->data + base, inner, q_at_f(s, ch), z ? q_at_i(z, ch) : 0, s8);
        }
    return ENG_STATUS_OK;
}

static eng_status q_dequantize_exec(krn_call *c) {
    const krn_qdq_params *p = c->params;
    const eng_tensor *x = &c->in[0], *s = &c->in[1], *z = c->nin > 2 ? &c->in[2] : NULL;
    float *yd = c->out[0].data;
    int64_t outer, C, inner;
    q_axis_split(x, p->axis, &outer, &C, &inner);
    if (x->dtype == ENG_DTYPE_U8 || x->dtype == ENG_DTYPE_I8) { /* 8-bit: the vector runs */
        int s8 = x->dtype == ENG_DTYPE_I8;
        for (int64_t o = 0; o < outer; o++)
            for (int64_t ch = 0; ch < C; ch++) {
                int64_t base = (o * C + ch) * inner;
                q_dequantize_run((const char *)x->data + base, yd + base, inner, q_at_f(s, ch), z ? q_at_i(z, ch) : 0, s8);
            }
        return ENG_STATUS_OK;
    }
    for (int64_t o = 0; o < outer; o++)
        for (int64_t ch = 0; ch < C; ch++) {
            float sc = q_at_f(s, ch);
            int64_t zp = z ? q_at_i(z, ch) : 0, base = (o * C + ch) * inner;
            for (int64_t j = 0; j < inner; j++) yd[base + j] = (float)((int64_t)q_at_i(x, base + j) - zp) * sc;
        }
    return ENG_STATUS_OK;
}

/* ---------------------------------------------------------------- DynamicQuantizeLinear */

static eng_status q_dynamic_exec(krn_call *c) {
    const eng_tensor *x = &c->in[0];
    const float *xd = x->data;
    int64_t n = eng_tensor_numel(x);
    float mn = 0.f, mx = 0.f; /* the range always includes 0 */
    for (int64_t i = 0; i < n; i++) {
        if (xd[i] < mn) mn = xd[i];
        if (xd[i] > mx) mx = xd[i];
    }
    float scale = (mx == mn ? 1.f : mx - mn) / 255.f;
    float zpf = 0.f - mn / scale;
    zpf = zpf < 0.f ? 0.f : zpf > 255.f ? 255.f : zpf;
    int32_t zp = (int32_t)nearbyintf(zpf);
    uint8_t *yd = c->out[0].data;
    for (int64_t i = 0; i < n; i++) yd[i] = (uint8_t)q_round_sat(xd[i] / scale, zp, 0, 255);
    if (c->nout > 1 && c->out[1].data) *(float *)c->out[1].data = scale;
    if (c->nout > 2 && c->out[2].data) *(uint8_t *)c->out[2].data = (uint8_t)zp;
    return ENG_STATUS_OK;
}

/* ---------------------------------------------------------------- MatMulInteger / QLinearMatMul */

/* x - zp into a fresh int32 buffer; zp is per tensor, or per index (i / inner) % C when it has C elements. */
static int32_t *q_widen(const eng_tensor *x, const eng_tensor *zp, int64_t C, int64_t inner) {
    int64_t n = eng_tensor_numel(x);
    int32_t *w = eng_alloc((size_t)(n > 0 ? n : 1) * sizeof *w);
    if (!w) return NULL;
    int per = zp && zp->data && eng_tensor_numel(zp) > 1;
    for (int64_t i = 0; i < n; i++) w[i] = q_at_i(x, i) - (zp ? q_at_i(zp, per ? (i / inner) % C : 0) : 0);
    return w;
}

eng_status krn_cpu_qmatmul_ref(krn_call *c) {
    const krn_qmatmul_params *p = c->params;
    int ia = 0, ib = p->qlinear ? 3 : 1;
    const eng_tensor *A = &c->in[ia], *B = &c->in[ib];
    eng_tensor *Y = &c->out[0];
    const eng_tensor *azp = p->to_float ? (c->nin > 4 ? &c->in[4] : NULL) : c->nin > 2 ? &c->in[2] : NULL;
    const eng_tensor *bzp = p->qlinear || p->to_float ? (c->nin > 5 ? &c->in[5] : NULL) : c->nin > 3 ? &c->in[3] : NULL;
    int64_t K = A->dims[A->ndim - 1];
    int64_t M = A->ndim >= 2 ? A->dims[A->ndim - 2] : 1, N = B->ndim >= 2 ? B->dims[B->ndim - 1] : 1;
    /* batch dims, right-aligned to rank r */
    int r = 0, na = A->ndim > 2 ? A->ndim - 2 : 0, nb = B->ndim > 2 ? B->ndim - 2 : 0;
    r = na > nb ? na : nb;
    int64_t ab[ENG_MAX_DIMS], bb[ENG_MAX_DIMS], yb[ENG_MAX_DIMS], nbatch = 1;
    for (int d = 0; d < r; d++) {
        ab[d] = d < r - na ? 1 : A->dims[d - (r - na)];
        bb[d] = d < r - nb ? 1 : B->dims[d - (r - nb)];
        yb[d] = ab[d] > bb[d] ? ab[d] : bb[d];
        nbatch *= yb[d];
    }
    if (eng_tensor_numel(Y) != nbatch * M * N)
        return eng_err(ENG_STATUS_INTERNAL, "integer matmul: output has %lld elements, expected %lld",
                       (long long)eng_tensor_numel(Y), (long long)(nbatch * M * N));
    int32_t *a = q_widen(A, azp, M, K), *b = q_widen(B, bzp, N, 1);
    int64_t *acc = eng_alloc((size_t)(N > 0 ? N : 1) * sizeof *acc);
    if (!a || !b || !acc) {
        eng_free(a), eng_free(b), eng_free(acc);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "integer matmul operands");
    }
    int32_t lo = 0, hi = 0;
    if (p->qlinear) q_range(Y->dtype, &lo, &hi);
    for (int64_t bi = 0; bi < nbatch; bi++) {
        const int32_t *am = a + krn_q_batch_off(ab, yb, r, bi) * M * K;
        const int32_t *bm = b + krn_q_batch_off(bb, yb, r, bi) * K * N;
        for (int64_t i = 0; i < M; i++) {
            memset(acc, 0, (size_t)N * sizeof *acc);
            for (int64_t k = 0; k < K; k++) { /* row of A times rows of B: streams B, no transposes */
                int64_t av = am[i * K + k];
                const int32_t *brow = bm + k * N;
                if (av)
                    for (int64_t j = 0; j < N; j++) acc[j] += av * brow[j];
            }
            int64_t yo = (bi * M + i) * N;
            if (p->to_float) { /* float32 (acc * a_scale) * b_scale[j] + bias[j] */
                const eng_tensor *bias = c->nin > 6 && c->in[6].data ? &c->in[6] : NULL;
                float as = q_at_f(&c->in[2], 0);
                for (int64_t j = 0; j < N; j++)
                    ((float *)Y->data)[yo + j] = (float)acc[j] * (as * q_at_f(&c->in[3], j)) + (bias ? q_at_f(bias, j) : 0.f);
                krn_nn_act_apply_f32((float *)Y->data + yo, N, &p->act, 1);
                continue;
            }
            if (!p->qlinear) {
                for (int64_t j = 0; j < N; j++) ((int32_t *)Y->data)[yo + j] = (int32_t)acc[j];
                continue;
            }
            float as = q_at_f(&c->in[1], i), ys = q_at_f(&c->in[6], 0);
            int32_t yzp = q_at_i(&c->in[7], 0);
            for (int64_t j = 0; j < N; j++) {
                float mult = as * q_at_f(&c->in[4], j) / ys;
                q_store(Y, yo + j, q_round_sat((double)acc[j] * (double)mult, yzp, lo, hi));
            }
        }
    }
    eng_free(a), eng_free(b), eng_free(acc);
    return ENG_STATUS_OK;
}

/* ---------------------------------------------------------------- ConvInteger / QLinearConv */

/* Direct convolution of int32 x (N, C, spatial...) with int32 w (M, C/group, kernel...) into int64 acc for one
 * (n, m) output plane; spatial dims are padded to 3 with size-1 dims in front. */
typedef struct q_conv_geom {
    int64_t N, C, M, G, in[3], out[3], k[3], s[3], d[3], pb[3];
} q_conv_geom;

static void q_conv_plane(const q_conv_geom *g, const int32_t *x, const int32_t *w, int64_t n, int64_t m, int64_t *acc) {
    int64_t cg = g->C / g->G, mg = g->M / g->G, grp = m / mg;
    int64_t osz = g->out[0] * g->out[1] * g->out[2], isz = g->in[0] * g->in[1] * g->in[2], ksz = g->k[0] * g->k[1] * g->k[2];
    memset(acc, 0, (size_t)osz * sizeof *acc);
    for (int64_t ci = 0; ci < cg; ci++) {
        const int32_t *xp = x + (n * g->C + grp * cg + ci) * isz, *wp = w + (m * cg + ci) * ksz;
        for (int64_t o0 = 0; o0 < g->out[0]; o0++)
            for (int64_t o1 = 0; o1 < g->out[1]; o1++)
                for (int64_t o2 = 0; o2 < g->out[2]; o2++) {
                    int64_t sum = 0;
                    for (int64_t k0 = 0; k0 < g->k[0]; k0++) {
                        int64_t i0 = o0 * g->s[0] - g->pb[0] + k0 * g->d[0];
                        if (i0 < 0 || i0 >= g->in[0]) continue;
                        for (int64_t k1 = 0; k1 < g->k[1]; k1++) {
                            int64_t i1 = o1 * g->s[1] - g->pb[1] + k1 * g->d[1];
                            if (i1 < 0 || i1 >= g->in[1]) continue;
                            for (int64_t k2 = 0; k2 < g->k[2]; k2++) {
                                int64_t i2 = o2 * g->s[2] - g->pb[2] + k2 * g->d[2];
                                if (i2 < 0 || i2 >= g->in[2]) continue;
                                sum += (int64_t)xp[(i0 * g->in[1] + i1) * g->in[2] + i2] *
                                       wp[(k0 * g->k[1] + k1) * g->k[2] + k2];
                            }
                        }
                    }
                    acc[(o0 * g->out[1] + o1) * g->out[2] + o2] += sum;
                }
    }
}

eng_status krn_cpu_qconv_ref(krn_call *c) {
    const krn_qconv_params *p = c->params;
    const krn_conv_params *k = &p->conv;
    int ix = 0, iw = p->qlinear ? 3 : 1;
    const eng_tensor *X = &c->in[ix], *W = &c->in[iw];
    eng_tensor *Y = &c->out[0];
    const eng_tensor *xzp = c->nin > 2 ? &c->in[2] : NULL, *wzp = p->qlinear ? &c->in[5] : c->nin > 3 ? &c->in[3] : NULL;
    int nsp = k->nspatial;
    if (nsp < 1 || nsp > 3 || X->ndim != nsp + 2 || W->ndim != nsp + 2 || Y->ndim != nsp + 2 || k->transposed)
        return eng_err(ENG_STATUS_INTERNAL, "integer conv: ranks X %d, W %d, Y %d do not match %d spatial dims",
                       X->ndim, W->ndim, Y->ndim, nsp);
    q_conv_geom g = {.N = X->dims[0], .C = X->dims[1], .M = W->dims[0], .G = k->group};
    if (g.G < 1 || g.C % g.G || g.M % g.G || W->dims[1] * g.G != g.C)
        return eng_err(ENG_STATUS_INTERNAL, "integer conv: channels do not match group %lld", (long long)g.G);
    for (int i = 0; i < 3; i++) {
        int s = i - (3 - nsp); /* spatial index, < 0 for the padding dims */
        g.in[i] = s < 0 ? 1 : X->dims[2 + s];
        g.out[i] = s < 0 ? 1 : Y->dims[2 + s];
        g.k[i] = s < 0 ? 1 : W->dims[2 + s];
        g.s[i] = s < 0 ? 1 : k->strides[s];
        g.d[i] = s < 0 ? 1 : k->dilations[s];
        g.pb[i] = s < 0 ? 0 : k->pads[s];
    }
    int64_t osz = g.out[0] * g.out[1] * g.out[2], wper = eng_tensor_numel(W) / (g.M ? g.M : 1);
    int32_t *x = q_widen(X, xzp, 1, 1), *w = q_widen(W, wzp, g.M, wper);
    if (!x || !w) {
        eng_free(x), eng_free(w);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "integer conv operands");
    }
    const eng_tensor *bias = p->qlinear && c->nin > 8 && c->in[8].data ? &c->in[8] : NULL;
    int32_t lo = 0, hi = 0;
    if (p->qlinear) q_range(Y->dtype, &lo, &hi);
    int oom = 0;
    int nt = c->nthreads > 0 ? c->nthreads : 1;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1 && g.N * g.M > 1)
    for (int64_t nm = 0; nm < g.N * g.M; nm++) {
        int64_t n = nm / g.M, m = nm % g.M;
        int64_t *acc = malloc((size_t)(osz > 0 ? osz : 1) * sizeof *acc);
        if (!acc) {
#pragma omp atomic write
            oom = 1;
            continue;
        }
        q_conv_plane(&g, x, w, n, m, acc);
        int64_t yo = nm * osz;
        if (!p->qlinear) {
            for (int64_t i = 0; i < osz; i++) ((int32_t *)Y->data)[yo + i] = (int32_t)acc[i];
        } else {
            int64_t b = bias ? q_at_i(bias, m) : 0;
            float mult = q_at_f(&c->in[1], 0) * q_at_f(&c->in[4], m) / q_at_f(&c->in[6], 0);
            int32_t yzp = q_at_i(&c->in[7], 0);
            for (int64_t i = 0; i < osz; i++)
                q_store(Y, yo + i, q_round_sat((double)(acc[i] + b) * (double)mult, yzp, lo, hi));
        }
        free(acc);
    }
    eng_free(x), eng_free(w);
    if (oom) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "integer conv accumulator (%lld elements)", (long long)osz);
    return ENG_STATUS_OK;
}

/* The integer matmul and conv loops here are correct but far from what AVX512_VNNI does, so they report
 * themselves as a slow path (STYLE.md: slow paths are loud). "matmul_integer" / "conv_integer" are the oneDNN
 * int8 kernels of quant-dnnl.c, which run these loops for what oneDNN cannot do exactly (and say why); the
 * "_ref" names keep the loops reachable on their own, for tests that compare the two. */
void krn_cpu_quant_describe_ref(const krn_call *c, krn_impl_info *info) {
    (void)c;
    krn_str_copy(info->impl, sizeof info->impl, "reference C int8 loops");
    info->slow = 1;
}

/* QLinearAdd / QLinearMul (krn-quant.h), numpy broadcasting through per-dim strides (0 where broadcast); the
 * same-shape case (residual adds) is one flat loop. */
typedef struct q_bin_k {
    int mul, s8;
    float ra, rb, rm;
    int32_t az, bz, cz, lo, hi;
} q_bin_k;

/* y[0..n) from a (step sa: 1, or 0 = one element broadcast) and b (step sb), the float32 arithmetic of
 * krn-quant.h; 16 lanes at a time, then the same operations one by one. */
static void q_binary_row(const q_bin_k *k, const void *a, int64_t sa, const void *b, int64_t sb, void *y, int64_t n) {
    int64_t i = 0;
    const int s8 = k->s8;
#ifdef __AVX512F__
    const __m512 vra = _mm512_set1_ps(k->ra), vrb = _mm512_set1_ps(k->rb), vrm = _mm512_set1_ps(k->rm);
    const __m512 vmin = _mm512_set1_ps(-1e9f), vmax = _mm512_set1_ps(1e9f);
    const __m512i vaz = _mm512_set1_epi32(k->az), vbz = _mm512_set1_epi32(k->bz), vcz = _mm512_set1_epi32(k->cz);
    const __m512i vlo = _mm512_set1_epi32(k->lo), vhi = _mm512_set1_epi32(k->hi);
    const int32_t a0 = s8 ? ((const int8_t *)a)[0] : ((const uint8_t *)a)[0];
    const int32_t b0 = s8 ? ((const int8_t *)b)[0] : ((const uint8_t *)b)[0];
    for (; i + 16 <= n; i += 16) {
        __m512i ia, ib;
        if (sa) {
            __m128i x = _mm_loadu_si128((const __m128i *)((const char *)a + i));
            ia = s8 ? _mm512_cvtepi8_epi32(x) : _mm512_cvtepu8_epi32(x);
        } else {
            ia = _mm512_set1_epi32(a0);
        }
        if (sb) {
            __m128i x = _mm_loadu_si128((const __m128i *)((const char *)b + i));
            ib = s8 ? _mm512_cvtepi8_epi32(x) : _mm512_cvtepu8_epi32(x);
        } else {
            ib = _mm512_set1_epi32(b0);
        }
        ia = _mm512_sub_epi32(ia, vaz), ib = _mm512_sub_epi32(ib, vbz);
        __m512 v = k->mul ? _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_mullo_epi32(ia, ib)), vrm)
                          : _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(ia), vra), _mm512_mul_ps(_mm512_cvtepi32_ps(ib), vrb));
        v = _mm512_min_ps(_mm512_max_ps(v, vmin), vmax);                    /* int32-safe */
        __m512i q = _mm512_add_epi32(_mm512_cvtps_epi32(v), vcz); /* cvtps rounds half to even (MXCSR default) */
        q = _mm512_min_epi32(_mm512_max_epi32(q, vlo), vhi);
        _mm_storeu_si128((__m128i *)((char *)y + i), _mm512_cvtepi32_epi8(q));
    }
#endif
    for (; i < n; i++) {
        int32_t va = s8 ? ((const int8_t *)a)[i * sa] : ((const uint8_t *)a)[i * sa];
        int32_t vb = s8 ? ((const int8_t *)b)[i * sb] : ((const uint8_t *)b)[i * sb];
        float v = k->mul ? (float)((va - k->az) * (vb - k->bz)) * k->rm
                         : (float)(va - k->az) * k->ra + (float)(vb - k->bz) * k->rb;
        v = v < -1e9f ? -1e9f : v > 1e9f ? 1e9f : v; /* int32-safe; saturates below anyway */
        int32_t q = (int32_t)nearbyintf(v) + k->cz;
        q = q < k->lo ? k->lo : q > k->hi ? k->hi : q;
        if (s8) ((int8_t *)y)[i] = (int8_t)q;
        else ((uint8_t *)y)[i] = (uint8_t)q;
    }
}

/* QLinearAdd / QLinearMul (krn-quant.h): the output's innermost dim as rows (each operand stepping 1 or
 * broadcasting one element along it), the outer dims walked with per-dim strides (0 where broadcast): same-shape
 * residual adds are one run, bias adds ([.., N] + [N]) one row per position. */
static eng_status q_binary_exec(krn_call *c) {
    const krn_qbinary_params *p = c->params;
    const eng_tensor *a = &c->in[0], *b = &c->in[3], *y = &c->out[0];
    const float as = q_at_f(&c->in[1], 0), bs = q_at_f(&c->in[4], 0), cs = q_at_f(&c->in[6], 0);
    q_bin_k k = {.mul = p->mul, .s8 = y->dtype == ENG_DTYPE_I8, .ra = as / cs, .rb = bs / cs, .rm = as * bs / cs,
                 .az = c->nin > 2 ? q_at_i(&c->in[2], 0) : 0, .bz = c->nin > 5 ? q_at_i(&c->in[5], 0) : 0,
                 .cz = c->nin > 7 ? q_at_i(&c->in[7], 0) : 0};
    q_range(y->dtype, &k.lo, &k.hi);
    int r = y->ndim;
    int64_t n = eng_tensor_numel(y);
    if (n == 0) return ENG_STATUS_OK;
    if (eng_shape_equal(a, y) && eng_shape_equal(b, y)) {
        q_binary_row(&k, a->data, 1, b->data, 1, y->data, n);
        return ENG_STATUS_OK;
    }
    int64_t sa[ENG_MAX_DIMS], sb[ENG_MAX_DIMS], idx[ENG_MAX_DIMS] = {0}, st_a = 1, st_b = 1;
    for (int d = r - 1; d >= 0; d--) { /* strides of a and b in y's coordinates */
        int da = d - (r - a->ndim), db = d - (r - b->ndim);
        int64_t ea = da >= 0 ? a->dims[da] : 1, eb = db >= 0 ? b->dims[db] : 1;
        sa[d] = ea == 1 ? 0 : st_a, sb[d] = eb == 1 ? 0 : st_b;
        st_a *= ea, st_b *= eb;
    }
    int64_t inner = r ? y->dims[r - 1] : 1, rows = n / (inner ? inner : 1), oa = 0, ob = 0;
    int64_t ia = r ? sa[r - 1] : 0, ib = r ? sb[r - 1] : 0;
    for (int64_t row = 0; row < rows; row++) {
        q_binary_row(&k, (const char *)a->data + oa, ia, (const char *)b->data + ob, ib, (char *)y->data + row * inner, inner);
        for (int d = r - 2; d >= 0; d--) {
            oa += sa[d], ob += sb[d];
            if (++idx[d] < y->dims[d]) break;
            oa -= sa[d] * idx[d], ob -= sb[d] * idx[d];
            idx[d] = 0;
        }
    }
    return ENG_STATUS_OK;
}

/* No state: init exists so that the planner records describe()'s line (it describes steps that have an init). */
static eng_status q_binary_init(krn_call *c) {
    (void)c;
    return ENG_STATUS_OK;
}

static void q_binary_describe(const krn_call *c, krn_impl_info *info) {
    (void)c;
    krn_str_copy(info->impl, sizeof info->impl, "int8 avx512 rows (float32 rescale, as MLAS)");
}

eng_status krn_cpu_qmatmul_init(krn_call *c);
eng_status krn_cpu_qmatmul_exec(krn_call *c);
eng_status krn_cpu_qconv_init(krn_call *c);
eng_status krn_cpu_qconv_exec(krn_call *c);
void krn_cpu_qdnnl_free(void *state);
void krn_cpu_qdnnl_describe(const krn_call *c, krn_impl_info *info);

const krn_kernel krn_cpu_quant_kernels[] = {
    {"quantize_linear", NULL, q_quantize_exec, NULL, NULL},
    {"dequantize_linear", NULL, q_dequantize_exec, NULL, NULL},
    {"dynamic_quantize_linear", NULL, q_dynamic_exec, NULL, NULL},
    {"matmul_integer", krn_cpu_qmatmul_init, krn_cpu_qmatmul_exec, krn_cpu_qdnnl_free, krn_cpu_qdnnl_describe},
    {"conv_integer", krn_cpu_qconv_init, krn_cpu_qconv_exec, krn_cpu_qdnnl_free, krn_cpu_qdnnl_describe},
    {"matmul_integer_ref", NULL, krn_cpu_qmatmul_ref, NULL, krn_cpu_quant_describe_ref},
    {"conv_integer_ref", NULL, krn_cpu_qconv_ref, NULL, krn_cpu_quant_describe_ref},
    {"qlinear_binary", q_binary_init, q_binary_exec, NULL, q_binary_describe},
    {NULL},
};
