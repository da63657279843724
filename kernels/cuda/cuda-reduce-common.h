/* cuda-reduce-common.h - device helpers shared by the CUDA reduce family (kernels/cuda/cuda-reduce*.{cu,h});
 * internal to cuda-reduce.cu, which includes it once.
 *
 * Element I/O converts between a tensor's dtype and the work type (float for f32/f16/bf16, double for f64,
 * int64 for integers), exactly as the CPU kernels convert into their scratch copies. Group reductions run over
 * one warp (G == 32, several groups per block) or one whole 1-D block (G == blockDim.x); every thread of the
 * group must call them (they shuffle and, for blocks, __syncthreads) and every thread gets the result.
 * Side tensors (scales, weights, statistics) of any float dtype go through ld_any / st_any (a uniform switch
 * per element: for vectors of C elements, not for activations).
 */
#ifndef KRN_CUDA_REDUCE_COMMON_H
#define KRN_CUDA_REDUCE_COMMON_H

#include <math.h>
#include <stdint.h>
#include <type_traits>

#include "cuda-impl.h"

#define RD_FULL 0xffffffffu
#define RD_THREADS 256  /* threads per block of every row/element kernel here */
#define RD_ROW_BLOCK 1024 /* rows longer than this get a whole block instead of one warp */

/* ---- element I/O ---- */

template <typename T> struct rd_io {
    template <typename W> static __device__ __forceinline__ W in(T v) { return (W)v; }
    template <typename W> static __device__ __forceinline__ T out(W v) { return (T)v; }
};
template <> struct rd_io<__half> {
    template <typename W> static __device__ __forceinline__ W in(__half v) { return (W)__half2float(v); }
    template <typename W> static __device__ __forceinline__ __half out(W v) { return __float2half_rn((float)v); }
};
template <> struct rd_io<__nv_bfloat16> {
    template <typename W> static __device__ __forceinline__ W in(__nv_bfloat16 v) { return (W)__bfloat162float(v); }
    template <typename W> static __device__ __forceinline__ __nv_bfloat16 out(W v) { return __float2bfloat16_rn((float)v); }
};

template <typename W, typename T> static __device__ __forceinline__ W ldw(const T *p, int64_t i) {
    return rd_io<T>::template in<W>(p[i]);
}
template <typename T, typename W> static __device__ __forceinline__ void stw(T *p, int64_t i, W v) {
    p[i] = rd_io<T>::template out<W>(v);
}

/* Element i of a side tensor of dtype dt, as double (float dtypes and the integer index dtypes). */
static __device__ __forceinline__ double ld_any(const void *p, eng_dtype dt, int64_t i) {
    switch (dt) {
    case ENG_DTYPE_F32: return ((const float *)p)[i];
    case ENG_DTYPE_F64: return ((const double *)p)[i];
    case ENG_DTYPE_F16: return __half2float(((const __half *)p)[i]);
    case ENG_DTYPE_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case ENG_DTYPE_I32: return ((const int32_t *)p)[i];
    case ENG_DTYPE_I64: return (double)((const int64_t *)p)[i];
    default: return 0.0;
    }
}
static __device__ __forceinline__ void st_any(void *p, eng_dtype dt, int64_t i, double v) {
    switch (dt) {
    case ENG_DTYPE_F32: ((float *)p)[i] = (float)v; break;
    case ENG_DTYPE_F64: ((double *)p)[i] = v; break;
    case ENG_DTYPE_F16: ((__half *)p)[i] = __float2half_rn((float)v); break;
    case ENG_DTYPE_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn((float)v); break;
    default: break;
    }
}
static __device__ __forceinline__ int64_t ld_index(const void *p, int is64, int64_t i) {
    return is64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}

static inline int rd_is_float(eng_dtype dt) {
    return dt == ENG_DTYPE_F32 || dt == ENG_DTYPE_F16 || dt == ENG_DTYPE_BF16 || dt == ENG_DTYPE_F64;
}
static inline int rd_is_lowp(eng_dtype dt) { return dt == ENG_DTYPE_F32 || dt == ENG_DTYPE_F16 || dt == ENG_DTYPE_BF16; }
static inline int rd_is_index(eng_dtype dt) { return dt == ENG_DTYPE_I32 || dt == ENG_DTYPE_I64; }
static inline int rd_numeric(eng_dtype dt) { return rd_is_float(dt) || rd_is_index(dt); }

