/* version.c - a loaded, served version of a model (the registry's srv_version): srv_version_load reads the
 * signature (server/bundle.c), parses model.onnx once and builds the version's execution instances from copies
 * of the graph, starts the batcher and replays the warm-up file on every instance; predict checks inputs against
 * the signature and runs them on a free instance directly or through the batcher.
 *
 * Invariants:
 *  - A loaded version is immutable after srv_version_load except for its atomic refcount, its run-time
 *    estimates (row_ns, slow_runs, each instance's arena_bytes) and which instances are busy (inst_mu).
 *  - A run holds one instance from before eng_session_run until its outputs are copied out (session outputs are
 *    views); instances share nothing mutable, so runs on different instances proceed at once. A run takes the
 *    lowest-numbered free instance (so light traffic keeps to the instances whose plans are compiled and whose
 *    memory is warm) and waits on inst_cv while all are busy, up to the request's deadline.
 *  - It is destroyed by whoever drops the last reference, which then tells the registry
 *    (srv_registry_version_ended) as its very last step: the registry may be freed right after.
 *  - Warm-up records (<version>/assets.extra/warmup.jsonl, TF Serving's PredictRequest JSON lines, at most
 *    1000) all run, each on every instance in turn, before the version is returned (so load time grows with the
 *    instance count); one failure fails the load.
 *  - Devices (server/device.h): instance i runs on the spec's device i % n, with its own session (so its own
 *    plans, device buffers and stream). On a device, each instance compiles a one-row plan at load (the device
 *    probe), so running out of device memory fails the load, naming the device; device memory held (the weights
 *    once per instance, each cached plan's activations: eng_session_device_bytes) is reported per device
 *    (tensord_device_memory_bytes).
 *  - Device health: a run that fails on a device the backend reports lost (a sticky error) fails INTERNAL, naming
 *    the device and saying it is lost; that instance (and every instance on a lost device, seen at the next take)
 *    takes no more runs, and the others carry the traffic. With none left a take fails UNAVAILABLE at once, and
 *    the registry retires the version (srv_registry_sweep_lost), so it goes not-ready with the reason in its status.
 */
#define _GNU_SOURCE
#include "version.h"
#include "../engine/plan/plan.h"

#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../engine/bundle.h"
#include "../engine/ir/onnx.h"
#include "codec.h"
#include "log.h"

#define WARMUP_MAX_RECORDS 1000 /* TF Serving's limit */
#define WARMUP_MAX_LINE ((size_t)64 << 20)

/* Destroys v (refs reached zero or it never was published) and tells the registry it is gone. */
void srv_version_destroy(srv_version *v) {
    srv_registry *r = v->reg;
    srv_batcher_free(&v->batcher); /* first: its threads run on the instances */
    for (int i = 0; v->inst && i < v->ninst_alloc; i++) {
        eng_session_free(&v->inst[i].sess);
    }
    free(v->inst);
    pthread_mutex_destroy(&v->dev_mu);
    pthread_cond_destroy(&v->inst_cv);
    pthread_mutex_destroy(&v->inst_mu);
    srv_bundle_sig_free(&v->sig);
    uint64_t id = v->id;
    int64_t version = v->version;
    char *model = v->model;
    free(v->path);
    free(v);
    srv_registry_version_ended(r, model, version, id); /* last: the registry may be freed right after */
    free(model);
}

void srv_version_release(srv_version *v) {
    if (v && atomic_fetch_sub_explicit(&v->refs, 1, memory_order_acq_rel) == 1) srv_version_destroy(v);
}

const srv_version_info *srv_version_get_info(const srv_version *v) { return v ? &v->info : NULL; }

int srv_version_instances(const srv_version *v) { return v ? v->ninst : 0; }

const char *srv_version_instance_device(const srv_version *v, int i, int *gpu) {
    if (!v || i < 0 || i >= v->ninst) {
        if (gpu) *gpu = -1;
        return "";
    }
    if (gpu) *gpu = v->inst[i].dev.host ? -1 : v->inst[i].dev.index;
    return v->inst[i].dev.name;
}

int srv_instances_resolve(int model_count, int server_count, int session_threads) {
    int n = model_count > 0 ? model_count : server_count;
    if (n <= 0) {
        cpu_set_t set;
        int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
        if (cores <= 0) cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
        n = session_threads > 0 && cores > session_threads ? cores / session_threads : 1;
    }
    return n < 1 ? 1 : n > SRV_MAX_INSTANCES ? SRV_MAX_INSTANCES : n;
}

/* Records device memory per (non-host) device of v's instances: the sum of their dev_bytes. */
static void version_metrics_devices(srv_version *v) {
    if (!v->metrics) return;
    const char *names[SRV_MAX_INSTANCES];
    size_t bytes[SRV_MAX_INSTANCES];
    int n = 0;
    pthread_mutex_lock(&v->dev_mu); /* two instances of one device: the last sum recorded is the latest */
    for (int i = 0; i < v->ninst; i++) {
        if (v->inst[i].dev.host) continue;
        int k = 0;
        while (k < n && strcmp(names[k], v->inst[i].dev.name) != 0) k++;
        if (k == n) names[n] = v->inst[i].dev.name, bytes[n++] = 0;
        bytes[k] += atomic_load_explicit(&v->inst[i].dev_bytes, memory_order_relaxed);
    }
    srv_metrics_device_memory(v->metrics, v->model, v->version, n, names, bytes);
    pthread_mutex_unlock(&v->dev_mu);
}

