/* autodiff.c - reverse-mode autodiff over the graph IR (see autodiff.h), the training rewrite of Dropout and
 * BatchNormalization, and the list of trainable parameters.
 *
 * eng_autodiff:
 *  1. varied = values reachable from a parameter through differentiable inputs (rule tables' `diff` masks; ops
 *     listed as non-differentiable stop the flow; ops without a rule pass it on, so that a missing rule on the
 *     path is found); useful = values from which the loss is reachable the same way; needed = both.
 *  2. Walk the forward nodes in reverse topological order. A node with a needed input and at least one output
 *     gradient gets its rule applied: contributions to each output are summed first (one Sum node when
 *     several consumers contributed), the rule appends the backward nodes and returns input gradients, which
 *     are queued as contributions of those inputs.
 *  3. Each parameter's contributions are summed into "grad/<p>" (an Identity when there is one; FillLike(p, 0)
 *     when the parameter does not reach the loss). Outputs: the loss (if it was not one), then the grad/<p> values in
 *     parameter order. Parameters are appended to g->inputs (still initializers).
 * Backward values are named "ad/<n>/<op>" (node) and "ad/<n>:<j>" (value), unique in the graph.
 */
#include "autodiff.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grad-impl.h"
#include "../ir/tensor.h"

typedef struct ad_state {
    eng_name_index ix;
    int counter;
} ad_state;

static __thread eng_status ad_failed_status = ENG_STATUS_OUT_OF_MEMORY;

eng_status eng_grad_failed(void) { return ad_failed_status; }

static int ad_fail(eng_status st) {
    ad_failed_status = st;
    return -1;
}

/* ---- builder helpers (grad-impl.h) ---- */

int eng_grad_in(const eng_grad_ctx *c, int i) {
    const eng_node *n = eng_grad_fwd(c);
    return i < n->nin ? n->inputs[i] : -1;
}

int eng_grad_out(const eng_grad_ctx *c, int j) {
    const eng_node *n = eng_grad_fwd(c);
    return j < n->nout ? n->outputs[j] : -1;
}

