/* test_grad.c - table-driven finite-difference gradient check of every op autodiff has a rule for.
 *
 * Each row is one op with attributes and inputs. The test builds  loss = sum_j ReduceSum(y_j * R_j)  (R_j a fixed
 * random projection of output j), differentiates it with eng_autodiff w.r.t. every float input marked as a
 * parameter, runs the backward graph in a session, and compares each gradient element with the float64
 * central difference (L(p + eps) - L(p - eps)) / 2 eps of the forward graph run in another session. Error:
 * max |analytic - numeric| / max(1, max |numeric|) must stay under the row's tolerance.
 *
 * Input spec "KIND:shape|values": P float param uniform in [-1, 1); Q positive param in [0.5, 2); D param with
 * distinct values 0.07 apart (max pooling); G param on the grid k/10 + 0.05 (never within 0.05 of a kink at a
 * multiple of 0.1: Relu, Clip, Abs); I int64 constant; J int32 constant (sequence_lens); F float constant; B bool
 * constant; "-" omitted.
 * Shapes are "2x3x4" ("" = scalar). Attributes "name=i:3;name=f:0.5;name=s:tanh;name=is:1,2;name=ss:Tanh,Relu".
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/train/autodiff.h"
#include "engine/ir/graph.h"
#include "engine/plan/session.h"
#include "kernels/krn-grad.h"

typedef struct gc_row {
    const char *name;
    const char *op;
    const char *domain;
    int opset;
    const char *in[8];
    int nout;
    unsigned outmask; /* outputs that feed the loss (0 = output 0 only) */
    const char *attrs;
    double tol;       /* 0: 1e-2 */
} gc_row;

