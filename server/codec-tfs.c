/* codec-tfs.c - TF Serving REST bodies <-> tensors: :predict (row "instances" and columnar "inputs"),
 * :classify / :regress ("examples" + "context"), and their replies (see codec.h).
 *
 * A JSON value becomes a tensor in three steps, so no input can make us allocate more than it carries:
 *   1. shape: follow the first element of each nested list down to a leaf (a number/bool, or a {"b64": ...}
 *      object whose trailing dims come from the signature); rank <= ENG_MAX_DIMS;
 *   2. check: walk every value against that shape (rectangular, b64 byte counts exact) without storing;
 *   3. fill: allocate the (size-checked) tensor and convert each leaf with srv_json_store.
 * Every walk is bounded by the rank (<= 8) on top of srv_json_depth_ok's limit on the body.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "json.h"

/* Expected shape of a (sub)tensor; ndim -1 = unknown rank, dims[i] -1 = unknown. */
typedef struct srv_expect {
    int ndim;
    const int64_t *dims;
} srv_expect;

/* One walk of values against a shape. dst NULL: check structure only. */
typedef struct srv_fill {
    const char *name;
    eng_dtype dt;
    size_t es;
    const int64_t *dims; /* JSON shape of one value */
    int ndim;
    uint8_t *dst;
    int64_t idx;         /* next flat element */
    const char *where;   /* "instance 3 of " or "" */
    srv_error *err;
} srv_fill;

static char *srv_shape_s(const int64_t *dims, int ndim, char *buf, size_t n) {
    if (ndim < 0) {
        snprintf(buf, n, "[unknown rank]");
        return buf;
    }
    return eng_shape_str(dims, ndim, buf, n);
}

/* Step 1: the shape of v, following first elements. */
static srv_code srv_value_shape(const cJSON *v, srv_expect ex, eng_dtype dt, const char *name, int64_t *dims,
                                int *ndim, srv_error *err) {
    int d = 0;
    const cJSON *node = v;
    size_t es = eng_dtype_size(dt);
    for (;;) {
        if (cJSON_IsArray(node)) {
            if (d >= ENG_MAX_DIMS)
                return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': lists nest deeper than %d dims", name,
                               ENG_MAX_DIMS);
            int64_t n = 0;
            for (const cJSON *c = node->child; c; c = c->next) n++;
            dims[d++] = n;
            if (n == 0) {
                for (; ex.ndim > d && d < ENG_MAX_DIMS; d++) dims[d] = ex.dims[d] >= 0 ? ex.dims[d] : 0;
                break;
            }
            node = node->child;
        } else if (srv_json_is_b64(node)) {
            const cJSON *s = node->child;
            if (!cJSON_IsString(s))
                return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': \"b64\" must be a string", name);
            int64_t bytes = srv_b64_decoded_len(s->valuestring, strlen(s->valuestring));
            if (bytes < 0) return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': invalid base64", name);
            if (es == 0 || bytes % (int64_t)es != 0)
                return srv_err(err, SRV_INVALID_ARGUMENT,
                               "input '%s': b64 data of %lld bytes is not a whole number of %s elements", name,
                               (long long)bytes, eng_dtype_name(dt));
            int64_t count = bytes / (int64_t)es;
            if (ex.ndim < 0) {
                if (d >= ENG_MAX_DIMS)
                    return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': too many dims", name);
                dims[d++] = count;
                break;
            }
            if (ex.ndim < d)
                return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': b64 data nested deeper than the input's rank %d",
                               name, ex.ndim);
            int unknown = -1;
            int64_t known = 1;
            for (int k = d; k < ex.ndim; k++) {
                if (ex.dims[k] < 0) {
                    if (unknown >= 0)
                        return srv_err(err, SRV_INVALID_ARGUMENT,
                                       "input '%s': cannot infer the shape of b64 data: more than one unknown dim", name);
                    unknown = k;
                } else {
                    if (ex.dims[k] != 0 && known > INT64_MAX / ex.dims[k])
                        return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': shape too large", name);
                    known *= ex.dims[k];
                    dims[k] = ex.dims[k];
                }
            }
            if (unknown >= 0) {
                if (known == 0 || count % known != 0)
                    return srv_err(err, SRV_INVALID_ARGUMENT,
                                   "input '%s': b64 data of %lld elements does not fit the input's shape", name,
                                   (long long)count);
                dims[unknown] = count / known;
            }
            d = ex.ndim;
            break;
        } else {
            break;
        }
    }
    *ndim = d;
    return SRV_OK;
}

