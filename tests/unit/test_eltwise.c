/* test_eltwise.c - eltwise kernels and op defs against straightforward double-precision references.
 *
 * Every check runs the real CPU kernel (looked up by name in the CPU backend) on deterministic pseudo-random
 * data and compares each element with a reference computed in double (int64 for integer dtypes), over
 * several dtypes and broadcast shapes: same shape, suffix, middle [C,1], rank-0, zero-size, and a large case
 * that takes the multi-threaded path. Also op-level checks of shape inference (old broadcast/axis forms).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/ir/graph.h"
#include "engine/ops/op.h"
#include "kernels/kernel.h"
#include "kernels/krn-eltwise.h"

static uint64_t rng_state = 88172645463325252ull;
static double rnd(void) { /* [0, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static eng_tensor mk(eng_dtype dt, int ndim, const int64_t *dims) {
    eng_tensor t = {.dtype = dt, .ndim = ndim};
    for (int i = 0; i < ndim; i++) t.dims[i] = dims[i];
    int64_t n = eng_tensor_numel(&t);
    t.data = eng_alloc((size_t)(n > 0 ? n : 1) * eng_dtype_size(dt));
    cr_assert(t.data != NULL);
    return t;
}

static void fill(eng_tensor *t, double lo, double hi) {
    int64_t n = eng_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) {
        double v = lo + (hi - lo) * rnd();
        if (!eng_dtype_is_float(t->dtype)) v = floor(v);
        eng_tensor_set_f64(t, i, v);
    }
}

static eng_status run(const char *kernel, const void *params, eng_tensor *in, int nin, eng_tensor *out, int nthreads) {
    const krn_kernel *k = krn_backend_find(krn_backend_cpu(), kernel);
    cr_assert(k != NULL, "kernel %s not found", kernel);
    krn_call c = {.params = params, .in = in, .nin = nin, .out = out, .nout = 1, .nthreads = nthreads};
    if (k->init) {
        eng_status st = k->init(&c);
        if (st) return st;
    }
    eng_status st = k->exec(&c);
    if (k->free_state) k->free_state(c.state);
    return st;
}

/* flat output index -> flat index of an input broadcast into out */
static int64_t bidx(const eng_tensor *in, const eng_tensor *out, int64_t i) {
    int64_t idx = 0, mul = 1;
    for (int d = out->ndim - 1; d >= 0; d--) {
        int64_t od = out->dims[d], c = i % od;
        i /= od;
        int id = d - (out->ndim - in->ndim);
        if (id < 0) continue;
        if (in->dims[id] != 1) idx += c * mul;
        mul *= in->dims[id];
    }
    return idx;
}

static void bshape(const eng_tensor *a, const eng_tensor *b, eng_tensor *o) {
    const eng_tensor *ts[2] = {a, b};
    cr_assert_eq(eng_broadcast_shapes(ts, 2, o), ENG_STATUS_OK);
}

static int is_cmp(int op) { return op >= KRN_BIN_EQ && op <= KRN_BIN_XOR; }

static double ref_bin_f(int op, double x, double y) {
    switch (op) {
    case KRN_BIN_ADD: return x + y;
    case KRN_BIN_SUB: return x - y;
    case KRN_BIN_MUL: return x * y;
    case KRN_BIN_DIV: return x / y;
    case KRN_BIN_POW: return pow(x, y);
    case KRN_BIN_MOD: { double r = fmod(x, y); return (r != 0 && ((r < 0) != (y < 0))) ? r + y : r; }
    case KRN_BIN_FMOD: return fmod(x, y);
    case KRN_BIN_EQ: return x == y;
    case KRN_BIN_GT: return x > y;
    case KRN_BIN_LT: return x < y;
    case KRN_BIN_GE: return x >= y;
    case KRN_BIN_LE: return x <= y;
    case KRN_BIN_MIN: return x < y ? x : y;
    case KRN_BIN_MAX: return x > y ? x : y;
    case KRN_BIN_PRELU: return x < 0 ? x * y : x;
    case KRN_BIN_AND: return x != 0 && y != 0;
    case KRN_BIN_OR: return x != 0 || y != 0;
    case KRN_BIN_XOR: return (x != 0) != (y != 0);
    default: return NAN;
    }
}

static int64_t ref_bin_i(int op, int64_t x, int64_t y) {
    switch (op) {
    case KRN_BIN_ADD: return x + y;
    case KRN_BIN_SUB: return x - y;
    case KRN_BIN_MUL: return x * y;
    case KRN_BIN_DIV: return y == 0 ? 0 : x / y;
    case KRN_BIN_MOD: { if (y == 0) return 0; int64_t r = x % y; return (r != 0 && ((r < 0) != (y < 0))) ? r + y : r; }
    case KRN_BIN_FMOD: return y == 0 ? 0 : x % y;
    case KRN_BIN_SHL: return x << y;
    case KRN_BIN_SHR: return x >> y;
    default: return (int64_t)ref_bin_f(op, (double)x, (double)y);
    }
}

