/* test_optim.c - optimizers, schedules, global clipping and gradient accumulation against a straightforward
 * double-precision reference run for several steps on pseudo-random gradients; checkpoint state round trip
 * (a restored optimizer continues bit-identically) and its size/kind/version checks. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/train/optim.h"

#define MAXP 3

/* ---- deterministic data ---- */
static uint64_t rng_state;
static double urand(void) { /* [-1, 1) */
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(rng_state >> 11) / (double)(1ULL << 53) * 2.0 - 1.0;
}

/* ---- the reference: one straightforward double loop per update, written from optim.h ---- */
typedef struct ref_optim {
    eng_optim_opts o;
    int np;
    int64_t n[MAXP];
    double *w[MAXP], *m[MAXP], *v[MAXP], *acc[MAXP];
    int64_t step, nacc;
} ref_optim;

static double ref_lr(const eng_optim_opts *o, int64_t s) {
    if (s < o->warmup_steps) return o->lr * (double)s / (double)o->warmup_steps;
    int64_t t = s - o->warmup_steps;
    if (o->schedule == ENG_LR_STEP) return o->lr * pow(o->gamma, (double)(t / o->step_size));
    if (o->schedule == ENG_LR_COSINE) {
        double f = (double)(t < o->decay_steps ? t : o->decay_steps) / (double)o->decay_steps;
        return o->min_lr + (o->lr - o->min_lr) * 0.5 * (1 + cos(M_PI * f));
    }
    return o->lr;
}

static void ref_init(ref_optim *r, const eng_optim_opts *o, int np, const int64_t *n, float *const *w0) {
    memset(r, 0, sizeof *r);
    r->o = *o;
    if (r->o.lr == 0) r->o.lr = o->kind == ENG_OPTIM_SGD ? 0.01f : 0.001f;
    if (r->o.beta1 == 0) r->o.beta1 = 0.9f;
    if (r->o.beta2 == 0) r->o.beta2 = 0.999f;
    if (r->o.eps == 0) r->o.eps = 1e-7f;
    if (r->o.accum_steps < 1) r->o.accum_steps = 1;
    r->np = np;
    for (int p = 0; p < np; p++) {
        r->n[p] = n[p];
        r->w[p] = calloc((size_t)n[p], sizeof(double));
        r->m[p] = calloc((size_t)n[p], sizeof(double));
        r->v[p] = calloc((size_t)n[p], sizeof(double));
        r->acc[p] = calloc((size_t)n[p], sizeof(double));
        for (int64_t i = 0; i < n[p]; i++) r->w[p][i] = w0[p][i];
    }
}

static void ref_free(ref_optim *r) {
    for (int p = 0; p < r->np; p++) free(r->w[p]), free(r->m[p]), free(r->v[p]), free(r->acc[p]);
}

static int ref_apply(ref_optim *r, float *const *g) {
    const eng_optim_opts *o = &r->o;
    for (int p = 0; p < r->np; p++)
        for (int64_t i = 0; i < r->n[p]; i++) r->acc[p][i] += g[p][i];
    if (++r->nacc < o->accum_steps) return 0;
    double ss = 0;
    for (int p = 0; p < r->np; p++)
        for (int64_t i = 0; i < r->n[p]; i++) {
            r->acc[p][i] /= o->accum_steps;
            ss += r->acc[p][i] * r->acc[p][i];
        }
    double norm = sqrt(ss), scale = o->clipnorm > 0 && norm > o->clipnorm ? o->clipnorm / norm : 1.0;
    double lr = ref_lr(o, r->step);
    double t = (double)(r->step + 1);
    double b1 = o->beta1, b2 = o->beta2;
    for (int p = 0; p < r->np; p++)
        for (int64_t i = 0; i < r->n[p]; i++) {
            double *w = &r->w[p][i], *m = &r->m[p][i], *v = &r->v[p][i];
            double gi = r->acc[p][i] * scale;
            if (o->kind != ENG_OPTIM_ADAMW) gi += o->weight_decay * *w;
            if (o->kind == ENG_OPTIM_SGD) {
                if (o->momentum > 0) {
                    *m = o->momentum * *m - lr * gi;
                    *w += o->nesterov ? o->momentum * *m - lr * gi : *m;
                } else {
                    *w -= lr * gi;
                }
            } else {
                if (o->kind == ENG_OPTIM_ADAMW) *w -= lr * o->weight_decay * *w;
                *m = b1 * *m + (1 - b1) * gi;
                *v = b2 * *v + (1 - b2) * gi * gi;
                double mh = *m / (1 - pow(b1, t)), vh = *v / (1 - pow(b2, t));
                *w -= lr * mh / (sqrt(vh) + o->eps);
            }
            r->acc[p][i] = 0;
        }
    r->nacc = 0;
    r->step++;
    return 1;
}

/* ---- the harness: same initial weights and gradients into both, compare after every step ---- */
typedef struct run {
    int np;
    int64_t n[MAXP];
    float *w[MAXP], *g[MAXP];
} run;

static void run_init(run *r, int np, const int64_t *n, uint64_t seed) {
    rng_state = seed;
    r->np = np;
    for (int p = 0; p < np; p++) {
        r->n[p] = n[p];
        r->w[p] = malloc((size_t)n[p] * sizeof(float));
        r->g[p] = malloc((size_t)n[p] * sizeof(float));
        for (int64_t i = 0; i < n[p]; i++) r->w[p][i] = (float)urand();
    }
}

static void run_grads(run *r, double gscale) {
    for (int p = 0; p < r->np; p++)
        for (int64_t i = 0; i < r->n[p]; i++) r->g[p][i] = (float)(gscale * urand());
}

static void run_free(run *r) {
    for (int p = 0; p < r->np; p++) free(r->w[p]), free(r->g[p]);
}

/* max |a-b| / max |b| over all parameters */
static double rel_err(const run *r, const ref_optim *ref) {
    double num = 0, den = 0;
    for (int p = 0; p < r->np; p++)
        for (int64_t i = 0; i < r->n[p]; i++) {
            num = fmax(num, fabs(r->w[p][i] - ref->w[p][i]));
            den = fmax(den, fabs(ref->w[p][i]));
        }
    return num / den;
}

