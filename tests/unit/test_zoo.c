/* test_zoo.c - the model zoo (models/): every architecture builds with its defaults and with non-default
 * options, runs through a session on a random batch of 2 with finite outputs of the documented shape (softmax
 * rows summing to 1), the seed fixes the initializer bytes, the seed CNN has the exact layer plan, and option
 * errors name the option. The zoo is compiled into the binary, not libtensord, so its sources are included. */
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

static uint64_t test_rng = 12345;
static uint64_t next_u64(void) { return mdl_splitmix64(&test_rng); }

/* Random feeds for every graph input: floats uniform in [-1, 1), int64 ids in [0, table rows). */
static int64_t id_limit(const eng_graph *g, const char *input) {
    for (int i = 0; i < g->nnodes; i++) {
        const eng_node *n = &g->nodes[i];
        if (strcmp(n->op_type, "Gather") == 0 && strcmp(g->values[n->inputs[1]].name, input) == 0)
            return g->values[n->inputs[0]].init->dims[0];
    }
    return 1;
}

typedef struct feeds {
    int n;
    const char *names[4];
    eng_tensor t[4];
} feeds;

static void make_feeds(const eng_graph *g, int64_t batch, feeds *f) {
    memset(f, 0, sizeof *f);
    for (int i = 0; i < g->ninputs; i++) {
        const eng_value *v = &g->values[g->inputs[i]];
        eng_tensor *t = &f->t[f->n];
        f->names[f->n++] = v->name;
        t->dtype = v->dtype;
        t->ndim = v->ndim;
        t->dims[0] = batch;
        for (int d = 1; d < v->ndim; d++) t->dims[d] = v->dims[d];
        int64_t n = eng_tensor_numel(t);
        t->data = malloc((size_t)n * 8);
        int64_t lim = v->dtype == ENG_DTYPE_I64 ? id_limit(g, v->name) : 0;
        for (int64_t k = 0; k < n; k++) {
            if (v->dtype == ENG_DTYPE_I64) ((int64_t *)t->data)[k] = (int64_t)(next_u64() % (uint64_t)lim);
            else ((float *)t->data)[k] = (float)((double)(next_u64() >> 11) * 0x1.0p-53 * 2.0 - 1.0);
        }
    }
}

static void free_feeds(feeds *f) {
    for (int i = 0; i < f->n; i++) free(f->t[i].data);
}

static eng_graph *build(const char *arch, const mdl_opt *opts, int n, uint64_t seed) {
    eng_graph *g = NULL;
    eng_status st = mdl_build(arch, opts, n, seed, &g);
    cr_assert_eq(st, ENG_STATUS_OK, "%s: %s", arch, eng_last_error());
    cr_assert_not_null(g);
    return g;
}

/* Builds, runs on a batch of 2 and checks the output; returns the parameter count. */
static int64_t check_arch(const char *arch, const mdl_opt *opts, int nopts, const char *out_name, int64_t out_cols,
                          int is_softmax) {
    eng_graph *g = build(arch, opts, nopts, 7);
    int64_t params = mdl_param_count(g);
    cr_assert_eq(g->opset, 17);
    cr_assert_eq(g->noutputs, 1, "%s: %d outputs", arch, g->noutputs);
    cr_assert_str_eq(g->values[g->outputs[0]].name, out_name, "%s", arch);
    feeds f;
    make_feeds(g, 2, &f);
    eng_session *s = NULL;
    cr_assert_eq(eng_session_new_graph(g, NULL, &s), ENG_STATUS_OK, "%s: %s", arch, eng_last_error());
    eng_tensor out;
    cr_assert_eq(eng_session_run(s, f.n, f.names, f.t, &out), ENG_STATUS_OK, "%s: %s", arch, eng_last_error());
    cr_assert_eq(out.dtype, ENG_DTYPE_F32);
    cr_assert_eq(out.ndim, 2, "%s: rank %d", arch, out.ndim);
    cr_assert_eq(out.dims[0], 2);
    cr_assert_eq(out.dims[1], out_cols, "%s: %lld columns", arch, (long long)out.dims[1]);
    const float *y = out.data;
    for (int r = 0; r < 2; r++) {
        double sum = 0;
        for (int64_t c = 0; c < out_cols; c++) {
            float v = y[r * out_cols + c];
            cr_assert(isfinite(v), "%s: output[%d][%lld] = %g", arch, r, (long long)c, v);
            if (is_softmax) cr_assert(v >= 0.0f && v <= 1.0f, "%s: probability %g", arch, v);
            sum += v;
        }
        if (is_softmax && out_cols > 1) cr_assert(fabs(sum - 1.0) < 1e-5, "%s: row %d sums to %.8f", arch, r, sum);
    }
    /* the two rows differ: the model is not constant */
    int differ = 0;
    for (int64_t c = 0; c < out_cols; c++) differ |= y[c] != y[out_cols + c];
    cr_assert(differ, "%s: both rows are identical", arch);
    eng_session_free(&s);
    free_feeds(&f);
    return params;
}

