/* plan-impl.h - the planner's internals, shared by plan.c (planner and executor) and plan-split.c (batch-parallel
 * execution). Not part of the library's interface. */
#ifndef ENG_PLAN_IMPL_H
#define ENG_PLAN_IMPL_H

#include "../ops/op.h"
#include "plan.h"

enum { VAL_NONE = 0, VAL_INPUT, VAL_CONST, VAL_ARENA, VAL_ALIAS, VAL_DYN };

typedef struct plan_step {
    int node;
    const eng_op_def *def;
    const krn_kernel *kernel;   /* NULL for ALIAS ops */
    void *params;
    void *state;
    int inited;
    unsigned const_mask;
    krn_impl_info *impl;        /* what the kernel's init chose (kernels with describe()), NULL otherwise */
    eng_dtype compute;          /* reduced-precision plans: the dtype this step multiplies in (plan-precision.c) */
    const krn_kernel *dev_kernel; /* plans on a device backend: that backend's kernel of this name, or NULL */
    int on_dev;                 /* placed on the device backend (plan-place.c); else it runs on the CPU */
} plan_step;

/* A copy between the CPU and the device, run before step `step` (nsteps: after the last step). */
typedef struct plan_xfer { int step; int root; int to_dev; } plan_xfer;

typedef struct plan_split plan_split;
typedef struct plan_dyn plan_dyn;

struct eng_plan {
    const eng_graph *g;
    eng_plan_opts opts;
    int nthreads;
    eng_tensor *vals;   /* nvalues */
    int *kind;          /* VAL_* */
    int *root;          /* storage root value */
    plan_step *steps;
    int nsteps;
    int dynamic;        /* shapes inferred per run from step `dyn_from` on */
    int nfolded;
    void **owned;       /* constant buffers created while folding */
    int nowned, capowned;
    void *arena;
    size_t arena_bytes, naive_bytes;
    /* dynamic runs */
    int *uses;          /* remaining readers per value (dynamic) */
    int *nreaders;      /* readers per value incl. graph outputs */
    void **dyn_bufs;    /* per value: buffer allocated in the current dynamic run */
    double *prof_ms;    /* TENSORD_PROFILE=1: time per static step, summed over runs; printed by eng_plan_free */
    int64_t prof_runs;
    plan_split *split;  /* batch-parallel execution (plan-split.c); NULL when the plan runs whole */
    int lowp_steps;     /* steps computing in the plan's reduced precision */
    int lowp_values;    /* activations stored in it */
    /* Device plans (plan-place.c): opts.backend is not a host backend. Each storage root lives on one side
     * (loc: 0 the CPU, 1 the device); a root read on the other side gets a mirror there (mirror[root]), filled by a
     * plan_xfer before its first reader on that side (constants: once, at plan time). */
    const krn_backend *dev;  /* NULL: a host-only plan */
    int device;              /* the device's index */
    krn_ctx *ctx;            /* its execution context (stream) */
    int *loc;                /* per value root */
    void **mirror;           /* per value root: its copy on the other side, or NULL */
    int *mirror_first;       /* per root: step of the xfer that fills the mirror (lifetime start) */
    int *mirror_last;        /* per root: last step reading the mirror (nsteps + 1: to the end of the run) */
    plan_xfer *xfers;        /* sorted by step */
    int nxfers;
    void *dev_arena, *host_mirror_arena;
    size_t dev_arena_bytes, dev_const_bytes;
    void **dev_owned;        /* device constants uploaded at plan time */
    int ndev_owned;
    int dev_steps;           /* steps placed on the device */
    const unsigned char *cpu_only; /* while placing: per node, keep it on the CPU (its device kernel's init failed);
                                    * NULL otherwise (eng_plan_new's set) */
    int init_failed_node;    /* the node whose device kernel's init failed in this attempt, or -1 */
    size_t xfer_bytes;       /* bytes copied per run */
    /* opts.on_ready (plan-ready.c): per graph output the step after which it is final (nsteps: the end of the run),
     * the outputs sorted by it, the next one to report in this run, and the tensors of one report */
    int *ready_step, *ready_order, ready_next;
    eng_tensor *ready_vals;
    int *ext_root;           /* opts.ext_outputs: per graph output, the root written straight into the caller's memory,
                              * or -1 (copied after the run) */
    /* graphs (plan-graph.c) */
    int graph_on;            /* 1: runs after the warm-up capture and then launch a graph */
    const char *graph_off;   /* why not (static text), NULL while graph_on */
    int graph_warm;          /* eager runs made before the capture */
    krn_graph *graph;        /* the captured run, NULL before the capture */
    void *graph_staging;     /* pinned host copies of the inputs, which the graph's copies to the device read */
    size_t *graph_stage_off; /* per xfer (to the device): its offset in graph_staging */
    int graph_captures;
    int64_t graph_launches;
    plan_dyn *dyn;           /* dynamic plans on a device backend: per-run placement (plan-dyn.c); NULL otherwise */
};

/* plan-place.c. plan_place: after shape inference and folding, before precision and memory: place each kernel step
 * on the device where its kernel there supports the call, else the CPU; find the roots each side reads and the
 * copies between. plan_place_memory lays out the device arena and the mirrors and uploads constants;
 * plan_place_data: the data pointer step s must use for value v. */
