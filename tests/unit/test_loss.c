/* test_loss.c - every loss of engine/train/loss.h appended to small graphs and run through a session, against a
 * direct double-precision C reference on random data (logits and probabilities); the automatic from-logits
 * path for models ending in Softmax/Sigmoid (the graph must read the Softmax input); accuracy metrics; the
 * opset-dependent node forms; error messages. Gradient sanity through eng_autodiff (analytic for sparse CCE,
 * finite differences for every loss) runs when engine/train/autodiff.c is present at build time, else is skipped. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/train/autodiff.h"
#include "engine/ir/graph.h"
#include "engine/train/loss.h"
#include "engine/plan/session.h"

#ifndef HAVE_AUTODIFF /* -DHAVE_AUTODIFF=0 forces the skip */
#if __has_include("../../engine/train/autodiff.c")
#define HAVE_AUTODIFF 1
#else
#define HAVE_AUTODIFF 0
#endif
#endif

#define N 6
#define C 5
#define K 4 /* features of the MatMul model */

static uint64_t rs = 42;
static double urand(void) { /* [-1, 1) */
    rs = rs * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(rs >> 11) / (double)(1ULL << 53) * 2.0 - 1.0;
}

/* ---- graph building ---- */

static int val(eng_graph *g, const char *name, eng_dtype dt, int ndim, const int64_t *dims) {
    int v = eng_graph_add_value(g, name);
    g->values[v].dtype = dt;
    g->values[v].ndim = ndim;
    for (int i = 0; i < ndim; i++) g->values[v].dims[i] = dims[i];
    return v;
}

static void push(int **a, int *n, int v) {
    *a = realloc(*a, (size_t)(*n + 1) * sizeof(int));
    (*a)[(*n)++] = v;
}

/* x [N, C] -> act ("" for none, "Softmax", "Sigmoid", "LogSoftmax") -> output "pred". */
static eng_graph *act_graph(const char *act, int64_t opset, int rank3) {
    eng_graph *g = eng_graph_new();
    g->opset = opset;
    int64_t d2[2] = {-1, C}, d3[3] = {-1, 2, C};
    int x = val(g, "x", ENG_DTYPE_F32, rank3 ? 3 : 2, rank3 ? d3 : d2);
    push(&g->inputs, &g->ninputs, x);
    int out = x;
    if (act[0]) {
        out = val(g, "pred", ENG_DTYPE_F32, rank3 ? 3 : 2, rank3 ? d3 : d2);
        eng_graph_add_node(g, "act", act, "", &x, 1, &out, 1);
    }
    push(&g->outputs, &g->noutputs, out);
    return g;
}

/* x [N, K] @ W [K, C] -> act -> "pred"; W an initializer (the parameter) */
__attribute__((unused)) static eng_graph *matmul_graph(const char *act, const float *w) {
    eng_graph *g = eng_graph_new();
    g->opset = 17;
    int x = val(g, "x", ENG_DTYPE_F32, 2, (int64_t[]){-1, K});
    push(&g->inputs, &g->ninputs, x);
    int wv = val(g, "W", ENG_DTYPE_F32, 2, (int64_t[]){K, C});
    eng_tensor *t = calloc(1, sizeof *t);
    *t = (eng_tensor){.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {K, C}};
    t->data = eng_alloc(K * C * sizeof(float));
    memcpy(t->data, w, K * C * sizeof(float));
    eng_value_set_init(g, wv, t);
    int z = val(g, "z", ENG_DTYPE_F32, 2, (int64_t[]){-1, C});
    int in[2] = {x, wv};
    eng_graph_add_node(g, "mm", "MatMul", "", in, 2, &z, 1);
    int out = z;
    if (act[0]) {
        out = val(g, "pred", ENG_DTYPE_F32, 2, (int64_t[]){-1, C});
        eng_graph_add_node(g, "act", act, "", &z, 1, &out, 1);
    }
    push(&g->outputs, &g->noutputs, out);
    return g;
}

