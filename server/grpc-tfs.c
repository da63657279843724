/* grpc-tfs.c - TF Serving's gRPC services: tensorflow.serving.PredictionService (Predict, GetModelMetadata,
 * Classify, Regress) and tensorflow.serving.ModelService (GetModelStatus, HandleReloadConfigRequest).
 *
 * Predict/Classify/Regress go through the shared request path (infer.h); this file decodes (grpc-decode.c) and
 * encodes. model_spec: name (validated like a URL's), version (google.protobuf.Int64Value, > 0) or
 * version_label, signature_name "" or "serving_default". Replies echo the model_spec of the version that
 * served. Outputs are TensorProtos with tensor_content, keyed by the signature's output names; output_filter
 * keeps the named ones (an unknown name is INVALID_ARGUMENT).
 * HandleReloadConfigRequest applies config.model_config_list as TF Serving does: the served set becomes that
 * list (models added, removed ones retired, policies and labels applied), and the call returns once the loads it
 * started ended; an error when a listed model has no version available then (its load error, naming it).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "grpc-decode.h"
#include "grpc-impl.h"
#include "json.h"
#include "log.h"
#include "tensorflow_serving.pb-c.h"
#include "wellknown.pb-c.h"

enum { TFS_PREDICT, TFS_CLASSIFY, TFS_REGRESS };
static const char *const tfs_api[] = {"predict", "classify", "regress"};

typedef struct tfs_spec {
    char model[256];
    char label[256];
    int64_t version;
    int has_label;
} tfs_spec;

static srv_code tfs_spec_parse(const Tensorflow__Serving__ModelSpec *ms, tfs_spec *s, srv_error *err) {
    memset(s, 0, sizeof *s);
    if (!ms || !ms->name || !*ms->name) return srv_err(err, SRV_INVALID_ARGUMENT, "model_spec.name is missing");
    if (!srv_name_valid(ms->name))
        return srv_err(err, SRV_INVALID_ARGUMENT, "invalid model name '%.200s': use [A-Za-z0-9_.-]", ms->name);
    snprintf(s->model, sizeof s->model, "%s", ms->name);
    if (ms->version_choice_case == TENSORFLOW__SERVING__MODEL_SPEC__VERSION_CHOICE_VERSION && ms->version) {
        if (ms->version->value <= 0)
            return srv_err(err, SRV_INVALID_ARGUMENT, "model '%s': version %lld is invalid: must be a positive integer",
                           s->model, (long long)ms->version->value);
        s->version = ms->version->value;
    } else if (ms->version_choice_case == TENSORFLOW__SERVING__MODEL_SPEC__VERSION_CHOICE_VERSION_LABEL) {
        if (!ms->version_label || !srv_name_valid(ms->version_label))
            return srv_err(err, SRV_INVALID_ARGUMENT, "model '%s': invalid version_label '%.200s'", s->model,
                           ms->version_label ? ms->version_label : "");
        snprintf(s->label, sizeof s->label, "%s", ms->version_label);
        s->has_label = 1;
    }
    return srv_signature_check(ms->signature_name, err);
}

/* The model_spec of a reply: name, the version that served, the signature. */
typedef struct tfs_spec_out {
    Tensorflow__Serving__ModelSpec spec;
    Google__Protobuf__Int64Value version;
} tfs_spec_out;

static Tensorflow__Serving__ModelSpec *tfs_spec_out_init(tfs_spec_out *o, const char *model, int64_t version) {
    tensorflow__serving__model_spec__init(&o->spec);
    google__protobuf__int64_value__init(&o->version);
    o->spec.name = (char *)model;
    o->version.value = version;
    o->spec.version_choice_case = TENSORFLOW__SERVING__MODEL_SPEC__VERSION_CHOICE_VERSION;
    o->spec.version = &o->version;
    o->spec.signature_name = (char *)"serving_default";
    return &o->spec;
}

/* ---- Predict, Classify, Regress ---- */