/* run binary op on dtype dt with shapes da/db, compare with the reference */
static void check_binary(int op, eng_dtype dt, int na, const int64_t *da, int nb, const int64_t *db, double lo,
                         double hi, int nthreads) {
    eng_tensor in[2] = {mk(dt, na, da), mk(dt, nb, db)};
    fill(&in[0], lo, hi);
    fill(&in[1], lo, hi);
    if (op == KRN_BIN_DIV || op == KRN_BIN_MOD || op == KRN_BIN_FMOD) { /* avoid zero divisors */
        for (int64_t i = 0; i < eng_tensor_numel(&in[1]); i++)
            if (eng_tensor_get_f64(&in[1], i) == 0) eng_tensor_set_f64(&in[1], i, 3);
    }
    eng_tensor shp = {0};
    bshape(&in[0], &in[1], &shp);
    eng_tensor out = mk(is_cmp(op) ? ENG_DTYPE_BOOL : dt, shp.ndim, shp.dims);
    krn_binary_params p = {.op = op};
    eng_status st = run("eltwise_binary", &p, in, 2, &out, nthreads);
    cr_assert_eq(st, ENG_STATUS_OK, "op %d %s: %s", op, eng_dtype_name(dt), eng_last_error());
    int64_t n = eng_tensor_numel(&out);
    int isf = eng_dtype_is_float(dt);
    double tol = dt == ENG_DTYPE_F16 ? 2e-3 : dt == ENG_DTYPE_BF16 ? 1e-2 : dt == ENG_DTYPE_F32 ? 1e-6 : 1e-12;
    for (int64_t i = 0; i < n; i++) {
        int64_t ia = bidx(&in[0], &out, i), ib = bidx(&in[1], &out, i);
        if (isf) {
            double x = eng_tensor_get_f64(&in[0], ia), y = eng_tensor_get_f64(&in[1], ib);
            double r = ref_bin_f(op, x, y), g = eng_tensor_get_f64(&out, i);
            if (!is_cmp(op)) { /* round the reference to the output dtype like the kernel does */
                eng_tensor one = {.dtype = dt, .ndim = 0};
                uint64_t buf;
                one.data = &buf;
                eng_tensor_set_f64(&one, 0, r);
                r = eng_tensor_get_f64(&one, 0);
            }
            cr_assert(fabs(g - r) <= tol * (1 + fabs(r)), "op %d %s elem %lld: %g op %g = %g, expected %g", op,
                      eng_dtype_name(dt), (long long)i, x, y, g, r);
        } else {
            int64_t x = eng_tensor_get_i64(&in[0], ia), y = eng_tensor_get_i64(&in[1], ib);
            int64_t r = ref_bin_i(op, x, y), g = eng_tensor_get_i64(&out, i);
            if (!is_cmp(op)) { /* wrap the reference to the dtype */
                eng_tensor one = {.dtype = dt, .ndim = 0};
                uint64_t buf;
                one.data = &buf;
                eng_tensor_set_i64(&one, 0, r);
                r = eng_tensor_get_i64(&one, 0);
            }
            cr_assert_eq(g, r, "op %d %s elem %lld: %lld op %lld = %lld, expected %lld", op, eng_dtype_name(dt),
                         (long long)i, (long long)x, (long long)y, (long long)g, (long long)r);
        }
    }
    eng_free(in[0].data);
    eng_free(in[1].data);
    eng_free(out.data);
}

static const struct { int na; int64_t a[4]; int nb; int64_t b[4]; } shapes[] = {
    {3, {2, 3, 4}, 3, {2, 3, 4}}, {3, {2, 3, 4}, 1, {4}},       {3, {2, 3, 4}, 2, {3, 1}},
    {0, {0}, 2, {2, 3}},          {2, {2, 3}, 0, {0}},          {3, {5, 1, 3}, 3, {1, 4, 1}},
    {2, {0, 3}, 1, {3}},          {1, {1}, 0, {0}},             {4, {2, 3, 5, 7}, 3, {3, 1, 1}},
    {2, {1, 7}, 2, {6, 1}},       {4, {2, 1, 3, 1}, 4, {1, 5, 1, 2}},
};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])

Test(eltwise, binary_float_ops_broadcast) {
    const int ops[] = {KRN_BIN_ADD, KRN_BIN_SUB, KRN_BIN_MUL, KRN_BIN_DIV, KRN_BIN_MIN, KRN_BIN_MAX, KRN_BIN_MOD,
                       KRN_BIN_FMOD, KRN_BIN_EQ, KRN_BIN_GT, KRN_BIN_LT, KRN_BIN_GE, KRN_BIN_LE, KRN_BIN_PRELU};
    const eng_dtype dts[] = {ENG_DTYPE_F32, ENG_DTYPE_F64, ENG_DTYPE_F16, ENG_DTYPE_BF16};
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
        for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
            for (int s = 0; s < NSHAPES; s++)
                check_binary(ops[o], dts[d], shapes[s].na, shapes[s].a, shapes[s].nb, shapes[s].b, -4, 4, 2);
}

Test(eltwise, binary_int_ops_broadcast) {
    const int ops[] = {KRN_BIN_ADD, KRN_BIN_SUB, KRN_BIN_MUL, KRN_BIN_DIV, KRN_BIN_MIN, KRN_BIN_MAX,
                       KRN_BIN_MOD, KRN_BIN_FMOD, KRN_BIN_EQ, KRN_BIN_GT, KRN_BIN_LE};
    const eng_dtype dts[] = {ENG_DTYPE_I8, ENG_DTYPE_I16, ENG_DTYPE_I32, ENG_DTYPE_I64,
                             ENG_DTYPE_U8, ENG_DTYPE_U16, ENG_DTYPE_U32, ENG_DTYPE_U64};
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
        for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
            int uns = dts[d] == ENG_DTYPE_U8 || dts[d] == ENG_DTYPE_U16 || dts[d] == ENG_DTYPE_U32 || dts[d] == ENG_DTYPE_U64;
            for (int s = 0; s < NSHAPES; s++)
                check_binary(ops[o], dts[d], shapes[s].na, shapes[s].a, shapes[s].nb, shapes[s].b, uns ? 0 : -100,
                             100, 2);
        }
}

Test(eltwise, binary_shift_and_logic) {
    const eng_dtype dts[] = {ENG_DTYPE_U8, ENG_DTYPE_U16, ENG_DTYPE_U32, ENG_DTYPE_U64};
    for (size_t d = 0; d < 4; d++)
        for (int s = 0; s < NSHAPES; s++) {
            check_binary(KRN_BIN_SHL, dts[d], shapes[s].na, shapes[s].a, shapes[s].nb, shapes[s].b, 0, 8, 1);
            check_binary(KRN_BIN_SHR, dts[d], shapes[s].na, shapes[s].a, shapes[s].nb, shapes[s].b, 0, 8, 1);
        }
    const int ops[] = {KRN_BIN_AND, KRN_BIN_OR, KRN_BIN_XOR, KRN_BIN_EQ};
    for (size_t o = 0; o < 4; o++)
        for (int s = 0; s < NSHAPES; s++)
            check_binary(ops[o], ENG_DTYPE_BOOL, shapes[s].na, shapes[s].a, shapes[s].nb, shapes[s].b, 0, 2, 1);
}

