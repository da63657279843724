/* grad-impl.h - what gradient rules (engine/grad-*.c) see of autodiff (engine/train/autodiff.c).
 *
 * A rule differentiates one forward node: given the gradient values of its outputs (dy[j], -1 where no gradient
 * arrived) it appends nodes to the graph that compute the gradients of the inputs flagged in need[i] and stores
 * their value indices in dx[i] (-1 = no gradient, e.g. not needed). Rules build nodes only through the helpers
 * below (unique value/node names, attributes copied); g->nodes may be reallocated by any helper, so rules hold
 * node indices, never node pointers, across helper calls (eng_grad_fwd re-fetches). Helpers return -1 (value
 * or node index) with the error recorded; rules then return ENG_STATUS_OUT_OF_MEMORY / the recorded status.
 */
#ifndef ENG_GRAD_IMPL_H
#define ENG_GRAD_IMPL_H

#include "../ir/graph.h"

typedef struct eng_grad_ctx {
    eng_graph *g;
    void *ad;                  /* autodiff state (name index, counters) */
    int node;                  /* forward node index */
    const int *dy;             /* per forward output */
    int *dx;                   /* per forward input, preset to -1 */
    const unsigned char *need; /* per forward input */
} eng_grad_ctx;

typedef eng_status (*eng_grad_fn)(eng_grad_ctx *c);

/* diff: bit i set = input i is differentiable (gradients flow through it); others never get one. */
typedef struct eng_grad_rule {
    const char *op_type; /* default ("") domain, except where domain is set */
    eng_grad_fn fn;
    unsigned diff;
    const char *domain;  /* NULL: "" */
} eng_grad_rule;

/* {NULL}-terminated rule tables, one per file. */
extern const eng_grad_rule eng_grad_rules_math[];
extern const eng_grad_rule eng_grad_rules_nn[];
extern const eng_grad_rule eng_grad_rules_tensor[];
extern const eng_grad_rule eng_grad_rules_rnn[];

static inline const eng_node *eng_grad_fwd(const eng_grad_ctx *c) { return &c->g->nodes[c->node]; }
/* Forward input i / output j value index (-1 if omitted or absent). */
int eng_grad_in(const eng_grad_ctx *c, int i);
int eng_grad_out(const eng_grad_ctx *c, int j);

/* Append node op(in[0..nin)) with nout fresh outputs; outs[j] < 0 on entry (or outs NULL) = create the value,
 * outs[j] == -2 = omitted output (-1 in the node). Returns the node index or -1. */
int eng_grad_emit(eng_grad_ctx *c, const char *op, const char *domain, const int *in, int nin, int *outs, int nout);
/* One-output shortcuts; return the output value or -1. in[i] may be -1 (omitted). */
int eng_grad_op(eng_grad_ctx *c, const char *op, const char *domain, const int *in, int nin);
int eng_grad_un(eng_grad_ctx *c, const char *op, int a);
int eng_grad_bin(eng_grad_ctx *c, const char *op, int a, int b);
/* ReduceToShape(v, like): un-broadcast a gradient to like's shape. */
int eng_grad_rts(eng_grad_ctx *c, int v, int like);
/* A float32 scalar initializer (rank 0) holding x, cast like `like` when like's declared dtype is not float32. */
int eng_grad_const(eng_grad_ctx *c, double x, int like);
/* FillLike(like; value). */
int eng_grad_fill(eng_grad_ctx *c, int like, double value);

/* Attributes on an emitted node. */
eng_status eng_grad_attr_int(eng_grad_ctx *c, int node, const char *name, int64_t v);
eng_status eng_grad_attr_float(eng_grad_ctx *c, int node, const char *name, float v);
eng_status eng_grad_attr_ints(eng_grad_ctx *c, int node, const char *name, const int64_t *v, int n);
/* Copy every attribute of the forward node onto `node`. */
eng_status eng_grad_copy_attrs(eng_grad_ctx *c, int node);

/* The error status recorded by a failed helper (OUT_OF_MEMORY unless it said otherwise). */
eng_status eng_grad_failed(void);

#endif
