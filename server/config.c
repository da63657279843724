/* config.c - `tensord serve` flags and config files (see config.h). */
#include "config.h"
#include "json.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device.h"
#include "textproto.h"
#include "../engine/plan/plan.h"

typedef enum { OPT_INT, OPT_I64, OPT_DOUBLE, OPT_BOOL, OPT_STR } opt_kind;

typedef struct opt_def {
    const char *name;
    opt_kind kind;
    size_t off;
} opt_def;

#define O(f) offsetof(srv_options, f)
static const opt_def opt_table[] = {
    {"port", OPT_INT, O(grpc_port)},
    {"rest_api_port", OPT_INT, O(rest_port)},
    {"rest_api_host", OPT_STR, O(rest_host)},
    {"model_name", OPT_STR, O(model_name)},
    {"model_base_path", OPT_STR, O(model_base_path)},
    {"model_config_file", OPT_STR, O(model_config_file)},
    {"model_config_file_poll_wait_seconds", OPT_DOUBLE, O(model_config_file_poll_wait_seconds)},
    {"file_system_poll_wait_seconds", OPT_DOUBLE, O(file_system_poll_wait_seconds)},
    {"enable_batching", OPT_BOOL, O(enable_batching)},
    {"batching_parameters_file", OPT_STR, O(batching_parameters_file)},
    {"monitoring_config_file", OPT_STR, O(monitoring_config_file)},
    {"rest_api_timeout_in_ms", OPT_I64, O(rest_api_timeout_in_ms)},
    {"max_loop_iterations", OPT_I64, O(max_loop_iterations)},
    {"allow_version_labels_for_unavailable_models", OPT_BOOL, O(allow_version_labels_for_unavailable_models)},
    {"rest_api_num_threads", OPT_INT, O(rest_api_num_threads)},
    {"tensorflow_intra_op_parallelism", OPT_INT, O(session_threads)},
    {"instances_per_version", OPT_INT, O(instances_per_version)},
    {"rest_api_max_body_bytes", OPT_I64, O(max_body_bytes)},
    {"rest_api_connection_limit", OPT_INT, O(connection_limit)},
    {"rest_api_connection_timeout_seconds", OPT_INT, O(connection_timeout_s)},
    {"drain_seconds", OPT_DOUBLE, O(drain_seconds)},
    {"rest_api_header_timeout_seconds", OPT_INT, O(header_timeout_s)},
    {"rest_api_per_ip_connection_limit", OPT_INT, O(per_ip_connection_limit)},
    {"model_load_timeout_seconds", OPT_DOUBLE, O(model_load_timeout_s)},
    {"log_format", OPT_STR, O(log_format)},
    {"model_control_mode", OPT_STR, O(model_control_mode)},
    {"admin_token_file", OPT_STR, O(admin_token_file)},
    {"grpc_api_host", OPT_STR, O(grpc_host)},
    {"grpc_max_receive_message_bytes", OPT_I64, O(grpc_max_receive_bytes)},
    {"grpc_max_threads", OPT_INT, O(grpc_threads)},
    {"ssl_config_file", OPT_STR, O(ssl_config_file)},
    {"admin_port", OPT_INT, O(admin_port)},
    {"admin_bind", OPT_STR, O(admin_bind)},
    {"model_root", OPT_STR, O(model_root)},
    {"state_dir", OPT_STR, O(state_dir)},
    {"max_upload_bytes", OPT_I64, O(max_upload_bytes)},
    {"dataset_quota_bytes", OPT_I64, O(dataset_quota_bytes)},
    {"max_concurrent_jobs", OPT_INT, O(max_concurrent_jobs)},
    {"device", OPT_STR, O(device)},
};
#undef O

