/* grad-nn.c - CPU kernels of the nn gradient ops: ConvGrad (im2col + OpenBLAS sgemm), pool gradients,
 * MatMulGrad (sgemm per broadcast batch), BatchNormalizationGrad and LayerNormalizationGrad.
 *
 * Conv and pools treat 1-3 spatial dims as 3-D with leading 1s. ConvGrad per image and group:
 *   col = im2col(x)  (Cg*K, O);  dW += dy (Mg, O) @ col^T;  dcol = W^T @ dy;  dx = col2im(dcol);  db = sum dy.
 * Images run in parallel (one col buffer per thread); dW and db are accumulated per thread, then summed. Small
 * Cg*K (first layers) use a register-blocked AVX-512 dW kernel that also sums db, instead of sgemm. Outputs
 * that are omitted (data NULL) are skipped. MaxPoolGrad routes dy to the first maximum of each window, as the
 * forward kernel picks it (non-overlapping unpadded windows: one write pass, 2x2/2 vectorised; with
 * fused_relu it also applies ReluGrad's x > 0 mask); AveragePoolGrad uses the forward's divisor
 * (count_include_pad, clipped windows).
 */
#include <cblas.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "../kernel.h"
#include "../krn-grad.h"
#include "ew-math.h"

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

#ifdef __AVX512F__
/* dW (Mg, CK) += dy (Mg, O) @ col^T (CK, O) and db (Mg) += row sums of dy, for small CK (first layers: C*K of
 * a few dozen) where sgemm's per-call packing costs more than the arithmetic. 2 dy rows x 9 col rows per tile,
 * 18 zmm accumulators over the whole reduction length O; rows past the end are clamped and their sums dropped. */
#define DW_MR 2
#define DW_NR 9
static void conv_dw_small(const float *dy, const float *col, int64_t Mg, int64_t CK, int64_t O, float *dw, float *db) {
    __mmask16 tail = (__mmask16)((1u << (O % 16)) - 1);
    int64_t Of = O - O % 16;
    for (int64_t m0 = 0; m0 < Mg; m0 += DW_MR) {
        const float *d[DW_MR];
        for (int r = 0; r < DW_MR; r++) d[r] = dy + (m0 + r < Mg ? m0 + r : Mg - 1) * O;
        for (int64_t j0 = 0; j0 < CK; j0 += DW_NR) {
            const float *cr[DW_NR];
            for (int j = 0; j < DW_NR; j++) cr[j] = col + (j0 + j < CK ? j0 + j : CK - 1) * O;
            __m512 acc[DW_MR][DW_NR], sum[DW_MR];
            for (int r = 0; r < DW_MR; r++) {
                sum[r] = _mm512_setzero_ps();
                for (int j = 0; j < DW_NR; j++) acc[r][j] = _mm512_setzero_ps();
            }
            int64_t o = 0;
            for (; o < Of; o += 16) {
                __m512 dv[DW_MR];
                for (int r = 0; r < DW_MR; r++) dv[r] = _mm512_loadu_ps(d[r] + o), sum[r] = _mm512_add_ps(sum[r], dv[r]);
                for (int j = 0; j < DW_NR; j++) {
                    __m512 cv = _mm512_loadu_ps(cr[j] + o);
                    for (int r = 0; r < DW_MR; r++) acc[r][j] = _mm512_fmadd_ps(dv[r], cv, acc[r][j]);
                }
            }
            if (tail) {
                __m512 dv[DW_MR];
                for (int r = 0; r < DW_MR; r++)
                    dv[r] = _mm512_maskz_loadu_ps(tail, d[r] + o), sum[r] = _mm512_add_ps(sum[r], dv[r]);
                for (int j = 0; j < DW_NR; j++) {
                    __m512 cv = _mm512_maskz_loadu_ps(tail, cr[j] + o);
                    for (int r = 0; r < DW_MR; r++) acc[r][j] = _mm512_fmadd_ps(dv[r], cv, acc[r][j]);
                }
            }
            for (int r = 0; r < DW_MR && m0 + r < Mg; r++) {
                for (int j = 0; j < DW_NR && j0 + j < CK; j++) dw[(m0 + r) * CK + j0 + j] += _mm512_reduce_add_ps(acc[r][j]);
                if (db && j0 == 0) db[m0 + r] += _mm512_reduce_add_ps(sum[r]);
            }
        }
    }
}
#define CONV_DW_SMALL_MAX_CK KRN_CONV_DW_SMALL_MAX_CK
#endif

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
    if (!dx && !dw && !db) return ENG_STATUS_OK;
    if (dx) memset(dx, 0, (size_t)(n * C * isz) * sizeof(float));
    int nt = c->nthreads > 0 ? c->nthreads : 1;
    if (nt > n) nt = (int)(n > 0 ? n : 1);
    size_t colsz = (dx || dw) ? (size_t)(Cg * K * O) : 0;
    float *scratch = eng_alloc(((size_t)nt * (2 * colsz + (dw ? (size_t)wsz : 0)) + 1) * sizeof(float));
    int small = 0;
