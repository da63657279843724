/* cuda-reduce-grad.h - NegativeLogLikelihoodLoss / SoftmaxCrossEntropyLoss and the gradient kernels of this
 * family on CUDA (grad_loss, grad_softmax, grad_layernorm, grad_reduce, grad_reduce_to_shape, grad_fill);
 * included once by cuda-reduce.cu.
 *
 * Losses compute in double like kernels/cpu/reduce-loss.c and grad.c: one warp per target position. A target
 * outside [0, C) (not ignore_index) is an INVALID_ARGUMENT error on the CPU; a queued device kernel cannot return
 * one, so the loss kernel records the first such target in a device error record (its state, made in init, cleared
 * by every exec) and its loss (and gradient row) is NaN; loss_check, called by the planner after the run's sync,
 * turns the record into the CPU kernel's error (a training step then fails with it, as on the CPU).
 * The gradient kernels take float32 like the CPU's (ReduceToShape also float64; FillLike every fixed-size
 * numeric dtype). LayerNormGrad's dscale / dbias are column sums over rows: per-block partials over row
 * chunks, then one pass folding the partials in double (deterministic).
 */

/* ---- losses ---- */

/* The first target outside [0, C) the loss kernel met (flag 1): its value and flat position. */
typedef struct rd_loss_err {
    int flag;
    int pad_;
    long long value, pos, n;
} rd_loss_err;

typedef struct rd_loss_state {
    int device;
    rd_loss_err *err; /* device memory */
} rd_loss_state;

__device__ __forceinline__ void rd_loss_err_set(rd_loss_err *e, int64_t v, int64_t pos, int64_t n) {
    if (atomicCAS(&e->flag, 0, 1) == 0) {
        e->value = v;
        e->pos = pos;
        e->n = n;
    }
}

template <typename TX>
__global__ void __launch_bounds__(RD_THREADS) loss_kernel(const TX *x, const void *t, int t64, const void *w, eng_dtype wdt, void *lp,
                                                          eng_dtype lpdt, double *lw, void *y, eng_dtype ydt, int64_t n, int64_t ch,
                                                          int64_t d, int sce, int has_ign, int64_t ign, rd_loss_err *err) {
    rd_grp<32> gr;
    int64_t nt = n * d;
    for (int64_t i = gr.first; i < nt; i += gr.step) {
        int64_t b = i / d, j = i - b * d;
        const TX *xr = x + b * ch * d + j;
        double l = 0;
        if (sce) {
            double m = -INFINITY, s = 0;
            for (int64_t k = gr.lane; k < ch; k += 32) m = rc_do(m, ldw<double>(xr, k * d), RC_MAX);
            m = warp_comb(m, RC_MAX);
            for (int64_t k = gr.lane; k < ch; k += 32) s += exp(ldw<double>(xr, k * d) - m);
            s = warp_comb(s, RC_ADD);
            l = m + log(s);
            if (lp)
                for (int64_t k = gr.lane; k < ch; k += 32) st_any(lp, lpdt, b * ch * d + k * d + j, ldw<double>(xr, k * d) - l);
        }
        if (gr.lane == 0) {
            int64_t tg = ld_index(t, t64, i);
            double loss, wt;
            if (has_ign && tg == ign) {
                loss = 0, wt = 0;
            } else if (tg < 0 || tg >= ch) {
                loss = NAN, wt = NAN;
                if (err) rd_loss_err_set(err, tg, i, ch);
            } else {
                wt = w ? ld_any(w, wdt, tg) : 1.0;
                loss = -(ldw<double>(xr, tg * d) - l) * wt;
            }
            if (lw) lw[i] = loss, lw[nt + i] = wt;
            else st_any(y, ydt, i, loss);
        }
    }
}

/* One block: y[0] = sum(loss) or sum(loss) / sum(weight). */
__global__ void __launch_bounds__(1024) loss_sum_kernel(const double *lw, int64_t nt, void *y, eng_dtype ydt, int mean) {
    __shared__ double sh[32];
    double a = 0, b = 0;
    for (int64_t i = threadIdx.x; i < nt; i += blockDim.x) a += lw[i], b += lw[nt + i];
    a = block_comb(a, RC_ADD, sh);
    b = block_comb(b, RC_ADD, sh);
    if (threadIdx.x == 0) st_any(y, ydt, 0, mean ? a / b : a);
}

