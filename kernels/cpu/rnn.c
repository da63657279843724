/* rnn.c - CPU kernel "rnn": the ONNX RNN, GRU and LSTM forward ops (params: kernels/krn-rnn.h).
 *
 * Two implementations behind one kernel; init picks one and describe() says which ran:
 *  - "plain gemm+fused gates" (every call): the input projection of all time steps and both directions is one
 *    OpenBLAS GEMM (X [seq*batch, input] x W^T -> XW [seq*batch, dirs*gates*hidden]); then, per step, one small
 *    GEMM h_{t-1} x R^T (GRU with linear_before_reset=0: two, the second on r (.) h_{t-1}) by our own register-blocked
 *    kernel on R^T packed once into 16-column panels, and one fused pass of the gate math over [batch, gates*hidden].
 *    Threads: the two directions of a bidirectional node run on separate thread teams with no synchronisation
 *    between them; within a team the hidden units are split into slices, each thread computing all gates of its
 *    units (its R^T panels stay in its core's cache), with one spin barrier per step to publish h_t (two for
 *    GRU lbr=0).
 *  - "onednn ..." (the conditions are in krn_rnn_dnnl_fits): oneDNN's RNN primitives when the call fits them and
 *    oneDNN's implementation is not a reference one.
 * Weight re-layouts (the R^T panels, oneDNN's gate order and packed formats) happen once in init when the weights
 * are constant (const_mask), else on every exec.
 *
 * sequence_lens: each value must be in [0, seq] (checked on every exec, the message names the batch row). Row b runs
 * steps 0..len-1 (reverse: len-1 down to 0); Y is zero at steps >= len; Y_h / Y_c hold the state after its last
 * step, and zeros for a row of length 0 (as onnxruntime gives; not initial_h / initial_c).
 */
#include <omp.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include <dnnl.h>

#include "../backend-impl.h"
#include "../krn-nn.h"
#include "../krn-rnn.h"
#include "rnn-act.h"
#include "rnn-gemm.h"

enum { RNN_IMPL_PLAIN = 1, RNN_IMPL_DNNL = 2 };

/* The oneDNN implementation (below the plain one in this file). */
typedef struct krn_rnn_dnnl krn_rnn_dnnl;
static int krn_rnn_dnnl_fits(const krn_call *c, int forced);
static eng_status krn_rnn_dnnl_init(const krn_call *c, krn_rnn_dnnl **out);
static eng_status krn_rnn_dnnl_exec(const krn_call *c, krn_rnn_dnnl *s);
static void krn_rnn_dnnl_describe(const krn_rnn_dnnl *s, char *buf, size_t cap);
static void krn_rnn_dnnl_free(krn_rnn_dnnl *s);

#define RNN_MAX_TEAM 64 /* threads per direction */


/* ---- a barrier per team (OpenMP's barrier spans all threads; the two directions must not wait on each other) ----
 * Spins briefly, then sleeps on a futex: on a machine shared with other work a team mate may be preempted, and a
 * sleeping waiter leaves its core idle so the scheduler can run the preempted thread there at once (spinning or
 * sched_yield would keep the core busy for a whole time slice, every step). */
typedef struct rnn_barrier {
    _Alignas(64) atomic_int count;
    atomic_int gen, sleepers;
    int n;
} rnn_barrier;

