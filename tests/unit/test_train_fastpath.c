/* test_train_fastpath.c - the training step's fast paths, each against a float64 reference or the path it replaces:
 *  - eng_graph_fuse_act_ops turns Gelu's erf and tanh chains (as exporters write them, scalars as Constant nodes)
 *    into one Gelu node, leaves a chain whose inner value is used elsewhere alone, and the gradients through the
 *    fused graph match the unfused graph's;
 *  - a ReduceToShape that reduces nothing is an alias in a static plan (no kernel runs), one that reduces is not;
 *  - the vectorised, threaded gradient kernels on tensors large enough to take their threaded paths: GeluGrad (erf
 *    and tanh), ErfGrad over [-8, 8] (both sides of erf's split), LayerNormalizationGrad (dx, dscale, dbias) and
 *    Softmax/LogSoftmax gradients over the last axis and an inner axis;
 *  - BatchNormalization's training-mode statistics and BatchNormalizationGrad (float lanes folded into double) on
 *    data with a large mean.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/ir/graph.h"
#include "engine/plan/fuse.h"
#include "engine/plan/session.h"
#include "engine/train/autodiff.h"
#include "graph-fixture.h"

/* A scalar written as exporters write it: a Constant node with a tensor attribute. */
static int constant(eng_graph *g, const char *name, float x) {
    int out = val(g, name);
    int n = eng_graph_add_node(g, name, "Constant", "", NULL, 0, &out, 1);
    float *d = eng_alloc(sizeof(float));
    *d = x;
    eng_attr a = {.name = "value", .type = ENG_ATTR_TENSOR, .t = {.dtype = ENG_DTYPE_F32, .ndim = 0, .data = d}};
    cr_assert_eq(eng_node_add_attr(g, n, &a), ENG_STATUS_OK);
    eng_free(d);
    return out;
}

static int node(eng_graph *g, const char *name, const char *type, const char *domain, const int *in, int nin) {
    int out = val(g, name);
    cr_assert_geq(eng_graph_add_node(g, name, type, domain, in, nin, &out, 1), 0);
    return out;
}

static int bin(eng_graph *g, const char *name, const char *type, int a, int b) {
    int in[2] = {a, b};
    return node(g, name, type, "", in, 2);
}

static float frand(unsigned *s, float lo, float hi) {
    *s = *s * 1664525u + 1013904223u;
    return lo + (hi - lo) * (float)((*s >> 8) & 0xffffff) / 16777216.0f;
}

static int count_op(const eng_graph *g, const char *op) {
    int k = 0;
    for (int i = 0; i < g->nnodes; i++) k += !strcmp(g->nodes[i].op_type, op);
    return k;
}

enum { R = 6, K = 8, H = 16 };
static float W1[K * H], W2[H];

/* h = x @ W1; a = gelu(h) spelled out (erf: 0.5 * h * (1 + erf(h / sqrt2)); tanh: 0.5 * h * (1 + tanh(sqrt(2/pi) *
 * (h + 0.044715 h^3)))); loss = sum(a @ W2). With leak, the erf (or tanh) value is also a graph output. */
