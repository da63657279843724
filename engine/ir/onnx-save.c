/* onnx-save.c - eng_graph -> ModelProto -> file (eng_onnx_save_file).
 *
 * Layout written, chosen so that onnx-load.c rebuilds the same graph (same value order, types, attributes):
 *   inputs = g->inputs; initializer = values with `init` in value order; node = nodes in order;
 *   output = g->outputs; value_info = every other value (typed or not) in value order.
 * Initializers (in subgraphs too) larger than external_threshold bytes go to
 * "<model basename>.data" beside the model, at 64-byte aligned offsets, and are referenced by location/offset/
 * length entries. Both files are written atomically (file-io.h): the data file is committed before the model,
 * so a visible model never points at missing data.
 * Tensor bytes are borrowed (not copied) into the protobuf structs and detached before they are freed.
 */
#include "onnx-impl.h"
#include "file-io.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct eng_saver {
    size_t threshold;
    const char *path;
    char *data_name;          /* basename of the data file */
    char *data_path;          /* full path of the data file */
    eng_atomic_file data;     /* open once the first external tensor is written */
    int data_open;
    Onnx__TensorProto **borrowed; /* tensors whose raw_data points into graph memory */
    size_t nborrowed, capborrowed;
    eng_status st;            /* first failure */
} eng_saver;

#define ENG_SV_OOM(sv) ((sv)->st = (sv)->st ? (sv)->st : eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory"))

static void *eng_sv_calloc(eng_saver *sv, size_t n, size_t sz) {
    void *p = calloc(n ? n : 1, sz);
    if (!p) ENG_SV_OOM(sv);
    return p;
}

static char *eng_sv_strdup(eng_saver *sv, const char *s) {
    char *d = strdup(s ? s : "");
    if (!d) ENG_SV_OOM(sv);
    return d;
}

static Onnx__StringStringEntryProto *eng_sv_entry(eng_saver *sv, const char *k, const char *v) {
    Onnx__StringStringEntryProto *e = eng_sv_calloc(sv, 1, sizeof *e);
    if (!e) return NULL;
    onnx__string_string_entry_proto__init(e);
    e->key = eng_sv_strdup(sv, k);
    e->value = eng_sv_strdup(sv, v);
    return e;
}

static eng_status eng_sv_external(eng_saver *sv, Onnx__TensorProto *tp, const void *data, size_t nb) {
    static const uint8_t zeros[64];
    if (!sv->data_open) {
        ENG_TRY(eng_atomic_open(&sv->data, sv->data_path));
        sv->data_open = 1;
    }
    size_t pad = (size_t)((64 - sv->data.size % 64) % 64);
    if (pad) ENG_TRY(eng_atomic_write(&sv->data, zeros, pad));
    uint64_t off = sv->data.size;
    ENG_TRY(eng_atomic_write(&sv->data, data, nb));
    char offs[32], lens[32];
    snprintf(offs, sizeof offs, "%llu", (unsigned long long)off);
    snprintf(lens, sizeof lens, "%zu", nb);
    tp->external_data = eng_sv_calloc(sv, 3, sizeof *tp->external_data);
    if (!tp->external_data) return sv->st;
    tp->n_external_data = 3;
    tp->external_data[0] = eng_sv_entry(sv, "location", sv->data_name);
    tp->external_data[1] = eng_sv_entry(sv, "offset", offs);
    tp->external_data[2] = eng_sv_entry(sv, "length", lens);
    tp->has_data_location = 1;
    tp->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
    return sv->st;
}