template <typename TX> static eng_status loss_launch(krn_call *c) {
    const krn_loss_params *p = (const krn_loss_params *)c->params;
    cuda_ctx *cx = CUDA_CTX(c);
    const eng_tensor *x = &c->in[0], *t = &c->in[1];
    const eng_tensor *w = c->nin > 2 && c->in[2].data ? &c->in[2] : NULL;
    int64_t n = x->dims[0], ch = x->dims[1], d = eng_shape_numel(x->dims + 2, x->ndim - 2), nt = n * d;
    void *lp = p->log_softmax && c->nout > 1 ? c->out[1].data : NULL;
    eng_dtype lpdt = lp ? c->out[1].dtype : ENG_DTYPE_F32;
    double *lw = NULL;
    if (p->reduction != KRN_LOSS_NONE) {
        void *ws;
        ENG_TRY(cuda_ctx_workspace(cx, (size_t)(nt > 0 ? nt : 1) * 2 * sizeof(double), &ws));
        lw = (double *)ws;
    }
    rd_loss_err *err = c->state ? ((rd_loss_state *)c->state)->err : NULL;
    if (err) CUDA_TRY("loss", cudaMemsetAsync(err, 0, sizeof *err, cx->stream));
    if (nt > 0) {
        loss_kernel<TX><<<rd_grp_blocks(nt, 32), RD_THREADS, 0, cx->stream>>>(
            (const TX *)x->data, t->data, t->dtype == ENG_DTYPE_I64, w ? w->data : NULL, w ? w->dtype : ENG_DTYPE_F32, lp, lpdt, lw,
            c->out[0].data, c->out[0].dtype, n, ch, d, p->log_softmax, p->has_ignore_index, p->ignore_index, err);
        CUDA_LAUNCHED("loss");
    }
    if (lw) {
        loss_sum_kernel<<<1, 1024, 0, cx->stream>>>(lw, nt, c->out[0].data, c->out[0].dtype, p->reduction == KRN_LOSS_MEAN);
        CUDA_LAUNCHED("loss (reduction)");
    }
    return ENG_STATUS_OK;
}

static int loss_supports(const krn_call *c) {
    const krn_loss_params *p = (const krn_loss_params *)c->params;
    if (!p || c->nin < 2 || c->nout < 1) return 0;
    const eng_tensor *x = &c->in[0];
    if (x->ndim < 2 || !rd_is_float(x->dtype) || !rd_is_float(c->out[0].dtype) || !rd_is_index(c->in[1].dtype)) return 0;
    if (eng_tensor_numel(&c->in[1]) != x->dims[0] * eng_shape_numel(x->dims + 2, x->ndim - 2)) return 0;
    if (c->nin > 2 && c->in[2].dtype != ENG_DTYPE_UNDEFINED && !rd_is_float(c->in[2].dtype)) return 0;
    if (c->nin > 3) return 0;
    if (c->nout > 1 && c->out[1].dtype != ENG_DTYPE_UNDEFINED && !rd_is_float(c->out[1].dtype)) return 0;
    return p->reduction == KRN_LOSS_NONE || p->reduction == KRN_LOSS_SUM || p->reduction == KRN_LOSS_MEAN;
}

static void loss_free(void *s) {
    rd_loss_state *st = (rd_loss_state *)s;
    if (!st) return;
    if (st->err) cuda_mem_free(st->device, st->err);
    free(st);
}

static eng_status loss_init(krn_call *c) {
    cuda_ctx *cx = CUDA_CTX(c);
    rd_loss_state *st = (rd_loss_state *)calloc(1, sizeof *st);
    if (!st) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "cuda loss: state");
    st->device = cx->device;
    eng_status s = cuda_mem_alloc(cx->device, sizeof(rd_loss_err), (void **)&st->err);
    if (s != ENG_STATUS_OK) {
        free(st);
        return s;
    }
    c->state = st;
    return ENG_STATUS_OK;
}

/* After the run's sync: the CPU kernel's error for a target outside [0, C), if the last exec met one. */
static eng_status loss_check(const krn_call *c) {
    const rd_loss_state *st = (const rd_loss_state *)c->state;
    if (!st || !st->err) return ENG_STATUS_OK;
    rd_loss_err e;
    CUDA_TRY("loss", cudaMemcpy(&e, st->err, sizeof e, cudaMemcpyDeviceToHost));
    if (!e.flag) return ENG_STATUS_OK;
    return eng_err(ENG_STATUS_INVALID_ARGUMENT, "target[%lld] = %lld is outside [0, %lld)", e.pos, e.value, e.n);
}

