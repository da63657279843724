/* cuda-tensor.cu - CUDA kernels of the "tensor" family (krn-tensor.h) and the slice / gather / concat gradients
 * (krn-grad.h): the same names, params, inputs and results as kernels/cpu/tensor*.c and grad.c.
 *
 * Data movement is by element size (1, 2, 4, 8 bytes), so every dtype the CPU kernels move works: a strided view
 * (dims merged as krn_cpu_strided_copy does, then widened to 16/8/4/2-byte units where the innermost run is
 * contiguous and aligned), a tiled shared-memory transpose when the innermost output axis is not the innermost
 * input axis, and a batched row copy for Concat / Split. Element indices are 64-bit; index decompositions use a
 * 32-bit multiply-shift divider below 2^31 elements, 64-bit division above (cuda-tensor-impl.h).
 *
 * Index errors: the CPU kernels fail with INVALID_ARGUMENT naming an out-of-range index. A queued device kernel
 * cannot, so the index-driven kernels (gather, gather_elements, gather_nd, scatter_elements, scatter_nd,
 * reverse_sequence, grad_gather) keep a device error record (ts_err) in their state, made in init; every exec
 * clears it, and a kernel that meets a bad index records the first one and never reads or writes through it.
 * krn_cuda_tensor_check (below) turns the record into the CPU kernel's error; the engine must call it after the
 * plan's sync (there is no hook for it in krn_kernel yet). Outputs are unspecified after such an error, as on the
 * CPU.
 *
 * Ordering: ScatterElements / ScatterND with reduction "none" and duplicate indices keep an arbitrary one of the
 * updates (ONNX leaves it undefined; the CPU keeps the last). Reductions and GatherGrad's scatter-add use atomics,
 * so float sums over duplicate indices are not bit-reproducible run to run.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-tensor-impl.h"
#include "../krn-transpose-view.h"

/* ---- state ---- */

typedef enum { TS_ERR_INDEX = 0, TS_ERR_SEQLEN = 1, TS_ERR_GRAD_GATHER = 2 } ts_err_kind;

typedef struct ts_state {
    int device;
    ts_err *err;     /* device error record (index kernels) */
    void *dbuf;      /* device: Resize taps, Constant value */
    void *hbuf;      /* host source of dbuf's upload, kept until free_state */
    const char *what;
    ts_err_kind kind;
} ts_state;

static void ts_free_state(void *s) {
    ts_state *st = (ts_state *)s;
    if (!st) return;
    if (st->err) cuda_mem_free(st->device, st->err);
    if (st->dbuf) cuda_mem_free(st->device, st->dbuf);
    free(st->hbuf);
    free(st);
}

static eng_status ts_state_new(krn_call *c, const char *what, ts_err_kind kind, int with_err, ts_state **out) {
    cuda_ctx *x = CUDA_CTX(c);
    ts_state *st = (ts_state *)calloc(1, sizeof *st);
    if (!st) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "cuda %s: state", what);
    st->device = x->device;
    st->what = what;
    st->kind = kind;
    if (with_err) {
        eng_status s = cuda_mem_alloc(x->device, sizeof(ts_err), (void **)&st->err);
        if (s != ENG_STATUS_OK) {
            free(st);
            return s;
        }
        cudaError_t e = cudaMemsetAsync(st->err, 0, sizeof(ts_err), x->stream);
        if (e != cudaSuccess) {
            ts_free_state(st);
            return CUDA_ERR(what, e);
        }
    }
    c->state = st;
    *out = st;
    return ENG_STATUS_OK;
}

static eng_status ts_init_index(krn_call *c, const char *what, ts_err_kind kind) {
    ts_state *st;
    return ts_state_new(c, what, kind, 1, &st);
}
static eng_status ts_init_gather(krn_call *c) { return ts_init_index(c, "gather", TS_ERR_INDEX); }
static eng_status ts_init_gather_elements(krn_call *c) { return ts_init_index(c, "gather_elements", TS_ERR_INDEX); }
static eng_status ts_init_gather_nd(krn_call *c) { return ts_init_index(c, "gather_nd", TS_ERR_INDEX); }
static eng_status ts_init_scatter_elements(krn_call *c) { return ts_init_index(c, "scatter_elements", TS_ERR_INDEX); }
static eng_status ts_init_scatter_nd(krn_call *c) { return ts_init_index(c, "scatter_nd", TS_ERR_INDEX); }
static eng_status ts_init_revseq(krn_call *c) { return ts_init_index(c, "reverse_sequence", TS_ERR_SEQLEN); }
static eng_status ts_init_grad_gather(krn_call *c) { return ts_init_index(c, "grad_gather", TS_ERR_GRAD_GATHER); }

/* The error record of an index kernel, cleared on ctx's stream. */
static eng_status ts_err_begin(krn_call *c, ts_err **out) {
    ts_state *st = (ts_state *)c->state;
    if (!st || !st->err) return eng_err(ENG_STATUS_INTERNAL, "cuda tensor kernel: exec without init's state");
    CUDA_TRY(st->what, cudaMemsetAsync(st->err, 0, sizeof(ts_err), CUDA_CTX(c)->stream));
    *out = st->err;
    return ENG_STATUS_OK;
}

/* krn_kernel.check of the index kernels, called by the planner after the run's sync (it reads device memory): OK,
 * or the CPU kernel's INVALID_ARGUMENT naming the out-of-range index the last exec met. */
extern "C" eng_status krn_cuda_tensor_check(const krn_call *c) {
    const ts_state *st = (const ts_state *)c->state;
    if (!st || !st->err) return ENG_STATUS_OK;
    ts_err e;
    CUDA_TRY(st->what, cudaMemcpy(&e, st->err, sizeof e, cudaMemcpyDeviceToHost));
    if (!e.flag) return ENG_STATUS_OK;
    if (st->kind == TS_ERR_SEQLEN)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT,
                       "input 'sequence_lens': value %lld at position %lld is out of range [0, %lld]", e.value, e.pos,
                       e.n);
    if (st->kind == TS_ERR_GRAD_GATHER)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "indices[%lld] = %lld is out of range for axis size %lld", e.pos,
                       e.value, e.n);
    return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'indices': index %lld at position %lld is out of range [%lld, %lld)",
                   e.value, e.pos, -e.n, e.n);
}

/* ---- common host helpers ---- */

static inline int ts_es_ok(size_t es) { return es == 1 || es == 2 || es == 4 || es == 8; }
static inline int ts_idx_ok(eng_dtype dt) { return dt == ENG_DTYPE_I32 || dt == ENG_DTYPE_I64; }
static inline int ts_aligned(const void *p, size_t w) { return ((uintptr_t)p % w) == 0; }

static void ts_strides(const int64_t *dims, int n, int64_t *st) {
    int64_t s = 1;
    for (int i = n - 1; i >= 0; i--) {
        st[i] = s;
        s *= dims[i];
    }
}

/* Largest unit in {16, 8, 4, 2, 1} dividing every value of v[n] (byte counts and addresses). */
static size_t ts_unit(const uint64_t *v, int n) {
    for (size_t w = 16; w > 1; w /= 2) {
        int ok = 1;
        for (int i = 0; ok && i < n; i++) ok = v[i] % w == 0;
        if (ok) return w;
    }
    return 1;
}

/* Run the statements given with T = an unsigned type of `u` bytes (1, 2, 4, 8, 16). */
#define TS_BY_UNIT(u, ...)                                                                                        \
    do {                                                                                                           \
        switch (u) {                                                                                               \
        case 1: { typedef uint8_t T; __VA_ARGS__; } break;                                                                \
        case 2: { typedef uint16_t T; __VA_ARGS__; } break;                                                               \
        case 4: { typedef uint32_t T; __VA_ARGS__; } break;                                                               \
        case 8: { typedef unsigned long long T; __VA_ARGS__; } break;                                                     \
        case 16: { typedef uint4 T; __VA_ARGS__; } break;                                                                 \
        default: return eng_err(ENG_STATUS_INTERNAL, "cuda tensor: unit of %zu bytes", (size_t)(u));             \
        }                                                                                                          \
    } while (0)

/* The same for element sizes (1, 2, 4, 8). */
#define TS_BY_ELEM(es, ...)                                                                                        \
    do {                                                                                                           \
        switch (es) {                                                                                              \
        case 1: { typedef uint8_t T; __VA_ARGS__; } break;                                                         \
        case 2: { typedef uint16_t T; __VA_ARGS__; } break;                                                        \
        case 4: { typedef uint32_t T; __VA_ARGS__; } break;                                                        \
        case 8: { typedef unsigned long long T; __VA_ARGS__; } break;                                              \
        default: return eng_err(ENG_STATUS_INTERNAL, "cuda tensor: element of %zu bytes", (size_t)(es));          \
        }                                                                                                          \
    } while (0)

#define TS_GRID_STRIDE(i, n)                                                                                       \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

/* ---- strided view copy ---- */

struct ts_view {
    int n;             /* dims, innermost last, n >= 1 */
    ts_div d[TS_MAXD];
    int64_t s[TS_MAXD]; /* stride of the strided side, in units (may be 0 or negative) */
};

template <bool BIG> __device__ __forceinline__ int64_t ts_view_off(const ts_view &v, int64_t i) {
    int64_t off = 0;
#pragma unroll
    for (int k = TS_MAXD - 1; k > 0; k--)
        if (k < v.n) {
            int64_t q = ts_q<BIG>(i, v.d[k]);
            off += (i - q * v.d[k].d) * v.s[k];
            i = q;
        }
    return off + i * v.s[0];
}

/* SCATTER false: dst dense <- src strided; true: dst strided <- src dense. */
template <typename T, bool BIG, bool SCATTER>
__global__ void ts_strided_kernel(T *__restrict__ dst, const T *__restrict__ src, const __grid_constant__ ts_view v,
                                  int64_t total) {
    TS_GRID_STRIDE(i, total) {
        int64_t o = ts_view_off<BIG>(v, i);
        if constexpr (SCATTER) dst[o] = src[i];
        else dst[i] = src[o];
    }
}

/* dst <- src (scatter 0) or dst -> strided (scatter 1) over dims[ndim] with element strides of the strided side,
 * which starts at the pointer given. Size-1 dims are dropped and adjacent dims merged as on the CPU. */
