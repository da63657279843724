/* rest.c - the REST front end on libmicrohttpd (see rest.h): daemon setup, body accumulation with the size
 * limit and content codings, routing to the /v1 (rest-tfs.c), /v2 (rest-kserve.c) and repository
 * (rest-repo.c) handlers, Prometheus, replies, and the drain deadline.
 *
 * Connections: the front gate (rest-gate.c) owns the listening socket and every connection until its first
 * request head is complete (limits per address and in all, the header deadline, canned JSON errors), then
 * hands it to MHD, which serves it from then on (keep-alive included); the gate's hooks keep the deadline of
 * each later request (srv_gate_received / srv_gate_replied).
 * Threading: MHD's internal thread pool (epoll; --rest_api_num_threads polling threads) runs srv_rest_access.
 * Inference goes through the shared request path (infer.h), whose handlers here only decode and encode: a cheap
 * request runs whole on its polling thread (bare-MHD speed); one that may take a while (the version is slow
 * for these rows, or batches) continues on the path's worker pool or the version's batcher while its
 * connection is suspended (srv_rest_async), and its reply comes back through srv_rest_async_reply, which
 * resumes the connection so MHD calls srv_rest_access again to send it. A body over SRV_REST_INLINE_BODY, and
 * a handler's own slow job (a model load), run whole on a worker the same way (srv_rest_defer).
 * Per-request state lives in an srv_rest_conn, created when MHD has parsed the request line (the URI log
 * callback, which also sees a raw NUL cutting the URL short) and freed when its last reference goes: MHD's
 * (dropped in srv_rest_done, called exactly once per request) and, while it finishes elsewhere, that work's.
 * Suspended requests are on the path's cut-off list; at the drain deadline srv_rest_cut answers each with 503
 * and resumes it, and the late reply is dropped (srv_rest_async_reply finds it off the list).
 * Limits: a body larger than max_body_bytes is refused with 413 as soon as Content-Length says so (before
 * any body byte is read). A chunked upload that passes the limit stops being stored at once; the rest is
 * dropped and 413 sent at its end, or the connection is closed past twice the limit. A gzip/deflate body is
 * held to the same limit after inflating. Framing that two parsers could read differently (two
 * Content-Length headers, Content-Length with Transfer-Encoding) is 400 and the connection closes.
 */
#define _GNU_SOURCE
#include "rest.h"

#include <errno.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "json.h"
#include "log.h"
#include "rest-encoding.h"
#include "rest-gate.h"
#include "rest-impl.h"

/* Requests up to this size are decoded on the polling thread; larger ones go to the worker pool whole. */
#define SRV_REST_INLINE_BODY (256u << 10)
/* Replies at least this large are compressed for clients that accept gzip or deflate. */
#define SRV_REST_COMPRESS_MIN 1024
/* Extra connection slots for health requests when the server is at its connection limit. */
#define SRV_REST_HEALTH_RESERVE 64

enum { SRV_RC_RECV, SRV_RC_QUEUED, SRV_RC_READY };

