/* graph.c - the graph IR (see graph.h): construction, deep copies of attributes and subgraphs, attribute
 * accessors and the topological-order check.
 *
 * Invariants kept here:
 *  - every string in a graph is a malloc'd copy owned by the graph; node names are never NULL;
 *  - node input/output indices are -1 or valid value indices at the time the node is added;
 *  - a value's producer is the index of the last node that listed it as an output (-1 otherwise);
 *  - initializer and attribute tensors are malloc'd structs with eng_alloc'd data (eng_tensor_destroy);
 *  - a subgraph owned by an attribute has `parent` set to the graph owning the node;
 *  - a node's attrs array has room for the next power of two >= nattr (at least 4) entries: grow it only
 *    through eng_node_add_attr / eng_node_take_attr.
 * Nothing here exits on bad input; allocation failures come back as -1 / ENG_STATUS_OUT_OF_MEMORY.
 */
#include "graph.h"
#include "seq.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *eng_strdup0(const char *s) {
    if (!s) s = "";
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n + 1);
    return d;
}

static void eng_value_release(eng_value *v) {
    free(v->name);
    for (int i = 0; i < ENG_MAX_DIMS; i++) free(v->dim_param[i]);
    eng_tensor_destroy(&v->init);
}

void eng_attr_clear(eng_attr *a) {
    if (!a) return;
    free(a->name);
    free(a->s);
    free(a->floats);
    free(a->ints);
    if (a->strings)
        for (int i = 0; i < a->n; i++) free(a->strings[i]);
    free(a->strings);
    eng_free(a->t.data);
    eng_graph_free(&a->g);
    memset(a, 0, sizeof *a);
}

void eng_node_release(eng_node *n) {
    free(n->name);
    free(n->op_type);
    free(n->domain);
    free(n->inputs);
    free(n->outputs);
    for (int i = 0; i < n->nattr; i++) eng_attr_clear(&n->attrs[i]);
    free(n->attrs);
    memset(n, 0, sizeof *n);
}

eng_graph *eng_graph_new(void) {
    eng_graph *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->name = eng_strdup0("");
    if (!g->name) {
        free(g);
        return NULL;
    }
    return g;
}

void eng_graph_free(eng_graph **gp) {
    if (!gp || !*gp) return;
    eng_graph *g = *gp;
    for (int i = 0; i < g->nvalues; i++) eng_value_release(&g->values[i]);
    free(g->values);
    for (int i = 0; i < g->nnodes; i++) eng_node_release(&g->nodes[i]);
    free(g->nodes);
    free(g->inputs);
    free(g->outputs);
    free(g->name);
    free(g->producer_name);
    free(g->producer_version);
    free(g->doc_string);
    free(g);
    *gp = NULL;
}

int eng_graph_find_value(const eng_graph *g, const char *name) {
    if (!g || !name) return -1;
    for (int i = 0; i < g->nvalues; i++)
        if (strcmp(g->values[i].name, name) == 0) return i;
    return -1;
}

int eng_graph_add_value(eng_graph *g, const char *name) {
    if (!g || !name) return -1;
    if (g->nvalues == g->cap_values) {
        if (g->cap_values > (1 << 28)) return -1;
        int cap = g->cap_values ? g->cap_values * 2 : 16;
        eng_value *nv = realloc(g->values, (size_t)cap * sizeof *nv);
        if (!nv) return -1;
        g->values = nv;
        g->cap_values = cap;
    }
    eng_value *v = &g->values[g->nvalues];
    memset(v, 0, sizeof *v);
    v->name = eng_strdup0(name);
    if (!v->name) return -1;
    v->dtype = ENG_DTYPE_UNDEFINED;
    v->ndim = -1;
    for (int i = 0; i < ENG_MAX_DIMS; i++) v->dims[i] = -1;
    v->producer = -1;
    return g->nvalues++;
}

static int *eng_ints_dup(const int *a, int n) {
    int *d = malloc((size_t)(n > 0 ? n : 1) * sizeof *d);
    if (d && n > 0) memcpy(d, a, (size_t)n * sizeof *d);
    return d;
}

