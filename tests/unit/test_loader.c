/* test_loader.c - loading versions: files that are not regular (FIFOs, directories) and symlinks that leave the
 * version directory fail only their version; a load past its deadline fails only that version and its late
 * result is discarded; a newer version never waits for an older load; every load, failure, retirement and bad
 * base path is logged once (text and JSON); explicit model control (srv_registry_load_model / _unload_model).
 *
 * Fixtures: registry-fixture.h (version k of a model computes y = x + k).
 */
#include "registry-fixture.h"

TestSuite(loader, .init = setup, .fini = teardown, .timeout = 90);

/* srv_registry_load_model on a thread: done is 1 when it failed (as expected when the model is unloaded). */
static void *load_main(void *arg) {
    poll_arg *p = arg;
    srv_error err = {0};
    atomic_store(&p->done, srv_registry_load_model(p->r, "m", &err) != SRV_OK);
    return NULL;
}

#define SLOW_D 512
#define SLOW_LAYERS 48

/* <root>/<model>/<v>/ (written aside, then renamed into place): x [N,512] -> 48 MatMuls with one [512,512]
 * weight -> y, and a warm-up file of `records` requests of 64 rows (about 800M multiply-adds each, some 30 ms on
 * one core): a load that takes seconds, cancellable between records. */
static void add_slow_version(const char *model, int64_t v, int records) {
    char d[512], p[700], final[512];
    snprintf(d, sizeof d, "%s/%s", g_root, model);
    mkdir(d, 0755);
    vdir(final, sizeof final, model, v);
    snprintf(d, sizeof d, "%s/%s/.tmp-%lld", g_root, model, (long long)v); /* built aside, then renamed in */
    cr_assert_eq(mkdir(d, 0755), 0, "mkdir %s", d);
    eng_graph *g = eng_graph_new();
    g->ir_version = 8;
    g->opset = 17;
    int x = eng_graph_add_value(g, "x"), w = eng_graph_add_value(g, "W"), h = x;
    eng_tensor *t = malloc(sizeof *t);
    *t = (eng_tensor){.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {SLOW_D, SLOW_D},
                      .data = eng_alloc(SLOW_D * SLOW_D * sizeof(float))};
    for (int i = 0; i < SLOW_D * SLOW_D; i++) ((float *)t->data)[i] = 1.0f / SLOW_D;
    eng_value_set_init(g, w, t);
    g->values[w].dtype = ENG_DTYPE_F32;
    g->values[w].ndim = 2;
    g->values[w].dims[0] = g->values[w].dims[1] = SLOW_D;
    for (int l = 0; l < SLOW_LAYERS; l++) {
        char nm[32];
        snprintf(nm, sizeof nm, l == SLOW_LAYERS - 1 ? "y" : "h%d", l);
        int o = eng_graph_add_value(g, nm), ins[2] = {h, w};
        snprintf(nm, sizeof nm, "mm%d", l);
        eng_graph_add_node(g, nm, "MatMul", "", ins, 2, &o, 1);
        h = o;
    }
    int io[2] = {x, h};
    for (int i = 0; i < 2; i++) {
        eng_value *val = &g->values[io[i]];
        val->dtype = ENG_DTYPE_F32;
        val->ndim = 2;
        val->dims[0] = -1;
        val->dims[1] = SLOW_D;
    }
    g->inputs = malloc(sizeof(int));
    g->inputs[0] = x;
    g->ninputs = 1;
    g->outputs = malloc(sizeof(int));
    g->outputs[0] = h;
    g->noutputs = 1;
    snprintf(p, sizeof p, "%s/model.onnx", d);
    cr_assert_eq(eng_onnx_save_file(g, p, 0), ENG_STATUS_OK, "save %s: %s", p, eng_last_error());
    eng_graph_free(&g);
    snprintf(p, sizeof p, "%s/assets.extra", d);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/assets.extra/warmup.jsonl", d);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f);
    for (int rec = 0; rec < records; rec++) {
        fputs("{\"instances\": [", f);
        for (int row = 0; row < 64; row++) {
            fputs(row ? ", [" : "[", f);
            for (int k = 0; k < SLOW_D; k++) fputs(k ? ",1" : "1", f);
            fputs("]", f);
        }
        fputs("]}\n", f);
    }
    fclose(f);
    cr_assert_eq(rename(d, final), 0, "rename %s", d);
}

