/* rest-kserve.c - the KServe v2 protocol as Triton serves it (/v2...): server metadata, health, model
 * metadata and readiness, inference (JSON and the binary tensor data extension), repository index.
 *
 * Routes: GET /v2 | /v2/health/live | /v2/health/ready
 *         GET /v2/models/{m}[/versions/{v}] | .../ready      POST .../infer
 *         POST /v2/repository/index
 * Names from the URL are validated before use; versions are plain positive integers. An inference holds
 * one registry reference from acquire to release on every path.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "json.h"
#include "rest-impl.h"

#ifndef TENSORD_VERSION
#define TENSORD_VERSION "0.1.0"
#endif

static int srv_is(const char *a, const char *b) { return strcmp(a, b) == 0; }

static void srv_kserve_405(srv_reply *o, const char *allow) {
    char msg[64];
    snprintf(msg, sizeof msg, "method not allowed: use %s", allow);
    o->allow = allow;
    srv_reply_error(o, 405, msg);
}

static const char *srv_kserve_state(srv_state s) {
    switch (s) {
    case SRV_STATE_AVAILABLE: return "READY";
    case SRV_STATE_START:
    case SRV_STATE_LOADING: return "LOADING";
    case SRV_STATE_UNLOADING: return "UNLOADING";
    default: return "UNAVAILABLE";
    }
}

static void srv_kserve_index(const srv_rest_req *q, srv_reply *o) {
    srv_error err = {0};
    srv_version_status *st = NULL;
    int n = 0;
    if (srv_registry_status(q->r->reg, NULL, 0, NULL, &st, &n, &err) != SRV_OK) {
        srv_reply_code(o, &err);
        return;
    }
    srv_buf b = {0};
    srv_buf_puts(&b, "[");
    for (int i = 0; i < n; i++) {
        srv_buf_puts(&b, i ? ",{\"name\":" : "{\"name\":");
        srv_buf_json_str(&b, st[i].model ? st[i].model : "");
        srv_buf_printf(&b, ",\"version\":\"%lld\",\"state\":\"%s\",\"reason\":", (long long)st[i].version,
                       srv_kserve_state(st[i].state));
        srv_buf_json_str(&b, st[i].error_message ? st[i].error_message : "");
        srv_buf_puts(&b, "}");
    }
    srv_buf_puts(&b, "]");
    srv_status_free(st, n);
    srv_reply_buf(o, 200, &b);
}

static void srv_kserve_io(srv_buf *b, const srv_io *io, int n) {
    for (int i = 0; i < n; i++) {
        srv_buf_puts(b, i ? ",{\"name\":" : "{\"name\":");
        srv_buf_json_str(b, io[i].name);
        srv_buf_printf(b, ",\"datatype\":\"%s\",\"shape\":[", srv_kserve_dtype(io[i].dtype));
        if (io[i].ndim < 0) srv_buf_puts(b, "-1");
        for (int d = 0; d < io[i].ndim; d++)
            srv_buf_printf(b, d ? ",%lld" : "%lld", (long long)(io[i].dims[d] < 0 ? -1 : io[i].dims[d]));
        srv_buf_puts(b, "]}");
    }
}

static void srv_kserve_metadata(const srv_rest_req *q, const char *model, int64_t version, srv_reply *o) {
    srv_error err = {0};
    srv_version *v = srv_registry_acquire(q->r->reg, model, version, NULL, &err);
    if (!v) {
        srv_reply_code(o, &err);
        srv_metrics_request(q->r->m, err.code == SRV_NOT_FOUND ? "" : model, version, NULL, "metadata", err.code,
                            srv_now_us() - q->t0_us);
        return;
    }
    const srv_version_info *info = srv_version_get_info(v);
    int64_t ver = info->version;
    srv_buf b = {0};
    srv_buf_puts(&b, "{\"name\":");
    srv_buf_json_str(&b, model);
    srv_buf_puts(&b, ",\"versions\":[");
    srv_version_status *st = NULL;
    int n = 0, k = 0;
    if (version > 0) {
        srv_buf_printf(&b, "\"%lld\"", (long long)ver);
    } else if (srv_registry_status(q->r->reg, model, 0, NULL, &st, &n, &err) == SRV_OK) {
        for (int i = 0; i < n; i++)
            if (st[i].state == SRV_STATE_AVAILABLE) srv_buf_printf(&b, "%s\"%lld\"", k++ ? "," : "", (long long)st[i].version);
    }
    srv_status_free(st, n);
    srv_buf_puts(&b, "],\"platform\":\"onnxruntime_onnx\",\"inputs\":[");
    srv_kserve_io(&b, info->inputs, info->ninputs);
    srv_buf_puts(&b, "],\"outputs\":[");
    srv_kserve_io(&b, info->outputs, info->noutputs);
    srv_buf_puts(&b, "]}");
    srv_version_release(v);
    srv_reply_buf(o, 200, &b);
    srv_metrics_request(q->r->m, model, ver, NULL, "metadata", SRV_OK, srv_now_us() - q->t0_us);
}

static void srv_kserve_ready(const srv_rest_req *q, const char *model, int64_t version, srv_reply *o) {
    srv_error err = {0};
    srv_version *v = srv_registry_acquire(q->r->reg, model, version, NULL, &err);
    if (!v) { /* unknown model or version: 404; a configured model with nothing available (yet): 503 */
        int code = err.code == SRV_NOT_FOUND ? 404 : 503;
        if (code == 404 && version <= 0 && srv_registry_has_model(q->r->reg, model)) code = 503;
        srv_reply_error(o, code, err.msg);
        return;
    }
    srv_version_release(v);
    srv_reply_text(o, 200, NULL, 0, "application/json");
}

