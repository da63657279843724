/* krn-attn.h - com.tensord FusedAttention: Y = softmax(scale(Q @ KT) + M) @ V in one kernel, the scores never
 * reaching memory. engine/plan/fuse-attn.c makes it from the MatMul -> [Mul|Div by a constant] -> [Add M] ->
 * Softmax(last axis) -> MatMul chain of exported attention layers, on device sessions (the CPU keeps its oneDNN
 * matmuls). Its semantics are exactly the chain's, broadcasting included: Q [..., Sq, D], KT [..., D, Sk] (K already
 * transposed, as the first MatMul reads it), V [..., Sk, Dv], an optional additive mask M broadcast against the
 * scores [..., Sq, Sk]; batch dims broadcast numpy-style; Y [..., Sq, Dv].
 *
 * The view below is one definition of that broadcasting for the CPU reference (kernels/cpu/nn-attn.c) and the CUDA
 * kernel (kernels/cuda/cuda-attn.cu): element strides of every input per output batch dim (0 where broadcast), and of
 * the rows and columns inside a batch. Plain C, also compiled as C++. */
#ifndef KRN_ATTN_H
#define KRN_ATTN_H

#include <stdint.h>
#include <string.h>

#include "../engine/ir/status.h"
#include "../engine/ir/tensor.h"

#define KRN_ATTN_MAX_BATCH 6

typedef struct krn_attn_params {
    float scale;   /* applied to Q @ KT before the mask */
    int scale_div; /* 1: the scores are divided by scale (the chain's Div), 0: multiplied (its Mul, or 1) */
    int has_mask;  /* input 3 is M */
} krn_attn_params;

typedef struct krn_attn_view {
    int nbd;                            /* output batch dims */
    int64_t bdims[KRN_ATTN_MAX_BATCH];  /* their sizes */
    int64_t nb;                         /* product of bdims (1 with none) */
    int64_t sq, sk, d, dv;              /* query rows, keys, head dim, value dim */
    /* per batch dim, each input's element stride (0: broadcast); q, kt, v, m */
    int64_t bs[4][KRN_ATTN_MAX_BATCH];
    int64_t q_row;                      /* Q's stride between query rows (d, or 0 when Q has one row) */
    int64_t k_col;                      /* KT's stride between keys (1, or 0 when KT has one column) */
    int64_t k_row;                      /* KT's stride between head-dim rows (its own column count) */
    int64_t m_row, m_col;               /* M's strides along the scores' rows and columns (0: broadcast) */
} krn_attn_view;

/* Dim i of t counted from the right (0: the last), 1 where t has fewer dims. */
static inline int64_t krn_attn_rdim(const eng_tensor *t, int i) { return i < t->ndim ? t->dims[t->ndim - 1 - i] : 1; }

/* Element stride of t's dim counted i from the right (0 when that dim is 1 or absent: broadcast). */
static inline int64_t krn_attn_rstride(const eng_tensor *t, int i) {
    if (i >= t->ndim || t->dims[t->ndim - 1 - i] == 1) return 0;
    int64_t s = 1;
    for (int k = 0; k < i; k++) s *= t->dims[t->ndim - 1 - k];
    return s;
}

static inline int krn_attn_bcast(int64_t *acc, int64_t d) {
    if (d == *acc || d == 1) return 1;
    if (*acc == 1) {
        *acc = d;
        return 1;
    }
    return 0;
}

/* The view of inputs q, kt, v, m (m NULL without a mask); the output's dims go to out_dims / *out_ndim when not
 * NULL (shape inference uses this too). Errors name the shapes, as the unfused MatMul / Add would. */
