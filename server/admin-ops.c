/* admin-ops.c - the calls the server hands the admin room (admin/admin.h's adm_ops), on the registry's per-model
 * calls: each change takes a copy of one model's config, changes it, and hands it back to srv_registry_put_model
 * (which validates it first and applies only that model), so an invalid change leaves what serves untouched and
 * no other model is touched. A model added here is kept only if a version of it became AVAILABLE; otherwise it is
 * removed again. A change the state cannot keep is undone. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "admin-ops.h"
#include "config.h"
#include "json.h"
#include "canary.h"
#include "log.h"
#include "metrics.h"

/* One admin change at a time, under the context's lock: two calls never interleave their read-change-apply. */
#define ADMIN_LOCKED(ctx, call)                                                                                  \
    ({                                                                                                           \
        srv_admin_ctx *a_ = (ctx);                                                                               \
        pthread_mutex_lock(&a_->mu);                                                                             \
        srv_code rc_ = (call);                                                                                   \
        pthread_mutex_unlock(&a_->mu);                                                                           \
        rc_;                                                                                                     \
    })

static void cfgs_free(srv_model_config *c, int n) {
    for (int i = 0; i < n; i++) srv_model_config_free(&c[i]);
    free(c);
}

static int cfg_find(const srv_model_config *c, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(c[i].name, name) == 0) return i;
    return -1;
}

static void ar_json(srv_buf *b, const srv_model_config *m) {
    if (!m->ar_on) {
        srv_buf_puts(b, "null");
        return;
    }
    srv_buf_printf(b, "{\"max_error_rate\":%g", m->ar_max_error_rate); /* 1: no error rule */
    if (m->ar_max_p99_ratio > 0) srv_buf_printf(b, ",\"max_p99_ratio\":%g", m->ar_max_p99_ratio); /* absent: none */
    srv_buf_printf(b, ",\"window_s\":%d,\"min_requests\":%d}", m->ar_window_s, m->ar_min_requests);
}

static srv_admin_hist *hist_of(srv_admin_ctx *a, const char *model, int create);

static void traffic_json(srv_buf *b, srv_admin_ctx *a, const srv_model_config *m) {
    srv_buf_puts(b, "{\"routes\":{");
    for (int k = 0; k < m->nroutes; k++) {
        if (k) srv_buf_puts(b, ",");
        srv_buf_json_str(b, m->route_labels[k]);
        srv_buf_printf(b, ":%d", m->route_weights[k]);
    }
    srv_buf_puts(b, "},\"sticky_header\":");
    if (m->sticky_header) srv_buf_json_str(b, m->sticky_header);
    else srv_buf_puts(b, "null");
    srv_buf_puts(b, ",\"shadow\":");
    if (m->shadow) srv_buf_json_str(b, m->shadow);
    else srv_buf_puts(b, "null");
    srv_buf_puts(b, ",\"auto_rollback\":");
    ar_json(b, m);
    srv_buf_puts(b, ",\"last_auto_rollback\":");
    pthread_mutex_lock(&a->rmu);
    srv_admin_hist *h = hist_of(a, m->name, 0);
    if (h && h->reason[0]) {
        srv_buf_printf(b, "{\"unix_ms\":%lld,\"reason\":", (long long)h->reason_ms);
        srv_buf_json_str(b, h->reason);
        srv_buf_puts(b, "}");
    } else {
        srv_buf_puts(b, "null");
    }
    pthread_mutex_unlock(&a->rmu);
    srv_buf_puts(b, "}");
}

/* ---- the kept state (--state_dir) ---- */

static void policy_json(const srv_model_config *m, char *out, size_t cap) {
    if (m->policy == SRV_POLICY_ALL) {
        snprintf(out, cap, "{\"all\":{}}");
    } else if (m->policy == SRV_POLICY_SPECIFIC) {
        size_t k = (size_t)snprintf(out, cap, "{\"specific\":{\"versions\":[");
        for (int i = 0; i < m->nversions && k < cap; i++)
            k += (size_t)snprintf(out + k, cap - k, "%s%lld", i ? "," : "", (long long)m->versions[i]);
        if (k < cap) snprintf(out + k, cap - k, "]}}");
    } else {
        snprintf(out, cap, "{\"latest\":{\"num_versions\":%d}}", m->latest_n > 0 ? m->latest_n : 1);
    }
}

