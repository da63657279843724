/* cuda-quant-dev.h - the device side of cuda-quant.cu: QuantizeLinear / DequantizeLinear / DynamicQuantizeLinear
 * elementwise kernels, QLinearAdd / QLinearMul, and the pieces of the integer GEMM (operand preparation, im2col,
 * the __dp4a tiled GEMM, the zero-point-correcting epilogue). Included by cuda-quant.cu only.
 *
 * Arithmetic mirrors kernels/cpu/quant.c term for term: float32 division x / scale (IEEE, nvcc's default
 * -prec-div=true), rintf / rint = round half to even, saturation after adding the zero point, NaN -> the zero
 * point; requantization of integer accumulators in double with the float32 multiplier (s_in * s_w) / s_y.
 * Explicit __fmul_rn / __fadd_rn keep nvcc from contracting float expressions into FMAs the formula does not have.
 * Scales and zero points are device tensors: every kernel reads them itself (no host round trip).
 * Element indices are 64-bit throughout.
 */
#ifndef CUDA_QUANT_DEV_H
#define CUDA_QUANT_DEV_H

#include <stdint.h>

#define QZ_THREADS 256
#define QZ_MAX_DIMS 8

/* Element i of an optional u8 / i8 / i32 tensor as int32; 0 when p is NULL. */
__device__ __forceinline__ int32_t qz_ld_i(const void *p, int dt, int64_t i) {
    if (!p) return 0;
    if (dt == ENG_DTYPE_U8) return ((const uint8_t *)p)[i];
    if (dt == ENG_DTYPE_I8) return ((const int8_t *)p)[i];
    return ((const int32_t *)p)[i];
}

/* rintf(v) + zp saturated to [lo, hi] (the CPU's q_round_sat on a float32 v, exactly: |lo - zp|, |hi - zp| are
 * small integers, exact in float); NaN gives zp, saturated. */
__device__ __forceinline__ int32_t qz_round_sat_f(float v, int32_t zp, int32_t lo, int32_t hi) {
    if (v != v) return zp < lo ? lo : zp > hi ? hi : zp;
    float r = rintf(v);
    if (r < (float)(lo - zp)) return lo;
    if (r > (float)(hi - zp)) return hi;
    return (int32_t)r + zp;
}

/* The same on a double v (QLinear requantization). */
__device__ __forceinline__ int32_t qz_round_sat_d(double v, int32_t zp, int32_t lo, int32_t hi) {
    if (v != v) return zp < lo ? lo : zp > hi ? hi : zp;
    double r = rint(v);
    if (r < (double)(lo - zp)) return lo;
    if (r > (double)(hi - zp)) return hi;
    return (int32_t)r + zp;
}

/* (i / d) for 64-bit i, d > 0, in 32-bit arithmetic when both fit (several times cheaper on the GPU). */
__device__ __forceinline__ int64_t qz_div(int64_t i, int64_t d) {
    if (((uint64_t)i | (uint64_t)d) <= 0xffffffffull) return (int64_t)((uint32_t)i / (uint32_t)d);
    return i / d;
}

/* ---------------------------------------------------------------- QuantizeLinear / DequantizeLinear */

/* x split as (outer, C, inner) around the scale's axis: channel of element i is (i / inner) % C. Scale and zero
 * point are read at the channel when they have more than one element (sper / zper), else at 0. */
typedef struct qz_qdq_args {
    int64_t n, inner, C;
    int sper, zper;
    int zdt;       /* zero point dtype (UNDEFINED: omitted) */
    int xdt;       /* dequantize: x dtype */
    int s8;        /* quantize: int8 output */
    int vec;       /* 4 elements per step: pointers aligned and channels constant over each group of 4 */
} qz_qdq_args;

__device__ __forceinline__ int64_t qz_chan(int64_t i, const qz_qdq_args &a) {
    if (a.C == 1) return 0;
    int64_t q = qz_div(i, a.inner);
    return q - qz_div(q, a.C) * a.C;
}

