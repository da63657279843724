/* test_instances.c - execution instances per version (server/version.c): how many a version gets (flag, the
 * model's instance_count, the cores / threads default), that each has its own session and is warmed up, that
 * runs take a free one and wait (up to their deadline) while all are busy, the quick-run rule with several
 * instances, the config parsing and validation of instance_count, and the instance gauges.
 *
 * Fixtures: registry-fixture.h (version k of a model computes y = x + k).
 */
#include "registry-fixture.h"

#include <sched.h>

#include "server/textproto.c"
#include "server/config.c"

TestSuite(instances, .init = setup, .fini = teardown, .timeout = 60);

static int usable_cores(void) {
    cpu_set_t set;
    cr_assert_eq(sched_getaffinity(0, sizeof set, &set), 0);
    return CPU_COUNT(&set);
}

Test(instances, resolve_order_and_default) {
    int cores = usable_cores();
    cr_assert_eq(srv_instances_resolve(3, 2, 1), 3, "the model's count wins");
    cr_assert_eq(srv_instances_resolve(0, 5, 1), 5, "then the flag");
    cr_assert_eq(srv_instances_resolve(0, 0, 0), 1, "0 threads = all cores per run: one instance");
    cr_assert_eq(srv_instances_resolve(0, 0, 1), cores > 64 ? 64 : cores);
    cr_assert_eq(srv_instances_resolve(0, 0, cores), 1);
    cr_assert_eq(srv_instances_resolve(0, 0, 2 * cores), 1);
    cr_assert_eq(srv_instances_resolve(0, 0, 2), cores / 2 < 1 ? 1 : cores / 2 > 64 ? 64 : cores / 2);
    cr_assert_eq(srv_instances_resolve(1000, 0, 1), SRV_MAX_INSTANCES);
}

static srv_version *acquire(srv_registry *r, const char *model) {
    srv_error err = {0};
    srv_version *v = srv_registry_acquire(r, model, 0, NULL, &err);
    cr_assert_not_null(v, "acquire %s: %s", model, err.msg);
    return v;
}

Test(instances, flag_and_model_override_and_own_sessions) {
    add_version("a", 1);
    add_version("b", 2);
    srv_model_config c[2] = {cfg_of("a", SRV_POLICY_LATEST), cfg_of("b", SRV_POLICY_LATEST)};
    c[1].instance_count = 3;
    srv_metrics *mt = srv_metrics_new();
    srv_registry_opts o = {.session_threads = 1, .instances_per_version = 2, .metrics = mt};
    srv_registry *r = reg_with(c, 2, &o);
    srv_version *a = acquire(r, "a"), *b = acquire(r, "b");
    cr_assert_eq(srv_version_instances(a), 2);
    cr_assert_eq(srv_version_instances(b), 3);
    for (int i = 0; i < b->ninst; i++)
        for (int j = 0; j < i; j++) {
            cr_assert_neq(b->inst[i].sess, b->inst[j].sess);
            cr_assert_neq(eng_session_graph(b->inst[i].sess), eng_session_graph(b->inst[j].sess), "a graph is shared");
            cr_assert_neq(eng_session_graph(b->inst[i].sess)->values[1].init->data,
                          eng_session_graph(b->inst[j].sess)->values[1].init->data, "weights are shared");
        }
    cr_assert_float_eq(predict1(b, "x", "y"), 3.0f, 1e-6);
    size_t len;
    char *text = srv_metrics_render(mt, &len);
    cr_assert(strstr(text, "tensord_model_instances{model=\"a\",version=\"1\"} 2"), "%s", text);
    cr_assert(strstr(text, "tensord_model_instances{model=\"b\",version=\"2\"} 3"), "%s", text);
    cr_assert(strstr(text, "tensord_model_instance_bytes{model=\"b\",version=\"2\",instance=\"2\"}"), "%s", text);
    cr_assert_null(strstr(text, "instance=\"3\""), "%s", text);
    free(text);
    srv_version_release(a);
    srv_version_release(b);
    srv_registry_free(&r);
    text = srv_metrics_render(mt, &len);
    cr_assert_null(strstr(text, "tensord_model_instance_bytes{"), "instance gauges outlived their version:\n%s", text);
    cr_assert_null(strstr(text, "tensord_model_instances{"), "%s", text);
    free(text);
    srv_metrics_free(&mt);
}

