/* plan-split.c - batch-parallel execution of a static plan (see plan.h).
 *
 * A batch of N rows runs as chunks of `rows` rows; each of T worker threads runs its own single-threaded plan
 * compiled for `rows` rows, taking the next chunk whenever it is free; a last, shorter chunk has its own plan. Between layers no
 * thread waits on another, and a chunk's activations are sized to stay in the core's L2 cache, where the whole
 * batch on T threads streams every layer's activations through memory.
 *
 * This is only correct when row i of every output depends on row i of the batched inputs alone. That is proven
 * per plan, not assumed:
 *  1. Batch analysis over the full-batch plan's steps. Every value gets m: 0 for batch-free values (weights,
 *     folded constants, inputs with a fixed first dim), or m > 0 when axis 0 holds N*m rows of which rows
 *     [i*m, (i+1)*m) belong to batch row i (a Reshape from [N,128,256] to [N*128,256] gives m = 128). Each op
 *     kind has a rule (eltwise with broadcasting, per-image ops, axis ops whose axis is not 0, reshapes, matmul,
 *     gather, reduce, slice, pad ...); an op without a rule, a random op, or any use that would mix rows (a
 *     reduction or softmax over axis 0, a transpose moving axis 0, a constant with N rows added to a batch
 *     value) rejects the split.
 *  2. The sub-plan for `rows` rows must have the same steps, and every value the shape the analysis predicts
 *     (axis 0 scaled from N*m to rows*m, everything else equal). Every folded constant a step reads must be
 *     byte-equal in both plans (so a constant computed from the batch size, e.g. a division by Shape(x)[0],
 *     rejects the split), except the target-shape inputs of Reshape and Expand, whose effect step 2 checks.
 * Anything unexpected leaves the plan unsplit: splitting is an optimisation, never a behaviour change.
 */
#include <omp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plan-impl.h"

/* At least this many chunks per thread when the batch allows: threads take chunks as they come free, so a
 * thread that is held up (a preempted vCPU) delays the batch by one small chunk, not by its whole share. */
#define SPLIT_CHUNKS_PER_THREAD 4
#define SPLIT_WEIGHT_LIMIT ((size_t)1 << 30) /* each worker packs its own weights: skip for models larger than this */

struct plan_split {
    int nworkers;
    int64_t N, rows, nchunks;
    eng_plan **full; /* per worker: plan for `rows` rows */
    eng_plan *tail;  /* plan for the last chunk when it is shorter, or NULL */
    int owns;        /* 1: full/tail are ours to free; 0: they belong to opts.subplans */
    int64_t *in_m;   /* per graph input: rows per batch row (1), or 0: passed whole */
    int64_t *out_m;  /* per graph output: rows per batch row */
    eng_tensor *outs;/* per graph output: the full-batch result (eng_alloc'd) */
};

enum {
    R_NONE = 0, R_ELTWISE, R_PERITEM, R_AXIS, R_ALIAS, R_TRANSPOSE, R_MATMUL, R_GEMM, R_REDUCE, R_GATHER,
    R_SLICE, R_PAD, R_TILE, R_EXPAND,
};

typedef struct split_rule { const char *op; int rule; } split_rule;

