/* session.c - model + plan cache + input validation (see session.h). */
#include "session.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuse.h"
#include "../ops/op.h"
#include "../ir/onnx.h"
#include "../ir/seq.h"

static eng_status check_nodes(const eng_graph *g, int64_t opset);

typedef struct sess_plan {
    eng_tensor *shapes; /* g->ninputs entries, data NULL */
    eng_plan *plan;
    uint64_t last_used;
    eng_precision precision; /* with the shapes and the backend, the plan's key */
    const krn_backend *backend;
} sess_plan;

struct eng_session {
    eng_graph *g;
    eng_session_opts opts;
    pthread_mutex_t mu;
    sess_plan *plans;
    int nplans;
    uint64_t tick;
    eng_plan *last;
    eng_tensor *feed; /* g->ninputs */
    eng_plan_cache *subplans; /* chunk plans shared by this session's batch-parallel plans */
    eng_dev_consts *dev_consts; /* device sessions: the weights, once per device for all its plans */
    size_t plan_dev_bytes;      /* device memory of the cached plans, kept as they come and go (under mu) */
};

static size_t plan_dev_bytes(const eng_plan *p) {
    eng_plan_stats st;
    eng_plan_get_stats(p, &st);
    return st.device_bytes;
}

eng_status eng_session_new_file(const char *path, const eng_session_opts *opts, eng_session **out) {
    *out = NULL;
    char buf[4096];
    struct stat sb;
    if (stat(path, &sb) != 0) return eng_err(ENG_STATUS_NOT_FOUND, "model '%s' not found", path);
    if (S_ISDIR(sb.st_mode)) {
        if (snprintf(buf, sizeof buf, "%s/model.onnx", path) >= (int)sizeof buf)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "model path too long");
        path = buf;
    }
    eng_graph *g = NULL;
    ENG_TRY(eng_onnx_load_file(path, &g));
    return eng_session_new_graph(g, opts, out);
}

