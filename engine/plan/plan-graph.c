/* plan-graph.c - device plans replayed as graphs (CUDA Graphs; the sim test device's recordings).
 *
 * A static device plan whose every kernel step runs on the device queues the same kernels with the same pointers on
 * every run: its activations and mirrors live in one fixed device arena, its outputs come back into one fixed pinned
 * host buffer, and only the inputs change. Such a plan runs its first run eagerly (kernels' first execs, workspace
 * growth, library algorithm choices), captures the second (inputs copied first into fixed pinned staging, which the
 * captured copies read; outputs copied into the host mirrors) and launches the captured graph for that run and every
 * later one: one launch and one sync per request instead of a launch per kernel.
 *
 * Eligible (plan_graph_setup decides once, at plan time; eng_plan_stats.graph_off says why not):
 *  - the backend has graphs (krn_backend_has_graphs: CUDA, sim), and neither TENSORD_CUDA_GRAPHS=0 nor
 *    opts.no_graphs turns them off;
 *  - the plan is static (shapes fixed at plan time) and has at least one step on the device;
 *  - every kernel step runs on the device: a CPU fallback step needs the host to wait mid-run;
 *  - no device step has a `check` hook (an after-run validation that reads what the run left; kept eager);
 *  - no op is random (ENG_OP_RANDOM: a new draw per run, which a replay would repeat);
 *  - no device-resident inputs or outputs (opts.dev_inputs / dev_outputs: the trainer's plans, whose pointers are
 *    the caller's and may change from run to run);
 *  - no opts.on_ready (its callbacks run between the steps of an eager run; a replay would skip them);
 *  - not profiled (TENSORD_PROFILE times each step eagerly);
 *  - every copy to the device is of a graph input (from staging) and every copy from it comes after the last step.
 * A capture that fails (a kernel that must allocate or synchronise in exec, a workspace that must grow, a launch
 * error) is discarded, the context left usable, one stderr line says why, and the plan runs eagerly from then on:
 * that run included, from the start (nothing ran while capturing), so its result is the eager one. A graph launch
 * that fails before its work is queued does the same. A fault of the launched work surfaces at the run's sync, as an
 * eager run's does, and fails that run only.
 *
 * The graph holds the steps' params and state pointers and the arena, mirror and staging addresses: it is freed in
 * eng_plan_free after the context is synchronised and before any of them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan-impl.h"

#define PLAN_GRAPH_WARMUP 1 /* eager runs before the capture */

/* Why graphs are off for p (static text), or NULL when they can be used. */
static const char *graph_why_not(const eng_plan *p) {
    if (!p->dev || !p->dev_steps) return "not a device plan";
    if (!krn_backend_has_graphs(p->dev)) return "the backend has no graphs";
    const char *env = getenv("TENSORD_CUDA_GRAPHS");
    if (env && strcmp(env, "0") == 0) return "turned off by TENSORD_CUDA_GRAPHS=0";
    if (p->opts.no_graphs) return "turned off by the plan's options";
    if (p->dynamic) return "shapes known only at run time";
    if (p->split) return "run as sub-batches";
    if (plan_resident_io(p)) return "device-resident inputs or outputs";
    if (p->opts.on_ready) return "outputs reported during the run (opts.on_ready)";
    if (p->prof_ms) return "profiled (TENSORD_PROFILE)";
    for (int si = 0; si < p->nsteps; si++) {
        const plan_step *s = &p->steps[si];
        if (s->def && (s->def->flags & ENG_OP_RANDOM)) return "a random op (a new draw per run)";
        if (!s->kernel) continue;
        if (!s->on_dev) return "steps on the CPU";
        if (s->kernel->check) return "a device step with an after-run check";
    }
    for (int i = 0; i < p->nxfers; i++) {
        const plan_xfer *x = &p->xfers[i];
        if (x->to_dev && p->kind[x->root] != VAL_INPUT) return "a copy to the device of a value computed on the CPU";
        if (!x->to_dev && x->step != p->nsteps) return "a copy from the device before the last step";
    }
    return NULL;
}

void plan_graph_setup(eng_plan *p) {
    p->graph_off = graph_why_not(p);
    p->graph_on = p->graph_off == NULL;
}

/* Turns graphs off for p from now on, saying so once on stderr with the error (msg) that caused it. */
static void graph_off(eng_plan *p, const char *what, const char *msg) {
    p->graph_on = 0;
    p->graph_off = what;
    fprintf(stderr, "tensord: plan on %s:%d: %s; running it eagerly from now on: %s\n", krn_backend_name(p->dev),
            p->device, what, msg);
}

/* Pinned host staging for every input copied to the device: one block, an offset per such copy (xfer index). */
static eng_status staging_alloc(eng_plan *p) {
    p->graph_stage_off = calloc((size_t)p->nxfers + 1, sizeof *p->graph_stage_off);
    if (!p->graph_stage_off) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory for graph staging offsets");
    size_t total = 0;
    for (int i = 0; i < p->nxfers; i++) {
        if (!p->xfers[i].to_dev) continue;
        p->graph_stage_off[i] = total;
        total += (eng_tensor_nbytes(&p->vals[p->xfers[i].root]) + 63) & ~(size_t)63;
    }
    ENG_TRY(krn_host_alloc(p->dev, total ? total : 64, &p->graph_staging));
    return ENG_STATUS_OK;
}

