/* rnn-gemm.h - the packed-panel GEMM of the recurrent kernels, shared by the forward (rnn.c) and gradient
 * (rnn-grad.c) kernels: out[M, 16*np] = A[M, K] x P, P a [K, 16*np] matrix held as np panels of 16 columns
 * (pk[(p*K + k)*16 + l] = P[k, p*16 + l]), zero past its last real column. Register-blocked for AVX-512 (one panel
 * row is one 64-byte vector); GCC's vector extension, so it also compiles (slower) without AVX-512.
 * Contract of rnn_gemm: out rows are ldo floats apart, ldo a multiple of 16, out 64-byte aligned; A is read with
 * scalar loads (any stride, any alignment); single-threaded, callers split panels or rows between threads. */
#ifndef KRN_RNN_GEMM_H
#define KRN_RNN_GEMM_H

#include <stdint.h>

#define RNN_PANEL 16    /* columns per packed panel of R^T (one 64-byte vector) */

/* ---- team or solo ----
 * Kernels whose threads meet at a barrier every step (a team) stall when one mate is preempted (a machine shared
 * with other work): a run then takes many times its best. After RNN_SLOW_STREAK such runs in a row, the next
 * RNN_SOLO_RUNS run one thread per team (no barrier), then the team is tried again. One slow run (a page fault, a
 * first run, a burst of other work) changes nothing: a single outlier must not halve the speed of the next runs. */
#define RNN_SLOW_STREAK 3
#define RNN_SOLO_RUNS 32

typedef struct rnn_team_guard {
    double best_s;  /* fastest team run (seconds) */
    int slow;       /* team runs in a row far slower than best_s */
    int solo_left;  /* runs left on one thread per team */
} rnn_team_guard;

/* Whether this run uses the team (and counts down a solo stretch). */
static inline int rnn_guard_team(rnn_team_guard *g) {
    if (g->solo_left > 0) {
        g->solo_left--;
        return 0;
    }
    return 1;
}

/* After a team run of dt seconds. */
static inline void rnn_guard_note(rnn_team_guard *g, double dt) {
    if (g->best_s == 0 || dt < g->best_s) g->best_s = dt;
    if (dt > 4 * g->best_s && dt > 2e-4) {
        if (++g->slow >= RNN_SLOW_STREAK) g->solo_left = RNN_SOLO_RUNS, g->slow = 0;
    } else {
        g->slow = 0;
    }
}

typedef float rnn_v16 __attribute__((vector_size(64)));

/* ---- the recurrence GEMM on packed panels ----
 * out[m, c] = sum_k h[m*ldh + k] * R^T[k, c], for panels of 16 columns: pk[(p*K + k)*16 + l] holds R^T[k, p*16 + l].
 * out rows: ldo floats (a multiple of 16), 64-byte aligned. */
#define RNN_MK(MR, NR)                                                                                              \
    static inline void rnn_mk_##MR##x##NR(const float *h, int64_t ldh, int64_t K, const float *pk, float *out,      \
                                          int64_t ldo) {                                                          \
        rnn_v16 acc[MR][NR];                                                                                      \
        for (int m = 0; m < MR; m++)                                                                              \
            for (int n = 0; n < NR; n++) acc[m][n] = (rnn_v16){0};                                                \
        const int64_t ps = K * RNN_PANEL;                                                                         \
        for (int64_t k = 0; k < K; k++) {                                                                         \
            rnn_v16 w[NR];                                                                                        \
            for (int n = 0; n < NR; n++) w[n] = *(const rnn_v16 *)(pk + n * ps + k * RNN_PANEL);                  \
            for (int m = 0; m < MR; m++) {                                                                        \
                float hv = h[m * ldh + k];                                                                        \
                for (int n = 0; n < NR; n++) acc[m][n] += hv * w[n];                                              \
            }                                                                                                     \
        }                                                                                                         \
        for (int m = 0; m < MR; m++)                                                                              \
            for (int n = 0; n < NR; n++) *(rnn_v16 *)(out + m * ldo + n * RNN_PANEL) = acc[m][n];                 \
    }
