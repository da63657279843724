/* rest-kserve.c - the KServe v2 protocol as Triton serves it (/v2...): server metadata, health, model
 * metadata and readiness, inference (JSON, the binary tensor data and classification extensions), model
 * configuration, statistics, repository index.
 *
 * Routes: GET /v2 | /v2/health/live | /v2/health/ready
 *         GET /v2/models/{m}[/versions/{v}] | .../ready | .../config | .../stats     POST .../infer
 *         GET /v2/models/stats
 *         POST /v2/repository/index
 * Names from the URL are validated before use; versions are plain positive integers. An inference holds
 * one registry reference from acquire to release on every path, and is recorded in metrics (with its
 * statistics: decode, queue, run, encode) before that release, against the version that served it; a
 * request no version served is recorded with version "" and model "" unless the model is configured.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "json.h"
#include "rest-impl.h"

#ifndef TENSORD_VERSION
#endif

static int srv_is(const char *a, const char *b) { return strcmp(a, b) == 0; }

static void srv_kserve_405(srv_reply *o, const char *allow) {
    char msg[64];
    snprintf(msg, sizeof msg, "method not allowed: use %s", allow);
    o->allow = allow;
    srv_reply_error(o, 405, msg);
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
        srv_metrics_request(q->r->m, srv_registry_metrics_model(q->r->reg, model, 0, err.code), 0, NULL, "metadata", "rest", err.code,
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
    srv_metrics_request(q->r->m, model, ver, NULL, "metadata", "rest", SRV_OK, srv_now_us() - q->t0_us);
    srv_version_release(v);
    srv_reply_buf(o, 200, &b);
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

/* One /infer through the shared request path (infer.h): this file only decodes and encodes. */
typedef struct srv_kserve_call {
    srv_rest_req q;    /* its strings and body belong to the request, which outlives the call */
    char model[256];
    int64_t hlen;      /* Inference-Header-Content-Length, -1: none */
    srv_kserve_req kr;
    char *body;        /* the encoded reply */
    size_t len, json_len;
    srv_reply *o;      /* the handler's reply, when done comes before srv_infer_submit returns */
    int async;
    int64_t version;   /* the version that answered (X-Model-Version) */
} srv_kserve_call;

static srv_code srv_kserve_call_decode(void *u, const srv_version_info *info, srv_tensors *in, srv_error *err) {
    srv_kserve_call *c = u;
    return srv_kserve_decode_infer(c->q.body, c->q.len, c->hlen >= 0 ? (size_t)c->hlen : c->q.len, info, in, &c->kr,
                                   err);
}

static srv_code srv_kserve_call_encode(void *u, const srv_version_info *info, const srv_tensors *in,
                                       const srv_tensors *out, srv_error *err) {
    srv_kserve_call *c = u;
    (void)in;
    c->kr.batch_first = srv_kserve_max_batch(info, srv_registry_batching(c->q.r->reg)) > 0;
    c->version = info->version;
    c->body = srv_kserve_encode_infer(info, out, &c->kr, &c->len, &c->json_len, err);
    return c->body ? SRV_OK : err->code != SRV_OK ? err->code : SRV_INTERNAL;
}

static void srv_kserve_call_async(void *u) {
    srv_kserve_call *c = u;
    c->async = 1;
    srv_rest_async(c->q.cn);
}

static void srv_kserve_call_done(void *u, srv_code code, const srv_error *err) {
    srv_kserve_call *c = u;
    srv_reply r = {0};
    if (code == SRV_OK && c->json_len < c->len) {
        srv_reply_text(&r, 200, c->body, c->len, "application/octet-stream");
        r.header_len = c->json_len;
    } else if (code == SRV_OK) {
        srv_reply_text(&r, 200, c->body, c->len, "application/json");
    } else {
        srv_reply_code(&r, err);
    }
    if (code == SRV_OK) r.model_version = c->version;
    srv_kserve_req_free(&c->kr);
    if (c->async) srv_rest_async_reply(c->q.cn, &r);
    else *c->o = r;
    free(c);
}

static const srv_infer_ops srv_kserve_ops = {.decode = srv_kserve_call_decode, .encode = srv_kserve_call_encode,
                                             .done = srv_kserve_call_done, .going_async = srv_kserve_call_async,
                                             .header = srv_rest_infer_header};

