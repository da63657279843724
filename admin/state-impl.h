/* state-impl.h - private to the admin state store's files: state.c (the file, the schema, models, labels, traffic,
 * events), state-datasets.c (uploaded datasets) and state-jobs.c (training jobs). Each public call of any of them
 * holds s->mu for its whole length and runs one transaction (adm_st_begin .. adm_st_end); statements of the other
 * files are cached in s->ext, slots 0..31 for datasets and 32..63 for jobs, and reset by adm_st_end.
 */
#ifndef ADM_STATE_IMPL_H
#define ADM_STATE_IMPL_H

#include <pthread.h>
#include <sqlite3.h>
#include <stdint.h>

#include "state.h"

#define ADM_FAULT (-1)      /* adm_st_step's result for an injected fault (tests) */
#define ADM_EXT_STMTS 64
#define ADM_SLOT_DATASETS 0 /* state-datasets.c: slots 0..31 */
#define ADM_SLOT_JOBS 32    /* state-jobs.c: slots 32..63 */

struct adm_state {
    pthread_mutex_t mu;        /* held by every public call for its whole length */
    sqlite3 *db;
    char *path;                /* <dir>/tensord-state.sqlite3, as messages name it */
    sqlite3_stmt *st[32];      /* state.c's statements, prepared on first use */
    sqlite3_stmt *ext[ADM_EXT_STMTS]; /* the other files' statements (adm_st_prepare) */
    int fault_step;            /* tests: > 0 makes the fault_step-th statement step from now fail (then 0) */
};

/* BEGIN IMMEDIATE (write) or DEFERRED; adm_st_end commits when c is SRV_OK, else rolls back; returns the outcome. */
srv_code adm_st_begin(adm_state *s, int write, const char *what, srv_error *err);
srv_code adm_st_end(adm_state *s, srv_code c, const char *what, srv_error *err);
/* The statement cached in ext[slot] (prepared from the constant sql on first use), reset, bindings cleared. */
srv_code adm_st_prepare(adm_state *s, int slot, const char *sql, sqlite3_stmt **q, const char *what, srv_error *err);
int adm_st_step(adm_state *s, sqlite3_stmt *q);                                     /* sqlite3_step, with faults */
srv_code adm_st_exec(adm_state *s, sqlite3_stmt *q, const char *what, srv_error *err); /* no rows expected */
srv_code adm_st_fail(adm_state *s, int rc, srv_error *err, const char *what); /* err from SQLite's rc, naming the file */
srv_code adm_st_oom(adm_state *s, srv_error *err, const char *what);
int adm_st_bind_text(sqlite3_stmt *q, int i, const char *v);  /* NULL binds NULL */
int adm_st_col_dup(sqlite3_stmt *q, int i, char **dst);      /* text column copy (NULL for NULL); -1 on OOM */
srv_code adm_st_check_handle(adm_state *s, srv_error *err);
srv_code adm_st_check_name(const char *kind, const char *name, srv_error *err);
srv_code adm_st_check_json(const char *kind, const char *what, const char *text, int want_object, srv_error *err);
int64_t adm_st_now_ms(void);

#endif
