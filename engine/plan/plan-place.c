/* plan-place.c - placing a static plan's steps on a device backend, with the CPU as the fallback node by node.
 *
 * A step runs on the device when the device backend has a kernel of its name and that kernel's supports() accepts
 * the call (shapes, dtypes, params final); otherwise on the CPU. Every storage root then lives where its producer
 * ran (graph inputs and constants: the CPU). A root read on the other side gets a mirror there: constants are
 * uploaded once, at plan time; activations are copied by a plan_xfer queued on the device's stream just before
 * their first reader on the other side; device results that are graph outputs come back to host memory the
 * backend copies fast (pinned) after the last step. Device activations and their mirrors share one device arena,
 * laid out with the same liveness packing as the CPU's.
 *
 * Ordering: device work is queued and not waited for, except before a CPU step that follows any queued copy (it
 * may read a mirror that a copy fills, or overwrite host memory a copy still reads), and at the end of the run.
 * A plan with no fallback therefore synchronises once per run. Fallbacks are counted (eng_plan_stats) and named
 * once per plan on stderr: a slow path is never silent.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan-impl.h"

/* ---- weights shared by a session's device plans ---- */

typedef struct dev_const { const void *host; size_t nbytes; void *dev; } dev_const;

struct eng_dev_consts {
    const krn_backend *b;
    int device;
    krn_ctx *ctx; /* its own: the buffers outlive the plans that asked for them */
    dev_const *e;
    int n, cap;
    size_t bytes;
};

eng_dev_consts *eng_dev_consts_new(const krn_backend *b, int device) {
    eng_dev_consts *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->b = b;
    c->device = device;
    return c;
}

void eng_dev_consts_free(eng_dev_consts **cp) {
    eng_dev_consts *c = *cp;
    if (!c) return;
    if (c->ctx) (void)krn_ctx_sync(c->b, c->ctx);
    for (int i = 0; i < c->n; i++) krn_buf_free(c->b, c->ctx, c->e[i].dev);
    krn_ctx_free(c->b, &c->ctx);
    free(c->e);
    free(c);
    *cp = NULL;
}

size_t eng_dev_consts_bytes(const eng_dev_consts *c) { return c ? c->bytes : 0; }

/* The device copy of nbytes at host (uploaded on first use, then synchronised). */
static eng_status dev_consts_get(eng_dev_consts *c, const void *host, size_t nbytes, void **out) {
    for (int i = 0; i < c->n; i++)
        if (c->e[i].host == host && c->e[i].nbytes == nbytes) {
            *out = c->e[i].dev;
            return ENG_STATUS_OK;
        }
    if (!c->ctx) ENG_TRY(krn_ctx_new(c->b, c->device, &c->ctx));
    if (c->n == c->cap) {
        int nc = c->cap ? c->cap * 2 : 32;
        dev_const *e = realloc(c->e, (size_t)nc * sizeof *e);
        if (!e) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
        c->e = e;
        c->cap = nc;
    }
    void *d;
    ENG_TRY(krn_buf_alloc(c->b, c->ctx, nbytes ? nbytes : 1, &d));
    eng_status st = nbytes ? krn_buf_set(c->b, c->ctx, d, host, nbytes) : ENG_STATUS_OK;
    if (st == ENG_STATUS_OK) st = krn_ctx_sync(c->b, c->ctx);
    if (st != ENG_STATUS_OK) {
        krn_buf_free(c->b, c->ctx, d);
        return st;
    }
    c->e[c->n++] = (dev_const){host, nbytes, d};
    c->bytes += nbytes;
    *out = d;
    return ENG_STATUS_OK;
}

eng_status plan_place_shared_const(eng_plan *p, int v, void **out) {
    const eng_tensor *init = p->g->values[v].init;
    *out = NULL;
    if (!p->opts.dev_consts || !init || init->data != p->vals[v].data || init->dtype != p->vals[v].dtype) return ENG_STATUS_OK;
    eng_status st = dev_consts_get(p->opts.dev_consts, init->data, eng_tensor_nbytes(&p->vals[v]), out);
    if (st != ENG_STATUS_OK) eng_err_prefix(st, "weight '%s': ", p->g->values[v].name);
    return st;
}

/* Whether the device kernel takes the call step s would make (shapes, dtypes, params; no data). */
static int step_supported(const eng_plan *p, const plan_step *s) {
    eng_tensor in[ENG_OP_MAX_IO], out[ENG_OP_MAX_IO];
    krn_call c;
    plan_step_call(p, s, in, out, &c);
    for (int i = 0; i < c.nin; i++) in[i].data = NULL;
    for (int i = 0; i < c.nout; i++) out[i].data = NULL;
    return !s->dev_kernel->supports || s->dev_kernel->supports(&c);
}

