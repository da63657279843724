/* test_metrics.c - the metrics store (server/metrics.c): the series cap never hides a live version, forget
 * drops a retired version's request-path series and statistics, and Triton's statistics agree with the
 * Prometheus text rendered from the same store.
 * The unit-test link has only libtensord.a (the engine), so the server sources under test are included here.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "server/json.c"
#include "server/metrics.c"
#include "server/srv.c"

static char *render(srv_metrics *m) {
    size_t len = 0;
    char *s = srv_metrics_render(m, &len);
    cr_assert_not_null(s);
    cr_assert_eq(len, strlen(s));
    return s;
}

/* The value of the sample line that starts with `prefix` (labels included), or -1. */
static double sample(const char *text, const char *prefix) {
    size_t n = strlen(prefix);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, prefix, n) == 0 && p[n] == ' ') return strtod(p + n + 1, NULL);
    return -1;
}

Test(metrics, cap_never_hides_a_live_version) {
    srv_metrics *m = srv_metrics_new();
    cr_assert(m);
    char name[32];
    for (int i = 0; i < SRV_METRICS_MAX_SERIES + 500; i++) { /* client-chosen junk fills the cap */
        snprintf(name, sizeof name, "junk%d", i);
        srv_metrics_request(m, "", 0, name, "predict", "rest", SRV_NOT_FOUND, 10);
    }
    cr_expect_eq(m->f[SRV_F_REQ_COUNT].n, SRV_METRICS_MAX_SERIES);
    cr_expect_gt(m->dropped, 0);
    /* a version deployed afterwards still gets every series */
    srv_metrics_state(m, "m", 2, 20);
    srv_metrics_state(m, "m", 2, 30);
    srv_metrics_infer(m, "m", 2, NULL, "infer", "rest", SRV_OK, 5000, &(srv_infer_times){.rows = 1});
    srv_metrics_infer(m, "m", 2, "stable", "predict", "rest", SRV_INVALID_ARGUMENT, 7000, NULL);
    srv_metrics_batch(m, "m", 2, 3, 4);
    srv_metrics_queue(m, "m", 2, 50);
    char *s = render(m);
    cr_expect_eq(sample(s, "tensord_request_count{model=\"m\",version=\"2\",api=\"infer\",protocol=\"rest\",status=\"OK\"}"), 1,
                 "%.2000s", strstr(s, "model=\"m\""));
    cr_expect_eq(sample(s, "tensord_request_count{model=\"m\",version=\"2\",label=\"stable\",api=\"predict\","
                           "protocol=\"rest\",status=\"INVALID_ARGUMENT\"}"), 1);
    cr_expect_eq(sample(s, "tensord_request_latency_us_count{model=\"m\",version=\"2\",api=\"infer\",protocol=\"rest\"}"), 1);
    cr_expect_eq(sample(s, "tensord_batch_size_count{model=\"m\",version=\"2\"}"), 1);
    cr_expect_eq(sample(s, "tensord_queue_latency_us_count{model=\"m\",version=\"2\"}"), 1);
    cr_expect_eq(sample(s, "tensord_model_version_state{model=\"m\",version=\"2\"}"), 30);
    free(s);
    srv_metrics_free(&m);
}

