/* registry.c - the model registry's table: configured models, their versions' states, labels, status, the
 * request path's acquire, retiring versions, shutting down. Polling base paths, reconciling versions with their
 * policy and explicit model control (Triton's repository load/unload) are registry-poll.c's; the loader threads
 * are loader.c's; the version object itself (load, warm-up, predict, release) is version.c's; reading a base path
 * and signature.json is bundle.c's (over engine/bundle.c's version-name rule and scan). Locks: registry-impl.h.
 *
 * Invariants:
 *   - A published version (reg_ver.v != NULL) holds one reference owned by the registry; every acquire adds
 *     one, every release drops one. The object is destroyed when the count reaches zero, whoever drops last;
 *     its reg_ver entry then goes UNLOADING -> END (matched by the object's unique id, so a newer load of the
 *     same version number is never touched).
 *   - Availability first: a newly aspired version is published before the versions it replaces are retired,
 *     and a version that failed to load (or timed out) is left out of the aspired set, so a failed load never
 *     retires or replaces what is serving. A failed version is retried only after its directory or model.onnx
 *     changes (srv_bundle_stamp), or on an explicit load request.
 *   - Device health: a version whose every instance runs on a lost device (a sticky CUDA error) is retired by
 *     srv_registry_sweep_lost (UNAVAILABLE and the reason in its status) and marked lost: it is never aspired or
 *     loaded again in this process, and the registry is no longer live (srv_registry_live), since only a restart
 *     recovers the device.
 *   - r->live counts version objects not yet destroyed (loads in flight included); srv_registry_free waits for
 *     it to reach zero once every loader thread is gone.
 *   - Every load, failure and retirement is logged once (server/log.h), never under mu.
 */
#define _GNU_SOURCE
#include "registry-impl.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- small helpers ---- */

const char *srv_state_name(srv_state s) {
    switch (s) {
    case SRV_STATE_START: return "START";
    case SRV_STATE_LOADING: return "LOADING";
    case SRV_STATE_AVAILABLE: return "AVAILABLE";
    case SRV_STATE_UNLOADING: return "UNLOADING";
    case SRV_STATE_END: return "END";
    default: return "UNKNOWN";
    }
}

void srv_model_config_free(srv_model_config *c) {
    if (!c) return;
    free(c->name);
    free(c->base_path);
    free(c->platform);
    free(c->versions);
    for (int i = 0; i < c->nlabels; i++) free(c->label_names[i]);
    free(c->label_names);
    free(c->label_versions);
    for (int i = 0; i < c->nroutes; i++) free(c->route_labels[i]);
    free(c->route_labels);
    free(c->route_weights);
    free(c->sticky_header);
    free(c->shadow);
    free(c->device);
    memset(c, 0, sizeof *c);
}

static char *dupz(const char *s) { return s ? strdup(s) : NULL; }

int srv_model_config_copy(srv_model_config *d, const srv_model_config *s) {
    memset(d, 0, sizeof *d);
    d->policy = s->policy;
    d->latest_n = s->latest_n > 0 ? s->latest_n : 1;
    d->instance_count = s->instance_count;
    d->precision = s->precision;
    d->precision_set = s->precision_set;
    d->ar_on = s->ar_on;
    d->ar_max_error_rate = s->ar_max_error_rate;
    d->ar_max_p99_ratio = s->ar_max_p99_ratio;
    d->ar_window_s = s->ar_window_s;
    d->ar_min_requests = s->ar_min_requests;
    d->name = dupz(s->name);
    d->base_path = dupz(s->base_path);
    d->platform = dupz(s->platform);
    int ok = d->name && d->base_path && (!s->platform || d->platform);
    if (ok && s->nversions > 0) {
        ok = (d->versions = malloc((size_t)s->nversions * sizeof *d->versions)) != NULL;
        if (ok) memcpy(d->versions, s->versions, (size_t)s->nversions * sizeof *d->versions);
        d->nversions = ok ? s->nversions : 0;
    }
    if (ok && s->nlabels > 0) {
        d->label_names = calloc((size_t)s->nlabels, sizeof *d->label_names);
        d->label_versions = malloc((size_t)s->nlabels * sizeof *d->label_versions);
        ok = d->label_names && d->label_versions;
        for (int i = 0; ok && i < s->nlabels; i++) {
            ok = (d->label_names[i] = strdup(s->label_names[i])) != NULL;
            d->label_versions[i] = s->label_versions[i];
            d->nlabels = i + 1;
        }
    }
    if (ok && s->nroutes > 0) {
        d->route_labels = calloc((size_t)s->nroutes, sizeof *d->route_labels);
        d->route_weights = malloc((size_t)s->nroutes * sizeof *d->route_weights);
        ok = d->route_labels && d->route_weights;
        for (int i = 0; ok && i < s->nroutes; i++) {
            ok = (d->route_labels[i] = strdup(s->route_labels[i])) != NULL;
            d->route_weights[i] = s->route_weights[i];
            d->nroutes = i + 1;
        }
    }
    if (ok && s->sticky_header) ok = (d->sticky_header = strdup(s->sticky_header)) != NULL;
    if (ok && s->shadow) ok = (d->shadow = strdup(s->shadow)) != NULL;
    if (ok && s->device) ok = (d->device = strdup(s->device)) != NULL;
    if (!ok) srv_model_config_free(d);
    return ok ? 0 : -1;
}

reg_model *reg_find_model(srv_registry *r, const char *name) {
    for (int i = 0; i < r->nmodels; i++)
        if (strcmp(r->models[i]->cfg.name, name) == 0) return r->models[i];
    return NULL;
}

reg_model *reg_find_model_gen(srv_registry *r, const char *name, uint64_t gen) {
    reg_model *m = reg_find_model(r, name);
    return m && m->gen == gen ? m : NULL;
}