Test(eltwise, binary_large_threaded) {
    int64_t a[3] = {3, 5, 70001}, b1[1] = {70001}, b2[3] = {3, 5, 1}, a2[2] = {300, 1000}, b3[2] = {300, 1};
    check_binary(KRN_BIN_ADD, ENG_DTYPE_F32, 3, a, 1, b1, -1, 1, 4);
    check_binary(KRN_BIN_MUL, ENG_DTYPE_F32, 3, a, 3, b2, -1, 1, 4);
    check_binary(KRN_BIN_SUB, ENG_DTYPE_F32, 3, a, 3, a, -1, 1, 3);
    check_binary(KRN_BIN_DIV, ENG_DTYPE_I64, 2, a2, 2, b3, -50, 50, 4);
    check_binary(KRN_BIN_GT, ENG_DTYPE_F32, 3, a, 1, b1, -1, 1, 4);
}

Test(eltwise, pow_mixed_dtypes) {
    const eng_dtype pairs[][2] = {{ENG_DTYPE_F32, ENG_DTYPE_F32}, {ENG_DTYPE_F32, ENG_DTYPE_I32},
                                  {ENG_DTYPE_F32, ENG_DTYPE_I64}, {ENG_DTYPE_I32, ENG_DTYPE_F32},
                                  {ENG_DTYPE_I64, ENG_DTYPE_I64}, {ENG_DTYPE_F64, ENG_DTYPE_F64},
                                  {ENG_DTYPE_F16, ENG_DTYPE_F16}, {ENG_DTYPE_U64, ENG_DTYPE_F32}};
    const float sc[] = {2.0f, 0.5f, 3.0f, -1.0f, 1.7f};
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++)
        for (int s = 0; s < NSHAPES; s++) {
            eng_tensor in[2] = {mk(pairs[k][0], shapes[s].na, shapes[s].a), mk(pairs[k][1], shapes[s].nb, shapes[s].b)};
            fill(&in[0], 1, 5);
            fill(&in[1], 0, 3);
            eng_tensor shp = {0};
            bshape(&in[0], &in[1], &shp);
            eng_tensor out = mk(pairs[k][0], shp.ndim, shp.dims);
            krn_binary_params p = {.op = KRN_BIN_POW};
            cr_assert_eq(run("eltwise_binary", &p, in, 2, &out, 1), ENG_STATUS_OK, "%s", eng_last_error());
            for (int64_t i = 0; i < eng_tensor_numel(&out); i++) {
                double x = eng_tensor_get_f64(&in[0], bidx(&in[0], &out, i));
                double y = eng_tensor_get_f64(&in[1], bidx(&in[1], &out, i));
                double r = pow(x, y), g = eng_tensor_get_f64(&out, i);
                if (!eng_dtype_is_float(pairs[k][0])) r = trunc(r);
                cr_assert(fabs(g - r) <= 2e-3 * (1 + fabs(r)), "pow %s^%s: %g^%g = %g, expected %g",
                          eng_dtype_name(pairs[k][0]), eng_dtype_name(pairs[k][1]), x, y, g, r);
            }
            eng_free(in[0].data);
            eng_free(in[1].data);
            eng_free(out.data);
        }
    /* scalar-exponent fast paths */
    for (size_t k = 0; k < sizeof sc / sizeof sc[0]; k++) {
        int64_t d[1] = {1000};
        eng_tensor in[2] = {mk(ENG_DTYPE_F32, 1, d), mk(ENG_DTYPE_F32, 0, d)};
        fill(&in[0], 0.1, 5);
        *(float *)in[1].data = sc[k];
        eng_tensor out = mk(ENG_DTYPE_F32, 1, d);
        krn_binary_params p = {.op = KRN_BIN_POW};
        cr_assert_eq(run("eltwise_binary", &p, in, 2, &out, 2), ENG_STATUS_OK);
        for (int i = 0; i < 1000; i++) {
            double x = ((float *)in[0].data)[i], r = pow(x, sc[k]);
            cr_assert(fabs(((float *)out.data)[i] - r) <= 1e-6 * (1 + fabs(r)));
        }
        eng_free(in[0].data);
        eng_free(in[1].data);
        eng_free(out.data);
    }
}

Test(eltwise, int_division_by_zero_does_not_trap) {
    int64_t d[1] = {4};
    eng_tensor in[2] = {mk(ENG_DTYPE_I32, 1, d), mk(ENG_DTYPE_I32, 1, d)};
    int32_t *a = in[0].data, *b = in[1].data;
    a[0] = 7; a[1] = INT32_MIN; a[2] = -7; a[3] = 5;
    b[0] = 0; b[1] = -1;        b[2] = 2;  b[3] = 0;
    eng_tensor out = mk(ENG_DTYPE_I32, 1, d);
    const int ops[] = {KRN_BIN_DIV, KRN_BIN_MOD, KRN_BIN_FMOD};
    for (int k = 0; k < 3; k++) {
        krn_binary_params p = {.op = ops[k]};
        cr_assert_eq(run("eltwise_binary", &p, in, 2, &out, 1), ENG_STATUS_OK);
        int32_t *o = out.data;
        cr_assert_eq(o[0], 0);
        cr_assert_eq(o[3], 0);
        if (ops[k] == KRN_BIN_DIV) cr_assert_eq(o[2], -3);
        if (ops[k] == KRN_BIN_MOD) cr_assert_eq(o[2], 1);
        if (ops[k] == KRN_BIN_FMOD) cr_assert_eq(o[2], -1);
    }
    eng_free(in[0].data);
    eng_free(in[1].data);
    eng_free(out.data);
}

