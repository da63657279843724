/* registry-poll.c - keeping each model's versions in line with its base path and version policy: the
 * reconcile step (scan, aspired set, start loads, retire), the waiting srv_registry_poll, the poller thread,
 * and explicit model control (Triton's repository load/unload), which reuses the same step on request.
 *
 * A reconcile step runs under poll_mu and never waits for a load: loads run on loader.c's threads, so the
 * poller keeps scanning while one is slow or stuck, and a newer version starts loading whatever an older one
 * does. Waiting (srv_registry_poll, srv_registry_load_model) happens between steps with no lock held but mu
 * (on load_cv), each load bounded by its deadline.
 * Invariants:
 *   - Availability first: a step retires published versions that left the aspired set, and cancels loads of
 *     versions that left it, only when no aspired version is still loading; a failed or timed-out version is
 *     not aspired (same stamp), so the next lower one is, and what serves stays.
 *   - A base path that cannot be read keeps what serves, and is logged once when it goes bad and once when it
 *     can be read again; an empty one is logged once.
 *   - With explicit control the poller thread never runs: a model's versions change only at start-up (every
 *     configured model is loaded once, like Triton's --load_model=*), on a config change that adds it, or on
 *     srv_registry_load_model / srv_registry_unload_model. An unloaded model is skipped by every step until it
 *     is loaded again.
 */
#define _GNU_SOURCE
#include "registry-impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void job_clear(poll_job *j) {
    free(j->name);
    free(j->base);
    free(j->versions);
    free(j->pins);
    memset(j, 0, sizeof *j);
}

int reg_job_of(const reg_model *m, poll_job *j) {
    const srv_model_config *c = &m->cfg;
    memset(j, 0, sizeof *j);
    j->name = strdup(c->name);
    j->base = strdup(c->base_path);
    j->policy = c->policy;
    j->latest_n = c->latest_n > 0 ? c->latest_n : 1;
    j->gen = m->gen;
    if (c->nversions > 0 && (j->versions = malloc((size_t)c->nversions * sizeof *j->versions))) {
        memcpy(j->versions, c->versions, (size_t)c->nversions * sizeof *j->versions);
        j->nversions = c->nversions;
    }
    int np = m->nl + m->npend;
    if (np > 0 && (j->pins = malloc((size_t)np * sizeof *j->pins))) {
        if (m->nl) memcpy(j->pins, m->lvers, (size_t)m->nl * sizeof *j->pins);
        if (m->npend) memcpy(j->pins + m->nl, m->pend, (size_t)m->npend * sizeof *j->pins);
        j->npins = np;
    }
    int ok = j->name && j->base && (c->nversions <= 0 || j->versions) && (np <= 0 || j->pins);
    if (!ok) job_clear(j);
    return ok ? 0 : -1;
}

void reg_jobs_free(poll_job *jobs, int n) {
    for (int i = 0; jobs && i < n; i++) job_clear(&jobs[i]);
    free(jobs);
}

static int in_list(const int64_t *a, int n, int64_t x) {
    for (int i = 0; i < n; i++)
        if (a[i] == x) return 1;
    return 0;
}

/* A version on disk that is not aspired: it failed to load with the same stamp, or was retired for lost devices. */
static int disk_ver_barred(reg_model *m, const srv_bundle_ver *d) {
    const reg_ver *e = reg_find_ver(m, d->version);
    return e && ((e->failed && srv_bundle_stamp_equal(&e->failed_stamp, &d->stamp)) || e->lost);
}

/* Under mu: the policy applied to the versions on disk (highest first), barred ones (disk_ver_barred) left out, so a
 * bad newest version does not push a good older one out of latest{N}; *npol of them. Then the versions on disk that a
 * label pins, whatever the policy. */
static int compute_aspired(const poll_job *j, reg_model *m, const srv_bundle_ver *disk, int nd, int64_t *asp,
                           int *npol) {
    int na = 0;
    for (int i = 0; i < nd; i++) {
        if (disk_ver_barred(m, &disk[i])) continue;
        if (j->policy == SRV_POLICY_LATEST && na >= j->latest_n) break;
        if (j->policy == SRV_POLICY_SPECIFIC && !in_list(j->versions, j->nversions, disk[i].version)) continue;
        asp[na++] = disk[i].version;
    }
    *npol = na;
    for (int i = 0; i < nd; i++) {
        if (disk_ver_barred(m, &disk[i])) continue;
        if (in_list(j->pins, j->npins, disk[i].version) && !in_list(asp, na, disk[i].version)) asp[na++] = disk[i].version;
    }
    return na;
}

