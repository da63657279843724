/* codec-kserve.c - KServe v2 / Triton inference bodies <-> tensors, with the binary tensor data extension
 * (see codec.h).
 *
 * Request: a JSON header (json_len bytes) optionally followed by the raw bytes of the inputs that carry
 * parameters.binary_data_size, concatenated in the order the inputs are listed. Every input's declared
 * shape is checked against the model's (rank, known dims) and its byte size computed with checked
 * arithmetic BEFORE anything is allocated; the allocation then never exceeds what the request carries
 * (JSON element count or binary byte count must equal the declared shape exactly). Datatypes must match the
 * model's, as Triton requires. Reply: outputs in the requested order (all, in signature order, when none
 * were named), as flat JSON data or, where asked, as binary appended after the JSON header.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "json.h"

static const struct { eng_dtype dt; const char *name; const char *tf; } srv_kserve_types[] = {
    {ENG_DTYPE_BOOL, "BOOL", "DT_BOOL"},     {ENG_DTYPE_U8, "UINT8", "DT_UINT8"},
    {ENG_DTYPE_U16, "UINT16", "DT_UINT16"},  {ENG_DTYPE_U32, "UINT32", "DT_UINT32"},
    {ENG_DTYPE_U64, "UINT64", "DT_UINT64"},  {ENG_DTYPE_I8, "INT8", "DT_INT8"},
    {ENG_DTYPE_I16, "INT16", "DT_INT16"},    {ENG_DTYPE_I32, "INT32", "DT_INT32"},
    {ENG_DTYPE_I64, "INT64", "DT_INT64"},    {ENG_DTYPE_F16, "FP16", "DT_HALF"},
    {ENG_DTYPE_F32, "FP32", "DT_FLOAT"},     {ENG_DTYPE_F64, "FP64", "DT_DOUBLE"},
    {ENG_DTYPE_BF16, "BF16", "DT_BFLOAT16"}, {ENG_DTYPE_STRING, "BYTES", "DT_STRING"},
};
#define SRV_NKTYPES (sizeof srv_kserve_types / sizeof srv_kserve_types[0])

const char *srv_kserve_dtype(eng_dtype dt) {
    for (size_t i = 0; i < SRV_NKTYPES; i++)
        if (srv_kserve_types[i].dt == dt) return srv_kserve_types[i].name;
    return "INVALID";
}

eng_dtype srv_kserve_dtype_parse(const char *s) {
    if (!s) return ENG_DTYPE_UNDEFINED;
    for (size_t i = 0; i < SRV_NKTYPES; i++)
        if (strcmp(srv_kserve_types[i].name, s) == 0) return srv_kserve_types[i].dt;
    return ENG_DTYPE_UNDEFINED;
}

const char *srv_tf_dtype(eng_dtype dt) {
    for (size_t i = 0; i < SRV_NKTYPES; i++)
        if (srv_kserve_types[i].dt == dt) return srv_kserve_types[i].tf;
    return "DT_INVALID";
}

void srv_kserve_req_free(srv_kserve_req *r) {
    if (!r) return;
    free(r->id);
    for (int i = 0; i < r->noutputs; i++) free(r->outputs[i]);
    free(r->outputs);
    free(r->output_binary);
    free(r->output_class);
    memset(r, 0, sizeof *r);
}

/* Leaves of a (possibly nested) data list; -1 (err set) on an object or too many. */
static int64_t srv_kserve_count(const cJSON *v, int depth, const char *name, srv_error *err) {
    if (!cJSON_IsArray(v)) {
        if (cJSON_IsObject(v)) {
            srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': 'data' holds an object", name);
            return -1;
        }
        return 1;
    }
    if (depth > SRV_JSON_MAX_DEPTH) {
        srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': 'data' nests too deep", name);
        return -1;
    }
    int64_t n = 0;
    for (const cJSON *c = v->child; c; c = c->next) {
        int64_t k = srv_kserve_count(c, depth + 1, name, err);
        if (k < 0) return -1;
        n += k;
    }
    return n;
}

static srv_code srv_kserve_fill(const cJSON *v, int depth, eng_dtype dt, void *dst, int64_t *idx, int64_t cap,
                                const char *name, srv_error *err) {
    if (!cJSON_IsArray(v)) {
        if (*idx >= cap) return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': too many values", name);
        srv_code rc = srv_json_store(v, dt, dst, *idx, name, err);
        (*idx)++;
        return rc;
    }
    if (depth > SRV_JSON_MAX_DEPTH) return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': 'data' nests too deep", name);
    for (const cJSON *c = v->child; c; c = c->next) {
        srv_code rc = srv_kserve_fill(c, depth + 1, dt, dst, idx, cap, name, err);
        if (rc != SRV_OK) return rc;
    }
    return SRV_OK;
}