typedef struct tfs_call {
    srv_grpc_call *c;
    int kind;
    tfs_spec spec;
    ProtobufCMessage *rq;
    grpc_byte_buffer *reply;
} tfs_call;

static srv_code tfs_decode(void *u, const srv_version_info *info, srv_tensors *in, srv_error *err) {
    tfs_call *t = u;
    size_t max = t->c->g->max_recv;
    if (t->kind == TFS_PREDICT)
        return srv_grpc_predict_decode((Tensorflow__Serving__PredictRequest *)t->rq, info, max, in, err);
    const Tensorflow__Serving__Input *input = t->kind == TFS_CLASSIFY
                                                  ? ((Tensorflow__Serving__ClassificationRequest *)t->rq)->input
                                                  : ((Tensorflow__Serving__RegressionRequest *)t->rq)->input;
    return srv_grpc_examples_decode(input, info, max, in, err);
}

static srv_code tfs_encode_predict(tfs_call *t, const srv_version_info *info, const srv_tensors *out, srv_error *err) {
    const Tensorflow__Serving__PredictRequest *rq = (const Tensorflow__Serving__PredictRequest *)t->rq;
    for (size_t f = 0; f < rq->n_output_filter; f++) {
        if (srv_tensors_find(out, rq->output_filter[f]) < 0)
            return srv_err(err, SRV_INVALID_ARGUMENT, "output_filter: model '%s' has no output '%.200s'", info->model,
                           rq->output_filter[f]);
        for (size_t g = 0; g < f; g++)
            if (strcmp(rq->output_filter[g], rq->output_filter[f]) == 0)
                return srv_err(err, SRV_INVALID_ARGUMENT, "output_filter: output '%.200s' is named twice",
                               rq->output_filter[f]);
    }
    int n = rq->n_output_filter ? (int)rq->n_output_filter : out->n;
    srv_tfproto_out *tp = calloc((size_t)n, sizeof *tp);
    Tensorflow__Serving__PredictResponse__OutputsEntry *ents = calloc((size_t)n, sizeof *ents);
    Tensorflow__Serving__PredictResponse__OutputsEntry **ep = calloc((size_t)n, sizeof *ep);
    srv_code rc = tp && ents && ep ? SRV_OK : srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    for (int i = 0; i < n && rc == SRV_OK; i++) {
        int j = rq->n_output_filter ? srv_tensors_find(out, rq->output_filter[i]) : i;
        rc = srv_tfproto_encode(&out->t[j], out->names[j], &tp[i], err);
        tensorflow__serving__predict_response__outputs_entry__init(&ents[i]);
        ents[i].key = out->names[j];
        ents[i].value = &tp[i].proto;
        ep[i] = &ents[i];
    }
    if (rc == SRV_OK) {
        Tensorflow__Serving__PredictResponse r = TENSORFLOW__SERVING__PREDICT_RESPONSE__INIT;
        tfs_spec_out so;
        r.model_spec = tfs_spec_out_init(&so, info->model, info->version);
        r.n_outputs = (size_t)n;
        r.outputs = ep;
        if (!(t->reply = srv_grpc_pack(&r.base, err))) rc = err->code;
    }
    free(tp);
    free(ents);
    free(ep);
    return rc;
}