static void srv_kserve_infer(const srv_rest_req *q, const char *model, int64_t version, srv_reply *o) {
    int64_t hl = srv_kserve_hlen(q->header_len);
    if (hl == -2 || (hl >= 0 && (uint64_t)hl > q->len)) {
        srv_error err = {0};
        srv_err(&err, SRV_INVALID_ARGUMENT, "bad Inference-Header-Content-Length '%.32s' for a body of %zu bytes",
                q->header_len, q->len);
        srv_metrics_infer(q->r->m, srv_registry_metrics_model(q->r->reg, model, 0, err.code), 0, NULL, "infer", "rest", err.code,
                          srv_metrics_clock_ns() - q->t0_us * 1000, NULL);
        srv_reply_code(o, &err);
        return;
    }
    srv_kserve_call *c = malloc(sizeof *c);
    if (!c) {
        srv_reply_error(o, 500, "out of memory");
        return;
    }
    *c = (srv_kserve_call){.q = *q, .hlen = hl, .o = o};
    snprintf(c->model, sizeof c->model, "%s", model);
    srv_infer_req rq = {.model = c->model, .version = version, .api = "infer", .t0_us = q->t0_us,
                        .deadline_us = q->deadline_us, .may_block = q->may_block};
    if (!srv_infer_submit(q->r->inf, &rq, &srv_kserve_ops, c)) o->pending = 1;
}

static void srv_kserve_cfg_type(srv_buf *b, eng_dtype dt) {
    const char *n = srv_kserve_dtype(dt);
    srv_buf_printf(b, "\"TYPE_%s\"", strcmp(n, "BYTES") == 0 ? "STRING" : n);
}

/* Inputs or outputs as Triton's config lists them: dims without the batch dimension when the model has one
 * (max_batch_size > 0), -1 for a dynamic dim, [-1] for an unknown rank. */
static void srv_kserve_cfg_io(srv_buf *b, const srv_io *io, int n, int batched, int output) {
    for (int i = 0; i < n; i++) {
        srv_buf_puts(b, i ? ",{\"name\":" : "{\"name\":");
        srv_buf_json_str(b, io[i].name);
        srv_buf_puts(b, ",\"data_type\":");
        srv_kserve_cfg_type(b, io[i].dtype);
        srv_buf_puts(b, ",\"dims\":[");
        if (io[i].ndim < 0) srv_buf_puts(b, "-1");
        for (int d = batched && io[i].ndim > 0 ? 1 : 0, k = 0; d < io[i].ndim; d++, k++)
            srv_buf_printf(b, k ? ",%lld" : "%lld", (long long)(io[i].dims[d] < 0 ? -1 : io[i].dims[d]));
        srv_buf_puts(b, output ? "],\"label_filename\":\"\",\"is_shape_tensor\":false}"
                               : "],\"format\":\"FORMAT_NONE\",\"is_shape_tensor\":false,\"optional\":false}");
    }
}

/* Triton's instance_group list: one group per device the version's instances run on, in instance order: the CPU
 * as KIND_CPU, a device as KIND_GPU with gpus: [its index]; count is the instances on it (Triton's count per GPU). */
static void srv_kserve_cfg_groups(srv_buf *b, const char *model, const srv_version *v) {
    int n = srv_version_instances(v), ng = 0;
    for (int i = 0; i < n; i++) {
        int gpu, count = 0, seen = 0;
        const char *dev = srv_version_instance_device(v, i, &gpu);
        for (int j = 0; j < i && !seen; j++) seen = strcmp(srv_version_instance_device(v, j, NULL), dev) == 0;
        if (seen) continue;
        for (int j = i; j < n; j++) count += strcmp(srv_version_instance_device(v, j, NULL), dev) == 0;
        char ig[300];
        snprintf(ig, sizeof ig, "%s_%d", model, ng);
        srv_buf_puts(b, ng++ ? ",{\"name\":" : "{\"name\":");
        srv_buf_json_str(b, ig);
        if (gpu < 0) srv_buf_printf(b, ",\"kind\":\"KIND_CPU\",\"count\":%d,\"gpus\":[]}", count);
        else srv_buf_printf(b, ",\"kind\":\"KIND_GPU\",\"count\":%d,\"gpus\":[%d]}", count, gpu);
    }
}

