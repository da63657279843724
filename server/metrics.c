/* metrics.c - Prometheus metrics for the serving process (see metrics.h), text exposition format 0.0.4.
 *
 * Storage: one family per metric; each series is keyed by its rendered (escaped) label set, so recording is
 * "render labels into a stack buffer, find or add, update" under one mutex. Cardinality is bounded:
 * a family holds at most SRV_METRICS_MAX_SERIES series; records for new label sets beyond that are dropped
 * (counted in tensord_metrics_dropped_series_total) rather than growing memory without bound, since model
 * names and labels in a request come from clients.
 * Histograms keep per-bucket counts; rendering makes them cumulative and adds _sum and _count.
 */
#include "metrics.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "srv.h"

#define SRV_METRICS_MAX_SERIES 10000
#define SRV_METRICS_MAX_BUCKETS 24
#define SRV_LABELS_MAX 1536

typedef enum srv_mtype { SRV_M_COUNTER, SRV_M_GAUGE, SRV_M_HISTOGRAM } srv_mtype;

typedef struct srv_series {
    char *labels;    /* model="m",version="1",... (escaped) */
    char *model;     /* for srv_metrics_forget */
    int64_t version;
    double value;    /* counter / gauge */
    uint64_t *buckets; /* histogram: nbounds + 1 per-bucket counts (last = +Inf) */
    double sum;
    uint64_t count;
} srv_series;

typedef struct srv_family {
    const char *name, *help;
    srv_mtype type;
    const double *bounds;
    int nbounds;
    srv_series *s;
    int n, cap;
} srv_family;

enum {
    SRV_F_REQ_COUNT, SRV_F_REQ_LAT, SRV_F_QUEUE, SRV_F_BATCH, SRV_F_PADDED, SRV_F_LOAD, SRV_F_SWAP,
    SRV_F_WEIGHTS, SRV_F_STATE, SRV_F_COUNT
};

struct srv_metrics {
    pthread_mutex_t mu;
    srv_family f[SRV_F_COUNT];
    uint64_t dropped;
};

static const double srv_lat_us[] = {50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000,
                                    500000, 1e6, 2.5e6, 5e6, 1e7, 3e7, 6e7};
static const double srv_rows[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096};
#define SRV_N(a) ((int)(sizeof a / sizeof a[0]))

srv_metrics *srv_metrics_new(void) {
    srv_metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_init(&m->mu, NULL);
    const srv_family init[SRV_F_COUNT] = {
        [SRV_F_REQ_COUNT] = {"tensord_request_count", "Requests served, by API and final status code.", SRV_M_COUNTER},
        [SRV_F_REQ_LAT] = {"tensord_request_latency_us", "End-to-end request latency in microseconds.",
                           SRV_M_HISTOGRAM, srv_lat_us, SRV_N(srv_lat_us)},
        [SRV_F_QUEUE] = {"tensord_queue_latency_us", "Time a batch waited in the batching queue, microseconds.",
                         SRV_M_HISTOGRAM, srv_lat_us, SRV_N(srv_lat_us)},
        [SRV_F_BATCH] = {"tensord_batch_size", "Rows per executed batch (before padding).", SRV_M_HISTOGRAM,
                         srv_rows, SRV_N(srv_rows)},
        [SRV_F_PADDED] = {"tensord_padded_batch_size", "Rows per executed batch after padding.", SRV_M_HISTOGRAM,
                          srv_rows, SRV_N(srv_rows)},
        [SRV_F_LOAD] = {"tensord_model_load_latency_ms", "Duration of the last load of a version, milliseconds.",
                        SRV_M_GAUGE},
        [SRV_F_SWAP] = {"tensord_model_swap_count", "Version lifecycle events (load, unload, load_failed).",
                        SRV_M_COUNTER},
        [SRV_F_WEIGHTS] = {"tensord_model_weights_bytes", "Bytes of weights held by a loaded version.", SRV_M_GAUGE},
        [SRV_F_STATE] = {"tensord_model_version_state",
                         "Version state (TF Serving numbering: 10 start, 20 loading, 30 available, 40 unloading, "
                         "50 end).",
                         SRV_M_GAUGE},
    };
    memcpy(m->f, init, sizeof init);
    return m;
}

static void srv_series_free(srv_series *s) {
    free(s->labels);
    free(s->model);
    free(s->buckets);
}

void srv_metrics_free(srv_metrics **pm) {
    if (!pm || !*pm) return;
    srv_metrics *m = *pm;
    for (int i = 0; i < SRV_F_COUNT; i++) {
        for (int j = 0; j < m->f[i].n; j++) srv_series_free(&m->f[i].s[j]);
        free(m->f[i].s);
    }
    pthread_mutex_destroy(&m->mu);
    free(m);
    *pm = NULL;
}

