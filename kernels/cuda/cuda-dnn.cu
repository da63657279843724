/* cuda-dnn.cu - the "dnn" family on CUDA: Conv / com.tensord FusedConv, ConvTranspose, pooling, BatchNormalization,
 * LRN, and the gradients ConvGrad, pool gradients and BatchNormalizationGrad. Same names, params, inputs and outputs
 * as the CPU kernels (kernels/cpu/nn-conv.c, nn-deconv.c, nn-pool.c, norm-batch.c, grad-nn.c, grad-lowp.c).
 *
 * Convolutions run on cuDNN's legacy API: descriptors and the algorithm (cudnnGet*Algorithm_v7 heuristics, no
 * device run) are made once in init and kept in the state; exec only queues work on ctx->stream. cuDNN wants
 * symmetric pads: with pads (pl, pr) it gets min(pl, pr) and the rest is applied on the data side, the input padded
 * with zeros into the workspace (Conv, ConvGrad's weight gradient) or the output computed larger and cropped
 * (ConvTranspose, ConvGrad's data gradient). The data type cuDNN runs in (cdt) is c->compute (F16 / BF16, fp32
 * accumulation, tensor-op math) or else the tensors' own dtype (fp32: FMA math, TF32 only when ctx->tf32); any
 * operand in another dtype is converted into the workspace (a constant W once, in init, into the state). Bias,
 * the FusedConv residual Z (broadcast into Y, added after the bias) and the activation run in one epilogue kernel
 * that also writes Y's dtype, or inside cudnnConvolutionBiasActivationForward for fp32 ReLU where it applies.
 * Pooling, normalisation and the other gradients are this file's own kernels (cuda-dnn-dev.h), computed in fp32
 * (statistics in double) with the CPU's exact window, padding and tie rules.
 * FusedConv's fused 2-D MaxPool and 3x3 depthwise post-op run as a second stage from the conv's output kept in
 * the workspace (this file's pool kernel; a second cuDNN conv with its own algorithm).
 * Scratch: one cuda_ctx_workspace region per exec, sub-allocated at offsets computed in init (grown in init).
 * supports() refuses non-plain layouts (BLOCKED, NHWC), ConvTranspose geometries larger than the natural output
 * (an output_shape past it), float64, LpPool gradients, and tensors cuDNN's int descriptors cannot describe.
 * The pool gradient scatters with float atomics where windows overlap: summation order, and so the last bits,
 * may differ between runs.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-impl.h"
extern "C" {
#include "../krn-grad.h"
#include "../krn-nn.h"
#include "../krn-reduce.h"
}
#include "cuda-dnn-dev.h"

#define DNN_THREADS 256
#define DNN_WS_CAP ((size_t)1 << 30) /* largest cuDNN algorithm workspace accepted */

/* ---- small helpers ---- */

static int64_t dnn_numel(const eng_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->dims[i];
    return n;
}

static int dnn_is_float(eng_dtype dt) { return dt == ENG_DTYPE_F32 || dt == ENG_DTYPE_F16 || dt == ENG_DTYPE_BF16; }
static size_t dnn_dt_size(eng_dtype dt) { return dt == ENG_DTYPE_F32 ? 4 : dt == ENG_DTYPE_I8 || dt == ENG_DTYPE_U8 ? 1 : 2; }
static const char *dnn_dt_name(eng_dtype dt) { return dt == ENG_DTYPE_F16 ? "f16" : dt == ENG_DTYPE_BF16 ? "bf16" : "f32"; }
static cudnnDataType_t dnn_cudnn_dt(eng_dtype dt) {
    return dt == ENG_DTYPE_F16 ? CUDNN_DATA_HALF : dt == ENG_DTYPE_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}
static int dnn_has_in(const krn_call *c, int i) { return c->nin > i && c->in[i].dtype != ENG_DTYPE_UNDEFINED; }
static int dnn_has_out(const krn_call *c, int i) { return c->nout > i && c->out[i].dtype != ENG_DTYPE_UNDEFINED; }
static size_t dnn_align(size_t n) { return (n + 255) & ~(size_t)255; }
/* The compute dtype of a call: F16 / BF16, or UNDEFINED for "the tensors' own" (F32 counts as that). */
static eng_dtype dnn_compute(eng_dtype dt) { return dt == ENG_DTYPE_F16 || dt == ENG_DTYPE_BF16 ? dt : ENG_DTYPE_UNDEFINED; }

static eng_status dnn_convert(cuda_ctx *x, const void *src, eng_dtype sdt, void *dst, eng_dtype ddt, int64_t n, const char *what) {
    if (n <= 0) return ENG_STATUS_OK;
    dnn_convert_kernel<<<cuda_grid(n, DNN_THREADS), DNN_THREADS, 0, x->stream>>>(src, sdt, dst, ddt, n);
    CUDA_LAUNCHED(what);
    return ENG_STATUS_OK;
}

static eng_status dnn_window_run(cuda_ctx *x, const void *src, eng_dtype sdt, void *dst, eng_dtype ddt, const dnn_window *w,
                                 const char *what) {
    int64_t S = w->d[0] * w->d[1] * w->d[2];
    if (S * w->planes <= 0) return ENG_STATUS_OK;
    dnn_window_kernel<<<dnn_plane_grid(w->planes, S, DNN_THREADS), DNN_THREADS, 0, x->stream>>>(src, sdt, dst, ddt, *w);
    CUDA_LAUNCHED(what);
    return ENG_STATUS_OK;
}

/* A tensor / filter descriptor for dims[n] (n >= 3; a 1-D conv's tensors get a trailing 1: cuDNN wants 4-D+). */
static eng_status dnn_tensor_desc(cudnnTensorDescriptor_t d, eng_dtype dt, int n, const int64_t *dims) {
    int nd = n < 4 ? 4 : n, di[5], st[5];
    for (int i = 0; i < nd; i++) di[i] = i < n ? (int)dims[i] : 1;
    st[nd - 1] = 1;
    for (int i = nd - 2; i >= 0; i--) st[i] = st[i + 1] * di[i + 1];
    CUDNN_TRY("dnn tensor descriptor", cudnnSetTensorNdDescriptor(d, dnn_cudnn_dt(dt), nd, di, st));
    return ENG_STATUS_OK;
}

static eng_status dnn_filter_desc(cudnnFilterDescriptor_t d, eng_dtype dt, int n, const int64_t *dims) {
    int nd = n < 4 ? 4 : n, di[5];
    for (int i = 0; i < nd; i++) di[i] = i < n ? (int)dims[i] : 1;
    CUDNN_TRY("dnn filter descriptor", cudnnSetFilterNdDescriptor(d, dnn_cudnn_dt(dt), CUDNN_TENSOR_NCHW, nd, di));
    return ENG_STATUS_OK;
}

/* Geometry of a conv as cuDNN sees it: symmetric pads sym[], and the pad left over on the data side (lo, hi). */
typedef struct dnn_conv_geo {
    int nsp;
    int64_t sym[3], lo[3], hi[3];
    int asym;
} dnn_conv_geo;

static void dnn_conv_geo_get(const krn_conv_params *p, int nsp, dnn_conv_geo *g) {
    memset(g, 0, sizeof *g);
    g->nsp = nsp;
    for (int i = 0; i < nsp; i++) {
        int64_t pl = p->pads[i], pr = p->pads[nsp + i], q = pl < pr ? pl : pr;
        g->sym[i] = q, g->lo[i] = pl - q, g->hi[i] = pr - q;
        g->asym |= g->lo[i] != 0 || g->hi[i] != 0;
    }
}

static eng_status dnn_conv_desc(cudnnConvolutionDescriptor_t d, const krn_conv_params *p, const dnn_conv_geo *g, int64_t group,
                                cudnnMathType_t math) {
    int n = g->nsp < 2 ? 2 : g->nsp, pad[3], st[3], dl[3];
    for (int i = 0; i < n; i++) {
        pad[i] = i < g->nsp ? (int)g->sym[i] : 0;
        st[i] = i < g->nsp ? (int)p->strides[i] : 1;
        dl[i] = i < g->nsp ? (int)p->dilations[i] : 1;
    }
    CUDNN_TRY("dnn conv descriptor", cudnnSetConvolutionNdDescriptor(d, n, pad, st, dl, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    CUDNN_TRY("dnn conv groups", cudnnSetConvolutionGroupCount(d, (int)group));
    CUDNN_TRY("dnn conv math", cudnnSetConvolutionMathType(d, math));
    return ENG_STATUS_OK;
}

/* fp32: FMA only unless TF32 is allowed; f16/bf16: tensor cores. */
static cudnnMathType_t dnn_math(eng_dtype cdt, const cuda_ctx *x) {
    if (cdt == ENG_DTYPE_F32) return x->tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
    return CUDNN_TENSOR_OP_MATH;
}

static const char *dnn_math_name(cudnnMathType_t m) {
    return m == CUDNN_FMA_MATH ? "fma" : m == CUDNN_DEFAULT_MATH ? "default-math" : "tensor-op";
}

/* The first (fastest by cuDNN's heuristics) entry of a perf list that is usable: status SUCCESS, a workspace within
 * DNN_WS_CAP, and try_algo (which sets the final math type on the descriptor and queries the workspace) succeeding.
 * Strict fp32 (want FMA) first tries entries ranked for FMA / default math and always runs with FMA math; otherwise
 * the math type cuDNN ranked is kept. -1 if none. */
static cudnnMathType_t dnn_final_math(cudnnMathType_t want, cudnnMathType_t got) { return want == CUDNN_FMA_MATH ? want : got; }

template <typename Perf, typename Try>
static int dnn_choose(const Perf *perf, int n, cudnnMathType_t want, Try try_algo) {
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n; i++) {
            if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > DNN_WS_CAP) continue;
            int ranked_fma = perf[i].mathType == CUDNN_FMA_MATH || perf[i].mathType == CUDNN_DEFAULT_MATH;
            if (want == CUDNN_FMA_MATH && ranked_fma == pass) continue; /* pass 0: FMA-ranked, pass 1: the rest */
            if (want != CUDNN_FMA_MATH && pass) break;
            if (try_algo(perf[i], dnn_final_math(want, perf[i].mathType)) == CUDNN_STATUS_SUCCESS) return i;
        }
    return -1;
}

