/* test_reduce.c - unit tests of the reduce op family (engine/ops/reduce*.c, norm*.c + kernels/cpu/reduce*.c,
 * norm*.c) against double-precision reference loops written here.
 *
 * Every test runs the real path: a one-node graph, the op's prepare and infer (so attribute parsing, opset
 * forms and output shapes are checked too), then the CPU kernel (init/exec/free). Shapes cover negative
 * axes, keepdims, rank-0 results, odd sizes, size-1 dims, empty reductions and several dtypes.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/ir/graph.h"
#include "engine/ops/op.h"
#include "kernels/kernel.h"

/* ---- harness ---- */

typedef struct tr_attr {
    const char *name;
    eng_attr_type type;
    int64_t i;
    float f;
    const char *s;
    const int64_t *ints;
    int n;
} tr_attr;

#define A_INT(nm, v) ((tr_attr){.name = (nm), .type = ENG_ATTR_INT, .i = (v)})
#define A_FLOAT(nm, v) ((tr_attr){.name = (nm), .type = ENG_ATTR_FLOAT, .f = (v)})
#define A_STR(nm, v) ((tr_attr){.name = (nm), .type = ENG_ATTR_STRING, .s = (v)})
#define A_INTS(nm, arr, cnt) ((tr_attr){.name = (nm), .type = ENG_ATTR_INTS, .ints = (arr), .n = (cnt)})

static uint64_t tr_rng = 88172645463325252ull;
static double tr_rand(void) { /* uniform [-1, 1) */
    tr_rng ^= tr_rng << 13, tr_rng ^= tr_rng >> 7, tr_rng ^= tr_rng << 17;
    return (double)(tr_rng >> 11) / (double)(1ull << 52) - 1.0;
}

static eng_tensor tr_tensor(eng_dtype dt, int ndim, const int64_t *dims) {
    eng_tensor t = {dt, ndim, {0}, NULL};
    for (int i = 0; i < ndim; i++) t.dims[i] = dims[i];
    int64_t n = eng_tensor_numel(&t);
    t.data = calloc((size_t)(n > 0 ? n : 1), 8);
    return t;
}

static eng_tensor tr_random(eng_dtype dt, int ndim, const int64_t *dims, double scale) {
    eng_tensor t = tr_tensor(dt, ndim, dims);
    int64_t n = eng_tensor_numel(&t);
    for (int64_t i = 0; i < n; i++) {
        double v = tr_rand() * scale;
        if (eng_dtype_is_int(dt)) v = floor(v);
        eng_tensor_set_f64(&t, i, v);
    }
    return t;
}

static eng_tensor tr_i64(int ndim, const int64_t *dims, const int64_t *vals) {
    eng_tensor t = tr_tensor(ENG_DTYPE_I64, ndim, dims);
    if (vals) memcpy(t.data, vals, (size_t)eng_tensor_numel(&t) * 8);
    return t;
}

/* Run one op: prepare, infer, allocate outputs, kernel. Outputs get calloc'd data the caller frees. */
static eng_status tr_run(const char *op, int64_t opset, const tr_attr *attrs, int nattr, eng_tensor *in, int nin,
                         eng_tensor *out, int nout) {
    eng_graph *g = eng_graph_new();
    int ins[16], outs[8];
    char name[32];
    for (int i = 0; i < nin; i++) snprintf(name, sizeof name, "in%d", i), ins[i] = eng_graph_add_value(g, name);
    for (int i = 0; i < nout; i++) snprintf(name, sizeof name, "out%d", i), outs[i] = eng_graph_add_value(g, name);
    for (int i = 0; i < nin; i++)
        if (in[i].dtype == ENG_DTYPE_UNDEFINED) ins[i] = -1;
    int node = eng_graph_add_node(g, "n0", op, "", ins, nin, outs, nout);
    for (int a = 0; a < nattr; a++) {
        eng_attr at;
        memset(&at, 0, sizeof at);
        at.name = (char *)attrs[a].name;
        at.type = attrs[a].type;
        at.i = attrs[a].i;
        at.f = attrs[a].f;
        at.s = (char *)attrs[a].s;
        at.s_len = attrs[a].s ? strlen(attrs[a].s) : 0;
        at.ints = (int64_t *)attrs[a].ints;
        at.n = attrs[a].n;
        cr_assert_eq(eng_node_add_attr(g, node, &at), ENG_STATUS_OK);
    }
    const eng_op_def *def = eng_op_find("", op);
    cr_assert_not_null(def, "op %s not registered", op);
    memset(out, 0, sizeof *out * (size_t)nout);
    eng_op_ctx ctx = {g, &g->nodes[node], opset, in, nin, out, nout, NULL};
    eng_status st = def->prepare ? def->prepare(&ctx) : ENG_STATUS_OK;
    if (st == ENG_STATUS_OK) st = def->infer(&ctx);
    if (st == ENG_STATUS_OK) {
        for (int j = 0; j < nout; j++) out[j].data = calloc((size_t)(eng_tensor_numel(&out[j]) + 1), 8);
        const krn_kernel *k = krn_backend_find(krn_backend_cpu(), def->kernel);
        cr_assert_not_null(k, "kernel %s missing", def->kernel);
        krn_call call = {ctx.params, in, nin, out, nout, NULL, 2, 0};
        if (k->init) st = k->init(&call);
        if (st == ENG_STATUS_OK) st = k->exec(&call);
        if (k->free_state) k->free_state(call.state);
    }
    if (def->free_params) def->free_params(ctx.params);
    else free(ctx.params);
    eng_graph_free(&g);
    return st;
}

