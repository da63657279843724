/* test_deconv.c - ConvTranspose's oneDNN path (kernels/cpu/nn-deconv.c) against its reference loops.
 *
 * Each case runs the real op (prepare and infer from engine/ops/nn.c, so output_padding / output_shape /
 * auto_pad are resolved as in a plan, then the kernel's init/exec/free) on random float32 data three ways:
 * oneDNN with W constant (packed once in init), oneDNN with W a per-run input, and the reference loops
 * (TENSORD_CONV_REF=1); the same data in float64 (reference loops, double) is the yardstick. The test asserts
 * oneDNN was used where it must be, and that every float32 result is within 1e-5 of the float64 one, relative to
 * max(|y|, max |Y|). Cases: 1-D/2-D/3-D, stride 2 with output_padding 1, symmetric and asymmetric pads,
 * dilation 2, group 2, depthwise (group = C), no bias, auto_pad SAME_UPPER, and output_shape (one larger than
 * the natural size, which oneDNN cannot express: the loops must run).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/ir/graph.h"
#include "engine/ops/op.h"
#include "kernels/kernel.h"

typedef struct dc_case {
    const char *name;
    int nsp;
    int64_t n, c, m, group;
    int64_t in[3], k[3];
    int64_t s, d, op;
    int64_t pads[6]; /* begin..., end... */
    int bias;
    const char *auto_pad;       /* NULL: explicit pads */
    int64_t out_shape[3];       /* [0] == 0: none */
    int want_dnnl;              /* 1: oneDNN must run (float32) */
} dc_case;

static uint64_t dc_rng = 0x2545f4914f6cdd1dull;
static double dc_rand(void) {
    dc_rng ^= dc_rng << 13, dc_rng ^= dc_rng >> 7, dc_rng ^= dc_rng << 17;
    return (double)(dc_rng >> 11) / (double)(1ull << 52) - 1.0;
}

static eng_tensor dc_tensor(eng_dtype dt, int ndim, const int64_t *dims, const double *vals) {
    eng_tensor t = {dt, ndim, {0}, NULL};
    for (int i = 0; i < ndim; i++) t.dims[i] = dims[i];
    int64_t n = eng_tensor_numel(&t);
    t.data = calloc((size_t)(n > 0 ? n : 1), 8);
    for (int64_t i = 0; vals && i < n; i++) eng_tensor_set_f64(&t, i, vals[i]);
    return t;
}

static void dc_attr_ints(eng_graph *g, int node, const char *name, const int64_t *v, int n) {
    eng_attr a = {.name = (char *)name, .type = ENG_ATTR_INTS, .ints = (int64_t *)v, .n = n};
    cr_assert_eq(eng_node_add_attr(g, node, &a), ENG_STATUS_OK);
}

/* Run ConvTranspose for case k on in[0..nin-1]; *out gets calloc'd data. *dnnl = 1 if init kept a primitive. */
static void dc_run(const dc_case *k, eng_tensor *in, int nin, unsigned const_mask, eng_tensor *out, int *dnnl) {
    eng_graph *g = eng_graph_new();
    int ins[3], outv;
    char name[16];
    for (int i = 0; i < nin; i++) snprintf(name, sizeof name, "in%d", i), ins[i] = eng_graph_add_value(g, name);
    outv = eng_graph_add_value(g, "y");
    int node = eng_graph_add_node(g, "ct", "ConvTranspose", "", ins, nin, &outv, 1);
    int nsp = k->nsp;
    int64_t st[3], dl[3], op[3];
    for (int i = 0; i < nsp; i++) st[i] = k->s, dl[i] = k->d, op[i] = k->op;
    dc_attr_ints(g, node, "strides", st, nsp);
    dc_attr_ints(g, node, "dilations", dl, nsp);
    dc_attr_ints(g, node, "output_padding", op, nsp);
    if (k->auto_pad) {
        eng_attr a = {.name = "auto_pad", .type = ENG_ATTR_STRING, .s = (char *)k->auto_pad, .s_len = strlen(k->auto_pad)};
        cr_assert_eq(eng_node_add_attr(g, node, &a), ENG_STATUS_OK);
    } else {
        int64_t pd[6];
        for (int i = 0; i < nsp; i++) pd[i] = k->pads[i], pd[nsp + i] = k->pads[3 + i];
        dc_attr_ints(g, node, "pads", pd, 2 * nsp);
    }
    if (k->out_shape[0]) dc_attr_ints(g, node, "output_shape", k->out_shape, nsp);
    eng_attr ga = {.name = "group", .type = ENG_ATTR_INT, .i = k->group};
    cr_assert_eq(eng_node_add_attr(g, node, &ga), ENG_STATUS_OK);
    const eng_op_def *def = eng_op_find("", "ConvTranspose");
    cr_assert_not_null(def);
    memset(out, 0, sizeof *out);
    eng_op_ctx ctx = {g, &g->nodes[node], 17, in, nin, out, 1, NULL};
    cr_assert_eq(def->prepare(&ctx), ENG_STATUS_OK, "%s: %s", k->name, eng_last_error());
    cr_assert_eq(def->infer(&ctx), ENG_STATUS_OK, "%s: %s", k->name, eng_last_error());
    out->data = calloc((size_t)(eng_tensor_numel(out) + 1), 8);
    const krn_kernel *kr = krn_backend_find(krn_backend_cpu(), def->kernel);
    cr_assert_not_null(kr);
    krn_call call = {ctx.params, in, nin, out, 1, NULL, 2, const_mask};
    cr_assert_eq(kr->init(&call), ENG_STATUS_OK, "%s: %s", k->name, eng_last_error());
    *dnnl = call.state != NULL;
    cr_assert_eq(kr->exec(&call), ENG_STATUS_OK, "%s: %s", k->name, eng_last_error());
    kr->free_state(call.state);
    free(ctx.params);
    eng_graph_free(&g);
}