static srv_code tfs_encode_classify(tfs_call *t, const srv_version_info *info, const srv_tensors *out, srv_error *err) {
    int64_t n, k;
    int j = srv_tfs_classify_scores(out, &n, &k, err);
    if (j < 0) return err->code;
    const eng_tensor *s = &out->t[j];
    int use_labels = info->labels && info->nlabels == k;
    size_t nk = (size_t)(n * k);
    Tensorflow__Serving__Class *cls = calloc(nk ? nk : 1, sizeof *cls);
    Tensorflow__Serving__Class **clp = calloc(nk ? nk : 1, sizeof *clp);
    Tensorflow__Serving__Classifications *cs = calloc((size_t)(n ? n : 1), sizeof *cs);
    Tensorflow__Serving__Classifications **csp = calloc((size_t)(n ? n : 1), sizeof *csp);
    char (*lab)[24] = use_labels ? NULL : calloc((size_t)(k ? k : 1), sizeof *lab);
    srv_code rc = cls && clp && cs && csp && (use_labels || lab) ? SRV_OK : srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    for (int64_t c = 0; rc == SRV_OK && !use_labels && c < k; c++) snprintf(lab[c], sizeof lab[c], "%lld", (long long)c);
    for (int64_t i = 0; rc == SRV_OK && i < n; i++) {
        tensorflow__serving__classifications__init(&cs[i]);
        cs[i].n_classes = (size_t)k;
        cs[i].classes = clp + i * k;
        csp[i] = &cs[i];
        for (int64_t c = 0; c < k; c++) {
            Tensorflow__Serving__Class *x = &cls[i * k + c];
            tensorflow__serving__class__init(x);
            x->label = use_labels ? (char *)info->labels[c] : lab[c];
            x->score = (float)eng_tensor_get_f64(s, i * k + c);
            clp[i * k + c] = x;
        }
    }
    if (rc == SRV_OK) {
        Tensorflow__Serving__ClassificationResponse r = TENSORFLOW__SERVING__CLASSIFICATION_RESPONSE__INIT;
        Tensorflow__Serving__ClassificationResult res = TENSORFLOW__SERVING__CLASSIFICATION_RESULT__INIT;
        tfs_spec_out so;
        r.model_spec = tfs_spec_out_init(&so, info->model, info->version);
        res.n_classifications = (size_t)n;
        res.classifications = csp;
        r.result = &res;
        if (!(t->reply = srv_grpc_pack(&r.base, err))) rc = err->code;
    }
    free(cls);
    free(clp);
    free(cs);
    free(csp);
    free(lab);
    return rc;
}

static srv_code tfs_encode_regress(tfs_call *t, const srv_version_info *info, const srv_tensors *out, srv_error *err) {
    int j = srv_tfs_regress_values(out, err);
    if (j < 0) return err->code;
    const eng_tensor *s = &out->t[j];
    int64_t n = s->dims[0];
    Tensorflow__Serving__Regression *rg = calloc((size_t)(n ? n : 1), sizeof *rg);
    Tensorflow__Serving__Regression **rgp = calloc((size_t)(n ? n : 1), sizeof *rgp);
    srv_code rc = rg && rgp ? SRV_OK : srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    for (int64_t i = 0; rc == SRV_OK && i < n; i++) {
        tensorflow__serving__regression__init(&rg[i]);
        rg[i].value = (float)eng_tensor_get_f64(s, i);
        rgp[i] = &rg[i];
    }
    if (rc == SRV_OK) {
        Tensorflow__Serving__RegressionResponse r = TENSORFLOW__SERVING__REGRESSION_RESPONSE__INIT;
        Tensorflow__Serving__RegressionResult res = TENSORFLOW__SERVING__REGRESSION_RESULT__INIT;
        tfs_spec_out so;
        r.model_spec = tfs_spec_out_init(&so, info->model, info->version);
        res.n_regressions = (size_t)n;
        res.regressions = rgp;
        r.result = &res;
        if (!(t->reply = srv_grpc_pack(&r.base, err))) rc = err->code;
    }
    free(rg);
    free(rgp);
    return rc;
}

static srv_code tfs_encode(void *u, const srv_version_info *info, const srv_tensors *in, const srv_tensors *out,
                           srv_error *err) {
    tfs_call *t = u;
    (void)in;
    return t->kind == TFS_PREDICT ? tfs_encode_predict(t, info, out, err)
           : t->kind == TFS_CLASSIFY ? tfs_encode_classify(t, info, out, err)
                                     : tfs_encode_regress(t, info, out, err);
}

