/* test_registry.c - the model registry on real bundles: version policies, labels, failed loads, hot swap,
 * reference counting, signature.json, warm-up, batching, the poller thread; plus srv.c's helpers.
 *
 * Fixtures (registry-fixture.h): bundles written at run time into a fresh mkdtemp directory, version k of a
 * model computing y = x + k. Loading hardening, the log and explicit model control are test_loader.c's.
 */
#include "registry-fixture.h"

TestSuite(registry, .init = setup, .fini = teardown, .timeout = 60);

/* ---- srv.c ---- */

Test(registry, srv_codes_and_names) {
    cr_assert_eq(srv_code_http(SRV_OK), 200);
    cr_assert_eq(srv_code_http(SRV_INVALID_ARGUMENT), 400);
    cr_assert_eq(srv_code_http(SRV_FAILED_PRECONDITION), 400);
    cr_assert_eq(srv_code_http(SRV_OUT_OF_RANGE), 400);
    cr_assert_eq(srv_code_http(SRV_UNAUTHENTICATED), 401);
    cr_assert_eq(srv_code_http(SRV_PERMISSION_DENIED), 403);
    cr_assert_eq(srv_code_http(SRV_NOT_FOUND), 404);
    cr_assert_eq(srv_code_http(SRV_ALREADY_EXISTS), 409);
    cr_assert_eq(srv_code_http(SRV_RESOURCE_EXHAUSTED), 429);
    cr_assert_eq(srv_code_http(SRV_CANCELLED), 499);
    cr_assert_eq(srv_code_http(SRV_UNIMPLEMENTED), 501);
    cr_assert_eq(srv_code_http(SRV_UNAVAILABLE), 503);
    cr_assert_eq(srv_code_http(SRV_DEADLINE_EXCEEDED), 504);
    cr_assert_eq(srv_code_http(SRV_INTERNAL), 500);
    cr_assert_eq(srv_code_http(SRV_DATA_LOSS), 500);
    cr_assert_str_eq(srv_code_name(SRV_RESOURCE_EXHAUSTED), "RESOURCE_EXHAUSTED");
    srv_error e = {0};
    eng_err(ENG_STATUS_INVALID_MODEL, "node 'n1': bad");
    cr_assert_eq(srv_err_from_eng(&e, ENG_STATUS_INVALID_MODEL, "model 'm'"), SRV_INVALID_ARGUMENT);
    cr_assert_str_eq(e.msg, "model 'm': node 'n1': bad");
    cr_assert_eq(srv_err_from_eng(&e, ENG_STATUS_NOT_FOUND, NULL), SRV_NOT_FOUND);
    cr_assert_eq(srv_err_from_eng(&e, ENG_STATUS_UNSUPPORTED, NULL), SRV_UNIMPLEMENTED);
    cr_assert_eq(srv_err_from_eng(&e, ENG_STATUS_OUT_OF_MEMORY, NULL), SRV_RESOURCE_EXHAUSTED);
    cr_assert_eq(srv_err_from_eng(&e, ENG_STATUS_IO, NULL), SRV_INTERNAL);
    cr_assert_eq(srv_err(NULL, SRV_ABORTED, "x"), SRV_ABORTED);
    cr_assert(srv_name_valid("fashion_mnist-v2.1"));
    const char *bad[] = {"", ".", "..", "../x", "a/b", "a b", "ü", NULL};
    for (int i = 0; bad[i]; i++) cr_assert_not(srv_name_valid(bad[i]), "'%s' accepted", bad[i]);
    char longname[300];
    memset(longname, 'a', 299);
    longname[299] = 0;
    cr_assert_not(srv_name_valid(longname));
    longname[255] = 0;
    cr_assert(srv_name_valid(longname));
    int64_t t0 = srv_now_us();
    cr_assert_geq(srv_now_us(), t0);
}

Test(registry, srv_tensors) {
    srv_tensors s = {0};
    int64_t v[3] = {1, 2, 3};
    eng_tensor t = {.dtype = ENG_DTYPE_I64, .ndim = 1, .dims = {3}, .data = v};
    cr_assert_eq(srv_tensors_add_copy(&s, "a", &t), 0);
    v[0] = 9;
    cr_assert_eq(((int64_t *)s.t[0].data)[0], 1, "copy must own its data");
    eng_tensor own = {.dtype = ENG_DTYPE_F32, .ndim = 0, .data = eng_alloc(4)};
    cr_assert_eq(srv_tensors_add(&s, "b", &own), 0);
    eng_tensor empty = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {0, 4}};
    cr_assert_eq(srv_tensors_add_copy(&s, "c", &empty), 0);
    cr_assert_not_null(s.t[2].data);
    cr_assert_eq(srv_tensors_find(&s, "b"), 1);
    cr_assert_eq(srv_tensors_find(&s, "zz"), -1);
    eng_tensor huge = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {INT64_MAX / 2, 4}};
    cr_assert_eq(srv_tensors_add_copy(&s, "h", &huge), -1);
    srv_tensors_free(&s);
    cr_assert_eq(s.n, 0);
    cr_assert_null(s.names);
}

/* ---- policies ---- */

