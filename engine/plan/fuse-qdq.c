/* fuse-qdq.c - QDQ -> integer operators: the load-time rewrite that lets QDQ models (tensord quantize,
 * onnxruntime quantize_static QuantFormat.QDQ) run their convs and matmuls on the int8 kernels, as onnxruntime's
 * QDQ transformer does. Runs first in eng_graph_fuse, before the float fusions; TENSORD_NO_QDQ_FUSE=1 skips it.
 *
 * A candidate is a Conv or MatMul (default domain, one output) whose
 *   X = DequantizeLinear(x_q, x_s, x_zp): x_s float32 and x_zp uint8/int8, both constant single elements;
 *   W = DequantizeLinear(w_q, w_s, w_zp): w_q a constant int8/uint8 initializer (Conv: any rank >= 3; MatMul:
 *       2-D), w_s/w_zp constant, per tensor or per output channel (Conv axis 0, MatMul axis 1), w_zp present;
 *   Conv bias absent, a float32 constant [M], or DequantizeLinear(int32 constant, scale, zero point) of [M];
 * X's and W's DequantizeLinear may have other readers (a residual Add, a graph output): the fused op reads x_q
 * and w_q directly, and the DQ stays for the others (onnxruntime duplicates such DQs; sharing one is the same).
 *
 * Rewrites (each proven within one output quantization step of the float QDQ graph, else not taken):
 *   1. Conv/MatMul -> [Relu ->] [MaxPool (Conv) ->] QuantizeLinear(y_s, y_zp const single)   => QLinearConv /
 *      QLinearMatMul [-> MaxPool on its uint8 output]
 *      writing Q's output value. Relu is folded only when y_zp is its dtype's minimum (uint8 0, int8 -128): then
 *      Q(v) for v < 0 is round(v/y_s) + y_zp <= y_zp, saturated to y_zp = Q(Relu(v)). A float bias becomes
 *      round_half_even(b / (x_s * w_s[m])) in int32 (the int32 of a bias DQ is taken as is when its scale is
 *      bitwise x_s * w_s[m] and its zero point 0); that moves y by at most x_s*w_s[m]/2, so it is taken only when
 *      x_s*w_s[m] <= y_s/2 (total drift < y_s/4 plus float rounding: at most one step). oneDNN requantizes in
 *      float32: an int32 accumulator beyond 2^24 is rounded by at most |acc| 2^-24, which the multiplier makes
 *      at most 256 * 2^-24 of an output step, so that too stays within the one step. MatMul
 *      (no bias input in QLinearMatMul) takes only the bare MatMul -> [Relu ->] Q form.
 *   2. every other candidate (no Q after it, a Relu that Q does not absorb, a refused bias)
 *      => a matmul: com.microsoft MatMulIntegerToFloat(x_q, w_q, x_s, w_s, x_zp, w_zp [, bias]); a conv:
 *      ConvInteger(x_q, w_q, x_zp, w_zp) -> Cast(float) -> Mul(x_s * w_s) [-> Add(bias)],
 *      writing the original float output value. The int32 accumulation is exact, so the result is the float
 *      graph's up to float32 rounding (the float path rounds more: it sums float products).
 * Gemm (a dense layer: alpha = beta = 1, transA = 0, B = DQ of a 2-D constant, per channel along its output
 * axis: 1, or 0 when transB = 1) is a MatMul candidate with Conv's bias rules: transB's weights are transposed
 * once into a new [K, N] initializer; with a bias it takes form 2 (QLinearMatMul has no bias input).
 * An Add of two DQ outputs followed by Q becomes com.microsoft QLinearAdd (qz_add_candidate). Everything else is
 * left alone.
 *
 * Invariants: graph inputs, outputs and node names are kept (new nodes are named after the node they replace,
 * with a suffix); the values that consumers read keep their index; a DequantizeLinear is removed only when no
 * live node, graph output or subgraph uses its output any more. New nodes take the position of the last node
 * of their pattern, so the node list stays topological; producers are recomputed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuse-impl.h"

/* A DequantizeLinear feeding a candidate. */
typedef struct qz_dq {
    int node;           /* DQ node */
    int q, s, zp;       /* its input values (zp -1 when omitted) */
    const eng_tensor *qt, *st, *zt; /* constant data (qt only for weights) */
    eng_dtype dt;       /* quantized dtype */
    int64_t per;        /* scale entries (1: per tensor) */
} qz_dq;

typedef struct qz_ctx {
    fz_ctx z;
    int *anchor; /* per node: the original node it is placed after (-1: keep its own position) */
    int norig, cap;
} qz_ctx;

