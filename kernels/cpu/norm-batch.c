/* norm-batch.c - CPU kernels for BatchNormalization, InstanceNormalization, LRN and MeanVarianceNormalization.
 *
 * BatchNormalization inference folds scale/B/mean/var into one multiply-add per element: a = scale /
 * sqrt(var + eps), b = B - mean * a, precomputed once in init when those inputs are constant (const_mask),
 * else per run (C values, cheap). The (N, C, S) loops are contiguous over S and parallel over N*C.
 * Training mode computes batch statistics in double. InstanceNorm, LRN and MVN compute in double (off the
 * hot path); f32 inputs are converted in scratch only where needed.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernel.h"
#include "../krn-reduce.h"
#include "reduce-math.h"
#include "ew-math.h"

eng_status krn_cpu_batchnorm_init(krn_call *c);
eng_status krn_cpu_batchnorm_exec(krn_call *c);
void krn_cpu_batchnorm_free(void *state);
eng_status krn_cpu_instnorm_exec(krn_call *c);
eng_status krn_cpu_lrn_exec(krn_call *c);
eng_status krn_cpu_mvn_exec(krn_call *c);

#define BN_PAR_MIN 16384

/* ---- BatchNormalization ---- */

typedef struct bn_state {
    int64_t np;   /* entries in a, b: C, or C * S with spatial = 0 */
    double *a, *b;
} bn_state;

void krn_cpu_batchnorm_free(void *state) {
    bn_state *s = state;
    if (!s) return;
    free(s->a);
    free(s);
}

/* Fold scale/B/mean/var (inputs 1..4) into y = x * a + b. */
static bn_state *bn_fold(const krn_call *c, const krn_batchnorm_params *p) {
    bn_state *s = calloc(1, sizeof *s);
    int64_t np = eng_tensor_numel(&c->in[1]);
    if (s) s->a = malloc((size_t)(np > 0 ? np : 1) * 2 * sizeof(double));
    if (!s || !s->a) {
        krn_cpu_batchnorm_free(s);
        eng_err(ENG_STATUS_OUT_OF_MEMORY, "batch norm scale/shift for %lld channels", (long long)np);
        return NULL;
    }
    s->np = np;
    s->b = s->a + np;
    for (int64_t i = 0; i < np; i++) {
        double a = eng_tensor_get_f64(&c->in[1], i) / sqrt(eng_tensor_get_f64(&c->in[4], i) + (double)p->epsilon);
        s->a[i] = a;
        s->b[i] = eng_tensor_get_f64(&c->in[2], i) - eng_tensor_get_f64(&c->in[3], i) * a;
    }
    return s;
}

eng_status krn_cpu_batchnorm_init(krn_call *c) {
    const krn_batchnorm_params *p = c->params;
    if (p->training || (c->const_mask & 0x1eu) != 0x1eu) return ENG_STATUS_OK;
    c->state = bn_fold(c, p);
    return c->state ? ENG_STATUS_OK : ENG_STATUS_OUT_OF_MEMORY;
}

/* y[n, c, s] = x[n, c, s] * a[k] + b[k] with k = c (per channel) or c * S + s (per feature). */
static void bn_apply_f32(const float *x, float *y, const bn_state *st, int64_t n, int64_t ch, int64_t sp, int nt) {
    int per_feature = st->np != ch;
    int64_t blocks = n * ch;
    _Pragma("omp parallel for num_threads(nt) if(blocks * sp >= BN_PAR_MIN && blocks > 1) schedule(static)")
    for (int64_t blk = 0; blk < blocks; blk++) {
        int64_t cc = blk % ch;
        const float *restrict xr = x + blk * sp;
        float *restrict yr = y + blk * sp;
        if (per_feature) {
            const double *a = st->a + cc * sp, *b = st->b + cc * sp;
            for (int64_t i = 0; i < sp; i++) yr[i] = (float)(xr[i] * a[i] + b[i]);
        } else {
            float a = (float)st->a[cc], b = (float)st->b[cc];
#pragma omp simd
            for (int64_t i = 0; i < sp; i++) yr[i] = xr[i] * a + b;
        }
    }
}

