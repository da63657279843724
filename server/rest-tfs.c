/* rest-tfs.c - TF Serving's REST surface (/v1/models/...): model status, metadata, :predict, :classify,
 * :regress, with TF Serving's paths, bodies and error shape ({"error": "..."}).
 *
 * Routes (TF Serving's): GET  /v1/models/{m}[/versions/{n}|/labels/{l}][/metadata]
 *                        POST /v1/models/{m}[/versions/{n}|/labels/{l}]:(predict|classify|regress)
 * Names from the URL are validated (srv_name_valid) before anything else; versions are plain positive
 * integers. Inference requests hold exactly one registry reference from acquire to release.
 * Metrics: a request is recorded against the version that served it, before that version is released (so a
 * retired version's series, dropped with its last reference, are never re-created); one no version served is
 * recorded with version "" and model "" unless the model is configured. A version label keeps its name only
 * if the model configures it, else it is recorded as "unknown": URLs never add label values.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "json.h"
#include "rest-impl.h"

#define SRV_V1 "/v1/models"

typedef struct srv_tfs_route {
    char model[256];
    char label[256];
    int64_t version;   /* 0: none */
    int has_label;
    int metadata;
    const char *verb;  /* "predict", "classify", "regress" or NULL */
} srv_tfs_route;

/* 1: route parsed; 0: not a /v1/models route (404); -1: invalid name/version (400, message in err). */
static int srv_tfs_parse(const char *path, srv_tfs_route *rt, srv_error *err) {
    char segs[4][256], head[1024];
    memset(rt, 0, sizeof *rt);
    if (strncmp(path, SRV_V1 "/", sizeof SRV_V1) != 0) return 0;
    const char *rest = path + sizeof SRV_V1;
    const char *colon = strchr(rest, ':');
    size_t hl = colon ? (size_t)(colon - rest) : strlen(rest);
    if (hl >= sizeof head) {
        srv_err(err, SRV_INVALID_ARGUMENT, "invalid model path");
        return -1;
    }
    memcpy(head, rest, hl);
    head[hl] = '\0';
    if (colon) {
        const char *v = colon + 1;
        if (!strcmp(v, "predict") || !strcmp(v, "classify") || !strcmp(v, "regress")) rt->verb = v;
        else return 0;
    }
    int n = srv_rest_split(head, segs, 4);
    if (n < 1) return 0;
    if (!srv_name_valid(segs[0])) {
        srv_err(err, SRV_INVALID_ARGUMENT, "invalid model name in the URL");
        return -1;
    }
    memcpy(rt->model, segs[0], strlen(segs[0]) + 1); /* < 256 bytes (srv_rest_split) */
    int k = 1;
    if (n >= 3 && (!strcmp(segs[1], "versions") || !strcmp(segs[1], "labels"))) {
        if (segs[1][0] == 'v') {
            rt->version = srv_rest_version(segs[2]);
            if (rt->version <= 0) {
                srv_err(err, SRV_INVALID_ARGUMENT, "invalid version '%.64s': must be a positive integer", segs[2]);
                return -1;
            }
        } else {
            if (!srv_name_valid(segs[2])) {
                srv_err(err, SRV_INVALID_ARGUMENT, "invalid version label in the URL");
                return -1;
            }
            memcpy(rt->label, segs[2], strlen(segs[2]) + 1);
            rt->has_label = 1;
        }
        k = 3;
    }
    if (k < n && !strcmp(segs[k], "metadata") && !rt->verb) {
        rt->metadata = 1;
        k++;
    }
    return k == n ? 1 : 0;
}

/* The label metrics may show: NULL when the URL named none; the label when it is configured for the model
 * (served: the request resolved it, so it is), else "unknown". */
static const char *srv_tfs_label(const srv_rest_req *q, const srv_tfs_route *rt, int served) {
    if (!rt->has_label) return NULL;
    return served || srv_registry_has_label(q->r->reg, rt->model, rt->label) ? rt->label : "unknown";
}

/* A non-inference request: version > 0 is the version that served it (0: none). */
static void srv_tfs_record(const srv_rest_req *q, const srv_tfs_route *rt, int64_t version, const char *api,
                           srv_code code) {
    int served = version > 0 || code == SRV_OK;
    const char *model = srv_registry_metrics_model(q->r->reg, rt->model, served, code);
    srv_metrics_request(q->r->m, model, version, srv_tfs_label(q, rt, served), api, "rest", code, srv_now_us() - q->t0_us);
}

