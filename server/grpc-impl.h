/* grpc-impl.h - private to server/grpc*.c: the server's state, one call, the method table, and the helpers
 * the service files (grpc-tfs.c, grpc-kserve.c) use to decode a request and answer a call.
 *
 * Contract of a handler: it gets the call and its request bytes (valid only while it runs), decodes with
 * srv_grpc_unpack, and answers exactly once with srv_grpc_reply (from any thread, now or later). Work that may
 * block (a model load) goes to the worker pool with srv_grpc_defer. Metrics are recorded by the handler (the
 * request path does it for inference).
 */
#ifndef SRV_GRPC_IMPL_H
#define SRV_GRPC_IMPL_H

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>
#include <stdatomic.h>

#include "grpc.h"
#include "pbcheck.h"
#include "srv.h"

typedef struct srv_grpc_call srv_grpc_call;
typedef void (*srv_grpc_handler)(srv_grpc_call *c, const uint8_t *msg, size_t len);

typedef struct srv_grpc_method {
    const char *path;       /* "/tensorflow.serving.PredictionService/Predict" */
    srv_grpc_handler fn;
    int streaming;          /* server streaming (Health/Watch): fn keeps the stream with srv_grpc_watch; the
                             * core still reads the one request message */
} srv_grpc_method;

/* The method tables of the service files. */
extern const srv_grpc_method srv_grpc_tfs_methods[];
extern const int srv_grpc_tfs_nmethods;
extern const srv_grpc_method srv_grpc_kserve_methods[];
extern const int srv_grpc_kserve_nmethods;

typedef struct srv_grpc_tag {
    int kind;
    srv_grpc_call *c;
} srv_grpc_tag;

struct srv_grpc {
    grpc_server *server;
    grpc_completion_queue **cqs;
    int ncq;
    pthread_t *threads;
    int nthreads_started;
    const srv_grpc_method **methods; /* every served method */
    void **handles;                  /* grpc_server_register_method per method */
    int nmethods;
    srv_registry *reg;
    srv_metrics *m;
    srv_infer *inf;
    size_t max_recv;
    int explicit_control;
    char *admin_token;
    int64_t default_timeout_ms;
    atomic_int inflight;
    atomic_int quiescing;            /* draining: new calls UNAVAILABLE, health NOT_SERVING */
    atomic_int stopping;             /* srv_grpc_stop: no more requested calls */
    grpc_completion_queue *shutdown_cq;
    pthread_mutex_t wmu;             /* health watches */
    pthread_cond_t wcv;
    srv_grpc_call *watches;
    pthread_t wthread;
    int wthread_on, wstop;
};

struct srv_grpc_call {
    srv_grpc *g;
    int method;                 /* index in g->methods; -1: an unknown method (answered UNIMPLEMENTED) */
    int cq;
    grpc_call *call;
    gpr_timespec deadline;
    grpc_metadata_array md;
    grpc_call_details details;  /* unknown methods only */
    grpc_byte_buffer *payload;
    grpc_slice msg;             /* the request bytes while a worker decodes them (large requests) */
    int cancelled;              /* RECV_CLOSE_ON_SERVER's out argument */
    atomic_int gone;            /* the client cancelled or the deadline passed: the request path drops it */
    atomic_int refs;            /* the close op, the reply (or the stream), sends in flight */
    atomic_int answered;        /* srv_grpc_reply ran (or the drain cut it off) */
    atomic_int cut_done;        /* the drain's cut ran for this call */
    atomic_int close_started;   /* RECV_CLOSE_ON_SERVER is on its way (alone, or in the send batch) */
    int counted;                /* in g->inflight */
    int64_t t0_us, deadline_us;
    srv_grpc_tag t_new, t_close, t_send, t_msg;
    grpc_byte_buffer *send_bb;
    grpc_slice details_slice;
    int has_details;
    srv_work w;                 /* the drain's cut-off list, and srv_grpc_defer */
    void (*deferred)(srv_grpc_call *c);
    void *u;                    /* the handler's state */
    /* Health/Watch */
    char *watch_service;
    int watch_status, watch_sending, watch_closed;
    struct srv_grpc_call *wnext;
};

/* Answer the call: code SRV_OK with resp (packed here), else the status and message. Exactly once; a second
 * call (the drain cut the call off first) is ignored. Any thread. */
void srv_grpc_reply(srv_grpc_call *c, srv_code code, const char *msg, const ProtobufCMessage *resp);
static inline void srv_grpc_reply_err(srv_grpc_call *c, const srv_error *e) {
    srv_grpc_reply(c, e->code == SRV_OK ? SRV_INTERNAL : e->code, e->msg, NULL);
}
/* The same with the message already packed (srv_grpc_pack; bb is taken, NULL for none). */
void srv_grpc_reply_bytes(srv_grpc_call *c, srv_code code, const char *msg, grpc_byte_buffer *bb);
/* resp packed into a byte buffer for srv_grpc_reply_bytes; NULL with err set (out of memory). */
grpc_byte_buffer *srv_grpc_pack(const ProtobufCMessage *resp, srv_error *err);
/* The most memory a request's decoded message may take (srv_pb_check): 4 x the receive limit. */
static inline size_t srv_grpc_decode_limit(const srv_grpc *g) { return g->max_recv * 4 + (1 << 20); }
/* Record a non-inference call in metrics (api "metadata", "status", ...): model only when it is configured or a
 * version served (version > 0); the request path records inference itself. */
void srv_grpc_record(srv_grpc_call *c, const char *model, int64_t version, const char *api, srv_code code);
/* The handler's request goes on on another thread (infer ops' going_async): watch for a cancel from now on. */
void srv_grpc_going_async(srv_grpc_call *c);
/* The call's metadata for an HTTP-style header name (any case): the router's sticky header. */
const char *srv_grpc_header(srv_grpc_call *c, const char *name, char *buf, size_t cap);
/* Run fn(c) on a worker (work that may block); fn must reply. */
void srv_grpc_defer(srv_grpc_call *c, void (*fn)(srv_grpc_call *c));
/* The call's metadata value for key (lowercase), NUL-terminated into buf, or NULL. */
const char *srv_grpc_metadata(const srv_grpc_call *c, const char *key, char *buf, size_t cap);
/* Repository calls with an admin token configured: 1 if "authorization: Bearer <token>" matches, else answers
 * UNAUTHENTICATED and returns 0. */
int srv_grpc_authorized(srv_grpc_call *c);
/* A health watch (grpc-health in grpc.c): keep the stream, send status now and whenever it changes. */
void srv_grpc_watch(srv_grpc_call *c, const char *service);
/* The health status of a service name (grpc.health.v1 numbering; 3 SERVICE_UNKNOWN). */
int srv_grpc_health(srv_grpc *g, const char *service);

#endif
