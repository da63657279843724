/* autodiff.h - reverse-mode automatic differentiation over the graph IR.
 *
 * eng_autodiff appends the backward pass to a graph that already computes a scalar loss: walking nodes in
 * reverse topological order from the loss, each op's gradient rule (engine/grad-*.c) appends nodes that
 * compute the gradients of its inputs from the gradients of its outputs, using standard ONNX ops where they
 * suffice and internal ops of domain "com.tensord" (ReluGrad, ConvGrad, MaxPoolGrad, BatchNormalizationGrad,
 * SoftmaxGrad, ..., and ReduceToShape for un-broadcasting) where they do not; every internal op has a CPU
 * kernel and shape inference like any other op. Contributions to a value used several times are summed.
 * Only values on a path from a parameter to the loss get gradients; the rest of the graph is untouched.
 *
 * After the call: for each parameter p (an initializer), a value "grad/<p>" of p's shape holds dLoss/dp and is
 * appended to g->outputs; each parameter is listed in g->inputs (still an initializer), so a training loop feeds
 * the current weights every step without re-planning. The loss value is appended to g->outputs first if it
 * is not already an output.
 */
#ifndef ENG_AUTODIFF_H
#define ENG_AUTODIFF_H

#include "../ir/graph.h"

typedef struct eng_grad_spec {
    const char *loss;            /* name of a scalar (rank 0 or [1]) float value */
    const char *const *params;   /* initializer names to differentiate */
    int nparams;
    const char *loss_scale;      /* optional: a float32 scalar value (a graph input) the backward pass starts from
                                  * instead of 1 (loss scaling, loss-scale.h); NULL: 1 */
} eng_grad_spec;

/* Errors: unknown loss/param names (named), a node on the path with no gradient rule (names node and op),
 * a parameter that does not reach the loss is NOT an error: its gradient is zeros. */
eng_status eng_autodiff(eng_graph *g, const eng_grad_spec *spec);

/* Switch the forward graph to training behaviour in place: Dropout gets training_mode=true (a seeded random
 * mask per run; a Dropout of constant ratio 0 stays the identity), BatchNormalization computes batch statistics and exposes its updated running mean/var as
 * graph outputs named "bn_update/<running_mean initializer>" and "bn_update/<running_var initializer>"
 * (momentum as the node's attribute; Keras/ONNX convention: running = momentum*running + (1-momentum)*batch).
 * A BatchNormalization whose scale and bias are both frozen (their names start with a freeze prefix) runs in
 * inference mode instead, its statistics kept (Keras' trainable=False). Must run before eng_autodiff. */
eng_status eng_graph_set_training(eng_graph *g, const char *const *freeze_prefixes, int nfreeze);

/* Switch a model exported in training mode (torch.onnx's TrainingMode.TRAINING) to inference behaviour in place:
 * BatchNormalization with training_mode=1 uses its running statistics and loses the outputs that returned them
 * (an error, naming the node, if anything reads them); Dropout loses its training_mode input. What the trainer
 * evaluates and writes as the new version. */
eng_status eng_graph_set_inference(eng_graph *g);

/* 1 if the parameter name starts with one of the freeze prefixes. */
int eng_param_frozen(const char *name, const char *const *freeze_prefixes, int nfreeze);

/* Names of float initializers that are trainable: all float initializers except BatchNormalization running
 * statistics, shape-like constants (non-float) and those whose name starts with any of the freeze prefixes.
 * Returns malloc'd array of borrowed names (graph-owned strings); free the array only. */
eng_status eng_trainable_params(const eng_graph *g, const char *const *freeze_prefixes, int nfreeze,
                                const char ***names, int *n);

#endif
