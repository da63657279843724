/* admin.c - the admin listener (see admin.h): authentication, limits, routing, JSON in and out. The changes
 * themselves are the server's (adm_ops). One thread per connection: admin calls are few and may wait for loads.
 */
#include "admin/admin.h"
#include "admin/admin-http.h"
#include "admin/datasets.h"
#include "admin/jobs.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define ADM_PREFIX "/v1/admin/models"
#define ADM_DATASETS "/v1/admin/datasets"
#define ADM_JOBS "/v1/admin/jobs"
#define ADM_FAIL_SLOTS 256
#define ADM_FAIL_MAX 5          /* failures within ADM_FAIL_WINDOW_MS before the back-off */
#define ADM_FAIL_WINDOW_MS 60000
#define ADM_BACKOFF_MAX_MS 60000

typedef struct adm_fail {
    char addr[64];
    int count;
    int64_t first_ms, until_ms, backoff_ms;
} adm_fail;

struct adm_server {
    struct MHD_Daemon *d;
    adm_ops ops;
    adm_datasets *datasets; /* NULL without --state_dir */
    adm_jobs *jobs;         /* NULL without --state_dir */
    char *token;
    pthread_mutex_t mu;
    adm_fail fails[ADM_FAIL_SLOTS];
};

typedef struct adm_req {
    char *body;
    size_t len;
    int too_big;
    int answered;   /* a refusal was queued before the body */
    int datasets;   /* handled by datasets.c (ds_ctx is its state) */
    void *ds_ctx;
} adm_req;

static int64_t adm_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- failed attempts per address ---- */

static void adm_addr(struct MHD_Connection *c, char *buf, size_t cap) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    buf[0] = '\0';
    if (!ci || !ci->client_addr) return;
    const struct sockaddr *sa = ci->client_addr;
    if (sa->sa_family == AF_INET) inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, buf, (socklen_t)cap);
    else if (sa->sa_family == AF_INET6) inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, buf, (socklen_t)cap);
}

/* ms the address must still wait (0: none). */
static int64_t adm_blocked(adm_server *s, const char *addr) {
    int64_t now = adm_now_ms(), left = 0;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < ADM_FAIL_SLOTS; i++)
        if (s->fails[i].addr[0] && strcmp(s->fails[i].addr, addr) == 0 && s->fails[i].until_ms > now)
            left = s->fails[i].until_ms - now;
    pthread_mutex_unlock(&s->mu);
    return left;
}

static void adm_failed(adm_server *s, const char *addr) {
    int64_t now = adm_now_ms();
    pthread_mutex_lock(&s->mu);
    adm_fail *f = NULL, *oldest = &s->fails[0];
    for (int i = 0; i < ADM_FAIL_SLOTS && !f; i++) {
        if (strcmp(s->fails[i].addr, addr) == 0) f = &s->fails[i];
        else if (s->fails[i].first_ms < oldest->first_ms) oldest = &s->fails[i];
    }
    if (!f) {
        f = oldest;
        memset(f, 0, sizeof *f);
        snprintf(f->addr, sizeof f->addr, "%s", addr);
    }
    if (now - f->first_ms > ADM_FAIL_WINDOW_MS && f->until_ms <= now) {
        f->count = 0;
        f->first_ms = now;
    }
    if (++f->count >= ADM_FAIL_MAX) {
        f->backoff_ms = f->backoff_ms ? f->backoff_ms * 2 : 1000;
        if (f->backoff_ms > ADM_BACKOFF_MAX_MS) f->backoff_ms = ADM_BACKOFF_MAX_MS;
        f->until_ms = now + f->backoff_ms;
    }
    pthread_mutex_unlock(&s->mu);
}

static void adm_succeeded(adm_server *s, const char *addr) {
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < ADM_FAIL_SLOTS; i++)
        if (strcmp(s->fails[i].addr, addr) == 0) memset(&s->fails[i], 0, sizeof s->fails[i]);
    pthread_mutex_unlock(&s->mu);
}

/* ---- requests ---- */

/* "latest": {"num_versions": n} | "all": {} | "specific": {"versions": [..]} -> a model_version_policy text
 * fragment (config.c checks it); NULL policy: "". 0, or -1 with err. */
