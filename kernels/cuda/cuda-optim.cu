/* cuda-optim.cu - the optimizer family on CUDA: optim_sum_squares, optim_update, optim_accumulate (krn-optim.h has
 * the formulas and the in/out conventions; kernels/cpu/optim.c is the reference).
 *
 * optim_update is one fused pass over w, g, m, v of one parameter buffer (and the store of 0 into the gradient
 * accumulator when output 3 asks for it), float4-vectorised when every buffer it touches is 16-byte aligned, with a
 * scalar kernel for the unaligned case and for the last n % 4 elements. The element code is the CPU's, operation for
 * operation (IEEE division and sqrtf: this file is never built with fast math); FMA contraction may differ from
 * GCC's, so results agree with the CPU to float rounding, not bitwise.
 * optim_sum_squares squares (scale * g) in float like the CPU and adds the squares in double: per-thread double
 * sums, warp-shuffle and block reductions into at most OPTIM_SS_MAX_BLOCKS partials in the context's workspace,
 * then one block adds those in a fixed order: deterministic for a given n (no atomics).
 * All indexing is 64-bit (grid-stride loops). Nothing here synchronises or allocates: work is queued on ctx->stream.
 */
#include "cuda-impl.h"

extern "C" {
#include "../krn-optim.h"
}

#define OPTIM_THREADS 256
#define OPTIM_SS_MAX_BLOCKS 1024

namespace {

/* krn_optim_params as the element code reads it: (1 - beta) formed in float on the host, as the CPU forms it. */
struct optim_args {
    float lr, gs, wd, dwd, mom, b1, b2, c1, c2, ibc1, ibc2, eps;
};

template <int K>
__device__ __forceinline__ void optim_elem(const optim_args &a, float &w, float g, float &m, float &v) {
    if constexpr (K == KRN_OPTIM_SGD) {
        w -= a.lr * (a.gs * g + a.wd * w);
    } else if constexpr (K == KRN_OPTIM_MOMENTUM || K == KRN_OPTIM_NESTEROV) {
        float ge = a.gs * g + a.wd * w;
        float vi = a.mom * m - a.lr * ge;
        m = vi;
        if constexpr (K == KRN_OPTIM_NESTEROV) w += a.mom * vi - a.lr * ge;
        else w += vi;
    } else {
        float wi = w;
        float ge = a.gs * g + a.wd * wi;
        wi -= a.dwd * wi;
        float mi = a.b1 * m + a.c1 * ge;
        float vi = a.b2 * v + a.c2 * ge * ge;
        m = mi;
        v = vi;
        w = wi - a.lr * (mi * a.ibc1) / (sqrtf(vi * a.ibc2) + a.eps);
    }
}

/* n4 float4 groups; m (K != SGD), v (K == ADAM) and gz (may be NULL) as optim_update's outputs. g may equal gz: each
 * thread reads its g group before it stores zeros over it, so g is read with plain loads (no __ldg / restrict). */
template <int K>
__global__ void optim_update_vec4(float4 *w, const float4 *g, float4 *m, float4 *v, float4 *gz, long long n4,
                                  optim_args a) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 wv = w[i], gv = g[i];
        float4 mv = make_float4(0.f, 0.f, 0.f, 0.f), vv = mv;
        if constexpr (K != KRN_OPTIM_SGD) mv = m[i];
        if constexpr (K == KRN_OPTIM_ADAM) vv = v[i];
        optim_elem<K>(a, wv.x, gv.x, mv.x, vv.x);
        optim_elem<K>(a, wv.y, gv.y, mv.y, vv.y);
        optim_elem<K>(a, wv.z, gv.z, mv.z, vv.z);
        optim_elem<K>(a, wv.w, gv.w, mv.w, vv.w);
        w[i] = wv;
        if constexpr (K != KRN_OPTIM_SGD) m[i] = mv;
        if constexpr (K == KRN_OPTIM_ADAM) v[i] = vv;
        if (gz) gz[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

template <int K>
__global__ void optim_update_scalar(float *w, const float *g, float *m, float *v, float *gz, long long n, optim_args a) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float wi = w[i], mi = 0.f, vi = 0.f;
        float gi = g[i];
        if constexpr (K != KRN_OPTIM_SGD) mi = m[i];
        if constexpr (K == KRN_OPTIM_ADAM) vi = v[i];
        optim_elem<K>(a, wi, gi, mi, vi);
        w[i] = wi;
        if constexpr (K != KRN_OPTIM_SGD) m[i] = mi;
        if constexpr (K == KRN_OPTIM_ADAM) v[i] = vi;
        if (gz) gz[i] = 0.f;
    }
}

