/* state-datasets.h - the records of uploaded datasets (issue 12) in the admin state store (state.h): the
 * `datasets` table of schema 3. The files themselves live under <state_dir>/<dir>/ and are datasets.c's business;
 * a record only names them.
 *
 * A record: id (the dataset's name, srv_name_valid), format (idx|npz|npy|csv|jsonl|tfrecord), dir (relative to
 * the state dir: "datasets/<id>"), files_json (a JSON array of file names in dir, in the order engine/data's
 * eng_dataset_load takes them), records (examples, >= 1), bytes (the stored files' size, >= 0), sha256 (64 lower-case
 * hex digits), columns_json (a JSON array, [{"name", "dtype", "shape"}] per example; may be NULL), created_ms (wall
 * clock, set by the put).
 *
 * Every call holds the store's mutex for its whole length and is one transaction (state-impl.h); arguments are
 * checked before the file is touched. Thread-safe as state.h is. Nothing here exits or aborts.
 */
#ifndef ADM_STATE_DATASETS_H
#define ADM_STATE_DATASETS_H

#include <stdint.h>

#include "state.h"

typedef struct adm_dataset_rec {
    char *id;
    char *format;
    char *dir;            /* relative to the state dir */
    char *files_json;     /* ["images-idx-ubyte.gz", "labels-idx-ubyte.gz"] */
    int64_t records;
    int64_t bytes;
    char *sha256;
    char *columns_json;   /* NULL: unknown */
    int64_t created_ms;
} adm_dataset_rec;
void adm_dataset_rec_free(adm_dataset_rec *r);   /* frees contents, leaves *r zeroed; NULL: no-op */

/* Record a dataset; created_ms is set to now (r->created_ms is ignored). ALREADY_EXISTS when a dataset of that id
 * is recorded; RESOURCE_EXHAUSTED when quota_bytes > 0 and the recorded bytes plus r->bytes would exceed it (the
 * check and the insert are one transaction, so two puts never overrun the quota together). INVALID_ARGUMENT for a
 * bad id, format, count, digest or JSON. *created_ms_out (may be NULL) gets the stamp written. */
srv_code adm_state_dataset_put(adm_state *s, const adm_dataset_rec *r, int64_t quota_bytes, int64_t *created_ms_out,
                               srv_error *err);
/* The record of id into *out (caller frees with adm_dataset_rec_free). NOT_FOUND naming the dataset. */
srv_code adm_state_dataset_get(adm_state *s, const char *id, adm_dataset_rec *out, srv_error *err);
/* Every record, newest first (created_ms, then insertion order). *out NULL when *n is 0; caller frees each record,
 * then the array (adm_dataset_recs_free does both). */
srv_code adm_state_datasets_list(adm_state *s, adm_dataset_rec **out, int *n, srv_error *err);
void adm_dataset_recs_free(adm_dataset_rec *r, int n);
/* Sum of the recorded bytes (0 when there are none). */
srv_code adm_state_datasets_bytes(adm_state *s, int64_t *total, srv_error *err);
/* Delete the record of id. NOT_FOUND naming the dataset; ABORTED (the message names the jobs, "job(s) 3, 7") while a
 * job in state QUEUED or RUNNING has dataset = id or val_dataset = id: the check and the delete are one
 * transaction, so a job cannot start using it in between. */
srv_code adm_state_dataset_delete(adm_state *s, const char *id, srv_error *err);

#endif