int eng_graph_add_node(eng_graph *g, const char *name, const char *op_type, const char *domain, const int *inputs,
                       int nin, const int *outputs, int nout) {
    if (!g || nin < 0 || nout < 0 || (nin && !inputs) || (nout && !outputs)) return -1;
    for (int i = 0; i < nin; i++)
        if (inputs[i] < -1 || inputs[i] >= g->nvalues) return -1;
    for (int i = 0; i < nout; i++)
        if (outputs[i] < -1 || outputs[i] >= g->nvalues) return -1;
    if (g->nnodes == g->cap_nodes) {
        if (g->cap_nodes > (1 << 28)) return -1;
        int cap = g->cap_nodes ? g->cap_nodes * 2 : 16;
        eng_node *nn = realloc(g->nodes, (size_t)cap * sizeof *nn);
        if (!nn) return -1;
        g->nodes = nn;
        g->cap_nodes = cap;
    }
    eng_node *n = &g->nodes[g->nnodes];
    memset(n, 0, sizeof *n);
    n->name = eng_strdup0(name);
    n->op_type = eng_strdup0(op_type);
    n->domain = eng_strdup0(domain);
    n->inputs = eng_ints_dup(inputs, nin);
    n->outputs = eng_ints_dup(outputs, nout);
    if (!n->name || !n->op_type || !n->domain || !n->inputs || !n->outputs) {
        eng_node_release(n);
        return -1;
    }
    n->nin = nin;
    n->nout = nout;
    for (int i = 0; i < nout; i++)
        if (outputs[i] >= 0) g->values[outputs[i]].producer = g->nnodes;
    return g->nnodes++;
}

static eng_graph *eng_graph_clone_in(const eng_graph *src, eng_graph *parent);

/* Deep copy of src into *dst (zeroed first); subgraphs get `parent`. */
static eng_status eng_attr_copy(eng_attr *dst, const eng_attr *src, eng_graph *parent) {
    memset(dst, 0, sizeof *dst);
    dst->type = src->type;
    dst->f = src->f;
    dst->i = src->i;
    dst->n = src->n;
    dst->name = eng_strdup0(src->name);
    if (!dst->name) goto oom;
    if (src->s) {
        dst->s = malloc(src->s_len + 1);
        if (!dst->s) goto oom;
        memcpy(dst->s, src->s, src->s_len);
        dst->s[src->s_len] = '\0';
        dst->s_len = src->s_len;
    }
    if (src->n < 0) {
        dst->n = 0;
        eng_attr_clear(dst);
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "attribute '%s': negative entry count %d", src->name, src->n);
    }
    size_t n = (size_t)src->n;
    if (src->floats) {
        dst->floats = malloc((n ? n : 1) * sizeof(float));
        if (!dst->floats) goto oom;
        if (n) memcpy(dst->floats, src->floats, n * sizeof(float));
    }
    if (src->ints) {
        dst->ints = malloc((n ? n : 1) * sizeof(int64_t));
        if (!dst->ints) goto oom;
        if (n) memcpy(dst->ints, src->ints, n * sizeof(int64_t));
    }
    if (src->strings) {
        dst->strings = calloc(n ? n : 1, sizeof(char *));
        if (!dst->strings) goto oom;
        for (size_t k = 0; k < n; k++)
            if (!(dst->strings[k] = eng_strdup0(src->strings[k]))) goto oom;
    }
    dst->t = src->t;
    dst->t.data = NULL;
    if (src->t.data) {
        size_t nb;
        eng_status st = eng_tensor_nbytes_checked(&src->t, src->name, &nb);
        if (st != ENG_STATUS_OK) {
            eng_attr_clear(dst);
            return st;
        }
        dst->t.data = eng_alloc(nb);
        if (!dst->t.data) goto oom;
        memcpy(dst->t.data, src->t.data, nb);
    }
    if (src->g) {
        dst->g = eng_graph_clone_in(src->g, parent);
        if (!dst->g) goto oom;
    }
    return ENG_STATUS_OK;
oom:
    eng_attr_clear(dst);
    return eng_err(ENG_STATUS_OUT_OF_MEMORY, "attribute '%s': out of memory copying it", src->name ? src->name : "");
}

static eng_status eng_node_reserve_attr(eng_graph *g, int node) {
    if (!g || node < 0 || node >= g->nnodes)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "add attribute: node index %d out of range [0,%d)", node,
                       g ? g->nnodes : 0);
    eng_node *n = &g->nodes[node];
    if (n->nattr >= (1 << 24))
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "node '%s': too many attributes", n->name);
    /* capacity is implicit: the next power of two >= nattr, so appends cost amortised O(1) */
    int k = n->nattr;
    if (k == 0 || (k & (k - 1)) == 0) {
        eng_attr *na = realloc(n->attrs, (size_t)(k ? 2 * k : 4) * sizeof *na);
        if (!na) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "node '%s': out of memory adding an attribute", n->name);
        n->attrs = na;
    }
    return ENG_STATUS_OK;
}

