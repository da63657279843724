/* fuse.h - graph rewrites applied once when a session is created (before planning): operator fusion
 * (Conv+activation, MatMul+bias+activation, ...) into internal ops of the "com.tensord" domain.
 * The rewrite preserves the graph's inputs, outputs and numerics (within float rounding). */
#ifndef ENG_FUSE_H
#define ENG_FUSE_H
#include "../ir/graph.h"
eng_status eng_graph_fuse(eng_graph *g);
/* For training graphs, which eng_graph_fuse's internal ops do not suit (they have no gradient rules): Constant
 * nodes become initializers, no-op nodes are bypassed, and an activation written as a chain of elementwise ops
 * that has an ONNX op with a gradient rule (Gelu, erf and tanh forms) becomes that op. */
eng_status eng_graph_fuse_act_ops(eng_graph *g);
/* fuse-qdq.c: QDQ patterns -> QLinearConv/QLinearMatMul or ConvInteger/MatMulInteger + float rescale; run first
 * by eng_graph_fuse. TENSORD_NO_QDQ_FUSE=1 turns it off. */
eng_status eng_graph_fuse_qdq(eng_graph *g);
#endif
