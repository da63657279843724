/* grpc.c - the gRPC server on gRPC C core (see grpc.h): listening, completion-queue threads, the life of a
 * call, replies, the drain, and grpc.health.v1.Health.
 *
 * Threads: one completion queue per thread (nthreads, default half the cores, 1 below 4). Each queue keeps
 * SRV_GRPC_PENDING requested calls per registered method (grpc_server_request_registered_call, payload read
 * by the core) plus a few for unknown methods (grpc_server_request_call, answered UNIMPLEMENTED); a call that
 * arrives is replaced by a new request before it is handled, so the pool never runs dry.
 * A call: NEW (request bytes in hand) -> RECV_CLOSE_ON_SERVER, started as soon as the call goes past the queue
 * thread (batcher, worker, stream) so that a cancel or an expired deadline is seen while the request waits (it
 * sets `gone`, which the batcher, the instance wait and the worker pool read), else sent with the reply ->
 * the method's handler decodes and answers with srv_grpc_reply, on this thread or later on a worker or a
 * batch thread -> SEND_INITIAL_METADATA + SEND_MESSAGE + SEND_STATUS_FROM_SERVER -> freed when both the close
 * and the send completed (refs: close op, the handler's ownership, each send in flight).
 * Drain: quiesce answers new calls UNAVAILABLE (the port stays open until stop) and health NOT_SERVING; serve.c
 * waits for srv_grpc_inflight to reach 0 (the drain deadline's cut-off answers what is left UNAVAILABLE, via
 * the request path's tracked list, which every call joins while its handler owns it).
 * Health: Check answers from srv_grpc_health; Watch keeps the stream on g->watches and a thread sends the
 * status again whenever it changes (checked every 100 ms).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>
#include <netdb.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "grpc-impl.h"
#include "health.pb-c.h"
#include "log.h"
#include "textproto.h"

#define SRV_GRPC_PENDING 8       /* requested calls per method per completion queue */
#define SRV_GRPC_PENDING_UNKNOWN 2
#define SRV_GRPC_WATCH_MS 100
#define SRV_GRPC_INLINE_BYTES (256 << 10) /* larger requests are decoded on a worker, not a queue thread */

enum { TAG_NEW = 1, TAG_CLOSE, TAG_SEND, TAG_MSG, TAG_SHUTDOWN };

/* ---- calls ---- */

static void call_free(srv_grpc_call *c) {
    if (c->call) grpc_call_unref(c->call);
    grpc_metadata_array_destroy(&c->md);
    if (c->method < 0) grpc_call_details_destroy(&c->details);
    if (c->payload) grpc_byte_buffer_destroy(c->payload);
    if (c->send_bb) grpc_byte_buffer_destroy(c->send_bb);
    if (c->has_details) grpc_slice_unref(c->details_slice);
    free(c->watch_service);
    free(c);
}

static void call_unref(srv_grpc_call *c) {
    if (atomic_fetch_sub(&c->refs, 1) == 1) call_free(c);
}

/* Ask the core for the next call of method m (-1: unknown methods) on queue q. */
static void request_call(srv_grpc *g, int m, int q) {
    if (atomic_load(&g->stopping)) return;
    srv_grpc_call *c = calloc(1, sizeof *c);
    if (!c) return;
    c->g = g;
    c->method = m;
    c->cq = q;
    c->t_new = (srv_grpc_tag){TAG_NEW, c};
    c->t_close = (srv_grpc_tag){TAG_CLOSE, c};
    c->t_send = (srv_grpc_tag){TAG_SEND, c};
    c->t_msg = (srv_grpc_tag){TAG_MSG, c};
    grpc_metadata_array_init(&c->md);
    grpc_call_error e;
    if (m >= 0) {
        e = grpc_server_request_registered_call(g->server, g->handles[m], &c->call, &c->deadline, &c->md,
                                                &c->payload, g->cqs[q], g->cqs[q], &c->t_new);
    } else {
        grpc_call_details_init(&c->details);
        e = grpc_server_request_call(g->server, &c->call, &c->details, &c->md, g->cqs[q], g->cqs[q], &c->t_new);
    }
    if (e != GRPC_CALL_OK) call_free(c);
}

