/* cuda-attn.cu - com.tensord FusedAttention on CUDA (kernels/krn-attn.h): Y = softmax(scale(Q @ KT) + M) @ V with
 * the scores kept on chip, flash-attention style. One warp per query row, four rows per block sharing tiles of 32
 * keys (K and V tiles staged in shared memory as float); per tile each lane scores one key, the warp keeps a
 * running max and sum (online softmax) and each lane accumulates up to four of the row's Dv outputs. Arithmetic is
 * fp32 whatever the tensors' dtypes (f32, f16, bf16 each, as a reduced-precision plan stores them: io_ok).
 * Limits (supports()): head dims D, Dv <= 128; larger heads run on the CPU reference (the planner says so).
 * This is a SIMT kernel, not a tensor-core one: it saves the scores' memory traffic and the softmax pass, and is
 * checked against the CPU reference (kernels/cpu/nn-attn.c) by tests/gpu/run.sh's op suite. */
#include "cuda-impl.h"
#include "../krn-attn.h"

#include <math.h>

#define ATT_WARPS 4
#define ATT_TILE 32
#define ATT_MAXD 128

enum { ATT_F32 = 0, ATT_F16 = 1, ATT_BF16 = 2 };

static int att_code(eng_dtype t) {
    return t == ENG_DTYPE_F32 ? ATT_F32 : t == ENG_DTYPE_F16 ? ATT_F16 : t == ENG_DTYPE_BF16 ? ATT_BF16 : -1;
}

__device__ __forceinline__ float att_ld(const void *p, int t, long long i) {
    if (t == ATT_F32) return ((const float *)p)[i];
    if (t == ATT_F16) return __half2float(((const __half *)p)[i]);
    return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
}

__device__ __forceinline__ void att_st(void *p, int t, long long i, float v) {
    if (t == ATT_F32) ((float *)p)[i] = v;
    else if (t == ATT_F16) ((__half *)p)[i] = __float2half_rn(v);
    else ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
}

__device__ __forceinline__ float att_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float att_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

typedef struct att_args {
    krn_attn_view w;
    const void *q, *kt, *v, *m;
    void *y;
    int tq, tk, tv, tm, ty;
    float scale;
    int div;
    long long rblocks; /* blocks per batch index: ceil(sq / ATT_WARPS) */
} att_args;

__global__ void __launch_bounds__(ATT_WARPS * 32) att_kernel(const att_args a) {
    extern __shared__ float att_sh[];
    const krn_attn_view *w = &a.w;
    const int D = (int)w->d, DV = (int)w->dv;
    float *Ks = att_sh;                   /* ATT_TILE x (D + 1): padded so lanes reading one key each hit distinct banks */
    float *Vs = Ks + ATT_TILE * (D + 1);  /* ATT_TILE x DV */
    float *Qs = Vs + ATT_TILE * DV;       /* ATT_WARPS x D */
    const long long bi = blockIdx.x / a.rblocks, rb = blockIdx.x % a.rblocks;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long i = rb * ATT_WARPS + warp;
    const bool live = i < w->sq;
    int64_t o[4];
    krn_attn_offsets(w, bi, o);
    for (int t = lane; t < D; t += 32) Qs[warp * D + t] = live ? att_ld(a.q, a.tq, o[0] + i * w->q_row + t) : 0.f;
    float mrun = -INFINITY, l = 0.f, acc[ATT_MAXD / 32] = {0.f, 0.f, 0.f, 0.f};
    for (long long j0 = 0; j0 < w->sk; j0 += ATT_TILE) {
        const int nj = (int)(w->sk - j0 < ATT_TILE ? w->sk - j0 : ATT_TILE);
        __syncthreads(); /* the previous tile is consumed (and Qs written, on the first) */
        for (int idx = threadIdx.x; idx < nj * D; idx += blockDim.x) {
            int t = idx / nj, jj = idx % nj; /* consecutive threads: consecutive keys of one KT row */
            Ks[jj * (D + 1) + t] = att_ld(a.kt, a.tk, o[1] + t * w->k_row + (j0 + jj) * w->k_col);
        }
        for (int idx = threadIdx.x; idx < nj * DV; idx += blockDim.x) {
            int jj = idx / DV, e = idx % DV;
            Vs[jj * DV + e] = att_ld(a.v, a.tv, o[2] + (j0 + jj) * DV + e);
        }
        __syncthreads();
        if (!live) continue;
        float s = -INFINITY;
        if (lane < nj) {
            float dot = 0.f;
            const float *qr = Qs + warp * D, *kr = Ks + lane * (D + 1);
            for (int t = 0; t < D; t++) dot = fmaf(qr[t], kr[t], dot);
            dot = a.div ? dot / a.scale : dot * a.scale;
            if (a.m) dot += att_ld(a.m, a.tm, o[3] + i * w->m_row + (j0 + lane) * w->m_col);
            s = dot;
        }
        const float mnew = fmaxf(mrun, att_warp_max(s));
        const float p = (lane < nj && mnew != -INFINITY) ? expf(s - mnew) : 0.f;
        const float corr = mrun == -INFINITY ? 0.f : expf(mrun - mnew);
        l = l * corr + att_warp_sum(p);
#pragma unroll
        for (int c = 0; c < ATT_MAXD / 32; c++) acc[c] *= corr;
        for (int jj = 0; jj < nj; jj++) {
            const float pj = __shfl_sync(0xffffffffu, p, jj);
            const float *vr = Vs + jj * DV;
#pragma unroll
            for (int c = 0; c < ATT_MAXD / 32; c++) {
                int e = lane + 32 * c;
                if (e < DV) acc[c] = fmaf(pj, vr[e], acc[c]);
            }
        }
        mrun = mnew;
    }
    if (!live) return;
    const long long yo = (bi * w->sq + i) * DV;
#pragma unroll
    for (int c = 0; c < ATT_MAXD / 32; c++) {
        int e = lane + 32 * c;
        if (e < DV) att_st(a.y, a.ty, yo + e, w->sk > 0 ? acc[c] / l : 0.f); /* no keys: zeros, as the reference */
    }
}

