/* test_ctrl.c - the engine pieces under control flow: plans writing outputs into the caller's memory
 * (ext_outputs), shape-free plans (any_shape), sequence values, and a Loop built by hand (outer-scope reads as
 * implicit inputs, loop-carried values, scan outputs, the iteration cap and the run deadline). The ONNX semantics
 * against onnxruntime are in tests/integration/test_rnn_models.py and the ONNX node tests. */
#include <criterion/criterion.h>
#include <string.h>
#include <time.h>

#include "engine/ir/graph.h"
#include "engine/ir/seq.h"
#include "engine/plan/plan.h"
#include "engine/plan/session.h"
#include "graph-fixture.h"

static int node(eng_graph *g, const char *op, const int *in, int nin, const int *out, int nout) {
    int k = eng_graph_add_node(g, op, op, "", in, nin, out, nout);
    cr_assert(k >= 0);
    return k;
}

/* y = x + b (a step writes it), z = x (an input passed through), r = Reshape(y) (an alias of y). */
static eng_graph *ext_graph(void) {
    eng_graph *g = eng_graph_new();
    int64_t d[2] = {2, 3}, s[1] = {6};
    float b[6] = {1, 2, 3, 4, 5, 6};
    int x = input_f32(g, "x", 2, d), bv = init_f32(g, "b", 2, d, b), y = val(g, "y"), r = val(g, "r");
    int shp = val(g, "shape");
    eng_tensor *st = calloc(1, sizeof *st);
    *st = (eng_tensor){.dtype = ENG_DTYPE_I64, .ndim = 1, .dims = {1}};
    st->data = eng_alloc(8);
    memcpy(st->data, s, 8);
    eng_value_set_init(g, shp, st);
    node(g, "Add", (int[]){x, bv}, 2, &y, 1);
    node(g, "Reshape", (int[]){y, shp}, 2, &r, 1);
    list_add(&g->outputs, &g->noutputs, y);
    list_add(&g->outputs, &g->noutputs, x);
    list_add(&g->outputs, &g->noutputs, r);
    g->opset = 17;
    return g;
}

Test(ctrl, ext_outputs_write_into_caller_memory) {
    eng_graph *g = ext_graph();
    eng_tensor in = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {2, 3}};
    eng_plan_opts o = {.nthreads = 1, .ext_outputs = 1};
    eng_plan *p = NULL;
    cr_assert_eq(eng_plan_new(g, &o, &in, &p), ENG_STATUS_OK, "%s", eng_last_error());
    float x[6] = {10, 20, 30, 40, 50, 60}, y[6], z[6], r[6];
    in.data = x;
    eng_tensor out[3] = {*eng_plan_output_desc(p, 0, NULL), *eng_plan_output_desc(p, 1, NULL),
                         *eng_plan_output_desc(p, 2, NULL)};
    out[0].data = y, out[1].data = z, out[2].data = r;
    for (int run = 0; run < 2; run++) { /* a second run into other memory: pointers may change between runs */
        float y2[6], z2[6], r2[6];
        if (run) out[0].data = y2, out[1].data = z2, out[2].data = r2;
        cr_assert_eq(eng_plan_run(p, &in, out), ENG_STATUS_OK, "%s", eng_last_error());
        const float *Y = out[0].data, *Z = out[1].data, *R = out[2].data;
        for (int i = 0; i < 6; i++) {
            cr_expect_float_eq(Y[i], x[i] + (float)(i + 1), 1e-6);
            cr_expect_float_eq(Z[i], x[i], 1e-6); /* copied: an input */
            cr_expect_float_eq(R[i], x[i] + (float)(i + 1), 1e-6); /* y and r share a root: copied */
        }
    }
    eng_plan_free(&p);
    eng_graph_free(&g);
}

