/* test_fuse_qdq.c - the QDQ rewrite's pattern matcher (engine/plan/fuse-qdq.c) on graphs built in C: which
 * patterns become QLinearConv/QLinearMatMul, which become ConvInteger/MatMulInteger + Cast + Mul, and which are
 * left alone (non-constant weights, a DQ output also read by a float op, no Q after the op, a Relu that Q does
 * not absorb, the TENSORD_NO_QDQ_FUSE switch). Numerics are checked end to end by
 * tests/integration/test_qdq_fuse.py against onnxruntime. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/ir/graph.h"
#include "engine/plan/fuse.h"
#include "engine/plan/session.h"

static int val(eng_graph *g, const char *name) {
    int v = eng_graph_add_value(g, name);
    g->values[v].ndim = -1;
    return v;
}

static int init(eng_graph *g, const char *name, eng_dtype dt, int ndim, const int64_t *dims, const void *data) {
    int v = val(g, name);
    eng_tensor *t = calloc(1, sizeof *t);
    t->dtype = dt;
    t->ndim = ndim;
    memcpy(t->dims, dims, (size_t)ndim * sizeof *dims);
    size_t nb = eng_tensor_nbytes(t);
    t->data = eng_alloc(nb ? nb : 4);
    memcpy(t->data, data, nb);
    eng_value_set_init(g, v, t);
    g->values[v].dtype = dt;
    return v;
}

static void io(int **arr, int *n, int v) {
    *arr = realloc(*arr, (size_t)(*n + 1) * sizeof(int));
    (*arr)[(*n)++] = v;
}

static int node(eng_graph *g, const char *name, const char *op, const int *in, int nin, int out) {
    return eng_graph_add_node(g, name, op, "", in, nin, &out, 1);
}

static int count_op(const eng_graph *g, const char *op) {
    int k = 0;
    for (int i = 0; i < g->nnodes; i++) k += !strcmp(g->nodes[i].op_type, op);
    return k;
}

static const eng_node *find_op(const eng_graph *g, const char *op) {
    for (int i = 0; i < g->nnodes; i++)
        if (!strcmp(g->nodes[i].op_type, op)) return &g->nodes[i];
    return NULL;
}

typedef struct spec {
    int matmul;       /* MatMul [4,8]x[8,3] instead of Conv [1,2,5,5] * [3,2,3,3] */
    int w_input;      /* weights are a graph input (not constant) */
    int relu;         /* op -> Relu -> (Q) */
    int q;            /* Q after the op (else the op's output is the graph output) */
    int yzp;          /* Q's uint8 zero point */
    int float_user;   /* DQ(x) also feeds a float Relu whose output is a graph output */
    int bias;         /* Conv float bias */
    int second_conv;  /* a second Conv sharing DQ(x) and DQ(w) */
    int gemm;         /* with matmul: a Gemm (1: transB = 0, w [8,3]; 2: transB = 1, w [3,8] per channel on axis 0) */
} spec;