Test(metrics, forget_drops_a_retired_version) {
    srv_metrics *m = srv_metrics_new();
    srv_metrics_state(m, "m", 1, 30);
    srv_metrics_state(m, "m", 2, 30);
    for (int v = 1; v <= 2; v++) {
        srv_metrics_load(m, "m", v, 1.5, 64);
        srv_metrics_swap(m, "m", v, "load");
        srv_metrics_infer(m, "m", v, NULL, "infer", "rest", SRV_OK, 1000, NULL);
        srv_metrics_batch(m, "m", v, 2, 2);
        srv_metrics_queue(m, "m", v, 5);
    }
    srv_metrics_swap(m, "m", 1, "unload");
    srv_metrics_state(m, "m", 1, 40);
    srv_metrics_state(m, "m", 1, 50);
    srv_metrics_forget(m, "m", 1);
    char *s = render(m);
    cr_expect_null(strstr(s, "version=\"1\",api="), "%s", s);
    cr_expect_null(strstr(s, "tensord_batch_size_count{model=\"m\",version=\"1\"}"));
    cr_expect_null(strstr(s, "tensord_queue_latency_us_count{model=\"m\",version=\"1\"}"));
    cr_expect_null(strstr(s, "tensord_model_weights_bytes{model=\"m\",version=\"1\"}"));
    cr_expect_null(strstr(s, "tensord_model_version_state{model=\"m\",version=\"1\"}"));
    cr_expect_null(strstr(s, "tensord_inference_stats_count{model=\"m\",version=\"1\""));
    /* its lifecycle history stays; version 2 is untouched */
    cr_expect_eq(sample(s, "tensord_model_swap_count{model=\"m\",version=\"1\",event=\"unload\"}"), 1);
    cr_expect_eq(sample(s, "tensord_request_count{model=\"m\",version=\"2\",api=\"infer\",protocol=\"rest\",status=\"OK\"}"), 1);
    cr_expect_eq(sample(s, "tensord_inference_stats_count{model=\"m\",version=\"2\",stat=\"success\"}"), 1);
    free(s);
    /* the index still finds every remaining series after the removal */
    srv_metrics_infer(m, "m", 2, NULL, "infer", "rest", SRV_OK, 1000, NULL);
    s = render(m);
    cr_expect_eq(sample(s, "tensord_request_count{model=\"m\",version=\"2\",api=\"infer\",protocol=\"rest\",status=\"OK\"}"), 2);
    char *p = strstr(s, "tensord_request_count{model=\"m\",version=\"2\",api=\"infer\",protocol=\"rest\",status=\"OK\"}");
    cr_expect(p && !strstr(p + 1, "tensord_request_count{model=\"m\",version=\"2\",api=\"infer\",protocol=\"rest\",status=\"OK\"}"),
              "series duplicated after forget");
    free(s);
    /* retired versions never grow the reserved set: kept series count against the cap again */
    cr_expect_eq(m->f[SRV_F_SWAP].nother, 2);
    srv_metrics_free(&m);
}

Test(metrics, stats_agree_with_prometheus) {
    srv_metrics *m = srv_metrics_new();
    srv_metrics_state(m, "m", 3, 20);
    srv_metrics_run(m, "m", 3, 1, 100, 200, 250); /* warm-up (LOADING): not an execution */
    srv_metrics_state(m, "m", 3, 30);
    srv_infer_times t = {.input_ns = 10, .queue_ns = 20, .infer_ns = 30, .output_ns = 40, .rows = 4};
    for (int i = 0; i < 3; i++) srv_metrics_infer(m, "m", 3, NULL, i ? "infer" : "predict", "rest", SRV_OK, 1000, &t);
    srv_metrics_infer(m, "m", 3, NULL, "infer", "rest", SRV_INVALID_ARGUMENT, 500, NULL);
    srv_metrics_request(m, "m", 3, NULL, "metadata", "rest", SRV_OK, 1); /* not an inference */
    srv_metrics_run(m, "m", 3, 4, 1000, 1300, 1350);
    srv_metrics_run(m, "m", 3, 4, 2000, 2100, 2110);
    srv_metrics_run(m, "m", 3, 1, 3000, 3050, 3060);
    srv_infer_times t1 = {0};
    srv_infer_times_run(&t1, 3000); /* the last run on this thread started at 3000: it ran this request */
    cr_expect(t1.queue_ns == 0 && t1.infer_ns == 50 && t1.output_ns == 10, "queue %lld infer %lld output %lld",
              (long long)t1.queue_ns, (long long)t1.infer_ns, (long long)t1.output_ns);
    srv_infer_times t2 = {0};
    srv_infer_times_run(&t2, 2990);
    cr_expect(t2.queue_ns == 10 && t2.infer_ns == 50, "decoded 10 ns before the run started");
    srv_infer_times t3 = {0};
    srv_infer_times_run(&t3, 3001); /* the run started before the request was decoded: not its run */
    cr_expect(t3.queue_ns == 0 && t3.output_ns == 0 && t3.infer_ns > 0, "all of it counts as the run");

    srv_buf jb = {0};
    srv_metrics_stats_json(m, "m", 3, &jb);
    char *js = srv_buf_take(&jb, NULL);
    cr_assert_not_null(js);
    srv_error err = {0};
    cJSON *j = srv_json_parse(js, strlen(js), &err);
    cr_assert_not_null(j, "%s: %s", err.msg, js);
    cr_expect_str_eq(cJSON_GetObjectItem(j, "name")->valuestring, "m");
    cr_expect_str_eq(cJSON_GetObjectItem(j, "version")->valuestring, "3");
    cr_expect_eq(cJSON_GetObjectItem(j, "inference_count")->valuedouble, 12);
    cr_expect_eq(cJSON_GetObjectItem(j, "execution_count")->valuedouble, 3);
    cr_expect_gt(cJSON_GetObjectItem(j, "last_inference")->valuedouble, 1.6e12);
    const cJSON *is = cJSON_GetObjectItem(j, "inference_stats");
    const char *names[] = {"success", "fail", "queue", "compute_input", "compute_infer", "compute_output"};
    const double counts[] = {3, 1, 3, 3, 3, 3}, ns[] = {3000, 500, 60, 30, 90, 120};
    char *s = render(m);
    for (int i = 0; i < 6; i++) {
        const cJSON *d = cJSON_GetObjectItem(is, names[i]);
        cr_assert_not_null(d, "%s missing: %s", names[i], js);
        cr_expect_eq(cJSON_GetObjectItem(d, "count")->valuedouble, counts[i], "%s", names[i]);
        cr_expect_eq(cJSON_GetObjectItem(d, "ns")->valuedouble, ns[i], "%s", names[i]);
        char key[160];
        snprintf(key, sizeof key, "tensord_inference_stats_count{model=\"m\",version=\"3\",stat=\"%s\"}", names[i]);
        cr_expect_eq(sample(s, key), counts[i], "%s", key);
        snprintf(key, sizeof key, "tensord_inference_stats_ns{model=\"m\",version=\"3\",stat=\"%s\"}", names[i]);
        cr_expect_eq(sample(s, key), ns[i], "%s", key);
    }
    /* the success/fail figures are the request counter's inference rows */
    double ok = sample(s, "tensord_request_count{model=\"m\",version=\"3\",api=\"infer\",protocol=\"rest\",status=\"OK\"}") +
                sample(s, "tensord_request_count{model=\"m\",version=\"3\",api=\"predict\",protocol=\"rest\",status=\"OK\"}");
    cr_expect_eq(ok, 3);
    cr_expect_eq(sample(s, "tensord_inference_count{model=\"m\",version=\"3\"}"), 12);
    cr_expect_eq(sample(s, "tensord_inference_exec_count{model=\"m\",version=\"3\"}"), 3);
    const cJSON *bs = cJSON_GetObjectItem(j, "batch_stats");
    cr_assert_eq(cJSON_GetArraySize(bs), 2, "%s", js);
    const cJSON *b0 = cJSON_GetArrayItem(bs, 0), *b1 = cJSON_GetArrayItem(bs, 1);
    cr_expect_eq(cJSON_GetObjectItem(b0, "batch_size")->valuedouble, 1);
    cr_expect_eq(cJSON_GetObjectItem(b1, "batch_size")->valuedouble, 4);
    cr_expect_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(b1, "compute_infer"), "count")->valuedouble, 2);
    cr_expect_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(b1, "compute_infer"), "ns")->valuedouble, 400);
    cr_expect_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(b1, "compute_output"), "ns")->valuedouble, 60);
    cJSON_Delete(j);
    free(js);
    free(s);
    /* a version with nothing recorded reports zeros */
    srv_buf zb = {0};
    srv_metrics_stats_json(m, "other", 9, &zb);
    js = srv_buf_take(&zb, NULL);
    cr_expect(strstr(js, "\"success\":{\"count\":0,\"ns\":0}") != NULL, "%s", js);
    free(js);
    srv_metrics_free(&m);
}