static void bn_apply_f64(const double *x, double *y, const bn_state *st, int64_t n, int64_t ch, int64_t sp, int nt) {
    int per_feature = st->np != ch;
    int64_t blocks = n * ch;
    _Pragma("omp parallel for num_threads(nt) if(blocks * sp >= BN_PAR_MIN && blocks > 1) schedule(static)")
    for (int64_t blk = 0; blk < blocks; blk++) {
        int64_t cc = blk % ch;
        const double *a = st->a + (per_feature ? cc * sp : cc), *b = st->b + (per_feature ? cc * sp : cc);
        for (int64_t i = 0; i < sp; i++) y[blk * sp + i] = x[blk * sp + i] * a[per_feature ? i : 0] + b[per_feature ? i : 0];
    }
}

/* Outputs 1.. of training mode: running mean and variance updated with the momentum, then the batch mean and
 * variance (each optional). */
static void bn_running_outputs(krn_call *c, const krn_batchnorm_params *p, const double *mean, const double *var) {
    double mom = p->momentum;
    for (int j = 1; j < c->nout; j++) {
        eng_tensor *o = &c->out[j];
        if (!o->data) continue;
        for (int64_t cc = 0; cc < p->c; cc++) {
            double v;
            if (j == 1) v = eng_tensor_get_f64(&c->in[3], cc) * mom + mean[cc] * (1 - mom);
            else if (j == 2) v = eng_tensor_get_f64(&c->in[4], cc) * mom + var[cc] * (1 - mom);
            else if (j == 3) v = mean[cc];
            else v = var[cc];
            eng_tensor_set_f64(o, cc, v);
        }
    }
}

/* Training mode: batch mean/var per channel (population variance), then normalise with them. float32 input: the
 * channels split over threads, one pass of sums around the channel's first value (float lanes per row folded into
 * double: ew_channel_sums); other dtypes in double. */
static eng_status bn_training(krn_call *c, const krn_batchnorm_params *p, bn_state *st) {
    const eng_tensor *x = &c->in[0];
    int64_t n = p->n, ch = p->c, sp = p->spatial_size;
    if (x->dtype == ENG_DTYPE_F32) {
        double *mv = calloc((size_t)(2 * ch > 0 ? 2 * ch : 1), sizeof(double));
        if (!mv) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "batch statistics for %lld channels", (long long)ch);
        const float *xf = x->data;
        int nt = c->nthreads > 0 ? c->nthreads : 1;
#pragma omp parallel for num_threads(nt) if (n * ch * sp >= 65536 && ch > 1) schedule(static)
        for (int64_t cc = 0; cc < ch; cc++) {
            double s[4];
            float k = n * sp > 0 ? xf[cc * sp] : 0.0f; /* the channel's first value: the sums do not cancel */
            ew_channel_sums(xf, NULL, n, ch, sp, cc, k, s);
            ew_sums_moments(s, (double)(n * sp), k, &mv[cc], &mv[ch + cc]);
        }
        for (int64_t cc = 0; cc < ch; cc++) {
            double a = eng_tensor_get_f64(&c->in[1], cc) / sqrt(mv[ch + cc] + (double)p->epsilon);
            st->a[cc] = a;
            st->b[cc] = eng_tensor_get_f64(&c->in[2], cc) - mv[cc] * a;
        }
        bn_running_outputs(c, p, mv, mv + ch);
        free(mv);
        return ENG_STATUS_OK;
    }
    int xo;
    const void *xw = krn_red_as(x, ENG_DTYPE_F64, &xo);
    if (!xw) return ENG_STATUS_OUT_OF_MEMORY;
    const double *xd = xw;
    double *mean = calloc((size_t)(2 * ch > 0 ? 2 * ch : 1), sizeof(double));
    if (!mean) {
        if (xo) eng_free((void *)xw);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "batch statistics for %lld channels", (long long)ch);
    }
    double *var = mean + ch, cnt = (double)(n * sp);
    for (int64_t cc = 0; cc < ch; cc++) {
        double s = 0, q = 0;
        for (int64_t b = 0; b < n; b++)
            for (int64_t i = 0; i < sp; i++) s += xd[(b * ch + cc) * sp + i];
        double m = cnt > 0 ? s / cnt : 0;
        for (int64_t b = 0; b < n; b++)
            for (int64_t i = 0; i < sp; i++) {
                double d = xd[(b * ch + cc) * sp + i] - m;
                q += d * d;
            }
        mean[cc] = m;
        var[cc] = cnt > 0 ? q / cnt : 0;
        double a = eng_tensor_get_f64(&c->in[1], cc) / sqrt(var[cc] + (double)p->epsilon);
        st->a[cc] = a;
        st->b[cc] = eng_tensor_get_f64(&c->in[2], cc) - m * a;
    }
    if (xo) eng_free((void *)xw);
    bn_running_outputs(c, p, mean, var);
    free(mean);
    return ENG_STATUS_OK;
}