static const split_rule split_rules[] = {
    {"Add", R_ELTWISE}, {"Sub", R_ELTWISE}, {"Mul", R_ELTWISE}, {"Div", R_ELTWISE}, {"Pow", R_ELTWISE},
    {"Mod", R_ELTWISE}, {"Sqrt", R_ELTWISE}, {"Reciprocal", R_ELTWISE}, {"Exp", R_ELTWISE}, {"Log", R_ELTWISE},
    {"Abs", R_ELTWISE}, {"Neg", R_ELTWISE}, {"Floor", R_ELTWISE}, {"Ceil", R_ELTWISE}, {"Round", R_ELTWISE},
    {"Sign", R_ELTWISE}, {"Erf", R_ELTWISE}, {"Tanh", R_ELTWISE}, {"Sigmoid", R_ELTWISE}, {"Relu", R_ELTWISE},
    {"LeakyRelu", R_ELTWISE}, {"Elu", R_ELTWISE}, {"Selu", R_ELTWISE}, {"Celu", R_ELTWISE}, {"Gelu", R_ELTWISE},
    {"HardSigmoid", R_ELTWISE}, {"HardSwish", R_ELTWISE}, {"Softplus", R_ELTWISE}, {"Softsign", R_ELTWISE},
    {"Mish", R_ELTWISE}, {"ThresholdedRelu", R_ELTWISE}, {"Shrink", R_ELTWISE}, {"PRelu", R_ELTWISE},
    {"Clip", R_ELTWISE}, {"Min", R_ELTWISE}, {"Max", R_ELTWISE}, {"Sum", R_ELTWISE}, {"Mean", R_ELTWISE},
    {"Where", R_ELTWISE}, {"Equal", R_ELTWISE}, {"Greater", R_ELTWISE}, {"GreaterOrEqual", R_ELTWISE},
    {"Less", R_ELTWISE}, {"LessOrEqual", R_ELTWISE}, {"Not", R_ELTWISE}, {"And", R_ELTWISE}, {"Or", R_ELTWISE},
    {"Xor", R_ELTWISE}, {"Cast", R_ELTWISE}, {"CastLike", R_ELTWISE}, {"Identity", R_ELTWISE},
    {"Dropout", R_ELTWISE}, {"IsNaN", R_ELTWISE}, {"IsInf", R_ELTWISE}, {"Sin", R_ELTWISE}, {"Cos", R_ELTWISE},
    {"Tan", R_ELTWISE}, {"Asin", R_ELTWISE}, {"Acos", R_ELTWISE}, {"Atan", R_ELTWISE}, {"Sinh", R_ELTWISE},
    {"Cosh", R_ELTWISE}, {"Asinh", R_ELTWISE}, {"Acosh", R_ELTWISE}, {"Atanh", R_ELTWISE},
    {"Conv", R_PERITEM}, {"ConvTranspose", R_PERITEM}, {"FusedConv", R_PERITEM}, {"MaxPool", R_PERITEM},
    {"AveragePool", R_PERITEM}, {"LpPool", R_PERITEM}, {"GlobalAveragePool", R_PERITEM},
    {"GlobalMaxPool", R_PERITEM}, {"GlobalLpPool", R_PERITEM}, {"BatchNormalization", R_PERITEM},
    {"InstanceNormalization", R_PERITEM}, {"LRN", R_PERITEM}, {"DepthToSpace", R_PERITEM},
    {"SpaceToDepth", R_PERITEM}, {"Resize", R_PERITEM}, {"Upsample", R_PERITEM},
    {"Softmax", R_AXIS}, {"LogSoftmax", R_AXIS}, {"Hardmax", R_AXIS}, {"LpNormalization", R_AXIS},
    {"LayerNormalization", R_AXIS}, {"ArgMax", R_AXIS}, {"ArgMin", R_AXIS}, {"TopK", R_AXIS},
    {"Concat", R_AXIS}, {"Split", R_AXIS},
    {"Reshape", R_ALIAS}, {"Flatten", R_ALIAS}, {"Squeeze", R_ALIAS}, {"Unsqueeze", R_ALIAS},
    {"Transpose", R_TRANSPOSE}, {"MatMul", R_MATMUL}, {"FusedMatMul", R_MATMUL}, {"Gemm", R_GEMM},
    {"FusedGemm", R_GEMM}, {"ReduceMean", R_REDUCE}, {"ReduceSum", R_REDUCE}, {"ReduceMax", R_REDUCE},
    {"ReduceMin", R_REDUCE}, {"ReduceProd", R_REDUCE}, {"ReduceL1", R_REDUCE}, {"ReduceL2", R_REDUCE},
    {"ReduceLogSum", R_REDUCE}, {"ReduceLogSumExp", R_REDUCE}, {"ReduceSumSquare", R_REDUCE},
    {"Gather", R_GATHER}, {"Slice", R_SLICE}, {"Pad", R_PAD}, {"Tile", R_TILE}, {"Expand", R_EXPAND},
    {NULL, R_NONE},
};

static int split_rule_of(const eng_node *n) {
    int ours = !strcmp(n->domain, "com.tensord");
    if (n->domain[0] && !ours) return R_NONE;
    for (const split_rule *r = split_rules; r->op; r++)
        if (!strcmp(r->op, n->op_type)) {
            int fused = !strncmp(r->op, "Fused", 5);
            return fused == ours ? r->rule : R_NONE;
        }
    return R_NONE;
}

/* The analysis of one plan: m per value (see the file comment). */
typedef struct split_an {
    const eng_plan *p;
    int64_t N;
    int64_t *m;
    char why[200];
} split_an;

static int an_fail(split_an *a, const eng_node *n, const char *what) {
    snprintf(a->why, sizeof a->why, "node '%s' (%s): %s", n->name, n->op_type, what);
    return 0;
}

static const eng_tensor *an_val(const split_an *a, int v) { return &a->p->vals[v]; }
static int an_present(const split_an *a, const eng_node *n, int i) {
    return i < n->nin && n->inputs[i] >= 0 && a->p->kind[n->inputs[i]] != VAL_NONE;
}
static int64_t an_m(const split_an *a, const eng_node *n, int i) { return an_present(a, n, i) ? a->m[n->inputs[i]] : 0; }

