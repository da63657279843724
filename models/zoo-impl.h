/* zoo-impl.h - internals of the model zoo: the graph builder the architecture files share (build.c) and the
 * parsed options they read (zoo.c). Not for use outside models/.
 *
 * Builder contract: every mdl_b_* call is a no-op returning -1 once b->st is not OK (the first error is kept,
 * with its message in eng_last_error()), so an architecture builds straight-line and checks b->st once at the
 * end. Values are named after the node that produces them; parameters are initializers named "<layer>/<kind>"
 * (kernel, bias, gamma, beta, moving_mean, moving_variance, embeddings) so fine-tuning can freeze by prefix.
 * Fixed constants (shapes, scalars) are Constant nodes, never initializers: the initializers are exactly the
 * model's parameters. Each parameter draws from its own PRNG stream, seeded from (seed, name), so one layer's
 * weights do not depend on which layers came before it.
 */
#ifndef MDL_ZOO_IMPL_H
#define MDL_ZOO_IMPL_H

#include <stdint.h>

#include "zoo.h"

#define MDL_MAX_LIST 16                  /* entries in a list option */
#define MDL_MAX_PARAMS ((int64_t)1 << 30) /* refuse models with more parameters than this (4 GiB of float) */

/* Options after parsing: each is a list of integers (an int option has one entry, an enum its index). */
typedef struct mdl_args {
    const char *arch;
    int n;
    const char *keys[16];
    int64_t v[16][MDL_MAX_LIST];
    int len[16];
} mdl_args;

int64_t mdl_arg(const mdl_args *a, const char *key);                      /* first entry */
const int64_t *mdl_arg_list(const mdl_args *a, const char *key, int *n); /* all entries */
/* INVALID_ARGUMENT "arch 'A': option 'K': ..." */
eng_status mdl_arg_err(const mdl_args *a, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

typedef enum mdl_init {
    MDL_INIT_ZEROS,
    MDL_INIT_ONES,
    MDL_INIT_GLOROT, /* uniform(-l, l), l = sqrt(6 / (fan_in + fan_out)) */
    MDL_INIT_NORMAL, /* normal(0, 0.02) */
} mdl_init;

typedef enum mdl_act {
    MDL_ACT_RELU,
    MDL_ACT_GELU, /* x * 0.5 * (1 + erf(x / sqrt 2)), the exact form (Gelu the op is opset 20) */
    MDL_ACT_TANH,
    MDL_ACT_SIGMOID,
} mdl_act;

typedef struct mdl_b {
    eng_graph *g;
    uint64_t seed;
    eng_status st;
    int64_t nparams;
} mdl_b;

/* Start a graph (opset 17, IR 8, producer "tensord-zoo"); on failure b->st is set. */
void mdl_b_init(mdl_b *b, const char *arch, uint64_t seed);
/* Finish: check b->st, hand the graph to *out (or free it and return the error). */
eng_status mdl_b_finish(mdl_b *b, eng_graph **out);
eng_status mdl_b_fail(mdl_b *b, eng_status st); /* keep the first error */

/* Graph input: dims[0] is the symbolic batch dim "N" (its value is ignored). */
int mdl_b_input(mdl_b *b, const char *name, eng_dtype dt, int ndim, const int64_t *dims);
/* Make value v a graph output named `name` with dtype f32 and shape [N, dims[1..]]. */
void mdl_b_output(mdl_b *b, int v, const char *name, int ndim, const int64_t *dims);
/* A parameter initializer. fan_in/fan_out are used by MDL_INIT_GLOROT only. */
int mdl_b_param(mdl_b *b, const char *name, int ndim, const int64_t *dims, mdl_init init, int64_t fan_in,
                int64_t fan_out);
/* A node with one output value named like the node; returns the value. Attributes go on the last node. */
int mdl_b_op(mdl_b *b, const char *name, const char *op, const int *in, int nin);
int mdl_b_op1(mdl_b *b, const char *name, const char *op, int x);
int mdl_b_op2(mdl_b *b, const char *name, const char *op, int x, int y);
void mdl_b_attr_int(mdl_b *b, const char *name, int64_t v);
void mdl_b_attr_float(mdl_b *b, const char *name, float v);
void mdl_b_attr_ints(mdl_b *b, const char *name, const int64_t *v, int n);
/* Constant nodes, created once per name and shared. */
int mdl_b_const_f32(mdl_b *b, const char *name, float v);
int mdl_b_const_i64s(mdl_b *b, const char *name, const int64_t *v, int n);

/* Layers ("name" is the layer prefix). x has rank `rank`; dense on rank 2 is Gemm, else MatMul + Add. */
int mdl_b_dense(mdl_b *b, const char *name, int x, int rank, int64_t in, int64_t out);
int mdl_b_act(mdl_b *b, const char *name, int x, mdl_act act);
/* Conv2D, Glorot kernel (out, in, k, k); `pad` on every side; bias optional. */
int mdl_b_conv(mdl_b *b, const char *name, int x, int64_t cin, int64_t cout, int64_t k, int64_t stride, int64_t pad,
               int bias);
int mdl_b_batchnorm(mdl_b *b, const char *name, int x, int64_t c); /* eps 1e-3, momentum 0.99 (Keras) */
int mdl_b_layernorm(mdl_b *b, const char *name, int x, int64_t d); /* last axis, eps 1e-5 */
/* Multi-head self-attention on x [N, seq, d] (no mask): query/key/value/output dense layers. */
int mdl_b_attention(mdl_b *b, const char *name, int x, int64_t seq, int64_t d, int64_t heads);
/* Dense(ffn) -> GELU -> Dense(d) on [N, seq, d]. */
int mdl_b_ffn(mdl_b *b, const char *name, int x, int64_t d, int64_t ffn);
/* Dense(classes) named "head", then Softmax -> "probabilities", or the head's output named "logits". */
void mdl_b_classifier(mdl_b *b, int x, int64_t in, int64_t classes, int softmax);

/* Architecture builders (one per file). */
eng_status mdl_build_mlp(const mdl_args *a, mdl_b *b);
eng_status mdl_build_cnn(const mdl_args *a, mdl_b *b);
eng_status mdl_build_resnet(const mdl_args *a, mdl_b *b);
eng_status mdl_build_transformer(const mdl_args *a, mdl_b *b);
eng_status mdl_build_vit(const mdl_args *a, mdl_b *b);
eng_status mdl_build_two_tower(const mdl_args *a, mdl_b *b);

#endif
