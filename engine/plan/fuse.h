/* fuse.h - graph rewrites applied once when a session is created (before planning): operator fusion
 * (Conv+activation, MatMul+bias+activation, ...) into internal ops of the "com.tensord" domain.
 * The rewrite preserves the graph's inputs, outputs and numerics (within float rounding). */
#ifndef ENG_FUSE_H
#define ENG_FUSE_H
#include "../ir/graph.h"
eng_status eng_graph_fuse(eng_graph *g);
/* As eng_graph_fuse; cpu_layouts 0 (a session on a device backend) keeps the backend-neutral rewrites (QDQ, Conv /
 * MatMul / Gemm + bias + activation, BatchNorm folding) and skips the CPU's: oneDNN blocked layouts, the fused
 * depthwise stage and Conv+pool. */
eng_status eng_graph_fuse_for(eng_graph *g, int cpu_layouts);
/* For training graphs, which eng_graph_fuse's internal ops do not suit (they have no gradient rules): Constant
 * nodes become initializers, no-op nodes are bypassed, and an activation written as a chain of elementwise ops
 * that has an ONNX op with a gradient rule (Gelu, erf and tanh forms) becomes that op. */
eng_status eng_graph_fuse_act_ops(eng_graph *g);
/* fuse-qdq.c: QDQ patterns -> QLinearConv/QLinearMatMul or ConvInteger/MatMulInteger + float rescale; run first
 * by eng_graph_fuse. TENSORD_NO_QDQ_FUSE=1 turns it off. */
eng_status eng_graph_fuse_qdq(eng_graph *g);
#endif
