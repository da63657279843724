/* fuse.c - graph rewrites run once per loaded model before planning (see fuse.h).
 *
 * Rules (all float32 weights; every intermediate value must have exactly one consumer, not be a graph output
 * and not be referenced by name from a subgraph):
 *   Conv(W const) -> BatchNormalization(const params)   => Conv with folded W', B'
 *   Conv -> Add(per-channel/scalar constant)            => Conv with the constant folded into B
 *   Conv -> Add(other tensor)                           => FusedConv(X, W, B, Z)   (residual, oneDNN binary post-op)
 *   Conv/FusedConv -> activation                        => FusedConv(act)          (Relu, LeakyRelu, Clip, Sigmoid,
 *                                                          Tanh, HardSigmoid, HardSwish, Elu, Gelu)
 *   MatMul(B const 2-D) -> Add(bias const, N elements)  => FusedMatMul(A, B, bias)
 *   MatMul(B const) / FusedMatMul / Gemm -> activation  => FusedMatMul / FusedGemm(act)
 *   activations written as elementwise chains (SiLU x*sigmoid(x), Gelu's erf and tanh forms, HardSwish), found by
 *   evaluating the chain (fuse-act.c), fuse into convs and matmuls like the single-node ones
 *   Constant nodes -> initializers; Identity / inference Dropout / all-zero Pad -> bypassed (fz_hoist_constants)
 *   BatchNormalization over a 4-D input that no conv absorbed    => depthwise 1x1 Conv (then fused like any conv)
 *   Conv (blocked output) -> MaxPool (no pads)          => FusedConv pooling in cache-sized sub-batches
 * Then the layout pass (fuse-layout.c) marks which activations are BLOCKED.
 * Fused ops live in domain "com.tensord" (engine/ops/nn.c) and carry attrs act/act_alpha/act_beta.
 * Invariants: node names, graph inputs and outputs are untouched; the fused node takes the position of the LAST
 * node of its pattern (so every input it reads, e.g. a residual branch, is produced before it); removed nodes are
 * compacted out of g->nodes and every value's producer index is recomputed. Values orphaned by a rewrite stay in
 * g->values (no node produces or consumes them). Folded weights are written in place when the initializer has
 * no other user and is not a graph input; otherwise a new initializer is added.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/krn-nn.h"
#include "fuse.h"

#include "fuse-impl.h"

static char *fz_strdup(const char *s) {
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n + 1);
    return d;
}

static int fz_subgraph_uses(const eng_graph *sg, const char *name) {
    for (int i = 0; i < sg->nnodes; i++) {
        const eng_node *n = &sg->nodes[i];
        for (int j = 0; j < n->nin; j++)
            if (n->inputs[j] >= 0 && !strcmp(sg->values[n->inputs[j]].name, name)) return 1;
        for (int a = 0; a < n->nattr; a++)
            if (n->attrs[a].g && fz_subgraph_uses(n->attrs[a].g, name)) return 1;
    }
    for (int i = 0; i < sg->noutputs; i++)
        if (!strcmp(sg->values[sg->outputs[i]].name, name)) return 1;
    return 0;
}

/* Number of uses of value v: node inputs (live nodes), graph outputs, and subgraph references (each counts 1). */
int fz_uses(const fz_ctx *z, int v) {
    const eng_graph *g = z->g;
    int n = 0;
    for (int i = 0; i < g->nnodes; i++) {
        if (z->dead[i]) continue;
        const eng_node *nd = &g->nodes[i];
        for (int j = 0; j < nd->nin; j++) n += nd->inputs[j] == v;
        for (int a = 0; a < nd->nattr; a++)
            if (nd->attrs[a].g && fz_subgraph_uses(nd->attrs[a].g, g->values[v].name)) n++;
    }
    for (int i = 0; i < g->noutputs; i++) n += g->outputs[i] == v;
    return n;
}

/* The single live consumer node of v (and v must be used exactly once), else -1. */
int fz_sole_consumer(const fz_ctx *z, int v) {
    if (v < 0 || fz_uses(z, v) != 1) return -1;
    for (int i = 0; i < z->g->nnodes; i++) {
        if (z->dead[i]) continue;
        const eng_node *nd = &z->g->nodes[i];
        for (int j = 0; j < nd->nin; j++)
            if (nd->inputs[j] == v) return i;
    }
    return -1;
}

int fz_is_graph_input(const eng_graph *g, int v) {
    for (int i = 0; i < g->ninputs; i++)
        if (g->inputs[i] == v) return 1;
    return 0;
}

/* Constant float32 initializer (not overridable by the caller)? */
const eng_tensor *fz_const_f32(const eng_graph *g, int v) {
    if (v < 0 || !g->values[v].init || fz_is_graph_input(g, v)) return NULL;
    const eng_tensor *t = g->values[v].init;
    return t->dtype == ENG_DTYPE_F32 && t->data ? t : NULL;
}

int fz_is_op(const eng_node *n, const char *op) { return !strcmp(n->op_type, op) && !n->domain[0]; }

/* Node has exactly one real output (others omitted). */
int fz_one_output(const eng_node *n) {
    for (int i = 1; i < n->nout; i++)
        if (n->outputs[i] >= 0) return 0;
    return n->nout >= 1 && n->outputs[0] >= 0;
}

/* Take t (eng_alloc'd float32 data) as the initializer of a new value named <base><suffix><k> (the first k that
 * is free); returns its index with *data = t's data, or -1 (t freed) when out of memory. */
static int fz_add_init(fz_ctx *z, const char *base, const char *suffix, eng_tensor *t, float **data) {
    eng_graph *g = z->g;
    char name[512];
    int k = 0;
    do snprintf(name, sizeof name, "%s%s%d", base, suffix, k++);
    while (eng_graph_find_value(g, name) >= 0 && k < 100);
    int nv = eng_graph_add_value(g, name);
    if (nv < 0) {
        eng_tensor_destroy(&t);
        return -1;
    }
    eng_value_set_init(g, nv, t);
    g->values[nv].dtype = t->dtype;
    g->values[nv].ndim = t->ndim;
    memcpy(g->values[nv].dims, t->dims, sizeof t->dims);
    *data = t->data;
    return nv;
}

