/* test_quant_dnnl.c - the oneDNN int8 kernels (kernels/cpu/quant-dnnl.c: "matmul_integer", "conv_integer")
 * against the reference loops ("matmul_integer_ref", "conv_integer_ref", kernels/cpu/quant.c) on seeded random
 * shapes: matmul with batch broadcasting and 1-D operands, conv 1-3-D with groups, strides, pads, dilations;
 * u8 and s8 activations, s8 and u8 weights, per-tensor and per-channel weight zero points and scales, bias.
 *
 * Integer outputs (MatMulInteger, ConvInteger) must match byte for byte; QLinear outputs within one
 * quantization step (float32 requantization in oneDNN vs double in the reference, see quant-dnnl.c). Each case
 * also checks the path describe() reports: a oneDNN implementation that is not "ref" where the fast path applies
 * and the CPU has VNNI, the reference loops (slow) where it cannot apply (weights that leave int8 after their
 * zero point, per-row A zero points). Kernels are called directly with krn_call, as the planner does.
 */
#include <criterion/criterion.h>
#include <dnnl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernel.h"
#include "kernels/krn-quant.h"

static uint64_t rng_state;
static uint32_t rng(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}
static int rnd_in(int lo, int hi) { return lo + (int)(rng() % (uint32_t)(hi - lo + 1)); }

static int have_vnni(void) {
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    return (isa & 0x40u) || (isa & 0x400u); /* avx512_core_vnni (and up), avx2_vnni */
}

static eng_tensor tnew(eng_dtype dt, int nd, const int64_t *dims) {
    eng_tensor t = {.dtype = dt, .ndim = nd};
    for (int i = 0; i < nd; i++) t.dims[i] = dims[i];
    size_t nb = eng_tensor_nbytes(&t);
    t.data = eng_alloc(nb ? nb : 8);
    memset(t.data, 0, nb ? nb : 8);
    return t;
}
static eng_tensor tscalar(eng_dtype dt) { return tnew(dt, 0, NULL); }
static void tset_i(eng_tensor *t, int64_t i, int v) {
    if (t->dtype == ENG_DTYPE_U8) ((uint8_t *)t->data)[i] = (uint8_t)v;
    else if (t->dtype == ENG_DTYPE_I8) ((int8_t *)t->data)[i] = (int8_t)v;
    else ((int32_t *)t->data)[i] = v;
}
static int lo_of(eng_dtype dt) { return dt == ENG_DTYPE_I8 ? -128 : 0; }
static int hi_of(eng_dtype dt) { return dt == ENG_DTYPE_I8 ? 127 : 255; }
static void tfill(eng_tensor *t, int lo, int hi) {
    for (int64_t i = 0; i < eng_tensor_numel(t); i++) tset_i(t, i, rnd_in(lo, hi));
}
static void tfree_all(eng_tensor *t, int n) {
    for (int i = 0; i < n; i++) eng_free(t[i].data);
}

/* init / exec / describe / free of kernel `name`; returns exec's status. */
static eng_status run_kernel(const char *name, const void *params, eng_tensor *in, int nin, eng_tensor *out,
                             unsigned cmask, krn_impl_info *info) {
    const krn_kernel *k = krn_backend_find(krn_backend_cpu(), name);
    cr_assert(k, "no kernel %s", name);
    krn_call c = {.params = params, .in = in, .nin = nin, .out = out, .nout = 1, .nthreads = 4, .const_mask = cmask};
    if (k->init) cr_assert_eq(k->init(&c), ENG_STATUS_OK, "%s init: %s", name, eng_last_error());
    eng_status st = k->exec(&c);
    if (st == ENG_STATUS_OK) st = k->exec(&c); /* twice: the state must survive a run */
    if (info) {
        memset(info, 0, sizeof *info);
        if (k->describe) k->describe(&c, info);
    }
    if (k->free_state) k->free_state(c.state);
    return st;
}