/* A constant int64/int32 input's values (NULL if the input is absent or not a plan-time constant). */
static int an_const_ints(const split_an *a, const eng_node *n, int i, int64_t *buf, int cap) {
    if (!an_present(a, n, i) || a->p->kind[n->inputs[i]] != VAL_CONST) return -1;
    const eng_tensor *t = an_val(a, n->inputs[i]);
    int64_t k = eng_tensor_numel(t);
    if (k > cap || !t->data) return -1;
    for (int64_t j = 0; j < k; j++) {
        if (t->dtype == ENG_DTYPE_I64) buf[j] = ((const int64_t *)t->data)[j];
        else if (t->dtype == ENG_DTYPE_I32) buf[j] = ((const int32_t *)t->data)[j];
        else return -1;
    }
    return (int)k;
}

/* Axis list from attribute `name` or (when absent) input `inp`: count, -1 when neither is given, -2 when the
 * input is not a constant. Axes are normalised to [0, rank). */
static int an_axes(const split_an *a, const eng_node *n, const char *name, int inp, int rank, int64_t *ax, int cap) {
    const int64_t *at;
    int k = eng_node_attr_ints(n, name, &at);
    if (k >= 0) {
        if (k > cap) return -2;
        memcpy(ax, at, (size_t)k * sizeof *ax);
    } else if (an_present(a, n, inp)) {
        k = an_const_ints(a, n, inp, ax, cap);
        if (k < 0) return -2;
    } else {
        return -1;
    }
    for (int j = 0; j < k; j++) {
        if (ax[j] < 0) ax[j] += rank;
        if (ax[j] < 0 || ax[j] >= rank) return -2;
    }
    return k;
}

/* Outputs of n take rows-per-item m; each present output must have N*m rows at axis 0 and rank >= 1. */
static int an_set_outputs(split_an *a, const eng_node *n, int64_t m) {
    for (int i = 0; i < n->nout; i++) {
        int v = n->outputs[i];
        if (v < 0) continue;
        const eng_tensor *t = an_val(a, v);
        if (t->ndim < 1 || t->dims[0] != a->N * m) return an_fail(a, n, "an output does not keep the batch rows at axis 0");
        a->m[v] = m;
    }
    return 1;
}

/* Inputs from `from` on must all be batch-free. */
static int an_rest_free(split_an *a, const eng_node *n, int from) {
    for (int i = from; i < n->nin; i++)
        if (an_m(a, n, i)) return an_fail(a, n, "a second input carries batch rows");
    return 1;
}

static int an_eltwise(split_an *a, const eng_node *n) {
    const eng_tensor *o = an_val(a, n->outputs[0]);
    int64_t m = 0;
    if (o->ndim < 1) return an_fail(a, n, "scalar output");
    for (int i = 0; i < n->nin; i++) {
        if (!an_present(a, n, i)) continue;
        const eng_tensor *t = an_val(a, n->inputs[i]);
        if (an_m(a, n, i)) {
            if (t->ndim != o->ndim || t->dims[0] != o->dims[0]) return an_fail(a, n, "batch rows are broadcast");
            m = a->m[n->inputs[i]];
        } else if (t->ndim == o->ndim && t->dims[0] != 1) {
            return an_fail(a, n, "a batch-free operand spans axis 0");
        }
    }
    return an_set_outputs(a, n, m);
}

static int an_matmul(split_an *a, const eng_node *n, int gemm) {
    const eng_tensor *A = an_val(a, n->inputs[0]), *B = an_val(a, n->inputs[1]), *Y = an_val(a, n->outputs[0]);
    int64_t ma = an_m(a, n, 0), mb = an_m(a, n, 1);
    if (!an_rest_free(a, n, 2)) return 0;
    if (gemm) {
        if (eng_node_attr_int(n, "transA", 0) || mb || !ma) return an_fail(a, n, "batch rows not in A's rows");
        if (n->nin > 2 && an_present(a, n, 2)) {
            const eng_tensor *C = an_val(a, n->inputs[2]);
            if (C->ndim == 2 && C->dims[0] != 1) return an_fail(a, n, "bias C spans the rows");
        }
        return an_set_outputs(a, n, ma);
    }
    if (ma && !mb) {
        if (A->ndim < 2) return an_fail(a, n, "batch rows are A's reduction axis");
        if (B->ndim == Y->ndim && B->ndim > 2 && B->dims[0] != 1) return an_fail(a, n, "B spans the batch axis");
        return an_set_outputs(a, n, ma);
    }
    if (mb && !ma) {
        if (B->ndim < 3 || B->ndim != Y->ndim || (A->ndim == Y->ndim && A->dims[0] != 1))
            return an_fail(a, n, "batch rows are B's reduction axis");
        return an_set_outputs(a, n, mb);
    }
    if (A->ndim < 3 || A->ndim != B->ndim || A->dims[0] != B->dims[0])
        return an_fail(a, n, "batch rows meet in the reduction");
    return an_set_outputs(a, n, ma);
}

