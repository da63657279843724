/* loss.h - loss functions appended to a model graph as nodes (so autodiff differentiates them like any op).
 *
 * eng_loss_append adds a label input (named "label", dtype/shape per loss), the loss nodes reading the model
 * output `pred`, and returns the name of the scalar loss value (mean over the batch, Keras semantics).
 *   ENG_LOSS_SPARSE_CCE   label int64 [N];   pred [N,C] logits or probabilities
 *   ENG_LOSS_CCE          label float [N,C] one-hot/soft targets; pred as above
 *   ENG_LOSS_BCE          label float, pred's shape; pred probabilities or logits
 *   ENG_LOSS_MSE          label float, pred's shape
 *   ENG_LOSS_COSINE       label float, pred's shape; loss = -mean(cosine similarity over the last axis) (Keras)
 * from_logits = -1 (auto): if pred is produced by Softmax (Sigmoid for BCE), the loss reads that node's
 * input instead, i.e. computes from logits — numerically stable, identical in value — which is what makes a
 * model ending in Softmax train stably; otherwise pred is treated as probabilities, clipped to
 * [1e-7, 1-1e-7] like Keras. from_logits = 1 (pred are logits) or 0 (probabilities) forces the choice.
 * Also adds an "accuracy" output for classification losses (argmax match for CCE, threshold 0.5 for BCE),
 * named "metric/accuracy", a float scalar, not differentiated.
 */
#ifndef ENG_LOSS_H
#define ENG_LOSS_H

#include "../ir/graph.h"

typedef enum eng_loss_kind {
    ENG_LOSS_SPARSE_CCE = 0,
    ENG_LOSS_CCE = 1,
    ENG_LOSS_BCE = 2,
    ENG_LOSS_MSE = 3,
    ENG_LOSS_COSINE = 4,
} eng_loss_kind;

/* "sparse_categorical_crossentropy", "categorical_crossentropy", "binary_crossentropy", "mse"/"mean_squared_error",
 * "cosine_similarity"; -1 if unknown. */
int eng_loss_parse(const char *name);
const char *eng_loss_name(eng_loss_kind k);

/* Appends the label input, loss nodes and metric outputs; *loss_name gets a graph-owned name. */
eng_status eng_loss_append(eng_graph *g, eng_loss_kind kind, const char *pred, int from_logits, const char **loss_name);

#endif
