/* krn-nn.h - params of the "nn" kernel family (MatMul, Gemm, Conv, ConvTranspose, pooling and the fused
 * com.tensord ops) plus the small oneDNN helper layer the nn kernels share.
 *
 * Params are plain structs filled by engine/ops/nn.c: prepare parses attributes, infer resolves everything
 * shape-dependent (auto_pad -> explicit pads, kernel_shape from W, output shapes), so kernels never look at
 * ONNX attributes. Spatial arrays hold up to KRN_NN_MAX_SPATIAL entries; pads are [begin..., end...].
 * Activations fused into conv/matmul are applied after bias and after the residual add.
 */
#ifndef KRN_NN_H
#define KRN_NN_H

#include <stdint.h>

#include "../engine/ir/status.h"
#include "../engine/ir/tensor.h"

#define KRN_NN_MAX_SPATIAL 3

typedef enum krn_nn_act {
    KRN_NN_ACT_NONE = 0,
    KRN_NN_ACT_RELU = 1,         /* alpha = negative slope (0 for Relu, LeakyRelu's alpha) */
    KRN_NN_ACT_CLIP = 2,         /* alpha = min, beta = max */
    KRN_NN_ACT_SIGMOID = 3,
    KRN_NN_ACT_TANH = 4,
    KRN_NN_ACT_HARD_SIGMOID = 5, /* max(0, min(1, alpha*x + beta)) */
    KRN_NN_ACT_GELU_ERF = 6,
    KRN_NN_ACT_GELU_TANH = 7,
    KRN_NN_ACT_ELU = 8,          /* alpha */
    KRN_NN_ACT_SWISH = 9,        /* x * sigmoid(alpha * x) (SiLU: alpha = 1) */
    KRN_NN_ACT_HARD_SWISH = 10,  /* x * max(0, min(1, x / 6 + 1 / 2)) */
} krn_nn_act;

typedef struct krn_nn_act_params {
    int kind; /* krn_nn_act */
    float alpha, beta;
} krn_nn_act_params;

/* Conv / ConvTranspose / com.tensord FusedConv. Inputs: X (N,C,spatial...), W, optional B (M), and for
 * FusedConv an optional residual Z shaped like Y (added after bias, before the activation). */
typedef struct krn_conv_params {
    int nspatial;
    int transposed;                          /* ConvTranspose */
    int64_t group;
    int64_t kernel[KRN_NN_MAX_SPATIAL];
    int64_t strides[KRN_NN_MAX_SPATIAL];
    int64_t dilations[KRN_NN_MAX_SPATIAL];
    int64_t pads[2 * KRN_NN_MAX_SPATIAL];    /* resolved by infer (auto_pad applied) */
    int64_t output_padding[KRN_NN_MAX_SPATIAL];
    krn_nn_act_params act;
    int has_residual;                        /* input 3 is Z */
    int x_layout, y_layout;                  /* krn_nn_layout of X and of Y (and Z, which matches Y) */
    int pool;                                /* FusedConv only: a 2-D MaxPool (no pads/dilation) follows; Y is pooled */
    int64_t pool_kernel[2], pool_strides[2];
    /* FusedConv only: a 3x3 depthwise conv (pads 1, stride dw_stride, activation dw_act) reads this 1x1 conv's
     * output, which never reaches memory (oneDNN's depthwise post-op); inputs 4 and 5 are its W (M, 1, 3, 3) and
     * optional B (M); Y is the depthwise conv's output. 0: none. */
    int dw_stride;
    krn_nn_act_params dw_act;
} krn_conv_params;

/* Memory layout of a 4-D float32 activation that only nn kernels see (set by engine/plan/fuse.c's layout pass).
 * BLOCKED means oneDNN's nChw16c when C % 16 == 0, else NHWC: both hold exactly N*C*H*W floats, so the planner's
 * buffer sizes stay right while the logical shape stays NCHW. */
