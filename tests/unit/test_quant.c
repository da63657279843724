/* test_quant.c - the quant op family (engine/ops/quant.c, kernels/cpu/quant.c) on hand-computed cases.
 *
 * Each case builds a one-node graph (the data input a graph input, scales and zero points initializers), plans and
 * runs it on the CPU backend and compares bytes with values worked out by hand in the comments: rounding ties to
 * even, saturation at both ends, per-axis scales and zero points, an int8 MatMulInteger with zero points, the
 * DynamicQuantizeLinear formula. Bad-input cases check that planning fails with a message naming the input.
 * The ONNX node tests (tests/conformance) cover the remaining shapes against ONNX's stored outputs.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/ir/graph.h"
#include "engine/plan/plan.h"

typedef struct qin {
    const char *name; /* NULL: omitted optional input */
    eng_dtype dt;
    int ndim;
    int64_t dims[4];
    const void *data;
    int init; /* 1: initializer, 0: graph input */
} qin;

typedef struct qrun {
    eng_graph *g;
    eng_plan *p;
    eng_tensor in[8];
    eng_tensor out[4];
} qrun;

/* Build op_type(ins) -> nout outputs (optional int attribute), plan and run. Returns the first failing status
 * (planning or running); r holds the plan and outputs until qrun_free. */
static eng_status qrun_node(qrun *r, const char *op, const qin *ins, int nin, int nout, const char *attr, int64_t aval) {
    memset(r, 0, sizeof *r);
    eng_graph *g = r->g = eng_graph_new();
    g->opset = 13;
    int vin[8], vout[4], nfeed = 0;
    for (int i = 0; i < nin; i++) {
        vin[i] = -1;
        if (!ins[i].name) continue;
        int v = vin[i] = eng_graph_add_value(g, ins[i].name);
        g->values[v].dtype = ins[i].dt;
        g->values[v].ndim = ins[i].ndim;
        memcpy(g->values[v].dims, ins[i].dims, sizeof ins[i].dims);
        eng_tensor t = {.dtype = ins[i].dt, .ndim = ins[i].ndim, .data = (void *)ins[i].data};
        memcpy(t.dims, ins[i].dims, sizeof ins[i].dims);
        if (ins[i].init) {
            eng_tensor *c = calloc(1, sizeof *c);
            *c = t;
            size_t nb = eng_tensor_nbytes(&t);
            c->data = eng_alloc(nb ? nb : 4);
            memcpy(c->data, ins[i].data, nb);
            eng_value_set_init(g, v, c);
        } else {
            g->inputs = realloc(g->inputs, (size_t)(g->ninputs + 1) * sizeof(int));
            g->inputs[g->ninputs++] = v;
            r->in[nfeed++] = t;
        }
    }
    static const char *onames[4] = {"y", "y1", "y2", "y3"};
    for (int i = 0; i < nout; i++) {
        vout[i] = eng_graph_add_value(g, onames[i]);
        g->values[vout[i]].ndim = -1;
        g->outputs = realloc(g->outputs, (size_t)(g->noutputs + 1) * sizeof(int));
        g->outputs[g->noutputs++] = vout[i];
    }
    int nd = eng_graph_add_node(g, "q", op, "", vin, nin, vout, nout);
    if (attr) {
        eng_attr a = {.name = (char *)attr, .type = ENG_ATTR_INT, .i = aval};
        eng_node_add_attr(g, nd, &a);
    }
    eng_plan_opts o = {.nthreads = 2};
    ENG_TRY(eng_plan_new(g, &o, r->in, &r->p));
    return eng_plan_run(r->p, r->in, r->out);
}

static void qrun_free(qrun *r) {
    eng_plan_free(&r->p);
    eng_graph_free(&r->g);
}

