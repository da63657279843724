/* test_datasets.c - admin/datasets.c and admin/state-datasets.c: uploads stored, validated by engine/data's readers
 * and recorded (IDX pairs raw and gzipped, in either part order; NPY; CSV), the SHA-256 of what was received, the
 * refusals (names, formats, parts, malformed files with the reader's message, an IDX pair whose counts differ,
 * --max_upload_bytes, the quota, a name taken, also by a concurrent upload), each leaving nothing on disk; a record
 * write failing at every statement in turn (the dir goes with it); delete refused while a QUEUED or RUNNING job uses
 * the dataset; what a crashed process left removed at start; adm_datasets_files. Then the HTTP layer
 * (adm_datasets_access) under a real libmicrohttpd daemon on loopback, with a raw-socket client: multipart and
 * chunked uploads, 413 before the body is read, a chunked body growing past the limit, a client gone mid-upload,
 * a NUL in the name, the read and delete routes, 404 and 405.
 *
 * Each test works in a fresh mkdtemp state dir. SHOW_MSGS=1 prints the refusals' messages.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "engine/ir/npy.h"

#include "admin/datasets.c"
#include "admin/state-datasets.c"
#include "admin/state.c"
#include "server/json.c"
#include "server/log.c"
#include "server/srv.c"

#include "admin/admin-http.c" /* the reply helpers admin.c uses (the HTTP tests below do not start admin.c) */

static char g_dir[256], g_root[300];
static adm_state *g_st;
static adm_datasets *g_d;

static void show(const char *what, const char *msg) {
    if (getenv("SHOW_MSGS")) fprintf(stderr, "  [%s] %s\n", what, msg);
}

static adm_datasets *open_ds(int64_t max_upload, int64_t quota) {
    adm_datasets_opts o = {.state_dir = g_dir, .state = g_st, .max_upload_bytes = max_upload, .quota_bytes = quota};
    srv_error e = {0};
    adm_datasets *d = adm_datasets_new(&o, &e);
    cr_assert_not_null(d, "adm_datasets_new: %s", e.msg);
    return d;
}

static void setup(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/tensord-datasets-XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
    snprintf(g_root, sizeof g_root, "%s/datasets", g_dir);
    srv_error e = {0};
    cr_assert_eq(adm_state_open(g_dir, &g_st, &e), SRV_OK, "%s", e.msg);
    g_d = open_ds(0, 0);
}

static void teardown(void) {
    adm_datasets_free(&g_d);
    adm_state_free(&g_st);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) {}
}

TestSuite(datasets, .init = setup, .fini = teardown, .timeout = 60);

/* ---- data ---- */

typedef struct buf { unsigned char *p; size_t n; } buf;

static buf idx_images(int n, int rows, int cols, unsigned seed) {
    buf b = {malloc(16 + (size_t)n * rows * cols), 16 + (size_t)n * rows * cols};
    unsigned char h[16] = {0, 0, 8, 3, (unsigned char)(n >> 24), (unsigned char)(n >> 16), (unsigned char)(n >> 8),
                           (unsigned char)n, 0, 0, 0, (unsigned char)rows, 0, 0, 0, (unsigned char)cols};
    memcpy(b.p, h, 16);
    for (size_t i = 16; i < b.n; i++) b.p[i] = (unsigned char)(i * 31 + seed);
    return b;
}

static buf idx_labels(int n) {
    buf b = {malloc(8 + (size_t)n), 8 + (size_t)n};
    unsigned char h[8] = {0, 0, 8, 1, (unsigned char)(n >> 24), (unsigned char)(n >> 16), (unsigned char)(n >> 8),
                          (unsigned char)n};
    memcpy(b.p, h, 8);
    for (int i = 0; i < n; i++) b.p[8 + i] = (unsigned char)(i % 10);
    return b;
}

static buf text(const char *s) {
    buf b = {(unsigned char *)strdup(s), strlen(s)};
    return b;
}

