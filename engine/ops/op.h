/* op.h - ONNX operator definitions: attribute parsing, arity checks and shape inference.
 *
 * Each op family lives in engine/ops/<family>.c and exports a {NULL}-terminated eng_op_def array listed in
 * engine/ops/registry.c. An op def turns a node into a params struct for its backend kernel (prepare), and
 * computes output dtypes and shapes from input dtypes/shapes (infer). The planner calls prepare once per node
 * per plan, infer at plan time (and at run time in dynamic plans), then hands the params to the kernel named
 * `kernel` in the chosen backend.
 *
 * Shape inference and constants: when an input's value is known (initializer, Constant, folded subgraph, or
 * at run time) ctx->in[i].data is non-NULL. An infer that needs the value of an input whose data is NULL
 * returns ENG_STATUS_NEEDS_DATA (no message needed); the planner then makes the plan dynamic.
 * Error messages need not name the node: the planner prefixes "node 'NAME' (OpType): ".
 */
#ifndef ENG_OP_H
#define ENG_OP_H

#include "../ir/graph.h"
#include "../../kernels/krn-nn.h"

#define ENG_OP_MAX_IO 64

typedef struct eng_op_ctx {
    const eng_graph *graph;
    const eng_node *node;
    int64_t opset;      /* default-domain opset of the model */
    eng_tensor *in;     /* node->nin entries; omitted optional inputs: dtype UNDEFINED, ndim 0, data NULL */
    int nin;
    eng_tensor *out;    /* node->nout entries; infer sets dtype, ndim, dims (data is NULL during infer) */
    int nout;
    void *params;       /* set by prepare; released with def->free_params or free() */
    int nthreads;       /* the plan's threads (ops that plan subgraphs: If, Loop, Scan) */
} eng_op_ctx;

enum {
    ENG_OP_ALIAS = 1u << 0,      /* output 0 is input 0's bytes with a new shape (Reshape, Squeeze...): no kernel runs */
    ENG_OP_SHAPE_ONLY = 1u << 1, /* the kernel reads only input shapes, never input data (Shape, Size) */
    ENG_OP_RANDOM = 1u << 2,     /* output differs run to run: never constant-folded */
    ENG_OP_ALIAS_SAME = 1u << 3, /* in a static plan, an alias (no kernel runs) when output 0 has input 0's dtype and
                                  * shape (ReduceToShape where nothing was broadcast) */
    ENG_OP_ALLOCATES = 1u << 4,  /* in a dynamic plan the kernel allocates its outputs itself (eng_alloc; it sets their
                                  * dtype, shape and data, and the plan owns them after): ops whose output shapes are
                                  * known only by running them (a Loop's scan outputs, sequences). infer is not called
                                  * at run time; at plan time it returns NEEDS_DATA unless it can give static shapes,
                                  * and the kernel then writes into outputs the plan allocated (data non-NULL). */
};

typedef struct eng_op_def {
    const char *op_type;
    const char *domain;   /* "" for ai.onnx */
    const char *kernel;   /* backend kernel name; NULL for ALIAS ops */
    unsigned flags;
    eng_status (*prepare)(eng_op_ctx *c); /* may be NULL; allocate c->params, check attributes and arity */
    eng_status (*infer)(eng_op_ctx *c);   /* required */
    void (*free_params)(void *params);    /* NULL: free() */
    /* Ops the engine itself runs (If, Loop, Scan: they plan and run subgraphs, engine/plan/plan-ctrl.c): their kernel,
     * used on every backend instead of looking `kernel` up; NULL for every other op. */
    const struct krn_kernel *engine_kernel;
} eng_op_def;

/* Op lookup; domain NULL or "ai.onnx" is treated as "". NULL if unknown. */
const eng_op_def *eng_op_find(const char *domain, const char *op_type);

/* Helpers for op files. */
/* Numpy-style broadcast of n shapes into out; error names both shapes when incompatible. */
eng_status eng_broadcast_shapes(const eng_tensor *const *ts, int n, eng_tensor *out);
/* Normalise axis in [-rank, rank) to [0, rank); error names the axis and rank. */
eng_status eng_norm_axis(int64_t axis, int rank, int *out);
/* Input i present (not omitted)? */
static inline int eng_op_has_input(const eng_op_ctx *c, int i) {
    return i < c->nin && c->in[i].dtype != ENG_DTYPE_UNDEFINED;
}
/* Check nin within [lo, hi] (hi < 0: unbounded) and nout >= 1. */
eng_status eng_op_check_arity(const eng_op_ctx *c, int lo, int hi);
/* Copy input shape/dtype to output. */
void eng_op_same_as_input(eng_op_ctx *c, int in, int out);

/* A fused op's activation from the "act", "act_alpha", "act_beta" attributes that engine/plan/fuse.c sets (nn.c). */
void eng_nn_act_attrs(const eng_node *n, krn_nn_act_params *a);

#endif