/* A float32 initializer we may overwrite: in place when only `node` uses it, else a fresh copy. Returns the value
 * index holding writable data (*data), or -1 on allocation failure. */
static int fz_writable_init(fz_ctx *z, int v, const char *suffix, float **data) {
    eng_graph *g = z->g;
    if (fz_uses(z, v) == 1 && !fz_is_graph_input(g, v)) {
        *data = g->values[v].init->data;
        return v;
    }
    eng_tensor *t = eng_tensor_clone(g->values[v].init);
    return t ? fz_add_init(z, g->values[v].name, suffix, t, data) : -1;
}

/* A new zeroed float32 initializer named <base><suffix><k>; returns its value index, -1 when out of memory. */
static int fz_new_init(fz_ctx *z, const char *base, const char *suffix, int ndim, const int64_t *dims, float **data) {
    eng_tensor *t = calloc(1, sizeof *t);
    if (!t) return -1;
    t->dtype = ENG_DTYPE_F32;
    t->ndim = ndim;
    memcpy(t->dims, dims, (size_t)ndim * sizeof *dims);
    int64_t m = eng_tensor_numel(t);
    t->data = eng_alloc((size_t)(m ? m : 1) * sizeof(float));
    if (!t->data) {
        free(t);
        return -1;
    }
    memset(t->data, 0, (size_t)m * sizeof(float));
    return fz_add_init(z, base, suffix, t, data);
}

/* A new zero float32 bias [m] for a Conv without one. */
static int fz_new_bias(fz_ctx *z, const char *base, int64_t m, float **data) {
    return fz_new_init(z, base, "_fused_bias", 1, &m, data);
}

/* Make sure node n has input slot idx (filling with -1). */
eng_status fz_ensure_inputs(eng_node *n, int count) {
    if (n->nin >= count) return ENG_STATUS_OK;
    int *in = realloc(n->inputs, (size_t)count * sizeof(int));
    if (!in) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "fusing node '%s'", n->name);
    for (int i = n->nin; i < count; i++) in[i] = -1;
    n->inputs = in;
    n->nin = count;
    return ENG_STATUS_OK;
}

eng_status fz_set_op(eng_node *n, const char *op, const char *domain) {
    char *o = fz_strdup(op), *d = fz_strdup(domain);
    if (!o || !d) {
        free(o);
        free(d);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "fusing node '%s'", n->name);
    }
    free(n->op_type);
    free(n->domain);
    n->op_type = o;
    n->domain = d;
    return ENG_STATUS_OK;
}

eng_status fz_add_attr_int(eng_graph *g, int node, const char *name, int64_t v) {
    eng_attr a = {0};
    a.name = (char *)name;
    a.type = ENG_ATTR_INT;
    a.i = v;
    return eng_node_add_attr(g, node, &a);
}

eng_status fz_add_attr_float(eng_graph *g, int node, const char *name, float v) {
    eng_attr a = {0};
    a.name = (char *)name;
    a.type = ENG_ATTR_FLOAT;
    a.f = v;
    return eng_node_add_attr(g, node, &a);
}

/* Move node `from` into slot `to` (whose node is dead and released), leaving `from` dead and empty. */
static void fz_move_node(fz_ctx *z, int from, int to) {
    if (from == to) return;
    eng_node_release(&z->g->nodes[to]);
    z->g->nodes[to] = z->g->nodes[from];
    memset(&z->g->nodes[from], 0, sizeof z->g->nodes[from]);
    z->dead[to] = 0;
    z->dead[from] = 1;
}

/* Activation node -> krn params; returns 1 when `n` is a supported activation with constant attributes. */
static int fz_activation(const eng_graph *g, const eng_node *n, krn_nn_act_params *a) {
    a->alpha = a->beta = 0.f;
    if (!strcmp(n->domain, "com.tensord") && !strcmp(n->op_type, "Silu") && fz_one_output(n) && n->nin == 1) {
        a->kind = KRN_NN_ACT_SWISH, a->alpha = 1.f; /* a training graph's SiLU (fz_chain_to_act_op) */
        return 1;
    }
    if (n->domain[0] || !fz_one_output(n) || n->nin < 1) return 0;
    if (!strcmp(n->op_type, "Relu")) a->kind = KRN_NN_ACT_RELU;
    else if (!strcmp(n->op_type, "LeakyRelu")) a->kind = KRN_NN_ACT_RELU, a->alpha = eng_node_attr_float(n, "alpha", 0.01f);
    else if (!strcmp(n->op_type, "Sigmoid")) a->kind = KRN_NN_ACT_SIGMOID;
    else if (!strcmp(n->op_type, "Tanh")) a->kind = KRN_NN_ACT_TANH;
    else if (!strcmp(n->op_type, "Elu")) a->kind = KRN_NN_ACT_ELU, a->alpha = eng_node_attr_float(n, "alpha", 1.f);
    else if (!strcmp(n->op_type, "HardSigmoid")) {
        a->kind = KRN_NN_ACT_HARD_SIGMOID;
        a->alpha = eng_node_attr_float(n, "alpha", 0.2f);
        a->beta = eng_node_attr_float(n, "beta", 0.5f);
    } else if (!strcmp(n->op_type, "HardSwish")) a->kind = KRN_NN_ACT_HARD_SWISH;
    else if (!strcmp(n->op_type, "Gelu")) {
        const char *ap = eng_node_attr_str(n, "approximate", "none");
        a->kind = !strcmp(ap, "tanh") ? KRN_NN_ACT_GELU_TANH : KRN_NN_ACT_GELU_ERF;
    } else if (!strcmp(n->op_type, "Clip")) {
        a->kind = KRN_NN_ACT_CLIP;
        a->alpha = -INFINITY;
        a->beta = INFINITY;
        if (g->opset < 11) {
            a->alpha = eng_node_attr_float(n, "min", -INFINITY);
            a->beta = eng_node_attr_float(n, "max", INFINITY);
        } else {
            for (int i = 1; i < n->nin && i < 3; i++) {
                if (n->inputs[i] < 0) continue;
                const eng_tensor *t = fz_const_f32(g, n->inputs[i]);
                if (!t || eng_tensor_numel(t) != 1) return 0;
                float v = ((const float *)t->data)[0];
                if (i == 1) a->alpha = v;
                else a->beta = v;
            }
        }
    } else return 0;
    return 1;
}