static eng_status loss_exec(krn_call *c) {
    switch (c->in[0].dtype) {
    case ENG_DTYPE_F32: return loss_launch<float>(c);
    case ENG_DTYPE_F16: return loss_launch<__half>(c);
    case ENG_DTYPE_BF16: return loss_launch<__nv_bfloat16>(c);
    case ENG_DTYPE_F64: return loss_launch<double>(c);
    default: return eng_err(ENG_STATUS_UNSUPPORTED, "cuda loss: dtype %s", eng_dtype_name(c->in[0].dtype));
    }
}

/* ---- loss gradients ---- */

__global__ void __launch_bounds__(1024) gl_wsum_kernel(const void *t, int t64, const void *w, eng_dtype wdt, int64_t nt, int64_t ch, int has_ign, int64_t ign,
                               double *out) {
    __shared__ double sh[32];
    double a = 0;
    for (int64_t i = threadIdx.x; i < nt; i += blockDim.x) {
        int64_t tg = ld_index(t, t64, i);
        if ((has_ign && tg == ign) || tg < 0 || tg >= ch) continue;
        a += w ? ld_any(w, wdt, tg) : 1.0;
    }
    a = block_comb(a, RC_ADD, sh);
    if (threadIdx.x == 0) *out = a;
}

__global__ void __launch_bounds__(RD_THREADS) gl_kernel(const float *dl, const float *x, const void *t, int t64, const void *w,
                                                        eng_dtype wdt, const float *dlp, const double *wsum, float *dx, int64_t n,
                                                        int64_t ch, int64_t d, int sce, int red, int has_ign, int64_t ign_index) {
    rd_grp<32> gr;
    int64_t nt = n * d;
    for (int64_t i = gr.first; i < nt; i += gr.step) {
        int64_t b = i / d, j = i - b * d, tg = ld_index(t, t64, i);
        const float *xr = x + b * ch * d + j;
        float *dr = dx + b * ch * d + j;
        bool ign = has_ign && tg == ign_index, bad = !ign && (tg < 0 || tg >= ch);
        double coef = 0;
        if (!ign && !bad) {
            double g = red == KRN_LOSS_NONE ? dl[i] : dl[0];
            coef = g * (w ? ld_any(w, wdt, tg) : 1.0);
            if (red == KRN_LOSS_MEAN) coef = *wsum != 0 ? coef / *wsum : 0;
        }
        if (!sce) {
            for (int64_t k = gr.lane; k < ch; k += 32) dr[k * d] = bad ? NAN : (!ign && k == tg ? (float)-coef : 0.0f);
            continue;
        }
        double m = -INFINITY, s = 0, sl = 0;
        for (int64_t k = gr.lane; k < ch; k += 32) m = rc_do(m, (double)xr[k * d], RC_MAX);
        m = warp_comb(m, RC_MAX);
        for (int64_t k = gr.lane; k < ch; k += 32) {
            s += exp((double)xr[k * d] - m);
            if (dlp) sl += dlp[b * ch * d + k * d + j];
        }
        s = warp_comb(s, RC_ADD);
        sl = warp_comb(sl, RC_ADD);
        for (int64_t k = gr.lane; k < ch; k += 32) {
            double sm = exp((double)xr[k * d] - m) / s;
            double v = coef * (sm - (k == tg && !ign ? 1.0 : 0.0));
            if (dlp) v += dlp[b * ch * d + k * d + j] - sm * sl;
            dr[k * d] = bad ? NAN : (float)v;
        }
    }
}

