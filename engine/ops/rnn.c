/* rnn.c - the ONNX recurrent ops RNN, GRU and LSTM (opset 7-22), kernel "rnn" (kernels/krn-rnn.h).
 *
 * prepare parses every attribute of the spec into krn_rnn_params (eng_rnn_parse, shared with the gradient ops in
 * grad-rnn.c): direction, hidden_size, activations (names case-insensitive, as onnxruntime accepts them) with
 * activation_alpha / activation_beta, clip, linear_before_reset (GRU), input_forget (LSTM), layout (opset 14+).
 * infer checks every input's dtype and shape (eng_rnn_resolve) and gives the outputs' shapes; each output may be
 * omitted. Only float32 tensors: float16 / bfloat16 / double are refused with UNSUPPORTED naming the input.
 *
 * activation_alpha / activation_beta follow onnxruntime: the lists are consumed in the order of the activations,
 * each function taking an alpha (LeakyRelu, ThresholdedRelu, Elu, ScaledTanh, HardSigmoid, Affine) or a beta
 * (ScaledTanh, HardSigmoid, Affine) only when it uses one; a function whose value the list does not reach gets the
 * default of the ONNX operator of that name (LeakyRelu 0.01, ThresholdedRelu 1, Elu 1, HardSigmoid 0.2 / 0.5,
 * ScaledTanh 1 / 1, Affine 1 / 0). Bidirectional nodes take 2x the cell's count of activations (forward's, then
 * reverse's); a list of only the cell's count is used for both directions, as onnxruntime does.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rnn.h"

static const char *rnn_op_name(int cell) {
    return cell == KRN_RNN_LSTM ? "LSTM" : cell == KRN_RNN_GRU ? "GRU" : "RNN";
}

typedef struct rnn_act_name {
    const char *name; /* lower case */
    int kind;
    int uses_alpha, uses_beta;
    float alpha, beta; /* defaults */
} rnn_act_name;

static const rnn_act_name rnn_act_names[] = {
    {"sigmoid", KRN_RNN_ACT_SIGMOID, 0, 0, 0, 0},
    {"tanh", KRN_RNN_ACT_TANH, 0, 0, 0, 0},
    {"relu", KRN_RNN_ACT_RELU, 0, 0, 0, 0},
    {"affine", KRN_RNN_ACT_AFFINE, 1, 1, 1.0f, 0.0f},
    {"leakyrelu", KRN_RNN_ACT_LEAKY_RELU, 1, 0, 0.01f, 0},
    {"thresholdedrelu", KRN_RNN_ACT_THRESHOLDED_RELU, 1, 0, 1.0f, 0},
    {"scaledtanh", KRN_RNN_ACT_SCALED_TANH, 1, 1, 1.0f, 1.0f},
    {"hardsigmoid", KRN_RNN_ACT_HARD_SIGMOID, 1, 1, 0.2f, 0.5f},
    {"elu", KRN_RNN_ACT_ELU, 1, 0, 1.0f, 0},
    {"softsign", KRN_RNN_ACT_SOFTSIGN, 0, 0, 0, 0},
    {"softplus", KRN_RNN_ACT_SOFTPLUS, 0, 0, 0, 0},
};

static const rnn_act_name *rnn_act_lookup(const char *s) {
    char low[32];
    size_t n = strlen(s);
    if (n >= sizeof low) return NULL;
    for (size_t i = 0; i <= n; i++) low[i] = (char)tolower((unsigned char)s[i]);
    for (size_t i = 0; i < sizeof rnn_act_names / sizeof rnn_act_names[0]; i++)
        if (!strcmp(rnn_act_names[i].name, low)) return &rnn_act_names[i];
    return NULL;
}

