/* onnx-load.c - ModelProto -> eng_graph (eng_onnx_load_file / eng_onnx_load_buffer).
 *
 * Value order in the loaded graph is deterministic and what onnx-save.c relies on for round trips:
 *   1. graph inputs (in order), 2. initializers not already created, 3. node inputs/outputs in node order,
 *   4. graph outputs, 5. value_info entries not yet seen.
 * Declared types: the first declaration with a type wins (inputs, then outputs, then value_info); an
 * initializer's dtype/shape always replaces what was declared for it.
 * Checks: unique input/initializer names, one producer per value, no node writing a graph input or
 * initializer, graph outputs defined, cycles and undefined inputs (eng_graph_topo_order); in subgraphs a name
 * not defined locally must be defined in an enclosing graph (outer-scope reference). Subgraph nesting is
 * limited to ENG_ONNX_MAX_GRAPH_DEPTH and protobuf message nesting to ENG_ONNX_MAX_MSG_DEPTH.
 * Name lookups go through a per-graph hash index, so loading is linear in the model size.
 */
#include "onnx-impl.h"
#include "file-io.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- loader state ---- */

typedef struct eng_scope {
    eng_graph *g;
    eng_name_index map;
    const struct eng_scope *up; /* enclosing graph's scope, NULL at the top */
    int depth;
} eng_scope;

typedef struct eng_loader {
    const char *base_dir;
} eng_loader;

static eng_status eng_load_graph(const eng_loader *ld, const Onnx__GraphProto *gp, const eng_scope *up, int depth,
                                 eng_graph **out);

static const char *eng_s(const char *s) { return s ? s : ""; }

static char *eng_dup(const char *s) {
    s = eng_s(s);
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n + 1);
    return d;
}

/* Index of value `name`, created if absent. */
static eng_status eng_value_get(eng_scope *sc, const char *name, int *out) {
    int v = eng_name_index_find(&sc->map, sc->g, name);
    if (v < 0) {
        v = eng_graph_add_value(sc->g, name);
        if (v < 0 || !eng_name_index_add(&sc->map, sc->g, v))
            return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory adding value '%.200s'", name);
    }
    *out = v;
    return ENG_STATUS_OK;
}

static int eng_scope_defines(const eng_scope *sc, const char *name) {
    for (; sc; sc = sc->up)
        if (eng_name_index_find(&sc->map, sc->g, name) >= 0) return 1;
    return 0;
}

static int eng_value_declared(const eng_value *v) { return v->dtype != ENG_DTYPE_UNDEFINED || v->ndim >= 0; }

/* Apply a ValueInfoProto's type to value v unless v already has a declaration. `strict`: refuse non-tensor
 * types (graph inputs/outputs); otherwise they are left undeclared. */
static eng_status eng_apply_type(eng_graph *g, int v, const Onnx__ValueInfoProto *vi, int strict, const char *role) {
    eng_value *val = &g->values[v];
    const Onnx__TypeProto *tp = vi->type;
    if (!tp || eng_value_declared(val)) return ENG_STATUS_OK;
    if (tp->value_case == ONNX__TYPE_PROTO__VALUE_SEQUENCE_TYPE && tp->sequence_type &&
        (!tp->sequence_type->elem_type ||
         tp->sequence_type->elem_type->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE)) {
        val->dtype = ENG_DTYPE_SEQUENCE; /* a sequence of tensors (engine/ir/seq.h) */
        val->ndim = 0;
        return ENG_STATUS_OK;
    }
    if (tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type) {
        if (!strict || tp->value_case == ONNX__TYPE_PROTO__VALUE__NOT_SET) return ENG_STATUS_OK;
        return eng_err(ENG_STATUS_UNSUPPORTED, "%s '%s': only tensor types are supported (type case %d)", role,
                       val->name, (int)tp->value_case);
    }
    const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
    if (tt->has_elem_type && tt->elem_type != 0) {
        if (eng_dtype_size((eng_dtype)tt->elem_type) == 0 && tt->elem_type != ENG_DTYPE_STRING)
            return eng_err(ENG_STATUS_UNSUPPORTED, "%s '%s': element type %d is not supported", role, val->name,
                           (int)tt->elem_type);
        val->dtype = (eng_dtype)tt->elem_type;
    }
    if (!tt->shape) return ENG_STATUS_OK;
    if (tt->shape->n_dim > ENG_MAX_DIMS)
        return eng_err(ENG_STATUS_UNSUPPORTED, "%s '%s': rank %zu exceeds the limit of %d dims", role, val->name,
                       tt->shape->n_dim, ENG_MAX_DIMS);
    val->ndim = (int)tt->shape->n_dim;
    for (int i = 0; i < val->ndim; i++) {
        const Onnx__TensorShapeProto__Dimension *d = tt->shape->dim[i];
        val->dims[i] = -1;
        if (!d) continue;
        if (d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE) {
            val->dims[i] = d->dim_value >= 0 ? d->dim_value : -1;
        } else if (d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM && d->dim_param &&
                   d->dim_param[0]) {
            if (!(val->dim_param[i] = eng_dup(d->dim_param)))
                return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s '%s': out of memory", role, val->name);
        }
    }
    return ENG_STATUS_OK;
}

