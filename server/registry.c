/* registry.c - the model registry: configured models, their versions' states, polling base paths, loading,
 * hot swap, labels, status, and the request path's acquire. The version object itself (load, warm-up,
 * predict, release) lives in version.c; reading a base path and signature.json in bundle.c (over
 * engine/bundle.c's version-name rule and scan).
 *
 * Locks (poll_mu before thr_mu or mu; thr_mu and mu are never held together):
 *   poll_mu  serialises scans/loads (srv_registry_poll). Held for the whole poll, loads included; the request
 *            path never takes it.
 *   thr_mu   the poller thread's stop/kick flags and condvar.
 *   mu       the model table: configs, labels, per-version states and the published (acquirable) versions,
 *            and the live-object count. Held only briefly: never while parsing, planning, warming up or
 *            running a model, so a load never blocks requests (TF Serving #1866).
 * Invariants:
 *   - A published version (reg_ver.v != NULL) holds one reference owned by the registry; every acquire adds
 *     one, every release drops one. The object is destroyed when the count reaches zero, whoever drops last;
 *     its reg_ver entry then goes UNLOADING -> END (matched by the object's unique id, so a newer load of the
 *     same version number is never touched).
 *   - Availability first: a poll publishes the newly aspired versions before it retires versions that left
 *     the aspired set, and a version that failed to load is excluded from the aspired set, so a failed load
 *     never retires or replaces what is serving. A failed version is retried only after its directory or
 *     model.onnx changes (srv_bundle_stamp).
 *   - r->live counts version objects not yet destroyed; srv_registry_free waits for it to reach zero.
 */
#define _GNU_SOURCE
#include "registry.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bundle.h"
#include "metrics.h"
#include "version.h"

#define KEEP_ENDED 32 /* END entries of versions gone from disk kept for status */


typedef struct reg_ver {
    int64_t version;
    srv_state state;
    srv_code error_code;
    char *error_message;      /* NULL: none */
    srv_version *v;           /* published object (registry's reference), NULL if none */
    uint64_t ending_id;       /* retired object still referenced by requests, 0 if none */
    int failed;               /* load failed for this stamp: not retried until it changes */
    srv_bundle_stamp failed_stamp;
    int on_disk;
} reg_ver;

typedef struct reg_model {
    srv_model_config cfg;     /* label fields unused: labels live below */
    uint64_t gen;             /* identity across reconfiguration */
    reg_ver *vers;
    int nvers, cap;
    char **lnames;
    int64_t *lvers;
    int nl;
} reg_model;

struct srv_registry {
    srv_registry_opts opts;
    srv_batch_opts batch;
    pthread_mutex_t mu, poll_mu, thr_mu;
    pthread_cond_t live_cv, thr_cv;
    reg_model **models;
    int nmodels;
    uint64_t next_gen, next_id;
    int live;
    pthread_t thr;
    int thr_running, stop, kick, polled_once;
    double poll_s;
};

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
    memset(c, 0, sizeof *c);
}

static char *dupz(const char *s) { return s ? strdup(s) : NULL; }

static int cfg_copy(srv_model_config *d, const srv_model_config *s) {
    memset(d, 0, sizeof *d);
    d->policy = s->policy;
    d->latest_n = s->latest_n > 0 ? s->latest_n : 1;
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
    if (!ok) srv_model_config_free(d);
    return ok ? 0 : -1;
}

static reg_model *find_model(srv_registry *r, const char *name) {
    for (int i = 0; i < r->nmodels; i++)
        if (strcmp(r->models[i]->cfg.name, name) == 0) return r->models[i];
    return NULL;
}

static reg_model *find_model_gen(srv_registry *r, const char *name, uint64_t gen) {
    reg_model *m = find_model(r, name);
    return m && m->gen == gen ? m : NULL;
}

static reg_ver *find_ver(reg_model *m, int64_t version) {
    for (int i = 0; i < m->nvers; i++)
        if (m->vers[i].version == version) return &m->vers[i];
    return NULL;
}