void srv_version_metrics_instances(srv_version *v) {
    if (!v->metrics) return;
    size_t bytes[SRV_MAX_INSTANCES];
    for (int i = 0; i < v->ninst; i++)
        bytes[i] = v->inst[i].weight_bytes + atomic_load_explicit(&v->inst[i].arena_bytes, memory_order_relaxed);
    srv_metrics_instances(v->metrics, v->model, v->version, v->ninst, bytes);
    version_metrics_devices(v);
}

/* After a successful run on device instance `in` (held): the session's device memory now; 1 when it changed. */
static int version_device_note(srv_instance *in) {
    if (in->dev.host) return 0;
    size_t sum = eng_session_device_bytes(in->sess);
    return atomic_exchange_explicit(&in->dev_bytes, sum, memory_order_relaxed) != sum;
}

#define VERR(code, ...) verr(err, code, v, __VA_ARGS__)
static srv_code verr(srv_error *err, srv_code code, const srv_version *v, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static srv_code verr(srv_error *err, srv_code code, const srv_version *v, const char *fmt, ...) {
    char m[SRV_ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    return srv_err(err, code, "model '%s' version %lld: %s", v->model, (long long)v->version, m);
}

static void io_list(const srv_io *io, int n, char *buf, size_t cap) {
    size_t off = 0;
    buf[0] = 0;
    for (int i = 0; i < n && off < cap; i++) {
        int w = snprintf(buf + off, cap - off, "%s'%s'", i ? ", " : "", io[i].name);
        if (w < 0) break;
        off += (size_t)w;
    }
}

/* Rows of a request: dim 0 of its first input (1 for a scalar or an empty batch). */
static int64_t version_rows(const srv_tensors *in) {
    return in->n > 0 && in->t[0].ndim > 0 && in->t[0].dims[0] > 1 ? in->t[0].dims[0] : 1;
}

/* Runs this quick are not counted in slow_runs; the REST server's inline budget (rest.c) is the same. */
#define VERSION_QUICK_US 1000

static int version_quick_est(srv_version *v, int64_t rows, int64_t budget_us) {
    int64_t ns = atomic_load_explicit(&v->row_ns, memory_order_relaxed);
    return ns > 0 && rows <= budget_us * 1000 / ns;
}

/* With N instances, a quick request waits at most for a quick run as long as fewer than N runs in progress or
 * waiting are slow ones (N = 1: none, the rule before instances). */
int srv_version_quick(srv_version *v, const srv_tensors *in, int64_t budget_us) {
    return v && !v->batcher && atomic_load_explicit(&v->slow_runs, memory_order_relaxed) < v->ninst &&
           version_quick_est(v, version_rows(in), budget_us);
}

int srv_version_all_lost(const srv_version *v, char *why, size_t cap) {
    char reason[512];
    const srv_device *first = NULL;
    if (why && cap) why[0] = 0;
    for (int i = 0; i < v->ninst; i++) {
        const srv_device *d = &v->inst[i].dev;
        if (d->host || !krn_backend_device_lost(d->backend, d->index, first ? NULL : reason, sizeof reason)) return 0;
        if (!first) first = d;
    }
    if (!first) return 0;
    if (why && cap) snprintf(why, cap, "device %s is lost (%s)", first->name, reason);
    return 1;
}

/* A device of v was found lost (a run failed there, or a take saw it): its tensord_device_lost series, and the
 * registry's sweep, which retires every version left with no working instance. No lock held. */
static void version_lost_notice(srv_version *v) {
    for (int i = 0; i < v->ninst; i++)
        if (srv_device_lost(&v->inst[i].dev, NULL, 0)) srv_metrics_device_lost(v->metrics, v->inst[i].dev.name);
    if (v->reg) srv_registry_sweep_lost(v->reg);
}

/* Takes a free instance (the pinned one while warming up), waiting while all are busy; DEADLINE_EXCEEDED when
 * deadline_us (> 0) passes first, CANCELLED when *cancel turns non-zero (SRV_CANCEL_DEADLINE: DEADLINE_EXCEEDED),
 * checked every 10 ms while waiting. Instances on a lost device are skipped (marked lost the first time one is
 * seen); when none is left (or the pinned one is lost): UNAVAILABLE at once, naming the device, without waiting. */
static srv_code version_take(srv_version *v, int64_t deadline_us, const atomic_int *cancel, int *idx, srv_error *err) {
    int newly = 0;
    srv_code c = SRV_OK;
    pthread_mutex_lock(&v->inst_mu);
    for (;;) {
        int gone = cancel ? atomic_load(cancel) : 0;
        if (gone) {
            c = gone == SRV_CANCEL_DEADLINE
                    ? VERR(SRV_DEADLINE_EXCEEDED, "deadline exceeded while waiting for a free execution instance")
                    : VERR(SRV_CANCELLED, "the client cancelled the request while it waited for a free execution "
                           "instance");
            break;
        }
        int k = -1, nlost = 0;
        for (int i = 0; i < v->ninst; i++) {
            srv_instance *in = &v->inst[i];
            if (!in->lost && srv_device_lost(&in->dev, NULL, 0)) in->lost = newly = 1;
            nlost += in->lost;
            if (v->pin < 0 && k < 0 && !in->lost && !in->busy) k = i;
        }
        if (v->pin >= 0) k = v->inst[v->pin].busy || v->inst[v->pin].lost ? -1 : v->pin;
        if (k >= 0) {
            v->inst[k].busy = 1;
            *idx = k;
            break;
        }
        if (nlost == v->ninst || (v->pin >= 0 && v->inst[v->pin].lost)) {
            char why[512];
            srv_version_all_lost(v, why, sizeof why);
            c = VERR(SRV_UNAVAILABLE, "%s; it cannot run until the server is restarted", why[0] ? why : "its device is lost");
            break;
        }
        int64_t now = srv_now_us();
        if (deadline_us > 0 && now >= deadline_us) {
            c = VERR(SRV_DEADLINE_EXCEEDED, "deadline exceeded while waiting for a free execution instance (all %d "
                     "busy)", v->ninst - nlost);
            break;
        }
        if (deadline_us > 0 || cancel) { /* inst_cv waits on CLOCK_MONOTONIC, srv_now_us's clock */
            int64_t until = cancel && (deadline_us <= 0 || deadline_us > now + 10000) ? now + 10000 : deadline_us;
            struct timespec ts = {(time_t)(until / 1000000), (long)(until % 1000000) * 1000};
            pthread_cond_timedwait(&v->inst_cv, &v->inst_mu, &ts);
        } else {
            pthread_cond_wait(&v->inst_cv, &v->inst_mu);
        }
    }
    pthread_mutex_unlock(&v->inst_mu);
    if (newly) version_lost_notice(v);
    return c;
}

/* Gives instance idx back; lost: its device was lost during the run (it takes no more, and every waiter rechecks,
 * since the last working instance may be gone). */
static void version_give(srv_version *v, int idx, int lost) {
    pthread_mutex_lock(&v->inst_mu);
    v->inst[idx].busy = 0;
    if (lost) {
        v->inst[idx].lost = 1;
        pthread_cond_broadcast(&v->inst_cv);
    } else {
        pthread_cond_signal(&v->inst_cv);
    }
    pthread_mutex_unlock(&v->inst_mu);
}

/* After a successful run on instance idx (held): fold the run time into row_ns (exponential average, 1/8), the
 * plan's arena into the instance's largest, and (devices) note the session's device memory. */
static void version_note_run(srv_version *v, int idx, int64_t run_us, int64_t rows) {
    int64_t ns = run_us * 1000 / rows, old = atomic_load_explicit(&v->row_ns, memory_order_relaxed), upd;
    do upd = old ? old + (ns - old) / 8 : (ns > 0 ? ns : 1);
    while (!atomic_compare_exchange_weak_explicit(&v->row_ns, &old, upd, memory_order_relaxed, memory_order_relaxed));
    srv_instance *in = &v->inst[idx];
    eng_plan_stats st;
    eng_session_last_stats(in->sess, &st);
    if (st.arena_bytes > atomic_load_explicit(&in->arena_bytes, memory_order_relaxed)) {
        atomic_store_explicit(&in->arena_bytes, st.arena_bytes, memory_order_relaxed); /* only its holder writes */
        if (v->metrics) srv_metrics_instance_bytes(v->metrics, v->model, v->version, idx, in->weight_bytes + st.arena_bytes);
    }
    if (version_device_note(in)) version_metrics_devices(v);
}

/* Runs the inputs named by client names (any order) on a free instance; out gets the signature's outputs as
 * copies. out is emptied on error. */
static srv_code version_run_on(srv_version *v, const srv_tensors *in, srv_tensors *out, int64_t deadline_us,
                               const atomic_int *cancel, srv_error *err) {
    const eng_graph *g = eng_session_graph(v->inst[0].sess); /* every instance's graph has the same inputs/outputs */
    int nin = v->sig.ninputs;
    const char **names = calloc((size_t)nin + 1, sizeof *names);
    eng_tensor *feeds = calloc((size_t)nin + 1, sizeof *feeds);
    eng_tensor *outs = calloc((size_t)g->noutputs + 1, sizeof *outs);
    srv_code c = SRV_OK;
    if (!names || !feeds || !outs) c = VERR(SRV_RESOURCE_EXHAUSTED, "out of memory");
    for (int i = 0; i < nin && c == SRV_OK; i++) {
        int k = srv_tensors_find(in, v->sig.inputs[i].name);
        if (k < 0) c = VERR(SRV_INVALID_ARGUMENT, "missing input '%s'", v->sig.inputs[i].name);
        else {
            names[i] = v->sig.inputs[i].onnx_name;
            feeds[i] = in->t[k];
        }
    }
    int64_t rows = version_rows(in);
    int slow = !version_quick_est(v, rows, VERSION_QUICK_US);
    if (slow) atomic_fetch_add_explicit(&v->slow_runs, 1, memory_order_relaxed);
    int idx = -1;
    if (c == SRV_OK) c = version_take(v, deadline_us, cancel, &idx, err);
    if (c == SRV_OK) {
        int64_t t0 = srv_now_us(), r0 = srv_metrics_clock_ns(); /* r*: Triton statistics (srv_metrics_run) */
        int64_t dl0 = eng_run_deadline(); /* a batch's is set by the batcher */
        if (deadline_us > 0) eng_run_set_deadline(deadline_us); /* ops that loop stop there (Loop, Scan) */
        eng_status st = eng_session_run(v->inst[idx].sess, nin, names, feeds, outs);
        eng_run_set_deadline(dl0);
        int64_t r1 = srv_metrics_clock_ns();
        int lost = 0;
        if (st == ENG_STATUS_OK) version_note_run(v, idx, srv_now_us() - t0, rows);
        else {
            char pre[512];
            const srv_device *d = &v->inst[idx].dev;
            lost = srv_device_lost(d, NULL, 0) != 0; /* a sticky error: this batch fails INTERNAL, later ones skip d */
            snprintf(pre, sizeof pre, "model '%s' version %lld: inference failed%s%s%s", v->model, (long long)v->version,
                     d->host ? "" : " on device ", d->host ? "" : d->name,
                     lost ? ", which is now lost (the server must be restarted to use it again)" : "");
            c = srv_err_from_eng(err, st, pre);
        }
        for (int i = 0; i < v->sig.noutputs && c == SRV_OK; i++)
            if (outs[v->sig.out_index[i]].dtype == ENG_DTYPE_SEQUENCE) /* an output the model left undeclared */
                c = VERR(SRV_UNIMPLEMENTED, "output '%s' is a sequence of tensors: tensord serves tensor outputs",
                         v->sig.outputs[i].name);
            else if (srv_tensors_add_copy(out, v->sig.outputs[i].name, &outs[v->sig.out_index[i]]) != 0)
                c = VERR(SRV_RESOURCE_EXHAUSTED, "cannot copy output '%s' (out of memory or too large)",
                         v->sig.outputs[i].name);
        int64_t r2 = srv_metrics_clock_ns();
        version_give(v, idx, lost);
        if (c == SRV_OK) srv_metrics_run(v->metrics, v->model, v->version, rows, r0, r1, r2);
        if (lost) version_lost_notice(v);
    }
    if (slow) atomic_fetch_sub_explicit(&v->slow_runs, 1, memory_order_relaxed);
    if (c != SRV_OK) srv_tensors_free(out);
    free(names);
    free(feeds);
    free(outs);
    return c;
}

/* The batcher's run function: a batch runs on a free instance, however long it waits (each request in it was
 * checked against its deadline by the batcher). */
static srv_code version_run(void *ctx, const srv_tensors *in, srv_tensors *out, srv_error *err) {
    return version_run_on(ctx, in, out, 0, NULL, err);
}

static void version_observe(void *ctx, int64_t rows, int64_t padded_rows, int64_t queue_us) {
    srv_version *v = ctx;
    if (!v->metrics) return;
    srv_metrics_batch(v->metrics, v->model, v->version, rows, padded_rows);
    srv_metrics_queue(v->metrics, v->model, v->version, queue_us);
}

static srv_code check_input(const srv_version *v, const srv_io *io, const eng_tensor *t, srv_error *err) {
    char a[160], b[160];
    if (io->dtype != ENG_DTYPE_UNDEFINED && t->dtype != io->dtype)
        return VERR(SRV_INVALID_ARGUMENT, "input '%s': expected dtype %s, got %s", io->name, eng_dtype_name(io->dtype),
                    eng_dtype_name(t->dtype));
    if (t->ndim < 0 || t->ndim > ENG_MAX_DIMS)
        return VERR(SRV_INVALID_ARGUMENT, "input '%s': invalid rank %d", io->name, t->ndim);
    int bad = io->ndim >= 0 && io->ndim != t->ndim;
    for (int d = 0; !bad && io->ndim >= 0 && d < t->ndim; d++) bad = io->dims[d] >= 0 && io->dims[d] != t->dims[d];
    for (int d = 0; !bad && d < t->ndim; d++) bad = t->dims[d] < 0;
    if (bad)
        return VERR(SRV_INVALID_ARGUMENT, "input '%s': expected shape %s, got %s", io->name,
                    io->ndim >= 0 ? eng_shape_str(io->dims, io->ndim, a, sizeof a) : "(any)",
                    eng_shape_str(t->dims, t->ndim, b, sizeof b));
    /* Zero-element inputs never reach the kernels (several have no zero-sized primitive): refused here, for
     * every front door, rather than failing inside the run. */
    for (int d = 0; d < t->ndim; d++)
        if (t->dims[d] == 0)
            return VERR(SRV_INVALID_ARGUMENT,
                        d == 0 ? "input '%s': shape %s is an empty batch (dim 0 is 0): send at least one row"
                               : "input '%s': shape %s has no elements (dim %d is 0): empty tensors are not served",
                        io->name, eng_shape_str(t->dims, t->ndim, b, sizeof b), d);
    return SRV_OK;
}

/* The inputs in signature order (a view: borrowed names and tensor data; names/ts are calloc'd for the caller
 * to free), after checking names, dtypes and shapes. *batchable: every input has a batch dimension. */
static srv_code version_view(srv_version *v, const srv_tensors *in, char ***names_out, eng_tensor **ts_out,
                             int *batchable, srv_error *err) {
    char list[1024];
    int nin = v->sig.ninputs;
    *names_out = NULL, *ts_out = NULL;
    for (int k = 0; k < in->n; k++) {
        int known = 0;
        for (int i = 0; i < nin && !known; i++) known = strcmp(v->sig.inputs[i].name, in->names[k]) == 0;
        if (!known) {
            io_list(v->sig.inputs, nin, list, sizeof list);
            return VERR(SRV_INVALID_ARGUMENT, "unknown input '%s'; expected inputs: %s", in->names[k], list);
        }
        for (int j = 0; j < k; j++)
            if (strcmp(in->names[j], in->names[k]) == 0)
                return VERR(SRV_INVALID_ARGUMENT, "input '%s' given twice", in->names[k]);
    }
    char **names = calloc((size_t)nin + 1, sizeof *names);
    eng_tensor *ts = calloc((size_t)nin + 1, sizeof *ts);
    srv_code c = (names && ts) ? SRV_OK : VERR(SRV_RESOURCE_EXHAUSTED, "out of memory");
    *batchable = nin > 0;
    for (int i = 0; i < nin && c == SRV_OK; i++) {
        const srv_io *io = &v->sig.inputs[i];
        int k = srv_tensors_find(in, io->name);
        if (k < 0) {
            io_list(v->sig.inputs, nin, list, sizeof list);
            c = VERR(SRV_INVALID_ARGUMENT, "missing input '%s'; expected inputs: %s", io->name, list);
            break;
        }
        c = check_input(v, io, &in->t[k], err);
        names[i] = in->names[k];
        ts[i] = in->t[k];
        if (ts[i].ndim < 1) *batchable = 0;
    }
    if (c != SRV_OK) {
        free(names);
        free(ts);
        return c;
    }
    *names_out = names, *ts_out = ts;
    return SRV_OK;
}

srv_code srv_version_predict(srv_version *v, const srv_tensors *in, srv_tensors *out, int64_t deadline_us,
                             const atomic_int *cancel, srv_error *err) {
    if (deadline_us > 0 && srv_now_us() >= deadline_us)
        return VERR(SRV_DEADLINE_EXCEEDED, "deadline exceeded before the request ran");
    char **names;
    eng_tensor *ts;
    int batchable;
    srv_code c = version_view(v, in, &names, &ts, &batchable, err);
    if (c == SRV_OK) {
        srv_tensors view = {.n = v->sig.ninputs, .names = names, .t = ts};
        if (v->batcher && batchable) c = srv_batcher_submit(v->batcher, &view, out, deadline_us, err);
        else c = version_run_on(v, &view, out, deadline_us, cancel, err);
    }
    free(names);
    free(ts);
    return c;
}

typedef struct version_async { /* one asynchronous request: its signature-order view and the caller's callback */
    srv_tensors view;
    srv_batch_done_fn done;
    void *arg;
} version_async;

static void version_async_done(void *arg, srv_code code, const srv_error *err) {
    version_async *a = arg;
    srv_batch_done_fn done = a->done;
    void *darg = a->arg;
    free(a->view.names);
    free(a->view.t);
    free(a);
    done(darg, code, err);
}

int srv_version_predict_async(srv_version *v, const srv_tensors *in, srv_tensors *out, int64_t deadline_us,
                              const atomic_int *cancel, srv_batch_done_fn done, void *arg) {
    if (!v->batcher) return 0;
    srv_error e = {0}, *err = &e;
    char **names;
    eng_tensor *ts;
    int batchable = 0;
    srv_code c = deadline_us > 0 && srv_now_us() >= deadline_us
                     ? VERR(SRV_DEADLINE_EXCEEDED, "deadline exceeded before the request ran")
                     : version_view(v, in, &names, &ts, &batchable, err);
    if (c == SRV_OK && !batchable) {
        free(names);
        free(ts);
        return 0; /* not batched: the caller runs it */
    }
    version_async *a = c == SRV_OK ? calloc(1, sizeof *a) : NULL;
    if (c == SRV_OK && !a) {
        free(names);
        free(ts);
        c = VERR(SRV_RESOURCE_EXHAUSTED, "out of memory");
    }
    if (c != SRV_OK) {
        done(arg, c, err);
        return 1;
    }
    *a = (version_async){.view = {.n = v->sig.ninputs, .names = names, .t = ts}, .done = done, .arg = arg};
    srv_batcher_submit_async(v->batcher, &a->view, out, deadline_us, cancel, version_async_done, a);
    return 1;
}

static int version_cancelled(const srv_version_ctx *ctx) {
    return ctx->cancel && atomic_load_explicit(ctx->cancel, memory_order_relaxed);
}

static void version_pin(srv_version *v, int idx) {
    pthread_mutex_lock(&v->inst_mu);
    v->pin = idx;
    pthread_mutex_unlock(&v->inst_mu);
}

/* Replays the warm-up file, each record on every instance in turn (pinned, through the batcher when it batches
 * the record, as requests will run), so that every instance has compiled the plans the records need. */
static srv_code version_warmup(const srv_version_ctx *ctx, srv_version *v, srv_error *err) {
    char file[4096], why[SRV_ERR_MAX];
    if (snprintf(file, sizeof file, "%s/assets.extra/warmup.jsonl", v->path) >= (int)sizeof file)
        return VERR(SRV_INVALID_ARGUMENT, "warm-up path too long");
    int fd;
    uint64_t size;
    srv_code oc = srv_bundle_open(v->path, file, &fd, &size, why, sizeof why);
    if (oc == SRV_NOT_FOUND) return SRV_OK;
    if (oc != SRV_OK) return VERR(SRV_INVALID_ARGUMENT, "warm-up: %s", why);
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return VERR(SRV_RESOURCE_EXHAUSTED, "%s: cannot open: %s", file, strerror(errno));
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int lineno = 0, records = 0;
    srv_code c = SRV_OK;
    while (c == SRV_OK && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (version_cancelled(ctx)) {
            c = VERR(SRV_CANCELLED, "load cancelled during warm-up (at %s line %d)", file, lineno);
            break;
        }
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' ')) len--;
        size_t s = 0;
        while (s < (size_t)len && (line[s] == ' ' || line[s] == '\t')) s++;
        if (s == (size_t)len) continue;
        if ((size_t)len > WARMUP_MAX_LINE) {
            c = VERR(SRV_INVALID_ARGUMENT, "%s line %d: longer than %zu bytes", file, lineno, WARMUP_MAX_LINE);
            break;
        }
        if (++records > WARMUP_MAX_RECORDS) {
            c = VERR(SRV_INVALID_ARGUMENT, "%s: more than %d warm-up records", file, WARMUP_MAX_RECORDS);
            break;
        }
        srv_tensors in = {0}, out = {0};
        srv_tfs_format fmt;
        srv_error e = {0};
        srv_code rc = srv_tfs_decode_predict(line + s, (size_t)len - s, &v->info, &in, &fmt, &e);
        int i = 0;
        for (; rc == SRV_OK && i < v->ninst; i++) {
            version_pin(v, i);
            srv_tensors_free(&out);
            rc = srv_version_predict(v, &in, &out, 0, NULL, &e);
        }
        version_pin(v, -1);
        char on[48] = "";
        if (rc != SRV_OK && v->ninst > 1 && i > 0) snprintf(on, sizeof on, " on instance %d", i - 1);
        if (rc != SRV_OK) c = VERR(rc, "warm-up %s line %d failed%s: %s", file, lineno, on, e.msg);
        srv_tensors_free(&in);
        srv_tensors_free(&out);
    }
    if (c == SRV_OK && ferror(f)) c = VERR(SRV_INVALID_ARGUMENT, "%s: read error", file);
    free(line);
    fclose(f);
    return c;
}