Test(registry, latest_default_serves_highest) {
    add_version("m", 1);
    add_version("m", 2);
    add_version("m", 10);
    char d[512];
    snprintf(d, sizeof d, "%s/m/.tmp-11-123", g_root); /* a half-written version: ignored */
    mkdir(d, 0755);
    snprintf(d, sizeof d, "%s/m/+12", g_root);
    mkdir(d, 0755);
    srv_model_config c = cfg_of("m", SRV_POLICY_LATEST);
    srv_registry *r = reg_with(&c, 1, NULL);
    cr_assert(srv_registry_ready(r));
    cr_assert_eq(predict_latest(r, "m"), 11.0f);
    cr_assert_eq(state_of(r, "m", 10, NULL, 0), SRV_STATE_AVAILABLE);
    srv_error err = {0};
    cr_assert_null(srv_registry_acquire(r, "m", 2, NULL, &err));
    cr_assert_eq(err.code, SRV_NOT_FOUND);
    cr_assert(strstr(err.msg, "'m'") && strstr(err.msg, "2"), "%s", err.msg);
    cr_assert_null(srv_registry_acquire(r, "nope", 0, NULL, &err));
    cr_assert_eq(err.code, SRV_NOT_FOUND);
    cr_assert(strstr(err.msg, "nope"), "%s", err.msg);
    const srv_version_info *info = NULL;
    srv_version *v = srv_registry_acquire(r, "m", 10, NULL, &err);
    cr_assert_not_null(v, "%s", err.msg);
    info = srv_version_get_info(v);
    cr_assert_eq(info->version, 10);
    cr_assert_str_eq(info->model, "m");
    cr_assert_eq(info->ninputs, 1);
    cr_assert_str_eq(info->inputs[0].name, "x");
    cr_assert_eq(info->inputs[0].dtype, ENG_DTYPE_F32);
    cr_assert_eq(info->inputs[0].ndim, 2);
    cr_assert_eq(info->inputs[0].dims[0], -1);
    cr_assert_eq(info->inputs[0].dims[1], 4);
    cr_assert_eq(info->weight_bytes, 16);
    cr_assert_null(info->labels);
    srv_version_release(v);
    srv_registry_free(&r);
    cr_assert_null(r);
}

Test(registry, latest_n_all_specific) {
    for (int v = 1; v <= 4; v++) {
        add_version("a", v);
        add_version("b", v);
        add_version("c", v);
    }
    srv_model_config c[3] = {cfg_of("a", SRV_POLICY_LATEST), cfg_of("b", SRV_POLICY_ALL),
                             cfg_of("c", SRV_POLICY_SPECIFIC)};
    c[0].latest_n = 2;
    int64_t spec[2] = {1, 3};
    c[2].versions = spec;
    c[2].nversions = 2;
    srv_registry *r = reg_with(c, 3, NULL);
    int want[3][4] = {{0, 0, 1, 1}, {1, 1, 1, 1}, {1, 0, 1, 0}};
    const char *names[3] = {"a", "b", "c"};
    for (int m = 0; m < 3; m++)
        for (int v = 1; v <= 4; v++) {
            srv_error err = {0};
            srv_version *h = srv_registry_acquire(r, names[m], v, NULL, &err);
            cr_assert_eq(h != NULL, want[m][v - 1], "model %s version %d: %s", names[m], v, err.msg);
            if (h) {
                cr_assert_eq(predict1(h, "x", "y"), 1.0f + (float)v);
                srv_version_release(h);
            }
        }
    cr_assert_eq(predict_latest(r, "c"), 4.0f); /* highest of the specific set */
    srv_version_status *s;
    int n;
    srv_error err = {0};
    cr_assert_eq(srv_registry_status(r, "b", 0, NULL, &s, &n, &err), SRV_OK);
    cr_assert_eq(n, 4);
    for (int i = 0; i < 4; i++) cr_assert_eq(s[i].version, 4 - i, "status is highest first");
    srv_status_free(s, n);
    cr_assert_eq(srv_registry_status(r, NULL, 0, NULL, &s, &n, &err), SRV_OK);
    cr_assert_eq(n, 2 + 4 + 2);
    srv_status_free(s, n);
    /* policy change: a goes to specific {1}; 1 is published before 3 and 4 are retired */
    c[0].policy = SRV_POLICY_SPECIFIC;
    int64_t one = 1;
    c[0].versions = &one;
    c[0].nversions = 1;
    cr_assert_eq(srv_registry_set_config(r, c, 3, &err), SRV_OK, "%s", err.msg);
    srv_registry_poll(r);
    cr_assert_eq(predict_latest(r, "a"), 2.0f);
    cr_assert_eq(state_of(r, "a", 4, NULL, 0), SRV_STATE_END);
    srv_registry_free(&r);
}

Test(registry, config_validation) {
    srv_registry *r = srv_registry_new(&(srv_registry_opts){0});
    srv_error err = {0};
    const char *bad[] = {"../x", "", "a/b", "..", NULL};
    for (int i = 0; bad[i]; i++) {
        srv_model_config c = {.name = (char *)bad[i], .base_path = "/tmp", .latest_n = 1};
        cr_assert_eq(srv_registry_set_config(r, &c, 1, &err), SRV_INVALID_ARGUMENT, "'%s' accepted", bad[i]);
        cr_assert(strstr(err.msg, "invalid"), "%s", err.msg);
    }
    srv_model_config dup[2] = {{.name = "m", .base_path = "/tmp"}, {.name = "m", .base_path = "/tmp"}};
    cr_assert_eq(srv_registry_set_config(r, dup, 2, &err), SRV_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "twice"), "%s", err.msg);
    srv_model_config nospec = {.name = "m", .base_path = "/tmp", .policy = SRV_POLICY_SPECIFIC};
    cr_assert_eq(srv_registry_set_config(r, &nospec, 1, &err), SRV_INVALID_ARGUMENT);
    char *ln[1] = {"../l"};
    int64_t lv[1] = {1};
    srv_model_config badlabel = {.name = "m", .base_path = "/tmp", .label_names = ln, .label_versions = lv,
                                 .nlabels = 1};
    cr_assert_eq(srv_registry_set_config(r, &badlabel, 1, &err), SRV_INVALID_ARGUMENT);
    cr_assert_null(srv_registry_acquire(r, "../x", 0, NULL, &err));
    srv_version_status *s;
    int n;
    cr_assert_eq(srv_registry_status(r, "m", 0, NULL, &s, &n, &err), SRV_NOT_FOUND);
    cr_assert(srv_registry_ready(r), "no models configured: vacuously ready");
    srv_registry_free(&r);
}

