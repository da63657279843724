/* eltwise.c - CPU kernels of the elementwise family: unary maps, broadcasting binary ops, variadic
 * Sum/Mean/Min/Max, Where, Clip, Cast (table krn_cpu_eltwise_kernels).
 *
 * Dtype strategy: float32 / float64 / integers run natively; float16 and bfloat16 are widened to float32
 * (in chunks on the stack for unary ops, into temporary buffers for broadcasting ops) and narrowed back with
 * round-to-nearest-even. Mixed-dtype Pow goes through float64. Kernels never trap on integer division by zero
 * (result 0). Output buffers never alias inputs (planner contract); in-place work is only on our own temps.
 */
/* no-trapping-math lets gcc vectorise floorf/ceilf; math-errno cannot be turned off by pragma (sqrt uses
 * intrinsics below instead) */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-math-errno", "no-trapping-math")
#endif

#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "../kernel.h"
#include "../krn-eltwise.h"
#include "../krn-nn.h"

#define EW_CHUNK 1024

/* ---- float16 / bfloat16 <-> float32 ---- */

static void ew_half_to_f32(const uint16_t *s, eng_dtype dt, float *d, int64_t n) {
    int64_t i = 0;
    if (dt == ENG_DTYPE_BF16) {
        for (; i < n; i++) {
            uint32_t b = (uint32_t)s[i] << 16;
            memcpy(&d[i], &b, 4);
        }
        return;
    }
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
#endif
    for (; i < n; i++) d[i] = eng_f16_to_f32(s[i]);
}

static void ew_f32_to_half(const float *s, uint16_t *d, eng_dtype dt, int64_t n) {
    int64_t i = 0;
    if (dt == ENG_DTYPE_BF16) {
        for (; i < n; i++) {
            uint32_t x;
            memcpy(&x, &s[i], 4);
            uint32_t r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
            d[i] = (uint16_t)(((x & 0x7fffffffu) > 0x7f800000u) ? ((x >> 16) | 0x40u) : r);
        }
        return;
    }
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) d[i] = eng_f32_to_f16(s[i]);
}

static int ew_is_half(eng_dtype dt) { return dt == ENG_DTYPE_F16 || dt == ENG_DTYPE_BF16; }

/* A float32 view of t: t itself, or a temporary widened copy (caller eng_free's *buf). */
static eng_status ew_widen(const eng_tensor *t, eng_tensor *w, void **buf, const char *what) {
    *w = *t;
    *buf = NULL;
    if (!ew_is_half(t->dtype)) return ENG_STATUS_OK;
    int64_t n = eng_tensor_numel(t);
    float *f = eng_alloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!f) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: cannot allocate %lld floats", what, (long long)n);
    ew_half_to_f32(t->data, t->dtype, f, n);
    w->dtype = ENG_DTYPE_F32;
    w->data = f;
    *buf = f;
    return ENG_STATUS_OK;
}

/* ---- unary ---- */

static eng_status ew_unary_int(int op, const eng_tensor *x, eng_tensor *y, int64_t n) {
    int uns = x->dtype == ENG_DTYPE_U8 || x->dtype == ENG_DTYPE_U16 || x->dtype == ENG_DTYPE_U32 ||
              x->dtype == ENG_DTYPE_U64;
    if (op != KRN_ACT_ABS && op != KRN_ACT_NEG && op != KRN_ACT_SIGN && op != KRN_ACT_RELU)
        return eng_err(ENG_STATUS_UNSUPPORTED, "unary op %d on %s", op, eng_dtype_name(x->dtype));
    if (x->dtype == ENG_DTYPE_I32 || x->dtype == ENG_DTYPE_I64) { /* common: typed loops */
        if (x->dtype == ENG_DTYPE_I32) {
            const int32_t *s = x->data;
            int32_t *d = y->data;
            for (int64_t i = 0; i < n; i++) {
                int32_t v = s[i];
                d[i] = op == KRN_ACT_ABS ? (v < 0 ? (int32_t)(0u - (uint32_t)v) : v)
                     : op == KRN_ACT_NEG ? (int32_t)(0u - (uint32_t)v)
                     : op == KRN_ACT_SIGN ? (v > 0) - (v < 0) : (v > 0 ? v : 0);
            }
        } else {
            const int64_t *s = x->data;
            int64_t *d = y->data;
            for (int64_t i = 0; i < n; i++) {
                int64_t v = s[i];
                d[i] = op == KRN_ACT_ABS ? (v < 0 ? (int64_t)(0u - (uint64_t)v) : v)
                     : op == KRN_ACT_NEG ? (int64_t)(0u - (uint64_t)v)
                     : op == KRN_ACT_SIGN ? (v > 0) - (v < 0) : (v > 0 ? v : 0);
            }
        }
        return ENG_STATUS_OK;
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t v = eng_tensor_get_i64(x, i), r;
        if (uns) {
            uint64_t u = (uint64_t)v;
            r = op == KRN_ACT_NEG ? (int64_t)(0u - u) : op == KRN_ACT_SIGN ? (u != 0) : (int64_t)u;
        } else {
            r = op == KRN_ACT_ABS ? (v < 0 ? (int64_t)(0u - (uint64_t)v) : v)
              : op == KRN_ACT_NEG ? (int64_t)(0u - (uint64_t)v)
              : op == KRN_ACT_SIGN ? (v > 0) - (v < 0) : (v > 0 ? v : 0);
        }
        eng_tensor_set_i64(y, i, r);
    }
    return ENG_STATUS_OK;
}