#ifdef CONV_DW_SMALL_MAX_CK
    small = dw && Cg * K <= CONV_DW_SMALL_MAX_CK && O >= 16;
#endif
    float *dbt = db ? calloc((size_t)nt * (size_t)M, sizeof(float)) : NULL;
    if (!scratch || (db && !dbt)) {
        eng_free(scratch);
        free(dbt);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "ConvGrad scratch (%lld threads x %zu floats)", (long long)nt, colsz);
    }
    float *dwt = scratch + (size_t)nt * 2 * colsz;
    if (dw) memset(dwt, 0, (size_t)nt * (size_t)wsz * sizeof(float));
    int blas_threads = openblas_get_num_threads();
    if (nt > 1) openblas_set_num_threads(1);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t b = 0; b < n; b++) {
        int tid = omp_get_thread_num();
        float *col = scratch + (size_t)tid * 2 * colsz, *dcol = col + colsz;
        float *mydw = dwt + (size_t)tid * (size_t)wsz;
        float *mydb = db ? dbt + (size_t)tid * (size_t)M : NULL;
        if (db && !small)
            for (int64_t m = 0; m < M; m++) mydb[m] += (float)ew_sum_f32(dy + (b * M + m) * O, O);
        if (!dx && !dw) continue;
        for (int64_t gi = 0; gi < G; gi++) {
            const float *xb = x + (b * C + gi * Cg) * isz, *dyb = dy + (b * M + gi * Mg) * O;
            const float *wg = w + gi * Mg * Cg * K;
            if (dw) {
                im2col(&g, Cg, xb, col, 0, NULL);
#ifdef CONV_DW_SMALL_MAX_CK
                if (small)
                    conv_dw_small(dyb, col, Mg, Cg * K, O, mydw + gi * Mg * Cg * K, mydb ? mydb + gi * Mg : NULL);
#endif
                if (!small)
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)Mg, (int)(Cg * K), (int)O, 1.0f, dyb,
                                (int)O, col, (int)O, 1.0f, mydw + gi * Mg * Cg * K, (int)(Cg * K));
            }
            if (dx) {
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)(Cg * K), (int)O, (int)Mg, 1.0f, wg,
                            (int)(Cg * K), dyb, (int)O, 0.0f, dcol, (int)O);
                im2col(&g, Cg, NULL, dcol, 1, dx + (b * C + gi * Cg) * isz);
            }
        }
    }
    if (nt > 1) openblas_set_num_threads(blas_threads);
    if (db) {
        for (int64_t m = 0; m < M; m++) {
            double sm = 0;
            for (int t = 0; t < nt; t++) sm += dbt[(size_t)t * (size_t)M + (size_t)m];
            db[m] = (float)sm;
        }
        free(dbt);
    }
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