/* Under mu. NULL on OOM. Pointers into m->vers are invalidated. */
static reg_ver *get_ver(reg_model *m, int64_t version) {
    reg_ver *e = find_ver(m, version);
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

static void set_error(reg_ver *e, srv_code code, const char *msg) {
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
    labels_free(m);
    srv_model_config_free(&m->cfg);
    free(m);
}

/* ---- registry ---- */

srv_registry *srv_registry_new(const srv_registry_opts *o) {
    srv_registry *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    if (o) r->opts = *o;
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
    pthread_condattr_destroy(&ca);
    return r;
}

static int count_published(const reg_model *m) {
    int n = 0;
    for (int i = 0; i < m->nvers; i++) n += m->vers[i].v != NULL;
    return n;
}

/* Under mu: detach every published version of m into out (room for count_published(m) more entries), marking
 * them UNLOADING. */
static void detach_all(reg_model *m, srv_version **out, int *n) {
    for (int i = 0; i < m->nvers; i++) {
        reg_ver *e = &m->vers[i];
        if (!e->v) continue;
        out[(*n)++] = e->v;
        e->ending_id = e->v->id;
        e->v = NULL;
        e->state = SRV_STATE_UNLOADING;
    }
}

static void retire(srv_registry *r, srv_version **vs, int n) {
    for (int i = 0; i < n; i++) {
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
    reg_model *m = model ? find_model(r, model) : NULL;
    reg_ver *e = m ? find_ver(m, version) : NULL;
    if (e && e->ending_id == id) {
        e->ending_id = 0;
        if (e->state == SRV_STATE_UNLOADING) e->state = SRV_STATE_END;
    }
    /* metrics is still alive here: srv_registry_free waits for live == 0, and its owner frees it after that */
    if (r->opts.metrics && model && !(e && e->v && e->v->id != id)) {
        srv_metrics_state(r->opts.metrics, model, version, SRV_STATE_END);
        srv_metrics_forget(r->opts.metrics, model, version);
    }
    r->live--;
    pthread_cond_broadcast(&r->live_cv);
    pthread_mutex_unlock(&r->mu);
}

static void metrics_state(srv_metrics *mt, const char *model, int64_t version, srv_state s) {
    if (mt) srv_metrics_state(mt, model, version, (int)s);
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
    pthread_mutex_lock(&r->poll_mu);
    srv_version **vs = NULL;
    int nv = 0;
    for (;;) { /* retry on OOM: the table's references must all be dropped before we wait */
        pthread_mutex_lock(&r->mu);
        int cnt = 0;
        for (int i = 0; i < r->nmodels; i++) cnt += count_published(r->models[i]);
        if (cnt == 0 || (vs = malloc((size_t)cnt * sizeof *vs)) != NULL) {
            for (int i = 0; i < r->nmodels; i++) detach_all(r->models[i], vs, &nv);
            pthread_mutex_unlock(&r->mu);
            break;
        }
        pthread_mutex_unlock(&r->mu);
    }
    retire(r, vs, nv);
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
    free(r);
    *rp = NULL;
}


/* ---- polling: scan, load, publish, then retire ---- */

typedef struct poll_job {
    char *name, *base;
    srv_policy policy;
    int latest_n;
    int64_t *versions;
    int nversions;
    uint64_t gen;
} poll_job;

static int in_list(const int64_t *a, int n, int64_t x) {
    for (int i = 0; i < n; i++)
        if (a[i] == x) return 1;
    return 0;
}

/* Under mu: the policy applied to the versions on disk (highest first), versions that failed to load with the
 * same stamp left out, so a bad newest version does not push a good older one out of latest{N}. */
static int compute_aspired(const poll_job *j, reg_model *m, const srv_bundle_ver *disk, int nd, int64_t *asp) {
    int na = 0;
    for (int i = 0; i < nd; i++) {
        reg_ver *e = find_ver(m, disk[i].version);
        if (e && e->failed && srv_bundle_stamp_equal(&e->failed_stamp, &disk[i].stamp)) continue;
        if (j->policy == SRV_POLICY_LATEST && na >= j->latest_n) break;
        if (j->policy == SRV_POLICY_SPECIFIC && !in_list(j->versions, j->nversions, disk[i].version)) continue;
        asp[na++] = disk[i].version;
    }
    return na;
}

/* Loads one version and publishes it (or records the failure). Returns 1 on a load failure. */
static int load_one(srv_registry *r, const poll_job *j, int64_t ver, const srv_bundle_stamp *stamp) {
    srv_metrics *mt = r->opts.metrics;
    pthread_mutex_lock(&r->mu);
    reg_model *m = find_model_gen(r, j->name, j->gen);
    reg_ver *e = m ? get_ver(m, ver) : NULL;
    if (e) e->state = SRV_STATE_LOADING;
    pthread_mutex_unlock(&r->mu);
    if (!e) return 0;
    metrics_state(mt, j->name, ver, SRV_STATE_LOADING);
    srv_version *v = NULL;
    srv_error err = {0};
    srv_version_ctx ctx = {.reg = r, .session_threads = r->opts.session_threads, .batching = r->opts.batching,
                           .metrics = mt};
    pthread_mutex_lock(&r->mu);
    ctx.id = ++r->next_id;
    r->live++; /* dropped by srv_registry_version_ended when the object is destroyed, on failure too */
    pthread_mutex_unlock(&r->mu);
    srv_code c = srv_version_load(&ctx, j->name, j->base, ver, &v, &err);
    pthread_mutex_lock(&r->mu);
    m = find_model_gen(r, j->name, j->gen);
    e = m ? get_ver(m, ver) : NULL;
    if (e && c == SRV_OK) {
        e->v = v;
        e->state = SRV_STATE_AVAILABLE;
        e->failed = 0;
        set_error(e, SRV_OK, NULL);
    } else if (e) {
        e->state = SRV_STATE_END;
        e->failed = 1;
        e->failed_stamp = *stamp;
        set_error(e, c, err.msg);
    }
    pthread_mutex_unlock(&r->mu);
    if (c == SRV_OK && mt) {
        srv_metrics_load(mt, j->name, ver, v->info.load_ms, v->info.weight_bytes);
        srv_metrics_swap(mt, j->name, ver, "load");
        srv_metrics_state(mt, j->name, ver, SRV_STATE_AVAILABLE);
    } else if (c != SRV_OK && mt) {
        srv_metrics_swap(mt, j->name, ver, "load_failed");
    }
    if (c == SRV_OK && !e) srv_version_release(v); /* the model was removed while it loaded */
    return c != SRV_OK;
}

/* Under mu: drop END entries of versions gone from disk beyond the KEEP_ENDED highest. */
static void prune_ended(reg_model *m) {
    for (;;) {
        int low = -1, cnt = 0;
        for (int i = 0; i < m->nvers; i++) {
            reg_ver *e = &m->vers[i];
            if (e->state != SRV_STATE_END || e->v || e->ending_id || e->on_disk) continue;
            cnt++;
            if (low < 0 || e->version < m->vers[low].version) low = i;
        }
        if (cnt <= KEEP_ENDED || low < 0) break;
        free(m->vers[low].error_message);
        m->vers[low] = m->vers[--m->nvers];
    }
}

static int stopping(srv_registry *r) {
    pthread_mutex_lock(&r->thr_mu);
    int s = r->stop;
    pthread_mutex_unlock(&r->thr_mu);
    return s;
}

static void poll_model(srv_registry *r, const poll_job *j) {
    srv_bundle_ver *disk = NULL;
    int nd = 0;
    srv_error e = {0};
    if (srv_bundle_scan(j->name, j->base, &disk, &nd, &e) != SRV_OK) return; /* unreadable: keep serving */
    int64_t *asp = calloc((size_t)nd + 1, sizeof *asp), *todo = calloc((size_t)nd + 1, sizeof *todo);
    srv_version **old = NULL;
    int nold = 0;
    if (!asp || !todo) goto out;
    for (int round = 0; round <= nd; round++) {
        int nt = 0;
        pthread_mutex_lock(&r->mu);
        reg_model *m = find_model_gen(r, j->name, j->gen);
        if (!m) {
            pthread_mutex_unlock(&r->mu);
            goto out;
        }
        if (round == 0)
            for (int i = 0; i < m->nvers; i++) {
                m->vers[i].on_disk = 0;
                for (int k = 0; k < nd; k++) m->vers[i].on_disk |= disk[k].version == m->vers[i].version;
            }
        int na = compute_aspired(j, m, disk, nd, asp);
        for (int i = 0; i < na; i++) {
            reg_ver *ev = find_ver(m, asp[i]);
            if (!ev || !ev->v) todo[nt++] = asp[i];
        }
        for (int i = 0; i < nt; i++) {
            reg_ver *ev = get_ver(m, todo[i]);
            if (!ev) continue;
            ev->state = SRV_STATE_START;
            ev->on_disk = 1;
            set_error(ev, SRV_OK, NULL);
        }
        pthread_mutex_unlock(&r->mu);
        if (nt == 0) break;
        int failures = 0;
        for (int i = 0; i < nt; i++) metrics_state(r->opts.metrics, j->name, todo[i], SRV_STATE_START);
        for (int i = 0; i < nt && !stopping(r); i++) { /* highest first: the newest serves as early as possible */
            const srv_bundle_stamp *st = NULL;
            for (int k = 0; k < nd; k++)
                if (disk[k].version == todo[i]) st = &disk[k].stamp;
            failures += load_one(r, j, todo[i], st);
        }
        if (!failures) break;
    }
    /* Retire only now, after the aspired versions were published. */
    pthread_mutex_lock(&r->mu);
    reg_model *m = find_model_gen(r, j->name, j->gen);
    int na = m ? compute_aspired(j, m, disk, nd, asp) : 0;
    for (int i = 0; m && i < m->nvers; i++) {
        reg_ver *ev = &m->vers[i];
        if (!ev->v || in_list(asp, na, ev->version)) continue;
        srv_version **nv = realloc(old, (size_t)(nold + 1) * sizeof *nv);
        if (!nv) break; /* retried at the next poll */
        old = nv;
        old[nold++] = ev->v;
        ev->ending_id = ev->v->id;
        ev->v = NULL;
        ev->state = SRV_STATE_UNLOADING;
    }
    if (m) prune_ended(m);
    pthread_mutex_unlock(&r->mu);
out:
    retire(r, old, nold);
    free(asp);
    free(todo);
    free(disk);
}

static void jobs_free(poll_job *jobs, int n) {
    for (int i = 0; jobs && i < n; i++) {
        free(jobs[i].name);
        free(jobs[i].base);
        free(jobs[i].versions);
    }
    free(jobs);
}

void srv_registry_poll(srv_registry *r) {
    pthread_mutex_lock(&r->poll_mu);
    pthread_mutex_lock(&r->mu);
    int n = r->nmodels;
    poll_job *jobs = calloc((size_t)n + 1, sizeof *jobs);
    for (int i = 0; jobs && i < n; i++) {
        const srv_model_config *c = &r->models[i]->cfg;
        poll_job *j = &jobs[i];
        j->name = strdup(c->name);
        j->base = strdup(c->base_path);
        j->policy = c->policy;
        j->latest_n = c->latest_n > 0 ? c->latest_n : 1;
        j->gen = r->models[i]->gen;
        if (c->nversions > 0 && (j->versions = malloc((size_t)c->nversions * sizeof *j->versions))) {
            memcpy(j->versions, c->versions, (size_t)c->nversions * sizeof *j->versions);
            j->nversions = c->nversions;
        }
    }
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; jobs && i < n && !stopping(r); i++)
        if (jobs[i].name && jobs[i].base) poll_model(r, &jobs[i]);
    jobs_free(jobs, n);
    pthread_mutex_unlock(&r->poll_mu);
}

static void *poller_main(void *arg) {
    srv_registry *r = arg;
    pthread_mutex_lock(&r->thr_mu);
    while (!r->stop) {
        if (!r->kick) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            double s = r->poll_s;
            ts.tv_sec += (time_t)s;
            ts.tv_nsec += (long)((s - (double)(time_t)s) * 1e9);
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            while (!r->stop && !r->kick && pthread_cond_timedwait(&r->thr_cv, &r->thr_mu, &ts) != ETIMEDOUT) {}
        }
        if (r->stop) break;
        r->kick = 0;
        pthread_mutex_unlock(&r->thr_mu);
        srv_registry_poll(r);
        pthread_mutex_lock(&r->thr_mu);
    }
    pthread_mutex_unlock(&r->thr_mu);
    return NULL;
}