static eng_status ew_unary_pred(int op, float alpha, float beta, const eng_tensor *x, eng_tensor *y, int64_t n) {
    uint8_t *d = y->data;
    if (op == KRN_ACT_NOT) {
        if (x->dtype != ENG_DTYPE_BOOL) return eng_err(ENG_STATUS_UNSUPPORTED, "Not on %s", eng_dtype_name(x->dtype));
        const uint8_t *s = x->data;
        for (int64_t i = 0; i < n; i++) d[i] = !s[i];
        return ENG_STATUS_OK;
    }
    if (!eng_dtype_is_float(x->dtype))
        return eng_err(ENG_STATUS_UNSUPPORTED, "IsNaN/IsInf on %s", eng_dtype_name(x->dtype));
    int pos = alpha != 0, neg = beta != 0;
    if (x->dtype == ENG_DTYPE_F32) {
        const float *s = x->data;
        if (op == KRN_ACT_ISNAN) for (int64_t i = 0; i < n; i++) d[i] = s[i] != s[i];
        else for (int64_t i = 0; i < n; i++) d[i] = (pos && s[i] == INFINITY) || (neg && s[i] == -INFINITY);
        return ENG_STATUS_OK;
    }
    for (int64_t i = 0; i < n; i++) {
        double v = eng_tensor_get_f64(x, i);
        d[i] = op == KRN_ACT_ISNAN ? v != v : ((pos && v == INFINITY) || (neg && v == -INFINITY));
    }
    return ENG_STATUS_OK;
}

/* float map over any float dtype, chunked across threads; shared by Unary and Clip. */
static eng_status ew_float_map(int op, double alpha, double beta, const eng_tensor *x, eng_tensor *y, int64_t n,
                               int nthreads) {
    int64_t nch = (n + EW_CHUNK - 1) / EW_CHUNK;
    int par = n > KRN_ELTWISE_PAR_MIN && nthreads > 1;
    switch (x->dtype) {
    case ENG_DTYPE_F32: {
        const float *s = x->data;
        float *d = y->data;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (par)
        for (int64_t k = 0; k < nch; k++) {
            int64_t o = k * EW_CHUNK, m = n - o < EW_CHUNK ? n - o : EW_CHUNK;
            krn_cpu_unary_f32(op, (float)alpha, (float)beta, s + o, d + o, m);
        }
        return ENG_STATUS_OK;
    }
    case ENG_DTYPE_F64: {
        const double *s = x->data;
        double *d = y->data;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (par)
        for (int64_t k = 0; k < nch; k++) {
            int64_t o = k * EW_CHUNK, m = n - o < EW_CHUNK ? n - o : EW_CHUNK;
            krn_cpu_unary_f64(op, alpha, beta, s + o, d + o, m);
        }
        return ENG_STATUS_OK;
    }
    case ENG_DTYPE_F16: case ENG_DTYPE_BF16: {
        const uint16_t *s = x->data;
        uint16_t *d = y->data;
        eng_dtype dt = x->dtype;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (par)
        for (int64_t k = 0; k < nch; k++) {
            float buf[EW_CHUNK];
            int64_t o = k * EW_CHUNK, m = n - o < EW_CHUNK ? n - o : EW_CHUNK;
            ew_half_to_f32(s + o, dt, buf, m);
            krn_cpu_unary_f32(op, (float)alpha, (float)beta, buf, buf, m);
            ew_f32_to_half(buf, d + o, dt, m);
        }
        return ENG_STATUS_OK;
    }
    default:
        return eng_err(ENG_STATUS_UNSUPPORTED, "unary op %d on %s", op, eng_dtype_name(x->dtype));
    }
}

static eng_status unary_exec(krn_call *c) {
    const krn_unary_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    eng_tensor *y = &c->out[0];
    int64_t n = eng_tensor_numel(x);
    if (n <= 0) return ENG_STATUS_OK;
    if (p->op >= KRN_ACT_ISNAN) return ew_unary_pred(p->op, p->alpha, p->beta, x, y, n);
    if (eng_dtype_is_int(x->dtype)) return ew_unary_int(p->op, x, y, n);
    return ew_float_map(p->op, p->alpha, p->beta, x, y, n, c->nthreads);
}