Test(instances, warmup_runs_on_every_instance) {
    add_version("m", 1);
    char d[512], p[700];
    vdir(d, sizeof d, "m", 1);
    snprintf(p, sizeof p, "%s/assets.extra", d);
    mkdir(p, 0755);
    version_file("m", 1, "assets.extra/warmup.jsonl", "{\"instances\": [[1, 2, 3, 4]]}\n");
    srv_model_config c = cfg_of("m", SRV_POLICY_LATEST);
    c.instance_count = 4;
    srv_registry *r = reg_with(&c, 1, NULL);
    srv_version *v = acquire(r, "m");
    cr_assert_eq(v->ninst, 4);
    for (int i = 0; i < v->ninst; i++) {
        eng_plan_stats st;
        eng_session_last_stats(v->inst[i].sess, &st);
        cr_assert_gt(st.nodes, 0, "instance %d never ran during warm-up", i);
        cr_assert_not(v->inst[i].busy);
    }
    cr_assert_eq(v->pin, -1);
    srv_version_release(v);
    srv_registry_free(&r);
}

typedef struct hold_arg {
    srv_version *v;
    int idx;
    int64_t us;
} hold_arg;

static void *give_later(void *arg) {
    hold_arg *h = arg;
    usleep((useconds_t)h->us);
    version_give(h->v, h->idx, 0);
    return NULL;
}

static srv_code predict_ones(srv_version *v, int64_t deadline_us, srv_error *err) {
    srv_tensors in = {0}, out = {0};
    float ones[4] = {1, 1, 1, 1};
    eng_tensor t = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {1, 4}, .data = ones};
    cr_assert_eq(srv_tensors_add_copy(&in, "x", &t), 0);
    srv_code c = srv_version_predict(v, &in, &out, deadline_us, NULL, err);
    srv_tensors_free(&in);
    srv_tensors_free(&out);
    return c;
}

Test(instances, a_run_waits_for_a_free_instance_up_to_its_deadline) {
    add_version("m", 1);
    srv_model_config c = cfg_of("m", SRV_POLICY_LATEST);
    c.instance_count = 2;
    srv_registry *r = reg_with(&c, 1, NULL);
    srv_version *v = acquire(r, "m");
    int i0, i1;
    srv_error err = {0};
    cr_assert_eq(version_take(v, 0, NULL, &i0, &err), SRV_OK);
    cr_assert_eq(version_take(v, 0, NULL, &i1, &err), SRV_OK);
    cr_assert(i0 == 0 && i1 == 1, "lowest free first: %d %d", i0, i1);
    int64_t t0 = srv_now_us();
    cr_assert_eq(predict_ones(v, t0 + 60 * 1000, &err), SRV_DEADLINE_EXCEEDED);
    int64_t waited = srv_now_us() - t0;
    cr_assert(waited >= 55 * 1000 && waited < 2000 * 1000, "waited %lld us for a 60 ms deadline", (long long)waited);
    cr_assert(strstr(err.msg, "model 'm' version 1") && strstr(err.msg, "free execution instance") &&
                  strstr(err.msg, "all 2 busy"), "%s", err.msg);
    /* a request whose client went away (or whose deadline the front door saw pass) stops waiting */
    int idx = -1;
    atomic_int gone = SRV_CANCEL_CLIENT;
    cr_assert_eq(version_take(v, 0, &gone, &idx, &err), SRV_CANCELLED, "%s", err.msg);
    atomic_store(&gone, SRV_CANCEL_DEADLINE);
    cr_assert_eq(version_take(v, 0, &gone, &idx, &err), SRV_DEADLINE_EXCEEDED, "%s", err.msg);
    cr_assert_eq(idx, -1, "a cancelled wait took an instance");
    hold_arg h = {.v = v, .idx = 1, .us = 50 * 1000};
    pthread_t th;
    pthread_create(&th, NULL, give_later, &h);
    t0 = srv_now_us();
    cr_assert_eq(predict_ones(v, 0, &err), SRV_OK, "%s", err.msg);
    cr_assert_geq(srv_now_us() - t0, 40 * 1000, "the run did not wait for the freed instance");
    pthread_join(th, NULL);
    cr_assert_not(v->inst[1].busy);
    version_give(v, 0, 0);
    cr_assert_eq(predict_ones(v, srv_now_us() + 1000 * 1000, &err), SRV_OK, "%s", err.msg);
    srv_version_release(v);
    srv_registry_free(&r);
}