static void dc_expect_close(const eng_tensor *got, const eng_tensor *want, const char *what) {
    int64_t n = eng_tensor_numel(want);
    cr_assert_eq(got->ndim, want->ndim, "%s: rank", what);
    for (int i = 0; i < want->ndim; i++) cr_assert_eq(got->dims[i], want->dims[i], "%s: dim %d", what, i);
    double scale = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(eng_tensor_get_f64(want, i)));
    for (int64_t i = 0; i < n; i++) {
        double g = eng_tensor_get_f64(got, i), w = eng_tensor_get_f64(want, i);
        cr_assert(fabs(g - w) <= 1e-5 * (fabs(w) + scale), "%s: [%lld] %.9g, expected %.9g (scale %g)", what,
                  (long long)i, g, w, scale);
    }
}

static void dc_check(const dc_case *k) {
    int nsp = k->nsp, nd = nsp + 2;
    int64_t xd[5] = {k->n, k->c}, wd[5] = {k->c, k->m / k->group}, bd[1] = {k->m};
    for (int i = 0; i < nsp; i++) xd[2 + i] = k->in[i], wd[2 + i] = k->k[i];
    int64_t nx = 1, nw = 1;
    for (int i = 0; i < nd; i++) nx *= xd[i], nw *= wd[i];
    double *xv = malloc((size_t)nx * sizeof *xv), *wv = malloc((size_t)nw * sizeof *wv), bv[512];
    for (int64_t i = 0; i < nx; i++) xv[i] = dc_rand();
    for (int64_t i = 0; i < nw; i++) wv[i] = dc_rand();
    for (int64_t i = 0; i < k->m; i++) bv[i] = dc_rand();
    int nin = k->bias ? 3 : 2;
    eng_tensor in32[3] = {dc_tensor(ENG_DTYPE_F32, nd, xd, xv), dc_tensor(ENG_DTYPE_F32, nd, wd, wv),
                          dc_tensor(ENG_DTYPE_F32, 1, bd, bv)};
    eng_tensor in64[3] = {dc_tensor(ENG_DTYPE_F64, nd, xd, xv), dc_tensor(ENG_DTYPE_F64, nd, wd, wv),
                          dc_tensor(ENG_DTYPE_F64, 1, bd, bv)};
    eng_tensor y64, yconst, yvar, yref;
    int d64, dconst, dvar, dref;
    char what[160];
    unsetenv("TENSORD_CONV_REF");
    dc_run(k, in64, nin, 0x6, &y64, &d64);
    dc_run(k, in32, nin, 0x6, &yconst, &dconst);
    dc_run(k, in32, nin, 0x0, &yvar, &dvar);
    setenv("TENSORD_CONV_REF", "1", 1);
    dc_run(k, in32, nin, 0x6, &yref, &dref);
    unsetenv("TENSORD_CONV_REF");
    cr_assert_eq(d64, 0, "%s: float64 must run the reference loops", k->name);
    cr_assert_eq(dref, 0, "%s: TENSORD_CONV_REF did not force the reference loops", k->name);
    if (k->want_dnnl >= 0) {
        cr_assert_eq(dconst, k->want_dnnl, "%s: oneDNN (constant W) %s", k->name, dconst ? "used" : "not used");
        cr_assert_eq(dvar, k->want_dnnl, "%s: oneDNN (W an input) %s", k->name, dvar ? "used" : "not used");
    }
    snprintf(what, sizeof what, "%s oneDNN, constant W", k->name);
    dc_expect_close(&yconst, &y64, what);
    snprintf(what, sizeof what, "%s oneDNN, W an input", k->name);
    dc_expect_close(&yvar, &y64, what);
    snprintf(what, sizeof what, "%s reference loops", k->name);
    dc_expect_close(&yref, &y64, what);
    for (int i = 0; i < 3; i++) free(in32[i].data), free(in64[i].data);
    free(y64.data), free(yconst.data), free(yvar.data), free(yref.data);
    free(xv), free(wv);
}

