/* build.c - the graph builder shared by the zoo's architectures (contract in zoo-impl.h): parameters with
 * Keras-style initialisation from a seeded splitmix64 stream per parameter, nodes named like exporters name
 * them, and the layers (dense, conv, norms, attention, feed-forward, classifier head) the architectures share.
 *
 * Determinism: a parameter's values depend only on (seed, its name, its shape, its init), computed with
 * integer arithmetic plus sqrt/log/cos in double precision, so the same (arch, options, seed) gives the same
 * bytes on a given platform.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zoo-impl.h"

/* ---- PRNG: splitmix64, one stream per parameter ---- */

static uint64_t mdl_splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t mdl_stream_seed(uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
    uint64_t s = seed ^ h;
    return mdl_splitmix64(&s);
}

/* Uniform in [0, 1) with 53 bits. */
static double mdl_unit(uint64_t *s) { return (double)(mdl_splitmix64(s) >> 11) * 0x1.0p-53; }

static void mdl_fill(float *w, int64_t n, mdl_init init, double limit, uint64_t *s) {
    switch (init) {
    case MDL_INIT_ZEROS:
        memset(w, 0, (size_t)n * sizeof *w);
        break;
    case MDL_INIT_ONES:
        for (int64_t i = 0; i < n; i++) w[i] = 1.0f;
        break;
    case MDL_INIT_GLOROT:
        for (int64_t i = 0; i < n; i++) w[i] = (float)((2.0 * mdl_unit(s) - 1.0) * limit);
        break;
    case MDL_INIT_NORMAL:
        for (int64_t i = 0; i < n; i += 2) { /* Box-Muller: two normals per pair of uniforms */
            double u1 = 1.0 - mdl_unit(s), u2 = mdl_unit(s);
            double r = sqrt(-2.0 * log(u1)) * 0.02;
            w[i] = (float)(r * cos(2.0 * M_PI * u2));
            if (i + 1 < n) w[i + 1] = (float)(r * sin(2.0 * M_PI * u2));
        }
        break;
    }
}

/* ---- graph plumbing ---- */

eng_status mdl_b_fail(mdl_b *b, eng_status st) {
    if (b->st == ENG_STATUS_OK) b->st = st;
    return b->st;
}

static int mdl_oom(mdl_b *b, const char *what) {
    mdl_b_fail(b, eng_err(ENG_STATUS_OUT_OF_MEMORY, "model zoo: out of memory adding '%s'", what));
    return -1;
}

void mdl_b_init(mdl_b *b, const char *arch, uint64_t seed) {
    memset(b, 0, sizeof *b);
    b->seed = seed;
    b->g = eng_graph_new();
    if (!b->g) {
        mdl_oom(b, arch);
        return;
    }
    b->g->opset = 17;
    b->g->ir_version = 8;
    b->g->producer_name = strdup("tensord-zoo");
    b->g->producer_version = strdup("1");
    free(b->g->name);
    b->g->name = strdup(arch);
    if (!b->g->producer_name || !b->g->producer_version || !b->g->name) mdl_oom(b, arch);
}

eng_status mdl_b_finish(mdl_b *b, eng_graph **out) {
    *out = NULL;
    if (b->st != ENG_STATUS_OK) {
        eng_graph_free(&b->g);
        return b->st;
    }
    *out = b->g;
    b->g = NULL;
    return ENG_STATUS_OK;
}

static int mdl_add_list(int **arr, int *n, int v) {
    int *na = realloc(*arr, (size_t)(*n + 1) * sizeof *na);
    if (!na) return 0;
    na[(*n)++] = v;
    *arr = na;
    return 1;
}

static int mdl_new_value(mdl_b *b, const char *name) {
    if (b->st != ENG_STATUS_OK) return -1;
    if (eng_graph_find_value(b->g, name) >= 0) {
        mdl_b_fail(b, eng_err(ENG_STATUS_INTERNAL, "model zoo: value name '%s' used twice", name));
        return -1;
    }
    int v = eng_graph_add_value(b->g, name);
    return v < 0 ? mdl_oom(b, name) : v;
}

