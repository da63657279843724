/* rnn-grad.c - CPU kernel "rnn_grad" of the com.tensord ops RNNGrad / GRUGrad / LSTMGrad (krn-rnn.h).
 *
 * Per direction: recompute the forward pass keeping every gate's pre-activation and activation, then
 * backpropagate through time. Rows of the N = seq * batch row space are X's rows (layout 0: t * batch + b,
 * layout 1: b * seq + t), so that the input-side products are single GEMMs over all steps:
 *   forward:  pre = X W^T (one GEMM), then per step  h_prev R^T  (one GEMM of batch rows);
 *   backward: per step  dh_prev = dGates_R R  (one GEMM);  after the loop  dX += dGates_W W,  dW = dGates_W^T X,
 *             dR = dGates_R^T H_prev,  dB = column sums  (one GEMM each; GRU with linear_before_reset=0 splits dR in
 *             the z/r block, against h_prev, and the h block, against r * h_prev).
 * dGates_W are the gradients of the gate pre-activations (what W and Wb multiply); dGates_R those of what R and Rb
 * produce: the same except GRU with linear_before_reset=1, whose h block there is dh_pre * r.
 *
 * Invariants kept with the forward kernel (rnn.c): clip bounds each gate's full pre-activation (after biases and
 * peepholes) before its activation, so the gradient is zero where it clipped; LSTM input_forget sets f = 1 - i;
 * peepholes i, f see c_prev and o sees the new c. Batch row b runs steps t < sequence_lens[b] (reverse: t =
 * len - 1 down to 0); padded rows of Y are zeros, so dY there is ignored, and the state carries through padded
 * steps, so dY_h / dY_c reach the last real step and d_initial_h / d_initial_c pass through untouched where
 * len == 0. Outputs whose data is NULL are not computed. Threads: OpenBLAS's, in the GEMMs; the gate math is one
 * thread (an OpenMP team per step next to OpenBLAS's spinning threads was 5-10x slower on 2 cores). The workspace is
 * allocated per call: at most seq * batch * (4 * gates + 4) * hidden floats, reused by the two directions.
 */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "../kernel.h"
#include "../krn-rnn.h"
#include "rnn-act.h"

typedef struct rg_geo {
    const krn_rnn_params *p;
    int64_t S, B, IS, H, G, GH, N;
    int rev; /* the direction being computed runs backwards in time */
} rg_geo;

static inline int64_t rg_row(const rg_geo *g, int64_t t, int64_t b) {
    return g->p->layout ? b * g->S + t : t * g->B + b;
}
/* Offset of (t, dir, b) in Y / dY. */
static inline int64_t rg_y(const rg_geo *g, int64_t t, int d, int64_t b) {
    int nd = g->p->ndir;
    return (g->p->layout ? (b * g->S + t) * nd + d : (t * nd + d) * g->B + b) * g->H;
}
/* Offset of (dir, b) in a state tensor (initial_h, Y_h, ...). */
static inline int64_t rg_st(const rg_geo *g, int d, int64_t b) {
    return (g->p->layout ? b * g->p->ndir + d : d * g->B + b) * g->H;
}

static inline float rg_clip(const krn_rnn_params *p, float x) {
    if (!p->has_clip) return x;
    return x > p->clip ? p->clip : x < -p->clip ? -p->clip : x;
}
static inline float rg_f(const krn_rnn_params *p, const krn_rnn_act *a, float x) {
    return krn_rnn_act_f(a, rg_clip(p, x));
}
/* d act(clip(x)) / dx given y = act(clip(x)). */
static inline float rg_df(const krn_rnn_params *p, const krn_rnn_act *a, float x, float y) {
    if (p->has_clip && (x > p->clip || x < -p->clip)) return 0.0f;
    return krn_rnn_act_df(a, x, y);
}

/* Per-direction workspace; rows in X order (N rows). */
typedef struct rg_ws {
    float *pre, *act;     /* (N, GH) gate pre-activations (unclipped) and activations */
    float *hprev;         /* (N, H) the state each step started from */
    float *cprev, *cnew;  /* (N, H) LSTM */
    float *aux;           /* (N, H) GRU: lbr=1 m = h_prev Rh^T + Rbh; lbr=0 r * h_prev */
    float *dgw, *dgr;     /* (N, GH) gate gradients, W side and R side (dgr == dgw except GRU lbr=1) */
    float *h, *c, *dh, *dc, *dhd, *dhp; /* (B, H) */
    float *hr, *dgs;      /* (B, GH) */
    float *rh;            /* (B, H) GRU lbr=0 */
    double *acc;          /* (2GH + 3H) column sums: dWb, dRb, dP */
    int64_t *len;         /* (B) */
} rg_ws;