reg_ver *reg_find_ver(reg_model *m, int64_t version) {
    for (int i = 0; i < m->nvers; i++)
        if (m->vers[i].version == version) return &m->vers[i];
    return NULL;
}

/* Under mu. NULL on OOM. Pointers into m->vers are invalidated. */
reg_ver *reg_get_ver(reg_model *m, int64_t version) {
    reg_ver *e = reg_find_ver(m, version);
    if (e) return e;
    if (m->nvers == m->cap) {
        int nc = m->cap ? 2 * m->cap : 8;
        reg_ver *nv = realloc(m->vers, (size_t)nc * sizeof *nv);
        if (!nv) return NULL;
        m->vers = nv;
        m->cap = nc;
    }
    e = &m->vers[m->nvers++];
    memset(e, 0, sizeof *e);
    e->version = version;
    e->state = SRV_STATE_UNKNOWN;
    return e;
}

void reg_set_error(reg_ver *e, srv_code code, const char *msg) {
    free(e->error_message);
    e->error_message = msg && *msg ? strdup(msg) : NULL;
    e->error_code = code;
}

static void labels_free(reg_model *m) {
    for (int i = 0; i < m->nl; i++) free(m->lnames[i]);
    free(m->lnames);
    free(m->lvers);
    m->lnames = NULL;
    m->lvers = NULL;
    m->nl = 0;
}

static int label_version(const reg_model *m, const char *label, int64_t *version) {
    for (int i = 0; i < m->nl; i++)
        if (strcmp(m->lnames[i], label) == 0) {
            *version = m->lvers[i];
            return 1;
        }
    return 0;
}

static void model_free(reg_model *m) {
    if (!m) return;
    for (int i = 0; i < m->nvers; i++) free(m->vers[i].error_message);
    free(m->vers);
    free(m->pend);
    labels_free(m);
    srv_model_config_free(&m->cfg);
    free(m);
}

/* ---- log notes ---- */

void reg_note_add(reg_notes *ns, srv_log_level lv, const char *event, const char *model, int64_t version,
                  const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (ns->len == ns->cap) {
        int nc = ns->cap ? 2 * ns->cap : 8;
        reg_note *nn = realloc(ns->n, (size_t)nc * sizeof *nn);
        if (!nn) return; /* out of memory: the line is lost, nothing else */
        ns->n = nn;
        ns->cap = nc;
    }
    reg_note *n = &ns->n[ns->len];
    *n = (reg_note){.lv = lv, .event = event, .model = dupz(model), .version = version, .msg = strdup(msg)};
    if (!n->msg || (model && !n->model)) {
        free(n->model);
        free(n->msg);
        return;
    }
    ns->len++;
}

void reg_notes_flush(reg_notes *ns) {
    for (int i = 0; i < ns->len; i++) {
        reg_note *n = &ns->n[i];
        srv_log(n->lv, n->event, n->model, n->version, "%s", n->msg);
        free(n->model);
        free(n->msg);
    }
    free(ns->n);
    *ns = (reg_notes){0};
}

/* ---- registry ---- */

srv_registry *srv_registry_new(const srv_registry_opts *o) {
    srv_registry *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    if (o) r->opts = *o;
    snprintf(r->device, sizeof r->device, "%s", r->opts.device && *r->opts.device ? r->opts.device : "auto");
    r->opts.device = r->device;
    if (r->opts.batching) {
        r->batch = *r->opts.batching;
        r->opts.batching = &r->batch;
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->poll_mu, NULL);
    pthread_mutex_init(&r->thr_mu, NULL);
    pthread_cond_init(&r->live_cv, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->thr_cv, &ca);
    pthread_cond_init(&r->load_cv, &ca);
    pthread_condattr_destroy(&ca);
    return r;
}

double reg_load_timeout_s(const srv_registry *r) {
    return r->opts.load_timeout_s > 0 ? r->opts.load_timeout_s : 600;
}

int reg_count_published(const reg_model *m) {
    int n = 0;
    for (int i = 0; i < m->nvers; i++) n += m->vers[i].v != NULL;
    return n;
}

void reg_detach_all(reg_model *m, srv_version **out, int *n) {
    for (int i = 0; i < m->nvers; i++) {
        reg_ver *e = &m->vers[i];
        if (!e->v) continue;
        out[(*n)++] = e->v;
        e->ending_id = e->v->id;
        e->v = NULL;
        e->state = SRV_STATE_UNLOADING;
    }
}

void reg_retire(srv_registry *r, srv_version **vs, int n, const char *why) {
    for (int i = 0; i < n; i++) {
        srv_log(SRV_LOG_INFO, "retire", vs[i]->model, vs[i]->version,
                "retired (%s); unloads once its last in-flight request finishes", why);
        if (r->opts.metrics) {
            srv_metrics_swap(r->opts.metrics, vs[i]->model, vs[i]->version, "unload");
            srv_metrics_state(r->opts.metrics, vs[i]->model, vs[i]->version, SRV_STATE_UNLOADING);
        }
        srv_version_release(vs[i]);
    }
    free(vs);
}

void srv_registry_version_ended(srv_registry *r, const char *model, int64_t version, uint64_t id) {
    pthread_mutex_lock(&r->mu);
    reg_model *m = model ? reg_find_model(r, model) : NULL;
    reg_ver *e = m ? reg_find_ver(m, version) : NULL;
    if (e && e->ending_id == id) {
        e->ending_id = 0;
        if (e->state == SRV_STATE_UNLOADING) e->state = SRV_STATE_END;
    }
    /* Metrics are still alive here: srv_registry_free waits for live == 0 before its owner frees them, or clears
     * opts.metrics when it gives up waiting. Left alone when a newer object of this version number is published
     * or loading. */
    int newer = e && ((e->v && e->v->id != id) || (e->load_id && e->load_id != id));
    if (r->opts.metrics && model && !newer) {
        srv_metrics_state(r->opts.metrics, model, version, SRV_STATE_END);
        srv_metrics_forget(r->opts.metrics, model, version);
    }
    r->live--;
    pthread_cond_broadcast(&r->live_cv);
    pthread_mutex_unlock(&r->mu);
}

