/* krn-quant.h - params of the "quant" kernel family: ONNX's linear quantization operators.
 *
 *   QuantizeLinear         y = saturate(round_half_even(x / scale) + zp)     x float32 -> uint8/int8
 *   DequantizeLinear       y = (x - zp) * scale                              uint8/int8/int32 -> float32
 *   DynamicQuantizeLinear  scale/zp from min(0, min x) .. max(0, max x), then QuantizeLinear to uint8
 *   MatMulInteger          Y = (A - a_zp) (B - b_zp)                         int32, MatMul batch broadcasting
 *   ConvInteger            Y = conv(X - x_zp, W - w_zp)                      int32
 *   QLinearMatMul/Conv     y = saturate(round_half_even(acc * (s_in * s_w / s_y)) + y_zp)
 *
 * Params are filled by engine/ops/quant.c, which also checks every scale and zero point's dtype and shape, so
 * kernels only see validated tensors. Zero points may be omitted (in[i].data NULL: zero). A "per-channel"
 * scale/zero point has one entry per index of one axis; everything else is per tensor (one entry).
 * These are reference kernels: int32 values, int64 accumulation wrapped to int32 as ONNX's int32 output does.
 */
#ifndef KRN_QUANT_H
#define KRN_QUANT_H

#include <stdint.h>

#include "krn-nn.h"

/* QuantizeLinear / DequantizeLinear. Inputs: x, scale, optional zero point (same shape as scale). */
typedef struct krn_qdq_params {
    int axis; /* axis of x the scale runs along; -1: one scale for the whole tensor */
} krn_qdq_params;

/* MatMulInteger (inputs A, B, a_zp?, b_zp?) and QLinearMatMul (a, a_scale, a_zp, b, b_scale, b_zp, y_scale,
 * y_zp). A's zero point/scale: one, or one per row of A (M); B's: one, or one per column of B (N). */
typedef struct krn_qmatmul_params {
    int qlinear;  /* QLinearMatMul input layout and requantized output */
    int to_float; /* com.microsoft MatMulIntegerToFloat (A, B, a_scale, b_scale, a_zp?, b_zp?, bias?): float32
                   * Y = (A - a_zp)(B - b_zp) * a_scale * b_scale[n] + bias[n], onnxruntime's dynamic-quantization
                   * op, and what the QDQ fusion writes for a matmul with no Q after it */
    krn_nn_act_params act; /* to_float: an activation after the bias (engine/plan/fuse.c's "act" attrs) */
} krn_qmatmul_params;

/* ConvInteger (x, w, x_zp?, w_zp?) and QLinearConv (x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, B?).
 * conv holds the resolved geometry (pads explicit, kernel from W), as the float Conv op fills it; W's zero
 * point and scale: one, or one per output channel (M). B: int32 (M), added to the accumulator. */
typedef struct krn_qconv_params {
    krn_conv_params conv;
    int qlinear;
} krn_qconv_params;

/* com.microsoft QLinearAdd / QLinearMul (onnxruntime's QOperator form of Add and Mul): inputs a, a_scale, a_zp?,
 * b, b_scale, b_zp?, c_scale, c_zp?, all scales and zero points per tensor, a and b of one 8-bit dtype and numpy
 * broadcasting; c = saturate(round_half_even(v) + c_zp) with, as onnxruntime's MLAS computes it in float32,
 *   Add: v = (a - a_zp) * (a_scale / c_scale) + (b - b_zp) * (b_scale / c_scale)
 *   Mul: v = (a - a_zp) * (b - b_zp) * (a_scale * b_scale / c_scale) */
typedef struct krn_qbinary_params {
    int mul;
} krn_qbinary_params;

/* Batch offset (in matrices) of a MatMul operand with batch dims bd[0..r) (padded with leading 1s, broadcast where
 * 1) for output batch index bi over the output's batch dims yd[0..r). Shared by the reference and oneDNN paths. */
static inline int64_t krn_q_batch_off(const int64_t *bd, const int64_t *yd, int r, int64_t bi) {
    int64_t off = 0, stride = 1;
    for (int d = r - 1; d >= 0; d--) {
        int64_t coord = bi % yd[d];
        bi /= yd[d];
        if (bd[d] != 1) off += coord * stride;
        stride *= bd[d];
    }
    return off;
}

#endif
