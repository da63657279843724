/* test_onnx_io.c - ONNX model/TensorProto loading and saving, graph IR checks, .npy files.
 *
 * Golden inputs are ONNX's own backend test models (/usr/share/libonnx-testdata); tests that need them skip
 * when the package is absent. Every fixture is generated at run time in a fresh mkdtemp directory: models with
 * external data are written by eng_onnx_save_file and then edited with the generated protobuf-c code.
 * Robustness tests (every prefix, random byte flips, path traversal, nesting bombs) only check that errors come
 * back as statuses; run them under `make SAN=1 test-unit` to have ASan/UBSan check memory safety too.
 * The backend test case loader (onnx-testdata.c: lists, data sets, bfloat16 stored as uint16) is tested here too.
 */
#include <criterion/criterion.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/ir/graph.h"
#include "engine/ir/npy.h"
#include "engine/ir/onnx.h"
#include "engine/ir/onnx-testdata.h"
#include "onnx.pb-c.h"

#define TD "/usr/share/libonnx-testdata/data"

/* ---- helpers ---- */

static char tmpdir[256];

static void mk_tmp(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tensord-onnx-io-XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
}

static void rm_tmp(void) {
    char cmd[400];
    if (!tmpdir[0]) return;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    cr_assert_eq(system(cmd), 0);
    tmpdir[0] = '\0';
}

static char *tpath(const char *name) {
    static char buf[4][512];
    static int k;
    char *b = buf[k++ & 3];
    snprintf(b, 512, "%s/%s", tmpdir, name);
    return b;
}

static int have_testdata(void) { return access(TD "/node/test_relu/model.onnx", R_OK) == 0; }

static eng_graph *load_ok(const char *path) {
    eng_graph *g = NULL;
    eng_status st = eng_onnx_load_file(path, &g);
    cr_assert_eq(st, ENG_STATUS_OK, "load %s: %s", path, eng_last_error());
    cr_assert_not_null(g);
    return g;
}

static uint8_t *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n + 1);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void write_all(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "create %s", path);
    cr_assert_eq(fwrite(b, 1, n, f), n);
    fclose(f);
}

static int str_eq(const char *a, const char *b) { return strcmp(a ? a : "", b ? b : "") == 0; }

static int tensor_eq(const eng_tensor *a, const eng_tensor *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->dims[i] != b->dims[i]) return 0;
    if (!a->data != !b->data) return 0;
    return !a->data || memcmp(a->data, b->data, eng_tensor_nbytes(a)) == 0;
}

/* Structural equality; on mismatch writes the reason into why. */
static int graph_eq(const eng_graph *a, const eng_graph *b, char *why, size_t n, int top) {
#define NE(cond, ...) do { if (cond) { snprintf(why, n, __VA_ARGS__); return 0; } } while (0)
    NE(!str_eq(a->name, b->name), "graph name '%s' vs '%s'", a->name, b->name);
    NE(a->nvalues != b->nvalues, "graph '%s': nvalues %d vs %d", a->name, a->nvalues, b->nvalues);
    NE(a->nnodes != b->nnodes, "graph '%s': nnodes %d vs %d", a->name, a->nnodes, b->nnodes);
    NE(a->ninputs != b->ninputs || a->noutputs != b->noutputs, "graph '%s': io counts", a->name);
    NE(!str_eq(a->doc_string, b->doc_string), "graph '%s': doc_string", a->name);
    if (top) {
        NE(a->ir_version != b->ir_version, "ir_version %lld vs %lld", (long long)a->ir_version,
           (long long)b->ir_version);
        NE(a->opset != b->opset || a->opset_ml != b->opset_ml, "opsets");
        NE(!str_eq(a->producer_name, b->producer_name) || !str_eq(a->producer_version, b->producer_version),
           "producer");
    }
    for (int i = 0; i < a->ninputs; i++) NE(a->inputs[i] != b->inputs[i], "input %d", i);
    for (int i = 0; i < a->noutputs; i++) NE(a->outputs[i] != b->outputs[i], "output %d", i);
    for (int v = 0; v < a->nvalues; v++) {
        const eng_value *x = &a->values[v], *y = &b->values[v];
        NE(!str_eq(x->name, y->name), "value %d name '%s' vs '%s'", v, x->name, y->name);
        NE(x->dtype != y->dtype || x->ndim != y->ndim || x->producer != y->producer, "value '%s' type/producer",
           x->name);
        for (int d = 0; d < x->ndim && d < ENG_MAX_DIMS; d++) {
            NE(x->dims[d] != y->dims[d], "value '%s' dim %d", x->name, d);
            NE(!x->dim_param[d] != !y->dim_param[d] || (x->dim_param[d] && strcmp(x->dim_param[d], y->dim_param[d])),
               "value '%s' dim_param %d", x->name, d);
        }
        NE(!x->init != !y->init, "value '%s' init presence", x->name);
        NE(x->init && !tensor_eq(x->init, y->init), "value '%s' init data", x->name);
    }
    for (int i = 0; i < a->nnodes; i++) {
        const eng_node *x = &a->nodes[i], *y = &b->nodes[i];
        NE(!str_eq(x->name, y->name) || !str_eq(x->op_type, y->op_type) || !str_eq(x->domain, y->domain),
           "node %d name/op/domain", i);
        NE(x->nin != y->nin || x->nout != y->nout || x->nattr != y->nattr, "node '%s' counts", x->name);
        for (int k = 0; k < x->nin; k++) NE(x->inputs[k] != y->inputs[k], "node '%s' input %d", x->name, k);
        for (int k = 0; k < x->nout; k++) NE(x->outputs[k] != y->outputs[k], "node '%s' output %d", x->name, k);
        for (int k = 0; k < x->nattr; k++) {
            const eng_attr *p = &x->attrs[k], *q = &y->attrs[k];
            NE(!str_eq(p->name, q->name) || p->type != q->type, "node '%s' attr %d", x->name, k);
            switch (p->type) {
            case ENG_ATTR_FLOAT: NE(memcmp(&p->f, &q->f, 4) != 0, "attr '%s' f", p->name); break;
            case ENG_ATTR_INT: NE(p->i != q->i, "attr '%s' i", p->name); break;
            case ENG_ATTR_STRING:
                NE(p->s_len != q->s_len || memcmp(p->s, q->s, p->s_len) != 0, "attr '%s' s", p->name);
                break;
            case ENG_ATTR_FLOATS:
                NE(p->n != q->n || memcmp(p->floats, q->floats, (size_t)p->n * 4) != 0, "attr '%s' floats", p->name);
                break;
            case ENG_ATTR_INTS:
                NE(p->n != q->n || memcmp(p->ints, q->ints, (size_t)p->n * 8) != 0, "attr '%s' ints", p->name);
                break;
            case ENG_ATTR_STRINGS:
                NE(p->n != q->n, "attr '%s' strings", p->name);
                for (int j = 0; j < p->n; j++) NE(strcmp(p->strings[j], q->strings[j]), "attr '%s' [%d]", p->name, j);
                break;
            case ENG_ATTR_TENSOR: NE(!tensor_eq(&p->t, &q->t), "attr '%s' tensor", p->name); break;
            case ENG_ATTR_GRAPH:
                NE(!p->g || !q->g, "attr '%s' graph missing", p->name);
                NE(p->g->parent != a || q->g->parent != b, "attr '%s' subgraph parent", p->name);
                if (!graph_eq(p->g, q->g, why, n, 0)) return 0;
                break;
            default: break;
            }
        }
    }
    return 1;
#undef NE
}

