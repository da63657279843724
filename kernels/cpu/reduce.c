/* reduce.c - CPU kernel table of the reduce family and the ReduceX kernel.
 *
 * krn_cpu_reduce_kernels lists every kernel of the family; the others live in reduce-arg.c (ArgMax/ArgMin,
 * TopK, CumSum), norm.c (softmax, layer norm), norm-batch.c (batch/instance norm, LRN, MVN) and
 * reduce-loss.c (NLL/SCE losses, Einsum, Det).
 *
 * ReduceX computes in a work type: float for f32/f16/bf16, double for f64, int64 for integer types (double
 * for integer ReduceL2/LogSum/LogSumExp, truncated back). Non-native inputs are converted into a scratch
 * buffer first. The input shape is collapsed (size-1 dims dropped, neighbouring reduced/kept dims merged) so
 * that last-axis and leading-axis reductions both run contiguous inner loops (see reduce-tmpl.h).
 * An empty reduction set yields the identity of the op (0, 1, -inf, +inf; NaN for ReduceMean of floats).
 */
#include <math.h>
#include <stdlib.h>

#include "../kernel.h"
#include "../krn-reduce.h"
#include "reduce-math.h"

enum { RED_COMB_ADD = 0, RED_COMB_MUL, RED_COMB_MAX, RED_COMB_MIN };
enum { RED_XF_ID = 0, RED_XF_ABS, RED_XF_SQ, RED_XF_EXP };

#define RT float
#define RT_SFX f32
#define RT_IS_INT 0
#define RT_EXP(v) krn_red_expf(v)
#include "reduce-tmpl.h"
#undef RT
#undef RT_SFX
#undef RT_IS_INT
#undef RT_EXP

#define RT double
#define RT_SFX f64
#define RT_IS_INT 0
#define RT_EXP(v) exp(v)
#include "reduce-tmpl.h"
#undef RT
#undef RT_SFX
#undef RT_IS_INT
#undef RT_EXP

#define RT int64_t
#define RT_SFX i64
#define RT_IS_INT 1
#include "reduce-tmpl.h"
#undef RT
#undef RT_SFX
#undef RT_IS_INT

/* ---- kernels defined in the family's other files ---- */
eng_status krn_cpu_argreduce_exec(krn_call *c);
eng_status krn_cpu_topk_exec(krn_call *c);
eng_status krn_cpu_cumsum_exec(krn_call *c);
eng_status krn_cpu_softmax_exec(krn_call *c);
eng_status krn_cpu_layernorm_exec(krn_call *c);
int krn_cpu_layernorm_io_ok(const krn_call *c, eng_dtype dt);
eng_status krn_cpu_batchnorm_init(krn_call *c);
eng_status krn_cpu_batchnorm_exec(krn_call *c);
void krn_cpu_batchnorm_free(void *state);
eng_status krn_cpu_instnorm_exec(krn_call *c);
eng_status krn_cpu_lrn_exec(krn_call *c);
eng_status krn_cpu_mvn_exec(krn_call *c);
eng_status krn_cpu_loss_exec(krn_call *c);
eng_status krn_cpu_einsum_init(krn_call *c);
eng_status krn_cpu_einsum_exec(krn_call *c);
void krn_cpu_einsum_free(void *state);
eng_status krn_cpu_det_exec(krn_call *c);

static int reduce_comb(krn_reduce_op op) {
    switch (op) {
    case KRN_REDUCE_MAX: case KRN_REDUCE_LOGSUMEXP: return RED_COMB_MAX;
    case KRN_REDUCE_MIN: return RED_COMB_MIN;
    case KRN_REDUCE_PROD: return RED_COMB_MUL;
    default: return RED_COMB_ADD;
    }
}

static int reduce_xf(krn_reduce_op op) {
    switch (op) {
    case KRN_REDUCE_L1: return RED_XF_ABS;
    case KRN_REDUCE_L2: case KRN_REDUCE_SUMSQUARE: return RED_XF_SQ;
    default: return RED_XF_ID;
    }
}

#define REDUCE_FILL(T, y, n, comb, big)                                                                          \
    do {                                                                                                       \
        T v_ = (comb) == RED_COMB_MUL ? (T)1 : (comb) == RED_COMB_MAX ? -(big) : (comb) == RED_COMB_MIN ? (big) : (T)0; \
        for (int64_t i_ = 0; i_ < (n); i_++) (y)[i_] = v_;                                                     \
    } while (0)

static eng_status reduce_run_f32(const krn_reduce_params *p, const krn_red_shape *s, const float *x, float *y, int nt) {
    int64_t m = s->out_numel;
    int comb = reduce_comb(p->op);
    REDUCE_FILL(float, y, m, comb, INFINITY);
    red_pass_f32(x, y, NULL, s, comb, reduce_xf(p->op), nt);
    if (p->op == KRN_REDUCE_LOGSUMEXP) {
        float *sh = eng_alloc((size_t)(m ? m : 1) * sizeof *sh);
        if (!sh) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "ReduceLogSumExp scratch of %lld floats", (long long)m);
        for (int64_t i = 0; i < m; i++) sh[i] = isfinite(y[i]) ? y[i] : 0.0f, y[i] = 0.0f;
        red_pass_f32(x, y, sh, s, RED_COMB_ADD, RED_XF_EXP, nt);
        for (int64_t i = 0; i < m; i++) y[i] = logf(y[i]) + sh[i];
        eng_free(sh);
        return ENG_STATUS_OK;
    }
    float inv = 1.0f / (float)s->count;
    for (int64_t i = 0; i < m; i++) {
        switch (p->op) {
        case KRN_REDUCE_MEAN: y[i] = s->count ? y[i] * inv : NAN; break;
        case KRN_REDUCE_L2: y[i] = sqrtf(y[i]); break;
        case KRN_REDUCE_LOGSUM: y[i] = logf(y[i]); break;
        default: break;
        }
    }
    return ENG_STATUS_OK;
}