/* Under mu: drop END entries of versions gone from disk beyond the REG_KEEP_ENDED highest. */
static void prune_ended(reg_model *m) {
    for (;;) {
        int low = -1, cnt = 0;
        for (int i = 0; i < m->nvers; i++) {
            reg_ver *e = &m->vers[i];
            if (e->state != SRV_STATE_END || e->v || e->ending_id || e->load_id || e->on_disk) continue;
            cnt++;
            if (low < 0 || e->version < m->vers[low].version) low = i;
        }
        if (cnt <= REG_KEEP_ENDED || low < 0) break;
        free(m->vers[low].error_message);
        m->vers[low] = m->vers[--m->nvers];
    }
}

/* The message without its "model 'm': " prefix (log lines carry the model). */
static const char *strip_model(const char *msg, const char *model) {
    size_t n = strlen(model);
    if (strncmp(msg, "model '", 7) == 0 && strncmp(msg + 7, model, n) == 0 && strncmp(msg + 7 + n, "': ", 3) == 0)
        return msg + 10 + n;
    return msg;
}

/* Under mu: the base path's health for the log: once when it goes bad or empty, once when it recovers. */
static void note_base(reg_model *m, const poll_job *j, srv_code sc, const srv_error *e, int nd, reg_notes *ns) {
    if (sc != SRV_OK) {
        if (!m->base_bad)
            reg_note_add(ns, SRV_LOG_ERROR, "base_path", j->name, 0,
                         "%s; no version of this model loads until it can be read (what serves keeps serving)",
                         strip_model(e->msg, j->name));
        m->base_bad = 1;
        return;
    }
    if (m->base_bad)
        reg_note_add(ns, SRV_LOG_INFO, "base_path", j->name, 0, "base path '%s' can be read again (%d version%s)",
                     j->base, nd, nd == 1 ? "" : "s");
    m->base_bad = 0;
    if (nd == 0 && !m->no_versions)
        reg_note_add(ns, SRV_LOG_WARN, "no_versions", j->name, 0,
                     "no version directory under base path '%s' (expected <base>/<n>/model.onnx, n a positive "
                     "integer)", j->base);
    m->no_versions = nd == 0;
}

/* One reconcile step for j (poll_mu held, mu not): scan its base path, then under mu apply the policy, start
 * loads for aspired versions that are neither published nor loading, and, once none of them is still loading,
 * retire published versions and cancel loads that left the aspired set. Returns how many aspired versions are
 * still loading. scan_err (may be NULL) gets a scan failure, or NOT_FOUND when the base path holds no version. */
static int reconcile(srv_registry *r, const poll_job *j, reg_notes *ns, srv_error *scan_err) {
    srv_bundle_ver *disk = NULL;
    int nd = 0, pending = 0, nold = 0;
    srv_error se = {0};
    srv_code sc = srv_bundle_scan(j->name, j->base, &disk, &nd, &se);
    int64_t *asp = calloc((size_t)nd + 1, sizeof *asp);
    srv_version **old = NULL;
    pthread_mutex_lock(&r->mu);
    reg_load_expire(r, ns);
    reg_model *m = reg_find_model_gen(r, j->name, j->gen);
    if (!m || m->unloaded || r->closing) goto out;
    note_base(m, j, sc, &se, nd, ns);
    if (scan_err && sc != SRV_OK) *scan_err = se;
    else if (scan_err && nd == 0)
        srv_err(scan_err, SRV_NOT_FOUND, "model '%s': no version directory under base path '%s'", j->name, j->base);
    if (sc != SRV_OK || !asp) goto out; /* unreadable (or out of memory): keep serving, try again next time */
    for (int i = 0; i < m->nvers; i++) {
        m->vers[i].on_disk = 0;
        for (int k = 0; k < nd; k++) m->vers[i].on_disk |= disk[k].version == m->vers[i].version;
    }
    int npol = 0, na = compute_aspired(j, m, disk, nd, asp, &npol);
    for (int i = 0; i < na; i++) { /* highest first: the newest serves as early as possible */
        reg_ver *e = reg_find_ver(m, asp[i]);
        if (e && e->v) continue;
        if (e && e->load_id) {
            pending++;
            continue;
        }
        if (!(e = reg_get_ver(m, asp[i]))) continue; /* out of memory: the next step tries again */
        e->state = SRV_STATE_START;
        e->on_disk = 1;
        reg_metrics_state(r, j->name, asp[i], SRV_STATE_START);
        const srv_bundle_stamp *st = NULL;
        for (int k = 0; k < nd; k++)
            if (disk[k].version == asp[i]) st = &disk[k].stamp;
        if (reg_load_start(r, m, e, st, ns) == 0) pending++;
    }
    for (int i = 0; i < m->nvers; i++) m->vers[i].in_policy = in_list(asp, npol, m->vers[i].version);
    if (pending == 0) { /* every aspired version is published (or failed): now retire what left the set */
        old = malloc(((size_t)reg_count_published(m) + 1) * sizeof *old);
        for (int i = 0; old && i < m->nvers; i++) {
            reg_ver *e = &m->vers[i];
            if (!e->v || in_list(asp, na, e->version)) continue;
            old[nold++] = e->v;
            e->ending_id = e->v->id;
            e->v = NULL;
            e->state = SRV_STATE_UNLOADING;
        }
        for (reg_load *l = r->loads, *next; l; l = next) {
            next = l->next;
            if (l->gen == m->gen && strcmp(l->model, m->cfg.name) == 0 && !in_list(asp, na, l->version))
                reg_load_abandon(r, l, SRV_CANCELLED, "load cancelled: the version left the version policy", 0, ns);
        }
    }
    prune_ended(m);
out:
    pthread_mutex_unlock(&r->mu);
    reg_notes_flush(ns);
    reg_retire(r, old, nold, "left the version policy");
    free(asp);
    free(disk);
    return pending;
}

