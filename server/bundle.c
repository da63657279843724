/* bundle.c - what the server reads from model bundles beyond the layout: each version directory's change stamp
 * (for the registry's poll), and what a version's signature.json says (input/output aliases, labels,
 * precision), resolved against the loaded graph. The layout itself (version names, scanning, paths, writing
 * new versions) is engine/bundle.c's; the loaded version object is version.c's.
 *
 * The signature.json reader stays here rather than in engine/bundle.c: it builds srv_io inputs/outputs, reports
 * srv_code errors naming model and version, and uses server/json.c's nesting check; the engine has no use for
 * a parsed signature (the trainer only copies the base version's object and sets "preprocessing").
 *
 * Layout: <base>/<n>/model.onnx, optional <n>/signature.json:
 *   {"signature_defs": {"serving_default": {"inputs": {"client": "onnx_name" | {"name": "onnx_name",
 *        "dtype": "float32", "shape": [-1, 4]}, ...}, "outputs": {...}, "method_name": "..."}},
 *    "labels": ["cat", ...] | "labels_file": "labels.txt", "precision": "fp32"|"fp16"|"bf16"|"int8",
 *    "preprocessing": "..." (recorded by tensord train; informational)}
 * Invariants:
 *  - Only names eng_bundle_parse_version accepts are versions (plain positive integers: no sign, no leading
 *    zero, fits int64); anything else (".tmp-3-123", "3.bak", "+3", "007") is ignored, so half-written
 *    directories are never seen.
 *  - signature.json is checked strictly: unknown keys, wrong types, names that are not graph inputs/outputs,
 *    duplicated names and a required graph input left unmapped are errors naming model, version and file.
 *    Its nesting depth is checked before it is parsed. labels_file may not leave the version directory.
 *  - Every file a load reads from a version directory is opened by srv_bundle_open: inside the directory once
 *    symlinks are resolved, a regular file, opened non-blocking (a FIFO named model.onnx fails that version at
 *    once instead of stalling the loader).
 *  - Without signature.json the signature is the graph's inputs (initializers excluded) and outputs under their
 *    ONNX names, in graph order.
 */
#define _GNU_SOURCE
#include "bundle.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../engine/bundle.h"
#include "../engine/ir/file-io.h"
#include "codec.h"

#define SIG_MAX_BYTES ((size_t)1 << 20)
#define LABELS_MAX_BYTES ((size_t)16 << 20)

int srv_bundle_stamp_equal(const srv_bundle_stamp *a, const srv_bundle_stamp *b) {
    return a->onnx_mtime_ns == b->onnx_mtime_ns && a->onnx_size == b->onnx_size &&
           a->dir_mtime_ns == b->dir_mtime_ns && a->onnx_ino == b->onnx_ino && a->sig_mtime_ns == b->sig_mtime_ns;
}

static int64_t ts_ns(const struct timespec *t) { return (int64_t)t->tv_sec * 1000000000 + t->tv_nsec; }

/* The stamp of <base>/<version>; 0 when the directory is gone (removed since the scan). */
static int stamp_of(const char *base, int64_t version, srv_bundle_stamp *st) {
    char path[4096];
    struct stat sd, so;
    memset(st, 0, sizeof *st);
    if (eng_bundle_path(path, sizeof path, base, version, NULL) != ENG_STATUS_OK || stat(path, &sd) != 0 ||
        !S_ISDIR(sd.st_mode))
        return 0;
    st->dir_mtime_ns = ts_ns(&sd.st_mtim);
    if (eng_bundle_path(path, sizeof path, base, version, ENG_BUNDLE_MODEL_FILE) == ENG_STATUS_OK &&
        stat(path, &so) == 0) {
        st->onnx_mtime_ns = ts_ns(&so.st_mtim);
        st->onnx_size = (int64_t)so.st_size;
        st->onnx_ino = (uint64_t)so.st_ino;
    }
    if (eng_bundle_path(path, sizeof path, base, version, ENG_BUNDLE_SIGNATURE_FILE) == ENG_STATUS_OK &&
        stat(path, &so) == 0)
        st->sig_mtime_ns = ts_ns(&so.st_mtim);
    return 1;
}