/* Integral JSON number in [0, 2^62]; -1 otherwise. */
static int64_t srv_kserve_uint(const cJSON *v) {
    int64_t i; /* exact, from the number's text where a double could round it */
    if (!srv_json_int64(v, &i) || i < 0 || i > ((int64_t)1 << 62)) return -1;
    return i;
}

/* One entry of "inputs". *cursor walks the binary section. */
static srv_code srv_kserve_input(const cJSON *e, const char *body, size_t len, size_t *cursor,
                                 const srv_version_info *info, char *seen, srv_tensors *in, srv_error *err) {
    char sa[160], sb[160];
    const char *model = info->model ? info->model : "";
    if (!cJSON_IsObject(e)) return srv_err(err, SRV_INVALID_ARGUMENT, "each entry of 'inputs' must be an object");
    const cJSON *jn = cJSON_GetObjectItemCaseSensitive(e, "name");
    const cJSON *jt = cJSON_GetObjectItemCaseSensitive(e, "datatype");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *jp = cJSON_GetObjectItemCaseSensitive(e, "parameters");
    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "data");
    if (!cJSON_IsString(jn)) return srv_err(err, SRV_INVALID_ARGUMENT, "an input has no 'name'");
    const char *name = jn->valuestring;
    int k = -1;
    for (int i = 0; i < info->ninputs && k < 0; i++)
        if (strcmp(info->inputs[i].name, name) == 0) k = i;
    if (k < 0)
        return srv_err(err, SRV_INVALID_ARGUMENT, "unexpected inference input '%.200s' for model '%s'", name, model);
    if (seen[k]) return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s' is given twice", name);
    seen[k] = 1;
    const srv_io *io = &info->inputs[k];
    if (!cJSON_IsString(jt)) return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s' has no 'datatype'", name);
    eng_dtype dt = srv_kserve_dtype_parse(jt->valuestring);
    if (dt != io->dtype)
        return srv_err(err, SRV_INVALID_ARGUMENT,
                       "unexpected datatype '%.32s' for inference input '%s', expecting %s for model '%s'",
                       jt->valuestring, name, srv_kserve_dtype(io->dtype), model);
    if (eng_dtype_size(dt) == 0)
        return srv_err(err, SRV_UNIMPLEMENTED, "input '%s': datatype %s is not supported", name, jt->valuestring);
    if (!cJSON_IsArray(js)) return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s' has no 'shape' list", name);
    eng_tensor t = {.dtype = dt};
    for (const cJSON *c = js->child; c; c = c->next) {
        if (t.ndim >= ENG_MAX_DIMS)
            return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': shape has more than %d dims", name, ENG_MAX_DIMS);
        int64_t d = srv_kserve_uint(c);
        if (d < 0)
            return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': shape entries must be non-negative integers", name);
        t.dims[t.ndim++] = d;
    }
    int ok = io->ndim < 0 || io->ndim == t.ndim;
    for (int i = 0; ok && io->ndim >= 0 && i < t.ndim; i++)
        if (io->dims[i] >= 0 && io->dims[i] != t.dims[i]) ok = 0;
    if (!ok)
        return srv_err(err, SRV_INVALID_ARGUMENT, "unexpected shape for input '%s' for model '%s'. Expected %s, got %s",
                       name, model, eng_shape_str(io->dims, io->ndim < 0 ? 0 : io->ndim, sa, sizeof sa),
                       eng_shape_str(t.dims, t.ndim, sb, sizeof sb));
    size_t nbytes;
    if (eng_tensor_nbytes_checked(&t, name, &nbytes) != ENG_STATUS_OK)
        return srv_err(err, SRV_INVALID_ARGUMENT, "%s", eng_last_error());
    int64_t numel = eng_tensor_numel(&t);
    const cJSON *jb = cJSON_IsObject(jp) ? cJSON_GetObjectItemCaseSensitive(jp, "binary_data_size") : NULL;
    if (jb) {
        int64_t bsz = srv_kserve_uint(jb);
        if (jd) return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s' has both 'data' and binary_data_size", name);
        if (bsz < 0) return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': bad binary_data_size", name);
        if ((uint64_t)bsz != nbytes)
            return srv_err(err, SRV_INVALID_ARGUMENT,
                           "input '%s': binary_data_size %lld does not match shape %s of %s (%zu bytes)", name,
                           (long long)bsz, eng_shape_str(t.dims, t.ndim, sb, sizeof sb), jt->valuestring, nbytes);
        if (*cursor > len || nbytes > len - *cursor)
            return srv_err(err, SRV_INVALID_ARGUMENT,
                           "input '%s': binary data of %zu bytes runs past the end of the body (%zu bytes left)", name,
                           nbytes, *cursor <= len ? len - *cursor : 0);
        t.data = eng_alloc(nbytes ? nbytes : 1);
        if (!t.data) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "input '%s': out of memory", name);
        if (nbytes) memcpy(t.data, body + *cursor, nbytes);
        *cursor += nbytes;
    } else {
        if (!jd) return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s' has neither 'data' nor binary_data_size", name);
        int64_t cnt = srv_kserve_count(jd, 0, name, err);
        if (cnt < 0) return SRV_INVALID_ARGUMENT;
        if (!cJSON_IsArray(jd) && t.ndim > 0) cnt = -2; /* a bare value only for rank 0 */
        if (cnt != numel)
            return srv_err(err, SRV_INVALID_ARGUMENT,
                           "input '%s': 'data' has %lld values but shape %s needs %lld", name,
                           (long long)(cnt < 0 ? 1 : cnt), eng_shape_str(t.dims, t.ndim, sb, sizeof sb),
                           (long long)numel);
        t.data = eng_alloc(nbytes ? nbytes : 1);
        if (!t.data) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "input '%s': out of memory", name);
        int64_t idx = 0;
        srv_code rc = srv_kserve_fill(jd, 0, dt, t.data, &idx, numel, name, err);
        if (rc != SRV_OK) {
            eng_free(t.data);
            return rc;
        }
    }
    if (srv_tensors_add(in, name, &t) != 0) /* frees t.data */
        return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    return SRV_OK;
}