/* GET /v2/models/{m}[/versions/{v}]/config: the served version's configuration as Triton's JSON. */
static void srv_kserve_config(const srv_rest_req *q, const char *model, int64_t version, srv_reply *o) {
    srv_error err = {0};
    srv_version *v = srv_registry_acquire(q->r->reg, model, version, NULL, &err);
    if (!v) {
        srv_reply_code(o, &err);
        return;
    }
    const srv_version_info *info = srv_version_get_info(v);
    const srv_batch_opts *bo = srv_registry_batching(q->r->reg);
    int64_t mb = srv_kserve_max_batch(info, bo);
    srv_buf b = {0};
    srv_buf_puts(&b, "{\"name\":");
    srv_buf_json_str(&b, model);
    srv_buf_printf(&b, ",\"platform\":\"onnxruntime_onnx\",\"backend\":\"onnxruntime\",\"max_batch_size\":%lld,"
                       "\"input\":[",
                   (long long)mb);
    srv_kserve_cfg_io(&b, info->inputs, info->ninputs, mb > 0, 0);
    srv_buf_puts(&b, "],\"output\":[");
    srv_kserve_cfg_io(&b, info->outputs, info->noutputs, mb > 0, 1);
    srv_buf_puts(&b, "]");
    if (bo)
        srv_buf_printf(&b, ",\"dynamic_batching\":{\"max_queue_delay_microseconds\":%lld,\"preserve_ordering\":false}",
                       (long long)bo->batch_timeout_micros);
    srv_buf_puts(&b, ",\"instance_group\":[");
    srv_kserve_cfg_groups(&b, model, v);
    srv_buf_puts(&b, "],\"default_model_filename\":\"model.onnx\",\"parameters\":{}}");
    srv_version_release(v);
    srv_reply_buf(o, 200, &b);
}

/* GET /v2/models[/{m}[/versions/{v}]]/stats (model NULL: every model): Triton's statistics extension, one entry
 * per AVAILABLE version, from the same store as /metrics (srv_metrics_stats_json). */
static void srv_kserve_stats(const srv_rest_req *q, const char *model, int64_t version, srv_reply *o) {
    srv_error err = {0};
    srv_version_status *st = NULL;
    int n = 0, k = 0;
    if (srv_registry_status(q->r->reg, model, version, NULL, &st, &n, &err) != SRV_OK) {
        srv_reply_code(o, &err);
        return;
    }
    srv_buf b = {0};
    srv_buf_puts(&b, "{\"model_stats\":[");
    for (int i = 0; i < n; i++) { /* by model, versions highest first (srv_registry_status's order) */
        if (st[i].state != SRV_STATE_AVAILABLE) continue;
        if (k++) srv_buf_puts(&b, ",");
        srv_metrics_stats_json(q->r->m, st[i].model, st[i].version, &b);
    }
    srv_buf_puts(&b, "]}");
    if (version > 0 && k == 0) {
        srv_err(&err, SRV_UNAVAILABLE, "model '%s' version %lld is not available (state %s)", model,
                (long long)version, srv_state_name(n ? st[0].state : SRV_STATE_UNKNOWN));
        srv_buf_free(&b);
        srv_reply_code(o, &err);
    } else {
        srv_reply_buf(o, 200, &b);
    }
    srv_status_free(st, n);
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
    if (srv_is(segs[k], "config") || srv_is(segs[k], "stats")) {
        if (!get) {
            srv_kserve_405(o, "GET");
            return;
        }
        if (segs[k][0] == 'c') srv_kserve_config(q, segs[0], version, o);
        else srv_kserve_stats(q, segs[0], version, o);
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
                         "[\"binary_tensor_data\",\"classification\",\"model_configuration\",\"model_repository\","
                         "\"statistics\"]}");
        srv_reply_buf(o, 200, &b);
        return 1;
    }
    if (srv_is(p, "/v2/health/live") || srv_is(p, "/v2/health/ready")) {
        if (!get) return srv_kserve_405(o, "GET"), 1;
        /* a device lost to a sticky error with a version left on nothing else: neither live nor ready (only a
         * restart cures a corrupted CUDA context, and a Kubernetes liveness probe restarts the pod) */
        char why[SRV_ERR_MAX];
        if (!srv_registry_live(q->r->reg, why, sizeof why)) {
            char msg[SRV_ERR_MAX + 64];
            snprintf(msg, sizeof msg, "not live: %s", why);
            srv_reply_error(o, 503, msg);
        } else if (p[11] == 'l' || srv_registry_ready(q->r->reg)) {
            srv_reply_text(o, 200, NULL, 0, "application/json");
        } else {
            srv_reply_error(o, 503, "not all models are ready");
        }
        return 1;
    }
    if (srv_is(p, "/v2/repository/index")) {
        if (!srv_is(q->method, "POST")) return srv_kserve_405(o, "POST"), 1;
        srv_kserve_index(q, o);
        return 1;
    }
    if (srv_is(p, "/v2/models/stats")) { /* every model's (a model named "stats" keeps its other routes) */
        if (!get) return srv_kserve_405(o, "GET"), 1;
        srv_kserve_stats(q, NULL, 0, o);
        return 1;
    }
    if (strncmp(p, "/v2/models/", 11) == 0) {
        srv_kserve_models(q, p + 11, o);
        return 1;
    }
    return 0;
}
