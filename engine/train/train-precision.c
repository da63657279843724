/* train-precision.c - mixed-precision training's "output layer stays fp32" (the Keras mixed_bfloat16 policy with
 * dtype='float32' on the last layer): which nodes of a training (or validation) graph make up the output layer.
 *
 * The output layer is the last compute node (Conv, ConvTranspose, MatMul, Gemm) on every path back from the
 * model's prediction, walking through everything else (Softmax, bias Add, Reshape ...). Its backward nodes are
 * the compute nodes that read its weights (dX = dY W^T, MatMulGrad, ConvGrad) and the last compute node before
 * each gradient output "grad/<weight>" of those weights (Gemm's dW = X^T dY reads no weight). The plan keeps
 * these nodes fp32 (eng_plan_opts.fp32_nodes); the loss, softmax and every non-compute op are fp32 anyway.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train-impl.h"

static int is_compute(const eng_node *n) {
    static const char *ops[] = {"Conv", "ConvTranspose", "MatMul", "Gemm", "FusedConv", "FusedMatMul", "FusedGemm"};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (strcmp(n->op_type, ops[i]) == 0) return 1;
    return 0;
}

/* Mark (in mark[]) the last compute node on every path back from value v. */
static void walk_back(const eng_graph *g, int v, char *mark, char *seen) {
    if (v < 0 || seen[v]) return;
    seen[v] = 1;
    int pr = g->values[v].producer;
    if (pr < 0) return;
    const eng_node *n = &g->nodes[pr];
    if (is_compute(n)) {
        mark[pr] = 1;
        return;
    }
    for (int i = 0; i < n->nin; i++) walk_back(g, n->inputs[i], mark, seen);
}

static int value_by_name(const eng_graph *g, const char *name) {
    for (int v = 0; v < g->nvalues; v++)
        if (g->values[v].name && strcmp(g->values[v].name, name) == 0) return v;
    return -1;
}

void trn_fp32_nodes_free(trn_fp32_nodes *f) {
    for (int i = 0; i < f->n; i++) free(f->names[i]);
    free(f->names);
    memset(f, 0, sizeof *f);
}

eng_status trn_output_layer_nodes(const eng_graph *g, const char *pred, trn_fp32_nodes *out) {
    memset(out, 0, sizeof *out);
    int p = value_by_name(g, pred);
    if (p < 0) return eng_err(ENG_STATUS_INTERNAL, "the graph has no prediction value '%s'", pred);
    char *mark = calloc((size_t)g->nnodes + 1, 1), *seen = calloc((size_t)g->nvalues + 1, 1);
    char *isw = calloc((size_t)g->nvalues + 1, 1);
    if (!mark || !seen || !isw) {
        free(mark), free(seen), free(isw);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    walk_back(g, p, mark, seen);
    /* the head's weights: every operand of a head node but its data input */
    for (int i = 0; i < g->nnodes; i++)
        if (mark[i])
            for (int k = 1; k < g->nodes[i].nin; k++)
                if (g->nodes[i].inputs[k] >= 0) isw[g->nodes[i].inputs[k]] = 1;
    for (int i = 0; i < g->nnodes; i++) {
        const eng_node *n = &g->nodes[i];
        if (!is_compute(n) && strstr(n->op_type, "Grad") == NULL) continue;
        for (int k = 0; k < n->nin; k++)
            if (n->inputs[k] >= 0 && isw[n->inputs[k]]) mark[i] = 1;
    }
    char nm[600];
    for (int v = 0; v < g->nvalues; v++) {
        if (!isw[v] || !g->values[v].name) continue;
        snprintf(nm, sizeof nm, "grad/%s", g->values[v].name);
        int gv = value_by_name(g, nm);
        if (gv >= 0) {
            memset(seen, 0, (size_t)g->nvalues + 1);
            walk_back(g, gv, mark, seen);
        }
    }
    int cnt = 0;
    for (int i = 0; i < g->nnodes; i++) cnt += mark[i];
    eng_status st = ENG_STATUS_OK;
    out->names = calloc((size_t)cnt + 1, sizeof *out->names);
    if (!out->names) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; st == ENG_STATUS_OK && i < g->nnodes; i++)
        if (mark[i]) {
            if (!(out->names[out->n] = strdup(g->nodes[i].name ? g->nodes[i].name : ""))) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
            else out->n++;
        }
    free(mark), free(seen), free(isw);
    if (st != ENG_STATUS_OK) trn_fp32_nodes_free(out);
    return st;
}
