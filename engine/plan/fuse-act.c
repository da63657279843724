/* fuse-act.c - recognise an activation that an exporter wrote as a chain of elementwise ops, so that it fuses
 * into the conv or matmul before it as a post-op: x * sigmoid(x) (SiLU/Swish), Gelu's erf form
 * x * 0.5 * (1 + erf(x / sqrt(2))) and tanh form 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))) in any
 * operand order, x * hardsigmoid(x) and x * relu6(x + 3) / 6 (HardSwish).
 *
 * How: from x, collect the elementwise nodes (unary ops, and binary ops whose other operand is a scalar
 * constant or another chain value) that its consumers reach; every chain that ends in one node and uses no value
 * from outside (bar scalars) is a function f of x alone. Evaluate f in double on probe points over [-7, 7] and
 * compare it with each known activation; a match within 2e-5 (scaled by |act(x)| above 1) is that activation.
 * Numerical identification covers every algebraic spelling at once; a chain that computes anything else (an
 * extra scale, a different constant) matches nothing and stays as it is.
 * Invariants: the graph is not changed here; the chain's intermediate values, x included, are used only inside
 * the chain, so removing it loses nothing.
 */
#include <math.h>
#include <string.h>

#include "fuse-impl.h"

#define ACT_MAX_NODES 16
#define ACT_NPROBE 64

enum {
    EW_ADD, EW_SUB, EW_MUL, EW_DIV, EW_POW, EW_MIN, EW_MAX, /* binary */
    EW_TANH, EW_ERF, EW_SIGMOID, EW_HSIG, EW_RELU, EW_CLIP, EW_EXP, EW_LOG, EW_NEG, EW_SQRT, EW_SOFTPLUS,
    EW_RECIP, EW_ABS, EW_HSWISH, EW_NONE
};

static int act_ew_kind(const eng_node *n) {
    static const char *const names[] = {"Add", "Sub", "Mul", "Div", "Pow", "Min", "Max", "Tanh", "Erf", "Sigmoid",
                                        "HardSigmoid", "Relu", "Clip", "Exp", "Log", "Neg", "Sqrt", "Softplus",
                                        "Reciprocal", "Abs", "HardSwish"};
    if (n->domain[0] || !fz_one_output(n)) return EW_NONE;
    for (int i = 0; i < EW_NONE; i++)
        if (!strcmp(n->op_type, names[i])) return i;
    return EW_NONE;
}

/* A float scalar constant: a one-element float initializer (eng_graph_fuse has made Constant nodes
 * initializers before any rule runs). */
static int act_scalar(const eng_graph *g, int v, double *out) {
    if (v < 0) return 0;
    const eng_tensor *t = fz_const_f32(g, v);
    if (!t || eng_tensor_numel(t) != 1) return 0;
    *out = ((const float *)t->data)[0];
    return 1;
}

static double act_sigmoid(double v) { return 1.0 / (1.0 + exp(-v)); }

static double act_reference(int kind, double v) {
    switch (kind) {
    case KRN_NN_ACT_GELU_ERF: return 0.5 * v * (1.0 + erf(v * 0.70710678118654752440));
    case KRN_NN_ACT_GELU_TANH: return 0.5 * v * (1.0 + tanh(0.79788456080286535588 * (v + 0.044715 * v * v * v)));
    case KRN_NN_ACT_SWISH: return v * act_sigmoid(v);
    case KRN_NN_ACT_HARD_SWISH: return v * fmin(fmax(v + 3.0, 0.0), 6.0) / 6.0;
    default: return NAN;
    }
}

typedef struct act_chain {
    const fz_ctx *z;
    int x;
    int node[ACT_MAX_NODES]; /* graph order */
    int n;
    int valid[ACT_MAX_NODES];
} act_chain;

static int act_pos(const act_chain *c, int v) {
    if (v < 0) return -1;
    for (int i = 0; i < c->n; i++)
        if (c->z->g->nodes[c->node[i]].outputs[0] == v) return i;
    return -1;
}

/* Value of node i of the chain at probe point xv; vals holds the earlier nodes' values. */
static double act_eval_node(const act_chain *c, int i, double xv, const double *vals) {
    const eng_graph *g = c->z->g;
    const eng_node *n = &g->nodes[c->node[i]];
    double in[3] = {0, 0, 0};
    for (int k = 0; k < n->nin && k < 3; k++) {
        int v = n->inputs[k], p;
        if (v < 0) in[k] = NAN;
        else if (v == c->x) in[k] = xv;
        else if ((p = act_pos(c, v)) >= 0) in[k] = vals[p];
        else if (!act_scalar(g, v, &in[k])) return NAN;
    }
    double a = in[0], b = in[1];
    switch (act_ew_kind(n)) {
    case EW_ADD: return a + b;
    case EW_SUB: return a - b;
    case EW_MUL: return a * b;
    case EW_DIV: return a / b;
    case EW_POW: return pow(a, b);
    case EW_MIN: return fmin(a, b);
    case EW_MAX: return fmax(a, b);
    case EW_TANH: return tanh(a);
    case EW_ERF: return erf(a);
    case EW_SIGMOID: return act_sigmoid(a);
    case EW_HSIG:
        return fmin(fmax(eng_node_attr_float(n, "alpha", 0.2f) * a + eng_node_attr_float(n, "beta", 0.5f), 0.0), 1.0);
    case EW_RELU: return a > 0 ? a : 0;
    case EW_CLIP: {
        double lo = n->nin > 1 && n->inputs[1] >= 0 ? in[1] : -INFINITY;
        double hi = n->nin > 2 && n->inputs[2] >= 0 ? in[2] : INFINITY;
        if (g->opset < 11) lo = eng_node_attr_float(n, "min", -INFINITY), hi = eng_node_attr_float(n, "max", INFINITY);
        return fmin(fmax(a, lo), hi);
    }
    case EW_EXP: return exp(a);
    case EW_LOG: return log(a);
    case EW_NEG: return -a;
    case EW_SQRT: return sqrt(a);
    case EW_SOFTPLUS: return log1p(exp(a));
    case EW_RECIP: return 1.0 / a;
    case EW_ABS: return fabs(a);
    case EW_HSWISH: return a * fmin(fmax(a + 3.0, 0.0), 6.0) / 6.0;
    default: return NAN;
    }
}

