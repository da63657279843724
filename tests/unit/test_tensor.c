/* test_tensor.c - unit tests of the "tensor" op family (engine/ops/tensor*.c + kernels/cpu/tensor*.c).
 *
 * Each test runs an op the way the planner does (prepare -> infer -> CPU kernel, or infer only for ALIAS ops)
 * and compares with a small reference written independently here: every permutation of a rank-4 transpose
 * (several element sizes, tiled and memcpy paths), slices with negative steps and clamped bounds, Pad in all
 * modes, gathers/scatters with negative indices, and out-of-range indices that must fail with a message.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "engine/ops/op.h"
#include "kernels/kernel.h"
#include "kernels/krn-tensor.h"

/* ---- harness ---- */

static eng_attr a_ints(const char *name, const int64_t *v, int n) {
    eng_attr a = {.name = (char *)name, .type = ENG_ATTR_INTS, .ints = (int64_t *)v, .n = n};
    return a;
}
static eng_attr a_int(const char *name, int64_t v) {
    eng_attr a = {.name = (char *)name, .type = ENG_ATTR_INT, .i = v};
    return a;
}
static eng_attr a_str(const char *name, const char *s) {
    eng_attr a = {.name = (char *)name, .type = ENG_ATTR_STRING, .s = (char *)s, .s_len = strlen(s)};
    return a;
}

static eng_tensor mk(eng_dtype dt, int ndim, const int64_t *dims, void *data) {
    eng_tensor t = {.dtype = dt, .ndim = ndim, .data = data};
    for (int i = 0; i < ndim; i++) t.dims[i] = dims[i];
    return t;
}

/* Runs op; outputs get malloc'd data (caller frees with free_outs). */
static eng_status run_op(const char *op, int64_t opset, eng_attr *attrs, int nattr, eng_tensor *in, int nin,
                         eng_tensor *out, int nout) {
    const eng_op_def *d = eng_op_find("", op);
    cr_assert(d != NULL, "op %s not registered", op);
    int ids[16] = {0};
    eng_node node = {.name = "t", .op_type = (char *)op, .domain = "", .inputs = ids, .nin = nin, .outputs = ids,
                     .nout = nout, .attrs = attrs, .nattr = nattr};
    eng_op_ctx c = {.node = &node, .opset = opset, .in = in, .nin = nin, .out = out, .nout = nout};
    for (int j = 0; j < nout; j++) memset(&out[j], 0, sizeof out[j]);
    eng_status st = d->prepare ? d->prepare(&c) : ENG_STATUS_OK;
    if (st == ENG_STATUS_OK) st = d->infer(&c);
    if (st == ENG_STATUS_OK) {
        for (int j = 0; j < nout; j++) out[j].data = calloc(1, eng_tensor_nbytes(&out[j]) + 16);
        if (d->flags & ENG_OP_ALIAS) memcpy(out[0].data, in[0].data, eng_tensor_nbytes(&out[0]));
        else {
            const krn_kernel *k = krn_backend_find(krn_backend_cpu(), d->kernel);
            cr_assert(k != NULL, "kernel %s missing", d->kernel);
            krn_call kc = {.params = c.params, .in = in, .nin = nin, .out = out, .nout = nout, .nthreads = 2};
            if (k->init) st = k->init(&kc);
            if (st == ENG_STATUS_OK) st = k->exec(&kc);
            if (k->free_state) k->free_state(kc.state);
        }
    }
    if (d->free_params) d->free_params(c.params);
    else free(c.params);
    return st;
}

static void free_outs(eng_tensor *out, int n) {
    for (int j = 0; j < n; j++) {
        free(out[j].data);
        out[j].data = NULL;
    }
}

static float *iota_f(int64_t n) {
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = (float)i;
    return v;
}

/* ---- Transpose ---- */

static void ref_transpose(const char *src, char *dst, size_t es, int n, const int64_t *dims, const int *perm) {
    int64_t st[8], od[8], total = 1;
    for (int i = n - 1, s = 1; i >= 0; i--) {
        st[i] = s;
        s *= (int)dims[i];
    }
    for (int k = 0; k < n; k++) {
        od[k] = dims[perm[k]];
        total *= od[k];
    }
    for (int64_t o = 0; o < total; o++) {
        int64_t rem = o, off = 0;
        for (int k = n - 1; k >= 0; k--) {
            off += (rem % od[k]) * st[perm[k]];
            rem /= od[k];
        }
        memcpy(dst + o * es, src + off * es, es);
    }
}

