/* cuda-reduce-norm.h - Softmax / LogSoftmax / Hardmax, LayerNormalization, InstanceNormalization and
 * MeanVarianceNormalization on CUDA; included once by cuda-reduce.cu (uses its rd_geom and helpers).
 *
 * Softmax and LayerNorm work on rows: one warp per row up to RD_ROW_BLOCK elements, one block per row above;
 * softmax keeps an online (max, sum) pair so a row is read twice (normaliser, output), layer norm reads it
 * three times (mean, centred variance, output; the later reads hit L1/L2). Softmax over a non-last axis
 * (inner > 1) runs one thread per column with the CPU's three sequential passes, coalesced across columns.
 * x and y may each be f32, f16 or bf16 (fp32 inside) or both f64; LayerNorm's scale / bias (any float dtype,
 * broadcast to dims[axis:]) are expanded into a work-type vector in the workspace first. InstanceNorm and MVN
 * compute in double like the CPU.
 */

/* Dispatch on a float dtype: BODY runs with T typedef'd to the element type. */
#define RD_LOWP_CASES(dt, T, ...)                                                                                  \
    switch (dt) {                                                                                                  \
    case ENG_DTYPE_F32: { typedef float T; __VA_ARGS__; } break;                                                   \
    case ENG_DTYPE_F16: { typedef __half T; __VA_ARGS__; } break;                                                  \
    case ENG_DTYPE_BF16: { typedef __nv_bfloat16 T; __VA_ARGS__; } break;                                          \
    default: break;                                                                                                \
    }

/* ---- Softmax family ---- */

template <typename TX, typename TY, typename W, int G>
__global__ void __launch_bounds__(RD_THREADS) sm_rows_kernel(const TX *x, TY *y, int64_t rows, int64_t n, int kind) {
    __shared__ W shm[32], shs[32];
    __shared__ int64_t shi[32];
    rd_grp<G> gr;
    for (int64_t o = gr.first; o < rows; o += gr.step) {
        const TX *xr = x + o * n;
        TY *yr = y + o * n;
        if (kind == KRN_SOFTMAX_HARD) {
            W bv = 0;
            int64_t bi = -1;
            for (int64_t i = gr.lane; i < n; i += G) {
                W v = ldw<W>(xr, i);
                if (rd_nan(v) && i != 0) continue;
                if (pick_better(v, i, bv, bi, 0, 0)) bv = v, bi = i;
            }
            grp_pick<G>(bv, bi, 0, 0, shm, shi);
            int64_t am = rd_nan(ldw<W>(xr, 0)) || bi < 0 ? 0 : bi;
            for (int64_t i = gr.lane; i < n; i += G) stw(yr, i, (W)(i == am ? 1 : 0));
            continue;
        }
        W m = rd_lim<W>::lo(), s = 0;
        for (int64_t i = gr.lane; i < n; i += G) ms_add(m, s, ldw<W>(xr, i));
        grp_ms<G>(m, s, shm, shs);
        if (kind == KRN_SOFTMAX_LOG) {
            W l = m + rd_log(s);
            for (int64_t i = gr.lane; i < n; i += G) stw(yr, i, ldw<W>(xr, i) - l);
        } else {
            W inv = (W)1 / s;
            for (int64_t i = gr.lane; i < n; i += G) stw(yr, i, rd_exp(ldw<W>(xr, i) - m) * inv);
        }
    }
}

template <typename TX, typename TY, typename W>
__global__ void sm_cols_kernel(const TX *x, TY *y, int64_t outer, int64_t n, int64_t inner, int kind) {
    for (int64_t l = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; l < outer * inner; l += (int64_t)gridDim.x * blockDim.x) {
        int64_t o = l / inner, j = l - o * inner;
        const TX *xc = x + o * n * inner + j;
        TY *yc = y + o * n * inner + j;
        W m = ldw<W>(xc, 0);
        for (int64_t i = 1; i < n; i++) {
            W v = ldw<W>(xc, i * inner);
            m = v > m ? v : m;
        }
        if (kind == KRN_SOFTMAX_HARD) {
            bool found = false;
            for (int64_t i = 0; i < n; i++) {
                bool hit = !found && ldw<W>(xc, i * inner) == m;
                found = found || hit;
                stw(yc, i * inner, (W)(hit ? 1 : 0));
            }
            continue;
        }
        W s = 0;
        for (int64_t i = 0; i < n; i++) s += rd_exp(ldw<W>(xc, i * inner) - m);
        if (kind == KRN_SOFTMAX_LOG) {
            W lg = m + rd_log(s);
            for (int64_t i = 0; i < n; i++) stw(yc, i * inner, ldw<W>(xc, i * inner) - lg);
        } else {
            W inv = (W)1 / s;
            for (int64_t i = 0; i < n; i++) stw(yc, i * inner, rd_exp(ldw<W>(xc, i * inner) - m) * inv);
        }
    }
}