static int ad_new_value(eng_graph *g, ad_state *ad, const char *base) {
    char name[300];
    for (;;) {
        snprintf(name, sizeof name, "ad/%d:%s", ad->counter++, base);
        if (eng_name_index_find(&ad->ix, g, name) < 0) break;
    }
    int v = eng_graph_add_value(g, name);
    if (v < 0) return ad_fail(eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory adding value '%s'", name));
    if (!eng_name_index_add(&ad->ix, g, v)) return ad_fail(eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory"));
    return v;
}

static int ad_emit(eng_graph *g, ad_state *ad, const char *op, const char *domain, const int *in, int nin, int *outs,
                   int nout) {
    int tmp[64];
    if (nout > 64) return ad_fail(eng_err(ENG_STATUS_UNSUPPORTED, "%d outputs", nout));
    for (int j = 0; j < nout; j++) {
        int want = outs ? outs[j] : -1;
        if (want == -2) tmp[j] = -1;
        else if (want >= 0) tmp[j] = want;
        else if ((tmp[j] = ad_new_value(g, ad, op)) < 0) return -1;
        if (outs) outs[j] = tmp[j];
    }
    char name[300];
    snprintf(name, sizeof name, "ad/%d/%s", ad->counter++, op);
    int n = eng_graph_add_node(g, name, op, domain ? domain : "", in, nin, tmp, nout);
    if (n < 0) return ad_fail(eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory adding node '%s'", name));
    return n;
}

int eng_grad_emit(eng_grad_ctx *c, const char *op, const char *domain, const int *in, int nin, int *outs, int nout) {
    return ad_emit(c->g, c->ad, op, domain, in, nin, outs, nout);
}

int eng_grad_op(eng_grad_ctx *c, const char *op, const char *domain, const int *in, int nin) {
    int out = -1;
    for (int i = 0; i < nin; i++)
        if (in[i] < -1) return -1; /* a failed operand propagates */
    return eng_grad_emit(c, op, domain, in, nin, &out, 1) < 0 ? -1 : out;
}

int eng_grad_un(eng_grad_ctx *c, const char *op, int a) {
    if (a < 0) return -1;
    return eng_grad_op(c, op, "", &a, 1);
}

int eng_grad_bin(eng_grad_ctx *c, const char *op, int a, int b) {
    if (a < 0 || b < 0) return -1;
    int in[2] = {a, b};
    return eng_grad_op(c, op, "", in, 2);
}

int eng_grad_rts(eng_grad_ctx *c, int v, int like) {
    if (v < 0 || like < 0) return -1;
    int in[2] = {v, like};
    return eng_grad_op(c, "ReduceToShape", "com.tensord", in, 2);
}

int eng_grad_fill(eng_grad_ctx *c, int like, double value) {
    if (like < 0) return -1;
    int out = -1, n = eng_grad_emit(c, "FillLike", "com.tensord", &like, 1, &out, 1);
    if (n < 0) return -1;
    if (value != 0 && eng_grad_attr_float(c, n, "value", (float)value) != ENG_STATUS_OK) return -1;
    return out;
}

int eng_grad_const(eng_grad_ctx *c, double x, int like) {
    ad_state *ad = c->ad;
    int v = ad_new_value(c->g, ad, "const");
    if (v < 0) return -1;
    eng_tensor *t = calloc(1, sizeof *t);
    float *d = eng_alloc(sizeof(float));
    if (!t || !d) {
        free(t);
        eng_free(d);
        return ad_fail(eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory"));
    }
    *d = (float)x;
    t->dtype = ENG_DTYPE_F32;
    t->ndim = 0;
    t->data = d;
    eng_value_set_init(c->g, v, t);
    c->g->values[v].dtype = ENG_DTYPE_F32;
    c->g->values[v].ndim = 0;
    eng_dtype dt = like >= 0 ? c->g->values[like].dtype : ENG_DTYPE_F32;
    if (dt != ENG_DTYPE_F32 && dt != ENG_DTYPE_UNDEFINED) return eng_grad_bin(c, "CastLike", v, like);
    return v;
}

static eng_status ad_set_attr(eng_grad_ctx *c, int node, eng_attr *a) {
    eng_status st = eng_node_take_attr(c->g, node, a);
    if (st != ENG_STATUS_OK) eng_attr_clear(a);
    return st;
}

static char *ad_strdup(const char *s) {
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n + 1);
    return d;
}

eng_status eng_grad_attr_int(eng_grad_ctx *c, int node, const char *name, int64_t v) {
    eng_attr a = {.name = ad_strdup(name), .type = ENG_ATTR_INT, .i = v};
    if (!a.name) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    return ad_set_attr(c, node, &a);
}

eng_status eng_grad_attr_float(eng_grad_ctx *c, int node, const char *name, float v) {
    eng_attr a = {.name = ad_strdup(name), .type = ENG_ATTR_FLOAT, .f = v};
    if (!a.name) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    return ad_set_attr(c, node, &a);
}

eng_status eng_grad_attr_ints(eng_grad_ctx *c, int node, const char *name, const int64_t *v, int n) {
    eng_attr a = {.name = ad_strdup(name), .type = ENG_ATTR_INTS, .n = n};
    a.ints = malloc((size_t)(n > 0 ? n : 1) * sizeof *a.ints);
    if (!a.name || !a.ints) {
        eng_attr_clear(&a);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    memcpy(a.ints, v, (size_t)n * sizeof *v);
    return ad_set_attr(c, node, &a);
}

eng_status eng_grad_copy_attrs(eng_grad_ctx *c, int node) {
    int na = c->g->nodes[c->node].nattr;
    for (int i = 0; i < na; i++) ENG_TRY(eng_node_add_attr(c->g, node, &c->g->nodes[c->node].attrs[i]));
    return ENG_STATUS_OK;
}

/* ---- rule lookup ---- */

/* Ops whose outputs carry no gradient (integer/bool results, piecewise-constant functions). */
static const char *const ad_nondiff[] = {
    "Shape", "Size", "ArgMax", "ArgMin", "Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Not", "And",
    "Or", "Xor", "NonZero", "IsNaN", "IsInf", "Floor", "Ceil", "Round", "Sign", "OneHot", "Range", "ConstantOfShape",
    "EyeLike", "Constant", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
    "Bernoulli", "BitShift", "Mod", NULL,
};

static int ad_is_nondiff(const eng_node *n) {
    if (n->domain[0]) return 0;
    for (int i = 0; ad_nondiff[i]; i++)
        if (!strcmp(n->op_type, ad_nondiff[i])) return 1;
    return 0;
}

static const eng_grad_rule *ad_find_rule(const eng_node *n) {
    static const eng_grad_rule *const tables[] = {eng_grad_rules_math, eng_grad_rules_nn, eng_grad_rules_tensor, eng_grad_rules_rnn, NULL};
    for (int t = 0; tables[t]; t++)
        for (const eng_grad_rule *r = tables[t]; r->op_type; r++)
            if (!strcmp(r->op_type, n->op_type) && !strcmp(r->domain ? r->domain : "", n->domain)) return r;
    return NULL;
}

/* Is input i of n a path for gradients? Unknown ops: every input (so a missing rule is reported). */
static int ad_input_diff(const eng_node *n, int i) {
    if (ad_is_nondiff(n)) return 0;
    const eng_grad_rule *r = ad_find_rule(n);
    return r ? (i < 32 && ((r->diff >> i) & 1u)) : 1;
}

/* ---- eng_autodiff ---- */

typedef struct ad_list {
    int *v;
    int n, cap;
} ad_list;

static eng_status ad_push(ad_list *l, int v) {
    if (l->n == l->cap) {
        int nc = l->cap ? l->cap * 2 : 2;
        int *p = realloc(l->v, (size_t)nc * sizeof *p);
        if (!p) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
        l->v = p;
        l->cap = nc;
    }
    l->v[l->n++] = v;
    return ENG_STATUS_OK;
}

static eng_status ad_append(int **arr, int *n, int v) {
    int *p = realloc(*arr, (size_t)(*n + 1) * sizeof *p);
    if (!p) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    p[(*n)++] = v;
    *arr = p;
    return ENG_STATUS_OK;
}

/* Sum the contributions of l into one value (named `name` if given). Returns the value or -1. */
static int ad_sum(eng_graph *g, ad_state *ad, ad_list *l, const char *name) {
    int out = -1;
    if (name) {
        out = eng_graph_add_value(g, name);
        if (out < 0 || !eng_name_index_add(&ad->ix, g, out))
            return ad_fail(eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory adding '%s'", name));
    }
    if (l->n == 1 && !name) return l->v[0];
    if (l->n == 1) return ad_emit(g, ad, "Identity", "", l->v, 1, &out, 1) < 0 ? -1 : out;
    return ad_emit(g, ad, "Sum", "", l->v, l->n, &out, 1) < 0 ? -1 : out;
}

static eng_status ad_check_name(const eng_graph *g, const char *what, const char *name, int *v) {
    *v = name ? eng_graph_find_value(g, name) : -1;
    if (*v < 0) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "autodiff: %s '%s' is not a value of the graph", what, name ? name : "(null)");
    return ENG_STATUS_OK;
}

eng_status eng_autodiff(eng_graph *g, const eng_grad_spec *spec) {
    int loss;
    ENG_TRY(ad_check_name(g, "loss", spec->loss, &loss));
    const eng_value *lv = &g->values[loss];
    if (lv->dtype != ENG_DTYPE_UNDEFINED && !eng_dtype_is_float(lv->dtype))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "autodiff: loss '%s' has dtype %s, expected a float", lv->name,
                       eng_dtype_name(lv->dtype));
    if (lv->ndim > 1 || (lv->ndim == 1 && lv->dims[0] != 1 && lv->dims[0] != -1))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "autodiff: loss '%s' has rank %d; expected a scalar (rank 0 or [1])",
                       lv->name, lv->ndim);
    int np = spec->nparams;
    int *pv = calloc((size_t)np + 1, sizeof *pv);
    if (!pv) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    eng_status st = ENG_STATUS_OK;
    for (int i = 0; i < np && st == ENG_STATUS_OK; i++) {
        st = ad_check_name(g, "parameter", spec->params[i], &pv[i]);
        if (st == ENG_STATUS_OK && !g->values[pv[i]].init)
            st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "autodiff: parameter '%s' is not an initializer", spec->params[i]);
        if (st == ENG_STATUS_OK && !eng_dtype_is_float(g->values[pv[i]].init->dtype))
            st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "autodiff: parameter '%s' has dtype %s, expected a float",
                         spec->params[i], eng_dtype_name(g->values[pv[i]].init->dtype));
        if (st == ENG_STATUS_OK) {
            char name[512];
            snprintf(name, sizeof name, "grad/%s", spec->params[i]);
            if (eng_graph_find_value(g, name) >= 0)
                st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "autodiff: the graph already has a value '%s'", name);
        }
    }
    if (st != ENG_STATUS_OK) {
        free(pv);
        return st;
    }
    int nn0 = g->nnodes, nv0 = g->nvalues;
    int *order = malloc(((size_t)nn0 + 1) * sizeof *order);
    unsigned char *varied = calloc((size_t)nv0 + 1, 1), *useful = calloc((size_t)nv0 + 1, 1);
    ad_list *contrib = calloc((size_t)nv0 + 1, sizeof *contrib);
    ad_state ad = {0};
    if (!order || !varied || !useful || !contrib) {
        st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    st = eng_graph_topo_order(g, order);
    if (st != ENG_STATUS_OK) goto done;
    for (int v = 0; v < nv0; v++)
        if (!eng_name_index_add(&ad.ix, g, v)) {
            st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
            goto done;
        }
    for (int i = 0; i < np; i++) varied[pv[i]] = 1;
    for (int k = 0; k < nn0; k++) {
        const eng_node *n = &g->nodes[order[k]];
        int any = 0;
        for (int i = 0; i < n->nin; i++) any |= n->inputs[i] >= 0 && varied[n->inputs[i]] && ad_input_diff(n, i);
        if (any)
            for (int j = 0; j < n->nout; j++)
                if (n->outputs[j] >= 0) varied[n->outputs[j]] = 1;
    }
    useful[loss] = 1;
    for (int k = nn0 - 1; k >= 0; k--) {
        const eng_node *n = &g->nodes[order[k]];
        int any = 0;
        for (int j = 0; j < n->nout; j++) any |= n->outputs[j] >= 0 && useful[n->outputs[j]];
        if (any)
            for (int i = 0; i < n->nin; i++)
                if (n->inputs[i] >= 0 && ad_input_diff(n, i)) useful[n->inputs[i]] = 1;
    }
    /* seed: dloss/dloss = 1, or the loss scale */
    eng_grad_ctx c0 = {.g = g, .ad = &ad, .node = -1};
    int scale_v = -1;
    if (spec->loss_scale && (scale_v = eng_graph_find_value(g, spec->loss_scale)) < 0) {
        st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "loss scale '%s' is not a value of the graph", spec->loss_scale);
        goto done;
    }
    if (varied[loss]) {
        int seed = eng_grad_fill(&c0, loss, 1.0);
        if (scale_v >= 0) seed = eng_grad_bin(&c0, "Mul", seed, scale_v);
        if (seed < 0 || (st = ad_push(&contrib[loss], seed)) != ENG_STATUS_OK) {
            st = st != ENG_STATUS_OK ? st : eng_grad_failed();
            goto done;
        }
    }
    for (int k = nn0 - 1; k >= 0 && st == ENG_STATUS_OK; k--) {
        int ni = order[k];
        const eng_node *n = &g->nodes[ni];
        int nin = n->nin, nout = n->nout, anyin = 0, anyout = 0;
        unsigned char need[64] = {0};
        int dy[64], dx[64];
        if (nin > 64 || nout > 64) {
            st = eng_err(ENG_STATUS_UNSUPPORTED, "autodiff: node '%s' (%s) has too many inputs/outputs", n->name, n->op_type);
            break;
        }
        for (int i = 0; i < nin; i++) {
            int v = n->inputs[i];
            need[i] = v >= 0 && varied[v] && useful[v] && ad_input_diff(n, i);
            anyin |= need[i];
            dx[i] = -1;
        }
        for (int j = 0; j < nout; j++) anyout |= n->outputs[j] >= 0 && contrib[n->outputs[j]].n > 0;
        if (!anyin || !anyout) continue;
        const eng_grad_rule *r = ad_find_rule(n);
        if (!r || !r->fn) {
            st = eng_err(ENG_STATUS_UNSUPPORTED, "autodiff: node '%s' (%s%s%s) has no gradient rule", n->name,
                         n->domain[0] ? n->domain : "", n->domain[0] ? "." : "", n->op_type);
            break;
        }
        for (int j = 0; j < nout; j++) {
            int v = g->nodes[ni].outputs[j];
            dy[j] = -1;
            if (v < 0 || contrib[v].n == 0) continue;
            dy[j] = ad_sum(g, &ad, &contrib[v], NULL);
            if (dy[j] < 0) {
                st = eng_grad_failed();
                break;
            }
        }
        if (st != ENG_STATUS_OK) break;
        eng_grad_ctx c = {.g = g, .ad = &ad, .node = ni, .dy = dy, .dx = dx, .need = need};
        st = r->fn(&c);
        if (st != ENG_STATUS_OK) {
            n = &g->nodes[ni];
            eng_err_prefix(st, "autodiff: node '%s' (%s): ", n->name, n->op_type);
            break;
        }
        n = &g->nodes[ni];
        for (int i = 0; i < nin && st == ENG_STATUS_OK; i++)
            if (need[i] && dx[i] >= 0) st = ad_push(&contrib[n->inputs[i]], dx[i]);
    }
    if (st != ENG_STATUS_OK) goto done;
    /* outputs: loss first, then grad/<p> */
    int has_loss = 0;
    for (int i = 0; i < g->noutputs; i++) has_loss |= g->outputs[i] == loss;
    if (!has_loss && (st = ad_append(&g->outputs, &g->noutputs, loss)) != ENG_STATUS_OK) goto done;
    for (int i = 0; i < np && st == ENG_STATUS_OK; i++) {
        char name[512];
        snprintf(name, sizeof name, "grad/%s", spec->params[i]);
        int p = pv[i], gv;
        if (contrib[p].n > 0) {
            gv = ad_sum(g, &ad, &contrib[p], name);
        } else {
            gv = eng_graph_add_value(g, name);
            int node = gv >= 0 && eng_name_index_add(&ad.ix, g, gv) ? ad_emit(g, &ad, "FillLike", "com.tensord", &p, 1, &gv, 1) : -1;
            if (node < 0) gv = -1;
        }
        if (gv < 0) {
            st = eng_grad_failed();
            break;
        }
        const eng_tensor *t = g->values[p].init;
        g->values[gv].dtype = t->dtype;
        g->values[gv].ndim = t->ndim;
        memcpy(g->values[gv].dims, t->dims, sizeof t->dims);
        st = ad_append(&g->outputs, &g->noutputs, gv);
        int listed = 0;
        for (int k = 0; k < g->ninputs; k++) listed |= g->inputs[k] == p;
        if (st == ENG_STATUS_OK && !listed) st = ad_append(&g->inputs, &g->ninputs, p);
    }