static eng_status fz_set_act_attrs(fz_ctx *z, int node, const krn_nn_act_params *a) {
    ENG_TRY(fz_add_attr_int(z->g, node, "act", a->kind));
    ENG_TRY(fz_add_attr_float(z->g, node, "act_alpha", a->alpha));
    return fz_add_attr_float(z->g, node, "act_beta", a->beta);
}

/* ------------------------------------------------------------ Conv */

/* The activation that follows node *ni (its output's sole consumer, or an elementwise chain fuse-act.c
 * recognises): node *ni takes over the activation's output, the activation's nodes die, and *ni becomes the
 * index where the node now sits; *act gets the activation. 0 (nothing changed) when there is none. */
static int fz_absorb_act(fz_ctx *z, int *ni, krn_nn_act_params *act) {
    eng_graph *g = z->g;
    int y = g->nodes[*ni].outputs[0], c = fz_sole_consumer(z, y), pat[16], np = 0, fin;
    if (c >= 0 && fz_activation(g, &g->nodes[c], act) && g->nodes[c].inputs[0] == y) {
        g->nodes[*ni].outputs[0] = g->nodes[c].outputs[0];
        z->dead[c] = 1;
        fz_move_node(z, *ni, c);
        *ni = c;
        return 1;
    }
    if ((fin = fz_match_act_chain(z, y, act, pat, &np, 16)) >= 0) {
        g->nodes[*ni].outputs[0] = g->nodes[fin].outputs[0];
        for (int i = 0; i < np; i++) z->dead[pat[i]] = 1;
        fz_move_node(z, *ni, fin);
        *ni = fin;
        return 1;
    }
    return 0;
}

static eng_status fz_fold_bn(fz_ctx *z, int ci, int bi) {
    eng_graph *g = z->g;
    eng_node *conv = &g->nodes[ci], *bn = &g->nodes[bi];
    const eng_tensor *w = fz_const_f32(g, conv->inputs[1]);
    if (!w || bn->nin < 5 || bn->inputs[0] != conv->outputs[0] || !fz_one_output(bn)) return ENG_STATUS_OK;
    if (eng_node_attr_int(bn, "training_mode", 0) != 0 || eng_node_attr_int(bn, "spatial", 1) != 1) return ENG_STATUS_OK;
    int64_t m = w->dims[0];
    const eng_tensor *prm[4];
    for (int i = 0; i < 4; i++) {
        prm[i] = fz_const_f32(g, bn->inputs[1 + i]);
        if (!prm[i] || eng_tensor_numel(prm[i]) != m) return ENG_STATUS_OK;
    }
    const eng_tensor *b = NULL;
    if (conv->nin > 2 && conv->inputs[2] >= 0) {
        b = fz_const_f32(g, conv->inputs[2]);
        if (!b || eng_tensor_numel(b) != m) return ENG_STATUS_OK;
    }
    double eps = eng_node_attr_float(bn, "epsilon", 1e-5f);
    float *wd, *bd;
    int wv = fz_writable_init(z, conv->inputs[1], "_bnfold", &wd);
    if (wv < 0) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "folding BatchNormalization into '%s'", conv->name);
    int bv = b ? fz_writable_init(z, conv->inputs[2], "_bnfold", &bd) : fz_new_bias(z, conv->name, m, &bd);
    if (bv < 0) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "folding BatchNormalization into '%s'", conv->name);
    conv = &g->nodes[ci]; /* arrays may have moved */
    bn = &g->nodes[bi];
    const float *sc = prm[0]->data, *sh = prm[1]->data, *mu = prm[2]->data, *var = prm[3]->data;
    int64_t per = eng_tensor_numel(w) / (m ? m : 1);
    for (int64_t o = 0; o < m; o++) {
        double f = sc[o] / sqrt((double)var[o] + eps);
        for (int64_t i = 0; i < per; i++) wd[o * per + i] = (float)(wd[o * per + i] * f);
        bd[o] = (float)((bd[o] - mu[o]) * f + sh[o]);
    }
    ENG_TRY(fz_ensure_inputs(conv, 3));
    conv->inputs[1] = wv;
    conv->inputs[2] = bv;
    conv->outputs[0] = bn->outputs[0];
    z->dead[bi] = 1;
    fz_move_node(z, ci, bi);
    z->changed = 1;
    return ENG_STATUS_OK;
}