static int qz_int8(eng_dtype dt) { return dt == ENG_DTYPE_U8 || dt == ENG_DTYPE_I8; }

static int32_t qz_get_int(const eng_tensor *t, int64_t i) {
    if (t->dtype == ENG_DTYPE_U8) return ((const uint8_t *)t->data)[i];
    if (t->dtype == ENG_DTYPE_I8) return ((const int8_t *)t->data)[i];
    return ((const int32_t *)t->data)[i];
}

/* A constant initializer (not a graph input) with data, else NULL. */
static const eng_tensor *qz_const(const eng_graph *g, int v) {
    if (v < 0 || !g->values[v].init || !g->values[v].init->data || fz_is_graph_input(g, v)) return NULL;
    return g->values[v].init;
}

/* v is produced by a live DequantizeLinear with constant scale and zero point (zp required unless `zp_opt`);
 * `weight`: x_q must be a constant too, per-axis scale allowed along `axis` (normalised against x_q's rank).
 * Returns 1 and fills *d. */
static int qz_match_dq(const qz_ctx *c, int v, int weight, int axis, int zp_opt, qz_dq *d) {
    const eng_graph *g = c->z.g;
    if (v < 0) return 0;
    int p = g->values[v].producer;
    if (p < 0 || c->z.dead[p]) return 0;
    const eng_node *n = &g->nodes[p];
    if (!fz_is_op(n, "DequantizeLinear") || !fz_one_output(n) || n->outputs[0] != v || n->nin < 2) return 0;
    if (eng_node_attr_int(n, "block_size", 0) != 0) return 0;
    memset(d, 0, sizeof *d);
    d->node = p, d->q = n->inputs[0], d->s = n->inputs[1], d->zp = n->nin > 2 ? n->inputs[2] : -1;
    d->st = fz_const_f32(g, d->s);
    if (!d->st || d->q < 0) return 0;
    d->per = eng_tensor_numel(d->st);
    if (d->zp >= 0) {
        if (!(d->zt = qz_const(g, d->zp)) || eng_tensor_numel(d->zt) != d->per) return 0;
        d->dt = d->zt->dtype;
    } else if (!zp_opt) return 0;
    if (weight) {
        if (!(d->qt = qz_const(g, d->q))) return 0;
        if (d->zt && d->qt->dtype != d->dt) return 0;
        d->dt = d->qt->dtype;
    }
    if (d->per != 1) {
        if (!weight || d->st->ndim != 1 || !d->qt) return 0;
        int64_t ax = eng_node_attr_int(n, "axis", 1);
        if (ax < 0) ax += d->qt->ndim;
        if (ax != axis || d->qt->ndim <= axis || d->qt->dims[axis] != d->per) return 0;
    }
    return 1;
}

/* Append a node (domain "" or dom) placed after original node `after`; returns its index or -1 (out of memory). */
static int qz_add_node_in(qz_ctx *c, const char *base, const char *suffix, const char *op, const char *dom, const int *in,
                          int nin, int out, int after) {
    eng_graph *g = c->z.g;
    if (g->nnodes + 1 > c->cap) {
        int cap = c->cap * 2 + 8;
        unsigned char *dd = realloc(c->z.dead, (size_t)cap);
        if (!dd) return -1;
        c->z.dead = dd;
        int *an = realloc(c->anchor, (size_t)cap * sizeof(int));
        if (!an) return -1;
        c->anchor = an;
        c->cap = cap;
    }
    char name[512];
    snprintf(name, sizeof name, "%s%s", base, suffix);
    int k = eng_graph_add_node(g, name, op, dom, in, nin, &out, 1);
    if (k < 0) return -1;
    c->z.dead[k] = 0;
    c->anchor[k] = after;
    return k;
}

static int qz_add_node(qz_ctx *c, const char *base, const char *suffix, const char *op, const int *in, int nin, int out,
                       int after) {
    return qz_add_node_in(c, base, suffix, op, "", in, nin, out, after);
}

/* A new value named <base><suffix>[k]; with t (eng_alloc'd data, taken) as its initializer when t != NULL. */
static int qz_add_value(qz_ctx *c, const char *base, const char *suffix, eng_dtype dt, eng_tensor *t) {
    eng_graph *g = c->z.g;
    char name[512];
    snprintf(name, sizeof name, "%s%s", base, suffix);
    for (int k = 1; eng_graph_find_value(g, name) >= 0; k++) snprintf(name, sizeof name, "%s%s%d", base, suffix, k);
    int v = eng_graph_add_value(g, name);
    if (v < 0) {
        eng_tensor_destroy(&t);
        return -1;
    }
    g->values[v].dtype = dt;
    g->values[v].ndim = -1;
    if (t) {
        eng_value_set_init(g, v, t);
        g->values[v].ndim = t->ndim;
        memcpy(g->values[v].dims, t->dims, sizeof t->dims);
    }
    return v;
}