static void tr_free(eng_tensor *t, int n) {
    for (int i = 0; i < n; i++) free(t[i].data), t[i].data = NULL;
}

static void tr_expect_shape(const eng_tensor *t, int ndim, const int64_t *dims) {
    cr_assert_eq(t->ndim, ndim, "rank %d, expected %d", t->ndim, ndim);
    for (int i = 0; i < ndim; i++) cr_assert_eq(t->dims[i], dims[i], "dim %d is %lld, expected %lld", i, (long long)t->dims[i], (long long)dims[i]);
}

static void tr_expect_close(const eng_tensor *t, const double *ref, int64_t n, double rtol, double atol, const char *what) {
    cr_assert_eq(eng_tensor_numel(t), n, "%s: %lld elements, expected %lld", what, (long long)eng_tensor_numel(t), (long long)n);
    for (int64_t i = 0; i < n; i++) {
        double v = eng_tensor_get_f64(t, i);
        if (isnan(ref[i]) && isnan(v)) continue;
        if (isinf(ref[i]) && v == ref[i]) continue;
        cr_assert(fabs(v - ref[i]) <= atol + rtol * fabs(ref[i]), "%s: [%lld] = %.9g, expected %.9g", what, (long long)i, v, ref[i]);
    }
}

/* ---- reference reductions ---- */

static const char *const tr_reduce_names[] = {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                                              "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"};

static void tr_ref_reduce(int op, const eng_tensor *x, unsigned mask, double *ref, int64_t nout) {
    double *mx = calloc((size_t)nout + 1, sizeof *mx);
    int64_t *cnt = calloc((size_t)nout + 1, sizeof *cnt);
    for (int64_t o = 0; o < nout; o++) {
        ref[o] = op == 4 ? 1 : op == 2 ? -INFINITY : op == 3 ? INFINITY : 0;
        mx[o] = -INFINITY;
    }
    int64_t n = eng_tensor_numel(x);
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t i = 0; i < n; i++) {
            int64_t rem = i, o = 0, os = 1;
            for (int d = x->ndim - 1; d >= 0; d--) {
                int64_t id = rem % x->dims[d];
                rem /= x->dims[d];
                if (!(mask & (1u << d))) o += id * os, os *= x->dims[d];
            }
            double v = eng_tensor_get_f64(x, i);
            if (pass == 0) {
                if (v > mx[o]) mx[o] = v;
                cnt[o]++;
                switch (op) {
                case 0: case 1: case 7: ref[o] += v; break;
                case 2: if (v > ref[o]) ref[o] = v; break;
                case 3: if (v < ref[o]) ref[o] = v; break;
                case 4: ref[o] *= v; break;
                case 5: ref[o] += fabs(v); break;
                case 6: case 9: ref[o] += v * v; break;
                default: break;
                }
            } else if (op == 8) {
                ref[o] += exp(v - mx[o]);
            }
        }
    }
    for (int64_t o = 0; o < nout; o++) {
        if (op == 1) ref[o] /= (double)cnt[o];
        if (op == 6) ref[o] = sqrt(ref[o]);
        if (op == 7) ref[o] = log(ref[o]);
        if (op == 8) ref[o] = cnt[o] ? log(ref[o]) + mx[o] : -INFINITY;
    }
    free(mx);
    free(cnt);
}

/* All axis subsets of a few shapes, all ops, keepdims 0/1, negative axes, via the opset-18 axes input. */
Test(reduce, all_ops_all_axes) {
    static const int64_t shapes[][4] = {{3, 4, 5, 0}, {1, 7, 1, 3}, {2, 1, 33, 0}, {5, 130, 0, 0}, {17, 0, 0, 0}};
    static const int ranks[] = {3, 4, 3, 2, 1};
    for (size_t si = 0; si < sizeof ranks / sizeof ranks[0]; si++) {
        int rank = ranks[si];
        for (int op = 0; op < 10; op++) {
            eng_tensor x = tr_random(ENG_DTYPE_F32, rank, shapes[si], op == 4 ? 1.5 : 2.0);
            if (op == 7) /* log of sum: keep it positive */
                for (int64_t i = 0; i < eng_tensor_numel(&x); i++) ((float *)x.data)[i] = fabsf(((float *)x.data)[i]) + 0.1f;
            for (unsigned mask = 0; mask < (1u << rank); mask++) {
                for (int keep = 0; keep < 2; keep++) {
                    int64_t axes[4], na = 0;
                    for (int d = 0; d < rank; d++)
                        if (mask & (1u << d)) axes[na++] = (d % 2) ? d - rank : d; /* mix negative axes in */
                    int64_t adims[1] = {na};
                    eng_tensor in[2] = {x, tr_i64(1, adims, axes)};
                    tr_attr at[1] = {A_INT("keepdims", keep)};
                    eng_tensor out[1];
                    cr_assert_eq(tr_run(tr_reduce_names[op], 18, at, 1, in, na ? 2 : 1, out, 1), ENG_STATUS_OK, "%s: %s",
                                 tr_reduce_names[op], eng_last_error());
                    unsigned m = na ? mask : (1u << rank) - 1;
                    int64_t od[4];
                    int on = 0;
                    for (int d = 0; d < rank; d++)
                        if (!(m & (1u << d))) od[on++] = shapes[si][d];
                        else if (keep) od[on++] = 1;
                    tr_expect_shape(&out[0], on, od);
                    int64_t nout = eng_tensor_numel(&out[0]);
                    double *ref = malloc((size_t)nout * sizeof *ref);
                    tr_ref_reduce(op, &x, m, ref, nout);
                    char what[96];
                    snprintf(what, sizeof what, "%s shape#%zu mask %u keep %d", tr_reduce_names[op], si, mask, keep);
                    tr_expect_close(&out[0], ref, nout, 2e-5, 1e-5, what);
                    free(ref);
                    tr_free(out, 1);
                    free(in[1].data);
                }
            }
            free(x.data);
        }
    }
}

