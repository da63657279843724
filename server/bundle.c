/* bundle.c - reading model bundles for the registry: which version directories a base path holds, and what a
 * version's signature.json says (input/output aliases, labels, precision).
 *
 * Layout: <base>/<n>/model.onnx, optional <n>/signature.json:
 *   {"signature_defs": {"serving_default": {"inputs": {"client": "onnx_name" | {"name": "onnx_name",
 *        "dtype": "float32", "shape": [-1, 4]}, ...}, "outputs": {...}, "method_name": "..."}},
 *    "labels": ["cat", ...] | "labels_file": "labels.txt", "precision": "fp32"|"fp16"|"bf16"|"int8",
 *    "preprocessing": "..." (recorded by tensord train; informational)}
 * Invariants:
 *  - Only plain positive integers (digits, no sign, no leading zero, fits int64) are versions; anything else
 *    (".tmp-3-123", "3.bak", "+3", "03") is ignored, so half-written directories are never seen.
 *  - signature.json is checked strictly: unknown keys, wrong types, names that are not graph inputs/outputs,
 *    duplicated names and a required graph input left unmapped are errors naming model, version and file.
 *    Its nesting depth is checked before it is parsed. labels_file may not leave the version directory.
 *  - Without signature.json the signature is the graph's inputs (initializers excluded) and outputs under their
 *    ONNX names, in graph order.
 *  - A loaded version (srv_version) is immutable after srv_version_load except for its atomic refcount; runs
 *    on it are serialised by run_mu (session outputs are views, copied out before the lock is dropped); it is
 *    destroyed by whoever drops the last reference, which then tells the registry (srv_registry_version_ended)
 *    as its very last step.
 */
#define _GNU_SOURCE
#include "bundle.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "codec.h"

#define WARMUP_MAX_RECORDS 1000 /* TF Serving's limit */
#define WARMUP_MAX_LINE ((size_t)64 << 20)
#define SIG_MAX_BYTES ((size_t)1 << 20)
#define LABELS_MAX_BYTES ((size_t)16 << 20)

int srv_bundle_parse_version(const char *name, int64_t *version) {
    if (!name || name[0] < '1' || name[0] > '9') return 0;
    int64_t v = 0;
    for (const char *p = name; *p; p++) {
        if (*p < '0' || *p > '9') return 0;
        int d = *p - '0';
        if (v > (INT64_MAX - d) / 10) return 0;
        v = v * 10 + d;
    }
    *version = v;
    return 1;
}

int srv_bundle_stamp_equal(const srv_bundle_stamp *a, const srv_bundle_stamp *b) {
    return a->onnx_mtime_ns == b->onnx_mtime_ns && a->onnx_size == b->onnx_size &&
           a->dir_mtime_ns == b->dir_mtime_ns && a->onnx_ino == b->onnx_ino && a->sig_mtime_ns == b->sig_mtime_ns;
}

static int64_t ts_ns(const struct timespec *t) { return (int64_t)t->tv_sec * 1000000000 + t->tv_nsec; }

static int cmp_desc(const void *a, const void *b) {
    int64_t x = ((const srv_bundle_ver *)a)->version, y = ((const srv_bundle_ver *)b)->version;
    return x < y ? 1 : x > y ? -1 : 0;
}

srv_code srv_bundle_scan(const char *model, const char *base, srv_bundle_ver **out, int *n, srv_error *err) {
    *out = NULL;
    *n = 0;
    DIR *d = opendir(base);
    if (!d)
        return srv_err(err, SRV_NOT_FOUND, "model '%s': cannot read base path '%s': %s", model, base, strerror(errno));
    srv_bundle_ver *v = NULL;
    int nv = 0, cap = 0;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d)) != NULL) {
        int64_t ver;
        if (!srv_bundle_parse_version(e->d_name, &ver)) continue;
        struct stat sd, so;
        if (snprintf(path, sizeof path, "%s/%s", base, e->d_name) >= (int)sizeof path) continue;
        if (stat(path, &sd) != 0 || !S_ISDIR(sd.st_mode)) continue;
        srv_bundle_stamp st = {.dir_mtime_ns = ts_ns(&sd.st_mtim)};
        if (snprintf(path, sizeof path, "%s/%s/model.onnx", base, e->d_name) < (int)sizeof path &&
            stat(path, &so) == 0) {
            st.onnx_mtime_ns = ts_ns(&so.st_mtim);
            st.onnx_size = (int64_t)so.st_size;
            st.onnx_ino = (uint64_t)so.st_ino;
        }
        if (snprintf(path, sizeof path, "%s/%s/signature.json", base, e->d_name) < (int)sizeof path &&
            stat(path, &so) == 0)
            st.sig_mtime_ns = ts_ns(&so.st_mtim);
        if (nv == cap) {
            int nc = cap ? 2 * cap : 16;
            srv_bundle_ver *nvp = realloc(v, (size_t)nc * sizeof *nvp);
            if (!nvp) {
                free(v);
                closedir(d);
                return srv_err(err, SRV_RESOURCE_EXHAUSTED, "model '%s': out of memory scanning '%s'", model, base);
            }
            v = nvp;
            cap = nc;
        }
        v[nv].version = ver;
        v[nv].stamp = st;
        nv++;
    }
    closedir(d);
    if (nv) qsort(v, (size_t)nv, sizeof *v, cmp_desc);
    *out = v;
    *n = nv;
    return SRV_OK;
}