static void tfs_done(void *u, srv_code code, const srv_error *err) {
    tfs_call *t = u;
    if (code == SRV_OK) srv_grpc_reply_bytes(t->c, SRV_OK, NULL, t->reply);
    else {
        if (t->reply) grpc_byte_buffer_destroy(t->reply);
        srv_grpc_reply_err(t->c, err);
    }
    protobuf_c_message_free_unpacked(t->rq, NULL);
    free(t);
}

static void tfs_async(void *u) { srv_grpc_going_async(((tfs_call *)u)->c); }

static const char *tfs_header(void *u, const char *name, char *buf, size_t cap) {
    return srv_grpc_header(((tfs_call *)u)->c, name, buf, cap);
}

static const srv_infer_ops tfs_ops = {.decode = tfs_decode, .encode = tfs_encode, .done = tfs_done,
                                      .going_async = tfs_async, .header = tfs_header};

static void tfs_infer(srv_grpc_call *c, const uint8_t *msg, size_t len, int kind) {
    static const ProtobufCMessageDescriptor *const descs[] = {
        &tensorflow__serving__predict_request__descriptor, &tensorflow__serving__classification_request__descriptor,
        &tensorflow__serving__regression_request__descriptor};
    srv_error err = {0};
    tfs_call *t = calloc(1, sizeof *t);
    if (!t) {
        srv_grpc_reply(c, SRV_RESOURCE_EXHAUSTED, "out of memory", NULL);
        return;
    }
    t->c = c;
    t->kind = kind;
    t->rq = srv_grpc_unpack(descs[kind], msg, len, srv_grpc_decode_limit(c->g), &err);
    const Tensorflow__Serving__ModelSpec *ms =
        !t->rq ? NULL
        : kind == TFS_PREDICT ? ((Tensorflow__Serving__PredictRequest *)t->rq)->model_spec
        : kind == TFS_CLASSIFY ? ((Tensorflow__Serving__ClassificationRequest *)t->rq)->model_spec
                               : ((Tensorflow__Serving__RegressionRequest *)t->rq)->model_spec;
    if (!t->rq || tfs_spec_parse(ms, &t->spec, &err) != SRV_OK) {
        srv_grpc_record(c, t->spec.model, 0, tfs_api[kind], err.code);
        if (t->rq) protobuf_c_message_free_unpacked(t->rq, NULL);
        free(t);
        srv_grpc_reply_err(c, &err);
        return;
    }
    srv_infer_req rq = {.model = t->spec.model, .version = t->spec.version, .label = t->spec.has_label ? t->spec.label : NULL,
                        .api = tfs_api[kind], .protocol = "grpc", .t0_us = c->t0_us, .deadline_us = c->deadline_us, .may_block = 0,
                        .cancel = &c->gone};
    srv_infer_submit(c->g->inf, &rq, &tfs_ops, t);
}

static void tfs_predict(srv_grpc_call *c, const uint8_t *msg, size_t len) { tfs_infer(c, msg, len, TFS_PREDICT); }
static void tfs_classify(srv_grpc_call *c, const uint8_t *msg, size_t len) { tfs_infer(c, msg, len, TFS_CLASSIFY); }
static void tfs_regress(srv_grpc_call *c, const uint8_t *msg, size_t len) { tfs_infer(c, msg, len, TFS_REGRESS); }

/* ---- GetModelMetadata ---- */

typedef struct tfs_info_out {
    Tensorflow__SignatureDef__InputsEntry ent;
    Tensorflow__TensorInfo info;
    Tensorflow__TensorShapeProto shape;
    Tensorflow__TensorShapeProto__Dim dims[ENG_MAX_DIMS];
    Tensorflow__TensorShapeProto__Dim *dimp[ENG_MAX_DIMS];
} tfs_info_out;

