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

#include <semaphore.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "rest.h"
#include "srv.h"

struct srv_rest {
    struct MHD_Daemon *d;
    srv_registry *reg;
    srv_metrics *m;
    size_t max_body;
    int64_t timeout_ms;
    int metrics_enabled;
    char *metrics_path;
    atomic_int inflight;
    atomic_int quiescing;
    int limit_active;     /* --rest_api_num_threads > 0: at most that many requests processed at once */
    sem_t active;
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
} srv_rest_req;

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

#endif