eng_status eng_node_add_attr(eng_graph *g, int node, const eng_attr *a) {
    ENG_TRY(eng_node_reserve_attr(g, node));
    eng_node *n = &g->nodes[node];
    ENG_TRY(eng_attr_copy(&n->attrs[n->nattr], a, g));
    n->nattr++;
    return ENG_STATUS_OK;
}

eng_status eng_node_take_attr(eng_graph *g, int node, eng_attr *a) {
    ENG_TRY(eng_node_reserve_attr(g, node));
    eng_node *n = &g->nodes[node];
    n->attrs[n->nattr] = *a;
    if (a->g) n->attrs[n->nattr].g->parent = g;
    n->nattr++;
    memset(a, 0, sizeof *a);
    return ENG_STATUS_OK;
}

void eng_value_set_init(eng_graph *g, int v, eng_tensor *t) {
    if (!g || v < 0 || v >= g->nvalues) {
        eng_tensor_destroy(&t);
        return;
    }
    eng_value *val = &g->values[v];
    if (val->init != t) eng_tensor_destroy(&val->init);
    val->init = t;
}

static eng_graph *eng_graph_clone_in(const eng_graph *src, eng_graph *parent) {
    eng_graph *g = eng_graph_new();
    if (!g) return NULL;
    free(g->name);
    g->name = eng_strdup0(src->name);
    if (!g->name) goto fail;
    g->parent = parent;
    g->ir_version = src->ir_version;
    g->opset = src->opset;
    g->opset_ml = src->opset_ml;
    if (src->producer_name && !(g->producer_name = eng_strdup0(src->producer_name))) goto fail;
    if (src->producer_version && !(g->producer_version = eng_strdup0(src->producer_version))) goto fail;
    if (src->doc_string && !(g->doc_string = eng_strdup0(src->doc_string))) goto fail;
    for (int i = 0; i < src->nvalues; i++) {
        const eng_value *sv = &src->values[i];
        int k = eng_graph_add_value(g, sv->name);
        if (k < 0) goto fail;
        eng_value *dv = &g->values[k];
        dv->dtype = sv->dtype;
        dv->ndim = sv->ndim;
        memcpy(dv->dims, sv->dims, sizeof dv->dims);
        for (int d = 0; d < ENG_MAX_DIMS; d++)
            if (sv->dim_param[d] && !(dv->dim_param[d] = eng_strdup0(sv->dim_param[d]))) goto fail;
        if (sv->init && !(dv->init = eng_tensor_clone(sv->init))) goto fail;
    }
    for (int i = 0; i < src->nnodes; i++) {
        const eng_node *sn = &src->nodes[i];
        int k = eng_graph_add_node(g, sn->name, sn->op_type, sn->domain, sn->inputs, sn->nin, sn->outputs, sn->nout);
        if (k < 0) goto fail;
        g->nodes[k].nimplicit = sn->nimplicit;
        for (int a = 0; a < sn->nattr; a++)
            if (eng_node_add_attr(g, k, &sn->attrs[a]) != ENG_STATUS_OK) goto fail;
    }
    for (int i = 0; i < src->nvalues; i++) g->values[i].producer = src->values[i].producer;
    g->inputs = eng_ints_dup(src->inputs, src->ninputs);
    g->outputs = eng_ints_dup(src->outputs, src->noutputs);
    if (!g->inputs || !g->outputs) goto fail;
    g->ninputs = src->ninputs;
    g->noutputs = src->noutputs;
    return g;
fail:
    eng_graph_free(&g);
    return NULL;
}

eng_graph *eng_graph_clone(const eng_graph *g) { return g ? eng_graph_clone_in(g, g->parent) : NULL; }

const eng_attr *eng_node_attr(const eng_node *n, const char *name) {
    if (!n || !name) return NULL;
    for (int i = 0; i < n->nattr; i++)
        if (n->attrs[i].name && strcmp(n->attrs[i].name, name) == 0) return &n->attrs[i];
    return NULL;
}

int64_t eng_node_attr_int(const eng_node *n, const char *name, int64_t dflt) {
    const eng_attr *a = eng_node_attr(n, name);
    return a && a->type == ENG_ATTR_INT ? a->i : dflt;
}