Test(zoo, archs_listed) {
    const char *const *a = mdl_archs();
    const char *want[] = {"mlp", "cnn", "resnet-small", "transformer-encoder", "vit-tiny", "two-tower"};
    for (int i = 0; i < 6; i++) {
        cr_assert_str_eq(a[i], want[i]);
        cr_assert_not_null(mdl_arch_options(a[i]));
        cr_assert_not_null(mdl_arch_summary(a[i]));
    }
    cr_assert_null(a[6]);
    cr_assert_null(mdl_arch_options("nope"));
}

Test(zoo, mlp) {
    cr_assert_eq(check_arch("mlp", NULL, 0, "probabilities", 10, 1), 784 * 512 + 512 + 512 * 512 + 512 + 5130);
    mdl_opt o[] = {{"input", "1,8,8"}, {"hidden", "[16]"}, {"classes", "3"}, {"activation", "gelu"}, {"softmax", "0"}};
    cr_assert_eq(check_arch("mlp", o, 5, "logits", 3, 0), 64 * 16 + 16 + 16 * 3 + 3);
    mdl_opt lin[] = {{"hidden", ""}, {"activation", "tanh"}};
    cr_assert_eq(check_arch("mlp", lin, 2, "probabilities", 10, 1), 7850);
}

Test(zoo, seed_cnn_exact) {
    eng_graph *g = build("cnn", NULL, 0, 0);
    const char *ops[] = {"Conv", "Relu", "MaxPool", "Flatten", "Gemm", "Softmax"};
    cr_assert_eq(g->nnodes, 6, "%d nodes", g->nnodes);
    for (int i = 0; i < 6; i++) cr_assert_str_eq(g->nodes[i].op_type, ops[i]);
    cr_assert_eq(eng_node_attr_int(&g->nodes[0], "group", 0), 1);
    const int64_t *ks;
    cr_assert_eq(eng_node_attr_ints(&g->nodes[0], "kernel_shape", &ks), 2);
    cr_assert_eq(ks[0], 3);
    const int64_t *pads;
    cr_assert_eq(eng_node_attr_ints(&g->nodes[0], "pads", &pads), 4);
    for (int i = 0; i < 4; i++) cr_assert_eq(pads[i], 0);
    cr_assert_eq(eng_node_attr_ints(&g->nodes[2], "strides", &ks), 2);
    cr_assert_eq(ks[0], 2);
    int k = eng_graph_find_value(g, "conv1/kernel");
    cr_assert_geq(k, 0);
    cr_assert_eq(g->values[k].init->dims[0], 32);
    cr_assert_eq(g->values[k].init->dims[1], 1);
    /* Glorot: limit sqrt(6 / (9 + 288)) */
    double lim = sqrt(6.0 / (9 + 32 * 9)), mx = 0;
    const float *w = g->values[k].init->data;
    for (int i = 0; i < 288; i++) mx = fmax(mx, fabs(w[i]));
    cr_assert(mx <= lim && mx > 0.8 * lim, "max |w| %g, limit %g", mx, lim);
    int hb = eng_graph_find_value(g, "head/bias");
    cr_assert_geq(hb, 0);
    for (int i = 0; i < 10; i++) cr_assert_eq(((float *)g->values[hb].init->data)[i], 0.0f);
    cr_assert_geq(eng_graph_find_value(g, "head/kernel"), 0);
    cr_assert_geq(eng_graph_find_value(g, "conv1/bias"), 0);
    cr_assert_eq(mdl_param_count(g), 54410);
    eng_graph_free(&g);
    cr_assert_eq(check_arch("cnn", NULL, 0, "probabilities", 10, 1), 54410);
    mdl_opt o[] = {{"input", "3,12,10"}, {"filters", "4"}, {"kernel", "5"}, {"pool", "3"}, {"classes", "2"}};
    cr_assert_eq(check_arch("cnn", o, 5, "probabilities", 2, 1), 4 * 3 * 25 + 4 + 4 * 2 * 2 * 2 + 2);
}

