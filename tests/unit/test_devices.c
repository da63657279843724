/* test_devices.c - serving on devices (server/device.c and its use in config.c, version.c, metrics.c): device specs
 * checked when a config is read (syntax, kinds, index range: refused naming the model and the device) and resolved
 * when a version loads (a device that is not there fails that load with the reason), the instance count a device
 * list gives, instances placed round-robin over the list, a version that does not fit the device failing its load,
 * and the device-memory gauge. Runs on "sim", the engine's host-memory test device (2 devices by default).
 *
 * Fixtures: registry-fixture.h (version k of a model computes y = x + k).
 */
#include "registry-fixture.h"

#include "server/textproto.c"
#include "server/config.c"

TestSuite(devices, .init = setup, .fini = teardown, .timeout = 60);

static int cuda_here(void) { return krn_cuda_unavailable_reason()[0] == 0; }

Test(devices, spec_check_accepts_lists_and_defers_missing_devices) {
    srv_error err = {0};
    int n = -1;
    cr_assert_eq(srv_device_spec_check("sim:0,sim:1", "--device", &n, &err), SRV_OK, "%s", err.msg);
    cr_assert_eq(n, 2);
    cr_assert_eq(srv_device_spec_check(" cpu , sim:1 ", "--device", &n, &err), SRV_OK, "%s", err.msg);
    cr_assert_eq(n, 2);
    cr_assert_eq(srv_device_spec_check(NULL, "--device", &n, &err), SRV_OK, "NULL is auto: %s", err.msg);
    cr_assert_eq(n, 1);
    /* CUDA that is not there is the load's business, not the config's */
    cr_assert_eq(srv_device_spec_check("cuda:0,cuda:1", "--device", &n, &err), SRV_OK, "%s", err.msg);
    const char *bad[][2] = {{"tpu:0", "unknown kind"}, {"sim:2", "0..1"}, {"sim:0,", "empty entry"},
                            {",", "empty entry"}, {"cuda:x", "cuda:x"}, {"sim:-1", "sim:-1"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(srv_device_spec_check(bad[i][0], "model 'm'", NULL, &err), SRV_INVALID_ARGUMENT, "%s accepted",
                     bad[i][0]);
        cr_assert(strstr(err.msg, "model 'm'") && strstr(err.msg, bad[i][1]), "%s: %s", bad[i][0], err.msg);
    }
    char many[400] = "sim:0";
    for (int i = 1; i <= SRV_DEVICE_MAX; i++) strcat(many, ",sim:1");
    cr_assert_eq(srv_device_spec_check(many, "--device", NULL, &err), SRV_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "more than 64"), "%s", err.msg);
}

Test(devices, resolve_names_and_missing_cuda) {
    srv_device d[SRV_DEVICE_MAX];
    int n = 0;
    srv_error err = {0};
    cr_assert_eq(srv_device_resolve("sim:1,cpu,sim:0", d, &n, &err), SRV_OK, "%s", err.msg);
    cr_assert_eq(n, 3);
    cr_assert_str_eq(d[0].name, "sim:1");
    cr_assert(!d[0].host && d[0].backend && d[0].index == 1);
    cr_assert_str_eq(d[1].name, "cpu");
    cr_assert(d[1].host && !d[1].backend);
    cr_assert_str_eq(d[2].name, "sim:0");
    if (cuda_here()) return;
    cr_assert_eq(srv_device_resolve("auto", d, &n, &err), SRV_OK, "%s", err.msg);
    cr_assert(n == 1 && d[0].host && strcmp(d[0].name, "cpu") == 0);
    cr_assert_eq(srv_device_resolve("sim:0,cuda:0", d, &n, &err), SRV_UNAVAILABLE);
    cr_assert(strstr(err.msg, "cuda:0") && strstr(err.msg, "not available"), "%s", err.msg);
    cr_assert_eq(n, 0);
}

Test(devices, instance_count_rule) {
    srv_device d[SRV_DEVICE_MAX];
    int n = 0;
    srv_error err = {0};
    cr_assert_eq(srv_device_resolve("cpu", d, &n, &err), SRV_OK);
    cr_assert_eq(srv_device_instances(0, 6, d, n), 6, "the CPU alone keeps the cores / threads default");
    cr_assert_eq(srv_device_instances(2, 6, d, n), 2);
    cr_assert_eq(srv_device_resolve("sim:0,sim:1", d, &n, &err), SRV_OK);
    cr_assert_eq(srv_device_instances(0, 6, d, n), 2, "one per listed device");
    cr_assert_eq(srv_device_instances(5, 6, d, n), 5, "a set count is spread over them");
    cr_assert_eq(srv_device_resolve("sim:0", d, &n, &err), SRV_OK);
    cr_assert_eq(srv_device_instances(0, 6, d, n), 1);
}