typedef enum krn_nn_layout {
    KRN_NN_LAYOUT_PLAIN = 0,
    KRN_NN_LAYOUT_BLOCKED = 1,
    /* nChw16c with C rounded up to a multiple of 16, the extra channels zero (oneDNN writes and expects them):
     * for C % 16 != 0 activations that only convs read, so 24- or 40-channel stages between nChw16c ones need no
     * conversion. Its buffer holds N * ceil16(C) * H * W floats (krn_nn_padded_numel); only conv kernels see it. */
    KRN_NN_LAYOUT_BLOCKED16_PADDED = 2,
    /* channels last (NHWC), for 8-bit activations that only QLinearConv / QLinearAdd read and write (the int8
     * layout pass in engine/plan/fuse-qdq.c): oneDNN's int8 convs run channels last, so chains of them need no
     * conversion. Same byte count as NCHW. */
    KRN_NN_LAYOUT_NHWC = 3,
} krn_nn_layout;

/* Elements a 4-D activation of logical dims [N, C, H, W] occupies in KRN_NN_LAYOUT_BLOCKED16_PADDED. */
static inline int64_t krn_nn_padded_numel(const int64_t *dims) {
    return dims[0] * ((dims[1] + 15) / 16 * 16) * dims[2] * dims[3];
}

/* 1 when a BLOCKED activation with C channels is nChw16c, 0 when it is NHWC: C % 16 == 0 (TENSORD_BLOCKED=nhwc
 * makes every BLOCKED activation NHWC, for comparisons). The one place that decides it. */
int krn_nn_blocked16(int64_t C);

/* 2-D MaxPool without padding/dilation from X in nChw16c (C % 16 == 0) to plain NCHW Y; windows must lie
 * inside X. Parallel over (n, channel block). */
void krn_cpu_maxpool2d_blocked16(const float *X, float *Y, int64_t N, int64_t C, int64_t H, int64_t W, int64_t OH,
                                 int64_t OW, int64_t KH, int64_t KW, int64_t SH, int64_t SW, int nthreads);

typedef enum krn_pool_kind {
    KRN_POOL_MAX = 0,
    KRN_POOL_AVG = 1,
    KRN_POOL_LP = 2,
} krn_pool_kind;

/* MaxPool / AveragePool / LpPool and their Global* forms (global: kernel = whole spatial extent). */
typedef struct krn_pool_params {
    int kind;                                /* krn_pool_kind */
    int nspatial;
    int global;
    int64_t kernel[KRN_NN_MAX_SPATIAL];
    int64_t strides[KRN_NN_MAX_SPATIAL];
    int64_t dilations[KRN_NN_MAX_SPATIAL];
    int64_t pads[2 * KRN_NN_MAX_SPATIAL];    /* resolved by infer */
    int count_include_pad;
    int storage_order;                       /* MaxPool Indices: 0 row-major, 1 column-major */
    float p;                                 /* LpPool exponent */
    int x_layout;                            /* krn_nn_layout of X */
    int y_layout;                            /* krn_nn_layout of Y (BLOCKED only with a BLOCKED X) */
} krn_pool_params;

/* MatMul / Gemm / com.tensord FusedMatMul / FusedGemm: Y = act(alpha * op(A) op(B) + beta * C).
 * MatMul has numpy batch broadcasting; Gemm is 2-D with C broadcast to (M, N). */
typedef struct krn_matmul_params {
    int gemm;          /* Gemm semantics (2-D, trans flags, C) */
    int trans_a, trans_b;
    float alpha, beta;
    int has_bias;      /* input 2 present (Gemm C, or FusedMatMul's bias) */
    krn_nn_act_params act;
} krn_matmul_params;

/* ---- CPU-internal oneDNN helpers (kernels/cpu/dnnl.c); visible only to files that include dnnl.h first ---- */
#ifdef ONEAPI_DNNL_DNNL_H
/* Record "oneDNN call `stmt` failed: <status> (func at file:line)" and return ENG_STATUS_INTERNAL
 * (ENG_STATUS_UNSUPPORTED for dnnl_unimplemented, so callers can fall back to a reference loop). */