/* Write the model's labels and traffic (and, when added, its row) to the state; no state: nothing to do. */
static srv_code persist_model(srv_admin_ctx *a, const srv_model_config *m, int added, srv_error *err) {
    if (!a->state) return SRV_OK;
    if (added) {
        char pj[4096];
        policy_json(m, pj, sizeof pj);
        if (adm_state_put_model(a->state, m->name, m->base_path, pj, err) != SRV_OK) return err->code;
    }
    for (int k = 0; k < m->nlabels; k++)
        if (adm_state_put_label(a->state, m->name, m->label_names[k], m->label_versions[k], err) != SRV_OK) return err->code;
    adm_route *r = m->nroutes ? calloc((size_t)m->nroutes, sizeof *r) : NULL;
    if (m->nroutes && !r) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    for (int k = 0; k < m->nroutes; k++) r[k] = (adm_route){m->route_labels[k], m->route_weights[k]};
    srv_buf arb = {0};
    if (m->ar_on) ar_json(&arb, m);
    adm_traffic t = {.routes = r, .nroutes = m->nroutes, .sticky_header = m->sticky_header, .shadow = m->shadow,
                     .json = arb.p};
    srv_code rc = adm_state_put_traffic(a->state, m->name, &t, err);
    free(arb.p);
    free(r);
    return rc;
}

static void persist_event(srv_admin_ctx *a, const char *model, const char *event, const char *detail) {
    srv_error e = {0};
    if (a->state && adm_state_add_event(a->state, model, event, detail, &e) != SRV_OK)
        srv_log(SRV_LOG_ERROR, "admin", model, 0, "could not keep the %s event: %s", event, e.msg);
}

static srv_code ops_list(void *ctx, char **json, srv_error *err) {
    srv_admin_ctx *a = ctx;
    srv_model_config *c = NULL;
    int n = 0;
    if (srv_registry_get_config(a->reg, &c, &n, err) != SRV_OK) return err->code;
    srv_buf b = {0};
    srv_buf_puts(&b, "{\"models\":[");
    for (int i = 0; i < n; i++) {
        srv_buf_puts(&b, i ? ",{\"name\":" : "{\"name\":");
        srv_buf_json_str(&b, c[i].name);
        srv_buf_puts(&b, ",\"base_path\":");
        srv_buf_json_str(&b, c[i].base_path);
        srv_buf_printf(&b, ",\"version_policy\":\"%s\",\"labels\":{",
                       c[i].policy == SRV_POLICY_ALL ? "all" : c[i].policy == SRV_POLICY_SPECIFIC ? "specific" : "latest");
        for (int k = 0; k < c[i].nlabels; k++) {
            if (k) srv_buf_puts(&b, ",");
            srv_buf_json_str(&b, c[i].label_names[k]);
            srv_buf_printf(&b, ":%lld", (long long)c[i].label_versions[k]);
        }
        srv_buf_puts(&b, "},\"versions\":[");
        srv_version_status *st = NULL;
        int ns = 0;
        srv_error e2 = {0};
        if (srv_registry_status(a->reg, c[i].name, 0, NULL, &st, &ns, &e2) == SRV_OK)
            for (int k = 0; k < ns; k++) {
                srv_buf_printf(&b, "%s{\"version\":%lld,\"state\":\"%s\"}", k ? "," : "", (long long)st[k].version,
                               srv_state_name(st[k].state));
            }
        srv_status_free(st, ns);
        srv_buf_puts(&b, "],\"traffic\":");
        traffic_json(&b, a, &c[i]);
        srv_buf_puts(&b, "}");
    }
    srv_buf_puts(&b, "]}");
    cfgs_free(c, n);
    if (b.oom) {
        free(b.p);
        return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    }
    *json = b.p;
    return SRV_OK;
}

/* base is inside --model_root (both resolved: symlinks followed). */
static srv_code check_root(const srv_admin_ctx *a, const char *base, srv_error *err) {
    if (!a->model_root) return SRV_OK;
    char rroot[PATH_MAX], rbase[PATH_MAX];
    if (!realpath(a->model_root, rroot)) return srv_err(err, SRV_INTERNAL, "--model_root '%s' cannot be resolved", a->model_root);
    if (!realpath(base, rbase))
        return srv_err(err, SRV_NOT_FOUND, "base_path '%.300s' does not exist (it must be inside --model_root '%s')", base,
                       a->model_root);
    size_t n = strlen(rroot);
    if (strncmp(rbase, rroot, n) != 0 || (rbase[n] != '/' && rbase[n] != '\0'))
        return srv_err(err, SRV_PERMISSION_DENIED, "base_path '%.300s' is outside --model_root '%s'", base, a->model_root);
    return SRV_OK;
}

