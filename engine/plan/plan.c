/* plan.c - planner and executor (see plan.h).
 *
 * Invariants:
 *  - vals[v] describes value v for this plan: dtype/shape are final for static plans; data points to graph
 *    memory (initializers), plan-owned constant buffers (folded nodes), the arena, or the caller's input.
 *  - Each value has a storage root: itself, or for outputs of ALIAS ops (Reshape, Squeeze...) the root of
 *    the aliased input. Only roots of kind ARENA own arena space; the lifetime of a root spans from the step
 *    that defines it to the last step that reads any value sharing it (graph outputs live to the end).
 *  - Steps hold everything a kernel needs; kernel init ran once at plan time (static plans).
 */
#include "plan.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../kernels/krn-nn.h"
#include "../ir/seq.h"
#include "../ops/op.h"
#include "plan-impl.h"

double plan_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static const krn_backend *plan_backend(const eng_plan *p) {
    return p->opts.backend ? p->opts.backend : krn_backend_cpu();
}

static eng_status plan_own(eng_plan *p, void *buf) {
    if (p->nowned == p->capowned) {
        int nc = p->capowned ? p->capowned * 2 : 16;
        void **o = realloc(p->owned, (size_t)nc * sizeof *o);
        if (!o) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
        p->owned = o;
        p->capowned = nc;
    }
    p->owned[p->nowned++] = buf;
    return ENG_STATUS_OK;
}

const char *plan_node_label(const eng_graph *g, const eng_node *n, char *buf, size_t len) {
    const char *dom = n->domain[0] ? n->domain : "", *dot = n->domain[0] ? "." : "";
    if (n->name && n->name[0]) snprintf(buf, len, "node '%s' (%s%s%s): ", n->name, dom, dot, n->op_type);
    else if (n->nout > 0 && n->outputs[0] >= 0) /* ONNX allows unnamed nodes: name its first output instead */
        snprintf(buf, len, "node (%s%s%s) writing '%s': ", dom, dot, n->op_type, g->values[n->outputs[0]].name);
    else snprintf(buf, len, "node #%d (%s%s%s): ", (int)(n - g->nodes), dom, dot, n->op_type);
    return buf;
}

/* in/out: node n's inputs and outputs as the plan holds them now (dtype, shape, data); omitted ones zeroed. */
void plan_node_tensors(const eng_plan *p, const eng_node *n, eng_tensor *in, eng_tensor *out) {
    for (int i = 0; i < n->nin; i++) {
        int v = n->inputs[i];
        if (v < 0 || p->kind[v] == VAL_NONE) memset(&in[i], 0, sizeof in[i]);
        else in[i] = p->vals[v];
    }
    for (int i = 0; i < n->nout; i++) {
        if (n->outputs[i] >= 0) out[i] = p->vals[n->outputs[i]];
        else memset(&out[i], 0, sizeof out[i]);
    }
}

void plan_step_call(const eng_plan *p, const plan_step *s, eng_tensor *in, eng_tensor *out, krn_call *c) {
    const eng_node *n = &p->g->nodes[s->node];
    plan_node_tensors(p, n, in, out);
    for (int i = 0; p->loc && i < n->nin; i++) /* a device plan: each input as the step's side holds it */
        if (n->inputs[i] >= 0 && in[i].dtype != ENG_DTYPE_UNDEFINED) in[i].data = plan_place_data(p, s, n->inputs[i]);
    *c = (krn_call){.params = s->params, .in = in, .nin = n->nin, .out = out, .nout = n->nout, .state = s->state,
                    .nthreads = p->nthreads, .const_mask = s->const_mask, .compute = s->compute,
                    .ctx = s->on_dev ? p->ctx : NULL};
}

/* Build an op context's tensors for node n from vals. */
static void ctx_fill(const eng_plan *p, const eng_node *n, eng_tensor *in, eng_tensor *out) {
    for (int i = 0; i < n->nin; i++) {
        int v = n->inputs[i];
        if (v < 0 || p->kind[v] == VAL_NONE) memset(&in[i], 0, sizeof in[i]);
        else in[i] = p->vals[v];
    }
    for (int i = 0; i < n->nout; i++) memset(&out[i], 0, sizeof out[i]);
}

static eng_status check_outputs(const eng_node *n, const eng_tensor *out, int nout) {
    for (int i = 0; i < nout; i++) {
        if (n->outputs[i] < 0) continue;
        size_t nb;
        if (out[i].dtype == ENG_DTYPE_UNDEFINED)
            return eng_err(ENG_STATUS_INTERNAL, "shape inference left output %d without a dtype", i);
        ENG_TRY(eng_tensor_nbytes_checked(&out[i], "output", &nb));
    }
    return ENG_STATUS_OK;
}

static void free_params(const eng_op_def *d, void *params) {
    if (!params) return;
    if (d && d->free_params) d->free_params(params);
    else free(params);
}

/* Record what step s's kernel chose (c: its call after init) and say so on stderr, once per plan step, if it is
 * a slow path: a reference implementation where a fast one should exist. */
static void step_describe(const eng_graph *g, plan_step *s, const krn_call *c) {
    if (!s || s->impl || !s->kernel || !s->kernel->describe) return;
    s->impl = calloc(1, sizeof *s->impl);
    if (!s->impl) return;
    s->kernel->describe(c, s->impl);
    if (!s->impl->slow) return;
    const eng_node *n = &g->nodes[s->node];
    char ib[160], ob[160];
    fprintf(stderr, "tensord: slow path: node '%s' (%s) in %s out %s runs %s\n", n->name, n->op_type,
            c->nin ? eng_shape_str(c->in[0].dims, c->in[0].ndim, ib, sizeof ib) : "-",
            c->nout ? eng_shape_str(c->out[0].dims, c->out[0].ndim, ob, sizeof ob) : "-", s->impl->impl);
}