static eng_status ts_strided(cuda_ctx *x, void *dst, const void *src, size_t es, int ndim, const int64_t *dims,
                             const int64_t *strides, int scatter, const char *what) {
    int64_t d[TS_MAXD], s[TS_MAXD], total = 1;
    int n = 0;
    if (ndim > TS_MAXD) return eng_err(ENG_STATUS_INTERNAL, "cuda %s: view of %d dims exceeds %d", what, ndim, TS_MAXD);
    for (int i = 0; i < ndim; i++) {
        total *= dims[i];
        if (dims[i] == 1) continue;
        if (n > 0 && s[n - 1] == strides[i] * dims[i]) {
            d[n - 1] *= dims[i];
            s[n - 1] = strides[i];
        } else {
            d[n] = dims[i];
            s[n] = strides[i];
            n++;
        }
    }
    if (total <= 0) return ENG_STATUS_OK;
    if (n == 0 || (n == 1 && s[0] == 1)) {
        CUDA_TRY(what, cudaMemcpyAsync(dst, src, (size_t)total * es, cudaMemcpyDeviceToDevice, x->stream));
        return ENG_STATUS_OK;
    }
    size_t u = es;
    if (s[n - 1] == 1)
        for (size_t w = 16; w > es; w /= 2) {
            int64_t g = (int64_t)(w / es);
            int ok = d[n - 1] % g == 0 && ts_aligned(dst, w) && ts_aligned(src, w);
            for (int k = 0; ok && k < n - 1; k++) ok = s[k] % g == 0;
            if (!ok) continue;
            u = w;
            d[n - 1] /= g;
            total /= g;
            for (int k = 0; k < n - 1; k++) s[k] /= g;
            break;
        }
    ts_view v;
    memset(&v, 0, sizeof v);
    v.n = n;
    for (int k = 0; k < n; k++) {
        v.d[k] = ts_div_make(d[k]);
        v.s[k] = s[k];
    }
    const int big = total >= TS_SMALL;
    const unsigned g = cuda_grid(total, TS_THREADS);
    TS_BY_UNIT(u, {
        if (big) {
            if (scatter) ts_strided_kernel<T, true, true><<<g, TS_THREADS, 0, x->stream>>>((T *)dst, (const T *)src, v, total);
            else ts_strided_kernel<T, true, false><<<g, TS_THREADS, 0, x->stream>>>((T *)dst, (const T *)src, v, total);
        } else {
            if (scatter) ts_strided_kernel<T, false, true><<<g, TS_THREADS, 0, x->stream>>>((T *)dst, (const T *)src, v, total);
            else ts_strided_kernel<T, false, false><<<g, TS_THREADS, 0, x->stream>>>((T *)dst, (const T *)src, v, total);
        }
    });
    CUDA_LAUNCHED(what);
    return ENG_STATUS_OK;
}

/* ---- transpose ---- */

#define TS_TILE 32
#define TS_TILE_ROWS 8

/* Output = `other` dims (outer) x R x ... x C where R is the source-innermost axis (source stride 1) and C the
 * output-innermost one (output stride 1). */
struct ts_tile_args {
    int no;
    int64_t od[TS_MAXD], ss[TS_MAXD], ds[TS_MAXD]; /* other dims: size, source stride, output stride */
    int64_t R, C, sa, ob;                          /* sa: source stride of C; ob: output stride of R */
    int64_t nbr, nbc, ntile;
};

template <typename T>
__global__ void ts_transpose_tiled_kernel(T *__restrict__ dst, const T *__restrict__ src,
                                          const __grid_constant__ ts_tile_args a) {
    __shared__ T tile[TS_TILE][TS_TILE + 1];
    for (int64_t t = blockIdx.x; t < a.ntile; t += gridDim.x) {
        int64_t tc = t % a.nbc, rest = t / a.nbc, tr = rest % a.nbr, o = rest / a.nbr, soff = 0, doff = 0;
#pragma unroll
        for (int k = TS_MAXD - 1; k >= 0; k--)
            if (k < a.no) {
                int64_t q = o / a.od[k], i = o - q * a.od[k];
                soff += i * a.ss[k];
                doff += i * a.ds[k];
                o = q;
            }
        const int64_t r0 = tr * TS_TILE, c0 = tc * TS_TILE;
        /* load: consecutive threads read consecutive r (source-contiguous) */
        for (int j = threadIdx.y; j < TS_TILE; j += TS_TILE_ROWS) {
            int64_t r = r0 + threadIdx.x, cc = c0 + j;
            if (r < a.R && cc < a.C) tile[j][threadIdx.x] = src[soff + cc * a.sa + r];
        }
        __syncthreads();
        /* store: consecutive threads write consecutive c (output-contiguous) */
        for (int j = threadIdx.y; j < TS_TILE; j += TS_TILE_ROWS) {
            int64_t r = r0 + j, cc = c0 + threadIdx.x;
            if (r < a.R && cc < a.C) dst[doff + r * a.ob + cc] = tile[threadIdx.x][j];
        }
        __syncthreads();
    }
}

/* krn_cpu_transpose on the device: dst axis k is src axis perm[k]; dims are src's (ndim <= TS_MAXD). */
static eng_status ts_transpose(cuda_ctx *x, const void *src, void *dst, size_t es, int ndim, const int64_t *dims,
                               const int *perm, const char *what) {
    krn_transpose_view v;
    ENG_TRY(krn_transpose_view_make(ndim, dims, perm, TS_MAXD, what, &v));
    if (v.total <= 0) return ENG_STATUS_OK;
    if (v.ng == 0) {
        CUDA_TRY(what, cudaMemcpyAsync(dst, src, es, cudaMemcpyDeviceToDevice, x->stream));
        return ENG_STATUS_OK;
    }
    const int ng = v.ng, b = v.b;
    const int64_t *od = v.od, *os = v.os, total = v.total;
    /* innermost axis kept, or a skinny pair (a tile would idle most threads): the strided view, whose reads stay
     * within a few cache lines per warp */
    if (b == ng - 1 || od[b] < 16 || od[ng - 1] < 16) return ts_strided(x, dst, src, es, ng, od, os, 0, what);
    ts_tile_args a;
    memset(&a, 0, sizeof a);
    int64_t ostr[TS_MAXD];
    ts_strides(od, ng, ostr);
    for (int k = 0; k < ng - 1; k++)
        if (k != b) {
            a.od[a.no] = od[k];
            a.ss[a.no] = os[k];
            a.ds[a.no] = ostr[k];
            a.no++;
        }
    int64_t outer = total / (od[b] * od[ng - 1]);
    a.R = od[b];
    a.C = od[ng - 1];
    a.sa = os[ng - 1];
    a.ob = ostr[b];
    a.nbr = (a.R + TS_TILE - 1) / TS_TILE;
    a.nbc = (a.C + TS_TILE - 1) / TS_TILE;
    a.ntile = outer * a.nbr * a.nbc;
    const unsigned g = a.ntile < 65535LL * 32 ? (unsigned)a.ntile : 65535u * 32;
    const dim3 blk(TS_TILE, TS_TILE_ROWS);
    switch (es) {
    case 1: ts_transpose_tiled_kernel<uint8_t><<<g, blk, 0, x->stream>>>((uint8_t *)dst, (const uint8_t *)src, a); break;
    case 2: ts_transpose_tiled_kernel<uint16_t><<<g, blk, 0, x->stream>>>((uint16_t *)dst, (const uint16_t *)src, a); break;
    case 4: ts_transpose_tiled_kernel<uint32_t><<<g, blk, 0, x->stream>>>((uint32_t *)dst, (const uint32_t *)src, a); break;
    case 8:
        ts_transpose_tiled_kernel<unsigned long long>
            <<<g, blk, 0, x->stream>>>((unsigned long long *)dst, (const unsigned long long *)src, a);
        break;
    default: return eng_err(ENG_STATUS_INTERNAL, "cuda %s: element size %zu", what, es);
    }
    CUDA_LAUNCHED(what);
    return ENG_STATUS_OK;
}

static int ts_transpose_supports(const krn_call *c) {
    const krn_transpose_params *p = (const krn_transpose_params *)c->params;
    const eng_tensor *x = &c->in[0];
    if (!p || !ts_es_ok(eng_dtype_size(x->dtype)) || x->ndim > TS_MAXD) return 0;
    unsigned seen = 0;
    for (int k = 0; k < x->ndim; k++) {
        if (p->perm[k] < 0 || p->perm[k] >= x->ndim || (seen >> p->perm[k] & 1u)) return 0;
        seen |= 1u << p->perm[k];
    }
    return 1;
}

static eng_status ts_transpose_exec(krn_call *c) {
    const krn_transpose_params *p = (const krn_transpose_params *)c->params;
    const eng_tensor *x = &c->in[0];
    return ts_transpose(CUDA_CTX(c), x->data, c->out[0].data, eng_dtype_size(x->dtype), x->ndim, x->dims, p->perm,
                        "transpose");
}

/* DepthToSpace / SpaceToDepth as the CPU's 6-D transpose of the NCHW input. */
static int ts_depth_space_supports(const krn_call *c) {
    const krn_depth_space_params *p = (const krn_depth_space_params *)c->params;
    return p && c->in[0].ndim == 4 && p->blocksize > 0 && p->mode >= 0 && p->mode <= 2 &&
           ts_es_ok(eng_dtype_size(c->in[0].dtype));
}

