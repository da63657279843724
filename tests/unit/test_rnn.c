/* test_rnn.c - the recurrent ops RNN, GRU and LSTM (engine/ops/rnn.c + kernels/cpu/rnn.c) against a float64
 * reference written here from the ONNX operator docs.
 *
 * Each case builds a one-node graph (weights as graph inputs, or as initializers so the kernel packs them once in
 * init), plans and runs it on the CPU backend, and compares every requested output with the reference: every
 * direction, layout 1, sequence_lens with padding (a length-0 row included), initial states, peepholes,
 * linear_before_reset 0 and 1, input_forget, clip, non-default activations with alpha/beta, omitted inputs and
 * outputs, one, two and four threads. The plain implementation (also with one thread per team: plain-solo, its
 * fallback under contention) and oneDNN (TENSORD_RNN_IMPL) must each match the reference where they take the call. Bad inputs must fail with a message naming the input (never abort).
 */
#include <criterion/criterion.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/ir/graph.h"
#include "engine/plan/plan.h"

/* ---- the case and its reference ---- */

typedef struct rcase {
    const char *op, *dir; /* "LSTM" | "GRU" | "RNN"; "forward" | "reverse" | "bidirectional" */
    int layout;
    int64_t S, B, I, H;
    int has_b, has_h0, has_c0, has_p, has_lens;
    int lens[16];
    int lbr, input_forget;
    float clip; /* 0: none */
    int nacts;
    const char *acts[6];
    int nalpha, nbeta;
    float alphas[6], betas[6];
    int no_y, no_yh, no_yc; /* omit that output */
    int init;               /* W, R, B, P as initializers */
    int nthreads;
} rcase;

typedef struct ract {
    int kind; /* index into ract_names */
    double alpha, beta;
} ract;

static const char *ract_names[] = {"sigmoid", "tanh", "relu", "affine", "leakyrelu", "thresholdedrelu",
                                   "scaledtanh", "hardsigmoid", "elu", "softsign", "softplus"};

static double ract_f(const ract *a, double x) {
    switch (a->kind) {
    case 0: return 1.0 / (1.0 + exp(-x));
    case 1: return tanh(x);
    case 2: return x > 0 ? x : 0;
    case 3: return a->alpha * x + a->beta;
    case 4: return x >= 0 ? x : a->alpha * x;
    case 5: return x > a->alpha ? x : 0;
    case 6: return a->alpha * tanh(a->beta * x);
    case 7: return fmax(0, fmin(1, a->alpha * x + a->beta));
    case 8: return x >= 0 ? x : a->alpha * (exp(x) - 1);
    case 9: return x / (1 + fabs(x));
    case 10: return log1p(exp(x));
    }
    return x;
}

static int rc_ngates(const rcase *k) { return !strcmp(k->op, "LSTM") ? 4 : !strcmp(k->op, "GRU") ? 3 : 1; }
static int rc_nacts(const rcase *k) { return !strcmp(k->op, "LSTM") ? 3 : !strcmp(k->op, "GRU") ? 2 : 1; }
static int rc_ndir(const rcase *k) { return k->dir && !strcmp(k->dir, "bidirectional") ? 2 : 1; }

/* Activations per direction: defaults, or the case's names with alphas/betas consumed by the functions that use
 * them, in order (onnxruntime's reading of the spec), unset ones the ONNX operators' defaults. */
static void rc_acts(const rcase *k, ract act[2][3]) {
    static const int dflt[3][3] = {{1}, {0, 1}, {0, 1, 1}};
    int na = rc_nacts(k), ci = na == 3 ? 2 : na == 2 ? 1 : 0;
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < 3; i++) act[d][i] = (ract){.kind = dflt[ci][i]};
    int ia = 0, ib = 0;
    for (int n = 0; n < k->nacts; n++) {
        char low[32];
        size_t L = strlen(k->acts[n]);
        for (size_t i = 0; i <= L; i++) low[i] = (char)tolower((unsigned char)k->acts[n][i]);
        ract a = {.kind = -1};
        for (int i = 0; i < 11; i++)
            if (!strcmp(ract_names[i], low)) a.kind = i;
        cr_assert_geq(a.kind, 0, "test activation %s", k->acts[n]);
        int ua = a.kind == 3 || a.kind == 4 || a.kind == 5 || a.kind == 6 || a.kind == 7 || a.kind == 8;
        int ub = a.kind == 3 || a.kind == 6 || a.kind == 7;
        static const double da[11] = {0, 0, 0, 1, 0.01, 1, 1, 0.2, 1, 0, 0}, db[11] = {0, 0, 0, 0, 0, 0, 1, 0.5, 0, 0, 0};
        a.alpha = ua && ia < k->nalpha ? k->alphas[ia++] : da[a.kind];
        a.beta = ub && ib < k->nbeta ? k->betas[ib++] : db[a.kind];
        act[n / na][n % na] = a;
    }
    if (k->nacts == na)
        for (int i = 0; i < 3; i++) act[1][i] = act[0][i];
}

