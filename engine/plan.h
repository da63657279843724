/* plan.h - a compiled plan: one graph, one set of input shapes, one backend and precision.
 *
 * eng_plan_new runs shape inference for the given input shapes, folds every node whose inputs are all known
 * at plan time (initializers, Constant, shape arithmetic such as Shape -> Gather -> Concat -> Reshape), prepares
 * each remaining node's kernel once, and lays out every intermediate tensor in ONE arena with liveness-based
 * reuse. Running it only executes kernels. When some output shape depends on a runtime value (a Reshape whose
 * shape is a graph input, NonZero, ...) the plan is "dynamic": it re-infers shapes and allocates per run.
 *
 * A plan is not reentrant: one run at a time (eng_session serialises). It borrows the graph, which must
 * outlive it.
 */
#ifndef ENG_PLAN_H
#define ENG_PLAN_H

#include "graph.h"
#include "../kernels/kernel.h"

typedef enum eng_precision {
    ENG_PRECISION_FP32 = 0,
    ENG_PRECISION_FP16 = 1,
    ENG_PRECISION_BF16 = 2,
    ENG_PRECISION_INT8 = 3,
} eng_precision;

typedef struct eng_plan_opts {
    const krn_backend *backend; /* NULL: CPU */
    int nthreads;               /* <= 0: all cores */
    eng_precision precision;
} eng_plan_opts;

typedef struct eng_plan eng_plan;

typedef struct eng_plan_stats {
    int nodes;          /* nodes in the graph */
    int steps;          /* kernels run per execution */
    int folded;         /* nodes computed at plan time */
    int dynamic;        /* 1 if shapes are inferred per run */
    size_t arena_bytes; /* activations arena (static plans) */
    size_t naive_bytes; /* sum of all intermediate sizes without reuse */
} eng_plan_stats;

/* inputs: g->ninputs tensors in g->inputs order giving dtype and shape (data ignored); an entry with dtype
 * UNDEFINED means "not fed" (allowed only for initializers listed as inputs). */
eng_status eng_plan_new(const eng_graph *g, const eng_plan_opts *opts, const eng_tensor *inputs, eng_plan **out);

/* inputs as in eng_plan_new, now with data, same dtypes and shapes. outputs: g->noutputs views into memory
 * owned by the plan, valid until the next run or eng_plan_free. */
eng_status eng_plan_run(eng_plan *p, const eng_tensor *inputs, eng_tensor *outputs);

void eng_plan_get_stats(const eng_plan *p, eng_plan_stats *st);

void eng_plan_free(eng_plan **p);

#endif
