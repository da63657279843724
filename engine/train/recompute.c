/* recompute.c - gradient checkpointing (tensord train --recompute): the backward pass recomputes the forward
 * activations it reads instead of keeping them from the forward pass, one segment of the forward at a time.
 *
 * After eng_autodiff, nodes [0, nfwd) are the forward pass and the rest the backward pass. The forward nodes are cut
 * into about sqrt(nfwd) segments of consecutive nodes. For each segment but the last (whose activations the backward
 * pass starts with), the activations it produced that backward
 * nodes read are computed again by copies of the segment's nodes that lead to them, placed just before the first
 * backward node that reads one, and the backward nodes read the copies. The copies read what comes from outside
 * their segment (earlier segments' values, the inputs, the weights) as it is: those values are the checkpoints, kept
 * from the forward pass until their segment's copies have run; everything else a segment made dies inside the
 * forward pass. The plan keeps the node list's order (eng_graph_topo_order) and lays activations out by liveness, so
 * the activation memory of the backward pass is about the checkpoints plus one segment's activations, for about one
 * more forward pass of compute.
 *
 * Not recomputed (the backward nodes read the original): the outputs of random ops (training Dropout's mask must be
 * the one the forward pass drew) and of nodes with subgraphs. BatchNormalization in training mode is recomputed: the
 * same batch gives the same statistics; the copy's running-statistic outputs are left unread.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../ops/op.h"
#include "recompute.h"

static int recomputable(const eng_node *n) {
    for (int a = 0; a < n->nattr; a++)
        if (n->attrs[a].type == ENG_ATTR_GRAPH) return 0;
    const eng_op_def *d = eng_op_find(n->domain, n->op_type);
    return d && !(d->flags & ENG_OP_RANDOM);
}

/* A copy of node `src` appended to g, reading the copies (map: value -> copy, -1 none) of what its own segment made
 * and the originals of the rest, and writing fresh values "<name>/recompute" recorded in map. */
static eng_status clone_node(eng_graph *g, int src, const int *seg, int *map) {
    const eng_node *s = &g->nodes[src];
    int nin = s->nin, nout = s->nout;
    int *in = malloc(((size_t)nin + 1) * sizeof *in), *out = malloc(((size_t)nout + 1) * sizeof *out);
    eng_status st = in && out ? ENG_STATUS_OK : eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; st == ENG_STATUS_OK && i < nin; i++) {
        int v = g->nodes[src].inputs[i], p = v >= 0 ? g->values[v].producer : -1;
        in[i] = p >= 0 && seg[p] == seg[src] && map[v] >= 0 ? map[v] : v;
    }
    char name[4200];
    for (int o = 0; st == ENG_STATUS_OK && o < nout; o++) {
        int v = g->nodes[src].outputs[o];
        out[o] = -1;
        if (v < 0) continue;
        snprintf(name, sizeof name, "%s/recompute", g->values[v].name);
        int nv = eng_graph_find_value(g, name) < 0 ? eng_graph_add_value(g, name) : -1;
        if (nv < 0) {
            st = eng_err(ENG_STATUS_INTERNAL, "recompute: cannot add value '%s'", name);
            break;
        }
        eng_value *d = &g->values[nv], *from = &g->values[v];
        d->dtype = from->dtype;
        d->ndim = from->ndim;
        memcpy(d->dims, from->dims, sizeof d->dims);
        out[o] = map[v] = nv;
    }
    int k = -1;
    if (st == ENG_STATUS_OK) {
        snprintf(name, sizeof name, "%s/recompute", g->nodes[src].name);
        k = eng_graph_add_node(g, name, g->nodes[src].op_type, g->nodes[src].domain, in, nin, out, nout);
        if (k < 0) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    if (st == ENG_STATUS_OK) g->nodes[k].nimplicit = g->nodes[src].nimplicit;
    for (int a = 0; st == ENG_STATUS_OK && a < g->nodes[src].nattr; a++)
        st = eng_node_add_attr(g, k, &g->nodes[src].attrs[a]);
    free(in);
    free(out);
    return st;
}

