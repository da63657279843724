/* state.c - the admin room's SQLite state store (state.h): open and check the file, the schema, one
 * transaction per write, loading everything back after a restart, the rollback history.
 *
 * Invariants:
 *  - Every SQL text is a constant (stmt_sql[], schema_v1, the PRAGMAs); values reach SQLite only through
 *    sqlite3_bind_*. The cached statements are prepared once per handle, on first use, and are reset before
 *    each use and before every transaction ends, so no statement keeps a read open between calls.
 *  - Every public call holds s->mu from start to end; the connection is opened SQLITE_OPEN_NOMUTEX because of it.
 *  - A write is BEGIN IMMEDIATE .. COMMIT; on any failure, also a failed COMMIT, it is rolled back, so the file
 *    holds the state from before the call or the one after it, never a mix. err is filled before the rollback,
 *    so the message is that of the statement that failed.
 *  - Arguments are checked before the file is touched; a refused call leaves the file as it was.
 *  - A models row with added = 0 exists only while it carries labels or traffic (the write that removes the
 *    last of them removes the row in the same transaction).
 */
#define _GNU_SOURCE
#include "state-impl.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>


enum {
    ST_BEGIN, ST_BEGIN_READ, ST_COMMIT, ST_ROLLBACK,
    ST_TABLES, ST_SCHEMA_GET, ST_SCHEMA_SET, ST_SCHEMA_UPDATE,
    ST_MODEL_PUT, ST_MODEL_ENSURE, ST_MODEL_DELETE, ST_MODEL_GC, ST_REMOVED_PUT, ST_REMOVED_DELETE,
    ST_LABEL_PUT, ST_LABEL_DELETE,
    ST_TRAFFIC_DELETE, ST_TRAFFIC_PUT, ST_ROUTE_PUT,
    ST_EVENT_ADD, ST_EVENT_PRUNE, ST_EVENTS,
    ST_LOAD_MODELS, ST_LOAD_LABELS, ST_LOAD_TRAFFIC, ST_LOAD_ROUTES,
    ST_N
};
_Static_assert(ST_N <= 32, "state.c's statements outgrew adm_state.st");

static const char *const stmt_sql[ST_N] = {
    [ST_BEGIN] = "BEGIN IMMEDIATE",
    [ST_BEGIN_READ] = "BEGIN DEFERRED",
    [ST_COMMIT] = "COMMIT",
    [ST_ROLLBACK] = "ROLLBACK",
    [ST_TABLES] = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' "
                  "ORDER BY name",
    [ST_SCHEMA_GET] = "SELECT version FROM schema_version",
    [ST_SCHEMA_SET] = "INSERT INTO schema_version(version) VALUES (?1)",
    [ST_SCHEMA_UPDATE] = "UPDATE schema_version SET version = ?1",
    [ST_REMOVED_PUT] = "INSERT OR IGNORE INTO removed(name) VALUES (?1)",
    [ST_REMOVED_DELETE] = "DELETE FROM removed WHERE name = ?1",
    [ST_MODEL_PUT] = "INSERT INTO models(name, base_path, policy_json, added) VALUES (?1, ?2, ?3, 1) "
                     "ON CONFLICT(name) DO UPDATE SET base_path = excluded.base_path, "
                     "policy_json = excluded.policy_json, added = 1",
    [ST_MODEL_ENSURE] = "INSERT INTO models(name, added) VALUES (?1, 0) ON CONFLICT(name) DO NOTHING",
    [ST_MODEL_DELETE] = "DELETE FROM models WHERE name = ?1",
    [ST_MODEL_GC] = "DELETE FROM models WHERE name = ?1 AND added = 0 "
                    "AND NOT EXISTS (SELECT 1 FROM labels WHERE model = ?1) "
                    "AND NOT EXISTS (SELECT 1 FROM traffic WHERE model = ?1)",
    [ST_LABEL_PUT] = "INSERT INTO labels(model, label, version) VALUES (?1, ?2, ?3) "
                     "ON CONFLICT(model, label) DO UPDATE SET version = excluded.version",
    [ST_LABEL_DELETE] = "DELETE FROM labels WHERE model = ?1 AND label = ?2",
    [ST_TRAFFIC_DELETE] = "DELETE FROM traffic WHERE model = ?1",
    [ST_TRAFFIC_PUT] = "INSERT INTO traffic(model, sticky_header, shadow, settings_json) VALUES (?1, ?2, ?3, ?4)",
    [ST_ROUTE_PUT] = "INSERT INTO routes(model, pos, label, weight) VALUES (?1, ?2, ?3, ?4)",
    [ST_EVENT_ADD] = "INSERT INTO events(model, unix_ms, event, detail_json) VALUES (?1, ?2, ?3, ?4)",
    [ST_EVENT_PRUNE] = "DELETE FROM events WHERE model = ?1 AND id <= (SELECT id FROM events WHERE model = ?1 "
                       "ORDER BY id DESC LIMIT 1 OFFSET ?2)",
    [ST_EVENTS] = "SELECT unix_ms, event, detail_json FROM events WHERE model = ?1 ORDER BY id DESC LIMIT ?2",
    [ST_LOAD_MODELS] = "SELECT name, base_path, policy_json, added, 0 FROM models "
                       "UNION ALL SELECT name, NULL, NULL, 0, 1 FROM removed ORDER BY 1",
    [ST_LOAD_LABELS] = "SELECT label, version FROM labels WHERE model = ?1 ORDER BY label",
    [ST_LOAD_TRAFFIC] = "SELECT sticky_header, shadow, settings_json FROM traffic WHERE model = ?1",
    [ST_LOAD_ROUTES] = "SELECT label, weight FROM routes WHERE model = ?1 ORDER BY pos",
};