int plan_resident_io(const eng_plan *p) {
    const eng_graph *g = p->g;
    int r = 0;
    for (int i = 0; p->opts.dev_inputs && i < g->ninputs; i++) r |= p->opts.dev_inputs[i];
    for (int i = 0; p->opts.dev_outputs && i < g->noutputs; i++) r |= p->opts.dev_outputs[i];
    return r;
}

static eng_status xfer_add(eng_plan *p, int *cap, int step, int root, int to_dev) {
    if (p->nxfers == *cap) {
        int nc = *cap ? *cap * 2 : 16;
        plan_xfer *x = realloc(p->xfers, (size_t)nc * sizeof *x);
        if (!x) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory placing the plan");
        p->xfers = x;
        *cap = nc;
    }
    p->xfers[p->nxfers++] = (plan_xfer){step, root, to_dev};
    return ENG_STATUS_OK;
}

static int xfer_cmp(const void *a, const void *b) {
    const plan_xfer *x = a, *y = b;
    return x->step != y->step ? x->step - y->step : x->root - y->root;
}

eng_status plan_place(eng_plan *p) {
    const eng_graph *g = p->g;
    int nv = g->nvalues;
    p->loc = calloc((size_t)nv + 1, sizeof *p->loc);
    p->mirror = calloc((size_t)nv + 1, sizeof *p->mirror);
    p->mirror_first = malloc(((size_t)nv + 1) * sizeof *p->mirror_first);
    p->mirror_last = malloc(((size_t)nv + 1) * sizeof *p->mirror_last);
    if (!p->loc || !p->mirror || !p->mirror_first || !p->mirror_last)
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory placing the plan");
    for (int v = 0; v < nv; v++) p->mirror_first[v] = p->mirror_last[v] = -1;
    /* place */
    for (int si = 0; si < p->nsteps; si++) {
        plan_step *s = &p->steps[si];
        if (!s->kernel || !s->dev_kernel || (p->cpu_only && p->cpu_only[s->node]) || !step_supported(p, s)) continue;
        s->on_dev = 1;
        s->kernel = s->dev_kernel;
        p->dev_steps++;
        const eng_node *n = &g->nodes[s->node];
        for (int i = 0; i < n->nout; i++)
            if (n->outputs[i] >= 0 && p->root[n->outputs[i]] == n->outputs[i]) p->loc[n->outputs[i]] = 1;
    }
    for (int i = 0; p->opts.dev_inputs && i < g->ninputs; i++) /* device-resident inputs live there from the start */
        if (p->opts.dev_inputs[i] && p->kind[g->inputs[i]] == VAL_INPUT) p->loc[g->inputs[i]] = 1;
    if (plan_resident_io(p) && !p->dev_steps)
        return eng_err(ENG_STATUS_UNSUPPORTED, "device-resident inputs or outputs on %s:%d, but no step of this plan runs "
                       "there", krn_backend_name(p->dev), p->device);
    if (!p->dev_steps) return ENG_STATUS_OK;
    /* mirrors: the first and last step that reads each root on the side it does not live on */
    for (int si = 0; si < p->nsteps; si++) {
        const plan_step *s = &p->steps[si];
        if (!s->kernel) continue; /* aliases read nothing */
        const eng_node *n = &g->nodes[s->node];
        for (int i = 0; i < n->nin; i++) {
            int v = n->inputs[i];
            if (v < 0 || p->kind[v] == VAL_NONE) continue;
            int r = p->root[v];
            if (p->loc[r] == s->on_dev) continue;
            if (p->mirror_first[r] < 0) p->mirror_first[r] = si;
            p->mirror_last[r] = si;
        }
    }
    /* graph outputs wanted on the other side (host, unless dev_outputs says device) are copied after the last step
     * (or are already mirrored for a reader on that side, from that reader on) */
    for (int i = 0; i < g->noutputs; i++) {
        int r = p->root[g->outputs[i]];
        int want = p->opts.dev_outputs && p->opts.dev_outputs[i];
        if (p->loc[r] == want) continue;
        if (want && p->kind[r] != VAL_ARENA && p->kind[r] != VAL_INPUT)
            return eng_err(ENG_STATUS_UNSUPPORTED, "output '%s' is a constant of the graph: it cannot be returned in "
                           "device memory", g->values[g->outputs[i]].name);
        if (p->mirror_first[r] < 0) p->mirror_first[r] = p->nsteps;
        p->mirror_last[r] = p->nsteps + 1;
    }
    int cap = 0;
    for (int r = 0; r < nv; r++) {
        if (p->root[r] != r || p->mirror_first[r] < 0) continue;
        if (p->kind[r] == VAL_CONST) continue; /* uploaded once by plan_place_memory */
        ENG_TRY(xfer_add(p, &cap, p->mirror_first[r], r, !p->loc[r]));
        p->xfer_bytes += eng_tensor_nbytes(&p->vals[r]);
    }
    qsort(p->xfers, (size_t)p->nxfers, sizeof *p->xfers, xfer_cmp);
    int fallback = 0;
    for (int si = 0; si < p->nsteps; si++) fallback += p->steps[si].kernel && !p->steps[si].on_dev;
    if (fallback) {
        char line[1024];
        size_t k = 0;
        int shown = 0;
        for (int si = 0; si < p->nsteps && shown < 8; si++) {
            const plan_step *s = &p->steps[si];
            if (!s->kernel || s->on_dev) continue;
            const eng_node *n = &g->nodes[s->node];
            k += (size_t)snprintf(line + k, sizeof line - k, "%s'%s' (%s%s)", shown ? ", " : "", n->name, n->op_type,
                                  !s->dev_kernel ? ": no kernel"
                                  : p->cpu_only && p->cpu_only[s->node] ? ": its init failed" : ": this call unsupported");
            if (k >= sizeof line) k = sizeof line - 1;
            shown++;
        }
        fprintf(stderr, "tensord: plan on %s:%d: %d of %d steps on the device, %d on the CPU (%s%s); %d copies, "
                "%zu bytes per run\n", krn_backend_name(p->dev), p->device, p->dev_steps, p->dev_steps + fallback,
                fallback, line, fallback > shown ? ", ..." : "", p->nxfers, p->xfer_bytes);
    }
    return ENG_STATUS_OK;
}