__device__ __forceinline__ double optim_warp_sum(double x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_down_sync(0xffffffffu, x, o);
    return x;
}

/* Sum of x over the block (blockDim.x a multiple of 32, at most 1024); the result is valid in thread 0. */
__device__ double optim_block_sum(double x) {
    __shared__ double warp_sums[32];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (int)(blockDim.x >> 5);
    x = optim_warp_sum(x);
    if (lane == 0) warp_sums[wid] = x;
    __syncthreads();
    if (wid == 0) {
        x = lane < nw ? warp_sums[lane] : 0.0;
        x = optim_warp_sum(x);
    }
    return x;
}

/* part[blockIdx.x] = sum over this block's grid-stride share of (scale * g[i])^2, squares in float, sums in double. */
__global__ void optim_sumsq_partial(const float *g, long long n, int vec, float scale, double *part) {
    long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x, stride = (long long)gridDim.x * blockDim.x;
    double acc = 0.0;
    long long done = 0;
    if (vec) {
        const float4 *g4 = (const float4 *)g;
        long long n4 = n >> 2;
        for (long long i = tid; i < n4; i += stride) {
            float4 x = g4[i];
            float a = x.x * scale, b = x.y * scale, c = x.z * scale, d = x.w * scale;
            acc += (double)(a * a);
            acc += (double)(b * b);
            acc += (double)(c * c);
            acc += (double)(d * d);
        }
        done = n4 << 2;
    }
    for (long long i = done + tid; i < n; i += stride) {
        float a = g[i] * scale;
        acc += (double)(a * a);
    }
    acc = optim_block_sum(acc);
    if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

/* *out = sum of np partials, in a fixed order (one block). */
__global__ void optim_sumsq_final(const double *part, int np, double *out) {
    double acc = 0.0;
    for (int i = threadIdx.x; i < np; i += blockDim.x) acc += part[i];
    acc = optim_block_sum(acc);
    if (threadIdx.x == 0) *out = acc;
}

__global__ void optim_accumulate_vec4(float4 *a, const float4 *__restrict__ g, long long n4) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 av = a[i], gv = g[i];
        av.x += gv.x;
        av.y += gv.y;
        av.z += gv.z;
        av.w += gv.w;
        a[i] = av;
    }
}

__global__ void optim_accumulate_scalar(float *a, const float *__restrict__ g, long long n) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) a[i] += g[i];
}

/* ---- shape / dtype checks (supports and exec) ---- */

int is_f32(const eng_tensor *t, long long n) { return t->dtype == ENG_DTYPE_F32 && eng_tensor_numel(t) == n; }

int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* optim_update's call as the CPU kernel accepts it (no data looked at). */
int update_shapes_ok(const krn_call *c) {
    const krn_optim_params *p = (const krn_optim_params *)c->params;
    if (!p || c->nin != 4 || c->nout < 3 || c->nout > 4) return 0;
    if (p->kind < KRN_OPTIM_SGD || p->kind > KRN_OPTIM_ADAM) return 0;
    long long n = eng_tensor_numel(&c->in[0]);
    if (n < 0 || !is_f32(&c->in[0], n) || !is_f32(&c->in[1], n) || !is_f32(&c->out[0], n)) return 0;
    if (p->kind != KRN_OPTIM_SGD && !(is_f32(&c->in[2], n) && is_f32(&c->out[1], n))) return 0;
    if (p->kind == KRN_OPTIM_ADAM && !(is_f32(&c->in[3], n) && is_f32(&c->out[2], n))) return 0;
    if (c->nout == 4 && c->out[3].dtype != ENG_DTYPE_UNDEFINED && !is_f32(&c->out[3], n)) return 0;
    return 1;
}