/* Run one kernel start to finish (init, exec, free) on prepared tensors: used for folding and dynamic runs
 * (there s, the step, gets its implementation recorded on the first run; NULL when folding). */
static eng_status run_kernel_once(const eng_graph *g, plan_step *s, const krn_kernel *k, const void *params,
                                  const eng_tensor *in, int nin, eng_tensor *out, int nout, int nthreads,
                                  unsigned const_mask) {
    krn_call c = {.params = params, .in = in, .nin = nin, .out = out, .nout = nout, .nthreads = nthreads,
                  .const_mask = const_mask};
    eng_status st = ENG_STATUS_OK;
    if (k->init) st = k->init(&c);
    if (st == ENG_STATUS_OK) step_describe(g, s, &c);
    if (st == ENG_STATUS_OK) st = k->exec(&c);
    if (k->free_state && c.state) k->free_state(c.state);
    return st;
}

static int node_is_foldable(const eng_plan *p, const eng_node *n, const eng_op_def *d) {
    if (d->flags & ENG_OP_RANDOM) return 0;
    if (d->flags & ENG_OP_SHAPE_ONLY) return 1;
    for (int i = 0; i < n->nin; i++) {
        int v = n->inputs[i];
        if (v >= 0 && p->kind[v] != VAL_CONST && p->kind[v] != VAL_NONE) return 0;
    }
    return 1;
}

static int same_dtype_shape(const eng_tensor *a, const eng_tensor *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim) return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->dims[d] != b->dims[d]) return 0;
    return 1;
}

/* Fold node n: compute its outputs now into plan-owned buffers. */
static eng_status fold_node(eng_plan *p, plan_step *s, const eng_node *n, eng_tensor *in, eng_tensor *out) {
    for (int i = 0; i < n->nout; i++) {
        if (n->outputs[i] < 0) continue;
        size_t nb = eng_tensor_nbytes(&out[i]);
        out[i].data = eng_alloc(nb ? nb : 1);
        if (!out[i].data || plan_own(p, out[i].data) != ENG_STATUS_OK) {
            eng_free(out[i].data);
            return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory folding output %d (%zu bytes)", i, nb);
        }
    }
    if (s->def->flags & ENG_OP_ALIAS) {
        memcpy(out[0].data, in[0].data, eng_tensor_nbytes(&out[0]));
    } else {
        ENG_TRY(run_kernel_once(p->g, NULL, s->kernel, s->params, in, n->nin, out, n->nout, 1, ~0u));
    }
    for (int i = 0; i < n->nout; i++) {
        int v = n->outputs[i];
        if (v < 0) continue;
        p->vals[v] = out[i];
        p->kind[v] = VAL_CONST;
        p->root[v] = v;
    }
    return ENG_STATUS_OK;
}

/* ---- static memory planning ---- */

static int buf_cmp(const void *a, const void *b) {
    const plan_buf *x = a, *y = b;
    if (x->size != y->size) return x->size < y->size ? 1 : -1;
    return x->first - y->first;
}

/* Bytes value v (shaped t) occupies: its logical size, or, when its producer writes the zero-padded blocked layout
 * (engine/plan/fuse.c's layout pass, KRN_NN_LAYOUT_BLOCKED16_PADDED), N * ceil16(C) * H * W floats. */
static size_t plan_value_bytes(const eng_graph *g, int v, const eng_tensor *t) {
    int pr = g->values[v].producer;
    if (pr >= 0 && t->ndim == 4 && (t->dtype == ENG_DTYPE_F32 || t->dtype == ENG_DTYPE_BF16) &&
        eng_node_attr_int(&g->nodes[pr], "y_layout", 0) == KRN_NN_LAYOUT_BLOCKED16_PADDED)
        return (size_t)krn_nn_padded_numel(t->dims) * eng_dtype_size(t->dtype);
    return eng_tensor_nbytes(t);
}

/* Arena bytes of value v, rounded up to 64. */
size_t plan_value_size(const eng_plan *p, int v) {
    size_t sz = (plan_value_bytes(p->g, v, &p->vals[v]) + 63) & ~(size_t)63;
    return sz ? sz : 64;
}

void plan_lifetimes(const eng_plan *p, int *first, int *last) {
    const eng_graph *g = p->g;
    for (int v = 0; v < g->nvalues; v++) first[v] = last[v] = -1;
    for (int si = 0; si < p->nsteps; si++) {
        const eng_node *n = &g->nodes[p->steps[si].node];
        for (int i = 0; i < n->nout; i++)
            if (n->outputs[i] >= 0) {
                int r = p->root[n->outputs[i]];
                if (first[r] < 0) first[r] = si;
                if (last[r] < si) last[r] = si;
            }
        for (int i = 0; i < n->nin; i++)
            if (n->inputs[i] >= 0) {
                int r = p->root[n->inputs[i]];
                if (last[r] < si) last[r] = si;
            }
    }
    for (int i = 0; i < g->noutputs; i++) last[p->root[g->outputs[i]]] = p->nsteps;
}

