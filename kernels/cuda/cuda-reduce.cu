/* cuda-reduce.cu - CUDA kernels of the reduce family: ReduceX, ArgMax/ArgMin, TopK, CumSum (this file),
 * Softmax/LayerNorm/InstanceNorm/MVN (cuda-reduce-norm.h) and the losses with the gradient kernels of this
 * family (cuda-reduce-grad.h), all exported in krn_cuda_reduce_kernels.
 *
 * Each kernel matches its CPU reference (kernels/cpu/reduce*.c, norm*.c, grad*.c): same name, params, inputs,
 * outputs and work types (float for f32/f16/bf16, double for f64 and where the CPU uses double, int64 for
 * integers). Work is queued on the context's stream; nothing here synchronises or allocates device memory
 * (scratch comes from cuda_ctx_workspace). supports() refuses every call a kernel does not compute like the CPU.
 *
 * ReduceX views the input as a collapsed shape (size-1 dims dropped, neighbouring reduced / kept dims merged,
 * as krn_red_shape does): one reduced group with kept dims after it runs the column kernel (32 contiguous
 * outputs per block, the reduced dim split over threadIdx.y), anything else runs one warp (or, for long
 * reductions, one block) per output, decoding reduced offsets through a stride table (a plain multiply when
 * there is one reduced group).
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-reduce-common.h"

extern "C" {
#include "../krn-grad.h"
#include "../krn-reduce.h"
}

/* ======================================================================== ReduceX */

/* The collapsed shape of a reduction: kept dims (kn, input strides ks) in output order, reduced dims (rn, rs),
 * and the whole collapsed shape (n, output strides ost, 0 on reduced dims). */
typedef struct rd_geom {
    int nk, nr, nd;
    int64_t kn[ENG_MAX_DIMS], ks[ENG_MAX_DIMS];
    int64_t rn[ENG_MAX_DIMS], rs[ENG_MAX_DIMS];
    int64_t n[ENG_MAX_DIMS], ost[ENG_MAX_DIMS];
    int64_t count, out_numel;
    /* at most one reduced group: the input is (O, R, I) */
    int simple;
    int64_t O, R, I;
} rd_geom;

static void rd_geom_init(rd_geom *g, const int64_t *dims, int ndim, unsigned mask) {
    int red[ENG_MAX_DIMS];
    memset(g, 0, sizeof *g);
    g->count = 1;
    g->out_numel = 1;
    for (int d = 0; d < ndim; d++) {
        int r = (mask >> d) & 1u;
        if (r) g->count *= dims[d];
        else g->out_numel *= dims[d];
        if (dims[d] == 1) continue;
        if (g->nd > 0 && red[g->nd - 1] == r) {
            g->n[g->nd - 1] *= dims[d];
        } else {
            g->n[g->nd] = dims[d];
            red[g->nd] = r;
            g->nd++;
        }
    }
    int64_t is = 1, os = 1, ist[ENG_MAX_DIMS];
    for (int d = g->nd - 1; d >= 0; d--) {
        ist[d] = is;
        is *= g->n[d];
        g->ost[d] = red[d] ? 0 : os;
        if (!red[d]) os *= g->n[d];
    }
    int groups = 0, rpos = -1;
    for (int d = 0; d < g->nd; d++) {
        if (red[d]) {
            g->rn[g->nr] = g->n[d], g->rs[g->nr] = ist[d], g->nr++;
            groups++;
            rpos = d;
        } else {
            g->kn[g->nk] = g->n[d], g->ks[g->nk] = ist[d], g->nk++;
        }
    }
    g->simple = groups <= 1;
    g->O = 1, g->R = 1, g->I = 1;
    if (rpos < 0) {
        g->I = g->out_numel;
    } else {
        for (int d = 0; d < rpos; d++) g->O *= g->n[d];
        g->R = g->n[rpos];
        for (int d = rpos + 1; d < g->nd; d++) g->I *= g->n[d];
    }
}

template <typename W> static __device__ __forceinline__ W rd_post(W a, int post, W shift, int64_t count) {
    switch (post) {
    case RP_MEAN:
        if constexpr (std::is_same_v<W, float>) return count ? a * (1.0f / (float)count) : NAN;
        else if constexpr (std::is_same_v<W, double>) return count ? a / (double)count : NAN;
        else return count ? a / count : 0;
    case RP_SQRT:
        if constexpr (std::is_floating_point_v<W>) return rd_sqrt(a);
        else return a;
    case RP_LOG:
        if constexpr (std::is_floating_point_v<W>) return rd_log(a);
        else return a;
    case RP_LSE:
        if constexpr (std::is_floating_point_v<W>) return rd_log(a) + shift;
        else return a;
    default: return a;
    }
}

