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
 * steps, so dY_h / dY_c reach the last real step; a row of length 0 outputs zeros whatever its initial state (as
 * onnxruntime), so d_initial_h / d_initial_c are zero there. Outputs whose data is NULL are not computed.
 *
 * How it runs: X W^T, dW and dR (and dX for GRU with linear_before_reset=1) are oneDNN's dnnl_sgemm on the call's
 * threads. The per-step products use rnn-gemm.h's register-blocked kernel on panels packed once per call and direction:
 * R^T (forward), R (dh_prev) and W (dX from dGates_W: by step while the step's gradients are in cache, or after the
 * steps by 60-row chunks where a thread's X rows are contiguous). The gate math is vectorised: rnn-act.h's fast sigmoid
 * and tanh, as the forward kernel uses (relative error ~2e-7), the derivatives from the stored activations, the column
 * sums of dB / dP accumulated in double per step. Threads split the batch rows (two or more each): each thread runs the
 * whole recurrence of its rows, forward then backward, with no synchronisation per step (a team barrier per step stalls
 * whenever a mate is preempted on a shared machine). A batch too small to split (1-3 rows) splits the hidden units
 * instead (team mode, rg_team; 32 units or more per thread, not GRU lbr=0): a step's products there are bound by
 * reading R from L2, which the team shares out, at the price of a barrier per step each way; a run far slower than the
 * best sends the next 32 to one thread, as rnn.c's forward does. One row group with fewer than 256 rows in all keeps
 * the oneDNN GEMMs on one thread (a few hundred microseconds). No OpenBLAS: its spinning threads slowed the OpenMP
 * teams next to them. The workspace (about seq * batch * (4 * gates + 5) * hidden floats plus the packed panels, reused
 * by the two directions; zeroed where a sequence ended) is allocated by init, or by exec when init did not run. Results
 * are deterministic for a given thread count (dB / dP sum per row group, then in group order; oneDNN's GEMMs may split
 * their sums by thread).
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dnnl.h>

#include "../kernel.h"
#include "../krn-nn.h"
#include "../krn-rnn.h"
#include "rnn-act.h"
#include "rnn-gemm.h"

#define RG_MAX_THREADS 64
#define RG_DX_ROWS 60 /* rows of dX per GEMM when a thread's X rows are contiguous (a multiple of the 6-row block) */

static inline int64_t rg_r16(int64_t n) { return (n + RNN_PANEL - 1) / RNN_PANEL * RNN_PANEL; }

/* The call's geometry and its workspace; rows of the (N, .) buffers in X order. */
typedef struct rg_state {
    const krn_rnn_params *p;
    int64_t S, B, IS, H, G, GH, N;
    int64_t ldg, H16;      /* row strides: GH and H rounded up to 16 floats */
    int two;               /* GRU with linear_before_reset = 0: two GEMMs per step each way */
    int nt, nrt;           /* threads of the call; of the recurrence (batch rows split) */
    int64_t b0[RG_MAX_THREADS + 1]; /* thread i runs batch rows [b0[i], b0[i+1]) */
    float *pre, *act;      /* (N, ldg) gate pre-activations (unclipped) and activations */
    float *dgw, *dgr;      /* (N, ldg) gate gradients, W side and R side (dgr == dgw except GRU lbr=1) */
    float *hprev;          /* (N, H) the state each step started from */
    float *cprev, *cnew, *hc; /* (N, H) LSTM: c_prev, c, act_h(c) */
    float *aux;            /* (N, H) GRU: lbr=1 m = h_prev Rh^T + Rbh; lbr=0 r * h_prev */
    float *hb[2];          /* (B, H) the state h, by the parity of the step */
    float *c, *dh, *dc, *dhd, *rh; /* (B, H) */
    float *hr, *dgs;       /* (B, ldg) the step's GEMM out (forward) / in (backward) */
    float *dgsb[2];        /* dgs and (team mode) a second (B, ldg), by the parity of the step */
    float *o2, *dhp;       /* (B, H16) GEMM outs: GRU lbr=0 h block / d(r * h_prev); dh_prev */
    float *tmp;            /* (nrt, 6 * H16) per-thread derivative temporaries */
    float *pkf, *pkf2;     /* R^T panels: (np1, H, 16) all gates (GRU lbr=0: z, r); (npH, H, 16) GRU lbr=0 h */
    float *pkb, *pkb2;     /* R panels: (npH, ng, 16) dh_prev from the gates; (npH, H, 16) GRU lbr=0 h block */
    float *pkw, *dxs;      /* dX by step (not GRU lbr=1): W panels (npI, GH, 16); the step's dX rows (B, IS16) */
    float *dxc;            /* (nrt, RG_DX_ROWS, IS16): dX rows by chunk, when a thread's rows are contiguous */
    int64_t np1, npH, ng, npI, IS16;
    int dx_steps;          /* dX is computed by step, from dgs (equal to dgw there) */
    float *bias;           /* (GH + H): added to the gates; then GRU lbr=1's Rbh */
    float *zp;             /* (3H) zero peepholes when P is absent */
    double *acc;           /* (nrt, nacc) each row group's column sums: dWb (ldg), dRb (ldg), dP (3H) */
    int64_t nacc;
    int64_t *len;          /* (B) */
    /* team mode (rg_team): team threads split the hidden units of one group of batch rows */
    int team;
    int64_t tj0[RG_MAX_THREADS + 1]; /* thread i: units [tj0[i], tj0[i + 1]) */
    float *team_buf;       /* per thread at toff[i]: its R^T panels, R panels, GEMM outs */
    size_t toff[RG_MAX_THREADS];
    int gemm_nt;           /* threads of the oneDNN GEMMs */
    rnn_team_guard guard;  /* the team, or one thread after a stretch of stalled runs (rnn-gemm.h) */
} rg_state;

static void rg_state_free(void *st) {
    rg_state *w = st;
    if (!w) return;
    float *f[] = {w->pre,  w->act, w->dgw, w->hprev, w->cprev, w->cnew, w->hc,  w->aux,  w->hb[0], w->hb[1],
                  w->c,    w->dh,  w->dc,  w->dhd,   w->rh,    w->hr,   w->dgs, w->o2,   w->dhp,   w->tmp,
                  w->pkf,  w->pkf2, w->pkb, w->pkb2, w->pkw,   w->dxs,  w->dxc, w->dgsb[1], w->team_buf, w->bias,
                  w->zp};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) eng_free(f[i]);
    if (w->dgr != w->dgw) eng_free(w->dgr);
    free(w->acc), free(w->len);
    free(w);
}