/* Schema 1. Tables are only ever added to in later schemas (with a migration from each older one). */
static const char schema_v1[] =
    "CREATE TABLE schema_version (version INTEGER NOT NULL);"
    "CREATE TABLE models ("
    "  name TEXT PRIMARY KEY NOT NULL,"
    "  base_path TEXT,"
    "  policy_json TEXT,"
    "  added INTEGER NOT NULL DEFAULT 0 CHECK (added IN (0, 1)),"
    "  CHECK (added = 0 OR base_path IS NOT NULL));"
    "CREATE TABLE labels ("
    "  model TEXT NOT NULL REFERENCES models(name) ON DELETE CASCADE,"
    "  label TEXT NOT NULL,"
    "  version INTEGER NOT NULL CHECK (version > 0),"
    "  PRIMARY KEY (model, label));"
    "CREATE TABLE traffic ("
    "  model TEXT PRIMARY KEY NOT NULL REFERENCES models(name) ON DELETE CASCADE,"
    "  sticky_header TEXT,"
    "  shadow TEXT,"
    "  settings_json TEXT);"
    "CREATE TABLE routes ("
    "  model TEXT NOT NULL REFERENCES traffic(model) ON DELETE CASCADE,"
    "  pos INTEGER NOT NULL,"
    "  label TEXT NOT NULL,"
    "  weight INTEGER NOT NULL CHECK (weight BETWEEN 0 AND 1000000),"
    "  PRIMARY KEY (model, pos),"
    "  UNIQUE (model, label));"
    "CREATE TABLE events ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  model TEXT NOT NULL,"
    "  unix_ms INTEGER NOT NULL,"
    "  event TEXT NOT NULL,"
    "  detail_json TEXT);"
    "CREATE INDEX events_by_model ON events(model, id);";

/* Schema 2 adds the models removed through the admin API (a model of the config file stays removed after a
 * restart); a schema-1 file is migrated in the transaction that opens it. */
static const char schema_v2_add[] = "CREATE TABLE removed (name TEXT PRIMARY KEY NOT NULL);";

/* Schema 3 adds the uploaded datasets and the training jobs (state-datasets.c, state-jobs.c). */
static const char schema_v3_add[] =
    "CREATE TABLE datasets ("
    "  id TEXT PRIMARY KEY NOT NULL,"
    "  format TEXT NOT NULL,"
    "  dir TEXT NOT NULL,"
    "  files_json TEXT NOT NULL,"
    "  records INTEGER NOT NULL,"
    "  bytes INTEGER NOT NULL,"
    "  sha256 TEXT NOT NULL,"
    "  columns_json TEXT,"
    "  created_ms INTEGER NOT NULL);"
    "CREATE TABLE jobs ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  model TEXT NOT NULL,"
    "  dataset TEXT NOT NULL,"
    "  val_dataset TEXT,"
    "  spec_json TEXT NOT NULL,"
    "  state TEXT NOT NULL CHECK (state IN ('QUEUED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED')),"
    "  base_version INTEGER,"
    "  new_version INTEGER,"
    "  progress_json TEXT,"
    "  result_json TEXT,"
    "  reason TEXT,"
    "  created_ms INTEGER NOT NULL,"
    "  started_ms INTEGER,"
    "  ended_ms INTEGER);"
    "CREATE INDEX jobs_by_state ON jobs(state, id);";

static const char *const schema_add[] = {NULL, NULL, schema_v2_add, schema_v3_add}; /* [v]: v-1 -> v */

/* The tables a file must hold (sorted as ST_TABLES lists them), and the schema each came with. */
static const char *const tables_all[] = {"datasets", "events", "jobs", "labels", "models", "removed", "routes",
                                         "schema_version", "traffic"};
static const int tables_since[] = {3, 1, 3, 1, 1, 2, 1, 1, 1};
#define NTABLES ((int)(sizeof tables_all / sizeof tables_all[0]))


/* ---- errors ---- */

static srv_code code_of(int rc) {
    if (rc == ADM_FAULT) return SRV_INTERNAL;
    switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED: return SRV_UNAVAILABLE;
    case SQLITE_NOMEM:
    case SQLITE_FULL: return SRV_RESOURCE_EXHAUSTED;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB: return SRV_DATA_LOSS;
    case SQLITE_READONLY:
    case SQLITE_PERM:
    case SQLITE_AUTH:
    case SQLITE_CANTOPEN: return SRV_PERMISSION_DENIED;
    case SQLITE_CONSTRAINT:
    case SQLITE_MISMATCH:
    case SQLITE_TOOBIG:
    case SQLITE_RANGE: return SRV_INVALID_ARGUMENT;
    default: return SRV_INTERNAL;
    }
}

/* Fill err from SQLite's result rc while doing `what`; names the file. Call before anything else touches db. */
static srv_code db_fail(adm_state *s, int rc, srv_error *err, const char *what) {
    const char *m = rc == ADM_FAULT ? "injected fault" : sqlite3_errmsg(s->db);
    if (!m || !*m) m = sqlite3_errstr(rc);
    if ((rc & 0xff) == SQLITE_NOTADB && rc != ADM_FAULT)
        return srv_err(err, SRV_DATA_LOSS, "state file '%s' is not an SQLite database (%s: %s)", s->path, what, m);
    if ((rc & 0xff) == SQLITE_CORRUPT && rc != ADM_FAULT)
        return srv_err(err, SRV_DATA_LOSS, "state file '%s' is corrupt (%s: %s)", s->path, what, m);
    return srv_err(err, code_of(rc), "state file '%s': %s: %s", s->path, what, m);
}

static srv_code oom(adm_state *s, srv_error *err, const char *what) {
    return srv_err(err, SRV_RESOURCE_EXHAUSTED, "state file '%s': %s: out of memory", s->path, what);
}

/* ---- argument checks (before the file is touched) ---- */

static srv_code check_name(const char *kind, const char *name, srv_error *err) {
    if (!name) return srv_err(err, SRV_INVALID_ARGUMENT, "%s is missing", kind);
    if (!srv_name_valid(name))
        return srv_err(err, SRV_INVALID_ARGUMENT,
                       "%s '%.100s' must match [A-Za-z0-9_.-]+ (at most 255 characters, not '.' or '..')", kind, name);
    return SRV_OK;
}

