/* eltwise-binary.c - numpy broadcasting iteration and the typed binary functions (Add ... PRelu).
 *
 * Broadcasting: krn_cpu_bcast_init drops size-1 output dims, gives each input a stride of 0 on dims it
 * broadcasts, and merges adjacent dims whose strides are compatible for every input. After that the inner dim
 * has input strides 0 or 1, so a same-shape op is one run, a bias [C] over [N,C] is N runs of C with strides
 * (1,1), and a [C,1,1] bias over [N,C,H,W] is N*C runs of H*W with strides (1,0) - each a vectorised loop.
 * Typed functions: one per (op, dtype), each with the four stride cases as separate simple loops.
 * Integer arithmetic wraps (done in unsigned); integer division or modulo by zero gives 0, INT_MIN / -1 wraps:
 * nothing traps.
 */
/* no-trapping-math lets gcc vectorise floorf/ceilf; math-errno cannot be turned off by pragma (sqrt uses
 * intrinsics below instead) */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-math-errno", "no-trapping-math")
#endif

#include <math.h>
#include <string.h>

#include "../krn-eltwise.h"

eng_status krn_cpu_bcast_init(krn_bcast *bc, const eng_tensor *out, const eng_tensor *const *ins, int nin) {
    memset(bc, 0, sizeof *bc);
    bc->nin = nin;
    int rank = out->ndim;
    int64_t dims[ENG_MAX_DIMS], str[3][ENG_MAX_DIMS];
    int nd = 0;
    int64_t contig[3] = {1, 1, 1};
    for (int k = 0; k < nin; k++)
        if (ins[k]->ndim > rank) {
            char a[128], b[128];
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input %d shape %s has more dims than output shape %s", k,
                           eng_shape_str(ins[k]->dims, ins[k]->ndim, a, sizeof a),
                           eng_shape_str(out->dims, out->ndim, b, sizeof b));
        }
    /* walk dims from the innermost outwards, computing contiguous strides of each input */
    int64_t tmpd[ENG_MAX_DIMS], tmps[3][ENG_MAX_DIMS];
    int cnt = 0;
    for (int d = rank - 1; d >= 0; d--) {
        int64_t od = out->dims[d];
        int64_t s[3];
        for (int k = 0; k < nin; k++) {
            int off = rank - ins[k]->ndim;
            int64_t id = d >= off ? ins[k]->dims[d - off] : 1;
            if (id != od && id != 1) {
                char a[128], b[128];
                return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input %d shape %s does not broadcast to %s", k,
                               eng_shape_str(ins[k]->dims, ins[k]->ndim, a, sizeof a),
                               eng_shape_str(out->dims, out->ndim, b, sizeof b));
            }
            s[k] = id == 1 ? 0 : contig[k];
            contig[k] *= id;
        }
        if (od == 1) continue;
        tmpd[cnt] = od;
        for (int k = 0; k < nin; k++) tmps[k][cnt] = s[k];
        cnt++;
    }
    /* tmp* are innermost-first; merge then reverse */
    for (int i = 0; i < cnt; i++) {
        if (nd > 0) {
            int ok = 1;
            for (int k = 0; k < nin; k++)
                if (tmps[k][i] != str[k][nd - 1] * dims[nd - 1]) ok = 0;
            if (ok) {
                dims[nd - 1] *= tmpd[i];
                continue;
            }
        }
        dims[nd] = tmpd[i];
        for (int k = 0; k < nin; k++) str[k][nd] = tmps[k][i];
        nd++;
    }
    if (nd == 0) {
        dims[0] = 1;
        for (int k = 0; k < nin; k++) str[k][0] = 0;
        nd = 1;
    }
    bc->nd = nd;
    bc->n = 1;
    for (int i = 0; i < nd; i++) {
        bc->dims[i] = dims[nd - 1 - i];
        bc->n *= dims[i];
        for (int k = 0; k < nin; k++) bc->str[k][i] = str[k][nd - 1 - i];
    }
    for (int d = 0; d < rank; d++)
        if (out->dims[d] == 0) bc->n = 0;
    return ENG_STATUS_OK;
}