static srv_code load_cfg(const char *text, srv_model_config **cfgs, int *n, srv_error *err) {
    char p[400];
    snprintf(p, sizeof p, "%s/models.config", g_root);
    write_text(p, text);
    return srv_config_load_models(p, cfgs, n, err);
}

static void free_cfgs(srv_model_config *cfgs, int n) {
    for (int i = 0; i < n; i++) srv_model_config_free(&cfgs[i]);
    free(cfgs);
}

Test(devices, config_device_text_json_and_errors) {
    srv_model_config *cfgs = NULL;
    int n = 0;
    srv_error err = {0};
    cr_assert_eq(load_cfg("model_config_list { config { name: 'a' base_path: '/x' device: 'sim:0,sim:1' }\n"
                          "  config { name: 'b' base_path: '/y' device: 'cpu' device: 'sim:1' }\n"
                          "  config { name: 'c' base_path: '/z' } }\n", &cfgs, &n, &err), SRV_OK, "%s", err.msg);
    cr_assert_eq(n, 3);
    cr_assert_str_eq(cfgs[0].device, "sim:0,sim:1");
    cr_assert_str_eq(cfgs[1].device, "cpu,sim:1");
    cr_assert_null(cfgs[2].device, "no device: the server's --device");
    srv_model_config cp;
    cr_assert_eq(srv_model_config_copy(&cp, &cfgs[0]), 0);
    cr_assert_str_eq(cp.device, "sim:0,sim:1");
    srv_model_config_free(&cp);
    free_cfgs(cfgs, n);
    cr_assert_eq(load_cfg("{\"model_config_list\": {\"config\": [{\"name\": \"j\", \"base_path\": \"/x\", "
                          "\"device\": [\"sim:1\", \"sim:0\"]}, {\"name\": \"k\", \"base_path\": \"/x\", "
                          "\"device\": \"cuda:0\"}]}}", &cfgs, &n, &err), SRV_OK, "%s", err.msg);
    cr_assert_str_eq(cfgs[0].device, "sim:1,sim:0");
    cr_assert_str_eq(cfgs[1].device, "cuda:0");
    free_cfgs(cfgs, n);
    cr_assert_eq(load_cfg("model_config_list { config { name: 'bad' base_path: '/x' device: 'sim:0,tpu:3' } }", &cfgs,
                          &n, &err), SRV_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "model 'bad'") && strstr(err.msg, "tpu:3"), "%s", err.msg);
    cr_assert_eq(load_cfg("model_config_list { config { name: 'bad2' base_path: '/x' device { x: 1 } } }", &cfgs, &n,
                          &err), SRV_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "model 'bad2'") && strstr(err.msg, "device"), "%s", err.msg);
    /* the registry checks configs from every source (admin API, gRPC reload) too */
    srv_model_config c = cfg_of("m", SRV_POLICY_LATEST);
    c.device = "sim:9";
    srv_registry *r = srv_registry_new(NULL);
    cr_assert_eq(srv_registry_set_config(r, &c, 1, &err), SRV_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "model 'm'") && strstr(err.msg, "sim:9"), "%s", err.msg);
    srv_registry_free(&r);
}

Test(devices, device_flag_env_and_default) {
    srv_options o;
    srv_error err = {0};
    unsetenv("TENSORD_DEVICE");
    char *def[] = {"serve", "--model_base_path=/x"};
    cr_assert_eq(srv_options_parse(2, def, &o, &err), SRV_OK, "%s", err.msg);
    cr_assert_str_eq(o.device, "auto");
    srv_options_free(&o);
    setenv("TENSORD_DEVICE", "sim:1", 1);
    cr_assert_eq(srv_options_parse(2, def, &o, &err), SRV_OK, "%s", err.msg);
    cr_assert_str_eq(o.device, "sim:1");
    srv_options_free(&o);
    char *flag[] = {"serve", "--model_base_path=/x", "--device", "sim:0,sim:1"};
    cr_assert_eq(srv_options_parse(4, flag, &o, &err), SRV_OK, "%s", err.msg);
    cr_assert_str_eq(o.device, "sim:0,sim:1", "the flag wins over the env");
    srv_options_free(&o);
    unsetenv("TENSORD_DEVICE");
    char *bad[] = {"serve", "--model_base_path=/x", "--device=quantum:0"};
    cr_assert_eq(srv_options_parse(3, bad, &o, &err), SRV_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "--device") && strstr(err.msg, "quantum:0"), "%s", err.msg);
    srv_options_free(&o);
}

static srv_version *acquire(srv_registry *r, const char *model) {
    srv_error err = {0};
    srv_version *v = srv_registry_acquire(r, model, 0, NULL, &err);
    cr_assert_not_null(v, "acquire %s: %s", model, err.msg);
    return v;
}