/* want_object: the text must be a JSON object; otherwise any JSON value. */
static srv_code check_json(const char *kind, const char *what, const char *text, int want_object, srv_error *err) {
    size_t len = strlen(text);
    if (len > ADM_JSON_MAX)
        return srv_err(err, SRV_INVALID_ARGUMENT, "%s: %s is %zu bytes, more than %d", what, kind, len, ADM_JSON_MAX);
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(text, &end, 1);
    int ok = j && (!want_object || cJSON_IsObject(j));
    cJSON_Delete(j);
    if (!ok)
        return srv_err(err, SRV_INVALID_ARGUMENT, "%s: %s is not %s: '%.80s'", what, kind,
                       want_object ? "a JSON object" : "JSON", text);
    return SRV_OK;
}

static srv_code check_handle(adm_state *s, srv_error *err) {
    return s ? SRV_OK : srv_err(err, SRV_FAILED_PRECONDITION, "no state store (tensord runs without --state_dir)");
}

/* ---- statements ---- */

/* The cached statement id, reset and with its bindings cleared. */
static srv_code q_get(adm_state *s, int id, sqlite3_stmt **q, const char *what, srv_error *err) {
    if (!s->st[id]) {
        int rc = sqlite3_prepare_v3(s->db, stmt_sql[id], -1, SQLITE_PREPARE_PERSISTENT, &s->st[id], NULL);
        if (rc != SQLITE_OK) {
            s->st[id] = NULL;
            return db_fail(s, rc, err, what);
        }
    } else {
        sqlite3_reset(s->st[id]);
        sqlite3_clear_bindings(s->st[id]);
    }
    *q = s->st[id];
    return SRV_OK;
}

static int q_step(adm_state *s, sqlite3_stmt *q) {
    if (s->fault_step > 0 && --s->fault_step == 0) return ADM_FAULT;
    return sqlite3_step(q);
}

/* Run a statement that returns no rows (SQLITE_DONE expected). */
static srv_code q_exec(adm_state *s, sqlite3_stmt *q, const char *what, srv_error *err) {
    int rc = q_step(s, q);
    if (rc != SQLITE_DONE) {
        srv_code c = db_fail(s, rc == SQLITE_ROW ? SQLITE_INTERNAL : rc, err, what);
        sqlite3_reset(q);
        return c;
    }
    sqlite3_reset(q);
    return SRV_OK;
}

static srv_code q_run(adm_state *s, int id, const char *what, srv_error *err) {
    sqlite3_stmt *q = NULL;
    srv_code c = q_get(s, id, &q, what, err);
    return c ? c : q_exec(s, q, what, err);
}

static int b_text(sqlite3_stmt *q, int i, const char *v) {
    return v ? sqlite3_bind_text(q, i, v, -1, SQLITE_STATIC) : sqlite3_bind_null(q, i);
}

/* Copy text column i into *dst (NULL for SQL NULL). -1 when out of memory. */
static int col_dup(sqlite3_stmt *q, int i, char **dst) {
    *dst = NULL;
    if (sqlite3_column_type(q, i) == SQLITE_NULL) return 0;
    const unsigned char *t = sqlite3_column_text(q, i);
    if (!t) return -1;
    return (*dst = strdup((const char *)t)) ? 0 : -1;
}

static void reset_all(adm_state *s) {
    for (int i = 0; i < ST_N; i++)
        if (s->st[i]) sqlite3_reset(s->st[i]);
    for (int i = 0; i < ADM_EXT_STMTS; i++)
        if (s->ext[i]) sqlite3_reset(s->ext[i]);
}

static srv_code tx_begin(adm_state *s, int write, const char *what, srv_error *err) {
    return q_run(s, write ? ST_BEGIN : ST_BEGIN_READ, what, err);
}

/* End the transaction: COMMIT when c is SRV_OK, else (and when COMMIT fails) ROLLBACK. Returns the outcome. */
static srv_code tx_end(adm_state *s, srv_code c, const char *what, srv_error *err) {
    reset_all(s);
    if (c == SRV_OK) c = q_run(s, ST_COMMIT, what, err);
    if (c != SRV_OK && !sqlite3_get_autocommit(s->db)) {
        sqlite3_stmt *q = NULL;
        if (q_get(s, ST_ROLLBACK, &q, what, NULL) == SRV_OK) {
            sqlite3_step(q);   /* not q_step: an injected fault never hits the rollback */
            sqlite3_reset(q);
        }
    }
    return c;
}

/* Run a constant script of one or more statements, no rows expected (schema). */
static srv_code exec_script(adm_state *s, const char *sql, const char *what, srv_error *err) {
    while (sql && *sql) {
        sqlite3_stmt *q = NULL;
        const char *tail = NULL;
        int rc = sqlite3_prepare_v2(s->db, sql, -1, &q, &tail);
        if (rc != SQLITE_OK) return db_fail(s, rc, err, what);
        if (!q) break;   /* only white space left */
        rc = q_step(s, q);
        if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
            srv_code c = db_fail(s, rc, err, what);
            sqlite3_finalize(q);
            return c;
        }
        sqlite3_finalize(q);
        sql = tail;
    }
    return SRV_OK;
}

/* Run a constant PRAGMA; the first column of its first row goes into buf ("" when none). */
static srv_code pragma(adm_state *s, const char *sql, char *buf, size_t cap, srv_error *err) {
    sqlite3_stmt *q = NULL;
    buf[0] = 0;
    int rc = sqlite3_prepare_v2(s->db, sql, -1, &q, NULL);
    if (rc != SQLITE_OK) return db_fail(s, rc, err, sql);
    int first = 1;
    while ((rc = q_step(s, q)) == SQLITE_ROW) {
        if (first && sqlite3_column_type(q, 0) != SQLITE_NULL) {
            const unsigned char *t = sqlite3_column_text(q, 0);
            snprintf(buf, cap, "%s", t ? (const char *)t : "");
        }
        first = 0;
    }
    srv_code c = rc == SQLITE_DONE ? SRV_OK : db_fail(s, rc, err, sql);
    sqlite3_finalize(q);
    return c;
}

static int64_t now_unix_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- for the other state files (state-impl.h) ---- */

