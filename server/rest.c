/* rest.c - the REST front end on libmicrohttpd (see rest.h): daemon setup, body accumulation with the size
 * limit, routing to the /v1 (rest-tfs.c) and /v2 (rest-kserve.c) handlers, Prometheus, replies.
 *
 * Threading: MHD's internal thread pool (epoll where available, else poll; --rest_api_num_threads polling
 * threads) runs srv_rest_access. A cheap request runs whole on its polling thread (no hand-off: bare-MHD
 * speed). One that may take a while must not stall the other connections that thread owns, so its
 * connection is suspended and the work goes to a worker pool that grows on demand (batching needs many
 * requests waiting at once); the worker fills the reply and resumes the connection, and MHD calls
 * srv_rest_access again to send it. What goes to the pool: a body over SRV_REST_INLINE_BODY (the whole
 * request), and inference the handler finds slow after decoding (srv_rest_quick: no timing yet, or the
 * version's measured per-row time x rows over SRV_REST_INLINE_US, or a slow run of it in progress). With
 * batching on, a decoded request goes straight to the version's batcher instead (srv_rest_job.start): the
 * connection stays suspended and the batch worker encodes the reply and resumes it, so no thread blocks
 * per request.
 * Per-request state lives in an srv_rest_conn hung on MHD's con_cls and freed in srv_rest_done, which MHD
 * calls exactly once per started request; inflight counts requests between the two.
 * Limits: a body larger than max_body_bytes is refused with 413 as soon as Content-Length says so (before
 * any body byte is read; with Expect: 100-continue the client never sends it). A chunked upload that passes
 * the limit stops being stored at once; the rest is dropped and 413 sent at its end (MHD 0.9 cannot reply in
 * the middle of an upload), or the connection is closed past twice the limit. The body buffer never grows
 * beyond max_body_bytes + 1.
 */
#define _GNU_SOURCE
#include "rest.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "json.h"
#include "rest-impl.h"

/* Requests up to this size are decoded on the polling thread; larger ones go to the worker pool whole. */
#define SRV_REST_INLINE_BODY (256u << 10)
/* Inference expected to take longer than this (or batching) runs on the worker pool. */
#define SRV_REST_INLINE_US 1000
#define SRV_REST_MAX_WORKERS 1024

enum { SRV_RC_RECV, SRV_RC_QUEUED, SRV_RC_READY };

struct srv_rest_conn {
    char *body;
    size_t len, cap;
    int64_t t0;
    int replied;   /* a response was queued */
    int too_big;
    size_t dropped; /* body bytes seen (stored or dropped) */
    /* deferred to the worker pool (connection suspended meanwhile) */
    int phase;            /* SRV_RC_* */
    struct MHD_Connection *c;
    const char *url, *method, *header_len, *authorization; /* MHD's, valid until the request ends */
    srv_rest_job *job;    /* NULL: the whole dispatch runs on the worker */
    srv_reply out;
    srv_rest_conn *next;  /* pool queue */
};

/* ---- replies ---- */

void srv_reply_error(srv_reply *o, int status, const char *msg) {
    srv_buf b = {0};
    srv_buf_puts(&b, "{\"error\":");
    srv_buf_json_str(&b, msg ? msg : "");
    srv_buf_puts(&b, "}");
    srv_reply_buf(o, status, &b);
}

void srv_reply_code(srv_reply *o, const srv_error *err) {
    srv_reply_error(o, srv_code_http(err->code), err->msg);
}

void srv_reply_buf(srv_reply *o, int status, struct srv_buf *b) {
    size_t len = 0;
    char *s = srv_buf_take(b, &len);
    if (!s) {
        static const char oom[] = "{\"error\":\"out of memory\"}";
        s = strdup(oom);
        len = s ? sizeof oom - 1 : 0;
        status = 500;
    }
    srv_reply_text(o, status, s, len, "application/json");
}

void srv_reply_text(srv_reply *o, int status, char *text, size_t len, const char *ctype) {
    free(o->body);
    o->status = status;
    o->body = text;
    o->len = text ? len : 0;
    o->ctype = ctype;
}

