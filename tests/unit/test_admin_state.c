/* test_admin_state.c - admin/state.c, the admin room's SQLite state store: every record kind round-trips, a
 * restart (free + reopen, and a process killed right after a write) sees everything, deletes cascade, a write
 * that fails at any statement leaves the previous state (fault injected at each step in turn, SQLite's own
 * testing habit), bad names and values are refused before the file is touched, and bad files (not SQLite,
 * corrupt, another program's, a newer schema, a missing or read-only directory) are refused naming the path.
 *
 * Each test works in a fresh mkdtemp directory. The file is inspected with a second, raw SQLite connection
 * where the point is what is on disk (journal mode, rows left behind), not what the handle reports.
 * SHOW_MSGS=1 in the environment prints the refusals' messages and the steps each write was failed at.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "admin/state.c"
#include "server/srv.c"

static char g_dir[256];
static char g_path[512];

static void setup(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/tensord-state-XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
    snprintf(g_path, sizeof g_path, "%s/" ADM_STATE_FILE, g_dir);
}

static void teardown(void) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "chmod -R u+rwx '%s' 2>/dev/null; rm -rf '%s'", g_dir, g_dir);
    if (system(cmd) != 0) {}
}

TestSuite(admin_state, .init = setup, .fini = teardown, .timeout = 60);

/* ---- helpers ---- */

static adm_state *open_ok(void) {
    adm_state *s = NULL;
    srv_error e = {0};
    cr_assert_eq(adm_state_open(g_dir, &s, &e), SRV_OK, "open %s: %s", g_dir, e.msg);
    cr_assert_not_null(s);
    return s;
}