int update_supports(const krn_call *c) { return update_shapes_ok(c); }

template <int K>
eng_status update_launch(cudaStream_t s, float *w, const float *g, float *m, float *v, float *gz, long long n,
                         const optim_args &a) {
    long long done = 0;
    int vec = aligned16(w) && aligned16(g) && (K == KRN_OPTIM_SGD || aligned16(m)) &&
              (K != KRN_OPTIM_ADAM || aligned16(v)) && (!gz || aligned16(gz));
    if (vec && n >= 4) {
        long long n4 = n >> 2;
        optim_update_vec4<K><<<cuda_grid(n4, OPTIM_THREADS), OPTIM_THREADS, 0, s>>>(
            (float4 *)w, (const float4 *)g, (float4 *)m, (float4 *)v, (float4 *)gz, n4, a);
        CUDA_LAUNCHED("optim_update");
        done = n4 << 2;
    }
    if (done < n) {
        long long rest = n - done;
        optim_update_scalar<K><<<cuda_grid(rest, OPTIM_THREADS), OPTIM_THREADS, 0, s>>>(
            w + done, g + done, m ? m + done : NULL, v ? v + done : NULL, gz ? gz + done : NULL, rest, a);
        CUDA_LAUNCHED("optim_update");
    }
    return ENG_STATUS_OK;
}

eng_status update_exec(krn_call *c) {
    const char *k = "optim_update";
    if (!update_shapes_ok(c))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "cuda %s: call not supported (float32 {w, g, m, v} -> {w, m, v[, gz]} "
                       "of equal sizes expected)", k);
    const krn_optim_params *p = (const krn_optim_params *)c->params;
    long long n = eng_tensor_numel(&c->in[0]);
    float *w = (float *)c->out[0].data;
    const float *g = (const float *)c->in[1].data;
    float *m = p->kind != KRN_OPTIM_SGD ? (float *)c->out[1].data : NULL;
    float *v = p->kind == KRN_OPTIM_ADAM ? (float *)c->out[2].data : NULL;
    float *gz = c->nout == 4 ? (float *)c->out[3].data : NULL;
    if (n == 0) return ENG_STATUS_OK;
    if (!w || !g || w != c->in[0].data || (p->kind != KRN_OPTIM_SGD && (!m || m != c->in[2].data)) ||
        (p->kind == KRN_OPTIM_ADAM && (!v || v != c->in[3].data)) || (gz && gz != c->in[1].data))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "cuda %s: in place only: outputs {w, m, v, gz} must have the data "
                       "pointers of inputs {w, m, v, g}", k);
    optim_args a = {p->lr, p->gscale, p->weight_decay, p->decoupled_decay, p->momentum, p->beta1, p->beta2,
                    1.0f - p->beta1, 1.0f - p->beta2, p->inv_bc1, p->inv_bc2, p->eps};
    cudaStream_t s = CUDA_CTX(c)->stream;
    switch (p->kind) {
    case KRN_OPTIM_SGD: return update_launch<KRN_OPTIM_SGD>(s, w, g, m, v, gz, n, a);
    case KRN_OPTIM_MOMENTUM: return update_launch<KRN_OPTIM_MOMENTUM>(s, w, g, m, v, gz, n, a);
    case KRN_OPTIM_NESTEROV: return update_launch<KRN_OPTIM_NESTEROV>(s, w, g, m, v, gz, n, a);
    default: return update_launch<KRN_OPTIM_ADAM>(s, w, g, m, v, gz, n, a);
    }
}

int sumsq_supports(const krn_call *c) {
    if (!c->params || c->nin != 1 || c->nout != 1) return 0;
    long long n = eng_tensor_numel(&c->in[0]);
    return n >= 0 && is_f32(&c->in[0], n) && c->out[0].dtype == ENG_DTYPE_F64 && eng_tensor_numel(&c->out[0]) == 1;
}