Test(reduce, opset_forms_and_noop) {
    int64_t dims[3] = {2, 3, 4}, ax[1] = {-1};
    eng_tensor x = tr_random(ENG_DTYPE_F32, 3, dims, 1.0), out[1];
    /* ReduceMean-13 with axes attribute */
    tr_attr at[2] = {A_INTS("axes", ax, 1), A_INT("keepdims", 0)};
    cr_assert_eq(tr_run("ReduceMean", 13, at, 2, &x, 1, out, 1), ENG_STATUS_OK, "%s", eng_last_error());
    int64_t od[2] = {2, 3};
    tr_expect_shape(&out[0], 2, od);
    double ref[24];
    tr_ref_reduce(1, &x, 4u, ref, 6);
    tr_expect_close(&out[0], ref, 6, 1e-6, 1e-6, "ReduceMean-13 axes attr");
    tr_free(out, 1);
    /* ReduceSum-13 without axes reduces everything to rank 0 */
    tr_attr k0[1] = {A_INT("keepdims", 0)};
    cr_assert_eq(tr_run("ReduceSum", 13, k0, 1, &x, 1, out, 1), ENG_STATUS_OK);
    cr_assert_eq(out[0].ndim, 0);
    tr_ref_reduce(0, &x, 7u, ref, 1);
    tr_expect_close(&out[0], ref, 1, 1e-5, 1e-5, "ReduceSum all");
    tr_free(out, 1);
    /* noop_with_empty_axes: ReduceL1 with empty axes input is |x| */
    int64_t z[1] = {0};
    eng_tensor in[2] = {x, tr_i64(1, z, NULL)};
    tr_attr noop[1] = {A_INT("noop_with_empty_axes", 1)};
    cr_assert_eq(tr_run("ReduceL1", 18, noop, 1, in, 2, out, 1), ENG_STATUS_OK, "%s", eng_last_error());
    tr_expect_shape(&out[0], 3, dims);
    for (int i = 0; i < 24; i++) ref[i] = fabs(((float *)x.data)[i]);
    tr_expect_close(&out[0], ref, 24, 0, 0, "ReduceL1 noop");
    tr_free(out, 1);
    /* axes input without data: NEEDS_DATA */
    int64_t one[1] = {1};
    eng_tensor ax_nodata = {ENG_DTYPE_I64, 1, {1}, NULL};
    eng_tensor in2[2] = {x, ax_nodata};
    cr_assert_eq(tr_run("ReduceMax", 18, NULL, 0, in2, 2, out, 1), ENG_STATUS_NEEDS_DATA);
    (void)one;
    /* out-of-range axis names the axis */
    int64_t bad[1] = {3};
    tr_attr atb[1] = {A_INTS("axes", bad, 1)};
    cr_assert_eq(tr_run("ReduceMax", 11, atb, 1, &x, 1, out, 1), ENG_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(eng_last_error(), "axes[0] = 3") != NULL, "%s", eng_last_error());
    free(x.data);
    free(in[1].data);
}