/* ---- math on the work type ---- */

static __device__ __forceinline__ float rd_exp(float v) { return expf(v); }
static __device__ __forceinline__ double rd_exp(double v) { return exp(v); }
static __device__ __forceinline__ float rd_log(float v) { return logf(v); }
static __device__ __forceinline__ double rd_log(double v) { return log(v); }
static __device__ __forceinline__ float rd_sqrt(float v) { return sqrtf(v); }
static __device__ __forceinline__ double rd_sqrt(double v) { return sqrt(v); }

template <typename W> struct rd_lim;
template <> struct rd_lim<float> {
    static __device__ __forceinline__ float lo() { return -INFINITY; }
    static __device__ __forceinline__ float hi() { return INFINITY; }
};
template <> struct rd_lim<double> {
    static __device__ __forceinline__ double lo() { return -INFINITY; }
    static __device__ __forceinline__ double hi() { return INFINITY; }
};
template <> struct rd_lim<int64_t> {
    static __device__ __forceinline__ int64_t lo() { return INT64_MIN; }
    static __device__ __forceinline__ int64_t hi() { return INT64_MAX; }
};

template <typename W> static __device__ __forceinline__ bool rd_nan(W v) {
    if constexpr (std::is_floating_point_v<W>) return isnan(v);
    else return false;
}

/* combine / transform / finish codes of ReduceX (kernels/cpu/reduce.c's RED_COMB_* / RED_XF_*) */
enum { RC_ADD = 0, RC_MUL, RC_MAX, RC_MIN };
enum { RX_ID = 0, RX_ABS, RX_SQ };
enum { RP_NONE = 0, RP_MEAN, RP_SQRT, RP_LOG, RP_LSE };

template <typename W> static __device__ __forceinline__ W rc_ident(int comb) {
    return comb == RC_MUL ? (W)1 : comb == RC_MAX ? rd_lim<W>::lo() : comb == RC_MIN ? rd_lim<W>::hi() : (W)0;
}
template <typename W> static __device__ __forceinline__ W rc_do(W a, W b, int comb) {
    switch (comb) {
    case RC_MUL: return a * b;
    case RC_MAX: return b > a ? b : a;
    case RC_MIN: return b < a ? b : a;
    default: return a + b;
    }
}
template <typename W> static __device__ __forceinline__ W rx_do(W v, int xf) {
    switch (xf) {
    case RX_ABS: return v < 0 ? -v : v;
    case RX_SQ: return v * v;
    default: return v;
    }
}

/* ---- group reductions ---- */

template <typename W> static __device__ __forceinline__ W warp_comb(W v, int comb) {
    for (int o = 16; o > 0; o >>= 1) v = rc_do(v, __shfl_xor_sync(RD_FULL, v, o), comb);
    return v;
}

/* Whole 1-D block; sh: 32 W of shared memory. */
template <typename W> static __device__ W block_comb(W v, int comb, W *sh) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_comb(v, comb);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : rc_ident<W>(comb);
    return warp_comb(v, comb);
}

template <int G, typename W> static __device__ __forceinline__ W grp_comb(W v, int comb, W *sh) {
    if constexpr (G == 32) return warp_comb(v, comb);
    else return block_comb(v, comb, sh);
}

/* Best (value, index) pair: index < 0 means none. The first beats the second when its value is greater
 * (smaller with is_min) or equal with a lower index (higher with last). */
template <typename W> static __device__ __forceinline__ bool pick_better(W v, int64_t i, W bv, int64_t bi, int is_min, int last) {
    if (i < 0) return false;
    if (bi < 0) return true;
    if (is_min ? v < bv : v > bv) return true;
    if (v == bv) return last ? i > bi : i < bi;
    return false;
}
template <typename W> static __device__ __forceinline__ void warp_pick(W &v, int64_t &i, int is_min, int last) {
    for (int o = 16; o > 0; o >>= 1) {
        W ov = __shfl_xor_sync(RD_FULL, v, o);
        int64_t oi = __shfl_xor_sync(RD_FULL, i, o);
        if (pick_better(ov, oi, v, i, is_min, last)) v = ov, i = oi;
    }
}
template <int G, typename W> static __device__ void grp_pick(W &v, int64_t &i, int is_min, int last, W *shv, int64_t *shi) {
    warp_pick(v, i, is_min, last);
    if constexpr (G != 32) {
        int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
        __syncthreads();
        if (lane == 0) shv[wid] = v, shi[wid] = i;
        __syncthreads();
        v = lane < nw ? shv[lane] : (W)0;
        i = lane < nw ? shi[lane] : -1;
        warp_pick(v, i, is_min, last);
    }
}