done:
    if (contrib)
        for (int v = 0; v < nv0; v++) free(contrib[v].v);
    free(contrib);
    free(order);
    free(varied);
    free(useful);
    free(pv);
    eng_name_index_free(&ad.ix);
    return st;
}

/* ---- eng_graph_set_training ---- */

static eng_status ad_replace_str(char **dst, const char *s) {
    char *d = ad_strdup(s);
    if (!d) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    free(*dst);
    *dst = d;
    return ENG_STATUS_OK;
}

static void ad_drop_attr(eng_node *n, const char *name) {
    for (int i = 0; i < n->nattr; i++)
        if (!strcmp(n->attrs[i].name, name)) {
            eng_attr_clear(&n->attrs[i]);
            n->attrs[i] = n->attrs[--n->nattr];
            return;
        }
}

/* Make node n have at least `want` outputs (new slots -1). */
static eng_status ad_grow_outputs(eng_graph *g, int ni, int want) {
    eng_node *n = &g->nodes[ni];
    if (n->nout >= want) return ENG_STATUS_OK;
    int *o = realloc(n->outputs, (size_t)want * sizeof *o);
    if (!o) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int j = n->nout; j < want; j++) o[j] = -1;
    n->outputs = o;
    n->nout = want;
    return ENG_STATUS_OK;
}