/* Zeroed buffer of n floats (at least one). */
static float *rg_zalloc(size_t n, int *fail) {
    float *v = eng_alloc((n ? n : 1) * sizeof(float));
    if (v) memset(v, 0, (n ? n : 1) * sizeof(float));
    else *fail = 1;
    return v;
}

static eng_status rg_state_new(const krn_rnn_params *p, int nthreads, rg_state **out) {
    *out = NULL;
    rg_state *w = calloc(1, sizeof *w);
    if (!w) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "rnn_grad: kernel state");
    w->p = p;
    w->S = p->seq, w->B = p->batch, w->IS = p->input, w->H = p->hidden, w->G = p->ngates;
    w->GH = w->G * w->H, w->N = w->S * w->B;
    w->ldg = rg_r16(w->GH), w->H16 = rg_r16(w->H);
    int lstm = p->cell == KRN_RNN_LSTM, gru = p->cell == KRN_RNN_GRU, lbr = gru && p->linear_before_reset;
    w->two = gru && !lbr;
    int nt = nthreads > 0 ? nthreads : omp_get_max_threads();
    w->nt = nt < 1 ? 1 : nt > RG_MAX_THREADS ? RG_MAX_THREADS : nt;
    /* two rows or more per thread: each thread reads all of R every step, so fewer rows would be bound by that */
    int64_t nrt = w->B / 2;
    w->nrt = (int)(nrt < 1 ? 1 : nrt > w->nt ? w->nt : nrt);
    /* one row group and short sequences (a batch of 1): the other threads would only share GEMMs of a few hundred
     * microseconds, at the price of a team sync per GEMM, each a whole time slice when a mate is preempted */
    if (w->nrt == 1 && w->N < 256) w->nt = 1;
    w->gemm_nt = w->nt;
    /* ... unless the hidden units can be split (all gates but GRU lbr=0's two-GEMM steps; 32 units or more each):
     * a step's products are then bound by reading R from the L2 cache, which a team shares out */
    int team = nt < RG_MAX_THREADS ? nt : RG_MAX_THREADS;
    if (team > w->H / 32) team = (int)(w->H / 32);
    if (w->nrt == 1 && !w->two && team >= 2) {
        w->team = team, w->nt = team;
        int64_t chunk = rg_r16((w->H + team - 1) / team);
        for (int i = 0; i <= team; i++) w->tj0[i] = i * chunk < w->H ? i * chunk : w->H;
    }
    int ngrp = w->team > w->nrt ? w->team : w->nrt;
    for (int i = 0; i <= w->nrt; i++) w->b0[i] = w->B * i / w->nrt;
    w->np1 = rg_r16(w->two ? 2 * w->H : w->GH) / RNN_PANEL;
    w->npH = w->H16 / RNN_PANEL;
    w->ng = w->two ? 2 * w->H : w->GH;
    size_t N = (size_t)w->N, ldg = (size_t)w->ldg, H = (size_t)w->H, B = (size_t)w->B, H16 = (size_t)w->H16;
    int fail = 0;
    w->pre = rg_zalloc(N * ldg, &fail), w->act = rg_zalloc(N * ldg, &fail), w->dgw = rg_zalloc(N * ldg, &fail);
    w->dgr = lbr ? rg_zalloc(N * ldg, &fail) : w->dgw;
    w->hprev = rg_zalloc(N * H, &fail);
    if (lstm) w->cprev = rg_zalloc(N * H, &fail), w->cnew = rg_zalloc(N * H, &fail), w->hc = rg_zalloc(N * H, &fail);
    if (gru) w->aux = rg_zalloc(N * H, &fail);
    w->hb[0] = rg_zalloc(B * H, &fail), w->hb[1] = rg_zalloc(B * H, &fail);
    w->c = rg_zalloc(B * H, &fail), w->dh = rg_zalloc(B * H, &fail);
    w->dc = rg_zalloc(B * H, &fail), w->dhd = rg_zalloc(B * H, &fail), w->rh = rg_zalloc(B * H, &fail);
    w->hr = rg_zalloc(B * ldg, &fail), w->dgs = w->dgsb[0] = rg_zalloc(B * ldg, &fail);
    w->o2 = rg_zalloc(B * H16, &fail), w->dhp = rg_zalloc(B * H16, &fail);
    w->tmp = rg_zalloc((size_t)ngrp * 6 * H16, &fail);
    w->pkf = rg_zalloc((size_t)w->np1 * H * RNN_PANEL, &fail);
    w->pkb = rg_zalloc((size_t)(w->npH * w->ng) * RNN_PANEL, &fail);
    w->dx_steps = !lbr;
    w->IS16 = rg_r16(w->IS), w->npI = w->IS16 / RNN_PANEL;
    if (w->dx_steps) {
        w->pkw = rg_zalloc((size_t)(w->npI * w->GH) * RNN_PANEL, &fail), w->dxs = rg_zalloc(B * (size_t)w->IS16, &fail);
        w->dxc = rg_zalloc((size_t)(ngrp * RG_DX_ROWS * w->IS16), &fail);
    }
    if (w->two) {
        w->pkf2 = rg_zalloc((size_t)w->npH * H * RNN_PANEL, &fail);
        w->pkb2 = rg_zalloc((size_t)w->npH * H * RNN_PANEL, &fail);
    }
    w->bias = rg_zalloc((size_t)w->GH + H, &fail), w->zp = rg_zalloc(3 * H, &fail);
    if (w->team) {
        size_t off = 0;
        for (int i = 0; i < w->team; i++) {
            int64_t n = w->tj0[i + 1] - w->tj0[i], ldf = rg_r16(w->G * n), ldb = rg_r16(n);
            w->toff[i] = off;
            off += (size_t)(ldf * w->H + ldb * w->GH + (int64_t)B * (ldf + ldb));
        }
        w->team_buf = rg_zalloc(off, &fail), w->dgsb[1] = rg_zalloc(B * ldg, &fail);
    }
    w->nacc = 2 * (int64_t)ldg + 3 * (int64_t)H;
    w->acc = calloc((size_t)(w->nrt * w->nacc) + 1, sizeof(double)), w->len = calloc(B + 1, sizeof(int64_t));
    if (fail || !w->acc || !w->len) {
        rg_state_free(w);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "rnn_grad: workspace of %lld rows x %lld gates (seq %lld, batch %lld, "
                       "hidden %lld)", (long long)N, (long long)w->GH, (long long)w->S, (long long)B, (long long)H);
    }
    *out = w;
    return ENG_STATUS_OK;
}