template <typename TX, typename TY, typename W>
static eng_status sm_launch(cudaStream_t s, const void *x, void *y, const krn_softmax_params *p) {
    int64_t outer = p->outer, n = p->n, inner = p->inner;
    if (inner > 1) {
        sm_cols_kernel<TX, TY, W><<<cuda_grid(outer * inner, RD_THREADS), RD_THREADS, 0, s>>>((const TX *)x, (TY *)y, outer, n, inner, p->kind);
        CUDA_LAUNCHED("softmax (columns)");
    } else if (n > RD_ROW_BLOCK) {
        sm_rows_kernel<TX, TY, W, RD_THREADS><<<rd_grp_blocks(outer, RD_THREADS), RD_THREADS, 0, s>>>((const TX *)x, (TY *)y, outer, n, p->kind);
        CUDA_LAUNCHED("softmax (block rows)");
    } else {
        sm_rows_kernel<TX, TY, W, 32><<<rd_grp_blocks(outer, 32), RD_THREADS, 0, s>>>((const TX *)x, (TY *)y, outer, n, p->kind);
        CUDA_LAUNCHED("softmax (warp rows)");
    }
    return ENG_STATUS_OK;
}

static int softmax_supports(const krn_call *c) {
    const krn_softmax_params *p = (const krn_softmax_params *)c->params;
    if (!p || c->nin < 1 || c->nout < 1) return 0;
    if (p->kind != KRN_SOFTMAX && p->kind != KRN_SOFTMAX_LOG && p->kind != KRN_SOFTMAX_HARD) return 0;
    eng_dtype xt = c->in[0].dtype, yt = c->out[0].dtype;
    if (!((rd_is_lowp(xt) && rd_is_lowp(yt)) || (xt == ENG_DTYPE_F64 && yt == ENG_DTYPE_F64))) return 0;
    return p->outer * p->n * p->inner == eng_tensor_numel(&c->in[0]) && eng_tensor_numel(&c->out[0]) == eng_tensor_numel(&c->in[0]);
}

static eng_status softmax_exec(krn_call *c) {
    const krn_softmax_params *p = (const krn_softmax_params *)c->params;
    if (p->outer * p->n * p->inner == 0) return ENG_STATUS_OK;
    cudaStream_t s = CUDA_CTX(c)->stream;
    const void *x = c->in[0].data;
    void *y = c->out[0].data;
    if (c->in[0].dtype == ENG_DTYPE_F64) return sm_launch<double, double, double>(s, x, y, p);
    RD_LOWP_CASES(c->in[0].dtype, TX, RD_LOWP_CASES(c->out[0].dtype, TY, return sm_launch<TX, TY, float>(s, x, y, p)))
    return eng_err(ENG_STATUS_UNSUPPORTED, "cuda softmax: dtypes %s -> %s", eng_dtype_name(c->in[0].dtype),
                   eng_dtype_name(c->out[0].dtype));
}

/* ---- LayerNormalization ---- */

/* out[j] = t broadcast (right-aligned) to `full`, j < numel(full), as work type W. */
template <typename W>
__global__ void rd_expand_kernel(const void *t, eng_dtype tdt, const rd_dims td, const rd_dims full, W *out, int64_t cols) {
    int off = full.nd - td.nd;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < cols; j += (int64_t)gridDim.x * blockDim.x) {
        int64_t rem = j, src = 0, mul = 1;
        for (int d = full.nd - 1; d >= 0; d--) {
            int64_t q = rem / full.d[d], id = rem - q * full.d[d];
            rem = q;
            if (d >= off) {
                int64_t sd = td.d[d - off];
                if (sd != 1) src += id * mul;
                mul *= sd;
            }
        }
        out[j] = (W)ld_any(t, tdt, src);
    }
}

template <typename W>
static eng_status rd_expand(cudaStream_t s, const eng_tensor *t, const int64_t *full, int nfull, int64_t cols, W *out) {
    rd_expand_kernel<W><<<cuda_grid(cols, RD_THREADS), RD_THREADS, 0, s>>>(t->data, t->dtype, rd_dims_of(t->dims, t->ndim),
                                                                          rd_dims_of(full, nfull), out, cols);
    CUDA_LAUNCHED("broadcast of a scale/bias vector");
    return ENG_STATUS_OK;
}