Test(metrics, many_live_series_found_again) {
    /* the hash index across growth: every series is found (not duplicated) after thousands were added */
    srv_metrics *m = srv_metrics_new();
    char model[32];
    for (int i = 0; i < 3000; i++) {
        snprintf(model, sizeof model, "m%d", i);
        srv_metrics_state(m, model, 1, 30);
        srv_metrics_infer(m, model, 1, NULL, "infer", "rest", SRV_OK, 1, NULL);
    }
    for (int i = 0; i < 3000; i++) {
        snprintf(model, sizeof model, "m%d", i);
        srv_metrics_infer(m, model, 1, NULL, "infer", "rest", SRV_OK, 1, NULL);
    }
    cr_expect_eq(m->f[SRV_F_REQ_COUNT].n, 3000);
    cr_expect_eq(m->nv, 3000);
    for (int i = 0; i < 3000; i++) cr_assert_eq(m->f[SRV_F_REQ_COUNT].s[i].value, 2, "series %d", i);
    for (int i = 0; i < 3000; i += 2) {
        snprintf(model, sizeof model, "m%d", i);
        srv_metrics_forget(m, model, 1);
    }
    cr_expect_eq(m->f[SRV_F_REQ_COUNT].n, 1500);
    cr_expect_eq(m->nv, 1500);
    srv_metrics_infer(m, "m1", 1, NULL, "infer", "rest", SRV_OK, 1, NULL);
    cr_expect_eq(m->f[SRV_F_REQ_COUNT].n, 1500);
    cr_expect_eq(m->dropped, 0);
    srv_metrics_free(&m);
}