/* Fold the reduced elements of the output whose input base offset is `base` (this thread's share). */
template <typename T, typename W, int G>
static __device__ __forceinline__ W rd_fold(const T *x, int64_t base, const rd_geom &g, int comb, int xf, int lane) {
    W a = rc_ident<W>(comb);
    if (g.nr == 1) {
        int64_t st = g.rs[0];
        for (int64_t r = lane; r < g.count; r += G) a = rc_do(a, rx_do(ldw<W>(x, base + r * st), xf), comb);
    } else {
        for (int64_t r = lane; r < g.count; r += G) a = rc_do(a, rx_do(ldw<W>(x, base + rd_offset(g.nr, g.rn, g.rs, r)), xf), comb);
    }
    return a;
}
template <typename T, typename W, int G>
static __device__ __forceinline__ W rd_fold_exp(const T *x, int64_t base, const rd_geom &g, W shift, int lane) {
    W a = 0;
    for (int64_t r = lane; r < g.count; r += G) {
        int64_t off = g.nr == 1 ? r * g.rs[0] : rd_offset(g.nr, g.rn, g.rs, r);
        if constexpr (std::is_floating_point_v<W>) a += rd_exp(ldw<W>(x, base + off) - shift);
    }
    return a;
}

/* One group (warp or block) per output. */
template <typename T, typename TO, typename W, int G>
__global__ void __launch_bounds__(RD_THREADS) rd_rows_kernel(const T *x, TO *y, const rd_geom g, int comb, int xf, int post) {
    __shared__ W sh[32];
    rd_grp<G> gr;
    for (int64_t o = gr.first; o < g.out_numel; o += gr.step) {
        int64_t base = rd_offset(g.nk, g.kn, g.ks, o);
        W shift = 0, a;
        if (post == RP_LSE) {
            W m = grp_comb<G>(rd_fold<T, W, G>(x, base, g, RC_MAX, RX_ID, gr.lane), RC_MAX, sh);
            if constexpr (std::is_floating_point_v<W>) shift = isfinite(m) ? m : (W)0;
            a = grp_comb<G>(rd_fold_exp<T, W, G>(x, base, g, shift, gr.lane), RC_ADD, sh);
        } else {
            a = grp_comb<G>(rd_fold<T, W, G>(x, base, g, comb, xf, gr.lane), comb, sh);
        }
        if (gr.lane == 0) stw(y, o, rd_post(a, post, shift, g.count));
    }
}

#define RD_COL_Y 16

/* Reduce over threadIdx.y of a (RD_COL_Y, 32) block; every thread gets its column's result. */
template <typename W> static __device__ __forceinline__ W col_comb(W v, int comb, W (*sh)[33]) {
    sh[threadIdx.y][threadIdx.x] = v;
    __syncthreads();
    for (int s = RD_COL_Y / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.y < s) sh[threadIdx.y][threadIdx.x] = rc_do(sh[threadIdx.y][threadIdx.x], sh[threadIdx.y + s][threadIdx.x], comb);
        __syncthreads();
    }
    v = sh[0][threadIdx.x];
    __syncthreads();
    return v;
}

/* (O, R, I) with I > 1: blockIdx.x picks 32 contiguous columns, threadIdx.y splits R; blockIdx.z picks a chunk
 * of rchunk reduced rows when part != NULL (partials, no finish, at part[(z * O + o) * I + i]). */
template <typename T, typename TO, typename W>
__global__ void __launch_bounds__(32 * RD_COL_Y) rd_cols_kernel(const T *x, TO *y, W *part, int64_t O, int64_t R, int64_t I, int64_t rchunk,
                                                                int comb, int xf, int post) {
    __shared__ W sh[RD_COL_Y][33];
    int64_t i = (int64_t)blockIdx.x * 32 + threadIdx.x;
    int64_t r0 = (int64_t)blockIdx.z * rchunk, r1 = r0 + rchunk < R ? r0 + rchunk : R;
    bool ok = i < I;
    for (int64_t o = blockIdx.y; o < O; o += gridDim.y) {
        int64_t base = o * R * I + i;
        W shift = 0, a;
        if (post == RP_LSE) {
            W m = rd_lim<W>::lo();
            if (ok)
                for (int64_t r = r0 + threadIdx.y; r < r1; r += RD_COL_Y) m = rc_do(m, ldw<W>(x, base + r * I), RC_MAX);
            m = col_comb(m, RC_MAX, sh);
            if constexpr (std::is_floating_point_v<W>) shift = isfinite(m) ? m : (W)0;
            a = 0;
            if constexpr (std::is_floating_point_v<W>)
                if (ok)
                    for (int64_t r = r0 + threadIdx.y; r < r1; r += RD_COL_Y) a += rd_exp(ldw<W>(x, base + r * I) - shift);
            a = col_comb(a, RC_ADD, sh);
        } else {
            a = rc_ident<W>(comb);
            if (ok)
                for (int64_t r = r0 + threadIdx.y; r < r1; r += RD_COL_Y) a = rc_do(a, rx_do(ldw<W>(x, base + r * I), xf), comb);
            a = col_comb(a, comb, sh);
        }
        if (ok && threadIdx.y == 0) {
            if (part) part[((int64_t)blockIdx.z * O + o) * I + i] = a;
            else stw(y, o * I + i, rd_post(a, post, shift, R));
        }
    }
}

