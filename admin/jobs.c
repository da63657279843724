/* jobs.c - the training job queue (jobs.h): the scheduler thread, worker processes and their progress, cancel, the
 * rollout of a finished version, Server-Sent Events, and the /v1/admin/jobs routes. Checking a submission and the
 * worker's job file are jobs-submit.c's.
 *
 * Invariants:
 *   - A job's row is the truth: QUEUED rows are started oldest first by the scheduler; a row goes RUNNING before its
 *     worker is forked, and leaves RUNNING only from its reader thread once the worker has exited (or, when the fork
 *     fails, from the scheduler). While the server stops, rows stay RUNNING (the next start queues them again).
 *   - A worker runs in a process of its own (`tensord train --job FILE`, stdout a pipe of JSON lines, stderr to
 *     <state_dir>/jobs/<id>.log) and dies with the server (PR_SET_PDEATHSIG). Its version appears atomically or not at
 *     all (engine/train writes it), so a killed worker leaves no partial version.
 *   - A job_run is freed when its reader thread and every SSE stream on it let go (refs).
 */
#define _GNU_SOURCE
#include "jobs-impl.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "admin-http.h"
#include "server/log.h"

#define JOBS_PREFIX "/v1/admin/jobs"

static int64_t wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void run_unref_locked(adm_jobs *j, job_run *r) {
    (void)j;
    if (--r->refs > 0) return;
    for (int i = 0; i < r->nev; i++) free(r->evs[i].json);
    free(r->evs);
    free(r->progress);
    free(r);
}

/* Under mu: append an event to r's log (the oldest progress event goes when the log is full) and wake streams. */
static void run_event_locked(adm_jobs *j, job_run *r, const char *type, const char *json) {
    if (r->nev == JOB_EVENTS_MAX) {
        int k = 0;
        while (k < r->nev && strcmp(r->evs[k].type, "progress") != 0) k++;
        if (k == r->nev) k = 0;
        free(r->evs[k].json);
        memmove(&r->evs[k], &r->evs[k + 1], (size_t)(r->nev - k - 1) * sizeof *r->evs);
        r->nev--;
        r->base_seq++;
    }
    if (r->nev == r->cap) {
        int nc = r->cap ? 2 * r->cap : 64;
        job_ev *g = realloc(r->evs, (size_t)nc * sizeof *g);
        if (!g) return;
        r->evs = g;
        r->cap = nc;
    }
    char *cp = strdup(json);
    if (!cp) return;
    snprintf(r->evs[r->nev].type, sizeof r->evs[r->nev].type, "%s", type);
    r->evs[r->nev++].json = cp;
    pthread_cond_broadcast(&j->cv);
}

static job_run *run_find_locked(adm_jobs *j, int64_t id) {
    for (job_run *r = j->runs; r; r = r->next)
        if (r->id == id) return r;
    return NULL;
}

/* Write text to path atomically (temp file, fsync, rename). */
static srv_code write_atomic(const char *path, const char *text, srv_error *err) {
    char tmp[4400];
    snprintf(tmp, sizeof tmp, "%.4300s.tmp-%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return srv_err(err, SRV_INTERNAL, "cannot write '%s': %s", tmp, strerror(errno));
    size_t n = strlen(text), off = 0;
    while (off < n) {
        ssize_t w = write(fd, text + off, n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        off += (size_t)w;
    }
    int ok = off == n && fsync(fd) == 0;
    close(fd);
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return srv_err(err, SRV_INTERNAL, "cannot write '%s': %s", path, strerror(errno));
    }
    return SRV_OK;
}

/* ---- rollout ---- */

static double num_of(const cJSON *o, const char *key) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(f) ? f->valuedouble : NAN;
}

/* The model's traffic as a split (sticky header, shadow and auto-rollback kept), with routes replaced. */
static srv_code set_routes(adm_jobs *j, const char *model, int n, char **labels, int *weights, srv_error *err) {
    char *tj = NULL;
    srv_code rc = j->o.ops.get_traffic(j->o.ops.ctx, model, &tj, err);
    if (rc != SRV_OK) return rc;
    cJSON *t = job_parse(tj);
    free(tj);
    adm_split sp = {.n = n, .labels = labels, .weights = weights};
    const cJSON *sticky = cJSON_GetObjectItemCaseSensitive(t, "sticky_header");
    const cJSON *shadow = cJSON_GetObjectItemCaseSensitive(t, "shadow");
    sp.sticky_header = cJSON_IsString(sticky) ? sticky->valuestring : NULL;
    sp.shadow = NULL; /* a shadow on the labels being moved would shadow the wrong version: dropped */
    (void)shadow;
    srv_error ae = {0};
    if (adm_auto_rollback(cJSON_GetObjectItemCaseSensitive(t, "auto_rollback"), &sp, &ae) != 0) sp.ar_on = 0;
    rc = j->o.ops.set_traffic(j->o.ops.ctx, model, &sp, err);
    cJSON_Delete(t);
    return rc;
}