/* Start watching for the call's close (RECV_CLOSE_ON_SERVER: a cancel or an expired deadline sets `gone`), once:
 * when the call goes on past its queue thread's turn (batcher, worker, a stream). A call answered right away
 * gets the op in its send batch instead, which saves a batch and a completion per call. */
static void call_watch_close(srv_grpc_call *c) {
    if (atomic_exchange(&c->close_started, 1)) return;
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->cancelled;
    atomic_fetch_add(&c->refs, 1);
    if (grpc_call_start_batch(c->call, &op, 1, &c->t_close, NULL) != GRPC_CALL_OK) call_unref(c);
}

void srv_grpc_going_async(srv_grpc_call *c) { call_watch_close(c); }

const char *srv_grpc_header(srv_grpc_call *c, const char *name, char *buf, size_t cap) {
    char key[256];
    size_t n = 0;
    for (; name[n] && n + 1 < sizeof key; n++) key[n] = (char)(name[n] >= 'A' && name[n] <= 'Z' ? name[n] + 32 : name[n]);
    key[n] = '\0';
    return srv_grpc_metadata(c, key, buf, cap); /* gRPC metadata keys are lowercase */
}

/* Start the send batch: initial metadata, the message (if bb), the status, and the close unless it is watched
 * already. Holds a ref until it completes. */
static void call_send(srv_grpc_call *c, srv_code code, const char *msg, grpc_byte_buffer *bb) {
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    int n = 0;
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (bb) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = bb;
    }
    c->send_bb = bb;
    c->details_slice = grpc_slice_from_copied_string(msg ? msg : "");
    c->has_details = 1;
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = (grpc_status_code)code;
    ops[n++].data.send_status_from_server.status_details = code == SRV_OK ? NULL : &c->details_slice;
    if (!atomic_exchange(&c->close_started, 1)) {
        ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
        ops[n++].data.recv_close_on_server.cancelled = &c->cancelled;
    }
    atomic_fetch_add(&c->refs, 1);
    if (grpc_call_start_batch(c->call, ops, (size_t)n, &c->t_send, NULL) != GRPC_CALL_OK) {
        if (c->counted) atomic_fetch_sub(&c->g->inflight, 1), c->counted = 0;
        call_unref(c);
    }
}

static void free_with_len(void *p, size_t n) {
    (void)n;
    free(p);
}

grpc_byte_buffer *srv_grpc_pack(const ProtobufCMessage *resp, srv_error *err) {
    size_t n = protobuf_c_message_get_packed_size(resp);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) {
        srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory encoding the reply");
        return NULL;
    }
    protobuf_c_message_pack(resp, buf);
    grpc_slice s = grpc_slice_new_with_len(buf, n, free_with_len);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

/* The drain deadline reached a call still owned by its handler: answer it now. */
static void call_cut(srv_work *w, const char *why) {
    srv_grpc_call *c = (srv_grpc_call *)((char *)w - offsetof(srv_grpc_call, w));
    if (!atomic_exchange(&c->answered, 1)) call_send(c, SRV_UNAVAILABLE, why, NULL);
    atomic_store(&c->cut_done, 1);
}

/* Take the call off the drain's list; when the cut-off took it first, wait until its cut ran (it uses c). */
static void call_untrack(srv_grpc_call *c) {
    if (!srv_infer_untrack(c->g->inf, &c->w))
        while (!atomic_load(&c->cut_done)) sched_yield();
}

void srv_grpc_reply_bytes(srv_grpc_call *c, srv_code code, const char *msg, grpc_byte_buffer *bb) {
    call_untrack(c);
    if (code != SRV_OK && bb) grpc_byte_buffer_destroy(bb), bb = NULL;
    if (!atomic_exchange(&c->answered, 1)) call_send(c, code, code == SRV_OK ? NULL : msg, bb);
    else if (bb) grpc_byte_buffer_destroy(bb);
    call_unref(c); /* the handler's ownership */
}