static int ad_const_value(const eng_graph *g, int v, double *out) {
    if (v < 0) return 0;
    const eng_tensor *t = g->values[v].init;
    if (!t && g->values[v].producer >= 0) {
        const eng_node *p = &g->nodes[g->values[v].producer];
        const eng_attr *a = !strcmp(p->op_type, "Constant") ? eng_node_attr(p, "value") : NULL;
        if (a && a->type == ENG_ATTR_TENSOR) t = &a->t;
    }
    if (!t || !t->data || eng_tensor_numel(t) != 1) return 0;
    *out = eng_tensor_get_f64(t, 0);
    return 1;
}

static eng_status ad_train_dropout(eng_graph *g, int ni) {
    eng_node *n = &g->nodes[ni];
    double ratio = 0.5;
    if (g->opset < 12) ratio = eng_node_attr_float(n, "ratio", 0.5f);
    else if (n->nin > 1 && n->inputs[1] >= 0 && !ad_const_value(g, n->inputs[1], &ratio))
        return eng_err(ENG_STATUS_UNSUPPORTED, "set_training: Dropout '%s' has a non-constant ratio", n->name);
    if (ratio == 0) return ENG_STATUS_OK; /* the identity in training too (p=0 layers): no mask, nothing random */
    int64_t seed = eng_node_attr(n, "seed") ? eng_node_attr_int(n, "seed", 0) : 0x5eed + 7919 * (int64_t)ni;
    ENG_TRY(ad_grow_outputs(g, ni, 2));
    n = &g->nodes[ni];
    if (n->outputs[1] < 0) {
        char name[300];
        snprintf(name, sizeof name, "%s/dropout_mask", g->values[n->outputs[0]].name);
        int v = eng_graph_add_value(g, name);
        if (v < 0) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
        n = &g->nodes[ni];
        n->outputs[1] = v;
        g->values[v].producer = ni;
    }
    g->values[n->outputs[1]].dtype = ENG_DTYPE_BOOL;
    ENG_TRY(ad_replace_str(&n->op_type, "TrainingDropout"));
    ENG_TRY(ad_replace_str(&n->domain, "com.tensord"));
    n->nin = 1;
    while (n->nattr > 0) ad_drop_attr(n, n->attrs[0].name);
    eng_attr a = {.name = ad_strdup("ratio"), .type = ENG_ATTR_FLOAT, .f = (float)ratio};
    eng_attr b = {.name = ad_strdup("seed"), .type = ENG_ATTR_INT, .i = seed};
    eng_status st = a.name && b.name ? ENG_STATUS_OK : eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    if (st == ENG_STATUS_OK) st = eng_node_take_attr(g, ni, &a);
    if (st == ENG_STATUS_OK) st = eng_node_take_attr(g, ni, &b);
    eng_attr_clear(&a);
    eng_attr_clear(&b);
    return st;
}