/* Before a job starts: the version serving now becomes `stable` with all routed traffic, unless the model already
 * has a stable label and routes, so the new version (which the version policy may load) takes no traffic before its
 * rollout, and none at all with on_complete none. */
static srv_code pin_stable(adm_jobs *j, const char *model, srv_error *err) {
    char *tj = NULL;
    srv_code rc = j->o.ops.get_traffic(j->o.ops.ctx, model, &tj, err);
    if (rc != SRV_OK) return rc;
    cJSON *t = job_parse(tj);
    free(tj);
    const cJSON *routes = cJSON_GetObjectItemCaseSensitive(t, "routes");
    int has_routes = cJSON_IsObject(routes) && routes->child != NULL;
    cJSON_Delete(t);
    char *lj = NULL;
    if ((rc = j->o.ops.list(j->o.ops.ctx, &lj, err)) != SRV_OK) return rc;
    cJSON *l = job_parse(lj), *mm;
    free(lj);
    int has_stable = 0;
    cJSON_ArrayForEach(mm, cJSON_GetObjectItemCaseSensitive(l, "models")) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(mm, "name");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, model))
            has_stable = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(mm, "labels"), "stable") != NULL;
    }
    cJSON_Delete(l);
    if (!has_stable) {
        adm_model_info *mi = calloc(1, sizeof *mi);
        if (!mi) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
        rc = j->o.ops.model_info(j->o.ops.ctx, model, "latest", mi, err);
        if (rc == SRV_OK) rc = j->o.ops.set_label(j->o.ops.ctx, model, "stable", mi->version, err);
        free(mi);
        if (rc != SRV_OK) return rc;
    }
    if (!has_routes) {
        char *labels[1] = {"stable"};
        int w[1] = {100};
        rc = set_routes(j, model, 1, labels, w, err);
    }
    return rc;
}

/* on_complete for a job that wrote version v with the done event's metrics; the outcome into res. */
static void rollout(adm_jobs *j, const adm_job_rec *r, const cJSON *spec, const cJSON *done, cJSON *res, char **reason) {
    const cJSON *oc = cJSON_GetObjectItemCaseSensitive(spec, "on_complete");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(oc, "action"), *lab = cJSON_GetObjectItemCaseSensitive(oc, "label");
    const char *action = cJSON_IsString(a) ? a->valuestring : "none";
    const char *label = cJSON_IsString(lab) ? lab->valuestring : "canary";
    double pct = num_of(oc, "traffic_percent"), minacc = num_of(oc, "min_val_accuracy"), maxloss = num_of(oc, "max_val_loss");
    double vacc = num_of(done, "val_accuracy"), vloss = num_of(done, "val_loss");
    cJSON *ro = cJSON_AddObjectToObject(res, "rollout");
    cJSON_AddStringToObject(ro, "action", action);
    char why[1024] = "";
    if (!strcmp(action, "none")) {
        cJSON_AddBoolToObject(ro, "applied", 0);
        return;
    }
    if (!isnan(minacc) && !(vacc >= minacc))
        snprintf(why, sizeof why, "not rolled out: val_accuracy %.4f is below min_val_accuracy %.4f", vacc, minacc);
    else if (!isnan(maxloss) && !(vloss <= maxloss))
        snprintf(why, sizeof why, "not rolled out: val_loss %.4f is above max_val_loss %.4f", vloss, maxloss);
    srv_error err = {0};
    srv_code rc = SRV_OK;
    if (!why[0]) {
        int w = isnan(pct) ? 10 : (int)pct;
        rc = j->o.ops.set_label(j->o.ops.ctx, r->model, label, r->new_version, &err);
        if (rc == SRV_OK) {
            char *labels[2] = {"stable", (char *)label};
            int weights[2] = {!strcmp(action, "promote") ? 0 : 100 - w, !strcmp(action, "promote") ? 100 : w};
            rc = set_routes(j, r->model, 2, labels, weights, &err);
        }
        if (rc == SRV_OK && !strcmp(action, "promote")) rc = j->o.ops.promote(j->o.ops.ctx, r->model, &err);
        if (rc != SRV_OK) snprintf(why, sizeof why, "not rolled out: %.900s", err.msg);
    }
    cJSON_AddBoolToObject(ro, "applied", !why[0]);
    if (why[0]) {
        cJSON_AddStringToObject(ro, "reason", why);
        *reason = strdup(why);
        srv_log(SRV_LOG_WARN, "job", r->model, r->new_version, "job %lld: %s", (long long)r->id, why);
    } else {
        if (!strcmp(action, "canary")) cJSON_AddNumberToObject(ro, "traffic_percent", isnan(pct) ? 10 : pct);
        srv_log(SRV_LOG_INFO, "job", r->model, r->new_version, "job %lld: version %lld rolled out (%s)", (long long)r->id,
                (long long)r->new_version, action);
    }
}

/* ---- a worker's life ---- */