/* Steps 2 and 3: walk v at dim d. */
static srv_code srv_value_walk(srv_fill *f, const cJSON *v, int d) {
    char sb[160];
    if (srv_json_is_b64(v)) {
        int64_t count = eng_shape_numel(f->dims + d, f->ndim - d);
        const char *s = cJSON_IsString(v->child) ? v->child->valuestring : NULL;
        int64_t bytes = s ? srv_b64_decoded_len(s, strlen(s)) : -1;
        if (bytes < 0)
            return srv_err(f->err, SRV_INVALID_ARGUMENT, "%sinput '%s': invalid base64 at element %lld", f->where,
                           f->name, (long long)f->idx);
        if (count < 0 || bytes != count * (int64_t)f->es)
            return srv_err(f->err, SRV_INVALID_ARGUMENT,
                           "%sinput '%s': b64 data has %lld bytes, expected %lld (%s of %s) at element %lld",
                           f->where, f->name, (long long)bytes, (long long)(count * (int64_t)f->es),
                           eng_shape_str(f->dims + d, f->ndim - d, sb, sizeof sb), eng_dtype_name(f->dt),
                           (long long)f->idx);
        if (f->dst && srv_b64_decode(s, strlen(s), f->dst + (size_t)f->idx * f->es, (size_t)bytes, NULL) != 0)
            return srv_err(f->err, SRV_INVALID_ARGUMENT, "%sinput '%s': invalid base64", f->where, f->name);
        f->idx += count;
        return SRV_OK;
    }
    if (d == f->ndim) {
        if (cJSON_IsArray(v) || cJSON_IsObject(v))
            return srv_err(f->err, SRV_INVALID_ARGUMENT,
                           "%sinput '%s': ragged nested list: expected a value at element %lld, got a %s", f->where,
                           f->name, (long long)f->idx, cJSON_IsArray(v) ? "list" : "object");
        if (f->dst) {
            srv_code c = srv_json_store(v, f->dt, f->dst, f->idx, f->name, f->err);
            if (c != SRV_OK) return c;
        } else if (!cJSON_IsNumber(v) && !cJSON_IsBool(v) && !cJSON_IsString(v)) {
            return srv_err(f->err, SRV_INVALID_ARGUMENT, "%sinput '%s': element %lld: expected a number, got null",
                           f->where, f->name, (long long)f->idx);
        }
        f->idx++;
        return SRV_OK;
    }
    if (!cJSON_IsArray(v))
        return srv_err(f->err, SRV_INVALID_ARGUMENT,
                       "%sinput '%s': ragged nested list: expected a list of %lld at dim %d (element %lld), got a "
                       "value; all lists must have shape %s",
                       f->where, f->name, (long long)f->dims[d], d, (long long)f->idx,
                       eng_shape_str(f->dims, f->ndim, sb, sizeof sb));
    int64_t n = 0;
    for (const cJSON *c = v->child; c; c = c->next, n++) {
        if (n >= f->dims[d]) break;
        srv_code rc = srv_value_walk(f, c, d + 1);
        if (rc != SRV_OK) return rc;
    }
    int64_t got = cJSON_GetArraySize(v);
    if (got != f->dims[d])
        return srv_err(f->err, SRV_INVALID_ARGUMENT,
                       "%sinput '%s': ragged nested list: a list at dim %d has %lld elements, expected %lld "
                       "(shape %s)",
                       f->where, f->name, d, (long long)got, (long long)f->dims[d],
                       eng_shape_str(f->dims, f->ndim, sb, sizeof sb));
    return SRV_OK;
}

/* Does shape (dims, ndim) satisfy ex? */
static int srv_expect_ok(srv_expect ex, const int64_t *dims, int ndim) {
    if (ex.ndim < 0) return 1;
    if (ex.ndim != ndim) return 0;
    for (int i = 0; i < ndim; i++)
        if (ex.dims[i] >= 0 && ex.dims[i] != dims[i]) return 0;
    return 1;
}