static int next_perm(int *p, int n) {
    int i = n - 2;
    while (i >= 0 && p[i] >= p[i + 1]) i--;
    if (i < 0) return 0;
    int j = n - 1;
    while (p[j] <= p[i]) j--;
    int t = p[i];
    p[i] = p[j];
    p[j] = t;
    for (int a = i + 1, b = n - 1; a < b; a++, b--) {
        t = p[a];
        p[a] = p[b];
        p[b] = t;
    }
    return 1;
}

static void check_all_perms(const int64_t *dims, size_t es) {
    int64_t n = dims[0] * dims[1] * dims[2] * dims[3];
    unsigned char *src = malloc((size_t)n * es), *a = malloc((size_t)n * es), *b = malloc((size_t)n * es);
    for (int64_t i = 0; i < n * (int64_t)es; i++) src[i] = (unsigned char)(i * 7 + i / 251);
    int perm[4] = {0, 1, 2, 3}, count = 0;
    do {
        memset(a, 0xAB, (size_t)n * es);
        ref_transpose((char *)src, (char *)b, es, 4, dims, perm);
        cr_assert_eq(krn_cpu_transpose(src, a, es, 4, dims, perm, 2), ENG_STATUS_OK);
        cr_assert(memcmp(a, b, (size_t)n * es) == 0, "perm %d%d%d%d dims %lldx%lldx%lldx%lld es %zu differs", perm[0],
                  perm[1], perm[2], perm[3], (long long)dims[0], (long long)dims[1], (long long)dims[2],
                  (long long)dims[3], es);
        count++;
    } while (next_perm(perm, 4));
    cr_assert_eq(count, 24);
    free(src);
    free(a);
    free(b);
}

Test(transpose, all_rank4_permutations_small) {
    const int64_t dims[4] = {2, 3, 4, 5};
    size_t sizes[] = {1, 2, 4, 8, 3};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) check_all_perms(dims, sizes[i]);
}

Test(transpose, all_rank4_permutations_large_and_unit_dims) {
    const int64_t big[4] = {3, 67, 2, 45}, ones[4] = {1, 33, 1, 40};
    check_all_perms(big, 4);
    check_all_perms(big, 2);
    check_all_perms(ones, 4);
    check_all_perms(ones, 8);
}

Test(transpose, op_default_perm_and_bad_perm) {
    int64_t dims[3] = {2, 3, 4};
    float *x = iota_f(24);
    eng_tensor in = mk(ENG_DTYPE_F32, 3, dims, x), out;
    cr_assert_eq(run_op("Transpose", 13, NULL, 0, &in, 1, &out, 1), ENG_STATUS_OK);
    cr_assert_eq(out.ndim, 3);
    cr_assert(out.dims[0] == 4 && out.dims[1] == 3 && out.dims[2] == 2);
    float *y = out.data; /* y[k][j][i] = x[i][j][k] */
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 4; k++) cr_assert_eq(y[(k * 3 + j) * 2 + i], x[(i * 3 + j) * 4 + k]);
    free_outs(&out, 1);
    int64_t bad[3] = {0, 0, 1};
    eng_attr at = a_ints("perm", bad, 3);
    cr_assert_eq(run_op("Transpose", 13, &at, 1, &in, 1, &out, 1), ENG_STATUS_INVALID_ARGUMENT);
    int bp[3] = {0, 2, 2};
    float tmp[24];
    cr_assert_eq(krn_cpu_transpose(x, tmp, 4, 3, dims, bp, 1), ENG_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(eng_last_error(), "perm") != NULL);
    free(x);
}

/* ---- Slice ---- */

/* Python/numpy slice semantics for one axis: fills idx, returns count. */
static int ref_slice_axis(int64_t dim, int64_t s, int64_t e, int64_t st, int64_t *idx) {
    if (s < 0) s += dim;
    if (e < 0) e += dim;
    int n = 0;
    if (st > 0) {
        if (s < 0) s = 0;
        if (e > dim) e = dim;
        for (int64_t i = s; i < e; i += st) idx[n++] = i;
    } else {
        if (s > dim - 1) s = dim - 1;
        if (e < -1) e = -1;
        for (int64_t i = s; i > e; i += st) idx[n++] = i;
    }
    return n;
}

