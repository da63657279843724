/* plan-dyn.c - dynamic plans (shapes known only at run time) on a device backend: each step placed when it runs.
 *
 * A static device plan is placed once (plan-place.c). A dynamic plan learns its shapes step by step, so it is placed
 * step by step too, as onnxruntime's CUDA provider does for data-dependent shapes: after a step's shape inference
 * gives its concrete shapes, it runs on the device when the backend has its kernel and that kernel's supports()
 * accepts the call, else on the CPU. Always on the CPU: engine kernels (If, Loop, Scan: they plan subgraphs on the
 * host), ops whose kernels allocate their outputs (ENG_OP_ALLOCATES), shape-only ops (Shape, Size: no data read),
 * anything touching a sequence or strings, a step whose device kernel's init failed once (said once), and shape
 * arithmetic: a step whose inputs all have host copies and whose inputs and outputs are all integer or bool tensors
 * of at most DYN_SMALL_INT elements (a launch and copies would cost more than it does).
 *
 * Where values live: every value has up to two copies in a run: on the host (p->vals[v].data, owned by the run when
 * p->dyn_bufs[v] is set; graph inputs and constants are the caller's and the graph's), and on the device (d->dev[v],
 * owned by the run unless it is a weight shared through opts.dev_consts). A step's output lives on the side it ran
 * on; an alias (Reshape, Squeeze, ...) is copied on the device when its input has a device copy, else on the host.
 * A step reading a value not on its side gets a copy there first (counted, eng_plan_stats.copies), which later
 * readers on that side reuse. Constants that are not shared weights are uploaded per run. Graph outputs come back to
 * the host at the end. A dynamic plan holds no device memory between runs (eng_plan_stats.device_bytes 0).
 *
 * Shape inference that needs data (NEEDS_DATA: Reshape's shape, TopK's k, Slice's starts, NonZero's consumers...)
 * is first tried with the host copies there are; when it asks for more, the inputs with only a device copy are
 * copied to the host in rounds until it has what it needs: small integer tensors (at most DYN_FETCH_SMALL elements:
 * shapes, k, starts, repeats), then small ones of any dtype (Range's limits, Resize's scales), then all; each round
 * that copies something waits once.
 *
 * Ordering: device work is queued on the plan's context and not waited for, except (1) when host data is needed
 * (a CPU step or an inference reading values with only a device copy: their copies are queued and waited for once),
 * (2) after a device kernel that checks its data after the run (krn_kernel.check), (3) at the end of the run, always,
 * also after a failure. Memory that queued work may still use (host sources of copies to the device, device buffers,
 * device kernels' state) is not freed before the next sync: frees wait in d->later. After the run every device
 * buffer of the run is freed, so nothing is left on the device after a run, failed or not.
 *
 * Precision: dynamic plans compute fp32 (plan-precision.c leaves their steps' compute dtype unset).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../ir/seq.h"
#include "plan-impl.h"

enum { DYN_SMALL_INT = 64, DYN_FETCH_SMALL = 1024 };

/* Why the last run put a step where it did (d->why, per step), for the placement line. */
enum { DYN_WHY_NONE = 0, DYN_WHY_DEVICE, DYN_WHY_NO_KERNEL, DYN_WHY_HOST_OP, DYN_WHY_UNSUPPORTED, DYN_WHY_INIT_FAILED,
       DYN_WHY_SHAPE_MATH };

/* A free that waits for the next sync: a host buffer (k NULL, dev 0), a device buffer (dev 1), a kernel's state. */
typedef struct dyn_later { void *ptr; const krn_kernel *k; int dev; } dyn_later;

struct plan_dyn {
    void **dev;            /* per value: its device copy in this run, or NULL */
    unsigned char *shared; /* per value: dev[v] is a weight of opts.dev_consts, not the run's to free */
    unsigned char *cpu;    /* per step: its device kernel's init failed once: the CPU from then on */
    unsigned char *why;    /* per step: DYN_WHY_* of the last run */
    dyn_later *later;
    int nlater, caplater;
    int pending;           /* device work queued since the last sync */
    int dev_steps, cpu_steps, copies; /* the last run's */
    size_t copy_bytes;
    int said;              /* the placement line was printed */
};

