/* cuda-eltwise.cu - CUDA kernels of the elementwise family (table krn_cuda_eltwise_kernels): unary maps and
 * activations, broadcasting binary ops, variadic Sum/Mean/Min/Max, Where, Clip, Cast, inference Dropout, training
 * Dropout and its gradient, activation gradients, Expand and Tile.
 *
 * The CPU kernels (kernels/cpu/eltwise*.c, grad.c, tensor.c) are the reference: same names, params and results
 * within float rounding (device libm instead of ew-math.h's polynomials). f16/bf16 compute in fp32 and round to
 * nearest even once at the store, as the CPU's widen/compute/narrow does.
 *
 * Broadcasting: the host collapses the output shape as krn_cpu_bcast_init does (size-1 dims dropped, adjacent
 * dims merged where every input's strides allow) into an ewc_bc passed by value; a kernel maps an output index to
 * input offsets with one multiply-high per collapsed dim (magic divisors) when the tensor has < 2^31 elements,
 * 64-bit division otherwise. nd == 1 (same shape, scalar operands) runs 4 elements per thread with vector loads.
 * Values the CPU reads on the host (Clip bounds, ClipGrad bounds) are read on the device: exec never waits.
 */
#include "cuda-impl.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <type_traits>

extern "C" {
#include "../krn-eltwise.h"
#include "../krn-grad.h"
#include "../krn-nn.h"
#include "../krn-tensor.h"
}

#define EWC_T 256    /* threads per block */
#define EWC_VIN 8    /* most inputs of a variadic op on the device */
#define EWC_VIEW 16  /* most dims of a copy view (Tile: two per dim) */

/* ---------------------------------------------------------------- broadcast descriptor */

template <int NI, int MD> struct ewc_bc {
    int nd;                /* collapsed dims, >= 1 */
    int small;             /* n < 2^31: 32-bit index math with the magic divisors */
    int64_t n;             /* output elements */
    int64_t dims[MD];      /* outermost first */
    uint32_t mag[MD], shf[MD];
    int64_t str[NI][MD];   /* element strides of each input (0: broadcast) */
};

/* Collapse a view: nd dims (outermost first), per input strides st[k][d]. */
template <int NI, int MD>
static void ewc_bc_view(ewc_bc<NI, MD> *b, int nd, const int64_t *dims, const int64_t (*st)[MD]) {
    int64_t td[MD], ts[NI][MD];
    int cnt = 0;
    for (int d = nd - 1; d >= 0; d--) { /* innermost first */
        if (dims[d] == 1) continue;
        if (cnt > 0) {
            int ok = 1;
            for (int k = 0; k < NI; k++)
                if (st[k][d] != ts[k][cnt - 1] * td[cnt - 1]) ok = 0;
            if (ok) {
                td[cnt - 1] *= dims[d];
                continue;
            }
        }
        td[cnt] = dims[d];
        for (int k = 0; k < NI; k++) ts[k][cnt] = st[k][d];
        cnt++;
    }
    if (cnt == 0) {
        td[0] = 1;
        for (int k = 0; k < NI; k++) ts[k][0] = 0;
        cnt = 1;
    }
    memset(b, 0, sizeof *b);
    b->nd = cnt;
    b->n = 1;
    for (int i = 0; i < cnt; i++) {
        b->dims[i] = td[cnt - 1 - i];
        b->n *= b->dims[i];
        for (int k = 0; k < NI; k++) b->str[k][i] = ts[k][cnt - 1 - i];
    }
    for (int d = 0; d < nd; d++)
        if (dims[d] == 0) b->n = 0;
    b->small = b->n > 0 && b->n <= 0x7fffffffLL; /* every dim >= 1 then */
    for (int i = 0; i < cnt && b->small; i++) {
        uint64_t dv = (uint64_t)b->dims[i];
        uint32_t s = 0;
        while ((1ull << s) < dv) s++;
        b->shf[i] = s;
        b->mag[i] = (uint32_t)(((1ull << 32) * ((1ull << s) - dv)) / dv + 1);
    }
}

/* numpy broadcasting of nin inputs (unused input slots: stride 0) to out's shape; ndim <= ENG_MAX_DIMS. */
template <int NI>
static eng_status ewc_bc_bcast(ewc_bc<NI, ENG_MAX_DIMS> *b, const eng_tensor *out, const eng_tensor *const *ins,
                               int nin, const char *what) {
    int64_t st[NI][ENG_MAX_DIMS];
    int r = out->ndim;
    memset(st, 0, sizeof st);
    for (int k = 0; k < nin; k++) {
        const eng_tensor *t = ins[k];
        char s1[128], s2[128];
        if (t->ndim > r)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: input %d shape %s has more dims than output %s", what, k,
                           eng_shape_str(t->dims, t->ndim, s1, sizeof s1), eng_shape_str(out->dims, r, s2, sizeof s2));
        int64_t contig = 1;
        for (int d = r - 1; d >= 0; d--) {
            int off = r - t->ndim;
            int64_t id = d >= off ? t->dims[d - off] : 1;
            if (id != out->dims[d] && id != 1)
                return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: input %d shape %s does not broadcast to %s", what, k,
                               eng_shape_str(t->dims, t->ndim, s1, sizeof s1),
                               eng_shape_str(out->dims, r, s2, sizeof s2));
            st[k][d] = id == 1 ? 0 : contig;
            contig *= id;
        }
    }
    int64_t one = 1;
    ewc_bc_view<NI, ENG_MAX_DIMS>(b, r, r ? out->dims : &one, st);
    if (r == 0) b->n = 1;
    return ENG_STATUS_OK;
}

__host__ __device__ __forceinline__ uint32_t ewc_umulhi(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
    return __umulhi(a, b);
#else
    return (uint32_t)(((uint64_t)a * b) >> 32);
#endif
}

/* unroll hint in functions that are compiled for the host too */
#ifdef __CUDA_ARCH__
#define EWC_UNROLL _Pragma("unroll")
#else
#define EWC_UNROLL
#endif

template <int NI, int MD>
__host__ __device__ __forceinline__ void ewc_offsets(const ewc_bc<NI, MD> &b, int64_t i, int64_t *off) {
    EWC_UNROLL
    for (int k = 0; k < NI; k++) off[k] = 0;
    if (b.small) {
        uint32_t r = (uint32_t)i;
        EWC_UNROLL
        for (int d = MD - 1; d > 0; d--) {
            if (d >= b.nd) continue;
            uint32_t q = (ewc_umulhi(r, b.mag[d]) + r) >> b.shf[d];
            uint32_t rem = r - q * (uint32_t)b.dims[d];
            EWC_UNROLL
            for (int k = 0; k < NI; k++) off[k] += (int64_t)rem * b.str[k][d];
            r = q;
        }
        EWC_UNROLL
        for (int k = 0; k < NI; k++) off[k] += (int64_t)r * b.str[k][0];
    } else {
        int64_t r = i;
        EWC_UNROLL
        for (int d = MD - 1; d > 0; d--) {
            if (d >= b.nd) continue;
            int64_t q = r / b.dims[d], rem = r - q * b.dims[d];
            EWC_UNROLL
            for (int k = 0; k < NI; k++) off[k] += rem * b.str[k][d];
            r = q;
        }
        EWC_UNROLL
        for (int k = 0; k < NI; k++) off[k] += r * b.str[k][0];
    }
}

/* ---------------------------------------------------------------- numeric helpers */

template <typename T> struct alignas(4 * sizeof(T)) ewc_vec { T v[4]; };

/* compute type C of a float storage type, load and store with round to nearest even */
template <typename T> struct ewc_num;
template <> struct ewc_num<float> {
    using C = float;
    static __host__ __device__ __forceinline__ float ld(float v) { return v; }
    static __host__ __device__ __forceinline__ float st(float v) { return v; }
};
template <> struct ewc_num<double> {
    using C = double;
    static __host__ __device__ __forceinline__ double ld(double v) { return v; }
    static __host__ __device__ __forceinline__ double st(double v) { return v; }
};
template <> struct ewc_num<__half> {
    using C = float;
    static __host__ __device__ __forceinline__ float ld(__half v) { return __half2float(v); }
    static __host__ __device__ __forceinline__ __half st(float v) { return __float2half_rn(v); }
};
template <> struct ewc_num<__nv_bfloat16> {
    using C = float;
    static __host__ __device__ __forceinline__ float ld(__nv_bfloat16 v) { return __bfloat162float(v); }
    static __host__ __device__ __forceinline__ __nv_bfloat16 st(float v) { return __float2bfloat16_rn(v); }
};

static int ewc_aligned(const void *p, size_t a) { return ((uintptr_t)p % a) == 0; }
static int ewc_is_half(eng_dtype dt) { return dt == ENG_DTYPE_F16 || dt == ENG_DTYPE_BF16; }
static int ewc_is_f(eng_dtype dt) { return dt == ENG_DTYPE_F32 || ewc_is_half(dt); } /* fp32-computed floats */
static int ewc_is_num(eng_dtype dt) { return dt != ENG_DTYPE_STRING && eng_dtype_size(dt) != 0; }

/* Element i of any numeric dtype as double / int64, and stores from them: eng_tensor_get_f64 & co. */
__host__ __device__ double ewc_ld_f64(const void *p, int64_t i, int dt) {
    switch (dt) {
    case ENG_DTYPE_F32: return ((const float *)p)[i];
    case ENG_DTYPE_F64: return ((const double *)p)[i];
    case ENG_DTYPE_F16: return __half2float(((const __half *)p)[i]);
    case ENG_DTYPE_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case ENG_DTYPE_U8: return ((const uint8_t *)p)[i];
    case ENG_DTYPE_I8: return ((const int8_t *)p)[i];
    case ENG_DTYPE_U16: return ((const uint16_t *)p)[i];
    case ENG_DTYPE_I16: return ((const int16_t *)p)[i];
    case ENG_DTYPE_I32: return ((const int32_t *)p)[i];
    case ENG_DTYPE_I64: return (double)((const int64_t *)p)[i];
    case ENG_DTYPE_U32: return ((const uint32_t *)p)[i];
    case ENG_DTYPE_U64: return (double)((const uint64_t *)p)[i];
    case ENG_DTYPE_BOOL: return ((const uint8_t *)p)[i] != 0;
    default: return 0;
    }
}