static void expect_bytes(const eng_tensor *t, eng_dtype dt, const void *want, int64_t n, const char *what) {
    cr_assert_eq(t->dtype, dt, "%s: dtype %s", what, eng_dtype_name(t->dtype));
    cr_assert_eq(eng_tensor_numel(t), n, "%s: %lld elements", what, (long long)eng_tensor_numel(t));
    size_t es = eng_dtype_size(dt);
    for (int64_t i = 0; i < n; i++)
        cr_assert(!memcmp((const char *)t->data + i * es, (const char *)want + i * es, es), "%s: element %lld differs",
                  what, (long long)i);
}

/* x / 1 with ties at 0.5, 1.5, 2.5 (to even: 0, 2, 2) and values far outside the range. */
Test(quant, quantize_rounds_half_to_even_and_saturates) {
    const float x[8] = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 1000.f, -1000.f};
    const float one = 1.f;
    const uint8_t zu = 128;
    const int8_t zi = 0;
    qrun r;
    qin u[3] = {{"x", ENG_DTYPE_F32, 1, {8}, x, 0}, {"s", ENG_DTYPE_F32, 0, {0}, &one, 1}, {"zp", ENG_DTYPE_U8, 0, {0}, &zu, 1}};
    cr_assert_eq(qrun_node(&r, "QuantizeLinear", u, 3, 1, NULL, 0), ENG_STATUS_OK, "%s", eng_last_error());
    const uint8_t wu[8] = {128, 130, 130, 128, 126, 126, 255, 0};
    expect_bytes(&r.out[0], ENG_DTYPE_U8, wu, 8, "uint8 zp 128");
    qrun_free(&r);

    qin s[3] = {{"x", ENG_DTYPE_F32, 1, {8}, x, 0}, {"s", ENG_DTYPE_F32, 0, {0}, &one, 1}, {"zp", ENG_DTYPE_I8, 0, {0}, &zi, 1}};
    cr_assert_eq(qrun_node(&r, "QuantizeLinear", s, 3, 1, NULL, 0), ENG_STATUS_OK, "%s", eng_last_error());
    const int8_t wi[8] = {0, 2, 2, 0, -2, -2, 127, -128};
    expect_bytes(&r.out[0], ENG_DTYPE_I8, wi, 8, "int8 zp 0");
    qrun_free(&r);

    /* no zero point: uint8, zp 0; the division is in float32 (5 / 2 = 2.5 -> 2) */
    const float x2[4] = {1.f, 3.f, 5.f, -7.f}, two = 2.f;
    qin n[2] = {{"x", ENG_DTYPE_F32, 1, {4}, x2, 0}, {"s", ENG_DTYPE_F32, 1, {1}, &two, 1}};
    cr_assert_eq(qrun_node(&r, "QuantizeLinear", n, 2, 1, NULL, 0), ENG_STATUS_OK, "%s", eng_last_error());
    const uint8_t w2[4] = {0, 2, 2, 0};
    expect_bytes(&r.out[0], ENG_DTYPE_U8, w2, 4, "no zero point");
    qrun_free(&r);
}