Test(reduce, empty_set_and_scalar) {
    int64_t dims[2] = {0, 3}, ax[1] = {0};
    eng_tensor x = tr_tensor(ENG_DTYPE_F32, 2, dims), out[1];
    eng_tensor in[2] = {x, tr_i64(1, (int64_t[]){1}, ax)};
    const double want[10] = {0, NAN, -INFINITY, INFINITY, 1, 0, 0, -INFINITY, -INFINITY, 0};
    for (int op = 0; op < 10; op++) {
        cr_assert_eq(tr_run(tr_reduce_names[op], 18, NULL, 0, in, 2, out, 1), ENG_STATUS_OK, "%s", eng_last_error());
        int64_t od[2] = {1, 3};
        tr_expect_shape(&out[0], 2, od);
        double ref[3] = {want[op], want[op], want[op]};
        tr_expect_close(&out[0], ref, 3, 0, 0, tr_reduce_names[op]);
        tr_free(out, 1);
    }
    free(x.data);
    free(in[1].data);
    /* rank-0 input */
    eng_tensor s = tr_tensor(ENG_DTYPE_F32, 0, NULL);
    ((float *)s.data)[0] = -2.5f;
    cr_assert_eq(tr_run("ReduceL2", 13, NULL, 0, &s, 1, out, 1), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(out[0].ndim, 0);
    double r = 2.5;
    tr_expect_close(&out[0], &r, 1, 0, 1e-7, "ReduceL2 scalar");
    tr_free(out, 1);
    free(s.data);
}

Test(reduce, int_and_double_dtypes) {
    int64_t dims[3] = {3, 5, 2};
    const eng_dtype dts[4] = {ENG_DTYPE_I32, ENG_DTYPE_I64, ENG_DTYPE_F64, ENG_DTYPE_F16};
    for (int di = 0; di < 4; di++) {
        eng_tensor x = tr_random(dts[di], 3, dims, 4.0), out[1];
        for (int op = 0; op < 10; op++) {
            if (op == 7 || op == 8 || (op == 6 && di == 3)) continue; /* log of negative ints; f16 sqrt rounding */
            int64_t ax[2] = {0, 2};
            eng_tensor in[2] = {x, tr_i64(1, (int64_t[]){2}, ax)};
            cr_assert_eq(tr_run(tr_reduce_names[op], 18, NULL, 0, in, 2, out, 1), ENG_STATUS_OK, "%s", eng_last_error());
            cr_assert_eq(out[0].dtype, dts[di]);
            double ref[5];
            tr_ref_reduce(op, &x, 5u, ref, 5);
            if (eng_dtype_is_int(dts[di]))
                for (int i = 0; i < 5; i++) ref[i] = trunc(ref[i]);
            tr_expect_close(&out[0], ref, 5, di == 3 ? 2e-3 : 1e-12, di == 3 ? 1e-2 : 1e-9, tr_reduce_names[op]);
            tr_free(out, 1);
            free(in[1].data);
        }
        free(x.data);
    }
}

/* ---- ArgMax / ArgMin / TopK / CumSum ---- */

Test(reduce, argmax_argmin) {
    int64_t dims[3] = {3, 4, 5};
    eng_tensor x = tr_random(ENG_DTYPE_F32, 3, dims, 3.0), out[1];
    for (int64_t i = 0; i < 60; i++) ((float *)x.data)[i] = floorf(((float *)x.data)[i]); /* plenty of ties */
    for (int is_min = 0; is_min < 2; is_min++)
        for (int axis = -3; axis < 3; axis++)
            for (int last = 0; last < 2; last++) {
                tr_attr at[3] = {A_INT("axis", axis), A_INT("keepdims", axis & 1), A_INT("select_last_index", last)};
                cr_assert_eq(tr_run(is_min ? "ArgMin" : "ArgMax", 13, at, 3, &x, 1, out, 1), ENG_STATUS_OK);
                int a = axis < 0 ? axis + 3 : axis;
                int64_t outer = 1, inner = 1, n = dims[a];
                for (int d = 0; d < a; d++) outer *= dims[d];
                for (int d = a + 1; d < 3; d++) inner *= dims[d];
                cr_assert_eq(out[0].ndim, (axis & 1) ? 3 : 2);
                cr_assert_eq(out[0].dtype, ENG_DTYPE_I64);
                const float *xf = x.data;
                for (int64_t o = 0; o < outer; o++)
                    for (int64_t j = 0; j < inner; j++) {
                        int64_t bi = 0;
                        for (int64_t i = 1; i < n; i++) {
                            float v = xf[(o * n + i) * inner + j], b = xf[(o * n + bi) * inner + j];
                            if (is_min ? (v < b || (last && v == b)) : (v > b || (last && v == b))) bi = i;
                        }
                        cr_assert_eq(((int64_t *)out[0].data)[o * inner + j], bi, "axis %d last %d min %d", axis, last, is_min);
                    }
                tr_free(out, 1);
            }
    free(x.data);
}

Test(reduce, topk) {
    int64_t dims[2] = {3, 7};
    float vals[21] = {1, 3, 3, 2, 5, 5, 0, -1, -1, -1, 4, 2, 9, 9, 0, 0, 0, 0, 0, 0, 1};
    eng_tensor x = tr_tensor(ENG_DTYPE_F32, 2, dims), out[2];
    memcpy(x.data, vals, sizeof vals);
    eng_tensor in[2] = {x, tr_i64(1, (int64_t[]){1}, (int64_t[]){3})};
    cr_assert_eq(tr_run("TopK", 11, NULL, 0, in, 2, out, 2), ENG_STATUS_OK, "%s", eng_last_error());
    int64_t want_i[9] = {4, 5, 1, 5, 6, 3, 6, 0, 1};
    double want_v[9] = {5, 5, 3, 9, 9, 4, 1, 0, 0};
    for (int i = 0; i < 9; i++) cr_assert_eq(((int64_t *)out[1].data)[i], want_i[i], "index %d", i);
    tr_expect_close(&out[0], want_v, 9, 0, 0, "TopK largest");
    tr_free(out, 2);
    /* smallest along axis 0, TopK-1 k attribute */
    tr_attr at[3] = {A_INT("k", 2), A_INT("axis", 0), A_INT("largest", 0)};
    cr_assert_eq(tr_run("TopK", 1, at, 3, &x, 1, out, 2), ENG_STATUS_OK, "%s", eng_last_error());
    int64_t od[2] = {2, 7};
    tr_expect_shape(&out[0], 2, od);
    int64_t wi[14] = {1, 1, 1, 2, 2, 2, 0, 2, 2, 2, 0, 1, 0, 2};
    for (int i = 0; i < 14; i++) cr_assert_eq(((int64_t *)out[1].data)[i], wi[i], "smallest index %d", i);
    tr_free(out, 2);
    free(x.data);
    free(in[1].data);
}

Test(reduce, cumsum) {
    int64_t dims[3] = {2, 3, 4};
    eng_tensor x = tr_random(ENG_DTYPE_F64, 3, dims, 5.0), out[1];
    for (int axis = -3; axis < 3; axis++)
        for (int ex = 0; ex < 2; ex++)
            for (int rev = 0; rev < 2; rev++) {
                eng_tensor in[2] = {x, tr_i64(0, NULL, (int64_t[]){axis})};
                tr_attr at[2] = {A_INT("exclusive", ex), A_INT("reverse", rev)};
                cr_assert_eq(tr_run("CumSum", 14, at, 2, in, 2, out, 1), ENG_STATUS_OK, "%s", eng_last_error());
                int a = axis < 0 ? axis + 3 : axis;
                int64_t outer = 1, inner = 1, n = dims[a];
                for (int d = 0; d < a; d++) outer *= dims[d];
                for (int d = a + 1; d < 3; d++) inner *= dims[d];
                double ref[24];
                const double *xd = x.data;
                for (int64_t o = 0; o < outer; o++)
                    for (int64_t j = 0; j < inner; j++)
                        for (int64_t i = 0; i < n; i++) {
                            double s = 0;
                            for (int64_t k = 0; k < n; k++) {
                                int inc = rev ? (ex ? k > i : k >= i) : (ex ? k < i : k <= i);
                                if (inc) s += xd[(o * n + k) * inner + j];
                            }
                            ref[(o * n + i) * inner + j] = s;
                        }
                tr_expect_close(&out[0], ref, 24, 1e-12, 1e-12, "CumSum");
                tr_free(out, 1);
                free(in[1].data);
            }
    free(x.data);
}

/* ---- softmax family ---- */

static void tr_ref_softmax(int kind, const double *x, double *y, int64_t outer, int64_t n, int64_t inner) {
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < inner; j++) {
            double m = -INFINITY, s = 0;
            int64_t am = 0;
            for (int64_t i = 0; i < n; i++) {
                double v = x[(o * n + i) * inner + j];
                if (v > m) m = v, am = i;
            }
            for (int64_t i = 0; i < n; i++) s += exp(x[(o * n + i) * inner + j] - m);
            for (int64_t i = 0; i < n; i++) {
                int64_t k = (o * n + i) * inner + j;
                y[k] = kind == 0 ? exp(x[k] - m) / s : kind == 1 ? x[k] - m - log(s) : (i == am);
            }
        }
}