/* Device arena: roots living on the device, and device mirrors of CPU activations and inputs. Host mirrors of
 * device roots: one pinned host buffer, packed the same way. Constants read on the device: uploaded now. */
eng_status plan_place_memory(eng_plan *p) {
    const eng_graph *g = p->g;
    int nv = g->nvalues;
    int *first = malloc((size_t)nv * sizeof(int) + 1), *last = malloc((size_t)nv * sizeof(int) + 1);
    plan_buf *dbufs = calloc((size_t)nv * 2 + 1, sizeof *dbufs), *hbufs = calloc((size_t)nv + 1, sizeof *hbufs);
    eng_status st = ENG_STATUS_OK;
    if (!first || !last || !dbufs || !hbufs) {
        st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory planning device buffers");
        goto out;
    }
    plan_lifetimes(p, first, last);
    int nd = 0, nh = 0;
    for (int v = 0; v < nv; v++) {
        if (p->root[v] != v) continue;
        if (p->kind[v] == VAL_ARENA && p->loc[v])
            dbufs[nd++] = (plan_buf){v, plan_value_size(p, v), 0, first[v] < 0 ? 0 : first[v],
                                     last[v] < 0 ? p->nsteps : last[v]};
        if (p->mirror_first[v] < 0 || p->kind[v] == VAL_CONST) continue;
        plan_buf mb = {v + nv, plan_value_size(p, v), 0, p->mirror_first[v], p->mirror_last[v]};
        if (p->loc[v]) hbufs[nh++] = mb;
        else dbufs[nd++] = mb;
    }
    p->dev_arena_bytes = plan_pack(dbufs, nd);
    size_t hbytes = plan_pack(hbufs, nh);
    if (p->dev_arena_bytes) {
        st = krn_buf_alloc(p->dev, p->ctx, p->dev_arena_bytes, &p->dev_arena);
        if (st != ENG_STATUS_OK) goto out;
    }
    if (hbytes) {
        st = krn_host_alloc(p->dev, hbytes, &p->host_mirror_arena);
        if (st != ENG_STATUS_OK) goto out;
    }
    for (int i = 0; i < nd; i++) {
        void *d = (char *)p->dev_arena + dbufs[i].off;
        if (dbufs[i].root >= nv) p->mirror[dbufs[i].root - nv] = d;
        else p->vals[dbufs[i].root].data = d;
    }
    for (int i = 0; i < nh; i++) p->mirror[hbufs[i].root - nv] = (char *)p->host_mirror_arena + hbufs[i].off;
    for (int v = 0; v < nv; v++)
        if (p->kind[v] == VAL_ALIAS && p->loc[p->root[v]]) p->vals[v].data = p->vals[p->root[v]].data;
    /* constants */
    int nconst = 0;
    for (int v = 0; v < nv; v++) nconst += p->root[v] == v && p->kind[v] == VAL_CONST && p->mirror_first[v] >= 0;
    p->dev_owned = calloc((size_t)nconst + 1, sizeof *p->dev_owned);
    if (!p->dev_owned) {
        st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory planning device buffers");
        goto out;
    }
    for (int v = 0; v < nv && st == ENG_STATUS_OK; v++) {
        if (p->root[v] != v || p->kind[v] != VAL_CONST || p->mirror_first[v] < 0) continue;
        size_t nb = eng_tensor_nbytes(&p->vals[v]);
        /* a graph initializer, unchanged: shared through the session's cache; folded values are this plan's */
        const eng_tensor *init = g->values[v].init;
        if (p->opts.dev_consts && init && init->data == p->vals[v].data && init->dtype == p->vals[v].dtype) {
            st = dev_consts_get(p->opts.dev_consts, init->data, nb, &p->mirror[v]);
            if (st != ENG_STATUS_OK) eng_err_prefix(st, "weight '%s': ", g->values[v].name);
            continue;
        }
        st = krn_buf_alloc(p->dev, p->ctx, nb ? nb : 1, &p->mirror[v]);
        if (st != ENG_STATUS_OK) {
            eng_err_prefix(st, "constant '%s': ", g->values[v].name);
            break;
        }
        p->dev_owned[p->ndev_owned++] = p->mirror[v];
        p->dev_const_bytes += nb;
        if (nb) st = krn_buf_set(p->dev, p->ctx, p->mirror[v], p->vals[v].data, nb);
    }
    if (st == ENG_STATUS_OK) st = krn_ctx_sync(p->dev, p->ctx);
out:
    free(first); free(last); free(dbufs); free(hbufs);
    return st;
}