#define OK(call)                                                                                                  \
    do {                                                                                                          \
        srv_error e_ = {0};                                                                                       \
        srv_code c_ = (call);                                                                                     \
        cr_assert_eq(c_, SRV_OK, "%s: %s %s", #call, srv_code_name(c_), e_.msg);                                  \
    } while (0)
#define E (&e_)

/* Everything adm_state_load returns, as text (caller frees): one line per model. */
static char *dump(adm_state *s) {
    adm_model_rec *r = NULL;
    int n = -1;
    srv_error e = {0};
    cr_assert_eq(adm_state_load(s, &r, &n, &e), SRV_OK, "load: %s", e.msg);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    for (int i = 0; i < n; i++) {
        if (r[i].removed) {
            fprintf(f, "%s removed\n", r[i].name);
            adm_model_rec_free(&r[i]);
            continue;
        }
        fprintf(f, "%s added=%d base=%s policy=%s labels=", r[i].name, r[i].added,
                r[i].base_path ? r[i].base_path : "-", r[i].policy_json ? r[i].policy_json : "-");
        for (int k = 0; k < r[i].nlabels; k++) fprintf(f, "%s:%lld,", r[i].label_names[k], (long long)r[i].label_versions[k]);
        fprintf(f, " routes=");
        for (int k = 0; k < r[i].traffic.nroutes; k++)
            fprintf(f, "%s:%d,", r[i].traffic.routes[k].label, r[i].traffic.routes[k].weight);
        fprintf(f, " sticky=%s shadow=%s json=%s\n", r[i].traffic.sticky_header ? r[i].traffic.sticky_header : "-",
                r[i].traffic.shadow ? r[i].traffic.shadow : "-", r[i].traffic.json ? r[i].traffic.json : "-");
        adm_model_rec_free(&r[i]);
    }
    free(r);
    fclose(f);
    return buf;
}

static void expect_dump(adm_state *s, const char *want) {
    char *got = dump(s);
    cr_assert_str_eq(got, want);
    free(got);
}

/* A second connection to the file: the first column of the first row of sql, as an integer or text. */
static long long raw_int(const char *sql) {
    sqlite3 *db = NULL;
    cr_assert_eq(sqlite3_open_v2(g_path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *q = NULL;
    cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &q, NULL), SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(db));
    cr_assert_eq(sqlite3_step(q), SQLITE_ROW, "%s", sql);
    long long v = sqlite3_column_int64(q, 0);
    sqlite3_finalize(q);
    sqlite3_close(db);
    return v;
}

static void raw_text(const char *sql, char *buf, size_t cap) {
    sqlite3 *db = NULL;
    cr_assert_eq(sqlite3_open_v2(g_path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    sqlite3_stmt *q = NULL;
    cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &q, NULL), SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(db));
    cr_assert_eq(sqlite3_step(q), SQLITE_ROW, "%s", sql);
    snprintf(buf, cap, "%s", (const char *)sqlite3_column_text(q, 0));
    sqlite3_finalize(q);
    sqlite3_close(db);
}

static void raw_exec(const char *sql) {
    sqlite3 *db = NULL;
    cr_assert_eq(sqlite3_open_v2(g_path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL), SQLITE_OK);
    char *m = NULL;
    cr_assert_eq(sqlite3_exec(db, sql, NULL, NULL, &m), SQLITE_OK, "%s: %s", sql, m ? m : "");
    sqlite3_close(db);
}

static void write_file(const char *path, const char *text, size_t len) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot write %s", path);
    cr_assert_eq(fwrite(text, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
}

static void expect_open_fails(const char *dir, srv_code want, const char *needle1, const char *needle2) {
    adm_state *s = (adm_state *)1;
    srv_error e = {0};
    srv_code c = adm_state_open(dir, &s, &e);
    cr_assert_eq(c, want, "open %s: want %s, got %s (%s)", dir, srv_code_name(want), srv_code_name(c), e.msg);
    cr_assert_null(s);
    if (getenv("SHOW_MSGS")) fprintf(stderr, "open %s: %s: %s\n", dir, srv_code_name(c), e.msg);
    cr_assert_not_null(strstr(e.msg, needle1), "message '%s' lacks '%s'", e.msg, needle1);
    if (needle2) cr_assert_not_null(strstr(e.msg, needle2), "message '%s' lacks '%s'", e.msg, needle2);
}

/* A typical state: an added model with labels and a split, a config-file model with a label only, and one with
 * traffic only, put in an order unlike the names'. */
static void fill(adm_state *s) {
    OK(adm_state_put_model(s, "zeta", "/models/zeta", "{\"all\":{}}", E));
    OK(adm_state_put_model(s, "fashion", "relative/fashion dir", "{\"latest\":{\"num_versions\":2}}", E));
    OK(adm_state_put_label(s, "fashion", "stable", 1, E));
    OK(adm_state_put_label(s, "fashion", "canary", 2, E));
    OK(adm_state_put_label(s, "fromcfg", "stable", 7, E));
    adm_route routes[] = {{"stable", 90}, {"canary", 10}};
    adm_traffic t = {routes, 2, "X-User-Id", "canary", "{\"max_error_rate\":0.05,\"window_s\":60}"};
    OK(adm_state_put_traffic(s, "fashion", &t, E));
    adm_route r2[] = {{"b", 0}, {"a", 1000000}};
    adm_traffic t2 = {r2, 2, NULL, NULL, NULL};
    OK(adm_state_put_traffic(s, "cfgtraffic", &t2, E));
}

static const char FILLED[] =
    "cfgtraffic added=0 base=- policy=- labels= routes=b:0,a:1000000, sticky=- shadow=- json=-\n"
    "fashion added=1 base=relative/fashion dir policy={\"latest\":{\"num_versions\":2}} labels=canary:2,stable:1, "
    "routes=stable:90,canary:10, sticky=X-User-Id shadow=canary json={\"max_error_rate\":0.05,\"window_s\":60}\n"
    "fromcfg added=0 base=- policy=- labels=stable:7, routes= sticky=- shadow=- json=-\n"
    "zeta added=1 base=/models/zeta policy={\"all\":{}} labels= routes= sticky=- shadow=- json=-\n";

/* ---- opening ---- */

Test(admin_state, open_creates_a_wal_file_with_the_pragmas) {
    adm_state *s = open_ok();
    struct stat st;
    cr_assert_eq(stat(g_path, &st), 0, "%s was not created", g_path);
    char buf[64];
    raw_text("PRAGMA journal_mode", buf, sizeof buf);   /* persistent in the file: a fresh connection sees it */
    cr_assert_str_eq(buf, "wal");
    OK(adm_state_put_label(s, "m", "l", 1, E));
    char wal[600];
    snprintf(wal, sizeof wal, "%s-wal", g_path);
    cr_assert_eq(stat(wal, &st), 0, "no %s while open", wal);
    /* the handle's own connection: synchronous FULL (2), foreign keys on, busy timeout */
    char p[256];
    cr_assert_eq(pragma(s, "PRAGMA journal_mode", p, sizeof p, NULL), SRV_OK);
    cr_assert_str_eq(p, "wal");
    cr_assert_eq(pragma(s, "PRAGMA synchronous", p, sizeof p, NULL), SRV_OK);
    cr_assert_str_eq(p, "2");
    cr_assert_eq(pragma(s, "PRAGMA foreign_keys", p, sizeof p, NULL), SRV_OK);
    cr_assert_str_eq(p, "1");
    cr_assert_eq(pragma(s, "PRAGMA busy_timeout", p, sizeof p, NULL), SRV_OK);
    cr_assert_str_eq(p, "5000");
    cr_assert_eq(raw_int("SELECT version FROM schema_version"), ADM_STATE_SCHEMA);
    cr_assert_eq(raw_int("SELECT count(*) FROM schema_version"), 1);
    adm_state_free(&s);
    cr_assert_null(s);
    adm_state_free(&s);   /* no-op */
    adm_state_free(NULL);
    /* a trailing slash names the same file */
    char slash[300];
    snprintf(slash, sizeof slash, "%s/", g_dir);
    srv_error e = {0};
    cr_assert_eq(adm_state_open(slash, &s, &e), SRV_OK, "%s", e.msg);
    expect_dump(s, "m added=0 base=- policy=- labels=l:1, routes= sticky=- shadow=- json=-\n");
    adm_state_free(&s);
}

Test(admin_state, a_missing_dir_or_a_file_as_dir_is_refused_naming_it) {
    char p[400];
    snprintf(p, sizeof p, "%s/nope", g_dir);
    expect_open_fails(p, SRV_NOT_FOUND, p, "does not exist");
    snprintf(p, sizeof p, "%s/nope/deeper", g_dir);
    expect_open_fails(p, SRV_NOT_FOUND, p, NULL);
    snprintf(p, sizeof p, "%s/plain", g_dir);
    write_file(p, "x", 1);
    expect_open_fails(p, SRV_INVALID_ARGUMENT, p, "not a directory");
    expect_open_fails("", SRV_INVALID_ARGUMENT, "empty", NULL);
    /* the state path itself is a directory */
    cr_assert_eq(mkdir(g_path, 0755), 0);
    expect_open_fails(g_dir, SRV_INVALID_ARGUMENT, g_path, "not a regular file");
}

Test(admin_state, a_file_that_is_not_sqlite_is_refused_and_left_alone) {
    char text[4096];
    for (size_t i = 0; i < sizeof text; i++) text[i] = "not a database, just some text\n"[i % 31];
    write_file(g_path, text, sizeof text);
    expect_open_fails(g_dir, SRV_DATA_LOSS, g_path, "not an SQLite database");
    FILE *f = fopen(g_path, "rb");
    char back[sizeof text + 1];
    cr_assert_eq(fread(back, 1, sizeof back, f), sizeof text, "the file changed size");
    fclose(f);
    cr_assert_eq(memcmp(back, text, sizeof text), 0, "the file was changed");
}

Test(admin_state, a_corrupt_file_is_refused_naming_it) {
    adm_state *s = open_ok();
    fill(s);
    for (int i = 0; i < 50; i++) OK(adm_state_add_event(s, "fashion", "promote", "{\"to\":2}", E));
    adm_state_free(&s);   /* checkpoints: everything is in the main file now */
    struct stat st;
    cr_assert_eq(stat(g_path, &st), 0);
    cr_assert_gt(st.st_size, 4096 * 3, "want several pages, got %lld bytes", (long long)st.st_size);
    /* scribble over every page after the first (the schema page survives, the tables' pages do not) */
    int fd = open(g_path, O_WRONLY);
    cr_assert_geq(fd, 0);
    char junk[4096];
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (char)(0xA5 ^ (i * 7));
    for (off_t off = 4096; off < st.st_size; off += 4096) cr_assert_eq(pwrite(fd, junk, sizeof junk, off), 4096);
    close(fd);
    expect_open_fails(g_dir, SRV_DATA_LOSS, g_path, "corrupt");
}

Test(admin_state, another_programs_database_or_a_newer_schema_is_refused) {
    raw_exec("CREATE TABLE accounts (id INTEGER PRIMARY KEY, owner TEXT)");
    expect_open_fails(g_dir, SRV_FAILED_PRECONDITION, g_path, "not tensord's");
    cr_assert_eq(unlink(g_path), 0);

    adm_state *s = open_ok();
    fill(s);
    adm_state_free(&s);
    raw_exec("UPDATE schema_version SET version = 99");
    expect_open_fails(g_dir, SRV_FAILED_PRECONDITION, g_path, "schema version 99");
    raw_exec("UPDATE schema_version SET version = 1; DROP TABLE routes");
    expect_open_fails(g_dir, SRV_DATA_LOSS, g_path, "no table 'routes'");
}

/* Run adm_state_open in a child as an unprivileged user (as root, permission bits would not stop us). */
static srv_code open_as_nobody(const char *dir, char *msg, size_t cap) {
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        srv_error e = {0};
        if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) {
            srv_err(&e, SRV_UNKNOWN, "setuid failed");
        } else {
            adm_state *s = NULL;
            e.code = adm_state_open(dir, &s, &e);
            adm_state_free(&s);
        }
        if (write(fds[1], &e, sizeof e) != (ssize_t)sizeof e) _exit(2);
        _exit(0);
    }
    close(fds[1]);
    srv_error e = {0};
    ssize_t got = read(fds[0], &e, sizeof e);
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    cr_assert_eq(got, (ssize_t)sizeof e, "child died (status %d)", status);
    snprintf(msg, cap, "%s", e.msg);
    return e.code;
}