/* x (2, 3), axis 1: scales (1, 2, 4), int8 zero points (0, 10, -10). */
Test(quant, per_axis_scale_and_zero_point) {
    const float x[6] = {1.f, 2.f, 4.f, -1.f, -2.f, -4.f}, sc[3] = {1.f, 2.f, 4.f};
    const int8_t zp[3] = {0, 10, -10};
    qrun r;
    qin q[3] = {{"x", ENG_DTYPE_F32, 2, {2, 3}, x, 0}, {"s", ENG_DTYPE_F32, 1, {3}, sc, 1}, {"zp", ENG_DTYPE_I8, 1, {3}, zp, 1}};
    cr_assert_eq(qrun_node(&r, "QuantizeLinear", q, 3, 1, "axis", 1), ENG_STATUS_OK, "%s", eng_last_error());
    const int8_t want[6] = {1, 11, -9, -1, 9, -11};
    expect_bytes(&r.out[0], ENG_DTYPE_I8, want, 6, "quantize axis 1");
    qrun_free(&r);

    qin d[3] = {{"x", ENG_DTYPE_I8, 2, {2, 3}, want, 0}, {"s", ENG_DTYPE_F32, 1, {3}, sc, 1}, {"zp", ENG_DTYPE_I8, 1, {3}, zp, 1}};
    cr_assert_eq(qrun_node(&r, "DequantizeLinear", d, 3, 1, NULL, 0), ENG_STATUS_OK, "%s", eng_last_error());
    expect_bytes(&r.out[0], ENG_DTYPE_F32, x, 6, "dequantize axis 1 (default)");
    qrun_free(&r);

    /* axis 0, uint8: rows scaled by (1, 0.5) around zero points (1, 2) */
    const uint8_t xu[6] = {1, 2, 3, 2, 4, 6}, zu[2] = {1, 2};
    const float s0[2] = {1.f, .5f}, y0[6] = {0.f, 1.f, 2.f, 0.f, 1.f, 2.f};
    qin d0[3] = {{"x", ENG_DTYPE_U8, 2, {2, 3}, xu, 0}, {"s", ENG_DTYPE_F32, 1, {2}, s0, 1}, {"zp", ENG_DTYPE_U8, 1, {2}, zu, 1}};
    cr_assert_eq(qrun_node(&r, "DequantizeLinear", d0, 3, 1, "axis", 0), ENG_STATUS_OK, "%s", eng_last_error());
    expect_bytes(&r.out[0], ENG_DTYPE_F32, y0, 6, "dequantize axis 0");
    qrun_free(&r);
}

/* int32 DequantizeLinear (a bias): no zero point, x * scale. */
Test(quant, dequantize_int32) {
    const int32_t x[3] = {-1000000, 0, 7};
    const float s = .25f, want[3] = {-250000.f, 0.f, 1.75f};
    qrun r;
    qin d[2] = {{"x", ENG_DTYPE_I32, 1, {3}, x, 0}, {"s", ENG_DTYPE_F32, 0, {0}, &s, 1}};
    cr_assert_eq(qrun_node(&r, "DequantizeLinear", d, 2, 1, NULL, 0), ENG_STATUS_OK, "%s", eng_last_error());
    expect_bytes(&r.out[0], ENG_DTYPE_F32, want, 3, "int32");
    qrun_free(&r);
}

/* A (2,3) int8 with a_zero_point 1, B (3,2) int8 with per-column b_zero_point (2, -3):
 * A - 1 = [[0,-3,2],[-5,4,-7]], B - zp = [[5,-5],[7,13],[-13,15]], product [[-47,-9],[94,-28]]. */
Test(quant, matmul_integer_int8_with_zero_points) {
    const int8_t a[6] = {1, -2, 3, -4, 5, -6}, b[6] = {7, -8, 9, 10, -11, 12}, azp = 1, bzp[2] = {2, -3};
    const int32_t want[4] = {-47, -9, 94, -28};
    qrun r;
    qin in[4] = {{"A", ENG_DTYPE_I8, 2, {2, 3}, a, 0}, {"B", ENG_DTYPE_I8, 2, {3, 2}, b, 1},
                 {"azp", ENG_DTYPE_I8, 0, {0}, &azp, 1}, {"bzp", ENG_DTYPE_I8, 1, {2}, bzp, 1}};
    cr_assert_eq(qrun_node(&r, "MatMulInteger", in, 4, 1, NULL, 0), ENG_STATUS_OK, "%s", eng_last_error());
    expect_bytes(&r.out[0], ENG_DTYPE_I32, want, 4, "MatMulInteger");
    qrun_free(&r);

    /* batched A (2, 2, 3) against the same B broadcast: the second batch is the first's rows swapped */
    const int8_t a3[12] = {1, -2, 3, -4, 5, -6, -4, 5, -6, 1, -2, 3};
    const int32_t want3[8] = {-47, -9, 94, -28, 94, -28, -47, -9};
    qin in3[4] = {{"A", ENG_DTYPE_I8, 3, {2, 2, 3}, a3, 0}, {"B", ENG_DTYPE_I8, 2, {3, 2}, b, 1},
                  {"azp", ENG_DTYPE_I8, 0, {0}, &azp, 1}, {"bzp", ENG_DTYPE_I8, 1, {2}, bzp, 1}};
    cr_assert_eq(qrun_node(&r, "MatMulInteger", in3, 4, 1, NULL, 0), ENG_STATUS_OK, "%s", eng_last_error());
    expect_bytes(&r.out[0], ENG_DTYPE_I32, want3, 8, "batched MatMulInteger");
    qrun_free(&r);
}

