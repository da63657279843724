/* datasets.h - uploaded training datasets (issue 12): the admin routes under /v1/admin/datasets, their storage
 * under <state_dir>/datasets/, and their records in the state store (state-datasets.h).
 *
 * Routes (admin.c checks the bearer token when the request's headers are in, before any body byte is read, then
 * hands every call of the request to adm_datasets_access):
 *   POST   /v1/admin/datasets?name=N&format=idx|npz|npy|csv|jsonl|tfrecord
 *            the file as the streamed body (any Content-Length up to --max_upload_bytes, or chunked; whatever its
 *            Content-Type, except multipart/form-data), or multipart/form-data: for format=idx the parts "images" and
 *            "labels" (an IDX pair, raw or gzip), for npy one part per column (the part's name is the column's; "y"
 *            and "labels" become "label"), for the others one part. Streamed to files in a temp dir under
 *            <state_dir>/datasets/ (never held in memory), fsynced; the format's own reader (engine/data) runs over
 *            them; then the dir is renamed to <state_dir>/datasets/<N>/ and recorded. Stored names: images-idx-ubyte,
 *            labels-idx-ubyte, data.npz, x.npy (raw body) or <part>.npy, data.csv, data.jsonl, data.tfrecord, each
 *            with ".gz" added when its bytes are gzip (every reader inflates those). 201 with the record; its
 *            "sha256" is that of the bytes received (multipart: the images part, then the labels part; for npy the
 *            parts in the order sent), "bytes" their count.
 *            Refusals: 400 bad name/format/part, a part missing, a malformed multipart body, or a malformed file (the
 *            reader's message, naming the file and the record or line); 409 a dataset of that name exists; 413 over
 *            --max_upload_bytes (by Content-Length before any body byte is read; a chunked body as it grows past it)
 *            or over --dataset_quota_bytes in all. Nothing is left on disk after any refusal, nor when the client goes
 *            away mid-upload.
 *   GET    /v1/admin/datasets           {"datasets": [record...]}, newest first
 *   GET    /v1/admin/datasets/{id}      one record; 404 naming it
 *   DELETE /v1/admin/datasets/{id}      its record, then its files: {"dataset": id, "deleted": true}; 404; 409 naming
 *                                       the jobs while a QUEUED or RUNNING job has it as dataset or val_dataset
 * Other methods: 405 with Allow. A record: {"dataset", "format", "records", "bytes", "sha256", "columns": [{"name",
 * "dtype", "shape" (per example)}], "files": [stored names, in load order], "created_ms"}. Errors: {"error": "..."}
 * naming the dataset, the format or the part; 500 for what the disk or the state file did.
 * Names (query and path): srv_name_valid, checked with the value's length so a NUL (%00) is refused; note that
 * the admin daemon unescapes URLs with adm_url_unescape, which keeps %00 as text, so such a name is refused.
 */
#ifndef ADM_DATASETS_H
#define ADM_DATASETS_H

#include <stddef.h>
#include <stdint.h>

#include <microhttpd.h>

#include "state.h"

typedef struct adm_datasets adm_datasets;

typedef struct adm_datasets_opts {
    const char *state_dir;        /* datasets live in <state_dir>/datasets/ (created when missing) */
    adm_state *state;             /* the records (the server's store; not owned) */
    int64_t max_upload_bytes;     /* one upload; <= 0: 1 GiB */
    int64_t quota_bytes;          /* all datasets; <= 0: 10 GiB */
} adm_datasets_opts;

/* NULL with err when the directory cannot be made. Temp files left by an earlier process are removed. */
adm_datasets *adm_datasets_new(const adm_datasets_opts *o, srv_error *err);
void adm_datasets_free(adm_datasets **d);

/* libmicrohttpd's access handler for a request to /v1/admin/datasets[/...], already authenticated: called first
 * with *ctx NULL (headers in, no body yet), then with each piece of the body, then once with *upload_size 0 (the
 * body is complete), when it queues the reply. *ctx is the request's own state; adm_datasets_done frees it when
 * the request ends (also when the client went away mid-upload, which must leave nothing on disk). Thread-safe:
 * the admin listener runs a thread per connection. */
enum MHD_Result adm_datasets_access(adm_datasets *d, struct MHD_Connection *c, const char *url, const char *method,
                                    const char *upload, size_t *upload_size, void **ctx);
void adm_datasets_done(adm_datasets *d, void *ctx);

/* An MHD_OPTION_UNESCAPE_CALLBACK for the admin daemon: libmicrohttpd's percent-decoding, except that %00 stays the
 * three characters "%00". The default decodes it to a NUL that silently cuts the path short ("/datasets/fm%00x" would
 * name "fm"); kept literal, it fails srv_name_valid and the route refuses it, naming the NUL. */
size_t adm_url_unescape(void *cls, struct MHD_Connection *c, char *s);

/* ---- below the HTTP layer: what adm_datasets_access drives, callable without a connection (the unit tests do) ----
 *
 * An upload: adm_upload_new checks the name and format (INVALID_ARGUMENT naming them), that no dataset of the name
 * is recorded (ALREADY_EXISTS) and makes its temp dir <state_dir>/datasets/.tmp-XXXXXX/. Then, per file,
 * adm_upload_part (part NULL: the raw body, the format's one file; else the multipart part's name: "images" and
 * "labels" for idx, the column name for npy, any one part for the others) and adm_upload_write with its bytes, in
 * order. adm_upload_finish fsyncs, runs the format's reader, renames the dir into place and records it; *out gets
 * the record (caller frees with adm_dataset_rec_free). Refusals: INVALID_ARGUMENT (bad or missing part, malformed
 * file: the reader's message, naming the file and record), RESOURCE_EXHAUSTED (over max_upload_bytes or the quota:
 * 413), ALREADY_EXISTS. After any refusal, and after adm_upload_free of an unfinished upload, nothing of it is left
 * on disk. adm_upload_free may run after finish (a no-op on disk then). One thread uses an upload at a time. */
typedef struct adm_upload adm_upload;
srv_code adm_upload_new(adm_datasets *d, const char *name, const char *format, adm_upload **out, srv_error *err);
srv_code adm_upload_part(adm_upload *u, const char *part, srv_error *err);
srv_code adm_upload_write(adm_upload *u, const void *buf, size_t n, srv_error *err);
struct adm_dataset_rec;
srv_code adm_upload_finish(adm_upload *u, struct adm_dataset_rec *out, srv_error *err);
void adm_upload_free(adm_upload **u);

/* {"datasets": [record...]} newest first / one record, as malloc'd JSON text. NOT_FOUND naming the dataset. */
srv_code adm_datasets_list_json(adm_datasets *d, char **json, srv_error *err);
srv_code adm_datasets_get_json(adm_datasets *d, const char *id, char **json, srv_error *err);
/* Its record, then its files. NOT_FOUND; ABORTED naming the QUEUED or RUNNING jobs that use it (nothing removed). */
srv_code adm_datasets_delete(adm_datasets *d, const char *id, srv_error *err);

/* For the job queue: a dataset's stored files (absolute paths, in the order engine/data's eng_dataset_load takes
 * them) and its columns. NOT_FOUND naming the dataset. Free with adm_dataset_files_free. */
typedef struct adm_dataset_files {
    char **files;
    int nfiles;
    int64_t records;
    char *columns_json;           /* [{"name": "x", "dtype": "float32", "shape": [28, 28]}, ...] per example */
} adm_dataset_files;
srv_code adm_datasets_files(adm_datasets *d, const char *id, adm_dataset_files *out, srv_error *err);
void adm_dataset_files_free(adm_dataset_files *f);

#endif