static inline int64_t rg_row(const rg_state *g, int64_t t, int64_t b) {
    return g->p->layout ? b * g->S + t : t * g->B + b;
}
/* Offset of (t, dir, b) in Y / dY. */
static inline int64_t rg_y(const rg_state *g, int64_t t, int d, int64_t b) {
    int nd = g->p->ndir;
    return (g->p->layout ? (b * g->S + t) * nd + d : (t * nd + d) * g->B + b) * g->H;
}
/* Offset of (dir, b) in a state tensor (initial_h, Y_h, ...). */
static inline int64_t rg_st(const rg_state *g, int d, int64_t b) {
    return (g->p->layout ? b * g->p->ndir + d : d * g->B + b) * g->H;
}

/* dst = clip(src) (cl = INFINITY: a copy); two plain selects, so it vectorises. */
static inline void rg_clipcpy(float *restrict dst, const float *restrict src, int64_t n, float cl) {
    for (int64_t j = 0; j < n; j++) {
        float v = src[j] < -cl ? -cl : src[j];
        dst[j] = v > cl ? cl : v;
    }
}

/* d[j] = d act(clip(x)) / dx given y = act(clip(x)): zero where x was clipped (cl = INFINITY: no clip). */
static void rg_dact(const krn_rnn_act *a, const float *restrict x, const float *restrict y, float *restrict d,
                    int64_t n, float cl) {
    switch (a->kind) {
    case KRN_RNN_ACT_SIGMOID:
        for (int64_t j = 0; j < n; j++) d[j] = y[j] * (1.0f - y[j]);
        break;
    case KRN_RNN_ACT_TANH:
        for (int64_t j = 0; j < n; j++) d[j] = 1.0f - y[j] * y[j];
        break;
    default:
        for (int64_t j = 0; j < n; j++) d[j] = krn_rnn_act_df(a, x[j], y[j]);
    }
    if (cl < INFINITY)
        for (int64_t j = 0; j < n; j++) d[j] = x[j] > cl || x[j] < -cl ? 0.0f : d[j];
}

/* What one direction's recurrence reads. */
typedef struct rg_dir {
    int d, rev;
    const float *h0, *c0, *Pi, *Po, *Pf; /* Pi..Pf: zeros when there are no peepholes */
    const float *dY, *dYh, *dYc;
    float clip;                          /* INFINITY without clip */
    int sums, sums_p;                    /* accumulate dB's column sums; dP's too */
    float *dX;                           /* dX by step (g->dx_steps), else NULL */
} rg_dir;

static inline int64_t rg_time(const rg_state *g, const rg_dir *x, int64_t s, int64_t b) {
    return x->rev ? g->len[b] - 1 - s : s;
}

/* Forward gate math of one row (X row r, batch row b) for hidden units [j0, j0 + n): gate k's h_prev R^T at
 * hr + k * hgs (GRU lbr=0: the h block's at o2, the z and r gates already done); h_prev read from hin, h written to
 * hout (both [B, H]; distinct). */
static void rg_fwd_row(rg_state *g, const rg_dir *x, int64_t r, int64_t b, const float *restrict hr, int64_t hgs,
                       const float *restrict o2, int64_t j0, int64_t n, const float *hin, float *hout) {
    const krn_rnn_params *p = g->p;
    const int64_t H = g->H;
    const krn_rnn_act *A = p->act[x->d];
    const float cl = x->clip;
    const size_t nbytes = (size_t)n * sizeof(float);
    const float *restrict bias = g->bias + j0, *restrict rbh = g->bias + g->GH + j0;
    const float *restrict Pi = x->Pi + j0, *restrict Po = x->Po + j0, *restrict Pf = x->Pf + j0;
    float *restrict pr = g->pre + r * g->ldg + j0, *restrict ar = g->act + r * g->ldg + j0;
    const float *restrict hp = hin + b * H + j0;
    float *restrict hn = hout + b * H + j0;
    memcpy(g->hprev + r * H + j0, hp, nbytes);
    if (p->cell == KRN_RNN_VANILLA) {
        for (int64_t j = 0; j < n; j++) pr[j] = (pr[j] + bias[j]) + hr[j];
        rg_clipcpy(ar, pr, n, cl);
        krn_rnn_act_apply(&A[0], ar, n);
        memcpy(hn, ar, nbytes);
    } else if (p->cell == KRN_RNN_GRU) {
        float *restrict ph = pr + 2 * H, *restrict ah = ar + 2 * H;
        if (g->two) {
            for (int64_t j = 0; j < n; j++) ph[j] = (ph[j] + bias[2 * H + j]) + o2[j];
        } else {
#pragma GCC ivdep /* the gate blocks of one row, H apart, never overlap */
            for (int64_t j = 0; j < n; j++) {
                pr[j] = (pr[j] + bias[j]) + hr[j];
                pr[H + j] = (pr[H + j] + bias[H + j]) + hr[hgs + j];
            }
            rg_clipcpy(ar, pr, n, cl);
            rg_clipcpy(ar + H, pr + H, n, cl);
            krn_rnn_act_apply(&A[0], ar, n);
            krn_rnn_act_apply(&A[0], ar + H, n);
            float *restrict ax = g->aux + r * H + j0;
#pragma GCC ivdep
            for (int64_t j = 0; j < n; j++) {
                float m = hr[2 * hgs + j] + rbh[j];
                ax[j] = m;
                ph[j] = (ph[j] + bias[2 * H + j]) + ar[H + j] * m;
            }
        }
        rg_clipcpy(ah, ph, n, cl);
        krn_rnn_act_apply(&A[1], ah, n);
#pragma GCC ivdep
        for (int64_t j = 0; j < n; j++) hn[j] = (1.0f - ar[j]) * ah[j] + ar[j] * hp[j];
    } else { /* LSTM, gates i, o, f, c */
        float *restrict cb = g->c + b * H + j0, *restrict cp = g->cprev + r * H + j0;
        float *restrict cn = g->cnew + r * H + j0, *restrict hc = g->hc + r * H + j0;
        memcpy(cp, cb, nbytes);
#pragma GCC ivdep
        for (int64_t j = 0; j < n; j++) {
            pr[j] = (pr[j] + bias[j]) + (hr[j] + Pi[j] * cp[j]);
            pr[2 * H + j] = (pr[2 * H + j] + bias[2 * H + j]) + (hr[2 * hgs + j] + Pf[j] * cp[j]);
            pr[3 * H + j] = (pr[3 * H + j] + bias[3 * H + j]) + hr[3 * hgs + j];
        }
        rg_clipcpy(ar, pr, n, cl);
        rg_clipcpy(ar + 3 * H, pr + 3 * H, n, cl);
        krn_rnn_act_apply(&A[0], ar, n);
        if (p->input_forget) {
#pragma GCC ivdep
            for (int64_t j = 0; j < n; j++) ar[2 * H + j] = 1.0f - ar[j];
        } else {
            rg_clipcpy(ar + 2 * H, pr + 2 * H, n, cl);
            krn_rnn_act_apply(&A[0], ar + 2 * H, n);
        }
        krn_rnn_act_apply(&A[1], ar + 3 * H, n);
#pragma GCC ivdep
        for (int64_t j = 0; j < n; j++) {
            float c1 = ar[2 * H + j] * cp[j] + ar[j] * ar[3 * H + j];
            cn[j] = cb[j] = hc[j] = c1;
            pr[H + j] = (pr[H + j] + bias[H + j]) + (hr[hgs + j] + Po[j] * c1);
        }
        rg_clipcpy(ar + H, pr + H, n, cl);
        krn_rnn_act_apply(&A[0], ar + H, n);
        krn_rnn_act_apply(&A[2], hc, n);
#pragma GCC ivdep
        for (int64_t j = 0; j < n; j++) hn[j] = ar[H + j] * hc[j];
    }
}