Test(admin_state, a_read_only_dir_or_file_is_refused_naming_it) {
    cr_assert_eq(chmod(g_dir, 0755), 0);   /* let the unprivileged child in */
    char ro[400], msg[SRV_ERR_MAX];
    snprintf(ro, sizeof ro, "%s/ro", g_dir);
    cr_assert_eq(mkdir(ro, 0555), 0);
    if (geteuid() != 0) cr_assert_eq(chmod(ro, 0555), 0);
    srv_code c = open_as_nobody(ro, msg, sizeof msg);
    if (getenv("SHOW_MSGS")) fprintf(stderr, "read-only dir: %s: %s\n", srv_code_name(c), msg);
    cr_assert_eq(c, SRV_PERMISSION_DENIED, "%s: %s", srv_code_name(c), msg);
    cr_assert_not_null(strstr(msg, ro), "%s", msg);
    cr_assert_not_null(strstr(msg, "not writable"), "%s", msg);

    /* a writable dir, but a state file the user may not write */
    char rw[400];
    snprintf(rw, sizeof rw, "%s/rw", g_dir);
    cr_assert_eq(mkdir(rw, 0777), 0);
    cr_assert_eq(chmod(rw, 0777), 0);
    char f[600];
    snprintf(f, sizeof f, "%s/" ADM_STATE_FILE, rw);
    adm_state *s = NULL;
    srv_error e = {0};
    cr_assert_eq(adm_state_open(rw, &s, &e), SRV_OK, "%s", e.msg);
    adm_state_free(&s);
    cr_assert_eq(chmod(f, 0444), 0);
    c = open_as_nobody(rw, msg, sizeof msg);
    if (getenv("SHOW_MSGS")) fprintf(stderr, "read-only file: %s: %s\n", srv_code_name(c), msg);
    cr_assert_eq(c, SRV_PERMISSION_DENIED, "%s: %s", srv_code_name(c), msg);
    cr_assert_not_null(strstr(msg, f), "%s", msg);
}