static void version_fifo(const char *model, int64_t v, const char *name) {
    char d[512], p[700];
    vdir(d, sizeof d, model, v);
    snprintf(p, sizeof p, "%s/%s", d, name);
    unlink(p);
    cr_assert_eq(mkfifo(p, 0644), 0, "mkfifo %s", p);
}

static double secs_since(int64_t t0) { return (double)(srv_now_us() - t0) / 1e6; }

Test(loader, a_load_past_its_deadline_fails_only_that_version) {
    add_version("m", 1);
    srv_metrics *mt = srv_metrics_new();
    srv_registry_opts o = {.session_threads = 1, .load_timeout_s = 0.3, .metrics = mt};
    srv_model_config c = cfg_of("m", SRV_POLICY_LATEST);
    srv_registry *r = reg_with(&c, 1, &o);
    cr_assert_eq(predict_latest(r, "m"), 2.0f);
    add_slow_version("m", 2, 100);
    int64_t t0 = srv_now_us();
    srv_registry_poll(r);
    double took = secs_since(t0);
    char msg[SRV_ERR_MAX];
    cr_assert_eq(state_of(r, "m", 2, msg, sizeof msg), SRV_STATE_END, "%s", msg);
    cr_assert(strstr(msg, "--model_load_timeout_seconds=0.3") && strstr(msg, "version 2"), "%s", msg);
    cr_assert_lt(took, 3.0, "srv_registry_poll waited %.2f s for a load with a 0.3 s deadline", took);
    srv_version_status *st;
    int n;
    srv_error err = {0};
    cr_assert_eq(srv_registry_status(r, "m", 2, NULL, &st, &n, &err), SRV_OK);
    cr_assert_eq(st[0].error_code, SRV_DEADLINE_EXCEEDED);
    srv_status_free(st, n);
    cr_assert_eq(state_of(r, "m", 1, NULL, 0), SRV_STATE_AVAILABLE);
    cr_assert_eq(predict_latest(r, "m"), 2.0f);
    /* not retried while unchanged */
    srv_registry_poll(r);
    cr_assert_eq(state_of(r, "m", 2, NULL, 0), SRV_STATE_END);
    char *text = srv_metrics_render(mt, &(size_t){0});
    cr_assert(strstr(text, "tensord_model_swap_count{model=\"m\",version=\"2\",event=\"load_failed\"} 1"), "%s", text);
    cr_assert(strstr(text, "tensord_model_version_state{model=\"m\",version=\"1\"} 30"), "%s", text);
    cr_assert_null(strstr(text, "tensord_model_version_state{model=\"m\",version=\"2\"}"), "%s", text);
    free(text);
    srv_registry_free(&r); /* the abandoned loader stops at its next warm-up record; nothing leaks */
    srv_metrics_free(&mt);
}