static void state_event_locked(adm_jobs *j, job_run *run, const adm_job_rec *r) {
    cJSON *v = job_view(r, run ? run->progress : NULL);
    char *t = v ? cJSON_PrintUnformatted(v) : NULL;
    cJSON_Delete(v);
    if (t && run) run_event_locked(j, run, "state", t);
    free(t);
}

/* The last line of the worker's log (its last word on stderr), for a failure's reason. */
static void log_tail(const char *path, char *buf, size_t cap) {
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        size_t n = strlen(line);
        while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
        if (n) {
            size_t k = n < cap - 1 ? n : cap - 1;
            memcpy(buf, line, k);
            buf[k] = '\0';
        }
    }
    fclose(f);
}

typedef struct reader_arg {
    adm_jobs *j;
    job_run *run;
} reader_arg;

/* The worker's stdout, line by line, until it exits; then the job's end: state, result, rollout. */
static void *reader_main(void *p) {
    reader_arg *ra = p;
    adm_jobs *j = ra->j;
    job_run *run = ra->run;
    free(ra);
    FILE *in = fdopen(run->out_fd, "r");
    char *line = NULL;
    size_t cap = 0;
    cJSON *done = NULL;
    char errmsg[1024] = "", qpath[4200] = ""; /* a quantize worker prints its version's path, then its report */
    int64_t last_save = 0;
    while (in && getline(&line, &cap, in) > 0) {
        cJSON *e = job_parse(line);
        const cJSON *ev = cJSON_GetObjectItemCaseSensitive(e, "event");
        if (!e && line[0] && line[0] != '\n' && !qpath[0]) {
            snprintf(qpath, sizeof qpath, "%.4190s", line);
            qpath[strcspn(qpath, "\r\n")] = '\0';
        }
        if (!cJSON_IsString(ev)) {
            cJSON_Delete(e);
            continue;
        }
        const char *type = ev->valuestring;
        char *t = cJSON_PrintUnformatted(e);
        if (t && (!strcmp(type, "step") || !strcmp(type, "epoch") || !strcmp(type, "start"))) {
            pthread_mutex_lock(&j->mu);
            run_event_locked(j, run, !strcmp(type, "step") ? "progress" : !strcmp(type, "epoch") ? "epoch" : "start", t);
            if (strcmp(type, "start") != 0) { /* the last step's fields, with an epoch's on top */
                cJSON *prev = job_parse(run->progress), *cur = job_parse(t);
                if (prev && cur && !strcmp(type, "epoch")) {
                    for (cJSON *f = cur->child; f; f = f->next) {
                        cJSON_DeleteItemFromObjectCaseSensitive(prev, f->string);
                        cJSON_AddItemToObject(prev, f->string, cJSON_Duplicate(f, 1));
                    }
                    char *m = cJSON_PrintUnformatted(prev);
                    if (m) free(run->progress), run->progress = m;
                } else {
                    free(run->progress);
                    run->progress = strdup(t);
                }
                cJSON_Delete(prev);
                cJSON_Delete(cur);
            }
            pthread_mutex_unlock(&j->mu);
            int64_t now = wall_ms();
            if (strcmp(type, "start") != 0 && (!strcmp(type, "epoch") || now - last_save >= 2000)) {
                srv_error e2 = {0};
                pthread_mutex_lock(&j->mu);
                char *pj = run->progress ? strdup(run->progress) : NULL;
                pthread_mutex_unlock(&j->mu);
                adm_state_job_progress(j->o.state, run->id, pj ? pj : t, &e2);
                free(pj);
                last_save = now;
            }
        } else if (!strcmp(type, "done")) {
            cJSON_Delete(done);
            done = cJSON_Duplicate(e, 1);
        } else if (!strcmp(type, "error")) {
            const cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "message");
            if (cJSON_IsString(m)) snprintf(errmsg, sizeof errmsg, "%s", m->valuestring);
        }
        free(t);
        cJSON_Delete(e);
    }
    free(line);
    if (in) fclose(in);
    else close(run->out_fd);
    int st = 0;
    while (waitpid(run->pid, &st, 0) < 0 && errno == EINTR) {}

    pthread_mutex_lock(&j->mu);
    int stopping = j->stopping, cancelled = run->cancel_requested;
    pthread_mutex_unlock(&j->mu);
    adm_job_rec r;
    srv_error err = {0};
    if (!stopping && adm_state_job_get(j->o.state, run->id, &r, &err) == SRV_OK) {
        cJSON *spec = job_parse(r.spec_json), *res = cJSON_CreateObject();
        char *reason = NULL;
        const char *state = "FAILED";
        char lp[4200], tail[600];
        snprintf(lp, sizeof lp, "%s/%lld.log", j->jobs_dir, (long long)r.id);
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0 && !done && qpath[0]) done = job_quantize_done(qpath, r.new_version);
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0 && done) {
            state = "SUCCEEDED";
            static const char *const keep[] = {"version", "path", "epochs_run", "steps", "loss", "accuracy", "val_loss",
                                               "val_accuracy", "examples_per_sec", NULL};
            for (int i = 0; keep[i]; i++) {
                const cJSON *f = cJSON_GetObjectItemCaseSensitive(done, keep[i]);
                if (f) cJSON_AddItemToObject(res, keep[i], cJSON_Duplicate(f, 1));
            }
            const cJSON *path = cJSON_GetObjectItemCaseSensitive(done, "path");
            if (cJSON_IsString(path)) {
                char mp[4400], tb[4400], base[4200];
                snprintf(mp, sizeof mp, "%.4200s/metrics.json", path->valuestring);
                cJSON_AddStringToObject(res, "metrics_json", mp);
                snprintf(base, sizeof base, "%.4190s", path->valuestring);
                char *slash = strrchr(base, '/');
                if (slash) *slash = '\0';
                snprintf(tb, sizeof tb, "%.4200s/logs/%lld", base, (long long)r.new_version);
                cJSON_AddStringToObject(res, "tensorboard_dir", tb);
            }
            rollout(j, &r, spec, done, res, &reason);
        } else if (cancelled && WIFEXITED(st) && WEXITSTATUS(st) == 3) {
            state = "CANCELLED";
            reason = strdup("cancelled on request; no version written");
        } else {
            char why[1400];
            log_tail(lp, tail, sizeof tail);
            if (WIFSIGNALED(st))
                snprintf(why, sizeof why, "the worker (pid %d) was killed by signal %d (%s); no version written%s%s",
                         (int)run->pid, WTERMSIG(st), strsignal(WTERMSIG(st)), tail[0] ? "; its last words: " : "", tail);
            else if (errmsg[0]) snprintf(why, sizeof why, "%s", errmsg);
            else snprintf(why, sizeof why, "the worker exited with status %d%s%s", WEXITSTATUS(st),
                          tail[0] ? ": " : "", tail);
            reason = strdup(why);
            if (cancelled) state = "CANCELLED";
        }
        if (!strcmp(state, "CANCELLED")) { /* a cancelled run's checkpoints go with it */
            char ck[4200];
            adm_model_info *mi = calloc(1, sizeof *mi);
            char vb[32];
            snprintf(vb, sizeof vb, "%lld", (long long)r.base_version);
            srv_error e3 = {0};
            if (mi && j->o.ops.model_info(j->o.ops.ctx, r.model, vb, mi, &e3) == SRV_OK) {
                snprintf(ck, sizeof ck, "%s/.train-%lld", mi->base_path, (long long)r.new_version);
                srv_remove_tree(ck);
            }
            free(mi);
        }
        free(r.state);
        r.state = strdup(state);
        free(r.reason);
        r.reason = reason;
        free(r.result_json);
        r.result_json = cJSON_PrintUnformatted(res);
        pthread_mutex_lock(&j->mu);
        if (run->progress) {
            free(r.progress_json);
            r.progress_json = strdup(run->progress);
        }
        pthread_mutex_unlock(&j->mu);
        r.ended_ms = wall_ms();
        if (adm_state_job_update(j->o.state, &r, &err) != SRV_OK)
            srv_log(SRV_LOG_ERROR, "job", r.model, r.new_version, "job %lld: could not record its end: %s",
                    (long long)r.id, err.msg);
        srv_log(!strcmp(state, "FAILED") ? SRV_LOG_ERROR : SRV_LOG_INFO, "job", r.model, r.new_version, "job %lld %s%s%s",
                (long long)r.id, state, r.reason ? ": " : "", r.reason ? r.reason : "");
        pthread_mutex_lock(&j->mu);
        state_event_locked(j, run, &r);
        pthread_mutex_unlock(&j->mu);
        cJSON_Delete(spec);
        cJSON_Delete(res);
        adm_job_rec_free(&r);
    }
    cJSON_Delete(done);
    pthread_mutex_lock(&j->mu);
    run->ended = 1;
    for (job_run **pp = &j->runs; *pp; pp = &(*pp)->next)
        if (*pp == run) {
            *pp = run->next;
            break;
        }
    j->nrunning--;
    pthread_cond_broadcast(&j->cv);
    run_unref_locked(j, run);
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

