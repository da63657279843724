/* cuda-tensor-impl.h - device helpers shared by the CUDA "tensor" family (cuda-tensor.cu): a 32-bit multiply-shift
 * divider, dtype-generic loads and stores with the CPU's conversion rules (engine/ir/tensor.c), the Scatter
 * reductions with their atomics, and the per-call index error record.
 *
 * Invariants: every element index is 64-bit; ts_q<false> (the fast divider) is only used when every dividend is
 * below 2^31 (the caller picks BIG = true otherwise); loads and stores convert exactly as eng_tensor_get_f64 /
 * eng_tensor_get_i64 / eng_tensor_set_f64 do.
 */
#ifndef KRN_CUDA_TENSOR_IMPL_H
#define KRN_CUDA_TENSOR_IMPL_H

#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "cuda-impl.h"
extern "C" {
#include "../krn-tensor.h"
}

#define TS_THREADS 256
#define TS_MAXD ENG_MAX_DIMS
#define TS_SMALL ((int64_t)1 << 31) /* element counts below this decompose with the 32-bit divider */

/* ---- division ---- */

/* n / d for n < 2^31: q = (umulhi(n, m) + n) >> s (Granlund-Montgomery, as in PyTorch's IntDivider). d is kept for
 * the 64-bit path and the remainder. */
struct ts_div {
    int64_t d;
    uint32_t m, s;
};

static inline ts_div ts_div_make(int64_t d) {
    ts_div f = {d < 1 ? 1 : d, 0, 0};
    if (f.d < TS_SMALL) {
        uint32_t s = 0;
        while (s < 31 && ((uint64_t)1 << s) < (uint64_t)f.d) s++;
        f.s = s;
        f.m = (uint32_t)((((uint64_t)1 << 32) * (((uint64_t)1 << s) - (uint64_t)f.d)) / (uint64_t)f.d + 1);
    }
    return f;
}

template <bool BIG> __device__ __forceinline__ int64_t ts_q(int64_t n, const ts_div &f) {
    if constexpr (BIG) return n / f.d;
    else {
        uint32_t u = (uint32_t)n;
        return (int64_t)((__umulhi(u, f.m) + u) >> f.s);
    }
}

/* ---- index error record ---- */

/* The first out-of-range index a kernel met (flag 1): its value, flat position in the index tensor, and the size it
 * had to lie in. Cleared by every exec; read by krn_cuda_tensor_check after the plan's sync. */
struct ts_err {
    int flag;
    int pad_;
    long long value, pos, n;
};

__device__ __forceinline__ void ts_err_set(ts_err *e, int64_t v, int64_t pos, int64_t n) {
    if (atomicCAS(&e->flag, 0, 1) == 0) {
        e->value = v;
        e->pos = pos;
        e->n = n;
    }
}

/* ---- loads / stores by dtype (engine/ir/tensor.c semantics) ---- */

__device__ __forceinline__ double ts_ld_f64(const void *p, int dt, int64_t i) {
    switch (dt) {
    case ENG_DTYPE_F32: return (double)((const float *)p)[i];
    case ENG_DTYPE_F64: return ((const double *)p)[i];
    case ENG_DTYPE_F16: return (double)__half2float(((const __half *)p)[i]);
    case ENG_DTYPE_BF16: return (double)__bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case ENG_DTYPE_I64: return (double)((const int64_t *)p)[i];
    case ENG_DTYPE_I32: return (double)((const int32_t *)p)[i];
    case ENG_DTYPE_U64: return (double)((const uint64_t *)p)[i];
    case ENG_DTYPE_U32: return (double)((const uint32_t *)p)[i];
    case ENG_DTYPE_U8: return (double)((const uint8_t *)p)[i];
    case ENG_DTYPE_I8: return (double)((const int8_t *)p)[i];
    case ENG_DTYPE_U16: return (double)((const uint16_t *)p)[i];
    case ENG_DTYPE_I16: return (double)((const int16_t *)p)[i];
    case ENG_DTYPE_BOOL: return ((const uint8_t *)p)[i] != 0 ? 1.0 : 0.0;
    default: return 0;
    }
}

__device__ __forceinline__ int64_t ts_ld_i64(const void *p, int dt, int64_t i) {
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
    default: {
        double d = ts_ld_f64(p, dt, i);
        if (d != d) return 0;
        if (d >= 9.2e18) return INT64_MAX;
        if (d <= -9.2e18) return INT64_MIN;
        return (int64_t)d;
    }
    }
}

/* An int32/int64 index tensor. */
__device__ __forceinline__ int64_t ts_idx(const void *p, int idx64, int64_t i) {
    return idx64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}

/* eng_tensor_set_f64 for the interpolating Resize dtypes. */
__device__ __forceinline__ void ts_st_f64(float *p, double v) { *p = (float)v; }
__device__ __forceinline__ void ts_st_f64(double *p, double v) { *p = v; }
__device__ __forceinline__ void ts_st_f64(__half *p, double v) { *p = __float2half_rn((float)v); }
__device__ __forceinline__ void ts_st_f64(__nv_bfloat16 *p, double v) { *p = __float2bfloat16_rn((float)v); }
__device__ __forceinline__ int64_t ts_f64_to_i64(double v) {
    return (v != v) ? 0 : (v >= 9.2e18 ? INT64_MAX : (v <= -9.2e18 ? INT64_MIN : (int64_t)v));
}
__device__ __forceinline__ void ts_st_f64(uint8_t *p, double v) { *p = (uint8_t)ts_f64_to_i64(v); }
__device__ __forceinline__ void ts_st_f64(int8_t *p, double v) { *p = (int8_t)ts_f64_to_i64(v); }
__device__ __forceinline__ void ts_st_f64(int32_t *p, double v) { *p = (int32_t)ts_f64_to_i64(v); }