static const char *const dnn_fwd_names[] = {"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT",
                                            "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
static const char *const dnn_bwd_data_names[] = {"ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
static const char *const dnn_bwd_filter_names[] = {"ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING"};

static const char *dnn_name(const char *const *names, int n, int algo) { return algo >= 0 && algo < n ? names[algo] : "?"; }

/* dims with 3 spatial entries, leading ones (the window kernel's view). */
static void dnn_dims3(const int64_t *spatial, int nsp, int64_t *out3) {
    for (int i = 0; i < 3; i++) out3[i] = 1;
    for (int i = 0; i < nsp; i++) out3[3 - nsp + i] = spatial[i];
}

/* int descriptors: every tensor cuDNN sees must have fewer than 2^31 elements. */
static int dnn_int_ok(int64_t n) { return n >= 0 && n < INT_MAX; }

/* ================================================================ Conv / FusedConv / ConvTranspose */

/* FusedConv's stages after the conv: a 2-D MaxPool (p->pool) or a 3x3 depthwise conv (p->dw_stride). Either way the
 * conv's own output ("mid", cdt) lives in the workspace and gets its bias and activation there, in place. */
typedef struct conv_state {
    int device;
    int transposed;
    eng_dtype cdt;
    cudnnTensorDescriptor_t xd, yd, bd;  /* conv input (X, padded X'; for ConvTranspose X as "dy"), output, fused bias */
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    cudnnActivationDescriptor_t ad;
    int algo;
    cudnnMathType_t math;
    size_t algo_ws;
    int xconv;                          /* X goes through the window kernel (pad and/or convert) into the workspace */
    dnn_window xwin;
    int wmode;                          /* 0: W as given; 1: converted in init (wpack); 2: converted every exec */
    void *wpack;
    int64_t xn, wn, yn;                 /* elements of X as cuDNN reads it, of W, of the conv's output */
    int ydirect;                        /* cuDNN writes Y itself */
    int crop;                           /* ConvTranspose with asymmetric pads: a larger Y, cropped */
    dnn_window ywin;
    int epi;                            /* epilogue kernel after the conv: bias, residual, activation, dtype */
    int fused;                          /* cudnnConvolutionBiasActivationForward (fp32 ReLU) */
    int stage;                          /* 0 none, 1 MaxPool, 2 depthwise conv */
    eng_tensor mid;                     /* the conv's output when a stage follows (dims, cdt; data set per exec) */
    dnn_pool_geo pg;                    /* stage 1 */
    cudnnTensorDescriptor_t od;         /* stage 2: its output (Y's dims, cdt) */
    cudnnFilterDescriptor_t dwd;
    cudnnConvolutionDescriptor_t dcd;
    int dalgo;
    cudnnMathType_t dmath;
    size_t dalgo_ws;
    int dwmode;                         /* as wmode, for the depthwise W (input 4) */
    void *dwpack;
    int dydirect, depi;
    size_t off_x, off_w, off_y, off_dw, off_dy, off_algo, ws_total;
    char desc[192];
} conv_state;

static void conv_free(void *v) {
    conv_state *s = (conv_state *)v;
    if (!s) return;
    if (s->xd) cudnnDestroyTensorDescriptor(s->xd);
    if (s->yd) cudnnDestroyTensorDescriptor(s->yd);
    if (s->bd) cudnnDestroyTensorDescriptor(s->bd);
    if (s->od) cudnnDestroyTensorDescriptor(s->od);
    if (s->wd) cudnnDestroyFilterDescriptor(s->wd);
    if (s->dwd) cudnnDestroyFilterDescriptor(s->dwd);
    if (s->cd) cudnnDestroyConvolutionDescriptor(s->cd);
    if (s->dcd) cudnnDestroyConvolutionDescriptor(s->dcd);
    if (s->ad) cudnnDestroyActivationDescriptor(s->ad);
    if (s->wpack) cuda_mem_free(s->device, s->wpack);
    if (s->dwpack) cuda_mem_free(s->device, s->dwpack);
    free(s);
}

/* The forward conv's own output spatial dims (before a fused stage). */
static void conv_out_dims(const krn_conv_params *p, const eng_tensor *x, const eng_tensor *w, int64_t *out) {
    for (int i = 0; i < p->nspatial; i++) {
        int64_t ext = (w->dims[2 + i] - 1) * p->dilations[i] + 1;
        out[i] = (x->dims[2 + i] + p->pads[i] + p->pads[p->nspatial + i] - ext) / p->strides[i] + 1;
    }
}

/* A float operand in the dtypes a call allows: the compute dtype or f32 (reduced precision), else X's own. */
static int conv_dt_ok(eng_dtype dt, eng_dtype compute, eng_dtype xdt) {
    return compute ? dt == ENG_DTYPE_F32 || dt == compute : dt == xdt;
}

/* Whether this file computes call c exactly (compute: F16 / BF16, or UNDEFINED for the tensors' own dtype). */
static int conv_check(const krn_call *c, eng_dtype compute) {
    const krn_conv_params *p = (const krn_conv_params *)c->params;
    if (!p || c->nin < 2 || c->nout < 1 || p->nspatial < 1 || p->nspatial > 3) return 0;
    if (p->x_layout != KRN_NN_LAYOUT_PLAIN || p->y_layout != KRN_NN_LAYOUT_PLAIN || p->group < 1) return 0;
    const eng_tensor *x = &c->in[0], *w = &c->in[1], *y = &c->out[0];
    int nsp = p->nspatial, nd = nsp + 2;
    if (x->ndim != nd || w->ndim != nd || y->ndim != nd) return 0;
    int has_b = dnn_has_in(c, 2), has_z = p->has_residual && dnn_has_in(c, 3);
    if (p->transposed && (p->has_residual || p->pool || p->dw_stride)) return 0;
    if ((p->pool || p->dw_stride) && (nsp != 2 || p->has_residual || (p->pool && p->dw_stride))) return 0;
    const eng_tensor *b = has_b ? &c->in[2] : NULL, *z = has_z ? &c->in[3] : NULL;
    if (!compute && !dnn_is_float(x->dtype)) return 0;
    if (compute && x->dtype != ENG_DTYPE_F32 && x->dtype != compute) return 0;
    if (!conv_dt_ok(y->dtype, compute, x->dtype) || !conv_dt_ok(w->dtype, compute, x->dtype)) return 0;
    if ((b && !conv_dt_ok(b->dtype, compute, x->dtype)) || (z && !conv_dt_ok(z->dtype, compute, x->dtype))) return 0;
    if (z && z->ndim > nd) return 0;
    if (dnn_numel(y) == 0) return 1; /* nothing to compute */
    if (dnn_numel(x) == 0 || dnn_numel(w) == 0) return 0;
    int64_t M = p->transposed ? w->dims[1] * p->group : w->dims[0];
    if (b && dnn_numel(b) != M) return 0;
    if (w->dims[0] % p->group || (!p->transposed && (w->dims[1] * p->group != x->dims[1] || y->dims[1] != M))) return 0;
    if (p->transposed && (w->dims[0] != x->dims[1] || y->dims[1] != M)) return 0;
    dnn_conv_geo g;
    dnn_conv_geo_get(p, nsp, &g);
    int64_t big = 1; /* the larger of the data-side tensor padded or the output computed uncropped */
    for (int i = 0; i < nsp; i++) {
        int64_t ext = (w->dims[2 + i] - 1) * p->dilations[i] + 1;
        if (p->strides[i] < 1 || p->dilations[i] < 1 || w->dims[2 + i] != p->kernel[i] || p->pads[i] < 0 || p->pads[nsp + i] < 0)
            return 0;
        if (p->pads[i] > INT_MAX / 2 || p->pads[nsp + i] > INT_MAX / 2 || p->strides[i] > INT_MAX || p->dilations[i] > INT_MAX)
            return 0;
        if (p->transposed) { /* cuDNN's backward data: a forward conv from Y back to X (kernels/cpu/nn-deconv.c) */
            int64_t v = y->dims[2 + i] + p->pads[i] + p->pads[nsp + i] - ext;
            if (v < 0 || v / p->strides[i] + 1 != x->dims[2 + i]) return 0;
            big *= y->dims[2 + i] + g.lo[i] + g.hi[i];
        } else {
            if (x->dims[2 + i] + p->pads[i] + p->pads[nsp + i] < ext) return 0;
            big *= x->dims[2 + i] + g.lo[i] + g.hi[i];
        }
    }
    big *= x->dims[0] * (p->transposed ? M : x->dims[1]);
    int64_t mid = x->dims[0] * M, od[3] = {0, 0, 0};
    if (!p->transposed) {
        conv_out_dims(p, x, w, od);
        for (int i = 0; i < nsp; i++) {
            mid *= od[i];
            if (!p->pool && !p->dw_stride && od[i] != y->dims[2 + i]) return 0;
        }
    }
    if (p->pool) {
        for (int i = 0; i < 2; i++) {
            if (p->pool_kernel[i] < 1 || p->pool_strides[i] < 1 || od[i] < p->pool_kernel[i]) return 0;
            if ((od[i] - p->pool_kernel[i]) / p->pool_strides[i] + 1 != y->dims[2 + i]) return 0;
        }
    }
    if (p->dw_stride) {
        if (c->nin < 5 || !dnn_has_in(c, 4) || (p->dw_stride != 1 && p->dw_stride != 2)) return 0;
        const eng_tensor *dw = &c->in[4];
        if (dw->ndim != 4 || dw->dims[0] != M || dw->dims[1] != 1 || dw->dims[2] != 3 || dw->dims[3] != 3) return 0;
        if (!conv_dt_ok(dw->dtype, compute, x->dtype)) return 0;
        if (dnn_has_in(c, 5) && (dnn_numel(&c->in[5]) != M || !conv_dt_ok(c->in[5].dtype, compute, x->dtype))) return 0;
        for (int i = 0; i < 2; i++)
            if ((od[i] - 1) / p->dw_stride + 1 != y->dims[2 + i]) return 0;
    }
    return dnn_int_ok(dnn_numel(x)) && dnn_int_ok(dnn_numel(y)) && dnn_int_ok(dnn_numel(w)) && dnn_int_ok(big) && dnn_int_ok(mid);
}

static int conv_supports(const krn_call *c) { return conv_check(c, dnn_compute(c->compute)); }

/* compute_ok (kernel.h): F16 / BF16 on tensor cores with fp32 accumulation; float inputs / outputs f32 or dt. */
static int conv_compute_ok(const krn_call *c, eng_dtype dt) {
    return (dt == ENG_DTYPE_BF16 || dt == ENG_DTYPE_F16) && conv_check(c, dt) && dnn_numel(&c->out[0]) > 0;
}

/* Stage 2: the 3x3 depthwise conv (pads 1, stride dw_stride, group M) from mid to Y, its own algorithm. */
static eng_status conv_dw_build(krn_call *c, conv_state *s, cuda_ctx *x) {
    const krn_conv_params *p = (const krn_conv_params *)c->params;
    const eng_tensor *y = &c->out[0], *dw = &c->in[4];
    krn_conv_params q;
    memset(&q, 0, sizeof q);
    q.nspatial = 2, q.group = s->mid.dims[1];
    for (int i = 0; i < 2; i++) q.kernel[i] = 3, q.strides[i] = p->dw_stride, q.dilations[i] = 1, q.pads[i] = q.pads[2 + i] = 1;
    dnn_conv_geo g;
    dnn_conv_geo_get(&q, 2, &g);
    CUDNN_TRY("conv depthwise descriptors", cudnnCreateTensorDescriptor(&s->od));
    CUDNN_TRY("conv depthwise descriptors", cudnnCreateFilterDescriptor(&s->dwd));
    CUDNN_TRY("conv depthwise descriptors", cudnnCreateConvolutionDescriptor(&s->dcd));
    ENG_TRY(dnn_tensor_desc(s->od, s->cdt, 4, y->dims));
    ENG_TRY(dnn_filter_desc(s->dwd, s->cdt, 4, dw->dims));
    cudnnMathType_t want = dnn_math(s->cdt, x);
    ENG_TRY(dnn_conv_desc(s->dcd, &q, &g, q.group, want));
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int n = 0;
    CUDNN_TRY("conv depthwise algorithm", cudnnGetConvolutionForwardAlgorithm_v7(x->dnn, s->yd, s->dwd, s->dcd, s->od,
                                                                                 CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, perf));
    int k = dnn_choose(perf, n, want, [&](const cudnnConvolutionFwdAlgoPerf_t &pf, cudnnMathType_t m) {
        cudnnStatus_t st = cudnnSetConvolutionMathType(s->dcd, m);
        if (st == CUDNN_STATUS_SUCCESS)
            st = cudnnGetConvolutionForwardWorkspaceSize(x->dnn, s->yd, s->dwd, s->dcd, s->od, pf.algo, &s->dalgo_ws);
        return st;
    });
    if (k < 0) return eng_err(ENG_STATUS_UNSUPPORTED, "conv: cuDNN has no algorithm for the fused depthwise conv (%s)", dnn_dt_name(s->cdt));
    s->dalgo = (int)perf[k].algo;
    s->dmath = dnn_final_math(want, perf[k].mathType);
    s->dydirect = y->dtype == s->cdt;
    s->depi = dnn_has_in(c, 5) || p->dw_act.kind != KRN_NN_ACT_NONE || !s->dydirect;
    if (dw->dtype != s->cdt) s->dwmode = (c->const_mask >> 4) & 1u ? 1 : 2;
    if (s->dwmode == 1) {
        ENG_TRY(cuda_mem_alloc(x->device, (size_t)dnn_numel(dw) * dnn_dt_size(s->cdt), &s->dwpack));
        ENG_TRY(dnn_convert(x, dw->data, dw->dtype, s->dwpack, s->cdt, dnn_numel(dw), "conv depthwise weights"));
    }
    return ENG_STATUS_OK;
}

static eng_status conv_build(krn_call *c, conv_state *s, cuda_ctx *x) {
    const krn_conv_params *p = (const krn_conv_params *)c->params;
    const eng_tensor *xt = &c->in[0], *w = &c->in[1], *y = &c->out[0];
    int nsp = p->nspatial, nd = nsp + 2;
    eng_dtype compute = dnn_compute(c->compute);
    eng_dtype cdt = compute ? compute : xt->dtype;
    s->cdt = cdt;
    s->transposed = p->transposed;
    s->stage = p->pool ? 1 : p->dw_stride ? 2 : 0;
    dnn_conv_geo g;
    dnn_conv_geo_get(p, nsp, &g);
    int has_b = dnn_has_in(c, 2), has_z = p->has_residual && dnn_has_in(c, 3);
    /* the tensors cuDNN sees: forward X' (X padded on the data side) -> Y (or mid); transposed X -> Y' (uncropped) */
    int64_t xdims[5], ydims[5];
    for (int i = 0; i < nd; i++) xdims[i] = xt->dims[i], ydims[i] = y->dims[i];
    if (s->stage) conv_out_dims(p, xt, w, ydims + 2);
    for (int i = 0; i < nsp; i++) {
        if (!p->transposed) xdims[2 + i] += g.lo[i] + g.hi[i];
        else ydims[2 + i] += g.lo[i] + g.hi[i];
    }
    s->xn = s->yn = 1;
    for (int i = 0; i < nd; i++) s->xn *= xdims[i], s->yn *= ydims[i];
    s->wn = dnn_numel(w);
    s->xconv = xt->dtype != cdt || (!p->transposed && g.asym);
    if (s->xconv) {
        s->xwin.planes = xt->dims[0] * xt->dims[1];
        dnn_dims3(xdims + 2, nsp, s->xwin.d);
        dnn_dims3(xt->dims + 2, nsp, s->xwin.s);
        for (int i = 0; i < 3; i++) s->xwin.lo[i] = p->transposed || i < 3 - nsp ? 0 : g.lo[i - (3 - nsp)];
    }
    s->crop = p->transposed && g.asym;
    if (s->crop) {
        s->ywin.planes = y->dims[0] * y->dims[1];
        dnn_dims3(y->dims + 2, nsp, s->ywin.d);
        dnn_dims3(ydims + 2, nsp, s->ywin.s);
        for (int i = 0; i < 3; i++) s->ywin.lo[i] = i < 3 - nsp ? 0 : -g.lo[i - (3 - nsp)];
    }
    if (s->stage) {
        s->mid.dtype = cdt, s->mid.ndim = nd;
        for (int i = 0; i < nd; i++) s->mid.dims[i] = ydims[i];
    }
    s->ydirect = !s->stage && !s->crop && y->dtype == cdt;
    int relu0 = p->act.kind == KRN_NN_ACT_RELU && p->act.alpha == 0.f;
    s->fused = !p->transposed && cdt == ENG_DTYPE_F32 && (s->ydirect || s->stage) && has_b && c->in[2].dtype == ENG_DTYPE_F32 &&
               relu0 && (!has_z || (c->in[3].dtype == ENG_DTYPE_F32 && eng_shape_equal(&c->in[3], y)));
    s->epi = s->stage ? has_b || p->act.kind != KRN_NN_ACT_NONE : has_b || has_z || p->act.kind != KRN_NN_ACT_NONE || !s->ydirect;

    CUDNN_TRY("conv descriptors", cudnnCreateTensorDescriptor(&s->xd));
    CUDNN_TRY("conv descriptors", cudnnCreateTensorDescriptor(&s->yd));
    CUDNN_TRY("conv descriptors", cudnnCreateFilterDescriptor(&s->wd));
    CUDNN_TRY("conv descriptors", cudnnCreateConvolutionDescriptor(&s->cd));
    ENG_TRY(dnn_tensor_desc(s->xd, cdt, nd, xdims));
    ENG_TRY(dnn_tensor_desc(s->yd, cdt, nd, ydims));
    ENG_TRY(dnn_filter_desc(s->wd, cdt, nd, w->dims));
    cudnnMathType_t want = dnn_math(cdt, x);
    ENG_TRY(dnn_conv_desc(s->cd, p, &g, p->group, want));
    if (!p->transposed) {
        cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        int n = 0;
        CUDNN_TRY("conv algorithm", cudnnGetConvolutionForwardAlgorithm_v7(x->dnn, s->xd, s->wd, s->cd, s->yd,
                                                                           CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, perf));
        int k = dnn_choose(perf, n, want, [&](const cudnnConvolutionFwdAlgoPerf_t &pf, cudnnMathType_t m) {
            cudnnStatus_t st = cudnnSetConvolutionMathType(s->cd, m);
            if (st == CUDNN_STATUS_SUCCESS)
                st = cudnnGetConvolutionForwardWorkspaceSize(x->dnn, s->xd, s->wd, s->cd, s->yd, pf.algo, &s->algo_ws);
            return st;
        });
        if (k < 0) return eng_err(ENG_STATUS_UNSUPPORTED, "conv: cuDNN has no forward algorithm for this shape (%s)", dnn_dt_name(cdt));
        s->algo = (int)perf[k].algo;
        s->math = dnn_final_math(want, perf[k].mathType);
    } else {
        cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        int n = 0;
        CUDNN_TRY("conv_transpose algorithm", cudnnGetConvolutionBackwardDataAlgorithm_v7(x->dnn, s->wd, s->xd, s->cd, s->yd,
                                                                                          CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, perf));
        int k = dnn_choose(perf, n, want, [&](const cudnnConvolutionBwdDataAlgoPerf_t &pf, cudnnMathType_t m) {
            cudnnStatus_t st = cudnnSetConvolutionMathType(s->cd, m);
            if (st == CUDNN_STATUS_SUCCESS)
                st = cudnnGetConvolutionBackwardDataWorkspaceSize(x->dnn, s->wd, s->xd, s->cd, s->yd, pf.algo, &s->algo_ws);
            return st;
        });
        if (k < 0) return eng_err(ENG_STATUS_UNSUPPORTED, "conv_transpose: cuDNN has no backward-data algorithm for this shape (%s)", dnn_dt_name(cdt));
        s->algo = (int)perf[k].algo;
        s->math = dnn_final_math(want, perf[k].mathType);
    }
    if (s->fused) {
        int64_t bdims[5] = {1, ydims[1], 1, 1, 1};
        CUDNN_TRY("conv descriptors", cudnnCreateTensorDescriptor(&s->bd));
        CUDNN_TRY("conv descriptors", cudnnCreateActivationDescriptor(&s->ad));
        ENG_TRY(dnn_tensor_desc(s->bd, ENG_DTYPE_F32, nd, bdims));
        CUDNN_TRY("conv activation", cudnnSetActivationDescriptor(s->ad, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
    }
    /* W in cdt: once now when constant, else every exec */
    if (w->dtype != cdt) s->wmode = (c->const_mask >> 1) & 1u ? 1 : 2;
    if (s->wmode == 1) {
        ENG_TRY(cuda_mem_alloc(x->device, (size_t)s->wn * dnn_dt_size(cdt), &s->wpack));
        ENG_TRY(dnn_convert(x, w->data, w->dtype, s->wpack, cdt, s->wn, "conv weights"));
    }
    if (s->stage == 1) {
        dnn_pool_geo *pg = &s->pg;
        memset(pg, 0, sizeof *pg);
        pg->planes = ydims[0] * ydims[1];
        pg->in[0] = pg->out[0] = pg->k[0] = pg->s[0] = pg->d[0] = pg->d[1] = pg->d[2] = 1;
        for (int i = 0; i < 2; i++) {
            pg->in[1 + i] = ydims[2 + i], pg->out[1 + i] = y->dims[2 + i];
            pg->k[1 + i] = p->pool_kernel[i], pg->s[1 + i] = p->pool_strides[i];
        }
        pg->kind = KRN_POOL_MAX, pg->xdt = cdt, pg->ydt = y->dtype, pg->lowest = cdt == ENG_DTYPE_F16 ? -65504.f : -FLT_MAX;
    }
    if (s->stage == 2) ENG_TRY(conv_dw_build(c, s, x));
    const char *st_name = s->stage == 1 ? " +maxpool" : s->stage == 2 ? " +depthwise " : "";
    char dwn[48] = "";
    if (s->stage == 2) snprintf(dwn, sizeof dwn, "%s %s", dnn_name(dnn_fwd_names, 8, s->dalgo), dnn_math_name(s->dmath));
    snprintf(s->desc, sizeof s->desc, "cudnn %s algo %s %s %s%s%s%s%s%s%s",
             p->transposed ? "bwd-data" : "fwd",
             p->transposed ? dnn_name(dnn_bwd_data_names, 6, s->algo) : dnn_name(dnn_fwd_names, 8, s->algo),
             dnn_math_name(s->math), dnn_dt_name(cdt), s->fused ? " +bias+relu fused" : s->epi ? " +epilogue" : "",
             !p->transposed && g.asym ? " +pad(x)" : "", s->crop ? " +crop(y)" : "",
             xt->dtype != cdt ? " +convert(x)" : "", st_name, dwn);
    size_t esz = dnn_dt_size(cdt), off = 0;
    s->off_x = off, off += s->xconv ? dnn_align((size_t)s->xn * esz) : 0;
    s->off_w = off, off += s->wmode == 2 ? dnn_align((size_t)s->wn * esz) : 0;
    s->off_y = off, off += !s->ydirect ? dnn_align((size_t)s->yn * esz) : 0;
    s->off_dw = off, off += s->dwmode == 2 ? dnn_align((size_t)dnn_numel(&c->in[4]) * esz) : 0;
    s->off_dy = off, off += s->stage == 2 && !s->dydirect ? dnn_align((size_t)dnn_numel(y) * esz) : 0;
    s->off_algo = off, off += dnn_align(s->algo_ws > s->dalgo_ws ? s->algo_ws : s->dalgo_ws);
    s->ws_total = off;
    return ENG_STATUS_OK;
}

static eng_status conv_init(krn_call *c) {
    cuda_ctx *x = CUDA_CTX(c);
    if (!x) return eng_err(ENG_STATUS_INTERNAL, "cuda conv: no execution context at init");
    if (!conv_check(c, dnn_compute(c->compute)))
        return eng_err(ENG_STATUS_UNSUPPORTED, "cuda conv: call not supported (dtype %s, compute %s)",
                       eng_dtype_name(c->in[0].dtype), eng_dtype_name(c->compute));
    if (dnn_numel(&c->out[0]) == 0) return ENG_STATUS_OK;
    conv_state *s = (conv_state *)calloc(1, sizeof *s);
    if (!s) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "cuda conv state");
    s->device = x->device;
    eng_status st = conv_build(c, s, x);
    if (st == ENG_STATUS_OK && s->ws_total) {
        void *ws;
        st = cuda_ctx_workspace(x, s->ws_total, &ws); /* grow now, not on the first run */
    }
    if (st != ENG_STATUS_OK) {
        conv_free(s);
        return st;
    }
    c->state = s;
    return ENG_STATUS_OK;
}

/* dst = act(src + bias[channel] + z) in dst's dtype; src (sdt) has dst's shape and may be dst itself; z broadcasts
 * into dst's shape (right-aligned). bias / z may be NULL. */
static eng_status dnn_epilogue_run(cuda_ctx *x, const void *src, eng_dtype sdt, const eng_tensor *dst, const eng_tensor *bias,
                                   const eng_tensor *z, krn_nn_act_params act, const char *what) {
    dnn_epi e;
    memset(&e, 0, sizeof e);
    e.M = dst->dims[1];
    e.planes = dst->dims[0] * dst->dims[1];
    e.S = 1;
    for (int i = 2; i < dst->ndim; i++) e.S *= dst->dims[i];
    e.sdt = sdt, e.ddt = dst->dtype;
    e.bdt = bias ? bias->dtype : ENG_DTYPE_F32;
    e.act = act;
    if (z) {
        e.zdt = z->dtype;
        e.zfull = eng_shape_equal(z, dst);
        e.nd = dst->ndim;
        int64_t acc = 1;
        for (int d = dst->ndim - 1; d >= 0; d--) {
            e.ydims[d] = dst->dims[d];
            int zd = d - (dst->ndim - z->ndim);
            e.zst[d] = zd >= 0 && z->dims[zd] != 1 ? acc : 0;
            if (zd >= 0) acc *= z->dims[zd];
        }
    }
    if (e.planes * e.S == 0) return ENG_STATUS_OK;
    dnn_epilogue_kernel<<<dnn_plane_grid(e.planes, e.S, DNN_THREADS), DNN_THREADS, 0, x->stream>>>(
        src, dst->data, bias ? bias->data : NULL, z ? z->data : NULL, e);
    CUDA_LAUNCHED(what);
    return ENG_STATUS_OK;
}

static eng_status conv_exec(krn_call *c) {
    cuda_ctx *x = CUDA_CTX(c);
    conv_state *s = (conv_state *)c->state;
    if (dnn_numel(&c->out[0]) == 0) return ENG_STATUS_OK;
    if (!s) return eng_err(ENG_STATUS_INTERNAL, "cuda conv: exec without init state");
    const krn_conv_params *p = (const krn_conv_params *)c->params;
    const eng_tensor *xt = &c->in[0], *w = &c->in[1], *y = &c->out[0];
    const eng_tensor *b = dnn_has_in(c, 2) && c->in[2].data ? &c->in[2] : NULL;
    const eng_tensor *z = p->has_residual && dnn_has_in(c, 3) && c->in[3].data ? &c->in[3] : NULL;
    char *ws = NULL;
    if (s->ws_total) ENG_TRY(cuda_ctx_workspace(x, s->ws_total, (void **)&ws));
    const void *xs = xt->data, *wsrc = w->data;
    if (s->xconv) {
        xs = ws + s->off_x;
        if (s->transposed) ENG_TRY(dnn_convert(x, xt->data, xt->dtype, ws + s->off_x, s->cdt, s->xn, "conv_transpose input"));
        else ENG_TRY(dnn_window_run(x, xt->data, xt->dtype, ws + s->off_x, s->cdt, &s->xwin, "conv input pad"));
    }
    if (s->wmode == 1) wsrc = s->wpack;
    if (s->wmode == 2) {
        wsrc = ws + s->off_w;
        ENG_TRY(dnn_convert(x, w->data, w->dtype, ws + s->off_w, s->cdt, s->wn, "conv weights"));
    }
    void *yc = s->ydirect ? y->data : ws + s->off_y;
    void *algo_ws = ws ? ws + s->off_algo : NULL;
    const float one = 1.f, zero = 0.f;
    if (s->transposed) {
        CUDNN_TRY("conv_transpose", cudnnConvolutionBackwardData(x->dnn, &one, s->wd, wsrc, s->xd, xs, s->cd,
                                                                 (cudnnConvolutionBwdDataAlgo_t)s->algo, algo_ws, s->algo_ws,
                                                                 &zero, s->yd, yc));
        if (s->crop) {
            ENG_TRY(dnn_window_run(x, yc, s->cdt, y->data, y->dtype, &s->ywin, "conv_transpose crop"));
            if (!b && p->act.kind == KRN_NN_ACT_NONE) return ENG_STATUS_OK;
            return dnn_epilogue_run(x, y->data, y->dtype, y, b, NULL, p->act, "conv_transpose epilogue");
        }
        return s->epi ? dnn_epilogue_run(x, yc, s->cdt, y, b, NULL, p->act, "conv_transpose epilogue") : ENG_STATUS_OK;
    }
    eng_tensor mid = s->mid;
    mid.data = yc;
    const eng_tensor *c1 = s->stage ? &mid : y; /* the conv's own output */
    int done = 0;
    if (s->fused) {
        const float a2 = z ? 1.f : 0.f;
        cudnnStatus_t st = cudnnConvolutionBiasActivationForward(
            x->dnn, &one, s->xd, xs, s->wd, wsrc, s->cd, (cudnnConvolutionFwdAlgo_t)s->algo, algo_ws, s->algo_ws, &a2, s->yd,
            z ? z->data : yc, s->bd, b ? b->data : NULL, s->ad, s->yd, yc);
        if (st == CUDNN_STATUS_SUCCESS) done = 1;
        else if (st != CUDNN_STATUS_NOT_SUPPORTED)
            return eng_err(ENG_STATUS_INTERNAL, "cuda conv (fused bias+relu): cuDNN %s", cudnnGetErrorString(st));
        else s->fused = 0; /* this algorithm has no fused form here: plain conv and the epilogue from now on */
    }
    if (!done) {
        CUDNN_TRY("conv", cudnnConvolutionForward(x->dnn, &one, s->xd, xs, s->wd, wsrc, s->cd, (cudnnConvolutionFwdAlgo_t)s->algo,
                                                  algo_ws, s->algo_ws, &zero, s->yd, yc));
        if (s->epi) ENG_TRY(dnn_epilogue_run(x, yc, s->stage || !s->ydirect ? s->cdt : y->dtype, c1, b, z, p->act, "conv epilogue"));
    }
    if (s->stage == 1) {
        dnn_pool_kernel<<<dnn_plane_grid(s->pg.planes, s->pg.out[1] * s->pg.out[2], DNN_THREADS), DNN_THREADS, 0, x->stream>>>(
            yc, y->data, NULL, s->pg);
        CUDA_LAUNCHED("conv fused maxpool");
    } else if (s->stage == 2) {
        const eng_tensor *dw = &c->in[4];
        const eng_tensor *db = dnn_has_in(c, 5) && c->in[5].data ? &c->in[5] : NULL;
        const void *dwsrc = s->dwmode == 1 ? s->dwpack : s->dwmode == 2 ? (const void *)(ws + s->off_dw) : dw->data;
        if (s->dwmode == 2) ENG_TRY(dnn_convert(x, dw->data, dw->dtype, ws + s->off_dw, s->cdt, dnn_numel(dw), "conv depthwise weights"));
        void *yd = s->dydirect ? y->data : ws + s->off_dy;
        CUDNN_TRY("conv depthwise", cudnnConvolutionForward(x->dnn, &one, s->yd, yc, s->dwd, dwsrc, s->dcd,
                                                            (cudnnConvolutionFwdAlgo_t)s->dalgo, algo_ws, s->dalgo_ws, &zero,
                                                            s->od, yd));
        if (s->depi) ENG_TRY(dnn_epilogue_run(x, yd, s->cdt, y, db, NULL, p->dw_act, "conv depthwise epilogue"));
    }
    return ENG_STATUS_OK;
}

static void conv_describe(const krn_call *c, krn_impl_info *info) {
    const conv_state *s = (const conv_state *)c->state;
    memset(info, 0, sizeof *info);
    if (!s) {
        krn_str_copy(info->impl, sizeof info->impl, "empty output (nothing to run)");
        return;
    }
    krn_str_copy(info->impl, sizeof info->impl, s->desc);
    info->reorders = s->xconv + (s->wmode == 2) + (s->dwmode == 2) + s->crop;
}

/* ================================================================ ConvGrad (dy, x, w) -> dx, dw, db */

typedef struct cg_state {
    int device;
    eng_dtype cdt;
    cudnnTensorDescriptor_t xd, dyd;    /* X' (X padded on the data side) and dY, in cdt */
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cdd, cdf; /* backward data / backward filter (each with its own math type) */
    int want_dx, want_dw, want_db;
    int algo_d, algo_f;
    cudnnMathType_t math_d, math_f;
    size_t ws_d, ws_f;
    int dyconv, wconv, xconv;            /* operands converted (X also padded) into the workspace */
    dnn_window xwin, dxwin;              /* X -> X'; dX' -> dX (crop) */
    int dxdirect, dwdirect;              /* cuDNN writes dX / dW themselves */
    int64_t xn, dyn, wn;                 /* elements of X', dY, W */
    size_t off_x, off_dy, off_w, off_dx, off_dw, off_algo, ws_total;
    char desc[192];
} cg_state;

static void cg_free(void *v) {
    cg_state *s = (cg_state *)v;
    if (!s) return;
    if (s->xd) cudnnDestroyTensorDescriptor(s->xd);
    if (s->dyd) cudnnDestroyTensorDescriptor(s->dyd);
    if (s->wd) cudnnDestroyFilterDescriptor(s->wd);
    if (s->cdd) cudnnDestroyConvolutionDescriptor(s->cdd);
    if (s->cdf) cudnnDestroyConvolutionDescriptor(s->cdf);
    free(s);
}

static int cg_check(const krn_call *c, eng_dtype compute) {
    const krn_conv_grad_params *gp = (const krn_conv_grad_params *)c->params;
    if (!gp || c->nin != 3) return 0;
    const krn_conv_params *p = &gp->conv;
    if (p->x_layout || p->y_layout) return 0;
    const eng_tensor *dy = &c->in[0], *x = &c->in[1], *w = &c->in[2];
    int nsp = x->ndim - 2;
    if (nsp < 1 || nsp > 3 || dy->ndim != x->ndim || w->ndim != x->ndim) return 0;
    for (int i = 0; i < 3; i++) {
        eng_dtype dt = c->in[i].dtype;
        if (compute ? dt != ENG_DTYPE_F32 && dt != compute : dt != ENG_DTYPE_F32) return 0;
        if (dnn_numel(&c->in[i]) == 0 || !dnn_int_ok(dnn_numel(&c->in[i]))) return 0;
    }
    for (int i = 0; i < c->nout && i < 3; i++) {
        if (!dnn_has_out(c, i)) continue;
        eng_dtype dt = c->out[i].dtype;
        if (i == 0 ? (compute ? dt != ENG_DTYPE_F32 && dt != compute : dt != ENG_DTYPE_F32) : dt != ENG_DTYPE_F32) return 0;
    }
    if (c->nout > 3) return 0;
    int64_t G = p->group > 0 ? p->group : 1;
    if (x->dims[1] % G || w->dims[0] % G || w->dims[1] * G != x->dims[1] || dy->dims[1] != w->dims[0] || dy->dims[0] != x->dims[0])
        return 0;
    dnn_conv_geo g;
    dnn_conv_geo_get(p, nsp, &g);
    int64_t big = x->dims[0] * x->dims[1];
    for (int i = 0; i < nsp; i++) {
        int64_t ext = (w->dims[2 + i] - 1) * p->dilations[i] + 1, in = x->dims[2 + i] + p->pads[i] + p->pads[nsp + i];
        if (p->strides[i] < 1 || p->dilations[i] < 1 || p->pads[i] < 0 || p->pads[nsp + i] < 0) return 0;
        if (in < ext || (in - ext) / p->strides[i] + 1 != dy->dims[2 + i]) return 0;
        big *= x->dims[2 + i] + g.lo[i] + g.hi[i];
    }
    return dnn_int_ok(big);
}

static int cg_supports(const krn_call *c) { return cg_check(c, dnn_compute(c->compute)); }
static int cg_compute_ok(const krn_call *c, eng_dtype dt) { return (dt == ENG_DTYPE_BF16 || dt == ENG_DTYPE_F16) && cg_check(c, dt); }

static eng_status cg_build(krn_call *c, cg_state *s, cuda_ctx *x) {
    const krn_conv_params *p = &((const krn_conv_grad_params *)c->params)->conv;
    const eng_tensor *dy = &c->in[0], *xt = &c->in[1], *w = &c->in[2];
    int nsp = xt->ndim - 2, nd = xt->ndim;
    eng_dtype compute = dnn_compute(c->compute), cdt = compute ? compute : ENG_DTYPE_F32;
    s->cdt = cdt;
    s->want_dx = dnn_has_out(c, 0), s->want_dw = dnn_has_out(c, 1), s->want_db = dnn_has_out(c, 2);
    dnn_conv_geo g;
    dnn_conv_geo_get(p, nsp, &g);
    int64_t G = p->group > 0 ? p->group : 1, xdims[5];
    for (int i = 0; i < nd; i++) xdims[i] = xt->dims[i];
    for (int i = 0; i < nsp; i++) xdims[2 + i] += g.lo[i] + g.hi[i];
    s->xn = 1;
    for (int i = 0; i < nd; i++) s->xn *= xdims[i];
    s->dyn = dnn_numel(dy), s->wn = dnn_numel(w);
    s->dyconv = (s->want_dx || s->want_dw) && dy->dtype != cdt;
    s->wconv = s->want_dx && w->dtype != cdt;
    s->xconv = s->want_dw && (xt->dtype != cdt || g.asym);
    s->dxdirect = s->want_dx && !g.asym && c->out[0].dtype == cdt;
    s->dwdirect = s->want_dw && cdt == ENG_DTYPE_F32;
    s->xwin.planes = s->dxwin.planes = xt->dims[0] * xt->dims[1];
    dnn_dims3(xdims + 2, nsp, s->xwin.d);
    dnn_dims3(xt->dims + 2, nsp, s->xwin.s);
    dnn_dims3(xt->dims + 2, nsp, s->dxwin.d);
    dnn_dims3(xdims + 2, nsp, s->dxwin.s);
    for (int i = 0; i < 3; i++) {
        s->xwin.lo[i] = i < 3 - nsp ? 0 : g.lo[i - (3 - nsp)];
        s->dxwin.lo[i] = -s->xwin.lo[i];
    }
    CUDNN_TRY("conv grad descriptors", cudnnCreateTensorDescriptor(&s->xd));
    CUDNN_TRY("conv grad descriptors", cudnnCreateTensorDescriptor(&s->dyd));
    CUDNN_TRY("conv grad descriptors", cudnnCreateFilterDescriptor(&s->wd));
    CUDNN_TRY("conv grad descriptors", cudnnCreateConvolutionDescriptor(&s->cdd));
    CUDNN_TRY("conv grad descriptors", cudnnCreateConvolutionDescriptor(&s->cdf));
    ENG_TRY(dnn_tensor_desc(s->xd, cdt, nd, xdims));
    ENG_TRY(dnn_tensor_desc(s->dyd, cdt, nd, dy->dims));
    ENG_TRY(dnn_filter_desc(s->wd, cdt, nd, w->dims));
    cudnnMathType_t want = dnn_math(cdt, x);
    ENG_TRY(dnn_conv_desc(s->cdd, p, &g, G, want));
    ENG_TRY(dnn_conv_desc(s->cdf, p, &g, G, want));
    char dd[64] = "", df[64] = "";
    if (s->want_dx) {
        cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        int n = 0;
        CUDNN_TRY("conv grad data algorithm", cudnnGetConvolutionBackwardDataAlgorithm_v7(x->dnn, s->wd, s->dyd, s->cdd, s->xd,
                                                                                          CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, perf));
        int k = dnn_choose(perf, n, want, [&](const cudnnConvolutionBwdDataAlgoPerf_t &pf, cudnnMathType_t m) {
            cudnnStatus_t st = cudnnSetConvolutionMathType(s->cdd, m);
            if (st == CUDNN_STATUS_SUCCESS)
                st = cudnnGetConvolutionBackwardDataWorkspaceSize(x->dnn, s->wd, s->dyd, s->cdd, s->xd, pf.algo, &s->ws_d);
            return st;
        });
        if (k < 0) return eng_err(ENG_STATUS_UNSUPPORTED, "conv grad: cuDNN has no backward-data algorithm (%s)", dnn_dt_name(cdt));
        s->algo_d = (int)perf[k].algo;
        s->math_d = dnn_final_math(want, perf[k].mathType);
        snprintf(dd, sizeof dd, " dx %s %s", dnn_name(dnn_bwd_data_names, 6, s->algo_d), dnn_math_name(s->math_d));
    }
    if (s->want_dw) {
        cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        int n = 0;
        CUDNN_TRY("conv grad filter algorithm", cudnnGetConvolutionBackwardFilterAlgorithm_v7(x->dnn, s->xd, s->dyd, s->cdf, s->wd,
                                                                                              CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf));
        int k = dnn_choose(perf, n, want, [&](const cudnnConvolutionBwdFilterAlgoPerf_t &pf, cudnnMathType_t m) {
            cudnnStatus_t st = cudnnSetConvolutionMathType(s->cdf, m);
            if (st == CUDNN_STATUS_SUCCESS)
                st = cudnnGetConvolutionBackwardFilterWorkspaceSize(x->dnn, s->xd, s->dyd, s->cdf, s->wd, pf.algo, &s->ws_f);
            return st;
        });
        if (k < 0) return eng_err(ENG_STATUS_UNSUPPORTED, "conv grad: cuDNN has no backward-filter algorithm (%s)", dnn_dt_name(cdt));
        s->algo_f = (int)perf[k].algo;
        s->math_f = dnn_final_math(want, perf[k].mathType);
        snprintf(df, sizeof df, " dw %s %s", dnn_name(dnn_bwd_filter_names, 7, s->algo_f), dnn_math_name(s->math_f));
    }
    snprintf(s->desc, sizeof s->desc, "cudnn bwd%s%s%s %s%s", dd, df, s->want_db ? " db tensord" : "", dnn_dt_name(cdt),
             g.asym ? " +pad/crop" : "");
    size_t esz = dnn_dt_size(cdt), off = 0;
    s->off_x = off, off += s->xconv ? dnn_align((size_t)s->xn * esz) : 0;
    s->off_dy = off, off += s->dyconv ? dnn_align((size_t)s->dyn * esz) : 0;
    s->off_w = off, off += s->wconv ? dnn_align((size_t)s->wn * esz) : 0;
    s->off_dx = off, off += s->want_dx && !s->dxdirect ? dnn_align((size_t)s->xn * esz) : 0;
    s->off_dw = off, off += s->want_dw && !s->dwdirect ? dnn_align((size_t)s->wn * esz) : 0;
    s->off_algo = off, off += dnn_align(s->ws_d > s->ws_f ? s->ws_d : s->ws_f);
    s->ws_total = off;
    return ENG_STATUS_OK;
}

static eng_status cg_init(krn_call *c) {
    cuda_ctx *x = CUDA_CTX(c);
    if (!x) return eng_err(ENG_STATUS_INTERNAL, "cuda grad_conv: no execution context at init");
    if (!cg_check(c, dnn_compute(c->compute)))
        return eng_err(ENG_STATUS_UNSUPPORTED, "cuda grad_conv: call not supported (dtype %s, compute %s)",
                       eng_dtype_name(c->in[0].dtype), eng_dtype_name(c->compute));
    cg_state *s = (cg_state *)calloc(1, sizeof *s);
    if (!s) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "cuda grad_conv state");
    s->device = x->device;
    eng_status st = cg_build(c, s, x);
    if (st == ENG_STATUS_OK && s->ws_total) {
        void *ws;
        st = cuda_ctx_workspace(x, s->ws_total, &ws);
    }
    if (st != ENG_STATUS_OK) {
        cg_free(s);
        return st;
    }
    c->state = s;
    return ENG_STATUS_OK;
}

static eng_status cg_exec(krn_call *c) {
    cuda_ctx *x = CUDA_CTX(c);
    cg_state *s = (cg_state *)c->state;
    if (!s) return eng_err(ENG_STATUS_INTERNAL, "cuda grad_conv: exec without init state");
    const eng_tensor *dy = &c->in[0], *xt = &c->in[1], *w = &c->in[2];
    void *dx = s->want_dx ? c->out[0].data : NULL, *dw = s->want_dw ? c->out[1].data : NULL;
    void *db = s->want_db ? c->out[2].data : NULL;
    char *ws = NULL;
    if (s->ws_total) ENG_TRY(cuda_ctx_workspace(x, s->ws_total, (void **)&ws));
    void *algo_ws = ws ? ws + s->off_algo : NULL;
    const float one = 1.f, zero = 0.f;
    const void *dys = dy->data;
    if (s->dyconv && (dx || dw)) {
        dys = ws + s->off_dy;
        ENG_TRY(dnn_convert(x, dy->data, dy->dtype, ws + s->off_dy, s->cdt, s->dyn, "conv grad dy"));
    }
    if (dx) {
        const void *wsrc = w->data;
        if (s->wconv) {
            wsrc = ws + s->off_w;
            ENG_TRY(dnn_convert(x, w->data, w->dtype, ws + s->off_w, s->cdt, s->wn, "conv grad w"));
        }
        void *dxc = s->dxdirect ? dx : ws + s->off_dx;
        CUDNN_TRY("conv grad data", cudnnConvolutionBackwardData(x->dnn, &one, s->wd, wsrc, s->dyd, dys, s->cdd,
                                                                 (cudnnConvolutionBwdDataAlgo_t)s->algo_d, algo_ws, s->ws_d, &zero,
                                                                 s->xd, dxc));
        if (!s->dxdirect) ENG_TRY(dnn_window_run(x, dxc, s->cdt, dx, c->out[0].dtype, &s->dxwin, "conv grad dx crop"));
    }
    if (dw) {
        const void *xs = xt->data;
        if (s->xconv) {
            xs = ws + s->off_x;
            ENG_TRY(dnn_window_run(x, xt->data, xt->dtype, ws + s->off_x, s->cdt, &s->xwin, "conv grad x pad"));
        }
        void *dwc = s->dwdirect ? dw : ws + s->off_dw;
        CUDNN_TRY("conv grad filter", cudnnConvolutionBackwardFilter(x->dnn, &one, s->xd, xs, s->dyd, dys, s->cdf,
                                                                     (cudnnConvolutionBwdFilterAlgo_t)s->algo_f, algo_ws, s->ws_f,
                                                                     &zero, s->wd, dwc));
        if (!s->dwdirect) ENG_TRY(dnn_convert(x, dwc, s->cdt, dw, ENG_DTYPE_F32, s->wn, "conv grad dw"));
    }
    if (db) {
        int64_t N = dy->dims[0], M = dy->dims[1], S = 1;
        for (int i = 2; i < dy->ndim; i++) S *= dy->dims[i];
        dnn_bias_grad_kernel<<<(unsigned)(M < 65535 ? M : 65535), DNN_THREADS, 0, x->stream>>>(dy->data, dy->dtype, (float *)db, N, M, S);
        CUDA_LAUNCHED("conv grad db");
    }
    return ENG_STATUS_OK;
}

static void cg_describe(const krn_call *c, krn_impl_info *info) {
    const cg_state *s = (const cg_state *)c->state;
    memset(info, 0, sizeof *info);
    if (!s) return;
    krn_str_copy(info->impl, sizeof info->impl, s->desc);
    info->reorders = s->dyconv + s->wconv + s->xconv + (s->want_dx && !s->dxdirect) + (s->want_dw && !s->dwdirect);
}

/* ================================================================ pooling */

static void pool_geo_fill(const krn_pool_params *p, const eng_tensor *x, const eng_tensor *y, dnn_pool_geo *g) {
    int nsp = p->nspatial, off = 3 - nsp;
    memset(g, 0, sizeof *g);
    g->planes = x->dims[0] * x->dims[1];
    for (int i = 0; i < 3; i++) g->in[i] = g->out[i] = g->k[i] = g->s[i] = g->d[i] = 1;
    for (int i = 0; i < nsp; i++) {
        g->in[off + i] = x->dims[2 + i];
        g->out[off + i] = y->dims[2 + i];
        if (p->global) {
            g->k[off + i] = x->dims[2 + i];
            continue;
        }
        g->k[off + i] = p->kernel[i];
        g->s[off + i] = p->strides[i] > 0 ? p->strides[i] : 1;
        g->d[off + i] = p->dilations[i] > 0 ? p->dilations[i] : 1;
        g->pb[off + i] = p->pads[i];
        g->pe[off + i] = p->pads[nsp + i];
    }
    g->kind = p->kind, g->cip = p->count_include_pad, g->colmaj = p->storage_order == 1, g->p = p->p;
    g->xdt = x->dtype, g->ydt = y->dtype;
    g->lowest = x->dtype == ENG_DTYPE_F16 ? -65504.f : x->dtype == ENG_DTYPE_I8 ? -128.f : x->dtype == ENG_DTYPE_U8 ? 0.f : -FLT_MAX;
}

static int pool_check(const krn_call *c, int any_float_io) {
    const krn_pool_params *p = (const krn_pool_params *)c->params;
    if (!p || c->nin < 1 || c->nout < 1 || p->nspatial < 1 || p->nspatial > 3) return 0;
    if (p->x_layout != KRN_NN_LAYOUT_PLAIN || p->y_layout != KRN_NN_LAYOUT_PLAIN) return 0;
    const eng_tensor *x = &c->in[0], *y = &c->out[0];
    if (x->ndim != p->nspatial + 2 || y->ndim != x->ndim || x->dims[0] != y->dims[0] || x->dims[1] != y->dims[1]) return 0;
    if (p->kind != KRN_POOL_MAX && p->kind != KRN_POOL_AVG && p->kind != KRN_POOL_LP) return 0;
    if (p->kind == KRN_POOL_LP && !(p->p > 0.f)) return 0;
    int xi = x->dtype == ENG_DTYPE_I8 || x->dtype == ENG_DTYPE_U8;
    if (xi) {
        if (p->kind != KRN_POOL_MAX || y->dtype != x->dtype) return 0;
    } else if (!dnn_is_float(x->dtype) || !dnn_is_float(y->dtype) || (!any_float_io && y->dtype != x->dtype)) {
        return 0;
    }
    if (dnn_has_out(c, 1) && (p->kind != KRN_POOL_MAX || c->out[1].dtype != ENG_DTYPE_I64 || !eng_shape_equal(&c->out[1], y)))
        return 0;
    return c->nout <= 2;
}

/* Mixed float dtypes in and out are what io_ok grants; without it, X and Y share a dtype. */
static int pool_supports(const krn_call *c) { return pool_check(c, 1); }

static int pool_io_ok(const krn_call *c, eng_dtype dt) {
    return (dt == ENG_DTYPE_BF16 || dt == ENG_DTYPE_F16) && pool_check(c, 1) && dnn_is_float(c->in[0].dtype) ? 2 : 0;
}

static eng_status pool_exec(krn_call *c) {
    cuda_ctx *x = CUDA_CTX(c);
    const krn_pool_params *p = (const krn_pool_params *)c->params;
    const eng_tensor *xt = &c->in[0], *y = &c->out[0];
    int64_t *I = dnn_has_out(c, 1) ? (int64_t *)c->out[1].data : NULL;
    if (dnn_numel(y) == 0) return ENG_STATUS_OK;
    dnn_pool_geo g;
    pool_geo_fill(p, xt, y, &g);
    int64_t S = g.in[0] * g.in[1] * g.in[2];
    if (p->global && !I) {
        if (S == 0) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "cuda pool: global pool over an empty plane");
        unsigned blocks = (unsigned)(g.planes < 65535 ? g.planes : 65535);
        dnn_global_pool_kernel<<<blocks, DNN_THREADS, 0, x->stream>>>(xt->data, y->data, g.planes, S, p->kind, p->p, xt->dtype, y->dtype);
        CUDA_LAUNCHED("global pool");
        return ENG_STATUS_OK;
    }
    int64_t osz = g.out[0] * g.out[1] * g.out[2];
    dnn_pool_kernel<<<dnn_plane_grid(g.planes, osz, DNN_THREADS), DNN_THREADS, 0, x->stream>>>(xt->data, y->data, I, g);
    CUDA_LAUNCHED("pool");
    return ENG_STATUS_OK;
}

static void pool_describe(const krn_call *c, krn_impl_info *info) {
    const krn_pool_params *p = (const krn_pool_params *)c->params;
    memset(info, 0, sizeof *info);
    krn_str_copy(info->impl, sizeof info->impl, p && p->global && !dnn_has_out(c, 1) ? "tensord cuda global pool (block per plane)"
                                                                                     : "tensord cuda pool (thread per output)");
}

/* ---- pool gradient (dy, x) -> dx, float32 ---- */

static int grad_pool_supports(const krn_call *c) {
    const krn_pool_grad_params *gp = (const krn_pool_grad_params *)c->params;
    if (!gp || c->nin < 2 || c->nout < 1) return 0;
    const krn_pool_params *p = &gp->pool;
    const eng_tensor *dy = &c->in[0], *x = &c->in[1], *dx = &c->out[0];
    int nsp = x->ndim - 2;
    if (nsp < 1 || nsp > 3 || p->nspatial != nsp || dy->ndim != x->ndim || !eng_shape_equal(dx, x)) return 0;
    if (p->kind != KRN_POOL_MAX && p->kind != KRN_POOL_AVG) return 0;
    if (p->x_layout != KRN_NN_LAYOUT_PLAIN || p->y_layout != KRN_NN_LAYOUT_PLAIN) return 0;
    return dy->dtype == ENG_DTYPE_F32 && x->dtype == ENG_DTYPE_F32 && dx->dtype == ENG_DTYPE_F32 && dy->dims[0] == x->dims[0] &&
           dy->dims[1] == x->dims[1];
}

static eng_status grad_pool_exec(krn_call *c) {
    cuda_ctx *x = CUDA_CTX(c);
    const krn_pool_grad_params *gp = (const krn_pool_grad_params *)c->params;
    const krn_pool_params *p = &gp->pool;
    const eng_tensor *dy = &c->in[0], *xt = &c->in[1];
    eng_tensor *dx = &c->out[0];
    int64_t n = dnn_numel(dx);
    if (n == 0) return ENG_STATUS_OK;
    dnn_pool_geo g;
    pool_geo_fill(p, xt, dy, &g);
    int mx = p->kind == KRN_POOL_MAX, relu = mx && gp->relu;
    if (p->global) {
        int64_t S = g.in[0] * g.in[1] * g.in[2];
        unsigned blocks = (unsigned)(g.planes < 65535 ? g.planes : 65535);
        dnn_global_pool_grad_kernel<<<blocks, DNN_THREADS, 0, x->stream>>>((const float *)dy->data, (const float *)xt->data,
                                                                           (float *)dx->data, g.planes, S, mx, relu);
        CUDA_LAUNCHED("global pool grad");
        return ENG_STATUS_OK;
    }
    CUDA_TRY("pool grad zero", cudaMemsetAsync(dx->data, 0, (size_t)n * sizeof(float), x->stream));
    int64_t osz = g.out[0] * g.out[1] * g.out[2];
    if (osz * g.planes == 0) return ENG_STATUS_OK;
    dnn_pool_grad_kernel<<<dnn_plane_grid(g.planes, osz, DNN_THREADS), DNN_THREADS, 0, x->stream>>>(
        (const float *)dy->data, (const float *)xt->data, (float *)dx->data, g, relu);
    CUDA_LAUNCHED("pool grad");
    return ENG_STATUS_OK;
}

/* ================================================================ BatchNormalization */

typedef struct bn_state {
    int device;
    int64_t np;
    float *ab; /* folded a, b (2 * np) when scale/B/mean/var are constant (inference) */
} bn_state;

static void bn_free(void *v) {
    bn_state *s = (bn_state *)v;
    if (!s) return;
    if (s->ab) cuda_mem_free(s->device, s->ab);
    free(s);
}

static int bn_check(const krn_call *c) {
    const krn_batchnorm_params *p = (const krn_batchnorm_params *)c->params;
    if (!p || c->nin < 5 || c->nout < 1) return 0;
    const eng_tensor *x = &c->in[0], *y = &c->out[0];
    if (x->ndim < 2 || !dnn_is_float(x->dtype) || !dnn_is_float(y->dtype) || !eng_shape_equal(x, y)) return 0;
    if (p->n != x->dims[0] || p->c != x->dims[1] || p->n * p->c * p->spatial_size != dnn_numel(x)) return 0;
    int64_t np = dnn_numel(&c->in[1]);
    for (int i = 1; i < 5; i++)
        if (!dnn_is_float(c->in[i].dtype) || !c->in[i].dtype || dnn_numel(&c->in[i]) != np) return 0;
    if (p->training) {
        if (np != p->c) return 0;
        for (int j = 1; j < c->nout; j++)
            if (dnn_has_out(c, j) && (!dnn_is_float(c->out[j].dtype) || dnn_numel(&c->out[j]) != p->c || j > 4)) return 0;
    } else if (np != p->c && np != p->c * p->spatial_size) {
        return 0;
    }
    return 1;
}

static int bn_io_ok(const krn_call *c, eng_dtype dt) { return (dt == ENG_DTYPE_BF16 || dt == ENG_DTYPE_F16) && bn_check(c) ? 2 : 0; }

static eng_status bn_fold_run(cuda_ctx *x, const krn_call *c, float eps, int64_t np, float *ab) {
    dnn_bn_fold_kernel<<<cuda_grid(np, DNN_THREADS), DNN_THREADS, 0, x->stream>>>(
        c->in[1].data, c->in[2].data, c->in[3].data, c->in[4].data, c->in[1].dtype, c->in[2].dtype, c->in[3].dtype,
        c->in[4].dtype, eps, np, ab);
    CUDA_LAUNCHED("batchnorm fold");
    return ENG_STATUS_OK;
}

static eng_status bn_init(krn_call *c) {
    const krn_batchnorm_params *p = (const krn_batchnorm_params *)c->params;
    cuda_ctx *x = CUDA_CTX(c);
    if (!bn_check(c)) return eng_err(ENG_STATUS_UNSUPPORTED, "cuda batchnorm: call not supported (dtype %s)", eng_dtype_name(c->in[0].dtype));
    if (!x || p->training || (c->const_mask & 0x1eu) != 0x1eu) return ENG_STATUS_OK;
    bn_state *s = (bn_state *)calloc(1, sizeof *s);
    if (!s) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "cuda batchnorm state");
    s->device = x->device;
    s->np = dnn_numel(&c->in[1]);
    eng_status st = cuda_mem_alloc(x->device, (size_t)(2 * s->np > 0 ? 2 * s->np : 1) * sizeof(float), (void **)&s->ab);
    if (st == ENG_STATUS_OK && s->np > 0) st = bn_fold_run(x, c, p->epsilon, s->np, s->ab);
    if (st != ENG_STATUS_OK) {
        bn_free(s);
        return st;
    }
    c->state = s;
    return ENG_STATUS_OK;
}

