/* grad-nn.c - CPU kernels of the nn gradient ops: ConvGrad (im2col + OpenBLAS sgemm), pool gradients,
 * MatMulGrad (sgemm per broadcast batch), BatchNormalizationGrad and LayerNormalizationGrad.
 *
 * Conv and pools treat 1-3 spatial dims as 3-D with leading 1s. ConvGrad per image and group:
 *   col = im2col(x)  (Cg*K, O);  dW += dy (Mg, O) @ col^T;  dcol = W^T @ dy;  dx = col2im(dcol);  db = sum dy.
 * Images run in parallel (one col buffer per thread); dW is accumulated per thread, then summed. Outputs that
 * are omitted (data NULL) are skipped. MaxPoolGrad routes dy to the first maximum of each window, as the
 * forward kernel picks it; AveragePoolGrad uses the forward's divisor (count_include_pad, clipped windows).
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "../kernel.h"
#include "../krn-grad.h"

eng_status krn_cpu_grad_conv_exec(krn_call *c);
eng_status krn_cpu_grad_pool_exec(krn_call *c);
eng_status krn_cpu_grad_matmul_exec(krn_call *c);
eng_status krn_cpu_grad_batchnorm_exec(krn_call *c);
eng_status krn_cpu_grad_layernorm_exec(krn_call *c);

typedef struct geo3 {
    int64_t in[3], out[3], k[3], s[3], d[3], pb[3], pe[3];
} geo3;

static void geo3_fill(geo3 *g, int nsp, const int64_t *xd, const int64_t *yd, const int64_t *k, const int64_t *s,
                      const int64_t *dl, const int64_t *pads) {
    int off = 3 - nsp;
    for (int i = 0; i < 3; i++) g->in[i] = g->out[i] = g->k[i] = g->s[i] = g->d[i] = 1, g->pb[i] = g->pe[i] = 0;
    for (int i = 0; i < nsp; i++) {
        g->in[off + i] = xd[i];
        g->out[off + i] = yd[i];
        g->k[off + i] = k[i];
        g->s[off + i] = s[i] > 0 ? s[i] : 1;
        g->d[off + i] = dl[i] > 0 ? dl[i] : 1;
        g->pb[off + i] = pads[i];
        g->pe[off + i] = pads[nsp + i];
    }
}

/* col (C*K, O) <- x (C, in...); col2im adds col back into x. */
static void im2col(const geo3 *g, int64_t ch, const float *x, float *col, int back, float *dx) {
    int64_t K = g->k[0] * g->k[1] * g->k[2], O = g->out[0] * g->out[1] * g->out[2];
    int64_t isz = g->in[0] * g->in[1] * g->in[2];
    for (int64_t cc = 0; cc < ch; cc++)
        for (int64_t k0 = 0; k0 < g->k[0]; k0++)
            for (int64_t k1 = 0; k1 < g->k[1]; k1++)
                for (int64_t k2 = 0; k2 < g->k[2]; k2++) {
                    int64_t row = cc * K + (k0 * g->k[1] + k1) * g->k[2] + k2;
                    float *cr = col + row * O;
                    int64_t o = 0;
                    for (int64_t o0 = 0; o0 < g->out[0]; o0++) {
                        int64_t i0 = o0 * g->s[0] - g->pb[0] + k0 * g->d[0];
                        for (int64_t o1 = 0; o1 < g->out[1]; o1++) {
                            int64_t i1 = o1 * g->s[1] - g->pb[1] + k1 * g->d[1];
                            int ok01 = i0 >= 0 && i0 < g->in[0] && i1 >= 0 && i1 < g->in[1];
                            int64_t base = cc * isz + (i0 * g->in[1] + i1) * g->in[2];
                            for (int64_t o2 = 0; o2 < g->out[2]; o2++, o++) {
                                int64_t i2 = o2 * g->s[2] - g->pb[2] + k2 * g->d[2];
                                int ok = ok01 && i2 >= 0 && i2 < g->in[2];
                                if (back) {
                                    if (ok) dx[base + i2] += cr[o];
                                } else {
                                    cr[o] = ok ? x[base + i2] : 0.0f;
                                }
                            }
                        }
                    }
                }
}