/* y[e] = finish(fold of part[z * n + e], z < Z): the second stage of a split column reduction. */
template <typename TO, typename W>
__global__ void rd_cols_final_kernel(const W *part, TO *y, int64_t n, int64_t Z, int comb, int post, int64_t count) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        W a = rc_ident<W>(comb);
        for (int64_t z = 0; z < Z; z++) a = rc_do(a, part[z * n + e], comb);
        stw(y, e, rd_post(a, post, (W)0, count));
    }
}

/* Few outputs, long reductions: block b = (o, p) folds chunk p of output o into part[b]. */
template <typename T, typename W>
__global__ void __launch_bounds__(RD_THREADS) rd_split_kernel(const T *x, W *part, const rd_geom g, int comb, int xf, int64_t P,
                                                              int64_t chunk) {
    __shared__ W sh[32];
    for (int64_t b = blockIdx.x; b < g.out_numel * P; b += gridDim.x) {
        int64_t o = b / P, p = b - o * P;
        int64_t base = rd_offset(g.nk, g.kn, g.ks, o), lo = p * chunk, hi = lo + chunk < g.count ? lo + chunk : g.count;
        W a = rc_ident<W>(comb);
        if (g.nr == 1) {
            int64_t st = g.rs[0];
            for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x) a = rc_do(a, rx_do(ldw<W>(x, base + r * st), xf), comb);
        } else {
            for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x)
                a = rc_do(a, rx_do(ldw<W>(x, base + rd_offset(g.nr, g.rn, g.rs, r)), xf), comb);
        }
        a = block_comb(a, comb, sh);
        if (threadIdx.x == 0) part[b] = a;
    }
}

template <typename TO, typename W>
__global__ void __launch_bounds__(RD_THREADS) rd_split_final_kernel(const W *part, TO *y, int64_t nout, int64_t P, int comb, int post,
                                                                    int64_t count) {
    rd_grp<32> gr;
    for (int64_t o = gr.first; o < nout; o += gr.step) {
        W a = rc_ident<W>(comb);
        for (int64_t p = gr.lane; p < P; p += 32) a = rc_do(a, part[o * P + p], comb);
        a = warp_comb(a, comb);
        if (gr.lane == 0) stw(y, o, rd_post(a, post, (W)0, count));
    }
}

#define RD_FEW_BLOCKS 264 /* below this many blocks (2 per SM of an H100) a long reduction is split */

template <typename T, typename TO, typename W>
static eng_status rd_launch(cuda_ctx *cx, const T *x, TO *y, const rd_geom &g, int comb, int xf, int post) {
    cudaStream_t s = cx->stream;
    if (g.out_numel == 0) return ENG_STATUS_OK;
    if (g.simple && g.I > 1) {
        int64_t bx = (g.I + 31) / 32, by = g.O < 65535 ? (g.O > 0 ? g.O : 1) : 65535, Z = 1;
        if (bx > INT_MAX) return eng_err(ENG_STATUS_UNSUPPORTED, "cuda reduce: %lld inner outputs exceed the grid", (long long)g.I);
        if (post != RP_LSE && bx * by < RD_FEW_BLOCKS && g.R >= 4096) {
            Z = g.R / 1024 < 1024 / (bx * by) ? g.R / 1024 : 1024 / (bx * by);
            Z = Z < 1 ? 1 : Z > 256 ? 256 : Z;
        }
        int64_t rchunk = (g.R + Z - 1) / Z;
        W *part = NULL;
        if (Z > 1) {
            void *ws;
            ENG_TRY(cuda_ctx_workspace(cx, (size_t)(Z * g.O * g.I) * sizeof(W), &ws));
            part = (W *)ws;
        }
        dim3 grid((unsigned)bx, (unsigned)by, (unsigned)Z), block(32, RD_COL_Y);
        rd_cols_kernel<T, TO, W><<<grid, block, 0, s>>>(x, y, part, g.O, g.R, g.I, rchunk, comb, xf, post);
        CUDA_LAUNCHED("reduce (columns)");
        if (part) {
            rd_cols_final_kernel<TO, W><<<cuda_grid(g.O * g.I, RD_THREADS), RD_THREADS, 0, s>>>(part, y, g.O * g.I, Z, comb, post, g.R);
            CUDA_LAUNCHED("reduce (column partials)");
        }
    } else if (post != RP_LSE && g.count >= 65536 && g.out_numel < RD_FEW_BLOCKS) {
        int64_t P = g.count / 16384 < 1024 / g.out_numel ? g.count / 16384 : 1024 / g.out_numel;
        P = P < 1 ? 1 : P;
        int64_t chunk = (g.count + P - 1) / P;
        void *ws;
        ENG_TRY(cuda_ctx_workspace(cx, (size_t)(g.out_numel * P) * sizeof(W), &ws));
        W *part = (W *)ws;
        rd_split_kernel<T, W><<<(unsigned)(g.out_numel * P), RD_THREADS, 0, s>>>(x, part, g, comb, xf, P, chunk);
        CUDA_LAUNCHED("reduce (split rows)");
        rd_split_final_kernel<TO, W><<<rd_grp_blocks(g.out_numel, 32), RD_THREADS, 0, s>>>(part, y, g.out_numel, P, comb, post, g.count);
        CUDA_LAUNCHED("reduce (row partials)");
    } else if (g.count > RD_ROW_BLOCK) {
        rd_rows_kernel<T, TO, W, RD_THREADS><<<rd_grp_blocks(g.out_numel, RD_THREADS), RD_THREADS, 0, s>>>(x, y, g, comb, xf, post);
        CUDA_LAUNCHED("reduce (block rows)");
    } else {
        rd_rows_kernel<T, TO, W, 32><<<rd_grp_blocks(g.out_numel, 32), RD_THREADS, 0, s>>>(x, y, g, comb, xf, post);
        CUDA_LAUNCHED("reduce (warp rows)");
    }
    return ENG_STATUS_OK;
}

