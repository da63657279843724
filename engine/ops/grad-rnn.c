/* grad-rnn.c - op definitions of com.tensord RNNGrad / GRUGrad / LSTMGrad (kernel "rnn_grad", krn-rnn.h).
 *
 * A gradient node carries its forward node's attributes (engine/train/grad-rnn.c copies them) and resolves them with
 * the forward op's own parser (eng_rnn_parse / eng_rnn_resolve in rnn.c), so direction, layout, activations and
 * clip mean exactly what they meant going forward. Inputs: dY, dY_h, dY_c (each may be omitted; RNNGrad and GRUGrad
 * take no dY_c), then the forward's inputs in their positions + 3. Outputs: dX, dW, dR, dB, d_initial_h,
 * d_initial_c, dP, each optional, each shaped like the forward input it differentiates. Infer checks each given dY
 * against the forward output's shape. Float32 only.
 */
#include <stdlib.h>
#include <string.h>

#include "rnn.h"

enum { RG_OUT_DX = 0, RG_OUT_DW, RG_OUT_DR, RG_OUT_DB, RG_OUT_DH0, RG_OUT_DC0, RG_OUT_DP, RG_NOUT };

static int rg_cell(const char *op) {
    if (!strcmp(op, "LSTMGrad")) return KRN_RNN_LSTM;
    if (!strcmp(op, "GRUGrad")) return KRN_RNN_GRU;
    return KRN_RNN_VANILLA;
}

static eng_status rnn_grad_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, KRN_RNN_GRAD_IN_FWD + 3, KRN_RNN_GRAD_IN_FWD + KRN_RNN_IN_P + 1));
    if (c->nout > RG_NOUT) return eng_err(ENG_STATUS_INVALID_MODEL, "%d outputs, at most %d", c->nout, RG_NOUT);
    int cell = rg_cell(c->node->op_type);
    if (cell != KRN_RNN_LSTM && eng_op_has_input(c, KRN_RNN_GRAD_IN_DYC))
        return eng_err(ENG_STATUS_INVALID_MODEL, "%s takes no dY_c (input %d)", c->node->op_type, KRN_RNN_GRAD_IN_DYC);
    krn_rnn_params *p = calloc(1, sizeof *p);
    if (!p) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s params", c->node->op_type);
    c->params = p;
    return eng_rnn_parse(c->node, c->opset, cell, p);
}

static eng_status rg_check(const eng_tensor *t, const char *what, const int64_t *dims, int ndim) {
    if (t->dtype != ENG_DTYPE_F32)
        return eng_err(ENG_STATUS_UNSUPPORTED, "input '%s' has dtype %s; gradient kernels take float32", what,
                       eng_dtype_name(t->dtype));
    if (!dims) return ENG_STATUS_OK;
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->dims[i] == dims[i];
    if (!same) {
        char a[128], b[128];
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "'%s' has shape %s, expected %s", what,
                       eng_shape_str(t->dims, t->ndim, a, sizeof a), eng_shape_str(dims, ndim, b, sizeof b));
    }
    return ENG_STATUS_OK;
}

static void rg_set(eng_op_ctx *c, int out, const int64_t *dims, int ndim) {
    if (out >= c->nout) return;
    c->out[out].dtype = ENG_DTYPE_F32;
    c->out[out].ndim = ndim;
    memcpy(c->out[out].dims, dims, (size_t)ndim * sizeof *dims);
}

static eng_status rnn_grad_infer(eng_op_ctx *c) {
    krn_rnn_params *p = c->params;
    const int F = KRN_RNN_GRAD_IN_FWD;
    static const char *const fwd_names[] = {"X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"};
    for (int i = 0; i < c->nin - F; i++)
        if (i != KRN_RNN_IN_SEQ_LENS && eng_op_has_input(c, F + i))
            ENG_TRY(rg_check(&c->in[F + i], fwd_names[i], NULL, 0));
    ENG_TRY(eng_rnn_resolve(p, &c->in[F], c->nin - F));
    int64_t S = p->seq, B = p->batch, H = p->hidden, nd = p->ndir, GH = p->ngates * p->hidden;
    int64_t ydims[4] = {S, nd, B, H}, sdims[3] = {nd, B, H};
    if (p->layout) ydims[0] = B, ydims[1] = S, ydims[2] = nd, sdims[0] = B, sdims[1] = nd;
    if (eng_op_has_input(c, KRN_RNN_GRAD_IN_DY)) ENG_TRY(rg_check(&c->in[KRN_RNN_GRAD_IN_DY], "dY", ydims, 4));
    if (eng_op_has_input(c, KRN_RNN_GRAD_IN_DYH)) ENG_TRY(rg_check(&c->in[KRN_RNN_GRAD_IN_DYH], "dY_h", sdims, 3));
    if (eng_op_has_input(c, KRN_RNN_GRAD_IN_DYC)) ENG_TRY(rg_check(&c->in[KRN_RNN_GRAD_IN_DYC], "dY_c", sdims, 3));
    const eng_tensor *X = &c->in[F + KRN_RNN_IN_X];
    int64_t wdims[3] = {nd, GH, p->input}, rdims[3] = {nd, GH, H}, bdims[2] = {nd, 2 * GH}, pdims[2] = {nd, 3 * H};
    rg_set(c, RG_OUT_DX, X->dims, X->ndim);
    rg_set(c, RG_OUT_DW, wdims, 3);
    rg_set(c, RG_OUT_DR, rdims, 3);
    rg_set(c, RG_OUT_DB, bdims, 2);
    rg_set(c, RG_OUT_DH0, sdims, 3);
    rg_set(c, RG_OUT_DC0, sdims, 3);
    rg_set(c, RG_OUT_DP, pdims, 2);
    return ENG_STATUS_OK;
}

#define RNN_GRAD_OP(name) {name, "com.tensord", "rnn_grad", 0, rnn_grad_prepare, rnn_grad_infer, NULL}

const eng_op_def eng_ops_rnn_grad[] = {
    RNN_GRAD_OP("RNNGrad"),
    RNN_GRAD_OP("GRUGrad"),
    RNN_GRAD_OP("LSTMGrad"),
    {NULL},
};
