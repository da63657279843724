/* state-datasets.c - dataset records in the admin state store (state-datasets.h).
 *
 * Invariants (those of state.c hold here too):
 *  - Every SQL text is a constant below; values reach SQLite only through bindings. Statements are cached in the
 *    store's ext[] slots ADM_SLOT_DATASETS + SD_*, which adm_st_end resets.
 *  - Every call holds s->mu from start to end and runs one transaction; a refused or failed write leaves the file
 *    as it was.
 *  - A record names only files inside its own dir: file names are srv_name_valid (no '/', not '..'), and dir is a
 *    relative path without '..' components.
 */
#define _GNU_SOURCE
#include "state-datasets.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "state-impl.h"

enum {
    SD_PUT, SD_EXISTS, SD_SUM, SD_GET, SD_LIST, SD_USERS, SD_DELETE,
    SD_N
};
_Static_assert(SD_N <= 32, "state-datasets.c's statements outgrew its 32 slots");

static const char *const sd_sql[SD_N] = {
    [SD_PUT] = "INSERT INTO datasets(id, format, dir, files_json, records, bytes, sha256, columns_json, created_ms) "
               "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    [SD_EXISTS] = "SELECT 1 FROM datasets WHERE id = ?1",
    [SD_SUM] = "SELECT COALESCE(SUM(bytes), 0) FROM datasets",
    [SD_GET] = "SELECT id, format, dir, files_json, records, bytes, sha256, columns_json, created_ms FROM datasets "
               "WHERE id = ?1",
    [SD_LIST] = "SELECT id, format, dir, files_json, records, bytes, sha256, columns_json, created_ms FROM datasets "
                "ORDER BY created_ms DESC, rowid DESC",
    [SD_USERS] = "SELECT id FROM jobs WHERE (dataset = ?1 OR val_dataset = ?1) AND state IN ('QUEUED', 'RUNNING') "
                 "ORDER BY id",
    [SD_DELETE] = "DELETE FROM datasets WHERE id = ?1",
};

static const char *const sd_formats[] = {"idx", "npz", "npy", "csv", "jsonl", "tfrecord"};

static srv_code sd_prepare(adm_state *s, int id, sqlite3_stmt **q, const char *what, srv_error *err) {
    return adm_st_prepare(s, ADM_SLOT_DATASETS + id, sd_sql[id], q, what, err);
}

static srv_code sd_bind_fail(adm_state *s, const char *what, srv_error *err) {
    return adm_st_fail(s, sqlite3_errcode(s->db), err, what);
}

void adm_dataset_rec_free(adm_dataset_rec *r) {
    if (!r) return;
    free(r->id);
    free(r->format);
    free(r->dir);
    free(r->files_json);
    free(r->sha256);
    free(r->columns_json);
    memset(r, 0, sizeof *r);
}

void adm_dataset_recs_free(adm_dataset_rec *r, int n) {
    if (!r) return;
    for (int i = 0; i < n; i++) adm_dataset_rec_free(&r[i]);
    free(r);
}

/* ---- argument checks ---- */

static int sd_format_valid(const char *f) {
    for (size_t i = 0; f && i < sizeof sd_formats / sizeof sd_formats[0]; i++)
        if (strcmp(f, sd_formats[i]) == 0) return 1;
    return 0;
}

/* A relative path of srv_name_valid components (so no '..', no leading '/'). */
static int sd_dir_valid(const char *dir) {
    if (!dir || !*dir || strlen(dir) > 1024) return 0;
    char buf[1100];
    snprintf(buf, sizeof buf, "%s", dir);
    char *save = NULL;
    int n = 0;
    for (char *p = strtok_r(buf, "/", &save); p; p = strtok_r(NULL, "/", &save), n++)
        if (!srv_name_valid(p)) return 0;
    return n > 0 && dir[0] != '/' && !strstr(dir, "//");
}