/* Alias steps: their outputs' data as their roots' now (host bookkeeping, done on every run). */
static void graph_aliases(eng_plan *p) {
    for (int si = 0; si < p->nsteps; si++) {
        const plan_step *s = &p->steps[si];
        if (s->kernel) continue;
        const eng_node *n = &p->g->nodes[s->node];
        p->vals[n->outputs[0]].data = p->vals[n->inputs[0]].data;
    }
}

/* The copies due before step si, queued (recorded) from staging for inputs, into the host mirrors for outputs. */
static eng_status graph_xfers(eng_plan *p, int si, int *xi) {
    for (; *xi < p->nxfers && p->xfers[*xi].step == si; (*xi)++) {
        const plan_xfer *x = &p->xfers[*xi];
        int r = x->root;
        size_t nb = eng_tensor_nbytes(&p->vals[r]);
        if (!nb) continue;
        eng_status st = x->to_dev
                            ? krn_buf_set(p->dev, p->ctx, p->mirror[r], (char *)p->graph_staging + p->graph_stage_off[*xi], nb)
                            : krn_buf_get(p->dev, p->ctx, p->mirror[r], p->vals[r].data, nb);
        if (st != ENG_STATUS_OK)
            return eng_err_prefix(st, "copying '%s' (%zu bytes) %s: ", p->g->values[r].name, nb,
                                  x->to_dev ? "to the device" : "from the device");
    }
    return ENG_STATUS_OK;
}

/* The whole run's device work, queued on p->ctx (while capturing: recorded). */
static eng_status graph_queue(eng_plan *p) {
    const eng_graph *g = p->g;
    eng_tensor in[ENG_OP_MAX_IO], outs[ENG_OP_MAX_IO];
    char lb[300];
    int xi = 0;
    for (int si = 0; si < p->nsteps; si++) {
        plan_step *s = &p->steps[si];
        const eng_node *n = &g->nodes[s->node];
        ENG_TRY(graph_xfers(p, si, &xi));
        if (!s->kernel) {
            p->vals[n->outputs[0]].data = p->vals[n->inputs[0]].data;
            continue;
        }
        krn_call c;
        plan_step_call(p, s, in, outs, &c);
        eng_status st = s->kernel->exec(&c);
        if (st != ENG_STATUS_OK) return eng_err_prefix(st, "%s", plan_node_label(g, n, lb, sizeof lb));
    }
    return graph_xfers(p, p->nsteps, &xi);
}

/* Captures p's run into p->graph; on failure nothing ran, the capture is discarded and the context usable. */
static eng_status graph_capture(eng_plan *p) {
    ENG_TRY(krn_graph_begin(p->dev, p->ctx));
    eng_status st = graph_queue(p);
    if (st != ENG_STATUS_OK) {
        char why[768];
        snprintf(why, sizeof why, "%s", eng_last_error());
        (void)krn_graph_end(p->dev, p->ctx, NULL);
        return eng_err(st, "%s", why);
    }
    return krn_graph_end(p->dev, p->ctx, &p->graph);
}

eng_status plan_graph_run(eng_plan *p, int *done) {
    *done = 0;
    if (!p->graph_on) return ENG_STATUS_OK;
    if (p->graph_warm < PLAN_GRAPH_WARMUP) {
        p->graph_warm++;
        return ENG_STATUS_OK; /* eager */
    }
    eng_status st = krn_ctx_enter(p->dev, p->ctx);
    if (st != ENG_STATUS_OK) return ENG_STATUS_OK; /* the eager run reports it */
    if (!p->graph) {
        if (!p->graph_staging && (st = staging_alloc(p)) != ENG_STATUS_OK) {
            graph_off(p, "no pinned staging for a graph", eng_last_error());
            return ENG_STATUS_OK;
        }
        if ((st = graph_capture(p)) != ENG_STATUS_OK) {
            graph_off(p, "graph capture failed", eng_last_error());
            return ENG_STATUS_OK;
        }
        p->graph_captures++;
    }
    graph_aliases(p);
    for (int i = 0; i < p->nxfers; i++) { /* this run's inputs, where the graph reads them */
        const plan_xfer *x = &p->xfers[i];
        size_t nb = eng_tensor_nbytes(&p->vals[x->root]);
        if (x->to_dev && nb) memcpy((char *)p->graph_staging + p->graph_stage_off[i], p->vals[x->root].data, nb);
    }
    st = krn_graph_launch(p->dev, p->ctx, p->graph);
    if (st != ENG_STATUS_OK) {
        char why[768];
        snprintf(why, sizeof why, "%s", eng_last_error());
        (void)krn_ctx_sync(p->dev, p->ctx); /* whatever it queued, before the graph goes */
        krn_graph_free(p->dev, &p->graph);
        graph_off(p, "graph launch failed", why);
        return ENG_STATUS_OK;
    }
    p->graph_launches++;
    *done = 1;
    int xi = p->nxfers, pending = 1;
    return plan_place_finish(p, ENG_STATUS_OK, &xi, &pending);
}

void plan_graph_free(eng_plan *p) {
    if (p->graph) {
        (void)krn_ctx_sync(p->dev, p->ctx);
        krn_graph_free(p->dev, &p->graph);
    }
    if (p->graph_staging) krn_host_free(p->dev, p->graph_staging);
    p->graph_staging = NULL;
    free(p->graph_stage_off);
    p->graph_stage_off = NULL;
}

void plan_graph_stats(const eng_plan *p, eng_plan_stats *st) {
    st->graphs = p->graph_on;
    st->graph_off = p->dev_steps ? p->graph_off : NULL;
    st->graph_captures = p->graph_captures;
    st->graph_launches = p->graph_launches;
}
