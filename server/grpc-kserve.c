/* grpc-kserve.c - KServe v2's inference.GRPCInferenceService as Triton serves it: ServerLive, ServerReady,
 * ModelReady, ServerMetadata, ModelMetadata, ModelInfer, and Triton's repository extension (RepositoryIndex,
 * RepositoryModelLoad, RepositoryModelUnload). The same answers as the REST /v2 routes (rest-kserve.c,
 * rest-repo.c), in protobuf.
 *
 * ModelInfer: inputs as typed `contents` or `raw_input_contents` (one entry per input, in order); replies carry
 * every output (or the requested ones) in raw_output_contents, as Triton does. model_version "" is the highest
 * available version. Repository load/unload need --model_control_mode=explicit (else UNAVAILABLE, Triton's
 * words), the admin token when one is configured (metadata "authorization: Bearer <token>"), and run on a worker:
 * a load returns once its loads ended.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpc-decode.h"
#include "grpc-impl.h"
#include "kserve.pb-c.h"

/* "" -> 0 (the highest available), else a positive decimal version; -1 when invalid. */
static int64_t kv_version(const char *s) {
    if (!s || !*s) return 0;
    int64_t v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9' || v > (INT64_C(1000000000000000000) - 9) / 10) return -1;
        v = v * 10 + (*p - '0');
    }
    return v > 0 ? v : -1;
}

/* Name and version of a request, checked; else answers the call and returns -1. */
static int kv_target(srv_grpc_call *c, const char *name, const char *version, int64_t *ver, const char *api) {
    srv_error err = {0};
    if (!name || !srv_name_valid(name)) srv_err(&err, SRV_INVALID_ARGUMENT, "invalid model name '%.200s'", name ? name : "");
    else if ((*ver = kv_version(version)) < 0)
        srv_err(&err, SRV_INVALID_ARGUMENT, "invalid model version '%.64s': must be a positive integer", version);
    if (err.code == SRV_OK) return 0;
    if (api) srv_grpc_record(c, "", 0, api, err.code);
    srv_grpc_reply_err(c, &err);
    return -1;
}

#define KV_UNPACK(type, desc, var, limit)                                                                        \
    srv_error err = {0};                                                                                         \
    type *var = (type *)srv_grpc_unpack(&desc, msg, len, limit, &err);                                           \
    if (!var) {                                                                                                  \
        srv_grpc_reply_err(c, &err);                                                                             \
        return;                                                                                                  \
    }

static void kv_live(srv_grpc_call *c, const uint8_t *msg, size_t len) {
    KV_UNPACK(Inference__ServerLiveRequest, inference__server_live_request__descriptor, rq, 1 << 16);
    Inference__ServerLiveResponse r = INFERENCE__SERVER_LIVE_RESPONSE__INIT;
    r.live = srv_registry_live(c->g->reg, NULL, 0); /* 0 once a version lost every device it runs on */
    srv_grpc_reply(c, SRV_OK, NULL, &r.base);
    protobuf_c_message_free_unpacked(&rq->base, NULL);
}

static void kv_ready(srv_grpc_call *c, const uint8_t *msg, size_t len) {
    KV_UNPACK(Inference__ServerReadyRequest, inference__server_ready_request__descriptor, rq, 1 << 16);
    Inference__ServerReadyResponse r = INFERENCE__SERVER_READY_RESPONSE__INIT;
    r.ready = !atomic_load(&c->g->quiescing) && srv_registry_ready(c->g->reg);
    srv_grpc_reply(c, SRV_OK, NULL, &r.base);
    protobuf_c_message_free_unpacked(&rq->base, NULL);
}

static void kv_model_ready(srv_grpc_call *c, const uint8_t *msg, size_t len) {
    KV_UNPACK(Inference__ModelReadyRequest, inference__model_ready_request__descriptor, rq, 1 << 16);
    int64_t ver = 0;
    if (kv_target(c, rq->name, rq->version, &ver, NULL) == 0) {
        srv_version *v = srv_registry_acquire(c->g->reg, rq->name, ver, NULL, &err);
        Inference__ModelReadyResponse r = INFERENCE__MODEL_READY_RESPONSE__INIT;
        r.ready = v != NULL && !atomic_load(&c->g->quiescing);
        if (v) srv_version_release(v);
        srv_grpc_reply(c, SRV_OK, NULL, &r.base);
    }
    protobuf_c_message_free_unpacked(&rq->base, NULL);
}