static eng_status ts_depth_space_exec(krn_call *c) {
    const krn_depth_space_params *p = (const krn_depth_space_params *)c->params;
    const eng_tensor *x = &c->in[0];
    int64_t N = x->dims[0], C = x->dims[1], H = x->dims[2], W = x->dims[3], b = p->blocksize;
    int64_t d[6];
    int perm[6];
    if (p->mode == 0) { /* DCR: [N, b, b, C/b^2, H, W] -> [N, C/b^2, H, b, W, b] */
        const int64_t v[6] = {N, b, b, C / (b * b), H, W};
        const int q[6] = {0, 3, 4, 1, 5, 2};
        memcpy(d, v, sizeof d);
        memcpy(perm, q, sizeof perm);
    } else if (p->mode == 1) { /* CRD: [N, C/b^2, b, b, H, W] -> [N, C/b^2, H, b, W, b] */
        const int64_t v[6] = {N, C / (b * b), b, b, H, W};
        const int q[6] = {0, 1, 4, 2, 5, 3};
        memcpy(d, v, sizeof d);
        memcpy(perm, q, sizeof perm);
    } else { /* SpaceToDepth: [N, C, H/b, b, W/b, b] -> [N, b, b, C, H/b, W/b] */
        const int64_t v[6] = {N, C, H / b, b, W / b, b};
        const int q[6] = {0, 3, 5, 1, 2, 4};
        memcpy(d, v, sizeof d);
        memcpy(perm, q, sizeof perm);
    }
    return ts_transpose(CUDA_CTX(c), x->data, c->out[0].data, eng_dtype_size(x->dtype), 6, d, perm, "depth_space");
}

/* ---- batched row copies: Concat, Split, ConcatGrad ---- */

#define TS_ROWS_MAX 32

struct ts_rows_part {
    char *dst;
    const char *src;
    int64_t dpitch, spitch; /* units between rows */
    ts_div w;               /* row width, units */
};

struct ts_rows_args {
    int64_t outer;
    ts_rows_part p[TS_ROWS_MAX];
};

/* blockIdx.y picks the part; each copies `outer` rows of w units. */
template <typename T, bool BIG> __global__ void ts_rows_kernel(const __grid_constant__ ts_rows_args a) {
    const ts_rows_part &p = a.p[blockIdx.y];
    const int64_t total = a.outer * p.w.d;
    T *dst = (T *)p.dst;
    const T *src = (const T *)p.src;
    TS_GRID_STRIDE(i, total) {
        int64_t k = ts_q<BIG>(i, p.w), u = i - k * p.w.d;
        dst[k * p.dpitch + u] = src[k * p.spitch + u];
    }
}

typedef struct ts_row_copy {
    char *dst;
    const char *src;
    int64_t dpitch, spitch, width; /* bytes */
} ts_row_copy;

/* For each part: outer rows of width bytes, dst + k * dpitch <- src + k * spitch. Parts with no width or no dst
 * are skipped. One launch per TS_ROWS_MAX parts. */
static eng_status ts_rows(cuda_ctx *x, const ts_row_copy *parts, int n, int64_t outer, const char *what) {
    if (outer <= 0) return ENG_STATUS_OK;
    uint64_t v[4 * TS_ROWS_MAX];
    for (int base = 0; base < n; base += TS_ROWS_MAX) {
        int m = 0, nv = 0;
        int64_t maxw = 0;
        const ts_row_copy *sel[TS_ROWS_MAX];
        for (int i = base; i < n && i < base + TS_ROWS_MAX; i++) {
            const ts_row_copy *q = &parts[i];
            if (!q->dst || q->width <= 0) continue;
            sel[m++] = q;
            v[nv++] = (uint64_t)(uintptr_t)q->dst;
            v[nv++] = (uint64_t)(uintptr_t)q->src;
            v[nv++] = (uint64_t)q->width;
            v[nv++] = outer > 1 ? (uint64_t)q->dpitch | (uint64_t)q->spitch : 0;
            if (q->width > maxw) maxw = q->width;
        }
        if (m == 0) continue;
        const size_t u = ts_unit(v, nv);
        ts_rows_args a;
        memset(&a, 0, sizeof a);
        a.outer = outer;
        for (int j = 0; j < m; j++) {
            a.p[j].dst = sel[j]->dst;
            a.p[j].src = sel[j]->src;
            a.p[j].dpitch = sel[j]->dpitch / (int64_t)u;
            a.p[j].spitch = sel[j]->spitch / (int64_t)u;
            a.p[j].w = ts_div_make(sel[j]->width / (int64_t)u);
        }
        const int64_t most = outer * (maxw / (int64_t)u);
        const int big = most >= TS_SMALL;
        const dim3 grid(cuda_grid(most, TS_THREADS), (unsigned)m);
        TS_BY_UNIT(u, {
            if (big) ts_rows_kernel<T, true><<<grid, TS_THREADS, 0, x->stream>>>(a);
            else ts_rows_kernel<T, false><<<grid, TS_THREADS, 0, x->stream>>>(a);
        });
        CUDA_LAUNCHED(what);
    }
    return ENG_STATUS_OK;
}

static int ts_axis_supports(const krn_call *c) {
    const krn_axis_params *p = (const krn_axis_params *)c->params;
    return p && p->axis >= 0 && ts_es_ok(eng_dtype_size(c->in[0].dtype));
}

static eng_status ts_concat_exec(krn_call *c) {
    const krn_axis_params *p = (const krn_axis_params *)c->params;
    eng_tensor *o = &c->out[0];
    const int64_t es = (int64_t)eng_dtype_size(o->dtype);
    int64_t outer = 1, orow = 0, boff = 0;
    for (int i = 0; i < p->axis; i++) outer *= o->dims[i];
    for (int i = 0; i < c->nin; i++) orow += es * eng_shape_numel(c->in[i].dims + p->axis, c->in[i].ndim - p->axis);
    ts_row_copy *parts = (ts_row_copy *)calloc((size_t)(c->nin > 0 ? c->nin : 1), sizeof *parts);
    if (!parts) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "concat: %d parts", c->nin);
    for (int i = 0; i < c->nin; i++) {
        const eng_tensor *x = &c->in[i];
        int64_t r = es * eng_shape_numel(x->dims + p->axis, x->ndim - p->axis);
        parts[i] = ts_row_copy{(char *)o->data + boff, (const char *)x->data, orow, r, r};
        if (!x->data) parts[i].width = 0;
        boff += r;
    }
    eng_status st = ts_rows(CUDA_CTX(c), parts, c->nin, outer, "concat");
    free(parts);
    return st;
}

/* Split and ConcatGrad: output j takes its columns of every row of the input (absent outputs are skipped). */
static eng_status ts_split_rows(krn_call *c, const char *what) {
    const krn_axis_params *p = (const krn_axis_params *)c->params;
    const eng_tensor *x = &c->in[0];
    const int64_t es = (int64_t)eng_dtype_size(x->dtype);
    int64_t outer = 1, irow = es * eng_shape_numel(x->dims + p->axis, x->ndim - p->axis), boff = 0;
    for (int i = 0; i < p->axis; i++) outer *= x->dims[i];
    ts_row_copy *parts = (ts_row_copy *)calloc((size_t)(c->nout > 0 ? c->nout : 1), sizeof *parts);
    if (!parts) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: %d parts", what, c->nout);
    for (int j = 0; j < c->nout; j++) {
        eng_tensor *o = &c->out[j];
        int64_t r = es * eng_shape_numel(o->dims + p->axis, o->ndim - p->axis);
        parts[j] = ts_row_copy{(char *)o->data, (const char *)x->data + boff, r, irow, r};
        boff += r;
    }
    eng_status st = ts_rows(CUDA_CTX(c), parts, c->nout, outer, what);
    free(parts);
    return st;
}

static eng_status ts_split_exec(krn_call *c) { return ts_split_rows(c, "split"); }
static eng_status ts_grad_concat_exec(krn_call *c) { return ts_split_rows(c, "grad_concat"); }

static int ts_grad_concat_supports(const krn_call *c) {
    const krn_axis_params *p = (const krn_axis_params *)c->params;
    if (!p || p->axis < 0 || c->in[0].dtype != ENG_DTYPE_F32) return 0;
    for (int j = 0; j < c->nout; j++)
        if (c->out[j].dtype != ENG_DTYPE_F32 && c->out[j].dtype != ENG_DTYPE_UNDEFINED) return 0;
    return 1;
}

/* ---- Slice, SliceGrad ---- */

static int ts_slice_supports(const krn_call *c) {
    return c->params && c->in[0].ndim <= TS_MAXD && ts_es_ok(eng_dtype_size(c->in[0].dtype));
}

static eng_status ts_slice_exec(krn_call *c) {
    const krn_slice_params *p = (const krn_slice_params *)c->params;
    const eng_tensor *x = &c->in[0];
    eng_tensor *o = &c->out[0];
    size_t es = eng_dtype_size(x->dtype);
    if (eng_tensor_numel(o) <= 0) return ENG_STATUS_OK;
    int64_t st[TS_MAXD], ss[TS_MAXD], base = 0;
    ts_strides(x->dims, x->ndim, st);
    for (int i = 0; i < x->ndim; i++) {
        base += p->starts[i] * st[i];
        ss[i] = p->steps[i] * st[i];
    }
    return ts_strided(CUDA_CTX(c), o->data, (const char *)x->data + base * (int64_t)es, es, o->ndim, o->dims, ss, 0,
                      "slice");
}

static int ts_grad_slice_supports(const krn_call *c) {
    return c->params && c->out[0].ndim <= TS_MAXD && c->in[0].dtype == ENG_DTYPE_F32 &&
           c->out[0].dtype == ENG_DTYPE_F32 && c->in[0].ndim == c->out[0].ndim;
}

/* zeros, then dy written at the sliced positions */
static eng_status ts_grad_slice_exec(krn_call *c) {
    const krn_slice_params *p = (const krn_slice_params *)c->params;
    const eng_tensor *dy = &c->in[0];
    eng_tensor *dx = &c->out[0];
    cuda_ctx *x = CUDA_CTX(c);
    size_t nb = eng_tensor_nbytes(dx);
    if (nb) CUDA_TRY("grad_slice", cudaMemsetAsync(dx->data, 0, nb, x->stream));
    if (eng_tensor_numel(dy) <= 0) return ENG_STATUS_OK;
    int64_t xs[TS_MAXD], step[TS_MAXD], base = 0;
    ts_strides(dx->dims, dx->ndim, xs);
    for (int d = 0; d < dx->ndim; d++) {
        base += p->starts[d] * xs[d];
        step[d] = p->steps[d] * xs[d];
    }
    return ts_strided(x, (float *)dx->data + base, dy->data, sizeof(float), dy->ndim, dy->dims, step, 1, "grad_slice");
}

/* ---- Gather ---- */

struct ts_gather_args {
    int64_t n, total; /* axis size; output units */
    ts_div inner, ni; /* units per gathered row; number of indices */
    int idx64;
};

