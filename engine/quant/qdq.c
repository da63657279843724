/* qdq.c - rewriting a float graph into ONNX's QDQ form from a calibrated plan (see quant.h).
 *
 * On a copy of the graph:
 *   weight W (float initializer): becomes initializers W_quantized (int8, round half to even of W / scale,
 *     clamped to [-127, 127]), W_scale (float32, [C] per channel or a scalar) and W_zero_point (int8 zeros), and a
 *     DequantizeLinear node whose output is the value W itself (its initializer dropped), so every consumer is
 *     unchanged. Channel axis: Conv 0, Gemm 0 with transB else 1, MatMul the last.
 *   activation A: QuantizeLinear(A) -> A_quantized -> DequantizeLinear -> A_dequantized, and only the quantized
 *     nodes' activation inputs are rewired to A_dequantized (other consumers keep the float A).
 * New nodes are appended, then the node list is put back in topological order (ONNX requires it) and every
 * value's producer recomputed. Names are made unique with a numeric suffix when taken.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"

/* A new value named base+suffix (made unique), dtype dt, shape (ndim, dims; ndim -1: unknown). */
static int q_add_value(eng_graph *g, const char *base, const char *suffix, eng_dtype dt, int ndim, const int64_t *dims) {
    char name[1200];
    snprintf(name, sizeof name, "%s%s", base, suffix);
    for (int k = 2; eng_graph_find_value(g, name) >= 0; k++) snprintf(name, sizeof name, "%s%s_%d", base, suffix, k);
    int v = eng_graph_add_value(g, name);
    if (v < 0) return -1;
    eng_value *val = &g->values[v];
    val->dtype = dt;
    val->ndim = ndim;
    for (int i = 0; i < ndim && i < ENG_MAX_DIMS; i++) val->dims[i] = dims ? dims[i] : -1;
    return v;
}

/* An initializer value holding a copy of n elements of data (dtype dt, shape ndim/dims). */
static int q_add_init(eng_graph *g, const char *base, const char *suffix, eng_dtype dt, int ndim, const int64_t *dims,
                      const void *data) {
    int v = q_add_value(g, base, suffix, dt, ndim, dims);
    if (v < 0) return -1;
    eng_tensor *t = malloc(sizeof *t);
    if (!t) return -1;
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->dims[i] = dims[i];
    size_t nb = eng_tensor_nbytes(t);
    t->data = eng_alloc(nb ? nb : 1);
    if (!t->data) {
        free(t);
        return -1;
    }
    memcpy(t->data, data, nb);
    eng_value_set_init(g, v, t);
    return v;
}

static int q_add_node(eng_graph *g, const char *base, const char *op, const int *in, int nin, int out, int axis) {
    char name[1200];
    snprintf(name, sizeof name, "%s/%s", base, op);
    int n = eng_graph_add_node(g, name, op, "", in, nin, &out, 1);
    if (n < 0 || axis < 0) return n;
    eng_attr a = {0};
    a.name = "axis";
    a.type = ENG_ATTR_INT;
    a.i = axis;
    return eng_node_add_attr(g, n, &a) == ENG_STATUS_OK ? n : -1;
}

static int q_weight_axis(const eng_graph *g, const eng_node *n, const eng_tensor *w) {
    if (strcmp(n->op_type, "Conv") == 0) return 0;
    if (strcmp(n->op_type, "Gemm") == 0) return eng_node_attr_int(n, "transB", 0) ? 0 : 1;
    (void)g;
    return w->ndim - 1;
}