/* Greedy by size: lowest offset that does not collide with a placed buffer whose lifetime overlaps. */
size_t plan_pack(plan_buf *bufs, int nb) {
    qsort(bufs, (size_t)nb, sizeof *bufs, buf_cmp);
    size_t total = 0;
    for (int i = 0; i < nb; i++) {
        size_t off = 0;
        int moved = 1;
        while (moved) {
            moved = 0;
            for (int j = 0; j < i; j++) {
                if (bufs[j].last < bufs[i].first || bufs[i].last < bufs[j].first) continue;
                if (off < bufs[j].off + bufs[j].size && bufs[j].off < off + bufs[i].size) {
                    off = bufs[j].off + bufs[j].size;
                    moved = 1;
                }
            }
        }
        bufs[i].off = off;
        if (off + bufs[i].size > total) total = off + bufs[i].size;
    }
    return total;
}

/* Lay out the host arena (every ARENA root of a host plan; a device plan's roots that live on the CPU); allocate it
 * and point values into it when `alloc`. */
static eng_status plan_layout(eng_plan *p, int alloc) {
    const eng_graph *g = p->g;
    int nv = g->nvalues;
    int *first = malloc((size_t)nv * sizeof(int) + 1), *last = malloc((size_t)nv * sizeof(int) + 1);
    plan_buf *bufs = calloc((size_t)nv + 1, sizeof *bufs);
    if (!first || !last || !bufs) {
        free(first); free(last); free(bufs);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory planning buffers");
    }
    plan_lifetimes(p, first, last);
    int nb = 0;
    size_t naive = 0;
    for (int v = 0; v < nv; v++) {
        if (p->kind[v] != VAL_ARENA || p->root[v] != v || (p->loc && p->loc[v])) continue;
        int ext = 0;
        for (int i = 0; p->ext_root && i < g->noutputs; i++) ext |= p->ext_root[i] == v;
        if (ext) continue; /* the caller's memory */
        size_t sz = plan_value_size(p, v);
        bufs[nb++] = (plan_buf){v, sz, 0, first[v] < 0 ? 0 : first[v], last[v] < 0 ? p->nsteps : last[v]};
        naive += sz;
    }
    size_t total = plan_pack(bufs, nb);
    eng_status st = ENG_STATUS_OK;
    p->arena_bytes = total;
    p->naive_bytes = naive;
    if (!alloc) {
        free(first); free(last); free(bufs);
        return st;
    }
    if (total > 0) {
        p->arena = eng_alloc(total);
        if (!p->arena) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "cannot allocate %zu bytes of activations", total);
    }
    if (st == ENG_STATUS_OK) {
        for (int i = 0; i < nb; i++) p->vals[bufs[i].root].data = (char *)p->arena + bufs[i].off;
        for (int v = 0; v < nv; v++)
            if (p->kind[v] == VAL_ALIAS && p->kind[p->root[v]] != VAL_INPUT && !(p->loc && p->loc[p->root[v]]))
                p->vals[v].data = p->vals[p->root[v]].data;
    }
    free(first); free(last); free(bufs);
    return st;
}

static eng_status plan_memory(eng_plan *p) { return plan_layout(p, 1); }

eng_status plan_arena_need(eng_plan *p, size_t *bytes) {
    ENG_TRY(plan_layout(p, 0));
    *bytes = p->arena_bytes;
    return ENG_STATUS_OK;
}

static eng_status init_steps(eng_plan *p) {
    const eng_graph *g = p->g;
    if (p->ctx) ENG_TRY(krn_ctx_enter(p->dev, p->ctx));
    eng_tensor in[ENG_OP_MAX_IO], out[ENG_OP_MAX_IO];
    char lb[300];
    for (int si = 0; si < p->nsteps; si++) {
        plan_step *s = &p->steps[si];
        if (!s->kernel || !s->kernel->init) continue;
        const eng_node *n = &g->nodes[s->node];
        krn_call c;
        plan_step_call(p, s, in, out, &c);
        eng_status st = s->kernel->init(&c);
        if (st != ENG_STATUS_OK) {
            if (s->on_dev) p->init_failed_node = s->node;
            return eng_err_prefix(st, "%s", plan_node_label(g, n, lb, sizeof lb));
        }
        s->state = c.state;
        s->inited = 1;
        step_describe(g, s, &c);
    }
    return ENG_STATUS_OK;
}

/* opts.ext_outputs: the roots each graph output can be written to directly (a step's output, shared with no other
 * graph output). */
static eng_status plan_ext_outputs(eng_plan *p) {
    const eng_graph *g = p->g;
    if (!(p->ext_root = malloc(((size_t)g->noutputs + 1) * sizeof(int))))
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; i < g->noutputs; i++) {
        int r = p->root[g->outputs[i]];
        /* a padded blocked layout is not the caller's dense bytes: that output is copied */
        p->ext_root[i] = p->kind[r] == VAL_ARENA && plan_value_bytes(g, r, &p->vals[r]) == eng_tensor_nbytes(&p->vals[r])
                             ? r : -1;
        for (int j = 0; j < i; j++)
            if (p->root[g->outputs[j]] == r) p->ext_root[i] = p->ext_root[j] = -1;
    }
    return ENG_STATUS_OK;
}

/* One attempt at a plan; `cpu_only` (may be NULL): nodes a device plan must run on the CPU (their device kernel's
 * init failed in an earlier attempt). On a device kernel's init failure *failed_node is that node. */