eng_status plan_dyn_setup(eng_plan *p) {
    int nv = p->g->nvalues;
    plan_dyn *d = calloc(1, sizeof *d);
    if (!d) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    p->dyn = d;
    d->dev = calloc((size_t)nv + 1, sizeof *d->dev);
    d->shared = calloc((size_t)nv + 1, 1);
    d->cpu = calloc((size_t)p->nsteps + 1, 1);
    d->why = calloc((size_t)p->nsteps + 1, 1);
    if (!d->dev || !d->shared || !d->cpu || !d->why) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    return krn_ctx_new(p->dev, p->device, &p->ctx);
}

static void dyn_free_now(eng_plan *p, const dyn_later *l) {
    if (l->k) l->k->free_state(l->ptr);
    else if (l->dev) krn_buf_free(p->dev, p->ctx, l->ptr);
    else eng_free(l->ptr);
}

static void dyn_flush(eng_plan *p) {
    plan_dyn *d = p->dyn;
    for (int i = 0; i < d->nlater; i++) dyn_free_now(p, &d->later[i]);
    d->nlater = 0;
}

/* Wait for the queued work; then what waited for it is freed (also when the wait reports an error: the work is over). */
static eng_status dyn_sync(eng_plan *p) {
    eng_status st = krn_ctx_sync(p->dev, p->ctx);
    p->dyn->pending = 0;
    dyn_flush(p);
    if (st != ENG_STATUS_OK) eng_err_prefix(st, "%s:%d: ", krn_backend_name(p->dev), p->device);
    return st;
}

/* Free l now if no device work is queued, else after the next sync (or now, after a sync, if the list cannot grow). */
static void dyn_free_later(eng_plan *p, dyn_later l) {
    plan_dyn *d = p->dyn;
    if (!l.ptr) return;
    if (d->pending && d->nlater == d->caplater) {
        int nc = d->caplater ? d->caplater * 2 : 32;
        dyn_later *n = realloc(d->later, (size_t)nc * sizeof *n);
        if (n) d->later = n, d->caplater = nc;
        else (void)dyn_sync(p); /* its error, if any, comes back at the end of the run's sync too */
    }
    if (!d->pending) dyn_free_now(p, &l);
    else d->later[d->nlater++] = l;
}

/* Value v has no reader left in this run: both its copies go (graph outputs are never dropped in-run). */
static void dyn_drop(eng_plan *p, int v) {
    plan_dyn *d = p->dyn;
    if (p->dyn_bufs[v]) {
        dyn_free_later(p, (dyn_later){p->dyn_bufs[v], NULL, 0});
        p->dyn_bufs[v] = NULL;
        p->vals[v].data = NULL;
    }
    if (d->dev[v] && !d->shared[v]) dyn_free_later(p, (dyn_later){d->dev[v], NULL, 1});
    d->dev[v] = NULL;
    d->shared[v] = 0;
}

static void dyn_release(eng_plan *p, int v) {
    if (v >= 0 && --p->uses[v] <= 0) dyn_drop(p, v);
}

static void dyn_count(plan_dyn *d, size_t nb) {
    d->copies++;
    d->copy_bytes += nb;
}

/* A host copy of v (queued; the caller syncs before reading it). *queued set when a copy was queued. */
static eng_status dyn_to_host(eng_plan *p, int v, int *queued) {
    plan_dyn *d = p->dyn;
    if (p->vals[v].data || !d->dev[v]) return ENG_STATUS_OK;
    size_t nb = plan_dyn_value_bytes(p, v, &p->vals[v]);
    void *h = eng_alloc(nb ? nb : 1);
    if (!h) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory for a host copy of '%s' (%zu bytes)",
                           p->g->values[v].name, nb);
    if (nb) {
        eng_status st = krn_buf_get(p->dev, p->ctx, h, d->dev[v], nb);
        if (st != ENG_STATUS_OK) {
            eng_free(h);
            return eng_err_prefix(st, "copying '%s' (%zu bytes) from the device: ", p->g->values[v].name, nb);
        }
        dyn_count(d, nb);
        d->pending = *queued = 1;
    }
    p->dyn_bufs[v] = h;
    p->vals[v].data = h;
    return ENG_STATUS_OK;
}

