/* grad-nn.c - gradient rules of MatMul, Gemm, Conv, pools, BatchNormalization, LayerNormalization and the
 * loss ops SoftmaxCrossEntropyLoss / NegativeLogLikelihoodLoss.
 *
 * Gemm's gradients are Gemms (trans flags chosen so no Transpose is needed); the rest emit the internal
 * com.tensord ops of engine/ops/grad.c, carrying the forward node's attributes. Outputs of a multi-output
 * gradient op that no input needs are omitted, and the kernels skip them.
 */
#include <stdio.h>
#include <string.h>

#include "grad-impl.h"

#define IN(i) eng_grad_in(c, i)
#define OUT(j) eng_grad_out(c, j)
#define CHECK(v)                                                                                                   \
    do {                                                                                                           \
        if ((v) < 0) return eng_grad_failed();                                                                     \
    } while (0)

/* Emit op(in) with the forward's attributes and one output per input i in want[] (outputs for unneeded inputs
 * omitted); dx[want[j]] = output j. */
static eng_status multi(eng_grad_ctx *c, const char *op, const int *in, int nin, const int *want, int nout) {
    int outs[8];
    for (int j = 0; j < nout; j++) outs[j] = want[j] >= 0 && c->need[want[j]] ? -1 : -2;
    int n = eng_grad_emit(c, op, "com.tensord", in, nin, outs, nout);
    CHECK(n);
    ENG_TRY(eng_grad_copy_attrs(c, n));
    for (int j = 0; j < nout; j++)
        if (outs[j] >= 0) c->dx[want[j]] = outs[j];
    return ENG_STATUS_OK;
}

static eng_status g_matmul(eng_grad_ctx *c) {
    int in[3] = {c->dy[0], IN(0), IN(1)}, want[2] = {0, 1};
    return multi(c, "MatMulGrad", in, 3, want, 2);
}

/* Y = alpha * A' B' + beta * C with A' = transA ? A^T : A, B' likewise. */
static eng_status gemm(eng_grad_ctx *c, int a, int b, int ta, int tb, float alpha, int *out) {
    int in[2] = {a, b};
    *out = -1;
    int n = eng_grad_emit(c, "Gemm", "", in, 2, out, 1);
    CHECK(n);
    if (ta) ENG_TRY(eng_grad_attr_int(c, n, "transA", 1));
    if (tb) ENG_TRY(eng_grad_attr_int(c, n, "transB", 1));
    if (alpha != 1.0f) ENG_TRY(eng_grad_attr_float(c, n, "alpha", alpha));
    return ENG_STATUS_OK;
}

static eng_status g_gemm(eng_grad_ctx *c) {
    const eng_node *f = eng_grad_fwd(c);
    int ta = eng_node_attr_int(f, "transA", 0) != 0, tb = eng_node_attr_int(f, "transB", 0) != 0;
    float alpha = eng_node_attr_float(f, "alpha", 1.0f), beta = eng_node_attr_float(f, "beta", 1.0f);
    int dy = c->dy[0], A = IN(0), B = IN(1);
    if (c->need[0]) { /* dA' = alpha dy B'^T */
        if (!ta) ENG_TRY(gemm(c, dy, B, 0, !tb, alpha, &c->dx[0]));
        else ENG_TRY(gemm(c, B, dy, tb, 1, alpha, &c->dx[0]));
    }
    if (c->need[1]) { /* dB' = alpha A'^T dy */
        if (!tb) ENG_TRY(gemm(c, A, dy, !ta, 0, alpha, &c->dx[1]));
        else ENG_TRY(gemm(c, dy, A, 1, ta, alpha, &c->dx[1]));
    }
    if (c->need[2]) {
        int g = dy;
        if (beta != 1.0f) CHECK(g = eng_grad_bin(c, "Mul", dy, eng_grad_const(c, beta, IN(2))));
        CHECK(c->dx[2] = eng_grad_rts(c, g, IN(2)));
    }
    return ENG_STATUS_OK;
}

