/* rest.h - the REST front end on libmicrohttpd: TF Serving's /v1 surface, KServe v2 (/v2), Prometheus
 * metrics. Limits: body size (413), JSON depth (400), connection limit, per-connection idle timeout,
 * request deadline (504). Quiesce stops accepting connections; in-flight requests finish.
 */
#ifndef SRV_REST_H
#define SRV_REST_H

#include "metrics.h"
#include "infer.h"
#include "registry.h"

typedef struct srv_rest_opts {
    const char *host;          /* bind address, default "0.0.0.0" */
    int port;                  /* 8501 */
    int nthreads;              /* HTTP polling threads (epoll), <= 0: 4 per core; slow work goes to a worker pool */
    size_t max_body_bytes;     /* default 64 MiB */
    int connection_limit;      /* default 2048 */
    int connection_timeout_s;  /* idle connection timeout, default 30 */
    int64_t request_timeout_ms;/* --rest_api_timeout_in_ms; 0: none */
    int metrics_enabled;       /* Prometheus endpoint on */
    const char *metrics_path;  /* "/monitoring/prometheus/metrics" (and /metrics always when enabled) */
    int header_timeout_s;      /* a request's headers and body must arrive within this, default 10 */
    int per_ip_connection_limit; /* connections from one client address, default 256 */
    int explicit_control;      /* --model_control_mode=explicit: /v2/repository/models/{m}/load|unload on */
    const char *admin_token;   /* NULL: none; else the repository calls need "Authorization: Bearer <it>" */
} srv_rest_opts;

typedef struct srv_rest srv_rest;

/* inf: the request path shared with the gRPC front door (borrowed; the caller frees it with srv_infer_free
 * after srv_rest_quiesce and before srv_rest_stop). */
srv_rest *srv_rest_start(const srv_rest_opts *o, srv_registry *reg, srv_metrics *m, srv_infer *inf, srv_error *err);
/* Stop accepting new connections (existing ones may finish their requests). */
void srv_rest_quiesce(srv_rest *r);
/* Requests being processed right now. */
int srv_rest_inflight(srv_rest *r);
/* The drain deadline's cut-off (srv_infer_cut_off on the shared path) answers suspended requests 503 with its
 * reason; of those, how many replies are not sent yet. */
int srv_rest_cut_unsent(srv_rest *r);
/* Stop and free; sets *r NULL. */
void srv_rest_stop(srv_rest **r);

#endif