static int att_supports(const krn_call *c) {
    const krn_attn_params *p = (const krn_attn_params *)c->params;
    if (!p || c->nin < 3 || c->nout < 1) return 0;
    for (int k = 0; k < 3; k++)
        if (att_code(c->in[k].dtype) < 0) return 0;
    if (att_code(c->out[0].dtype) < 0 || (p->has_mask && (c->nin < 4 || att_code(c->in[3].dtype) < 0))) return 0;
    krn_attn_view w;
    if (krn_attn_view_make(&c->in[0], &c->in[1], &c->in[2], p->has_mask ? &c->in[3] : NULL, &w, NULL, NULL) !=
        ENG_STATUS_OK)
        return 0;
    return w.d >= 1 && w.d <= ATT_MAXD && w.dv >= 1 && w.dv <= ATT_MAXD;
}

static eng_status att_exec(krn_call *c) {
    const krn_attn_params *p = (const krn_attn_params *)c->params;
    att_args a;
    const eng_tensor *m = p->has_mask ? &c->in[3] : NULL;
    ENG_TRY(krn_attn_view_make(&c->in[0], &c->in[1], &c->in[2], m, &a.w, NULL, NULL));
    if (a.w.d < 1 || a.w.d > ATT_MAXD || a.w.dv < 1 || a.w.dv > ATT_MAXD)
        return eng_err(ENG_STATUS_UNSUPPORTED, "cuda attention: head dims %lld / %lld exceed %d", (long long)a.w.d,
                       (long long)a.w.dv, ATT_MAXD);
    if (a.w.nb * a.w.sq == 0) return ENG_STATUS_OK;
    a.q = c->in[0].data;
    a.kt = c->in[1].data;
    a.v = c->in[2].data;
    a.m = m ? m->data : NULL;
    a.y = c->out[0].data;
    a.tq = att_code(c->in[0].dtype);
    a.tk = att_code(c->in[1].dtype);
    a.tv = att_code(c->in[2].dtype);
    a.tm = m ? att_code(m->dtype) : ATT_F32;
    a.ty = att_code(c->out[0].dtype);
    if (a.tq < 0 || a.tk < 0 || a.tv < 0 || a.tm < 0 || a.ty < 0)
        return eng_err(ENG_STATUS_UNSUPPORTED, "cuda attention: dtypes %s / %s / %s -> %s", eng_dtype_name(c->in[0].dtype),
                       eng_dtype_name(c->in[1].dtype), eng_dtype_name(c->in[2].dtype), eng_dtype_name(c->out[0].dtype));
    a.scale = p->scale;
    a.div = p->scale_div;
    a.rblocks = (a.w.sq + ATT_WARPS - 1) / ATT_WARPS;
    long long blocks = a.rblocks * a.w.nb;
    if (blocks > 0x7fffffffLL)
        return eng_err(ENG_STATUS_UNSUPPORTED, "cuda attention: %lld query rows exceed one launch", (long long)(a.w.nb * a.w.sq));
    size_t shmem = sizeof(float) * (size_t)(ATT_TILE * (a.w.d + 1) + ATT_TILE * a.w.dv + ATT_WARPS * a.w.d);
    att_kernel<<<(unsigned)blocks, ATT_WARPS * 32, shmem, CUDA_CTX(c)->stream>>>(a);
    CUDA_LAUNCHED("attention");
    return ENG_STATUS_OK;
}

/* Reduced precision: Q, KT, V, M and Y may each be f32 or dt (read and written natively, fp32 inside). */
static int att_io_ok(const krn_call *c, eng_dtype dt) {
    if (dt != ENG_DTYPE_BF16 && dt != ENG_DTYPE_F16) return 0;
    for (int i = 0; i < c->nin; i++)
        if (c->in[i].dtype != ENG_DTYPE_UNDEFINED && c->in[i].dtype != ENG_DTYPE_F32 && c->in[i].dtype != dt) return 0;
    return c->out[0].dtype == ENG_DTYPE_F32 || c->out[0].dtype == dt ? 2 : 0;
}

static void att_describe(const krn_call *c, krn_impl_info *info) {
    (void)c;
    krn_str_copy(info->impl, sizeof info->impl, "cuda fused attention (SIMT, online softmax in fp32, 32-key tiles)");
}

extern "C" const krn_kernel krn_cuda_attn_kernels[] = {
    {.name = "attention", .init = NULL, .exec = att_exec, .free_state = NULL, .describe = att_describe, .compute_ok = NULL,
     .io_ok = att_io_ok, .supports = att_supports},
    {.name = NULL},
};