Test(instances, quick_while_an_instance_is_not_taken_by_a_slow_run) {
    add_version("m", 1);
    srv_model_config c = cfg_of("m", SRV_POLICY_LATEST);
    c.instance_count = 2;
    srv_registry *r = reg_with(&c, 1, NULL);
    srv_version *v = acquire(r, "m");
    float ones[4] = {1, 1, 1, 1};
    srv_tensors in = {.n = 1, .names = (char *[]){"x"}, .t = (eng_tensor[]){{.dtype = ENG_DTYPE_F32, .ndim = 2,
                                                                            .dims = {1, 4}, .data = ones}}};
    atomic_store(&v->row_ns, 0);
    cr_assert_not(srv_version_quick(v, &in, 1000), "unknown run time is not quick");
    atomic_store(&v->row_ns, 1000);
    cr_assert(srv_version_quick(v, &in, 1000));
    atomic_store(&v->slow_runs, 1);
    cr_assert(srv_version_quick(v, &in, 1000), "one slow run leaves the other instance");
    atomic_store(&v->slow_runs, 2);
    cr_assert_not(srv_version_quick(v, &in, 1000), "both instances may be taken by slow runs");
    atomic_store(&v->slow_runs, 0);
    srv_version_release(v);
    srv_registry_free(&r);
}

typedef struct conc_arg {
    srv_version *v;
    int bad;
    float expect;
} conc_arg;

static void *conc_main(void *arg) {
    conc_arg *a = arg;
    for (int i = 0; i < 50; i++) {
        srv_tensors in = {0}, out = {0};
        float x[8] = {(float)i, 1, 2, 3, -1, -2, -3, (float)-i};
        eng_tensor t = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {2, 4}, .data = x};
        srv_tensors_add_copy(&in, "x", &t);
        srv_error err = {0};
        if (srv_version_predict(a->v, &in, &out, 0, NULL, &err) != SRV_OK || out.n != 1) a->bad++;
        else
            for (int k = 0; k < 8; k++)
                if (((float *)out.t[0].data)[k] != x[k] + a->expect) a->bad++;
        srv_tensors_free(&in);
        srv_tensors_free(&out);
    }
    return NULL;
}

Test(instances, concurrent_runs_get_their_own_answers) {
    add_version("m", 5);
    srv_model_config c = cfg_of("m", SRV_POLICY_LATEST);
    c.instance_count = 3;
    srv_registry *r = reg_with(&c, 1, NULL);
    srv_version *v = acquire(r, "m");
    conc_arg a[6];
    pthread_t th[6];
    for (int i = 0; i < 6; i++) {
        a[i] = (conc_arg){.v = v, .expect = 5};
        pthread_create(&th[i], NULL, conc_main, &a[i]);
    }
    for (int i = 0; i < 6; i++) {
        pthread_join(th[i], NULL);
        cr_assert_eq(a[i].bad, 0, "thread %d got wrong answers", i);
    }
    for (int i = 0; i < v->ninst; i++) cr_assert_not(v->inst[i].busy, "instance %d left busy", i);
    srv_version_release(v);
    srv_registry_free(&r);
}