/* Turn n values (one per example; stacked along a new dim 0 when stack) into one tensor named io->name.
 * lenient (examples): a value whose element count matches a fully known per-example shape is reshaped. */
static srv_code srv_tfs_tensor(const srv_io *io, const cJSON *const *vals, int64_t n, int stack, int lenient,
                               srv_tensors *in, srv_error *err) {
    char sa[160], sb[160], where[64] = "";
    size_t es = eng_dtype_size(io->dtype);
    if (es == 0)
        return srv_err(err, SRV_UNIMPLEMENTED, "input '%s': dtype %s is not supported over REST", io->name,
                       eng_dtype_name(io->dtype));
    srv_expect ex = {.ndim = io->ndim, .dims = io->dims};
    if (stack) {
        ex.ndim = io->ndim >= 1 ? io->ndim - 1 : -1;
        ex.dims = io->dims + 1;
    }
    int64_t jd[ENG_MAX_DIMS];
    int jn = 0;
    srv_code rc = srv_value_shape(vals[0], ex, io->dtype, io->name, jd, &jn, err);
    if (rc != SRV_OK) return rc;
    eng_tensor t = {.dtype = io->dtype};
    int off = stack ? 1 : 0;
    if (stack) t.dims[0] = n;
    t.ndim = off + jn;
    memcpy(t.dims + off, jd, sizeof(int64_t) * (size_t)jn);
    if (!srv_expect_ok(ex, jd, jn)) {
        int64_t want = ex.ndim >= 0 ? eng_shape_numel(ex.dims, ex.ndim) : -1;
        if (lenient && want >= 0 && want == eng_shape_numel(jd, jn) && off + ex.ndim <= ENG_MAX_DIMS) {
            t.ndim = off + ex.ndim;
            memcpy(t.dims + off, ex.dims, sizeof(int64_t) * (size_t)ex.ndim);
        } else {
            return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': expected shape %s%s, got %s", io->name,
                           srv_shape_s(ex.dims, ex.ndim, sa, sizeof sa), stack ? " per instance" : "",
                           eng_shape_str(jd, jn, sb, sizeof sb));
        }
    }
    if (t.ndim > ENG_MAX_DIMS)
        return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': rank exceeds %d", io->name, ENG_MAX_DIMS);
    srv_fill f = {.name = io->name, .dt = io->dtype, .es = es, .dims = jd, .ndim = jn, .where = where, .err = err};
    for (int64_t i = 0; i < n; i++) { /* step 2: structure of every value, nothing stored */
        if (stack) snprintf(where, sizeof where, "instance %lld: ", (long long)i);
        f.idx = 0;
        rc = srv_value_walk(&f, vals[i], 0);
        if (rc != SRV_OK) return rc;
    }
    size_t nbytes;
    if (eng_tensor_nbytes_checked(&t, io->name, &nbytes) != ENG_STATUS_OK)
        return srv_err(err, SRV_INVALID_ARGUMENT, "%s", eng_last_error());
    t.data = eng_alloc(nbytes ? nbytes : 1);
    if (!t.data) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "input '%s': out of memory (%zu bytes)", io->name, nbytes);
    f.dst = t.data;
    f.idx = 0;
    f.where = "";
    for (int64_t i = 0; i < n; i++) { /* step 3 */
        rc = srv_value_walk(&f, vals[i], 0);
        if (rc != SRV_OK) {
            eng_free(t.data);
            return rc;
        }
    }
    if (srv_tensors_add(in, io->name, &t) != 0) /* frees t.data */
        return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    return SRV_OK;
}

static int srv_io_find(const srv_version_info *info, const char *name) {
    for (int i = 0; i < info->ninputs; i++)
        if (strcmp(info->inputs[i].name, name) == 0) return i;
    return -1;
}

/* "'a', 'b'": the signature's input names, cut to fit. */
static void srv_io_names(const srv_version_info *info, char *list, size_t cap) {
    size_t k = 0;
    list[0] = '\0';
    for (int i = 0; i < info->ninputs && k < cap; i++)
        k += (size_t)snprintf(list + k, cap - k, "%s'%s'", i ? ", " : "", info->inputs[i].name);
}

