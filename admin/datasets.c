/* datasets.c - uploaded training datasets (datasets.h): storage under <state_dir>/datasets/, validation by
 * engine/data's readers, records through state-datasets.c, and the HTTP layer over them (adm_datasets_access).
 *
 * Life of an upload: a temp dir <root>/.tmp-XXXXXX/ (root = <state_dir>/datasets) takes each file as it streams
 * in (written as part-<i>, never held in memory), hashed on the way; at the end every file is fsynced, renamed to
 * the name its reader needs (".gz" added when the bytes are gzip), the temp dir fsynced, the reader run over the
 * files, then, under commit_mu, the dir renamed to <root>/<name>/ (renameat2 NOREPLACE), root fsynced and the
 * record written (one transaction that also rechecks name and quota). If the record cannot be written, the dir
 * is removed again.
 *
 * Invariants:
 *  - A refused upload (bad name, format or part, malformed file, over a limit, a client gone mid-body) leaves
 *    nothing on disk: its temp dir is removed when it is refused, or by adm_upload_free.
 *  - Every <root>/<name>/ that outlives a call has a record, and every record written here has its dir: commits and
 *    deletes run under commit_mu, a delete removes the record (checking jobs in the same transaction) before the
 *    files. A crash can leave only .tmp-* dirs or a dir without a record (between rename and record, or record
 *    delete and removal); adm_datasets_new removes both.
 *  - One reader runs at a time (load_mu): a load holds the whole dataset in memory (IDX bytes become float32).
 * Thread-safe: the handle is read-only after adm_datasets_new except for the two mutexes; a request's state is its
 * own. Nothing here aborts on bad input.
 */
#define _GNU_SOURCE
#include "admin/datasets.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "admin/admin-http.h"
#include "admin/state-datasets.h"
#include "engine/data/data.h"
#include "server/log.h"

#define DS_SUBDIR "datasets"
#define DS_PREFIX "/v1/admin/datasets"
#define DS_MAX_FILES 16
#define DS_PART_MAX 64
#define DS_DEFAULT_MAX_UPLOAD ((int64_t)1 << 30)
#define DS_DEFAULT_QUOTA ((int64_t)10 << 30)
#define DS_NAME_RULE "[A-Za-z0-9_.-]+, at most 255 bytes, not '.' or '..'"

struct adm_datasets {
    char *state_dir;           /* absolute */
    char *root;                /* <state_dir>/datasets, absolute */
    adm_state *state;          /* not owned */
    int64_t max_upload, quota;
    pthread_mutex_t commit_mu; /* rename + record, record delete + file removal: one at a time */
    pthread_mutex_t load_mu;   /* one reader at a time */
};

typedef struct ds_format {
    const char *name;
    const char *file;          /* the stored name of its one file (NULL: idx, two named parts) */
} ds_format;

static const ds_format ds_formats[] = {
    {"idx", NULL}, {"npz", "data.npz"}, {"npy", "x.npy"}, {"csv", "data.csv"}, {"jsonl", "data.jsonl"},
    {"tfrecord", "data.tfrecord"},
};
#define DS_NFORMATS ((int)(sizeof ds_formats / sizeof ds_formats[0]))

typedef struct ds_file {
    char part[DS_PART_MAX + 1]; /* multipart part name; "" for the raw body */
    char name[DS_PART_MAX + 16]; /* stored name (without the ".gz" finish may add) */
    int64_t bytes;
    unsigned char head[2];
    int nhead;
} ds_file;

struct adm_upload {
    adm_datasets *d;
    char name[256];
    const ds_format *fmt;
    char *tmp;                 /* the temp dir; NULL once removed or renamed into place */
    ds_file files[DS_MAX_FILES];
    int nfiles;
    int fd;                    /* the file being written (files[nfiles - 1]); -1: none */
    int64_t bytes;             /* stored so far */
    int64_t quota_left;        /* quota minus the recorded bytes when the upload began */
    EVP_MD_CTX *md;
};

/* ---- files ---- */

