/* krn-reduce.h - params for the reduce family: reductions, arg/top-k, scans, softmax, normalisations, losses.
 *
 * Plain structs filled by engine/ops/reduce*.c and engine/ops/norm*.c (prepare parses attributes, infer
 * resolves everything that depends on shapes: axis masks, outer/n/inner splits). Kernels in
 * kernels/cpu/reduce*.c and kernels/cpu/norm*.c read them and never look at graph types. Every axis here is
 * already normalised to [0, rank) of the input the kernel sees.
 */
#ifndef KRN_REDUCE_H
#define KRN_REDUCE_H

#include <stdint.h>

#include "../engine/ir/tensor.h"

typedef enum krn_reduce_op {
    KRN_REDUCE_SUM = 0,
    KRN_REDUCE_MEAN,
    KRN_REDUCE_MAX,
    KRN_REDUCE_MIN,
    KRN_REDUCE_PROD,
    KRN_REDUCE_L1,
    KRN_REDUCE_L2,
    KRN_REDUCE_LOGSUM,
    KRN_REDUCE_LOGSUMEXP,
    KRN_REDUCE_SUMSQUARE,
} krn_reduce_op;

/* ReduceX. The kernel reduces input 0 over the dims in axis_mask (bit d = dim d of the input); an empty mask
 * means "no reduction" (noop_with_empty_axes): the op's elementwise part still applies (ReduceL1 -> |x|). */
typedef struct krn_reduce_params {
    krn_reduce_op op;
    int keepdims;
    int noop_with_empty_axes;
    int axes_from_input;          /* opset >= 13 (Sum) / 18 (others): axes is input 1 */
    int naxes_attr;               /* -1: no axes attribute */
    int64_t axes_attr[ENG_MAX_DIMS];
    unsigned axis_mask;           /* resolved by infer */
} krn_reduce_params;

/* ArgMax / ArgMin over `axis`; output int64. */
typedef struct krn_arg_params {
    int is_min;
    int select_last_index;
    int keepdims;
    int64_t axis_attr;
    int axis;                     /* resolved by infer */
} krn_arg_params;

/* TopK: outputs values (input dtype) and indices (int64), both with dims[axis] = k. Ties keep lower index first. */
typedef struct krn_topk_params {
    int largest;
    int sorted;
    int k_from_input;             /* opset >= 10 */
    int64_t k_attr;
    int64_t axis_attr;
    int axis;                     /* resolved by infer */
    int64_t k;                    /* resolved by infer */
} krn_topk_params;

/* CumSum: the axis comes from input 1 at exec time. */
typedef struct krn_cumsum_params {
    int exclusive;
    int reverse;
} krn_cumsum_params;

typedef enum krn_softmax_kind {
    KRN_SOFTMAX = 0,
    KRN_SOFTMAX_LOG,
    KRN_SOFTMAX_HARD,
} krn_softmax_kind;

/* Softmax / LogSoftmax / Hardmax viewed as (outer, n, inner): normalised over n. Opset < 13 coerces to 2-D at
 * `axis` (inner = 1, n = prod(dims[axis:])); opset >= 13 normalises over the one dim `axis`. */
typedef struct krn_softmax_params {
    krn_softmax_kind kind;
    int coerce_2d;
    int64_t axis_attr;
    int64_t outer, n, inner;      /* resolved by infer */
} krn_softmax_params;

/* BatchNormalization: x (N, C, D1..Dk); scale/B/mean/var (C) or, with spatial=0, (C, D1..Dk). Training mode
 * (opset 14+ training_mode=1, or opset < 7 is_test=0 with extra outputs) uses batch statistics and writes
 * running mean/var to outputs 1 and 2. */
typedef struct krn_batchnorm_params {
    float epsilon;
    float momentum;
    int training;
    int spatial;                  /* 0: per-feature statistics (opset < 9) */
    int64_t c, spatial_size, n;   /* resolved by infer: channels, prod(D1..Dk), batch */
} krn_batchnorm_params;

/* LayerNormalization: rows = prod(dims[:axis]), cols = prod(dims[axis:]); scale/B broadcast to dims[axis:].
 * Outputs: Y, optional Mean and InvStdDev (rows, stash dtype float32). */
typedef struct krn_layernorm_params {
    float epsilon;
    int64_t axis_attr;
    int stash_type;
    int axis;                     /* resolved by infer */
    int64_t rows, cols;
} krn_layernorm_params;

/* InstanceNormalization: x (N, C, D...), scale/B (C). */
typedef struct krn_instnorm_params {
    float epsilon;
} krn_instnorm_params;

/* LRN across channels of x (N, C, D...). */
typedef struct krn_lrn_params {
    float alpha, beta, bias;
    int64_t size;
} krn_lrn_params;

/* MeanVarianceNormalization over the dims in axis_mask: y = (x - mean) / (sqrt(var) + 1e-9). */
typedef struct krn_mvn_params {
    int naxes_attr;
    int64_t axes_attr[ENG_MAX_DIMS];
    unsigned axis_mask;           /* resolved by infer */
} krn_mvn_params;

typedef enum krn_loss_reduction {
    KRN_LOSS_NONE = 0,
    KRN_LOSS_SUM,
    KRN_LOSS_MEAN,
} krn_loss_reduction;

/* NegativeLogLikelihoodLoss (log_softmax = 0) and SoftmaxCrossEntropyLoss (log_softmax = 1): input (N, C, D...),
 * target (N, D...) int32/int64, optional weight (C). SCE may write log_prob (input's shape) to output 1. */
typedef struct krn_loss_params {
    int log_softmax;
    krn_loss_reduction reduction;
    int has_ignore_index;
    int64_t ignore_index;
} krn_loss_params;

/* Einsum, parsed by infer: each operand's subscripts as letter ids (0..51, ellipsis expanded to ids 52+),
 * the output's subscripts, and the size of every id. */
#define KRN_EINSUM_MAX_OPS 8
#define KRN_EINSUM_MAX_IDS 64
typedef struct krn_einsum_params {
    char equation[256];
    int nops;
    int op_rank[KRN_EINSUM_MAX_OPS];
    int op_ids[KRN_EINSUM_MAX_OPS][ENG_MAX_DIMS];
    int out_rank;
    int out_ids[ENG_MAX_DIMS];
    int nids;                     /* ids in use are 0..nids-1 after compaction */
    int64_t id_size[KRN_EINSUM_MAX_IDS];
} krn_einsum_params;

#endif