float eng_node_attr_float(const eng_node *n, const char *name, float dflt) {
    const eng_attr *a = eng_node_attr(n, name);
    return a && a->type == ENG_ATTR_FLOAT ? a->f : dflt;
}

const char *eng_node_attr_str(const eng_node *n, const char *name, const char *dflt) {
    const eng_attr *a = eng_node_attr(n, name);
    return a && a->type == ENG_ATTR_STRING && a->s ? a->s : dflt;
}

int eng_node_attr_ints(const eng_node *n, const char *name, const int64_t **out) {
    const eng_attr *a = eng_node_attr(n, name);
    if (!a || a->type != ENG_ATTR_INTS) {
        if (out) *out = NULL;
        return -1;
    }
    if (out) *out = a->ints;
    return a->n;
}

int eng_node_attr_floats(const eng_node *n, const char *name, const float **out) {
    const eng_attr *a = eng_node_attr(n, name);
    if (!a || a->type != ENG_ATTR_FLOATS) {
        if (out) *out = NULL;
        return -1;
    }
    if (out) *out = a->floats;
    return a->n;
}

static uint64_t eng_name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

int eng_name_index_find(const eng_name_index *ix, const eng_graph *g, const char *name) {
    if (!ix->cap || !name) return -1;
    size_t i = (size_t)eng_name_hash(name) & (ix->cap - 1);
    for (;;) {
        int v = ix->slots[i] - 1;
        if (v < 0) return -1;
        if (strcmp(g->values[v].name, name) == 0) return v;
        i = (i + 1) & (ix->cap - 1);
    }
}

int eng_name_index_add(eng_name_index *ix, const eng_graph *g, int v) {
    if ((ix->n + 1) * 2 > ix->cap) {
        size_t nc = ix->cap ? ix->cap * 2 : 64;
        int *ns = calloc(nc, sizeof *ns);
        if (!ns) return 0;
        for (size_t i = 0; i < ix->cap; i++)
            if (ix->slots[i]) {
                size_t j = (size_t)eng_name_hash(g->values[ix->slots[i] - 1].name) & (nc - 1);
                while (ns[j]) j = (j + 1) & (nc - 1);
                ns[j] = ix->slots[i];
            }
        free(ix->slots);
        ix->slots = ns;
        ix->cap = nc;
    }
    size_t j = (size_t)eng_name_hash(g->values[v].name) & (ix->cap - 1);
    while (ix->slots[j]) j = (j + 1) & (ix->cap - 1);
    ix->slots[j] = v + 1;
    ix->n++;
    return 1;
}

void eng_name_index_free(eng_name_index *ix) {
    free(ix->slots);
    memset(ix, 0, sizeof *ix);
}

/* Is value v of g provided without a node: initializer or graph input? */
static int eng_value_is_source(const eng_graph *g, int v, const unsigned char *is_input) {
    return g->values[v].init != NULL || is_input[v];
}

/* Collect the outer-scope producers used by subgraph sg (recursively) as dependencies of a node of g: names
 * that sg neither produces nor initialises are looked up in g (a local input shadowing an outer name only adds
 * a harmless extra edge). */
static void eng_subgraph_deps(const eng_graph *g, const eng_name_index *ix, const eng_graph *sg, int depth, int *deps,
                              int *ndeps, int cap) {
    if (depth > 64) return;
    for (int i = 0; i < sg->nnodes; i++) {
        const eng_node *n = &sg->nodes[i];
        for (int k = 0; k < n->nin; k++) {
            int v = n->inputs[k];
            if (v < 0 || v >= sg->nvalues) continue;
            const eng_value *val = &sg->values[v];
            if (val->producer >= 0 || val->init) continue;
            int ov = eng_name_index_find(ix, g, val->name);
            if (ov >= 0 && g->values[ov].producer >= 0 && *ndeps < cap) deps[(*ndeps)++] = g->values[ov].producer;
        }
        for (int a = 0; a < n->nattr; a++)
            if (n->attrs[a].g) eng_subgraph_deps(g, ix, n->attrs[a].g, depth + 1, deps, ndeps, cap);
    }
}

/* A binary min-heap of node indices in h[0..*n). */
static void heap_push(int *h, int *n, int v) {
    int i = (*n)++;
    while (i > 0 && h[(i - 1) / 2] > v) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = v;
}

static void heap_pop(int *h, int *n) {
    int v = h[--*n], i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = v;
}

