/* test_autodiff.c - eng_autodiff on whole graphs: a 2-layer MLP with softmax cross-entropy against hand-derived
 * gradients (computed here in double, numpy-style), accumulation for a value used several times, zeros for a
 * parameter that does not reach the loss, the error for an op without a rule, and the training rewrite
 * (eng_graph_set_training) plus eng_trainable_params.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/train/autodiff.h"
#include "engine/ir/graph.h"
#include "engine/plan/session.h"
#include "kernels/krn-grad.h"
#include "graph-fixture.h"

static int init_i64(eng_graph *g, const char *name, int ndim, const int64_t *dims, const int64_t *data) {
    int v = val(g, name);
    eng_tensor *t = calloc(1, sizeof *t);
    t->dtype = ENG_DTYPE_I64;
    t->ndim = ndim;
    memcpy(t->dims, dims, (size_t)ndim * sizeof *dims);
    t->data = eng_alloc(eng_tensor_nbytes(t) + 8);
    memcpy(t->data, data, eng_tensor_nbytes(t));
    eng_value_set_init(g, v, t);
    return v;
}

static int op(eng_graph *g, const char *name, const char *type, int a, int b) {
    int ins[2] = {a, b}, out = val(g, name);
    eng_graph_add_node(g, name, type, "", ins, b < 0 ? 1 : 2, &out, 1);
    return out;
}

static int reduce_sum_all(eng_graph *g, const char *name, int x) {
    int out = val(g, name);
    int n = eng_graph_add_node(g, name, "ReduceSum", "", &x, 1, &out, 1);
    eng_attr kd = {.name = "keepdims", .type = ENG_ATTR_INT, .i = 0};
    eng_node_add_attr(g, n, &kd);
    return out;
}

static const float *output_named(eng_session *s, eng_tensor *outs, const char *name) {
    const eng_graph *g = eng_session_graph(s);
    for (int i = 0; i < g->noutputs; i++)
        if (!strcmp(g->values[g->outputs[i]].name, name)) return outs[i].data;
    cr_assert_fail("no output %s", name);
    return NULL;
}

enum { N = 4, D = 3, H = 5, C = 2 };
static float X[N * D], W1[D * H], B1[H], W2[H * C], B2[C];
static int64_t LAB[N] = {1, 0, 1, 1};

static void mlp_data(void) {
    uint64_t s = 42;
    float *arrs[5] = {X, W1, B1, W2, B2};
    int ns[5] = {N * D, D * H, H, H * C, C};
    for (int a = 0; a < 5; a++)
        for (int i = 0; i < ns[a]; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            arrs[a][i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2 - 1);
        }
}

/* x -> MatMul W1 -> Add b1 -> Relu -> MatMul W2 -> Add b2 -> SoftmaxCrossEntropyLoss(labels), mean. */
static eng_graph *mlp_graph(void) {
    eng_graph *g = eng_graph_new();
    g->opset = 17;
    int x = val(g, "x");
    g->values[x].dtype = ENG_DTYPE_F32;
    g->values[x].ndim = 2;
    g->values[x].dims[0] = N;
    g->values[x].dims[1] = D;
    list_add(&g->inputs, &g->ninputs, x);
    int w1 = init_f32(g, "W1", 2, (int64_t[]){D, H}, W1), b1 = init_f32(g, "b1", 1, (int64_t[]){H}, B1);
    int w2 = init_f32(g, "W2", 2, (int64_t[]){H, C}, W2), b2 = init_f32(g, "b2", 1, (int64_t[]){C}, B2);
    int lab = init_i64(g, "labels", 1, (int64_t[]){N}, LAB);
    int z1 = op(g, "z1", "Add", op(g, "mm1", "MatMul", x, w1), b1);
    int h = op(g, "h", "Relu", z1, -1);
    int logits = op(g, "logits", "Add", op(g, "mm2", "MatMul", h, w2), b2);
    int loss = op(g, "loss", "SoftmaxCrossEntropyLoss", logits, lab);
    list_add(&g->outputs, &g->noutputs, logits);
    (void)loss;
    return g;
}

