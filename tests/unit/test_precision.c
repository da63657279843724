/* test_precision.c - precision as a plan property (engine/plan/plan-precision.c): zoo models (the seed CNN, the
 * MLP, a small ResNet, a small transformer encoder) planned at bf16 agree with their fp32 plans within bf16's
 * rounding, with convolutions and matmuls really computing in bf16 and activations between them stored in it;
 * one session serves both precisions side by side (plans cached apart); weights fed as inputs (training's case)
 * take the per-run conversion path; fp16 on this CPU, int8 on a float model and bf16 on a CPU without
 * AVX512_BF16 are refused with a message naming why, at load and at plan time. The zoo is compiled into the
 * binary, not libtensord, so its sources are included (as test_zoo.c does). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/ir/graph.h"
#include "engine/plan/session.h"
#include "models/build.c"
#include "models/mlp-cnn.c"
#include "models/resnet.c"
#include "models/transformer.c"
#include "models/two-tower.c"
#include "models/vit.c"
#include "models/zoo.c"

static uint64_t rng = 99;

typedef struct feed {
    const char *name;
    eng_tensor t;
} feed;

/* One random batch for the graph's single input: floats in [0, 1), token ids in [0, 1000). */
static void make_feed(const eng_graph *g, int64_t batch, feed *f) {
    const eng_value *v = &g->values[g->inputs[0]];
    memset(f, 0, sizeof *f);
    f->name = v->name;
    f->t.dtype = v->dtype;
    f->t.ndim = v->ndim;
    f->t.dims[0] = batch;
    for (int d = 1; d < v->ndim; d++) f->t.dims[d] = v->dims[d];
    int64_t n = eng_tensor_numel(&f->t);
    f->t.data = malloc((size_t)n * 8);
    for (int64_t k = 0; k < n; k++) {
        uint64_t r = mdl_splitmix64(&rng);
        if (v->dtype == ENG_DTYPE_I64) ((int64_t *)f->t.data)[k] = (int64_t)(r % 1000);
        else ((float *)f->t.data)[k] = (float)((double)(r >> 11) * 0x1.0p-53);
    }
}

static eng_graph *zoo(const char *arch, const mdl_opt *o, int n) {
    eng_graph *g = NULL;
    cr_assert_eq(mdl_build(arch, o, n, 5, &g), ENG_STATUS_OK, "%s: %s", arch, eng_last_error());
    return g;
}

static int bf16_here(void) {
    eng_graph *g = eng_graph_new();
    eng_status st = eng_plan_precision_check(g, NULL, ENG_PRECISION_BF16);
    eng_graph_free(&g);
    if (st != ENG_STATUS_OK) {
        cr_log_warn("bf16 skipped: %s", eng_last_error());
        eng_err_clear();
    }
    return st == ENG_STATUS_OK;
}

/* sum((a-b)^2) / sum(b^2) over n floats */
static double nmse(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return num / (den > 1e-30 ? den : 1e-30);
}

/* Runs graph g (taken) at fp32 and bf16 in ONE session (eng_session_run_at); checks the bf16 output against fp32's
 * and that at least min_steps steps computed in bf16; returns the stats of the bf16 plan. */