static void rd_codes(krn_reduce_op op, int *comb, int *xf, int *post) {
    *comb = RC_ADD, *xf = RX_ID, *post = RP_NONE;
    switch (op) {
    case KRN_REDUCE_MEAN: *post = RP_MEAN; break;
    case KRN_REDUCE_MAX: *comb = RC_MAX; break;
    case KRN_REDUCE_MIN: *comb = RC_MIN; break;
    case KRN_REDUCE_PROD: *comb = RC_MUL; break;
    case KRN_REDUCE_L1: *xf = RX_ABS; break;
    case KRN_REDUCE_L2: *xf = RX_SQ, *post = RP_SQRT; break;
    case KRN_REDUCE_LOGSUM: *post = RP_LOG; break;
    case KRN_REDUCE_LOGSUMEXP: *post = RP_LSE; break;
    case KRN_REDUCE_SUMSQUARE: *xf = RX_SQ; break;
    default: break;
    }
}

static int reduce_supports(const krn_call *c) {
    const krn_reduce_params *p = (const krn_reduce_params *)c->params;
    if (!p || c->nin < 1 || c->nout < 1) return 0;
    eng_dtype dt = c->in[0].dtype;
    if (!rd_numeric(dt) || c->out[0].dtype != dt) return 0;
    if ((int)p->op < KRN_REDUCE_SUM || (int)p->op > KRN_REDUCE_SUMSQUARE) return 0;
    rd_geom g;
    rd_geom_init(&g, c->in[0].dims, c->in[0].ndim, p->axis_mask);
    return eng_tensor_numel(&c->out[0]) == g.out_numel;
}

static eng_status reduce_exec(krn_call *c) {
    const krn_reduce_params *p = (const krn_reduce_params *)c->params;
    const eng_tensor *x = &c->in[0];
    eng_tensor *y = &c->out[0];
    cuda_ctx *s = CUDA_CTX(c);
    rd_geom g;
    rd_geom_init(&g, x->dims, x->ndim, p->axis_mask);
    int comb, xf, post;
    rd_codes(p->op, &comb, &xf, &post);
    /* integers: int64 work, except L2 / LogSum / LogSumExp which the CPU runs in double */
    int dbl = post == RP_SQRT || post == RP_LOG || post == RP_LSE;
    switch (x->dtype) {
    case ENG_DTYPE_F32: return rd_launch<float, float, float>(s, (const float *)x->data, (float *)y->data, g, comb, xf, post);
    case ENG_DTYPE_F16: return rd_launch<__half, __half, float>(s, (const __half *)x->data, (__half *)y->data, g, comb, xf, post);
    case ENG_DTYPE_BF16:
        return rd_launch<__nv_bfloat16, __nv_bfloat16, float>(s, (const __nv_bfloat16 *)x->data, (__nv_bfloat16 *)y->data, g,
                                                              comb, xf, post);
    case ENG_DTYPE_F64: return rd_launch<double, double, double>(s, (const double *)x->data, (double *)y->data, g, comb, xf, post);
    case ENG_DTYPE_I32:
        if (dbl) return rd_launch<int32_t, int32_t, double>(s, (const int32_t *)x->data, (int32_t *)y->data, g, comb, xf, post);
        return rd_launch<int32_t, int32_t, int64_t>(s, (const int32_t *)x->data, (int32_t *)y->data, g, comb, xf, post);
    case ENG_DTYPE_I64:
        if (dbl) return rd_launch<int64_t, int64_t, double>(s, (const int64_t *)x->data, (int64_t *)y->data, g, comb, xf, post);
        return rd_launch<int64_t, int64_t, int64_t>(s, (const int64_t *)x->data, (int64_t *)y->data, g, comb, xf, post);
    default:
        return eng_err(ENG_STATUS_UNSUPPORTED, "cuda reduce: dtype %s (expected float32/16, bfloat16, float64, int32/64)",
                       eng_dtype_name(x->dtype));
    }
}

