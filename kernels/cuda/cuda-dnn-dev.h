/* cuda-dnn-dev.h - the device kernels of cuda-dnn.cu that are not cuDNN calls: dtype-generic loads and stores, the
 * fused conv epilogue (bias, residual, activation, dtype conversion), window copies (asymmetric pads, crops),
 * pooling and its gradient, batch normalisation and its gradient, LRN, the conv bias gradient.
 * Included by cuda-dnn.cu only. Every kernel takes 64-bit sizes and loops with a grid stride; per-(n, c) plane
 * kernels run a 2-D grid (x: elements of a plane, y: planes) so the channel is known once per plane.
 */
#ifndef KRN_CUDA_DNN_DEV_H
#define KRN_CUDA_DNN_DEV_H

#include <float.h>
#include <stdint.h>

#include "cuda-impl.h"
#include "../krn-nn.h"

/* ---- dtype-generic element access (dt is an eng_dtype; uniform across a launch, so the switch does not diverge) */

__device__ __forceinline__ float dnn_ld(const void *p, int dt, int64_t i) {
    switch (dt) {
    case ENG_DTYPE_F16: return __half2float(((const __half *)p)[i]);
    case ENG_DTYPE_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case ENG_DTYPE_I8: return (float)((const int8_t *)p)[i];
    case ENG_DTYPE_U8: return (float)((const uint8_t *)p)[i];
    default: return ((const float *)p)[i];
    }
}

__device__ __forceinline__ void dnn_st(void *p, int dt, int64_t i, float v) {
    switch (dt) {
    case ENG_DTYPE_F16: ((__half *)p)[i] = __float2half_rn(v); break;
    case ENG_DTYPE_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v); break;
    case ENG_DTYPE_I8: ((int8_t *)p)[i] = (int8_t)v; break;
    case ENG_DTYPE_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    default: ((float *)p)[i] = v; break;
    }
}


/* Block-wide sum of a double (blockDim.x a multiple of 32, at most 1024); every thread gets the total. */
__device__ __forceinline__ double dnn_block_sum(double v, double *sh /* [32] */) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* 2-D launch over planes x plane elements. */
static inline dim3 dnn_plane_grid(int64_t planes, int64_t per_plane, int threads) {
    long long bx = (per_plane + threads - 1) / threads;
    if (bx < 1) bx = 1;
    if (bx > 4096) bx = 4096;
    long long by = planes < 1 ? 1 : planes > 65535 ? 65535 : planes;
    return dim3((unsigned)bx, (unsigned)by, 1);
}

#define DNN_PLANE_LOOP(planes, S, pl, s)                                                                  \
    for (int64_t pl = blockIdx.y; pl < (planes); pl += gridDim.y)                                         \
        for (int64_t s = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; s < (S); s += (int64_t)gridDim.x * blockDim.x)

/* ---- conversions and window copies ---- */

__global__ void dnn_convert_kernel(const void *src, int sdt, void *dst, int ddt, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dnn_st(dst, ddt, i, dnn_ld(src, sdt, i));
}

/* dst (planes, d[0], d[1], d[2]) = src (planes, s[0], s[1], s[2]) shifted by lo (dst index i reads src i - lo),
 * zero where that falls outside src: padding (lo >= 0, dst larger) and cropping (lo <= 0, dst smaller). */
typedef struct dnn_window {
    int64_t planes, d[3], s[3], lo[3];
} dnn_window;

__global__ void dnn_window_kernel(const void *src, int sdt, void *dst, int ddt, dnn_window w) {
    int64_t S = w.d[0] * w.d[1] * w.d[2], ssz = w.s[0] * w.s[1] * w.s[2];
    DNN_PLANE_LOOP(w.planes, S, pl, s) {
        int64_t i2 = s % w.d[2], r = s / w.d[2], i1 = r % w.d[1], i0 = r / w.d[1];
        int64_t j0 = i0 - w.lo[0], j1 = i1 - w.lo[1], j2 = i2 - w.lo[2];
        float v = 0.f;
        if (j0 >= 0 && j0 < w.s[0] && j1 >= 0 && j1 < w.s[1] && j2 >= 0 && j2 < w.s[2])
            v = dnn_ld(src, sdt, pl * ssz + (j0 * w.s[1] + j1) * w.s[2] + j2);
        dnn_st(dst, ddt, pl * S + s, v);
    }
}