/* Add(y, const) where const broadcasts per output channel (or is a scalar): fold into the bias. */
static int fz_fold_add_const(fz_ctx *z, int ci, int ai, int other) {
    eng_graph *g = z->g;
    eng_node *conv = &g->nodes[ci];
    const eng_tensor *w = fz_const_f32(g, conv->inputs[1]);
    const eng_tensor *t = fz_const_f32(g, other);
    if (!w || !t) return 0;
    int64_t m = w->dims[0], yr = w->ndim, n = eng_tensor_numel(t);
    if (t->ndim > yr) return 0;
    if (n != 1) {
        if (n != m || t->ndim < yr - 1) return 0;
        for (int i = 0; i < t->ndim; i++) {
            int yd = (int)(yr - t->ndim) + i;
            if (yd == 1 ? t->dims[i] != m : t->dims[i] != 1) return 0;
        }
    }
    const eng_tensor *b = NULL;
    if (conv->nin > 2 && conv->inputs[2] >= 0) {
        b = fz_const_f32(g, conv->inputs[2]);
        if (!b) return 0;
    }
    float *bd;
    int bv = b ? fz_writable_init(z, conv->inputs[2], "_addfold", &bd) : fz_new_bias(z, conv->name, m, &bd);
    if (bv < 0) return -1;
    conv = &g->nodes[ci];
    const float *td = t->data;
    for (int64_t o = 0; o < m; o++) bd[o] += td[n == 1 ? 0 : o];
    if (fz_ensure_inputs(conv, 3) != ENG_STATUS_OK) return -1;
    conv->inputs[2] = bv;
    conv->outputs[0] = g->nodes[ai].outputs[0];
    z->dead[ai] = 1;
    fz_move_node(z, ci, ai);
    z->changed = 1;
    return 1;
}

static eng_status fz_conv(fz_ctx *z, int ci) {
    eng_graph *g = z->g;
    if (!fz_one_output(&g->nodes[ci])) return ENG_STATUS_OK;
    /* 1. BatchNormalization folding (repeatable: Conv -> BN -> BN is legal) */
    for (;;) {
        int c = fz_sole_consumer(z, g->nodes[ci].outputs[0]);
        if (c < 0 || !fz_is_op(&g->nodes[c], "BatchNormalization")) break;
        int before = z->changed;
        z->changed = 0;
        ENG_TRY(fz_fold_bn(z, ci, c));
        if (!z->changed) {
            z->changed = before;
            break;
        }
        ci = c;
    }
    /* 2. Add: constant per-channel -> bias; anything else -> residual */
    int fused = 0;
    krn_nn_act_params act = {0};
    int resid = -1;
    for (;;) {
        int c = fz_sole_consumer(z, g->nodes[ci].outputs[0]);
        if (c < 0) break;
        eng_node *an = &g->nodes[c];
        if (fz_is_op(an, "Add") && an->nin == 2 && fz_one_output(an) && an->inputs[0] != an->inputs[1]) {
            int other = an->inputs[0] == g->nodes[ci].outputs[0] ? an->inputs[1] : an->inputs[0];
            int r = fz_fold_add_const(z, ci, c, other);
            if (r < 0) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "fusing Add into '%s'", g->nodes[ci].name);
            if (r > 0) {
                ci = c;
                continue;
            }
            if (resid >= 0 || g->values[other].init) break;
            const eng_tensor *w = g->values[g->nodes[ci].inputs[1]].init;
            if (w && g->values[other].ndim > w->ndim) break;
            resid = other;
            g->nodes[ci].outputs[0] = an->outputs[0];
            z->dead[c] = 1;
            fz_move_node(z, ci, c);
            ci = c;
            fused = 1;
            continue;
        }
        break;
    }
    /* 3. activation */
    if (fz_absorb_act(z, &ci, &act)) fused = 1;
    if (!fused) return ENG_STATUS_OK;
    eng_node *n = &g->nodes[ci];
    ENG_TRY(fz_set_op(n, "FusedConv", "com.tensord"));
    if (resid >= 0) {
        ENG_TRY(fz_ensure_inputs(n, 4));
        n->inputs[3] = resid;
    }
    ENG_TRY(fz_set_act_attrs(z, ci, &act));
    z->changed = 1;
    return ENG_STATUS_OK;
}

/* ------------------------------------------------------------ MatMul / Gemm */

static eng_status fz_matmul(fz_ctx *z, int mi) {
    eng_graph *g = z->g;
    eng_node *mm = &g->nodes[mi];
    if (!fz_one_output(mm) || mm->nin < 2) return ENG_STATUS_OK;
    int gemm = fz_is_op(mm, "Gemm");
    const eng_tensor *b = fz_const_f32(g, mm->inputs[1]);
    if (!gemm && (!b || b->ndim != 2)) return ENG_STATUS_OK;
    if (gemm) {
        const eng_value *av = &g->values[mm->inputs[0]];
        if (!b && av->dtype != ENG_DTYPE_F32) return ENG_STATUS_OK;
    }
    int fused = 0, bias = -1;
    krn_nn_act_params act = {0};
    if (!gemm) {
        int c = fz_sole_consumer(z, mm->outputs[0]);
        if (c >= 0 && fz_is_op(&g->nodes[c], "Add") && g->nodes[c].nin == 2 && fz_one_output(&g->nodes[c])) {
            eng_node *an = &g->nodes[c];
            int other = an->inputs[0] == mm->outputs[0] ? an->inputs[1] : an->inputs[0];
            const eng_tensor *t = fz_const_f32(g, other);
            int64_t n = b->dims[1];
            int ok = t && eng_tensor_numel(t) == n && t->ndim >= 1 && t->dims[t->ndim - 1] == n;
            if (ok && t->ndim > 1) ok = g->values[mm->inputs[0]].ndim >= t->ndim;
            if (ok) {
                bias = other;
                mm->outputs[0] = an->outputs[0];
                z->dead[c] = 1;
                fz_move_node(z, mi, c);
                mi = c;
                mm = &g->nodes[mi];
                fused = 1;
            }
        }
    }
    if (fz_absorb_act(z, &mi, &act)) fused = 1;
    if (!fused) return ENG_STATUS_OK;
    eng_node *n = &g->nodes[mi];
    ENG_TRY(fz_set_op(n, gemm ? "FusedGemm" : "FusedMatMul", "com.tensord"));
    if (bias >= 0) {
        ENG_TRY(fz_ensure_inputs(n, 3));
        n->inputs[2] = bias;
    }
    ENG_TRY(fz_set_act_attrs(z, mi, &act));
    z->changed = 1;
    return ENG_STATUS_OK;
}

/* com.microsoft MatMulIntegerToFloat (the QDQ fusion's int8 dense layer) -> activation: the activation becomes
 * its last post-op ("act" attrs, as on FusedMatMul), so BERT's GELU after an int8 FFN layer costs no pass. */