/* Compare fast against reference output; integer outputs exactly, 8-bit ones within one step. */
static void compare(const char *what, const eng_tensor *fast, const eng_tensor *ref) {
    int64_t n = eng_tensor_numel(ref), off1 = 0;
    cr_assert_eq(eng_tensor_numel(fast), n);
    for (int64_t i = 0; i < n; i++) {
        if (ref->dtype == ENG_DTYPE_I32) {
            int32_t a = ((int32_t *)fast->data)[i], b = ((int32_t *)ref->data)[i];
            cr_assert_eq(a, b, "%s: element %lld: %d, reference %d", what, (long long)i, a, b);
            continue;
        }
        int a = ref->dtype == ENG_DTYPE_I8 ? ((int8_t *)fast->data)[i] : ((uint8_t *)fast->data)[i];
        int b = ref->dtype == ENG_DTYPE_I8 ? ((int8_t *)ref->data)[i] : ((uint8_t *)ref->data)[i];
        cr_assert(abs(a - b) <= 1, "%s: element %lld: %d, reference %d (more than one step)", what, (long long)i, a, b);
        off1 += a != b;
    }
    if (off1) fprintf(stderr, "  %s: %lld of %lld outputs one step from the reference\n", what, (long long)off1, (long long)n);
}

static void check_path(const char *what, const krn_impl_info *info, int expect_fast) {
    fprintf(stderr, "  %s: %s%s\n", what, info->impl, info->slow ? " [slow]" : "");
    if (expect_fast && have_vnni()) {
        cr_assert(!info->slow && strncmp(info->impl, "ref", 3) && !strstr(info->impl, "reference"),
                  "%s: expected a oneDNN int8 kernel, got %s", what, info->impl);
    } else if (!expect_fast) {
        cr_assert(info->slow && strstr(info->impl, "reference"), "%s: expected the reference loops, got %s", what, info->impl);
    }
}

/* ---------------------------------------------------------------- matmul */

typedef struct mm_case {
    int q;                 /* QLinearMatMul */
    eng_dtype at, bt, yt;  /* yt: QLinear output dtype */
    int and_; int64_t ad[4];
    int bnd; int64_t bd[4];
    int azp;               /* 0 none, 1 per tensor, 2 per row (reference only) */
    int bzp;               /* 0 none, 1 per tensor, 2 per column */
    int bscale_per;
    int wide_b;            /* B over its full range with a zero point: B - zp leaves int8 (reference only) */
    int bconst;
    int expect_fast;
} mm_case;