/* ---- labels ---- */

Test(registry, labels) {
    add_version("m", 1);
    add_version("m", 2);
    add_version("m", 3);
    srv_model_config c = cfg_of("m", SRV_POLICY_SPECIFIC);
    int64_t vers[2] = {1, 2};
    c.versions = vers;
    c.nversions = 2;
    srv_registry *r = reg_with(&c, 1, NULL);
    char *ln[2] = {"stable", "canary"};
    int64_t lv[2] = {1, 2};
    c.label_names = ln;
    c.label_versions = lv;
    c.nlabels = 2;
    srv_error err = {0};
    cr_assert_eq(srv_registry_set_config(r, &c, 1, &err), SRV_OK, "%s", err.msg);
    srv_version *v = srv_registry_acquire(r, "m", 0, "stable", &err);
    cr_assert_not_null(v, "%s", err.msg);
    cr_assert_eq(srv_version_get_info(v)->version, 1);
    srv_version_release(v);
    v = srv_registry_acquire(r, "m", 0, "canary", &err);
    cr_assert_not_null(v, "%s", err.msg);
    cr_assert_eq(srv_version_get_info(v)->version, 2);
    srv_version_release(v);
    cr_assert_null(srv_registry_acquire(r, "m", 0, "beta", &err));
    cr_assert_eq(err.code, SRV_NOT_FOUND);
    cr_assert(strstr(err.msg, "beta"), "%s", err.msg);
    srv_version_status *s;
    int n;
    cr_assert_eq(srv_registry_status(r, "m", 0, "canary", &s, &n, &err), SRV_OK);
    cr_assert_eq(n, 1);
    cr_assert_eq(s[0].version, 2);
    srv_status_free(s, n);
    /* version 9 is not on disk: a label on it is refused naming why, the old labels stay */
    lv[1] = 9;
    cr_assert_eq(srv_registry_set_config(r, &c, 1, &err), SRV_FAILED_PRECONDITION);
    cr_assert(strstr(err.msg, "canary") && strstr(err.msg, "version 9") && strstr(err.msg, "'m'") &&
              strstr(err.msg, "not under base path"), "%s", err.msg);
    v = srv_registry_acquire(r, "m", 0, "canary", &err);
    cr_assert_not_null(v, "%s", err.msg);
    cr_assert_eq(srv_version_get_info(v)->version, 2);
    srv_version_release(v);
    srv_registry_free(&r);
    /* allowed with allow_labels_for_unavailable; acquiring it is then UNAVAILABLE or NOT_FOUND */
    srv_registry_opts o = {.session_threads = 1, .allow_labels_for_unavailable = 1};
    c.nlabels = 0;
    r = reg_with(&c, 1, &o);
    c.nlabels = 2;
    cr_assert_eq(srv_registry_set_config(r, &c, 1, &err), SRV_OK, "%s", err.msg);
    cr_assert_null(srv_registry_acquire(r, "m", 0, "canary", &err));
    srv_registry_free(&r);
}

/* A label pins its version: one on disk but outside the policy is loaded by the call that sets the label, stays
 * loaded while the label points at it, and goes once the label moves away. Default requests keep going to the
 * policy's version. A version that fails to load is refused with its load error. Per-model calls leave other
 * models alone. */
