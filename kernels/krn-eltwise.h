/* krn-eltwise.h - params and helpers of the elementwise op family (unary math, activations, broadcasting
 * binary/variadic ops, Where, Clip, Cast).
 *
 * Public to other kernels: krn_act + krn_cpu_activation_apply (in-place activation on a float buffer, used by
 * Conv/MatMul fusion) and the fast float math helpers krn_cpu_expf_vec/krn_cpu_unary_f32.
 * The rest (broadcast iterator, binary function tables) is shared only among kernels/cpu/eltwise*.c.
 *
 * Invariants: a float->float activation never changes the element count and is safe in place (x == y).
 * Broadcast iteration collapses the output shape so that the innermost dim has input strides 0 or 1;
 * elementwise functions are called on runs of that inner dim.
 */
#ifndef KRN_ELTWISE_H
#define KRN_ELTWISE_H

#include <stddef.h>
#include <stdint.h>

#include "../engine/ir/tensor.h"

/* Elementwise float maps. alpha/beta meanings are given per value; unused ones are ignored. */
typedef enum krn_act {
    KRN_ACT_NONE = 0,
    KRN_ACT_RELU,
    KRN_ACT_LEAKY_RELU,     /* alpha: negative slope */
    KRN_ACT_SIGMOID,
    KRN_ACT_TANH,
    KRN_ACT_GELU,           /* exact: 0.5 x (1 + erf(x / sqrt 2)) */
    KRN_ACT_GELU_TANH,      /* tanh approximation */
    KRN_ACT_CLIP,           /* alpha: min, beta: max */
    KRN_ACT_ELU,            /* alpha */
    KRN_ACT_SELU,           /* alpha, beta: gamma */
    KRN_ACT_CELU,           /* alpha */
    KRN_ACT_HARD_SIGMOID,   /* alpha, beta: max(0, min(1, alpha x + beta)) */
    KRN_ACT_HARD_SWISH,
    KRN_ACT_SOFTPLUS,
    KRN_ACT_SOFTSIGN,
    KRN_ACT_THRESHOLDED_RELU, /* alpha */
    KRN_ACT_SHRINK,         /* alpha: bias, beta: lambd */
    KRN_ACT_MISH,
    KRN_ACT_SILU,           /* x * sigmoid(x) */
    /* plain unary math */
    KRN_ACT_SQRT,
    KRN_ACT_RECIPROCAL,
    KRN_ACT_EXP,
    KRN_ACT_LOG,
    KRN_ACT_ABS,
    KRN_ACT_NEG,
    KRN_ACT_FLOOR,
    KRN_ACT_CEIL,
    KRN_ACT_ROUND,          /* half to even */
    KRN_ACT_SIGN,
    KRN_ACT_ERF,
    KRN_ACT_SIN,
    KRN_ACT_COS,
    KRN_ACT_TAN,
    KRN_ACT_ASIN,
    KRN_ACT_ACOS,
    KRN_ACT_ATAN,
    KRN_ACT_SINH,
    KRN_ACT_COSH,
    KRN_ACT_ASINH,
    KRN_ACT_ACOSH,
    KRN_ACT_ATANH,
    /* from here on: not float->float (only through the eltwise_unary kernel) */
    KRN_ACT_ISNAN,          /* float -> bool */
    KRN_ACT_ISINF,          /* float -> bool; alpha != 0: detect +inf, beta != 0: detect -inf */
    KRN_ACT_NOT,            /* bool -> bool */
    KRN_ACT_COUNT
} krn_act;

/* Apply activation `act` in place to x[0..n). Thread-safe, no allocation; uses up to nthreads OpenMP threads
 * when n is large. Returns INVALID_ARGUMENT for an act that is not a float->float map. */
eng_status krn_cpu_activation_apply(int act, float alpha, float beta, float *x, int64_t n, int nthreads);

/* Single-threaded float map y[i] = act(x[i]); x == y allowed. Unknown acts copy. */
void krn_cpu_unary_f32(int act, float alpha, float beta, const float *x, float *y, int64_t n);
/* Same in double precision (libm). */
void krn_cpu_unary_f64(int act, double alpha, double beta, const double *x, double *y, int64_t n);
/* y[i] = exp(x[i]) with ~2 ulp accuracy, vectorised; x == y allowed. */
void krn_cpu_expf_vec(const float *x, float *y, int64_t n);