/* external: may go to the data file (initializers only; attribute tensors always stay inline). */
static Onnx__TensorProto *eng_sv_tensor(eng_saver *sv, const eng_tensor *t, const char *name, int external) {
    Onnx__TensorProto *tp = eng_sv_calloc(sv, 1, sizeof *tp);
    if (!tp) return NULL;
    onnx__tensor_proto__init(tp);
    tp->name = eng_sv_strdup(sv, name);
    tp->has_data_type = 1;
    tp->data_type = (int32_t)t->dtype;
    if (t->ndim < 0 || t->ndim > ENG_MAX_DIMS) {
        if (!sv->st) sv->st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "tensor '%s': invalid rank %d", name, t->ndim);
        return tp;
    }
    tp->dims = eng_sv_calloc(sv, (size_t)t->ndim, sizeof(int64_t));
    if (!tp->dims) return tp;
    tp->n_dims = (size_t)t->ndim;
    memcpy(tp->dims, t->dims, (size_t)t->ndim * sizeof(int64_t));
    char what[300];
    snprintf(what, sizeof what, "tensor '%.200s'", name);
    size_t nb;
    eng_status st = eng_tensor_nbytes_checked(t, what, &nb);
    if (st != ENG_STATUS_OK) {
        if (!sv->st) sv->st = st;
        return tp;
    }
    if (!t->data) {
        if (nb && !sv->st) sv->st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "tensor '%s' has no data", name);
        return tp;
    }
    if (external && sv->threshold && nb > sv->threshold) {
        st = eng_sv_external(sv, tp, t->data, nb);
        if (st != ENG_STATUS_OK && !sv->st) sv->st = st;
        return tp;
    }
    if (sv->nborrowed == sv->capborrowed) {
        size_t cap = sv->capborrowed ? sv->capborrowed * 2 : 32;
        Onnx__TensorProto **nb2 = realloc(sv->borrowed, cap * sizeof *nb2);
        if (!nb2) {
            ENG_SV_OOM(sv);
            return tp;
        }
        sv->borrowed = nb2;
        sv->capborrowed = cap;
    }
    sv->borrowed[sv->nborrowed++] = tp;
    tp->has_raw_data = 1;
    tp->raw_data.len = nb;
    tp->raw_data.data = t->data;
    return tp;
}

static Onnx__ValueInfoProto *eng_sv_value_info(eng_saver *sv, const eng_value *v) {
    Onnx__ValueInfoProto *vi = eng_sv_calloc(sv, 1, sizeof *vi);
    if (!vi) return NULL;
    onnx__value_info_proto__init(vi);
    vi->name = eng_sv_strdup(sv, v->name);
    if (v->dtype == ENG_DTYPE_UNDEFINED && v->ndim < 0) return vi;
    if (v->dtype == ENG_DTYPE_SEQUENCE) { /* sequence(tensor), element type not recorded */
        Onnx__TypeProto *st = eng_sv_calloc(sv, 1, sizeof *st), *et;
        if (!st) return vi;
        onnx__type_proto__init(st);
        vi->type = st; /* each piece hangs on the tree as it is made: freed with it */
        Onnx__TypeProto__Sequence *sq = eng_sv_calloc(sv, 1, sizeof *sq);
        if (!sq) return vi;
        onnx__type_proto__sequence__init(sq);
        st->value_case = ONNX__TYPE_PROTO__VALUE_SEQUENCE_TYPE;
        st->sequence_type = sq;
        if (!(et = eng_sv_calloc(sv, 1, sizeof *et))) return vi;
        onnx__type_proto__init(et);
        sq->elem_type = et;
        Onnx__TypeProto__Tensor *tt = eng_sv_calloc(sv, 1, sizeof *tt);
        if (!tt) return vi;
        onnx__type_proto__tensor__init(tt);
        et->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
        et->tensor_type = tt;
        return vi;
    }
    Onnx__TypeProto *tp = eng_sv_calloc(sv, 1, sizeof *tp);
    Onnx__TypeProto__Tensor *tt = eng_sv_calloc(sv, 1, sizeof *tt);
    if (!tp || !tt) {
        free(tp);
        free(tt);
        return vi;
    }
    onnx__type_proto__init(tp);
    onnx__type_proto__tensor__init(tt);
    vi->type = tp;
    tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    tp->tensor_type = tt;
    if (v->dtype != ENG_DTYPE_UNDEFINED) {
        tt->has_elem_type = 1;
        tt->elem_type = (int32_t)v->dtype;
    }
    if (v->ndim < 0) return vi;
    int nd = v->ndim > ENG_MAX_DIMS ? ENG_MAX_DIMS : v->ndim;
    Onnx__TensorShapeProto *sh = eng_sv_calloc(sv, 1, sizeof *sh);
    if (!sh) return vi;
    onnx__tensor_shape_proto__init(sh);
    tt->shape = sh;
    sh->dim = eng_sv_calloc(sv, (size_t)nd, sizeof *sh->dim);
    if (!sh->dim) return vi;
    for (int i = 0; i < nd; i++) {
        Onnx__TensorShapeProto__Dimension *d = eng_sv_calloc(sv, 1, sizeof *d);
        if (!d) return vi;
        onnx__tensor_shape_proto__dimension__init(d);
        sh->dim[sh->n_dim++] = d;
        if (v->dims[i] >= 0) {
            d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
            d->dim_value = v->dims[i];
        } else if (v->dim_param[i] && v->dim_param[i][0]) {
            d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
            d->dim_param = eng_sv_strdup(sv, v->dim_param[i]);
        }
    }
    return vi;
}

static Onnx__GraphProto *eng_sv_graph(eng_saver *sv, const eng_graph *g, int depth);