int srv_bundle_read_file(const char *path, size_t max, char **buf, size_t *len) {
    *buf = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        errno = EINVAL;
        return -1;
    }
    if ((uint64_t)sb.st_size > max) {
        fclose(f);
        errno = EFBIG;
        return -1;
    }
    size_t n = (size_t)sb.st_size;
    char *b = malloc(n + 1);
    if (!b) {
        fclose(f);
        errno = ENOMEM;
        return -1;
    }
    size_t got = n ? fread(b, 1, n, f) : 0;
    int rerr = ferror(f);
    fclose(f);
    if (rerr || got != n) {
        free(b);
        errno = EIO;
        return -1;
    }
    b[n] = 0;
    *buf = b;
    *len = n;
    return 0;
}

/* ---- signature.json ---- */

#define SIGERR(code, ...) sig_err(err, code, model, version, file, __VA_ARGS__)

static srv_code sig_err(srv_error *err, srv_code code, const char *model, int64_t version, const char *file,
                        const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static srv_code sig_err(srv_error *err, srv_code code, const char *model, int64_t version, const char *file,
                        const char *fmt, ...) {
    char m[SRV_ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    return srv_err(err, code, "model '%s' version %lld: %s: %s", model, (long long)version, file, m);
}

static srv_code parse_alias(const char *model, int64_t version, const char *file, const char *where,
                            const cJSON *item, srv_bundle_alias *a, srv_error *err) {
    a->dtype = ENG_DTYPE_UNDEFINED;
    a->ndim = -1;
    const char *onnx = NULL;
    if (cJSON_IsString(item)) {
        onnx = item->valuestring;
    } else if (cJSON_IsObject(item)) {
        for (const cJSON *k = item->child; k; k = k->next) {
            if (strcmp(k->string, "name") == 0) {
                if (!cJSON_IsString(k)) return SIGERR(SRV_INVALID_ARGUMENT, "%s.name must be a string", where);
                onnx = k->valuestring;
            } else if (strcmp(k->string, "dtype") == 0) {
                if (!cJSON_IsString(k)) return SIGERR(SRV_INVALID_ARGUMENT, "%s.dtype must be a string", where);
                a->dtype = eng_dtype_parse(k->valuestring);
                if (a->dtype == ENG_DTYPE_UNDEFINED)
                    return SIGERR(SRV_INVALID_ARGUMENT, "%s.dtype: unknown dtype '%s'", where, k->valuestring);
            } else if (strcmp(k->string, "shape") == 0) {
                int nd = cJSON_IsArray(k) ? cJSON_GetArraySize(k) : -1;
                if (nd < 0 || nd > ENG_MAX_DIMS)
                    return SIGERR(SRV_INVALID_ARGUMENT, "%s.shape must be an array of at most %d integers", where,
                                  ENG_MAX_DIMS);
                int i = 0;
                for (const cJSON *d = k->child; d; d = d->next, i++) {
                    double x = cJSON_IsNumber(d) ? d->valuedouble : -2;
                    if (x < -1 || x > 9.0e15 || x != (double)(int64_t)x)
                        return SIGERR(SRV_INVALID_ARGUMENT, "%s.shape[%d] must be an integer >= -1", where, i);
                    a->dims[i] = (int64_t)x;
                }
                a->ndim = nd;
            } else {
                return SIGERR(SRV_INVALID_ARGUMENT, "%s: unknown key '%s' (expected name, dtype, shape)", where,
                              k->string);
            }
        }
    } else {
        return SIGERR(SRV_INVALID_ARGUMENT, "%s must be a string (the ONNX name) or an object {name, dtype, shape}",
                      where);
    }
    if (!onnx || !*onnx) return SIGERR(SRV_INVALID_ARGUMENT, "%s: missing ONNX name", where);
    if (!*item->string) return SIGERR(SRV_INVALID_ARGUMENT, "%s: empty client name", where);
    a->client = strdup(item->string);
    a->onnx = strdup(onnx);
    if (!a->client || !a->onnx) return SIGERR(SRV_RESOURCE_EXHAUSTED, "out of memory");
    return SRV_OK;
}

static srv_code parse_aliases(const char *model, int64_t version, const char *file, const char *what,
                              const cJSON *obj, srv_bundle_alias **out, int *n, srv_error *err) {
    if (!cJSON_IsObject(obj))
        return SIGERR(SRV_INVALID_ARGUMENT, "signature_defs.serving_default.%s must be an object", what);
    int cnt = cJSON_GetArraySize(obj);
    *out = calloc((size_t)(cnt ? cnt : 1), sizeof **out);
    if (!*out) return SIGERR(SRV_RESOURCE_EXHAUSTED, "out of memory");
    int i = 0;
    for (const cJSON *it = obj->child; it; it = it->next, i++) {
        char where[320];
        snprintf(where, sizeof where, "%s '%.256s'", what, it->string);
        *n = i + 1;
        srv_code c = parse_alias(model, version, file, where, it, &(*out)[i], err);
        if (c != SRV_OK) return c;
        for (int j = 0; j < i; j++) {
            if (strcmp((*out)[j].client, (*out)[i].client) == 0)
                return SIGERR(SRV_INVALID_ARGUMENT, "%s: client name given twice", where);
            if (strcmp((*out)[j].onnx, (*out)[i].onnx) == 0)
                return SIGERR(SRV_INVALID_ARGUMENT, "%s: ONNX name '%s' is already mapped to '%s'", where,
                              (*out)[i].onnx, (*out)[j].client);
        }
    }
    return SRV_OK;
}

static srv_code parse_signature_defs(const char *model, int64_t version, const char *file, const cJSON *defs,
                                     srv_bundle_sig *sig, srv_error *err) {
    if (!cJSON_IsObject(defs)) return SIGERR(SRV_INVALID_ARGUMENT, "signature_defs must be an object");
    for (const cJSON *s = defs->child; s; s = s->next) {
        if (strcmp(s->string, "serving_default") != 0)
            return SIGERR(SRV_INVALID_ARGUMENT, "signature_defs: signature '%s' is not supported (only serving_default)",
                          s->string);
        if (!cJSON_IsObject(s)) return SIGERR(SRV_INVALID_ARGUMENT, "signature_defs.serving_default must be an object");
        for (const cJSON *k = s->child; k; k = k->next) {
            srv_code c = SRV_OK;
            if (strcmp(k->string, "inputs") == 0) {
                sig->has_inputs = 1;
                c = parse_aliases(model, version, file, "inputs", k, &sig->in_alias, &sig->nin_alias, err);
            } else if (strcmp(k->string, "outputs") == 0) {
                sig->has_outputs = 1;
                c = parse_aliases(model, version, file, "outputs", k, &sig->out_alias, &sig->nout_alias, err);
            } else if (strcmp(k->string, "method_name") == 0) {
                if (!cJSON_IsString(k))
                    c = SIGERR(SRV_INVALID_ARGUMENT, "signature_defs.serving_default.method_name must be a string");
            } else {
                c = SIGERR(SRV_INVALID_ARGUMENT,
                           "signature_defs.serving_default: unknown key '%s' (expected inputs, outputs, method_name)",
                           k->string);
            }
            if (c != SRV_OK) return c;
        }
    }
    return SRV_OK;
}

static int add_label(srv_bundle_sig *sig, const char *s, size_t n) {
    char **l = realloc(sig->labels, (size_t)(sig->nlabels + 1) * sizeof *l);
    if (!l) return -1;
    sig->labels = l;
    if (!(l[sig->nlabels] = strndup(s, n))) return -1;
    sig->nlabels++;
    return 0;
}

static srv_code read_labels_file(const char *model, int64_t version, const char *file, const char *vdir,
                                 const char *name, srv_bundle_sig *sig, srv_error *err) {
    if (!*name || strchr(name, '/') || strchr(name, '\\') || strstr(name, ".."))
        return SIGERR(SRV_INVALID_ARGUMENT, "labels_file '%s' must be a plain file name inside the version directory",
                      name);
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", vdir, name) >= (int)sizeof path)
        return SIGERR(SRV_INVALID_ARGUMENT, "labels_file path too long");
    char *buf;
    size_t len;
    if (srv_bundle_read_file(path, LABELS_MAX_BYTES, &buf, &len) != 0)
        return SIGERR(SRV_INVALID_ARGUMENT, "cannot read labels_file '%s': %s", path, strerror(errno));
    const char *p = buf, *end = buf + len;
    srv_code c = SRV_OK;
    while (p < end && c == SRV_OK) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        size_t n = (size_t)(le - p);
        if (n && p[n - 1] == '\r') n--;
        if (memchr(p, 0, n)) c = SIGERR(SRV_INVALID_ARGUMENT, "labels_file '%s' holds a NUL byte", path);
        else if (add_label(sig, p, n) != 0) c = SIGERR(SRV_RESOURCE_EXHAUSTED, "out of memory");
        p = nl ? nl + 1 : end;
    }
    free(buf);
    return c;
}

static srv_code parse_precision(const char *model, int64_t version, const char *file, const cJSON *k,
                                srv_bundle_sig *sig, srv_error *err) {
    static const struct { const char *s; eng_precision p; } tab[] = {
        {"fp32", ENG_PRECISION_FP32}, {"fp16", ENG_PRECISION_FP16},
        {"bf16", ENG_PRECISION_BF16}, {"int8", ENG_PRECISION_INT8}};
    if (cJSON_IsString(k))
        for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
            if (strcasecmp(k->valuestring, tab[i].s) == 0) {
                sig->precision = tab[i].p;
                return SRV_OK;
            }
    return SIGERR(SRV_INVALID_ARGUMENT, "precision must be one of \"fp32\", \"fp16\", \"bf16\", \"int8\"");
}

srv_code srv_bundle_sig_read(const char *model, int64_t version, const char *vdir, srv_bundle_sig *sig,
                             srv_error *err) {
    memset(sig, 0, sizeof *sig);
    sig->precision = ENG_PRECISION_FP32;
    char file[4096];
    if (snprintf(file, sizeof file, "%s/signature.json", vdir) >= (int)sizeof file)
        return srv_err(err, SRV_INVALID_ARGUMENT, "model '%s' version %lld: path too long", model, (long long)version);
    char *buf;
    size_t len;
    if (srv_bundle_read_file(file, SIG_MAX_BYTES, &buf, &len) != 0) {
        if (errno == ENOENT) return SRV_OK;
        return SIGERR(SRV_INVALID_ARGUMENT, "cannot read: %s", strerror(errno));
    }
    srv_code c = SRV_OK;
    cJSON *root = NULL;
    if (!srv_json_depth_ok(buf, len, SRV_JSON_MAX_DEPTH))
        c = SIGERR(SRV_INVALID_ARGUMENT, "JSON nests deeper than %d levels", SRV_JSON_MAX_DEPTH);
    else if (!(root = cJSON_ParseWithLength(buf, len)))
        c = SIGERR(SRV_INVALID_ARGUMENT, "invalid JSON near byte %lld",
                   (long long)(cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - buf : 0));
    else if (!cJSON_IsObject(root))
        c = SIGERR(SRV_INVALID_ARGUMENT, "top level must be a JSON object");
    const cJSON *labels = NULL, *labels_file = NULL;
    for (const cJSON *k = (c == SRV_OK) ? root->child : NULL; k && c == SRV_OK; k = k->next) {
        if (strcmp(k->string, "signature_defs") == 0) {
            c = parse_signature_defs(model, version, file, k, sig, err);
        } else if (strcmp(k->string, "labels") == 0) {
            labels = k;
            if (!cJSON_IsArray(k)) c = SIGERR(SRV_INVALID_ARGUMENT, "labels must be an array of strings");
            int i = 0;
            for (const cJSON *l = k->child; l && c == SRV_OK; l = l->next, i++) {
                if (!cJSON_IsString(l)) c = SIGERR(SRV_INVALID_ARGUMENT, "labels[%d] must be a string", i);
                else if (add_label(sig, l->valuestring, strlen(l->valuestring)) != 0)
                    c = SIGERR(SRV_RESOURCE_EXHAUSTED, "out of memory");
            }
        } else if (strcmp(k->string, "labels_file") == 0) {
            labels_file = k;
            if (!cJSON_IsString(k)) c = SIGERR(SRV_INVALID_ARGUMENT, "labels_file must be a string");
        } else if (strcmp(k->string, "precision") == 0) {
            c = parse_precision(model, version, file, k, sig, err);
        } else if (strcmp(k->string, "preprocessing") == 0) {
            /* written by tensord train: how the training data was mapped onto the inputs (e.g. uint8 / 255,
             * reshaped to [N,1,28,28]); recorded for clients and evaluation, not applied by the server */
            if (!cJSON_IsString(k) && !cJSON_IsObject(k))
                c = SIGERR(SRV_INVALID_ARGUMENT, "preprocessing must be a string or an object");
        } else {
            c = SIGERR(SRV_INVALID_ARGUMENT,
                       "unknown key '%s' (expected signature_defs, labels, labels_file, precision, preprocessing)",
                       k->string);
        }
    }
    if (c == SRV_OK && labels && labels_file)
        c = SIGERR(SRV_INVALID_ARGUMENT, "give either labels or labels_file, not both");
    if (c == SRV_OK && labels_file)
        c = read_labels_file(model, version, file, vdir, labels_file->valuestring, sig, err);
    cJSON_Delete(root);
    free(buf);
    if (c != SRV_OK) srv_bundle_sig_free(sig);
    return c;
}

static void list_names(const eng_graph *g, const int *idx, int n, int skip_init, char *buf, size_t cap) {
    size_t off = 0;
    buf[0] = 0;
    for (int i = 0; i < n && off < cap; i++) {
        const eng_value *v = &g->values[idx[i]];
        if (skip_init && v->init) continue;
        int w = snprintf(buf + off, cap - off, "%s'%s'", off ? ", " : "", v->name);
        if (w < 0) break;
        off += (size_t)w;
    }
}

static int find_in(const eng_graph *g, const int *idx, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(g->values[idx[i]].name, name) == 0) return i;
    return -1;
}