__host__ __device__ int64_t ewc_f64_to_i64(double d) {
    if (d != d) return 0;
    if (d >= 9.2e18) return INT64_MAX;
    if (d <= -9.2e18) return INT64_MIN;
    return (int64_t)d;
}

__host__ __device__ int64_t ewc_ld_i64(const void *p, int64_t i, int dt) {
    switch (dt) {
    case ENG_DTYPE_I64: return ((const int64_t *)p)[i];
    case ENG_DTYPE_I32: return ((const int32_t *)p)[i];
    case ENG_DTYPE_U64: return (int64_t)((const uint64_t *)p)[i];
    case ENG_DTYPE_U32: return ((const uint32_t *)p)[i];
    case ENG_DTYPE_U8: return ((const uint8_t *)p)[i];
    case ENG_DTYPE_I8: return ((const int8_t *)p)[i];
    case ENG_DTYPE_U16: return ((const uint16_t *)p)[i];
    case ENG_DTYPE_I16: return ((const int16_t *)p)[i];
    case ENG_DTYPE_BOOL: return ((const uint8_t *)p)[i] != 0;
    default: return ewc_f64_to_i64(ewc_ld_f64(p, i, dt));
    }
}

__host__ __device__ void ewc_st_f64(void *p, int64_t i, int dt, double v);

__host__ __device__ void ewc_st_i64(void *p, int64_t i, int dt, int64_t v) {
    switch (dt) {
    case ENG_DTYPE_I64: ((int64_t *)p)[i] = v; break;
    case ENG_DTYPE_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case ENG_DTYPE_U64: ((uint64_t *)p)[i] = (uint64_t)v; break;
    case ENG_DTYPE_U32: ((uint32_t *)p)[i] = (uint32_t)v; break;
    case ENG_DTYPE_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case ENG_DTYPE_I8: ((int8_t *)p)[i] = (int8_t)v; break;
    case ENG_DTYPE_U16: ((uint16_t *)p)[i] = (uint16_t)v; break;
    case ENG_DTYPE_I16: ((int16_t *)p)[i] = (int16_t)v; break;
    case ENG_DTYPE_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    default: ewc_st_f64(p, i, dt, (double)v);
    }
}

__host__ __device__ void ewc_st_f64(void *p, int64_t i, int dt, double v) {
    switch (dt) {
    case ENG_DTYPE_F32: ((float *)p)[i] = (float)v; break;
    case ENG_DTYPE_F64: ((double *)p)[i] = v; break;
    case ENG_DTYPE_F16: ((__half *)p)[i] = __float2half_rn((float)v); break;
    case ENG_DTYPE_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn((float)v); break;
    case ENG_DTYPE_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    default: ewc_st_i64(p, i, dt, ewc_f64_to_i64(v));
    }
}

#define EWC_LOOP(i, n) \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

/* ---------------------------------------------------------------- unary */

__host__ __device__ __forceinline__ float ewc_clamp01(float v) { return v > 0.0f ? (v < 1.0f ? v : 1.0f) : 0.0f; }

/* krn_cpu_unary_f32 */
__host__ __device__ __forceinline__ float ewc_act_f(int op, float v, float a, float b) {
    switch (op) {
    case KRN_ACT_RELU: return v > 0.0f ? v : 0.0f;
    case KRN_ACT_LEAKY_RELU: return v < 0.0f ? v * a : v;
    case KRN_ACT_SIGMOID: return 1.0f / (1.0f + expf(-v));
    case KRN_ACT_TANH: return tanhf(v);
    case KRN_ACT_GELU: return 0.5f * v * erfcf(-v * 0.70710678118654752f);
    case KRN_ACT_GELU_TANH: return v / (1.0f + expf(-2.0f * (0.7978845608028654f * (v + 0.044715f * v * v * v))));
    case KRN_ACT_CLIP: return v < a ? a : (v > b ? b : v);
    case KRN_ACT_ELU: return v < 0.0f ? a * expm1f(v) : v;
    case KRN_ACT_SELU: return v <= 0.0f ? b * a * expm1f(v) : b * v;
    case KRN_ACT_CELU: return v > 0.0f ? v : a * expm1f(v / a);
    case KRN_ACT_HARD_SIGMOID: return ewc_clamp01(a * v + b);
    case KRN_ACT_HARD_SWISH: return v * ewc_clamp01(v * (1.0f / 6.0f) + 0.5f);
    case KRN_ACT_SOFTPLUS: return v > 20.0f ? v : log1pf(expf(v));
    case KRN_ACT_SOFTSIGN: return v / (1.0f + fabsf(v));
    case KRN_ACT_THRESHOLDED_RELU: return v > a ? v : 0.0f;
    case KRN_ACT_SHRINK: return v < -b ? v + a : (v > b ? v - a : 0.0f);
    case KRN_ACT_MISH: {
        float e = expf(v < 20.0f ? v : 20.0f), m = e * (e + 2.0f);
        return v >= 20.0f ? v : v * m / (m + 2.0f);
    }
    case KRN_ACT_SILU: return v / (1.0f + expf(-v));
    case KRN_ACT_SQRT: return sqrtf(v);
    case KRN_ACT_RECIPROCAL: return 1.0f / v;
    case KRN_ACT_EXP: return expf(v);
    case KRN_ACT_LOG: return logf(v);
    case KRN_ACT_ABS: return fabsf(v);
    case KRN_ACT_NEG: return -v;
    case KRN_ACT_FLOOR: return floorf(v);
    case KRN_ACT_CEIL: return ceilf(v);
    case KRN_ACT_ROUND: return rintf(v);
    case KRN_ACT_SIGN: return v > 0.0f ? 1.0f : (v < 0.0f ? -1.0f : v);
    case KRN_ACT_ERF: return erff(v);
    case KRN_ACT_SIN: return sinf(v);
    case KRN_ACT_COS: return cosf(v);
    case KRN_ACT_TAN: return tanf(v);
    case KRN_ACT_ASIN: return asinf(v);
    case KRN_ACT_ACOS: return acosf(v);
    case KRN_ACT_ATAN: return atanf(v);
    case KRN_ACT_SINH: return sinhf(v);
    case KRN_ACT_COSH: return coshf(v);
    case KRN_ACT_ASINH: return asinhf(v);
    case KRN_ACT_ACOSH: return acoshf(v);
    case KRN_ACT_ATANH: return atanhf(v);
    default: return v;
    }
}

/* krn_cpu_unary_f64 */
__host__ __device__ __forceinline__ double ewc_act_d(int op, double v, double a, double b) {
    switch (op) {
    case KRN_ACT_RELU: return v > 0.0 ? v : 0.0;
    case KRN_ACT_LEAKY_RELU: return v < 0.0 ? v * a : v;
    case KRN_ACT_SIGMOID: return v >= 0 ? 1.0 / (1.0 + exp(-v)) : exp(v) / (1.0 + exp(v));
    case KRN_ACT_TANH: return tanh(v);
    case KRN_ACT_GELU: return 0.5 * v * erfc(-v * 0.70710678118654752440);
    case KRN_ACT_GELU_TANH: return 0.5 * v * (1.0 + tanh(0.79788456080286535588 * (v + 0.044715 * v * v * v)));
    case KRN_ACT_CLIP: return v < a ? a : (v > b ? b : v);
    case KRN_ACT_ELU: return v < 0.0 ? a * expm1(v) : v;
    case KRN_ACT_SELU: return v <= 0.0 ? b * a * expm1(v) : b * v;
    case KRN_ACT_CELU: return fmax(0.0, v) + fmin(0.0, a * expm1(v / a));
    case KRN_ACT_HARD_SIGMOID: return fmax(0.0, fmin(1.0, a * v + b));
    case KRN_ACT_HARD_SWISH: return v * fmax(0.0, fmin(1.0, v / 6.0 + 0.5));
    case KRN_ACT_SOFTPLUS: return v > 40.0 ? v : log1p(exp(v));
    case KRN_ACT_SOFTSIGN: return v / (1.0 + fabs(v));
    case KRN_ACT_THRESHOLDED_RELU: return v > a ? v : 0.0;
    case KRN_ACT_SHRINK: return v < -b ? v + a : (v > b ? v - a : 0.0);
    case KRN_ACT_MISH: return v * tanh(v > 40.0 ? v : log1p(exp(v)));
    case KRN_ACT_SILU: return v / (1.0 + exp(-v));
    case KRN_ACT_SQRT: return sqrt(v);
    case KRN_ACT_RECIPROCAL: return 1.0 / v;
    case KRN_ACT_EXP: return exp(v);
    case KRN_ACT_LOG: return log(v);
    case KRN_ACT_ABS: return fabs(v);
    case KRN_ACT_NEG: return -v;
    case KRN_ACT_FLOOR: return floor(v);
    case KRN_ACT_CEIL: return ceil(v);
    case KRN_ACT_ROUND: return rint(v);
    case KRN_ACT_SIGN: return v > 0.0 ? 1.0 : (v < 0.0 ? -1.0 : v);
    case KRN_ACT_ERF: return erf(v);
    case KRN_ACT_SIN: return sin(v);
    case KRN_ACT_COS: return cos(v);
    case KRN_ACT_TAN: return tan(v);
    case KRN_ACT_ASIN: return asin(v);
    case KRN_ACT_ACOS: return acos(v);
    case KRN_ACT_ATAN: return atan(v);
    case KRN_ACT_SINH: return sinh(v);
    case KRN_ACT_COSH: return cosh(v);
    case KRN_ACT_ASINH: return asinh(v);
    case KRN_ACT_ACOSH: return acosh(v);
    case KRN_ACT_ATANH: return atanh(v);
    default: return v;
    }
}