Test(devices, instances_round_robin_and_device_memory_gauge) {
    add_version("a", 1);
    add_version("b", 2);
    srv_model_config c[2] = {cfg_of("a", SRV_POLICY_LATEST), cfg_of("b", SRV_POLICY_LATEST)};
    c[1].instance_count = 3;
    c[1].device = "sim:1,sim:0";
    srv_metrics *mt = srv_metrics_new();
    srv_registry_opts o = {.session_threads = 1, .metrics = mt, .device = "sim:0,sim:1"};
    srv_registry *r = reg_with(c, 2, &o);
    srv_version *a = acquire(r, "a"), *b = acquire(r, "b");
    cr_assert_eq(srv_version_instances(a), 2, "one per device of the server's list");
    cr_assert_eq(srv_version_instances(b), 3);
    int gpu;
    cr_assert_str_eq(srv_version_instance_device(a, 0, &gpu), "sim:0");
    cr_assert_eq(gpu, 0);
    cr_assert_str_eq(srv_version_instance_device(a, 1, &gpu), "sim:1");
    cr_assert_eq(gpu, 1);
    const char *want[3] = {"sim:1", "sim:0", "sim:1"};
    for (int i = 0; i < 3; i++) cr_assert_str_eq(srv_version_instance_device(b, i, NULL), want[i]);
    cr_assert_str_eq(srv_version_instance_device(b, 3, &gpu), "");
    cr_assert_eq(gpu, -1);
    for (int i = 0; i < 3; i++) cr_assert_gt(atomic_load(&b->inst[i].dev_bytes), b->inst[i].weight_bytes, "probe plan");
    cr_assert_float_eq(predict1(a, "x", "y"), 2.0f, 1e-6);
    cr_assert_float_eq(predict1(b, "x", "y"), 3.0f, 1e-6);
    size_t len;
    char *text = srv_metrics_render(mt, &len);
    cr_assert(strstr(text, "tensord_device_memory_bytes{model=\"a\",version=\"1\",device=\"sim:0\"}"), "%s", text);
    cr_assert(strstr(text, "tensord_device_memory_bytes{model=\"a\",version=\"1\",device=\"sim:1\"}"), "%s", text);
    cr_assert(strstr(text, "tensord_device_memory_bytes{model=\"b\",version=\"2\",device=\"sim:1\"}"), "%s", text);
    free(text);
    /* a second batch size compiles a second plan: its device memory is added */
    size_t before = atomic_load(&a->inst[0].dev_bytes);
    srv_tensors in = {0}, out = {0};
    float x[12] = {0};
    eng_tensor t = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {3, 4}, .data = x};
    cr_assert_eq(srv_tensors_add_copy(&in, "x", &t), 0);
    srv_error err = {0};
    cr_assert_eq(srv_version_predict(a, &in, &out, 0, NULL, &err), SRV_OK, "%s", err.msg);
    srv_tensors_free(&in);
    srv_tensors_free(&out);
    cr_assert_gt(atomic_load(&a->inst[0].dev_bytes), before);
    srv_version_release(a);
    srv_version_release(b);
    srv_registry_free(&r);
    srv_metrics_free(&mt);
}

Test(devices, version_that_does_not_fit_fails_its_load_naming_the_device) {
    setenv("TENSORD_SIM_MEMORY", "4096", 1); /* one page: the plan's arena and constants need more */
    add_version("big", 1);
    add_version("cpu", 1);
    srv_model_config c[2] = {cfg_of("big", SRV_POLICY_LATEST), cfg_of("cpu", SRV_POLICY_LATEST)};
    c[0].device = "sim:0";
    c[1].device = "cpu";
    srv_registry_opts o = {.session_threads = 1};
    srv_registry *r = reg_with(c, 2, &o);
    char msg[SRV_ERR_MAX];
    cr_assert_eq(state_of(r, "big", 1, msg, sizeof msg), SRV_STATE_END);
    cr_assert(strstr(msg, "out of memory") && strstr(msg, "sim:0") && strstr(msg, "model 'big' version 1"), "%s", msg);
    cr_assert_float_eq(predict_latest(r, "cpu"), 2.0f, 1e-6, "the other model serves");
    srv_registry_free(&r);
    unsetenv("TENSORD_SIM_MEMORY");
}

Test(devices, missing_cuda_fails_the_load_with_the_reason) {
    if (cuda_here()) return;
    add_version("g", 1);
    srv_model_config c = cfg_of("g", SRV_POLICY_LATEST);
    srv_registry_opts o = {.session_threads = 1, .device = "cuda:0"};
    srv_registry *r = reg_with(&c, 1, &o);
    char msg[SRV_ERR_MAX];
    cr_assert_eq(state_of(r, "g", 1, msg, sizeof msg), SRV_STATE_END);
    cr_assert(strstr(msg, "cuda:0") && strstr(msg, "not available") && strstr(msg, krn_cuda_unavailable_reason()), "%s",
              msg);
    srv_registry_free(&r);
}