Test(reduce, softmax_family) {
    static const char *ops[3] = {"Softmax", "LogSoftmax", "Hardmax"};
    static const int64_t shapes[][3] = {{64, 128, 1}, {33, 256, 1}, {3, 7, 5}, {2, 5, 129}};
    for (int si = 0; si < 4; si++) {
        const int64_t *dims = shapes[si];
        eng_tensor x = tr_random(ENG_DTYPE_F32, 3, dims, si == 1 ? 60.0 : 4.0), out[1];
        int64_t n = eng_tensor_numel(&x);
        double *xd = malloc((size_t)n * sizeof *xd), *ref = malloc((size_t)n * sizeof *ref);
        for (int64_t i = 0; i < n; i++) xd[i] = ((float *)x.data)[i];
        for (int kind = 0; kind < 3; kind++)
            for (int axis = -3; axis < 3; axis++)
                for (int old = 0; old < 2; old++) {
                    tr_attr at[1] = {A_INT("axis", axis)};
                    cr_assert_eq(tr_run(ops[kind], old ? 11 : 13, at, 1, &x, 1, out, 1), ENG_STATUS_OK, "%s", eng_last_error());
                    int a = axis < 0 ? axis + 3 : axis;
                    int64_t outer = 1, inner = 1, nn = dims[a];
                    for (int d = 0; d < a; d++) outer *= dims[d];
                    for (int d = a + 1; d < 3; d++) inner *= dims[d];
                    if (old) nn *= inner, inner = 1;
                    tr_ref_softmax(kind, xd, ref, outer, nn, inner);
                    char what[64];
                    snprintf(what, sizeof what, "%s shape#%d axis %d opset %d", ops[kind], si, axis, old ? 11 : 13);
                    tr_expect_close(&out[0], ref, n, 1e-5, si == 1 ? 2e-5 : 1e-6, what);
                    tr_free(out, 1);
                }
        free(xd);
        free(ref);
        free(x.data);
    }
}

/* ---- normalisations ---- */

Test(reduce, layernorm) {
    static const int64_t shapes[][3] = {{4, 16, 128}, {3, 5, 256}, {2, 3, 5}};
    for (int si = 0; si < 3; si++) {
        const int64_t *dims = shapes[si];
        for (int axis = -3; axis < 3; axis++) {
            int a = axis < 0 ? axis + 3 : axis;
            int64_t rows = 1, cols = 1;
            for (int d = 0; d < a; d++) rows *= dims[d];
            for (int d = a; d < 3; d++) cols *= dims[d];
            eng_tensor x = tr_random(ENG_DTYPE_F32, 3, dims, 3.0);
            eng_tensor sc = tr_random(ENG_DTYPE_F32, 3 - a, dims + a, 1.0);
            /* bias broadcast from the last dim only */
            eng_tensor b = tr_random(ENG_DTYPE_F32, 1, dims + 2, 1.0), out[3];
            eng_tensor in[3] = {x, sc, b};
            tr_attr at[2] = {A_INT("axis", axis), A_FLOAT("epsilon", 1e-3f)};
            cr_assert_eq(tr_run("LayerNormalization", 17, at, 2, in, 3, out, 3), ENG_STATUS_OK, "%s", eng_last_error());
            int64_t sd[3] = {dims[0], dims[1], dims[2]};
            for (int d = a; d < 3; d++) sd[d] = 1;
            tr_expect_shape(&out[1], 3, sd);
            double *ref = malloc((size_t)(rows * cols) * sizeof *ref), *mr = malloc((size_t)rows * 16);
            const float *xf = x.data, *sf = sc.data, *bf = b.data;
            for (int64_t r = 0; r < rows; r++) {
                double s = 0, q = 0;
                for (int64_t j = 0; j < cols; j++) s += xf[r * cols + j];
                double m = s / (double)cols;
                for (int64_t j = 0; j < cols; j++) q += (xf[r * cols + j] - m) * (xf[r * cols + j] - m);
                double inv = 1 / sqrt(q / (double)cols + 1e-3);
                for (int64_t j = 0; j < cols; j++) ref[r * cols + j] = (xf[r * cols + j] - m) * inv * sf[j] + bf[j % dims[2]];
                mr[r] = m, mr[rows + r] = inv;
            }
            tr_expect_close(&out[0], ref, rows * cols, 1e-4, 1e-5, "LayerNorm Y");
            tr_expect_close(&out[1], mr, rows, 1e-5, 1e-6, "LayerNorm Mean");
            tr_expect_close(&out[2], mr + rows, rows, 1e-5, 1e-6, "LayerNorm InvStdDev");
            free(ref), free(mr);
            tr_free(out, 3);
            tr_free(in, 3);
        }
    }
}

