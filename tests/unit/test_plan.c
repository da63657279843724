/* test_plan.c - planner and session: constant folding of shape arithmetic, memory reuse, dynamic plans,
 * plan cache, and the error messages for bad inputs and unknown ops. Graphs are built in C. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/ir/graph.h"
#include "engine/plan/session.h"

static int val(eng_graph *g, const char *name, eng_dtype dt, int ndim, const int64_t *dims) {
    int v = eng_graph_add_value(g, name);
    g->values[v].dtype = dt;
    g->values[v].ndim = ndim;
    for (int i = 0; i < ndim; i++) g->values[v].dims[i] = dims ? dims[i] : -1;
    return v;
}

static void add_input(eng_graph *g, int v) {
    g->inputs = realloc(g->inputs, (size_t)(g->ninputs + 1) * sizeof(int));
    g->inputs[g->ninputs++] = v;
}

static void add_output(eng_graph *g, int v) {
    g->outputs = realloc(g->outputs, (size_t)(g->noutputs + 1) * sizeof(int));
    g->outputs[g->noutputs++] = v;
}

static void set_init_i64(eng_graph *g, int v, const int64_t *data, int64_t n) {
    eng_tensor *t = calloc(1, sizeof *t);
    t->dtype = ENG_DTYPE_I64;
    t->ndim = 1;
    t->dims[0] = n;
    t->data = eng_alloc((size_t)n * 8);
    memcpy(t->data, data, (size_t)n * 8);
    eng_value_set_init(g, v, t);
}

static int node(eng_graph *g, const char *name, const char *op, int a, int b, int out) {
    int ins[2] = {a, b};
    return eng_graph_add_node(g, name, op, "", ins, b == -2 ? 1 : 2, &out, 1);
}

/* x[N,4] -> Relu -> Shape -> Gather(0) ... Reshape(relu, [N*2, 2]) -> Add(x2) chain; shape math must fold. */
static eng_graph *chain_graph(void) {
    eng_graph *g = eng_graph_new();
    g->opset = 17;
    int64_t d[2] = {-1, 4};
    int x = val(g, "x", ENG_DTYPE_F32, 2, d);
    add_input(g, x);
    int r = val(g, "r", ENG_DTYPE_UNDEFINED, -1, NULL);
    node(g, "relu", "Relu", x, -2, r);
    int shp = val(g, "shp", ENG_DTYPE_UNDEFINED, -1, NULL);
    node(g, "shape", "Shape", r, -2, shp);
    int newshape = val(g, "newshape", ENG_DTYPE_I64, 1, (int64_t[]){2});
    int64_t ns[2] = {-1, 2};
    set_init_i64(g, newshape, ns, 2);
    int rs = val(g, "rs", ENG_DTYPE_UNDEFINED, -1, NULL);
    node(g, "reshape", "Reshape", r, newshape, rs);
    int a1 = val(g, "a1", ENG_DTYPE_UNDEFINED, -1, NULL);
    node(g, "add1", "Add", rs, rs, a1);
    int a2 = val(g, "a2", ENG_DTYPE_UNDEFINED, -1, NULL);
    node(g, "add2", "Add", a1, rs, a2);
    int a3 = val(g, "a3", ENG_DTYPE_UNDEFINED, -1, NULL);
    node(g, "add3", "Add", a2, a1, a3);
    add_output(g, a3);
    add_output(g, shp);
    return g;
}