/* A device copy of v (queued after the work before it): a shared weight, or uploaded now. */
static eng_status dyn_to_dev(eng_plan *p, int v, void **out) {
    plan_dyn *d = p->dyn;
    if (!d->dev[v] && p->kind[v] == VAL_CONST) {
        void *w = NULL;
        ENG_TRY(plan_place_shared_const(p, v, &w));
        if (w) d->dev[v] = w, d->shared[v] = 1;
    }
    if (!d->dev[v]) {
        size_t nb = plan_dyn_value_bytes(p, v, &p->vals[v]);
        void *b;
        ENG_TRY(krn_buf_alloc(p->dev, p->ctx, nb ? nb : 1, &b));
        if (nb) {
            eng_status st = krn_buf_set(p->dev, p->ctx, b, p->vals[v].data, nb);
            if (st != ENG_STATUS_OK) {
                krn_buf_free(p->dev, p->ctx, b);
                return eng_err_prefix(st, "copying '%s' (%zu bytes) to the device: ", p->g->values[v].name, nb);
            }
            dyn_count(d, nb);
            d->pending = 1;
        }
        d->dev[v] = b;
    }
    *out = d->dev[v];
    return ENG_STATUS_OK;
}

/* in[i].data: the host copy of each input of n, or NULL where there is none (yet). */
static void dyn_host_view(const eng_plan *p, const eng_node *n, eng_tensor *in) {
    for (int i = 0; i < n->nin; i++) {
        int v = n->inputs[i];
        if (v < 0 || p->kind[v] == VAL_NONE) memset(&in[i], 0, sizeof in[i]);
        else in[i] = p->vals[v];
    }
}

/* Which inputs dyn_fetch copies: small integer ones (shapes, k, starts, repeats), small ones, all. */
enum { DYN_FETCH_SMALL_INT = 0, DYN_FETCH_SMALL_ANY, DYN_FETCH_ALL };

/* Host copies of n's inputs that have only a device copy, of the kind `which`, waited for; *got: how many. */
static eng_status dyn_fetch(eng_plan *p, const eng_node *n, eng_tensor *in, int which, int *got) {
    int queued = 0;
    *got = 0;
    for (int i = 0; i < n->nin; i++) {
        int v = n->inputs[i];
        if (v < 0 || in[i].dtype == ENG_DTYPE_UNDEFINED || in[i].data || !p->dyn->dev[v]) continue;
        int small = eng_tensor_numel(&in[i]) <= DYN_FETCH_SMALL;
        int ints = eng_dtype_is_int(in[i].dtype) || in[i].dtype == ENG_DTYPE_BOOL;
        if ((which == DYN_FETCH_SMALL_INT && !(small && ints)) || (which == DYN_FETCH_SMALL_ANY && !small)) continue;
        ENG_TRY(dyn_to_host(p, v, &queued));
        (*got)++;
    }
    if (queued) ENG_TRY(dyn_sync(p));
    dyn_host_view(p, n, in);
    return ENG_STATUS_OK;
}

/* Shape inference with the host data there is, fetching inputs' data from the device while it asks for more. */
static eng_status dyn_infer(eng_plan *p, const plan_step *s, const eng_node *n, eng_tensor *in, eng_tensor *out) {
    int which = DYN_FETCH_SMALL_INT;
    for (;;) {
        for (int i = 0; i < n->nout; i++) memset(&out[i], 0, sizeof out[i]);
        eng_op_ctx c = {.graph = p->g, .node = n, .opset = p->g->opset, .in = in, .nin = n->nin, .out = out,
                        .nout = n->nout, .params = s->params, .nthreads = p->nthreads};
        eng_status st = s->def->infer(&c);
        if (st != ENG_STATUS_NEEDS_DATA) return st == ENG_STATUS_OK ? plan_dyn_check_outputs(n, out) : st;
        int got = 0;
        while (!got && which <= DYN_FETCH_ALL) ENG_TRY(dyn_fetch(p, n, in, which++, &got));
        if (!got) return eng_err(ENG_STATUS_INTERNAL, "shape inference needs data that is missing at run time");
    }
}

