/* fuse-layout.c - layout negotiation, the graph rewrite that decides which 4-D float32 activations live in a
 * BLOCKED layout (see krn_nn_layout in kernels/krn-nn.h) instead of plain NCHW, run by eng_graph_fuse after the
 * fusions (fuse.c).
 *
 * Invariants: the graph's ops, values and edges are unchanged; only layout attributes are added (y_layout on
 * producers, x_layout on conv/pool readers, layout on elementwise ops and Concats). Both ends of every edge
 * agree on a layout: a value is BLOCKED only if its producer writes it so and every consumer reads it so, and a
 * value in the zero-padded nChw16c layout (KRN_NN_LAYOUT_BLOCKED16_PADDED) is read by convs only. Kernels that
 * find their fixed layouts slow convert inside their step (kernels/cpu/nn-conv.c) and say so.
 */
#include <stdlib.h>
#include <string.h>

#include "fuse-impl.h"

/* Conv/FusedConv with a 4-D float32 weight initializer (the only producers/consumers of BLOCKED activations). */
int fz_is_conv2d(const eng_graph *g, const eng_node *n) {
    int conv = fz_is_op(n, "Conv") || (!strcmp(n->op_type, "FusedConv") && !strcmp(n->domain, "com.tensord"));
    if (!conv || n->nin < 2 || !fz_one_output(n)) return 0;
    const eng_tensor *w = fz_const_f32(g, n->inputs[1]);
    return w && w->ndim == 4;
}

static int fz_is_pool_blockable(const eng_node *n) {
    if (n->domain[0] || !fz_one_output(n)) return 0;
    return !strcmp(n->op_type, "MaxPool") || !strcmp(n->op_type, "AveragePool") ||
           !strcmp(n->op_type, "GlobalAveragePool") || !strcmp(n->op_type, "GlobalMaxPool");
}

/* Elementwise ops that run on BLOCKED tensors unchanged (unary) or through the binary kernel's blocked view
 * (inputs shaped like the output, or broadcast over H and W, or over C). */
static int fz_is_ew_blockable(const eng_node *n) {
    static const char *const unary[] = {"Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh",
                                        "Elu", "Gelu", "Neg", "Abs", "Sqrt", "Exp", "Erf", "Softplus", NULL};
    static const char *const binary[] = {"Add", "Mul", "Sub", "Div", NULL};
    if (n->domain[0] || !fz_one_output(n)) return 0;
    for (int i = 0; unary[i]; i++)
        if (!strcmp(n->op_type, unary[i])) return 1;
    for (int i = 0; binary[i]; i++)
        if (!strcmp(n->op_type, binary[i])) return 2;
    return 0;
}

/* A constant that reads the same in every layout of a 4-D activation: a scalar, or broadcast over H and W
 * ([C,1,1], [1,C,1,1], [N,C,1,1]). Clip's min/max inputs are scalars too. */
static int fz_layout_free_const(const eng_graph *g, int v) {
    if (v < 0) return 1;
    const eng_tensor *t = g->values[v].init; /* Constant nodes are initializers by now (fz_hoist_constants) */
    if (!t) return 0;
    if (eng_tensor_numel(t) == 1) return 1;
    return t->ndim >= 3 && t->ndim <= 4 && t->dims[t->ndim - 1] == 1 && t->dims[t->ndim - 2] == 1;
}

/* Channel count of a 4-D activation where the graph fixes it: a conv's W, carried through pools and
 * elementwise ops, summed over a channel Concat; -1 when unknown. */