static eng_graph *gelu_graph(int tanh_form, int leak) {
    eng_graph *g = eng_graph_new();
    g->opset = 17;
    unsigned s = 7;
    for (int i = 0; i < K * H; i++) W1[i] = frand(&s, -1, 1);
    for (int i = 0; i < H; i++) W2[i] = frand(&s, -1, 1);
    int x = input_f32(g, "x", 2, (int64_t[]){R, K});
    int w1 = init_f32(g, "W1", 2, (int64_t[]){K, H}, W1), w2 = init_f32(g, "W2", 2, (int64_t[]){H, 1}, W2);
    int h = bin(g, "h", "MatMul", x, w1), inner;
    if (!tanh_form) {
        inner = node(g, "erf", "Erf", "", (int[]){bin(g, "scaled", "Div", h, constant(g, "sqrt2", 1.41421356f))}, 1);
    } else {
        int cube = bin(g, "cube", "Pow", h, constant(g, "three", 3.0f));
        int poly = bin(g, "poly", "Add", h, bin(g, "cube_k", "Mul", cube, constant(g, "k", 0.044715f)));
        inner = node(g, "tanh", "Tanh", "", (int[]){bin(g, "arg", "Mul", poly, constant(g, "c", 0.7978845608f))}, 1);
    }
    int onep = bin(g, "onep", "Add", inner, constant(g, "one", 1.0f));
    int a = bin(g, "act", "Mul", bin(g, "half_h", "Mul", h, constant(g, "half", 0.5f)), onep);
    int y = bin(g, "y", "MatMul", a, w2);
    int loss = val(g, "loss");
    int rs = eng_graph_add_node(g, "loss", "ReduceSum", "", &y, 1, &loss, 1);
    eng_attr kd = {.name = "keepdims", .type = ENG_ATTR_INT, .i = 0};
    eng_node_add_attr(g, rs, &kd);
    list_add(&g->outputs, &g->noutputs, loss);
    if (leak) list_add(&g->outputs, &g->noutputs, inner);
    return g;
}

/* grad/W1 of the graph, fused into Gelu first or not. */
static void gelu_grads(int tanh_form, int fuse, float *dw1, int *ngelu) {
    eng_graph *g = gelu_graph(tanh_form, 0);
    if (fuse) cr_assert_eq(eng_graph_fuse_act_ops(g), ENG_STATUS_OK, "%s", eng_last_error());
    *ngelu = count_op(g, "Gelu");
    const char *params[] = {"W1", "W2"};
    eng_grad_spec spec = {.loss = "loss", .params = params, .nparams = 2};
    cr_assert_eq(eng_autodiff(g, &spec), ENG_STATUS_OK, "%s", eng_last_error());
    eng_session *s = NULL;
    eng_session_opts so = {.no_fuse = 1, .nthreads = 1};
    cr_assert_eq(eng_session_new_graph(g, &so, &s), ENG_STATUS_OK, "%s", eng_last_error());
    float xd[R * K];
    unsigned seed = 11;
    for (int i = 0; i < R * K; i++) xd[i] = frand(&seed, -3, 3);
    eng_tensor in = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {R, K}, .data = xd}, outs[4];
    const char *names[] = {"x"};
    cr_assert_eq(eng_session_run(s, 1, names, &in, outs), ENG_STATUS_OK, "%s", eng_last_error());
    const eng_graph *sg = eng_session_graph(s);
    int found = 0;
    for (int i = 0; i < sg->noutputs; i++)
        if (!strcmp(sg->values[sg->outputs[i]].name, "grad/W1")) {
            memcpy(dw1, outs[i].data, sizeof(float) * K * H);
            found = 1;
        }
    cr_assert(found);
    eng_session_free(&s);
}

Test(train_fastpath, gelu_chains_become_one_gelu_with_the_same_gradients) {
    for (int tf = 0; tf < 2; tf++) {
        float ref[K * H], got[K * H];
        int n0, n1;
        gelu_grads(tf, 0, ref, &n0);
        gelu_grads(tf, 1, got, &n1);
        cr_assert_eq(n0, 0);
        cr_assert_eq(n1, 1, "%s form: one Gelu node", tf ? "tanh" : "erf");
        double scale = 0;
        for (int i = 0; i < K * H; i++) scale = fmax(scale, fabs(ref[i]));
        cr_assert_gt(scale, 0.1);
        for (int i = 0; i < K * H; i++)
            cr_expect_leq(fabs(got[i] - ref[i]), 2e-5 * scale, "%s form: dW1[%d] fused %g unfused %g", tf ? "tanh" : "erf",
                          i, got[i], ref[i]);
    }
    /* the fused graph's Gelu carries the form */
    eng_graph *g = gelu_graph(1, 0);
    cr_assert_eq(eng_graph_fuse_act_ops(g), ENG_STATUS_OK);
    for (int i = 0; i < g->nnodes; i++)
        if (!strcmp(g->nodes[i].op_type, "Gelu")) {
            cr_expect_str_eq(eng_node_attr_str(&g->nodes[i], "approximate", "none"), "tanh");
            cr_expect_eq(g->nodes[i].nin, 1);
            cr_expect_str_eq(g->values[g->nodes[i].inputs[0]].name, "h");
            cr_expect_str_eq(g->values[g->nodes[i].outputs[0]].name, "act");
        }
    eng_graph_free(&g);
}