template <typename T, bool BIG>
__global__ void ts_gather_kernel(T *__restrict__ dst, const T *__restrict__ src, const void *__restrict__ ind,
                                 const __grid_constant__ ts_gather_args a, ts_err *err) {
    TS_GRID_STRIDE(i, a.total) {
        int64_t q = ts_q<BIG>(i, a.inner), u = i - q * a.inner.d;
        int64_t k = ts_q<BIG>(q, a.ni), j = q - k * a.ni.d;
        int64_t v = ts_idx(ind, a.idx64, j), t = v < 0 ? v + a.n : v;
        if (t < 0 || t >= a.n) {
            ts_err_set(err, v, j, a.n);
            continue;
        }
        dst[i] = src[(k * a.n + t) * a.inner.d + u];
    }
}

static int ts_gather_supports(const krn_call *c) {
    const krn_gather_params *p = (const krn_gather_params *)c->params;
    return p && p->axis >= 0 && p->axis < c->in[0].ndim && ts_es_ok(eng_dtype_size(c->in[0].dtype)) &&
           ts_idx_ok(c->in[1].dtype);
}

static eng_status ts_gather_exec(krn_call *c) {
    const krn_gather_params *p = (const krn_gather_params *)c->params;
    const eng_tensor *x = &c->in[0], *ind = &c->in[1];
    eng_tensor *o = &c->out[0];
    ts_err *err;
    ENG_TRY(ts_err_begin(c, &err));
    const int64_t es = (int64_t)eng_dtype_size(x->dtype), ni = eng_tensor_numel(ind);
    int64_t outer = 1, inner = es;
    for (int i = 0; i < p->axis; i++) outer *= x->dims[i];
    for (int i = p->axis + 1; i < x->ndim; i++) inner *= x->dims[i];
    if (ni == 0 || outer == 0 || inner == 0) return ENG_STATUS_OK;
    const uint64_t v[3] = {(uint64_t)inner, (uint64_t)(uintptr_t)x->data, (uint64_t)(uintptr_t)o->data};
    const size_t u = ts_unit(v, 3);
    ts_gather_args a;
    a.n = x->dims[p->axis];
    a.inner = ts_div_make(inner / (int64_t)u);
    a.ni = ts_div_make(ni);
    a.total = outer * ni * (inner / (int64_t)u);
    a.idx64 = ind->dtype == ENG_DTYPE_I64;
    const int big = a.total >= TS_SMALL;
    const unsigned g = cuda_grid(a.total, TS_THREADS);
    cudaStream_t s = CUDA_CTX(c)->stream;
    TS_BY_UNIT(u, {
        if (big) ts_gather_kernel<T, true><<<g, TS_THREADS, 0, s>>>((T *)o->data, (const T *)x->data, ind->data, a, err);
        else ts_gather_kernel<T, false><<<g, TS_THREADS, 0, s>>>((T *)o->data, (const T *)x->data, ind->data, a, err);
    });
    CUDA_LAUNCHED("gather");
    return ENG_STATUS_OK;
}

/* ---- GatherGrad: zeros + scatter-add of dy along axis (fp32 atomics) ---- */

template <bool BIG>
__global__ void ts_grad_gather_kernel(float *__restrict__ dx, const float *__restrict__ dy, const void *__restrict__ ind,
                                      const __grid_constant__ ts_gather_args a, ts_err *err) {
    TS_GRID_STRIDE(i, a.total) {
        int64_t q = ts_q<BIG>(i, a.inner), u = i - q * a.inner.d;
        int64_t k = ts_q<BIG>(q, a.ni), j = q - k * a.ni.d;
        int64_t v = ts_idx(ind, a.idx64, j), t = v < 0 ? v + a.n : v;
        if (t < 0 || t >= a.n) {
            ts_err_set(err, v, j, a.n);
            continue;
        }
        atomicAdd(&dx[(k * a.n + t) * a.inner.d + u], dy[i]);
    }
}

static int ts_grad_gather_supports(const krn_call *c) {
    const krn_gather_params *p = (const krn_gather_params *)c->params;
    return p && p->axis >= 0 && p->axis < c->out[0].ndim && c->in[0].dtype == ENG_DTYPE_F32 &&
           c->out[0].dtype == ENG_DTYPE_F32 && ts_idx_ok(c->in[1].dtype);
}

static eng_status ts_grad_gather_exec(krn_call *c) {
    const krn_gather_params *p = (const krn_gather_params *)c->params;
    const eng_tensor *dy = &c->in[0], *ind = &c->in[1];
    eng_tensor *dx = &c->out[0];
    cudaStream_t s = CUDA_CTX(c)->stream;
    ts_err *err;
    ENG_TRY(ts_err_begin(c, &err));
    size_t nb = eng_tensor_nbytes(dx);
    if (nb) CUDA_TRY("grad_gather", cudaMemsetAsync(dx->data, 0, nb, s));
    const int ax = p->axis;
    const int64_t outer = eng_shape_numel(dx->dims, ax), inner = eng_shape_numel(dx->dims + ax + 1, dx->ndim - ax - 1);
    const int64_t k = eng_tensor_numel(ind);
    if (outer <= 0 || inner <= 0 || k <= 0) return ENG_STATUS_OK;
    ts_gather_args a;
    a.n = dx->dims[ax];
    a.inner = ts_div_make(inner);
    a.ni = ts_div_make(k);
    a.total = outer * k * inner;
    a.idx64 = ind->dtype == ENG_DTYPE_I64;
    const unsigned g = cuda_grid(a.total, TS_THREADS);
    if (a.total >= TS_SMALL)
        ts_grad_gather_kernel<true><<<g, TS_THREADS, 0, s>>>((float *)dx->data, (const float *)dy->data, ind->data, a, err);
    else ts_grad_gather_kernel<false><<<g, TS_THREADS, 0, s>>>((float *)dx->data, (const float *)dy->data, ind->data, a, err);
    CUDA_LAUNCHED("grad_gather");
    return ENG_STATUS_OK;
}

/* ---- GatherElements, ScatterElements ---- */

struct ts_elem_args {
    int r, axis, idx64, red;
    ts_div id[TS_MAXD];   /* indices' dims */
    int64_t xs[TS_MAXD];  /* data's strides, elements */
    int64_t n, total;     /* data dims[axis]; numel(indices) */
};

/* Offset in data of element e of indices with the axis coordinate replaced by the index; -1 (recorded) when out of
 * range. */
template <bool BIG>
__device__ __forceinline__ int64_t ts_elem_off(const ts_elem_args &a, const void *ind, int64_t e, ts_err *err) {
    int64_t rem = e, off = 0;
#pragma unroll
    for (int d = TS_MAXD - 1; d >= 0; d--)
        if (d < a.r) {
            int64_t q = d > 0 ? ts_q<BIG>(rem, a.id[d]) : 0, i = rem - q * a.id[d].d;
            rem = q;
            if (d == a.axis) {
                int64_t v = ts_idx(ind, a.idx64, e);
                i = v < 0 ? v + a.n : v;
                if (i < 0 || i >= a.n) {
                    ts_err_set(err, v, e, a.n);
                    return -1;
                }
            }
            off += i * a.xs[d];
        }
    return off;
}

template <typename T, bool BIG>
__global__ void ts_gather_elements_kernel(T *__restrict__ dst, const T *__restrict__ src, const void *__restrict__ ind,
                                          const __grid_constant__ ts_elem_args a, ts_err *err) {
    TS_GRID_STRIDE(e, a.total) {
        int64_t off = ts_elem_off<BIG>(a, ind, e, err);
        if (off >= 0) dst[e] = src[off];
    }
}

/* RED false: plain stores (reduction none; S any type of the element's size); true: S is the element's type. */
template <typename S, bool BIG, bool RED>
__global__ void ts_scatter_elements_kernel(S *dst, const S *__restrict__ upd, const void *__restrict__ ind,
                                           const __grid_constant__ ts_elem_args a, ts_err *err) {
    TS_GRID_STRIDE(e, a.total) {
        int64_t off = ts_elem_off<BIG>(a, ind, e, err);
        if (off < 0) continue;
        if constexpr (RED) ts_atomic_red<S>(&dst[off], upd[e], a.red);
        else dst[off] = upd[e];
    }
}

static void ts_elem_args_make(ts_elem_args *a, const eng_tensor *x, const eng_tensor *ind, int axis, int red) {
    memset(a, 0, sizeof *a);
    a->r = ind->ndim;
    a->axis = axis;
    a->idx64 = ind->dtype == ENG_DTYPE_I64;
    a->red = red;
    for (int d = 0; d < ind->ndim; d++) a->id[d] = ts_div_make(ind->dims[d]);
    ts_strides(x->dims, x->ndim, a->xs);
    a->n = x->dims[axis];
    a->total = eng_tensor_numel(ind);
}

static int ts_gather_elements_supports(const krn_call *c) {
    const krn_gather_params *p = (const krn_gather_params *)c->params;
    const eng_tensor *x = &c->in[0], *ind = &c->in[1];
    return p && x->ndim <= TS_MAXD && ind->ndim == x->ndim && p->axis >= 0 && p->axis < x->ndim &&
           ts_es_ok(eng_dtype_size(x->dtype)) && ts_idx_ok(ind->dtype);
}

static eng_status ts_gather_elements_exec(krn_call *c) {
    const krn_gather_params *p = (const krn_gather_params *)c->params;
    const eng_tensor *x = &c->in[0], *ind = &c->in[1];
    eng_tensor *o = &c->out[0];
    ts_err *err;
    ENG_TRY(ts_err_begin(c, &err));
    ts_elem_args a;
    ts_elem_args_make(&a, x, ind, p->axis, KRN_SCATTER_NONE);
    if (a.total <= 0) return ENG_STATUS_OK;
    const int big = a.total >= TS_SMALL;
    const unsigned g = cuda_grid(a.total, TS_THREADS);
    cudaStream_t s = CUDA_CTX(c)->stream;
    TS_BY_ELEM(eng_dtype_size(x->dtype), {
        if (big) ts_gather_elements_kernel<T, true><<<g, TS_THREADS, 0, s>>>((T *)o->data, (const T *)x->data, ind->data, a, err);
        else ts_gather_elements_kernel<T, false><<<g, TS_THREADS, 0, s>>>((T *)o->data, (const T *)x->data, ind->data, a, err);
    });
    CUDA_LAUNCHED("gather_elements");
    return ENG_STATUS_OK;
}