static srv_code srv_unknown_input(const srv_version_info *info, const char *name, srv_error *err) {
    char list[512];
    srv_io_names(info, list, sizeof list);
    return srv_err(err, SRV_INVALID_ARGUMENT, "unknown input '%.200s' for model '%s' (inputs: %s)", name,
                   info->model ? info->model : "", list);
}

static srv_code srv_tfs_signature(const cJSON *root, srv_error *err) {
    const cJSON *sig = cJSON_GetObjectItemCaseSensitive(root, "signature_name");
    if (!sig || cJSON_IsNull(sig)) return SRV_OK;
    if (!cJSON_IsString(sig)) return srv_err(err, SRV_INVALID_ARGUMENT, "'signature_name' must be a string");
    if (sig->valuestring[0] && strcmp(sig->valuestring, "serving_default") != 0)
        return srv_err(err, SRV_INVALID_ARGUMENT, "serving signature name: '%.200s' not found in signature def",
                       sig->valuestring);
    return SRV_OK;
}

/* Row format. */
static srv_code srv_tfs_rows(const cJSON *inst, const srv_version_info *info, srv_tensors *in, srv_error *err) {
    if (!cJSON_IsArray(inst)) return srv_err(err, SRV_INVALID_ARGUMENT, "'instances' must be a list");
    int64_t n = cJSON_GetArraySize(inst);
    if (n == 0) {
        char list[512];
        srv_io_names(info, list, sizeof list);
        return srv_err(err, SRV_INVALID_ARGUMENT,
                       "'instances' is empty: an empty batch is not served, send at least one instance (inputs of "
                       "model '%s': %s)", info->model ? info->model : "", list);
    }
    const cJSON *first = inst->child;
    int named = cJSON_IsObject(first) && !srv_json_is_b64(first);
    if (!named && info->ninputs != 1)
        return srv_err(err, SRV_INVALID_ARGUMENT,
                       "the model has %d inputs: each instance must be an object naming them", info->ninputs);
    const cJSON **vals = calloc((size_t)n, sizeof *vals);
    if (!vals) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    srv_code rc = SRV_OK;
    if (named) { /* every instance: an object with exactly the signature's inputs */
        int64_t i = 0;
        for (const cJSON *e = first; e && rc == SRV_OK; e = e->next, i++) {
            if (!cJSON_IsObject(e) || srv_json_is_b64(e)) {
                rc = srv_err(err, SRV_INVALID_ARGUMENT, "instance %lld is not an object of named inputs", (long long)i);
                break;
            }
            int nk = 0;
            for (const cJSON *k = e->child; k; k = k->next, nk++)
                if (srv_io_find(info, k->string) < 0) {
                    rc = srv_unknown_input(info, k->string, err);
                    break;
                }
            if (rc == SRV_OK && nk != info->ninputs)
                for (int j = 0; j < info->ninputs; j++)
                    if (!cJSON_GetObjectItemCaseSensitive(e, info->inputs[j].name)) {
                        rc = srv_err(err, SRV_INVALID_ARGUMENT, "instance %lld is missing input '%s'", (long long)i,
                                     info->inputs[j].name);
                        break;
                    }
            if (rc == SRV_OK && nk != info->ninputs)
                rc = srv_err(err, SRV_INVALID_ARGUMENT, "instance %lld names an input twice", (long long)i);
        }
    }
    for (int j = 0; j < info->ninputs && rc == SRV_OK; j++) {
        int64_t i = 0;
        for (const cJSON *e = first; e; e = e->next, i++)
            vals[i] = named ? cJSON_GetObjectItemCaseSensitive(e, info->inputs[j].name) : e;
        rc = srv_tfs_tensor(&info->inputs[j], vals, n, 1, 0, in, err);
    }
    free(vals);
    return rc;
}