eng_status sumsq_exec(krn_call *c) {
    const char *k = "optim_sum_squares";
    if (!sumsq_supports(c))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "cuda %s: call not supported (float32 input, one float64 output "
                       "expected)", k);
    const krn_optim_sumsq_params *p = (const krn_optim_sumsq_params *)c->params;
    cuda_ctx *x = CUDA_CTX(c);
    long long n = eng_tensor_numel(&c->in[0]);
    const float *g = (const float *)c->in[0].data;
    double *out = (double *)c->out[0].data;
    if (!out || (n > 0 && !g)) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "cuda %s: no data", k);
    if (n == 0) {
        CUDA_TRY(k, cudaMemsetAsync(out, 0, sizeof(double), x->stream));
        return ENG_STATUS_OK;
    }
    int vec = aligned16(g);
    unsigned blocks = cuda_grid(vec ? (n >> 2) : n, OPTIM_THREADS);
    if (blocks > OPTIM_SS_MAX_BLOCKS) blocks = OPTIM_SS_MAX_BLOCKS;
    if (blocks == 1) {
        optim_sumsq_partial<<<1, OPTIM_THREADS, 0, x->stream>>>(g, n, vec, p->scale, out);
        CUDA_LAUNCHED(k);
        return ENG_STATUS_OK;
    }
    void *ws = NULL;
    ENG_TRY(cuda_ctx_workspace(x, (size_t)blocks * sizeof(double), &ws));
    optim_sumsq_partial<<<blocks, OPTIM_THREADS, 0, x->stream>>>(g, n, vec, p->scale, (double *)ws);
    CUDA_LAUNCHED(k);
    optim_sumsq_final<<<1, OPTIM_THREADS, 0, x->stream>>>((const double *)ws, (int)blocks, out);
    CUDA_LAUNCHED(k);
    return ENG_STATUS_OK;
}

int accumulate_supports(const krn_call *c) {
    if (c->nin != 2 || c->nout != 1) return 0;
    long long n = eng_tensor_numel(&c->in[0]);
    return n >= 0 && is_f32(&c->in[0], n) && is_f32(&c->in[1], n) && is_f32(&c->out[0], n);
}

eng_status accumulate_exec(krn_call *c) {
    const char *k = "optim_accumulate";
    if (!accumulate_supports(c))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "cuda %s: call not supported (float32 {a, g} -> {a} of equal sizes "
                       "expected)", k);
    long long n = eng_tensor_numel(&c->in[0]);
    float *a = (float *)c->out[0].data;
    const float *g = (const float *)c->in[1].data;
    if (n == 0) return ENG_STATUS_OK;
    if (!a || !g || a != c->in[0].data)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "cuda %s: in place only: output 0 must have the data pointer of "
                       "input 0", k);
    cudaStream_t s = CUDA_CTX(c)->stream;
    long long done = 0;
    if (aligned16(a) && aligned16(g) && n >= 4) {
        long long n4 = n >> 2;
        optim_accumulate_vec4<<<cuda_grid(n4, OPTIM_THREADS), OPTIM_THREADS, 0, s>>>((float4 *)a, (const float4 *)g,
                                                                                      n4);
        CUDA_LAUNCHED(k);
        done = n4 << 2;
    }
    if (done < n) {
        optim_accumulate_scalar<<<cuda_grid(n - done, OPTIM_THREADS), OPTIM_THREADS, 0, s>>>(a + done, g + done,
                                                                                            n - done);
        CUDA_LAUNCHED(k);
    }
    return ENG_STATUS_OK;
}

} // namespace

extern "C" const krn_kernel krn_cuda_optim_kernels[] = {
    {.name = "optim_sum_squares", .init = NULL, .exec = sumsq_exec, .free_state = NULL, .describe = NULL,
     .compute_ok = NULL, .io_ok = NULL, .supports = sumsq_supports},
    {.name = "optim_update", .init = NULL, .exec = update_exec, .free_state = NULL, .describe = NULL,
     .compute_ok = NULL, .io_ok = NULL, .supports = update_supports},
    {.name = "optim_accumulate", .init = NULL, .exec = accumulate_exec, .free_state = NULL, .describe = NULL,
     .compute_ok = NULL, .io_ok = NULL, .supports = accumulate_supports},
    {NULL},
};