static eng_status rnn_parse_acts(const eng_node *n, int cell, krn_rnn_params *p) {
    static const int dflt[3][KRN_RNN_MAX_ACTS] = {
        {KRN_RNN_ACT_TANH}, {KRN_RNN_ACT_SIGMOID, KRN_RNN_ACT_TANH}, {KRN_RNN_ACT_SIGMOID, KRN_RNN_ACT_TANH, KRN_RNN_ACT_TANH}};
    int nacts = cell == KRN_RNN_LSTM ? 3 : cell == KRN_RNN_GRU ? 2 : 1;
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < KRN_RNN_MAX_ACTS; i++)
            p->act[d][i] = (krn_rnn_act){.kind = i < nacts ? dflt[cell][i] : KRN_RNN_ACT_TANH, .alpha = 0, .beta = 0};
    const eng_attr *a = eng_node_attr(n, "activations");
    const float *alphas = NULL, *betas = NULL;
    int nalpha = eng_node_attr_floats(n, "activation_alpha", &alphas);
    int nbeta = eng_node_attr_floats(n, "activation_beta", &betas);
    if (!a) {
        if (nalpha > 0 || nbeta > 0)
            return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'activation_alpha'/'activation_beta' given without 'activations'");
        return ENG_STATUS_OK;
    }
    if (a->type != ENG_ATTR_STRINGS)
        return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'activations' must be a list of strings");
    if (a->n != nacts && a->n != nacts * p->ndir)
        return eng_err(ENG_STATUS_INVALID_MODEL,
                       "attribute 'activations' has %d entries; %s with %d direction(s) takes %d (one per function%s)", a->n,
                       rnn_op_name(cell), p->ndir, nacts * p->ndir, p->ndir == 2 ? ", forward's then reverse's" : "");
    int ia = 0, ib = 0;
    for (int k = 0; k < a->n; k++) {
        const rnn_act_name *an = rnn_act_lookup(a->strings[k]);
        if (!an)
            return eng_err(ENG_STATUS_UNSUPPORTED,
                           "attribute 'activations' entry %d: unknown activation '%s' (expected one of Relu, Tanh, Sigmoid, "
                           "Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign, Softplus)",
                           k, a->strings[k]);
        krn_rnn_act act = {.kind = an->kind, .alpha = an->alpha, .beta = an->beta};
        if (an->uses_alpha && ia < nalpha) act.alpha = alphas[ia++];
        if (an->uses_beta && ib < nbeta) act.beta = betas[ib++];
        p->act[k / nacts][k % nacts] = act;
    }
    if (a->n == nacts && p->ndir == 2)
        for (int i = 0; i < nacts; i++) p->act[1][i] = p->act[0][i];
    return ENG_STATUS_OK;
}

eng_status eng_rnn_parse(const eng_node *n, int64_t opset, int cell, krn_rnn_params *p) {
    memset(p, 0, sizeof *p);
    if (cell < KRN_RNN_VANILLA || cell > KRN_RNN_LSTM) return eng_err(ENG_STATUS_INTERNAL, "unknown recurrent cell %d", cell);
    p->cell = cell;
    p->ngates = cell == KRN_RNN_LSTM ? 4 : cell == KRN_RNN_GRU ? 3 : 1;
    const char *dir = eng_node_attr_str(n, "direction", "forward");
    if (!strcmp(dir, "forward")) p->ndir = 1;
    else if (!strcmp(dir, "reverse")) p->ndir = 1, p->reverse = 1;
    else if (!strcmp(dir, "bidirectional")) p->ndir = 2;
    else
        return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'direction' is '%s'; expected forward, reverse or bidirectional", dir);
    p->hidden_attr = eng_node_attr_int(n, "hidden_size", 0);
    if (eng_node_attr(n, "hidden_size") && p->hidden_attr <= 0)
        return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'hidden_size' is %lld; expected > 0", (long long)p->hidden_attr);
    ENG_TRY(rnn_parse_acts(n, cell, p));
    if (eng_node_attr(n, "clip")) {
        p->has_clip = 1;
        p->clip = eng_node_attr_float(n, "clip", 0.f);
        if (!(p->clip > 0.f))
            return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'clip' is %g; expected > 0", (double)p->clip);
    }
    int64_t lbr = eng_node_attr_int(n, "linear_before_reset", 0), inf = eng_node_attr_int(n, "input_forget", 0);
    if (cell == KRN_RNN_GRU) p->linear_before_reset = lbr != 0;
    if (cell == KRN_RNN_LSTM) p->input_forget = inf != 0;
    int64_t layout = eng_node_attr_int(n, "layout", 0);
    if (layout != 0 && layout != 1)
        return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'layout' is %lld; expected 0 or 1", (long long)layout);
    if (layout != 0 && opset < 14)
        return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'layout' needs opset 14 (the model's is %lld)", (long long)opset);
    p->layout = (int)layout;
    return ENG_STATUS_OK;
}

/* Check that t (present) is float32 with the given dims; `what` explains the dims for the message. */
static eng_status rnn_check(const eng_tensor *t, const char *name, eng_dtype dt, int ndim, const int64_t *dims,
                            const char *what) {
    char a[128], b[128];
    if (t->dtype != dt)
        return eng_err(t->dtype == ENG_DTYPE_F16 || t->dtype == ENG_DTYPE_BF16 || t->dtype == ENG_DTYPE_F64
                           ? ENG_STATUS_UNSUPPORTED : ENG_STATUS_INVALID_ARGUMENT,
                       "input '%s': expected dtype %s, got %s%s", name, eng_dtype_name(dt), eng_dtype_name(t->dtype),
                       dt == ENG_DTYPE_F32 ? " (the recurrent kernels compute in float32 only)" : "");
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->dims[i] == dims[i];
    if (!same)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input '%s': expected shape %s (%s), got %s", name,
                       eng_shape_str(dims, ndim, a, sizeof a), what, eng_shape_str(t->dims, t->ndim, b, sizeof b));
    return ENG_STATUS_OK;
}

