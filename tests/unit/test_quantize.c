/* test_quantize.c - unit tests of engine/quant (node selection, the percentile and entropy thresholds,
 * calibration, the QDQ rewrite) and engine/train/eval.c (scoring and comparing predictions), on a small
 * x -> Gemm -> Relu -> MatMul graph built here and data written as .npy files into a mkdtemp directory.
 * The rewritten graph is run by the engine and checked against the float graph within the error the chosen
 * scales allow.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/ir/npy.h"
#include "engine/plan/session.h"
#include "engine/quant/quant.h"
#include "engine/train/eval.h"

static char g_dir[256];

static void setup(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/test_quantize.XXXXXX");
    cr_assert(mkdtemp(g_dir) != NULL);
}
static void teardown(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) {}
}
TestSuite(quant, .init = setup, .fini = teardown);

#define NIN 6
#define NHID 5
#define NOUT 3

static void add_init(eng_graph *g, int v, int ndim, const int64_t *dims, const float *vals) {
    eng_tensor *t = calloc(1, sizeof *t);
    t->dtype = ENG_DTYPE_F32;
    t->ndim = ndim;
    memcpy(t->dims, dims, sizeof(int64_t) * (size_t)ndim);
    size_t nb = eng_tensor_nbytes(t);
    t->data = eng_alloc(nb);
    memcpy(t->data, vals, nb);
    g->values[v].dtype = ENG_DTYPE_F32;
    g->values[v].ndim = ndim;
    memcpy(g->values[v].dims, dims, sizeof(int64_t) * (size_t)ndim);
    eng_value_set_init(g, v, t);
}

/* x [N, NIN] -> Gemm(W1 [NHID, NIN], transB) -> Relu -> MatMul(W2 [NHID, NOUT]) -> y [N, NOUT] */
static eng_graph *small_graph(int with_matmuls) {
    eng_graph *g = eng_graph_new();
    g->opset = 17;
    g->ir_version = 8;
    int x = eng_graph_add_value(g, "x"), w1 = eng_graph_add_value(g, "w1"), b1 = eng_graph_add_value(g, "b1");
    int h = eng_graph_add_value(g, "h"), r = eng_graph_add_value(g, "r"), w2 = eng_graph_add_value(g, "w2");
    int y = eng_graph_add_value(g, "y");
    g->values[x].dtype = ENG_DTYPE_F32;
    g->values[x].ndim = 2;
    g->values[x].dims[0] = -1;
    g->values[x].dims[1] = NIN;
    g->values[y].dtype = ENG_DTYPE_F32;
    g->values[y].ndim = 2;
    g->values[y].dims[0] = -1;
    g->values[y].dims[1] = NOUT;
    float W1[NHID * NIN], B1[NHID], W2[NHID * NOUT];
    for (int i = 0; i < NHID * NIN; i++) W1[i] = sinf(0.7f * (float)i) * (1.0f + (float)(i / NIN));
    for (int i = 0; i < NHID; i++) B1[i] = 0.1f * (float)i;
    for (int i = 0; i < NHID * NOUT; i++) W2[i] = cosf(1.3f * (float)i);
    add_init(g, w1, 2, (int64_t[]){NHID, NIN}, W1);
    add_init(g, b1, 1, (int64_t[]){NHID}, B1);
    add_init(g, w2, 2, (int64_t[]){NHID, NOUT}, W2);
    if (with_matmuls) {
        int n = eng_graph_add_node(g, "fc1", "Gemm", "", (int[]){x, w1, b1}, 3, &h, 1);
        eng_attr a = {.name = "transB", .type = ENG_ATTR_INT, .i = 1};
        cr_assert(eng_node_add_attr(g, n, &a) == ENG_STATUS_OK);
        eng_graph_add_node(g, "relu", "Relu", "", &h, 1, &r, 1);
        eng_graph_add_node(g, "fc2", "MatMul", "", (int[]){r, w2}, 2, &y, 1);
    } else {
        eng_graph_add_node(g, "relu", "Relu", "", &x, 1, &y, 1);
    }
    g->inputs = malloc(sizeof(int));
    g->inputs[0] = x;
    g->ninputs = 1;
    g->outputs = malloc(sizeof(int));
    g->outputs[0] = y;
    g->noutputs = 1;
    return g;
}

static eng_dataset *calib_data(int64_t n) {
    float *xs = malloc(sizeof(float) * (size_t)(n * NIN));
    for (int64_t i = 0; i < n * NIN; i++) xs[i] = sinf(0.37f * (float)i) * 2.0f - 0.25f;
    eng_tensor t = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {n, NIN}, .data = xs};
    char p[512];
    snprintf(p, sizeof p, "%s/x.npy", g_dir);
    cr_assert(eng_npy_save(p, &t) == ENG_STATUS_OK);
    free(xs);
    const char *files[] = {p};
    eng_dataset *d = NULL;
    cr_assert(eng_dataset_load(files, 1, &d) == ENG_STATUS_OK, "%s", eng_last_error());
    return d;
}