void reg_reconcile_wait(srv_registry *r, const poll_job *jobs, int n, srv_error *scan_err) {
    for (;;) {
        pthread_mutex_lock(&r->mu);
        uint64_t seen = r->load_events; /* before the step: an event during it means "look again" */
        int closing = r->closing;
        pthread_mutex_unlock(&r->mu);
        if (closing) return;
        reg_notes ns = {0};
        int pending = 0;
        pthread_mutex_lock(&r->poll_mu);
        for (int i = 0; i < n; i++)
            if (jobs[i].name) pending += reconcile(r, &jobs[i], &ns, i == 0 ? scan_err : NULL);
        pthread_mutex_unlock(&r->poll_mu);
        if (!pending) return;
        pthread_mutex_lock(&r->mu);
        reg_load_wait(r, seen, 0);
        pthread_mutex_unlock(&r->mu);
    }
}

/* Under mu: jobs for the models a poll looks at (with explicit control: those never reconciled yet, which are
 * then marked so). *n: how many. NULL on OOM. */
static poll_job *poll_jobs(srv_registry *r, int *n) {
    *n = 0;
    poll_job *jobs = calloc((size_t)r->nmodels + 1, sizeof *jobs);
    for (int i = 0; jobs && i < r->nmodels; i++) {
        reg_model *m = r->models[i];
        if (m->unloaded || (r->opts.explicit_control && m->seen)) continue;
        if (reg_job_of(m, &jobs[*n]) != 0) continue;
        m->seen = 1;
        (*n)++;
    }
    return jobs;
}

void srv_registry_poll(srv_registry *r) {
    int n;
    pthread_mutex_lock(&r->mu);
    poll_job *jobs = poll_jobs(r, &n);
    pthread_mutex_unlock(&r->mu);
    if (jobs) reg_reconcile_wait(r, jobs, n, NULL);
    reg_jobs_free(jobs, n);
}

/* The poller thread's scan: one reconcile step per model, no waiting. */
static void poll_once(srv_registry *r) {
    int n;
    reg_notes ns = {0};
    pthread_mutex_lock(&r->mu);
    reg_load_expire(r, &ns); /* also when no model is left to scan */
    poll_job *jobs = poll_jobs(r, &n);
    pthread_mutex_unlock(&r->mu);
    reg_notes_flush(&ns);
    pthread_mutex_lock(&r->poll_mu);
    for (int i = 0; jobs && i < n; i++) reconcile(r, &jobs[i], &ns, NULL);
    pthread_mutex_unlock(&r->poll_mu);
    reg_jobs_free(jobs, n);
}