/* Fill io from graph value v, then apply what the alias declared (must agree with what the graph declares). */
static srv_code fill_io(const char *model, int64_t version, const char *file, const char *what, const eng_value *v,
                        const srv_bundle_alias *a, srv_io *io, srv_error *err) {
    char g1[128], g2[128];
    io->name = strdup(a ? a->client : v->name);
    io->onnx_name = strdup(v->name);
    if (!io->name || !io->onnx_name) return SIGERR(SRV_RESOURCE_EXHAUSTED, "out of memory");
    io->dtype = v->dtype;
    io->ndim = v->ndim;
    for (int d = 0; d < ENG_MAX_DIMS; d++) io->dims[d] = d < v->ndim ? v->dims[d] : -1;
    if (!a) return SRV_OK;
    if (a->dtype != ENG_DTYPE_UNDEFINED) {
        if (io->dtype != ENG_DTYPE_UNDEFINED && io->dtype != a->dtype)
            return SIGERR(SRV_INVALID_ARGUMENT, "%s '%s': dtype %s, but the model declares '%s' as %s", what, a->client,
                          eng_dtype_name(a->dtype), v->name, eng_dtype_name(io->dtype));
        io->dtype = a->dtype;
    }
    if (a->ndim >= 0) {
        int bad = io->ndim >= 0 && io->ndim != a->ndim;
        for (int d = 0; !bad && io->ndim >= 0 && d < a->ndim; d++)
            bad = io->dims[d] >= 0 && a->dims[d] >= 0 && io->dims[d] != a->dims[d];
        if (bad)
            return SIGERR(SRV_INVALID_ARGUMENT, "%s '%s': shape %s, but the model declares '%s' as %s", what,
                          a->client, eng_shape_str(a->dims, a->ndim, g1, sizeof g1), v->name,
                          eng_shape_str(io->dims, io->ndim, g2, sizeof g2));
        for (int d = 0; d < a->ndim; d++)
            if (io->ndim < 0 || io->dims[d] < 0) io->dims[d] = a->dims[d];
        io->ndim = a->ndim;
    }
    return SRV_OK;
}