static void check_slice2d(int64_t r, int64_t cdim, const int64_t *starts, const int64_t *ends, const int64_t *steps) {
    int64_t dims[2] = {r, cdim}, two = 2;
    float *x = iota_f(r * cdim);
    int64_t axes[2] = {0, -1};
    eng_tensor in[5] = {mk(ENG_DTYPE_F32, 2, dims, x), mk(ENG_DTYPE_I64, 1, &two, (void *)starts),
                        mk(ENG_DTYPE_I64, 1, &two, (void *)ends), mk(ENG_DTYPE_I64, 1, &two, axes),
                        mk(ENG_DTYPE_I64, 1, &two, (void *)steps)};
    eng_tensor out;
    cr_assert_eq(run_op("Slice", 13, NULL, 0, in, 5, &out, 1), ENG_STATUS_OK, "%s", eng_last_error());
    int64_t i0[64], i1[64];
    int n0 = ref_slice_axis(r, starts[0], ends[0], steps[0], i0);
    int n1 = ref_slice_axis(cdim, starts[1], ends[1], steps[1], i1);
    cr_assert(out.dims[0] == n0 && out.dims[1] == n1, "slice shape [%lld,%lld] expected [%d,%d]",
              (long long)out.dims[0], (long long)out.dims[1], n0, n1);
    float *y = out.data;
    for (int a = 0; a < n0; a++)
        for (int b = 0; b < n1; b++) cr_assert_eq(y[a * n1 + b], x[i0[a] * cdim + i1[b]]);
    free_outs(&out, 1);
    free(x);
}