/* Strict decimal header value; -1 if absent or bad. */
static int64_t srv_kserve_hlen(const char *s) {
    if (!s) return -1;
    while (*s == ' ') s++;
    int64_t v = 0;
    int nd = 0;
    for (; *s >= '0' && *s <= '9'; s++, nd++) {
        if (nd >= 18) return -2;
        v = v * 10 + (*s - '0');
    }
    while (*s == ' ') s++;
    return nd && !*s ? v : -2;
}

/* The second half of an inference: predict (unless `done`: out already holds the result of an asynchronous
 * predict, rc its status) -> encode -> release v -> reply -> record. Takes in, out, kr and v. */
static void srv_kserve_finish(const srv_rest_req *q, const char *model, int64_t version, srv_version *v,
                              srv_tensors *in, srv_tensors *done, srv_kserve_req *kr, srv_code rc, srv_error *err,
                              srv_reply *o) {
    srv_tensors local = {0}, *outp = done ? done : &local;
    int64_t ver = 0;
    char *body = NULL;
    size_t len = 0, json_len = 0;
    if (v) {
        const srv_version_info *info = srv_version_get_info(v);
        ver = info->version;
        if (rc == SRV_OK && !done) rc = srv_version_predict(v, in, outp, q->deadline_us, err);
        if (rc == SRV_OK) body = srv_kserve_encode_infer(info, outp, kr, &len, &json_len, err);
        srv_tensors_free(in);
        srv_tensors_free(outp);
        srv_kserve_req_free(kr);
        srv_version_release(v);
    }
    if (body) {
        err->code = SRV_OK;
        if (json_len < len) {
            srv_reply_text(o, 200, body, len, "application/octet-stream");
            o->header_len = json_len;
        } else {
            srv_reply_text(o, 200, body, len, "application/json");
        }
    } else {
        if (err->code == SRV_OK) srv_err(err, SRV_INTERNAL, "request failed");
        srv_reply_code(o, err);
    }
    srv_metrics_request(q->r->m, err->code == SRV_NOT_FOUND && ver <= 0 ? "" : model, ver > 0 ? ver : version, NULL,
                        "infer", err->code, srv_now_us() - q->t0_us);
}

typedef struct srv_kserve_job { /* q's strings and body belong to the request, which outlives the job */
    srv_rest_job base;
    srv_rest_req q;
    char model[256];
    int64_t version;
    srv_version *v;
    srv_tensors in, out;
    srv_kserve_req kr;
} srv_kserve_job;

static void srv_kserve_job_run(srv_rest_job *job, srv_reply *o) {
    srv_kserve_job *j = (srv_kserve_job *)job;
    srv_error err = {0};
    srv_kserve_finish(&j->q, j->model, j->version, j->v, &j->in, NULL, &j->kr, SRV_OK, &err, o);
    free(j);
}

static void srv_kserve_job_done(void *arg, srv_code rc, const srv_error *e) {
    srv_kserve_job *j = arg;
    srv_error err = {0};
    if (rc != SRV_OK) err = *e;
    void (*complete)(void *) = j->base.complete;
    void *carg = j->base.carg;
    srv_kserve_finish(&j->q, j->model, j->version, j->v, &j->in, &j->out, &j->kr, rc, &err, j->base.o);
    free(j);
    complete(carg);
}

static int srv_kserve_job_start(srv_rest_job *job) {
    srv_kserve_job *j = (srv_kserve_job *)job;
    return srv_version_predict_async(j->v, &j->in, &j->out, j->q.deadline_us, srv_kserve_job_done, j);
}

