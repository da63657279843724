/* krn-tensor.h - params of the CPU "tensor" kernels (data movement and shape ops) and the reusable copy helpers.
 *
 * The engine (engine/ops/tensor*.c) resolves every attribute and every value-dependent quantity (slice starts,
 * pads, normalised axes, perms) into these structs during infer; the kernels only read them plus the final
 * shapes in krn_call. Data-movement kernels work on raw bytes by element size, so every fixed-size dtype works.
 * All dims/strides are in elements unless named *_bytes. Kernels never read outside their inputs: index-valued
 * inputs (Gather, Scatter...) are range-checked and an out-of-range index is an error naming it.
 */
#ifndef KRN_TENSOR_H
#define KRN_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "../engine/ir/tensor.h"

/* Most dims the strided-copy helpers take (a rank-8 Tile is viewed as 16 dims). */
#define KRN_TENSOR_MAX_VIEW (2 * ENG_MAX_DIMS)

typedef enum krn_scatter_reduce {
    KRN_SCATTER_NONE = 0,
    KRN_SCATTER_ADD = 1,
    KRN_SCATTER_MUL = 2,
    KRN_SCATTER_MAX = 3,
    KRN_SCATTER_MIN = 4,
} krn_scatter_reduce;

typedef enum krn_pad_mode {
    KRN_PAD_CONSTANT = 0,
    KRN_PAD_REFLECT = 1,
    KRN_PAD_EDGE = 2,
    KRN_PAD_WRAP = 3,
} krn_pad_mode;

typedef struct krn_transpose_params {
    int perm[ENG_MAX_DIMS]; /* output axis k reads input axis perm[k] */
} krn_transpose_params;

typedef struct krn_axis_params { /* Concat, Split, Compress (axis -1: flattened), OneHot */
    int axis;
} krn_axis_params;

typedef struct krn_slice_params {
    int64_t starts[ENG_MAX_DIMS]; /* resolved, clamped start per input dim */
    int64_t steps[ENG_MAX_DIMS];  /* per input dim, never 0; output dims give the counts */
} krn_slice_params;

typedef struct krn_gather_params { /* Gather, GatherElements, GatherND */
    int axis;
    int batch_dims;
} krn_gather_params;

typedef struct krn_scatter_params { /* ScatterElements, Scatter, ScatterND */
    int axis;
    krn_scatter_reduce reduction;
} krn_scatter_params;

typedef struct krn_pad_params {
    krn_pad_mode mode;
    int64_t pads[2 * ENG_MAX_DIMS]; /* (begin_0..begin_{r-1}, end_0..end_{r-1}), may be negative (crop) */
    double value;                   /* used when the constant_value input is absent */
} krn_pad_params;

typedef struct krn_trilu_params {
    int upper;
    int64_t k; /* used when input k is absent */
} krn_trilu_params;

typedef struct krn_depth_space_params {
    int64_t blocksize;
    int mode; /* 0: DepthToSpace DCR, 1: DepthToSpace CRD, 2: SpaceToDepth */
} krn_depth_space_params;

typedef struct krn_eyelike_params {
    int64_t k;
} krn_eyelike_params;

typedef struct krn_revseq_params {
    int batch_axis, time_axis;
} krn_revseq_params;

typedef struct krn_shape_params {
    int64_t start, end; /* resolved [start, end) of the input's dims */
} krn_shape_params;

typedef struct krn_constant_params { /* Constant (value owned here, eng_alloc'd) and ConstantOfShape (1 element) */
    eng_tensor value;
} krn_constant_params;

typedef struct krn_dropout_params {
    float ratio; /* attribute ratio (opset < 12); input 1 overrides */
} krn_dropout_params;

typedef enum krn_resize_mode { KRN_RESIZE_NEAREST = 0, KRN_RESIZE_LINEAR = 1, KRN_RESIZE_CUBIC = 2 } krn_resize_mode;
typedef enum krn_resize_coord {
    KRN_COORD_HALF_PIXEL = 0,
    KRN_COORD_ASYMMETRIC = 1,
    KRN_COORD_PYTORCH_HALF_PIXEL = 2,
    KRN_COORD_ALIGN_CORNERS = 3,
    KRN_COORD_TF_HALF_PIXEL_FOR_NN = 4,
    KRN_COORD_TF_CROP_AND_RESIZE = 5,
    KRN_COORD_HALF_PIXEL_SYMMETRIC = 6,
} krn_resize_coord;
typedef enum krn_resize_nearest {
    KRN_NEAREST_ROUND_PREFER_FLOOR = 0,
    KRN_NEAREST_ROUND_PREFER_CEIL = 1,
    KRN_NEAREST_FLOOR = 2,
    KRN_NEAREST_CEIL = 3,
} krn_resize_nearest;

typedef struct krn_resize_params {
    krn_resize_mode mode;
    krn_resize_coord coord;
    krn_resize_nearest nearest;
    float cubic_a;
    int exclude_outside;
    float extrapolation_value;
    double scales[ENG_MAX_DIMS]; /* resolved per input dim (output/input when sizes were given) */
    double roi[2 * ENG_MAX_DIMS];/* (start_0.., end_0..) for tf_crop_and_resize */
} krn_resize_params;

/* dst (dense, shape dims[ndim]) <- src where element (i_0..i_{n-1}) is at src + sum(i_k * sstrides[k]) elements.
 * Strides may be 0 (broadcast) or negative (reversed); src must already point at the element with all i_k = 0.
 * Adjacent dims are merged; rows with unit source stride are memcpy'd. ndim <= KRN_TENSOR_MAX_VIEW.
 * Thread-safe; uses up to nthreads OpenMP threads when the copy is large. */
void krn_cpu_strided_copy(void *dst, const void *src, size_t elem_size, int ndim, const int64_t *dims,
                          const int64_t *sstrides, int nthreads);

/* dst = src transposed: dst axis k is src axis perm[k]; dims are src's dims (ndim <= KRN_TENSOR_MAX_VIEW).
 * Size-1 dims are dropped and axes that stay adjacent are merged; when the innermost axis is kept rows are
 * memcpy'd, otherwise the innermost pair is copied in cache tiles. OpenMP-parallel when large.
 * Returns INVALID_ARGUMENT (naming perm) if perm is not a permutation of 0..ndim-1. */
eng_status krn_cpu_transpose(const void *src, void *dst, size_t elem_size, int ndim, const int64_t *dims,
                             const int *perm, int nthreads);

#endif
