/* ew-math.h - float32 math for elementwise loops that gcc vectorises (AVX-512 with -march=native): branch-free
 * polynomial approximations, where both sides of a split are computed and selected. Shared by the activation
 * kernels (eltwise-act.c) and their gradients (grad.c). Accuracy: exp ~2 ulp; tanh/sigmoid ~3e-7 relative;
 * erf ~3e-6 relative (erfc tail ~1e-5 relative). Include only from the CPU kernels' .c files, before their
 * hot loops: it sets the optimize pragma below for the rest of the file.
 */
#ifndef KRN_CPU_EW_MATH_H
#define KRN_CPU_EW_MATH_H

/* For these functions and every function after them in the including file: no-trapping-math (gcc vectorises
 * floorf), and 512-bit vectors where AVX-512 is on. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-math-errno", "no-trapping-math")
#if defined(__AVX512F__)
#pragma GCC target("prefer-vector-width=512")
#endif
#endif

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float ew_bits_to_f(uint32_t b) {
    float f;
    memcpy(&f, &b, 4);
    return f;
}

/* exp(x): Cephes range reduction x = n ln2 + r, degree-6 polynomial on r, scale by 2^n via exponent bits. */
static inline float ew_exp(float x) {
    float xc = x < -87.0f ? -87.0f : x;
    xc = xc > 88.72283f ? 88.72283f : xc;
    float n = floorf(xc * 1.44269504088896341f + 0.5f);
    float r = xc - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    /* 2^n as 2 * 2^(n-1): n-1 stays in the normal exponent range for n in [-125, 128] */
    float y = (p * 2.0f) * ew_bits_to_f((uint32_t)((int32_t)n + 126) << 23);
    y = x > 88.72283f ? INFINITY : y;
    return x < -87.0f ? 0.0f : y;
}

static inline float ew_sigmoid(float x) { return 1.0f / (1.0f + ew_exp(-x)); }

/* tanh as a rational function of x (odd degree-13 / even degree-6 polynomials, the Eigen/MLAS form): one
 * division, no exp; |x| clamped to 7.9 where tanh rounds to +-1 in float. */
static inline float ew_tanh(float x) {
    float c = x > 7.90531110763549805f ? 7.90531110763549805f : (x < -7.90531110763549805f ? -7.90531110763549805f : x);
    float z = c * c;
    float p = -2.76076847742355e-16f;
    p = p * z + 2.00018790482477e-13f;
    p = p * z - 8.60467152213735e-11f;
    p = p * z + 5.12229709037114e-08f;
    p = p * z + 1.48572235717979e-05f;
    p = p * z + 6.37261928875436e-04f;
    p = p * z + 4.89352455891786e-03f;
    p = p * c;
    float q = 1.19825839466702e-06f;
    q = q * z + 1.18534705686654e-04f;
    q = q * z + 2.26843463243900e-03f;
    q = q * z + 4.89352518554385e-03f;
    float r = p / q;
    return fabsf(x) < 0.0004f ? x : r;
}

/* erf split at 0.921875: erf(x) = x P(x^2) below; erfc(a) = exp(R(a) - a^2) above (0 beyond a = 6). */
static inline float ew_erf_small(float x) {
    float z = x * x, p = 8.410933514824137e-05f;
    p = p * z - 0.0008153758244588971f;
    p = p * z + 0.005202173721045256f;
    p = p * z - 0.026859955862164497f;
    p = p * z + 0.11283708363771439f;
    p = p * z - 0.37612634897232056f;
    p = p * z + 1.128379225730896f;
    return x * p;
}

static inline float ew_erfc_big(float a) { /* a >= 0.921875 */
    float ac = a > 6.0f ? 6.0f : a;
    float q = 7.442778838e-07f;
    q = q * ac - 2.594865146e-05f;
    q = q * ac + 4.038496991e-04f;
    q = q * ac - 3.733948804e-03f;
    q = q * ac + 2.313399687e-02f;
    q = q * ac - 1.036082655e-01f;
    q = q * ac + 3.605668545e-01f;
    q = q * ac - 1.125372648e+00f;
    q = q * ac - 9.691683808e-04f;
    float e = ew_exp(q - ac * ac);
    return a > 6.0f ? 0.0f : e;
}

static inline float ew_erf(float x) {
    float a = fabsf(x);
    float big = copysignf(1.0f - ew_erfc_big(a), x);
    return a < 0.921875f ? ew_erf_small(x) : big;
}