static int mdl_set_dim_n(mdl_b *b, eng_value *val) {
    val->dims[0] = -1;
    free(val->dim_param[0]);
    val->dim_param[0] = strdup("N");
    return val->dim_param[0] ? 1 : mdl_oom(b, val->name) + 1;
}

int mdl_b_input(mdl_b *b, const char *name, eng_dtype dt, int ndim, const int64_t *dims) {
    int v = mdl_new_value(b, name);
    if (v < 0) return -1;
    eng_value *val = &b->g->values[v];
    val->dtype = dt;
    val->ndim = ndim;
    for (int i = 1; i < ndim; i++) val->dims[i] = dims[i];
    mdl_set_dim_n(b, val);
    if (!mdl_add_list(&b->g->inputs, &b->g->ninputs, v)) return mdl_oom(b, name);
    return v;
}

void mdl_b_output(mdl_b *b, int v, const char *name, int ndim, const int64_t *dims) {
    if (b->st != ENG_STATUS_OK || v < 0) return;
    eng_value *val = &b->g->values[v];
    char *nm = strdup(name);
    if (!nm) {
        mdl_oom(b, name);
        return;
    }
    free(val->name);
    val->name = nm;
    val->dtype = ENG_DTYPE_F32;
    val->ndim = ndim;
    for (int i = 1; i < ndim; i++) val->dims[i] = dims[i];
    mdl_set_dim_n(b, val);
    if (!mdl_add_list(&b->g->outputs, &b->g->noutputs, v)) mdl_oom(b, name);
}

int mdl_b_param(mdl_b *b, const char *name, int ndim, const int64_t *dims, mdl_init init, int64_t fan_in,
                int64_t fan_out) {
    if (b->st != ENG_STATUS_OK) return -1;
    int64_t n = eng_shape_numel(dims, ndim);
    if (n < 0 || n > MDL_MAX_PARAMS || b->nparams + n > MDL_MAX_PARAMS) {
        mdl_b_fail(b, eng_err(ENG_STATUS_INVALID_ARGUMENT,
                              "model zoo: '%s' would take the model past %lld parameters (options too large)", name,
                              (long long)MDL_MAX_PARAMS));
        return -1;
    }
    int v = mdl_new_value(b, name);
    if (v < 0) return -1;
    eng_tensor *t = calloc(1, sizeof *t);
    if (!t) return mdl_oom(b, name);
    t->dtype = ENG_DTYPE_F32;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->dims[i] = dims[i];
    t->data = eng_alloc((size_t)(n ? n : 1) * sizeof(float));
    if (!t->data) {
        free(t);
        return mdl_oom(b, name);
    }
    uint64_t s = mdl_stream_seed(b->seed, name);
    double limit = fan_in + fan_out > 0 ? sqrt(6.0 / (double)(fan_in + fan_out)) : 0.0;
    mdl_fill(t->data, n, init, limit, &s);
    eng_value *val = &b->g->values[v];
    val->dtype = ENG_DTYPE_F32;
    val->ndim = ndim;
    for (int i = 0; i < ndim; i++) val->dims[i] = dims[i];
    eng_value_set_init(b->g, v, t);
    b->nparams += n;
    return v;
}

int mdl_b_op(mdl_b *b, const char *name, const char *op, const int *in, int nin) {
    if (b->st != ENG_STATUS_OK) return -1;
    for (int i = 0; i < nin; i++) {
        if (in[i] < 0) {
            mdl_b_fail(b, eng_err(ENG_STATUS_INTERNAL, "model zoo: node '%s' lacks input %d", name, i));
            return -1;
        }
    }
    int v = mdl_new_value(b, name);
    if (v < 0) return -1;
    if (eng_graph_add_node(b->g, name, op, "", in, nin, &v, 1) < 0) return mdl_oom(b, name);
    return v;
}

int mdl_b_op1(mdl_b *b, const char *name, const char *op, int x) { return mdl_b_op(b, name, op, &x, 1); }

int mdl_b_op2(mdl_b *b, const char *name, const char *op, int x, int y) {
    int in[2] = {x, y};
    return mdl_b_op(b, name, op, in, 2);
}