static srv_code ops_add_locked(void *ctx, const char *name, const char *base, const char *policy_text, srv_error *err) {
    srv_admin_ctx *a = ctx;
    if (check_root(a, base, err) != SRV_OK) return err->code;
    if (srv_registry_has_model(a->reg, name)) return srv_err(err, SRV_ALREADY_EXISTS, "model '%s' is served already", name);
    srv_buf t = {0};
    srv_buf_puts(&t, "model_config_list { config { name: ");
    srv_config_quote(&t, name);
    srv_buf_puts(&t, " base_path: ");
    srv_config_quote(&t, base);
    srv_buf_printf(&t, " %s } }\n", policy_text ? policy_text : "");
    srv_model_config *add = NULL;
    int nadd = 0;
    srv_code rc = t.oom ? srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory")
                        : srv_config_parse_models(t.p, t.len, "admin: new model", &add, &nadd, err);
    free(t.p);
    if (rc == SRV_OK) rc = srv_registry_put_model(a->reg, &add[0], err);
    if (rc == SRV_OK) {
        srv_registry_poll(a->reg);
        rc = srv_registry_check_available(a->reg, &add[0], 1, err);
    }
    if (rc == SRV_OK) rc = persist_model(a, &add[0], 1, err);
    if (rc != SRV_OK && rc != SRV_ALREADY_EXISTS && srv_registry_has_model(a->reg, name)) {
        srv_error e2 = {0}; /* a model that does not load (or cannot be kept) is not added */
        srv_registry_remove_model(a->reg, name, &e2);
    }
    if (rc == SRV_OK) srv_log(SRV_LOG_INFO, "admin", name, 0, "model added from %s", base);
    cfgs_free(add, nadd);
    return rc;
}

static srv_code ops_add(void *ctx, const char *name, const char *base, const char *policy_text, srv_error *err) {
    return ADMIN_LOCKED(ctx, ops_add_locked(ctx, name, base, policy_text, err));
}

/* Change one model with fn, then apply it alone (srv_registry_put_model) and keep it in the state; a change that
 * cannot be kept is undone. NOT_FOUND when the model is not served. */
static srv_code change(srv_admin_ctx *a, const char *model, srv_code (*fn)(srv_model_config *m, const void *arg,
                                                                          srv_error *err),
                       const void *arg, srv_error *err) {
    srv_model_config m, before;
    if (srv_registry_get_model(a->reg, model, &before, err) != SRV_OK) return err->code;
    srv_code rc = srv_model_config_copy(&m, &before) == 0 ? SRV_OK
                                                          : srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    if (rc == SRV_OK) rc = fn(&m, arg, err);
    if (rc == SRV_OK) rc = srv_registry_put_model(a->reg, &m, err);
    if (rc == SRV_OK && persist_model(a, &m, 0, err) != SRV_OK) { /* not kept: not applied either */
        srv_error e2 = {0};
        srv_registry_put_model(a->reg, &before, &e2);
        rc = err->code != SRV_OK ? err->code : SRV_INTERNAL;
    }
    srv_model_config_free(&before);
    srv_model_config_free(&m);
    return rc;
}

static srv_code ops_remove_locked(void *ctx, const char *name, srv_error *err) {
    srv_admin_ctx *a = ctx;
    srv_code rc = srv_registry_remove_model(a->reg, name, err);
    if (rc == SRV_OK && a->state && adm_state_remove_model(a->state, name, err) != SRV_OK) {
        srv_log(SRV_LOG_ERROR, "admin", name, 0, "removed, but the state could not keep that: %s", err->msg);
        rc = err->code;
    }
    if (rc == SRV_OK) srv_log(SRV_LOG_INFO, "admin", name, 0, "model removed");
    return rc;
}

static srv_code ops_remove(void *ctx, const char *name, srv_error *err) {
    return ADMIN_LOCKED(ctx, ops_remove_locked(ctx, name, err));
}

typedef struct label_arg {
    const char *label;
    int64_t version;
} label_arg;

static srv_code set_label_fn(srv_model_config *m, const void *arg, srv_error *err) {
    const label_arg *l = arg;
    return srv_model_config_set_label(m, l->label, l->version, err);
}