/* ---- conv epilogue: y = act(src + bias[c] + z), stored in y's dtype; src may be y itself ---- */

typedef struct dnn_epi {
    int64_t planes, S, M;            /* N*M planes of S elements, M channels */
    int sdt, ddt, bdt, zdt;
    int zfull;                       /* z has y's shape: z[i] */
    int nd;                          /* rank of y, for a broadcast z */
    int64_t ydims[ENG_MAX_DIMS], zst[ENG_MAX_DIMS]; /* z's stride per y dim (0 where broadcast) */
    krn_nn_act_params act;
} dnn_epi;

__global__ void dnn_epilogue_kernel(const void *src, void *dst, const void *bias, const void *z, dnn_epi e) {
    for (int64_t pl = blockIdx.y; pl < e.planes; pl += gridDim.y) {
        float b = bias ? dnn_ld(bias, e.bdt, pl % e.M) : 0.f;
        for (int64_t s = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; s < e.S; s += (int64_t)gridDim.x * blockDim.x) {
            int64_t i = pl * e.S + s;
            float v = dnn_ld(src, e.sdt, i) + b;
            if (z) {
                int64_t zi = 0;
                if (e.zfull) zi = i;
                else {
                    int64_t r = i;
                    for (int d = e.nd - 1; d >= 0; d--) {
                        zi += (r % e.ydims[d]) * e.zst[d];
                        r /= e.ydims[d];
                    }
                }
                v += dnn_ld(z, e.zdt, zi);
            }
            dnn_st(dst, e.ddt, i, cuda_act(v, e.act.kind, e.act.alpha, e.act.beta));
        }
    }
}

/* ---- conv bias gradient: db[m] = sum over n and spatial of dy[n, m, :] (one block per channel) ---- */

__global__ void dnn_bias_grad_kernel(const void *dy, int dydt, float *db, int64_t N, int64_t M, int64_t S) {
    __shared__ double sh[32];
    for (int64_t m = blockIdx.x; m < M; m += gridDim.x) {
        double acc = 0;
        for (int64_t n = 0; n < N; n++) {
            int64_t base = (n * M + m) * S;
            float part = 0.f;
            for (int64_t s = threadIdx.x; s < S; s += blockDim.x) part += dnn_ld(dy, dydt, base + s);
            acc += part;
        }
        acc = dnn_block_sum(acc, sh);
        if (threadIdx.x == 0) db[m] = (float)acc;
    }
}

/* ---- pooling (kernels/cpu/nn-pool.c's semantics: padded cells never win a max; averages divide by the real
 * cells, or with count_include_pad by the cells inside [-pb, in + pe); Indices as flat offsets into X) ---- */

typedef struct dnn_pool_geo {
    int64_t planes, in[3], out[3], k[3], s[3], d[3], pb[3], pe[3];
    int kind, cip, colmaj, xdt, ydt;
    float p;
    float lowest;
} dnn_pool_geo;

__device__ __forceinline__ int64_t dnn_padded_count(int64_t start, int64_t k, int64_t d, int64_t lo, int64_t hi) {
    int64_t n = 0;
    for (int64_t j = 0; j < k; j++) {
        int64_t i = start + j * d;
        n += i >= lo && i < hi;
    }
    return n;
}