static size_t graph_weight_bytes(const eng_graph *g) {
    size_t wb = 0;
    for (int i = 0; i < g->nvalues; i++)
        if (g->values[i].init) wb += eng_tensor_nbytes(g->values[i].init);
    return wb;
}

/* Builds ninst sessions: instance 0 from g0, the others from deep copies of g0 made before any session rewrites
 * it (eng_session_new_graph takes its graph and fuses it in place), so no two instances share a graph, a plan
 * or a buffer; each on its device (v->inst[i].dev). Takes g0 (freed on error too). v->ninst counts the sessions
 * built. */
static srv_code version_instances_new(const srv_version_ctx *ctx, srv_version *v, eng_graph *g0,
                                      const eng_session_opts *so, int ninst, const char *onnx, srv_error *err) {
    eng_graph **gs = calloc((size_t)ninst, sizeof *gs);
    srv_code c = gs ? SRV_OK : VERR(SRV_RESOURCE_EXHAUSTED, "out of memory");
    for (int i = 1; i < ninst && c == SRV_OK; i++) {
        if (version_cancelled(ctx)) c = VERR(SRV_CANCELLED, "load cancelled (building instance %d of %d)", i, ninst);
        else if (!(gs[i] = eng_graph_clone(g0)))
            c = VERR(SRV_RESOURCE_EXHAUSTED, "out of memory copying %s for execution instance %d of %d", onnx, i, ninst);
    }
    if (gs) gs[0] = g0;
    else eng_graph_free(&g0);
    for (int i = 0; i < ninst && c == SRV_OK; i++) {
        eng_session_opts sio = *so;
        sio.backend = v->inst[i].dev.backend;
        sio.device = v->inst[i].dev.index;
        eng_status st = eng_session_new_graph(gs[i], &sio, &v->inst[i].sess);
        gs[i] = NULL; /* taken, freed on error too */
        if (st != ENG_STATUS_OK) {
            char pre[4400], on[64] = "";
            if (!v->inst[i].dev.host) snprintf(on, sizeof on, " on %s", v->inst[i].dev.name);
            if (ninst > 1) snprintf(pre, sizeof pre, "model '%s' version %lld: loading %s (execution instance %d of %d%s)",
                                    v->model, (long long)v->version, onnx, i, ninst, on);
            else if (on[0]) snprintf(pre, sizeof pre, "model '%s' version %lld: loading %s (%s)", v->model,
                                     (long long)v->version, onnx, on + 1);
            else snprintf(pre, sizeof pre, "model '%s' version %lld: loading %s", v->model, (long long)v->version, onnx);
            c = srv_err_from_eng(err, st, pre);
            break;
        }
        v->inst[i].weight_bytes = graph_weight_bytes(eng_session_graph(v->inst[i].sess));
        v->ninst = i + 1;
    }
    for (int i = 0; gs && i < ninst; i++) eng_graph_free(&gs[i]);
    free(gs);
    return c;
}