static int an_axis_op(split_an *a, const eng_node *n, int64_t m) {
    const eng_tensor *x = an_val(a, n->inputs[0]);
    const char *op = n->op_type;
    int64_t dflt = 0;
    if (!strcmp(op, "Softmax") || !strcmp(op, "LogSoftmax") || !strcmp(op, "Hardmax"))
        dflt = a->p->g->opset >= 13 ? -1 : 1;
    else if (!strcmp(op, "LpNormalization") || !strcmp(op, "LayerNormalization") || !strcmp(op, "TopK"))
        dflt = -1;
    int64_t axis = eng_node_attr_int(n, "axis", dflt);
    if (axis < 0) axis += x->ndim;
    if (axis <= 0 || axis >= x->ndim) return an_fail(a, n, "works along the batch axis");
    if (!strcmp(op, "Concat")) {
        for (int i = 0; i < n->nin; i++)
            if (an_present(a, n, i) && (an_m(a, n, i) != m || an_val(a, n->inputs[i])->dims[0] != x->dims[0]))
                return an_fail(a, n, "concatenates batch-free rows");
    } else if (!an_rest_free(a, n, 1)) {
        return 0;
    }
    return an_set_outputs(a, n, m);
}

static int an_reduce(split_an *a, const eng_node *n, int64_t m) {
    int64_t ax[ENG_MAX_DIMS];
    int rank = an_val(a, n->inputs[0])->ndim;
    int k = an_axes(a, n, "axes", 1, rank, ax, ENG_MAX_DIMS);
    if (k == -2) return an_fail(a, n, "axes are not constant");
    if (k <= 0 && !eng_node_attr_int(n, "noop_with_empty_axes", 0)) return an_fail(a, n, "reduces all axes");
    for (int j = 0; j < k; j++)
        if (ax[j] == 0) return an_fail(a, n, "reduces the batch axis");
    return an_set_outputs(a, n, m);
}

static int an_slice(split_an *a, const eng_node *n, int64_t m) {
    const eng_tensor *x = an_val(a, n->inputs[0]);
    int64_t st[ENG_MAX_DIMS], en[ENG_MAX_DIMS], ax[ENG_MAX_DIMS], sp[ENG_MAX_DIMS];
    int k, ke, ka, ks;
    if (n->nin == 1) { /* opset < 10: attributes */
        const int64_t *s, *e;
        k = eng_node_attr_ints(n, "starts", &s);
        ke = eng_node_attr_ints(n, "ends", &e);
        if (k < 0 || k != ke || k > ENG_MAX_DIMS) return an_fail(a, n, "starts/ends");
        memcpy(st, s, (size_t)k * sizeof *st);
        memcpy(en, e, (size_t)k * sizeof *en);
        ka = an_axes(a, n, "axes", 99, x->ndim, ax, ENG_MAX_DIMS);
        ks = -1;
    } else {
        k = an_const_ints(a, n, 1, st, ENG_MAX_DIMS);
        ke = an_const_ints(a, n, 2, en, ENG_MAX_DIMS);
        if (k < 0 || k != ke) return an_fail(a, n, "starts/ends are not constant");
        ka = an_axes(a, n, "", 3, x->ndim, ax, ENG_MAX_DIMS);
        ks = an_present(a, n, 4) ? an_const_ints(a, n, 4, sp, ENG_MAX_DIMS) : -1;
        if (an_present(a, n, 4) && ks != k) return an_fail(a, n, "steps are not constant");
    }
    if (ka == -2 || (ka >= 0 && ka != k)) return an_fail(a, n, "axes are not constant");
    for (int j = 0; j < k; j++) {
        int64_t axis = ka >= 0 ? ax[j] : j;
        if (axis != 0) continue;
        int64_t step = ks >= 0 ? sp[j] : 1;
        if (st[j] != 0 || step != 1 || en[j] < x->dims[0]) return an_fail(a, n, "slices the batch axis");
    }
    if (!an_rest_free(a, n, 1)) return 0;
    return an_set_outputs(a, n, m);
}