Test(reduce, batchnorm_inference_and_training) {
    int64_t dims[4] = {2, 3, 4, 5}, cd[1] = {3};
    eng_tensor x = tr_random(ENG_DTYPE_F32, 4, dims, 2.0), out[3];
    eng_tensor in[5] = {x, tr_random(ENG_DTYPE_F32, 1, cd, 1.0), tr_random(ENG_DTYPE_F32, 1, cd, 1.0),
                        tr_random(ENG_DTYPE_F32, 1, cd, 1.0), tr_random(ENG_DTYPE_F32, 1, cd, 1.0)};
    for (int i = 0; i < 3; i++) ((float *)in[4].data)[i] = fabsf(((float *)in[4].data)[i]) + 0.5f;
    const float *xf = x.data, *s = in[1].data, *b = in[2].data, *m = in[3].data, *v = in[4].data;
    double ref[120];
    for (int64_t i = 0; i < 120; i++) {
        int c = (int)((i / 20) % 3);
        ref[i] = (xf[i] - m[c]) / sqrt(v[c] + 1e-5) * s[c] + b[c];
    }
    cr_assert_eq(tr_run("BatchNormalization", 15, NULL, 0, in, 5, out, 1), ENG_STATUS_OK, "%s", eng_last_error());
    tr_expect_close(&out[0], ref, 120, 1e-5, 1e-5, "BatchNorm inference");
    tr_free(out, 1);
    tr_attr at[2] = {A_INT("training_mode", 1), A_FLOAT("momentum", 0.8f)};
    cr_assert_eq(tr_run("BatchNormalization", 15, at, 2, in, 5, out, 3), ENG_STATUS_OK, "%s", eng_last_error());
    double rm[3], rv[3];
    for (int c = 0; c < 3; c++) {
        double sm = 0, sq = 0;
        for (int64_t i = 0; i < 120; i++)
            if ((i / 20) % 3 == c) sm += xf[i];
        sm /= 40;
        for (int64_t i = 0; i < 120; i++)
            if ((i / 20) % 3 == c) sq += (xf[i] - sm) * (xf[i] - sm);
        sq /= 40;
        for (int64_t i = 0; i < 120; i++)
            if ((i / 20) % 3 == c) ref[i] = (xf[i] - sm) / sqrt(sq + 1e-5) * s[c] + b[c];
        rm[c] = m[c] * 0.8 + sm * 0.2;
        rv[c] = v[c] * 0.8 + sq * 0.2;
    }
    tr_expect_close(&out[0], ref, 120, 1e-5, 1e-5, "BatchNorm training Y");
    tr_expect_close(&out[1], rm, 3, 1e-5, 1e-6, "running mean");
    tr_expect_close(&out[2], rv, 3, 1e-5, 1e-6, "running var");
    tr_free(out, 3);
    tr_free(in, 5);
}

Test(reduce, instnorm_lrn_mvn) {
    int64_t dims[4] = {2, 5, 3, 3}, cd[1] = {5};
    eng_tensor x = tr_random(ENG_DTYPE_F32, 4, dims, 2.0), out[1];
    eng_tensor in[3] = {x, tr_random(ENG_DTYPE_F32, 1, cd, 1.0), tr_random(ENG_DTYPE_F32, 1, cd, 1.0)};
    const float *xf = x.data;
    double ref[90];
    cr_assert_eq(tr_run("InstanceNormalization", 6, NULL, 0, in, 3, out, 1), ENG_STATUS_OK, "%s", eng_last_error());
    for (int blk = 0; blk < 10; blk++) {
        double s = 0, q = 0;
        for (int i = 0; i < 9; i++) s += xf[blk * 9 + i];
        s /= 9;
        for (int i = 0; i < 9; i++) q += (xf[blk * 9 + i] - s) * (xf[blk * 9 + i] - s);
        q /= 9;
        for (int i = 0; i < 9; i++)
            ref[blk * 9 + i] = (xf[blk * 9 + i] - s) / sqrt(q + 1e-5) * ((float *)in[1].data)[blk % 5] + ((float *)in[2].data)[blk % 5];
    }
    tr_expect_close(&out[0], ref, 90, 1e-5, 1e-5, "InstanceNorm");
    tr_free(out, 1);
    tr_attr at[4] = {A_INT("size", 3), A_FLOAT("alpha", 0.01f), A_FLOAT("beta", 0.6f), A_FLOAT("bias", 2.0f)};
    cr_assert_eq(tr_run("LRN", 13, at, 4, &x, 1, out, 1), ENG_STATUS_OK, "%s", eng_last_error());
    for (int i = 0; i < 90; i++) {
        int b = i / 45, c = (i / 9) % 5, sp = i % 9;
        double s = 0;
        for (int j = c - 1; j <= c + 1; j++)
            if (j >= 0 && j < 5) s += (double)xf[(b * 5 + j) * 9 + sp] * xf[(b * 5 + j) * 9 + sp];
        ref[i] = xf[i] / pow(2.0 + 0.01 / 3 * s, 0.6);
    }
    tr_expect_close(&out[0], ref, 90, 1e-5, 1e-6, "LRN");
    tr_free(out, 1);
    cr_assert_eq(tr_run("MeanVarianceNormalization", 13, NULL, 0, &x, 1, out, 1), ENG_STATUS_OK, "%s", eng_last_error());
    for (int c = 0; c < 5; c++) {
        double s = 0, q = 0;
        for (int i = 0; i < 90; i++)
            if ((i / 9) % 5 == c) s += xf[i];
        s /= 18;
        for (int i = 0; i < 90; i++)
            if ((i / 9) % 5 == c) q += (xf[i] - s) * (xf[i] - s);
        q /= 18;
        for (int i = 0; i < 90; i++)
            if ((i / 9) % 5 == c) ref[i] = (xf[i] - s) / (sqrt(q) + 1e-9);
    }
    tr_expect_close(&out[0], ref, 90, 1e-5, 1e-6, "MVN");
    tr_free(out, 1);
    tr_free(in, 3);
}