/* ======================================================================== ArgMax / ArgMin */

/* inner == 1: one warp per row. NaNs are skipped except at index 0, where they win (the CPU's scan from x[0]
 * with strict comparisons). */
template <typename T, typename W>
__global__ void __launch_bounds__(RD_THREADS) arg_rows_kernel(const T *x, int64_t *y, int64_t rows, int64_t n, int is_min, int last) {
    rd_grp<32> gr;
    for (int64_t o = gr.first; o < rows; o += gr.step) {
        const T *xr = x + o * n;
        W bv = 0;
        int64_t bi = -1;
        for (int64_t i = gr.lane; i < n; i += 32) {
            W v = ldw<W>(xr, i);
            if (rd_nan(v) && i != 0) continue;
            if (pick_better(v, i, bv, bi, is_min, last)) bv = v, bi = i;
        }
        warp_pick(bv, bi, is_min, last);
        if (gr.lane == 0) y[o] = rd_nan(ldw<W>(xr, 0)) || bi < 0 ? 0 : bi;
    }
}

/* inner > 1: one thread per (outer, inner) column, the CPU's scan exactly. */
template <typename T, typename W>
__global__ void arg_cols_kernel(const T *x, int64_t *y, int64_t outer, int64_t n, int64_t inner, int is_min, int last) {
    int64_t lines = outer * inner;
    for (int64_t l = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; l < lines; l += (int64_t)gridDim.x * blockDim.x) {
        int64_t o = l / inner, j = l - o * inner;
        const T *xc = x + o * n * inner + j;
        W b = ldw<W>(xc, 0);
        int64_t bi = 0;
        for (int64_t i = 1; i < n; i++) {
            W v = ldw<W>(xc, i * inner);
            bool take = is_min ? (last ? v <= b : v < b) : (last ? v >= b : v > b);
            if (take) b = v, bi = i;
        }
        y[l] = bi;
    }
}

template <typename T, typename W>
static eng_status arg_launch(cudaStream_t s, const void *x, int64_t *y, int64_t outer, int64_t n, int64_t inner, int is_min, int last) {
    if (inner == 1) {
        arg_rows_kernel<T, W><<<rd_grp_blocks(outer, 32), RD_THREADS, 0, s>>>((const T *)x, y, outer, n, is_min, last);
        CUDA_LAUNCHED("argreduce (rows)");
    } else {
        arg_cols_kernel<T, W><<<cuda_grid(outer * inner, RD_THREADS), RD_THREADS, 0, s>>>((const T *)x, y, outer, n, inner, is_min, last);
        CUDA_LAUNCHED("argreduce (columns)");
    }
    return ENG_STATUS_OK;
}

static void rd_split(const eng_tensor *x, int axis, int64_t *outer, int64_t *n, int64_t *inner) {
    *outer = eng_shape_numel(x->dims, axis);
    *n = x->dims[axis];
    *inner = eng_shape_numel(x->dims + axis + 1, x->ndim - axis - 1);
}

static int argreduce_supports(const krn_call *c) {
    const krn_arg_params *p = (const krn_arg_params *)c->params;
    if (!p || c->nin < 1 || c->nout < 1) return 0;
    return rd_numeric(c->in[0].dtype) && c->out[0].dtype == ENG_DTYPE_I64 && p->axis >= 0 && p->axis < c->in[0].ndim;
}