/* Device health: a sticky fault (TENSORD_SIM_LOSE_DEVICE=name:N:D, as a CUDA illegal address) loses its device for the
 * rest of the process: the backend reports it with the first error, every later kernel, copy, allocation, context
 * and sync on it fails naming it, the other sim device and the CPU keep working, and srv_device_lost reports it
 * (2 the first time: the one time it is logged). */
Test(devices, sticky_fault_loses_only_its_device) {
    const krn_backend *sim = NULL;
    int dev = -1;
    cr_assert_eq(krn_backend_by_name("sim:1", &sim, &dev), ENG_STATUS_OK, "%s", eng_last_error());
    krn_ctx *c0 = NULL, *c1 = NULL;
    cr_assert_eq(krn_ctx_new(sim, 0, &c0), ENG_STATUS_OK);
    cr_assert_eq(krn_ctx_new(sim, 1, &c1), ENG_STATUS_OK);
    void *b0 = NULL, *b1 = NULL;
    cr_assert_eq(krn_buf_alloc(sim, c0, 64, &b0), ENG_STATUS_OK);
    cr_assert_eq(krn_buf_alloc(sim, c1, 64, &b1), ENG_STATUS_OK);
    const krn_kernel *k = krn_backend_find(sim, "eltwise_unary");
    cr_assert(k);
    /* the 1st exec on sim:1 (the gate fails it before the CPU kernel would read the call: no tensors needed) */
    setenv("TENSORD_SIM_LOSE_DEVICE", "eltwise_unary:1:1", 1);
    krn_call call = {.ctx = c1};
    cr_assert(!krn_backend_device_lost(sim, 1, NULL, 0));
    cr_assert_eq(k->exec(&call), ENG_STATUS_INTERNAL);
    cr_assert(strstr(eng_last_error(), "injected illegal memory access") && strstr(eng_last_error(), "sim:1") &&
              strstr(eng_last_error(), "lost"), "%s", eng_last_error());
    char why[512];
    cr_assert(krn_backend_device_lost(sim, 1, why, sizeof why));
    cr_assert(strstr(why, "eltwise_unary") && strstr(why, "injected illegal memory access"), "%s", why);
    cr_assert(!krn_backend_device_lost(sim, 0, why, sizeof why) && why[0] == 0);
    cr_assert(!krn_backend_device_lost(krn_backend_cpu(), 0, NULL, 0));
    /* everything on sim:1 fails from now on, naming the device and the first error */
    float host[16] = {1, 2, 3};
    void *p = NULL;
    krn_ctx *c2 = NULL;
    eng_status st[] = {k->exec(&call), krn_buf_set(sim, c1, b1, host, sizeof host), krn_ctx_sync(sim, c1),
                       krn_buf_alloc(sim, c1, 64, &p), krn_ctx_new(sim, 1, &c2)};
    for (size_t i = 0; i < sizeof st / sizeof st[0]; i++) cr_assert_eq(st[i], ENG_STATUS_INTERNAL, "call %zu worked", i);
    cr_assert(strstr(eng_last_error(), "sim:1") && strstr(eng_last_error(), "lost") &&
              strstr(eng_last_error(), "injected illegal memory access"), "%s", eng_last_error());
    cr_assert(!p && !c2);
    /* sim:0 works: a round trip through its memory */
    float back[16] = {0};
    cr_assert_eq(krn_buf_set(sim, c0, b0, host, sizeof host), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(krn_buf_get(sim, c0, back, b0, sizeof back), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(krn_ctx_sync(sim, c0), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert(back[0] == 1 && back[2] == 3);
    /* the server's view: srv_device_lost, 2 the first time (logged once), then 1; sim:0 and the CPU are fine */
    srv_device d[SRV_DEVICE_MAX];
    int n = 0;
    srv_error err = {0};
    cr_assert_eq(srv_device_resolve("sim:1,sim:0,cpu", d, &n, &err), SRV_OK, "%s", err.msg);
    cr_assert_eq(srv_device_lost(&d[0], why, sizeof why), 2);
    cr_assert(strstr(why, "injected illegal memory access"), "%s", why);
    cr_assert_eq(srv_device_lost(&d[0], NULL, 0), 1);
    cr_assert_eq(srv_device_lost(&d[1], NULL, 0), 0);
    cr_assert_eq(srv_device_lost(&d[2], NULL, 0), 0);
    unsetenv("TENSORD_SIM_LOSE_DEVICE");
    krn_buf_free(sim, c0, b0);
    krn_buf_free(sim, c1, b1);
    krn_ctx_free(sim, &c0);
    krn_ctx_free(sim, &c1);
}