struct srv_rest_conn {
    srv_work w;      /* first: the pool's work item (the whole dispatch, or a handler's job) and the entry on
                      * the list the drain deadline cuts off; srv_work callbacks cast it back */
    char *body;
    size_t len, cap;
    int64_t t0;
    int fd;          /* the connection's socket (for the gate's hooks) */
    int counted;     /* counted in inflight */
    int replied;     /* a response was queued */
    int too_big;
    int bad_url;     /* a raw NUL cut the URL short */
    int close_after; /* send Connection: close */
    srv_enc enc_in, enc_out;
    size_t dropped;  /* body bytes seen (stored or dropped) */
    /* finishing on another thread (connection suspended meanwhile) */
    int phase;            /* SRV_RC_* */
    atomic_int refs;      /* MHD's + the asynchronous work's */
    srv_rest *rest;
    int cut;              /* answered 503 at the drain deadline; the work's late reply is dropped */
    struct MHD_Connection *c;
    const char *url, *method, *header_len, *authorization; /* MHD's, valid until the request ends */
    srv_rest_job *job;    /* a handler's job for the worker; NULL: the whole dispatch runs there */
    srv_reply out;        /* the reply MHD sends */
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

static void srv_rest_unref(srv_rest_conn *cn) {
    if (atomic_fetch_sub(&cn->refs, 1) != 1) return;
    free(cn->body);
    free(cn->out.body);
    free(cn);
}

static enum MHD_Result srv_rest_send(srv_rest *r, struct MHD_Connection *c, srv_rest_conn *cn, srv_reply *o) {
    int gz = 0;
    if (cn && cn->enc_out != SRV_ENC_IDENTITY && o->body && o->len >= SRV_REST_COMPRESS_MIN) {
        char *z = NULL;
        size_t zl = 0;
        if (srv_enc_compress(cn->enc_out, o->body, o->len, &z, &zl) == 0) {
            free(o->body);
            o->body = z;
            o->len = zl;
            gz = 1;
        }
    }
    struct MHD_Response *resp = MHD_create_response_from_buffer(o->len, o->body ? o->body : (void *)"",
                                                                o->body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!resp) {
        free(o->body);
        o->body = NULL;
        return MHD_NO;
    }
    o->body = NULL; /* owned by resp now */
    if (o->ctype) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, o->ctype);
    if (gz) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_ENCODING, srv_enc_name(cn->enc_out));
    if (cn && cn->enc_out != SRV_ENC_IDENTITY) MHD_add_response_header(resp, MHD_HTTP_HEADER_VARY, "Accept-Encoding");
    if (o->header_len) {
        char hl[32];
        snprintf(hl, sizeof hl, "%zu", o->header_len);
        MHD_add_response_header(resp, "Inference-Header-Content-Length", hl);
    }
    if (o->allow) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, o->allow);
    if (o->model_version > 0) {
        char mv[24];
        snprintf(mv, sizeof mv, "%lld", (long long)o->model_version);
        MHD_add_response_header(resp, "X-Model-Version", mv);
    }
    if (o->status == 503) MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (o->status == 401) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (atomic_load(&r->quiescing) || (cn && cn->close_after))
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)o->status, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* An error before the body is read (or instead of it): the connection closes after it, so whatever follows
 * on the wire is never parsed as a request. */
static enum MHD_Result srv_rest_refuse(srv_rest *r, struct MHD_Connection *c, srv_rest_conn *cn, int status,
                                       const char *msg) {
    srv_reply o = {0};
    srv_reply_error(&o, status, msg);
    cn->replied = 1;
    cn->close_after = 1;
    return srv_rest_send(r, c, cn, &o);
}

static enum MHD_Result srv_rest_413(srv_rest *r, struct MHD_Connection *c, srv_rest_conn *cn) {
    char msg[128];
    snprintf(msg, sizeof msg, "request body exceeds the limit of %zu bytes", r->max_body);
    return srv_rest_refuse(r, c, cn, 413, msg);
}