static void kv_server_metadata(srv_grpc_call *c, const uint8_t *msg, size_t len) {
    static char *ext[] = {"binary_tensor_data", "classification", "model_configuration", "model_repository", "statistics"};
    KV_UNPACK(Inference__ServerMetadataRequest, inference__server_metadata_request__descriptor, rq, 1 << 16);
    Inference__ServerMetadataResponse r = INFERENCE__SERVER_METADATA_RESPONSE__INIT;
    r.name = (char *)"tensord";
    r.version = (char *)TENSORD_VERSION;
    r.n_extensions = sizeof ext / sizeof ext[0];
    r.extensions = ext;
    srv_grpc_reply(c, SRV_OK, NULL, &r.base);
    protobuf_c_message_free_unpacked(&rq->base, NULL);
}

typedef struct kv_io_out {
    Inference__ModelMetadataResponse__TensorMetadata tm;
    int64_t shape[ENG_MAX_DIMS];
} kv_io_out;

static void kv_ios(const srv_io *io, int n, kv_io_out *o, Inference__ModelMetadataResponse__TensorMetadata **p) {
    for (int i = 0; i < n; i++) {
        inference__model_metadata_response__tensor_metadata__init(&o[i].tm);
        o[i].tm.name = io[i].name;
        o[i].tm.datatype = (char *)srv_kserve_dtype(io[i].dtype);
        if (io[i].ndim < 0) {
            o[i].shape[0] = -1;
            o[i].tm.n_shape = 1;
        } else {
            for (int d = 0; d < io[i].ndim; d++) o[i].shape[d] = io[i].dims[d] < 0 ? -1 : io[i].dims[d];
            o[i].tm.n_shape = (size_t)io[i].ndim;
        }
        o[i].tm.shape = o[i].shape;
        p[i] = &o[i].tm;
    }
}

static void kv_model_metadata(srv_grpc_call *c, const uint8_t *msg, size_t len) {
    KV_UNPACK(Inference__ModelMetadataRequest, inference__model_metadata_request__descriptor, rq, 1 << 16);
    int64_t ver = 0;
    if (kv_target(c, rq->name, rq->version, &ver, "metadata") != 0) {
        protobuf_c_message_free_unpacked(&rq->base, NULL);
        return;
    }
    srv_version *v = srv_registry_acquire(c->g->reg, rq->name, ver, NULL, &err);
    if (!v) {
        srv_grpc_record(c, rq->name, 0, "metadata", err.code);
        srv_grpc_reply_err(c, &err);
        protobuf_c_message_free_unpacked(&rq->base, NULL);
        return;
    }
    const srv_version_info *info = srv_version_get_info(v);
    srv_version_status *st = NULL;
    int ns = 0, nv = 0;
    if (ver == 0 && srv_registry_status(c->g->reg, rq->name, 0, NULL, &st, &ns, &err) != SRV_OK) ns = 0;
    char (*vs)[24] = calloc((size_t)(ns + 1), sizeof *vs);
    char **vsp = calloc((size_t)(ns + 1), sizeof *vsp);
    int nio = info->ninputs + info->noutputs;
    kv_io_out *io = calloc((size_t)(nio ? nio : 1), sizeof *io);
    Inference__ModelMetadataResponse__TensorMetadata **iop = calloc((size_t)(nio ? nio : 1), sizeof *iop);
    if (!vs || !vsp || !io || !iop) {
        srv_grpc_record(c, rq->name, info->version, "metadata", SRV_RESOURCE_EXHAUSTED);
        srv_grpc_reply(c, SRV_RESOURCE_EXHAUSTED, "out of memory", NULL);
    } else {
        if (ver > 0) snprintf(vs[nv++], sizeof vs[0], "%lld", (long long)info->version);
        for (int i = 0; i < ns; i++)
            if (st[i].state == SRV_STATE_AVAILABLE) snprintf(vs[nv++], sizeof vs[0], "%lld", (long long)st[i].version);
        for (int i = 0; i < nv; i++) vsp[i] = vs[i];
        kv_ios(info->inputs, info->ninputs, io, iop);
        kv_ios(info->outputs, info->noutputs, io + info->ninputs, iop + info->ninputs);
        Inference__ModelMetadataResponse r = INFERENCE__MODEL_METADATA_RESPONSE__INIT;
        r.name = rq->name;
        r.n_versions = (size_t)nv;
        r.versions = vsp;
        r.platform = (char *)"onnxruntime_onnx";
        r.n_inputs = (size_t)info->ninputs;
        r.inputs = iop;
        r.n_outputs = (size_t)info->noutputs;
        r.outputs = iop + info->ninputs;
        srv_grpc_record(c, rq->name, info->version, "metadata", SRV_OK);
        srv_grpc_reply(c, SRV_OK, NULL, &r.base);
    }
    free(vs);
    free(vsp);
    free(io);
    free(iop);
    srv_status_free(st, ns);
    srv_version_release(v);
    protobuf_c_message_free_unpacked(&rq->base, NULL);
}