/* A new initializer tensor (zeroed): dtype, rank and dims. */
static eng_tensor *qz_tensor(eng_dtype dt, int ndim, const int64_t *dims) {
    eng_tensor *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->dtype = dt;
    t->ndim = ndim;
    memcpy(t->dims, dims, (size_t)ndim * sizeof *dims);
    size_t nb = eng_tensor_nbytes(t);
    if (!(t->data = eng_alloc(nb ? nb : 4))) {
        free(t);
        return NULL;
    }
    memset(t->data, 0, nb);
    return t;
}

static eng_status qz_copy_attrs(eng_graph *g, int from, int to) {
    for (int a = 0; a < g->nodes[from].nattr; a++) ENG_TRY(eng_node_add_attr(g, to, &g->nodes[from].attrs[a]));
    return ENG_STATUS_OK;
}

/* The bias of a candidate Conv as float (b[M], malloc'd) and, when it is a DQ of int32 with scale and zero point
 * that make its int32 usable as is, that int32 (bq). Returns 0 when the bias is not a supported constant. */
static int qz_bias(const qz_ctx *c, int v, int64_t M, float **b, const int32_t **bq, const eng_tensor **bqs) {
    const eng_graph *g = c->z.g;
    *b = NULL, *bq = NULL, *bqs = NULL;
    const eng_tensor *f = fz_const_f32(g, v);
    qz_dq d;
    if (f) {
        if (eng_tensor_numel(f) != M || f->ndim != 1) return 0;
        if (!(*b = malloc((size_t)M * sizeof(float)))) return 0;
        memcpy(*b, f->data, (size_t)M * sizeof(float));
        return 1;
    }
    if (!qz_match_dq(c, v, 1, 0, 1, &d) || d.qt->dtype != ENG_DTYPE_I32 || d.qt->ndim != 1 || d.qt->dims[0] != M) return 0;
    if (d.per != 1 && d.per != M) return 0;
    if (fz_uses(&c->z, v) != 1) return 0; /* the bias DQ feeds only this conv */
    if (!(*b = malloc((size_t)M * sizeof(float)))) return 0;
    int zero = 1;
    for (int64_t m = 0; m < M; m++) {
        int64_t k = d.per == 1 ? 0 : m;
        int32_t z = d.zt ? qz_get_int(d.zt, k) : 0;
        zero &= z == 0;
        (*b)[m] = (float)((int64_t)qz_get_int(d.qt, m) - z) * ((const float *)d.st->data)[k];
    }
    if (zero) *bq = d.qt->data, *bqs = d.st;
    return 1;
}

/* Scale entry m of a bias DQ (per tensor or [M]). */
static float qz_bias_scale(const eng_tensor *s, int64_t M, int64_t m) {
    return ((const float *)s->data)[eng_tensor_numel(s) == M ? m : 0];
}

/* A Gemm that is a dense layer y = A B (+ C): alpha = beta = 1, transA = 0; *trans_b gets transB. */
static int qz_gemm_plain(const eng_node *n, int *trans_b) {
    *trans_b = (int)eng_node_attr_int(n, "transB", 0);
    return eng_node_attr_int(n, "transA", 0) == 0 && eng_node_attr_float(n, "alpha", 1.f) == 1.f &&
           eng_node_attr_float(n, "beta", 1.f) == 1.f;
}

/* w_q [N, K] (transB) as a new [K, N] initializer value; -1 when out of memory. */
static int qz_transposed_weights(qz_ctx *c, const char *base, const eng_tensor *wq) {
    int64_t N = wq->dims[0], K = wq->dims[1], d[2] = {K, N};
    eng_tensor *t = qz_tensor(wq->dtype, 2, d);
    if (!t) return -1;
    size_t es = eng_dtype_size(wq->dtype);
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++)
            memcpy((char *)t->data + (size_t)(k * N + n) * es, (const char *)wq->data + (size_t)(n * K + k) * es, es);
    return qz_add_value(c, base, "_qdq_wT", wq->dtype, t);
}

/* What follows an op's output y on the way to a per-tensor QuantizeLinear: y [-> Relu] [-> MaxPool, when
 * `pool_ok`] -> Q, each the sole consumer of the one before. */