static int64_t fz_channels(const eng_graph *g, int v, int depth) {
    int p = v >= 0 ? g->values[v].producer : -1;
    if (p < 0 || depth <= 0) return v >= 0 && g->values[v].ndim == 4 && g->values[v].dims[1] > 0 ? g->values[v].dims[1] : -1;
    const eng_node *n = &g->nodes[p];
    if (fz_is_conv2d(g, n)) return fz_const_f32(g, n->inputs[1])->dims[0];
    if (fz_is_op(n, "Concat")) {
        int64_t sum = 0;
        for (int k = 0; k < n->nin; k++) {
            int64_t c = fz_channels(g, n->inputs[k], depth - 1);
            if (c < 0) return -1;
            sum += c;
        }
        return sum;
    }
    if (fz_is_pool_blockable(n) || fz_is_ew_blockable(n) == 1) return fz_channels(g, n->inputs[0], depth - 1);
    return -1;
}

/* A channel Concat of 4-D activations whose channel counts are all multiples of 16: on nChw16c tensors it is the
 * same byte copy as on NCHW ones (each image's part of each input is one contiguous run), so it runs unchanged. */
static int fz_is_concat_blockable(const eng_graph *g, const eng_node *n) {
    if (!fz_is_op(n, "Concat") || !fz_one_output(n) || n->nin < 1) return 0;
    int64_t axis = eng_node_attr_int(n, "axis", 0);
    if (axis != 1 && axis != -3) return 0;
    for (int k = 0; k < n->nin; k++) {
        int64_t c = fz_channels(g, n->inputs[k], 16);
        if (c <= 0 || !krn_nn_blocked16(c)) return 0;
    }
    return 1;
}

/* Layout negotiation: which 4-D float32 activations live BLOCKED (see krn_nn_layout) instead of plain NCHW.
 * Producers that can write BLOCKED: convs with a 4-D weight; pools whose input is BLOCKED (Global* outputs are
 * [N,C,1,1], the same bytes in every layout); elementwise ops whose every activation input is BLOCKED and whose
 * constants are layout-free. A value is BLOCKED only if every consumer reads BLOCKED there: a conv's X, a pool's
 * X, a blocked conv's residual Z, a blocked elementwise op's input. Start from every candidate and remove, to a
 * fixpoint, each whose output reaches a plain-only consumer (or is a graph output) or whose own inputs are not
 * BLOCKED where it needs them; what is left agrees on both sides of every edge, so no reorder sits between
 * nodes. Where a kernel still finds its layouts slow (oneDNN has only a reference kernel for them) it reorders
 * inside the step and says so (TENSORD_PROFILE=1). Marks: y_layout on producers, x_layout on conv/pool readers,
 * layout on elementwise ops. */
