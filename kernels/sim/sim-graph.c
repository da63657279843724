/* sim-graph.c - graphs on the sim test device, with CUDA Graphs' semantics, so the engine's use of graphs is tested
 * without a GPU.
 *
 * Between graph_begin and graph_end on a context, the work queued on it is recorded and NOT run: a sim kernel's exec
 * (after its host-side checks: every tensor is sim memory, TENSORD_SIM_FAIL_KERNEL) and a copy (set / get / copy)
 * each append a record; nothing is read or written. A launch replays the records in order, each as it was recorded:
 *  - a kernel record holds the krn_call by value with its tensor descriptors copied (dtype, shape, data pointer:
 *    what a CUDA kernel's arguments freeze at capture), and the params and state pointers as given: the caller keeps
 *    those alive and unchanged while the graph lives, as CUDA kernels read them (or what they point to) then too;
 *  - a copy record holds its pointers and size: a host buffer named at capture is read (or written) at every launch,
 *    so an engine that moves its host staging after capturing reads stale data here as it would on a GPU.
 * Replay honours the device's protection: every sim pointer is checked to still be sim memory (a buffer freed after
 * the capture fails the launch) and opened only for its kernel or copy. A synchronisation of a capturing context
 * invalidates the capture (CUDA: cudaErrorStreamCaptureUnsupported): graph_end then fails and discards it.
 * Faults: a kernel of a launched graph that fails (TENSORD_SIM_FAIL_KERNEL counts its replays as execs; recording
 * counts nothing) stops the replay and fails the context's next sync, as a fault of a CUDA graph's work surfaces at
 * the stream's sync, not at cudaGraphLaunch. Injection: TENSORD_SIM_FAIL_GRAPH=N (N >= 1) makes the N-th graph launch
 * of this process fail as cudaGraphLaunch can, before any of its work runs; TENSORD_SIM_FAIL_CAPTURE=name makes
 * recording kernel `name` fail, as a CUDA kernel that allocates or synchronises in exec fails a capture.
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim-impl.h"

typedef struct sim_rec {
    const krn_kernel *k;   /* the CPU kernel to run; NULL: a copy */
    const char *name;      /* the kernel's name (static) */
    krn_call call;         /* by value; in/out point into t */
    eng_tensor *t;         /* call.nin + call.nout descriptors, copied */
    void *dst;             /* a copy's */
    const void *src;
    size_t n;
    int dst_dev, src_dev;
} sim_rec;

struct sim_capture {
    sim_rec *recs;
    int n, cap;
    int invalid;           /* 1: a sync or an out-of-memory broke the capture; why[] says which */
    char why[256];
};

struct krn_graph {
    int dev;
    sim_rec *recs;
    int n;
};

/* The capture is broken (the first reason kept): graph_end fails and discards it. */
static void cap_invalidate(sim_capture *cp, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void cap_invalidate(sim_capture *cp, const char *fmt, ...) {
    if (cp->invalid) return;
    cp->invalid = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cp->why, sizeof cp->why, fmt, ap);
    va_end(ap);
}

static void recs_free(sim_rec *recs, int n) {
    for (int i = 0; i < n; i++) free(recs[i].t);
    free(recs);
}

static sim_rec *rec_push(krn_ctx *c) {
    sim_capture *cp = c->cap;
    if (cp->invalid) return NULL;
    if (cp->n == cp->cap) {
        int nc = cp->cap ? cp->cap * 2 : 32;
        sim_rec *r = realloc(cp->recs, (size_t)nc * sizeof *r);
        if (!r) {
            cap_invalidate(cp, "out of host memory recording %d operations", cp->n + 1);
            return NULL;
        }
        cp->recs = r;
        cp->cap = nc;
    }
    sim_rec *r = &cp->recs[cp->n];
    memset(r, 0, sizeof *r);
    return r;
}

static eng_status rec_refused(krn_ctx *c) {
    return eng_err(ENG_STATUS_INTERNAL, "sim:%d: the graph capture is invalidated: %s", c->dev, c->cap->why);
}

eng_status sim_graph_record_call(krn_ctx *c, const krn_kernel *k, const krn_call *call, const char *name) {
    const char *fc = getenv("TENSORD_SIM_FAIL_CAPTURE");
    if (fc && !strcmp(fc, name)) {
        cap_invalidate(c->cap, "kernel '%s' cannot be captured", name);
        return eng_err(ENG_STATUS_INTERNAL, "sim:%d: kernel '%s': operation not permitted when stream is capturing "
                       "(injected: TENSORD_SIM_FAIL_CAPTURE)", c->dev, name);
    }
    sim_rec *r = rec_push(c);
    if (!r) return rec_refused(c);
    int nt = call->nin + call->nout;
    r->t = malloc((size_t)(nt ? nt : 1) * sizeof *r->t);
    if (!r->t) {
        cap_invalidate(c->cap, "out of host memory recording kernel '%s'", name);
        return rec_refused(c);
    }
    for (int i = 0; i < call->nin; i++) r->t[i] = call->in[i];
    for (int i = 0; i < call->nout; i++) r->t[call->nin + i] = call->out[i];
    r->k = k;
    r->name = name;
    r->call = *call;
    r->call.in = r->t;
    r->call.out = r->t + call->nin;
    c->cap->n++;
    return ENG_STATUS_OK;
}

eng_status sim_graph_record_copy(krn_ctx *c, void *dst, const void *src, size_t n, int dst_dev, int src_dev) {
    sim_rec *r = rec_push(c);
    if (!r) return rec_refused(c);
    r->dst = dst;
    r->src = src;
    r->n = n;
    r->dst_dev = dst_dev;
    r->src_dev = src_dev;
    c->cap->n++;
    return ENG_STATUS_OK;
}