static Onnx__AttributeProto *eng_sv_attr(eng_saver *sv, const eng_attr *a, int depth) {
    Onnx__AttributeProto *ap = eng_sv_calloc(sv, 1, sizeof *ap);
    if (!ap) return NULL;
    onnx__attribute_proto__init(ap);
    ap->name = eng_sv_strdup(sv, a->name);
    ap->has_type = 1;
    ap->type = (Onnx__AttributeProto__AttributeType)a->type;
    size_t n = a->n > 0 ? (size_t)a->n : 0;
    switch (a->type) {
    case ENG_ATTR_FLOAT: ap->has_f = 1; ap->f = a->f; break;
    case ENG_ATTR_INT: ap->has_i = 1; ap->i = a->i; break;
    case ENG_ATTR_STRING:
        ap->has_s = 1;
        ap->s.len = a->s ? a->s_len : 0;
        ap->s.data = eng_sv_calloc(sv, ap->s.len + 1, 1);
        if (ap->s.data && ap->s.len) memcpy(ap->s.data, a->s, ap->s.len);
        break;
    case ENG_ATTR_FLOATS:
        if (!a->floats) break;
        if ((ap->floats = eng_sv_calloc(sv, n, sizeof(float)))) {
            ap->n_floats = n;
            if (n) memcpy(ap->floats, a->floats, n * sizeof(float));
        }
        break;
    case ENG_ATTR_INTS:
        if (!a->ints) break;
        if ((ap->ints = eng_sv_calloc(sv, n, sizeof(int64_t)))) {
            ap->n_ints = n;
            if (n) memcpy(ap->ints, a->ints, n * sizeof(int64_t));
        }
        break;
    case ENG_ATTR_STRINGS:
        if (!a->strings || !(ap->strings = eng_sv_calloc(sv, n, sizeof *ap->strings))) break;
        for (size_t k = 0; k < n; k++) {
            const char *s = a->strings[k] ? a->strings[k] : "";
            size_t l = strlen(s);
            if (!(ap->strings[k].data = eng_sv_calloc(sv, l + 1, 1))) break;
            memcpy(ap->strings[k].data, s, l);
            ap->strings[k].len = l;
            ap->n_strings = k + 1;
        }
        break;
    case ENG_ATTR_TENSOR: ap->t = eng_sv_tensor(sv, &a->t, "", 0); break;
    case ENG_ATTR_GRAPH:
        if (!a->g) {
            if (!sv->st) sv->st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "attribute '%s': GRAPH without a graph", a->name);
            break;
        }
        ap->g = eng_sv_graph(sv, a->g, depth + 1);
        break;
    default:
        if (!sv->st)
            sv->st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "attribute '%s': unknown type %d", a->name, (int)a->type);
    }
    return ap;
}

static char *eng_sv_value_name(eng_saver *sv, const eng_graph *g, int v) {
    if (v < 0 || v >= g->nvalues) return eng_sv_strdup(sv, "");
    return eng_sv_strdup(sv, g->values[v].name);
}

static Onnx__NodeProto *eng_sv_node(eng_saver *sv, const eng_graph *g, const eng_node *n, int depth) {
    Onnx__NodeProto *np = eng_sv_calloc(sv, 1, sizeof *np);
    if (!np) return NULL;
    onnx__node_proto__init(np);
    if (n->name && n->name[0]) np->name = eng_sv_strdup(sv, n->name);
    np->op_type = eng_sv_strdup(sv, n->op_type);
    if (n->domain && n->domain[0]) np->domain = eng_sv_strdup(sv, n->domain);
    if ((np->input = eng_sv_calloc(sv, (size_t)n->nin, sizeof(char *))))
        for (int i = 0; i < n->nin - n->nimplicit; i++) np->input[np->n_input++] = eng_sv_value_name(sv, g, n->inputs[i]);
    if ((np->output = eng_sv_calloc(sv, (size_t)n->nout, sizeof(char *))))
        for (int i = 0; i < n->nout; i++) np->output[np->n_output++] = eng_sv_value_name(sv, g, n->outputs[i]);
    if ((np->attribute = eng_sv_calloc(sv, (size_t)n->nattr, sizeof *np->attribute)))
        for (int i = 0; i < n->nattr && !sv->st; i++) {
            Onnx__AttributeProto *ap = eng_sv_attr(sv, &n->attrs[i], depth);
            if (ap) np->attribute[np->n_attribute++] = ap;
        }
    return np;
}