static srv_code opt_set(srv_options *o, const opt_def *d, const char *v, srv_error *err) {
    char *end = NULL;
    void *p = (char *)o + d->off;
    errno = 0;
    switch (d->kind) {
    case OPT_INT:
    case OPT_I64: {
        long long x = strtoll(v, &end, 10);
        if (!*v || *end || errno || x < 0 || (d->kind == OPT_INT && x > 0x7fffffff))
            return srv_err(err, SRV_INVALID_ARGUMENT, "--%s: expected a non-negative integer, got '%s'", d->name, v);
        if (d->kind == OPT_INT) *(int *)p = (int)x;
        else *(int64_t *)p = x;
        return SRV_OK;
    }
    case OPT_DOUBLE: {
        double x = strtod(v, &end);
        if (!*v || *end || x < 0 || x != x)
            return srv_err(err, SRV_INVALID_ARGUMENT, "--%s: expected a non-negative number, got '%s'", d->name, v);
        *(double *)p = x;
        return SRV_OK;
    }
    case OPT_BOOL:
        if (strcmp(v, "true") == 0 || strcmp(v, "1") == 0) *(int *)p = 1;
        else if (strcmp(v, "false") == 0 || strcmp(v, "0") == 0) *(int *)p = 0;
        else return srv_err(err, SRV_INVALID_ARGUMENT, "--%s: expected true or false, got '%s'", d->name, v);
        return SRV_OK;
    case OPT_STR: {
        char **s = p;
        free(*s);
        *s = strdup(v);
        return *s ? SRV_OK : srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    }
    }
    return SRV_INTERNAL;
}

/* The bearer token from --admin_token_file (first line, trailing whitespace cut) or env TENSORD_ADMIN_TOKEN. */
static srv_code srv_options_admin_token(srv_options *o, srv_error *err) {
    const char *env = getenv("TENSORD_ADMIN_TOKEN");
    if (!o->admin_token_file) {
        if (env && *env && !(o->admin_token = strdup(env))) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
        return SRV_OK;
    }
    FILE *f = fopen(o->admin_token_file, "r");
    if (!f) return srv_err(err, SRV_INVALID_ARGUMENT, "--admin_token_file: cannot read '%s': %s", o->admin_token_file,
                           strerror(errno));
    char line[512];
    size_t n = fgets(line, sizeof line, f) ? strlen(line) : 0;
    fclose(f);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' ' || line[n - 1] == '\t')) line[--n] = 0;
    if (n < 16)
        return srv_err(err, SRV_INVALID_ARGUMENT, "--admin_token_file: '%s' holds a token of %zu characters; use at least 16",
                       o->admin_token_file, n);
    o->admin_token = strdup(line);
    return o->admin_token ? SRV_OK : srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
}

