/* eltwise-act.c - float32/float64 unary maps: activations and unary math, plus krn_cpu_activation_apply.
 *
 * The float32 hot functions (exp, tanh, sigmoid, erf, gelu) are the vectorisable approximations of ew-math.h.
 * Rarely hot functions (trig, log, softplus, ...) call libm. float64 always uses libm.
 * Every function here is safe in place (x == y) and allocates nothing.
 */
/* ew-math.h turns on no-trapping-math for this file (gcc vectorises floorf/ceilf); math-errno cannot be turned off
 * by pragma (sqrt uses intrinsics below instead) */
#include <math.h>
#include <string.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "../krn-eltwise.h"
#include "ew-math.h"

/* fmaxf/fminf do not vectorise without -ffinite-math-only; NaN maps to 0 here */
static inline float ew_clamp01(float v) { return v > 0.0f ? (v < 1.0f ? v : 1.0f) : 0.0f; }

static void ew_sqrt(const float *x, float *y, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_sqrt_ps(_mm512_loadu_ps(x + i)));
#elif defined(__AVX__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_sqrt_ps(_mm256_loadu_ps(x + i)));
#endif
    for (; i < n; i++) y[i] = sqrtf(x[i]);
}

void krn_cpu_expf_vec(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = ew_exp(x[i]);
}

#define EW_LOOP(expr)                                                                                          \
    do {                                                                                                       \
        for (int64_t i = 0; i < n; i++) {                                                                      \
            float v = x[i];                                                                                    \
            y[i] = (expr);                                                                                     \
        }                                                                                                      \
    } while (0)

void krn_cpu_unary_f32(int act, float alpha, float beta, const float *x, float *y, int64_t n) {
    switch (act) {
    case KRN_ACT_RELU: EW_LOOP(v > 0.0f ? v : 0.0f); break;
    case KRN_ACT_LEAKY_RELU: EW_LOOP(v < 0.0f ? v * alpha : v); break;
    case KRN_ACT_SIGMOID: EW_LOOP(ew_sigmoid(v)); break;
    case KRN_ACT_TANH: EW_LOOP(ew_tanh(v)); break;
    case KRN_ACT_GELU: EW_LOOP(ew_gelu(v)); break;
    case KRN_ACT_GELU_TANH: EW_LOOP(ew_gelu_tanh(v)); break;
    case KRN_ACT_CLIP: EW_LOOP(v < alpha ? alpha : (v > beta ? beta : v)); break;
    case KRN_ACT_ELU: EW_LOOP(v < 0.0f ? alpha * (ew_exp(v) - 1.0f) : v); break;
    case KRN_ACT_SELU: EW_LOOP(v <= 0.0f ? beta * alpha * (ew_exp(v) - 1.0f) : beta * v); break;
    case KRN_ACT_CELU: EW_LOOP(v > 0.0f ? v : alpha * (ew_exp(v / alpha) - 1.0f)); break;
    case KRN_ACT_HARD_SIGMOID: EW_LOOP(ew_clamp01(alpha * v + beta)); break;
    case KRN_ACT_HARD_SWISH: EW_LOOP(v * ew_clamp01(v * (1.0f / 6.0f) + 0.5f)); break;
    case KRN_ACT_SOFTPLUS:
        for (int64_t i = 0; i < n; i++) {
            float v = x[i];
            y[i] = v > 20.0f ? v : log1pf(expf(v));
        }
        break;
    case KRN_ACT_SOFTSIGN: EW_LOOP(v / (1.0f + fabsf(v))); break;
    case KRN_ACT_THRESHOLDED_RELU: EW_LOOP(v > alpha ? v : 0.0f); break;
    case KRN_ACT_SHRINK: EW_LOOP(v < -beta ? v + alpha : (v > beta ? v - alpha : 0.0f)); break;
    case KRN_ACT_MISH:
        for (int64_t i = 0; i < n; i++) {
            float v = x[i], e = ew_exp(v < 20.0f ? v : 20.0f), m = e * (e + 2.0f);
            y[i] = v >= 20.0f ? v : v * m / (m + 2.0f);
        }
        break;
    case KRN_ACT_SILU: EW_LOOP(v * ew_sigmoid(v)); break;
    case KRN_ACT_SQRT: ew_sqrt(x, y, n); break;
    case KRN_ACT_RECIPROCAL: EW_LOOP(1.0f / v); break;
    case KRN_ACT_EXP: EW_LOOP(ew_exp(v)); break;
    case KRN_ACT_LOG: for (int64_t i = 0; i < n; i++) y[i] = logf(x[i]); break;
    case KRN_ACT_ABS: EW_LOOP(fabsf(v)); break;
    case KRN_ACT_NEG: EW_LOOP(-v); break;
    case KRN_ACT_FLOOR: EW_LOOP(floorf(v)); break;
    case KRN_ACT_CEIL: EW_LOOP(ceilf(v)); break;
    case KRN_ACT_ROUND: EW_LOOP(rintf(v)); break;
    case KRN_ACT_SIGN: EW_LOOP(v > 0.0f ? 1.0f : (v < 0.0f ? -1.0f : v)); break;
    case KRN_ACT_ERF: EW_LOOP(ew_erf(v)); break;
    case KRN_ACT_SIN: for (int64_t i = 0; i < n; i++) y[i] = sinf(x[i]); break;
    case KRN_ACT_COS: for (int64_t i = 0; i < n; i++) y[i] = cosf(x[i]); break;
    case KRN_ACT_TAN: for (int64_t i = 0; i < n; i++) y[i] = tanf(x[i]); break;
    case KRN_ACT_ASIN: for (int64_t i = 0; i < n; i++) y[i] = asinf(x[i]); break;
    case KRN_ACT_ACOS: for (int64_t i = 0; i < n; i++) y[i] = acosf(x[i]); break;
    case KRN_ACT_ATAN: for (int64_t i = 0; i < n; i++) y[i] = atanf(x[i]); break;
    case KRN_ACT_SINH: for (int64_t i = 0; i < n; i++) y[i] = sinhf(x[i]); break;
    case KRN_ACT_COSH: for (int64_t i = 0; i < n; i++) y[i] = coshf(x[i]); break;
    case KRN_ACT_ASINH: for (int64_t i = 0; i < n; i++) y[i] = asinhf(x[i]); break;
    case KRN_ACT_ACOSH: for (int64_t i = 0; i < n; i++) y[i] = acoshf(x[i]); break;
    case KRN_ACT_ATANH: for (int64_t i = 0; i < n; i++) y[i] = atanhf(x[i]); break;
    default:
        if (x != y) memmove(y, x, (size_t)n * sizeof *y);
    }
}