static const eng_node *find_op(const eng_graph *g, const char *op) {
    for (int i = 0; i < g->nnodes; i++)
        if (!strcmp(g->nodes[i].op_type, op)) return &g->nodes[i];
    return NULL;
}

static int out_index(const eng_graph *g, const char *name) {
    for (int i = 0; i < g->noutputs; i++)
        if (!strcmp(g->values[g->outputs[i]].name, name)) return i;
    return -1;
}

typedef struct result {
    double loss, acc;
    int has_acc;
} result;

/* Append the loss to g (consumed), run once with x and label, return loss and accuracy. */
static result run_loss(eng_graph *g, eng_loss_kind kind, int from_logits, const float *x, int64_t xrows, int xcols,
                       const void *label, int rank3) {
    const char *lname = NULL;
    cr_assert_eq(eng_loss_append(g, kind, g->values[g->outputs[0]].name, from_logits, &lname), ENG_STATUS_OK, "%s",
                 eng_last_error());
    cr_assert_str_eq(lname, "loss");
    int nin = g->ninputs;
    cr_assert_str_eq(g->values[g->inputs[nin - 1]].name, "label");
    eng_session *s = NULL;
    cr_assert_eq(eng_session_new_graph(g, NULL, &s), ENG_STATUS_OK, "%s", eng_last_error());
    const eng_graph *sg = eng_session_graph(s);
    eng_tensor in[2] = {{.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {xrows, xcols}, .data = (void *)x}};
    if (rank3) in[0] = (eng_tensor){.dtype = ENG_DTYPE_F32, .ndim = 3, .dims = {xrows / 2, 2, xcols}, .data = (void *)x};
    if (kind == ENG_LOSS_SPARSE_CCE) {
        in[1] = (eng_tensor){.dtype = ENG_DTYPE_I64, .ndim = 1, .dims = {xrows}, .data = (void *)label};
        if (rank3) in[1] = (eng_tensor){.dtype = ENG_DTYPE_I64, .ndim = 2, .dims = {xrows / 2, 2}, .data = (void *)label};
    } else {
        in[1] = in[0];
        in[1].data = (void *)label;
    }
    const char *names[2] = {"x", "label"};
    eng_tensor outs[8];
    cr_assert_leq(sg->noutputs, 8);
    cr_assert_eq(eng_session_run(s, 2, names, in, outs), ENG_STATUS_OK, "%s", eng_last_error());
    result r = {0};
    int li = out_index(sg, "loss"), ai = out_index(sg, "metric/accuracy");
    cr_assert_geq(li, 0);
    cr_assert_eq(eng_tensor_numel(&outs[li]), 1, "loss must be a scalar");
    r.loss = ((float *)outs[li].data)[0];
    if (ai >= 0) {
        cr_assert_eq(ai, li + 1, "metric after the loss");
        cr_assert_eq(outs[ai].dtype, ENG_DTYPE_F32);
        cr_assert_eq(eng_tensor_numel(&outs[ai]), 1);
        r.acc = ((float *)outs[ai].data)[0];
        r.has_acc = 1;
    }
    eng_session_free(&s);
    return r;
}

/* ---- references ---- */

static void softmax_row(const float *z, int c, double *p) {
    double mx = z[0], s = 0;
    for (int j = 1; j < c; j++) mx = fmax(mx, z[j]);
    for (int j = 0; j < c; j++) s += (p[j] = exp(z[j] - mx));
    for (int j = 0; j < c; j++) p[j] /= s;
}

static double clipd(double p) { return fmin(fmax(p, 1e-7), 1 - 1e-7); }

static int argmax(const float *z, int c) {
    int b = 0;
    for (int j = 1; j < c; j++)
        if (z[j] > z[b]) b = j;
    return b;
}

static void rand_logits(float *z, int n, double scale) {
    for (int i = 0; i < n; i++) z[i] = (float)(scale * urand());
}

static void rand_probs(float *p, int rows, int c) {
    for (int i = 0; i < rows; i++) {
        double s = 0;
        for (int j = 0; j < c; j++) s += (p[i * c + j] = (float)(0.05 + fabs(urand())));
        for (int j = 0; j < c; j++) p[i * c + j] = (float)(p[i * c + j] / s);
    }
}