void reg_metrics_state(srv_registry *r, const char *model, int64_t version, srv_state s) {
    if (r->opts.metrics) srv_metrics_state(r->opts.metrics, model, version, (int)s);
}

/* Under mu: abandon every load of model m (every load at all when m is NULL). */
static void cancel_loads(srv_registry *r, const reg_model *m, const char *msg, reg_notes *ns) {
    for (reg_load *l = r->loads, *next; l; l = next) {
        next = l->next;
        if (!m || (l->gen == m->gen && strcmp(l->model, m->cfg.name) == 0))
            reg_load_abandon(r, l, SRV_CANCELLED, msg, 0, ns);
    }
}

void srv_registry_free(srv_registry **rp) {
    if (!rp || !*rp) return;
    srv_registry *r = *rp;
    pthread_mutex_lock(&r->thr_mu);
    r->stop = 1;
    pthread_cond_broadcast(&r->thr_cv);
    int running = r->thr_running;
    r->thr_running = 0;
    pthread_mutex_unlock(&r->thr_mu);
    if (running) pthread_join(r->thr, NULL);
    reg_notes ns = {0};
    pthread_mutex_lock(&r->mu); /* not under poll_mu: a finishing loader takes it to record its outcome */
    r->closing = 1;
    pthread_cond_broadcast(&r->load_cv);
    cancel_loads(r, NULL, "load cancelled: the server is shutting down", &ns);
    pthread_mutex_unlock(&r->mu);
    reg_notes_flush(&ns);
    pthread_mutex_lock(&r->mu);
    int64_t until = srv_now_us() + (int64_t)(REG_FREE_GRACE_S * 1e6);
    while (r->nthreads > 0 && srv_now_us() < until) {
        struct timespec ts = {(time_t)(until / 1000000), (long)(until % 1000000) * 1000};
        pthread_cond_timedwait(&r->load_cv, &r->mu, &ts);
    }
    int stuck = r->nthreads;
    if (stuck) r->opts.metrics = NULL; /* its owner frees it once we return; late loaders must not touch it */
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&r->poll_mu);
    srv_version **vs = NULL;
    int nv = 0;
    for (;;) { /* retry on OOM: the table's references must all be dropped before we wait */
        pthread_mutex_lock(&r->mu);
        int cnt = 0;
        for (int i = 0; i < r->nmodels; i++) cnt += reg_count_published(r->models[i]);
        if (cnt == 0 || (vs = malloc((size_t)cnt * sizeof *vs)) != NULL) {
            for (int i = 0; i < r->nmodels; i++) reg_detach_all(r->models[i], vs, &nv);
            pthread_mutex_unlock(&r->mu);
            break;
        }
        pthread_mutex_unlock(&r->mu);
    }
    reg_retire(r, vs, nv, "the server is shutting down");
    if (stuck) {
        /* A loader is stuck (a read that never returns). Its thread still needs the registry when it ends, so
         * the registry stays allocated (and its versions' memory with it) for the rest of the process. */
        srv_log(SRV_LOG_WARN, "shutdown", NULL, 0,
                "%d model load(s) still running %.0f s after they were cancelled; leaving them to end on their own",
                stuck, REG_FREE_GRACE_S);
        pthread_mutex_unlock(&r->poll_mu);
        *rp = NULL;
        return;
    }
    pthread_mutex_lock(&r->mu);
    while (r->live > 0) pthread_cond_wait(&r->live_cv, &r->mu);
    for (int i = 0; i < r->nmodels; i++) model_free(r->models[i]);
    free(r->models);
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_unlock(&r->poll_mu);
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->poll_mu);
    pthread_mutex_destroy(&r->thr_mu);
    pthread_cond_destroy(&r->live_cv);
    pthread_cond_destroy(&r->thr_cv);
    pthread_cond_destroy(&r->load_cv);
    free(r);
    *rp = NULL;
}

/* ---- configuration ---- */