/* A float map's arguments; lo/hi (Clip-11 bounds, device scalars of dtype bdt) replace alpha/beta when given. */
struct ewc_uargs {
    int op;
    double alpha, beta;
    const void *lo, *hi;
    int bdt;
};

template <typename TI, typename TO>
__global__ void ewc_unary_k(const TI *__restrict__ x, TO *__restrict__ y, int64_t n, ewc_uargs u, int vec) {
    using C = typename ewc_num<TI>::C;
    double ad = u.lo ? ewc_ld_f64(u.lo, 0, u.bdt) : u.alpha, bd = u.hi ? ewc_ld_f64(u.hi, 0, u.bdt) : u.beta;
    C a = (C)ad, b = (C)bd;
    int op = u.op;
    auto f = [&](TI v) -> TO {
        if constexpr (std::is_same_v<C, double>) return (TO)ewc_act_d(op, v, a, b);
        else return ewc_num<TO>::st(ewc_act_f(op, ewc_num<TI>::ld(v), a, b));
    };
    int64_t done = 0;
    if (vec) {
        int64_t nv = n / 4;
        EWC_LOOP(j, nv) {
            ewc_vec<TI> xv = ((const ewc_vec<TI> *)x)[j];
            ewc_vec<TO> yv;
#pragma unroll
            for (int k = 0; k < 4; k++) yv.v[k] = f(xv.v[k]);
            ((ewc_vec<TO> *)y)[j] = yv;
        }
        done = nv * 4;
    }
    EWC_LOOP(i, n - done) y[done + i] = f(x[done + i]);
}

/* ew_unary_int: Abs, Neg, Sign, Relu on integers (wrapping, as the CPU's unsigned arithmetic) */
template <typename T>
__global__ void ewc_unary_int_k(const T *__restrict__ x, T *__restrict__ y, int64_t n, int op) {
    EWC_LOOP(i, n) {
        T v = x[i];
        uint64_t u = (uint64_t)(int64_t)v;
        T r;
        if constexpr (std::is_signed_v<T>)
            r = op == KRN_ACT_ABS ? (v < 0 ? (T)(0u - u) : v) : op == KRN_ACT_NEG ? (T)(0u - u)
              : op == KRN_ACT_SIGN ? (T)((v > 0) - (v < 0)) : (v > 0 ? v : (T)0);
        else
            r = op == KRN_ACT_NEG ? (T)(0u - (uint64_t)v) : op == KRN_ACT_SIGN ? (T)(v != 0) : v;
        y[i] = r;
    }
}

/* IsNaN / IsInf (float -> bool), Not (bool -> bool) */
__global__ void ewc_pred_k(const void *__restrict__ x, uint8_t *__restrict__ y, int64_t n, int dt, int op, int pos,
                           int neg) {
    EWC_LOOP(i, n) {
        if (op == KRN_ACT_NOT) {
            y[i] = !((const uint8_t *)x)[i];
            continue;
        }
        double v = ewc_ld_f64(x, i, dt);
        y[i] = op == KRN_ACT_ISNAN ? v != v : ((pos && v == INFINITY) || (neg && v == -INFINITY));
    }
}

#define EWC_INT_TYPES(X) X(ENG_DTYPE_I8, int8_t) X(ENG_DTYPE_I16, int16_t) X(ENG_DTYPE_I32, int32_t) \
    X(ENG_DTYPE_I64, int64_t) X(ENG_DTYPE_U8, uint8_t) X(ENG_DTYPE_U16, uint16_t) X(ENG_DTYPE_U32, uint32_t) \
    X(ENG_DTYPE_U64, uint64_t)
#define EWC_FLT_TYPES(X) X(ENG_DTYPE_F32, float) X(ENG_DTYPE_F16, __half) X(ENG_DTYPE_BF16, __nv_bfloat16) \
    X(ENG_DTYPE_F64, double)

static int ewc_grid(int64_t n) { return (int)cuda_grid(n > 0 ? n : 1, EWC_T); }

template <typename TI, typename TO>
static eng_status ewc_unary_launch(cuda_ctx *x, const void *in, void *out, int64_t n, const ewc_uargs &u,
                                   const char *what) {
    int vec = ewc_aligned(in, 4 * sizeof(TI)) && ewc_aligned(out, 4 * sizeof(TO));
    ewc_unary_k<TI, TO><<<ewc_grid(vec ? (n + 3) / 4 : n), EWC_T, 0, x->stream>>>((const TI *)in, (TO *)out, n, u, vec);
    CUDA_LAUNCHED(what);
    return ENG_STATUS_OK;
}

/* The float map u over x -> y for the dtype pairs ewc_float_pair_ok accepts. */
static int ewc_float_pair_ok(eng_dtype a, eng_dtype b) {
    return (a == b && (ewc_is_f(a) || a == ENG_DTYPE_F64)) || (ewc_is_f(a) && ewc_is_f(b));
}

static eng_status ewc_float_map(cuda_ctx *x, const eng_tensor *in, eng_tensor *out, const ewc_uargs &u,
                                const char *what) {
    int64_t n = eng_tensor_numel(in);
    eng_dtype a = in->dtype, b = out->dtype;
#define EWC_UN(DA, TA, DB, TB) \
    if (a == DA && b == DB) return ewc_unary_launch<TA, TB>(x, in->data, out->data, n, u, what);
    EWC_UN(ENG_DTYPE_F32, float, ENG_DTYPE_F32, float)
    EWC_UN(ENG_DTYPE_F16, __half, ENG_DTYPE_F16, __half)
    EWC_UN(ENG_DTYPE_BF16, __nv_bfloat16, ENG_DTYPE_BF16, __nv_bfloat16)
    EWC_UN(ENG_DTYPE_F64, double, ENG_DTYPE_F64, double)
    EWC_UN(ENG_DTYPE_F32, float, ENG_DTYPE_F16, __half)
    EWC_UN(ENG_DTYPE_F32, float, ENG_DTYPE_BF16, __nv_bfloat16)
    EWC_UN(ENG_DTYPE_F16, __half, ENG_DTYPE_F32, float)
    EWC_UN(ENG_DTYPE_BF16, __nv_bfloat16, ENG_DTYPE_F32, float)
    EWC_UN(ENG_DTYPE_F16, __half, ENG_DTYPE_BF16, __nv_bfloat16)
    EWC_UN(ENG_DTYPE_BF16, __nv_bfloat16, ENG_DTYPE_F16, __half)
#undef EWC_UN
    return eng_err(ENG_STATUS_UNSUPPORTED, "cuda %s: %s -> %s", what, eng_dtype_name(a), eng_dtype_name(b));
}

static int unary_supports(const krn_call *c) {
    const krn_unary_params *p = (const krn_unary_params *)c->params;
    if (!p || c->nin < 1 || c->nout < 1) return 0;
    eng_dtype a = c->in[0].dtype, b = c->out[0].dtype;
    if (p->op < 0 || p->op >= KRN_ACT_COUNT) return 0;
    if (p->op == KRN_ACT_NOT) return a == ENG_DTYPE_BOOL && b == ENG_DTYPE_BOOL;
    if (p->op >= KRN_ACT_ISNAN) return (ewc_is_f(a) || a == ENG_DTYPE_F64) && b == ENG_DTYPE_BOOL;
    if (eng_dtype_is_int(a))
        return a == b &&
               (p->op == KRN_ACT_ABS || p->op == KRN_ACT_NEG || p->op == KRN_ACT_SIGN || p->op == KRN_ACT_RELU);
    return ewc_float_pair_ok(a, b);
}

static int unary_io_ok(const krn_call *c, eng_dtype dt) {
    const krn_unary_params *p = (const krn_unary_params *)c->params;
    if (!ewc_is_half(dt) || !p || p->op >= KRN_ACT_ISNAN) return 0;
    eng_dtype a = c->in[0].dtype, b = c->out[0].dtype;
    return (a == ENG_DTYPE_F32 || a == dt) && (b == ENG_DTYPE_F32 || b == dt) ? 2 : 0;
}

static eng_status unary_exec(krn_call *c) {
    const krn_unary_params *p = (const krn_unary_params *)c->params;
    cuda_ctx *x = CUDA_CTX(c);
    const eng_tensor *in = &c->in[0];
    eng_tensor *out = &c->out[0];
    int64_t n = eng_tensor_numel(in);
    if (n <= 0) return ENG_STATUS_OK;
    if (!unary_supports(c))
        return eng_err(ENG_STATUS_UNSUPPORTED, "cuda eltwise_unary: op %d on %s -> %s", p->op,
                       eng_dtype_name(in->dtype), eng_dtype_name(out->dtype));
    if (p->op >= KRN_ACT_ISNAN) {
        ewc_pred_k<<<ewc_grid(n), EWC_T, 0, x->stream>>>(in->data, (uint8_t *)out->data, n, in->dtype, p->op,
                                                          p->alpha != 0, p->beta != 0);
        CUDA_LAUNCHED("eltwise_unary");
        return ENG_STATUS_OK;
    }
    if (eng_dtype_is_int(in->dtype)) {
#define EWC_UI(D, T) \
    if (in->dtype == D) { \
        ewc_unary_int_k<T><<<ewc_grid(n), EWC_T, 0, x->stream>>>((const T *)in->data, (T *)out->data, n, p->op); \
        CUDA_LAUNCHED("eltwise_unary"); \
        return ENG_STATUS_OK; \
    }
        EWC_INT_TYPES(EWC_UI)
#undef EWC_UI
    }
    ewc_uargs u = {p->op, p->alpha, p->beta, NULL, NULL, 0};
    return ewc_float_map(x, in, out, u, "eltwise_unary");
}