/* ---- unary ---- */

static double ref_act(int act, double a, double b, double v) {
    switch (act) {
    case KRN_ACT_RELU: return v > 0 ? v : 0;
    case KRN_ACT_LEAKY_RELU: return v < 0 ? a * v : v;
    case KRN_ACT_SIGMOID: return 1 / (1 + exp(-v));
    case KRN_ACT_TANH: return tanh(v);
    case KRN_ACT_GELU: return 0.5 * v * (1 + erf(v / sqrt(2.0)));
    case KRN_ACT_GELU_TANH: return 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    case KRN_ACT_CLIP: return v < a ? a : v > b ? b : v;
    case KRN_ACT_ELU: return v < 0 ? a * (exp(v) - 1) : v;
    case KRN_ACT_SELU: return v <= 0 ? b * a * (exp(v) - 1) : b * v;
    case KRN_ACT_CELU: return fmax(0, v) + fmin(0, a * (exp(v / a) - 1));
    case KRN_ACT_HARD_SIGMOID: return fmax(0, fmin(1, a * v + b));
    case KRN_ACT_HARD_SWISH: return v * fmax(0, fmin(1, v / 6 + 0.5));
    case KRN_ACT_SOFTPLUS: return log(1 + exp(v));
    case KRN_ACT_SOFTSIGN: return v / (1 + fabs(v));
    case KRN_ACT_THRESHOLDED_RELU: return v > a ? v : 0;
    case KRN_ACT_SHRINK: return v < -b ? v + a : v > b ? v - a : 0;
    case KRN_ACT_MISH: return v * tanh(log(1 + exp(v)));
    case KRN_ACT_SILU: return v / (1 + exp(-v));
    case KRN_ACT_SQRT: return sqrt(fabs(v));
    case KRN_ACT_RECIPROCAL: return 1 / v;
    case KRN_ACT_EXP: return exp(v);
    case KRN_ACT_LOG: return log(fabs(v));
    case KRN_ACT_ABS: return fabs(v);
    case KRN_ACT_NEG: return -v;
    case KRN_ACT_FLOOR: return floor(v);
    case KRN_ACT_CEIL: return ceil(v);
    case KRN_ACT_ROUND: return nearbyint(v);
    case KRN_ACT_SIGN: return v > 0 ? 1 : v < 0 ? -1 : 0;
    case KRN_ACT_ERF: return erf(v);
    case KRN_ACT_SIN: return sin(v);
    case KRN_ACT_COS: return cos(v);
    case KRN_ACT_TAN: return tan(v);
    case KRN_ACT_ASIN: return asin(v / 10);
    case KRN_ACT_ACOS: return acos(v / 10);
    case KRN_ACT_ATAN: return atan(v);
    case KRN_ACT_SINH: return sinh(v);
    case KRN_ACT_COSH: return cosh(v);
    case KRN_ACT_ASINH: return asinh(v);
    case KRN_ACT_ACOSH: return acosh(fabs(v) + 1);
    case KRN_ACT_ATANH: return atanh(v / 10);
    default: return NAN;
    }
}

/* input transform so the reference's domain is respected */
static double act_input(int act, double v) {
    switch (act) {
    case KRN_ACT_SQRT: case KRN_ACT_LOG: return fabs(v);
    case KRN_ACT_ASIN: case KRN_ACT_ACOS: case KRN_ACT_ATANH: return v / 10;
    case KRN_ACT_ACOSH: return fabs(v) + 1;
    default: return v;
    }
}

Test(eltwise, unary_float_all_acts) {
    const eng_dtype dts[] = {ENG_DTYPE_F32, ENG_DTYPE_F64, ENG_DTYPE_F16, ENG_DTYPE_BF16};
    const double ab[][2] = {{0.1, 0.7}, {1.3, 1.05}};
    int64_t d[2] = {3, 1111};
    for (int act = KRN_ACT_RELU; act < KRN_ACT_ISNAN; act++)
        for (size_t k = 0; k < 4; k++)
            for (int q = 0; q < 2; q++) {
                double a = ab[q][0], b = ab[q][1];
                if (act == KRN_ACT_CLIP) { a = -1.5; b = 2.5; }
                eng_tensor x = mk(dts[k], 2, d), y = mk(dts[k], 2, d);
                int64_t n = eng_tensor_numel(&x);
                for (int64_t i = 0; i < n; i++) {
                    double v = -9.5 + 19.0 * (double)i / (double)n; /* dense sweep incl. tails */
                    if (act == KRN_ACT_RECIPROCAL && fabs(v) < 0.01) v = 0.5;
                    eng_tensor_set_f64(&x, i, act_input(act, v));
                }
                krn_unary_params p = {.op = act, .alpha = (float)a, .beta = (float)b};
                cr_assert_eq(run("eltwise_unary", &p, &x, 1, &y, 2), ENG_STATUS_OK, "act %d: %s", act, eng_last_error());
                double rtol = dts[k] == ENG_DTYPE_F64 ? 1e-12 : dts[k] == ENG_DTYPE_F32 ? 2e-5
                            : dts[k] == ENG_DTYPE_F16 ? 2e-3 : 1.6e-2;
                double atol = dts[k] == ENG_DTYPE_F64 ? 1e-14 : dts[k] == ENG_DTYPE_F32 ? 1e-6 : 1e-3;
                for (int64_t i = 0; i < n; i++) {
                    double xv = eng_tensor_get_f64(&x, i), g = eng_tensor_get_f64(&y, i);
                    /* reference works on the untransformed value for domain-shifted acts */
                    double r;
                    switch (act) {
                    case KRN_ACT_ASIN: r = asin(xv); break;
                    case KRN_ACT_ACOS: r = acos(xv); break;
                    case KRN_ACT_ATANH: r = atanh(xv); break;
                    case KRN_ACT_ACOSH: r = acosh(xv); break;
                    case KRN_ACT_SQRT: r = sqrt(xv); break;
                    case KRN_ACT_LOG: r = log(xv); break;
                    default: r = ref_act(act, (float)a, (float)b, xv);
                    }
                    /* rounding functions at exact halves in low precision: allow either neighbour */
                    double tol = atol + rtol * fabs(r);
                    if (act == KRN_ACT_TAN || act == KRN_ACT_COSH || act == KRN_ACT_SINH || act == KRN_ACT_EXP)
                        tol *= 4;
                    cr_assert(fabs(g - r) <= tol || (isinf(r) && g == r), "act %d %s: f(%.9g) = %.9g, expected %.9g",
                              act, eng_dtype_name(dts[k]), xv, g, r);
                }
                eng_free(x.data);
                eng_free(y.data);
            }
}