Test(registry, label_pins_a_version_outside_the_policy) {
    add_version("m", 1);
    add_version("m", 2);
    add_version("m", 3);
    srv_model_config c = cfg_of("m", SRV_POLICY_SPECIFIC);
    int64_t vers[1] = {1};
    c.versions = vers;
    c.nversions = 1;
    add_version("o", 1);
    srv_model_config other[2] = {c, cfg_of("o", SRV_POLICY_LATEST)};
    srv_registry *r = reg_with(other, 2, NULL);
    cr_assert_eq(srv_registry_start(r, 0.05), 0);
    char msg[SRV_ERR_MAX];
    cr_assert_eq(state_of(r, "m", 3, msg, sizeof msg), SRV_STATE_UNKNOWN, "version 3 is outside the policy");
    srv_error err = {0};
    srv_version *ov = srv_registry_acquire(r, "o", 0, NULL, &err);
    cr_assert_not_null(ov, "%s", err.msg);
    cr_assert_eq(srv_registry_set_label(r, "m", "canary", 3, &err), SRV_OK, "%s", err.msg);
    cr_assert_eq(state_of(r, "m", 3, NULL, 0), SRV_STATE_AVAILABLE, "the call returns once the version is up");
    srv_version *v = srv_registry_acquire(r, "m", 0, "canary", &err);
    cr_assert_not_null(v, "%s", err.msg);
    cr_assert_eq(srv_version_get_info(v)->version, 3);
    srv_version_release(v);
    cr_assert_eq(predict_latest(r, "m"), 2.0f, "requests naming no version stay on the policy's version 1");
    usleep(300 * 1000); /* several polls: the pinned version stays */
    cr_assert_eq(state_of(r, "m", 3, NULL, 0), SRV_STATE_AVAILABLE);
    /* the other model was not touched: its version object is the same one */
    srv_version *ov2 = srv_registry_acquire(r, "o", 0, NULL, &err);
    cr_assert_eq(ov2, ov, "a per-model change reloaded another model");
    srv_version_release(ov2);
    srv_version_release(ov);
    /* moving the label away unpins it: the policy retires it */
    cr_assert_eq(srv_registry_set_label(r, "m", "canary", 1, &err), SRV_OK, "%s", err.msg);
    for (int i = 0; i < 100 && state_of(r, "m", 3, NULL, 0) == SRV_STATE_AVAILABLE; i++) usleep(20 * 1000);
    cr_assert_neq(state_of(r, "m", 3, NULL, 0), SRV_STATE_AVAILABLE, "an unpinned version outside the policy stays");
    /* a version that cannot load: refused with its load error, the label stays where it was */
    char d[512];
    vdir(d, sizeof d, "m", 4);
    mkdir(d, 0755);
    version_file("m", 4, "model.onnx", "this is not a protobuf");
    cr_assert_eq(srv_registry_set_label(r, "m", "canary", 4, &err), SRV_FAILED_PRECONDITION);
    cr_assert(strstr(err.msg, "'canary'") && strstr(err.msg, "version 4") && strstr(err.msg, "failed to load"), "%s",
              err.msg);
    v = srv_registry_acquire(r, "m", 0, "canary", &err);
    cr_assert_not_null(v, "%s", err.msg);
    cr_assert_eq(srv_version_get_info(v)->version, 1);
    srv_version_release(v);
    /* remove one model: the other stays */
    cr_assert_eq(srv_registry_remove_model(r, "o", &err), SRV_OK, "%s", err.msg);
    cr_assert_eq(srv_registry_remove_model(r, "o", &err), SRV_NOT_FOUND);
    cr_assert(!srv_registry_has_model(r, "o"));
    cr_assert_eq(predict_latest(r, "m"), 2.0f);
    srv_registry_free(&r);
}

Test(registry, label_on_new_model_waits_for_its_load) {
    add_version("m", 1);
    srv_model_config c = cfg_of("m", SRV_POLICY_LATEST);
    char *ln[1] = {"stable"};
    int64_t lv[1] = {1};
    c.label_names = ln;
    c.label_versions = lv;
    c.nlabels = 1;
    srv_registry *r = srv_registry_new(&(srv_registry_opts){.session_threads = 1});
    srv_error err = {0};
    /* the order tensord serve uses: config (labels included) first, then the poller */
    cr_assert_eq(srv_registry_set_config(r, &c, 1, &err), SRV_OK, "%s", err.msg);
    srv_version *v = srv_registry_acquire(r, "m", 0, "stable", &err);
    cr_assert_not_null(v, "%s", err.msg);
    srv_version_release(v);
    cr_assert_eq(srv_registry_start(r, 0), 0);
    /* a label on a version that never appears is still refused */
    lv[0] = 7;
    cr_assert_eq(srv_registry_set_config(r, &c, 1, &err), SRV_FAILED_PRECONDITION);
    cr_assert(strstr(err.msg, "'stable'") && strstr(err.msg, "version 7"), "%s", err.msg);
    srv_registry_free(&r);
}

/* ---- failures never disturb what serves ---- */

Test(registry, corrupt_newer_version_keeps_older_serving) {
    add_version("m", 1);
    srv_model_config c = cfg_of("m", SRV_POLICY_LATEST);
    srv_registry *r = reg_with(&c, 1, NULL);
    cr_assert_eq(predict_latest(r, "m"), 2.0f);
    char d[512];
    vdir(d, sizeof d, "m", 2);
    mkdir(d, 0755);
    version_file("m", 2, "model.onnx", "this is not a protobuf");
    srv_registry_poll(r);
    char msg[SRV_ERR_MAX];
    cr_assert_eq(state_of(r, "m", 2, msg, sizeof msg), SRV_STATE_END);
    cr_assert(strstr(msg, "'m'") && strstr(msg, "version 2") && strstr(msg, "model.onnx"), "%s", msg);
    cr_assert_eq(state_of(r, "m", 1, NULL, 0), SRV_STATE_AVAILABLE);
    cr_assert_eq(predict_latest(r, "m"), 2.0f);
    cr_assert(srv_registry_ready(r));
    srv_error err = {0};
    cr_assert_null(srv_registry_acquire(r, "m", 2, NULL, &err));
    cr_assert_eq(err.code, SRV_UNAVAILABLE, "%s", err.msg);
    srv_version_status *s;
    int n;
    cr_assert_eq(srv_registry_status(r, "m", 2, NULL, &s, &n, &err), SRV_OK);
    cr_assert_neq(s[0].error_code, SRV_OK);
    srv_status_free(s, n);
    /* not retried while unchanged: the message stays, version 1 stays */
    srv_registry_poll(r);
    cr_assert_eq(state_of(r, "m", 2, NULL, 0), SRV_STATE_END);
    cr_assert_eq(predict_latest(r, "m"), 2.0f);
    /* fixed on disk: retried, published, and then version 1 retires */
    char p[600];
    snprintf(p, sizeof p, "%s/model.onnx", d);
    unlink(p);
    write_model(p, 2, 0);
    srv_registry_poll(r);
    cr_assert_eq(state_of(r, "m", 2, msg, sizeof msg), SRV_STATE_AVAILABLE, "%s", msg);
    cr_assert_str_eq(msg, "");
    cr_assert_eq(predict_latest(r, "m"), 3.0f);
    cr_assert_eq(state_of(r, "m", 1, NULL, 0), SRV_STATE_END);
    srv_registry_free(&r);
}