static int ds_fsync_path(const char *path, int dir) {
    int fd = open(path, (dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

static char *ds_join(const char *a, const char *b) {
    char *p = NULL;
    return asprintf(&p, "%s/%s", a, b) < 0 ? NULL : p;
}

/* ---- names ---- */

static srv_code ds_check_name(const char *name, size_t len, srv_error *err) {
    if (!name) return srv_err(err, SRV_INVALID_ARGUMENT, "the upload needs a dataset name (?name=N; " DS_NAME_RULE ")");
    if (strlen(name) != len || strstr(name, "%00")) /* %00 stays literal where the daemon's unescaping keeps it */
        return srv_err(err, SRV_INVALID_ARGUMENT, "dataset name '%.100s' holds a NUL byte (" DS_NAME_RULE ")", name);
    if (len > 255)
        return srv_err(err, SRV_INVALID_ARGUMENT, "dataset name '%.60s...' is %zu bytes, over 255 (" DS_NAME_RULE ")",
                       name, len);
    if (!srv_name_valid(name))
        return srv_err(err, SRV_INVALID_ARGUMENT, "dataset name '%.100s' is not valid (" DS_NAME_RULE ")", name);
    return SRV_OK;
}

static const ds_format *ds_format_find(const char *f) {
    for (int i = 0; f && i < DS_NFORMATS; i++)
        if (strcmp(f, ds_formats[i].name) == 0) return &ds_formats[i];
    return NULL;
}

/* A multipart part name that may become a file stem: [A-Za-z0-9_-]{1,64}. */
static int ds_part_valid(const char *p) {
    size_t n = 0;
    for (; p[n]; n++) {
        char c = p[n];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-') ||
            n >= DS_PART_MAX)
            return 0;
    }
    return n > 0;
}

/* ---- the handle ---- */

/* Inside adm_datasets_new: remove what a crashed process left (temp dirs, dirs without a record). */
static void ds_sweep(adm_datasets *d) {
    DIR *dir = opendir(d->root);
    if (!dir) return;
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        int tmp = strncmp(e->d_name, ".tmp-", 5) == 0;
        if (!tmp) {
            adm_dataset_rec r = {0};
            srv_error err = {0};
            srv_code c = srv_name_valid(e->d_name) ? adm_state_dataset_get(d->state, e->d_name, &r, &err) : SRV_OK;
            adm_dataset_rec_free(&r);
            if (c != SRV_NOT_FOUND) continue;
        }
        char *p = ds_join(d->root, e->d_name);
        if (!p) continue;
        if (srv_remove_tree(p) == 0) {
            removed++;
            if (!tmp)
                srv_log(SRV_LOG_WARN, "dataset_orphan", NULL, 0,
                        "removed %s: a dataset directory without a record (a crash between storing and recording it)", p);
        } else {
            srv_log(SRV_LOG_WARN, "dataset_orphan", NULL, 0, "cannot remove %s: %s", p, strerror(errno));
        }
        free(p);
    }
    closedir(dir);
    if (removed) ds_fsync_path(d->root, 1);
}

adm_datasets *adm_datasets_new(const adm_datasets_opts *o, srv_error *err) {
    if (!o || !o->state_dir || !*o->state_dir) {
        srv_err(err, SRV_INVALID_ARGUMENT, "datasets need a state dir (--state_dir)");
        return NULL;
    }
    if (!o->state) {
        srv_err(err, SRV_FAILED_PRECONDITION, "datasets need the state store (--state_dir '%s' is not open)", o->state_dir);
        return NULL;
    }
    adm_datasets *d = calloc(1, sizeof *d);
    if (!d) {
        srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    d->state = o->state;
    d->max_upload = o->max_upload_bytes > 0 ? o->max_upload_bytes : DS_DEFAULT_MAX_UPLOAD;
    d->quota = o->quota_bytes > 0 ? o->quota_bytes : DS_DEFAULT_QUOTA;
    pthread_mutex_init(&d->commit_mu, NULL);
    pthread_mutex_init(&d->load_mu, NULL);
    struct stat st;
    if (!(d->state_dir = realpath(o->state_dir, NULL))) {
        srv_err(err, errno == ENOENT ? SRV_NOT_FOUND : SRV_PERMISSION_DENIED, "state dir '%s': %s", o->state_dir,
                strerror(errno));
        goto fail;
    }
    if (!(d->root = ds_join(d->state_dir, DS_SUBDIR))) {
        srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
        goto fail;
    }
    if (mkdir(d->root, 0755) != 0 && errno != EEXIST) {
        srv_err(err, SRV_PERMISSION_DENIED, "cannot make the datasets dir '%s': %s", d->root, strerror(errno));
        goto fail;
    }
    if (lstat(d->root, &st) != 0 || !S_ISDIR(st.st_mode) || access(d->root, W_OK | X_OK) != 0) {
        srv_err(err, SRV_PERMISSION_DENIED, "the datasets dir '%s' is not a writable directory", d->root);
        goto fail;
    }
    ds_fsync_path(d->state_dir, 1);
    ds_sweep(d);
    return d;
fail:
    adm_datasets_free(&d);
    return NULL;
}

void adm_datasets_free(adm_datasets **dp) {
    if (!dp || !*dp) return;
    adm_datasets *d = *dp;
    pthread_mutex_destroy(&d->commit_mu);
    pthread_mutex_destroy(&d->load_mu);
    free(d->state_dir);
    free(d->root);
    free(d);
    *dp = NULL;
}

/* ---- an upload ---- */

/* Drop everything the upload stored (any refusal). */
static void ds_discard(adm_upload *u) {
    if (u->fd >= 0) close(u->fd);
    u->fd = -1;
    if (u->tmp) {
        if (srv_remove_tree(u->tmp) != 0)
            srv_log(SRV_LOG_WARN, "dataset_cleanup", NULL, 0, "cannot remove %s: %s", u->tmp, strerror(errno));
        free(u->tmp);
        u->tmp = NULL;
    }
}

/* Refuse the upload: nothing stays on disk. Returns code. */
static srv_code ds_refuse(adm_upload *u, srv_code code) {
    ds_discard(u);
    return code;
}

srv_code adm_upload_new(adm_datasets *d, const char *name, const char *format, adm_upload **out, srv_error *err) {
    srv_code c;
    if (out) *out = NULL;
    if (!d) return srv_err(err, SRV_FAILED_PRECONDITION, "datasets need --state_dir");
    if (!out) return srv_err(err, SRV_INVALID_ARGUMENT, "adm_upload_new: out is NULL");
    if ((c = ds_check_name(name, name ? strlen(name) : 0, err))) return c;
    const ds_format *fmt = ds_format_find(format);
    if (!fmt)
        return srv_err(err, SRV_INVALID_ARGUMENT, "dataset '%s': format '%.40s' is not one of idx|npz|npy|csv|jsonl|"
                       "tfrecord (?format=)", name, format ? format : "(none)");
    adm_dataset_rec r = {0};
    c = adm_state_dataset_get(d->state, name, &r, err);
    adm_dataset_rec_free(&r);
    if (c == SRV_OK)
        return srv_err(err, SRV_ALREADY_EXISTS, "dataset '%s' exists (delete it first, or upload under another name)",
                       name);
    if (c != SRV_NOT_FOUND) return c;
    int64_t have = 0;
    if ((c = adm_state_datasets_bytes(d->state, &have, err))) return c;
    if (have >= d->quota)
        return srv_err(err, SRV_RESOURCE_EXHAUSTED, "dataset '%s': the datasets already take %lld bytes of the quota of "
                       "%lld (--dataset_quota_bytes): delete one first", name, (long long)have, (long long)d->quota);
    adm_upload *u = calloc(1, sizeof *u);
    if (!u) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "dataset '%s': out of memory", name);
    u->d = d;
    u->fd = -1;
    u->fmt = fmt;
    u->quota_left = d->quota - have;
    snprintf(u->name, sizeof u->name, "%s", name);
    if (asprintf(&u->tmp, "%s/.tmp-XXXXXX", d->root) < 0) {
        u->tmp = NULL;
        free(u);
        return srv_err(err, SRV_RESOURCE_EXHAUSTED, "dataset '%s': out of memory", name);
    }
    if (!mkdtemp(u->tmp)) {
        c = srv_err(err, SRV_INTERNAL, "dataset '%s': cannot make a temp dir in '%s': %s", name, d->root, strerror(errno));
        free(u->tmp);
        free(u);
        return c;
    }
    if (!(u->md = EVP_MD_CTX_new()) || EVP_DigestInit_ex(u->md, EVP_sha256(), NULL) != 1) {
        adm_upload_free(&u);
        return srv_err(err, SRV_INTERNAL, "dataset '%s': cannot start SHA-256 (libcrypto)", name);
    }
    *out = u;
    return SRV_OK;
}

/* Close the file being written, fsynced. */
static srv_code ds_close_file(adm_upload *u, srv_error *err) {
    if (u->fd < 0) return SRV_OK;
    int rc = fsync(u->fd);
    int e = errno;
    if (close(u->fd) != 0 && rc == 0) {
        rc = -1;
        e = errno;
    }
    u->fd = -1;
    if (rc != 0)
        return srv_err(err, SRV_INTERNAL, "dataset '%s': writing its file '%s': %s", u->name, u->files[u->nfiles - 1].name,
                       strerror(e));
    return SRV_OK;
}

srv_code adm_upload_part(adm_upload *u, const char *part, srv_error *err) {
    if (!u || !u->tmp) return srv_err(err, SRV_FAILED_PRECONDITION, "this upload was already refused or finished");
    srv_code c = ds_close_file(u, err);
    if (c) return ds_refuse(u, c);
    const char *fmt = u->fmt->name;
    if (part && !ds_part_valid(part))
        return ds_refuse(u, srv_err(err, SRV_INVALID_ARGUMENT, "dataset '%s': multipart part name '%.80s' is not valid "
                                    "([A-Za-z0-9_-], at most %d bytes)", u->name, part, DS_PART_MAX));
    if (u->nfiles >= DS_MAX_FILES)
        return ds_refuse(u, srv_err(err, SRV_INVALID_ARGUMENT, "dataset '%s': more than %d files", u->name, DS_MAX_FILES));
    ds_file *f = &u->files[u->nfiles];
    memset(f, 0, sizeof *f);
    snprintf(f->part, sizeof f->part, "%s", part ? part : "");
    if (!strcmp(fmt, "idx")) {
        if (!part)
            return ds_refuse(u, srv_err(err, SRV_INVALID_ARGUMENT, "dataset '%s': format idx takes an IDX pair as "
                                        "multipart/form-data with parts 'images' and 'labels', not a raw body", u->name));
        if (strcmp(part, "images") && strcmp(part, "labels"))
            return ds_refuse(u, srv_err(err, SRV_INVALID_ARGUMENT, "dataset '%s': format idx takes parts 'images' and "
                                        "'labels', not '%s'", u->name, part));
        snprintf(f->name, sizeof f->name, "%s-idx-ubyte", part);
    } else if (!strcmp(fmt, "npy") && part) {
        snprintf(f->name, sizeof f->name, "%s.npy", part);
    } else {
        if (u->nfiles > 0)
            return ds_refuse(u, srv_err(err, SRV_INVALID_ARGUMENT, "dataset '%s': format %s takes one file; part '%s' is "
                                        "a second one", u->name, fmt, part ? part : ""));
        snprintf(f->name, sizeof f->name, "%s", u->fmt->file);
    }
    for (int i = 0; i < u->nfiles; i++)
        if (!strcmp(u->files[i].name, f->name))
            return ds_refuse(u, srv_err(err, SRV_INVALID_ARGUMENT, "dataset '%s': part '%s' is given twice", u->name,
                                        f->part));
    char tn[32];
    snprintf(tn, sizeof tn, "part-%d", u->nfiles);
    char *p = ds_join(u->tmp, tn);
    if (!p) return ds_refuse(u, srv_err(err, SRV_RESOURCE_EXHAUSTED, "dataset '%s': out of memory", u->name));
    u->fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    int e = errno;
    free(p);
    if (u->fd < 0)
        return ds_refuse(u, srv_err(err, SRV_INTERNAL, "dataset '%s': cannot create a file in '%s': %s", u->name, u->tmp,
                                    strerror(e)));
    u->nfiles++;
    return SRV_OK;
}

srv_code adm_upload_write(adm_upload *u, const void *buf, size_t n, srv_error *err) {
    if (!u || !u->tmp) return srv_err(err, SRV_FAILED_PRECONDITION, "this upload was already refused or finished");
    if (u->fd < 0) return ds_refuse(u, srv_err(err, SRV_INTERNAL, "dataset '%s': bytes before any file began", u->name));
    if (n == 0) return SRV_OK;
    if ((uint64_t)n > (uint64_t)(u->d->max_upload - u->bytes))
        return ds_refuse(u, srv_err(err, SRV_RESOURCE_EXHAUSTED, "dataset '%s': the upload is over the limit of %lld "
                                    "bytes (--max_upload_bytes)", u->name, (long long)u->d->max_upload));
    if ((uint64_t)n > (uint64_t)(u->quota_left - u->bytes))
        return ds_refuse(u, srv_err(err, SRV_RESOURCE_EXHAUSTED, "dataset '%s': the upload would take the datasets over "
                                    "the quota of %lld bytes (--dataset_quota_bytes; %lld in use)", u->name,
                                    (long long)u->d->quota, (long long)(u->d->quota - u->quota_left)));
    ds_file *f = &u->files[u->nfiles - 1];
    const unsigned char *p = buf;
    for (size_t i = 0; f->nhead < 2 && i < n; i++) f->head[f->nhead++] = p[i];
    if (EVP_DigestUpdate(u->md, buf, n) != 1)
        return ds_refuse(u, srv_err(err, SRV_INTERNAL, "dataset '%s': SHA-256 failed (libcrypto)", u->name));
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(u->fd, p + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return ds_refuse(u, srv_err(err, SRV_INTERNAL, "dataset '%s': writing its file '%s': %s", u->name, f->name,
                                        w < 0 ? strerror(errno) : "no progress"));
        done += (size_t)w;
    }
    f->bytes += (int64_t)n;
    u->bytes += (int64_t)n;
    return SRV_OK;
}

static void ds_hex(const unsigned char *md, unsigned n, char *out) {
    for (unsigned i = 0; i < n; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
}

/* SHA-256 over the files in order (when they arrived in another order than they are hashed in). */
static srv_code ds_sha_files(adm_upload *u, char *const *paths, int n, char *hex, srv_error *err) {
    EVP_MD_CTX *m = EVP_MD_CTX_new();
    unsigned char *buf = malloc(1 << 20);
    srv_code c = m && buf && EVP_DigestInit_ex(m, EVP_sha256(), NULL) == 1
                     ? SRV_OK
                     : srv_err(err, SRV_INTERNAL, "dataset '%s': cannot start SHA-256", u->name);
    for (int i = 0; !c && i < n; i++) {
        int fd = open(paths[i], O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            c = srv_err(err, SRV_INTERNAL, "dataset '%s': reading back '%s': %s", u->name, paths[i], strerror(errno));
            break;
        }
        ssize_t r;
        while ((r = read(fd, buf, 1 << 20)) > 0 || (r < 0 && errno == EINTR))
            if (r > 0) EVP_DigestUpdate(m, buf, (size_t)r);
        if (r < 0) c = srv_err(err, SRV_INTERNAL, "dataset '%s': reading back '%s': %s", u->name, paths[i], strerror(errno));
        close(fd);
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned mdn = 0;
    if (!c && EVP_DigestFinal_ex(m, md, &mdn) != 1) c = srv_err(err, SRV_INTERNAL, "dataset '%s': SHA-256 failed", u->name);
    if (!c) ds_hex(md, mdn, hex);
    EVP_MD_CTX_free(m);
    free(buf);
    return c;
}

/* The reader's message with the temp dir taken out of the paths it names. */
static void ds_reader_msg(const adm_upload *u, char *out, size_t cap) {
    const char *m = eng_last_error();
    size_t tl = strlen(u->tmp), k = 0;
    while (*m && k + 1 < cap) {
        if (!strncmp(m, u->tmp, tl) && m[tl] == '/') {
            m += tl + 1;
            continue;
        }
        out[k++] = *m++;
    }
    out[k] = '\0';
}

static char *ds_columns_json(const eng_dataset *ds) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < ds->ncols; i++) {
        const eng_tensor *t = &ds->cols[i].t;
        cJSON *o = cJSON_CreateObject(), *sh = cJSON_CreateArray();
        cJSON_AddItemToArray(a, o);
        cJSON_AddStringToObject(o, "name", ds->cols[i].name);
        cJSON_AddStringToObject(o, "dtype", eng_dtype_name(t->dtype));
        for (int k = 1; k < t->ndim; k++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->dims[k]));
        cJSON_AddItemToObject(o, "shape", sh);
    }
    char *s = a ? cJSON_PrintUnformatted(a) : NULL;
    cJSON_Delete(a);
    return s;
}