srv_code adm_st_begin(adm_state *s, int write, const char *what, srv_error *err) { return tx_begin(s, write, what, err); }
srv_code adm_st_end(adm_state *s, srv_code c, const char *what, srv_error *err) { return tx_end(s, c, what, err); }
srv_code adm_st_fail(adm_state *s, int rc, srv_error *err, const char *what) { return db_fail(s, rc, err, what); }
srv_code adm_st_oom(adm_state *s, srv_error *err, const char *what) { return oom(s, err, what); }
int adm_st_step(adm_state *s, sqlite3_stmt *q) { return q_step(s, q); }
srv_code adm_st_exec(adm_state *s, sqlite3_stmt *q, const char *what, srv_error *err) { return q_exec(s, q, what, err); }
int adm_st_bind_text(sqlite3_stmt *q, int i, const char *v) { return b_text(q, i, v); }
int adm_st_col_dup(sqlite3_stmt *q, int i, char **dst) { return col_dup(q, i, dst); }
srv_code adm_st_check_handle(adm_state *s, srv_error *err) { return check_handle(s, err); }
srv_code adm_st_check_name(const char *kind, const char *name, srv_error *err) { return check_name(kind, name, err); }
srv_code adm_st_check_json(const char *kind, const char *what, const char *text, int want_object, srv_error *err) {
    return check_json(kind, what, text, want_object, err);
}
int64_t adm_st_now_ms(void) { return now_unix_ms(); }

srv_code adm_st_prepare(adm_state *s, int slot, const char *sql, sqlite3_stmt **q, const char *what, srv_error *err) {
    if (slot < 0 || slot >= ADM_EXT_STMTS) return srv_err(err, SRV_INTERNAL, "%s: statement slot %d out of range", what, slot);
    if (!s->ext[slot]) {
        int rc = sqlite3_prepare_v3(s->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &s->ext[slot], NULL);
        if (rc != SQLITE_OK) {
            s->ext[slot] = NULL;
            return db_fail(s, rc, err, what);
        }
    } else {
        sqlite3_reset(s->ext[slot]);
        sqlite3_clear_bindings(s->ext[slot]);
    }
    *q = s->ext[slot];
    return SRV_OK;
}

/* ---- open, schema, free ---- */

/* Inside BEGIN IMMEDIATE: create schema 1 in an empty file, or check the one there. */
static srv_code schema_check(adm_state *s, srv_error *err) {
    const char *what = "reading the schema";
    char found[NTABLES][32];
    int nfound = 0, other = 0, has_version = 0;
    char other_name[64] = "";
    sqlite3_stmt *q = NULL;
    srv_code c = q_get(s, ST_TABLES, &q, what, err);
    if (c) return c;
    int rc;
    while ((rc = q_step(s, q)) == SQLITE_ROW) {
        const char *t = (const char *)sqlite3_column_text(q, 0);
        if (!t) continue;
        int known = 0;
        for (int i = 0; i < NTABLES; i++) known |= strcmp(t, tables_all[i]) == 0;
        if (known && nfound < NTABLES) snprintf(found[nfound++], sizeof found[0], "%s", t);
        if (!known && !other++) snprintf(other_name, sizeof other_name, "%s", t);
        has_version |= strcmp(t, "schema_version") == 0;
    }
    if (rc != SQLITE_DONE) return db_fail(s, rc, err, what);
    sqlite3_reset(q);
    if (nfound == 0 && other == 0) {
        if ((c = exec_script(s, schema_v1, "creating the schema", err))) return c;
        for (int k = 2; k <= ADM_STATE_SCHEMA; k++)
            if ((c = exec_script(s, schema_add[k], "creating the schema", err))) return c;
        if ((c = q_get(s, ST_SCHEMA_SET, &q, "creating the schema", err))) return c;
        if ((rc = sqlite3_bind_int(q, 1, ADM_STATE_SCHEMA))) return db_fail(s, rc, err, "creating the schema");
        return q_exec(s, q, "creating the schema", err);
    }
    if (!has_version)
        return srv_err(err, SRV_FAILED_PRECONDITION,
                       "state file '%s' is an SQLite database but not tensord's (no schema_version table; it holds "
                       "table '%s'): point --state_dir at a directory of its own", s->path,
                       other ? other_name : found[0]);
    if ((c = q_get(s, ST_SCHEMA_GET, &q, what, err))) return c;
    rc = q_step(s, q);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return db_fail(s, rc, err, what);
    if (rc == SQLITE_DONE || sqlite3_column_type(q, 0) != SQLITE_INTEGER)
        return srv_err(err, SRV_DATA_LOSS, "state file '%s' is corrupt: its schema_version table holds no version",
                       s->path);
    sqlite3_int64 v = sqlite3_column_int64(q, 0);
    sqlite3_reset(q);
    if (v > ADM_STATE_SCHEMA)
        return srv_err(err, SRV_FAILED_PRECONDITION,
                       "state file '%s' has schema version %lld, newer than this tensord's %d: it was written by a "
                       "newer tensord (run that one, or point --state_dir elsewhere)", s->path, (long long)v,
                       ADM_STATE_SCHEMA);
    if (v < 1)
        return srv_err(err, SRV_DATA_LOSS, "state file '%s' is corrupt: schema version %lld", s->path, (long long)v);
    for (int i = 0; i < NTABLES; i++) {
        int ok = tables_since[i] > v;
        for (int k = 0; k < nfound; k++) ok |= strcmp(found[k], tables_all[i]) == 0;
        if (!ok)
            return srv_err(err, SRV_DATA_LOSS, "state file '%s' is corrupt: schema version %lld but no table '%s'",
                           s->path, (long long)v, tables_all[i]);
    }
    for (int k = (int)v + 1; k <= ADM_STATE_SCHEMA; k++) { /* migrate k-1 -> k */
        char mw[64];
        snprintf(mw, sizeof mw, "migrating the schema to version %d", k);
        if ((c = exec_script(s, schema_add[k], mw, err))) return c;
        if ((c = q_get(s, ST_SCHEMA_UPDATE, &q, mw, err))) return c;
        if ((rc = sqlite3_bind_int(q, 1, k))) return db_fail(s, rc, err, mw);
        if ((c = q_exec(s, q, mw, err))) return c;
    }
    return SRV_OK;
}