/* ---- records ---- */

Test(admin_state, every_record_kind_round_trips) {
    adm_state *s = open_ok();
    expect_dump(s, "");
    adm_model_rec *r = (adm_model_rec *)1;
    int n = -1;
    OK(adm_state_load(s, &r, &n, E));
    cr_assert_eq(n, 0);
    cr_assert_null(r);

    fill(s);
    expect_dump(s, FILLED);

    /* the typed fields, not only their text */
    OK(adm_state_load(s, &r, &n, E));
    cr_assert_eq(n, 4);
    cr_assert_str_eq(r[1].name, "fashion");
    cr_assert_eq(r[1].added, 1);
    cr_assert_eq(r[1].nlabels, 2);
    cr_assert_eq(r[1].label_versions[0], 2);
    cr_assert_eq(r[1].traffic.nroutes, 2);
    cr_assert_eq(r[1].traffic.routes[1].weight, 10);
    cr_assert_null(r[0].base_path);
    cr_assert_null(r[0].traffic.sticky_header);
    for (int i = 0; i < n; i++) adm_model_rec_free(&r[i]);
    free(r);

    /* puts replace: the model's path and policy (labels and traffic stay), a label's version, the whole split */
    OK(adm_state_put_model(s, "fashion", "/new/path", NULL, E));
    OK(adm_state_put_label(s, "fashion", "canary", 3, E));
    adm_route routes[] = {{"stable", 50}, {"canary", 50}, {"shadowed", 0}};
    adm_traffic t = {routes, 3, "", "", NULL};   /* "" sticky and shadow: none */
    OK(adm_state_put_traffic(s, "fashion", &t, E));
    /* a config-file model later added through the API keeps its labels */
    OK(adm_state_put_model(s, "fromcfg", "/models/fromcfg", "{\"specific\":{\"versions\":[1,7]}}", E));
    /* a large version and a label on an added model */
    OK(adm_state_put_label(s, "zeta", "big", INT64_C(1) << 53, E));
    expect_dump(s,
                "cfgtraffic added=0 base=- policy=- labels= routes=b:0,a:1000000, sticky=- shadow=- json=-\n"
                "fashion added=1 base=/new/path policy=- labels=canary:3,stable:1, "
                "routes=stable:50,canary:50,shadowed:0, sticky=- shadow=- json=-\n"
                "fromcfg added=1 base=/models/fromcfg policy={\"specific\":{\"versions\":[1,7]}} labels=stable:7, "
                "routes= sticky=- shadow=- json=-\n"
                "zeta added=1 base=/models/zeta policy={\"all\":{}} labels=big:9007199254740992, routes= sticky=- "
                "shadow=- json=-\n");
    adm_state_free(&s);
}

Test(admin_state, a_restart_sees_everything) {
    adm_state *s = open_ok();
    fill(s);
    OK(adm_state_add_event(s, "fashion", "promote", "{\"label\":\"stable\",\"to\":2}", E));
    adm_state_free(&s);
    for (int round = 0; round < 2; round++) {
        s = open_ok();
        expect_dump(s, FILLED);
        adm_event *ev = NULL;
        int n = 0;
        OK(adm_state_events(s, "fashion", 10, &ev, &n, E));
        cr_assert_eq(n, 1);
        cr_assert_str_eq(ev[0].event, "promote");
        cr_assert_str_eq(ev[0].detail_json, "{\"label\":\"stable\",\"to\":2}");
        adm_events_free(ev, n);
        adm_state_free(&s);
    }
}