static int dyn_plain(eng_dtype dt) { return dt != ENG_DTYPE_SEQUENCE && dt != ENG_DTYPE_STRING; }
static int dyn_small_int(const eng_tensor *t) {
    return (eng_dtype_is_int(t->dtype) || t->dtype == ENG_DTYPE_BOOL) && eng_tensor_numel(t) <= DYN_SMALL_INT;
}

/* Where step s runs now that in/out have their shapes (in[i].data: host copies, NULL where only the device has one):
 * DYN_WHY_DEVICE or why not. */
static int dyn_side(const eng_plan *p, int si, const eng_tensor *in, const eng_tensor *out) {
    const plan_step *s = &p->steps[si];
    const eng_node *n = &p->g->nodes[s->node];
    if (s->def->engine_kernel || (s->def->flags & (ENG_OP_ALLOCATES | ENG_OP_SHAPE_ONLY))) return DYN_WHY_HOST_OP;
    if (!s->dev_kernel) return DYN_WHY_NO_KERNEL;
    if (p->dyn->cpu[si]) return DYN_WHY_INIT_FAILED;
    eng_tensor ti[ENG_OP_MAX_IO], to[ENG_OP_MAX_IO];
    int host = 1, small = 1;
    for (int i = 0; i < n->nin; i++) {
        ti[i] = in[i];
        ti[i].data = NULL;
        if (in[i].dtype == ENG_DTYPE_UNDEFINED) continue;
        if (!dyn_plain(in[i].dtype)) return DYN_WHY_HOST_OP;
        host &= in[i].data != NULL;
        small &= dyn_small_int(&in[i]);
    }
    for (int i = 0; i < n->nout; i++) {
        to[i] = out[i];
        to[i].data = NULL;
        if (n->outputs[i] < 0) continue;
        if (!dyn_plain(out[i].dtype)) return DYN_WHY_HOST_OP;
        small &= dyn_small_int(&out[i]);
    }
    if (host && small) return DYN_WHY_SHAPE_MATH;
    krn_call c = {.params = s->params, .in = ti, .nin = n->nin, .out = to, .nout = n->nout, .nthreads = p->nthreads,
                  .const_mask = s->const_mask};
    return !s->dev_kernel->supports || s->dev_kernel->supports(&c) ? DYN_WHY_DEVICE : DYN_WHY_UNSUPPORTED;
}

/* Step s on the CPU: its inputs' host copies (fetched, except for shape-only ops, which read no data), its outputs in
 * host memory, the kernel's init / exec / free. */
static eng_status dyn_run_cpu(eng_plan *p, plan_step *s, const eng_node *n, eng_tensor *in, eng_tensor *out) {
    int got;
    dyn_host_view(p, n, in);
    if (!(s->def->flags & ENG_OP_SHAPE_ONLY)) ENG_TRY(dyn_fetch(p, n, in, DYN_FETCH_ALL, &got));
    ENG_TRY(plan_dyn_host_outputs(p, n, out));
    p->dyn->cpu_steps++;
    return plan_dyn_run_kernel(p, s, in, out);
}

/* Step s on the device: its inputs' device copies, its outputs in device memory, the device kernel queued. *fell_back
 * set (and nothing run) when its init fails: the step then runs on the CPU, this run and after. */