/* Append name="value" (value escaped per the exposition format) to buf at *k; truncates safely. */
static void srv_label(char *buf, size_t *k, const char *name, const char *v) {
    size_t n = SRV_LABELS_MAX, i = *k, nl = strlen(name);
    if (i + nl + 4 >= n) return;
    if (i) buf[i++] = ',';
    memcpy(buf + i, name, nl);
    i += nl;
    buf[i++] = '=';
    buf[i++] = '"';
    for (const char *p = v ? v : ""; *p && i + 4 < n; p++) {
        if (*p == '\\' || *p == '"') {
            buf[i++] = '\\';
            buf[i++] = *p;
        } else if (*p == '\n') {
            buf[i++] = '\\';
            buf[i++] = 'n';
        } else {
            buf[i++] = *p;
        }
    }
    if (i + 2 < n) buf[i++] = '"';
    buf[i] = '\0';
    *k = i;
}

static size_t srv_base_labels(char *buf, const char *model, int64_t version) {
    size_t k = 0;
    char vs[32] = "";
    buf[0] = '\0';
    if (version > 0) { /* decimal, without snprintf (this runs for every request) */
        char t[24];
        int n = 0;
        for (uint64_t u = (uint64_t)version; u; u /= 10) t[n++] = (char)('0' + u % 10);
        for (int j = 0; j < n; j++) vs[j] = t[n - 1 - j];
        vs[n] = '\0';
    }
    srv_label(buf, &k, "model", model);
    srv_label(buf, &k, "version", vs);
    return k;
}

/* Find or add the series with these labels; NULL when full or out of memory. Caller holds m->mu. */
static srv_series *srv_series_get(srv_metrics *m, int fi, const char *labels, const char *model, int64_t version) {
    srv_family *f = &m->f[fi];
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->s[i].labels, labels) == 0) return &f->s[i];
    if (f->n >= SRV_METRICS_MAX_SERIES) {
        m->dropped++;
        return NULL;
    }
    if (f->n == f->cap) {
        int cap = f->cap ? f->cap * 2 : 16;
        srv_series *s = realloc(f->s, (size_t)cap * sizeof *s);
        if (!s) return NULL;
        f->s = s;
        f->cap = cap;
    }
    srv_series *s = &f->s[f->n];
    memset(s, 0, sizeof *s);
    s->labels = strdup(labels);
    s->model = strdup(model ? model : "");
    s->version = version;
    if (f->type == SRV_M_HISTOGRAM) s->buckets = calloc((size_t)f->nbounds + 1, sizeof *s->buckets);
    if (!s->labels || !s->model || (f->type == SRV_M_HISTOGRAM && !s->buckets)) {
        srv_series_free(s);
        return NULL;
    }
    f->n++;
    return s;
}

static void srv_observe(srv_series *s, const srv_family *f, double v) {
    int b = 0;
    while (b < f->nbounds && v > f->bounds[b]) b++;
    s->buckets[b]++;
    s->sum += v;
    s->count++;
}

void srv_metrics_request(srv_metrics *m, const char *model, int64_t version, const char *label, const char *api,
                         int code, int64_t latency_us) {
    if (!m) return;
    char lb[SRV_LABELS_MAX], lc[SRV_LABELS_MAX];
    size_t k = srv_base_labels(lb, model, version);
    srv_label(lb, &k, "api", api);
    size_t kc = srv_base_labels(lc, model, version);
    if (label && *label) srv_label(lc, &kc, "label", label);
    srv_label(lc, &kc, "api", api);
    srv_label(lc, &kc, "status", srv_code_name((srv_code)code));
    pthread_mutex_lock(&m->mu);
    srv_series *s = srv_series_get(m, SRV_F_REQ_COUNT, lc, model, version);
    if (s) s->value += 1;
    s = srv_series_get(m, SRV_F_REQ_LAT, lb, model, version);
    if (s) srv_observe(s, &m->f[SRV_F_REQ_LAT], (double)latency_us);
    pthread_mutex_unlock(&m->mu);
}