eng_status krn_cpu_batchnorm_exec(krn_call *c) {
    const krn_batchnorm_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    eng_tensor *y = &c->out[0];
    bn_state *st = c->state, *tmp = NULL;
    eng_status rc = ENG_STATUS_OK;
    if (!st) {
        tmp = st = bn_fold(c, p);
        if (!st) return ENG_STATUS_OUT_OF_MEMORY;
    }
    if (p->training) rc = bn_training(c, p, st);
    if (rc == ENG_STATUS_OK && p->n * p->c * p->spatial_size > 0) {
        if (x->dtype == ENG_DTYPE_F32) {
            bn_apply_f32(x->data, y->data, st, p->n, p->c, p->spatial_size, c->nthreads);
        } else if (x->dtype == ENG_DTYPE_F64) {
            bn_apply_f64(x->data, y->data, st, p->n, p->c, p->spatial_size, c->nthreads);
        } else {
            int xo, yo;
            const void *xw = krn_red_as(x, ENG_DTYPE_F32, &xo);
            void *yw = xw ? krn_red_out(y, ENG_DTYPE_F32, &yo) : NULL;
            if (!xw || !yw) rc = ENG_STATUS_OUT_OF_MEMORY;
            else {
                bn_apply_f32(xw, yw, st, p->n, p->c, p->spatial_size, c->nthreads);
                rc = krn_red_out_done(y, yw, ENG_DTYPE_F32, yo, rc);
            }
            if (xw && xo) eng_free((void *)xw);
        }
    }
    krn_cpu_batchnorm_free(tmp);
    return rc;
}

/* ---- InstanceNormalization ---- */

eng_status krn_cpu_instnorm_exec(krn_call *c) {
    const krn_instnorm_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    eng_tensor *y = &c->out[0];
    int64_t n = x->dims[0], ch = x->dims[1], sp = eng_shape_numel(x->dims + 2, x->ndim - 2);
    if (n * ch * sp == 0) return ENG_STATUS_OK;
    int xo, yo;
    const double *xd = krn_red_as(x, ENG_DTYPE_F64, &xo);
    if (!xd) return ENG_STATUS_OUT_OF_MEMORY;
    double *yd = krn_red_out(y, ENG_DTYPE_F64, &yo);
    if (!yd) {
        if (xo) eng_free((void *)xd);
        return ENG_STATUS_OUT_OF_MEMORY;
    }
    int64_t blocks = n * ch;
    int nt = c->nthreads;
#pragma omp parallel for num_threads(nt) if (blocks * sp >= BN_PAR_MIN && blocks > 1) schedule(static)
    for (int64_t blk = 0; blk < blocks; blk++) {
        const double *xr = xd + blk * sp;
        double *yr = yd + blk * sp, s = 0, q = 0;
        for (int64_t i = 0; i < sp; i++) s += xr[i];
        double m = s / (double)sp;
        for (int64_t i = 0; i < sp; i++) q += (xr[i] - m) * (xr[i] - m);
        int64_t cc = blk % ch;
        double a = eng_tensor_get_f64(&c->in[1], cc) / sqrt(q / (double)sp + (double)p->epsilon);
        double b = eng_tensor_get_f64(&c->in[2], cc) - m * a;
        for (int64_t i = 0; i < sp; i++) yr[i] = xr[i] * a + b;
    }
    if (xo) eng_free((void *)xd);
    return krn_red_out_done(y, yd, ENG_DTYPE_F64, yo, ENG_STATUS_OK);
}

/* ---- LRN ---- */