void srv_grpc_reply(srv_grpc_call *c, srv_code code, const char *msg, const ProtobufCMessage *resp) {
    srv_error err = {0};
    grpc_byte_buffer *bb = NULL;
    if (code == SRV_OK && resp && !atomic_load(&c->answered) && !(bb = srv_grpc_pack(resp, &err)))
        code = err.code, msg = err.msg;
    srv_grpc_reply_bytes(c, code, msg, bb);
}

void srv_grpc_record(srv_grpc_call *c, const char *model, int64_t version, const char *api, srv_code code) {
    const char *m = srv_registry_metrics_model(c->g->reg, model, version > 0, code);
    srv_metrics_request(c->g->m, m, version, NULL, api, "grpc", code, srv_now_us() - c->t0_us);
}

static void call_work_run(srv_work *w) {
    srv_grpc_call *c = (srv_grpc_call *)((char *)w - offsetof(srv_grpc_call, w));
    c->deferred(c);
}

void srv_grpc_defer(srv_grpc_call *c, void (*fn)(srv_grpc_call *c)) {
    call_watch_close(c);
    c->deferred = fn;
    c->w.run = call_work_run;
    if (srv_infer_queue(c->g->inf, &c->w) != 0) fn(c);
}

const char *srv_grpc_metadata(const srv_grpc_call *c, const char *key, char *buf, size_t cap) {
    for (size_t i = 0; i < c->md.count; i++) {
        const grpc_slice *k = &c->md.metadata[i].key;
        size_t kl = GRPC_SLICE_LENGTH(*k);
        if (kl == strlen(key) && memcmp(GRPC_SLICE_START_PTR(*k), key, kl) == 0) {
            const grpc_slice *v = &c->md.metadata[i].value;
            size_t vl = GRPC_SLICE_LENGTH(*v);
            if (vl >= cap) vl = cap - 1;
            memcpy(buf, GRPC_SLICE_START_PTR(*v), vl);
            buf[vl] = '\0';
            return buf;
        }
    }
    return NULL;
}

int srv_grpc_authorized(srv_grpc_call *c) {
    if (!c->g->admin_token) return 1;
    char buf[1024];
    const char *h = srv_grpc_metadata(c, "authorization", buf, sizeof buf);
    if (srv_bearer_ok(h, c->g->admin_token)) return 1;
    char msg[256];
    snprintf(msg, sizeof msg, "repository calls need the admin token: send metadata 'authorization: Bearer <token>' "
             "(%s)", h ? "the token given is wrong" : "none was given");
    srv_grpc_reply(c, SRV_UNAUTHENTICATED, msg, NULL);
    return 0;
}

static void call_handle_deferred(srv_grpc_call *c) {
    grpc_slice s = c->msg;
    c->msg = grpc_empty_slice();
    c->g->methods[c->method]->fn(c, GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s));
    grpc_slice_unref(s);
}