static void *poller_main(void *arg) {
    srv_registry *r = arg;
    for (;;) {
        pthread_mutex_lock(&r->mu); /* wake for the earliest load deadline too, to fail that version on time */
        int64_t dl = reg_load_next_deadline(r);
        pthread_mutex_unlock(&r->mu);
        pthread_mutex_lock(&r->thr_mu);
        if (!r->stop && !r->kick) {
            int64_t until = srv_now_us() + (int64_t)(r->poll_s * 1e6);
            if (dl && dl < until) until = dl;
            struct timespec ts = {(time_t)(until / 1000000), (long)(until % 1000000) * 1000};
            while (!r->stop && !r->kick && pthread_cond_timedwait(&r->thr_cv, &r->thr_mu, &ts) != ETIMEDOUT) {}
        }
        int stop = r->stop;
        r->kick = 0;
        pthread_mutex_unlock(&r->thr_mu);
        if (stop) break;
        poll_once(r);
    }
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
    if (poll_seconds <= 0 || r->opts.explicit_control) return 0;
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

/* ---- explicit model control ---- */

static srv_code explicit_off(srv_error *err) {
    return srv_err(err, SRV_UNAVAILABLE,
                   "explicit model load / unload is not allowed if polling is enabled: start tensord with "
                   "--model_control_mode=explicit to load and unload models on request");
}

srv_code srv_registry_load_model(srv_registry *r, const char *model, srv_error *err) {
    if (!r->opts.explicit_control) return explicit_off(err);
    if (!model || !*model) return srv_err(err, SRV_INVALID_ARGUMENT, "no model name given");
    poll_job j;
    pthread_mutex_lock(&r->mu);
    reg_model *m = reg_find_model(r, model);
    if (!m) {
        pthread_mutex_unlock(&r->mu);
        return srv_err(err, SRV_NOT_FOUND, "model '%.300s' is not in the model config, so it cannot be loaded",
                       model);
    }
    int rc = reg_job_of(m, &j);
    if (rc == 0) {
        m->unloaded = 0;
        m->seen = 1;
        for (int i = 0; i < m->nvers; i++) m->vers[i].failed = 0; /* a load request retries failed versions */
    }
    uint64_t gen = m->gen, first_id = r->next_id; /* loads of this request get ids above first_id */
    pthread_mutex_unlock(&r->mu);
    if (rc != 0) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "model '%s': out of memory", model);
    srv_error scan = {0};
    reg_reconcile_wait(r, &j, 1, &scan);
    srv_code c = SRV_OK;
    pthread_mutex_lock(&r->mu);
    m = reg_find_model_gen(r, model, gen);
    const reg_ver *bad = NULL;
    for (int i = 0; m && i < m->nvers; i++) {
        const reg_ver *e = &m->vers[i];
        if (e->last_load_id > first_id && e->state == SRV_STATE_END && e->error_code != SRV_OK &&
            (!bad || e->version > bad->version))
            bad = e;
    }
    if (!m) c = srv_err(err, SRV_NOT_FOUND, "model '%s' was removed from the config while it loaded", model);
    else if (m->unloaded) c = srv_err(err, SRV_FAILED_PRECONDITION, "model '%s' was unloaded while it loaded", model);
    else if (r->closing) c = srv_err(err, SRV_UNAVAILABLE, "model '%s': the server is shutting down", model);
    else if (bad) c = srv_err(err, bad->error_code, "%s", bad->error_message ? bad->error_message : "load failed");
    else if (scan.code != SRV_OK) c = srv_err(err, scan.code, "%s", scan.msg);
    else if (!reg_count_published(m))
        c = srv_err(err, SRV_NOT_FOUND, "model '%s': no version under '%s' matches its version policy", model,
                    j.base);
    pthread_mutex_unlock(&r->mu);
    job_clear(&j);
    return c;
}

srv_code srv_registry_unload_model(srv_registry *r, const char *model, srv_error *err) {
    if (!r->opts.explicit_control) return explicit_off(err);
    if (!model || !*model) return srv_err(err, SRV_INVALID_ARGUMENT, "no model name given");
    reg_notes ns = {0};
    srv_version **old = NULL;
    int nold = 0;
    srv_code c = SRV_OK;
    pthread_mutex_lock(&r->mu);
    reg_model *m = reg_find_model(r, model);
    if (!m) {
        c = srv_err(err, SRV_NOT_FOUND, "model '%.300s' is not in the model config", model);
    } else if (!(old = malloc(((size_t)reg_count_published(m) + 1) * sizeof *old))) {
        c = srv_err(err, SRV_RESOURCE_EXHAUSTED, "model '%s': out of memory unloading it", model);
    } else {
        m->unloaded = 1;
        m->seen = 1;
        reg_detach_all(m, old, &nold);
        for (reg_load *l = r->loads, *next; l; l = next) {
            next = l->next;
            if (l->gen == m->gen && strcmp(l->model, m->cfg.name) == 0)
                reg_load_abandon(r, l, SRV_CANCELLED, "load cancelled: the model was unloaded", 0, &ns);
        }
    }
    pthread_mutex_unlock(&r->mu);
    reg_notes_flush(&ns);
    if (c == SRV_OK && !nold) srv_log(SRV_LOG_INFO, "unload", model, 0, "unloaded on request (no version was loaded)");
    reg_retire(r, old, nold, "unloaded on request");
    return c;
}