int adm_policy_text(const struct cJSON *p, char *out, size_t cap, srv_error *err) {
    out[0] = '\0';
    if (!p || cJSON_IsNull(p)) return 0;
    const cJSON *x;
    if (!cJSON_IsObject(p)) goto bad;
    if ((x = cJSON_GetObjectItemCaseSensitive(p, "latest"))) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(x, "num_versions");
        if (n && (!cJSON_IsNumber(n) || n->valuedouble < 1 || n->valuedouble > 1000 || n->valuedouble != (int)n->valuedouble))
            goto bad;
        snprintf(out, cap, "model_version_policy { latest { num_versions: %d } }", n ? (int)n->valuedouble : 1);
    } else if (cJSON_GetObjectItemCaseSensitive(p, "all")) {
        snprintf(out, cap, "model_version_policy { all {} }");
    } else if ((x = cJSON_GetObjectItemCaseSensitive(p, "specific"))) {
        const cJSON *vs = cJSON_GetObjectItemCaseSensitive(x, "versions");
        if (!cJSON_IsArray(vs) || cJSON_GetArraySize(vs) < 1 || cJSON_GetArraySize(vs) > 100) goto bad;
        size_t k = (size_t)snprintf(out, cap, "model_version_policy { specific {");
        for (const cJSON *v = vs->child; v; v = v->next) {
            if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > 1e15 || v->valuedouble != (double)(int64_t)v->valuedouble)
                goto bad;
            k += (size_t)snprintf(out + k, k < cap ? cap - k : 0, " versions: %lld", (long long)v->valuedouble);
        }
        snprintf(out + (k < cap ? k : cap - 1), k < cap ? cap - k : 1, " } }");
    } else {
        goto bad;
    }
    return 0;
bad:
    srv_err(err, SRV_INVALID_ARGUMENT, "version_policy must be {\"latest\": {\"num_versions\": n}}, {\"all\": {}} or "
            "{\"specific\": {\"versions\": [n, ...]}}");
    return -1;
}

int adm_auto_rollback(const struct cJSON *ar, adm_split *sp, srv_error *err) {
    sp->ar_on = 0;
    if (!ar || cJSON_IsNull(ar)) return 0;
    if (!cJSON_IsObject(ar)) goto bad;
    const cJSON *er = cJSON_GetObjectItemCaseSensitive(ar, "max_error_rate");
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(ar, "max_p99_ratio");
    const cJSON *ws = cJSON_GetObjectItemCaseSensitive(ar, "window_s");
    const cJSON *mr = cJSON_GetObjectItemCaseSensitive(ar, "min_requests");
    for (const cJSON *k = ar->child; k; k = k->next)
        if (strcmp(k->string, "max_error_rate") && strcmp(k->string, "max_p99_ratio") && strcmp(k->string, "window_s") &&
            strcmp(k->string, "min_requests"))
            goto bad;
    if ((er && (!cJSON_IsNumber(er) || er->valuedouble < 0 || er->valuedouble > 1)) ||
        (pr && (!cJSON_IsNumber(pr) || pr->valuedouble < 1 || pr->valuedouble > 1000)) ||
        (ws && (!cJSON_IsNumber(ws) || ws->valuedouble < 1 || ws->valuedouble > 120)) ||
        (mr && (!cJSON_IsNumber(mr) || mr->valuedouble < 1 || mr->valuedouble > 1e9)) || (!er && !pr))
        goto bad;
    sp->ar_on = 1;
    sp->max_error_rate = er ? er->valuedouble : 1.0;
    sp->max_p99_ratio = pr ? pr->valuedouble : 0.0; /* 0: no latency rule */
    sp->window_s = ws ? (int)ws->valuedouble : 30;
    sp->min_requests = mr ? (int)mr->valuedouble : 200;
    return 0;
bad:
    srv_err(err, SRV_INVALID_ARGUMENT, "auto_rollback takes {\"max_error_rate\": 0..1, \"max_p99_ratio\": 1..1000, "
            "\"window_s\": 1..120, \"min_requests\": n} (at least one of the first two)");
    return -1;
}