void *plan_place_data(const eng_plan *p, const plan_step *s, int v) {
    int r = p->root[v];
    if (!p->loc || p->loc[r] == s->on_dev) return p->vals[v].data;
    return p->mirror[r];
}

void plan_place_free(eng_plan *p) {
    if (p->dev) {
        if (p->ctx) (void)krn_ctx_sync(p->dev, p->ctx); /* nothing queued may outlive its buffers */
        for (int i = 0; i < p->ndev_owned; i++) krn_buf_free(p->dev, p->ctx, p->dev_owned[i]);
        krn_buf_free(p->dev, p->ctx, p->dev_arena);
        krn_host_free(p->dev, p->host_mirror_arena);
        krn_ctx_free(p->dev, &p->ctx);
    }
    free(p->dev_owned);
    free(p->loc);
    free(p->mirror);
    free(p->mirror_first);
    free(p->mirror_last);
    free(p->xfers);
}

eng_status plan_place_xfers(eng_plan *p, int si, int *xi, int *pending) {
    for (; *xi < p->nxfers && p->xfers[*xi].step == si; (*xi)++) {
        const plan_xfer *x = &p->xfers[*xi];
        int r = x->root;
        size_t nb = eng_tensor_nbytes(&p->vals[r]);
        if (!nb) continue;
        eng_status st = x->to_dev ? krn_buf_set(p->dev, p->ctx, p->mirror[r], p->vals[r].data, nb)
                                  : krn_buf_get(p->dev, p->ctx, p->mirror[r], p->vals[r].data, nb);
        if (st != ENG_STATUS_OK)
            return eng_err_prefix(st, "copying '%s' (%zu bytes) %s: ", p->g->values[r].name, nb,
                                  x->to_dev ? "to the device" : "from the device");
        *pending = 1;
    }
    return ENG_STATUS_OK;
}

eng_status plan_place_finish(eng_plan *p, eng_status st, int *xi, int *pending) {
    const eng_graph *g = p->g;
    if (st == ENG_STATUS_OK) st = plan_place_xfers(p, p->nsteps, xi, pending);
    /* always drain the stream: after a failure too, queued work must not outlive this run's buffers */
    char first[2048] = ""; /* the run's own error: a sync after a sticky one fails too, and must not replace it */
    if (st != ENG_STATUS_OK) krn_str_copy(first, sizeof first, eng_last_error());
    eng_status sst = krn_ctx_sync(p->dev, p->ctx);
    if (st == ENG_STATUS_OK && sst != ENG_STATUS_OK)
        st = eng_err_prefix(sst, "%s:%d: ", krn_backend_name(p->dev), p->device);
    else if (st != ENG_STATUS_OK && sst != ENG_STATUS_OK)
        eng_err(st, "%s", first);
    /* what device kernels could not report while queued (an index out of range): the first, as the CPU would */
    eng_tensor in[ENG_OP_MAX_IO], outs[ENG_OP_MAX_IO];
    char lb[300];
    for (int si = 0; st == ENG_STATUS_OK && si < p->nsteps; si++) {
        const plan_step *s = &p->steps[si];
        if (!s->on_dev || !s->kernel->check) continue;
        krn_call c;
        plan_step_call(p, s, in, outs, &c);
        st = s->kernel->check(&c);
        if (st != ENG_STATUS_OK) eng_err_prefix(st, "%s", plan_node_label(g, &g->nodes[s->node], lb, sizeof lb));
    }
    return st;
}