srv_code srv_bundle_sig_resolve(const char *model, int64_t version, const char *vdir, const eng_graph *g,
                                srv_bundle_sig *sig, srv_error *err) {
    char file[4096], list[1024];
    snprintf(file, sizeof file, "%s/signature.json", vdir);
    int nreq = 0;
    for (int i = 0; i < g->ninputs; i++) nreq += g->values[g->inputs[i]].init == NULL;
    int nin = sig->has_inputs ? sig->nin_alias : nreq, nout = sig->has_outputs ? sig->nout_alias : g->noutputs;
    sig->inputs = calloc((size_t)nin + 1, sizeof *sig->inputs);
    sig->outputs = calloc((size_t)nout + 1, sizeof *sig->outputs);
    sig->out_index = calloc((size_t)nout + 1, sizeof *sig->out_index);
    if (!sig->inputs || !sig->outputs || !sig->out_index) return SIGERR(SRV_RESOURCE_EXHAUSTED, "out of memory");
    if (!sig->has_inputs) {
        for (int i = 0; i < g->ninputs; i++) {
            const eng_value *v = &g->values[g->inputs[i]];
            if (v->init) continue;
            srv_code c = fill_io(model, version, file, "input", v, NULL, &sig->inputs[sig->ninputs++], err);
            if (c != SRV_OK) return c;
        }
    } else {
        for (int i = 0; i < sig->nin_alias; i++) {
            const srv_bundle_alias *a = &sig->in_alias[i];
            int k = find_in(g, g->inputs, g->ninputs, a->onnx);
            if (k < 0) {
                list_names(g, g->inputs, g->ninputs, 1, list, sizeof list);
                return SIGERR(SRV_INVALID_ARGUMENT, "input '%s' maps to '%s', which is not a model input (inputs: %s)",
                              a->client, a->onnx, list);
            }
            srv_code c = fill_io(model, version, file, "input", &g->values[g->inputs[k]], a,
                                 &sig->inputs[sig->ninputs++], err);
            if (c != SRV_OK) return c;
        }
        for (int i = 0; i < g->ninputs; i++) {
            const eng_value *v = &g->values[g->inputs[i]];
            int mapped = 0;
            for (int j = 0; j < sig->nin_alias && !mapped; j++) mapped = strcmp(sig->in_alias[j].onnx, v->name) == 0;
            if (!v->init && !mapped)
                return SIGERR(SRV_INVALID_ARGUMENT, "model input '%s' is required but not in signature inputs",
                              v->name);
        }
    }
    for (int i = 0; i < nout; i++) {
        const srv_bundle_alias *a = sig->has_outputs ? &sig->out_alias[i] : NULL;
        int k = a ? find_in(g, g->outputs, g->noutputs, a->onnx) : i;
        if (k < 0) {
            list_names(g, g->outputs, g->noutputs, 0, list, sizeof list);
            return SIGERR(SRV_INVALID_ARGUMENT, "output '%s' maps to '%s', which is not a model output (outputs: %s)",
                          a->client, a->onnx, list);
        }
        sig->out_index[i] = k;
        srv_code c = fill_io(model, version, file, "output", &g->values[g->outputs[k]], a,
                             &sig->outputs[sig->noutputs++], err);
        if (c != SRV_OK) return c;
    }
    if (sig->ninputs == 0 && sig->noutputs == 0)
        return SIGERR(SRV_INVALID_ARGUMENT, "the signature has neither inputs nor outputs");
    return SRV_OK;
}

