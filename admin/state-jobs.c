/* state-jobs.c - training job records in the admin state store (state-jobs.h), over state-impl.h's helpers.
 * Every SQL text is a constant; values go through sqlite3_bind_*; each call is one transaction under s->mu.
 */
#define _GNU_SOURCE
#include "state-jobs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "state-impl.h"

enum { SJ_ADD = ADM_SLOT_JOBS, SJ_UPDATE, SJ_PROGRESS, SJ_GET, SJ_LIST, SJ_LIST_STATE, SJ_MAXV };

#define SJ_COLS "id, model, dataset, val_dataset, spec_json, state, base_version, new_version, progress_json, " \
                "result_json, reason, created_ms, started_ms, ended_ms"
static const char sql_add[] =
    "INSERT INTO jobs(model, dataset, val_dataset, spec_json, state, base_version, new_version, progress_json, "
    "result_json, reason, created_ms, started_ms, ended_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)";
static const char sql_update[] =
    "UPDATE jobs SET spec_json = ?2, state = ?3, base_version = ?4, new_version = ?5, progress_json = ?6, "
    "result_json = ?7, reason = ?8, started_ms = ?9, ended_ms = ?10 WHERE id = ?1";
static const char sql_progress[] = "UPDATE jobs SET progress_json = ?2 WHERE id = ?1";
static const char sql_get[] = "SELECT " SJ_COLS " FROM jobs WHERE id = ?1";
static const char sql_list[] = "SELECT " SJ_COLS " FROM jobs ORDER BY id DESC";
static const char sql_list_state[] = "SELECT " SJ_COLS " FROM jobs WHERE state = ?1 ORDER BY id DESC";
static const char sql_maxv[] = "SELECT coalesce(max(new_version), 0) FROM jobs WHERE model = ?1";

void adm_job_rec_free(adm_job_rec *r) {
    if (!r) return;
    free(r->model);
    free(r->dataset);
    free(r->val_dataset);
    free(r->spec_json);
    free(r->state);
    free(r->progress_json);
    free(r->result_json);
    free(r->reason);
    memset(r, 0, sizeof *r);
}

static int valid_state(const char *st) {
    static const char *const ok[] = {"QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"};
    for (int i = 0; st && i < 5; i++)
        if (!strcmp(st, ok[i])) return 1;
    return 0;
}

static srv_code check_rec(const adm_job_rec *r, const char *what, srv_error *err) {
    srv_code c;
    if ((c = adm_st_check_name("model name", r->model, err)) || (c = adm_st_check_name("dataset", r->dataset, err)))
        return c;
    if (r->val_dataset && (c = adm_st_check_name("validation dataset", r->val_dataset, err))) return c;
    if (!valid_state(r->state))
        return srv_err(err, SRV_INVALID_ARGUMENT, "%s: job state '%.40s' is not QUEUED, RUNNING, SUCCEEDED, FAILED or "
                       "CANCELLED", what, r->state ? r->state : "");
    if (!r->spec_json || (c = adm_st_check_json("job spec", what, r->spec_json, 1, err))) {
        return r->spec_json ? c : srv_err(err, SRV_INVALID_ARGUMENT, "%s: no job spec", what);
    }
    if (r->progress_json && (c = adm_st_check_json("job progress", what, r->progress_json, 1, err))) return c;
    if (r->result_json && (c = adm_st_check_json("job result", what, r->result_json, 1, err))) return c;
    return SRV_OK;
}

static int bind_i64_or_null(sqlite3_stmt *q, int i, int64_t v) {
    return v ? sqlite3_bind_int64(q, i, v) : sqlite3_bind_null(q, i);
}