static buf gz(buf in) {
    z_stream z = {0};
    cr_assert_eq(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
    buf o = {malloc(deflateBound(&z, in.n) + 64), 0};
    z.next_in = in.p;
    z.avail_in = (uInt)in.n;
    z.next_out = o.p;
    z.avail_out = (uInt)(deflateBound(&z, in.n) + 64);
    cr_assert_eq(deflate(&z, Z_FINISH), Z_STREAM_END);
    o.n = z.total_out;
    deflateEnd(&z);
    return o;
}

static buf npy(eng_dtype dt, int ndim, const int64_t *dims, const void *data) {
    char path[400];
    snprintf(path, sizeof path, "%s/gen.npy", g_dir);
    eng_tensor t = {.dtype = dt, .ndim = ndim, .data = (void *)data};
    memcpy(t.dims, dims, sizeof(int64_t) * (size_t)ndim);
    cr_assert_eq(eng_npy_save(path, &t), ENG_STATUS_OK, "%s", eng_last_error());
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    fseek(f, 0, SEEK_END);
    buf b = {malloc((size_t)ftell(f)), (size_t)ftell(f)};
    rewind(f);
    cr_assert_eq(fread(b.p, 1, b.n, f), b.n);
    fclose(f);
    unlink(path);
    return b;
}

static void sha_hex(const buf *parts, int n, char *out) {
    EVP_MD_CTX *m = EVP_MD_CTX_new();
    EVP_DigestInit_ex(m, EVP_sha256(), NULL);
    for (int i = 0; i < n; i++) EVP_DigestUpdate(m, parts[i].p, parts[i].n);
    unsigned char md[32];
    unsigned k = 0;
    EVP_DigestFinal_ex(m, md, &k);
    EVP_MD_CTX_free(m);
    for (int i = 0; i < 32; i++) sprintf(out + 2 * i, "%02x", md[i]);
}

/* Entries of the datasets dir, sorted, space-separated ("" when empty). */
static char *root_entries(void) {
    static char out[4096];
    out[0] = '\0';
    struct dirent **ents = NULL;
    int n = scandir(g_root, &ents, NULL, alphasort);
    for (int i = 0; i < n; i++) {
        if (strcmp(ents[i]->d_name, ".") && strcmp(ents[i]->d_name, ".."))
            snprintf(out + strlen(out), sizeof out - strlen(out), "%s%s", *out ? " " : "", ents[i]->d_name);
        free(ents[i]);
    }
    free(ents);
    return out;
}

/* Upload parts (names NULL: the raw body), written in pieces of `piece` bytes. */
static srv_code upload(adm_datasets *d, const char *name, const char *fmt, int n, const char *const *parts,
                       const buf *bufs, size_t piece, adm_dataset_rec *rec, srv_error *e) {
    adm_upload *u = NULL;
    srv_code c = adm_upload_new(d, name, fmt, &u, e);
    for (int i = 0; !c && i < n; i++) {
        c = adm_upload_part(u, parts ? parts[i] : NULL, e);
        for (size_t k = 0; !c && k < bufs[i].n; k += piece)
            c = adm_upload_write(u, bufs[i].p + k, bufs[i].n - k < piece ? bufs[i].n - k : piece, e);
    }
    adm_dataset_rec tmp = {0};
    if (!c) c = adm_upload_finish(u, rec ? rec : &tmp, e);
    adm_dataset_rec_free(&tmp);
    adm_upload_free(&u);
    return c;
}

static const char *const IDX_PARTS[] = {"images", "labels"};
static const char *const IDX_PARTS_REV[] = {"labels", "images"};

static void free_bufs(buf *b, int n) {
    for (int i = 0; i < n; i++) free(b[i].p);
}

/* ---- uploads that are accepted ---- */

Test(datasets, idx_pair_is_stored_checked_and_recorded) {
    buf b[2] = {idx_images(7, 4, 5, 1), idx_labels(7)};
    char want[65];
    sha_hex(b, 2, want);
    adm_dataset_rec r = {0};
    srv_error e = {0};
    cr_assert_eq(upload(g_d, "fm", "idx", 2, IDX_PARTS, b, 13, &r, &e), SRV_OK, "%s", e.msg);
    cr_assert_str_eq(r.id, "fm");
    cr_assert_str_eq(r.format, "idx");
    cr_assert_eq(r.records, 7);
    cr_assert_eq(r.bytes, (int64_t)(b[0].n + b[1].n));
    cr_assert_str_eq(r.sha256, want);
    cr_assert_str_eq(r.files_json, "[\"images-idx-ubyte\",\"labels-idx-ubyte\"]");
    cr_assert_str_eq(r.columns_json, "[{\"name\":\"x\",\"dtype\":\"float32\",\"shape\":[4,5]},"
                                     "{\"name\":\"label\",\"dtype\":\"int64\",\"shape\":[]}]");
    cr_assert_gt(r.created_ms, 0);
    cr_assert_str_eq(root_entries(), "fm");
    adm_dataset_rec_free(&r);

    /* the stored files are what was sent, and the job queue gets their absolute paths in load order */
    adm_dataset_files f = {0};
    cr_assert_eq(adm_datasets_files(g_d, "fm", &f, &e), SRV_OK, "%s", e.msg);
    cr_assert_eq(f.nfiles, 2);
    cr_assert_eq(f.records, 7);
    cr_assert(strstr(f.columns_json, "\"shape\":[4,5]"));
    char want0[600];
    char *rp = realpath(g_dir, NULL);
    snprintf(want0, sizeof want0, "%s/datasets/fm/images-idx-ubyte", rp);
    free(rp);
    cr_assert_str_eq(f.files[0], want0);
    cr_assert(f.files[1][0] == '/' && strstr(f.files[1], "/datasets/fm/labels-idx-ubyte"));
    eng_dataset *ds = NULL;
    cr_assert_eq(eng_dataset_load((const char *const *)f.files, f.nfiles, &ds), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(ds->n, 7);
    eng_dataset_free(&ds);
    FILE *fp = fopen(f.files[0], "rb");
    unsigned char got[4096];
    size_t k = fread(got, 1, sizeof got, fp);
    fclose(fp);
    cr_assert(k == b[0].n && memcmp(got, b[0].p, k) == 0);
    adm_dataset_files_free(&f);

    /* the record survives a restart of the store */
    adm_datasets_free(&g_d);
    adm_state_free(&g_st);
    cr_assert_eq(adm_state_open(g_dir, &g_st, &e), SRV_OK, "%s", e.msg);
    g_d = open_ds(0, 0);
    char *json = NULL;
    cr_assert_eq(adm_datasets_get_json(g_d, "fm", &json, &e), SRV_OK, "%s", e.msg);
    cr_assert(strstr(json, "\"records\":7") && strstr(json, want) && strstr(json, "\"dataset\":\"fm\""), "%s", json);
    free(json);
    cr_assert_str_eq(root_entries(), "fm");
    free_bufs(b, 2);
}

Test(datasets, gzipped_idx_in_either_part_order_hashes_images_then_labels) {
    buf raw[2] = {idx_images(5, 3, 3, 2), idx_labels(5)};
    buf b[2] = {gz(raw[0]), gz(raw[1])};
    char want[65];
    sha_hex(b, 2, want);
    buf rev[2] = {b[1], b[0]};
    adm_dataset_rec r = {0};
    srv_error e = {0};
    cr_assert_eq(upload(g_d, "gzrev", "idx", 2, IDX_PARTS_REV, rev, 1000, &r, &e), SRV_OK, "%s", e.msg);
    cr_assert_str_eq(r.sha256, want);
    cr_assert_eq(r.records, 5);
    cr_assert_str_eq(r.files_json, "[\"images-idx-ubyte.gz\",\"labels-idx-ubyte.gz\"]");
    adm_dataset_rec_free(&r);
    free_bufs(raw, 2);
    free_bufs(b, 2);
}

Test(datasets, csv_npy_and_npy_parts) {
    buf csv = text("a,b,label\n1,2,0\n3.5,-4,1\n\"5\",6e-1,2\n");
    char want[65];
    sha_hex(&csv, 1, want);
    adm_dataset_rec r = {0};
    srv_error e = {0};
    cr_assert_eq(upload(g_d, "c", "csv", 1, NULL, &csv, 5, &r, &e), SRV_OK, "%s", e.msg);
    cr_assert_eq(r.records, 3);
    cr_assert_str_eq(r.sha256, want);
    cr_assert_str_eq(r.columns_json, "[{\"name\":\"x\",\"dtype\":\"float32\",\"shape\":[2]},"
                                     "{\"name\":\"label\",\"dtype\":\"int64\",\"shape\":[]}]");
    adm_dataset_rec_free(&r);

    float xs[6] = {1, 2, 3, 4, 5, 6};
    int64_t ys[3] = {0, 1, 0};
    buf nx = npy(ENG_DTYPE_F32, 2, (int64_t[]){3, 2}, xs), ny = npy(ENG_DTYPE_I64, 1, (int64_t[]){3}, ys);
    cr_assert_eq(upload(g_d, "one", "npy", 1, NULL, &nx, 64, &r, &e), SRV_OK, "%s", e.msg);
    cr_assert_str_eq(r.files_json, "[\"x.npy\"]");
    adm_dataset_rec_free(&r);
    buf both[2] = {nx, ny};
    cr_assert_eq(upload(g_d, "two", "npy", 2, (const char *[]){"x", "y"}, both, 64, &r, &e), SRV_OK, "%s", e.msg);
    cr_assert_str_eq(r.files_json, "[\"x.npy\",\"y.npy\"]");
    cr_assert(strstr(r.columns_json, "\"name\":\"label\""), "%s", r.columns_json);
    adm_dataset_rec_free(&r);

    /* listed newest first */
    char *json = NULL;
    cr_assert_eq(adm_datasets_list_json(g_d, &json, &e), SRV_OK, "%s", e.msg);
    char *p2 = strstr(json, "\"two\""), *p1 = strstr(json, "\"one\""), *pc = strstr(json, "\"c\"");
    cr_assert(p2 && p1 && pc && p2 < p1 && p1 < pc, "%s", json);
    free(json);
    cr_assert_str_eq(root_entries(), "c one two");
    free_bufs(&csv, 1);
    free_bufs(both, 2);
}

/* ---- refusals: each leaves nothing ---- */

typedef struct bad_case {
    const char *what, *name, *fmt;
    int n;
    const char *const *parts;
    buf b[2];
    srv_code want;
    const char *want_msg[3];
} bad_case;

Test(datasets, malformed_files_are_refused_with_the_readers_message_and_leave_nothing) {
    buf im = idx_images(6, 2, 2, 3), lb = idx_labels(5), lb6 = idx_labels(6);
    buf bad_magic = idx_images(6, 2, 2, 3);
    bad_magic.p[0] = 0x42;
    buf trunc = idx_images(6, 2, 2, 3);
    trunc.n -= 3;
    float xs[4] = {1, 2, 3, 4};
    buf nx = npy(ENG_DTYPE_F32, 2, (int64_t[]){2, 2}, xs);
    nx.n -= 5;
    bad_case cases[] = {
        {"idx counts differ", "d1", "idx", 2, IDX_PARTS, {im, lb}, SRV_INVALID_ARGUMENT, {"5 examples", "6", "label"}},
        {"bad idx magic", "d2", "idx", 2, IDX_PARTS, {bad_magic, lb6}, SRV_INVALID_ARGUMENT,
         {"images-idx-ubyte", "not an IDX file", "d2"}},
        {"truncated idx", "d3", "idx", 2, IDX_PARTS, {trunc, lb6}, SRV_INVALID_ARGUMENT, {"truncated", "images", NULL}},
        {"one idx part", "d4", "idx", 1, IDX_PARTS, {im}, SRV_INVALID_ARGUMENT, {"'labels' is missing", NULL, NULL}},
        {"idx raw body", "d5", "idx", 1, NULL, {im}, SRV_INVALID_ARGUMENT, {"multipart", "images", NULL}},
        {"idx odd part", "d6", "idx", 1, (const char *[]){"pics"}, {im}, SRV_INVALID_ARGUMENT, {"'pics'", NULL, NULL}},
        {"csv text cell", "d7", "csv", 1, NULL, {text("a,label\n1,0\n2,1\nx7,0\n")}, SRV_INVALID_ARGUMENT,
         {"line 4", "data.csv", "x7"}},
        {"csv nan", "d8", "csv", 1, NULL, {text("a,label\n1,0\nnan,1\n")}, SRV_INVALID_ARGUMENT, {"non-finite", "example 1", NULL}},
        {"csv ragged", "d9", "csv", 1, NULL, {text("a,b,label\n1,2,0\n1,2\n")}, SRV_INVALID_ARGUMENT, {"line 3", NULL, NULL}},
        {"csv empty", "d10", "csv", 1, NULL, {text("")}, SRV_INVALID_ARGUMENT, {"data.csv", NULL, NULL}},
        {"npy truncated", "d11", "npy", 1, NULL, {nx}, SRV_INVALID_ARGUMENT, {"x.npy", NULL, NULL}},
        {"npz not a zip", "d12", "npz", 1, NULL, {text("PK\x03\x04 but not really a zip archive")}, SRV_INVALID_ARGUMENT,
         {"data.npz", NULL, NULL}},
        {"jsonl bad line", "d13", "jsonl", 1, NULL, {text("{\"inputs\": {\"x\": [1]}, \"label\": 1}\n{oops\n")},
         SRV_INVALID_ARGUMENT, {"data.jsonl", "2", NULL}},
        {"tfrecord junk", "d14", "tfrecord", 1, NULL, {text("not a tfrecord at all, no")}, SRV_INVALID_ARGUMENT,
         {"data.tfrecord", NULL, NULL}},
        {"two csv files", "d15", "csv", 2, (const char *[]){"a", "b"}, {text("a,label\n1,0\n"), text("a,label\n1,0\n")},
         SRV_INVALID_ARGUMENT, {"one file", "'b'", NULL}},
        {"part given twice", "d16", "npy", 2, (const char *[]){"x", "x"}, {text("1"), text("2")}, SRV_INVALID_ARGUMENT,
         {"twice", NULL, NULL}},
        {"bad part name", "d17", "npy", 1, (const char *[]){"../x"}, {text("1")}, SRV_INVALID_ARGUMENT, {"'../x'", NULL, NULL}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bad_case *k = &cases[i];
        srv_error e = {0};
        srv_code c = upload(g_d, k->name, k->fmt, k->n, k->parts, k->b, 3, NULL, &e);
        show(k->what, e.msg);
        cr_assert_eq(c, k->want, "%s: %s %s", k->what, srv_code_name(c), e.msg);
        for (int m = 0; m < 3; m++)
            if (k->want_msg[m]) cr_assert(strstr(e.msg, k->want_msg[m]), "%s: '%s' not in: %s", k->what, k->want_msg[m], e.msg);
        cr_assert_null(strstr(e.msg, ".tmp-"), "%s: the message names the temp dir: %s", k->what, e.msg);
        cr_assert_str_eq(root_entries(), "", "%s left: %s", k->what, root_entries());
        adm_dataset_rec r = {0};
        cr_assert_eq(adm_state_dataset_get(g_st, k->name, &r, &e), SRV_NOT_FOUND, "%s", k->what);
    }
    free(im.p), free(lb.p), free(lb6.p), free(bad_magic.p), free(trunc.p), free(nx.p);
    for (size_t i = 6; i < sizeof cases / sizeof cases[0]; i++)
        for (int j = 0; j < cases[i].n; j++)
            if (cases[i].b[j].p != nx.p) free(cases[i].b[j].p);
}

Test(datasets, names_and_formats_are_checked_first) {
    char long_name[300];
    memset(long_name, 'a', 256);
    long_name[256] = '\0';
    const char *names[] = {"..", ".", "a/b", "", "a b", "x\n", long_name, NULL};
    for (int i = 0; i < 8; i++) {
        adm_upload *u = NULL;
        srv_error e = {0};
        cr_assert_eq(adm_upload_new(g_d, names[i], "csv", &u, &e), SRV_INVALID_ARGUMENT, "name %d", i);
        cr_assert_null(u);
        cr_assert(strstr(e.msg, "dataset name") || strstr(e.msg, "needs a dataset name"), "%s", e.msg);
        show("name", e.msg);
    }
    srv_error e = {0};
    cr_assert_eq(ds_check_name("a\0b", 3, &e), SRV_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "NUL"), "%s", e.msg);
    long_name[255] = '\0';
    cr_assert_eq(ds_check_name(long_name, 255, &e), SRV_OK);
    const char *fmts[] = {"IDX", "parquet", "", NULL};
    for (int i = 0; i < 4; i++) {
        adm_upload *u = NULL;
        cr_assert_eq(adm_upload_new(g_d, "ok", fmts[i], &u, &e), SRV_INVALID_ARGUMENT);
        cr_assert(strstr(e.msg, "format") && strstr(e.msg, "'ok'"), "%s", e.msg);
    }
    cr_assert_str_eq(root_entries(), "");
    /* the store refuses what the HTTP layer would never send */
    adm_dataset_rec r = {.id = "x", .format = "csv", .dir = "../x", .files_json = "[\"a.csv\"]", .records = 1,
                         .sha256 = "00"};
    cr_assert_eq(adm_state_dataset_put(g_st, &r, 0, NULL, &e), SRV_INVALID_ARGUMENT);
    r.dir = "datasets/x";
    cr_assert_eq(adm_state_dataset_put(g_st, &r, 0, NULL, &e), SRV_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "sha256"), "%s", e.msg);
    r.sha256 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    r.files_json = "[\"../a.csv\"]";
    cr_assert_eq(adm_state_dataset_put(g_st, &r, 0, NULL, &e), SRV_INVALID_ARGUMENT);
    r.files_json = "[\"a.csv\"]";
    r.columns_json = "[oops";
    cr_assert_eq(adm_state_dataset_put(g_st, &r, 0, NULL, &e), SRV_INVALID_ARGUMENT);
}

Test(datasets, limits_per_upload_and_quota) {
    adm_datasets_free(&g_d);
    g_d = open_ds(66, 150);
    buf csv = text("a,label\n1,0\n2,1\n3,0\n4,1\n5,0\n6,1\n7,0\n8,1\n9,0\n10,1\n11,0\n12,1\n13,0\n"); /* 64 bytes */
    cr_assert_eq(csv.n, 64);
    srv_error e = {0};
    buf big = text("a,label\n1,0\n2,1\n3,0\n4,1\n5,0\n6,1\n7,0\n8,1\n9,0\n10,1\n11,0\n12,1\n13,0\n14,1\n");
    cr_assert_eq(upload(g_d, "big", "csv", 1, NULL, &big, 7, NULL, &e), SRV_RESOURCE_EXHAUSTED);
    cr_assert(strstr(e.msg, "--max_upload_bytes") && strstr(e.msg, "'big'"), "%s", e.msg);
    show("max", e.msg);
    cr_assert_str_eq(root_entries(), "");
    cr_assert_eq(upload(g_d, "q1", "csv", 1, NULL, &csv, 7, NULL, &e), SRV_OK, "%s", e.msg);
    cr_assert_eq(upload(g_d, "q2", "csv", 1, NULL, &csv, 7, NULL, &e), SRV_OK, "%s", e.msg);
    cr_assert_eq(upload(g_d, "q3", "csv", 1, NULL, &csv, 7, NULL, &e), SRV_RESOURCE_EXHAUSTED);
    cr_assert(strstr(e.msg, "--dataset_quota_bytes"), "%s", e.msg);
    show("quota", e.msg);
    cr_assert_str_eq(root_entries(), "q1 q2");

    /* two uploads that each fit when they begin: the second to finish is refused by the quota */
    cr_assert_eq(adm_datasets_delete(g_d, "q2", &e), SRV_OK, "%s", e.msg);
    adm_upload *a = NULL, *b = NULL;
    cr_assert_eq(adm_upload_new(g_d, "ca", "csv", &a, &e), SRV_OK, "%s", e.msg);
    cr_assert_eq(adm_upload_new(g_d, "cb", "csv", &b, &e), SRV_OK, "%s", e.msg);
    cr_assert_eq(adm_upload_part(a, NULL, &e), SRV_OK);
    cr_assert_eq(adm_upload_part(b, NULL, &e), SRV_OK);
    cr_assert_eq(adm_upload_write(a, csv.p, csv.n, &e), SRV_OK);
    cr_assert_eq(adm_upload_write(b, csv.p, csv.n, &e), SRV_OK);
    adm_dataset_rec r = {0};
    cr_assert_eq(adm_upload_finish(a, &r, &e), SRV_OK, "%s", e.msg);
    adm_dataset_rec_free(&r);
    cr_assert_eq(adm_upload_finish(b, &r, &e), SRV_RESOURCE_EXHAUSTED, "%s", e.msg);
    adm_upload_free(&a);
    adm_upload_free(&b);
    cr_assert_str_eq(root_entries(), "ca q1");
    int64_t total = 0;
    cr_assert_eq(adm_state_datasets_bytes(g_st, &total, &e), SRV_OK);
    cr_assert_eq(total, 128);
    free(csv.p);
    free(big.p);
}

Test(datasets, a_name_taken_is_refused_also_between_concurrent_uploads) {
    buf csv = text("a,label\n1,0\n");
    srv_error e = {0};
    adm_upload *a = NULL, *b = NULL;
    cr_assert_eq(adm_upload_new(g_d, "same", "csv", &a, &e), SRV_OK);
    cr_assert_eq(adm_upload_new(g_d, "same", "csv", &b, &e), SRV_OK);
    adm_upload_part(a, NULL, &e);
    adm_upload_part(b, NULL, &e);
    adm_upload_write(a, csv.p, csv.n, &e);
    cr_assert_eq(adm_upload_write(b, "a,label\n2,1\n", 12, &e), SRV_OK);
    adm_dataset_rec r = {0};
    cr_assert_eq(adm_upload_finish(a, &r, &e), SRV_OK, "%s", e.msg);
    char sha_a[65];
    snprintf(sha_a, sizeof sha_a, "%s", r.sha256);
    adm_dataset_rec_free(&r);
    cr_assert_eq(adm_upload_finish(b, &r, &e), SRV_ALREADY_EXISTS, "%s", e.msg);
    show("exists", e.msg);
    adm_upload_free(&a);
    adm_upload_free(&b);
    cr_assert_str_eq(root_entries(), "same");
    cr_assert_eq(adm_state_dataset_get(g_st, "same", &r, &e), SRV_OK);
    cr_assert_str_eq(r.sha256, sha_a);
    adm_dataset_rec_free(&r);
    cr_assert_eq(upload(g_d, "same", "csv", 1, NULL, &csv, 4, NULL, &e), SRV_ALREADY_EXISTS);
    cr_assert(strstr(e.msg, "'same' exists"), "%s", e.msg);
    /* an upload dropped half-way (the client went away) leaves nothing */
    cr_assert_eq(adm_upload_new(g_d, "gone", "csv", &a, &e), SRV_OK);
    adm_upload_part(a, NULL, &e);
    adm_upload_write(a, csv.p, 5, &e);
    cr_assert_str_neq(root_entries(), "same");
    adm_upload_free(&a);
    cr_assert_str_eq(root_entries(), "same");
    free(csv.p);
}

Test(datasets, a_failed_record_write_removes_the_stored_dir) {
    buf csv = text("a,label\n1,0\n2,1\n");
    int ok = 0;
    for (int k = 1; k <= 12; k++) {
        adm_upload *u = NULL;
        srv_error e = {0};
        cr_assert_eq(adm_upload_new(g_d, "f", "csv", &u, &e), SRV_OK, "%s", e.msg);
        adm_upload_part(u, NULL, &e);
        adm_upload_write(u, csv.p, csv.n, &e);
        g_st->fault_step = k;
        adm_dataset_rec r = {0};
        srv_code c = adm_upload_finish(u, &r, &e);
        g_st->fault_step = 0;
        if (c) show("fault", e.msg);
        adm_upload_free(&u);
        adm_dataset_rec rr = {0};
        srv_code got = adm_state_dataset_get(g_st, "f", &rr, &e);
        adm_dataset_rec_free(&rr);
        if (c == SRV_OK) {
            ok++;
            cr_assert_eq(got, SRV_OK);
            cr_assert_str_eq(root_entries(), "f");
            cr_assert_eq(adm_datasets_delete(g_d, "f", &e), SRV_OK, "%s", e.msg);
        } else {
            cr_assert_eq(got, SRV_NOT_FOUND, "step %d", k);
        }
        adm_dataset_rec_free(&r);
        cr_assert_str_eq(root_entries(), "", "step %d: %s", k, root_entries());
    }
    cr_assert_gt(ok, 0, "the fault never missed: raise the step count");
    free(csv.p);
}

typedef struct race { int i; srv_code c; char sha[65]; } race;

static void *race_one(void *arg) {
    race *r = arg;
    char body[256], name[16];
    snprintf(body, sizeof body, "a,b,label\n%d,1,0\n2,%d,1\n", r->i, r->i * 7);
    snprintf(name, sizeof name, "t%d", r->i / 2);
    buf b = {(unsigned char *)body, strlen(body)};
    adm_dataset_rec rec = {0};
    srv_error e = {0};
    r->c = upload(g_d, name, "csv", 1, NULL, &b, 3, &rec, &e);
    if (rec.sha256) snprintf(r->sha, sizeof r->sha, "%s", rec.sha256);
    adm_dataset_rec_free(&rec);
    return NULL;
}

Test(datasets, uploads_from_many_threads) {
    race rs[12];
    pthread_t th[12];
    for (int i = 0; i < 12; i++) {
        rs[i] = (race){.i = i};
        cr_assert_eq(pthread_create(&th[i], NULL, race_one, &rs[i]), 0);
    }
    for (int i = 0; i < 12; i++) pthread_join(th[i], NULL);
    for (int k = 0; k < 6; k++) { /* two uploads per name: one wins, the other is told the name is taken */
        race *a = &rs[2 * k], *b = &rs[2 * k + 1];
        cr_assert((a->c == SRV_OK && b->c == SRV_ALREADY_EXISTS) || (b->c == SRV_OK && a->c == SRV_ALREADY_EXISTS),
                  "t%d: %s / %s", k, srv_code_name(a->c), srv_code_name(b->c));
        char name[16];
        snprintf(name, sizeof name, "t%d", k);
        adm_dataset_rec r = {0};
        srv_error e = {0};
        cr_assert_eq(adm_state_dataset_get(g_st, name, &r, &e), SRV_OK);
        cr_assert_str_eq(r.sha256, a->c == SRV_OK ? a->sha : b->sha, "the record is the winner's");
        adm_dataset_rec_free(&r);
    }
    cr_assert_str_eq(root_entries(), "t0 t1 t2 t3 t4 t5");
}

/* Raw SQL on the state file, as the job queue would write it. */
static void sql(const char *q) {
    char path[400];
    snprintf(path, sizeof path, "%s/" ADM_STATE_FILE, g_dir);
    sqlite3 *db = NULL;
    cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    char *m = NULL;
    cr_assert_eq(sqlite3_exec(db, q, NULL, NULL, &m), SQLITE_OK, "%s", m ? m : "");
    sqlite3_close(db);
}

Test(datasets, delete_removes_files_and_record_unless_a_live_job_uses_it) {
    buf csv = text("a,label\n1,0\n2,1\n");
    srv_error e = {0};
    cr_assert_eq(upload(g_d, "tr", "csv", 1, NULL, &csv, 4, NULL, &e), SRV_OK);
    cr_assert_eq(upload(g_d, "va", "csv", 1, NULL, &csv, 4, NULL, &e), SRV_OK);
    sql("INSERT INTO jobs(model, dataset, val_dataset, spec_json, state, created_ms) VALUES "
        "('m', 'tr', 'va', '{}', 'QUEUED', 1), ('m', 'tr', NULL, '{}', 'RUNNING', 2), "
        "('m', 'tr', 'va', '{}', 'SUCCEEDED', 3), ('m', 'va', NULL, '{}', 'FAILED', 4)");
    cr_assert_eq(adm_datasets_delete(g_d, "tr", &e), SRV_ABORTED);
    cr_assert(strstr(e.msg, "jobs 1, 2") && strstr(e.msg, "'tr'"), "%s", e.msg);
    show("in use", e.msg);
    cr_assert_eq(adm_datasets_delete(g_d, "va", &e), SRV_ABORTED);
    cr_assert(strstr(e.msg, "job 1 ") && !strstr(e.msg, "4"), "%s", e.msg);
    cr_assert_str_eq(root_entries(), "tr va");
    sql("UPDATE jobs SET state = 'CANCELLED' WHERE id = 1");
    cr_assert_eq(adm_datasets_delete(g_d, "va", &e), SRV_OK, "%s", e.msg);
    cr_assert_eq(adm_datasets_delete(g_d, "tr", &e), SRV_ABORTED);
    sql("UPDATE jobs SET state = 'FAILED' WHERE id = 2");
    cr_assert_eq(adm_datasets_delete(g_d, "tr", &e), SRV_OK, "%s", e.msg);
    cr_assert_str_eq(root_entries(), "");
    cr_assert_eq(adm_datasets_delete(g_d, "tr", &e), SRV_NOT_FOUND);
    cr_assert(strstr(e.msg, "'tr'"), "%s", e.msg);
    adm_dataset_files f = {0};
    cr_assert_eq(adm_datasets_files(g_d, "tr", &f, &e), SRV_NOT_FOUND);
    cr_assert_eq(adm_datasets_delete(g_d, "../x", &e), SRV_INVALID_ARGUMENT);
    /* a name can be used again once deleted */
    cr_assert_eq(upload(g_d, "tr", "csv", 1, NULL, &csv, 4, NULL, &e), SRV_OK, "%s", e.msg);
    free(csv.p);
}

Test(datasets, start_removes_what_a_crash_left) {
    buf csv = text("a,label\n1,0\n2,1\n");
    srv_error e = {0};
    cr_assert_eq(upload(g_d, "kept", "csv", 1, NULL, &csv, 4, NULL, &e), SRV_OK);
    adm_upload *u = NULL; /* an upload in flight when the process died */
    cr_assert_eq(adm_upload_new(g_d, "inflight", "csv", &u, &e), SRV_OK);
    adm_upload_part(u, NULL, &e);
    adm_upload_write(u, csv.p, csv.n, &e);
    char cmd[2000];
    snprintf(cmd, sizeof cmd, "mkdir -p %s/ghost %s/.tmp-zzzzzz/sub && echo x > %s/ghost/data.csv && "
             "echo y > %s/.tmp-zzzzzz/sub/f", g_root, g_root, g_root, g_root);
    cr_assert_eq(system(cmd), 0);
    free(u->tmp); /* forget it, as a dead process would (its dir stays) */
    u->tmp = NULL;
    adm_upload_free(&u);
    cr_assert_eq(strncmp(root_entries(), ".tmp-", 5), 0, "%s", root_entries());
    adm_datasets_free(&g_d);
    g_d = open_ds(0, 0);
    cr_assert_str_eq(root_entries(), "kept");
    adm_dataset_files f = {0};
    cr_assert_eq(adm_datasets_files(g_d, "kept", &f, &e), SRV_OK, "%s", e.msg);
    unlink(f.files[0]);
    adm_dataset_files_free(&f);
    cr_assert_eq(adm_datasets_files(g_d, "kept", &f, &e), SRV_DATA_LOSS);
    cr_assert(strstr(e.msg, "missing"), "%s", e.msg);
    free(csv.p);
}

/* ---- the HTTP layer, under a real libmicrohttpd daemon ---- */

static enum MHD_Result h_access(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    return adm_datasets_access(cls, c, url, method, upload, upload_size, con_cls);
}

static void h_done(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)c, (void)toe;
    adm_datasets_done(cls, *con_cls);
    *con_cls = NULL;
}