static void srv_metrics_hist(srv_metrics *m, int fi, const char *model, int64_t version, double v) {
    if (!m) return;
    char lb[SRV_LABELS_MAX];
    srv_base_labels(lb, model, version);
    pthread_mutex_lock(&m->mu);
    srv_series *s = srv_series_get(m, fi, lb, model, version);
    if (s) srv_observe(s, &m->f[fi], v);
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_queue(srv_metrics *m, const char *model, int64_t version, int64_t queue_us) {
    srv_metrics_hist(m, SRV_F_QUEUE, model, version, (double)queue_us);
}

void srv_metrics_batch(srv_metrics *m, const char *model, int64_t version, int64_t rows, int64_t padded_rows) {
    srv_metrics_hist(m, SRV_F_BATCH, model, version, (double)rows);
    srv_metrics_hist(m, SRV_F_PADDED, model, version, (double)padded_rows);
}

static void srv_metrics_set(srv_metrics *m, int fi, const char *model, int64_t version, const char *event,
                            double v, int add) {
    if (!m) return;
    char lb[SRV_LABELS_MAX];
    size_t k = srv_base_labels(lb, model, version);
    if (event) srv_label(lb, &k, "event", event);
    pthread_mutex_lock(&m->mu);
    srv_series *s = srv_series_get(m, fi, lb, model, version);
    if (s) s->value = add ? s->value + v : v;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_load(srv_metrics *m, const char *model, int64_t version, double load_ms, size_t weight_bytes) {
    srv_metrics_set(m, SRV_F_LOAD, model, version, NULL, load_ms, 0);
    srv_metrics_set(m, SRV_F_WEIGHTS, model, version, NULL, (double)weight_bytes, 0);
}

void srv_metrics_swap(srv_metrics *m, const char *model, int64_t version, const char *event) {
    srv_metrics_set(m, SRV_F_SWAP, model, version, event ? event : "", 1, 1);
}

void srv_metrics_state(srv_metrics *m, const char *model, int64_t version, int state) {
    srv_metrics_set(m, SRV_F_STATE, model, version, NULL, state, 0);
}

void srv_metrics_forget(srv_metrics *m, const char *model, int64_t version) {
    if (!m) return;
    static const int fams[] = {SRV_F_WEIGHTS, SRV_F_STATE};
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < SRV_N(fams); i++) {
        srv_family *f = &m->f[fams[i]];
        int w = 0;
        for (int j = 0; j < f->n; j++) {
            if (f->s[j].version == version && strcmp(f->s[j].model, model ? model : "") == 0) srv_series_free(&f->s[j]);
            else f->s[w++] = f->s[j];
        }
        f->n = w;
    }
    pthread_mutex_unlock(&m->mu);
}

static void srv_num(srv_buf *b, double v) {
    if (v == (double)(int64_t)v && v > -9e15 && v < 9e15) srv_buf_printf(b, "%lld", (long long)v);
    else srv_buf_printf(b, "%.17g", v);
}

char *srv_metrics_render(srv_metrics *m, size_t *len) {
    srv_buf b = {0};
    if (!m) return srv_buf_take(&b, len);
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < SRV_F_COUNT && !b.oom; i++) {
        const srv_family *f = &m->f[i];
        static const char *const tn[] = {"counter", "gauge", "histogram"};
        srv_buf_printf(&b, "# HELP %s %s\n# TYPE %s %s\n", f->name, f->help, f->name, tn[f->type]);
        for (int j = 0; j < f->n && !b.oom; j++) {
            const srv_series *s = &f->s[j];
            const char *sep = s->labels[0] ? "," : "";
            if (f->type != SRV_M_HISTOGRAM) {
                srv_buf_printf(&b, "%s{%s} ", f->name, s->labels);
                srv_num(&b, s->value);
                srv_buf_puts(&b, "\n");
                continue;
            }
            uint64_t cum = 0;
            for (int k = 0; k <= f->nbounds; k++) {
                cum += s->buckets[k];
                if (k < f->nbounds) srv_buf_printf(&b, "%s_bucket{%s%sle=\"%.17g\"} %llu\n", f->name, s->labels, sep,
                                                   f->bounds[k], (unsigned long long)cum);
                else srv_buf_printf(&b, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", f->name, s->labels, sep,
                                    (unsigned long long)cum);
            }
            srv_buf_printf(&b, "%s_sum{%s} ", f->name, s->labels);
            srv_num(&b, s->sum);
            srv_buf_printf(&b, "\n%s_count{%s} %llu\n", f->name, s->labels, (unsigned long long)s->count);
        }
    }
    srv_buf_printf(&b,
                   "# HELP tensord_metrics_dropped_series_total Records dropped because a metric reached its "
                   "series limit.\n# TYPE tensord_metrics_dropped_series_total counter\n"
                   "tensord_metrics_dropped_series_total %llu\n",
                   (unsigned long long)m->dropped);
    pthread_mutex_unlock(&m->mu);
    return srv_buf_take(&b, len);
}