Test(registry, failed_middle_version_does_not_block_newer) {
    add_version("m", 1);
    add_version("m", 3);
    char d[512];
    vdir(d, sizeof d, "m", 2);
    mkdir(d, 0755); /* no model.onnx at all */
    srv_model_config c = cfg_of("m", SRV_POLICY_ALL);
    srv_registry *r = reg_with(&c, 1, NULL);
    char msg[SRV_ERR_MAX];
    cr_assert_eq(state_of(r, "m", 2, msg, sizeof msg), SRV_STATE_END);
    cr_assert(strstr(msg, "model.onnx"), "%s", msg);
    cr_assert_eq(state_of(r, "m", 1, NULL, 0), SRV_STATE_AVAILABLE);
    cr_assert_eq(state_of(r, "m", 3, NULL, 0), SRV_STATE_AVAILABLE);
    cr_assert_eq(predict_latest(r, "m"), 4.0f);
    srv_registry_free(&r);
}

Test(registry, corrupt_newest_at_startup_serves_older) {
    add_version("m", 1);
    char d[512];
    vdir(d, sizeof d, "m", 2);
    mkdir(d, 0755);
    version_file("m", 2, "model.onnx", "garbage");
    srv_model_config c = cfg_of("m", SRV_POLICY_LATEST);
    srv_registry *r = reg_with(&c, 1, NULL);
    cr_assert_eq(state_of(r, "m", 2, NULL, 0), SRV_STATE_END);
    cr_assert_eq(predict_latest(r, "m"), 2.0f);
    srv_registry_free(&r);
}

/* ---- hot swap and references ---- */

typedef struct hammer {
    srv_registry *r;
    atomic_int stop, fails, calls;
    char msg[SRV_ERR_MAX];
} hammer;

static void *hammer_main(void *arg) {
    hammer *h = arg;
    while (!atomic_load(&h->stop)) {
        srv_error err = {0};
        srv_version *v = srv_registry_acquire(h->r, "m", 0, NULL, &err);
        if (!v) {
            if (atomic_fetch_add(&h->fails, 1) == 0) snprintf(h->msg, sizeof h->msg, "%s", err.msg);
            continue;
        }
        srv_tensors in = {0}, out = {0};
        float ones[4] = {1, 1, 1, 1};
        eng_tensor t = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {1, 4}, .data = ones};
        srv_tensors_add_copy(&in, "x", &t);
        if (srv_version_predict(v, &in, &out, 0, NULL, &err) != SRV_OK) atomic_fetch_add(&h->fails, 1);
        srv_tensors_free(&in);
        srv_tensors_free(&out);
        srv_version_release(v);
        atomic_fetch_add(&h->calls, 1);
    }
    return NULL;
}

Test(registry, hot_swap_publishes_before_retiring_and_holds_references) {
    add_version("m", 1);
    srv_model_config c = cfg_of("m", SRV_POLICY_LATEST);
    srv_registry *r = reg_with(&c, 1, NULL);
    srv_error err = {0};
    srv_version *held = srv_registry_acquire(r, "m", 1, NULL, &err);
    cr_assert_not_null(held, "%s", err.msg);
    hammer h = {.r = r};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, hammer_main, &h);
    for (int v = 2; v <= 4; v++) {
        add_version("m", v);
        srv_registry_poll(r);
        cr_assert_eq(state_of(r, "m", v, NULL, 0), SRV_STATE_AVAILABLE);
    }
    atomic_store(&h.stop, 1);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    cr_assert_eq(atomic_load(&h.fails), 0, "a request found no version during a swap: %s", h.msg);
    cr_assert_gt(atomic_load(&h.calls), 0);
    /* version 1 left the policy but a request still holds it: UNLOADING, and it still answers */
    cr_assert_eq(state_of(r, "m", 1, NULL, 0), SRV_STATE_UNLOADING);
    cr_assert_null(srv_registry_acquire(r, "m", 1, NULL, &err));
    cr_assert_eq(err.code, SRV_UNAVAILABLE);
    cr_assert_eq(predict1(held, "x", "y"), 2.0f);
    srv_version_release(held);
    cr_assert_eq(state_of(r, "m", 1, NULL, 0), SRV_STATE_END);
    cr_assert_eq(state_of(r, "m", 3, NULL, 0), SRV_STATE_END);
    cr_assert_eq(predict_latest(r, "m"), 5.0f);
    /* the serving version's directory disappears: it is no longer aspired; 3 comes back, then 4 retires */
    remove_version("m", 4);
    srv_registry_poll(r);
    cr_assert_eq(predict_latest(r, "m"), 4.0f);
    cr_assert_eq(state_of(r, "m", 4, NULL, 0), SRV_STATE_END);
    cr_assert_eq(state_of(r, "m", 3, NULL, 0), SRV_STATE_AVAILABLE);
    srv_registry_free(&r);
}

typedef struct late_release {
    srv_version *v;
    atomic_int released;
} late_release;

static void *late_release_main(void *arg) {
    late_release *l = arg;
    usleep(200 * 1000);
    cr_assert_eq(predict1(l->v, "x", "y"), 2.0f, "a held version still serves while the registry shuts down");
    atomic_store(&l->released, 1);
    srv_version_release(l->v);
    return NULL;
}