static void bcast_range(const krn_bcast *bc, krn_ew_fn fn, char *o, size_t eo, const char *const *in,
                        const size_t *esz, int64_t start, int64_t end) {
    int nd = bc->nd, nin = bc->nin;
    int64_t inner = bc->dims[nd - 1];
    int64_t idx[ENG_MAX_DIMS] = {0}, off[3] = {0, 0, 0}, si[3] = {0, 0, 0};
    int64_t q = start / inner, j = start % inner;
    for (int d = nd - 2; d >= 0; d--) {
        idx[d] = q % bc->dims[d];
        q /= bc->dims[d];
        for (int k = 0; k < nin; k++) off[k] += idx[d] * bc->str[k][d];
    }
    for (int k = 0; k < nin; k++) si[k] = bc->str[k][nd - 1];
    const char *p[3] = {NULL, NULL, NULL};
    for (int64_t i = start; i < end;) {
        int64_t len = inner - j < end - i ? inner - j : end - i;
        for (int k = 0; k < nin; k++) p[k] = in[k] + (size_t)(off[k] + j * si[k]) * esz[k];
        fn(o + (size_t)i * eo, p[0], si[0], p[1], si[1], p[2], si[2], len);
        i += len;
        j = 0;
        for (int d = nd - 2; d >= 0; d--) {
            idx[d]++;
            for (int k = 0; k < nin; k++) off[k] += bc->str[k][d];
            if (idx[d] < bc->dims[d]) break;
            for (int k = 0; k < nin; k++) off[k] -= bc->str[k][d] * bc->dims[d];
            idx[d] = 0;
        }
    }
}

void krn_cpu_bcast_run(const krn_bcast *bc, krn_ew_fn fn, void *o, size_t eo, const void *const *in,
                       const size_t *esz, int nthreads) {
    int64_t n = bc->n;
    if (n <= 0) return;
    const char *pin[3] = {bc->nin > 0 ? in[0] : NULL, bc->nin > 1 ? in[1] : NULL, bc->nin > 2 ? in[2] : NULL};
    if (n <= KRN_ELTWISE_PAR_MIN || nthreads <= 1) {
        bcast_range(bc, fn, o, eo, pin, esz, 0, n);
        return;
    }
    int64_t nchunks = (int64_t)nthreads * 4;
    int64_t chunk = (n + nchunks - 1) / nchunks;
    chunk = (chunk + 63) & ~(int64_t)63;
    nchunks = (n + chunk - 1) / chunk;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t c = 0; c < nchunks; c++) {
        int64_t s = c * chunk, e = s + chunk < n ? s + chunk : n;
        bcast_range(bc, fn, o, eo, pin, esz, s, e);
    }
}

/* ---- typed functions ---- */

#define EW_BIN_DEF(NAME, TA, TO, EXPR)                                                                         \
    static void NAME(void *o_, const void *a_, int64_t sa, const void *b_, int64_t sb, const void *c_,       \
                     int64_t sc, int64_t n) {                                                                  \
        (void)c_;                                                                                              \
        (void)sc;                                                                                              \
        const TA *a = (const TA *)a_, *b = (const TA *)b_;                                                     \
        TO *o = (TO *)o_;                                                                                      \
        if (sa && sb) {                                                                                        \
            for (int64_t i = 0; i < n; i++) {                                                                  \
                TA x = a[i], y = b[i];                                                                         \
                o[i] = (TO)(EXPR);                                                                             \
            }                                                                                                  \
        } else if (sa) {                                                                                       \
            TA y = b[0];                                                                                       \
            for (int64_t i = 0; i < n; i++) {                                                                  \
                TA x = a[i];                                                                                   \
                o[i] = (TO)(EXPR);                                                                             \
            }                                                                                                  \
        } else if (sb) {                                                                                       \
            TA x = a[0];                                                                                       \
            for (int64_t i = 0; i < n; i++) {                                                                  \
                TA y = b[i];                                                                                   \
                o[i] = (TO)(EXPR);                                                                             \
            }                                                                                                  \
        } else {                                                                                               \
            TA x = a[0], y = b[0];                                                                             \
            TO r = (TO)(EXPR);                                                                                 \
            for (int64_t i = 0; i < n; i++) o[i] = r;                                                          \
        }                                                                                                      \
    }

/* type lists: X(suffix, C type, unsigned twin) */
#define EW_SINTS(X, ...) X(i8, int8_t, uint32_t, __VA_ARGS__) X(i16, int16_t, uint32_t, __VA_ARGS__) \
    X(i32, int32_t, uint32_t, __VA_ARGS__) X(i64, int64_t, uint64_t, __VA_ARGS__)
#define EW_UINTS(X, ...) X(u8, uint8_t, uint32_t, __VA_ARGS__) X(u16, uint16_t, uint32_t, __VA_ARGS__) \
    X(u32, uint32_t, uint32_t, __VA_ARGS__) X(u64, uint64_t, uint64_t, __VA_ARGS__)
#define EW_FLOATS(X, ...) X(f32, float, float, __VA_ARGS__) X(f64, double, double, __VA_ARGS__)

