/* loader.c - loading versions off the poller: one detached thread per load, a deadline per load, and what
 * happens to a load that outlives it.
 *
 * A load (reg_load) is started under the registry lock by a reconcile step (registry-poll.c) and runs
 * srv_version_load on its own thread with no lock held, so neither the poller nor requests ever wait for it, and
 * a newer version's load never queues behind an older one that is stuck. When it ends, the thread takes the
 * lock once: a load still linked in r->loads publishes its version (AVAILABLE) or records the failure (END,
 * marked failed for the stamp it started with); then it kicks the poller, which retires what the new version
 * replaces.
 * Invariants:
 *   - The thread owns its reg_load and frees it last; r->loads links only loads nobody gave up on. A load is
 *     abandoned (unlinked, cancel set) when it passes --model_load_timeout_seconds (its version goes END with
 *     DEADLINE_EXCEEDED, marked failed), when its version leaves the policy, its model is unloaded or removed,
 *     or the registry closes. An abandoned thread keeps running to its end (srv_version_load stops early at
 *     its next step once cancel is set); whatever it built is then released without ever being published, and
 *     its metrics and status are not touched (the version may be loading again by then, under a new id).
 *   - The version object is loaded without a metrics handle (v->metrics is set just before it is published),
 *     and an abandoned thread records metrics only under mu and only while r->opts.metrics is set, so a thread
 *     that outlives srv_registry_free's grace period never touches freed metrics (srv_registry_free then
 *     leaves the registry allocated for it).
 *   - The outcome is recorded under poll_mu (then mu) and logged before poll_mu is dropped, so no reconcile step
 *     retires what a new version replaces, or starts the next load, before the "load" / "load_failed" line.
 *     Nothing that holds poll_mu ever waits for a loader.
 *   - r->nthreads counts loader threads still running; it drops as the thread's very last use of r.
 */
#define _GNU_SOURCE
#include "registry-impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The message without its "model 'm' version n: " prefix (the log line carries model and version). */
static const char *loader_reason(const char *msg, const char *model, int64_t version) {
    char pre[400];
    int n = snprintf(pre, sizeof pre, "model '%s' version %lld: ", model, (long long)version);
    if (n > 0 && (size_t)n < sizeof pre && strncmp(msg, pre, (size_t)n) == 0) return msg + n;
    return msg;
}

static void loader_unlink(srv_registry *r, reg_load *l) {
    for (reg_load **p = &r->loads; *p; p = &(*p)->next)
        if (*p == l) {
            *p = l->next;
            break;
        }
    l->next = NULL;
}

static void loader_free(reg_load *l) {
    free(l->model);
    free(l->base);
    free(l->device);
    free(l);
}