Test(registry, free_waits_for_held_references) {
    add_version("m", 1);
    srv_model_config c = cfg_of("m", SRV_POLICY_LATEST);
    srv_registry *r = reg_with(&c, 1, NULL);
    srv_error err = {0};
    late_release l = {0};
    l.v = srv_registry_acquire(r, "m", 0, NULL, &err);
    cr_assert_not_null(l.v, "%s", err.msg);
    pthread_t t;
    pthread_create(&t, NULL, late_release_main, &l);
    srv_registry_free(&r);
    cr_assert_eq(atomic_load(&l.released), 1, "srv_registry_free returned before the last reference was dropped");
    pthread_join(t, NULL);
}

/* ---- signature.json ---- */

static void add_version2(const char *model, int64_t v) {
    char d[512], p[600];
    snprintf(d, sizeof d, "%s/%s", g_root, model);
    mkdir(d, 0755);
    vdir(d, sizeof d, model, v);
    cr_assert_eq(mkdir(d, 0755), 0);
    snprintf(p, sizeof p, "%s/model.onnx", d);
    write_model(p, (float)v, 1);
}

static srv_code predict_with(srv_version *v, const char *n1, eng_dtype dt1, int64_t cols1, const char *n2,
                             srv_tensors *out, srv_error *err) {
    srv_tensors in = {0};
    int64_t buf[8] = {0};
    float ones[4] = {1, 1, 1, 1};
    eng_tensor t1 = {.dtype = dt1, .ndim = 2, .dims = {1, cols1}, .data = dt1 == ENG_DTYPE_F32 ? (void *)ones : buf};
    eng_tensor t2 = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {1, 4}, .data = ones};
    srv_tensors_add_copy(&in, n1, &t1);
    if (n2) srv_tensors_add_copy(&in, n2, &t2);
    srv_code c = srv_version_predict(v, &in, out, 0, NULL, err);
    srv_tensors_free(&in);
    return c;
}

Test(registry, signature_aliases_labels_and_input_checks) {
    add_version2("m", 1);
    version_file("m", 1, "signature.json",
                 "{\"signature_defs\": {\"serving_default\": {\"inputs\": {\"left\": \"a\", \"right\": {\"name\": \"b\","
                 " \"dtype\": \"float32\", \"shape\": [-1, 4]}}, \"outputs\": {\"sum\": \"y\"},"
                 " \"method_name\": \"tensorflow/serving/predict\"}}, \"labels_file\": \"labels.txt\","
                 " \"precision\": \"fp32\"}");
    version_file("m", 1, "labels.txt", "cat\ndog\r\nbird\n\nfish\n");
    srv_model_config c = cfg_of("m", SRV_POLICY_LATEST);
    srv_registry *r = reg_with(&c, 1, NULL);
    char msg[SRV_ERR_MAX];
    cr_assert_eq(state_of(r, "m", 1, msg, sizeof msg), SRV_STATE_AVAILABLE, "%s", msg);
    srv_error err = {0};
    srv_version *v = srv_registry_acquire(r, "m", 0, NULL, &err);
    cr_assert_not_null(v, "%s", err.msg);
    const srv_version_info *info = srv_version_get_info(v);
    cr_assert_eq(info->ninputs, 2);
    cr_assert_str_eq(info->inputs[0].name, "left");
    cr_assert_str_eq(info->inputs[0].onnx_name, "a");
    cr_assert_str_eq(info->inputs[1].name, "right");
    cr_assert_str_eq(info->outputs[0].name, "sum");
    cr_assert_eq(info->nlabels, 5);
    cr_assert_str_eq(info->labels[1], "dog");
    cr_assert_str_eq(info->labels[3], "");
    cr_assert_str_eq(info->labels[4], "fish");
    srv_tensors out = {0};
    cr_assert_eq(predict_with(v, "right", ENG_DTYPE_F32, 4, "left", &out, &err), SRV_OK, "%s", err.msg);
    cr_assert_str_eq(out.names[0], "sum");
    cr_assert_eq(((float *)out.t[0].data)[3], 3.0f);
    srv_tensors_free(&out);
    cr_assert_eq(predict_with(v, "a", ENG_DTYPE_F32, 4, "right", &out, &err), SRV_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "unknown input 'a'") && strstr(err.msg, "'left', 'right'") && strstr(err.msg, "'m'"),
              "%s", err.msg);
    cr_assert_eq(predict_with(v, "left", ENG_DTYPE_F32, 4, NULL, &out, &err), SRV_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "missing input 'right'"), "%s", err.msg);
    cr_assert_eq(predict_with(v, "left", ENG_DTYPE_I64, 4, "right", &out, &err), SRV_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "input 'left'") && strstr(err.msg, "float32") && strstr(err.msg, "int64"), "%s",
              err.msg);
    cr_assert_eq(predict_with(v, "left", ENG_DTYPE_F32, 3, "right", &out, &err), SRV_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "expected shape [-1,4], got [1,3]"), "%s", err.msg);
    cr_assert_eq(out.n, 0);
    /* deadline already passed */
    srv_tensors in = {0};
    float ones[4] = {1, 1, 1, 1};
    eng_tensor t = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {1, 4}, .data = ones};
    srv_tensors_add_copy(&in, "left", &t);
    srv_tensors_add_copy(&in, "right", &t);
    cr_assert_eq(srv_version_predict(v, &in, &out, srv_now_us() - 1, NULL, &err), SRV_DEADLINE_EXCEEDED);
    srv_tensors_free(&in);
    srv_version_release(v);
    srv_registry_free(&r);
}