static srv_code ops_set_label_locked(void *ctx, const char *model, const char *label, int64_t version, srv_error *err) {
    label_arg l = {label, version};
    srv_code rc = change(ctx, model, set_label_fn, &l, err);
    if (rc == SRV_OK) srv_log(SRV_LOG_INFO, "admin", model, version, "label '%s' -> version %lld", label, (long long)version);
    return rc;
}

static srv_code ops_set_label(void *ctx, const char *model, const char *label, int64_t version, srv_error *err) {
    return ADMIN_LOCKED(ctx, ops_set_label_locked(ctx, model, label, version, err));
}

static srv_code set_traffic_fn(srv_model_config *m, const void *arg, srv_error *err) {
    const adm_split *s = arg;
    for (int k = 0; k < m->nroutes; k++) free(m->route_labels[k]);
    free(m->route_labels);
    free(m->route_weights);
    free(m->sticky_header);
    free(m->shadow);
    m->route_labels = NULL, m->route_weights = NULL, m->sticky_header = NULL, m->shadow = NULL, m->nroutes = 0;
    if (s->n > 0) {
        m->route_labels = calloc((size_t)s->n, sizeof *m->route_labels);
        m->route_weights = calloc((size_t)s->n, sizeof *m->route_weights);
        if (!m->route_labels || !m->route_weights) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
        for (int k = 0; k < s->n; k++) {
            if (!(m->route_labels[k] = strdup(s->labels[k]))) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
            m->route_weights[k] = s->weights[k];
            m->nroutes = k + 1;
        }
    }
    if (s->sticky_header && !(m->sticky_header = strdup(s->sticky_header)))
        return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    if (s->shadow && !(m->shadow = strdup(s->shadow))) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    m->ar_on = s->ar_on;
    m->ar_max_error_rate = s->max_error_rate;
    m->ar_max_p99_ratio = s->max_p99_ratio;
    m->ar_window_s = s->window_s;
    m->ar_min_requests = s->min_requests;
    return SRV_OK;
}

static srv_code ops_set_traffic_locked(void *ctx, const char *model, const adm_split *split, srv_error *err) {
    srv_code rc = change(ctx, model, set_traffic_fn, split, err);
    if (rc == SRV_OK) srv_log(SRV_LOG_INFO, "admin", model, 0, "traffic set: %d routes", split->n);
    return rc;
}

static srv_code ops_set_traffic(void *ctx, const char *model, const adm_split *split, srv_error *err) {
    return ADMIN_LOCKED(ctx, ops_set_traffic_locked(ctx, model, split, err));
}

static srv_code ops_get_traffic(void *ctx, const char *model, char **json, srv_error *err) {
    srv_admin_ctx *a = ctx;
    srv_model_config m;
    if (srv_registry_get_model(a->reg, model, &m, err) != SRV_OK) return err->code;
    srv_buf b = {0};
    traffic_json(&b, a, &m);
    srv_model_config_free(&m);
    if (b.oom) {
        free(b.p);
        return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    }
    *json = b.p;
    return SRV_OK;
}

/* ---- promote and rollback ---- */

static srv_admin_hist *hist_of(srv_admin_ctx *a, const char *model, int create) {
    srv_admin_hist *free_slot = NULL;
    for (int i = 0; i < SRV_ADMIN_MODELS; i++) {
        if (strcmp(a->hist[i].model, model) == 0) return &a->hist[i];
        if (!free_slot && !a->hist[i].model[0]) free_slot = &a->hist[i];
    }
    if (!create || !free_slot) return NULL;
    snprintf(free_slot->model, sizeof free_slot->model, "%s", model);
    free_slot->n = 0;
    return free_slot;
}

static int label_index(const srv_model_config *m, const char *label) {
    for (int k = 0; k < m->nlabels; k++)
        if (strcmp(m->label_names[k], label) == 0) return k;
    return -1;
}

/* The canary route: the one route beside "stable" with a weight; -1 when none, -2 when several. */
static int canary_route(const srv_model_config *m) {
    int c = -1;
    for (int k = 0; k < m->nroutes; k++)
        if (strcmp(m->route_labels[k], "stable") != 0 && m->route_weights[k] > 0) c = c == -1 ? k : -2;
    return c;
}

typedef struct flip_arg {
    int64_t stable_to; /* > 0: move the stable label here */
} flip_arg;

