/* fuse-attn.c - attention layers into one com.tensord FusedAttention node (kernels/krn-attn.h), for sessions on a
 * device (eng_graph_fuse_for with cpu_layouts 0): the scores and probabilities, [.., Sq, Sk] per head, then never
 * reach device memory. The CPU keeps the chain (its oneDNN matmuls are its fast path).
 *
 * The chain, as torch.onnx and tf2onnx write a transformer's attention:
 *     S = MatMul(Q, KT)              Q [.., Sq, D], KT [.., D, Sk] (K already transposed)
 *     S = S / c  or  S * c           optional, c a constant float32 scalar
 *     S = S + M                      optional, M any tensor (the additive mask)
 *     P = Softmax(S) over the last axis
 *     Y = MatMul(P, V)               V [.., Sk, Dv]
 * Every value inside the chain is read only by the next node of the chain (not a graph output). The rewrite needs
 * the ranks of Q, KT and V to be known to be >= 2 (a MatMul of a 1-D tensor means something else): from the graph's
 * value info, an initializer, or the node that makes them (Transpose's perm, Reshape to a constant shape, and the
 * elementwise / unary ops that keep their input's rank). TENSORD_NO_ATTENTION_FUSE=1 turns the rewrite off.
 */
#include <stdlib.h>
#include <string.h>

#include "fuse-impl.h"

/* The rank of value v if it is known here, else -1 (depth bounds the walk up the producers). */
static int attn_rank(const fz_ctx *z, int v, int depth) {
    const eng_graph *g = z->g;
    if (v < 0 || depth > 8) return -1;
    const eng_value *val = &g->values[v];
    if (val->init) return val->init->ndim;
    if (val->ndim >= 0) return val->ndim; /* declared (graph inputs: callers are checked against it) */
    int p = val->producer;
    if (p < 0 || z->dead[p]) return -1;
    const eng_node *n = &g->nodes[p];
    if (n->domain[0]) return -1;
    if (fz_is_op(n, "Transpose")) {
        const int64_t *perm = NULL;
        int np = eng_node_attr_ints(n, "perm", &perm);
        return np >= 0 ? np : attn_rank(z, n->inputs[0], depth + 1);
    }
    if (fz_is_op(n, "Reshape") && n->nin >= 2) {
        const eng_value *s = &g->values[n->inputs[1]];
        return s->init && s->init->ndim == 1 ? (int)s->init->dims[0] : -1;
    }
    static const char *const keep[] = {"Identity", "Cast", "Relu", "Gelu", "Tanh", "Sigmoid", "Erf", "Sqrt",
                                       "Neg", "Softmax", "LayerNormalization", "Dropout", NULL};
    for (int i = 0; keep[i]; i++)
        if (fz_is_op(n, keep[i])) return attn_rank(z, n->inputs[0], depth + 1);
    static const char *const binary[] = {"Add", "Sub", "Mul", "Div", "MatMul", NULL};
    for (int i = 0; binary[i]; i++) {
        if (!fz_is_op(n, binary[i]) || n->nin != 2) continue;
        int a = attn_rank(z, n->inputs[0], depth + 1), b = attn_rank(z, n->inputs[1], depth + 1);
        if (a < 0 || b < 0) return -1;
        if (!strcmp(binary[i], "MatMul") && (a < 2 || b < 2)) return -1;
        return a > b ? a : b;
    }
    return -1;
}

/* The sole live consumer of v if it is a one-output node of op type `op`, else -1. */
static int attn_next(const fz_ctx *z, int v, const char *op) {
    int c = fz_sole_consumer(z, v);
    if (c < 0 || !fz_is_op(&z->g->nodes[c], op) || !fz_one_output(&z->g->nodes[c])) return -1;
    return c;
}