/* x(float) -> Q -> DQ -> Conv/MatMul(DQ(w_q int8, per channel)) [-> Relu] [-> Q -> DQ] -> y */
static eng_graph *build(spec s) {
    eng_graph *g = eng_graph_new();
    g->opset = 17;
    int x = val(g, "x");
    g->values[x].dtype = ENG_DTYPE_F32;
    io(&g->inputs, &g->ninputs, x);
    float one = 0.02f, ws[3] = {0.01f, 0.02f, 0.03f}, b[3] = {0.1f, -0.2f, 0.3f}, ysc = 0.05f;
    uint8_t z0 = 0, yz = (uint8_t)s.yzp;
    int8_t wz[3] = {0, 0, 0}, wq[54];
    for (int i = 0; i < 54; i++) wq[i] = (int8_t)(i * 7 % 31 - 15);
    int64_t d0[1] = {0}, d3[1] = {3}, wd4[4] = {3, 2, 3, 3}, wd2[2] = {8, 3};
    if (s.gemm == 2) wd2[0] = 3, wd2[1] = 8;
    int xs = init(g, "x_scale", ENG_DTYPE_F32, 0, d0, &one), xz = init(g, "x_zp", ENG_DTYPE_U8, 0, d0, &z0);
    int xq = val(g, "x_q"), xd = val(g, "x_dq");
    node(g, "xq", "QuantizeLinear", (int[]){x, xs, xz}, 3, xq);
    node(g, "xdq", "DequantizeLinear", (int[]){xq, xs, xz}, 3, xd);
    int wqv;
    if (s.w_input) {
        wqv = val(g, "w_q");
        g->values[wqv].dtype = ENG_DTYPE_I8;
        io(&g->inputs, &g->ninputs, wqv);
    } else wqv = init(g, "w_q", ENG_DTYPE_I8, s.matmul ? 2 : 4, s.matmul ? wd2 : wd4, wq);
    int wsv = init(g, "w_scale", ENG_DTYPE_F32, 1, d3, ws), wzv = init(g, "w_zp", ENG_DTYPE_I8, 1, d3, wz);
    int wd = val(g, "w_dq");
    int dq = node(g, "wdq", "DequantizeLinear", (int[]){wqv, wsv, wzv}, 3, wd);
    eng_attr ax = {.name = (char *)"axis", .type = ENG_ATTR_INT, .i = s.matmul && s.gemm != 2 ? 1 : 0};
    eng_node_add_attr(g, dq, &ax);
    int c = val(g, "c");
    if (s.gemm) {
        int bv = s.bias ? init(g, "b", ENG_DTYPE_F32, 1, d3, b) : -1;
        int k = node(g, "gemm", "Gemm", (int[]){xd, wd, bv}, s.bias ? 3 : 2, c);
        eng_attr tb = {.name = (char *)"transB", .type = ENG_ATTR_INT, .i = s.gemm == 2};
        eng_node_add_attr(g, k, &tb);
    } else if (s.bias) {
        int bv = init(g, "b", ENG_DTYPE_F32, 1, d3, b);
        node(g, "conv", "Conv", (int[]){xd, wd, bv}, 3, c);
    } else node(g, s.matmul ? "mm" : "conv", s.matmul ? "MatMul" : "Conv", (int[]){xd, wd}, 2, c);
    if (s.second_conv) {
        int c2 = val(g, "c2");
        node(g, "conv2", "Conv", (int[]){xd, wd}, 2, c2);
        io(&g->outputs, &g->noutputs, c2);
    }
    if (s.float_user) {
        int r = val(g, "xr");
        node(g, "xrelu", "Relu", &xd, 1, r);
        io(&g->outputs, &g->noutputs, r);
    }
    int h = c;
    if (s.relu) {
        int r = val(g, "r");
        node(g, "relu", "Relu", &h, 1, r);
        h = r;
    }
    if (s.q) {
        int ysv = init(g, "y_scale", ENG_DTYPE_F32, 0, d0, &ysc), yzv = init(g, "y_zp", ENG_DTYPE_U8, 0, d0, &yz);
        int yq = val(g, "y_q"), y = val(g, "y");
        node(g, "yq", "QuantizeLinear", (int[]){h, ysv, yzv}, 3, yq);
        node(g, "ydq", "DequantizeLinear", (int[]){yq, ysv, yzv}, 3, y);
        h = y;
    }
    io(&g->outputs, &g->noutputs, h);
    return g;
}

static eng_graph *fused(spec s) {
    eng_graph *g = build(s);
    cr_assert_eq(eng_graph_fuse_qdq(g), ENG_STATUS_OK, "%s", eng_last_error());
    int order[64];
    cr_assert_eq(eng_graph_topo_order(g, order), ENG_STATUS_OK, "not topological after the rewrite: %s", eng_last_error());
    for (int i = 0; i < g->nnodes; i++)
        for (int j = 0; j < g->nodes[i].nout; j++) cr_assert_eq(g->values[g->nodes[i].outputs[j]].producer, i);
    return g;
}