/* Columnar format. */
static srv_code srv_tfs_columns(const cJSON *inputs, const srv_version_info *info, srv_tensors *in, srv_error *err) {
    int named = cJSON_IsObject(inputs) && !srv_json_is_b64(inputs);
    if (!named) {
        if (info->ninputs != 1)
            return srv_err(err, SRV_INVALID_ARGUMENT, "the model has %d inputs: 'inputs' must be an object naming them",
                           info->ninputs);
        return srv_tfs_tensor(&info->inputs[0], &inputs, 1, 0, 0, in, err);
    }
    int nk = 0;
    for (const cJSON *k = inputs->child; k; k = k->next, nk++)
        if (srv_io_find(info, k->string) < 0) return srv_unknown_input(info, k->string, err);
    for (int j = 0; j < info->ninputs; j++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(inputs, info->inputs[j].name);
        if (!v) return srv_err(err, SRV_INVALID_ARGUMENT, "'inputs' is missing input '%s'", info->inputs[j].name);
        srv_code rc = srv_tfs_tensor(&info->inputs[j], &v, 1, 0, 0, in, err);
        if (rc != SRV_OK) return rc;
    }
    if (nk != info->ninputs) return srv_err(err, SRV_INVALID_ARGUMENT, "'inputs' names an input twice");
    return SRV_OK;
}

/* A plain JSON string at *p with no escapes: its bounds; 0 otherwise. */
static int srv_tfs_fast_str(const char **pp, const char *end, const char **s, size_t *n) {
    const char *p = *pp;
    if (p >= end || *p != '"') return 0;
    const char *q = ++p;
    while (q < end && *q != '"' && *q != '\\' && (unsigned char)*q >= 0x20) q++;
    if (q >= end || *q != '"') return 0;
    *s = p;
    *n = (size_t)(q - p);
    *pp = q + 1;
    return 1;
}

/* The common body, decoded without building a cJSON tree: {"instances": L} or {"inputs": L} (and optionally
 * "signature_name": "" or "serving_default") for a one-input model, L a nested list of plain numbers of the
 * input's dtype (srv_json_fast_array). 1 with the tensor added to in; 0 for anything else, with nothing
 * changed: the general path then decodes (or refuses) the body with its own checks and messages. */
static int srv_tfs_fast_predict(const char *body, size_t len, const srv_version_info *info, srv_tensors *in,
                                srv_tfs_format *fmt) {
    if (info->ninputs != 1 || !body) return 0;
    const srv_io *io = &info->inputs[0];
    const char *p = body, *end = body + len;
    int64_t dims[ENG_MAX_DIMS];
    int ndim = 0, which = -1, nsig = 0; /* which: 0 instances, 1 inputs */
    void *data = NULL;
    p = srv_json_ws(p, end);
    if (p >= end || *p++ != '{') return 0;
    for (;;) {
        const char *k, *sv;
        size_t kn, sn;
        p = srv_json_ws(p, end);
        if (!srv_tfs_fast_str(&p, end, &k, &kn)) goto fail;
        p = srv_json_ws(p, end);
        if (p >= end || *p++ != ':') goto fail;
        p = srv_json_ws(p, end);
        if (kn == 14 && !memcmp(k, "signature_name", 14)) {
            if (nsig++ || !srv_tfs_fast_str(&p, end, &sv, &sn)) goto fail;
            if (sn && (sn != 15 || memcmp(sv, "serving_default", 15))) goto fail;
        } else if ((kn == 9 && !memcmp(k, "instances", 9)) || (kn == 6 && !memcmp(k, "inputs", 6))) {
            if (which >= 0) goto fail;
            which = kn == 6;
            if (!srv_json_fast_array(&p, end, io->dtype, ENG_MAX_DIMS, dims, &ndim, &data)) goto fail;
        } else {
            goto fail;
        }
        p = srv_json_ws(p, end);
        if (p < end && *p == ',') {
            p++;
            continue;
        }
        if (p < end && *p == '}') {
            p++;
            break;
        }
        goto fail;
    }
    for (; p < end; p++) /* trailing bytes: as srv_json_parse allows */
        if (*p != ' ' && *p != '\t' && *p != '\r' && *p != '\n' && *p != '\0') goto fail;
    if (which < 0) goto fail;
    /* shape against the signature: per instance (rows) or whole (columnar) */
    srv_expect ex = {.ndim = io->ndim, .dims = io->dims};
    if (which == 0) {
        ex.ndim = io->ndim >= 1 ? io->ndim - 1 : -1;
        ex.dims = io->dims + 1;
        if (!srv_expect_ok(ex, dims + 1, ndim - 1)) goto fail;
    } else if (!srv_expect_ok(ex, dims, ndim)) {
        goto fail;
    }
    eng_tensor t = {.dtype = io->dtype, .ndim = ndim, .data = data};
    memcpy(t.dims, dims, sizeof(int64_t) * (size_t)ndim);
    size_t nbytes;
    if (eng_tensor_nbytes_checked(&t, io->name, &nbytes) != ENG_STATUS_OK) goto fail;
    if (srv_tensors_add(in, io->name, &t) != 0) return 0; /* frees data; the general path reports the OOM */
    if (fmt) *fmt = which == 0 ? SRV_TFS_ROW : SRV_TFS_COLUMNAR;
    return 1;
fail:
    eng_free(data);
    return 0;
}