/* ---- ModelInfer ---- */

typedef struct kv_call {
    srv_grpc_call *c;
    Inference__ModelInferRequest *rq;
    char model[256];
    grpc_byte_buffer *reply;
} kv_call;

static srv_code kv_decode(void *u, const srv_version_info *info, srv_tensors *in, srv_error *err) {
    kv_call *k = u;
    return srv_grpc_infer_decode(k->rq, info, k->c->g->max_recv, in, err);
}

static srv_code kv_encode(void *u, const srv_version_info *info, const srv_tensors *in, const srv_tensors *out,
                          srv_error *err) {
    kv_call *k = u;
    const Inference__ModelInferRequest *rq = k->rq;
    (void)in;
    for (size_t i = 0; i < rq->n_outputs; i++) {
        const Inference__ModelInferRequest__InferRequestedOutputTensor *o = rq->outputs[i];
        if (srv_tensors_find(out, o->name ? o->name : "") < 0)
            return srv_err(err, SRV_INVALID_ARGUMENT, "unexpected inference output '%.200s' for model '%s'",
                           o->name ? o->name : "", info->model);
        for (size_t p = 0; p < o->n_parameters; p++)
            if (o->parameters[p]->key && strcmp(o->parameters[p]->key, "classification") == 0)
                return srv_err(err, SRV_UNIMPLEMENTED, "output '%s': the classification parameter is served over REST "
                               "(/v2/models/%s/infer) only", o->name, info->model);
    }
    int n = rq->n_outputs ? (int)rq->n_outputs : out->n;
    Inference__ModelInferResponse__InferOutputTensor *ot = calloc((size_t)(n ? n : 1), sizeof *ot);
    Inference__ModelInferResponse__InferOutputTensor **otp = calloc((size_t)(n ? n : 1), sizeof *otp);
    ProtobufCBinaryData *raw = calloc((size_t)(n ? n : 1), sizeof *raw);
    srv_code rc = ot && otp && raw ? SRV_OK : srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    for (int i = 0; i < n && rc == SRV_OK; i++) {
        int j = rq->n_outputs ? srv_tensors_find(out, rq->outputs[i]->name) : i;
        const eng_tensor *t = &out->t[j];
        if (eng_dtype_size(t->dtype) == 0) {
            rc = srv_err(err, SRV_UNIMPLEMENTED, "output '%s': dtype %s cannot be sent", out->names[j],
                         eng_dtype_name(t->dtype));
            break;
        }
        inference__model_infer_response__infer_output_tensor__init(&ot[i]);
        ot[i].name = out->names[j];
        ot[i].datatype = (char *)srv_kserve_dtype(t->dtype);
        ot[i].n_shape = (size_t)t->ndim;
        ot[i].shape = (int64_t *)t->dims;
        otp[i] = &ot[i];
        raw[i] = srv_pb_bytes(t->data, eng_tensor_nbytes(t));
    }
    if (rc == SRV_OK) {
        char ver[24];
        snprintf(ver, sizeof ver, "%lld", (long long)info->version);
        Inference__ModelInferResponse r = INFERENCE__MODEL_INFER_RESPONSE__INIT;
        r.model_name = (char *)info->model;
        r.model_version = ver;
        r.id = rq->id ? rq->id : (char *)"";
        r.n_outputs = (size_t)n;
        r.outputs = otp;
        r.n_raw_output_contents = (size_t)n;
        r.raw_output_contents = raw;
        if (!(k->reply = srv_grpc_pack(&r.base, err))) rc = err->code;
    }
    free(ot);
    free(otp);
    free(raw);
    return rc;
}

static void kv_done(void *u, srv_code code, const srv_error *err) {
    kv_call *k = u;
    if (code == SRV_OK) srv_grpc_reply_bytes(k->c, SRV_OK, NULL, k->reply);
    else {
        if (k->reply) grpc_byte_buffer_destroy(k->reply);
        srv_grpc_reply_err(k->c, err);
    }
    protobuf_c_message_free_unpacked(&k->rq->base, NULL);
    free(k);
}