/* Start job r (QUEUED): its row goes RUNNING, its worker is forked. Called by the scheduler without mu. */
static void job_start(adm_jobs *j, adm_job_rec *r) {
    srv_error err = {0};
    cJSON *spec = job_parse(r->spec_json);
    const cJSON *resume_f = cJSON_GetObjectItemCaseSensitive(spec, "_resume");
    int resume = cJSON_IsTrue(resume_f);
    srv_code rc = SRV_OK;
    if (!resume) rc = pin_stable(j, r->model, &err); /* the new version takes no traffic before its rollout */
    if (resume_f) cJSON_DeleteItemFromObjectCaseSensitive(spec, "_resume");
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(spec, "kind");
    int quant = cJSON_IsString(kind) && !strcmp(kind->valuestring, "quantize");
    char **qargv = NULL;
    if (rc == SRV_OK && quant && !(qargv = job_quantize_argv(j, r, j->worker_exe, &err))) rc = err.code ? err.code : SRV_INTERNAL;
    char *wf = rc == SRV_OK ? (quant ? strdup("{}") : job_worker_file(j, r, resume, &err)) : NULL;
    char jf[4200], lf[4200];
    snprintf(jf, sizeof jf, "%s/%lld.json", j->jobs_dir, (long long)r->id);
    snprintf(lf, sizeof lf, "%s/%lld.log", j->jobs_dir, (long long)r->id);
    if (rc == SRV_OK && !wf) rc = err.code ? err.code : SRV_INTERNAL;
    if (rc == SRV_OK) rc = write_atomic(jf, wf, &err);
    free(wf);
    int pfd[2] = {-1, -1};
    job_run *run = rc == SRV_OK ? calloc(1, sizeof *run) : NULL;
    if (rc == SRV_OK && (!run || pipe2(pfd, O_CLOEXEC) != 0))
        rc = srv_err(&err, SRV_INTERNAL, "cannot start a worker: %s", strerror(errno));
    if (rc == SRV_OK) {
        free(r->state);
        r->state = strdup("RUNNING");
        r->started_ms = wall_ms();
        free(r->spec_json);
        r->spec_json = cJSON_PrintUnformatted(spec);
        rc = adm_state_job_update(j->o.state, r, &err);
    }
    pid_t pid = -1;
    if (rc == SRV_OK) {
        int lfd = open(lf, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        pid_t parent = getpid();
        pid = fork();
        if (pid == 0) { /* the server blocks SIGTERM in its threads (sigwait): the worker must not inherit that */
            sigset_t none;
            sigemptyset(&none);
            sigprocmask(SIG_SETMASK, &none, NULL);
            signal(SIGPIPE, SIG_DFL);
            prctl(PR_SET_PDEATHSIG, SIGTERM);
            if (getppid() != parent) _exit(1);
            dup2(pfd[1], 1);
            if (lfd >= 0) dup2(lfd, 2);
            int nul = open("/dev/null", O_RDONLY);
            if (nul >= 0) dup2(nul, 0);
            if (qargv) execv(j->worker_exe, qargv);
            else execl(j->worker_exe, j->worker_exe, "train", "--job", jf, (char *)NULL);
            _exit(127);
        }
        if (lfd >= 0) close(lfd);
        if (pid < 0) rc = srv_err(&err, SRV_INTERNAL, "cannot fork a worker: %s", strerror(errno));
    }
    if (pfd[1] >= 0) close(pfd[1]);
    job_argv_free(qargv);
    if (rc != SRV_OK) {
        if (pfd[0] >= 0) close(pfd[0]);
        free(run);
        free(r->state);
        r->state = strdup("FAILED");
        free(r->reason);
        r->reason = strdup(err.msg[0] ? err.msg : "the job could not start");
        r->ended_ms = wall_ms();
        srv_error e2 = {0};
        adm_state_job_update(j->o.state, r, &e2);
        srv_log(SRV_LOG_ERROR, "job", r->model, r->new_version, "job %lld FAILED to start: %s", (long long)r->id, r->reason);
        pthread_mutex_lock(&j->mu);
        j->nrunning--;
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&j->mu);
        cJSON_Delete(spec);
        return;
    }
    run->id = r->id;
    run->pid = pid;
    run->out_fd = pfd[0];
    run->refs = 2; /* the running list and the reader thread */
    srv_log(SRV_LOG_INFO, "job", r->model, r->new_version, "job %lld RUNNING: worker pid %d%s", (long long)r->id, (int)pid,
            resume ? ", resuming from its last checkpoint" : "");
    reader_arg *ra = malloc(sizeof *ra);
    pthread_mutex_lock(&j->mu);
    run->next = j->runs;
    j->runs = run;
    state_event_locked(j, run, r);
    if (ra) *ra = (reader_arg){j, run};
    int ok = ra && pthread_create(&run->reader, NULL, reader_main, ra) == 0;
    pthread_mutex_unlock(&j->mu);
    if (!ok) { /* no reader: stop the worker; the row stays RUNNING and is resumed at the next start */
        free(ra);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        close(pfd[0]);
        pthread_mutex_lock(&j->mu);
        j->runs = run->next; /* still first: only this thread adds */
        j->nrunning--;
        run->refs = 1;
        run_unref_locked(j, run);
        pthread_mutex_unlock(&j->mu);
        srv_log(SRV_LOG_ERROR, "job", r->model, r->new_version, "job %lld: no reader thread; worker stopped", (long long)r->id);
    } else {
        pthread_detach(run->reader);
    }
    cJSON_Delete(spec);
}

