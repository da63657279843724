/* optim.c - the optimizer family on the CPU: sum of squares, one optimizer step, gradient accumulation over flat
 * float32 buffers (krn-optim.h has the formulas; engine/train/optim.c is the caller).
 *
 * Invariants: the element loops are branch-free float loops the compiler vectorises (the build's -fno-math-errno lets
 * GCC vectorise Adam's sqrtf), written in exactly the operation order of krn-optim.h, which is the order the
 * optimizer's inline loops had before they moved here: results are bit-identical to them. Buffers of at least
 * KRN_OPTIM_PAR_MIN elements are split across c->nthreads OpenMP threads; every element's update is independent, so
 * the update does not depend on the thread count; only the sum of squares (float partials over 4096-element blocks,
 * added in double) may differ in its last bits between thread counts. The update and the accumulation are in place.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../kernel.h"
#include "../krn-optim.h"

#define KRN_OPTIM_PAR_MIN 32768
#define KRN_OPTIM_SS_BLOCK 4096

static int optim_nthreads(const krn_call *c) { return c->nthreads > 1 ? c->nthreads : 1; }

/* A present float32 tensor of n elements. */
static eng_status optim_check_f32(const eng_tensor *t, int64_t n, const char *kernel, const char *what) {
    if (!t->data || t->dtype != ENG_DTYPE_F32)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: %s must be a float32 tensor, got %s%s", kernel, what,
                       eng_dtype_name(t->dtype), t->data ? "" : " with no data");
    int64_t tn = eng_tensor_numel(t);
    if (tn != n)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: %s has %lld elements, expected %lld", kernel, what,
                       (long long)tn, (long long)n);
    return ENG_STATUS_OK;
}

/* ---- optim_sum_squares: in {g}, out {s: float64 scalar} ---- */

static double sum_squares(const float *g, int64_t n, float scale, int nt) {
    double ss = 0;
#pragma omp parallel for num_threads(nt) reduction(+ : ss) if (n >= KRN_OPTIM_PAR_MIN && nt > 1) schedule(static)
    for (int64_t b = 0; b < n; b += KRN_OPTIM_SS_BLOCK) {
        int64_t e = b + KRN_OPTIM_SS_BLOCK < n ? b + KRN_OPTIM_SS_BLOCK : n;
        float acc = 0;
#pragma omp simd reduction(+ : acc)
        for (int64_t i = b; i < e; i++) {
            float x = g[i] * scale;
            acc += x * x;
        }
        ss += acc;
    }
    return ss;
}

static eng_status optim_sum_squares_exec(krn_call *c) {
    const char *k = "optim_sum_squares";
    const krn_optim_sumsq_params *p = c->params;
    if (!p || c->nin != 1 || c->nout != 1)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: expected params, 1 input and 1 output, got %s, %d, %d", k,
                       p ? "params" : "none", c->nin, c->nout);
    int64_t n = eng_tensor_numel(&c->in[0]);
    eng_status st = optim_check_f32(&c->in[0], n, k, "gradient (input 0)");
    if (st != ENG_STATUS_OK) return st;
    if (!c->out[0].data || c->out[0].dtype != ENG_DTYPE_F64 || eng_tensor_numel(&c->out[0]) != 1)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: output must be one float64 element, got %s of %lld", k,
                       eng_dtype_name(c->out[0].dtype), (long long)eng_tensor_numel(&c->out[0]));
    *(double *)c->out[0].data = sum_squares(c->in[0].data, n, p->scale, optim_nthreads(c));
    return ENG_STATUS_OK;
}

/* ---- optim_update: in {w, g, m, v}, out {w, m, v, gz}, in place ---- */

static void sgd_plain(float *restrict w, const float *restrict g, int64_t n, float lr, float gs, float wd, int nt) {
#pragma omp parallel for simd num_threads(nt) if (n >= KRN_OPTIM_PAR_MIN && nt > 1) schedule(static)
    for (int64_t i = 0; i < n; i++) w[i] -= lr * (gs * g[i] + wd * w[i]);
}

static void sgd_momentum(float *restrict w, const float *restrict g, float *restrict v, int64_t n, float lr, float gs,
                         float wd, float mom, int nesterov, int nt) {
    if (nesterov) {
#pragma omp parallel for simd num_threads(nt) if (n >= KRN_OPTIM_PAR_MIN && nt > 1) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            float ge = gs * g[i] + wd * w[i];
            float vi = mom * v[i] - lr * ge;
            v[i] = vi;
            w[i] += mom * vi - lr * ge;
        }
    } else {
#pragma omp parallel for simd num_threads(nt) if (n >= KRN_OPTIM_PAR_MIN && nt > 1) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            float ge = gs * g[i] + wd * w[i];
            float vi = mom * v[i] - lr * ge;
            v[i] = vi;
            w[i] += vi;
        }
    }
}

/* wd: L2 coefficient (Adam), dwd: decoupled factor lr*weight_decay (AdamW). */
static void adam_update(float *restrict w, const float *restrict g, float *restrict m, float *restrict v, int64_t n,
                        float lr, float gs, float wd, float dwd, float b1, float b2, float ibc1, float ibc2, float eps,
                        int nt) {
    float c1 = 1.0f - b1, c2 = 1.0f - b2;
#pragma omp parallel for simd num_threads(nt) if (n >= KRN_OPTIM_PAR_MIN && nt > 1) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float wi = w[i];
        float ge = gs * g[i] + wd * wi;
        wi -= dwd * wi;
        float mi = b1 * m[i] + c1 * ge;
        float vi = b2 * v[i] + c2 * ge * ge;
        m[i] = mi;
        v[i] = vi;
        w[i] = wi - lr * (mi * ibc1) / (sqrtf(vi * ibc2) + eps);
    }
}