Test(train_fastpath, a_chain_with_a_value_used_outside_stays) {
    eng_graph *g = gelu_graph(0, 1);
    int before = g->nnodes - count_op(g, "Constant");
    cr_assert_eq(eng_graph_fuse_act_ops(g), ENG_STATUS_OK);
    cr_expect_eq(count_op(g, "Gelu"), 0);
    cr_expect_eq(count_op(g, "Erf"), 1);
    cr_expect_eq(g->nnodes, before, "only the Constant nodes went (hoisted to initializers)");
    eng_graph_free(&g);
}

/* y1 = ReduceToShape(a, like_same) (nothing to reduce), y2 = ReduceToShape(a, like_row) (column sums). */
Test(train_fastpath, reduce_to_shape_without_reduction_is_an_alias) {
    eng_graph *g = eng_graph_new();
    g->opset = 17;
    int a = input_f32(g, "a", 2, (int64_t[]){3, 4}), same = input_f32(g, "same", 2, (int64_t[]){3, 4});
    int row = input_f32(g, "row", 1, (int64_t[]){4});
    int y1 = node(g, "y1", "ReduceToShape", "com.tensord", (int[]){a, same}, 2);
    int y2 = node(g, "y2", "ReduceToShape", "com.tensord", (int[]){a, row}, 2);
    int y3 = bin(g, "y3", "Add", y1, y1);
    list_add(&g->outputs, &g->noutputs, y2);
    list_add(&g->outputs, &g->noutputs, y3);
    eng_session *s = NULL;
    eng_session_opts so = {.no_fuse = 1, .nthreads = 1};
    cr_assert_eq(eng_session_new_graph(g, &so, &s), ENG_STATUS_OK, "%s", eng_last_error());
    float ad[12], z[12] = {0};
    for (int i = 0; i < 12; i++) ad[i] = (float)i - 3.5f;
    eng_tensor in[3] = {{.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {3, 4}, .data = ad},
                        {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {3, 4}, .data = z},
                        {.dtype = ENG_DTYPE_F32, .ndim = 1, .dims = {4}, .data = z}};
    const char *names[] = {"a", "same", "row"};
    eng_tensor outs[2];
    cr_assert_eq(eng_session_run(s, 3, names, in, outs), ENG_STATUS_OK, "%s", eng_last_error());
    const float *r2 = outs[0].data, *r3 = outs[1].data;
    for (int j = 0; j < 4; j++) cr_expect_float_eq(r2[j], ad[j] + ad[4 + j] + ad[8 + j], 1e-6);
    for (int i = 0; i < 12; i++) cr_expect_float_eq(r3[i], 2 * ad[i], 1e-6);
    eng_plan_stats st;
    eng_session_last_stats(s, &st);
    cr_expect_eq(st.steps, 2, "the reducing ReduceToShape and the Add run; the other is an alias (got %d)", st.steps);
    eng_session_free(&s);
}

/* ---- gradient kernels against float64 ---- */