static struct MHD_Daemon *start_http(adm_datasets *d, int *port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct MHD_Daemon *m = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL,
                                            NULL, h_access, d, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&a,
                                            MHD_OPTION_NOTIFY_COMPLETED, h_done, d, MHD_OPTION_UNESCAPE_CALLBACK,
                                            adm_url_unescape, NULL, MHD_OPTION_CONNECTION_TIMEOUT,
                                            (unsigned)10, MHD_OPTION_END);
    cr_assert_not_null(m);
    const union MHD_DaemonInfo *i = MHD_get_daemon_info(m, MHD_DAEMON_INFO_BIND_PORT);
    *port = i->port;
    return m;
}

static int connect_to(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static void send_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w <= 0) return; /* the server may close early: the reply is what counts */
        c += w;
        n -= (size_t)w;
    }
}

/* Read the reply (until the server closes or the body is complete); its status, body into out. */
static int read_reply(int fd, char *out, size_t cap) {
    size_t k = 0;
    out[0] = '\0';
    for (;;) {
        ssize_t r = recv(fd, out + k, cap - 1 - k, 0);
        if (r <= 0) break;
        k += (size_t)r;
        out[k] = '\0';
        char *he = strstr(out, "\r\n\r\n");
        const char *cl = strcasestr(out, "content-length:");
        if (he && cl && cl < he && k >= (size_t)(he + 4 - out) + strtoul(cl + 15, NULL, 10)) break;
    }
    int st = 0;
    sscanf(out, "HTTP/1.%*d %d", &st);
    char *he = strstr(out, "\r\n\r\n");
    if (he) memmove(out, he + 4, strlen(he + 4) + 1);
    return st;
}