static eng_status bn_exec(krn_call *c) {
    const krn_batchnorm_params *p = (const krn_batchnorm_params *)c->params;
    cuda_ctx *x = CUDA_CTX(c);
    bn_state *s = (bn_state *)c->state;
    int64_t np = dnn_numel(&c->in[1]), N = p->n, C = p->c, S = p->spatial_size;
    float *ab = s ? s->ab : NULL;
    if (!ab) {
        ENG_TRY(cuda_ctx_workspace(x, (size_t)(2 * np > 0 ? 2 * np : 1) * sizeof(float), (void **)&ab));
        if (p->training) {
            dnn_bn_train t;
            memset(&t, 0, sizeof t);
            t.x = c->in[0].data, t.scale = c->in[1].data, t.bias = c->in[2].data, t.rmean = c->in[3].data, t.rvar = c->in[4].data;
            t.xdt = c->in[0].dtype, t.sdt = c->in[1].dtype, t.bdt = c->in[2].dtype, t.mdt = c->in[3].dtype, t.vdt = c->in[4].dtype;
            for (int j = 1; j < c->nout && j < 5; j++)
                if (dnn_has_out(c, j)) t.out[j] = c->out[j].data, t.odt[j] = c->out[j].dtype;
            t.eps = p->epsilon, t.momentum = p->momentum, t.N = N, t.C = C, t.S = S;
            if (C > 0) {
                dnn_bn_train_stats_kernel<<<(unsigned)(C < 65535 ? C : 65535), 512, 0, x->stream>>>(t, ab);
                CUDA_LAUNCHED("batchnorm statistics");
            }
        } else if (np > 0) {
            ENG_TRY(bn_fold_run(x, c, p->epsilon, np, ab));
        }
    }
    if (N * C * S == 0) return ENG_STATUS_OK;
    dnn_bn_apply_kernel<<<dnn_plane_grid(N * C, S, DNN_THREADS), DNN_THREADS, 0, x->stream>>>(
        c->in[0].data, c->in[0].dtype, c->out[0].data, c->out[0].dtype, ab, np, N * C, C, S);
    CUDA_LAUNCHED("batchnorm");
    return ENG_STATUS_OK;
}