static void *loader_main(void *arg) {
    reg_load *l = arg;
    srv_registry *r = l->r;
    srv_log(SRV_LOG_INFO, "load_start", l->model, l->version, "loading %s/%lld (timeout %g s)", l->base,
            (long long)l->version, reg_load_timeout_s(r));
    srv_version_ctx ctx = {.reg = r, .id = l->id, .session_threads = r->opts.session_threads,
                           .instances = l->instances, .instances_set = l->instances_set, .device = l->device,
                           .batching = r->opts.batching, .metrics = NULL, .cancel = &l->cancel,
                           .precision = l->precision};
    srv_version *v = NULL;
    srv_error err = {0};
    srv_code c = srv_version_load(&ctx, l->model, l->base, l->version, &v, &err);
    double secs = (double)(srv_now_us() - l->start_us) / 1e6;

    double load_ms = 0;
    size_t wbytes = 0;
    int ninst = 0;
    char path[4200] = "", devs[SRV_DEVICE_SPEC_MAX + 1] = "";
    if (c == SRV_OK) { /* copied now: once published, v may be retired and freed at any time */
        load_ms = v->info.load_ms;
        wbytes = v->info.weight_bytes;
        ninst = v->ninst;
        snprintf(path, sizeof path, "%s", v->path);
        snprintf(devs, sizeof devs, "%s", v->devices);
    }
    /* Published (or failed) under poll_mu too, and logged before poll_mu is dropped: no reconcile step can act on
     * the outcome (retire what it replaces, load the next version) before its log line is out. */
    pthread_mutex_lock(&r->poll_mu);
    pthread_mutex_lock(&r->mu);
    int kept = !l->abandoned;
    const char *why = l->why;
    if (kept) {
        loader_unlink(r, l);
        reg_model *m = reg_find_model_gen(r, l->model, l->gen);
        reg_ver *e = m ? reg_find_ver(m, l->version) : NULL;
        if (!e || e->load_id != l->id) {
            kept = 0; /* not expected: abandon() unlinks; kept for safety */
            why = "its version entry is gone";
        } else if (c == SRV_OK) {
            v->metrics = r->opts.metrics;
            e->v = v;
            e->load_id = 0;
            e->state = SRV_STATE_AVAILABLE;
            e->failed = 0;
            reg_set_error(e, SRV_OK, NULL);
            if (r->opts.metrics) {
                srv_metrics_load(r->opts.metrics, l->model, l->version, v->info.load_ms, v->info.weight_bytes);
                srv_version_metrics_instances(v);
                srv_metrics_swap(r->opts.metrics, l->model, l->version, "load");
                srv_metrics_state(r->opts.metrics, l->model, l->version, SRV_STATE_AVAILABLE);
            }
        } else {
            e->load_id = 0;
            e->state = SRV_STATE_END;
            e->failed = 1;
            e->failed_stamp = l->stamp;
            reg_set_error(e, c, err.msg);
            if (r->opts.metrics) srv_metrics_swap(r->opts.metrics, l->model, l->version, "load_failed");
        }
    }
    pthread_mutex_unlock(&r->mu);
    if (kept && c == SRV_OK)
        srv_log(SRV_LOG_INFO, "load", l->model, l->version,
                "loaded in %.1f ms, %zu weight bytes, %d execution instance%s on %s, from %s", load_ms, wbytes, ninst,
                ninst == 1 ? "" : "s", devs, path);
    else if (kept)
        srv_log(SRV_LOG_ERROR, "load_failed", l->model, l->version, "%s (after %.2f s)",
                loader_reason(err.msg, l->model, l->version), secs);
    else
        srv_log(SRV_LOG_WARN, "load_discarded", l->model, l->version,
                "a load abandoned earlier (%s) ended after %.2f s (%s); its result was discarded", why ? why : "",
                secs, c == SRV_OK ? "it had succeeded" : loader_reason(err.msg, l->model, l->version));
    pthread_mutex_unlock(&r->poll_mu);
    if (!kept && v) srv_version_release(v); /* never published: destroyed here, status and metrics untouched */
    pthread_mutex_lock(&r->mu);
    r->load_events++;
    pthread_cond_broadcast(&r->load_cv);
    pthread_mutex_unlock(&r->mu);

    pthread_mutex_lock(&r->thr_mu); /* the poller retires what this version replaces */
    r->kick = 1;
    pthread_cond_broadcast(&r->thr_cv);
    pthread_mutex_unlock(&r->thr_mu);

    pthread_mutex_lock(&r->mu);
    r->nthreads--;
    pthread_cond_broadcast(&r->load_cv);
    pthread_mutex_unlock(&r->mu); /* last use of r: srv_registry_free may free it now */
    loader_free(l);
    return NULL;
}