int srv_registry_start(srv_registry *r, double poll_seconds) {
    pthread_mutex_lock(&r->thr_mu);
    r->polled_once = 1;
    int running = r->thr_running;
    if (running && poll_seconds > 0) r->poll_s = poll_seconds;
    pthread_mutex_unlock(&r->thr_mu);
    if (running) return 0;
    srv_registry_poll(r); /* the first scan is synchronous, like TF Serving's startup */
    if (poll_seconds <= 0) return 0;
    pthread_mutex_lock(&r->thr_mu);
    int rc = 0;
    if (!r->thr_running && !r->stop) {
        r->poll_s = poll_seconds;
        rc = pthread_create(&r->thr, NULL, poller_main, r) == 0 ? 0 : -1;
        r->thr_running = rc == 0;
    }
    pthread_mutex_unlock(&r->thr_mu);
    return rc;
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
        for (int q = 0; q < i; q++)
            if (strcmp(cfgs[q].name, c->name) == 0)
                return srv_err(err, SRV_INVALID_ARGUMENT, "model '%s' is configured twice", c->name);
    }
    return SRV_OK;
}

/* Under mu: FAILED_PRECONDITION naming the first label that points at a version that is not AVAILABLE. */
static srv_code check_labels(srv_registry *r, const srv_model_config *cfgs, int n, srv_error *err) {
    if (r->opts.allow_labels_for_unavailable) return SRV_OK;
    for (int i = 0; i < n; i++) {
        reg_model *m = find_model(r, cfgs[i].name);
        for (int k = 0; m && k < cfgs[i].nlabels; k++) {
            reg_ver *e = find_ver(m, cfgs[i].label_versions[k]);
            if (!e || !e->v)
                return srv_err(err, SRV_FAILED_PRECONDITION,
                               "model '%s': version label '%s' points at version %lld, which is not available (state %s); "
                               "set --allow_version_labels_for_unavailable_models to allow this",
                               cfgs[i].name, cfgs[i].label_names[k], (long long)cfgs[i].label_versions[k],
                               srv_state_name(e ? e->state : SRV_STATE_UNKNOWN));
        }
    }
    return SRV_OK;
}