/* ---------------------------------------------------------------- binary */

__host__ __device__ __forceinline__ bool ewc_is_cmp(int op) { return op >= KRN_BIN_EQ && op <= KRN_BIN_XOR; }

template <typename C> __host__ __device__ __forceinline__ C ewc_fmod(C x, C y) {
    if constexpr (std::is_same_v<C, double>) return fmod(x, y);
    else return fmodf(x, y);
}

template <typename C> __host__ __device__ __forceinline__ C ewc_binf(int op, C x, C y, int rule) {
    switch (op) {
    case KRN_BIN_ADD: return x + y;
    case KRN_BIN_SUB: return x - y;
    case KRN_BIN_MUL: return x * y;
    case KRN_BIN_DIV: return x / y;
    case KRN_BIN_POW:
        if constexpr (std::is_same_v<C, double>) {
            return pow(x, y);
        } else {
            if (rule) { /* ew_pow_f32_scalar's exponents */
                if (y == 2.0f) return x * x;
                if (y == 3.0f) return x * x * x;
                if (y == 1.0f) return x;
                if (y == -1.0f) return 1.0f / x;
                if (y == 0.5f) return sqrtf(x);
                if (y == -0.5f) return 1.0f / sqrtf(x);
            }
            return powf(x, y);
        }
    case KRN_BIN_MOD: {
        C r = ewc_fmod(x, y);
        return (r != 0 && ((r < 0) != (y < 0))) ? r + y : r;
    }
    case KRN_BIN_FMOD: return ewc_fmod(x, y);
    case KRN_BIN_MIN: return (x <= y || x != x) ? x : y;
    case KRN_BIN_MAX: return (x >= y || x != x) ? x : y;
    case KRN_BIN_PRELU: return x < 0 ? x * y : x;
    default: return 0;
    }
}

template <typename T> __host__ __device__ __forceinline__ bool ewc_cmp(int op, T x, T y) {
    switch (op) {
    case KRN_BIN_EQ: return x == y;
    case KRN_BIN_GT: return x > y;
    case KRN_BIN_LT: return x < y;
    case KRN_BIN_GE: return x >= y;
    case KRN_BIN_LE: return x <= y;
    case KRN_BIN_AND: return (x != 0) & (y != 0);
    case KRN_BIN_OR: return (x != 0) | (y != 0);
    default: return (x != 0) ^ (y != 0);
    }
}

/* eltwise-binary.c's integer functions: wrapping arithmetic, no traps */
template <typename T> __host__ __device__ __forceinline__ T ewc_bini(int op, T x, T y) {
    uint64_t ux = (uint64_t)(int64_t)x, uy = (uint64_t)(int64_t)y;
    if constexpr (std::is_unsigned_v<T>) ux = (uint64_t)x, uy = (uint64_t)y;
    switch (op) {
    case KRN_BIN_ADD: return (T)(ux + uy);
    case KRN_BIN_SUB: return (T)(ux - uy);
    case KRN_BIN_MUL: return (T)(ux * uy);
    case KRN_BIN_DIV:
        if constexpr (std::is_signed_v<T>) return y == 0 ? (T)0 : (y == -1 ? (T)(0 - ux) : (T)(x / y));
        else return y == 0 ? (T)0 : (T)(x / y);
    case KRN_BIN_MOD:
        if constexpr (std::is_signed_v<T>) {
            if (y == 0 || y == -1) return 0;
            int64_t r = (int64_t)x % (int64_t)y;
            return (T)((r != 0 && ((r < 0) != (y < 0))) ? r + y : r);
        } else {
            return y == 0 ? (T)0 : (T)(x % y);
        }
    case KRN_BIN_FMOD:
        if constexpr (std::is_signed_v<T>) return (y == 0 || y == -1) ? (T)0 : (T)(x % y);
        else return y == 0 ? (T)0 : (T)(x % y);
    case KRN_BIN_SHL: return y >= (T)(8 * sizeof(T)) ? (T)0 : (T)(x << y);
    case KRN_BIN_SHR: return y >= (T)(8 * sizeof(T)) ? (T)0 : (T)(x >> y);
    case KRN_BIN_MIN: return x < y ? x : y;
    case KRN_BIN_MAX: return x > y ? x : y;
    case KRN_BIN_PRELU:
        if constexpr (std::is_signed_v<T>) return x < 0 ? (T)(ux * uy) : x;
        else return x;
    default: return 0;
    }
}

template <typename TA, typename TB, typename TO>
__host__ __device__ __forceinline__ TO ewc_bin_elem(int op, TA a, TB b, int rule) {
    if constexpr (std::is_integral_v<TA>) {
        if (ewc_is_cmp(op)) return (TO)ewc_cmp<TA>(op, a, (TA)b);
        return (TO)ewc_bini<TA>(op, a, (TA)b);
    } else {
        using C = typename ewc_num<TA>::C;
        C x = ewc_num<TA>::ld(a), y = (C)ewc_num<TB>::ld(b);
        if (ewc_is_cmp(op)) return (TO)ewc_cmp<C>(op, x, y);
        if constexpr (std::is_integral_v<TO>) return (TO)0;
        else return ewc_num<TO>::st((typename ewc_num<TO>::C)ewc_binf<C>(op, x, y, rule));
    }
}

typedef ewc_bc<2, ENG_MAX_DIMS> ewc_bc2;

template <typename TA, typename TB, typename TO>
__global__ void ewc_binary_k(const TA *__restrict__ a, const TB *__restrict__ b, TO *__restrict__ o, ewc_bc2 bc,
                             int op, int rule, int vec) {
    int64_t n = bc.n;
    if (bc.nd == 1) { /* same shape or scalar operands */
        int64_t sa = bc.str[0][0], sb = bc.str[1][0], done = 0;
        if (vec) {
            int64_t nv = n / 4;
            EWC_LOOP(j, nv) {
                ewc_vec<TA> av;
                ewc_vec<TB> bv;
                ewc_vec<TO> ov;
                if (sa) {
                    av = ((const ewc_vec<TA> *)a)[j];
                } else {
#pragma unroll
                    for (int k = 0; k < 4; k++) av.v[k] = a[0];
                }
                if (sb) {
                    bv = ((const ewc_vec<TB> *)b)[j];
                } else {
#pragma unroll
                    for (int k = 0; k < 4; k++) bv.v[k] = b[0];
                }
#pragma unroll
                for (int k = 0; k < 4; k++) ov.v[k] = ewc_bin_elem<TA, TB, TO>(op, av.v[k], bv.v[k], rule);
                ((ewc_vec<TO> *)o)[j] = ov;
            }
            done = nv * 4;
        }
        EWC_LOOP(t, n - done) {
            int64_t i = done + t;
            o[i] = ewc_bin_elem<TA, TB, TO>(op, a[i * sa], b[i * sb], rule);
        }
        return;
    }
    EWC_LOOP(i, n) {
        int64_t off[2];
        ewc_offsets(bc, i, off);
        o[i] = ewc_bin_elem<TA, TB, TO>(op, a[off[0]], b[off[1]], rule);
    }
}

/* Pow through float64 (mixed dtypes, integer operands): ew_binary_via(F64). */
__global__ void ewc_pow_f64_k(const void *__restrict__ a, int adt, const void *__restrict__ b, int bdt,
                              void *__restrict__ o, int odt, ewc_bc2 bc) {
    EWC_LOOP(i, bc.n) {
        int64_t off[2];
        ewc_offsets(bc, i, off);
        ewc_st_f64(o, i, odt, pow(ewc_ld_f64(a, off[0], adt), ewc_ld_f64(b, off[1], bdt)));
    }
}

template <typename TA, typename TB, typename TO>
static eng_status ewc_bin_launch(cuda_ctx *x, const krn_call *c, const ewc_bc2 &bc, int op, int rule) {
    const void *a = c->in[0].data, *b = c->in[1].data;
    void *o = c->out[0].data;
    int vec = bc.nd == 1 && ewc_aligned(a, 4 * sizeof(TA)) && ewc_aligned(b, 4 * sizeof(TB)) &&
              ewc_aligned(o, 4 * sizeof(TO));
    ewc_binary_k<TA, TB, TO><<<ewc_grid(vec ? (bc.n + 3) / 4 : bc.n), EWC_T, 0, x->stream>>>(
        (const TA *)a, (const TB *)b, (TO *)o, bc, op, rule, vec);
    CUDA_LAUNCHED("eltwise_binary");
    return ENG_STATUS_OK;
}

/* Whether the CPU's krn_cpu_binary_fn has op for dtype dt (halves: as float32). */
static int ewc_binop_ok(int op, eng_dtype dt) {
    int fl = ewc_is_f(dt) || dt == ENG_DTYPE_F64, in = eng_dtype_is_int(dt);
    int uns = dt == ENG_DTYPE_U8 || dt == ENG_DTYPE_U16 || dt == ENG_DTYPE_U32 || dt == ENG_DTYPE_U64;
    switch (op) {
    case KRN_BIN_ADD: case KRN_BIN_SUB: case KRN_BIN_MUL: case KRN_BIN_DIV: case KRN_BIN_MOD: case KRN_BIN_FMOD:
    case KRN_BIN_MIN: case KRN_BIN_MAX: case KRN_BIN_POW: return fl || in;
    case KRN_BIN_SHL: case KRN_BIN_SHR: return uns;
    case KRN_BIN_PRELU: return fl || (in && !uns);
    case KRN_BIN_EQ: case KRN_BIN_GT: case KRN_BIN_LT: case KRN_BIN_GE: case KRN_BIN_LE:
        return fl || in || dt == ENG_DTYPE_BOOL;
    case KRN_BIN_AND: case KRN_BIN_OR: case KRN_BIN_XOR: return dt == ENG_DTYPE_BOOL;
    default: return 0;
    }
}

