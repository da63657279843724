/* test_einsum.c - Einsum's GEMM fast path (kernels/cpu/reduce-einsum.c) against its index loops.
 *
 * Each case runs the real op (prepare, infer, kernel init/exec/free) twice on the same random float32
 * operands: once as planned (the test asserts init chose the GEMM path where it must) and once with
 * TENSORD_EINSUM_REF=1 (the double-accumulating index loops), and requires agreement within 1e-5 relative to
 * the largest output magnitude. Shapes are drawn at random per repetition; the equations are the ones exporters
 * write (batched matmuls, attention, linear layers, ellipses with broadcasting), transposed and permuted
 * outputs, summed letters, outer/inner products, and forms that must stay on the loops (diagonals, 3 operands).
 * One case goes through a whole plan with a constant (initializer) operand, so the pack-once path runs.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/ir/graph.h"
#include "engine/ops/op.h"
#include "engine/plan/plan.h"
#include "kernels/kernel.h"

static uint64_t te_rng = 0x9e3779b97f4a7c15ull;
static uint64_t te_next(void) {
    te_rng ^= te_rng << 13, te_rng ^= te_rng >> 7, te_rng ^= te_rng << 17;
    return te_rng;
}
static int64_t te_int(int64_t lo, int64_t hi) { return lo + (int64_t)(te_next() % (uint64_t)(hi - lo + 1)); }
static float te_float(void) { return (float)((double)(te_next() >> 11) / (double)(1ull << 52) - 1.0); }

static eng_tensor te_random(int ndim, const int64_t *dims) {
    eng_tensor t = {ENG_DTYPE_F32, ndim, {0}, NULL};
    for (int i = 0; i < ndim; i++) t.dims[i] = dims[i];
    int64_t n = eng_tensor_numel(&t);
    t.data = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    for (int64_t i = 0; i < n; i++) ((float *)t.data)[i] = te_float();
    return t;
}

/* Run Einsum(eq) on in[0..nin-1]; out gets calloc'd data. *fast = 1 if init left a state (the GEMM path). */
static void te_run(const char *eq, eng_tensor *in, int nin, eng_tensor *out, int *fast) {
    eng_graph *g = eng_graph_new();
    int ins[8], outv;
    char name[16];
    for (int i = 0; i < nin; i++) snprintf(name, sizeof name, "in%d", i), ins[i] = eng_graph_add_value(g, name);
    outv = eng_graph_add_value(g, "out");
    int node = eng_graph_add_node(g, "e", "Einsum", "", ins, nin, &outv, 1);
    eng_attr at = {.name = "equation", .type = ENG_ATTR_STRING, .s = (char *)eq, .s_len = strlen(eq)};
    cr_assert_eq(eng_node_add_attr(g, node, &at), ENG_STATUS_OK);
    const eng_op_def *def = eng_op_find("", "Einsum");
    cr_assert_not_null(def);
    memset(out, 0, sizeof *out);
    eng_op_ctx ctx = {g, &g->nodes[node], 12, in, nin, out, 1, NULL};
    cr_assert_eq(def->prepare(&ctx), ENG_STATUS_OK, "%s: %s", eq, eng_last_error());
    cr_assert_eq(def->infer(&ctx), ENG_STATUS_OK, "%s: %s", eq, eng_last_error());
    out->data = calloc((size_t)(eng_tensor_numel(out) + 1), 8); /* room for float64 */
    const krn_kernel *k = krn_backend_find(krn_backend_cpu(), def->kernel);
    cr_assert_not_null(k);
    krn_call call = {ctx.params, in, nin, out, 1, NULL, 2, 0};
    cr_assert_eq(k->init(&call), ENG_STATUS_OK, "%s: %s", eq, eng_last_error());
    *fast = call.state != NULL;
    cr_assert_eq(k->exec(&call), ENG_STATUS_OK, "%s: %s", eq, eng_last_error());
    k->free_state(call.state);
    free(ctx.params);
    eng_graph_free(&g);
}

static void te_expect_close(const float *got, const float *want, int64_t n, const char *what) {
    double scale = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    for (int64_t i = 0; i < n; i++)
        cr_assert(fabs((double)got[i] - want[i]) <= 1e-5 * (fabs(want[i]) + scale) + 1e-30,
                  "%s: [%lld] fast %.9g, loops %.9g (scale %g)", what, (long long)i, got[i], want[i], scale);
}

/* Both paths on the same operands; want_fast: 1 the GEMM path must be taken, 0 it must not, -1 either. */
static void te_compare(const char *eq, eng_tensor *in, int nin, int want_fast) {
    eng_tensor fast_out, ref_out;
    int fast, ref_fast;
    unsetenv("TENSORD_EINSUM_REF");
    te_run(eq, in, nin, &fast_out, &fast);
    setenv("TENSORD_EINSUM_REF", "1", 1);
    te_run(eq, in, nin, &ref_out, &ref_fast);
    unsetenv("TENSORD_EINSUM_REF");
    char what[160];
    snprintf(what, sizeof what, "%s (%lld elements)", eq, (long long)eng_tensor_numel(&ref_out));
    cr_assert_eq(ref_fast, 0, "%s: TENSORD_EINSUM_REF did not force the loops", what);
    if (want_fast >= 0) cr_assert_eq(fast, want_fast, "%s: fast path %s", what, fast ? "taken" : "not taken");
    cr_assert_eq(fast_out.ndim, ref_out.ndim);
    for (int i = 0; i < ref_out.ndim; i++) cr_assert_eq(fast_out.dims[i], ref_out.dims[i]);
    te_expect_close(fast_out.data, ref_out.data, eng_tensor_numel(&ref_out), what);
    free(fast_out.data), free(ref_out.data);
}