static void bn_describe(const krn_call *c, krn_impl_info *info) {
    memset(info, 0, sizeof *info);
    const krn_batchnorm_params *p = (const krn_batchnorm_params *)c->params;
    krn_str_copy(info->impl, sizeof info->impl, p && p->training ? "tensord cuda batchnorm (batch statistics, block per channel)"
                                                                 : c->state ? "tensord cuda batchnorm (folded once)"
                                                                            : "tensord cuda batchnorm (folded per run)");
}

/* ---- BatchNormalizationGrad (dy, x, scale, mean, var) -> dx, dscale, dB, float32 ---- */

static int grad_bn_supports(const krn_call *c) {
    const krn_bn_grad_params *p = (const krn_bn_grad_params *)c->params;
    if (!p || c->nin < 5 || c->nout < 1 || c->nout > 3) return 0;
    const eng_tensor *dy = &c->in[0], *x = &c->in[1];
    if (x->ndim < 2 || !eng_shape_equal(dy, x)) return 0;
    for (int i = 0; i < 5; i++)
        if (c->in[i].dtype != ENG_DTYPE_F32) return 0;
    for (int i = 2; i < 5; i++)
        if (dnn_numel(&c->in[i]) != x->dims[1]) return 0;
    if (c->out[0].dtype != ENG_DTYPE_F32 || !eng_shape_equal(&c->out[0], x)) return 0;
    for (int i = 1; i < c->nout; i++)
        if (dnn_has_out(c, i) && (c->out[i].dtype != ENG_DTYPE_F32 || dnn_numel(&c->out[i]) != x->dims[1])) return 0;
    return 1;
}