srv_code srv_options_parse(int argc, char **argv, srv_options *o, srv_error *err) {
    memset(o, 0, sizeof *o);
    o->grpc_port = 8500;
    o->rest_port = 8501;
    o->file_system_poll_wait_seconds = 1;
    o->rest_api_timeout_in_ms = 30000;
    o->max_loop_iterations = 1000000;
    o->max_body_bytes = 64 << 20;
    o->connection_limit = 2048;
    o->connection_timeout_s = 30;
    o->drain_seconds = 30;
    o->header_timeout_s = 10;
    o->per_ip_connection_limit = 256;
    o->model_load_timeout_s = 600;
    o->instances_per_version = -1;
    o->grpc_max_receive_bytes = 64 << 20;
    o->admin_port = 8502;
    o->max_upload_bytes = (int64_t)1 << 30;    /* 1 GiB per dataset upload */
    o->dataset_quota_bytes = (int64_t)10 << 30; /* 10 GiB of datasets in all */
    o->max_concurrent_jobs = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0)
            return srv_err(err, SRV_INVALID_ARGUMENT, "unexpected argument '%s' (flags look like --name=value)", a);
        a += 2;
        const char *eq = strchr(a, '=');
        size_t nlen = eq ? (size_t)(eq - a) : strlen(a);
        const opt_def *d = NULL;
        for (size_t k = 0; k < sizeof opt_table / sizeof opt_table[0]; k++)
            if (strlen(opt_table[k].name) == nlen && strncmp(opt_table[k].name, a, nlen) == 0) d = &opt_table[k];
        if (!d) return srv_err(err, SRV_INVALID_ARGUMENT, "unknown flag '--%.*s'", (int)nlen, a);
        const char *v = eq ? eq + 1 : NULL;
        if (!v) {
            if (d->kind == OPT_BOOL && (i + 1 >= argc || (strcmp(argv[i + 1], "true") && strcmp(argv[i + 1], "false")))) v = "true";
            else if (i + 1 < argc) v = argv[++i];
            else return srv_err(err, SRV_INVALID_ARGUMENT, "--%s needs a value", d->name);
        }
        srv_code c = opt_set(o, d, v, err);
        if (c != SRV_OK) return c;
    }
    if (o->model_config_file && o->model_base_path)
        return srv_err(err, SRV_INVALID_ARGUMENT, "--model_config_file and --model_base_path are mutually exclusive");
    if (!o->model_config_file && !o->model_base_path) {
        const char *env_base = getenv("MODEL_BASE_PATH"), *env_name = getenv("MODEL_NAME");
        if (env_base && *env_base) {
            /* TF Serving's image: MODEL_BASE_PATH is the parent, the model lives in $MODEL_BASE_PATH/$MODEL_NAME */
            const char *name = (env_name && *env_name) ? env_name : "model";
            size_t n = strlen(env_base) + strlen(name) + 2;
            o->model_base_path = malloc(n);
            if (!o->model_base_path) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
            snprintf(o->model_base_path, n, "%s/%s", env_base, name);
            if (!o->model_name) o->model_name = strdup(name);
        } else {
            return srv_err(err, SRV_INVALID_ARGUMENT,
                           "no model to serve: give --model_base_path (and --model_name), --model_config_file, "
                           "or set MODEL_BASE_PATH/MODEL_NAME");
        }
    }
    if (!o->model_name) o->model_name = strdup(getenv("MODEL_NAME") && *getenv("MODEL_NAME") ? getenv("MODEL_NAME") : "default");
    if (!o->model_name) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    if (o->rest_port > 65535 || o->grpc_port > 65535 || o->admin_port > 65535) return srv_err(err, SRV_INVALID_ARGUMENT, "ports must be <= 65535");
    if (o->grpc_max_receive_bytes < 1024 || o->grpc_max_receive_bytes > INT32_MAX)
        return srv_err(err, SRV_INVALID_ARGUMENT, "--grpc_max_receive_message_bytes must be 1024..%d", INT32_MAX);
    if (o->max_body_bytes < 1024) return srv_err(err, SRV_INVALID_ARGUMENT, "--rest_api_max_body_bytes must be >= 1024");
    if (o->header_timeout_s < 1) return srv_err(err, SRV_INVALID_ARGUMENT, "--rest_api_header_timeout_seconds must be >= 1");
    if (o->per_ip_connection_limit < 1)
        return srv_err(err, SRV_INVALID_ARGUMENT, "--rest_api_per_ip_connection_limit must be >= 1");
    if (o->instances_per_version != -1 && (o->instances_per_version < 1 || o->instances_per_version > SRV_MAX_INSTANCES))
        return srv_err(err, SRV_INVALID_ARGUMENT, "--instances_per_version must be 1..%d, got %d", SRV_MAX_INSTANCES,
                       o->instances_per_version);
    if (o->model_load_timeout_s <= 0) return srv_err(err, SRV_INVALID_ARGUMENT, "--model_load_timeout_seconds must be > 0");
    if (o->max_loop_iterations < 1) return srv_err(err, SRV_INVALID_ARGUMENT, "--max_loop_iterations must be >= 1");
    if (o->log_format && strcmp(o->log_format, "text") != 0 && strcmp(o->log_format, "json") != 0)
        return srv_err(err, SRV_INVALID_ARGUMENT, "--log_format: expected text or json, got '%s'", o->log_format);
    if (o->model_control_mode && strcmp(o->model_control_mode, "poll") != 0 &&
        strcmp(o->model_control_mode, "explicit") != 0)
        return srv_err(err, SRV_INVALID_ARGUMENT, "--model_control_mode: expected poll or explicit, got '%s'",
                       o->model_control_mode);
    if (!o->device) { /* the flag, else env TENSORD_DEVICE, else auto */
        const char *env = getenv("TENSORD_DEVICE");
        if (!(o->device = strdup(env && *env ? env : "auto"))) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    }
    srv_code dc = srv_device_spec_check(o->device, "--device", NULL, err);
    if (dc != SRV_OK) return dc;
    return srv_options_admin_token(o, err);
}