static void srv_rest_dispatch(srv_rest *r, srv_rest_conn *cn, srv_rest_job **defer, srv_reply *o) {
    const char *url = cn->url, *method = cn->method;
    if (cn->enc_in != SRV_ENC_IDENTITY) { /* inflate first; the body limit holds for the inflated size */
        char *plain = NULL, msg[200];
        size_t plen = 0;
        int st = srv_enc_inflate(cn->enc_in, cn->body ? cn->body : "", cn->len, r->max_body, &plain, &plen, msg,
                                 sizeof msg);
        if (st) {
            srv_reply_error(o, st, msg);
            return;
        }
        free(cn->body);
        cn->body = plain;
        cn->len = cn->cap = plen;
        cn->enc_in = SRV_ENC_IDENTITY;
    }
    srv_rest_req q = {.r = r, .method = method, .path = url, .body = cn->body, .len = cn->len, .t0_us = cn->t0,
                      .header_len = cn->header_len, .authorization = cn->authorization, .cn = cn,
                      .may_block = defer == NULL, .defer = defer};
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

/* ---- finishing on another thread ---- */

/* The drain deadline (srv_infer_cut_off): answer 503 now; the work's reply, when it comes, is dropped. */
static void srv_rest_cut(srv_work *w, const char *why) {
    srv_rest_conn *cn = (srv_rest_conn *)w;
    cn->cut = 1;
    cn->close_after = 1;
    free(cn->out.body);
    memset(&cn->out, 0, sizeof cn->out);
    srv_reply_error(&cn->out, 503, why);
    cn->phase = SRV_RC_READY;
    atomic_fetch_add(&cn->rest->cut_unsent, 1);
    MHD_resume_connection(cn->c); /* suspended until now, so MHD still holds its reference */
}

/* cn's reply is about to come from another thread: suspend the connection, hold a reference for that thread
 * and join the cut-off list. Idempotent. */
void srv_rest_async(srv_rest_conn *cn) {
    if (cn->phase == SRV_RC_QUEUED) return;
    cn->phase = SRV_RC_QUEUED;
    atomic_fetch_add(&cn->refs, 1);
    cn->w.cut = srv_rest_cut;
    srv_infer_track(cn->rest->inf, &cn->w);
    MHD_suspend_connection(cn->c);
}

/* The reply from another thread: unless the drain deadline already answered, it goes out. Any thread. */
void srv_rest_async_reply(srv_rest_conn *cn, srv_reply *o) {
    if (srv_infer_untrack(cn->rest->inf, &cn->w)) {
        free(cn->out.body);
        cn->out = *o;
        cn->job = NULL;
        cn->phase = SRV_RC_READY;
        MHD_resume_connection(cn->c); /* MHD calls srv_rest_access again, which sends cn->out */
    } else {
        free(o->body);
    }
    memset(o, 0, sizeof *o);
    srv_rest_unref(cn);
}

const char *srv_rest_infer_header(void *u, const char *name, char *buf, size_t cap) {
    const char *v = srv_rest_header(((srv_rest_req *)u)->cn, name);
    if (!v) return NULL;
    snprintf(buf, cap, "%s", v);
    return buf;
}

const char *srv_rest_header(srv_rest_conn *cn, const char *name) {
    return cn && cn->c ? MHD_lookup_connection_value(cn->c, MHD_HEADER_KIND, name) : NULL;
}

int srv_rest_cut_unsent(srv_rest *r) { return r ? atomic_load(&r->cut_unsent) : 0; }

/* On a worker: a handler's job, or the whole dispatch of a large body. */
static void srv_rest_work_run(srv_work *w) {
    srv_rest_conn *cn = (srv_rest_conn *)w;
    srv_reply o = {0};
    if (cn->job) cn->job->run(cn->job, &o);
    else srv_rest_dispatch(cn->rest, cn, NULL, &o);
    srv_rest_async_reply(cn, &o);
}

/* Run cn's work on a worker (on this thread if no worker can take it: it still finishes through
 * srv_rest_async_reply, so the connection is resumed either way). */
static void srv_rest_defer(srv_rest *r, srv_rest_conn *cn) {
    srv_rest_async(cn);
    cn->w.run = srv_rest_work_run;
    if (srv_infer_queue(r->inf, &cn->w) != 0) srv_rest_work_run(&cn->w);
}

/* MHD has parsed the request line: the request's state starts here. uri is the raw target (before %-decoding),
 * NUL-terminated where MHD cut the line before " HTTP/x.y"; a string that ends earlier held a raw NUL byte. */
static void *srv_rest_uri(void *cls, const char *uri, struct MHD_Connection *c) {
    srv_rest_conn *cn = calloc(1, sizeof *cn);
    if (!cn) return NULL;
    atomic_init(&cn->refs, 1);
    cn->rest = cls;
    cn->c = c;
    cn->t0 = srv_now_us();
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    cn->fd = ci ? ci->connect_fd : -1;
    if (uri) {
        const char *end = uri + strlen(uri);
        if (strncmp(end + 1, "HTTP/", 5) != 0) cn->bad_url = 1;
    }
    return cn;
}

/* Framing headers counted over every header line of the request. */
typedef struct srv_rest_framing {
    int cl, te;
} srv_rest_framing;

static enum MHD_Result srv_rest_count_framing(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    srv_rest_framing *f = cls;
    (void)kind;
    (void)value;
    if (key && strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) f->cl++;
    if (key && strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) f->te++;
    return MHD_YES;
}

/* The request head is complete (first call for a request): refuse what must not be served. */
static enum MHD_Result srv_rest_head(srv_rest *r, struct MHD_Connection *c, srv_rest_conn *cn, const char *url,
                                     const char *method) {
    atomic_fetch_add(&r->inflight, 1);
    cn->counted = 1;
    char msg[256];
    if (cn->bad_url) return srv_rest_refuse(r, c, cn, 400, "the request target contains a NUL byte");
    srv_rest_framing f = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, srv_rest_count_framing, &f);
    if (srv_rest_framing_bad(f.cl, f.te, msg, sizeof msg)) return srv_rest_refuse(r, c, cn, 400, msg);
    if (srv_gate_overflow(r->gate, cn->fd) && !srv_rest_is_health(method, url)) {
        srv_rest_limit_msg(r->conn_limit, msg, sizeof msg);
        return srv_rest_refuse(r, c, cn, 503, msg);
    }
    const char *ce = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_ENCODING);
    cn->enc_in = srv_enc_request(ce);
    if (cn->enc_in == SRV_ENC_UNKNOWN) {
        snprintf(msg, sizeof msg, "Content-Encoding '%.100s' is not supported (use gzip, deflate or identity)", ce);
        return srv_rest_refuse(r, c, cn, 415, msg);
    }
    cn->enc_out = srv_enc_reply(MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT_ENCODING));
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl) {
        char *end = NULL;
        errno = 0;
        unsigned long long v = strtoull(cl, &end, 10);
        if (errno == ERANGE || v > r->max_body) return srv_rest_413(r, c, cn);
    }
    return MHD_YES;
}