static eng_status ad_train_bn(eng_graph *g, int ni) {
    eng_node *n = &g->nodes[ni];
    if (n->nin < 5) return eng_err(ENG_STATUS_INVALID_MODEL, "set_training: BatchNormalization '%s' has %d inputs", n->name, n->nin);
    char names[2][600];
    for (int k = 0; k < 2; k++) {
        int v = n->inputs[3 + k];
        if (v < 0 || !g->values[v].init)
            return eng_err(ENG_STATUS_UNSUPPORTED, "set_training: BatchNormalization '%s': running %s is not an initializer",
                           n->name, k ? "var" : "mean");
        snprintf(names[k], sizeof names[k], "bn_update/%s", g->values[v].name);
    }
    if (eng_graph_find_value(g, names[0]) >= 0) return ENG_STATUS_OK; /* already in training form */
    ENG_TRY(ad_grow_outputs(g, ni, 3));
    for (int k = 0; k < 2; k++) {
        int v = eng_graph_add_value(g, names[k]);
        if (v < 0) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
        n = &g->nodes[ni];
        const eng_value *src = &g->values[n->inputs[3 + k]];
        g->values[v].dtype = src->init->dtype;
        g->values[v].ndim = src->init->ndim;
        memcpy(g->values[v].dims, src->init->dims, sizeof src->init->dims);
        if (n->outputs[1 + k] < 0) {
            n->outputs[1 + k] = v;
            g->values[v].producer = ni;
        } else {
            int in = n->outputs[1 + k];
            if (eng_graph_add_node(g, names[k], "Identity", "", &in, 1, &v, 1) < 0)
                return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
        }
        ENG_TRY(ad_append(&g->outputs, &g->noutputs, v));
    }
    n = &g->nodes[ni];
    ad_drop_attr(n, "training_mode");
    ad_drop_attr(n, "is_test");
    if (g->opset >= 14) {
        eng_attr a = {.name = ad_strdup("training_mode"), .type = ENG_ATTR_INT, .i = 1};
        if (!a.name) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
        return eng_node_take_attr(g, ni, &a);
    }
    return ENG_STATUS_OK;
}