eng_status krn_dnnl_fail(dnnl_status_t s, const char *stmt, const char *func, const char *file, int line);
#define KRN_DNNL_CHECK(stmt)                                                                     \
    do {                                                                                         \
        dnnl_status_t krn_s__ = (stmt);                                                          \
        if (krn_s__ != dnnl_success) return krn_dnnl_fail(krn_s__, #stmt, __func__, __FILE__, __LINE__); \
    } while (0)
/* Process-wide CPU engine, created once (pthread_once); NULL + error on failure. Never freed. */
eng_status krn_dnnl_engine(dnnl_engine_t *out);
/* The calling thread's stream on that engine (created lazily, freed at thread exit). */
eng_status krn_dnnl_stream(dnnl_stream_t *out);
/* Set the calling thread's OpenMP thread count (oneDNN reads omp_get_max_threads()); n <= 0 leaves it. */
void krn_dnnl_set_threads(int n);
/* Append act as oneDNN eltwise post-op(s) (hard-sigmoid takes two). */
eng_status krn_dnnl_append_act(dnnl_post_ops_t po, const krn_nn_act_params *act);
/* Create a primitive from an op descriptor. po: post-ops placed before the activation (NULL for none); taken
 * and destroyed here on every path. act (may be NULL) is appended as the last post-op(s). *pd_out is kept (the
 * caller destroys it). The primitive uses a user scratchpad: *scratch_out is its buffer (NULL when it needs
 * none), passed as DNNL_ARG_SCRATCHPAD at every execution and destroyed by the caller. */
eng_status krn_dnnl_prim(const void *op_desc, dnnl_post_ops_t po, const krn_nn_act_params *act,
                         dnnl_primitive_desc_t *pd_out, dnnl_primitive_t *prim_out, dnnl_memory_t *scratch_out);
/* Reorder src (memory desc + data) into a freshly eng_alloc'd buffer laid out as dst_md. */
eng_status krn_dnnl_reorder_new(const dnnl_memory_desc_t *src_md, const void *src, const dnnl_memory_desc_t *dst_md,
                                void **dst_out);
/* The implementation oneDNN chose for pd ("jit:avx512_core", "ref:any", ...); "?" if it cannot say. */
const char *krn_dnnl_impl_name(const_dnnl_primitive_desc_t pd);
/* 1 if pd runs one of oneDNN's reference (scalar, untuned) implementations. */
int krn_dnnl_is_ref(const_dnnl_primitive_desc_t pd);
/* A memory desc's layout in oneDNN's tag notation ("abcd", "aBcd16b", "wino"). */
void krn_dnnl_md_str(const dnnl_memory_desc_t *md, char *buf, size_t cap);
/* A layout conversion run on every exec (a counted reorder): init once with both descs, run with the data. */
typedef struct krn_dnnl_reorder {
    dnnl_primitive_t prim;
    dnnl_memory_t src, dst;
} krn_dnnl_reorder;
eng_status krn_dnnl_reorder_init(krn_dnnl_reorder *r, const dnnl_memory_desc_t *from, const dnnl_memory_desc_t *to);
eng_status krn_dnnl_reorder_run(krn_dnnl_reorder *r, dnnl_stream_t stream, const void *from, void *to);
void krn_dnnl_reorder_free(krn_dnnl_reorder *r); /* safe on a zeroed or already freed struct */
/* When a primitive wants an activation in `prim` but the plan holds it in `plan`, set up the counted reorder
 * (plan -> prim for an input, prim -> plan for an output) and *buf, a buffer in `prim`'s layout (eng_free);
 * nothing when they are equal. */
eng_status krn_dnnl_io_reorder(const dnnl_memory_desc_t *plan, const dnnl_memory_desc_t *prim, int input,
                               krn_dnnl_reorder *r, void **buf);

/* oneDNN's data type for a float tensor dtype (f32, bf16, f16), dnnl_data_type_undef for others. */
dnnl_data_type_t krn_dnnl_dt(eng_dtype dt);
#endif

/* 1 if dt is a float dtype a reduced-precision (compute bf16) kernel reads or writes: F32 or BF16. */
static inline int krn_lowp_io(eng_dtype dt) { return dt == ENG_DTYPE_F32 || dt == ENG_DTYPE_BF16; }

/* Apply an activation in place on n floats (reference/fallback paths). */
void krn_nn_act_apply_f32(float *x, int64_t n, const krn_nn_act_params *act, int nthreads);
void krn_nn_act_apply_f64(double *x, int64_t n, const krn_nn_act_params *act);

#endif