/* x in [-1, 2]: scale 3/255, zero point round(1 / (3/255)) = 85; y = 0, 85, 170, 255. */
Test(quant, dynamic_quantize_linear) {
    const float x[4] = {-1.f, 0.f, 1.f, 2.f};
    qrun r;
    qin in[1] = {{"x", ENG_DTYPE_F32, 1, {4}, x, 0}};
    cr_assert_eq(qrun_node(&r, "DynamicQuantizeLinear", in, 1, 3, NULL, 0), ENG_STATUS_OK, "%s", eng_last_error());
    const uint8_t want[4] = {0, 85, 170, 255}, zp = 85;
    const float s = 3.f / 255.f;
    expect_bytes(&r.out[0], ENG_DTYPE_U8, want, 4, "y");
    expect_bytes(&r.out[1], ENG_DTYPE_F32, &s, 1, "y_scale");
    expect_bytes(&r.out[2], ENG_DTYPE_U8, &zp, 1, "y_zero_point");
    qrun_free(&r);
}

static void expect_error(eng_status st, eng_status want, const char *const *needles, int n) {
    cr_assert_eq(st, want, "status %s, message: %s", eng_status_name(st), eng_last_error());
    for (int i = 0; i < n; i++)
        cr_assert(strstr(eng_last_error(), needles[i]), "message '%s' lacks '%s'", eng_last_error(), needles[i]);
}

Test(quant, scale_of_wrong_shape_names_the_input) {
    const float x[6] = {0}, sc[4] = {1, 1, 1, 1};
    qrun r;
    qin q[2] = {{"x", ENG_DTYPE_F32, 2, {2, 3}, x, 0}, {"my_scale", ENG_DTYPE_F32, 1, {4}, sc, 1}};
    const char *want[] = {"node 'q' (QuantizeLinear)", "y_scale ('my_scale')", "[4]", "[3]"};
    expect_error(qrun_node(&r, "QuantizeLinear", q, 2, 1, "axis", 1), ENG_STATUS_INVALID_ARGUMENT, want, 4);
    qrun_free(&r);
}

Test(quant, zero_point_dtype_mismatch_names_the_input) {
    const uint8_t x[3] = {0};
    const float s = 1.f;
    const int8_t zp = 0;
    qrun r;
    qin d[3] = {{"x", ENG_DTYPE_U8, 1, {3}, x, 0}, {"s", ENG_DTYPE_F32, 0, {0}, &s, 1}, {"my_zp", ENG_DTYPE_I8, 0, {0}, &zp, 1}};
    const char *want[] = {"x_zero_point ('my_zp')", "int8", "uint8"};
    expect_error(qrun_node(&r, "DequantizeLinear", d, 3, 1, NULL, 0), ENG_STATUS_INVALID_MODEL, want, 3);
    qrun_free(&r);

    /* QuantizeLinear: output_dtype says int8 but the zero point (which fixes the output dtype) is uint8 */
    const float xf[3] = {0};
    const uint8_t zu = 0;
    qin q[3] = {{"x", ENG_DTYPE_F32, 1, {3}, xf, 0}, {"s", ENG_DTYPE_F32, 0, {0}, &s, 1}, {"zu", ENG_DTYPE_U8, 0, {0}, &zu, 1}};
    const char *want_q[] = {"output_dtype int8", "y_zero_point ('zu')", "uint8"};
    expect_error(qrun_node(&r, "QuantizeLinear", q, 3, 1, "output_dtype", ENG_DTYPE_I8), ENG_STATUS_INVALID_MODEL, want_q, 3);
    qrun_free(&r);

    /* MatMulInteger: uint8 A with an int8 a_zero_point */
    const uint8_t a[2] = {0}, b[2] = {0};
    qin m[3] = {{"A", ENG_DTYPE_U8, 2, {1, 2}, a, 0}, {"B", ENG_DTYPE_U8, 2, {2, 1}, b, 1}, {"azp", ENG_DTYPE_I8, 0, {0}, &zp, 1}};
    const char *want_m[] = {"a_zero_point ('azp')", "expected dtype uint8, got int8"};
    expect_error(qrun_node(&r, "MatMulInteger", m, 3, 1, NULL, 0), ENG_STATUS_INVALID_MODEL, want_m, 2);
    qrun_free(&r);
}