Test(fuse_qdq, conv_q_becomes_qlinearconv_with_int32_bias) {
    eng_graph *g = fused((spec){.q = 1, .bias = 1, .yzp = 3});
    const eng_node *n = find_op(g, "QLinearConv");
    cr_assert(n, "no QLinearConv");
    cr_assert_eq(count_op(g, "Conv"), 0);
    cr_assert_eq(n->nin, 9);
    const eng_tensor *b = g->values[n->inputs[8]].init;
    cr_assert(b && b->dtype == ENG_DTYPE_I32 && b->dims[0] == 3);
    const int32_t *bd = b->data; /* round(b / (0.02 * w_scale[m])) */
    cr_assert_eq(bd[0], 500);
    cr_assert_eq(bd[1], -500);
    cr_assert_eq(bd[2], 500);
    cr_assert_eq(n->outputs[0], eng_graph_find_value(g, "y_q"));
    cr_assert_eq(count_op(g, "DequantizeLinear"), 1, "the x and w DQs go, the output DQ stays");
    cr_assert_eq(count_op(g, "QuantizeLinear"), 1);
    eng_graph_free(&g);
}

Test(fuse_qdq, relu_folds_only_when_q_zero_point_is_the_minimum) {
    eng_graph *g = fused((spec){.q = 1, .relu = 1, .yzp = 0});
    cr_assert_eq(count_op(g, "QLinearConv"), 1);
    cr_assert_eq(count_op(g, "Relu"), 0);
    eng_graph_free(&g);
    g = fused((spec){.q = 1, .relu = 1, .yzp = 10}); /* Relu is a real clamp here: keep it, float output */
    cr_assert_eq(count_op(g, "QLinearConv"), 0);
    cr_assert_eq(count_op(g, "Relu"), 1);
    cr_assert_eq(count_op(g, "ConvInteger"), 1);
    eng_graph_free(&g);
}

Test(fuse_qdq, matmul_q_becomes_qlinearmatmul) {
    eng_graph *g = fused((spec){.matmul = 1, .q = 1, .yzp = 128});
    cr_assert_eq(count_op(g, "QLinearMatMul"), 1);
    cr_assert_eq(count_op(g, "MatMul"), 0);
    eng_graph_free(&g);
}

Test(fuse_qdq, missing_q_gives_integer_op_and_float_rescale) {
    eng_graph *g = fused((spec){.bias = 1});
    cr_assert_eq(count_op(g, "QLinearConv"), 0);
    cr_assert_eq(count_op(g, "ConvInteger"), 1);
    cr_assert_eq(count_op(g, "Cast"), 1);
    cr_assert_eq(count_op(g, "Mul"), 1);
    cr_assert_eq(count_op(g, "Add"), 1);
    const eng_node *a = find_op(g, "Add");
    cr_assert_eq(a->outputs[0], eng_graph_find_value(g, "c"), "the float output value is kept");
    const eng_node *m = find_op(g, "Mul");
    const eng_tensor *s = g->values[m->inputs[1]].init;
    cr_assert(s && s->ndim == 3 && s->dims[0] == 3 && s->dims[1] == 1 && s->dims[2] == 1);
    cr_assert_float_eq(((const float *)s->data)[2], 0.02f * 0.03f, 1e-12);
    eng_graph_free(&g);
    g = fused((spec){.matmul = 1}); /* a matmul: one MatMulIntegerToFloat, scales inside */
    cr_assert_eq(count_op(g, "MatMulIntegerToFloat"), 1);
    cr_assert_eq(count_op(g, "MatMulInteger") + count_op(g, "QLinearMatMul") + count_op(g, "Cast") + count_op(g, "Mul"), 0);
    const eng_node *mf = find_op(g, "MatMulIntegerToFloat");
    cr_assert_str_eq(mf->domain, "com.microsoft");
    cr_assert_eq(mf->outputs[0], eng_graph_find_value(g, "c"), "the float output value is kept");
    eng_graph_free(&g);
}