static void free_aliases(srv_bundle_alias *a, int n) {
    for (int i = 0; a && i < n; i++) {
        free(a[i].client);
        free(a[i].onnx);
    }
    free(a);
}

static void free_ios(srv_io *io, int n) {
    for (int i = 0; io && i < n; i++) {
        free(io[i].name);
        free(io[i].onnx_name);
    }
    free(io);
}

void srv_bundle_sig_free(srv_bundle_sig *sig) {
    if (!sig) return;
    free_aliases(sig->in_alias, sig->nin_alias);
    free_aliases(sig->out_alias, sig->nout_alias);
    for (int i = 0; i < sig->nlabels; i++) free(sig->labels[i]);
    free(sig->labels);
    free_ios(sig->inputs, sig->ninputs);
    free_ios(sig->outputs, sig->noutputs);
    free(sig->out_index);
    memset(sig, 0, sizeof *sig);
}


/* ---- loaded versions ---- */

/* Destroys v (refs reached zero or it never was published) and tells the registry it is gone. */
void srv_version_destroy(srv_version *v) {
    srv_registry *r = v->reg;
    srv_batcher_free(&v->batcher);
    eng_session_free(&v->sess);
    pthread_mutex_destroy(&v->run_mu);
    srv_bundle_sig_free(&v->sig);
    uint64_t id = v->id;
    int64_t version = v->version;
    char *model = v->model;
    free(v->path);
    free(v);
    srv_registry_version_ended(r, model, version, id); /* last: the registry may be freed right after */
    free(model);
}

void srv_version_release(srv_version *v) {
    if (v && atomic_fetch_sub_explicit(&v->refs, 1, memory_order_acq_rel) == 1) srv_version_destroy(v);
}

const srv_version_info *srv_version_get_info(const srv_version *v) { return v ? &v->info : NULL; }