/* ---- attributes ---- */

static eng_status eng_load_attr(const eng_loader *ld, const Onnx__AttributeProto *ap, const eng_scope *sc,
                                const char *node, eng_attr *a) {
    memset(a, 0, sizeof *a);
    const char *an = eng_s(ap->name);
    if (!an[0]) return eng_err(ENG_STATUS_INVALID_MODEL, "node '%s': attribute with an empty name", node);
    int type = (int)ap->type;
    if (type == 0) { /* IR < 3 files may omit the type: infer it from the field that is set */
        if (ap->g) type = ENG_ATTR_GRAPH;
        else if (ap->t) type = ENG_ATTR_TENSOR;
        else if (ap->has_s) type = ENG_ATTR_STRING;
        else if (ap->has_i) type = ENG_ATTR_INT;
        else if (ap->has_f) type = ENG_ATTR_FLOAT;
        else if (ap->n_floats) type = ENG_ATTR_FLOATS;
        else if (ap->n_ints) type = ENG_ATTR_INTS;
        else if (ap->n_strings) type = ENG_ATTR_STRINGS;
        else if (ap->sparse_tensor || ap->n_sparse_tensors)
            return eng_err(ENG_STATUS_UNSUPPORTED, "node '%s': attribute '%s': sparse tensors are not supported", node,
                           an);
        else
            return eng_err(ENG_STATUS_INVALID_MODEL, "node '%s': attribute '%s' has no type and no value", node, an);
    }
    if (!(a->name = eng_dup(an))) goto oom;
    a->type = (eng_attr_type)type;
    switch (type) {
    case ENG_ATTR_FLOAT: a->f = ap->f; break;
    case ENG_ATTR_INT: a->i = ap->i; break;
    case ENG_ATTR_STRING:
        a->s_len = ap->s.len;
        if (!(a->s = malloc(a->s_len + 1))) goto oom;
        if (a->s_len) memcpy(a->s, ap->s.data, a->s_len);
        a->s[a->s_len] = '\0';
        break;
    case ENG_ATTR_FLOATS:
        if (ap->n_floats > INT_MAX / 8) goto too_many;
        a->n = (int)ap->n_floats;
        if (!(a->floats = malloc((ap->n_floats ? ap->n_floats : 1) * sizeof(float)))) goto oom;
        if (ap->n_floats) memcpy(a->floats, ap->floats, ap->n_floats * sizeof(float));
        break;
    case ENG_ATTR_INTS:
        if (ap->n_ints > INT_MAX / 8) goto too_many;
        a->n = (int)ap->n_ints;
        if (!(a->ints = malloc((ap->n_ints ? ap->n_ints : 1) * sizeof(int64_t)))) goto oom;
        if (ap->n_ints) memcpy(a->ints, ap->ints, ap->n_ints * sizeof(int64_t));
        break;
    case ENG_ATTR_STRINGS:
        if (ap->n_strings > INT_MAX / 8) goto too_many;
        if (!(a->strings = calloc(ap->n_strings ? ap->n_strings : 1, sizeof(char *)))) goto oom;
        a->n = (int)ap->n_strings;
        for (size_t k = 0; k < ap->n_strings; k++) {
            size_t l = ap->strings[k].len;
            if (!(a->strings[k] = malloc(l + 1))) goto oom;
            if (l) memcpy(a->strings[k], ap->strings[k].data, l);
            a->strings[k][l] = '\0';
        }
        break;
    case ENG_ATTR_TENSOR: {
        if (!ap->t) {
            eng_attr_clear(a);
            return eng_err(ENG_STATUS_INVALID_MODEL, "node '%s': attribute '%s' of type TENSOR has no tensor", node, an);
        }
        eng_tensor *t;
        eng_status st = eng_onnx_tensor_decode(ap->t, ld->base_dir, &t);
        if (st != ENG_STATUS_OK) {
            eng_attr_clear(a);
            return eng_err_prefix(st, "node '%s': attribute '%s': ", node, an);
        }
        a->t = *t;
        free(t);
        break;
    }
    case ENG_ATTR_GRAPH: {
        if (!ap->g) {
            eng_attr_clear(a);
            return eng_err(ENG_STATUS_INVALID_MODEL, "node '%s': attribute '%s' of type GRAPH has no graph", node, an);
        }
        eng_status st = eng_load_graph(ld, ap->g, sc, sc->depth + 1, &a->g);
        if (st != ENG_STATUS_OK) {
            eng_attr_clear(a);
            return eng_err_prefix(st, "node '%s': subgraph '%s': ", node, an);
        }
        break;
    }
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__SPARSE_TENSOR:
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__SPARSE_TENSORS:
        eng_attr_clear(a);
        return eng_err(ENG_STATUS_UNSUPPORTED, "node '%s': attribute '%s': sparse tensors are not supported", node, an);
    default:
        eng_attr_clear(a);
        return eng_err(ENG_STATUS_UNSUPPORTED, "node '%s': attribute '%s': attribute type %d is not supported", node,
                       an, type);
    }
    return ENG_STATUS_OK;
too_many:
    eng_attr_clear(a);
    return eng_err(ENG_STATUS_INVALID_MODEL, "node '%s': attribute '%s' has too many entries", node, an);
oom:
    eng_attr_clear(a);
    return eng_err(ENG_STATUS_OUT_OF_MEMORY, "node '%s': attribute '%s': out of memory", node, an);
}

