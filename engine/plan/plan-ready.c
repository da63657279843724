/* plan-ready.c - which step finishes which graph output (eng_plan_opts.on_ready).
 *
 * A static device plan reports, while it runs, the graph outputs that no later step touches: output i is final after
 * the last kernel step (aliases run nothing) that writes or reads a value sharing its storage root, provided the output is
 * returned in the memory that step wrote (its root lives on the side opts.dev_outputs asks for; else it is copied
 * after the last step). A trainer uses it to start a gradient's all-reduce while the backward pass goes on. Every
 * other output (copied at the end, an input or a constant, or any output of a dynamic, batch-split or host-only plan)
 * is reported once after the run's last step, with the plan's context drained.
 *
 * Invariants: ready_order lists every output once, sorted by ready_step (nsteps: the end); ready_next is the first
 * entry not yet reported in the current run (eng_plan_run resets it). Alias outputs share their root's bytes from
 * its start, so an output's memory is known before the alias step that names it runs.
 */
#include <stdlib.h>
#include <string.h>

#include "plan-impl.h"

eng_status plan_ready_init(eng_plan *p) {
    const eng_graph *g = p->g;
    int no = g->noutputs;
    int *last = malloc(((size_t)g->nvalues + 1) * sizeof *last);
    p->ready_step = malloc(((size_t)no + 1) * sizeof *p->ready_step);
    p->ready_order = malloc(((size_t)no + 1) * sizeof *p->ready_order);
    p->ready_vals = calloc((size_t)no + 1, sizeof *p->ready_vals);
    if (!last || !p->ready_step || !p->ready_order || !p->ready_vals) {
        free(last);
        plan_ready_free(p);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory for the plan's output-ready table");
    }
    for (int v = 0; v < g->nvalues; v++) last[v] = -1;
    int stepwise = p->dev_steps > 0 && !p->dynamic && !p->split;
    for (int si = 0; stepwise && si < p->nsteps; si++) {
        const eng_node *n = &g->nodes[p->steps[si].node];
        if (!p->steps[si].kernel) continue; /* an alias (autodiff's Identity naming grad/<p>) queues no work */
        for (int i = 0; i < n->nin; i++)
            if (n->inputs[i] >= 0) last[p->root[n->inputs[i]]] = si;
        for (int i = 0; i < n->nout; i++)
            if (n->outputs[i] >= 0) last[p->root[n->outputs[i]]] = si;
    }
    for (int i = 0; i < no; i++) {
        int v = g->outputs[i], r = p->root[v];
        int want = p->opts.dev_outputs && p->opts.dev_outputs[i];
        int s = stepwise && p->kind[r] == VAL_ARENA && p->loc[r] == want ? last[r] : -1;
        p->ready_step[i] = s >= 0 ? s : p->nsteps;
    }
    free(last);
    /* stable sort by ready step (outputs are few: insertion) */
    for (int i = 0; i < no; i++) {
        int j = i;
        while (j > 0 && p->ready_step[p->ready_order[j - 1]] > p->ready_step[i]) {
            p->ready_order[j] = p->ready_order[j - 1];
            j--;
        }
        p->ready_order[j] = i;
    }
    p->ready_next = 0;
    return ENG_STATUS_OK;
}

/* Report the entries from ready_next whose step is <= si (nsteps: all; then outputs holds the run's outputs). */
static void ready_report(eng_plan *p, int si, const eng_tensor *outputs) {
    const eng_graph *g = p->g;
    int from = p->ready_next, n = 0;
    while (p->ready_next < g->noutputs && p->ready_step[p->ready_order[p->ready_next]] <= si) {
        int i = p->ready_order[p->ready_next++];
        eng_tensor t = outputs ? outputs[i] : p->vals[g->outputs[i]];
        if (!outputs) t.data = p->vals[p->root[g->outputs[i]]].data; /* an alias's step may not have run yet */
        p->ready_vals[n++] = t;
    }
    if (n) p->opts.on_ready(p->opts.ready_arg, outputs ? NULL : p->ctx, p->ready_order + from, p->ready_vals, n);
}

void plan_ready_after(eng_plan *p, int si) {
    if (si < p->nsteps) ready_report(p, si, NULL);
}

void plan_ready_finish(eng_plan *p, const eng_tensor *outputs) { ready_report(p, p->nsteps, outputs); }

void plan_ready_free(eng_plan *p) {
    free(p->ready_step);
    free(p->ready_order);
    free(p->ready_vals);
    p->ready_step = p->ready_order = NULL;
    p->ready_vals = NULL;
}