eng_status eng_graph_topo_order(const eng_graph *g, int *order) {
    if (!g || (!order && g->nnodes)) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "topo order: NULL graph or order");
    int nn = g->nnodes, nv = g->nvalues;
    eng_status st = ENG_STATUS_OK;
    unsigned char *is_input = calloc((size_t)nv + 1, 1);
    int *indeg = calloc((size_t)nn + 1, sizeof(int));
    /* edges: for node i, the list of nodes it depends on, in CSR form built in two passes */
    int *dep_start = calloc((size_t)nn + 2, sizeof(int));
    int *deps = NULL, *users_start = NULL, *users = NULL, *queue = NULL, *fill = NULL;
    int subcap = 4096, *subdeps = NULL;
    eng_name_index ix = {0};
    if (!is_input || !indeg || !dep_start) goto oom;
    for (int i = 0; i < g->ninputs; i++)
        if (g->inputs[i] >= 0 && g->inputs[i] < nv) is_input[g->inputs[i]] = 1;
    subdeps = malloc((size_t)subcap * sizeof(int));
    if (!subdeps) goto oom;
    for (int i = 0; i < nn && !ix.cap; i++)
        for (int a = 0; a < g->nodes[i].nattr; a++)
            if (g->nodes[i].attrs[a].g && !ix.cap) {
                for (int v = 0; v < nv; v++)
                    if (!eng_name_index_add(&ix, g, v)) goto oom;
            }

    /* pass 1: validate inputs and count deps per node */
    for (int i = 0; i < nn; i++) {
        const eng_node *n = &g->nodes[i];
        int cnt = 0;
        for (int k = 0; k < n->nin; k++) {
            int v = n->inputs[k];
            if (v == -1) continue;
            if (v < -1 || v >= nv) {
                st = eng_err(ENG_STATUS_INVALID_MODEL, "node '%s' (%s): input %d has invalid value index %d", n->name,
                             n->op_type, k, v);
                goto out;
            }
            if (g->values[v].producer >= 0) cnt++;
            else if (!eng_value_is_source(g, v, is_input) && !g->parent) {
                st = eng_err(ENG_STATUS_INVALID_MODEL,
                             "graph '%s': node '%s' (%s) input %d '%s' is not produced by any node and is neither an "
                             "initializer nor a graph input",
                             g->name, n->name, n->op_type, k, g->values[v].name);
                goto out;
            }
        }
        for (int a = 0; a < n->nattr; a++)
            if (n->attrs[a].g) {
                int nd = 0;
                eng_subgraph_deps(g, &ix, n->attrs[a].g, 0, subdeps, &nd, subcap);
                cnt += nd;
            }
        if (cnt > INT32_MAX - dep_start[i]) goto oom;
        dep_start[i + 1] = dep_start[i] + cnt;
    }
    deps = malloc((size_t)(dep_start[nn] + 1) * sizeof(int));
    if (!deps) goto oom;
    /* pass 2: fill deps */
    for (int i = 0; i < nn; i++) {
        const eng_node *n = &g->nodes[i];
        int p = dep_start[i];
        for (int k = 0; k < n->nin; k++) {
            int v = n->inputs[k];
            if (v >= 0 && g->values[v].producer >= 0) deps[p++] = g->values[v].producer;
        }
        for (int a = 0; a < n->nattr; a++)
            if (n->attrs[a].g) {
                int nd = 0;
                eng_subgraph_deps(g, &ix, n->attrs[a].g, 0, subdeps, &nd, subcap);
                memcpy(deps + p, subdeps, (size_t)nd * sizeof(int));
                p += nd;
            }
    }
    /* reverse edges: users of each node */
    users_start = calloc((size_t)nn + 2, sizeof(int));
    fill = calloc((size_t)nn + 1, sizeof(int));
    users = malloc((size_t)(dep_start[nn] + 1) * sizeof(int));
    queue = malloc((size_t)(nn + 1) * sizeof(int));
    if (!users_start || !fill || !users || !queue) goto oom;
    for (int i = 0; i < nn; i++)
        for (int p = dep_start[i]; p < dep_start[i + 1]; p++) users_start[deps[p] + 1]++;
    for (int i = 0; i < nn; i++) users_start[i + 1] += users_start[i];
    for (int i = 0; i < nn; i++) {
        indeg[i] = dep_start[i + 1] - dep_start[i];
        for (int p = dep_start[i]; p < dep_start[i + 1]; p++) users[users_start[deps[p]] + fill[deps[p]]++] = i;
    }
    /* Kahn's algorithm, always taking the lowest-numbered ready node (queue is a min-heap): the node list's own
     * order when it is already topological (ONNX's; the backward pass in autodiff's order, recomputed activations
     * where they were placed), so the memory plan sees the lifetimes that order gives */
    int tail = 0, done = 0;
    for (int i = 0; i < nn; i++)
        if (indeg[i] == 0) queue[tail++] = i; /* ascending: already a heap */
    while (tail > 0) {
        int i = queue[0];
        order[done++] = i;
        heap_pop(queue, &tail);
        for (int p = users_start[i]; p < users_start[i + 1]; p++)
            if (--indeg[users[p]] == 0) heap_push(queue, &tail, users[p]);
    }
    if (done < nn) {
        int bad = 0;
        for (int i = 0; i < nn; i++)
            if (indeg[i] > 0) {
                bad = i;
                break;
            }
        st = eng_err(ENG_STATUS_INVALID_MODEL,
                     "graph '%s': cycle among nodes: node '%s' (%s) depends (directly or not) on its own output; %d of "
                     "%d nodes cannot be ordered",
                     g->name, g->nodes[bad].name, g->nodes[bad].op_type, nn - done, nn);
    }
    goto out;