static srv_code srv_kserve_outputs(const cJSON *jo, const srv_version_info *info, srv_kserve_req *req,
                                   srv_error *err) {
    if (!jo || cJSON_IsNull(jo)) return SRV_OK;
    if (!cJSON_IsArray(jo)) return srv_err(err, SRV_INVALID_ARGUMENT, "'outputs' must be a list");
    int n = cJSON_GetArraySize(jo);
    if (n == 0) return SRV_OK;
    if (n > 4096) return srv_err(err, SRV_INVALID_ARGUMENT, "too many requested outputs");
    req->outputs = calloc((size_t)n, sizeof *req->outputs);
    req->output_binary = calloc((size_t)n, sizeof *req->output_binary);
    req->output_class = calloc((size_t)n, sizeof *req->output_class);
    if (!req->outputs || !req->output_binary || !req->output_class)
        return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    for (const cJSON *e = jo->child; e; e = e->next) {
        const cJSON *jn = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "name") : NULL;
        if (!cJSON_IsString(jn)) return srv_err(err, SRV_INVALID_ARGUMENT, "a requested output has no 'name'");
        int k = -1;
        for (int i = 0; i < info->noutputs && k < 0; i++)
            if (strcmp(info->outputs[i].name, jn->valuestring) == 0) k = i;
        if (k < 0)
            return srv_err(err, SRV_INVALID_ARGUMENT, "unexpected inference output '%.200s' for model '%s'",
                           jn->valuestring, info->model ? info->model : "");
        for (int i = 0; i < req->noutputs; i++)
            if (strcmp(req->outputs[i], jn->valuestring) == 0)
                return srv_err(err, SRV_INVALID_ARGUMENT, "output '%s' is requested twice", jn->valuestring);
        const cJSON *jp = cJSON_GetObjectItemCaseSensitive(e, "parameters");
        const cJSON *jb = cJSON_IsObject(jp) ? cJSON_GetObjectItemCaseSensitive(jp, "binary_data") : NULL;
        const cJSON *jc = cJSON_IsObject(jp) ? cJSON_GetObjectItemCaseSensitive(jp, "classification") : NULL;
        if (jc && (req->output_class[req->noutputs] = srv_kserve_uint(jc)) < 0)
            return srv_err(err, SRV_INVALID_ARGUMENT,
                           "output '%s': parameters.classification must be a non-negative integer (the class count)",
                           jn->valuestring);
        if (!(req->outputs[req->noutputs] = strdup(jn->valuestring)))
            return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
        req->output_binary[req->noutputs++] = cJSON_IsTrue(jb);
    }
    return SRV_OK;
}

/* ---- fast path: the common body without a cJSON tree ---- */