/* Run the statements given with S = the element type of dtype dt (the Scatter reductions). */
#define TS_BY_DTYPE(dt, ...)                                                                                      \
    do {                                                                                                           \
        switch (dt) {                                                                                              \
        case ENG_DTYPE_F32: { typedef float S; __VA_ARGS__; } break;                                                      \
        case ENG_DTYPE_F64: { typedef double S; __VA_ARGS__; } break;                                                     \
        case ENG_DTYPE_F16: { typedef __half S; __VA_ARGS__; } break;                                                     \
        case ENG_DTYPE_BF16: { typedef __nv_bfloat16 S; __VA_ARGS__; } break;                                             \
        case ENG_DTYPE_I8: { typedef int8_t S; __VA_ARGS__; } break;                                                      \
        case ENG_DTYPE_U8: { typedef uint8_t S; __VA_ARGS__; } break;                                                     \
        case ENG_DTYPE_I16: { typedef int16_t S; __VA_ARGS__; } break;                                                    \
        case ENG_DTYPE_U16: { typedef uint16_t S; __VA_ARGS__; } break;                                                   \
        case ENG_DTYPE_I32: { typedef int32_t S; __VA_ARGS__; } break;                                                    \
        case ENG_DTYPE_U32: { typedef uint32_t S; __VA_ARGS__; } break;                                                   \
        case ENG_DTYPE_I64: { typedef long long S; __VA_ARGS__; } break;                                                  \
        case ENG_DTYPE_U64: { typedef unsigned long long S; __VA_ARGS__; } break;                                         \
        case ENG_DTYPE_BOOL: { typedef ts_bool S; __VA_ARGS__; } break;                                                   \
        default: return eng_err(ENG_STATUS_INTERNAL, "cuda scatter: dtype %s", eng_dtype_name(dt));              \
        }                                                                                                          \
    } while (0)

static int ts_red_dtype_ok(eng_dtype dt) {
    switch (dt) {
    case ENG_DTYPE_F32: case ENG_DTYPE_F64: case ENG_DTYPE_F16: case ENG_DTYPE_BF16: case ENG_DTYPE_I8:
    case ENG_DTYPE_U8: case ENG_DTYPE_I16: case ENG_DTYPE_U16: case ENG_DTYPE_I32: case ENG_DTYPE_U32:
    case ENG_DTYPE_I64: case ENG_DTYPE_U64: case ENG_DTYPE_BOOL: return 1;
    default: return 0;
    }
}

static int ts_scatter_dtype_ok(const krn_scatter_params *p, eng_dtype dt) {
    if (!p || p->reduction < KRN_SCATTER_NONE || p->reduction > KRN_SCATTER_MIN) return 0;
    return p->reduction == KRN_SCATTER_NONE ? ts_es_ok(eng_dtype_size(dt)) : ts_red_dtype_ok(dt);
}

static int ts_scatter_elements_supports(const krn_call *c) {
    const krn_scatter_params *p = (const krn_scatter_params *)c->params;
    const eng_tensor *x = &c->in[0], *ind = &c->in[1];
    return p && x->ndim <= TS_MAXD && ind->ndim == x->ndim && p->axis >= 0 && p->axis < x->ndim &&
           c->in[2].dtype == x->dtype && ts_scatter_dtype_ok(p, x->dtype) && ts_idx_ok(ind->dtype);
}

static eng_status ts_scatter_elements_exec(krn_call *c) {
    const krn_scatter_params *p = (const krn_scatter_params *)c->params;
    const eng_tensor *x = &c->in[0], *ind = &c->in[1], *upd = &c->in[2];
    eng_tensor *o = &c->out[0];
    cudaStream_t s = CUDA_CTX(c)->stream;
    ts_err *err;
    ENG_TRY(ts_err_begin(c, &err));
    size_t nb = eng_tensor_nbytes(x);
    if (nb && o->data != x->data)
        CUDA_TRY("scatter_elements", cudaMemcpyAsync(o->data, x->data, nb, cudaMemcpyDeviceToDevice, s));
    ts_elem_args a;
    ts_elem_args_make(&a, x, ind, p->axis, p->reduction);
    if (a.total <= 0) return ENG_STATUS_OK;
    const int big = a.total >= TS_SMALL;
    const unsigned g = cuda_grid(a.total, TS_THREADS);
    if (p->reduction == KRN_SCATTER_NONE) {
        TS_BY_ELEM(eng_dtype_size(x->dtype), {
            if (big) ts_scatter_elements_kernel<T, true, false><<<g, TS_THREADS, 0, s>>>((T *)o->data, (const T *)upd->data, ind->data, a, err);
            else ts_scatter_elements_kernel<T, false, false><<<g, TS_THREADS, 0, s>>>((T *)o->data, (const T *)upd->data, ind->data, a, err);
        });
    } else {
        TS_BY_DTYPE(x->dtype, {
            if (big) ts_scatter_elements_kernel<S, true, true><<<g, TS_THREADS, 0, s>>>((S *)o->data, (const S *)upd->data, ind->data, a, err);
            else ts_scatter_elements_kernel<S, false, true><<<g, TS_THREADS, 0, s>>>((S *)o->data, (const S *)upd->data, ind->data, a, err);
        });
    }
    CUDA_LAUNCHED("scatter_elements");
    return ENG_STATUS_OK;
}

/* ---- GatherND, ScatterND ---- */

struct ts_nd_args {
    int k, red;
    int64_t dn[TS_MAXD]; /* data dims an index tuple addresses */
    int64_t ds[TS_MAXD]; /* their strides, in the kernel's units */
    ts_div slice;        /* units per addressed slice */
    ts_div nidx;         /* tuples per batch (GatherND) */
    int64_t bstride;     /* units per batch of data (GatherND) */
    int64_t total;       /* units to move */
};

/* Offset (units) of the slice tuple j addresses; -1 (recorded) when a component is out of range. */
__device__ __forceinline__ int64_t ts_nd_off(const ts_nd_args &a, const int64_t *ind, int64_t j, ts_err *err) {
    int64_t off = 0;
#pragma unroll
    for (int t = 0; t < TS_MAXD; t++)
        if (t < a.k) {
            int64_t v = ind[j * a.k + t], n = a.dn[t], i = v < 0 ? v + n : v;
            if (i < 0 || i >= n) {
                ts_err_set(err, v, j * a.k + t, n);
                return -1;
            }
            off += i * a.ds[t];
        }
    return off;
}

template <typename T, bool BIG>
__global__ void ts_gather_nd_kernel(T *__restrict__ dst, const T *__restrict__ src, const int64_t *__restrict__ ind,
                                    const __grid_constant__ ts_nd_args a, ts_err *err) {
    TS_GRID_STRIDE(i, a.total) {
        int64_t q = ts_q<BIG>(i, a.slice), u = i - q * a.slice.d, b = ts_q<BIG>(q, a.nidx);
        int64_t off = ts_nd_off(a, ind, q, err);
        if (off >= 0) dst[i] = src[b * a.bstride + off + u];
    }
}

template <typename S, bool BIG, bool RED>
__global__ void ts_scatter_nd_kernel(S *dst, const S *__restrict__ upd, const int64_t *__restrict__ ind,
                                     const __grid_constant__ ts_nd_args a, ts_err *err) {
    TS_GRID_STRIDE(i, a.total) {
        int64_t q = ts_q<BIG>(i, a.slice), u = i - q * a.slice.d;
        int64_t off = ts_nd_off(a, ind, q, err);
        if (off < 0) continue;
        if constexpr (RED) ts_atomic_red<S>(&dst[off + u], upd[i], a.red);
        else dst[off + u] = upd[i];
    }
}

static int ts_nd_shape_ok(const eng_tensor *x, const eng_tensor *ind, int b) {
    if (ind->dtype != ENG_DTYPE_I64 || ind->ndim < 1 || x->ndim < 1 || x->ndim > TS_MAXD || b < 0) return 0;
    int64_t k = ind->dims[ind->ndim - 1];
    return k >= 1 && k <= TS_MAXD && b + k <= x->ndim;
}

static int ts_gather_nd_supports(const krn_call *c) {
    const krn_gather_params *p = (const krn_gather_params *)c->params;
    return p && ts_nd_shape_ok(&c->in[0], &c->in[1], p->batch_dims) && ts_es_ok(eng_dtype_size(c->in[0].dtype));
}

static eng_status ts_gather_nd_exec(krn_call *c) {
    const krn_gather_params *p = (const krn_gather_params *)c->params;
    const eng_tensor *x = &c->in[0], *ind = &c->in[1];
    eng_tensor *o = &c->out[0];
    ts_err *err;
    ENG_TRY(ts_err_begin(c, &err));
    const int64_t es = (int64_t)eng_dtype_size(x->dtype);
    const int b = p->batch_dims, q = ind->ndim, k = (int)ind->dims[q - 1];
    int64_t nbatch = 1, nidx = 1, slice = es, bstride = 1, xst[TS_MAXD];
    for (int i = 0; i < b; i++) nbatch *= x->dims[i];
    for (int i = b; i < x->ndim; i++) bstride *= x->dims[i];
    for (int i = b; i < q - 1; i++) nidx *= ind->dims[i];
    for (int i = b + k; i < x->ndim; i++) slice *= x->dims[i];
    if (nbatch * nidx == 0 || slice == 0) return ENG_STATUS_OK;
    /* every offset is a multiple of the slice, so the slice's byte count picks the unit */
    const uint64_t v[3] = {(uint64_t)slice, (uint64_t)(uintptr_t)x->data, (uint64_t)(uintptr_t)o->data};
    const int64_t u = (int64_t)ts_unit(v, 3);
    ts_strides(x->dims + b, x->ndim - b, xst);
    ts_nd_args a;
    memset(&a, 0, sizeof a);
    a.k = k;
    for (int t = 0; t < k; t++) {
        a.dn[t] = x->dims[b + t];
        a.ds[t] = xst[t] * es / u;
    }
    a.slice = ts_div_make(slice / u);
    a.nidx = ts_div_make(nidx);
    a.bstride = bstride * es / u;
    a.total = nbatch * nidx * (slice / u);
    const int big = a.total >= TS_SMALL;
    const unsigned g = cuda_grid(a.total, TS_THREADS);
    cudaStream_t s = CUDA_CTX(c)->stream;
    TS_BY_UNIT(u, {
        if (big) ts_gather_nd_kernel<T, true><<<g, TS_THREADS, 0, s>>>((T *)o->data, (const T *)x->data, (const int64_t *)ind->data, a, err);
        else ts_gather_nd_kernel<T, false><<<g, TS_THREADS, 0, s>>>((T *)o->data, (const T *)x->data, (const int64_t *)ind->data, a, err);
    });
    CUDA_LAUNCHED("gather_nd");
    return ENG_STATUS_OK;
}