static srv_code sd_check(const adm_dataset_rec *r, const char *what, srv_error *err) {
    srv_code c;
    if (!sd_format_valid(r->format))
        return srv_err(err, SRV_INVALID_ARGUMENT, "%s: format '%.40s' is not one of idx|npz|npy|csv|jsonl|tfrecord",
                       what, r->format ? r->format : "(null)");
    if (!sd_dir_valid(r->dir))
        return srv_err(err, SRV_INVALID_ARGUMENT, "%s: dir '%.200s' is not a relative path inside the state dir", what,
                       r->dir ? r->dir : "(null)");
    if (r->records < 1) return srv_err(err, SRV_INVALID_ARGUMENT, "%s: %lld records (at least 1)", what,
                                       (long long)r->records);
    if (r->bytes < 0) return srv_err(err, SRV_INVALID_ARGUMENT, "%s: %lld bytes", what, (long long)r->bytes);
    size_t hl = r->sha256 ? strlen(r->sha256) : 0;
    int hex = hl == 64;
    for (size_t i = 0; hex && i < hl; i++)
        hex = (r->sha256[i] >= '0' && r->sha256[i] <= '9') || (r->sha256[i] >= 'a' && r->sha256[i] <= 'f');
    if (!hex)
        return srv_err(err, SRV_INVALID_ARGUMENT, "%s: sha256 '%.80s' is not 64 lower-case hex digits", what,
                       r->sha256 ? r->sha256 : "(null)");
    if (!r->files_json) return srv_err(err, SRV_INVALID_ARGUMENT, "%s: no files", what);
    if ((c = adm_st_check_json("file list", what, r->files_json, 0, err))) return c;
    cJSON *f = cJSON_Parse(r->files_json);
    int ok = cJSON_IsArray(f) && cJSON_GetArraySize(f) > 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, f) ok = ok && cJSON_IsString(e) && srv_name_valid(e->valuestring);
    cJSON_Delete(f);
    if (!ok)
        return srv_err(err, SRV_INVALID_ARGUMENT, "%s: the file list '%.200s' is not a non-empty JSON array of file "
                       "names ([A-Za-z0-9_.-]+)", what, r->files_json);
    if (r->columns_json && (c = adm_st_check_json("columns", what, r->columns_json, 0, err))) return c;
    return SRV_OK;
}

/* ---- writes ---- */

srv_code adm_state_dataset_put(adm_state *s, const adm_dataset_rec *r, int64_t quota_bytes, int64_t *created_ms_out,
                               srv_error *err) {
    srv_code c;
    if ((c = adm_st_check_handle(s, err))) return c;
    if (!r) return srv_err(err, SRV_INVALID_ARGUMENT, "adm_state_dataset_put: no record");
    if ((c = adm_st_check_name("dataset name", r->id, err))) return c;
    char what[320];
    snprintf(what, sizeof what, "recording dataset '%s'", r->id);
    if ((c = sd_check(r, what, err))) return c;
    int64_t now = adm_st_now_ms();
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *q = NULL;
    c = adm_st_begin(s, 1, what, err);
    if (!c && !(c = sd_prepare(s, SD_EXISTS, &q, what, err))) {
        int rc = adm_st_bind_text(q, 1, r->id) ? -2 : adm_st_step(s, q);
        if (rc == -2) c = sd_bind_fail(s, what, err);
        else if (rc == SQLITE_ROW)
            c = srv_err(err, SRV_ALREADY_EXISTS, "dataset '%s' exists (delete it first, or upload under another name)",
                        r->id);
        else if (rc != SQLITE_DONE) c = adm_st_fail(s, rc, err, what);
    }
    if (!c && quota_bytes > 0 && !(c = sd_prepare(s, SD_SUM, &q, what, err))) {
        int rc = adm_st_step(s, q);
        if (rc != SQLITE_ROW) {
            c = adm_st_fail(s, rc == SQLITE_DONE ? SQLITE_INTERNAL : rc, err, what);
        } else {
            int64_t have = sqlite3_column_int64(q, 0);
            if (r->bytes > quota_bytes - have)
                c = srv_err(err, SRV_RESOURCE_EXHAUSTED,
                            "dataset '%s': %lld bytes would take the datasets to %lld bytes, over the quota of %lld "
                            "(--dataset_quota_bytes; %lld in use)", r->id, (long long)r->bytes,
                            (long long)(have + r->bytes), (long long)quota_bytes, (long long)have);
        }
    }
    if (!c && !(c = sd_prepare(s, SD_PUT, &q, what, err))) {
        int rc = adm_st_bind_text(q, 1, r->id) || adm_st_bind_text(q, 2, r->format) || adm_st_bind_text(q, 3, r->dir) ||
                 adm_st_bind_text(q, 4, r->files_json) || sqlite3_bind_int64(q, 5, r->records) ||
                 sqlite3_bind_int64(q, 6, r->bytes) || adm_st_bind_text(q, 7, r->sha256) ||
                 adm_st_bind_text(q, 8, r->columns_json) || sqlite3_bind_int64(q, 9, now);
        c = rc ? sd_bind_fail(s, what, err) : adm_st_exec(s, q, what, err);
    }
    c = adm_st_end(s, c, what, err);
    pthread_mutex_unlock(&s->mu);
    if (!c && created_ms_out) *created_ms_out = now;
    return c;
}