/* Checks of optim_update's call, shared with nothing else: counts, dtypes, sizes, the in-place aliasing, and which
 * state buffers the kind needs. */
static eng_status optim_update_check(const krn_call *c, int64_t *n_out) {
    const char *k = "optim_update";
    const krn_optim_params *p = c->params;
    if (!p || c->nin != 4 || c->nout < 3 || c->nout > 4)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: expected params, 4 inputs {w, g, m, v} and 3 or 4 outputs "
                       "{w, m, v[, gz]}, got %s, %d, %d", k, p ? "params" : "none", c->nin, c->nout);
    if (p->kind < KRN_OPTIM_SGD || p->kind > KRN_OPTIM_ADAM)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: unknown kind %d", k, p->kind);
    int64_t n = eng_tensor_numel(&c->in[0]);
    eng_status st = optim_check_f32(&c->in[0], n, k, "weights (input 0)");
    if (st == ENG_STATUS_OK) st = optim_check_f32(&c->in[1], n, k, "gradient (input 1)");
    if (st != ENG_STATUS_OK) return st;
    int need_m = p->kind != KRN_OPTIM_SGD, need_v = p->kind == KRN_OPTIM_ADAM;
    static const char *const in_name[4] = {"weights (input 0)", "gradient (input 1)", "m (input 2)", "v (input 3)"};
    static const char *const out_name[4] = {"weights (output 0)", "m (output 1)", "v (output 2)", "gz (output 3)"};
    static const int out_of[4] = {0, 2, 3, 1}; /* the input each output aliases */
    for (int i = 2; i < 4; i++) {
        int need = i == 2 ? need_m : need_v;
        if (need && (st = optim_check_f32(&c->in[i], n, k, in_name[i])) != ENG_STATUS_OK) return st;
    }
    for (int o = 0; o < c->nout; o++) {
        const eng_tensor *in = &c->in[out_of[o]];
        int used = o == 0 || (o == 1 && need_m) || (o == 2 && need_v) || (o == 3 && c->out[3].data);
        if (!used) continue;
        if ((st = optim_check_f32(&c->out[o], n, k, out_name[o])) != ENG_STATUS_OK) return st;
        if (c->out[o].data != in->data)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: in place only: %s must have the data pointer of %s", k,
                           out_name[o], in_name[out_of[o]]);
    }
    *n_out = n;
    return ENG_STATUS_OK;
}

static eng_status optim_update_exec(krn_call *c) {
    int64_t n = 0;
    eng_status st = optim_update_check(c, &n);
    if (st != ENG_STATUS_OK) return st;
    const krn_optim_params *p = c->params;
    int nt = optim_nthreads(c);
    float *w = c->out[0].data;
    const float *g = c->in[1].data;
    switch ((krn_optim_kind)p->kind) {
    case KRN_OPTIM_SGD: sgd_plain(w, g, n, p->lr, p->gscale, p->weight_decay, nt); break;
    case KRN_OPTIM_MOMENTUM:
    case KRN_OPTIM_NESTEROV:
        sgd_momentum(w, g, c->out[1].data, n, p->lr, p->gscale, p->weight_decay, p->momentum,
                     p->kind == KRN_OPTIM_NESTEROV, nt);
        break;
    case KRN_OPTIM_ADAM:
        adam_update(w, g, c->out[1].data, c->out[2].data, n, p->lr, p->gscale, p->weight_decay, p->decoupled_decay,
                    p->beta1, p->beta2, p->inv_bc1, p->inv_bc2, p->eps, nt);
        break;
    }
    if (c->nout > 3 && c->out[3].data) memset(c->out[3].data, 0, (size_t)n * sizeof(float));
    return ENG_STATUS_OK;
}

/* ---- optim_accumulate: in {a, g}, out {a}, in place ---- */

static eng_status optim_accumulate_exec(krn_call *c) {
    const char *k = "optim_accumulate";
    if (c->nin != 2 || c->nout != 1)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: expected 2 inputs {a, g} and 1 output {a}, got %d, %d", k,
                       c->nin, c->nout);
    int64_t n = eng_tensor_numel(&c->in[0]);
    eng_status st = optim_check_f32(&c->in[0], n, k, "accumulator (input 0)");
    if (st == ENG_STATUS_OK) st = optim_check_f32(&c->in[1], n, k, "gradient (input 1)");
    if (st == ENG_STATUS_OK) st = optim_check_f32(&c->out[0], n, k, "accumulator (output 0)");
    if (st != ENG_STATUS_OK) return st;
    if (c->out[0].data != c->in[0].data)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: in place only: output 0 must have the data pointer of input 0",
                       k);
    float *restrict a = c->out[0].data;
    const float *restrict g = c->in[1].data;
    int nt = optim_nthreads(c);
#pragma omp parallel for simd num_threads(nt) if (n >= KRN_OPTIM_PAR_MIN && nt > 1) schedule(static)
    for (int64_t i = 0; i < n; i++) a[i] += g[i];
    return ENG_STATUS_OK;
}

const krn_kernel krn_cpu_optim_kernels[] = {
    {"optim_sum_squares", NULL, optim_sum_squares_exec, NULL},
    {"optim_update", NULL, optim_update_exec, NULL},
    {"optim_accumulate", NULL, optim_accumulate_exec, NULL},
    {NULL},
};