eng_status fz_layouts(fz_ctx *z) {
    eng_graph *g = z->g;
    if (getenv("TENSORD_NO_BLOCKED")) return ENG_STATUS_OK;
    unsigned char *blk = calloc((size_t)g->nnodes + 1, 1), *cls = calloc((size_t)g->nnodes + 1, 1);
    if (!blk || !cls) {
        free(blk);
        free(cls);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "layout pass");
    }
    enum { C_NONE, C_CONV, C_POOL, C_EW, C_CAT };
    for (int i = 0; i < g->nnodes; i++) {
        const eng_node *n = &g->nodes[i];
        cls[i] = fz_is_conv2d(g, n) ? C_CONV : fz_is_pool_blockable(n) ? C_POOL : fz_is_ew_blockable(n) ? C_EW
                 : fz_is_concat_blockable(g, n) ? C_CAT : C_NONE;
        blk[i] = cls[i] != C_NONE;
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = 0; i < g->nnodes; i++) {
            if (!blk[i]) continue;
            const eng_node *n = &g->nodes[i];
            int v = n->outputs[0], ok = 1, uses = 0;
            for (int j = 0; j < g->nnodes && ok; j++) {
                const eng_node *c = &g->nodes[j];
                for (int k = 0; k < c->nin && ok; k++) {
                    if (c->inputs[k] != v) continue;
                    uses++;
                    if (k == 0 && (cls[j] == C_CONV || cls[j] == C_POOL)) continue;
                    if (k == 3 && cls[j] == C_CONV && blk[j]) continue;
                    if ((cls[j] == C_EW || cls[j] == C_CAT) && blk[j]) continue;
                    ok = 0;
                }
            }
            if (ok && uses != fz_uses(z, v)) ok = 0; /* graph output or subgraph reference */
            /* inputs that must come in blocked */
            if (ok && cls[i] == C_CONV && n->nin > 3 && n->inputs[3] >= 0) { /* our residual, like Y */
                int pz = g->values[n->inputs[3]].producer;
                if (pz < 0 || !blk[pz]) ok = 0;
            }
            if (ok && cls[i] == C_POOL) {
                int px = n->inputs[0] >= 0 ? g->values[n->inputs[0]].producer : -1;
                if (px < 0 || !blk[px]) ok = 0;
            }
            if (ok && cls[i] == C_CAT)
                for (int k = 0; k < n->nin && ok; k++) {
                    int pk = n->inputs[k] >= 0 ? g->values[n->inputs[k]].producer : -1;
                    if (pk < 0 || !blk[pk]) ok = 0;
                }
            if (ok && cls[i] == C_EW) {
                int acts = 0;
                for (int k = 0; k < n->nin && ok; k++) {
                    int in = n->inputs[k];
                    int pk = in >= 0 ? g->values[in].producer : -1;
                    if (pk >= 0 && blk[pk]) acts++;
                    else if (!fz_layout_free_const(g, in)) ok = 0;
                }
                if (acts == 0) ok = 0;
            }
            if (!ok) blk[i] = 0, changed = 1;
        }
    }
    /* Blocked conv outputs whose channel count is not a multiple of 16 (NHWC otherwise) and that only convs read
     * (as X, or as the residual of a conv whose own output is padded too) take the zero-padded nChw16c layout:
     * between nChw16c neighbours (MobileNet's 24-channel stages) no conversion is then needed. */
    unsigned char *pad = blk; /* reuse: 2 marks padded */
    for (int i = 0; i < g->nnodes; i++)
        if (blk[i] && cls[i] == C_CONV && !krn_nn_blocked16(fz_const_f32(g, g->nodes[i].inputs[1])->dims[0])) pad[i] = 2;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = 0; i < g->nnodes; i++) {
            if (pad[i] != 2) continue;
            const eng_node *n = &g->nodes[i];
            int v = n->outputs[0], ok = 1;
            for (int j = 0; j < g->nnodes && ok; j++)
                for (int k = 0; k < g->nodes[j].nin && ok; k++) {
                    if (g->nodes[j].inputs[k] != v) continue;
                    ok = cls[j] == C_CONV && (k == 0 || (k == 3 && pad[j] == 2));
                }
            if (ok && n->nin > 3 && n->inputs[3] >= 0) {
                int pz = g->values[n->inputs[3]].producer;
                ok = pz >= 0 && pad[pz] == 2;
            }
            if (!ok) pad[i] = 1, changed = 1;
        }
    }
    eng_status st = ENG_STATUS_OK;
    for (int i = 0; i < g->nnodes && st == ENG_STATUS_OK; i++) {
        const eng_node *n = &g->nodes[i];
        int lay = pad[i] == 2 ? KRN_NN_LAYOUT_BLOCKED16_PADDED : KRN_NN_LAYOUT_BLOCKED;
        if (blk[i] && (cls[i] == C_EW || cls[i] == C_CAT)) st = fz_add_attr_int(g, i, "layout", KRN_NN_LAYOUT_BLOCKED);
        else if (blk[i]) st = fz_add_attr_int(g, i, "y_layout", lay);
        if (st == ENG_STATUS_OK && n->nin > 0 && n->inputs[0] >= 0 && (cls[i] == C_CONV || cls[i] == C_POOL)) {
            int px = g->values[n->inputs[0]].producer;
            if (px >= 0 && blk[px])
                st = fz_add_attr_int(g, i, "x_layout", pad[px] == 2 ? KRN_NN_LAYOUT_BLOCKED16_PADDED : KRN_NN_LAYOUT_BLOCKED);
        }
    }
    free(blk);
    free(cls);
    return st;
}