/* A call arrived: watch for its close, then hand it to its method. */
static void call_start(srv_grpc_call *c) {
    srv_grpc *g = c->g;
    atomic_store(&c->refs, 1); /* the handler's; the close op and each send batch add theirs */
    c->t0_us = srv_now_us();
    gpr_timespec now = gpr_now(GPR_CLOCK_MONOTONIC);
    gpr_timespec dl = gpr_convert_clock_type(c->deadline, GPR_CLOCK_MONOTONIC);
    if (gpr_time_cmp(dl, gpr_inf_future(GPR_CLOCK_MONOTONIC)) < 0) {
        gpr_timespec left = gpr_time_sub(dl, now);
        int64_t us = (int64_t)left.tv_sec * 1000000 + left.tv_nsec / 1000;
        c->deadline_us = c->t0_us + (us > 1 ? us : 1);
    } else if (g->default_timeout_ms > 0) {
        c->deadline_us = c->t0_us + g->default_timeout_ms * 1000;
    }
    c->w.cut = call_cut;
    if (c->method < 0) {
        char msg[600];
        size_t ml = GRPC_SLICE_LENGTH(c->details.method);
        snprintf(msg, sizeof msg, "unknown method %.*s: tensord serves tensorflow.serving.PredictionService, "
                 "tensorflow.serving.ModelService, inference.GRPCInferenceService and grpc.health.v1.Health",
                 (int)(ml > 400 ? 400 : ml), (const char *)GRPC_SLICE_START_PTR(c->details.method));
        srv_infer_track(g->inf, &c->w);
        srv_grpc_reply(c, SRV_UNIMPLEMENTED, msg, NULL);
        return;
    }
    const srv_grpc_method *m = g->methods[c->method];
    srv_infer_track(g->inf, &c->w);
    if (atomic_load(&g->quiescing) && strncmp(m->path, "/grpc.health.v1.Health/", 23) != 0) {
        srv_grpc_reply(c, SRV_UNAVAILABLE, "the server is shutting down", NULL);
        return;
    }
    if (!c->payload) {
        srv_grpc_reply(c, SRV_INVALID_ARGUMENT, "the call carries no request message", NULL);
        return;
    }
    grpc_byte_buffer_reader rd;
    if (!grpc_byte_buffer_reader_init(&rd, c->payload)) {
        srv_grpc_reply(c, SRV_INVALID_ARGUMENT, "the request message could not be decompressed", NULL);
        return;
    }
    grpc_slice s = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
    grpc_byte_buffer_destroy(c->payload);
    c->payload = NULL;
    if (m->streaming && c->counted) atomic_fetch_sub(&g->inflight, 1), c->counted = 0;
    if (m->streaming) call_watch_close(c); /* a stream ends when the client closes it */
    if (GRPC_SLICE_LENGTH(s) > SRV_GRPC_INLINE_BYTES && !m->streaming) {
        c->msg = s; /* decoding it takes a while: not on the queue thread */
        srv_grpc_defer(c, call_handle_deferred);
        return;
    }
    m->fn(c, GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s));
    grpc_slice_unref(s);
}

static void watch_closed(srv_grpc_call *c);

typedef struct cq_boot {
    srv_grpc *g;
    int q;
} cq_boot;

static void *cq_thread(void *arg) {
    srv_grpc *g = ((cq_boot *)arg)->g;
    int q = ((cq_boot *)arg)->q;
    free(arg);
    grpc_completion_queue *cq = g->cqs[q];
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
        if (ev.type != GRPC_OP_COMPLETE) continue;
        srv_grpc_tag *t = ev.tag;
        srv_grpc_call *c = t->c;
        switch (t->kind) {
        case TAG_NEW:
            if (!ev.success) { /* the server is shutting down */
                call_free(c);
                break;
            }
            if (!atomic_load(&g->quiescing)) { /* before anything else: the drain must see this call */
                atomic_fetch_add(&g->inflight, 1);
                c->counted = 1;
            }
            request_call(g, c->method, q);
            call_start(c);
            break;
        case TAG_CLOSE:
            /* the core cancels a call at its deadline: tell that from a client's cancel (its timer may run a
             * little ahead of ours) */
            if (c->cancelled)
                atomic_store(&c->gone, c->deadline_us > 0 && srv_now_us() >= c->deadline_us - 20000 ? SRV_CANCEL_DEADLINE
                                                                                                    : SRV_CANCEL_CLIENT);
            if (c->method >= 0 && g->methods[c->method]->streaming) watch_closed(c);
            call_unref(c);
            break;
        case TAG_SEND:
            if (c->counted) atomic_fetch_sub(&g->inflight, 1), c->counted = 0;
            call_unref(c);
            break;
        case TAG_MSG:
            pthread_mutex_lock(&g->wmu);
            c->watch_sending = 0;
            if (c->send_bb) grpc_byte_buffer_destroy(c->send_bb), c->send_bb = NULL;
            pthread_mutex_unlock(&g->wmu);
            call_unref(c);
            break;
        default:
            break;
        }
    }
    return NULL;
}

/* ---- health ---- */