eng_status sim_graph_sync(krn_ctx *c) {
    if (!c->cap) {
        eng_status st = c->fault;
        if (st == ENG_STATUS_OK) return ENG_STATUS_OK;
        c->fault = ENG_STATUS_OK;
        return eng_err(st, "%s", c->fault_msg);
    }
    cap_invalidate(c->cap, "the context was synchronised during the capture");
    return eng_err(ENG_STATUS_INTERNAL, "sim:%d: synchronising a context that is capturing a graph (this invalidates "
                   "the capture)", c->dev);
}

void sim_graph_ctx_free(krn_ctx *c) {
    recs_free(c->cap->recs, c->cap->n);
    free(c->cap);
    c->cap = NULL;
}

eng_status sim_graph_begin(krn_ctx *c) {
    if (!c) return eng_err(ENG_STATUS_INTERNAL, "sim: graph capture without a context");
    if (c->cap) return eng_err(ENG_STATUS_INTERNAL, "sim:%d: a graph capture is already under way on this context", c->dev);
    c->cap = calloc(1, sizeof *c->cap);
    if (!c->cap) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "sim:%d: out of host memory for a graph capture", c->dev);
    return ENG_STATUS_OK;
}

eng_status sim_graph_end(krn_ctx *c, krn_graph **out) {
    if (out) *out = NULL;
    if (!c || !c->cap) return eng_err(ENG_STATUS_INTERNAL, "sim:%d: graph end without a capture", c ? c->dev : -1);
    sim_capture *cp = c->cap;
    c->cap = NULL; /* the context runs work again, whatever happens below */
    eng_status st = ENG_STATUS_OK;
    if (cp->invalid) {
        st = eng_err(ENG_STATUS_INTERNAL, "sim:%d: the graph capture was invalidated: %s", c->dev, cp->why);
    } else if (out) {
        krn_graph *g = malloc(sizeof *g);
        if (!g) {
            st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "sim:%d: out of host memory instantiating a graph", c->dev);
        } else {
            *g = (krn_graph){c->dev, cp->recs, cp->n};
            cp->recs = NULL;
            cp->n = 0;
            *out = g;
        }
    }
    recs_free(cp->recs, cp->n);
    free(cp);
    return st;
}

/* TENSORD_SIM_FAIL_GRAPH=N: nonzero if this launch is the N-th of the process. */
static int launch_should_fail(void) {
    static atomic_long launches;
    const char *e = getenv("TENSORD_SIM_FAIL_GRAPH");
    long n = atomic_fetch_add(&launches, 1) + 1;
    return e && *e && atol(e) == n;
}

/* A kernel record's tensors still sim memory (nothing freed since the capture); i: the offending one. */
static int rec_owned(const sim_rec *r, int *bad) {
    for (int i = 0; i < r->call.nin + r->call.nout; i++) {
        const eng_tensor *t = &r->t[i];
        if (!t->data || t->dtype == ENG_DTYPE_UNDEFINED) continue;
        size_t nb = eng_tensor_nbytes(t);
        if (nb && !sim_owns(t->data, nb)) {
            *bad = i;
            return 0;
        }
    }
    return 1;
}

eng_status sim_graph_launch(krn_ctx *c, krn_graph *g) {
    if (!c) return eng_err(ENG_STATUS_INTERNAL, "sim: graph launch without a context");
    if (c->cap) return eng_err(ENG_STATUS_INTERNAL, "sim:%d: graph launch on a context that is capturing", c->dev);
    if (g->dev != c->dev)
        return eng_err(ENG_STATUS_INTERNAL, "sim:%d: launch of a graph captured on sim:%d", c->dev, g->dev);
    ENG_TRY(sim_lost_check(c->dev, "a graph launch"));
    if (launch_should_fail())
        return eng_err(ENG_STATUS_INTERNAL, "sim:%d: injected graph launch failure (TENSORD_SIM_FAIL_GRAPH)", c->dev);
    for (int i = 0; i < g->n; i++) {
        sim_rec *r = &g->recs[i];
        eng_status st;
        if (!r->k) {
            st = sim_copy_in(c, r->dst, r->src, r->n, r->dst_dev, r->src_dev);
            if (st != ENG_STATUS_OK) return eng_err_prefix(st, "graph operation %d of %d (a copy): ", i + 1, g->n);
            continue;
        }
        int bad = -1;
        if (!rec_owned(r, &bad))
            return eng_err(ENG_STATUS_INTERNAL, "sim:%d: graph operation %d of %d: kernel '%s' %s %d is no longer device "
                           "memory (freed after the capture)", c->dev, i + 1, g->n, r->name,
                           bad < r->call.nin ? "input" : "output", bad < r->call.nin ? bad : bad - r->call.nin);
        krn_call call = r->call; /* the kernel may write call.state back: the recorded one stays */
        call.ctx = c;
        st = sim_exec_gate(c->dev, r->name);
        if (st == ENG_STATUS_OK) st = sim_kernel_run(r->k, &call, 0);
        if (st != ENG_STATUS_OK) { /* the launched work failed: as a CUDA fault, it surfaces at the next sync */
            if (c->fault == ENG_STATUS_OK) {
                c->fault = st;
                snprintf(c->fault_msg, sizeof c->fault_msg, "graph operation %d of %d (kernel '%s'): %s", i + 1, g->n,
                         r->name, eng_last_error());
            }
            break;
        }
    }
    return ENG_STATUS_OK;
}

void sim_graph_free(krn_graph *g) {
    if (!g) return;
    recs_free(g->recs, g->n);
    free(g);
}