/* Runs one com.tensord gradient node over the given float inputs with 2 threads; outputs into outs. */
static void run_node(const char *op, const char *attr_s, const char *attr_v, int axis, int nin, eng_tensor *in,
                     int nout, eng_tensor *outs, eng_session **sp) {
    eng_graph *g = eng_graph_new();
    g->opset = 17;
    int iv[5], ov[3];
    const char *inames[] = {"i0", "i1", "i2", "i3", "i4"}, *onames[] = {"o0", "o1", "o2"};
    cr_assert_leq(nin, 5);
    for (int i = 0; i < nin; i++) iv[i] = input_f32(g, inames[i], in[i].ndim, in[i].dims);
    for (int j = 0; j < nout; j++) ov[j] = val(g, onames[j]);
    int n = eng_graph_add_node(g, op, op, "com.tensord", iv, nin, ov, nout);
    if (attr_s) {
        eng_attr a = {.name = (char *)attr_s, .type = ENG_ATTR_STRING, .s = (char *)attr_v, .s_len = strlen(attr_v)};
        eng_node_add_attr(g, n, &a);
    }
    if (axis != INT32_MIN) {
        eng_attr a = {.name = "axis", .type = ENG_ATTR_INT, .i = axis};
        eng_node_add_attr(g, n, &a);
    }
    for (int j = 0; j < nout; j++) list_add(&g->outputs, &g->noutputs, ov[j]);
    eng_session_opts so = {.no_fuse = 1, .nthreads = 2};
    cr_assert_eq(eng_session_new_graph(g, &so, sp), ENG_STATUS_OK, "%s: %s", op, eng_last_error());
    cr_assert_eq(eng_session_run(*sp, nin, inames, in, outs), ENG_STATUS_OK, "%s: %s", op, eng_last_error());
}

static eng_tensor t2(int64_t r, int64_t c, float *d) {
    return (eng_tensor){.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {r, c}, .data = d};
}

static void check_close(const char *what, const float *got, const double *ref, int64_t n, double rtol) {
    double scale = 0, worst = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
    for (int64_t i = 0; i < n; i++) {
        double e = fabs(got[i] - ref[i]);
        if (!(e <= worst)) worst = e, at = i;
    }
    cr_expect_leq(worst, rtol * fmax(scale, 1e-30), "%s: worst |err| %g at %lld (got %g, want %g), scale %g", what, worst,
                  (long long)at, got[at], ref[at], scale);
}

enum { NE = 1 << 18 };

Test(train_fastpath, activation_gradients_match_float64, .timeout = 60) {
    float *x = malloc(NE * sizeof *x), *dy = malloc(NE * sizeof *dy);
    double *ref = malloc(NE * sizeof *ref);
    unsigned s = 3;
    for (int i = 0; i < NE; i++) x[i] = -8.0f + 16.0f * (float)i / NE, dy[i] = frand(&s, -1, 1);
    const char *ops[] = {"GeluGrad", "GeluGrad", "ErfGrad"};
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < NE; i++) {
            double v = x[i], d;
            if (k == 0) {
                d = 0.5 * (1 + erf(v / sqrt(2.0))) + v * exp(-0.5 * v * v) / sqrt(2 * M_PI);
            } else if (k == 1) {
                double c = sqrt(2 / M_PI), t = tanh(c * (v + 0.044715 * v * v * v));
                d = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * c * (1 + 3 * 0.044715 * v * v);
            } else {
                d = 2 / sqrt(M_PI) * exp(-v * v);
            }
            ref[i] = dy[i] * d;
        }
        eng_tensor in[2] = {t2(NE / 256, 256, dy), t2(NE / 256, 256, x)}, out;
        eng_session *sess = NULL;
        run_node(ops[k], k == 1 ? "approximate" : NULL, "tanh", INT32_MIN, 2, in, 1, &out, &sess);
        check_close(k == 0 ? "GeluGrad (erf)" : k == 1 ? "GeluGrad (tanh)" : "ErfGrad", out.data, ref, NE, 1e-5);
        eng_session_free(&sess);
    }
    free(x);
    free(dy);
    free(ref);
}