static int ts_scatter_nd_supports(const krn_call *c) {
    const krn_scatter_params *p = (const krn_scatter_params *)c->params;
    return p && ts_nd_shape_ok(&c->in[0], &c->in[1], 0) && c->in[2].dtype == c->in[0].dtype &&
           ts_scatter_dtype_ok(p, c->in[0].dtype);
}

static eng_status ts_scatter_nd_exec(krn_call *c) {
    const krn_scatter_params *p = (const krn_scatter_params *)c->params;
    const eng_tensor *x = &c->in[0], *ind = &c->in[1], *upd = &c->in[2];
    eng_tensor *o = &c->out[0];
    cudaStream_t s = CUDA_CTX(c)->stream;
    ts_err *err;
    ENG_TRY(ts_err_begin(c, &err));
    size_t nb = eng_tensor_nbytes(x);
    if (nb && o->data != x->data)
        CUDA_TRY("scatter_nd", cudaMemcpyAsync(o->data, x->data, nb, cudaMemcpyDeviceToDevice, s));
    const int64_t es = (int64_t)eng_dtype_size(x->dtype);
    const int q = ind->ndim, k = (int)ind->dims[q - 1];
    int64_t nidx = 1, slice = 1, xst[TS_MAXD];
    for (int i = 0; i < q - 1; i++) nidx *= ind->dims[i];
    for (int i = k; i < x->ndim; i++) slice *= x->dims[i];
    if (nidx == 0 || slice == 0) return ENG_STATUS_OK;
    int64_t u = es; /* reductions go element by element */
    if (p->reduction == KRN_SCATTER_NONE) {
        const uint64_t v[3] = {(uint64_t)(slice * es), (uint64_t)(uintptr_t)o->data, (uint64_t)(uintptr_t)upd->data};
        u = (int64_t)ts_unit(v, 3);
    }
    ts_strides(x->dims, x->ndim, xst);
    ts_nd_args a;
    memset(&a, 0, sizeof a);
    a.k = k;
    a.red = p->reduction;
    for (int t = 0; t < k; t++) {
        a.dn[t] = x->dims[t];
        a.ds[t] = xst[t] * es / u;
    }
    a.slice = ts_div_make(slice * es / u);
    a.nidx = ts_div_make(1);
    a.total = nidx * (slice * es / u);
    const int big = a.total >= TS_SMALL;
    const unsigned g = cuda_grid(a.total, TS_THREADS);
    const int64_t *iv = (const int64_t *)ind->data;
    if (p->reduction == KRN_SCATTER_NONE) {
        TS_BY_UNIT(u, {
            if (big) ts_scatter_nd_kernel<T, true, false><<<g, TS_THREADS, 0, s>>>((T *)o->data, (const T *)upd->data, iv, a, err);
            else ts_scatter_nd_kernel<T, false, false><<<g, TS_THREADS, 0, s>>>((T *)o->data, (const T *)upd->data, iv, a, err);
        });
    } else {
        TS_BY_DTYPE(x->dtype, {
            if (big) ts_scatter_nd_kernel<S, true, true><<<g, TS_THREADS, 0, s>>>((S *)o->data, (const S *)upd->data, iv, a, err);
            else ts_scatter_nd_kernel<S, false, true><<<g, TS_THREADS, 0, s>>>((S *)o->data, (const S *)upd->data, iv, a, err);
        });
    }
    CUDA_LAUNCHED("scatter_nd");
    return ENG_STATUS_OK;
}

/* ---- OneHot ---- */

template <typename T, bool BIG>
__global__ void ts_onehot_kernel(T *__restrict__ dst, const void *__restrict__ ind, int idt, const T *__restrict__ vals,
                                 ts_div inner, ts_div depth, int64_t total) {
    const T off = vals[0], on = vals[1];
    const bool fl = idt == ENG_DTYPE_F32 || idt == ENG_DTYPE_F64 || idt == ENG_DTYPE_F16 || idt == ENG_DTYPE_BF16;
    TS_GRID_STRIDE(i, total) {
        int64_t q = ts_q<BIG>(i, inner), ii = i - q * inner.d, a = ts_q<BIG>(q, depth), dd = q - a * depth.d;
        int64_t e = a * inner.d + ii, v;
        if (fl) { /* the CPU's (int64_t) cast; NaN and huge values land out of range as on x86 */
            double f = ts_ld_f64(ind, idt, e);
            v = (f != f || f >= 9.2e18 || f <= -9.2e18) ? INT64_MIN : (int64_t)f;
        } else v = ts_ld_i64(ind, idt, e);
        int64_t k = v < 0 ? v + depth.d : v;
        dst[i] = k == dd ? on : off;
    }
}

static int ts_ld_dtype_ok(eng_dtype dt) { return ts_red_dtype_ok(dt); }

static int ts_onehot_supports(const krn_call *c) {
    const krn_axis_params *p = (const krn_axis_params *)c->params;
    const eng_tensor *o = &c->out[0];
    return p && p->axis >= 0 && p->axis < o->ndim && ts_es_ok(eng_dtype_size(o->dtype)) &&
           c->in[2].dtype == o->dtype && ts_ld_dtype_ok(c->in[0].dtype);
}

static eng_status ts_onehot_exec(krn_call *c) {
    const krn_axis_params *p = (const krn_axis_params *)c->params;
    const eng_tensor *ind = &c->in[0], *vals = &c->in[2];
    eng_tensor *o = &c->out[0];
    const int64_t total = eng_tensor_numel(o), depth = o->dims[p->axis];
    int64_t inner = 1;
    for (int i = p->axis + 1; i < o->ndim; i++) inner *= o->dims[i];
    if (total <= 0) return ENG_STATUS_OK;
    const ts_div fi = ts_div_make(inner), fd = ts_div_make(depth);
    const int big = total >= TS_SMALL;
    const unsigned g = cuda_grid(total, TS_THREADS);
    cudaStream_t s = CUDA_CTX(c)->stream;
    TS_BY_ELEM(eng_dtype_size(o->dtype), {
        if (big) ts_onehot_kernel<T, true><<<g, TS_THREADS, 0, s>>>((T *)o->data, ind->data, (int)ind->dtype, (const T *)vals->data, fi, fd, total);
        else ts_onehot_kernel<T, false><<<g, TS_THREADS, 0, s>>>((T *)o->data, ind->data, (int)ind->dtype, (const T *)vals->data, fi, fd, total);
    });
    CUDA_LAUNCHED("onehot");
    return ENG_STATUS_OK;
}

/* ---- ReverseSequence ---- */

template <typename T, bool BIG>
__global__ void ts_revseq_kernel(T *__restrict__ dst, const T *__restrict__ src, const void *__restrict__ lens,
                                 int idx64, int time0, ts_div inner, ts_div inner_axis, int64_t T_, int64_t B,
                                 int64_t total, ts_err *err) {
    TS_GRID_STRIDE(i, total) {
        int64_t row = ts_q<BIG>(i, inner), u = i - row * inner.d;
        int64_t hi = ts_q<BIG>(row, inner_axis), lo = row - hi * inner_axis.d; /* (t, b) or (b, t) */
        int64_t t = time0 ? hi : lo, b = time0 ? lo : hi;
        int64_t len = ts_idx(lens, idx64, b);
        if (len < 0 || len > T_) {
            ts_err_set(err, len, b, T_);
            continue;
        }
        int64_t sr = t < len ? len - 1 - t : t;
        int64_t srow = time0 ? sr * B + b : b * T_ + sr;
        dst[i] = src[srow * inner.d + u];
    }
}

static int ts_revseq_supports(const krn_call *c) {
    const krn_revseq_params *p = (const krn_revseq_params *)c->params;
    return p && ((p->time_axis == 0 && p->batch_axis == 1) || (p->time_axis == 1 && p->batch_axis == 0)) &&
           c->in[0].ndim >= 2 && ts_es_ok(eng_dtype_size(c->in[0].dtype)) && ts_idx_ok(c->in[1].dtype);
}

static eng_status ts_revseq_exec(krn_call *c) {
    const krn_revseq_params *p = (const krn_revseq_params *)c->params;
    const eng_tensor *x = &c->in[0], *lens = &c->in[1];
    eng_tensor *o = &c->out[0];
    ts_err *err;
    ENG_TRY(ts_err_begin(c, &err));
    const int64_t es = (int64_t)eng_dtype_size(x->dtype), T_ = x->dims[p->time_axis], B = x->dims[p->batch_axis];
    int64_t inner = es;
    for (int i = 2; i < x->ndim; i++) inner *= x->dims[i];
    if (T_ * B * inner == 0) return ENG_STATUS_OK;
    const uint64_t v[3] = {(uint64_t)inner, (uint64_t)(uintptr_t)x->data, (uint64_t)(uintptr_t)o->data};
    const int64_t u = (int64_t)ts_unit(v, 3), total = T_ * B * (inner / u);
    const int time0 = p->time_axis == 0;
    const ts_div fi = ts_div_make(inner / u), fa = ts_div_make(time0 ? B : T_);
    const int big = total >= TS_SMALL, i64 = lens->dtype == ENG_DTYPE_I64;
    const unsigned g = cuda_grid(total, TS_THREADS);
    cudaStream_t s = CUDA_CTX(c)->stream;
    TS_BY_UNIT(u, {
        if (big) ts_revseq_kernel<T, true><<<g, TS_THREADS, 0, s>>>((T *)o->data, (const T *)x->data, lens->data, i64, time0, fi, fa, T_, B, total, err);
        else ts_revseq_kernel<T, false><<<g, TS_THREADS, 0, s>>>((T *)o->data, (const T *)x->data, lens->data, i64, time0, fi, fa, T_, B, total, err);
    });
    CUDA_LAUNCHED("reverse_sequence");
    return ENG_STATUS_OK;
}