/* Backward gate math of one row (time t, X row r, batch row b) for units [j0, j0 + n): dh (after adding dY) and dc
 * of those units into the gate gradients, written to dgw's row and to ds (the step's dGates_R row, gate k at
 * ds + k * H; GRU lbr=0 leaves its r gate to the second GEMM). tmp: 5 * H16 floats. */
static void rg_bwd_row(rg_state *g, const rg_dir *x, int64_t t, int64_t r, int64_t b, float *ds_row, int64_t j0,
                       int64_t n, float *tmp) {
    const krn_rnn_params *p = g->p;
    const int64_t H = g->H, ldg = g->ldg, H16 = g->H16;
    const krn_rnn_act *A = p->act[x->d];
    const float cl = x->clip;
    int lbr = p->cell == KRN_RNN_GRU && p->linear_before_reset, ifg = p->input_forget;
    const float *restrict Pi = x->Pi + j0, *restrict Po = x->Po + j0, *restrict Pf = x->Pf + j0;
    const float *restrict pr = g->pre + r * ldg + j0, *restrict ar = g->act + r * ldg + j0;
    const float *restrict hp = g->hprev + r * H + j0;
    float *restrict dh = g->dh + b * H + j0, *restrict dg = g->dgw + r * ldg + j0, *restrict ds = ds_row + j0;
    float *restrict dhd = g->dhd + b * H + j0;
    float *restrict t0 = tmp, *restrict t1 = tmp + H16, *restrict t2 = tmp + 2 * H16, *restrict t3 = tmp + 3 * H16;
    float *restrict t4 = tmp + 4 * H16;
    if (x->dY) {
        const float *restrict dy = x->dY + rg_y(g, t, x->d, b) + j0;
        for (int64_t j = 0; j < n; j++) dh[j] += dy[j];
    }
    if (p->cell == KRN_RNN_VANILLA) {
        rg_dact(&A[0], pr, ar, t0, n, cl);
        for (int64_t j = 0; j < n; j++) ds[j] = dg[j] = dh[j] * t0[j];
    } else if (p->cell == KRN_RNN_GRU) {
        rg_dact(&A[0], pr, ar, t0, n, cl);
        rg_dact(&A[1], pr + 2 * H, ar + 2 * H, t2, n, cl);
        if (lbr) rg_dact(&A[0], pr + H, ar + H, t1, n, cl);
        const float *restrict ax = g->aux + r * H + j0;
#pragma GCC ivdep
        for (int64_t j = 0; j < n; j++) {
            float z = ar[j], hh = ar[2 * H + j];
            float dz = dh[j] * (hp[j] - hh), dah = dh[j] * (1.0f - z) * t2[j];
            dhd[j] = dh[j] * z;
            ds[j] = dg[j] = dz * t0[j];
            dg[2 * H + j] = dah;
            if (lbr) {
                ds[H + j] = dg[H + j] = dah * ax[j] * t1[j];
                ds[2 * H + j] = dah * ar[H + j];
            } else {
                ds[2 * H + j] = dah;
            }
        }
    } else {
        float *restrict dc = g->dc + b * H + j0;
        const float *restrict cp = g->cprev + r * H + j0, *restrict cn = g->cnew + r * H + j0;
        const float *restrict hc = g->hc + r * H + j0;
        rg_dact(&A[0], pr, ar, t0, n, cl);
        rg_dact(&A[0], pr + H, ar + H, t1, n, cl);
        if (!ifg) rg_dact(&A[0], pr + 2 * H, ar + 2 * H, t2, n, cl);
        else memset(t2, 0, (size_t)n * sizeof(float));
        rg_dact(&A[1], pr + 3 * H, ar + 3 * H, t3, n, cl);
        rg_dact(&A[2], cn, hc, t4, n, INFINITY);
#pragma GCC ivdep
        for (int64_t j = 0; j < n; j++) {
            float i = ar[j], o = ar[H + j], f = ar[2 * H + j], gg = ar[3 * H + j];
            float dao = dh[j] * hc[j] * t1[j];
            float dcj = dc[j] + dh[j] * o * t4[j] + dao * Po[j];
            float di = dcj * gg, dgg = dcj * i, df = dcj * cp[j], dcp = dcj * f;
            di = ifg ? di - df : di;
            float daf = df * t2[j];
            float dai = di * t0[j], dac = dgg * t3[j];
            dc[j] = dcp + (dai * Pi[j] + daf * Pf[j]);
            ds[j] = dg[j] = dai, ds[H + j] = dg[H + j] = dao, ds[2 * H + j] = dg[2 * H + j] = daf;
            ds[3 * H + j] = dg[3 * H + j] = dac;
        }
    }
}

/* End of a row's backward step for units [j0, j0 + n): dgr's row (GRU lbr=1), the column sums into acc (x->sums:
 * dgw, dgr, peephole products; in step order, so deterministic), and dh_prev = dhp (+ GRU's direct part). */