__global__ void qz_quantize_kernel(const float *__restrict__ x, const float *__restrict__ sc, const void *__restrict__ zp,
                                   uint8_t *__restrict__ y, qz_qdq_args a) {
    const int32_t lo = a.s8 ? -128 : 0, hi = a.s8 ? 127 : 255;
    int64_t stride = (int64_t)gridDim.x * blockDim.x, t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t n4 = a.vec ? a.n / 4 : 0;
    for (int64_t g = t; g < n4; g += stride) {
        int64_t i = 4 * g, ch = (a.sper || a.zper) ? qz_chan(i, a) : 0;
        float s = sc[a.sper ? ch : 0];
        int32_t z = qz_ld_i(zp, a.zdt, a.zper ? ch : 0);
        float4 v = *(const float4 *)(x + i);
        uint32_t q0 = (uint32_t)qz_round_sat_f(v.x / s, z, lo, hi) & 0xffu;
        uint32_t q1 = (uint32_t)qz_round_sat_f(v.y / s, z, lo, hi) & 0xffu;
        uint32_t q2 = (uint32_t)qz_round_sat_f(v.z / s, z, lo, hi) & 0xffu;
        uint32_t q3 = (uint32_t)qz_round_sat_f(v.w / s, z, lo, hi) & 0xffu;
        *(uint32_t *)(y + i) = q0 | (q1 << 8) | (q2 << 16) | (q3 << 24);
    }
    for (int64_t i = 4 * n4 + t; i < a.n; i += stride) {
        int64_t ch = (a.sper || a.zper) ? qz_chan(i, a) : 0;
        y[i] = (uint8_t)qz_round_sat_f(x[i] / sc[a.sper ? ch : 0], qz_ld_i(zp, a.zdt, a.zper ? ch : 0), lo, hi);
    }
}

__global__ void qz_dequantize_kernel(const void *__restrict__ x, const float *__restrict__ sc, const void *__restrict__ zp,
                                     float *__restrict__ y, qz_qdq_args a) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x, t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t n4 = a.vec ? a.n / 4 : 0;
    const int s8 = a.xdt == ENG_DTYPE_I8;
    for (int64_t g = t; g < n4; g += stride) { /* 8-bit x only */
        int64_t i = 4 * g, ch = (a.sper || a.zper) ? qz_chan(i, a) : 0;
        float s = sc[a.sper ? ch : 0];
        int32_t z = qz_ld_i(zp, a.zdt, a.zper ? ch : 0);
        uint32_t w = *(const uint32_t *)((const uint8_t *)x + i);
        int32_t e[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            uint32_t b = (w >> (8 * k)) & 0xffu;
            e[k] = s8 ? (int32_t)(int8_t)b : (int32_t)b;
        }
        *(float4 *)(y + i) = make_float4((float)(e[0] - z) * s, (float)(e[1] - z) * s, (float)(e[2] - z) * s,
                                         (float)(e[3] - z) * s);
    }
    for (int64_t i = 4 * n4 + t; i < a.n; i += stride) {
        int64_t ch = (a.sper || a.zper) ? qz_chan(i, a) : 0;
        float s = sc[a.sper ? ch : 0];
        if (a.xdt == ENG_DTYPE_I32) { /* (int64 x - zp) rounded once to float, as the CPU */
            int64_t d = (int64_t)((const int32_t *)x)[i] - (int64_t)qz_ld_i(zp, a.zdt, a.zper ? ch : 0);
            y[i] = __ll2float_rn(d) * s;
        } else {
            y[i] = (float)(qz_ld_i(x, a.xdt, i) - qz_ld_i(zp, a.zdt, a.zper ? ch : 0)) * s;
        }
    }
}

/* ---------------------------------------------------------------- DynamicQuantizeLinear */

#define QZ_DYN_PARTS 1024 /* most blocks of the min/max pass (its partials are reduced by every apply block) */

/* min / max as the CPU's loop keeps them: replaced only by a strictly smaller / larger value (NaN never enters). */
__device__ __forceinline__ void qz_mm_take(float v, float &mn, float &mx) {
    if (v < mn) mn = v;
    if (v > mx) mx = v;
}