static void roundtrip(const char *model, size_t threshold) {
    eng_graph *a = load_ok(model);
    char *out = tpath("rt.onnx");
    eng_status st = eng_onnx_save_file(a, out, threshold);
    cr_assert_eq(st, ENG_STATUS_OK, "save %s: %s", model, eng_last_error());
    eng_graph *b = load_ok(out);
    char why[512] = "";
    cr_assert(graph_eq(a, b, why, sizeof why, 1), "%s (threshold %zu): %s", model, threshold, why);
    eng_graph_free(&a);
    eng_graph_free(&b);
    unlink(out);
    unlink(tpath("rt.onnx.data"));
}

/* A small graph: y = Add(x, W) -> Relu; W is an initializer also listed as an input; plus a Constant node. */
static eng_graph *make_graph(int64_t wsize) {
    eng_graph *g = eng_graph_new();
    g->ir_version = 8;
    g->opset = 17;
    int x = eng_graph_add_value(g, "x"), w = eng_graph_add_value(g, "W"), s = eng_graph_add_value(g, "s");
    int c = eng_graph_add_value(g, "c"), y = eng_graph_add_value(g, "y");
    g->values[x].dtype = ENG_DTYPE_F32;
    g->values[x].ndim = 2;
    g->values[x].dims[0] = -1;
    g->values[x].dim_param[0] = strdup("N");
    g->values[x].dims[1] = wsize;
    eng_tensor *t = malloc(sizeof *t);
    *t = (eng_tensor){.dtype = ENG_DTYPE_F32, .ndim = 1, .dims = {wsize}, .data = eng_alloc((size_t)wsize * 4)};
    for (int64_t i = 0; i < wsize; i++) ((float *)t->data)[i] = (float)i * 0.5f - 3.0f;
    eng_value_set_init(g, w, t);
    g->values[w].dtype = ENG_DTYPE_F32;
    g->values[w].ndim = 1;
    g->values[w].dims[0] = wsize;
    g->inputs = malloc(2 * sizeof(int));
    g->inputs[0] = x;
    g->inputs[1] = w;
    g->ninputs = 2;
    g->outputs = malloc(sizeof(int));
    g->outputs[0] = y;
    g->noutputs = 1;
    int in[2] = {x, w};
    int n0 = eng_graph_add_node(g, "add", "Add", "", in, 2, &s, 1);
    int n1 = eng_graph_add_node(g, "", "Constant", "", NULL, 0, &c, 1);
    int in2[2] = {s, c};
    int n2 = eng_graph_add_node(g, "relu", "Max", "", in2, 2, &y, 1);
    cr_assert(n0 == 0 && n1 == 1 && n2 == 2);
    float cv[64];
    for (int i = 0; i < 64; i++) cv[i] = (float)i;
    eng_attr a = {.name = "value", .type = ENG_ATTR_TENSOR,
                  .t = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {8, 8}, .data = cv}};
    cr_assert_eq(eng_node_add_attr(g, n1, &a), ENG_STATUS_OK, "%s", eng_last_error());
    int64_t ints[3] = {1, -2, 3};
    float fl[2] = {0.25f, -1.5f};
    char *strs[2] = {"a", "bc"};
    eng_attr misc[] = {
        {.name = "i", .type = ENG_ATTR_INT, .i = -7},
        {.name = "f", .type = ENG_ATTR_FLOAT, .f = 2.5f},
        {.name = "s", .type = ENG_ATTR_STRING, .s = "hello", .s_len = 5},
        {.name = "ints", .type = ENG_ATTR_INTS, .ints = ints, .n = 3},
        {.name = "floats", .type = ENG_ATTR_FLOATS, .floats = fl, .n = 2},
        {.name = "strings", .type = ENG_ATTR_STRINGS, .strings = strs, .n = 2},
    };
    for (size_t i = 0; i < sizeof misc / sizeof misc[0]; i++)
        cr_assert_eq(eng_node_add_attr(g, n0, &misc[i]), ENG_STATUS_OK);
    return g;
}

/* ---- graph IR ---- */

Test(graph, accessors_and_clone) {
    eng_graph *g = make_graph(4);
    const eng_node *n = &g->nodes[0];
    cr_assert_eq(eng_node_attr_int(n, "i", 0), -7);
    cr_assert_eq(eng_node_attr_int(n, "missing", 42), 42);
    cr_assert_eq(eng_node_attr_int(n, "f", 9), 9, "wrong type gives the default");
    cr_assert_float_eq(eng_node_attr_float(n, "f", 0), 2.5f, 0);
    cr_assert_str_eq(eng_node_attr_str(n, "s", "x"), "hello");
    const int64_t *ip;
    const float *fp;
    cr_assert_eq(eng_node_attr_ints(n, "ints", &ip), 3);
    cr_assert_eq(ip[1], -2);
    cr_assert_eq(eng_node_attr_floats(n, "floats", &fp), 2);
    cr_assert_eq(eng_node_attr_ints(n, "nope", &ip), -1);
    cr_assert_null(ip);
    cr_assert_eq(eng_graph_find_value(g, "y"), 4);
    cr_assert_eq(eng_graph_find_value(g, "zz"), -1);
    cr_assert_eq(g->values[4].producer, 2);
    eng_graph *c = eng_graph_clone(g);
    char why[256];
    cr_assert(graph_eq(g, c, why, sizeof why, 1), "%s", why);
    eng_graph_free(&g);
    cr_assert_null(g);
    eng_graph_free(&c);
    eng_graph_free(&c); /* NULL-safe */
}