Test(registry, signature_errors_name_model_version_file) {
    static const struct { const char *json, *want; } cases[] = {
        {"{\"signature_def\": {}}", "unknown key 'signature_def'"},
        {"[1]", "top level must be a JSON object"},
        {"{\"labels\": [1]}", "labels[0] must be a string"},
        {"{\"labels\": [], \"labels_file\": \"l.txt\"}", "not both"},
        {"{\"labels_file\": \"../../etc/passwd\"}", "plain file name"},
        {"{\"labels_file\": \"missing.txt\"}", "cannot read labels_file"},
        {"{\"precision\": \"fp8\"}", "precision must be one of"},
        {"{\"signature_defs\": {\"other\": {}}}", "only serving_default"},
        {"{\"signature_defs\": {\"serving_default\": {\"inputs\": {\"in\": \"nope\"}}}}", "not a model input"},
        {"{\"signature_defs\": {\"serving_default\": {\"inputs\": {\"in\": \"a\"}}}}", "'b' is required"},
        {"{\"signature_defs\": {\"serving_default\": {\"inputs\": {\"p\": \"a\", \"q\": \"a\"}}}}", "already mapped"},
        {"{\"signature_defs\": {\"serving_default\": {\"outputs\": {\"o\": \"zz\"}}}}", "not a model output"},
        {"{\"signature_defs\": {\"serving_default\": {\"inputs\": {\"p\": {\"name\": \"a\", \"dtype\": \"int64\"},"
         " \"q\": \"b\"}}}}", "dtype int64"},
        {"{\"signature_defs\": {\"serving_default\": {\"inputs\": {\"p\": {\"name\": \"a\", \"shape\": [2, 5]},"
         " \"q\": \"b\"}}}}", "shape [2,5]"},
        {"{\"signature_defs\": {\"serving_default\": {\"inputs\": {\"p\": {\"nam\": \"a\"}}}}}", "unknown key 'nam'"},
        {"{\"labels\": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"
         "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}", "deeper than"},
        {"{\"labels\": ", "invalid JSON"},
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n; i++) {
        add_version2("m", i + 1);
        version_file("m", i + 1, "signature.json", cases[i].json);
    }
    srv_model_config c = cfg_of("m", SRV_POLICY_ALL);
    srv_registry *r = reg_with(&c, 1, NULL);
    for (int i = 0; i < n; i++) {
        char msg[SRV_ERR_MAX], ver[32];
        snprintf(ver, sizeof ver, "version %d:", i + 1);
        cr_assert_eq(state_of(r, "m", i + 1, msg, sizeof msg), SRV_STATE_END, "case %d loaded: %s", i, cases[i].json);
        cr_assert(strstr(msg, cases[i].want) && strstr(msg, "model 'm'") && strstr(msg, ver) &&
                      strstr(msg, "signature.json"),
                  "case %d: want '%s' in: %s", i, cases[i].want, msg);
    }
    cr_assert_not(srv_registry_ready(r));
    srv_error err = {0};
    cr_assert_null(srv_registry_acquire(r, "m", 0, NULL, &err));
    cr_assert_eq(err.code, SRV_UNAVAILABLE, "%s", err.msg);
    srv_registry_free(&r);
}

/* ---- warm-up ---- */

Test(registry, warmup_replays_requests_and_a_bad_one_fails_the_load) {
    add_version("m", 1);
    add_version("m", 2);
    char d[512], p[700];
    for (int v = 1; v <= 2; v++) {
        vdir(d, sizeof d, "m", v);
        snprintf(p, sizeof p, "%s/assets.extra", d);
        mkdir(p, 0755);
    }
    version_file("m", 1, "assets.extra/warmup.jsonl",
                 "{\"instances\": [[1, 2, 3, 4]]}\n\n  \n{\"inputs\": {\"x\": [[1, 2, 3, 4], [5, 6, 7, 8]]}}\n");
    version_file("m", 2, "assets.extra/warmup.jsonl", "{\"instances\": [[1, 2, 3, 4]]}\n{\"instances\": [[1, 2]]}\n");
    srv_model_config c = cfg_of("m", SRV_POLICY_ALL);
    srv_registry *r = reg_with(&c, 1, NULL);
    char msg[SRV_ERR_MAX];
    cr_assert_eq(state_of(r, "m", 1, msg, sizeof msg), SRV_STATE_AVAILABLE, "%s", msg);
    cr_assert_eq(state_of(r, "m", 2, msg, sizeof msg), SRV_STATE_END);
    cr_assert(strstr(msg, "warmup.jsonl line 2") && strstr(msg, "version 2"), "%s", msg);
    srv_registry_free(&r);
}

/* ---- batching and metrics ---- */

typedef struct batch_worker {
    srv_registry *r;
    int bad;
} batch_worker;

static void *batch_main(void *arg) {
    batch_worker *w = arg;
    for (int i = 0; i < 20; i++) {
        srv_error err = {0};
        srv_version *v = srv_registry_acquire(w->r, "m", 0, NULL, &err);
        if (!v) {
            w->bad++;
            continue;
        }
        srv_tensors in = {0}, out = {0};
        float x[8] = {(float)i, 0, 0, 0, 1, 1, 1, 1};
        eng_tensor t = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {2, 4}, .data = x};
        srv_tensors_add_copy(&in, "x", &t);
        if (srv_version_predict(v, &in, &out, srv_now_us() + 10 * 1000 * 1000, NULL, &err) != SRV_OK || out.n != 1 ||
            out.t[0].dims[0] != 2 || ((float *)out.t[0].data)[0] != (float)i + 1 || ((float *)out.t[0].data)[4] != 2)
            w->bad++;
        srv_tensors_free(&in);
        srv_tensors_free(&out);
        srv_version_release(v);
    }
    return NULL;
}