/* Block-wide min/max of (mn, mx) into (out_mn, out_mx) of thread 0; blockDim.x a multiple of 32, <= 1024. */
__device__ __forceinline__ void qz_block_minmax(float &mn, float &mx) {
    __shared__ float smn[32], smx[32];
    for (int o = 16; o > 0; o >>= 1) {
        qz_mm_take(__shfl_down_sync(0xffffffffu, mn, o), mn, mx);
        float t = __shfl_down_sync(0xffffffffu, mx, o);
        if (t > mx) mx = t;
    }
    int w = threadIdx.x / 32, l = threadIdx.x % 32, nw = blockDim.x / 32;
    __syncthreads(); /* the arrays may still be read by a previous call */
    if (l == 0) smn[w] = mn, smx[w] = mx;
    __syncthreads();
    if (w == 0) {
        mn = l < nw ? smn[l] : 0.f, mx = l < nw ? smx[l] : 0.f;
        for (int o = 16; o > 0; o >>= 1) {
            qz_mm_take(__shfl_down_sync(0xffffffffu, mn, o), mn, mx);
            float t = __shfl_down_sync(0xffffffffu, mx, o);
            if (t > mx) mx = t;
        }
    }
}

/* Pass 1: each block's min(0, x...) and max(0, x...) into part[2 * blockIdx.x + {0, 1}]. */
__global__ void qz_dyn_minmax(const float *__restrict__ x, int64_t n, int vec, float *__restrict__ part) {
    float mn = 0.f, mx = 0.f; /* the range always includes 0 */
    int64_t stride = (int64_t)gridDim.x * blockDim.x, t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t n4 = vec ? n / 4 : 0;
    for (int64_t g = t; g < n4; g += stride) {
        float4 v = *(const float4 *)(x + 4 * g);
        qz_mm_take(v.x, mn, mx), qz_mm_take(v.y, mn, mx), qz_mm_take(v.z, mn, mx), qz_mm_take(v.w, mn, mx);
    }
    for (int64_t i = 4 * n4 + t; i < n; i += stride) qz_mm_take(x[i], mn, mx);
    qz_block_minmax(mn, mx);
    if (threadIdx.x == 0) part[2 * blockIdx.x] = mn, part[2 * blockIdx.x + 1] = mx;
}

/* Pass 2: every block reduces the nparts partials, derives scale and zero point as the CPU does, block 0 writes
 * them to the optional outputs, and all quantize x. */
__global__ void qz_dyn_apply(const float *__restrict__ x, int64_t n, int vec, const float *__restrict__ part, int nparts,
                             uint8_t *__restrict__ y, float *__restrict__ y_scale, uint8_t *__restrict__ y_zp) {
    __shared__ float s_scale;
    __shared__ int32_t s_zp;
    float mn = 0.f, mx = 0.f;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) qz_mm_take(part[2 * i], mn, mx), qz_mm_take(part[2 * i + 1], mn, mx);
    qz_block_minmax(mn, mx);
    if (threadIdx.x == 0) {
        float scale = (mx == mn ? 1.f : mx - mn) / 255.f;
        float zpf = 0.f - mn / scale;
        zpf = zpf < 0.f ? 0.f : zpf > 255.f ? 255.f : zpf;
        s_scale = scale;
        s_zp = (int32_t)rintf(zpf);
        if (blockIdx.x == 0) {
            if (y_scale) *y_scale = scale;
            if (y_zp) *y_zp = (uint8_t)s_zp;
        }
    }
    __syncthreads();
    const float s = s_scale;
    const int32_t z = s_zp;
    int64_t stride = (int64_t)gridDim.x * blockDim.x, t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t n4 = vec ? n / 4 : 0;
    for (int64_t g = t; g < n4; g += stride) {
        float4 v = *(const float4 *)(x + 4 * g);
        uint32_t q0 = (uint32_t)qz_round_sat_f(v.x / s, z, 0, 255), q1 = (uint32_t)qz_round_sat_f(v.y / s, z, 0, 255);
        uint32_t q2 = (uint32_t)qz_round_sat_f(v.z / s, z, 0, 255), q3 = (uint32_t)qz_round_sat_f(v.w / s, z, 0, 255);
        *(uint32_t *)(y + 4 * g) = q0 | (q1 << 8) | (q2 << 16) | (q3 << 24);
    }
    for (int64_t i = 4 * n4 + t; i < n; i += stride) y[i] = (uint8_t)qz_round_sat_f(x[i] / s, z, 0, 255);
}

/* ---------------------------------------------------------------- QLinearAdd / QLinearMul */