typedef struct qz_tail {
    int relu, pool, q;          /* node indices, -1 when absent (q -1: no usable Q) */
    const eng_tensor *ys, *yz;  /* Q's constant scale (float32 > 0) and zero point (8-bit), one element each */
} qz_tail;

/* Fills t; returns 1 when a usable Q ends the chain. A Relu is kept in the chain only where Q's saturation does
 * what it does (zero point at its type's minimum); otherwise there is no usable Q. */
static int qz_match_tail(const qz_ctx *c, int y, int pool_ok, qz_tail *t) {
    const eng_graph *g = c->z.g;
    t->relu = t->pool = -1, t->ys = t->yz = NULL;
    int q = fz_sole_consumer(&c->z, y);
    if (q >= 0 && fz_is_op(&g->nodes[q], "Relu") && fz_one_output(&g->nodes[q]) && g->nodes[q].inputs[0] == y) {
        t->relu = q;
        q = fz_sole_consumer(&c->z, g->nodes[q].outputs[0]);
    }
    int pre_q = t->relu >= 0 ? g->nodes[t->relu].outputs[0] : y; /* what Q (or a MaxPool before it) reads */
    /* conv [-> Relu] -> MaxPool -> Q (a stem): Q is monotonic, so MaxPool(Q(v)) = Q(MaxPool(v)) exactly and the
     * pool runs on the int8 conv's uint8 output */
    if (pool_ok && q >= 0 && fz_is_op(&g->nodes[q], "MaxPool") && g->nodes[q].nout == 1 && g->nodes[q].inputs[0] == pre_q) {
        t->pool = q;
        pre_q = g->nodes[q].outputs[0];
        q = fz_sole_consumer(&c->z, pre_q);
    }
    t->q = -1;
    if (q < 0 || !fz_is_op(&g->nodes[q], "QuantizeLinear") || !fz_one_output(&g->nodes[q]) || g->nodes[q].nin != 3 ||
        g->nodes[q].inputs[0] != pre_q || eng_node_attr_int(&g->nodes[q], "block_size", 0) != 0)
        return 0;
    const eng_tensor *ys = fz_const_f32(g, g->nodes[q].inputs[1]), *yz = qz_const(g, g->nodes[q].inputs[2]);
    if (!ys || !yz || eng_tensor_numel(ys) != 1 || eng_tensor_numel(yz) != 1 || !qz_int8(yz->dtype) ||
        !(((const float *)ys->data)[0] > 0.f))
        return 0;
    int64_t od = eng_node_attr_int(&g->nodes[q], "output_dtype", 0);
    if (od && od != yz->dtype) return 0;
    if (t->relu >= 0 && qz_get_int(yz, 0) != (yz->dtype == ENG_DTYPE_U8 ? 0 : -128)) return 0;
    t->q = q, t->ys = ys, t->yz = yz;
    return 1;
}

enum { QZ_MATMUL = 0, QZ_CONV = 1, QZ_GEMM = 2 };