static void rnn_barrier_wait(rnn_barrier *b) {
    if (b->n <= 1) return;
    int g = atomic_load(&b->gen);
    if (atomic_fetch_add(&b->count, 1) == b->n - 1) {
        atomic_store(&b->count, 0);
        atomic_fetch_add(&b->gen, 1);
        if (atomic_load(&b->sleepers)) syscall(SYS_futex, &b->gen, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
        return;
    }
    for (int spins = 0; spins < 3000; spins++) {
        if (atomic_load_explicit(&b->gen, memory_order_acquire) != g) return;
        __builtin_ia32_pause();
    }
    atomic_fetch_add(&b->sleepers, 1);
    while (atomic_load(&b->gen) == g) syscall(SYS_futex, &b->gen, FUTEX_WAIT_PRIVATE, g, NULL, NULL, 0);
    atomic_fetch_sub(&b->sleepers, 1);
}

/* ---- the plain implementation's state ---- */

typedef struct rnn_slice {
    int64_t j0, hs;     /* hidden units [j0, j0 + hs) */
    int64_t np1, np2;   /* panels: gates of the first GEMM (all gates; GRU lbr=0: z, r), the second (GRU lbr=0: h) */
    size_t off1, off2;  /* into rnn_plain.pack, floats */
} rnn_slice;

typedef struct rnn_plain {
    int teams, tpd;               /* thread teams (1, or 2: one per direction) x threads per team */
    int nthr;                     /* threads of the region: teams * tpd, or more for the input projection */
    int ntm;                      /* this run's threads per team: tpd, or 1 (each thread then runs all the slices) */
    rnn_team_guard guard;         /* tpd threads per team, or one after a stretch of stalled runs (rnn-gemm.h) */
    int two_gemms;                /* GRU with linear_before_reset = 0 */
    rnn_slice sl[2][RNN_MAX_TEAM];/* per direction, per thread of its team */
    float *pack;                  /* R^T panels of every slice */
    size_t pack_floats;
    int packed;                   /* pack holds the constant R (init) */
    float *wpack;                 /* W^T panels [npw][input][16] of the input projection */
    int64_t npw, ldxw;            /* its panels; XW's row stride (npw * 16) */
    int wpacked;                  /* wpack holds the constant W (init) */
    /* scratch, sized in init */
    float *xw;      /* [seq*batch, dirs*gates*hidden] input projection */
    float *hbuf;    /* [dirs][2][batch*hidden] h_{t-1} / h_t */
    float *cbuf;    /* [dirs][batch*hidden] LSTM cell state */
    float *rh;      /* [dirs][batch*hidden] GRU lbr=0: r (.) h_{t-1} */
    float *bias;    /* [dirs][gates*hidden + hidden]: the biases added to the gates, then GRU lbr=1's Rbh */
    float *tscr;    /* per thread: gemm out [batch, ld1] + [batch, ld2] + gate temporaries 4*hs_max */
    size_t tscr_floats;
    int32_t *lens;  /* [batch] */
    rnn_barrier bar[2];
} rnn_plain;

static void rnn_plain_free(rnn_plain *s) {
    if (!s) return;
    eng_free(s->pack);
    eng_free(s->wpack);
    eng_free(s->xw);
    eng_free(s->hbuf);
    eng_free(s->cbuf);
    eng_free(s->rh);
    eng_free(s->bias);
    eng_free(s->tscr);
    free(s->lens);
    free(s);
}

static int64_t rnn_round16(int64_t n) { return (n + RNN_PANEL - 1) / RNN_PANEL * RNN_PANEL; }

/* Columns of a slice's first GEMM: gates [g0, g1) of units [j0, j0+hs), gate-major, padded to whole panels. */
static void rnn_pack_slice(const krn_rnn_params *p, const float *R, int d, const rnn_slice *sl, int g0, int g1,
                           float *dst) {
    int64_t H = p->hidden, K = H, ncols = (g1 - g0) * sl->hs, np = rnn_round16(ncols) / RNN_PANEL;
    const float *Rd = R + (size_t)d * p->ngates * H * H; /* [gates*H, H] */
    for (int64_t pi = 0; pi < np; pi++)
        for (int64_t k = 0; k < K; k++)
            for (int l = 0; l < RNN_PANEL; l++) {
                int64_t col = pi * RNN_PANEL + l;
                float v = 0.f;
                if (col < ncols) {
                    int64_t g = g0 + col / sl->hs, j = sl->j0 + col % sl->hs;
                    v = Rd[(g * H + j) * H + k];
                }
                dst[(pi * K + k) * RNN_PANEL + l] = v;
            }
}

/* Direction d's slice l of R into its panels (two GEMMs' worth for GRU with linear_before_reset = 0). */
static void rnn_pack_one(const krn_rnn_params *p, const rnn_plain *s, const float *R, int d, int l) {
    const rnn_slice *sl = &s->sl[d][l];
    if (!sl->hs) return;
    if (s->two_gemms) {
        rnn_pack_slice(p, R, d, sl, 0, 2, s->pack + sl->off1);
        rnn_pack_slice(p, R, d, sl, 2, 3, s->pack + sl->off2);
    } else {
        rnn_pack_slice(p, R, d, sl, 0, p->ngates, s->pack + sl->off1);
    }
}

static void rnn_pack_all(const krn_rnn_params *p, rnn_plain *s, const float *R) {
    for (int d = 0; d < p->ndir; d++)
        for (int l = 0; l < s->tpd; l++) rnn_pack_one(p, s, R, d, l);
}

/* Threads for the call: a team per direction when there are threads for both, and within a team as many threads as
 * keep a slice of at least 16 hidden units and enough work per step to pay for a barrier. */
static void rnn_threads(const krn_rnn_params *p, int nthreads, int *teams, int *tpd) {
    int nt = nthreads > 0 ? nthreads : omp_get_max_threads();
    if (nt < 1) nt = 1;
    int64_t work = p->batch * p->ngates * p->hidden * p->hidden; /* multiply-adds per step and direction */
    *teams = p->ndir == 2 && nt >= 2 && work * p->seq >= 4096 ? 2 : 1;
    int t = nt / *teams;
    int64_t by_units = p->hidden / RNN_PANEL;
    if (t > by_units) t = (int)(by_units > 0 ? by_units : 1);
    if (work < 32768) t = 1;
    if (t > RNN_MAX_TEAM) t = RNN_MAX_TEAM;
    *tpd = t < 1 ? 1 : t;
}

static eng_status rnn_plain_init(const krn_call *c, rnn_plain **out) {
    const krn_rnn_params *p = c->params;
    rnn_plain *s = calloc(1, sizeof *s);
    if (!s) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "RNN kernel state");
    int64_t H = p->hidden, B = p->batch, S = p->seq, D = p->ndir, G = p->ngates;
    rnn_threads(p, c->nthreads, &s->teams, &s->tpd);
    s->two_gemms = p->cell == KRN_RNN_GRU && !p->linear_before_reset;
    int ntall = c->nthreads > 0 ? c->nthreads : omp_get_max_threads();
    s->nthr = s->teams * s->tpd;
    if (S * B * D * G * H * p->input >= 65536 && ntall > s->nthr) s->nthr = ntall;
    int64_t chunk = rnn_round16((H + s->tpd - 1) / s->tpd), hs_max = 0, ld_max = 0;
    size_t off = 0;
    for (int d = 0; d < D; d++)
        for (int l = 0; l < s->tpd; l++) {
            rnn_slice *sl = &s->sl[d][l];
            sl->j0 = l * chunk < H ? l * chunk : H;
            sl->hs = (sl->j0 + chunk < H ? sl->j0 + chunk : H) - sl->j0;
            int64_t g1 = s->two_gemms ? 2 : G;
            sl->np1 = rnn_round16(g1 * sl->hs) / RNN_PANEL;
            sl->np2 = s->two_gemms ? rnn_round16(sl->hs) / RNN_PANEL : 0;
            sl->off1 = off;
            off += (size_t)(sl->np1 * H * RNN_PANEL);
            sl->off2 = off;
            off += (size_t)(sl->np2 * H * RNN_PANEL);
            if (sl->hs > hs_max) hs_max = sl->hs;
            if ((sl->np1 + sl->np2) * RNN_PANEL > ld_max) ld_max = (sl->np1 + sl->np2) * RNN_PANEL;
        }
    s->pack_floats = off;
    s->tscr_floats = (size_t)rnn_round16(B * ld_max + 4 * hs_max);
    s->npw = rnn_round16(D * G * H) / RNN_PANEL;
    s->ldxw = s->npw * RNN_PANEL;
    size_t nxw = (size_t)(S * B * s->ldxw), nbh = (size_t)(B * H), nwp = (size_t)(s->ldxw * p->input);
    s->pack = eng_alloc((off ? off : 1) * sizeof(float));
    s->wpack = eng_alloc((nwp ? nwp : 1) * sizeof(float));
    s->xw = eng_alloc((nxw ? nxw : 1) * sizeof(float));
    s->hbuf = eng_alloc((2 * D * nbh + 1) * sizeof(float));
    s->cbuf = eng_alloc((D * nbh + 1) * sizeof(float));
    s->rh = eng_alloc((D * nbh + 1) * sizeof(float));
    s->bias = eng_alloc((size_t)(D * (G + 1) * H) * sizeof(float));
    s->tscr = eng_alloc(s->tscr_floats * (size_t)(D * s->tpd) * sizeof(float)); /* one per slice */
    s->lens = malloc((size_t)(B ? B : 1) * sizeof(int32_t));
    if (!s->pack || !s->wpack || !s->xw || !s->hbuf || !s->cbuf || !s->rh || !s->bias || !s->tscr || !s->lens) {
        size_t need = (off + nwp + nxw + 4 * D * nbh + s->tscr_floats * (size_t)(D * s->tpd)) * sizeof(float);
        rnn_plain_free(s);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "RNN kernel scratch: cannot allocate %zu bytes (seq %lld, batch %lld, hidden %lld)",
                       need, (long long)S, (long long)B, (long long)H);
    }
    for (int t = 0; t < 2; t++) {
        atomic_init(&s->bar[t].count, 0);
        atomic_init(&s->bar[t].gen, 0);
        atomic_init(&s->bar[t].sleepers, 0);
        s->bar[t].n = s->tpd;
    }
    if ((c->const_mask >> KRN_RNN_IN_R) & 1) {
        rnn_pack_all(p, s, c->in[KRN_RNN_IN_R].data);
        s->packed = 1;
    }
    if ((c->const_mask >> KRN_RNN_IN_W) & 1) {
        rnn_pack_cols(c->in[KRN_RNN_IN_W].data, D * G * H, p->input, 0, s->npw, s->wpack);
        s->wpacked = 1;
    }
    *out = s;
    return ENG_STATUS_OK;
}