/* ---- binary ---- */

static int ew_binop_is_cmp(int op) { return op >= KRN_BIN_EQ && op <= KRN_BIN_XOR; }

static const char *ew_binop_name(int op) {
    static const char *names[KRN_BIN_COUNT] = {"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Mod(fmod)", "BitShift(LEFT)",
        "BitShift(RIGHT)", "Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "And", "Or", "Xor",
        "Min", "Max", "PRelu"};
    return op >= 0 && op < KRN_BIN_COUNT ? names[op] : "?";
}

/* out = op(a, b) with broadcasting; a, b, out already in compute dtypes. */
static eng_status ew_binary_run(int op, const eng_tensor *a, const eng_tensor *b, eng_tensor *out, int nthreads) {
    krn_ew_fn fn = krn_cpu_binary_fn(op, a->dtype);
    if (!fn) return eng_err(ENG_STATUS_UNSUPPORTED, "%s on %s", ew_binop_name(op), eng_dtype_name(a->dtype));
    krn_bcast bc;
    const eng_tensor *ins[2] = {a, b};
    ENG_TRY(krn_cpu_bcast_init(&bc, out, ins, 2));
    const void *pin[2] = {a->data, b->data};
    size_t es = eng_dtype_size(a->dtype);
    size_t esz[2] = {es, es};
    krn_cpu_bcast_run(&bc, fn, out->data, eng_dtype_size(out->dtype), pin, esz, nthreads);
    return ENG_STATUS_OK;
}

/* Pow float32 with one scalar exponent: common small exponents avoid powf. */
static int ew_pow_f32_scalar(const eng_tensor *a, const eng_tensor *b, eng_tensor *out, int nthreads) {
    if (a->dtype != ENG_DTYPE_F32 || b->dtype != ENG_DTYPE_F32 || eng_tensor_numel(b) != 1) return 0;
    float e = *(const float *)b->data;
    if (e != 2.0f && e != 0.5f && e != 1.0f && e != 3.0f && e != -1.0f && e != -0.5f) return 0;
    const float *x = a->data;
    float *y = out->data;
    int64_t n = eng_tensor_numel(a);
    if (eng_tensor_numel(out) != n) return 0;
    int64_t nch = (n + EW_CHUNK - 1) / EW_CHUNK;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (n > KRN_ELTWISE_PAR_MIN && nthreads > 1)
    for (int64_t k = 0; k < nch; k++) {
        int64_t o = k * EW_CHUNK, m = n - o < EW_CHUNK ? n - o : EW_CHUNK;
        const float *s = x + o;
        float *d = y + o;
        if (e == 2.0f) for (int64_t i = 0; i < m; i++) d[i] = s[i] * s[i];
        else if (e == 3.0f) for (int64_t i = 0; i < m; i++) d[i] = s[i] * s[i] * s[i];
        else if (e == 1.0f) memcpy(d, s, (size_t)m * sizeof *d);
        else if (e == -1.0f) for (int64_t i = 0; i < m; i++) d[i] = 1.0f / s[i];
        else {
            krn_cpu_unary_f32(KRN_ACT_SQRT, 0, 0, s, d, m);
            if (e == -0.5f) for (int64_t i = 0; i < m; i++) d[i] = 1.0f / d[i];
        }
    }
    return 1;
}

/* Run op in `cdt` (a wider compute dtype): convert a, b to cdt, compute, convert to out's dtype. */
static eng_status ew_binary_via(int op, eng_dtype cdt, const eng_tensor *a, const eng_tensor *b, eng_tensor *out,
                                int nthreads) {
    eng_tensor ta = *a, tb = *b, to = *out;
    int64_t na = eng_tensor_numel(a), nb = eng_tensor_numel(b), no = eng_tensor_numel(out);
    size_t es = eng_dtype_size(cdt);
    int cmp = ew_binop_is_cmp(op);
    void *ba = eng_alloc((size_t)(na ? na : 1) * es), *bb = eng_alloc((size_t)(nb ? nb : 1) * es);
    void *bo = cmp ? NULL : eng_alloc((size_t)(no ? no : 1) * es);
    eng_status st = ENG_STATUS_OK;
    if (!ba || !bb || (!cmp && !bo)) {
        st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: cannot allocate %s temporaries", ew_binop_name(op),
                     eng_dtype_name(cdt));
        goto done;
    }
    if (ew_is_half(a->dtype) && cdt == ENG_DTYPE_F32) ew_half_to_f32(a->data, a->dtype, ba, na);
    else if ((st = eng_convert(a->data, a->dtype, ba, cdt, na)) != ENG_STATUS_OK) goto done;
    if (ew_is_half(b->dtype) && cdt == ENG_DTYPE_F32) ew_half_to_f32(b->data, b->dtype, bb, nb);
    else if ((st = eng_convert(b->data, b->dtype, bb, cdt, nb)) != ENG_STATUS_OK) goto done;
    ta.dtype = tb.dtype = cdt;
    ta.data = ba;
    tb.data = bb;
    if (!cmp) {
        to.dtype = cdt;
        to.data = bo;
    }
    if (!(op == KRN_BIN_POW && ew_pow_f32_scalar(&ta, &tb, &to, nthreads)))
        if ((st = ew_binary_run(op, &ta, &tb, &to, nthreads)) != ENG_STATUS_OK) goto done;
    if (!cmp) {
        if (ew_is_half(out->dtype) && cdt == ENG_DTYPE_F32) ew_f32_to_half(bo, out->data, out->dtype, no);
        else st = eng_convert(bo, cdt, out->data, out->dtype, no);
    }
