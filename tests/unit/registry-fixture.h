/* registry-fixture.h - what the registry's unit tests (test_registry.c, test_loader.c) share: the serving
 * sources under test compiled in (the Makefile links unit tests against libtensord.a only), a fresh mkdtemp
 * directory per test, and bundles written at run time with the engine's own ONNX writer: version k of a model
 * computes y = x + k (x: float [N,4]), so an output tells which version answered. Include it once, first.
 */
#ifndef TESTS_UNIT_REGISTRY_FIXTURE_H
#define TESTS_UNIT_REGISTRY_FIXTURE_H

#define FIXTURE static __attribute__((unused))

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* the sources below are compiled in after the system headers: they need it from the start */
#endif

#include <criterion/criterion.h>

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/ir/onnx.h"
#include "server/srv.c"
#include "server/bundle.c"
#include "server/device.c"
#include "server/version.c"
#include "server/registry.c"
#include "server/registry-poll.c"
#include "server/loader.c"
#include "server/log.c"
#include "server/json.c"
#include "server/codec-tfs.c"
#include "server/codec-kserve.c"
#include "server/metrics.c"
#include "server/batcher.c"

static char g_root[256];
static size_t g_external; /* write_model: initializers larger than this go to model.onnx.data (0: none) */

FIXTURE void setup(void) {
    snprintf(g_root, sizeof g_root, "/tmp/tensord-reg-XXXXXX");
    cr_assert_not_null(mkdtemp(g_root));
}

FIXTURE void teardown(void) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
    if (system(cmd) != 0) {}
}

FIXTURE void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

/* y = x + addend (x, y: float [N,4]); two_inputs: y = a + b + addend with inputs a, b. */
FIXTURE void write_model(const char *path, float addend, int two_inputs) {
    eng_graph *g = eng_graph_new();
    g->ir_version = 8;
    g->opset = 17;
    int x = eng_graph_add_value(g, two_inputs ? "a" : "x"), k = eng_graph_add_value(g, "k");
    int y = eng_graph_add_value(g, "y"), b = -1, s = -1;
    if (two_inputs) {
        b = eng_graph_add_value(g, "b");
        s = eng_graph_add_value(g, "s");
    }
    int ins[2] = {x, b};
    for (int i = 0; i < 1 + two_inputs; i++) {
        eng_value *v = &g->values[ins[i]];
        v->dtype = ENG_DTYPE_F32;
        v->ndim = 2;
        v->dims[0] = -1;
        v->dims[1] = 4;
    }
    g->values[y].dtype = ENG_DTYPE_F32;
    g->values[y].ndim = 2;
    g->values[y].dims[0] = -1;
    g->values[y].dims[1] = 4;
    eng_tensor *t = malloc(sizeof *t);
    *t = (eng_tensor){.dtype = ENG_DTYPE_F32, .ndim = 1, .dims = {4}, .data = eng_alloc(16)};
    for (int i = 0; i < 4; i++) ((float *)t->data)[i] = addend;
    eng_value_set_init(g, k, t);
    g->values[k].dtype = ENG_DTYPE_F32;
    g->values[k].ndim = 1;
    g->values[k].dims[0] = 4;
    g->inputs = malloc(2 * sizeof(int));
    g->inputs[0] = x;
    if (two_inputs) g->inputs[1] = b;
    g->ninputs = 1 + two_inputs;
    g->outputs = malloc(sizeof(int));
    g->outputs[0] = y;
    g->noutputs = 1;
    if (two_inputs) {
        int i1[2] = {x, b}, i2[2] = {s, k};
        eng_graph_add_node(g, "add0", "Add", "", i1, 2, &s, 1);
        eng_graph_add_node(g, "add1", "Add", "", i2, 2, &y, 1);
    } else {
        int i1[2] = {x, k};
        eng_graph_add_node(g, "add", "Add", "", i1, 2, &y, 1);
    }
    cr_assert_eq(eng_onnx_save_file(g, path, g_external), ENG_STATUS_OK, "save %s: %s", path, eng_last_error());
    eng_graph_free(&g);
}