static eng_status plan_new_once(const eng_graph *g, const eng_plan_opts *opts, const eng_tensor *inputs,
                                const unsigned char *cpu_only, int *failed_node, eng_plan **out) {
    *out = NULL;
    eng_plan *p = calloc(1, sizeof *p);
    if (!p) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    p->g = g;
    p->cpu_only = cpu_only;
    p->init_failed_node = -1;
    if (opts) p->opts = *opts;
    p->nthreads = p->opts.nthreads > 0 ? p->opts.nthreads : omp_get_num_procs();
    if (p->opts.backend && !krn_backend_is_host(p->opts.backend)) {
        p->dev = p->opts.backend;
        p->device = p->opts.device;
    }
    eng_status pst = eng_plan_precision_check(g, plan_backend(p), p->opts.precision);
    if (pst != ENG_STATUS_OK) {
        eng_plan_free(&p);
        return pst;
    }
    int nv = g->nvalues, nn = g->nnodes;
    p->vals = calloc((size_t)nv + 1, sizeof *p->vals);
    p->kind = calloc((size_t)nv + 1, sizeof *p->kind);
    p->root = calloc((size_t)nv + 1, sizeof *p->root);
    p->steps = calloc((size_t)nn + 1, sizeof *p->steps);
    int *order = malloc(((size_t)nn + 1) * sizeof *order);
    if (!p->vals || !p->kind || !p->root || !p->steps || !order) {
        free(order);
        eng_plan_free(&p);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    eng_status st = ENG_STATUS_OK;
    for (int v = 0; v < nv; v++) {
        p->root[v] = v;
        if (g->values[v].init) {
            p->vals[v] = *g->values[v].init;
            p->kind[v] = VAL_CONST;
        }
    }
    for (int i = 0; i < g->ninputs; i++) {
        int v = g->inputs[i];
        if (inputs[i].dtype == ENG_DTYPE_UNDEFINED) {
            if (!g->values[v].init) {
                st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "missing input '%s'", g->values[v].name);
                goto fail;
            }
            continue;
        }
        p->vals[v] = inputs[i];
        p->vals[v].data = NULL;
        p->kind[v] = VAL_INPUT;
        if (inputs[i].dtype == ENG_DTYPE_SEQUENCE) p->dynamic = 1; /* what sequence ops make is known when they run */
    }
    st = eng_graph_topo_order(g, order);
    if (st != ENG_STATUS_OK) goto fail;
    if (p->opts.any_shape) p->dynamic = 1;

    eng_tensor in[ENG_OP_MAX_IO], outs[ENG_OP_MAX_IO];
    char lb[300];
    for (int oi = 0; oi < nn; oi++) {
        const eng_node *n = &g->nodes[order[oi]];
        if (n->nin > ENG_OP_MAX_IO || n->nout > ENG_OP_MAX_IO) {
            st = eng_err(ENG_STATUS_UNSUPPORTED, "%s%d inputs / %d outputs exceed the limit of %d",
                         plan_node_label(g, n, lb, sizeof lb), n->nin, n->nout, ENG_OP_MAX_IO);
            goto fail;
        }
        const eng_op_def *d = eng_op_find(n->domain, n->op_type);
        if (!d) {
            st = eng_err(ENG_STATUS_UNSUPPORTED, "%sop '%s'%s%s%s is not supported", plan_node_label(g, n, lb, sizeof lb),
                         n->op_type, n->domain[0] ? " of domain '" : "", n->domain, n->domain[0] ? "'" : "");
            goto fail;
        }
        plan_step *s = &p->steps[p->nsteps];
        memset(s, 0, sizeof *s);
        s->node = order[oi];
        s->def = d;
        if (d->engine_kernel) {
            s->kernel = d->engine_kernel; /* runs on the CPU, subgraphs and all (a device plan places it there) */
        } else if (d->kernel && !(d->flags & ENG_OP_ALIAS)) {
            /* a device plan keeps the CPU kernel too: for folding, and as the fallback (plan-place.c) */
            s->kernel = krn_backend_find(p->dev ? krn_backend_cpu() : plan_backend(p), d->kernel);
            if (p->dev) s->dev_kernel = krn_backend_find(p->dev, d->kernel);
            if (!s->kernel) {
                st = eng_err(ENG_STATUS_UNSUPPORTED, "%sbackend '%s' has no kernel '%s'", plan_node_label(g, n, lb, sizeof lb),
                             krn_backend_name(plan_backend(p)), d->kernel);
                goto fail;
            }
        } else if (!(d->flags & ENG_OP_ALIAS)) {
            st = eng_err(ENG_STATUS_INTERNAL, "%sop definition has no kernel", plan_node_label(g, n, lb, sizeof lb));
            goto fail;
        }
        ctx_fill(p, n, in, outs);
        eng_op_ctx c = {.graph = g, .node = n, .opset = g->opset, .in = in, .nin = n->nin, .out = outs, .nout = n->nout,
                        .nthreads = p->nthreads};
        if (d->prepare) {
            st = d->prepare(&c);
            s->params = c.params;
            if (st != ENG_STATUS_OK) {
                eng_err_prefix(st, "%s", plan_node_label(g, n, lb, sizeof lb));
                free_params(d, s->params);
                s->params = NULL;
                goto fail;
            }
        }
        p->nsteps++;
        if (p->dynamic) {
            for (int i = 0; i < n->nout; i++)
                if (n->outputs[i] >= 0) p->kind[n->outputs[i]] = VAL_DYN;
            continue;
        }
        st = d->infer(&c);
        if (st == ENG_STATUS_NEEDS_DATA) {
            p->dynamic = 1;
            st = ENG_STATUS_OK;
            for (int i = 0; i < n->nout; i++)
                if (n->outputs[i] >= 0) p->kind[n->outputs[i]] = VAL_DYN;
            continue;
        }
        if (st == ENG_STATUS_OK) st = check_outputs(n, outs, n->nout);
        if (st != ENG_STATUS_OK) {
            eng_err_prefix(st, "%s", plan_node_label(g, n, lb, sizeof lb));
            goto fail;
        }
        if (node_is_foldable(p, n, d)) {
            st = fold_node(p, s, n, in, outs);
            if (st != ENG_STATUS_OK) {
                eng_err_prefix(st, "%s", plan_node_label(g, n, lb, sizeof lb));
                goto fail;
            }
            free_params(d, s->params);
            s->params = NULL;
            p->nsteps--;
            p->nfolded++;
            continue;
        }
        for (int i = 0; i < n->nin; i++)
            if (n->inputs[i] >= 0 && p->kind[n->inputs[i]] == VAL_CONST) s->const_mask |= 1u << (i & 31);
        int alias = (d->flags & ENG_OP_ALIAS) != 0;
        if ((d->flags & ENG_OP_ALIAS_SAME) && same_dtype_shape(&in[0], &outs[0])) {
            alias = 1; /* the kernel would copy: read input 0's bytes instead */
            free_params(d, s->params);
            s->params = NULL;
            s->kernel = NULL;
        }
        for (int i = 0; i < n->nout; i++) {
            int v = n->outputs[i];
            if (v < 0) continue;
            p->vals[v] = outs[i];
            p->vals[v].data = NULL;
            if (alias && i == 0) {
                p->kind[v] = VAL_ALIAS;
                p->root[v] = p->root[n->inputs[0]];
            } else {
                p->kind[v] = VAL_ARENA;
            }
        }
    }
    for (int i = 0; i < g->noutputs; i++) {
        int v = g->outputs[i];
        if (p->kind[v] == VAL_NONE) {
            st = eng_err(ENG_STATUS_INVALID_MODEL, "graph output '%s' is not produced by any node or input",
                         g->values[v].name);
            goto fail;
        }
    }
    if (plan_resident_io(p) && (!p->dev || p->dynamic)) {
        st = eng_err(ENG_STATUS_UNSUPPORTED, "device-resident inputs or outputs need a plan on a device backend with "
                     "shapes fixed at plan time (%s)", p->dev ? "this plan's shapes depend on runtime values" : "none given");
        goto fail;
    }
    if (p->dev && !p->dynamic) { /* a dynamic plan is placed step by step when it runs (plan-dyn.c) */
        st = plan_place(p);
        if (st == ENG_STATUS_OK && p->dev_steps) st = krn_ctx_new(p->dev, p->device, &p->ctx);
        if (st != ENG_STATUS_OK) goto fail;
    }
    st = plan_precision(p);
    if (st != ENG_STATUS_OK) goto fail;
    if (!p->dynamic) {
        const char *prof = getenv("TENSORD_PROFILE");
        if (prof && *prof && *prof != '0') p->prof_ms = calloc((size_t)p->nsteps + 1, sizeof *p->prof_ms);
        if (!p->dev_steps && !p->opts.ext_outputs) plan_split_try(p, inputs);
        if (p->opts.ext_outputs && !p->dev_steps && (st = plan_ext_outputs(p)) != ENG_STATUS_OK) goto fail;
        if (!p->split) {
            st = plan_memory(p);
            if (st == ENG_STATUS_OK && p->dev_steps) st = plan_place_memory(p);
            if (st == ENG_STATUS_OK) st = init_steps(p);
            if (st != ENG_STATUS_OK) goto fail;
        }
    } else {
        p->uses = calloc((size_t)nv + 1, sizeof *p->uses);
        p->nreaders = calloc((size_t)nv + 1, sizeof *p->nreaders);
        p->dyn_bufs = calloc((size_t)nv + 1, sizeof *p->dyn_bufs);
        if (!p->uses || !p->nreaders || !p->dyn_bufs) {
            st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
            goto fail;
        }
        for (int si = 0; si < p->nsteps; si++) {
            const eng_node *n = &g->nodes[p->steps[si].node];
            for (int i = 0; i < n->nin; i++)
                if (n->inputs[i] >= 0) p->nreaders[n->inputs[i]]++;
        }
        for (int i = 0; i < g->noutputs; i++) p->nreaders[g->outputs[i]] += 1 << 20; /* never freed in-run */
        if (p->dev && (st = plan_dyn_setup(p)) != ENG_STATUS_OK) goto fail;
    }
    if (!p->dynamic) plan_graph_setup(p);
    free(order);
    *out = p;
    return ENG_STATUS_OK;
fail:
    free(order);
    if (p) *failed_node = p->init_failed_node;
    eng_plan_free(&p);
    return st;
}