static void *sched_main(void *arg) {
    adm_jobs *j = arg;
    pthread_mutex_lock(&j->mu);
    while (!j->stopping) {
        int max = j->o.max_concurrent > 0 ? j->o.max_concurrent : 1;
        adm_job_rec *q = NULL;
        int nq = 0;
        if (j->nrunning < max) {
            pthread_mutex_unlock(&j->mu);
            srv_error err = {0};
            adm_state_job_list(j->o.state, "QUEUED", &q, &nq, &err);
            pthread_mutex_lock(&j->mu);
        }
        if (nq > 0 && !j->stopping && j->nrunning < max) {
            j->nrunning++; /* the oldest (the list is newest first) */
            pthread_mutex_unlock(&j->mu);
            job_start(j, &q[nq - 1]);
            pthread_mutex_lock(&j->mu);
        } else if (!j->stopping) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        }
        for (int i = 0; i < nq; i++) adm_job_rec_free(&q[i]);
        free(q);
    }
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

adm_jobs *adm_jobs_new(const adm_jobs_opts *o, srv_error *err) {
    if (!o->state || !o->datasets || !o->state_dir || !o->worker_exe) {
        srv_err(err, SRV_INVALID_ARGUMENT, "training jobs need --state_dir");
        return NULL;
    }
    adm_jobs *j = calloc(1, sizeof *j);
    if (!j) {
        srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    j->o = *o;
    j->state_dir = strdup(o->state_dir);
    j->worker_exe = strdup(o->worker_exe);
    if (j->state_dir && asprintf(&j->jobs_dir, "%s/jobs", o->state_dir) < 0) j->jobs_dir = NULL;
    if (!j->state_dir || !j->worker_exe || !j->jobs_dir) {
        srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
        goto fail;
    }
    if (mkdir(j->jobs_dir, 0700) != 0 && errno != EEXIST) {
        srv_err(err, SRV_PERMISSION_DENIED, "cannot make '%s': %s", j->jobs_dir, strerror(errno));
        goto fail;
    }
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    /* jobs an earlier process left RUNNING: queued again, to resume from their checkpoints */
    adm_job_rec *rs = NULL;
    int nr = 0;
    if (adm_state_job_list(j->o.state, "RUNNING", &rs, &nr, err) != SRV_OK) goto fail_locks;
    for (int i = 0; i < nr; i++) {
        cJSON *spec = job_parse(rs[i].spec_json);
        if (spec) {
            cJSON_DeleteItemFromObjectCaseSensitive(spec, "_resume");
            cJSON_AddBoolToObject(spec, "_resume", 1);
            free(rs[i].spec_json);
            rs[i].spec_json = cJSON_PrintUnformatted(spec);
            cJSON_Delete(spec);
        }
        free(rs[i].state);
        rs[i].state = strdup("QUEUED");
        srv_error e2 = {0};
        if (adm_state_job_update(j->o.state, &rs[i], &e2) == SRV_OK)
            srv_log(SRV_LOG_INFO, "job", rs[i].model, rs[i].new_version, "job %lld was running when the server stopped: "
                    "queued again to resume from its last checkpoint", (long long)rs[i].id);
        adm_job_rec_free(&rs[i]);
    }
    free(rs);
    if (pthread_create(&j->sched, NULL, sched_main, j) != 0) {
        srv_err(err, SRV_INTERNAL, "cannot start the job scheduler");
        goto fail_locks;
    }
    j->sched_on = 1;
    return j;
fail_locks:
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
fail:
    free(j->state_dir);
    free(j->worker_exe);
    free(j->jobs_dir);
    free(j);
    return NULL;
}

void adm_jobs_free(adm_jobs **pj) {
    if (!pj || !*pj) return;
    adm_jobs *j = *pj;
    pthread_mutex_lock(&j->mu);
    j->stopping = 1;
    for (job_run *r = j->runs; r; r = r->next) kill(r->pid, SIGTERM); /* they stop at their next step */
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (j->sched_on) pthread_join(j->sched, NULL);
    pthread_mutex_lock(&j->mu);
    int64_t until = wall_ms() + 30000;
    while (j->runs && wall_ms() < until) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        if (wall_ms() > until - 20000)
            for (job_run *r = j->runs; r; r = r->next) kill(r->pid, SIGKILL); /* a worker that does not stop */
    }
    int left = j->runs != NULL;
    pthread_mutex_unlock(&j->mu);
    if (left) { /* a reader still runs: the queue stays allocated for the rest of the process */
        srv_log(SRV_LOG_WARN, "shutdown", NULL, 0, "a training worker did not stop within 30 s");
        *pj = NULL;
        return;
    }
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j->state_dir);
    free(j->worker_exe);
    free(j->jobs_dir);
    free(j);
    *pj = NULL;
}