/* A plain JSON string (no escapes, no control characters) at *pp: its bounds. */
static int srv_kfast_str(const char **pp, const char *end, const char **s, size_t *n) {
    const char *p = *pp;
    if (p >= end || *p != '"') return 0;
    const char *q = ++p;
    while (q < end && *q != '"' && *q != '\\' && (unsigned char)*q >= 0x20) q++;
    if (q >= end) return 0;
    *s = p;
    *n = (size_t)(q - p);
    *pp = q + 1;
    return 1;
}

static int srv_kfast_is(const char *s, size_t n, const char *lit) { return strlen(lit) == n && !memcmp(s, lit, n); }

/* '"key" :' at *pp (after whitespace); the key's bounds. */
static int srv_kfast_key(const char **pp, const char *end, const char **k, size_t *kn) {
    const char *p = srv_json_ws(*pp, end);
    if (!srv_kfast_str(&p, end, k, kn)) return 0;
    p = srv_json_ws(p, end);
    if (p >= end || *p != ':') return 0;
    *pp = srv_json_ws(p + 1, end);
    return 1;
}

/* After a member: ',' (1) or the closing c (2); 0 otherwise. */
static int srv_kfast_next(const char **pp, const char *end, char c) {
    const char *p = srv_json_ws(*pp, end);
    if (p >= end || (*p != ',' && *p != c)) return 0;
    *pp = p + 1;
    return *p == ',' ? 1 : 2;
}

/* One input object {"name", "datatype", "shape": [plain integers], "data": [numbers]} (name and datatype before
 * data, nothing else) that the general path would accept as is; 1 with the tensor added. */
static int srv_kfast_input(const char **pp, const char *end, const srv_version_info *info, char *seen,
                           srv_tensors *in) {
    const char *p = srv_json_ws(*pp, end), *name = NULL, *dts = NULL;
    size_t namen = 0, dtn = 0;
    int k = -1, have_shape = 0, have_data = 0, ndim = 0, dn = 0;
    int64_t dims[ENG_MAX_DIMS], ddims[ENG_MAX_DIMS];
    eng_tensor t = {0};
    void *data = NULL;
    if (p >= end || *p++ != '{') return 0;
    for (;;) {
        const char *key;
        size_t kn;
        if (!srv_kfast_key(&p, end, &key, &kn)) goto fail;
        if (srv_kfast_is(key, kn, "name") && !name) {
            if (!srv_kfast_str(&p, end, &name, &namen)) goto fail;
            for (int i = 0; i < info->ninputs && k < 0; i++)
                if (srv_kfast_is(name, namen, info->inputs[i].name)) k = i;
            if (k < 0 || seen[k]) goto fail;
        } else if (srv_kfast_is(key, kn, "datatype") && !dts) {
            if (!srv_kfast_str(&p, end, &dts, &dtn)) goto fail;
        } else if (srv_kfast_is(key, kn, "shape") && !have_shape) {
            have_shape = 1;
            if (p >= end || *p++ != '[') goto fail;
            p = srv_json_ws(p, end);
            if (p < end && *p == ']') {
                p++;
            } else {
                for (;;) {
                    p = srv_json_ws(p, end);
                    int64_t v = 0;
                    int nd = 0;
                    if (p < end && *p == '0') p++, nd = 1;
                    else
                        for (; p < end && *p >= '0' && *p <= '9' && nd < 18; p++, nd++) v = v * 10 + (*p - '0');
                    if (!nd || ndim >= ENG_MAX_DIMS || (p < end && (*p == '.' || *p == 'e' || *p == 'E' ||
                                                                     (*p >= '0' && *p <= '9'))))
                        goto fail;
                    dims[ndim++] = v;
                    int r = srv_kfast_next(&p, end, ']');
                    if (r == 2) break;
                    if (r == 0) goto fail;
                }
            }
        } else if (srv_kfast_is(key, kn, "data") && !have_data && name && dts) {
            have_data = 1;
            if (!srv_json_fast_array(&p, end, info->inputs[k].dtype, ENG_MAX_DIMS, ddims, &dn, &data)) goto fail;
        } else {
            goto fail;
        }
        int r = srv_kfast_next(&p, end, '}');
        if (r == 2) break;
        if (r == 0) goto fail;
    }
    if (!name || !dts || !have_shape || !have_data) goto fail;
    const srv_io *io = &info->inputs[k];
    char dtbuf[16];
    if (dtn >= sizeof dtbuf) goto fail;
    memcpy(dtbuf, dts, dtn);
    dtbuf[dtn] = '\0';
    if (srv_kserve_dtype_parse(dtbuf) != io->dtype || eng_dtype_size(io->dtype) == 0) goto fail;
    t.dtype = io->dtype;
    t.ndim = ndim;
    memcpy(t.dims, dims, sizeof(int64_t) * (size_t)ndim);
    int ok = io->ndim < 0 || io->ndim == t.ndim;
    for (int i = 0; ok && io->ndim >= 0 && i < t.ndim; i++)
        if (io->dims[i] >= 0 && io->dims[i] != t.dims[i]) ok = 0;
    size_t nbytes;
    if (!ok || eng_tensor_nbytes_checked(&t, io->name, &nbytes) != ENG_STATUS_OK) goto fail;
    if (eng_shape_numel(ddims, dn) != eng_tensor_numel(&t)) goto fail; /* 'data' must carry exactly numel values */
    t.data = data;
    seen[k] = 1;
    if (srv_tensors_add(in, io->name, &t) != 0) return 0; /* frees data */
    *pp = p;
    return 1;
fail:
    eng_free(data);
    return 0;
}