/* wrap-around arithmetic for ints */
#define EW_DEF_ARITH_INT(SFX, T, U, OPN, OPC) EW_BIN_DEF(ew_##OPN##_##SFX, T, T, (T)((U)x OPC (U)y))
#define EW_DEF_ARITH_FLT(SFX, T, U, OPN, OPC) EW_BIN_DEF(ew_##OPN##_##SFX, T, T, x OPC y)
EW_SINTS(EW_DEF_ARITH_INT, add, +) EW_UINTS(EW_DEF_ARITH_INT, add, +) EW_FLOATS(EW_DEF_ARITH_FLT, add, +)
EW_SINTS(EW_DEF_ARITH_INT, sub, -) EW_UINTS(EW_DEF_ARITH_INT, sub, -) EW_FLOATS(EW_DEF_ARITH_FLT, sub, -)
EW_SINTS(EW_DEF_ARITH_INT, mul, *) EW_UINTS(EW_DEF_ARITH_INT, mul, *) EW_FLOATS(EW_DEF_ARITH_FLT, mul, *)
EW_FLOATS(EW_DEF_ARITH_FLT, div, /)

#define EW_DEF_DIV_S(SFX, T, U, _) EW_BIN_DEF(ew_div_##SFX, T, T, y == 0 ? 0 : (y == -1 ? (T)(0 - (U)x) : x / y))
#define EW_DEF_DIV_U(SFX, T, U, _) EW_BIN_DEF(ew_div_##SFX, T, T, y == 0 ? 0 : x / y)
EW_SINTS(EW_DEF_DIV_S, 0) EW_UINTS(EW_DEF_DIV_U, 0)