/* Instance i on devs[i % ndev]; v->devices lists the distinct ones. */
static srv_code version_devices_set(srv_version *v, const srv_device *devs, int ndev, srv_error *err) {
    size_t len = 0;
    for (int i = 0; i < v->ninst_alloc; i++) {
        const srv_device *d = &devs[i % ndev];
        v->inst[i].dev = *d;
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = strcmp(v->inst[j].dev.name, d->name) == 0;
        if (!seen && len < sizeof v->devices) {
            int k = snprintf(v->devices + len, sizeof v->devices - len, "%s%s", len ? "," : "", d->name);
            len += k > 0 ? (size_t)k : 0;
        }
    }
    return SRV_OK;
}


/* Device instances compile one plan now, for a one-row batch of zeros (dims unknown past the batch dimension: no
 * probe, the first request plans): a version whose weights and activations do not fit the device fails its load
 * here, RESOURCE_EXHAUSTED naming the device. Any other failure of this made-up input is logged, not fatal. */
static srv_code version_device_probe(const srv_version_ctx *ctx, srv_version *v, srv_error *err) {
    int nin = v->sig.ninputs, any = 0;
    for (int i = 0; i < v->ninst; i++) any |= !v->inst[i].dev.host;
    if (!any) return SRV_OK;
    for (int i = 0; i < nin; i++) {
        const srv_io *io = &v->sig.inputs[i];
        if (io->ndim < 0 || eng_dtype_size(io->dtype) == 0) return SRV_OK;
        for (int d = 1; d < io->ndim; d++)
            if (io->dims[d] < 0) return SRV_OK;
    }
    const char **names = calloc((size_t)nin + 1, sizeof *names);
    eng_tensor *feeds = calloc((size_t)nin + 1, sizeof *feeds);
    eng_tensor *outs = calloc((size_t)eng_session_graph(v->inst[0].sess)->noutputs + 1, sizeof *outs);
    srv_code c = names && feeds && outs ? SRV_OK : VERR(SRV_RESOURCE_EXHAUSTED, "out of memory");
    for (int i = 0; i < nin && c == SRV_OK; i++) {
        const srv_io *io = &v->sig.inputs[i];
        names[i] = io->onnx_name;
        feeds[i].dtype = io->dtype;
        feeds[i].ndim = io->ndim;
        for (int d = 0; d < io->ndim; d++) feeds[i].dims[d] = io->dims[d] < 0 ? 1 : io->dims[d];
        size_t nb = eng_tensor_nbytes(&feeds[i]);
        if (!(feeds[i].data = calloc(1, nb ? nb : 1))) c = VERR(SRV_RESOURCE_EXHAUSTED, "out of memory");
    }
    for (int i = 0; i < v->ninst && c == SRV_OK; i++) {
        srv_instance *in = &v->inst[i];
        if (in->dev.host) continue;
        if (version_cancelled(ctx)) {
            c = VERR(SRV_CANCELLED, "load cancelled (compiling for %s)", in->dev.name);
            break;
        }
        eng_status st = eng_session_run(in->sess, nin, names, feeds, outs);
        if (st == ENG_STATUS_OK) {
            version_device_note(in);
        } else if (st == ENG_STATUS_OUT_OF_MEMORY) {
            char pre[600];
            snprintf(pre, sizeof pre, "model '%s' version %lld: does not fit device %s (execution instance %d of %d)",
                     v->model, (long long)v->version, in->dev.name, i, v->ninst);
            c = srv_err_from_eng(err, st, pre);
        } else {
            srv_log(SRV_LOG_WARN, "device_probe", v->model, v->version,
                    "compiling a one-row plan on %s (execution instance %d) failed; the first request plans instead: %s",
                    in->dev.name, i, eng_last_error());
        }
    }
    for (int i = 0; feeds && i < nin; i++) free(feeds[i].data);
    free(names);
    free(feeds);
    free(outs);
    return c;
}