static int rnn_has(const eng_tensor *in, int nin, int i) { return i < nin && in[i].dtype != ENG_DTYPE_UNDEFINED; }

eng_status eng_rnn_resolve(krn_rnn_params *p, const eng_tensor *in, int nin) {
    const char *op = rnn_op_name(p->cell);
    int maxin = p->cell == KRN_RNN_LSTM ? 8 : 6;
    if (nin < 3 || !rnn_has(in, nin, KRN_RNN_IN_X) || !rnn_has(in, nin, KRN_RNN_IN_W) || !rnn_has(in, nin, KRN_RNN_IN_R))
        return eng_err(ENG_STATUS_INVALID_MODEL, "%s needs inputs X, W and R", op);
    for (int i = maxin; i < nin; i++)
        if (rnn_has(in, nin, i)) return eng_err(ENG_STATUS_INVALID_MODEL, "%s takes at most %d inputs, got %d", op, maxin, nin);
    const eng_tensor *x = &in[KRN_RNN_IN_X], *w = &in[KRN_RNN_IN_W], *r = &in[KRN_RNN_IN_R];
    char sb[128];
    if (x->dtype != ENG_DTYPE_F32)
        return eng_err(x->dtype == ENG_DTYPE_F16 || x->dtype == ENG_DTYPE_BF16 || x->dtype == ENG_DTYPE_F64
                           ? ENG_STATUS_UNSUPPORTED : ENG_STATUS_INVALID_ARGUMENT,
                       "input 'X': expected dtype float32, got %s (the recurrent kernels compute in float32 only)",
                       eng_dtype_name(x->dtype));
    if (x->ndim != 3)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'X': expected rank 3 %s, got shape %s",
                       p->layout ? "[batch_size, seq_length, input_size]" : "[seq_length, batch_size, input_size]",
                       eng_shape_str(x->dims, x->ndim, sb, sizeof sb));
    p->seq = x->dims[p->layout ? 1 : 0];
    p->batch = x->dims[p->layout ? 0 : 1];
    p->input = x->dims[2];
    int64_t G = p->ngates, D = p->ndir;
    if (w->ndim != 3 || w->dims[1] % G != 0 || w->dims[1] == 0) {
        if (w->dtype != ENG_DTYPE_F32) return rnn_check(w, "W", ENG_DTYPE_F32, 0, NULL, "");
        return eng_err(ENG_STATUS_INVALID_ARGUMENT,
                       "input 'W': expected shape [%lld, %lld*hidden_size, %lld] (num_directions, %lld*hidden_size, "
                       "input_size), got %s",
                       (long long)D, (long long)G, (long long)p->input, (long long)G,
                       eng_shape_str(w->dims, w->ndim, sb, sizeof sb));
    }
    p->hidden = w->dims[1] / G;
    if (p->hidden_attr && p->hidden_attr != p->hidden)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT,
                       "attribute 'hidden_size' is %lld but input 'W' has shape %s, which gives hidden_size %lld",
                       (long long)p->hidden_attr, eng_shape_str(w->dims, w->ndim, sb, sizeof sb), (long long)p->hidden);
    int64_t H = p->hidden, B = p->batch;
    char what[160];
    int64_t wd[3] = {D, G * H, p->input};
    snprintf(what, sizeof what, "num_directions, %lld*hidden_size, input_size", (long long)G);
    ENG_TRY(rnn_check(w, "W", ENG_DTYPE_F32, 3, wd, what));
    int64_t rd[3] = {D, G * H, H};
    snprintf(what, sizeof what, "num_directions, %lld*hidden_size, hidden_size", (long long)G);
    ENG_TRY(rnn_check(r, "R", ENG_DTYPE_F32, 3, rd, what));
    if (rnn_has(in, nin, KRN_RNN_IN_B)) {
        int64_t bd[2] = {D, 2 * G * H};
        snprintf(what, sizeof what, "num_directions, %lld*hidden_size", (long long)(2 * G));
        ENG_TRY(rnn_check(&in[KRN_RNN_IN_B], "B", ENG_DTYPE_F32, 2, bd, what));
    }
    if (rnn_has(in, nin, KRN_RNN_IN_SEQ_LENS)) {
        int64_t sd[1] = {B};
        ENG_TRY(rnn_check(&in[KRN_RNN_IN_SEQ_LENS], "sequence_lens", ENG_DTYPE_I32, 1, sd, "batch_size"));
    }
    int64_t hd[3] = {p->layout ? B : D, p->layout ? D : B, H};
    const char *hw = p->layout ? "batch_size, num_directions, hidden_size" : "num_directions, batch_size, hidden_size";
    if (rnn_has(in, nin, KRN_RNN_IN_H0)) ENG_TRY(rnn_check(&in[KRN_RNN_IN_H0], "initial_h", ENG_DTYPE_F32, 3, hd, hw));
    if (p->cell == KRN_RNN_LSTM && rnn_has(in, nin, KRN_RNN_IN_C0))
        ENG_TRY(rnn_check(&in[KRN_RNN_IN_C0], "initial_c", ENG_DTYPE_F32, 3, hd, hw));
    if (p->cell == KRN_RNN_LSTM && rnn_has(in, nin, KRN_RNN_IN_P)) {
        int64_t pd[2] = {D, 3 * H};
        ENG_TRY(rnn_check(&in[KRN_RNN_IN_P], "P", ENG_DTYPE_F32, 2, pd, "num_directions, 3*hidden_size"));
    }
    return ENG_STATUS_OK;
}

