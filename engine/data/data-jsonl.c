/* data-jsonl.c - JSON Lines datasets, raw or gzipped.
 *
 * Each non-blank line is {"inputs": {"name": value, ...}, "label": value} where a value is a number or a
 * nested list of numbers (a tensor; nesting gives the per-example shape). "label" is optional but, like the
 * input names and every shape, must be the same on every line as on the first. Inputs become float32 columns
 * named after the input; the label becomes column "label", int64 when every value is an integer, else float32.
 * Other top-level keys, booleans, nulls, strings, empty or ragged lists are errors naming file and 1-based line;
 * a non-finite value (1e999, or beyond float32) names file, column, example and line.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data-impl.h"

typedef struct eng_jfield {
    char *name;
    int ndim;                   /* per-example rank */
    int64_t dims[ENG_MAX_DIMS]; /* per-example shape */
    int64_t per;                /* elements per example */
    int is_label;
    float *f;  /* inputs: rows * per */
    double *g; /* label: rows * per */
} eng_jfield;

typedef struct eng_jctx {
    const char *path;
    int64_t line, row;
    const char *name;
} eng_jctx;

static eng_status eng_jshape(const eng_jctx *c, const cJSON *v, int depth, int *ndim, int64_t *dims) {
    if (cJSON_IsNumber(v)) {
        *ndim = depth;
        return ENG_STATUS_OK;
    }
    if (!cJSON_IsArray(v))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: line %lld: '%s': expected a number or a list of numbers",
                       c->path, (long long)c->line, c->name);
    if (depth >= ENG_MAX_DIMS - 1)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: line %lld: '%s': lists nested deeper than %d", c->path,
                       (long long)c->line, c->name, ENG_MAX_DIMS - 1);
    int n = cJSON_GetArraySize(v);
    if (n == 0)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: line %lld: '%s': empty list", c->path, (long long)c->line,
                       c->name);
    dims[depth] = n;
    return eng_jshape(c, v->child, depth + 1, ndim, dims);
}

/* Write the values of v (expected shape dims[depth..ndim)) at *k; exactly one of f, g is set. */
static eng_status eng_jfill(const eng_jctx *c, const cJSON *v, const eng_jfield *fd, int depth, float *f, double *g,
                            int64_t *k) {
    char sb[160];
    if (depth == fd->ndim) {
        if (!cJSON_IsNumber(v))
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: line %lld: '%s': ragged or non-numeric value; every "
                           "example must have shape %s", c->path, (long long)c->line, c->name,
                           eng_shape_str(fd->dims, fd->ndim, sb, sizeof sb));
        double x = v->valuedouble;
        if (!isfinite(x) || (f && !isfinite((float)x)))
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: line %lld: column '%s', example %lld: non-finite value",
                           c->path, (long long)c->line, fd->name, (long long)c->row);
        if (f)
            f[*k] = (float)x;
        else
            g[*k] = x;
        (*k)++;
        return ENG_STATUS_OK;
    }
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != fd->dims[depth])
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: line %lld: '%s': ragged value; every example must have shape "
                       "%s (dim %d is %d here)", c->path, (long long)c->line, c->name,
                       eng_shape_str(fd->dims, fd->ndim, sb, sizeof sb), depth,
                       cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1);
    for (const cJSON *e = v->child; e; e = e->next) ENG_TRY(eng_jfill(c, e, fd, depth + 1, f, g, k));
    return ENG_STATUS_OK;
}

static eng_status eng_jfield_add(eng_jfield **fs, int *nf, const eng_jctx *c, const char *name, const cJSON *v,
                                 int is_label) {
    eng_jfield *n = realloc(*fs, (size_t)(*nf + 1) * sizeof *n);
    if (!n) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: out of memory", c->path);
    *fs = n;
    eng_jfield *f = &n[*nf];
    memset(f, 0, sizeof *f);
    if (!(f->name = strdup(name))) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: out of memory", c->path);
    (*nf)++;
    f->is_label = is_label;
    eng_jctx cc = *c;
    cc.name = name;
    ENG_TRY(eng_jshape(&cc, v, 0, &f->ndim, f->dims));
    f->per = 1;
    for (int i = 0; i < f->ndim; i++) f->per *= f->dims[i];
    return ENG_STATUS_OK;
}