/* One candidate at node i: a Conv, MatMul or Gemm (kind). */
static eng_status qz_candidate(qz_ctx *c, int i, int kind) {
    eng_graph *g = c->z.g;
    const eng_node *n = &g->nodes[i];
    const int conv = kind == QZ_CONV;
    int trans_b = 0;
    if (!fz_one_output(n) || n->nin < 2) return ENG_STATUS_OK;
    if (kind == QZ_GEMM && !qz_gemm_plain(n, &trans_b)) return ENG_STATUS_OK;
    qz_dq x, w;
    if (!qz_match_dq(c, n->inputs[0], 0, 0, 0, &x) || x.per != 1 || !qz_int8(x.dt)) return ENG_STATUS_OK;
    if (!qz_match_dq(c, n->inputs[1], 1, conv || trans_b ? 0 : 1, 0, &w) || !qz_int8(w.dt)) return ENG_STATUS_OK;
    if (conv ? w.qt->ndim < 3 : w.qt->ndim != 2) return ENG_STATUS_OK;
    const int mfirst = conv || trans_b; /* weights stored output-channel first: [M, K...] */
    int64_t M = w.qt->dims[mfirst ? 0 : 1];
    if (M <= 0 || (w.per != 1 && w.per != M)) return ENG_STATUS_OK;
    int bin = (conv || kind == QZ_GEMM) && n->nin > 2 ? n->inputs[2] : -1;
    float *bias = NULL;
    const int32_t *bq = NULL;
    const eng_tensor *bqs = NULL;
    if (bin >= 0 && !qz_bias(c, bin, M, &bias, &bq, &bqs)) return ENG_STATUS_OK;

    const float xs = ((const float *)x.st->data)[0];
    float *sc = malloc((size_t)M * sizeof(float)); /* x_s * w_s[m], float32 as QLinear ops compute it */
    if (!sc) {
        free(bias);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "QDQ fusion of '%s'", n->name);
    }
    for (int64_t m = 0; m < M; m++) sc[m] = xs * ((const float *)w.st->data)[w.per == 1 ? 0 : m];

    /* 1. QLinear form: output -> [Relu ->] Q */
    int y = n->outputs[0];
    qz_tail t;
    int qlinear = qz_match_tail(c, y, conv, &t);
    const int relu = t.relu, pool = t.pool, q = t.q;
    const eng_tensor *yz = t.yz;
    if (qlinear && (!conv && bin >= 0)) qlinear = 0;
    const float yscale = qlinear ? ((const float *)t.ys->data)[0] : 0.f;
    if (qlinear && bias)
        for (int64_t m = 0; m < M && qlinear; m++) {
            int exact = bq && qz_bias_scale(bqs, M, m) == sc[m];
            if (!exact && !((double)sc[m] <= 0.5 * yscale && fabs(bias[m] / (double)sc[m]) < 2147483000.0)) qlinear = 0;
        }

    eng_status st = ENG_STATUS_OK;
    char base[400];
    snprintf(base, sizeof base, "%s", n->name[0] ? n->name : g->values[y].name);
    if (trans_b && (w.q = qz_transposed_weights(c, base, w.qt)) < 0) goto oom; /* integer matmuls take [K, N] */
    if (qlinear) {
        int last = q, out = g->nodes[q].outputs[0];
        int bv = -1;
        if (bias) {
            eng_tensor *t = qz_tensor(ENG_DTYPE_I32, 1, &M);
            if (!t) goto oom;
            int32_t *bd = t->data;
            for (int64_t m = 0; m < M; m++)
                bd[m] = bq && qz_bias_scale(bqs, M, m) == sc[m]
                            ? bq[m] : (int32_t)nearbyint((double)bias[m] / (double)sc[m]);
            if ((bv = qz_add_value(c, base, "_qdq_bias_i32", ENG_DTYPE_I32, t)) < 0) goto oom;
        }
        int in[9] = {x.q, x.s, x.zp, w.q, w.s, w.zp, g->nodes[q].inputs[1], g->nodes[q].inputs[2], bv};
        int cout = out;
        if (pool >= 0 && (cout = qz_add_value(c, base, "_qlinear_out", yz->dtype, NULL)) < 0) goto oom;
        int k = qz_add_node(c, base, "_qlinear", conv ? "QLinearConv" : "QLinearMatMul", in,
                            bv >= 0 ? 9 : 8, cout, last);
        if (k < 0) goto oom;
        if (conv && qz_copy_attrs(g, i, k) != ENG_STATUS_OK) goto oom;
        if (pool >= 0) {
            int kp = qz_add_node(c, base, "_maxpool", "MaxPool", &cout, 1, out, last);
            if (kp < 0 || qz_copy_attrs(g, pool, kp) != ENG_STATUS_OK) goto oom;
            c->z.dead[pool] = 1;
        }
        c->z.dead[i] = c->z.dead[q] = 1;
        if (relu >= 0) c->z.dead[relu] = 1;
    } else {
        /* 2. integer form, float output. A matmul: one com.microsoft MatMulIntegerToFloat (scales and bias inside
         * oneDNN's int8 primitive); a conv: ConvInteger -> Cast -> Mul [-> Add] */
        if (!conv) {
            int bv = -1, yout = y;
            if (!bias && kind == QZ_MATMUL) { /* MatMul -> Add(constant [N]): the Add is the bias (exporters' Linear) */
                int a = fz_sole_consumer(&c->z, y);
                const eng_node *an = a >= 0 ? &g->nodes[a] : NULL;
                if (an && fz_is_op(an, "Add") && an->nin == 2 && fz_one_output(an)) {
                    int other = an->inputs[0] == y ? an->inputs[1] : an->inputs[0];
                    const eng_tensor *t = fz_const_f32(g, other);
                    if (t && t->ndim == 1 && t->dims[0] == M && (bias = malloc((size_t)M * sizeof(float)))) {
                        memcpy(bias, t->data, (size_t)M * sizeof(float));
                        yout = an->outputs[0];
                        c->z.dead[a] = 1;
                    }
                }
            }
            if (bias) {
                eng_tensor *bt = qz_tensor(ENG_DTYPE_F32, 1, &M);
                if (!bt) goto oom;
                memcpy(bt->data, bias, (size_t)M * sizeof(float));
                if ((bv = qz_add_value(c, base, "_qdq_bias", ENG_DTYPE_F32, bt)) < 0) goto oom;
            }
            int in[7] = {x.q, w.q, x.s, w.s, x.zp, w.zp, bv};
            if (qz_add_node_in(c, base, "_integer", "MatMulIntegerToFloat", "com.microsoft", in, bias ? 7 : 6, yout, i) < 0)
                goto oom;
            c->z.dead[i] = 1;
            c->z.changed = 1;
            goto done;
        }
        int64_t sd[ENG_MAX_DIMS] = {M};
        int r = conv ? w.qt->ndim - 1 : 1;
        for (int d = 1; d < r; d++) sd[d] = 1;
        eng_tensor *t = qz_tensor(ENG_DTYPE_F32, r, sd);
        if (!t) goto oom;
        memcpy(t->data, sc, (size_t)M * sizeof(float));
        int sv = qz_add_value(c, base, "_qdq_scale", ENG_DTYPE_F32, t), bv = -1;
        if (sv < 0) goto oom;
        if (bias) {
            eng_tensor *bt = qz_tensor(ENG_DTYPE_F32, r, sd);
            if (!bt) goto oom;
            memcpy(bt->data, bias, (size_t)M * sizeof(float));
            if ((bv = qz_add_value(c, base, "_qdq_bias", ENG_DTYPE_F32, bt)) < 0) goto oom;
        }
        int acc = qz_add_value(c, base, "_qdq_acc", ENG_DTYPE_I32, NULL);
        int accf = acc < 0 ? -1 : qz_add_value(c, base, "_qdq_accf", ENG_DTYPE_F32, NULL);
        int scaled = accf < 0 ? -1 : bias ? qz_add_value(c, base, "_qdq_scaled", ENG_DTYPE_F32, NULL) : y;
        if (scaled < 0) goto oom;
        int in[4] = {x.q, w.q, x.zp, w.zp};
        int k = qz_add_node(c, base, "_integer", conv ? "ConvInteger" : "MatMulInteger", in, 4, acc, i);
        if (k < 0 || (conv && qz_copy_attrs(g, i, k) != ENG_STATUS_OK)) goto oom;
        int kc = qz_add_node(c, base, "_cast", "Cast", &acc, 1, accf, i);
        if (kc < 0 || fz_add_attr_int(g, kc, "to", ENG_DTYPE_F32) != ENG_STATUS_OK) goto oom;
        int mi[2] = {accf, sv};
        if (qz_add_node(c, base, "_rescale", "Mul", mi, 2, scaled, i) < 0) goto oom;
        if (bias) {
            int ai[2] = {scaled, bv};
            if (qz_add_node(c, base, "_bias", "Add", ai, 2, y, i) < 0) goto oom;
        }
        c->z.dead[i] = 1;
    }
    c->z.changed = 1;
    goto done;