static void rg_bwd_row_end(rg_state *g, const rg_dir *x, int64_t r, int64_t b, const float *ds, const float *dhp,
                           int64_t j0, int64_t n, double *acc) {
    const krn_rnn_params *p = g->p;
    const int64_t H = g->H, ldg = g->ldg;
    int gru = p->cell == KRN_RNN_GRU, lbr = gru && p->linear_before_reset;
    if (lbr)
        for (int k = 0; k < 3; k++) memcpy(g->dgr + r * ldg + k * H + j0, ds + k * H + j0, (size_t)n * sizeof(float));
    if (x->sums) {
        const float *restrict gw = g->dgw + r * ldg;
        double *restrict sw = acc, *restrict sr = acc + ldg, *restrict sp = acc + 2 * ldg;
        for (int k = 0; k < g->G; k++) {
            for (int64_t j = k * H + j0; j < k * H + j0 + n; j++) sw[j] += gw[j];
            if (lbr)
                for (int64_t j = k * H + j0; j < k * H + j0 + n; j++) sr[j] += ds[j];
        }
        if (x->sums_p) {
            const float *restrict cp = g->cprev + r * H, *restrict cn = g->cnew + r * H;
#pragma GCC ivdep
            for (int64_t j = j0; j < j0 + n; j++) {
                sp[j] += (double)gw[j] * cp[j];
                sp[H + j] += (double)gw[H + j] * cn[j];
                sp[2 * H + j] += (double)gw[2 * H + j] * cp[j];
            }
        }
    }
    float *restrict dh = g->dh + b * H + j0;
    const float *restrict dhd = g->dhd + b * H + j0;
    if (gru)
        for (int64_t j = 0; j < n; j++) dh[j] = dhp[j] + dhd[j];
    else memcpy(dh, dhp, (size_t)n * sizeof(float));
}

/* dX rows [r0, r1) (+)= dgw W, RG_DX_ROWS rows per GEMM on the W panels; rows past a sequence's end have zero
 * gradients, so they get zeros (direction 0) or add nothing. Chunk i goes to thread i % nt. */
static void rg_dx_rows(rg_state *g, const rg_dir *x, int64_t r0, int64_t r1, float *dxc, int tid, int nt) {
    const int64_t IS = g->IS, IS16 = g->IS16;
    for (int64_t q = r0 + tid * RG_DX_ROWS; q < r1; q += (int64_t)nt * RG_DX_ROWS) {
        int64_t m = r1 - q < RG_DX_ROWS ? r1 - q : RG_DX_ROWS;
        if (IS && g->GH) rnn_gemm(g->dgw + q * g->ldg, g->ldg, m, g->GH, g->pkw, g->npI, dxc, IS16);
        else memset(dxc, 0, (size_t)(m * IS16) * sizeof(float));
        for (int64_t i = 0; i < m; i++) {
            float *restrict dx = x->dX + (q + i) * IS;
            const float *restrict v = dxc + i * IS16;
            if (x->d == 0) memcpy(dx, v, (size_t)IS * sizeof(float));
            else
                for (int64_t k = 0; k < IS; k++) dx[k] += v[k];
        }
    }
}

static void rg_state_init_rows(rg_state *g, const rg_dir *x, int64_t b0, int64_t b1, int64_t j0, int64_t n) {
    const int64_t H = g->H;
    const size_t nbytes = (size_t)n * sizeof(float);
    for (int64_t b = b0; b < b1; b++) {
        float *h = g->hb[0] + b * H + j0, *c = g->c + b * H + j0, *dh = g->dh + b * H + j0, *dc = g->dc + b * H + j0;
        if (x->h0) memcpy(h, x->h0 + rg_st(g, x->d, b) + j0, nbytes);
        else memset(h, 0, nbytes);
        if (x->c0) memcpy(c, x->c0 + rg_st(g, x->d, b) + j0, nbytes);
        else memset(c, 0, nbytes);
        if (x->dYh) memcpy(dh, x->dYh + rg_st(g, x->d, b) + j0, nbytes);
        else memset(dh, 0, nbytes);
        if (x->dYc) memcpy(dc, x->dYc + rg_st(g, x->d, b) + j0, nbytes);
        else memset(dc, 0, nbytes);
    }
}

/* Forward, then backward, of direction x->d over batch rows [b0, b1), all hidden units (one thread): fills their rows
 * of the (N, .) buffers, leaves d_initial_h / d_initial_c in dh / dc, and (x->sums) the rows' column sums in acc
 * (nacc doubles); their rows of dX (x->dX). tmp: 6 * H16 floats, dxc: RG_DX_ROWS * IS16; all this thread's own. */