static eng_status attn_at(fz_ctx *z, int mi) {
    eng_graph *g = z->g;
    const eng_node *mm = &g->nodes[mi];
    if (mm->nin != 2 || !fz_one_output(mm)) return ENG_STATUS_OK;
    int q = mm->inputs[0], kt = mm->inputs[1];
    int rq = attn_rank(z, q, 0), rk = attn_rank(z, kt, 0);
    if (rq < 2 || rk < 2 || q == kt) return ENG_STATUS_OK;
    int chain[4] = {mi, -1, -1, -1}, nc = 1;
    int cur = mm->outputs[0], c;
    float scale = 1.0f;
    int div = 0, mask = -1;
    if ((c = attn_next(z, cur, "Mul")) >= 0 || (c = attn_next(z, cur, "Div")) >= 0) {
        const eng_node *n = &g->nodes[c];
        int other = n->nin == 2 ? (n->inputs[0] == cur ? n->inputs[1] : n->inputs[0]) : -1;
        const eng_tensor *t = other >= 0 ? fz_const_f32(g, other) : NULL;
        div = fz_is_op(n, "Div");
        /* a scalar that cannot raise the scores' rank; Div only as scores / c */
        if (!t || eng_tensor_numel(t) != 1 || t->ndim > (rq > rk ? rq : rk) || (div && n->inputs[0] != cur))
            return ENG_STATUS_OK;
        scale = ((const float *)t->data)[0];
        if (div && scale == 0.0f) return ENG_STATUS_OK;
        chain[nc++] = c;
        cur = n->outputs[0];
    }
    if ((c = attn_next(z, cur, "Add")) >= 0) {
        const eng_node *n = &g->nodes[c];
        if (n->nin != 2 || n->inputs[0] == n->inputs[1]) return ENG_STATUS_OK;
        mask = n->inputs[0] == cur ? n->inputs[1] : n->inputs[0];
        chain[nc++] = c;
        cur = n->outputs[0];
    }
    if ((c = attn_next(z, cur, "Softmax")) < 0 || g->nodes[c].nin != 1) return ENG_STATUS_OK;
    int rs = rq > rk ? rq : rk;
    if (mask >= 0) {
        int rm = attn_rank(z, mask, 0);
        rs = rm < 0 ? -1 : rm > rs ? rm : rs;
    }
    int64_t axis = eng_node_attr_int(&g->nodes[c], "axis", g->opset >= 13 ? -1 : 1);
    if (axis != -1 && (rs < 0 || axis != rs - 1)) return ENG_STATUS_OK; /* not the last axis (or not known to be) */
    chain[nc++] = c;
    cur = g->nodes[c].outputs[0];
    int last = attn_next(z, cur, "MatMul");
    if (last < 0) return ENG_STATUS_OK;
    eng_node *pv = &g->nodes[last];
    if (pv->nin != 2 || pv->inputs[0] != cur || pv->inputs[1] == cur) return ENG_STATUS_OK;
    int v = pv->inputs[1];
    if (attn_rank(z, v, 0) < 2) return ENG_STATUS_OK;
    /* the last MatMul becomes the fused node (it already writes Y, after V and everything else it reads) */
    ENG_TRY(fz_set_op(pv, "FusedAttention", "com.tensord"));
    ENG_TRY(fz_ensure_inputs(pv, mask >= 0 ? 4 : 3));
    pv->inputs[0] = q;
    pv->inputs[1] = kt;
    pv->inputs[2] = v;
    if (mask >= 0) pv->inputs[3] = mask;
    ENG_TRY(fz_add_attr_float(g, last, "scale", scale));
    ENG_TRY(fz_add_attr_int(g, last, "scale_div", div));
    for (int i = 0; i < nc; i++) z->dead[chain[i]] = 1;
    z->changed = 1;
    return ENG_STATUS_OK;
}

eng_status fz_attention(fz_ctx *z) {
    const char *off = getenv("TENSORD_NO_ATTENTION_FUSE");
    if (off && *off && *off != '0') return ENG_STATUS_OK;
    for (int i = 0; i < z->g->nnodes; i++)
        if (!z->dead[i] && fz_is_op(&z->g->nodes[i], "MatMul")) ENG_TRY(attn_at(z, i));
    return ENG_STATUS_OK;
}