/* acquire -> decode -> (here, or on a worker when it may take long) predict -> encode -> release. */
static void srv_kserve_infer(const srv_rest_req *q, const char *model, int64_t version, srv_reply *o) {
    srv_error err = {0};
    srv_tensors in = {0};
    srv_kserve_req kr = {0};
    srv_version *v = NULL;
    srv_code rc = SRV_OK;
    int64_t hl = srv_kserve_hlen(q->header_len);
    if (hl == -2 || (hl >= 0 && (uint64_t)hl > q->len)) {
        srv_err(&err, SRV_INVALID_ARGUMENT, "bad Inference-Header-Content-Length '%.32s' for a body of %zu bytes",
                q->header_len, q->len);
    } else if ((v = srv_registry_acquire(q->r->reg, model, version, NULL, &err))) {
        const srv_version_info *info = srv_version_get_info(v);
        rc = srv_kserve_decode_infer(q->body, q->len, hl >= 0 ? (size_t)hl : q->len, info, &in, &kr, &err);
        if (rc == SRV_OK && !srv_rest_quick(q, v, &in)) {
            srv_kserve_job *j = malloc(sizeof *j);
            if (j) {
                *j = (srv_kserve_job){.base = {.run = srv_kserve_job_run, .start = srv_kserve_job_start}, .q = *q,
                                      .version = version, .v = v, .in = in, .kr = kr};
                snprintf(j->model, sizeof j->model, "%s", model);
                j->q.defer = NULL;
                *q->defer = &j->base;
                return;
            }
        }
    }
    srv_kserve_finish(q, model, version, v, &in, NULL, &kr, rc, &err, o);
}

/* /v2/models/... */
static void srv_kserve_models(const srv_rest_req *q, const char *rest, srv_reply *o) {
    char segs[4][256];
    int n = srv_rest_split(rest, segs, 4);
    if (n < 1) {
        srv_reply_error(o, 404, "not found");
        return;
    }
    if (!srv_name_valid(segs[0])) {
        srv_reply_error(o, 400, "invalid model name in the URL");
        return;
    }
    int64_t version = 0;
    int k = 1;
    if (n >= 3 && srv_is(segs[1], "versions")) {
        version = srv_rest_version(segs[2]);
        if (version <= 0) {
            srv_reply_error(o, 400, "invalid model version: must be a positive integer");
            return;
        }
        k = 3;
    }
    int get = srv_is(q->method, "GET") || srv_is(q->method, "HEAD"), post = srv_is(q->method, "POST");
    if (k == n) {
        if (!get) {
            srv_kserve_405(o, "GET");
            return;
        }
        srv_kserve_metadata(q, segs[0], version, o);
        return;
    }
    if (k + 1 != n) {
        srv_reply_error(o, 404, "not found");
        return;
    }
    if (srv_is(segs[k], "ready")) {
        if (!get) {
            srv_kserve_405(o, "GET");
            return;
        }
        srv_kserve_ready(q, segs[0], version, o);
        return;
    }
    if (srv_is(segs[k], "infer")) {
        if (!post) {
            srv_kserve_405(o, "POST");
            return;
        }
        srv_kserve_infer(q, segs[0], version, o);
        return;
    }
    srv_reply_error(o, 404, "not found");
}

int srv_rest_kserve(const srv_rest_req *q, srv_reply *o) {
    const char *p = q->path;
    if (strncmp(p, "/v2", 3) != 0 || (p[3] != '\0' && p[3] != '/')) return 0;
    int get = srv_is(q->method, "GET") || srv_is(q->method, "HEAD");
    if (srv_is(p, "/v2") || srv_is(p, "/v2/")) {
        if (!get) return srv_kserve_405(o, "GET"), 1;
        srv_buf b = {0};
        srv_buf_puts(&b, "{\"name\":\"tensord\",\"version\":\"" TENSORD_VERSION "\",\"extensions\":"
                         "[\"binary_tensor_data\",\"model_repository\"]}");
        srv_reply_buf(o, 200, &b);
        return 1;
    }
    if (srv_is(p, "/v2/health/live") || srv_is(p, "/v2/health/ready")) {
        if (!get) return srv_kserve_405(o, "GET"), 1;
        int ok = p[11] == 'l' || srv_registry_ready(q->r->reg);
        if (ok) srv_reply_text(o, 200, NULL, 0, "application/json");
        else srv_reply_error(o, 503, "not all models are ready");
        return 1;
    }
    if (srv_is(p, "/v2/repository/index")) {
        if (!srv_is(q->method, "POST")) return srv_kserve_405(o, "POST"), 1;
        srv_kserve_index(q, o);
        return 1;
    }
    if (strncmp(p, "/v2/models/", 11) == 0) {
        srv_kserve_models(q, p + 11, o);
        return 1;
    }
    return 0;
}