Test(zoo, resnet_small) {
    int64_t p = check_arch("resnet-small", NULL, 0, "probabilities", 10, 1);
    cr_assert_eq(p, 176378, "%lld params", (long long)p); /* 175,258 trainable + 1,120 BatchNorm statistics */
    mdl_opt o[] = {{"input", "1,9,9"}, {"width", "4"}, {"blocks", "1"}, {"classes", "5"}};
    check_arch("resnet-small", o, 4, "probabilities", 5, 1);
}

Test(zoo, transformer_encoder) {
    mdl_opt small[] = {{"seq", "16"}, {"layers", "1"}};
    check_arch("transformer-encoder", small, 2, "probabilities", 2, 1);
    int64_t p = check_arch("transformer-encoder", NULL, 0, "probabilities", 2, 1);
    int64_t d = 128, f = 512;
    int64_t layer = 4 * (d * d + d) + 2 * 2 * d + (d * f + f) + (f * d + d);
    cr_assert_eq(p, 1000 * d + 128 * d + 2 * d + 2 * layer + d * 2 + 2, "%lld params", (long long)p);
}

Test(zoo, vit_tiny) {
    int64_t p = check_arch("vit-tiny", NULL, 0, "probabilities", 10, 1);
    int64_t d = 192, f = 768;
    int64_t layer = 4 * (d * d + d) + 2 * 2 * d + (d * f + f) + (f * d + d);
    cr_assert_eq(p, (3 * 16 * d + d) + 64 * d + 4 * layer + 2 * d + d * 10 + 10, "%lld params", (long long)p);
    mdl_opt o[] = {{"input", "1,8,12"}, {"patch", "4"}, {"d", "8"}, {"heads", "2"}, {"layers", "1"}, {"ffn", "16"},
                   {"softmax", "0"}};
    check_arch("vit-tiny", o, 7, "logits", 10, 0);
}

Test(zoo, two_tower) {
    cr_assert_eq(check_arch("two-tower", NULL, 0, "probability", 1, 1), 2 * 1000 * 32);
    mdl_opt o[] = {{"users", "5"}, {"items", "7"}, {"dim", "3"}};
    cr_assert_eq(check_arch("two-tower", o, 3, "probability", 1, 1), 36);
}

static int same_inits(const eng_graph *a, const eng_graph *b) {
    if (a->nvalues != b->nvalues) return 0;
    for (int i = 0; i < a->nvalues; i++) {
        const eng_tensor *x = a->values[i].init, *y = b->values[i].init;
        if (!x != !y) return 0;
        if (!x) continue;
        if (strcmp(a->values[i].name, b->values[i].name) != 0 || !eng_shape_equal(x, y)) return 0;
        if (memcmp(x->data, y->data, eng_tensor_nbytes(x)) != 0) return 0;
    }
    return 1;
}