static eng_status argreduce_exec(krn_call *c) {
    const krn_arg_params *p = (const krn_arg_params *)c->params;
    const eng_tensor *x = &c->in[0];
    int64_t outer, n, inner;
    rd_split(x, p->axis, &outer, &n, &inner);
    if (n == 0 || outer * inner == 0) return ENG_STATUS_OK;
    cudaStream_t s = CUDA_CTX(c)->stream;
    int64_t *y = (int64_t *)c->out[0].data;
    int mn = p->is_min, last = p->select_last_index;
    switch (x->dtype) {
    case ENG_DTYPE_F32: return arg_launch<float, float>(s, x->data, y, outer, n, inner, mn, last);
    case ENG_DTYPE_F16: return arg_launch<__half, float>(s, x->data, y, outer, n, inner, mn, last);
    case ENG_DTYPE_BF16: return arg_launch<__nv_bfloat16, float>(s, x->data, y, outer, n, inner, mn, last);
    case ENG_DTYPE_F64: return arg_launch<double, double>(s, x->data, y, outer, n, inner, mn, last);
    case ENG_DTYPE_I32: return arg_launch<int32_t, int64_t>(s, x->data, y, outer, n, inner, mn, last);
    case ENG_DTYPE_I64: return arg_launch<int64_t, int64_t>(s, x->data, y, outer, n, inner, mn, last);
    default: return eng_err(ENG_STATUS_UNSUPPORTED, "cuda argreduce: dtype %s", eng_dtype_name(x->dtype));
    }
}

/* ======================================================================== TopK */

#define RD_TOPK_MAX_K 64 /* k rounds of a block arg-reduction each; larger k runs on the CPU */

/* One block per (outer, inner) slice; round r picks the best element that comes after round r-1's pick in the
 * order (value desc for largest / asc, then index asc): the CPU's sorted order, ties lower index first. */
template <typename T, typename W>
__global__ void __launch_bounds__(RD_THREADS) topk_kernel(const T *x, T *vals, int64_t *idx, int64_t outer, int64_t n, int64_t inner,
                                                          int64_t k, int largest) {
    __shared__ W shv[32];
    __shared__ int64_t shi[32];
    int is_min = !largest;
    for (int64_t sl = blockIdx.x; sl < outer * inner; sl += gridDim.x) {
        int64_t o = sl / inner, j = sl - o * inner, base = o * n * inner + j;
        W pv = 0;
        int64_t pi = -1;
        for (int64_t r = 0; r < k; r++) {
            W bv = 0;
            int64_t bi = -1;
            for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
                W v = ldw<W>(x, base + i * inner);
                if (pi >= 0 && !pick_better(pv, pi, v, i, is_min, 0)) continue; /* not after the previous pick */
                if (pick_better(v, i, bv, bi, is_min, 0)) bv = v, bi = i;
            }
            grp_pick<RD_THREADS>(bv, bi, is_min, 0, shv, shi);
            if (bi >= 0) pv = bv, pi = bi;
            if (threadIdx.x == 0) {
                int64_t d = o * k * inner + r * inner + j, src = bi >= 0 ? bi : 0; /* none left: only NaNs remain */
                vals[d] = x[base + src * inner];
                idx[d] = src;
            }
        }
    }
}

template <typename T, typename W>
static eng_status topk_launch(cudaStream_t s, const krn_call *c, int64_t outer, int64_t n, int64_t inner, int64_t k, int largest) {
    int64_t slices = outer * inner;
    unsigned blocks = (unsigned)(slices < (1 << 20) ? slices : (1 << 20));
    topk_kernel<T, W><<<blocks, RD_THREADS, 0, s>>>((const T *)c->in[0].data, (T *)c->out[0].data, (int64_t *)c->out[1].data,
                                                    outer, n, inner, k, largest);
    CUDA_LAUNCHED("topk");
    return ENG_STATUS_OK;
}

static int topk_supports(const krn_call *c) {
    const krn_topk_params *p = (const krn_topk_params *)c->params;
    if (!p || c->nin < 1 || c->nout < 2) return 0;
    const eng_tensor *x = &c->in[0];
    if (p->axis < 0 || p->axis >= x->ndim) return 0;
    return rd_numeric(x->dtype) && c->out[0].dtype == x->dtype && c->out[1].dtype == ENG_DTYPE_I64 && p->k >= 0 &&
           p->k <= RD_TOPK_MAX_K && p->k <= x->dims[p->axis];
}

static eng_status topk_exec(krn_call *c) {
    const krn_topk_params *p = (const krn_topk_params *)c->params;
    const eng_tensor *x = &c->in[0];
    int64_t outer, n, inner, k = p->k;
    rd_split(x, p->axis, &outer, &n, &inner);
    if (k == 0 || outer * inner == 0) return ENG_STATUS_OK;
    if (k > RD_TOPK_MAX_K || k > n) return eng_err(ENG_STATUS_UNSUPPORTED, "cuda topk: k = %lld (at most %d and the axis size %lld)",
                                                   (long long)k, RD_TOPK_MAX_K, (long long)n);
    cudaStream_t s = CUDA_CTX(c)->stream;
    switch (x->dtype) {
    case ENG_DTYPE_F32: return topk_launch<float, float>(s, c, outer, n, inner, k, p->largest);
    case ENG_DTYPE_F16: return topk_launch<__half, float>(s, c, outer, n, inner, k, p->largest);
    case ENG_DTYPE_BF16: return topk_launch<__nv_bfloat16, float>(s, c, outer, n, inner, k, p->largest);
    case ENG_DTYPE_F64: return topk_launch<double, double>(s, c, outer, n, inner, k, p->largest);
    case ENG_DTYPE_I32: return topk_launch<int32_t, int64_t>(s, c, outer, n, inner, k, p->largest);
    case ENG_DTYPE_I64: return topk_launch<int64_t, int64_t>(s, c, outer, n, inner, k, p->largest);
    default: return eng_err(ENG_STATUS_UNSUPPORTED, "cuda topk: dtype %s", eng_dtype_name(x->dtype));
    }
}