Test(graph, topo_order_reorders_and_detects_cycles) {
    eng_graph *g = eng_graph_new();
    int a = eng_graph_add_value(g, "a"), b = eng_graph_add_value(g, "b"), c = eng_graph_add_value(g, "c");
    g->inputs = malloc(sizeof(int));
    g->inputs[0] = a;
    g->ninputs = 1;
    eng_graph_add_node(g, "second", "Relu", "", &b, 1, &c, 1);
    eng_graph_add_node(g, "first", "Relu", "", &a, 1, &b, 1);
    int order[2];
    cr_assert_eq(eng_graph_topo_order(g, order), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert(order[0] == 1 && order[1] == 0);
    /* make a cycle: first now reads c */
    g->nodes[1].inputs[0] = c;
    cr_assert_eq(eng_graph_topo_order(g, order), ENG_STATUS_INVALID_MODEL);
    cr_assert(strstr(eng_last_error(), "cycle"), "%s", eng_last_error());
    /* missing input */
    int d = eng_graph_add_value(g, "dangling");
    g->nodes[1].inputs[0] = d;
    cr_assert_eq(eng_graph_topo_order(g, order), ENG_STATUS_INVALID_MODEL);
    cr_assert(strstr(eng_last_error(), "dangling") && strstr(eng_last_error(), "first"), "%s", eng_last_error());
    eng_graph_free(&g);
}

/* ---- loading the ONNX backend test models ---- */

Test(onnx_load, relu_conv_attrs) {
    if (!have_testdata()) cr_skip_test("libonnx-testdata not installed");
    eng_graph *g = load_ok(TD "/node/test_relu/model.onnx");
    cr_assert_eq(g->nnodes, 1);
    cr_assert_str_eq(g->nodes[0].op_type, "Relu");
    cr_assert_str_eq(g->nodes[0].name, "");
    cr_assert_eq(g->ninputs, 1);
    cr_assert_eq(g->noutputs, 1);
    const eng_value *x = &g->values[g->inputs[0]];
    cr_assert_str_eq(x->name, "x");
    cr_assert_eq(x->dtype, ENG_DTYPE_F32);
    cr_assert_eq(x->ndim, 3);
    cr_assert(x->dims[0] == 3 && x->dims[1] == 4 && x->dims[2] == 5);
    cr_assert_str_eq(g->values[g->outputs[0]].name, "y");
    cr_assert_gt(g->opset, 0);
    cr_assert_gt(g->ir_version, 0);
    cr_assert_str_eq(g->producer_name, "backend-test");
    eng_graph_free(&g);

    g = load_ok(TD "/node/test_conv_with_strides_padding/model.onnx");
    const eng_node *n = &g->nodes[0];
    const int64_t *v;
    cr_assert_eq(eng_node_attr_ints(n, "strides", &v), 2);
    cr_assert(v[0] == 2 && v[1] == 2);
    cr_assert_eq(eng_node_attr_ints(n, "pads", &v), 4);
    cr_assert_eq(eng_node_attr_ints(n, "kernel_shape", &v), 2);
    cr_assert_eq(g->opset, 11);
    eng_graph_free(&g);
}

Test(onnx_load, subgraphs_and_tensor_attrs) {
    if (!have_testdata()) cr_skip_test("libonnx-testdata not installed");
    eng_graph *g = load_ok(TD "/node/test_if/model.onnx");
    const eng_node *n = &g->nodes[0];
    cr_assert_str_eq(n->op_type, "If");
    const eng_attr *th = eng_node_attr(n, "then_branch"), *el = eng_node_attr(n, "else_branch");
    cr_assert(th && el && th->type == ENG_ATTR_GRAPH && el->type == ENG_ATTR_GRAPH);
    cr_assert_eq(th->g->parent, g);
    cr_assert_eq(th->g->noutputs, 1);
    cr_assert_str_eq(th->g->nodes[0].op_type, "Constant");
    const eng_attr *val = eng_node_attr(&th->g->nodes[0], "value");
    cr_assert(val && val->type == ENG_ATTR_TENSOR && val->t.data);
    eng_graph_free(&g);

    g = load_ok(TD "/node/test_loop11/model.onnx");
    const eng_attr *body = eng_node_attr(&g->nodes[0], "body");
    cr_assert(body && body->g);
    cr_assert_eq(body->g->ninputs, 3);
    cr_assert_eq(body->g->noutputs, 3);
    cr_assert_eq(g->noutputs, 2);
    eng_graph_free(&g);

    g = load_ok(TD "/node/test_constant/model.onnx");
    val = eng_node_attr(&g->nodes[0], "value");
    cr_assert(val && val->type == ENG_ATTR_TENSOR && val->t.dtype == ENG_DTYPE_F32);
    cr_assert_eq(val->t.ndim, 2);
    eng_graph_free(&g);
}

Test(onnx_load, tensorproto_file) {
    if (!have_testdata()) cr_skip_test("libonnx-testdata not installed");
    eng_tensor *x = NULL, *y = NULL;
    char *name = NULL;
    eng_status st = eng_onnx_tensor_load_file(TD "/node/test_relu/test_data_set_0/input_0.pb", &x, &name);
    cr_assert_eq(st, ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_str_eq(name, "x");
    cr_assert(x->dtype == ENG_DTYPE_F32 && x->ndim == 3 && x->dims[2] == 5);
    cr_assert_eq(eng_onnx_tensor_load_file(TD "/node/test_relu/test_data_set_0/output_0.pb", &y, NULL), ENG_STATUS_OK);
    for (int64_t i = 0; i < eng_tensor_numel(x); i++) {
        float a = ((float *)x->data)[i];
        cr_assert_eq(((float *)y->data)[i], a > 0 ? a : 0);
    }
    free(name);
    eng_tensor_destroy(&x);
    eng_tensor_destroy(&y);
    cr_assert_null(x);
    cr_assert_eq(eng_onnx_tensor_load_file("/nonexistent/x.pb", &x, NULL), ENG_STATUS_NOT_FOUND);
}

static Onnx__TensorProto *tp_new(const char *name, int dt, int64_t n) {
    Onnx__TensorProto *tp = calloc(1, sizeof *tp);
    onnx__tensor_proto__init(tp);
    tp->name = strdup(name);
    tp->has_data_type = 1;
    tp->data_type = dt;
    tp->n_dims = 1;
    tp->dims = malloc(sizeof(int64_t));
    tp->dims[0] = n;
    return tp;
}

static eng_status tp_load(Onnx__TensorProto *tp, eng_tensor **out) {
    size_t len = onnx__tensor_proto__get_packed_size(tp);
    uint8_t *b = malloc(len + 1);
    onnx__tensor_proto__pack(tp, b);
    write_all(tpath("t.pb"), b, len);
    free(b);
    onnx__tensor_proto__free_unpacked(tp, NULL);
    return eng_onnx_tensor_load_file(tpath("t.pb"), out, NULL);
}

Test(onnx_load, tensorproto_typed_fields, .init = mk_tmp, .fini = rm_tmp) {
    static const struct { int dt; int field; } cases[] = { /* field: 0 int32 1 int64 2 uint64 3 float 4 double */
        {ENG_DTYPE_I8, 0}, {ENG_DTYPE_U8, 0}, {ENG_DTYPE_I16, 0}, {ENG_DTYPE_U16, 0}, {ENG_DTYPE_I32, 0},
        {ENG_DTYPE_BOOL, 0}, {ENG_DTYPE_F16, 0}, {ENG_DTYPE_BF16, 0}, {ENG_DTYPE_I64, 1}, {ENG_DTYPE_U32, 2},
        {ENG_DTYPE_U64, 2}, {ENG_DTYPE_F32, 3}, {ENG_DTYPE_F64, 4},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int dt = cases[c].dt;
        Onnx__TensorProto *tp = tp_new("t", dt, 3);
        int32_t i32[3] = {1, 0, 2};
        if (dt == ENG_DTYPE_I8 || dt == ENG_DTYPE_I16) i32[1] = -5;
        if (dt == ENG_DTYPE_F16) i32[0] = 0x3c00, i32[1] = 0xc000, i32[2] = 0; /* 1, -2, 0 */
        if (dt == ENG_DTYPE_BF16) i32[0] = 0x3f80, i32[1] = 0xc000, i32[2] = 0;
        switch (cases[c].field) {
        case 0: tp->n_int32_data = 3; tp->int32_data = malloc(12); memcpy(tp->int32_data, i32, 12); break;
        case 1: tp->n_int64_data = 3; tp->int64_data = malloc(24); tp->int64_data[0] = 1; tp->int64_data[1] = -5;
                tp->int64_data[2] = (int64_t)1 << 40; break;
        case 2: tp->n_uint64_data = 3; tp->uint64_data = malloc(24); tp->uint64_data[0] = 1;
                tp->uint64_data[1] = 7; tp->uint64_data[2] = 4000000000u; break;
        case 3: tp->n_float_data = 3; tp->float_data = malloc(12); tp->float_data[0] = 1; tp->float_data[1] = -2;
                tp->float_data[2] = 0.5f; break;
        case 4: tp->n_double_data = 3; tp->double_data = malloc(24); tp->double_data[0] = 1;
                tp->double_data[1] = -2; tp->double_data[2] = 0.5; break;
        }
        eng_tensor *t = NULL;
        eng_status st = tp_load(tp, &t);
        cr_assert_eq(st, ENG_STATUS_OK, "dtype %d: %s", dt, eng_last_error());
        cr_assert_eq(t->dtype, (eng_dtype)dt);
        cr_assert_eq(eng_tensor_get_f64(t, 0), 1.0, "dtype %s", eng_dtype_name(t->dtype));
        if (dt == ENG_DTYPE_I8 || dt == ENG_DTYPE_I16 || dt == ENG_DTYPE_I64) cr_assert_eq(eng_tensor_get_i64(t, 1), -5);
        if (dt == ENG_DTYPE_F16 || dt == ENG_DTYPE_BF16 || dt == ENG_DTYPE_F32 || dt == ENG_DTYPE_F64)
            cr_assert_eq(eng_tensor_get_f64(t, 1), -2.0, "dtype %s", eng_dtype_name(t->dtype));
        if (dt == ENG_DTYPE_U32) cr_assert_eq(((uint32_t *)t->data)[2], 4000000000u);
        if (dt == ENG_DTYPE_I64) cr_assert_eq(((int64_t *)t->data)[2], (int64_t)1 << 40);
        eng_tensor_destroy(&t);

        /* count mismatch is an error naming the tensor */
        tp = tp_new("short", dt, 4);
        tp->n_int32_data = 1; tp->int32_data = malloc(4); tp->int32_data[0] = 1;
        tp->n_int64_data = 1; tp->int64_data = malloc(8); tp->int64_data[0] = 1;
        tp->n_uint64_data = 1; tp->uint64_data = malloc(8); tp->uint64_data[0] = 1;
        tp->n_float_data = 1; tp->float_data = malloc(4); tp->float_data[0] = 1;
        tp->n_double_data = 1; tp->double_data = malloc(8); tp->double_data[0] = 1;
        cr_assert_eq(tp_load(tp, &t), ENG_STATUS_INVALID_MODEL);
        cr_assert(strstr(eng_last_error(), "'short'"), "%s", eng_last_error());
    }
    /* raw_data size must match exactly */
    Onnx__TensorProto *tp = tp_new("raw", ENG_DTYPE_F32, 2);
    tp->has_raw_data = 1;
    tp->raw_data.len = 7;
    tp->raw_data.data = calloc(1, 7);
    eng_tensor *t = NULL;
    cr_assert_eq(tp_load(tp, &t), ENG_STATUS_INVALID_MODEL);
    cr_assert(strstr(eng_last_error(), "raw_data has 7 bytes, expected 8"), "%s", eng_last_error());
    /* huge dims with no data: refused before allocating */
    tp = tp_new("huge", ENG_DTYPE_F32, (int64_t)1 << 40);
    cr_assert_neq(tp_load(tp, &t), ENG_STATUS_OK);
    tp = tp_new("neg", ENG_DTYPE_F32, -1);
    cr_assert_eq(tp_load(tp, &t), ENG_STATUS_INVALID_MODEL);
    /* strings are unsupported, naming the tensor */
    tp = tp_new("words", ENG_DTYPE_STRING, 1);
    tp->n_string_data = 1;
    tp->string_data = calloc(1, sizeof(ProtobufCBinaryData));
    tp->string_data[0].data = (uint8_t *)strdup("hi");
    tp->string_data[0].len = 2;
    cr_assert_eq(tp_load(tp, &t), ENG_STATUS_UNSUPPORTED);
    cr_assert(strstr(eng_last_error(), "'words'"), "%s", eng_last_error());
    cr_assert_null(t);
}

/* ---- round trips ---- */

static void roundtrip_dir(const char *dir, size_t threshold, int max) {
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    struct dirent *e;
    int done = 0;
    while ((e = readdir(d)) && done < max) {
        if (e->d_name[0] == '.') continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s/model.onnx", dir, e->d_name);
        eng_graph *g = NULL;
        if (eng_onnx_load_file(p, &g) != ENG_STATUS_OK) continue; /* unsupported (sequences...) */
        eng_graph_free(&g);
        roundtrip(p, threshold);
        done++;
    }
    closedir(d);
    cr_assert_gt(done, 0);
}

Test(onnx_save, roundtrip_backend_models, .init = mk_tmp, .fini = rm_tmp, .timeout = 120) {
    if (!have_testdata()) cr_skip_test("libonnx-testdata not installed");
    roundtrip_dir(TD "/node", 0, 100000);
    roundtrip_dir(TD "/pytorch-converted", 0, 100000);
}

Test(onnx_save, roundtrip_external_data, .init = mk_tmp, .fini = rm_tmp, .timeout = 120) {
    if (!have_testdata()) cr_skip_test("libonnx-testdata not installed");
    roundtrip_dir(TD "/pytorch-converted", 64, 100000);
    roundtrip_dir(TD "/node", 16, 200);
}

Test(onnx_save, built_graph_initializer_input_external, .init = mk_tmp, .fini = rm_tmp) {
    eng_graph *g = make_graph(100);
    char *p = tpath("m.onnx");
    cr_assert_eq(eng_onnx_save_file(g, p, 128), ENG_STATUS_OK, "%s", eng_last_error());
    struct stat sb;
    cr_assert_eq(stat(tpath("m.onnx.data"), &sb), 0, "external data file written");
    cr_assert_geq(sb.st_size, 400);
    eng_graph *h = load_ok(p);
    char why[256];
    cr_assert(graph_eq(g, h, why, sizeof why, 1), "%s", why);
    /* W is an initializer that is also a graph input: it stays an initializer and is listed in inputs */
    int w = eng_graph_find_value(h, "W");
    cr_assert(h->values[w].init);
    cr_assert_eq(h->ninputs, 2);
    cr_assert_eq(h->inputs[1], w);
    cr_assert_str_eq(h->values[h->inputs[0]].dim_param[0], "N");
    /* no temp files left behind */
    DIR *d = opendir(tmpdir);
    struct dirent *e;
    while ((e = readdir(d))) cr_assert(strncmp(e->d_name, ".tmp-", 5) != 0, "left %s", e->d_name);
    closedir(d);
    /* loading from memory without a base dir refuses external data */
    size_t len;
    uint8_t *b = read_all(p, &len);
    eng_graph *m = NULL;
    cr_assert_eq(eng_onnx_load_buffer(b, len, NULL, "mem", &m), ENG_STATUS_INVALID_MODEL);
    cr_assert(strstr(eng_last_error(), "mem: ") == eng_last_error(), "%s", eng_last_error());
    cr_assert(strstr(eng_last_error(), "'W'"), "%s", eng_last_error());
    cr_assert_eq(eng_onnx_load_buffer(b, len, tmpdir, "mem", &m), ENG_STATUS_OK, "%s", eng_last_error());
    eng_graph_free(&m);
    free(b);
    eng_graph_free(&g);
    eng_graph_free(&h);
}

Test(onnx_save, subgraph_outer_scope, .init = mk_tmp, .fini = rm_tmp) {
    eng_graph *g = eng_graph_new();
    g->ir_version = 8;
    g->opset = 17;
    int cond = eng_graph_add_value(g, "cond"), x = eng_graph_add_value(g, "x"), xr = eng_graph_add_value(g, "xr");
    int r = eng_graph_add_value(g, "r");
    g->inputs = malloc(2 * sizeof(int));
    g->inputs[0] = cond;
    g->inputs[1] = x;
    g->ninputs = 2;
    g->outputs = malloc(sizeof(int));
    g->outputs[0] = r;
    g->noutputs = 1;
    eng_graph_add_node(g, "pre", "Relu", "", &x, 1, &xr, 1);
    /* the If lists the outer value its branches read as an implicit input, as the loader does (graph.h) */
    int nif = eng_graph_add_node(g, "if", "If", "", (int[]){cond, xr}, 2, &r, 1);
    g->nodes[nif].nimplicit = 1;
    eng_graph *body = eng_graph_new();
    int bx = eng_graph_add_value(body, "xr"), by = eng_graph_add_value(body, "by"); /* xr: outer scope */
    eng_graph_add_node(body, "neg", "Neg", "", &bx, 1, &by, 1);
    body->outputs = malloc(sizeof(int));
    body->outputs[0] = by;
    body->noutputs = 1;
    body->inputs = malloc(sizeof(int));
    eng_attr a = {.name = "then_branch", .type = ENG_ATTR_GRAPH, .g = body};
    cr_assert_eq(eng_node_add_attr(g, nif, &a), ENG_STATUS_OK);
    a.name = strdup("else_branch"); /* take: the graph now owns name and subgraph */
    cr_assert_eq(eng_node_take_attr(g, nif, &a), ENG_STATUS_OK);
    cr_assert_null(a.g);
    int order[2];
    cr_assert_eq(eng_graph_topo_order(g, order), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(eng_onnx_save_file(g, tpath("if.onnx"), 0), ENG_STATUS_OK, "%s", eng_last_error());
    eng_graph *h = load_ok(tpath("if.onnx"));
    char why[256];
    cr_assert(graph_eq(g, h, why, sizeof why, 1), "%s", why);
    /* swapping the nodes makes the If read 'xr' before it exists: topo order puts 'pre' first */
    eng_node tmp = g->nodes[0];
    g->nodes[0] = g->nodes[1];
    g->nodes[1] = tmp;
    g->values[xr].producer = 1;
    g->values[r].producer = 0;
    cr_assert_eq(eng_graph_topo_order(g, order), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert(order[0] == 1 && order[1] == 0, "subgraph's outer-scope use is a dependency");
    eng_graph_free(&g);
    eng_graph_free(&h);
}

Test(onnx_save, large_graph_loads_in_linear_time, .init = mk_tmp, .fini = rm_tmp, .timeout = 20) {
    enum { N = 50000 };
    eng_graph *g = eng_graph_new();
    g->opset = 17;
    char name[32];
    int prev = eng_graph_add_value(g, "in");
    g->inputs = malloc(sizeof(int));
    g->inputs[0] = prev;
    g->ninputs = 1;
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "v%d", i);
        int v = eng_graph_add_value(g, name);
        snprintf(name, sizeof name, "n%d", i);
        cr_assert_eq(eng_graph_add_node(g, name, "Relu", "", &prev, 1, &v, 1), i);
        prev = v;
    }
    g->outputs = malloc(sizeof(int));
    g->outputs[0] = prev;
    g->noutputs = 1;
    cr_assert_eq(eng_onnx_save_file(g, tpath("big.onnx"), 0), ENG_STATUS_OK, "%s", eng_last_error());
    eng_graph *h = load_ok(tpath("big.onnx")); /* a quadratic loader takes minutes here */
    cr_assert_eq(h->nnodes, N);
    cr_assert_eq(h->nvalues, N + 1);
    eng_graph_free(&g);
    eng_graph_free(&h);
}

/* ---- hostile inputs ---- */

static eng_status load_mutated(const char *src, void (*edit)(Onnx__ModelProto *, void *), void *arg) {
    size_t len;
    uint8_t *b = read_all(src, &len);
    Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, len, b);
    cr_assert_not_null(m);
    free(b);
    edit(m, arg);
    len = onnx__model_proto__get_packed_size(m);
    b = malloc(len);
    onnx__model_proto__pack(m, b);
    onnx__model_proto__free_unpacked(m, NULL);
    write_all(tpath("evil.onnx"), b, len);
    free(b);
    eng_graph *g = NULL;
    eng_status st = eng_onnx_load_file(tpath("evil.onnx"), &g);
    if (st == ENG_STATUS_OK) eng_graph_free(&g);
    cr_assert_null(g);
    return st;
}

static void set_location(Onnx__ModelProto *m, void *arg) {
    Onnx__TensorProto *t = m->graph->initializer[0];
    for (size_t i = 0; i < t->n_external_data; i++)
        if (!strcmp(t->external_data[i]->key, "location")) {
            free(t->external_data[i]->value);
            t->external_data[i]->value = strdup(arg);
        }
}

static void set_offset(Onnx__ModelProto *m, void *arg) {
    Onnx__TensorProto *t = m->graph->initializer[0];
    for (size_t i = 0; i < t->n_external_data; i++)
        if (!strcmp(t->external_data[i]->key, "offset")) {
            free(t->external_data[i]->value);
            t->external_data[i]->value = strdup(arg);
        }
}

Test(onnx_load, external_data_path_traversal, .init = mk_tmp, .fini = rm_tmp) {
    eng_graph *g = make_graph(100);
    cr_assert_eq(eng_onnx_save_file(g, tpath("m.onnx"), 64), ENG_STATUS_OK);
    eng_graph_free(&g);
    mkdir(tpath("sub"), 0755);
    char outside[300];
    snprintf(outside, sizeof outside, "%s-outside.bin", tmpdir);
    static const uint8_t zeros[4096];
    write_all(outside, zeros, sizeof zeros);
    symlink(outside, tpath("link.bin"));
    const char *bad[] = {"../m.onnx.data", "/etc/passwd", "sub/../../x", "..", "sub/..", "link.bin", "nope.bin", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        eng_status st = load_mutated(tpath("m.onnx"), set_location, (void *)bad[i]);
        cr_assert_neq(st, ENG_STATUS_OK, "location '%s' accepted", bad[i]);
        cr_assert(strstr(eng_last_error(), "evil.onnx") && strstr(eng_last_error(), "'W'"), "%s", eng_last_error());
    }
    unlink(outside);
    cr_assert_eq(load_mutated(tpath("m.onnx"), set_location, "./m.onnx.data"), ENG_STATUS_OK, "%s",
                 eng_last_error());
    const char *offs[] = {"999999", "18446744073709551615", "-1", "12x", "184467440737095516150"};
    for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++)
        cr_assert_eq(load_mutated(tpath("m.onnx"), set_offset, (void *)offs[i]), ENG_STATUS_INVALID_MODEL,
                     "offset %s", offs[i]);
}