eng_status krn_cpu_grad_conv_exec(krn_call *c) {
    const krn_conv_params *p = &((const krn_conv_grad_params *)c->params)->conv;
    const eng_tensor *dyt = &c->in[0], *xt = &c->in[1], *wt = &c->in[2];
    float *dx = c->nout > 0 ? c->out[0].data : NULL, *dw = c->nout > 1 ? c->out[1].data : NULL;
    float *db = c->nout > 2 ? c->out[2].data : NULL;
    const float *dy = dyt->data, *x = xt->data, *w = wt->data;
    int nsp = xt->ndim - 2;
    if (nsp < 1 || nsp > 3) return eng_err(ENG_STATUS_UNSUPPORTED, "ConvGrad with %d spatial dims", nsp);
    geo3 g;
    geo3_fill(&g, nsp, xt->dims + 2, dyt->dims + 2, wt->dims + 2, p->strides, p->dilations, p->pads);
    int64_t n = xt->dims[0], C = xt->dims[1], M = wt->dims[0], G = p->group > 0 ? p->group : 1;
    int64_t Cg = C / G, Mg = M / G, K = g.k[0] * g.k[1] * g.k[2], O = g.out[0] * g.out[1] * g.out[2];
    int64_t isz = g.in[0] * g.in[1] * g.in[2], wsz = M * Cg * K;
    if (db)
        for (int64_t m = 0; m < M; m++) {
            double s = 0;
            for (int64_t b = 0; b < n; b++)
                for (int64_t o = 0; o < O; o++) s += dy[(b * M + m) * O + o];
            db[m] = (float)s;
        }
    if (!dx && !dw) return ENG_STATUS_OK;
    if (dx) memset(dx, 0, (size_t)(n * C * isz) * sizeof(float));
    int nt = c->nthreads > 0 ? c->nthreads : 1;
    if (nt > n) nt = (int)(n > 0 ? n : 1);
    size_t colsz = (size_t)(Cg * K * O);
    float *scratch = eng_alloc(((size_t)nt * (2 * colsz + (dw ? (size_t)wsz : 0)) + 1) * sizeof(float));
    if (!scratch) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "ConvGrad scratch (%lld threads x %zu floats)", (long long)nt, colsz);
    float *dwt = scratch + (size_t)nt * 2 * colsz;
    if (dw) memset(dwt, 0, (size_t)nt * (size_t)wsz * sizeof(float));
    int blas_threads = openblas_get_num_threads();
    if (nt > 1) openblas_set_num_threads(1);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t b = 0; b < n; b++) {
        int tid = omp_get_thread_num();
        float *col = scratch + (size_t)tid * 2 * colsz, *dcol = col + colsz;
        float *mydw = dwt + (size_t)tid * (size_t)wsz;
        for (int64_t gi = 0; gi < G; gi++) {
            const float *xb = x + (b * C + gi * Cg) * isz, *dyb = dy + (b * M + gi * Mg) * O;
            const float *wg = w + gi * Mg * Cg * K;
            if (dw) {
                im2col(&g, Cg, xb, col, 0, NULL);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)Mg, (int)(Cg * K), (int)O, 1.0f, dyb, (int)O,
                            col, (int)O, 1.0f, mydw + gi * Mg * Cg * K, (int)(Cg * K));
            }
            if (dx) {
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)(Cg * K), (int)O, (int)Mg, 1.0f, wg,
                            (int)(Cg * K), dyb, (int)O, 0.0f, dcol, (int)O);
                im2col(&g, Cg, NULL, dcol, 1, dx + (b * C + gi * Cg) * isz);
            }
        }
    }
    if (nt > 1) openblas_set_num_threads(blas_threads);
    if (dw) {
        for (int64_t i = 0; i < wsz; i++) {
            double s = 0;
            for (int t = 0; t < nt; t++) s += dwt[(size_t)t * (size_t)wsz + (size_t)i];
            dw[i] = (float)s;
        }
    }
    eng_free(scratch);
    return ENG_STATUS_OK;
}