FIXTURE void vdir(char *buf, size_t n, const char *model, int64_t v) {
    snprintf(buf, n, "%s/%s/%lld", g_root, model, (long long)v);
}

/* <root>/<model>/<v>/model.onnx computing x + v. */
FIXTURE void add_version(const char *model, int64_t v) {
    char d[512], p[600];
    snprintf(d, sizeof d, "%s/%s", g_root, model);
    mkdir(d, 0755);
    vdir(d, sizeof d, model, v);
    cr_assert_eq(mkdir(d, 0755), 0, "mkdir %s", d);
    snprintf(p, sizeof p, "%s/model.onnx", d);
    write_model(p, (float)v, 0);
}

FIXTURE void version_file(const char *model, int64_t v, const char *name, const char *text) {
    char d[512], p[700];
    vdir(d, sizeof d, model, v);
    snprintf(p, sizeof p, "%s/%s", d, name);
    write_text(p, text);
}

FIXTURE void remove_version(const char *model, int64_t v) {
    char d[512], cmd[600];
    vdir(d, sizeof d, model, v);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    cr_assert_eq(system(cmd), 0);
}

FIXTURE srv_model_config cfg_of(const char *name, srv_policy pol) {
    static char bases[8][512];
    static int nb;
    char *b = bases[nb++ % 8];
    snprintf(b, 512, "%s/%s", g_root, name);
    mkdir(b, 0755);
    return (srv_model_config){.name = (char *)name, .base_path = b, .policy = pol, .latest_n = 1};
}

static srv_registry *reg_with(const srv_model_config *c, int n, const srv_registry_opts *o) {
    srv_registry_opts def = {.session_threads = 1};
    srv_registry *r = srv_registry_new(o ? o : &def);
    cr_assert_not_null(r);
    srv_error err = {0};
    cr_assert_eq(srv_registry_set_config(r, c, n, &err), SRV_OK, "%s", err.msg);
    srv_registry_poll(r);
    return r;
}

FIXTURE srv_state state_of(srv_registry *r, const char *model, int64_t v, char *msg, size_t msgn) {
    srv_version_status *s = NULL;
    int n = 0;
    srv_error err = {0};
    if (srv_registry_status(r, model, v, NULL, &s, &n, &err) != SRV_OK || n != 1) {
        srv_status_free(s, n);
        return SRV_STATE_UNKNOWN;
    }
    srv_state st = s[0].state;
    if (msg) snprintf(msg, msgn, "%s", s[0].error_message);
    srv_status_free(s, n);
    return st;
}

/* Predict one row of ones on v; returns y[0] (= 1 + version). */
FIXTURE float predict1(srv_version *v, const char *in_name, const char *out_name) {
    srv_tensors in = {0}, out = {0};
    float ones[4] = {1, 1, 1, 1};
    eng_tensor t = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {1, 4}, .data = ones};
    cr_assert_eq(srv_tensors_add_copy(&in, in_name, &t), 0);
    srv_error err = {0};
    srv_code c = srv_version_predict(v, &in, &out, 0, NULL, &err);
    cr_assert_eq(c, SRV_OK, "predict: %s", err.msg);
    cr_assert_eq(out.n, 1);
    cr_assert_str_eq(out.names[0], out_name);
    cr_assert_eq(out.t[0].ndim, 2);
    float y = ((float *)out.t[0].data)[0];
    srv_tensors_free(&in);
    srv_tensors_free(&out);
    return y;
}

FIXTURE float predict_latest(srv_registry *r, const char *model) {
    srv_error err = {0};
    srv_version *v = srv_registry_acquire(r, model, 0, NULL, &err);
    cr_assert_not_null(v, "acquire %s: %s", model, err.msg);
    float y = predict1(v, "x", "y");
    srv_version_release(v);
    return y;
}

typedef struct poll_arg {
    srv_registry *r;
    atomic_int done;
} poll_arg;

#endif
