/* grpc-decode.c - the gRPC requests that carry tensors -> the inputs of a version's signature: TF Serving's
 * PredictRequest and tf.Example inputs (Classify, Regress), KServe v2's ModelInferRequest (see grpc-decode.h).
 * No gRPC here, so the fuzz target links it alone.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpc-decode.h"

static int io_find(const srv_version_info *info, const char *name) {
    for (int i = 0; i < info->ninputs; i++)
        if (strcmp(info->inputs[i].name, name) == 0) return i;
    return -1;
}

static srv_code unknown_input(const srv_version_info *info, const char *name, srv_error *err) {
    char list[512];
    size_t k = 0;
    list[0] = '\0';
    for (int i = 0; i < info->ninputs && k < sizeof list; i++)
        k += (size_t)snprintf(list + k, sizeof list - k, "%s'%s'", i ? ", " : "", info->inputs[i].name);
    return srv_err(err, SRV_INVALID_ARGUMENT, "unknown input '%.200s' for model '%s' (inputs: %s)", name,
                   info->model ? info->model : "", list);
}

/* Add t (data owned) under name; frees t's data on failure. */
static srv_code add(srv_tensors *in, const char *name, eng_tensor *t, srv_error *err) {
    if (srv_tensors_find(in, name) >= 0) {
        eng_free(t->data);
        return srv_err(err, SRV_INVALID_ARGUMENT, "input '%.200s' is given twice", name);
    }
    if (srv_tensors_add(in, name, t) != 0) {
        eng_free(t->data);
        return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    }
    return SRV_OK;
}

srv_code srv_signature_check(const char *signature_name, srv_error *err) {
    if (!signature_name || !*signature_name || strcmp(signature_name, "serving_default") == 0) return SRV_OK;
    return srv_err(err, SRV_INVALID_ARGUMENT, "signature '%.200s' not found: the model serves 'serving_default' only",
                   signature_name);
}

srv_code srv_grpc_predict_decode(const Tensorflow__Serving__PredictRequest *rq, const srv_version_info *info,
                                 size_t max_bytes, srv_tensors *in, srv_error *err) {
    srv_code rc = SRV_OK;
    if (rq->n_inputs == 0) rc = srv_err(err, SRV_INVALID_ARGUMENT, "the request has no inputs (model '%s' takes %d)",
                                        info->model ? info->model : "", info->ninputs);
    for (size_t i = 0; i < rq->n_inputs && rc == SRV_OK; i++) {
        const Tensorflow__Serving__PredictRequest__InputsEntry *e = rq->inputs[i];
        const char *name = e->key ? e->key : "";
        if (io_find(info, name) < 0) {
            rc = unknown_input(info, name, err);
            break;
        }
        if (!e->value) {
            rc = srv_err(err, SRV_INVALID_ARGUMENT, "input '%.200s' has no tensor", name);
            break;
        }
        eng_tensor t;
        rc = srv_tfproto_decode(e->value, name, max_bytes, &t, err);
        if (rc == SRV_OK) rc = add(in, name, &t, err);
    }
    if (rc != SRV_OK) srv_tensors_free(in);
    return rc;
}

/* The feature for input j of an example (then the context): by the input's name; a model with one input takes
 * an example's only feature whatever its name (as REST's :classify does). */
static const Tensorflow__Feature *feature_of(const Tensorflow__Example *e, const Tensorflow__Example *ctx,
                                             const srv_version_info *info, int j) {
    const char *name = info->inputs[j].name;
    const Tensorflow__Features *fs[2] = {e && e->features ? e->features : NULL, ctx && ctx->features ? ctx->features : NULL};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; fs[k] && i < fs[k]->n_feature; i++)
            if (fs[k]->feature[i]->key && strcmp(fs[k]->feature[i]->key, name) == 0) return fs[k]->feature[i]->value;
    if (info->ninputs != 1) return NULL;
    size_t ne = fs[0] ? fs[0]->n_feature : 0, nc = fs[1] ? fs[1]->n_feature : 0;
    if (ne == 1 && nc == 0) return fs[0]->feature[0]->value;
    if (ne == 0 && nc == 1) return fs[1]->feature[0]->value;
    return NULL;
}