Test(fuse_qdq, refuses_non_constant_weights) {
    eng_graph *g = fused((spec){.q = 1, .w_input = 1});
    cr_assert_eq(count_op(g, "Conv"), 1);
    cr_assert_eq(count_op(g, "QLinearConv") + count_op(g, "ConvInteger"), 0);
    cr_assert_eq(count_op(g, "DequantizeLinear"), 3);
    eng_graph_free(&g);
}

Test(fuse_qdq, dq_also_read_by_float_op_stays_for_it) {
    eng_graph *g = fused((spec){.q = 1, .float_user = 1});
    cr_assert_eq(count_op(g, "Conv"), 0);
    cr_assert_eq(count_op(g, "QLinearConv"), 1);
    cr_assert_eq(count_op(g, "DequantizeLinear"), 2, "x's DQ stays for the float Relu, the output DQ stays");
    const eng_node *r = find_op(g, "Relu");
    cr_assert(r && r->inputs[0] == eng_graph_find_value(g, "x_dq"), "the float reader still reads x's DQ");
    eng_graph_free(&g);
}

Test(fuse_qdq, shared_dq_between_two_convs) {
    eng_graph *g = fused((spec){.q = 1, .second_conv = 1});
    cr_assert_eq(count_op(g, "QLinearConv"), 1);
    cr_assert_eq(count_op(g, "ConvInteger"), 1, "the second conv's output is a graph output: integer form");
    cr_assert_eq(count_op(g, "DequantizeLinear"), 1, "both consumers rewritten: shared DQs removed");
    eng_graph_free(&g);
}

Test(fuse_qdq, env_switch_turns_it_off) {
    setenv("TENSORD_NO_QDQ_FUSE", "1", 1);
    eng_graph *g = fused((spec){.q = 1});
    unsetenv("TENSORD_NO_QDQ_FUSE");
    cr_assert_eq(count_op(g, "Conv"), 1);
    cr_assert_eq(count_op(g, "QLinearConv"), 0);
    eng_graph_free(&g);
}

/* Gemm (a dense layer) in QDQ form, either transB, with and without bias: fused, and the fused graph computes what
 * the float QDQ graph computes (the integer accumulation is exact; only float rounding differs). */
Test(fuse_qdq, gemm_dense_layers_fused_and_equal) {
    for (int tb = 1; tb <= 2; tb++)
        for (int bias = 0; bias <= 1; bias++) {
            spec sp = {.matmul = 1, .gemm = tb, .bias = bias, .q = !bias, .yzp = 128};
            eng_graph *g = fused(sp);
            cr_assert_eq(count_op(g, "Gemm"), 0, "transB %d bias %d: Gemm left", tb - 1, bias);
            cr_assert_eq(count_op(g, bias ? "MatMulIntegerToFloat" : "QLinearMatMul"), 1, "transB %d bias %d", tb - 1, bias);
            eng_graph_free(&g);
            float x[32], ref[12], got[12];
            for (int i = 0; i < 32; i++) x[i] = (float)((i * 13) % 17) * 0.05f - 0.3f;
            eng_tensor in = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {4, 8}, .data = x}, out;
            const char *names[1] = {"x"};
            for (int f = 0; f < 2; f++) {
                eng_session *s = NULL;
                cr_assert_eq(eng_session_new_graph(build(sp), &(eng_session_opts){.no_fuse = !f}, &s), ENG_STATUS_OK, "%s", eng_last_error());
                cr_assert_eq(eng_session_run(s, 1, names, &in, &out), ENG_STATUS_OK, "%s", eng_last_error());
                cr_assert_eq(eng_tensor_numel(&out), 12);
                memcpy(f ? got : ref, out.data, sizeof ref);
                eng_session_free(&s);
            }
            for (int i = 0; i < 12; i++)
                cr_assert(fabsf(got[i] - ref[i]) <= 1e-5f * (1 + fabsf(ref[i])), "transB %d bias %d [%d]: %g vs %g", tb - 1,
                          bias, i, got[i], ref[i]);
        }
}