/* Fill o[i] for each io; ents[i] points at them. Inputs and outputs entries share one layout in protobuf-c. */
static void tfs_infos(const srv_io *io, int n, tfs_info_out *o, Tensorflow__SignatureDef__InputsEntry **ents) {
    for (int i = 0; i < n; i++) {
        tensorflow__signature_def__inputs_entry__init(&o[i].ent);
        tensorflow__tensor_info__init(&o[i].info);
        tensorflow__tensor_shape_proto__init(&o[i].shape);
        o[i].info.encoding_case = TENSORFLOW__TENSOR_INFO__ENCODING_NAME;
        o[i].info.name = io[i].onnx_name ? io[i].onnx_name : io[i].name;
        o[i].info.dtype = srv_tf_dtype_to(io[i].dtype);
        if (io[i].ndim < 0) o[i].shape.unknown_rank = 1;
        for (int d = 0; d < io[i].ndim && d < ENG_MAX_DIMS; d++) {
            tensorflow__tensor_shape_proto__dim__init(&o[i].dims[d]);
            o[i].dims[d].size = io[i].dims[d] < 0 ? -1 : io[i].dims[d];
            o[i].dimp[d] = &o[i].dims[d];
        }
        o[i].shape.n_dim = io[i].ndim > 0 ? (size_t)io[i].ndim : 0;
        o[i].shape.dim = o[i].dimp;
        o[i].info.tensor_shape = &o[i].shape;
        o[i].ent.key = io[i].name;
        o[i].ent.value = &o[i].info;
        ents[i] = &o[i].ent;
    }
}