int srv_grpc_health(srv_grpc *g, const char *service) {
    static const char *const services[] = {"tensorflow.serving.PredictionService", "tensorflow.serving.ModelService",
                                           "inference.GRPCInferenceService", "grpc.health.v1.Health", NULL};
    int known = !service || !*service;
    for (const char *const *s = services; !known && *s; s++) known = strcmp(service, *s) == 0;
    if (known) {
        if (atomic_load(&g->quiescing)) return GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
        return srv_registry_ready(g->reg) ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                                          : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
    }
    if (!srv_name_valid(service) || !srv_registry_has_model(g->reg, service))
        return GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN;
    if (atomic_load(&g->quiescing)) return GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
    srv_error err = {0};
    srv_version *v = srv_registry_acquire(g->reg, service, 0, NULL, &err);
    if (!v) return GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
    srv_version_release(v);
    return GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
}

/* Send the watch's status (lock held; one message in flight at a time). */
static void watch_send(srv_grpc_call *c, int status) {
    Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    r.status = status;
    srv_error err = {0};
    grpc_byte_buffer *bb = srv_grpc_pack(&r.base, &err);
    if (!bb) return;
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    int n = 0;
    if (c->watch_status < 0) ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = bb;
    c->send_bb = bb;
    c->watch_sending = 1;
    c->watch_status = status;
    atomic_fetch_add(&c->refs, 1);
    if (grpc_call_start_batch(c->call, ops, (size_t)n, &c->t_msg, NULL) != GRPC_CALL_OK) {
        c->watch_sending = 0;
        grpc_byte_buffer_destroy(bb);
        c->send_bb = NULL;
        atomic_fetch_sub(&c->refs, 1);
    }
}

void srv_grpc_watch(srv_grpc_call *c, const char *service) {
    srv_grpc *g = c->g;
    c->watch_service = strdup(service ? service : "");
    c->watch_status = -1;
    pthread_mutex_lock(&g->wmu);
    if (!c->watch_closed) {
        c->wnext = g->watches;
        g->watches = c;
        watch_send(c, srv_grpc_health(g, c->watch_service));
    }
    pthread_mutex_unlock(&g->wmu);
}

static void watch_closed(srv_grpc_call *c) {
    srv_grpc *g = c->g;
    int owned = 0;
    pthread_mutex_lock(&g->wmu);
    c->watch_closed = 1;
    for (srv_grpc_call **pp = &g->watches; *pp; pp = &(*pp)->wnext)
        if (*pp == c) {
            *pp = c->wnext;
            owned = 1;
            break;
        }
    pthread_mutex_unlock(&g->wmu);
    if (owned) {
        call_untrack(c);
        atomic_store(&c->answered, 1);
        call_unref(c); /* the stream's ownership */
    }
}

static void *watch_thread(void *arg) {
    srv_grpc *g = arg;
    pthread_mutex_lock(&g->wmu);
    while (!g->wstop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += SRV_GRPC_WATCH_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&g->wcv, &g->wmu, &ts);
        for (srv_grpc_call *c = g->watches; c && !g->wstop; c = c->wnext) {
            if (c->watch_sending) continue;
            int st = srv_grpc_health(g, c->watch_service);
            if (st != c->watch_status) watch_send(c, st);
        }
    }
    pthread_mutex_unlock(&g->wmu);
    return NULL;
}

/* ---- the health service ---- */

/* The request of Check and Watch; NULL after answering the call with the error. */
static Grpc__Health__V1__HealthCheckRequest *health_request(srv_grpc_call *c, const uint8_t *msg, size_t len) {
    srv_error err = {0};
    Grpc__Health__V1__HealthCheckRequest *rq = (Grpc__Health__V1__HealthCheckRequest *)srv_grpc_unpack(
        &grpc__health__v1__health_check_request__descriptor, msg, len, 1 << 20, &err);
    if (!rq) srv_grpc_reply_err(c, &err);
    return rq;
}