int64_t srv_rest_version(const char *s) {
    int64_t v = 0;
    if (!s || !*s || strlen(s) > 18) return -1;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        v = v * 10 + (*p - '0');
    }
    return v > 0 ? v : -1;
}

int srv_rest_split(const char *path, char segs[][256], int max) {
    int n = 0;
    const char *p = path;
    for (;;) {
        const char *e = strchr(p, '/');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == 0 || l >= 256 || n >= max) return -1;
        memcpy(segs[n], p, l);
        segs[n][l] = '\0';
        n++;
        if (!e) return n;
        p = e + 1;
    }
}

/* ---- MHD glue ---- */

static enum MHD_Result srv_rest_send(srv_rest *r, struct MHD_Connection *c, srv_reply *o) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(o->len, o->body ? o->body : (void *)"",
                                                                o->body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!resp) {
        free(o->body);
        o->body = NULL;
        return MHD_NO;
    }
    o->body = NULL; /* owned by resp now */
    if (o->ctype) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, o->ctype);
    if (o->header_len) {
        char hl[32];
        snprintf(hl, sizeof hl, "%zu", o->header_len);
        MHD_add_response_header(resp, "Inference-Header-Content-Length", hl);
    }
    if (o->allow) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, o->allow);
    if (atomic_load(&r->quiescing)) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)o->status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result srv_rest_413(srv_rest *r, struct MHD_Connection *c, srv_rest_conn *cn) {
    char msg[128];
    srv_reply o = {0};
    snprintf(msg, sizeof msg, "request body exceeds the limit of %zu bytes", r->max_body);
    srv_reply_error(&o, 413, msg);
    cn->replied = 1;
    return srv_rest_send(r, c, &o);
}

int srv_rest_quick(const srv_rest_req *q, srv_version *v, const srv_tensors *in) {
    return !q->defer || srv_version_quick(v, in, SRV_REST_INLINE_US);
}

static void srv_rest_dispatch(srv_rest *r, srv_rest_conn *cn, srv_rest_job **defer, srv_reply *o) {
    const char *url = cn->url, *method = cn->method;
    srv_rest_req q = {.r = r, .method = method, .path = url, .body = cn->body, .len = cn->len, .t0_us = cn->t0,
                      .header_len = cn->header_len, .authorization = cn->authorization, .defer = defer};
    if (r->timeout_ms > 0) q.deadline_us = cn->t0 + r->timeout_ms * 1000;
    if (r->metrics_enabled && (strcmp(url, "/metrics") == 0 || (r->metrics_path && strcmp(url, r->metrics_path) == 0))) {
        if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
            o->allow = "GET";
            srv_reply_error(o, 405, "method not allowed: use GET");
            return;
        }
        size_t len = 0;
        char *text = srv_metrics_render(r->m, &len);
        if (!text) srv_reply_error(o, 500, "out of memory rendering metrics");
        else srv_reply_text(o, 200, text, len, "text/plain; version=0.0.4; charset=utf-8");
        return;
    }
    if (srv_rest_tfs(&q, o) || srv_rest_repo(&q, o) || srv_rest_kserve(&q, o)) return;
    char msg[300];
    snprintf(msg, sizeof msg, "Malformed request: %s %.200s", method, url);
    srv_reply_error(o, 404, msg);
}

/* ---- worker pool ---- */

static void *srv_rest_worker(void *arg) {
    srv_rest *r = arg;
    srv_rest_pool *p = &r->pool;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->head && !p->stopping) {
            p->nidle++;
            pthread_cond_wait(&p->work, &p->mu);
            p->nidle--;
        }
        if (!p->head) break; /* stopping and drained */
        srv_rest_conn *cn = p->head;
        p->head = cn->next;
        if (!p->head) p->tail = NULL;
        p->queued--;
        pthread_mutex_unlock(&p->mu);
        if (cn->job) cn->job->run(cn->job, &cn->out);
        else srv_rest_dispatch(r, cn, NULL, &cn->out);
        cn->job = NULL;
        cn->phase = SRV_RC_READY;
        MHD_resume_connection(cn->c); /* MHD calls srv_rest_access again, which sends cn->out */
        pthread_mutex_lock(&p->mu);
    }
    p->nthreads--;
    pthread_cond_broadcast(&p->idle);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* The reply is in cn->out: let MHD send it (it calls srv_rest_access again). Any thread. */