oom:
    st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "QDQ fusion of node '%s'", base);
done:
    free(sc);
    free(bias);
    return st;
}

/* Add(DQ(a), DQ(b)) [-> Relu] -> Q, every scale and zero point per tensor and one 8-bit dtype throughout =>
 * com.microsoft QLinearAdd(a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp) writing Q's output (a residual connection in
 * int8, as onnxruntime's QDQ transformer makes it). Relu folds only where Q's zero point is its type's minimum (Q
 * then saturates what Relu would clamp). QLinearAdd rescales in float32 as MLAS does: a few ulps from the float
 * graph's DQ -> Add -> Q, so within one output step. */
static eng_status qz_add_candidate(qz_ctx *c, int i) {
    eng_graph *g = c->z.g;
    const eng_node *n = &g->nodes[i];
    if (!fz_one_output(n) || n->nin != 2) return ENG_STATUS_OK;
    qz_dq a, b;
    if (!qz_match_dq(c, n->inputs[0], 0, 0, 0, &a) || a.per != 1 || !qz_int8(a.dt)) return ENG_STATUS_OK;
    if (!qz_match_dq(c, n->inputs[1], 0, 0, 0, &b) || b.per != 1 || b.dt != a.dt) return ENG_STATUS_OK;
    int y = n->outputs[0];
    qz_tail t;
    if (!qz_match_tail(c, y, 0, &t) || t.yz->dtype != a.dt) return ENG_STATUS_OK;
    const int relu = t.relu, q = t.q;
    char base[400];
    snprintf(base, sizeof base, "%s", n->name[0] ? n->name : g->values[y].name);
    int in[8] = {a.q, a.s, a.zp, b.q, b.s, b.zp, g->nodes[q].inputs[1], g->nodes[q].inputs[2]};
    int out = g->nodes[q].outputs[0];
    if (qz_add_node_in(c, base, "_qlinear", "QLinearAdd", "com.microsoft", in, 8, out, q) < 0)
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "QDQ fusion of node '%s'", base);
    c->z.dead[i] = c->z.dead[q] = 1;
    if (relu >= 0) c->z.dead[relu] = 1;
    c->z.changed = 1;
    return ENG_STATUS_OK;
}