srv_code srv_tfs_decode_predict(const char *body, size_t len, const srv_version_info *info, srv_tensors *in,
                                srv_tfs_format *fmt, srv_error *err) {
    if (srv_tfs_fast_predict(body, len, info, in, fmt)) return SRV_OK;
    cJSON *root = srv_json_parse(body, len, err);
    if (!root) return err ? err->code : SRV_INVALID_ARGUMENT;
    srv_code rc;
    const cJSON *inst = cJSON_GetObjectItemCaseSensitive(root, "instances");
    const cJSON *cols = cJSON_GetObjectItemCaseSensitive(root, "inputs");
    if (!cJSON_IsObject(root)) rc = srv_err(err, SRV_INVALID_ARGUMENT, "request body must be a JSON object");
    else if ((rc = srv_tfs_signature(root, err)) != SRV_OK) ;
    else if (info->ninputs <= 0) rc = srv_err(err, SRV_FAILED_PRECONDITION, "the model has no inputs");
    else if (inst && cols) rc = srv_err(err, SRV_INVALID_ARGUMENT, "'instances' and 'inputs' cannot both be present");
    else if (!inst && !cols) rc = srv_err(err, SRV_INVALID_ARGUMENT, "missing 'instances' or 'inputs' key");
    else if (inst) {
        if (fmt) *fmt = SRV_TFS_ROW;
        rc = srv_tfs_rows(inst, info, in, err);
    } else {
        if (fmt) *fmt = SRV_TFS_COLUMNAR;
        rc = srv_tfs_columns(cols, info, in, err);
    }
    cJSON_Delete(root);
    if (rc != SRV_OK) srv_tensors_free(in);
    return rc;
}

/* Feature for input j of example e (with context ctx): by name, else the only feature for 1-input models. */
static const cJSON *srv_tfs_feature(const cJSON *e, const cJSON *ctx, const srv_version_info *info, int j) {
    const char *name = info->inputs[j].name;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, name);
    if (!v && ctx) v = cJSON_GetObjectItemCaseSensitive(ctx, name);
    if (v || info->ninputs != 1) return v;
    int ne = cJSON_GetArraySize(e), nc = ctx ? cJSON_GetArraySize(ctx) : 0;
    if (ne == 1 && nc == 0) return e->child;
    if (ne == 0 && nc == 1) return ctx->child;
    return NULL;
}

