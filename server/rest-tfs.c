/* rest-tfs.c - TF Serving's REST surface (/v1/models/...): model status, metadata, :predict, :classify,
 * :regress, with TF Serving's paths, bodies and error shape ({"error": "..."}).
 *
 * Routes (TF Serving's): GET  /v1/models/{m}[/versions/{n}|/labels/{l}][/metadata]
 *                        POST /v1/models/{m}[/versions/{n}|/labels/{l}]:(predict|classify|regress)
 * Names from the URL are validated (srv_name_valid) before anything else; versions are plain positive
 * integers. Inference requests hold exactly one registry reference from acquire to release.
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

static void srv_tfs_record(const srv_rest_req *q, const srv_tfs_route *rt, int64_t version, const char *api,
                           srv_code code) {
    /* A name that matched nothing is not recorded verbatim: clients choose it (metrics cardinality). */
    const char *model = code == SRV_NOT_FOUND && version <= 0 ? "" : rt->model;
    srv_metrics_request(q->r->m, model, version > 0 ? version : rt->version, rt->has_label ? rt->label : NULL, api,
                        code, srv_now_us() - q->t0_us);
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
    srv_version_release(v);
    srv_reply_buf(o, 200, &b);
    srv_tfs_record(q, rt, ver, "metadata", SRV_OK);
}

/* The second half of an inference: predict (unless `done`: out already holds the result of an asynchronous
 * predict, rc its status) -> encode -> release v -> reply -> record. Takes in, out and v. */
static void srv_tfs_finish(const srv_rest_req *q, const srv_tfs_route *rt, srv_version *v, srv_tensors *in,
                           srv_tensors *done, srv_tfs_format fmt, srv_code rc, srv_error *err, srv_reply *o) {
    const char *api = rt->verb;
    int64_t ver = 0;
    char *body = NULL;
    size_t len = 0;
    srv_tensors local = {0}, *outp = done ? done : &local;
    if (v) {
        const srv_version_info *info = srv_version_get_info(v);
        ver = info->version;
        if (rc == SRV_OK && !done) rc = srv_version_predict(v, in, outp, q->deadline_us, err);
        if (rc == SRV_OK) {
            if (!strcmp(api, "predict")) body = srv_tfs_encode_predict(info, outp, fmt, &len, err);
            else if (!strcmp(api, "classify")) body = srv_tfs_encode_classify(info, outp, &len, err);
            else body = srv_tfs_encode_regress(info, outp, &len, err);
        }
        srv_tensors_free(in);
        srv_tensors_free(outp);
        srv_version_release(v);
    }
    if (body) {
        err->code = SRV_OK;
        srv_reply_text(o, 200, body, len, "application/json");
    } else {
        if (err->code == SRV_OK) srv_err(err, SRV_INTERNAL, "request failed");
        srv_reply_code(o, err);
    }
    srv_tfs_record(q, rt, ver, api, err->code);
}

typedef struct srv_tfs_job { /* q's strings and rt.verb point into the request, which outlives the job */
    srv_rest_job base;
    srv_rest_req q;
    srv_tfs_route rt;
    srv_version *v;
    srv_tensors in, out;
    srv_tfs_format fmt;
} srv_tfs_job;

static void srv_tfs_job_run(srv_rest_job *job, srv_reply *o) {
    srv_tfs_job *j = (srv_tfs_job *)job;
    srv_error err = {0};
    srv_tfs_finish(&j->q, &j->rt, j->v, &j->in, NULL, j->fmt, SRV_OK, &err, o);
    free(j);
}

static void srv_tfs_job_done(void *arg, srv_code rc, const srv_error *e) {
    srv_tfs_job *j = arg;
    srv_error err = {0};
    if (rc != SRV_OK) err = *e;
    void (*complete)(void *) = j->base.complete;
    void *carg = j->base.carg;
    srv_tfs_finish(&j->q, &j->rt, j->v, &j->in, &j->out, j->fmt, rc, &err, j->base.o);
    free(j);
    complete(carg);
}

static int srv_tfs_job_start(srv_rest_job *job) {
    srv_tfs_job *j = (srv_tfs_job *)job;
    return srv_version_predict_async(j->v, &j->in, &j->out, j->q.deadline_us, srv_tfs_job_done, j);
}

/* acquire -> decode -> (here, or on a worker when it may take long) predict -> encode -> release. */
static void srv_tfs_infer(const srv_rest_req *q, const srv_tfs_route *rt, srv_reply *o) {
    srv_error err = {0};
    srv_tensors in = {0};
    srv_tfs_format fmt = SRV_TFS_ROW;
    srv_code rc = SRV_OK;
    srv_version *v = srv_registry_acquire(q->r->reg, rt->model, rt->version, rt->has_label ? rt->label : NULL, &err);
    if (v) {
        const srv_version_info *info = srv_version_get_info(v);
        rc = !strcmp(rt->verb, "predict") ? srv_tfs_decode_predict(q->body, q->len, info, &in, &fmt, &err)
                                          : srv_tfs_decode_examples(q->body, q->len, info, &in, &err);
        if (rc == SRV_OK && !srv_rest_quick(q, v, &in)) {
            srv_tfs_job *j = malloc(sizeof *j);
            if (j) {
                *j = (srv_tfs_job){.base = {.run = srv_tfs_job_run, .start = srv_tfs_job_start}, .q = *q, .rt = *rt,
                                   .v = v, .in = in, .fmt = fmt};
                j->q.defer = NULL;
                *q->defer = &j->base;
                return;
            }
        }
    }
    srv_tfs_finish(q, rt, v, &in, NULL, fmt, rc, &err, o);
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