/* ---- nodes ---- */

static int eng_cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static eng_status eng_load_node(const eng_loader *ld, eng_scope *sc, const Onnx__NodeProto *np, int idx) {
    eng_graph *g = sc->g;
    const char *nname = eng_s(np->name);
    char label[320];
    snprintf(label, sizeof label, "%.200s", nname[0] ? nname : "");
    if (!nname[0]) snprintf(label, sizeof label, "#%d", idx);
    if (!np->op_type || !np->op_type[0]) return eng_err(ENG_STATUS_INVALID_MODEL, "node %s: op_type is empty", label);
    if (np->n_input > INT_MAX / 8 || np->n_output > INT_MAX / 8 || np->n_attribute > INT_MAX / 8)
        return eng_err(ENG_STATUS_INVALID_MODEL, "node '%s' (%s): too many inputs/outputs/attributes", label,
                       np->op_type);
    int nin = (int)np->n_input, nout = (int)np->n_output, nattr = (int)np->n_attribute;
    int *ins = malloc((size_t)(nin + 1) * sizeof(int));
    int *outs = malloc((size_t)(nout + 1) * sizeof(int));
    eng_attr *attrs = calloc((size_t)nattr + 1, sizeof(eng_attr));
    eng_status st = ENG_STATUS_OK;
    int made = 0;
    if (!ins || !outs || !attrs) {
        st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "node '%s': out of memory", label);
        goto out;
    }
    for (int i = 0; i < nin; i++) {
        const char *vn = eng_s(np->input[i]);
        ins[i] = -1;
        if (vn[0] && (st = eng_value_get(sc, vn, &ins[i])) != ENG_STATUS_OK) goto out;
    }
    for (int i = 0; i < nattr; i++) {
        if (!np->attribute[i]) continue;
        if ((st = eng_load_attr(ld, np->attribute[i], sc, label, &attrs[made])) != ENG_STATUS_OK) goto out;
        made++;
    }
    if (made > 1) { /* duplicate names: sort a scratch list of names, O(n log n) even for hostile nodes */
        const char **names = malloc((size_t)made * sizeof *names);
        if (!names) {
            st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "node '%s': out of memory", label);
            goto out;
        }
        for (int i = 0; i < made; i++) names[i] = attrs[i].name;
        qsort(names, (size_t)made, sizeof *names, eng_cmp_str);
        for (int i = 1; i < made && st == ENG_STATUS_OK; i++)
            if (strcmp(names[i - 1], names[i]) == 0)
                st = eng_err(ENG_STATUS_INVALID_MODEL, "node '%s' (%s): attribute '%s' appears twice", label,
                             np->op_type, names[i]);
        free(names);
        if (st != ENG_STATUS_OK) goto out;
    }
    /* outer-scope values the subgraphs read become the node's implicit inputs (graph.h: eng_node.nimplicit) */
    int nimp = 0;
    for (int a = 0; a < made; a++) {
        if (attrs[a].type != ENG_ATTR_GRAPH || !attrs[a].g) continue;
        int *refs = NULL, nrefs = 0;
        if ((st = eng_graph_outer_refs(attrs[a].g, &refs, &nrefs)) != ENG_STATUS_OK) goto out;
        for (int r = 0; r < nrefs && st == ENG_STATUS_OK; r++) {
            int v = -1, dup = 0;
            st = eng_value_get(sc, attrs[a].g->values[refs[r]].name, &v);
            for (int j = nin; j < nin + nimp && st == ENG_STATUS_OK; j++) dup |= ins[j] == v;
            if (st != ENG_STATUS_OK || dup) continue;
            int *ni = realloc(ins, (size_t)(nin + nimp + 2) * sizeof(int));
            if (!ni) {
                st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "node '%s': out of memory", label);
                break;
            }
            ins = ni;
            ins[nin + nimp++] = v;
        }
        free(refs);
        if (st != ENG_STATUS_OK) goto out;
    }
    for (int i = 0; i < nout; i++) {
        const char *vn = eng_s(np->output[i]);
        outs[i] = -1;
        if (!vn[0]) continue;
        if ((st = eng_value_get(sc, vn, &outs[i])) != ENG_STATUS_OK) goto out;
        eng_value *v = &g->values[outs[i]];
        if (v->producer >= 0) {
            const eng_node *o = v->producer < g->nnodes ? &g->nodes[v->producer] : NULL;
            st = eng_err(ENG_STATUS_INVALID_MODEL, "node '%s' (%s): output '%s' is already produced by %s%s%s%s",
                         label, np->op_type, v->name, o ? "node '" : "this node", o ? o->name : "", o ? "' " : "",
                         o ? o->op_type : "");
            goto out;
        }
        /* graph inputs are exactly values [0, ninputs): step 1 creates them first */
        if (v->init || outs[i] < g->ninputs) {
            st = eng_err(ENG_STATUS_INVALID_MODEL, "node '%s' (%s): output '%s' is already %s", label, np->op_type,
                         v->name, v->init ? "an initializer" : "a graph input");
            goto out;
        }
        v->producer = idx;
    }
    int k = eng_graph_add_node(g, nname, np->op_type, eng_s(np->domain), ins, nin + nimp, outs, nout);
    if (k != idx) {
        st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "node '%s': out of memory", label);
        goto out;
    }
    g->nodes[k].nimplicit = nimp;
    for (int i = 0; i < made; i++)
        if ((st = eng_node_take_attr(g, k, &attrs[i])) != ENG_STATUS_OK) goto out;