static void dup_attr(Onnx__ModelProto *m, void *arg) {
    Onnx__NodeProto *n = m->graph->node[0];
    n->attribute = realloc(n->attribute, (n->n_attribute + 1) * sizeof *n->attribute);
    Onnx__AttributeProto *a = calloc(1, sizeof *a);
    onnx__attribute_proto__init(a);
    a->name = strdup(n->attribute[0]->name);
    a->has_type = 1;
    a->has_i = 1;
    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
    n->attribute[n->n_attribute++] = a;
}

static void dup_output(Onnx__ModelProto *m, void *arg) {
    Onnx__GraphProto *g = m->graph;
    g->node = realloc(g->node, (g->n_node + 1) * sizeof *g->node);
    Onnx__NodeProto *n = calloc(1, sizeof *n);
    onnx__node_proto__init(n);
    n->op_type = strdup("Relu");
    n->name = strdup("again");
    n->n_input = n->n_output = 1;
    n->input = malloc(sizeof(char *));
    n->output = malloc(sizeof(char *));
    n->input[0] = strdup(g->input[0]->name);
    n->output[0] = strdup(arg ? arg : g->output[0]->name);
    g->node[g->n_node++] = n;
}

Test(onnx_load, graph_rule_violations, .init = mk_tmp, .fini = rm_tmp) {
    if (!have_testdata()) cr_skip_test("libonnx-testdata not installed");
    cr_assert_eq(load_mutated(TD "/node/test_conv_with_strides_padding/model.onnx", dup_attr, NULL),
                 ENG_STATUS_INVALID_MODEL);
    cr_assert(strstr(eng_last_error(), "appears twice"), "%s", eng_last_error());
    cr_assert_eq(load_mutated(TD "/node/test_relu/model.onnx", dup_output, NULL), ENG_STATUS_INVALID_MODEL);
    cr_assert(strstr(eng_last_error(), "'again'") && strstr(eng_last_error(), "already produced"), "%s",
              eng_last_error());
    cr_assert_eq(load_mutated(TD "/node/test_relu/model.onnx", dup_output, "x"), ENG_STATUS_INVALID_MODEL);
    cr_assert(strstr(eng_last_error(), "graph input"), "%s", eng_last_error());
}