static srv_code state_setup(adm_state *s, srv_error *err) {
    char buf[256];
    sqlite3_extended_result_codes(s->db, 1);
    sqlite3_busy_timeout(s->db, 5000);
    sqlite3_db_config(s->db, SQLITE_DBCONFIG_DEFENSIVE, 1, (int *)NULL);
    sqlite3_db_config(s->db, SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0, (int *)NULL);
    if (sqlite3_db_readonly(s->db, "main") == 1)
        return srv_err(err, SRV_PERMISSION_DENIED, "state file '%s' is read-only: tensord must be able to write it",
                       s->path);
    srv_code c = pragma(s, "PRAGMA journal_mode = WAL", buf, sizeof buf, err);
    if (c) return c;
    if (strcmp(buf, "wal") != 0)
        return srv_err(err, SRV_FAILED_PRECONDITION,
                       "state file '%s': cannot use WAL mode (journal_mode stays '%s'; does the file system support "
                       "shared memory?)", s->path, buf);
    if ((c = pragma(s, "PRAGMA synchronous = FULL", buf, sizeof buf, err))) return c;
    if ((c = pragma(s, "PRAGMA foreign_keys = ON", buf, sizeof buf, err))) return c;
    if ((c = pragma(s, "PRAGMA foreign_keys", buf, sizeof buf, err))) return c;
    if (strcmp(buf, "1") != 0)
        return srv_err(err, SRV_FAILED_PRECONDITION, "state file '%s': this SQLite cannot enforce foreign keys",
                       s->path);
    if ((c = pragma(s, "PRAGMA quick_check", buf, sizeof buf, err))) return c;
    if (strcmp(buf, "ok") != 0)
        return srv_err(err, SRV_DATA_LOSS, "state file '%s' is corrupt (quick_check: %s)", s->path, buf);
    c = tx_begin(s, 1, "reading the schema", err);
    if (c == SRV_OK) c = schema_check(s, err);
    return tx_end(s, c, "reading the schema", err);
}

srv_code adm_state_open(const char *dir, adm_state **out, srv_error *err) {
    if (!out) return srv_err(err, SRV_INVALID_ARGUMENT, "adm_state_open: out is NULL");
    *out = NULL;
    if (!dir || !*dir) return srv_err(err, SRV_INVALID_ARGUMENT, "state dir (--state_dir) is empty");
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno == ENOENT || errno == ENOTDIR)
            return srv_err(err, SRV_NOT_FOUND, "state dir '%s' does not exist (--state_dir must name a directory)", dir);
        return srv_err(err, SRV_PERMISSION_DENIED, "state dir '%s': %s", dir, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode)) return srv_err(err, SRV_INVALID_ARGUMENT, "state dir '%s' is not a directory", dir);
    if (access(dir, W_OK | X_OK) != 0)
        return srv_err(err, SRV_PERMISSION_DENIED,
                       "state dir '%s' is not writable (%s): tensord keeps " ADM_STATE_FILE " and its -wal and -shm "
                       "files there", dir, strerror(errno));
    size_t dl = strlen(dir);
    while (dl > 1 && dir[dl - 1] == '/') dl--;
    char *path = NULL;
    if (asprintf(&path, "%.*s%s" ADM_STATE_FILE, (int)dl, dir, dir[dl - 1] == '/' ? "" : "/") < 0)
        return srv_err(err, SRV_RESOURCE_EXHAUSTED, "state dir '%s': out of memory", dir);
    if (stat(path, &st) == 0) {
        srv_code c = SRV_OK;
        if (!S_ISREG(st.st_mode))
            c = srv_err(err, SRV_INVALID_ARGUMENT, "state file '%s' is not a regular file", path);
        else if (access(path, R_OK | W_OK) != 0)
            c = srv_err(err, SRV_PERMISSION_DENIED, "state file '%s' is not writable (%s)", path, strerror(errno));
        if (c) {
            free(path);
            return c;
        }
    } else if (errno != ENOENT) {
        srv_code c = srv_err(err, SRV_PERMISSION_DENIED, "state file '%s': %s", path, strerror(errno));
        free(path);
        return c;
    }
    adm_state *s = calloc(1, sizeof *s);
    if (!s) {
        free(path);
        return srv_err(err, SRV_RESOURCE_EXHAUSTED, "state dir '%s': out of memory", dir);
    }
    s->path = path;
    pthread_mutex_init(&s->mu, NULL);
    int rc = sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
    srv_code c = rc == SQLITE_OK ? SRV_OK
                 : s->db         ? db_fail(s, rc, err, "opening")
                                 : srv_err(err, SRV_RESOURCE_EXHAUSTED, "state file '%s': out of memory", path);
    if (c == SRV_OK) c = state_setup(s, err);
    if (c != SRV_OK) {
        adm_state_free(&s);
        return c;
    }
    *out = s;
    return SRV_OK;
}

void adm_state_free(adm_state **sp) {
    if (!sp || !*sp) return;
    adm_state *s = *sp;
    for (int i = 0; i < ST_N; i++) sqlite3_finalize(s->st[i]);
    for (int i = 0; i < ADM_EXT_STMTS; i++) sqlite3_finalize(s->ext[i]);
    sqlite3_close_v2(s->db);   /* the last connection checkpoints the WAL into the file */
    pthread_mutex_destroy(&s->mu);
    free(s->path);
    free(s);
    *sp = NULL;
}

/* ---- records ---- */

void adm_model_rec_free(adm_model_rec *r) {
    if (!r) return;
    free(r->name);
    free(r->base_path);
    free(r->policy_json);
    for (int i = 0; i < r->nlabels; i++) free(r->label_names[i]);
    free(r->label_names);
    free(r->label_versions);
    for (int i = 0; i < r->traffic.nroutes; i++) free(r->traffic.routes[i].label);
    free(r->traffic.routes);
    free(r->traffic.sticky_header);
    free(r->traffic.shadow);
    free(r->traffic.json);
    memset(r, 0, sizeof *r);
}

void adm_events_free(adm_event *e, int n) {
    if (!e) return;
    for (int i = 0; i < n; i++) {
        free(e[i].event);
        free(e[i].detail_json);
    }
    free(e);
}

