/* grad-math.c - gradient rules of elementwise ops, activations, reductions and softmax.
 *
 * Binary ops broadcast, so every input gradient goes through ReduceToShape(g, input) (a copy when nothing was
 * broadcast). Activations whose derivative is cheapest from the output (Relu, Sigmoid, Tanh, Exp, Sqrt) read
 * the forward output; the others read the forward input.
 */
#include <string.h>

#include "grad-impl.h"

#define IN(i) eng_grad_in(c, i)
#define OUT(j) eng_grad_out(c, j)
#define CHECK(v)                                                                                                   \
    do {                                                                                                           \
        if ((v) < 0) return eng_grad_failed();                                                                     \
    } while (0)

static eng_status set_dx(eng_grad_ctx *c, int i, int v) {
    CHECK(v);
    c->dx[i] = v;
    return ENG_STATUS_OK;
}

/* dx_i = ReduceToShape(g_i, x_i) for the needed inputs. */
static eng_status unbroadcast(eng_grad_ctx *c, int i, int g) {
    if (!c->need[i]) return ENG_STATUS_OK;
    CHECK(g);
    return set_dx(c, i, eng_grad_rts(c, g, IN(i)));
}

static eng_status g_add(eng_grad_ctx *c) {
    ENG_TRY(unbroadcast(c, 0, c->dy[0]));
    return unbroadcast(c, 1, c->need[1] ? c->dy[0] : 0);
}

static eng_status g_sub(eng_grad_ctx *c) {
    ENG_TRY(unbroadcast(c, 0, c->dy[0]));
    if (c->need[1]) ENG_TRY(unbroadcast(c, 1, eng_grad_un(c, "Neg", c->dy[0])));
    return ENG_STATUS_OK;
}

static eng_status g_mul(eng_grad_ctx *c) {
    if (c->need[0]) ENG_TRY(unbroadcast(c, 0, eng_grad_bin(c, "Mul", c->dy[0], IN(1))));
    if (c->need[1]) ENG_TRY(unbroadcast(c, 1, eng_grad_bin(c, "Mul", c->dy[0], IN(0))));
    return ENG_STATUS_OK;
}

/* y = a / b: da = dy / b, db = -dy * y / b */
static eng_status g_div(eng_grad_ctx *c) {
    int gb = -1;
    if (c->need[0] || c->need[1]) CHECK(gb = eng_grad_bin(c, "Div", c->dy[0], IN(1)));
    if (c->need[0]) ENG_TRY(unbroadcast(c, 0, gb));
    if (c->need[1]) ENG_TRY(unbroadcast(c, 1, eng_grad_un(c, "Neg", eng_grad_bin(c, "Mul", gb, OUT(0)))));
    return ENG_STATUS_OK;
}

/* y = x^e (e constant): dx = dy * e * x^(e-1) */
static eng_status g_pow(eng_grad_ctx *c) {
    int x = IN(0), e = eng_grad_bin(c, "CastLike", IN(1), x);
    int one = eng_grad_const(c, 1.0, x);
    int t = eng_grad_bin(c, "Mul", e, eng_grad_bin(c, "Pow", x, eng_grad_bin(c, "Sub", e, one)));
    return unbroadcast(c, 0, eng_grad_bin(c, "Mul", c->dy[0], t));
}

static eng_status g_sum(eng_grad_ctx *c) {
    for (int i = 0; i < eng_grad_fwd(c)->nin; i++) ENG_TRY(unbroadcast(c, i, c->dy[0]));
    return ENG_STATUS_OK;
}

static eng_status g_neg(eng_grad_ctx *c) { return set_dx(c, 0, eng_grad_un(c, "Neg", c->dy[0])); }
static eng_status g_exp(eng_grad_ctx *c) { return set_dx(c, 0, eng_grad_bin(c, "Mul", c->dy[0], OUT(0))); }
static eng_status g_log(eng_grad_ctx *c) { return set_dx(c, 0, eng_grad_bin(c, "Div", c->dy[0], IN(0))); }

/* y = sqrt(x): dx = dy * 0.5 / y */
static eng_status g_sqrt(eng_grad_ctx *c) {
    int half = eng_grad_const(c, 0.5, IN(0));
    return set_dx(c, 0, eng_grad_bin(c, "Div", eng_grad_bin(c, "Mul", c->dy[0], half), OUT(0)));
}

/* y = 1/x: dx = -dy * y * y */
static eng_status g_reciprocal(eng_grad_ctx *c) {
    int y = OUT(0);
    return set_dx(c, 0, eng_grad_un(c, "Neg", eng_grad_bin(c, "Mul", c->dy[0], eng_grad_bin(c, "Mul", y, y))));
}

static eng_status g_abs(eng_grad_ctx *c) {
    return set_dx(c, 0, eng_grad_bin(c, "Mul", c->dy[0], eng_grad_un(c, "Sign", IN(0))));
}

/* Internal activation gradient op(dy, v) with the forward's attributes. */
static eng_status act(eng_grad_ctx *c, const char *op, int v) {
    int in[2] = {c->dy[0], v}, out = -1;
    int n = eng_grad_emit(c, op, "com.tensord", in, 2, &out, 1);
    CHECK(n);
    ENG_TRY(eng_grad_copy_attrs(c, n));
    return set_dx(c, 0, out);
}

/* Relu whose only gradient comes from a MaxPool over its output: instead of ReluGrad(MaxPoolGrad(dy, y), y),
 * the MaxPoolGrad node gets fused_relu=1 (it applies the y > 0 mask while routing, bit-identical) and its
 * output is dx; that saves a full pass over the activation. dy[0] is that node's output only when the Relu
 * output had a single gradient contribution (no Sum), so nothing else reads it. */