void srv_options_free(srv_options *o) {
    free(o->rest_host);
    free(o->grpc_host);
    free(o->ssl_config_file);
    free(o->admin_bind);
    free(o->model_root);
    free(o->state_dir);
    free(o->model_name);
    free(o->model_base_path);
    free(o->model_config_file);
    free(o->batching_parameters_file);
    free(o->monitoring_config_file);
    free(o->log_format);
    free(o->model_control_mode);
    free(o->admin_token_file);
    free(o->admin_token);
    free(o->device);
    memset(o, 0, sizeof *o);
}

/* `auto_rollback { max_error_rate: 0.02 max_p99_ratio: 2.0 window_s: 30 min_requests: 200 }` inside `traffic`, with
 * the admin API's bounds and defaults (at least one of the two limits; window 30 s, 200 requests). */
static srv_code cfg_auto_rollback(const srv_tp *t, const char *what, srv_model_config *c, srv_error *err) {
    const srv_tp *a = srv_tp_get(t, "auto_rollback", 0);
    if (!a) return SRV_OK;
    static const struct { const char *name; double lo, hi; } f[4] = {
        {"max_error_rate", 0, 1}, {"max_p99_ratio", 1, 1000}, {"window_s", 1, 120}, {"min_requests", 1, 1e9}};
    double v[4] = {-1, -1, 30, 200};
    for (int k = 0; k < a->nkids; k++) {
        int i = 0;
        while (i < 4 && strcmp(a->kids[k].name, f[i].name) != 0) i++;
        if (i == 4)
            return srv_err(err, SRV_INVALID_ARGUMENT, "%s: model '%s': auto_rollback has no field '%.100s' (max_error_rate, "
                           "max_p99_ratio, window_s, min_requests)", what, c->name, a->kids[k].name);
    }
    for (int i = 0; i < 4; i++) {
        int rc = srv_tp_double(a, f[i].name, &v[i], err);
        if (rc == -2) return srv_err(err, SRV_INVALID_ARGUMENT, "%s: model '%s': auto_rollback: %s", what, c->name, err->msg);
        if (rc == 0 && !(v[i] >= f[i].lo && v[i] <= f[i].hi))
            return srv_err(err, SRV_INVALID_ARGUMENT, "%s: model '%s': auto_rollback %s must be %g..%g, got %g", what,
                           c->name, f[i].name, f[i].lo, f[i].hi, v[i]);
    }
    if (v[0] < 0 && v[1] < 0)
        return srv_err(err, SRV_INVALID_ARGUMENT, "%s: model '%s': auto_rollback needs max_error_rate or max_p99_ratio",
                       what, c->name);
    c->ar_on = 1;
    c->ar_max_error_rate = v[0] >= 0 ? v[0] : 1.0; /* 1: no error rule */
    c->ar_max_p99_ratio = v[1] >= 0 ? v[1] : 0.0;  /* 0: no latency rule */
    c->ar_window_s = (int)v[2];
    c->ar_min_requests = (int)v[3];
    return SRV_OK;
}

/* tensord's `traffic { routes { key: 'stable' value: 90 } ... sticky_header: 'X-User-Id' shadow: 'canary' }` in a
 * model's config (JSON: "traffic": {"routes": {"stable": 90, ...}, ...}); the registry checks the labels. */