/* Which path a call takes: 1 typed kernel, 2 Pow through float64, 0 none. */
static int ewc_binary_path(const krn_call *c) {
    const krn_binary_params *p = (const krn_binary_params *)c->params;
    if (!p || c->nin != 2 || c->nout < 1 || p->layout != KRN_NN_LAYOUT_PLAIN) return 0;
    if (p->op < 0 || p->op >= KRN_BIN_COUNT) return 0;
    eng_dtype a = c->in[0].dtype, b = c->in[1].dtype, o = c->out[0].dtype;
    int cmp = p->op >= KRN_BIN_EQ && p->op <= KRN_BIN_XOR;
    if (cmp && o != ENG_DTYPE_BOOL) return 0;
    if (a == b && ewc_binop_ok(p->op, a)) {
        if (p->op == KRN_BIN_POW && !(ewc_is_f(a) || a == ENG_DTYPE_F64)) return ewc_is_num(o) ? 2 : 0;
        return cmp || o == a ? 1 : (ewc_is_f(a) && o == ENG_DTYPE_F32 ? 1 : 0);
    }
    /* io_ok's mixed float operands, fp32 output */
    if (!cmp && ewc_is_f(a) && ewc_is_f(b) && o == ENG_DTYPE_F32 && ewc_binop_ok(p->op, ENG_DTYPE_F32)) return 1;
    if (p->op == KRN_BIN_POW && ewc_is_num(a) && ewc_is_num(b) && o == a && a != ENG_DTYPE_BOOL &&
        b != ENG_DTYPE_BOOL)
        return 2;
    return 0;
}

static int binary_supports(const krn_call *c) { return ewc_binary_path(c) != 0; }

/* io_ok (kernel.h): float32/f16/bf16 operands read natively; the output stays float32 (the CPU's rule: a
 * residual stream is not stored in reduced precision). */
static int binary_io_ok(const krn_call *c, eng_dtype dt) {
    const krn_binary_params *p = (const krn_binary_params *)c->params;
    if (!ewc_is_half(dt) || !p || p->layout || c->nin != 2 || c->out[0].dtype != ENG_DTYPE_F32) return 0;
    if (p->op >= KRN_BIN_EQ && p->op <= KRN_BIN_XOR) return 0;
    for (int i = 0; i < 2; i++)
        if (c->in[i].dtype != ENG_DTYPE_F32 && c->in[i].dtype != dt) return 0;
    return ewc_binary_path(c) == 1 ? 2 : 0;
}

static eng_status binary_exec(krn_call *c) {
    const krn_binary_params *p = (const krn_binary_params *)c->params;
    cuda_ctx *x = CUDA_CTX(c);
    eng_tensor a = c->in[0], b = c->in[1];
    eng_tensor *out = &c->out[0];
    int path = ewc_binary_path(c);
    if (!path)
        return eng_err(ENG_STATUS_UNSUPPORTED, "cuda eltwise_binary: op %d on %s, %s -> %s (layout %d)", p->op,
                       eng_dtype_name(a.dtype), eng_dtype_name(b.dtype), eng_dtype_name(out->dtype), p->layout);
    if (p->b_override) {
        b.ndim = p->b_ndim;
        memcpy(b.dims, p->b_dims, sizeof b.dims);
    }
    if (eng_tensor_numel(out) <= 0) return ENG_STATUS_OK;
    ewc_bc2 bc{};
    const eng_tensor *ins[2] = {&a, &b};
    ENG_TRY(ewc_bc_bcast<2>(&bc, out, ins, 2, "eltwise_binary"));
    if (bc.n <= 0) return ENG_STATUS_OK;
    if (path == 2) {
        ewc_pow_f64_k<<<ewc_grid(bc.n), EWC_T, 0, x->stream>>>(a.data, a.dtype, b.data, b.dtype, out->data,
                                                               out->dtype, bc);
        CUDA_LAUNCHED("eltwise_binary");
        return ENG_STATUS_OK;
    }
    /* ew_pow_f32_scalar: one exponent over a same-sized output, fp32-computed operands */
    int rule = p->op == KRN_BIN_POW && ewc_is_f(a.dtype) && ewc_is_f(b.dtype) && eng_tensor_numel(&c->in[1]) == 1 &&
               eng_tensor_numel(out) == eng_tensor_numel(&a);
    eng_dtype da = a.dtype, db = b.dtype, dout = out->dtype;
    int op = p->op;
#define EWC_B(DA, TA, DB, TB, DO, TO) \
    if (da == DA && db == DB && dout == DO) return ewc_bin_launch<TA, TB, TO>(x, c, bc, op, rule);
#define EWC_B_SAME(D, T) EWC_B(D, T, D, T, D, T) EWC_B(D, T, D, T, ENG_DTYPE_BOOL, uint8_t)
    EWC_FLT_TYPES(EWC_B_SAME)
    EWC_INT_TYPES(EWC_B_SAME)
    EWC_B(ENG_DTYPE_BOOL, uint8_t, ENG_DTYPE_BOOL, uint8_t, ENG_DTYPE_BOOL, uint8_t)
    EWC_B(ENG_DTYPE_F16, __half, ENG_DTYPE_F16, __half, ENG_DTYPE_F32, float)
    EWC_B(ENG_DTYPE_BF16, __nv_bfloat16, ENG_DTYPE_BF16, __nv_bfloat16, ENG_DTYPE_F32, float)
    EWC_B(ENG_DTYPE_F16, __half, ENG_DTYPE_F32, float, ENG_DTYPE_F32, float)
    EWC_B(ENG_DTYPE_F32, float, ENG_DTYPE_F16, __half, ENG_DTYPE_F32, float)
    EWC_B(ENG_DTYPE_BF16, __nv_bfloat16, ENG_DTYPE_F32, float, ENG_DTYPE_F32, float)
    EWC_B(ENG_DTYPE_F32, float, ENG_DTYPE_BF16, __nv_bfloat16, ENG_DTYPE_F32, float)
    EWC_B(ENG_DTYPE_F16, __half, ENG_DTYPE_BF16, __nv_bfloat16, ENG_DTYPE_F32, float)
    EWC_B(ENG_DTYPE_BF16, __nv_bfloat16, ENG_DTYPE_F16, __half, ENG_DTYPE_F32, float)
#undef EWC_B_SAME
#undef EWC_B
    return eng_err(ENG_STATUS_UNSUPPORTED, "cuda eltwise_binary: op %d on %s, %s -> %s", op, eng_dtype_name(da),
                   eng_dtype_name(db), eng_dtype_name(dout));
}

/* ---------------------------------------------------------------- variadic Sum / Mean / Min / Max */

typedef ewc_bc<EWC_VIN, ENG_MAX_DIMS> ewc_bcv;
struct ewc_ptrs {
    const void *p[EWC_VIN];
};

/* acc = in0, then acc = op(acc, in_k) in order, in the compute type (halves: fp32, rounded once at the end, as
 * the CPU's fp32 accumulator); Mean scales by 1/nin. */
template <typename T>
__global__ void ewc_variadic_k(ewc_ptrs in, T *__restrict__ o, ewc_bcv bc, int nin, int op, int mean) {
    EWC_LOOP(i, bc.n) {
        int64_t off[EWC_VIN];
        ewc_offsets(bc, i, off);
        if constexpr (std::is_integral_v<T>) {
            T acc = ((const T *)in.p[0])[off[0]];
#pragma unroll
            for (int k = 1; k < EWC_VIN; k++)
                if (k < nin) acc = ewc_bini<T>(op, acc, ((const T *)in.p[k])[off[k]]);
            o[i] = acc;
        } else {
            using C = typename ewc_num<T>::C;
            C acc = ewc_num<T>::ld(((const T *)in.p[0])[off[0]]);
#pragma unroll
            for (int k = 1; k < EWC_VIN; k++)
                if (k < nin) acc = ewc_binf<C>(op, acc, ewc_num<T>::ld(((const T *)in.p[k])[off[k]]), 0);
            if (mean && nin > 1) {
                if constexpr (std::is_same_v<C, double>) acc *= 1.0 / nin;
                else acc *= 1.0f / (float)nin;
            }
            o[i] = ewc_num<T>::st(acc);
        }
    }
}

static int variadic_supports(const krn_call *c) {
    const krn_variadic_params *p = (const krn_variadic_params *)c->params;
    if (!p || c->nin < 1 || c->nin > EWC_VIN || c->nout < 1) return 0;
    if (p->op != KRN_BIN_ADD && p->op != KRN_BIN_MIN && p->op != KRN_BIN_MAX) return 0;
    eng_dtype dt = c->out[0].dtype;
    if (!(ewc_is_f(dt) || dt == ENG_DTYPE_F64 || eng_dtype_is_int(dt))) return 0;
    if (p->mean && !(ewc_is_f(dt) || dt == ENG_DTYPE_F64)) return 0;
    for (int i = 0; i < c->nin; i++)
        if (c->in[i].dtype != dt || c->in[i].ndim > c->out[0].ndim) return 0;
    return 1;
}