/* y's (collapsed) dims and a's / b's element strides per dim (0 where broadcast); flat: all three one shape. */
typedef struct qz_bin_args {
    int64_t n;
    int nd, flat, mul, s8, vec;
    int zadt, zbdt, zcdt; /* zero point dtypes (UNDEFINED: omitted) */
    int64_t yd[QZ_MAX_DIMS], sa[QZ_MAX_DIMS], sb[QZ_MAX_DIMS];
} qz_bin_args;

/* One output code from the 8-bit operands, krn-quant.h's float32 arithmetic (no contraction). */
__device__ __forceinline__ int32_t qz_bin_one(int32_t va, int32_t vb, int mul, float ra, float rb, float rm, int32_t az,
                                              int32_t bz, int32_t cz, int32_t lo, int32_t hi) {
    float v = mul ? __fmul_rn((float)((va - az) * (vb - bz)), rm)
                  : __fadd_rn(__fmul_rn((float)(va - az), ra), __fmul_rn((float)(vb - bz), rb));
    if (!(v >= -1e9f)) v = -1e9f; /* int32-safe; NaN too (the CPU's max/min give -1e9 there) */
    if (v > 1e9f) v = 1e9f;
    int32_t q = __float2int_rn(v) + cz;
    return q < lo ? lo : q > hi ? hi : q;
}

__device__ __forceinline__ int32_t qz_byte(uint32_t b, int s8) { return s8 ? (int32_t)(int8_t)b : (int32_t)b; }

__global__ void qz_binary_kernel(const uint8_t *__restrict__ a, const float *__restrict__ as, const void *__restrict__ az,
                                 const uint8_t *__restrict__ b, const float *__restrict__ bs, const void *__restrict__ bz,
                                 const float *__restrict__ cs, const void *__restrict__ cz, uint8_t *__restrict__ y,
                                 qz_bin_args k) {
    const float fa = as[0], fb = bs[0], fc = cs[0];
    const float ra = __fdiv_rn(fa, fc), rb = __fdiv_rn(fb, fc), rm = __fdiv_rn(__fmul_rn(fa, fb), fc);
    const int32_t za = qz_ld_i(az, k.zadt, 0), zb = qz_ld_i(bz, k.zbdt, 0), zc = qz_ld_i(cz, k.zcdt, 0);
    const int32_t lo = k.s8 ? -128 : 0, hi = k.s8 ? 127 : 255;
    int64_t stride = (int64_t)gridDim.x * blockDim.x, t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k.flat) {
        int64_t n4 = k.vec ? k.n / 4 : 0;
        for (int64_t g = t; g < n4; g += stride) {
            uint32_t wa = *(const uint32_t *)(a + 4 * g), wb = *(const uint32_t *)(b + 4 * g), wy = 0;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int32_t q = qz_bin_one(qz_byte((wa >> (8 * j)) & 0xffu, k.s8), qz_byte((wb >> (8 * j)) & 0xffu, k.s8), k.mul,
                                       ra, rb, rm, za, zb, zc, lo, hi);
                wy |= ((uint32_t)q & 0xffu) << (8 * j);
            }
            *(uint32_t *)(y + 4 * g) = wy;
        }
        for (int64_t i = 4 * n4 + t; i < k.n; i += stride)
            y[i] = (uint8_t)qz_bin_one(qz_byte(a[i], k.s8), qz_byte(b[i], k.s8), k.mul, ra, rb, rm, za, zb, zc, lo, hi);
        return;
    }
    for (int64_t i = t; i < k.n; i += stride) {
        int64_t r = i, oa = 0, ob = 0;
        for (int d = k.nd - 1; d >= 0; d--) {
            int64_t q = qz_div(r, k.yd[d]), c = r - q * k.yd[d];
            oa += c * k.sa[d], ob += c * k.sb[d];
            r = q;
        }
        y[i] = (uint8_t)qz_bin_one(qz_byte(a[oa], k.s8), qz_byte(b[ob], k.s8), k.mul, ra, rb, rm, za, zb, zc, lo, hi);
    }
}

/* ---------------------------------------------------------------- integer GEMM: operand preparation */

/* Batch offset (in matrices) of an operand with batch dims bd broadcast to yd (krn_q_batch_off on the device). */
typedef struct qz_bdims {
    int r;
    int64_t bd[QZ_MAX_DIMS], yd[QZ_MAX_DIMS];
} qz_bdims;