/* Put the live nodes in order (each new node right after its anchor), release the dead, recompute producers. */
static eng_status qz_finish(qz_ctx *c) {
    eng_graph *g = c->z.g;
    int nn = g->nnodes, k = 0;
    eng_node *out = calloc((size_t)(nn ? nn : 1), sizeof *out);
    if (!out) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "QDQ fusion");
    for (int i = 0; i < c->norig; i++) {
        if (!c->z.dead[i]) out[k++] = g->nodes[i];
        for (int j = c->norig; j < nn; j++)
            if (c->anchor[j] == i && !c->z.dead[j]) out[k++] = g->nodes[j];
    }
    for (int i = 0; i < nn; i++)
        if (c->z.dead[i]) eng_node_release(&g->nodes[i]);
    memcpy(g->nodes, out, (size_t)k * sizeof *out);
    for (int i = k; i < nn; i++) memset(&g->nodes[i], 0, sizeof g->nodes[i]);
    g->nnodes = k;
    free(out);
    eng_graph_index_producers(g);
    return ENG_STATUS_OK;
}

/* ---- the int8 layout pass: channels last between int8 convs ----
 * A value is stored NHWC when its producer is a QLinearConv with 4-D weights, a QLinearAdd or a 2-D MaxPool of
 * such a conv's output (an int8 stem), every reader is such a QLinearConv (its X), QLinearAdd (A or B) or
 * MaxPool, and it is no graph output; the inputs and output of one QLinearAdd (elementwise: layout-blind only
 * when all three share one) or MaxPool are NHWC together or not at all. Convs
 * then read and write channels last with no conversion; a QLinearAdd so marked gets nhwc = 1, and its plan-time
 * check refuses operands of different shapes (broadcasting needs the logical layout). */
static int qz_is_qconv4(const eng_graph *g, const eng_node *n) {
    if (strcmp(n->op_type, "QLinearConv") || n->domain[0] || n->nin < 8 || n->inputs[3] < 0) return 0;
    const eng_value *w = &g->values[n->inputs[3]];
    return w->init ? w->init->ndim == 4 : w->ndim == 4;
}

static int qz_is_qadd(const eng_node *n) {
    return !strcmp(n->op_type, "QLinearAdd") && !strcmp(n->domain, "com.microsoft") && n->nout == 1;
}

/* A 2-D MaxPool (one output): channels last in and out together when it pools an int8 conv's output (a stem). */
static int qz_is_pool(const eng_graph *g, const eng_node *n) {
    if (!fz_is_op(n, "MaxPool") || n->nout != 1 || n->nin != 1 || n->inputs[0] < 0) return 0;
    int pr = g->values[n->inputs[0]].producer;
    const int64_t *ks;
    return pr >= 0 && qz_is_qconv4(g, &g->nodes[pr]) && eng_node_attr_ints(n, "kernel_shape", &ks) == 2;
}