/* A per-channel weight zero point whose length is not W's output channel count. */
Test(quant, conv_integer_weight_zero_point_shape) {
    const uint8_t x[9] = {0}, w[8] = {0}, wz[3] = {0};
    qrun r;
    qin c[4] = {{"x", ENG_DTYPE_U8, 4, {1, 1, 3, 3}, x, 0}, {"w", ENG_DTYPE_U8, 4, {2, 1, 2, 2}, w, 1}, {NULL},
                {"wz", ENG_DTYPE_U8, 1, {3}, wz, 1}};
    const char *want[] = {"w_zero_point ('wz')", "[3]", "expected a scalar or [2] (one per output channel)"};
    expect_error(qrun_node(&r, "ConvInteger", c, 4, 1, NULL, 0), ENG_STATUS_INVALID_ARGUMENT, want, 3);
    qrun_free(&r);
}

/* The vectorised QuantizeLinear (16 lanes, threads over 64 Ki chunks) against the formula, element by element,
 * on a long tensor: exact ties (even rounding), NaN -> zero point, +-inf and huge values saturating, uint8 with a
 * zero point and int8; lengths that leave a scalar tail. */
Test(quant, quantize_vector_path_matches_the_formula) {
    const int64_t n = 70001;
    float *x = malloc((size_t)n * sizeof *x);
    const float sc = 0.25f;
    for (int64_t i = 0; i < n; i++) {
        switch (i % 7) {
        case 0: x[i] = ((float)(i % 600) - 300.5f) * sc; break; /* an exact tie */
        case 1: x[i] = NAN; break;
        case 2: x[i] = (i & 8) ? INFINITY : -INFINITY; break;
        case 3: x[i] = (i & 16) ? 3e38f : -1e30f; break;
        default: x[i] = (float)(i % 1000) * 0.0173f - 9.0f;
        }
    }
    for (int s8 = 0; s8 <= 1; s8++) {
        uint8_t zu = 7;
        int8_t zi = -3;
        float scale = sc;
        qin ins[3] = {{"x", ENG_DTYPE_F32, 1, {n}, x, 0},
                      {"s", ENG_DTYPE_F32, 0, {0}, &scale, 1},
                      {"z", s8 ? ENG_DTYPE_I8 : ENG_DTYPE_U8, 0, {0}, s8 ? (const void *)&zi : (const void *)&zu, 1}};
        qrun r;
        cr_assert_eq(qrun_node(&r, "QuantizeLinear", ins, 3, 1, NULL, 0), ENG_STATUS_OK, "%s", eng_last_error());
        int32_t zp = s8 ? zi : zu, lo = s8 ? -128 : 0, hi = s8 ? 127 : 255;
        for (int64_t i = 0; i < n; i++) {
            double v = (double)(x[i] / sc);
            int32_t want = v != v ? zp : (int32_t)fmax(lo, fmin(hi, nearbyint(v) + zp));
            int32_t got = s8 ? ((const int8_t *)r.out[0].data)[i] : ((const uint8_t *)r.out[0].data)[i];
            cr_assert_eq(got, want, "%s element %lld: x %g -> %d, want %d", s8 ? "int8" : "uint8", (long long)i, x[i], got, want);
        }
        qrun_free(&r);
    }
    free(x);
}