/* MaxPoolGrad with non-overlapping windows (stride >= kernel, no padding, no dilation, outermost spatial dim
 * 1): each x cell is in at most one window, so dx is written once, with no scatter and no separate zeroing
 * pass. Per plane, window rows run across the output row; the 2x2 stride-2 case runs 16 windows per AVX-512
 * step. Same routing as the general loop (first maximum, strict >). Returns 0 when it does not apply. */
static void maxpool_grad_row_generic(const geo3 *g, const float *xp, float *dp, const float *gy, int64_t o1, int relu) {
    int64_t W = g->in[2], r0 = o1 * g->s[1];
    for (int64_t o2 = 0; o2 < g->out[2]; o2++) {
        int64_t c0 = o2 * g->s[2], bi = r0 * W + c0;
        float best = xp[bi];
        for (int64_t k1 = 0; k1 < g->k[1]; k1++)
            for (int64_t k2 = 0; k2 < g->k[2]; k2++) {
                int64_t idx = (r0 + k1) * W + c0 + k2;
                if (xp[idx] > best) best = xp[idx], bi = idx;
            }
        for (int64_t k1 = 0; k1 < g->k[1]; k1++)
            for (int64_t k2 = 0; k2 < g->k[2]; k2++) dp[(r0 + k1) * W + c0 + k2] = 0.0f;
        dp[bi] = relu && !(best > 0.0f) ? 0.0f : gy[o2];
    }
}

#ifdef __AVX512F__
/* k = s = 2 along both dims: one output row (two x rows), 16 windows per step. */
static void maxpool_grad_row_2x2(const float *x0, const float *x1, float *d0, float *d1, const float *gy, int64_t ow,
                                 int relu) {
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    for (int64_t o = 0; o < ow; o += 16) {
        int64_t n = ow - o < 16 ? ow - o : 16;
        __mmask16 m = (__mmask16)((1u << n) - 1);
        __mmask16 mlo = (__mmask16)(n >= 8 ? 0xffff : (1u << (2 * n)) - 1);
        __mmask16 mhi = (__mmask16)(n <= 8 ? 0 : (1u << (2 * (n - 8))) - 1);
        const float *a0 = x0 + 2 * o, *a1 = x1 + 2 * o;
        __m512 p0 = _mm512_maskz_loadu_ps(mlo, a0), p1 = _mm512_maskz_loadu_ps(mhi, a0 + 16);
        __m512 q0 = _mm512_maskz_loadu_ps(mlo, a1), q1 = _mm512_maskz_loadu_ps(mhi, a1 + 16);
        __m512 a = _mm512_permutex2var_ps(p0, ev, p1), b = _mm512_permutex2var_ps(p0, od, p1);
        __m512 cc = _mm512_permutex2var_ps(q0, ev, q1), dd = _mm512_permutex2var_ps(q0, od, q1);
        __m512 gv = _mm512_maskz_loadu_ps(m, gy + o);
        /* first maximum in order a, b, c, d (strict >) */
        __mmask16 sb = _mm512_cmp_ps_mask(b, a, _CMP_GT_OQ);
        __m512 best = _mm512_mask_blend_ps(sb, a, b);
        __mmask16 sc = _mm512_cmp_ps_mask(cc, best, _CMP_GT_OQ);
        best = _mm512_mask_blend_ps(sc, best, cc);
        __mmask16 sd = _mm512_cmp_ps_mask(dd, best, _CMP_GT_OQ);
        best = _mm512_mask_blend_ps(sd, best, dd);
        if (relu) gv = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(best, _mm512_setzero_ps(), _CMP_GT_OQ), gv);
        sc &= (__mmask16)~sd;
        sb &= (__mmask16)~(sc | sd);
        __mmask16 sa = (__mmask16)~(sb | sc | sd);
        __m512 ga = _mm512_maskz_mov_ps(sa, gv), gb = _mm512_maskz_mov_ps(sb, gv);
        __m512 gc = _mm512_maskz_mov_ps(sc, gv), gd = _mm512_maskz_mov_ps(sd, gv);
        _mm512_mask_storeu_ps(d0 + 2 * o, mlo, _mm512_permutex2var_ps(ga, lo, gb));
        _mm512_mask_storeu_ps(d0 + 2 * o + 16, mhi, _mm512_permutex2var_ps(ga, hi, gb));
        _mm512_mask_storeu_ps(d1 + 2 * o, mlo, _mm512_permutex2var_ps(gc, lo, gd));
        _mm512_mask_storeu_ps(d1 + 2 * o + 16, mhi, _mm512_permutex2var_ps(gc, hi, gd));
    }
}
#endif

