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
