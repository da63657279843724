/* bundle.c - the model bundle on disk: the version-name rule, scanning a base path, version paths, staging and
 * publishing a new version, and the signature.json that tensord's writers produce (see bundle.h).
 *
 * signature.json *reading* stays in server/bundle.c: what the reader builds is the server's signature (srv_io
 * inputs/outputs resolved against the graph, srv_code errors naming model and version, server/json.c's nesting
 * check), and nothing in the engine interprets a signature (the trainer only carries the base version's object
 * over and sets "preprocessing"). Moving it would drag those server types into engine/ or duplicate them.
 * Invariants: see bundle.h. Publishing never replaces an existing version directory; a failed stage or publish
 * leaves <base>/<n> as it was.
 */
#define _GNU_SOURCE
#include "bundle.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ir/file-io.h"

#define BUNDLE_SIG_MAX_BYTES ((size_t)64 << 20)

int eng_bundle_parse_version(const char *name, int64_t *version) {
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

static int cmp_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

eng_status eng_bundle_scan(const char *base, int64_t **versions, int *n) {
    *versions = NULL;
    *n = 0;
    DIR *d = opendir(base);
    if (!d) return eng_err(ENG_STATUS_NOT_FOUND, "cannot read base path '%s': %s", base, strerror(errno));
    int64_t *v = NULL;
    int nv = 0, cap = 0;
    size_t pcap = strlen(base) + 258;
    char *path = malloc(pcap);
    struct dirent *e;
    eng_status st = path ? ENG_STATUS_OK : eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory scanning '%s'", base);
    while (st == ENG_STATUS_OK && (e = readdir(d)) != NULL) {
        int64_t ver;
        struct stat sb;
        if (!eng_bundle_parse_version(e->d_name, &ver)) continue;
        snprintf(path, pcap, "%s/%s", base, e->d_name);
        if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) continue;
        if (nv == cap) {
            int nc = cap ? 2 * cap : 16;
            int64_t *p = realloc(v, (size_t)nc * sizeof *p);
            if (!p) {
                st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory scanning '%s'", base);
                break;
            }
            v = p;
            cap = nc;
        }
        v[nv++] = ver;
    }
    closedir(d);
    free(path);
    if (st != ENG_STATUS_OK) {
        free(v);
        return st;
    }
    if (nv) qsort(v, (size_t)nv, sizeof *v, cmp_desc);
    *versions = v;
    *n = nv;
    return ENG_STATUS_OK;
}

eng_status eng_bundle_latest(const char *base, int64_t *version) {
    *version = 0;
    int64_t *v;
    int n;
    ENG_TRY(eng_bundle_scan(base, &v, &n));
    if (n) *version = v[0];
    free(v);
    return ENG_STATUS_OK;
}

eng_status eng_bundle_path(char *buf, size_t cap, const char *base, int64_t version, const char *file) {
    int n = file ? snprintf(buf, cap, "%s/%lld/%s", base, (long long)version, file)
                 : snprintf(buf, cap, "%s/%lld", base, (long long)version);
    if (n < 0 || (size_t)n >= cap) {
        if (cap) buf[0] = '\0';
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "model base path '%s': path of version %lld too long", base,
                       (long long)version);
    }
    return ENG_STATUS_OK;
}

/* ---- writing a new version ---- */

eng_status eng_bundle_stage(const char *base, int64_t version, char *tmp, size_t cap) {
    char dst[4096];
    if (version <= 0)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "model base path '%s': version %lld is not a positive integer",
                       base, (long long)version);
    ENG_TRY(eng_bundle_path(dst, sizeof dst, base, version, NULL));
    int n = snprintf(tmp, cap, "%s/.tmp-%lld-%ld", base, (long long)version, (long)getpid());
    if (n < 0 || (size_t)n >= cap) {
        if (cap) tmp[0] = '\0';
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "model base path '%s': temp directory path too long", base);
    }
    struct stat sb;
    if (lstat(dst, &sb) == 0)
        return eng_err(ENG_STATUS_IO, "version directory '%s' already exists (refusing to replace it)", dst);
    if (errno != ENOENT) return eng_err(ENG_STATUS_IO, "cannot check '%s': %s", dst, strerror(errno));
    eng_file_remove_dir(tmp); /* a stale one from an earlier attempt of this process */
    if (mkdir(tmp, 0755) != 0) return eng_err(ENG_STATUS_IO, "cannot create '%s': %s", tmp, strerror(errno));
    return ENG_STATUS_OK;
}

/* rename(2) that never replaces dst: RENAME_NOREPLACE where the filesystem has it, else check-then-rename
 * (a directory renamed onto a non-empty one fails anyway; only an empty dst created in between is lost). */