/* ---- writes ---- */

srv_code adm_state_put_model(adm_state *s, const char *name, const char *base_path, const char *policy_json,
                             srv_error *err) {
    srv_code c;
    if ((c = check_handle(s, err)) || (c = check_name("model name", name, err))) return c;
    char what[320];
    snprintf(what, sizeof what, "adding model '%s'", name);
    if (!base_path || !*base_path) return srv_err(err, SRV_INVALID_ARGUMENT, "%s: base_path is empty", what);
    if (policy_json && (c = check_json("version policy", what, policy_json, 1, err))) return c;
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *q = NULL;
    c = tx_begin(s, 1, what, err);
    if (!c && !(c = q_get(s, ST_MODEL_PUT, &q, what, err))) {
        int rc = b_text(q, 1, name) || b_text(q, 2, base_path) || b_text(q, 3, policy_json);
        c = rc ? db_fail(s, sqlite3_errcode(s->db), err, what) : q_exec(s, q, what, err);
    }
    if (!c && !(c = q_get(s, ST_REMOVED_DELETE, &q, what, err)))
        c = b_text(q, 1, name) ? db_fail(s, sqlite3_errcode(s->db), err, what) : q_exec(s, q, what, err);
    c = tx_end(s, c, what, err);
    pthread_mutex_unlock(&s->mu);
    return c;
}

srv_code adm_state_delete_model(adm_state *s, const char *name, srv_error *err) {
    srv_code c;
    if ((c = check_handle(s, err)) || (c = check_name("model name", name, err))) return c;
    char what[320];
    snprintf(what, sizeof what, "deleting model '%s'", name);
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *q = NULL;
    c = tx_begin(s, 1, what, err);
    if (!c && !(c = q_get(s, ST_MODEL_DELETE, &q, what, err))) {
        c = b_text(q, 1, name) ? db_fail(s, sqlite3_errcode(s->db), err, what) : q_exec(s, q, what, err);
        if (!c && sqlite3_changes(s->db) == 0)
            c = srv_err(err, SRV_NOT_FOUND, "state file '%s' holds no model '%s'", s->path, name);
    }
    c = tx_end(s, c, what, err);
    pthread_mutex_unlock(&s->mu);
    return c;
}

srv_code adm_state_remove_model(adm_state *s, const char *name, srv_error *err) {
    srv_code c;
    if ((c = check_handle(s, err)) || (c = check_name("model name", name, err))) return c;
    char what[320];
    snprintf(what, sizeof what, "removing model '%s'", name);
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *q = NULL;
    c = tx_begin(s, 1, what, err);
    if (!c && !(c = q_get(s, ST_MODEL_DELETE, &q, what, err)))
        c = b_text(q, 1, name) ? db_fail(s, sqlite3_errcode(s->db), err, what) : q_exec(s, q, what, err);
    if (!c && !(c = q_get(s, ST_REMOVED_PUT, &q, what, err)))
        c = b_text(q, 1, name) ? db_fail(s, sqlite3_errcode(s->db), err, what) : q_exec(s, q, what, err);
    c = tx_end(s, c, what, err);
    pthread_mutex_unlock(&s->mu);
    return c;
}

/* Inside a write: give model a row (added = 0) unless it has one. */
static srv_code ensure_model(adm_state *s, const char *model, const char *what, srv_error *err) {
    sqlite3_stmt *q = NULL;
    srv_code c = q_get(s, ST_MODEL_ENSURE, &q, what, err);
    if (c) return c;
    return b_text(q, 1, model) ? db_fail(s, sqlite3_errcode(s->db), err, what) : q_exec(s, q, what, err);
}

/* Inside a write: drop model's row if it is added = 0 and carries nothing any more. */
static srv_code gc_model(adm_state *s, const char *model, const char *what, srv_error *err) {
    sqlite3_stmt *q = NULL;
    srv_code c = q_get(s, ST_MODEL_GC, &q, what, err);
    if (c) return c;
    return b_text(q, 1, model) ? db_fail(s, sqlite3_errcode(s->db), err, what) : q_exec(s, q, what, err);
}

srv_code adm_state_put_label(adm_state *s, const char *model, const char *label, int64_t version, srv_error *err) {
    srv_code c;
    if ((c = check_handle(s, err)) || (c = check_name("model name", model, err)) ||
        (c = check_name("label", label, err)))
        return c;
    char what[600];
    snprintf(what, sizeof what, "setting label '%s' of model '%s' to version %lld", label, model, (long long)version);
    if (version <= 0) return srv_err(err, SRV_INVALID_ARGUMENT, "%s: a version is a number >= 1", what);
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *q = NULL;
    c = tx_begin(s, 1, what, err);
    if (!c) c = ensure_model(s, model, what, err);
    if (!c && !(c = q_get(s, ST_LABEL_PUT, &q, what, err))) {
        int rc = b_text(q, 1, model) || b_text(q, 2, label) || sqlite3_bind_int64(q, 3, version);
        c = rc ? db_fail(s, sqlite3_errcode(s->db), err, what) : q_exec(s, q, what, err);
    }
    c = tx_end(s, c, what, err);
    pthread_mutex_unlock(&s->mu);
    return c;
}

srv_code adm_state_delete_label(adm_state *s, const char *model, const char *label, srv_error *err) {
    srv_code c;
    if ((c = check_handle(s, err)) || (c = check_name("model name", model, err)) ||
        (c = check_name("label", label, err)))
        return c;
    char what[600];
    snprintf(what, sizeof what, "deleting label '%s' of model '%s'", label, model);
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *q = NULL;
    c = tx_begin(s, 1, what, err);
    if (!c && !(c = q_get(s, ST_LABEL_DELETE, &q, what, err))) {
        int rc = b_text(q, 1, model) || b_text(q, 2, label);
        c = rc ? db_fail(s, sqlite3_errcode(s->db), err, what) : q_exec(s, q, what, err);
        if (!c && sqlite3_changes(s->db) == 0)
            c = srv_err(err, SRV_NOT_FOUND, "state file '%s' holds no label '%s' of model '%s'", s->path, label, model);
    }
    if (!c) c = gc_model(s, model, what, err);
    c = tx_end(s, c, what, err);
    pthread_mutex_unlock(&s->mu);
    return c;
}

