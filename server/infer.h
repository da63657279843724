/* infer.h - one inference request path for every front door (REST's TF Serving and KServe dialects today, gRPC
 * next): select the version, decode against its signature, run it (inline, on the version's batcher, or on the
 * worker pool), encode, record metrics, release the version, and tell the front door. A front door supplies
 * only what differs: its codec (decode, encode) and what to do when the request is over.
 *
 * Also here, because every front door needs them: the worker pool that slow work waits on (threads grow on
 * demand, up to SRV_INFER_MAX_WORKERS) and the list of requests whose reply is still to come, which the drain
 * deadline cuts off (srv_infer_cut_off).
 *
 * Threading: srv_infer_submit runs on the caller's thread until the work may take long; then ops->going_async
 * runs (still on that thread, before any other thread can finish the request), and ops->done later runs on a
 * worker or a batch thread. done runs exactly once per submitted request; after it, the path never touches the
 * front door's state again.
 */
#ifndef SRV_INFER_H
#define SRV_INFER_H

#include <stdatomic.h>

#include "metrics.h"
#include "registry.h"

#define SRV_INFER_MAX_WORKERS 1024
#define SRV_INFER_KEEP_WORKERS 32 /* idle workers kept; more end after SRV_INFER_IDLE_S idle */
#define SRV_INFER_IDLE_S 2
/* Inference expected to take longer than this runs off a thread that must stay responsive (may_block = 0). */
#define SRV_INFER_INLINE_US 1000

typedef struct srv_infer srv_infer;

srv_infer *srv_infer_new(srv_registry *reg, srv_metrics *m);
/* The per-route outcome windows of routed requests (canary.h), for automatic rollback. */
struct srv_canary *srv_infer_canary(srv_infer *inf);
/* Workers finish what they hold, then stop; sets *p NULL. */
void srv_infer_free(srv_infer **p);

/* ---- one request ---- */

typedef struct srv_infer_req {
    const char *model;
    int64_t version;       /* > 0: that version */
    const char *label;     /* non-NULL: by version label (version 0) */
    const char *api;       /* metrics: "predict", "classify", "regress", "infer" */
    const char *protocol;  /* metrics: "rest" or "grpc" (NULL: "rest") */
    int64_t t0_us;         /* arrival (srv_now_us) */
    int64_t deadline_us;   /* 0: none */
    int may_block;         /* 0: the caller's thread must stay responsive; slow work goes elsewhere */
    int routed;            /* set by the path: the traffic router chose label (its outcome feeds the canary window) */
    const atomic_int *cancel; /* may be NULL; non-zero once the client is gone (a cancelled gRPC call): a request
                               * still queued (batcher, worker pool) then ends CANCELLED without running */
} srv_infer_req;

typedef struct srv_infer_ops {
    /* Decode the request for the version that serves it. */
    srv_code (*decode)(void *u, const srv_version_info *info, srv_tensors *in, srv_error *err);
    /* Encode the outputs into the front door's reply (kept in u). */
    srv_code (*encode)(void *u, const srv_version_info *info, const srv_tensors *in, const srv_tensors *out,
                       srv_error *err);
    /* The request is over: SRV_OK after a successful encode, else the error. */
    void (*done)(void *u, srv_code code, const srv_error *err);
    /* The request is about to finish on another thread (optional). */
    void (*going_async)(void *u);
    /* The request's header (gRPC: metadata) `name`, for the router's sticky routes; NULL when absent (optional). */
    const char *(*header)(void *u, const char *name, char *buf, size_t cap);
} srv_infer_ops;

/* The request rq (its strings must stay valid until done) through the path. Returns 1 if done already ran. */
int srv_infer_submit(srv_infer *inf, const srv_infer_req *rq, const srv_infer_ops *ops, void *u);

/* ---- the worker pool and the requests still to answer ---- */

typedef struct srv_work {
    void (*run)(struct srv_work *w);                 /* on a worker */
    void (*cut)(struct srv_work *w, const char *why); /* the drain deadline: answer now (srv_infer_cut_off) */
    struct srv_work *next, *dprev, *dnext;            /* private */
    int tracked;                                      /* private */
} srv_work;

/* Put w on the list the drain deadline cuts off (until srv_infer_untrack). */
void srv_infer_track(srv_infer *inf, srv_work *w);
/* Take w off it: 1 if it was still on it (not cut off), 0 if srv_infer_cut_off already took it. */
int srv_infer_untrack(srv_infer *inf, srv_work *w);
/* Run w->run on a worker. 0, or -1 when no worker thread can take it (the caller runs it itself). */
int srv_infer_queue(srv_infer *inf, srv_work *w);
/* Call cut(why) for every tracked work item (each leaves the list). Returns how many. */
int srv_infer_cut_off(srv_infer *inf, const char *why);

#endif