static void check_against_ref(const eng_optim_opts *opts, int steps, double gscale, double tol) {
    const int64_t n[MAXP] = {7, 130, 33};
    run r;
    run_init(&r, 3, n, 1234);
    ref_optim ref;
    ref_init(&ref, opts, 3, n, r.w);
    eng_optim *o = NULL;
    cr_assert_eq(eng_optim_new(opts, 3, n, &o), ENG_STATUS_OK, "%s", eng_last_error());
    int accum = opts->accum_steps > 1 ? opts->accum_steps : 1;
    for (int s = 0; s < steps * accum; s++) {
        run_grads(&r, gscale);
        float lr_before = eng_optim_lr(o);
        cr_assert_float_eq(lr_before, ref_lr(&ref.o, ref.step), 1e-7 + 1e-6 * fabs(lr_before), "lr at call %d", s);
        int applied = -1;
        cr_assert_eq(eng_optim_apply(o, r.w, (const float *const *)r.g, &applied), ENG_STATUS_OK, "%s", eng_last_error());
        int ref_applied = ref_apply(&ref, r.g);
        cr_assert_eq(applied, ref_applied, "call %d: applied %d, reference %d", s, applied, ref_applied);
        cr_assert_eq(eng_optim_step_count(o), ref.step);
        double e = rel_err(&r, &ref);
        cr_assert_lt(e, tol, "call %d: relative error %.3g >= %.3g", s, e, tol);
    }
    eng_optim_free(&o);
    cr_assert_null(o);
    ref_free(&ref);
    run_free(&r);
}

Test(optim, sgd_plain) { check_against_ref(&(eng_optim_opts){.kind = ENG_OPTIM_SGD, .lr = 0.1f}, 6, 1.0, 1e-6); }
Test(optim, sgd_default_lr) { check_against_ref(&(eng_optim_opts){.kind = ENG_OPTIM_SGD}, 4, 1.0, 1e-6); }
Test(optim, sgd_momentum) {
    check_against_ref(&(eng_optim_opts){.kind = ENG_OPTIM_SGD, .lr = 0.05f, .momentum = 0.9f}, 8, 1.0, 1e-6);
}
Test(optim, sgd_nesterov_l2) {
    check_against_ref(&(eng_optim_opts){.kind = ENG_OPTIM_SGD, .lr = 0.05f, .momentum = 0.8f, .nesterov = 1,
                                        .weight_decay = 0.01f},
                      8, 1.0, 1e-6);
}
Test(optim, adam_defaults) { check_against_ref(&(eng_optim_opts){.kind = ENG_OPTIM_ADAM}, 8, 1.0, 1e-6); }
Test(optim, adam_small_grads_eps) {
    /* gradients near eps make the 1e-7 epsilon matter */
    check_against_ref(&(eng_optim_opts){.kind = ENG_OPTIM_ADAM, .lr = 0.01f}, 6, 1e-6, 1e-6);
}
Test(optim, adam_l2_custom_betas) {
    check_against_ref(&(eng_optim_opts){.kind = ENG_OPTIM_ADAM, .lr = 0.01f, .beta1 = 0.8f, .beta2 = 0.99f,
                                        .eps = 1e-5f, .weight_decay = 0.05f},
                      8, 1.0, 1e-6);
}
Test(optim, adamw_decoupled) {
    check_against_ref(&(eng_optim_opts){.kind = ENG_OPTIM_ADAMW, .lr = 0.01f, .weight_decay = 0.1f}, 8, 1.0, 1e-6);
}
Test(optim, clipnorm_global) {
    /* grads of norm ~ sqrt(170/3)*10 >> 1: every step is clipped */
    check_against_ref(&(eng_optim_opts){.kind = ENG_OPTIM_SGD, .lr = 0.1f, .momentum = 0.9f, .clipnorm = 1.0f}, 6, 10.0,
                      1e-6);
    check_against_ref(&(eng_optim_opts){.kind = ENG_OPTIM_ADAM, .lr = 0.01f, .clipnorm = 0.5f}, 6, 10.0, 1e-6);
}
Test(optim, clipnorm_inactive_below) {
    check_against_ref(&(eng_optim_opts){.kind = ENG_OPTIM_SGD, .lr = 0.1f, .clipnorm = 1e6f}, 4, 1.0, 1e-6);
}
Test(optim, accumulation_averages) {
    check_against_ref(&(eng_optim_opts){.kind = ENG_OPTIM_SGD, .lr = 0.1f, .momentum = 0.9f, .accum_steps = 3}, 4, 1.0,
                      1e-6);
    check_against_ref(&(eng_optim_opts){.kind = ENG_OPTIM_ADAMW, .lr = 0.01f, .weight_decay = 0.01f, .accum_steps = 2,
                                        .clipnorm = 2.0f},
                      5, 3.0, 1e-6);
}
Test(optim, schedule_step_with_warmup) {
    check_against_ref(&(eng_optim_opts){.kind = ENG_OPTIM_SGD, .lr = 0.1f, .momentum = 0.5f, .schedule = ENG_LR_STEP,
                                        .step_size = 2, .gamma = 0.5f, .warmup_steps = 3},
                      10, 1.0, 1e-6);
}
Test(optim, schedule_cosine_with_warmup) {
    check_against_ref(&(eng_optim_opts){.kind = ENG_OPTIM_ADAM, .lr = 0.01f, .schedule = ENG_LR_COSINE,
                                        .decay_steps = 5, .min_lr = 0.001f, .warmup_steps = 2},
                      10, 1.0, 1e-6);
}

Test(optim, lr_values) {
    eng_optim *o = NULL;
    int64_t n = 1;
    float w = 0, g = 0;
    float *wp = &w;
    const float *gp = &g;
    eng_optim_opts opts = {.kind = ENG_OPTIM_SGD, .lr = 1.0f, .schedule = ENG_LR_COSINE, .decay_steps = 4,
                           .warmup_steps = 2};
    cr_assert_eq(eng_optim_new(&opts, 1, &n, &o), ENG_STATUS_OK, "%s", eng_last_error());
    const double want[] = {0, 0.5, 1, 0.5 * (1 + cos(M_PI / 4)), 0.5, 0.5 * (1 + cos(3 * M_PI / 4)), 0, 0};
    for (int s = 0; s < 8; s++) {
        cr_assert_float_eq(eng_optim_lr(o), want[s], 1e-6, "step %d: lr %g, want %g", s, eng_optim_lr(o), want[s]);
        cr_assert_eq(eng_optim_apply(o, &wp, &gp, NULL), ENG_STATUS_OK);
    }
    eng_optim_free(&o);
}