typedef struct rdata {
    float *X, *W, *R, *Bb, *h0, *c0, *P;
    int32_t lens[16];
    double *Y, *Yh, *Yc;
} rdata;

static int64_t ri_x(const rcase *k, int64_t t, int64_t b) { return (k->layout ? b * k->S + t : t * k->B + b) * k->I; }
static int64_t ri_y(const rcase *k, int64_t t, int d, int64_t b) {
    int D = rc_ndir(k);
    return (k->layout ? (b * k->S + t) * D + d : (t * D + d) * k->B + b) * k->H;
}
static int64_t ri_h(const rcase *k, int d, int64_t b) {
    return (k->layout ? b * rc_ndir(k) + d : d * k->B + b) * k->H;
}

static double rclip(const rcase *k, double v) { return k->clip > 0 ? fmax(-k->clip, fmin(k->clip, v)) : v; }

static void rc_reference(const rcase *k, rdata *r) {
    const int G = rc_ngates(k), D = rc_ndir(k);
    const int64_t H = k->H, I = k->I, B = k->B, S = k->S;
    ract act[2][3];
    rc_acts(k, act);
    int lstm = G == 4, gru = G == 3;
    double *h = calloc((size_t)H, sizeof(double)), *c = calloc((size_t)H, sizeof(double)),
           *g = calloc((size_t)(4 * H), sizeof(double)), *hn = calloc((size_t)H, sizeof(double));
    for (int d = 0; d < D; d++) {
        int rev = d == 1 || (k->dir && !strcmp(k->dir, "reverse"));
        const float *W = r->W + d * G * H * I, *R = r->R + d * G * H * H;
        const float *wb = k->has_b ? r->Bb + d * 2 * G * H : NULL, *rb = wb ? wb + G * H : NULL;
        const float *P = k->has_p ? r->P + d * 3 * H : NULL;
        for (int64_t b = 0; b < B; b++) {
            int64_t len = k->has_lens ? r->lens[b] : S;
            for (int64_t j = 0; j < H; j++) {
                h[j] = k->has_h0 ? r->h0[ri_h(k, d, b) + j] : 0;
                c[j] = k->has_c0 ? r->c0[ri_h(k, d, b) + j] : 0;
            }
            for (int64_t s = 0; s < len; s++) {
                int64_t t = rev ? len - 1 - s : s;
                const float *x = r->X + ri_x(k, t, b);
                for (int gi = 0; gi < G; gi++) /* x W^T + Wb (+ Rb, and h R^T, where the cell adds them plainly) */
                    for (int64_t j = 0; j < H; j++) {
                        double v = wb ? wb[gi * H + j] : 0;
                        for (int64_t i = 0; i < I; i++) v += (double)x[i] * W[(gi * H + j) * I + i];
                        if (!(gru && gi == 2)) {
                            if (rb) v += rb[gi * H + j];
                            for (int64_t i = 0; i < H; i++) v += h[i] * R[(gi * H + j) * H + i];
                        }
                        g[gi * H + j] = v;
                    }
                if (lstm) { /* i, o, f, c */
                    for (int64_t j = 0; j < H; j++) {
                        double gi = g[j], go = g[H + j], gf = g[2 * H + j], gc = g[3 * H + j];
                        if (P) gi += P[j] * c[j], gf += P[2 * H + j] * c[j];
                        gi = ract_f(&act[d][0], rclip(k, gi));
                        gf = k->input_forget ? 1 - gi : ract_f(&act[d][0], rclip(k, gf));
                        gc = ract_f(&act[d][1], rclip(k, gc));
                        c[j] = gf * c[j] + gi * gc;
                        if (P) go += P[H + j] * c[j];
                        go = ract_f(&act[d][0], rclip(k, go));
                        hn[j] = go * ract_f(&act[d][2], c[j]);
                    }
                } else if (gru) { /* z, r, h */
                    for (int64_t j = 0; j < 2 * H; j++) g[j] = ract_f(&act[d][0], rclip(k, g[j]));
                    for (int64_t j = 0; j < H; j++) {
                        double z = g[j], rr = g[H + j], v = g[2 * H + j];
                        if (k->lbr) {
                            double hr = rb ? rb[2 * H + j] : 0;
                            for (int64_t i = 0; i < H; i++) hr += h[i] * R[(2 * H + j) * H + i];
                            v += rr * hr;
                        } else {
                            if (rb) v += rb[2 * H + j];
                            for (int64_t i = 0; i < H; i++) v += g[H + i] * h[i] * R[(2 * H + j) * H + i];
                        }
                        v = ract_f(&act[d][1], rclip(k, v));
                        hn[j] = (1 - z) * v + z * h[j];
                    }
                } else {
                    for (int64_t j = 0; j < H; j++) hn[j] = ract_f(&act[d][0], rclip(k, g[j]));
                }
                memcpy(h, hn, (size_t)H * sizeof(double));
                for (int64_t j = 0; j < H; j++) r->Y[ri_y(k, t, d, b) + j] = h[j];
            }
            for (int64_t t = len; t < S; t++)
                for (int64_t j = 0; j < H; j++) r->Y[ri_y(k, t, d, b) + j] = 0;
            for (int64_t j = 0; j < H; j++) { /* a length-0 row: zeros (onnxruntime's answer) */
                r->Yh[ri_h(k, d, b) + j] = len ? h[j] : 0;
                r->Yc[ri_h(k, d, b) + j] = len ? c[j] : 0;
            }
        }
    }
    free(h), free(c), free(g), free(hn);
}