static void rand_labels(int64_t *y, int n) {
    for (int i = 0; i < n; i++) y[i] = (int64_t)((urand() + 1) * 0.5 * C) % C;
}

static double ref_sparse_logits(const float *z, const int64_t *y, int rows, double *acc) {
    double l = 0, p[C];
    int ok = 0;
    for (int i = 0; i < rows; i++) {
        softmax_row(z + i * C, C, p);
        double mx = z[i * C], s = 0;
        for (int j = 1; j < C; j++) mx = fmax(mx, z[i * C + j]);
        for (int j = 0; j < C; j++) s += exp(z[i * C + j] - mx);
        l += mx + log(s) - z[i * C + y[i]];
        ok += argmax(z + i * C, C) == y[i];
    }
    *acc = (double)ok / rows;
    return l / rows;
}

#define CHECK_CLOSE(got, want, tol) \
    cr_assert(fabs((got) - (want)) <= (tol) * fmax(1.0, fabs(want)), "%s = %.9g, reference %.9g", #got, (double)(got), \
              (double)(want))

/* ---- sparse categorical cross-entropy ---- */

Test(loss, sparse_cce_from_logits) {
    float z[N * C];
    int64_t y[N];
    rand_logits(z, N * C, 3.0);
    rand_labels(y, N);
    double acc, want = ref_sparse_logits(z, y, N, &acc);
    result r = run_loss(act_graph("", 17, 0), ENG_LOSS_SPARSE_CCE, 1, z, N, C, y, 0);
    CHECK_CLOSE(r.loss, want, 1e-6);
    cr_assert(r.has_acc);
    CHECK_CLOSE(r.acc, acc, 1e-7);
}

Test(loss, sparse_cce_softmax_model_takes_stable_path) {
    float z[N * C];
    int64_t y[N];
    rand_logits(z, N * C, 3.0);
    rand_labels(y, N);
    /* row 0 saturates: its true class has probability e^-80, which clipping would turn into -log(1e-7) = 16.1 */
    z[y[0]] = -40.0f;
    z[(y[0] + 1) % C] = 40.0f;
    double acc, want = ref_sparse_logits(z, y, N, &acc);
    cr_assert_gt(want, 80.0 / N, "the test needs a saturated softmax output");
    eng_graph *g = act_graph("Softmax", 17, 0);
    const char *lname;
    cr_assert_eq(eng_loss_append(g, ENG_LOSS_SPARSE_CCE, "pred", -1, &lname), ENG_STATUS_OK, "%s", eng_last_error());
    const eng_node *sce = find_op(g, "SoftmaxCrossEntropyLoss");
    cr_assert_not_null(sce, "auto from_logits must use SoftmaxCrossEntropyLoss");
    cr_assert_str_eq(g->values[sce->inputs[0]].name, "x", "the loss must read the Softmax input");
    cr_assert_null(find_op(g, "NegativeLogLikelihoodLoss"));
    cr_assert_null(find_op(g, "Clip"));
    /* the metric is not on the loss path: nothing feeds the loss from ArgMax */
    const eng_node *am = find_op(g, "ArgMax");
    cr_assert_not_null(am);
    cr_assert_str_eq(g->values[am->inputs[0]].name, "pred");
    eng_graph_free(&g);
    result r = run_loss(act_graph("Softmax", 17, 0), ENG_LOSS_SPARSE_CCE, -1, z, N, C, y, 0);
    CHECK_CLOSE(r.loss, want, 1e-6);
    CHECK_CLOSE(r.acc, acc, 1e-7);
    /* LogSoftmax-ending models too */
    r = run_loss(act_graph("LogSoftmax", 17, 0), ENG_LOSS_SPARSE_CCE, -1, z, N, C, y, 0);
    CHECK_CLOSE(r.loss, want, 1e-6);
}