static int an_node(split_an *a, const plan_step *s) {
    const eng_node *n = &a->p->g->nodes[s->node];
    if (s->def->flags & (ENG_OP_RANDOM | ENG_OP_SHAPE_ONLY)) return an_fail(a, n, "random or shape-reading op");
    int any = 0;
    for (int i = 0; i < n->nin; i++) any |= an_m(a, n, i) != 0;
    if (!any) return an_fail(a, n, "runs on batch-free values only"); /* would have been folded */
    int64_t m0 = an_m(a, n, 0);
    int rule = split_rule_of(n);
    if (rule != R_ELTWISE && rule != R_MATMUL && rule != R_GEMM && rule != R_GATHER && !m0)
        return an_fail(a, n, "batch rows enter through a side input");
    switch (rule) {
    case R_ELTWISE: return an_eltwise(a, n);
    case R_PERITEM: {
        if (!strcmp(n->op_type, "MaxPool") && n->nout > 1 && n->outputs[1] >= 0)
            return an_fail(a, n, "MaxPool indices count across the batch");
        if (!strcmp(n->op_type, "BatchNormalization") &&
            (eng_node_attr_int(n, "training_mode", 0) || (n->nout > 1 && n->outputs[1] >= 0)))
            return an_fail(a, n, "training-mode statistics span the batch");
        int from = 1;
        if (!strcmp(n->op_type, "FusedConv") && an_m(a, n, 3)) { /* residual Z: same rows as Y */
            const eng_tensor *z = an_val(a, n->inputs[3]), *y = an_val(a, n->outputs[0]);
            if (an_m(a, n, 3) != m0 || !eng_shape_equal(z, y)) return an_fail(a, n, "residual rows differ");
            if (!an_rest_free(a, n, 4) || an_m(a, n, 1) || an_m(a, n, 2)) return an_fail(a, n, "batch weights");
            from = n->nin;
        }
        if (!an_rest_free(a, n, from)) return 0;
        return an_set_outputs(a, n, m0);
    }
    case R_AXIS: return an_axis_op(a, n, m0);
    case R_ALIAS: {
        if (!an_rest_free(a, n, 1)) return 0;
        const eng_tensor *o = an_val(a, n->outputs[0]), *x = an_val(a, n->inputs[0]);
        /* the bytes do not move: N equal contiguous blocks stay blocks if axis 0 still holds a multiple of N */
        if (o->ndim < 1 || o->dims[0] <= 0 || o->dims[0] % a->N || eng_tensor_numel(x) != eng_tensor_numel(o))
            return an_fail(a, n, "reshapes the batch rows away");
        return an_set_outputs(a, n, o->dims[0] / a->N);
    }
    case R_TRANSPOSE: {
        const int64_t *perm;
        int k = eng_node_attr_ints(n, "perm", &perm);
        if (k < 1 || perm[0] != 0) return an_fail(a, n, "moves the batch axis");
        return an_set_outputs(a, n, m0);
    }
    case R_MATMUL: return an_matmul(a, n, 0);
    case R_GEMM: return an_matmul(a, n, 1);
    case R_REDUCE: return an_reduce(a, n, m0);
    case R_GATHER: {
        const eng_tensor *x = an_val(a, n->inputs[0]), *ix = an_val(a, n->inputs[1]);
        int64_t axis = eng_node_attr_int(n, "axis", 0);
        if (axis < 0) axis += x->ndim;
        if (m0 && !an_m(a, n, 1) && axis > 0) return an_set_outputs(a, n, m0);
        if (!m0 && an_m(a, n, 1) && axis == 0 && ix->ndim >= 1) return an_set_outputs(a, n, an_m(a, n, 1));
        return an_fail(a, n, "gathers along the batch axis");
    }
    case R_SLICE: return an_slice(a, n, m0);
    case R_PAD: {
        int rank = an_val(a, n->inputs[0])->ndim;
        int64_t pads[2 * ENG_MAX_DIMS];
        const int64_t *pa;
        int k = eng_node_attr_ints(n, "pads", &pa);
        if (k >= 0 && k <= 2 * ENG_MAX_DIMS) memcpy(pads, pa, (size_t)k * sizeof *pads);
        else k = an_const_ints(a, n, 1, pads, 2 * ENG_MAX_DIMS);
        if (k != 2 * rank || an_present(a, n, 3) || pads[0] || pads[rank]) return an_fail(a, n, "pads the batch axis");
        if (!an_rest_free(a, n, 1)) return 0;
        return an_set_outputs(a, n, m0);
    }
    case R_TILE: {
        int64_t rep[ENG_MAX_DIMS];
        int k = an_const_ints(a, n, 1, rep, ENG_MAX_DIMS);
        if (k < 1 || rep[0] != 1 || !an_rest_free(a, n, 1)) return an_fail(a, n, "tiles the batch axis");
        return an_set_outputs(a, n, m0);
    }
    case R_EXPAND: {
        const eng_tensor *x = an_val(a, n->inputs[0]), *o = an_val(a, n->outputs[0]);
        if (x->ndim != o->ndim || x->dims[0] != o->dims[0] || !an_rest_free(a, n, 1))
            return an_fail(a, n, "expands the batch axis");
        return an_set_outputs(a, n, m0);
    }
    default: return an_fail(a, n, "no batch rule for this op");
    }
}

/* May this constant input differ between the full plan and a sub-plan? Target shapes only (Reshape, Expand,
 * Resize sizes): split_verify checks the shapes they produce. */
static int shape_input(const eng_node *n, int i) {
    if (n->domain[0]) return 0;
    return (i == 1 && (!strcmp(n->op_type, "Reshape") || !strcmp(n->op_type, "Expand"))) ||
           (i == 3 && !strcmp(n->op_type, "Resize"));
}

