/* krn-optim.h - params of the optimizer family: one optimizer step over one flat float32 parameter buffer.
 *
 * engine/train/optim.c is the only caller: it resolves everything that is the same for all elements of a step on
 * the host (learning rate of this step, bias corrections in double rounded to float, the gradient scale that folds
 * clipping, the accumulation average and an optional 1/loss-scale) and calls these kernels once per parameter
 * buffer, so the kernels are branch-free element loops (kernels/cpu/optim.c, kernels/cuda/cuda-optim.cu). The CPU
 * kernels keep the float operation order of the element formulas below exactly: a step through the kernels is
 * bit-identical to the optimizer's former inline loops; the CUDA kernels follow the same order (equal to float
 * rounding). All tensors are float32 and dense; shapes are irrelevant beyond the element count (any rank).
 *
 * Kernels:
 *   "optim_sum_squares"  in = {g}, out = {s}: s = sum_i (scale * g[i])^2 with float products; s is a rank-0 FLOAT64
 *                        tensor (float64 so that the caller can add the per-parameter sums of a whole model without
 *                        losing the small ones; the CPU sums float partials over 4096-element blocks in double, the
 *                        GPU sums in double). Params: krn_optim_sumsq_params.
 *   "optim_update"       in = {w, g, m, v}, out = {w, m, v, gz}: IN PLACE. out[0].data must equal in[0].data, out[1]
 *                        in[2] and out[2] in[3] (the caller passes the same data pointers; the kernel refuses
 *                        anything else). m and v are the optimizer's state buffers: SGD uses neither (pass both
 *                        absent: data NULL, dtype UNDEFINED), momentum/Nesterov use m (the velocity), Adam uses both.
 *                        gz is optional: present (its data equal to in[1].data) it asks the kernel to store 0 into
 *                        every element of g after reading it (the gradient accumulator's reset, fused into the
 *                        update pass). Params: krn_optim_params.
 *   "optim_accumulate"   in = {a, g}, out = {a}: a += g, IN PLACE (out[0].data == in[0].data); gradient
 *                        accumulation (accum_steps > 1) on the buffers of the backend that holds the gradients.
 *
 * Element formulas of optim_update (ge: the effective gradient; every operand a float):
 *   ge = gscale * g + weight_decay * w
 *   SGD:       w -= lr * ge                           (written as w - lr * (gscale * g + weight_decay * w))
 *   MOMENTUM:  m = momentum * m - lr * ge; w += m
 *   NESTEROV:  m = momentum * m - lr * ge; w += momentum * m - lr * ge
 *   ADAM:      w' = w - decoupled_decay * w           (AdamW: decoupled_decay = lr * weight decay, weight_decay 0;
 *                                                      Adam: decoupled_decay 0, weight_decay = the L2 coefficient)
 *              m = beta1 * m + (1 - beta1) * ge; v = beta2 * v + (1 - beta2) * ge * ge
 *              w = w' - lr * (m * inv_bc1) / (sqrtf(v * inv_bc2) + eps)
 * where (1 - beta) is computed in float by the kernel and inv_bc1 = 1 / (1 - beta1^t), inv_bc2 = 1 / (1 - beta2^t)
 * for update number t (1-based) come from the host.
 */
#ifndef KRN_OPTIM_H
#define KRN_OPTIM_H

#include <stdint.h>

#include "../engine/ir/tensor.h"

typedef enum krn_optim_kind {
    KRN_OPTIM_SGD = 0,      /* plain SGD: uses neither m nor v */
    KRN_OPTIM_MOMENTUM = 1, /* SGD with momentum: m is the velocity */
    KRN_OPTIM_NESTEROV = 2, /* SGD with Nesterov momentum: m is the velocity */
    KRN_OPTIM_ADAM = 3,     /* Adam and AdamW (decoupled_decay > 0): m, v are the first and second moments */
} krn_optim_kind;

/* optim_update: the hyperparameters of THIS step, resolved on the host. */
typedef struct krn_optim_params {
    int kind;              /* krn_optim_kind */
    float lr;              /* learning rate of this step (schedule and warm-up applied) */
    float gscale;          /* gradient scale: 1/accum_steps x clipping factor (x 1/loss-scale); 1 for none */
    float weight_decay;    /* L2 coefficient added to the gradient (SGD, Adam); 0 for AdamW */
    float decoupled_decay; /* ADAM only: w -= decoupled_decay * w first (AdamW: lr * weight decay); 0 for Adam */
    float momentum;        /* MOMENTUM, NESTEROV */
    float beta1, beta2;    /* ADAM */
    float inv_bc1, inv_bc2;/* ADAM: 1 / (1 - beta1^t), 1 / (1 - beta2^t), in double on the host, rounded to float */
    float eps;             /* ADAM */
} krn_optim_params;

/* optim_sum_squares. */
typedef struct krn_optim_sumsq_params {
    float scale;           /* each element is multiplied by this (in float) before squaring */
} krn_optim_sumsq_params;

#endif
