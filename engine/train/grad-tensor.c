/* grad-tensor.c - gradient rules of data-movement ops: Reshape/Flatten/Squeeze/Unsqueeze (reshape back),
 * Expand (un-broadcast), Transpose (inverse perm), Concat/Split (split/concat back), Slice and Gather
 * (scatter into zeros), Dropout (identity in inference form; the mask for com.tensord.TrainingDropout).
 */
#include <stdio.h>
#include <string.h>

#include "grad-impl.h"

#define IN(i) eng_grad_in(c, i)
#define OUT(j) eng_grad_out(c, j)
#define CHECK(v)                                                                                                   \
    do {                                                                                                           \
        if ((v) < 0) return eng_grad_failed();                                                                     \
    } while (0)

/* dx = Reshape(dy, Shape(x)); Shape folds at plan time. */
static eng_status g_reshape(eng_grad_ctx *c) {
    int shp = eng_grad_un(c, "Shape", IN(0));
    CHECK(c->dx[0] = eng_grad_bin(c, "Reshape", c->dy[0], shp));
    return ENG_STATUS_OK;
}

static eng_status g_expand(eng_grad_ctx *c) {
    CHECK(c->dx[0] = eng_grad_rts(c, c->dy[0], IN(0)));
    return ENG_STATUS_OK;
}

static eng_status g_transpose(eng_grad_ctx *c) {
    const int64_t *perm = NULL;
    int n = eng_node_attr_ints(eng_grad_fwd(c), "perm", &perm), out = -1;
    int64_t inv[64];
    if (n > 64) return eng_err(ENG_STATUS_UNSUPPORTED, "perm of %d entries", n);
    for (int k = 0; k < n; k++) {
        if (perm[k] < 0 || perm[k] >= n) return eng_err(ENG_STATUS_INVALID_MODEL, "perm[%d] = %lld", k, (long long)perm[k]);
        inv[perm[k]] = k;
    }
    int node = eng_grad_emit(c, "Transpose", "", &c->dy[0], 1, &out, 1);
    CHECK(node);
    if (n >= 0) ENG_TRY(eng_grad_attr_ints(c, node, "perm", inv, n)); /* no perm: reversal, its own inverse */
    c->dx[0] = out;
    return ENG_STATUS_OK;
}

static eng_status g_concat(eng_grad_ctx *c) {
    int nin = eng_grad_fwd(c)->nin, in[65], outs[64];
    if (nin > 64) return eng_err(ENG_STATUS_UNSUPPORTED, "Concat of %d inputs", nin);
    in[0] = c->dy[0];
    for (int i = 0; i < nin; i++) in[i + 1] = IN(i), outs[i] = c->need[i] ? -1 : -2;
    int n = eng_grad_emit(c, "ConcatGrad", "com.tensord", in, nin + 1, outs, nin);
    CHECK(n);
    ENG_TRY(eng_grad_copy_attrs(c, n));
    for (int i = 0; i < nin; i++)
        if (c->need[i]) c->dx[i] = outs[i];
    return ENG_STATUS_OK;
}

/* Split: concatenate the output gradients back (zeros for outputs without one). */
static eng_status g_split(eng_grad_ctx *c) {
    const eng_node *f = eng_grad_fwd(c);
    int nout = f->nout, in[64], out = -1;
    int64_t axis = eng_node_attr_int(f, "axis", 0);
    if (nout > 64) return eng_err(ENG_STATUS_UNSUPPORTED, "Split into %d outputs", nout);
    for (int j = 0; j < nout; j++) {
        in[j] = c->dy[j];
        if (in[j] < 0) CHECK(in[j] = eng_grad_fill(c, OUT(j), 0.0));
    }
    int n = eng_grad_emit(c, "Concat", "", in, nout, &out, 1);
    CHECK(n);
    ENG_TRY(eng_grad_attr_int(c, n, "axis", axis));
    c->dx[0] = out;
    return ENG_STATUS_OK;
}

static eng_status g_slice(eng_grad_ctx *c) {
    int nin = eng_grad_fwd(c)->nin, in[6] = {c->dy[0], -1, -1, -1, -1, -1}, out = -1;
    for (int i = 0; i < nin && i < 5; i++) in[i + 1] = IN(i);
    int n = eng_grad_emit(c, "SliceGrad", "com.tensord", in, 1 + (nin < 5 ? nin : 5), &out, 1);
    CHECK(n);
    ENG_TRY(eng_grad_copy_attrs(c, n));
    c->dx[0] = out;
    return ENG_STATUS_OK;
}

static eng_status g_gather(eng_grad_ctx *c) {
    int in[3] = {c->dy[0], IN(1), IN(0)}, out = -1;
    int n = eng_grad_emit(c, "GatherGrad", "com.tensord", in, 3, &out, 1);
    CHECK(n);
    ENG_TRY(eng_grad_copy_attrs(c, n));
    c->dx[0] = out;
    return ENG_STATUS_OK;
}

/* Inference-form Dropout is the identity (eng_graph_set_training rewrites training Dropout). */
static eng_status g_dropout(eng_grad_ctx *c) {
    c->dx[0] = c->dy[0];
    return c->dy[0] >= 0 ? ENG_STATUS_OK : eng_err(ENG_STATUS_INTERNAL, "Dropout without an output gradient");
}

static eng_status g_train_dropout(eng_grad_ctx *c) {
    int in[2] = {c->dy[0], OUT(1)}, out = -1;
    if (in[1] < 0) return eng_err(ENG_STATUS_INVALID_MODEL, "TrainingDropout without a mask output");
    int n = eng_grad_emit(c, "DropoutGrad", "com.tensord", in, 2, &out, 1);
    CHECK(n);
    ENG_TRY(eng_grad_copy_attrs(c, n));
    c->dx[0] = out;
    return ENG_STATUS_OK;
}

const eng_grad_rule eng_grad_rules_tensor[] = {
    {"Reshape", g_reshape, 1},
    {"Flatten", g_reshape, 1},
    {"Squeeze", g_reshape, 1},
    {"Unsqueeze", g_reshape, 1},
    {"Expand", g_expand, 1},
    {"Transpose", g_transpose, 1},
    {"Concat", g_concat, ~0u},
    {"Split", g_split, 1},
    {"Slice", g_slice, 1},
    {"Gather", g_gather, 1},
    {"Dropout", g_dropout, 1},
    {"TrainingDropout", g_train_dropout, 1, "com.tensord"},
    {NULL},
};