__device__ __forceinline__ int64_t qz_batch_off(const qz_bdims &d, int64_t bi) {
    int64_t off = 0, stride = 1;
    for (int k = d.r - 1; k >= 0; k--) {
        int64_t q = qz_div(bi, d.yd[k]), coord = bi - q * d.yd[k];
        bi = q;
        if (d.bd[k] != 1) off += coord * stride;
        stride *= d.bd[k];
    }
    return off;
}

/* dst (count, Rp, K4) int8 rows from byte rows of src: row j < Rr of batch b starts at src + (boff(b) * Rr + j) * K
 * (boff: qz_batch_off when bd.r > 0, else b); elements are XOR flip (0x80: uint8 -> int8 shifted by 128), k >= K and
 * rows >= Rr are 0. perm_cg > 0: dst element k = t * cg + ci reads src element ci * (K / cg) + t (a conv weight
 * reordered taps-major for channels-last im2col). sums[b * Rp + j]: the row's int8 sum. One warp per row. */
__global__ void qz_rows8(const uint8_t *__restrict__ src, int64_t K, int64_t K4, int64_t Rr, int64_t Rp, int64_t count,
                         qz_bdims bd, uint32_t flip, int64_t perm_cg, int8_t *__restrict__ dst, int32_t *__restrict__ sums) {
    int lane = threadIdx.x % 32;
    int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32, nwarps = (int64_t)gridDim.x * blockDim.x / 32;
    int64_t KW = K4 / 4, taps = perm_cg > 0 ? K / perm_cg : 1;
    for (int64_t row = warp; row < count * Rp; row += nwarps) {
        int64_t b = qz_div(row, Rp), j = row - b * Rp;
        uint32_t *d = (uint32_t *)(dst + row * K4);
        int32_t s = 0;
        if (j < Rr) {
            const uint8_t *sr = src + ((bd.r > 0 ? qz_batch_off(bd, b) : b) * Rr + j) * K;
            for (int64_t w = lane; w < KW; w += 32) {
                uint32_t word = 0;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int64_t k = 4 * w + e;
                    if (k >= K) break;
                    int64_t sk = k;
                    if (perm_cg > 0) {
                        int64_t t = k / perm_cg;
                        sk = (k - t * perm_cg) * taps + t;
                    }
                    uint32_t v = (uint32_t)(sr[sk] ^ flip) & 0xffu;
                    s += (int32_t)(int8_t)v;
                    word |= v << (8 * e);
                }
                d[w] = word;
            }
        } else {
            for (int64_t w = lane; w < KW; w += 32) d[w] = 0;
        }
        for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
        if (lane == 0) sums[row] = s;
    }
}

/* dst (count, Np, K4) int8 = the transposes of byte matrices (K, N) of src (matrix b at boff(b) * K * N), XOR flip,
 * zero beyond K and N; sums[b * Np + j] += the column sums (zeroed before). 32x32 tiles, block (32, 8). */
__global__ void qz_transpose8(const uint8_t *__restrict__ src, int64_t K, int64_t N, int64_t K4, int64_t Np, int64_t count,
                              qz_bdims bd, uint32_t flip, int8_t *__restrict__ dst, int32_t *__restrict__ sums) {
    __shared__ uint8_t tile[32][33];
    int tx = threadIdx.x, ty = threadIdx.y;
    int64_t ntk = (K4 + 31) / 32, ntn = (Np + 31) / 32;
    for (int64_t b = blockIdx.z; b < count; b += gridDim.z) {
        const uint8_t *s = src + (bd.r > 0 ? qz_batch_off(bd, b) : b) * K * N;
        for (int64_t tk = blockIdx.y; tk < ntk; tk += gridDim.y)
            for (int64_t tn = blockIdx.x; tn < ntn; tn += gridDim.x) {
                int64_t k0 = tk * 32, n0 = tn * 32;
                for (int i = ty; i < 32; i += 8) {
                    int64_t k = k0 + i, n = n0 + tx;
                    tile[i][tx] = k < K && n < N ? (uint8_t)(s[k * N + n] ^ flip) : (uint8_t)0;
                }
                __syncthreads();
                for (int i = ty; i < 32; i += 8) {
                    int64_t n = n0 + i, k = k0 + tx;
                    int8_t v = (int8_t)tile[tx][i];
                    if (n < Np && k < K4) dst[(b * Np + n) * K4 + k] = v;
                    int32_t sm = v;
                    for (int o = 16; o > 0; o >>= 1) sm += __shfl_down_sync(0xffffffffu, sm, o);
                    if (tx == 0 && n < Np && sm) atomicAdd(&sums[b * Np + n], sm);
                }
                __syncthreads();
            }
    }
}