static void health_check(srv_grpc_call *c, const uint8_t *msg, size_t len) {
    Grpc__Health__V1__HealthCheckRequest *rq = health_request(c, msg, len);
    if (!rq) return;
    int st = srv_grpc_health(c->g, rq->service);
    if (st == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN) {
        char m[400];
        snprintf(m, sizeof m, "unknown service '%.200s': ask for \"\" (the server), a gRPC service tensord serves, or "
                 "a configured model's name", rq->service);
        srv_grpc_reply(c, SRV_NOT_FOUND, m, NULL);
    } else {
        Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
        r.status = st;
        srv_grpc_reply(c, SRV_OK, NULL, &r.base);
    }
    protobuf_c_message_free_unpacked(&rq->base, NULL);
}

static void health_watch(srv_grpc_call *c, const uint8_t *msg, size_t len) {
    Grpc__Health__V1__HealthCheckRequest *rq = health_request(c, msg, len);
    if (!rq) return;
    srv_grpc_watch(c, rq->service);
    protobuf_c_message_free_unpacked(&rq->base, NULL);
}

static const srv_grpc_method srv_grpc_health_methods[] = {
    {"/grpc.health.v1.Health/Check", health_check, 0},
    {"/grpc.health.v1.Health/Watch", health_watch, 1},
};

/* ---- TLS ---- */

static char *read_pem(const srv_tp *cfg, const char *field) {
    const char *s = srv_tp_str(cfg, field);
    return s && *s ? strdup(s) : NULL;
}

/* TF Serving's --ssl_config_file: SSLConfig { server_key, server_cert, custom_ca, client_verify } in text format
 * (the PEM texts inline, as TF Serving has them). */
static grpc_server_credentials *tls_credentials(const char *path, srv_error *err) {
    srv_tp *cfg = NULL;
    if (srv_tp_parse_file(path, &cfg, err) != SRV_OK) return NULL;
    char *key = read_pem(cfg, "server_key"), *cert = read_pem(cfg, "server_cert"), *ca = read_pem(cfg, "custom_ca");
    int verify = 0;
    grpc_server_credentials *cr = NULL;
    if (srv_tp_bool(cfg, "client_verify", &verify, err) == -2) {
        /* err names the field */
    } else if (!key || !cert) {
        srv_err(err, SRV_INVALID_ARGUMENT, "--ssl_config_file %s: server_key and server_cert (PEM text) are required",
                path);
    } else if (verify && !ca) {
        srv_err(err, SRV_INVALID_ARGUMENT, "--ssl_config_file %s: client_verify needs custom_ca (the client CA, PEM)",
                path);
    } else {
        grpc_ssl_pem_key_cert_pair pair = {key, cert};
        cr = grpc_ssl_server_credentials_create_ex(
            ca, &pair, 1,
            verify ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
            NULL);
        if (!cr) srv_err(err, SRV_INVALID_ARGUMENT, "--ssl_config_file %s: the key or certificate was refused", path);
    }
    free(key);
    free(cert);
    free(ca);
    srv_tp_free(&cfg);
    return cr;
}

/* ---- life cycle ---- */

/* Can host:port be bound? Gives the reason the core would not (it only says that it failed). */
static int probe_listen(const char *host, int port, srv_error *err) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &ai);
    if (rc != 0) {
        srv_err(err, SRV_INVALID_ARGUMENT, "cannot listen on %s:%d: %s", host, port, gai_strerror(rc));
        return -1;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM, 0), one = 1, ok = -1;
    if (fd >= 0) {
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0) ok = 0;
        else srv_err(err, SRV_UNAVAILABLE, "cannot listen on %s:%d: %s (%s)", host, port,
                     errno == EADDRINUSE ? "address in use" : "bind failed", strerror(errno));
        close(fd);
    }
    freeaddrinfo(ai);
    return ok;
}