/* ======================================================================== CumSum */

/* The axis is input 1, a device scalar: read here, on the device. Out of range: nothing is written (the CPU
 * returns INVALID_ARGUMENT; the engine validates constant axes at plan time). inner == 1: one warp per row,
 * 32-element shuffle scans with a running carry; inner > 1: one thread per column, a sequential scan. */
template <typename T, typename W>
__global__ void __launch_bounds__(RD_THREADS) cumsum_kernel(const T *x, T *y, const rd_dims sh, const void *axis, int axis64, int excl,
                                                            int rev) {
    int64_t a = ld_index(axis, axis64, 0);
    if (a < 0) a += sh.nd;
    if (a < 0 || a >= sh.nd) return;
    int64_t outer = 1, inner = 1, n = sh.d[a];
    for (int d = 0; d < sh.nd; d++) {
        if (d < a) outer *= sh.d[d];
        else if (d > a) inner *= sh.d[d];
    }
    int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nth = (int64_t)gridDim.x * blockDim.x;
    if (inner == 1) {
        int lane = threadIdx.x & 31;
        for (int64_t row = tid >> 5; row < outer; row += nth >> 5) {
            const T *xr = x + row * n;
            T *yr = y + row * n;
            W carry = 0;
            for (int64_t c0 = 0; c0 < n; c0 += 32) {
                int64_t t = c0 + lane, i = rev ? n - 1 - t : t;
                W v = t < n ? ldw<W>(xr, i) : (W)0, inc = v;
                for (int o = 1; o < 32; o <<= 1) {
                    W u = __shfl_up_sync(RD_FULL, inc, o);
                    if (lane >= o) inc += u;
                }
                W ex = __shfl_up_sync(RD_FULL, inc, 1);
                if (lane == 0) ex = 0;
                if (t < n) stw(yr, i, carry + (excl ? ex : inc));
                carry += __shfl_sync(RD_FULL, inc, 31);
            }
        }
        return;
    }
    for (int64_t l = tid; l < outer * inner; l += nth) {
        int64_t o = l / inner, j = l - o * inner;
        const T *xc = x + o * n * inner + j;
        T *yc = y + o * n * inner + j;
        W acc = 0;
        for (int64_t t = 0; t < n; t++) {
            int64_t i = (rev ? n - 1 - t : t) * inner;
            W v = ldw<W>(xc, i);
            if (excl) stw(yc, i, acc), acc += v;
            else acc += v, stw(yc, i, acc);
        }
    }
}

template <typename T, typename W> static eng_status cumsum_launch(cudaStream_t s, krn_call *c, const krn_cumsum_params *p) {
    const eng_tensor *x = &c->in[0];
    int64_t nx = eng_tensor_numel(x);
    cumsum_kernel<T, W><<<cuda_grid(nx, RD_THREADS), RD_THREADS, 0, s>>>((const T *)x->data, (T *)c->out[0].data, rd_dims_of(x->dims, x->ndim),
                                                                       c->in[1].data, c->in[1].dtype == ENG_DTYPE_I64, p->exclusive,
                                                                       p->reverse);
    CUDA_LAUNCHED("cumsum");
    return ENG_STATUS_OK;
}

static int cumsum_supports(const krn_call *c) {
    if (!c->params || c->nin < 2 || c->nout < 1 || !rd_is_index(c->in[1].dtype)) return 0;
    return rd_numeric(c->in[0].dtype) && c->out[0].dtype == c->in[0].dtype && c->in[0].ndim >= 1;
}