static eng_status dyn_run_dev(eng_plan *p, int si, const eng_node *n, eng_tensor *in, eng_tensor *out, int *fell_back) {
    plan_dyn *d = p->dyn;
    plan_step *s = &p->steps[si];
    const krn_kernel *k = s->dev_kernel;
    *fell_back = 0;
    for (int i = 0; i < n->nin; i++)
        if (n->inputs[i] >= 0 && in[i].dtype != ENG_DTYPE_UNDEFINED) ENG_TRY(dyn_to_dev(p, n->inputs[i], &in[i].data));
    for (int i = 0; i < n->nout; i++) {
        int v = n->outputs[i];
        out[i].data = NULL;
        if (v < 0) continue;
        size_t nb = plan_dyn_value_bytes(p, v, &out[i]);
        ENG_TRY(krn_buf_alloc(p->dev, p->ctx, nb ? nb : 1, &out[i].data));
        d->dev[v] = out[i].data;
        p->vals[v] = out[i];
        p->vals[v].data = NULL; /* no host copy */
    }
    krn_call c = {.params = s->params, .in = in, .nin = n->nin, .out = out, .nout = n->nout, .nthreads = p->nthreads,
                  .const_mask = s->const_mask, .ctx = p->ctx};
    eng_status st = k->init ? k->init(&c) : ENG_STATUS_OK;
    if (st != ENG_STATUS_OK) {
        char lb[300];
        if (k->free_state && c.state) dyn_free_later(p, (dyn_later){c.state, k, 0});
        for (int i = 0; i < n->nout; i++)
            if (n->outputs[i] >= 0) dyn_drop(p, n->outputs[i]);
        d->cpu[si] = 1;
        *fell_back = 1;
        fprintf(stderr, "tensord: %s kernel init failed: %s%s; running that node on the CPU\n", krn_backend_name(p->dev),
                plan_node_label(p->g, n, lb, sizeof lb), eng_last_error());
        return ENG_STATUS_OK;
    }
    st = k->exec(&c);
    d->pending = 1;
    if (k->free_state && c.state) dyn_free_later(p, (dyn_later){c.state, k, 0});
    if (st == ENG_STATUS_OK && k->check) { /* what it could not report while queued (an index out of range) */
        st = dyn_sync(p);
        if (st == ENG_STATUS_OK) st = k->check(&c);
    }
    d->dev_steps++;
    return st;
}

/* An alias (Reshape, Squeeze, ... with the shape inferred): input 0's bytes, copied on the device when it has a copy
 * there, else on the host. */
static eng_status dyn_run_alias(eng_plan *p, const eng_node *n, const eng_tensor *in, eng_tensor *out) {
    plan_dyn *d = p->dyn;
    int src = n->inputs[0], v = n->outputs[0];
    size_t nb = eng_tensor_nbytes(&out[0]);
    if (!d->dev[src]) {
        ENG_TRY(plan_dyn_host_outputs(p, n, out));
        if (nb) memcpy(out[0].data, in[0].data, nb);
        return ENG_STATUS_OK;
    }
    void *b;
    ENG_TRY(krn_buf_alloc(p->dev, p->ctx, nb ? nb : 1, &b));
    d->dev[v] = b;
    p->vals[v] = out[0];
    p->vals[v].data = NULL;
    if (!nb) return ENG_STATUS_OK;
    d->pending = 1;
    return krn_buf_copy(p->dev, p->ctx, b, d->dev[src], nb);
}

/* A step whose kernel allocates its outputs, or an alias of a sequence: on the CPU (its inputs fetched); the run takes
 * the buffers. */
static eng_status dyn_run_allocating(eng_plan *p, plan_step *s, const eng_node *n, eng_tensor *in, eng_tensor *out) {
    int got;
    ENG_TRY(dyn_fetch(p, n, in, DYN_FETCH_ALL, &got));
    for (int i = 0; i < n->nout; i++) memset(&out[i], 0, sizeof out[i]);
    if (!(s->def->flags & ENG_OP_ALIAS)) p->dyn->cpu_steps++;
    return plan_dyn_take_allocated(p, s, n, in, out);
}

static eng_status dyn_step(eng_plan *p, int si) {
    plan_step *s = &p->steps[si];
    const eng_graph *g = p->g;
    const eng_node *n = &g->nodes[s->node];
    eng_tensor in[ENG_OP_MAX_IO], out[ENG_OP_MAX_IO];
    dyn_host_view(p, n, in);
    for (int i = 0; i < n->nout; i++) memset(&out[i], 0, sizeof out[i]);
    unsigned fl = s->def->flags;
    eng_status st;
    p->dyn->why[si] = s->kernel ? DYN_WHY_HOST_OP : DYN_WHY_NONE;
    if ((fl & ENG_OP_ALLOCATES) || ((fl & ENG_OP_ALIAS) && in[0].dtype == ENG_DTYPE_SEQUENCE)) {
        st = dyn_run_allocating(p, s, n, in, out);
    } else if ((st = dyn_infer(p, s, n, in, out)) != ENG_STATUS_OK) {
        /* named below */
    } else if ((fl & ENG_OP_ALIAS) || !s->kernel) { /* !kernel: an ALIAS_SAME op made an alias at plan time */
        st = dyn_run_alias(p, n, in, out);
    } else {
        int side = dyn_side(p, si, in, out), fell_back = 0;
        if (side == DYN_WHY_DEVICE) {
            st = dyn_run_dev(p, si, n, in, out, &fell_back);
            if (fell_back) side = DYN_WHY_INIT_FAILED;
        }
        if (side != DYN_WHY_DEVICE) st = dyn_run_cpu(p, s, n, in, out);
        p->dyn->why[si] = (unsigned char)side;
    }
    char lb[300];
    if (st != ENG_STATUS_OK) return eng_err_prefix(st, "%s", plan_node_label(g, n, lb, sizeof lb));
    for (int i = 0; i < n->nin; i++) dyn_release(p, n->inputs[i]);
    return ENG_STATUS_OK;
}