Test(admin_state, a_write_survives_the_process_being_killed_right_after) {
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        adm_state *s = NULL;
        if (adm_state_open(g_dir, &s, NULL) != SRV_OK) _exit(3);
        adm_route routes[] = {{"stable", 1}};
        adm_traffic t = {routes, 1, NULL, NULL, NULL};
        if (adm_state_put_label(s, "m", "stable", 4, NULL) != SRV_OK) _exit(4);
        if (adm_state_put_traffic(s, "m", &t, NULL) != SRV_OK) _exit(5);
        raise(SIGKILL);   /* no free, no checkpoint: the writes are only in the WAL */
        _exit(6);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "child status %d", status);
    adm_state *s = open_ok();
    expect_dump(s, "m added=0 base=- policy=- labels=stable:4, routes=stable:1, sticky=- shadow=- json=-\n");
    adm_state_free(&s);
}

Test(admin_state, deletes_cascade_and_empty_config_rows_go) {
    adm_state *s = open_ok();
    fill(s);
    OK(adm_state_add_event(s, "fashion", "rollback", NULL, E));
    OK(adm_state_delete_model(s, "fashion", E));
    expect_dump(s,
                "cfgtraffic added=0 base=- policy=- labels= routes=b:0,a:1000000, sticky=- shadow=- json=-\n"
                "fromcfg added=0 base=- policy=- labels=stable:7, routes= sticky=- shadow=- json=-\n"
                "zeta added=1 base=/models/zeta policy={\"all\":{}} labels= routes= sticky=- shadow=- json=-\n");
    /* on disk, not only in what load shows */
    cr_assert_eq(raw_int("SELECT count(*) FROM labels WHERE model = 'fashion'"), 0);
    cr_assert_eq(raw_int("SELECT count(*) FROM traffic WHERE model = 'fashion'"), 0);
    cr_assert_eq(raw_int("SELECT count(*) FROM routes WHERE model = 'fashion'"), 0);
    /* the history is append-only: it outlives the model */
    cr_assert_eq(raw_int("SELECT count(*) FROM events WHERE model = 'fashion'"), 1);

    srv_error e = {0};
    cr_assert_eq(adm_state_delete_model(s, "fashion", &e), SRV_NOT_FOUND);
    cr_assert_not_null(strstr(e.msg, "'fashion'"), "%s", e.msg);
    cr_assert_not_null(strstr(e.msg, g_path), "%s", e.msg);
    cr_assert_eq(adm_state_delete_label(s, "fromcfg", "canary", &e), SRV_NOT_FOUND);
    cr_assert_not_null(strstr(e.msg, "'canary'"), "%s", e.msg);

    /* the last label of a config-file model, and the traffic of another: their rows go too */
    OK(adm_state_delete_label(s, "fromcfg", "stable", E));
    OK(adm_state_put_traffic(s, "cfgtraffic", NULL, E));
    adm_traffic none = {0};
    OK(adm_state_put_traffic(s, "never-seen", &none, E));   /* clearing nothing is fine */
    expect_dump(s, "zeta added=1 base=/models/zeta policy={\"all\":{}} labels= routes= sticky=- shadow=- json=-\n");
    cr_assert_eq(raw_int("SELECT count(*) FROM models"), 1);
    cr_assert_eq(raw_int("SELECT count(*) FROM routes"), 0);
    /* an added model keeps its row without labels or traffic; deleting it leaves nothing */
    OK(adm_state_put_label(s, "zeta", "l", 1, E));
    OK(adm_state_delete_label(s, "zeta", "l", E));
    OK(adm_state_delete_model(s, "zeta", E));
    expect_dump(s, "");
    adm_state_free(&s);
}

/* A model removed through the admin API is kept as removed (a config-file model stays removed after a restart)
 * until it is added again; its labels and traffic go. */
Test(admin_state, a_removed_model_stays_removed_until_added_again) {
    adm_state *s = open_ok();
    fill(s);
    OK(adm_state_remove_model(s, "fromcfg", E));
    OK(adm_state_remove_model(s, "never-seen", E));
    OK(adm_state_remove_model(s, "never-seen", E)); /* twice is fine */
    adm_state_free(&s);
    s = open_ok();
    char *d = dump(s);
    cr_assert(strstr(d, "fromcfg removed\n") && strstr(d, "never-seen removed\n") && !strstr(d, "fromcfg added"), "%s", d);
    cr_assert(strstr(d, "fashion added=1"), "%s", d);
    free(d);
    cr_assert_eq(raw_int("SELECT count(*) FROM labels WHERE model = 'fromcfg'"), 0);
    OK(adm_state_put_model(s, "fromcfg", "/models/fromcfg", NULL, E));
    d = dump(s);
    cr_assert(!strstr(d, "fromcfg removed") && strstr(d, "fromcfg added=1 base=/models/fromcfg"), "%s", d);
    free(d);
    adm_state_free(&s);
}

/* A file written by schema 1 (no removed, datasets or jobs tables) is migrated to the current schema when opened,
 * its records intact. */