/* Quantize weight value w (consumed by node n) in place as described at the top. */
static eng_status q_weight(eng_graph *g, int w, const eng_node *n, int per_channel) {
    const eng_tensor *t = g->values[w].init;
    int64_t numel = eng_tensor_numel(t);
    int axis = q_weight_axis(g, n, t);
    int64_t C = 1, inner = 1, outer = 1;
    if (per_channel && t->ndim >= 1) {
        C = t->dims[axis];
        for (int i = axis + 1; i < t->ndim; i++) inner *= t->dims[i];
        for (int i = 0; i < axis; i++) outer *= t->dims[i];
    } else {
        inner = numel;
    }
    float *scale = calloc((size_t)C + 1, sizeof *scale);
    int8_t *q = malloc((size_t)numel + 1), *zp = calloc((size_t)C + 1, 1);
    eng_status st = ENG_STATUS_OK;
    if (!scale || !q || !zp) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory quantizing '%s'", g->values[w].name);
    const float *f = t->data;
    for (int64_t o = 0; st == ENG_STATUS_OK && o < outer; o++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t i = 0; i < inner; i++) scale[c] = fmaxf(scale[c], fabsf(f[(o * C + c) * inner + i]));
    for (int64_t c = 0; st == ENG_STATUS_OK && c < C; c++) scale[c] = scale[c] > 0 ? scale[c] / 127.0f : 1.0f;
    for (int64_t o = 0; st == ENG_STATUS_OK && o < outer; o++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t i = 0; i < inner; i++) {
                int64_t k = (o * C + c) * inner + i;
                float r = nearbyintf(f[k] / scale[c]);
                q[k] = (int8_t)(r > 127 ? 127 : r < -127 ? -127 : r);
            }
    if (st == ENG_STATUS_OK) {
        char base[1024];
        snprintf(base, sizeof base, "%s", g->values[w].name);
        int64_t cd[1] = {C};
        int pc = per_channel && t->ndim >= 1;
        int64_t wdims[ENG_MAX_DIMS];
        int wnd = t->ndim;
        memcpy(wdims, t->dims, sizeof wdims);
        int vq = q_add_init(g, base, "_quantized", ENG_DTYPE_I8, wnd, wdims, q);
        int vs = q_add_init(g, base, "_scale", ENG_DTYPE_F32, pc ? 1 : 0, cd, scale);
        int vz = q_add_init(g, base, "_zero_point", ENG_DTYPE_I8, pc ? 1 : 0, cd, zp);
        int in[3] = {vq, vs, vz};
        if (vq < 0 || vs < 0 || vz < 0) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
        else {
            eng_value_set_init(g, w, NULL); /* frees the float data; w is now the DequantizeLinear output */
            if (q_add_node(g, base, "DequantizeLinear", in, 3, w, pc ? axis : -1) < 0)
                st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
            for (int i = 0; i < g->ninputs; i++) /* an overridable initializer is no longer an input */
                if (g->inputs[i] == w) {
                    memmove(&g->inputs[i], &g->inputs[i + 1], sizeof(int) * (size_t)(g->ninputs - i - 1));
                    g->ninputs--;
                    break;
                }
        }
    }
    free(scale);
    free(q);
    free(zp);
    return st;
}

/* QuantizeLinear/DequantizeLinear pair for activation a; returns the dequantized value's index or -1. */
static int q_activation(eng_graph *g, const eng_quant_act *a, int v) {
    char base[1024];
    snprintf(base, sizeof base, "%s", g->values[v].name);
    int nd = g->values[v].ndim;
    int64_t dims[ENG_MAX_DIMS];
    memcpy(dims, g->values[v].dims, sizeof dims);
    uint8_t zp8 = (uint8_t)a->zero_point;
    int8_t zi8 = (int8_t)a->zero_point;
    int vs = q_add_init(g, base, "_scale", ENG_DTYPE_F32, 0, NULL, &a->scale);
    int vz = q_add_init(g, base, "_zero_point", a->dtype, 0, NULL, a->dtype == ENG_DTYPE_U8 ? (void *)&zp8 : (void *)&zi8);
    int vq = q_add_value(g, base, "_quantized", a->dtype, nd, dims);
    int vd = q_add_value(g, base, "_dequantized", ENG_DTYPE_F32, nd, dims);
    if (vs < 0 || vz < 0 || vq < 0 || vd < 0) return -1;
    int qin[3] = {v, vs, vz}, din[3] = {vq, vs, vz};
    if (q_add_node(g, base, "QuantizeLinear", qin, 3, vq, -1) < 0) return -1;
    if (q_add_node(g, base, "DequantizeLinear", din, 3, vd, -1) < 0) return -1;
    return vd;
}