Test(optim, grad_norm_logged_before_clip) {
    eng_optim *o = NULL;
    int64_t n[2] = {1, 2};
    float w0[1] = {0}, w1[2] = {0, 0}, g0[1] = {3}, g1[2] = {0, 4};
    float *w[2] = {w0, w1};
    const float *g[2] = {g0, g1};
    eng_optim_opts opts = {.kind = ENG_OPTIM_SGD, .lr = 1.0f, .clipnorm = 1.0f};
    cr_assert_eq(eng_optim_new(&opts, 2, n, &o), ENG_STATUS_OK);
    cr_assert_eq(eng_optim_apply(o, w, g, NULL), ENG_STATUS_OK);
    cr_assert_float_eq(eng_optim_last_grad_norm(o), 5.0f, 1e-6);
    cr_assert_float_eq(w0[0], -0.6f, 1e-6);
    cr_assert_float_eq(w1[1], -0.8f, 1e-6);
    eng_optim_free(&o);
}

Test(optim, large_params_openmp) {
    /* above the OpenMP threshold; same answer as the reference */
    const int64_t n[1] = {200003};
    run r;
    run_init(&r, 1, n, 99);
    eng_optim_opts opts = {.kind = ENG_OPTIM_ADAM, .lr = 0.01f, .clipnorm = 100.0f};
    ref_optim ref;
    ref_init(&ref, &opts, 1, n, r.w);
    eng_optim *o = NULL;
    cr_assert_eq(eng_optim_new(&opts, 1, n, &o), ENG_STATUS_OK);
    for (int s = 0; s < 3; s++) {
        run_grads(&r, 1.0);
        cr_assert_eq(eng_optim_apply(o, r.w, (const float *const *)r.g, NULL), ENG_STATUS_OK);
        ref_apply(&ref, r.g);
    }
    cr_assert_lt(rel_err(&r, &ref), 1e-6);
    double ss = 0;
    for (int64_t i = 0; i < n[0]; i++) ss += (double)r.g[0][i] * r.g[0][i];
    /* ~258 > clipnorm: the clipped path ran, and the logged norm is the unclipped one */
    cr_assert_float_eq(eng_optim_last_grad_norm(o), sqrt(ss), 1e-4 * sqrt(ss), "norm %g", eng_optim_last_grad_norm(o));
    cr_assert_gt(sqrt(ss), 100.0);
    eng_optim_free(&o);
    ref_free(&ref);
    run_free(&r);
}