/* {"inputs": [input, ...], "id": "..."} with every model input given once, nothing else, no binary section:
 * 1 with in and req filled; 0 (in and req left empty) for anything else: the general path then decides. */
static int srv_kserve_fast(const char *body, size_t len, const srv_version_info *info, srv_tensors *in,
                           srv_kserve_req *req) {
    const char *p = body, *end = body + len, *id = NULL;
    size_t idn = 0;
    int have_inputs = 0, given = 0;
    char seen[64] = {0};
    if (!body || info->ninputs < 1 || info->ninputs > (int)sizeof seen) return 0;
    p = srv_json_ws(p, end);
    if (p >= end || *p++ != '{') return 0;
    for (;;) {
        const char *key;
        size_t kn;
        if (!srv_kfast_key(&p, end, &key, &kn)) goto fail;
        if (srv_kfast_is(key, kn, "inputs") && !have_inputs) {
            have_inputs = 1;
            if (p >= end || *p++ != '[') goto fail;
            for (;;) {
                if (!srv_kfast_input(&p, end, info, seen, in)) goto fail;
                given++;
                int r = srv_kfast_next(&p, end, ']');
                if (r == 2) break;
                if (r == 0) goto fail;
            }
        } else if (srv_kfast_is(key, kn, "id") && !id) {
            if (!srv_kfast_str(&p, end, &id, &idn)) goto fail;
        } else {
            goto fail;
        }
        int r = srv_kfast_next(&p, end, '}');
        if (r == 2) break;
        if (r == 0) goto fail;
    }
    for (; p < end; p++) /* trailing bytes: as srv_json_parse allows */
        if (*p != ' ' && *p != '\t' && *p != '\r' && *p != '\n' && *p != '\0') goto fail;
    if (!have_inputs || given != info->ninputs) goto fail;
    if (id && !(req->id = strndup(id, idn))) goto fail;
    return 1;
fail:
    srv_tensors_free(in);
    return 0;
}

srv_code srv_kserve_decode_infer(const char *body, size_t len, size_t json_len, const srv_version_info *info,
                                 srv_tensors *in, srv_kserve_req *req, srv_error *err) {
    memset(req, 0, sizeof *req);
    if (json_len == len && srv_kserve_fast(body, len, info, in, req)) return SRV_OK;
    if (json_len > len)
        return srv_err(err, SRV_INVALID_ARGUMENT, "Inference-Header-Content-Length %zu exceeds the body (%zu bytes)",
                       json_len, len);
    cJSON *root = srv_json_parse(body, json_len, err);
    if (!root) return SRV_INVALID_ARGUMENT;
    srv_code rc = SRV_OK;
    char *seen = NULL;
    const cJSON *ji = cJSON_GetObjectItemCaseSensitive(root, "inputs");
    const cJSON *jid = cJSON_GetObjectItemCaseSensitive(root, "id");
    const cJSON *jp = cJSON_GetObjectItemCaseSensitive(root, "parameters");
    if (!cJSON_IsObject(root)) rc = srv_err(err, SRV_INVALID_ARGUMENT, "request body must be a JSON object");
    else if (!cJSON_IsArray(ji) || !ji->child) rc = srv_err(err, SRV_INVALID_ARGUMENT, "'inputs' must be a non-empty list");
    else if (jid && !cJSON_IsNull(jid) && !cJSON_IsString(jid)) rc = srv_err(err, SRV_INVALID_ARGUMENT, "'id' must be a string");
    else if (!(seen = calloc((size_t)info->ninputs + 1, 1))) rc = srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    if (rc == SRV_OK && cJSON_IsString(jid) && !(req->id = strdup(jid->valuestring)))
        rc = srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    if (rc == SRV_OK && cJSON_IsObject(jp))
        req->binary_output_all = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(jp, "binary_data_output"));
    size_t cursor = json_len;
    int given = 0;
    for (const cJSON *e = rc == SRV_OK ? ji->child : NULL; e && rc == SRV_OK; e = e->next, given++)
        rc = srv_kserve_input(e, body, len, &cursor, info, seen, in, err);
    if (rc == SRV_OK && given != info->ninputs)
        for (int i = 0; i < info->ninputs; i++)
            if (!seen[i]) {
                rc = srv_err(err, SRV_INVALID_ARGUMENT, "expected %d inputs but got %d inputs for model '%s': missing '%s'",
                             info->ninputs, given, info->model ? info->model : "", info->inputs[i].name);
                break;
            }
    if (rc == SRV_OK && cursor != len)
        rc = srv_err(err, SRV_INVALID_ARGUMENT, "unexpected additional input data: %zu bytes after the last input",
                     len - cursor);
    if (rc == SRV_OK) rc = srv_kserve_outputs(cJSON_GetObjectItemCaseSensitive(root, "outputs"), info, req, err);
    free(seen);
    cJSON_Delete(root);
    if (rc != SRV_OK) {
        srv_tensors_free(in);
        srv_kserve_req_free(req);
    }
    return rc;
}