static int rename_noreplace(const char *src, const char *dst) {
#ifdef RENAME_NOREPLACE
    if (renameat2(AT_FDCWD, src, AT_FDCWD, dst, RENAME_NOREPLACE) == 0) return 0;
    if (errno != EINVAL && errno != ENOSYS) return -1;
#endif
    struct stat sb;
    if (lstat(dst, &sb) == 0) {
        errno = EEXIST;
        return -1;
    }
    return rename(src, dst);
}

static eng_status sync_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return eng_err(ENG_STATUS_IO, "cannot read '%s': %s", dir, strerror(errno));
    size_t cap = strlen(dir) + 258;
    char *p = malloc(cap);
    eng_status st = p ? ENG_STATUS_OK : eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory syncing '%s'", dir);
    struct dirent *e;
    while (st == ENG_STATUS_OK && (e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(p, cap, "%s/%s", dir, e->d_name);
        st = eng_file_sync(p);
    }
    free(p);
    closedir(d);
    return st;
}

eng_status eng_bundle_publish(const char *base, int64_t version, const char *tmp) {
    char dst[4096];
    ENG_TRY(eng_bundle_path(dst, sizeof dst, base, version, NULL));
    ENG_TRY(sync_entries(tmp));
    ENG_TRY(eng_file_sync(tmp));
    if (rename_noreplace(tmp, dst) != 0) {
        if (errno == EEXIST || errno == ENOTEMPTY)
            return eng_err(ENG_STATUS_IO, "version directory '%s' already exists (refusing to replace it)", dst);
        return eng_err(ENG_STATUS_IO, "cannot rename '%s' to '%s': %s", tmp, dst, strerror(errno));
    }
    return eng_file_sync(base);
}

/* ---- signature.json ---- */

static cJSON *tensor_json(const eng_value *v) {
    cJSON *o = cJSON_CreateObject();
    cJSON *shape = cJSON_CreateArray();
    if (!o || !shape) {
        cJSON_Delete(o);
        cJSON_Delete(shape);
        return NULL;
    }
    cJSON_AddStringToObject(o, "name", v->name);
    cJSON_AddStringToObject(o, "dtype", eng_dtype_name(v->dtype));
    for (int i = 0; i < v->ndim; i++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)v->dims[i]));
    cJSON_AddItemToObject(o, "shape", shape);
    return o;
}

char *eng_bundle_sig_from_graph(const eng_graph *g) {
    cJSON *root = cJSON_CreateObject(), *defs = cJSON_AddObjectToObject(root, "signature_defs");
    cJSON *sd = cJSON_AddObjectToObject(defs, "serving_default");
    cJSON *ins = cJSON_AddObjectToObject(sd, "inputs"), *outs = cJSON_AddObjectToObject(sd, "outputs");
    for (int i = 0; i < g->ninputs; i++) {
        const eng_value *v = &g->values[g->inputs[i]];
        cJSON_AddItemToObject(ins, v->name, tensor_json(v));
    }
    for (int i = 0; i < g->noutputs; i++) {
        const eng_value *v = &g->values[g->outputs[i]];
        cJSON_AddItemToObject(outs, v->name, tensor_json(v));
    }
    cJSON_AddStringToObject(sd, "method_name", "tensorflow/serving/predict");
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    return s;
}

eng_status eng_bundle_sig_derive(const char *base, int64_t from, const char *preprocessing, char **json) {
    *json = NULL;
    char path[4096];
    ENG_TRY(eng_bundle_path(path, sizeof path, base, from, ENG_BUNDLE_SIGNATURE_FILE));
    uint8_t *buf = NULL;
    size_t len = 0;
    cJSON *root = NULL;
    eng_status st = eng_file_read(path, BUNDLE_SIG_MAX_BYTES, &buf, &len);
    if (st == ENG_STATUS_NOT_FOUND) {
        root = cJSON_CreateObject();
    } else if (st != ENG_STATUS_OK) {
        return st;
    } else {
        root = cJSON_ParseWithLength((const char *)buf, len);
        free(buf);
        if (!root || !cJSON_IsObject(root)) {
            cJSON_Delete(root);
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "'%s' is not a JSON object", path);
        }
    }
    if (!root) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    cJSON_DeleteItemFromObject(root, "preprocessing");
    cJSON *pre = cJSON_Parse(preprocessing);
    if (!pre) pre = cJSON_CreateString(preprocessing);
    cJSON_AddItemToObject(root, "preprocessing", pre);
    *json = cJSON_Print(root);
    cJSON_Delete(root);
    return *json ? ENG_STATUS_OK : eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory writing signature.json");
}