static void tfs_metadata(srv_grpc_call *c, const uint8_t *msg, size_t len) {
    srv_error err = {0};
    tfs_spec spec = {{0}};
    Tensorflow__Serving__GetModelMetadataRequest *rq = (Tensorflow__Serving__GetModelMetadataRequest *)srv_grpc_unpack(
        &tensorflow__serving__get_model_metadata_request__descriptor, msg, len, 1 << 20, &err);
    srv_version *v = NULL;
    if (rq && tfs_spec_parse(rq->model_spec, &spec, &err) == SRV_OK) {
        if (rq->n_metadata_field == 0)
            srv_err(&err, SRV_INVALID_ARGUMENT, "GetModelMetadataRequest must name at least one metadata_field "
                    "(\"signature_def\")");
        for (size_t i = 0; i < rq->n_metadata_field && err.code == SRV_OK; i++)
            if (strcmp(rq->metadata_field[i], "signature_def") != 0)
                srv_err(&err, SRV_INVALID_ARGUMENT, "metadata field '%.200s' is not supported: tensord serves "
                        "\"signature_def\"", rq->metadata_field[i]);
        if (err.code == SRV_OK)
            v = srv_registry_acquire(c->g->reg, spec.model, spec.version, spec.has_label ? spec.label : NULL, &err);
    }
    if (!v) {
        srv_grpc_record(c, spec.model, 0, "metadata", err.code);
        if (rq) protobuf_c_message_free_unpacked(&rq->base, NULL);
        srv_grpc_reply_err(c, &err);
        return;
    }
    const srv_version_info *info = srv_version_get_info(v);
    int nio = info->ninputs + info->noutputs;
    tfs_info_out *io = calloc((size_t)(nio ? nio : 1), sizeof *io);
    Tensorflow__SignatureDef__InputsEntry **ents = calloc((size_t)(nio ? nio : 1), sizeof *ents);
    uint8_t *packed = NULL;
    srv_code rc = io && ents ? SRV_OK : srv_err(&err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    if (rc == SRV_OK) {
        tfs_infos(info->inputs, info->ninputs, io, ents);
        tfs_infos(info->outputs, info->noutputs, io + info->ninputs, ents + info->ninputs);
        Tensorflow__SignatureDef sd = TENSORFLOW__SIGNATURE_DEF__INIT;
        sd.n_inputs = (size_t)info->ninputs;
        sd.inputs = ents;
        sd.n_outputs = (size_t)info->noutputs;
        sd.outputs = (Tensorflow__SignatureDef__OutputsEntry **)(ents + info->ninputs);
        sd.method_name = (char *)"tensorflow/serving/predict";
        Tensorflow__Serving__SignatureDefMap__SignatureDefEntry se = TENSORFLOW__SERVING__SIGNATURE_DEF_MAP__SIGNATURE_DEF_ENTRY__INIT;
        se.key = (char *)"serving_default";
        se.value = &sd;
        Tensorflow__Serving__SignatureDefMap__SignatureDefEntry *sep = &se;
        Tensorflow__Serving__SignatureDefMap map = TENSORFLOW__SERVING__SIGNATURE_DEF_MAP__INIT;
        map.n_signature_def = 1;
        map.signature_def = &sep;
        size_t plen = protobuf_c_message_get_packed_size(&map.base);
        if (!(packed = malloc(plen ? plen : 1))) rc = srv_err(&err, SRV_RESOURCE_EXHAUSTED, "out of memory");
        if (rc == SRV_OK) {
            protobuf_c_message_pack(&map.base, packed);
            Google__Protobuf__Any any = GOOGLE__PROTOBUF__ANY__INIT;
            any.type_url = (char *)"type.googleapis.com/tensorflow.serving.SignatureDefMap";
            any.value = srv_pb_bytes(packed, plen);
            Tensorflow__Serving__GetModelMetadataResponse__MetadataEntry me =
                TENSORFLOW__SERVING__GET_MODEL_METADATA_RESPONSE__METADATA_ENTRY__INIT;
            me.key = (char *)"signature_def";
            me.value = &any;
            Tensorflow__Serving__GetModelMetadataResponse__MetadataEntry *mep = &me;
            Tensorflow__Serving__GetModelMetadataResponse r = TENSORFLOW__SERVING__GET_MODEL_METADATA_RESPONSE__INIT;
            tfs_spec_out so;
            r.model_spec = tfs_spec_out_init(&so, spec.model, info->version);
            r.n_metadata = 1;
            r.metadata = &mep;
            srv_grpc_record(c, spec.model, info->version, "metadata", SRV_OK);
            srv_grpc_reply(c, SRV_OK, NULL, &r.base);
        }
    }
    if (rc != SRV_OK) {
        srv_grpc_record(c, spec.model, info->version, "metadata", rc);
        srv_grpc_reply_err(c, &err);
    }
    free(packed);
    free(io);
    free(ents);
    srv_version_release(v);
    protobuf_c_message_free_unpacked(&rq->base, NULL);
}

/* ---- ModelService ---- */

static void tfs_status(srv_grpc_call *c, const uint8_t *msg, size_t len) {
    srv_error err = {0};
    tfs_spec spec = {{0}};
    Tensorflow__Serving__GetModelStatusRequest *rq = (Tensorflow__Serving__GetModelStatusRequest *)srv_grpc_unpack(
        &tensorflow__serving__get_model_status_request__descriptor, msg, len, 1 << 20, &err);
    srv_version_status *st = NULL;
    int n = 0;
    srv_code rc = rq ? tfs_spec_parse(rq->model_spec, &spec, &err) : err.code;
    if (rc == SRV_OK)
        rc = srv_registry_status(c->g->reg, spec.model, spec.version, spec.has_label ? spec.label : NULL, &st, &n, &err);
    Tensorflow__Serving__ModelVersionStatus *vs = rc == SRV_OK ? calloc((size_t)(n ? n : 1), sizeof *vs) : NULL;
    Tensorflow__Serving__ModelVersionStatus **vsp = rc == SRV_OK ? calloc((size_t)(n ? n : 1), sizeof *vsp) : NULL;
    Tensorflow__Serving__StatusProto *sp = rc == SRV_OK ? calloc((size_t)(n ? n : 1), sizeof *sp) : NULL;
    if (rc == SRV_OK && (!vs || !vsp || !sp)) rc = srv_err(&err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    if (rc == SRV_OK) {
        for (int i = 0; i < n; i++) {
            tensorflow__serving__model_version_status__init(&vs[i]);
            tensorflow__serving__status_proto__init(&sp[i]);
            vs[i].version = st[i].version;
            vs[i].state = (Tensorflow__Serving__ModelVersionStatus__State)st[i].state;
            sp[i].error_code = (int32_t)st[i].error_code;
            sp[i].error_message = st[i].error_message ? st[i].error_message : (char *)"";
            vs[i].status = &sp[i];
            vsp[i] = &vs[i];
        }
        Tensorflow__Serving__GetModelStatusResponse r = TENSORFLOW__SERVING__GET_MODEL_STATUS_RESPONSE__INIT;
        r.n_model_version_status = (size_t)n;
        r.model_version_status = vsp;
        srv_grpc_record(c, spec.model, 0, "status", SRV_OK);
        srv_grpc_reply(c, SRV_OK, NULL, &r.base);
    } else {
        srv_grpc_record(c, spec.model, 0, "status", rc);
        srv_grpc_reply_err(c, &err);
    }
    free(vs);
    free(vsp);
    free(sp);
    srv_status_free(st, n);
    if (rq) protobuf_c_message_free_unpacked(&rq->base, NULL);
}

/* config.model_config_list as text format, for the one set of checks of config.c. */
static srv_code reload_text(const Tensorflow__Serving__ModelServerConfig *cfg, srv_buf *b, srv_error *err) {
    if (!cfg || cfg->config_case != TENSORFLOW__SERVING__MODEL_SERVER_CONFIG__CONFIG_MODEL_CONFIG_LIST ||
        !cfg->model_config_list)
        return srv_err(err, SRV_INVALID_ARGUMENT, "ReloadConfigRequest.config needs a model_config_list "
                       "(custom_model_config is not supported)");
    const Tensorflow__Serving__ModelConfigList *l = cfg->model_config_list;
    srv_buf_puts(b, "model_config_list {\n");
    for (size_t i = 0; i < l->n_config; i++) {
        const Tensorflow__Serving__ModelConfig *m = l->config[i];
        srv_buf_puts(b, " config { name: ");
        srv_config_quote(b, m->name);
        srv_buf_puts(b, " base_path: ");
        srv_config_quote(b, m->base_path);
        if (m->model_platform && *m->model_platform) {
            srv_buf_puts(b, " model_platform: ");
            srv_config_quote(b, m->model_platform);
        }
        const Tensorflow__Serving__FileSystemStoragePathSourceConfig__ServableVersionPolicy *p = m->model_version_policy;
        if (p) {
            srv_buf_puts(b, " model_version_policy {");
            switch (p->policy_choice_case) {
            case TENSORFLOW__SERVING__FILE_SYSTEM_STORAGE_PATH_SOURCE_CONFIG__SERVABLE_VERSION_POLICY__POLICY_CHOICE_LATEST:
                srv_buf_printf(b, " latest { num_versions: %u }", p->latest && p->latest->num_versions ? p->latest->num_versions : 1);
                break;
            case TENSORFLOW__SERVING__FILE_SYSTEM_STORAGE_PATH_SOURCE_CONFIG__SERVABLE_VERSION_POLICY__POLICY_CHOICE_ALL:
                srv_buf_puts(b, " all {}");
                break;
            case TENSORFLOW__SERVING__FILE_SYSTEM_STORAGE_PATH_SOURCE_CONFIG__SERVABLE_VERSION_POLICY__POLICY_CHOICE_SPECIFIC:
                srv_buf_puts(b, " specific {");
                for (size_t k = 0; p->specific && k < p->specific->n_versions; k++)
                    srv_buf_printf(b, " versions: %lld", (long long)p->specific->versions[k]);
                srv_buf_puts(b, " }");
                break;
            default:
                srv_buf_puts(b, " latest { num_versions: 1 }");
                break;
            }
            srv_buf_puts(b, " }");
        }
        for (size_t k = 0; k < m->n_version_labels; k++) {
            srv_buf_puts(b, " version_labels { key: ");
            srv_config_quote(b, m->version_labels[k]->key);
            srv_buf_printf(b, " value: %lld }", (long long)m->version_labels[k]->value);
        }
        srv_buf_puts(b, " }\n");
    }
    srv_buf_puts(b, "}\n");
    return b->oom ? srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory") : SRV_OK;
}

static void tfs_reload_run(srv_grpc_call *c) {
    Tensorflow__Serving__ReloadConfigRequest *rq = c->u;
    srv_error err = {0};
    srv_buf b = {0};
    srv_model_config *cfgs = NULL;
    int n = 0;
    srv_code rc = reload_text(rq->config, &b, &err);
    if (rc == SRV_OK) rc = srv_config_parse_models(b.p, b.len, "ReloadConfigRequest", &cfgs, &n, &err);
    if (rc == SRV_OK) rc = srv_registry_set_config(c->g->reg, cfgs, n, &err);
    if (rc == SRV_OK) {
        srv_registry_poll(c->g->reg);
        rc = srv_registry_check_available(c->g->reg, cfgs, n, &err);
    }
    if (rc == SRV_OK) srv_log(SRV_LOG_INFO, "reload", NULL, 0, "HandleReloadConfigRequest: now serving %d models", n);
    else srv_log(SRV_LOG_WARN, "reload", NULL, 0, "HandleReloadConfigRequest: %s", err.msg);
    for (int i = 0; i < n; i++) srv_model_config_free(&cfgs[i]);
    free(cfgs);
    free(b.p);
    srv_grpc_record(c, "", 0, "reload", rc);
    if (rc == SRV_OK) {
        Tensorflow__Serving__ReloadConfigResponse r = TENSORFLOW__SERVING__RELOAD_CONFIG_RESPONSE__INIT;
        Tensorflow__Serving__StatusProto sp = TENSORFLOW__SERVING__STATUS_PROTO__INIT;
        sp.error_message = (char *)"";
        r.status = &sp;
        srv_grpc_reply(c, SRV_OK, NULL, &r.base);
    } else {
        srv_grpc_reply_err(c, &err);
    }
    protobuf_c_message_free_unpacked(&rq->base, NULL);
}

static void tfs_reload(srv_grpc_call *c, const uint8_t *msg, size_t len) {
    srv_error err = {0};
    if (!srv_grpc_authorized(c)) return;
    Tensorflow__Serving__ReloadConfigRequest *rq = (Tensorflow__Serving__ReloadConfigRequest *)srv_grpc_unpack(
        &tensorflow__serving__reload_config_request__descriptor, msg, len, 16 << 20, &err);
    if (!rq) {
        srv_grpc_record(c, "", 0, "reload", err.code);
        srv_grpc_reply_err(c, &err);
        return;
    }
    c->u = rq;
    srv_grpc_defer(c, tfs_reload_run); /* waits for loads: never on a queue thread */
}

const srv_grpc_method srv_grpc_tfs_methods[] = {
    {"/tensorflow.serving.PredictionService/Predict", tfs_predict, 0},
    {"/tensorflow.serving.PredictionService/Classify", tfs_classify, 0},
    {"/tensorflow.serving.PredictionService/Regress", tfs_regress, 0},
    {"/tensorflow.serving.PredictionService/GetModelMetadata", tfs_metadata, 0},
    {"/tensorflow.serving.ModelService/GetModelStatus", tfs_status, 0},
    {"/tensorflow.serving.ModelService/HandleReloadConfigRequest", tfs_reload, 0},
};
const int srv_grpc_tfs_nmethods = sizeof srv_grpc_tfs_methods / sizeof srv_grpc_tfs_methods[0];