static srv_code validate_config(const srv_model_config *cfgs, int n, srv_error *err) {
    for (int i = 0; i < n; i++) {
        const srv_model_config *c = &cfgs[i];
        if (!srv_name_valid(c->name))
            return srv_err(err, SRV_INVALID_ARGUMENT,
                           "model name '%.300s' is invalid: use 1-255 characters of [A-Za-z0-9_.-], not '.' or '..'",
                           c->name ? c->name : "");
        if (!c->base_path || !*c->base_path)
            return srv_err(err, SRV_INVALID_ARGUMENT, "model '%s': base_path is empty", c->name);
        if (c->platform && *c->platform && strcmp(c->platform, "onnx") != 0 && strcmp(c->platform, "tensorflow") != 0)
            return srv_err(err, SRV_INVALID_ARGUMENT, "model '%s': platform '%.100s' is not supported (onnx, tensorflow)",
                           c->name, c->platform);
        if (c->policy != SRV_POLICY_LATEST && c->policy != SRV_POLICY_ALL && c->policy != SRV_POLICY_SPECIFIC)
            return srv_err(err, SRV_INVALID_ARGUMENT, "model '%s': unknown version policy %d", c->name, (int)c->policy);
        if (c->policy == SRV_POLICY_LATEST && c->latest_n < 0)
            return srv_err(err, SRV_INVALID_ARGUMENT, "model '%s': latest num_versions must be >= 1, got %d", c->name,
                           c->latest_n);
        if (c->instance_count < 0 || c->instance_count > SRV_MAX_INSTANCES)
            return srv_err(err, SRV_INVALID_ARGUMENT, "model '%s': instance_count must be 1..%d, got %d", c->name,
                           SRV_MAX_INSTANCES, c->instance_count);
        if (c->device) {
            char w[300];
            snprintf(w, sizeof w, "model '%s'", c->name);
            srv_code dc = srv_device_spec_check(c->device, w, NULL, err);
            if (dc != SRV_OK) return dc;
        }
        if (c->policy == SRV_POLICY_SPECIFIC && (c->nversions <= 0 || !c->versions))
            return srv_err(err, SRV_INVALID_ARGUMENT, "model '%s': specific version policy lists no versions", c->name);
        for (int k = 0; c->policy == SRV_POLICY_SPECIFIC && k < c->nversions; k++)
            if (c->versions[k] <= 0)
                return srv_err(err, SRV_INVALID_ARGUMENT, "model '%s': specific version %lld must be > 0", c->name,
                               (long long)c->versions[k]);
        for (int k = 0; k < c->nlabels; k++) {
            if (!srv_name_valid(c->label_names[k]))
                return srv_err(err, SRV_INVALID_ARGUMENT, "model '%s': version label '%.300s' is invalid", c->name,
                               c->label_names[k] ? c->label_names[k] : "");
            if (c->label_versions[k] <= 0)
                return srv_err(err, SRV_INVALID_ARGUMENT, "model '%s': version label '%s' points at version %lld",
                               c->name, c->label_names[k], (long long)c->label_versions[k]);
            for (int q = 0; q < k; q++)
                if (strcmp(c->label_names[q], c->label_names[k]) == 0)
                    return srv_err(err, SRV_INVALID_ARGUMENT, "model '%s': version label '%s' given twice", c->name,
                                   c->label_names[k]);
        }
        int64_t wsum = 0;
        for (int k = 0; k < c->nroutes; k++) {
            int known = 0;
            for (int q = 0; q < c->nlabels && !known; q++) known = strcmp(c->label_names[q], c->route_labels[k]) == 0;
            if (!known)
                return srv_err(err, SRV_INVALID_ARGUMENT, "model '%s': traffic route '%.200s' is not one of its "
                               "version labels", c->name, c->route_labels[k]);
            if (c->route_weights[k] < 0 || c->route_weights[k] > 1000000)
                return srv_err(err, SRV_INVALID_ARGUMENT, "model '%s': traffic route '%s' has weight %d (0..1000000)",
                               c->name, c->route_labels[k], c->route_weights[k]);
            for (int q = 0; q < k; q++)
                if (strcmp(c->route_labels[q], c->route_labels[k]) == 0)
                    return srv_err(err, SRV_INVALID_ARGUMENT, "model '%s': traffic route '%s' given twice", c->name,
                                   c->route_labels[k]);
            wsum += c->route_weights[k];
        }
        if (c->nroutes > 0 && wsum <= 0)
            return srv_err(err, SRV_INVALID_ARGUMENT, "model '%s': traffic route weights add up to 0", c->name);
        if (c->shadow) {
            int known = 0;
            for (int q = 0; q < c->nlabels && !known; q++) known = strcmp(c->label_names[q], c->shadow) == 0;
            if (!known || c->nroutes == 0)
                return srv_err(err, SRV_INVALID_ARGUMENT, "model '%s': traffic shadow '%.200s' must be one of its version "
                               "labels, beside routes", c->name, c->shadow);
        }
        for (int q = 0; q < i; q++)
            if (strcmp(cfgs[q].name, c->name) == 0)
                return srv_err(err, SRV_INVALID_ARGUMENT, "model '%s' is configured twice", c->name);
    }
    return SRV_OK;
}

/* Under mu: FAILED_PRECONDITION naming the first label that points at a version that is not AVAILABLE (with the
 * reason: not on disk, its load error, or its state). */
static srv_code check_labels(srv_registry *r, const srv_model_config *cfgs, int n, srv_error *err) {
    if (r->opts.allow_labels_for_unavailable) return SRV_OK;
    for (int i = 0; i < n; i++) {
        reg_model *m = reg_find_model(r, cfgs[i].name);
        for (int k = 0; m && k < cfgs[i].nlabels; k++) {
            reg_ver *e = reg_find_ver(m, cfgs[i].label_versions[k]);
            if (e && e->v) continue;
            const char *nm = cfgs[i].name, *ln = cfgs[i].label_names[k];
            long long v = (long long)cfgs[i].label_versions[k];
            if (!e || e->state == SRV_STATE_UNKNOWN || (!e->on_disk && !e->load_id))
                return srv_err(err, SRV_FAILED_PRECONDITION, "model '%s': version label '%s' points at version %lld, "
                               "which is not under base path '%s'", nm, ln, v, m->cfg.base_path);
            if (e->state == SRV_STATE_END && e->error_code != SRV_OK)
                return srv_err(err, SRV_FAILED_PRECONDITION, "model '%s': version label '%s' points at version %lld, "
                               "which failed to load: %s", nm, ln, v, e->error_message ? e->error_message : "");
            return srv_err(err, SRV_FAILED_PRECONDITION, "model '%s': version label '%s' points at version %lld, which "
                           "is not available (state %s); set --allow_version_labels_for_unavailable_models to allow this",
                           nm, ln, v, srv_state_name(e->state));
        }
    }
    return SRV_OK;
}

/* Under mu: drop m (no longer in the table): its loads cancelled, its published versions detached into old (room for
 * reg_count_published(m) more), the entry freed. */
static void drop_model(srv_registry *r, reg_model *m, srv_version **old, int *nold, reg_notes *ns) {
    cancel_loads(r, m, "load cancelled: the model was removed from the config", ns);
    reg_detach_all(m, old, nold);
    model_free(m);
}

/* Under mu. */
static void routed_count(srv_registry *r) {
    int routed = 0;
    for (int i = 0; i < r->nmodels; i++) routed += r->models[i]->cfg.nroutes > 0;
    atomic_store(&r->routed_models, routed);
}