srv_code srv_bundle_scan(const char *model, const char *base, srv_bundle_ver **out, int *n, srv_error *err) {
    *out = NULL;
    *n = 0;
    int64_t *vs;
    int nv;
    eng_status es = eng_bundle_scan(base, &vs, &nv);
    if (es != ENG_STATUS_OK)
        return srv_err(err, es == ENG_STATUS_NOT_FOUND ? SRV_NOT_FOUND : SRV_RESOURCE_EXHAUSTED, "model '%s': %s",
                       model, eng_last_error());
    srv_bundle_ver *v = calloc((size_t)nv + 1, sizeof *v);
    if (!v) {
        free(vs);
        return srv_err(err, SRV_RESOURCE_EXHAUSTED, "model '%s': out of memory scanning '%s'", model, base);
    }
    int k = 0;
    for (int i = 0; i < nv; i++) /* highest first, as eng_bundle_scan lists them */
        if (stamp_of(base, vs[i], &v[k].stamp)) v[k++].version = vs[i];
    free(vs);
    *out = v;
    *n = k;
    return SRV_OK;
}

srv_code srv_bundle_open(const char *vdir, const char *path, int *fd, uint64_t *size, char *why, size_t why_cap) {
    eng_status st = eng_file_open_regular(path, vdir, fd, size);
    if (st == ENG_STATUS_OK) return SRV_OK;
    snprintf(why, why_cap, "%s", eng_last_error());
    return st == ENG_STATUS_NOT_FOUND ? SRV_NOT_FOUND : SRV_INVALID_ARGUMENT;
}

srv_code srv_bundle_read(const char *vdir, const char *path, size_t max, char **buf, size_t *len, char *why,
                         size_t why_cap) {
    *buf = NULL;
    *len = 0;
    int fd;
    uint64_t size;
    srv_code c = srv_bundle_open(vdir, path, &fd, &size, why, why_cap);
    if (c != SRV_OK) return c;
    char *b = NULL;
    if (size > max) {
        snprintf(why, why_cap, "'%s' is %llu bytes, more than the limit of %zu", path, (unsigned long long)size, max);
        c = SRV_INVALID_ARGUMENT;
    } else if (!(b = malloc((size_t)size + 1))) {
        snprintf(why, why_cap, "'%s': out of memory reading %llu bytes", path, (unsigned long long)size);
        c = SRV_RESOURCE_EXHAUSTED;
    }
    size_t got = 0;
    while (c == SRV_OK && got < (size_t)size) {
        ssize_t r = read(fd, b + got, (size_t)size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            snprintf(why, why_cap, "'%s': read failed at byte %zu: %s", path, got, r == 0 ? "file shrank" : strerror(errno));
            c = SRV_INVALID_ARGUMENT;
        }
        got += r > 0 ? (size_t)r : 0;
    }
    close(fd);
    if (c != SRV_OK) {
        free(b);
        return c;
    }
    b[got] = 0;
    *buf = b;
    *len = got;
    return SRV_OK;
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
    char *buf, why[SRV_ERR_MAX];
    size_t len;
    srv_code rc = srv_bundle_read(vdir, path, LABELS_MAX_BYTES, &buf, &len, why, sizeof why);
    if (rc != SRV_OK)
        return SIGERR(rc == SRV_RESOURCE_EXHAUSTED ? rc : SRV_INVALID_ARGUMENT, "cannot read labels_file '%s': %s", name, why);
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
    if (cJSON_IsString(k) && eng_precision_parse(k->valuestring, &sig->precision) == ENG_STATUS_OK) return SRV_OK;
    eng_err_clear();
    return SIGERR(SRV_INVALID_ARGUMENT, "precision must be one of \"fp32\", \"fp16\", \"bf16\", \"int8\"");
}

srv_code srv_bundle_sig_read(const char *model, int64_t version, const char *vdir, srv_bundle_sig *sig,
                             srv_error *err) {
    memset(sig, 0, sizeof *sig);
    sig->precision = ENG_PRECISION_FP32;
    char file[4096];
    if (snprintf(file, sizeof file, "%s/signature.json", vdir) >= (int)sizeof file)
        return srv_err(err, SRV_INVALID_ARGUMENT, "model '%s' version %lld: path too long", model, (long long)version);
    char *buf, why[SRV_ERR_MAX];
    size_t len;
    srv_code rc = srv_bundle_read(vdir, file, SIG_MAX_BYTES, &buf, &len, why, sizeof why);
    if (rc == SRV_NOT_FOUND) return SRV_OK;
    if (rc != SRV_OK) return SIGERR(rc == SRV_RESOURCE_EXHAUSTED ? rc : SRV_INVALID_ARGUMENT, "cannot read: %s", why);
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
    if (v->dtype == ENG_DTYPE_SEQUENCE)
        return SIGERR(SRV_UNIMPLEMENTED, "%s '%s' is a sequence of tensors: tensord serves tensor inputs and outputs "
                      "(sequences may be used inside the model)", what, v->name);
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
