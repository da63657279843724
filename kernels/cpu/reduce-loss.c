/* reduce-loss.c - CPU kernels for NegativeLogLikelihoodLoss / SoftmaxCrossEntropyLoss, Einsum and Det.
 *
 * All compute in double and convert the results to the output dtype. Losses: input (N, C, D) with
 * D = prod(d1..dk), target (N, D); a target equal to ignore_index contributes 0 loss and 0 weight, any other
 * target outside [0, C) is an INVALID_ARGUMENT error naming the position. "mean" divides by the sum of the
 * weights of the counted targets. Einsum walks every combination of subscript values (output subscripts
 * outermost) with per-operand strides - simple and general (diagonals, broadcasting ellipses), O(product of
 * all subscript sizes). Det: LU with partial pivoting per matrix.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernel.h"
#include "../krn-reduce.h"
#include "reduce-math.h"

eng_status krn_cpu_loss_exec(krn_call *c);
eng_status krn_cpu_einsum_exec(krn_call *c);
eng_status krn_cpu_det_exec(krn_call *c);

/* ---- losses ---- */

eng_status krn_cpu_loss_exec(krn_call *c) {
    const krn_loss_params *p = c->params;
    const eng_tensor *x = &c->in[0], *t = &c->in[1];
    const eng_tensor *w = c->nin > 2 && c->in[2].data ? &c->in[2] : NULL;
    int64_t n = x->dims[0], ch = x->dims[1], d = eng_shape_numel(x->dims + 2, x->ndim - 2);
    int64_t nx = n * ch * d, nt = n * d;
    int xo;
    const double *xd = krn_red_as(x, ENG_DTYPE_F64, &xo);
    if (!xd) return ENG_STATUS_OUT_OF_MEMORY;
    double *lp = NULL, *loss = malloc((size_t)(nt > 0 ? nt : 1) * 2 * sizeof(double));
    eng_status st = ENG_STATUS_OK;
    if (!loss) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "loss scratch for %lld targets", (long long)nt);
    if (st == ENG_STATUS_OK && p->log_softmax) {
        lp = malloc((size_t)(nx > 0 ? nx : 1) * sizeof(double));
        if (!lp) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "log_prob scratch of %lld", (long long)nx);
        for (int64_t b = 0; lp && b < n; b++)
            for (int64_t j = 0; j < d; j++) {
                const double *xr = xd + b * ch * d + j;
                double m = -INFINITY, s = 0;
                for (int64_t k = 0; k < ch; k++) m = xr[k * d] > m ? xr[k * d] : m;
                for (int64_t k = 0; k < ch; k++) s += exp(xr[k * d] - m);
                double l = m + log(s);
                for (int64_t k = 0; k < ch; k++) lp[b * ch * d + k * d + j] = xr[k * d] - l;
            }
    }
    const double *src = lp ? lp : xd;
    double *wt = loss ? loss + nt : NULL, wsum = 0, lsum = 0;
    for (int64_t i = 0; st == ENG_STATUS_OK && i < nt; i++) {
        int64_t tg = eng_tensor_get_i64(t, i), b = i / d, j = i % d;
        if (p->has_ignore_index && tg == p->ignore_index) {
            loss[i] = 0, wt[i] = 0;
            continue;
        }
        if (tg < 0 || tg >= ch) {
            st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "target[%lld] = %lld is outside [0, %lld)", (long long)i,
                         (long long)tg, (long long)ch);
            break;
        }
        wt[i] = w ? eng_tensor_get_f64(w, tg) : 1.0;
        loss[i] = -src[(b * ch + tg) * d + j] * wt[i];
        wsum += wt[i];
        lsum += loss[i];
    }
    if (st == ENG_STATUS_OK) {
        eng_tensor *y = &c->out[0];
        if (p->reduction == KRN_LOSS_NONE) st = eng_convert(loss, ENG_DTYPE_F64, y->data, y->dtype, nt);
        else eng_tensor_set_f64(y, 0, p->reduction == KRN_LOSS_SUM ? lsum : lsum / wsum);
    }
    if (st == ENG_STATUS_OK && lp && c->nout > 1 && c->out[1].data)
        st = eng_convert(lp, ENG_DTYPE_F64, c->out[1].data, c->out[1].dtype, nx);
    free(lp);
    free(loss);
    if (xo) eng_free((void *)xd);
    return st;
}

/* ---- Einsum ---- */