Test(autodiff, mlp_matches_hand_derived_gradients) {
    mlp_data();
    eng_graph *g = mlp_graph();
    const char *params[4] = {"W1", "b1", "W2", "b2"};
    eng_grad_spec spec = {.loss = "loss", .params = params, .nparams = 4};
    cr_assert_eq(eng_autodiff(g, &spec), ENG_STATUS_OK, "%s", eng_last_error());
    /* outputs: logits (already), loss, then grad/<p> in order; params became inputs */
    cr_assert_eq(g->noutputs, 6);
    cr_assert_str_eq(g->values[g->outputs[1]].name, "loss");
    for (int i = 0; i < 4; i++) {
        char want[32];
        snprintf(want, sizeof want, "grad/%s", params[i]);
        cr_assert_str_eq(g->values[g->outputs[2 + i]].name, want);
    }
    cr_assert_eq(g->ninputs, 5);
    eng_session *s = NULL;
    eng_session_opts so = {.no_fuse = 1};
    cr_assert_eq(eng_session_new_graph(g, &so, &s), ENG_STATUS_OK, "%s", eng_last_error());
    eng_tensor in = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {N, D}, .data = X}, outs[6];
    const char *names[1] = {"x"};
    cr_assert_eq(eng_session_run(s, 1, names, &in, outs), ENG_STATUS_OK, "%s", eng_last_error());

    /* reference, in double */
    double z[N][H], h[N][H], lg[N][C], dl[N][C], dw2[H][C] = {{0}}, db2[C] = {0}, dz[N][H], dw1[D][H] = {{0}}, db1[H] = {0};
    double loss = 0;
    for (int n = 0; n < N; n++) {
        for (int j = 0; j < H; j++) {
            z[n][j] = B1[j];
            for (int k = 0; k < D; k++) z[n][j] += (double)X[n * D + k] * W1[k * H + j];
            h[n][j] = z[n][j] > 0 ? z[n][j] : 0;
        }
        double m = -1e30, se = 0;
        for (int c = 0; c < C; c++) {
            lg[n][c] = B2[c];
            for (int j = 0; j < H; j++) lg[n][c] += h[n][j] * W2[j * C + c];
            m = fmax(m, lg[n][c]);
        }
        for (int c = 0; c < C; c++) se += exp(lg[n][c] - m);
        loss += -(lg[n][LAB[n]] - m - log(se)) / N;
        for (int c = 0; c < C; c++) dl[n][c] = (exp(lg[n][c] - m) / se - (c == LAB[n])) / N;
    }
    for (int n = 0; n < N; n++) {
        for (int c = 0; c < C; c++) {
            db2[c] += dl[n][c];
            for (int j = 0; j < H; j++) dw2[j][c] += h[n][j] * dl[n][c];
        }
        for (int j = 0; j < H; j++) {
            double dh = 0;
            for (int c = 0; c < C; c++) dh += dl[n][c] * W2[j * C + c];
            dz[n][j] = z[n][j] > 0 ? dh : 0;
            db1[j] += dz[n][j];
            for (int k = 0; k < D; k++) dw1[k][j] += (double)X[n * D + k] * dz[n][j];
        }
    }
    const float *gl = output_named(s, outs, "loss");
    cr_assert_float_eq(gl[0], loss, 1e-5);
    const float *gw1 = output_named(s, outs, "grad/W1"), *gb1 = output_named(s, outs, "grad/b1");
    const float *gw2 = output_named(s, outs, "grad/W2"), *gb2 = output_named(s, outs, "grad/b2");
    for (int k = 0; k < D; k++)
        for (int j = 0; j < H; j++) cr_expect_float_eq(gw1[k * H + j], dw1[k][j], 1e-5, "dW1[%d][%d]", k, j);
    for (int j = 0; j < H; j++) cr_expect_float_eq(gb1[j], db1[j], 1e-5, "db1[%d]", j);
    for (int j = 0; j < H; j++)
        for (int c = 0; c < C; c++) cr_expect_float_eq(gw2[j * C + c], dw2[j][c], 1e-5, "dW2[%d][%d]", j, c);
    for (int c = 0; c < C; c++) cr_expect_float_eq(gb2[c], db2[c], 1e-5, "db2[%d]", c);

    /* feeding new weights (params are inputs) changes the gradients without re-planning */
    float w2b[H * C];
    for (int i = 0; i < H * C; i++) w2b[i] = 0;
    eng_tensor in2[2] = {in, {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {H, C}, .data = w2b}};
    const char *names2[2] = {"x", "W2"};
    cr_assert_eq(eng_session_run(s, 2, names2, in2, outs), ENG_STATUS_OK, "%s", eng_last_error());
    gw1 = output_named(s, outs, "grad/W1");
    for (int i = 0; i < D * H; i++) cr_expect_float_eq(gw1[i], 0.0f, 1e-7);
    eng_session_free(&s);
}