Test(ctrl, any_shape_plans_take_new_shapes) {
    eng_graph *g = eng_graph_new();
    int64_t d[2] = {2, 3};
    int x = input_f32(g, "x", 2, d), y = val(g, "y");
    node(g, "Relu", &x, 1, &y, 1);
    list_add(&g->outputs, &g->noutputs, y);
    g->opset = 17;
    eng_tensor in = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {2, 3}};
    eng_plan_opts o = {.nthreads = 1, .any_shape = 1};
    eng_plan *p = NULL;
    cr_assert_eq(eng_plan_new(g, &o, &in, &p), ENG_STATUS_OK, "%s", eng_last_error());
    float x5[5] = {-1, 2, -3, 4, -5};
    in = (eng_tensor){.dtype = ENG_DTYPE_F32, .ndim = 1, .dims = {5}, .data = x5};
    eng_tensor out;
    cr_assert_eq(eng_plan_run(p, &in, &out), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(out.ndim, 1);
    cr_assert_eq(out.dims[0], 5);
    cr_expect_float_eq(((float *)out.data)[3], 4.f, 0);
    cr_expect_float_eq(((float *)out.data)[4], 0.f, 0);
    in.dtype = ENG_DTYPE_I64; /* the dtype still counts */
    cr_expect_neq(eng_plan_run(p, &in, &out), ENG_STATUS_OK);
    eng_plan_free(&p);
    eng_graph_free(&g);
}

Test(ctrl, sequences_are_one_block) {
    float a[2] = {1, 2}, b[3] = {3, 4, 5};
    eng_tensor items[2] = {{.dtype = ENG_DTYPE_F32, .ndim = 1, .dims = {2}, .data = a},
                           {.dtype = ENG_DTYPE_F32, .ndim = 1, .dims = {3}, .data = b}};
    eng_tensor s, c;
    cr_assert_eq(eng_seq_make(ENG_DTYPE_F32, items, 2, &s), ENG_STATUS_OK);
    cr_assert_eq(eng_seq_clone(&s, &c), ENG_STATUS_OK);
    eng_free(s.data); /* the clone owns its own bytes */
    const eng_seq *q = eng_seq_get(&c);
    cr_assert(q);
    cr_assert_eq(q->n, 2);
    cr_expect_float_eq(((float *)q->items[1].data)[2], 5.f, 0);
    cr_expect_eq(eng_value_nbytes(&c), q->bytes);
    eng_tensor *cl = eng_tensor_clone(&c);
    cr_assert(cl && eng_seq_get(cl) && eng_seq_get(cl)->n == 2);
    eng_tensor_destroy(&cl);
    eng_free(c.data);
    items[1].dtype = ENG_DTYPE_I64; /* mixed dtypes: refused, naming the element */
    cr_expect_eq(eng_seq_make(ENG_DTYPE_F32, items, 2, &s), ENG_STATUS_INVALID_ARGUMENT);
    cr_expect(strstr(eng_last_error(), "element 1"), "%s", eng_last_error());
    eng_tensor notseq = {.dtype = ENG_DTYPE_F32, .data = a};
    cr_expect_null(eng_seq_get(&notseq));
}

/* Loop(M; s0) with body: s' = s + w (w from the enclosing graph), scan output s', cond passed through. */
static eng_graph *loop_graph(void) {
    eng_graph *body = eng_graph_new();
    int64_t d1[1] = {2};
    int it = val(body, "i"), cd = val(body, "cond_in"), s = val(body, "s"), w = val(body, "w");
    int so = val(body, "s_out"), sc = val(body, "scan"), co = val(body, "cond_out");
    list_add(&body->inputs, &body->ninputs, it);
    list_add(&body->inputs, &body->ninputs, cd);
    list_add(&body->inputs, &body->ninputs, s);
    node(body, "Add", (int[]){s, w}, 2, &so, 1);
    node(body, "Identity", &so, 1, &sc, 1);
    node(body, "Identity", &cd, 1, &co, 1);
    list_add(&body->outputs, &body->noutputs, co);
    list_add(&body->outputs, &body->noutputs, so);
    list_add(&body->outputs, &body->noutputs, sc);

    eng_graph *g = eng_graph_new();
    g->opset = 17;
    int64_t d0[1] = {1};
    float wv[2] = {1, 10}, s0[2] = {0, 0};
    int m = val(g, "M");
    g->values[m].dtype = ENG_DTYPE_I64;
    g->values[m].ndim = 0;
    list_add(&g->inputs, &g->ninputs, m);
    int sv = init_f32(g, "s0", 1, d1, s0), wg = init_f32(g, "w", 1, d1, wv);
    (void)d0;
    int fin = val(g, "final"), scan = val(g, "scans");
    int k = node(g, "Loop", (int[]){m, -1, sv, wg}, 4, (int[]){fin, scan}, 2);
    g->nodes[k].nimplicit = 1; /* w: read by the body */
    eng_attr a = {.name = strdup("body"), .type = ENG_ATTR_GRAPH, .g = body};
    cr_assert_eq(eng_node_take_attr(g, k, &a), ENG_STATUS_OK);
    list_add(&g->outputs, &g->noutputs, fin);
    list_add(&g->outputs, &g->noutputs, scan);
    return g;
}