static void rg_rows(rg_state *g, const rg_dir *x, int64_t b0, int64_t b1, float *tmp, double *acc, float *dxc) {
    const krn_rnn_params *p = g->p;
    const int64_t H = g->H, ldg = g->ldg, H16 = g->H16, nb = b1 - b0;
    const size_t hbytes = (size_t)H * sizeof(float);
    const krn_rnn_act *A = p->act[x->d];
    const float cl = x->clip;
    /* this thread's X rows contiguous (layout 1, or one group): dX after the steps, RG_DX_ROWS rows per GEMM, else
     * by step (a GEMM of the group's rows) while the step's gradients are in cache */
    int dx_rows = x->dX && (p->layout || (b0 == 0 && b1 == g->B));
    rg_state_init_rows(g, x, b0, b1, 0, H);
    int64_t smax = 0;
    for (int64_t b = b0; b < b1; b++) smax = g->len[b] > smax ? g->len[b] : smax;
    for (int64_t s = 0; s < smax; s++) {
        float *hin = g->hb[s & 1], *hout = g->hb[(s + 1) & 1];
        /* hr = h_prev R^T (GRU lbr=0: the z and r blocks only; the h block needs r first) */
        if (nb && H) rnn_gemm(hin + b0 * H, H, nb, H, g->pkf, g->np1, g->hr + b0 * ldg, ldg);
        if (g->two) {
            for (int64_t b = b0; b < b1; b++) {
                if (s >= g->len[b]) continue;
                int64_t r = rg_row(g, rg_time(g, x, s, b), b);
                float *restrict pr = g->pre + r * ldg, *restrict ar = g->act + r * ldg;
                const float *restrict hr = g->hr + b * ldg, *restrict hbv = hin + b * H;
                const float *restrict bias = g->bias;
                for (int64_t j = 0; j < 2 * H; j++) pr[j] = (pr[j] + bias[j]) + hr[j];
                rg_clipcpy(ar, pr, 2 * H, cl);
                krn_rnn_act_apply(&A[0], ar, 2 * H);
                float *restrict ax = g->aux + r * H, *restrict rh = g->rh + b * H;
#pragma GCC ivdep
                for (int64_t j = 0; j < H; j++) ax[j] = rh[j] = ar[H + j] * hbv[j];
            }
            if (nb && H) rnn_gemm(g->rh + b0 * H, H, nb, H, g->pkf2, g->npH, g->o2 + b0 * H16, H16);
        }
        for (int64_t b = b0; b < b1; b++) {
            if (s >= g->len[b]) { /* past this row's end: the state carries */
                memcpy(hout + b * H, hin + b * H, hbytes);
                continue;
            }
            int64_t r = rg_row(g, rg_time(g, x, s, b), b);
            rg_fwd_row(g, x, r, b, g->hr + b * ldg, H, g->o2 + b * H16, 0, H, hin, hout);
        }
    }
    for (int64_t s = smax - 1; s >= 0; s--) {
        for (int64_t b = b0; b < b1; b++) {
            if (s >= g->len[b]) continue;
            int64_t t = rg_time(g, x, s, b);
            rg_bwd_row(g, x, t, rg_row(g, t, b), b, g->dgs + b * ldg, 0, H, tmp);
        }
        if (g->two) { /* d(r * h_prev) = dah Rh, then the r gate */
            if (nb && H) rnn_gemm(g->dgs + b0 * ldg + 2 * H, ldg, nb, H, g->pkb2, g->npH, g->o2 + b0 * H16, H16);
            for (int64_t b = b0; b < b1; b++) {
                if (s >= g->len[b]) continue;
                int64_t r = rg_row(g, rg_time(g, x, s, b), b);
                const float *restrict pr = g->pre + r * ldg, *restrict ar = g->act + r * ldg;
                const float *restrict hp = g->hprev + r * H, *restrict drh = g->o2 + b * H16;
                float *restrict dg = g->dgw + r * ldg, *restrict ds = g->dgs + b * ldg, *restrict dhd = g->dhd + b * H;
                float *restrict t1 = tmp;
                rg_dact(&A[0], pr + H, ar + H, t1, H, cl);
#pragma GCC ivdep
                for (int64_t j = 0; j < H; j++) {
                    ds[H + j] = dg[H + j] = drh[j] * hp[j] * t1[j];
                    dhd[j] += drh[j] * ar[H + j];
                }
            }
        }
        /* dh_prev = dGates_R R (GRU lbr=0: the z and r blocks; the h block went through r above) */
        if (nb && H && g->ng) rnn_gemm(g->dgs + b0 * ldg, ldg, nb, g->ng, g->pkb, g->npH, g->dhp + b0 * H16, H16);
        else memset(g->dhp + b0 * H16, 0, (size_t)(nb * H16) * sizeof(float));
        if (x->dX && !dx_rows) { /* the step's rows of dX (+)= dGates W; the directions add up in order */
            const int64_t IS = g->IS, IS16 = g->IS16;
            float *dxs = g->dxs + b0 * IS16;
            if (nb && IS && g->GH) rnn_gemm(g->dgs + b0 * ldg, ldg, nb, g->GH, g->pkw, g->npI, dxs, IS16);
            else memset(dxs, 0, (size_t)(nb * IS16) * sizeof(float));
            for (int64_t b = b0; b < b1; b++) {
                if (s >= g->len[b]) continue;
                float *restrict dx = x->dX + rg_row(g, rg_time(g, x, s, b), b) * IS;
                const float *restrict v = g->dxs + b * IS16;
                if (x->d == 0) memcpy(dx, v, (size_t)IS * sizeof(float));
                else
                    for (int64_t k = 0; k < IS; k++) dx[k] += v[k];
            }
        }
        for (int64_t b = b0; b < b1; b++) {
            if (s >= g->len[b]) continue;
            int64_t r = rg_row(g, rg_time(g, x, s, b), b);
            rg_bwd_row_end(g, x, r, b, g->dgs + b * ldg, g->dhp + b * H16, 0, H, acc);
        }
    }
    if (dx_rows) rg_dx_rows(g, x, p->layout ? b0 * g->S : 0, p->layout ? b1 * g->S : g->N, dxc, 0, 1);
}

/* R^T panels of a team slice: columns k*H + j0 + c (c < n) of R^T for every gate k, gate-major. */
static void rg_pack_slice(const rg_state *g, const float *Rd, int64_t j0, int64_t n, float *dst) {
    const int64_t H = g->H, ncols = g->G * n, np = rg_r16(ncols) / RNN_PANEL;
    for (int64_t pi = 0; pi < np; pi++)
        for (int64_t k = 0; k < H; k++)
            for (int l = 0; l < RNN_PANEL; l++) {
                int64_t col = pi * RNN_PANEL + l;
                dst[(pi * H + k) * RNN_PANEL + l] = col < ncols ? Rd[((col / n) * H + j0 + col % n) * H + k] : 0.f;
            }
}

/* Team mode (g->team threads on one group of batch rows, a batch of 1-3): thread tid computes hidden units
 * [tj0[tid], tj0[tid + 1]) of every step, forward and backward, against its own panels of R^T and R (packed here);
 * the state h and the step's gate gradients are double-buffered, one team barrier per step each way. Then dX's
 * rows by chunks. Every thread of the team must call it (the barriers). */
static void rg_team(rg_state *g, const rg_dir *x, const float *Rd, const float *Wd, int tid, int T) {
    const int64_t H = g->H, ldg = g->ldg, B = g->B, GH = g->GH;
    const int64_t j0 = g->tj0[tid], n = g->tj0[tid + 1] - j0;
    const int64_t npf = rg_r16(g->G * n) / RNN_PANEL, ldf = npf * RNN_PANEL, npb = rg_r16(n) / RNN_PANEL;
    const int64_t ldb = npb * RNN_PANEL;
    float *pkf = g->team_buf + g->toff[tid], *pkb = pkf + npf * H * RNN_PANEL, *hr = pkb + npb * GH * RNN_PANEL;
    float *dhp = hr + B * ldf, *tmp = g->tmp + (size_t)tid * 6 * g->H16;
    double *acc = g->acc;
    if (n) {
        rg_pack_slice(g, Rd, j0, n, pkf);
        rnn_pack_rows(Rd + j0, H, GH, n, 0, npb, pkb);
    }
    for (int64_t q = tid; x->dX && q < g->npI; q += T) rnn_pack_rows(Wd, g->IS, GH, g->IS, q, q + 1, g->pkw);
    rg_state_init_rows(g, x, 0, B, j0, n);
    for (int k = 0; x->sums && k < g->G; k++)
        for (int64_t j = k * H + j0; j < k * H + j0 + n; j++) acc[j] = acc[ldg + j] = 0;
    for (int k = 0; x->sums && k < 3; k++)
        for (int64_t j = k * H + j0; j < k * H + j0 + n; j++) acc[2 * ldg + j] = 0;
    int64_t smax = 0;
    for (int64_t b = 0; b < B; b++) smax = g->len[b] > smax ? g->len[b] : smax;
#pragma omp barrier
    for (int64_t s = 0; s < smax; s++) {
        float *hin = g->hb[s & 1], *hout = g->hb[(s + 1) & 1];
        if (n) rnn_gemm(hin, H, B, H, pkf, npf, hr, ldf);
        for (int64_t b = 0; b < B && n; b++) {
            if (s >= g->len[b]) {
                memcpy(hout + b * H + j0, hin + b * H + j0, (size_t)n * sizeof(float));
                continue;
            }
            rg_fwd_row(g, x, rg_row(g, rg_time(g, x, s, b), b), b, hr + b * ldf, n, NULL, j0, n, hin, hout);
        }
#pragma omp barrier
    }
    for (int64_t s = smax - 1; s >= 0; s--) {
        float *ds = g->dgsb[s & 1];
        for (int64_t b = 0; b < B && n; b++) {
            if (s >= g->len[b]) continue;
            int64_t t = rg_time(g, x, s, b);
            rg_bwd_row(g, x, t, rg_row(g, t, b), b, ds + b * ldg, j0, n, tmp);
        }
#pragma omp barrier
        if (n) rnn_gemm(ds, ldg, B, GH, pkb, npb, dhp, ldb);
        for (int64_t b = 0; b < B && n; b++) {
            if (s >= g->len[b]) continue;
            rg_bwd_row_end(g, x, rg_row(g, rg_time(g, x, s, b), b), b, ds + b * ldg, dhp + b * ldb, j0, n, acc);
        }
    }
#pragma omp barrier
    if (x->dX) rg_dx_rows(g, x, 0, g->N, g->dxc + (size_t)(tid * RG_DX_ROWS * g->IS16), tid, T);
}