static enum MHD_Result srv_rest_access(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                       const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    srv_rest *r = cls;
    srv_rest_conn *cn = *con_cls;
    (void)version;
    if (!cn) return MHD_NO; /* out of memory in srv_rest_uri */
    if (!cn->counted) return srv_rest_head(r, c, cn, url, method);
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
        return srv_rest_send(r, c, cn, &cn->out);
    }
    srv_gate_received(r->gate, cn->fd); /* the whole request is in: its deadline stops */
    if (cn->too_big) return srv_rest_413(r, c, cn);
    cn->url = url;
    cn->method = method;
    cn->header_len = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Inference-Header-Content-Length");
    cn->authorization = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    size_t weight = cn->enc_in != SRV_ENC_IDENTITY ? cn->len * 8 : cn->len; /* inflating is work too */
    if (weight > SRV_REST_INLINE_BODY) {
        srv_rest_defer(r, cn);
        return MHD_YES;
    }
    srv_reply o = {0};
    srv_rest_job *job = NULL;
    srv_rest_dispatch(r, cn, &job, &o);
    if (o.pending) return MHD_YES; /* finishing on another thread: srv_rest_async_reply resumes the connection */
    if (job) {
        cn->job = job;
        srv_rest_defer(r, cn);
        return MHD_YES;
    }
    cn->replied = 1;
    return srv_rest_send(r, c, cn, &o);
}

static void srv_rest_done(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    srv_rest *r = cls;
    srv_rest_conn *cn = *con_cls;
    (void)c;
    (void)toe;
    if (!cn) return;
    *con_cls = NULL;
    srv_gate_replied(r->gate, cn->fd);
    if (cn->counted) atomic_fetch_sub(&r->inflight, 1);
    if (cn->cut) atomic_fetch_sub(&r->cut_unsent, 1);
    srv_rest_unref(cn);
}

static void srv_rest_conn_event(void *cls, struct MHD_Connection *c, void **socket_context,
                                enum MHD_ConnectionNotificationCode code) {
    srv_rest *r = cls;
    (void)socket_context;
    if (code != MHD_CONNECTION_NOTIFY_CLOSED) return;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci) srv_gate_closed(r->gate, ci->connect_fd);
}

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

/* Make room for the connection limit plus the threads' own descriptors. */
static void srv_rest_raise_nofile(int connection_limit, int nthreads) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
    rlim_t want = (rlim_t)connection_limit + (rlim_t)nthreads * 4 + 1024;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

static void srv_rest_free_state(srv_rest *r) {
    srv_gate_free(&r->gate);
    free(r->metrics_path);
    free(r->admin_token);
    free(r);
}