Test(admin_state, a_schema_1_file_is_migrated) {
    adm_state *s = open_ok();
    fill(s);
    adm_state_free(&s);
    raw_exec("DROP TABLE removed; DROP TABLE jobs; DROP TABLE datasets; UPDATE schema_version SET version = 1");
    s = open_ok();
    cr_assert_eq(raw_int("SELECT version FROM schema_version"), ADM_STATE_SCHEMA);
    cr_assert_eq(raw_int("SELECT count(*) FROM sqlite_master WHERE name IN ('removed', 'datasets', 'jobs')"), 3);
    expect_dump(s, FILLED);
    OK(adm_state_remove_model(s, "zeta", E));
    adm_state_free(&s);
    s = open_ok();
    char *d = dump(s);
    cr_assert(strstr(d, "zeta removed\n"), "%s", d);
    free(d);
    adm_state_free(&s);
}

/* ---- failures leave the previous state ---- */

static srv_code apply(adm_state *s, int op, srv_error *e) {
    static adm_route routes[] = {{"stable", 70}, {"canary", 20}, {"extra", 10}};
    static adm_traffic t = {routes, 3, "X-Session", "canary", "{\"enabled\":true}"};
    switch (op) {
    case 0: return adm_state_put_model(s, "newmodel", "/models/new", "{\"all\":{}}", e);
    case 1: return adm_state_put_label(s, "fashion", "canary", 5, e);
    case 2: return adm_state_put_label(s, "brand-new", "stable", 1, e);   /* creates a row too */
    case 3: return adm_state_put_traffic(s, "fashion", &t, e);
    case 4: return adm_state_put_traffic(s, "newcfg", &t, e);             /* creates a row too */
    case 5: return adm_state_delete_label(s, "fromcfg", "stable", e);    /* removes the row too */
    case 6: return adm_state_put_traffic(s, "cfgtraffic", NULL, e);       /* removes the row too */
    case 7: return adm_state_delete_model(s, "fashion", e);
    case 8: return adm_state_add_event(s, "fashion", "auto_rollback", "{\"from\":2,\"to\":1}", e);
    case 9: return adm_state_remove_model(s, "fromcfg", e);               /* its row goes, its name is kept */
    }
    return SRV_UNKNOWN;
}

static long long nevents(adm_state *s) {
    (void)s;
    return raw_int("SELECT count(*) FROM events");
}

Test(admin_state, a_write_that_fails_at_any_statement_leaves_the_previous_state) {
    for (int op = 0; op <= 9; op++) {
        adm_state *s = open_ok();
        fill(s);
        char *before = dump(s);
        long long ev_before = nevents(s);
        int k;
        for (k = 1; k < 64; k++) {
            s->fault_step = k;
            srv_error e = {0};
            srv_code c = apply(s, op, &e);
            if (c == SRV_OK) break;
            cr_assert_eq(s->fault_step, 0, "op %d step %d: failed without the fault (%s)", op, k, e.msg);
            cr_assert_eq(c, SRV_INTERNAL, "op %d step %d: %s", op, k, e.msg);
            cr_assert_not_null(strstr(e.msg, "injected fault"), "op %d step %d: %s", op, k, e.msg);
            cr_assert_not_null(strstr(e.msg, g_path), "op %d step %d: %s", op, k, e.msg);
            char *after = dump(s);
            cr_assert_str_eq(after, before, "op %d, fault at step %d changed the state", op, k);
            free(after);
            cr_assert_eq(nevents(s), ev_before, "op %d step %d", op, k);
        }
        if (getenv("SHOW_MSGS")) fprintf(stderr, "op %d: failed at each of its %d steps, then succeeded\n", op, k - 1);
        cr_assert_gt(s->fault_step, 0, "op %d: succeeded exactly on its fault step %d", op, k);
        cr_assert_geq(k, 3, "op %d: fewer steps than BEGIN + write + COMMIT", op);
        s->fault_step = 0;
        /* and the write itself happened once */
        char *after = dump(s);
        if (op == 8) cr_assert_eq(nevents(s), ev_before + 1);
        else cr_assert_str_neq(after, before, "op %d changed nothing", op);
        free(after);
        free(before);
        adm_state_free(&s);
        cr_assert_eq(unlink(g_path), 0);
    }
}

Test(admin_state, a_refused_traffic_split_leaves_the_previous_one) {
    adm_state *s = open_ok();
    fill(s);
    adm_route bad[] = {{"stable", 50}, {"not/a label", 50}};
    adm_traffic t = {bad, 2, NULL, NULL, NULL};
    srv_error e = {0};
    cr_assert_eq(adm_state_put_traffic(s, "fashion", &t, &e), SRV_INVALID_ARGUMENT);
    cr_assert_not_null(strstr(e.msg, "'not/a label'"), "%s", e.msg);
    expect_dump(s, FILLED);
    adm_state_free(&s);
    s = open_ok();
    expect_dump(s, FILLED);
    adm_state_free(&s);
}