static eng_status fz_qmatmul_act(fz_ctx *z, int mi) {
    eng_graph *g = z->g;
    eng_node *mm = &g->nodes[mi];
    if (!fz_one_output(mm) || eng_node_attr_int(mm, "act", KRN_NN_ACT_NONE) != KRN_NN_ACT_NONE) return ENG_STATUS_OK;
    krn_nn_act_params act = {0};
    if (!fz_absorb_act(z, &mi, &act)) return ENG_STATUS_OK;
    ENG_TRY(fz_set_act_attrs(z, mi, &act));
    z->changed = 1;
    return ENG_STATUS_OK;
}

/* ------------------------------------------------------------ driver */

static eng_status fz_compact(fz_ctx *z) {
    eng_graph *g = z->g;
    int k = 0;
    for (int i = 0; i < g->nnodes; i++) {
        if (z->dead[i]) {
            eng_node_release(&g->nodes[i]);
            continue;
        }
        if (k != i) g->nodes[k] = g->nodes[i];
        k++;
    }
    for (int i = k; i < g->nnodes; i++) memset(&g->nodes[i], 0, sizeof g->nodes[i]);
    g->nnodes = k;
    eng_graph_index_producers(g);
    return ENG_STATUS_OK;
}

/* ------------------------------------------------------------ conv + pool */

static eng_attr *fz_attr_mut(eng_node *n, const char *name) {
    for (int i = 0; i < n->nattr; i++)
        if (!strcmp(n->attrs[i].name, name)) return &n->attrs[i];
    return NULL;
}

static int fz_ints_all(const eng_node *n, const char *name, int64_t want, int len) {
    const int64_t *v = NULL;
    int k = eng_node_attr_ints(n, name, &v);
    if (k < 0) return 1;
    if (k != len) return 0;
    for (int i = 0; i < k; i++)
        if (v[i] != want) return 0;
    return 1;
}

/* A 2-D MaxPool that reads a blocked conv output, with no padding, dilation, ceil_mode or Indices output, is
 * folded into the conv (FusedConv attributes pool_kernel/pool_strides): the conv then runs in cache-sized
 * sub-batches and pools each straight from cache, instead of writing the whole activation to memory and
 * reading it back (see kernels/cpu/nn-conv.c). Runs after the layout pass, which guarantees the conv's only
 * consumers are pools/convs. */
static eng_status fz_conv_pool(fz_ctx *z) {
    eng_graph *g = z->g;
    if (getenv("TENSORD_NO_CONV_POOL")) return ENG_STATUS_OK;
    for (int i = 0; i < g->nnodes; i++) {
        eng_node *n = &g->nodes[i];
        if (z->dead[i] || !fz_is_conv2d(g, n) || eng_node_attr_int(n, "y_layout", 0) != KRN_NN_LAYOUT_BLOCKED) continue;
        if (n->nin > 3 && n->inputs[3] >= 0) continue; /* residual */
        const eng_tensor *w = fz_const_f32(g, n->inputs[1]);
        if (!w || !krn_nn_blocked16(w->dims[0])) continue;
        int j = fz_sole_consumer(z, n->outputs[0]);
        if (j < 0) continue;
        eng_node *pn = &g->nodes[j];
        const int64_t *k = NULL, *st = NULL;
        if (!fz_is_op(pn, "MaxPool") || !fz_one_output(pn) || pn->inputs[0] != n->outputs[0]) continue;
        if (eng_node_attr_int(pn, "y_layout", 0) != KRN_NN_LAYOUT_PLAIN) continue; /* the fused kernel writes plain */
        if (eng_node_attr_ints(pn, "kernel_shape", &k) != 2) continue;
        int nst = eng_node_attr_ints(pn, "strides", &st);
        if (nst >= 0 && nst != 2) continue;
        const char *ap = eng_node_attr_str(pn, "auto_pad", "NOTSET");
        if (strcmp(ap, "NOTSET") && strcmp(ap, "VALID")) continue;
        if (!fz_ints_all(pn, "pads", 0, 4) || !fz_ints_all(pn, "dilations", 1, 2) ||
            eng_node_attr_int(pn, "ceil_mode", 0) != 0)
            continue;
        int64_t ks[2] = {k[0], k[1]}, ss[2] = {nst == 2 ? st[0] : 1, nst == 2 ? st[1] : 1};
        if (fz_is_op(n, "Conv")) ENG_TRY(fz_set_op(n, "FusedConv", "com.tensord"));
        eng_attr a = {0};
        a.type = ENG_ATTR_INTS;
        a.n = 2;
        a.name = (char *)"pool_kernel";
        a.ints = ks;
        ENG_TRY(eng_node_add_attr(g, i, &a));
        a.name = (char *)"pool_strides";
        a.ints = ss;
        ENG_TRY(eng_node_add_attr(g, i, &a));
        n = &g->nodes[i];
        eng_attr *yl = fz_attr_mut(n, "y_layout");
        if (yl) yl->i = KRN_NN_LAYOUT_PLAIN; /* Y is now the pool's plain output */
        n->outputs[0] = pn->outputs[0];
        z->dead[j] = 1;
    }
    return ENG_STATUS_OK;
}

/* 1 if every use of v is a live node input (not a graph output, not a name used inside a subgraph). */
static int fz_only_node_uses(const fz_ctx *z, int v) {
    const eng_graph *g = z->g;
    int direct = 0;
    for (int j = 0; j < g->nnodes; j++)
        for (int k = 0; !z->dead[j] && k < g->nodes[j].nin; k++) direct += g->nodes[j].inputs[k] == v;
    return fz_uses(z, v) == direct;
}