static void nest_subgraphs(Onnx__ModelProto *m, void *arg) {
    int depth = *(int *)arg;
    Onnx__GraphProto *g = m->graph;
    for (int i = 0; i < depth; i++) {
        Onnx__NodeProto *n = calloc(1, sizeof *n);
        onnx__node_proto__init(n);
        n->op_type = strdup("If");
        n->attribute = calloc(1, sizeof *n->attribute);
        n->n_attribute = 1;
        Onnx__AttributeProto *a = calloc(1, sizeof *a);
        onnx__attribute_proto__init(a);
        a->name = strdup("then_branch");
        a->has_type = 1;
        a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH;
        a->g = calloc(1, sizeof *a->g);
        onnx__graph_proto__init(a->g);
        n->attribute[0] = a;
        g->node = realloc(g->node, (g->n_node + 1) * sizeof *g->node);
        g->node[g->n_node++] = n;
        g = a->g;
    }
}

Test(onnx_load, nesting_limits, .init = mk_tmp, .fini = rm_tmp) {
    if (!have_testdata()) cr_skip_test("libonnx-testdata not installed");
    int d = 10;
    cr_assert_eq(load_mutated(TD "/node/test_relu/model.onnx", nest_subgraphs, &d), ENG_STATUS_OK, "%s",
                 eng_last_error());
    d = 40;
    cr_assert_eq(load_mutated(TD "/node/test_relu/model.onnx", nest_subgraphs, &d), ENG_STATUS_INVALID_MODEL);
    cr_assert(strstr(eng_last_error(), "nested"), "%s", eng_last_error());
    /* raw wire-format bomb: ModelProto.graph.input[0].type = TypeProto nested 100000 levels through
     * TypeProto.sequence_type / Sequence.elem_type (protobuf-c alone would overflow the stack) */
    size_t n = 100000, len = 0;
    size_t cap = n * 8 + 64, start = cap;
    uint8_t *b = malloc(cap);
    for (size_t i = 0; i < n + 3; i++) {
        size_t inner = cap - start;
        uint8_t hdr[16];
        size_t h = 0;
        if (i < n) hdr[h++] = (i % 2) ? 0x22 : 0x0a; /* TypeProto.sequence_type (4) / Sequence.elem_type (1) */
        else hdr[h++] = i == n ? 0x12 : i == n + 1 ? 0x5a : 0x3a; /* ValueInfo.type, Graph.input, Model.graph */
        for (size_t v = inner;; v >>= 7) {
            hdr[h++] = (uint8_t)((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
            if (v < 0x80) break;
        }
        cr_assert_geq(start, h);
        start -= h;
        memcpy(b + start, hdr, h);
    }
    len = cap - start;
    eng_graph *g = NULL;
    eng_status st = eng_onnx_load_buffer(b + start, len, NULL, "bomb", &g);
    cr_assert_eq(st, ENG_STATUS_INVALID_MODEL);
    cr_assert(strstr(eng_last_error(), "nested deeper"), "%s", eng_last_error());
    free(b);
}

Test(onnx_load, truncations_and_bit_flips, .timeout = 120) {
    if (!have_testdata()) cr_skip_test("libonnx-testdata not installed");
    const char *models[] = {TD "/node/test_if/model.onnx", TD "/node/test_loop11/model.onnx",
                            TD "/node/test_conv_with_strides_padding/model.onnx"};
    unsigned seed = 12345;
    for (size_t m = 0; m < sizeof models / sizeof models[0]; m++) {
        size_t len;
        uint8_t *b = read_all(models[m], &len);
        for (size_t k = 0; k < len; k++) {
            uint8_t *p = malloc(k + 1); /* exact-size copy so ASan sees overreads */
            memcpy(p, b, k);
            eng_graph *g = NULL;
            eng_status st = eng_onnx_load_buffer(p, k, NULL, "prefix", &g);
            if (st == ENG_STATUS_OK) eng_graph_free(&g);
            else cr_assert(eng_last_error()[0], "error without a message");
            free(p);
        }
        uint8_t *p = malloc(len);
        for (int it = 0; it < 3000; it++) {
            memcpy(p, b, len);
            int flips = 1 + (int)(rand_r(&seed) % 4);
            for (int f = 0; f < flips; f++) {
                size_t at = (size_t)rand_r(&seed) % len;
                if (rand_r(&seed) % 2) p[at] ^= (uint8_t)(1u << (rand_r(&seed) % 8));
                else p[at] = (uint8_t)rand_r(&seed);
            }
            eng_graph *g = NULL;
            if (eng_onnx_load_buffer(p, len, NULL, "flip", &g) == ENG_STATUS_OK) eng_graph_free(&g);
        }
        free(p);
        free(b);
    }
}

/* ---- npy ---- */

Test(npy, roundtrip_dtypes, .init = mk_tmp, .fini = rm_tmp) {
    const eng_dtype dts[] = {ENG_DTYPE_F32, ENG_DTYPE_F64, ENG_DTYPE_F16, ENG_DTYPE_I8, ENG_DTYPE_U8,
                             ENG_DTYPE_I16, ENG_DTYPE_U16, ENG_DTYPE_I32, ENG_DTYPE_U32, ENG_DTYPE_I64,
                             ENG_DTYPE_U64, ENG_DTYPE_BOOL};
    const struct { int nd; int64_t d[3]; } shapes[] = {{0, {0}}, {1, {0}}, {1, {5}}, {3, {2, 3, 4}}};
    for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            eng_tensor t = {.dtype = dts[i], .ndim = shapes[s].nd};
            memcpy(t.dims, shapes[s].d, sizeof shapes[s].d);
            size_t nb = eng_tensor_nbytes(&t);
            t.data = eng_alloc(nb);
            for (int64_t k = 0; k < eng_tensor_numel(&t); k++) eng_tensor_set_f64(&t, k, (double)(k % 7));
            cr_assert_eq(eng_npy_save(tpath("a.npy"), &t), ENG_STATUS_OK, "%s", eng_last_error());
            eng_tensor *r = NULL;
            cr_assert_eq(eng_npy_load(tpath("a.npy"), &r), ENG_STATUS_OK, "%s", eng_last_error());
            cr_assert(tensor_eq(&t, r), "dtype %s shape %zu", eng_dtype_name(dts[i]), s);
            eng_tensor_destroy(&r);
            eng_free(t.data);
        }
    /* byte-exact numpy header for float32 (2, 3) */
    float v[6] = {0};
    eng_tensor t = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {2, 3}, .data = v};
    cr_assert_eq(eng_npy_save(tpath("b.npy"), &t), ENG_STATUS_OK);
    size_t len;
    uint8_t *b = read_all(tpath("b.npy"), &len);
    const char *want = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    cr_assert_eq(len, 128 + 24); /* numpy pads preamble + header to a multiple of 64 */
    cr_assert(memcmp(b, "\x93NUMPY\x01\x00\x76\x00", 10) == 0);
    cr_assert(memcmp(b + 10, want, strlen(want)) == 0);
    for (size_t i = 10 + strlen(want); i < 127; i++) cr_assert_eq(b[i], ' ');
    cr_assert_eq(b[127], '\n');
    free(b);
}