/* ---- losses, einsum, det ---- */

Test(reduce, nll_and_sce) {
    int64_t xd[3] = {3, 4, 2}, td[2] = {3, 2}, wd[1] = {4};
    eng_tensor x = tr_random(ENG_DTYPE_F32, 3, xd, 2.0), w = tr_random(ENG_DTYPE_F32, 1, wd, 1.0), out[2];
    int64_t tv[6] = {0, 3, -1, 2, 1, -1};
    eng_tensor t = tr_i64(2, td, tv);
    const float *xf = x.data, *wf = w.data;
    for (int sce = 0; sce < 2; sce++) {
        double lp[24];
        for (int i = 0; i < 24; i++) lp[i] = xf[i];
        if (sce)
            for (int b = 0; b < 3; b++)
                for (int j = 0; j < 2; j++) {
                    double s = 0;
                    for (int c = 0; c < 4; c++) s += exp(xf[(b * 4 + c) * 2 + j]);
                    for (int c = 0; c < 4; c++) lp[(b * 4 + c) * 2 + j] = xf[(b * 4 + c) * 2 + j] - log(s);
                }
        double loss[6], lsum = 0, wsum = 0;
        for (int i = 0; i < 6; i++) {
            int b = i / 2, j = i % 2;
            if (tv[i] == -1) { loss[i] = 0; continue; }
            loss[i] = -lp[(b * 4 + tv[i]) * 2 + j] * wf[tv[i]];
            lsum += loss[i], wsum += wf[tv[i]];
        }
        const char *op = sce ? "SoftmaxCrossEntropyLoss" : "NegativeLogLikelihoodLoss";
        eng_tensor in[3] = {x, t, w};
        tr_attr none[2] = {A_STR("reduction", "none"), A_INT("ignore_index", -1)};
        cr_assert_eq(tr_run(op, 13, none, 2, in, 3, out, 1 + sce), ENG_STATUS_OK, "%s", eng_last_error());
        tr_expect_shape(&out[0], 2, td);
        tr_expect_close(&out[0], loss, 6, 1e-5, 1e-6, "loss none");
        if (sce) tr_expect_close(&out[1], lp, 24, 1e-5, 1e-6, "log_prob");
        tr_free(out, 1 + sce);
        tr_attr mean[1] = {A_INT("ignore_index", -1)};
        cr_assert_eq(tr_run(op, 13, mean, 1, in, 3, out, 1), ENG_STATUS_OK, "%s", eng_last_error());
        cr_assert_eq(out[0].ndim, 0);
        double m = lsum / wsum;
        tr_expect_close(&out[0], &m, 1, 1e-5, 1e-6, "loss mean");
        tr_free(out, 1);
        /* without ignore_index the -1 target is an error naming the position */
        cr_assert_eq(tr_run(op, 13, NULL, 0, in, 3, out, 1), ENG_STATUS_INVALID_ARGUMENT);
        cr_assert(strstr(eng_last_error(), "target[2]") != NULL, "%s", eng_last_error());
        tr_free(out, 1);
    }
    free(x.data), free(w.data), free(t.data);
}