Test(train_fastpath, layer_norm_gradient_matches_float64, .timeout = 60) {
    enum { ROWS = 1024, COLS = 96 };
    float *x = malloc(ROWS * COLS * sizeof *x), *dy = malloc(ROWS * COLS * sizeof *dy), sc[COLS];
    double *rdx = calloc(ROWS * COLS, sizeof *rdx), rds[COLS] = {0}, rdb[COLS] = {0};
    unsigned s = 5;
    for (int i = 0; i < ROWS * COLS; i++) x[i] = frand(&s, -2, 3), dy[i] = frand(&s, -1, 1);
    for (int j = 0; j < COLS; j++) sc[j] = frand(&s, 0.5f, 1.5f);
    const double eps = 1e-5;
    for (int r = 0; r < ROWS; r++) {
        const float *xr = x + r * COLS, *g = dy + r * COLS;
        double m = 0, v = 0, mg = 0, mgx = 0;
        for (int j = 0; j < COLS; j++) m += xr[j];
        m /= COLS;
        for (int j = 0; j < COLS; j++) v += (xr[j] - m) * (xr[j] - m);
        double inv = 1 / sqrt(v / COLS + eps);
        for (int j = 0; j < COLS; j++) {
            double xh = (xr[j] - m) * inv;
            mg += g[j] * sc[j], mgx += g[j] * sc[j] * xh;
            rds[j] += g[j] * xh, rdb[j] += g[j];
        }
        for (int j = 0; j < COLS; j++)
            rdx[r * COLS + j] = inv * (g[j] * sc[j] - mg / COLS - (xr[j] - m) * inv * mgx / COLS);
    }
    eng_tensor in[3] = {t2(ROWS, COLS, dy), t2(ROWS, COLS, x), {.dtype = ENG_DTYPE_F32, .ndim = 1, .dims = {COLS}, .data = sc}};
    eng_tensor out[3];
    eng_session *sess = NULL;
    run_node("LayerNormalizationGrad", NULL, NULL, -1, 3, in, 3, out, &sess);
    check_close("LayerNormalizationGrad dx", out[0].data, rdx, ROWS * COLS, 1e-4);
    check_close("LayerNormalizationGrad dscale", out[1].data, rds, COLS, 1e-4);
    check_close("LayerNormalizationGrad dbias", out[2].data, rdb, COLS, 1e-5);
    eng_session_free(&sess);
    free(x);
    free(dy);
    free(rdx);
}

Test(train_fastpath, softmax_gradients_match_float64, .timeout = 60) {
    enum { O = 512, NN = 128, IN = 3 };
    float *y = malloc(O * NN * IN * sizeof *y), *dy = malloc(O * NN * IN * sizeof *dy);
    double *ref = malloc(O * NN * IN * sizeof *ref);
    unsigned s = 9;
    for (int lg = 0; lg < 2; lg++)
        for (int inner = 1; inner <= IN; inner += IN - 1) { /* last axis (contiguous), then an inner axis */
            int64_t n = (int64_t)O * NN * inner;
            for (int64_t o = 0; o < O; o++)
                for (int64_t j = 0; j < inner; j++) { /* y a real softmax (or log-softmax) along the axis */
                    double z[NN], m = -1e30, se = 0;
                    for (int k = 0; k < NN; k++) z[k] = frand(&s, -4, 4), m = fmax(m, z[k]);
                    for (int k = 0; k < NN; k++) se += exp(z[k] - m);
                    for (int k = 0; k < NN; k++) {
                        int64_t i = (o * NN + k) * inner + j;
                        y[i] = (float)(lg ? z[k] - m - log(se) : exp(z[k] - m) / se);
                        dy[i] = frand(&s, -1, 1);
                    }
                }
            for (int64_t o = 0; o < O; o++)
                for (int64_t j = 0; j < inner; j++) {
                    double sum = 0;
                    for (int k = 0; k < NN; k++) {
                        int64_t i = (o * NN + k) * inner + j;
                        sum += lg ? dy[i] : (double)dy[i] * y[i];
                    }
                    for (int k = 0; k < NN; k++) {
                        int64_t i = (o * NN + k) * inner + j;
                        ref[i] = lg ? dy[i] - exp(y[i]) * sum : y[i] * (dy[i] - sum);
                    }
                }
            eng_tensor in[2] = {{.dtype = ENG_DTYPE_F32, .ndim = 3, .dims = {O, NN, inner}, .data = dy},
                                {.dtype = ENG_DTYPE_F32, .ndim = 3, .dims = {O, NN, inner}, .data = y}},
                       out;
            eng_session *sess = NULL;
            run_node(lg ? "LogSoftmaxGrad" : "SoftmaxGrad", NULL, NULL, 1, 2, in, 1, &out, &sess);
            char what[64];
            snprintf(what, sizeof what, "%s, inner %d", lg ? "LogSoftmaxGrad" : "SoftmaxGrad", inner);
            check_close(what, out.data, ref, n, 1e-5);
            eng_session_free(&sess);
        }
    free(y);
    free(dy);
    free(ref);
}