static uint8_t *npy_v1(const char *header, size_t data, size_t *len) {
    size_t h = strlen(header);
    uint8_t *b = calloc(1, 10 + h + data + 1);
    memcpy(b, "\x93NUMPY\x01\x00", 8);
    b[8] = (uint8_t)h;
    b[9] = (uint8_t)(h >> 8);
    memcpy(b + 10, header, h);
    *len = 10 + h + data;
    return b;
}

Test(npy, versions_and_malformed_headers) {
    size_t len;
    eng_tensor *t = NULL;
    /* valid variants */
    const struct { const char *h; size_t data; eng_dtype dt; int nd; } good[] = {
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", 24, ENG_DTYPE_F32, 2},
        {"{'descr': '|b1', 'fortran_order': False, 'shape': (), }    \n", 1, ENG_DTYPE_BOOL, 0},
        {"{'shape': (4,), 'fortran_order': False, 'descr': '=i8'}\n", 32, ENG_DTYPE_I64, 1},
        {"{\"descr\": \"|u1\", \"fortran_order\": False, \"shape\": (0, 5)}\n", 0, ENG_DTYPE_U8, 2},
        {"{'descr': '<i1', 'fortran_order': False, 'shape': (3L,), }\n", 3, ENG_DTYPE_I8, 1},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        uint8_t *b = npy_v1(good[i].h, good[i].data, &len);
        cr_assert_eq(eng_npy_load_buffer(b, len, "good", &t), ENG_STATUS_OK, "%s: %s", good[i].h, eng_last_error());
        cr_assert(t->dtype == good[i].dt && t->ndim == good[i].nd, "%s", good[i].h);
        eng_tensor_destroy(&t);
        free(b);
    }
    /* version 2 and 3 (4-byte header length) */
    for (int ver = 2; ver <= 3; ver++) {
        const char *h = "{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }\n";
        size_t hl = strlen(h);
        uint8_t b[128] = "\x93NUMPY";
        b[6] = (uint8_t)ver;
        b[8] = (uint8_t)hl;
        memcpy(b + 12, h, hl);
        cr_assert_eq(eng_npy_load_buffer(b, 12 + hl + 4, "v2", &t), ENG_STATUS_OK, "%s", eng_last_error());
        cr_assert_eq(t->dtype, ENG_DTYPE_U16);
        eng_tensor_destroy(&t);
    }
    const struct { const char *h; size_t data; } bad[] = {
        {"{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }\n", 8},
        {"{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }\n", 8},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n", 7},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n", 9},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }\n", 8},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,3,}\n", 24},
        {"{'descr': '<f4', 'fortran_order': False}\n", 4},
        {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}\n", 4},
        {"{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }\n", 8},
        {"{'descr': '|f4', 'fortran_order': False, 'shape': (1,), }\n", 4},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}\n", 4},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999, 99999999999), }\n", 0},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }\n", 4},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4},
        {"", 0},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint8_t *b = npy_v1(bad[i].h, bad[i].data, &len);
        cr_assert_neq(eng_npy_load_buffer(b, len, "bad.npy", &t), ENG_STATUS_OK, "accepted: %s", bad[i].h);
        cr_assert(strstr(eng_last_error(), "bad.npy"), "%s", eng_last_error());
        cr_assert_null(t);
        /* every prefix fails cleanly too */
        for (size_t k = 0; k < len; k++) {
            uint8_t *p = malloc(k + 1);
            memcpy(p, b, k);
            if (eng_npy_load_buffer(p, k, "prefix", &t) == ENG_STATUS_OK) eng_tensor_destroy(&t);
            free(p);
        }
        free(b);
    }
    uint8_t hdr[12] = "\x93NUMPY\x02\x00\xff\xff\xff\x7f";
    cr_assert_neq(eng_npy_load_buffer(hdr, sizeof hdr, "big", &t), ENG_STATUS_OK);
    cr_assert_neq(eng_npy_load_buffer("NUMPY", 5, "magic", &t), ENG_STATUS_OK);
    cr_assert_eq(eng_npy_load("/nonexistent.npy", &t), ENG_STATUS_NOT_FOUND);
}