Test(loss, sparse_cce_from_probabilities_clipped) {
    float p[N * C];
    int64_t y[N];
    rand_probs(p, N, C);
    rand_labels(y, N);
    p[0 * C + y[0]] = 0.0f; /* clipped to 1e-7 */
    double l = 0;
    int ok = 0;
    for (int i = 0; i < N; i++) {
        l += -log(clipd(p[i * C + y[i]]));
        ok += argmax(p + i * C, C) == y[i];
    }
    eng_graph *g = act_graph("", 17, 0);
    result r = run_loss(g, ENG_LOSS_SPARSE_CCE, -1, p, N, C, y, 0);
    CHECK_CLOSE(r.loss, l / N, 1e-6);
    CHECK_CLOSE(r.acc, (double)ok / N, 1e-7);
    /* forced probabilities on a Softmax model: reads the Softmax output through Clip/Log/NLL */
    eng_graph *g2 = act_graph("Softmax", 17, 0);
    const char *lname;
    cr_assert_eq(eng_loss_append(g2, ENG_LOSS_SPARSE_CCE, "pred", 0, &lname), ENG_STATUS_OK);
    cr_assert_not_null(find_op(g2, "NegativeLogLikelihoodLoss"));
    cr_assert_null(find_op(g2, "SoftmaxCrossEntropyLoss"));
    eng_graph_free(&g2);
}

Test(loss, sparse_cce_rank3_sequence) {
    float z[N * C];
    int64_t y[N];
    rand_logits(z, N * C, 2.0);
    rand_labels(y, N);
    double acc, want = ref_sparse_logits(z, y, N, &acc);
    result r = run_loss(act_graph("", 17, 1), ENG_LOSS_SPARSE_CCE, 1, z, N, C, y, 1);
    CHECK_CLOSE(r.loss, want, 1e-6);
    CHECK_CLOSE(r.acc, acc, 1e-7);
}

/* ---- categorical cross-entropy (one-hot / soft labels) ---- */

static void soft_labels(float *t, int64_t *hard) {
    rand_probs(t, N, C);
    for (int i = 0; i < N; i++) hard[i] = argmax(t + i * C, C);
}

Test(loss, cce_from_logits_and_softmax_model) {
    float z[N * C], t[N * C];
    int64_t hard[N];
    rand_logits(z, N * C, 5.0);
    soft_labels(t, hard);
    double l = 0, p[C];
    int ok = 0;
    for (int i = 0; i < N; i++) {
        softmax_row(z + i * C, C, p);
        for (int j = 0; j < C; j++) l -= t[i * C + j] * log(p[j]);
        ok += argmax(z + i * C, C) == hard[i];
    }
    result r = run_loss(act_graph("", 17, 0), ENG_LOSS_CCE, 1, z, N, C, t, 0);
    CHECK_CLOSE(r.loss, l / N, 1e-6);
    CHECK_CLOSE(r.acc, (double)ok / N, 1e-7);
    eng_graph *g = act_graph("Softmax", 17, 0);
    const char *lname;
    cr_assert_eq(eng_loss_append(g, ENG_LOSS_CCE, "pred", -1, &lname), ENG_STATUS_OK);
    const eng_node *ls = find_op(g, "LogSoftmax");
    cr_assert_not_null(ls);
    cr_assert_str_eq(g->values[ls->inputs[0]].name, "x");
    eng_graph_free(&g);
    r = run_loss(act_graph("Softmax", 17, 0), ENG_LOSS_CCE, -1, z, N, C, t, 0);
    CHECK_CLOSE(r.loss, l / N, 1e-6);
}

Test(loss, cce_from_probabilities_opset12) {
    float p[N * C], t[N * C];
    int64_t hard[N];
    rand_probs(p, N, C);
    soft_labels(t, hard);
    double l = 0;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < C; j++) l -= t[i * C + j] * log(clipd(p[i * C + j]));
    eng_graph *g = act_graph("", 12, 0);
    const char *lname;
    cr_assert_eq(eng_loss_append(g, ENG_LOSS_CCE, "x", -1, &lname), ENG_STATUS_OK);
    const eng_node *rsum = find_op(g, "ReduceSum");
    cr_assert_eq(rsum->nin, 1, "opset 12 ReduceSum takes axes as an attribute");
    cr_assert_not_null(eng_node_attr(rsum, "axes"));
    eng_graph_free(&g);
    result r = run_loss(act_graph("", 12, 0), ENG_LOSS_CCE, -1, p, N, C, t, 0);
    CHECK_CLOSE(r.loss, l / N, 1e-6);
}