oom:
    st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "graph '%s': out of memory ordering %d nodes", g->name, nn);
out:
    free(is_input);
    free(indeg);
    free(dep_start);
    free(deps);
    free(users_start);
    free(users);
    free(queue);
    free(fill);
    free(subdeps);
    eng_name_index_free(&ix);
    return st;
}

eng_tensor *eng_tensor_clone(const eng_tensor *t) {
    if (!t) return NULL;
    eng_tensor *c = malloc(sizeof *c);
    if (!c) return NULL;
    *c = *t;
    c->data = NULL;
    if (t->data && t->dtype == ENG_DTYPE_SEQUENCE) { /* one block (seq.h) */
        if (eng_seq_clone(t, c) != ENG_STATUS_OK) {
            free(c);
            return NULL;
        }
    } else if (t->data) {
        size_t nb;
        if (eng_tensor_nbytes_checked(t, "tensor clone", &nb) != ENG_STATUS_OK) {
            free(c);
            return NULL;
        }
        c->data = eng_alloc(nb);
        if (!c->data) {
            free(c);
            return NULL;
        }
        memcpy(c->data, t->data, nb);
    }
    return c;
}

void eng_tensor_destroy(eng_tensor **t) {
    if (!t || !*t) return;
    eng_free((*t)->data);
    free(*t);
    *t = NULL;
}

void eng_graph_index_producers(eng_graph *g) {
    for (int v = 0; v < g->nvalues; v++) g->values[v].producer = -1;
    for (int i = 0; i < g->nnodes; i++)
        for (int j = 0; j < g->nodes[i].nout; j++)
            if (g->nodes[i].outputs[j] >= 0) g->values[g->nodes[i].outputs[j]].producer = i;
}

eng_status eng_graph_outer_refs(const eng_graph *sub, int **out, int *n) {
    *out = NULL;
    *n = 0;
    unsigned char *role = calloc((size_t)sub->nvalues + 1, 1); /* 1 read, 2 defined here */
    if (!role) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; i < sub->ninputs; i++) role[sub->inputs[i]] |= 2;
    for (int k = 0; k < sub->nnodes; k++) {
        const eng_node *nd = &sub->nodes[k];
        for (int i = 0; i < nd->nin; i++)
            if (nd->inputs[i] >= 0) role[nd->inputs[i]] |= 1;
        for (int i = 0; i < nd->nout; i++)
            if (nd->outputs[i] >= 0) role[nd->outputs[i]] |= 2;
    }
    for (int i = 0; i < sub->noutputs; i++) role[sub->outputs[i]] |= 1;
    int cnt = 0;
    for (int v = 0; v < sub->nvalues; v++) {
        if (sub->values[v].init) role[v] |= 2;
        cnt += role[v] == 1;
    }
    if (cnt) {
        if (!(*out = malloc((size_t)cnt * sizeof(int)))) {
            free(role);
            return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
        }
        for (int v = 0; v < sub->nvalues; v++)
            if (role[v] == 1) (*out)[(*n)++] = v;
    }
    free(role);
    return ENG_STATUS_OK;
}