int eng_param_frozen(const char *name, const char *const *freeze_prefixes, int nfreeze) {
    for (int f = 0; f < nfreeze; f++)
        if (freeze_prefixes[f] && !strncmp(name, freeze_prefixes[f], strlen(freeze_prefixes[f]))) return 1;
    return 0;
}

static int ad_value_read(const eng_graph *g, int v) {
    for (int i = 0; i < g->noutputs; i++)
        if (g->outputs[i] == v) return 1;
    for (int j = 0; j < g->nnodes; j++)
        for (int i = 0; i < g->nodes[j].nin; i++)
            if (g->nodes[j].inputs[i] == v) return 1;
    return 0;
}

/* BatchNormalization ni in inference form: running statistics used and kept. A node exported in training mode
 * (training_mode=1, the updated statistics as outputs 1 and 2) loses those outputs, which nothing may read. */
static eng_status ad_bn_inference(eng_graph *g, int ni, const char *why) {
    eng_node *n = &g->nodes[ni];
    for (int k = 1; k < n->nout; k++)
        if (n->outputs[k] >= 0 && ad_value_read(g, n->outputs[k]))
            return eng_err(ENG_STATUS_UNSUPPORTED, "BatchNormalization '%s' %s, but its output '%s' (a running "
                           "statistic) is read by the model", n->name, why, g->values[n->outputs[k]].name);
    for (int k = 1; k < n->nout; k++)
        if (n->outputs[k] >= 0) g->values[n->outputs[k]].producer = -1;
    n->nout = 1;
    ad_drop_attr(n, "training_mode");
    ad_drop_attr(n, "is_test");
    return ENG_STATUS_OK;
}