/* A device kernel that accepted a call in supports() can still fail its init (no cuBLASLt algorithm, no cuDNN
 * algorithm within the workspace, a descriptor it cannot make): that node then runs on the CPU, said once, and the
 * plan is made again without it on the device. */
eng_status eng_plan_new(const eng_graph *g, const eng_plan_opts *opts, const eng_tensor *inputs, eng_plan **out) {
    unsigned char *cpu_only = NULL;
    eng_status st;
    for (;;) {
        int failed = -1;
        st = plan_new_once(g, opts, inputs, cpu_only, &failed, out);
        if (st == ENG_STATUS_OK || failed < 0 || st == ENG_STATUS_OUT_OF_MEMORY) break;
        if (!cpu_only && !(cpu_only = calloc((size_t)g->nnodes + 1, 1))) break;
        if (cpu_only[failed]) break; /* cannot happen: it ran on the CPU this time */
        cpu_only[failed] = 1;
        fprintf(stderr, "tensord: %s kernel init failed: %s; running that node on the CPU\n",
                krn_backend_name(opts->backend), eng_last_error()); /* the message names the node */
    }
    if (*out) (*out)->cpu_only = NULL; /* read only while placing */
    free(cpu_only);
    return st;
}

static eng_status check_run_input(const eng_graph *g, int i, const eng_tensor *want, const eng_tensor *got) {
    char a[160], b[160];
    const char *name = g->values[g->inputs[i]].name;
    if (got->dtype != want->dtype)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input '%s': expected dtype %s, got %s", name,
                       eng_dtype_name(want->dtype), eng_dtype_name(got->dtype));
    if (!eng_shape_equal(want, got))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input '%s': expected shape %s, got %s", name,
                       eng_shape_str(want->dims, want->ndim, a, sizeof a), eng_shape_str(got->dims, got->ndim, b, sizeof b));
    if (!got->data && eng_tensor_numel(got) > 0)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input '%s': no data", name);
    return ENG_STATUS_OK;
}