static void srv_tfs_status(const srv_rest_req *q, const srv_tfs_route *rt, srv_reply *o) {
    srv_error err = {0};
    srv_version_status *st = NULL;
    int n = 0;
    srv_code rc = srv_registry_status(q->r->reg, rt->model, rt->version, rt->has_label ? rt->label : NULL, &st, &n, &err);
    if (rc != SRV_OK) {
        srv_reply_code(o, &err);
    } else {
        srv_buf b = {0};
        srv_buf_puts(&b, "{\"model_version_status\":[");
        for (int i = 0; i < n; i++) {
            srv_buf_printf(&b, "%s{\"version\":\"%lld\",\"state\":\"%s\",\"status\":{\"error_code\":\"%s\","
                               "\"error_message\":",
                           i ? "," : "", (long long)st[i].version, srv_state_name(st[i].state),
                           srv_code_name(st[i].error_code));
            srv_buf_json_str(&b, st[i].error_message ? st[i].error_message : "");
            srv_buf_puts(&b, "}}");
        }
        srv_buf_puts(&b, "]}");
        srv_reply_buf(o, 200, &b);
    }
    srv_status_free(st, n);
    srv_tfs_record(q, rt, 0, "status", rc);
}

static void srv_tfs_io_json(srv_buf *b, const srv_io *io, int nio) {
    for (int i = 0; i < nio; i++) {
        if (i) srv_buf_puts(b, ",");
        srv_buf_json_str(b, io[i].name);
        srv_buf_printf(b, ":{\"dtype\":\"%s\",\"tensor_shape\":{\"dim\":[", srv_tf_dtype(io[i].dtype));
        for (int d = 0; d < io[i].ndim; d++)
            srv_buf_printf(b, "%s{\"size\":\"%lld\",\"name\":\"\"}", d ? "," : "", (long long)io[i].dims[d]);
        srv_buf_printf(b, "],\"unknown_rank\":%s},\"name\":", io[i].ndim < 0 ? "true" : "false");
        srv_buf_json_str(b, io[i].onnx_name ? io[i].onnx_name : io[i].name);
        srv_buf_puts(b, "}");
    }
}

static void srv_tfs_metadata(const srv_rest_req *q, const srv_tfs_route *rt, srv_reply *o) {
    srv_error err = {0};
    srv_version *v = srv_registry_acquire(q->r->reg, rt->model, rt->version, rt->has_label ? rt->label : NULL, &err);
    if (!v) {
        srv_reply_code(o, &err);
        srv_tfs_record(q, rt, 0, "metadata", err.code);
        return;
    }
    const srv_version_info *info = srv_version_get_info(v);
    int64_t ver = info->version;
    srv_buf b = {0};
    srv_buf_puts(&b, "{\"model_spec\":{\"name\":");
    srv_buf_json_str(&b, rt->model);
    srv_buf_printf(&b, ",\"signature_name\":\"\",\"version\":\"%lld\"},\"metadata\":{\"signature_def\":{"
                       "\"signature_def\":{\"serving_default\":{\"inputs\":{",
                   (long long)ver);
    srv_tfs_io_json(&b, info->inputs, info->ninputs);
    srv_buf_puts(&b, "},\"outputs\":{");
    srv_tfs_io_json(&b, info->outputs, info->noutputs);
    srv_buf_puts(&b, "},\"method_name\":\"tensorflow/serving/predict\"}}}}}");
    srv_tfs_record(q, rt, ver, "metadata", SRV_OK);
    srv_version_release(v);
    srv_reply_buf(o, 200, &b);
}

/* The second half of an inference: predict (unless `done`: out already holds the result of an asynchronous
 * predict, rc its status) -> encode -> record -> release v -> reply. Takes in, out and v. input_ns: the decode
 * time; dec_end_ns: when decoding ended (srv_metrics_clock_ns), where the queue time starts. */
/* One :predict / :classify / :regress through the shared request path (infer.h): this file only decodes and
 * encodes. The state lives until done. */