static int http(int port, const char *method, const char *path, const char *headers, const void *body, size_t n,
                char *out, size_t cap) {
    int fd = connect_to(port);
    char head[2048], cl[64] = "";
    if (body && !(headers && (strcasestr(headers, "chunked") || strcasestr(headers, "content-length"))))
        snprintf(cl, sizeof cl, "Content-Length: %zu\r\n", n);
    snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s%s\r\n", method, path,
             headers ? headers : "", cl);
    send_all(fd, head, strlen(head));
    if (body) send_all(fd, body, n);
    int st = read_reply(fd, out, cap);
    close(fd);
    return st;
}

static buf multipart(const char *boundary, int n, const char *const *names, const buf *parts) {
    buf o = {NULL, 0};
    FILE *f = open_memstream((char **)&o.p, &o.n);
    for (int i = 0; i < n; i++) {
        fprintf(f, "--%s\r\nContent-Disposition: form-data; name=\"%s\"; filename=\"%s.bin\"\r\n"
                   "Content-Type: application/octet-stream\r\n\r\n", boundary, names[i], names[i]);
        fwrite(parts[i].p, 1, parts[i].n, f);
        fprintf(f, "\r\n");
    }
    fprintf(f, "--%s--\r\n", boundary);
    fclose(f);
    return o;
}