static const gc_row rows[] = {
    /* nn */
    {"matmul_2d", "MatMul", "", 17, {"P:3x4", "P:4x5"}, 1, 0, "", 0},
    {"matmul_batch_bcast", "MatMul", "", 17, {"P:2x1x3x4", "P:3x4x2"}, 1, 0, "", 0},
    {"matmul_vec_left", "MatMul", "", 17, {"P:4", "P:2x4x3"}, 1, 0, "", 0},
    {"matmul_vec_right", "MatMul", "", 17, {"P:2x3x4", "P:4"}, 1, 0, "", 0},
    {"gemm_plain_bias_row", "Gemm", "", 17, {"P:3x4", "P:4x5", "P:5"}, 1, 0, "", 0},
    {"gemm_trans_alpha_beta", "Gemm", "", 17, {"P:4x3", "P:5x4", "P:3x1"}, 1, 0, "transA=i:1;transB=i:1;alpha=f:0.7;beta=f:1.5", 0},
    {"gemm_transB_noC", "Gemm", "", 17, {"P:3x4", "P:5x4"}, 1, 0, "transB=i:1", 0},
    {"gemm_transA_scalarC", "Gemm", "", 17, {"P:4x3", "P:4x5", "P:"}, 1, 0, "transA=i:1;beta=f:0.5", 0},
    {"conv2d_bias", "Conv", "", 17, {"P:2x2x5x5", "P:3x2x3x3", "P:3"}, 1, 0, "", 0},
    {"conv2d_groups_stride_pad_dil", "Conv", "", 17, {"P:2x4x7x6", "P:4x2x3x2", "P:4"}, 1, 0,
     "group=i:2;strides=is:2,1;pads=is:1,0,2,1;dilations=is:2,1", 0},
    {"conv2d_depthwise_same", "Conv", "", 17, {"P:1x3x5x5", "P:3x1x3x3"}, 1, 0, "group=i:3;auto_pad=s:SAME_UPPER", 0},
    /* depthwise dW by krn_cpu_dw_conv_grad_weights: 5x5 stride 2 with a bias over 20 channels (a 16-channel block
     * and a tail of 4), and 3x2 with asymmetric pads and strides over 17 */
    {"conv2d_depthwise_5x5_s2_tail", "Conv", "", 17, {"P:2x20x9x8", "P:20x1x5x5", "P:20"}, 1, 0,
     "group=i:20;strides=is:2,2;pads=is:2,2,2,2", 0},
    {"conv2d_depthwise_asym", "Conv", "", 17, {"P:3x17x6x7", "P:17x1x3x2"}, 1, 0,
     "group=i:17;strides=is:1,2;pads=is:1,0,1,1", 0},
    {"mul_bcast_per_channel", "Mul", "", 17, {"P:2x3x4x5", "P:2x3x1x1"}, 1, 0, "", 0},
    {"silu", "Silu", "com.tensord", 17, {"P:3x5x4"}, 1, 0, "", 0}, /* a training graph's x * sigmoid(x) */
    {"conv1d_stride", "Conv", "", 17, {"P:2x3x9", "P:2x3x3", "P:2"}, 1, 0, "strides=is:2;pads=is:1,1", 0},
    {"conv3d", "Conv", "", 17, {"P:1x2x4x4x3", "P:2x2x2x2x2"}, 1, 0, "pads=is:1,0,0,0,1,1", 0},
    {"maxpool_k3s2p1", "MaxPool", "", 17, {"D:2x2x5x5"}, 1, 0, "kernel_shape=is:3,3;strides=is:2,2;pads=is:1,1,1,1", 0},
    {"maxpool_ceil_dil", "MaxPool", "", 17, {"D:1x2x6x7"}, 1, 0, "kernel_shape=is:2,2;strides=is:2,2;ceil_mode=i:1;dilations=is:1,2", 0},
    {"maxpool_1d_indices", "MaxPool", "", 17, {"D:2x3x8"}, 2, 1, "kernel_shape=is:3;strides=is:2", 0},
    {"avgpool_include_pad", "AveragePool", "", 17, {"P:2x2x5x5"}, 1, 0, "kernel_shape=is:3,3;strides=is:2,2;pads=is:1,1,1,1;count_include_pad=i:1", 0},
    {"avgpool_exclude_pad_ceil", "AveragePool", "", 17, {"P:1x2x6x5"}, 1, 0, "kernel_shape=is:3,2;strides=is:2,2;pads=is:1,0,1,1;ceil_mode=i:1", 0},
    {"global_avgpool", "GlobalAveragePool", "", 17, {"P:2x3x4x5"}, 1, 0, "", 0},
    {"global_maxpool", "GlobalMaxPool", "", 17, {"D:2x3x4x3"}, 1, 0, "", 0},
    {"batchnorm_training", "BatchNormalization", "", 15, {"P:4x3x2x2", "Q:3", "P:3", "F:3|0.1,0.2,0.3", "F:3|1,2,0.5"}, 3, 1,
     "training_mode=i:1;momentum=f:0.9", 5e-3},
    {"batchnorm_training_2d", "BatchNormalization", "", 15, {"P:6x4", "Q:4", "P:4", "F:4|0,0,0,0", "F:4|1,1,1,1"}, 3, 1,
     "training_mode=i:1;epsilon=f:0.001", 5e-3},
    {"batchnorm_inference", "BatchNormalization", "", 15, {"P:2x3x2x2", "Q:3", "P:3", "F:3|0.1,0.2,0.3", "F:3|1,2,0.5"}, 1, 0, "", 0},
    {"layernorm_last", "LayerNormalization", "", 17, {"P:3x5", "Q:5", "P:5"}, 1, 0, "", 5e-3},
    {"layernorm_axis1_bcast_scale", "LayerNormalization", "", 17, {"P:2x3x4", "Q:4", "P:3x1"}, 1, 0, "axis=i:1", 5e-3},
    /* activations */
    {"relu", "Relu", "", 17, {"G:3x4"}, 1, 0, "", 0},
    {"leaky_relu", "LeakyRelu", "", 17, {"G:3x4"}, 1, 0, "alpha=f:0.2", 0},
    {"gelu", "Gelu", "", 20, {"P:3x4"}, 1, 0, "", 0},
    {"gelu_tanh", "Gelu", "", 20, {"P:3x4"}, 1, 0, "approximate=s:tanh", 0},
    {"erf", "Erf", "", 17, {"P:3x4"}, 1, 0, "", 0},
    {"sigmoid", "Sigmoid", "", 17, {"P:3x4"}, 1, 0, "", 0},
    {"tanh", "Tanh", "", 17, {"P:3x4"}, 1, 0, "", 0},
    {"softmax_axis1", "Softmax", "", 17, {"P:2x4x3"}, 1, 0, "axis=i:1", 0},
    {"softmax_opset11_coerce", "Softmax", "", 11, {"P:2x3x2"}, 1, 0, "axis=i:1", 0},
    {"logsoftmax_last", "LogSoftmax", "", 17, {"P:3x5"}, 1, 0, "", 0},
    /* elementwise */
    {"add_bcast", "Add", "", 17, {"P:2x3x4", "P:3x1"}, 1, 0, "", 0},
    {"sub_bcast", "Sub", "", 17, {"P:3x1", "P:2x1x4"}, 1, 0, "", 0},
    {"mul_bcast", "Mul", "", 17, {"P:2x3x4", "P:4"}, 1, 0, "", 0},
    {"mul_same_input_twice", "Mul", "", 17, {"P:3x4", "P:3x4"}, 1, 0, "", 0},
    {"div_bcast", "Div", "", 17, {"P:2x3", "Q:3"}, 1, 0, "", 0},
    {"div_scalar_den", "Div", "", 17, {"P:2x3", "Q:"}, 1, 0, "", 0},
    {"neg", "Neg", "", 17, {"P:3x4"}, 1, 0, "", 0},
    {"exp", "Exp", "", 17, {"P:3x4"}, 1, 0, "", 0},
    {"log", "Log", "", 17, {"Q:3x4"}, 1, 0, "", 0},
    {"sqrt", "Sqrt", "", 17, {"Q:3x4"}, 1, 0, "", 0},
    {"pow_const", "Pow", "", 17, {"Q:3x4", "F:|2.5"}, 1, 0, "", 0},
    {"pow_int_exponent", "Pow", "", 17, {"P:3x4", "I:|3"}, 1, 0, "", 0},
    {"clip_inputs", "Clip", "", 13, {"G:4x5", "F:|-0.5", "F:|0.3"}, 1, 0, "", 0},
    {"clip_attrs_opset6", "Clip", "", 6, {"G:4x5"}, 1, 0, "min=f:-0.4;max=f:0.6", 0},
    {"cast_f32", "Cast", "", 17, {"P:3x4"}, 1, 0, "to=i:1", 0},
    {"where_bcast", "Where", "", 17, {"B:3x1|1,0,1", "P:3x4", "P:4"}, 1, 0, "", 0},
    {"sum_variadic", "Sum", "", 17, {"P:3x4", "P:4", "P:3x1"}, 1, 0, "", 0},
    {"abs", "Abs", "", 17, {"G:3x4"}, 1, 0, "", 0},
    {"reciprocal", "Reciprocal", "", 17, {"Q:3x4"}, 1, 0, "", 0},
    {"identity", "Identity", "", 17, {"P:3x4"}, 1, 0, "", 0},
    /* reductions */
    {"reducemean_attr_axes", "ReduceMean", "", 13, {"P:2x3x4"}, 1, 0, "axes=is:0,2;keepdims=i:0", 0},
    {"reducemean_all_keep", "ReduceMean", "", 13, {"P:2x3x4"}, 1, 0, "", 0},
    {"reducemean_input_axes", "ReduceMean", "", 18, {"P:2x3x4", "I:1|-1"}, 1, 0, "keepdims=i:1", 0},
    {"reducesum_input_axes", "ReduceSum", "", 13, {"P:2x3x4", "I:2|1,2"}, 1, 0, "keepdims=i:0", 0},
    {"reducesum_attr_opset11", "ReduceSum", "", 11, {"P:2x3x4"}, 1, 0, "axes=is:1", 0},
    /* data movement */
    {"reshape", "Reshape", "", 17, {"P:2x3x4", "I:2|4,-1"}, 1, 0, "", 0},
    {"flatten", "Flatten", "", 17, {"P:2x3x4"}, 1, 0, "axis=i:2", 0},
    {"squeeze", "Squeeze", "", 17, {"P:2x1x4", "I:1|1"}, 1, 0, "", 0},
    {"unsqueeze", "Unsqueeze", "", 17, {"P:2x4", "I:2|0,2"}, 1, 0, "", 0},
    {"expand", "Expand", "", 17, {"P:3x1", "I:3|2,3,4"}, 1, 0, "", 0},
    {"transpose_perm", "Transpose", "", 17, {"P:2x3x4"}, 1, 0, "perm=is:1,2,0", 0},
    {"transpose_default", "Transpose", "", 17, {"P:2x3x4"}, 1, 0, "", 0},
    {"concat_axis1", "Concat", "", 17, {"P:2x1x3", "P:2x3x3", "P:2x2x3"}, 1, 0, "axis=i:1", 0},
    {"concat_axis_neg", "Concat", "", 17, {"P:2x3", "P:2x2"}, 1, 0, "axis=i:-1", 0},
    {"split_input", "Split", "", 17, {"P:2x5x3", "I:2|2,3"}, 2, 3, "axis=i:1", 0},
    {"split_one_output_used", "Split", "", 17, {"P:6x2"}, 3, 2, "", 0},
    {"slice_steps", "Slice", "", 17, {"P:5x6", "I:2|0,5", "I:2|5,0", "I:2|0,1", "I:2|2,-2"}, 1, 0, "", 0},
    {"slice_axes_neg", "Slice", "", 17, {"P:3x4x5", "I:1|1", "I:1|100", "I:1|-2"}, 1, 0, "", 0},
    {"slice_opset1_attrs", "Slice", "", 9, {"P:4x5"}, 1, 0, "starts=is:1,0;ends=is:3,4;axes=is:0,1", 0},
    {"gather_embedding", "Gather", "", 17, {"P:5x3", "I:2x3|0,4,2,4,4,1"}, 1, 0, "", 0},
    {"gather_axis1_negidx", "Gather", "", 17, {"P:2x4x3", "I:3|-1,0,3"}, 1, 0, "axis=i:1", 0},
    {"dropout_inference", "Dropout", "", 17, {"P:3x4"}, 1, 0, "", 0},
    {"training_dropout", "TrainingDropout", "com.tensord", 17, {"P:4x6"}, 2, 1, "ratio=f:0.3;seed=i:7", 0},
    /* losses */
    {"sce_mean", "SoftmaxCrossEntropyLoss", "", 17, {"P:4x5", "I:4|1,0,4,2"}, 1, 0, "", 0},
    {"sce_mean_weights_ignore", "SoftmaxCrossEntropyLoss", "", 17, {"P:5x4", "I:5|1,3,0,3,2", "F:4|0.5,1,2,1.5"}, 1, 0,
     "ignore_index=i:0", 0},
    {"sce_sum_spatial_logprob", "SoftmaxCrossEntropyLoss", "", 17, {"P:2x3x4", "I:2x4|0,1,2,0,2,2,1,0"}, 2, 3,
     "reduction=s:sum", 0},
    {"sce_none", "SoftmaxCrossEntropyLoss", "", 17, {"P:3x4", "I:3|3,0,1"}, 1, 0, "reduction=s:none", 0},
    {"nll_mean_weights", "NegativeLogLikelihoodLoss", "", 17, {"P:4x3", "I:4|2,0,1,2", "F:3|0.2,1,3"}, 1, 0, "", 0},
    {"nll_sum_ignore", "NegativeLogLikelihoodLoss", "", 17, {"P:3x4x2", "I:3x2|1,3,-1,0,2,-1"}, 1, 0,
     "reduction=s:sum;ignore_index=i:-1", 0},
    {"nll_none", "NegativeLogLikelihoodLoss", "", 17, {"P:3x4", "I:3|0,3,2"}, 1, 0, "reduction=s:none", 0},
    /* recurrent: X W R B sequence_lens initial_h initial_c P; outputs Y Y_h Y_c */
    {"lstm_forward_Y", "LSTM", "", 14, {"P:3x2x3", "P:1x8x3", "P:1x8x2"}, 3, 1, "hidden_size=i:2", 0},
    {"lstm_reverse_B_states_all", "LSTM", "", 14, {"P:3x2x3", "P:1x8x3", "P:1x8x2", "P:1x16", "-", "P:1x2x2", "P:1x2x2"},
     3, 7, "hidden_size=i:2;direction=s:reverse", 0},
    {"lstm_bidir_peep_seqlens_all", "LSTM", "", 14,
     {"P:3x2x3", "P:2x8x3", "P:2x8x2", "P:2x16", "J:2|3,1", "P:2x2x2", "P:2x2x2", "P:2x6"}, 3, 7,
     "hidden_size=i:2;direction=s:bidirectional", 0},
    {"lstm_seqlens_Yh_only", "LSTM", "", 14, {"P:3x2x3", "P:1x8x3", "P:1x8x2", "P:1x16", "J:2|2,3", "P:1x2x2"}, 3, 2,
     "hidden_size=i:2", 0},
    /* a row of length 0: its Y_h and Y_c are zeros whatever initial_h / initial_c hold (no gradient reaches them) */
    {"lstm_len0_row_states", "LSTM", "", 14,
     {"P:3x2x3", "P:1x8x3", "P:1x8x2", "P:1x16", "J:2|0,3", "P:1x2x2", "P:1x2x2"}, 3, 7, "hidden_size=i:2", 0},
    {"lstm_layout1_bidir_Y_Yc", "LSTM", "", 14,
     {"P:2x3x3", "P:2x8x3", "P:2x8x2", "P:2x16", "J:2|3,2", "P:2x2x2", "P:2x2x2", "P:2x6"}, 3, 5,
     "hidden_size=i:2;direction=s:bidirectional;layout=i:1", 0},
    {"lstm_clip_input_forget_acts", "LSTM", "", 14,
     {"P:3x2x3", "P:1x8x3", "P:1x8x2", "P:1x16", "-", "P:1x2x2", "P:1x2x2", "P:1x6"}, 3, 7,
     "hidden_size=i:2;clip=f:1.5;input_forget=i:1;activations=ss:HardSigmoid,Softsign,Tanh", 0},
    {"gru_forward_Y", "GRU", "", 14, {"P:3x2x3", "P:1x6x3", "P:1x6x2"}, 2, 1, "hidden_size=i:2", 0},
    {"gru_reverse_B_h0_all", "GRU", "", 14, {"P:3x2x3", "P:1x6x3", "P:1x6x2", "P:1x12", "-", "P:1x2x2"}, 2, 3,
     "hidden_size=i:2;direction=s:reverse", 0},
    {"gru_bidir_lbr_seqlens_all", "GRU", "", 14, {"P:3x2x3", "P:2x6x3", "P:2x6x2", "P:2x12", "J:2|1,3", "P:2x2x2"}, 2, 3,
     "hidden_size=i:2;direction=s:bidirectional;linear_before_reset=i:1", 0},
    {"gru_layout1_seqlens_Yh_only", "GRU", "", 14, {"P:2x3x3", "P:1x6x3", "P:1x6x2", "P:1x12", "J:2|3,2", "P:2x1x2"}, 2, 2,
     "hidden_size=i:2;layout=i:1", 0},
    {"rnn_bidir_seqlens_all", "RNN", "", 14, {"P:3x2x3", "P:2x2x3", "P:2x2x2", "P:2x4", "J:2|2,3", "P:2x2x2"}, 2, 3,
     "hidden_size=i:2;direction=s:bidirectional", 0},
    {"rnn_reverse_layout1_Yh_only", "RNN", "", 14, {"P:2x3x3", "P:1x2x3", "P:1x2x2", "P:1x4", "-", "P:2x1x2"}, 2, 2,
     "hidden_size=i:2;direction=s:reverse;layout=i:1", 0},
};