srv_code srv_tfs_decode_examples(const char *body, size_t len, const srv_version_info *info, srv_tensors *in,
                                 srv_error *err) {
    cJSON *root = srv_json_parse(body, len, err);
    if (!root) return err ? err->code : SRV_INVALID_ARGUMENT;
    srv_code rc = SRV_OK;
    const cJSON *ex = cJSON_GetObjectItemCaseSensitive(root, "examples");
    const cJSON *ctx = cJSON_GetObjectItemCaseSensitive(root, "context");
    const cJSON **vals = NULL;
    int64_t n = 0;
    if (!cJSON_IsObject(root)) rc = srv_err(err, SRV_INVALID_ARGUMENT, "request body must be a JSON object");
    else if ((rc = srv_tfs_signature(root, err)) != SRV_OK) ;
    else if (info->ninputs <= 0) rc = srv_err(err, SRV_FAILED_PRECONDITION, "the model has no inputs");
    else if (!cJSON_IsArray(ex)) rc = srv_err(err, SRV_INVALID_ARGUMENT, "'examples' must be a list");
    else if ((n = cJSON_GetArraySize(ex)) == 0) {
        char list[512];
        srv_io_names(info, list, sizeof list);
        rc = srv_err(err, SRV_INVALID_ARGUMENT,
                     "'examples' is empty: an empty batch is not served, send at least one example (inputs of "
                     "model '%s': %s)", info->model ? info->model : "", list);
    }
    else if (ctx && !cJSON_IsNull(ctx) && !cJSON_IsObject(ctx))
        rc = srv_err(err, SRV_INVALID_ARGUMENT, "'context' must be an object");
    if (ctx && !cJSON_IsObject(ctx)) ctx = NULL;
    if (rc == SRV_OK && !(vals = calloc((size_t)n, sizeof *vals))) rc = srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    for (int j = 0; j < info->ninputs && rc == SRV_OK; j++) {
        int64_t i = 0;
        for (const cJSON *e = ex->child; e && rc == SRV_OK; e = e->next, i++) {
            if (!cJSON_IsObject(e)) {
                rc = srv_err(err, SRV_INVALID_ARGUMENT, "example %lld is not an object of features", (long long)i);
                break;
            }
            vals[i] = srv_tfs_feature(e, ctx, info, j);
            if (!vals[i])
                rc = srv_err(err, SRV_INVALID_ARGUMENT, "example %lld has no feature '%s'", (long long)i,
                             info->inputs[j].name);
        }
        if (rc == SRV_OK) rc = srv_tfs_tensor(&info->inputs[j], vals, n, 1, 1, in, err);
    }
    free(vals);
    cJSON_Delete(root);
    if (rc != SRV_OK) srv_tensors_free(in);
    return rc;
}

/* ---- replies ---- */

static char *srv_tfs_finish(srv_buf *b, size_t *len, srv_error *err) {
    char *s = srv_buf_take(b, len);
    if (!s) srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory encoding the reply");
    return s;
}

char *srv_tfs_encode_predict(const srv_version_info *info, const srv_tensors *out, srv_tfs_format fmt,
                             size_t *len, srv_error *err) {
    srv_buf b = {0};
    if (out->n <= 0) {
        srv_err(err, SRV_INTERNAL, "the model produced no outputs");
        return NULL;
    }
    if (fmt == SRV_TFS_COLUMNAR) {
        srv_buf_puts(&b, "{\"outputs\":");
        if (out->n > 1) srv_buf_puts(&b, "{");
        for (int j = 0; j < out->n; j++) {
            if (out->n > 1) {
                if (j) srv_buf_puts(&b, ",");
                srv_buf_json_str(&b, out->names[j]);
                srv_buf_puts(&b, ":");
            }
            srv_buf_json_nested(&b, &out->t[j], 0, out->t[j].dims, out->t[j].ndim);
        }
        srv_buf_puts(&b, out->n > 1 ? "}}" : "}");
        return srv_tfs_finish(&b, len, err);
    }
    int64_t batch = -1;
    for (int j = 0; j < out->n; j++) {
        const eng_tensor *t = &out->t[j];
        if (t->ndim < 1 || (batch >= 0 && t->dims[0] != batch)) {
            srv_err(err, SRV_INVALID_ARGUMENT,
                    "output '%s' has inconsistent batch size %lld, expecting %lld (use the columnar 'inputs' format)",
                    out->names[j], (long long)(t->ndim < 1 ? 0 : t->dims[0]), (long long)batch);
            return NULL;
        }
        batch = t->dims[0];
    }
    srv_buf_puts(&b, "{\"predictions\":[");
    for (int64_t i = 0; i < batch && !b.oom; i++) {
        if (i) srv_buf_puts(&b, ",");
        if (out->n > 1) srv_buf_puts(&b, "{");
        for (int j = 0; j < out->n; j++) {
            const eng_tensor *t = &out->t[j];
            int64_t inner = eng_shape_numel(t->dims + 1, t->ndim - 1);
            if (out->n > 1) {
                if (j) srv_buf_puts(&b, ",");
                srv_buf_json_str(&b, out->names[j]);
                srv_buf_puts(&b, ":");
            }
            srv_buf_json_nested(&b, t, i * inner, t->dims + 1, t->ndim - 1);
        }
        if (out->n > 1) srv_buf_puts(&b, "}");
    }
    srv_buf_puts(&b, "]}");
    (void)info;
    return srv_tfs_finish(&b, len, err);
}