static void dyn_release(eng_plan *p, int v) {
    if (v < 0 || !p->dyn_bufs[v]) return;
    if (--p->uses[v] > 0) return;
    eng_free(p->dyn_bufs[v]);
    p->dyn_bufs[v] = NULL;
    p->vals[v].data = NULL;
}

static void dyn_reset(eng_plan *p) {
    if (!p->dyn_bufs) return;
    for (int v = 0; v < p->g->nvalues; v++)
        if (p->dyn_bufs[v]) {
            eng_free(p->dyn_bufs[v]);
            p->dyn_bufs[v] = NULL;
            p->vals[v].data = NULL;
        }
}

/* A dynamic run's step whose kernel allocates its outputs (ENG_OP_ALLOCATES), or an alias of a sequence (a copy of
 * its block), on the CPU: the plan takes the buffers (p->dyn_bufs). On failure nothing is kept; no node prefix. */
eng_status plan_dyn_take_allocated(eng_plan *p, plan_step *s, const eng_node *n, eng_tensor *in, eng_tensor *outs) {
    eng_status st;
    if (s->def->flags & ENG_OP_ALIAS) st = eng_seq_clone(&in[0], &outs[0]);
    else st = run_kernel_once(p->g, s, s->kernel, s->params, in, n->nin, outs, n->nout, p->nthreads, s->const_mask);
    for (int i = 0; i < n->nout; i++) {
        int v = n->outputs[i];
        if (st == ENG_STATUS_OK && v >= 0 && !outs[i].data && eng_tensor_numel(&outs[i]) != 0)
            st = eng_err(ENG_STATUS_INTERNAL, "output %d was not produced", i);
    }
    if (st != ENG_STATUS_OK) {
        for (int i = 0; i < n->nout; i++) eng_free(outs[i].data);
        return st;
    }
    for (int i = 0; i < n->nout; i++) {
        int v = n->outputs[i];
        if (v < 0) {
            eng_free(outs[i].data);
            continue;
        }
        if (!outs[i].data && !(outs[i].data = eng_alloc(1))) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
        p->dyn_bufs[v] = outs[i].data;
        p->vals[v] = outs[i];
    }
    return ENG_STATUS_OK;
}

/* Host buffers for a dynamic run's step outputs (shapes in outs), owned by the run (p->dyn_bufs). */
eng_status plan_dyn_host_outputs(eng_plan *p, const eng_node *n, eng_tensor *outs) {
    for (int i = 0; i < n->nout; i++) {
        int v = n->outputs[i];
        if (v < 0) { /* omitted optional output: kernels skip it */
            outs[i].data = NULL;
            continue;
        }
        size_t nb = plan_value_bytes(p->g, v, &outs[i]);
        if (!(outs[i].data = eng_alloc(nb ? nb : 1)))
            return eng_err(ENG_STATUS_OUT_OF_MEMORY, "cannot allocate %zu bytes for output %d", nb, i);
        p->dyn_bufs[v] = outs[i].data;
        p->vals[v] = outs[i];
    }
    return ENG_STATUS_OK;
}

eng_status plan_dyn_run_kernel(const eng_plan *p, plan_step *s, eng_tensor *in, eng_tensor *outs) {
    const eng_node *n = &p->g->nodes[s->node];
    return run_kernel_once(p->g, s, s->kernel, s->params, in, n->nin, outs, n->nout, p->nthreads, s->const_mask);
}

eng_status plan_dyn_check_outputs(const eng_node *n, const eng_tensor *out) { return check_outputs(n, out, n->nout); }
size_t plan_dyn_value_bytes(const eng_plan *p, int v, const eng_tensor *t) { return plan_value_bytes(p->g, v, t); }