Test(eltwise, fast_math_accuracy_f32) {
    /* relative accuracy of the vectorised exp/tanh/sigmoid/erf/gelu over a dense sweep */
    const int acts[] = {KRN_ACT_EXP, KRN_ACT_TANH, KRN_ACT_SIGMOID, KRN_ACT_ERF, KRN_ACT_GELU, KRN_ACT_GELU_TANH};
    const double rel[] = {3e-7, 1e-6, 1e-6, 1e-5, 2e-5, 1e-5}; /* gelu_tanh: float rounding of the exp argument */
    int n = 200001;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    for (size_t k = 0; k < sizeof acts / sizeof acts[0]; k++) {
        for (int i = 0; i < n; i++) x[i] = -12.0f + 24.0f * (float)i / (float)(n - 1);
        memcpy(y, x, n * sizeof *y);
        cr_assert_eq(krn_cpu_activation_apply(acts[k], 0, 0, y, n, 3), ENG_STATUS_OK);
        double worst = 0;
        for (int i = 0; i < n; i++) {
            double r = ref_act(acts[k], 0, 0, x[i]);
            double e = fabs(y[i] - r) / (fabs(r) > 1e-10 ? fabs(r) : 1e-10); /* relative, absolute near 0 */
            if (e > worst) worst = e;
        }
        cr_assert(worst <= rel[k], "act %d: worst relative error %g > %g", acts[k], worst, rel[k]);
    }
    /* exp extremes */
    float ex[6] = {-200, -88, 0, 88.5f, 89, NAN};
    krn_cpu_expf_vec(ex, ex, 6);
    cr_assert(ex[0] == 0 && ex[1] >= 0 && ex[1] < 1e-37f && ex[2] == 1.0f && ex[3] > 2.5e38f && isinf(ex[4]) && isnan(ex[5]));
    cr_assert_eq(krn_cpu_activation_apply(KRN_ACT_ISNAN, 0, 0, x, 1, 1), ENG_STATUS_INVALID_ARGUMENT);
    free(x);
    free(y);
}

Test(eltwise, unary_int_and_predicates) {
    int64_t d[1] = {9};
    eng_tensor x = mk(ENG_DTYPE_I8, 1, d), y = mk(ENG_DTYPE_I8, 1, d);
    int8_t *xv = x.data, *yv = y.data;
    for (int i = 0; i < 9; i++) xv[i] = (int8_t)(i * 30 - 120);
    const int acts[] = {KRN_ACT_ABS, KRN_ACT_NEG, KRN_ACT_SIGN, KRN_ACT_RELU};
    for (int k = 0; k < 4; k++) {
        krn_unary_params p = {.op = acts[k]};
        cr_assert_eq(run("eltwise_unary", &p, &x, 1, &y, 1), ENG_STATUS_OK);
        for (int i = 0; i < 9; i++) {
            int v = xv[i], r = acts[k] == KRN_ACT_ABS ? abs(v) : acts[k] == KRN_ACT_NEG ? -v
                                : acts[k] == KRN_ACT_SIGN ? (v > 0) - (v < 0) : (v > 0 ? v : 0);
            cr_assert_eq(yv[i], (int8_t)r);
        }
    }
    eng_tensor f = mk(ENG_DTYPE_F16, 1, d), b = mk(ENG_DTYPE_BOOL, 1, d);
    const double vals[9] = {1, NAN, INFINITY, -INFINITY, 0, -2, NAN, INFINITY, 3};
    for (int i = 0; i < 9; i++) eng_tensor_set_f64(&f, i, vals[i]);
    krn_unary_params p = {.op = KRN_ACT_ISNAN};
    cr_assert_eq(run("eltwise_unary", &p, &f, 1, &b, 1), ENG_STATUS_OK);
    for (int i = 0; i < 9; i++) cr_assert_eq(((uint8_t *)b.data)[i], isnan(vals[i]) ? 1 : 0);
    p = (krn_unary_params){.op = KRN_ACT_ISINF, .alpha = 0, .beta = 1};
    cr_assert_eq(run("eltwise_unary", &p, &f, 1, &b, 1), ENG_STATUS_OK);
    for (int i = 0; i < 9; i++) cr_assert_eq(((uint8_t *)b.data)[i], vals[i] == -INFINITY ? 1 : 0);
    eng_tensor nb = mk(ENG_DTYPE_BOOL, 1, d);
    p = (krn_unary_params){.op = KRN_ACT_NOT};
    cr_assert_eq(run("eltwise_unary", &p, &b, 1, &nb, 1), ENG_STATUS_OK);
    for (int i = 0; i < 9; i++) cr_assert_eq(((uint8_t *)nb.data)[i], vals[i] == -INFINITY ? 0 : 1);
    eng_free(x.data); eng_free(y.data); eng_free(f.data); eng_free(b.data); eng_free(nb.data);
}