static int grad_loss_supports(const krn_call *c) {
    const krn_loss_grad_params *p = (const krn_loss_grad_params *)c->params;
    if (!p || c->nin < 3 || c->nout < 1) return 0;
    const eng_tensor *x = &c->in[1];
    if (x->ndim < 2 || c->in[0].dtype != ENG_DTYPE_F32 || x->dtype != ENG_DTYPE_F32 || c->out[0].dtype != ENG_DTYPE_F32) return 0;
    if (!rd_is_index(c->in[2].dtype)) return 0;
    int64_t nt = x->dims[0] * eng_shape_numel(x->dims + 2, x->ndim - 2);
    if (eng_tensor_numel(&c->in[2]) != nt) return 0;
    if (p->loss.reduction == KRN_LOSS_NONE ? eng_tensor_numel(&c->in[0]) != nt : eng_tensor_numel(&c->in[0]) < 1) return 0;
    if (c->nin > 3 && c->in[3].dtype != ENG_DTYPE_UNDEFINED && !rd_is_float(c->in[3].dtype)) return 0;
    if (c->nin > 4 && c->in[4].dtype != ENG_DTYPE_UNDEFINED && c->in[4].dtype != ENG_DTYPE_F32) return 0;
    return c->nin <= 5;
}

static eng_status grad_loss_exec(krn_call *c) {
    const krn_loss_grad_params *p = (const krn_loss_grad_params *)c->params;
    cuda_ctx *cx = CUDA_CTX(c);
    const eng_tensor *x = &c->in[1], *t = &c->in[2];
    const eng_tensor *w = c->nin > 3 && c->in[3].data ? &c->in[3] : NULL;
    const float *dlp = c->nin > 4 && c->in[4].data ? (const float *)c->in[4].data : NULL;
    int64_t n = x->dims[0], ch = x->dims[1], d = eng_shape_numel(x->dims + 2, x->ndim - 2), nt = n * d;
    if (nt == 0 || ch == 0) return ENG_STATUS_OK;
    int t64 = t->dtype == ENG_DTYPE_I64;
    double *wsum = NULL;
    if (p->loss.reduction == KRN_LOSS_MEAN) {
        void *ws;
        ENG_TRY(cuda_ctx_workspace(cx, sizeof(double), &ws));
        wsum = (double *)ws;
        gl_wsum_kernel<<<1, 1024, 0, cx->stream>>>(t->data, t64, w ? w->data : NULL, w ? w->dtype : ENG_DTYPE_F32, nt, ch,
                                                   p->loss.has_ignore_index, p->loss.ignore_index, wsum);
        CUDA_LAUNCHED("grad_loss (weight sum)");
    }
    gl_kernel<<<rd_grp_blocks(nt, 32), RD_THREADS, 0, cx->stream>>>(
        (const float *)c->in[0].data, (const float *)x->data, t->data, t64, w ? w->data : NULL, w ? w->dtype : ENG_DTYPE_F32, dlp, wsum,
        (float *)c->out[0].data, n, ch, d, p->loss.log_softmax, p->loss.reduction, p->loss.has_ignore_index, p->loss.ignore_index);
    CUDA_LAUNCHED("grad_loss");
    return ENG_STATUS_OK;
}

/* ---- SoftmaxGrad / LogSoftmaxGrad ---- */

template <int G>
__global__ void __launch_bounds__(RD_THREADS) gsm_rows_kernel(const float *dy, const float *y, float *dx, int64_t rows, int64_t n, int lg) {
    __shared__ float sh[32];
    rd_grp<G> gr;
    for (int64_t o = gr.first; o < rows; o += gr.step) {
        const float *g = dy + o * n, *yr = y + o * n;
        float *d = dx + o * n, s = 0;
        for (int64_t k = gr.lane; k < n; k += G) s += lg ? g[k] : g[k] * yr[k];
        s = grp_comb<G>(s, RC_ADD, sh);
        if (lg)
            for (int64_t k = gr.lane; k < n; k += G) d[k] = g[k] - expf(yr[k]) * s;
        else
            for (int64_t k = gr.lane; k < n; k += G) d[k] = yr[k] * (g[k] - s);
    }
}

__global__ void gsm_cols_kernel(const float *dy, const float *y, float *dx, int64_t outer, int64_t n, int64_t inner, int lg) {
    for (int64_t l = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; l < outer * inner; l += (int64_t)gridDim.x * blockDim.x) {
        int64_t o = l / inner, j = l - o * inner, b = o * n * inner + j;
        double s = 0;
        for (int64_t k = 0; k < n; k++) s += lg ? (double)dy[b + k * inner] : (double)dy[b + k * inner] * y[b + k * inner];
        for (int64_t k = 0; k < n; k++) {
            int64_t i = b + k * inner;
            dx[i] = (float)(lg ? dy[i] - exp((double)y[i]) * s : y[i] * (dy[i] - s));
        }
    }
}