static eng_status run_dynamic(eng_plan *p) {
    const eng_graph *g = p->g;
    eng_tensor in[ENG_OP_MAX_IO], outs[ENG_OP_MAX_IO];
    char lb[300];
    dyn_reset(p);
    for (int v = 0; v < g->nvalues; v++) p->uses[v] = p->nreaders[v];
    if (p->dyn) return plan_dyn_run(p); /* a device backend's: placed step by step */
    for (int si = 0; si < p->nsteps; si++) {
        plan_step *s = &p->steps[si];
        const eng_node *n = &g->nodes[s->node];
        ctx_fill(p, n, in, outs);
        if ((s->def->flags & ENG_OP_ALLOCATES) ||
            ((s->def->flags & ENG_OP_ALIAS) && in[0].dtype == ENG_DTYPE_SEQUENCE)) {
            eng_status st = plan_dyn_take_allocated(p, s, n, in, outs);
            if (st != ENG_STATUS_OK) return eng_err_prefix(st, "%s", plan_node_label(g, n, lb, sizeof lb));
            for (int i = 0; i < n->nin; i++) dyn_release(p, n->inputs[i]);
            continue;
        }
        eng_op_ctx c = {.graph = g, .node = n, .opset = g->opset, .in = in, .nin = n->nin, .out = outs,
                        .nout = n->nout, .params = s->params, .nthreads = p->nthreads};
        eng_status st = s->def->infer(&c);
        if (st == ENG_STATUS_NEEDS_DATA)
            st = eng_err(ENG_STATUS_INTERNAL, "shape inference needs data that is missing at run time");
        if (st == ENG_STATUS_OK) st = check_outputs(n, outs, n->nout);
        if (st == ENG_STATUS_OK) st = plan_dyn_host_outputs(p, n, outs);
        if (st == ENG_STATUS_OK) {
            if (s->def->flags & ENG_OP_ALIAS) memcpy(outs[0].data, in[0].data, eng_tensor_nbytes(&outs[0]));
            else st = run_kernel_once(g, s, s->kernel, s->params, in, n->nin, outs, n->nout, p->nthreads, s->const_mask);
        }
        if (st != ENG_STATUS_OK) return eng_err_prefix(st, "%s", plan_node_label(g, n, lb, sizeof lb));
        for (int i = 0; i < n->nin; i++) dyn_release(p, n->inputs[i]);
    }
    return ENG_STATUS_OK;
}

/* A static plan's steps in order, on the CPU or, placed, on the device (its copies, waits and the kernels' after-run
 * checks: plan-place.c; a host plan has none). */
static eng_status run_static(eng_plan *p) {
    const eng_graph *g = p->g;
    eng_tensor in[ENG_OP_MAX_IO], outs[ENG_OP_MAX_IO];
    char lb[300];
    int xi = 0, pending = 0;
    if (p->graph_on) {
        int done = 0;
        eng_status gst = plan_graph_run(p, &done);
        if (done) return gst;
    }
    eng_status st = p->ctx ? krn_ctx_enter(p->dev, p->ctx) : ENG_STATUS_OK;
    for (int si = 0; si < p->nsteps && st == ENG_STATUS_OK; si++) {
        plan_step *s = &p->steps[si];
        const eng_node *n = &g->nodes[s->node];
        if (p->nxfers && (st = plan_place_xfers(p, si, &xi, &pending)) != ENG_STATUS_OK) break;
        if (!s->kernel) { /* alias: its root's bytes, on either side */
            p->vals[n->outputs[0]].data = p->vals[n->inputs[0]].data;
            continue;
        }
        if (!s->on_dev && pending) { /* a CPU step after queued copies: they may fill what it reads */
            if ((st = krn_ctx_sync(p->dev, p->ctx)) != ENG_STATUS_OK) break;
            pending = 0;
        }
        krn_call c;
        plan_step_call(p, s, in, outs, &c);
        double t0 = p->prof_ms ? plan_now_ms() : 0;
        st = s->kernel->exec(&c);
        if (p->prof_ms) { /* device steps: waited for, so the time is theirs, not the queueing's */
            if (s->on_dev && st == ENG_STATUS_OK) st = krn_ctx_sync(p->dev, p->ctx);
            p->prof_ms[si] += plan_now_ms() - t0;
        }
        pending |= s->on_dev;
        if (st != ENG_STATUS_OK) eng_err_prefix(st, "%s", plan_node_label(g, n, lb, sizeof lb));
        else if (p->ready_order) plan_ready_after(p, si); /* opts.on_ready: outputs final after this step */
    }
    return p->dev_steps ? plan_place_finish(p, st, &xi, &pending) : st;
}