eng_status eng_session_new_graph(eng_graph *g, const eng_session_opts *opts, eng_session **out) {
    *out = NULL;
    eng_session *s = calloc(1, sizeof *s);
    if (!s) {
        eng_graph_free(&g);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    s->g = g;
    if (opts) s->opts = *opts;
    if (s->opts.max_plans <= 0) s->opts.max_plans = 16;
    pthread_mutex_init(&s->mu, NULL);
    s->plans = calloc((size_t)s->opts.max_plans, sizeof *s->plans);
    s->feed = calloc((size_t)g->ninputs + 1, sizeof *s->feed);
    s->subplans = eng_plan_cache_new();
    if (s->opts.backend && !krn_backend_is_host(s->opts.backend) &&
        !(s->dev_consts = eng_dev_consts_new(s->opts.backend, s->opts.device))) {
        eng_session_free(&s);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    if (!s->plans || !s->feed || !s->subplans) {
        eng_session_free(&s);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    /* refuse unknown ops and malformed subgraphs at load time, not at the first request */
    eng_status cst = check_nodes(g, g->opset);
    if (cst != ENG_STATUS_OK) {
        eng_session_free(&s);
        return cst;
    }
    if (!s->opts.no_fuse) {
        eng_status st = eng_graph_fuse_for(g, krn_backend_is_host(s->opts.backend));
        if (st != ENG_STATUS_OK) {
            eng_session_free(&s);
            return st;
        }
    }
    eng_status pst = eng_plan_precision_check(g, s->opts.backend, s->opts.precision);
    if (pst != ENG_STATUS_OK) {
        eng_session_free(&s);
        return pst;
    }
    *out = s;
    return ENG_STATUS_OK;
}

const eng_graph *eng_session_graph(const eng_session *s) { return s->g; }

static eng_status input_list(const eng_graph *g, char *buf, size_t n) {
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < g->ninputs && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s'%s'", i ? ", " : "", g->values[g->inputs[i]].name);
    return ENG_STATUS_OK;
}

/* Every node's op is known, in subgraphs too, and control-flow nodes fit their subgraphs (eng_ctrl_check_node). */
static eng_status check_nodes(const eng_graph *g, int64_t opset) {
    for (int i = 0; i < g->nnodes; i++) {
        const eng_node *n = &g->nodes[i];
        if (!eng_op_find(n->domain, n->op_type))
            return eng_err(ENG_STATUS_UNSUPPORTED, "node '%s': op '%s'%s%s%s is not supported", n->name, n->op_type,
                           n->domain[0] ? " of domain '" : "", n->domain, n->domain[0] ? "'" : "");
        ENG_TRY(eng_ctrl_check_node(opset, n));
        for (int a = 0; a < n->nattr; a++) {
            if (n->attrs[a].type != ENG_ATTR_GRAPH || !n->attrs[a].g) continue;
            eng_status st = check_nodes(n->attrs[a].g, opset);
            if (st != ENG_STATUS_OK)
                return eng_err_prefix(st, "node '%s' (%s): subgraph '%s': ", n->name, n->op_type, n->attrs[a].name);
        }
    }
    return ENG_STATUS_OK;
}

static eng_status validate(const eng_graph *g, int idx, const eng_tensor *t) {
    const eng_value *v = &g->values[g->inputs[idx]];
    char a[200], b[200];
    if (v->dtype != ENG_DTYPE_UNDEFINED && t->dtype != v->dtype)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input '%s': expected dtype %s, got %s", v->name,
                       eng_dtype_name(v->dtype), eng_dtype_name(t->dtype));
    if (t->dtype == ENG_DTYPE_SEQUENCE) {
        if (!eng_seq_get(t)) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input '%s': not a sequence value", v->name);
        return ENG_STATUS_OK;
    }
    if (eng_dtype_size(t->dtype) == 0)
        return eng_err(ENG_STATUS_UNSUPPORTED, "input '%s': dtype %s is not supported", v->name,
                       eng_dtype_name(t->dtype));
    size_t nb;
    ENG_TRY(eng_tensor_nbytes_checked(t, v->name, &nb));
    if (v->ndim >= 0) {
        int bad = t->ndim != v->ndim;
        for (int d = 0; !bad && d < v->ndim; d++)
            if (v->dims[d] >= 0 && v->dims[d] != t->dims[d]) bad = 1;
        if (bad) {
            size_t k = 0;
            k += (size_t)snprintf(a + k, sizeof a - k, "[");
            for (int d = 0; d < v->ndim && k < sizeof a; d++) {
                if (v->dims[d] >= 0) k += (size_t)snprintf(a + k, sizeof a - k, "%s%lld", d ? "," : "", (long long)v->dims[d]);
                else k += (size_t)snprintf(a + k, sizeof a - k, "%s%s", d ? "," : "", v->dim_param[d] ? v->dim_param[d] : "?");
            }
            if (k < sizeof a) snprintf(a + k, sizeof a - k, "]");
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input '%s': expected shape %s, got %s", v->name, a,
                           eng_shape_str(t->dims, t->ndim, b, sizeof b));
        }
    }
    return ENG_STATUS_OK;
}

static eng_status find_plan(eng_session *s, eng_precision prec, eng_plan **out) {
    const eng_graph *g = s->g;
    for (int i = 0; i < s->nplans; i++)
        if (s->plans[i].precision == prec && s->plans[i].backend == s->opts.backend &&
            eng_shapes_equal_n(s->plans[i].shapes, s->feed, g->ninputs)) {
            s->plans[i].last_used = ++s->tick;
            *out = s->plans[i].plan;
            return ENG_STATUS_OK;
        }
    eng_plan_opts po = {.nthreads = s->opts.nthreads, .precision = prec, .backend = s->opts.backend, .device = s->opts.device,
                        .subplans = s->subplans, .dev_consts = s->dev_consts,
                        .dev_inputs = s->opts.dev_inputs, .dev_outputs = s->opts.dev_outputs, .fp32_nodes = s->opts.fp32_nodes, .nfp32_nodes = s->opts.nfp32_nodes,
                        .on_ready = s->opts.on_ready, .ready_arg = s->opts.ready_arg};
    eng_plan *p = NULL;
    ENG_TRY(eng_plan_new(g, &po, s->feed, &p));
    eng_tensor *shapes = calloc((size_t)g->ninputs + 1, sizeof *shapes);
    if (!shapes) {
        eng_plan_free(&p);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    for (int i = 0; i < g->ninputs; i++) {
        shapes[i] = s->feed[i];
        shapes[i].data = NULL;
    }
    int slot = s->nplans;
    if (slot == s->opts.max_plans) { /* evict least recently used */
        slot = 0;
        for (int i = 1; i < s->nplans; i++)
            if (s->plans[i].last_used < s->plans[slot].last_used) slot = i;
        if (s->last == s->plans[slot].plan) s->last = NULL;
        s->plan_dev_bytes -= plan_dev_bytes(s->plans[slot].plan);
        eng_plan_free(&s->plans[slot].plan);
        free(s->plans[slot].shapes);
    } else {
        s->nplans++;
    }
    s->plans[slot] = (sess_plan){shapes, p, ++s->tick, prec, s->opts.backend};
    s->plan_dev_bytes += plan_dev_bytes(p);
    *out = p;
    return ENG_STATUS_OK;
}

eng_status eng_session_run(eng_session *s, int nin, const char *const *names, const eng_tensor *inputs,
                           eng_tensor *outputs) {
    return eng_session_run_at(s, s->opts.precision, nin, names, inputs, outputs);
}

eng_status eng_session_run_at(eng_session *s, eng_precision prec, int nin, const char *const *names,
                              const eng_tensor *inputs, eng_tensor *outputs) {
    const eng_graph *g = s->g;
    char list[1024];
    pthread_mutex_lock(&s->mu);
    eng_status st = ENG_STATUS_OK;
    memset(s->feed, 0, (size_t)g->ninputs * sizeof *s->feed);
    for (int k = 0; k < nin && st == ENG_STATUS_OK; k++) {
        int idx = -1;
        for (int i = 0; i < g->ninputs; i++)
            if (strcmp(g->values[g->inputs[i]].name, names[k]) == 0) idx = i;
        if (idx < 0) {
            input_list(g, list, sizeof list);
            st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "unknown input '%s'; the model's inputs are: %s", names[k], list);
        } else if (s->feed[idx].dtype != ENG_DTYPE_UNDEFINED) {
            st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "input '%s' given twice", names[k]);
        } else if ((st = validate(g, idx, &inputs[k])) == ENG_STATUS_OK) {
            s->feed[idx] = inputs[k];
        }
    }
    for (int i = 0; i < g->ninputs && st == ENG_STATUS_OK; i++)
        if (s->feed[i].dtype == ENG_DTYPE_UNDEFINED && !g->values[g->inputs[i]].init)
            st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "missing input '%s'", g->values[g->inputs[i]].name);
    eng_plan *p = NULL;
    if (st == ENG_STATUS_OK) st = find_plan(s, prec, &p);
    if (st == ENG_STATUS_OK) {
        s->last = p;
        st = eng_plan_run(p, s->feed, outputs);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

size_t eng_session_device_bytes(eng_session *s) {
    pthread_mutex_lock(&s->mu); /* the shared weights grow while a plan is made */
    size_t n = eng_dev_consts_bytes(s->dev_consts) + s->plan_dev_bytes;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void eng_session_last_stats(const eng_session *s, eng_plan_stats *st) {
    if (s->last) eng_plan_get_stats(s->last, st);
    else memset(st, 0, sizeof *st);
}

void eng_session_free(eng_session **sp) {
    if (!sp || !*sp) return;
    eng_session *s = *sp;
    for (int i = 0; i < s->nplans; i++) {
        eng_plan_free(&s->plans[i].plan);
        free(s->plans[i].shapes);
    }
    free(s->plans);
    eng_plan_cache_free(&s->subplans);
    eng_dev_consts_free(&s->dev_consts);
    free(s->feed);
    eng_graph_free(&s->g);
    pthread_mutex_destroy(&s->mu);
    free(s);
    *sp = NULL;
}