/* Run `first` calls, save, restore into a fresh optimizer, run `second` more on both: identical bits. */
static void roundtrip(const eng_optim_opts *opts, int first, int second) {
    const int64_t n[2] = {5, 64};
    run a, b;
    run_init(&a, 2, n, 7);
    run_init(&b, 2, n, 7);
    eng_optim *oa = NULL, *ob = NULL;
    cr_assert_eq(eng_optim_new(opts, 2, n, &oa), ENG_STATUS_OK);
    cr_assert_eq(eng_optim_new(opts, 2, n, &ob), ENG_STATUS_OK);
    uint64_t gseed = 555;
    for (int s = 0; s < first; s++) {
        rng_state = gseed++;
        run_grads(&a, 1.0);
        cr_assert_eq(eng_optim_apply(oa, a.w, (const float *const *)a.g, NULL), ENG_STATUS_OK);
    }
    size_t len = eng_optim_state_size(oa);
    cr_assert_eq(len, eng_optim_state_size(ob));
    void *buf = malloc(len);
    cr_assert_eq(eng_optim_state_save(oa, buf, len), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(eng_optim_state_load(ob, buf, len), ENG_STATUS_OK, "%s", eng_last_error());
    for (int p = 0; p < 2; p++) memcpy(b.w[p], a.w[p], (size_t)n[p] * sizeof(float));
    cr_assert_eq(eng_optim_step_count(ob), eng_optim_step_count(oa));
    cr_assert_eq(eng_optim_lr(ob), eng_optim_lr(oa));
    for (int s = 0; s < second; s++) {
        rng_state = gseed++;
        run_grads(&a, 1.0);
        for (int p = 0; p < 2; p++) memcpy(b.g[p], a.g[p], (size_t)n[p] * sizeof(float));
        int aa = -1, ab = -2;
        cr_assert_eq(eng_optim_apply(oa, a.w, (const float *const *)a.g, &aa), ENG_STATUS_OK);
        cr_assert_eq(eng_optim_apply(ob, b.w, (const float *const *)b.g, &ab), ENG_STATUS_OK);
        cr_assert_eq(aa, ab);
    }
    for (int p = 0; p < 2; p++)
        cr_assert_eq(memcmp(a.w[p], b.w[p], (size_t)n[p] * sizeof(float)), 0, "param %d differs after restore", p);
    free(buf);
    eng_optim_free(&oa);
    eng_optim_free(&ob);
    run_free(&a);
    run_free(&b);
}

Test(optim, state_roundtrip_adam) { roundtrip(&(eng_optim_opts){.kind = ENG_OPTIM_ADAM, .lr = 0.01f}, 3, 4); }
Test(optim, state_roundtrip_sgd_momentum) {
    roundtrip(&(eng_optim_opts){.kind = ENG_OPTIM_SGD, .lr = 0.1f, .momentum = 0.9f, .nesterov = 1}, 3, 4);
}
Test(optim, state_roundtrip_mid_accumulation) {
    /* 4 calls with accum 3: saved with one gradient pending in the accumulators */
    roundtrip(&(eng_optim_opts){.kind = ENG_OPTIM_ADAMW, .lr = 0.01f, .weight_decay = 0.01f, .accum_steps = 3,
                                .schedule = ENG_LR_COSINE, .decay_steps = 10, .warmup_steps = 1},
              4, 5);
}

Test(optim, state_load_rejects_mismatch) {
    const int64_t n[2] = {5, 64}, n2[2] = {5, 65};
    eng_optim *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    eng_optim_opts adam = {.kind = ENG_OPTIM_ADAM}, adamw = {.kind = ENG_OPTIM_ADAMW};
    cr_assert_eq(eng_optim_new(&adam, 2, n, &a), ENG_STATUS_OK);
    cr_assert_eq(eng_optim_new(&adam, 2, n2, &b), ENG_STATUS_OK);
    cr_assert_eq(eng_optim_new(&adamw, 2, n, &c), ENG_STATUS_OK);
    cr_assert_eq(eng_optim_new(&adam, 1, n, &d), ENG_STATUS_OK);
    size_t len = eng_optim_state_size(a);
    char *buf = malloc(len + 4);
    cr_assert_eq(eng_optim_state_save(a, buf, len - 1), ENG_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(eng_optim_state_save(a, buf, len), ENG_STATUS_OK);
    cr_assert_neq(eng_optim_state_load(b, buf, len), ENG_STATUS_OK);
    cr_assert(strstr(eng_last_error(), "65") || strstr(eng_last_error(), "bytes"), "%s", eng_last_error());
    cr_assert_neq(eng_optim_state_load(c, buf, len), ENG_STATUS_OK);
    cr_assert(strstr(eng_last_error(), "adam"), "%s", eng_last_error());
    cr_assert_neq(eng_optim_state_load(d, buf, len), ENG_STATUS_OK);
    cr_assert_neq(eng_optim_state_load(a, buf, len - 4), ENG_STATUS_OK);
    cr_assert_neq(eng_optim_state_load(a, buf, 10), ENG_STATUS_OK);
    buf[8] ^= 0x7f; /* version */
    cr_assert_eq(eng_optim_state_load(a, buf, len), ENG_STATUS_UNSUPPORTED, "%s", eng_last_error());
    buf[8] ^= 0x7f;
    buf[0] = 'X';
    cr_assert_neq(eng_optim_state_load(a, buf, len), ENG_STATUS_OK);
    cr_assert(strstr(eng_last_error(), "magic"), "%s", eng_last_error());
    free(buf);
    eng_optim_free(&a);
    eng_optim_free(&b);
    eng_optim_free(&c);
    eng_optim_free(&d);
}

Test(optim, parse_and_bad_options) {
    cr_assert_eq(eng_optim_parse("sgd"), ENG_OPTIM_SGD);
    cr_assert_eq(eng_optim_parse("adam"), ENG_OPTIM_ADAM);
    cr_assert_eq(eng_optim_parse("adamw"), ENG_OPTIM_ADAMW);
    cr_assert_eq(eng_optim_parse("rmsprop"), -1);
    eng_optim *o = NULL;
    int64_t n = 4;
    cr_assert_eq(eng_optim_new(&(eng_optim_opts){.kind = ENG_OPTIM_SGD, .lr = -1}, 1, &n, &o), ENG_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(eng_optim_new(&(eng_optim_opts){.kind = ENG_OPTIM_SGD, .momentum = 1.5f}, 1, &n, &o),
                 ENG_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(eng_optim_new(&(eng_optim_opts){.kind = ENG_OPTIM_SGD, .schedule = ENG_LR_STEP}, 1, &n, &o),
                 ENG_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(eng_last_error(), "step_size"), "%s", eng_last_error());
    cr_assert_eq(eng_optim_new(&(eng_optim_opts){.kind = ENG_OPTIM_ADAM, .schedule = ENG_LR_COSINE}, 1, &n, &o),
                 ENG_STATUS_INVALID_ARGUMENT);
    cr_assert_null(o);
    /* zero parameters is fine (a frozen model) */
    cr_assert_eq(eng_optim_new(&(eng_optim_opts){.kind = ENG_OPTIM_ADAM}, 0, NULL, &o), ENG_STATUS_OK);
    int applied = 0;
    cr_assert_eq(eng_optim_apply(o, NULL, NULL, &applied), ENG_STATUS_OK);
    cr_assert_eq(applied, 1);
    eng_optim_free(&o);
}

/* ---- the optim kernels directly, against the loops optim.c had before they became kernels (bit-identical) ---- */
#include "kernels/backend-impl.h"
#include "kernels/krn-optim.h"

static void old_sgd_plain(float *w, const float *g, int64_t n, float lr, float gs, float wd) {
    for (int64_t i = 0; i < n; i++) w[i] -= lr * (gs * g[i] + wd * w[i]);
}
static void old_sgd_momentum(float *w, const float *g, float *v, int64_t n, float lr, float gs, float wd, float mom,
                             int nesterov) {
    for (int64_t i = 0; i < n; i++) {
        float ge = gs * g[i] + wd * w[i];
        float vi = mom * v[i] - lr * ge;
        v[i] = vi;
        if (nesterov) w[i] += mom * vi - lr * ge;
        else w[i] += vi;
    }
}
static void old_adam(float *w, const float *g, float *m, float *v, int64_t n, float lr, float gs, float wd, float dwd,
                     float b1, float b2, float ibc1, float ibc2, float eps) {
    float c1 = 1.0f - b1, c2 = 1.0f - b2;
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
static double old_sum_squares(const float *g, int64_t n, float scale) {
    double ss = 0;
    for (int64_t b = 0; b < n; b += 4096) {
        int64_t e = b + 4096 < n ? b + 4096 : n;
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

static eng_tensor vec_f32(void *data, int64_t n) {
    return (eng_tensor){.dtype = data ? ENG_DTYPE_F32 : ENG_DTYPE_UNDEFINED, .ndim = 1, .dims = {n}, .data = data};
}

static float *rand_buf(int64_t n, double lo, double hi) {
    float *p = malloc((size_t)(n ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = (float)(lo + (hi - lo) * (urand() + 1) / 2);
    return p;
}

static void check_update_kernel(krn_optim_params prm, int64_t n, int nthreads, int zero_grad) {
    const krn_kernel *k = krn_backend_find(krn_backend_cpu(), "optim_update");
    cr_assert_not_null(k);
    rng_state = 77 + (uint64_t)n;
    float *w = rand_buf(n, -1, 1), *g = rand_buf(n, -1, 1), *m = rand_buf(n, -0.1, 0.1), *v = rand_buf(n, 0, 0.01);
    float *w0 = malloc((size_t)n * 4), *m0 = malloc((size_t)n * 4), *v0 = malloc((size_t)n * 4);
    memcpy(w0, w, (size_t)n * 4), memcpy(m0, m, (size_t)n * 4), memcpy(v0, v, (size_t)n * 4);
    int use_m = prm.kind != KRN_OPTIM_SGD, use_v = prm.kind == KRN_OPTIM_ADAM;
    eng_tensor in[4] = {vec_f32(w, n), vec_f32(g, n), vec_f32(use_m ? m : NULL, n), vec_f32(use_v ? v : NULL, n)};
    eng_tensor out[4] = {in[0], in[2], in[3], vec_f32(zero_grad ? g : NULL, n)};
    krn_call c = {.params = &prm, .in = in, .nin = 4, .out = out, .nout = 4, .nthreads = nthreads};
    float *gref = malloc((size_t)n * 4);
    memcpy(gref, g, (size_t)n * 4);
    switch (prm.kind) {
    case KRN_OPTIM_SGD: old_sgd_plain(w0, gref, n, prm.lr, prm.gscale, prm.weight_decay); break;
    case KRN_OPTIM_MOMENTUM:
    case KRN_OPTIM_NESTEROV:
        old_sgd_momentum(w0, gref, m0, n, prm.lr, prm.gscale, prm.weight_decay, prm.momentum,
                         prm.kind == KRN_OPTIM_NESTEROV);
        break;
    default:
        old_adam(w0, gref, m0, v0, n, prm.lr, prm.gscale, prm.weight_decay, prm.decoupled_decay, prm.beta1, prm.beta2,
                 prm.inv_bc1, prm.inv_bc2, prm.eps);
    }
    cr_assert_eq(k->exec(&c), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(memcmp(w, w0, (size_t)n * 4), 0, "kind %d n %lld: weights differ from the former loop", prm.kind,
                 (long long)n);
    cr_assert_eq(memcmp(m, m0, (size_t)n * 4), 0, "kind %d n %lld: m differs", prm.kind, (long long)n);
    cr_assert_eq(memcmp(v, v0, (size_t)n * 4), 0, "kind %d n %lld: v differs", prm.kind, (long long)n);
    for (int64_t i = 0; i < n; i++)
        cr_assert(zero_grad ? g[i] == 0 : g[i] == gref[i], "g[%lld] %s", (long long)i, zero_grad ? "not zeroed" : "changed");
    free(w), free(g), free(m), free(v), free(w0), free(m0), free(v0), free(gref);
}

Test(optim_kernels, update_matches_former_loops) {
    const int64_t sizes[] = {1, 7, 33, 4099, 40001};
    const krn_optim_params cases[] = {
        {.kind = KRN_OPTIM_SGD, .lr = 0.1f, .gscale = 0.37f, .weight_decay = 0.01f},
        {.kind = KRN_OPTIM_MOMENTUM, .lr = 0.05f, .gscale = 1.0f, .weight_decay = 0.001f, .momentum = 0.9f},
        {.kind = KRN_OPTIM_NESTEROV, .lr = 0.05f, .gscale = 0.5f, .weight_decay = 0.01f, .momentum = 0.8f},
        /* Adam with L2, and AdamW (decoupled) */
        {.kind = KRN_OPTIM_ADAM, .lr = 0.01f, .gscale = 0.9f, .weight_decay = 0.05f, .beta1 = 0.8f, .beta2 = 0.99f,
         .inv_bc1 = 1 / (1 - 0.8f * 0.8f), .inv_bc2 = 1 / (1 - 0.99f * 0.99f), .eps = 1e-5f},
        {.kind = KRN_OPTIM_ADAM, .lr = 0.001f, .gscale = 1.0f, .decoupled_decay = 0.001f * 0.1f, .beta1 = 0.9f,
         .beta2 = 0.999f, .inv_bc1 = 10.0f, .inv_bc2 = 1000.0f, .eps = 1e-7f},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
            for (int zero = 0; zero < 2; zero++) check_update_kernel(cases[ci], sizes[si], si == 4 ? 3 : 1, zero);
}

Test(optim_kernels, sum_squares_and_accumulate) {
    const krn_kernel *ss = krn_backend_find(krn_backend_cpu(), "optim_sum_squares");
    const krn_kernel *ac = krn_backend_find(krn_backend_cpu(), "optim_accumulate");
    cr_assert(ss && ac);
    const int64_t sizes[] = {0, 5, 4096, 4097, 100003};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int64_t n = sizes[si];
        rng_state = 5 + (uint64_t)n;
        float *g = rand_buf(n, -2, 2), *a = rand_buf(n, -1, 1);
        double s = -1;
        krn_optim_sumsq_params sp = {.scale = 0.3f};
        eng_tensor in[1] = {vec_f32(g, n)};
        eng_tensor out = {.dtype = ENG_DTYPE_F64, .ndim = 0, .data = &s};
        krn_call c = {.params = &sp, .in = in, .nin = 1, .out = &out, .nout = 1, .nthreads = 1};
        cr_assert_eq(ss->exec(&c), ENG_STATUS_OK, "%s", eng_last_error());
        double want = old_sum_squares(g, n, sp.scale);
        cr_assert(s == want, "n %lld: %.17g, the former loop %.17g", (long long)n, s, want);
        c.nthreads = 4; /* threads change only the order the float64 block sums are added in */
        cr_assert_eq(ss->exec(&c), ENG_STATUS_OK);
        cr_assert_float_eq(s, want, 1e-12 * (want + 1));
        /* accumulate: a += g in place */
        float *a0 = malloc((size_t)(n ? n : 1) * 4);
        memcpy(a0, a, (size_t)n * 4);
        eng_tensor ain[2] = {vec_f32(a, n), vec_f32(g, n)};
        eng_tensor aout[1] = {ain[0]};
        krn_call ca = {.in = ain, .nin = 2, .out = aout, .nout = 1, .nthreads = 2};
        cr_assert_eq(ac->exec(&ca), ENG_STATUS_OK, "%s", eng_last_error());
        for (int64_t i = 0; i < n; i++) cr_assert(a[i] == a0[i] + g[i], "a[%lld]", (long long)i);
        free(g), free(a), free(a0);
    }
}

Test(optim_kernels, refuses_bad_calls) {
    const krn_kernel *k = krn_backend_find(krn_backend_cpu(), "optim_update");
    float w[4] = {0}, g[4] = {0}, m[4] = {0}, other[4] = {0};
    krn_optim_params prm = {.kind = KRN_OPTIM_MOMENTUM, .lr = 0.1f, .gscale = 1, .momentum = 0.5f};
    eng_tensor in[4] = {vec_f32(w, 4), vec_f32(g, 4), vec_f32(m, 4), vec_f32(NULL, 4)};
    eng_tensor out[3] = {vec_f32(other, 4), in[2], in[3]};
    krn_call c = {.params = &prm, .in = in, .nin = 4, .out = out, .nout = 3, .nthreads = 1};
    cr_assert_eq(k->exec(&c), ENG_STATUS_INVALID_ARGUMENT); /* not in place */
    cr_assert(strstr(eng_last_error(), "in place"), "%s", eng_last_error());
    out[0] = in[0];
    in[2] = vec_f32(NULL, 4), out[1] = in[2]; /* momentum without m */
    cr_assert_eq(k->exec(&c), ENG_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(eng_last_error(), "m (input 2)"), "%s", eng_last_error());
    in[2] = vec_f32(m, 3), out[1] = in[2]; /* wrong size */
    cr_assert_eq(k->exec(&c), ENG_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(eng_last_error(), "3 elements"), "%s", eng_last_error());
    prm.kind = 9;
    cr_assert_eq(k->exec(&c), ENG_STATUS_INVALID_ARGUMENT);
}

/* ---- eng_optim_apply_on ---- */

/* Runs `calls` steps of opts on two optimizers fed the same gradients, one through eng_optim_apply and one through
 * eng_optim_apply_on(b) (weights and gradients copied to b's buffers); weights and saved state must be identical
 * after every call. */
static void check_apply_on(const krn_backend *b, krn_ctx *ctx, const eng_optim_opts *opts, int calls);

Test(optim, apply_on_cpu_backend_matches_apply) {
    const eng_optim_opts cases[] = {
        {.kind = ENG_OPTIM_SGD, .lr = 0.1f, .weight_decay = 0.01f},
        {.kind = ENG_OPTIM_SGD, .lr = 0.05f, .momentum = 0.8f, .nesterov = 1, .clipnorm = 1.0f},
        {.kind = ENG_OPTIM_ADAM, .lr = 0.01f, .weight_decay = 0.05f},
        {.kind = ENG_OPTIM_ADAMW, .lr = 0.01f, .weight_decay = 0.01f, .accum_steps = 3, .clipnorm = 2.0f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_apply_on(krn_backend_cpu(), NULL, &cases[i], 7);
}

Test(optim, apply_on_host_mixes_with_apply) {
    const int64_t n[2] = {5, 64};
    run a, b;
    run_init(&a, 2, n, 3);
    run_init(&b, 2, n, 3);
    eng_optim_opts opts = {.kind = ENG_OPTIM_ADAM, .lr = 0.01f, .accum_steps = 2};
    eng_optim *oa = NULL, *ob = NULL;
    cr_assert_eq(eng_optim_new(&opts, 2, n, &oa), ENG_STATUS_OK);
    cr_assert_eq(eng_optim_new(&opts, 2, n, &ob), ENG_STATUS_OK);
    for (int s = 0; s < 6; s++) {
        rng_state = 900 + (uint64_t)s;
        run_grads(&a, 1.0);
        for (int p = 0; p < 2; p++) memcpy(b.g[p], a.g[p], (size_t)n[p] * sizeof(float));
        cr_assert_eq(eng_optim_apply(oa, a.w, (const float *const *)a.g, NULL), ENG_STATUS_OK);
        eng_status st = s % 2 ? eng_optim_apply(ob, b.w, (const float *const *)b.g, NULL)
                              : eng_optim_apply_on(ob, krn_backend_cpu(), NULL, b.w, (const float *const *)b.g, NULL);
        cr_assert_eq(st, ENG_STATUS_OK, "%s", eng_last_error());
    }
    for (int p = 0; p < 2; p++) cr_assert_eq(memcmp(a.w[p], b.w[p], (size_t)n[p] * sizeof(float)), 0);
    eng_optim_free(&oa);
    eng_optim_free(&ob);
    run_free(&a);
    run_free(&b);
}

/* "tdev": a device backend for this test in host memory. Its buffers are malloc'd blocks it tracks; its kernels are
 * the CPU's optim kernels behind a wrapper that refuses any tensor that is not one of its buffers and any call
 * without its context; krn_buf_get lands in host memory only at krn_ctx_sync, as an asynchronous device copy may,
 * so a read before the sync sees poison. */
struct krn_ctx { int magic; int syncs; };
#define TDEV_MAGIC 0x7de5
#define TDEV_MAX 64
static struct { char *p; size_t n; } tdev_blocks[TDEV_MAX];
static struct { void *dst; char *data; size_t n; } tdev_pending[4096];
static int tdev_npending, tdev_sets, tdev_gets, tdev_execs;

static int tdev_owns(const void *p, size_t n) {
    for (int i = 0; i < TDEV_MAX; i++)
        if (tdev_blocks[i].p && (const char *)p >= tdev_blocks[i].p && (const char *)p + n <= tdev_blocks[i].p + tdev_blocks[i].n)
            return 1;
    return 0;
}
static int tdev_live(void) {
    int k = 0;
    for (int i = 0; i < TDEV_MAX; i++) k += tdev_blocks[i].p != NULL;
    return k;
}
static eng_status tdev_ctx_new(int dev, krn_ctx **out) {
    *out = calloc(1, sizeof **out);
    (*out)->magic = TDEV_MAGIC;
    return ENG_STATUS_OK;
}
static void tdev_ctx_free(krn_ctx *c) { free(c); }
static eng_status tdev_sync(krn_ctx *c) {
    if (!c || c->magic != TDEV_MAGIC) return eng_err(ENG_STATUS_INTERNAL, "tdev: sync without the context");
    c->syncs++;
    for (int i = 0; i < tdev_npending; i++) {
        memcpy(tdev_pending[i].dst, tdev_pending[i].data, tdev_pending[i].n);
        free(tdev_pending[i].data);
    }
    tdev_npending = 0;
    return ENG_STATUS_OK;
}
static eng_status tdev_alloc(krn_ctx *c, size_t n, void **out) {
    if (!c || c->magic != TDEV_MAGIC) return eng_err(ENG_STATUS_INTERNAL, "tdev: alloc without the context");
    for (int i = 0; i < TDEV_MAX; i++)
        if (!tdev_blocks[i].p) {
            tdev_blocks[i].p = malloc(n ? n : 1);
            tdev_blocks[i].n = n;
            memset(tdev_blocks[i].p, 0xA5, n); /* device memory is not zeroed */
            *out = tdev_blocks[i].p;
            return ENG_STATUS_OK;
        }
    return eng_err(ENG_STATUS_OUT_OF_MEMORY, "tdev: out of blocks");
}
static void tdev_free(krn_ctx *c, void *p) {
    for (int i = 0; i < TDEV_MAX; i++)
        if (tdev_blocks[i].p == p) {
            free(p);
            tdev_blocks[i].p = NULL;
        }
}
static eng_status tdev_set(krn_ctx *c, void *dst, const void *src, size_t n) {
    if (!tdev_owns(dst, n) || tdev_owns(src, n)) return eng_err(ENG_STATUS_INTERNAL, "tdev: set to a non-device buffer");
    tdev_sets++;
    memcpy(dst, src, n);
    return ENG_STATUS_OK;
}
static eng_status tdev_get(krn_ctx *c, void *dst, const void *src, size_t n) {
    if (!tdev_owns(src, n) || tdev_owns(dst, n)) return eng_err(ENG_STATUS_INTERNAL, "tdev: get from a non-device buffer");
    tdev_gets++;
    tdev_pending[tdev_npending].dst = dst;
    tdev_pending[tdev_npending].data = malloc(n ? n : 1);
    memcpy(tdev_pending[tdev_npending].data, src, n);
    tdev_pending[tdev_npending++].n = n;
    memset(dst, 0x7f, n); /* poison until the sync */
    return ENG_STATUS_OK;
}
static eng_status tdev_exec(krn_call *c, const char *name) {
    if (!c->ctx || c->ctx->magic != TDEV_MAGIC) return eng_err(ENG_STATUS_INTERNAL, "tdev %s: no context", name);
    for (int i = 0; i < c->nin + c->nout; i++) {
        const eng_tensor *t = i < c->nin ? &c->in[i] : &c->out[i - c->nin];
        if (t->data && !tdev_owns(t->data, eng_tensor_nbytes(t)))
            return eng_err(ENG_STATUS_INTERNAL, "tdev %s: tensor %d is not device memory", name, i);
    }
    tdev_execs++;
    krn_ctx *ctx = c->ctx;
    c->ctx = NULL;
    eng_status st = krn_backend_find(krn_backend_cpu(), name)->exec(c);
    c->ctx = ctx;
    return st;
}
static eng_status tdev_update(krn_call *c) { return tdev_exec(c, "optim_update"); }
static eng_status tdev_sumsq(krn_call *c) { return tdev_exec(c, "optim_sum_squares"); }
static eng_status tdev_accum(krn_call *c) { return tdev_exec(c, "optim_accumulate"); }
static const krn_kernel tdev_kernels[] = {
    {"optim_update", NULL, tdev_update}, {"optim_sum_squares", NULL, tdev_sumsq}, {"optim_accumulate", NULL, tdev_accum}, {NULL}};
static const krn_kernel *const tdev_tables[] = {tdev_kernels, NULL};
static const krn_kernel tdev_none[] = {{NULL}};
static const krn_kernel *const tdev_none_tables[] = {tdev_none, NULL};
static const krn_backend tdev_backend = {.abi = KRN_BACKEND_ABI, .name = "tdev", .tables = tdev_tables, .is_host = 0,
                                         .alignment = 64, .ctx_new = tdev_ctx_new, .ctx_free = tdev_ctx_free,
                                         .ctx_sync = tdev_sync, .alloc = tdev_alloc, .free = tdev_free,
                                         .set = tdev_set, .get = tdev_get};
static const krn_backend tdev_bare = {.abi = KRN_BACKEND_ABI, .name = "tdev-bare", .tables = tdev_none_tables,
                                      .is_host = 0, .alignment = 64, .ctx_new = tdev_ctx_new, .ctx_free = tdev_ctx_free,
                                      .ctx_sync = tdev_sync, .alloc = tdev_alloc, .free = tdev_free, .set = tdev_set,
                                      .get = tdev_get};

static void check_apply_on(const krn_backend *b, krn_ctx *ctx, const eng_optim_opts *opts, int calls) {
    const int64_t n[3] = {7, 0, 130};
    int host = krn_backend_is_host(b);
    run a, d;
    run_init(&a, 3, n, 11);
    run_init(&d, 3, n, 11);
    float *dw[3], *dg[3];
    for (int p = 0; p < 3; p++) {
        size_t nb = (size_t)n[p] * sizeof(float);
        dw[p] = d.w[p], dg[p] = d.g[p];
        if (host || !nb) continue;
        cr_assert_eq(krn_buf_alloc(b, ctx, nb, (void **)&dw[p]), ENG_STATUS_OK);
        cr_assert_eq(krn_buf_alloc(b, ctx, nb, (void **)&dg[p]), ENG_STATUS_OK);
        cr_assert_eq(krn_buf_set(b, ctx, dw[p], d.w[p], nb), ENG_STATUS_OK);
    }
    eng_optim *oa = NULL, *od = NULL;
    cr_assert_eq(eng_optim_new(opts, 3, n, &oa), ENG_STATUS_OK);
    cr_assert_eq(eng_optim_new(opts, 3, n, &od), ENG_STATUS_OK);
    size_t len = eng_optim_state_size(oa);
    char *sa = malloc(len), *sd = malloc(len);
    for (int s = 0; s < calls; s++) {
        rng_state = 300 + (uint64_t)s;
        run_grads(&a, 3.0);
        for (int p = 0; p < 3; p++) {
            size_t nb = (size_t)n[p] * sizeof(float);
            if (host) memcpy(dg[p], a.g[p], nb);
            else if (nb) cr_assert_eq(krn_buf_set(b, ctx, dg[p], a.g[p], nb), ENG_STATUS_OK);
        }
        int aa = -1, ad = -2;
        cr_assert_eq(eng_optim_apply(oa, a.w, (const float *const *)a.g, &aa), ENG_STATUS_OK, "%s", eng_last_error());
        cr_assert_eq(eng_optim_apply_on(od, b, ctx, dw, (const float *const *)dg, &ad), ENG_STATUS_OK, "%s",
                     eng_last_error());
        cr_assert_eq(aa, ad);
        cr_assert_eq(eng_optim_last_grad_norm(oa), eng_optim_last_grad_norm(od));
        for (int p = 0; p < 3; p++) {
            size_t nb = (size_t)n[p] * sizeof(float);
            if (!host && nb) cr_assert_eq(krn_buf_get(b, ctx, d.w[p], dw[p], nb), ENG_STATUS_OK);
        }
        cr_assert_eq(krn_ctx_sync(b, ctx), ENG_STATUS_OK);
        for (int p = 0; p < 3; p++)
            cr_assert_eq(memcmp(a.w[p], d.w[p], (size_t)n[p] * sizeof(float)), 0, "%s call %d param %d differs",
                         krn_backend_name(b), s, p);
        cr_assert_eq(eng_optim_state_save(oa, sa, len), ENG_STATUS_OK);
        cr_assert_eq(eng_optim_state_save(od, sd, len), ENG_STATUS_OK, "%s", eng_last_error());
        cr_assert_eq(memcmp(sa, sd, len), 0, "%s call %d: saved state differs", krn_backend_name(b), s);
    }
    free(sa), free(sd);
    eng_optim_free(&oa);
    eng_optim_free(&od);
    for (int p = 0; p < 3; p++)
        if (!host && n[p]) krn_buf_free(b, ctx, dw[p]), krn_buf_free(b, ctx, dg[p]);
    run_free(&a);
    run_free(&d);
}

Test(optim, apply_on_device_backend) {
    krn_ctx *ctx = NULL;
    cr_assert_eq(krn_ctx_new(&tdev_backend, 0, &ctx), ENG_STATUS_OK);
    const eng_optim_opts cases[] = {
        {.kind = ENG_OPTIM_SGD, .lr = 0.1f, .weight_decay = 0.01f},
        {.kind = ENG_OPTIM_SGD, .lr = 0.05f, .momentum = 0.9f, .clipnorm = 1.0f},
        {.kind = ENG_OPTIM_SGD, .lr = 0.05f, .momentum = 0.8f, .nesterov = 1, .accum_steps = 2},
        {.kind = ENG_OPTIM_ADAM, .lr = 0.01f, .weight_decay = 0.05f, .clipnorm = 0.5f},
        {.kind = ENG_OPTIM_ADAMW, .lr = 0.01f, .weight_decay = 0.01f, .accum_steps = 3, .clipnorm = 2.0f,
         .schedule = ENG_LR_COSINE, .decay_steps = 4, .warmup_steps = 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tdev_execs = 0;
        check_apply_on(&tdev_backend, ctx, &cases[i], 7);
        cr_assert_gt(tdev_execs, 0, "the device kernels ran");
        cr_assert_eq(tdev_live(), 0, "case %zu: device buffers left after eng_optim_free", i);
    }
    krn_ctx_free(&tdev_backend, &ctx);
}

Test(optim, apply_on_device_moves_state_and_owns_it) {
    krn_ctx *ctx = NULL;
    cr_assert_eq(krn_ctx_new(&tdev_backend, 0, &ctx), ENG_STATUS_OK);
    const int64_t n[2] = {6, 40};
    eng_optim_opts opts = {.kind = ENG_OPTIM_ADAM, .lr = 0.01f, .accum_steps = 2};
    run h;
    run_init(&h, 2, n, 21);
    eng_optim *oh = NULL, *od = NULL;
    cr_assert_eq(eng_optim_new(&opts, 2, n, &oh), ENG_STATUS_OK);
    cr_assert_eq(eng_optim_new(&opts, 2, n, &od), ENG_STATUS_OK);
    /* 3 host calls (one update, one gradient pending), then state into od: its first apply_on moves all of it */
    for (int s = 0; s < 3; s++) {
        rng_state = 40 + (uint64_t)s;
        run_grads(&h, 1.0);
        cr_assert_eq(eng_optim_apply(oh, h.w, (const float *const *)h.g, NULL), ENG_STATUS_OK);
    }
    size_t len = eng_optim_state_size(oh);
    char *buf = malloc(len), *buf2 = malloc(len);
    cr_assert_eq(eng_optim_state_save(oh, buf, len), ENG_STATUS_OK);
    cr_assert_eq(eng_optim_state_load(od, buf, len), ENG_STATUS_OK);
    float *dw[2], *dg[2];
    for (int p = 0; p < 2; p++) {
        size_t nb = (size_t)n[p] * sizeof(float);
        cr_assert_eq(krn_buf_alloc(&tdev_backend, ctx, nb, (void **)&dw[p]), ENG_STATUS_OK);
        cr_assert_eq(krn_buf_alloc(&tdev_backend, ctx, nb, (void **)&dg[p]), ENG_STATUS_OK);
        cr_assert_eq(krn_buf_set(&tdev_backend, ctx, dw[p], h.w[p], nb), ENG_STATUS_OK);
    }
    rng_state = 99;
    run_grads(&h, 1.0);
    for (int p = 0; p < 2; p++)
        cr_assert_eq(krn_buf_set(&tdev_backend, ctx, dg[p], h.g[p], (size_t)n[p] * sizeof(float)), ENG_STATUS_OK);
    int live = tdev_live(), ah = 0, ad = 0, syncs = ctx->syncs;
    cr_assert_eq(eng_optim_apply(oh, h.w, (const float *const *)h.g, &ah), ENG_STATUS_OK);
    cr_assert_eq(eng_optim_apply_on(od, &tdev_backend, ctx, dw, (const float *const *)dg, &ad), ENG_STATUS_OK, "%s",
                 eng_last_error());
    cr_assert(ah == 1 && ad == 1);
    cr_assert_eq(tdev_live(), live + 3 * 2 + 1, "3 slots x 2 parameters + the sums of squares");
    cr_assert_gt(ctx->syncs, syncs);
    /* the state lives on tdev now: save reads it back from there, identical to the host optimizer's */
    cr_assert_eq(eng_optim_state_save(oh, buf, len), ENG_STATUS_OK);
    cr_assert_eq(eng_optim_state_save(od, buf2, len), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(memcmp(buf, buf2, len), 0);
    /* ...and load writes it there (with a changed step, visible in the learning rate) */
    cr_assert_eq(eng_optim_state_load(od, buf, len), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(eng_optim_state_save(od, buf2, len), ENG_STATUS_OK);
    cr_assert_eq(memcmp(buf, buf2, len), 0);
    /* host buffers or another backend are refused; a backend without the kernels is UNSUPPORTED */
    cr_assert_eq(eng_optim_apply(od, h.w, (const float *const *)h.g, NULL), ENG_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(eng_last_error(), "tdev"), "%s", eng_last_error());
    cr_assert_eq(eng_optim_apply_on(od, krn_backend_cpu(), NULL, h.w, (const float *const *)h.g, NULL),
                 ENG_STATUS_INVALID_ARGUMENT);
    eng_optim *ob = NULL;
    cr_assert_eq(eng_optim_new(&opts, 2, n, &ob), ENG_STATUS_OK);
    cr_assert_eq(eng_optim_apply_on(ob, &tdev_bare, ctx, dw, (const float *const *)dg, NULL), ENG_STATUS_UNSUPPORTED);
    cr_assert(strstr(eng_last_error(), "optim_update"), "%s", eng_last_error());
    eng_optim_free(&ob);
    eng_optim_free(&od);
    cr_assert_eq(tdev_live(), live, "eng_optim_free releases the device state");
    eng_optim_free(&oh);
    for (int p = 0; p < 2; p++) krn_buf_free(&tdev_backend, ctx, dw[p]), krn_buf_free(&tdev_backend, ctx, dg[p]);
    free(buf), free(buf2);
    run_free(&h);
    krn_ctx_free(&tdev_backend, &ctx);
}