static inline eng_status krn_attn_view_make(const eng_tensor *q, const eng_tensor *kt, const eng_tensor *v,
                                            const eng_tensor *m, krn_attn_view *w, int64_t *out_dims, int *out_ndim) {
    memset(w, 0, sizeof *w);
    if (q->ndim < 2 || kt->ndim < 2 || v->ndim < 2)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "FusedAttention needs Q, KT and V of rank >= 2, got ranks %d, %d, %d",
                       q->ndim, kt->ndim, v->ndim);
    w->d = q->dims[q->ndim - 1];
    if (kt->dims[kt->ndim - 2] != w->d)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "FusedAttention: Q's last dim %lld differs from KT's rows %lld",
                       (long long)w->d, (long long)kt->dims[kt->ndim - 2]);
    int64_t sq = q->dims[q->ndim - 2], sk = kt->dims[kt->ndim - 1];
    if (m && (!krn_attn_bcast(&sq, krn_attn_rdim(m, 1)) || !krn_attn_bcast(&sk, krn_attn_rdim(m, 0))))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "FusedAttention: the mask's last dims (%lld, %lld) do not broadcast "
                       "against the scores' (%lld, %lld)", (long long)krn_attn_rdim(m, 1), (long long)krn_attn_rdim(m, 0),
                       (long long)q->dims[q->ndim - 2], (long long)kt->dims[kt->ndim - 1]);
    if (v->dims[v->ndim - 2] != sk)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "FusedAttention: V has %lld rows, the scores %lld columns",
                       (long long)v->dims[v->ndim - 2], (long long)sk);
    w->sq = sq;
    w->sk = sk;
    w->dv = v->dims[v->ndim - 1];
    const eng_tensor *ts[4] = {q, kt, v, m};
    int nbd = 0;
    for (int k = 0; k < 4; k++)
        if (ts[k] && ts[k]->ndim - 2 > nbd) nbd = ts[k]->ndim - 2;
    if (nbd > KRN_ATTN_MAX_BATCH)
        return eng_err(ENG_STATUS_UNSUPPORTED, "FusedAttention: %d batch dims exceed the limit of %d", nbd, KRN_ATTN_MAX_BATCH);
    w->nbd = nbd;
    w->nb = 1;
    for (int b = 0; b < nbd; b++) { /* output batch dim b is dim (nbd - 1 - b) + 2 counted from the right */
        int r = nbd - 1 - b + 2;
        int64_t acc = 1;
        for (int k = 0; k < 4; k++)
            if (ts[k] && !krn_attn_bcast(&acc, krn_attn_rdim(ts[k], r)))
                return eng_err(ENG_STATUS_INVALID_ARGUMENT, "FusedAttention: batch dim %d of %s (%lld) does not broadcast "
                               "against %lld", b, k == 0 ? "Q" : k == 1 ? "KT" : k == 2 ? "V" : "the mask",
                               (long long)krn_attn_rdim(ts[k], r), (long long)acc);
        w->bdims[b] = acc;
        w->nb *= acc;
        for (int k = 0; k < 4; k++) w->bs[k][b] = ts[k] ? krn_attn_rstride(ts[k], r) : 0;
    }
    w->q_row = q->dims[q->ndim - 2] == 1 ? 0 : w->d;
    w->k_col = kt->dims[kt->ndim - 1] == 1 ? 0 : 1;
    w->k_row = kt->dims[kt->ndim - 1];
    w->m_row = m ? krn_attn_rstride(m, 1) : 0;
    w->m_col = m ? krn_attn_rstride(m, 0) : 0;
    if (out_dims && out_ndim) {
        for (int b = 0; b < nbd; b++) out_dims[b] = w->bdims[b];
        out_dims[nbd] = w->sq;
        out_dims[nbd + 1] = w->dv;
        *out_ndim = nbd + 2;
    }
    return ENG_STATUS_OK;
}

/* Element offsets of batch index bi's blocks in q, kt, v, m (o[0..3]). */
#if defined(__CUDACC__)
__host__ __device__
#endif
static inline void krn_attn_offsets(const krn_attn_view *w, int64_t bi, int64_t o[4]) {
    o[0] = o[1] = o[2] = o[3] = 0;
    for (int b = w->nbd - 1; b >= 0; b--) {
        int64_t i = bi % w->bdims[b];
        bi /= w->bdims[b];
        for (int k = 0; k < 4; k++) o[k] += i * w->bs[k][b];
    }
}

#endif