static void run_graph(eng_graph *g, const eng_dataset *d, float *out) {
    eng_session *s = NULL;
    eng_session_opts so = {.nthreads = 1};
    cr_assert(eng_session_new_graph(g, &so, &s) == ENG_STATUS_OK, "%s", eng_last_error());
    const char *names[] = {"x"};
    eng_tensor o[1];
    cr_assert(eng_session_run(s, 1, names, &d->cols[0].t, o) == ENG_STATUS_OK, "%s", eng_last_error());
    memcpy(out, o[0].data, sizeof(float) * (size_t)eng_tensor_numel(&o[0]));
    eng_session_free(&s);
}

Test(quant, select_and_refusals) {
    eng_graph *g = small_graph(1);
    eng_quant_opts o = {.method = ENG_QUANT_MINMAX, .per_channel = 1};
    eng_quant_plan p;
    cr_assert(eng_quant_select(g, "m", &o, &p) == ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(p.nnodes, 2);
    cr_assert_eq(p.nacts, 2); /* x and r */
    eng_quant_plan_free(&p);
    const char *bad[] = {"fc1", "nope"};
    o.exclude = bad;
    o.nexclude = 2;
    cr_assert(eng_quant_select(g, "m", &o, &p) == ENG_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(eng_last_error(), "'nope'"), "%s", eng_last_error());
    eng_quant_plan_free(&p);
    const char *ex[] = {"fc1"};
    o.exclude = ex;
    o.nexclude = 1;
    cr_assert(eng_quant_select(g, "m", &o, &p) == ENG_STATUS_OK);
    cr_assert_eq(p.nnodes, 1);
    cr_assert_eq(p.nexcluded, 1);
    cr_assert_str_eq(g->nodes[p.excluded[0]].name, "fc1");
    eng_quant_plan_free(&p);
    eng_graph_free(&g);
    g = small_graph(0);
    o.nexclude = 0;
    cr_assert(eng_quant_select(g, "model 'm' version 1", &o, &p) == ENG_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(eng_last_error(), "Conv, MatMul or Gemm"), "%s", eng_last_error());
    eng_quant_plan_free(&p);
    eng_graph_free(&g);
}

Test(quant, thresholds) {
    enum { NB = 2048 };
    static double h[NB];
    for (int i = 0; i < NB; i++) h[i] = 1;
    float t = eng_quant_percentile_threshold(h, NB, 2048.0f, 50.0);
    cr_assert(fabsf(t - 1024.0f) <= 1.0f, "median threshold %g", t);
    cr_assert_float_eq(eng_quant_percentile_threshold(h, NB, 2048.0f, 100.0), 2048.0f, 1e-3);
    /* a bulk in the first 200 bins and one far outlier: entropy clips the outlier, minmax would not */
    memset(h, 0, sizeof h);
    for (int i = 0; i < 200; i++) h[i] = 1000.0 * exp(-i / 50.0);
    h[2040] = 1;
    t = eng_quant_entropy_threshold(h, NB, 1.0f, 128);
    cr_assert(t > 100.0f / NB && t < 400.0f / NB, "entropy threshold %g", t);
    /* mass everywhere: no clipping is best */
    for (int i = 0; i < NB; i++) h[i] = 5;
    t = eng_quant_entropy_threshold(h, NB, 1.0f, 128);
    cr_assert(t > 0.9f, "entropy threshold on a flat histogram %g", t);
}

static void check_rewrite(eng_quant_method m, int per_channel) {
    eng_graph *g = small_graph(1);
    eng_dataset *d = calib_data(64);
    eng_quant_opts o = {.method = m, .per_channel = per_channel, .nthreads = 1, .batch_size = 16};
    eng_quant_plan p;
    cr_assert(eng_quant_select(g, "m", &o, &p) == ENG_STATUS_OK);
    cr_assert(eng_quant_calibrate(g, "m", d, &o, &p) == ENG_STATUS_OK, "%s", eng_last_error());
    for (int a = 0; a < p.nacts; a++) {
        cr_assert(p.acts[a].scale > 0 && isfinite(p.acts[a].scale));
        cr_assert(p.acts[a].min <= p.acts[a].max);
    }
    /* x spans negative values: minmax picks uint8 with a zero point inside; r (after Relu) is >= 0 */
    const eng_quant_act *ax = &p.acts[0], *ar = &p.acts[1];
    cr_assert_str_eq(g->values[ax->value].name, "x");
    cr_assert(ax->min < 0 && ar->min >= 0);
    if (m == ENG_QUANT_MINMAX) {
        cr_assert_eq(ax->dtype, ENG_DTYPE_U8);
        cr_assert(ax->zero_point > 0 && ax->zero_point < 255);
        cr_assert_float_eq(ax->scale, (ax->max - ax->min) / 255.0f, 1e-6);
    } else {
        cr_assert_eq(ax->dtype, ENG_DTYPE_I8);
        cr_assert_eq(ar->dtype, ENG_DTYPE_U8);
    }
    eng_graph *q = NULL;
    cr_assert(eng_quant_rewrite(g, &p, &o, &q) == ENG_STATUS_OK, "%s", eng_last_error());
    int nq = 0, ndq = 0;
    for (int i = 0; i < q->nnodes; i++) {
        nq += strcmp(q->nodes[i].op_type, "QuantizeLinear") == 0;
        ndq += strcmp(q->nodes[i].op_type, "DequantizeLinear") == 0;
    }
    cr_assert_eq(nq, 2);
    cr_assert_eq(ndq, 4);
    int w1q = eng_graph_find_value(q, "w1_quantized"), w1 = eng_graph_find_value(q, "w1");
    cr_assert(w1q >= 0 && q->values[w1q].init && q->values[w1q].init->dtype == ENG_DTYPE_I8);
    cr_assert(w1 >= 0 && !q->values[w1].init && q->values[w1].producer >= 0);
    int w1s = eng_graph_find_value(q, "w1_scale");
    cr_assert_eq(eng_tensor_numel(q->values[w1s].init), per_channel ? NHID : 1);
    /* the topological order holds */
    for (int i = 0; i < q->nnodes; i++)
        for (int k = 0; k < q->nodes[i].nin; k++) {
            int v = q->nodes[i].inputs[k];
            if (v >= 0) cr_assert(q->values[v].producer < i, "node %s reads %s before it is made", q->nodes[i].name,
                                  q->values[v].name);
        }
    float want[64 * NOUT], got[64 * NOUT];
    eng_graph *gc = eng_graph_clone(g);
    run_graph(gc, d, want);
    run_graph(q, d, got);
    double err = 0, mag = 0;
    for (int i = 0; i < 64 * NOUT; i++) {
        err = fmax(err, fabs(got[i] - want[i]));
        mag = fmax(mag, fabs(want[i]));
    }
    cr_assert(err <= 0.05 * mag, "int8 vs fp32: max err %g (max |y| %g)", err, mag);
    eng_quant_plan_free(&p);
    eng_dataset_free(&d);
    eng_graph_free(&g);
}

Test(quant, rewrite_minmax_per_channel) { check_rewrite(ENG_QUANT_MINMAX, 1); }
Test(quant, rewrite_entropy_per_tensor) { check_rewrite(ENG_QUANT_ENTROPY, 0); }
Test(quant, rewrite_percentile) { check_rewrite(ENG_QUANT_PERCENTILE, 1); }

Test(quant, calibration_data_must_fit) {
    eng_graph *g = small_graph(1);
    float xs[4 * 7] = {0};
    eng_tensor t = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {4, 7}, .data = xs};
    char path[512];
    snprintf(path, sizeof path, "%s/x.npy", g_dir);
    cr_assert(eng_npy_save(path, &t) == ENG_STATUS_OK);
    const char *files[] = {path};
    eng_dataset *d = NULL;
    cr_assert(eng_dataset_load(files, 1, &d) == ENG_STATUS_OK);
    eng_quant_opts o = {.method = ENG_QUANT_MINMAX, .per_channel = 1};
    eng_quant_plan p;
    cr_assert(eng_quant_select(g, "m", &o, &p) == ENG_STATUS_OK);
    cr_assert(eng_quant_calibrate(g, "model 'm' version 1", d, &o, &p) == ENG_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(eng_last_error(), "'x'") && strstr(eng_last_error(), "version 1"), "%s", eng_last_error());
    eng_quant_plan_free(&p);
    eng_dataset_free(&d);
    eng_graph_free(&g);
}