/* Index helpers: element offsets of [t, b] rows in X / XW, Y, and of [d, b] in the state tensors. */
static inline int64_t rnn_row(const krn_rnn_params *p, int64_t t, int64_t b) {
    return p->layout ? b * p->seq + t : t * p->batch + b;
}
static inline int64_t rnn_yoff(const krn_rnn_params *p, int64_t t, int d, int64_t b) {
    return (p->layout ? (b * p->seq + t) * p->ndir + d : (t * p->ndir + d) * p->batch + b) * p->hidden;
}
static inline int64_t rnn_hoff(const krn_rnn_params *p, int d, int64_t b) {
    return (p->layout ? b * p->ndir + d : d * p->batch + b) * p->hidden;
}

static inline float rnn_clip(float v, float c) {
    v = v < -c ? -c : v; /* two plain selects: vectorised */
    return v > c ? c : v;
}

static void rnn_clip_arr(const krn_rnn_params *p, float *x, int64_t n) {
    if (!p->has_clip) return;
    float cl = p->clip;
    for (int64_t i = 0; i < n; i++) x[i] = rnn_clip(x[i], cl);
}

typedef struct rnn_io {
    const float *h0, *c0, *P; /* may be NULL */
    float *Y, *Yh, *Yc;       /* may be NULL */
} rnn_io;

/* A slice's variables: its units [j0, j0+hs), its R^T panels, its scratch (GEMM outputs, gate temporaries). */
#define RNN_SLICE(l)                                                                                            \
    const rnn_slice *sl = &s->sl[d][l];                                                                         \
    const int64_t j0 = sl->j0, hs = sl->hs, ld1 = sl->np1 * RNN_PANEL, ld2 = sl->np2 * RNN_PANEL;              \
    float *scr = s->tscr + (size_t)(d * s->tpd + (l)) * s->tscr_floats;                                        \
    float *out1 __attribute__((unused)) = scr, *out2 __attribute__((unused)) = scr + B * ld1, *tmp = scr + B * (ld1 + ld2);            \
    float *g0 __attribute__((unused)) = tmp, *g1 __attribute__((unused)) = tmp + hs;                           \
    float *g2 __attribute__((unused)) = tmp + 2 * hs, *g3 __attribute__((unused)) = tmp + 3 * hs;             \
    const float *pk1 __attribute__((unused)) = s->pack + sl->off1, *pk2 __attribute__((unused)) = s->pack + sl->off2; \
    const size_t hbytes __attribute__((unused)) = (size_t)hs * sizeof(float)

/* One thread's share of the whole recurrence of direction d: slices [l0, l1) (one, or all of them when the team
 * runs on one thread), a barrier of the team after each step (two for GRU lbr=0). */
static void rnn_plain_dir(const krn_rnn_params *p, rnn_plain *s, const rnn_io *io, int d, int l0, int l1) {
    rnn_barrier *bar = &s->bar[s->teams == 2 ? d : 0];
    const int64_t H = p->hidden, B = p->batch, S = p->seq, G = p->ngates, GH = G * H, ldxw = s->ldxw;
    const int rev = p->reverse || d == 1;
    const krn_rnn_act *act = p->act[d];
    float *hb[2] = {s->hbuf + (size_t)(2 * d) * B * H, s->hbuf + (size_t)(2 * d + 1) * B * H};
    float *cs = s->cbuf + (size_t)d * B * H, *rh = s->rh + (size_t)d * B * H;
    const float *bias = s->bias + (size_t)d * (G + 1) * H, *rbh = bias + GH;
    const float *P = io->P ? io->P + (size_t)d * 3 * H : NULL;
    const int32_t *lens = s->lens;

    for (int l = l0; l < l1; l++) {
    RNN_SLICE(l);
    for (int64_t b = 0; b < B && hs; b++) {
        if (io->h0) memcpy(hb[0] + b * H + j0, io->h0 + rnn_hoff(p, d, b) + j0, hbytes);
        else memset(hb[0] + b * H + j0, 0, hbytes);
        if (p->cell == KRN_RNN_LSTM) {
            if (io->c0) memcpy(cs + b * H + j0, io->c0 + rnn_hoff(p, d, b) + j0, hbytes);
            else memset(cs + b * H + j0, 0, hbytes);
        }
    }
    }
    rnn_barrier_wait(bar);
    int cur = 0;
    for (int64_t k = 0; k < S; k++) {
        const float *hp = hb[cur];
        float *hn = hb[cur ^ 1];
        if (s->two_gemms) { /* GRU, linear_before_reset = 0: z, r first, then (r (.) h_{t-1}) R_h^T */
            for (int l = l0; l < l1; l++) {
            RNN_SLICE(l);
            if (hs) rnn_gemm(hp, H, B, H, pk1, sl->np1, out1, ld1);
            for (int64_t b = 0; b < B && hs; b++) {
                if (k >= lens[b]) continue;
                int64_t t = rev ? lens[b] - 1 - k : k;
                const float *xw = s->xw + rnn_row(p, t, b) * ldxw + d * GH + j0, *o = out1 + b * ld1;
                float *z = out1 + b * ld1, *r = z + hs; /* activated in place */
                for (int64_t j = 0; j < hs; j++) {
                    z[j] = xw[j] + o[j] + bias[j0 + j];
                    r[j] = xw[H + j] + o[hs + j] + bias[H + j0 + j];
                }
                rnn_clip_arr(p, z, 2 * hs);
                krn_rnn_act_apply(&act[0], z, 2 * hs);
                for (int64_t j = 0; j < hs; j++) rh[b * H + j0 + j] = r[j] * hp[b * H + j0 + j];
            }
            }
            rnn_barrier_wait(bar);
        }
        for (int l = l0; l < l1; l++) {
        RNN_SLICE(l);
        if (s->two_gemms && hs) rnn_gemm(rh, H, B, H, pk2, sl->np2, out2, ld2);
        else if (hs) rnn_gemm(hp, H, B, H, pk1, sl->np1, out1, ld1);
        for (int64_t b = 0; b < B && hs; b++) {
            const float *hpb = hp + b * H + j0;
            float *hnb = hn + b * H + j0;
            if (k >= lens[b]) { /* past this row's end: hold the state, zero Y at step k */
                memcpy(hnb, hpb, hbytes);
                if (io->Y) memset(io->Y + rnn_yoff(p, k, d, b) + j0, 0, hbytes);
                continue;
            }
            int64_t t = rev ? lens[b] - 1 - k : k;
            const float *xw = s->xw + rnn_row(p, t, b) * ldxw + d * GH + j0, *o = out1 + b * ld1;
            if (p->cell == KRN_RNN_LSTM) { /* ONNX gate order i, o, f, c */
                float *cb = cs + b * H + j0;
                for (int64_t j = 0; j < hs; j++) {
                    g0[j] = xw[j] + o[j] + bias[j0 + j];
                    g1[j] = xw[H + j] + o[hs + j] + bias[H + j0 + j];
                    g2[j] = xw[2 * H + j] + o[2 * hs + j] + bias[2 * H + j0 + j];
                    g3[j] = xw[3 * H + j] + o[3 * hs + j] + bias[3 * H + j0 + j];
                }
                if (P)
                    for (int64_t j = 0; j < hs; j++) {
                        g0[j] += P[j0 + j] * cb[j];
                        g2[j] += P[2 * H + j0 + j] * cb[j];
                    }
                rnn_clip_arr(p, g0, hs);
                rnn_clip_arr(p, g2, hs);
                rnn_clip_arr(p, g3, hs);
                krn_rnn_act_apply(&act[0], g0, hs);
                if (p->input_forget)
                    for (int64_t j = 0; j < hs; j++) g2[j] = 1.0f - g0[j];
                else krn_rnn_act_apply(&act[0], g2, hs);
                krn_rnn_act_apply(&act[1], g3, hs);
                for (int64_t j = 0; j < hs; j++) cb[j] = g2[j] * cb[j] + g0[j] * g3[j];
                if (P)
                    for (int64_t j = 0; j < hs; j++) g1[j] += P[H + j0 + j] * cb[j];
                rnn_clip_arr(p, g1, hs);
                krn_rnn_act_apply(&act[0], g1, hs);
                for (int64_t j = 0; j < hs; j++) g3[j] = cb[j];
                krn_rnn_act_apply(&act[2], g3, hs);
                for (int64_t j = 0; j < hs; j++) hnb[j] = g1[j] * g3[j];
            } else if (p->cell == KRN_RNN_GRU) { /* z, r, h */
                if (s->two_gemms) {
                    const float *z = o, *o2 = out2 + b * ld2;
                    for (int64_t j = 0; j < hs; j++) g2[j] = xw[2 * H + j] + o2[j] + bias[2 * H + j0 + j];
                    rnn_clip_arr(p, g2, hs);
                    krn_rnn_act_apply(&act[1], g2, hs);
                    for (int64_t j = 0; j < hs; j++) hnb[j] = (1.0f - z[j]) * g2[j] + z[j] * hpb[j];
                } else {
                    for (int64_t j = 0; j < hs; j++) {
                        g0[j] = xw[j] + o[j] + bias[j0 + j];
                        g1[j] = xw[H + j] + o[hs + j] + bias[H + j0 + j];
                    }
                    rnn_clip_arr(p, g0, hs);
                    rnn_clip_arr(p, g1, hs);
                    krn_rnn_act_apply(&act[0], g0, hs);
                    krn_rnn_act_apply(&act[0], g1, hs);
                    for (int64_t j = 0; j < hs; j++)
                        g2[j] = xw[2 * H + j] + bias[2 * H + j0 + j] + g1[j] * (o[2 * hs + j] + rbh[j0 + j]);
                    rnn_clip_arr(p, g2, hs);
                    krn_rnn_act_apply(&act[1], g2, hs);
                    for (int64_t j = 0; j < hs; j++) hnb[j] = (1.0f - g0[j]) * g2[j] + g0[j] * hpb[j];
                }
            } else {
                for (int64_t j = 0; j < hs; j++) hnb[j] = xw[j] + o[j] + bias[j0 + j];
                rnn_clip_arr(p, hnb, hs);
                krn_rnn_act_apply(&act[0], hnb, hs);
            }
            if (io->Y) memcpy(io->Y + rnn_yoff(p, t, d, b) + j0, hnb, hbytes);
        }
        }
        rnn_barrier_wait(bar);
        cur ^= 1;
    }
    for (int l = l0; l < l1; l++) {
    RNN_SLICE(l);
    (void)out1, (void)pk1;
    for (int64_t b = 0; b < B && hs; b++) { /* a row of length 0 gives zeros, as onnxruntime does */
        if (io->Yh && lens[b]) memcpy(io->Yh + rnn_hoff(p, d, b) + j0, hb[cur] + b * H + j0, hbytes);
        else if (io->Yh) memset(io->Yh + rnn_hoff(p, d, b) + j0, 0, hbytes);
        if (io->Yc && lens[b]) memcpy(io->Yc + rnn_hoff(p, d, b) + j0, cs + b * H + j0, hbytes);
        else if (io->Yc) memset(io->Yc + rnn_hoff(p, d, b) + j0, 0, hbytes);
    }
    }
}
#undef RNN_SLICE

