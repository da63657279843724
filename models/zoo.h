/* zoo.h - the model zoo: builders that write standard architectures as ONNX graphs with initialised weights
 * (Glorot-uniform for dense/conv kernels, zeros for biases, ones/zeros for norm scale/shift, normal(0, 0.02)
 * for embeddings, as Keras does), seeded so a given (arch, options, seed) always gives the same bytes.
 *
 * Architectures and their options (key=value; defaults in brackets):
 *   mlp                 input=[784] hidden=[512,512] classes=[10] activation=[relu] softmax=[1]
 *   cnn (the seed CNN)  input=[1,28,28] filters=[32] kernel=[3] pool=[2] classes=[10] softmax=[1]
 *                       Conv2D(filters,kernel)+ReLU -> MaxPool pool -> Flatten -> Dense(classes) [-> Softmax]
 *   resnet-small        input=[3,32,32] width=[16] blocks=[2] (per stage, 3 stages) classes=[10]
 *   transformer-encoder vocab=[1000] seq=[128] d=[128] heads=[4] layers=[2] ffn=[512] classes=[2]
 *                       (BERT-style: token + position embeddings, post-LN layers, mean-pool, classifier)
 *   vit-tiny            input=[3,32,32] patch=[4] d=[192] heads=[3] layers=[4] ffn=[768] classes=[10]
 *   two-tower           users=[1000] items=[1000] dim=[32] (user/item embeddings -> dot -> Sigmoid,
 *                       inputs "user" and "item" int64 [N], output probability [N,1])
 * Inputs have a symbolic batch dim "N"; float inputs are named "x", token ids "tokens".
 * Outputs: classifiers give "probabilities" [N,classes] (softmax=1) or "logits" (softmax=0). Every option of
 * every arch, its default and bounds: mdl_arch_options / `tensord init --list`.
 * Initializers are exactly the parameters (constants are Constant nodes), named "<layer>/<kind>" with kind one
 * of kernel, bias, gamma, beta, moving_mean, moving_variance, embeddings; the last Dense is always "head/...",
 * so fine-tuning can freeze by name prefix. Dense kernels are stored [in, out] (Gemm/MatMul without transpose).
 */
#ifndef MDL_ZOO_H
#define MDL_ZOO_H

#include <stdint.h>

#include "../engine/ir/graph.h"

typedef struct mdl_opt {
    const char *key;
    const char *value;
} mdl_opt;

/* Build arch with options; unknown arch or option key, or a bad value, is INVALID_ARGUMENT naming it. */
eng_status mdl_build(const char *arch, const mdl_opt *opts, int nopts, uint64_t seed, eng_graph **out);
/* NULL-terminated list of architecture names. */
const char *const *mdl_archs(void);

/* One option of an architecture: its key, default value (as given to mdl_build, e.g. "512,512") and a line
 * of help. Static storage. */
typedef struct mdl_opt_info {
    const char *key;
    const char *dflt;
    const char *help;
} mdl_opt_info;
/* The options of arch, terminated by an entry with key NULL; NULL for an unknown arch. */
const mdl_opt_info *mdl_arch_options(const char *arch);
/* One line describing arch (layers, pooling, initialisation); NULL for an unknown arch. Static storage. */
const char *mdl_arch_summary(const char *arch);
/* Number of elements in the graph's float initializers (the trainable weights plus BatchNorm statistics). */
int64_t mdl_param_count(const eng_graph *g);

#endif
