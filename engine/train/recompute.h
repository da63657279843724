/* recompute.h - gradient checkpointing over a graph with its backward pass (recompute.c). */
#ifndef ENG_RECOMPUTE_H
#define ENG_RECOMPUTE_H

#include "../ir/graph.h"

typedef struct eng_recompute_stats {
    int segments; /* forward segments whose activations the backward pass recomputes */
    int nodes;    /* forward nodes copied into the backward pass */
} eng_recompute_stats;

/* g: the forward pass in nodes [0, nfwd), the backward pass (eng_autodiff's) after it. Rewrites g in place so that
 * the backward pass recomputes, segment by segment, the activations it reads (see recompute.c); values and
 * gradients are unchanged. A graph too small to segment is left as it is. */
eng_status eng_graph_recompute(eng_graph *g, int nfwd, eng_recompute_stats *stats);

#endif