/* sequence_lens into lens[batch] (NULL: only check), each checked in [0, seq]; *all_full: every row runs seq steps. */
static eng_status krn_rnn_lens(const krn_call *c, int32_t *lens, int *all_full) {
    const krn_rnn_params *p = c->params;
    const int32_t *sl = c->nin > KRN_RNN_IN_SEQ_LENS ? c->in[KRN_RNN_IN_SEQ_LENS].data : NULL;
    *all_full = 1;
    for (int64_t b = 0; b < p->batch; b++) {
        int64_t v = sl ? sl[b] : p->seq;
        if (v < 0 || v > p->seq)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'sequence_lens': batch row %lld has length %lld, outside [0, %lld] (seq_length)",
                           (long long)b, (long long)v, (long long)p->seq);
        if (v != p->seq) *all_full = 0;
        if (lens) lens[b] = (int32_t)v;
    }
    return ENG_STATUS_OK;
}

/* One thread's work: its panels of the input projection (packing W's first when it changes run to run), a barrier of
 * all threads, then its slice of its team's direction(s) (packing its R^T slice first likewise). Called inside the
 * parallel region, or directly with nthr 1 (the orphaned barrier is then a no-op). */
static void rnn_plain_thread(const krn_call *c, rnn_plain *s, const rnn_io *io, int tid, int nthr) {
    const krn_rnn_params *p = c->params;
    const int64_t H = p->hidden, I = p->input, rows = p->seq * p->batch;
    int64_t per = (s->npw + nthr - 1) / nthr, p0 = tid * per < s->npw ? tid * per : s->npw;
    int64_t p1 = p0 + per < s->npw ? p0 + per : s->npw;
    if (p1 > p0) {
        float *wp = s->wpack + p0 * I * RNN_PANEL;
        if (!s->wpacked) rnn_pack_cols(c->in[KRN_RNN_IN_W].data, p->ndir * p->ngates * H, I, p0, p1, s->wpack);
        if (I > 0) rnn_gemm(c->in[KRN_RNN_IN_X].data, I, rows, I, wp, p1 - p0, s->xw + p0 * RNN_PANEL, s->ldxw);
        else
            for (int64_t r = 0; r < rows; r++) memset(s->xw + r * s->ldxw + p0 * RNN_PANEL, 0, (size_t)(p1 - p0) * RNN_PANEL * sizeof(float));
    }
    const int ntm = s->ntm, team = tid / ntm, l = tid % ntm;
    const int l0 = ntm == s->tpd ? l : 0, l1 = ntm == s->tpd ? l + 1 : s->tpd;
    const float *R = c->in[KRN_RNN_IN_R].data;
    if (tid < s->teams * ntm && !s->packed)
        for (int d = team; d < p->ndir; d += s->teams)
            for (int li = l0; li < l1; li++) rnn_pack_one(p, s, R, d, li);
#pragma omp barrier
    if (tid >= s->teams * ntm) return;
    for (int d = team; d < p->ndir; d += s->teams) rnn_plain_dir(p, s, io, d, l0, l1);
}