static eng_status grad_bn_exec(krn_call *c) {
    const krn_bn_grad_params *p = (const krn_bn_grad_params *)c->params;
    cuda_ctx *x = CUDA_CTX(c);
    const eng_tensor *xt = &c->in[1];
    int64_t N = xt->dims[0], C = xt->dims[1], S = 1;
    for (int i = 2; i < xt->ndim; i++) S *= xt->dims[i];
    if (C == 0) return ENG_STATUS_OK;
    float *ds = dnn_has_out(c, 1) ? (float *)c->out[1].data : NULL, *db = dnn_has_out(c, 2) ? (float *)c->out[2].data : NULL;
    dnn_bn_grad_kernel<<<(unsigned)(C < 65535 ? C : 65535), 512, 0, x->stream>>>(
        (const float *)c->in[0].data, (const float *)xt->data, (const float *)c->in[2].data, (const float *)c->in[3].data,
        (const float *)c->in[4].data, (float *)c->out[0].data, ds, db, N, C, S, p->epsilon, p->training);
    CUDA_LAUNCHED("batchnorm grad");
    return ENG_STATUS_OK;
}

/* ================================================================ LRN */

static int lrn_check(const krn_call *c) {
    const krn_lrn_params *p = (const krn_lrn_params *)c->params;
    if (!p || c->nin < 1 || c->nout < 1 || p->size < 1) return 0;
    const eng_tensor *x = &c->in[0], *y = &c->out[0];
    return x->ndim >= 2 && dnn_is_float(x->dtype) && dnn_is_float(y->dtype) && eng_shape_equal(x, y);
}