/* Conv geometry, spatial dims padded to 3 with leading 1s. */
typedef struct qz_conv_geo {
    int64_t N, C, M, G, Cg, Mg, in[3], out[3], k[3], s[3], d[3], pb[3];
    int64_t ksz, osz, K; /* taps, output positions per image, Cg * ksz */
    int nhwc_x;          /* X channels last (then K runs taps-major: k = t * Cg + ci) */
} qz_conv_geo;

/* im2col of images [0, nimg) of x into dst (G, nimg * osz, K4) int8 (XOR flip) and row sums into sums (G, rows);
 * taps outside x read x's zero point (so x - x_zp is 0 there, as the CPU skips them). One warp per row. */
__global__ void qz_im2col(const uint8_t *__restrict__ x, const void *__restrict__ xzp, int xzdt, qz_conv_geo g, int64_t nimg,
                          int64_t K4, uint32_t flip, int8_t *__restrict__ dst, int32_t *__restrict__ sums) {
    int lane = threadIdx.x % 32;
    int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32, nwarps = (int64_t)gridDim.x * blockDim.x / 32;
    const uint32_t zb = ((uint32_t)qz_ld_i(xzp, xzdt, 0) ^ flip) & 0xffu;
    int64_t rows = nimg * g.osz, KW = K4 / 4, k12 = g.k[1] * g.k[2];
    int64_t isz = g.in[0] * g.in[1] * g.in[2];
    for (int64_t row = warp; row < g.G * rows; row += nwarps) {
        int64_t grp = qz_div(row, rows), r = row - grp * rows;
        int64_t n = qz_div(r, g.osz), o = r - n * g.osz;
        int64_t o0 = qz_div(o, g.out[1] * g.out[2]), orem = o - o0 * g.out[1] * g.out[2];
        int64_t o1 = qz_div(orem, g.out[2]), o2 = orem - o1 * g.out[2];
        int64_t b0 = o0 * g.s[0] - g.pb[0], b1 = o1 * g.s[1] - g.pb[1], b2 = o2 * g.s[2] - g.pb[2];
        uint32_t *d = (uint32_t *)(dst + row * K4);
        int32_t s = 0;
        for (int64_t w = lane; w < KW; w += 32) {
            uint32_t word = 0;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int64_t k = 4 * w + e;
                if (k >= g.K) break;
                int64_t ci, t;
                if (g.nhwc_x) t = qz_div(k, g.Cg), ci = k - t * g.Cg;
                else ci = qz_div(k, g.ksz), t = k - ci * g.ksz;
                int64_t t0 = qz_div(t, k12), trem = t - t0 * k12, t1 = qz_div(trem, g.k[2]), t2 = trem - t1 * g.k[2];
                int64_t i0 = b0 + t0 * g.d[0], i1 = b1 + t1 * g.d[1], i2 = b2 + t2 * g.d[2];
                uint32_t v = zb;
                if (i0 >= 0 && i0 < g.in[0] && i1 >= 0 && i1 < g.in[1] && i2 >= 0 && i2 < g.in[2]) {
                    int64_t c = grp * g.Cg + ci, sp = (i0 * g.in[1] + i1) * g.in[2] + i2;
                    int64_t idx = g.nhwc_x ? (n * isz + sp) * g.C + c : (n * g.C + c) * isz + sp;
                    v = ((uint32_t)x[idx] ^ flip) & 0xffu;
                }
                s += (int32_t)(int8_t)v;
                word |= v << (8 * e);
            }
            d[w] = word;
        }
        for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
        if (lane == 0) sums[row] = s;
    }
}

/* ---------------------------------------------------------------- integer GEMM: __dp4a tiles */

#define QZ_BM 64
#define QZ_BN 64
#define QZ_BKW 8 /* 32-bit words (4 int8 each) of K per tile */