__global__ void dnn_pool_kernel(const void *X, void *Y, int64_t *I, dnn_pool_geo g) {
    int64_t isz = g.in[0] * g.in[1] * g.in[2], osz = g.out[0] * g.out[1] * g.out[2];
    DNN_PLANE_LOOP(g.planes, osz, pl, o) {
        int64_t o2 = o % g.out[2], r = o / g.out[2], o1 = r % g.out[1], o0 = r / g.out[1];
        int64_t s0 = o0 * g.s[0] - g.pb[0], s1 = o1 * g.s[1] - g.pb[1], s2 = o2 * g.s[2] - g.pb[2];
        const int64_t xb = pl * isz;
        float acc = g.kind == KRN_POOL_MAX ? g.lowest : 0.f;
        int64_t cnt = 0, best = -1;
        for (int64_t k0 = 0; k0 < g.k[0]; k0++) {
            int64_t i0 = s0 + k0 * g.d[0];
            if (i0 < 0 || i0 >= g.in[0]) continue;
            for (int64_t k1 = 0; k1 < g.k[1]; k1++) {
                int64_t i1 = s1 + k1 * g.d[1];
                if (i1 < 0 || i1 >= g.in[1]) continue;
                for (int64_t k2 = 0; k2 < g.k[2]; k2++) {
                    int64_t i2 = s2 + k2 * g.d[2];
                    if (i2 < 0 || i2 >= g.in[2]) continue;
                    int64_t idx = (i0 * g.in[1] + i1) * g.in[2] + i2;
                    float v = dnn_ld(X, g.xdt, xb + idx);
                    if (g.kind == KRN_POOL_MAX) {
                        if (v > acc || best < 0) acc = v, best = idx;
                    } else if (g.kind == KRN_POOL_AVG) {
                        acc += v;
                    } else {
                        acc += g.p == 2.f ? v * v : powf(fabsf(v), g.p);
                    }
                    cnt++;
                }
            }
        }
        if (g.kind == KRN_POOL_AVG) {
            if (g.cip)
                cnt = dnn_padded_count(s0, g.k[0], g.d[0], -g.pb[0], g.in[0] + g.pe[0]) *
                      dnn_padded_count(s1, g.k[1], g.d[1], -g.pb[1], g.in[1] + g.pe[1]) *
                      dnn_padded_count(s2, g.k[2], g.d[2], -g.pb[2], g.in[2] + g.pe[2]);
            acc = cnt ? acc / (float)cnt : 0.f;
        } else if (g.kind == KRN_POOL_LP) {
            acc = g.p == 2.f ? sqrtf(acc) : powf(acc, 1.f / g.p);
        }
        int64_t oi = pl * osz + o;
        dnn_st(Y, g.ydt, oi, acc);
        if (I) {
            int64_t bi = best < 0 ? 0 : best;
            if (g.colmaj) {
                int64_t j2 = bi % g.in[2], q = bi / g.in[2];
                int64_t j1 = q % g.in[1], j0 = q / g.in[1];
                bi = (j2 * g.in[1] + j1) * g.in[0] + j0;
            }
            I[oi] = xb + bi;
        }
    }
}

/* Global pools: one block per plane of S elements (max, average, Lp). */
__global__ void dnn_global_pool_kernel(const void *X, void *Y, int64_t planes, int64_t S, int kind, float p, int xdt,
                                       int ydt) {
    __shared__ double sh[32];
    for (int64_t pl = blockIdx.x; pl < planes; pl += gridDim.x) {
        const int64_t b = pl * S;
        if (kind == KRN_POOL_MAX) {
            float m = -INFINITY; /* fmaxf skips NaN; a plane of -inf gives -inf, as the CPU's first-element rule */
            for (int64_t s = threadIdx.x; s < S; s += blockDim.x) m = fmaxf(m, dnn_ld(X, xdt, b + s));
            for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
            __shared__ float shm[32];
            __syncthreads();
            if ((threadIdx.x & 31) == 0) shm[threadIdx.x >> 5] = m;
            __syncthreads();
            m = (int)threadIdx.x < (int)(blockDim.x >> 5) ? shm[threadIdx.x] : -INFINITY;
            for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
            if (threadIdx.x == 0) dnn_st(Y, ydt, pl, m);
            continue;
        }
        double acc = 0;
        for (int64_t s = threadIdx.x; s < S; s += blockDim.x) {
            float v = dnn_ld(X, xdt, b + s);
            acc += kind == KRN_POOL_AVG ? (double)v : p == 2.f ? (double)v * v : pow(fabs((double)v), (double)p);
        }
        acc = dnn_block_sum(acc, sh);
        if (threadIdx.x == 0) {
            double r = kind == KRN_POOL_AVG ? (S ? acc / (double)S : 0.0) : p == 2.f ? sqrt(acc) : pow(acc, 1.0 / p);
            dnn_st(Y, ydt, pl, (float)r);
        }
    }
}