template <typename TX, typename TY, typename W, int G>
__global__ void __launch_bounds__(RD_THREADS) ln_kernel(const TX *x, TY *y, const W *sc, const W *bi, void *mo, eng_dtype mdt, void *io,
                                                        eng_dtype idt, int64_t rows, int64_t cols, W eps) {
    __shared__ W sh[32];
    rd_grp<G> gr;
    for (int64_t r = gr.first; r < rows; r += gr.step) {
        const TX *xr = x + r * cols;
        TY *yr = y + r * cols;
        W s = 0, q = 0;
        for (int64_t j = gr.lane; j < cols; j += G) s += ldw<W>(xr, j);
        W mean = grp_comb<G>(s, RC_ADD, sh) / (W)cols;
        for (int64_t j = gr.lane; j < cols; j += G) {
            W d = ldw<W>(xr, j) - mean;
            q += d * d;
        }
        W inv = (W)1 / rd_sqrt(grp_comb<G>(q, RC_ADD, sh) / (W)cols + eps);
        if (bi) {
            for (int64_t j = gr.lane; j < cols; j += G) stw(yr, j, (ldw<W>(xr, j) - mean) * inv * sc[j] + bi[j]);
        } else {
            for (int64_t j = gr.lane; j < cols; j += G) stw(yr, j, (ldw<W>(xr, j) - mean) * inv * sc[j]);
        }
        if (gr.lane == 0) {
            if (mo) st_any(mo, mdt, r, (double)mean);
            if (io) st_any(io, idt, r, (double)inv);
        }
    }
}

template <typename TX, typename TY, typename W>
static eng_status ln_launch(krn_call *c) {
    const krn_layernorm_params *p = (const krn_layernorm_params *)c->params;
    cuda_ctx *cx = CUDA_CTX(c);
    const eng_tensor *x = &c->in[0];
    const eng_tensor *b = c->nin > 2 && c->in[2].data ? &c->in[2] : NULL;
    int64_t rows = p->rows, cols = p->cols;
    void *ws;
    ENG_TRY(cuda_ctx_workspace(cx, (size_t)cols * 2 * sizeof(W), &ws));
    W *sc = (W *)ws, *bi = b ? sc + cols : NULL;
    ENG_TRY(rd_expand<W>(cx->stream, &c->in[1], x->dims + p->axis, x->ndim - p->axis, cols, sc));
    if (b) ENG_TRY(rd_expand<W>(cx->stream, b, x->dims + p->axis, x->ndim - p->axis, cols, bi));
    void *mo = c->nout > 1 ? c->out[1].data : NULL, *io = c->nout > 2 ? c->out[2].data : NULL;
    eng_dtype mdt = mo ? c->out[1].dtype : ENG_DTYPE_F32, idt = io ? c->out[2].dtype : ENG_DTYPE_F32;
    if (cols > RD_ROW_BLOCK) {
        ln_kernel<TX, TY, W, RD_THREADS><<<rd_grp_blocks(rows, RD_THREADS), RD_THREADS, 0, cx->stream>>>(
            (const TX *)x->data, (TY *)c->out[0].data, sc, bi, mo, mdt, io, idt, rows, cols, (W)p->epsilon);
        CUDA_LAUNCHED("layernorm (block rows)");
    } else {
        ln_kernel<TX, TY, W, 32><<<rd_grp_blocks(rows, 32), RD_THREADS, 0, cx->stream>>>(
            (const TX *)x->data, (TY *)c->out[0].data, sc, bi, mo, mdt, io, idt, rows, cols, (W)p->epsilon);
        CUDA_LAUNCHED("layernorm (warp rows)");
    }
    return ENG_STATUS_OK;
}

static int layernorm_supports(const krn_call *c) {
    const krn_layernorm_params *p = (const krn_layernorm_params *)c->params;
    if (!p || c->nin < 2 || c->nout < 1) return 0;
    const eng_tensor *x = &c->in[0];
    eng_dtype xt = x->dtype, yt = c->out[0].dtype;
    if (!((rd_is_lowp(xt) && rd_is_lowp(yt)) || (xt == ENG_DTYPE_F64 && yt == ENG_DTYPE_F64))) return 0;
    if (p->axis < 0 || p->axis > x->ndim || p->rows * p->cols != eng_tensor_numel(x)) return 0;
    int nd = x->ndim - p->axis;
    for (int i = 1; i < c->nin && i < 3; i++) {
        const eng_tensor *t = &c->in[i];
        if (i == 2 && t->dtype == ENG_DTYPE_UNDEFINED) continue;
        if (!rd_is_float(t->dtype) || t->ndim > nd) return 0;
    }
    if (c->nin > 3) return 0;
    for (int i = 1; i < c->nout && i < 3; i++)
        if (c->out[i].dtype != ENG_DTYPE_UNDEFINED && !rd_is_float(c->out[i].dtype)) return 0;
    return c->nout <= 3;
}