/* Inside finish, under commit_mu: move the checked dir into place and record it. */
static srv_code ds_commit(adm_upload *u, adm_dataset_rec *rec, srv_error *err) {
    adm_datasets *d = u->d;
    int64_t have = 0;
    srv_code c = adm_state_datasets_bytes(d->state, &have, err);
    if (c) return c;
    if (rec->bytes > d->quota - have)
        return srv_err(err, SRV_RESOURCE_EXHAUSTED, "dataset '%s': %lld bytes would take the datasets to %lld bytes, over "
                       "the quota of %lld (--dataset_quota_bytes)", u->name, (long long)rec->bytes,
                       (long long)(have + rec->bytes), (long long)d->quota);
    char *dst = ds_join(d->root, u->name);
    if (!dst) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "dataset '%s': out of memory", u->name);
    int rc = renameat2(AT_FDCWD, u->tmp, AT_FDCWD, dst, RENAME_NOREPLACE);
    if (rc != 0 && (errno == EINVAL || errno == ENOSYS)) { /* no RENAME_NOREPLACE here: commit_mu makes this safe */
        struct stat st;
        if (lstat(dst, &st) == 0) errno = EEXIST;
        else rc = rename(u->tmp, dst);
    }
    if (rc != 0) {
        c = errno == EEXIST || errno == ENOTEMPTY
                ? srv_err(err, SRV_ALREADY_EXISTS, "dataset '%s' exists (delete it first, or upload under another name)",
                          u->name)
                : srv_err(err, SRV_INTERNAL, "dataset '%s': cannot move it into '%s': %s", u->name, dst, strerror(errno));
        free(dst);
        return c;
    }
    free(u->tmp);
    u->tmp = dst; /* from here a refusal removes the dataset's dir */
    if (ds_fsync_path(d->root, 1) != 0)
        return srv_err(err, SRV_INTERNAL, "dataset '%s': fsync of '%s': %s", u->name, d->root, strerror(errno));
    c = adm_state_dataset_put(d->state, rec, d->quota, &rec->created_ms, err);
    if (c) return c;
    free(u->tmp); /* recorded: the dir now belongs to the record */
    u->tmp = NULL;
    return SRV_OK;
}