srv_code adm_state_job_add(adm_state *s, adm_job_rec *r, srv_error *err) {
    srv_code c;
    const char *what = "adding a job";
    if ((c = adm_st_check_handle(s, err)) || (c = check_rec(r, what, err))) return c;
    if (!r->created_ms) r->created_ms = adm_st_now_ms();
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *q = NULL;
    c = adm_st_begin(s, 1, what, err);
    if (!c && !(c = adm_st_prepare(s, SJ_ADD, sql_add, &q, what, err))) {
        int rc = adm_st_bind_text(q, 1, r->model) || adm_st_bind_text(q, 2, r->dataset) ||
                 adm_st_bind_text(q, 3, r->val_dataset) || adm_st_bind_text(q, 4, r->spec_json) ||
                 adm_st_bind_text(q, 5, r->state) || bind_i64_or_null(q, 6, r->base_version) ||
                 bind_i64_or_null(q, 7, r->new_version) || adm_st_bind_text(q, 8, r->progress_json) ||
                 adm_st_bind_text(q, 9, r->result_json) || adm_st_bind_text(q, 10, r->reason) ||
                 sqlite3_bind_int64(q, 11, r->created_ms) || bind_i64_or_null(q, 12, r->started_ms) ||
                 bind_i64_or_null(q, 13, r->ended_ms);
        c = rc ? adm_st_fail(s, rc, err, what) : adm_st_exec(s, q, what, err);
        if (!c) r->id = sqlite3_last_insert_rowid(s->db);
    }
    c = adm_st_end(s, c, what, err);
    pthread_mutex_unlock(&s->mu);
    return c;
}

srv_code adm_state_job_update(adm_state *s, const adm_job_rec *r, srv_error *err) {
    srv_code c;
    char what[64];
    snprintf(what, sizeof what, "updating job %lld", (long long)r->id);
    if ((c = adm_st_check_handle(s, err)) || (c = check_rec(r, what, err))) return c;
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *q = NULL;
    c = adm_st_begin(s, 1, what, err);
    if (!c && !(c = adm_st_prepare(s, SJ_UPDATE, sql_update, &q, what, err))) {
        int rc = sqlite3_bind_int64(q, 1, r->id) || adm_st_bind_text(q, 2, r->spec_json) ||
                 adm_st_bind_text(q, 3, r->state) || bind_i64_or_null(q, 4, r->base_version) ||
                 bind_i64_or_null(q, 5, r->new_version) || adm_st_bind_text(q, 6, r->progress_json) ||
                 adm_st_bind_text(q, 7, r->result_json) || adm_st_bind_text(q, 8, r->reason) ||
                 bind_i64_or_null(q, 9, r->started_ms) || bind_i64_or_null(q, 10, r->ended_ms);
        c = rc ? adm_st_fail(s, rc, err, what) : adm_st_exec(s, q, what, err);
        if (!c && sqlite3_changes(s->db) == 0) c = srv_err(err, SRV_NOT_FOUND, "no job %lld", (long long)r->id);
    }
    c = adm_st_end(s, c, what, err);
    pthread_mutex_unlock(&s->mu);
    return c;
}

srv_code adm_state_job_progress(adm_state *s, int64_t id, const char *progress_json, srv_error *err) {
    srv_code c;
    char what[64];
    snprintf(what, sizeof what, "recording job %lld's progress", (long long)id);
    if ((c = adm_st_check_handle(s, err))) return c;
    if (progress_json && (c = adm_st_check_json("job progress", what, progress_json, 1, err))) return c;
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *q = NULL;
    c = adm_st_begin(s, 1, what, err);
    if (!c && !(c = adm_st_prepare(s, SJ_PROGRESS, sql_progress, &q, what, err))) {
        int rc = sqlite3_bind_int64(q, 1, id) || adm_st_bind_text(q, 2, progress_json);
        c = rc ? adm_st_fail(s, rc, err, what) : adm_st_exec(s, q, what, err);
        if (!c && sqlite3_changes(s->db) == 0) c = srv_err(err, SRV_NOT_FOUND, "no job %lld", (long long)id);
    }
    c = adm_st_end(s, c, what, err);
    pthread_mutex_unlock(&s->mu);
    return c;
}

/* One row of SJ_COLS into r. -1 on OOM. */
static int row_of(sqlite3_stmt *q, adm_job_rec *r) {
    memset(r, 0, sizeof *r);
    r->id = sqlite3_column_int64(q, 0);
    r->base_version = sqlite3_column_int64(q, 6);
    r->new_version = sqlite3_column_int64(q, 7);
    r->created_ms = sqlite3_column_int64(q, 11);
    r->started_ms = sqlite3_column_int64(q, 12);
    r->ended_ms = sqlite3_column_int64(q, 13);
    if (adm_st_col_dup(q, 1, &r->model) || adm_st_col_dup(q, 2, &r->dataset) || adm_st_col_dup(q, 3, &r->val_dataset) ||
        adm_st_col_dup(q, 4, &r->spec_json) || adm_st_col_dup(q, 5, &r->state) ||
        adm_st_col_dup(q, 8, &r->progress_json) || adm_st_col_dup(q, 9, &r->result_json) ||
        adm_st_col_dup(q, 10, &r->reason)) {
        adm_job_rec_free(r);
        return -1;
    }
    return 0;
}