static eng_status variadic_exec(krn_call *c) {
    const krn_variadic_params *p = (const krn_variadic_params *)c->params;
    cuda_ctx *x = CUDA_CTX(c);
    eng_tensor *out = &c->out[0];
    if (!variadic_supports(c))
        return eng_err(ENG_STATUS_UNSUPPORTED, "cuda eltwise_variadic: %d inputs of %s (at most %d, one dtype)", c->nin,
                       eng_dtype_name(out->dtype), EWC_VIN);
    if (eng_tensor_numel(out) <= 0) return ENG_STATUS_OK;
    ewc_bcv bc{};
    const eng_tensor *ins[EWC_VIN];
    ewc_ptrs ptr;
    memset(&ptr, 0, sizeof ptr);
    for (int i = 0; i < c->nin; i++) ins[i] = &c->in[i], ptr.p[i] = c->in[i].data;
    ENG_TRY(ewc_bc_bcast<EWC_VIN>(&bc, out, ins, c->nin, "eltwise_variadic"));
    if (bc.n <= 0) return ENG_STATUS_OK;
#define EWC_V(D, T) \
    if (out->dtype == D) { \
        ewc_variadic_k<T><<<ewc_grid(bc.n), EWC_T, 0, x->stream>>>(ptr, (T *)out->data, bc, c->nin, p->op, p->mean); \
        CUDA_LAUNCHED("eltwise_variadic"); \
        return ENG_STATUS_OK; \
    }
    EWC_FLT_TYPES(EWC_V)
    EWC_INT_TYPES(EWC_V)
#undef EWC_V
    return eng_err(ENG_STATUS_UNSUPPORTED, "cuda eltwise_variadic on %s", eng_dtype_name(out->dtype));
}

/* ---------------------------------------------------------------- Where */

typedef ewc_bc<3, ENG_MAX_DIMS> ewc_bc3;

template <typename E>
__global__ void ewc_where_k(const uint8_t *__restrict__ cd, const E *__restrict__ a, const E *__restrict__ b,
                            E *__restrict__ o, ewc_bc3 bc) {
    EWC_LOOP(i, bc.n) {
        int64_t off[3];
        ewc_offsets(bc, i, off);
        o[i] = cd[off[0]] ? a[off[1]] : b[off[2]];
    }
}

static int where_supports(const krn_call *c) {
    if (c->nin != 3 || c->nout < 1 || c->in[0].dtype != ENG_DTYPE_BOOL) return 0;
    eng_dtype dt = c->in[1].dtype;
    size_t es = eng_dtype_size(dt);
    return dt == c->in[2].dtype && dt == c->out[0].dtype && (es == 1 || es == 2 || es == 4 || es == 8);
}

static eng_status where_exec(krn_call *c) {
    cuda_ctx *x = CUDA_CTX(c);
    eng_tensor *out = &c->out[0];
    if (!where_supports(c))
        return eng_err(ENG_STATUS_UNSUPPORTED, "cuda eltwise_where: condition %s, X %s, Y %s",
                       eng_dtype_name(c->in[0].dtype), eng_dtype_name(c->in[1].dtype), eng_dtype_name(c->in[2].dtype));
    if (eng_tensor_numel(out) <= 0) return ENG_STATUS_OK;
    ewc_bc3 bc{};
    const eng_tensor *ins[3] = {&c->in[0], &c->in[1], &c->in[2]};
    ENG_TRY(ewc_bc_bcast<3>(&bc, out, ins, 3, "eltwise_where"));
    if (bc.n <= 0) return ENG_STATUS_OK;
    const uint8_t *cd = (const uint8_t *)c->in[0].data;
    switch (eng_dtype_size(out->dtype)) {
#define EWC_W(S, E) \
    case S: \
        ewc_where_k<E><<<ewc_grid(bc.n), EWC_T, 0, x->stream>>>(cd, (const E *)c->in[1].data, \
                                                                (const E *)c->in[2].data, (E *)out->data, bc); \
        break;
        EWC_W(1, uint8_t)
        EWC_W(2, uint16_t)
        EWC_W(4, uint32_t)
        EWC_W(8, uint64_t)
#undef EWC_W
    default: return eng_err(ENG_STATUS_UNSUPPORTED, "cuda eltwise_where on %s", eng_dtype_name(out->dtype));
    }
    CUDA_LAUNCHED("eltwise_where");
    return ENG_STATUS_OK;
}

/* ---------------------------------------------------------------- Clip */

/* Integer Clip: bounds from device scalars (lo/hi, dtype bdt) when given, else lo0/hi0. */
template <typename T>
__global__ void ewc_clip_int_k(const T *__restrict__ x, T *__restrict__ y, int64_t n, const void *lo, const void *hi,
                               int bdt, int64_t lo0, int64_t hi0) {
    if constexpr (std::is_same_v<T, uint64_t>) {
        uint64_t l = lo ? (uint64_t)ewc_ld_i64(lo, 0, bdt) : 0, h = hi ? (uint64_t)ewc_ld_i64(hi, 0, bdt) : UINT64_MAX;
        EWC_LOOP(i, n) y[i] = x[i] < l ? l : (x[i] > h ? h : x[i]);
    } else {
        int64_t l = lo ? ewc_ld_i64(lo, 0, bdt) : lo0, h = hi ? ewc_ld_i64(hi, 0, bdt) : hi0;
        EWC_LOOP(i, n) {
            int64_t v = x[i];
            y[i] = (T)(v < l ? l : (v > h ? h : v));
        }
    }
}

static int clip_supports(const krn_call *c) {
    if (c->nin < 1 || c->nout < 1) return 0;
    eng_dtype a = c->in[0].dtype, b = c->out[0].dtype;
    for (int k = 1; k < c->nin && k <= 2; k++)
        if (c->in[k].dtype != ENG_DTYPE_UNDEFINED && !ewc_is_num(c->in[k].dtype)) return 0;
    if (eng_dtype_is_int(a)) return a == b;
    return ewc_float_pair_ok(a, b);
}

static int clip_io_ok(const krn_call *c, eng_dtype dt) {
    if (!ewc_is_half(dt)) return 0;
    eng_dtype a = c->in[0].dtype, b = c->out[0].dtype;
    return (a == ENG_DTYPE_F32 || a == dt) && (b == ENG_DTYPE_F32 || b == dt) ? 2 : 0;
}

static eng_status clip_exec(krn_call *c) {
    const krn_clip_params *p = (const krn_clip_params *)c->params;
    cuda_ctx *x = CUDA_CTX(c);
    const eng_tensor *in = &c->in[0];
    eng_tensor *out = &c->out[0];
    int64_t n = eng_tensor_numel(in);
    const void *lo = p->from_inputs && c->nin > 1 ? c->in[1].data : NULL;
    const void *hi = p->from_inputs && c->nin > 2 ? c->in[2].data : NULL;
    for (int k = 1; k <= 2; k++)
        if (p->from_inputs && k < c->nin && c->in[k].data && eng_tensor_numel(&c->in[k]) < 1)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "Clip: %s input is empty", k == 1 ? "min" : "max");
    if (!clip_supports(c))
        return eng_err(ENG_STATUS_UNSUPPORTED, "cuda eltwise_clip on %s -> %s", eng_dtype_name(in->dtype),
                       eng_dtype_name(out->dtype));
    if (n <= 0) return ENG_STATUS_OK;
    int bdt = lo ? c->in[1].dtype : hi ? c->in[2].dtype : 0;
    if (lo && hi && c->in[1].dtype != c->in[2].dtype)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "Clip: min is %s but max is %s", eng_dtype_name(c->in[1].dtype),
                       eng_dtype_name(c->in[2].dtype));
    if (!eng_dtype_is_int(in->dtype)) {
        ewc_uargs u = {KRN_ACT_CLIP, -INFINITY, INFINITY, lo, hi, bdt};
        if (!p->from_inputs) u.alpha = p->min, u.beta = p->max;
        return ewc_float_map(x, in, out, u, "eltwise_clip");
    }
    int64_t lo0 = INT64_MIN, hi0 = INT64_MAX;
    if (!p->from_inputs) { /* the CPU's (int64_t) of the float attributes, without its overflow */
        lo0 = p->min <= -9.2e18f ? INT64_MIN : p->min >= 9.2e18f ? INT64_MAX : (int64_t)p->min;
        hi0 = p->max >= 9.2e18f ? INT64_MAX : p->max <= -9.2e18f ? INT64_MIN : (int64_t)p->max;
    }
#define EWC_CI(D, T) \
    if (in->dtype == D) { \
        ewc_clip_int_k<T><<<ewc_grid(n), EWC_T, 0, x->stream>>>((const T *)in->data, (T *)out->data, n, lo, hi, bdt, \
                                                                 lo0, hi0); \
        CUDA_LAUNCHED("eltwise_clip"); \
        return ENG_STATUS_OK; \
    }
    EWC_INT_TYPES(EWC_CI)
#undef EWC_CI
    return eng_err(ENG_STATUS_UNSUPPORTED, "cuda eltwise_clip on %s", eng_dtype_name(in->dtype));
}

/* ---------------------------------------------------------------- Cast */

/* ew_cast_range / eng_convert, element by element: the CPU's typed fast paths where they differ from the generic
 * float64 / int64 route (float32 -> int32/int64: x86 truncation, out of range -> the minimum; int64 -> float32
 * directly, not through float64). */
__host__ __device__ __forceinline__ void ewc_cast_elem(const void *__restrict__ s, int sdt, void *__restrict__ d,
                                                       int ddt, int64_t i) {
    int sfl = sdt == ENG_DTYPE_F32 || sdt == ENG_DTYPE_F64 || sdt == ENG_DTYPE_F16 || sdt == ENG_DTYPE_BF16;
    int dfl = ddt == ENG_DTYPE_F32 || ddt == ENG_DTYPE_F64 || ddt == ENG_DTYPE_F16 || ddt == ENG_DTYPE_BF16;
    if (sdt == ENG_DTYPE_F32 && ddt == ENG_DTYPE_I32) {
        float v = ((const float *)s)[i];
        ((int32_t *)d)[i] = v != v ? 0 : (v >= -2147483648.0f && v < 2147483648.0f) ? (int32_t)v : INT32_MIN;
    } else if (sdt == ENG_DTYPE_F32 && ddt == ENG_DTYPE_I64) {
        float v = ((const float *)s)[i];
        ((int64_t *)d)[i] = v != v ? 0 : (v >= -9.223372036854775808e18f && v < 9.223372036854775808e18f)
                                             ? (int64_t)v : INT64_MIN;
    } else if (sdt == ENG_DTYPE_I64 && ddt == ENG_DTYPE_F32) {
        ((float *)d)[i] = (float)((const int64_t *)s)[i];
    } else if (sfl || dfl || ddt == ENG_DTYPE_BOOL) {
        ewc_st_f64(d, i, ddt, ewc_ld_f64(s, i, sdt));
    } else {
        ewc_st_i64(d, i, ddt, ewc_ld_i64(s, i, sdt));
    }
}