Test(loader, fifos_and_other_non_regular_files_fail_only_their_version) {
    /* 1: model.onnx is a FIFO (no writer: opening it blocking would hang the loader forever) */
    add_version("m", 1);
    version_fifo("m", 1, "model.onnx");
    /* 2: signature.json, 3: the warm-up file, 4: external data, 5: the labels file are FIFOs */
    add_version("m", 2);
    version_fifo("m", 2, "signature.json");
    add_version("m", 3);
    char d[512], p[700];
    vdir(d, sizeof d, "m", 3);
    snprintf(p, sizeof p, "%s/assets.extra", d);
    mkdir(p, 0755);
    version_fifo("m", 3, "assets.extra/warmup.jsonl");
    g_external = 8;
    add_version("m", 4);
    g_external = 0;
    version_fifo("m", 4, "model.onnx.data");
    add_version("m", 5);
    version_file("m", 5, "signature.json", "{\"labels_file\": \"labels.txt\"}");
    version_fifo("m", 5, "labels.txt");
    add_version("m", 6); /* good */
    vdir(d, sizeof d, "m", 7); /* 7: model.onnx is a directory */
    mkdir(d, 0755);
    snprintf(p, sizeof p, "%s/model.onnx", d);
    mkdir(p, 0755);
    srv_model_config c = cfg_of("m", SRV_POLICY_ALL);
    int64_t t0 = srv_now_us();
    srv_registry *r = reg_with(&c, 1, NULL);
    cr_assert_lt(secs_since(t0), 10.0, "loading took %.1f s", secs_since(t0));
    static const char *const what[] = {"", "model.onnx", "signature.json", "warmup.jsonl", "model.onnx.data",
                                       "labels.txt"};
    char msg[SRV_ERR_MAX];
    for (int v = 1; v <= 5; v++) {
        cr_assert_eq(state_of(r, "m", v, msg, sizeof msg), SRV_STATE_END, "version %d: %s", v, msg);
        cr_assert(strstr(msg, "is a FIFO, not a regular file") && strstr(msg, what[v]) && strstr(msg, "model 'm'"),
                  "version %d: %s", v, msg);
    }
    cr_assert_eq(state_of(r, "m", 7, msg, sizeof msg), SRV_STATE_END);
    cr_assert(strstr(msg, "is a directory, not a regular file"), "%s", msg);
    cr_assert_eq(state_of(r, "m", 6, msg, sizeof msg), SRV_STATE_AVAILABLE, "%s", msg);
    cr_assert_eq(predict_latest(r, "m"), 7.0f);
    srv_registry_free(&r);
    /* latest policy: the FIFO version fails at once, and a newer good version then loads behind it */
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s/m'", g_root);
    cr_assert_eq(system(cmd), 0);
    add_version("m", 1);
    version_fifo("m", 1, "model.onnx");
    c = cfg_of("m", SRV_POLICY_LATEST);
    r = reg_with(&c, 1, NULL);
    cr_assert_eq(state_of(r, "m", 1, msg, sizeof msg), SRV_STATE_END);
    cr_assert(strstr(msg, "FIFO"), "%s", msg);
    add_version("m", 2);
    srv_registry_poll(r);
    cr_assert_eq(state_of(r, "m", 2, msg, sizeof msg), SRV_STATE_AVAILABLE, "%s", msg);
    cr_assert_eq(predict_latest(r, "m"), 3.0f);
    srv_registry_free(&r);
}

Test(loader, symlinks_must_stay_inside_the_version_dir) {
    char d[512], p[700], q[700];
    snprintf(p, sizeof p, "%s/outside.onnx", g_root);
    write_model(p, 9, 0);
    snprintf(q, sizeof q, "%s/outside.json", g_root);
    write_text(q, "{}");
    /* 1: model.onnx -> a model outside the version directory */
    vdir(d, sizeof d, "m", 1);
    mkdir(g_root, 0755);
    snprintf(d, sizeof d, "%s/m", g_root);
    mkdir(d, 0755);
    vdir(d, sizeof d, "m", 1);
    mkdir(d, 0755);
    char link[800];
    snprintf(link, sizeof link, "%s/model.onnx", d);
    cr_assert_eq(symlink(p, link), 0);
    /* 2: model.onnx -> real.onnx in the same directory (allowed); signature.json -> outside (refused) in 3 */
    vdir(d, sizeof d, "m", 2);
    mkdir(d, 0755);
    snprintf(link, sizeof link, "%s/real.onnx", d);
    write_model(link, 2, 0);
    snprintf(link, sizeof link, "%s/model.onnx", d);
    cr_assert_eq(symlink("real.onnx", link), 0);
    add_version("m", 3);
    vdir(d, sizeof d, "m", 3);
    snprintf(link, sizeof link, "%s/signature.json", d);
    cr_assert_eq(symlink(q, link), 0);
    srv_model_config c = cfg_of("m", SRV_POLICY_ALL);
    srv_registry *r = reg_with(&c, 1, NULL);
    char msg[SRV_ERR_MAX];
    cr_assert_eq(state_of(r, "m", 1, msg, sizeof msg), SRV_STATE_END);
    cr_assert(strstr(msg, "outside the directory") && strstr(msg, "outside.onnx") && strstr(msg, "version 1"), "%s",
              msg);
    cr_assert_eq(state_of(r, "m", 3, msg, sizeof msg), SRV_STATE_END);
    cr_assert(strstr(msg, "outside the directory") && strstr(msg, "signature.json"), "%s", msg);
    cr_assert_eq(state_of(r, "m", 2, msg, sizeof msg), SRV_STATE_AVAILABLE, "%s", msg);
    srv_error err = {0};
    srv_version *v = srv_registry_acquire(r, "m", 2, NULL, &err);
    cr_assert_not_null(v, "%s", err.msg);
    cr_assert_eq(predict1(v, "x", "y"), 3.0f);
    srv_version_release(v);
    srv_registry_free(&r);
}