Test(admin_state, bad_names_and_values_are_refused_before_the_file_is_touched) {
    adm_state *s = open_ok();
    struct {
        int kind;
        const char *a, *b, *c;
        int64_t v;
        const char *needle;
    } cases[] = {
        {0, "a b", "/p", NULL, 0, "'a b'"},
        {0, "..", "/p", NULL, 0, "'..'"},
        {0, "", "/p", NULL, 0, "''"},
        {0, NULL, "/p", NULL, 0, "missing"},
        {0, "a/b", "/p", NULL, 0, "'a/b'"},
        {0, "ok", "", NULL, 0, "base_path"},
        {0, "ok", NULL, NULL, 0, "base_path"},
        {0, "ok", "/p", "{not json", 0, "{not json"},
        {0, "ok", "/p", "[1,2]", 0, "not a JSON object"},
        {1, "m", "x y", NULL, 1, "'x y'"},
        {1, "m", "ok", NULL, 0, "version"},
        {1, "m", "ok", NULL, -3, "version"},
        {1, "bad model", "ok", NULL, 1, "'bad model'"},
        {2, "m", "../x", NULL, 0, "'../x'"},
        {3, "m bad", NULL, NULL, 0, "'m bad'"},
        {4, "m", "bad event", NULL, 0, "'bad event'"},
        {4, "m", "promote", "{", 0, "not JSON"},
        {5, "m", NULL, NULL, 0, "at least 1"},
        {6, "m", "canary", NULL, -1, "weight -1"},
        {6, "m", "canary", NULL, 1000001, "weight 1000001"},
        {6, "m", "bad label", NULL, 1, "'bad label'"},
        {7, "m", "X User", NULL, 0, "'X User'"},
        {8, "m", "../shadow", NULL, 0, "'../shadow'"},
        {9, "m", "[1]", NULL, 0, "not a JSON object"},
        {10, "m", NULL, NULL, 0, "twice"},
        {11, "m", NULL, NULL, 0, "routes"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        srv_error e = {0};
        srv_code c = SRV_UNKNOWN;
        adm_route r[2] = {{"stable", 1}, {"canary", 1}};
        adm_traffic t = {r, 1, NULL, NULL, NULL};
        adm_event *ev = NULL;
        int n = 0;
        switch (cases[i].kind) {
        case 0: c = adm_state_put_model(s, cases[i].a, cases[i].b, cases[i].c, &e); break;
        case 1: c = adm_state_put_label(s, cases[i].a, cases[i].b, cases[i].v, &e); break;
        case 2: c = adm_state_delete_label(s, cases[i].a, cases[i].b, &e); break;
        case 3: c = adm_state_delete_model(s, cases[i].a, &e); break;
        case 4: c = adm_state_add_event(s, cases[i].a, cases[i].b, cases[i].c, &e); break;
        case 5: c = adm_state_events(s, cases[i].a, 0, &ev, &n, &e); break;
        case 6:
            r[1].label = (char *)cases[i].b;
            r[1].weight = (int)cases[i].v;
            t.nroutes = 2;
            c = adm_state_put_traffic(s, cases[i].a, &t, &e);
            break;
        case 7: t.sticky_header = (char *)cases[i].b; c = adm_state_put_traffic(s, cases[i].a, &t, &e); break;
        case 8: t.shadow = (char *)cases[i].b; c = adm_state_put_traffic(s, cases[i].a, &t, &e); break;
        case 9: t.json = (char *)cases[i].b; c = adm_state_put_traffic(s, cases[i].a, &t, &e); break;
        case 10: r[1].label = "stable"; t.nroutes = 2; c = adm_state_put_traffic(s, cases[i].a, &t, &e); break;
        case 11: t.nroutes = -1; c = adm_state_put_traffic(s, cases[i].a, &t, &e); break;
        }
        cr_assert_eq(c, SRV_INVALID_ARGUMENT, "case %zu: %s (%s)", i, srv_code_name(c), e.msg);
        cr_assert_not_null(strstr(e.msg, cases[i].needle), "case %zu: '%s' lacks '%s'", i, e.msg, cases[i].needle);
        cr_assert_null(ev);
    }
    cr_assert_eq(raw_int("SELECT (SELECT count(*) FROM models) + (SELECT count(*) FROM labels) + "
                         "(SELECT count(*) FROM traffic) + (SELECT count(*) FROM routes) + "
                         "(SELECT count(*) FROM events)"), 0);
    /* a long name: 255 characters pass, 256 do not */
    char name[300];
    memset(name, 'n', 256);
    name[255] = 0;
    OK(adm_state_put_label(s, name, "l", 1, E));
    name[255] = 'n';
    name[256] = 0;
    srv_error e = {0};
    cr_assert_eq(adm_state_put_label(s, name, "l", 1, &e), SRV_INVALID_ARGUMENT);
    /* no handle (no --state_dir) */
    cr_assert_eq(adm_state_put_label(NULL, "m", "l", 1, &e), SRV_FAILED_PRECONDITION);
    adm_state_free(&s);
}

/* ---- history ---- */

Test(admin_state, events_come_newest_first_with_a_limit) {
    adm_state *s = open_ok();
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t t0 = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    const char *names[] = {"promote", "canary", "auto_rollback", "rollback", "promote"};
    for (int i = 0; i < 5; i++) {
        char detail[64];
        snprintf(detail, sizeof detail, "{\"i\":%d}", i);
        OK(adm_state_add_event(s, "m", names[i], i == 2 ? NULL : detail, E));
        OK(adm_state_add_event(s, "other", "promote", "\"x\"", E));
    }
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t t1 = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    adm_event *ev = NULL;
    int n = 0;
    OK(adm_state_events(s, "m", 3, &ev, &n, E));
    cr_assert_eq(n, 3);
    cr_assert_str_eq(ev[0].event, "promote");
    cr_assert_str_eq(ev[0].detail_json, "{\"i\":4}");
    cr_assert_str_eq(ev[1].event, "rollback");
    cr_assert_str_eq(ev[1].detail_json, "{\"i\":3}");
    cr_assert_str_eq(ev[2].event, "auto_rollback");
    cr_assert_null(ev[2].detail_json);
    for (int i = 0; i < n; i++) {
        cr_assert_geq(ev[i].unix_ms, t0);
        cr_assert_leq(ev[i].unix_ms, t1);
        if (i) cr_assert_geq(ev[i - 1].unix_ms, ev[i].unix_ms);
    }
    adm_events_free(ev, n);
    OK(adm_state_events(s, "m", 100, &ev, &n, E));
    cr_assert_eq(n, 5);
    cr_assert_str_eq(ev[4].detail_json, "{\"i\":0}");
    adm_events_free(ev, n);
    OK(adm_state_events(s, "other", 1, &ev, &n, E));
    cr_assert_eq(n, 1);
    cr_assert_str_eq(ev[0].detail_json, "\"x\"");
    adm_events_free(ev, n);
    ev = (adm_event *)1;
    OK(adm_state_events(s, "nobody", 5, &ev, &n, E));
    cr_assert_eq(n, 0);
    cr_assert_null(ev);
    adm_state_free(&s);
}

/* ---- threads ---- */

typedef struct { adm_state *s; int id; int failures; } worker_arg;

static void *worker(void *p) {
    worker_arg *a = p;
    for (int i = 0; i < 20; i++) {
        char label[32];
        snprintf(label, sizeof label, "t%d-l%d", a->id, i);
        if (adm_state_put_label(a->s, "shared", label, i + 1, NULL) != SRV_OK) a->failures++;
        if (adm_state_add_event(a->s, "shared", "promote", NULL, NULL) != SRV_OK) a->failures++;
        if (i % 5 == 0) {
            adm_model_rec *r = NULL;
            int n = 0;
            if (adm_state_load(a->s, &r, &n, NULL) != SRV_OK) a->failures++;
            for (int k = 0; k < n; k++) adm_model_rec_free(&r[k]);
            free(r);
        }
    }
    return NULL;
}

Test(admin_state, events_beyond_the_kept_number_are_dropped_oldest_first) {
    adm_state *s = open_ok();
    char d[64];
    for (int i = 0; i < ADM_EVENTS_KEEP + 5; i++) {
        snprintf(d, sizeof d, "{\"i\":%d}", i);
        OK(adm_state_add_event(s, "m", "promote", d, E));
    }
    OK(adm_state_add_event(s, "other", "promote", NULL, E));
    cr_assert_eq(raw_int("SELECT count(*) FROM events WHERE model = 'm'"), ADM_EVENTS_KEEP);
    cr_assert_eq(raw_int("SELECT count(*) FROM events WHERE model = 'other'"), 1);
    adm_event *ev = NULL;
    int n = 0;
    OK(adm_state_events(s, "m", ADM_EVENTS_KEEP + 10, &ev, &n, E));
    cr_assert_eq(n, ADM_EVENTS_KEEP);
    snprintf(d, sizeof d, "{\"i\":%d}", ADM_EVENTS_KEEP + 4);
    cr_assert_str_eq(ev[0].detail_json, d);
    cr_assert_str_eq(ev[n - 1].detail_json, "{\"i\":5}");
    adm_events_free(ev, n);
    adm_state_free(&s);
}

Test(admin_state, server_threads_may_share_one_handle) {
    adm_state *s = open_ok();
    enum { NT = 8 };
    pthread_t th[NT];
    worker_arg args[NT];
    for (int i = 0; i < NT; i++) {
        args[i] = (worker_arg){s, i, 0};
        cr_assert_eq(pthread_create(&th[i], NULL, worker, &args[i]), 0);
    }
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        cr_assert_eq(args[i].failures, 0, "thread %d", i);
    }
    adm_model_rec *r = NULL;
    int n = 0;
    OK(adm_state_load(s, &r, &n, E));
    cr_assert_eq(n, 1);
    cr_assert_eq(r[0].nlabels, NT * 20);
    adm_model_rec_free(&r[0]);
    free(r);
    cr_assert_eq(raw_int("SELECT count(*) FROM events"), NT * 20);
    adm_state_free(&s);
}