/* ---- Pad ---- */

struct ts_pad_args {
    int r, mode;
    ts_div od[TS_MAXD];                             /* output dims */
    int64_t pb[TS_MAXD], xn[TS_MAXD], xs[TS_MAXD]; /* leading pads, input dims, input strides */
    int64_t total;
    unsigned long long val; /* fill value bits when the constant_value input is absent */
};

/* tensor-fill.c krn_pad_map: source index of output coordinate i, -1 for the fill value. */
__device__ __forceinline__ int64_t ts_pad_map(int64_t i, int64_t pb, int64_t n, int mode) {
    int64_t s = i - pb;
    if (s >= 0 && s < n) return s;
    switch (mode) {
    case KRN_PAD_EDGE: return s < 0 ? 0 : n - 1;
    case KRN_PAD_WRAP: return ((s % n) + n) % n;
    case KRN_PAD_REFLECT: {
        if (n == 1) return 0;
        int64_t m = 2 * (n - 1);
        s = ((s % m) + m) % m;
        return s < n ? s : m - s;
    }
    default: return -1;
    }
}

template <typename T, bool BIG>
__global__ void ts_pad_kernel(T *__restrict__ dst, const T *__restrict__ src, const T *__restrict__ vptr,
                              const __grid_constant__ ts_pad_args a) {
    T val;
    if (vptr) val = *vptr;
    else memcpy(&val, &a.val, sizeof val);
    TS_GRID_STRIDE(i, a.total) {
        int64_t rem = i, off = 0;
        bool fill = false;
#pragma unroll
        for (int d = TS_MAXD - 1; d >= 0; d--)
            if (d < a.r) {
                int64_t q = d > 0 ? ts_q<BIG>(rem, a.od[d]) : 0, ci = rem - q * a.od[d].d;
                rem = q;
                int64_t m = ts_pad_map(ci, a.pb[d], a.xn[d], a.mode);
                if (m < 0) fill = true;
                else off += m * a.xs[d];
            }
        dst[i] = fill ? val : src[off];
    }
}

static int ts_pad_supports(const krn_call *c) {
    const krn_pad_params *p = (const krn_pad_params *)c->params;
    const eng_tensor *x = &c->in[0];
    if (!p || x->ndim > TS_MAXD || !ts_es_ok(eng_dtype_size(x->dtype))) return 0;
    if (p->mode < KRN_PAD_CONSTANT || p->mode > KRN_PAD_WRAP) return 0;
    /* the CPU's error for a non-constant pad of an empty input */
    if (x->ndim > 0 && eng_tensor_numel(x) == 0 && p->mode != KRN_PAD_CONSTANT && eng_tensor_numel(&c->out[0]) > 0)
        return 0;
    if (c->nin > 2 && c->in[2].dtype != ENG_DTYPE_UNDEFINED && c->in[2].dtype != x->dtype) return 0;
    return 1;
}

static eng_status ts_pad_exec(krn_call *c) {
    const krn_pad_params *p = (const krn_pad_params *)c->params;
    const eng_tensor *x = &c->in[0];
    eng_tensor *o = &c->out[0];
    cudaStream_t s = CUDA_CTX(c)->stream;
    const size_t es = eng_dtype_size(x->dtype);
    const int r = x->ndim;
    const int64_t total = eng_tensor_numel(o);
    if (total <= 0) return ENG_STATUS_OK;
    if (r == 0) {
        CUDA_TRY("pad", cudaMemcpyAsync(o->data, x->data, es, cudaMemcpyDeviceToDevice, s));
        return ENG_STATUS_OK;
    }
    if (eng_tensor_numel(x) == 0 && p->mode != KRN_PAD_CONSTANT)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "pad: input 'data' is empty; only constant mode can pad it");
    const void *vptr = NULL;
    if (c->nin > 2 && c->in[2].data && eng_tensor_numel(&c->in[2]) >= 1) {
        if (c->in[2].dtype != x->dtype)
            return eng_err(ENG_STATUS_UNSUPPORTED, "cuda pad: constant_value of dtype %s for %s data",
                           eng_dtype_name(c->in[2].dtype), eng_dtype_name(x->dtype));
        vptr = c->in[2].data;
    }
    ts_pad_args a;
    memset(&a, 0, sizeof a);
    {
        unsigned char val[16] = {0};
        eng_tensor t = {x->dtype, 0, {0}, val};
        eng_tensor_set_f64(&t, 0, p->value);
        memcpy(&a.val, val, sizeof a.val);
    }
    a.r = r;
    a.mode = p->mode;
    a.total = total;
    ts_strides(x->dims, r, a.xs);
    for (int d = 0; d < r; d++) {
        a.od[d] = ts_div_make(o->dims[d]);
        a.pb[d] = p->pads[d];
        a.xn[d] = x->dims[d];
    }
    const int big = total >= TS_SMALL;
    const unsigned g = cuda_grid(total, TS_THREADS);
    TS_BY_ELEM(es, {
        if (big) ts_pad_kernel<T, true><<<g, TS_THREADS, 0, s>>>((T *)o->data, (const T *)x->data, (const T *)vptr, a);
        else ts_pad_kernel<T, false><<<g, TS_THREADS, 0, s>>>((T *)o->data, (const T *)x->data, (const T *)vptr, a);
    });
    CUDA_LAUNCHED("pad");
    return ENG_STATUS_OK;
}

/* ---- Trilu, EyeLike, Range, ConstantOfShape, Constant ---- */

template <typename T, bool BIG>
__global__ void ts_trilu_kernel(T *__restrict__ dst, const T *__restrict__ src, const void *__restrict__ kp, int kdt,
                                int64_t k, int upper, ts_div M, ts_div N, int64_t total) {
    if (kp) k = ts_ld_i64(kp, kdt, 0);
    const int64_t lim = N.d + M.d; /* as the CPU clamps; no comparison below can overflow anyway */
    k = k > lim ? lim : (k < -lim ? -lim : k);
    TS_GRID_STRIDE(i, total) {
        int64_t q = ts_q<BIG>(i, M), j = i - q * M.d, row = q - ts_q<BIG>(q, N) * N.d;
        bool keep = upper ? j - row >= k : j - row <= k;
        dst[i] = keep ? src[i] : T{};
    }
}

static int ts_trilu_supports(const krn_call *c) {
    const eng_tensor *x = &c->in[0];
    if (!c->params || x->ndim < 2 || !ts_es_ok(eng_dtype_size(x->dtype))) return 0;
    return !(c->nin > 1 && c->in[1].dtype != ENG_DTYPE_UNDEFINED && !ts_ld_dtype_ok(c->in[1].dtype));
}

static eng_status ts_trilu_exec(krn_call *c) {
    const krn_trilu_params *p = (const krn_trilu_params *)c->params;
    const eng_tensor *x = &c->in[0];
    eng_tensor *o = &c->out[0];
    const int r = x->ndim;
    const int64_t total = eng_tensor_numel(x);
    if (total <= 0) return ENG_STATUS_OK;
    const void *kp = c->nin > 1 && c->in[1].data ? c->in[1].data : NULL;
    const int kdt = kp ? (int)c->in[1].dtype : 0;
    const ts_div M = ts_div_make(x->dims[r - 1]), N = ts_div_make(x->dims[r - 2]);
    const int big = total >= TS_SMALL;
    const unsigned g = cuda_grid(total, TS_THREADS);
    cudaStream_t s = CUDA_CTX(c)->stream;
    TS_BY_ELEM(eng_dtype_size(x->dtype), {
        if (big) ts_trilu_kernel<T, true><<<g, TS_THREADS, 0, s>>>((T *)o->data, (const T *)x->data, kp, kdt, p->k, p->upper, M, N, total);
        else ts_trilu_kernel<T, false><<<g, TS_THREADS, 0, s>>>((T *)o->data, (const T *)x->data, kp, kdt, p->k, p->upper, M, N, total);
    });
    CUDA_LAUNCHED("trilu");
    return ENG_STATUS_OK;
}

/* EyeLike: one on the diagonal col - row == k, zero elsewhere. */
template <typename T, bool BIG>
__global__ void ts_eyelike_kernel(T *__restrict__ dst, unsigned long long onebits, int64_t k, ts_div C, int64_t total) {
    T one;
    memcpy(&one, &onebits, sizeof one);
    TS_GRID_STRIDE(i, total) {
        int64_t row = ts_q<BIG>(i, C), col = i - row * C.d;
        dst[i] = col - row == k ? one : T{};
    }
}

static int ts_eyelike_supports(const krn_call *c) {
    return c->params && c->out[0].ndim == 2 && ts_es_ok(eng_dtype_size(c->out[0].dtype));
}

static eng_status ts_eyelike_exec(krn_call *c) {
    const krn_eyelike_params *p = (const krn_eyelike_params *)c->params;
    eng_tensor *o = &c->out[0];
    const int64_t total = eng_tensor_numel(o);
    if (total <= 0) return ENG_STATUS_OK;
    unsigned char one[16] = {0};
    eng_tensor t = {o->dtype, 0, {0}, one};
    eng_tensor_set_f64(&t, 0, 1.0);
    unsigned long long bits;
    memcpy(&bits, one, sizeof bits);
    const ts_div C = ts_div_make(o->dims[1]);
    const int big = total >= TS_SMALL;
    const unsigned g = cuda_grid(total, TS_THREADS);
    cudaStream_t s = CUDA_CTX(c)->stream;
    TS_BY_ELEM(eng_dtype_size(o->dtype), {
        if (big) ts_eyelike_kernel<T, true><<<g, TS_THREADS, 0, s>>>((T *)o->data, bits, p->k, C, total);
        else ts_eyelike_kernel<T, false><<<g, TS_THREADS, 0, s>>>((T *)o->data, bits, p->k, C, total);
    });
    CUDA_LAUNCHED("eyelike");
    return ENG_STATUS_OK;
}

