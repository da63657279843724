/* test_bundle.c - the model bundle layout (engine/bundle.c): the one version-name rule, scanning a base path,
 * version paths, staging and publishing a new version, and the signature.json text tensord writes.
 *
 * Each test works in a fresh mkdtemp directory. Checked: names the server and the trainer must both ignore
 * ("007", "+3", ".tmp-3-12", 20 digits, ...); a scan lists only version-named directories, highest first;
 * publish leaves <n> complete and no temp directory; a version that appears while one is staged (even an
 * empty directory, which a plain rename(2) would replace) is neither replaced nor touched, and the failure
 * names it.
 */
#include <criterion/criterion.h>

#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/bundle.h"
#include "engine/ir/file-io.h"

static char g_base[256];

static void setup(void) {
    snprintf(g_base, sizeof g_base, "/tmp/tensord-bundle-XXXXXX");
    cr_assert_not_null(mkdtemp(g_base));
}

static void teardown(void) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_base);
    if (system(cmd) != 0) {}
}

TestSuite(bundle, .init = setup, .fini = teardown, .timeout = 30);

static void mkdir_in(const char *name) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", g_base, name);
    cr_assert_eq(mkdir(p, 0755), 0, "mkdir %s", p);
}

static void write_in(const char *dir, const char *name, const char *text) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    cr_assert_not_null(f, "cannot write %s", p);
    fputs(text, f);
    cr_assert_eq(fclose(f), 0);
}

/* The whole file as a string (caller frees), NULL when absent. */
static char *slurp(const char *dir, const char *name) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    uint8_t *buf;
    size_t len;
    if (eng_file_read(p, 1 << 20, &buf, &len) != ENG_STATUS_OK) return NULL;
    char *s = malloc(len + 1);
    memcpy(s, buf, len);
    s[len] = 0;
    free(buf);
    return s;
}

static int count_tmp_dirs(const char *dir) {
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) n += strncmp(e->d_name, ".tmp-", 5) == 0;
    closedir(d);
    return n;
}

/* ---- the name rule ---- */

Test(bundle, version_names) {
    static const struct { const char *s; int64_t v; } good[] = {
        {"1", 1}, {"42", 42}, {"10", 10}, {"9223372036854775807", INT64_MAX}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        int64_t v = -1;
        cr_assert(eng_bundle_parse_version(good[i].s, &v), "'%s' rejected", good[i].s);
        cr_assert_eq(v, good[i].v, "'%s' -> %lld", good[i].s, (long long)v);
    }
    const char *bad[] = {"0",   "007", "01",  "+3",        "-1",        "3.bak", ".tmp-3-12", "",
                         " 1",  "1 ",  "1a",  "1.0",       ".train-3",  "logs",  "0x10",
                         "12345678901234567890" /* 20 digits: over INT64_MAX */,
                         "9223372036854775808" /* INT64_MAX + 1 */};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t v = 77;
        cr_assert_not(eng_bundle_parse_version(bad[i], &v), "'%s' accepted", bad[i]);
        cr_assert_eq(v, 77, "'%s' wrote *version on rejection", bad[i]);
    }
    int64_t v;
    cr_assert_not(eng_bundle_parse_version(NULL, &v));
}

/* ---- scanning ---- */