static enum MHD_Result adm_add(adm_server *s, struct MHD_Connection *c, const cJSON *b) {
    srv_error err = {0};
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(b, "name"), *base = cJSON_GetObjectItemCaseSensitive(b, "base_path");
    char policy[2048];
    if (!cJSON_IsString(name) || !srv_name_valid(name->valuestring))
        return adm_error(c, 400, "\"name\" must be a model name ([A-Za-z0-9_.-], at most 255 bytes, not . or ..)");
    if (!cJSON_IsString(base) || !*base->valuestring || strlen(base->valuestring) > 4096 ||
        strchr(base->valuestring, '\n'))
        return adm_error(c, 400, "\"base_path\" must be a directory path");
    if (adm_policy_text(cJSON_GetObjectItemCaseSensitive(b, "version_policy"), policy, sizeof policy, &err) != 0)
        return adm_code(c, &err);
    if (s->ops.add(s->ops.ctx, name->valuestring, base->valuestring, policy, &err) != SRV_OK) return adm_code(c, &err);
    char *json = NULL;
    return s->ops.list(s->ops.ctx, &json, &err) == SRV_OK ? adm_send(c, 201, json, NULL) : adm_code(c, &err);
}

static enum MHD_Result adm_traffic_put(adm_server *s, struct MHD_Connection *c, const char *model, const cJSON *b) {
    srv_error err = {0};
    const cJSON *routes = cJSON_GetObjectItemCaseSensitive(b, "routes");
    const cJSON *sticky = cJSON_GetObjectItemCaseSensitive(b, "sticky_header");
    const cJSON *shadow = cJSON_GetObjectItemCaseSensitive(b, "shadow");
    for (const cJSON *k = b->child; k; k = k->next)
        if (strcmp(k->string, "routes") && strcmp(k->string, "sticky_header") && strcmp(k->string, "shadow") &&
            strcmp(k->string, "auto_rollback")) {
            char m[300];
            snprintf(m, sizeof m, "traffic: unknown field '%.200s' (routes, sticky_header, shadow, auto_rollback)",
                     k->string);
            return adm_error(c, 400, m);
        }
    if (!cJSON_IsObject(routes) || cJSON_GetArraySize(routes) > 64)
        return adm_error(c, 400, "traffic: \"routes\" must be an object {label: weight} (at most 64)");
    if ((sticky && !cJSON_IsString(sticky) && !cJSON_IsNull(sticky)) || (shadow && !cJSON_IsString(shadow) && !cJSON_IsNull(shadow)))
        return adm_error(c, 400, "traffic: \"sticky_header\" and \"shadow\" must be strings");
    adm_split sp = {0};
    int n = cJSON_GetArraySize(routes);
    sp.labels = calloc((size_t)n + 1, sizeof *sp.labels);
    sp.weights = calloc((size_t)n + 1, sizeof *sp.weights);
    if (!sp.labels || !sp.weights) {
        free(sp.labels);
        free(sp.weights);
        return adm_error(c, 500, "out of memory");
    }
    for (const cJSON *r = routes->child; r; r = r->next) {
        if (!srv_name_valid(r->string) || !cJSON_IsNumber(r) || r->valuedouble < 0 || r->valuedouble > 1000000 ||
            r->valuedouble != (int)r->valuedouble) {
            free(sp.labels);
            free(sp.weights);
            return adm_error(c, 400, "traffic: each route is a label name with an integer weight 0..1000000");
        }
        sp.labels[sp.n] = r->string;
        sp.weights[sp.n++] = (int)r->valuedouble;
    }
    if (adm_auto_rollback(cJSON_GetObjectItemCaseSensitive(b, "auto_rollback"), &sp, &err) != 0) {
        free(sp.labels);
        free(sp.weights);
        return adm_code(c, &err);
    }
    sp.sticky_header = cJSON_IsString(sticky) && *sticky->valuestring ? sticky->valuestring : NULL;
    sp.shadow = cJSON_IsString(shadow) && *shadow->valuestring ? shadow->valuestring : NULL;
    srv_code rc = s->ops.set_traffic(s->ops.ctx, model, &sp, &err);
    free(sp.labels);
    free(sp.weights);
    if (rc != SRV_OK) return adm_code(c, &err);
    char *json = NULL;
    return s->ops.get_traffic(s->ops.ctx, model, &json, &err) == SRV_OK ? adm_send(c, 200, json, NULL) : adm_code(c, &err);
}