/* stable takes all traffic (optionally moved to another version); other routes and a shadow on them go. */
static srv_code flip_fn(srv_model_config *m, const void *arg, srv_error *err) {
    const flip_arg *f = arg;
    int s = label_index(m, "stable");
    if (s < 0) return srv_err(err, SRV_FAILED_PRECONDITION, "model '%s' has no 'stable' label", m->name);
    if (f->stable_to > 0) m->label_versions[s] = f->stable_to;
    char *one[1] = {"stable"};
    int w[1] = {100};
    adm_split sp = {.n = 1, .labels = one, .weights = w, .sticky_header = m->sticky_header, .shadow = NULL,
                    .ar_on = m->ar_on, .max_error_rate = m->ar_max_error_rate, .max_p99_ratio = m->ar_max_p99_ratio,
                    .window_s = m->ar_window_s, .min_requests = m->ar_min_requests};
    char *sticky = m->sticky_header ? strdup(m->sticky_header) : NULL;
    sp.sticky_header = sticky;
    srv_code rc = set_traffic_fn(m, &sp, err);
    free(sticky);
    return rc;
}

static srv_code ops_promote(void *ctx, const char *model, srv_error *err) {
    srv_admin_ctx *a = ctx;
    srv_model_config c;
    pthread_mutex_lock(&a->mu);
    srv_code rc = srv_registry_get_model(a->reg, model, &c, err);
    int64_t prev = 0, next = 0;
    if (rc == SRV_OK) {
        int k = canary_route(&c), s = label_index(&c, "stable");
        if (k == -1) rc = srv_err(err, SRV_FAILED_PRECONDITION, "model '%s' has no canary route to promote", model);
        else if (k == -2) rc = srv_err(err, SRV_FAILED_PRECONDITION, "model '%s' routes to several labels beside 'stable': "
                                       "set the traffic to stable and one canary first", model);
        else if (s < 0) rc = srv_err(err, SRV_FAILED_PRECONDITION, "model '%s' has no 'stable' label", model);
        else {
            prev = c.label_versions[s];
            next = c.label_versions[label_index(&c, c.route_labels[k])];
        }
    }
    srv_model_config_free(&c);
    if (rc == SRV_OK) {
        flip_arg f = {next};
        rc = change(a, model, flip_fn, &f, err);
    }
    if (rc == SRV_OK) {
        srv_admin_hist *h = hist_of(a, model, 1);
        if (h) {
            if (h->n == SRV_ADMIN_HISTORY) memmove(h->prev, h->prev + 1, sizeof h->prev[0] * (SRV_ADMIN_HISTORY - 1)), h->n--;
            h->prev[h->n++] = prev;
        }
        char d[96];
        snprintf(d, sizeof d, "{\"from\":%lld,\"to\":%lld}", (long long)prev, (long long)next);
        persist_event(a, model, "promote", d);
        srv_log(SRV_LOG_INFO, "admin", model, next, "promote: stable %lld -> %lld, all traffic to stable", (long long)prev,
                (long long)next);
    }
    pthread_mutex_unlock(&a->mu);
    return rc;
}

static srv_code ops_rollback(void *ctx, const char *model, srv_error *err) {
    srv_admin_ctx *a = ctx;
    srv_model_config c;
    pthread_mutex_lock(&a->mu);
    srv_code rc = srv_registry_get_model(a->reg, model, &c, err);
    flip_arg f = {0};
    int pop = 0;
    if (rc == SRV_OK && canary_route(&c) == -1) { /* nothing routed beside stable: undo the last promote */
        srv_admin_hist *h = hist_of(a, model, 0);
        if (!h || h->n == 0) rc = srv_err(err, SRV_FAILED_PRECONDITION, "model '%s': nothing to roll back (no canary "
                                          "route, no promote)", model);
        else f.stable_to = h->prev[h->n - 1], pop = 1;
    }
    srv_model_config_free(&c);
    if (rc == SRV_OK) rc = change(a, model, flip_fn, &f, err);
    if (rc == SRV_OK && pop) hist_of(a, model, 0)->n--;
    if (rc == SRV_OK) {
        char d[64];
        snprintf(d, sizeof d, "{\"stable\":%lld}", (long long)f.stable_to);
        persist_event(a, model, pop ? "rollback_promote" : "rollback_canary", d);
    }
    if (rc == SRV_OK)
        srv_log(SRV_LOG_INFO, "admin", model, f.stable_to, "rollback: %s", pop ? "stable back to its version before the "
                "last promote" : "canary route dropped, all traffic to stable");
    pthread_mutex_unlock(&a->mu);
    return rc;
}

/* ---- for the job queue: a served version's signature, and the metrics ---- */