static srv_code cfg_traffic(const srv_tp *m, const char *what, srv_model_config *c, srv_error *err) {
    const srv_tp *t = srv_tp_get(m, "traffic", 0);
    if (!t) return SRV_OK;
    int nr = srv_tp_count(t, "routes"), total = 0;
    for (int i = 0; i < nr; i++) {
        const srv_tp *r = srv_tp_get(t, "routes", i);
        total += srv_tp_get(r, "key", 0) ? 1 : r->nkids;
    }
    if (total == 0) return srv_err(err, SRV_INVALID_ARGUMENT, "%s: model '%s': traffic has no routes", what, c->name);
    c->route_labels = calloc((size_t)total, sizeof *c->route_labels);
    c->route_weights = calloc((size_t)total, sizeof *c->route_weights);
    if (!c->route_labels || !c->route_weights) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    for (int i = 0; i < nr; i++) {
        const srv_tp *r = srv_tp_get(t, "routes", i);
        int kv = srv_tp_get(r, "key", 0) != NULL;
        for (int k = 0; k < (kv ? 1 : r->nkids); k++) {
            const char *key = kv ? srv_tp_str(r, "key") : r->kids[k].name;
            const char *val = kv ? srv_tp_str(r, "value") : r->kids[k].scalar;
            char *end = NULL;
            long long x = val ? strtoll(val, &end, 10) : -1;
            if (!key || !srv_name_valid(key))
                return srv_err(err, SRV_INVALID_ARGUMENT, "%s: model '%s': traffic route '%s' must be a version label",
                               what, c->name, key ? key : "");
            if (!val || *end || x < 0 || x > 1000000)
                return srv_err(err, SRV_INVALID_ARGUMENT, "%s: model '%s': traffic route '%s' needs a weight 0..1000000",
                               what, c->name, key);
            if (!(c->route_labels[c->nroutes] = strdup(key))) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
            c->route_weights[c->nroutes++] = (int)x;
        }
    }
    const char *sticky = srv_tp_str(t, "sticky_header"), *shadow = srv_tp_str(t, "shadow");
    if (sticky && *sticky) {
        for (const char *p = sticky; *p; p++)
            if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '_'))
                return srv_err(err, SRV_INVALID_ARGUMENT, "%s: model '%s': sticky_header '%.100s' is not a header name",
                               what, c->name, sticky);
        if (!(c->sticky_header = strdup(sticky))) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    }
    if (shadow && *shadow && !(c->shadow = strdup(shadow))) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    return cfg_auto_rollback(t, what, c, err);
}

/* tensord's `device: 'cuda:0,cuda:1'` (also repeated, or a JSON array): where the model's versions run, instead of
 * --device. Checked now (server/device.h); a device missing on this machine fails the model's loads instead. */
static srv_code cfg_device(const srv_tp *m, const char *what, srv_model_config *c, srv_error *err) {
    int nd = srv_tp_count(m, "device");
    if (nd == 0) return SRV_OK;
    char spec[SRV_DEVICE_SPEC_MAX + 1] = "", w[600];
    size_t len = 0;
    for (int i = 0; i < nd; i++) {
        const srv_tp *f = srv_tp_get(m, "device", i);
        if (!f->scalar || !*f->scalar)
            return srv_err(err, SRV_INVALID_ARGUMENT, "%s: model '%s': device must be a device name such as \"cpu\", "
                           "\"cuda:0\" or \"cuda:0,cuda:1\", got '%s'", what, c->name, f->scalar ? "" : "{...}");
        int k = snprintf(spec + len, sizeof spec - len, "%s%s", i ? "," : "", f->scalar);
        if (k < 0 || (size_t)k >= sizeof spec - len)
            return srv_err(err, SRV_INVALID_ARGUMENT, "%s: model '%s': device list longer than %d characters", what,
                           c->name, SRV_DEVICE_SPEC_MAX);
        len += (size_t)k;
    }
    snprintf(w, sizeof w, "%.400s: model '%s'", what, c->name);
    srv_code rc = srv_device_spec_check(spec, w, NULL, err);
    if (rc != SRV_OK) return rc;
    return (c->device = strdup(spec)) ? SRV_OK : srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
}