static int relu_pool_fusable(eng_grad_ctx *c) {
    int y = OUT(0), dy = c->dy[0];
    if (dy < 0 || y < 0) return -1;
    for (int k = c->g->nnodes - 1; k >= 0; k--) {
        const eng_node *n = &c->g->nodes[k];
        int hit = 0;
        for (int j = 0; j < n->nout; j++) hit |= n->outputs[j] == dy;
        if (!hit) continue;
        if (strcmp(n->op_type, "MaxPoolGrad") || strcmp(n->domain, "com.tensord") || n->nout != 1 || n->nin != 2 ||
            n->inputs[1] != y || eng_node_attr_int(n, "fused_relu", 0))
            return -1;
        return k;
    }
    return -1;
}

static eng_status g_relu(eng_grad_ctx *c) {
    int pool = relu_pool_fusable(c);
    if (pool >= 0) {
        ENG_TRY(eng_grad_attr_int(c, pool, "fused_relu", 1));
        return set_dx(c, 0, c->dy[0]);
    }
    return act(c, "ReluGrad", OUT(0));
}
static eng_status g_leaky(eng_grad_ctx *c) { return act(c, "LeakyReluGrad", IN(0)); }
static eng_status g_gelu(eng_grad_ctx *c) { return act(c, "GeluGrad", IN(0)); }
static eng_status g_erf(eng_grad_ctx *c) { return act(c, "ErfGrad", IN(0)); }
static eng_status g_silu(eng_grad_ctx *c) { return act(c, "SiluGrad", IN(0)); }
static eng_status g_sigmoid(eng_grad_ctx *c) { return act(c, "SigmoidGrad", OUT(0)); }
static eng_status g_tanh(eng_grad_ctx *c) { return act(c, "TanhGrad", OUT(0)); }

/* Clip: dx = dy where min <= x <= max (bounds: inputs 1, 2 from opset 11, else attributes). */
static eng_status g_clip(eng_grad_ctx *c) {
    int in[4] = {c->dy[0], IN(0), IN(1), IN(2)}, out = -1;
    int nin = 2 + (eng_grad_fwd(c)->nin > 1 ? eng_grad_fwd(c)->nin - 1 : 0);
    int n = eng_grad_emit(c, "ClipGrad", "com.tensord", in, nin > 4 ? 4 : nin, &out, 1);
    CHECK(n);
    ENG_TRY(eng_grad_copy_attrs(c, n));
    return set_dx(c, 0, out);
}

/* Cast between float types: cast the gradient back. */
static eng_status g_cast(eng_grad_ctx *c) { return set_dx(c, 0, eng_grad_bin(c, "CastLike", c->dy[0], IN(0))); }

static eng_status g_identity(eng_grad_ctx *c) { return set_dx(c, 0, c->dy[0]); }

/* Where(cond, a, b): da = dy where cond, db = dy elsewhere. */
static eng_status g_where(eng_grad_ctx *c) {
    int zero = eng_grad_const(c, 0.0, c->dy[0]);
    CHECK(zero);
    for (int i = 1; i <= 2; i++) {
        if (!c->need[i]) continue;
        int in[3] = {IN(0), i == 1 ? c->dy[0] : zero, i == 1 ? zero : c->dy[0]};
        ENG_TRY(unbroadcast(c, i, eng_grad_op(c, "Where", "", in, 3)));
    }
    return ENG_STATUS_OK;
}

/* ReduceSum / ReduceMean: dy broadcast back over the reduced axes (axes from attribute or input 1). */
static eng_status g_reduce(eng_grad_ctx *c) {
    const char *op = !strcmp(eng_grad_fwd(c)->op_type, "ReduceMean") ? "ReduceMeanGrad" : "ReduceSumGrad";
    int in[3] = {c->dy[0], IN(0), IN(1)}, out = -1;
    int n = eng_grad_emit(c, op, "com.tensord", in, eng_grad_fwd(c)->nin > 1 ? 3 : 2, &out, 1);
    CHECK(n);
    ENG_TRY(eng_grad_copy_attrs(c, n));
    return set_dx(c, 0, out);
}

static eng_status g_softmax(eng_grad_ctx *c) {
    int log = !strcmp(eng_grad_fwd(c)->op_type, "LogSoftmax");
    return act(c, log ? "LogSoftmaxGrad" : "SoftmaxGrad", OUT(0));
}

const eng_grad_rule eng_grad_rules_math[] = {
    {"Add", g_add, 3},
    {"Sub", g_sub, 3},
    {"Mul", g_mul, 3},
    {"Div", g_div, 3},
    {"Pow", g_pow, 1},
    {"Sum", g_sum, ~0u},
    {"Neg", g_neg, 1},
    {"Exp", g_exp, 1},
    {"Log", g_log, 1},
    {"Sqrt", g_sqrt, 1},
    {"Reciprocal", g_reciprocal, 1},
    {"Abs", g_abs, 1},
    {"Relu", g_relu, 1},
    {"LeakyRelu", g_leaky, 1},
    {"Gelu", g_gelu, 1},
    {"Silu", g_silu, 1, "com.tensord"},
    {"Erf", g_erf, 1},
    {"Sigmoid", g_sigmoid, 1},
    {"Tanh", g_tanh, 1},
    {"Clip", g_clip, 1},
    {"Cast", g_cast, 1},
    {"Identity", g_identity, 1},
    {"Where", g_where, 6},
    {"ReduceSum", g_reduce, 1},
    {"ReduceMean", g_reduce, 1},
    {"Softmax", g_softmax, 1},
    {"LogSoftmax", g_softmax, 1},
    {NULL},
};