static Onnx__GraphProto *eng_sv_graph(eng_saver *sv, const eng_graph *g, int depth) {
    if (depth > ENG_ONNX_MAX_GRAPH_DEPTH) {
        if (!sv->st)
            sv->st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "subgraphs nested deeper than %d levels",
                             ENG_ONNX_MAX_GRAPH_DEPTH);
        return NULL;
    }
    Onnx__GraphProto *gp = eng_sv_calloc(sv, 1, sizeof *gp);
    if (!gp) return NULL;
    onnx__graph_proto__init(gp);
    gp->name = eng_sv_strdup(sv, g->name);
    if (g->doc_string && g->doc_string[0]) gp->doc_string = eng_sv_strdup(sv, g->doc_string);
    unsigned char *role = eng_sv_calloc(sv, (size_t)g->nvalues, 1); /* 1 input, 2 output */
    if (!role) return gp;
    for (int i = 0; i < g->ninputs; i++)
        if (g->inputs[i] >= 0 && g->inputs[i] < g->nvalues) role[g->inputs[i]] |= 1;
    for (int i = 0; i < g->noutputs; i++)
        if (g->outputs[i] >= 0 && g->outputs[i] < g->nvalues) role[g->outputs[i]] |= 2;
    size_t ninit = 0, nvi = 0;
    for (int v = 0; v < g->nvalues; v++) {
        if (g->values[v].init) ninit++;
        else if (!role[v]) nvi++;
    }
    gp->input = eng_sv_calloc(sv, (size_t)g->ninputs, sizeof *gp->input);
    gp->output = eng_sv_calloc(sv, (size_t)g->noutputs, sizeof *gp->output);
    gp->initializer = eng_sv_calloc(sv, ninit, sizeof *gp->initializer);
    gp->value_info = eng_sv_calloc(sv, nvi, sizeof *gp->value_info);
    gp->node = eng_sv_calloc(sv, (size_t)g->nnodes, sizeof *gp->node);
    if (sv->st) goto out;
    for (int i = 0; i < g->ninputs && !sv->st; i++)
        if (g->inputs[i] >= 0 && g->inputs[i] < g->nvalues &&
            (gp->input[gp->n_input] = eng_sv_value_info(sv, &g->values[g->inputs[i]])))
            gp->n_input++;
    for (int v = 0; v < g->nvalues && !sv->st; v++) {
        const eng_value *val = &g->values[v];
        if (val->init) {
            if ((gp->initializer[gp->n_initializer] = eng_sv_tensor(sv, val->init, val->name, 1))) gp->n_initializer++;
        } else if (!role[v]) {
            if ((gp->value_info[gp->n_value_info] = eng_sv_value_info(sv, val))) gp->n_value_info++;
        }
    }
    for (int i = 0; i < g->nnodes && !sv->st; i++)
        if ((gp->node[gp->n_node] = eng_sv_node(sv, g, &g->nodes[i], depth))) gp->n_node++;
    for (int i = 0; i < g->noutputs && !sv->st; i++)
        if (g->outputs[i] >= 0 && g->outputs[i] < g->nvalues &&
            (gp->output[gp->n_output] = eng_sv_value_info(sv, &g->values[g->outputs[i]])))
            gp->n_output++;
out:
    free(role);
    return gp;
}

/* Distinct non-default node domains (recursively), appended to the opset list with version 1. */
static void eng_sv_domains(eng_saver *sv, const eng_graph *g, Onnx__ModelProto *m, size_t cap, int depth) {
    if (depth > ENG_ONNX_MAX_GRAPH_DEPTH) return;
    for (int i = 0; i < g->nnodes && !sv->st; i++) {
        const char *d = g->nodes[i].domain;
        if (d && d[0] && strcmp(d, "ai.onnx") != 0 && strcmp(d, "ai.onnx.ml") != 0) {
            int seen = 0;
            for (size_t k = 0; k < m->n_opset_import && !seen; k++)
                seen = m->opset_import[k]->domain && strcmp(m->opset_import[k]->domain, d) == 0;
            if (!seen && m->n_opset_import < cap) {
                Onnx__OperatorSetIdProto *op = eng_sv_calloc(sv, 1, sizeof *op);
                if (!op) return;
                onnx__operator_set_id_proto__init(op);
                op->domain = eng_sv_strdup(sv, d);
                op->has_version = 1;
                op->version = 1;
                m->opset_import[m->n_opset_import++] = op;
            }
        }
        for (int a = 0; a < g->nodes[i].nattr; a++)
            if (g->nodes[i].attrs[a].g) eng_sv_domains(sv, g->nodes[i].attrs[a].g, m, cap, depth + 1);
    }
}