__global__ void ewc_cast_k(const void *__restrict__ s, int sdt, void *__restrict__ d, int ddt, int64_t n) {
    EWC_LOOP(i, n) ewc_cast_elem(s, sdt, d, ddt, i);
}

static int cast_supports(const krn_call *c) {
    return c->nin >= 1 && c->nout >= 1 && ewc_is_num(c->in[0].dtype) && ewc_is_num(c->out[0].dtype);
}

static eng_status cast_exec(krn_call *c) {
    cuda_ctx *x = CUDA_CTX(c);
    const eng_tensor *in = &c->in[0];
    eng_tensor *out = &c->out[0];
    if (!cast_supports(c))
        return eng_err(ENG_STATUS_UNSUPPORTED, "cuda eltwise_cast: Cast from %s to %s", eng_dtype_name(in->dtype),
                       eng_dtype_name(out->dtype));
    int64_t n = eng_tensor_numel(in);
    if (n <= 0) return ENG_STATUS_OK;
    eng_dtype sd = in->dtype, dd = out->dtype;
    if (sd == dd) {
        CUDA_TRY("eltwise_cast", cudaMemcpyAsync(out->data, in->data, (size_t)n * eng_dtype_size(sd),
                                                 cudaMemcpyDeviceToDevice, x->stream));
        return ENG_STATUS_OK;
    }
    if (ewc_is_f(sd) && ewc_is_f(dd)) {
        ewc_uargs u = {KRN_ACT_NONE, 0, 0, NULL, NULL, 0}; /* identity float map: a rounding store */
        return ewc_float_map(x, in, out, u, "eltwise_cast");
    }
    ewc_cast_k<<<ewc_grid(n), EWC_T, 0, x->stream>>>(in->data, sd, out->data, dd, n);
    CUDA_LAUNCHED("eltwise_cast");
    return ENG_STATUS_OK;
}

/* ---------------------------------------------------------------- Dropout (inference) */

__global__ void ewc_fill_one_k(void *__restrict__ m, int dt, int64_t n) { EWC_LOOP(i, n) ewc_st_f64(m, i, dt, 1.0); }

/* The CPU refuses training_mode=true with ratio > 0 by reading both inputs on the host; here they are device
 * data, so a call that has a training_mode input stays on the CPU. */
static int dropout_supports(const krn_call *c) {
    if (c->nin < 1 || c->nout < 1 || !ewc_is_num(c->in[0].dtype)) return 0;
    if (c->nin > 2 && c->in[2].dtype != ENG_DTYPE_UNDEFINED) return 0;
    if (c->nout > 1 && c->out[1].dtype != ENG_DTYPE_UNDEFINED && !ewc_is_num(c->out[1].dtype)) return 0;
    return 1;
}

static eng_status dropout_exec(krn_call *c) {
    cuda_ctx *x = CUDA_CTX(c);
    const eng_tensor *in = &c->in[0];
    if (!dropout_supports(c))
        return eng_err(ENG_STATUS_UNSUPPORTED, "cuda dropout: a training_mode input (its value is on the device)");
    size_t nb = eng_tensor_nbytes(in);
    if (nb) CUDA_TRY("dropout", cudaMemcpyAsync(c->out[0].data, in->data, nb, cudaMemcpyDeviceToDevice, x->stream));
    if (c->nout > 1 && c->out[1].data) {
        eng_tensor *m = &c->out[1];
        int64_t n = eng_tensor_numel(m);
        if (n <= 0) return ENG_STATUS_OK;
        if (m->dtype == ENG_DTYPE_BOOL) {
            CUDA_TRY("dropout", cudaMemsetAsync(m->data, 1, (size_t)n, x->stream));
        } else {
            ewc_fill_one_k<<<ewc_grid(n), EWC_T, 0, x->stream>>>(m->data, m->dtype, n);
            CUDA_LAUNCHED("dropout");
        }
    }
    return ENG_STATUS_OK;
}

/* ---------------------------------------------------------------- TrainingDropout / DropoutGrad */

/* grad.c's counter-based generator: element i keeps iff u_i >= ratio, u_i from splitmix64(seed ^ i * K). The
 * same seed and step give the same mask as the CPU's. */
__host__ __device__ __forceinline__ uint64_t ewc_splitmix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__global__ void ewc_tdrop_k(const float *__restrict__ x, float *__restrict__ y, uint8_t *__restrict__ m, int64_t n,
                            uint64_t seed, double ratio, double scale) {
    EWC_LOOP(i, n) {
        uint64_t h = ewc_splitmix64(seed ^ (uint64_t)i * 0xd1342543de82ef95ull);
        double u = (double)(h >> 11) * (1.0 / 9007199254740992.0);
        int keep = u >= ratio;
        y[i] = keep ? (float)(x[i] * scale) : 0.0f;
        if (m) m[i] = (uint8_t)keep;
    }
}

static int tdrop_supports(const krn_call *c) {
    if (c->nin < 1 || c->nout < 1 || c->in[0].dtype != ENG_DTYPE_F32 || c->out[0].dtype != ENG_DTYPE_F32) return 0;
    if (c->nout > 1 && c->out[1].dtype != ENG_DTYPE_UNDEFINED && c->out[1].dtype != ENG_DTYPE_BOOL) return 0;
    return 1;
}

static eng_status tdrop_exec(krn_call *c) {
    const krn_dropout_train_params *p = (const krn_dropout_train_params *)c->params;
    cuda_ctx *x = CUDA_CTX(c);
    if (!tdrop_supports(c))
        return eng_err(ENG_STATUS_UNSUPPORTED, "cuda training_dropout: data %s (float32 expected)",
                       eng_dtype_name(c->in[0].dtype));
    int64_t n = eng_tensor_numel(&c->out[0]);
    if (n <= 0) return ENG_STATUS_OK;
    uint8_t *m = c->nout > 1 ? (uint8_t *)c->out[1].data : NULL;
    uint64_t seed = ewc_splitmix64((uint64_t)(p->seed + krn_grad_dropout_get_step()));
    double ratio = p->ratio;
    ewc_tdrop_k<<<ewc_grid(n), EWC_T, 0, x->stream>>>((const float *)c->in[0].data, (float *)c->out[0].data, m, n,
                                                      seed, ratio, 1.0 / (1.0 - ratio));
    CUDA_LAUNCHED("training_dropout");
    return ENG_STATUS_OK;
}

__global__ void ewc_drop_grad_k(const float *__restrict__ g, const uint8_t *__restrict__ m, float *__restrict__ o,
                                int64_t n, float scale) {
    EWC_LOOP(i, n) o[i] = m[i] ? g[i] * scale : 0.0f;
}

static int drop_grad_supports(const krn_call *c) {
    return c->nin >= 2 && c->nout >= 1 && c->in[0].dtype == ENG_DTYPE_F32 && c->in[1].dtype == ENG_DTYPE_BOOL &&
           c->out[0].dtype == ENG_DTYPE_F32 && eng_tensor_numel(&c->in[1]) >= eng_tensor_numel(&c->out[0]) &&
           eng_tensor_numel(&c->in[0]) >= eng_tensor_numel(&c->out[0]);
}

static eng_status drop_grad_exec(krn_call *c) {
    const krn_dropout_train_params *p = (const krn_dropout_train_params *)c->params;
    cuda_ctx *x = CUDA_CTX(c);
    if (!drop_grad_supports(c))
        return eng_err(ENG_STATUS_UNSUPPORTED, "cuda grad_dropout: dy %s, mask %s (float32, bool expected)",
                       eng_dtype_name(c->in[0].dtype), eng_dtype_name(c->in[1].dtype));
    int64_t n = eng_tensor_numel(&c->out[0]);
    if (n <= 0) return ENG_STATUS_OK;
    ewc_drop_grad_k<<<ewc_grid(n), EWC_T, 0, x->stream>>>((const float *)c->in[0].data, (const uint8_t *)c->in[1].data,
                                                          (float *)c->out[0].data, n, (float)(1.0 / (1.0 - p->ratio)));
    CUDA_LAUNCHED("grad_dropout");
    return ENG_STATUS_OK;
}

/* ---------------------------------------------------------------- activation gradients */

__global__ void ewc_act_grad_k(const float *__restrict__ dy, const float *__restrict__ x, float *__restrict__ dx,
                               int64_t n, int kind, float alpha, int gt, float lo0, float hi0, const void *lo_p,
                               int lo_dt, const void *hi_p, int hi_dt) {
    float lo = lo_p ? (float)ewc_ld_f64(lo_p, 0, lo_dt) : lo0, hi = hi_p ? (float)ewc_ld_f64(hi_p, 0, hi_dt) : hi0;
    EWC_LOOP(i, n) {
        float g = dy[i], v = x[i], r;
        switch (kind) {
        case KRN_ACT_GRAD_RELU: r = v > 0.0f ? g : 0.0f; break;
        case KRN_ACT_GRAD_LEAKY_RELU: r = v > 0.0f ? g : g * alpha; break;
        case KRN_ACT_GRAD_GELU:
            if (gt) {
                const float k = 0.7978845608028654f, a = 0.044715f;
                float t = tanhf(k * (v + a * v * v * v));
                r = g * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * k * (1.0f + 3.0f * a * v * v));
            } else {
                r = g * (0.5f * erfcf(-v * 0.70710678118654752f) + v * expf(-0.5f * v * v) * 0.3989422804014327f);
            }
            break;
        case KRN_ACT_GRAD_ERF: r = g * 1.1283791670955126f * expf(-v * v); break;
        case KRN_ACT_GRAD_SIGMOID: r = g * v * (1.0f - v); break;
        case KRN_ACT_GRAD_TANH: r = g * (1.0f - v * v); break;
        case KRN_ACT_GRAD_SILU: {
            float s = 1.0f / (1.0f + expf(-v));
            r = g * s * (1.0f + v * (1.0f - s));
            break;
        }
        default: r = v >= lo && v <= hi ? g : 0.0f; break;
        }
        dx[i] = r;
    }
}