srv_code adm_upload_finish(adm_upload *u, adm_dataset_rec *out, srv_error *err) {
    if (out) memset(out, 0, sizeof *out);
    if (!u || !u->tmp) return srv_err(err, SRV_FAILED_PRECONDITION, "this upload was already refused or finished");
    if (!out) return ds_refuse(u, srv_err(err, SRV_INVALID_ARGUMENT, "adm_upload_finish: out is NULL"));
    srv_code c = ds_close_file(u, err);
    if (c) return ds_refuse(u, c);
    int idx = !strcmp(u->fmt->name, "idx");
    if (u->nfiles == 0)
        return ds_refuse(u, srv_err(err, SRV_INVALID_ARGUMENT, "dataset '%s': the upload holds no file", u->name));
    int order[DS_MAX_FILES];
    for (int i = 0; i < u->nfiles; i++) order[i] = i;
    if (idx) {
        int im = -1, lb = -1;
        for (int i = 0; i < u->nfiles; i++) *(strcmp(u->files[i].part, "images") ? &lb : &im) = i;
        if (im < 0 || lb < 0)
            return ds_refuse(u, srv_err(err, SRV_INVALID_ARGUMENT, "dataset '%s': format idx needs parts 'images' and "
                                        "'labels'; part '%s' is missing", u->name, im < 0 ? "images" : "labels"));
        order[0] = im;
        order[1] = lb;
    }
    /* final names, in load order */
    char *paths[DS_MAX_FILES] = {0};
    cJSON *names = cJSON_CreateArray();
    for (int k = 0; !c && k < u->nfiles; k++) {
        ds_file *f = &u->files[order[k]];
        if (f->nhead == 2 && f->head[0] == 0x1f && f->head[1] == 0x8b) strcat(f->name, ".gz");
        char tn[32], *from;
        snprintf(tn, sizeof tn, "part-%d", order[k]);
        from = ds_join(u->tmp, tn);
        paths[k] = ds_join(u->tmp, f->name);
        if (!from || !paths[k] || !names) c = srv_err(err, SRV_RESOURCE_EXHAUSTED, "dataset '%s': out of memory", u->name);
        else if (rename(from, paths[k]) != 0)
            c = srv_err(err, SRV_INTERNAL, "dataset '%s': naming its file '%s': %s", u->name, f->name, strerror(errno));
        else cJSON_AddItemToArray(names, cJSON_CreateString(f->name));
        free(from);
    }
    if (!c && ds_fsync_path(u->tmp, 1) != 0)
        c = srv_err(err, SRV_INTERNAL, "dataset '%s': fsync of '%s': %s", u->name, u->tmp, strerror(errno));
    char hex[2 * EVP_MAX_MD_SIZE + 1] = "";
    if (!c && idx && order[0] != 0) {
        c = ds_sha_files(u, paths, u->nfiles, hex, err);
    } else if (!c) {
        unsigned char md[EVP_MAX_MD_SIZE];
        unsigned mdn = 0;
        if (EVP_DigestFinal_ex(u->md, md, &mdn) != 1) c = srv_err(err, SRV_INTERNAL, "dataset '%s': SHA-256 failed", u->name);
        else ds_hex(md, mdn, hex);
    }
    /* the format's own reader */
    eng_dataset *ds = NULL;
    if (!c) {
        pthread_mutex_lock(&u->d->load_mu);
        eng_status st = eng_dataset_load((const char *const *)paths, u->nfiles, &ds);
        pthread_mutex_unlock(&u->d->load_mu);
        if (st != ENG_STATUS_OK) {
            char m[SRV_ERR_MAX];
            ds_reader_msg(u, m, sizeof m);
            srv_code code = st == ENG_STATUS_OUT_OF_MEMORY                        ? SRV_RESOURCE_EXHAUSTED
                            : st == ENG_STATUS_IO || st == ENG_STATUS_INTERNAL ? SRV_INTERNAL
                                                                                  : SRV_INVALID_ARGUMENT;
            c = srv_err(err, code, "dataset '%s' (format %s) is refused: %s", u->name, u->fmt->name, m);
        }
    }
    adm_dataset_rec rec = {0};
    char dir[300];
    snprintf(dir, sizeof dir, DS_SUBDIR "/%s", u->name);
    if (!c) {
        rec.id = u->name;
        rec.format = (char *)u->fmt->name;
        rec.dir = dir;
        rec.files_json = cJSON_PrintUnformatted(names);
        rec.records = ds->n;
        rec.bytes = u->bytes;
        rec.sha256 = hex;
        rec.columns_json = ds_columns_json(ds);
        if (!rec.files_json || !rec.columns_json)
            c = srv_err(err, SRV_RESOURCE_EXHAUSTED, "dataset '%s': out of memory", u->name);
    }
    eng_dataset_free(&ds);
    for (int k = 0; k < u->nfiles; k++) free(paths[k]);
    cJSON_Delete(names);
    if (!c) {
        pthread_mutex_lock(&u->d->commit_mu);
        c = ds_commit(u, &rec, err);
        if (c) ds_discard(u); /* still under commit_mu: no other upload of the name sees the dir come and go */
        pthread_mutex_unlock(&u->d->commit_mu);
    }
    if (!c) {
        out->id = strdup(rec.id);
        out->format = strdup(rec.format);
        out->dir = strdup(rec.dir);
        out->sha256 = strdup(rec.sha256);
        out->files_json = rec.files_json;
        out->columns_json = rec.columns_json;
        out->records = rec.records;
        out->bytes = rec.bytes;
        out->created_ms = rec.created_ms;
        rec.files_json = rec.columns_json = NULL;
        if (!out->id || !out->format || !out->dir || !out->sha256) { /* recorded all the same; the reply lacks it */
            adm_dataset_rec_free(out);
            c = srv_err(err, SRV_RESOURCE_EXHAUSTED, "dataset '%s' is stored, but its reply ran out of memory", u->name);
        }
    }
    free(rec.files_json);
    free(rec.columns_json);
    if (c) ds_discard(u);
    return c;
}