/* ---- deterministic random numbers ---- */

static uint64_t rng_state;
static double urand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- graph building ---- */

static int parse_shape(const char *s, int64_t *dims) {
    int n = 0;
    while (*s && *s != '|') {
        dims[n++] = strtoll(s, (char **)&s, 10);
        if (*s == 'x') s++;
    }
    return n;
}

static eng_tensor *new_tensor(eng_dtype dt, int ndim, const int64_t *dims) {
    eng_tensor *t = calloc(1, sizeof *t);
    t->dtype = dt;
    t->ndim = ndim;
    memcpy(t->dims, dims, (size_t)ndim * sizeof *dims);
    size_t nb = eng_tensor_nbytes(t);
    t->data = eng_alloc(nb ? nb : 1);
    return t;
}

static void list_add(int **a, int *n, int v) {
    *a = realloc(*a, (size_t)(*n + 1) * sizeof(int));
    (*a)[(*n)++] = v;
}

static void add_attrs(eng_graph *g, int node, const char *spec) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *save = NULL, *tok = strtok_r(buf, ";", &save); tok; tok = strtok_r(NULL, ";", &save)) {
        char *eq = strchr(tok, '='), *colon = eq ? strchr(eq, ':') : NULL;
        cr_assert(eq && colon, "bad attr spec %s", tok);
        *eq = 0;
        *colon = 0;
        const char *kind = eq + 1, *val = colon + 1;
        eng_attr a = {.name = tok};
        int64_t ints[16];
        char *strs[16];
        if (!strcmp(kind, "i")) a.type = ENG_ATTR_INT, a.i = strtoll(val, NULL, 10);
        else if (!strcmp(kind, "f")) a.type = ENG_ATTR_FLOAT, a.f = strtof(val, NULL);
        else if (!strcmp(kind, "s")) a.type = ENG_ATTR_STRING, a.s = (char *)val, a.s_len = strlen(val);
        else if (!strcmp(kind, "ss")) {
            a.type = ENG_ATTR_STRINGS;
            a.strings = strs;
            char *save2 = NULL;
            for (char *w = strtok_r((char *)val, ",", &save2); w && a.n < 16; w = strtok_r(NULL, ",", &save2))
                strs[a.n++] = w;
        } else {
            a.type = ENG_ATTR_INTS;
            const char *p = val;
            while (*p) {
                ints[a.n++] = strtoll(p, (char **)&p, 10);
                if (*p == ',') p++;
            }
            a.ints = ints;
        }
        cr_assert_eq(eng_node_add_attr(g, node, &a), ENG_STATUS_OK);
    }
}