static void mdl_attr_take(mdl_b *b, eng_attr *a) {
    if (b->st != ENG_STATUS_OK || b->g->nnodes == 0 || !a->name) {
        if (b->st == ENG_STATUS_OK) mdl_oom(b, "attribute");
        eng_attr_clear(a);
        return;
    }
    eng_status st = eng_node_take_attr(b->g, b->g->nnodes - 1, a);
    if (st != ENG_STATUS_OK) {
        eng_attr_clear(a);
        mdl_b_fail(b, st);
    }
}

void mdl_b_attr_int(mdl_b *b, const char *name, int64_t v) {
    eng_attr a = {.name = strdup(name), .type = ENG_ATTR_INT, .i = v};
    mdl_attr_take(b, &a);
}

void mdl_b_attr_float(mdl_b *b, const char *name, float v) {
    eng_attr a = {.name = strdup(name), .type = ENG_ATTR_FLOAT, .f = v};
    mdl_attr_take(b, &a);
}

void mdl_b_attr_ints(mdl_b *b, const char *name, const int64_t *v, int n) {
    eng_attr a = {.name = strdup(name), .type = ENG_ATTR_INTS, .n = n, .ints = malloc((size_t)(n ? n : 1) * 8)};
    if (a.ints) memcpy(a.ints, v, (size_t)n * 8);
    else {
        free(a.name);
        a.name = NULL;
    }
    mdl_attr_take(b, &a);
}

static int mdl_const(mdl_b *b, const char *name, eng_dtype dt, int ndim, int64_t n, const void *data) {
    if (b->st != ENG_STATUS_OK) return -1;
    int v = eng_graph_find_value(b->g, name);
    if (v >= 0) return v;
    v = mdl_b_op(b, name, "Constant", NULL, 0);
    if (v < 0) return -1;
    size_t nb = (size_t)n * eng_dtype_size(dt);
    eng_attr a = {.name = strdup("value"), .type = ENG_ATTR_TENSOR};
    a.t.dtype = dt;
    a.t.ndim = ndim;
    a.t.dims[0] = n;
    a.t.data = eng_alloc(nb ? nb : 1);
    if (!a.t.data) {
        free(a.name);
        a.name = NULL;
    } else {
        memcpy(a.t.data, data, nb);
    }
    mdl_attr_take(b, &a);
    return b->st == ENG_STATUS_OK ? v : -1;
}

int mdl_b_const_f32(mdl_b *b, const char *name, float v) { return mdl_const(b, name, ENG_DTYPE_F32, 0, 1, &v); }

int mdl_b_const_i64s(mdl_b *b, const char *name, const int64_t *v, int n) {
    return mdl_const(b, name, ENG_DTYPE_I64, 1, n, v);
}

/* ---- layers ---- */

#define MDL_NAME(buf, ...) (snprintf(buf, sizeof buf, __VA_ARGS__), buf)

int mdl_b_dense(mdl_b *b, const char *name, int x, int rank, int64_t in, int64_t out) {
    char k[256], bi[256], n1[256], n2[256];
    int w = mdl_b_param(b, MDL_NAME(k, "%s/kernel", name), 2, (int64_t[]){in, out}, MDL_INIT_GLOROT, in, out);
    int bias = mdl_b_param(b, MDL_NAME(bi, "%s/bias", name), 1, (int64_t[]){out}, MDL_INIT_ZEROS, 0, 0);
    if (rank == 2) return mdl_b_op(b, MDL_NAME(n1, "%s/Gemm", name), "Gemm", (int[]){x, w, bias}, 3);
    int y = mdl_b_op2(b, MDL_NAME(n1, "%s/MatMul", name), "MatMul", x, w);
    return mdl_b_op2(b, MDL_NAME(n2, "%s/BiasAdd", name), "Add", y, bias);
}