Test(bundle, scan_lists_version_dirs_highest_first) {
    const char *dirs[] = {"1", "42", "3", "007", "0", "+3", "3.bak", ".tmp-9-12", ".train-43", "logs", "10"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) mkdir_in(dirs[i]);
    write_in(g_base, "99", "a file, not a version directory");
    int64_t *v = NULL;
    int n = -1;
    cr_assert_eq(eng_bundle_scan(g_base, &v, &n), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(n, 4);
    int64_t want[] = {42, 10, 3, 1};
    for (int i = 0; i < 4; i++) cr_assert_eq(v[i], want[i], "v[%d] = %lld", i, (long long)v[i]);
    free(v);
    int64_t hi = -1;
    cr_assert_eq(eng_bundle_latest(g_base, &hi), ENG_STATUS_OK);
    cr_assert_eq(hi, 42);
}

Test(bundle, scan_empty_and_missing_base) {
    mkdir_in("007"); /* only a name that is not a version */
    int64_t *v = (int64_t *)1;
    int n = -1;
    cr_assert_eq(eng_bundle_scan(g_base, &v, &n), ENG_STATUS_OK);
    cr_assert_eq(n, 0);
    cr_assert_null(v);
    int64_t hi = -1;
    cr_assert_eq(eng_bundle_latest(g_base, &hi), ENG_STATUS_OK);
    cr_assert_eq(hi, 0);

    char missing[400];
    snprintf(missing, sizeof missing, "%s/nope", g_base);
    cr_assert_eq(eng_bundle_scan(missing, &v, &n), ENG_STATUS_NOT_FOUND);
    cr_assert(strstr(eng_last_error(), missing), "%s", eng_last_error());
    cr_assert_eq(eng_bundle_latest(missing, &hi), ENG_STATUS_NOT_FOUND);
}

Test(bundle, version_paths) {
    char p[64];
    cr_assert_eq(eng_bundle_path(p, sizeof p, "/m", 12, NULL), ENG_STATUS_OK);
    cr_assert_str_eq(p, "/m/12");
    cr_assert_eq(eng_bundle_path(p, sizeof p, "/m", 12, ENG_BUNDLE_MODEL_FILE), ENG_STATUS_OK);
    cr_assert_str_eq(p, "/m/12/model.onnx");
    char small[8];
    cr_assert_eq(eng_bundle_path(small, sizeof small, "/models/m", 3, NULL), ENG_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(eng_last_error(), "/models/m"), "%s", eng_last_error());
    cr_assert_str_eq(small, "");
}

/* ---- staging and publishing ---- */

Test(bundle, stage_then_publish) {
    mkdir_in("1");
    char tmp[512], want[512], dst[512];
    cr_assert_eq(eng_bundle_stage(g_base, 2, tmp, sizeof tmp), ENG_STATUS_OK, "%s", eng_last_error());
    snprintf(want, sizeof want, "%s/.tmp-2-%ld", g_base, (long)getpid());
    cr_assert_str_eq(tmp, want);
    struct stat sb;
    cr_assert(stat(tmp, &sb) == 0 && S_ISDIR(sb.st_mode));
    int64_t hi;
    cr_assert_eq(eng_bundle_latest(g_base, &hi), ENG_STATUS_OK);
    cr_assert_eq(hi, 1, "a staged version must not be visible");
    write_in(tmp, ENG_BUNDLE_MODEL_FILE, "onnx bytes");
    write_in(tmp, ENG_BUNDLE_SIGNATURE_FILE, "{}");

    cr_assert_eq(eng_bundle_publish(g_base, 2, tmp), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_neq(access(tmp, F_OK), 0, "temp directory left behind");
    cr_assert_eq(count_tmp_dirs(g_base), 0);
    snprintf(dst, sizeof dst, "%s/2", g_base);
    char *m = slurp(dst, ENG_BUNDLE_MODEL_FILE), *s = slurp(dst, ENG_BUNDLE_SIGNATURE_FILE);
    cr_assert(m && strcmp(m, "onnx bytes") == 0, "%s", m ? m : "(absent)");
    cr_assert(s && strcmp(s, "{}") == 0, "%s", s ? s : "(absent)");
    free(m);
    free(s);
    cr_assert_eq(eng_bundle_latest(g_base, &hi), ENG_STATUS_OK);
    cr_assert_eq(hi, 2);

    /* a stale temp dir of this process (an earlier failed attempt) is replaced by a fresh, empty one */
    cr_assert_eq(eng_bundle_stage(g_base, 3, tmp, sizeof tmp), ENG_STATUS_OK);
    write_in(tmp, "junk", "x");
    cr_assert_eq(eng_bundle_stage(g_base, 3, tmp, sizeof tmp), ENG_STATUS_OK);
    char *junk = slurp(tmp, "junk");
    cr_assert_null(junk, "stale file kept in the new temp dir");
    eng_file_remove_dir(tmp);
    cr_assert_eq(count_tmp_dirs(g_base), 0);
}

Test(bundle, stage_refuses_existing_version) {
    mkdir_in("3");
    char dst[512], tmp[512];
    snprintf(dst, sizeof dst, "%s/3", g_base);
    write_in(dst, ENG_BUNDLE_MODEL_FILE, "old");
    cr_assert_eq(eng_bundle_stage(g_base, 3, tmp, sizeof tmp), ENG_STATUS_IO);
    cr_assert(strstr(eng_last_error(), dst) && strstr(eng_last_error(), "exists"), "%s", eng_last_error());
    cr_assert_eq(count_tmp_dirs(g_base), 0);
    char *m = slurp(dst, ENG_BUNDLE_MODEL_FILE);
    cr_assert(m && strcmp(m, "old") == 0);
    free(m);
    cr_assert_eq(eng_bundle_stage(g_base, 0, tmp, sizeof tmp), ENG_STATUS_INVALID_ARGUMENT);
}

/* Another writer publishes <n> between our stage and our publish: ours fails, theirs stays as it was. */
Test(bundle, publish_never_replaces) {
    char tmp[512], dst[512];
    cr_assert_eq(eng_bundle_stage(g_base, 4, tmp, sizeof tmp), ENG_STATUS_OK);
    write_in(tmp, ENG_BUNDLE_MODEL_FILE, "new");
    mkdir_in("4");
    snprintf(dst, sizeof dst, "%s/4", g_base);
    write_in(dst, ENG_BUNDLE_MODEL_FILE, "theirs");
    cr_assert_eq(eng_bundle_publish(g_base, 4, tmp), ENG_STATUS_IO);
    cr_assert(strstr(eng_last_error(), dst) && strstr(eng_last_error(), "exists"), "%s", eng_last_error());
    char *m = slurp(dst, ENG_BUNDLE_MODEL_FILE);
    cr_assert(m && strcmp(m, "theirs") == 0, "existing version clobbered: %s", m ? m : "(absent)");
    free(m);
    cr_assert_eq(access(tmp, F_OK), 0, "the caller removes the temp dir, publish does not");
    eng_file_remove_dir(tmp);
    cr_assert_eq(count_tmp_dirs(g_base), 0);

    /* an empty directory counts too: rename(2) alone would silently replace it */
    cr_assert_eq(eng_bundle_stage(g_base, 5, tmp, sizeof tmp), ENG_STATUS_OK);
    write_in(tmp, ENG_BUNDLE_MODEL_FILE, "new");
    mkdir_in("5");
    snprintf(dst, sizeof dst, "%s/5", g_base);
    cr_assert_eq(eng_bundle_publish(g_base, 5, tmp), ENG_STATUS_IO);
    cr_assert(strstr(eng_last_error(), dst), "%s", eng_last_error());
    char *gone = slurp(dst, ENG_BUNDLE_MODEL_FILE);
    cr_assert_null(gone, "empty version directory was replaced");
    eng_file_remove_dir(tmp);
}

/* ---- signature.json ---- */

static cJSON *parse_or_fail(const char *s) {
    cJSON *j = cJSON_Parse(s);
    cr_assert_not_null(j, "not JSON: %s", s);
    return j;
}

Test(bundle, sig_derive_carries_base_and_sets_preprocessing) {
    mkdir_in("1");
    char v1[512];
    snprintf(v1, sizeof v1, "%s/1", g_base);
    write_in(v1, ENG_BUNDLE_SIGNATURE_FILE,
             "{\"signature_defs\": {\"serving_default\": {\"inputs\": {\"img\": \"x\"}}}, \"preprocessing\": \"old\"}");
    char *s = NULL;
    cr_assert_eq(eng_bundle_sig_derive(g_base, 1, "{\"x\": \"uint8 / 255\"}", &s), ENG_STATUS_OK, "%s",
                 eng_last_error());
    cJSON *j = parse_or_fail(s);
    const cJSON *in = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(j,
                                          "signature_defs"), "serving_default"), "inputs"), "img");
    cr_assert(cJSON_IsString(in) && strcmp(in->valuestring, "x") == 0, "%s", s);
    const cJSON *pre = cJSON_GetObjectItem(j, "preprocessing");
    cr_assert(cJSON_IsObject(pre), "%s", s);
    cr_assert_str_eq(cJSON_GetObjectItem(pre, "x")->valuestring, "uint8 / 255");
    cJSON_Delete(j);
    free(s);

    /* no signature.json in the base: only the preprocessing; text that is not JSON stays a string */
    mkdir_in("2");
    cr_assert_eq(eng_bundle_sig_derive(g_base, 2, "not json", &s), ENG_STATUS_OK, "%s", eng_last_error());
    j = parse_or_fail(s);
    cr_assert_eq(cJSON_GetArraySize(j), 1, "%s", s);
    cr_assert_str_eq(cJSON_GetObjectItem(j, "preprocessing")->valuestring, "not json");
    cJSON_Delete(j);
    free(s);

    /* a base signature.json that is not an object is an error naming it */
    mkdir_in("3");
    char v3[512];
    snprintf(v3, sizeof v3, "%s/3", g_base);
    write_in(v3, ENG_BUNDLE_SIGNATURE_FILE, "[1, 2]");
    cr_assert_eq(eng_bundle_sig_derive(g_base, 3, "{}", &s), ENG_STATUS_INVALID_ARGUMENT);
    cr_assert_null(s);
    cr_assert(strstr(eng_last_error(), v3), "%s", eng_last_error());
}