/* Check that sub-plan q (rows rows) matches the full plan p under the analysis m. */
static int split_verify(const eng_plan *p, const eng_plan *q, const int64_t *m, int64_t rows) {
    const eng_graph *g = p->g;
    if (q->dynamic || q->nsteps != p->nsteps) return 0;
    for (int si = 0; si < p->nsteps; si++)
        if (q->steps[si].node != p->steps[si].node) return 0;
    for (int v = 0; v < g->nvalues; v++) {
        if ((p->kind[v] == VAL_NONE) != (q->kind[v] == VAL_NONE) || (p->kind[v] == VAL_CONST) != (q->kind[v] == VAL_CONST))
            return 0;
        if (p->kind[v] == VAL_NONE) continue;
        eng_tensor want = p->vals[v];
        if (m[v]) want.dims[0] = rows * m[v];
        if (want.dtype != q->vals[v].dtype || !eng_shape_equal(&want, &q->vals[v])) return 0;
    }
    for (int si = 0; si < p->nsteps; si++) {
        const eng_node *n = &g->nodes[p->steps[si].node];
        for (int i = 0; i < n->nin; i++) {
            int v = n->inputs[i];
            if (v < 0 || p->kind[v] != VAL_CONST || shape_input(n, i)) continue;
            size_t nb = eng_tensor_nbytes(&p->vals[v]);
            if (nb && (!p->vals[v].data || !q->vals[v].data || memcmp(p->vals[v].data, q->vals[v].data, nb))) return 0;
        }
    }
    return 1;
}

static size_t split_cache_bytes(void) {
    long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? (size_t)l2 : (size_t)1 << 20;
}

static int split_enabled(void) {
    const char *e = getenv("TENSORD_BATCH_SPLIT");
    return !(e && *e == '0');
}

#define SPLIT_CACHE_MAX 64

struct eng_plan_cache {
    struct {
        const eng_graph *g;
        eng_tensor *shapes; /* g->ninputs input shapes (data NULL) */
        int slot;           /* worker index, or nworkers for a tail plan */
        eng_precision precision;
        const krn_backend *backend;
        eng_plan *plan;
    } e[SPLIT_CACHE_MAX];
    int n;
};

eng_plan_cache *eng_plan_cache_new(void) { return calloc(1, sizeof(eng_plan_cache)); }

void eng_plan_cache_free(eng_plan_cache **cp) {
    if (!cp || !*cp) return;
    for (int i = 0; i < (*cp)->n; i++) {
        eng_plan_free(&(*cp)->e[i].plan);
        free((*cp)->e[i].shapes);
    }
    free(*cp);
    *cp = NULL;
}

int eng_plan_cache_size(const eng_plan_cache *c) { return c ? c->n : 0; }

/* The sub-plan for `rows` rows (the full plan's input shapes with axis 0 of batched inputs set to rows) in
 * slot `slot`: found in cache c, or compiled (and kept in c when there is one, else owned by the caller). */
static eng_status split_plan_get(const eng_plan *p, const eng_tensor *inputs, const plan_split *sp, int64_t rows,
                                 int slot, eng_plan_cache *c, eng_plan **out) {
    const eng_graph *g = p->g;
    *out = NULL;
    eng_tensor *in = calloc((size_t)g->ninputs + 1, sizeof *in);
    if (!in) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; i < g->ninputs; i++) {
        in[i] = inputs[i];
        in[i].data = NULL;
        if (sp->in_m[i]) in[i].dims[0] = rows;
    }
    for (int i = 0; c && i < c->n; i++)
        if (c->e[i].g == g && c->e[i].slot == slot && c->e[i].precision == p->opts.precision &&
            c->e[i].backend == p->opts.backend && eng_shapes_equal_n(c->e[i].shapes, in, g->ninputs)) {
            free(in);
            *out = c->e[i].plan;
            return ENG_STATUS_OK;
        }
    eng_plan_opts o = p->opts;
    o.nthreads = 1;
    o.no_split = 1;
    o.subplans = NULL;
    o.on_ready = NULL; /* the whole plan reports its outputs, after its sub-batches */
    o.ready_arg = NULL;
    eng_status st = eng_plan_new(g, &o, in, out);
    if (st == ENG_STATUS_OK && c) { /* the caller checked there is room */
        c->e[c->n].g = g, c->e[c->n].shapes = in, c->e[c->n].slot = slot, c->e[c->n].plan = *out;
        c->e[c->n].precision = p->opts.precision, c->e[c->n].backend = p->opts.backend;
        c->n++;
        return st;
    }
    free(in);
    return st;
}

void plan_split_free(plan_split *sp) {
    if (!sp) return;
    for (int w = 0; sp->owns && sp->full && w < sp->nworkers; w++) eng_plan_free(&sp->full[w]);
    if (sp->owns) eng_plan_free(&sp->tail);
    free(sp->full);
    free(sp->in_m);
    free(sp->out_m);
    if (sp->outs)
        for (int64_t i = 0; sp->outs[i].dtype != ENG_DTYPE_UNDEFINED; i++) eng_free(sp->outs[i].data);
    free(sp->outs);
    free(sp);
}