Test(instances, registry_refuses_out_of_range_counts) {
    srv_model_config c = cfg_of("m", SRV_POLICY_LATEST);
    srv_registry *r = srv_registry_new(&(srv_registry_opts){.session_threads = 1});
    srv_error err = {0};
    c.instance_count = 65;
    cr_assert_eq(srv_registry_set_config(r, &c, 1, &err), SRV_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "model 'm'") && strstr(err.msg, "instance_count") && strstr(err.msg, "1..64"), "%s", err.msg);
    c.instance_count = -1;
    cr_assert_eq(srv_registry_set_config(r, &c, 1, &err), SRV_INVALID_ARGUMENT);
    srv_registry_free(&r);
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

Test(instances, config_file_instance_count_text_and_json) {
    srv_model_config *cfgs = NULL;
    int n = 0;
    srv_error err = {0};
    cr_assert_eq(load_cfg("model_config_list { config { name: 'a' base_path: '/x' instance_count: 3 }\n"
                          "  config { name: 'b' base_path: '/y' } }\n", &cfgs, &n, &err), SRV_OK, "%s", err.msg);
    cr_assert_eq(n, 2);
    cr_assert_eq(cfgs[0].instance_count, 3);
    cr_assert_eq(cfgs[1].instance_count, 0);
    free_cfgs(cfgs, n);
    cr_assert_eq(load_cfg("{\"model_config_list\": {\"config\": [{\"name\": \"j\", \"base_path\": \"/x\", "
                          "\"instance_count\": 64}]}}", &cfgs, &n, &err), SRV_OK, "%s", err.msg);
    cr_assert_eq(n, 1);
    cr_assert_eq(cfgs[0].instance_count, 64);
    free_cfgs(cfgs, n);
    const char *bad[] = {"0", "65", "-2", "'two'", "1.5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[300];
        snprintf(text, sizeof text, "model_config_list { config { name: 'bad_%zu' base_path: '/x' instance_count: %s } }",
                 i, bad[i]);
        cr_assert_eq(load_cfg(text, &cfgs, &n, &err), SRV_INVALID_ARGUMENT, "%s accepted", bad[i]);
        char who[40];
        snprintf(who, sizeof who, "model 'bad_%zu'", i);
        cr_assert(strstr(err.msg, who) && strstr(err.msg, "instance_count") && strstr(err.msg, "1..64"), "%s", err.msg);
    }
}

Test(instances, flag_parsing) {
    srv_options o;
    srv_error err = {0};
    char *ok[] = {"serve", "--model_base_path=/x", "--instances_per_version=4"};
    cr_assert_eq(srv_options_parse(3, ok, &o, &err), SRV_OK, "%s", err.msg);
    cr_assert_eq(o.instances_per_version, 4);
    srv_options_free(&o);
    char *unset[] = {"serve", "--model_base_path=/x"};
    cr_assert_eq(srv_options_parse(2, unset, &o, &err), SRV_OK, "%s", err.msg);
    cr_assert_eq(o.instances_per_version, -1);
    srv_options_free(&o);
    const char *bad[] = {"--instances_per_version=0", "--instances_per_version=65", "--instances_per_version=x",
                         "--instances_per_version=-1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *argv[] = {"serve", "--model_base_path=/x", (char *)bad[i]};
        cr_assert_eq(srv_options_parse(3, argv, &o, &err), SRV_INVALID_ARGUMENT, "%s accepted", bad[i]);
        cr_assert(strstr(err.msg, "--instances_per_version"), "%s", err.msg);
        srv_options_free(&o);
    }
}
