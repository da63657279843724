/* test_nn.c - the nn op family (Conv, ConvTranspose, MaxPool/AveragePool, MatMul, Gemm) and engine/plan/fuse.c.
 *
 * Each case builds a one-node graph (weights as initializers, so the constant-weight oneDNN/GEMV paths run, and
 * again as graph inputs for the non-constant paths), plans and runs it on the CPU backend, and compares with a
 * naive double-precision loop written here. The fusion test runs a Conv+BN+Add+Relu / MatMul+Add+Relu /
 * MatMul+Add+erf-Gelu graph with and without eng_graph_fuse and requires the same outputs within 1e-5.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/plan/fuse.h"
#include "engine/ir/graph.h"
#include "engine/plan/plan.h"

/* ---- graph helpers ---- */

static unsigned rng_state = 12345u;
static float frand(void) {
    rng_state = rng_state * 1664525u + 1013904223u;
    return ((rng_state >> 8) & 0xffff) / 32768.0f - 1.0f;
}
static float *rand_buf(int64_t n) {
    float *p = eng_alloc((size_t)(n ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = frand();
    return p;
}

static int val(eng_graph *g, const char *name, int ndim, const int64_t *dims) {
    int v = eng_graph_add_value(g, name);
    g->values[v].dtype = dims ? ENG_DTYPE_F32 : ENG_DTYPE_UNDEFINED;
    g->values[v].ndim = dims ? ndim : -1;
    for (int i = 0; dims && i < ndim; i++) g->values[v].dims[i] = dims[i];
    return v;
}
static void add_io(int **arr, int *n, int v) {
    *arr = realloc(*arr, (size_t)(*n + 1) * sizeof(int));
    (*arr)[(*n)++] = v;
}
/* Input value: an initializer holding `data` (copied) when as_init, else a graph input. */
static int tensor_val(eng_graph *g, const char *name, int ndim, const int64_t *dims, const float *data, int as_init) {
    int v = val(g, name, ndim, dims);
    if (as_init) {
        eng_tensor *t = calloc(1, sizeof *t);
        t->dtype = ENG_DTYPE_F32;
        t->ndim = ndim;
        memcpy(t->dims, dims, (size_t)ndim * sizeof(int64_t));
        size_t nb = (size_t)eng_shape_numel(dims, ndim) * sizeof(float);
        t->data = eng_alloc(nb ? nb : 4);
        memcpy(t->data, data, nb);
        eng_value_set_init(g, v, t);
    } else {
        add_io(&g->inputs, &g->ninputs, v);
    }
    return v;
}
static void attr_ints(eng_graph *g, int node, const char *name, const int64_t *v, int n) {
    eng_attr a = {.name = (char *)name, .type = ENG_ATTR_INTS, .ints = (int64_t *)v, .n = n};
    eng_node_add_attr(g, node, &a);
}
static void attr_int(eng_graph *g, int node, const char *name, int64_t v) {
    eng_attr a = {.name = (char *)name, .type = ENG_ATTR_INT, .i = v};
    eng_node_add_attr(g, node, &a);
}
static void attr_float(eng_graph *g, int node, const char *name, float v) {
    eng_attr a = {.name = (char *)name, .type = ENG_ATTR_FLOAT, .f = v};
    eng_node_add_attr(g, node, &a);
}

typedef struct feed {
    const float *data;
    int ndim;
    int64_t dims[ENG_MAX_DIMS];
} feed;

/* Plan + run g with the graph inputs fed in order; copies output 0 into `out` (n floats). Returns its numel. */
static int64_t run_graph(eng_graph *g, const feed *feeds, float *out, int64_t cap, int fuse) {
    if (fuse) cr_assert_eq(eng_graph_fuse(g), ENG_STATUS_OK, "fuse: %s", eng_last_error());
    eng_tensor in[8] = {0};
    for (int i = 0; i < g->ninputs; i++) {
        in[i].dtype = ENG_DTYPE_F32;
        in[i].ndim = feeds[i].ndim;
        memcpy(in[i].dims, feeds[i].dims, sizeof in[i].dims);
        in[i].data = (void *)feeds[i].data;
    }
    eng_plan_opts o = {.nthreads = 2};
    eng_plan *p = NULL;
    eng_status st = eng_plan_new(g, &o, in, &p);
    cr_assert_eq(st, ENG_STATUS_OK, "plan: %s", eng_last_error());
    eng_tensor outs[4];
    st = eng_plan_run(p, in, outs);
    cr_assert_eq(st, ENG_STATUS_OK, "run: %s", eng_last_error());
    int64_t n = eng_tensor_numel(&outs[0]);
    cr_assert_leq(n, cap);
    memcpy(out, outs[0].data, (size_t)n * sizeof(float));
    eng_plan_free(&p);
    return n;
}

static void expect_close(const float *got, const double *want, int64_t n, double tol, const char *what) {
    for (int64_t i = 0; i < n; i++)
        cr_assert(fabs(got[i] - want[i]) <= tol * (1.0 + fabs(want[i])), "%s: element %lld got %g want %g", what,
                  (long long)i, got[i], want[i]);
}

/* ---- Conv (2-D) ---- */

typedef struct conv_case {
    int64_t n, c, h, w, m, kh, kw, group, sh, sw, dh, dw, pt, pl, pb, pr;
    int bias;
} conv_case;

static void conv_ref(const conv_case *k, const float *x, const float *w, const float *b, double *y, int64_t oh, int64_t ow) {
    int64_t cg = k->c / k->group, mg = k->m / k->group;
    for (int64_t n = 0; n < k->n; n++)
        for (int64_t m = 0; m < k->m; m++)
            for (int64_t i = 0; i < oh; i++)
                for (int64_t j = 0; j < ow; j++) {
                    double s = b ? b[m] : 0.0;
                    int64_t g = m / mg;
                    for (int64_t ci = 0; ci < cg; ci++)
                        for (int64_t a = 0; a < k->kh; a++)
                            for (int64_t bb = 0; bb < k->kw; bb++) {
                                int64_t ih = i * k->sh - k->pt + a * k->dh, iw = j * k->sw - k->pl + bb * k->dw;
                                if (ih < 0 || ih >= k->h || iw < 0 || iw >= k->w) continue;
                                s += (double)x[((n * k->c + g * cg + ci) * k->h + ih) * k->w + iw] *
                                     w[((m * cg + ci) * k->kh + a) * k->kw + bb];
                            }
                    y[((n * k->m + m) * oh + i) * ow + j] = s;
                }
}

static void conv_check(const conv_case *k, int w_init) {
    int64_t xd[4] = {k->n, k->c, k->h, k->w}, wd[4] = {k->m, k->c / k->group, k->kh, k->kw}, bd[1] = {k->m};
    int64_t oh = (k->h + k->pt + k->pb - ((k->kh - 1) * k->dh + 1)) / k->sh + 1;
    int64_t ow = (k->w + k->pl + k->pr - ((k->kw - 1) * k->dw + 1)) / k->sw + 1;
    float *x = rand_buf(eng_shape_numel(xd, 4)), *w = rand_buf(eng_shape_numel(wd, 4)), *b = rand_buf(k->m);
    int64_t ny = k->n * k->m * oh * ow;
    double *want = malloc((size_t)ny * sizeof(double));
    float *got = malloc((size_t)ny * sizeof(float));
    conv_ref(k, x, w, k->bias ? b : NULL, want, oh, ow);
    eng_graph *g = eng_graph_new();
    g->opset = 17;
    int xv = tensor_val(g, "x", 4, xd, x, 0);
    int wv = tensor_val(g, "w", 4, wd, w, w_init);
    int ins[3] = {xv, wv, k->bias ? tensor_val(g, "b", 1, bd, b, w_init) : -1};
    int yv = val(g, "y", 0, NULL);
    int nd = eng_graph_add_node(g, "conv", "Conv", "", ins, k->bias ? 3 : 2, &yv, 1);
    int64_t st[2] = {k->sh, k->sw}, dl[2] = {k->dh, k->dw}, pd[4] = {k->pt, k->pl, k->pb, k->pr};
    attr_ints(g, nd, "strides", st, 2);
    attr_ints(g, nd, "dilations", dl, 2);
    attr_ints(g, nd, "pads", pd, 4);
    attr_int(g, nd, "group", k->group);
    add_io(&g->outputs, &g->noutputs, yv);
    feed f[3] = {{x, 4, {k->n, k->c, k->h, k->w}}, {w, 4, {wd[0], wd[1], wd[2], wd[3]}}, {b, 1, {k->m}}};
    cr_assert_eq(run_graph(g, f, got, ny, 0), ny);
    char what[128];
    snprintf(what, sizeof what, "conv n%lld c%lld m%lld g%lld k%lldx%lld s%lld d%lld init%d", (long long)k->n,
             (long long)k->c, (long long)k->m, (long long)k->group, (long long)k->kh, (long long)k->kw, (long long)k->sh,
             (long long)k->dh, w_init);
    expect_close(got, want, ny, 1e-4, what);
    eng_graph_free(&g);
    eng_free(x), eng_free(w), eng_free(b);
    free(want), free(got);
}

Test(nn, conv_parameter_sweep) {
    conv_case cases[] = {
        {1, 1, 28, 28, 32, 3, 3, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1},   /* the benchmark CNN's conv */
        {2, 3, 9, 7, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},      /* odd sizes, batch, same pads */
        {1, 4, 8, 8, 6, 3, 2, 2, 2, 1, 1, 1, 1, 0, 0, 1, 0},      /* groups, asymmetric pads, no bias */
        {2, 8, 10, 10, 8, 3, 3, 8, 1, 1, 1, 1, 1, 1, 1, 1, 1},    /* depthwise */
        {1, 3, 11, 13, 5, 3, 3, 1, 2, 3, 2, 2, 2, 1, 0, 2, 1},    /* strides + dilations */
        {3, 16, 6, 6, 32, 1, 1, 1, 2, 2, 1, 1, 0, 0, 0, 0, 1},    /* 1x1 stride 2 projection */
        {1, 5, 5, 5, 3, 5, 5, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1},      /* kernel = input */
        {2, 32, 9, 7, 48, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},    /* >= 32 channels (plain layout: direct) */
        {1, 64, 6, 6, 32, 3, 3, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0},    /* valid pads, no bias */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        conv_check(&cases[i], 1);
        conv_check(&cases[i], 0);
    }
}

/* ---- ConvTranspose (2-D) ---- */

Test(nn, conv_transpose_sweep) {
    struct { int64_t n, c, h, w, m, k, group, s, d, p, op; } cases[] = {
        {1, 2, 3, 4, 3, 3, 1, 2, 1, 1, 1}, {2, 4, 5, 5, 4, 2, 2, 1, 2, 0, 0}, {1, 1, 3, 3, 2, 3, 1, 3, 1, 0, 2},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        __typeof__(cases[0]) *k = &cases[ci];
        int64_t xd[4] = {k->n, k->c, k->h, k->w}, wd[4] = {k->c, k->m / k->group, k->k, k->k};
        int64_t ext = (k->k - 1) * k->d + 1;
        int64_t oh = k->s * (k->h - 1) + k->op + ext - 2 * k->p, ow = k->s * (k->w - 1) + k->op + ext - 2 * k->p;
        float *x = rand_buf(eng_shape_numel(xd, 4)), *w = rand_buf(eng_shape_numel(wd, 4)), *b = rand_buf(k->m);
        int64_t ny = k->n * k->m * oh * ow;
        double *want = calloc((size_t)ny, sizeof(double));
        float *got = malloc((size_t)ny * sizeof(float));
        int64_t cg = k->c / k->group, mg = k->m / k->group;
        for (int64_t i = 0; i < ny; i++) want[i] = b[(i / (oh * ow)) % k->m];
        for (int64_t n = 0; n < k->n; n++)
            for (int64_t c = 0; c < k->c; c++)
                for (int64_t i = 0; i < k->h; i++)
                    for (int64_t j = 0; j < k->w; j++)
                        for (int64_t mm = 0; mm < mg; mm++)
                            for (int64_t a = 0; a < k->k; a++)
                                for (int64_t bb = 0; bb < k->k; bb++) {
                                    int64_t o0 = i * k->s - k->p + a * k->d, o1 = j * k->s - k->p + bb * k->d;
                                    if (o0 < 0 || o0 >= oh || o1 < 0 || o1 >= ow) continue;
                                    int64_t m = (c / cg) * mg + mm;
                                    want[((n * k->m + m) * oh + o0) * ow + o1] +=
                                        (double)x[((n * k->c + c) * k->h + i) * k->w + j] * w[((c * mg + mm) * k->k + a) * k->k + bb];
                                }
        eng_graph *g = eng_graph_new();
        g->opset = 17;
        int64_t bd[1] = {k->m};
        int ins[3] = {tensor_val(g, "x", 4, xd, x, 0), tensor_val(g, "w", 4, wd, w, 1), tensor_val(g, "b", 1, bd, b, 1)};
        int yv = val(g, "y", 0, NULL);
        int nd = eng_graph_add_node(g, "ct", "ConvTranspose", "", ins, 3, &yv, 1);
        int64_t st[2] = {k->s, k->s}, dl[2] = {k->d, k->d}, pd[4] = {k->p, k->p, k->p, k->p}, op[2] = {k->op, k->op};
        attr_ints(g, nd, "strides", st, 2);
        attr_ints(g, nd, "dilations", dl, 2);
        attr_ints(g, nd, "pads", pd, 4);
        attr_ints(g, nd, "output_padding", op, 2);
        attr_int(g, nd, "group", k->group);
        add_io(&g->outputs, &g->noutputs, yv);
        feed f[1] = {{x, 4, {k->n, k->c, k->h, k->w}}};
        cr_assert_eq(run_graph(g, f, got, ny, 0), ny);
        expect_close(got, want, ny, 1e-4, "conv_transpose");
        eng_graph_free(&g);
        eng_free(x), eng_free(w), eng_free(b);
        free(want), free(got);
    }
}

/* ---- pooling (2-D) ---- */

Test(nn, pool_sweep) {
    struct { const char *op; int64_t n, c, h, w, k, s, p, d, ceil, cip; } cases[] = {
        {"MaxPool", 2, 3, 26, 26, 2, 2, 0, 1, 0, 0}, {"MaxPool", 1, 2, 7, 9, 3, 2, 1, 1, 1, 0},
        {"MaxPool", 1, 1, 8, 8, 2, 1, 0, 2, 0, 0},  {"AveragePool", 2, 2, 7, 7, 3, 2, 1, 1, 0, 0},
        {"AveragePool", 1, 2, 7, 7, 3, 2, 1, 1, 1, 1}, {"AveragePool", 1, 3, 6, 5, 2, 2, 0, 1, 1, 0},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        __typeof__(cases[0]) *k = &cases[ci];
        int maxp = !strcmp(k->op, "MaxPool");
        int64_t xd[4] = {k->n, k->c, k->h, k->w}, ext = (k->k - 1) * k->d + 1;
        int64_t oh, ow;
        {
            int64_t sp = k->h + 2 * k->p - ext, sq = k->w + 2 * k->p - ext;
            oh = k->ceil ? (sp + k->s - 1) / k->s + 1 : sp / k->s + 1;
            ow = k->ceil ? (sq + k->s - 1) / k->s + 1 : sq / k->s + 1;
            if (k->ceil && (oh - 1) * k->s >= k->h + k->p) oh--;
            if (k->ceil && (ow - 1) * k->s >= k->w + k->p) ow--;
        }
        float *x = rand_buf(eng_shape_numel(xd, 4));
        int64_t ny = k->n * k->c * oh * ow;
        double *want = malloc((size_t)ny * sizeof(double));
        float *got = malloc((size_t)ny * sizeof(float));
        for (int64_t pl = 0; pl < k->n * k->c; pl++)
            for (int64_t i = 0; i < oh; i++)
                for (int64_t j = 0; j < ow; j++) {
                    double acc = maxp ? -1e30 : 0.0;
                    int64_t cnt = 0, cntp = 0;
                    for (int64_t a = 0; a < k->k; a++)
                        for (int64_t b = 0; b < k->k; b++) {
                            int64_t ih = i * k->s - k->p + a * k->d, iw = j * k->s - k->p + b * k->d;
                            if (ih < k->h + k->p && iw < k->w + k->p) cntp++;
                            if (ih < 0 || ih >= k->h || iw < 0 || iw >= k->w) continue;
                            double v = x[(pl * k->h + ih) * k->w + iw];
                            acc = maxp ? (v > acc ? v : acc) : acc + v;
                            cnt++;
                        }
                    want[(pl * oh + i) * ow + j] = maxp ? acc : acc / (double)(k->cip ? cntp : cnt);
                }
        eng_graph *g = eng_graph_new();
        g->opset = 19;
        int xv = tensor_val(g, "x", 4, xd, x, 0), yv = val(g, "y", 0, NULL);
        int nd = eng_graph_add_node(g, "pool", k->op, "", &xv, 1, &yv, 1);
        int64_t ks[2] = {k->k, k->k}, st[2] = {k->s, k->s}, dl[2] = {k->d, k->d}, pd[4] = {k->p, k->p, k->p, k->p};
        attr_ints(g, nd, "kernel_shape", ks, 2);
        attr_ints(g, nd, "strides", st, 2);
        attr_ints(g, nd, "dilations", dl, 2);
        attr_ints(g, nd, "pads", pd, 4);
        attr_int(g, nd, "ceil_mode", k->ceil);
        if (!maxp) attr_int(g, nd, "count_include_pad", k->cip);
        add_io(&g->outputs, &g->noutputs, yv);
        feed f[1] = {{x, 4, {k->n, k->c, k->h, k->w}}};
        cr_assert_eq(run_graph(g, f, got, ny, 0), ny, "%s case %zu", k->op, ci);
        expect_close(got, want, ny, 1e-5, k->op);
        eng_graph_free(&g);
        eng_free(x);
        free(want), free(got);
    }
}

/* ---- MatMul (broadcast batches) and Gemm ---- */

Test(nn, matmul_broadcast_sweep) {
    struct { int ra, rb; int64_t a[4], b[4]; } cases[] = {
        {2, 2, {1, 784}, {784, 512}},        /* batch-1 MLP layer: GEMV path */
        {2, 2, {64, 784}, {784, 512}},       /* oneDNN path */
        {3, 2, {2, 5, 7}, {7, 3}},           /* collapsed batch */
        {4, 4, {2, 3, 4, 5}, {2, 3, 5, 6}},  /* batched (attention) */
        {3, 4, {3, 4, 5}, {2, 1, 5, 2}},     /* broadcast both ways */
        {1, 2, {5}, {5, 4}},                 /* 1-D A */
        {3, 1, {2, 3, 5}, {5}},              /* 1-D B */
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int binit = 0; binit < 2; binit++) {
            __typeof__(cases[0]) *k = &cases[ci];
            int r = k->ra > k->rb ? k->ra : k->rb;
            if (r < 2) r = 2;
            int64_t A[4] = {1, 1, 1, 1}, B[4] = {1, 1, 1, 1};
            if (k->ra == 1) A[r - 1] = k->a[0];
            else memcpy(A + r - k->ra, k->a, (size_t)k->ra * 8);
            if (k->rb == 1) B[r - 2] = k->b[0];
            else memcpy(B + r - k->rb, k->b, (size_t)k->rb * 8);
            int64_t M = A[r - 2], K = A[r - 1], N = B[r - 1], nb = 1, Y[4];
            for (int i = 0; i < r - 2; i++) Y[i] = A[i] > B[i] ? A[i] : B[i], nb *= Y[i];
            float *a = rand_buf(eng_shape_numel(k->a, k->ra)), *b = rand_buf(eng_shape_numel(k->b, k->rb));
            int64_t ny = nb * M * N;
            double *want = malloc((size_t)ny * sizeof(double));
            float *got = malloc((size_t)ny * sizeof(float));
            for (int64_t bi = 0; bi < nb; bi++) {
                int64_t oa = 0, ob = 0, rem = bi, sa = M * K, sb = K * N;
                for (int d = r - 3; d >= 0; d--) {
                    int64_t i = rem % Y[d];
                    rem /= Y[d];
                    if (A[d] != 1) oa += i * sa;
                    if (B[d] != 1) ob += i * sb;
                    sa *= A[d], sb *= B[d];
                }
                for (int64_t m = 0; m < M; m++)
                    for (int64_t n = 0; n < N; n++) {
                        double s = 0;
                        for (int64_t kk = 0; kk < K; kk++) s += (double)a[oa + m * K + kk] * b[ob + kk * N + n];
                        want[(bi * M + m) * N + n] = s;
                    }
            }
            eng_graph *g = eng_graph_new();
            g->opset = 17;
            int ins[2] = {tensor_val(g, "a", k->ra, k->a, a, 0), tensor_val(g, "b", k->rb, k->b, b, binit)};
            int yv = val(g, "y", 0, NULL);
            eng_graph_add_node(g, "mm", "MatMul", "", ins, 2, &yv, 1);
            add_io(&g->outputs, &g->noutputs, yv);
            feed f[2] = {{a, k->ra, {0}}, {b, k->rb, {0}}};
            memcpy(f[0].dims, k->a, sizeof k->a);
            memcpy(f[1].dims, k->b, sizeof k->b);
            cr_assert_eq(run_graph(g, f, got, ny, 0), ny, "matmul case %zu", ci);
            expect_close(got, want, ny, 1e-4, "matmul");
            eng_graph_free(&g);
            eng_free(a), eng_free(b);
            free(want), free(got);
        }
}

Test(nn, gemm_sweep) {
    struct { int64_t M, K, N; int ta, tb; float alpha, beta; int cr; int64_t c[2]; } cases[] = {
        {1, 784, 512, 0, 0, 1.f, 1.f, 1, {512}},       {64, 784, 512, 0, 1, 1.f, 1.f, 1, {512}},
        {3, 5, 4, 1, 1, 0.5f, 2.f, 2, {3, 4}},         {3, 5, 4, 1, 0, 1.f, 0.5f, 2, {3, 1}},
        {2, 6, 3, 0, 0, 2.f, 1.f, 1, {1}},             {4, 3, 2, 0, 1, 1.f, 0.f, 0, {0}},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int init = 0; init < 2; init++) {
            __typeof__(cases[0]) *k = &cases[ci];
            int64_t ad[2] = {k->ta ? k->K : k->M, k->ta ? k->M : k->K}, bd[2] = {k->tb ? k->N : k->K, k->tb ? k->K : k->N};
            float *a = rand_buf(k->M * k->K), *b = rand_buf(k->K * k->N), *c = rand_buf(k->M * k->N);
            int64_t ny = k->M * k->N;
            double *want = malloc((size_t)ny * sizeof(double));
            float *got = malloc((size_t)ny * sizeof(float));
            for (int64_t m = 0; m < k->M; m++)
                for (int64_t n = 0; n < k->N; n++) {
                    double s = 0;
                    for (int64_t kk = 0; kk < k->K; kk++)
                        s += (double)(k->ta ? a[kk * k->M + m] : a[m * k->K + kk]) * (k->tb ? b[n * k->K + kk] : b[kk * k->N + n]);
                    s *= k->alpha;
                    if (k->cr) {
                        int64_t cm = k->cr == 2 && k->c[0] != 1 ? m : 0;
                        int64_t cn = k->c[k->cr - 1] != 1 ? n : 0;
                        s += k->beta * c[cm * (k->cr == 2 ? k->c[1] : 0) + cn];
                    }
                    want[m * k->N + n] = s;
                }
            eng_graph *g = eng_graph_new();
            g->opset = 17;
            int ins[3] = {tensor_val(g, "a", 2, ad, a, 0), tensor_val(g, "b", 2, bd, b, init),
                          k->cr ? tensor_val(g, "c", k->cr, k->c, c, init) : -1};
            int yv = val(g, "y", 0, NULL);
            int nd = eng_graph_add_node(g, "gemm", "Gemm", "", ins, k->cr ? 3 : 2, &yv, 1);
            attr_int(g, nd, "transA", k->ta);
            attr_int(g, nd, "transB", k->tb);
            attr_float(g, nd, "alpha", k->alpha);
            attr_float(g, nd, "beta", k->beta);
            add_io(&g->outputs, &g->noutputs, yv);
            feed f[3] = {{a, 2, {ad[0], ad[1]}}, {b, 2, {bd[0], bd[1]}}, {c, k->cr, {k->c[0], k->c[1]}}};
            cr_assert_eq(run_graph(g, f, got, ny, 0), ny);
            expect_close(got, want, ny, 1e-4, "gemm");
            eng_graph_free(&g);
            eng_free(a), eng_free(b), eng_free(c);
            free(want), free(got);
        }
}

/* ---- fusion: same numbers with and without eng_graph_fuse ---- */

static float *scalar_init(eng_graph *g, const char *name, float v, int *out) {
    int64_t d[1] = {1};
    *out = tensor_val(g, name, 0, d, &v, 1);
    return NULL;
}

/* x[2,3,9,9] -> Conv(8) -> BN -> Add(skip conv) -> Relu -> Conv(16) -> Relu -> MaxPool -> Flatten -> y0
 * x2[4,20] -> MatMul(20x16) -> Add(b) -> Relu -> MatMul(16x8) -> Add(b) -> erf-Gelu -> y1 */
static eng_graph *fusion_graph(void) {
    rng_state = 777u;
    eng_graph *g = eng_graph_new();
    g->opset = 17;
    int64_t xd[4] = {2, 3, 9, 9}, w1d[4] = {8, 3, 3, 3}, w2d[4] = {16, 8, 3, 3}, ws[4] = {8, 3, 1, 1}, cd[1] = {8};
    int64_t c16[1] = {16};
    int x = tensor_val(g, "x", 4, xd, NULL, 0);
    float *w1 = rand_buf(8 * 27), *w2 = rand_buf(16 * 72), *wsk = rand_buf(24), *b2 = rand_buf(16);
    float bnp[4][8];
    for (int i = 0; i < 8; i++) bnp[0][i] = 1 + 0.1f * frand(), bnp[1][i] = frand(), bnp[2][i] = frand(), bnp[3][i] = 1.5f + frand();
    int ins[5];
    int c1 = val(g, "c1", 0, NULL), bn = val(g, "bn", 0, NULL), sk = val(g, "sk", 0, NULL), ad = val(g, "ad", 0, NULL);
    int r1 = val(g, "r1", 0, NULL), c2 = val(g, "c2", 0, NULL), r2 = val(g, "r2", 0, NULL), mp = val(g, "mp", 0, NULL);
    int y0 = val(g, "y0", 0, NULL);
    ins[0] = x, ins[1] = tensor_val(g, "w1", 4, w1d, w1, 1);
    int n1 = eng_graph_add_node(g, "conv1", "Conv", "", ins, 2, &c1, 1);
    int64_t p1[4] = {1, 1, 1, 1};
    attr_ints(g, n1, "pads", p1, 4);
    ins[0] = c1;
    for (int i = 0; i < 4; i++) {
        char nm[16];
        snprintf(nm, sizeof nm, "bnp%d", i);
        ins[1 + i] = tensor_val(g, nm, 1, cd, bnp[i], 1);
    }
    eng_graph_add_node(g, "bn", "BatchNormalization", "", ins, 5, &bn, 1);
    ins[0] = x, ins[1] = tensor_val(g, "wsk", 4, ws, wsk, 1);
    eng_graph_add_node(g, "skip", "Conv", "", ins, 2, &sk, 1);
    ins[0] = bn, ins[1] = sk;
    eng_graph_add_node(g, "add", "Add", "", ins, 2, &ad, 1);
    eng_graph_add_node(g, "relu1", "Relu", "", &ad, 1, &r1, 1);
    ins[0] = r1, ins[1] = tensor_val(g, "w2", 4, w2d, w2, 1), ins[2] = tensor_val(g, "b2", 1, c16, b2, 1);
    eng_graph_add_node(g, "conv2", "Conv", "", ins, 3, &c2, 1);
    eng_graph_add_node(g, "relu2", "Relu", "", &c2, 1, &r2, 1);
    int np = eng_graph_add_node(g, "pool", "MaxPool", "", &r2, 1, &mp, 1);
    int64_t k2[2] = {2, 2};
    attr_ints(g, np, "kernel_shape", k2, 2);
    attr_ints(g, np, "strides", k2, 2);
    eng_graph_add_node(g, "flat", "Flatten", "", &mp, 1, &y0, 1);
    add_io(&g->outputs, &g->noutputs, y0);

    int64_t x2d[2] = {4, 20}, m1d[2] = {20, 16}, m2d[2] = {16, 8}, bb1[1] = {16}, bb2[1] = {8};
    int x2 = tensor_val(g, "x2", 2, x2d, NULL, 0);
    float *m1 = rand_buf(320), *m2 = rand_buf(128), *mb1 = rand_buf(16), *mb2 = rand_buf(8);
    int t[12];
    const char *tn[12] = {"t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8", "t9", "t10", "y1"};
    for (int i = 0; i < 12; i++) t[i] = val(g, tn[i], 0, NULL);
    ins[0] = x2, ins[1] = tensor_val(g, "m1", 2, m1d, m1, 1);
    eng_graph_add_node(g, "mm1", "MatMul", "", ins, 2, &t[0], 1);
    ins[0] = t[0], ins[1] = tensor_val(g, "mb1", 1, bb1, mb1, 1);
    eng_graph_add_node(g, "add1", "Add", "", ins, 2, &t[1], 1);
    eng_graph_add_node(g, "relu3", "Relu", "", &t[1], 1, &t[2], 1);
    ins[0] = t[2], ins[1] = tensor_val(g, "m2", 2, m2d, m2, 1);
    eng_graph_add_node(g, "mm2", "MatMul", "", ins, 2, &t[3], 1);
    ins[0] = t[3], ins[1] = tensor_val(g, "mb2", 1, bb2, mb2, 1);
    eng_graph_add_node(g, "add2", "Add", "", ins, 2, &t[4], 1);
    int sq, one, half;
    scalar_init(g, "sqrt2", 1.41421356f, &sq);
    scalar_init(g, "one", 1.f, &one);
    scalar_init(g, "half", 0.5f, &half);
    ins[0] = t[4], ins[1] = sq;
    eng_graph_add_node(g, "div", "Div", "", ins, 2, &t[5], 1);
    eng_graph_add_node(g, "erf", "Erf", "", &t[5], 1, &t[6], 1);
    ins[0] = t[6], ins[1] = one;
    eng_graph_add_node(g, "add3", "Add", "", ins, 2, &t[7], 1);
    ins[0] = t[4], ins[1] = t[7];
    eng_graph_add_node(g, "mul1", "Mul", "", ins, 2, &t[8], 1);
    ins[0] = t[8], ins[1] = half;
    eng_graph_add_node(g, "mul2", "Mul", "", ins, 2, &t[11], 1);
    add_io(&g->outputs, &g->noutputs, t[11]);
    eng_free(w1), eng_free(w2), eng_free(wsk), eng_free(b2), eng_free(m1), eng_free(m2), eng_free(mb1), eng_free(mb2);
    return g;
}

static void run_two(eng_graph *g, const float *x, const float *x2, float *o0, float *o1) {
    eng_tensor in[2] = {{ENG_DTYPE_F32, 4, {2, 3, 9, 9}, (void *)x}, {ENG_DTYPE_F32, 2, {4, 20}, (void *)x2}};
    eng_plan_opts o = {.nthreads = 2};
    eng_plan *p = NULL;
    cr_assert_eq(eng_plan_new(g, &o, in, &p), ENG_STATUS_OK, "plan: %s", eng_last_error());
    eng_tensor outs[2];
    cr_assert_eq(eng_plan_run(p, in, outs), ENG_STATUS_OK, "run: %s", eng_last_error());
    cr_assert_eq(eng_tensor_numel(&outs[0]), 2 * 16 * 3 * 3);
    cr_assert_eq(eng_tensor_numel(&outs[1]), 32);
    memcpy(o0, outs[0].data, 288 * sizeof(float));
    memcpy(o1, outs[1].data, 32 * sizeof(float));
    eng_plan_free(&p);
}

Test(nn, fusion_matches_unfused) {
    eng_graph *g = fusion_graph(), *gf = fusion_graph();
    float *x = rand_buf(2 * 3 * 81), *x2 = rand_buf(80);
    float a0[512], a1[32], b0[512], b1[32];
    int before = gf->nnodes;
    cr_assert_eq(eng_graph_fuse(gf), ENG_STATUS_OK, "%s", eng_last_error());
    /* conv1+bn+add(skip)+relu1 -> 1, conv2+relu2 -> 1, mm1+add1+relu3 -> 1, mm2+add2+gelu(5) -> 1 */
    /* BN folds (3), residual Add (1), activations (2), MLP chain (6), and the MaxPool after conv2 (1) */
    cr_assert_eq(gf->nnodes, before - 3 - 1 - 2 - 6 - 1, "nodes %d -> %d", before, gf->nnodes);
    int nfused = 0;
    for (int i = 0; i < gf->nnodes; i++) nfused += !strcmp(gf->nodes[i].domain, "com.tensord");
    cr_assert_eq(nfused, 4);
    cr_assert_eq(gf->ninputs, 2);
    cr_assert_str_eq(gf->values[gf->outputs[0]].name, "y0");
    cr_assert_str_eq(gf->values[gf->outputs[1]].name, "y1");
    int order[64];
    cr_assert_eq(eng_graph_topo_order(gf, order), ENG_STATUS_OK, "%s", eng_last_error());
    run_two(g, x, x2, a0, a1);
    run_two(gf, x, x2, b0, b1);
    for (int i = 0; i < 288; i++) cr_assert(fabsf(a0[i] - b0[i]) <= 1e-5f * (1 + fabsf(a0[i])), "conv out %d: %g vs %g", i, a0[i], b0[i]);
    for (int i = 0; i < 32; i++) cr_assert(fabsf(a1[i] - b1[i]) <= 1e-5f * (1 + fabsf(a1[i])), "mlp out %d: %g vs %g", i, a1[i], b1[i]);
    eng_graph_free(&g);
    eng_graph_free(&gf);
    eng_free(x), eng_free(x2);
}

/* An intermediate that is also a graph output must not be fused away. */
Test(nn, fusion_keeps_graph_outputs) {
    eng_graph *g = eng_graph_new();
    g->opset = 17;
    int64_t xd[4] = {1, 2, 5, 5}, wd[4] = {4, 2, 3, 3};
    float *w = rand_buf(72);
    int ins[2] = {tensor_val(g, "x", 4, xd, NULL, 0), tensor_val(g, "w", 4, wd, w, 1)};
    int c = val(g, "c", 0, NULL), r = val(g, "r", 0, NULL);
    eng_graph_add_node(g, "conv", "Conv", "", ins, 2, &c, 1);
    eng_graph_add_node(g, "relu", "Relu", "", &c, 1, &r, 1);
    add_io(&g->outputs, &g->noutputs, c);
    add_io(&g->outputs, &g->noutputs, r);
    cr_assert_eq(eng_graph_fuse(g), ENG_STATUS_OK);
    cr_assert_eq(g->nnodes, 2);
    cr_assert_str_eq(g->nodes[0].op_type, "Conv");
    cr_assert_str_eq(g->nodes[1].op_type, "Relu");
    eng_graph_free(&g);
    eng_free(w);
}

/* ---- batch-parallel plans (engine/plan/plan-split.c) ---- */

/* Conv 3->8 (3x3, pad 1) + Relu + GlobalAveragePool on x [N,3,6,6] with a symbolic N. */
static eng_graph *split_graph(void) {
    eng_graph *g = eng_graph_new();
    g->opset = 17;
    int64_t xd[4] = {-1, 3, 6, 6}, wd[4] = {8, 3, 3, 3};
    float *w = rand_buf(8 * 27);
    int x = tensor_val(g, "x", 4, xd, NULL, 0);
    int ins[2] = {x, tensor_val(g, "w", 4, wd, w, 1)};
    int c = val(g, "c", 0, NULL), r = val(g, "r", 0, NULL), y = val(g, "y", 0, NULL);
    int nd = eng_graph_add_node(g, "conv", "Conv", "", ins, 2, &c, 1);
    int64_t pads[4] = {1, 1, 1, 1};
    attr_ints(g, nd, "pads", pads, 4);
    eng_graph_add_node(g, "relu", "Relu", "", &c, 1, &r, 1);
    eng_graph_add_node(g, "gap", "GlobalAveragePool", "", &r, 1, &y, 1);
    add_io(&g->outputs, &g->noutputs, y);
    eng_free(w);
    return g;
}

static void split_run(eng_graph *g, const eng_plan_opts *o, const float *x, int64_t n, float *y, eng_plan_stats *st) {
    eng_tensor in = {ENG_DTYPE_F32, 4, {n, 3, 6, 6}, (void *)x}, out;
    eng_plan *p = NULL;
    cr_assert_eq(eng_plan_new(g, o, &in, &p), ENG_STATUS_OK, "plan: %s", eng_last_error());
    cr_assert_eq(eng_plan_run(p, &in, &out), ENG_STATUS_OK, "run: %s", eng_last_error());
    cr_assert_eq(eng_tensor_numel(&out), n * 8);
    memcpy(y, out.data, (size_t)(n * 8) * sizeof(float));
    eng_plan_get_stats(p, st);
    eng_plan_free(&p);
}

/* Batch sizes 4, 5, 6, 8 in chunks of 2 on 2 threads share one cache: two chunk plans (one per thread) and one
 * tail plan (for 5) serve them all, and every answer equals the single-threaded whole plan's. */
Test(nn, batch_split_shares_sub_plans_across_batch_sizes) {
    eng_graph *g = split_graph();
    eng_plan_cache *cache = eng_plan_cache_new();
    float *x = rand_buf(8 * 3 * 36), want[64], got[64];
    int64_t sizes[] = {4, 5, 6, 8, 4};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        int64_t n = sizes[k];
        eng_plan_stats st;
        eng_plan_opts whole = {.nthreads = 1};
        split_run(g, &whole, x, n, want, &st);
        cr_assert_eq(st.split_workers, 0);
        eng_plan_opts split = {.nthreads = 2, .split_rows = 2, .subplans = cache};
        split_run(g, &split, x, n, got, &st);
        cr_assert_eq(st.split_workers, 2, "batch %lld did not split", (long long)n);
        cr_assert_eq(st.split_rows, 2);
        for (int64_t i = 0; i < n * 8; i++)
            cr_assert(fabsf(got[i] - want[i]) <= 1e-5f * (1 + fabsf(want[i])), "batch %lld element %lld: %g vs %g",
                      (long long)n, (long long)i, got[i], want[i]);
    }
    cr_expect_eq(eng_plan_cache_size(cache), 3, "sub-plans compiled: %d", eng_plan_cache_size(cache));
    /* without a cache each plan owns its sub-plans */
    eng_plan_opts own = {.nthreads = 2, .split_rows = 3};
    eng_plan_stats st;
    split_run(g, &own, x, 7, got, &st);
    cr_expect_eq(st.split_rows, 3);
    cr_expect_eq(eng_plan_cache_size(cache), 3);
    eng_plan_cache_free(&cache);
    eng_graph_free(&g);
    eng_free(x);
}
