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
} plan_step;

typedef struct plan_split plan_split;

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
};

/* plan-precision.c: choose each step's compute dtype and the activations stored in the reduced one (bf16 / fp16
 * plans), after shape inference and folding, before memory planning. */
eng_status plan_precision(eng_plan *p);


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