static int act_grad_supports(const krn_call *c) {
    const krn_act_grad_params *p = (const krn_act_grad_params *)c->params;
    if (!p || c->nin < 2 || c->nout < 1 || p->kind < KRN_ACT_GRAD_RELU || p->kind > KRN_ACT_GRAD_SILU) return 0;
    if (c->in[0].dtype != ENG_DTYPE_F32 || c->in[1].dtype != ENG_DTYPE_F32 || c->out[0].dtype != ENG_DTYPE_F32)
        return 0;
    int64_t n = eng_tensor_numel(&c->out[0]);
    if (eng_tensor_numel(&c->in[0]) < n || eng_tensor_numel(&c->in[1]) < n) return 0;
    for (int k = 2; k < c->nin && k < 4; k++)
        if (c->in[k].dtype != ENG_DTYPE_UNDEFINED && !ewc_is_num(c->in[k].dtype)) return 0;
    return 1;
}

static eng_status act_grad_exec(krn_call *c) {
    const krn_act_grad_params *p = (const krn_act_grad_params *)c->params;
    cuda_ctx *x = CUDA_CTX(c);
    if (!act_grad_supports(c))
        return eng_err(ENG_STATUS_UNSUPPORTED, "cuda grad_act: kind %d on dy %s, x %s (float32 expected)",
                       p ? p->kind : -1, eng_dtype_name(c->in[0].dtype), eng_dtype_name(c->in[1].dtype));
    int64_t n = eng_tensor_numel(&c->out[0]);
    if (n <= 0) return ENG_STATUS_OK;
    const void *lo = c->nin > 2 ? c->in[2].data : NULL, *hi = c->nin > 3 ? c->in[3].data : NULL;
    ewc_act_grad_k<<<ewc_grid(n), EWC_T, 0, x->stream>>>(
        (const float *)c->in[0].data, (const float *)c->in[1].data, (float *)c->out[0].data, n, p->kind, p->alpha,
        p->gelu_tanh, p->clip_min, p->clip_max, lo, lo ? c->in[2].dtype : 0, hi, hi ? c->in[3].dtype : 0);
    CUDA_LAUNCHED("grad_act");
    return ENG_STATUS_OK;
}

/* ---------------------------------------------------------------- Expand / Tile */

typedef ewc_bc<1, EWC_VIEW> ewc_bc1;

template <typename E>
__global__ void ewc_copy_k(const E *__restrict__ s, E *__restrict__ d, ewc_bc1 bc) {
    EWC_LOOP(i, bc.n) {
        int64_t off[1];
        ewc_offsets(bc, i, off);
        d[i] = s[off[0]];
    }
}

/* dst (dense over view dims vd[nd]) <- src at strides vs: the CPU's krn_cpu_strided_copy. */
static eng_status ewc_view_copy(cuda_ctx *x, const void *src, void *dst, size_t es, int nd, const int64_t *vd,
                                const int64_t *vs, const char *what) {
    int64_t st[1][EWC_VIEW];
    for (int i = 0; i < nd; i++) st[0][i] = vs[i];
    ewc_bc1 bc{};
    int64_t one = 1;
    ewc_bc_view<1, EWC_VIEW>(&bc, nd, nd ? vd : &one, st);
    if (nd == 0) bc.n = 1;
    if (bc.n <= 0) return ENG_STATUS_OK;
    if (bc.nd == 1 && bc.str[0][0] == 1) { /* nothing repeats: one contiguous copy */
        CUDA_TRY(what, cudaMemcpyAsync(dst, src, (size_t)bc.n * es, cudaMemcpyDeviceToDevice, x->stream));
        return ENG_STATUS_OK;
    }
    switch (es) {
#define EWC_C(S, E) \
    case S: ewc_copy_k<E><<<ewc_grid(bc.n), EWC_T, 0, x->stream>>>((const E *)src, (E *)dst, bc); break;
        EWC_C(1, uint8_t)
        EWC_C(2, uint16_t)
        EWC_C(4, uint32_t)
        EWC_C(8, uint64_t)
#undef EWC_C
    default: return eng_err(ENG_STATUS_UNSUPPORTED, "cuda %s: element size %zu", what, es);
    }
    CUDA_LAUNCHED(what);
    return ENG_STATUS_OK;
}

static int copy_supports(const krn_call *c) {
    if (c->nin < 1 || c->nout < 1 || c->in[0].dtype != c->out[0].dtype) return 0;
    size_t es = eng_dtype_size(c->in[0].dtype);
    return (es == 1 || es == 2 || es == 4 || es == 8) && c->in[0].ndim <= c->out[0].ndim;
}

static void ewc_strides(const eng_tensor *t, int64_t *st) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) st[i] = s, s *= t->dims[i];
}

static eng_status expand_exec(krn_call *c) {
    const eng_tensor *in = &c->in[0];
    eng_tensor *o = &c->out[0];
    if (!copy_supports(c))
        return eng_err(ENG_STATUS_UNSUPPORTED, "cuda expand: %s -> %s", eng_dtype_name(in->dtype),
                       eng_dtype_name(o->dtype));
    if (eng_tensor_numel(o) <= 0) return ENG_STATUS_OK;
    int64_t st[ENG_MAX_DIMS], ss[ENG_MAX_DIMS];
    ewc_strides(in, st);
    int off = o->ndim - in->ndim;
    for (int i = 0; i < o->ndim; i++) ss[i] = (i < off || in->dims[i - off] == 1) ? 0 : st[i - off];
    return ewc_view_copy(CUDA_CTX(c), in->data, o->data, eng_dtype_size(in->dtype), o->ndim, o->dims, ss, "expand");
}

static int tile_supports(const krn_call *c) { return copy_supports(c) && c->in[0].ndim == c->out[0].ndim; }

static eng_status tile_exec(krn_call *c) {
    const eng_tensor *in = &c->in[0];
    eng_tensor *o = &c->out[0];
    if (!tile_supports(c))
        return eng_err(ENG_STATUS_UNSUPPORTED, "cuda tile: %s rank %d -> %s rank %d", eng_dtype_name(in->dtype),
                       in->ndim, eng_dtype_name(o->dtype), o->ndim);
    if (eng_tensor_numel(o) <= 0) return ENG_STATUS_OK;
    int64_t st[ENG_MAX_DIMS], vd[EWC_VIEW], vs[EWC_VIEW];
    ewc_strides(in, st);
    for (int i = 0; i < in->ndim; i++) {
        vd[2 * i] = o->dims[i] / in->dims[i];
        vs[2 * i] = 0;
        vd[2 * i + 1] = in->dims[i];
        vs[2 * i + 1] = st[i];
    }
    return ewc_view_copy(CUDA_CTX(c), in->data, o->data, eng_dtype_size(in->dtype), 2 * in->ndim, vd, vs, "tile");
}

extern "C" const krn_kernel krn_cuda_eltwise_kernels[] = {
    {.name = "eltwise_unary", .init = NULL, .exec = unary_exec, .free_state = NULL, .describe = NULL,
     .compute_ok = NULL, .io_ok = unary_io_ok, .supports = unary_supports},
    {.name = "eltwise_binary", .init = NULL, .exec = binary_exec, .free_state = NULL, .describe = NULL,
     .compute_ok = NULL, .io_ok = binary_io_ok, .supports = binary_supports},
    {.name = "eltwise_variadic", .init = NULL, .exec = variadic_exec, .free_state = NULL, .describe = NULL,
     .compute_ok = NULL, .io_ok = NULL, .supports = variadic_supports},
    {.name = "eltwise_where", .init = NULL, .exec = where_exec, .free_state = NULL, .describe = NULL,
     .compute_ok = NULL, .io_ok = NULL, .supports = where_supports},
    {.name = "eltwise_clip", .init = NULL, .exec = clip_exec, .free_state = NULL, .describe = NULL,
     .compute_ok = NULL, .io_ok = clip_io_ok, .supports = clip_supports},
    {.name = "eltwise_cast", .init = NULL, .exec = cast_exec, .free_state = NULL, .describe = NULL,
     .compute_ok = NULL, .io_ok = NULL, .supports = cast_supports},
    {.name = "dropout", .init = NULL, .exec = dropout_exec, .free_state = NULL, .describe = NULL,
     .compute_ok = NULL, .io_ok = NULL, .supports = dropout_supports},
    {.name = "training_dropout", .init = NULL, .exec = tdrop_exec, .free_state = NULL, .describe = NULL,
     .compute_ok = NULL, .io_ok = NULL, .supports = tdrop_supports},
    {.name = "grad_dropout", .init = NULL, .exec = drop_grad_exec, .free_state = NULL, .describe = NULL,
     .compute_ok = NULL, .io_ok = NULL, .supports = drop_grad_supports},
    {.name = "grad_act", .init = NULL, .exec = act_grad_exec, .free_state = NULL, .describe = NULL,
     .compute_ok = NULL, .io_ok = NULL, .supports = act_grad_supports},
    {.name = "expand", .init = NULL, .exec = expand_exec, .free_state = NULL, .describe = NULL,
     .compute_ok = NULL, .io_ok = NULL, .supports = copy_supports},
    {.name = "tile", .init = NULL, .exec = tile_exec, .free_state = NULL, .describe = NULL,
     .compute_ok = NULL, .io_ok = NULL, .supports = tile_supports},
    {.name = NULL},
};