RNN_MK(6, 4)
RNN_MK(4, 4)
RNN_MK(1, 4)
RNN_MK(4, 1)
RNN_MK(1, 8)
RNN_MK(1, 1)

/* 6x4 blocks (24 accumulators + 4 weight vectors: the AVX-512 register file) with the 64 columns' panels held in
 * L1 while the rows stream by; fewer than 4 rows (a batch of 1-3: a GEMV, bound by reading R^T) 1x8. */
static inline void rnn_gemm(const float *h, int64_t ldh, int64_t M, int64_t K, const float *pk, int64_t np, float *out,
                     int64_t ldo) {
    const int64_t ps = K * RNN_PANEL;
    if (M < 4) {
        for (int64_t m = 0; m < M; m++) {
            int64_t p = 0;
            for (; p + 8 <= np; p += 8) rnn_mk_1x8(h + m * ldh, ldh, K, pk + p * ps, out + m * ldo + p * RNN_PANEL, ldo);
            for (; p + 4 <= np; p += 4) rnn_mk_1x4(h + m * ldh, ldh, K, pk + p * ps, out + m * ldo + p * RNN_PANEL, ldo);
            for (; p < np; p++) rnn_mk_1x1(h + m * ldh, ldh, K, pk + p * ps, out + m * ldo + p * RNN_PANEL, ldo);
        }
        return;
    }
    int64_t p = 0;
    for (; p + 4 <= np; p += 4) {
        int64_t m = 0;
        for (; m + 6 <= M; m += 6) rnn_mk_6x4(h + m * ldh, ldh, K, pk + p * ps, out + m * ldo + p * RNN_PANEL, ldo);
        for (; m + 4 <= M; m += 4) rnn_mk_4x4(h + m * ldh, ldh, K, pk + p * ps, out + m * ldo + p * RNN_PANEL, ldo);
        for (; m < M; m++) rnn_mk_1x4(h + m * ldh, ldh, K, pk + p * ps, out + m * ldo + p * RNN_PANEL, ldo);
    }
    for (; p < np; p++) {
        int64_t m = 0;
        for (; m + 4 <= M; m += 4) rnn_mk_4x1(h + m * ldh, ldh, K, pk + p * ps, out + m * ldo + p * RNN_PANEL, ldo);
        for (; m < M; m++) rnn_mk_1x1(h + m * ldh, ldh, K, pk + p * ps, out + m * ldo + p * RNN_PANEL, ldo);
    }
}

/* W^T panels for the input projection: columns [p0*16, p1*16) of W viewed as [cols, K] row-major (cols = dirs *
 * gates * hidden, in ONNX order), zero past the last column. */
static inline void rnn_pack_cols(const float *W, int64_t cols, int64_t K, int64_t p0, int64_t p1, float *dst) {
    for (int64_t pi = p0; pi < p1; pi++)
        for (int64_t k = 0; k < K; k++)
            for (int l = 0; l < RNN_PANEL; l++) {
                int64_t col = pi * RNN_PANEL + l;
                dst[(pi * K + k) * RNN_PANEL + l] = col < cols ? W[col * K + k] : 0.f;
            }
}

/* Panels of M [K, cols] row-major (row stride ld) as it stands, no transpose: columns [p0*16, p1*16), zero past the
 * last column (rnn_pack_cols packs the transpose of a [cols, K] matrix). */
static inline void rnn_pack_rows(const float *M, int64_t ld, int64_t K, int64_t cols, int64_t p0, int64_t p1,
                                 float *dst) {
    for (int64_t pi = p0; pi < p1; pi++)
        for (int64_t k = 0; k < K; k++)
            for (int l = 0; l < RNN_PANEL; l++) {
                int64_t col = pi * RNN_PANEL + l;
                dst[(pi * K + k) * RNN_PANEL + l] = col < cols ? M[k * ld + col] : 0.f;
            }
}

#endif