static int wait_root_empty(void) {
    for (int i = 0; i < 200; i++) {
        if (!*root_entries()) return 1;
        usleep(10000);
    }
    return 0;
}

Test(datasets, http_uploads_reads_and_deletes) {
    int port;
    struct MHD_Daemon *m = start_http(g_d, &port);
    char out[65536];
    buf b[2] = {idx_images(9, 3, 2, 5), idx_labels(9)};
    char want[65];
    sha_hex(b, 2, want);
    buf body = multipart("XyZ-bound", 2, IDX_PARTS, b);
    int st = http(port, "POST", "/v1/admin/datasets?name=mp&format=idx",
                  "Content-Type: multipart/form-data; boundary=XyZ-bound\r\n", body.p, body.n, out, sizeof out);
    cr_assert_eq(st, 201, "%s", out);
    cr_assert(strstr(out, "\"records\":9") && strstr(out, want) && strstr(out, "\"dataset\":\"mp\""), "%s", out);

    /* chunked raw body */
    const char *ch = "8\r\na,label\n\r\n4\r\n1,0\n\r\n4\r\n2,1\n\r\n0\r\n\r\n";
    st = http(port, "POST", "/v1/admin/datasets?name=ch&format=csv", "Transfer-Encoding: chunked\r\n", ch, strlen(ch),
              out, sizeof out);
    cr_assert_eq(st, 201, "%s", out);
    cr_assert(strstr(out, "\"records\":2"), "%s", out);

    st = http(port, "GET", "/v1/admin/datasets", NULL, NULL, 0, out, sizeof out);
    cr_assert_eq(st, 200, "%d %s", st, out);
    char *pc = strstr(out, "\"ch\""), *pm = strstr(out, "\"mp\"");
    cr_assert(pc && pm && pc < pm, "newest first: %s", out);
    st = http(port, "GET", "/v1/admin/datasets/mp", NULL, NULL, 0, out, sizeof out);
    cr_assert_eq(st, 200);
    cr_assert(strstr(out, "\"columns\":[{\"name\":\"x\",\"dtype\":\"float32\",\"shape\":[3,2]}"), "%s", out);
    cr_assert_eq(http(port, "GET", "/v1/admin/datasets/nope", NULL, NULL, 0, out, sizeof out), 404);
    cr_assert(strstr(out, "'nope'"), "%s", out);
    cr_assert_eq(http(port, "GET", "/v1/admin/datasets/mp/more", NULL, NULL, 0, out, sizeof out), 404);
    cr_assert_eq(http(port, "PUT", "/v1/admin/datasets/mp", NULL, NULL, 0, out, sizeof out), 405);
    cr_assert_eq(http(port, "DELETE", "/v1/admin/datasets", NULL, NULL, 0, out, sizeof out), 405);
    cr_assert_eq(http(port, "GET", "/v1/admin/datasets/..", NULL, NULL, 0, out, sizeof out), 400);
    /* a NUL in the path does not cut the name short (with adm_url_unescape as the daemon's unescaper) */
    cr_assert_eq(http(port, "DELETE", "/v1/admin/datasets/mp%00x", NULL, NULL, 0, out, sizeof out), 400);
    cr_assert(strstr(out, "NUL"), "%s", out);
    cr_assert_eq(http(port, "GET", "/v1/admin/datasets/m%70", NULL, NULL, 0, out, sizeof out), 200); /* %70 = 'p' */
    st = http(port, "POST", "/v1/admin/datasets?name=mp&format=csv", NULL, "a,label\n1,0\n", 12, out, sizeof out);
    cr_assert_eq(st, 409, "%s", out);
    st = http(port, "POST", "/v1/admin/datasets?name=bad&format=csv", NULL, "a,label\n1,0\nq,1\n", 16, out, sizeof out);
    cr_assert_eq(st, 400, "%s", out);
    cr_assert(strstr(out, "line 3"), "%s", out);
    st = http(port, "DELETE", "/v1/admin/datasets/mp", NULL, NULL, 0, out, sizeof out);
    cr_assert_eq(st, 200, "%s", out);
    cr_assert_str_eq(root_entries(), "ch");
    MHD_stop_daemon(m);
    free_bufs(b, 2);
    free(body.p);
}