static void io_copy(adm_io *d, const srv_io *s) {
    snprintf(d->name, sizeof d->name, "%s", s->onnx_name ? s->onnx_name : s->name);
    d->dtype = (int)s->dtype;
    d->ndim = s->ndim;
    for (int k = 0; k < s->ndim && k < 8; k++) d->dims[k] = s->dims[k];
}

static srv_code ops_model_info(void *ctx, const char *model, const char *version, adm_model_info *out, srv_error *err) {
    srv_admin_ctx *a = ctx;
    memset(out, 0, sizeof *out);
    int64_t v = 0;
    const char *label = NULL;
    if (version && *version && strcmp(version, "latest") != 0) {
        char *end = NULL;
        long long x = strtoll(version, &end, 10);
        if (*end == '\0' && x > 0) v = x;
        else label = version;
    }
    srv_version *sv = srv_registry_acquire(a->reg, model, v, label, err);
    if (!sv) return err->code;
    const srv_version_info *info = srv_version_get_info(sv);
    srv_model_config m;
    srv_code rc = srv_registry_get_model(a->reg, model, &m, err);
    if (rc == SRV_OK) {
        snprintf(out->base_path, sizeof out->base_path, "%s", m.base_path);
        srv_model_config_free(&m);
        out->version = info->version;
        if (info->ninputs > ADM_IO_MAX || info->noutputs > ADM_IO_MAX)
            rc = srv_err(err, SRV_UNIMPLEMENTED, "model '%s' version %lld has more than %d inputs or outputs", model,
                         (long long)info->version, ADM_IO_MAX);
        for (int i = 0; rc == SRV_OK && i < info->ninputs; i++) io_copy(&out->inputs[out->ninputs++], &info->inputs[i]);
        for (int i = 0; rc == SRV_OK && i < info->noutputs; i++) io_copy(&out->outputs[out->noutputs++], &info->outputs[i]);
    }
    srv_version_release(sv);
    return rc;
}

static srv_code ops_metrics(void *ctx, char **text, size_t *len, srv_error *err) {
    srv_admin_ctx *a = ctx;
    *text = a->m ? srv_metrics_render(a->m, len) : strdup("");
    if (!a->m && *text) *len = 0;
    return *text ? SRV_OK : srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory rendering the metrics");
}

adm_ops srv_admin_ops(srv_admin_ctx *a) {
    adm_ops o = {.ctx = a, .list = ops_list, .add = ops_add, .remove = ops_remove, .set_label = ops_set_label,
                 .get_traffic = ops_get_traffic, .set_traffic = ops_set_traffic, .promote = ops_promote,
                 .rollback = ops_rollback, .model_info = ops_model_info, .metrics = ops_metrics};
    return o;
}

/* ---- restore at start ---- */

static srv_code restore_one(srv_model_config *m, const adm_model_rec *r, srv_error *err) {
    for (int k = 0; k < r->nlabels; k++) {
        label_arg l = {r->label_names[k], r->label_versions[k]};
        if (set_label_fn(m, &l, err) != SRV_OK) return err->code;
    }
    if (r->traffic.nroutes > 0) {
        char **labels = calloc((size_t)r->traffic.nroutes, sizeof *labels);
        int *w = calloc((size_t)r->traffic.nroutes, sizeof *w);
        if (!labels || !w) {
            free(labels);
            free(w);
            return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
        }
        for (int k = 0; k < r->traffic.nroutes; k++) labels[k] = r->traffic.routes[k].label, w[k] = r->traffic.routes[k].weight;
        adm_split sp = {.n = r->traffic.nroutes, .labels = labels, .weights = w, .sticky_header = r->traffic.sticky_header,
                        .shadow = r->traffic.shadow};
        cJSON *arj = r->traffic.json ? cJSON_Parse(r->traffic.json) : NULL;
        srv_error ae = {0};
        if (arj && adm_auto_rollback(arj, &sp, &ae) != 0) sp.ar_on = 0;
        cJSON_Delete(arj);
        srv_code rc = set_traffic_fn(m, &sp, err);
        free(labels);
        free(w);
        return rc;
    }
    return SRV_OK;
}