static eng_status rnn_prepare(eng_op_ctx *c, int cell) {
    ENG_TRY(eng_op_check_arity(c, 3, cell == KRN_RNN_LSTM ? 8 : 6));
    int maxout = cell == KRN_RNN_LSTM ? 3 : 2;
    if (c->nout > maxout)
        return eng_err(ENG_STATUS_INVALID_MODEL, "%d outputs; %s has at most %d (Y, Y_h%s)", c->nout, rnn_op_name(cell),
                       maxout, cell == KRN_RNN_LSTM ? ", Y_c" : "");
    krn_rnn_params *p = calloc(1, sizeof *p);
    if (!p) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s params", rnn_op_name(cell));
    c->params = p;
    return eng_rnn_parse(c->node, c->opset, cell, p);
}

static eng_status rnn_prepare_vanilla(eng_op_ctx *c) { return rnn_prepare(c, KRN_RNN_VANILLA); }
static eng_status rnn_prepare_gru(eng_op_ctx *c) { return rnn_prepare(c, KRN_RNN_GRU); }
static eng_status rnn_prepare_lstm(eng_op_ctx *c) { return rnn_prepare(c, KRN_RNN_LSTM); }

static eng_status rnn_infer(eng_op_ctx *c) {
    krn_rnn_params *p = c->params;
    ENG_TRY(eng_rnn_resolve(p, c->in, c->nin));
    int64_t S = p->seq, B = p->batch, D = p->ndir, H = p->hidden;
    for (int i = 0; i < c->nout; i++) {
        eng_tensor *o = &c->out[i];
        o->dtype = ENG_DTYPE_F32;
        if (i == KRN_RNN_OUT_Y) {
            o->ndim = 4;
            int64_t d0[4] = {S, D, B, H}, d1[4] = {B, S, D, H};
            memcpy(o->dims, p->layout ? d1 : d0, sizeof d0);
        } else {
            o->ndim = 3;
            int64_t d0[3] = {D, B, H}, d1[3] = {B, D, H};
            memcpy(o->dims, p->layout ? d1 : d0, sizeof d0);
        }
    }
    return ENG_STATUS_OK;
}

const eng_op_def eng_ops_rnn[] = {
    {"RNN", "", "rnn", 0, rnn_prepare_vanilla, rnn_infer, NULL},
    {"GRU", "", "rnn", 0, rnn_prepare_gru, rnn_infer, NULL},
    {"LSTM", "", "rnn", 0, rnn_prepare_lstm, rnn_infer, NULL},
    {NULL},
};