/* ---- ONNX backend test cases (onnx-testdata.c, shared by `tensord conformance` and tests/test_ops.c) ---- */

Test(onnx_testdata, name_lists_and_set_dirs, .init = mk_tmp, .fini = rm_tmp) {
    const char *list = "test_b\n  test_a # why it is listed\n\n# a comment line\n\ttest_c \r\n";
    write_all(tpath("expect.txt"), list, strlen(list));
    int n = 0;
    char **v = eng_testdata_names_read(tpath("expect.txt"), &n);
    cr_assert_eq(n, 3);
    cr_assert_str_eq(v[0], "test_b");
    cr_assert_str_eq(v[1], "test_a");
    cr_assert_str_eq(v[2], "test_c");
    eng_testdata_names_free(v, n);
    cr_assert_null(eng_testdata_names_read(tpath("missing.txt"), &n));
    cr_assert_eq(n, 0);
    cr_assert_eq(mkdir(tpath("test_data_set_1"), 0700), 0);
    cr_assert_eq(mkdir(tpath("test_data_set_0"), 0700), 0);
    cr_assert_eq(mkdir(tpath("other"), 0700), 0);
    write_all(tpath("test_data_set_2"), "x", 1); /* a file, not a set */
    v = eng_testdata_dirs(tmpdir, "test_data_set_", &n);
    cr_assert_eq(n, 2);
    cr_assert_str_eq(v[0], "test_data_set_0");
    cr_assert_str_eq(v[1], "test_data_set_1");
    eng_testdata_names_free(v, n);
    v = eng_testdata_dirs(tmpdir, NULL, &n);
    cr_assert_eq(n, 3);
    cr_assert_str_eq(v[0], "other");
    eng_testdata_names_free(v, n);
    cr_assert_null(eng_testdata_dirs(tpath("missing"), NULL, &n));
    cr_assert_eq(n, 0);
}