static srv_code check_traffic(const adm_traffic *t, const char *what, srv_error *err) {
    srv_code c;
    if (t->nroutes < 0 || t->nroutes > ADM_ROUTES_MAX || !t->routes)
        return srv_err(err, SRV_INVALID_ARGUMENT, "%s: %d routes (1..%d, or 0 to clear)", what, t->nroutes,
                       ADM_ROUTES_MAX);
    for (int i = 0; i < t->nroutes; i++) {
        const adm_route *r = &t->routes[i];
        if ((c = check_name("route label", r->label, err))) return c;
        if (r->weight < 0 || r->weight > ADM_WEIGHT_MAX)
            return srv_err(err, SRV_INVALID_ARGUMENT, "%s: route '%s' has weight %d, not 0..%d", what, r->label,
                           r->weight, ADM_WEIGHT_MAX);
        for (int k = 0; k < i; k++)
            if (strcmp(t->routes[k].label, r->label) == 0)
                return srv_err(err, SRV_INVALID_ARGUMENT, "%s: route '%s' is given twice", what, r->label);
    }
    if (t->sticky_header && *t->sticky_header) {
        size_t n = 0;
        for (const char *p = t->sticky_header; *p; p++, n++)
            if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' ||
                  *p == '_') || n >= 255)
                return srv_err(err, SRV_INVALID_ARGUMENT, "%s: sticky_header '%.100s' is not a header name", what,
                               t->sticky_header);
    }
    if (t->shadow && *t->shadow && (c = check_name("shadow label", t->shadow, err))) return c;
    if (t->json && (c = check_json("auto_rollback settings", what, t->json, 1, err))) return c;
    return SRV_OK;
}

static const char *nonempty(const char *v) { return v && *v ? v : NULL; }

srv_code adm_state_put_traffic(adm_state *s, const char *model, const adm_traffic *t, srv_error *err) {
    srv_code c;
    if ((c = check_handle(s, err)) || (c = check_name("model name", model, err))) return c;
    int clear = !t || t->nroutes == 0;
    char what[320];
    snprintf(what, sizeof what, "%s traffic of model '%s'", clear ? "clearing" : "setting", model);
    if (!clear && (c = check_traffic(t, what, err))) return c;
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *q = NULL;
    c = tx_begin(s, 1, what, err);
    if (!c && !clear) c = ensure_model(s, model, what, err);
    if (!c && !(c = q_get(s, ST_TRAFFIC_DELETE, &q, what, err)))   /* its routes go with it */
        c = b_text(q, 1, model) ? db_fail(s, sqlite3_errcode(s->db), err, what) : q_exec(s, q, what, err);
    if (!c && !clear && !(c = q_get(s, ST_TRAFFIC_PUT, &q, what, err))) {
        int rc = b_text(q, 1, model) || b_text(q, 2, nonempty(t->sticky_header)) || b_text(q, 3, nonempty(t->shadow)) ||
                 b_text(q, 4, t->json);
        c = rc ? db_fail(s, sqlite3_errcode(s->db), err, what) : q_exec(s, q, what, err);
    }
    for (int i = 0; !c && !clear && i < t->nroutes; i++) {
        if ((c = q_get(s, ST_ROUTE_PUT, &q, what, err))) break;
        int rc = b_text(q, 1, model) || sqlite3_bind_int(q, 2, i) || b_text(q, 3, t->routes[i].label) ||
                 sqlite3_bind_int(q, 4, t->routes[i].weight);
        c = rc ? db_fail(s, sqlite3_errcode(s->db), err, what) : q_exec(s, q, what, err);
    }
    if (!c && clear) c = gc_model(s, model, what, err);
    c = tx_end(s, c, what, err);
    pthread_mutex_unlock(&s->mu);
    return c;
}


srv_code adm_state_add_event(adm_state *s, const char *model, const char *event, const char *detail_json,
                             srv_error *err) {
    srv_code c;
    if ((c = check_handle(s, err)) || (c = check_name("model name", model, err)) ||
        (c = check_name("event", event, err)))
        return c;
    char what[600];
    snprintf(what, sizeof what, "recording event '%s' of model '%s'", event, model);
    if (detail_json && (c = check_json("event detail", what, detail_json, 0, err))) return c;
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *q = NULL;
    c = tx_begin(s, 1, what, err);
    if (!c && !(c = q_get(s, ST_EVENT_ADD, &q, what, err))) {
        int rc = b_text(q, 1, model) || sqlite3_bind_int64(q, 2, now_unix_ms()) || b_text(q, 3, event) ||
                 b_text(q, 4, detail_json);
        c = rc ? db_fail(s, sqlite3_errcode(s->db), err, what) : q_exec(s, q, what, err);
    }
    if (!c && !(c = q_get(s, ST_EVENT_PRUNE, &q, what, err))) { /* keep the newest ADM_EVENTS_KEEP of the model */
        int rc = b_text(q, 1, model) || sqlite3_bind_int(q, 2, ADM_EVENTS_KEEP);
        c = rc ? db_fail(s, sqlite3_errcode(s->db), err, what) : q_exec(s, q, what, err);
    }
    c = tx_end(s, c, what, err);
    pthread_mutex_unlock(&s->mu);
    return c;
}

/* ---- reads ---- */