void adm_upload_free(adm_upload **up) {
    if (!up || !*up) return;
    adm_upload *u = *up;
    ds_discard(u);
    EVP_MD_CTX_free(u->md);
    free(u);
    *up = NULL;
}

/* ---- records ---- */

static cJSON *ds_rec_obj(const adm_dataset_rec *r) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "dataset", r->id);
    cJSON_AddStringToObject(o, "format", r->format);
    cJSON_AddNumberToObject(o, "records", (double)r->records);
    cJSON_AddNumberToObject(o, "bytes", (double)r->bytes);
    cJSON_AddStringToObject(o, "sha256", r->sha256);
    cJSON *cols = r->columns_json ? cJSON_Parse(r->columns_json) : NULL;
    cJSON_AddItemToObject(o, "columns", cols ? cols : cJSON_CreateNull());
    cJSON *files = cJSON_Parse(r->files_json);
    cJSON_AddItemToObject(o, "files", files ? files : cJSON_CreateArray());
    cJSON_AddNumberToObject(o, "created_ms", (double)r->created_ms);
    return o;
}

static srv_code ds_print(cJSON *o, char **json, srv_error *err) {
    *json = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return *json ? SRV_OK : srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory writing the reply");
}

srv_code adm_datasets_list_json(adm_datasets *d, char **json, srv_error *err) {
    if (json) *json = NULL;
    if (!d) return srv_err(err, SRV_FAILED_PRECONDITION, "datasets need --state_dir");
    adm_dataset_rec *r = NULL;
    int n = 0;
    srv_code c = adm_state_datasets_list(d->state, &r, &n, err);
    if (c) return c;
    cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "datasets");
    for (int i = 0; a && i < n; i++) cJSON_AddItemToArray(a, ds_rec_obj(&r[i]));
    adm_dataset_recs_free(r, n);
    return ds_print(o, json, err);
}