/* A BatchNormalization whose scale and bias are both frozen initializers (Keras' trainable=False). */
static int ad_bn_frozen(const eng_graph *g, const eng_node *n, const char *const *freeze, int nfreeze) {
    if (nfreeze == 0 || n->nin < 5) return 0;
    for (int k = 1; k <= 2; k++) {
        int v = n->inputs[k];
        if (v < 0 || !g->values[v].init || !eng_param_frozen(g->values[v].name, freeze, nfreeze)) return 0;
    }
    return 1;
}

eng_status eng_graph_set_inference(eng_graph *g) {
    for (int ni = 0; ni < g->nnodes; ni++) {
        eng_node *n = &g->nodes[ni];
        if (n->domain[0]) continue;
        if (!strcmp(n->op_type, "BatchNormalization") && (n->nout > 1 || eng_node_attr_int(n, "training_mode", 0)))
            ENG_TRY(ad_bn_inference(g, ni, "was exported in training mode"));
        else if (!strcmp(n->op_type, "Dropout") && n->nin > 2) /* opset 12+: the training_mode input */
            n->nin = 2;
    }
    return ENG_STATUS_OK;
}

eng_status eng_graph_set_training(eng_graph *g, const char *const *freeze_prefixes, int nfreeze) {
    int nn = g->nnodes;
    for (int ni = 0; ni < nn; ni++) {
        const eng_node *n = &g->nodes[ni];
        if (n->domain[0]) continue;
        if (!strcmp(n->op_type, "Dropout")) {
            ENG_TRY(ad_train_dropout(g, ni));
        } else if (!strcmp(n->op_type, "BatchNormalization")) {
            if (ad_bn_frozen(g, n, freeze_prefixes, nfreeze)) ENG_TRY(ad_bn_inference(g, ni, "is frozen (--freeze)"));
            else ENG_TRY(ad_train_bn(g, ni));
        }
    }
    return ENG_STATUS_OK;
}