/* Once per plan, after its first run: the steps that ran on the CPU and why, as static device plans say it. */
static void dyn_say(eng_plan *p) {
    plan_dyn *d = p->dyn;
    if (d->said++ || !d->cpu_steps) return;
    static const char *const why[] = {"", "", ": no kernel", ": runs on the CPU", ": this call unsupported",
                                      ": its init failed", ": shape arithmetic"};
    char line[1024];
    size_t k = 0;
    int shown = 0;
    for (int si = 0; si < p->nsteps && shown < 8; si++) {
        if (d->why[si] <= DYN_WHY_DEVICE) continue;
        const eng_node *n = &p->g->nodes[p->steps[si].node];
        k += (size_t)snprintf(line + k, sizeof line - k, "%s'%s' (%s%s)", shown ? ", " : "", n->name, n->op_type,
                              why[d->why[si]]);
        if (k >= sizeof line) k = sizeof line - 1;
        shown++;
    }
    fprintf(stderr, "tensord: plan on %s:%d with shapes known at run time: first run %d steps on the device, %d on the "
            "CPU (%s%s); %d copies, %zu bytes\n", krn_backend_name(p->dev), p->device, d->dev_steps, d->cpu_steps, line,
            d->cpu_steps > shown ? ", ..." : "", d->copies, d->copy_bytes);
}

/* The run's device copies (not the shared weights), after its last sync. */
static void dyn_free_copies(eng_plan *p) {
    plan_dyn *d = p->dyn;
    for (int v = 0; v < p->g->nvalues; v++) {
        if (d->dev[v] && !d->shared[v]) krn_buf_free(p->dev, p->ctx, d->dev[v]);
        d->dev[v] = NULL;
        d->shared[v] = 0;
    }
}

eng_status plan_dyn_run(eng_plan *p) {
    plan_dyn *d = p->dyn;
    const eng_graph *g = p->g;
    d->dev_steps = d->cpu_steps = d->copies = 0;
    d->copy_bytes = 0;
    eng_status st = krn_ctx_enter(p->dev, p->ctx);
    for (int si = 0; si < p->nsteps && st == ENG_STATUS_OK; si++) st = dyn_step(p, si);
    int queued = 0;
    for (int i = 0; st == ENG_STATUS_OK && i < g->noutputs; i++) st = dyn_to_host(p, g->outputs[i], &queued);
    eng_status sst = dyn_sync(p); /* always: queued work must not outlive the buffers freed next */
    if (st == ENG_STATUS_OK) st = sst;
    dyn_free_copies(p);
    if (st == ENG_STATUS_OK) dyn_say(p);
    return st;
}

void plan_dyn_stats(const eng_plan *p, eng_plan_stats *st) {
    const plan_dyn *d = p->dyn;
    if (!d) return;
    st->device_steps = d->dev_steps;
    st->fallback_steps = d->cpu_steps;
    st->copies = d->copies;
    st->copy_bytes = d->copy_bytes;
    st->device_bytes = 0;
    st->graph_off = "shapes known only at run time";
}

void plan_dyn_free(eng_plan *p) {
    plan_dyn *d = p->dyn;
    if (!d) return;
    if (p->ctx) (void)krn_ctx_sync(p->dev, p->ctx);
    dyn_flush(p);
    if (d->dev) dyn_free_copies(p);
    free(d->dev);
    free(d->shared);
    free(d->cpu);
    free(d->why);
    free(d->later);
    free(d);
    p->dyn = NULL;
}