/* ---- Triton's classification extension and batch dimension ---- */

int64_t srv_kserve_max_batch(const srv_version_info *info, const srv_batch_opts *batching) {
    if (batching) return batching->max_batch_size > 0 ? batching->max_batch_size : 1;
    if (!info || info->ninputs < 1) return 0;
    for (int i = 0; i < info->ninputs; i++)
        if (info->inputs[i].ndim < 1 || info->inputs[i].dims[0] >= 0) return 0;
    for (int i = 0; i < info->noutputs; i++)
        if (info->outputs[i].ndim < 1 || info->outputs[i].dims[0] >= 0) return 0;
    return SRV_KSERVE_AUTO_MAX_BATCH;
}

typedef struct srv_kclass_ent {
    double v;
    int64_t i;
} srv_kclass_ent;

static int srv_kclass_cmp(const void *pa, const void *pb) { /* descending value, NaN last, ties: lower index */
    const srv_kclass_ent *a = pa, *b = pb;
    int na = isnan(a->v), nb = isnan(b->v);
    if (na != nb) return na - nb;
    if (!na && a->v != b->v) return a->v > b->v ? -1 : 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

/* Element i of t as Triton prints a class value (C++ std::to_string: "%f" for floats, decimal for integers). */
static int srv_kclass_value(char *buf, size_t n, const eng_tensor *t, int64_t i) {
    const void *d = t->data;
    switch (t->dtype) {
    case ENG_DTYPE_F32: return snprintf(buf, n, "%f", (double)((const float *)d)[i]);
    case ENG_DTYPE_F64: return snprintf(buf, n, "%f", ((const double *)d)[i]);
    case ENG_DTYPE_F16: return snprintf(buf, n, "%f", (double)eng_f16_to_f32(((const uint16_t *)d)[i]));
    case ENG_DTYPE_BF16: return snprintf(buf, n, "%f", (double)eng_bf16_to_f32(((const uint16_t *)d)[i]));
    case ENG_DTYPE_U8: return snprintf(buf, n, "%u", (unsigned)((const uint8_t *)d)[i]);
    case ENG_DTYPE_U16: return snprintf(buf, n, "%u", (unsigned)((const uint16_t *)d)[i]);
    case ENG_DTYPE_U32: return snprintf(buf, n, "%lu", (unsigned long)((const uint32_t *)d)[i]);
    case ENG_DTYPE_U64: return snprintf(buf, n, "%llu", (unsigned long long)((const uint64_t *)d)[i]);
    default: return snprintf(buf, n, "%lld", (long long)eng_tensor_get_i64(t, i)); /* signed integers */
    }
}

/* Classify output t: the min(k, classes) largest values of each row (dim 0 when batch_first, else the whole
 * tensor is one row), descending, each as "value:index[:label]" (label from info->labels when it has one for
 * that index). Appends Triton's BYTES serialization (per entry a 4-byte little-endian length, then the bytes) to
 * ser; *rows is the row count (-1: no batch dimension) and *kout the entries per row. Cost O(rows x classes x
 * log classes); nothing allocated beyond one row's sort buffer and the output. */
static srv_code srv_kclass(const srv_version_info *info, const char *name, const eng_tensor *t, int64_t k,
                           int batch_first, srv_buf *ser, int64_t *rows, int64_t *kout, srv_error *err) {
    if (!(eng_dtype_is_float(t->dtype) || eng_dtype_is_int(t->dtype)) || !t->data)
        return srv_err(err, SRV_INVALID_ARGUMENT,
                       "class result not available for output '%s' due to unsupported type '%s'", name,
                       srv_kserve_dtype(t->dtype));
    int64_t numel = eng_tensor_numel(t), nrows = batch_first && t->ndim >= 1 ? t->dims[0] : -1;
    int64_t per = nrows >= 0 ? (nrows ? numel / nrows : 0) : numel;
    int64_t kk = k < per ? k : per;
    *rows = nrows;
    *kout = kk;
    srv_kclass_ent *e = per > 0 ? malloc((size_t)per * sizeof *e) : NULL;
    if (per > 0 && !e) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "output '%s': out of memory classifying", name);
    char val[400], idx[32];
    for (int64_t r = 0; r < (nrows >= 0 ? nrows : 1) && !ser->oom; r++) {
        for (int64_t j = 0; j < per; j++) e[j] = (srv_kclass_ent){eng_tensor_get_f64(t, r * per + j), j};
        qsort(e, (size_t)per, sizeof *e, srv_kclass_cmp);
        for (int64_t j = 0; j < kk; j++) {
            int vn = srv_kclass_value(val, sizeof val, t, r * per + e[j].i);
            if (vn < 0 || (size_t)vn >= sizeof val) vn = vn < 0 ? 0 : (int)sizeof val - 1;
            int in = snprintf(idx, sizeof idx, ":%lld", (long long)e[j].i);
            const char *lab = info && info->labels && e[j].i < info->nlabels ? info->labels[e[j].i] : NULL;
            size_t ln = lab ? strlen(lab) + 1 : 0;
            uint32_t total = (uint32_t)((size_t)vn + (size_t)in + ln);
            unsigned char le[4] = {(unsigned char)total, (unsigned char)(total >> 8), (unsigned char)(total >> 16),
                                   (unsigned char)(total >> 24)};
            srv_buf_put(ser, le, 4);
            srv_buf_put(ser, val, (size_t)vn);
            srv_buf_put(ser, idx, (size_t)in);
            if (lab) {
                srv_buf_put(ser, ":", 1);
                srv_buf_put(ser, lab, ln - 1);
            }
        }
    }
    free(e);
    if (ser->oom) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "output '%s': out of memory classifying", name);
    return SRV_OK;
}