/* D[b] (R, Np; ld Np) = A[b] (R, K4) . B[b] (Np, K4)^T, int8 rows with K contiguous (K4 % 4 == 0, rows 4-byte
 * aligned), int32 accumulation that wraps as ONNX's int32 does. Batch strides in elements. 256 threads, each a
 * 4 x 4 block of outputs at rows ty + 16 i and columns tx + 16 j of the 64 x 64 tile. */
__global__ void __launch_bounds__(256) qz_gemm_dp4a(const int8_t *__restrict__ A, const int8_t *__restrict__ B,
                                                    int32_t *__restrict__ D, int64_t R, int64_t Np, int64_t K4, int64_t count,
                                                    int64_t sa, int64_t sb, int64_t sd) {
    __shared__ int32_t As[QZ_BKW][QZ_BM + 4], Bs[QZ_BKW][QZ_BN + 4];
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int64_t KW = K4 / 4, ntr = (R + QZ_BM - 1) / QZ_BM, ntc = (Np + QZ_BN - 1) / QZ_BN;
    for (int64_t b = blockIdx.z; b < count; b += gridDim.z) {
        const int32_t *Aw = (const int32_t *)(A + b * sa), *Bw = (const int32_t *)(B + b * sb);
        int32_t *Db = D + b * sd;
        for (int64_t tr = blockIdx.y; tr < ntr; tr += gridDim.y)
            for (int64_t tc = blockIdx.x; tc < ntc; tc += gridDim.x) {
                const int64_t r0 = tr * QZ_BM, c0 = tc * QZ_BN;
                int32_t acc[4][4];
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int j = 0; j < 4; j++) acc[i][j] = 0;
                for (int64_t kw0 = 0; kw0 < KW; kw0 += QZ_BKW) {
#pragma unroll
                    for (int l = 0; l < 2; l++) {
                        int idx = tid + 256 * l, r = idx / QZ_BKW, w = idx % QZ_BKW;
                        int64_t gw = kw0 + w, ra = r0 + r, rb = c0 + r;
                        As[w][r] = ra < R && gw < KW ? Aw[ra * KW + gw] : 0;
                        Bs[w][r] = rb < Np && gw < KW ? Bw[rb * KW + gw] : 0;
                    }
                    __syncthreads();
#pragma unroll
                    for (int w = 0; w < QZ_BKW; w++) {
                        int32_t av[4], bv[4];
#pragma unroll
                        for (int i = 0; i < 4; i++) av[i] = As[w][ty + 16 * i], bv[i] = Bs[w][tx + 16 * i];
#pragma unroll
                        for (int i = 0; i < 4; i++)
#pragma unroll
                            for (int j = 0; j < 4; j++) acc[i][j] = __dp4a(av[i], bv[j], acc[i][j]);
                    }
                    __syncthreads();
                }
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    int64_t r = r0 + ty + 16 * i;
                    if (r >= R) continue;
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        int64_t col = c0 + tx + 16 * j;
                        if (col < Np) Db[r * Np + col] = acc[i][j];
                    }
                }
            }
    }
}

/* ---------------------------------------------------------------- integer GEMM: epilogue */

enum { QZ_OUT_I32 = 0, QZ_OUT_Q8 = 1, QZ_OUT_F32 = 2 };

/* What turns D (count, R, C; ld ldd) of sums of shifted int8 products into Y:
 *   acc = D - az' cs[col] - bz'[col] rs[row] + K az' bz'[col]   (uint32 arithmetic: exact mod 2^32)
 * with az' = a_zp - a_shift, bz' = b_zp - b_shift (shift 128 for uint8 operands stored as int8), then
 *   I32: acc;  Q8: saturate(rint((double)(acc + bias) * (double)(as * bs / ys)) + y_zp);
 *   F32: act((float)acc * (as * bs) + bias).
 * Rows: per-row parameters (A's zero point and scale) at row % Mrow. Columns: global channel colg = b * coff + col
 * (conv groups; 0 for matmul) for per-column parameters; cs at b * ldd + col, rs at b * R + row.
 * Y: element (b, row, col) at b * ybs + row * yld + colg, or, trans (conv NCHW), ((row / ohw) * ych + colg) * ohw
 * + row % ohw. */