static void srv_rest_complete(void *arg) {
    srv_rest_conn *cn = arg;
    cn->job = NULL;
    cn->phase = SRV_RC_READY;
    MHD_resume_connection(cn->c);
}

/* Hand cn to the pool; its connection is suspended first, so the worker's resume always comes after it.
 * 0, or -1 when no worker thread can run it (then the caller runs it itself). */
static int srv_rest_defer(srv_rest *r, srv_rest_conn *cn, int suspended) {
    srv_rest_pool *p = &r->pool;
    pthread_mutex_lock(&p->mu);
    if (p->queued + 1 > p->nidle && p->nthreads < p->max && !p->stopping) {
        pthread_attr_t a;
        pthread_t t;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&a, 2 << 20);
        if (pthread_create(&t, &a, srv_rest_worker, r) == 0) p->nthreads++;
        pthread_attr_destroy(&a);
    }
    if (p->nthreads == 0 || p->stopping) {
        pthread_mutex_unlock(&p->mu);
        return -1;
    }
    cn->phase = SRV_RC_QUEUED;
    if (!suspended) MHD_suspend_connection(cn->c);
    cn->next = NULL;
    if (p->tail) p->tail->next = cn;
    else p->head = cn;
    p->tail = cn;
    p->queued++;
    pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

static enum MHD_Result srv_rest_access(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                       const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    srv_rest *r = cls;
    srv_rest_conn *cn = *con_cls;
    (void)version;
    if (!cn) {
        cn = calloc(1, sizeof *cn);
        if (!cn) return MHD_NO;
        cn->t0 = srv_now_us();
        cn->c = c;
        *con_cls = cn;
        atomic_fetch_add(&r->inflight, 1);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end = NULL;
            errno = 0;
            unsigned long long v = strtoull(cl, &end, 10);
            if (errno == ERANGE || v > r->max_body) return srv_rest_413(r, c, cn);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (cn->replied) return MHD_YES; /* MHD discards the rest after an early reply */
        if (cn->too_big || n > r->max_body || cn->len > r->max_body - n) {
            /* A chunked body passed the limit. MHD 0.9.x cannot queue a response in the middle of an
             * upload, so the rest is read and dropped (nothing stored) and 413 goes out at its end; a client
             * that keeps sending past twice the limit is disconnected. */
            cn->too_big = 1;
            free(cn->body);
            cn->body = NULL;
            cn->cap = 0;
            cn->dropped += n;
            return cn->dropped > 2 * r->max_body ? MHD_NO : MHD_YES;
        }
        if (cn->len + n + 1 > cn->cap) {
            size_t cap = cn->cap ? cn->cap : 4096;
            while (cap < cn->len + n + 1) cap = cap > r->max_body / 2 ? r->max_body + 1 : cap * 2;
            char *p = realloc(cn->body, cap);
            if (!p) return MHD_NO;
            cn->body = p;
            cn->cap = cap;
        }
        memcpy(cn->body + cn->len, upload, n);
        cn->len += n;
        cn->dropped = cn->len;
        cn->body[cn->len] = '\0';
        return MHD_YES;
    }
    if (cn->replied) return MHD_YES;
    if (cn->phase == SRV_RC_QUEUED) return MHD_YES; /* not expected: the connection is suspended */
    if (cn->phase == SRV_RC_READY) {
        cn->replied = 1;
        return srv_rest_send(r, c, &cn->out);
    }
    if (cn->too_big) return srv_rest_413(r, c, cn);
    cn->url = url;
    cn->method = method;
    cn->header_len = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Inference-Header-Content-Length");
    cn->authorization = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (cn->len > SRV_REST_INLINE_BODY && srv_rest_defer(r, cn, 0) == 0) return MHD_YES;
    srv_reply o = {0};
    srv_rest_job *job = NULL;
    srv_rest_dispatch(r, cn, &job, &o);
    if (job && job->start) { /* batched: the batch worker replies; no thread waits for the batch */
        cn->job = job;
        cn->phase = SRV_RC_QUEUED;
        MHD_suspend_connection(c);
        job->o = &cn->out, job->complete = srv_rest_complete, job->carg = cn;
        if (job->start(job)) return MHD_YES;
        if (srv_rest_defer(r, cn, 1) == 0) return MHD_YES; /* not batched after all: a worker runs it */
        job->run(job, &cn->out);
        srv_rest_complete(cn);
        return MHD_YES;
    }
    if (job) {
        cn->job = job;
        if (srv_rest_defer(r, cn, 0) == 0) return MHD_YES;
        cn->job = NULL;
        job->run(job, &o);
    }
    cn->replied = 1;
    return srv_rest_send(r, c, &o);
}