static eng_status rnn_plain_exec(const krn_call *c, rnn_plain *s) {
    const krn_rnn_params *p = c->params;
    const int64_t H = p->hidden, D = p->ndir, G = p->ngates, GH = G * H;
    int full;
    ENG_TRY(krn_rnn_lens(c, s->lens, &full));
    /* biases: gates' Wb + Rb (GRU h gate with linear_before_reset: Wb only, and Rbh apart) */
    const float *Bw = c->nin > KRN_RNN_IN_B ? c->in[KRN_RNN_IN_B].data : NULL;
    for (int d = 0; d < D; d++) {
        float *bd = s->bias + (size_t)d * (G + 1) * H;
        if (!Bw) {
            memset(bd, 0, (size_t)((G + 1) * H) * sizeof(float));
            continue;
        }
        const float *wb = Bw + (size_t)d * 2 * GH, *rb = wb + GH;
        for (int64_t i = 0; i < GH; i++) bd[i] = wb[i] + rb[i];
        memset(bd + GH, 0, (size_t)H * sizeof(float));
        if (p->cell == KRN_RNN_GRU && p->linear_before_reset)
            for (int64_t j = 0; j < H; j++) {
                bd[2 * H + j] = wb[2 * H + j];
                bd[GH + j] = rb[2 * H + j];
            }
    }
    rnn_io io = {0};
    if (c->nin > KRN_RNN_IN_H0) io.h0 = c->in[KRN_RNN_IN_H0].data;
    if (p->cell == KRN_RNN_LSTM && c->nin > KRN_RNN_IN_C0) io.c0 = c->in[KRN_RNN_IN_C0].data;
    if (p->cell == KRN_RNN_LSTM && c->nin > KRN_RNN_IN_P) io.P = c->in[KRN_RNN_IN_P].data;
    if (c->nout > KRN_RNN_OUT_Y) io.Y = c->out[KRN_RNN_OUT_Y].data;
    if (c->nout > KRN_RNN_OUT_H) io.Yh = c->out[KRN_RNN_OUT_H].data;
    if (p->cell == KRN_RNN_LSTM && c->nout > KRN_RNN_OUT_C) io.Yc = c->out[KRN_RNN_OUT_C].data;
    /* Threads per team: a step's barrier needs every team mate running; after stalled runs, one thread per team
     * (running all slices, no barrier) for a while (rnn_team_guard). */
    s->ntm = rnn_guard_team(&s->guard) ? s->tpd : 1;
    for (int t = 0; t < 2; t++) s->bar[t].n = s->ntm;
    int nthr = s->nthr > s->teams * s->ntm ? s->nthr : s->teams * s->ntm;
    if (s->ntm == 1 && s->nthr == s->teams * s->tpd) nthr = s->teams;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (nthr == 1) rnn_plain_thread(c, s, &io, 0, 1);
    else {
#pragma omp parallel num_threads(nthr)
        rnn_plain_thread(c, s, &io, omp_get_thread_num(), nthr);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double dt = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (s->ntm > 1) rnn_guard_note(&s->guard, dt);
    return ENG_STATUS_OK;
}

/* ---- oneDNN ----
 * oneDNN 2.x's vanilla RNN, LSTM (with peepholes), GRU and LBR-GRU primitives compute ONNX's cells when the call has
 * the default activations (RNN: Tanh, Relu or Sigmoid), no clip, no input_forget, no peepholes, no sequence_lens
 * input, layout 0. Gate orders differ (oneDNN's LSTM i, f, c, o against ONNX's i, o, f, c;
 * peepholes i, f, o against i, o, f), so W and R are re-laid out into ldigo, then reordered into the primitive's
 * packed format: once in init when constant, else on every exec. A bidirectional Y goes through oneDNN's concat
 * layout [seq, batch, 2*hidden] and is copied to ONNX's [seq, 2, batch, hidden]. A reference implementation is
 * refused (the plain path runs instead). */

struct krn_rnn_dnnl {
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t prim;
    dnnl_memory_t scratch;
    dnnl_memory_desc_t md_x, md_h, md_wl_user, md_wi_user, md_wl, md_wi, md_p, md_b, md_y, md_hy;
    krn_dnnl_reorder rwl, rwi;
    float *wl_user, *wi_user, *wl, *wi, *peep, *bias; /* re-laid-out weights (user ldigo, then packed) */
    float *y, *hy, *cy, *h0, *c0;                     /* Y in oneDNN's layout, omitted outputs, zero states */
    int packed, nthreads;
    char impl[96];
};

static void krn_rnn_dnnl_free(krn_rnn_dnnl *s) {
    if (!s) return;
    if (s->prim) dnnl_primitive_destroy(s->prim);
    if (s->pd) dnnl_primitive_desc_destroy(s->pd);
    if (s->scratch) dnnl_memory_destroy(s->scratch);
    krn_dnnl_reorder_free(&s->rwl);
    krn_dnnl_reorder_free(&s->rwi);
    eng_free(s->wl_user), eng_free(s->wi_user), eng_free(s->wl), eng_free(s->wi), eng_free(s->peep), eng_free(s->bias);
    eng_free(s->y), eng_free(s->hy), eng_free(s->cy), eng_free(s->h0), eng_free(s->c0);
    free(s);
}

static int rnn_acts_default(const krn_rnn_params *p) {
    for (int d = 0; d < p->ndir; d++) {
        const krn_rnn_act *a = p->act[d];
        if (p->cell == KRN_RNN_LSTM && (a[0].kind != KRN_RNN_ACT_SIGMOID || a[1].kind != KRN_RNN_ACT_TANH || a[2].kind != KRN_RNN_ACT_TANH))
            return 0;
        if (p->cell == KRN_RNN_GRU && (a[0].kind != KRN_RNN_ACT_SIGMOID || a[1].kind != KRN_RNN_ACT_TANH)) return 0;
        if (p->cell == KRN_RNN_VANILLA && (a[0].kind != p->act[0][0].kind ||
                                           (a[0].kind != KRN_RNN_ACT_TANH && a[0].kind != KRN_RNN_ACT_RELU && a[0].kind != KRN_RNN_ACT_SIGMOID)))
            return 0;
    }
    return 1;
}

/* Whether oneDNN can compute this call: no sequence_lens input at all (oneDNN has no per-row lengths). */
static int krn_rnn_dnnl_fits(const krn_call *c, int forced) {
    const krn_rnn_params *p = c->params;
    if (!rnn_acts_default(p) || p->has_clip || p->input_forget || p->layout) return 0; /* 2.6 refuses ntc here */
    if (p->seq < 1 || p->batch < 1 || p->input < 1) return 0;
    /* Measured here (AMD EPYC, AVX-512, oneDNN 2.6 "brgemm"): oneDNN's LSTM takes ~20% less CPU than the plain path at
     * batch 32, ~40% more at batch 1; its LBR-GRU was a reference implementation (refused below anyway); GRU and
     * vanilla RNN unmeasured. So by default: LSTM with a batch of 16 or more; TENSORD_RNN_IMPL=onednn for the rest. */
    if (!forced && (p->cell != KRN_RNN_LSTM || p->batch < 16)) return 0;
    if (c->nin > KRN_RNN_IN_SEQ_LENS && c->in[KRN_RNN_IN_SEQ_LENS].dtype != ENG_DTYPE_UNDEFINED) return 0;
    /* peepholes: oneDNN 2.6 refuses them with ntc and its bidirectional answer differed from ONNX's: plain path */
    if (c->nin > KRN_RNN_IN_P && c->in[KRN_RNN_IN_P].dtype != ENG_DTYPE_UNDEFINED) return 0;
    return 1;
}

static void rnn_md(dnnl_memory_desc_t *md, int nd, int64_t d0, int64_t d1, int64_t d2, int64_t d3, int64_t d4,
                   dnnl_format_tag_t tag) {
    dnnl_dims_t dims = {d0, d1, d2, d3, d4};
    dnnl_memory_desc_init_by_tag(md, nd, dims, dnnl_f32, tag);
}

/* ONNX gate g of oneDNN's gate gd. */
static int rnn_dnnl_gate(const krn_rnn_params *p, int gd) {
    static const int lstm[4] = {0, 2, 3, 1}; /* oneDNN i, f, c, o <- ONNX i, o, f, c */
    return p->cell == KRN_RNN_LSTM ? lstm[gd] : gd;
}

/* W [D, G*H, K] (ONNX) -> ldigo [1, D, K, G, H] in oneDNN's gate order. */
static void rnn_dnnl_ldigo(const krn_rnn_params *p, const float *W, int64_t K, float *dst) {
    const int64_t G = p->ngates, H = p->hidden;
    for (int d = 0; d < p->ndir; d++)
        for (int64_t k = 0; k < K; k++)
            for (int gd = 0; gd < G; gd++) {
                const float *src = W + ((size_t)d * G * H + (size_t)rnn_dnnl_gate(p, gd) * H) * K + k;
                float *o = dst + (((size_t)d * K + k) * G + gd) * H;
                for (int64_t h = 0; h < H; h++) o[h] = src[h * K];
            }
}

static eng_status rnn_dnnl_weights(const krn_call *c, krn_rnn_dnnl *s) {
    const krn_rnn_params *p = c->params;
    dnnl_stream_t stream;
    ENG_TRY(krn_dnnl_stream(&stream));
    rnn_dnnl_ldigo(p, c->in[KRN_RNN_IN_W].data, p->input, s->wl_user);
    rnn_dnnl_ldigo(p, c->in[KRN_RNN_IN_R].data, p->hidden, s->wi_user);
    ENG_TRY(krn_dnnl_reorder_run(&s->rwl, stream, s->wl_user, s->wl));
    ENG_TRY(krn_dnnl_reorder_run(&s->rwi, stream, s->wi_user, s->wi));
    KRN_DNNL_CHECK(dnnl_stream_wait(stream));
    return ENG_STATUS_OK;
}

/* Biases and peepholes, in oneDNN's gate order (cheap: every exec). */
static void rnn_dnnl_small(const krn_call *c, krn_rnn_dnnl *s) {
    const krn_rnn_params *p = c->params;
    const int64_t G = p->ngates, H = p->hidden, GB = G + (p->cell == KRN_RNN_GRU && p->linear_before_reset);
    const float *Bw = c->nin > KRN_RNN_IN_B ? c->in[KRN_RNN_IN_B].data : NULL;
    for (int d = 0; d < p->ndir; d++) {
        float *bd = s->bias + (size_t)d * GB * H;
        if (!Bw) {
            memset(bd, 0, (size_t)(GB * H) * sizeof(float));
        } else {
            const float *wb = Bw + (size_t)d * 2 * G * H, *rb = wb + G * H;
            for (int gd = 0; gd < G; gd++) {
                int go = rnn_dnnl_gate(p, gd);
                int lbr_h = GB > G && gd == 2;
                for (int64_t h = 0; h < H; h++) bd[gd * H + h] = wb[go * H + h] + (lbr_h ? 0.f : rb[go * H + h]);
            }
            if (GB > G) memcpy(bd + 3 * H, rb + 2 * H, (size_t)H * sizeof(float));
        }
        if (s->peep) { /* oneDNN i, f, o <- ONNX i, o, f */
            const float *P = c->in[KRN_RNN_IN_P].data + (size_t)d * 3 * H;
            float *pd = s->peep + (size_t)d * 3 * H;
            memcpy(pd, P, (size_t)H * sizeof(float));
            memcpy(pd + H, P + 2 * H, (size_t)H * sizeof(float));
            memcpy(pd + 2 * H, P + H, (size_t)H * sizeof(float));
        }
    }
}

static eng_status krn_rnn_dnnl_init(const krn_call *c, krn_rnn_dnnl **out) {
    const krn_rnn_params *p = c->params;
    *out = NULL;
    krn_rnn_dnnl *s = calloc(1, sizeof *s);
    if (!s) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "RNN oneDNN state");
    const int64_t S = p->seq, B = p->batch, I = p->input, H = p->hidden, D = p->ndir, G = p->ngates;
    const int lbr = p->cell == KRN_RNN_GRU && p->linear_before_reset;
    const int has_p = p->cell == KRN_RNN_LSTM && c->nin > KRN_RNN_IN_P && c->in[KRN_RNN_IN_P].dtype != ENG_DTYPE_UNDEFINED;
    const int lstm = p->cell == KRN_RNN_LSTM;
    dnnl_rnn_direction_t dir = D == 2 ? dnnl_bidirectional_concat : p->reverse ? dnnl_unidirectional_right2left
                                                                                : dnnl_unidirectional_left2right;
    rnn_md(&s->md_x, 3, p->layout ? B : S, p->layout ? S : B, I, 0, 0, p->layout ? dnnl_ntc : dnnl_tnc);
    rnn_md(&s->md_y, 3, p->layout ? B : S, p->layout ? S : B, D * H, 0, 0, p->layout ? dnnl_ntc : dnnl_tnc);
    rnn_md(&s->md_h, 4, 1, D, B, H, 0, dnnl_ldnc);
    rnn_md(&s->md_wl_user, 5, 1, D, I, G, H, dnnl_ldigo);
    rnn_md(&s->md_wi_user, 5, 1, D, H, G, H, dnnl_ldigo);
    rnn_md(&s->md_wl, 5, 1, D, I, G, H, dnnl_format_tag_any);
    rnn_md(&s->md_wi, 5, 1, D, H, G, H, dnnl_format_tag_any);
    rnn_md(&s->md_b, 4, 1, D, G + lbr, H, 0, dnnl_ldgo);
    rnn_md(&s->md_p, 4, 1, D, 3, H, 0, dnnl_ldgo);
    dnnl_rnn_desc_t rd;
    dnnl_status_t ds;
    if (lstm)
        ds = dnnl_lstm_forward_desc_init_v2(&rd, dnnl_forward_inference, dir, &s->md_x, &s->md_h, &s->md_h, &s->md_wl,
                                            &s->md_wi, has_p ? &s->md_p : NULL, &s->md_b, &s->md_y, &s->md_h, &s->md_h, 0);
    else if (p->cell == KRN_RNN_GRU && lbr)
        ds = dnnl_lbr_gru_forward_desc_init(&rd, dnnl_forward_inference, dir, &s->md_x, &s->md_h, &s->md_wl, &s->md_wi,
                                            &s->md_b, &s->md_y, &s->md_h, 0);
    else if (p->cell == KRN_RNN_GRU)
        ds = dnnl_gru_forward_desc_init(&rd, dnnl_forward_inference, dir, &s->md_x, &s->md_h, &s->md_wl, &s->md_wi,
                                        &s->md_b, &s->md_y, &s->md_h, 0);
    else {
        int k = p->act[0][0].kind;
        dnnl_alg_kind_t alg = k == KRN_RNN_ACT_RELU ? dnnl_eltwise_relu : k == KRN_RNN_ACT_SIGMOID ? dnnl_eltwise_logistic : dnnl_eltwise_tanh;
        ds = dnnl_vanilla_rnn_forward_desc_init(&rd, dnnl_forward_inference, alg, dir, &s->md_x, &s->md_h, &s->md_wl,
                                                &s->md_wi, &s->md_b, &s->md_y, &s->md_h, 0, 0.f, 0.f);
    }
    eng_status st = ds == dnnl_success ? ENG_STATUS_OK : krn_dnnl_fail(ds, "rnn forward desc", __func__, __FILE__, __LINE__);
    if (st == ENG_STATUS_OK) {
        krn_dnnl_set_threads(c->nthreads);
        st = krn_dnnl_prim(&rd, NULL, NULL, &s->pd, &s->prim, &s->scratch);
    }
    if (st == ENG_STATUS_OK && krn_dnnl_is_ref(s->pd)) { /* slow: the plain path instead */
        krn_rnn_dnnl_free(s);
        return ENG_STATUS_OK;
    }
    if (st == ENG_STATUS_OK) {
        s->md_wl = *dnnl_primitive_desc_query_md(s->pd, dnnl_query_exec_arg_md, DNNL_ARG_WEIGHTS_LAYER);
        s->md_wi = *dnnl_primitive_desc_query_md(s->pd, dnnl_query_exec_arg_md, DNNL_ARG_WEIGHTS_ITER);
        st = krn_dnnl_reorder_init(&s->rwl, &s->md_wl_user, &s->md_wl);
    }
    if (st == ENG_STATUS_OK) st = krn_dnnl_reorder_init(&s->rwi, &s->md_wi_user, &s->md_wi);
    if (st == ENG_STATUS_OK) {
        size_t nbh = (size_t)(D * B * H);
        s->wl_user = eng_alloc((size_t)(D * I * G * H) * sizeof(float));
        s->wi_user = eng_alloc((size_t)(D * H * G * H) * sizeof(float));
        s->wl = eng_alloc(dnnl_memory_desc_get_size(&s->md_wl) + 64);
        s->wi = eng_alloc(dnnl_memory_desc_get_size(&s->md_wi) + 64);
        s->bias = eng_alloc((size_t)(D * (G + 1) * H) * sizeof(float));
        s->peep = has_p ? eng_alloc((size_t)(D * 3 * H) * sizeof(float)) : NULL;
        s->y = eng_alloc((size_t)(S * B * D * H) * sizeof(float)); /* used when Y is omitted or bidirectional */
        s->hy = eng_alloc(nbh * sizeof(float));
        s->cy = eng_alloc(nbh * sizeof(float));
        s->h0 = eng_alloc(nbh * sizeof(float));
        if (s->h0) memset(s->h0, 0, nbh * sizeof(float));
        if (!s->h0 || !s->wl_user || !s->wi_user || !s->wl || !s->wi || !s->bias || (has_p && !s->peep) || !s->y || !s->hy || !s->cy)
            st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "RNN oneDNN buffers (seq %lld, batch %lld, hidden %lld)", (long long)S,
                         (long long)B, (long long)H);
    }
    if (st == ENG_STATUS_OK && ((c->const_mask >> KRN_RNN_IN_W) & 1) && ((c->const_mask >> KRN_RNN_IN_R) & 1)) {
        st = rnn_dnnl_weights(c, s);
        s->packed = 1;
    }
    if (st != ENG_STATUS_OK) {
        krn_rnn_dnnl_free(s);
        return st;
    }
    s->nthreads = c->nthreads;
    snprintf(s->impl, sizeof s->impl, "onednn %s %s (%s)", lstm ? "lstm" : p->cell == KRN_RNN_GRU ? (lbr ? "lbr_gru" : "gru") : "vanilla_rnn",
             D == 2 ? "bidirectional" : "unidirectional", krn_dnnl_impl_name(s->pd));
    *out = s;
    return ENG_STATUS_OK;
}