srv_code srv_registry_set_config(srv_registry *r, const srv_model_config *cfgs, int n, srv_error *err) {
    srv_code c = validate_config(cfgs, n, err);
    if (c != SRV_OK) return c;
    reg_model **nm = calloc((size_t)n + 1, sizeof *nm);
    srv_model_config *cp = calloc((size_t)n + 1, sizeof *cp);
    int ncp = 0;
    for (; nm && cp && ncp < n; ncp++)
        if (cfg_copy(&cp[ncp], &cfgs[ncp]) != 0) break;
    if (!nm || !cp || ncp < n) {
        for (int i = 0; cp && i < ncp; i++) srv_model_config_free(&cp[i]);
        free(cp);
        free(nm);
        return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory copying the model config");
    }
    srv_version **old = NULL;
    int nold = 0;
    pthread_mutex_lock(&r->mu);
    int ok = 1;
    for (int i = 0; i < n && ok; i++) {
        reg_model *m = find_model(r, cp[i].name);
        if (!m && (m = calloc(1, sizeof *m)) != NULL) m->gen = ++r->next_gen;
        ok = m != NULL;
        nm[i] = m;
    }
    if (!ok) { /* OOM: nothing changed */
        for (int i = 0; i < n; i++)
            if (nm[i] && !find_model(r, cp[i].name)) free(nm[i]);
        pthread_mutex_unlock(&r->mu);
        for (int i = 0; i < n; i++) srv_model_config_free(&cp[i]);
        free(cp);
        free(nm);
        return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory applying the model config");
    }
    int cnt = 0;
    for (int i = 0; i < r->nmodels; i++) cnt += count_published(r->models[i]);
    ok = (old = malloc((size_t)cnt * sizeof *old + 1)) != NULL;
    if (!ok) { /* OOM: nothing changed */
        for (int i = 0; i < n; i++)
            if (nm[i] && !find_model(r, cp[i].name)) free(nm[i]);
        pthread_mutex_unlock(&r->mu);
        for (int i = 0; i < n; i++) srv_model_config_free(&cp[i]);
        free(cp);
        free(nm);
        return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory applying the model config");
    }
    for (int i = 0; i < r->nmodels; i++) {
        reg_model *m = r->models[i];
        int kept = 0;
        for (int k = 0; k < n && !kept; k++) kept = nm[k] == m;
        if (kept) continue;
        detach_all(m, old, &nold);
        model_free(m);
    }
    for (int i = 0; i < n; i++) {
        srv_model_config *mc = &nm[i]->cfg;
        char **ln = cp[i].label_names;
        int64_t *lv = cp[i].label_versions;
        int nl = cp[i].nlabels;
        cp[i].label_names = NULL;
        cp[i].label_versions = NULL;
        cp[i].nlabels = 0;
        srv_model_config_free(mc);
        *mc = cp[i];
        cp[i].label_names = ln; /* labels stay pending in cp until checked */
        cp[i].label_versions = lv;
        cp[i].nlabels = nl;
        cp[i].name = strdup(mc->name);
        cp[i].base_path = NULL;
        cp[i].platform = NULL;
        cp[i].versions = NULL;
        cp[i].nversions = 0;
    }
    free(r->models);
    r->models = nm;
    r->nmodels = n;
    c = check_labels(r, cp, n, err);
    pthread_mutex_unlock(&r->mu);
    retire(r, old, nold);

    pthread_mutex_lock(&r->thr_mu);
    int running = r->thr_running, polled = r->polled_once;
    if (running) {
        r->kick = 1;
        pthread_cond_broadcast(&r->thr_cv);
    }
    pthread_mutex_unlock(&r->thr_mu);
    /* Load now when labels wait for versions (TF Serving loads the models before it applies labels, also at
     * startup), or when no poller thread will pick up the change. */
    if (c != SRV_OK || (!running && polled)) {
        srv_registry_poll(r);
        pthread_mutex_lock(&r->mu);
        c = check_labels(r, cp, n, err);
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < n && c == SRV_OK; i++) {
        reg_model *m = find_model(r, cp[i].name);
        if (!m) continue;
        labels_free(m);
        m->lnames = cp[i].label_names;
        m->lvers = cp[i].label_versions;
        m->nl = cp[i].nlabels;
        cp[i].label_names = NULL;
        cp[i].label_versions = NULL;
        cp[i].nlabels = 0;
    }
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; i < n; i++) srv_model_config_free(&cp[i]);
    free(cp);
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
    reg_model *m = find_model(r, model);
    if (!m) {
        srv_err(err, SRV_NOT_FOUND, "model '%.300s' not found (Servable not found for request)", model);
    } else if (label && !label_version(m, label, &version)) {
        srv_err(err, SRV_NOT_FOUND, "model '%s': no version label '%.300s'", model, label);
    } else if (version > 0) {
        reg_ver *e = find_ver(m, version);
        if (e && e->v) v = e->v;
        else if (e && e->state != SRV_STATE_UNKNOWN)
            srv_err(err, SRV_UNAVAILABLE, "model '%s' version %lld is not available (state %s)%s%s", model,
                    (long long)version, srv_state_name(e->state), e->error_message ? ": " : "",
                    e->error_message ? e->error_message : "");
        else srv_err(err, SRV_NOT_FOUND, "model '%s' version %lld not found", model, (long long)version);
    } else {
        for (int i = 0; i < m->nvers; i++)
            if (m->vers[i].v && (!v || m->vers[i].version > v->version)) v = m->vers[i].v;
        if (!v && m->nvers)
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
    reg_model *m = model ? find_model(r, model) : NULL;
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

int srv_registry_has_model(srv_registry *r, const char *model) {
    pthread_mutex_lock(&r->mu);
    int has = model && find_model(r, model) != NULL;
    pthread_mutex_unlock(&r->mu);
    return has;
}