Test(datasets, http_refusals_leave_nothing) {
    adm_datasets_free(&g_d);
    g_d = open_ds(1000, 0);
    int port;
    struct MHD_Daemon *m = start_http(g_d, &port);
    char out[65536];

    /* 413 from Content-Length alone: the reply comes before any body byte is sent */
    int fd = connect_to(port);
    const char *h = "POST /v1/admin/datasets?name=big&format=csv HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n";
    send_all(fd, h, strlen(h));
    cr_assert_eq(read_reply(fd, out, sizeof out), 413, "%s", out);
    cr_assert(strstr(out, "--max_upload_bytes") && strstr(out, "'big'"), "%s", out);
    close(fd);
    cr_assert_str_eq(root_entries(), "");

    /* a chunked body that grows past the limit */
    char *chunks = NULL;
    size_t cn = 0;
    FILE *f = open_memstream(&chunks, &cn);
    fprintf(f, "8\r\na,label\n\r\n");
    for (int i = 0; i < 300; i++) fprintf(f, "4\r\n1,0\n\r\n");
    fprintf(f, "0\r\n\r\n");
    fclose(f);
    int st = http(port, "POST", "/v1/admin/datasets?name=grow&format=csv", "Transfer-Encoding: chunked\r\n", chunks, cn,
                  out, sizeof out);
    cr_assert_eq(st, 413, "%s", out);
    cr_assert_str_eq(root_entries(), "");
    free(chunks);

    /* a multipart body over the limit, and one truncated */
    buf big[2] = {idx_images(100, 3, 3, 1), idx_labels(100)};
    buf body = multipart("bb", 2, IDX_PARTS, big);
    st = http(port, "POST", "/v1/admin/datasets?name=mbig&format=idx", "Content-Type: multipart/form-data; boundary=bb\r\n",
              body.p, body.n, out, sizeof out);
    cr_assert_eq(st, 413, "%s", out);
    cr_assert_str_eq(root_entries(), "");
    char hdr[200];
    buf small[2] = {idx_images(10, 3, 3, 1), idx_labels(10)};
    buf sb = multipart("bb", 2, IDX_PARTS, small);
    snprintf(hdr, sizeof hdr, "Content-Type: multipart/form-data; boundary=bb\r\nContent-Length: %zu\r\n", sb.n - 10);
    st = http(port, "POST", "/v1/admin/datasets?name=mtrunc2&format=idx", hdr, sb.p, sb.n - 10, out, sizeof out);
    cr_assert_eq(st, 400, "%s", out);
    show("truncated multipart", out);
    cr_assert_str_eq(root_entries(), "");

    /* a client gone mid-upload */
    fd = connect_to(port);
    h = "POST /v1/admin/datasets?name=gone&format=csv HTTP/1.1\r\nHost: x\r\nContent-Length: 900\r\n\r\na,label\n1,0\n";
    send_all(fd, h, strlen(h));
    for (int i = 0; i < 100 && !*root_entries(); i++) usleep(10000);
    cr_assert_neq(*root_entries(), '\0', "the upload's temp dir never appeared");
    close(fd);
    cr_assert(wait_root_empty(), "left behind: %s", root_entries());

    /* names and formats */
    const char *bad[] = {"..", "a%2Fb", "a/b", "a%00b", "", "%2E%2E"};
    for (int i = 0; i < 6; i++) {
        char path[600];
        snprintf(path, sizeof path, "/v1/admin/datasets?name=%s&format=csv", bad[i]);
        st = http(port, "POST", path, NULL, "a,label\n1,0\n", 12, out, sizeof out);
        cr_assert_eq(st, 400, "%s: %s", bad[i], out);
        cr_assert(strstr(out, "dataset name"), "%s", out);
        show("http name", out);
    }
    char path[600] = "/v1/admin/datasets?format=csv&name=";
    memset(path + strlen(path), 'n', 256);
    st = http(port, "POST", path, NULL, "a,label\n1,0\n", 12, out, sizeof out);
    cr_assert_eq(st, 400, "%s", out);
    cr_assert(strstr(out, "256 bytes"), "%s", out);
    st = http(port, "POST", "/v1/admin/datasets?name=ok&format=xls", NULL, "a,label\n1,0\n", 12, out, sizeof out);
    cr_assert_eq(st, 400);
    cr_assert(strstr(out, "format 'xls'"), "%s", out);
    st = http(port, "POST", "/v1/admin/datasets?name=ok&format=idx", NULL, "abc", 3, out, sizeof out);
    cr_assert_eq(st, 400);
    cr_assert(strstr(out, "multipart"), "%s", out);
    cr_assert_str_eq(root_entries(), "");
    MHD_stop_daemon(m);
    free_bufs(big, 2);
    free_bufs(small, 2);
    free(body.p);
    free(sb.p);
}