static eng_status krn_rnn_dnnl_exec(const krn_call *c, krn_rnn_dnnl *s) {
    const krn_rnn_params *p = c->params;
    const int64_t S = p->seq, B = p->batch, H = p->hidden, D = p->ndir;
    int full;
    ENG_TRY(krn_rnn_lens(c, NULL, &full));
    if (!s->packed) ENG_TRY(rnn_dnnl_weights(c, s));
    rnn_dnnl_small(c, s);
    const float *h0 = c->nin > KRN_RNN_IN_H0 ? c->in[KRN_RNN_IN_H0].data : NULL;
    const float *c0 = p->cell == KRN_RNN_LSTM && c->nin > KRN_RNN_IN_C0 ? c->in[KRN_RNN_IN_C0].data : NULL;
    float *Y = c->nout > KRN_RNN_OUT_Y ? c->out[KRN_RNN_OUT_Y].data : NULL;
    float *Yh = c->nout > KRN_RNN_OUT_H ? c->out[KRN_RNN_OUT_H].data : NULL;
    float *Yc = p->cell == KRN_RNN_LSTM && c->nout > KRN_RNN_OUT_C ? c->out[KRN_RNN_OUT_C].data : NULL;
    float *ydst = Y && D == 1 ? Y : s->y; /* layout 1 is single-direction here: ntc == [B, S, 1, H] */
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    ENG_TRY(krn_dnnl_engine(&eng));
    ENG_TRY(krn_dnnl_stream(&stream));
    dnnl_memory_t m[12] = {0};
    dnnl_exec_arg_t args[12];
    int na = 0;
    eng_status st = ENG_STATUS_OK;
#define RNN_ARG(ARG, MD, PTR)                                                                                 \
    do {                                                                                                      \
        if (st == ENG_STATUS_OK) {                                                                            \
            dnnl_status_t s_ = dnnl_memory_create(&m[na], (MD), eng, (void *)(PTR));                          \
            if (s_ != dnnl_success) st = krn_dnnl_fail(s_, "dnnl_memory_create", __func__, __FILE__, __LINE__); \
            else args[na] = (dnnl_exec_arg_t){(ARG), m[na]}, na++;                                            \
        }                                                                                                     \
    } while (0)
    RNN_ARG(DNNL_ARG_SRC_LAYER, &s->md_x, c->in[KRN_RNN_IN_X].data);
    RNN_ARG(DNNL_ARG_SRC_ITER, &s->md_h, h0 ? h0 : s->h0); /* zeros when absent */
    if (p->cell == KRN_RNN_LSTM) RNN_ARG(DNNL_ARG_SRC_ITER_C, &s->md_h, c0 ? c0 : s->h0);
    RNN_ARG(DNNL_ARG_WEIGHTS_LAYER, &s->md_wl, s->wl);
    RNN_ARG(DNNL_ARG_WEIGHTS_ITER, &s->md_wi, s->wi);
    if (s->peep) RNN_ARG(DNNL_ARG_WEIGHTS_PEEPHOLE, &s->md_p, s->peep);
    RNN_ARG(DNNL_ARG_BIAS, &s->md_b, s->bias);
    RNN_ARG(DNNL_ARG_DST_LAYER, &s->md_y, ydst);
    RNN_ARG(DNNL_ARG_DST_ITER, &s->md_h, Yh ? Yh : s->hy);
    if (p->cell == KRN_RNN_LSTM) RNN_ARG(DNNL_ARG_DST_ITER_C, &s->md_h, Yc ? Yc : s->cy);
    if (s->scratch && st == ENG_STATUS_OK) args[na++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, s->scratch};
#undef RNN_ARG
    if (st == ENG_STATUS_OK) {
        krn_dnnl_set_threads(c->nthreads);
        dnnl_status_t e = dnnl_primitive_execute(s->prim, stream, na, args);
        if (e == dnnl_success) e = dnnl_stream_wait(stream);
        if (e != dnnl_success) st = krn_dnnl_fail(e, "rnn forward", __func__, __FILE__, __LINE__);
    }
    for (int i = 0; i < 12; i++)
        if (m[i]) dnnl_memory_destroy(m[i]);
    ENG_TRY(st);
    if (Y && D == 2) /* [S, B, 2H] -> [S, 2, B, H] */
        for (int64_t t = 0; t < S; t++)
            for (int d = 0; d < 2; d++)
                for (int64_t b = 0; b < B; b++)
                    memcpy(Y + ((t * 2 + d) * B + b) * H, s->y + (t * B + b) * 2 * H + d * H, (size_t)H * sizeof(float));
    return ENG_STATUS_OK;
}