srv_code adm_datasets_get_json(adm_datasets *d, const char *id, char **json, srv_error *err) {
    if (json) *json = NULL;
    if (!d) return srv_err(err, SRV_FAILED_PRECONDITION, "datasets need --state_dir");
    adm_dataset_rec r = {0};
    srv_code c = adm_state_dataset_get(d->state, id, &r, err);
    if (c) return c;
    cJSON *o = ds_rec_obj(&r);
    adm_dataset_rec_free(&r);
    return ds_print(o, json, err);
}

srv_code adm_datasets_delete(adm_datasets *d, const char *id, srv_error *err) {
    if (!d) return srv_err(err, SRV_FAILED_PRECONDITION, "datasets need --state_dir");
    srv_code c = ds_check_name(id, id ? strlen(id) : 0, err);
    if (c) return c;
    char *dir = ds_join(d->root, id);
    if (!dir) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    pthread_mutex_lock(&d->commit_mu);
    c = adm_state_dataset_delete(d->state, id, err);
    if (!c) {
        if (srv_remove_tree(dir) != 0) /* the record is gone; the next start removes what is left */
            srv_log(SRV_LOG_WARN, "dataset_cleanup", NULL, 0, "dataset '%s' is deleted but '%s' could not be removed: %s",
                    id, dir, strerror(errno));
        ds_fsync_path(d->root, 1);
    }
    pthread_mutex_unlock(&d->commit_mu);
    free(dir);
    return c;
}

srv_code adm_datasets_files(adm_datasets *d, const char *id, adm_dataset_files *out, srv_error *err) {
    if (out) memset(out, 0, sizeof *out);
    if (!d) return srv_err(err, SRV_FAILED_PRECONDITION, "datasets need --state_dir");
    if (!out) return srv_err(err, SRV_INVALID_ARGUMENT, "adm_datasets_files: out is NULL");
    adm_dataset_rec r = {0};
    srv_code c = adm_state_dataset_get(d->state, id, &r, err);
    if (c) return c;
    cJSON *files = cJSON_Parse(r.files_json);
    int n = cJSON_GetArraySize(files);
    if (!cJSON_IsArray(files) || n < 1) {
        c = srv_err(err, SRV_DATA_LOSS, "dataset '%s': its recorded file list cannot be read", id);
    } else if (!(out->files = calloc((size_t)n, sizeof *out->files))) {
        c = srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    } else {
        const cJSON *e;
        cJSON_ArrayForEach(e, files) {
            struct stat st;
            if (!cJSON_IsString(e) || !srv_name_valid(e->valuestring)) {
                c = srv_err(err, SRV_DATA_LOSS, "dataset '%s': its recorded file list is damaged", id);
                break;
            }
            if (asprintf(&out->files[out->nfiles], "%s/%s/%s", d->state_dir, r.dir, e->valuestring) < 0) {
                out->files[out->nfiles] = NULL;
                c = srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
                break;
            }
            if (stat(out->files[out->nfiles++], &st) != 0) {
                c = srv_err(err, SRV_DATA_LOSS, "dataset '%s': its file '%s' is missing (%s)", id,
                            out->files[out->nfiles - 1], strerror(errno));
                break;
            }
        }
    }
    if (!c) {
        out->records = r.records;
        out->columns_json = r.columns_json;
        r.columns_json = NULL;
    }
    cJSON_Delete(files);
    adm_dataset_rec_free(&r);
    if (c) adm_dataset_files_free(out);
    return c;
}

void adm_dataset_files_free(adm_dataset_files *f) {
    if (!f) return;
    for (int i = 0; i < f->nfiles; i++) free(f->files[i]);
    free(f->files);
    free(f->columns_json);
    memset(f, 0, sizeof *f);
}

/* ---- HTTP ---- */

enum { DS_R_LIST, DS_R_ONE };

typedef struct ds_req {
    adm_datasets *d;
    int route;                   /* DS_R_* */
    int upload;                  /* POST to the list: an upload */
    char id[256];
    adm_upload *up;
    struct MHD_PostProcessor *pp; /* multipart/form-data bodies */
    int64_t body;                /* body bytes received */
    int status;                  /* a refusal, answered once the body is in (0: none) */
    char *msg;
    int answered;                /* the reply was queued when the headers came in */
    int in_part;                 /* the post processor's current part */
    char part[DS_PART_MAX + 1];
    uint64_t part_off;
} ds_req;

static int ds_http(srv_code c) {
    switch (c) {
    case SRV_INVALID_ARGUMENT: case SRV_FAILED_PRECONDITION: case SRV_OUT_OF_RANGE: return 400;
    case SRV_NOT_FOUND: return 404;
    case SRV_ALREADY_EXISTS: case SRV_ABORTED: return 409;
    case SRV_RESOURCE_EXHAUSTED: return 413;
    default: return 500;
    }
}