static void srv_rest_done(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    srv_rest *r = cls;
    srv_rest_conn *cn = *con_cls;
    (void)c;
    (void)toe;
    if (!cn) return;
    free(cn->body);
    free(cn->out.body);
    free(cn);
    *con_cls = NULL;
    atomic_fetch_sub(&r->inflight, 1);
}

/* Make room for the connection limit plus the pool's own descriptors. */
static int srv_rest_hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* URL unescaping for MHD: %XX decoding, except that %00 stays as written, so a NUL can never cut a model
 * name short (".../models/m%00" must not address model "m"); the literal '%' then fails name validation. */
static size_t srv_rest_unescape(void *cls, struct MHD_Connection *c, char *s) {
    (void)cls;
    (void)c;
    char *w = s;
    for (const char *p = s; *p; p++) {
        int hi, lo;
        if (p[0] == '%' && p[1] && p[2] && (hi = srv_rest_hex(p[1])) >= 0 && (lo = srv_rest_hex(p[2])) >= 0 &&
            (hi | lo) != 0) {
            *w++ = (char)(hi * 16 + lo);
            p += 2;
        } else {
            *w++ = *p;
        }
    }
    *w = 0;
    return (size_t)(w - s);
}

static void srv_rest_raise_nofile(int connection_limit, int nthreads) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
    rlim_t want = (rlim_t)connection_limit + (rlim_t)nthreads * 4 + 256;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

static void srv_rest_pool_destroy(srv_rest *r) {
    pthread_mutex_destroy(&r->pool.mu);
    pthread_cond_destroy(&r->pool.work);
    pthread_cond_destroy(&r->pool.idle);
}