done:
    eng_free(ba);
    eng_free(bb);
    eng_free(bo);
    return st;
}

/* The physical shape of a BLOCKED operand (see krn_nn_layout), so that numpy broadcasting over it is right: with
 * C % 16 == 0 a tensor [n, c, h, w] (c = C or 1; left-padded to 4-D) is [n, c/16, h, w, 16] (or [n, 1, h, w, 1]),
 * otherwise NHWC [n, h, w, c]. Operands broadcast over H and W ([N,C,1,1]) read the same in every layout.
 * Returns 0 if t's channel dim is neither C nor 1. */
static int ew_blocked_view(eng_tensor *t, int64_t C) {
    if (t->ndim > 4) return 0;
    int64_t d[4] = {1, 1, 1, 1};
    for (int i = 0; i < t->ndim; i++) d[4 - t->ndim + i] = t->dims[i];
    if (d[1] != C && d[1] != 1) return 0;
    if (krn_nn_blocked16(C)) {
        int64_t v[5] = {d[0], d[1] == C ? C / 16 : 1, d[2], d[3], d[1] == C ? 16 : 1};
        t->ndim = 5;
        memcpy(t->dims, v, sizeof v);
    } else {
        int64_t v[4] = {d[0], d[2], d[3], d[1]};
        t->ndim = 4;
        memcpy(t->dims, v, sizeof v);
    }
    return 1;
}

/* x (op) s for float32 x [N, C, H, W] and a per-channel s (broadcast over H and W: [N|1, C, 1, 1], [C, 1, 1]),
 * both in physical order (ew_blocked_view): rows of `lane` channels (16 in nChw16c, C in NHWC) times H*W
 * pixels, s indexed by (n, channel block). The SE block's scale and folded per-channel constants. Returns 0
 * when the shapes are not that (the general broadcast then runs). */
static int ew_blocked_channel_op(int op, const eng_tensor *x, const eng_tensor *sc, int s_first, eng_tensor *out,
                                 int nthreads) {
    if (x->dtype != ENG_DTYPE_F32 || sc->dtype != ENG_DTYPE_F32 || !eng_shape_equal(x, out)) return 0;
    if (op != KRN_BIN_ADD && op != KRN_BIN_SUB && op != KRN_BIN_MUL && op != KRN_BIN_DIV) return 0;
    int nd = x->ndim;
    int64_t outer, hw, lane, sn = 1;
    if (nd == 5) { /* [N, C/16, H, W, 16] and [N|1, C/16, 1, 1, 16] */
        if (sc->ndim != 5 || sc->dims[1] != x->dims[1] || sc->dims[2] != 1 || sc->dims[3] != 1 || sc->dims[4] != 16) return 0;
        outer = x->dims[0] * x->dims[1], hw = x->dims[2] * x->dims[3], lane = 16;
    } else if (nd == 4) { /* NHWC [N, H, W, C] and [N|1, 1, 1, C] */
        if (sc->ndim != 4 || sc->dims[1] != 1 || sc->dims[2] != 1 || sc->dims[3] != x->dims[3]) return 0;
        outer = x->dims[0], hw = x->dims[1] * x->dims[2], lane = x->dims[3];
    } else {
        return 0;
    }
    if (sc->dims[0] != 1 && sc->dims[0] != x->dims[0]) return 0;
    sn = sc->dims[0];
    const float *X = x->data, *S = sc->data;
    float *Y = out->data;
    int64_t per_n = outer / x->dims[0];
#pragma omp parallel for num_threads(nthreads) schedule(static) if (outer * hw * lane > 32768)
    for (int64_t o = 0; o < outer; o++) {
        const float *xs = X + o * hw * lane, *ss = S + (sn == 1 ? o % per_n : o) * lane;
        float *ys = Y + o * hw * lane;
        for (int64_t i = 0; i < hw; i++)
            for (int64_t l = 0; l < lane; l++) {
                float a = xs[i * lane + l], b = ss[l];
                if (s_first) {
                    float t = a;
                    a = b, b = t;
                }
                ys[i * lane + l] = op == KRN_BIN_ADD ? a + b : op == KRN_BIN_SUB ? a - b : op == KRN_BIN_MUL ? a * b : a / b;
            }
    }
    return 1;
}