/* Range: start and delta are read on the device (inputs 0 and 2), exactly as tensor-fill.c computes them: f32
 * start + (float)i * delta, f64 likewise in double, integers start + i * delta in int64 (wrapping) truncated to the
 * dtype. No contraction into an FMA. */
__global__ void ts_range_f32_kernel(float *y, const float *s, const float *d, int64_t n) {
    const float fs = *s, fd = *d;
    TS_GRID_STRIDE(i, n) y[i] = __fadd_rn(fs, __fmul_rn((float)i, fd));
}
__global__ void ts_range_f64_kernel(double *y, const double *s, const double *d, int64_t n) {
    const double ds = *s, dd = *d;
    TS_GRID_STRIDE(i, n) y[i] = __dadd_rn(ds, __dmul_rn((double)i, dd));
}
template <typename I> __global__ void ts_range_int_kernel(I *y, const I *s, const I *d, int64_t n) {
    const unsigned long long is = (unsigned long long)(long long)*s, id = (unsigned long long)(long long)*d;
    TS_GRID_STRIDE(i, n) y[i] = (I)(long long)(is + (unsigned long long)i * id);
}

static int ts_range_supports(const krn_call *c) {
    eng_dtype dt = c->out[0].dtype;
    return c->nin >= 3 && c->in[0].dtype == dt && c->in[2].dtype == dt &&
           (dt == ENG_DTYPE_F32 || dt == ENG_DTYPE_F64 || dt == ENG_DTYPE_I16 || dt == ENG_DTYPE_I32 ||
            dt == ENG_DTYPE_I64);
}

static eng_status ts_range_exec(krn_call *c) {
    eng_tensor *o = &c->out[0];
    const int64_t n = eng_tensor_numel(o);
    if (n <= 0) return ENG_STATUS_OK;
    const void *s0 = c->in[0].data, *d0 = c->in[2].data;
    const unsigned g = cuda_grid(n, TS_THREADS);
    cudaStream_t s = CUDA_CTX(c)->stream;
    switch (o->dtype) {
    case ENG_DTYPE_F32: ts_range_f32_kernel<<<g, TS_THREADS, 0, s>>>((float *)o->data, (const float *)s0, (const float *)d0, n); break;
    case ENG_DTYPE_F64: ts_range_f64_kernel<<<g, TS_THREADS, 0, s>>>((double *)o->data, (const double *)s0, (const double *)d0, n); break;
    case ENG_DTYPE_I16: ts_range_int_kernel<int16_t><<<g, TS_THREADS, 0, s>>>((int16_t *)o->data, (const int16_t *)s0, (const int16_t *)d0, n); break;
    case ENG_DTYPE_I32: ts_range_int_kernel<int32_t><<<g, TS_THREADS, 0, s>>>((int32_t *)o->data, (const int32_t *)s0, (const int32_t *)d0, n); break;
    case ENG_DTYPE_I64: ts_range_int_kernel<long long><<<g, TS_THREADS, 0, s>>>((long long *)o->data, (const long long *)s0, (const long long *)d0, n); break;
    default: return eng_err(ENG_STATUS_UNSUPPORTED, "cuda range: dtype %s", eng_dtype_name(o->dtype));
    }
    CUDA_LAUNCHED("range");
    return ENG_STATUS_OK;
}

template <typename T> __global__ void ts_fill_kernel(T *dst, unsigned long long bits, int64_t n) {
    T v;
    memcpy(&v, &bits, sizeof v);
    TS_GRID_STRIDE(i, n) dst[i] = v;
}

static int ts_constant_of_shape_supports(const krn_call *c) {
    const krn_constant_params *p = (const krn_constant_params *)c->params;
    return p && p->value.data && p->value.dtype == c->out[0].dtype && ts_es_ok(eng_dtype_size(c->out[0].dtype));
}

static eng_status ts_constant_of_shape_exec(krn_call *c) {
    const krn_constant_params *p = (const krn_constant_params *)c->params;
    eng_tensor *o = &c->out[0];
    const size_t es = eng_dtype_size(o->dtype);
    const int64_t n = eng_tensor_numel(o);
    cudaStream_t s = CUDA_CTX(c)->stream;
    if (n <= 0) return ENG_STATUS_OK;
    unsigned long long bits = 0;
    memcpy(&bits, p->value.data, es);
    if (bits == 0) {
        CUDA_TRY("constant_of_shape", cudaMemsetAsync(o->data, 0, (size_t)n * es, s));
        return ENG_STATUS_OK;
    }
    const unsigned g = cuda_grid(n, TS_THREADS);
    switch (es) {
    case 1: ts_fill_kernel<uint8_t><<<g, TS_THREADS, 0, s>>>((uint8_t *)o->data, bits, n); break;
    case 2: ts_fill_kernel<uint16_t><<<g, TS_THREADS, 0, s>>>((uint16_t *)o->data, bits, n); break;
    case 4: ts_fill_kernel<uint32_t><<<g, TS_THREADS, 0, s>>>((uint32_t *)o->data, bits, n); break;
    default: ts_fill_kernel<unsigned long long><<<g, TS_THREADS, 0, s>>>((unsigned long long *)o->data, bits, n); break;
    }
    CUDA_LAUNCHED("constant_of_shape");
    return ENG_STATUS_OK;
}

/* Constant: the value is uploaded once by init (queued on the stream; params own the host bytes for the plan's
 * life), and every exec copies it device to device. */
static int ts_constant_supports(const krn_call *c) {
    const krn_constant_params *p = (const krn_constant_params *)c->params;
    return p && p->value.dtype == c->out[0].dtype && eng_dtype_size(c->out[0].dtype) > 0 &&
           eng_tensor_numel(&p->value) == eng_tensor_numel(&c->out[0]);
}

static eng_status ts_constant_init(krn_call *c) {
    const krn_constant_params *p = (const krn_constant_params *)c->params;
    ts_state *st;
    ENG_TRY(ts_state_new(c, "constant", TS_ERR_INDEX, 0, &st));
    size_t nb = eng_tensor_nbytes(&p->value);
    if (!nb) return ENG_STATUS_OK;
    eng_status s = cuda_mem_alloc(st->device, nb, &st->dbuf);
    if (s != ENG_STATUS_OK) return s;
    CUDA_TRY("constant", cudaMemcpyAsync(st->dbuf, p->value.data, nb, cudaMemcpyHostToDevice, CUDA_CTX(c)->stream));
    return ENG_STATUS_OK;
}

static eng_status ts_constant_exec(krn_call *c) {
    const ts_state *st = (const ts_state *)c->state;
    size_t nb = eng_tensor_nbytes(&c->out[0]);
    if (!nb) return ENG_STATUS_OK;
    if (!st || !st->dbuf) return eng_err(ENG_STATUS_INTERNAL, "cuda constant: exec without init's upload");
    CUDA_TRY("constant", cudaMemcpyAsync(c->out[0].data, st->dbuf, nb, cudaMemcpyDeviceToDevice, CUDA_CTX(c)->stream));
    return ENG_STATUS_OK;
}

#include "cuda-tensor-resize.h"

/* ---- table ---- */

#define TS_K(nm, in, ex, fr, sup)                                                                                  \
    {.name = nm, .init = in, .exec = ex, .free_state = fr, .describe = NULL, .compute_ok = NULL, .io_ok = NULL,    \
     .supports = sup}
/* index kernels: their error record is read after the run's sync (krn_kernel.check) */
#define TS_KI(nm, in, ex, fr, sup)                                                                                 \
    {.name = nm, .init = in, .exec = ex, .free_state = fr, .describe = NULL, .compute_ok = NULL, .io_ok = NULL,    \
     .supports = sup, .check = krn_cuda_tensor_check}

extern "C" const krn_kernel krn_cuda_tensor_kernels[] = {
    TS_K("transpose", NULL, ts_transpose_exec, NULL, ts_transpose_supports),
    TS_K("concat", NULL, ts_concat_exec, NULL, ts_axis_supports),
    TS_K("split", NULL, ts_split_exec, NULL, ts_axis_supports),
    TS_K("slice", NULL, ts_slice_exec, NULL, ts_slice_supports),
    TS_KI("gather", ts_init_gather, ts_gather_exec, ts_free_state, ts_gather_supports),
    TS_KI("gather_elements", ts_init_gather_elements, ts_gather_elements_exec, ts_free_state, ts_gather_elements_supports),
    TS_KI("gather_nd", ts_init_gather_nd, ts_gather_nd_exec, ts_free_state, ts_gather_nd_supports),
    TS_KI("scatter_elements", ts_init_scatter_elements, ts_scatter_elements_exec, ts_free_state, ts_scatter_elements_supports),
    TS_KI("scatter_nd", ts_init_scatter_nd, ts_scatter_nd_exec, ts_free_state, ts_scatter_nd_supports),
    TS_K("onehot", NULL, ts_onehot_exec, NULL, ts_onehot_supports),
    TS_KI("reverse_sequence", ts_init_revseq, ts_revseq_exec, ts_free_state, ts_revseq_supports),
    TS_K("pad", NULL, ts_pad_exec, NULL, ts_pad_supports),
    TS_K("trilu", NULL, ts_trilu_exec, NULL, ts_trilu_supports),
    TS_K("eyelike", NULL, ts_eyelike_exec, NULL, ts_eyelike_supports),
    TS_K("range", NULL, ts_range_exec, NULL, ts_range_supports),
    TS_K("resize", ts_resize_init, ts_resize_exec, ts_free_state, ts_resize_supports),
    TS_K("depth_space", NULL, ts_depth_space_exec, NULL, ts_depth_space_supports),
    TS_K("constant", ts_constant_init, ts_constant_exec, ts_free_state, ts_constant_supports),
    TS_K("constant_of_shape", NULL, ts_constant_of_shape_exec, NULL, ts_constant_of_shape_supports),
    TS_K("grad_slice", NULL, ts_grad_slice_exec, NULL, ts_grad_slice_supports),
    TS_KI("grad_gather", ts_init_grad_gather, ts_grad_gather_exec, ts_free_state, ts_grad_gather_supports),
    TS_K("grad_concat", NULL, ts_grad_concat_exec, NULL, ts_grad_concat_supports),
    {NULL},
};