int mdl_b_act(mdl_b *b, const char *name, int x, mdl_act act) {
    char n[256];
    switch (act) {
    case MDL_ACT_RELU: return mdl_b_op1(b, MDL_NAME(n, "%s/Relu", name), "Relu", x);
    case MDL_ACT_TANH: return mdl_b_op1(b, MDL_NAME(n, "%s/Tanh", name), "Tanh", x);
    case MDL_ACT_SIGMOID: return mdl_b_op1(b, MDL_NAME(n, "%s/Sigmoid", name), "Sigmoid", x);
    case MDL_ACT_GELU: break;
    }
    int sqrt2 = mdl_b_const_f32(b, "const/sqrt2", (float)M_SQRT2);
    int one = mdl_b_const_f32(b, "const/one", 1.0f);
    int half = mdl_b_const_f32(b, "const/half", 0.5f);
    int t = mdl_b_op2(b, MDL_NAME(n, "%s/Gelu/Div", name), "Div", x, sqrt2);
    t = mdl_b_op1(b, MDL_NAME(n, "%s/Gelu/Erf", name), "Erf", t);
    t = mdl_b_op2(b, MDL_NAME(n, "%s/Gelu/Add", name), "Add", t, one);
    t = mdl_b_op2(b, MDL_NAME(n, "%s/Gelu/Mul", name), "Mul", x, t);
    return mdl_b_op2(b, MDL_NAME(n, "%s/Gelu/Mul_1", name), "Mul", t, half);
}

int mdl_b_conv(mdl_b *b, const char *name, int x, int64_t cin, int64_t cout, int64_t k, int64_t stride, int64_t pad,
               int bias) {
    char kn[256], bn[256], n[256];
    int w = mdl_b_param(b, MDL_NAME(kn, "%s/kernel", name), 4, (int64_t[]){cout, cin, k, k}, MDL_INIT_GLOROT,
                        cin * k * k, cout * k * k);
    int in[3] = {x, w, -1};
    if (bias) in[2] = mdl_b_param(b, MDL_NAME(bn, "%s/bias", name), 1, (int64_t[]){cout}, MDL_INIT_ZEROS, 0, 0);
    int y = mdl_b_op(b, MDL_NAME(n, "%s/Conv", name), "Conv", in, bias ? 3 : 2);
    mdl_b_attr_ints(b, "kernel_shape", (int64_t[]){k, k}, 2);
    mdl_b_attr_ints(b, "strides", (int64_t[]){stride, stride}, 2);
    mdl_b_attr_ints(b, "pads", (int64_t[]){pad, pad, pad, pad}, 4);
    mdl_b_attr_ints(b, "dilations", (int64_t[]){1, 1}, 2);
    mdl_b_attr_int(b, "group", 1);
    return y;
}

int mdl_b_batchnorm(mdl_b *b, const char *name, int x, int64_t c) {
    char g[256], be[256], m[256], v[256], n[256];
    int in[5] = {x, mdl_b_param(b, MDL_NAME(g, "%s/gamma", name), 1, &c, MDL_INIT_ONES, 0, 0),
                 mdl_b_param(b, MDL_NAME(be, "%s/beta", name), 1, &c, MDL_INIT_ZEROS, 0, 0),
                 mdl_b_param(b, MDL_NAME(m, "%s/moving_mean", name), 1, &c, MDL_INIT_ZEROS, 0, 0),
                 mdl_b_param(b, MDL_NAME(v, "%s/moving_variance", name), 1, &c, MDL_INIT_ONES, 0, 0)};
    int y = mdl_b_op(b, MDL_NAME(n, "%s/BatchNormalization", name), "BatchNormalization", in, 5);
    mdl_b_attr_float(b, "epsilon", 1e-3f);
    mdl_b_attr_float(b, "momentum", 0.99f);
    return y;
}

int mdl_b_layernorm(mdl_b *b, const char *name, int x, int64_t d) {
    char g[256], be[256], n[256];
    int in[3] = {x, mdl_b_param(b, MDL_NAME(g, "%s/gamma", name), 1, &d, MDL_INIT_ONES, 0, 0),
                 mdl_b_param(b, MDL_NAME(be, "%s/beta", name), 1, &d, MDL_INIT_ZEROS, 0, 0)};
    int y = mdl_b_op(b, MDL_NAME(n, "%s/LayerNormalization", name), "LayerNormalization", in, 3);
    mdl_b_attr_int(b, "axis", -1);
    mdl_b_attr_float(b, "epsilon", 1e-5f);
    return y;
}