/* ---- binary cross-entropy ---- */

static double ref_bce_logits(const float *z, const float *y, int n, double *acc) {
    double l = 0;
    int ok = 0;
    for (int i = 0; i < n; i++) {
        double p = 1 / (1 + exp(-(double)z[i]));
        l += -(y[i] * log(p) + (1 - y[i]) * log1p(-p));
        ok += (z[i] > 0) == (y[i] > 0.5);
    }
    *acc = (double)ok / n;
    return l / n;
}

Test(loss, bce_from_logits_and_sigmoid_model) {
    float z[N * C], y[N * C];
    rand_logits(z, N * C, 4.0);
    for (int i = 0; i < N * C; i++) y[i] = urand() > 0 ? 1.0f : 0.0f;
    double acc, want = ref_bce_logits(z, y, N * C, &acc);
    result r = run_loss(act_graph("", 17, 0), ENG_LOSS_BCE, 1, z, N, C, y, 0);
    CHECK_CLOSE(r.loss, want, 1e-6);
    CHECK_CLOSE(r.acc, acc, 1e-7);
    r = run_loss(act_graph("Sigmoid", 17, 0), ENG_LOSS_BCE, -1, z, N, C, y, 0);
    CHECK_CLOSE(r.loss, want, 1e-6);
    CHECK_CLOSE(r.acc, acc, 1e-7);
    eng_graph *g = act_graph("Sigmoid", 17, 0);
    const char *lname;
    cr_assert_eq(eng_loss_append(g, ENG_LOSS_BCE, "pred", -1, &lname), ENG_STATUS_OK);
    const eng_node *abs_ = find_op(g, "Abs");
    cr_assert_not_null(abs_);
    cr_assert_str_eq(g->values[abs_->inputs[0]].name, "x", "BCE must read the Sigmoid input");
    eng_graph_free(&g);
    /* large logits: stable */
    z[0] = 80.0f, y[0] = 0.0f, z[1] = -90.0f, y[1] = 1.0f;
    want = ref_bce_logits(z, y, N * C, &acc);
    r = run_loss(act_graph("Sigmoid", 17, 0), ENG_LOSS_BCE, -1, z, N, C, y, 0);
    CHECK_CLOSE(r.loss, want, 1e-6);
}

Test(loss, bce_from_probabilities_opset10) {
    float p[N * C], y[N * C];
    for (int i = 0; i < N * C; i++) p[i] = (float)(0.5 + 0.5 * urand()), y[i] = (float)((urand() + 1) / 2);
    p[0] = 0.0f, p[1] = 1.0f; /* clipped */
    double l = 0;
    int ok = 0;
    for (int i = 0; i < N * C; i++) {
        double q = clipd(p[i]);
        l += -(y[i] * log(q) + (1 - y[i]) * log(1 - q));
        ok += (p[i] > 0.5 ? 1.0f : 0.0f) == y[i];
    }
    for (int i = 0; i < 4; i++) y[i] = (float)(i & 1); /* some exact matches for accuracy */
    ok = 0, l = 0;
    for (int i = 0; i < N * C; i++) {
        double q = clipd(p[i]);
        l += -(y[i] * log(q) + (1 - y[i]) * log(1 - q));
        ok += (p[i] > 0.5 ? 1.0f : 0.0f) == y[i];
    }
    eng_graph *g = act_graph("", 10, 0);
    const char *lname;
    cr_assert_eq(eng_loss_append(g, ENG_LOSS_BCE, "x", -1, &lname), ENG_STATUS_OK);
    const eng_node *clip = find_op(g, "Clip");
    cr_assert_eq(clip->nin, 1, "opset 10 Clip takes min/max attributes");
    eng_graph_free(&g);
    result r = run_loss(act_graph("", 10, 0), ENG_LOSS_BCE, -1, p, N, C, y, 0);
    CHECK_CLOSE(r.loss, l / (N * C), 1e-5);
    CHECK_CLOSE(r.acc, (double)ok / (N * C), 1e-7);
}