srv_rest *srv_rest_start(const srv_rest_opts *o, srv_registry *reg, srv_metrics *m, srv_error *err) {
    srv_rest_opts d = {0};
    if (o) d = *o;
    const char *host = d.host && *d.host ? d.host : "0.0.0.0";
    int port = d.port > 0 ? d.port : d.port == 0 ? 8501 : -1;
    if (port < 0 || port > 65535) {
        srv_err(err, SRV_INVALID_ARGUMENT, "bad REST port %d", d.port);
        return NULL;
    }
    /* MHD's internal thread pool on epoll (nthreads polling threads, TF Serving's --rest_api_num_threads,
     * default 4 per core). Cheap requests run on the polling thread; slow ones go to the worker pool with
     * their connection suspended (srv_rest_defer), so they never hold up the thread's other connections. */
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int nthreads = d.nthreads > 0 ? d.nthreads : 4 * (int)(ncpu > 0 ? ncpu : 1);
    if (nthreads > 1024) nthreads = 1024;
    int climit = d.connection_limit > 0 ? d.connection_limit : 2048;
    if (climit < nthreads) climit = nthreads; /* MHD splits the limit across the pool */
    int ctimeout = d.connection_timeout_s > 0 ? d.connection_timeout_s : 30;

    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int gai = getaddrinfo(host, ps, &hints, &ai);
    if (gai != 0 || !ai) {
        srv_err(err, SRV_INVALID_ARGUMENT, "cannot resolve REST host '%s': %s", host, gai_strerror(gai));
        return NULL;
    }
    struct sockaddr_storage sa;
    memset(&sa, 0, sizeof sa);
    memcpy(&sa, ai->ai_addr, ai->ai_addrlen < sizeof sa ? ai->ai_addrlen : sizeof sa);
    int v6 = ai->ai_family == AF_INET6;
    freeaddrinfo(ai);

    srv_rest *r = calloc(1, sizeof *r);
    if (!r) {
        srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    r->reg = reg;
    r->m = m;
    r->max_body = d.max_body_bytes > 0 ? d.max_body_bytes : (size_t)64 << 20;
    r->timeout_ms = d.request_timeout_ms > 0 ? d.request_timeout_ms : 0;
    r->metrics_enabled = d.metrics_enabled;
    r->explicit_control = d.explicit_control;
    r->admin_token = d.admin_token ? strdup(d.admin_token) : NULL;
    pthread_mutex_init(&r->pool.mu, NULL);
    pthread_cond_init(&r->pool.work, NULL);
    pthread_cond_init(&r->pool.idle, NULL);
    r->pool.max = SRV_REST_MAX_WORKERS;
    r->metrics_path = strdup(d.metrics_path && *d.metrics_path ? d.metrics_path : "/monitoring/prometheus/metrics");
    if (!r->metrics_path) {
        free(r);
        srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    srv_rest_raise_nofile(climit, nthreads);

    unsigned base = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG |
                    (v6 ? MHD_USE_IPv6 : 0);
    unsigned modes[2] = {base | MHD_USE_EPOLL, base | MHD_USE_POLL};
    for (int i = 0; i < 2 && !r->d; i++) {
        if (i == 0 && MHD_is_feature_supported(MHD_FEATURE_EPOLL) != MHD_YES) continue;
        struct MHD_OptionItem ops[] = {
            {MHD_OPTION_SOCK_ADDR, 0, &sa},
            {MHD_OPTION_CONNECTION_LIMIT, climit, NULL},
            {MHD_OPTION_CONNECTION_TIMEOUT, ctimeout, NULL},
            {MHD_OPTION_CONNECTION_MEMORY_LIMIT, 32 * 1024, NULL}, /* MHD zeroes all of it per request */
            {MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024, NULL},
            {MHD_OPTION_LISTENING_ADDRESS_REUSE, 1, NULL},
            {MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)srv_rest_done, r},
            {MHD_OPTION_UNESCAPE_CALLBACK, (intptr_t)srv_rest_unescape, NULL},
            {MHD_OPTION_THREAD_POOL_SIZE, nthreads, NULL},
            {MHD_OPTION_THREAD_STACK_SIZE, (intptr_t)(2 << 20), NULL},
            {MHD_OPTION_END, 0, NULL},
        };
        r->d = MHD_start_daemon(modes[i], (uint16_t)port, NULL, NULL, srv_rest_access, r, MHD_OPTION_ARRAY, ops,
                                MHD_OPTION_END);
    }
    if (!r->d) {
        srv_err(err, SRV_UNAVAILABLE, "cannot start the HTTP server on %s:%d (port in use or not permitted)", host,
                port);
        srv_rest_pool_destroy(r);
        free(r->metrics_path);
        free(r);
        return NULL;
    }
    return r;
}

void srv_rest_quiesce(srv_rest *r) {
    if (!r || !r->d || atomic_exchange(&r->quiescing, 1)) return;
    MHD_socket fd = MHD_quiesce_daemon(r->d);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

int srv_rest_inflight(srv_rest *r) { return r ? atomic_load(&r->inflight) : 0; }

void srv_rest_stop(srv_rest **pr) {
    if (!pr || !*pr) return;
    srv_rest *r = *pr;
    /* Workers finish what they hold (resuming its connection) before MHD stops. */
    pthread_mutex_lock(&r->pool.mu);
    r->pool.stopping = 1;
    pthread_cond_broadcast(&r->pool.work);
    while (r->pool.nthreads > 0) pthread_cond_wait(&r->pool.idle, &r->pool.mu);
    pthread_mutex_unlock(&r->pool.mu);
    if (r->d) MHD_stop_daemon(r->d);
    srv_rest_pool_destroy(r);
    free(r->metrics_path);
    free(r->admin_token);
    free(r);
    *pr = NULL;
}