Test(bundle, sig_from_graph) {
    eng_graph *g = eng_graph_new();
    int x = eng_graph_add_value(g, "x"), y = eng_graph_add_value(g, "probs");
    g->values[x].dtype = ENG_DTYPE_F32;
    g->values[x].ndim = 2;
    g->values[x].dims[0] = -1;
    g->values[x].dims[1] = 4;
    g->values[y].dtype = ENG_DTYPE_F32;
    g->values[y].ndim = 2;
    g->values[y].dims[0] = -1;
    g->values[y].dims[1] = 3;
    g->inputs = malloc(sizeof(int));
    g->inputs[0] = x;
    g->ninputs = 1;
    g->outputs = malloc(sizeof(int));
    g->outputs[0] = y;
    g->noutputs = 1;
    char *s = eng_bundle_sig_from_graph(g);
    cr_assert_not_null(s);
    cJSON *j = parse_or_fail(s);
    const cJSON *sd = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "signature_defs"), "serving_default");
    const cJSON *in = cJSON_GetObjectItem(cJSON_GetObjectItem(sd, "inputs"), "x");
    const cJSON *out = cJSON_GetObjectItem(cJSON_GetObjectItem(sd, "outputs"), "probs");
    cr_assert(in && out, "%s", s);
    cr_assert_str_eq(cJSON_GetObjectItem(in, "name")->valuestring, "x");
    const cJSON *shape = cJSON_GetObjectItem(out, "shape");
    cr_assert_eq(cJSON_GetArraySize(shape), 2, "%s", s);
    cr_assert_eq(cJSON_GetArrayItem(shape, 0)->valueint, -1);
    cr_assert_eq(cJSON_GetArrayItem(shape, 1)->valueint, 3);
    cr_assert_str_eq(cJSON_GetObjectItem(sd, "method_name")->valuestring, "tensorflow/serving/predict");
    cJSON_Delete(j);
    free(s);
    eng_graph_free(&g);
}