static void rg_ws_free(rg_ws *w) {
    free(w->pre), free(w->act), free(w->hprev), free(w->cprev), free(w->cnew), free(w->aux), free(w->dgw);
    if (w->dgr != w->dgw) free(w->dgr);
    free(w->h), free(w->c), free(w->dh), free(w->dc), free(w->dhd), free(w->dhp), free(w->hr), free(w->dgs);
    free(w->rh), free(w->acc), free(w->len);
    memset(w, 0, sizeof *w);
}

static eng_status rg_ws_alloc(rg_ws *w, const rg_geo *g) {
    const krn_rnn_params *p = g->p;
    size_t N = (size_t)g->N, GH = (size_t)g->GH, H = (size_t)g->H, B = (size_t)g->B, f = sizeof(float);
    int lstm = p->cell == KRN_RNN_LSTM, gru = p->cell == KRN_RNN_GRU;
    memset(w, 0, sizeof *w);
    w->pre = malloc(N * GH * f), w->act = calloc(N * GH, f), w->hprev = calloc(N * H, f);
    w->dgw = calloc(N * GH, f);
    w->dgr = gru && p->linear_before_reset ? calloc(N * GH, f) : w->dgw;
    if (lstm) w->cprev = calloc(N * H, f), w->cnew = calloc(N * H, f);
    if (gru) w->aux = calloc(N * H, f), w->rh = calloc(B * H, f);
    w->h = calloc(B * H, f), w->c = calloc(B * H, f), w->dh = calloc(B * H, f), w->dc = calloc(B * H, f);
    w->dhd = calloc(B * H, f), w->dhp = calloc(B * H, f), w->hr = calloc(B * GH, f), w->dgs = calloc(B * GH, f);
    w->acc = calloc(2 * GH + 3 * H, sizeof(double)), w->len = calloc(B, sizeof(int64_t));
    if (!w->pre || !w->act || !w->hprev || !w->dgw || !w->dgr || (lstm && (!w->cprev || !w->cnew)) ||
        (gru && (!w->aux || !w->rh)) || !w->h || !w->c || !w->dh || !w->dc || !w->dhd || !w->dhp || !w->hr ||
        !w->dgs || !w->acc || !w->len) {
        rg_ws_free(w);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "rnn_grad: workspace of %lld rows x %lld gates", (long long)N,
                       (long long)GH);
    }
    return ENG_STATUS_OK;
}

static inline int64_t rg_time(const rg_geo *g, const rg_ws *w, int64_t s, int64_t b) {
    return g->rev ? w->len[b] - 1 - s : s;
}