out:
    for (int i = 0; i < made; i++) eng_attr_clear(&attrs[i]);
    free(attrs);
    free(ins);
    free(outs);
    return st;
}

/* ---- graphs ---- */

static eng_status eng_load_graph_body(const eng_loader *ld, eng_scope *sc, const Onnx__GraphProto *gp) {
    eng_graph *g = sc->g;
    if (!(g->name = eng_dup(gp->name))) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    if (gp->doc_string && gp->doc_string[0] && !(g->doc_string = eng_dup(gp->doc_string)))
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    if (gp->n_input > INT_MAX / 8 || gp->n_output > INT_MAX / 8 || gp->n_node > INT_MAX / 8)
        return eng_err(ENG_STATUS_INVALID_MODEL, "graph '%s': too many inputs, outputs or nodes", g->name);
    if (gp->n_sparse_initializer)
        return eng_err(ENG_STATUS_UNSUPPORTED, "graph '%s': sparse initializer '%s' is not supported", g->name,
                       gp->sparse_initializer[0] && gp->sparse_initializer[0]->values
                           ? eng_s(gp->sparse_initializer[0]->values->name) : "");
    g->inputs = malloc((gp->n_input + 1) * sizeof(int));
    g->outputs = malloc((gp->n_output + 1) * sizeof(int));
    if (!g->inputs || !g->outputs) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    /* 1. inputs */
    for (size_t i = 0; i < gp->n_input; i++) {
        const Onnx__ValueInfoProto *vi = gp->input[i];
        const char *vn = vi ? eng_s(vi->name) : "";
        if (!vn[0]) return eng_err(ENG_STATUS_INVALID_MODEL, "graph '%s': input %zu has an empty name", g->name, i);
        if (eng_name_index_find(&sc->map, g, vn) >= 0)
            return eng_err(ENG_STATUS_INVALID_MODEL, "graph '%s': input '%s' is listed twice", g->name, vn);
        int v = -1;
        ENG_TRY(eng_value_get(sc, vn, &v));
        ENG_TRY(eng_apply_type(g, v, vi, 1, "input"));
        g->inputs[g->ninputs++] = v;
    }
    /* 2. initializers */
    for (size_t i = 0; i < gp->n_initializer; i++) {
        const Onnx__TensorProto *tp = gp->initializer[i];
        const char *vn = tp ? eng_s(tp->name) : "";
        if (!vn[0]) return eng_err(ENG_STATUS_INVALID_MODEL, "graph '%s': initializer %zu has an empty name", g->name, i);
        int v = -1;
        ENG_TRY(eng_value_get(sc, vn, &v));
        eng_value *val = &g->values[v];
        if (val->init) return eng_err(ENG_STATUS_INVALID_MODEL, "graph '%s': initializer '%s' appears twice", g->name, vn);
        eng_tensor *t;
        ENG_TRY(eng_onnx_tensor_decode(tp, ld->base_dir, &t));
        val->init = t;
        val->dtype = t->dtype;
        val->ndim = t->ndim;
        for (int d = 0; d < ENG_MAX_DIMS; d++) {
            val->dims[d] = d < t->ndim ? t->dims[d] : -1;
            free(val->dim_param[d]);
            val->dim_param[d] = NULL;
        }
    }
    /* 3. nodes */
    for (size_t i = 0; i < gp->n_node; i++) {
        if (!gp->node[i]) continue;
        ENG_TRY(eng_load_node(ld, sc, gp->node[i], g->nnodes));
    }
    /* 4. outputs */
    for (size_t i = 0; i < gp->n_output; i++) {
        const Onnx__ValueInfoProto *vi = gp->output[i];
        const char *vn = vi ? eng_s(vi->name) : "";
        if (!vn[0]) return eng_err(ENG_STATUS_INVALID_MODEL, "graph '%s': output %zu has an empty name", g->name, i);
        int v = -1;
        ENG_TRY(eng_value_get(sc, vn, &v));
        ENG_TRY(eng_apply_type(g, v, vi, 1, "output"));
        g->outputs[g->noutputs++] = v;
    }
    /* 5. value_info */
    for (size_t i = 0; i < gp->n_value_info; i++) {
        const Onnx__ValueInfoProto *vi = gp->value_info[i];
        const char *vn = vi ? eng_s(vi->name) : "";
        if (!vn[0]) continue;
        int v = -1;
        ENG_TRY(eng_value_get(sc, vn, &v));
        ENG_TRY(eng_apply_type(g, v, vi, 0, "value"));
    }
    /* every value that nothing defines locally must come from an enclosing graph */
    unsigned char *role = calloc((size_t)g->nvalues + 1, 1); /* 1 = read by a node, 2 = graph output */
    if (!role) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int n = 0; n < g->nnodes; n++)
        for (int k = 0; k < g->nodes[n].nin; k++)
            if (g->nodes[n].inputs[k] >= 0) role[g->nodes[n].inputs[k]] |= 1;
    for (int o = 0; o < g->noutputs; o++) role[g->outputs[o]] |= 2;
    eng_status st = ENG_STATUS_OK;
    for (int v = g->ninputs; v < g->nvalues && st == ENG_STATUS_OK; v++) {
        const eng_value *val = &g->values[v];
        if (val->producer >= 0 || val->init || !role[v]) continue;
        if (!sc->up) {
            if (role[v] & 2)
                st = eng_err(ENG_STATUS_INVALID_MODEL,
                             "graph '%s': output '%s' is not produced by any node, initializer or input", g->name,
                             val->name);
        } else if (!eng_scope_defines(sc->up, val->name)) {
            st = eng_err(ENG_STATUS_INVALID_MODEL,
                         "graph '%s': value '%s' is used but defined neither in this subgraph nor in an enclosing "
                         "graph", g->name, val->name);
        }
    }
    free(role);
    ENG_TRY(st);
    int *order = malloc(((size_t)g->nnodes + 1) * sizeof(int));
    if (!order) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    st = eng_graph_topo_order(g, order);
    free(order);
    return st;
}