void plan_split_try(eng_plan *p, const eng_tensor *inputs) {
    const eng_graph *g = p->g;
    int T = p->nthreads > 64 ? 64 : p->nthreads;
    if (p->opts.no_split || p->dynamic || T < 2 || !split_enabled() || g->noutputs < 1) return;
    size_t wbytes = 0;
    for (int v = 0; v < g->nvalues; v++)
        if (g->values[v].init) wbytes += eng_tensor_nbytes(g->values[v].init);
    if (wbytes > SPLIT_WEIGHT_LIMIT) return;

    char why[256] = "";
#define NO_SPLIT(msg) do { snprintf(why, sizeof why, "%s", msg); goto out; } while (0)
    plan_split *sp = calloc(1, sizeof *sp);
    split_an a = {.p = p, .m = calloc((size_t)g->nvalues + 1, sizeof(int64_t))};
    if (!sp || !a.m) NO_SPLIT("out of memory");
    sp->nworkers = T;
    sp->in_m = calloc((size_t)g->ninputs + 1, sizeof *sp->in_m);
    sp->out_m = calloc((size_t)g->noutputs + 1, sizeof *sp->out_m);
    sp->full = calloc((size_t)T, sizeof *sp->full);
    sp->outs = calloc((size_t)g->noutputs + 1, sizeof *sp->outs);
    if (!sp->in_m || !sp->out_m || !sp->full || !sp->outs) NO_SPLIT("out of memory");
    /* The batch N: axis 0 of the first fed input whose declared first dim is symbolic, else of the first fed
     * input with a first dim of at least 2 (models exported with a fixed batch). Every fed input with N rows at
     * axis 0 is split with it, the others go whole to every chunk: the analysis proves row independence for
     * whatever is split, whatever the inputs mean. */
    for (int pass = 0; pass < 2 && !sp->N; pass++)
        for (int i = 0; i < g->ninputs && !sp->N; i++) {
            int v = g->inputs[i];
            const eng_value *dv = &g->values[v];
            const eng_tensor *t = &p->vals[v];
            if (p->kind[v] != VAL_INPUT || t->ndim < 1) continue;
            int symbolic = dv->ndim < 1 || dv->dims[0] < 0;
            if (pass == 0 ? symbolic : t->dims[0] >= 2) sp->N = t->dims[0];
        }
    for (int i = 0; i < g->ninputs; i++) {
        int v = g->inputs[i];
        const eng_tensor *t = &p->vals[v];
        if (p->kind[v] != VAL_INPUT || t->ndim < 1 || t->dims[0] != sp->N) continue;
        sp->in_m[i] = 1;
        a.m[v] = 1;
    }
    a.N = sp->N;
    if (sp->N < 2) NO_SPLIT("batch of one");
    for (int si = 0; si < p->nsteps; si++)
        if (!an_node(&a, &p->steps[si])) NO_SPLIT(a.why);
    for (int i = 0; i < g->noutputs; i++) {
        sp->out_m[i] = a.m[g->outputs[i]];
        if (!sp->out_m[i]) NO_SPLIT("an output has no batch rows");
    }
    /* Chunk size: one chunk's activations fit the L2 cache; a plan whose single row does not fit gains no locality
     * from chunks (measured on the torchvision CNNs at 224x224: 2-20% slower split) and stays whole. Every chunk
     * re-reads all weights, so a chunk whose
     * activations are smaller than the weights loses more to weight traffic than it gains in locality (MLPs and
     * transformers at these sizes): those plans stay whole. Chunks are a multiple of the workers. */
    size_t need = 0;
    if (plan_arena_need(p, &need) != ENG_STATUS_OK) NO_SPLIT(eng_last_error());
    int64_t per_row = (int64_t)(need / (size_t)sp->N) + 1;
    int64_t rows = (int64_t)split_cache_bytes() / per_row, maxrows = (sp->N + SPLIT_CHUNKS_PER_THREAD * T - 1) / (SPLIT_CHUNKS_PER_THREAD * T);
    if (rows < 1) rows = 1;
    if (rows > maxrows) rows = maxrows;
    int64_t force = p->opts.split_rows;
    const char *fe = getenv("TENSORD_SPLIT_ROWS");
    if (force <= 0 && fe && *fe) force = strtoll(fe, NULL, 10);
    if (force > 0) rows = force < sp->N ? force : sp->N;
    else if ((size_t)per_row > split_cache_bytes()) /* 224x224 CNNs: no chunk stays in cache, so nothing is won */
        NO_SPLIT("one row's activations do not fit the L2 cache");
    else if ((size_t)(rows * per_row) < wbytes) NO_SPLIT("a sub-batch's activations are smaller than the weights");
    int64_t nchunks = (sp->N + rows - 1) / rows;
    if (force <= 0) {
        nchunks = (nchunks + T - 1) / T * T;
        rows = (sp->N + nchunks - 1) / nchunks;
    }
    sp->rows = rows;
    sp->nchunks = (sp->N + rows - 1) / rows;
    int64_t last = sp->N - (sp->nchunks - 1) * rows;
    /* Sub-plans come from the shared cache when it has room for all of them, else this plan owns them all. */
    eng_plan_cache *cache = p->opts.subplans;
    if (cache && cache->n + T + 1 > SPLIT_CACHE_MAX) cache = NULL;
    sp->owns = !cache;
    for (int w = 0; w <= T; w++) {
        int64_t r = w < T ? rows : last;
        if (w == T && last == rows) break;
        eng_plan *q = NULL;
        if (split_plan_get(p, inputs, sp, r, w, cache, &q) != ENG_STATUS_OK) NO_SPLIT(eng_last_error());
        if (w < T) sp->full[w] = q;
        else sp->tail = q;
        if ((w == 0 || w == T) && !split_verify(p, q, a.m, r)) NO_SPLIT("the sub-plan differs from the analysis");
    }
    for (int i = 0; i < g->noutputs; i++) {
        eng_tensor *o = &sp->outs[i];
        *o = p->vals[g->outputs[i]];
        size_t nb = eng_tensor_nbytes(o);
        o->data = eng_alloc(nb ? nb : 1);
        if (!o->data) NO_SPLIT("out of memory");
    }
    p->arena_bytes = 0;
    for (int w = 0; w < T; w++) p->arena_bytes += sp->full[w]->arena_bytes;
    if (sp->tail) p->arena_bytes += sp->tail->arena_bytes;
    p->split = sp;
    sp = NULL;
out:
    if (sp && why[0] && getenv("TENSORD_PROFILE")) fprintf(stderr, "batch split not used: %s\n", why);
    plan_split_free(sp);
    free(a.m);
    eng_err_clear();
#undef NO_SPLIT
}