Test(plan, folds_shape_math_and_reuses_memory) {
    eng_session *s = NULL;
    cr_assert_eq(eng_session_new_graph(chain_graph(), NULL, &s), ENG_STATUS_OK, "%s", eng_last_error());
    float x[12] = {1, -2, 3, -4, 5, -6, 7, -8, 9, -10, 11, -12};
    eng_tensor in = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {3, 4}, .data = x};
    const char *names[1] = {"x"};
    eng_tensor out[2];
    cr_assert_eq(eng_session_run(s, 1, names, &in, out), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(out[0].ndim, 2);
    cr_assert_eq(out[0].dims[0], 6);
    cr_assert_eq(out[0].dims[1], 2);
    const float *y = out[0].data;
    for (int i = 0; i < 12; i++) {
        float r = x[i] > 0 ? x[i] : 0;
        cr_assert_float_eq(y[i], 5 * r, 1e-6, "element %d", i);
    }
    cr_assert_eq(out[1].dtype, ENG_DTYPE_I64);
    cr_assert_eq(((int64_t *)out[1].data)[0], 3);
    cr_assert_eq(((int64_t *)out[1].data)[1], 4);
    eng_plan_stats st;
    eng_session_last_stats(s, &st);
    cr_assert_eq(st.dynamic, 0);
    cr_assert_eq(st.folded, 1, "Shape must be folded at plan time, folded=%d", st.folded);
    cr_assert_lt(st.arena_bytes, st.naive_bytes, "arena %zu should reuse memory (naive %zu)", st.arena_bytes,
                 st.naive_bytes);
    /* a second batch size compiles a second plan; the first is still right afterwards */
    float x2[4] = {1, 2, 3, 4};
    eng_tensor in2 = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {1, 4}, .data = x2};
    cr_assert_eq(eng_session_run(s, 1, names, &in2, out), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(out[0].dims[0], 2);
    cr_assert_float_eq(((float *)out[0].data)[3], 20.0f, 1e-6);
    cr_assert_eq(eng_session_run(s, 1, names, &in, out), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_float_eq(((float *)out[0].data)[0], 5.0f, 1e-6);
    eng_session_free(&s);
    cr_assert_null(s);
}

Test(plan, dynamic_reshape_from_input) {
    eng_graph *g = eng_graph_new();
    g->opset = 17;
    int x = val(g, "x", ENG_DTYPE_F32, 1, (int64_t[]){6});
    int shape = val(g, "shape", ENG_DTYPE_I64, 1, (int64_t[]){2});
    add_input(g, x);
    add_input(g, shape);
    int rs = val(g, "y", ENG_DTYPE_UNDEFINED, -1, NULL);
    node(g, "reshape", "Reshape", x, shape, rs);
    int o = val(g, "z", ENG_DTYPE_UNDEFINED, -1, NULL);
    node(g, "neg", "Neg", rs, -2, o);
    add_output(g, o);
    eng_session *s = NULL;
    cr_assert_eq(eng_session_new_graph(g, NULL, &s), ENG_STATUS_OK, "%s", eng_last_error());
    float xv[6] = {1, 2, 3, 4, 5, 6};
    int64_t sv[2] = {3, 2};
    eng_tensor in[2] = {{.dtype = ENG_DTYPE_F32, .ndim = 1, .dims = {6}, .data = xv},
                        {.dtype = ENG_DTYPE_I64, .ndim = 1, .dims = {2}, .data = sv}};
    const char *names[2] = {"x", "shape"};
    eng_tensor out[1];
    cr_assert_eq(eng_session_run(s, 2, names, in, out), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(out[0].ndim, 2);
    cr_assert_eq(out[0].dims[0], 3);
    cr_assert_float_eq(((float *)out[0].data)[5], -6.0f, 1e-6);
    eng_plan_stats st;
    eng_session_last_stats(s, &st);
    cr_assert_eq(st.dynamic, 1);
    sv[0] = 2;
    sv[1] = 3;
    cr_assert_eq(eng_session_run(s, 2, names, in, out), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(out[0].dims[0], 2);
    cr_assert_eq(out[0].dims[1], 3);
    sv[0] = 4;
    sv[1] = 4;
    cr_assert_neq(eng_session_run(s, 2, names, in, out), ENG_STATUS_OK);
    eng_session_free(&s);
}

Test(plan, bad_inputs_name_the_input) {
    eng_session *s = NULL;
    cr_assert_eq(eng_session_new_graph(chain_graph(), NULL, &s), ENG_STATUS_OK, "%s", eng_last_error());
    float x[8] = {0};
    eng_tensor out[2];
    const char *bad[1] = {"nope"};
    eng_tensor in = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {2, 4}, .data = x};
    cr_assert_eq(eng_session_run(s, 1, bad, &in, out), ENG_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(eng_last_error(), "'nope'") && strstr(eng_last_error(), "'x'"), "%s", eng_last_error());
    const char *names[1] = {"x"};
    eng_tensor wrong_dt = {.dtype = ENG_DTYPE_I32, .ndim = 2, .dims = {2, 4}, .data = x};
    cr_assert_eq(eng_session_run(s, 1, names, &wrong_dt, out), ENG_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(eng_last_error(), "float32") && strstr(eng_last_error(), "int32"), "%s", eng_last_error());
    eng_tensor wrong_shape = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {2, 3}, .data = x};
    cr_assert_eq(eng_session_run(s, 1, names, &wrong_shape, out), ENG_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(eng_last_error(), "[2,3]") && strstr(eng_last_error(), "4]"), "%s", eng_last_error());
    eng_tensor huge = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {(int64_t)1 << 40, 4}, .data = x};
    cr_assert_neq(eng_session_run(s, 1, names, &huge, out), ENG_STATUS_OK);
    cr_assert_eq(eng_session_run(s, 0, names, &in, out), ENG_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(eng_last_error(), "missing input 'x'"), "%s", eng_last_error());
    eng_session_free(&s);
}

Test(plan, unknown_op_names_node_and_op) {
    eng_graph *g = eng_graph_new();
    g->opset = 17;
    int x = val(g, "x", ENG_DTYPE_F32, 1, (int64_t[]){2});
    add_input(g, x);
    int y = val(g, "y", ENG_DTYPE_UNDEFINED, -1, NULL);
    node(g, "mystery_node", "FrobnicateV9", x, -2, y);
    add_output(g, y);
    eng_session *s = NULL;
    cr_assert_eq(eng_session_new_graph(g, NULL, &s), ENG_STATUS_UNSUPPORTED);
    cr_assert_null(s);
    cr_assert(strstr(eng_last_error(), "mystery_node") && strstr(eng_last_error(), "FrobnicateV9"), "%s",
              eng_last_error());
}
