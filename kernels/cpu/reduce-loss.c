/* reduce-loss.c - CPU kernels for NegativeLogLikelihoodLoss / SoftmaxCrossEntropyLoss and Det (Einsum is in
 * reduce-einsum.c).
 *
 * All compute in double and convert the results to the output dtype. Losses: input (N, C, D) with
 * D = prod(d1..dk), target (N, D); a target equal to ignore_index contributes 0 loss and 0 weight, any other
 * target outside [0, C) is an INVALID_ARGUMENT error naming the position. "mean" divides by the sum of the
 * weights of the counted targets. Det: LU with partial pivoting per matrix.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernel.h"
#include "../krn-reduce.h"
#include "reduce-math.h"

eng_status krn_cpu_loss_exec(krn_call *c);
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
