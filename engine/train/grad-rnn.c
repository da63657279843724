/* grad-rnn.c - gradient rules of RNN, GRU and LSTM: one com.tensord RNNGrad / GRUGrad / LSTMGrad node per forward
 * node (engine/ops/grad-rnn.c, kernel "rnn_grad"), carrying the forward's attributes.
 *
 * Its inputs are the gradients of Y, Y_h and Y_c that arrived (the others omitted: the kernel sums what it is
 * given), then the forward's inputs in their positions. Its outputs dX, dW, dR, dB, d_initial_h, d_initial_c, dP
 * are created only for the inputs autodiff needs. sequence_lens is not differentiable.
 */
#include <string.h>

#include "../../kernels/krn-rnn.h"
#include "grad-impl.h"

static eng_status g_rnn(eng_grad_ctx *c) {
    const eng_node *f = eng_grad_fwd(c);
    int lstm = !strcmp(f->op_type, "LSTM");
    int in[KRN_RNN_GRAD_IN_FWD + KRN_RNN_IN_P + 1], nin = KRN_RNN_GRAD_IN_FWD;
    in[KRN_RNN_GRAD_IN_DY] = c->dy[KRN_RNN_OUT_Y];
    in[KRN_RNN_GRAD_IN_DYH] = f->nout > KRN_RNN_OUT_H ? c->dy[KRN_RNN_OUT_H] : -1;
    in[KRN_RNN_GRAD_IN_DYC] = lstm && f->nout > KRN_RNN_OUT_C ? c->dy[KRN_RNN_OUT_C] : -1;
    for (int i = 0; i < f->nin && i <= KRN_RNN_IN_P; i++) in[nin++] = eng_grad_in(c, i);
    static const int want[] = {KRN_RNN_IN_X, KRN_RNN_IN_W, KRN_RNN_IN_R, KRN_RNN_IN_B, KRN_RNN_IN_H0, KRN_RNN_IN_C0,
                               KRN_RNN_IN_P};
    int outs[7], nout = 0;
    for (int j = 0; j < 7; j++) {
        outs[j] = want[j] < f->nin && c->need[want[j]] ? -1 : -2;
        if (outs[j] == -1) nout = j + 1;
    }
    char op[16];
    strcpy(op, lstm ? "LSTMGrad" : !strcmp(f->op_type, "GRU") ? "GRUGrad" : "RNNGrad");
    int n = eng_grad_emit(c, op, "com.tensord", in, nin, outs, nout);
    if (n < 0) return eng_grad_failed();
    ENG_TRY(eng_grad_copy_attrs(c, n));
    for (int j = 0; j < nout; j++)
        if (outs[j] >= 0) c->dx[want[j]] = outs[j];
    return ENG_STATUS_OK;
}

/* diff masks: X W R B (bits 0-3), initial_h (5); LSTM also initial_c (6) and P (7). */
const eng_grad_rule eng_grad_rules_rnn[] = {
    {"LSTM", g_rnn, 0xEFu},
    {"GRU", g_rnn, 0x2Fu},
    {"RNN", g_rnn, 0x2Fu},
    {NULL},
};