static srv_code cfg_one(const srv_tp *m, const char *what, srv_model_config *c, srv_error *err) {
    memset(c, 0, sizeof *c);
    const char *name = srv_tp_str(m, "name"), *base = srv_tp_str(m, "base_path"), *plat = srv_tp_str(m, "model_platform");
    if (!name || !*name) return srv_err(err, SRV_INVALID_ARGUMENT, "%s: a config has no name", what);
    if (!srv_name_valid(name))
        return srv_err(err, SRV_INVALID_ARGUMENT, "%s: model name '%s' must match [A-Za-z0-9_.-]+ and not be '.' or '..'",
                       what, name);
    if (!base || !*base) return srv_err(err, SRV_INVALID_ARGUMENT, "%s: model '%s' has no base_path", what, name);
    c->name = strdup(name);
    c->base_path = strdup(base);
    c->platform = strdup(plat ? plat : "onnx");
    c->policy = SRV_POLICY_LATEST;
    c->latest_n = 1;
    if (!c->name || !c->base_path || !c->platform) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    const srv_tp *pol = srv_tp_get(m, "model_version_policy", 0);
    if (pol) {
        const srv_tp *p;
        if ((p = srv_tp_get(pol, "latest", 0))) {
            int64_t n = 1;
            if (srv_tp_int(p, "num_versions", &n, err) == -2) return SRV_INVALID_ARGUMENT;
            if (n < 1 || n > 1000)
                return srv_err(err, SRV_INVALID_ARGUMENT, "%s: model '%s': latest.num_versions must be 1..1000", what, name);
            c->latest_n = (int)n;
        } else if (srv_tp_get(pol, "all", 0)) {
            c->policy = SRV_POLICY_ALL;
        } else if ((p = srv_tp_get(pol, "specific", 0))) {
            c->policy = SRV_POLICY_SPECIFIC;
            int n = srv_tp_count(p, "versions");
            if (n == 0) return srv_err(err, SRV_INVALID_ARGUMENT, "%s: model '%s': specific policy lists no versions", what, name);
            c->versions = calloc((size_t)n, sizeof *c->versions);
            if (!c->versions) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
            for (int i = 0; i < n; i++) {
                const srv_tp *v = srv_tp_get(p, "versions", i);
                char *end = NULL;
                long long x = v->scalar ? strtoll(v->scalar, &end, 10) : -1;
                if (!v->scalar || *end || x < 1)
                    return srv_err(err, SRV_INVALID_ARGUMENT, "%s: model '%s': version '%s' is not a positive integer", what,
                                   name, v->scalar ? v->scalar : "{...}");
                c->versions[c->nversions++] = x;
            }
        } else {
            return srv_err(err, SRV_INVALID_ARGUMENT, "%s: model '%s': model_version_policy needs latest, all or specific",
                           what, name);
        }
    }
    int64_t ic = 0;
    int icr = srv_tp_int(m, "instance_count", &ic, err); /* tensord's: Triton's instance_group { count } */
    if (icr == -2 || (icr == 0 && (ic < 1 || ic > SRV_MAX_INSTANCES))) {
        const srv_tp *f = srv_tp_get(m, "instance_count", 0);
        return srv_err(err, SRV_INVALID_ARGUMENT, "%s: model '%s': instance_count must be an integer 1..%d, got '%s'",
                       what, name, SRV_MAX_INSTANCES, f->scalar ? f->scalar : "{...}");
    }
    c->instance_count = icr == 0 ? (int)ic : 0;
    const srv_tp *pf = srv_tp_get(m, "precision", 0); /* tensord's: every version at this precision */
    if (pf) {
        eng_precision prec;
        if (!pf->scalar || eng_precision_parse(pf->scalar, &prec) != ENG_STATUS_OK)
            return srv_err(err, SRV_INVALID_ARGUMENT, "%s: model '%s': precision must be \"fp32\", \"bf16\", \"fp16\" or \"int8\", got '%.40s'",
                           what, name, pf->scalar ? pf->scalar : "{...}");
        c->precision = (int)prec;
        c->precision_set = 1;
    }
    srv_code dc = cfg_device(m, what, c, err);
    if (dc != SRV_OK) return dc;
    int nl = srv_tp_count(m, "version_labels");
    /* text format: repeated { key: 'a' value: 1 }; JSON map: "version_labels": {"a": 1, ...} */
    int total = 0;
    for (int i = 0; i < nl; i++) {
        const srv_tp *l = srv_tp_get(m, "version_labels", i);
        total += srv_tp_get(l, "key", 0) ? 1 : l->nkids;
    }
    if (total) {
        c->label_names = calloc((size_t)total, sizeof *c->label_names);
        c->label_versions = calloc((size_t)total, sizeof *c->label_versions);
        if (!c->label_names || !c->label_versions) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    }
    for (int i = 0; i < nl; i++) {
        const srv_tp *l = srv_tp_get(m, "version_labels", i);
        int kv = srv_tp_get(l, "key", 0) != NULL;
        for (int k = 0; k < (kv ? 1 : l->nkids); k++) {
            const char *key = kv ? srv_tp_str(l, "key") : l->kids[k].name;
            const char *val = kv ? srv_tp_str(l, "value") : l->kids[k].scalar;
            char *end = NULL;
            long long x = val ? strtoll(val, &end, 10) : -1;
            if (!key || !srv_name_valid(key))
                return srv_err(err, SRV_INVALID_ARGUMENT, "%s: model '%s': label '%s' must match [A-Za-z0-9_.-]+", what,
                               name, key ? key : "");
            if (!val || *end || x < 1)
                return srv_err(err, SRV_INVALID_ARGUMENT, "%s: model '%s': label '%s' needs a positive version", what, name, key);
            for (int j = 0; j < c->nlabels; j++)
                if (strcmp(c->label_names[j], key) == 0)
                    return srv_err(err, SRV_INVALID_ARGUMENT, "%s: model '%s': label '%s' given twice", what, name, key);
            c->label_names[c->nlabels] = strdup(key);
            c->label_versions[c->nlabels++] = x;
        }
    }
    return cfg_traffic(m, what, c, err);
}