/* C[M, N] = op(A) op(B) + beta C, row-major, by oneDNN on the calling thread's OpenMP team; K = 0 leaves beta C. */
static eng_status rg_sgemm(char ta, char tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                           const float *Bm, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (M <= 0 || N <= 0) return ENG_STATUS_OK;
    if (K <= 0) {
        if (beta == 0.0f)
            for (int64_t m = 0; m < M; m++) memset(C + m * ldc, 0, (size_t)N * sizeof(float));
        return ENG_STATUS_OK;
    }
    KRN_DNNL_CHECK(dnnl_sgemm(ta, tb, M, N, K, 1.0f, A, lda, Bm, ldb, beta, C, ldc));
    return ENG_STATUS_OK;
}

/* Packs direction d's R: R^T panels for the forward product, R panels for the backward one, and W's panels when
 * dX goes by step (Wd not NULL); panel q of the concatenation of the (up to five) packs goes to thread q % nt. */
static void rg_pack(rg_state *g, const float *Rd, const float *Wd, int tid, int nt) {
    const int64_t H = g->H, n1 = g->np1, n2 = g->two ? g->npH : 0, n3 = g->npH, n4 = g->two ? g->npH : 0;
    const int64_t n5 = Wd ? g->npI : 0, n14 = n1 + n2 + n3 + n4;
    for (int64_t q = tid; q < n14 + n5; q += nt) {
        if (q >= n14) {
            rnn_pack_rows(Wd, g->IS, g->GH, g->IS, q - n14, q - n14 + 1, g->pkw);
            continue;
        }
        if (q < n1) rnn_pack_cols(Rd, g->ng, H, q, q + 1, g->pkf);
        else if (q < n1 + n2) rnn_pack_cols(Rd + 2 * H * H, H, H, q - n1, q - n1 + 1, g->pkf2);
        else if (q < n1 + n2 + n3) rnn_pack_rows(Rd, H, g->ng, H, q - n1 - n2, q - n1 - n2 + 1, g->pkb);
        else rnn_pack_rows(Rd + 2 * H * H, H, H, H, q - n1 - n2 - n3, q - n1 - n2 - n3 + 1, g->pkb2);
    }
}