/* ---- routes ---- */

static enum MHD_Result send_json(struct MHD_Connection *c, int status, cJSON *o) {
    char *t = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return t ? adm_send(c, status, t, NULL) : adm_error(c, 500, "out of memory");
}

static cJSON *view_of(adm_jobs *j, const adm_job_rec *r) {
    pthread_mutex_lock(&j->mu);
    job_run *run = run_find_locked(j, r->id);
    char *live = run && run->progress ? strdup(run->progress) : NULL;
    pid_t pid = run && !run->ended ? run->pid : 0;
    pthread_mutex_unlock(&j->mu);
    cJSON *v = job_view(r, live);
    if (v && pid > 0) cJSON_AddNumberToObject(v, "worker_pid", (double)pid);
    free(live);
    return v;
}

static enum MHD_Result submit(adm_jobs *j, struct MHD_Connection *c, const char *body, size_t len) {
    cJSON *b = body && len ? cJSON_ParseWithLength(body, len) : NULL;
    if (!cJSON_IsObject(b)) {
        cJSON_Delete(b);
        return adm_error(c, 400, "the job must be a JSON object");
    }
    adm_job_rec r;
    srv_error err = {0};
    srv_code rc = job_check(j, b, &r, &err);
    cJSON_Delete(b);
    if (rc == SRV_OK) rc = adm_state_job_add(j->o.state, &r, &err);
    if (rc != SRV_OK) return adm_code(c, &err);
    srv_log(SRV_LOG_INFO, "job", r.model, r.new_version, "job %lld QUEUED: fine-tune version %lld on dataset '%s' into "
            "version %lld", (long long)r.id, (long long)r.base_version, r.dataset, (long long)r.new_version);
    pthread_mutex_lock(&j->mu);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    cJSON *v = view_of(j, &r);
    adm_job_rec_free(&r);
    return send_json(c, 201, v);
}

