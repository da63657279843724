/* reduce-tmpl.h - ReduceX inner loops for one element type; included by kernels/cpu/reduce.c once per type.
 *
 * Before including, define RT (element/accumulator type), RT_SFX (name suffix) and RT_IS_INT (1 for int64).
 * red_pass_<sfx> walks a collapsed shape (krn_red_shape) over a range [lo, hi) of its first kept dim,
 * folding every input element into its output with one combine (add/mul/max/min) after one elementwise
 * transform (identity/abs/square/exp(x - shift[out])). The innermost collapsed dim is always contiguous: a
 * reduced inner dim folds a row into one accumulator (omp simd reduction), a kept inner dim folds a row into a
 * vector of outputs. No strided inner loops. Outputs must be pre-filled with the combine's identity.
 */
#define RT_CAT2(a, b) a##_##b
#define RT_CAT(a, b) RT_CAT2(a, b)
#define RT_FN(name) RT_CAT(name, RT_SFX)

static inline __attribute__((always_inline)) RT RT_FN(red_xf)(RT v, int xf, RT sh) {
    switch (xf) {
    case RED_XF_ABS: return v < 0 ? -v : v;
    case RED_XF_SQ: return v * v;
#if !RT_IS_INT
    case RED_XF_EXP: return RT_EXP(v - sh);
#endif
    default: return v;
    }
}

static inline __attribute__((always_inline)) RT RT_FN(red_comb)(RT a, RT b, int comb) {
    switch (comb) {
    case RED_COMB_MUL: return a * b;
    case RED_COMB_MAX: return b > a ? b : a;
    case RED_COMB_MIN: return b < a ? b : a;
    default: return a + b;
    }
}

/* Fold row x[0..n) into *acc. comb/xf are compile-time constants at each call site below. */
static inline __attribute__((always_inline)) void RT_FN(red_row)(const RT *restrict x, int64_t n, RT *acc, int comb,
                                                                  int xf, RT sh) {
    RT a = *acc;
    switch (comb) {
    case RED_COMB_ADD: {
        RT s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < n; i++) s += RT_FN(red_xf)(x[i], xf, sh);
        a += s;
        break;
    }
    case RED_COMB_MUL: {
        RT s = 1;
#pragma omp simd reduction(* : s)
        for (int64_t i = 0; i < n; i++) s *= RT_FN(red_xf)(x[i], xf, sh);
        a *= s;
        break;
    }
    case RED_COMB_MAX: {
        for (int64_t i = 0; i < n; i++) {
            RT v = RT_FN(red_xf)(x[i], xf, sh);
            a = v > a ? v : a;
        }
        break;
    }
    default: {
        for (int64_t i = 0; i < n; i++) {
            RT v = RT_FN(red_xf)(x[i], xf, sh);
            a = v < a ? v : a;
        }
        break;
    }
    }
    *acc = a;
}

/* y[i] = comb(y[i], xf(x[i])) for i < n, with a per-output shift (exp transform) or none. */
static inline __attribute__((always_inline)) void RT_FN(red_vec)(const RT *restrict x, int64_t n, RT *restrict y,
                                                                  const RT *restrict sh, int comb, int xf) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = RT_FN(red_comb)(y[i], RT_FN(red_xf)(x[i], xf, sh ? sh[i] : 0), comb);
}