static void kv_async(void *u) { srv_grpc_going_async(((kv_call *)u)->c); }

static const char *kv_header(void *u, const char *name, char *buf, size_t cap) {
    return srv_grpc_header(((kv_call *)u)->c, name, buf, cap);
}

static const srv_infer_ops kv_ops = {.decode = kv_decode, .encode = kv_encode, .done = kv_done,
                                     .going_async = kv_async, .header = kv_header};

static void kv_infer(srv_grpc_call *c, const uint8_t *msg, size_t len) {
    srv_error err = {0};
    Inference__ModelInferRequest *rq = (Inference__ModelInferRequest *)srv_grpc_unpack(
        &inference__model_infer_request__descriptor, msg, len, srv_grpc_decode_limit(c->g), &err);
    if (!rq) {
        srv_grpc_record(c, "", 0, "infer", err.code);
        srv_grpc_reply_err(c, &err);
        return;
    }
    int64_t ver = 0;
    if (kv_target(c, rq->model_name, rq->model_version, &ver, "infer") != 0) {
        protobuf_c_message_free_unpacked(&rq->base, NULL);
        return;
    }
    kv_call *k = calloc(1, sizeof *k);
    if (!k) {
        protobuf_c_message_free_unpacked(&rq->base, NULL);
        srv_grpc_reply(c, SRV_RESOURCE_EXHAUSTED, "out of memory", NULL);
        return;
    }
    k->c = c;
    k->rq = rq;
    snprintf(k->model, sizeof k->model, "%s", rq->model_name);
    srv_infer_req ir = {.model = k->model, .version = ver, .api = "infer", .protocol = "grpc", .t0_us = c->t0_us,
                        .deadline_us = c->deadline_us, .may_block = 0, .cancel = &c->gone};
    srv_infer_submit(c->g->inf, &ir, &kv_ops, k);
}

/* ---- the repository extension ---- */

static void kv_index(srv_grpc_call *c, const uint8_t *msg, size_t len) {
    KV_UNPACK(Inference__RepositoryIndexRequest, inference__repository_index_request__descriptor, rq, 1 << 16);
    srv_version_status *st = NULL;
    int n = 0;
    if (srv_registry_status(c->g->reg, NULL, 0, NULL, &st, &n, &err) != SRV_OK) {
        srv_grpc_reply_err(c, &err);
        protobuf_c_message_free_unpacked(&rq->base, NULL);
        return;
    }
    Inference__RepositoryIndexResponse__ModelIndex *mi = calloc((size_t)(n ? n : 1), sizeof *mi);
    Inference__RepositoryIndexResponse__ModelIndex **mip = calloc((size_t)(n ? n : 1), sizeof *mip);
    char (*vs)[24] = calloc((size_t)(n ? n : 1), sizeof *vs);
    if (!mi || !mip || !vs) {
        srv_grpc_reply(c, SRV_RESOURCE_EXHAUSTED, "out of memory", NULL);
    } else {
        int k = 0;
        for (int i = 0; i < n; i++) {
            if (rq->ready && st[i].state != SRV_STATE_AVAILABLE) continue;
            inference__repository_index_response__model_index__init(&mi[k]);
            snprintf(vs[k], sizeof vs[k], "%lld", (long long)st[i].version);
            mi[k].name = st[i].model ? st[i].model : (char *)"";
            mi[k].version = vs[k];
            mi[k].state = (char *)srv_kserve_state(st[i].state);
            mi[k].reason = st[i].error_message ? st[i].error_message : (char *)"";
            mip[k] = &mi[k];
            k++;
        }
        Inference__RepositoryIndexResponse r = INFERENCE__REPOSITORY_INDEX_RESPONSE__INIT;
        r.n_models = (size_t)k;
        r.models = mip;
        srv_grpc_reply(c, SRV_OK, NULL, &r.base);
    }
    free(mi);
    free(mip);
    free(vs);
    srv_status_free(st, n);
    protobuf_c_message_free_unpacked(&rq->base, NULL);
}

typedef struct kv_repo {
    char model[256];
    int unload;
} kv_repo;