/* loss = sum(p * p + p + q0) with q unrelated: dp = 2p + 1 (three contributions summed), dq = 0. */
Test(autodiff, accumulates_and_zero_fills) {
    eng_graph *g = eng_graph_new();
    g->opset = 17;
    float pv[3] = {0.5f, -1.0f, 2.0f}, qv[2] = {3, 4};
    int p = init_f32(g, "p", 1, (int64_t[]){3}, pv), q = init_f32(g, "q", 1, (int64_t[]){2}, qv);
    int q2 = op(g, "q2", "Neg", q, -1);
    int l = reduce_sum_all(g, "loss", op(g, "t", "Add", op(g, "pp", "Mul", p, p), p));
    list_add(&g->outputs, &g->noutputs, q2);
    const char *params[2] = {"p", "q"};
    eng_grad_spec spec = {.loss = "loss", .params = params, .nparams = 2};
    cr_assert_eq(eng_autodiff(g, &spec), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(g->noutputs, 4); /* q2, loss (appended), grad/p, grad/q */
    cr_assert_eq(g->outputs[1], l);
    int sums = 0;
    for (int i = 0; i < g->nnodes; i++) sums += !strcmp(g->nodes[i].op_type, "Sum");
    cr_assert_geq(sums, 1, "contributions to p are summed");
    eng_session *s = NULL;
    eng_session_opts so = {.no_fuse = 1};
    cr_assert_eq(eng_session_new_graph(g, &so, &s), ENG_STATUS_OK, "%s", eng_last_error());
    eng_tensor outs[4];
    cr_assert_eq(eng_session_run(s, 0, NULL, NULL, outs), ENG_STATUS_OK, "%s", eng_last_error());
    const float *gp = output_named(s, outs, "grad/p"), *gq = output_named(s, outs, "grad/q");
    for (int i = 0; i < 3; i++) cr_expect_float_eq(gp[i], 2 * pv[i] + 1, 1e-6);
    cr_assert_eq(outs[3].ndim, 1);
    cr_assert_eq(outs[3].dims[0], 2);
    for (int i = 0; i < 2; i++) cr_expect_eq(gq[i], 0.0f);
    eng_session_free(&s);
}

Test(autodiff, missing_rule_names_node_and_op) {
    eng_graph *g = eng_graph_new();
    g->opset = 17;
    float pv[2] = {1, 2};
    int p = init_f32(g, "p", 1, (int64_t[]){2}, pv);
    reduce_sum_all(g, "loss", op(g, "my_sine", "Sin", p, -1));
    const char *params[1] = {"p"};
    eng_grad_spec spec = {.loss = "loss", .params = params, .nparams = 1};
    cr_assert_neq(eng_autodiff(g, &spec), ENG_STATUS_OK);
    cr_assert(strstr(eng_last_error(), "my_sine") && strstr(eng_last_error(), "Sin"), "%s", eng_last_error());
    eng_graph_free(&g);
}

Test(autodiff, bad_names_are_errors) {
    eng_graph *g = mlp_graph();
    const char *params[1] = {"nope"};
    eng_grad_spec spec = {.loss = "loss", .params = params, .nparams = 1};
    cr_assert_eq(eng_autodiff(g, &spec), ENG_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(eng_last_error(), "nope"), "%s", eng_last_error());
    spec.loss = "lossy";
    spec.nparams = 0;
    cr_assert_eq(eng_autodiff(g, &spec), ENG_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(eng_last_error(), "lossy"), "%s", eng_last_error());
    const char *xs[1] = {"x"};
    spec.loss = "loss";
    spec.params = xs;
    spec.nparams = 1;
    cr_assert_eq(eng_autodiff(g, &spec), ENG_STATUS_INVALID_ARGUMENT, "x is not an initializer");
    eng_graph_free(&g);
}

/* x -> Conv -> BatchNormalization -> Dropout -> ReduceSum: set_training exposes the bn_update outputs and rewrites Dropout;
 * trainable params exclude running stats and frozen prefixes; autodiff then runs through training BN + dropout. */
Test(autodiff, set_training_and_trainable_params) {
    eng_graph *g = eng_graph_new();
    g->opset = 15;
    float w[2 * 1 * 1 * 1] = {0.7f, -1.2f}, one[2] = {1, 1}, zero[2] = {0, 0}, sc[2] = {1.5f, 0.5f};
    int x = val(g, "x");
    g->values[x].dtype = ENG_DTYPE_F32;
    list_add(&g->inputs, &g->ninputs, x);
    int wv = init_f32(g, "conv.w", 4, (int64_t[]){2, 1, 1, 1}, w);
    int scale = init_f32(g, "bn.scale", 1, (int64_t[]){2}, sc), bias = init_f32(g, "bn.bias", 1, (int64_t[]){2}, zero);
    int mean = init_f32(g, "bn.mean", 1, (int64_t[]){2}, zero), var = init_f32(g, "bn.var", 1, (int64_t[]){2}, one);
    int cy = op(g, "conv", "Conv", x, wv);
    int bins[5] = {cy, scale, bias, mean, var}, by = val(g, "bn");
    eng_graph_add_node(g, "bn", "BatchNormalization", "", bins, 5, &by, 1);
    int dy = op(g, "drop", "Dropout", by, -1);
    int sq = op(g, "sq", "Mul", dy, dy);
    reduce_sum_all(g, "loss", sq);
    list_add(&g->outputs, &g->noutputs, by);

    const char **names = NULL;
    int n = 0;
    const char *freeze[1] = {"conv."};
    cr_assert_eq(eng_trainable_params(g, freeze, 1, &names, &n), ENG_STATUS_OK);
    cr_assert_eq(n, 2);
    cr_assert_str_eq(names[0], "bn.scale");
    cr_assert_str_eq(names[1], "bn.bias");
    free(names);
    cr_assert_eq(eng_trainable_params(g, NULL, 0, &names, &n), ENG_STATUS_OK);
    cr_assert_eq(n, 3);
    cr_assert_eq(eng_graph_set_training(g, NULL, 0), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(eng_graph_set_training(g, NULL, 0), ENG_STATUS_OK, "idempotent: %s", eng_last_error());
    cr_assert_geq(eng_graph_find_value(g, "bn_update/bn.mean"), 0);
    cr_assert_geq(eng_graph_find_value(g, "bn_update/bn.var"), 0);
    cr_assert_eq(g->noutputs, 3);
    int drop = g->values[dy].producer;
    cr_assert_str_eq(g->nodes[drop].op_type, "TrainingDropout");
    eng_grad_spec spec = {.loss = "loss", .params = names, .nparams = n};
    cr_assert_eq(eng_autodiff(g, &spec), ENG_STATUS_OK, "%s", eng_last_error());
    free(names);
    eng_session *s = NULL;
    eng_session_opts so = {.no_fuse = 1};
    cr_assert_eq(eng_session_new_graph(g, &so, &s), ENG_STATUS_OK, "%s", eng_last_error());
    float xv[2 * 1 * 2 * 2] = {1, 2, 3, 4, -1, 0, 2, 5};
    eng_tensor in = {.dtype = ENG_DTYPE_F32, .ndim = 4, .dims = {2, 1, 2, 2}, .data = xv}, outs[8];
    const char *inames[1] = {"x"};
    krn_grad_dropout_set_step(1);
    cr_assert_eq(eng_session_run(s, 1, inames, &in, outs), ENG_STATUS_OK, "%s", eng_last_error());
    /* running stats: momentum 0.9 (ONNX/Keras): 0.9 * 0 + 0.1 * batch mean of channel 0 = 0.7 * mean(x) */
    const float *rm = output_named(s, outs, "bn_update/bn.mean");
    cr_expect_float_eq(rm[0], 0.1 * 0.7 * 2.0, 1e-6);
    cr_expect_float_eq(rm[1], 0.1 * -1.2 * 2.0, 1e-6);
    float l1 = *output_named(s, outs, "loss"), g1 = output_named(s, outs, "grad/conv.w")[0];
    cr_assert_eq(eng_session_run(s, 1, inames, &in, outs), ENG_STATUS_OK, "%s", eng_last_error());
    cr_expect_eq(*output_named(s, outs, "loss"), l1, "same step, same mask");
    cr_expect_eq(output_named(s, outs, "grad/conv.w")[0], g1);
    eng_session_free(&s);
}