eng_status plan_split_run(eng_plan *p, const eng_tensor *inputs, eng_tensor *outputs) {
    const eng_graph *g = p->g;
    plan_split *sp = p->split;
    int T = sp->nworkers;
    eng_status wst[64];
    char wmsg[64][256];
    if (T > 64) T = 64;
    for (int w = 0; w < T; w++) wst[w] = ENG_STATUS_OK;
    atomic_llong next = 0; /* the next chunk to take */
#pragma omp parallel num_threads(T)
    {
        int w = omp_get_thread_num();
        eng_tensor in[ENG_OP_MAX_IO], out[ENG_OP_MAX_IO];
        eng_tensor *feed = g->ninputs <= ENG_OP_MAX_IO ? in : NULL, *res = g->noutputs <= ENG_OP_MAX_IO ? out : NULL;
        eng_status st = feed && res ? ENG_STATUS_OK : eng_err(ENG_STATUS_UNSUPPORTED, "too many graph inputs/outputs");
        for (int64_t c; st == ENG_STATUS_OK && (c = atomic_fetch_add(&next, 1)) < sp->nchunks;) {
            int64_t r0 = c * sp->rows, nr = sp->N - r0 < sp->rows ? sp->N - r0 : sp->rows;
            eng_plan *q = nr == sp->rows ? sp->full[w] : sp->tail;
            for (int i = 0; i < g->ninputs; i++) {
                feed[i] = inputs[i];
                if (!sp->in_m[i] || feed[i].dtype == ENG_DTYPE_UNDEFINED) continue;
                size_t row = eng_tensor_nbytes(&inputs[i]) / (size_t)sp->N;
                feed[i].dims[0] = nr;
                feed[i].data = (char *)inputs[i].data + (size_t)r0 * row;
            }
            st = eng_plan_run(q, feed, res);
            for (int i = 0; i < g->noutputs && st == ENG_STATUS_OK; i++) {
                size_t row = eng_tensor_nbytes(&sp->outs[i]) / (size_t)sp->N;
                memcpy((char *)sp->outs[i].data + (size_t)r0 * row, res[i].data, (size_t)nr * row);
            }
        }
        if (st != ENG_STATUS_OK && w < 64) {
            wst[w] = st;
            snprintf(wmsg[w], sizeof wmsg[w], "%s", eng_last_error());
        }
    }
    for (int w = 0; w < T; w++)
        if (wst[w] != ENG_STATUS_OK) return eng_err(wst[w], "%s", wmsg[w]);
    for (int i = 0; i < g->noutputs; i++) outputs[i] = sp->outs[i];
    p->prof_runs++;
    return ENG_STATUS_OK;
}

void plan_split_stats(const eng_plan *p, eng_plan_stats *st) {
    if (!p->split) return;
    st->split_rows = (int)p->split->rows;
    st->split_workers = p->split->nworkers;
    if (p->split->nworkers > 0 && p->split->full[0]) { /* the sub-plans are what runs */
        st->lowp_steps = p->split->full[0]->lowp_steps;
        st->lowp_values = p->split->full[0]->lowp_values;
    }
}