eng_status eng_graph_recompute(eng_graph *g, int nfwd, eng_recompute_stats *stats) {
    memset(stats, 0, sizeof *stats);
    int nn = g->nnodes, nv = g->nvalues;
    if (nfwd < 4 || nfwd >= nn) return ENG_STATUS_OK; /* nothing worth segmenting, or no backward pass */
    eng_graph_index_producers(g);
    int nseg = (int)ceil(sqrt((double)nfwd));
    int *seg = malloc((size_t)nn * sizeof *seg), *first = malloc((size_t)nseg * sizeof *first);
    unsigned char *need = calloc((size_t)nfwd, 1), *redo = calloc((size_t)nv, 1);
    int *map = malloc((size_t)nv * 4 * sizeof *map + sizeof *map); /* grows with the copies' values (below) */
    int *place = NULL;
    eng_status st = seg && first && need && redo && map ? ENG_STATUS_OK : eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int n = 0; st == ENG_STATUS_OK && n < nn; n++) seg[n] = n < nfwd ? (int)((int64_t)n * nseg / nfwd) : -1;
    for (int s = 0; st == ENG_STATUS_OK && s < nseg; s++) first[s] = nn;
    /* activations the backward pass reads, made by a recomputable forward node; the first reader per segment */
    for (int b = nfwd; st == ENG_STATUS_OK && b < nn; b++)
        for (int i = 0; i < g->nodes[b].nin; i++) {
            int v = g->nodes[b].inputs[i], p = v >= 0 ? g->values[v].producer : -1;
            if (p < 0 || p >= nfwd || !recomputable(&g->nodes[p])) continue;
            if (seg[p] == nseg - 1) continue; /* the last segment's activations are about to be read anyway */
            redo[v] = 1;
            if (first[seg[p]] > b) first[seg[p]] = b;
        }
    /* the nodes each segment copies: those in the segment that lead to its recomputed values (within it) */
    for (int n = nfwd - 1; st == ENG_STATUS_OK && n >= 0; n--) {
        const eng_node *x = &g->nodes[n];
        for (int o = 0; o < x->nout && !need[n]; o++) need[n] = x->outputs[o] >= 0 && redo[x->outputs[o]];
        if (!need[n] || !recomputable(x)) {
            need[n] = 0;
            continue;
        }
        for (int i = 0; i < x->nin; i++) {
            int v = x->inputs[i], p = v >= 0 ? g->values[v].producer : -1;
            if (p >= 0 && p < nfwd && seg[p] == seg[n] && recomputable(&g->nodes[p])) redo[v] = 1;
        }
    }
    for (int v = 0; st == ENG_STATUS_OK && v < nv * 4; v++) map[v] = -1;
    /* the copies, appended segment by segment; place[k]: the backward node they go before */
    if (st == ENG_STATUS_OK && !(place = malloc(((size_t)nfwd + 1) * sizeof *place)))
        st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    int ncopies = 0;
    for (int n = 0; st == ENG_STATUS_OK && n < nfwd; n++) {
        if (!need[n] || first[seg[n]] >= nn) continue;
        if (g->nvalues + g->nodes[n].nout > nv * 4) break; /* map is full: the rest keeps its activations */
        st = clone_node(g, n, seg, map);
        if (st == ENG_STATUS_OK) place[ncopies++] = first[seg[n]];
    }
    /* backward nodes read the copies */
    for (int b = nfwd; st == ENG_STATUS_OK && b < nn; b++)
        for (int i = 0; i < g->nodes[b].nin; i++) {
            int v = g->nodes[b].inputs[i];
            if (v >= 0 && v < nv && map[v] >= 0) g->nodes[b].inputs[i] = map[v];
        }
    /* order: the forward pass, then each backward node preceded by the copies placed before it (in their order) */
    if (st == ENG_STATUS_OK && ncopies > 0) {
        eng_node *nodes = malloc((size_t)g->nnodes * sizeof *nodes);
        if (!nodes) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
        if (st == ENG_STATUS_OK) {
            int k = 0, c = 0;
            for (int n = 0; n < nfwd; n++) nodes[k++] = g->nodes[n];
            for (int b = nfwd; b < nn; b++) {
                for (c = 0; c < ncopies; c++)
                    if (place[c] == b) nodes[k++] = g->nodes[nn + c];
                nodes[k++] = g->nodes[b];
            }
            memcpy(g->nodes, nodes, (size_t)k * sizeof *nodes);
            free(nodes);
            eng_graph_index_producers(g);
        }
        int segs = 0;
        for (int s = 0; s < nseg; s++) segs += first[s] < nn;
        stats->segments = segs;
        stats->nodes = ncopies;
    }
    free(seg);
    free(first);
    free(need);
    free(redo);
    free(map);
    free(place);
    return st;
}