eng_status krn_cpu_lrn_exec(krn_call *c) {
    const krn_lrn_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    eng_tensor *y = &c->out[0];
    int64_t n = x->dims[0], ch = x->dims[1], sp = eng_shape_numel(x->dims + 2, x->ndim - 2);
    if (n * ch * sp == 0) return ENG_STATUS_OK;
    int xo, yo;
    const double *xd = krn_red_as(x, ENG_DTYPE_F64, &xo);
    if (!xd) return ENG_STATUS_OUT_OF_MEMORY;
    double *yd = krn_red_out(y, ENG_DTYPE_F64, &yo);
    if (!yd) {
        if (xo) eng_free((void *)xd);
        return ENG_STATUS_OUT_OF_MEMORY;
    }
    int64_t lo_off = (p->size - 1) / 2, hi_off = p->size - 1 - lo_off;
    double k = (double)p->alpha / (double)p->size;
    int64_t blocks = n * ch;
    int nt = c->nthreads;
#pragma omp parallel for num_threads(nt) if (blocks * sp >= BN_PAR_MIN && blocks > 1) schedule(static)
    for (int64_t blk = 0; blk < blocks; blk++) {
        int64_t b = blk / ch, cc = blk % ch;
        int64_t c0 = cc - lo_off < 0 ? 0 : cc - lo_off, c1 = cc + hi_off >= ch ? ch - 1 : cc + hi_off;
        for (int64_t i = 0; i < sp; i++) {
            double s = 0;
            for (int64_t j = c0; j <= c1; j++) {
                double v = xd[(b * ch + j) * sp + i];
                s += v * v;
            }
            yd[blk * sp + i] = xd[blk * sp + i] / pow((double)p->bias + k * s, (double)p->beta);
        }
    }
    if (xo) eng_free((void *)xd);
    return krn_red_out_done(y, yd, ENG_DTYPE_F64, yo, ENG_STATUS_OK);
}

/* ---- MeanVarianceNormalization ---- */

/* Output-index of each input element for a collapsed reduction shape: walks the odometer. */
static void mvn_pass(const double *x, double *acc, const double *mean, const krn_red_shape *s, int64_t nx, int mode,
                     double *y) {
    int64_t idx[ENG_MAX_DIMS] = {0}, o = 0;
    for (int64_t i = 0; i < nx; i++) {
        if (mode == 0) acc[o] += x[i];
        else if (mode == 1) acc[o] += (x[i] - mean[o]) * (x[i] - mean[o]);
        else y[i] = (x[i] - mean[o]) / (sqrt(acc[o]) + 1e-9);
        for (int d = s->nd - 1; d >= 0; d--) {
            o += s->ostride[d];
            if (++idx[d] < s->n[d]) break;
            o -= s->ostride[d] * s->n[d];
            idx[d] = 0;
        }
    }
}

eng_status krn_cpu_mvn_exec(krn_call *c) {
    const krn_mvn_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    eng_tensor *y = &c->out[0];
    int64_t nx = eng_tensor_numel(x);
    if (nx == 0) return ENG_STATUS_OK;
    krn_red_shape s;
    krn_red_shape_init(&s, x->dims, x->ndim, p->axis_mask);
    int xo, yo;
    const double *xd = krn_red_as(x, ENG_DTYPE_F64, &xo);
    if (!xd) return ENG_STATUS_OUT_OF_MEMORY;
    double *yd = krn_red_out(y, ENG_DTYPE_F64, &yo);
    double *st = yd ? calloc((size_t)s.out_numel * 2, sizeof *st) : NULL;
    eng_status rc = ENG_STATUS_OK;
    if (!st) {
        rc = eng_err(ENG_STATUS_OUT_OF_MEMORY, "MVN statistics for %lld groups", (long long)s.out_numel);
    } else {
        double *mean = st, *var = st + s.out_numel;
        mvn_pass(xd, mean, NULL, &s, nx, 0, NULL);
        for (int64_t i = 0; i < s.out_numel; i++) mean[i] /= (double)s.count;
        mvn_pass(xd, var, mean, &s, nx, 1, NULL);
        for (int64_t i = 0; i < s.out_numel; i++) var[i] /= (double)s.count;
        mvn_pass(xd, var, mean, &s, nx, 2, yd);
        rc = krn_red_out_done(y, yd, ENG_DTYPE_F64, yo, rc);
        yd = NULL;
    }
    free(st);
    if (yd && yo) eng_free(yd);
    if (xo) eng_free((void *)xd);
    return rc;
}