Test(slice, negative_steps_and_clamping) {
    const int64_t big = INT64_MAX, small = INT64_MIN;
    struct { int64_t s[2], e[2], st[2]; } cases[] = {
        {{0, 0}, {big, big}, {1, 1}},      {{-1, -1}, {small, small}, {-1, -1}}, {{4, 7}, {0, 1}, {-2, -3}},
        {{-100, 2}, {100, -1}, {2, 1}},    {{3, 5}, {3, 5}, {1, -1}},            {{10, 10}, {-10, -10}, {-1, -4}},
        {{1, -3}, {-1, big}, {1, 2}},      {{-2, 8}, {-6, 2}, {-3, -2}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_slice2d(6, 9, cases[i].s, cases[i].e, cases[i].st);
}

Test(slice, opset1_attrs_and_zero_step_error) {
    int64_t dims[2] = {3, 4};
    float *x = iota_f(12);
    int64_t s[1] = {1}, e[1] = {3}, ax[1] = {1};
    eng_attr at[3] = {a_ints("starts", s, 1), a_ints("ends", e, 1), a_ints("axes", ax, 1)};
    eng_tensor in = mk(ENG_DTYPE_F32, 2, dims, x), out;
    cr_assert_eq(run_op("Slice", 1, at, 3, &in, 1, &out, 1), ENG_STATUS_OK);
    cr_assert(out.dims[0] == 3 && out.dims[1] == 2);
    cr_assert_eq(((float *)out.data)[5], 10.0f);
    free_outs(&out, 1);
    int64_t one = 1, zero = 0;
    eng_tensor in2[5] = {in, mk(ENG_DTYPE_I64, 1, &one, s), mk(ENG_DTYPE_I64, 1, &one, e),
                         mk(ENG_DTYPE_I64, 1, &one, ax), mk(ENG_DTYPE_I64, 1, &one, &zero)};
    cr_assert_eq(run_op("Slice", 13, NULL, 0, in2, 5, &out, 1), ENG_STATUS_INVALID_ARGUMENT);
    in2[1].data = NULL;
    cr_assert_eq(run_op("Slice", 13, NULL, 0, in2, 5, &out, 1), ENG_STATUS_NEEDS_DATA);
    free(x);
}

/* ---- Pad ---- */

static int64_t ref_pad_src(int64_t i, int64_t n, const char *mode) {
    if (i >= 0 && i < n) return i;
    if (!strcmp(mode, "constant")) return -1;
    if (!strcmp(mode, "edge")) return i < 0 ? 0 : n - 1;
    if (!strcmp(mode, "wrap")) {
        while (i < 0) i += n;
        return i % n;
    }
    /* reflect: bounce off the ends until inside */
    while (i < 0 || i >= n) {
        if (i < 0) i = -i;
        if (i >= n) i = 2 * (n - 1) - i;
    }
    return i;
}

Test(pad, all_modes_2d_with_negative_pads) {
    const char *modes[] = {"constant", "reflect", "edge", "wrap"};
    int64_t dims[2] = {3, 4}, four = 4;
    int64_t padsets[][4] = {{1, 2, 2, 3}, {0, 3, 0, 0}, {2, 0, 1, 2}, {-1, 1, 0, -2}, {0, 0, 0, 0}};
    float *x = iota_f(12), cv = 9.5f;
    for (size_t m = 0; m < 4; m++)
        for (size_t q = 0; q < sizeof padsets / sizeof padsets[0]; q++) {
            int64_t *pads = padsets[q];
            eng_attr at = a_str("mode", modes[m]);
            eng_tensor in[3] = {mk(ENG_DTYPE_F32, 2, dims, x), mk(ENG_DTYPE_I64, 1, &four, pads),
                                mk(ENG_DTYPE_F32, 0, NULL, &cv)};
            eng_tensor out;
            cr_assert_eq(run_op("Pad", 13, &at, 1, in, 3, &out, 1), ENG_STATUS_OK, "%s", eng_last_error());
            int64_t R = 3 + pads[0] + pads[2], C = 4 + pads[1] + pads[3];
            cr_assert(out.dims[0] == R && out.dims[1] == C);
            float *y = out.data;
            for (int64_t i = 0; i < R; i++)
                for (int64_t j = 0; j < C; j++) {
                    int64_t si = ref_pad_src(i - pads[0], 3, modes[m]), sj = ref_pad_src(j - pads[1], 4, modes[m]);
                    float want = (si < 0 || sj < 0) ? cv : x[si * 4 + sj];
                    cr_assert_eq(y[i * C + j], want, "mode %s pads set %zu at (%lld,%lld): %g vs %g", modes[m], q,
                                 (long long)i, (long long)j, y[i * C + j], want);
                }
            free_outs(&out, 1);
        }
    free(x);
}

Test(pad, opset2_attrs_and_opset18_axes) {
    int64_t dims[2] = {2, 2}, pads2[4] = {0, 1, 0, 1};
    int32_t x[4] = {1, 2, 3, 4};
    eng_attr at[2] = {a_ints("pads", pads2, 4), {.name = "value", .type = ENG_ATTR_FLOAT, .f = 7.0f}};
    eng_tensor in = mk(ENG_DTYPE_I32, 2, dims, x), out;
    cr_assert_eq(run_op("Pad", 2, at, 2, &in, 1, &out, 1), ENG_STATUS_OK);
    int32_t want[8] = {7, 1, 2, 7, 7, 3, 4, 7};
    cr_assert(out.dims[1] == 4 && memcmp(out.data, want, sizeof want) == 0);
    free_outs(&out, 1);
    int64_t p18[2] = {1, 1}, ax[1] = {-1}, two = 2, one = 1;
    eng_tensor in18[4] = {in, mk(ENG_DTYPE_I64, 1, &two, p18), {0}, mk(ENG_DTYPE_I64, 1, &one, ax)};
    eng_attr md = a_str("mode", "edge");
    cr_assert_eq(run_op("Pad", 18, &md, 1, in18, 4, &out, 1), ENG_STATUS_OK, "%s", eng_last_error());
    int32_t want18[8] = {1, 1, 2, 2, 3, 3, 4, 4};
    cr_assert(out.dims[0] == 2 && out.dims[1] == 4 && memcmp(out.data, want18, sizeof want18) == 0);
    free_outs(&out, 1);
}

/* ---- Gather family ---- */

Test(gather, negative_indices_every_axis_and_dtype) {
    int64_t dims[3] = {3, 4, 5}, idims[2] = {2, 2};
    double *x = malloc(60 * sizeof *x);
    for (int i = 0; i < 60; i++) x[i] = i * 1.5;
    for (int axis = 0; axis < 3; axis++) {
        int32_t ind[4] = {0, -1, 2, -3};
        eng_attr at = a_int("axis", axis - 3 * (axis == 2));
        eng_tensor in[2] = {mk(ENG_DTYPE_F64, 3, dims, x), mk(ENG_DTYPE_I32, 2, idims, ind)}, out;
        cr_assert_eq(run_op("Gather", 13, &at, 1, in, 2, &out, 1), ENG_STATUS_OK, "%s", eng_last_error());
        cr_assert_eq(out.ndim, 4);
        double *y = out.data;
        int64_t n = eng_tensor_numel(&out), od[4];
        memcpy(od, out.dims, sizeof od);
        for (int64_t o = 0; o < n; o++) {
            int64_t c[4], rem = o;
            for (int k = 3; k >= 0; k--) {
                c[k] = rem % od[k];
                rem /= od[k];
            }
            int64_t src[3], j = 0;
            for (int d = 0; d < 3; d++) {
                if (d == axis) {
                    int64_t v = ind[c[j] * 2 + c[j + 1]];
                    src[d] = v < 0 ? v + dims[d] : v;
                    j += 2;
                } else src[d] = c[j++];
            }
            cr_assert_eq(y[o], x[(src[0] * 4 + src[1]) * 5 + src[2]]);
        }
        free_outs(&out, 1);
    }
    free(x);
}

Test(gather, out_of_range_index_is_an_error) {
    int64_t dims[2] = {3, 2}, n = 3;
    float x[6] = {0};
    int64_t ind[3] = {0, 3, 1};
    eng_tensor in[2] = {mk(ENG_DTYPE_F32, 2, dims, x), mk(ENG_DTYPE_I64, 1, &n, ind)}, out;
    cr_assert_eq(run_op("Gather", 13, NULL, 0, in, 2, &out, 1), ENG_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(eng_last_error(), "index 3") != NULL, "message: %s", eng_last_error());
    free_outs(&out, 1);
    ind[1] = -4;
    cr_assert_eq(run_op("Gather", 13, NULL, 0, in, 2, &out, 1), ENG_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(eng_last_error(), "index -4") != NULL, "message: %s", eng_last_error());
    free_outs(&out, 1);
    /* GatherElements and ScatterElements too */
    int64_t id2[2] = {1, 2};
    int64_t ind2[2] = {0, 5};
    float upd[2] = {1, 2};
    eng_tensor ge[3] = {mk(ENG_DTYPE_F32, 2, dims, x), mk(ENG_DTYPE_I64, 2, id2, ind2), mk(ENG_DTYPE_F32, 2, id2, upd)};
    eng_attr ax = a_int("axis", 1);
    cr_assert_eq(run_op("GatherElements", 13, &ax, 1, ge, 2, &out, 1), ENG_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(eng_last_error(), "index 5") != NULL, "message: %s", eng_last_error());
    free_outs(&out, 1);
    cr_assert_eq(run_op("ScatterElements", 16, &ax, 1, ge, 3, &out, 1), ENG_STATUS_INVALID_ARGUMENT);
    free_outs(&out, 1);
    int64_t nd_d[2] = {1, 1}, nd_i[1] = {-4};
    eng_tensor gnd[2] = {mk(ENG_DTYPE_F32, 2, dims, x), mk(ENG_DTYPE_I64, 2, nd_d, nd_i)};
    cr_assert_eq(run_op("GatherND", 13, NULL, 0, gnd, 2, &out, 1), ENG_STATUS_INVALID_ARGUMENT);
    free_outs(&out, 1);
}

Test(gather, elements_and_nd_negative_indices) {
    int64_t dims[2] = {2, 3};
    int32_t x[6] = {1, 2, 3, 4, 5, 6};
    int64_t ind[4] = {-1, 0, 1, -2};
    int64_t id[2] = {2, 2};
    eng_attr ax = a_int("axis", 1);
    eng_tensor in[2] = {mk(ENG_DTYPE_I32, 2, dims, x), mk(ENG_DTYPE_I64, 2, id, ind)}, out;
    cr_assert_eq(run_op("GatherElements", 13, &ax, 1, in, 2, &out, 1), ENG_STATUS_OK);
    int32_t want[4] = {3, 1, 5, 5};
    cr_assert(memcmp(out.data, want, sizeof want) == 0);
    free_outs(&out, 1);
    /* GatherND with batch_dims = 1: data [2,3], indices [2,1] -> out [2] */
    int64_t ndd[2] = {2, 1}, ndi[2] = {-1, 1};
    eng_attr bd = a_int("batch_dims", 1);
    eng_tensor nd[2] = {mk(ENG_DTYPE_I32, 2, dims, x), mk(ENG_DTYPE_I64, 2, ndd, ndi)};
    cr_assert_eq(run_op("GatherND", 13, &bd, 1, nd, 2, &out, 1), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert(out.ndim == 1 && out.dims[0] == 2);
    cr_assert(((int32_t *)out.data)[0] == 3 && ((int32_t *)out.data)[1] == 5);
    free_outs(&out, 1);
}

Test(scatter, elements_reductions_and_nd) {
    int64_t dims[1] = {5}, n = 3;
    float x[5] = {1, 2, 3, 4, 5}, upd[3] = {10, 20, 30};
    int64_t ind[3] = {1, -1, 1};
    eng_tensor in[3] = {mk(ENG_DTYPE_F32, 1, dims, x), mk(ENG_DTYPE_I64, 1, &n, ind), mk(ENG_DTYPE_F32, 1, &n, upd)},
               out;
    const char *red[] = {"none", "add", "mul", "max", "min"};
    float want[5][5] = {{1, 30, 3, 4, 20}, {1, 42, 3, 4, 25}, {1, 600, 3, 4, 100}, {1, 30, 3, 4, 20}, {1, 2, 3, 4, 5}};
    for (int r = 0; r < 5; r++) {
        eng_attr at = a_str("reduction", red[r]);
        cr_assert_eq(run_op("ScatterElements", 18, &at, 1, in, 3, &out, 1), ENG_STATUS_OK);
        cr_assert(memcmp(out.data, want[r], sizeof want[r]) == 0, "reduction %s", red[r]);
        free_outs(&out, 1);
    }
    /* ScatterND: data [4,2], indices [[-1],[0]] (2x1), updates [2,2] */
    int64_t dd[2] = {4, 2}, idd[2] = {2, 1}, ud[2] = {2, 2};
    int64_t ndi[2] = {-1, 0};
    int64_t data[8] = {0, 1, 2, 3, 4, 5, 6, 7}, u2[4] = {10, 11, 12, 13};
    eng_tensor snd[3] = {mk(ENG_DTYPE_I64, 2, dd, data), mk(ENG_DTYPE_I64, 2, idd, ndi), mk(ENG_DTYPE_I64, 2, ud, u2)};
    eng_attr add = a_str("reduction", "add");
    cr_assert_eq(run_op("ScatterND", 16, &add, 1, snd, 3, &out, 1), ENG_STATUS_OK, "%s", eng_last_error());
    int64_t w2[8] = {12, 14, 2, 3, 4, 5, 16, 18};
    cr_assert(memcmp(out.data, w2, sizeof w2) == 0);
    free_outs(&out, 1);
    ndi[0] = 4;
    cr_assert_eq(run_op("ScatterND", 16, &add, 1, snd, 3, &out, 1), ENG_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(eng_last_error(), "index 4") != NULL, "message: %s", eng_last_error());
    free_outs(&out, 1);
}

/* ---- shape ops ---- */

Test(shape_ops, reshape_squeeze_unsqueeze_flatten) {
    int64_t dims[3] = {2, 3, 4}, three = 3;
    float *x = iota_f(24);
    int64_t shp[3] = {0, -1, 2};
    eng_tensor in[2] = {mk(ENG_DTYPE_F32, 3, dims, x), mk(ENG_DTYPE_I64, 1, &three, shp)}, out;
    cr_assert_eq(run_op("Reshape", 14, NULL, 0, in, 2, &out, 1), ENG_STATUS_OK);
    cr_assert(out.ndim == 3 && out.dims[0] == 2 && out.dims[1] == 6 && out.dims[2] == 2);
    free_outs(&out, 1);
    int64_t shp0[3] = {0, 4, 6};
    in[1].data = shp0;
    eng_attr az = a_int("allowzero", 1);
    cr_assert_eq(run_op("Reshape", 14, &az, 1, in, 2, &out, 1), ENG_STATUS_INVALID_ARGUMENT);
    int64_t sq_d[4] = {1, 3, 1, 2}, ax[1] = {-2}, one = 1;
    eng_tensor sq[2] = {mk(ENG_DTYPE_F32, 4, sq_d, x), mk(ENG_DTYPE_I64, 1, &one, ax)};
    cr_assert_eq(run_op("Squeeze", 13, NULL, 0, sq, 2, &out, 1), ENG_STATUS_OK);
    cr_assert(out.ndim == 3 && out.dims[0] == 1 && out.dims[1] == 3 && out.dims[2] == 2);
    free_outs(&out, 1);
    cr_assert_eq(run_op("Squeeze", 13, NULL, 0, sq, 1, &out, 1), ENG_STATUS_OK);
    cr_assert(out.ndim == 2 && out.dims[0] == 3 && out.dims[1] == 2);
    free_outs(&out, 1);
    int64_t uax[2] = {0, -1};
    eng_attr ua = a_ints("axes", uax, 2);
    cr_assert_eq(run_op("Unsqueeze", 11, &ua, 1, in, 1, &out, 1), ENG_STATUS_OK);
    cr_assert(out.ndim == 5 && out.dims[0] == 1 && out.dims[4] == 1 && out.dims[1] == 2);
    free_outs(&out, 1);
    eng_attr fa = a_int("axis", -1);
    cr_assert_eq(run_op("Flatten", 13, &fa, 1, in, 1, &out, 1), ENG_STATUS_OK);
    cr_assert(out.ndim == 2 && out.dims[0] == 6 && out.dims[1] == 4);
    free_outs(&out, 1);
    eng_attr sa[2] = {a_int("start", -2), a_int("end", 100)};
    cr_assert_eq(run_op("Shape", 15, sa, 2, in, 1, &out, 1), ENG_STATUS_OK);
    cr_assert(out.dims[0] == 2 && ((int64_t *)out.data)[0] == 3 && ((int64_t *)out.data)[1] == 4);
    free_outs(&out, 1);
    free(x);
}

Test(movement, concat_split_tile_expand) {
    int64_t d1[2] = {2, 3}, d2[2] = {2, 1};
    float a[6] = {1, 2, 3, 4, 5, 6}, b[2] = {7, 8};
    eng_attr ax = a_int("axis", -1);
    eng_tensor in[2] = {mk(ENG_DTYPE_F32, 2, d1, a), mk(ENG_DTYPE_F32, 2, d2, b)}, out, parts[3];
    cr_assert_eq(run_op("Concat", 13, &ax, 1, in, 2, &out, 1), ENG_STATUS_OK);
    float w[8] = {1, 2, 3, 7, 4, 5, 6, 8};
    cr_assert(out.dims[1] == 4 && memcmp(out.data, w, sizeof w) == 0);
    /* Split-18 num_outputs=3 of a 4-wide axis: 2,2,0? no: ceil(4/3)=2 -> 2,2,0 */
    eng_attr sa[2] = {a_int("axis", 1), a_int("num_outputs", 3)};
    eng_tensor sin = out;
    cr_assert_eq(run_op("Split", 18, sa, 2, &sin, 1, parts, 3), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert(parts[0].dims[1] == 2 && parts[1].dims[1] == 2 && parts[2].dims[1] == 0);
    float p1[4] = {3, 7, 6, 8};
    cr_assert(memcmp(parts[1].data, p1, sizeof p1) == 0);
    free_outs(parts, 3);
    free_outs(&out, 1);
    int64_t two = 2, rep[2] = {2, 3};
    eng_tensor tin[2] = {mk(ENG_DTYPE_F32, 2, d2, b), mk(ENG_DTYPE_I64, 1, &two, rep)};
    cr_assert_eq(run_op("Tile", 13, NULL, 0, tin, 2, &out, 1), ENG_STATUS_OK);
    cr_assert(out.dims[0] == 4 && out.dims[1] == 3);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++) cr_assert_eq(((float *)out.data)[i * 3 + j], b[i % 2]);
    free_outs(&out, 1);
    int64_t es[3] = {3, 1, 4}, three = 3;
    eng_tensor ein[2] = {mk(ENG_DTYPE_F32, 2, d2, b), mk(ENG_DTYPE_I64, 1, &three, es)};
    cr_assert_eq(run_op("Expand", 13, NULL, 0, ein, 2, &out, 1), ENG_STATUS_OK);
    cr_assert(out.ndim == 3 && out.dims[0] == 3 && out.dims[1] == 2 && out.dims[2] == 4);
    for (int i = 0; i < 24; i++) cr_assert_eq(((float *)out.data)[i], b[(i / 4) % 2]);
    free_outs(&out, 1);
}

Test(movement, depth_to_space_and_back) {
    int64_t dims[4] = {1, 8, 2, 3};
    float *x = iota_f(48);
    const char *modes[2] = {"DCR", "CRD"};
    for (int m = 0; m < 2; m++) {
        eng_attr at[2] = {a_int("blocksize", 2), a_str("mode", modes[m])};
        eng_tensor in = mk(ENG_DTYPE_F32, 4, dims, x), out, back;
        cr_assert_eq(run_op("DepthToSpace", 13, at, 2, &in, 1, &out, 1), ENG_STATUS_OK);
        cr_assert(out.dims[1] == 2 && out.dims[2] == 4 && out.dims[3] == 6);
        float *y = out.data;
        for (int c = 0; c < 2; c++)
            for (int h = 0; h < 4; h++)
                for (int w = 0; w < 6; w++) {
                    int bh = h % 2, bw = w % 2;
                    int ic = m == 0 ? (bh * 2 + bw) * 2 + c : c * 4 + bh * 2 + bw;
                    cr_assert_eq(y[(c * 4 + h) * 6 + w], x[(ic * 2 + h / 2) * 3 + w / 2]);
                }
        if (m == 0) {
            eng_attr bs = a_int("blocksize", 2);
            cr_assert_eq(run_op("SpaceToDepth", 13, &bs, 1, &out, 1, &back, 1), ENG_STATUS_OK);
            cr_assert(memcmp(back.data, x, 48 * sizeof(float)) == 0);
            free_outs(&back, 1);
        }
        free_outs(&out, 1);
    }
    free(x);
}

Test(misc, dropout_trilu_onehot_range_nonzero) {
    int64_t dims[2] = {3, 3};
    float *x = iota_f(9);
    eng_tensor in = mk(ENG_DTYPE_F32, 2, dims, x), outs[2];
    cr_assert_eq(run_op("Dropout", 13, NULL, 0, &in, 1, outs, 2), ENG_STATUS_OK);
    cr_assert(memcmp(outs[0].data, x, 36) == 0 && outs[1].dtype == ENG_DTYPE_BOOL);
    for (int i = 0; i < 9; i++) cr_assert_eq(((uint8_t *)outs[1].data)[i], 1);
    free_outs(outs, 2);
    float ratio = 0.5f;
    uint8_t tm = 1;
    eng_tensor din[3] = {in, mk(ENG_DTYPE_F32, 0, NULL, &ratio), mk(ENG_DTYPE_BOOL, 0, NULL, &tm)};
    cr_assert_eq(run_op("Dropout", 13, NULL, 0, din, 3, outs, 1), ENG_STATUS_UNSUPPORTED);
    ratio = 0;
    cr_assert_eq(run_op("Dropout", 13, NULL, 0, din, 3, outs, 1), ENG_STATUS_OK);
    free_outs(outs, 1);
    int64_t k = -1;
    eng_attr lo = a_int("upper", 0);
    eng_tensor tin[2] = {in, mk(ENG_DTYPE_I64, 0, NULL, &k)};
    cr_assert_eq(run_op("Trilu", 14, &lo, 1, tin, 2, outs, 1), ENG_STATUS_OK);
    float wt[9] = {0, 0, 0, 3, 0, 0, 6, 7, 0};
    cr_assert(memcmp(outs[0].data, wt, sizeof wt) == 0);
    free_outs(outs, 1);
    int64_t three = 3, ind[3] = {0, -1, 5}, depth = 3;
    float vals[2] = {-1, 1};
    eng_attr oa = a_int("axis", 0);
    eng_tensor oin[3] = {mk(ENG_DTYPE_I64, 1, &three, ind), mk(ENG_DTYPE_I64, 0, NULL, &depth),
                         mk(ENG_DTYPE_F32, 1, (int64_t[]){2}, vals)};
    cr_assert_eq(run_op("OneHot", 11, &oa, 1, oin, 3, outs, 1), ENG_STATUS_OK);
    float wo[9] = {1, -1, -1, -1, -1, -1, -1, 1, -1};
    cr_assert(memcmp(outs[0].data, wo, sizeof wo) == 0);
    free_outs(outs, 1);
    int32_t rs = 10, rl = 1, rd = -3;
    eng_tensor rin[3] = {mk(ENG_DTYPE_I32, 0, NULL, &rs), mk(ENG_DTYPE_I32, 0, NULL, &rl),
                         mk(ENG_DTYPE_I32, 0, NULL, &rd)};
    cr_assert_eq(run_op("Range", 11, NULL, 0, rin, 3, outs, 1), ENG_STATUS_OK);
    cr_assert(outs[0].dims[0] == 3 && ((int32_t *)outs[0].data)[2] == 4);
    free_outs(outs, 1);
    float nz[6] = {0, 1, 0, 2, 3, 0};
    int64_t nd[2] = {2, 3};
    eng_tensor nin = mk(ENG_DTYPE_F32, 2, nd, nz);
    cr_assert_eq(run_op("NonZero", 13, NULL, 0, &nin, 1, outs, 1), ENG_STATUS_OK);
    int64_t wnz[6] = {0, 1, 1, 1, 0, 1};
    cr_assert(outs[0].dims[0] == 2 && outs[0].dims[1] == 3 && memcmp(outs[0].data, wnz, sizeof wnz) == 0);
    free_outs(outs, 1);
    free(x);
}

Test(misc, extreme_k_and_empty_split) {
    int64_t dims[2] = {2, 3};
    float x[6] = {1, 2, 3, 4, 5, 6}, zero[6] = {0};
    int64_t k = INT64_MAX;
    eng_tensor in[2] = {mk(ENG_DTYPE_F32, 2, dims, x), mk(ENG_DTYPE_I64, 0, NULL, &k)}, out[3];
    cr_assert_eq(run_op("Trilu", 14, NULL, 0, in, 2, out, 1), ENG_STATUS_OK);
    cr_assert(memcmp(out[0].data, zero, sizeof zero) == 0);
    free_outs(out, 1);
    k = INT64_MIN;
    cr_assert_eq(run_op("Trilu", 14, NULL, 0, in, 2, out, 1), ENG_STATUS_OK);
    cr_assert(memcmp(out[0].data, x, sizeof x) == 0);
    free_outs(out, 1);
    eng_attr ek = a_int("k", INT64_MIN + 1);
    cr_assert_eq(run_op("EyeLike", 9, &ek, 1, in, 1, out, 1), ENG_STATUS_OK);
    cr_assert(memcmp(out[0].data, zero, sizeof zero) == 0);
    free_outs(out, 1);
    int64_t none = 0, ax1 = 1;
    eng_attr sa = a_int("axis", ax1);
    eng_tensor sin[2] = {in[0], mk(ENG_DTYPE_I64, 1, &none, NULL)};
    cr_assert_eq(run_op("Split", 13, &sa, 1, sin, 2, out, 3), ENG_STATUS_OK, "%s", eng_last_error());
    for (int j = 0; j < 3; j++) {
        cr_assert_eq(out[j].dims[1], 1);
        cr_assert_eq(((float *)out[j].data)[1], x[3 + j]);
    }
    free_outs(out, 3);
    cr_assert_eq(run_op("Split", 13, &sa, 1, sin, 1, out, 2), ENG_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(eng_last_error(), "evenly") != NULL, "message: %s", eng_last_error());
}