/* v is known to be 4-D: declared so, or made by an op that keeps a 4-D input's rank (checked depth levels up). */
static int fz_rank4(const eng_graph *g, int v, int depth) {
    if (v < 0) return 0;
    if (g->values[v].ndim == 4) return 1;
    int p = g->values[v].producer;
    if (p < 0 || depth <= 0) return 0;
    const eng_node *n = &g->nodes[p];
    if (fz_is_conv2d(g, n)) return 1;
    static const char *const keep[] = {"Concat", "Relu", "Add", "Mul", "MaxPool", "AveragePool", "BatchNormalization",
                                       "Clip", "Sigmoid", "GlobalAveragePool", "Dropout", "Identity", "Pad", NULL};
    for (int i = 0; keep[i]; i++)
        if (fz_is_op(n, keep[i])) return n->nin > 0 && fz_rank4(g, n->inputs[0], depth - 1);
    return 0;
}

/* A BatchNormalization that no conv absorbed, over a 4-D input (DenseNet's and pre-activation nets' BN -> Relu
 * -> Conv), becomes a depthwise 1x1 Conv with W = scale / sqrt(var + eps), B = bias - mean * W (computed in
 * double): then it takes a fused activation and joins the layout pass like any conv. */
static eng_status fz_bn_standalone(fz_ctx *z, int bi) {
    eng_graph *g = z->g;
    eng_node *n = &g->nodes[bi];
    if (n->nin != 5 || !fz_one_output(n) || eng_node_attr_int(n, "training_mode", 0) || !fz_rank4(g, n->inputs[0], 8))
        return ENG_STATUS_OK;
    const eng_tensor *p[4];
    for (int i = 0; i < 4; i++)
        if (!(p[i] = fz_const_f32(g, n->inputs[1 + i])) || p[i]->ndim != 1 || p[i]->dims[0] != p[0]->dims[0])
            return ENG_STATUS_OK;
    int64_t C = p[0]->dims[0], wd[4] = {C, 1, 1, 1};
    double eps = eng_node_attr_float(n, "epsilon", 1e-5f);
    float *w, *b;
    int wv = fz_new_init(z, n->name, "_dw_w", 4, wd, &w), bv = wv < 0 ? -1 : fz_new_bias(z, n->name, C, &b);
    if (wv < 0 || bv < 0) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "rewriting BatchNormalization '%s'", n->name);
    n = &g->nodes[bi];
    const float *sc = p[0]->data, *bi_ = p[1]->data, *mean = p[2]->data, *var = p[3]->data;
    for (int64_t c = 0; c < C; c++) {
        double a = (double)sc[c] / sqrt((double)var[c] + eps);
        w[c] = (float)a;
        b[c] = (float)((double)bi_[c] - (double)mean[c] * a);
    }
    n->inputs[1] = wv, n->inputs[2] = bv;
    n->nin = 3;
    for (int i = 0; i < n->nattr; i++) eng_attr_clear(&n->attrs[i]);
    n->nattr = 0;
    ENG_TRY(fz_set_op(n, "Conv", ""));
    ENG_TRY(fz_add_attr_int(g, bi, "group", C));
    z->changed = 1;
    return fz_conv(z, bi);
}

/* A node that passes its first input through unchanged: Identity, single-output Dropout (inference), and Pad
 * whose pads are all zero (torch.onnx writes one before every AveragePool). */
static int fz_is_noop(const eng_graph *g, const eng_node *n) {
    if (!fz_one_output(n) || n->nin < 1 || n->inputs[0] < 0) return 0;
    if (fz_is_op(n, "Identity")) return 1;
    if (fz_is_op(n, "Dropout")) return n->nout == 1 && (n->nin < 3 || n->inputs[2] < 0) && !eng_node_attr_int(n, "training_mode", 0);
    if (!fz_is_op(n, "Pad")) return 0;
    const int64_t *pa = NULL;
    int np = -1;
    if (g->opset < 11) np = eng_node_attr_ints(n, "pads", &pa);
    else if (n->nin > 1 && n->inputs[1] >= 0 && g->values[n->inputs[1]].init &&
             g->values[n->inputs[1]].init->dtype == ENG_DTYPE_I64 && !fz_is_graph_input(g, n->inputs[1])) {
        pa = g->values[n->inputs[1]].init->data;
        np = (int)eng_tensor_numel(g->values[n->inputs[1]].init);
    }
    if (np < 0 || (n->nin > 3 && n->inputs[3] >= 0)) return 0; /* unknown pads, or axes given */
    for (int k = 0; k < np; k++)
        if (pa[k]) return 0;
    return 1;
}

/* A 2-D Transpose of a float32 initializer becomes the transposed initializer: how torch.onnx writes a Linear when
 * it does not fold constants (training-mode exports, frozen layers in a training graph), so the MatMul after it
 * sees a constant weight (packed once, bias fused). Not part of fz_hoist_constants: eng_graph_fuse_act_ops runs that
 * on a training graph before its trained weights become graph inputs. */
static eng_status fz_fold_transpose(fz_ctx *z, int i) {
    eng_graph *g = z->g;
    const eng_node *n = &g->nodes[i];
    const eng_tensor *w = n->nin == 1 ? fz_const_f32(g, n->inputs[0]) : NULL;
    const int64_t *perm = NULL;
    int np = eng_node_attr_ints(n, "perm", &perm);
    int v = fz_one_output(n) ? n->outputs[0] : -1;
    if (!w || w->ndim != 2 || (np >= 0 && (np != 2 || perm[0] != 1 || perm[1] != 0)) || v < 0 || g->values[v].init ||
        !fz_only_node_uses(z, v))
        return ENG_STATUS_OK;
    int64_t r = w->dims[0], c = w->dims[1];
    eng_tensor *t = calloc(1, sizeof *t);
    if (!t || !(t->data = eng_alloc((size_t)(r * c > 0 ? r * c : 1) * sizeof(float)))) {
        free(t);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "folding Transpose '%s'", n->name);
    }
    t->dtype = ENG_DTYPE_F32;
    t->ndim = 2;
    t->dims[0] = c, t->dims[1] = r;
    const float *src = w->data;
    float *dst = t->data;
    for (int64_t a = 0; a < r; a++)
        for (int64_t b = 0; b < c; b++) dst[b * r + a] = src[a * c + b];
    eng_value_set_init(g, v, t);
    g->values[v].producer = -1;
    z->dead[i] = 1;
    return ENG_STATUS_OK;
}