static size_t feature_len(const Tensorflow__Feature *f) {
    switch (f->kind_case) {
    case TENSORFLOW__FEATURE__KIND_FLOAT_LIST: return f->float_list ? f->float_list->n_value : 0;
    case TENSORFLOW__FEATURE__KIND_INT64_LIST: return f->int64_list ? f->int64_list->n_value : 0;
    default: return 0;
    }
}

srv_code srv_grpc_examples_decode(const Tensorflow__Serving__Input *input, const srv_version_info *info,
                                  size_t max_bytes, srv_tensors *in, srv_error *err) {
    const Tensorflow__Example *const *ex = NULL, *ctx = NULL;
    size_t n = 0;
    if (input && input->kind_case == TENSORFLOW__SERVING__INPUT__KIND_EXAMPLE_LIST && input->example_list) {
        ex = (const Tensorflow__Example *const *)input->example_list->examples;
        n = input->example_list->n_examples;
    } else if (input && input->kind_case == TENSORFLOW__SERVING__INPUT__KIND_EXAMPLE_LIST_WITH_CONTEXT &&
               input->example_list_with_context) {
        ex = (const Tensorflow__Example *const *)input->example_list_with_context->examples;
        n = input->example_list_with_context->n_examples;
        ctx = input->example_list_with_context->context;
    }
    if (n == 0)
        return srv_err(err, SRV_INVALID_ARGUMENT, "the request has no examples (input.example_list or "
                       "input.example_list_with_context): an empty batch is not served");
    if (info->ninputs <= 0) return srv_err(err, SRV_FAILED_PRECONDITION, "the model has no inputs");
    srv_code rc = SRV_OK;
    for (int j = 0; j < info->ninputs && rc == SRV_OK; j++) {
        const srv_io *io = &info->inputs[j];
        size_t per = 0;
        for (size_t i = 0; i < n && rc == SRV_OK; i++) {
            const Tensorflow__Feature *f = feature_of(ex[i], ctx, info, j);
            if (!f || (f->kind_case != TENSORFLOW__FEATURE__KIND_FLOAT_LIST && f->kind_case != TENSORFLOW__FEATURE__KIND_INT64_LIST))
                rc = srv_err(err, SRV_INVALID_ARGUMENT, "example %zu has no %s feature '%s'", i,
                             f ? "float_list or int64_list" : "", io->name);
            else if (i == 0) per = feature_len(f);
            else if (feature_len(f) != per)
                rc = srv_err(err, SRV_INVALID_ARGUMENT, "feature '%s' has %zu values in example %zu but %zu in example 0",
                             io->name, feature_len(f), i, per);
        }
        if (rc != SRV_OK) break;
        /* shape: [n] + the signature's trailing dims when they hold `per` values, else [n, per] ([n] for one) */
        eng_tensor t = {.dtype = io->dtype};
        t.dims[0] = (int64_t)n;
        t.ndim = 1;
        int64_t tail = 1;
        int known = io->ndim >= 1;
        for (int d = 1; known && d < io->ndim; d++) known = io->dims[d] >= 0, tail *= io->dims[d] >= 0 ? io->dims[d] : 1;
        if (known && tail == (int64_t)per && io->ndim <= ENG_MAX_DIMS) {
            for (int d = 1; d < io->ndim; d++) t.dims[d] = io->dims[d];
            t.ndim = io->ndim;
        } else if (per != 1 || io->ndim != 1) {
            t.dims[1] = (int64_t)per;
            t.ndim = 2;
        }
        size_t es = eng_dtype_size(io->dtype);
        if (es == 0 || !(eng_dtype_is_float(io->dtype) || eng_dtype_is_int(io->dtype) || io->dtype == ENG_DTYPE_BOOL)) {
            rc = srv_err(err, SRV_INVALID_ARGUMENT, "input '%s' of dtype %s cannot be fed from tf.Example features",
                         io->name, eng_dtype_name(io->dtype));
            break;
        }
        if (per > 0 && n > max_bytes / es / per) {
            rc = srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': %zu examples of %zu values are over the %zu-byte limit",
                         io->name, n, per, max_bytes);
            break;
        }
        size_t nbytes = n * per * es;
        t.data = eng_alloc(nbytes > 0 ? nbytes : 1);
        if (!t.data) {
            rc = srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
            break;
        }
        for (size_t i = 0; i < n; i++) {
            const Tensorflow__Feature *f = feature_of(ex[i], ctx, info, j);
            for (size_t k = 0; k < per; k++) {
                int64_t at = (int64_t)(i * per + k);
                if (f->kind_case == TENSORFLOW__FEATURE__KIND_FLOAT_LIST) eng_tensor_set_f64(&t, at, f->float_list->value[k]);
                else if (eng_dtype_is_float(io->dtype)) eng_tensor_set_f64(&t, at, (double)f->int64_list->value[k]);
                else eng_tensor_set_i64(&t, at, f->int64_list->value[k]);
            }
        }
        rc = add(in, io->name, &t, err);
    }
    if (rc != SRV_OK) srv_tensors_free(in);
    return rc;
}

