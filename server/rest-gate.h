/* rest-gate.h - the REST server's front gate: the listening socket and every connection until its first request
 * head is complete, then the limits that hold while libmicrohttpd serves it.
 *
 * Why it exists: libmicrohttpd 0.9 (Debian 12) restarts its timeout on every byte, bounds nothing per client
 * address, leaves connections unaccepted when its slots are full, and answers oversized heads with HTML. The
 * gate owns the accept loop instead (one thread, epoll) and hands a connection to MHD (MHD_add_connection) only
 * once its first request head has arrived (looked at with MSG_PEEK, so MHD reads the same bytes):
 *  - bind: SO_REUSEADDR only (never SO_REUSEPORT): a port in use fails start-up with "address in use";
 *  - deadline: a request's head and body must arrive within header_timeout_s of the accept (for the first
 *    request) or within idle_timeout_s of the previous response (keep-alive); a connection that sends nothing
 *    for idle_timeout_s is closed as well. Past it: 408 (still in the gate) or the connection is shut down;
 *  - per client address at most per_ip connections. A connection over it waits in one of 16 provisional slots
 *    (the oldest makes way for a newer one); once its head is complete, the oldest connection of that address
 *    that still has not sent its head is dropped (503) to let it in, else it gets 503 with Retry-After. So a
 *    client that sends its requests is served even while trickling connections fill its address's share;
 *  - at conn_limit connections (gate + MHD): drop the oldest connection that has waited over 0.5 s for its
 *    head, else 503 with Retry-After at once. Health requests (srv_rest_is_health) still get one of `reserve`
 *    extra slots;
 *  - first heads larger than max_head bytes get 431 (414 for a request line over 8 KiB), a NUL byte 400,
 *    duplicate Content-Length or Content-Length with Transfer-Encoding 400; all as JSON {"error": ...}, each
 *    followed by a lingering close (shutdown, read and drop for up to 2 s) so the client sees the reply.
 * Thread safety: srv_gate_closed (from MHD's threads) takes the gate's mutex; the per-request hooks are lock-free.
 */
#ifndef SRV_REST_GATE_H
#define SRV_REST_GATE_H

#include <stddef.h>

#include "srv.h"

struct MHD_Daemon;

typedef struct srv_gate_opts {
    const char *host;      /* bind address */
    int port;
    int conn_limit;        /* connections in the gate and in MHD together */
    int reserve;           /* extra slots for health requests at the limit */
    int per_ip;            /* connections per client address */
    int header_timeout_s;  /* first request: head + body within this of the accept */
    int idle_timeout_s;    /* no byte for this long closes; keep-alive: next request within this */
    size_t max_head;       /* largest first request head */
} srv_gate_opts;

typedef struct srv_gate srv_gate;

/* Bind and listen (nothing accepted yet). NULL with err naming the address ("address in use") on failure. */
srv_gate *srv_gate_new(const srv_gate_opts *o, srv_error *err);
/* Start the accept thread, handing connections to d (started with MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC). */
int srv_gate_start(srv_gate *g, struct MHD_Daemon *d, srv_error *err);
/* Stop accepting: close the listening socket. Connections already in the gate may still complete. */
void srv_gate_close_listen(srv_gate *g);
/* Stop the thread and close every connection still in the gate (call before MHD_stop_daemon). */
void srv_gate_stop(srv_gate *g);
void srv_gate_free(srv_gate **g);

/* Hooks from MHD's callbacks, by socket: the connection closed; its request (head and body) is complete; its
 * response was sent (the next request's deadline starts); 1 if it was let in over the limit for health. */
void srv_gate_closed(srv_gate *g, int fd);
void srv_gate_received(srv_gate *g, int fd);
void srv_gate_replied(srv_gate *g, int fd);
int srv_gate_overflow(srv_gate *g, int fd);

/* 1 for the paths a load balancer or orchestrator probes: /v2/health/live|ready, /v2/models/{m}[/versions/
 * {v}]/ready, GET /v1/models/{m}[/versions/{v}|/labels/{l}] (TF Serving's status). */
int srv_rest_is_health(const char *method, const char *path);

/* The framing rule both parsers apply (the gate on a first request's raw head, rest.c on MHD's headers): more
 * than one Content-Length or Transfer-Encoding, or both, is refused. 1 with msg set, else 0. */
int srv_rest_framing_bad(int ncl, int nte, char *msg, size_t n);
/* The 503 message at the connection limit. */
void srv_rest_limit_msg(int conn_limit, char *msg, size_t n);

#endif