static void mm_run(const mm_case *k, int idx) {
    char what[64];
    snprintf(what, sizeof what, "%s case %d", k->q ? "QLinearMatMul" : "MatMulInteger", idx);
    int64_t K = k->ad[k->and_ - 1], M = k->and_ >= 2 ? k->ad[k->and_ - 2] : 1, N = k->bnd >= 2 ? k->bd[k->bnd - 1] : 1;
    int na = k->and_ > 2 ? k->and_ - 2 : 0, nb = k->bnd > 2 ? k->bnd - 2 : 0, r = na > nb ? na : nb, yn = 0;
    int64_t yd[8];
    for (int d = 0; d < r; d++) {
        int64_t a = d < r - na ? 1 : k->ad[d - (r - na)], b = d < r - nb ? 1 : k->bd[d - (r - nb)];
        yd[yn++] = a > b ? a : b;
    }
    if (k->and_ >= 2) yd[yn++] = M;
    if (k->bnd >= 2) yd[yn++] = N;
    eng_tensor A = tnew(k->at, k->and_, k->ad), B = tnew(k->bt, k->bnd, k->bd);
    tfill(&A, lo_of(k->at), hi_of(k->at));
    int64_t zn = k->bzp == 2 ? N : 1, an = k->azp == 2 ? M : 1;
    eng_tensor azp = k->azp ? tnew(k->at, k->azp == 2 ? 1 : 0, &an) : (eng_tensor){0};
    eng_tensor bzp = k->bzp ? tnew(k->bt, k->bzp == 2 ? 1 : 0, &zn) : (eng_tensor){0};
    if (k->azp) tfill(&azp, lo_of(k->at), hi_of(k->at));
    if (k->bzp) tfill(&bzp, k->bt == ENG_DTYPE_U8 ? 96 : -20, k->bt == ENG_DTYPE_U8 ? 160 : 20);
    for (int64_t i = 0; i < eng_tensor_numel(&B); i++) { /* B - zp within int8 unless wide_b */
        int z = 0;
        if (k->bzp) z = k->bt == ENG_DTYPE_U8 ? ((uint8_t *)bzp.data)[k->bzp == 2 ? i % N : 0] : ((int8_t *)bzp.data)[k->bzp == 2 ? i % N : 0];
        int lo = lo_of(k->bt), hi = hi_of(k->bt);
        if (!k->wide_b) lo = lo > z - 128 ? lo : z - 128, hi = hi < z + 127 ? hi : z + 127;
        tset_i(&B, i, rnd_in(lo, hi));
    }
    eng_tensor in[8], yf, yr;
    int nin;
    unsigned cmask;
    if (!k->q) {
        in[0] = A, in[1] = B, in[2] = azp, in[3] = bzp;
        nin = k->bzp ? 4 : k->azp ? 3 : 2;
        cmask = (k->bconst ? 1u << 1 : 0) | (1u << 2) | (1u << 3);
        yf = tnew(ENG_DTYPE_I32, yn, yd), yr = tnew(ENG_DTYPE_I32, yn, yd);
    } else {
        eng_tensor as = tscalar(ENG_DTYPE_F32), bs = k->bscale_per ? tnew(ENG_DTYPE_F32, 1, &N) : tscalar(ENG_DTYPE_F32);
        eng_tensor ys = tscalar(ENG_DTYPE_F32), yz = tscalar(k->yt);
        if (!k->azp) azp = tscalar(k->at);
        if (!k->bzp) bzp = tscalar(k->bt);
        *(float *)as.data = 0.02f;
        for (int64_t j = 0; j < eng_tensor_numel(&bs); j++) ((float *)bs.data)[j] = 0.002f + 0.008f * (float)(rng() % 1000) / 1000.f;
        *(float *)ys.data = 0.02f * 0.006f * 74.f * 74.f * sqrtf((float)K) / 40.f;
        tset_i(&yz, 0, rnd_in(lo_of(k->yt) + 100, hi_of(k->yt) - 100));
        in[0] = A, in[1] = as, in[2] = azp, in[3] = B, in[4] = bs, in[5] = bzp, in[6] = ys, in[7] = yz;
        nin = 8;
        cmask = 0xfeu & ~(k->bconst ? 0u : 1u << 3); /* zero points and scales stay initializers */
        yf = tnew(k->yt, yn, yd), yr = tnew(k->yt, yn, yd);
    }
    krn_qmatmul_params p = {.qlinear = k->q};
    krn_impl_info info;
    cr_assert_eq(run_kernel("matmul_integer", &p, in, nin, &yf, cmask, &info), ENG_STATUS_OK, "%s: %s", what, eng_last_error());
    cr_assert_eq(run_kernel("matmul_integer_ref", &p, in, nin, &yr, cmask, NULL), ENG_STATUS_OK, "%s: %s", what, eng_last_error());
    check_path(what, &info, k->expect_fast);
    compare(what, &yf, &yr);
    tfree_all(in, k->q ? 8 : 4);
    eng_free(yf.data), eng_free(yr.data);
}

#define U8 ENG_DTYPE_U8
#define S8 ENG_DTYPE_I8