/* Online (max, sum of exp(x - max)) pairs for softmax-style normalisers. */
template <typename W> static __device__ __forceinline__ void ms_add(W &m, W &s, W v) {
    if (v > m) {
        s = s * rd_exp(m - v) + (W)1;
        m = v;
    } else if (v != rd_lim<W>::lo()) { /* exp(-inf) adds 0; skipping it keeps -inf - -inf out (masked rows) */
        s += rd_exp(v - m);
    }
}
template <typename W> static __device__ __forceinline__ void ms_merge(W &m, W &s, W m2, W s2) {
    if (s2 == (W)0 && m2 == rd_lim<W>::lo()) return; /* an empty partner */
    if (m2 > m) {
        s = s * rd_exp(m - m2) + s2;
        m = m2;
    } else {
        s += s2 * rd_exp(m2 - m);
    }
}
template <int G, typename W> static __device__ void grp_ms(W &m, W &s, W *shm, W *shs) {
    for (int o = 16; o > 0; o >>= 1) {
        W m2 = __shfl_xor_sync(RD_FULL, m, o), s2 = __shfl_xor_sync(RD_FULL, s, o);
        ms_merge(m, s, m2, s2);
    }
    if constexpr (G != 32) {
        int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
        __syncthreads();
        if (lane == 0) shm[wid] = m, shs[wid] = s;
        __syncthreads();
        m = lane < nw ? shm[lane] : rd_lim<W>::lo();
        s = lane < nw ? shs[lane] : (W)0;
        for (int o = 16; o > 0; o >>= 1) {
            W m2 = __shfl_xor_sync(RD_FULL, m, o), s2 = __shfl_xor_sync(RD_FULL, s, o);
            ms_merge(m, s, m2, s2);
        }
    }
}

/* Group geometry: G == 32: one warp per item, RD_THREADS / 32 items per block; else one block per item. */
template <int G> struct rd_grp {
    int lane;
    int64_t first, step;
    __device__ __forceinline__ rd_grp() {
        if constexpr (G == 32) {
            int per = blockDim.x >> 5;
            lane = threadIdx.x & 31;
            first = (int64_t)blockIdx.x * per + (threadIdx.x >> 5);
            step = (int64_t)gridDim.x * per;
        } else {
            lane = threadIdx.x;
            first = blockIdx.x;
            step = gridDim.x;
        }
    }
};

/* Blocks for `items` groups of G threads (RD_THREADS per block), capped; kernels loop with a group stride. */
static inline unsigned rd_grp_blocks(int64_t items, int G) {
    int64_t per = G == 32 ? RD_THREADS / 32 : 1;
    int64_t b = (items + per - 1) / per;
    if (b < 1) b = 1;
    if (b > (1 << 20)) b = 1 << 20;
    return (unsigned)b;
}

/* Shapes passed by value. */
typedef struct rd_dims {
    int nd;
    int64_t d[ENG_MAX_DIMS];
} rd_dims;

static inline rd_dims rd_dims_of(const int64_t *dims, int nd) {
    rd_dims r;
    r.nd = nd;
    for (int i = 0; i < ENG_MAX_DIMS; i++) r.d[i] = i < nd ? dims[i] : 1;
    return r;
}

/* Linear index -> offset through (sizes, strides), innermost last. */
static __device__ __forceinline__ int64_t rd_offset(int n, const int64_t *sz, const int64_t *st, int64_t idx) {
    int64_t off = 0;
    for (int d = n - 1; d >= 0; d--) {
        int64_t q = idx / sz[d];
        off += (idx - q * sz[d]) * st[d];
        idx = q;
    }
    return off;
}

#endif