typedef struct gc_case {
    eng_graph *g;           /* forward + loss */
    int nparams;
    const char *pnames[8];
    eng_tensor *pvals[8];   /* owned copies of the parameter values */
} gc_case;

/* Build op + loss. Output shapes come from a first run without the loss (projection sizes). */
static void build_case(const gc_row *r, gc_case *k) {
    memset(k, 0, sizeof *k);
    eng_graph *g = eng_graph_new();
    g->opset = r->opset;
    int ins[8], nin = 0;
    for (int i = 0; i < 8 && r->in[i]; i++, nin++) {
        const char *s = r->in[i];
        if (!strcmp(s, "-")) {
            ins[i] = -1;
            continue;
        }
        char kind = s[0], name[32];
        int64_t dims[8];
        int nd = parse_shape(s + 2, dims);
        const char *vals = strchr(s, '|');
        snprintf(name, sizeof name, "in%d", i);
        int v = eng_graph_add_value(g, name);
        ins[i] = v;
        eng_tensor *t;
        if (kind == 'I' || kind == 'J' || kind == 'B' || kind == 'F') {
            eng_dtype dt = kind == 'I' ? ENG_DTYPE_I64 : kind == 'J' ? ENG_DTYPE_I32 : kind == 'B' ? ENG_DTYPE_BOOL : ENG_DTYPE_F32;
            t = new_tensor(dt, nd, dims);
            const char *p = vals + 1;
            for (int64_t e = 0; e < eng_tensor_numel(t); e++) {
                eng_tensor_set_f64(t, e, strtod(p, (char **)&p));
                if (*p == ',') p++;
            }
        } else {
            t = new_tensor(ENG_DTYPE_F32, nd, dims);
            int64_t n = eng_tensor_numel(t);
            float *d = t->data;
            for (int64_t e = 0; e < n; e++) {
                if (kind == 'Q') d[e] = (float)(0.5 + 1.5 * urand());
                else if (kind == 'G') d[e] = (float)(floor(urand() * 20 - 10) / 10 + 0.05);
                else d[e] = (float)(2 * urand() - 1);
            }
            if (kind == 'D') { /* random permutation of distinct values */
                for (int64_t e = 0; e < n; e++) d[e] = (float)((double)(e - n / 2) * 0.07 + 0.013);
                for (int64_t e = n - 1; e > 0; e--) {
                    int64_t j = (int64_t)(urand() * (double)(e + 1));
                    float tmp = d[e];
                    d[e] = d[j];
                    d[j] = tmp;
                }
            }
            k->pnames[k->nparams] = g->values[v].name;
            k->pvals[k->nparams++] = eng_tensor_clone(t);
            list_add(&g->inputs, &g->ninputs, v);
        }
        g->values[v].dtype = t->dtype;
        g->values[v].ndim = nd;
        memcpy(g->values[v].dims, dims, sizeof(int64_t) * (size_t)nd);
        eng_value_set_init(g, v, t);
    }
    int outs[4];
    for (int j = 0; j < r->nout; j++) {
        char name[32];
        snprintf(name, sizeof name, "y%d", j);
        outs[j] = eng_graph_add_value(g, name);
    }
    int node = eng_graph_add_node(g, "op", r->op, r->domain, ins, nin, outs, r->nout);
    add_attrs(g, node, r->attrs);
    unsigned mask = r->outmask ? r->outmask : 1u;
    /* shapes of the outputs */
    eng_graph *probe = eng_graph_clone(g);
    for (int j = 0; j < r->nout; j++)
        if (mask >> j & 1u) list_add(&probe->outputs, &probe->noutputs, outs[j]);
    eng_session *s = NULL;
    eng_session_opts so = {.nthreads = 1, .no_fuse = 1};
    cr_assert_eq(eng_session_new_graph(probe, &so, &s), ENG_STATUS_OK, "%s: %s", r->name, eng_last_error());
    eng_tensor y[4];
    cr_assert_eq(eng_session_run(s, 0, NULL, NULL, y), ENG_STATUS_OK, "%s: %s", r->name, eng_last_error());
    int terms[4], nt = 0, k2 = 0;
    for (int j = 0; j < r->nout; j++) {
        if (!(mask >> j & 1u)) continue;
        eng_tensor *R = new_tensor(ENG_DTYPE_F32, y[k2].ndim, y[k2].dims);
        for (int64_t e = 0; e < eng_tensor_numel(R); e++) ((float *)R->data)[e] = (float)(2 * urand() - 1);
        k2++;
        char name[32];
        snprintf(name, sizeof name, "R%d", j);
        int rv = eng_graph_add_value(g, name);
        eng_value_set_init(g, rv, R);
        snprintf(name, sizeof name, "m%d", j);
        int mv = eng_graph_add_value(g, name), mi[2] = {outs[j], rv};
        eng_graph_add_node(g, name, "Mul", "", mi, 2, &mv, 1);
        snprintf(name, sizeof name, "s%d", j);
        int sv = eng_graph_add_value(g, name);
        int sn = eng_graph_add_node(g, name, "ReduceSum", "", &mv, 1, &sv, 1);
        eng_attr kd = {.name = "keepdims", .type = ENG_ATTR_INT, .i = 0};
        eng_node_add_attr(g, sn, &kd);
        terms[nt++] = sv;
    }
    eng_session_free(&s);
    int loss = terms[0];
    if (nt > 1) {
        loss = eng_graph_add_value(g, "loss");
        eng_graph_add_node(g, "loss_sum", "Sum", "", terms, nt, &loss, 1);
    }
    list_add(&g->outputs, &g->noutputs, loss);
    k->g = g;
}