static eng_status plan_run(eng_plan *p, const eng_tensor *inputs, eng_tensor *outputs) {
    const eng_graph *g = p->g;
    for (int i = 0; i < g->ninputs; i++) {
        int v = g->inputs[i];
        if (p->kind[v] != VAL_INPUT) continue;
        if (p->opts.any_shape && inputs[i].dtype == p->vals[v].dtype && inputs[i].ndim >= 0 &&
            inputs[i].ndim <= ENG_MAX_DIMS) {
            p->vals[v] = inputs[i];
            continue;
        }
        ENG_TRY(check_run_input(g, i, &p->vals[v], &inputs[i]));
        p->vals[v].data = inputs[i].data;
    }
    if (p->split) return plan_split_run(p, inputs, outputs);
    omp_set_num_threads(p->nthreads);
    for (int i = 0; p->ext_root && i < g->noutputs; i++)
        if (p->ext_root[i] >= 0) p->vals[p->ext_root[i]].data = outputs[i].data;
    if (p->dynamic) {
        ENG_TRY(run_dynamic(p));
    } else {
        ENG_TRY(run_static(p));
    }
    if (p->ext_root) { /* static opts.ext_outputs plans: the outputs not written in place */
        for (int i = 0; i < g->noutputs; i++) {
            const eng_tensor *v = &p->vals[g->outputs[i]];
            if (p->ext_root[i] >= 0) continue;
            if (v->dtype != outputs[i].dtype || !eng_shape_equal(v, &outputs[i]))
                return eng_err(ENG_STATUS_INTERNAL, "output '%s' changed shape or dtype", g->values[g->outputs[i]].name);
            size_t nb = eng_tensor_nbytes(v);
            if (nb && outputs[i].data != v->data) memmove(outputs[i].data, v->data, nb);
        }
        p->prof_runs++;
        return ENG_STATUS_OK;
    }
    for (int i = 0; i < g->noutputs; i++) {
        outputs[i] = p->vals[g->outputs[i]];
        int r = p->root[g->outputs[i]];
        int want = p->opts.dev_outputs && p->opts.dev_outputs[i];
        if (p->dev_steps && p->loc[r] != want) outputs[i].data = p->mirror[r]; /* copied after the last step */
    }
    p->prof_runs++;
    return ENG_STATUS_OK;
}

eng_status eng_plan_run(eng_plan *p, const eng_tensor *inputs, eng_tensor *outputs) {
    if (p->opts.on_ready && !p->ready_order) ENG_TRY(plan_ready_init(p));
    p->ready_next = 0;
    eng_status st = plan_run(p, inputs, outputs);
    if (st == ENG_STATUS_OK && p->ready_order) plan_ready_finish(p, outputs); /* what was not final earlier */
    return st;
}

const eng_tensor *eng_plan_output_desc(const eng_plan *p, int i, int *konst) {
    int v = p->g->outputs[i];
    if (konst) *konst = p->kind[v] == VAL_CONST;
    return &p->vals[v];
}

int eng_plan_dynamic(const eng_plan *p) { return p->dynamic; }

void eng_plan_get_stats(const eng_plan *p, eng_plan_stats *st) {
    memset(st, 0, sizeof *st);
    st->nodes = p->g->nnodes;
    for (int i = 0; i < p->nsteps; i++) st->steps += p->steps[i].kernel != NULL; /* aliases run nothing */
    st->folded = p->nfolded;
    st->dynamic = p->dynamic;
    st->arena_bytes = p->arena_bytes;
    st->naive_bytes = p->naive_bytes;
    st->precision = p->opts.precision;
    st->lowp_steps = p->lowp_steps;
    st->lowp_values = p->lowp_values;
    st->device_steps = p->dev_steps;
    if (p->dev_steps) st->fallback_steps = st->steps - p->dev_steps;
    st->copies = p->nxfers;
    st->copy_bytes = p->xfer_bytes;
    st->device_bytes = p->dev_arena_bytes + p->dev_const_bytes;
    plan_graph_stats(p, st);
    plan_split_stats(p, st);
    plan_dyn_stats(p, st);
}

void eng_plan_free(eng_plan **pp) {
    if (!pp || !*pp) return;
    eng_plan *p = *pp;
    int was_split = p->split != NULL;
    plan_split_free(p->split);
    p->split = NULL;
    if (p->prof_ms && p->prof_runs > 0 && !was_split) {
        fprintf(stderr, "profile: %lld runs, mean ms per step (implementation; +reorder = a layout conversion)\n",
                (long long)p->prof_runs);
        int nre = 0, nslow = 0;
        for (int si = 0; si < p->nsteps; si++) {
            const plan_step *s = &p->steps[si];
            const eng_node *n = &p->g->nodes[s->node];
            char sb[160];
            const eng_tensor *o = n->nout && n->outputs[0] >= 0 ? &p->vals[n->outputs[0]] : NULL;
            fprintf(stderr, "  %8.4f  %-24s %-20s %-22s %s%s%s%s\n", p->prof_ms[si] / (double)p->prof_runs, n->op_type,
                    n->name, o ? eng_shape_str(o->dims, o->ndim, sb, sizeof sb) : "", s->impl ? s->impl->impl : "",
                    s->compute ? " compute=" : "", s->compute ? eng_dtype_name(s->compute) : "",
                    s->impl && s->impl->slow ? "  [SLOW]" : "");
            if (s->impl) nre += s->impl->reorders, nslow += s->impl->slow;
        }
        fprintf(stderr, "profile: %d layout reorders inside steps, %d slow steps\n", nre, nslow);
    }
    free(p->prof_ms);
    if (p->dev && p->ctx) (void)krn_ctx_sync(p->dev, p->ctx);
    plan_graph_free(p); /* it holds the steps' state and the buffers below */
    for (int si = 0; si < p->nsteps; si++) {
        plan_step *s = &p->steps[si];
        if (s->inited && s->kernel && s->kernel->free_state && s->state) s->kernel->free_state(s->state);
        free(s->impl);
        free_params(s->def, s->params);
    }
    plan_dyn_free(p); /* before the context goes */
    plan_place_free(p);
    if (p->dyn_bufs) dyn_reset(p);
    for (int i = 0; i < p->nowned; i++) eng_free(p->owned[i]);
    free(p->owned);
    eng_free(p->arena);
    free(p->vals);
    free(p->kind);
    free(p->root);
    free(p->steps);
    free(p->uses);
    free(p->nreaders);
    free(p->dyn_bufs);
    free(p->ext_root);
    plan_ready_free(p);
    free(p);
    *pp = NULL;
}