static eng_status layernorm_exec(krn_call *c) {
    const krn_layernorm_params *p = (const krn_layernorm_params *)c->params;
    if (p->rows * p->cols == 0) return ENG_STATUS_OK;
    if (c->in[0].dtype == ENG_DTYPE_F64) return ln_launch<double, double, double>(c);
    RD_LOWP_CASES(c->in[0].dtype, TX, RD_LOWP_CASES(c->out[0].dtype, TY, return ln_launch<TX, TY, float>(c)))
    return eng_err(ENG_STATUS_UNSUPPORTED, "cuda layernorm: dtypes %s -> %s", eng_dtype_name(c->in[0].dtype),
                   eng_dtype_name(c->out[0].dtype));
}

/* ---- InstanceNormalization: one group per (n, c) plane, double sums ---- */

template <typename TX, typename TY, int G>
__global__ void __launch_bounds__(RD_THREADS) in_kernel(const TX *x, TY *y, const void *sc, eng_dtype sdt, const void *bs, eng_dtype bdt,
                                                        int64_t planes, int64_t ch, int64_t sp, double eps) {
    __shared__ double sh[32];
    rd_grp<G> gr;
    for (int64_t b = gr.first; b < planes; b += gr.step) {
        const TX *xr = x + b * sp;
        TY *yr = y + b * sp;
        double s = 0, q = 0;
        for (int64_t i = gr.lane; i < sp; i += G) s += ldw<double>(xr, i);
        double m = grp_comb<G>(s, RC_ADD, sh) / (double)sp;
        for (int64_t i = gr.lane; i < sp; i += G) {
            double d = ldw<double>(xr, i) - m;
            q += d * d;
        }
        q = grp_comb<G>(q, RC_ADD, sh);
        int64_t cc = b % ch;
        double a = ld_any(sc, sdt, cc) / sqrt(q / (double)sp + eps);
        double o = ld_any(bs, bdt, cc) - m * a;
        for (int64_t i = gr.lane; i < sp; i += G) stw(yr, i, ldw<double>(xr, i) * a + o);
    }
}

template <typename TX, typename TY> static eng_status in_launch(krn_call *c) {
    const krn_instnorm_params *p = (const krn_instnorm_params *)c->params;
    const eng_tensor *x = &c->in[0];
    int64_t n = x->dims[0], ch = x->dims[1], sp = eng_shape_numel(x->dims + 2, x->ndim - 2);
    cudaStream_t s = CUDA_CTX(c)->stream;
    const TX *xd = (const TX *)x->data;
    TY *yd = (TY *)c->out[0].data;
    if (sp > RD_ROW_BLOCK) {
        in_kernel<TX, TY, RD_THREADS><<<rd_grp_blocks(n * ch, RD_THREADS), RD_THREADS, 0, s>>>(
            xd, yd, c->in[1].data, c->in[1].dtype, c->in[2].data, c->in[2].dtype, n * ch, ch, sp, (double)p->epsilon);
    } else {
        in_kernel<TX, TY, 32><<<rd_grp_blocks(n * ch, 32), RD_THREADS, 0, s>>>(xd, yd, c->in[1].data, c->in[1].dtype, c->in[2].data,
                                                                              c->in[2].dtype, n * ch, ch, sp, (double)p->epsilon);
    }
    CUDA_LAUNCHED("instnorm");
    return ENG_STATUS_OK;
}

static int instnorm_supports(const krn_call *c) {
    if (!c->params || c->nin < 3 || c->nout < 1) return 0;
    const eng_tensor *x = &c->in[0];
    if (x->ndim < 2 || !rd_is_float(x->dtype) || c->out[0].dtype != x->dtype) return 0;
    for (int i = 1; i < 3; i++)
        if (!rd_is_float(c->in[i].dtype) || eng_tensor_numel(&c->in[i]) < x->dims[1]) return 0;
    return 1;
}