static enum MHD_Result cancel(adm_jobs *j, struct MHD_Connection *c, int64_t id) {
    adm_job_rec r;
    srv_error err = {0};
    if (adm_state_job_get(j->o.state, id, &r, &err) != SRV_OK) return adm_code(c, &err);
    enum MHD_Result ret;
    pthread_mutex_lock(&j->mu);
    job_run *run = run_find_locked(j, id);
    if (run) {
        run->cancel_requested = 1;
        kill(run->pid, SIGTERM);
        pthread_mutex_unlock(&j->mu);
        srv_log(SRV_LOG_INFO, "job", r.model, r.new_version, "job %lld: cancel requested", (long long)id);
        ret = send_json(c, 202, view_of(j, &r));
    } else if (!strcmp(r.state, "QUEUED")) {
        free(r.state);
        r.state = strdup("CANCELLED");
        free(r.reason);
        r.reason = strdup("cancelled on request before it started");
        r.ended_ms = wall_ms();
        srv_code rc = adm_state_job_update(j->o.state, &r, &err);
        pthread_mutex_unlock(&j->mu);
        ret = rc == SRV_OK ? send_json(c, 200, view_of(j, &r)) : adm_code(c, &err);
    } else {
        pthread_mutex_unlock(&j->mu);
        char m[160];
        snprintf(m, sizeof m, "job %lld has already ended (%s)", (long long)id, r.state);
        ret = adm_error(c, 409, m);
    }
    adm_job_rec_free(&r);
    return ret;
}

/* ---- Server-Sent Events ---- */

typedef struct sse {
    adm_jobs *j;
    int64_t id;
    job_run *run;              /* NULL until the job runs */
    int64_t next_seq;          /* the next event of run's log to send */
    char *pending;             /* text not yet handed to MHD */
    size_t plen, poff;
    int done;                  /* the final state was queued */
    int64_t last_ms;           /* when something was last sent (a comment keeps the connection alive) */
} sse;

static void sse_put(sse *s, const char *type, const char *json) {
    char *t = NULL;
    int n = asprintf(&t, "event: %s\ndata: %s\n\n", type, json);
    if (n < 0) return;
    char *g = realloc(s->pending, s->plen + (size_t)n + 1);
    if (!g) {
        free(t);
        return;
    }
    s->pending = g;
    memcpy(s->pending + s->plen, t, (size_t)n + 1);
    s->plen += (size_t)n;
    free(t);
}

/* Queue what is new: the run's events, or (job not running) its row's state, which ends the stream once final. */
static void sse_fill(sse *s) {
    adm_jobs *j = s->j;
    pthread_mutex_lock(&j->mu);
    if (!s->run && (s->run = run_find_locked(j, s->id))) {
        s->run->refs++;
        s->next_seq = s->run->base_seq;
    }
    job_run *r = s->run;
    if (r) {
        if (s->next_seq < r->base_seq) s->next_seq = r->base_seq;
        for (; s->next_seq < r->base_seq + r->nev; s->next_seq++) {
            const job_ev *e = &r->evs[s->next_seq - r->base_seq];
            sse_put(s, e->type, e->json);
        }
        if (r->ended) { /* the last state event was in the log */
            run_unref_locked(j, r);
            s->run = NULL;
            s->done = 1;
        }
        pthread_mutex_unlock(&j->mu);
        return;
    }
    pthread_mutex_unlock(&j->mu);
    adm_job_rec rec;
    srv_error err = {0};
    if (adm_state_job_get(j->o.state, s->id, &rec, &err) != SRV_OK) {
        sse_put(s, "error", "{\"error\":\"the job is gone\"}");
        s->done = 1;
        return;
    }
    int final = strcmp(rec.state, "QUEUED") != 0 && strcmp(rec.state, "RUNNING") != 0;
    if (final || s->next_seq == 0) { /* the row's state: once while queued, and the final one */
        cJSON *v = job_view(&rec, NULL);
        char *t = v ? cJSON_PrintUnformatted(v) : NULL;
        if (t) sse_put(s, "state", t);
        free(t);
        cJSON_Delete(v);
        s->next_seq = -1; /* sent the queued state */
    }
    s->done = final;
    adm_job_rec_free(&rec);
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    sse *s = cls;
    adm_jobs *j = s->j;
    for (;;) {
        if (s->poff < s->plen) {
            size_t n = s->plen - s->poff < max ? s->plen - s->poff : max;
            memcpy(buf, s->pending + s->poff, n);
            s->poff += n;
            if (s->poff == s->plen) s->poff = s->plen = 0;
            s->last_ms = wall_ms();
            return (ssize_t)n;
        }
        if (s->done) return MHD_CONTENT_READER_END_OF_STREAM;
        pthread_mutex_lock(&j->mu);
        int stopping = j->stopping;
        int idle = s->run && s->next_seq >= s->run->base_seq + s->run->nev && !s->run->ended;
        if (idle && !stopping) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        }
        pthread_mutex_unlock(&j->mu);
        if (stopping) return MHD_CONTENT_READER_END_OF_STREAM;
        if (!s->run && !s->done) { /* queued: look again in a moment */
            struct timespec ts = {0, 200 * 1000000L};
            nanosleep(&ts, NULL);
        }
        sse_fill(s);
        if (s->plen == 0 && wall_ms() - s->last_ms > 10000) sse_put(s, "keepalive", "{}");
    }
}