#define VERR(code, ...) verr(err, code, v, __VA_ARGS__)
static srv_code verr(srv_error *err, srv_code code, const srv_version *v, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static srv_code verr(srv_error *err, srv_code code, const srv_version *v, const char *fmt, ...) {
    char m[SRV_ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    return srv_err(err, code, "model '%s' version %lld: %s", v->model, (long long)v->version, m);
}

static void io_list(const srv_io *io, int n, char *buf, size_t cap) {
    size_t off = 0;
    buf[0] = 0;
    for (int i = 0; i < n && off < cap; i++) {
        int w = snprintf(buf + off, cap - off, "%s'%s'", i ? ", " : "", io[i].name);
        if (w < 0) break;
        off += (size_t)w;
    }
}

/* Rows of a request: dim 0 of its first input (1 for a scalar or an empty batch). */
static int64_t version_rows(const srv_tensors *in) {
    return in->n > 0 && in->t[0].ndim > 0 && in->t[0].dims[0] > 1 ? in->t[0].dims[0] : 1;
}

/* Runs this quick are not counted in slow_runs; the REST server's inline budget (rest.c) is the same. */
#define VERSION_QUICK_US 1000

static int version_quick_est(srv_version *v, int64_t rows, int64_t budget_us) {
    int64_t ns = atomic_load_explicit(&v->row_ns, memory_order_relaxed);
    return ns > 0 && rows <= budget_us * 1000 / ns;
}

int srv_version_quick(srv_version *v, const srv_tensors *in, int64_t budget_us) {
    return v && !v->batcher && atomic_load_explicit(&v->slow_runs, memory_order_relaxed) == 0 &&
           version_quick_est(v, version_rows(in), budget_us);
}

/* Runs the session on inputs named by client names (any order); out gets the signature's outputs as copies.
 * Also the batcher's run function. out is emptied on error. */
static srv_code version_run(void *ctx, const srv_tensors *in, srv_tensors *out, srv_error *err) {
    srv_version *v = ctx;
    const eng_graph *g = eng_session_graph(v->sess);
    int nin = v->sig.ninputs;
    const char **names = calloc((size_t)nin + 1, sizeof *names);
    eng_tensor *feeds = calloc((size_t)nin + 1, sizeof *feeds);
    eng_tensor *outs = calloc((size_t)g->noutputs + 1, sizeof *outs);
    srv_code c = SRV_OK;
    if (!names || !feeds || !outs) c = VERR(SRV_RESOURCE_EXHAUSTED, "out of memory");
    for (int i = 0; i < nin && c == SRV_OK; i++) {
        int k = srv_tensors_find(in, v->sig.inputs[i].name);
        if (k < 0) c = VERR(SRV_INVALID_ARGUMENT, "missing input '%s'", v->sig.inputs[i].name);
        else {
            names[i] = v->sig.inputs[i].onnx_name;
            feeds[i] = in->t[k];
        }
    }
    int64_t rows = version_rows(in);
    int slow = !version_quick_est(v, rows, VERSION_QUICK_US);
    if (slow) atomic_fetch_add_explicit(&v->slow_runs, 1, memory_order_relaxed);
    if (c == SRV_OK) {
        pthread_mutex_lock(&v->run_mu);
        int64_t t0 = srv_now_us();
        eng_status st = eng_session_run(v->sess, nin, names, feeds, outs);
        if (st == ENG_STATUS_OK) { /* per-row run time, exponential average (1/8), run_mu held */
            int64_t ns = (srv_now_us() - t0) * 1000 / rows, old = atomic_load_explicit(&v->row_ns, memory_order_relaxed);
            atomic_store_explicit(&v->row_ns, old ? old + (ns - old) / 8 : (ns > 0 ? ns : 1), memory_order_relaxed);
        }
        if (st != ENG_STATUS_OK) {
            char pre[512];
            snprintf(pre, sizeof pre, "model '%s' version %lld", v->model, (long long)v->version);
            c = srv_err_from_eng(err, st, pre);
        }
        for (int i = 0; i < v->sig.noutputs && c == SRV_OK; i++)
            if (srv_tensors_add_copy(out, v->sig.outputs[i].name, &outs[v->sig.out_index[i]]) != 0)
                c = VERR(SRV_RESOURCE_EXHAUSTED, "cannot copy output '%s' (out of memory or too large)",
                         v->sig.outputs[i].name);
        pthread_mutex_unlock(&v->run_mu);
    }
    if (slow) atomic_fetch_sub_explicit(&v->slow_runs, 1, memory_order_relaxed);
    if (c != SRV_OK) srv_tensors_free(out);
    free(names);
    free(feeds);
    free(outs);
    return c;
}

static void version_observe(void *ctx, int64_t rows, int64_t padded_rows, int64_t queue_us) {
    srv_version *v = ctx;
    if (!v->metrics) return;
    srv_metrics_batch(v->metrics, v->model, v->version, rows, padded_rows);
    srv_metrics_queue(v->metrics, v->model, v->version, queue_us);
}

static srv_code check_input(const srv_version *v, const srv_io *io, const eng_tensor *t, srv_error *err) {
    char a[160], b[160];
    if (io->dtype != ENG_DTYPE_UNDEFINED && t->dtype != io->dtype)
        return VERR(SRV_INVALID_ARGUMENT, "input '%s': expected dtype %s, got %s", io->name, eng_dtype_name(io->dtype),
                    eng_dtype_name(t->dtype));
    if (t->ndim < 0 || t->ndim > ENG_MAX_DIMS)
        return VERR(SRV_INVALID_ARGUMENT, "input '%s': invalid rank %d", io->name, t->ndim);
    int bad = io->ndim >= 0 && io->ndim != t->ndim;
    for (int d = 0; !bad && io->ndim >= 0 && d < t->ndim; d++) bad = io->dims[d] >= 0 && io->dims[d] != t->dims[d];
    for (int d = 0; !bad && d < t->ndim; d++) bad = t->dims[d] < 0;
    if (bad)
        return VERR(SRV_INVALID_ARGUMENT, "input '%s': expected shape %s, got %s", io->name,
                    io->ndim >= 0 ? eng_shape_str(io->dims, io->ndim, a, sizeof a) : "(any)",
                    eng_shape_str(t->dims, t->ndim, b, sizeof b));
    return SRV_OK;
}

/* The inputs in signature order (a view: borrowed names and tensor data; names/ts are calloc'd for the caller
 * to free), after checking names, dtypes and shapes. *batchable: every input has a batch dimension. */
static srv_code version_view(srv_version *v, const srv_tensors *in, char ***names_out, eng_tensor **ts_out,
                             int *batchable, srv_error *err) {
    char list[1024];
    int nin = v->sig.ninputs;
    *names_out = NULL, *ts_out = NULL;
    for (int k = 0; k < in->n; k++) {
        int known = 0;
        for (int i = 0; i < nin && !known; i++) known = strcmp(v->sig.inputs[i].name, in->names[k]) == 0;
        if (!known) {
            io_list(v->sig.inputs, nin, list, sizeof list);
            return VERR(SRV_INVALID_ARGUMENT, "unknown input '%s'; expected inputs: %s", in->names[k], list);
        }
        for (int j = 0; j < k; j++)
            if (strcmp(in->names[j], in->names[k]) == 0)
                return VERR(SRV_INVALID_ARGUMENT, "input '%s' given twice", in->names[k]);
    }
    char **names = calloc((size_t)nin + 1, sizeof *names);
    eng_tensor *ts = calloc((size_t)nin + 1, sizeof *ts);
    srv_code c = (names && ts) ? SRV_OK : VERR(SRV_RESOURCE_EXHAUSTED, "out of memory");
    *batchable = nin > 0;
    for (int i = 0; i < nin && c == SRV_OK; i++) {
        const srv_io *io = &v->sig.inputs[i];
        int k = srv_tensors_find(in, io->name);
        if (k < 0) {
            io_list(v->sig.inputs, nin, list, sizeof list);
            c = VERR(SRV_INVALID_ARGUMENT, "missing input '%s'; expected inputs: %s", io->name, list);
            break;
        }
        c = check_input(v, io, &in->t[k], err);
        names[i] = in->names[k];
        ts[i] = in->t[k];
        if (ts[i].ndim < 1) *batchable = 0;
    }
    if (c != SRV_OK) {
        free(names);
        free(ts);
        return c;
    }
    *names_out = names, *ts_out = ts;
    return SRV_OK;
}

srv_code srv_version_predict(srv_version *v, const srv_tensors *in, srv_tensors *out, int64_t deadline_us,
                             srv_error *err) {
    if (deadline_us > 0 && srv_now_us() >= deadline_us)
        return VERR(SRV_DEADLINE_EXCEEDED, "deadline exceeded before the request ran");
    char **names;
    eng_tensor *ts;
    int batchable;
    srv_code c = version_view(v, in, &names, &ts, &batchable, err);
    if (c == SRV_OK) {
        srv_tensors view = {.n = v->sig.ninputs, .names = names, .t = ts};
        if (v->batcher && batchable) c = srv_batcher_submit(v->batcher, &view, out, deadline_us, err);
        else c = version_run(v, &view, out, err);
    }
    free(names);
    free(ts);
    return c;
}

typedef struct version_async { /* one asynchronous request: its signature-order view and the caller's callback */
    srv_tensors view;
    srv_batch_done_fn done;
    void *arg;
} version_async;

static void version_async_done(void *arg, srv_code code, const srv_error *err) {
    version_async *a = arg;
    srv_batch_done_fn done = a->done;
    void *darg = a->arg;
    free(a->view.names);
    free(a->view.t);
    free(a);
    done(darg, code, err);
}

int srv_version_predict_async(srv_version *v, const srv_tensors *in, srv_tensors *out, int64_t deadline_us,
                              srv_batch_done_fn done, void *arg) {
    if (!v->batcher) return 0;
    srv_error e = {0}, *err = &e;
    char **names;
    eng_tensor *ts;
    int batchable = 0;
    srv_code c = deadline_us > 0 && srv_now_us() >= deadline_us
                     ? VERR(SRV_DEADLINE_EXCEEDED, "deadline exceeded before the request ran")
                     : version_view(v, in, &names, &ts, &batchable, err);
    if (c == SRV_OK && !batchable) {
        free(names);
        free(ts);
        return 0; /* not batched: the caller runs it */
    }
    version_async *a = c == SRV_OK ? calloc(1, sizeof *a) : NULL;
    if (c == SRV_OK && !a) {
        free(names);
        free(ts);
        c = VERR(SRV_RESOURCE_EXHAUSTED, "out of memory");
    }
    if (c != SRV_OK) {
        done(arg, c, err);
        return 1;
    }
    *a = (version_async){.view = {.n = v->sig.ninputs, .names = names, .t = ts}, .done = done, .arg = arg};
    srv_batcher_submit_async(v->batcher, &a->view, out, deadline_us, version_async_done, a);
    return 1;
}

static srv_code version_warmup(srv_version *v, srv_error *err) {
    char file[4096];
    if (snprintf(file, sizeof file, "%s/assets.extra/warmup.jsonl", v->path) >= (int)sizeof file)
        return VERR(SRV_INVALID_ARGUMENT, "warm-up path too long");
    FILE *f = fopen(file, "rb");
    if (!f) {
        if (errno == ENOENT) return SRV_OK;
        return VERR(SRV_INVALID_ARGUMENT, "%s: cannot open: %s", file, strerror(errno));
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int lineno = 0, records = 0;
    srv_code c = SRV_OK;
    while (c == SRV_OK && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' ')) len--;
        size_t s = 0;
        while (s < (size_t)len && (line[s] == ' ' || line[s] == '\t')) s++;
        if (s == (size_t)len) continue;
        if ((size_t)len > WARMUP_MAX_LINE) {
            c = VERR(SRV_INVALID_ARGUMENT, "%s line %d: longer than %zu bytes", file, lineno, WARMUP_MAX_LINE);
            break;
        }
        if (++records > WARMUP_MAX_RECORDS) {
            c = VERR(SRV_INVALID_ARGUMENT, "%s: more than %d warm-up records", file, WARMUP_MAX_RECORDS);
            break;
        }
        srv_tensors in = {0}, out = {0};
        srv_tfs_format fmt;
        srv_error e = {0};
        srv_code rc = srv_tfs_decode_predict(line + s, (size_t)len - s, &v->info, &in, &fmt, &e);
        if (rc == SRV_OK) rc = srv_version_predict(v, &in, &out, 0, &e);
        if (rc != SRV_OK) c = VERR(rc, "warm-up %s line %d failed: %s", file, lineno, e.msg);
        srv_tensors_free(&in);
        srv_tensors_free(&out);
    }
    if (c == SRV_OK && ferror(f)) c = VERR(SRV_INVALID_ARGUMENT, "%s: read error", file);
    free(line);
    fclose(f);
    return c;
}

/* Builds, plans and warms up a version with no registry lock held. *out has one reference (the registry's). */
srv_code srv_version_load(const srv_version_ctx *ctx, const char *model, const char *base, int64_t version,
                          srv_version **out, srv_error *err) {
    *out = NULL;
    int64_t t0 = srv_now_us();
    srv_version *v = calloc(1, sizeof *v);
    if (!v) {
        srv_registry_version_ended(ctx->reg, model, version, ctx->id);
        return srv_err(err, SRV_RESOURCE_EXHAUSTED, "model '%s' version %lld: out of memory", model,
                           (long long)version);
    }
    pthread_mutex_init(&v->run_mu, NULL);
    atomic_init(&v->refs, 1);
    v->reg = ctx->reg;
    v->id = ctx->id;
    v->version = version;
    v->metrics = ctx->metrics;
    v->model = strdup(model);
    size_t plen = strlen(base) + 32;
    v->path = malloc(plen);
    srv_code c = SRV_OK;
    if (!v->model || !v->path) {
        c = VERR(SRV_RESOURCE_EXHAUSTED, "out of memory");
        goto fail;
    }
    snprintf(v->path, plen, "%s/%lld", base, (long long)version);
    if ((c = srv_bundle_sig_read(model, version, v->path, &v->sig, err)) != SRV_OK) goto fail;
    eng_session_opts so = {.nthreads = ctx->session_threads, .precision = v->sig.precision};
    if (ctx->batching) {
        /* Batches come in every size up to max_batch_size (or the allowed sizes): keep a plan per size, or
         * the session's LRU of 16 plans re-plans (and re-JITs) most batches (seed CNN, 64 connections: +25 %
         * req/s for +95 MB RSS). Capped at 68: each plan holds its activation buffers. */
        int64_t want = (ctx->batching->nallowed > 0 ? ctx->batching->nallowed : ctx->batching->max_batch_size) + 4;
        so.max_plans = (int)(want < 16 ? 16 : want > 68 ? 68 : want);
    }
    char onnx[4200];
    snprintf(onnx, sizeof onnx, "%s/model.onnx", v->path);
    eng_status st = eng_session_new_file(onnx, &so, &v->sess);
    if (st != ENG_STATUS_OK) {
        char pre[4400];
        snprintf(pre, sizeof pre, "model '%s' version %lld: loading %s", model, (long long)version, onnx);
        c = srv_err_from_eng(err, st, pre);
        goto fail;
    }
    const eng_graph *g = eng_session_graph(v->sess);
    if ((c = srv_bundle_sig_resolve(model, version, v->path, g, &v->sig, err)) != SRV_OK) goto fail;
    size_t wb = 0;
    for (int i = 0; i < g->nvalues; i++)
        if (g->values[i].init) wb += eng_tensor_nbytes(g->values[i].init);
    v->info = (srv_version_info){
        .model = v->model, .version = version, .path = v->path,
        .inputs = v->sig.inputs, .ninputs = v->sig.ninputs, .outputs = v->sig.outputs, .noutputs = v->sig.noutputs,
        .labels = (const char *const *)v->sig.labels, .nlabels = v->sig.nlabels, .weight_bytes = wb};
    if (ctx->batching) {
        v->batcher = srv_batcher_new(ctx->batching, version_run, version_observe, v);
        if (!v->batcher) {
            c = VERR(SRV_RESOURCE_EXHAUSTED, "cannot start the batcher");
            goto fail;
        }
    }
    if ((c = version_warmup(v, err)) != SRV_OK) goto fail;
    v->info.load_ms = (double)(srv_now_us() - t0) / 1000.0;
    *out = v;
    return SRV_OK;
fail:
    srv_version_destroy(v);
    return c;
}

