/* state.h - the admin room's persistent state: models added through the admin API, version labels, traffic
 * splits and the rollback history, in one SQLite file, <--state_dir>/tensord-state.sqlite3 (issue 11). After a
 * restart the server reads it back with adm_state_load and comes back with the same models, labels and split.
 *
 * The file: WAL journal, synchronous=FULL (a write is on disk when its call returns, also across a crash of
 * the process or the machine), foreign keys on, busy timeout 5 s, a schema_version table (a file written by a
 * newer schema is refused, never rewritten). Each write below is one transaction: all of it or none of it.
 *
 * What a model row means: `added` 1 when the admin API added the model (base_path, policy_json set); 0 when
 * the row only carries labels or traffic for a model of the config file. Such a row is created by the first
 * label or traffic put on it and removed again with its last label and its traffic. Deleting a model deletes
 * its labels and traffic; its history stays (the newest ADM_EVENTS_KEEP events per model are kept).
 *
 * Validation happens before the file is touched: model, label, shadow and event names with srv_name_valid,
 * route weights 0..1000000, label versions > 0, sticky headers [A-Za-z0-9_-]+, JSON texts (at most 64 KiB)
 * parsed; a refusal is INVALID_ARGUMENT naming the value. Errors from the file name it and what was being done.
 *
 * Threads: every call takes the handle's mutex, so server threads may share one handle; adm_state_free must
 * not run concurrently with any other call. Nothing here exits or aborts.
 */
#ifndef ADM_STATE_H
#define ADM_STATE_H

#include <stdint.h>

#include "../server/srv.h"

#define ADM_STATE_FILE "tensord-state.sqlite3"
#define ADM_STATE_SCHEMA 3   /* the schema this build writes and reads (an older file is migrated when opened); a file
                              * with a newer one is refused */
#define ADM_WEIGHT_MAX 1000000
#define ADM_JSON_MAX 65536
#define ADM_ROUTES_MAX 1024
#define ADM_EVENTS_KEEP 1000 /* events kept per model: adding one drops the oldest beyond these */

typedef struct adm_state adm_state;

/* Open (create if missing) dir/tensord-state.sqlite3 and check it (quick_check, schema version). dir must exist
 * and be a writable directory. NOT_FOUND: no such dir; INVALID_ARGUMENT: not a directory, or the state path is
 * not a regular file; PERMISSION_DENIED: dir or file not writable; DATA_LOSS: not an SQLite database, or
 * corrupt; FAILED_PRECONDITION: a newer schema, another program's database, no WAL on this file system. Every
 * message names the directory or the file. *out is NULL on failure. */
srv_code adm_state_open(const char *dir, adm_state **out, srv_error *err);
/* Close the file (checkpointing the WAL) and free the handle; sets *s NULL. NULL or *s NULL: no-op. */
void adm_state_free(adm_state **s);

typedef struct adm_route { char *label; int weight; } adm_route;
typedef struct adm_traffic {
    adm_route *routes; int nroutes;   /* in the order given; labels distinct; at most ADM_ROUTES_MAX */
    char *sticky_header;   /* NULL: none ("" too, as in the config file; load gives NULL) */
    char *shadow;          /* NULL: none (likewise "") */
    char *json;            /* the auto_rollback settings as given, JSON text or NULL */
} adm_traffic;
typedef struct adm_model_rec {
    char *name; char *base_path;      /* base_path as given; NULL when !added */
    char *policy_json;     /* e.g. {"latest":{"num_versions":1}} | {"all":{}} | {"specific":{"versions":[1,2]}};
                            * NULL: the server's default policy (or !added) */
    char **label_names; int64_t *label_versions; int nlabels;   /* ordered by label name */
    adm_traffic traffic;   /* nroutes 0: none */
    int added;             /* 1: added through the admin API (0: only labels/traffic on a model from the config file) */
    int removed;           /* 1: removed through the admin API (adm_state_remove_model): nothing else is set; a model of
                            * the config file of that name is not served */
} adm_model_rec;
void adm_model_rec_free(adm_model_rec *r);   /* frees contents, leaves *r zeroed */

/* Add the model, or replace its base_path and policy (its labels and traffic stay); added becomes 1.
 * base_path must be non-empty; policy_json NULL or a JSON object. */
srv_code adm_state_put_model(adm_state *s, const char *name, const char *base_path, const char *policy_json, srv_error *err);
/* Delete the model's row with its labels and traffic. NOT_FOUND when there is no row. */
srv_code adm_state_delete_model(adm_state *s, const char *name, srv_error *err);
/* The model was removed through the admin API: its row (labels, traffic) goes, and its name is kept as removed,
 * so that a model of the config file of that name stays removed after a restart, until adm_state_put_model adds
 * it again. One transaction. */
srv_code adm_state_remove_model(adm_state *s, const char *name, srv_error *err);
/* Set (insert or move) a label; creates an added=0 row for a model not in the file. */
srv_code adm_state_put_label(adm_state *s, const char *model, const char *label, int64_t version, srv_error *err);
/* NOT_FOUND when the model has no such label. */
srv_code adm_state_delete_label(adm_state *s, const char *model, const char *label, srv_error *err);
/* Replace the model's traffic with t (copied); NULL t or 0 routes: clear it (sticky, shadow and json too).
 * Route labels need not be stored labels here (they may come from the config file). */
srv_code adm_state_put_traffic(adm_state *s, const char *model, const adm_traffic *t, srv_error *err);

/* Rollback history: a log of events per model, the newest ADM_EVENTS_KEEP kept ("promote", "rollback", "auto_rollback", ...; any
 * srv_name_valid word), stamped with the wall clock. detail_json: NULL or JSON text. The model need not have a row. */
srv_code adm_state_add_event(adm_state *s, const char *model, const char *event, const char *detail_json, srv_error *err);
typedef struct adm_event { int64_t unix_ms; char *event; char *detail_json; } adm_event;
/* The last n (>= 1) events of model, newest first (in the order they were added, whatever the clock did).
 * *out NULL when *count is 0; caller frees with adm_events_free. */
srv_code adm_state_events(adm_state *s, const char *model, int n, adm_event **out, int *count, srv_error *err);
void adm_events_free(adm_event *e, int n);

/* Everything, from one consistent snapshot, ordered by model name (bytewise; labels by name): caller frees each
 * rec with adm_model_rec_free, then the array. *out NULL when *n is 0. */
srv_code adm_state_load(adm_state *s, adm_model_rec **out, int *n, srv_error *err);

#endif