Test(loader, a_newer_version_never_waits_for_a_slow_older_load) {
    add_version("m", 1);
    srv_model_config c = cfg_of("m", SRV_POLICY_LATEST);
    srv_registry *r = srv_registry_new(&(srv_registry_opts){.session_threads = 1, .load_timeout_s = 60});
    srv_error err = {0};
    cr_assert_eq(srv_registry_set_config(r, &c, 1, &err), SRV_OK, "%s", err.msg);
    cr_assert_eq(srv_registry_start(r, 0.02), 0);
    cr_assert_eq(predict_latest(r, "m"), 2.0f);
    add_slow_version("m", 2, 1000); /* some 30 s of warm-up */
    int64_t t0 = srv_now_us();
    while (state_of(r, "m", 2, NULL, 0) != SRV_STATE_LOADING && secs_since(t0) < 10) usleep(2000);
    cr_assert_eq(state_of(r, "m", 2, NULL, 0), SRV_STATE_LOADING);
    add_version("m", 3);
    t0 = srv_now_us();
    while (state_of(r, "m", 3, NULL, 0) != SRV_STATE_AVAILABLE && secs_since(t0) < 10) usleep(2000);
    double took = secs_since(t0);
    char msg[SRV_ERR_MAX];
    cr_assert_eq(state_of(r, "m", 3, msg, sizeof msg), SRV_STATE_AVAILABLE, "after %.1f s: %s", took, msg);
    cr_assert_lt(took, 5.0, "version 3 waited %.1f s behind version 2's load", took);
    cr_assert_eq(predict_latest(r, "m"), 4.0f);
    /* version 2 left the policy while it loaded: cancelled; version 1 retired after 3 was published */
    t0 = srv_now_us();
    while (state_of(r, "m", 1, NULL, 0) != SRV_STATE_END && secs_since(t0) < 10) usleep(2000);
    cr_assert_eq(state_of(r, "m", 1, NULL, 0), SRV_STATE_END);
    cr_assert_eq(state_of(r, "m", 2, msg, sizeof msg), SRV_STATE_END);
    cr_assert(strstr(msg, "cancelled"), "%s", msg);
    t0 = srv_now_us();
    srv_registry_free(&r);
    cr_assert_lt(secs_since(t0), 4.0, "srv_registry_free waited %.1f s for the cancelled load", secs_since(t0));
}

/* ---- the log ---- */

/* stderr into <root>/stderr.log until log_end, which returns its text (malloc'd). */
static int log_begin(void) {
    char p[600];
    snprintf(p, sizeof p, "%s/stderr.log", g_root);
    fflush(stderr);
    int saved = dup(2), fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);
    return saved;
}