static eng_status instnorm_exec(krn_call *c) {
    if (eng_tensor_numel(&c->in[0]) == 0) return ENG_STATUS_OK;
    switch (c->in[0].dtype) {
    case ENG_DTYPE_F32: return in_launch<float, float>(c);
    case ENG_DTYPE_F16: return in_launch<__half, __half>(c);
    case ENG_DTYPE_BF16: return in_launch<__nv_bfloat16, __nv_bfloat16>(c);
    case ENG_DTYPE_F64: return in_launch<double, double>(c);
    default: return eng_err(ENG_STATUS_UNSUPPORTED, "cuda instnorm: dtype %s", eng_dtype_name(c->in[0].dtype));
    }
}

/* ---- MeanVarianceNormalization: per-output statistics (double), then an elementwise pass ---- */

template <typename TX, int G>
__global__ void __launch_bounds__(RD_THREADS) mvn_stats_kernel(const TX *x, const rd_geom g, double *st) {
    __shared__ double sh[32];
    rd_grp<G> gr;
    for (int64_t o = gr.first; o < g.out_numel; o += gr.step) {
        int64_t base = rd_offset(g.nk, g.kn, g.ks, o);
        double s = 0, q = 0;
        for (int64_t r = gr.lane; r < g.count; r += G) s += ldw<double>(x, base + rd_offset(g.nr, g.rn, g.rs, r));
        double m = grp_comb<G>(s, RC_ADD, sh) / (double)g.count;
        for (int64_t r = gr.lane; r < g.count; r += G) {
            double d = ldw<double>(x, base + rd_offset(g.nr, g.rn, g.rs, r)) - m;
            q += d * d;
        }
        q = grp_comb<G>(q, RC_ADD, sh) / (double)g.count;
        if (gr.lane == 0) st[o] = m, st[g.out_numel + o] = sqrt(q) + 1e-9;
    }
}

template <typename TX, typename TY>
__global__ void mvn_apply_kernel(const TX *x, TY *y, const rd_geom g, const double *st, int64_t nx) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nx; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t o = rd_offset(g.nd, g.n, g.ost, i);
        stw(y, i, (ldw<double>(x, i) - st[o]) / st[g.out_numel + o]);
    }
}

template <typename TX, typename TY> static eng_status mvn_launch(krn_call *c) {
    const krn_mvn_params *p = (const krn_mvn_params *)c->params;
    const eng_tensor *x = &c->in[0];
    cuda_ctx *cx = CUDA_CTX(c);
    rd_geom g;
    rd_geom_init(&g, x->dims, x->ndim, p->axis_mask);
    int64_t nx = eng_tensor_numel(x);
    void *ws;
    ENG_TRY(cuda_ctx_workspace(cx, (size_t)g.out_numel * 2 * sizeof(double), &ws));
    double *st = (double *)ws;
    if (g.count > RD_ROW_BLOCK)
        mvn_stats_kernel<TX, RD_THREADS><<<rd_grp_blocks(g.out_numel, RD_THREADS), RD_THREADS, 0, cx->stream>>>((const TX *)x->data, g, st);
    else
        mvn_stats_kernel<TX, 32><<<rd_grp_blocks(g.out_numel, 32), RD_THREADS, 0, cx->stream>>>((const TX *)x->data, g, st);
    CUDA_LAUNCHED("mvn (statistics)");
    mvn_apply_kernel<TX, TY><<<cuda_grid(nx, RD_THREADS), RD_THREADS, 0, cx->stream>>>((const TX *)x->data, (TY *)c->out[0].data, g, st, nx);
    CUDA_LAUNCHED("mvn");
    return ENG_STATUS_OK;
}

static int mvn_supports(const krn_call *c) {
    if (!c->params || c->nin < 1 || c->nout < 1) return 0;
    return rd_is_float(c->in[0].dtype) && c->out[0].dtype == c->in[0].dtype;
}

static eng_status mvn_exec(krn_call *c) {
    if (eng_tensor_numel(&c->in[0]) == 0) return ENG_STATUS_OK;
    switch (c->in[0].dtype) {
    case ENG_DTYPE_F32: return mvn_launch<float, float>(c);
    case ENG_DTYPE_F16: return mvn_launch<__half, __half>(c);
    case ENG_DTYPE_BF16: return mvn_launch<__nv_bfloat16, __nv_bfloat16>(c);
    case ENG_DTYPE_F64: return mvn_launch<double, double>(c);
    default: return eng_err(ENG_STATUS_UNSUPPORTED, "cuda mvn: dtype %s", eng_dtype_name(c->in[0].dtype));
    }
}