/* A raw NUL, or the JSON escape \u0000 (cJSON would cut the string there, so "a\u0000b" would read as "a"). */
static int adm_has_nul(const char *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (b[i] == '\0') return 1;
        if (b[i] == '\\' && i + 1 < n) {
            if (b[i + 1] == 'u' && i + 5 < n && b[i + 2] == '0' && b[i + 3] == '0' && b[i + 4] == '0' && b[i + 5] == '0')
                return 1;
            i++; /* skip the escaped character (so "\\u0000" is not a NUL) */
        }
    }
    return 0;
}

/* Split the path after the prefix: "" | "/{m}" | "/{m}/traffic" | "/{m}/labels/{l}". -1: not a route. */
static int adm_route_of(const char *url, char *model, char *label) {
    model[0] = label[0] = '\0';
    if (strncmp(url, ADM_PREFIX, sizeof ADM_PREFIX - 1) != 0) return -1;
    const char *p = url + sizeof ADM_PREFIX - 1;
    if (!*p) return 0;
    if (*p++ != '/') return -1;
    const char *e = strchr(p, '/');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    const char *colon = !e ? strchr(p, ':') : NULL;
    int verb = 0;
    if (colon && (!strcmp(colon, ":promote") || !strcmp(colon, ":rollback"))) {
        verb = colon[1] == 'p' ? 4 : 5;
        n = (size_t)(colon - p);
    }
    if (n == 0 || n > 255) return -2;
    memcpy(model, p, n);
    model[n] = '\0';
    if (verb) return verb;
    if (!e) return 1;
    if (strcmp(e, "/traffic") == 0) return 2;
    if (strncmp(e, "/labels/", 8) == 0) {
        size_t ln = strlen(e + 8);
        if (ln == 0 || ln > 255 || strchr(e + 8, '/')) return -2;
        memcpy(label, e + 8, ln + 1);
        return 3;
    }
    return -1;
}

static enum MHD_Result adm_dispatch(adm_server *s, struct MHD_Connection *c, const char *method, const char *url,
                                    const adm_req *rq) {
    char model[256], label[256];
    int kind = adm_route_of(url, model, label);
    if (kind == -1) return adm_error(c, 404, "no such admin route: /v1/admin/models[/{m}[/traffic|/labels/{l}]]");
    if (kind == -2 || (kind >= 1 && !srv_name_valid(model)) || (kind == 3 && !srv_name_valid(label)))
        return adm_error(c, 400, "invalid model or label name in the URL ([A-Za-z0-9_.-], at most 255 bytes)");
    srv_error err = {0};
    cJSON *b = NULL;
    int wants_body = (!strcmp(method, "POST") || !strcmp(method, "PUT")) && kind != 4 && kind != 5;
    if (wants_body && adm_has_nul(rq->body, rq->len))
        return adm_error(c, 400, "the request body holds a NUL character (raw or \\u0000): names and paths cannot");
    if (wants_body) {
        b = rq->len ? cJSON_ParseWithLength(rq->body, rq->len) : NULL;
        if (!cJSON_IsObject(b)) {
            cJSON_Delete(b);
            return adm_error(c, 400, "the request body must be a JSON object");
        }
    }
    enum MHD_Result ret;
    char *json = NULL;
    if (kind == 0 && !strcmp(method, "GET")) {
        ret = s->ops.list(s->ops.ctx, &json, &err) == SRV_OK ? adm_send(c, 200, json, NULL) : adm_code(c, &err);
    } else if (kind == 0 && !strcmp(method, "POST")) {
        ret = adm_add(s, c, b);
    } else if (kind == 1 && !strcmp(method, "DELETE")) {
        ret = s->ops.remove(s->ops.ctx, model, &err) == SRV_OK ? adm_send(c, 200, strdup("{}"), NULL) : adm_code(c, &err);
    } else if (kind == 2 && !strcmp(method, "GET")) {
        ret = s->ops.get_traffic(s->ops.ctx, model, &json, &err) == SRV_OK ? adm_send(c, 200, json, NULL) : adm_code(c, &err);
    } else if (kind == 2 && !strcmp(method, "PUT")) {
        ret = adm_traffic_put(s, c, model, b);
    } else if ((kind == 4 || kind == 5) && !strcmp(method, "POST")) {
        srv_code rc = kind == 4 ? s->ops.promote(s->ops.ctx, model, &err) : s->ops.rollback(s->ops.ctx, model, &err);
        ret = rc == SRV_OK && s->ops.get_traffic(s->ops.ctx, model, &json, &err) == SRV_OK ? adm_send(c, 200, json, NULL)
                                                                                            : adm_code(c, &err);
    } else if (kind == 3 && !strcmp(method, "PUT")) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(b, "version");
        if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > 1e15 || v->valuedouble != (double)(int64_t)v->valuedouble)
            ret = adm_error(c, 400, "{\"version\": n} with a positive integer n");
        else if (s->ops.set_label(s->ops.ctx, model, label, (int64_t)v->valuedouble, &err) != SRV_OK)
            ret = adm_code(c, &err);
        else
            ret = s->ops.list(s->ops.ctx, &json, &err) == SRV_OK ? adm_send(c, 200, json, NULL) : adm_code(c, &err);
    } else {
        ret = adm_error(c, 405, "method not allowed on this admin route");
    }
    cJSON_Delete(b);
    return ret;
}