/* Under mu: the versions c's labels point at become m's pending pins, which the poller loads whatever the policy
 * says (so that a label may name a version on disk that is not loaded yet). With explicit control the model is
 * looked at again when one of them is not published. */
static void pins_pend(srv_registry *r, reg_model *m, const srv_model_config *c) {
    free(m->pend);
    m->pend = NULL;
    m->npend = 0;
    if (c->nlabels <= 0 || !(m->pend = malloc((size_t)c->nlabels * sizeof *m->pend))) return;
    memcpy(m->pend, c->label_versions, (size_t)c->nlabels * sizeof *m->pend);
    m->npend = c->nlabels;
    for (int k = 0; k < c->nlabels && r->opts.explicit_control; k++) {
        reg_ver *e = reg_find_ver(m, c->label_versions[k]);
        if (!e || !e->v) m->seen = 0;
    }
}

/* Validate cfgs, then apply them: whole replaces the model set (models not listed are removed, their versions
 * retired); otherwise the listed models are added or replaced and every other model is left as it is. Labels are
 * applied once every version they name is AVAILABLE (loading pinned versions first and waiting for those loads), or
 * not at all (the previous labels stay, FAILED_PRECONDITION naming the label and why). */
static srv_code reg_apply(srv_registry *r, const srv_model_config *cfgs, int n, int whole, srv_error *err) {
    srv_code c = validate_config(cfgs, n, err);
    if (c != SRV_OK) return c;
    srv_model_config *cp = calloc((size_t)n + 1, sizeof *cp);
    int ncp = 0;
    for (; cp && ncp < n; ncp++)
        if (srv_model_config_copy(&cp[ncp], &cfgs[ncp]) != 0) break;
    if (!cp || ncp < n) {
        for (int i = 0; cp && i < ncp; i++) srv_model_config_free(&cp[i]);
        free(cp);
        return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory copying the model config");
    }
    srv_version **old = NULL;
    int nold = 0;
    reg_notes ns = {0};
    pthread_mutex_lock(&r->mu);
    int total = n, cnt = 0;
    for (int i = 0; i < r->nmodels; i++) {
        int listed = 0;
        for (int k = 0; k < n && !listed; k++) listed = strcmp(cp[k].name, r->models[i]->cfg.name) == 0;
        total += !whole && !listed;
        cnt += reg_count_published(r->models[i]);
    }
    reg_model **nm = calloc((size_t)total + 1, sizeof *nm), **lm = calloc((size_t)n + 1, sizeof *lm);
    old = malloc((size_t)cnt * sizeof *old + 1);
    int ok = nm && lm && old;
    for (int i = 0; i < n && ok; i++) { /* lm: the listed models, in cfgs' order (new ones not in the table yet) */
        reg_model *m = reg_find_model(r, cp[i].name);
        if (!m && (m = calloc(1, sizeof *m)) != NULL) m->gen = ++r->next_gen;
        ok = m != NULL;
        lm[i] = m;
    }
    if (!ok) { /* OOM: nothing changed */
        for (int i = 0; lm && i < n; i++)
            if (lm[i] && !reg_find_model(r, cp[i].name)) free(lm[i]);
        pthread_mutex_unlock(&r->mu);
        for (int i = 0; i < n; i++) srv_model_config_free(&cp[i]);
        free(cp);
        free(nm);
        free(lm);
        free(old);
        return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory applying the model config");
    }
    int nn = 0;
    if (whole) {
        memcpy(nm, lm, (size_t)n * sizeof *nm);
        nn = n;
    } else { /* the table's order, new models last */
        for (int i = 0; i < r->nmodels; i++) nm[nn++] = r->models[i];
        for (int i = 0; i < n; i++)
            if (!reg_find_model(r, cp[i].name)) nm[nn++] = lm[i];
    }
    for (int i = 0; i < r->nmodels; i++) {
        int kept = 0;
        for (int k = 0; k < nn && !kept; k++) kept = nm[k] == r->models[i];
        if (!kept) drop_model(r, r->models[i], old, &nold, &ns);
    }
    for (int i = 0; i < n; i++) {
        srv_model_config *mc = &lm[i]->cfg;
        char **ln = cp[i].label_names;
        int64_t *lv = cp[i].label_versions;
        int nl = cp[i].nlabels;
        cp[i].label_names = NULL;
        cp[i].label_versions = NULL;
        cp[i].nlabels = 0;
        srv_model_config_free(mc);
        *mc = cp[i];
        cp[i] = (srv_model_config){0};
        cp[i].label_names = ln; /* labels stay pending in cp until checked; the rest moved into the model */
        cp[i].label_versions = lv;
        cp[i].nlabels = nl;
        cp[i].name = strdup(mc->name);
        pins_pend(r, lm[i], &cp[i]);
    }
    free(r->models);
    free(lm);
    r->models = nm;
    r->nmodels = nn;
    routed_count(r);
    c = check_labels(r, cp, n, err);
    pthread_mutex_unlock(&r->mu);
    reg_notes_flush(&ns);
    reg_retire(r, old, nold, "the model was removed from the config");

    pthread_mutex_lock(&r->thr_mu);
    int running = r->thr_running, polled = r->polled_once;
    if (running) {
        r->kick = 1;
        pthread_cond_broadcast(&r->thr_cv);
    }
    pthread_mutex_unlock(&r->thr_mu);
    /* Load now when labels wait for versions (TF Serving loads the models before it applies labels, also at
     * startup; a label's version is pinned, so it loads whatever the policy says), or when no poller thread will
     * pick up the change. */
    if (c != SRV_OK || (!running && polled)) {
        srv_registry_poll(r);
        pthread_mutex_lock(&r->mu);
        c = check_labels(r, cp, n, err);
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < n; i++) {
        reg_model *m = cp[i].name ? reg_find_model(r, cp[i].name) : NULL;
        if (!m) continue;
        free(m->pend); /* the labels (when applied) pin their versions from now on */
        m->pend = NULL;
        m->npend = 0;
        if (c != SRV_OK) continue;
        labels_free(m);
        m->lnames = cp[i].label_names;
        m->lvers = cp[i].label_versions;
        m->nl = cp[i].nlabels;
        cp[i].label_names = NULL;
        cp[i].label_versions = NULL;
        cp[i].nlabels = 0;
    }
    pthread_mutex_unlock(&r->mu);
    if (c != SRV_OK) { /* versions loaded only for the refused labels go again */
        pthread_mutex_lock(&r->thr_mu);
        if (r->thr_running) r->kick = 1, pthread_cond_broadcast(&r->thr_cv);
        pthread_mutex_unlock(&r->thr_mu);
    }
    for (int i = 0; i < n; i++) srv_model_config_free(&cp[i]);
    free(cp);
    return c;
}