/* The models of a parsed model server config (root holds model_config_list); what names it in errors. */
static srv_code cfg_models(const srv_tp *root, const char *what, srv_model_config **cfgs, int *n, srv_error *err) {
    *cfgs = NULL;
    *n = 0;
    srv_code c = SRV_OK;
    const srv_tp *list = srv_tp_get(root, "model_config_list", 0);
    if (!list) return srv_err(err, SRV_INVALID_ARGUMENT, "%s: no model_config_list", what);
    int cnt = srv_tp_count(list, "config");
    srv_model_config *v = calloc((size_t)cnt + 1, sizeof *v);
    if (!v) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    for (int i = 0; i < cnt && c == SRV_OK; i++) {
        c = cfg_one(srv_tp_get(list, "config", i), what, &v[i], err);
        for (int j = 0; c == SRV_OK && j < i; j++)
            if (strcmp(v[j].name, v[i].name) == 0) c = srv_err(err, SRV_INVALID_ARGUMENT, "%s: model '%s' configured twice", what, v[i].name);
    }
    if (c != SRV_OK) {
        for (int i = 0; i < cnt; i++) srv_model_config_free(&v[i]);
        free(v);
        return c;
    }
    *cfgs = v;
    *n = cnt;
    return SRV_OK;
}

srv_code srv_config_load_models(const char *path, srv_model_config **cfgs, int *n, srv_error *err) {
    *cfgs = NULL;
    *n = 0;
    srv_tp *root = NULL;
    srv_code c = srv_tp_parse_file(path, &root, err);
    if (c != SRV_OK) return c;
    c = cfg_models(root, path, cfgs, n, err);
    srv_tp_free(&root);
    return c;
}

srv_code srv_config_parse_models(const char *text, size_t len, const char *what, srv_model_config **cfgs, int *n,
                                 srv_error *err) {
    *cfgs = NULL;
    *n = 0;
    srv_tp *root = NULL;
    srv_code c = srv_tp_parse_text(text, len, what, &root, err);
    if (c != SRV_OK) return c;
    c = cfg_models(root, what, cfgs, n, err);
    srv_tp_free(&root);
    return c;
}

srv_code srv_config_models(const srv_options *o, srv_model_config **cfgs, int *n, srv_error *err) {
    if (o->model_config_file) return srv_config_load_models(o->model_config_file, cfgs, n, err);
    *cfgs = NULL;
    *n = 0;
    if (!srv_name_valid(o->model_name))
        return srv_err(err, SRV_INVALID_ARGUMENT, "model name '%s' must match [A-Za-z0-9_.-]+", o->model_name);
    srv_model_config *c = calloc(1, sizeof *c);
    if (!c) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    c->name = strdup(o->model_name);
    c->base_path = strdup(o->model_base_path);
    c->platform = strdup("onnx");
    c->policy = SRV_POLICY_LATEST;
    c->latest_n = 1;
    if (!c->name || !c->base_path || !c->platform) {
        srv_model_config_free(c);
        free(c);
        return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    }
    *cfgs = c;
    *n = 1;
    return SRV_OK;
}