srv_rest *srv_rest_start(const srv_rest_opts *o, srv_registry *reg, srv_metrics *m, srv_infer *inf, srv_error *err) {
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
    int ctimeout = d.connection_timeout_s > 0 ? d.connection_timeout_s : 30;
    srv_rest_raise_nofile(climit + SRV_REST_HEALTH_RESERVE + 4096, nthreads);

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
    r->conn_limit = climit;
    r->inf = inf;
    r->metrics_path = strdup(d.metrics_path && *d.metrics_path ? d.metrics_path : "/monitoring/prometheus/metrics");
    r->admin_token = d.admin_token ? strdup(d.admin_token) : NULL;
    if (!r->inf || !r->metrics_path || (d.admin_token && !r->admin_token)) {
        srv_rest_free_state(r);
        srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    srv_gate_opts go = {.host = host,
                        .port = port,
                        .conn_limit = climit,
                        .reserve = SRV_REST_HEALTH_RESERVE,
                        .per_ip = d.per_ip_connection_limit > 0 ? d.per_ip_connection_limit : 256,
                        .header_timeout_s = d.header_timeout_s > 0 ? d.header_timeout_s : 10,
                        .idle_timeout_s = ctimeout,
                        .max_head = 16 * 1024};
    r->gate = srv_gate_new(&go, err);
    if (!r->gate) {
        srv_rest_free_state(r);
        return NULL;
    }

    /* The gate accepts; MHD gets each connection once its first request head is in (MHD_add_connection). Its own
     * limit sits above the gate's, so it never refuses one the gate let in. */
    int mhd_limit = climit + SRV_REST_HEALTH_RESERVE + nthreads * 16;
    unsigned base = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG |
                    MHD_USE_NO_LISTEN_SOCKET;
    unsigned modes[2] = {base | MHD_USE_EPOLL, base | MHD_USE_POLL};
    for (int i = 0; i < 2 && !r->d; i++) {
        if (i == 0 && MHD_is_feature_supported(MHD_FEATURE_EPOLL) != MHD_YES) continue;
        struct MHD_OptionItem ops[] = {
            {MHD_OPTION_CONNECTION_LIMIT, mhd_limit, NULL},
            {MHD_OPTION_CONNECTION_TIMEOUT, ctimeout, NULL},
            {MHD_OPTION_CONNECTION_MEMORY_LIMIT, 32 * 1024, NULL}, /* MHD zeroes all of it per request */
            {MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)srv_rest_done, r},
            {MHD_OPTION_NOTIFY_CONNECTION, (intptr_t)srv_rest_conn_event, r},
            {MHD_OPTION_URI_LOG_CALLBACK, (intptr_t)srv_rest_uri, r},
            {MHD_OPTION_UNESCAPE_CALLBACK, (intptr_t)srv_rest_unescape, NULL},
            {MHD_OPTION_THREAD_POOL_SIZE, nthreads, NULL},
            {MHD_OPTION_THREAD_STACK_SIZE, (intptr_t)(2 << 20), NULL},
            {MHD_OPTION_END, 0, NULL},
        };
        r->d = MHD_start_daemon(modes[i], 0, NULL, NULL, srv_rest_access, r, MHD_OPTION_ARRAY, ops, MHD_OPTION_END);
    }
    if (!r->d) {
        srv_err(err, SRV_UNAVAILABLE, "cannot start the HTTP server for %s:%d", host, port);
        srv_rest_free_state(r);
        return NULL;
    }
    if (srv_gate_start(r->gate, r->d, err) != 0) {
        MHD_stop_daemon(r->d);
        srv_rest_free_state(r);
        return NULL;
    }
    return r;
}

void srv_rest_quiesce(srv_rest *r) {
    if (!r || atomic_exchange(&r->quiescing, 1)) return;
    srv_gate_close_listen(r->gate);
}

int srv_rest_inflight(srv_rest *r) { return r ? atomic_load(&r->inflight) : 0; }

void srv_rest_stop(srv_rest **pr) {
    if (!pr || !*pr) return;
    srv_rest *r = *pr;
    /* The caller freed the request path first (srv_infer_free): its workers finished what they held, resuming
     * its connection, before MHD stops. */
    srv_gate_stop(r->gate);
    if (r->d) MHD_stop_daemon(r->d);
    srv_rest_free_state(r);
    *pr = NULL;
}