/* io_ok (kernel.h): plain-layout binary ops may read bf16 operands (converted to float32 first); the output stays
 * float32 (a residual stream is never stored in bf16). */
static int binary_io_ok(const krn_call *c, eng_dtype dt) {
    const krn_binary_params *p = c->params;
    if (dt != ENG_DTYPE_BF16 || !p || p->layout || p->b_override || c->nin != 2 || c->out[0].dtype != ENG_DTYPE_F32) return 0;
    for (int i = 0; i < 2; i++)
        if (c->in[i].dtype != ENG_DTYPE_F32 && c->in[i].dtype != ENG_DTYPE_BF16) return 0;
    return 1;
}

static eng_status binary_exec_f32(krn_call *c);

static eng_status binary_exec(krn_call *c) {
    if (c->nin == 2 && c->out[0].dtype == ENG_DTYPE_F32 &&
        (c->in[0].dtype == ENG_DTYPE_BF16 || c->in[1].dtype == ENG_DTYPE_BF16)) { /* io_ok's case */
        eng_tensor in[2] = {c->in[0], c->in[1]};
        void *tmp[2] = {NULL, NULL};
        eng_status st = ENG_STATUS_OK;
        for (int i = 0; i < 2 && st == ENG_STATUS_OK; i++) {
            if (in[i].dtype != ENG_DTYPE_BF16) continue;
            int64_t n = eng_tensor_numel(&in[i]);
            if (!(tmp[i] = eng_alloc((size_t)(n ? n : 1) * sizeof(float))))
                st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "bf16 operand");
            else st = eng_convert(in[i].data, ENG_DTYPE_BF16, tmp[i], ENG_DTYPE_F32, n);
            in[i].data = tmp[i], in[i].dtype = ENG_DTYPE_F32;
        }
        if (st == ENG_STATUS_OK) {
            krn_call c2 = *c;
            c2.in = in;
            st = binary_exec_f32(&c2);
        }
        eng_free(tmp[0]), eng_free(tmp[1]);
        return st;
    }
    return binary_exec_f32(c);
}

static eng_status binary_exec_f32(krn_call *c) {
    const krn_binary_params *p = c->params;
    eng_tensor a = c->in[0], b = c->in[1];
    eng_tensor *out = &c->out[0], ob;
    if (p->layout == KRN_NN_LAYOUT_BLOCKED && out->ndim == 4) {
        int64_t C = out->dims[1];
        ob = *out;
        if (!ew_blocked_view(&a, C) || !ew_blocked_view(&b, C) || !ew_blocked_view(&ob, C))
            return eng_err(ENG_STATUS_INTERNAL, "%s on blocked tensors: an input's channel dim is neither %lld nor 1",
                           ew_binop_name(p->op), (long long)C);
        out = &ob;
        if (ew_blocked_channel_op(p->op, &a, &b, 0, out, c->nthreads) ||
            ew_blocked_channel_op(p->op, &b, &a, 1, out, c->nthreads))
            return ENG_STATUS_OK;
    }
    if (p->b_override) {
        b.ndim = p->b_ndim;
        memcpy(b.dims, p->b_dims, sizeof b.dims);
    }
    if (eng_tensor_numel(out) == 0) return ENG_STATUS_OK;
    if (p->op == KRN_BIN_POW) {
        if (a.dtype == b.dtype && (a.dtype == ENG_DTYPE_F32 || a.dtype == ENG_DTYPE_F64)) {
            if (ew_pow_f32_scalar(&a, &b, out, c->nthreads)) return ENG_STATUS_OK;
            return ew_binary_run(p->op, &a, &b, out, c->nthreads);
        }
        if (a.dtype == b.dtype && ew_is_half(a.dtype)) return ew_binary_via(p->op, ENG_DTYPE_F32, &a, &b, out, c->nthreads);
        return ew_binary_via(p->op, ENG_DTYPE_F64, &a, &b, out, c->nthreads);
    }
    if (a.dtype != b.dtype)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: input dtypes differ (%s vs %s)", ew_binop_name(p->op),
                       eng_dtype_name(a.dtype), eng_dtype_name(b.dtype));
    if (ew_is_half(a.dtype)) return ew_binary_via(p->op, ENG_DTYPE_F32, &a, &b, out, c->nthreads);
    return ew_binary_run(p->op, &a, &b, out, c->nthreads);
}

/* ---- variadic Sum / Mean / Min / Max ---- */