static eng_plan_stats check_graph_bf16(eng_graph *g, const char *arch, int64_t batch, int min_steps, double tol) {
    feed f;
    make_feed(g, batch, &f);
    eng_session *s = NULL;
    cr_assert_eq(eng_session_new_graph(g, &(eng_session_opts){.nthreads = 2}, &s), ENG_STATUS_OK, "%s", eng_last_error());
    eng_tensor out;
    cr_assert_eq(eng_session_run_at(s, ENG_PRECISION_FP32, 1, &f.name, &f.t, &out), ENG_STATUS_OK, "%s", eng_last_error());
    int64_t n = eng_tensor_numel(&out);
    float *ref = malloc((size_t)n * sizeof *ref);
    memcpy(ref, out.data, (size_t)n * sizeof *ref);
    eng_plan_stats st32, st16;
    eng_session_last_stats(s, &st32);
    cr_assert_eq(st32.precision, ENG_PRECISION_FP32);
    cr_assert_eq(st32.lowp_steps, 0);
    cr_assert_eq(eng_session_run_at(s, ENG_PRECISION_BF16, 1, &f.name, &f.t, &out), ENG_STATUS_OK, "%s: %s", arch, eng_last_error());
    eng_session_last_stats(s, &st16);
    cr_assert_eq(out.dtype, ENG_DTYPE_F32, "%s: graph outputs stay fp32", arch);
    cr_assert_eq(eng_tensor_numel(&out), n);
    cr_assert_eq(st16.precision, ENG_PRECISION_BF16);
    cr_assert_geq(st16.lowp_steps, min_steps, "%s: %d steps in bf16", arch, st16.lowp_steps);
    double e = nmse(out.data, ref, n);
    cr_assert_lt(e, tol, "%s: bf16 vs fp32 normalized MSE %.3g (limit %.3g)", arch, e, tol);
    cr_assert_gt(e, 0.0, "%s: bf16 output is bit-identical to fp32: nothing ran in bf16", arch);
    /* fp32 again from the same session: its plan was kept, and it is exactly what it was */
    cr_assert_eq(eng_session_run_at(s, ENG_PRECISION_FP32, 1, &f.name, &f.t, &out), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(memcmp(out.data, ref, (size_t)n * sizeof *ref), 0, "%s: fp32 changed after a bf16 run", arch);
    cr_log_info("%s batch %lld: bf16 steps %d, bf16 activations %d, nmse %.3g", arch, (long long)batch, st16.lowp_steps,
                st16.lowp_values, e);
    free(ref);
    free(f.t.data);
    eng_session_free(&s);
    return st16;
}

static eng_plan_stats check_bf16(const char *arch, const mdl_opt *o, int no, int64_t batch, int min_steps, double tol) {
    return check_graph_bf16(zoo(arch, o, no), arch, batch, min_steps, tol);
}

Test(precision, seed_cnn_bf16) {
    if (!bf16_here()) return;
    check_bf16("cnn", NULL, 0, 32, 1, 1e-4); /* the conv (+ReLU+MaxPool) in bf16; the 10-class head stays fp32 GEMV */
}

Test(precision, mlp_bf16) {
    if (!bf16_here()) return;
    eng_plan_stats st = check_bf16("mlp", NULL, 0, 64, 2, 1e-4);
    cr_assert_geq(st.lowp_values, 1, "the hidden activation between the two 512-wide layers is stored in bf16");
}

Test(precision, resnet_small_bf16_keeps_activations_in_bf16) {
    if (!bf16_here()) return;
    mdl_opt o[] = {{"width", "16"}, {"blocks", "1"}};
    eng_plan_stats st = check_bf16("resnet-small", o, 2, 8, 6, 1e-3);
    cr_assert_geq(st.lowp_values, 3, "conv -> conv activations in bf16: %d", st.lowp_values);
}

Test(precision, transformer_bf16) {
    if (!bf16_here()) return;
    mdl_opt o[] = {{"seq", "16"}, {"d", "64"}, {"heads", "2"}, {"layers", "1"}, {"ffn", "128"}};
    check_bf16("transformer-encoder", o, 5, 4, 4, 1e-3);
}

/* A conv and a matmul whose weights are graph inputs (a training step's case): bf16 converts them every run. */
Test(precision, weights_fed_as_inputs_bf16) {
    if (!bf16_here()) return;
    eng_graph *g = eng_graph_new();
    g->opset = 17;
    const char *names[3] = {"x", "w", "m"};
    int64_t xd[4] = {64, 8, 10, 10}, wd[4] = {16, 8, 3, 3}, md[2] = {16 * 8 * 8, 32};
    int x = eng_graph_add_value(g, "x"), w = eng_graph_add_value(g, "w"), m = eng_graph_add_value(g, "m");
    const int64_t *dims[3] = {xd, wd, md};
    int ids[3] = {x, w, m}, nd[3] = {4, 4, 2};
    for (int i = 0; i < 3; i++) {
        g->values[ids[i]].dtype = ENG_DTYPE_F32;
        g->values[ids[i]].ndim = nd[i];
        for (int d = 0; d < nd[i]; d++) g->values[ids[i]].dims[d] = dims[i][d];
        g->inputs = realloc(g->inputs, (size_t)(g->ninputs + 1) * sizeof(int));
        g->inputs[g->ninputs++] = ids[i];
    }
    int c = eng_graph_add_value(g, "c"), f = eng_graph_add_value(g, "f"), y = eng_graph_add_value(g, "y");
    int shp = eng_graph_add_value(g, "shp");
    eng_tensor *st = calloc(1, sizeof *st);
    st->dtype = ENG_DTYPE_I64, st->ndim = 1, st->dims[0] = 2, st->data = eng_alloc(16);
    ((int64_t *)st->data)[0] = 64, ((int64_t *)st->data)[1] = -1;
    eng_value_set_init(g, shp, st);
    eng_graph_add_node(g, "conv", "Conv", "", (int[]){x, w}, 2, &c, 1);
    eng_graph_add_node(g, "flat", "Reshape", "", (int[]){c, shp}, 2, &f, 1);
    eng_graph_add_node(g, "mm", "MatMul", "", (int[]){f, m}, 2, &y, 1);
    g->outputs = realloc(g->outputs, sizeof(int));
    g->outputs[g->noutputs++] = y;
    eng_tensor in[3];
    for (int i = 0; i < 3; i++) {
        memset(&in[i], 0, sizeof in[i]);
        in[i].dtype = ENG_DTYPE_F32, in[i].ndim = nd[i];
        for (int d = 0; d < nd[i]; d++) in[i].dims[d] = dims[i][d];
        int64_t n = eng_tensor_numel(&in[i]);
        in[i].data = malloc((size_t)n * sizeof(float));
        for (int64_t k = 0; k < n; k++) ((float *)in[i].data)[k] = (float)((double)(mdl_splitmix64(&rng) >> 11) * 0x1.0p-53 - 0.5);
    }
    eng_session *s = NULL;
    cr_assert_eq(eng_session_new_graph(g, &(eng_session_opts){.nthreads = 1}, &s), ENG_STATUS_OK, "%s", eng_last_error());
    eng_tensor out;
    float ref[64 * 32], b16[64 * 32];
    cr_assert_eq(eng_session_run_at(s, ENG_PRECISION_FP32, 3, names, in, &out), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(eng_tensor_numel(&out), 64 * 32);
    memcpy(ref, out.data, sizeof ref);
    cr_assert_eq(eng_session_run_at(s, ENG_PRECISION_BF16, 3, names, in, &out), ENG_STATUS_OK, "%s", eng_last_error());
    eng_plan_stats ps;
    eng_session_last_stats(s, &ps);
    cr_assert_eq(ps.lowp_steps, 2, "conv and matmul in bf16, got %d", ps.lowp_steps);
    double e = nmse(out.data, ref, 64 * 32);
    cr_assert(e > 0 && e < 1e-4, "nmse %.3g", e);
    memcpy(b16, out.data, sizeof b16);
    /* new weights (x -2: exact in bf16), same plan: the conversion runs again (no stale packed copy), and the
     * answer is exactly -2 x the previous one */
    for (int64_t k = 0; k < eng_tensor_numel(&in[2]); k++) ((float *)in[2].data)[k] *= -2.0f;
    cr_assert_eq(eng_session_run_at(s, ENG_PRECISION_BF16, 3, names, in, &out), ENG_STATUS_OK, "%s", eng_last_error());
    for (int i = 0; i < 64 * 32; i++)
        cr_assert(fabsf(((float *)out.data)[i] + 2.0f * b16[i]) <= 1e-6f * fabsf(b16[i]), "element %d: %g vs %g", i,
                  ((float *)out.data)[i], -2.0 * b16[i]);
    eng_session_free(&s);
    for (int i = 0; i < 3; i++) free(in[i].data);
}

Test(precision, refusals_name_the_reason) {
    /* fp16: no fast CPU kernel in oneDNN 2.6, refused at load */
    eng_session *s = NULL;
    eng_status st = eng_session_new_graph(zoo("mlp", NULL, 0), &(eng_session_opts){.precision = ENG_PRECISION_FP16}, &s);
    cr_assert_eq(st, ENG_STATUS_UNSUPPORTED);
    cr_assert_null(s);
    cr_assert(strstr(eng_last_error(), "fp16") && strstr(eng_last_error(), "cpu"), "%s", eng_last_error());
    /* int8 on a float model: refused, naming tensord quantize */
    st = eng_session_new_graph(zoo("cnn", NULL, 0), &(eng_session_opts){.precision = ENG_PRECISION_INT8}, &s);
    cr_assert_eq(st, ENG_STATUS_UNSUPPORTED);
    cr_assert(strstr(eng_last_error(), "no quantized ops") && strstr(eng_last_error(), "tensord quantize"), "%s", eng_last_error());
    /* per run too: a session loaded at fp32 asked for fp16 */
    cr_assert_eq(eng_session_new_graph(zoo("mlp", NULL, 0), NULL, &s), ENG_STATUS_OK, "%s", eng_last_error());
    feed f;
    make_feed(eng_session_graph(s), 2, &f);
    eng_tensor out;
    cr_assert_eq(eng_session_run_at(s, ENG_PRECISION_FP16, 1, &f.name, &f.t, &out), ENG_STATUS_UNSUPPORTED);
    cr_assert(strstr(eng_last_error(), "fp16"), "%s", eng_last_error());
    cr_assert_eq(eng_session_run_at(s, ENG_PRECISION_FP32, 1, &f.name, &f.t, &out), ENG_STATUS_OK, "%s", eng_last_error());
    free(f.t.data);
    eng_session_free(&s);
    /* names and parsing */
    eng_precision p;
    cr_assert_eq(eng_precision_parse("bf16", &p), ENG_STATUS_OK);
    cr_assert_eq(p, ENG_PRECISION_BF16);
    cr_assert_eq(eng_precision_parse("float16", &p), ENG_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(eng_last_error(), "float16") && strstr(eng_last_error(), "bf16"), "%s", eng_last_error());
    cr_assert_str_eq(eng_precision_name(ENG_PRECISION_INT8), "int8");
}

/* The bf16 gradient kernels (grad-lowp.c) against the fp32 ones: ConvGrad (dx, dw, db; grouped too) and
 * MatMulGrad (dense-layer and batched shapes), inputs fed, NMSE of every output within bf16 rounding. */
static void check_grad_node(const char *op, int nin, int nout, const int64_t dims[][4], const int *nd, int64_t pads,
                            int64_t group, double tol) {
    if (!bf16_here()) return;
    eng_graph *g = eng_graph_new();
    g->opset = 17;
    static const char *in_names[3] = {"dy", "a", "b"}, *out_names[3] = {"d0", "d1", "d2"};
    int ins[3], outs[3];
    eng_tensor in[3];
    for (int i = 0; i < nin; i++) {
        ins[i] = eng_graph_add_value(g, in_names[i]);
        memset(&in[i], 0, sizeof in[i]);
        in[i].dtype = ENG_DTYPE_F32, in[i].ndim = nd[i];
        g->values[ins[i]].dtype = ENG_DTYPE_F32, g->values[ins[i]].ndim = nd[i];
        for (int d = 0; d < nd[i]; d++) g->values[ins[i]].dims[d] = in[i].dims[d] = dims[i][d];
        g->inputs = realloc(g->inputs, (size_t)(g->ninputs + 1) * sizeof(int));
        g->inputs[g->ninputs++] = ins[i];
        int64_t n = eng_tensor_numel(&in[i]);
        in[i].data = malloc((size_t)n * sizeof(float));
        for (int64_t k = 0; k < n; k++) ((float *)in[i].data)[k] = (float)((double)(mdl_splitmix64(&rng) >> 11) * 0x1.0p-53 - 0.5);
    }
    for (int i = 0; i < nout; i++) {
        outs[i] = eng_graph_add_value(g, out_names[i]);
        g->outputs = realloc(g->outputs, (size_t)(g->noutputs + 1) * sizeof(int));
        g->outputs[g->noutputs++] = outs[i];
    }
    int k = eng_graph_add_node(g, op, op, "com.tensord", ins, nin, outs, nout);
    if (pads >= 0) {
        int64_t pv[4] = {pads, pads, pads, pads}, ks[2] = {dims[2][2], dims[2][3]};
        eng_attr a1 = {.name = (char *)"pads", .type = ENG_ATTR_INTS, .ints = pv, .n = 4};
        eng_attr a2 = {.name = (char *)"kernel_shape", .type = ENG_ATTR_INTS, .ints = ks, .n = 2};
        eng_attr a3 = {.name = (char *)"group", .type = ENG_ATTR_INT, .i = group};
        eng_node_add_attr(g, k, &a1);
        eng_node_add_attr(g, k, &a2);
        eng_node_add_attr(g, k, &a3);
    }
    eng_session *s = NULL;
    cr_assert_eq(eng_session_new_graph(g, &(eng_session_opts){.nthreads = 2, .no_fuse = 1}, &s), ENG_STATUS_OK, "%s", eng_last_error());
    eng_tensor o[3];
    float *ref[3];
    int64_t n[3];
    cr_assert_eq(eng_session_run_at(s, ENG_PRECISION_FP32, nin, in_names, in, o), ENG_STATUS_OK, "%s", eng_last_error());
    for (int i = 0; i < nout; i++) {
        n[i] = eng_tensor_numel(&o[i]);
        ref[i] = malloc((size_t)n[i] * sizeof(float));
        memcpy(ref[i], o[i].data, (size_t)n[i] * sizeof(float));
    }
    cr_assert_eq(eng_session_run_at(s, ENG_PRECISION_BF16, nin, in_names, in, o), ENG_STATUS_OK, "%s: %s", op, eng_last_error());
    eng_plan_stats st;
    eng_session_last_stats(s, &st);
    cr_assert_eq(st.lowp_steps, 1, "%s did not run in bf16", op);
    for (int i = 0; i < nout; i++) {
        cr_assert_eq(o[i].dtype, ENG_DTYPE_F32);
        double e = nmse(o[i].data, ref[i], n[i]);
        cr_log_info("%s output %d: bf16 vs fp32 nmse %.3g", op, i, e);
        cr_assert(e > 0 && e < tol, "%s output %d: nmse %.3g (limit %.3g)", op, i, e, tol);
        free(ref[i]);
    }
    eng_session_free(&s);
    for (int i = 0; i < nin; i++) free(in[i].data);
}

Test(precision, conv_grad_bf16) {
    const int64_t d[3][4] = {{4, 16, 12, 12}, {4, 8, 12, 12}, {16, 8, 3, 3}};
    check_grad_node("ConvGrad", 3, 3, d, (int[]){4, 4, 4}, 1, 1, 1e-4);
    const int64_t dg[3][4] = {{2, 16, 10, 10}, {2, 8, 10, 10}, {16, 4, 3, 3}}; /* 2 groups */
    check_grad_node("ConvGrad", 3, 3, dg, (int[]){4, 4, 4}, 1, 2, 1e-4);
}

Test(precision, matmul_grad_bf16) {
    const int64_t dense[3][4] = {{4, 16, 48}, {4, 16, 32}, {32, 48}}; /* dY, A [4,16,32], B [32,48] */
    check_grad_node("MatMulGrad", 3, 2, dense, (int[]){3, 3, 2}, -1, 1, 1e-4);
    const int64_t batched[3][4] = {{2, 3, 8, 16}, {2, 3, 8, 24}, {2, 3, 24, 16}};
    check_grad_node("MatMulGrad", 3, 2, batched, (int[]){4, 4, 4}, -1, 1, 1e-4);
}

/* A ResNet-like stem, conv -> Relu -> MaxPool 3x3/2 -> conv, 16 and 32 channels (blocked layouts): in bf16 the pool
 * runs on oneDNN's bf16 pooling between the two bf16 convs, so both activations around it are bf16. */
static void attr_ints(eng_graph *g, int node, const char *name, const int64_t *v, int n) {
    eng_attr a = {.name = (char *)name, .type = ENG_ATTR_INTS, .ints = (int64_t *)v, .n = n};
    eng_node_add_attr(g, node, &a);
}

static int weight(eng_graph *g, const char *name, int64_t m, int64_t c) {
    int v = eng_graph_add_value(g, name);
    eng_tensor *t = calloc(1, sizeof *t);
    t->dtype = ENG_DTYPE_F32, t->ndim = 4, t->dims[0] = m, t->dims[1] = c, t->dims[2] = 3, t->dims[3] = 3;
    int64_t n = eng_tensor_numel(t);
    t->data = eng_alloc((size_t)n * sizeof(float));
    for (int64_t k = 0; k < n; k++) ((float *)t->data)[k] = (float)((double)(mdl_splitmix64(&rng) >> 11) * 0x1.0p-53 - 0.5) * 0.2f;
    eng_value_set_init(g, v, t);
    return v;
}

Test(precision, stem_pool_between_bf16_convs) {
    if (!bf16_here()) return;
    eng_graph *g = eng_graph_new();
    g->opset = 17;
    int x = eng_graph_add_value(g, "x");
    g->values[x].dtype = ENG_DTYPE_F32, g->values[x].ndim = 4;
    int64_t xd[4] = {4, 16, 32, 32};
    for (int d = 0; d < 4; d++) g->values[x].dims[d] = xd[d];
    g->inputs = realloc(g->inputs, sizeof(int));
    g->inputs[g->ninputs++] = x;
    int w1 = weight(g, "w1", 32, 16), w2 = weight(g, "w2", 32, 32);
    int c1 = eng_graph_add_value(g, "c1"), r1 = eng_graph_add_value(g, "r1"), p1 = eng_graph_add_value(g, "p1");
    int y = eng_graph_add_value(g, "y");
    const int64_t pads[4] = {1, 1, 1, 1}, k3[2] = {3, 3}, s2[2] = {2, 2};
    int n1 = eng_graph_add_node(g, "conv1", "Conv", "", (int[]){x, w1}, 2, &c1, 1);
    attr_ints(g, n1, "pads", pads, 4);
    eng_graph_add_node(g, "relu1", "Relu", "", &c1, 1, &r1, 1);
    int np = eng_graph_add_node(g, "pool", "MaxPool", "", &r1, 1, &p1, 1);
    attr_ints(g, np, "kernel_shape", k3, 2);
    attr_ints(g, np, "strides", s2, 2);
    attr_ints(g, np, "pads", pads, 4);
    int n2 = eng_graph_add_node(g, "conv2", "Conv", "", (int[]){p1, w2}, 2, &y, 1);
    attr_ints(g, n2, "pads", pads, 4);
    g->outputs = realloc(g->outputs, sizeof(int));
    g->outputs[g->noutputs++] = y;
    eng_plan_stats st = check_graph_bf16(g, "stem", 4, 2, 1e-4);
    cr_assert_eq(st.lowp_steps, 2, "both convs in bf16, got %d", st.lowp_steps);
    cr_assert_eq(st.lowp_values, 2, "the conv1 and pool outputs in bf16, got %d", st.lowp_values);
}