static eng_status reduce_run_f64(const krn_reduce_params *p, const krn_red_shape *s, const double *x, double *y, int nt) {
    int64_t m = s->out_numel;
    int comb = reduce_comb(p->op);
    REDUCE_FILL(double, y, m, comb, INFINITY);
    red_pass_f64(x, y, NULL, s, comb, reduce_xf(p->op), nt);
    if (p->op == KRN_REDUCE_LOGSUMEXP) {
        double *sh = eng_alloc((size_t)(m ? m : 1) * sizeof *sh);
        if (!sh) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "ReduceLogSumExp scratch of %lld doubles", (long long)m);
        for (int64_t i = 0; i < m; i++) sh[i] = isfinite(y[i]) ? y[i] : 0.0, y[i] = 0.0;
        red_pass_f64(x, y, sh, s, RED_COMB_ADD, RED_XF_EXP, nt);
        for (int64_t i = 0; i < m; i++) y[i] = log(y[i]) + sh[i];
        eng_free(sh);
        return ENG_STATUS_OK;
    }
    for (int64_t i = 0; i < m; i++) {
        switch (p->op) {
        case KRN_REDUCE_MEAN: y[i] = s->count ? y[i] / (double)s->count : NAN; break;
        case KRN_REDUCE_L2: y[i] = sqrt(y[i]); break;
        case KRN_REDUCE_LOGSUM: y[i] = log(y[i]); break;
        default: break;
        }
    }
    return ENG_STATUS_OK;
}

static void reduce_run_i64(const krn_reduce_params *p, const krn_red_shape *s, const int64_t *x, int64_t *y, int nt) {
    int64_t m = s->out_numel;
    int comb = reduce_comb(p->op);
    REDUCE_FILL(int64_t, y, m, comb, INT64_MAX);
    if (comb == RED_COMB_MAX)
        for (int64_t i = 0; i < m; i++) y[i] = INT64_MIN;
    red_pass_i64(x, y, NULL, s, comb, reduce_xf(p->op), nt);
    if (p->op == KRN_REDUCE_MEAN)
        for (int64_t i = 0; i < m; i++) y[i] = s->count ? y[i] / s->count : 0;
}

static eng_status reduce_exec(krn_call *c) {
    const krn_reduce_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    eng_tensor *y = &c->out[0];
    krn_red_shape s;
    krn_red_shape_init(&s, x->dims, x->ndim, p->axis_mask);
    eng_dtype wt;
    if (x->dtype == ENG_DTYPE_F64) wt = ENG_DTYPE_F64;
    else if (eng_dtype_is_float(x->dtype)) wt = ENG_DTYPE_F32;
    else if (p->op == KRN_REDUCE_L2 || p->op == KRN_REDUCE_LOGSUM || p->op == KRN_REDUCE_LOGSUMEXP) wt = ENG_DTYPE_F64;
    else wt = ENG_DTYPE_I64;
    int64_t nx = eng_tensor_numel(x), ny = eng_tensor_numel(y);
    void *xw = x->data, *yw = y->data;
    eng_status st = ENG_STATUS_OK;
    if (x->dtype != wt) {
        xw = eng_alloc((size_t)(nx ? nx : 1) * 8);
        if (!xw) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "reduce scratch for %lld elements", (long long)nx);
        st = eng_convert(x->data, x->dtype, xw, wt, nx);
    }
    if (st == ENG_STATUS_OK && y->dtype != wt) {
        yw = eng_alloc((size_t)(ny ? ny : 1) * 8);
        if (!yw) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "reduce scratch for %lld outputs", (long long)ny);
    }
    if (st == ENG_STATUS_OK) {
        if (wt == ENG_DTYPE_F32) st = reduce_run_f32(p, &s, xw, yw, c->nthreads);
        else if (wt == ENG_DTYPE_F64) st = reduce_run_f64(p, &s, xw, yw, c->nthreads);
        else reduce_run_i64(p, &s, xw, yw, c->nthreads);
    }
    if (st == ENG_STATUS_OK && yw != y->data) st = eng_convert(yw, wt, y->data, y->dtype, ny);
    if (xw != x->data) eng_free(xw);
    if (yw != y->data) eng_free(yw);
    return st;
}

const krn_kernel krn_cpu_reduce_kernels[] = {
    {"reduce", NULL, reduce_exec, NULL},
    {"argreduce", NULL, krn_cpu_argreduce_exec, NULL},
    {"topk", NULL, krn_cpu_topk_exec, NULL},
    {"cumsum", NULL, krn_cpu_cumsum_exec, NULL},
    {"softmax", NULL, krn_cpu_softmax_exec, NULL},
    {"layernorm", NULL, krn_cpu_layernorm_exec, NULL, NULL, NULL, krn_cpu_layernorm_io_ok},
    {"batchnorm", krn_cpu_batchnorm_init, krn_cpu_batchnorm_exec, krn_cpu_batchnorm_free},
    {"instnorm", NULL, krn_cpu_instnorm_exec, NULL},
    {"lrn", NULL, krn_cpu_lrn_exec, NULL},
    {"mvn", NULL, krn_cpu_mvn_exec, NULL},
    {"loss", NULL, krn_cpu_loss_exec, NULL},
    {"einsum", krn_cpu_einsum_init, krn_cpu_einsum_exec, krn_cpu_einsum_free},
    {"det", NULL, krn_cpu_det_exec, NULL},
    {NULL},
};