srv_code adm_state_dataset_delete(adm_state *s, const char *id, srv_error *err) {
    srv_code c;
    if ((c = adm_st_check_handle(s, err)) || (c = adm_st_check_name("dataset name", id, err))) return c;
    char what[320];
    snprintf(what, sizeof what, "deleting dataset '%s'", id);
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *q = NULL;
    c = adm_st_begin(s, 1, what, err);
    if (!c && !(c = sd_prepare(s, SD_USERS, &q, what, err))) {
        char ids[512] = "";
        size_t used = 0;
        int n = 0, rc = adm_st_bind_text(q, 1, id) ? -2 : SQLITE_OK;
        if (rc == -2) c = sd_bind_fail(s, what, err);
        while (!c && (rc = adm_st_step(s, q)) == SQLITE_ROW) {
            if (used < sizeof ids - 32)
                used += (size_t)snprintf(ids + used, sizeof ids - used, "%s%lld", n ? ", " : "",
                                         (long long)sqlite3_column_int64(q, 0));
            else if (!strstr(ids, "..."))
                used += (size_t)snprintf(ids + used, sizeof ids - used, ", ...");
            n++;
        }
        if (!c && rc != SQLITE_DONE) c = adm_st_fail(s, rc, err, what);
        if (!c && n > 0)
            c = srv_err(err, SRV_ABORTED, "dataset '%s' is in use by %s %s (QUEUED or RUNNING): cancel %s or wait for "
                        "%s to finish", id, n == 1 ? "job" : "jobs", ids, n == 1 ? "it" : "them",
                        n == 1 ? "it" : "them");
    }
    if (!c && !(c = sd_prepare(s, SD_DELETE, &q, what, err))) {
        c = adm_st_bind_text(q, 1, id) ? sd_bind_fail(s, what, err) : adm_st_exec(s, q, what, err);
        if (!c && sqlite3_changes(s->db) == 0) c = srv_err(err, SRV_NOT_FOUND, "no dataset '%s'", id);
    }
    c = adm_st_end(s, c, what, err);
    pthread_mutex_unlock(&s->mu);
    return c;
}

/* ---- reads ---- */

/* The current row of SD_GET / SD_LIST into r. -1 when out of memory. */
static int sd_row(sqlite3_stmt *q, adm_dataset_rec *r) {
    memset(r, 0, sizeof *r);
    r->records = sqlite3_column_int64(q, 4);
    r->bytes = sqlite3_column_int64(q, 5);
    r->created_ms = sqlite3_column_int64(q, 8);
    if (adm_st_col_dup(q, 0, &r->id) || adm_st_col_dup(q, 1, &r->format) || adm_st_col_dup(q, 2, &r->dir) ||
        adm_st_col_dup(q, 3, &r->files_json) || adm_st_col_dup(q, 6, &r->sha256) ||
        adm_st_col_dup(q, 7, &r->columns_json) || !r->id || !r->format || !r->dir || !r->files_json || !r->sha256) {
        adm_dataset_rec_free(r);
        return -1;
    }
    return 0;
}