/* Output to use for classify/regress: by one of names, else the first float output, else the first. */
static int srv_tfs_pick(const srv_tensors *out, const char *const *names) {
    for (const char *const *n = names; *n; n++) {
        int i = srv_tensors_find(out, *n);
        if (i >= 0) return i;
    }
    for (int i = 0; i < out->n; i++)
        if (eng_dtype_is_float(out->t[i].dtype)) return i;
    return out->n > 0 ? 0 : -1;
}

/* The output a classify (regress = 0) or regress reply reports (srv_tfs_pick by names), its shape checked:
 * [n, k] or [n] scores, or one value per example. -1 with err set. */
static int srv_tfs_result(const srv_tensors *out, const char *const *names, int regress, srv_error *err) {
    char sb[160];
    int j = srv_tfs_pick(out, names);
    if (j < 0) {
        srv_err(err, SRV_INTERNAL, "the model produced no outputs");
        return -1;
    }
    const eng_tensor *t = &out->t[j];
    int ok = t->ndim >= 1 && t->ndim <= 2 && (!regress || t->ndim == 1 || t->dims[1] == 1);
    if (!ok) {
        srv_err(err, SRV_FAILED_PRECONDITION, "%s; output '%s' is %s",
                regress ? "regress needs one value per example" : "classify needs scores of shape [batch, classes]",
                out->names[j], eng_shape_str(t->dims, t->ndim, sb, sizeof sb));
        return -1;
    }
    return j;
}

int srv_tfs_classify_scores(const srv_tensors *out, int64_t *n, int64_t *k, srv_error *err) {
    static const char *const names[] = {"scores", "probabilities", "probs", "output", "outputs", NULL};
    int j = srv_tfs_result(out, names, 0, err);
    if (j < 0) return -1;
    *n = out->t[j].dims[0];
    *k = out->t[j].ndim == 2 ? out->t[j].dims[1] : 1;
    return j;
}

int srv_tfs_regress_values(const srv_tensors *out, srv_error *err) {
    static const char *const names[] = {"outputs", "output", "predictions", "scores", NULL};
    return srv_tfs_result(out, names, 1, err);
}

char *srv_tfs_encode_classify(const srv_version_info *info, const srv_tensors *out, size_t *len, srv_error *err) {
    int64_t n, k;
    int j = srv_tfs_classify_scores(out, &n, &k, err);
    if (j < 0) return NULL;
    const eng_tensor *t = &out->t[j];
    int use_labels = info && info->labels && info->nlabels == k;
    srv_buf b = {0};
    srv_buf_puts(&b, "{\"results\":[");
    for (int64_t i = 0; i < n && !b.oom; i++) {
        srv_buf_puts(&b, i ? ",[" : "[");
        for (int64_t c = 0; c < k; c++) {
            srv_buf_puts(&b, c ? ",[" : "[");
            if (use_labels) srv_buf_json_str(&b, info->labels[c]);
            else srv_buf_printf(&b, "\"%lld\"", (long long)c);
            srv_buf_puts(&b, ",");
            srv_buf_json_elem(&b, t, i * k + c);
            srv_buf_puts(&b, "]");
        }
        srv_buf_puts(&b, "]");
    }
    srv_buf_puts(&b, "]}");
    return srv_tfs_finish(&b, len, err);
}

char *srv_tfs_encode_regress(const srv_version_info *info, const srv_tensors *out, size_t *len, srv_error *err) {
    int j = srv_tfs_regress_values(out, err);
    if (j < 0) return NULL;
    const eng_tensor *t = &out->t[j];
    srv_buf b = {0};
    srv_buf_puts(&b, "{\"results\":[");
    for (int64_t i = 0; i < t->dims[0] && !b.oom; i++) {
        if (i) srv_buf_puts(&b, ",");
        srv_buf_json_elem(&b, t, i);
    }
    srv_buf_puts(&b, "]}");
    (void)info;
    return srv_tfs_finish(&b, len, err);
}