/* g's producers must be current (eng_graph_index_producers). */
static eng_status qz_int8_layouts(eng_graph *g) {
    if (getenv("TENSORD_NO_INT8_NHWC")) return ENG_STATUS_OK;
    char *ok = calloc((size_t)g->nvalues + 1, 1);
    if (!ok) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "int8 layout pass");
    for (int i = 0; i < g->nnodes; i++) {
        const eng_node *n = &g->nodes[i];
        if ((qz_is_qconv4(g, n) || qz_is_qadd(n) || qz_is_pool(g, n)) && n->outputs[0] >= 0) ok[n->outputs[0]] = 1;
    }
    for (int o = 0; o < g->noutputs; o++) ok[g->outputs[o]] = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const eng_node *n = &g->nodes[i];
        for (int k = 0; k < n->nin; k++) {
            int v = n->inputs[k];
            if (v < 0 || !ok[v]) continue;
            if (!((qz_is_qconv4(g, n) && k == 0) || (qz_is_qadd(n) && (k == 0 || k == 3)) || qz_is_pool(g, n))) ok[v] = 0;
        }
        /* subgraphs reading it would see the wrong layout: conservative, any subgraph attribute clears all */
        for (int a = 0; a < n->nattr; a++)
            if (n->attrs[a].g) memset(ok, 0, (size_t)g->nvalues);
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = 0; i < g->nnodes; i++) {
            const eng_node *n = &g->nodes[i];
            int pool = qz_is_pool(g, n);
            if (!qz_is_qadd(n) && !pool) continue;
            int a = n->inputs[0], b = pool ? n->inputs[0] : n->inputs[3], y = n->outputs[0];
            int all = a >= 0 && b >= 0 && y >= 0 && ok[a] && ok[b] && ok[y];
            if (!all && ((a >= 0 && ok[a]) || (b >= 0 && ok[b]) || (y >= 0 && ok[y]))) {
                if (a >= 0) ok[a] = 0;
                if (b >= 0) ok[b] = 0;
                if (y >= 0) ok[y] = 0;
                changed = 1;
            }
        }
    }
    eng_status st = ENG_STATUS_OK;
    for (int i = 0; i < g->nnodes && st == ENG_STATUS_OK; i++) {
        const eng_node *n = &g->nodes[i];
        if (qz_is_qconv4(g, n)) {
            if (ok[n->inputs[0]]) st = fz_add_attr_int(g, i, "x_layout", KRN_NN_LAYOUT_NHWC);
            if (st == ENG_STATUS_OK && n->outputs[0] >= 0 && ok[n->outputs[0]])
                st = fz_add_attr_int(g, i, "y_layout", KRN_NN_LAYOUT_NHWC);
        } else if (qz_is_qadd(n) && ok[n->outputs[0]]) {
            st = fz_add_attr_int(g, i, "nhwc", 1);
        } else if (qz_is_pool(g, n) && ok[n->outputs[0]]) {
            st = fz_add_attr_int(g, i, "x_layout", KRN_NN_LAYOUT_NHWC);
            if (st == ENG_STATUS_OK) st = fz_add_attr_int(g, i, "y_layout", KRN_NN_LAYOUT_NHWC);
        }
    }
    free(ok);
    return st;
}

eng_status eng_graph_fuse_qdq(eng_graph *g) {
    if (!g || g->nnodes == 0) return ENG_STATUS_OK;
    const char *off = getenv("TENSORD_NO_QDQ_FUSE");
    if (off && *off && strcmp(off, "0")) return ENG_STATUS_OK;
    eng_graph_index_producers(g);
    int has = 0;
    for (int i = 0; i < g->nnodes && !has; i++) has = fz_is_op(&g->nodes[i], "DequantizeLinear");
    if (!has) return qz_int8_layouts(g); /* QOperator models: their QLinearConvs chain too */
    qz_ctx c = {{g, calloc((size_t)g->nnodes, 1), 0}, malloc((size_t)g->nnodes * sizeof(int)), g->nnodes, g->nnodes};
    if (!c.z.dead || !c.anchor) {
        free(c.z.dead);
        free(c.anchor);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "QDQ fusion");
    }
    for (int i = 0; i < g->nnodes; i++) c.anchor[i] = -1;
    eng_status st = ENG_STATUS_OK;
    for (int i = 0; i < c.norig && st == ENG_STATUS_OK; i++) {
        if (c.z.dead[i]) continue;
        const eng_node *n = &g->nodes[i];
        if (fz_is_op(n, "Conv")) st = qz_candidate(&c, i, QZ_CONV);
        else if (fz_is_op(n, "MatMul")) st = qz_candidate(&c, i, QZ_MATMUL);
        else if (fz_is_op(n, "Gemm")) st = qz_candidate(&c, i, QZ_GEMM);
        else if (fz_is_op(n, "Add")) st = qz_add_candidate(&c, i);
    }
    /* DequantizeLinear nodes left without a use (repeat: none feeds another, but stay general) */
    for (int again = 1; again && c.z.changed;) {
        again = 0;
        for (int i = 0; i < c.norig; i++)
            if (!c.z.dead[i] && fz_is_op(&g->nodes[i], "DequantizeLinear") && fz_one_output(&g->nodes[i]) &&
                fz_uses(&c.z, g->nodes[i].outputs[0]) == 0)
                c.z.dead[i] = 1, again = 1;
    }
    eng_status fst = c.z.changed || g->nnodes != c.norig ? qz_finish(&c) : ENG_STATUS_OK;
    if (st == ENG_STATUS_OK) st = fst;
    if (st == ENG_STATUS_OK) st = qz_int8_layouts(g);
    free(c.z.dead);
    free(c.anchor);
    return st;
}
