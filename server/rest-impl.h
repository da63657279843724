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

#include "infer.h"
#include "rest.h"
#include "srv.h"

#include <pthread.h>

typedef struct srv_rest_conn srv_rest_conn;

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
    srv_infer *inf;         /* the request path, its worker pool and the requests still to answer (infer.h);
                             * shared with the gRPC front door (borrowed) */
    struct srv_gate *gate;  /* the accept loop and connection limits (rest-gate.c) */
    int conn_limit;
    atomic_int cut_unsent;  /* requests answered by srv_rest_cut_off whose 503 is not sent yet */
};

typedef struct srv_reply {
    int status;
    char *body;           /* malloc'd; may be NULL for an empty body */
    size_t len;
    const char *ctype;    /* static string */
    size_t header_len;    /* > 0: Inference-Header-Content-Length */
    const char *allow;    /* for 405: the Allow header */
    int pending;          /* set by a handler: the reply comes later, through srv_rest_async_reply */
    int64_t model_version;/* > 0: the version that answered an inference (X-Model-Version) */
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
    srv_rest_conn *cn;    /* the request's connection state (srv_rest_async) */
    int may_block;        /* 1 on a worker thread; 0 on an HTTP polling thread, which slow work must leave */
    struct srv_rest_job **defer; /* non-NULL on a polling thread: a handler may hand its work to a worker */
} srv_rest_req;

/* A handler's work that must not run on a polling thread (a model load): the handler stores a job in *q->defer
 * and returns with the reply empty; a worker calls run, which fills the reply and frees the job. */
typedef struct srv_rest_job {
    void (*run)(struct srv_rest_job *job, srv_reply *o);
} srv_rest_job;

/* Inference through the shared path (infer.h): a handler whose srv_infer_submit went asynchronous calls
 * srv_rest_async from its going_async (the connection is suspended; idempotent) and sets o->pending; its done
 * then calls srv_rest_async_reply with the reply, from any thread. */
void srv_rest_async(srv_rest_conn *cn);
void srv_rest_async_reply(srv_rest_conn *cn, srv_reply *o);

/* A request header of the connection's current request (NULL when absent): the router's sticky header. */
const char *srv_rest_header(srv_rest_conn *cn, const char *name);
/* srv_infer_ops.header for a handler whose state starts with its srv_rest_req. */
const char *srv_rest_infer_header(void *u, const char *name, char *buf, size_t cap);

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
