/* loss.c - losses appended to a model graph as plain ONNX nodes (see loss.h).
 *
 * Every loss is written with ops the executor runs and autodiff differentiates: SoftmaxCrossEntropyLoss,
 * NegativeLogLikelihoodLoss, LogSoftmax, Log, Exp, Abs, Relu, Neg, Add, Sub, Mul, Div, Sqrt, Clip, ReduceSum,
 * ReduceMean, Flatten, Reshape, and Constant nodes for every constant (never initializers, so constants are not
 * mistaken for trainable parameters by eng_trainable_params). Node and value names start with "loss/"; the loss
 * value itself is named "loss" (it keeps its "loss/..." name when the model already has a "loss").
 *
 * Invariants:
 *  - Every check that can fail on the caller's input (pred missing, wrong rank/dtype, name clashes) runs
 *    before the graph is touched; after that only allocation can fail (then the graph may hold a partial
 *    loss and must be discarded).
 *  - Metric nodes (ArgMax/Greater -> Equal -> Cast -> ReduceMean) read pred/label but are never ancestors of
 *    the loss value, so autodiff never walks them (ArgMax/Equal have no gradient rule and need none).
 *  - Graph outputs after the call: the model's outputs, then the loss, then "metric/accuracy" (classification
 *    losses only). The label is appended to g->inputs, named "label".
 *  - Opset-dependent forms follow g->opset: ReduceSum axes as an input from opset 13 (attribute before), Clip
 *    bounds as inputs from opset 11 (attributes before); ReduceMean is only used over all axes (no axes).
 */
#include "loss.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LOSS_EPS 1e-7f   /* Keras backend epsilon: probability clipping */
#define LOSS_L2_EPS 1e-12f /* Keras l2_normalize epsilon */

int eng_loss_parse(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "sparse_categorical_crossentropy")) return ENG_LOSS_SPARSE_CCE;
    if (!strcmp(name, "categorical_crossentropy")) return ENG_LOSS_CCE;
    if (!strcmp(name, "binary_crossentropy")) return ENG_LOSS_BCE;
    if (!strcmp(name, "mse") || !strcmp(name, "mean_squared_error")) return ENG_LOSS_MSE;
    if (!strcmp(name, "cosine_similarity")) return ENG_LOSS_COSINE;
    return -1;
}

const char *eng_loss_name(eng_loss_kind k) {
    switch (k) {
    case ENG_LOSS_SPARSE_CCE: return "sparse_categorical_crossentropy";
    case ENG_LOSS_CCE: return "categorical_crossentropy";
    case ENG_LOSS_BCE: return "binary_crossentropy";
    case ENG_LOSS_MSE: return "mean_squared_error";
    case ENG_LOSS_COSINE: return "cosine_similarity";
    }
    return "unknown";
}

/* ---- a tiny node builder: records the first allocation failure and turns later calls into no-ops ---- */

typedef struct lb {
    eng_graph *g;
    int ok;
    int last_node;
    int seq;
} lb;

/* A fresh value named "loss/<stem>" (suffixed until unique). */
static int lb_value(lb *b, const char *stem) {
    if (!b->ok) return -1;
    char name[256];
    snprintf(name, sizeof name, "loss/%s", stem);
    for (int k = 1; eng_graph_find_value(b->g, name) >= 0; k++) snprintf(name, sizeof name, "loss/%s_%d", stem, k);
    int v = eng_graph_add_value(b->g, name);
    if (v < 0) b->ok = 0;
    return v;
}

/* Node op(in...) -> one new value; returns the value index (-1 after a failure). */
static int lb_node(lb *b, const char *op, const int *in, int nin, const char *stem) {
    if (!b->ok) return -1;
    for (int i = 0; i < nin; i++)
        if (in[i] < 0) return b->ok = 0, -1;
    int out = lb_value(b, stem);
    if (out < 0) return -1;
    char name[300];
    snprintf(name, sizeof name, "%s#%d", b->g->values[out].name, b->seq++);
    int n = eng_graph_add_node(b->g, name, op, "", in, nin, &out, 1);
    if (n < 0) return b->ok = 0, -1;
    b->last_node = n;
    return out;
}

static int lb_op1(lb *b, const char *op, int x, const char *stem) { return lb_node(b, op, &x, 1, stem); }
static int lb_op2(lb *b, const char *op, int x, int y, const char *stem) {
    int in[2] = {x, y};
    return lb_node(b, op, in, 2, stem);
}