static int grad_softmax_supports(const krn_call *c) {
    const krn_softmax_grad_params *p = (const krn_softmax_grad_params *)c->params;
    if (!p || c->nin < 2 || c->nout < 1) return 0;
    if (c->in[0].dtype != ENG_DTYPE_F32 || c->in[1].dtype != ENG_DTYPE_F32 || c->out[0].dtype != ENG_DTYPE_F32) return 0;
    int64_t nx = eng_tensor_numel(&c->out[0]);
    return p->sm.outer * p->sm.n * p->sm.inner == nx && eng_tensor_numel(&c->in[0]) == nx && eng_tensor_numel(&c->in[1]) == nx;
}

static eng_status grad_softmax_exec(krn_call *c) {
    const krn_softmax_grad_params *p = (const krn_softmax_grad_params *)c->params;
    int64_t outer = p->sm.outer, n = p->sm.n, inner = p->sm.inner;
    if (outer * n * inner == 0) return ENG_STATUS_OK;
    cudaStream_t s = CUDA_CTX(c)->stream;
    const float *dy = (const float *)c->in[0].data, *y = (const float *)c->in[1].data;
    float *dx = (float *)c->out[0].data;
    if (inner > 1)
        gsm_cols_kernel<<<cuda_grid(outer * inner, RD_THREADS), RD_THREADS, 0, s>>>(dy, y, dx, outer, n, inner, p->log);
    else if (n > RD_ROW_BLOCK)
        gsm_rows_kernel<RD_THREADS><<<rd_grp_blocks(outer, RD_THREADS), RD_THREADS, 0, s>>>(dy, y, dx, outer, n, p->log);
    else
        gsm_rows_kernel<32><<<rd_grp_blocks(outer, 32), RD_THREADS, 0, s>>>(dy, y, dx, outer, n, p->log);
    CUDA_LAUNCHED("grad_softmax");
    return ENG_STATUS_OK;
}

/* ---- LayerNormalizationGrad ---- */

/* dx per row; the row's mean and 1/std go to stats[r], stats[rows + r] for the column pass. */
template <int G>
__global__ void __launch_bounds__(RD_THREADS) gln_rows_kernel(const float *dy, const float *x, const float *sc, float *dx, float *stats,
                                                              int64_t rows, int64_t cols, float eps) {
    __shared__ double shd[32];
    __shared__ float sh[32];
    rd_grp<G> gr;
    float rc = 1.0f / (float)cols;
    for (int64_t r = gr.first; r < rows; r += gr.step) {
        const float *xr = x + r * cols, *gg = dy + r * cols;
        float *dr = dx + r * cols;
        double sd = 0;
        for (int64_t j = gr.lane; j < cols; j += G) sd += xr[j];
        float mean = (float)(grp_comb<G>(sd, RC_ADD, shd) / (double)cols), var = 0, mg = 0, mgx = 0;
        for (int64_t j = gr.lane; j < cols; j += G) var += (xr[j] - mean) * (xr[j] - mean);
        var = grp_comb<G>(var, RC_ADD, sh);
        float inv = 1.0f / sqrtf(var * rc + eps);
        for (int64_t j = gr.lane; j < cols; j += G) {
            float xh = (xr[j] - mean) * inv, gs = gg[j] * sc[j];
            mg += gs;
            mgx += gs * xh;
        }
        mg = grp_comb<G>(mg, RC_ADD, sh) * rc;
        mgx = grp_comb<G>(mgx, RC_ADD, sh) * rc;
        for (int64_t j = gr.lane; j < cols; j += G) dr[j] = inv * (gg[j] * sc[j] - mg - (xr[j] - mean) * inv * mgx);
        if (gr.lane == 0) stats[r] = mean, stats[rows + r] = inv;
    }
}

/* part[(y * 2 + 0) * cols + j] = sum over this block's rows of dy * x_hat, [+1]: of dy. */
__global__ void __launch_bounds__(32 * RD_COL_Y) gln_cols_kernel(const float *dy, const float *x, const float *stats, float *part,
                                                                 int64_t rows, int64_t cols) {
    __shared__ float sh[RD_COL_Y][33];
    int64_t j = (int64_t)blockIdx.x * 32 + threadIdx.x;
    bool ok = j < cols;
    float ps = 0, pb = 0;
    if (ok)
        for (int64_t r = (int64_t)blockIdx.y * RD_COL_Y + threadIdx.y; r < rows; r += (int64_t)gridDim.y * RD_COL_Y) {
            float g = dy[r * cols + j];
            ps += g * ((x[r * cols + j] - stats[r]) * stats[rows + r]);
            pb += g;
        }
    ps = col_comb(ps, RC_ADD, sh);
    pb = col_comb(pb, RC_ADD, sh);
    if (ok && threadIdx.y == 0) {
        part[((int64_t)blockIdx.y * 2) * cols + j] = ps;
        part[((int64_t)blockIdx.y * 2 + 1) * cols + j] = pb;
    }
}