/* Pool gradient (float32; dx zeroed first): each output cell scatters dy into its window with atomics (windows may
 * overlap). Max: to the window's first maximum, masked by x > 0 with relu. */
__global__ void dnn_pool_grad_kernel(const float *dy, const float *x, float *dx, dnn_pool_geo g, int relu) {
    int64_t isz = g.in[0] * g.in[1] * g.in[2], osz = g.out[0] * g.out[1] * g.out[2];
    DNN_PLANE_LOOP(g.planes, osz, pl, o) {
        int64_t o2 = o % g.out[2], r = o / g.out[2], o1 = r % g.out[1], o0 = r / g.out[1];
        int64_t s0 = o0 * g.s[0] - g.pb[0], s1 = o1 * g.s[1] - g.pb[1], s2 = o2 * g.s[2] - g.pb[2];
        const float *xp = x + pl * isz;
        float *dp = dx + pl * isz;
        float gv = dy[pl * osz + o];
        int mx = g.kind == KRN_POOL_MAX;
        float best = 0.f, share = 0.f;
        int64_t bi = -1, cnt = 0;
        for (int pass = 0; pass < (mx ? 1 : 2); pass++) {
            if (pass) share = cnt ? (float)((double)gv / (double)cnt) : 0.f;
            for (int64_t k0 = 0; k0 < g.k[0]; k0++) {
                int64_t i0 = s0 + k0 * g.d[0];
                if (i0 < 0 || i0 >= g.in[0]) continue;
                for (int64_t k1 = 0; k1 < g.k[1]; k1++) {
                    int64_t i1 = s1 + k1 * g.d[1];
                    if (i1 < 0 || i1 >= g.in[1]) continue;
                    for (int64_t k2 = 0; k2 < g.k[2]; k2++) {
                        int64_t i2 = s2 + k2 * g.d[2];
                        if (i2 < 0 || i2 >= g.in[2]) continue;
                        int64_t idx = (i0 * g.in[1] + i1) * g.in[2] + i2;
                        if (mx) {
                            if (bi < 0 || xp[idx] > best) best = xp[idx], bi = idx;
                        } else if (pass) {
                            atomicAdd(dp + idx, share);
                        } else {
                            cnt++;
                        }
                    }
                }
            }
            if (!mx && !pass && g.cip)
                cnt = dnn_padded_count(s0, g.k[0], g.d[0], -g.pb[0], g.in[0] + g.pe[0]) *
                      dnn_padded_count(s1, g.k[1], g.d[1], -g.pb[1], g.in[1] + g.pe[1]) *
                      dnn_padded_count(s2, g.k[2], g.d[2], -g.pb[2], g.in[2] + g.pe[2]);
        }
        if (mx && bi >= 0 && (!relu || xp[bi] > 0)) atomicAdd(dp + bi, gv);
    }
}