Test(quant_dnnl, matmul_integer_matches_reference) {
    rng_state = 0x9e3779b97f4a7c15ull;
    const mm_case cases[] = {
        /* q  at  bt  yt   A               B               azp bzp bsp wide const fast */
        {0, U8, S8, 0, 2, {7, 33}, 2, {33, 19}, 1, 0, 0, 0, 1, 1},
        {0, U8, S8, 0, 2, {64, 256}, 2, {256, 96}, 1, 1, 0, 0, 1, 1},
        {0, S8, S8, 0, 3, {3, 17, 40}, 2, {40, 24}, 1, 2, 0, 0, 1, 1},   /* batch A, shared B, per-column zp */
        {0, U8, U8, 0, 3, {2, 5, 31}, 3, {2, 31, 13}, 1, 1, 0, 0, 1, 1}, /* uint8 B, zp ~128 */
        {0, U8, S8, 0, 4, {2, 1, 6, 20}, 3, {3, 20, 9}, 1, 0, 0, 0, 1, 1}, /* broadcast both ways */
        {0, U8, S8, 0, 1, {50}, 2, {50, 12}, 1, 0, 0, 0, 1, 1},          /* 1-D A */
        {0, S8, S8, 0, 2, {9, 50}, 1, {50}, 0, 0, 0, 0, 1, 1},           /* 1-D B */
        {0, U8, S8, 0, 2, {33, 3000}, 2, {3000, 40}, 1, 0, 0, 0, 1, 1},  /* accumulators past 2^24 */
        {0, U8, S8, 0, 2, {16, 64}, 2, {64, 32}, 1, 0, 0, 0, 0, 1},      /* non-constant int8 B */
        {0, U8, S8, 0, 3, {2, 16, 64}, 3, {2, 64, 32}, 1, 0, 0, 0, 0, 1},
        {0, U8, U8, 0, 2, {8, 30}, 2, {30, 10}, 1, 1, 0, 1, 1, 0},       /* B - zp leaves int8 */
        {0, U8, S8, 0, 2, {8, 30}, 2, {30, 10}, 2, 0, 0, 0, 1, 0},       /* per-row A zero point */
        {0, U8, U8, 0, 2, {8, 30}, 2, {30, 10}, 0, 0, 0, 0, 0, 0},       /* non-constant uint8 B */
        {1, U8, S8, U8, 2, {32, 128}, 2, {128, 64}, 1, 0, 0, 0, 1, 1},
        {1, U8, S8, U8, 2, {20, 100}, 2, {100, 48}, 1, 0, 1, 0, 1, 1},   /* per-column b_scale */
        {1, S8, S8, S8, 3, {4, 12, 70}, 2, {70, 30}, 1, 2, 1, 0, 1, 1},
        {1, U8, U8, U8, 3, {2, 9, 40}, 3, {2, 40, 17}, 1, 2, 1, 0, 1, 1},
        {1, U8, S8, S8, 2, {64, 768}, 2, {768, 256}, 1, 0, 1, 0, 1, 1},
        {1, U8, S8, U8, 2, {8, 40}, 2, {40, 16}, 1, 0, 0, 0, 0, 1},      /* non-constant b */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) mm_run(&cases[i], (int)i);
}

/* ---------------------------------------------------------------- conv */

typedef struct cv_case {
    int q;
    eng_dtype xt, wt, yt;
    int nsp;
    int64_t N, C, M, G;
    int64_t sp[3], k[3], s[3], d[3], pb[3], pe[3];
    int xzp, wzp;          /* wzp: 0 none, 1 per tensor, 2 per output channel */
    int wscale_per, bias, wide_w, wconst, expect_fast;
} cv_case;