/* ---- pools ---- */

static int64_t padded_count(int64_t start, int64_t k, int64_t d, int64_t lo, int64_t hi) {
    int64_t n = 0;
    for (int64_t j = 0; j < k; j++) n += start + j * d >= lo && start + j * d < hi;
    return n;
}

eng_status krn_cpu_grad_pool_exec(krn_call *c) {
    const krn_pool_params *p = &((const krn_pool_grad_params *)c->params)->pool;
    const eng_tensor *dyt = &c->in[0], *xt = &c->in[1];
    float *dx = c->out[0].data;
    const float *dy = dyt->data, *x = xt->data;
    int nsp = xt->ndim - 2;
    if (nsp < 1 || nsp > 3) return eng_err(ENG_STATUS_UNSUPPORTED, "pool gradient with %d spatial dims", nsp);
    if (p->kind == KRN_POOL_LP) return eng_err(ENG_STATUS_UNSUPPORTED, "LpPool gradient");
    geo3 g;
    int64_t one[3] = {1, 1, 1}, zero[6] = {0};
    if (p->global) geo3_fill(&g, nsp, xt->dims + 2, dyt->dims + 2, xt->dims + 2, one, one, zero);
    else geo3_fill(&g, nsp, xt->dims + 2, dyt->dims + 2, p->kernel, p->strides, p->dilations, p->pads);
    int64_t planes = xt->dims[0] * xt->dims[1], isz = g.in[0] * g.in[1] * g.in[2], osz = g.out[0] * g.out[1] * g.out[2];
    memset(dx, 0, (size_t)(planes * isz) * sizeof(float));
    int mx = p->kind == KRN_POOL_MAX, cip = p->count_include_pad;
#pragma omp parallel for num_threads(c->nthreads) schedule(static) if (planes * osz > 4096)
    for (int64_t pl = 0; pl < planes; pl++) {
        const float *xp = x + pl * isz;
        float *dp = dx + pl * isz;
        for (int64_t o0 = 0; o0 < g.out[0]; o0++)
            for (int64_t o1 = 0; o1 < g.out[1]; o1++)
                for (int64_t o2 = 0; o2 < g.out[2]; o2++) {
                    int64_t s0 = o0 * g.s[0] - g.pb[0], s1 = o1 * g.s[1] - g.pb[1], s2 = o2 * g.s[2] - g.pb[2];
                    float gv = dy[pl * osz + (o0 * g.out[1] + o1) * g.out[2] + o2];
                    double best = 0;
                    int64_t bi = -1, cnt = 0;
                    for (int pass = 0; pass < (mx ? 1 : 2); pass++) {
                        double share = pass ? (cnt ? gv / (double)cnt : 0) : 0;
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
                                        dp[idx] += (float)share;
                                    } else {
                                        cnt++;
                                    }
                                }
                            }
                        }
                        if (!mx && !pass && cip)
                            cnt = padded_count(s0, g.k[0], g.d[0], -g.pb[0], g.in[0] + g.pe[0]) *
                                  padded_count(s1, g.k[1], g.d[1], -g.pb[1], g.in[1] + g.pe[1]) *
                                  padded_count(s2, g.k[2], g.d[2], -g.pb[2], g.in[2] + g.pe[2]);
                    }
                    if (mx && bi >= 0) dp[bi] += gv;
                }
    }
    return ENG_STATUS_OK;
}

/* ---- MatMulGrad ---- */