/* BatchNormalization in training mode (opset 15: outputs y, running mean, running var) on float32 with a large
 * mean and a small spread (where a one-pass sum of squares would cancel), against float64. */
Test(train_fastpath, batchnorm_training_statistics_match_float64, .timeout = 60) {
    enum { N = 8, C = 5, S = 20 * 20 };
    static float x[N * C * S];
    float sc[C], bi[C], rm[C], rv[C];
    unsigned s = 13;
    for (int i = 0; i < N * C * S; i++) x[i] = 100.0f + (float)(i % 7) + frand(&s, -0.5f, 0.5f);
    for (int c = 0; c < C; c++) sc[c] = frand(&s, 0.5f, 1.5f), bi[c] = frand(&s, -1, 1), rm[c] = 0.1f * c, rv[c] = 1 + c;
    const double eps = 1e-5, mom = 0.9;
    double mean[C], var[C];
    for (int c = 0; c < C; c++) {
        double sum = 0, q = 0;
        for (int b = 0; b < N; b++)
            for (int i = 0; i < S; i++) sum += x[(b * C + c) * S + i];
        mean[c] = sum / (N * S);
        for (int b = 0; b < N; b++)
            for (int i = 0; i < S; i++) q += (x[(b * C + c) * S + i] - mean[c]) * (x[(b * C + c) * S + i] - mean[c]);
        var[c] = q / (N * S);
    }
    double *ry = malloc(sizeof(double) * N * C * S), rrm[C], rrv[C];
    for (int b = 0; b < N; b++)
        for (int c = 0; c < C; c++)
            for (int i = 0; i < S; i++) {
                int k = (b * C + c) * S + i;
                ry[k] = (x[k] - mean[c]) / sqrt(var[c] + eps) * sc[c] + bi[c];
            }
    for (int c = 0; c < C; c++) rrm[c] = rm[c] * mom + mean[c] * (1 - mom), rrv[c] = rv[c] * mom + var[c] * (1 - mom);

    eng_graph *g = eng_graph_new();
    g->opset = 15;
    int in[5] = {input_f32(g, "x", 4, (int64_t[]){N, C, 20, 20}), init_f32(g, "scale", 1, (int64_t[]){C}, sc),
                 init_f32(g, "bias", 1, (int64_t[]){C}, bi), init_f32(g, "mean", 1, (int64_t[]){C}, rm),
                 init_f32(g, "var", 1, (int64_t[]){C}, rv)};
    int out[3] = {val(g, "y"), val(g, "running_mean"), val(g, "running_var")};
    int n = eng_graph_add_node(g, "bn", "BatchNormalization", "", in, 5, out, 3);
    eng_attr tm = {.name = "training_mode", .type = ENG_ATTR_INT, .i = 1};
    eng_node_add_attr(g, n, &tm);
    for (int j = 0; j < 3; j++) list_add(&g->outputs, &g->noutputs, out[j]);
    eng_session *sess = NULL;
    eng_session_opts so = {.no_fuse = 1, .nthreads = 2};
    cr_assert_eq(eng_session_new_graph(g, &so, &sess), ENG_STATUS_OK, "%s", eng_last_error());
    eng_tensor xin = {.dtype = ENG_DTYPE_F32, .ndim = 4, .dims = {N, C, 20, 20}, .data = x}, outs[3];
    const char *names[] = {"x"};
    cr_assert_eq(eng_session_run(sess, 1, names, &xin, outs), ENG_STATUS_OK, "%s", eng_last_error());
    check_close("BatchNormalization (training) y", outs[0].data, ry, N * C * S, 2e-5);
    check_close("BatchNormalization (training) running mean", outs[1].data, rrm, C, 1e-6);
    check_close("BatchNormalization (training) running var", outs[2].data, rrv, C, 1e-5);
    eng_session_free(&sess);
    free(ry);
}