__global__ void gln_fold_kernel(const float *part, int np, float *ds, float *db, int64_t cols) {
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < cols; j += (int64_t)gridDim.x * blockDim.x) {
        double a = 0, b = 0;
        for (int p = 0; p < np; p++) a += part[(int64_t)p * 2 * cols + j], b += part[((int64_t)p * 2 + 1) * cols + j];
        if (ds) ds[j] = (float)a;
        if (db) db[j] = (float)b;
    }
}

static int grad_layernorm_supports(const krn_call *c) {
    const krn_ln_grad_params *p = (const krn_ln_grad_params *)c->params;
    if (!p || c->nin < 3 || c->nout < 1) return 0;
    const eng_tensor *x = &c->in[1];
    for (int i = 0; i < 3; i++)
        if (c->in[i].dtype != ENG_DTYPE_F32) return 0;
    for (int i = 0; i < c->nout && i < 3; i++)
        if (c->out[i].dtype != ENG_DTYPE_UNDEFINED && c->out[i].dtype != ENG_DTYPE_F32) return 0;
    if (p->ln.axis < 0 || p->ln.axis > x->ndim || p->ln.rows * p->ln.cols != eng_tensor_numel(x)) return 0;
    return c->in[2].ndim <= x->ndim - p->ln.axis && c->nout <= 3;
}

static size_t rd_align(size_t n) { return (n + 255) & ~(size_t)255; }

static eng_status grad_layernorm_exec(krn_call *c) {
    const krn_ln_grad_params *p = (const krn_ln_grad_params *)c->params;
    cuda_ctx *cx = CUDA_CTX(c);
    const eng_tensor *x = &c->in[1], *st = &c->in[2];
    int64_t rows = p->ln.rows, cols = p->ln.cols;
    if (rows * cols == 0) return ENG_STATUS_OK;
    float *ds = c->nout > 1 ? (float *)c->out[1].data : NULL, *db = c->nout > 2 ? (float *)c->out[2].data : NULL;
    int64_t np = rows / (RD_COL_Y * 8);
    np = np < 1 ? 1 : np > 64 ? 64 : np;
    int full = eng_tensor_numel(st) == cols;
    size_t o_stats = full ? 0 : rd_align((size_t)cols * sizeof(float)), o_part = o_stats + rd_align((size_t)rows * 2 * sizeof(float));
    void *ws;
    ENG_TRY(cuda_ctx_workspace(cx, o_part + (size_t)np * 2 * (size_t)cols * sizeof(float), &ws));
    float *sc = full ? (float *)st->data : (float *)ws, *stats = (float *)((char *)ws + o_stats), *part = (float *)((char *)ws + o_part);
    if (!full) ENG_TRY(rd_expand<float>(cx->stream, st, x->dims + p->ln.axis, x->ndim - p->ln.axis, cols, sc));
    const float *dy = (const float *)c->in[0].data, *xd = (const float *)x->data;
    if (cols > RD_ROW_BLOCK)
        gln_rows_kernel<RD_THREADS><<<rd_grp_blocks(rows, RD_THREADS), RD_THREADS, 0, cx->stream>>>(dy, xd, sc, (float *)c->out[0].data, stats,
                                                                                                     rows, cols, p->ln.epsilon);
    else
        gln_rows_kernel<32><<<rd_grp_blocks(rows, 32), RD_THREADS, 0, cx->stream>>>(dy, xd, sc, (float *)c->out[0].data, stats, rows, cols,
                                                                                   p->ln.epsilon);
    CUDA_LAUNCHED("grad_layernorm (rows)");
    if (!ds && !db) return ENG_STATUS_OK;
    int64_t bx = (cols + 31) / 32;
    if (bx > INT_MAX) return eng_err(ENG_STATUS_UNSUPPORTED, "cuda grad_layernorm: %lld columns exceed the grid", (long long)cols);
    gln_cols_kernel<<<dim3((unsigned)bx, (unsigned)np), dim3(32, RD_COL_Y), 0, cx->stream>>>(dy, xd, stats, part, rows, cols);
    CUDA_LAUNCHED("grad_layernorm (columns)");
    gln_fold_kernel<<<cuda_grid(cols, RD_THREADS), RD_THREADS, 0, cx->stream>>>(part, (int)np, ds, db, cols);
    CUDA_LAUNCHED("grad_layernorm (fold)");
    return ENG_STATUS_OK;
}