static eng_status run_loop(eng_session *s, int64_t M, eng_tensor *out) {
    eng_tensor in = {.dtype = ENG_DTYPE_I64, .ndim = 0, .data = &M};
    const char *names[1] = {"M"};
    return eng_session_run(s, 1, names, &in, out);
}

Test(ctrl, loop_outer_scope_scan_limit_deadline) {
    eng_graph *g = loop_graph();
    eng_session_opts so = {.nthreads = 1};
    eng_session *s = NULL;
    cr_assert_eq(eng_session_new_graph(g, &so, &s), ENG_STATUS_OK, "%s", eng_last_error());
    eng_tensor out[2];
    cr_assert_eq(run_loop(s, 3, out), ENG_STATUS_OK, "%s", eng_last_error());
    const float *fin = out[0].data, *sc = out[1].data;
    cr_expect_float_eq(fin[0], 3.f, 0);
    cr_expect_float_eq(fin[1], 30.f, 0);
    cr_assert_eq(out[1].ndim, 2);
    cr_assert_eq(out[1].dims[0], 3);
    cr_expect_float_eq(sc[2 * 1 + 1], 20.f, 0); /* iteration 1's s' */
    cr_assert_eq(run_loop(s, 0, out), ENG_STATUS_OK, "%s", eng_last_error());
    cr_expect_eq(out[1].dims[0], 0);
    cr_expect_float_eq(((float *)out[0].data)[1], 0.f, 0); /* no iteration: the initial value */

    eng_set_max_loop_iterations(5);
    cr_expect_eq(run_loop(s, 6, out), ENG_STATUS_INVALID_ARGUMENT);
    cr_expect(strstr(eng_last_error(), "--max_loop_iterations") && strstr(eng_last_error(), "Loop"), "%s",
              eng_last_error());
    cr_expect_eq(run_loop(s, 5, out), ENG_STATUS_OK, "%s", eng_last_error());
    eng_set_max_loop_iterations(1000000);

    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    eng_run_set_deadline((int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000); /* already past */
    cr_expect_eq(run_loop(s, 1000, out), ENG_STATUS_DEADLINE_EXCEEDED);
    cr_expect(strstr(eng_last_error(), "deadline"), "%s", eng_last_error());
    eng_run_set_deadline(0);
    cr_expect_eq(run_loop(s, 4, out), ENG_STATUS_OK, "%s", eng_last_error());
    eng_session_free(&s);
}

Test(ctrl, malformed_loop_is_refused_at_load) {
    eng_graph *g = loop_graph();
    eng_attr *a = &g->nodes[0].attrs[0];
    a->g->ninputs = 2; /* the body forgets its loop-carried input */
    eng_session_opts so = {.nthreads = 1};
    eng_session *s = NULL;
    cr_assert_eq(eng_session_new_graph(g, &so, &s), ENG_STATUS_INVALID_MODEL);
    cr_expect(strstr(eng_last_error(), "node 'Loop' (Loop)") && strstr(eng_last_error(), "subgraph 'body' has 2 inputs"),
              "%s", eng_last_error());
}