int reg_load_start(srv_registry *r, reg_model *m, reg_ver *e, const srv_bundle_stamp *stamp, reg_notes *ns) {
    reg_load *l = calloc(1, sizeof *l);
    if (l) {
        l->model = strdup(m->cfg.name);
        l->base = strdup(m->cfg.base_path);
        l->device = strdup(m->cfg.device ? m->cfg.device : r->opts.device);
    }
    const char *fail = NULL;
    if (r->closing) fail = "the registry is shutting down";
    else if (!l || !l->model || !l->base || !l->device) fail = "out of memory starting the load";
    if (!fail) {
        l->r = r;
        l->gen = m->gen;
        l->version = e->version;
        l->instances = srv_instances_resolve(m->cfg.instance_count, r->opts.instances_per_version,
                                             r->opts.session_threads);
        l->instances_set = m->cfg.instance_count > 0 || r->opts.instances_per_version > 0;
        l->precision = m->cfg.precision_set ? m->cfg.precision : -1;
        l->id = ++r->next_id;
        if (stamp) l->stamp = *stamp;
        l->start_us = srv_now_us();
        l->deadline_us = l->start_us + (int64_t)(reg_load_timeout_s(r) * 1e6);
        atomic_init(&l->cancel, 0);
        pthread_attr_t a;
        pthread_t t;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        r->live++; /* the version object; dropped by srv_registry_version_ended when it is destroyed */
        r->nthreads++;
        l->next = r->loads;
        r->loads = l;
        e->state = SRV_STATE_LOADING;
        e->load_id = e->last_load_id = l->id;
        reg_set_error(e, SRV_OK, NULL);
        int rc = pthread_create(&t, &a, loader_main, l);
        pthread_attr_destroy(&a);
        if (rc == 0) {
            reg_metrics_state(r, m->cfg.name, e->version, SRV_STATE_LOADING);
            return 0;
        }
        loader_unlink(r, l);
        r->live--;
        r->nthreads--;
        e->load_id = 0;
        fail = "cannot start a loader thread";
    }
    char msg[SRV_ERR_MAX];
    snprintf(msg, sizeof msg, "model '%s' version %lld: %s", m->cfg.name, (long long)e->version, fail);
    e->state = SRV_STATE_END;
    reg_set_error(e, SRV_RESOURCE_EXHAUSTED, msg);
    reg_note_add(ns, SRV_LOG_ERROR, "load_failed", m->cfg.name, e->version, "%s", fail);
    if (l) loader_free(l);
    return -1;
}

void reg_load_abandon(srv_registry *r, reg_load *l, srv_code code, const char *msg, int failed, reg_notes *ns) {
    loader_unlink(r, l);
    l->abandoned = 1;
    l->why = code == SRV_DEADLINE_EXCEEDED ? "timed out" : "cancelled";
    atomic_store(&l->cancel, 1);
    r->load_events++;
    pthread_cond_broadcast(&r->load_cv);
    reg_model *m = reg_find_model_gen(r, l->model, l->gen);
    reg_ver *e = m ? reg_find_ver(m, l->version) : NULL;
    if (e && e->load_id == l->id) {
        char full[SRV_ERR_MAX];
        snprintf(full, sizeof full, "model '%s' version %lld: %s", l->model, (long long)l->version, msg);
        e->load_id = 0;
        e->state = SRV_STATE_END;
        reg_set_error(e, code, full);
        if (failed) {
            e->failed = 1;
            e->failed_stamp = l->stamp;
        }
        if (r->opts.metrics) {
            if (failed) srv_metrics_swap(r->opts.metrics, l->model, l->version, "load_failed");
            srv_metrics_forget(r->opts.metrics, l->model, l->version);
        }
    }
    reg_note_add(ns, failed ? SRV_LOG_ERROR : SRV_LOG_INFO, failed ? "load_failed" : "load_cancelled", l->model,
                 l->version, "%s", msg);
}

void reg_load_expire(srv_registry *r, reg_notes *ns) {
    int64_t now = srv_now_us();
    for (reg_load *l = r->loads, *next; l; l = next) {
        next = l->next;
        if (now < l->deadline_us) continue;
        char msg[300];
        snprintf(msg, sizeof msg,
                 "load took longer than --model_load_timeout_seconds=%g (still running after %.1f s); the version is "
                 "not served, and the load's late result will be discarded",
                 reg_load_timeout_s(r), (double)(now - l->start_us) / 1e6);
        reg_load_abandon(r, l, SRV_DEADLINE_EXCEEDED, msg, 1, ns);
    }
}

int64_t reg_load_next_deadline(srv_registry *r) {
    int64_t d = 0;
    for (const reg_load *l = r->loads; l; l = l->next)
        if (!d || l->deadline_us < d) d = l->deadline_us;
    return d;
}

void reg_load_wait(srv_registry *r, uint64_t seen, int64_t until_us) {
    while (!r->closing && r->load_events == seen) {
        int64_t d = reg_load_next_deadline(r);
        if (until_us > 0 && (!d || until_us < d)) d = until_us;
        if (!d) { /* nothing in flight: only an event can change anything */
            pthread_cond_wait(&r->load_cv, &r->mu);
            continue;
        }
        if (srv_now_us() >= d) return;
        /* srv_now_us is CLOCK_MONOTONIC, the clock load_cv waits on */
        struct timespec ts = {(time_t)(d / 1000000), (long)(d % 1000000) * 1000};
        pthread_cond_timedwait(&r->load_cv, &r->mu, &ts);
    }
}