static eng_status g_conv(eng_grad_ctx *c) {
    int in[3] = {c->dy[0], IN(0), IN(1)}, want[3] = {0, 1, 2};
    return multi(c, "ConvGrad", in, 3, want, eng_grad_fwd(c)->nin > 2 && IN(2) >= 0 ? 3 : 2);
}

static eng_status g_pool(eng_grad_ctx *c) {
    char op[64];
    snprintf(op, sizeof op, "%sGrad", eng_grad_fwd(c)->op_type);
    int in[2] = {c->dy[0], IN(0)}, want[1] = {0};
    return multi(c, op, in, 2, want, 1);
}

/* BatchNormalization: training mode (batch statistics) when the node computes them. */
static eng_status g_batchnorm(eng_grad_ctx *c) {
    const eng_node *f = eng_grad_fwd(c);
    int training;
    if (c->g->opset >= 14) training = eng_node_attr_int(f, "training_mode", 0) != 0;
    else if (c->g->opset < 7) training = eng_node_attr_int(f, "is_test", 0) == 0 && f->nout > 1;
    else training = f->nout > 1;
    int in[5] = {c->dy[0], IN(0), IN(1), IN(3), IN(4)}, outs[3];
    for (int j = 0; j < 3; j++) outs[j] = c->need[j] ? -1 : -2;
    if (outs[0] == -2) outs[0] = -1; /* dx is always produced */
    int n = eng_grad_emit(c, "BatchNormalizationGrad", "com.tensord", in, 5, outs, 3);
    CHECK(n);
    ENG_TRY(eng_grad_attr_float(c, n, "epsilon", eng_node_attr_float(&c->g->nodes[c->node], "epsilon", 1e-5f)));
    ENG_TRY(eng_grad_attr_int(c, n, "training_mode", training));
    for (int j = 0; j < 3; j++)
        if (c->need[j]) c->dx[j] = outs[j];
    return ENG_STATUS_OK;
}

static eng_status g_layernorm(eng_grad_ctx *c) {
    int in[3] = {c->dy[0], IN(0), IN(1)}, outs[3];
    outs[0] = -1;
    outs[1] = c->need[1] ? -1 : -2;
    outs[2] = c->need[2] ? -1 : -2;
    int n = eng_grad_emit(c, "LayerNormalizationGrad", "com.tensord", in, 3, outs, 3);
    CHECK(n);
    ENG_TRY(eng_grad_copy_attrs(c, n));
    if (c->need[0]) c->dx[0] = outs[0];
    for (int i = 1; i <= 2; i++)
        if (c->need[i]) CHECK(c->dx[i] = eng_grad_rts(c, outs[i], IN(i)));
    return ENG_STATUS_OK;
}

/* Losses: dscores from dloss (and, for SCE, the gradient of the log_prob output). */
static eng_status g_loss(eng_grad_ctx *c) {
    const eng_node *f = eng_grad_fwd(c);
    int sce = !strcmp(f->op_type, "SoftmaxCrossEntropyLoss");
    int dl = c->dy[0];
    if (dl < 0) CHECK(dl = eng_grad_fill(c, OUT(0), 0.0));
    int in[5] = {dl, IN(0), IN(1), f->nin > 2 ? IN(2) : -1, sce && f->nout > 1 ? c->dy[1] : -1};
    int nin = in[4] >= 0 ? 5 : in[3] >= 0 ? 4 : 3, want[1] = {0};
    return multi(c, sce ? "SoftmaxCrossEntropyLossGrad" : "NegativeLogLikelihoodLossGrad", in, nin, want, 1);
}

const eng_grad_rule eng_grad_rules_nn[] = {
    {"MatMul", g_matmul, 3},
    {"Gemm", g_gemm, 7},
    {"Conv", g_conv, 7},
    {"MaxPool", g_pool, 1},
    {"AveragePool", g_pool, 1},
    {"GlobalAveragePool", g_pool, 1},
    {"GlobalMaxPool", g_pool, 1},
    {"BatchNormalization", g_batchnorm, 7},
    {"LayerNormalization", g_layernorm, 7},
    {"SoftmaxCrossEntropyLoss", g_loss, 1},
    {"NegativeLogLikelihoodLoss", g_loss, 1},
    {NULL},
};
