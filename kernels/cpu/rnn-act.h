/* rnn-act.h - the ONNX recurrent activation functions and their derivatives, shared by the forward (rnn.c) and
 * gradient (rnn-grad.c) kernels. */
#ifndef KRN_RNN_ACT_H
#define KRN_RNN_ACT_H

#include <math.h>
#include <stdint.h>

#include "../krn-rnn.h"

static inline float krn_rnn_act_f(const krn_rnn_act *a, float x) {
    switch (a->kind) {
    case KRN_RNN_ACT_SIGMOID: return 1.0f / (1.0f + expf(-x));
    case KRN_RNN_ACT_TANH: return tanhf(x);
    case KRN_RNN_ACT_RELU: return x > 0 ? x : 0;
    case KRN_RNN_ACT_AFFINE: return a->alpha * x + a->beta;
    case KRN_RNN_ACT_LEAKY_RELU: return x >= 0 ? x : a->alpha * x;
    case KRN_RNN_ACT_THRESHOLDED_RELU: return x > a->alpha ? x : 0;
    case KRN_RNN_ACT_SCALED_TANH: return a->alpha * tanhf(a->beta * x);
    case KRN_RNN_ACT_HARD_SIGMOID: {
        float v = a->alpha * x + a->beta;
        return v < 0 ? 0 : v > 1 ? 1 : v;
    }
    case KRN_RNN_ACT_ELU: return x >= 0 ? x : a->alpha * (expf(x) - 1.0f);
    case KRN_RNN_ACT_SOFTSIGN: return x / (1.0f + fabsf(x));
    case KRN_RNN_ACT_SOFTPLUS: return x > 20.0f ? x : log1pf(expf(x));
    }
    return x;
}

/* d f(x) / dx, given x and y = f(x). */
static inline float krn_rnn_act_df(const krn_rnn_act *a, float x, float y) {
    switch (a->kind) {
    case KRN_RNN_ACT_SIGMOID: return y * (1.0f - y);
    case KRN_RNN_ACT_TANH: return 1.0f - y * y;
    case KRN_RNN_ACT_RELU: return x > 0 ? 1.0f : 0.0f;
    case KRN_RNN_ACT_AFFINE: return a->alpha;
    case KRN_RNN_ACT_LEAKY_RELU: return x >= 0 ? 1.0f : a->alpha;
    case KRN_RNN_ACT_THRESHOLDED_RELU: return x > a->alpha ? 1.0f : 0.0f;
    case KRN_RNN_ACT_SCALED_TANH: {
        float t = tanhf(a->beta * x);
        return a->alpha * a->beta * (1.0f - t * t);
    }
    case KRN_RNN_ACT_HARD_SIGMOID: {
        float v = a->alpha * x + a->beta;
        return v > 0 && v < 1 ? a->alpha : 0.0f;
    }
    case KRN_RNN_ACT_ELU: return x >= 0 ? 1.0f : y + a->alpha;
    case KRN_RNN_ACT_SOFTSIGN: {
        float d = 1.0f + fabsf(x);
        return 1.0f / (d * d);
    }
    case KRN_RNN_ACT_SOFTPLUS: return 1.0f / (1.0f + expf(-x));
    }
    return 1.0f;
}

/* ---- vectorisable forms for the forward kernel's gate loops (added with the fast forward kernel) ----
 * Branch-free float32 approximations the compiler vectorises (no libm calls): exp by Cephes' degree-6 polynomial on
 * [-ln2/2, ln2/2] with the exponent set from the bits (relative error ~2e-7 on [-87, 88]; clamped outside), tanh by
 * Cephes' odd polynomial below |x| 0.625 and 1 - 2/(exp(2|x|)+1) above (absolute error ~1e-7), sigmoid 1/(1+exp(-x)). */
static inline float krn_rnn_fast_exp(float x) {
    x = x < -87.3f ? -87.3f : x; /* two plain selects: GCC 12 vectorises these, not nested ones, fminf or floorf */
    x = x > 88.3f ? 88.3f : x;
    float fx = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest by 1.5 * 2^23 */
    float r = x - fx * 0.693359375f + fx * 2.12194440e-4f;
    float z = r * r;
    float y = ((((1.9875691500E-4f * r + 1.3981999507E-3f) * r + 8.3334519073E-3f) * r + 4.1665795894E-2f) * r +
               1.6666665459E-1f) * r + 5.0000001201E-1f;
    y = y * z + r + 1.0f;
    union { int32_t i; float f; } scale = {.i = ((int32_t)fx + 127) << 23};
    return y * scale.f;
}

static inline float krn_rnn_fast_sigmoid(float x) { return 1.0f / (1.0f + krn_rnn_fast_exp(-x)); }

static inline float krn_rnn_fast_tanh(float x) {
    float ax = x < 0 ? -x : x;
    float z = x * x;
    float small = ((((-5.70498872745E-3f * z + 2.06390887954E-2f) * z - 5.37397155531E-2f) * z + 1.33314422036E-1f) * z -
                   3.33332819422E-1f) * z * x + x;
    float big = 1.0f - 2.0f / (krn_rnn_fast_exp(2.0f * ax) + 1.0f);
    big = x < 0 ? -big : big;
    return ax < 0.625f ? small : big;
}

/* x[0..n) = f(x) in place; sigmoid and tanh vectorised (the fast forms above), the others by krn_rnn_act_f. */
static inline void krn_rnn_act_apply(const krn_rnn_act *a, float *restrict x, int64_t n) {
    switch (a->kind) {
    case KRN_RNN_ACT_SIGMOID:
        for (int64_t i = 0; i < n; i++) x[i] = krn_rnn_fast_sigmoid(x[i]);
        break;
    case KRN_RNN_ACT_TANH:
        for (int64_t i = 0; i < n; i++) x[i] = krn_rnn_fast_tanh(x[i]);
        break;
    case KRN_RNN_ACT_RELU:
        for (int64_t i = 0; i < n; i++) x[i] = x[i] > 0 ? x[i] : 0;
        break;
    default:
        for (int64_t i = 0; i < n; i++) x[i] = krn_rnn_act_f(a, x[i]);
    }
}

#endif