srv_code srv_config_load_batching(const char *path, srv_batch_opts *o, srv_error *err) {
    srv_tp *root = NULL;
    srv_code c = srv_tp_parse_file(path, &root, err);
    if (c != SRV_OK) return c;
    int64_t v;
    int r;
#define BATCH_FIELD(f)                                                                                          \
    if ((r = srv_tp_wrapped_int(root, #f, &v, err)) == -2) goto bad;                                            \
    if (r == 0) {                                                                                               \
        if (v < 0) {                                                                                            \
            srv_err(err, SRV_INVALID_ARGUMENT, "%s: " #f " must be >= 0", path);                                \
            goto bad;                                                                                           \
        }                                                                                                       \
        o->f = v;                                                                                               \
    }
    BATCH_FIELD(max_batch_size)
    BATCH_FIELD(batch_timeout_micros)
    BATCH_FIELD(max_enqueued_batches)
    BATCH_FIELD(num_batch_threads)
#undef BATCH_FIELD
    int na = srv_tp_count(root, "allowed_batch_sizes");
    if (na > (int)(sizeof o->allowed_batch_sizes / sizeof o->allowed_batch_sizes[0])) {
        srv_err(err, SRV_INVALID_ARGUMENT, "%s: at most 32 allowed_batch_sizes", path);
        goto bad;
    }
    o->nallowed = 0;
    for (int i = 0; i < na; i++) {
        const srv_tp *f = srv_tp_get(root, "allowed_batch_sizes", i);
        char *end = NULL;
        long long x = f->scalar ? strtoll(f->scalar, &end, 10) : -1;
        if (!f->scalar || *end || x < 1 || (o->nallowed && x <= o->allowed_batch_sizes[o->nallowed - 1])) {
            srv_err(err, SRV_INVALID_ARGUMENT, "%s: allowed_batch_sizes must be increasing positive integers", path);
            goto bad;
        }
        o->allowed_batch_sizes[o->nallowed++] = x;
    }
    if (o->max_batch_size < 1 || o->max_enqueued_batches < 1 || o->num_batch_threads < 1) {
        srv_err(err, SRV_INVALID_ARGUMENT, "%s: max_batch_size, max_enqueued_batches and num_batch_threads must be >= 1", path);
        goto bad;
    }
    if (o->nallowed && o->allowed_batch_sizes[o->nallowed - 1] != o->max_batch_size) {
        srv_err(err, SRV_INVALID_ARGUMENT, "%s: the last allowed_batch_sizes entry (%lld) must equal max_batch_size (%lld)",
                path, (long long)o->allowed_batch_sizes[o->nallowed - 1], (long long)o->max_batch_size);
        goto bad;
    }
    srv_tp_free(&root);
    return SRV_OK;
bad:
    srv_tp_free(&root);
    return SRV_INVALID_ARGUMENT;
}

srv_code srv_config_load_monitoring(const char *path, int *enable, char **metrics_path, srv_error *err) {
    srv_tp *root = NULL;
    srv_code c = srv_tp_parse_file(path, &root, err);
    if (c != SRV_OK) return c;
    const srv_tp *p = srv_tp_get(root, "prometheus_config", 0);
    *enable = 0;
    if (p) {
        if (srv_tp_bool(p, "enable", enable, err) == -2) {
            srv_tp_free(&root);
            return SRV_INVALID_ARGUMENT;
        }
        const char *mp = srv_tp_str(p, "path");
        if (mp && *mp) {
            if (mp[0] != '/' || strstr(mp, "..")) {
                srv_tp_free(&root);
                return srv_err(err, SRV_INVALID_ARGUMENT, "%s: prometheus_config.path must start with '/'", path);
            }
            free(*metrics_path);
            *metrics_path = strdup(mp);
        }
    }
    srv_tp_free(&root);
    return SRV_OK;
}

/* A protobuf string as a text-format string literal. */
void srv_config_quote(srv_buf *b, const char *s) {
    srv_buf_puts(b, "\"");
    for (; s && *s; s++) {
        char e[3] = {'\\', 0, 0};
        switch (*s) {
        case '"': e[1] = '"'; break;
        case '\\': e[1] = '\\'; break;
        case '\n': e[1] = 'n'; break;
        case '\r': e[1] = 'r'; break;
        case '\t': e[1] = 't'; break;
        default: e[0] = *s; break;
        }
        srv_buf_puts(b, e);
    }
    srv_buf_puts(b, "\"");
}