/* One plane of a 2-D max pool's gradient with any kernel, stride and padding (overlapping windows: ResNet's 3x3
 * stride 2 pad 1): each window's first maximum in row-major order, as the forward kernel picks it, gets dy. */
static void maxpool_grad_plane_2d(const geo3 *g, const float *xp, const float *gp, float *dp, int relu) {
    int64_t H = g->in[1], W = g->in[2], OH = g->out[1], OW = g->out[2];
    memset(dp, 0, (size_t)(H * W) * sizeof(float));
    for (int64_t o1 = 0; o1 < OH; o1++) {
        int64_t h0 = o1 * g->s[1] - g->pb[1], hs = h0 > 0 ? h0 : 0, he = h0 + g->k[1] < H ? h0 + g->k[1] : H;
        for (int64_t o2 = 0; o2 < OW; o2++) {
            int64_t w0 = o2 * g->s[2] - g->pb[2], ws = w0 > 0 ? w0 : 0, we = w0 + g->k[2] < W ? w0 + g->k[2] : W;
            int64_t bi = -1;
            float best = 0;
            for (int64_t h = hs; h < he; h++)
                for (int64_t w = ws; w < we; w++)
                    if (bi < 0 || xp[h * W + w] > best) best = xp[h * W + w], bi = h * W + w;
            if (bi >= 0 && (!relu || best > 0)) dp[bi] += gp[o1 * OW + o2];
        }
    }
}

static int maxpool_grad_fast(const krn_call *c, const geo3 *g, int64_t planes, const float *dy, const float *x,
                             float *dx, int relu) {
    int plane2d = g->in[0] == 1 && g->k[0] == 1 && g->k[1] >= 1 && g->k[2] >= 1;
    int tiled = 1; /* non-overlapping unpadded windows: the write-once paths below */
    for (int i = 0; i < 3; i++) {
        plane2d = plane2d && g->d[i] == 1;
        tiled = tiled && g->d[i] == 1 && !g->pb[i] && !g->pe[i] && g->s[i] >= g->k[i] && g->k[i] >= 1;
    }
    if (!tiled) {
        if (!plane2d) return 0;
        int64_t isz = g->in[1] * g->in[2], osz = g->out[1] * g->out[2];
#pragma omp parallel for num_threads(c->nthreads) schedule(static) if (planes * isz > 32768)
        for (int64_t pl = 0; pl < planes; pl++) maxpool_grad_plane_2d(g, x + pl * isz, dy + pl * osz, dx + pl * isz, relu);
        return 1;
    }
    if (g->in[0] != 1 || g->out[1] < 1 || g->out[2] < 1) return 0;
    for (int i = 1; i < 3; i++)
        if ((g->out[i] - 1) * g->s[i] + g->k[i] > g->in[i]) return 0;
    int64_t H = g->in[1], W = g->in[2], OH = g->out[1], OW = g->out[2], isz = H * W, osz = OH * OW;
    /* cells outside every window: columns between/after windows, rows between/after window rows */
    int64_t covw = g->s[2] == g->k[2] ? OW * g->k[2] : -1, covh = g->s[1] == g->k[1] ? OH * g->k[1] : -1;
    int exact = covw == W && covh == H;
#ifdef __AVX512F__
    int k22 = g->k[1] == 2 && g->s[1] == 2 && g->k[2] == 2 && g->s[2] == 2;
#endif
#pragma omp parallel for num_threads(c->nthreads) schedule(static) if (planes * isz > 32768)
    for (int64_t pl = 0; pl < planes; pl++) {
        const float *xp = x + pl * isz, *gp = dy + pl * osz;
        float *dp = dx + pl * isz;
        if (!exact) memset(dp, 0, (size_t)isz * sizeof(float));
        for (int64_t o1 = 0; o1 < OH; o1++) {
#ifdef __AVX512F__
            if (k22) {
                int64_t r = 2 * o1 * W;
                maxpool_grad_row_2x2(xp + r, xp + r + W, dp + r, dp + r + W, gp + o1 * OW, OW, relu);
                continue;
            }
#endif
            maxpool_grad_row_generic(g, xp, dp, gp + o1 * OW, o1, relu);
        }
    }
    return 1;
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
    int mx = p->kind == KRN_POOL_MAX, cip = p->count_include_pad;
    int relu = mx && ((const krn_pool_grad_params *)c->params)->relu;
    if (mx && maxpool_grad_fast(c, &g, planes, dy, x, dx, relu)) return ENG_STATUS_OK;
    if (p->global && !mx) { /* GlobalAveragePool: every cell of a plane gets its dy / cells */
#pragma omp parallel for num_threads(c->nthreads) schedule(static) if (planes * isz > 32768)
        for (int64_t pl = 0; pl < planes; pl++) {
            float v = isz ? dy[pl] / (float)isz : 0.0f, *dp = dx + pl * isz;
            for (int64_t i = 0; i < isz; i++) dp[i] = v;
        }
        return ENG_STATUS_OK;
    }
    memset(dx, 0, (size_t)(planes * isz) * sizeof(float));
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
                    if (mx && bi >= 0 && (!relu || xp[bi] > 0)) dp[bi] += gv;
                }
    }
    return ENG_STATUS_OK;
}

