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

/* The model name metrics may show for a request no version served: a configured model's, else "". */
static const char *srv_kserve_known(const srv_rest_req *q, const char *model, srv_code code) {
    return code != SRV_NOT_FOUND && srv_registry_has_model(q->r->reg, model) ? model : "";
}

static void srv_kserve_metadata(const srv_rest_req *q, const char *model, int64_t version, srv_reply *o) {
    srv_error err = {0};
    srv_version *v = srv_registry_acquire(q->r->reg, model, version, NULL, &err);
    if (!v) {
        srv_reply_code(o, &err);
        srv_metrics_request(q->r->m, srv_kserve_known(q, model, err.code), 0, NULL, "metadata", err.code,
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
    srv_metrics_request(q->r->m, model, ver, NULL, "metadata", SRV_OK, srv_now_us() - q->t0_us);
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

/* Rows of a request for inference_count: dim 0 of its first input when the model has a batch dimension. */
static int64_t srv_kserve_rows(const srv_tensors *in, int64_t max_batch) {
    return max_batch > 0 && in->n > 0 && in->t[0].ndim >= 1 && in->t[0].dims[0] > 0 ? in->t[0].dims[0] : 1;
}

/* The second half of an inference: predict (unless `done`: out already holds the result of an asynchronous
 * predict, rc its status) -> encode -> record -> release v -> reply. Takes in, out, kr and v. input_ns: the
 * decode time; dec_end_ns: when decoding ended (srv_metrics_clock_ns), where the queue time starts. */
static void srv_kserve_finish(const srv_rest_req *q, const char *model, srv_version *v, srv_tensors *in,
                              srv_tensors *done, srv_kserve_req *kr, srv_code rc, srv_error *err, int64_t input_ns,
                              int64_t dec_end_ns, srv_reply *o) {
    srv_tensors local = {0}, *outp = done ? done : &local;
    char *body = NULL;
    size_t len = 0, json_len = 0;
    if (v) {
        const srv_version_info *info = srv_version_get_info(v);
        srv_infer_times tm = {.input_ns = input_ns};
        if (rc == SRV_OK && !done) rc = srv_version_predict(v, in, outp, q->deadline_us, err);
        if (rc == SRV_OK) {
            int64_t t1 = srv_metrics_clock_ns(); /* the encode below counts as output */
            srv_infer_times_run(&tm, dec_end_ns);
            int64_t mb = srv_kserve_max_batch(info, srv_registry_batching(q->r->reg));
            kr->batch_first = mb > 0;
            tm.rows = srv_kserve_rows(in, mb);
            body = srv_kserve_encode_infer(info, outp, kr, &len, &json_len, err);
            tm.output_ns += srv_metrics_clock_ns() - t1;
        }
        if (body) err->code = SRV_OK;
        else if (err->code == SRV_OK) srv_err(err, SRV_INTERNAL, "request failed");
        /* before the release: a retired version's series go with its last reference (srv_metrics_forget) */
        srv_metrics_infer(q->r->m, model, info->version, NULL, "infer", err->code,
                          srv_metrics_clock_ns() - q->t0_us * 1000, &tm);
        srv_tensors_free(in);
        srv_tensors_free(outp);
        srv_kserve_req_free(kr);
        srv_version_release(v);
    } else {
        if (err->code == SRV_OK) srv_err(err, SRV_INTERNAL, "request failed");
        srv_metrics_infer(q->r->m, srv_kserve_known(q, model, err->code), 0, NULL, "infer", err->code,
                          srv_metrics_clock_ns() - q->t0_us * 1000, NULL);
    }
    if (body && json_len < len) {
        srv_reply_text(o, 200, body, len, "application/octet-stream");
        o->header_len = json_len;
    } else if (body) {
        srv_reply_text(o, 200, body, len, "application/json");
    } else {
        srv_reply_code(o, err);
    }
}

typedef struct srv_kserve_job { /* q's strings and body belong to the request, which outlives the job */
    srv_rest_job base;
    srv_rest_req q;
    char model[256];
    srv_version *v;
    srv_tensors in, out;
    srv_kserve_req kr;
    int64_t input_ns, dec_end_ns;
} srv_kserve_job;

static void srv_kserve_job_run(srv_rest_job *job, srv_reply *o) {
    srv_kserve_job *j = (srv_kserve_job *)job;
    srv_error err = {0};
    srv_kserve_finish(&j->q, j->model, j->v, &j->in, NULL, &j->kr, SRV_OK, &err, j->input_ns, j->dec_end_ns, o);
    free(j);
}

static void srv_kserve_job_done(void *arg, srv_code rc, const srv_error *e) {
    srv_kserve_job *j = arg;
    srv_error err = {0};
    if (rc != SRV_OK) err = *e;
    void (*complete)(void *) = j->base.complete;
    void *carg = j->base.carg;
    srv_kserve_finish(&j->q, j->model, j->v, &j->in, &j->out, &j->kr, rc, &err, j->input_ns, j->dec_end_ns,
                      j->base.o);
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
    int64_t t0 = 0, t1 = 0;
    int64_t hl = srv_kserve_hlen(q->header_len);
    if (hl == -2 || (hl >= 0 && (uint64_t)hl > q->len)) {
        srv_err(&err, SRV_INVALID_ARGUMENT, "bad Inference-Header-Content-Length '%.32s' for a body of %zu bytes",
                q->header_len, q->len);
    } else if ((v = srv_registry_acquire(q->r->reg, model, version, NULL, &err))) {
        const srv_version_info *info = srv_version_get_info(v);
        t0 = srv_metrics_clock_ns();
        rc = srv_kserve_decode_infer(q->body, q->len, hl >= 0 ? (size_t)hl : q->len, info, &in, &kr, &err);
        t1 = srv_metrics_clock_ns();
        if (rc == SRV_OK && !srv_rest_quick(q, v, &in)) {
            srv_kserve_job *j = malloc(sizeof *j);
            if (j) {
                *j = (srv_kserve_job){.base = {.run = srv_kserve_job_run, .start = srv_kserve_job_start}, .q = *q,
                                      .v = v, .in = in, .kr = kr, .input_ns = t1 - t0, .dec_end_ns = t1};
                snprintf(j->model, sizeof j->model, "%s", model);
                j->q.defer = NULL;
                *q->defer = &j->base;
                return;
            }
        }
    }
    srv_kserve_finish(q, model, v, &in, NULL, &kr, rc, &err, t1 - t0, t1, o);
}

/* Triton's data_type names: "TYPE_" + the v2 datatype, BYTES being TYPE_STRING. */
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
    srv_buf_puts(&b, ",\"instance_group\":[{\"name\":");
    char ig[300];
    snprintf(ig, sizeof ig, "%s_0", model);
    srv_buf_json_str(&b, ig);
    srv_buf_puts(&b, ",\"kind\":\"KIND_CPU\",\"count\":1,\"gpus\":[]}],\"default_model_filename\":\"model.onnx\","
                     "\"parameters\":{}}");
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