/* Occurrences of value v among the inputs of the chain nodes selected by in[]. */
static int act_reads(const act_chain *c, const unsigned char *in, int v) {
    int k = 0;
    for (int i = 0; i < c->n; i++) {
        if (!in[i]) continue;
        const eng_node *n = &c->z->g->nodes[c->node[i]];
        for (int j = 0; j < n->nin; j++) k += n->inputs[j] == v;
    }
    return k;
}

/* The chain ending at node e: its ancestors within the chain. 0 if it reads a value from outside (bar x and
 * scalars) or any of its values, x included, is used outside it. */
static int act_select(const act_chain *c, int e, unsigned char *in) {
    const eng_graph *g = c->z->g;
    memset(in, 0, ACT_MAX_NODES);
    in[e] = 1;
    for (int i = e; i >= 0; i--) {
        if (!in[i]) continue;
        if (!c->valid[i]) return 0;
        const eng_node *n = &g->nodes[c->node[i]];
        for (int k = 0; k < n->nin; k++) {
            int p = act_pos(c, n->inputs[k]);
            if (p >= 0) in[p] = 1;
        }
    }
    int count = 0;
    for (int i = 0; i <= e; i++) {
        if (!in[i]) continue;
        count++;
        if (i != e) {
            int v = g->nodes[c->node[i]].outputs[0];
            if (fz_uses(c->z, v) != act_reads(c, in, v)) return 0;
        }
    }
    return count >= 2 && fz_uses(c->z, c->x) == act_reads(c, in, c->x);
}

int fz_match_act_chain(const fz_ctx *z, int x, krn_nn_act_params *act, int *nodes, int *nn, int cap) {
    const eng_graph *g = z->g;
    act_chain c = {.z = z, .x = x};
    /* 1. elementwise nodes reachable from x, in graph (topological) order */
    int vals[ACT_MAX_NODES + 1], nv = 0;
    vals[nv++] = x;
    for (int q = 0; q < nv && c.n < ACT_MAX_NODES; q++)
        for (int i = 0; i < g->nnodes && c.n < ACT_MAX_NODES; i++) {
            const eng_node *n = &g->nodes[i];
            if (z->dead[i] || act_ew_kind(n) == EW_NONE) continue;
            int reads = 0, dup = 0;
            for (int k = 0; k < n->nin; k++) reads |= n->inputs[k] == vals[q];
            for (int k = 0; k < c.n; k++) dup |= c.node[k] == i;
            if (!reads || dup) continue;
            c.node[c.n++] = i;
            vals[nv++] = n->outputs[0];
        }
    for (int i = 1; i < c.n; i++) /* insertion sort by node index */
        for (int j = i; j > 0 && c.node[j] < c.node[j - 1]; j--) {
            int t = c.node[j];
            c.node[j] = c.node[j - 1];
            c.node[j - 1] = t;
        }
    /* 2. nodes computable from x, scalars and earlier chain nodes */
    for (int i = 0; i < c.n; i++) {
        const eng_node *n = &g->nodes[c.node[i]];
        c.valid[i] = 1;
        for (int k = 0; k < n->nin && c.valid[i]; k++) {
            int v = n->inputs[k], p = act_pos(&c, v);
            double s;
            if (v < 0 || v == x || (p >= 0 && p < i && c.valid[p]) || act_scalar(g, v, &s)) continue;
            c.valid[i] = 0;
        }
    }
    /* 3. the longest self-contained chain that computes a known activation */
    static const int kinds[] = {KRN_NN_ACT_GELU_ERF, KRN_NN_ACT_GELU_TANH, KRN_NN_ACT_SWISH, KRN_NN_ACT_HARD_SWISH};
    for (int e = c.n - 1; e >= 0; e--) {
        unsigned char in[ACT_MAX_NODES];
        if (!act_select(&c, e, in)) continue;
        double f[ACT_NPROBE];
        for (int p = 0; p < ACT_NPROBE; p++) {
            double xv = -7.0 + 14.0 * p / (ACT_NPROBE - 1), v[ACT_MAX_NODES] = {0};
            for (int i = 0; i <= e; i++)
                if (in[i]) v[i] = act_eval_node(&c, i, xv, v);
            f[p] = v[e];
        }
        for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
            int ok = 1;
            for (int p = 0; p < ACT_NPROBE && ok; p++) {
                double xv = -7.0 + 14.0 * p / (ACT_NPROBE - 1), r = act_reference(kinds[k], xv);
                ok = isfinite(f[p]) && fabs(f[p] - r) <= 2e-5 * fmax(1.0, fabs(r));
            }
            if (!ok) continue;
            int m = 0;
            for (int i = 0; i <= e; i++)
                if (in[i]) {
                    if (m >= cap) return -1;
                    nodes[m++] = c.node[i];
                }
            *nn = m;
            memset(act, 0, sizeof *act);
            act->kind = kinds[k];
            act->alpha = 1.f;
            return c.node[e];
        }
    }
    return -1;
}