static eng_status variadic_exec(krn_call *c) {
    const krn_variadic_params *p = c->params;
    eng_tensor *out = &c->out[0];
    int64_t no = eng_tensor_numel(out);
    if (no == 0) return ENG_STATUS_OK;
    eng_dtype dt = out->dtype;
    int half = ew_is_half(dt);
    eng_tensor acc = *out;
    void *accbuf = NULL;
    eng_status st = ENG_STATUS_OK;
    if (half) {
        accbuf = eng_alloc((size_t)no * sizeof(float));
        if (!accbuf) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "cannot allocate %lld floats", (long long)no);
        acc.dtype = ENG_DTYPE_F32;
        acc.data = accbuf;
    }
    for (int k = 0; k < c->nin && st == ENG_STATUS_OK; k++) {
        eng_tensor w;
        void *wb = NULL;
        if ((st = ew_widen(&c->in[k], &w, &wb, "variadic input")) != ENG_STATUS_OK) break;
        if (k == 0) {
            /* acc = broadcast(in0): x + 0 style copy through the broadcast iterator */
            if (!eng_shape_equal(&w, &acc)) {
                krn_bcast bc;
                const eng_tensor *ins[1] = {&w};
                st = krn_cpu_bcast_init(&bc, &acc, ins, 1);
                if (st == ENG_STATUS_OK) {
                    size_t es = eng_dtype_size(acc.dtype);
                    /* copy runs: reuse Max(x, x) which is the identity for every dtype incl. NaN */
                    krn_ew_fn fn = krn_cpu_binary_fn(KRN_BIN_MAX, acc.dtype);
                    if (!fn) st = eng_err(ENG_STATUS_UNSUPPORTED, "variadic op on %s", eng_dtype_name(dt));
                    else {
                        krn_bcast bc2 = bc;
                        bc2.nin = 2;
                        memcpy(bc2.str[1], bc.str[0], sizeof bc.str[0]);
                        const void *pin[2] = {w.data, w.data};
                        size_t esz[2] = {es, es};
                        krn_cpu_bcast_run(&bc2, fn, acc.data, es, pin, esz, c->nthreads);
                    }
                }
            } else {
                memcpy(acc.data, w.data, (size_t)no * eng_dtype_size(acc.dtype));
            }
        } else {
            st = ew_binary_run(p->op, &acc, &w, &acc, c->nthreads);
        }
        eng_free(wb);
    }
    if (st == ENG_STATUS_OK && p->mean && c->nin > 1) {
        if (acc.dtype == ENG_DTYPE_F32) {
            float s = 1.0f / (float)c->nin, *d = acc.data;
            for (int64_t i = 0; i < no; i++) d[i] *= s;
        } else if (acc.dtype == ENG_DTYPE_F64) {
            double s = 1.0 / c->nin, *d = acc.data;
            for (int64_t i = 0; i < no; i++) d[i] *= s;
        } else {
            for (int64_t i = 0; i < no; i++) eng_tensor_set_f64(&acc, i, eng_tensor_get_f64(&acc, i) / c->nin);
        }
    }
    if (st == ENG_STATUS_OK && half) ew_f32_to_half(accbuf, out->data, dt, no);
    eng_free(accbuf);
    return st;
}

/* ---- Where ---- */

#define EW_WHERE_DEF(NAME, T)                                                                                  \
    static void NAME(void *o_, const void *c_, int64_t sc, const void *x_, int64_t sx, const void *y_,       \
                     int64_t sy, int64_t n) {                                                                  \
        const uint8_t *c = c_;                                                                                 \
        const T *x = x_, *y = y_;                                                                              \
        T *o = o_;                                                                                             \
        if (sc && sx && sy)                                                                                    \
            for (int64_t i = 0; i < n; i++) o[i] = c[i] ? x[i] : y[i];                                         \
        else if (!sc)                                                                                          \
            for (int64_t i = 0; i < n; i++) o[i] = c[0] ? x[i * sx] : y[i * sy];                               \
        else                                                                                                   \
            for (int64_t i = 0; i < n; i++) o[i] = c[i] ? x[i * sx] : y[i * sy];                               \
    }
EW_WHERE_DEF(ew_where_1, uint8_t)
EW_WHERE_DEF(ew_where_2, uint16_t)
EW_WHERE_DEF(ew_where_4, uint32_t)
EW_WHERE_DEF(ew_where_8, uint64_t)