/* The output object of a classified output: BYTES, shape [rows, k] (or [k]), its strings as JSON data or, when
 * bin, as binary_data_size of the serialization appended after the JSON header. */
static void srv_kclass_json(srv_buf *b, const char *name, const srv_buf *ser, int64_t rows, int64_t k, int bin) {
    srv_buf_puts(b, "{\"name\":");
    srv_buf_json_str(b, name);
    if (rows >= 0) srv_buf_printf(b, ",\"datatype\":\"BYTES\",\"shape\":[%lld,%lld]", (long long)rows, (long long)k);
    else srv_buf_printf(b, ",\"datatype\":\"BYTES\",\"shape\":[%lld]", (long long)k);
    if (bin) {
        srv_buf_printf(b, ",\"parameters\":{\"binary_data_size\":%zu}}", ser->len);
        return;
    }
    srv_buf_puts(b, ",\"data\":[");
    srv_buf s = {0};
    for (size_t off = 0; off + 4 <= ser->len && !b->oom;) {
        const unsigned char *p = (const unsigned char *)ser->p + off;
        size_t n = (size_t)p[0] | (size_t)p[1] << 8 | (size_t)p[2] << 16 | (size_t)p[3] << 24;
        s.len = 0;
        srv_buf_put(&s, p + 4, n);
        srv_buf_put(&s, "", 1); /* NUL-terminated for srv_buf_json_str (entries hold no NUL) */
        if (off) srv_buf_puts(b, ",");
        srv_buf_json_str(b, s.oom ? "" : s.p);
        if (s.oom) b->oom = 1;
        off += 4 + n;
    }
    srv_buf_free(&s);
    srv_buf_puts(b, "]}");
}