/* Random sizes for letters a..z (index = letter - 'a') in [lo, hi]. */
static void te_sizes(int64_t *sz, int64_t lo, int64_t hi) {
    for (int i = 0; i < 26; i++) sz[i] = te_int(lo, hi);
}

/* Operand for the subscripts `sub` (letters only) with letter sizes sz. */
static eng_tensor te_operand(const char *sub, const int64_t *sz) {
    int64_t d[ENG_MAX_DIMS];
    int n = 0;
    for (const char *q = sub; *q; q++) d[n++] = sz[*q - 'a'];
    return te_random(n, d);
}

/* Two-operand equation "x,y->z" (letters only) with random sizes, repeated reps times. */
static void te_case2(const char *eq, int64_t lo, int64_t hi, int reps, int want_fast) {
    char a[16], b[16];
    const char *comma = strchr(eq, ','), *arrow = strstr(eq, "->");
    snprintf(a, sizeof a, "%.*s", (int)(comma - eq), eq);
    snprintf(b, sizeof b, "%.*s", (int)((arrow ? arrow : eq + strlen(eq)) - comma - 1), comma + 1);
    for (int r = 0; r < reps; r++) {
        int64_t sz[26];
        te_sizes(sz, lo, hi);
        eng_tensor in[2] = {te_operand(a, sz), te_operand(b, sz)};
        te_compare(eq, in, 2, want_fast);
        free(in[0].data), free(in[1].data);
    }
}

Test(einsum, exporter_forms) {
    te_case2("bij,bjk->bik", 1, 24, 4, 1);
    te_case2("bhqd,bhkd->bhqk", 1, 12, 4, 1);
    te_case2("bhqk,bhkd->bhqd", 1, 12, 4, 1);
    te_case2("ij,jk->ik", 1, 60, 4, 1);
    te_case2("bnd,dh->bnh", 1, 24, 4, 1);
    te_case2("ij,jk", 1, 30, 2, 1); /* implicit output: ik */
}

Test(einsum, transposed_and_permuted) {
    te_case2("bij,bjk->bki", 2, 20, 4, 1); /* operands swap roles */
    te_case2("bij,bjk->kbi", 2, 20, 3, 1); /* scratch result + permute */
    te_case2("ji,jk->ik", 2, 30, 3, 1);
    te_case2("ij,kj->ik", 2, 30, 3, 1);
    te_case2("ji,kj->ki", 2, 30, 3, 1);
    te_case2("bqd,kbd->bqk", 2, 16, 3, 1); /* right operand packed */
    te_case2("ibj,bjk->bik", 2, 16, 3, 1); /* left operand packed */
    te_case2("nd,hdk->nhk", 2, 12, 3, 1);
    te_case2("abcd,dbe->aceb", 2, 7, 3, 1);
}

Test(einsum, degenerate_and_summed) {
    te_case2("i,j->ij", 1, 40, 3, 1);  /* outer product: no K */
    te_case2("i,i->", 1, 100, 3, 1);   /* dot product: no batch, M or N */
    te_case2("ij,ij->ij", 1, 40, 3, 1); /* batch only: many 1x1x1 GEMMs */
    te_case2("ij,ij->i", 1, 40, 3, 1);
    te_case2("bij,bjk->bi", 1, 12, 3, 1);  /* k only in the right operand: summed while packing */
    te_case2("ijx,jk->ik", 1, 12, 3, 1);   /* x only in the left operand */
    te_case2("bij,bjk->bik", 1, 1, 1, 1); /* every size 1 */
}

Test(einsum, large_serial_gemm) {
    int64_t ad[3] = {2, 96, 80}, bd[3] = {2, 80, 70}; /* M*N*K > 262144: OpenBLAS threads inside, batch serial */
    eng_tensor in[2] = {te_random(3, ad), te_random(3, bd)};
    te_compare("bij,bjk->bik", in, 2, 1);
    te_compare("bij,bjk->bki", in, 2, 1);
    free(in[0].data), free(in[1].data);
}

Test(einsum, ellipsis_and_broadcast) {
    int64_t ad[4] = {2, 3, 4, 5}, bd[4] = {2, 3, 5, 6}, b2[2] = {5, 6}, b3[3] = {3, 5, 6}, b1[4] = {2, 1, 5, 6};
    eng_tensor a = te_random(4, ad), bs[4] = {te_random(4, bd), te_random(2, b2), te_random(3, b3), te_random(4, b1)};
    for (int i = 0; i < 4; i++) {
        eng_tensor in[2] = {a, bs[i]};
        te_compare("...ij,...jk->...ik", in, 2, 1);
        free(bs[i].data);
    }
    free(a.data);
}