/* BatchNormalizationGrad in training mode (batch statistics recomputed) on data with a large mean, against
 * float64: dx, dscale, dbias. */
Test(train_fastpath, batchnorm_gradient_matches_float64, .timeout = 60) {
    enum { N = 8, C = 5, S = 20 * 20, T = N * C * S };
    static float x[T], dy[T];
    float sc[C], rm[C], rv[C];
    unsigned s = 17;
    for (int i = 0; i < T; i++) x[i] = 50.0f + (float)(i % 5) + frand(&s, -0.5f, 0.5f), dy[i] = frand(&s, -1, 1);
    for (int c = 0; c < C; c++) sc[c] = frand(&s, 0.5f, 1.5f), rm[c] = 0, rv[c] = 1;
    const double eps = 1e-5, cnt = N * S;
    double *rdx = malloc(sizeof(double) * T), rds[C], rdb[C];
    for (int c = 0; c < C; c++) {
        double m = 0, v = 0, sdy = 0, sdyx = 0;
        for (int b = 0; b < N; b++)
            for (int i = 0; i < S; i++) m += x[(b * C + c) * S + i];
        m /= cnt;
        for (int b = 0; b < N; b++)
            for (int i = 0; i < S; i++) v += (x[(b * C + c) * S + i] - m) * (x[(b * C + c) * S + i] - m);
        v /= cnt;
        double inv = 1 / sqrt(v + eps);
        for (int b = 0; b < N; b++)
            for (int i = 0; i < S; i++) {
                int k = (b * C + c) * S + i;
                sdy += dy[k];
                sdyx += dy[k] * (x[k] - m) * inv;
            }
        rds[c] = sdyx, rdb[c] = sdy;
        for (int b = 0; b < N; b++)
            for (int i = 0; i < S; i++) {
                int k = (b * C + c) * S + i;
                rdx[k] = sc[c] * inv * (dy[k] - sdy / cnt - (x[k] - m) * inv * sdyx / cnt);
            }
    }
    eng_tensor t4 = {.dtype = ENG_DTYPE_F32, .ndim = 4, .dims = {N, C, 20, 20}};
    eng_tensor in[5] = {t4, t4, {.dtype = ENG_DTYPE_F32, .ndim = 1, .dims = {C}, .data = sc},
                        {.dtype = ENG_DTYPE_F32, .ndim = 1, .dims = {C}, .data = rm},
                        {.dtype = ENG_DTYPE_F32, .ndim = 1, .dims = {C}, .data = rv}};
    in[0].data = dy, in[1].data = x;
    eng_tensor out[3];
    eng_session *sess = NULL;
    run_node("BatchNormalizationGrad", NULL, NULL, INT32_MIN, 5, in, 3, out, &sess);
    check_close("BatchNormalizationGrad dx", out[0].data, rdx, T, 1e-4);
    check_close("BatchNormalizationGrad dscale", out[1].data, rds, C, 1e-4);
    check_close("BatchNormalizationGrad dbias", out[2].data, rdb, C, 1e-5);
    eng_session_free(&sess);
    free(rdx);
}