Test(reduce, einsum) {
    int64_t ad[3] = {2, 3, 4}, bd[3] = {2, 4, 5}, sq[3] = {2, 3, 3};
    eng_tensor a = tr_random(ENG_DTYPE_F32, 3, ad, 1.0), b = tr_random(ENG_DTYPE_F32, 3, bd, 1.0), c = tr_random(ENG_DTYPE_F64, 3, sq, 1.0), out[1];
    const float *af = a.data, *bf = b.data;
    const double *cf = c.data;
    double ref[64];
    /* batch matmul with an ellipsis */
    eng_tensor in[2] = {a, b};
    tr_attr at[1] = {A_STR("equation", "...ij, ...jk -> ...ik")};
    cr_assert_eq(tr_run("Einsum", 12, at, 1, in, 2, out, 1), ENG_STATUS_OK, "%s", eng_last_error());
    int64_t od[3] = {2, 3, 5};
    tr_expect_shape(&out[0], 3, od);
    for (int n = 0; n < 2; n++)
        for (int i = 0; i < 3; i++)
            for (int k = 0; k < 5; k++) {
                double s = 0;
                for (int j = 0; j < 4; j++) s += (double)af[(n * 3 + i) * 4 + j] * bf[(n * 4 + j) * 5 + k];
                ref[(n * 3 + i) * 5 + k] = s;
            }
    tr_expect_close(&out[0], ref, 30, 1e-5, 1e-6, "einsum batch matmul");
    tr_free(out, 1);
    /* batch diagonal, implicit output (transpose of letters), sum of all */
    tr_attr diag[1] = {A_STR("equation", "bii->bi")};
    cr_assert_eq(tr_run("Einsum", 12, diag, 1, &c, 1, out, 1), ENG_STATUS_OK, "%s", eng_last_error());
    for (int n = 0; n < 2; n++)
        for (int i = 0; i < 3; i++) ref[n * 3 + i] = cf[(n * 3 + i) * 3 + i];
    tr_expect_close(&out[0], ref, 6, 0, 0, "einsum diagonal");
    tr_free(out, 1);
    tr_attr impl[1] = {A_STR("equation", "kji")};
    cr_assert_eq(tr_run("Einsum", 12, impl, 1, &a, 1, out, 1), ENG_STATUS_OK, "%s", eng_last_error());
    int64_t td[3] = {4, 3, 2};
    tr_expect_shape(&out[0], 3, td);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 2; k++) ref[(i * 3 + j) * 2 + k] = af[(k * 3 + j) * 4 + i];
    tr_expect_close(&out[0], ref, 24, 0, 0, "einsum implicit transpose");
    tr_free(out, 1);
    tr_attr sum[1] = {A_STR("equation", "ijk->")};
    cr_assert_eq(tr_run("Einsum", 12, sum, 1, &a, 1, out, 1), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(out[0].ndim, 0);
    ref[0] = 0;
    for (int i = 0; i < 24; i++) ref[0] += af[i];
    tr_expect_close(&out[0], ref, 1, 1e-5, 1e-6, "einsum sum");
    tr_free(out, 1);
    free(a.data), free(b.data), free(c.data);
}

Test(reduce, det) {
    int64_t dims[3] = {2, 3, 3};
    double m[18] = {2, -1, 0, -1, 2, -1, 0, -1, 2, /* det 4 */ 0, 1, 2, 1, 0, 3, 4, -3, 8 /* det -2 */};
    eng_tensor x = tr_tensor(ENG_DTYPE_F64, 3, dims), out[1];
    memcpy(x.data, m, sizeof m);
    cr_assert_eq(tr_run("Det", 11, NULL, 0, &x, 1, out, 1), ENG_STATUS_OK, "%s", eng_last_error());
    double ref[2] = {4, -2};
    tr_expect_close(&out[0], ref, 2, 1e-12, 1e-12, "Det");
    tr_free(out, 1);
    free(x.data);
}

/* Shapes above the OpenMP thresholds, so the threaded splits are checked too (the harness passes 2 threads). */
Test(reduce, parallel_paths) {
    int64_t dims[3] = {40, 50, 33};
    eng_tensor x = tr_random(ENG_DTYPE_F32, 3, dims, 2.0), out[3];
    for (unsigned mask = 1; mask < 8; mask++) {
        for (int op = 0; op < 10; op += 8) { /* ReduceSum and ReduceLogSumExp */
            int64_t axes[3], na = 0;
            for (int d = 0; d < 3; d++)
                if (mask & (1u << d)) axes[na++] = d;
            eng_tensor in[2] = {x, tr_i64(1, (int64_t[]){na}, axes)};
            cr_assert_eq(tr_run(tr_reduce_names[op], 18, NULL, 0, in, 2, out, 1), ENG_STATUS_OK, "%s", eng_last_error());
            int64_t nout = eng_tensor_numel(&out[0]);
            double *ref = malloc((size_t)nout * sizeof *ref);
            tr_ref_reduce(op, &x, mask, ref, nout);
            tr_expect_close(&out[0], ref, nout, 1e-4, 1e-4, tr_reduce_names[op]);
            free(ref);
            tr_free(out, 1);
            free(in[1].data);
        }
    }
    free(x.data);
    int64_t sd[2] = {300, 128};
    eng_tensor s = tr_random(ENG_DTYPE_F32, 2, sd, 5.0);
    double *xd = malloc(300 * 128 * sizeof *xd), *ref = malloc(300 * 128 * sizeof *ref);
    for (int i = 0; i < 300 * 128; i++) xd[i] = ((float *)s.data)[i];
    cr_assert_eq(tr_run("Softmax", 13, NULL, 0, &s, 1, out, 1), ENG_STATUS_OK);
    tr_ref_softmax(0, xd, ref, 300, 128, 1);
    tr_expect_close(&out[0], ref, 300 * 128, 1e-5, 1e-7, "parallel softmax");
    tr_free(out, 1);
    cr_assert_eq(tr_run("ArgMax", 13, (tr_attr[]){A_INT("axis", 0)}, 1, &s, 1, out, 1), ENG_STATUS_OK);
    for (int j = 0; j < 128; j++) {
        int64_t bi = 0;
        for (int i = 1; i < 300; i++)
            if (xd[i * 128 + j] > xd[bi * 128 + j]) bi = i;
        cr_assert_eq(((int64_t *)out[0].data)[j], bi);
    }
    tr_free(out, 1);
    free(xd), free(ref), free(s.data);
}