/* python-style modulo: sign of the divisor */
static inline int64_t ew_pymod_i(int64_t x, int64_t y) {
    if (y == 0 || y == -1) return 0;
    int64_t r = x % y;
    return (r != 0 && ((r < 0) != (y < 0))) ? r + y : r;
}
static inline double ew_pymod_f(double x, double y) {
    double r = fmod(x, y);
    return (r != 0 && ((r < 0) != (y < 0))) ? r + y : r;
}
static inline float ew_pymod_ff(float x, float y) {
    float r = fmodf(x, y);
    return (r != 0 && ((r < 0) != (y < 0))) ? r + y : r;
}
#define EW_DEF_MOD_S(SFX, T, U, _) EW_BIN_DEF(ew_mod_##SFX, T, T, ew_pymod_i(x, y)) \
    EW_BIN_DEF(ew_fmod_##SFX, T, T, (y == 0 || y == -1) ? 0 : x % y)
#define EW_DEF_MOD_U(SFX, T, U, _) EW_BIN_DEF(ew_mod_##SFX, T, T, y == 0 ? 0 : x % y) \
    EW_BIN_DEF(ew_fmod_##SFX, T, T, y == 0 ? 0 : x % y)
EW_SINTS(EW_DEF_MOD_S, 0) EW_UINTS(EW_DEF_MOD_U, 0)
EW_BIN_DEF(ew_mod_f32, float, float, ew_pymod_ff(x, y))
EW_BIN_DEF(ew_fmod_f32, float, float, fmodf(x, y))
EW_BIN_DEF(ew_mod_f64, double, double, ew_pymod_f(x, y))
EW_BIN_DEF(ew_fmod_f64, double, double, fmod(x, y))

#define EW_DEF_SHIFT(SFX, T, U, _) \
    EW_BIN_DEF(ew_shl_##SFX, T, T, y >= (T)(8 * sizeof(T)) ? 0 : (T)(x << y)) \
    EW_BIN_DEF(ew_shr_##SFX, T, T, y >= (T)(8 * sizeof(T)) ? 0 : (T)(x >> y))
EW_UINTS(EW_DEF_SHIFT, 0)

#define EW_DEF_CMP(SFX, T, U, _) \
    EW_BIN_DEF(ew_eq_##SFX, T, uint8_t, x == y) EW_BIN_DEF(ew_gt_##SFX, T, uint8_t, x > y) \
    EW_BIN_DEF(ew_lt_##SFX, T, uint8_t, x < y) EW_BIN_DEF(ew_ge_##SFX, T, uint8_t, x >= y) \
    EW_BIN_DEF(ew_le_##SFX, T, uint8_t, x <= y)
EW_SINTS(EW_DEF_CMP, 0) EW_UINTS(EW_DEF_CMP, 0) EW_FLOATS(EW_DEF_CMP, 0)

EW_BIN_DEF(ew_and_b, uint8_t, uint8_t, (x != 0) & (y != 0))
EW_BIN_DEF(ew_or_b, uint8_t, uint8_t, (x != 0) | (y != 0))
EW_BIN_DEF(ew_xor_b, uint8_t, uint8_t, (x != 0) ^ (y != 0))

#define EW_DEF_MINMAX_I(SFX, T, U, _) EW_BIN_DEF(ew_min_##SFX, T, T, x < y ? x : y) \
    EW_BIN_DEF(ew_max_##SFX, T, T, x > y ? x : y)
#define EW_DEF_MINMAX_F(SFX, T, U, _) EW_BIN_DEF(ew_min_##SFX, T, T, (x <= y || x != x) ? x : y) \
    EW_BIN_DEF(ew_max_##SFX, T, T, (x >= y || x != x) ? x : y)
EW_SINTS(EW_DEF_MINMAX_I, 0) EW_UINTS(EW_DEF_MINMAX_I, 0) EW_FLOATS(EW_DEF_MINMAX_F, 0)

#define EW_DEF_PRELU(SFX, T, U, _) EW_BIN_DEF(ew_prelu_##SFX, T, T, x < 0 ? (T)((U)x * (U)y) : x)
EW_SINTS(EW_DEF_PRELU, 0)
EW_BIN_DEF(ew_prelu_f32, float, float, x < 0 ? x * y : x)
EW_BIN_DEF(ew_prelu_f64, double, double, x < 0 ? x * y : x)
EW_BIN_DEF(ew_pow_f32, float, float, powf(x, y))
EW_BIN_DEF(ew_pow_f64, double, double, pow(x, y))

#define EW_CASE_S(SFX, T, U, OPN) case ENG_DTYPE_##SFX##_: return ew_##OPN##_##SFX;
/* map suffix to dtype enum */
#define ENG_DTYPE_i8_ ENG_DTYPE_I8
#define ENG_DTYPE_i16_ ENG_DTYPE_I16
#define ENG_DTYPE_i32_ ENG_DTYPE_I32
#define ENG_DTYPE_i64_ ENG_DTYPE_I64
#define ENG_DTYPE_u8_ ENG_DTYPE_U8
#define ENG_DTYPE_u16_ ENG_DTYPE_U16
#define ENG_DTYPE_u32_ ENG_DTYPE_U32
#define ENG_DTYPE_u64_ ENG_DTYPE_U64
#define ENG_DTYPE_f32_ ENG_DTYPE_F32
#define ENG_DTYPE_f64_ ENG_DTYPE_F64

#define EW_SW_ALL(OPN) switch (dt) { EW_SINTS(EW_CASE_S, OPN) EW_UINTS(EW_CASE_S, OPN) EW_FLOATS(EW_CASE_S, OPN) default: return NULL; }

krn_ew_fn krn_cpu_binary_fn(int op, eng_dtype dt) {
    switch (op) {
    case KRN_BIN_ADD: EW_SW_ALL(add)
    case KRN_BIN_SUB: EW_SW_ALL(sub)
    case KRN_BIN_MUL: EW_SW_ALL(mul)
    case KRN_BIN_DIV: EW_SW_ALL(div)
    case KRN_BIN_MOD: EW_SW_ALL(mod)
    case KRN_BIN_FMOD: EW_SW_ALL(fmod)
    case KRN_BIN_MIN: EW_SW_ALL(min)
    case KRN_BIN_MAX: EW_SW_ALL(max)
    case KRN_BIN_POW: switch (dt) { EW_FLOATS(EW_CASE_S, pow) default: return NULL; }
    case KRN_BIN_SHL: switch (dt) { EW_UINTS(EW_CASE_S, shl) default: return NULL; }
    case KRN_BIN_SHR: switch (dt) { EW_UINTS(EW_CASE_S, shr) default: return NULL; }
    case KRN_BIN_PRELU: switch (dt) { EW_SINTS(EW_CASE_S, prelu) EW_FLOATS(EW_CASE_S, prelu) default: return NULL; }
    case KRN_BIN_EQ: if (dt == ENG_DTYPE_BOOL) return ew_eq_u8; EW_SW_ALL(eq)
    case KRN_BIN_GT: if (dt == ENG_DTYPE_BOOL) return ew_gt_u8; EW_SW_ALL(gt)
    case KRN_BIN_LT: if (dt == ENG_DTYPE_BOOL) return ew_lt_u8; EW_SW_ALL(lt)
    case KRN_BIN_GE: if (dt == ENG_DTYPE_BOOL) return ew_ge_u8; EW_SW_ALL(ge)
    case KRN_BIN_LE: if (dt == ENG_DTYPE_BOOL) return ew_le_u8; EW_SW_ALL(le)
    case KRN_BIN_AND: return dt == ENG_DTYPE_BOOL ? ew_and_b : NULL;
    case KRN_BIN_OR: return dt == ENG_DTYPE_BOOL ? ew_or_b : NULL;
    case KRN_BIN_XOR: return dt == ENG_DTYPE_BOOL ? ew_xor_b : NULL;
    default: return NULL;
    }
}