/* ---- depthwise ConvGrad's weight gradient ---- */

/* dW (C, 1, KH, KW) and dB (C) of a 2-D depthwise convolution (group = C = M, dilation 1) on plain NCHW float32 x
 * and dy, 16 channels at a time: each image's 16 planes of x (zero-padded) and of dy are interleaved into
 * [position][16] buffers, so every kernel tap is one 16-lane multiply-add per output position whatever the plane's
 * width; per-image float sums are folded into double. Channel blocks over threads. oneDNN 2.6 has a fast kernel only
 * for 3x3 here and falls back to a per-group gemm 15-50x slower for 5x5 (EfficientNet, MnasNet). dw or db may be
 * NULL (not wanted). krn_cpu_dw_conv_grad_takes says which shapes it takes; returns 0 for any other (or out of
 * memory). */
int krn_cpu_dw_conv_grad_takes(const krn_call *c, const krn_conv_params *p) {
    const eng_tensor *dyt = &c->in[0], *xt = &c->in[1], *wt = &c->in[2];
    return xt->ndim == 4 && dyt->ndim == 4 && wt->ndim == 4 && xt->dtype == ENG_DTYPE_F32 && dyt->dtype == ENG_DTYPE_F32 &&
           p->group > 1 && p->group == xt->dims[1] && wt->dims[0] == p->group && wt->dims[1] == 1 &&
           p->dilations[0] == 1 && p->dilations[1] == 1 && wt->dims[2] * wt->dims[3] <= 64;
}