/* Put g's nodes in topological order and recompute producers. */
static eng_status q_reorder(eng_graph *g) {
    int *order = malloc(sizeof(int) * (size_t)(g->nnodes + 1));
    eng_node *nodes = malloc(sizeof(eng_node) * (size_t)(g->nnodes + 1));
    if (!order || !nodes) {
        free(order);
        free(nodes);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    eng_status st = eng_graph_topo_order(g, order);
    if (st == ENG_STATUS_OK) {
        for (int i = 0; i < g->nnodes; i++) nodes[i] = g->nodes[order[i]];
        memcpy(g->nodes, nodes, sizeof(eng_node) * (size_t)g->nnodes);
        eng_graph_index_producers(g);
    }
    free(order);
    free(nodes);
    return st;
}

eng_status eng_quant_rewrite(const eng_graph *g, const eng_quant_plan *p, const eng_quant_opts *o, eng_graph **out) {
    *out = NULL;
    if (o->per_channel && g->opset > 0 && g->opset < 13)
        return eng_err(ENG_STATUS_UNSUPPORTED,
                       "per-channel DequantizeLinear needs opset >= 13; the model has opset %lld (use --per-tensor)",
                       (long long)g->opset);
    eng_graph *ng = eng_graph_clone(g);
    if (!ng) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory copying the graph");
    if (ng->opset > 0 && ng->opset < 10) ng->opset = 10; /* QuantizeLinear's first version; no op changed below 10 */
    unsigned char *done = calloc((size_t)g->nvalues + 1, 1);
    int *deq = malloc(sizeof(int) * (size_t)(g->nvalues + 1));
    eng_status st = done && deq ? ENG_STATUS_OK : eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int v = 0; deq && v < g->nvalues; v++) deq[v] = -1;
    /* the plan's node and value indices are g's, which the clone keeps (new values and nodes are appended) */
    for (int k = 0; st == ENG_STATUS_OK && k < p->nnodes; k++) {
        int w = ng->nodes[p->nodes[k]].inputs[1];
        if (w < 0 || !ng->values[w].init || done[w]) continue;
        done[w] = 1;
        eng_node n = ng->nodes[p->nodes[k]]; /* a copy: q_weight may grow ng->nodes */
        st = q_weight(ng, w, &n, o->per_channel);
    }
    for (int a = 0; st == ENG_STATUS_OK && a < p->nacts; a++) {
        deq[p->acts[a].value] = q_activation(ng, &p->acts[a], p->acts[a].value);
        if (deq[p->acts[a].value] < 0) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    /* every reader of a quantized activation (quantized or not) reads its DequantizeLinear, as in onnxruntime's QDQ
     * models: one quantized form per tensor, so that the load-time fusion finds Q as an op's only consumer; the
     * Q/DQ nodes themselves (appended after g's nodes) and the graph outputs keep the float value */
    for (int i = 0; st == ENG_STATUS_OK && i < g->nnodes; i++) {
        eng_node *n = &ng->nodes[i];
        for (int s = 0; s < n->nin; s++)
            if (n->inputs[s] >= 0 && n->inputs[s] < g->nvalues && deq[n->inputs[s]] >= 0)
                n->inputs[s] = deq[n->inputs[s]];
    }
    if (st == ENG_STATUS_OK) st = q_reorder(ng);
    free(done);
    free(deq);
    if (st != ENG_STATUS_OK) eng_graph_free(&ng);
    *out = ng;
    return st;
}