Test(onnx_testdata, sets_feed_the_graph_inputs, .init = mk_tmp, .fini = rm_tmp) {
    if (!have_testdata()) cr_skip_test("libonnx-testdata is not installed");
    eng_graph *g = load_ok(TD "/node/test_add/model.onnx");
    eng_testdata_set d;
    cr_assert_eq(eng_testdata_set_load(TD "/node/test_add", "test_data_set_0", g, &d), ENG_STATUS_OK, "%s",
                 eng_last_error());
    cr_assert_eq(d.nin, 2);
    cr_assert_eq(d.nfeed, 2);
    for (int k = 0; k < 2; k++) {
        cr_assert_str_eq(d.names[k], g->values[g->inputs[k]].name);
        cr_assert_eq(d.feed[k].data, d.owned[k]->data);
        cr_assert_eq(d.feed[k].dtype, ENG_DTYPE_F32);
    }
    eng_testdata_set_free(&d);
    cr_assert_eq(d.nin, 0);
    eng_tensor *want = NULL;
    cr_assert_eq(eng_testdata_output_load(TD "/node/test_add", "test_data_set_0", 0, ENG_DTYPE_F32, &want), ENG_STATUS_OK);
    cr_assert_eq(want->dtype, ENG_DTYPE_F32);
    eng_tensor_destroy(&want);
    /* one input of the two: UNSUPPORTED (the conformance runner's skip), naming the set */
    size_t len;
    uint8_t *b = read_all(TD "/node/test_add/test_data_set_0/input_0.pb", &len);
    cr_assert_eq(mkdir(tpath("test_data_set_0"), 0700), 0);
    write_all(tpath("test_data_set_0/input_0.pb"), b, len);
    free(b);
    cr_assert_eq(eng_testdata_set_load(tmpdir, "test_data_set_0", g, &d), ENG_STATUS_UNSUPPORTED);
    cr_assert(strstr(eng_last_error(), "test_data_set_0 has 1 inputs, the model takes 2"), "%s", eng_last_error());
    eng_testdata_set_free(&d);
    /* a corrupt second input: an error naming the file, with the first input still held (and freed) */
    write_all(tpath("test_data_set_0/input_1.pb"), "\xff\xff\xff", 3);
    cr_assert_neq(eng_testdata_set_load(tmpdir, "test_data_set_0", g, &d), ENG_STATUS_OK);
    cr_assert(strstr(eng_last_error(), "test_data_set_0/input_1.pb"), "%s", eng_last_error());
    cr_assert_eq(d.nin, 1);
    eng_testdata_set_free(&d);
    cr_assert_neq(eng_testdata_output_load(tmpdir, "test_data_set_0", 0, ENG_DTYPE_F32, &want), ENG_STATUS_OK);
    cr_assert(strstr(eng_last_error(), "test_data_set_0/output_0.pb"), "%s", eng_last_error());
    eng_graph_free(&g);
}

Test(onnx_testdata, bfloat16_stored_as_uint16) {
    if (!have_testdata()) cr_skip_test("libonnx-testdata is not installed");
    eng_graph *g = load_ok(TD "/node/test_cast_BFLOAT16_to_FLOAT/model.onnx");
    eng_testdata_set d;
    cr_assert_eq(eng_testdata_set_load(TD "/node/test_cast_BFLOAT16_to_FLOAT", "test_data_set_0", g, &d), ENG_STATUS_OK);
    cr_assert_eq(d.owned[0]->dtype, ENG_DTYPE_U16); /* the file's dtype */
    cr_assert_eq(d.feed[0].dtype, ENG_DTYPE_BF16);  /* the graph's */
    eng_testdata_set_free(&d);
    eng_graph_free(&g);
    eng_tensor *want = NULL;
    const char *dir = TD "/node/test_cast_FLOAT_to_BFLOAT16";
    cr_assert_eq(eng_testdata_output_load(dir, "test_data_set_0", 0, ENG_DTYPE_BF16, &want), ENG_STATUS_OK);
    cr_assert_eq(want->dtype, ENG_DTYPE_BF16);
    eng_tensor_destroy(&want);
    cr_assert_eq(eng_testdata_output_load(dir, "test_data_set_0", 0, ENG_DTYPE_F32, &want), ENG_STATUS_OK);
    cr_assert_eq(want->dtype, ENG_DTYPE_U16);
    eng_tensor_destroy(&want);
}