/* Global pool gradient, one block per plane: average spreads dy / S; max routes dy to the plane's first maximum. */
__global__ void dnn_global_pool_grad_kernel(const float *dy, const float *x, float *dx, int64_t planes, int64_t S,
                                            int mx, int relu) {
    __shared__ float shv[32];
    __shared__ long long shi[32];
    for (int64_t pl = blockIdx.x; pl < planes; pl += gridDim.x) {
        const float *xp = x + pl * S;
        float *dp = dx + pl * S;
        float gv = dy[pl];
        if (!mx) {
            float share = S ? (float)((double)gv / (double)S) : 0.f;
            for (int64_t s = threadIdx.x; s < S; s += blockDim.x) dp[s] = share;
            continue;
        }
        float bv = -FLT_MAX;
        long long bi = -1;
        for (int64_t s = threadIdx.x; s < S; s += blockDim.x) /* ascending s per thread: first max kept */
            if (bi < 0 || xp[s] > bv) bv = xp[s], bi = s;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            long long oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
        }
        __syncthreads();
        if ((threadIdx.x & 31) == 0) shv[threadIdx.x >> 5] = bv, shi[threadIdx.x >> 5] = bi;
        __syncthreads();
        int nw = blockDim.x >> 5;
        bv = (int)threadIdx.x < nw ? shv[threadIdx.x] : -FLT_MAX;
        bi = (int)threadIdx.x < nw ? shi[threadIdx.x] : -1;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            long long oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
        }
        bi = __shfl_sync(0xffffffffu, bi, 0);
        if (threadIdx.x == 0) shi[0] = bi;
        __syncthreads();
        bi = shi[0];
        for (int64_t s = threadIdx.x; s < S; s += blockDim.x)
            dp[s] = (s == bi && (!relu || xp[s] > 0)) ? gv : 0.f;
        __syncthreads();
    }
}

/* ---- batch normalisation ---- */

/* Inference: y = x * a + b with a = scale / sqrt(var + eps), b = B - mean * a, per channel (np == C) or per
 * feature (np == C * S, spatial = 0); a and b folded in double, as the CPU does. */
__global__ void dnn_bn_fold_kernel(const void *scale, const void *bias, const void *mean, const void *var, int sdt,
                                   int bdt, int mdt, int vdt, float eps, int64_t np, float *ab) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < np; i += (int64_t)gridDim.x * blockDim.x) {
        double a = (double)dnn_ld(scale, sdt, i) / sqrt((double)dnn_ld(var, vdt, i) + (double)eps);
        ab[i] = (float)a;
        ab[np + i] = (float)((double)dnn_ld(bias, bdt, i) - (double)dnn_ld(mean, mdt, i) * a);
    }
}

__global__ void dnn_bn_apply_kernel(const void *x, int xdt, void *y, int ydt, const float *ab, int64_t np,
                                    int64_t planes, int64_t C, int64_t S) {
    int per_feature = np != C;
    for (int64_t pl = blockIdx.y; pl < planes; pl += gridDim.y) {
        int64_t cc = pl % C;
        float a = ab[cc], b = ab[np + cc];
        for (int64_t s = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; s < S; s += (int64_t)gridDim.x * blockDim.x) {
            if (per_feature) a = ab[cc * S + s], b = ab[np + cc * S + s];
            int64_t i = pl * S + s;
            dnn_st(y, ydt, i, dnn_ld(x, xdt, i) * a + b);
        }
    }
}

/* Mean and population variance of channel cc of x (N, C, S), in double (two passes); every thread gets them. */
__device__ void dnn_channel_moments(const void *x, int xdt, int64_t N, int64_t C, int64_t S, int64_t cc, double *sh,
                                    double *mean, double *var) {
    double s = 0, cnt = (double)(N * S);
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = threadIdx.x; j < S; j += blockDim.x) s += dnn_ld(x, xdt, (n * C + cc) * S + j);
    s = dnn_block_sum(s, sh);
    double m = cnt > 0 ? s / cnt : 0.0, q = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = threadIdx.x; j < S; j += blockDim.x) {
            double d = dnn_ld(x, xdt, (n * C + cc) * S + j) - m;
            q += d * d;
        }
    q = dnn_block_sum(q, sh);
    *mean = m;
    *var = cnt > 0 ? q / cnt : 0.0;
}

typedef struct dnn_bn_train {
    const void *x, *scale, *bias, *rmean, *rvar;
    int xdt, sdt, bdt, mdt, vdt;
    void *out[5];      /* [1] running mean, [2] running var, [3] batch mean, [4] batch var (each optional) */
    int odt[5];
    float eps, momentum;
    int64_t N, C, S;
} dnn_bn_train;