static eng_status rnn_grad_run(krn_call *c, rg_state *g) {
    const krn_rnn_params *p = c->params;
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
    const int64_t H = g->H, GH = g->GH, IS = g->IS, N = g->N, ldg = g->ldg;
    int full = 1;
    for (int64_t b = 0; b < g->B; b++) {
        g->len[b] = lens ? lens[b] : g->S;
        if (g->len[b] < 0 || g->len[b] > g->S)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "sequence_lens[%lld] = %lld is outside [0, %lld]", (long long)b,
                           (long long)g->len[b], (long long)g->S);
        full &= g->len[b] == g->S;
    }
    if (!dY && !dYh && !dYc) { /* nothing flows back: every gradient is zero */
        size_t nd = (size_t)p->ndir, f = sizeof(float);
        if (dX) memset(dX, 0, (size_t)(N * IS) * f);
        if (dW) memset(dW, 0, nd * (size_t)(GH * IS) * f);
        if (dR) memset(dR, 0, nd * (size_t)(GH * H) * f);
        if (dB) memset(dB, 0, nd * 2 * (size_t)GH * f);
        if (dh0) memset(dh0, 0, nd * (size_t)(g->B * H) * f);
        if (dc0) memset(dc0, 0, nd * (size_t)(g->B * H) * f);
        if (dP) memset(dP, 0, nd * 3 * (size_t)H * f);
        return ENG_STATUS_OK;
    }
    int gru = p->cell == KRN_RNN_GRU, lbr = gru && p->linear_before_reset;
    if (dX && g->dx_steps && !full) memset(dX, 0, (size_t)(N * IS) * sizeof(float)); /* rows past the ends */
    krn_dnnl_set_threads(g->gemm_nt);
    /* Team mode needs every mate running at each step: after stalled runs, one thread for a while (rnn_team_guard) */
    int team = g->team && rnn_guard_team(&g->guard) ? g->team : 0;
    struct timespec ts0, ts1;
    clock_gettime(CLOCK_MONOTONIC, &ts0);
    for (int d = 0; d < p->ndir; d++) {
        rg_dir x = {.d = d, .rev = p->reverse || d == 1, .h0 = h0, .c0 = c0, .dY = dY, .dYh = dYh, .dYc = dYc,
                    .clip = p->has_clip ? p->clip : INFINITY, .sums = dB || dP, .sums_p = dP != NULL,
                    .dX = g->dx_steps ? dX : NULL};
        x.Pi = P ? P + d * 3 * H : g->zp, x.Po = x.Pi + H, x.Pf = x.Pi + 2 * H;
        const float *Wd = W + d * GH * IS, *Rd = R + d * GH * H;
        /* biases: gates' Wb + Rb (GRU h gate with linear_before_reset: Wb only, and Rbh apart) */
        const float *Wb = Bv ? Bv + d * 2 * GH : NULL, *Rb = Wb ? Wb + GH : NULL;
        for (int64_t j = 0; j < GH + H; j++) g->bias[j] = 0.0f;
        for (int64_t j = 0; Wb && j < GH; j++) g->bias[j] = Wb[j] + (lbr && j >= 2 * H ? 0.0f : Rb[j]);
        for (int64_t j = 0; Wb && lbr && j < H; j++) g->bias[GH + j] = Rb[2 * H + j];
        if (!full) { /* rows past a sequence's end keep zero gradients */
            memset(g->dgw, 0, (size_t)(N * ldg) * sizeof(float));
            if (g->dgr != g->dgw) memset(g->dgr, 0, (size_t)(N * ldg) * sizeof(float));
        }
        ENG_TRY(rg_sgemm('N', 'T', N, GH, IS, X, IS, Wd, IS, 0.0f, g->pre, ldg));
        int nth = team ? team : g->nrt > 1 ? g->nt : 1;
#pragma omp parallel num_threads(nth)
        {
            int tid = omp_get_thread_num(), n = omp_get_num_threads();
            if (team && n == team) {
                rg_team(g, &x, Rd, x.dX ? Wd : NULL, tid, n);
            } else {
                rg_pack(g, Rd, x.dX ? Wd : NULL, tid, n);
#pragma omp barrier
                /* the recurrence threads: a team smaller than asked runs the row groups in turn */
                for (int i = tid; i < g->nrt; i += n) {
                    double *acc = g->acc + (size_t)(i * g->nacc);
                    if (x.sums) memset(acc, 0, (size_t)g->nacc * sizeof(double));
                    rg_rows(g, &x, g->b0[i], g->b0[i + 1], g->tmp + (size_t)i * 6 * g->H16, acc,
                            g->dxc ? g->dxc + (size_t)(i * RG_DX_ROWS * g->IS16) : NULL);
                }
            }
        }
        if (dX && !g->dx_steps) ENG_TRY(rg_sgemm('N', 'N', N, IS, GH, g->dgw, ldg, Wd, IS, d ? 1.0f : 0.0f, dX, IS));
        if (dW) ENG_TRY(rg_sgemm('T', 'N', GH, IS, N, g->dgw, ldg, X, IS, 0.0f, dW + d * GH * IS, IS));
        if (dR) {
            float *dRd = dR + d * GH * H;
            if (g->two) {
                ENG_TRY(rg_sgemm('T', 'N', 2 * H, H, N, g->dgw, ldg, g->hprev, H, 0.0f, dRd, H));
                ENG_TRY(rg_sgemm('T', 'N', H, H, N, g->dgw + 2 * H, ldg, g->aux, H, 0.0f, dRd + 2 * H * H, H));
            } else {
                ENG_TRY(rg_sgemm('T', 'N', GH, H, N, g->dgr, ldg, g->hprev, H, 0.0f, dRd, H));
            }
        }
        if (dB || dP) { /* dWb, dRb: column sums of the gate gradients; dP: peepholes i, o, f by c_prev, c, c_prev */
            double *a0 = g->acc;
            for (int i = 1; i < g->nrt; i++) /* row groups in order */
                for (int64_t j = 0; j < g->nacc; j++) a0[j] += g->acc[(size_t)(i * g->nacc) + (size_t)j];
            const double *sw = a0, *sr = lbr ? a0 + ldg : a0, *sp = a0 + 2 * ldg;
            for (int64_t j = 0; dB && j < GH; j++)
                dB[d * 2 * GH + j] = (float)sw[j], dB[d * 2 * GH + GH + j] = (float)sr[j];
            for (int64_t j = 0; dP && j < 3 * H; j++) dP[d * 3 * H + j] = (float)sp[j];
        }
        for (int64_t b = 0; b < g->B; b++) { /* a row of length 0 outputs zeros whatever its initial state (krn-rnn.h) */
            size_t hb = (size_t)H * sizeof(float);
            if (dh0 && g->len[b] > 0) memcpy(dh0 + rg_st(g, d, b), g->dh + b * H, hb);
            else if (dh0) memset(dh0 + rg_st(g, d, b), 0, hb);
            if (dc0 && g->len[b] > 0) memcpy(dc0 + rg_st(g, d, b), g->dc + b * H, hb);
            else if (dc0) memset(dc0 + rg_st(g, d, b), 0, hb);
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &ts1);
    double dt = (double)(ts1.tv_sec - ts0.tv_sec) + 1e-9 * (double)(ts1.tv_nsec - ts0.tv_nsec);
    if (team) rnn_guard_note(&g->guard, dt);
    return ENG_STATUS_OK;
}

static eng_status rnn_grad_check(const krn_call *c) {
    const int F = KRN_RNN_GRAD_IN_FWD;
    if (c->nin <= F + KRN_RNN_IN_R || !c->in[F + KRN_RNN_IN_X].data || !c->in[F + KRN_RNN_IN_W].data ||
        !c->in[F + KRN_RNN_IN_R].data)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "rnn_grad: X, W and R are required");
    return ENG_STATUS_OK;
}

/* Init: the workspace, sized by the call's final shapes and threads (state freed by rg_state_free). */
static eng_status rnn_grad_init(krn_call *c) {
    rg_state *g;
    ENG_TRY(rg_state_new(c->params, c->nthreads, &g));
    c->state = g;
    return ENG_STATUS_OK;
}

static eng_status rnn_grad_exec(krn_call *c) {
    ENG_TRY(rnn_grad_check(c));
    rg_state *g = c->state;
    if (!g) ENG_TRY(rg_state_new(c->params, c->nthreads, &g)); /* run without init: a workspace for this call */
    int omp_prev = omp_get_max_threads(); /* the run sets the calling thread's OpenMP count for oneDNN: put it back */
    eng_status st = rnn_grad_run(c, g);
    if (omp_get_max_threads() != omp_prev) omp_set_num_threads(omp_prev);
    if (g != c->state) rg_state_free(g);
    return st;
}

static void rnn_grad_describe(const krn_call *c, krn_impl_info *info) {
    krn_str_copy(info->impl, sizeof info->impl, "packed-panel recurrence, batch rows split, oneDNN sgemm");
    info->slow = 0;
    info->reorders = 0;
}

const krn_kernel krn_cpu_rnn_grad_kernels[] = {
    {"rnn_grad", rnn_grad_init, rnn_grad_exec, rg_state_free, rnn_grad_describe},
    {NULL},
};