static void lb_attr_int(lb *b, const char *name, int64_t v) {
    if (!b->ok) return;
    eng_attr a = {.name = (char *)name, .type = ENG_ATTR_INT, .i = v};
    if (eng_node_add_attr(b->g, b->last_node, &a) != ENG_STATUS_OK) b->ok = 0;
}

static void lb_attr_float(lb *b, const char *name, float v) {
    if (!b->ok) return;
    eng_attr a = {.name = (char *)name, .type = ENG_ATTR_FLOAT, .f = v};
    if (eng_node_add_attr(b->g, b->last_node, &a) != ENG_STATUS_OK) b->ok = 0;
}

static void lb_attr_str(lb *b, const char *name, const char *v) {
    if (!b->ok) return;
    eng_attr a = {.name = (char *)name, .type = ENG_ATTR_STRING, .s = (char *)v, .s_len = strlen(v)};
    if (eng_node_add_attr(b->g, b->last_node, &a) != ENG_STATUS_OK) b->ok = 0;
}

static void lb_attr_ints(lb *b, const char *name, const int64_t *v, int n) {
    if (!b->ok) return;
    eng_attr a = {.name = (char *)name, .type = ENG_ATTR_INTS, .ints = (int64_t *)v, .n = n};
    if (eng_node_add_attr(b->g, b->last_node, &a) != ENG_STATUS_OK) b->ok = 0;
}

/* Constant node holding `data` (copied) as a tensor of dtype/shape; returns its value. */
static int lb_const(lb *b, eng_dtype dt, int ndim, const int64_t *dims, const void *data, const char *stem) {
    int v = lb_node(b, "Constant", NULL, 0, stem);
    if (!b->ok) return -1;
    eng_attr a = {.name = "value", .type = ENG_ATTR_TENSOR};
    a.t.dtype = dt;
    a.t.ndim = ndim;
    for (int i = 0; i < ndim; i++) a.t.dims[i] = dims[i];
    a.t.data = (void *)data;
    if (eng_node_add_attr(b->g, b->last_node, &a) != ENG_STATUS_OK) b->ok = 0;
    return v;
}

static int lb_scalar(lb *b, float x, const char *stem) { return lb_const(b, ENG_DTYPE_F32, 0, NULL, &x, stem); }

static int lb_ints(lb *b, const int64_t *v, int n, const char *stem) {
    int64_t d = n;
    return lb_const(b, ENG_DTYPE_I64, 1, &d, v, stem);
}

/* ReduceSum over the last axis (keepdims as given), in the form g->opset expects. */
static int lb_sum_last(lb *b, int x, int keepdims, const char *stem) {
    static const int64_t last[1] = {-1};
    int r;
    if (b->g->opset >= 13) {
        int ax = lb_ints(b, last, 1, "axes_last");
        r = lb_op2(b, "ReduceSum", x, ax, stem);
    } else {
        r = lb_op1(b, "ReduceSum", x, stem);
        lb_attr_ints(b, "axes", last, 1);
    }
    lb_attr_int(b, "keepdims", keepdims);
    return r;
}

/* Mean over every element, as a rank-0 value. */
static int lb_mean_all(lb *b, int x, const char *stem) {
    int r = lb_op1(b, "ReduceMean", x, stem);
    lb_attr_int(b, "keepdims", 0);
    return r;
}

/* Clip(x, lo, hi) in the form g->opset expects. */
static int lb_clip(lb *b, int x, float lo, float hi, const char *stem) {
    if (b->g->opset >= 11) {
        int in[3] = {x, lb_scalar(b, lo, "clip_min"), lb_scalar(b, hi, "clip_max")};
        return lb_node(b, "Clip", in, 3, stem);
    }
    int r = lb_op1(b, "Clip", x, stem);
    lb_attr_float(b, "min", lo);
    lb_attr_float(b, "max", hi);
    return r;
}

/* x / sqrt(sum(x^2, -1) + 1e-12)  (Keras l2_normalize; the epsilon added rather than max'ed: identical within
 * float rounding whenever sum(x^2) >> 1e-12, and 0 for a zero vector in both forms). */