char *srv_kserve_encode_infer(const srv_version_info *info, const srv_tensors *out, const srv_kserve_req *req,
                              size_t *len, size_t *json_len, srv_error *err) {
    int nsel = req && req->noutputs > 0 ? req->noutputs : out->n;
    int *sel = calloc((size_t)nsel + 1, sizeof *sel), *bin = calloc((size_t)nsel + 1, sizeof *bin);
    srv_buf b = {0}, *cls = calloc((size_t)nsel + 1, sizeof *cls); /* classification outputs, serialized */
    int64_t *crows = calloc((size_t)nsel + 1, sizeof *crows), *ck = calloc((size_t)nsel + 1, sizeof *ck);
    int *iscls = calloc((size_t)nsel + 1, sizeof *iscls);
    char *res = NULL;
    if (!sel || !bin || !cls || !crows || !ck || !iscls) {
        srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
        goto done;
    }
    for (int i = 0; i < nsel; i++) {
        sel[i] = req && req->noutputs > 0 ? srv_tensors_find(out, req->outputs[i]) : i;
        if (sel[i] < 0) {
            srv_err(err, SRV_INVALID_ARGUMENT, "unexpected inference output '%s'", req->outputs[i]);
            goto done;
        }
        bin[i] = (req && req->binary_output_all) || (req && req->noutputs > 0 && req->output_binary[i]);
        int64_t k = req && req->noutputs > 0 && req->output_class ? req->output_class[i] : 0;
        iscls[i] = k > 0;
        if (iscls[i] && srv_kclass(info, out->names[sel[i]], &out->t[sel[i]], k, req->batch_first, &cls[i],
                                   &crows[i], &ck[i], err) != SRV_OK)
            goto done;
        if (bin[i] && !iscls[i] && eng_dtype_size(out->t[sel[i]].dtype) == 0) bin[i] = 0;
    }
    srv_buf_puts(&b, "{");
    if (req && req->id) {
        srv_buf_puts(&b, "\"id\":");
        srv_buf_json_str(&b, req->id);
        srv_buf_puts(&b, ",");
    }
    srv_buf_puts(&b, "\"model_name\":");
    srv_buf_json_str(&b, info && info->model ? info->model : "");
    srv_buf_printf(&b, ",\"model_version\":\"%lld\",\"outputs\":[", (long long)(info ? info->version : 0));
    for (int i = 0; i < nsel && !b.oom; i++) {
        const eng_tensor *t = &out->t[sel[i]];
        if (i) srv_buf_puts(&b, ",");
        if (iscls[i]) {
            srv_kclass_json(&b, out->names[sel[i]], &cls[i], crows[i], ck[i], bin[i]);
            continue;
        }
        srv_buf_puts(&b, "{\"name\":");
        srv_buf_json_str(&b, out->names[sel[i]]);
        srv_buf_printf(&b, ",\"datatype\":\"%s\",\"shape\":[", srv_kserve_dtype(t->dtype));
        for (int d = 0; d < t->ndim; d++) srv_buf_printf(&b, d ? ",%lld" : "%lld", (long long)t->dims[d]);
        srv_buf_puts(&b, "]");
        if (bin[i]) {
            srv_buf_printf(&b, ",\"parameters\":{\"binary_data_size\":%zu}}", eng_tensor_nbytes(t));
            continue;
        }
        srv_buf_puts(&b, ",\"data\":[");
        int64_t n = eng_tensor_numel(t);
        for (int64_t k = 0; k < n && !b.oom; k++) {
            if (k) srv_buf_puts(&b, ",");
            srv_buf_json_elem(&b, t, k);
        }
        srv_buf_puts(&b, "]}");
    }
    srv_buf_puts(&b, "]}");
    size_t hl = b.len;
    for (int i = 0; i < nsel && !b.oom; i++)
        if (bin[i] && iscls[i]) srv_buf_put(&b, cls[i].p, cls[i].len);
        else if (bin[i]) srv_buf_put(&b, out->t[sel[i]].data, eng_tensor_nbytes(&out->t[sel[i]]));
    res = srv_buf_take(&b, len);
    if (!res) srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory encoding the reply");
    else if (json_len) *json_len = hl;
done:
    srv_buf_free(&b);
    for (int i = 0; cls && i < nsel; i++) srv_buf_free(&cls[i]);
    free(cls);
    free(crows);
    free(ck);
    free(iscls);
    free(sel);
    free(bin);
    return res;
}

const char *srv_kserve_state(srv_state s) {
    switch (s) {
    case SRV_STATE_AVAILABLE: return "READY";
    case SRV_STATE_START:
    case SRV_STATE_LOADING: return "LOADING";
    case SRV_STATE_UNLOADING: return "UNLOADING";
    default: return "UNAVAILABLE";
    }
}