static eng_status cumsum_exec(krn_call *c) {
    const krn_cumsum_params *p = (const krn_cumsum_params *)c->params;
    const eng_tensor *x = &c->in[0];
    if (eng_tensor_numel(x) == 0) return ENG_STATUS_OK;
    cudaStream_t s = CUDA_CTX(c)->stream;
    switch (x->dtype) {
    case ENG_DTYPE_F32: return cumsum_launch<float, float>(s, c, p);
    case ENG_DTYPE_F16: return cumsum_launch<__half, float>(s, c, p);
    case ENG_DTYPE_BF16: return cumsum_launch<__nv_bfloat16, float>(s, c, p);
    case ENG_DTYPE_F64: return cumsum_launch<double, double>(s, c, p);
    case ENG_DTYPE_I32: return cumsum_launch<int32_t, int64_t>(s, c, p);
    case ENG_DTYPE_I64: return cumsum_launch<int64_t, int64_t>(s, c, p);
    default: return eng_err(ENG_STATUS_UNSUPPORTED, "cuda cumsum: dtype %s", eng_dtype_name(x->dtype));
    }
}

#include "cuda-reduce-norm.h"
#include "cuda-reduce-grad.h"

/* Reduced precision: softmax / layernorm read and write bf16 / f16 activations natively (fp32 inside). */
static int rd_io_ok(const krn_call *c, eng_dtype dt) {
    if (dt != ENG_DTYPE_BF16 && dt != ENG_DTYPE_F16) return 0;
    for (int i = 0; i < c->nin; i++) {
        eng_dtype t = c->in[i].dtype;
        if (t != ENG_DTYPE_UNDEFINED && t != ENG_DTYPE_F32 && t != dt) return 0;
    }
    for (int i = 0; i < c->nout; i++) {
        eng_dtype t = c->out[i].dtype;
        if (t != ENG_DTYPE_UNDEFINED && t != ENG_DTYPE_F32 && t != dt) return 0;
    }
    return 2;
}

extern "C" const krn_kernel krn_cuda_reduce_kernels[] = {
    {.name = "reduce", .init = NULL, .exec = reduce_exec, .free_state = NULL, .describe = NULL, .compute_ok = NULL, .io_ok = NULL,
     .supports = reduce_supports},
    {.name = "argreduce", .init = NULL, .exec = argreduce_exec, .free_state = NULL, .describe = NULL, .compute_ok = NULL,
     .io_ok = NULL, .supports = argreduce_supports},
    {.name = "topk", .init = NULL, .exec = topk_exec, .free_state = NULL, .describe = NULL, .compute_ok = NULL, .io_ok = NULL,
     .supports = topk_supports},
    {.name = "cumsum", .init = NULL, .exec = cumsum_exec, .free_state = NULL, .describe = NULL, .compute_ok = NULL, .io_ok = NULL,
     .supports = cumsum_supports},
    {.name = "softmax", .init = NULL, .exec = softmax_exec, .free_state = NULL, .describe = NULL, .compute_ok = NULL,
     .io_ok = rd_io_ok, .supports = softmax_supports},
    {.name = "layernorm", .init = NULL, .exec = layernorm_exec, .free_state = NULL, .describe = NULL, .compute_ok = NULL,
     .io_ok = rd_io_ok, .supports = layernorm_supports},
    {.name = "instnorm", .init = NULL, .exec = instnorm_exec, .free_state = NULL, .describe = NULL, .compute_ok = NULL,
     .io_ok = NULL, .supports = instnorm_supports},
    {.name = "mvn", .init = NULL, .exec = mvn_exec, .free_state = NULL, .describe = NULL, .compute_ok = NULL, .io_ok = NULL,
     .supports = mvn_supports},
    {.name = "loss", .init = loss_init, .exec = loss_exec, .free_state = loss_free, .describe = NULL, .compute_ok = NULL,
     .io_ok = NULL, .supports = loss_supports, .check = loss_check},
    {.name = "grad_loss", .init = NULL, .exec = grad_loss_exec, .free_state = NULL, .describe = NULL, .compute_ok = NULL,
     .io_ok = NULL, .supports = grad_loss_supports},
    {.name = "grad_softmax", .init = NULL, .exec = grad_softmax_exec, .free_state = NULL, .describe = NULL, .compute_ok = NULL,
     .io_ok = NULL, .supports = grad_softmax_supports},
    {.name = "grad_layernorm", .init = NULL, .exec = grad_layernorm_exec, .free_state = NULL, .describe = NULL,
     .compute_ok = NULL, .io_ok = NULL, .supports = grad_layernorm_supports},
    {.name = "grad_reduce", .init = NULL, .exec = grad_reduce_exec, .free_state = NULL, .describe = NULL, .compute_ok = NULL,
     .io_ok = NULL, .supports = grad_reduce_supports},
    {.name = "grad_reduce_to_shape", .init = NULL, .exec = grad_rts_exec, .free_state = NULL, .describe = NULL,
     .compute_ok = NULL, .io_ok = NULL, .supports = grad_rts_supports},
    {.name = "grad_fill", .init = NULL, .exec = grad_fill_exec, .free_state = NULL, .describe = NULL, .compute_ok = NULL,
     .io_ok = NULL, .supports = grad_fill_supports},
    {.name = NULL},
};