#define EW_LOOPD(expr)                                                                                         \
    do {                                                                                                       \
        for (int64_t i = 0; i < n; i++) {                                                                      \
            double v = x[i];                                                                                   \
            y[i] = (expr);                                                                                     \
        }                                                                                                      \
    } while (0)

void krn_cpu_unary_f64(int act, double alpha, double beta, const double *x, double *y, int64_t n) {
    switch (act) {
    case KRN_ACT_RELU: EW_LOOPD(v > 0.0 ? v : 0.0); break;
    case KRN_ACT_LEAKY_RELU: EW_LOOPD(v < 0.0 ? v * alpha : v); break;
    case KRN_ACT_SIGMOID: EW_LOOPD(v >= 0 ? 1.0 / (1.0 + exp(-v)) : exp(v) / (1.0 + exp(v))); break;
    case KRN_ACT_TANH: EW_LOOPD(tanh(v)); break;
    case KRN_ACT_GELU: EW_LOOPD(0.5 * v * erfc(-v * 0.70710678118654752440)); break;
    case KRN_ACT_GELU_TANH:
        EW_LOOPD(0.5 * v * (1.0 + tanh(0.79788456080286535588 * (v + 0.044715 * v * v * v))));
        break;
    case KRN_ACT_CLIP: EW_LOOPD(v < alpha ? alpha : (v > beta ? beta : v)); break;
    case KRN_ACT_ELU: EW_LOOPD(v < 0.0 ? alpha * expm1(v) : v); break;
    case KRN_ACT_SELU: EW_LOOPD(v <= 0.0 ? beta * alpha * expm1(v) : beta * v); break;
    case KRN_ACT_CELU: EW_LOOPD(fmax(0.0, v) + fmin(0.0, alpha * expm1(v / alpha))); break;
    case KRN_ACT_HARD_SIGMOID: EW_LOOPD(fmax(0.0, fmin(1.0, alpha * v + beta))); break;
    case KRN_ACT_HARD_SWISH: EW_LOOPD(v * fmax(0.0, fmin(1.0, v / 6.0 + 0.5))); break;
    case KRN_ACT_SOFTPLUS: EW_LOOPD(v > 40.0 ? v : log1p(exp(v))); break;
    case KRN_ACT_SOFTSIGN: EW_LOOPD(v / (1.0 + fabs(v))); break;
    case KRN_ACT_THRESHOLDED_RELU: EW_LOOPD(v > alpha ? v : 0.0); break;
    case KRN_ACT_SHRINK: EW_LOOPD(v < -beta ? v + alpha : (v > beta ? v - alpha : 0.0)); break;
    case KRN_ACT_MISH: EW_LOOPD(v * tanh(v > 40.0 ? v : log1p(exp(v)))); break;
    case KRN_ACT_SILU: EW_LOOPD(v / (1.0 + exp(-v))); break;
    case KRN_ACT_SQRT: EW_LOOPD(sqrt(v)); break;
    case KRN_ACT_RECIPROCAL: EW_LOOPD(1.0 / v); break;
    case KRN_ACT_EXP: EW_LOOPD(exp(v)); break;
    case KRN_ACT_LOG: EW_LOOPD(log(v)); break;
    case KRN_ACT_ABS: EW_LOOPD(fabs(v)); break;
    case KRN_ACT_NEG: EW_LOOPD(-v); break;
    case KRN_ACT_FLOOR: EW_LOOPD(floor(v)); break;
    case KRN_ACT_CEIL: EW_LOOPD(ceil(v)); break;
    case KRN_ACT_ROUND: EW_LOOPD(rint(v)); break;
    case KRN_ACT_SIGN: EW_LOOPD(v > 0.0 ? 1.0 : (v < 0.0 ? -1.0 : v)); break;
    case KRN_ACT_ERF: EW_LOOPD(erf(v)); break;
    case KRN_ACT_SIN: EW_LOOPD(sin(v)); break;
    case KRN_ACT_COS: EW_LOOPD(cos(v)); break;
    case KRN_ACT_TAN: EW_LOOPD(tan(v)); break;
    case KRN_ACT_ASIN: EW_LOOPD(asin(v)); break;
    case KRN_ACT_ACOS: EW_LOOPD(acos(v)); break;
    case KRN_ACT_ATAN: EW_LOOPD(atan(v)); break;
    case KRN_ACT_SINH: EW_LOOPD(sinh(v)); break;
    case KRN_ACT_COSH: EW_LOOPD(cosh(v)); break;
    case KRN_ACT_ASINH: EW_LOOPD(asinh(v)); break;
    case KRN_ACT_ACOSH: EW_LOOPD(acosh(v)); break;
    case KRN_ACT_ATANH: EW_LOOPD(atanh(v)); break;
    default:
        if (x != y) memmove(y, x, (size_t)n * sizeof *y);
    }
}

eng_status krn_cpu_activation_apply(int act, float alpha, float beta, float *x, int64_t n, int nthreads) {
    if (act < KRN_ACT_NONE || act >= KRN_ACT_ISNAN)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "activation %d is not a float->float map", act);
    if (act == KRN_ACT_NONE || n <= 0) return ENG_STATUS_OK;
    if (!x) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "activation %d: NULL buffer of %lld floats", act, (long long)n);
    int64_t chunk = 16384;
    int64_t nchunks = (n + chunk - 1) / chunk;
    if (nthreads < 1) nthreads = 1;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (n > KRN_ELTWISE_PAR_MIN && nthreads > 1)
    for (int64_t k = 0; k < nchunks; k++) {
        int64_t s = k * chunk, m = n - s < chunk ? n - s : chunk;
        krn_cpu_unary_f32(act, alpha, beta, x + s, x + s, m);
    }
    return ENG_STATUS_OK;
}