/* Constant nodes (the tensor form, as exporters write scalars) become initializers, and no-op nodes (Identity,
 * which is how torch.onnx shares a deduplicated weight; inference Dropout; all-zero Pad) are bypassed, so the
 * rules here see constants as constants and activations run straight from producer to consumer. Graph outputs
 * and subgraph references keep their nodes. */
static eng_status fz_hoist_constants(fz_ctx *z) {
    eng_graph *g = z->g;
    for (int i = 0; i < g->nnodes; i++) {
        eng_node *n = &g->nodes[i];
        if (!z->dead[i] && fz_is_noop(g, n) && fz_only_node_uses(z, n->outputs[0])) {
            int from = n->outputs[0], to = n->inputs[0];
            for (int j = 0; j < g->nnodes; j++)
                for (int k = 0; !z->dead[j] && k < g->nodes[j].nin; k++)
                    if (g->nodes[j].inputs[k] == from) g->nodes[j].inputs[k] = to;
            z->dead[i] = 1;
            continue;
        }
        if (z->dead[i] || !fz_is_op(n, "Constant") || !fz_one_output(n) || n->nin) continue;
        const eng_attr *a = eng_node_attr(n, "value");
        int v = n->outputs[0];
        if (!a || a->type != ENG_ATTR_TENSOR || !a->t.data || g->values[v].init) continue;
        if (!fz_only_node_uses(z, v)) continue;
        eng_tensor *t = calloc(1, sizeof *t);
        size_t nb = eng_tensor_nbytes(&a->t);
        if (!t || !(t->data = eng_alloc(nb ? nb : 1))) {
            free(t);
            return eng_err(ENG_STATUS_OUT_OF_MEMORY, "constant '%s'", g->values[v].name);
        }
        void *data = t->data;
        *t = a->t;
        t->data = data;
        memcpy(t->data, a->t.data, nb);
        eng_value_set_init(g, v, t);
        g->values[v].producer = -1;
        z->dead[i] = 1;
    }
    return ENG_STATUS_OK;
}

/* A 1x1 conv (stride 1, no pads, group 1, no residual) whose output only a 3x3 depthwise conv (pads 1, stride 1
 * or 2, no residual) reads, with a channel count that is a multiple of 16, becomes one FusedConv that computes
 * both (oneDNN's depthwise post-op): MobileNet's expand -> depthwise pair, whose expanded activation is the
 * largest tensor of the block and now stays in cache. Inputs [X, W, B, -, Wdw, Bdw]; attrs dw_stride, dw_act*. */
static eng_status fz_conv_dw(fz_ctx *z) {
    eng_graph *g = z->g;
    if (getenv("TENSORD_NO_CONV_DW")) return ENG_STATUS_OK;
    for (int i = 0; i < g->nnodes; i++) {
        eng_node *a = &g->nodes[i];
        if (z->dead[i] || !fz_is_conv2d(g, a) || eng_node_attr(a, "pool_kernel") || eng_node_attr(a, "dw_stride")) continue;
        const eng_tensor *w = fz_const_f32(g, a->inputs[1]);
        int64_t M = w->dims[0];
        if (w->dims[2] != 1 || w->dims[3] != 1 || eng_node_attr_int(a, "group", 1) != 1 || !krn_nn_blocked16(M) ||
            (a->nin > 3 && a->inputs[3] >= 0) || !fz_ints_all(a, "strides", 1, 2) || !fz_ints_all(a, "pads", 0, 4) ||
            !fz_ints_all(a, "dilations", 1, 2) || strcmp(eng_node_attr_str(a, "auto_pad", "NOTSET"), "NOTSET"))
            continue;
        int j = fz_sole_consumer(z, a->outputs[0]);
        if (j < 0) continue;
        eng_node *b = &g->nodes[j];
        if (!fz_is_conv2d(g, b) || b->inputs[0] != a->outputs[0] || eng_node_attr(b, "pool_kernel") ||
            eng_node_attr(b, "dw_stride") || (b->nin > 3 && b->inputs[3] >= 0))
            continue;
        const eng_tensor *wd = fz_const_f32(g, b->inputs[1]);
        const int64_t *st = NULL;
        int nst = eng_node_attr_ints(b, "strides", &st);
        int64_t s = nst == 2 ? st[0] : 1;
        if (wd->dims[0] != M || wd->dims[1] != 1 || wd->dims[2] != 3 || wd->dims[3] != 3 ||
            eng_node_attr_int(b, "group", 1) != M || (nst >= 0 && (nst != 2 || st[1] != s)) || (s != 1 && s != 2) ||
            !fz_ints_all(b, "pads", 1, 4) || eng_node_attr(b, "pads") == NULL || !fz_ints_all(b, "dilations", 1, 2) ||
            strcmp(eng_node_attr_str(b, "auto_pad", "NOTSET"), "NOTSET"))
            continue;
        int bw = b->inputs[1], bb = b->nin > 2 ? b->inputs[2] : -1, out = b->outputs[0];
        krn_nn_act_params da = {0};
        da.kind = (int)eng_node_attr_int(b, "act", KRN_NN_ACT_NONE);
        da.alpha = eng_node_attr_float(b, "act_alpha", 0.f);
        da.beta = eng_node_attr_float(b, "act_beta", 0.f);
        if (fz_is_op(a, "Conv")) ENG_TRY(fz_set_op(a, "FusedConv", "com.tensord"));
        ENG_TRY(fz_ensure_inputs(a, 6));
        a = &g->nodes[i];
        a->inputs[3] = -1, a->inputs[4] = bw, a->inputs[5] = bb;
        ENG_TRY(fz_add_attr_int(g, i, "dw_stride", s));
        ENG_TRY(fz_add_attr_int(g, i, "dw_act", da.kind));
        ENG_TRY(fz_add_attr_float(g, i, "dw_act_alpha", da.alpha));
        ENG_TRY(fz_add_attr_float(g, i, "dw_act_beta", da.beta));
        a = &g->nodes[i];
        a->outputs[0] = out;
        z->dead[j] = 1;
        fz_move_node(z, i, j);
    }
    return ENG_STATUS_OK;
}