/* The bearer token and the back-off: 1 when the request may go on, else 0 with the refusal queued in *ret. */
static int adm_authorized(adm_server *s, struct MHD_Connection *c, enum MHD_Result *ret) {
    char addr[64];
    adm_addr(c, addr, sizeof addr);
    int64_t wait = adm_blocked(s, addr);
    if (wait > 0) {
        char m[160];
        snprintf(m, sizeof m, "too many failed admin logins from %s: retry in %lld ms", addr, (long long)wait);
        *ret = adm_error(c, 429, m);
        return 0;
    }
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!srv_bearer_ok(auth, s->token)) {
        adm_failed(s, addr);
        *ret = adm_error(c, 401, auth ? "the admin token is wrong" : "the admin API needs 'Authorization: Bearer <token>'");
        return 0;
    }
    adm_succeeded(s, addr);
    return 1;
}

/* The dashboard page (admin/dashboard.html, embedded at build time): served without a token, since it holds no
 * secret; the page asks for the token and sends it with each API call. */
extern unsigned char adm_dashboard_html[];
extern unsigned int adm_dashboard_html_len;

static enum MHD_Result adm_dashboard(struct MHD_Connection *c) {
    struct MHD_Response *r = MHD_create_response_from_buffer(adm_dashboard_html_len, adm_dashboard_html,
                                                             MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/html; charset=utf-8");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    MHD_add_response_header(r, "Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; "
                                                          "style-src 'unsafe-inline'; img-src 'self' data:");
    MHD_add_response_header(r, "X-Frame-Options", "DENY");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
}

static int adm_is_datasets(const char *url) {
    size_t n = sizeof ADM_DATASETS - 1;
    return strncmp(url, ADM_DATASETS, n) == 0 && (url[n] == '\0' || url[n] == '/' || url[n] == '?');
}