/* ---- regression losses ---- */

Test(loss, mse) {
    float p[N * C], y[N * C];
    rand_logits(p, N * C, 2.0);
    rand_logits(y, N * C, 2.0);
    double l = 0;
    for (int i = 0; i < N * C; i++) l += ((double)p[i] - y[i]) * ((double)p[i] - y[i]);
    result r = run_loss(act_graph("", 17, 0), ENG_LOSS_MSE, -1, p, N, C, y, 0);
    CHECK_CLOSE(r.loss, l / (N * C), 1e-6);
    cr_assert_not(r.has_acc, "no accuracy for regression losses");
}

Test(loss, cosine_similarity) {
    float p[N * C], y[N * C];
    rand_logits(p, N * C, 2.0);
    rand_logits(y, N * C, 2.0);
    for (int j = 0; j < C; j++) y[j] = 0; /* a zero row: similarity 0, not NaN */
    double l = 0;
    for (int i = 0; i < N; i++) {
        double a = 0, b = 0, d = 0;
        for (int j = 0; j < C; j++) a += (double)p[i * C + j] * p[i * C + j], b += (double)y[i * C + j] * y[i * C + j],
                                    d += (double)p[i * C + j] * y[i * C + j];
        l -= d / (sqrt(fmax(a, 1e-12)) * sqrt(fmax(b, 1e-12)));
    }
    result r = run_loss(act_graph("", 17, 0), ENG_LOSS_COSINE, -1, p, N, C, y, 0);
    CHECK_CLOSE(r.loss, l / N, 1e-6);
    cr_assert_not(r.has_acc);
}

/* ---- names and errors ---- */

Test(loss, parse_and_names) {
    cr_assert_eq(eng_loss_parse("sparse_categorical_crossentropy"), ENG_LOSS_SPARSE_CCE);
    cr_assert_eq(eng_loss_parse("categorical_crossentropy"), ENG_LOSS_CCE);
    cr_assert_eq(eng_loss_parse("binary_crossentropy"), ENG_LOSS_BCE);
    cr_assert_eq(eng_loss_parse("mse"), ENG_LOSS_MSE);
    cr_assert_eq(eng_loss_parse("mean_squared_error"), ENG_LOSS_MSE);
    cr_assert_eq(eng_loss_parse("cosine_similarity"), ENG_LOSS_COSINE);
    cr_assert_eq(eng_loss_parse("hinge"), -1);
    for (int k = 0; k <= ENG_LOSS_COSINE; k++) cr_assert_eq(eng_loss_parse(eng_loss_name(k)), k);
}