static size_t eng_sv_count_nodes(const eng_graph *g, int depth) {
    size_t n = (size_t)g->nnodes;
    if (depth > ENG_ONNX_MAX_GRAPH_DEPTH) return n;
    for (int i = 0; i < g->nnodes; i++)
        for (int a = 0; a < g->nodes[i].nattr; a++)
            if (g->nodes[i].attrs[a].g) n += eng_sv_count_nodes(g->nodes[i].attrs[a].g, depth + 1);
    return n;
}

static Onnx__ModelProto *eng_sv_model(eng_saver *sv, const eng_graph *g) {
    Onnx__ModelProto *m = eng_sv_calloc(sv, 1, sizeof *m);
    if (!m) return NULL;
    onnx__model_proto__init(m);
    m->has_ir_version = 1;
    m->ir_version = g->ir_version ? g->ir_version : 8;
    if (g->producer_name) m->producer_name = eng_sv_strdup(sv, g->producer_name);
    if (g->producer_version) m->producer_version = eng_sv_strdup(sv, g->producer_version);
    size_t cap = 2 + eng_sv_count_nodes(g, 0);
    m->opset_import = eng_sv_calloc(sv, cap, sizeof *m->opset_import);
    if (!m->opset_import) return m;
    Onnx__OperatorSetIdProto *op = eng_sv_calloc(sv, 1, sizeof *op);
    if (!op) return m;
    onnx__operator_set_id_proto__init(op);
    op->domain = eng_sv_strdup(sv, "");
    op->has_version = 1;
    op->version = g->opset ? g->opset : 1;
    m->opset_import[m->n_opset_import++] = op;
    if (g->opset_ml) {
        if (!(op = eng_sv_calloc(sv, 1, sizeof *op))) return m;
        onnx__operator_set_id_proto__init(op);
        op->domain = eng_sv_strdup(sv, "ai.onnx.ml");
        op->has_version = 1;
        op->version = g->opset_ml;
        m->opset_import[m->n_opset_import++] = op;
    }
    eng_sv_domains(sv, g, m, cap, 0);
    m->graph = eng_sv_graph(sv, g, 0);
    return m;
}

eng_status eng_onnx_save_file(const eng_graph *g, const char *path, size_t external_threshold) {
    if (!g || !path) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "eng_onnx_save_file: NULL graph or path");
    eng_saver sv = {.threshold = external_threshold, .path = path};
    sv.data.fd = -1;
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    size_t pl = strlen(path), bl = strlen(base);
    sv.data_name = malloc(bl + 6);
    sv.data_path = malloc(pl + 6);
    if (!sv.data_name || !sv.data_path) {
        free(sv.data_name);
        free(sv.data_path);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    snprintf(sv.data_name, bl + 6, "%s.data", base);
    snprintf(sv.data_path, pl + 6, "%s.data", path);

    Onnx__ModelProto *m = eng_sv_model(&sv, g);
    eng_status st = sv.st;
    if (st != ENG_STATUS_OK) eng_err_prefix(st, "%s: ", path);
    uint8_t *buf = NULL;
    size_t len = 0;
    if (st == ENG_STATUS_OK) {
        len = onnx__model_proto__get_packed_size(m);
        if (len > ENG_ONNX_MAX_FILE_BYTES)
            st = eng_err(ENG_STATUS_INVALID_ARGUMENT,
                         "%s: serialized model is %zu bytes, over protobuf's 2 GiB limit (use an external_threshold)",
                         path, len);
        else if (!(buf = malloc(len ? len : 1)))
            st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes", path, len);
        else
            onnx__model_proto__pack(m, buf);
    }
    for (size_t i = 0; i < sv.nborrowed; i++) {
        sv.borrowed[i]->raw_data.data = NULL;
        sv.borrowed[i]->raw_data.len = 0;
        sv.borrowed[i]->has_raw_data = 0;
    }
    free(sv.borrowed);
    if (m) onnx__model_proto__free_unpacked(m, NULL);
    if (sv.data_open) {
        if (st == ENG_STATUS_OK) st = eng_atomic_commit(&sv.data);
        else eng_atomic_abort(&sv.data);
    }
    if (st == ENG_STATUS_OK) {
        eng_atomic_file f;
        st = eng_atomic_open(&f, path);
        if (st == ENG_STATUS_OK) {
            st = eng_atomic_write(&f, buf, len);
            if (st == ENG_STATUS_OK) st = eng_atomic_commit(&f);
            else eng_atomic_abort(&f);
        }
    }
    free(buf);
    free(sv.data_name);
    free(sv.data_path);
    return st;
}