eng_status eng_data_load_jsonl(eng_dataset *d, const char *path) {
    uint8_t *buf;
    size_t len;
    ENG_TRY(eng_data_read(path, ENG_DATA_MAX_FILE, &buf, &len));
    eng_status st = ENG_STATUS_OK;
    eng_jfield *fs = NULL;
    int nf = 0, have_label = 0;
    int64_t rows = 0, cap = 0, per_row_bytes = 0;
    eng_jctx c = {.path = path};
    const char *p = (const char *)buf, *end = p + len;
    cJSON *j = NULL;
    for (int64_t line = 1; p < end && st == ENG_STATUS_OK; line++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end, *next = nl ? nl + 1 : end;
        const char *s = p;
        p = next;
        if (line == 1 && le - s >= 3 && memcmp(s, "\xef\xbb\xbf", 3) == 0) s += 3;
        while (s < le && (*s == ' ' || *s == '\t' || *s == '\r')) s++;
        if (s == le) continue;
        c.line = line;
        c.row = rows;
        j = cJSON_ParseWithLength(s, (size_t)(le - s));
        if (!j || !cJSON_IsObject(j)) {
            st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: line %lld: %s", path, (long long)line,
                         j ? "expected a JSON object" : "invalid JSON");
            break;
        }
        const cJSON *inputs = NULL, *label = NULL;
        for (const cJSON *k = j->child; k; k = k->next) {
            if (strcmp(k->string, "inputs") == 0 && !inputs) {
                inputs = k;
            } else if (strcmp(k->string, "label") == 0 && !label) {
                label = k;
            } else {
                st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: line %lld: unexpected or repeated key '%s' (expected "
                             "\"inputs\" and \"label\")", path, (long long)line, k->string);
                break;
            }
        }
        if (st != ENG_STATUS_OK) break;
        if (!inputs || !cJSON_IsObject(inputs) || !inputs->child) {
            st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: line %lld: \"inputs\" must be a non-empty object of named "
                         "values", path, (long long)line);
            break;
        }
        if (rows == 0) { /* the first line sets the schema */
            for (const cJSON *k = inputs->child; k && st == ENG_STATUS_OK; k = k->next) {
                for (int i = 0; i < nf; i++)
                    if (strcmp(fs[i].name, k->string) == 0)
                        st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: line %lld: input '%s' given twice", path,
                                     (long long)line, k->string);
                if (st == ENG_STATUS_OK && strcmp(k->string, "label") == 0)
                    st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: line %lld: an input may not be named 'label'",
                                 path, (long long)line);
                if (st == ENG_STATUS_OK) st = eng_jfield_add(&fs, &nf, &c, k->string, k, 0);
            }
            if (st == ENG_STATUS_OK && label) st = eng_jfield_add(&fs, &nf, &c, "label", label, 1);
            have_label = label != NULL;
            for (int i = 0; i < nf; i++) per_row_bytes += fs[i].per * (fs[i].is_label ? 8 : 4);
            if (st != ENG_STATUS_OK) break;
        }
        if ((label != NULL) != have_label || cJSON_GetArraySize(inputs) != nf - have_label) {
            st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: line %lld: %s; every line must have the names of line 1",
                         path, (long long)line, (label != NULL) != have_label
                                                    ? (label ? "has a label, line 1 has none" : "lacks \"label\"")
                                                    : "a different number of inputs than line 1");
            break;
        }
        if (rows == cap) {
            int64_t nc = cap ? cap * 2 : 256;
            double room = (double)(ENG_DATA_MAX_BYTES - eng_data_bytes(d));
            if ((double)nc * (double)per_row_bytes > room) nc = cap + 256;
            if ((double)nc * (double)per_row_bytes > room) {
                st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: line %lld: the data exceeds the dataset limit of %lld "
                             "bytes (ENG_DATA_MAX_BYTES)", path, (long long)line, (long long)ENG_DATA_MAX_BYTES);
                break;
            }
            for (int i = 0; i < nf && st == ENG_STATUS_OK; i++) {
                eng_jfield *f = &fs[i];
                void *nb = f->is_label ? realloc(f->g, (size_t)(nc * f->per) * sizeof(double))
                                       : realloc(f->f, (size_t)(nc * f->per) * sizeof(float));
                if (!nb)
                    st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: out of memory at line %lld", path, (long long)line);
                else if (f->is_label)
                    f->g = nb;
                else
                    f->f = nb;
            }
            if (st != ENG_STATUS_OK) break;
            cap = nc;
        }
        for (int i = 0; i < nf && st == ENG_STATUS_OK; i++) {
            eng_jfield *f = &fs[i];
            const cJSON *v = f->is_label ? label : cJSON_GetObjectItemCaseSensitive(inputs, f->name);
            if (!v) {
                st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: line %lld: input '%s' (present on line 1) is missing",
                             path, (long long)line, f->name);
                break;
            }
            c.name = f->name;
            int64_t k = 0;
            st = eng_jfill(&c, v, f, 0, f->is_label ? NULL : f->f + rows * f->per,
                           f->is_label ? f->g + rows * f->per : NULL, &k);
        }
        cJSON_Delete(j);
        j = NULL;
        rows++;
    }
    cJSON_Delete(j);
    if (st == ENG_STATUS_OK && rows == 0) st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: the dataset is empty", path);
    for (int i = 0; i < nf && st == ENG_STATUS_OK; i++) {
        eng_jfield *f = &fs[i];
        eng_tensor t = {.ndim = f->ndim + 1, .dims = {rows}};
        memcpy(t.dims + 1, f->dims, sizeof(int64_t) * (size_t)f->ndim);
        int64_t n = rows * f->per;
        int integral = 1;
        for (int64_t e = 0; f->is_label && e < n && integral; e++) integral = f->g[e] == floor(f->g[e]) &&
                                                                             fabs(f->g[e]) < 9.0e15;
        t.dtype = f->is_label && integral ? ENG_DTYPE_I64 : ENG_DTYPE_F32;
        if ((st = eng_data_alloc(d, &t, path, f->name)) != ENG_STATUS_OK) break;
        if (!f->is_label)
            memcpy(t.data, f->f, (size_t)n * sizeof(float));
        else if (integral)
            for (int64_t e = 0; e < n; e++) ((int64_t *)t.data)[e] = (int64_t)f->g[e];
        else
            for (int64_t e = 0; e < n; e++) ((float *)t.data)[e] = (float)f->g[e];
        free(f->f);
        free(f->g);
        f->f = NULL;
        f->g = NULL;
        st = eng_data_add(d, f->name, &t, path);
    }
    for (int i = 0; i < nf; i++) {
        free(fs[i].name);
        free(fs[i].f);
        free(fs[i].g);
    }
    free(fs);
    free(buf);
    return st;
}