Test(loss, errors_name_loss_and_shape) {
    eng_graph *g = eng_graph_new();
    g->opset = 17;
    int x = val(g, "scores", ENG_DTYPE_F32, 1, (int64_t[]){-1});
    push(&g->inputs, &g->ninputs, x);
    push(&g->outputs, &g->noutputs, x);
    const char *lname = NULL;
    int nv = g->nvalues, nn = g->nnodes;
    cr_assert_eq(eng_loss_append(g, ENG_LOSS_SPARSE_CCE, "scores", -1, &lname), ENG_STATUS_INVALID_ARGUMENT);
    const char *e = eng_last_error();
    cr_assert(strstr(e, "sparse_categorical_crossentropy") && strstr(e, "scores") && strstr(e, "[-1]"), "%s", e);
    cr_assert_eq(g->nvalues, nv, "graph untouched on error");
    cr_assert_eq(g->nnodes, nn);
    cr_assert_eq(eng_loss_append(g, ENG_LOSS_MSE, "nope", -1, &lname), ENG_STATUS_NOT_FOUND);
    cr_assert(strstr(eng_last_error(), "nope") && strstr(eng_last_error(), "mean_squared_error"), "%s", eng_last_error());
    int lbl = val(g, "label", ENG_DTYPE_F32, 1, (int64_t[]){-1});
    (void)lbl;
    cr_assert_eq(eng_loss_append(g, ENG_LOSS_MSE, "scores", -1, &lname), ENG_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(eng_last_error(), "label"), "%s", eng_last_error());
    eng_graph_free(&g);

    /* label shape mismatch is caught when the session validates the label */
    g = act_graph("", 17, 0);
    cr_assert_eq(eng_loss_append(g, ENG_LOSS_MSE, "x", -1, &lname), ENG_STATUS_OK);
    eng_session *s = NULL;
    cr_assert_eq(eng_session_new_graph(g, NULL, &s), ENG_STATUS_OK, "%s", eng_last_error());
    float xs[N * C] = {0}, ys[N * 3] = {0};
    eng_tensor in[2] = {{.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {N, C}, .data = xs},
                        {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {N, 3}, .data = ys}};
    const char *names[2] = {"x", "label"};
    eng_tensor outs[4];
    cr_assert_neq(eng_session_run(s, 2, names, in, outs), ENG_STATUS_OK);
    cr_assert(strstr(eng_last_error(), "label"), "%s", eng_last_error());
    eng_session_free(&s);
}

Test(loss, constants_are_not_parameters) {
    /* no float initializers are added (eng_trainable_params would otherwise train the loss's constants) */
    for (int k = 0; k <= ENG_LOSS_COSINE; k++) {
        eng_graph *g = act_graph(k == ENG_LOSS_BCE ? "Sigmoid" : "Softmax", 17, 0);
        const char *lname;
        cr_assert_eq(eng_loss_append(g, k, "pred", -1, &lname), ENG_STATUS_OK, "%s", eng_last_error());
        for (int v = 0; v < g->nvalues; v++) cr_assert_null(g->values[v].init, "%s: value %s", eng_loss_name(k), g->values[v].name);
        eng_graph_free(&g);
    }
}

/* ---- gradients through eng_autodiff ---- */

#if HAVE_AUTODIFF
/* Build matmul model + loss + backward; return a session (W fed as an input). */
static eng_session *grad_session(eng_loss_kind kind, const char *act, const float *w) {
    eng_graph *g = matmul_graph(act, w);
    cr_assert_eq(eng_graph_set_training(g, NULL, 0), ENG_STATUS_OK, "%s", eng_last_error());
    const char *lname = NULL;
    cr_assert_eq(eng_loss_append(g, kind, "pred", -1, &lname), ENG_STATUS_OK, "%s", eng_last_error());
    const char *params[1] = {"W"};
    eng_grad_spec spec = {.loss = lname, .params = params, .nparams = 1};
    cr_assert_eq(eng_autodiff(g, &spec), ENG_STATUS_OK, "%s: %s", eng_loss_name(kind), eng_last_error());
    eng_session *s = NULL;
    cr_assert_eq(eng_session_new_graph(g, NULL, &s), ENG_STATUS_OK, "%s", eng_last_error());
    return s;
}

static double grad_run(eng_session *s, const float *x, const float *w, const void *label, eng_loss_kind kind,
                       float *grad) {
    eng_tensor in[3] = {{.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {N, K}, .data = (void *)x},
                        {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {K, C}, .data = (void *)w},
                        {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {N, C}, .data = (void *)label}};
    if (kind == ENG_LOSS_SPARSE_CCE) in[2] = (eng_tensor){.dtype = ENG_DTYPE_I64, .ndim = 1, .dims = {N}, .data = (void *)label};
    const char *names[3] = {"x", "W", "label"};
    const eng_graph *g = eng_session_graph(s);
    eng_tensor outs[16];
    cr_assert_leq(g->noutputs, 16);
    cr_assert_eq(eng_session_run(s, 3, names, in, outs), ENG_STATUS_OK, "%s", eng_last_error());
    int li = out_index(g, "loss"), gi = out_index(g, "grad/W");
    cr_assert_geq(li, 0);
    cr_assert_geq(gi, 0, "autodiff must add grad/W");
    if (grad) memcpy(grad, outs[gi].data, K * C * sizeof(float));
    return ((float *)outs[li].data)[0];
}