/* [N, seq, d] -> [N, heads, seq, dh] (perm 0,2,1,3) or, for keys, [N, heads, dh, seq] (perm 0,2,3,1). */
static int mdl_split_heads(mdl_b *b, const char *name, int x, int64_t heads, int64_t dh, int keys) {
    char n[256], c[64];
    int64_t shape[4] = {0, 0, heads, dh};
    int s = mdl_b_const_i64s(b, MDL_NAME(c, "const/shape_heads_%lld_%lld", (long long)heads, (long long)dh), shape, 4);
    int r = mdl_b_op2(b, MDL_NAME(n, "%s/Reshape", name), "Reshape", x, s);
    int t = mdl_b_op1(b, MDL_NAME(n, "%s/Transpose", name), "Transpose", r);
    mdl_b_attr_ints(b, "perm", keys ? (int64_t[]){0, 2, 3, 1} : (int64_t[]){0, 2, 1, 3}, 4);
    return t;
}

int mdl_b_attention(mdl_b *b, const char *name, int x, int64_t seq, int64_t d, int64_t heads) {
    (void)seq;
    char n[256], p[256];
    int64_t dh = d / heads;
    int q = mdl_b_dense(b, MDL_NAME(p, "%s/query", name), x, 3, d, d);
    q = mdl_split_heads(b, p, q, heads, dh, 0);
    int k = mdl_b_dense(b, MDL_NAME(p, "%s/key", name), x, 3, d, d);
    k = mdl_split_heads(b, p, k, heads, dh, 1);
    int v = mdl_b_dense(b, MDL_NAME(p, "%s/value", name), x, 3, d, d);
    v = mdl_split_heads(b, p, v, heads, dh, 0);
    char c[64];
    int scale = mdl_b_const_f32(b, MDL_NAME(c, "const/attention_scale_%lld", (long long)dh), (float)(1.0 / sqrt((double)dh)));
    int s = mdl_b_op2(b, MDL_NAME(n, "%s/scores/MatMul", name), "MatMul", q, k); /* [N, h, seq, seq] */
    s = mdl_b_op2(b, MDL_NAME(n, "%s/scores/Mul", name), "Mul", s, scale);
    s = mdl_b_op1(b, MDL_NAME(n, "%s/Softmax", name), "Softmax", s);
    mdl_b_attr_int(b, "axis", -1);
    int o = mdl_b_op2(b, MDL_NAME(n, "%s/context/MatMul", name), "MatMul", s, v); /* [N, h, seq, dh] */
    o = mdl_b_op1(b, MDL_NAME(n, "%s/context/Transpose", name), "Transpose", o);
    mdl_b_attr_ints(b, "perm", (int64_t[]){0, 2, 1, 3}, 4);
    int shape = mdl_b_const_i64s(b, MDL_NAME(c, "const/shape_merge_%lld", (long long)d), (int64_t[]){0, 0, d}, 3);
    o = mdl_b_op2(b, MDL_NAME(n, "%s/context/Reshape", name), "Reshape", o, shape);
    return mdl_b_dense(b, MDL_NAME(p, "%s/output", name), o, 3, d, d);
}

int mdl_b_ffn(mdl_b *b, const char *name, int x, int64_t d, int64_t ffn) {
    char p[256];
    int h = mdl_b_dense(b, MDL_NAME(p, "%s/intermediate", name), x, 3, d, ffn);
    h = mdl_b_act(b, p, h, MDL_ACT_GELU);
    return mdl_b_dense(b, MDL_NAME(p, "%s/output", name), h, 3, ffn, d);
}

void mdl_b_classifier(mdl_b *b, int x, int64_t in, int64_t classes, int softmax) {
    int64_t dims[2] = {-1, classes};
    int y = mdl_b_dense(b, "head", x, 2, in, classes);
    if (!softmax) {
        mdl_b_output(b, y, "logits", 2, dims);
        return;
    }
    y = mdl_b_op1(b, "softmax", "Softmax", y);
    mdl_b_attr_int(b, "axis", -1);
    mdl_b_output(b, y, "probabilities", 2, dims);
}

int64_t mdl_param_count(const eng_graph *g) {
    int64_t n = 0;
    for (int i = 0; g && i < g->nvalues; i++)
        if (g->values[i].init && g->values[i].init->dtype == ENG_DTYPE_F32) n += eng_tensor_numel(g->values[i].init);
    return n;
}