static int lrn_io_ok(const krn_call *c, eng_dtype dt) { return (dt == ENG_DTYPE_BF16 || dt == ENG_DTYPE_F16) && lrn_check(c) ? 2 : 0; }

static eng_status lrn_exec(krn_call *c) {
    const krn_lrn_params *p = (const krn_lrn_params *)c->params;
    cuda_ctx *x = CUDA_CTX(c);
    const eng_tensor *xt = &c->in[0];
    int64_t N = xt->dims[0], C = xt->dims[1], S = 1;
    for (int i = 2; i < xt->ndim; i++) S *= xt->dims[i];
    if (N * C * S == 0) return ENG_STATUS_OK;
    int64_t lo = (p->size - 1) / 2, hi = p->size - 1 - lo;
    float k = (float)((double)p->alpha / (double)p->size);
    dnn_lrn_kernel<<<dnn_plane_grid(N * C, S, DNN_THREADS), DNN_THREADS, 0, x->stream>>>(
        xt->data, xt->dtype, c->out[0].data, c->out[0].dtype, N, C, S, lo, hi, k, p->bias, p->beta);
    CUDA_LAUNCHED("lrn");
    return ENG_STATUS_OK;
}

static void simple_describe(const krn_call *c, krn_impl_info *info) {
    (void)c;
    memset(info, 0, sizeof *info);
    krn_str_copy(info->impl, sizeof info->impl, "tensord cuda kernel");
}