static void kv_repo_run(srv_grpc_call *c) {
    kv_repo *j = c->u;
    srv_error err = {0};
    srv_code rc = j->unload ? srv_registry_unload_model(c->g->reg, j->model, &err)
                            : srv_registry_load_model(c->g->reg, j->model, &err);
    if (rc == SRV_OK && j->unload) {
        Inference__RepositoryModelUnloadResponse r = INFERENCE__REPOSITORY_MODEL_UNLOAD_RESPONSE__INIT;
        srv_grpc_reply(c, SRV_OK, NULL, &r.base);
    } else if (rc == SRV_OK) {
        Inference__RepositoryModelLoadResponse r = INFERENCE__REPOSITORY_MODEL_LOAD_RESPONSE__INIT;
        srv_grpc_reply(c, SRV_OK, NULL, &r.base);
    } else {
        srv_grpc_reply_err(c, &err);
    }
    free(j);
}

/* Load and unload requests share their fields (repository_name 1, model_name 2, parameters 3). */
static void kv_repo_call(srv_grpc_call *c, const uint8_t *msg, size_t len, int unload) {
    srv_error err = {0};
    if (!srv_grpc_authorized(c)) return;
    ProtobufCMessage *m = srv_grpc_unpack(unload ? &inference__repository_model_unload_request__descriptor
                                                 : &inference__repository_model_load_request__descriptor,
                                          msg, len, 1 << 20, &err);
    if (!m) {
        srv_grpc_reply_err(c, &err);
        return;
    }
    const char *name = unload ? ((Inference__RepositoryModelUnloadRequest *)m)->model_name
                              : ((Inference__RepositoryModelLoadRequest *)m)->model_name;
    if (!c->g->explicit_control) {
        srv_err(&err, SRV_UNAVAILABLE, "explicit model load / unload is not allowed if polling is enabled: start "
                "tensord with --model_control_mode=explicit to load and unload models on request");
    } else if (!name || !srv_name_valid(name)) {
        srv_err(&err, SRV_INVALID_ARGUMENT, "model name '%.200s' is invalid: use [A-Za-z0-9_.-]", name ? name : "");
    } else if (!unload) {
        const Inference__RepositoryModelLoadRequest *l = (const Inference__RepositoryModelLoadRequest *)m;
        for (size_t i = 0; i < l->n_parameters && err.code == SRV_OK; i++) {
            const char *key = l->parameters[i]->key ? l->parameters[i]->key : "";
            if (strcmp(key, "config") == 0 || strncmp(key, "file:", 5) == 0)
                srv_err(&err, SRV_INVALID_ARGUMENT, "model '%s': load parameter '%.200s' is not supported (the config "
                        "comes from --model_config_file, the files from the model's base path)", name, key);
        }
    }
    kv_repo *j = err.code == SRV_OK ? calloc(1, sizeof *j) : NULL;
    if (err.code == SRV_OK && !j) srv_err(&err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    if (err.code != SRV_OK || !j) {
        protobuf_c_message_free_unpacked(m, NULL);
        srv_grpc_reply_err(c, &err);
        return;
    }
    snprintf(j->model, sizeof j->model, "%s", name);
    j->unload = unload;
    protobuf_c_message_free_unpacked(m, NULL);
    c->u = j;
    srv_grpc_defer(c, kv_repo_run);
}

static void kv_load(srv_grpc_call *c, const uint8_t *msg, size_t len) { kv_repo_call(c, msg, len, 0); }
static void kv_unload(srv_grpc_call *c, const uint8_t *msg, size_t len) { kv_repo_call(c, msg, len, 1); }

const srv_grpc_method srv_grpc_kserve_methods[] = {
    {"/inference.GRPCInferenceService/ServerLive", kv_live, 0},
    {"/inference.GRPCInferenceService/ServerReady", kv_ready, 0},
    {"/inference.GRPCInferenceService/ModelReady", kv_model_ready, 0},
    {"/inference.GRPCInferenceService/ServerMetadata", kv_server_metadata, 0},
    {"/inference.GRPCInferenceService/ModelMetadata", kv_model_metadata, 0},
    {"/inference.GRPCInferenceService/ModelInfer", kv_infer, 0},
    {"/inference.GRPCInferenceService/RepositoryIndex", kv_index, 0},
    {"/inference.GRPCInferenceService/RepositoryModelLoad", kv_load, 0},
    {"/inference.GRPCInferenceService/RepositoryModelUnload", kv_unload, 0},
};
const int srv_grpc_kserve_nmethods = sizeof srv_grpc_kserve_methods / sizeof srv_grpc_kserve_methods[0];