/* Training mode statistics, one block per channel: a, b into ab (as the fold) and the optional outputs 1..4. */
__global__ void dnn_bn_train_stats_kernel(dnn_bn_train t, float *ab) {
    __shared__ double sh[32];
    for (int64_t cc = blockIdx.x; cc < t.C; cc += gridDim.x) {
        double m, v;
        dnn_channel_moments(t.x, t.xdt, t.N, t.C, t.S, cc, sh, &m, &v);
        if (threadIdx.x != 0) continue;
        double a = (double)dnn_ld(t.scale, t.sdt, cc) / sqrt(v + (double)t.eps);
        ab[cc] = (float)a;
        ab[t.C + cc] = (float)((double)dnn_ld(t.bias, t.bdt, cc) - m * a);
        double mom = t.momentum;
        if (t.out[1]) dnn_st(t.out[1], t.odt[1], cc, (float)(dnn_ld(t.rmean, t.mdt, cc) * mom + m * (1 - mom)));
        if (t.out[2]) dnn_st(t.out[2], t.odt[2], cc, (float)(dnn_ld(t.rvar, t.vdt, cc) * mom + v * (1 - mom)));
        if (t.out[3]) dnn_st(t.out[3], t.odt[3], cc, (float)m);
        if (t.out[4]) dnn_st(t.out[4], t.odt[4], cc, (float)v);
    }
}

/* BatchNormalizationGrad (float32), one block per channel (kernels/cpu/grad-nn.c's formulas). */
__global__ void dnn_bn_grad_kernel(const float *dy, const float *x, const float *scale, const float *rmean,
                                   const float *rvar, float *dx, float *ds, float *dbias, int64_t N, int64_t C,
                                   int64_t S, float eps, int training) {
    __shared__ double sh[32];
    double cnt = (double)(N * S);
    for (int64_t cc = blockIdx.x; cc < C; cc += gridDim.x) {
        double mean = rmean[cc], var = rvar[cc];
        if (training) dnn_channel_moments(x, ENG_DTYPE_F32, N, C, S, cc, sh, &mean, &var);
        double inv = 1.0 / sqrt(var + (double)eps), sdy = 0, sdxm = 0;
        for (int64_t n = 0; n < N; n++)
            for (int64_t j = threadIdx.x; j < S; j += blockDim.x) {
                int64_t i = (n * C + cc) * S + j;
                sdy += dy[i];
                sdxm += (double)dy[i] * ((double)x[i] - mean);
            }
        sdy = dnn_block_sum(sdy, sh);
        sdxm = dnn_block_sum(sdxm, sh);
        double sdyx = sdxm * inv;
        if (threadIdx.x == 0) {
            if (ds) ds[cc] = (float)sdyx;
            if (dbias) dbias[cc] = (float)sdy;
        }
        int tr = training && cnt > 0;
        float fa = (float)(scale[cc] * inv), k1 = tr ? (float)(sdy / cnt) : 0.f, k2 = tr ? (float)(inv * sdyx / cnt) : 0.f;
        float fm = (float)mean;
        if (dx)
            for (int64_t n = 0; n < N; n++)
                for (int64_t j = threadIdx.x; j < S; j += blockDim.x) {
                    int64_t i = (n * C + cc) * S + j;
                    dx[i] = fa * (dy[i] - k1 - (x[i] - fm) * k2);
                }
    }
}

/* ---- LRN across channels: y = x / (bias + alpha / size * sum of x^2 over the channel window)^beta ---- */

__global__ void dnn_lrn_kernel(const void *x, int xdt, void *y, int ydt, int64_t N, int64_t C, int64_t S, int64_t lo,
                               int64_t hi, float k, float bias, float beta) {
    DNN_PLANE_LOOP(N * C, S, pl, s) {
        int64_t b = pl / C, cc = pl % C;
        int64_t c0 = cc - lo < 0 ? 0 : cc - lo, c1 = cc + hi >= C ? C - 1 : cc + hi;
        float sum = 0.f;
        for (int64_t j = c0; j <= c1; j++) {
            float v = dnn_ld(x, xdt, (b * C + j) * S + s);
            sum += v * v;
        }
        int64_t i = pl * S + s;
        dnn_st(y, ydt, i, dnn_ld(x, xdt, i) / powf(bias + k * sum, beta));
    }
}

#endif
