/* rest-impl.h - private to server/rest*.c: the REST server's state, one request's reply, and the route
 * handlers for TF Serving's /v1 (rest-tfs.c) and KServe v2 (rest-kserve.c).
 *
 * Contract of a handler: given the method, the (already %-decoded, query-less) path and the whole body, it
 * fills a srv_reply (status, malloc'd body, content type) and records the request in metrics. It returns 0
 * when the path is not one of its routes. Every registry reference it acquires is released before it
 * returns, on every path.
 */
#ifndef SRV_REST_IMPL_H
#define SRV_REST_IMPL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "rest.h"
#include "srv.h"

#include <pthread.h>

typedef struct srv_rest_conn srv_rest_conn;

/* Requests that may take a while (a large body, a version that is slow or batching) run on a pool of worker
 * threads while their connection is suspended, so they never hold up the other connections of an HTTP
 * polling thread; the pool grows on demand up to max threads (batching needs many waiting at once). */
typedef struct srv_rest_pool {
    pthread_mutex_t mu;
    pthread_cond_t work, idle;
    srv_rest_conn *head, *tail;
    int queued, nthreads, nidle, max, stopping;
} srv_rest_pool;

struct srv_rest {
    struct MHD_Daemon *d;
    srv_registry *reg;
    srv_metrics *m;
    size_t max_body;
    int64_t timeout_ms;
    int metrics_enabled;
    char *metrics_path;
    int explicit_control;   /* Triton's --model_control_mode=explicit */
    char *admin_token;      /* NULL: none configured */
    atomic_int inflight;
    atomic_int quiescing;
    srv_rest_pool pool;
    struct srv_gate *gate;  /* the accept loop and connection limits (rest-gate.c) */
    int conn_limit;
    pthread_mutex_t dmu;    /* guards deferred and each deferred request's cut flag */
    srv_rest_conn *deferred; /* requests whose work runs on a worker or a batcher */
    atomic_int cut_unsent;  /* requests answered by srv_rest_cut_off whose 503 is not sent yet */
};

typedef struct srv_reply {
    int status;
    char *body;           /* malloc'd; may be NULL for an empty body */
    size_t len;
    const char *ctype;    /* static string */
    size_t header_len;    /* > 0: Inference-Header-Content-Length */
    const char *allow;    /* for 405: the Allow header */
} srv_reply;

/* Request context given to the handlers. */
typedef struct srv_rest_req {
    srv_rest *r;
    const char *method;
    const char *path;
    const char *body;
    size_t len;
    int64_t t0_us;        /* arrival (srv_now_us) */
    int64_t deadline_us;  /* 0: none */
    const char *header_len; /* Inference-Header-Content-Length value or NULL */
    const char *authorization; /* Authorization header or NULL */
    struct srv_rest_job **defer; /* non-NULL: the handler may hand back the rest of its work (see below) */
} srv_rest_req;

/* The rest of a request that a handler chose not to run on the HTTP polling thread (srv_rest_quick says no):
 * the handler leaves the reply empty, stores a job in *q->defer and returns; a worker thread later calls
 * run, which fills the reply, records metrics, releases everything the job holds and frees it. The request
 * (q's strings and body) stays valid until then. */
typedef struct srv_rest_job {
    void (*run)(struct srv_rest_job *job, srv_reply *o);
    /* Optional, tried first (the connection is already suspended, and o/complete/carg are set): hand the work to
     * the version's batcher and return 1 without waiting; the batch worker then fills *o, frees the job and calls
     * complete(carg), which resumes the connection. 0: not taken (the job is untouched; run goes to the pool). */
    int (*start)(struct srv_rest_job *job);
    srv_reply *o;
    void (*complete)(void *carg);
    void *carg;
} srv_rest_job;

/* 1 if inference on v for in may run on the polling thread (cheap enough; see srv_version_quick), or the
 * handler cannot defer. */
int srv_rest_quick(const srv_rest_req *q, srv_version *v, const srv_tensors *in);

/* {"error": msg} with the HTTP status of code (or `status` when > 0). */
void srv_reply_error(srv_reply *o, int status, const char *msg);
void srv_reply_code(srv_reply *o, const srv_error *err);
/* Take b's text as an application/json body with this status (500 on OOM). */
struct srv_buf;
void srv_reply_buf(srv_reply *o, int status, struct srv_buf *b);
void srv_reply_text(srv_reply *o, int status, char *text, size_t len, const char *ctype);

/* Plain positive decimal version (1..10^18); -1 otherwise. */
int64_t srv_rest_version(const char *s);
/* Split path (after a prefix) on '/' into at most max segments copied into segs (each < 256 bytes).
 * Returns the count, or -1 if there are more segments, an empty one, or one too long. */
int srv_rest_split(const char *path, char segs[][256], int max);

int srv_rest_tfs(const srv_rest_req *q, srv_reply *o);
int srv_rest_kserve(const srv_rest_req *q, srv_reply *o);
/* Triton's model repository extension: /v2/repository/index and /v2/repository/models/{m}/load|unload
 * (rest-repo.c). */
int srv_rest_repo(const srv_rest_req *q, srv_reply *o);

#endif