Test(quant, eval_compare) {
    float oa[] = {0.1f, 0.9f, 0.8f, 0.2f, 0.5f, 0.5f}, ob[] = {0.7f, 0.3f, 0.8f, 0.2f, 0.4f, 0.6f};
    int64_t ca[] = {1, 0, 0}, cb[] = {0, 0, 1};
    eng_eval_preds a = {.n = 3, .per = 2, .classification = 1, .out = oa, .cls = ca, .accuracy = 2.0 / 3};
    eng_eval_preds b = {.n = 3, .per = 2, .classification = 1, .out = ob, .cls = cb, .accuracy = 1.0 / 3};
    eng_eval_cmp c;
    cr_assert(eng_eval_compare(&a, &b, &c) == ENG_STATUS_OK);
    cr_assert_float_eq(c.agreement, 1.0 / 3, 1e-12);
    cr_assert_float_eq(c.accuracy_delta, 1.0 / 3, 1e-12);
    a.classification = b.classification = 0;
    a.mse = 0.5;
    b.mse = 0.25;
    cr_assert(eng_eval_compare(&a, &b, &c) == ENG_STATUS_OK);
    double want = 0;
    for (int i = 0; i < 6; i++) want += ((double)oa[i] - ob[i]) * ((double)oa[i] - ob[i]);
    cr_assert_float_eq(c.mean_sq_diff, want / 6, 1e-9);
    cr_assert_float_eq(c.mse_delta, 0.25, 1e-12);
    b.per = 3;
    cr_assert(eng_eval_compare(&a, &b, &c) == ENG_STATUS_INVALID_ARGUMENT);
}