srv_code srv_registry_set_config(srv_registry *r, const srv_model_config *cfgs, int n, srv_error *err) {
    return reg_apply(r, cfgs, n, 1, err);
}

srv_code srv_registry_put_model(srv_registry *r, const srv_model_config *c, srv_error *err) {
    if (!c) return srv_err(err, SRV_INVALID_ARGUMENT, "no model config given");
    return reg_apply(r, c, 1, 0, err);
}

srv_code srv_registry_remove_model(srv_registry *r, const char *model, srv_error *err) {
    reg_notes ns = {0};
    srv_version **old = NULL;
    int nold = 0;
    srv_code c = SRV_OK;
    pthread_mutex_lock(&r->mu);
    int i = 0;
    while (model && i < r->nmodels && strcmp(r->models[i]->cfg.name, model) != 0) i++;
    if (!model || i == r->nmodels) {
        c = srv_err(err, SRV_NOT_FOUND, "model '%.300s' is not served", model ? model : "");
    } else if (!(old = malloc(((size_t)reg_count_published(r->models[i]) + 1) * sizeof *old))) {
        c = srv_err(err, SRV_RESOURCE_EXHAUSTED, "model '%s': out of memory removing it", model);
    } else {
        reg_model *m = r->models[i];
        memmove(&r->models[i], &r->models[i + 1], (size_t)(r->nmodels - i - 1) * sizeof *r->models);
        r->nmodels--;
        drop_model(r, m, old, &nold, &ns);
        routed_count(r);
    }
    pthread_mutex_unlock(&r->mu);
    reg_notes_flush(&ns);
    reg_retire(r, old, nold, "the model was removed");
    return c;
}

srv_code srv_registry_set_label(srv_registry *r, const char *model, const char *label, int64_t version, srv_error *err) {
    srv_model_config m;
    if (srv_registry_get_model(r, model, &m, err) != SRV_OK) return err->code;
    srv_code c = srv_model_config_set_label(&m, label, version, err);
    if (c == SRV_OK) c = srv_registry_put_model(r, &m, err);
    srv_model_config_free(&m);
    return c;
}

/* ---- request path ---- */

srv_version *srv_registry_acquire(srv_registry *r, const char *model, int64_t version, const char *label,
                                  srv_error *err) {
    if (!model || !*model) {
        srv_err(err, SRV_INVALID_ARGUMENT, "no model name given");
        return NULL;
    }
    srv_version *v = NULL;
    pthread_mutex_lock(&r->mu);
    reg_model *m = reg_find_model(r, model);
    if (!m) {
        srv_err(err, SRV_NOT_FOUND, "model '%.300s' not found (Servable not found for request)", model);
    } else if (label && !label_version(m, label, &version)) {
        srv_err(err, SRV_NOT_FOUND, "model '%s': no version label '%.300s'", model, label);
    } else if (version > 0) {
        reg_ver *e = reg_find_ver(m, version);
        if (e && e->v) v = e->v;
        else if (e && e->state != SRV_STATE_UNKNOWN)
            srv_err(err, SRV_UNAVAILABLE, "model '%s' version %lld is not available (state %s)%s%s", model,
                    (long long)version, srv_state_name(e->state), e->error_message ? ": " : "",
                    e->error_message ? e->error_message : "");
        else srv_err(err, SRV_NOT_FOUND, "model '%s' version %lld not found", model, (long long)version);
    } else { /* the highest version the policy serves; a version only a label pins serves when none is up */
        for (int pol = 1; pol >= 0 && !v; pol--)
            for (int i = 0; i < m->nvers; i++)
                if (m->vers[i].v && m->vers[i].in_policy >= pol && (!v || m->vers[i].version > v->version))
                    v = m->vers[i].v;
        const reg_ver *lost = NULL; /* the highest version retired for lost devices: its reason says why */
        for (int i = 0; !v && i < m->nvers; i++)
            if (m->vers[i].lost && m->vers[i].error_message && (!lost || m->vers[i].version > lost->version))
                lost = &m->vers[i];
        if (!v && lost)
            srv_err(err, SRV_UNAVAILABLE, "model '%s' has no available version: %s", model, lost->error_message);
        else if (!v && m->nvers)
            srv_err(err, SRV_UNAVAILABLE, "model '%s' has no available version yet (see model status)", model);
        else if (!v) srv_err(err, SRV_NOT_FOUND, "model '%s': no versions found under '%s'", model, m->cfg.base_path);
    }
    if (v) atomic_fetch_add_explicit(&v->refs, 1, memory_order_relaxed);
    pthread_mutex_unlock(&r->mu);
    return v;
}

/* ---- status ---- */

static int cmp_status(const void *a, const void *b) {
    const srv_version_status *x = a, *y = b;
    int c = strcmp(x->model, y->model);
    if (c) return c;
    return x->version < y->version ? 1 : x->version > y->version ? -1 : 0;
}