srv_code adm_state_events(adm_state *s, const char *model, int n, adm_event **out, int *count, srv_error *err) {
    srv_code c;
    if (out) *out = NULL;
    if (count) *count = 0;
    if ((c = check_handle(s, err)) || (c = check_name("model name", model, err))) return c;
    if (!out || !count) return srv_err(err, SRV_INVALID_ARGUMENT, "adm_state_events: out or count is NULL");
    char what[320];
    snprintf(what, sizeof what, "reading the history of model '%s'", model);
    if (n < 1) return srv_err(err, SRV_INVALID_ARGUMENT, "%s: asked for %d events (at least 1)", what, n);
    adm_event *ev = NULL;
    int nev = 0, cap = 0;
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *q = NULL;
    c = tx_begin(s, 0, what, err);
    if (!c && !(c = q_get(s, ST_EVENTS, &q, what, err))) {
        int rc = b_text(q, 1, model) || sqlite3_bind_int(q, 2, n);
        if (rc) c = db_fail(s, sqlite3_errcode(s->db), err, what);
        while (!c && (rc = q_step(s, q)) == SQLITE_ROW) {
            if (nev == cap) {
                int ncap = cap ? cap * 2 : 16;
                adm_event *g = realloc(ev, (size_t)ncap * sizeof *g);
                if (!g) {
                    c = oom(s, err, what);
                    break;
                }
                ev = g;
                cap = ncap;
            }
            adm_event *e = &ev[nev++];
            memset(e, 0, sizeof *e);
            e->unix_ms = sqlite3_column_int64(q, 0);
            if (col_dup(q, 1, &e->event) || col_dup(q, 2, &e->detail_json) || !e->event) c = oom(s, err, what);
        }
        if (!c && rc != SQLITE_DONE) c = db_fail(s, rc, err, what);
    }
    c = tx_end(s, c, what, err);
    pthread_mutex_unlock(&s->mu);
    if (c) {
        adm_events_free(ev, nev);
        return c;
    }
    if (nev == 0) {
        free(ev);
        ev = NULL;
    }
    *out = ev;
    *count = nev;
    return SRV_OK;
}

/* Inside the load's read: r's labels and traffic. */
static srv_code load_one(adm_state *s, adm_model_rec *r, srv_error *err) {
    const char *what = "loading the state";
    sqlite3_stmt *q = NULL;
    srv_code c;
    int rc, cap = 0;
    if ((c = q_get(s, ST_LOAD_LABELS, &q, what, err))) return c;
    if (b_text(q, 1, r->name)) return db_fail(s, sqlite3_errcode(s->db), err, what);
    while ((rc = q_step(s, q)) == SQLITE_ROW) {
        if (r->nlabels == cap) {
            int ncap = cap ? cap * 2 : 4;
            char **gn = realloc(r->label_names, (size_t)ncap * sizeof *gn);
            if (gn) r->label_names = gn;
            int64_t *gv = realloc(r->label_versions, (size_t)ncap * sizeof *gv);
            if (gv) r->label_versions = gv;
            if (!gn || !gv) return oom(s, err, what);
            cap = ncap;
        }
        r->label_versions[r->nlabels] = sqlite3_column_int64(q, 1);
        if (col_dup(q, 0, &r->label_names[r->nlabels]) || !r->label_names[r->nlabels]) return oom(s, err, what);
        r->nlabels++;
    }
    if (rc != SQLITE_DONE) return db_fail(s, rc, err, what);

    if ((c = q_get(s, ST_LOAD_TRAFFIC, &q, what, err))) return c;
    if (b_text(q, 1, r->name)) return db_fail(s, sqlite3_errcode(s->db), err, what);
    rc = q_step(s, q);
    if (rc == SQLITE_DONE) return SRV_OK;
    if (rc != SQLITE_ROW) return db_fail(s, rc, err, what);
    adm_traffic *t = &r->traffic;
    if (col_dup(q, 0, &t->sticky_header) || col_dup(q, 1, &t->shadow) || col_dup(q, 2, &t->json))
        return oom(s, err, what);
    if ((c = q_get(s, ST_LOAD_ROUTES, &q, what, err))) return c;
    if (b_text(q, 1, r->name)) return db_fail(s, sqlite3_errcode(s->db), err, what);
    cap = 0;
    while ((rc = q_step(s, q)) == SQLITE_ROW) {
        if (t->nroutes == cap) {
            int ncap = cap ? cap * 2 : 4;
            adm_route *g = realloc(t->routes, (size_t)ncap * sizeof *g);
            if (!g) return oom(s, err, what);
            t->routes = g;
            cap = ncap;
        }
        adm_route *rt = &t->routes[t->nroutes];
        rt->weight = sqlite3_column_int(q, 1);
        if (col_dup(q, 0, &rt->label) || !rt->label) return oom(s, err, what);
        t->nroutes++;
    }
    if (rc != SQLITE_DONE) return db_fail(s, rc, err, what);
    return SRV_OK;
}

srv_code adm_state_load(adm_state *s, adm_model_rec **out, int *n, srv_error *err) {
    srv_code c;
    if (out) *out = NULL;
    if (n) *n = 0;
    if ((c = check_handle(s, err))) return c;
    if (!out || !n) return srv_err(err, SRV_INVALID_ARGUMENT, "adm_state_load: out or n is NULL");
    const char *what = "loading the state";
    adm_model_rec *recs = NULL;
    int nrec = 0, cap = 0;
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *q = NULL;
    c = tx_begin(s, 0, what, err);
    if (!c && !(c = q_get(s, ST_LOAD_MODELS, &q, what, err))) {
        int rc;
        while ((rc = q_step(s, q)) == SQLITE_ROW) {
            if (nrec == cap) {
                int ncap = cap ? cap * 2 : 16;
                adm_model_rec *g = realloc(recs, (size_t)ncap * sizeof *g);
                if (!g) {
                    c = oom(s, err, what);
                    break;
                }
                recs = g;
                cap = ncap;
            }
            adm_model_rec *r = &recs[nrec++];
            memset(r, 0, sizeof *r);
            r->added = sqlite3_column_int(q, 3);
            r->removed = sqlite3_column_int(q, 4);
            if (col_dup(q, 0, &r->name) || col_dup(q, 1, &r->base_path) || col_dup(q, 2, &r->policy_json) ||
                !r->name) {
                c = oom(s, err, what);
                break;
            }
        }
        if (!c && rc != SQLITE_DONE) c = db_fail(s, rc, err, what);
        sqlite3_reset(q);
    }
    for (int i = 0; !c && i < nrec; i++)
        if (!recs[i].removed) c = load_one(s, &recs[i], err);
    c = tx_end(s, c, what, err);
    pthread_mutex_unlock(&s->mu);
    if (c) {
        for (int i = 0; i < nrec; i++) adm_model_rec_free(&recs[i]);
        free(recs);
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