static eng_status where_exec(krn_call *c) {
    const eng_tensor *cond = &c->in[0], *x = &c->in[1], *y = &c->in[2];
    eng_tensor *out = &c->out[0];
    if (cond->dtype != ENG_DTYPE_BOOL)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "Where: condition must be bool, got %s", eng_dtype_name(cond->dtype));
    size_t es = eng_dtype_size(x->dtype);
    if (!es || x->dtype != y->dtype)
        return eng_err(ENG_STATUS_UNSUPPORTED, "Where on %s / %s", eng_dtype_name(x->dtype), eng_dtype_name(y->dtype));
    krn_ew_fn fn = es == 1 ? ew_where_1 : es == 2 ? ew_where_2 : es == 4 ? ew_where_4 : ew_where_8;
    krn_bcast bc;
    const eng_tensor *ins[3] = {cond, x, y};
    ENG_TRY(krn_cpu_bcast_init(&bc, out, ins, 3));
    const void *pin[3] = {cond->data, x->data, y->data};
    size_t esz[3] = {1, es, es};
    krn_cpu_bcast_run(&bc, fn, out->data, es, pin, esz, c->nthreads);
    return ENG_STATUS_OK;
}

/* ---- Clip ---- */

static eng_status clip_exec(krn_call *c) {
    const krn_clip_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    eng_tensor *y = &c->out[0];
    int64_t n = eng_tensor_numel(x);
    int hmin = p->from_inputs ? (c->nin > 1 && c->in[1].data != NULL) : 1;
    int hmax = p->from_inputs ? (c->nin > 2 && c->in[2].data != NULL) : 1;
    for (int k = 1; k <= 2; k++)
        if (p->from_inputs && k < c->nin && c->in[k].data && eng_tensor_numel(&c->in[k]) < 1)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "Clip: %s input is empty", k == 1 ? "min" : "max");
    if (n <= 0) return ENG_STATUS_OK;
    if (eng_dtype_is_float(x->dtype)) {
        double lo = -INFINITY, hi = INFINITY;
        if (hmin) lo = p->from_inputs ? eng_tensor_get_f64(&c->in[1], 0) : p->min;
        if (hmax) hi = p->from_inputs ? eng_tensor_get_f64(&c->in[2], 0) : p->max;
        return ew_float_map(KRN_ACT_CLIP, lo, hi, x, y, n, c->nthreads);
    }
    if (!eng_dtype_is_int(x->dtype)) return eng_err(ENG_STATUS_UNSUPPORTED, "Clip on %s", eng_dtype_name(x->dtype));
    int uns64 = x->dtype == ENG_DTYPE_U64;
    if (uns64) {
        uint64_t lo = hmin ? (uint64_t)eng_tensor_get_i64(&c->in[1], 0) : 0;
        uint64_t hi = hmax ? (uint64_t)eng_tensor_get_i64(&c->in[2], 0) : UINT64_MAX;
        const uint64_t *s = x->data;
        uint64_t *d = y->data;
        for (int64_t i = 0; i < n; i++) d[i] = s[i] < lo ? lo : (s[i] > hi ? hi : s[i]);
        return ENG_STATUS_OK;
    }
    int64_t lo = hmin ? (p->from_inputs ? eng_tensor_get_i64(&c->in[1], 0) : (int64_t)p->min) : INT64_MIN;
    int64_t hi = hmax ? (p->from_inputs ? eng_tensor_get_i64(&c->in[2], 0) : (int64_t)p->max) : INT64_MAX;
    if (!p->from_inputs) {
        if (p->min <= -9.2e18f) lo = INT64_MIN;
        if (p->max >= 9.2e18f) hi = INT64_MAX;
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t v = eng_tensor_get_i64(x, i);
        eng_tensor_set_i64(y, i, v < lo ? lo : (v > hi ? hi : v));
    }
    return ENG_STATUS_OK;
}

/* ---- Cast ---- */

#define EW_CAST_LOOP(TS, TD, EXPR)                                                                             \
    do {                                                                                                       \
        const TS *s = (const TS *)src;                                                                         \
        TD *d = (TD *)dst;                                                                                     \
        for (int64_t i = 0; i < n; i++) {                                                                      \
            TS v = s[i];                                                                                       \
            d[i] = (TD)(EXPR);                                                                                 \
        }                                                                                                      \
    } while (0)

