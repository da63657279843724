/* admin.h - the admin room: a token-guarded HTTP listener (libmicrohttpd) on --admin_port, loopback by default,
 * that changes what the server serves one model at a time. It reaches the server only through the adm_ops call
 * table that server/ hands it at start-up (server/admin-ops.c), never through server internals.
 *
 * Routes (JSON bodies, {"error": "..."} on failure):
 *   GET    /v1/admin/models                        every model: base path, policy, labels, versions, traffic
 *   POST   /v1/admin/models                        {"name", "base_path", "version_policy"?}: load a model; returns
 *                                                  once a version is AVAILABLE, or with the load error (the model
 *                                                  is then not added)
 *   DELETE /v1/admin/models/{m}                    unload it (each version once its in-flight requests finish)
 *   PUT    /v1/admin/models/{m}/labels/{label}     {"version": n}: set or move a label (a version on disk but not
 *                                                  loaded is loaded first; the label pins it)
 *   GET    /v1/admin/models/{m}/traffic            the model's routes
 *   PUT    /v1/admin/models/{m}/traffic            {"routes": {"stable": 90, "canary": 10}, "sticky_header"?, "shadow"?,
 *                                                  "auto_rollback"?: {"max_error_rate": 0.02, "max_p99_ratio": 2.0,
 *                                                  "window_s": 30, "min_requests": 200}}
 *   POST   /v1/admin/models/{m}:promote            the canary (the one route beside "stable") becomes stable and takes
 *                                                  all traffic
 *   POST   /v1/admin/models/{m}:rollback           drop the canary route; after a promote, stable goes back to the
 *                                                  version it had before
 *   GET    /v1/admin/metrics                       the server's Prometheus text (for the dashboard)
 *   /v1/admin/datasets...                          uploaded training data (datasets.h)
 *   /v1/admin/jobs...                              training jobs (jobs.h)
 *   GET    / (and /index.html)                     the dashboard page, served without a token (it holds no secret;
 *                                                  it asks for the token and sends it with every call)
 * Security: every route but the page needs "Authorization: Bearer <token>" (constant-time comparison; for datasets
 * checked as soon as the headers are in, before an upload's body is read); the listener does not
 * open with a token under 32 characters (128 bits as hex); an address that failed 5 times within a minute gets 429
 * for a doubling back-off (up to 60 s); bodies over 1 MiB are refused with 413 before they are read; names are
 * checked ([A-Za-z0-9_.-], not "." or "..", at most 255 bytes) before anything else.
 */
#ifndef ADM_ADMIN_H
#define ADM_ADMIN_H

#include <stddef.h>
#include <stdint.h>

#include "server/srv.h"

/* A traffic split as the admin API takes it. */
typedef struct adm_split {
    int n;
    char **labels;
    int *weights;
    const char *sticky_header; /* NULL: none */
    const char *shadow;        /* NULL: none */
    int ar_on;                 /* "auto_rollback": {"max_error_rate", "max_p99_ratio", "window_s", "min_requests"} */
    double max_error_rate, max_p99_ratio;
    int window_s, min_requests;
} adm_split;

/* One served version as the job queue needs it (adm_ops.model_info). */
#define ADM_IO_MAX 16
typedef struct adm_io {
    char name[256];             /* the name the model's graph gives it (what training feeds) */
    int dtype;                  /* eng_dtype */
    int ndim;                   /* -1: unknown rank */
    int64_t dims[8];            /* -1: free (the batch) */
} adm_io;
typedef struct adm_model_info {
    char base_path[4096];
    int64_t version;            /* resolved */
    int ninputs, noutputs;
    adm_io inputs[ADM_IO_MAX], outputs[ADM_IO_MAX];
} adm_model_info;

/* The calls server/ hands the admin room. JSON results are malloc'd text. */
typedef struct adm_ops {
    void *ctx;
    srv_code (*list)(void *ctx, char **json, srv_error *err);
    srv_code (*add)(void *ctx, const char *name, const char *base_path, const char *policy_text, srv_error *err);
    srv_code (*remove)(void *ctx, const char *name, srv_error *err);
    srv_code (*set_label)(void *ctx, const char *model, const char *label, int64_t version, srv_error *err);
    srv_code (*get_traffic)(void *ctx, const char *model, char **json, srv_error *err);
    srv_code (*set_traffic)(void *ctx, const char *model, const adm_split *split, srv_error *err);
    srv_code (*promote)(void *ctx, const char *model, srv_error *err);
    srv_code (*rollback)(void *ctx, const char *model, srv_error *err);
    /* version: "latest" (or NULL: the version requests naming none get), a number, or a label; the version must be
     * AVAILABLE. NOT_FOUND / UNAVAILABLE naming the model and version otherwise. */
    srv_code (*model_info)(void *ctx, const char *model, const char *version, adm_model_info *out, srv_error *err);
    /* The server's Prometheus text (what /metrics serves); *text malloc'd. */
    srv_code (*metrics)(void *ctx, char **text, size_t *len, srv_error *err);
} adm_ops;

struct adm_datasets;
struct adm_jobs;
typedef struct adm_opts {
    const char *bind;   /* default 127.0.0.1 */
    int port;           /* > 0 */
    const char *token;  /* required, >= ADM_MIN_TOKEN characters */
    struct adm_datasets *datasets; /* /v1/admin/datasets (datasets.h); NULL: those routes answer 503 */
    struct adm_jobs *jobs;         /* /v1/admin/jobs (jobs.h); NULL: those routes answer 503 */
} adm_opts;
#define ADM_MIN_TOKEN 32
#define ADM_MAX_BODY (1 << 20)

typedef struct adm_server adm_server;

adm_server *adm_start(const adm_opts *o, const adm_ops *ops, srv_error *err);
/* A version_policy JSON object ({"latest": {"num_versions": n}} | {"all": {}} | {"specific": {"versions": [..]}},
 * NULL: none) as a model_version_policy text-format fragment ("" for none). 0, or -1 with err. */
struct cJSON;
int adm_policy_text(const struct cJSON *policy, char *out, size_t cap, srv_error *err);
/* An "auto_rollback" object into split's ar_* fields (NULL / null: off). 0, or -1 with err naming the field. */
int adm_auto_rollback(const struct cJSON *ar, adm_split *split, srv_error *err);
void adm_stop(adm_server **s);

#endif