static int lb_l2_normalize(lb *b, int x, const char *stem) {
    char s[64];
    snprintf(s, sizeof s, "%s_sq", stem);
    int sq = lb_op2(b, "Mul", x, x, s);
    snprintf(s, sizeof s, "%s_ss", stem);
    int ss = lb_sum_last(b, sq, 1, s);
    snprintf(s, sizeof s, "%s_sse", stem);
    int sse = lb_op2(b, "Add", ss, lb_scalar(b, LOSS_L2_EPS, "l2_eps"), s);
    snprintf(s, sizeof s, "%s_norm", stem);
    int nrm = lb_op1(b, "Sqrt", sse, s);
    return lb_op2(b, "Div", x, nrm, stem);
}

/* ---- checks that run before the graph is modified ---- */

static int softmax_axis_is_last(const eng_graph *g, const eng_node *n, int rank) {
    int64_t dflt = g->opset >= 13 ? -1 : 1;
    int64_t axis = eng_node_attr_int(n, "axis", dflt);
    if (rank < 0) return axis == -1 && g->opset >= 13;
    if (axis < 0) axis += rank;
    if (axis != rank - 1) return 0;
    /* before opset 13 Softmax flattens to 2-D at `axis`: a last-axis softmax only for axis == rank-1 */
    return 1;
}

/* The value whose producer is `op` on the last axis: the producer's input, else -1. */
static int producer_input(const eng_graph *g, int v, const char *op, int rank) {
    int p = g->values[v].producer;
    if (p < 0) return -1;
    const eng_node *n = &g->nodes[p];
    if (strcmp(n->op_type, op) != 0 || (n->domain && n->domain[0]) || n->nin < 1 || n->inputs[0] < 0) return -1;
    if ((!strcmp(op, "Softmax") || !strcmp(op, "LogSoftmax")) && !softmax_axis_is_last(g, n, rank)) return -1;
    return n->inputs[0];
}

static eng_status add_label(eng_graph *g, int pred, eng_loss_kind kind, int *out) {
    int v = eng_graph_add_value(g, "label");
    if (v < 0) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "loss: label value");
    eng_value *lv = &g->values[v];
    const eng_value *pv = &g->values[pred]; /* after the add: values may have moved */
    lv->dtype = kind == ENG_LOSS_SPARSE_CCE ? ENG_DTYPE_I64 : ENG_DTYPE_F32;
    lv->ndim = pv->ndim < 0 ? -1 : (kind == ENG_LOSS_SPARSE_CCE ? pv->ndim - 1 : pv->ndim);
    for (int d = 0; d < lv->ndim; d++) {
        lv->dims[d] = pv->dims[d];
        if (pv->dim_param[d]) {
            lv->dim_param[d] = strdup(pv->dim_param[d]);
            if (!lv->dim_param[d]) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "loss: label shape");
        }
    }
    int *ni = realloc(g->inputs, (size_t)(g->ninputs + 1) * sizeof *ni);
    if (!ni) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "loss: graph inputs");
    g->inputs = ni;
    g->inputs[g->ninputs++] = v;
    *out = v;
    return ENG_STATUS_OK;
}

static int add_output(eng_graph *g, int v) {
    int *no = realloc(g->outputs, (size_t)(g->noutputs + 1) * sizeof *no);
    if (!no) return 0;
    g->outputs = no;
    g->outputs[g->noutputs++] = v;
    return 1;
}