eng_status krn_cpu_grad_matmul_exec(krn_call *c) {
    const eng_tensor *dyt = &c->in[0], *at = &c->in[1], *bt = &c->in[2];
    float *da = c->nout > 0 ? c->out[0].data : NULL, *dbm = c->nout > 1 ? c->out[1].data : NULL;
    int a1 = at->ndim == 1, b1 = bt->ndim == 1;
    int64_t m = a1 ? 1 : at->dims[at->ndim - 2], k = at->dims[at->ndim - 1], nn = b1 ? 1 : bt->dims[bt->ndim - 1];
    int ra = a1 ? 0 : at->ndim - 2, rb = b1 ? 0 : bt->ndim - 2, r = ra > rb ? ra : rb;
    int64_t bd[ENG_MAX_DIMS], sa[ENG_MAX_DIMS], sb[ENG_MAX_DIMS], nb = 1;
    int64_t stA = 1, stB = 1;
    for (int d = r - 1; d >= 0; d--) {
        int ia = d - (r - ra), ib = d - (r - rb);
        int64_t da_ = ia >= 0 ? at->dims[ia] : 1, db_ = ib >= 0 ? bt->dims[ib] : 1;
        bd[d] = da_ > db_ ? da_ : db_;
        sa[d] = da_ == 1 ? 0 : stA;
        sb[d] = db_ == 1 ? 0 : stB;
        stA *= da_;
        stB *= db_;
        nb *= bd[d];
    }
    const float *dy = dyt->data, *a = at->data, *b = bt->data;
    if (da) memset(da, 0, eng_tensor_nbytes(&c->out[0]));
    if (dbm) memset(dbm, 0, eng_tensor_nbytes(&c->out[1]));
    int64_t idx[ENG_MAX_DIMS] = {0}, oa = 0, ob = 0;
    for (int64_t i = 0; i < nb; i++) {
        const float *dyb = dy + i * m * nn, *ab = a + oa * m * k, *bb = b + ob * k * nn;
        if (da)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)k, (int)nn, 1.0f, dyb, (int)nn, bb, (int)nn,
                        1.0f, da + oa * m * k, (int)k);
        if (dbm)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)k, (int)nn, (int)m, 1.0f, ab, (int)k, dyb, (int)nn,
                        1.0f, dbm + ob * k * nn, (int)nn);
        for (int d = r - 1; d >= 0; d--) {
            oa += sa[d];
            ob += sb[d];
            if (++idx[d] < bd[d]) break;
            oa -= sa[d] * idx[d];
            ob -= sb[d] * idx[d];
            idx[d] = 0;
        }
    }
    return ENG_STATUS_OK;
}

/* ---- BatchNormalizationGrad ---- */

eng_status krn_cpu_grad_batchnorm_exec(krn_call *c) {
    const krn_bn_grad_params *p = c->params;
    const float *dy = c->in[0].data, *x = c->in[1].data, *scale = c->in[2].data, *rmean = c->in[3].data;
    const float *rvar = c->in[4].data;
    float *dx = c->out[0].data, *ds = c->nout > 1 ? c->out[1].data : NULL, *dbias = c->nout > 2 ? c->out[2].data : NULL;
    int64_t n = c->in[1].dims[0], ch = c->in[1].dims[1], sp = eng_shape_numel(c->in[1].dims + 2, c->in[1].ndim - 2);
    double cnt = (double)(n * sp);
#pragma omp parallel for num_threads(c->nthreads) if (n * ch * sp > 65536)
    for (int64_t cc = 0; cc < ch; cc++) {
        double mean = rmean[cc], var = rvar[cc];
        if (p->training) {
            double s = 0, q = 0;
            for (int64_t b = 0; b < n; b++)
                for (int64_t i = 0; i < sp; i++) s += x[(b * ch + cc) * sp + i];
            mean = cnt > 0 ? s / cnt : 0;
            for (int64_t b = 0; b < n; b++)
                for (int64_t i = 0; i < sp; i++) {
                    double d = x[(b * ch + cc) * sp + i] - mean;
                    q += d * d;
                }
            var = cnt > 0 ? q / cnt : 0;
        }
        double inv = 1.0 / sqrt(var + (double)p->epsilon), sdy = 0, sdyx = 0;
        for (int64_t b = 0; b < n; b++)
            for (int64_t i = 0; i < sp; i++) {
                int64_t j = (b * ch + cc) * sp + i;
                sdy += dy[j];
                sdyx += dy[j] * (x[j] - mean) * inv;
            }
        if (ds) ds[cc] = (float)sdyx;
        if (dbias) dbias[cc] = (float)sdy;
        double a = scale[cc] * inv;
        for (int64_t b = 0; b < n; b++)
            for (int64_t i = 0; i < sp; i++) {
                int64_t j = (b * ch + cc) * sp + i;
                double v = dy[j];
                if (p->training && cnt > 0) v = v - sdy / cnt - (x[j] - mean) * inv * sdyx / cnt;
                dx[j] = (float)(a * v);
            }
    }
    return ENG_STATUS_OK;
}