srv_code srv_grpc_infer_decode(const Inference__ModelInferRequest *rq, const srv_version_info *info, size_t max_bytes,
                               srv_tensors *in, srv_error *err) {
    srv_code rc = SRV_OK;
    const char *model = info->model ? info->model : "";
    if (rq->n_raw_input_contents > 0 && rq->n_raw_input_contents != rq->n_inputs)
        return srv_err(err, SRV_INVALID_ARGUMENT, "raw_input_contents has %zu entries for %zu inputs: give one per input, "
                       "in order, or none", rq->n_raw_input_contents, rq->n_inputs);
    if (rq->n_inputs == 0) return srv_err(err, SRV_INVALID_ARGUMENT, "the request has no inputs (model '%s' takes %d)",
                                          model, info->ninputs);
    for (size_t i = 0; i < rq->n_inputs && rc == SRV_OK; i++) {
        const Inference__ModelInferRequest__InferInputTensor *x = rq->inputs[i];
        const char *name = x->name ? x->name : "";
        int j = io_find(info, name);
        if (j < 0) {
            rc = unknown_input(info, name, err);
            break;
        }
        eng_dtype dt = srv_kserve_dtype_parse(x->datatype);
        if (dt != info->inputs[j].dtype) {
            rc = srv_err(err, SRV_INVALID_ARGUMENT, "unexpected datatype '%.32s' for inference input '%s', expecting %s "
                         "for model '%s'", x->datatype ? x->datatype : "", name, srv_kserve_dtype(info->inputs[j].dtype),
                         model);
            break;
        }
        if (eng_dtype_size(dt) == 0) {
            rc = srv_err(err, SRV_UNIMPLEMENTED, "input '%s': datatype %s is not supported", name, x->datatype);
            break;
        }
        if (rq->n_raw_input_contents > 0 && x->contents &&
            (x->contents->n_fp32_contents || x->contents->n_int_contents || x->contents->n_int64_contents ||
             x->contents->n_bool_contents || x->contents->n_uint_contents || x->contents->n_uint64_contents ||
             x->contents->n_fp64_contents || x->contents->n_bytes_contents)) {
            rc = srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': contents and raw_input_contents are both given", name);
            break;
        }
        eng_tensor t;
        rc = srv_kserve_contents_decode(name, dt, x->shape, x->n_shape, x->contents,
                                        rq->n_raw_input_contents ? &rq->raw_input_contents[i] : NULL, max_bytes, &t, err);
        if (rc == SRV_OK) rc = add(in, name, &t, err);
    }
    if (rc != SRV_OK) srv_tensors_free(in);
    return rc;
}
