/* plan.h - a compiled plan: one graph, one set of input shapes, one backend and precision.
 *
 * eng_plan_new runs shape inference for the given input shapes, folds every node whose inputs are all known
 * at plan time (initializers, Constant, shape arithmetic such as Shape -> Gather -> Concat -> Reshape), prepares
 * each remaining node's kernel once, and lays out every intermediate tensor in ONE arena with liveness-based
 * reuse. Running it only executes kernels. When some output shape depends on a runtime value (a Reshape whose
 * shape is a graph input, NonZero, ...) the plan is "dynamic": it re-infers shapes and allocates per run.
 *
 * Batch-parallel execution: with nthreads > 1 and a batch of N > 1 (axis 0 of the first input whose first dim
 * is symbolic, else of the first input with a first dim >= 2), a static plan whose every node keeps the
 * rows of its batch dimension independent (convolutions, pooling, per-row matmuls, eltwise, softmax over other
 * axes ...; proven op by op, see plan-split.c) is run as sub-batches: each thread runs its own single-threaded
 * sub-plan over its share of the rows, sized so one sub-batch's activations stay in the core's L2 cache.
 * No thread waits on another between layers. Set TENSORD_BATCH_SPLIT=0 (or opts.no_split) to turn it off;
 * TENSORD_SPLIT_ROWS=R (or opts.split_rows) forces R rows per sub-batch wherever a split is correct (tests).
 *
 * A plan is not reentrant: one run at a time (eng_session serialises). It borrows the graph, which must
 * outlive it.
 */
#ifndef ENG_PLAN_H
#define ENG_PLAN_H

#include "../ir/graph.h"
#include "../../kernels/kernel.h"

typedef enum eng_precision {
    ENG_PRECISION_FP32 = 0,
    ENG_PRECISION_FP16 = 1,
    ENG_PRECISION_BF16 = 2,
    ENG_PRECISION_INT8 = 3,
} eng_precision;

const char *eng_precision_name(eng_precision p); /* "fp32", "fp16", "bf16", "int8" */
eng_status eng_precision_parse(const char *s, eng_precision *out);

/* Precision (eng_plan_opts.precision) is a plan property. fp32: every step in its tensors' dtypes. bf16 / fp16:
 * convolutions and matmuls compute in the reduced dtype with fp32 accumulation, weights converted once, and
 * activations between such steps stored in it; softmax, normalisation, losses, eltwise ops and the graph outputs
 * stay fp32 (plan-precision.c). int8: the model's quantized nodes run int8 kernels (requires a quantized model).
 *
 * Sub-plans of batch-parallel plans (below), shared by every plan built with the same cache: the chunk plan
 * for R rows serves every batch size that splits into R-row chunks, so the batch sizes 1..64 a dynamic batcher
 * produces compile a few sub-plans instead of one whole plan each. Not thread-safe: plans that share a cache
 * must run one at a time (an eng_session serialises its runs). Free it after every plan that used it. */
typedef struct eng_plan_cache eng_plan_cache;
eng_plan_cache *eng_plan_cache_new(void);
void eng_plan_cache_free(eng_plan_cache **c);
int eng_plan_cache_size(const eng_plan_cache *c); /* sub-plans held */

/* Device plans: a model's weights uploaded once per device and shared by every plan that reads them (one per batch
 * size under dynamic batching), instead of one copy per plan. Keyed by the graph initializer's host memory, which
 * must outlive the cache (a session's graph). Not thread-safe, like the plan cache: plans sharing one run one at a
 * time. Free it after every plan that used it. */
typedef struct eng_dev_consts eng_dev_consts;
eng_dev_consts *eng_dev_consts_new(const krn_backend *b, int device);
void eng_dev_consts_free(eng_dev_consts **c);
size_t eng_dev_consts_bytes(const eng_dev_consts *c); /* device bytes it holds */

typedef struct eng_plan_opts {
    const krn_backend *backend; /* NULL: CPU. A device backend (CUDA, sim): each step runs there where the backend
                                 * supports it, else on the CPU, with counted copies between (plan-place.c) */
    int device;                 /* index of the backend's device */
    int nthreads;               /* <= 0: all cores */
    eng_precision precision;
    int no_split;               /* 1: never run as parallel sub-batches (see below) */
    int split_rows;             /* > 0: rows per sub-batch when the plan can split (tests); 0: chosen by cache size */
    eng_plan_cache *subplans;   /* NULL: a batch-parallel plan owns its sub-plans */
    const char *const *fp32_nodes; /* reduced-precision plans: nodes (by name) kept fp32, e.g. a model's output
                                    * layer in mixed-precision training; must outlive the plan */
    int nfp32_nodes;
    eng_dev_consts *dev_consts; /* device plans: shared weights (NULL: the plan uploads its own copy) */
    /* Device plans: device-resident inputs and outputs (a trainer's weights and gradients stay on the device). By
     * graph input / output index, 1: that input's data is memory of the plan's backend and device (no copy in); that
     * output is returned in device memory, valid until the next run (no copy out). NULL: every input and output in
     * host memory. A plan with such an input or output needs static shapes and at least one step on the device. */
    const unsigned char *dev_inputs;
    const unsigned char *dev_outputs;
    /* 1: eng_plan_run writes the outputs into the caller's memory (outputs[i].data on entry, sized for the plan's
     * output shape): a static host plan computes each output that a step writes (and no other output shares) there
     * directly, with no copy, and copies the rest (an output that is an input or a constant). Loop bodies use it to
     * double-buffer loop-carried values. Never splits into sub-batches. A dynamic plan ignores it (outputs are views,
     * as without it: eng_plan_get_stats says which). */
    int ext_outputs;
    /* 1: the plan is dynamic from its first step and eng_plan_run takes inputs of any shape (the dtypes planned): a
     * Loop body whose loop-carried shapes change from one iteration to the next. */
    int any_shape;
    /* 1: never replay this device plan's runs as a graph (CUDA Graphs); TENSORD_CUDA_GRAPHS=0 does the same for every
     * plan. By default a static plan whose every step runs on a device with graphs captures its second run and
     * launches the graph from then on (engine/plan/plan-graph.c: the rules). */
    int no_graphs;
    /* Optional: on_ready(ready_arg, ctx, idx, outs, n) tells, during a run, that graph outputs idx[0..n) are complete
     * (outs[j]: output idx[j] as the run returns it). A static device plan calls it on the running thread right after
     * the kernels of the last step touching an output were queued on ctx (the plan's context: an event recorded on
     * ctx in the callback marks them done; the device may still be computing them), so a trainer can all-reduce
     * gradients while the backward pass goes on. Outputs copied after the last step, inputs and constants, and every
     * output of a dynamic, batch-split or host-only plan are reported after the last step with ctx NULL (the run's
     * work is complete). Every output
     * is reported once per run that succeeds; a failing run stops reporting at its failing step. The callback must
     * not run this plan. (engine/plan/plan-ready.c) */
    void (*on_ready)(void *arg, krn_ctx *ctx, const int *idx, const eng_tensor *outs, int n);
    void *ready_arg;
} eng_plan_opts;