Test(loss, grad_sparse_cce_softmax_model_analytic) {
    float x[N * K], w[K * C];
    int64_t y[N];
    rand_logits(x, N * K, 1.0);
    rand_logits(w, K * C, 1.0);
    rand_labels(y, N);
    eng_session *s = grad_session(ENG_LOSS_SPARSE_CCE, "Softmax", w);
    float gw[K * C];
    grad_run(s, x, w, y, ENG_LOSS_SPARSE_CCE, gw);
    /* dL/dW = x^T (softmax(xW) - onehot(y)) / N */
    double ref[K * C] = {0};
    for (int i = 0; i < N; i++) {
        float z[C];
        double p[C];
        for (int j = 0; j < C; j++) {
            double a = 0;
            for (int k = 0; k < K; k++) a += (double)x[i * K + k] * w[k * C + j];
            z[j] = (float)a;
        }
        softmax_row(z, C, p);
        p[y[i]] -= 1;
        for (int k = 0; k < K; k++)
            for (int j = 0; j < C; j++) ref[k * C + j] += x[i * K + k] * p[j] / N;
    }
    for (int i = 0; i < K * C; i++) cr_assert_float_eq(gw[i], ref[i], 1e-5, "dW[%d] = %g, reference %g", i, gw[i], ref[i]);
    eng_session_free(&s);
}

/* central differences on every weight, in float: |analytic - numeric| <= 2e-2 * max|grad| */
Test(loss, grad_finite_differences_every_loss) {
    for (int k = 0; k <= ENG_LOSS_COSINE; k++) {
        const char *act = k == ENG_LOSS_BCE ? "Sigmoid" : (k == ENG_LOSS_SPARSE_CCE || k == ENG_LOSS_CCE) ? "Softmax" : "";
        if (!act[0]) act = "Tanh";
        float x[N * K], w[K * C], yf[N * C];
        int64_t yi[N];
        rand_logits(x, N * K, 1.0);
        rand_logits(w, K * C, 1.0);
        rand_labels(yi, N);
        if (k == ENG_LOSS_CCE) {
            int64_t h[N];
            soft_labels(yf, h);
        } else if (k == ENG_LOSS_BCE) {
            for (int i = 0; i < N * C; i++) yf[i] = urand() > 0 ? 1.0f : 0.0f;
        } else {
            rand_logits(yf, N * C, 1.0);
        }
        const void *lab = k == ENG_LOSS_SPARSE_CCE ? (const void *)yi : (const void *)yf;
        eng_session *s = grad_session(k, act, w);
        float gw[K * C];
        grad_run(s, x, w, lab, k, gw);
        double gmax = 0;
        for (int i = 0; i < K * C; i++) gmax = fmax(gmax, fabs(gw[i]));
        cr_assert_gt(gmax, 1e-4, "%s: gradient is all zeros", eng_loss_name(k));
        const float h = 1e-2f;
        for (int i = 0; i < K * C; i++) {
            float wp[K * C], wm[K * C];
            memcpy(wp, w, sizeof w);
            memcpy(wm, w, sizeof w);
            wp[i] += h, wm[i] -= h;
            double lp = grad_run(s, x, wp, lab, k, NULL), lm = grad_run(s, x, wm, lab, k, NULL);
            double num = (lp - lm) / (2 * h);
            cr_assert(fabs(num - gw[i]) <= 2e-2 * gmax, "%s: dW[%d] analytic %g, numeric %g", eng_loss_name(k), i, gw[i], num);
        }
        eng_session_free(&s);
    }
}
#else
Test(loss, grad_through_autodiff) { cr_skip_test("engine/train/autodiff.c not present at build time"); }
#endif