extern "C" const krn_kernel krn_cuda_dnn_kernels[] = {
    {.name = "conv", .init = conv_init, .exec = conv_exec, .free_state = conv_free, .describe = conv_describe,
     .compute_ok = conv_compute_ok, .io_ok = NULL, .supports = conv_supports},
    {.name = "conv_transpose", .init = conv_init, .exec = conv_exec, .free_state = conv_free, .describe = conv_describe,
     .compute_ok = conv_compute_ok, .io_ok = NULL, .supports = conv_supports},
    {.name = "pool", .init = NULL, .exec = pool_exec, .free_state = NULL, .describe = pool_describe, .compute_ok = NULL,
     .io_ok = pool_io_ok, .supports = pool_supports},
    {.name = "batchnorm", .init = bn_init, .exec = bn_exec, .free_state = bn_free, .describe = bn_describe, .compute_ok = NULL,
     .io_ok = bn_io_ok, .supports = bn_check},
    {.name = "lrn", .init = NULL, .exec = lrn_exec, .free_state = NULL, .describe = simple_describe, .compute_ok = NULL,
     .io_ok = lrn_io_ok, .supports = lrn_check},
    {.name = "grad_conv", .init = cg_init, .exec = cg_exec, .free_state = cg_free, .describe = cg_describe,
     .compute_ok = cg_compute_ok, .io_ok = NULL, .supports = cg_supports},
    {.name = "grad_pool", .init = NULL, .exec = grad_pool_exec, .free_state = NULL, .describe = simple_describe,
     .compute_ok = NULL, .io_ok = NULL, .supports = grad_pool_supports},
    {.name = "grad_batchnorm", .init = NULL, .exec = grad_bn_exec, .free_state = NULL, .describe = simple_describe,
     .compute_ok = NULL, .io_ok = NULL, .supports = grad_bn_supports},
    {NULL},
};