/* Training graphs (eng_graph_fuse_act_ops): Gelu's erf or tanh form written as a chain of elementwise ops becomes
 * one Gelu node, and x * sigmoid(x) one com.tensord Silu node, so autodiff differentiates one node (one GeluGrad /
 * SiluGrad pass) instead of every Div/Erf/Sigmoid/Mul and the unbroadcasts and sums between them. The new node takes
 * the chain's last node's slot and name. */
static eng_status fz_chain_to_act_op(fz_ctx *z, int x) {
    eng_graph *g = z->g;
    krn_nn_act_params act;
    int pat[16], np = 0;
    int fin = fz_match_act_chain(z, x, &act, pat, &np, 16);
    int silu = act.kind == KRN_NN_ACT_SWISH && act.alpha == 1.0f;
    if (fin < 0 || (act.kind != KRN_NN_ACT_GELU_ERF && act.kind != KRN_NN_ACT_GELU_TANH && !silu)) return ENG_STATUS_OK;
    eng_node *n = &g->nodes[fin];
    ENG_TRY(silu ? fz_set_op(n, "Silu", "com.tensord") : fz_set_op(n, "Gelu", ""));
    for (int a = 0; a < n->nattr; a++) eng_attr_clear(&n->attrs[a]);
    n->nattr = 0;
    n->inputs[0] = x;
    n->nin = 1;
    if (act.kind == KRN_NN_ACT_GELU_TANH) {
        eng_attr a = {.name = "approximate", .type = ENG_ATTR_STRING, .s = "tanh", .s_len = 4};
        ENG_TRY(eng_node_add_attr(g, fin, &a));
    }
    for (int i = 0; i < np; i++)
        if (pat[i] != fin) z->dead[pat[i]] = 1;
    z->changed = 1;
    return ENG_STATUS_OK;
}

eng_status eng_graph_fuse_act_ops(eng_graph *g) {
    if (!g || g->nnodes == 0 || getenv("TENSORD_NO_FUSE")) return ENG_STATUS_OK;
    fz_ctx z = {g, calloc((size_t)g->nnodes, 1), 0};
    if (!z.dead) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "graph fusion");
    eng_status st = fz_hoist_constants(&z);
    for (int i = 0; i < g->ninputs && st == ENG_STATUS_OK; i++)
        if (!g->values[g->inputs[i]].init) st = fz_chain_to_act_op(&z, g->inputs[i]);
    for (int i = 0; i < g->nnodes && st == ENG_STATUS_OK; i++) /* every output: a training BatchNormalization has 3 */
        for (int k = 0; !z.dead[i] && k < g->nodes[i].nout && st == ENG_STATUS_OK; k++)
            if (g->nodes[i].outputs[k] >= 0) st = fz_chain_to_act_op(&z, g->nodes[i].outputs[k]);
    eng_status cst = fz_compact(&z);
    free(z.dead);
    return st != ENG_STATUS_OK ? st : cst;
}

eng_status eng_graph_fuse(eng_graph *g) { return eng_graph_fuse_for(g, 1); }

eng_status eng_graph_fuse_for(eng_graph *g, int cpu_layouts) {
    if (!g || g->nnodes == 0) return ENG_STATUS_OK;
    if (getenv("TENSORD_NO_FUSE")) return ENG_STATUS_OK;
    eng_status qst = eng_graph_fuse_qdq(g); /* fuse-qdq.c: before the float rules see the Convs/MatMuls */
    if (qst != ENG_STATUS_OK) return qst;
    fz_ctx z = {g, calloc((size_t)g->nnodes, 1), 0};
    if (!z.dead) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "graph fusion");
    eng_status st = fz_hoist_constants(&z);
    for (int i = 0; i < g->nnodes && st == ENG_STATUS_OK; i++)
        if (!z.dead[i] && fz_is_op(&g->nodes[i], "Transpose")) st = fz_fold_transpose(&z, i);
    if (st == ENG_STATUS_OK && !cpu_layouts) st = fz_attention(&z); /* fuse-attn.c: device sessions */
    for (int i = 0; i < g->nnodes && st == ENG_STATUS_OK; i++) {
        if (z.dead[i]) continue;
        const eng_node *n = &g->nodes[i];
        if (fz_is_op(n, "Conv")) st = fz_conv(&z, i);
        else if (fz_is_op(n, "BatchNormalization")) st = fz_bn_standalone(&z, i);
        else if (fz_is_op(n, "MatMul") || fz_is_op(n, "Gemm")) st = fz_matmul(&z, i);
        else if (!strcmp(n->op_type, "MatMulIntegerToFloat") && !strcmp(n->domain, "com.microsoft")) st = fz_qmatmul_act(&z, i);
    }
    if (st == ENG_STATUS_OK && cpu_layouts) st = fz_conv_dw(&z);
    eng_status cst = fz_compact(&z); /* also after a failure: moved nodes leave dead slots behind */
    if (st == ENG_STATUS_OK) st = cst;
    if (st == ENG_STATUS_OK && cpu_layouts) {
        memset(z.dead, 0, (size_t)g->nnodes);
        st = fz_layouts(&z);
    }
    if (st == ENG_STATUS_OK && cpu_layouts) {
        st = fz_conv_pool(&z);
        eng_status c2 = fz_compact(&z);
        if (st == ENG_STATUS_OK) st = c2;
    }
    free(z.dead);
    return st;
}
