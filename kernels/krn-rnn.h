/* krn-rnn.h - params of the recurrent kernels: ONNX RNN, GRU and LSTM (opset 7-22), forward ("rnn") and the
 * gradient ops com.tensord LSTMGrad / GRUGrad ("rnn_grad").
 *
 * engine/ops/rnn.c fills the params: prepare parses the attributes (direction, hidden_size, activations with
 * their alpha/beta, clip, linear_before_reset, input_forget, layout), infer resolves the sizes from X and W.
 * Kernels never look at ONNX attributes.
 *
 * Tensors, as ONNX lays them out (layout 0; layout 1 swaps the first two dims of X, Y, and the state tensors'
 * [num_directions, batch] to [batch, num_directions]):
 *   X [seq, batch, input]; W [dirs, gates*hidden, input]; R [dirs, gates*hidden, hidden];
 *   B [dirs, 2*gates*hidden] (Wb then Rb); sequence_lens [batch] int32; initial_h / initial_c [dirs, batch, hidden];
 *   P [dirs, 3*hidden] (LSTM peepholes i, o, f);
 *   Y [seq, dirs, batch, hidden] (layout 1: [batch, seq, dirs, hidden]); Y_h / Y_c [dirs, batch, hidden].
 * Gate order in W/R/B: LSTM i, o, f, c; GRU z, r, h; RNN i.
 * sequence_lens: each in [0, seq] (checked at run time); steps t >= len[b] of batch row b write zeros to Y, and
 * Y_h / Y_c hold the state after step len[b] - 1 (the reverse direction starts at step len[b] - 1); a row of length 0
 * has Y_h = Y_c = 0 whatever initial_h / initial_c hold, as onnxruntime gives (so no gradient reaches them there).
 * activation_alpha / activation_beta: consumed in the order of the activations, each function taking a value only if
 * it uses one (onnxruntime's reading); unset ones get the ONNX operator's default (engine/ops/rnn.c).
 */
#ifndef KRN_RNN_H
#define KRN_RNN_H

#include <stdint.h>

#include "../engine/ir/status.h"
#include "../engine/ir/tensor.h"

typedef enum krn_rnn_cell { KRN_RNN_VANILLA = 0, KRN_RNN_GRU = 1, KRN_RNN_LSTM = 2 } krn_rnn_cell;

/* The ONNX RNN activation functions (the `activations` attribute). */
typedef enum krn_rnn_act_kind {
    KRN_RNN_ACT_SIGMOID = 0,
    KRN_RNN_ACT_TANH,
    KRN_RNN_ACT_RELU,
    KRN_RNN_ACT_AFFINE,           /* alpha * x + beta */
    KRN_RNN_ACT_LEAKY_RELU,       /* alpha (default 0.01) */
    KRN_RNN_ACT_THRESHOLDED_RELU, /* alpha (default 1) */
    KRN_RNN_ACT_SCALED_TANH,      /* alpha * tanh(beta * x) */
    KRN_RNN_ACT_HARD_SIGMOID,     /* max(0, min(1, alpha * x + beta)), defaults 0.2, 0.5 */
    KRN_RNN_ACT_ELU,              /* alpha (default 1) */
    KRN_RNN_ACT_SOFTSIGN,
    KRN_RNN_ACT_SOFTPLUS,
} krn_rnn_act_kind;

typedef struct krn_rnn_act {
    int kind; /* krn_rnn_act_kind */
    float alpha, beta;
} krn_rnn_act;

#define KRN_RNN_MAX_ACTS 3 /* per direction: RNN f; GRU f, g; LSTM f, g, h */

typedef struct krn_rnn_params {
    int cell;                 /* krn_rnn_cell */
    int ngates;               /* 1 RNN, 3 GRU, 4 LSTM */
    int ndir;                 /* 1 or 2 */
    int reverse;              /* ndir == 1 and direction="reverse" */
    int layout;               /* 0 or 1 (opset 14+) */
    int64_t seq, batch, input, hidden; /* resolved by infer */
    krn_rnn_act act[2][KRN_RNN_MAX_ACTS]; /* per direction */
    int has_clip;
    float clip;               /* cell input clipped to [-clip, clip] before activations */
    int linear_before_reset;  /* GRU */
    int input_forget;         /* LSTM: couple the input and forget gates (f = 1 - i) */
    /* Fields added after the first version (append only: the gradient kernels share this struct). */
    int64_t hidden_attr;      /* the hidden_size attribute as given, 0 when absent (resolve checks it against W) */
} krn_rnn_params;

/* Inputs and outputs by position, as the ONNX ops number them. */
enum { KRN_RNN_IN_X = 0, KRN_RNN_IN_W, KRN_RNN_IN_R, KRN_RNN_IN_B, KRN_RNN_IN_SEQ_LENS, KRN_RNN_IN_H0, KRN_RNN_IN_C0,
       KRN_RNN_IN_P };
enum { KRN_RNN_OUT_Y = 0, KRN_RNN_OUT_H, KRN_RNN_OUT_C };

/* Gradient ops (com.tensord LSTMGrad / GRUGrad), same params as the forward node. Inputs: dY, dY_h, dY_c (each may
 * be omitted; GRUGrad has no dY_c, pass it omitted), then the forward's inputs X, W, R, B, sequence_lens, initial_h,
 * initial_c, P in their forward positions + 3. Outputs: dX, dW, dR, dB, d_initial_h, d_initial_c, dP (each may be
 * omitted). The kernel recomputes the forward gates. */
enum { KRN_RNN_GRAD_IN_DY = 0, KRN_RNN_GRAD_IN_DYH, KRN_RNN_GRAD_IN_DYC, KRN_RNN_GRAD_IN_FWD };

#endif