/* ---- params (engine/ops/eltwise.c fills them) ---- */
typedef struct krn_unary_params {
    int op;        /* krn_act */
    float alpha, beta;
} krn_unary_params;

typedef enum krn_binop {
    KRN_BIN_ADD = 0,
    KRN_BIN_SUB,
    KRN_BIN_MUL,
    KRN_BIN_DIV,      /* integer division by 0 yields 0 (never traps) */
    KRN_BIN_POW,
    KRN_BIN_MOD,      /* Python/numpy sign rules (result has the divisor's sign) */
    KRN_BIN_FMOD,     /* C fmod / truncated % (result has the dividend's sign) */
    KRN_BIN_SHL,
    KRN_BIN_SHR,
    KRN_BIN_EQ,       /* comparisons output bool */
    KRN_BIN_GT,
    KRN_BIN_LT,
    KRN_BIN_GE,
    KRN_BIN_LE,
    KRN_BIN_AND,      /* bool only */
    KRN_BIN_OR,
    KRN_BIN_XOR,
    KRN_BIN_MIN,
    KRN_BIN_MAX,
    KRN_BIN_PRELU,    /* x < 0 ? x * slope : x */
    KRN_BIN_COUNT
} krn_binop;

typedef struct krn_binary_params {
    int op;                      /* krn_binop */
    int b_override;              /* 1: view input 1 with b_dims (ONNX < 7 `broadcast`/`axis`, PRelu < 7) */
    int b_ndim;
    int64_t b_dims[ENG_MAX_DIMS];
    int layout;                  /* krn_nn_layout of the 4-D output and of every input shaped like it */
} krn_binary_params;

typedef struct krn_variadic_params {
    int op;                      /* KRN_BIN_ADD (Sum), KRN_BIN_MIN, KRN_BIN_MAX */
    int mean;                    /* 1: divide the sum by the input count (Mean) */
} krn_variadic_params;

typedef struct krn_clip_params {
    int from_inputs;             /* 1: min/max are optional inputs 1, 2 (opset >= 11); else the attrs below */
    float min, max;
} krn_clip_params;

typedef struct krn_cast_params {
    int to;                      /* eng_dtype of the output */
} krn_cast_params;

/* ---- shared among kernels/cpu/eltwise*.c ---- */

/* Elementwise function over a run of n outputs: inputs advance by stride sa/sb/sc (each 0 or 1) elements. */
typedef void (*krn_ew_fn)(void *o, const void *a, int64_t sa, const void *b, int64_t sb, const void *c, int64_t sc,
                          int64_t n);

/* Output shape collapsed with per-input element strides (0 where broadcast). */
typedef struct krn_bcast {
    int nin;                       /* 1..3 */
    int nd;                        /* >= 1 */
    int64_t n;                     /* output elements */
    int64_t dims[ENG_MAX_DIMS];
    int64_t str[3][ENG_MAX_DIMS];
} krn_bcast;

/* Build the iteration for `out` from inputs (their dims must broadcast to out's; not re-checked beyond
 * returning INVALID_ARGUMENT naming the shapes). */
eng_status krn_cpu_bcast_init(krn_bcast *bc, const eng_tensor *out, const eng_tensor *const *ins, int nin);
/* Run fn over all outputs, splitting the range across up to nthreads threads when large.
 * esz: element sizes of inputs, eo: of the output. */
void krn_cpu_bcast_run(const krn_bcast *bc, krn_ew_fn fn, void *o, size_t eo, const void *const *in,
                       const size_t *esz, int nthreads);

/* Typed binary function for op on dtype dt (comparison ops write bool). NULL if unsupported. f16/bf16 are
 * never supported here (callers widen them to f32). */
krn_ew_fn krn_cpu_binary_fn(int op, eng_dtype dt);

/* Elements above which kernels go multi-threaded. */
#define KRN_ELTWISE_PAR_MIN ((int64_t)1 << 16)

#endif