static void cv_run(const cv_case *k, int idx) {
    char what[64];
    snprintf(what, sizeof what, "%s case %d", k->q ? "QLinearConv" : "ConvInteger", idx);
    int nd = k->nsp + 2;
    int64_t xd[5] = {k->N, k->C}, wd[5] = {k->M, k->C / k->G}, yd[5] = {k->N, k->M}, kred = k->C / k->G;
    krn_qconv_params p = {.qlinear = k->q};
    p.conv.nspatial = k->nsp, p.conv.group = k->G;
    for (int i = 0; i < k->nsp; i++) {
        xd[2 + i] = k->sp[i], wd[2 + i] = k->k[i];
        yd[2 + i] = (k->sp[i] + k->pb[i] + k->pe[i] - ((k->k[i] - 1) * k->d[i] + 1)) / k->s[i] + 1;
        p.conv.kernel[i] = k->k[i], p.conv.strides[i] = k->s[i], p.conv.dilations[i] = k->d[i];
        p.conv.pads[i] = k->pb[i], p.conv.pads[k->nsp + i] = k->pe[i];
        kred *= k->k[i];
    }
    eng_tensor X = tnew(k->xt, nd, xd), W = tnew(k->wt, nd, wd);
    tfill(&X, lo_of(k->xt), hi_of(k->xt));
    int64_t zn = k->wzp == 2 ? k->M : 1, M = k->M, wper = eng_tensor_numel(&W) / k->M;
    eng_tensor xzp = k->xzp ? tscalar(k->xt) : (eng_tensor){0};
    eng_tensor wzp = k->wzp ? tnew(k->wt, k->wzp == 2 ? 1 : 0, &zn) : (eng_tensor){0};
    if (k->xzp) tfill(&xzp, lo_of(k->xt), hi_of(k->xt));
    if (k->wzp) tfill(&wzp, k->wt == ENG_DTYPE_U8 ? 96 : -20, k->wt == ENG_DTYPE_U8 ? 160 : 20);
    for (int64_t i = 0; i < eng_tensor_numel(&W); i++) {
        int z = 0, zi = k->wzp == 2 ? (int)(i / wper) : 0;
        if (k->wzp) z = k->wt == ENG_DTYPE_U8 ? ((uint8_t *)wzp.data)[zi] : ((int8_t *)wzp.data)[zi];
        int lo = lo_of(k->wt), hi = hi_of(k->wt);
        if (!k->wide_w) lo = lo > z - 128 ? lo : z - 128, hi = hi < z + 127 ? hi : z + 127;
        tset_i(&W, i, rnd_in(lo, hi));
    }
    eng_tensor in[9], yf, yr;
    int nin;
    unsigned cmask;
    if (!k->q) {
        in[0] = X, in[1] = W, in[2] = xzp, in[3] = wzp;
        nin = k->wzp ? 4 : k->xzp ? 3 : 2;
        cmask = (k->wconst ? 1u << 1 : 0) | (1u << 2) | (1u << 3);
        yf = tnew(ENG_DTYPE_I32, nd, yd), yr = tnew(ENG_DTYPE_I32, nd, yd);
    } else {
        eng_tensor xs = tscalar(ENG_DTYPE_F32), ws = k->wscale_per ? tnew(ENG_DTYPE_F32, 1, &M) : tscalar(ENG_DTYPE_F32);
        eng_tensor ys = tscalar(ENG_DTYPE_F32), yz = tscalar(k->yt);
        if (!k->xzp) xzp = tscalar(k->xt);
        if (!k->wzp) wzp = tscalar(k->wt);
        *(float *)xs.data = 0.02f;
        for (int64_t j = 0; j < eng_tensor_numel(&ws); j++) ((float *)ws.data)[j] = 0.002f + 0.008f * (float)(rng() % 1000) / 1000.f;
        *(float *)ys.data = 0.02f * 0.006f * 74.f * 74.f * sqrtf((float)kred) / 40.f;
        tset_i(&yz, 0, rnd_in(lo_of(k->yt) + 100, hi_of(k->yt) - 100));
        in[0] = X, in[1] = xs, in[2] = xzp, in[3] = W, in[4] = ws, in[5] = wzp, in[6] = ys, in[7] = yz;
        nin = 8;
        if (k->bias) {
            in[8] = tnew(ENG_DTYPE_I32, 1, &M);
            tfill(&in[8], -20000, 20000);
            nin = 9;
        }
        cmask = 0x1feu & ~(k->wconst ? 0u : 1u << 3);
        yf = tnew(k->yt, nd, yd), yr = tnew(k->yt, nd, yd);
    }
    krn_impl_info info;
    cr_assert_eq(run_kernel("conv_integer", &p, in, nin, &yf, cmask, &info), ENG_STATUS_OK, "%s: %s", what, eng_last_error());
    cr_assert_eq(run_kernel("conv_integer_ref", &p, in, nin, &yr, cmask, NULL), ENG_STATUS_OK, "%s: %s", what, eng_last_error());
    check_path(what, &info, k->expect_fast);
    compare(what, &yf, &yr);
    tfree_all(in, k->q ? nin : 4);
    eng_free(yf.data), eng_free(yr.data);
}