static int status_add(srv_version_status *out, int *n, const char *model, const reg_ver *e) {
    srv_version_status *s = &out[*n];
    s->model = strdup(model);
    s->version = e->version;
    s->state = e->state;
    s->error_code = e->error_code;
    s->error_message = strdup(e->error_message ? e->error_message : "");
    if (!s->model || !s->error_message) {
        free(s->model);
        free(s->error_message);
        return -1;
    }
    (*n)++;
    return 0;
}

srv_code srv_registry_status(srv_registry *r, const char *model, int64_t version, const char *label,
                             srv_version_status **out, int *n, srv_error *err) {
    *out = NULL;
    *n = 0;
    srv_code c = SRV_OK;
    pthread_mutex_lock(&r->mu);
    int total = 0;
    for (int i = 0; i < r->nmodels; i++) total += r->models[i]->nvers;
    srv_version_status *s = calloc((size_t)total + 1, sizeof *s);
    int ns = 0;
    reg_model *m = model ? reg_find_model(r, model) : NULL;
    if (!s) c = srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    else if (model && !m) c = srv_err(err, SRV_NOT_FOUND, "model '%.300s' not found", model);
    else if (m && label && !label_version(m, label, &version))
        c = srv_err(err, SRV_NOT_FOUND, "model '%s': no version label '%.300s'", model, label);
    for (int i = 0; c == SRV_OK && i < r->nmodels; i++) {
        reg_model *mm = r->models[i];
        if (m && mm != m) continue;
        for (int k = 0; c == SRV_OK && k < mm->nvers; k++) {
            const reg_ver *e = &mm->vers[k];
            if (e->state == SRV_STATE_UNKNOWN || (m && version > 0 && e->version != version)) continue;
            if (status_add(s, &ns, mm->cfg.name, e) != 0) c = srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
        }
    }
    if (c == SRV_OK && m && ns == 0) {
        if (version > 0) c = srv_err(err, SRV_NOT_FOUND, "model '%s' version %lld not found", model, (long long)version);
        else c = srv_err(err, SRV_NOT_FOUND, "could not find any versions of model '%s'", model);
    }
    pthread_mutex_unlock(&r->mu);
    if (c != SRV_OK) {
        srv_status_free(s, ns);
        return c;
    }
    qsort(s, (size_t)ns, sizeof *s, cmp_status);
    *out = s;
    *n = ns;
    return SRV_OK;
}

void srv_status_free(srv_version_status *s, int n) {
    for (int i = 0; s && i < n; i++) {
        free(s[i].model);
        free(s[i].error_message);
    }
    free(s);
}

int srv_registry_ready(srv_registry *r) {
    int ready = 1;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->nmodels && ready; i++) {
        int any = 0;
        for (int k = 0; k < r->models[i]->nvers && !any; k++) any = r->models[i]->vers[k].v != NULL;
        ready = any;
    }
    pthread_mutex_unlock(&r->mu);
    return ready;
}

int srv_registry_live(srv_registry *r, char *why, size_t cap) {
    if (why && cap) why[0] = 0;
    if (!atomic_load(&r->dead)) return 1;
    if (why && cap) {
        pthread_mutex_lock(&r->mu);
        snprintf(why, cap, "%s", r->dead_why);
        pthread_mutex_unlock(&r->mu);
    }
    return 0;
}

void srv_registry_sweep_lost(srv_registry *r) {
    char why[SRV_ERR_MAX / 2], msg[SRV_ERR_MAX];
    pthread_mutex_lock(&r->mu);
    int total = 0, n = 0;
    for (int i = 0; i < r->nmodels; i++) total += reg_count_published(r->models[i]);
    srv_version **vs = total ? malloc((size_t)total * sizeof *vs) : NULL;
    for (int i = 0; vs && i < r->nmodels; i++) {
        reg_model *m = r->models[i];
        for (int k = 0; k < m->nvers; k++) {
            reg_ver *e = &m->vers[k];
            if (!e->v || !srv_version_all_lost(e->v, why, sizeof why)) continue;
            snprintf(msg, sizeof msg, "model '%s' version %lld: every device it runs on is lost: %s; the server must be "
                     "restarted", m->cfg.name, (long long)e->version, why);
            vs[n++] = e->v;
            e->ending_id = e->v->id;
            e->v = NULL;
            e->state = SRV_STATE_UNLOADING;
            e->lost = 1;
            reg_set_error(e, SRV_UNAVAILABLE, msg);
            if (!atomic_load(&r->dead)) {
                snprintf(r->dead_why, sizeof r->dead_why, "%s", msg);
                atomic_store(&r->dead, 1);
            }
        }
    }
    pthread_mutex_unlock(&r->mu);
    if (n) reg_retire(r, vs, n, "every device it runs on is lost; the server must be restarted");
    else free(vs);
}

const char *srv_registry_metrics_model(srv_registry *r, const char *model, int served, srv_code code) {
    if (!model || !*model) return "";
    return served || (code != SRV_NOT_FOUND && srv_registry_has_model(r, model)) ? model : "";
}

int srv_registry_has_model(srv_registry *r, const char *model) {
    pthread_mutex_lock(&r->mu);
    int has = model && reg_find_model(r, model) != NULL;
    pthread_mutex_unlock(&r->mu);
    return has;
}

/* ---- the served configuration, for per-model changes ---- */

/* Under mu: a copy of m's config with its applied labels. 0, or -1 on OOM. */
static int model_copy(const reg_model *m, srv_model_config *out) {
    srv_model_config tmp = m->cfg; /* the labels live beside the config: lend them for the copy */
    tmp.label_names = m->lnames;
    tmp.label_versions = m->lvers;
    tmp.nlabels = m->nl;
    return srv_model_config_copy(out, &tmp);
}