/* Convert n elements; fast typed loops for the common pairs, eng_convert for the rest. */
static eng_status ew_cast_range(const void *src, eng_dtype sdt, void *dst, eng_dtype ddt, int64_t n) {
    if (sdt == ddt) {
        memcpy(dst, src, (size_t)n * eng_dtype_size(sdt));
        return ENG_STATUS_OK;
    }
    if (sdt == ENG_DTYPE_F32 && ew_is_half(ddt)) { ew_f32_to_half(src, dst, ddt, n); return ENG_STATUS_OK; }
    if (ew_is_half(sdt) && ddt == ENG_DTYPE_F32) { ew_half_to_f32(src, sdt, dst, n); return ENG_STATUS_OK; }
    if (ew_is_half(sdt) && ew_is_half(ddt)) {
        float buf[EW_CHUNK];
        for (int64_t o = 0; o < n; o += EW_CHUNK) {
            int64_t m = n - o < EW_CHUNK ? n - o : EW_CHUNK;
            ew_half_to_f32((const uint16_t *)src + o, sdt, buf, m);
            ew_f32_to_half(buf, (uint16_t *)dst + o, ddt, m);
        }
        return ENG_STATUS_OK;
    }
    switch (sdt * 100 + ddt) {
    case ENG_DTYPE_F32 * 100 + ENG_DTYPE_F64: EW_CAST_LOOP(float, double, v); return ENG_STATUS_OK;
    case ENG_DTYPE_F64 * 100 + ENG_DTYPE_F32: EW_CAST_LOOP(double, float, v); return ENG_STATUS_OK;
    case ENG_DTYPE_F32 * 100 + ENG_DTYPE_I32: EW_CAST_LOOP(float, int32_t, v != v ? 0 : v); return ENG_STATUS_OK;
    case ENG_DTYPE_F32 * 100 + ENG_DTYPE_I64: EW_CAST_LOOP(float, int64_t, v != v ? 0 : v); return ENG_STATUS_OK;
    case ENG_DTYPE_I32 * 100 + ENG_DTYPE_F32: EW_CAST_LOOP(int32_t, float, v); return ENG_STATUS_OK;
    case ENG_DTYPE_I64 * 100 + ENG_DTYPE_F32: EW_CAST_LOOP(int64_t, float, v); return ENG_STATUS_OK;
    case ENG_DTYPE_I64 * 100 + ENG_DTYPE_I32: EW_CAST_LOOP(int64_t, int32_t, v); return ENG_STATUS_OK;
    case ENG_DTYPE_I32 * 100 + ENG_DTYPE_I64: EW_CAST_LOOP(int32_t, int64_t, v); return ENG_STATUS_OK;
    case ENG_DTYPE_U8 * 100 + ENG_DTYPE_F32: EW_CAST_LOOP(uint8_t, float, v); return ENG_STATUS_OK;
    case ENG_DTYPE_BOOL * 100 + ENG_DTYPE_F32: EW_CAST_LOOP(uint8_t, float, v != 0); return ENG_STATUS_OK;
    case ENG_DTYPE_F32 * 100 + ENG_DTYPE_BOOL: EW_CAST_LOOP(float, uint8_t, v != 0); return ENG_STATUS_OK;
    case ENG_DTYPE_I64 * 100 + ENG_DTYPE_BOOL: EW_CAST_LOOP(int64_t, uint8_t, v != 0); return ENG_STATUS_OK;
    case ENG_DTYPE_BOOL * 100 + ENG_DTYPE_I64: EW_CAST_LOOP(uint8_t, int64_t, v != 0); return ENG_STATUS_OK;
    default: return eng_convert(src, sdt, dst, ddt, n);
    }
}

static eng_status cast_exec(krn_call *c) {
    const eng_tensor *x = &c->in[0];
    eng_tensor *y = &c->out[0];
    size_t es = eng_dtype_size(x->dtype), ed = eng_dtype_size(y->dtype);
    if (!es || !ed)
        return eng_err(ENG_STATUS_UNSUPPORTED, "Cast from %s to %s", eng_dtype_name(x->dtype), eng_dtype_name(y->dtype));
    int64_t n = eng_tensor_numel(x);
    if (n <= 0) return ENG_STATUS_OK;
    int64_t chunk = 16384, nch = (n + chunk - 1) / chunk;
    eng_status st = ENG_STATUS_OK;
    int nt = c->nthreads > 0 ? c->nthreads : 1;
#pragma omp parallel for num_threads(nt) schedule(static) if (n > KRN_ELTWISE_PAR_MIN && nt > 1)
    for (int64_t k = 0; k < nch; k++) {
        int64_t o = k * chunk, m = n - o < chunk ? n - o : chunk;
        eng_status s = ew_cast_range((const char *)x->data + (size_t)o * es, x->dtype, (char *)y->data + (size_t)o * ed,
                                     y->dtype, m);
        if (s != ENG_STATUS_OK) {
#pragma omp critical(ew_cast_err)
            st = s;
        }
    }
    if (st != ENG_STATUS_OK) /* the message was recorded on a worker thread */
        return eng_err(st, "Cast from %s to %s failed", eng_dtype_name(x->dtype), eng_dtype_name(y->dtype));
    return ENG_STATUS_OK;
}

const krn_kernel krn_cpu_eltwise_kernels[] = {
    {"eltwise_unary", NULL, unary_exec, NULL},
    {"eltwise_binary", NULL, binary_exec, NULL, NULL, NULL, binary_io_ok},
    {"eltwise_variadic", NULL, variadic_exec, NULL},
    {"eltwise_where", NULL, where_exec, NULL},
    {"eltwise_clip", NULL, clip_exec, NULL},
    {"eltwise_cast", NULL, cast_exec, NULL},
    {NULL},
};