Test(quant_dnnl, conv_integer_matches_reference) {
    rng_state = 0x243f6a8885a308d3ull;
    const cv_case cases[] = {
        /* q xt  wt  yt nsp N  C   M   G   spatial        kernel      stride      dil        pad begin  pad end    xzp wzp wsp bias wide const fast */
        {0, U8, S8, 0, 2, 2, 16, 32, 1, {14, 14}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}, 1, 0, 0, 0, 0, 1, 1},
        {0, U8, S8, 0, 2, 1, 3, 16, 1, {17, 15}, {5, 3}, {2, 1}, {1, 2}, {2, 0}, {1, 3}, 1, 2, 0, 0, 0, 1, 1},
        {0, S8, S8, 0, 2, 2, 12, 24, 3, {9, 11}, {3, 3}, {2, 2}, {2, 1}, {1, 2}, {2, 1}, 1, 1, 0, 0, 0, 1, 1}, /* groups */
        {0, U8, U8, 0, 2, 1, 8, 8, 8, {10, 10}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}, 1, 2, 0, 0, 0, 1, 1},  /* depthwise, uint8 W */
        {0, U8, S8, 0, 1, 3, 6, 10, 2, {30}, {4}, {3}, {2}, {3}, {0}, 1, 0, 0, 0, 0, 1, 1},                     /* 1-D */
        {0, U8, S8, 0, 3, 1, 4, 8, 1, {6, 7, 5}, {3, 2, 3}, {1, 2, 1}, {1, 1, 2}, {1, 0, 2}, {1, 1, 1}, 1, 0, 0, 0, 0, 1, 1},
        {0, U8, S8, 0, 2, 1, 64, 64, 1, {12, 12}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}, 1, 0, 0, 0, 0, 1, 1}, /* K 576, large sums */
        {0, U8, S8, 0, 2, 2, 8, 16, 1, {8, 8}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}, 1, 0, 0, 0, 0, 0, 1},    /* non-constant W */
        {0, U8, U8, 0, 2, 1, 4, 8, 1, {6, 6}, {3, 3}, {1, 1}, {1, 1}, {0, 0}, {0, 0}, 1, 1, 0, 0, 1, 1, 0},     /* W - zp leaves int8 */
        {1, U8, S8, U8, 2, 2, 16, 32, 1, {14, 14}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}, 1, 0, 1, 1, 0, 1, 1},
        {1, U8, S8, U8, 2, 1, 3, 16, 1, {32, 32}, {7, 7}, {2, 2}, {1, 1}, {3, 3}, {3, 3}, 1, 0, 1, 1, 0, 1, 1},
        {1, S8, S8, S8, 2, 2, 12, 24, 3, {9, 11}, {3, 3}, {2, 2}, {2, 1}, {1, 2}, {2, 1}, 1, 2, 1, 1, 0, 1, 1},
        {1, U8, S8, U8, 2, 1, 32, 32, 32, {16, 16}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, {1, 1}, 1, 0, 1, 0, 0, 1, 1}, /* depthwise */
        {1, U8, U8, U8, 2, 2, 16, 16, 1, {8, 8}, {1, 1}, {1, 1}, {1, 1}, {0, 0}, {0, 0}, 1, 1, 0, 1, 0, 1, 1},  /* 1x1, uint8 W zp */
        {1, U8, S8, S8, 1, 2, 8, 12, 1, {25}, {3}, {1}, {2}, {2}, {2}, 1, 0, 1, 1, 0, 1, 1},
        {1, U8, S8, U8, 2, 4, 64, 128, 1, {14, 14}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}, 1, 0, 1, 1, 0, 1, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) cv_run(&cases[i], (int)i);
}