srv_code adm_state_dataset_get(adm_state *s, const char *id, adm_dataset_rec *out, srv_error *err) {
    srv_code c;
    if (out) memset(out, 0, sizeof *out);
    if ((c = adm_st_check_handle(s, err)) || (c = adm_st_check_name("dataset name", id, err))) return c;
    if (!out) return srv_err(err, SRV_INVALID_ARGUMENT, "adm_state_dataset_get: out is NULL");
    char what[320];
    snprintf(what, sizeof what, "reading dataset '%s'", id);
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *q = NULL;
    c = adm_st_begin(s, 0, what, err);
    if (!c && !(c = sd_prepare(s, SD_GET, &q, what, err))) {
        int rc = adm_st_bind_text(q, 1, id) ? -2 : adm_st_step(s, q);
        if (rc == -2) c = sd_bind_fail(s, what, err);
        else if (rc == SQLITE_DONE) c = srv_err(err, SRV_NOT_FOUND, "no dataset '%s'", id);
        else if (rc != SQLITE_ROW) c = adm_st_fail(s, rc, err, what);
        else if (sd_row(q, out)) c = adm_st_oom(s, err, what);
    }
    c = adm_st_end(s, c, what, err);
    pthread_mutex_unlock(&s->mu);
    if (c) adm_dataset_rec_free(out);
    return c;
}

srv_code adm_state_datasets_list(adm_state *s, adm_dataset_rec **out, int *n, srv_error *err) {
    srv_code c;
    if (out) *out = NULL;
    if (n) *n = 0;
    if ((c = adm_st_check_handle(s, err))) return c;
    if (!out || !n) return srv_err(err, SRV_INVALID_ARGUMENT, "adm_state_datasets_list: out or n is NULL");
    const char *what = "listing the datasets";
    adm_dataset_rec *recs = NULL;
    int nrec = 0, cap = 0;
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *q = NULL;
    c = adm_st_begin(s, 0, what, err);
    if (!c && !(c = sd_prepare(s, SD_LIST, &q, what, err))) {
        int rc;
        while ((rc = adm_st_step(s, q)) == SQLITE_ROW) {
            if (nrec == cap) {
                int ncap = cap ? cap * 2 : 16;
                adm_dataset_rec *g = realloc(recs, (size_t)ncap * sizeof *g);
                if (!g) {
                    c = adm_st_oom(s, err, what);
                    break;
                }
                recs = g;
                cap = ncap;
            }
            if (sd_row(q, &recs[nrec])) {
                c = adm_st_oom(s, err, what);
                break;
            }
            nrec++;
        }
        if (!c && rc != SQLITE_DONE) c = adm_st_fail(s, rc, err, what);
    }
    c = adm_st_end(s, c, what, err);
    pthread_mutex_unlock(&s->mu);
    if (c) {
        adm_dataset_recs_free(recs, nrec);
        return c;
    }
    if (nrec == 0) {
        free(recs);
        recs = NULL;
    }
    *out = recs;
    *n = nrec;
    return SRV_OK;
}

srv_code adm_state_datasets_bytes(adm_state *s, int64_t *total, srv_error *err) {
    srv_code c;
    if (total) *total = 0;
    if ((c = adm_st_check_handle(s, err))) return c;
    if (!total) return srv_err(err, SRV_INVALID_ARGUMENT, "adm_state_datasets_bytes: total is NULL");
    const char *what = "summing the datasets' bytes";
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *q = NULL;
    c = adm_st_begin(s, 0, what, err);
    if (!c && !(c = sd_prepare(s, SD_SUM, &q, what, err))) {
        int rc = adm_st_step(s, q);
        if (rc == SQLITE_ROW) *total = sqlite3_column_int64(q, 0);
        else c = adm_st_fail(s, rc == SQLITE_DONE ? SQLITE_INTERNAL : rc, err, what);
    }
    c = adm_st_end(s, c, what, err);
    pthread_mutex_unlock(&s->mu);
    return c;
}