/* ---- ReduceSumGrad / ReduceMeanGrad: dx = dy broadcast over the reduced axes (/ count) ---- */

__global__ void grad_reduce_kernel(const float *dy, float *dx, const rd_dims sz, const rd_dims st, int64_t n, double scale) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dx[i] = (float)(dy[rd_offset(sz.nd, sz.d, st.d, i)] * scale);
}

static int grad_reduce_supports(const krn_call *c) {
    if (!c->params || c->nin < 1 || c->nout < 1) return 0;
    return c->in[0].dtype == ENG_DTYPE_F32 && c->out[0].dtype == ENG_DTYPE_F32;
}

static eng_status grad_reduce_exec(krn_call *c) {
    const krn_reduce_grad_params *p = (const krn_reduce_grad_params *)c->params;
    eng_tensor *dx = &c->out[0];
    int64_t n = eng_tensor_numel(dx), cnt = 1, ks[ENG_MAX_DIMS], s = 1;
    if (n == 0) return ENG_STATUS_OK;
    for (int d = dx->ndim - 1; d >= 0; d--) {
        int red = (p->red.axis_mask >> d) & 1u;
        if (red) cnt *= dx->dims[d], ks[d] = 0;
        else ks[d] = s, s *= dx->dims[d];
    }
    /* collapse: drop size-1 dims, merge neighbours of one kind (kept neighbours are contiguous in dy) */
    rd_dims sz, st;
    int red_prev = -1;
    sz.nd = 0;
    for (int d = 0; d < dx->ndim; d++) {
        if (dx->dims[d] == 1) continue;
        int red = ks[d] == 0;
        if (sz.nd > 0 && red == red_prev) {
            sz.d[sz.nd - 1] *= dx->dims[d];
            st.d[sz.nd - 1] = ks[d];
        } else {
            sz.d[sz.nd] = dx->dims[d];
            st.d[sz.nd] = ks[d];
            sz.nd++;
        }
        red_prev = red;
    }
    st.nd = sz.nd;
    double scale = p->mean && cnt > 0 ? 1.0 / (double)cnt : 1.0;
    cudaStream_t cs = CUDA_CTX(c)->stream;
    grad_reduce_kernel<<<cuda_grid(n, RD_THREADS), RD_THREADS, 0, cs>>>((const float *)c->in[0].data, (float *)dx->data, sz, st, n, scale);
    CUDA_LAUNCHED("grad_reduce");
    return ENG_STATUS_OK;
}

/* ---- ReduceToShape: sum dy over the axes where y (right-aligned) has 1 or no dim; double accumulation ---- */

static int rts_mask(const eng_tensor *dy, const eng_tensor *y, unsigned *mask) {
    int r = dy->ndim, off = r - y->ndim;
    if (off < 0) return 0;
    *mask = 0;
    for (int d = 0; d < r; d++) {
        int64_t yd = d >= off ? y->dims[d - off] : 1;
        if (yd == dy->dims[d]) continue;
        if (yd != 1) return 0;
        *mask |= 1u << d;
    }
    return 1;
}

static int grad_rts_supports(const krn_call *c) {
    if (c->nin < 1 || c->nout < 1) return 0;
    eng_dtype dt = c->in[0].dtype;
    unsigned mask;
    return (dt == ENG_DTYPE_F32 || dt == ENG_DTYPE_F64) && c->out[0].dtype == dt && rts_mask(&c->in[0], &c->out[0], &mask);
}