eng_status eng_loss_append(eng_graph *g, eng_loss_kind kind, const char *pred, int from_logits, const char **loss_name) {
    if (!g || !pred || !loss_name) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "loss: NULL argument");
    if ((int)kind < ENG_LOSS_SPARSE_CCE || (int)kind > ENG_LOSS_COSINE)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "loss: unknown loss kind %d", (int)kind);
    const char *lname = eng_loss_name(kind);
    int pv = eng_graph_find_value(g, pred);
    if (pv < 0) return eng_err(ENG_STATUS_NOT_FOUND, "%s: model has no value '%s' to compute the loss from", lname, pred);
    const eng_value *p = &g->values[pv];
    char sh[128];
    eng_shape_str(p->dims, p->ndim < 0 ? 0 : p->ndim, sh, sizeof sh);
    if (p->ndim < 0) snprintf(sh, sizeof sh, "(unknown rank)");
    if (p->dtype != ENG_DTYPE_UNDEFINED && p->dtype != ENG_DTYPE_F32)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: output '%s' has dtype %s, expected float32", lname, pred,
                       eng_dtype_name(p->dtype));
    int classify = kind == ENG_LOSS_SPARSE_CCE || kind == ENG_LOSS_CCE;
    if (classify && p->ndim >= 0 && p->ndim < 2)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT,
                       "%s: output '%s' has shape %s; expected [N, C] (rank >= 2, classes on the last axis)", lname,
                       pred, sh);
    if ((kind == ENG_LOSS_BCE || kind == ENG_LOSS_MSE || kind == ENG_LOSS_COSINE) && p->ndim == 0)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: output '%s' is a scalar; expected a batch [N, ...]", lname, pred);
    if (kind == ENG_LOSS_COSINE && p->ndim >= 0 && p->ndim < 2)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: output '%s' has shape %s; expected [N, D] (rank >= 2)", lname,
                       pred, sh);
    if (eng_graph_find_value(g, "label") >= 0)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: the model already has a value named 'label'", lname);
    if (eng_graph_find_value(g, "metric/accuracy") >= 0)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: the model already has a value named 'metric/accuracy'", lname);
    if (from_logits < -1 || from_logits > 1)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: from_logits is %d; expected -1 (auto), 0 or 1", lname, from_logits);

    /* Resolve what the loss reads: logits (stable forms) or probabilities (clipped). */
    int rank = p->ndim;
    int logits = -1, probs = -1; /* value indices */
    if (from_logits == 1) {
        logits = pv;
    } else if (from_logits == 0 || kind == ENG_LOSS_MSE || kind == ENG_LOSS_COSINE) {
        probs = pv;
    } else if (classify) {
        int in = producer_input(g, pv, "Softmax", rank);
        if (in < 0) in = producer_input(g, pv, "LogSoftmax", rank);
        if (in >= 0) logits = in;
        else probs = pv;
    } else { /* BCE */
        int in = producer_input(g, pv, "Sigmoid", rank);
        if (in >= 0) logits = in;
        else probs = pv;
    }

    int label = -1;
    ENG_TRY(add_label(g, pv, kind, &label));
    lb b = {.g = g, .ok = 1};
    int loss = -1, acc = -1;
    switch (kind) {
    case ENG_LOSS_SPARSE_CCE: {
        int x = logits >= 0 ? logits : probs, t = label;
        if (rank > 2) { /* [N, T.., C] -> [N*T.., C]; label [N, T..] -> [N*T..] */
            x = lb_op1(&b, "Flatten", x, "flat_pred");
            lb_attr_int(&b, "axis", rank - 1);
            static const int64_t m1[1] = {-1};
            t = lb_op2(&b, "Reshape", label, lb_ints(&b, m1, 1, "flat_shape"), "flat_label");
        }
        if (logits >= 0) {
            loss = lb_op2(&b, "SoftmaxCrossEntropyLoss", x, t, "sce");
        } else {
            int c = lb_clip(&b, x, LOSS_EPS, 1.0f - LOSS_EPS, "clipped");
            int lp = lb_op1(&b, "Log", c, "log_prob");
            loss = lb_op2(&b, "NegativeLogLikelihoodLoss", lp, t, "nll");
        }
        lb_attr_str(&b, "reduction", "mean");
        int am = lb_op1(&b, "ArgMax", pv, "argmax");
        lb_attr_int(&b, "axis", -1);
        lb_attr_int(&b, "keepdims", 0);
        int eq = lb_op2(&b, "Equal", am, label, "correct");
        acc = lb_op1(&b, "Cast", eq, "correct_f");
        lb_attr_int(&b, "to", ENG_DTYPE_F32);
        break;
    }
    case ENG_LOSS_CCE: {
        int lp;
        if (logits >= 0) {
            lp = lb_op1(&b, "LogSoftmax", logits, "log_prob");
            lb_attr_int(&b, "axis", -1);
        } else {
            lp = lb_op1(&b, "Log", lb_clip(&b, probs, LOSS_EPS, 1.0f - LOSS_EPS, "clipped"), "log_prob");
        }
        int s = lb_sum_last(&b, lb_op2(&b, "Mul", label, lp, "label_log_prob"), 0, "sum_label_log_prob");
        loss = lb_op1(&b, "Neg", lb_mean_all(&b, s, "mean"), "neg_mean");
        int am = lb_op1(&b, "ArgMax", pv, "argmax");
        lb_attr_int(&b, "axis", -1);
        lb_attr_int(&b, "keepdims", 0);
        int al = lb_op1(&b, "ArgMax", label, "argmax_label");
        lb_attr_int(&b, "axis", -1);
        lb_attr_int(&b, "keepdims", 0);
        acc = lb_op1(&b, "Cast", lb_op2(&b, "Equal", am, al, "correct"), "correct_f");
        lb_attr_int(&b, "to", ENG_DTYPE_F32);
        break;
    }
    case ENG_LOSS_BCE: {
        int one = lb_scalar(&b, 1.0f, "one");
        int e;
        float thr;
        if (logits >= 0) { /* max(z,0) - z*y + log(1 + exp(-|z|)) */
            int z = logits;
            int r = lb_op1(&b, "Relu", z, "relu_z");
            int zy = lb_op2(&b, "Mul", z, label, "z_y");
            int nabs = lb_op1(&b, "Neg", lb_op1(&b, "Abs", z, "abs_z"), "neg_abs_z");
            int sp = lb_op1(&b, "Log", lb_op2(&b, "Add", lb_op1(&b, "Exp", nabs, "exp"), one, "one_plus_exp"), "log1p_exp");
            e = lb_op2(&b, "Add", lb_op2(&b, "Sub", r, zy, "relu_minus_zy"), sp, "bce");
            loss = lb_mean_all(&b, e, "mean");
            thr = (pv == logits) ? 0.0f : 0.5f; /* threshold on what pred holds */
        } else { /* -(y log p + (1-y) log(1-p)), p clipped */
            int c = lb_clip(&b, probs, LOSS_EPS, 1.0f - LOSS_EPS, "clipped");
            int a1 = lb_op2(&b, "Mul", label, lb_op1(&b, "Log", c, "log_p"), "y_log_p");
            int omy = lb_op2(&b, "Sub", one, label, "one_minus_y");
            int l1p = lb_op1(&b, "Log", lb_op2(&b, "Sub", one, c, "one_minus_p"), "log_1mp");
            e = lb_op2(&b, "Add", a1, lb_op2(&b, "Mul", omy, l1p, "y1_log_1mp"), "ll");
            loss = lb_op1(&b, "Neg", lb_mean_all(&b, e, "mean"), "neg_mean");
            thr = 0.5f;
        }
        int gt = lb_op2(&b, "Greater", pv, lb_scalar(&b, thr, "threshold"), "pred_pos");
        int gtf = lb_op1(&b, "Cast", gt, "pred_pos_f");
        lb_attr_int(&b, "to", ENG_DTYPE_F32);
        acc = lb_op1(&b, "Cast", lb_op2(&b, "Equal", gtf, label, "correct"), "correct_f");
        lb_attr_int(&b, "to", ENG_DTYPE_F32);
        break;
    }
    case ENG_LOSS_MSE: {
        int d = lb_op2(&b, "Sub", probs, label, "diff");
        loss = lb_mean_all(&b, lb_op2(&b, "Mul", d, d, "sq"), "mean");
        break;
    }
    case ENG_LOSS_COSINE: {
        int yn = lb_l2_normalize(&b, label, "label_l2n");
        int pn = lb_l2_normalize(&b, probs, "pred_l2n");
        int s = lb_sum_last(&b, lb_op2(&b, "Mul", yn, pn, "cos_prod"), 0, "cos");
        loss = lb_op1(&b, "Neg", lb_mean_all(&b, s, "mean"), "neg_mean");
        break;
    }
    }
    if (!b.ok || loss < 0) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: building the loss nodes", lname);

    /* Rename the final loss value to "loss" (or keep "loss/..." if the model has a "loss") */
    if (eng_graph_find_value(g, "loss") < 0) {
        char *nm = strdup("loss");
        if (!nm) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: loss name", lname);
        free(g->values[loss].name);
        g->values[loss].name = nm;
    }
    if (!add_output(g, loss)) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: graph outputs", lname);
    if (acc >= 0) {
        int m = lb_mean_all(&b, acc, "accuracy");
        if (!b.ok) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: accuracy metric", lname);
        char *nm = strdup("metric/accuracy");
        if (!nm) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: metric name", lname);
        free(g->values[m].name);
        g->values[m].name = nm;
        if (!add_output(g, m)) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: graph outputs", lname);
    }
    *loss_name = g->values[loss].name;
    return ENG_STATUS_OK;
}