eng_status plan_place(eng_plan *p);
eng_status plan_place_memory(eng_plan *p);
void *plan_place_data(const eng_plan *p, const plan_step *s, int v);
/* The copies due before step si (nsteps: after the last), from *xi on; *pending set when any was queued. */
eng_status plan_place_xfers(eng_plan *p, int si, int *xi, int *pending);
/* After a device plan's steps (st: how they went): the last copies, the stream drained (also after a failure), then
 * the device kernels' after-run checks (krn_kernel.check). */
eng_status plan_place_finish(eng_plan *p, eng_status st, int *xi, int *pending);
/* Dynamic plans: the device copy of constant v shared through opts.dev_consts (an unchanged graph initializer), else
 * *out NULL. */
eng_status plan_place_shared_const(eng_plan *p, int v, void **out);
/* Whether opts asks for device-resident inputs or outputs. */
int plan_resident_io(const eng_plan *p);
void plan_place_free(eng_plan *p);
/* Lifetime (first, last step) of each root as plan_layout sees it; first[v] = -1 for values no step touches. */
void plan_lifetimes(const eng_plan *p, int *first, int *last);
/* The greedy arena layout over bufs (root, size, first, last set; off filled); returns the arena's bytes. */
typedef struct plan_buf { int root; size_t size, off; int first, last; } plan_buf;
size_t plan_pack(plan_buf *bufs, int nb);
size_t plan_value_size(const eng_plan *p, int v);
/* "node 'name' (Op): " for messages; an unnamed node by the value it writes. */
const char *plan_node_label(const eng_graph *g, const eng_node *n, char *buf, size_t len);

/* plan-dyn.c: dynamic plans on a device backend, each step placed when its shapes are known. setup: at plan time
 * (after the dynamic plan's readers are counted; makes p->dyn and the context); run: a run, after run_dynamic reset the
 * run's host buffers and reader counts; stats: the last run's placement; free: before plan_place_free. */
eng_status plan_dyn_setup(eng_plan *p);
eng_status plan_dyn_run(eng_plan *p);
void plan_dyn_stats(const eng_plan *p, eng_plan_stats *st);
void plan_dyn_free(eng_plan *p);
/* plan.c's helpers for it: check inferred outputs, bytes of value v shaped t. */
eng_status plan_dyn_check_outputs(const eng_node *n, const eng_tensor *out);
size_t plan_dyn_value_bytes(const eng_plan *p, int v, const eng_tensor *t);
/* The host path's pieces, shared by plan.c's run_dynamic and plan-dyn.c: a step whose kernel allocates its outputs
 * (or a sequence alias) run and its buffers taken; host buffers for a step's outputs; a CPU kernel's init / exec /
 * free (with its describe line). No node prefix on errors: callers add it. */
eng_status plan_dyn_take_allocated(eng_plan *p, plan_step *s, const eng_node *n, eng_tensor *in, eng_tensor *outs);
eng_status plan_dyn_host_outputs(eng_plan *p, const eng_node *n, eng_tensor *outs);
eng_status plan_dyn_run_kernel(const eng_plan *p, plan_step *s, eng_tensor *in, eng_tensor *outs);

/* plan-graph.c. plan_graph_setup: at the end of a plan's construction, whether its runs may use a graph.
 * plan_graph_run: at the start of a static run; *done set when the run was made by launching the graph (the result
 * is then the run's), else the caller runs the plan eagerly (warm-up, graphs off, or a capture that just failed).
 * plan_graph_free: before the plan's buffers and kernel state go. */
void plan_graph_setup(eng_plan *p);
eng_status plan_graph_run(eng_plan *p, int *done);
void plan_graph_free(eng_plan *p);
void plan_graph_stats(const eng_plan *p, eng_plan_stats *st);
/* plan-ready.c: opts.on_ready. init (first run) finds each output's last step; after (in the run loop, after step
 * si's kernels were queued) reports the outputs final after si; finish (after a run that succeeded, outputs: what it
 * returns) reports the rest. */
eng_status plan_ready_init(eng_plan *p);
void plan_ready_after(eng_plan *p, int si);
void plan_ready_finish(eng_plan *p, const eng_tensor *outputs);
void plan_ready_free(eng_plan *p);

/* plan-precision.c: choose each step's compute dtype and the activations stored in the reduced one (bf16 / fp16
 * plans), after shape inference and folding, before memory planning. */
eng_status plan_precision(eng_plan *p);


/* The call step s makes now: its tensors as its side holds them (device plans: mirrors where its inputs live on the
 * other side), params, state, context. */
void plan_step_call(const eng_plan *p, const plan_step *s, eng_tensor *in, eng_tensor *out, krn_call *c);
double plan_now_ms(void);

/* in/out: node n's inputs and outputs as the plan holds them now; omitted ones zeroed. */
void plan_node_tensors(const eng_plan *p, const eng_node *n, eng_tensor *in, eng_tensor *out);

/* Arena bytes the static plan's activations need (liveness-based reuse), without allocating. */
eng_status plan_arena_need(eng_plan *p, size_t *bytes);

/* plan-split.c. plan_split_try decides, for a static plan whose shapes are inferred and constants folded but
 * whose memory and kernels are not set up yet, whether to run it as independent sub-batches on separate threads;
 * if so it builds the sub-plans and sets p->split (any failure just leaves p->split NULL). */
void plan_split_try(eng_plan *p, const eng_tensor *inputs);
eng_status plan_split_run(eng_plan *p, const eng_tensor *inputs, eng_tensor *outputs);
void plan_split_free(plan_split *sp);
void plan_split_stats(const eng_plan *p, eng_plan_stats *st);

#endif