srv_code srv_admin_restore(srv_admin_ctx *a, srv_error *err) {
    if (!a->state) return SRV_OK;
    adm_model_rec *recs = NULL;
    int nr = 0;
    if (adm_state_load(a->state, &recs, &nr, err) != SRV_OK) return err->code;
    srv_model_config *c = NULL;
    int n = 0;
    srv_code rc = srv_registry_get_config(a->reg, &c, &n, err);
    srv_model_config *all = rc == SRV_OK ? calloc((size_t)(n + nr) + 1, sizeof *all) : NULL;
    if (rc == SRV_OK && !all) {
        cfgs_free(c, n);
        c = NULL, n = 0;
        rc = srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    }
    int na = n;
    if (rc == SRV_OK) memcpy(all, c, (size_t)n * sizeof *all);
    for (int i = 0; rc == SRV_OK && i < nr; i++) {
        const adm_model_rec *r = &recs[i];
        int k = cfg_find(all, na, r->name);
        if (r->removed) { /* removed through the admin API: a model of the config file stays removed */
            if (k >= 0) {
                srv_model_config_free(&all[k]);
                memmove(&all[k], &all[k + 1], (size_t)(na - k - 1) * sizeof *all);
                na--;
                srv_log(SRV_LOG_INFO, "admin", r->name, 0, "not served: it was removed through the admin API (add it "
                        "again to serve it)");
            }
            continue;
        }
        if (k < 0 && r->added && r->base_path) { /* added through the admin API: rebuild it */
            char policy[2048] = "";
            cJSON *pj = r->policy_json ? cJSON_Parse(r->policy_json) : NULL;
            srv_error pe = {0};
            if (pj && adm_policy_text(pj, policy, sizeof policy, &pe) != 0) policy[0] = '\0';
            cJSON_Delete(pj);
            srv_buf t = {0};
            srv_buf_puts(&t, "model_config_list { config { name: ");
            srv_config_quote(&t, r->name);
            srv_buf_puts(&t, " base_path: ");
            srv_config_quote(&t, r->base_path);
            srv_buf_printf(&t, " %s } }\n", policy);
            srv_model_config *one = NULL;
            int none = 0;
            if (!t.oom && srv_config_parse_models(t.p, t.len, "state", &one, &none, err) == SRV_OK && none == 1) {
                all[na++] = one[0];
                free(one);
                k = na - 1;
            } else {
                srv_log(SRV_LOG_ERROR, "admin", r->name, 0, "kept model not restored: %s", err->msg);
                cfgs_free(one, none);
            }
            free(t.p);
        }
        if (k < 0) {
            srv_log(SRV_LOG_WARN, "admin", r->name, 0, "the state has labels or traffic for a model that is not served");
            continue;
        }
        if (restore_one(&all[k], r, err) != SRV_OK)
            srv_log(SRV_LOG_ERROR, "admin", r->name, 0, "kept labels/traffic not restored: %s", err->msg);
    }
    if (rc == SRV_OK) {
        rc = srv_registry_set_config(a->reg, all, na, err);
        if (rc == SRV_OK) srv_log(SRV_LOG_INFO, "admin", NULL, 0, "restored %d kept models' admin changes", nr);
    }
    /* the promote history, replayed oldest first */
    for (int i = 0; rc == SRV_OK && i < nr; i++) {
        adm_event *ev = NULL;
        int ne = 0;
        srv_error e2 = {0};
        if (adm_state_events(a->state, recs[i].name, SRV_ADMIN_HISTORY * 4, &ev, &ne, &e2) != SRV_OK) continue;
        srv_admin_hist *h = hist_of(a, recs[i].name, 1);
        for (int k = ne - 1; h && k >= 0; k--) {
            cJSON *d = ev[k].detail_json ? cJSON_Parse(ev[k].detail_json) : NULL;
            const cJSON *from = cJSON_GetObjectItemCaseSensitive(d, "from");
            if (!strcmp(ev[k].event, "promote") && cJSON_IsNumber(from)) {
                if (h->n == SRV_ADMIN_HISTORY) memmove(h->prev, h->prev + 1, sizeof h->prev[0] * (SRV_ADMIN_HISTORY - 1)), h->n--;
                h->prev[h->n++] = (int64_t)from->valuedouble;
            } else if (!strcmp(ev[k].event, "rollback_promote") && h->n > 0) {
                h->n--;
            }
            cJSON_Delete(d);
        }
        adm_events_free(ev, ne);
    }
    for (int i = 0; i < nr; i++) adm_model_rec_free(&recs[i]);
    free(recs);
    for (int i = 0; all && i < na; i++) srv_model_config_free(&all[i]);
    free(all);
    free(c); /* its entries moved into all */
    return rc;
}

/* ---- automatic rollback ---- */