/* Builds, plans and warms up a version with no registry lock held. *out has one reference (the registry's). */
srv_code srv_version_load(const srv_version_ctx *ctx, const char *model, const char *base, int64_t version,
                          srv_version **out, srv_error *err) {
    *out = NULL;
    int64_t t0 = srv_now_us();
    srv_version *v = calloc(1, sizeof *v);
    if (!v) {
        srv_registry_version_ended(ctx->reg, model, version, ctx->id);
        return srv_err(err, SRV_RESOURCE_EXHAUSTED, "model '%s' version %lld: out of memory", model,
                           (long long)version);
    }
    pthread_mutex_init(&v->inst_mu, NULL);
    pthread_mutex_init(&v->dev_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&v->inst_cv, &ca);
    pthread_condattr_destroy(&ca);
    v->pin = -1;
    atomic_init(&v->refs, 1);
    v->reg = ctx->reg;
    v->id = ctx->id;
    v->version = version;
    v->metrics = ctx->metrics;
    v->model = strdup(model);
    size_t plen = strlen(base) + 32;
    v->path = malloc(plen);
    srv_code c = SRV_OK;
    if (!v->model || !v->path) {
        c = VERR(SRV_RESOURCE_EXHAUSTED, "out of memory");
        goto fail;
    }
    eng_bundle_path(v->path, plen, base, version, NULL); /* fits: plen covers any int64 */
    srv_device devs[SRV_DEVICE_MAX];
    int ndev = 0;
    if ((c = srv_device_resolve(ctx->device, devs, &ndev, err)) != SRV_OK) {
        c = VERR(c, "%s", err->msg);
        goto fail;
    }
    if ((c = srv_bundle_sig_read(model, version, v->path, &v->sig, err)) != SRV_OK) goto fail;
    int ninst = ctx->instances < 1 ? 1 : ctx->instances > SRV_MAX_INSTANCES ? SRV_MAX_INSTANCES : ctx->instances;
    ninst = srv_device_instances(ctx->instances_set ? ninst : 0, ninst, devs, ndev);
    if (!(v->inst = calloc((size_t)ninst, sizeof *v->inst))) {
        c = VERR(SRV_RESOURCE_EXHAUSTED, "out of memory");
        goto fail;
    }
    v->ninst_alloc = ninst;
    if ((c = version_devices_set(v, devs, ndev, err)) != SRV_OK) goto fail;
    if (version_cancelled(ctx)) {
        c = VERR(SRV_CANCELLED, "load cancelled");
        goto fail;
    }
    if (ctx->precision >= 0) v->sig.precision = (eng_precision)ctx->precision; /* the model config's wins */
    eng_session_opts so = {.nthreads = ctx->session_threads, .precision = v->sig.precision};
    if (ctx->batching) {
        /* Batches come in every size up to max_batch_size (or the allowed sizes): keep a plan per size, or
         * the session's LRU of 16 plans re-plans (and re-JITs) most batches (seed CNN, 64 connections: +25 %
         * req/s for +95 MB RSS). Capped at 68: each plan holds its activation buffers. */
        int64_t want = (ctx->batching->nallowed > 0 ? ctx->batching->nallowed : ctx->batching->max_batch_size) + 4;
        so.max_plans = (int)(want < 16 ? 16 : want > 68 ? 68 : want);
    }
    char onnx[4200], why[SRV_ERR_MAX];
    eng_status st = eng_bundle_path(onnx, sizeof onnx, base, version, ENG_BUNDLE_MODEL_FILE);
    if (st == ENG_STATUS_OK) { /* through the bundle opener: inside the version directory, regular, non-blocking */
        char *buf;
        size_t blen;
        srv_code rc = srv_bundle_read(v->path, onnx, (size_t)INT32_MAX, &buf, &blen, why, sizeof why);
        if (rc != SRV_OK) {
            c = VERR(rc == SRV_RESOURCE_EXHAUSTED ? rc : SRV_INVALID_ARGUMENT, "%s", why); /* why names the file */
            goto fail;
        }
        eng_graph *g0 = NULL;
        st = eng_onnx_load_buffer(buf, blen, v->path, onnx, &g0);
        free(buf);
        if (st == ENG_STATUS_OK) c = version_instances_new(ctx, v, g0, &so, ninst, onnx, err);
        if (c != SRV_OK) goto fail;
    }
    if (st != ENG_STATUS_OK) {
        char pre[4400];
        snprintf(pre, sizeof pre, "model '%s' version %lld: loading %s", model, (long long)version, onnx);
        c = srv_err_from_eng(err, st, pre);
        goto fail;
    }
    const eng_graph *g = eng_session_graph(v->inst[0].sess);
    if ((c = srv_bundle_sig_resolve(model, version, v->path, g, &v->sig, err)) != SRV_OK) goto fail;
    if ((c = version_device_probe(ctx, v, err)) != SRV_OK) goto fail;
    size_t wb = v->inst[0].weight_bytes;
    v->info = (srv_version_info){
        .model = v->model, .version = version, .path = v->path,
        .inputs = v->sig.inputs, .ninputs = v->sig.ninputs, .outputs = v->sig.outputs, .noutputs = v->sig.noutputs,
        .labels = (const char *const *)v->sig.labels, .nlabels = v->sig.nlabels, .weight_bytes = wb};
    if (ctx->batching) {
        v->batcher = srv_batcher_new(ctx->batching, version_run, version_observe, v);
        if (!v->batcher) {
            c = VERR(SRV_RESOURCE_EXHAUSTED, "cannot start the batcher");
            goto fail;
        }
    }
    if (version_cancelled(ctx)) {
        c = VERR(SRV_CANCELLED, "load cancelled");
        goto fail;
    }
    if ((c = version_warmup(ctx, v, err)) != SRV_OK) goto fail;
    v->info.load_ms = (double)(srv_now_us() - t0) / 1000.0;
    *out = v;
    return SRV_OK;
fail:
    srv_version_destroy(v);
    return c;
}