static eng_status eng_load_graph(const eng_loader *ld, const Onnx__GraphProto *gp, const eng_scope *up, int depth,
                                 eng_graph **out) {
    *out = NULL;
    if (depth > ENG_ONNX_MAX_GRAPH_DEPTH)
        return eng_err(ENG_STATUS_INVALID_MODEL, "subgraphs nested deeper than %d levels", ENG_ONNX_MAX_GRAPH_DEPTH);
    eng_scope sc = {.g = eng_graph_new(), .up = up, .depth = depth};
    if (!sc.g) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory creating a graph");
    free(sc.g->name);
    sc.g->name = NULL;
    sc.g->parent = up ? up->g : NULL;
    eng_status st = eng_load_graph_body(ld, &sc, gp);
    eng_name_index_free(&sc.map);
    if (st != ENG_STATUS_OK) {
        if (!sc.g->name) sc.g->name = eng_dup("");
        eng_graph_free(&sc.g);
        return st;
    }
    *out = sc.g;
    return ENG_STATUS_OK;
}

static eng_status eng_load_model(const Onnx__ModelProto *mp, const char *base_dir, eng_graph **out) {
    if (!mp->graph) return eng_err(ENG_STATUS_INVALID_MODEL, "model has no graph");
    eng_loader ld = {.base_dir = base_dir};
    eng_graph *g;
    ENG_TRY(eng_load_graph(&ld, mp->graph, NULL, 0, &g));
    g->ir_version = mp->has_ir_version ? mp->ir_version : 0;
    int have_default = 0;
    for (size_t i = 0; i < mp->n_opset_import; i++) {
        const Onnx__OperatorSetIdProto *op = mp->opset_import[i];
        if (!op) continue;
        const char *d = eng_s(op->domain);
        int64_t ver = op->has_version ? op->version : 0;
        if (!d[0] || strcmp(d, "ai.onnx") == 0) {
            if (!have_default || ver > g->opset) g->opset = ver;
            have_default = 1;
        } else if (strcmp(d, "ai.onnx.ml") == 0) {
            if (ver > g->opset_ml) g->opset_ml = ver;
        }
    }
    if (!have_default) g->opset = 1; /* IR < 3 models predate opset_import: operator set 1 */
    if ((mp->producer_name && !(g->producer_name = eng_dup(mp->producer_name))) ||
        (mp->producer_version && !(g->producer_version = eng_dup(mp->producer_version))) ||
        (mp->doc_string && mp->doc_string[0] && !g->doc_string && !(g->doc_string = eng_dup(mp->doc_string)))) {
        eng_graph_free(&g);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    *out = g;
    return ENG_STATUS_OK;
}

eng_status eng_onnx_load_buffer(const void *buf, size_t len, const char *base_dir, const char *what, eng_graph **out) {
    if (!what) what = "<buffer>";
    if (!out || (!buf && len)) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: NULL buffer or output", what);
    *out = NULL;
    if (len > ENG_ONNX_MAX_FILE_BYTES)
        return eng_err(ENG_STATUS_INVALID_MODEL, "%s: %zu bytes is more than protobuf's 2 GiB limit", what, len);
    eng_status st = eng_onnx_check_nesting(&onnx__model_proto__descriptor, buf, len);
    if (st != ENG_STATUS_OK) return eng_err_prefix(st, "%s: ", what);
    Onnx__ModelProto *mp = onnx__model_proto__unpack(NULL, len, buf);
    if (!mp) return eng_err(ENG_STATUS_INVALID_MODEL, "%s: not a valid ONNX model (protobuf parse failed)", what);
    st = eng_load_model(mp, base_dir, out);
    onnx__model_proto__free_unpacked(mp, NULL);
    if (st != ENG_STATUS_OK) return eng_err_prefix(st, "%s: ", what);
    return ENG_STATUS_OK;
}

eng_status eng_onnx_load_file(const char *path, eng_graph **out) {
    if (!path || !out) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "eng_onnx_load_file: NULL argument");
    *out = NULL;
    uint8_t *buf;
    size_t len;
    ENG_TRY(eng_file_read(path, ENG_ONNX_MAX_FILE_BYTES, &buf, &len));
    char *dir = eng_file_dirname(path);
    if (!dir) {
        free(buf);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    eng_status st = eng_onnx_load_buffer(buf, len, dir, path, out);
    free(dir);
    free(buf);
    return st;
}
