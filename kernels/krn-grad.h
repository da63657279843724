/* krn-grad.h - params of the gradient kernels (the internal "com.tensord" ops that engine/train/autodiff.c emits) and
 * of TrainingDropout.
 *
 * Each gradient op re-uses the params of its forward op, resolved by the forward op's own prepare/infer in
 * engine/ops/grad*.c (so pads, axes, slices mean exactly what they meant going forward), plus what the
 * backward needs. Kernels (kernels/cpu/grad*.c) take float32 unless stated; every axis is normalised.
 */
#ifndef KRN_GRAD_H
#define KRN_GRAD_H

#include <stdint.h>

#include "../engine/ir/tensor.h"
#include "krn-nn.h"
#include "krn-reduce.h"
#include "krn-tensor.h"

/* Process-wide training step counter for TrainingDropout: the mask of a run uses seed = attr seed + this value
 * (read once per run). The training loop stores the step before each run (and on resume), so a resumed run
 * draws the same masks as the original; nothing advances it implicitly. Relaxed atomic access. */
extern int64_t krn_grad_dropout_step;
void krn_grad_dropout_set_step(int64_t step);
int64_t krn_grad_dropout_get_step(void);

/* Elementwise activation gradients: dx = f(dy, x or y). */
typedef enum krn_act_grad_kind {
    KRN_ACT_GRAD_RELU = 0,    /* (dy, y): dy * (y > 0) */
    KRN_ACT_GRAD_LEAKY_RELU,  /* (dy, x): dy * (x > 0 ? 1 : alpha) */
    KRN_ACT_GRAD_GELU,        /* (dy, x): exact (erf) or approximate=tanh */
    KRN_ACT_GRAD_ERF,         /* (dy, x): dy * 2/sqrt(pi) * exp(-x^2) */
    KRN_ACT_GRAD_SIGMOID,     /* (dy, y): dy * y * (1 - y) */
    KRN_ACT_GRAD_TANH,        /* (dy, y): dy * (1 - y^2) */
    KRN_ACT_GRAD_CLIP,        /* (dy, x [, min, max]): dy * (min <= x <= max) */
    KRN_ACT_GRAD_SILU,        /* (dy, x): dy * s (1 + x (1 - s)), s = sigmoid(x) */
} krn_act_grad_kind;

typedef struct krn_act_grad_params {
    int kind;                 /* krn_act_grad_kind */
    float alpha;              /* LeakyRelu slope */
    int gelu_tanh;            /* Gelu approximate="tanh" */
    float clip_min, clip_max; /* Clip-6 attributes (inputs 2/3 override) */
} krn_act_grad_params;

/* SoftmaxGrad / LogSoftmaxGrad (dy, y) viewed as (outer, n, inner) exactly as the forward op. */
typedef struct krn_softmax_grad_params {
    int log;
    krn_softmax_params sm;
} krn_softmax_grad_params;

/* ReduceToShape(dy, like): sums dy over the axes where like (right-aligned) has 1 or no dim. */
/* FillLike(x): output x's shape and dtype, every element `value`. */
typedef struct krn_fill_params {
    double value;
} krn_fill_params;

/* ConvGrad(dy, x, w) -> dx, dw, db (each optional). */
/* ConvGrad: C/group x kernel elements up to which grad-nn.c's register-tiled weight gradient (AVX-512) beats a
 * library call (first layers: C = 1 or 3); wider ones run on oneDNN's backward primitives (grad-lowp.c). */
#ifdef __AVX512F__
#define KRN_CONV_DW_SMALL_MAX_CK 36
#else
#define KRN_CONV_DW_SMALL_MAX_CK 0
#endif

typedef struct krn_conv_grad_params {
    krn_conv_params conv;
} krn_conv_grad_params;

/* MaxPoolGrad / AveragePoolGrad / Global*PoolGrad (dy, x) -> dx. Max routes dy to the first maximum of each
 * window (the forward kernel's choice). */
typedef struct krn_pool_grad_params {
    krn_pool_params pool;
    int relu; /* MaxPoolGrad attribute fused_relu=1: x is a Relu output and dx also gets ReluGrad's mask (x > 0);
               * engine/train/grad-math.c sets it instead of emitting ReluGrad(MaxPoolGrad(dy, y), y) */
} krn_pool_grad_params;

/* MatMulGrad(dy, A, B) -> dA, dB with numpy broadcasting and 1-D operands, summed over broadcast batch dims. */
/* BatchNormalizationGrad(dy, x, scale, mean, var) -> dx, dscale, dB. training: batch statistics of x (the
 * forward's), else the given mean/var. */
typedef struct krn_bn_grad_params {
    float epsilon;
    int training;
} krn_bn_grad_params;

/* LayerNormalizationGrad(dy, x, scale) -> dx, dscale, dB; dscale/dB have x's normalised dims (cols). */
typedef struct krn_ln_grad_params {
    krn_layernorm_params ln;
    int64_t scale_numel;      /* scale broadcast to cols when smaller */
} krn_ln_grad_params;

/* GatherGrad(dy, indices, like) -> dx of like's shape: zeros + scatter-add of dy along axis. */
/* SliceGrad(dy, x, starts, ends, axes, steps) -> dx of x's shape: zeros with dy written at the slice. */
/* ConcatGrad(dy, x0..xk) -> dx0..dxk: dy split along axis by the xi's sizes. */
/* ReduceSumGrad / ReduceMeanGrad (dy, x [, axes]) -> dx: dy broadcast over the reduced axes (/ count). */
typedef struct krn_reduce_grad_params {
    krn_reduce_params red;
    int mean;
} krn_reduce_grad_params;

/* TrainingDropout(x) -> y, mask (bool); DropoutGrad(dy, mask) -> dx = dy * mask / (1 - ratio). */
typedef struct krn_dropout_train_params {
    float ratio;
    int64_t seed;
} krn_dropout_train_params;

/* SoftmaxCrossEntropyLossGrad(dloss, scores, labels [, weights [, dlog_prob]]) and
 * NegativeLogLikelihoodLossGrad(dloss, input, target [, weights]) -> dinput. */
typedef struct krn_loss_grad_params {
    krn_loss_params loss;
} krn_loss_grad_params;

#endif