eng_status krn_cpu_einsum_exec(krn_call *c) {
    const krn_einsum_params *p = c->params;
    /* used ids: output ids first (in output order), then contracted ids */
    int used[KRN_EINSUM_MAX_IDS], nused = 0, is_used[KRN_EINSUM_MAX_IDS] = {0};
    for (int j = 0; j < p->out_rank; j++)
        if (!is_used[p->out_ids[j]]) is_used[p->out_ids[j]] = 1, used[nused++] = p->out_ids[j];
    for (int k = 0; k < p->nops; k++)
        for (int j = 0; j < p->op_rank[k]; j++)
            if (!is_used[p->op_ids[k][j]]) is_used[p->op_ids[k][j]] = 1, used[nused++] = p->op_ids[k][j];
    int pos[KRN_EINSUM_MAX_IDS];
    for (int u = 0; u < nused; u++) pos[used[u]] = u;
    /* per-operand stride for each used id (repeated subscripts add up: diagonals; size-1 dims broadcast) */
    int64_t stride[KRN_EINSUM_MAX_OPS + 1][KRN_EINSUM_MAX_IDS];
    memset(stride, 0, sizeof stride);
    for (int k = 0; k < p->nops; k++) {
        int64_t s = 1;
        for (int j = p->op_rank[k] - 1; j >= 0; j--) {
            int64_t dim = c->in[k].dims[j];
            if (dim != 1) stride[k][pos[p->op_ids[k][j]]] += s;
            s *= dim;
        }
    }
    int64_t s = 1;
    for (int j = p->out_rank - 1; j >= 0; j--) {
        stride[p->nops][pos[p->out_ids[j]]] = s;
        s *= p->id_size[p->out_ids[j]];
    }
    eng_tensor *y = &c->out[0];
    int64_t ny = eng_tensor_numel(y);
    double *acc = calloc((size_t)(ny > 0 ? ny : 1), sizeof *acc);
    const double *xs[KRN_EINSUM_MAX_OPS] = {0};
    int owned[KRN_EINSUM_MAX_OPS] = {0};
    eng_status st = acc ? ENG_STATUS_OK : eng_err(ENG_STATUS_OUT_OF_MEMORY, "einsum accumulator of %lld", (long long)ny);
    for (int k = 0; st == ENG_STATUS_OK && k < p->nops; k++)
        if (!(xs[k] = krn_red_as(&c->in[k], ENG_DTYPE_F64, &owned[k]))) st = ENG_STATUS_OUT_OF_MEMORY;
    int64_t total = 1;
    for (int u = 0; u < nused; u++) total *= p->id_size[used[u]];
    if (st == ENG_STATUS_OK && total > 0) {
        int64_t idx[KRN_EINSUM_MAX_IDS] = {0}, off[KRN_EINSUM_MAX_OPS + 1] = {0};
        for (int64_t it = 0; it < total; it++) {
            double v = 1;
            for (int k = 0; k < p->nops; k++) v *= xs[k][off[k]];
            acc[off[p->nops]] += v;
            for (int u = nused - 1; u >= 0; u--) {
                int64_t sz = p->id_size[used[u]];
                for (int k = 0; k <= p->nops; k++) off[k] += stride[k][u];
                if (++idx[u] < sz) break;
                for (int k = 0; k <= p->nops; k++) off[k] -= stride[k][u] * sz;
                idx[u] = 0;
            }
        }
    }
    if (st == ENG_STATUS_OK) st = eng_convert(acc, ENG_DTYPE_F64, y->data, y->dtype, ny);
    for (int k = 0; k < p->nops; k++)
        if (owned[k]) eng_free((void *)xs[k]);
    free(acc);
    return st;
}

/* ---- Det ---- */

eng_status krn_cpu_det_exec(krn_call *c) {
    const eng_tensor *x = &c->in[0];
    eng_tensor *y = &c->out[0];
    int64_t m = x->dims[x->ndim - 1], nb = eng_tensor_numel(y);
    int xo;
    const double *xd = krn_red_as(x, ENG_DTYPE_F64, &xo);
    if (!xd) return ENG_STATUS_OUT_OF_MEMORY;
    double *a = malloc((size_t)(m * m > 0 ? m * m : 1) * sizeof *a);
    if (!a) {
        if (xo) eng_free((void *)xd);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "Det scratch for a %lldx%lld matrix", (long long)m, (long long)m);
    }
    for (int64_t b = 0; b < nb; b++) {
        memcpy(a, xd + b * m * m, (size_t)(m * m) * sizeof *a);
        double det = 1;
        for (int64_t k = 0; k < m && det != 0; k++) {
            int64_t piv = k;
            for (int64_t i = k + 1; i < m; i++)
                if (fabs(a[i * m + k]) > fabs(a[piv * m + k])) piv = i;
            if (a[piv * m + k] == 0) { det = 0; break; }
            if (piv != k) {
                for (int64_t j = 0; j < m; j++) {
                    double t = a[k * m + j]; a[k * m + j] = a[piv * m + j]; a[piv * m + j] = t;
                }
                det = -det;
            }
            det *= a[k * m + k];
            for (int64_t i = k + 1; i < m; i++) {
                double f = a[i * m + k] / a[k * m + k];
                for (int64_t j = k; j < m; j++) a[i * m + j] -= f * a[k * m + j];
            }
        }
        eng_tensor_set_f64(y, b, det);
    }
    free(a);
    if (xo) eng_free((void *)xd);
    return ENG_STATUS_OK;
}