Test(eltwise, unary_zero_size_and_scalar) {
    int64_t d0[2] = {0, 5};
    eng_tensor x = mk(ENG_DTYPE_F32, 2, d0), y = mk(ENG_DTYPE_F32, 2, d0);
    krn_unary_params p = {.op = KRN_ACT_EXP};
    cr_assert_eq(run("eltwise_unary", &p, &x, 1, &y, 1), ENG_STATUS_OK);
    eng_tensor s = mk(ENG_DTYPE_F32, 0, d0), t = mk(ENG_DTYPE_F32, 0, d0);
    *(float *)s.data = 1.0f;
    cr_assert_eq(run("eltwise_unary", &p, &s, 1, &t, 1), ENG_STATUS_OK);
    cr_assert_float_eq(*(float *)t.data, (float)M_E, 1e-6);
    eng_free(x.data); eng_free(y.data); eng_free(s.data); eng_free(t.data);
}

/* ---- Where, variadic, Clip, Cast ---- */

Test(eltwise, where_broadcast_all_sizes) {
    const eng_dtype dts[] = {ENG_DTYPE_BOOL, ENG_DTYPE_F16, ENG_DTYPE_F32, ENG_DTYPE_I64};
    int64_t dc[3] = {2, 1, 4}, dx[2] = {3, 4}, dy[1] = {1};
    for (int k = 0; k < 4; k++) {
        for (int variant = 0; variant < 2; variant++) {
            eng_tensor in[3] = {mk(ENG_DTYPE_BOOL, 3, dc), mk(dts[k], variant ? 3 : 2, variant ? dc : dx),
                                mk(dts[k], variant ? 0 : 1, dy)};
            fill(&in[0], 0, 2);
            fill(&in[1], -5, 5);
            fill(&in[2], -5, 5);
            const eng_tensor *ts[3] = {&in[0], &in[1], &in[2]};
            eng_tensor shp = {0};
            cr_assert_eq(eng_broadcast_shapes(ts, 3, &shp), ENG_STATUS_OK);
            eng_tensor out = mk(dts[k], shp.ndim, shp.dims);
            cr_assert_eq(run("eltwise_where", NULL, in, 3, &out, 1), ENG_STATUS_OK, "%s", eng_last_error());
            for (int64_t i = 0; i < eng_tensor_numel(&out); i++) {
                int cnd = (int)eng_tensor_get_i64(&in[0], bidx(&in[0], &out, i));
                double r = cnd ? eng_tensor_get_f64(&in[1], bidx(&in[1], &out, i))
                               : eng_tensor_get_f64(&in[2], bidx(&in[2], &out, i));
                cr_assert_eq(eng_tensor_get_f64(&out, i), r);
            }
            for (int j = 0; j < 3; j++) eng_free(in[j].data);
            eng_free(out.data);
        }
    }
}

Test(eltwise, variadic_sum_mean_min_max) {
    int64_t d1[2] = {3, 4}, d2[1] = {4}, d3[2] = {3, 1};
    const eng_dtype dts[] = {ENG_DTYPE_F32, ENG_DTYPE_F64, ENG_DTYPE_F16, ENG_DTYPE_I32};
    const int ops[][2] = {{KRN_BIN_ADD, 0}, {KRN_BIN_ADD, 1}, {KRN_BIN_MIN, 0}, {KRN_BIN_MAX, 0}};
    for (int k = 0; k < 4; k++)
        for (int o = 0; o < 4; o++)
            for (int nin = 1; nin <= 3; nin++) {
                if (dts[k] == ENG_DTYPE_I32 && ops[o][1]) continue;
                eng_tensor in[3] = {mk(dts[k], 1, d2), mk(dts[k], 2, d1), mk(dts[k], 2, d3)};
                for (int j = 0; j < 3; j++) fill(&in[j], -8, 8);
                const eng_tensor *ts[3] = {&in[0], &in[1], &in[2]};
                eng_tensor shp = {0};
                cr_assert_eq(eng_broadcast_shapes(ts, nin, &shp), ENG_STATUS_OK);
                eng_tensor out = mk(dts[k], shp.ndim, shp.dims);
                krn_variadic_params p = {.op = ops[o][0], .mean = ops[o][1]};
                cr_assert_eq(run("eltwise_variadic", &p, in, nin, &out, 1), ENG_STATUS_OK, "%s", eng_last_error());
                for (int64_t i = 0; i < eng_tensor_numel(&out); i++) {
                    double r = eng_tensor_get_f64(&in[0], bidx(&in[0], &out, i));
                    for (int j = 1; j < nin; j++) {
                        double v = eng_tensor_get_f64(&in[j], bidx(&in[j], &out, i));
                        r = ops[o][0] == KRN_BIN_ADD ? r + v : ops[o][0] == KRN_BIN_MIN ? fmin(r, v) : fmax(r, v);
                    }
                    if (ops[o][1]) r /= nin;
                    cr_assert(fabs(eng_tensor_get_f64(&out, i) - r) <= 1e-2, "variadic %d/%d %s n=%d: %g vs %g", ops[o][0],
                              ops[o][1], eng_dtype_name(dts[k]), nin, eng_tensor_get_f64(&out, i), r);
                }
                for (int j = 0; j < 3; j++) eng_free(in[j].data);
                eng_free(out.data);
            }
}