static double run_loss(eng_session *s, gc_case *k) {
    eng_tensor out[1];
    eng_tensor feed[8];
    for (int i = 0; i < k->nparams; i++) feed[i] = *k->pvals[i];
    cr_assert_eq(eng_session_run(s, k->nparams, k->pnames, feed, out), ENG_STATUS_OK, "%s", eng_last_error());
    return eng_tensor_get_f64(&out[0], 0);
}

static void check_row(const gc_row *r) {
    gc_case k;
    build_case(r, &k);
    eng_session_opts so = {.nthreads = 1, .no_fuse = 1};
    eng_graph *ad = eng_graph_clone(k.g);
    const char *loss = k.g->values[k.g->outputs[0]].name;
    eng_grad_spec spec = {.loss = loss, .params = k.pnames, .nparams = k.nparams};
    cr_assert_eq(eng_autodiff(ad, &spec), ENG_STATUS_OK, "%s: autodiff: %s", r->name, eng_last_error());
    cr_assert_eq(ad->noutputs, 1 + k.nparams, "%s", r->name);
    eng_session *sad = NULL, *sf = NULL;
    cr_assert_eq(eng_session_new_graph(ad, &so, &sad), ENG_STATUS_OK, "%s: %s", r->name, eng_last_error());
    cr_assert_eq(eng_session_new_graph(k.g, &so, &sf), ENG_STATUS_OK, "%s: %s", r->name, eng_last_error());
    const eng_graph *fg = eng_session_graph(sf); /* the session owns k.g now: take names from its graph */
    for (int i = 0; i < k.nparams; i++) k.pnames[i] = fg->values[eng_graph_find_value(fg, k.pnames[i])].name;
    eng_tensor out[9], feed[8];
    for (int i = 0; i < k.nparams; i++) feed[i] = *k.pvals[i];
    cr_assert_eq(eng_session_run(sad, k.nparams, k.pnames, feed, out), ENG_STATUS_OK, "%s: backward run: %s", r->name,
                 eng_last_error());
    double l0 = eng_tensor_get_f64(&out[0], 0), lf = run_loss(sf, &k);
    cr_assert(fabs(l0 - lf) <= 1e-5 * (1 + fabs(lf)), "%s: loss differs between graphs: %g vs %g", r->name, l0, lf);
    double tol = r->tol > 0 ? r->tol : 2e-3, eps = 5e-3;
    for (int i = 0; i < k.nparams; i++) {
        eng_tensor *p = k.pvals[i];
        const eng_tensor *gt = &out[1 + i];
        cr_assert(eng_shape_equal(gt, p), "%s: grad of %s has the wrong shape", r->name, k.pnames[i]);
        int64_t n = eng_tensor_numel(p);
        double *ga = malloc((size_t)(n + 1) * sizeof(double)), *gn = malloc((size_t)(n + 1) * sizeof(double));
        for (int64_t e = 0; e < n; e++) ga[e] = eng_tensor_get_f64(gt, e);
        double maxn = 1, maxd = 0;
        int64_t worst = 0;
        for (int64_t e = 0; e < n; e++) {
            float *d = p->data, x0 = d[e];
            d[e] = (float)(x0 + eps);
            double lp = run_loss(sf, &k);
            d[e] = (float)(x0 - eps);
            double lm = run_loss(sf, &k);
            double h = ((double)(float)(x0 + eps) - (double)(float)(x0 - eps));
            d[e] = x0;
            gn[e] = (lp - lm) / h;
            if (fabs(gn[e]) > maxn) maxn = fabs(gn[e]);
        }
        for (int64_t e = 0; e < n; e++)
            if (fabs(ga[e] - gn[e]) > maxd) maxd = fabs(ga[e] - gn[e]), worst = e;
        double err = maxd / maxn;
        cr_log_info("gradcheck %-32s d/d%-4s err %.2e", r->name, k.pnames[i], err);
        cr_expect(err <= tol, "%s: d/d%s error %.3e > %.1e (element %lld: analytic %.6f numeric %.6f)", r->name,
                  k.pnames[i], err, tol, (long long)worst, ga[worst], gn[worst]);
        free(ga);
        free(gn);
    }
    for (int i = 0; i < k.nparams; i++) eng_tensor_destroy(&k.pvals[i]);
    eng_session_free(&sad);
    eng_session_free(&sf);
}

