/* fuse-impl.h - what the graph-rewrite files (fuse.c, fuse-act.c, fuse-layout.c) share. Not part of the library's interface. */
#ifndef ENG_FUSE_IMPL_H
#define ENG_FUSE_IMPL_H

#include "../../kernels/krn-nn.h"
#include "fuse.h"

typedef struct fz_ctx {
    eng_graph *g;
    unsigned char *dead; /* per node */
    int changed;
} fz_ctx;

/* Uses of value v: live node inputs, graph outputs, subgraph references (each counts 1). */
int fz_uses(const fz_ctx *z, int v);
/* The single live consumer node of v (v used exactly once), else -1. */
int fz_sole_consumer(const fz_ctx *z, int v);
int fz_is_graph_input(const eng_graph *g, int v);
/* A constant float32 initializer (not overridable by the caller), else NULL. */
const eng_tensor *fz_const_f32(const eng_graph *g, int v);
int fz_is_op(const eng_node *n, const char *op);    /* op_type in the default domain */
int fz_one_output(const eng_node *n);               /* exactly one real output */

/* fuse-act.c: an activation written as a chain of elementwise ops hanging off x (x * sigmoid(x), Gelu's erf
 * and tanh forms, x * relu6(x + 3) / 6, ...). On a match fills *act, lists the chain's nodes in nodes[] (*nn,
 * at most cap) and returns the index of its last node, whose output is act(x); else -1. Every value inside
 * the chain, x included, is used only inside it. */
int fz_match_act_chain(const fz_ctx *z, int x, krn_nn_act_params *act, int *nodes, int *nn, int cap);

eng_status fz_add_attr_int(eng_graph *g, int node, const char *name, int64_t v);
eng_status fz_add_attr_float(eng_graph *g, int node, const char *name, float v);
eng_status fz_set_op(eng_node *n, const char *op, const char *domain); /* renames n's op and domain */
eng_status fz_ensure_inputs(eng_node *n, int count);                  /* n has >= count input slots (new: -1) */

/* fuse-attn.c: MatMul -> [Mul|Div by a constant] -> [Add M] -> Softmax(last axis) -> MatMul chains become
 * com.tensord FusedAttention (kernels/krn-attn.h); device sessions only. */
eng_status fz_attention(fz_ctx *z);

/* fuse-layout.c: Conv/FusedConv with a 4-D float32 weight initializer; the layout pass (see there). */
int fz_is_conv2d(const eng_graph *g, const eng_node *n);
eng_status fz_layouts(fz_ctx *z);

#endif