/* ---- LayerNormalizationGrad ---- */

eng_status krn_cpu_grad_layernorm_exec(krn_call *c) {
    const krn_ln_grad_params *p = c->params;
    const eng_tensor *st = &c->in[2];
    const float *dy = c->in[0].data, *x = c->in[1].data, *sc = st->data;
    float *dx = c->out[0].data, *ds = c->nout > 1 ? c->out[1].data : NULL, *dbias = c->nout > 2 ? c->out[2].data : NULL;
    int64_t rows = p->ln.rows, cols = p->ln.cols;
    /* scale broadcast to cols (right-aligned over x's dims[axis:]) */
    float *s = malloc((size_t)(cols > 0 ? cols : 1) * sizeof(float));
    double *acc = calloc((size_t)(2 * cols > 0 ? 2 * cols : 1), sizeof(double));
    if (!s || !acc) {
        free(s);
        free(acc);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "LayerNormalizationGrad scratch of %lld", (long long)cols);
    }
    const int64_t *xd = c->in[1].dims + p->ln.axis;
    int nd = c->in[1].ndim - p->ln.axis, off = nd - st->ndim;
    for (int64_t j = 0; j < cols; j++) {
        int64_t rem = j, si = 0, mul = 1;
        for (int d = nd - 1; d >= 0; d--) {
            int64_t id = rem % xd[d];
            rem /= xd[d];
            if (d >= off) {
                int64_t sd = st->dims[d - off];
                if (sd != 1) si += id * mul;
                mul *= sd;
            }
        }
        s[j] = sc[si];
    }
    double *ads = acc, *adb = acc + cols;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols, *gr = dy + r * cols;
        double mean = 0, var = 0;
        for (int64_t j = 0; j < cols; j++) mean += xr[j];
        mean /= (double)cols;
        for (int64_t j = 0; j < cols; j++) var += (xr[j] - mean) * (xr[j] - mean);
        var /= (double)cols;
        double inv = 1.0 / sqrt(var + (double)p->ln.epsilon), mg = 0, mgx = 0;
        for (int64_t j = 0; j < cols; j++) {
            double xh = (xr[j] - mean) * inv, gg = (double)gr[j] * s[j];
            mg += gg;
            mgx += gg * xh;
            ads[j] += gr[j] * xh;
            adb[j] += gr[j];
        }
        mg /= (double)cols;
        mgx /= (double)cols;
        for (int64_t j = 0; j < cols; j++) {
            double xh = (xr[j] - mean) * inv;
            dx[r * cols + j] = (float)(inv * ((double)gr[j] * s[j] - mg - xh * mgx));
        }
    }
    for (int64_t j = 0; j < cols; j++) {
        if (ds) ds[j] = (float)ads[j];
        if (dbias) dbias[j] = (float)adb[j];
    }
    free(s);
    free(acc);
    return ENG_STATUS_OK;
}
