/* train-head.c - `tensord train --replace-head N`: the "new labels, same backbone" case. The classifier that
 * produces the model's first output is swapped for one with N classes, initialised as Keras initialises a Dense
 * layer (Glorot uniform kernel, zero bias), seeded.
 *
 * The head is found from the first graph output back through an optional Softmax / LogSoftmax / Sigmoid (and
 * Identity, Flatten, Reshape to [.., C]-preserving views are not followed: the output's last dim must be C):
 *   Gemm(A, B[, C])                   B is [K, C] (transB = 0) or [C, K] (transB = 1); C is [C], [1, C] or absent
 *   Add(MatMul(A, B), bias) / MatMul  B is [K, C]; bias [C] or [1, C]
 * B and the bias must be float32 initializers used by that node alone (a shared weight is not a head). The new
 * tensors replace them in place; the output values' last dim becomes N. Anything else: an error naming what was
 * found, and the graph is unchanged.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../data/data.h"
#include "train-impl.h"

static int head_node_of(const eng_graph *g, int v) { return v >= 0 ? g->values[v].producer : -1; }

static int head_uses(const eng_graph *g, int v) {
    int k = 0;
    for (int i = 0; i < g->nnodes; i++)
        for (int j = 0; j < g->nodes[i].nin; j++) k += g->nodes[i].inputs[j] == v;
    for (int i = 0; i < g->noutputs; i++) k += g->outputs[i] == v;
    return k;
}

/* A float32 initializer that is not also a graph input and is read once. */
static const eng_tensor *head_param(const eng_graph *g, int v) {
    if (v < 0 || !g->values[v].init || g->values[v].init->dtype != ENG_DTYPE_F32 || head_uses(g, v) != 1) return NULL;
    for (int i = 0; i < g->ninputs; i++)
        if (g->inputs[i] == v) return NULL;
    return g->values[v].init;
}

/* Replace initializer v with a fresh float32 tensor of dims d (ndim nd), filled by fill (NULL: zeros). */
static eng_status head_set(eng_graph *g, int v, int nd, const int64_t *d, eng_rng *r, double limit) {
    eng_tensor *t = calloc(1, sizeof *t);
    if (!t) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    t->dtype = ENG_DTYPE_F32;
    t->ndim = nd;
    memcpy(t->dims, d, (size_t)nd * sizeof *d);
    int64_t n = eng_tensor_numel(t);
    float *w = eng_alloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!w) {
        free(t);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    for (int64_t i = 0; i < n; i++) w[i] = r ? (float)((2.0 * eng_rng_uniform(r) - 1.0) * limit) : 0.0f;
    t->data = w;
    eng_value_set_init(g, v, t);
    g->values[v].dtype = ENG_DTYPE_F32;
    g->values[v].ndim = nd;
    memcpy(g->values[v].dims, d, (size_t)nd * sizeof *d);
    return ENG_STATUS_OK;
}

eng_status trn_replace_head(eng_graph *g, int64_t classes, uint64_t seed) {
    if (classes < 1 || classes > (int64_t)1 << 24)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "--replace-head %lld: classes must be in [1, 2^24]", (long long)classes);
    if (g->noutputs < 1) return eng_err(ENG_STATUS_INVALID_MODEL, "the model has no outputs");
    int out = g->outputs[0], v = out, n = head_node_of(g, v);
    const char *oname = g->values[out].name;
    int chain[4], nchain = 0; /* values from the head's output to the graph output (last dims become `classes`) */
    chain[nchain++] = v;
    if (n >= 0 && (!strcmp(g->nodes[n].op_type, "Softmax") || !strcmp(g->nodes[n].op_type, "LogSoftmax") ||
                   !strcmp(g->nodes[n].op_type, "Sigmoid"))) {
        v = g->nodes[n].inputs[0];
        chain[nchain++] = v;
        n = head_node_of(g, v);
    }
    if (n < 0)
        return eng_err(ENG_STATUS_UNSUPPORTED, "--replace-head: output '%s' is not computed by a classifier layer", oname);
    eng_node *h = &g->nodes[n];
    int wv = -1, bv = -1, transb = 0;
    if (!strcmp(h->op_type, "Gemm") && !h->domain[0]) {
        wv = h->nin > 1 ? h->inputs[1] : -1;
        bv = h->nin > 2 ? h->inputs[2] : -1;
        transb = (int)eng_node_attr_int(h, "transB", 0);
    } else if (!strcmp(h->op_type, "Add") && !h->domain[0] && h->nin == 2) {
        for (int k = 0; k < 2 && wv < 0; k++) {
            int m = head_node_of(g, h->inputs[k]);
            if (m >= 0 && !strcmp(g->nodes[m].op_type, "MatMul") && head_uses(g, h->inputs[k]) == 1) {
                wv = g->nodes[m].inputs[1];
                bv = h->inputs[1 - k];
            }
        }
    } else if (!strcmp(h->op_type, "MatMul") && !h->domain[0]) {
        wv = h->inputs[1];
    }
    const eng_tensor *w = head_param(g, wv), *b = bv >= 0 ? head_param(g, bv) : NULL;
    if (!w || w->ndim != 2 || (bv >= 0 && !b))
        return eng_err(ENG_STATUS_UNSUPPORTED,
                       "--replace-head: output '%s' comes from node '%s' (%s), not a Gemm or MatMul(+Add) layer with a "
                       "2-D float32 weight%s used by it alone", oname, h->name, h->op_type, bv >= 0 ? " and bias" : "");
    int64_t C = transb ? w->dims[0] : w->dims[1], K = transb ? w->dims[1] : w->dims[0];
    if (b && eng_tensor_numel(b) != C)
        return eng_err(ENG_STATUS_UNSUPPORTED, "--replace-head: the bias of '%s' has %lld elements, expected %lld (a "
                       "per-class bias)", h->name, (long long)eng_tensor_numel(b), (long long)C);
    for (int i = 0; i < nchain; i++) {
        const eng_value *cv = &g->values[chain[i]];
        if (cv->ndim > 0 && cv->dims[cv->ndim - 1] > 0 && cv->dims[cv->ndim - 1] != C)
            return eng_err(ENG_STATUS_UNSUPPORTED, "--replace-head: '%s' has last dim %lld, not the head's %lld classes",
                           cv->name, (long long)cv->dims[cv->ndim - 1], (long long)C);
    }
    eng_rng r;
    eng_rng_seed(&r, seed ^ 0x68656164ull); /* "head": not the same stream as the data order */
    double limit = sqrt(6.0 / (double)(K + classes));
    int64_t wd[2] = {transb ? classes : K, transb ? K : classes};
    ENG_TRY(head_set(g, wv, 2, wd, &r, limit));
    if (bv >= 0) {
        int64_t bd[2] = {1, classes};
        int bnd = b->ndim;
        ENG_TRY(head_set(g, bv, bnd, bnd == 2 ? bd : bd + 1, NULL, 0));
    }
    for (int i = 0; i < nchain; i++) {
        eng_value *cv = &g->values[chain[i]];
        if (cv->ndim > 0) cv->dims[cv->ndim - 1] = classes;
    }
    return ENG_STATUS_OK;
}