srv_code adm_state_job_get(adm_state *s, int64_t id, adm_job_rec *out, srv_error *err) {
    srv_code c;
    char what[64];
    snprintf(what, sizeof what, "reading job %lld", (long long)id);
    memset(out, 0, sizeof *out);
    if ((c = adm_st_check_handle(s, err))) return c;
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *q = NULL;
    c = adm_st_begin(s, 0, what, err);
    if (!c && !(c = adm_st_prepare(s, SJ_GET, sql_get, &q, what, err))) {
        int rc = sqlite3_bind_int64(q, 1, id);
        if (rc) c = adm_st_fail(s, rc, err, what);
        else if ((rc = adm_st_step(s, q)) == SQLITE_ROW) c = row_of(q, out) ? adm_st_oom(s, err, what) : SRV_OK;
        else if (rc == SQLITE_DONE) c = srv_err(err, SRV_NOT_FOUND, "no job %lld", (long long)id);
        else c = adm_st_fail(s, rc, err, what);
    }
    c = adm_st_end(s, c, what, err);
    pthread_mutex_unlock(&s->mu);
    if (c) adm_job_rec_free(out);
    return c;
}

srv_code adm_state_job_list(adm_state *s, const char *state, adm_job_rec **out, int *n, srv_error *err) {
    srv_code c;
    const char *what = "listing jobs";
    *out = NULL;
    *n = 0;
    if ((c = adm_st_check_handle(s, err))) return c;
    adm_job_rec *v = NULL;
    int nv = 0, cap = 0;
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *q = NULL;
    c = adm_st_begin(s, 0, what, err);
    if (!c) c = state ? adm_st_prepare(s, SJ_LIST_STATE, sql_list_state, &q, what, err)
                      : adm_st_prepare(s, SJ_LIST, sql_list, &q, what, err);
    if (!c && state && adm_st_bind_text(q, 1, state)) c = adm_st_fail(s, sqlite3_errcode(s->db), err, what);
    int rc = SQLITE_DONE;
    while (!c && (rc = adm_st_step(s, q)) == SQLITE_ROW) {
        if (nv == cap) {
            int nc = cap ? 2 * cap : 16;
            adm_job_rec *g = realloc(v, (size_t)nc * sizeof *g);
            if (!g) {
                c = adm_st_oom(s, err, what);
                break;
            }
            v = g;
            cap = nc;
        }
        if (row_of(q, &v[nv]) != 0) c = adm_st_oom(s, err, what);
        else nv++;
    }
    if (!c && rc != SQLITE_DONE) c = adm_st_fail(s, rc, err, what);
    c = adm_st_end(s, c, what, err);
    pthread_mutex_unlock(&s->mu);
    if (c) {
        for (int i = 0; i < nv; i++) adm_job_rec_free(&v[i]);
        free(v);
        return c;
    }
    if (nv == 0) {
        free(v);
        v = NULL;
    }
    *out = v;
    *n = nv;
    return SRV_OK;
}

srv_code adm_state_job_max_version(adm_state *s, const char *model, int64_t *v, srv_error *err) {
    srv_code c;
    const char *what = "reading the jobs' versions";
    *v = 0;
    if ((c = adm_st_check_handle(s, err)) || (c = adm_st_check_name("model name", model, err))) return c;
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *q = NULL;
    c = adm_st_begin(s, 0, what, err);
    if (!c && !(c = adm_st_prepare(s, SJ_MAXV, sql_maxv, &q, what, err))) {
        int rc = adm_st_bind_text(q, 1, model);
        if (rc) c = adm_st_fail(s, rc, err, what);
        else if ((rc = adm_st_step(s, q)) == SQLITE_ROW) *v = sqlite3_column_int64(q, 0);
        else c = adm_st_fail(s, rc, err, what);
    }
    c = adm_st_end(s, c, what, err);
    pthread_mutex_unlock(&s->mu);
    return c;
}