Test(registry, batching_and_metrics) {
    add_version("m", 1);
    srv_batch_opts bo;
    srv_batch_opts_default(&bo);
    bo.max_batch_size = 8;
    bo.num_batch_threads = 2;
    srv_metrics *mt = srv_metrics_new();
    srv_registry_opts o = {.session_threads = 1, .batching = &bo, .metrics = mt};
    srv_model_config c = cfg_of("m", SRV_POLICY_LATEST);
    srv_registry *r = reg_with(&c, 1, &o);
    batch_worker w[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (batch_worker){.r = r};
        pthread_create(&th[i], NULL, batch_main, &w[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        cr_assert_eq(w[i].bad, 0, "worker %d got wrong answers through the batcher", i);
    }
    add_version("m", 2);
    srv_registry_poll(r);
    size_t len;
    char *text = srv_metrics_render(mt, &len);
    cr_assert_not_null(text);
    cr_assert(strstr(text, "tensord_batch_size"), "%s", text);
    cr_assert(strstr(text, "event=\"load\""), "%s", text);
    cr_assert(strstr(text, "event=\"unload\""), "%s", text);
    cr_assert(strstr(text, "tensord_model_load_latency_ms"), "%s", text);
    cr_assert(strstr(text, "tensord_model_weights_bytes{model=\"m\",version=\"2\"} 16"), "%s", text);
    cr_assert_null(strstr(text, "tensord_model_weights_bytes{model=\"m\",version=\"1\"}"), "%s", text);
    cr_assert(strstr(text, "tensord_model_version_state{model=\"m\",version=\"2\"} 30"), "%s", text);
    free(text);
    srv_registry_free(&r);
    srv_metrics_free(&mt);
}

/* ---- the poller thread, and loads that do not block requests ---- */

Test(registry, poller_picks_up_new_versions_and_stops_promptly) {
    srv_model_config c = cfg_of("m", SRV_POLICY_LATEST);
    srv_registry *r = srv_registry_new(&(srv_registry_opts){.session_threads = 1});
    srv_error err = {0};
    cr_assert_eq(srv_registry_set_config(r, &c, 1, &err), SRV_OK, "%s", err.msg);
    cr_assert_eq(srv_registry_start(r, 0.02), 0);
    cr_assert_not(srv_registry_ready(r));
    add_version("m", 1);
    int64_t t0 = srv_now_us();
    while (!srv_registry_ready(r) && srv_now_us() - t0 < 10 * 1000 * 1000) usleep(5000);
    cr_assert(srv_registry_ready(r), "the poller did not load version 1");
    srv_registry_free(&r);
    /* a long poll period must not delay shutdown */
    r = srv_registry_new(&(srv_registry_opts){.session_threads = 1});
    cr_assert_eq(srv_registry_set_config(r, &c, 1, &err), SRV_OK, "%s", err.msg);
    cr_assert_eq(srv_registry_start(r, 3600), 0);
    cr_assert(srv_registry_ready(r), "the first scan is synchronous");
    t0 = srv_now_us();
    srv_registry_free(&r);
    cr_assert_lt(srv_now_us() - t0, 2 * 1000 * 1000, "srv_registry_free waited for the poll period");
}

static void *poll_main(void *arg) {
    poll_arg *p = arg;
    srv_registry_poll(p->r);
    atomic_store(&p->done, 1);
    return NULL;
}

Test(registry, a_slow_load_does_not_block_other_models) {
    add_version("fast", 1);
    add_version("slow", 1);
    srv_model_config c[2] = {cfg_of("fast", SRV_POLICY_LATEST), cfg_of("slow", SRV_POLICY_LATEST)};
    srv_registry *r = srv_registry_new(&(srv_registry_opts){.session_threads = 1});
    srv_error err = {0};
    cr_assert_eq(srv_registry_set_config(r, c, 1, &err), SRV_OK, "%s", err.msg); /* only "fast" for now */
    srv_registry_poll(r);
    /* slow: a warm-up file big enough that loading takes a while */
    char d[512], p[700];
    vdir(d, sizeof d, "slow", 1);
    snprintf(p, sizeof p, "%s/assets.extra", d);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/assets.extra/warmup.jsonl", d);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f);
    for (int rec = 0; rec < 1000; rec++) {
        fputs("{\"instances\": [", f);
        for (int row = 0; row < 64; row++) fprintf(f, "%s[1.5, 2.5, 3.5, 4.5]", row ? ", " : "");
        fputs("]}\n", f);
    }
    fclose(f);
    cr_assert_eq(srv_registry_set_config(r, c, 2, &err), SRV_OK, "%s", err.msg);
    poll_arg pa = {.r = r};
    pthread_t t;
    pthread_create(&t, NULL, poll_main, &pa);
    int seen_loading = 0, served = 0;
    while (!atomic_load(&pa.done)) {
        if (state_of(r, "slow", 1, NULL, 0) == SRV_STATE_LOADING) {
            seen_loading = 1;
            if (predict_latest(r, "fast") == 2.0f) served++;
        }
    }
    pthread_join(t, NULL);
    cr_assert(seen_loading, "the slow load finished before it could be observed");
    cr_assert_gt(served, 0);
    cr_assert_eq(state_of(r, "slow", 1, NULL, 0), SRV_STATE_AVAILABLE);
    srv_registry_free(&r);
}