/* ---- eng_trainable_params ---- */

eng_status eng_trainable_params(const eng_graph *g, const char *const *freeze_prefixes, int nfreeze, const char ***names,
                                int *n) {
    *names = NULL;
    *n = 0;
    unsigned char *use = calloc((size_t)g->nvalues + 1, 1); /* 1: differentiable use, 2: BN running stat */
    const char **out = malloc(((size_t)g->nvalues + 1) * sizeof *out);
    if (!use || !out) {
        free(use);
        free(out);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    for (int ni = 0; ni < g->nnodes; ni++) {
        const eng_node *nd = &g->nodes[ni];
        int bn = !nd->domain[0] && !strcmp(nd->op_type, "BatchNormalization");
        for (int i = 0; i < nd->nin; i++) {
            int v = nd->inputs[i];
            if (v < 0) continue;
            if (bn && i >= 3) use[v] |= 2;
            else if (ad_input_diff(nd, i)) use[v] |= 1;
        }
    }
    int k = 0;
    for (int v = 0; v < g->nvalues; v++) {
        const eng_value *val = &g->values[v];
        if (!val->init || !eng_dtype_is_float(val->init->dtype) || use[v] != 1 || val->init->ndim == 0) continue;
        if (!eng_param_frozen(val->name, freeze_prefixes, nfreeze)) out[k++] = val->name;
    }
    free(use);
    *names = out;
    *n = k;
    return ENG_STATUS_OK;
}