/* One look at every model with auto_rollback and a canary route: drop the route when the canary crossed a line. */
static void monitor_tick(srv_admin_ctx *a) {
    srv_model_config *c = NULL;
    int n = 0;
    srv_error err = {0};
    if (srv_registry_get_config(a->reg, &c, &n, &err) != SRV_OK) return;
    for (int i = 0; i < n; i++) {
        const srv_model_config *m = &c[i];
        int k = m->ar_on ? canary_route(m) : -1;
        if (k < 0) continue;
        const char *canary = m->route_labels[k];
        srv_canary_stats cs = srv_canary_window(a->canary, m->name, canary, m->ar_window_s);
        srv_canary_stats ss = srv_canary_window(a->canary, m->name, "stable", m->ar_window_s);
        if (cs.requests < m->ar_min_requests) continue;
        char why[512] = "";
        double er = (double)cs.errors / (double)cs.requests;
        if (er > m->ar_max_error_rate)
            snprintf(why, sizeof why, "canary '%s' failed %lld of %lld requests (%.1f%%) in the last %d s, over the %.1f%% "
                     "limit", canary, (long long)cs.errors, (long long)cs.requests, 100 * er, m->ar_window_s,
                     100 * m->ar_max_error_rate);
        else if (m->ar_max_p99_ratio > 0 && ss.p99_us > 0 && ss.requests >= 10 &&
                 (double)cs.p99_us > m->ar_max_p99_ratio * (double)ss.p99_us)
            snprintf(why, sizeof why, "canary '%s' p99 latency %lld us is %.1fx stable's %lld us in the last %d s, over "
                     "the %gx limit", canary, (long long)cs.p99_us, (double)cs.p99_us / (double)ss.p99_us,
                     (long long)ss.p99_us, m->ar_window_s, m->ar_max_p99_ratio);
        if (!why[0]) continue;
        pthread_mutex_lock(&a->mu);
        flip_arg f = {0};
        srv_code rc = change(a, m->name, flip_fn, &f, &err);
        if (rc == SRV_OK) {
            pthread_mutex_lock(&a->rmu);
            srv_admin_hist *h = hist_of(a, m->name, 1);
            if (h) {
                snprintf(h->reason, sizeof h->reason, "%s", why);
                h->reason_ms = srv_now_us() / 1000;
            }
            pthread_mutex_unlock(&a->rmu);
            srv_buf d = {0};
            srv_buf_puts(&d, "{\"reason\":");
            srv_buf_json_str(&d, why);
            srv_buf_puts(&d, "}");
            persist_event(a, m->name, "auto_rollback", d.p);
            free(d.p);
            int li = label_index(m, canary);
            srv_metrics_swap(a->m, m->name, li >= 0 ? m->label_versions[li] : 0, "auto_rollback");
            srv_canary_reset(a->canary, m->name, canary);
            srv_log(SRV_LOG_WARN, "auto_rollback", m->name, li >= 0 ? m->label_versions[li] : 0, "%s: all traffic back "
                    "to stable", why);
        } else {
            srv_log(SRV_LOG_ERROR, "auto_rollback", m->name, 0, "could not roll back: %s", err.msg);
        }
        pthread_mutex_unlock(&a->mu);
    }
    cfgs_free(c, n);
}

static void *monitor_main(void *arg) {
    srv_admin_ctx *a = arg;
    pthread_mutex_lock(&a->rmu);
    while (!a->mon_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 250 * 1000000L; /* four looks a second */
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&a->mon_cv, &a->rmu, &ts);
        if (a->mon_stop) break;
        pthread_mutex_unlock(&a->rmu);
        monitor_tick(a);
        pthread_mutex_lock(&a->rmu);
    }
    pthread_mutex_unlock(&a->rmu);
    return NULL;
}

int srv_admin_monitor_start(srv_admin_ctx *a, struct srv_canary *canary, srv_metrics *m) {
    a->canary = canary;
    a->m = m;
    pthread_mutex_init(&a->rmu, NULL);
    pthread_cond_init(&a->mon_cv, NULL);
    a->mon_on = pthread_create(&a->mon, NULL, monitor_main, a) == 0;
    return a->mon_on ? 0 : -1;
}

void srv_admin_monitor_stop(srv_admin_ctx *a) {
    if (!a->mon_on) return;
    pthread_mutex_lock(&a->rmu);
    a->mon_stop = 1;
    pthread_cond_broadcast(&a->mon_cv);
    pthread_mutex_unlock(&a->rmu);
    pthread_join(a->mon, NULL);
    a->mon_on = 0;
}