/* 0.5 x (1 + erf(x/sqrt2)); for x << 0 uses erfc directly (no cancellation). */
static inline float ew_gelu(float x) {
    float t = x * 0.70710678118654752f, a = fabsf(t);
    float e = ew_erfc_big(a);
    float onep_big = t > 0.0f ? 2.0f - e : e;
    float onep = a < 0.921875f ? 1.0f + ew_erf_small(t) : onep_big;
    return 0.5f * x * onep;
}

/* x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)) == 0.5 x (1 + tanh(...)). */
static inline float ew_gelu_tanh(float x) {
    float y = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return x / (1.0f + ew_exp(-2.0f * y));
}

/* BatchNorm statistics and gradients (norm-batch.c, grad-nn.c) over one row of a channel, in 16 float lanes
 * folded into double: sum v, sum (v - m)^2 (x rows), or with g given
 * sum g and sum g (v - m) (dy rows). Vectorised; the lanes keep float rounding to one row's length. */
/* Sum of n floats: 64 float lanes (vectorised), folded into double. */
static inline double ew_sum_f32(const float *v, int64_t n) {
    float acc[64] = {0};
    int64_t i = 0;
    for (; i + 64 <= n; i += 64)
        for (int j = 0; j < 64; j++) acc[j] += v[i + j];
    double s = 0;
    for (; i < n; i++) s += v[i];
    for (int j = 0; j < 64; j++) s += acc[j];
    return s;
}

/* One pass over channel cc of an (n, ch, sp) float32 tensor x and, if g is not NULL, the same channel of g, around
 * a shift k (BatchNormalization: one of the channel's own values, so the sums do not cancel): out[0] = sum (x - k),
 * out[1] = sum (x - k)^2, out[2] = sum g, out[3] = sum g (x - k). Float lanes per row, folded into double. */
static inline void ew_channel_sums(const float *x, const float *g, int64_t n, int64_t ch, int64_t sp, int64_t cc,
                                   float k, double out[4]) {
    double s1 = 0, s2 = 0, s3 = 0, s4 = 0;
    for (int64_t b = 0; b < n; b++) {
        const float *v = x + (b * ch + cc) * sp, *gr = g ? g + (b * ch + cc) * sp : NULL;
        float a1[16] = {0}, a2[16] = {0}, a3[16] = {0}, a4[16] = {0};
        int64_t i = 0;
        if (gr) {
            for (; i + 16 <= sp; i += 16)
                for (int j = 0; j < 16; j++) {
                    float d = v[i + j] - k;
                    a1[j] += d, a2[j] += d * d, a3[j] += gr[i + j], a4[j] += gr[i + j] * d;
                }
        } else {
            for (; i + 16 <= sp; i += 16)
                for (int j = 0; j < 16; j++) {
                    float d = v[i + j] - k;
                    a1[j] += d, a2[j] += d * d;
                }
        }
        for (; i < sp; i++) {
            double d = (double)v[i] - k;
            s1 += d, s2 += d * d;
            if (gr) s3 += gr[i], s4 += gr[i] * d;
        }
        for (int j = 0; j < 16; j++) s1 += a1[j], s2 += a2[j], s3 += a3[j], s4 += a4[j];
    }
    out[0] = s1, out[1] = s2, out[2] = s3, out[3] = s4;
}

/* Batch mean and population variance of a channel from ew_channel_sums over cnt values around k. */
static inline void ew_sums_moments(const double s[4], double cnt, float k, double *mean, double *var) {
    double m1 = cnt > 0 ? s[0] / cnt : 0, v = cnt > 0 ? s[1] / cnt - m1 * m1 : 0;
    *mean = (double)k + m1;
    *var = v > 0 ? v : 0;
}

/* d/dx gelu(x) = Phi(x) + x phi(x), erf form; Phi from the same split as ew_gelu (no cancellation for x << 0). */
static inline float ew_gelu_grad(float x) {
    float t = x * 0.70710678118654752f, a = fabsf(t);
    float e = ew_erfc_big(a);
    float onep_big = t > 0.0f ? 2.0f - e : e;
    float onep = a < 0.921875f ? 1.0f + ew_erf_small(t) : onep_big;
    return 0.5f * onep + x * ew_exp(-0.5f * x * x) * 0.3989422804014327f;
}

/* d/dx of the tanh form 0.5 x (1 + tanh(k (x + a x^3))). */
static inline float ew_gelu_tanh_grad(float x) {
    const float k = 0.7978845608028654f, a = 0.044715f;
    float t = ew_tanh(k * (x + a * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * a * x * x);
}

#endif