typedef struct qz_epi_args {
    int mode, s8, trans;
    int64_t R, C, ldd, count, sd, K;
    const void *az; int azdt, azper; int32_t ashift;
    const void *bz; int bzdt, bzper; int32_t bshift;
    const int32_t *rs, *cs;
    int64_t Mrow;
    const float *as, *bs, *ys; int asper, bsper;
    const void *yz; int yzdt;
    const float *fbias; const int32_t *ibias;
    int act; float act_a, act_b;
    int64_t coff, ybs, yld, ohw, ych;
} qz_epi_args;


/* The output's 32-bit pattern for D element (b, row, col): int32, the 8-bit code, or float bits. */
__device__ __forceinline__ uint32_t qz_epi_one(const qz_epi_args &e, const int32_t *Db, int64_t b, int64_t row, int64_t col) {
    int64_t colg = b * e.coff + col;
    int64_t ri = e.Mrow > 1 ? row - qz_div(row, e.Mrow) * e.Mrow : 0;
    uint32_t az = (uint32_t)(qz_ld_i(e.az, e.azdt, e.azper ? ri : 0) - e.ashift);
    uint32_t bz = (uint32_t)(qz_ld_i(e.bz, e.bzdt, e.bzper ? colg : 0) - e.bshift);
    uint32_t acc = (uint32_t)Db[row * e.ldd + col] - az * (uint32_t)e.cs[b * e.ldd + col] -
                   bz * (uint32_t)e.rs[b * e.R + row] + (uint32_t)e.K * az * bz;
    int32_t a = (int32_t)acc;
    if (e.mode == QZ_OUT_I32) return acc;
    float as = e.as[e.asper ? ri : 0], bs = e.bs[e.bsper ? colg : 0];
    if (e.mode == QZ_OUT_F32) {
        float v = __fadd_rn(__fmul_rn((float)a, __fmul_rn(as, bs)), e.fbias ? e.fbias[colg] : 0.f);
        return __float_as_uint(cuda_act(v, e.act, e.act_a, e.act_b));
    }
    float mult = __fdiv_rn(__fmul_rn(as, bs), e.ys[0]);
    int64_t v = (int64_t)a + (e.ibias ? (int64_t)e.ibias[colg] : 0);
    int32_t q = qz_round_sat_d((double)v * (double)mult, qz_ld_i(e.yz, e.yzdt, 0), e.s8 ? -128 : 0, e.s8 ? 127 : 255);
    return (uint32_t)q;
}

__device__ __forceinline__ void qz_epi_store(const qz_epi_args &e, void *y, int64_t i, uint32_t v) {
    if (e.mode == QZ_OUT_Q8) ((uint8_t *)y)[i] = (uint8_t)(v & 0xffu);
    else ((uint32_t *)y)[i] = v;
}

/* 32 x 32 tiles of D, block (32, 8); trans stores through shared memory so Y's writes stay coalesced. D may be Y
 * itself (non-trans, 4-byte outputs): every element is read and written by one thread. */
__global__ void qz_epilogue(const int32_t *D, void *y, qz_epi_args e) {
    __shared__ uint32_t tile[32][33];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t ntr = (e.R + 31) / 32, ntc = (e.C + 31) / 32;
    for (int64_t b = blockIdx.z; b < e.count; b += gridDim.z) {
        const int32_t *Db = D + b * e.sd;
        for (int64_t tr = blockIdx.y; tr < ntr; tr += gridDim.y)
            for (int64_t tc = blockIdx.x; tc < ntc; tc += gridDim.x) {
                const int64_t r0 = tr * 32, c0 = tc * 32;
                for (int i = ty; i < 32; i += 8) {
                    int64_t row = r0 + i, col = c0 + tx;
                    if (row >= e.R || col >= e.C) continue;
                    uint32_t v = qz_epi_one(e, Db, b, row, col);
                    if (e.trans) tile[i][tx] = v;
                    else qz_epi_store(e, y, b * e.ybs + row * e.yld + b * e.coff + col, v);
                }
                if (!e.trans) continue;
                __syncthreads();
                int64_t row = r0 + tx;
                if (row < e.R) {
                    int64_t n = qz_div(row, e.ohw), o = row - n * e.ohw;
                    for (int i = ty; i < 32; i += 8) {
                        int64_t col = c0 + i;
                        if (col < e.C) qz_epi_store(e, y, (n * e.ych + b * e.coff + col) * e.ohw + o, tile[tx][i]);
                    }
                }
                __syncthreads();
            }
    }
}

#endif