static enum MHD_Result adm_handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                   const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    adm_server *s = cls;
    (void)version;
    adm_req *rq = *con_cls;
    if (!rq) { /* headers are in: check before any body byte is read */
        if (!(rq = calloc(1, sizeof *rq))) return MHD_NO;
        *con_cls = rq;
        if (adm_is_datasets(url)) { /* uploads stream to disk: only an authorized one gets that far */
            enum MHD_Result ret;
            if (!adm_authorized(s, c, &ret)) {
                rq->answered = 1;
                return ret;
            }
            if (!s->datasets) {
                rq->answered = 1;
                return adm_error(c, 503, "datasets need --state_dir (they are stored there)");
            }
            rq->datasets = 1;
            return adm_datasets_access(s->datasets, c, url, method, upload, upload_size, &rq->ds_ctx);
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > ADM_MAX_BODY) rq->too_big = 1;
        return MHD_YES;
    }
    if (rq->answered) { /* refused before the body: drop what comes */
        *upload_size = 0;
        return MHD_YES;
    }
    if (rq->datasets) return adm_datasets_access(s->datasets, c, url, method, upload, upload_size, &rq->ds_ctx);
    if (*upload_size) {
        if (rq->too_big || rq->len + *upload_size > ADM_MAX_BODY) {
            rq->too_big = 1;
        } else {
            char *nb = realloc(rq->body, rq->len + *upload_size + 1);
            if (!nb) return MHD_NO;
            rq->body = nb;
            memcpy(rq->body + rq->len, upload, *upload_size);
            rq->len += *upload_size;
            rq->body[rq->len] = '\0';
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (!strcmp(method, "GET") && (!strcmp(url, "/") || !strcmp(url, "/index.html"))) return adm_dashboard(c);
    enum MHD_Result ret;
    if (!adm_authorized(s, c, &ret)) return ret;
    if (rq->too_big) return adm_error(c, 413, "the admin request body is over 1 MiB");
    if (!strncmp(url, ADM_JOBS, sizeof ADM_JOBS - 1) && (url[sizeof ADM_JOBS - 1] == '\0' || url[sizeof ADM_JOBS - 1] == '/')) {
        if (rq->len && adm_has_nul(rq->body, rq->len))
            return adm_error(c, 400, "the request body holds a NUL character (raw or \\u0000): names and paths cannot");
        return adm_jobs_handle(s->jobs, c, method, url, rq->body, rq->len);
    }
    if (!strcmp(url, "/v1/admin/metrics")) {
        if (strcmp(method, "GET") != 0) return adm_error(c, 405, "GET /v1/admin/metrics");
        char *text = NULL;
        size_t n = 0;
        srv_error err = {0};
        if (s->ops.metrics(s->ops.ctx, &text, &n, &err) != SRV_OK) return adm_code(c, &err);
        struct MHD_Response *r = MHD_create_response_from_buffer(n, text, MHD_RESPMEM_MUST_FREE);
        if (!r) {
            free(text);
            return MHD_NO;
        }
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; version=0.0.4");
        ret = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        return ret;
    }
    return adm_dispatch(s, c, method, url, rq);
}

static void adm_done(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    adm_server *s = cls;
    (void)c, (void)toe;
    adm_req *rq = *con_cls;
    if (rq) {
        if (rq->datasets) adm_datasets_done(s->datasets, rq->ds_ctx);
        free(rq->body);
        free(rq);
    }
    *con_cls = NULL;
}

adm_server *adm_start(const adm_opts *o, const adm_ops *ops, srv_error *err) {
    const char *bind = o->bind && *o->bind ? o->bind : "127.0.0.1";
    if (!o->token || strlen(o->token) < ADM_MIN_TOKEN) {
        srv_err(err, SRV_FAILED_PRECONDITION, "the admin port needs a token of at least %d characters (128 bits as hex; "
                "--admin_token_file or TENSORD_ADMIN_TOKEN); %s", ADM_MIN_TOKEN,
                o->token ? "the one given is shorter" : "none is configured");
        return NULL;
    }
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t sl;
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    int v6 = strchr(bind, ':') != NULL;
    if (v6) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)o->port);
        sl = sizeof *a6;
        if (inet_pton(AF_INET6, bind, &a6->sin6_addr) != 1) goto badaddr;
    } else {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)o->port);
        sl = sizeof *a4;
        if (inet_pton(AF_INET, bind, &a4->sin_addr) != 1) goto badaddr;
    }
    (void)sl;
    adm_server *s = calloc(1, sizeof *s);
    if (!s || !(s->token = strdup(o->token))) {
        free(s);
        srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    s->ops = *ops;
    s->datasets = o->datasets;
    s->jobs = o->jobs;
    pthread_mutex_init(&s->mu, NULL);
    s->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG |
                                (v6 ? MHD_USE_IPv6 : 0),
                            (uint16_t)o->port, NULL, NULL, adm_handler, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)64, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)60,
                            MHD_OPTION_NOTIFY_COMPLETED, adm_done, s,
                            /* %00 stays literal text (so every name check refuses it), never a NUL that cuts a name */
                            MHD_OPTION_UNESCAPE_CALLBACK, adm_url_unescape, NULL, MHD_OPTION_END);
    if (!s->d) {
        srv_err(err, SRV_UNAVAILABLE, "cannot listen on %s:%d for the admin API (address in use?)", bind, o->port);
        pthread_mutex_destroy(&s->mu);
        free(s->token);
        free(s);
        return NULL;
    }
    return s;
badaddr:
    srv_err(err, SRV_INVALID_ARGUMENT, "--admin_bind '%.100s' is not a numeric IPv4 or IPv6 address", bind);
    return NULL;
}

void adm_stop(adm_server **ps) {
    if (!ps || !*ps) return;
    adm_server *s = *ps;
    MHD_stop_daemon(s->d);
    pthread_mutex_destroy(&s->mu);
    free(s->token);
    free(s);
    *ps = NULL;
}