__device__ __forceinline__ double ts_to_f64(float v) { return (double)v; }
__device__ __forceinline__ double ts_to_f64(double v) { return v; }
__device__ __forceinline__ double ts_to_f64(__half v) { return (double)__half2float(v); }
__device__ __forceinline__ double ts_to_f64(__nv_bfloat16 v) { return (double)__bfloat162float(v); }
__device__ __forceinline__ double ts_to_f64(uint8_t v) { return (double)v; }
__device__ __forceinline__ double ts_to_f64(int8_t v) { return (double)v; }
__device__ __forceinline__ double ts_to_f64(int32_t v) { return (double)v; }

/* ---- Scatter reductions (tensor-index.c krn_reduce_elem: in the element's type, f16/bf16 through float) ---- */

struct ts_bool {
    uint8_t v;
};

template <typename S> __device__ __forceinline__ S ts_red(S a, S b, int r) {
    switch (r) {
    case KRN_SCATTER_ADD: return (S)(a + b);
    case KRN_SCATTER_MUL: return (S)(a * b);
    case KRN_SCATTER_MAX: return b > a ? b : a;
    case KRN_SCATTER_MIN: return b < a ? b : a;
    default: return b;
    }
}
template <> __device__ __forceinline__ __half ts_red<__half>(__half a, __half b, int r) {
    return __float2half_rn(ts_red<float>(__half2float(a), __half2float(b), r));
}
template <> __device__ __forceinline__ __nv_bfloat16 ts_red<__nv_bfloat16>(__nv_bfloat16 a, __nv_bfloat16 b, int r) {
    return __float2bfloat16_rn(ts_red<float>(__bfloat162float(a), __bfloat162float(b), r));
}
template <> __device__ __forceinline__ ts_bool ts_red<ts_bool>(ts_bool a, ts_bool b, int r) {
    ts_bool o;
    if (r == KRN_SCATTER_ADD || r == KRN_SCATTER_MAX) o.v = a.v || b.v;
    else if (r == KRN_SCATTER_MUL || r == KRN_SCATTER_MIN) o.v = a.v && b.v;
    else o.v = b.v;
    return o;
}

/* *p = ts_red(*p, v, r) atomically: native atomics where CUDA has them, else a compare-and-swap loop (1- and 2-byte
 * elements on their aligned 32-bit word; the neighbouring bytes are written back unchanged). */
template <typename S> __device__ void ts_atomic_red(S *p, S v, int r) {
    constexpr bool is_int = std::is_integral_v<S>;
    constexpr bool is_signed = std::is_signed_v<S>;
    if constexpr (std::is_same_v<S, float> || std::is_same_v<S, double>) {
        if (r == KRN_SCATTER_ADD) {
            atomicAdd(p, v);
            return;
        }
    } else if constexpr (is_int && sizeof(S) == 4) {
        if (r == KRN_SCATTER_ADD) {
            atomicAdd((unsigned *)p, (unsigned)v);
            return;
        }
        if (r == KRN_SCATTER_MAX || r == KRN_SCATTER_MIN) {
            if constexpr (is_signed) {
                if (r == KRN_SCATTER_MAX) atomicMax((int *)p, (int)v);
                else atomicMin((int *)p, (int)v);
            } else {
                if (r == KRN_SCATTER_MAX) atomicMax((unsigned *)p, (unsigned)v);
                else atomicMin((unsigned *)p, (unsigned)v);
            }
            return;
        }
    } else if constexpr (is_int && sizeof(S) == 8) {
        if (r == KRN_SCATTER_ADD) {
            atomicAdd((unsigned long long *)p, (unsigned long long)v);
            return;
        }
        if (r == KRN_SCATTER_MAX || r == KRN_SCATTER_MIN) {
            if constexpr (is_signed) {
                if (r == KRN_SCATTER_MAX) atomicMax((long long *)p, (long long)v);
                else atomicMin((long long *)p, (long long)v);
            } else {
                if (r == KRN_SCATTER_MAX) atomicMax((unsigned long long *)p, (unsigned long long)v);
                else atomicMin((unsigned long long *)p, (unsigned long long)v);
            }
            return;
        }
    }
    if constexpr (sizeof(S) == 8) {
        unsigned long long *a = (unsigned long long *)p, old = *a, as, nb;
        do {
            as = old;
            S cur, nv;
            memcpy(&cur, &as, 8);
            nv = ts_red<S>(cur, v, r);
            memcpy(&nb, &nv, 8);
            old = atomicCAS(a, as, nb);
        } while (old != as);
    } else if constexpr (sizeof(S) == 4) {
        unsigned *a = (unsigned *)p, old = *a, as, nb;
        do {
            as = old;
            S cur, nv;
            memcpy(&cur, &as, 4);
            nv = ts_red<S>(cur, v, r);
            memcpy(&nb, &nv, 4);
            old = atomicCAS(a, as, nb);
        } while (old != as);
    } else {
        uintptr_t addr = (uintptr_t)p;
        unsigned *a = (unsigned *)(addr & ~(uintptr_t)3);
        const unsigned shift = (unsigned)(addr & 3) * 8;
        const unsigned mask = (sizeof(S) == 1 ? 0xffu : 0xffffu) << shift;
        unsigned old = *a, as;
        do {
            as = old;
            unsigned bits = (as & mask) >> shift, nbits = 0;
            S cur, nv;
            memcpy(&cur, &bits, sizeof(S));
            nv = ts_red<S>(cur, v, r);
            memcpy(&nbits, &nv, sizeof(S));
            old = atomicCAS(a, as, (as & ~mask) | ((nbits << shift) & mask));
        } while (old != as);
    }
}

#endif