/* Remember the first refusal of an upload (its files go now); the reply is sent when the body is in. */
static void ds_req_refuse(ds_req *r, int status, const char *msg) {
    adm_upload_free(&r->up);
    if (r->status) return;
    r->status = status;
    r->msg = strdup(msg);
}

static enum MHD_Result ds_reply_now(struct MHD_Connection *c, ds_req *r, int status, const char *msg) {
    adm_upload_free(&r->up);
    r->answered = 1;
    return adm_error(c, status, msg);
}

static enum MHD_Result ds_reply_405(struct MHD_Connection *c, ds_req *r, const char *allow) {
    char m[160];
    snprintf(m, sizeof m, "{\"error\":\"method not allowed on this dataset route (allowed: %s)\"}", allow);
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(m), m, MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
    r->answered = 1;
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_METHOD_NOT_ALLOWED, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* The post processor hands each part's bytes in order; a part begins at offset 0. */
static enum MHD_Result ds_part_data(void *cls, enum MHD_ValueKind kind, const char *key, const char *filename,
                                    const char *content_type, const char *transfer_encoding, const char *data,
                                    uint64_t off, size_t size) {
    (void)filename, (void)content_type, (void)transfer_encoding;
    ds_req *r = cls;
    if (r->status || !r->up) return MHD_NO;
    if (kind != MHD_POSTDATA_KIND || !key) return MHD_YES;
    srv_error err = {0};
    if (!r->in_part || strcmp(key, r->part) != 0 || off != r->part_off) {
        if (off != 0) {
            snprintf(err.msg, sizeof err.msg, "dataset '%s': multipart part '%.80s' arrived out of order", r->up->name, key);
            ds_req_refuse(r, 400, err.msg);
            return MHD_NO;
        }
        if (adm_upload_part(r->up, key, &err) != SRV_OK) {
            ds_req_refuse(r, ds_http(err.code), err.msg);
            return MHD_NO;
        }
        snprintf(r->part, sizeof r->part, "%s", key);
        r->in_part = 1;
        r->part_off = 0;
    }
    if (size && adm_upload_write(r->up, data, size, &err) != SRV_OK) {
        ds_req_refuse(r, ds_http(err.code), err.msg);
        return MHD_NO;
    }
    r->part_off += size;
    return MHD_YES;
}

/* "" -> LIST, "/{id}" -> ONE; -1 no such route; -2 a bad id; -3 one over 255 bytes. */
static int ds_route(const char *url, char *id) {
    id[0] = '\0';
    if (strncmp(url, DS_PREFIX, sizeof DS_PREFIX - 1) != 0) return -1;
    const char *p = url + sizeof DS_PREFIX - 1;
    if (!*p || !strcmp(p, "/")) return DS_R_LIST;
    if (*p++ != '/' || strchr(p, '/')) return -1;
    size_t n = strlen(p);
    if (n > 255) {
        snprintf(id, 256, "%.255s", p);
        return -3;
    }
    memcpy(id, p, n + 1);
    return srv_name_valid(id) ? DS_R_ONE : -2;
}

/* The request's headers are in: route it; an upload is checked and begun (refusals are answered now, before any
 * body byte is read). */
static enum MHD_Result ds_begin(adm_datasets *d, struct MHD_Connection *c, ds_req *r, const char *url,
                                const char *method) {
    r->route = ds_route(url, r->id);
    if (r->route == -1) return ds_reply_now(c, r, 404, "no such admin route: " DS_PREFIX "[/{dataset}]");
    if (r->route == -2 || r->route == -3) {
        char m[400];
        snprintf(m, sizeof m, "dataset name '%.100s' in the URL %s (" DS_NAME_RULE ")", r->id,
                 r->route == -3 ? "is over 255 bytes" : strstr(r->id, "%00") ? "holds a NUL byte" : "is not valid");
        return ds_reply_now(c, r, 400, m);
    }
    if (r->route == DS_R_LIST && strcmp(method, "GET") && strcmp(method, "POST")) return ds_reply_405(c, r, "GET, POST");
    if (r->route == DS_R_ONE && strcmp(method, "GET") && strcmp(method, "DELETE")) return ds_reply_405(c, r, "GET, DELETE");
    if (!d) return ds_reply_now(c, r, 400, "datasets need the state store: start tensord with --state_dir");
    if (r->route != DS_R_LIST || strcmp(method, "POST")) return MHD_YES;
    r->upload = 1;
    srv_error err = {0};
    const char *name = NULL, *format = NULL;
    size_t nl = 0, fl = 0;
    if (MHD_lookup_connection_value_n(c, MHD_GET_ARGUMENT_KIND, "name", 4, &name, &nl) != MHD_YES) name = NULL;
    if (MHD_lookup_connection_value_n(c, MHD_GET_ARGUMENT_KIND, "format", 6, &format, &fl) != MHD_YES) format = NULL;
    if (ds_check_name(name, nl, &err)) return ds_reply_now(c, r, 400, err.msg);
    if (format && strlen(format) != fl) format = "(a value holding NUL)";
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    int64_t clen = -1;
    if (cl) {
        char *end = NULL;
        errno = 0;
        unsigned long long v = strtoull(cl, &end, 10);
        clen = errno || end == cl || v > INT64_MAX ? INT64_MAX : (int64_t)v;
    }
    if (clen > d->max_upload) {
        char m[400];
        snprintf(m, sizeof m, "dataset '%s': the upload of %lld bytes is over the limit of %lld bytes (--max_upload_bytes)",
                 name, (long long)clen, (long long)d->max_upload);
        return ds_reply_now(c, r, 413, m);
    }
    if (adm_upload_new(d, name, format, &r->up, &err) != SRV_OK) return ds_reply_now(c, r, ds_http(err.code), err.msg);
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    if (ct && !strncasecmp(ct, "multipart/form-data", 19)) {
        if (!(r->pp = MHD_create_post_processor(c, 64 * 1024, ds_part_data, r))) {
            snprintf(err.msg, sizeof err.msg, "dataset '%s': the multipart/form-data body has no boundary", name);
            return ds_reply_now(c, r, 400, err.msg);
        }
        return MHD_YES;
    }
    if (clen > r->up->quota_left) {
        snprintf(err.msg, sizeof err.msg, "dataset '%s': %lld bytes would take the datasets over the quota of %lld bytes "
                 "(--dataset_quota_bytes; %lld in use)", name, (long long)clen, (long long)d->quota,
                 (long long)(d->quota - r->up->quota_left));
        return ds_reply_now(c, r, 413, err.msg);
    }
    if (adm_upload_part(r->up, NULL, &err) != SRV_OK) return ds_reply_now(c, r, ds_http(err.code), err.msg);
    return MHD_YES;
}

/* A piece of the body: streamed to the upload's file; after a refusal the rest is read and dropped. */
static void ds_body(adm_datasets *d, ds_req *r, const char *data, size_t n) {
    if (!r->upload || r->status) return;
    r->body += (int64_t)n;
    srv_error err = {0};
    if (r->body > d->max_upload) {
        snprintf(err.msg, sizeof err.msg, "dataset '%s': the upload is over the limit of %lld bytes (--max_upload_bytes)",
                 r->up ? r->up->name : "?", (long long)d->max_upload);
        ds_req_refuse(r, 413, err.msg);
        return;
    }
    if (r->pp) {
        if (MHD_post_process(r->pp, data, n) != MHD_YES && !r->status) {
            snprintf(err.msg, sizeof err.msg, "dataset '%s': the multipart/form-data body is malformed",
                     r->up ? r->up->name : "?");
            ds_req_refuse(r, 400, err.msg);
        }
    } else if (r->up && adm_upload_write(r->up, data, n, &err) != SRV_OK) {
        ds_req_refuse(r, ds_http(err.code), err.msg);
    }
}

static enum MHD_Result ds_answer(struct MHD_Connection *c, srv_code rc, const srv_error *err, int ok_status, char *json) {
    if (rc != SRV_OK) {
        free(json);
        return adm_error(c, ds_http(rc), err->msg);
    }
    return adm_send(c, ok_status, json, NULL);
}

/* The body is in: answer. */
static enum MHD_Result ds_end(adm_datasets *d, struct MHD_Connection *c, ds_req *r, const char *method) {
    srv_error err = {0};
    char *json = NULL;
    if (r->upload) {
        if (r->pp) {
            enum MHD_Result done = MHD_destroy_post_processor(r->pp);
            r->pp = NULL;
            if (done != MHD_YES && !r->status) {
                snprintf(err.msg, sizeof err.msg, "dataset '%s': the multipart/form-data body is truncated or malformed",
                         r->up ? r->up->name : "?");
                ds_req_refuse(r, 400, err.msg);
            }
        }
        if (r->status) return adm_error(c, r->status, r->msg ? r->msg : "the upload is refused");
        adm_dataset_rec rec = {0};
        srv_code rc = adm_upload_finish(r->up, &rec, &err);
        adm_upload_free(&r->up);
        if (rc == SRV_OK) {
            cJSON *o = ds_rec_obj(&rec);
            rc = ds_print(o, &json, &err);
            srv_log(SRV_LOG_INFO, "dataset_upload", NULL, 0, "dataset '%s' (%s): %lld records, %lld bytes, sha256 %s",
                    rec.id, rec.format, (long long)rec.records, (long long)rec.bytes, rec.sha256);
        }
        adm_dataset_rec_free(&rec);
        return ds_answer(c, rc, &err, 201, json);
    }
    srv_code rc;
    if (r->route == DS_R_LIST) {
        rc = adm_datasets_list_json(d, &json, &err);
        return ds_answer(c, rc, &err, 200, json);
    }
    if (!strcmp(method, "GET")) {
        rc = adm_datasets_get_json(d, r->id, &json, &err);
        return ds_answer(c, rc, &err, 200, json);
    }
    rc = adm_datasets_delete(d, r->id, &err);
    if (rc == SRV_OK) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "dataset", r->id);
        cJSON_AddBoolToObject(o, "deleted", 1);
        rc = ds_print(o, &json, &err);
        srv_log(SRV_LOG_INFO, "dataset_delete", NULL, 0, "dataset '%s' deleted", r->id);
    }
    return ds_answer(c, rc, &err, 200, json);
}