Test(eltwise, clip_inputs_attrs_ints) {
    int64_t d[1] = {200};
    const eng_dtype dts[] = {ENG_DTYPE_F32, ENG_DTYPE_F64, ENG_DTYPE_F16, ENG_DTYPE_I8, ENG_DTYPE_I64, ENG_DTYPE_U8};
    for (int k = 0; k < 6; k++)
        for (int variant = 0; variant < 4; variant++) {
            int uns = dts[k] == ENG_DTYPE_U8;
            eng_tensor in[3] = {mk(dts[k], 1, d), mk(dts[k], 0, d), mk(dts[k], 0, d)};
            fill(&in[0], uns ? 0 : -100, 100);
            eng_tensor_set_f64(&in[1], 0, uns ? 10 : -20);
            eng_tensor_set_f64(&in[2], 0, 30);
            eng_tensor mn = in[1], mx = in[2];
            if (variant == 1) { in[1].dtype = ENG_DTYPE_UNDEFINED; in[1].data = NULL; }
            if (variant == 2) { in[2].dtype = ENG_DTYPE_UNDEFINED; in[2].data = NULL; }
            eng_tensor out = mk(dts[k], 1, d);
            krn_clip_params p = {.from_inputs = variant != 3, .min = -7, .max = 7};
            cr_assert_eq(run("eltwise_clip", &p, in, variant == 3 ? 1 : 3, &out, 1), ENG_STATUS_OK, "%s", eng_last_error());
            double lo = variant == 3 ? -7 : variant == 1 ? -INFINITY : eng_tensor_get_f64(&mn, 0);
            double hi = variant == 3 ? 7 : variant == 2 ? INFINITY : eng_tensor_get_f64(&mx, 0);
            for (int i = 0; i < 200; i++) {
                double v = eng_tensor_get_f64(&in[0], i), r = v < lo ? lo : v > hi ? hi : v;
                cr_assert_eq(eng_tensor_get_f64(&out, i), r, "clip %s variant %d", eng_dtype_name(dts[k]), variant);
            }
            eng_free(in[0].data); eng_free(mn.data); eng_free(mx.data); eng_free(out.data);
        }
}

Test(eltwise, cast_pairs) {
    const eng_dtype dts[] = {ENG_DTYPE_F32, ENG_DTYPE_F64, ENG_DTYPE_F16, ENG_DTYPE_BF16, ENG_DTYPE_I8, ENG_DTYPE_I16,
                             ENG_DTYPE_I32, ENG_DTYPE_I64, ENG_DTYPE_U8, ENG_DTYPE_U16, ENG_DTYPE_U32, ENG_DTYPE_U64,
                             ENG_DTYPE_BOOL};
    int64_t d[1] = {70000}; /* above the threading threshold */
    for (int s = 0; s < 13; s++)
        for (int t = 0; t < 13; t++) {
            eng_tensor x = mk(dts[s], 1, d), y = mk(dts[t], 1, d);
            int signed_src = dts[s] != ENG_DTYPE_BOOL && !(dts[s] >= ENG_DTYPE_U8 && dts[s] <= ENG_DTYPE_U16) &&
                             dts[s] != ENG_DTYPE_U32 && dts[s] != ENG_DTYPE_U64 && dts[s] != ENG_DTYPE_U8;
            int unsigned_dst = dts[t] == ENG_DTYPE_U8 || dts[t] == ENG_DTYPE_U16 || dts[t] == ENG_DTYPE_U32 ||
                               dts[t] == ENG_DTYPE_U64;
            double lo = (signed_src && !unsigned_dst) ? -100 : 0, hi = dts[s] == ENG_DTYPE_BOOL ? 2 : 100;
            fill(&x, lo, hi);
            if (eng_dtype_is_float(dts[s]))
                for (int i = 0; i < 100; i++) eng_tensor_set_f64(&x, i, (lo + (hi - lo) * rnd()) + 0.37);
            krn_cast_params p = {.to = dts[t]};
            cr_assert_eq(run("eltwise_cast", &p, &x, 1, &y, 4), ENG_STATUS_OK, "%s", eng_last_error());
            for (int64_t i = 0; i < d[0]; i++) {
                double v = eng_tensor_get_f64(&x, i), r;
                if (dts[t] == ENG_DTYPE_BOOL) r = v != 0;
                else if (!eng_dtype_is_float(dts[t])) r = trunc(v);
                else r = v;
                double tol = dts[t] == ENG_DTYPE_F16 ? 1e-3 * fabs(r) : dts[t] == ENG_DTYPE_BF16 ? 4e-3 * fabs(r) : 1e-6 * fabs(r);
                cr_assert(fabs(eng_tensor_get_f64(&y, i) - r) <= tol, "cast %s->%s: %g -> %g, expected %g",
                          eng_dtype_name(dts[s]), eng_dtype_name(dts[t]), v, eng_tensor_get_f64(&y, i), r);
            }
            eng_free(x.data);
            eng_free(y.data);
        }
    /* f32 -> f16/bf16 rounds to nearest even */
    int64_t d1[1] = {2};
    eng_tensor x = mk(ENG_DTYPE_F32, 1, d1), y = mk(ENG_DTYPE_BF16, 1, d1);
    uint32_t bits[2] = {0x3f808000u, 0x3f818000u}; /* exact halves between bf16 neighbours */
    memcpy(x.data, bits, 8);
    krn_cast_params p = {.to = ENG_DTYPE_BF16};
    cr_assert_eq(run("eltwise_cast", &p, &x, 1, &y, 1), ENG_STATUS_OK);
    cr_assert_eq(((uint16_t *)y.data)[0], 0x3f80);
    cr_assert_eq(((uint16_t *)y.data)[1], 0x3f82);
    eng_free(x.data);
    eng_free(y.data);
}

/* ---- op level: prepare + infer through the registry ---- */

static eng_status op_infer(const char *op, int64_t opset, const eng_attr *attrs, int nattr, eng_tensor *in, int nin,
                           eng_tensor *out, void **params) {
    eng_graph *g = eng_graph_new();
    int ins[4], outs[1];
    char name[16];
    for (int i = 0; i < nin; i++) {
        snprintf(name, sizeof name, "in%d", i);
        ins[i] = eng_graph_add_value(g, name);
    }
    outs[0] = eng_graph_add_value(g, "out");
    int nd = eng_graph_add_node(g, "n", op, "", ins, nin, outs, 1);
    for (int i = 0; i < nattr; i++) eng_node_add_attr(g, nd, &attrs[i]);
    const eng_op_def *def = eng_op_find("", op);
    cr_assert(def != NULL, "op %s not registered", op);
    eng_op_ctx c = {.graph = g, .node = &g->nodes[nd], .opset = opset, .in = in, .nin = nin, .out = out, .nout = 1};
    eng_status st = def->prepare ? def->prepare(&c) : ENG_STATUS_OK;
    if (st == ENG_STATUS_OK) st = def->infer(&c);
    if (params) *params = c.params;
    else free(c.params);
    eng_graph_free(&g);
    return st;
}