srv_grpc *srv_grpc_start(const srv_grpc_opts *o, srv_registry *reg, srv_metrics *m, srv_infer *inf, srv_error *err) {
    const char *host = o->host && *o->host ? o->host : "0.0.0.0";
    if (o->port <= 0 || o->port > 65535) {
        srv_err(err, SRV_INVALID_ARGUMENT, "bad gRPC port %d", o->port);
        return NULL;
    }
    if (probe_listen(host, o->port, err) != 0) return NULL;
    grpc_server_credentials *creds = NULL;
    if (o->ssl_config_file && *o->ssl_config_file) {
        grpc_init();
        creds = tls_credentials(o->ssl_config_file, err);
        if (!creds) {
            grpc_shutdown();
            return NULL;
        }
    } else {
        grpc_init();
        creds = grpc_insecure_server_credentials_create();
    }
    srv_grpc *g = calloc(1, sizeof *g);
    if (!g) {
        grpc_server_credentials_release(creds);
        grpc_shutdown();
        srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    g->reg = reg;
    g->m = m;
    g->inf = inf;
    g->max_recv = o->max_receive_bytes > 0 ? o->max_receive_bytes : (size_t)64 << 20;
    if (g->max_recv > INT32_MAX) g->max_recv = INT32_MAX;
    g->explicit_control = o->explicit_control;
    g->admin_token = o->admin_token ? strdup(o->admin_token) : NULL;
    g->default_timeout_ms = o->default_timeout_ms;
    pthread_mutex_init(&g->wmu, NULL);
    pthread_cond_init(&g->wcv, NULL);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    /* Half the cores: a queue thread decodes, answers quick requests inline and drives gRPC's I/O; more threads
     * than that contend with the inference threads and the core's own (measured: 2 threads on 2 cores cost ~1.5x
     * the CPU per call of 1) */
    g->ncq = o->nthreads > 0 ? o->nthreads : ncpu >= 4 ? (int)(ncpu / 2) : 1;
    if (g->ncq > 64) g->ncq = 64;

    grpc_arg args[4];
    memset(args, 0, sizeof args);
    args[0].type = GRPC_ARG_INTEGER, args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, args[0].value.integer = (int)g->max_recv;
    args[1].type = GRPC_ARG_INTEGER, args[1].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, args[1].value.integer = -1;
    args[2].type = GRPC_ARG_INTEGER, args[2].key = GRPC_ARG_ALLOW_REUSEPORT, args[2].value.integer = 0;
    args[3].type = GRPC_ARG_STRING, args[3].key = GRPC_ARG_PRIMARY_USER_AGENT_STRING, args[3].value.string = "tensord";
    grpc_channel_args ca = {3, args};
    g->server = grpc_server_create(&ca, NULL);
    g->cqs = calloc((size_t)g->ncq, sizeof *g->cqs);
    g->threads = calloc((size_t)g->ncq, sizeof *g->threads);
    int nm = srv_grpc_tfs_nmethods + srv_grpc_kserve_nmethods + 2;
    g->methods = calloc((size_t)nm, sizeof *g->methods);
    g->handles = calloc((size_t)nm, sizeof *g->handles);
    if (!g->server || !g->cqs || !g->threads || !g->methods || !g->handles) goto oom;
    for (int i = 0; i < srv_grpc_tfs_nmethods; i++) g->methods[g->nmethods++] = &srv_grpc_tfs_methods[i];
    for (int i = 0; i < srv_grpc_kserve_nmethods; i++) g->methods[g->nmethods++] = &srv_grpc_kserve_methods[i];
    for (int i = 0; i < 2; i++) g->methods[g->nmethods++] = &srv_grpc_health_methods[i];
    for (int i = 0; i < g->nmethods; i++)
        g->handles[i] = grpc_server_register_method(g->server, g->methods[i]->path, NULL,
                                                    GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
    for (int q = 0; q < g->ncq; q++) {
        g->cqs[q] = grpc_completion_queue_create_for_next(NULL);
        grpc_server_register_completion_queue(g->server, g->cqs[q], NULL);
    }
    g->shutdown_cq = grpc_completion_queue_create_for_pluck(NULL);
    char addr[300];
    snprintf(addr, sizeof addr, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, o->port);
    int bound = grpc_server_add_http2_port(g->server, addr, creds);
    grpc_server_credentials_release(creds);
    creds = NULL;
    if (bound <= 0) {
        srv_err(err, SRV_UNAVAILABLE, "cannot listen on %s (gRPC could not open the port)", addr);
        goto fail;
    }
    grpc_server_start(g->server);
    for (int q = 0; q < g->ncq; q++) {
        for (int i = 0; i < g->nmethods; i++)
            for (int k = 0; k < SRV_GRPC_PENDING; k++) request_call(g, i, q);
        for (int k = 0; k < SRV_GRPC_PENDING_UNKNOWN; k++) request_call(g, -1, q);
    }
    for (int q = 0; q < g->ncq; q++) {
        cq_boot *boot = malloc(sizeof *boot);
        if (!boot) goto oom;
        *boot = (cq_boot){g, q};
        if (pthread_create(&g->threads[q], NULL, cq_thread, boot) != 0) {
            free(boot);
            srv_err(err, SRV_RESOURCE_EXHAUSTED, "cannot start gRPC threads");
            goto fail;
        }
        g->nthreads_started++;
    }
    if (pthread_create(&g->wthread, NULL, watch_thread, g) == 0) g->wthread_on = 1;
    return g;
oom:
    srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
fail:
    if (creds) grpc_server_credentials_release(creds);
    srv_grpc_stop(&g);
    return NULL;
}

void srv_grpc_quiesce(srv_grpc *g) {
    /* The port stays open while the drain lasts: new calls get UNAVAILABLE at once (retryable), health NOT_SERVING,
     * and a client on a kept connection learns of the shutdown instead of timing out; srv_grpc_stop closes it. */
    if (!g || atomic_exchange(&g->quiescing, 1)) return;
    /* watches learn NOT_SERVING at once */
    pthread_mutex_lock(&g->wmu);
    pthread_cond_broadcast(&g->wcv);
    pthread_mutex_unlock(&g->wmu);
}

int srv_grpc_inflight(srv_grpc *g) { return g ? atomic_load(&g->inflight) : 0; }

void srv_grpc_stop(srv_grpc **pg) {
    if (!pg || !*pg) return;
    srv_grpc *g = *pg;
    if (g->wthread_on) {
        usleep(2 * SRV_GRPC_WATCH_MS * 1000); /* let the watches send NOT_SERVING */
        pthread_mutex_lock(&g->wmu);
        g->wstop = 1;
        pthread_cond_broadcast(&g->wcv);
        pthread_mutex_unlock(&g->wmu);
        pthread_join(g->wthread, NULL);
    }
    atomic_store(&g->stopping, 1);
    if (g->server) {
        atomic_store(&g->quiescing, 1);
        grpc_server_shutdown_and_notify(g->server, g->shutdown_cq, g);
        grpc_server_cancel_all_calls(g->server);
        grpc_completion_queue_pluck(g->shutdown_cq, g, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    }
    for (int q = 0; q < g->ncq && g->cqs; q++)
        if (g->cqs[q]) grpc_completion_queue_shutdown(g->cqs[q]);
    if (g->nthreads_started < g->ncq && g->cqs) { /* queues no thread serves: drain them here */
        for (int q = g->nthreads_started; q < g->ncq; q++)
            while (g->cqs[q]) {
                grpc_event ev = grpc_completion_queue_next(g->cqs[q], gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
                if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
                if (ev.type == GRPC_OP_COMPLETE && ((srv_grpc_tag *)ev.tag)->kind == TAG_NEW) call_free(((srv_grpc_tag *)ev.tag)->c);
            }
    }
    for (int q = 0; q < g->nthreads_started; q++) pthread_join(g->threads[q], NULL);
    if (g->server) grpc_server_destroy(g->server);
    for (int q = 0; q < g->ncq && g->cqs; q++)
        if (g->cqs[q]) grpc_completion_queue_destroy(g->cqs[q]);
    if (g->shutdown_cq) {
        grpc_completion_queue_shutdown(g->shutdown_cq);
        grpc_completion_queue_destroy(g->shutdown_cq);
    }
    free(g->cqs);
    free(g->threads);
    free(g->methods);
    free(g->handles);
    free(g->admin_token);
    pthread_mutex_destroy(&g->wmu);
    pthread_cond_destroy(&g->wcv);
    free(g);
    grpc_shutdown();
    *pg = NULL;
}