Test(zoo, seed_determines_bytes) {
    for (const char *const *arch = mdl_archs(); *arch; arch++) {
        eng_graph *a = build(*arch, NULL, 0, 42), *b = build(*arch, NULL, 0, 42), *c = build(*arch, NULL, 0, 43);
        cr_assert(same_inits(a, b), "%s: same seed, different initializers", *arch);
        cr_assert(!same_inits(a, c), "%s: different seeds, same initializers", *arch);
        eng_graph_free(&a);
        eng_graph_free(&b);
        eng_graph_free(&c);
    }
}

/* A parameter's values depend on its name and the seed, not on the layers before it. */
Test(zoo, streams_are_per_parameter) {
    mdl_opt one[] = {{"hidden", "32"}}, two[] = {{"hidden", "32,16"}};
    eng_graph *a = build("mlp", one, 1, 5), *b = build("mlp", two, 1, 5);
    int va = eng_graph_find_value(a, "dense_1/kernel"), vb = eng_graph_find_value(b, "dense_1/kernel");
    cr_assert(va >= 0 && vb >= 0);
    cr_assert_eq(memcmp(a->values[va].init->data, b->values[vb].init->data, 784 * 32 * 4), 0);
    eng_graph_free(&a);
    eng_graph_free(&b);
}

static void expect_error(const char *arch, const mdl_opt *opts, int n, const char *s1, const char *s2) {
    eng_graph *g = (eng_graph *)1;
    eng_status st = mdl_build(arch, opts, n, 0, &g);
    cr_assert_eq(st, ENG_STATUS_INVALID_ARGUMENT, "%s: status %d", arch, st);
    cr_assert_null(g);
    const char *m = eng_last_error();
    cr_assert(strstr(m, s1), "'%s' not in: %s", s1, m);
    if (s2) cr_assert(strstr(m, s2), "'%s' not in: %s", s2, m);
}

Test(zoo, option_errors_name_the_option) {
    expect_error("resnet", NULL, 0, "unknown arch 'resnet'", "resnet-small");
    expect_error("mlp", (mdl_opt[]){{"hiden", "3"}}, 1, "unknown option 'hiden'", "hidden");
    expect_error("mlp", (mdl_opt[]){{"hidden", "3,x"}}, 1, "option 'hidden'", "3,x");
    expect_error("mlp", (mdl_opt[]){{"hidden", "3,"}}, 1, "option 'hidden'", "trailing comma");
    expect_error("mlp", (mdl_opt[]){{"classes", "0"}}, 1, "option 'classes'", "out of range");
    expect_error("mlp", (mdl_opt[]){{"classes", "2"}, {"classes", "3"}}, 2, "option 'classes'", "twice");
    expect_error("mlp", (mdl_opt[]){{"activation", "swish"}}, 1, "option 'activation'", "swish");
    expect_error("mlp", (mdl_opt[]){{"softmax", "2"}}, 1, "option 'softmax'", NULL);
    expect_error("cnn", (mdl_opt[]){{"input", "28,28"}}, 1, "option 'input'", "expected 3");
    expect_error("cnn", (mdl_opt[]){{"kernel", "29"}}, 1, "option 'kernel'", NULL);
    expect_error("cnn", (mdl_opt[]){{"pool", "27"}}, 1, "option 'pool'", NULL);
    expect_error("cnn", (mdl_opt[]){{"filters", ""}}, 1, "option 'filters'", NULL);
    expect_error("transformer-encoder", (mdl_opt[]){{"heads", "3"}}, 1, "option 'heads'", "d=128");
    expect_error("vit-tiny", (mdl_opt[]){{"patch", "5"}}, 1, "option 'patch'", NULL);
    expect_error("two-tower", (mdl_opt[]){{"users", "99999999999"}}, 1, "option 'users'", NULL);
    expect_error("two-tower", (mdl_opt[]){{"users", "16777216"}, {"dim", "65536"}}, 2, "parameters", NULL);
}