/* ---- graph and run ---- */

static uint64_t rng = 88172645463325252ull;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / (double)(1ull << 52) - 1.0);
}
static float *rand_buf(int64_t n, float scale) {
    float *p = malloc((size_t)(n ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = frand() * scale;
    return p;
}

static int add_value(eng_graph *g, const char *name, eng_dtype dt, int ndim, const int64_t *dims, const void *data,
                     int as_init) {
    int v = eng_graph_add_value(g, name);
    g->values[v].dtype = dt;
    g->values[v].ndim = ndim;
    for (int i = 0; i < ndim; i++) g->values[v].dims[i] = dims[i];
    if (as_init) {
        eng_tensor *t = calloc(1, sizeof *t);
        t->dtype = dt;
        t->ndim = ndim;
        memcpy(t->dims, dims, (size_t)ndim * sizeof(int64_t));
        size_t nb = (size_t)eng_shape_numel(dims, ndim) * eng_dtype_size(dt);
        t->data = eng_alloc(nb ? nb : 4);
        memcpy(t->data, data, nb);
        eng_value_set_init(g, v, t);
    } else {
        g->inputs = realloc(g->inputs, (size_t)(g->ninputs + 1) * sizeof(int));
        g->inputs[g->ninputs++] = v;
    }
    return v;
}

typedef struct rgraph {
    eng_graph *g;
    eng_tensor feeds[8];
    int nfeeds;
    int outs[3]; /* graph output index of Y, Y_h, Y_c, or -1 */
} rgraph;

static void feed(rgraph *rg, eng_dtype dt, int ndim, const int64_t *dims, const void *data) {
    eng_tensor *t = &rg->feeds[rg->nfeeds++];
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->ndim = ndim;
    memcpy(t->dims, dims, (size_t)ndim * sizeof(int64_t));
    t->data = (void *)data;
}

/* x_dtype: ENG_DTYPE_F32 normally; another to test the refusal. */
static void rc_build(const rcase *k, rdata *r, rgraph *rg, eng_dtype x_dtype) {
    memset(rg, 0, sizeof *rg);
    eng_graph *g = eng_graph_new();
    g->opset = 14;
    const int G = rc_ngates(k), D = rc_ndir(k);
    int lstm = G == 4;
    int in[8];
    for (int i = 0; i < 8; i++) in[i] = -1;
    int64_t xd[3] = {k->layout ? k->B : k->S, k->layout ? k->S : k->B, k->I};
    int64_t wd[3] = {D, G * k->H, k->I}, rd[3] = {D, G * k->H, k->H}, bd[2] = {D, 2 * G * k->H}, ld[1] = {k->B};
    int64_t hd[3] = {k->layout ? k->B : D, k->layout ? D : k->B, k->H}, pd[2] = {D, 3 * k->H};
    in[0] = add_value(g, "X", x_dtype, 3, xd, NULL, 0);
    feed(rg, x_dtype, 3, xd, r->X);
    in[1] = add_value(g, "W", ENG_DTYPE_F32, 3, wd, r->W, k->init);
    if (!k->init) feed(rg, ENG_DTYPE_F32, 3, wd, r->W);
    in[2] = add_value(g, "R", ENG_DTYPE_F32, 3, rd, r->R, k->init);
    if (!k->init) feed(rg, ENG_DTYPE_F32, 3, rd, r->R);
    if (k->has_b) {
        in[3] = add_value(g, "B", ENG_DTYPE_F32, 2, bd, r->Bb, k->init);
        if (!k->init) feed(rg, ENG_DTYPE_F32, 2, bd, r->Bb);
    }
    if (k->has_lens) {
        in[4] = add_value(g, "sequence_lens", ENG_DTYPE_I32, 1, ld, NULL, 0);
        feed(rg, ENG_DTYPE_I32, 1, ld, r->lens);
    }
    if (k->has_h0) {
        in[5] = add_value(g, "initial_h", ENG_DTYPE_F32, 3, hd, NULL, 0);
        feed(rg, ENG_DTYPE_F32, 3, hd, r->h0);
    }
    if (lstm && k->has_c0) {
        in[6] = add_value(g, "initial_c", ENG_DTYPE_F32, 3, hd, NULL, 0);
        feed(rg, ENG_DTYPE_F32, 3, hd, r->c0);
    }
    if (lstm && k->has_p) {
        in[7] = add_value(g, "P", ENG_DTYPE_F32, 2, pd, r->P, k->init);
        if (!k->init) feed(rg, ENG_DTYPE_F32, 2, pd, r->P);
    }
    int nin = 8;
    while (nin > 3 && in[nin - 1] < 0) nin--;
    int out[3] = {-1, -1, -1}, want[3] = {!k->no_y, !k->no_yh, lstm && !k->no_yc};
    static const char *onames[3] = {"Y", "Y_h", "Y_c"};
    int nout = 0;
    for (int i = 0; i < 3; i++) {
        rg->outs[i] = -1;
        if (!want[i]) continue;
        out[i] = eng_graph_add_value(g, onames[i]);
        g->outputs = realloc(g->outputs, (size_t)(g->noutputs + 1) * sizeof(int));
        rg->outs[i] = g->noutputs;
        g->outputs[g->noutputs++] = out[i];
        nout = i + 1;
    }
    int n = eng_graph_add_node(g, "rnn0", k->op, "", in, nin, out, nout);
    eng_attr a = {.name = "hidden_size", .type = ENG_ATTR_INT, .i = k->H};
    eng_node_add_attr(g, n, &a);
    if (k->dir) {
        a = (eng_attr){.name = "direction", .type = ENG_ATTR_STRING, .s = (char *)k->dir, .s_len = strlen(k->dir)};
        eng_node_add_attr(g, n, &a);
    }
    if (k->layout) {
        a = (eng_attr){.name = "layout", .type = ENG_ATTR_INT, .i = 1};
        eng_node_add_attr(g, n, &a);
    }
    if (k->lbr) {
        a = (eng_attr){.name = "linear_before_reset", .type = ENG_ATTR_INT, .i = 1};
        eng_node_add_attr(g, n, &a);
    }
    if (k->input_forget) {
        a = (eng_attr){.name = "input_forget", .type = ENG_ATTR_INT, .i = 1};
        eng_node_add_attr(g, n, &a);
    }
    if (k->clip > 0) {
        a = (eng_attr){.name = "clip", .type = ENG_ATTR_FLOAT, .f = k->clip};
        eng_node_add_attr(g, n, &a);
    }
    if (k->nacts) {
        a = (eng_attr){.name = "activations", .type = ENG_ATTR_STRINGS, .strings = (char **)k->acts, .n = k->nacts};
        eng_node_add_attr(g, n, &a);
    }
    if (k->nalpha) {
        a = (eng_attr){.name = "activation_alpha", .type = ENG_ATTR_FLOATS, .floats = (float *)k->alphas, .n = k->nalpha};
        eng_node_add_attr(g, n, &a);
    }
    if (k->nbeta) {
        a = (eng_attr){.name = "activation_beta", .type = ENG_ATTR_FLOATS, .floats = (float *)k->betas, .n = k->nbeta};
        eng_node_add_attr(g, n, &a);
    }
    rg->g = g;
}

static void rc_data(const rcase *k, rdata *r) {
    const int G = rc_ngates(k), D = rc_ndir(k);
    memset(r, 0, sizeof *r);
    r->X = rand_buf(k->S * k->B * k->I, 1.0f);
    float ws = 1.0f / sqrtf((float)(k->I > k->H ? k->I : k->H)) * 1.5f;
    r->W = rand_buf(D * G * k->H * k->I, ws);
    r->R = rand_buf(D * G * k->H * k->H, ws);
    r->Bb = rand_buf(D * 2 * G * k->H, 0.5f);
    r->h0 = rand_buf(D * k->B * k->H, 1.0f);
    r->c0 = rand_buf(D * k->B * k->H, 1.0f);
    r->P = rand_buf(D * 3 * k->H, 0.5f);
    for (int b = 0; b < 16; b++) r->lens[b] = k->has_lens ? k->lens[b] : (int32_t)k->S;
    r->Y = calloc((size_t)(k->S * D * k->B * k->H), sizeof(double));
    r->Yh = calloc((size_t)(D * k->B * k->H), sizeof(double));
    r->Yc = calloc((size_t)(D * k->B * k->H), sizeof(double));
}

static void rc_data_free(rdata *r) {
    free(r->X), free(r->W), free(r->R), free(r->Bb), free(r->h0), free(r->c0), free(r->P);
    free(r->Y), free(r->Yh), free(r->Yc);
}

/* Plan and run; OK or the first error (message in eng_last_error()). outs[i] copied into got[i] (malloc'd). */
static eng_status rc_run(const rcase *k, rgraph *rg, float *got[3], int64_t nget[3]) {
    eng_plan_opts o = {.nthreads = k->nthreads ? k->nthreads : 2};
    eng_plan *p = NULL;
    eng_status st = eng_plan_new(rg->g, &o, rg->feeds, &p);
    if (st != ENG_STATUS_OK) return st;
    eng_tensor outs[3];
    st = eng_plan_run(p, rg->feeds, outs);
    for (int i = 0; st == ENG_STATUS_OK && i < 3; i++) {
        got[i] = NULL;
        nget[i] = 0;
        if (rg->outs[i] < 0) continue;
        nget[i] = eng_tensor_numel(&outs[rg->outs[i]]);
        got[i] = malloc((size_t)(nget[i] ? nget[i] : 1) * sizeof(float));
        memcpy(got[i], outs[rg->outs[i]].data, (size_t)nget[i] * sizeof(float));
    }
    eng_plan_free(&p);
    return st;
}

static void expect_close(const float *got, const double *want, int64_t n, double tol, const char *what, const char *label) {
    double scale = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    for (int64_t i = 0; i < n; i++)
        cr_assert(fabs(got[i] - want[i]) <= tol * (1.0 + scale), "%s: %s element %lld got %.7g want %.7g", label, what,
                  (long long)i, got[i], want[i]);
}

static void rc_label(const rcase *k, char *buf, size_t n) {
    snprintf(buf, n, "%s %s layout %d S%lld B%lld I%lld H%lld%s%s%s%s%s lbr %d if %d clip %g acts %d init %d thr %d", k->op,
             k->dir ? k->dir : "(forward)", k->layout, (long long)k->S, (long long)k->B, (long long)k->I, (long long)k->H,
             k->has_b ? " B" : "", k->has_h0 ? " h0" : "", k->has_c0 ? " c0" : "", k->has_p ? " P" : "",
             k->has_lens ? " lens" : "", k->lbr, k->input_forget, (double)k->clip, k->nacts, k->init, k->nthreads);
}

/* Run case k under TENSORD_RNN_IMPL=impl (NULL: the kernel's choice) against the reference. Returns 0 if that
 * implementation refused the call (only when impl is "onednn"). */
static int rc_check_impl(const rcase *k, const char *impl) {
    char label[256];
    rc_label(k, label, sizeof label);
    rdata r;
    rc_data(k, &r);
    rc_reference(k, &r);
    rgraph rg;
    rc_build(k, &r, &rg, ENG_DTYPE_F32);
    if (impl) setenv("TENSORD_RNN_IMPL", impl, 1);
    else unsetenv("TENSORD_RNN_IMPL");
    float *got[3] = {0};
    int64_t n[3];
    eng_status st = rc_run(k, &rg, got, n);
    unsetenv("TENSORD_RNN_IMPL");
    int ran = 1;
    if (st == ENG_STATUS_UNSUPPORTED && impl && !strcmp(impl, "onednn")) ran = 0; /* oneDNN refused the call */
    else cr_assert_eq(st, ENG_STATUS_OK, "%s (%s): %s", label, impl ? impl : "auto", eng_last_error());
    const int D = rc_ndir(k);
    for (int i = 0; ran && i < 3; i++) {
        if (!got[i]) continue;
        int64_t want_n = i == 0 ? k->S * D * k->B * k->H : D * k->B * k->H;
        cr_assert_eq(n[i], want_n, "%s: output %d has %lld elements, want %lld", label, i, (long long)n[i], (long long)want_n);
        char what[64];
        snprintf(what, sizeof what, "%s (%s)", i == 0 ? "Y" : i == 1 ? "Y_h" : "Y_c", impl ? impl : "auto");
        expect_close(got[i], i == 0 ? r.Y : i == 1 ? r.Yh : r.Yc, n[i], 2e-5, what, label);
    }
    for (int i = 0; i < 3; i++) free(got[i]);
    eng_graph_free(&rg.g);
    rc_data_free(&r);
    return ran;
}

static void rc_check(const rcase *k) {
    rc_check_impl(k, "plain");
    if (k->nthreads > 1) rc_check_impl(k, "plain-solo");
    rc_check_impl(k, NULL);
}

/* ---- cases ---- */

static const char *const cells[3] = {"LSTM", "GRU", "RNN"};
static const char *const dirs[3] = {"forward", "reverse", "bidirectional"};

Test(rnn, directions_layouts_states) {
    for (int ci = 0; ci < 3; ci++)
        for (int di = 0; di < 3; di++)
            for (int layout = 0; layout < 2; layout++)
                for (int init = 0; init < 2; init++) {
                    rcase k = {.op = cells[ci], .dir = dirs[di], .layout = layout, .S = 4, .B = 3, .I = 5, .H = 7,
                               .has_b = 1, .has_h0 = init, .has_c0 = init, .init = init, .nthreads = 1 + init};
                    rc_check(&k);
                }
}

Test(rnn, sequence_lens_padding) {
    for (int ci = 0; ci < 3; ci++)
        for (int di = 0; di < 3; di++)
            for (int layout = 0; layout < 2; layout++) {
                rcase k = {.op = cells[ci], .dir = dirs[di], .layout = layout, .S = 5, .B = 4, .I = 3, .H = 6,
                           .has_b = 1, .has_h0 = 1, .has_c0 = 1, .has_lens = 1, .lens = {5, 2, 0, 4}, .nthreads = 2};
                rc_check(&k);
            }
}

Test(rnn, gru_linear_before_reset) {
    for (int lbr = 0; lbr < 2; lbr++)
        for (int di = 0; di < 3; di++) {
            rcase k = {.op = "GRU", .dir = dirs[di], .S = 6, .B = 5, .I = 9, .H = 40, .has_b = 1, .has_h0 = 1,
                       .lbr = lbr, .init = lbr, .nthreads = 2};
            rc_check(&k);
            rcase k2 = k;
            k2.has_lens = 1, k2.B = 3, k2.lens[0] = 6, k2.lens[1] = 1, k2.lens[2] = 3, k2.has_b = 0;
            rc_check(&k2);
        }
}

Test(rnn, lstm_peepholes_input_forget_clip) {
    for (int di = 0; di < 3; di++) {
        rcase k = {.op = "LSTM", .dir = dirs[di], .S = 5, .B = 3, .I = 4, .H = 8, .has_b = 1, .has_h0 = 1,
                   .has_c0 = 1, .has_p = 1, .init = di & 1, .nthreads = 2};
        rc_check(&k);
        k.input_forget = 1;
        rc_check(&k);
        k.clip = 0.6f;
        rc_check(&k);
    }
    for (int ci = 0; ci < 3; ci++) {
        rcase k = {.op = cells[ci], .dir = "bidirectional", .S = 4, .B = 2, .I = 3, .H = 5, .has_b = 1, .has_h0 = 1,
                   .clip = 0.3f};
        rc_check(&k);
    }
}

Test(rnn, activations_alpha_beta) {
    rcase ks[] = {
        {.op = "LSTM", .nacts = 3, .acts = {"HardSigmoid", "ScaledTanh", "Affine"}, .nalpha = 3, .alphas = {0.3f, 0.7f, 1.5f},
         .nbeta = 3, .betas = {0.4f, 1.2f, 0.1f}},
        {.op = "LSTM", .dir = "bidirectional", .nacts = 6, .acts = {"Sigmoid", "Softsign", "Softplus", "sigmoid", "elu", "THRESHOLDEDRELU"},
         .nalpha = 2, .alphas = {0.5f, 0.2f}},
        {.op = "LSTM", .dir = "bidirectional", .nacts = 3, .acts = {"hardsigmoid", "tanh", "relu"}}, /* one set: both directions */
        {.op = "GRU", .nacts = 2, .acts = {"Sigmoid", "LeakyRelu"}, .nalpha = 1, .alphas = {0.3f}},
        {.op = "GRU", .lbr = 1, .nacts = 2, .acts = {"HardSigmoid", "LeakyRelu"}}, /* defaults 0.2/0.5, 0.01 */
        {.op = "GRU", .dir = "reverse", .nacts = 2, .acts = {"ScaledTanh", "Elu"}, .nalpha = 2, .alphas = {1.2f, 0.6f},
         .nbeta = 1, .betas = {0.8f}},
        {.op = "RNN", .nacts = 1, .acts = {"Relu"}},
        {.op = "RNN", .nacts = 1, .acts = {"Sigmoid"}},
        {.op = "RNN", .dir = "bidirectional", .nacts = 2, .acts = {"LeakyRelu", "Softsign"}},
        {.op = "RNN", .nacts = 1, .acts = {"Affine"}, .nalpha = 1, .alphas = {0.5f}, .nbeta = 1, .betas = {-0.2f}},
    };
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        rcase k = ks[i];
        k.S = 4, k.B = 3, k.I = 3, k.H = 5, k.has_b = 1, k.has_h0 = 1, k.has_c0 = 1, k.nthreads = 2;
        rc_check(&k);
    }
}

Test(rnn, omitted_inputs_and_outputs) {
    for (int ci = 0; ci < 3; ci++)
        for (int m = 0; m < 4; m++) {
            rcase k = {.op = cells[ci], .dir = m & 1 ? "bidirectional" : NULL, .S = 3, .B = 2, .I = 4, .H = 5,
                       .has_b = m >= 2, .no_y = m == 1, .no_yh = m == 0 || m == 2, .no_yc = m != 3, .nthreads = 2};
            rc_check(&k);
        }
}

/* Sizes where the threads split the hidden units (a slice each) and the directions run on separate teams. */
Test(rnn, threaded_sizes) {
    for (int ci = 0; ci < 3; ci++)
        for (int di = 0; di < 3; di += 2)
            for (int nt = 1; nt <= 4; nt *= 2) {
                rcase k = {.op = cells[ci], .dir = dirs[di], .S = 6, .B = ci == 0 ? 1 : 9, .I = 20, .H = 72, .has_b = 1,
                           .has_h0 = 1, .has_c0 = 1, .has_lens = ci == 1, .lens = {6, 3, 5, 0, 1, 6, 2, 6, 4},
                           .lbr = nt == 2, .init = nt != 1, .nthreads = nt};
                rc_check(&k);
            }
}

/* oneDNN and the plain path agree (and both match the reference) on the calls oneDNN takes: default activations,
 * no clip, full lengths. */
Test(rnn, onednn_matches_plain) {
    int ran = 0;
    for (int ci = 0; ci < 3; ci++)
        for (int di = 0; di < 3; di++)
            for (int v = 0; v < 2; v++) {
                rcase k = {.op = cells[ci], .dir = dirs[di], .layout = v && di != 2, .S = 7, .B = v ? 8 : 1, .I = 24,
                           .H = 32, .has_b = 1, .has_h0 = v, .has_c0 = v, .has_p = v && ci == 0, .lbr = v,
                           .init = 1, .nthreads = 2};
                rc_check_impl(&k, "plain");
                ran += rc_check_impl(&k, "onednn");
            }
    cr_log_info("oneDNN took %d of 18 calls", ran);
}

/* ---- errors: a message naming the input, never an abort ---- */

static void expect_plan_error(const rcase *k, void (*mutate)(rgraph *), eng_dtype xdt, const char *needle) {
    rdata r;
    rc_data(k, &r);
    rgraph rg;
    rc_build(k, &r, &rg, xdt);
    if (mutate) mutate(&rg);
    float *got[3] = {0};
    int64_t n[3];
    eng_status st = rc_run(k, &rg, got, n);
    cr_assert_neq(st, ENG_STATUS_OK, "expected an error containing \"%s\"", needle);
    cr_assert(strstr(eng_last_error(), needle), "error \"%s\" lacks \"%s\"", eng_last_error(), needle);
    for (int i = 0; i < 3; i++) free(got[i]);
    eng_graph_free(&rg.g);
    rc_data_free(&r);
}

static void bad_w_shape(rgraph *rg) { rg->feeds[1].dims[2] += 1; rg->g->values[rg->g->inputs[1]].dims[2] += 1; }
static void bad_r_shape(rgraph *rg) { rg->feeds[2].dims[1] -= 4; rg->g->values[rg->g->inputs[2]].dims[1] -= 4; }
static void bad_hidden_attr(rgraph *rg) { rg->g->nodes[0].attrs[0].i = 9; }
static void bad_direction(rgraph *rg) {
    eng_attr a = {.name = "direction", .type = ENG_ATTR_STRING, .s = "sideways", .s_len = 8};
    eng_node_add_attr(rg->g, 0, &a);
}
static void bad_activation(rgraph *rg) {
    const char *acts[3] = {"Sigmoid", "Tanh", "Swish"};
    eng_attr a = {.name = "activations", .type = ENG_ATTR_STRINGS, .strings = (char **)acts, .n = 3};
    eng_node_add_attr(rg->g, 0, &a);
}
static void bad_h0_shape(rgraph *rg) {
    for (int i = 0; i < rg->nfeeds; i++)
        if (!strcmp(rg->g->values[rg->g->inputs[i]].name, "initial_h")) {
            rg->feeds[i].dims[1] += 1;
            rg->g->values[rg->g->inputs[i]].dims[1] += 1;
        }
}

Test(rnn, bad_inputs) {
    rcase k = {.op = "LSTM", .S = 3, .B = 2, .I = 4, .H = 5, .has_b = 1, .has_h0 = 1};
    expect_plan_error(&k, bad_w_shape, ENG_DTYPE_F32, "input 'W': expected shape [1,20,4] (num_directions, 4*hidden_size, input_size), got [1,20,5]");
    expect_plan_error(&k, bad_r_shape, ENG_DTYPE_F32, "input 'R'");
    expect_plan_error(&k, bad_hidden_attr, ENG_DTYPE_F32, "attribute 'hidden_size' is 9");
    expect_plan_error(&k, bad_direction, ENG_DTYPE_F32, "direction");
    expect_plan_error(&k, bad_activation, ENG_DTYPE_F32, "unknown activation 'Swish'");
    expect_plan_error(&k, bad_h0_shape, ENG_DTYPE_F32, "input 'initial_h': expected shape [1,2,5]");
    expect_plan_error(&k, NULL, ENG_DTYPE_F16, "input 'X': expected dtype float32, got float16");
    rcase g = {.op = "GRU", .dir = "bidirectional", .S = 3, .B = 2, .I = 4, .H = 5, .has_b = 1};
    expect_plan_error(&g, bad_w_shape, ENG_DTYPE_F32, "input 'W': expected shape [2,15,4] (num_directions, 3*hidden_size, input_size)");
}

Test(rnn, sequence_lens_out_of_range) {
    rcase k = {.op = "GRU", .S = 4, .B = 3, .I = 2, .H = 3, .has_lens = 1, .lens = {4, 5, 1}};
    rdata r;
    rc_data(&k, &r);
    rgraph rg;
    rc_build(&k, &r, &rg, ENG_DTYPE_F32);
    float *got[3] = {0};
    int64_t n[3];
    eng_status st = rc_run(&k, &rg, got, n);
    cr_assert_eq(st, ENG_STATUS_INVALID_ARGUMENT, "status %d: %s", st, eng_last_error());
    cr_assert(strstr(eng_last_error(), "batch row 1 has length 5, outside [0, 4]"), "error: %s", eng_last_error());
    r.lens[1] = -1;
    st = rc_run(&k, &rg, got, n);
    cr_assert(st != ENG_STATUS_OK && strstr(eng_last_error(), "batch row 1 has length -1"), "error: %s", eng_last_error());
    eng_graph_free(&rg.g);
    rc_data_free(&r);
}