typedef struct eng_plan eng_plan;

typedef struct eng_plan_stats {
    int nodes;          /* nodes in the graph */
    int steps;          /* kernels run per execution */
    int folded;         /* nodes computed at plan time */
    int dynamic;        /* 1 if shapes are inferred per run */
    size_t arena_bytes; /* activations arena (static plans) */
    size_t naive_bytes; /* sum of all intermediate sizes without reuse */
    int split_rows;     /* batch-parallel plans: rows per sub-batch (0: the plan runs whole) */
    int split_workers;  /* batch-parallel plans: threads each running its own sub-batches */
    eng_precision precision;
    int lowp_steps;     /* bf16 / fp16 plans: steps computing in that dtype (summed over a split plan's sub-plans) */
    int lowp_values;    /* activations stored in it */
    int device_steps;   /* device plans: steps run on the device (dynamic plans, placed per run: the last run's, as are
                         * fallback_steps, copies and copy_bytes below) */
    int fallback_steps; /* device plans: steps run on the CPU instead (no kernel there, or the call unsupported) */
    int copies;         /* device plans: copies between the CPU and the device per run */
    size_t copy_bytes;  /* their bytes */
    size_t device_bytes;/* device memory held by this plan: its activations and the constants it uploaded itself (weights
                         * shared through opts.dev_consts are counted there, once) */
    int graphs;         /* device plans: 1 if its runs are (or, after the warm-up run, will be) graph launches */
    const char *graph_off; /* device plans: why not (static text: "steps on the CPU", ...), NULL when graphs is 1 */
    int graph_captures; /* graphs captured (1 once the plan has run twice) */
    int64_t graph_launches; /* runs made by launching the graph, the capturing run included; the others ran eagerly */
} eng_plan_stats;

/* Whether graph g can run at precision prec on backend b (NULL: CPU) fast: OK, or UNSUPPORTED with a message
 * naming what is missing (the CPU's ISA for bf16 / fp16; quantized ops for int8, with the `tensord quantize`
 * hint). Never a silent slow path: eng_plan_new and eng_session_new refuse what this refuses. */
eng_status eng_plan_precision_check(const eng_graph *g, const krn_backend *b, eng_precision prec);

/* inputs: g->ninputs tensors in g->inputs order giving dtype and shape (data ignored); an entry with dtype
 * UNDEFINED means "not fed" (allowed only for initializers listed as inputs). */
eng_status eng_plan_new(const eng_graph *g, const eng_plan_opts *opts, const eng_tensor *inputs, eng_plan **out);

/* inputs as in eng_plan_new, now with data, same dtypes and shapes. outputs: g->noutputs views into memory
 * owned by the plan, valid until the next run or eng_plan_free. */
eng_status eng_plan_run(eng_plan *p, const eng_tensor *inputs, eng_tensor *outputs);

void eng_plan_get_stats(const eng_plan *p, eng_plan_stats *st);

/* Graph output i as planned: dtype and shape (static plans; a dynamic plan's may be unknown), and *konst (may be
 * NULL) set to 1 when its value was computed at plan time (then ->data holds it). */
const eng_tensor *eng_plan_output_desc(const eng_plan *p, int i, int *konst);
/* 1 if p's shapes are inferred per run (eng_plan_stats.dynamic, without computing the rest of the stats). */
int eng_plan_dynamic(const eng_plan *p);

void eng_plan_free(eng_plan **p);

/* Limits for ops that loop (Loop, Scan, SequenceMap; engine/plan/plan-ctrl.c). A deadline for the runs of the
 * calling thread (CLOCK_MONOTONIC microseconds, 0: none; the server sets each request's or batch's): past it the op
 * fails with ENG_STATUS_DEADLINE_EXCEEDED. The process-wide cap on one Loop's iterations per run (tensord's
 * --max_loop_iterations, default 1,000,000): past it, INVALID_ARGUMENT. Messages name the node and the limit. */
void eng_run_set_deadline(int64_t deadline_us);
/* Load-time check of a control-flow node (If, Loop, Scan; OK for any other op) at the model's opset: its subgraphs
 * are there, with the inputs and outputs the node needs; the error names the node and the subgraph. */
eng_status eng_ctrl_check_node(int64_t opset, const eng_node *n);
int64_t eng_run_deadline(void);
void eng_set_max_loop_iterations(int64_t n);
int64_t eng_max_loop_iterations(void);

#endif