static void sse_free(void *cls) {
    sse *s = cls;
    if (s->run) {
        pthread_mutex_lock(&s->j->mu);
        run_unref_locked(s->j, s->run);
        pthread_mutex_unlock(&s->j->mu);
    }
    free(s->pending);
    free(s);
}

static enum MHD_Result events(adm_jobs *j, struct MHD_Connection *c, int64_t id) {
    adm_job_rec r;
    srv_error err = {0};
    if (adm_state_job_get(j->o.state, id, &r, &err) != SRV_OK) return adm_code(c, &err);
    adm_job_rec_free(&r);
    sse *s = calloc(1, sizeof *s);
    if (!s) return adm_error(c, 500, "out of memory");
    s->j = j;
    s->id = id;
    s->last_ms = wall_ms();
    sse_fill(s);
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, sse_read, s, sse_free);
    if (!resp) {
        sse_free(s);
        return adm_error(c, 500, "out of memory");
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ret = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* "" | "/{id}" | "/{id}/events" | "/{id}:cancel" -> 0 | 1 | 2 | 3; -1 not a route; -2 bad id. */
static int jobs_route(const char *url, int64_t *id) {
    *id = 0;
    if (strncmp(url, JOBS_PREFIX, sizeof JOBS_PREFIX - 1) != 0) return -1;
    const char *p = url + sizeof JOBS_PREFIX - 1;
    if (!*p) return 0;
    if (*p++ != '/') return -1;
    char *end = NULL;
    long long x = strtoll(p, &end, 10);
    if (end == p || x <= 0 || *p == '+' || *p == '-') return -2;
    *id = x;
    if (!*end) return 1;
    if (!strcmp(end, "/events")) return 2;
    if (!strcmp(end, ":cancel")) return 3;
    return -1;
}

enum MHD_Result adm_jobs_handle(adm_jobs *j, struct MHD_Connection *c, const char *method, const char *url,
                                const char *body, size_t len) {
    if (!j) return adm_error(c, 503, "training jobs need --state_dir (the job queue and the datasets live there)");
    int64_t id;
    int kind = jobs_route(url, &id);
    if (kind == -1) return adm_error(c, 404, "no such jobs route: /v1/admin/jobs[/{id}[/events|:cancel]]");
    if (kind == -2) return adm_error(c, 400, "a job id is a positive integer");
    if (kind == 0 && !strcmp(method, "POST")) return submit(j, c, body, len);
    if (kind == 0 && !strcmp(method, "GET")) {
        adm_job_rec *rs = NULL;
        int n = 0;
        srv_error err = {0};
        if (adm_state_job_list(j->o.state, NULL, &rs, &n, &err) != SRV_OK) return adm_code(c, &err);
        cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "jobs");
        for (int i = 0; i < n; i++) {
            cJSON_AddItemToArray(a, view_of(j, &rs[i]));
            adm_job_rec_free(&rs[i]);
        }
        free(rs);
        return send_json(c, 200, o);
    }
    if (kind == 1 && !strcmp(method, "GET")) {
        adm_job_rec r;
        srv_error err = {0};
        if (adm_state_job_get(j->o.state, id, &r, &err) != SRV_OK) return adm_code(c, &err);
        cJSON *v = view_of(j, &r);
        adm_job_rec_free(&r);
        return send_json(c, 200, v);
    }
    if (kind == 2 && !strcmp(method, "GET")) return events(j, c, id);
    if (kind == 3 && !strcmp(method, "POST")) return cancel(j, c, id);
    return adm_error(c, 405, "method not allowed on this jobs route");
}