/* Forward pass of direction d, keeping the gates. */
static void rg_forward(const rg_geo *g, rg_ws *w, int d, const float *X, const float *W, const float *R,
                       const float *Bv, const float *h0, const float *c0, const float *P) {
    const krn_rnn_params *p = g->p;
    const int64_t Bn = g->B, IS = g->IS, H = g->H, GH = g->GH, N = g->N;
    const krn_rnn_act *A = p->act[d];
    const float *Wd = W + d * GH * IS, *Rd = R + d * GH * H;
    const float *Wb = Bv ? Bv + d * 2 * GH : NULL, *Rb = Wb ? Wb + GH : NULL;
    const float *Pi = P ? P + d * 3 * H : NULL, *Po = Pi ? Pi + H : NULL, *Pf = Pi ? Pi + 2 * H : NULL;
    int gru = p->cell == KRN_RNN_GRU, lbr = gru && p->linear_before_reset;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)GH, (int)IS, 1.0f, X, (int)IS, Wd, (int)IS, 0.0f,
                w->pre, (int)GH);
    if (Wb)
        for (int64_t r = 0; r < N; r++) {
            float *pr = w->pre + r * GH;
            for (int64_t j = 0; j < GH; j++) pr[j] += Wb[j] + (lbr && j >= 2 * H ? 0.0f : Rb[j]);
        }
    for (int64_t b = 0; b < Bn; b++)
        for (int64_t j = 0; j < H; j++) {
            w->h[b * H + j] = h0 ? h0[rg_st(g, d, b) + j] : 0.0f;
            w->c[b * H + j] = c0 ? c0[rg_st(g, d, b) + j] : 0.0f;
        }
    int64_t smax = 0;
    for (int64_t b = 0; b < Bn; b++) smax = w->len[b] > smax ? w->len[b] : smax;
    for (int64_t s = 0; s < smax; s++) {
        /* hr = h_prev R^T (GRU lbr=0: the z and r blocks only; the h block needs r first) */
        int64_t ng = gru && !lbr ? 2 * H : GH;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)Bn, (int)ng, (int)H, 1.0f, w->h, (int)H, Rd, (int)H,
                    0.0f, w->hr, (int)GH);
        if (gru && !lbr) {
            for (int64_t b = 0; b < Bn; b++) {
                if (s >= w->len[b]) continue;
                int64_t r = rg_row(g, rg_time(g, w, s, b), b);
                float *pr = w->pre + r * GH, *ar = w->act + r * GH, *hr = w->hr + b * GH, *hb = w->h + b * H;
                for (int64_t j = 0; j < 2 * H; j++) {
                    pr[j] += hr[j];
                    ar[j] = rg_f(p, &A[0], pr[j]);
                }
                for (int64_t j = 0; j < H; j++) w->aux[r * H + j] = w->rh[b * H + j] = ar[H + j] * hb[j];
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)Bn, (int)H, (int)H, 1.0f, w->rh, (int)H,
                        Rd + 2 * H * H, (int)H, 0.0f, w->hr + 2 * H, (int)GH);
        }
        for (int64_t b = 0; b < Bn; b++) {
            if (s >= w->len[b]) continue;
            int64_t r = rg_row(g, rg_time(g, w, s, b), b);
            float *pr = w->pre + r * GH, *ar = w->act + r * GH, *hr = w->hr + b * GH, *hb = w->h + b * H;
            memcpy(w->hprev + r * H, hb, (size_t)H * sizeof(float));
            if (p->cell == KRN_RNN_VANILLA) {
                for (int64_t j = 0; j < H; j++) {
                    pr[j] += hr[j];
                    hb[j] = ar[j] = rg_f(p, &A[0], pr[j]);
                }
            } else if (gru) {
                for (int64_t j = 0; j < H; j++) {
                    float z, rr, hh;
                    if (lbr) {
                        pr[j] += hr[j], pr[H + j] += hr[H + j];
                        z = ar[j] = rg_f(p, &A[0], pr[j]);
                        rr = ar[H + j] = rg_f(p, &A[0], pr[H + j]);
                        float m = hr[2 * H + j] + (Rb ? Rb[2 * H + j] : 0.0f);
                        w->aux[r * H + j] = m;
                        pr[2 * H + j] += rr * m;
                    } else {
                        z = ar[j];
                        pr[2 * H + j] += hr[2 * H + j];
                    }
                    hh = ar[2 * H + j] = rg_f(p, &A[1], pr[2 * H + j]);
                    hb[j] = (1.0f - z) * hh + z * hb[j];
                }
            } else {
                float *cb = w->c + b * H;
                for (int64_t j = 0; j < H; j++) {
                    float cp = cb[j];
                    w->cprev[r * H + j] = cp;
                    pr[j] += hr[j] + (Pi ? Pi[j] * cp : 0.0f);
                    pr[2 * H + j] += hr[2 * H + j] + (Pf ? Pf[j] * cp : 0.0f);
                    pr[3 * H + j] += hr[3 * H + j];
                    float i = ar[j] = rg_f(p, &A[0], pr[j]);
                    float f = ar[2 * H + j] = p->input_forget ? 1.0f - i : rg_f(p, &A[0], pr[2 * H + j]);
                    float gg = ar[3 * H + j] = rg_f(p, &A[1], pr[3 * H + j]);
                    float cn = f * cp + i * gg;
                    w->cnew[r * H + j] = cb[j] = cn;
                    pr[H + j] += hr[H + j] + (Po ? Po[j] * cn : 0.0f);
                    float o = ar[H + j] = rg_f(p, &A[0], pr[H + j]);
                    hb[j] = o * krn_rnn_act_f(&A[2], cn);
                }
            }
        }
    }
}