static int ds_hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

size_t adm_url_unescape(void *cls, struct MHD_Connection *c, char *s) {
    (void)cls, (void)c;
    char *w = s;
    const char *r = s;
    while (*r) {
        int hi = r[0] == '%' ? ds_hexval(r[1]) : -1, lo = hi >= 0 ? ds_hexval(r[2]) : -1;
        if (lo >= 0 && (hi | lo)) {
            *w++ = (char)(hi << 4 | lo);
            r += 3;
        } else {
            *w++ = *r++;
        }
    }
    *w = '\0';
    return (size_t)(w - s);
}

enum MHD_Result adm_datasets_access(adm_datasets *d, struct MHD_Connection *c, const char *url, const char *method,
                                    const char *upload, size_t *upload_size, void **ctx) {
    ds_req *r = *ctx;
    if (!r) {
        if (!(r = calloc(1, sizeof *r))) return MHD_NO;
        r->d = d;
        *ctx = r;
        return ds_begin(d, c, r, url, method);
    }
    if (*upload_size) {
        if (!r->answered) ds_body(d, r, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (r->answered) return MHD_YES;
    r->answered = 1;
    return ds_end(d, c, r, method);
}

void adm_datasets_done(adm_datasets *d, void *ctx) {
    (void)d;
    ds_req *r = ctx;
    if (!r) return;
    if (!r->status) r->status = 499; /* the iterator drops whatever the post processor still flushes */
    if (r->pp) MHD_destroy_post_processor(r->pp);
    adm_upload_free(&r->up);
    free(r->msg);
    free(r);
}