static const dc_case dc_cases[] = {
    /* name          nsp n  c   m  grp  in           k          s  d  op  pads                bias */
    {"1d",            1, 2, 5,  7, 1, {11},        {3},        1, 1, 0, {0},                1, NULL, {0}, 1},
    {"1d_s2_op1",     1, 1, 4,  6, 1, {9},         {4},        2, 1, 1, {1, 0, 0, 2},       1, NULL, {0}, 1},
    {"2d",            2, 1, 8,  4, 1, {6, 5},      {3, 3},     1, 1, 0, {1, 1, 0, 1, 1},    1, NULL, {0}, 1},
    {"2d_s2_op1",     2, 2, 6,  5, 1, {7, 6},      {3, 3},     2, 1, 1, {1, 1, 0, 1, 1},    1, NULL, {0}, 1},
    {"2d_k4_s2_p1",   2, 1, 16, 8, 1, {8, 8},      {4, 4},     2, 1, 0, {1, 1, 0, 1, 1},    1, NULL, {0}, 1},
    {"2d_asym_pads",  2, 1, 3,  4, 1, {5, 7},      {3, 2},     2, 1, 0, {0, 2, 0, 1, 0},    1, NULL, {0}, 1},
    {"2d_dil2",       2, 1, 4,  3, 1, {6, 6},      {3, 3},     1, 2, 0, {2, 1, 0, 2, 1},    1, NULL, {0}, 1},
    {"2d_s2_dil2",    2, 1, 4,  6, 1, {5, 5},      {3, 3},     2, 2, 1, {1, 1, 0, 1, 1},    1, NULL, {0}, 1},
    {"2d_group2",     2, 2, 6,  8, 2, {5, 6},      {3, 3},     2, 1, 1, {1, 1, 0, 1, 1},    1, NULL, {0}, 1},
    {"2d_depthwise",  2, 1, 16, 16, 16, {9, 9},    {4, 4},     2, 1, 0, {1, 1, 0, 1, 1},    1, NULL, {0}, 1},
    {"2d_dw_mult2",   2, 1, 8,  16, 8, {6, 6},     {3, 3},     2, 1, 1, {1, 1, 0, 1, 1},    1, NULL, {0}, 1},
    {"2d_no_bias",    2, 2, 5,  3, 1, {6, 4},      {3, 3},     2, 1, 1, {1, 1, 0, 1, 1},    0, NULL, {0}, 1},
    {"2d_same_upper", 2, 1, 4,  4, 1, {5, 5},      {3, 3},     2, 1, 0, {0},                1, "SAME_UPPER", {0}, 1},
    {"2d_out_shape",  2, 1, 3,  2, 1, {4, 4},      {3, 3},     2, 1, 0, {0},                1, NULL, {8, 9}, 1},
    {"2d_out_bigger", 2, 1, 3,  2, 1, {3, 3},      {3, 3},     2, 1, 0, {0},                1, NULL, {9, 10}, 0},
    {"3d",            3, 1, 4,  3, 1, {4, 5, 3},   {3, 3, 2},  1, 1, 0, {1, 0, 0, 1, 1, 0}, 1, NULL, {0}, 1},
    {"3d_s2_op1",     3, 1, 3,  4, 1, {3, 4, 4},   {3, 3, 3},  2, 1, 1, {1, 1, 1, 1, 1, 1}, 1, NULL, {0}, 1},
    {"3d_group2_dil", 3, 1, 4,  6, 2, {4, 3, 4},   {2, 2, 2},  1, 2, 0, {0, 1, 0, 1, 0, 1}, 0, NULL, {0}, 1},
};

Test(deconv, onednn_vs_reference) {
    for (size_t i = 0; i < sizeof dc_cases / sizeof dc_cases[0]; i++) dc_check(&dc_cases[i]);
}

/* A bigger 2-D case with threads: the exporter shape of a decoder upsampling (k4 s2 p1). */
Test(deconv, decoder_shape) {
    dc_case k = {"decoder", 2, 2, 32, 16, 1, {16, 16}, {4, 4}, 2, 1, 0, {1, 1, 0, 1, 1}, 1, NULL, {0}, 1};
    dc_check(&k);
}