static void krn_rnn_dnnl_describe(const krn_rnn_dnnl *s, char *buf, size_t cap) { krn_str_copy(buf, cap, s->impl); }

/* ---- the kernel ---- */

typedef struct rnn_state {
    int impl; /* RNN_IMPL_* */
    rnn_plain *plain;
    krn_rnn_dnnl *dnnl;
    char desc[160];
} rnn_state;

static void rnn_free_state(void *st) {
    rnn_state *s = st;
    if (!s) return;
    rnn_plain_free(s->plain);
    krn_rnn_dnnl_free(s->dnnl);
    free(s);
}

/* TENSORD_RNN_IMPL=plain|onednn forces one implementation (tests compare them), plain-solo the plain one with one
 * thread per team (the fallback it takes under contention); unset: the faster for the call. */
static int rnn_impl_forced(void) {
    const char *e = getenv("TENSORD_RNN_IMPL");
    if (!e || !*e) return -1;
    if (!strcmp(e, "plain") || !strcmp(e, "plain-solo")) return RNN_IMPL_PLAIN;
    if (!strcmp(e, "onednn")) return RNN_IMPL_DNNL;
    return -1;
}

static eng_status rnn_init(krn_call *c) {
    const krn_rnn_params *p = c->params;
    for (int i = 0; i < c->nin; i++)
        if (c->in[i].data && c->in[i].dtype != (i == KRN_RNN_IN_SEQ_LENS ? ENG_DTYPE_I32 : ENG_DTYPE_F32))
            return eng_err(ENG_STATUS_UNSUPPORTED, "RNN kernel: input %d has dtype %s; float32 only", i, eng_dtype_name(c->in[i].dtype));
    rnn_state *s = calloc(1, sizeof *s);
    if (!s) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "RNN kernel state");
    int forced = rnn_impl_forced();
    eng_status st = ENG_STATUS_OK;
    if (forced != RNN_IMPL_PLAIN && krn_rnn_dnnl_fits(c, forced == RNN_IMPL_DNNL)) {
        st = krn_rnn_dnnl_init(c, &s->dnnl);
        if (st == ENG_STATUS_OK && s->dnnl) {
            s->impl = RNN_IMPL_DNNL;
            krn_rnn_dnnl_describe(s->dnnl, s->desc, sizeof s->desc);
        } else if (forced == RNN_IMPL_DNNL) {
            if (st == ENG_STATUS_OK) st = eng_err(ENG_STATUS_UNSUPPORTED, "TENSORD_RNN_IMPL=onednn: oneDNN has only a reference implementation for this call");
            rnn_free_state(s);
            return st;
        }
        eng_err_clear();
    } else if (forced == RNN_IMPL_DNNL) {
        rnn_free_state(s);
        return eng_err(ENG_STATUS_UNSUPPORTED, "TENSORD_RNN_IMPL=onednn: the call does not fit oneDNN's RNN primitives "
                                               "(activations, clip, input_forget, sequence_lens or shapes)");
    }
    if (s->impl != RNN_IMPL_DNNL) {
        st = rnn_plain_init(c, &s->plain);
        if (st != ENG_STATUS_OK) {
            rnn_free_state(s);
            return st;
        }
        s->impl = RNN_IMPL_PLAIN;
        const char *e = getenv("TENSORD_RNN_IMPL");
        if (e && !strcmp(e, "plain-solo")) s->plain->guard.solo_left = 1 << 30;
        snprintf(s->desc, sizeof s->desc, "plain gemm+fused gates (%s, %d team%s x %d thread%s, R %s)",
                 p->cell == KRN_RNN_LSTM ? "lstm" : p->cell == KRN_RNN_GRU ? (p->linear_before_reset ? "gru lbr" : "gru") : "rnn",
                 s->plain->teams, s->plain->teams > 1 ? "s" : "", s->plain->tpd, s->plain->tpd > 1 ? "s" : "",
                 s->plain->packed ? "packed once" : "packed per run");
    }
    c->state = s;
    return ENG_STATUS_OK;
}

static eng_status rnn_exec(krn_call *c) {
    rnn_state *s = c->state;
    if (!s) return eng_err(ENG_STATUS_INTERNAL, "RNN kernel run without init");
    if (s->impl == RNN_IMPL_DNNL) return krn_rnn_dnnl_exec(c, s->dnnl);
    return rnn_plain_exec(c, s->plain);
}

static void rnn_describe(const krn_call *c, krn_impl_info *info) {
    const rnn_state *s = c->state;
    krn_str_copy(info->impl, sizeof info->impl, s ? s->desc : "plain gemm+fused gates");
    info->slow = 0;
    info->reorders = 0;
}

const krn_kernel krn_cpu_rnn_kernels[] = {
    {"rnn", rnn_init, rnn_exec, rnn_free_state, rnn_describe},
    {NULL},
};