typedef struct srv_tfs_call {
    srv_rest_req q;    /* its strings and body belong to the request, which outlives the call */
    srv_tfs_route rt;
    srv_tfs_format fmt;
    char *body;        /* the encoded reply */
    size_t len;
    srv_reply *o;      /* the handler's reply, when done comes before srv_infer_submit returns */
    int async;
    int64_t version;   /* the version that answered (X-Model-Version) */
} srv_tfs_call;

static srv_code srv_tfs_call_decode(void *u, const srv_version_info *info, srv_tensors *in, srv_error *err) {
    srv_tfs_call *c = u;
    return !strcmp(c->rt.verb, "predict") ? srv_tfs_decode_predict(c->q.body, c->q.len, info, in, &c->fmt, err)
                                          : srv_tfs_decode_examples(c->q.body, c->q.len, info, in, err);
}

static srv_code srv_tfs_call_encode(void *u, const srv_version_info *info, const srv_tensors *in,
                                    const srv_tensors *out, srv_error *err) {
    srv_tfs_call *c = u;
    (void)in;
    const char *api = c->rt.verb;
    c->version = info->version;
    if (!strcmp(api, "predict")) c->body = srv_tfs_encode_predict(info, out, c->fmt, &c->len, err);
    else if (!strcmp(api, "classify")) c->body = srv_tfs_encode_classify(info, out, &c->len, err);
    else c->body = srv_tfs_encode_regress(info, out, &c->len, err);
    return c->body ? SRV_OK : err->code != SRV_OK ? err->code : SRV_INTERNAL;
}

static void srv_tfs_call_async(void *u) {
    srv_tfs_call *c = u;
    c->async = 1;
    srv_rest_async(c->q.cn);
}

static void srv_tfs_call_done(void *u, srv_code code, const srv_error *err) {
    srv_tfs_call *c = u;
    srv_reply r = {0};
    if (code == SRV_OK) srv_reply_text(&r, 200, c->body, c->len, "application/json");
    else srv_reply_code(&r, err);
    if (code == SRV_OK) r.model_version = c->version;
    if (c->async) srv_rest_async_reply(c->q.cn, &r);
    else *c->o = r;
    free(c);
}

static const srv_infer_ops srv_tfs_ops = {.decode = srv_tfs_call_decode, .encode = srv_tfs_call_encode,
                                          .done = srv_tfs_call_done, .going_async = srv_tfs_call_async,
                                          .header = srv_rest_infer_header};

static void srv_tfs_infer(const srv_rest_req *q, const srv_tfs_route *rt, srv_reply *o) {
    srv_tfs_call *c = malloc(sizeof *c);
    if (!c) {
        srv_reply_error(o, 500, "out of memory");
        return;
    }
    *c = (srv_tfs_call){.q = *q, .rt = *rt, .fmt = SRV_TFS_ROW, .o = o};
    srv_infer_req rq = {.model = c->rt.model, .version = c->rt.version, .label = c->rt.has_label ? c->rt.label : NULL,
                        .api = c->rt.verb, .t0_us = q->t0_us, .deadline_us = q->deadline_us, .may_block = q->may_block};
    if (!srv_infer_submit(q->r->inf, &rq, &srv_tfs_ops, c)) o->pending = 1;
}

int srv_rest_tfs(const srv_rest_req *q, srv_reply *o) {
    if (strncmp(q->path, "/v1/", 4) != 0) return 0;
    srv_tfs_route rt;
    srv_error err = {0};
    int p = srv_tfs_parse(q->path, &rt, &err);
    if (p < 0) {
        srv_reply_code(o, &err);
        return 1;
    }
    if (p == 0) return 0;
    int is_get = !strcmp(q->method, "GET") || !strcmp(q->method, "HEAD");
    if (rt.verb) {
        if (strcmp(q->method, "POST") != 0) {
            o->allow = "POST";
            srv_reply_error(o, 405, "method not allowed: use POST");
            return 1;
        }
        srv_tfs_infer(q, &rt, o);
        return 1;
    }
    if (!is_get) {
        o->allow = "GET";
        srv_reply_error(o, 405, "method not allowed: use GET");
        return 1;
    }
    if (rt.metadata) srv_tfs_metadata(q, &rt, o);
    else srv_tfs_status(q, &rt, o);
    return 1;
}