srv_code srv_registry_get_config(srv_registry *r, srv_model_config **out, int *n, srv_error *err) {
    *out = NULL;
    *n = 0;
    pthread_mutex_lock(&r->mu);
    srv_model_config *v = calloc((size_t)r->nmodels + 1, sizeof *v);
    int ok = v != NULL, k = 0;
    for (; ok && k < r->nmodels; k++) ok = model_copy(r->models[k], &v[k]) == 0;
    pthread_mutex_unlock(&r->mu);
    if (!ok) {
        for (int i = 0; v && i < k; i++) srv_model_config_free(&v[i]);
        free(v);
        return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory copying the model config");
    }
    *out = v;
    *n = k;
    return SRV_OK;
}

srv_code srv_registry_get_model(srv_registry *r, const char *model, srv_model_config *out, srv_error *err) {
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&r->mu);
    reg_model *m = model ? reg_find_model(r, model) : NULL;
    int rc = m ? model_copy(m, out) : 1;
    pthread_mutex_unlock(&r->mu);
    if (rc > 0) return srv_err(err, SRV_NOT_FOUND, "model '%.300s' is not served", model ? model : "");
    if (rc < 0) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory copying model '%s''s config", model);
    return SRV_OK;
}

srv_code srv_model_config_set_label(srv_model_config *m, const char *label, int64_t version, srv_error *err) {
    for (int k = 0; k < m->nlabels; k++)
        if (strcmp(m->label_names[k], label) == 0) {
            m->label_versions[k] = version;
            return SRV_OK;
        }
    char **ln = realloc(m->label_names, (size_t)(m->nlabels + 1) * sizeof *ln);
    if (!ln) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    m->label_names = ln;
    int64_t *lv = realloc(m->label_versions, (size_t)(m->nlabels + 1) * sizeof *lv);
    if (!lv) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    m->label_versions = lv;
    if (!(m->label_names[m->nlabels] = strdup(label))) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    m->label_versions[m->nlabels++] = version;
    return SRV_OK;
}

/* After the loads: each listed model must have a version available; else its highest version's error. */
srv_code srv_registry_check_available(srv_registry *reg, const srv_model_config *cfgs, int n, srv_error *err) {
    for (int i = 0; i < n; i++) {
        srv_version_status *st = NULL;
        int ns = 0, ok = 0;
        if (srv_registry_status(reg, cfgs[i].name, 0, NULL, &st, &ns, err) != SRV_OK) return err->code;
        for (int k = 0; k < ns; k++) ok |= st[k].state == SRV_STATE_AVAILABLE;
        srv_code rc = SRV_OK;
        if (!ok && ns > 0 && st[0].error_code != SRV_OK)
            rc = srv_err(err, st[0].error_code, "model '%s' version %lld did not load: %s", cfgs[i].name,
                         (long long)st[0].version, st[0].error_message ? st[0].error_message : "");
        else if (!ok)
            rc = srv_err(err, SRV_NOT_FOUND, "model '%s': no version is available under base path '%s'", cfgs[i].name,
                         cfgs[i].base_path);
        srv_status_free(st, ns);
        if (rc != SRV_OK) return rc;
    }
    return SRV_OK;
}

/* ---- the traffic router ---- */

int srv_registry_sticky_header(srv_registry *r, const char *model, char *buf, size_t cap) {
    if (atomic_load(&r->routed_models) == 0) return 0;
    pthread_mutex_lock(&r->mu);
    reg_model *m = model ? reg_find_model(r, model) : NULL;
    int has = m && m->cfg.nroutes > 0 && m->cfg.sticky_header;
    if (has) snprintf(buf, cap, "%s", m->cfg.sticky_header);
    pthread_mutex_unlock(&r->mu);
    return has;
}

static uint64_t route_hash(const char *s) { /* FNV-1a, then a 64-bit finaliser so that near keys spread */
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return h;
}

int srv_registry_route(srv_registry *r, const char *model, const char *sticky, char *label, size_t cap, char *shadow,
                       size_t scap) {
    if (atomic_load(&r->routed_models) == 0) return 0; /* the common case: no model routes, no lock */
    pthread_mutex_lock(&r->mu);
    reg_model *m = model ? reg_find_model(r, model) : NULL;
    int routed = m && m->cfg.nroutes > 0;
    if (routed) {
        uint64_t total = 0;
        for (int k = 0; k < m->cfg.nroutes; k++) total += (uint64_t)m->cfg.route_weights[k];
        /* without a sticky key: the model's n-th routed request takes frac(n * golden ratio), a low-discrepancy
         * sequence, so any run of requests splits by the weights within about 1 % (random draws would wander by
         * several % over a few hundred requests) */
        uint64_t u = sticky ? route_hash(sticky) : (m->route_seq++) * 0x9E3779B97F4A7C15ULL;
        uint64_t x = ((u >> 32) * total) >> 32;
        int k = 0;
        for (; k < m->cfg.nroutes - 1 && x >= (uint64_t)m->cfg.route_weights[k]; k++) x -= (uint64_t)m->cfg.route_weights[k];
        snprintf(label, cap, "%s", m->cfg.route_labels[k]);
        snprintf(shadow, scap, "%s", m->cfg.shadow ? m->cfg.shadow : "");
    }
    pthread_mutex_unlock(&r->mu);
    return routed;
}

/* ---- for the REST handlers: metrics labels and Triton's model configuration ---- */

int srv_registry_has_label(srv_registry *r, const char *model, const char *label) {
    int64_t version;
    pthread_mutex_lock(&r->mu);
    reg_model *m = model && label ? reg_find_model(r, model) : NULL;
    int has = m && label_version(m, label, &version);
    pthread_mutex_unlock(&r->mu);
    return has;
}

const srv_batch_opts *srv_registry_batching(const srv_registry *r) { return r->opts.batching; }