/* Backward pass of direction d: fills dgw / dgr, leaves d_initial_h / d_initial_c in dh / dc. */
static void rg_backward(const rg_geo *g, rg_ws *w, int d, const float *R, const float *dY, const float *dYh,
                        const float *dYc, const float *P) {
    const krn_rnn_params *p = g->p;
    const int64_t Bn = g->B, H = g->H, GH = g->GH;
    const krn_rnn_act *A = p->act[d];
    const float *Rd = R + d * GH * H;
    const float *Pi = P ? P + d * 3 * H : NULL, *Po = Pi ? Pi + H : NULL, *Pf = Pi ? Pi + 2 * H : NULL;
    int gru = p->cell == KRN_RNN_GRU, lbr = gru && p->linear_before_reset;
    for (int64_t b = 0; b < Bn; b++)
        for (int64_t j = 0; j < H; j++) {
            w->dh[b * H + j] = dYh ? dYh[rg_st(g, d, b) + j] : 0.0f;
            w->dc[b * H + j] = dYc ? dYc[rg_st(g, d, b) + j] : 0.0f;
        }
    int64_t smax = 0;
    for (int64_t b = 0; b < Bn; b++) smax = w->len[b] > smax ? w->len[b] : smax;
    for (int64_t s = smax - 1; s >= 0; s--) {
        memset(w->dgs, 0, (size_t)(Bn * GH) * sizeof(float));
        for (int64_t b = 0; b < Bn; b++) {
            if (s >= w->len[b]) continue;
            int64_t t = rg_time(g, w, s, b), r = rg_row(g, t, b);
            const float *pr = w->pre + r * GH, *ar = w->act + r * GH, *hp = w->hprev + r * H;
            float *dh = w->dh + b * H, *dg = w->dgw + r * GH, *ds = w->dgs + b * GH, *dhd = w->dhd + b * H;
            if (dY)
                for (int64_t j = 0; j < H; j++) dh[j] += dY[rg_y(g, t, d, b) + j];
            if (p->cell == KRN_RNN_VANILLA) {
                for (int64_t j = 0; j < H; j++) {
                    ds[j] = dg[j] = dh[j] * rg_df(p, &A[0], pr[j], ar[j]);
                    dhd[j] = 0.0f;
                }
            } else if (gru) {
                for (int64_t j = 0; j < H; j++) {
                    float z = ar[j], hh = ar[2 * H + j];
                    float dz = dh[j] * (hp[j] - hh), dah = dh[j] * (1.0f - z) * rg_df(p, &A[1], pr[2 * H + j], hh);
                    dhd[j] = dh[j] * z;
                    ds[j] = dg[j] = dz * rg_df(p, &A[0], pr[j], z);
                    dg[2 * H + j] = dah;
                    if (lbr) {
                        float rr = ar[H + j];
                        ds[H + j] = dg[H + j] = dah * w->aux[r * H + j] * rg_df(p, &A[0], pr[H + j], rr);
                        ds[2 * H + j] = dah * rr;
                    } else {
                        ds[2 * H + j] = dah;
                    }
                }
            } else {
                float *dc = w->dc + b * H;
                for (int64_t j = 0; j < H; j++) {
                    float i = ar[j], o = ar[H + j], f = ar[2 * H + j], gg = ar[3 * H + j];
                    float cp = w->cprev[r * H + j], cn = w->cnew[r * H + j];
                    float hc = krn_rnn_act_f(&A[2], cn);
                    float dao = dh[j] * hc * rg_df(p, &A[0], pr[H + j], o);
                    float dcj = dc[j] + dh[j] * o * krn_rnn_act_df(&A[2], cn, hc) + (Po ? dao * Po[j] : 0.0f);
                    float di = dcj * gg, dgg = dcj * i, df = dcj * cp, dcp = dcj * f, daf = 0.0f;
                    if (p->input_forget) di -= df;
                    else daf = df * rg_df(p, &A[0], pr[2 * H + j], f);
                    float dai = di * rg_df(p, &A[0], pr[j], i), dac = dgg * rg_df(p, &A[1], pr[3 * H + j], gg);
                    if (Pi) dcp += dai * Pi[j] + daf * Pf[j];
                    dc[j] = dcp;
                    ds[j] = dg[j] = dai, ds[H + j] = dg[H + j] = dao, ds[2 * H + j] = dg[2 * H + j] = daf;
                    ds[3 * H + j] = dg[3 * H + j] = dac;
                    dhd[j] = 0.0f;
                }
            }
        }
        if (gru && !lbr) { /* d(r * h_prev) = dah Rh, then the r gate */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)Bn, (int)H, (int)H, 1.0f, w->dgs + 2 * H,
                        (int)GH, Rd + 2 * H * H, (int)H, 0.0f, w->rh, (int)H);
            for (int64_t b = 0; b < Bn; b++) {
                if (s >= w->len[b]) continue;
                int64_t r = rg_row(g, rg_time(g, w, s, b), b);
                const float *pr = w->pre + r * GH, *ar = w->act + r * GH, *hp = w->hprev + r * H, *drh = w->rh + b * H;
                float *dg = w->dgw + r * GH, *ds = w->dgs + b * GH, *dhd = w->dhd + b * H;
                for (int64_t j = 0; j < H; j++) {
                    ds[H + j] = dg[H + j] = drh[j] * hp[j] * rg_df(p, &A[0], pr[H + j], ar[H + j]);
                    dhd[j] += drh[j] * ar[H + j];
                }
            }
        }
        /* dh_prev = dGates_R R (GRU lbr=0: the z and r blocks; the h block went through r above) */
        int64_t ng = gru && !lbr ? 2 * H : GH;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)Bn, (int)H, (int)ng, 1.0f, w->dgs, (int)GH, Rd,
                    (int)H, 0.0f, w->dhp, (int)H);
        for (int64_t b = 0; b < Bn; b++) {
            if (s >= w->len[b]) continue;
            if (w->dgr != w->dgw)
                memcpy(w->dgr + rg_row(g, rg_time(g, w, s, b), b) * GH, w->dgs + b * GH, (size_t)GH * sizeof(float));
            for (int64_t j = 0; j < H; j++) w->dh[b * H + j] = w->dhp[b * H + j] + w->dhd[b * H + j];
        }
    }
}