static eng_status grad_rts_exec(krn_call *c) {
    const eng_tensor *dy = &c->in[0];
    eng_tensor *y = &c->out[0];
    cudaStream_t s = CUDA_CTX(c)->stream;
    int64_t n = eng_tensor_numel(dy), ny = eng_tensor_numel(y);
    if (ny == 0) return ENG_STATUS_OK;
    if (n == ny) {
        CUDA_TRY("grad_reduce_to_shape (copy)", cudaMemcpyAsync(y->data, dy->data, eng_tensor_nbytes(y), cudaMemcpyDeviceToDevice, s));
        return ENG_STATUS_OK;
    }
    unsigned mask;
    if (!rts_mask(dy, y, &mask))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "cuda grad_reduce_to_shape: output rank %d does not broadcast to input rank %d", y->ndim,
                       dy->ndim);
    rd_geom g;
    rd_geom_init(&g, dy->dims, dy->ndim, mask);
    if (dy->dtype == ENG_DTYPE_F64)
        return rd_launch<double, double, double>(CUDA_CTX(c), (const double *)dy->data, (double *)y->data, g, RC_ADD, RX_ID, RP_NONE);
    return rd_launch<float, float, double>(CUDA_CTX(c), (const float *)dy->data, (float *)y->data, g, RC_ADD, RX_ID, RP_NONE);
}

/* ---- FillLike ---- */

template <typename U> __global__ void fill_kernel(U *y, int64_t n, U v) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) y[i] = v;
}

/* value in dtype dt as raw bytes (C cast rules, f16/bf16 rounded to nearest even); 0 if dt is not handled */
static size_t fill_pattern(eng_dtype dt, double v, uint64_t *bits) {
    *bits = 0;
    switch (dt) {
    case ENG_DTYPE_F32: { float f = (float)v; memcpy(bits, &f, 4); return 4; }
    case ENG_DTYPE_F64: memcpy(bits, &v, 8); return 8;
    case ENG_DTYPE_F16: { __half h = __double2half(v); memcpy(bits, &h, 2); return 2; }
    case ENG_DTYPE_BF16: { __nv_bfloat16 h = __float2bfloat16((float)v); memcpy(bits, &h, 2); return 2; }
    case ENG_DTYPE_I32: { int32_t k = (int32_t)v; memcpy(bits, &k, 4); return 4; }
    case ENG_DTYPE_I64: { int64_t k = (int64_t)v; memcpy(bits, &k, 8); return 8; }
    case ENG_DTYPE_I8: { int8_t k = (int8_t)v; memcpy(bits, &k, 1); return 1; }
    case ENG_DTYPE_U8: { uint8_t k = (uint8_t)v; memcpy(bits, &k, 1); return 1; }
    case ENG_DTYPE_BOOL: { uint8_t k = v != 0; memcpy(bits, &k, 1); return 1; }
    default: return 0;
    }
}

static int grad_fill_supports(const krn_call *c) {
    const krn_fill_params *p = (const krn_fill_params *)c->params;
    uint64_t bits;
    return p && c->nout >= 1 && fill_pattern(c->out[0].dtype, p->value, &bits) != 0;
}

static eng_status grad_fill_exec(krn_call *c) {
    const krn_fill_params *p = (const krn_fill_params *)c->params;
    eng_tensor *y = &c->out[0];
    int64_t n = eng_tensor_numel(y);
    uint64_t bits;
    size_t es = fill_pattern(y->dtype, p->value, &bits);
    if (n == 0) return ENG_STATUS_OK;
    cudaStream_t s = CUDA_CTX(c)->stream;
    unsigned g = cuda_grid(n, RD_THREADS);
    switch (es) {
    case 1: { uint8_t v; memcpy(&v, &bits, 1); fill_kernel<uint8_t><<<g, RD_THREADS, 0, s>>>((uint8_t *)y->data, n, v); break; }
    case 2: { uint16_t v; memcpy(&v, &bits, 2); fill_kernel<uint16_t><<<g, RD_THREADS, 0, s>>>((uint16_t *)y->data, n, v); break; }
    case 4: { uint32_t v; memcpy(&v, &bits, 4); fill_kernel<uint32_t><<<g, RD_THREADS, 0, s>>>((uint32_t *)y->data, n, v); break; }
    case 8: fill_kernel<uint64_t><<<g, RD_THREADS, 0, s>>>((uint64_t *)y->data, n, bits); break;
    default: return eng_err(ENG_STATUS_UNSUPPORTED, "cuda grad_fill: dtype %s", eng_dtype_name(y->dtype));
    }
    CUDA_LAUNCHED("grad_fill");
    return ENG_STATUS_OK;
}