Test(grad, finite_difference_table, .timeout = 120) {
    krn_grad_dropout_set_step(3);
    int n = (int)(sizeof rows / sizeof rows[0]);
    for (int i = 0; i < n; i++) {
        rng_state = 0x1234567ull + (uint64_t)i * 977;
        check_row(&rows[i]);
    }
}

/* Every op of the rule tables appears in the table above (a new rule must come with a row). */
Test(grad, every_rule_has_a_row) {
    static const char *const ops[] = {"Add", "Sub", "Mul", "Div", "Pow", "Sum", "Neg", "Exp", "Log", "Sqrt",
        "Reciprocal", "Abs", "Relu", "LeakyRelu", "Gelu", "Erf", "Sigmoid", "Tanh", "Clip", "Cast", "Identity", "Where",
        "ReduceSum", "ReduceMean", "Softmax", "LogSoftmax", "MatMul", "Gemm", "Conv", "MaxPool", "AveragePool",
        "GlobalAveragePool", "GlobalMaxPool", "BatchNormalization", "LayerNormalization", "SoftmaxCrossEntropyLoss",
        "NegativeLogLikelihoodLoss", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Expand", "Transpose", "Concat",
        "Split", "Slice", "Gather", "Dropout", "TrainingDropout", "LSTM", "GRU", "RNN", NULL};
    for (int i = 0; ops[i]; i++) {
        int found = 0;
        for (size_t j = 0; j < sizeof rows / sizeof rows[0]; j++) found |= !strcmp(rows[j].op, ops[i]);
        cr_expect(found, "no gradcheck row for %s", ops[i]);
    }
}