Test(einsum, loops_only) {
    int64_t sq[2] = {5, 5}, m[2] = {5, 4}, v[1] = {5};
    eng_tensor d = te_random(2, sq), x = te_random(2, m), w = te_random(1, v);
    eng_tensor in2[2] = {d, x};
    te_compare("ii,ij->ij", in2, 2, 0); /* diagonal */
    eng_tensor in3[3] = {w, d, x};
    te_compare("i,ij,jk->k", in3, 3, 0); /* three operands */
    free(d.data), free(x.data), free(w.data);
    /* float64 stays on the loops */
    eng_tensor a = {ENG_DTYPE_F64, 2, {3, 4}, calloc(12, 8)}, b = {ENG_DTYPE_F64, 2, {4, 2}, calloc(8, 8)};
    for (int i = 0; i < 12; i++) ((double *)a.data)[i] = i * 0.5 - 2;
    for (int i = 0; i < 8; i++) ((double *)b.data)[i] = 1.5 - i;
    eng_tensor in[2] = {a, b}, out;
    int fast;
    te_run("ij,jk->ik", in, 2, &out, &fast);
    cr_assert_eq(fast, 0, "float64 took the float32 GEMM path");
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 2; k++) {
            double s = 0;
            for (int j = 0; j < 4; j++) s += ((double *)a.data)[i * 4 + j] * ((double *)b.data)[j * 2 + k];
            cr_assert_float_eq(((double *)out.data)[i * 2 + k], s, 1e-12);
        }
    free(out.data), free(a.data), free(b.data);
}

/* Through a plan with the right operand an initializer (packed once in init, reused by every run). */
static void te_plan_run(const char *eq, const eng_tensor *x, const eng_tensor *w, float *out, int64_t n) {
    eng_graph *g = eng_graph_new();
    g->opset = 13;
    int xv = eng_graph_add_value(g, "x"), wv = eng_graph_add_value(g, "w"), yv = eng_graph_add_value(g, "y");
    g->values[xv].dtype = ENG_DTYPE_F32;
    g->values[xv].ndim = x->ndim;
    memcpy(g->values[xv].dims, x->dims, sizeof x->dims);
    eng_tensor *wt = calloc(1, sizeof *wt);
    *wt = *w;
    size_t nb = (size_t)eng_tensor_numel(w) * sizeof(float);
    wt->data = eng_alloc(nb);
    memcpy(wt->data, w->data, nb);
    eng_value_set_init(g, wv, wt);
    g->values[yv].ndim = -1;
    g->inputs = malloc(sizeof(int));
    g->inputs[0] = xv, g->ninputs = 1;
    g->outputs = malloc(sizeof(int));
    g->outputs[0] = yv, g->noutputs = 1;
    int ins[2] = {xv, wv};
    int node = eng_graph_add_node(g, "e", "Einsum", "", ins, 2, &yv, 1);
    eng_attr at = {.name = "equation", .type = ENG_ATTR_STRING, .s = (char *)eq, .s_len = strlen(eq)};
    cr_assert_eq(eng_node_add_attr(g, node, &at), ENG_STATUS_OK);
    eng_plan_opts o = {.nthreads = 2};
    eng_plan *p = NULL;
    eng_tensor in = *x;
    cr_assert_eq(eng_plan_new(g, &o, &in, &p), ENG_STATUS_OK, "plan: %s", eng_last_error());
    for (int run = 0; run < 2; run++) { /* a second run must find the packed constant intact */
        eng_tensor outs[1];
        cr_assert_eq(eng_plan_run(p, &in, outs), ENG_STATUS_OK, "run: %s", eng_last_error());
        cr_assert_eq(eng_tensor_numel(&outs[0]), n);
        memcpy(out, outs[0].data, (size_t)n * sizeof(float));
    }
    eng_plan_free(&p);
    eng_graph_free(&g);
}

Test(einsum, plan_with_constant_operand) {
    const char *eqs[2] = {"bnd,dh->bnh", "nd,hdk->nhk"};
    int64_t xd[2][3] = {{2, 7, 16}, {9, 16}}, wd[2][3] = {{16, 12}, {5, 16, 3}}, n[2] = {2 * 7 * 12, 9 * 5 * 3};
    int xr[2] = {3, 2}, wr[2] = {2, 3};
    for (int i = 0; i < 2; i++) {
        eng_tensor x = te_random(xr[i], xd[i]), w = te_random(wr[i], wd[i]);
        float *fast = malloc((size_t)n[i] * sizeof(float)), *ref = malloc((size_t)n[i] * sizeof(float));
        unsetenv("TENSORD_EINSUM_REF");
        te_plan_run(eqs[i], &x, &w, fast, n[i]);
        setenv("TENSORD_EINSUM_REF", "1", 1);
        te_plan_run(eqs[i], &x, &w, ref, n[i]);
        unsetenv("TENSORD_EINSUM_REF");
        te_expect_close(fast, ref, n[i], eqs[i]);
        free(fast), free(ref), free(x.data), free(w.data);
    }
}