static eng_status rnn_grad_exec(krn_call *c) {
    const krn_rnn_params *p = c->params;
    rg_geo g = {.p = p, .S = p->seq, .B = p->batch, .IS = p->input, .H = p->hidden, .G = p->ngates};
    g.GH = g.G * g.H;
    g.N = g.S * g.B;
#define IN(k) (c->nin > (k) && c->in[k].data ? (const float *)c->in[k].data : NULL)
#define OUTP(k) (c->nout > (k) && c->out[k].data ? (float *)c->out[k].data : NULL)
    const float *dY = IN(KRN_RNN_GRAD_IN_DY), *dYh = IN(KRN_RNN_GRAD_IN_DYH), *dYc = IN(KRN_RNN_GRAD_IN_DYC);
    const int F = KRN_RNN_GRAD_IN_FWD;
    const float *X = IN(F + KRN_RNN_IN_X), *W = IN(F + KRN_RNN_IN_W), *R = IN(F + KRN_RNN_IN_R);
    const float *Bv = IN(F + KRN_RNN_IN_B), *h0 = IN(F + KRN_RNN_IN_H0), *c0 = IN(F + KRN_RNN_IN_C0);
    const float *P = IN(F + KRN_RNN_IN_P);
    const int32_t *lens = c->nin > F + KRN_RNN_IN_SEQ_LENS ? c->in[F + KRN_RNN_IN_SEQ_LENS].data : NULL;
    float *dX = OUTP(0), *dW = OUTP(1), *dR = OUTP(2), *dB = OUTP(3), *dh0 = OUTP(4), *dc0 = OUTP(5), *dP = OUTP(6);
#undef IN
#undef OUTP
    if (p->cell != KRN_RNN_LSTM) dYc = NULL, c0 = NULL, P = NULL, dc0 = NULL, dP = NULL;
    if (!X || !W || !R) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "rnn_grad: X, W and R are required");
    if (dX) memset(dX, 0, (size_t)(g.N * g.IS) * sizeof(float));
    if (!dY && !dYh && !dYc) { /* nothing flows back: every gradient is zero */
        size_t H = (size_t)g.H, nd = (size_t)p->ndir, GH = (size_t)g.GH, f = sizeof(float);
        if (dW) memset(dW, 0, nd * GH * (size_t)g.IS * f);
        if (dR) memset(dR, 0, nd * GH * H * f);
        if (dB) memset(dB, 0, nd * 2 * GH * f);
        if (dh0) memset(dh0, 0, nd * (size_t)g.B * H * f);
        if (dc0) memset(dc0, 0, nd * (size_t)g.B * H * f);
        if (dP) memset(dP, 0, nd * 3 * H * f);
        return ENG_STATUS_OK;
    }
    rg_ws w;
    ENG_TRY(rg_ws_alloc(&w, &g));
    for (int64_t b = 0; b < g.B; b++) {
        w.len[b] = lens ? lens[b] : g.S;
        if (w.len[b] < 0 || w.len[b] > g.S) {
            long long v = w.len[b];
            rg_ws_free(&w);
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "sequence_lens[%lld] = %lld is outside [0, %lld]", (long long)b,
                           v, (long long)g.S);
        }
    }
    const int64_t H = g.H, GH = g.GH, IS = g.IS, N = g.N;
    for (int d = 0; d < p->ndir; d++) {
        rg_geo gd = g;
        gd.rev = p->reverse || d == 1;
        if (d > 0) {
            memset(w.dgw, 0, (size_t)(N * GH) * sizeof(float));
            if (w.dgr != w.dgw) memset(w.dgr, 0, (size_t)(N * GH) * sizeof(float));
        }
        rg_forward(&gd, &w, d, X, W, R, Bv, h0, c0, P);
        rg_backward(&gd, &w, d, R, dY, dYh, dYc, P);
        const float *Wd = W + d * GH * IS;
        if (dX)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)IS, (int)GH, 1.0f, w.dgw, (int)GH, Wd,
                        (int)IS, 1.0f, dX, (int)IS);
        if (dW)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)GH, (int)IS, (int)N, 1.0f, w.dgw, (int)GH, X,
                        (int)IS, 0.0f, dW + d * GH * IS, (int)IS);
        if (dR) {
            float *dRd = dR + d * GH * H;
            if (p->cell == KRN_RNN_GRU && !p->linear_before_reset) {
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)(2 * H), (int)H, (int)N, 1.0f, w.dgw, (int)GH,
                            w.hprev, (int)H, 0.0f, dRd, (int)H);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)H, (int)H, (int)N, 1.0f, w.dgw + 2 * H,
                            (int)GH, w.aux, (int)H, 0.0f, dRd + 2 * H * H, (int)H);
            } else {
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)GH, (int)H, (int)N, 1.0f, w.dgr, (int)GH,
                            w.hprev, (int)H, 0.0f, dRd, (int)H);
            }
        }
        if (dB || dP) { /* dWb, dRb: column sums of the gate gradients; dP: peephole i, o, f against c_prev, c, c_prev */
            double *sw = w.acc, *sr = sw + GH, *sp = sr + GH;
            memset(w.acc, 0, (size_t)(2 * GH + 3 * H) * sizeof(double));
            for (int64_t r = 0; r < N; r++) {
                const float *gw = w.dgw + r * GH, *gr = w.dgr + r * GH;
                for (int64_t j = 0; j < GH; j++) sw[j] += gw[j], sr[j] += gr[j];
                if (dP) {
                    const float *cp = w.cprev + r * H, *cn = w.cnew + r * H;
                    for (int64_t j = 0; j < H; j++) {
                        sp[j] += (double)gw[j] * cp[j];
                        sp[H + j] += (double)gw[H + j] * cn[j];
                        sp[2 * H + j] += (double)gw[2 * H + j] * cp[j];
                    }
                }
            }
            for (int64_t j = 0; dB && j < GH; j++)
                dB[d * 2 * GH + j] = (float)sw[j], dB[d * 2 * GH + GH + j] = (float)sr[j];
            for (int64_t j = 0; dP && j < 3 * H; j++) dP[d * 3 * H + j] = (float)sp[j];
        }
        for (int64_t b = 0; b < g.B; b++)
            for (int64_t j = 0; j < H; j++) {
                if (dh0) dh0[rg_st(&g, d, b) + j] = w.dh[b * H + j];
                if (dc0) dc0[rg_st(&g, d, b) + j] = w.dc[b * H + j];
            }
    }
    rg_ws_free(&w);
    return ENG_STATUS_OK;
}

const krn_kernel krn_cpu_rnn_grad_kernels[] = {
    {"rnn_grad", NULL, rnn_grad_exec, NULL},
    {NULL},
};