static char *log_end(int saved) {
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char p[600];
    snprintf(p, sizeof p, "%s/stderr.log", g_root);
    FILE *f = fopen(p, "rb");
    cr_assert_not_null(f);
    char *buf = calloc(1, 1 << 20);
    size_t n = fread(buf, 1, (1 << 20) - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static int count_of(const char *text, const char *needle) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
    return n;
}

Test(loader, loads_failures_retirements_and_a_bad_base_path_are_logged_once) {
    char base[600];
    snprintf(base, sizeof base, "%s/mistyped", g_root);
    srv_model_config c = {.name = "m", .base_path = base, .policy = SRV_POLICY_LATEST, .latest_n = 1};
    int saved = log_begin();
    srv_registry *r = srv_registry_new(&(srv_registry_opts){.session_threads = 1});
    srv_error err = {0};
    cr_assert_eq(srv_registry_set_config(r, &c, 1, &err), SRV_OK, "%s", err.msg);
    for (int i = 0; i < 3; i++) srv_registry_poll(r);
    char *t1 = log_end(saved);
    cr_assert_eq(count_of(t1, "base_path model=m:"), 1, "%s", t1);
    cr_assert(strstr(t1, "error: base_path model=m: cannot read base path '") && strstr(t1, base) &&
                  strstr(t1, "No such file or directory"),
              "%s", t1);
    free(t1);
    /* it appears, empty: "can be read again", then one "no version" line */
    saved = log_begin();
    mkdir(base, 0755);
    for (int i = 0; i < 2; i++) srv_registry_poll(r);
    /* a version loads, a bad one fails, then a good one replaces the first (which is retired) */
    char d[700], p[800];
    snprintf(d, sizeof d, "%s/1", base);
    mkdir(d, 0755);
    snprintf(p, sizeof p, "%s/model.onnx", d);
    write_model(p, 1, 0);
    srv_registry_poll(r);
    snprintf(d, sizeof d, "%s/2", base);
    mkdir(d, 0755);
    snprintf(p, sizeof p, "%s/model.onnx", d);
    write_text(p, "not a protobuf");
    srv_registry_poll(r);
    srv_registry_poll(r);
    snprintf(d, sizeof d, "%s/3", base);
    mkdir(d, 0755);
    snprintf(p, sizeof p, "%s/model.onnx", d);
    write_model(p, 3, 0);
    srv_registry_poll(r);
    char *t2 = log_end(saved);
    cr_assert_eq(count_of(t2, "base_path model=m: base path '"), 1, "%s", t2);
    cr_assert(strstr(t2, "can be read again"), "%s", t2);
    cr_assert_eq(count_of(t2, "no_versions model=m:"), 1, "%s", t2);
    cr_assert_eq(count_of(t2, "tensord load model=m version=1: loaded in "), 1, "%s", t2);
    cr_assert(strstr(t2, "weight bytes"), "%s", t2);
    cr_assert_eq(count_of(t2, "error: load_failed model=m version=2: "), 1, "%s", t2);
    cr_assert(strstr(t2, "model.onnx"), "%s", t2);
    cr_assert_eq(count_of(t2, "tensord load model=m version=3:"), 1, "%s", t2);
    cr_assert_eq(count_of(t2, "tensord retire model=m version=1: retired (left the version policy)"), 1, "%s", t2);
    free(t2);
    /* --log_format=json: every line parses, with event, model, version and msg */
    srv_log_set_json(1);
    saved = log_begin();
    snprintf(d, sizeof d, "%s/4", base);
    mkdir(d, 0755);
    snprintf(p, sizeof p, "%s/model.onnx", d);
    write_text(p, "garbage");
    srv_registry_poll(r);
    snprintf(d, sizeof d, "%s/5", base);
    mkdir(d, 0755);
    snprintf(p, sizeof p, "%s/model.onnx", d);
    write_model(p, 5, 0);
    srv_registry_poll(r);
    srv_registry_free(&r);
    char *t3 = log_end(saved);
    srv_log_set_json(0);
    int lines = 0, failed = 0, loaded = 0, retired = 0;
    for (char *line = strtok(t3, "\n"); line; line = strtok(NULL, "\n"), lines++) {
        cJSON *j = cJSON_Parse(line);
        cr_assert_not_null(j, "not JSON: %s", line);
        const cJSON *ev = cJSON_GetObjectItem(j, "event"), *md = cJSON_GetObjectItem(j, "model"),
                    *vs = cJSON_GetObjectItem(j, "version"), *msg = cJSON_GetObjectItem(j, "msg");
        cr_assert(cJSON_IsString(ev) && cJSON_IsString(msg) && *msg->valuestring, "%s", line);
        cr_assert(cJSON_IsString(md) && strcmp(md->valuestring, "m") == 0 && cJSON_IsNumber(vs), "%s", line);
        failed += strcmp(ev->valuestring, "load_failed") == 0 && vs->valueint == 4;
        loaded += strcmp(ev->valuestring, "load") == 0 && vs->valueint == 5;
        retired += strcmp(ev->valuestring, "retire") == 0 && vs->valueint == 3;
        cJSON_Delete(j);
    }
    cr_assert(lines > 0 && failed == 1 && loaded == 1 && retired == 1, "%d %d %d %d", lines, failed, loaded, retired);
    free(t3);
}

/* ---- explicit model control ---- */

static char *metrics_text(srv_metrics *mt) { return srv_metrics_render(mt, &(size_t){0}); }

Test(loader, explicit_control_loads_and_unloads_on_request) {
    add_version("m", 1);
    add_version("other", 1);
    srv_metrics *mt = srv_metrics_new();
    srv_model_config c[2] = {cfg_of("m", SRV_POLICY_LATEST), cfg_of("other", SRV_POLICY_LATEST)};
    srv_registry *r = srv_registry_new(&(srv_registry_opts){.session_threads = 1, .explicit_control = 1, .metrics = mt});
    srv_error err = {0};
    cr_assert_eq(srv_registry_set_config(r, c, 2, &err), SRV_OK, "%s", err.msg);
    cr_assert_eq(srv_registry_start(r, 0.02), 0); /* every configured model loads at start-up */
    cr_assert(srv_registry_ready(r));
    /* no poller: a new version on disk changes nothing, not even after an explicit poll */
    add_version("m", 2);
    usleep(100 * 1000);
    srv_registry_poll(r);
    cr_assert_eq(predict_latest(r, "m"), 2.0f);
    cr_assert_eq(state_of(r, "m", 2, NULL, 0), SRV_STATE_UNKNOWN);
    /* load: re-reads the base path, publishes 2, then retires 1 */
    cr_assert_eq(srv_registry_load_model(r, "m", &err), SRV_OK, "%s", err.msg);
    cr_assert_eq(predict_latest(r, "m"), 3.0f);
    cr_assert_eq(state_of(r, "m", 1, NULL, 0), SRV_STATE_END);
    char *t = metrics_text(mt);
    cr_assert(strstr(t, "tensord_model_version_state{model=\"m\",version=\"2\"} 30"), "%s", t);
    cr_assert(strstr(t, "tensord_model_swap_count{model=\"m\",version=\"1\",event=\"unload\"} 1"), "%s", t);
    free(t);
    /* unload: nothing serves; polls leave it alone; the other model is untouched */
    cr_assert_eq(srv_registry_unload_model(r, "m", &err), SRV_OK, "%s", err.msg);
    cr_assert_null(srv_registry_acquire(r, "m", 0, NULL, &err));
    cr_assert_eq(state_of(r, "m", 2, NULL, 0), SRV_STATE_END);
    srv_registry_poll(r);
    cr_assert_null(srv_registry_acquire(r, "m", 0, NULL, &err));
    cr_assert_not(srv_registry_ready(r));
    cr_assert_eq(predict_latest(r, "other"), 2.0f);
    t = metrics_text(mt);
    cr_assert_null(strstr(t, "tensord_model_version_state{model=\"m\""), "%s", t);
    cr_assert(strstr(t, "tensord_model_swap_count{model=\"m\",version=\"2\",event=\"unload\"} 1"), "%s", t);
    free(t);
    /* load again: back */
    cr_assert_eq(srv_registry_load_model(r, "m", &err), SRV_OK, "%s", err.msg);
    cr_assert_eq(predict_latest(r, "m"), 3.0f);
    t = metrics_text(mt);
    cr_assert(strstr(t, "tensord_model_swap_count{model=\"m\",version=\"2\",event=\"load\"} 2"), "%s", t);
    free(t);
    /* a failed load answers with the reason; what served keeps serving; a fixed version loads on request */
    char d[512];
    vdir(d, sizeof d, "m", 3);
    mkdir(d, 0755);
    version_file("m", 3, "model.onnx", "not a protobuf");
    cr_assert_neq(srv_registry_load_model(r, "m", &err), SRV_OK);
    cr_assert(strstr(err.msg, "model 'm' version 3") && strstr(err.msg, "model.onnx"), "%s", err.msg);
    cr_assert_eq(predict_latest(r, "m"), 3.0f);
    cr_assert_neq(srv_registry_load_model(r, "m", &err), SRV_OK, "a failed version is retried on request");
    remove_version("m", 3);
    add_version("m", 3);
    cr_assert_eq(srv_registry_load_model(r, "m", &err), SRV_OK, "%s", err.msg);
    cr_assert_eq(predict_latest(r, "m"), 4.0f);
    /* unknown models, bad base paths */
    cr_assert_eq(srv_registry_load_model(r, "nope", &err), SRV_NOT_FOUND);
    cr_assert(strstr(err.msg, "'nope'"), "%s", err.msg);
    cr_assert_eq(srv_registry_unload_model(r, "nope", &err), SRV_NOT_FOUND);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s/other'", g_root);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(srv_registry_load_model(r, "other", &err), SRV_NOT_FOUND);
    cr_assert(strstr(err.msg, "base path") && strstr(err.msg, "other"), "%s", err.msg);
    cr_assert_eq(predict_latest(r, "other"), 2.0f, "an unreadable base path keeps what serves");
    srv_registry_free(&r);
    /* explicit control off: refused */
    r = reg_with(c, 1, NULL);
    cr_assert_eq(srv_registry_load_model(r, "m", &err), SRV_UNAVAILABLE);
    cr_assert(strstr(err.msg, "--model_control_mode=explicit"), "%s", err.msg);
    cr_assert_eq(srv_registry_unload_model(r, "m", &err), SRV_UNAVAILABLE);
    cr_assert_eq(predict_latest(r, "m"), 4.0f);
    srv_registry_free(&r);
    srv_metrics_free(&mt);
}

Test(loader, explicit_unload_cancels_a_load_in_flight) {
    add_version("m", 1);
    srv_model_config c = cfg_of("m", SRV_POLICY_LATEST);
    srv_registry *r = srv_registry_new(&(srv_registry_opts){.session_threads = 1, .explicit_control = 1});
    srv_error err = {0};
    cr_assert_eq(srv_registry_set_config(r, &c, 1, &err), SRV_OK, "%s", err.msg);
    cr_assert_eq(srv_registry_start(r, 0), 0);
    add_slow_version("m", 2, 1000);
    poll_arg pa = {.r = r};
    pthread_t t;
    pthread_create(&t, NULL, load_main, &pa);
    int64_t t0 = srv_now_us();
    while (state_of(r, "m", 2, NULL, 0) != SRV_STATE_LOADING && secs_since(t0) < 10) usleep(2000);
    cr_assert_eq(state_of(r, "m", 2, NULL, 0), SRV_STATE_LOADING);
    cr_assert_eq(predict_latest(r, "m"), 2.0f, "version 1 serves while 2 loads");
    cr_assert_eq(srv_registry_unload_model(r, "m", &err), SRV_OK, "%s", err.msg);
    pthread_join(t, NULL);
    cr_assert_lt(secs_since(t0), 8.0, "the load request did not end with the unload");
    cr_assert_eq(atomic_load(&pa.done), 1);
    char msg[SRV_ERR_MAX];
    cr_assert_eq(state_of(r, "m", 2, msg, sizeof msg), SRV_STATE_END);
    cr_assert(strstr(msg, "unloaded"), "%s", msg);
    cr_assert_null(srv_registry_acquire(r, "m", 0, NULL, &err));
    srv_registry_free(&r);
}