int krn_cpu_dw_conv_grad_weights(const krn_call *c, const krn_conv_params *p, float *dw, float *db) {
    const eng_tensor *dyt = &c->in[0], *xt = &c->in[1], *wt = &c->in[2];
    if (!krn_cpu_dw_conv_grad_takes(c, p)) return 0;
    int64_t N = xt->dims[0], C = xt->dims[1], H = xt->dims[2], W = xt->dims[3], OH = dyt->dims[2], OW = dyt->dims[3];
    int64_t KH = wt->dims[2], KW = wt->dims[3], sh = p->strides[0], sw = p->strides[1], ph = p->pads[0], pw = p->pads[1];
    int64_t Hp = (OH - 1) * sh + KH, Wp = (OW - 1) * sw + KW; /* the padded rows / columns the taps read */
    int64_t nblk = (C + 15) / 16, K = KH * KW;
    const float *x = xt->data, *dy = dyt->data;
    int ok = 1;
#pragma omp parallel num_threads(c->nthreads)
    {
        float *xb = eng_alloc((size_t)(Hp * Wp * 16) * sizeof(float)), *gb = eng_alloc((size_t)(OH * OW * 16) * sizeof(float));
        if (!xb || !gb) {
#pragma omp atomic write
            ok = 0;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t b = 0; b < nblk; b++) {
            if (!xb || !gb) continue;
            int64_t c0 = b * 16, nc = C - c0 < 16 ? C - c0 : 16;
            double accd[64][16] = {{0}}, bd[16] = {0};
            float acc[64][16], bs[16];
            for (int64_t n = 0; n < N; n++) {
                memset(xb, 0, (size_t)(Hp * Wp * 16) * sizeof(float));
                memset(gb, 0, (size_t)(OH * OW * 16) * sizeof(float));
                for (int64_t l = 0; l < nc; l++) {
                    const float *xp = x + (n * C + c0 + l) * H * W, *gp = dy + (n * C + c0 + l) * OH * OW;
                    for (int64_t h = 0; h < Hp; h++) {
                        int64_t ih = h - ph;
                        if (ih < 0 || ih >= H) continue;
                        for (int64_t w = 0; w < Wp; w++) {
                            int64_t iw = w - pw;
                            if (iw >= 0 && iw < W) xb[(h * Wp + w) * 16 + l] = xp[ih * W + iw];
                        }
                    }
                    for (int64_t o = 0; o < OH * OW; o++) gb[o * 16 + l] = gp[o];
                }
                memset(acc, 0, sizeof acc);
                memset(bs, 0, sizeof bs);
                for (int64_t o1 = 0; o1 < OH; o1++)
                    for (int64_t o2 = 0; o2 < OW; o2++) {
                        const float *g = gb + (o1 * OW + o2) * 16;
#pragma omp simd
                        for (int l = 0; l < 16; l++) bs[l] += g[l];
                        for (int64_t kh = 0; kh < KH; kh++) {
                            const float *xr = xb + ((o1 * sh + kh) * Wp + o2 * sw) * 16;
                            for (int64_t kw = 0; kw < KW; kw++) {
                                float *a = acc[kh * KW + kw];
                                const float *xv = xr + kw * 16;
#pragma omp simd
                                for (int l = 0; l < 16; l++) a[l] += g[l] * xv[l];
                            }
                        }
                    }
                for (int64_t k = 0; k < K; k++)
                    for (int l = 0; l < 16; l++) accd[k][l] += acc[k][l];
                for (int l = 0; l < 16; l++) bd[l] += bs[l];
            }
            for (int64_t l = 0; l < nc; l++) {
                for (int64_t k = 0; dw && k < K; k++) dw[(c0 + l) * K + k] = (float)accd[k][l];
                if (db) db[c0 + l] = (float)bd[l];
            }
        }
        eng_free(xb);
        eng_free(gb);
    }
    return ok;
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

/* BatchNormalizationGrad: per channel (channels over threads), one pass for the batch statistics again (training
 * mode) and the sums of dy and dy * x_hat (ew_channel_sums, around one of the channel's values), then dx in one
 * vectorised pass. */
eng_status krn_cpu_grad_batchnorm_exec(krn_call *c) {
    const krn_bn_grad_params *p = c->params;
    const float *dy = c->in[0].data, *x = c->in[1].data, *scale = c->in[2].data, *rmean = c->in[3].data;
    const float *rvar = c->in[4].data;
    float *dx = c->out[0].data, *ds = c->nout > 1 ? c->out[1].data : NULL, *dbias = c->nout > 2 ? c->out[2].data : NULL;
    int64_t n = c->in[1].dims[0], ch = c->in[1].dims[1], sp = eng_shape_numel(c->in[1].dims + 2, c->in[1].ndim - 2);
    double cnt = (double)(n * sp);
#pragma omp parallel for num_threads(c->nthreads) if (n * ch * sp > 65536)
    for (int64_t cc = 0; cc < ch; cc++) {
        /* one pass over x and dy: the batch statistics (training) and the sums of dy and dy * (x - mean) */
        double mean = rmean[cc], var = rvar[cc], s[4];
        float k = p->training ? (n * sp > 0 ? x[cc * sp] : 0.0f) : (float)mean;
        ew_channel_sums(x, dy, n, ch, sp, cc, k, s);
        if (p->training) ew_sums_moments(s, cnt, k, &mean, &var);
        double inv = 1.0 / sqrt(var + (double)p->epsilon), sdy = s[2];
        double sdyx = (s[3] - (mean - k) * sdy) * inv; /* sum dy * (x - mean) * inv */
        if (ds) ds[cc] = (float)sdyx;
        if (dbias) dbias[cc] = (float)sdy;
        double a = scale[cc] * inv;
        int tr = p->training && cnt > 0;
        float fa = (float)a, k1 = tr ? (float)(sdy / cnt) : 0.0f, k2 = tr ? (float)(inv * sdyx / cnt) : 0.0f;
        float fm = (float)mean;
        for (int64_t b = 0; b < n; b++) {
            int64_t o = (b * ch + cc) * sp;
            const float *xr = x + o, *gr = dy + o;
            float *dr = dx + o;
#pragma omp simd
            for (int64_t i = 0; i < sp; i++) dr[i] = fa * (gr[i] - k1 - (xr[i] - fm) * k2);
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
    /* rows split over threads; each thread sums its own dscale/dbias partials (float, vectorised), folded into
     * double at the end in thread order (deterministic for a given thread count) */
    int T = rows * cols > 65536 && c->nthreads > 1 ? c->nthreads : 1;
    float *part = calloc((size_t)T * 2 * (size_t)(cols > 0 ? cols : 1), sizeof *part);
    if (!part) {
        free(s);
        free(acc);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "LayerNormalizationGrad scratch of %lld", (long long)cols);
    }
    float eps = p->ln.epsilon, rc = 1.0f / (float)cols;
#pragma omp parallel num_threads(T) if (T > 1)
    {
        int t = omp_get_thread_num(), nT = omp_get_num_threads();
        int64_t r0 = rows * t / nT, r1 = rows * (t + 1) / nT;
        float *pds = part + (size_t)t * 2 * cols, *pdb = pds + cols;
        for (int64_t r = r0; r < r1; r++) {
            const float *xr = x + r * cols, *gr = dy + r * cols;
            float *dr = dx + r * cols;
            float mean = (float)(ew_sum_f32(xr, cols) / (double)cols), var = 0, mg = 0, mgx = 0;
#pragma omp simd reduction(+ : var)
            for (int64_t j = 0; j < cols; j++) var += (xr[j] - mean) * (xr[j] - mean);
            float inv = 1.0f / sqrtf(var * rc + eps);
#pragma omp simd reduction(+ : mg, mgx)
            for (int64_t j = 0; j < cols; j++) {
                float xh = (xr[j] - mean) * inv, gg = gr[j] * s[j];
                mg += gg;
                mgx += gg * xh;
                pds[j] += gr[j] * xh;
                pdb[j] += gr[j];
            }
            mg *= rc;
            mgx *= rc;
#pragma omp simd
            for (int64_t j = 0; j < cols; j++) dr[j] = inv * (gr[j] * s[j] - mg - (xr[j] - mean) * inv * mgx);
        }
    }
    for (int t = 0; t < T; t++)
        for (int64_t j = 0; j < cols; j++) {
            acc[j] += part[(size_t)t * 2 * cols + j];
            acc[cols + j] += part[(size_t)t * 2 * cols + cols + j];
        }
    free(part);
    for (int64_t j = 0; j < cols; j++) {
        if (ds) ds[j] = (float)acc[j];
        if (dbias) dbias[j] = (float)acc[cols + j];
    }
    free(s);
    free(acc);
    return ENG_STATUS_OK;
}