Test(eltwise, op_old_broadcast_axis) {
    eng_tensor in[2] = {{.dtype = ENG_DTYPE_F32, .ndim = 4, .dims = {2, 3, 4, 5}},
                        {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {3, 4}}};
    eng_tensor out = {0};
    eng_attr at[2] = {{.name = "broadcast", .type = ENG_ATTR_INT, .i = 1}, {.name = "axis", .type = ENG_ATTR_INT, .i = 1}};
    void *params = NULL;
    cr_assert_eq(op_infer("Add", 6, at, 2, in, 2, &out, &params), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(out.ndim, 4);
    cr_assert_eq(out.dims[3], 5);
    krn_binary_params *p = params;
    cr_assert(p->b_override && p->b_ndim == 4 && p->b_dims[0] == 1 && p->b_dims[1] == 3 && p->b_dims[2] == 4 &&
              p->b_dims[3] == 1);
    /* run it: B [3,4] aligned at axis 1 */
    eng_tensor a = mk(ENG_DTYPE_F32, 4, in[0].dims), b = mk(ENG_DTYPE_F32, 2, in[1].dims), o = mk(ENG_DTYPE_F32, 4, in[0].dims);
    fill(&a, -1, 1);
    fill(&b, -1, 1);
    eng_tensor io[2] = {a, b};
    cr_assert_eq(run("eltwise_binary", p, io, 2, &o, 1), ENG_STATUS_OK);
    for (int64_t i = 0; i < 120; i++) {
        int64_t k = (i / 5) % 12;
        cr_assert_float_eq(((float *)o.data)[i], ((float *)a.data)[i] + ((float *)b.data)[k], 1e-6);
    }
    free(params);
    eng_free(a.data); eng_free(b.data); eng_free(o.data);
    /* modern opset: plain numpy broadcasting, mismatches are errors naming both shapes */
    in[1].ndim = 1;
    in[1].dims[0] = 4;
    cr_assert_neq(op_infer("Mul", 13, NULL, 0, in, 2, &out, NULL), ENG_STATUS_OK);
    cr_assert(strstr(eng_last_error(), "[2,3,4,5]") != NULL, "%s", eng_last_error());
    in[1].dims[0] = 5;
    cr_assert_eq(op_infer("Greater", 13, NULL, 0, in, 2, &out, NULL), ENG_STATUS_OK);
    cr_assert_eq(out.dtype, ENG_DTYPE_BOOL);
}

Test(eltwise, op_infer_dtypes_and_errors) {
    eng_tensor in[3] = {{.dtype = ENG_DTYPE_I32, .ndim = 1, .dims = {3}}, {.dtype = ENG_DTYPE_F32, .ndim = 1, .dims = {3}},
                        {.dtype = ENG_DTYPE_F32, .ndim = 0}};
    eng_tensor out = {0};
    cr_assert_eq(op_infer("Add", 14, NULL, 0, in, 2, &out, NULL), ENG_STATUS_INVALID_MODEL);
    cr_assert_eq(op_infer("Pow", 15, NULL, 0, in, 2, &out, NULL), ENG_STATUS_OK);
    cr_assert_eq(out.dtype, ENG_DTYPE_I32);
    cr_assert_eq(op_infer("Exp", 13, NULL, 0, in, 1, &out, NULL), ENG_STATUS_UNSUPPORTED);
    eng_attr to = {.name = "to", .type = ENG_ATTR_INT, .i = ENG_DTYPE_STRING};
    cr_assert_eq(op_infer("Cast", 13, &to, 1, in, 1, &out, NULL), ENG_STATUS_UNSUPPORTED);
    to.i = ENG_DTYPE_F16;
    cr_assert_eq(op_infer("Cast", 13, &to, 1, in, 1, &out, NULL), ENG_STATUS_OK);
    cr_assert_eq(out.dtype, ENG_DTYPE_F16);
    cr_assert_eq(op_infer("CastLike", 15, NULL, 0, in, 2, &out, NULL), ENG_STATUS_OK);
    cr_assert_eq(out.dtype, ENG_DTYPE_F32);
    eng_tensor w[3] = {{.dtype = ENG_DTYPE_BOOL, .ndim = 2, .dims = {2, 1}}, in[1], in[2]};
    cr_assert_eq(op_infer("Where", 16, NULL, 0, w, 3, &out, NULL), ENG_STATUS_OK);
    cr_assert(out.ndim == 2 && out.dims[0] == 2 && out.dims[1] == 3);
    eng_tensor pr[2] = {{.dtype = ENG_DTYPE_F32, .ndim = 4, .dims = {2, 3, 4, 5}}, {.dtype = ENG_DTYPE_F32, .ndim = 1, .dims = {3}}};
    void *params = NULL;
    cr_assert_eq(op_infer("PRelu", 6, NULL, 0, pr, 2, &out, &params), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert(((krn_binary_params *)params)->b_override);
    free(params);
    eng_attr g = {.name = "approximate", .type = ENG_ATTR_STRING, .s = "tanh", .s_len = 4};
    cr_assert_eq(op_infer("Gelu", 20, &g, 1, in + 1, 1, &out, &params), ENG_STATUS_OK);
    cr_assert_eq(((krn_unary_params *)params)->op, KRN_ACT_GELU_TANH);
    free(params);
}