static void RT_FN(red_walk)(const RT *x, RT *y, const RT *shift, const krn_red_shape *s, int pdim, int64_t lo,
                            int64_t hi, int comb, int xf) {
    int nd = s->nd, last = nd - 1;
    int64_t idx[ENG_MAX_DIMS] = {0}, beg[ENG_MAX_DIMS], end[ENG_MAX_DIMS];
    for (int d = 0; d < nd; d++) beg[d] = 0, end[d] = s->n[d];
    if (pdim >= 0) beg[pdim] = lo, end[pdim] = hi;
    for (int d = 0; d < nd; d++) {
        idx[d] = beg[d];
        if (beg[d] >= end[d]) return;
    }
    int64_t inner_n = end[last] - beg[last];
    for (;;) {
        int64_t io = 0, oo = 0;
        for (int d = 0; d < last; d++) io += idx[d] * s->istride[d], oo += idx[d] * s->ostride[d];
        io += beg[last];
        const RT *xr = x + io;
        if (s->red[last]) {
            RT sh = shift ? shift[oo] : 0;
#define RT_ROW(C, X) RT_FN(red_row)(xr, inner_n, y + oo, C, X, sh)
            switch (comb * 8 + xf) {
            case RED_COMB_ADD * 8 + RED_XF_ID: RT_ROW(RED_COMB_ADD, RED_XF_ID); break;
            case RED_COMB_ADD * 8 + RED_XF_ABS: RT_ROW(RED_COMB_ADD, RED_XF_ABS); break;
            case RED_COMB_ADD * 8 + RED_XF_SQ: RT_ROW(RED_COMB_ADD, RED_XF_SQ); break;
            case RED_COMB_ADD * 8 + RED_XF_EXP: RT_ROW(RED_COMB_ADD, RED_XF_EXP); break;
            case RED_COMB_MUL * 8 + RED_XF_ID: RT_ROW(RED_COMB_MUL, RED_XF_ID); break;
            case RED_COMB_MAX * 8 + RED_XF_ID: RT_ROW(RED_COMB_MAX, RED_XF_ID); break;
            default: RT_ROW(RED_COMB_MIN, RED_XF_ID); break;
            }
#undef RT_ROW
        } else {
            oo += beg[last];
            RT *yr = y + oo;
            const RT *sr = shift ? shift + oo : NULL;
#define RT_VEC(C, X) RT_FN(red_vec)(xr, inner_n, yr, sr, C, X)
            switch (comb * 8 + xf) {
            case RED_COMB_ADD * 8 + RED_XF_ID: RT_VEC(RED_COMB_ADD, RED_XF_ID); break;
            case RED_COMB_ADD * 8 + RED_XF_ABS: RT_VEC(RED_COMB_ADD, RED_XF_ABS); break;
            case RED_COMB_ADD * 8 + RED_XF_SQ: RT_VEC(RED_COMB_ADD, RED_XF_SQ); break;
            case RED_COMB_ADD * 8 + RED_XF_EXP: RT_VEC(RED_COMB_ADD, RED_XF_EXP); break;
            case RED_COMB_MUL * 8 + RED_XF_ID: RT_VEC(RED_COMB_MUL, RED_XF_ID); break;
            case RED_COMB_MAX * 8 + RED_XF_ID: RT_VEC(RED_COMB_MAX, RED_XF_ID); break;
            default: RT_VEC(RED_COMB_MIN, RED_XF_ID); break;
            }
#undef RT_VEC
        }
        int d = last - 1;
        for (; d >= 0; d--) {
            if (++idx[d] < end[d]) break;
            idx[d] = beg[d];
        }
        if (d < 0) return;
    }
}

/* One full pass over x into y (pre-filled), split across threads along the first kept dim when it pays. */
static void RT_FN(red_pass)(const RT *x, RT *y, const RT *shift, const krn_red_shape *s, int comb, int xf,
                            int nthreads) {
    if (s->nd == 0) {
        /* every dim has size 1: one element into one output */
        RT v = RT_FN(red_xf)(x[0], xf, shift ? shift[0] : 0);
        y[0] = RT_FN(red_comb)(y[0], v, comb);
        return;
    }
    int pdim = -1;
    for (int d = 0; d < s->nd; d++)
        if (!s->red[d]) { pdim = d; break; }
    int64_t total = s->count * s->out_numel;
    if (pdim < 0 || nthreads <= 1 || total < 32768) {
        RT_FN(red_walk)(x, y, shift, s, -1, 0, 0, comb, xf);
        return;
    }
    int64_t n = s->n[pdim];
    int nt = nthreads;
    if (n < nt) nt = (int)n;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int t = 0; t < nt; t++) {
        int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
        RT_FN(red_walk)(x, y, shift, s, pdim, lo, hi, comb, xf);
    }
}

#undef RT_FN
#undef RT_CAT
#undef RT_CAT2
