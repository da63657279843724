/* metrics.c - Prometheus metrics and Triton's per-version statistics for the serving process (see metrics.h),
 * text exposition format 0.0.4.
 *
 * Storage: one family per metric; each series is keyed by its rendered (escaped) label set and found through a
 * hash index, so recording is "render labels into a stack buffer, find or add, update" under one mutex. Next to
 * the families, one srv_vstat per version (keyed by its model="m",version="n" labels) holds the registry's last
 * state of the version (which makes it live, metrics.h) and its Triton statistics; the tensord_inference_*
 * families are rendered from those records, and so are GET .../stats replies: both read the same numbers.
 * Invariants:
 *   - A series recorded while its version was live is "reserved" and never refused; every other series (and
 *     every vstat of a version that is not live) counts against SRV_METRICS_MAX_SERIES per family (nother,
 *     nvother); a new one past that is dropped and counted in tensord_metrics_dropped_series_total.
 *   - srv_metrics_forget removes the version's request-path series, gauges and vstat; the lifecycle series it
 *     keeps (load latency, swap events) stop being reserved, so retired versions never grow the reserved set.
 *   - Histograms keep per-bucket counts; rendering makes them cumulative and adds _sum and _count.
 */
#include "metrics.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "json.h"
#include "srv.h"

#define SRV_METRICS_MAX_SERIES 10000
#define SRV_METRICS_MAX_BUCKETS 24
#define SRV_METRICS_MAX_BATCH_SIZES 4096 /* distinct batch sizes kept per version for batch_stats */
#define SRV_LABELS_MAX 1536

typedef enum srv_mtype { SRV_M_COUNTER, SRV_M_GAUGE, SRV_M_HISTOGRAM } srv_mtype;

typedef struct srv_mkey { /* first member of every indexed record */
    char *key;        /* rendered labels */
    uint64_t hash;
} srv_mkey;

typedef struct srv_mindex { /* open addressing, load <= 1/2; slot = position + 1, 0 = empty */
    int32_t *slot;
    uint32_t mask;
} srv_mindex;

typedef struct srv_series {
    srv_mkey k;        /* model="m",version="1",... (escaped) */
    char *model;       /* for srv_metrics_forget */
    int64_t version;
    int reserved;      /* recorded for a live version: not counted against the cap */
    double value;      /* counter / gauge */
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
    int nother;        /* series that are not reserved */
    srv_mindex ix;
} srv_family;

enum {
    SRV_F_REQ_COUNT, SRV_F_REQ_LAT, SRV_F_QUEUE, SRV_F_BATCH, SRV_F_PADDED, SRV_F_LOAD, SRV_F_SWAP,
    SRV_F_WEIGHTS, SRV_F_STATE, SRV_F_INSTANCES, SRV_F_INSTANCE_BYTES, SRV_F_DEVICE_BYTES, SRV_F_COUNT
};

/* Triton's inference_stats entries, in its order. */
enum { SRV_ST_SUCCESS, SRV_ST_FAIL, SRV_ST_QUEUE, SRV_ST_INPUT, SRV_ST_INFER, SRV_ST_OUTPUT, SRV_ST_COUNT };
static const char *const srv_st_names[SRV_ST_COUNT] = {"success",       "fail",          "queue",
                                                       "compute_input", "compute_infer", "compute_output"};

typedef struct srv_mdur {
    uint64_t count, ns;
} srv_mdur;

typedef struct srv_mbatch { /* one executed batch size */
    int64_t size;
    uint64_t count, in_ns, infer_ns, out_ns;
} srv_mbatch;

typedef struct srv_vstat {
    srv_mkey k;        /* model="m",version="1" */
    char *model;
    int64_t version;
    int state;         /* the registry's last state (srv_metrics_state), 0: none reported */
    srv_mdur d[SRV_ST_COUNT];
    uint64_t inferences, executions;
    int64_t last_ms;   /* wall clock of the last successful inference, ms since the epoch */
    srv_mbatch *batch; /* ascending size */
    int nbatch, capbatch;
} srv_vstat;

#define SRV_METRICS_LOST_MAX 64 /* devices tensord_device_lost lists (SRV_DEVICE_MAX) */

struct srv_metrics {
    pthread_mutex_t mu;
    srv_family f[SRV_F_COUNT];
    srv_vstat *v;
    int nv, capv, nvother;
    srv_mindex vix;
    uint64_t dropped;
    char lost[SRV_METRICS_LOST_MAX][40]; /* devices lost to a sticky error (tensord_device_lost), in order lost */
    int nlost;
};

static const double srv_lat_us[] = {50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000,
                                    500000, 1e6, 2.5e6, 5e6, 1e7, 3e7, 6e7};
static const double srv_rows[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096};
#define SRV_N(a) ((int)(sizeof a / sizeof a[0]))

static int srv_live_state(int state) { return state >= 10 && state <= 40; } /* START .. UNLOADING */

/* ---- hash index ---- */

static uint64_t srv_m_hash(const char *s) { /* FNV-1a */
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static const srv_mkey *srv_mkey_at(const void *base, size_t stride, int i) {
    return (const srv_mkey *)((const char *)base + (size_t)i * stride);
}

static int srv_mindex_find(const srv_mindex *x, const void *base, size_t stride, const char *key, uint64_t h) {
    if (!x->slot) return -1;
    for (uint32_t i = (uint32_t)h & x->mask;; i = (i + 1) & x->mask) {
        int32_t p = x->slot[i];
        if (!p) return -1;
        const srv_mkey *k = srv_mkey_at(base, stride, p - 1);
        if (k->hash == h && strcmp(k->key, key) == 0) return p - 1;
    }
}

/* Rebuild x over the n records at base with room for `want` records. -1 on OOM (x unchanged). */
static int srv_mindex_build(srv_mindex *x, const void *base, size_t stride, int n, int want) {
    uint32_t size = 16;
    while (size < (uint32_t)want * 2u && size < (1u << 30)) size <<= 1;
    int32_t *slot = calloc(size, sizeof *slot);
    if (!slot) return -1;
    for (int j = 0; j < n; j++) {
        uint32_t i = (uint32_t)srv_mkey_at(base, stride, j)->hash & (size - 1);
        while (slot[i]) i = (i + 1) & (size - 1);
        slot[i] = j + 1;
    }
    free(x->slot);
    x->slot = slot;
    x->mask = size - 1;
    return 0;
}

/* Make room in x for one more record beyond n, then index record n. -1 on OOM. */
static int srv_mindex_add(srv_mindex *x, const void *base, size_t stride, int n) {
    if (!x->slot || (uint32_t)(n + 1) * 2u > x->mask + 1) {
        if (srv_mindex_build(x, base, stride, n, 2 * (n + 1)) != 0) return -1;
    }
    uint32_t i = (uint32_t)srv_mkey_at(base, stride, n)->hash & x->mask;
    while (x->slot[i]) i = (i + 1) & x->mask;
    x->slot[i] = n + 1;
    return 0;
}

/* ---- life ---- */

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
        [SRV_F_WEIGHTS] = {"tensord_model_weights_bytes",
                           "Bytes of weights of a loaded version (one copy: each execution instance holds its own, "
                           "see tensord_model_instance_bytes).", SRV_M_GAUGE},
        [SRV_F_STATE] = {"tensord_model_version_state",
                         "Version state (TF Serving numbering: 10 start, 20 loading, 30 available, 40 unloading, "
                         "50 end).",
                         SRV_M_GAUGE},
        [SRV_F_INSTANCES] = {"tensord_model_instances",
                             "Execution instances of a loaded version (requests to it that run at once).", SRV_M_GAUGE},
        [SRV_F_INSTANCE_BYTES] = {"tensord_model_instance_bytes",
                                  "Bytes held by one execution instance, as the engine reports them: its copy of the "
                                  "weights plus the largest activation arena of a plan it has run. Not counted: "
                                  "kernels' packed weight copies, other cached plans' arenas, per-run scratch.",
                                  SRV_M_GAUGE},
        [SRV_F_DEVICE_BYTES] = {"tensord_device_memory_bytes",
                                "Device memory held by a version's execution instances on one device (CUDA, sim): "
                                "the device arena and uploaded constants of every plan they keep compiled.",
                                SRV_M_GAUGE},
    };
    memcpy(m->f, init, sizeof init);
    return m;
}

static void srv_series_free(srv_series *s) {
    free(s->k.key);
    free(s->model);
    free(s->buckets);
}

static void srv_vstat_free(srv_vstat *v) {
    free(v->k.key);
    free(v->model);
    free(v->batch);
}

void srv_metrics_free(srv_metrics **pm) {
    if (!pm || !*pm) return;
    srv_metrics *m = *pm;
    for (int i = 0; i < SRV_F_COUNT; i++) {
        for (int j = 0; j < m->f[i].n; j++) srv_series_free(&m->f[i].s[j]);
        free(m->f[i].s);
        free(m->f[i].ix.slot);
    }
    for (int j = 0; j < m->nv; j++) srv_vstat_free(&m->v[j]);
    free(m->v);
    free(m->vix.slot);
    pthread_mutex_destroy(&m->mu);
    free(m);
    *pm = NULL;
}

/* ---- labels ---- */

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

/* ---- records (caller holds m->mu) ---- */

static srv_vstat *srv_vstat_find(srv_metrics *m, const char *base) {
    int i = srv_mindex_find(&m->vix, m->v, sizeof *m->v, base, srv_m_hash(base));
    return i < 0 ? NULL : &m->v[i];
}

/* Room for one more element in an array of n (capacity *cap, doubling from 16). 0, or -1 out of memory. */
static int srv_m_grow(void **arr, int *cap, int n, size_t elem) {
    if (n < *cap) return 0;
    int nc = *cap ? *cap * 2 : 16;
    void *p = realloc(*arr, (size_t)nc * elem);
    if (!p) return -1;
    *arr = p;
    *cap = nc;
    return 0;
}

static int srv_vstat_live(const srv_vstat *v) { return v && srv_live_state(v->state); }

/* Find or add the vstat of (model, version > 0) keyed by its base labels; NULL when full (a version that is not
 * live, past the cap) or out of memory. A new one starts with state 0 (not live). */
static srv_vstat *srv_vstat_get(srv_metrics *m, const char *base, const char *model, int64_t version, int live) {
    srv_vstat *v = srv_vstat_find(m, base);
    if (v) return v;
    if (!live && m->nvother >= SRV_METRICS_MAX_SERIES) {
        m->dropped++;
        return NULL;
    }
    if (srv_m_grow((void **)&m->v, &m->capv, m->nv, sizeof *m->v) != 0) return NULL;
    v = &m->v[m->nv];
    memset(v, 0, sizeof *v);
    v->k.key = strdup(base);
    v->k.hash = srv_m_hash(base);
    v->model = strdup(model ? model : "");
    v->version = version;
    if (!v->k.key || !v->model || srv_mindex_add(&m->vix, m->v, sizeof *m->v, m->nv) != 0) {
        srv_vstat_free(v);
        return NULL;
    }
    m->nv++;
    m->nvother++; /* state 0: not live until srv_vstat_set_state says so */
    return v;
}

static void srv_vstat_set_state(srv_metrics *m, srv_vstat *v, int state) {
    int was = srv_live_state(v->state), now = srv_live_state(state);
    v->state = state;
    m->nvother += was && !now ? 1 : !was && now ? -1 : 0;
}

/* Find or add the series with these labels; NULL when refused (not reserved, past the cap) or out of memory. */
static srv_series *srv_series_get(srv_metrics *m, int fi, const char *labels, const char *model, int64_t version,
                                  int reserved) {
    srv_family *f = &m->f[fi];
    uint64_t h = srv_m_hash(labels);
    int i = srv_mindex_find(&f->ix, f->s, sizeof *f->s, labels, h);
    if (i >= 0) return &f->s[i];
    if (!reserved && f->nother >= SRV_METRICS_MAX_SERIES) {
        m->dropped++;
        return NULL;
    }
    if (srv_m_grow((void **)&f->s, &f->cap, f->n, sizeof *f->s) != 0) return NULL;
    srv_series *s = &f->s[f->n];
    memset(s, 0, sizeof *s);
    s->k.key = strdup(labels);
    s->k.hash = h;
    s->model = strdup(model ? model : "");
    s->version = version;
    s->reserved = reserved;
    if (f->type == SRV_M_HISTOGRAM) s->buckets = calloc((size_t)f->nbounds + 1, sizeof *s->buckets);
    if (!s->k.key || !s->model || (f->type == SRV_M_HISTOGRAM && !s->buckets) ||
        srv_mindex_add(&f->ix, f->s, sizeof *f->s, f->n) != 0) {
        srv_series_free(s);
        return NULL;
    }
    f->n++;
    f->nother += !reserved;
    return s;
}

/* Rebuild f's index after series were removed (f->n only shrank). */
static void srv_family_reindex(srv_family *f) {
    if (srv_mindex_build(&f->ix, f->s, sizeof *f->s, f->n, f->n + 1) == 0) return;
    memset(f->ix.slot, 0, ((size_t)f->ix.mask + 1) * sizeof *f->ix.slot); /* OOM: rebuild in place */
    for (int j = 0; j < f->n; j++) {
        uint32_t s = (uint32_t)f->s[j].k.hash & f->ix.mask;
        while (f->ix.slot[s]) s = (s + 1) & f->ix.mask;
        f->ix.slot[s] = j + 1;
    }
}

/* 1 if (model, version) is live; base holds its base labels. */
static int srv_reserved(srv_metrics *m, const char *base, int64_t version) {
    return version > 0 && srv_vstat_live(srv_vstat_find(m, base));
}

static void srv_observe(srv_series *s, const srv_family *f, double v) {
    int b = 0;
    while (b < f->nbounds && v > f->bounds[b]) b++;
    s->buckets[b]++;
    s->sum += v;
    s->count++;
}

static int64_t srv_wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void srv_dur_add(srv_mdur *d, int64_t ns) {
    d->count++;
    d->ns += ns > 0 ? (uint64_t)ns : 0;
}

/* ---- recording ---- */

static void srv_metrics_record(srv_metrics *m, const char *model, int64_t version, const char *label,
                               const char *api, const char *protocol, int code, int64_t latency_ns, int stats,
                               const srv_infer_times *t) {
    if (!m) return;
    char base[SRV_LABELS_MAX], lb[SRV_LABELS_MAX], lc[SRV_LABELS_MAX];
    size_t k = srv_base_labels(base, model, version);
    memcpy(lb, base, k + 1);
    memcpy(lc, base, k + 1);
    size_t kb = k, kc = k;
    if (label && *label) srv_label(lb, &kb, "label", label); /* per-route latency, beside per-route counts */
    srv_label(lb, &kb, "api", api);
    srv_label(lb, &kb, "protocol", protocol ? protocol : "rest");
    if (label && *label) srv_label(lc, &kc, "label", label);
    srv_label(lc, &kc, "api", api);
    srv_label(lc, &kc, "protocol", protocol ? protocol : "rest");
    srv_label(lc, &kc, "status", srv_code_name((srv_code)code));
    int64_t now_ms = stats && code == SRV_OK ? srv_wall_ms() : 0;
    pthread_mutex_lock(&m->mu);
    srv_vstat *vs = version > 0 ? srv_vstat_find(m, base) : NULL;
    int reserved = srv_vstat_live(vs);
    srv_series *s = srv_series_get(m, SRV_F_REQ_COUNT, lc, model, version, reserved);
    if (s) s->value += 1;
    s = srv_series_get(m, SRV_F_REQ_LAT, lb, model, version, reserved);
    if (s) srv_observe(s, &m->f[SRV_F_REQ_LAT], (double)(latency_ns / 1000));
    if (stats && version > 0 && model && *model && (vs || (vs = srv_vstat_get(m, base, model, version, 0)))) {
        if (code != SRV_OK) {
            srv_dur_add(&vs->d[SRV_ST_FAIL], latency_ns);
        } else {
            srv_dur_add(&vs->d[SRV_ST_SUCCESS], latency_ns);
            srv_dur_add(&vs->d[SRV_ST_QUEUE], t ? t->queue_ns : 0);
            srv_dur_add(&vs->d[SRV_ST_INPUT], t ? t->input_ns : 0);
            srv_dur_add(&vs->d[SRV_ST_INFER], t ? t->infer_ns : 0);
            srv_dur_add(&vs->d[SRV_ST_OUTPUT], t ? t->output_ns : 0);
            vs->inferences += t && t->rows > 0 ? (uint64_t)t->rows : 1;
            vs->last_ms = now_ms;
        }
    }
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_request(srv_metrics *m, const char *model, int64_t version, const char *label, const char *api,
                         const char *protocol,                          int code, int64_t latency_us) {
    srv_metrics_record(m, model, version, label, api, protocol, code, latency_us * 1000, 0, NULL);
}

void srv_metrics_infer(srv_metrics *m, const char *model, int64_t version, const char *label, const char *api,
                       const char *protocol,                        int code, int64_t latency_ns, const srv_infer_times *t) {
    srv_metrics_record(m, model, version, label, api, protocol, code, latency_ns, 1, t);
}

int64_t srv_metrics_clock_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The last engine run on this thread (srv_metrics_run / srv_infer_times_run). */
static _Thread_local struct {
    int64_t start, infer_end, end;
} srv_m_last_run;

void srv_metrics_run(srv_metrics *m, const char *model, int64_t version, int64_t rows, int64_t start_ns,
                     int64_t infer_end_ns, int64_t end_ns) {
    srv_m_last_run.start = start_ns;
    srv_m_last_run.infer_end = infer_end_ns;
    srv_m_last_run.end = end_ns;
    if (!m || version <= 0) return;
    char base[SRV_LABELS_MAX];
    srv_base_labels(base, model, version);
    pthread_mutex_lock(&m->mu);
    srv_vstat *vs = srv_vstat_find(m, base);
    if (vs && (vs->state == 30 || vs->state == 40)) { /* AVAILABLE, UNLOADING: not warm-up */
        vs->executions++;
        int lo = 0, hi = vs->nbatch; /* first entry with size >= rows */
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (vs->batch[mid].size < rows) lo = mid + 1;
            else hi = mid;
        }
        srv_mbatch *b = lo < vs->nbatch && vs->batch[lo].size == rows ? &vs->batch[lo] : NULL;
        if (!b && vs->nbatch < SRV_METRICS_MAX_BATCH_SIZES) {
            if (vs->nbatch == vs->capbatch) {
                int cap = vs->capbatch ? vs->capbatch * 2 : 8;
                srv_mbatch *nb = realloc(vs->batch, (size_t)cap * sizeof *nb);
                if (nb) vs->batch = nb, vs->capbatch = cap;
            }
            if (vs->nbatch < vs->capbatch) {
                memmove(&vs->batch[lo + 1], &vs->batch[lo], (size_t)(vs->nbatch - lo) * sizeof *vs->batch);
                b = &vs->batch[lo];
                *b = (srv_mbatch){.size = rows};
                vs->nbatch++;
            }
        }
        if (b) {
            b->count++; /* in_ns stays 0: a batch's inputs are prepared before the run (batcher, decode) */
            b->infer_ns += (uint64_t)(infer_end_ns > start_ns ? infer_end_ns - start_ns : 0);
            b->out_ns += (uint64_t)(end_ns > infer_end_ns ? end_ns - infer_end_ns : 0);
        }
    }
    pthread_mutex_unlock(&m->mu);
}

void srv_infer_times_run(srv_infer_times *t, int64_t decoded_ns) {
    if (srv_m_last_run.end > 0 && srv_m_last_run.start >= decoded_ns) {
        t->queue_ns = srv_m_last_run.start - decoded_ns;
        t->infer_ns = srv_m_last_run.infer_end - srv_m_last_run.start;
        t->output_ns = srv_m_last_run.end - srv_m_last_run.infer_end;
    } else {
        t->infer_ns = srv_metrics_clock_ns() - decoded_ns;
    }
}

static void srv_metrics_hist(srv_metrics *m, int fi, const char *model, int64_t version, double v) {
    if (!m) return;
    char lb[SRV_LABELS_MAX];
    srv_base_labels(lb, model, version);
    pthread_mutex_lock(&m->mu);
    srv_series *s = srv_series_get(m, fi, lb, model, version, srv_reserved(m, lb, version));
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
    char base[SRV_LABELS_MAX], lb[SRV_LABELS_MAX];
    size_t k = srv_base_labels(base, model, version);
    memcpy(lb, base, k + 1);
    if (event) srv_label(lb, &k, "event", event);
    pthread_mutex_lock(&m->mu);
    srv_series *s = srv_series_get(m, fi, lb, model, version, srv_reserved(m, base, version));
    if (s) s->value = add ? s->value + v : v;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_load(srv_metrics *m, const char *model, int64_t version, double load_ms, size_t weight_bytes) {
    srv_metrics_set(m, SRV_F_LOAD, model, version, NULL, load_ms, 0);
    srv_metrics_set(m, SRV_F_WEIGHTS, model, version, NULL, (double)weight_bytes, 0);
}

/* Under m->mu: the instance-bytes series of (model, version) for instance idx; labels in lb. */
static srv_series *srv_instance_series(srv_metrics *m, const char *model, int64_t version, int idx, char *lb) {
    char base[SRV_LABELS_MAX], is[16];
    size_t k = srv_base_labels(base, model, version);
    memcpy(lb, base, k + 1);
    snprintf(is, sizeof is, "%d", idx);
    srv_label(lb, &k, "instance", is);
    return srv_series_get(m, SRV_F_INSTANCE_BYTES, lb, model, version, srv_reserved(m, base, version));
}

/* Drop f's series of (model, version); with from_instance >= 0 only those with instance="k", k >= it. m->mu held. */
static void srv_family_drop(srv_family *f, const char *model, int64_t version, int from_instance) {
    int w = 0;
    for (int j = 0; j < f->n; j++) {
        srv_series *s = &f->s[j];
        const char *ip = from_instance >= 0 ? strstr(s->k.key, ",instance=\"") : NULL;
        int match = s->version == version && strcmp(s->model, model) == 0 &&
                    (from_instance < 0 || (ip && atoi(ip + 11) >= from_instance));
        if (match) {
            f->nother -= !s->reserved;
            srv_series_free(s);
        } else {
            f->s[w++] = *s;
        }
    }
    if (w != f->n) {
        f->n = w;
        srv_family_reindex(f);
    }
}

void srv_metrics_instances(srv_metrics *m, const char *model, int64_t version, int n, const size_t *bytes) {
    if (!m) return;
    srv_metrics_set(m, SRV_F_INSTANCES, model, version, NULL, n, 0);
    char lb[SRV_LABELS_MAX];
    const char *mn = model ? model : "";
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < n; i++) {
        srv_series *s = srv_instance_series(m, model, version, i, lb);
        if (s && (double)bytes[i] > s->value) s->value = (double)bytes[i];
    }
    /* instances past n (an earlier object of this version number had more) */
    srv_family_drop(&m->f[SRV_F_INSTANCE_BYTES], mn, version, n);
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_instance_bytes(srv_metrics *m, const char *model, int64_t version, int idx, size_t bytes) {
    if (!m) return;
    char lb[SRV_LABELS_MAX];
    pthread_mutex_lock(&m->mu);
    srv_series *s = srv_instance_series(m, model, version, idx, lb);
    if (s && (double)bytes > s->value) s->value = (double)bytes;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_device_memory(srv_metrics *m, const char *model, int64_t version, int n, const char *const *names,
                               const size_t *bytes) {
    if (!m) return;
    char base[SRV_LABELS_MAX], lb[SRV_LABELS_MAX];
    size_t k0 = srv_base_labels(base, model, version);
    const char *mn = model ? model : "";
    pthread_mutex_lock(&m->mu);
    srv_family *f = &m->f[SRV_F_DEVICE_BYTES];
    int w = 0;
    for (int j = 0; j < f->n; j++) { /* this version's devices not listed now */
        srv_series *s = &f->s[j];
        int keep = s->version != version || strcmp(s->model, mn) != 0;
        for (int i = 0; !keep && i < n; i++) {
            size_t k = k0;
            memcpy(lb, base, k0 + 1);
            srv_label(lb, &k, "device", names[i]);
            keep = strcmp(s->k.key, lb) == 0;
        }
        if (keep) {
            f->s[w++] = *s;
        } else {
            f->nother -= !s->reserved;
            srv_series_free(s);
        }
    }
    if (w != f->n) {
        f->n = w;
        srv_family_reindex(f);
    }
    for (int i = 0; i < n; i++) {
        size_t k = k0;
        memcpy(lb, base, k0 + 1);
        srv_label(lb, &k, "device", names[i]);
        srv_series *s = srv_series_get(m, SRV_F_DEVICE_BYTES, lb, model, version, srv_reserved(m, base, version));
        if (s) s->value = (double)bytes[i];
    }
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_swap(srv_metrics *m, const char *model, int64_t version, const char *event) {
    srv_metrics_set(m, SRV_F_SWAP, model, version, event ? event : "", 1, 1);
}

void srv_metrics_state(srv_metrics *m, const char *model, int64_t version, int state) {
    if (!m) return;
    if (version > 0 && model && *model) {
        char base[SRV_LABELS_MAX];
        srv_base_labels(base, model, version);
        pthread_mutex_lock(&m->mu);
        srv_vstat *vs = srv_vstat_get(m, base, model, version, srv_live_state(state));
        if (vs) srv_vstat_set_state(m, vs, state);
        pthread_mutex_unlock(&m->mu);
    }
    srv_metrics_set(m, SRV_F_STATE, model, version, NULL, state, 0);
}

void srv_metrics_forget(srv_metrics *m, const char *model, int64_t version) {
    if (!m) return;
    const char *mn = model ? model : "";
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < SRV_F_COUNT; i++) {
        srv_family *f = &m->f[i];
        if (i != SRV_F_LOAD && i != SRV_F_SWAP) {
            srv_family_drop(f, mn, version, -1);
            continue;
        }
        for (int j = 0; j < f->n; j++) { /* lifecycle history stays, but no longer exempt from the cap */
            srv_series *s = &f->s[j];
            if (s->reserved && s->version == version && strcmp(s->model, mn) == 0) {
                s->reserved = 0;
                f->nother++;
            }
        }
    }
    int w = 0;
    for (int j = 0; j < m->nv; j++) {
        srv_vstat *v = &m->v[j];
        if (v->version == version && strcmp(v->model, mn) == 0) {
            m->nvother -= !srv_vstat_live(v);
            srv_vstat_free(v);
        } else {
            m->v[w++] = *v;
        }
    }
    if (w != m->nv) {
        m->nv = w;
        if (srv_mindex_build(&m->vix, m->v, sizeof *m->v, m->nv, m->nv + 1) != 0) {
            memset(m->vix.slot, 0, ((size_t)m->vix.mask + 1) * sizeof *m->vix.slot);
            for (int j = 0; j < m->nv; j++) {
                uint32_t s = (uint32_t)m->v[j].k.hash & m->vix.mask;
                while (m->vix.slot[s]) s = (s + 1) & m->vix.mask;
                m->vix.slot[s] = j + 1;
            }
        }
    }
    pthread_mutex_unlock(&m->mu);
}

/* ---- Triton statistics ---- */

static void srv_dur_json(srv_buf *b, const char *name, uint64_t count, uint64_t ns) {
    srv_buf_printf(b, "\"%s\":{\"count\":%llu,\"ns\":%llu}", name, (unsigned long long)count, (unsigned long long)ns);
}

void srv_metrics_stats_json(srv_metrics *m, const char *model, int64_t version, srv_buf *b) {
    srv_vstat v = {0};
    srv_mbatch *batch = NULL;
    if (m) {
        char base[SRV_LABELS_MAX];
        srv_base_labels(base, model, version);
        pthread_mutex_lock(&m->mu);
        const srv_vstat *vs = srv_vstat_find(m, base);
        if (vs) {
            v = *vs;
            batch = v.nbatch ? malloc((size_t)v.nbatch * sizeof *batch) : NULL;
            if (batch) memcpy(batch, vs->batch, (size_t)v.nbatch * sizeof *batch);
            else v.nbatch = 0;
        }
        pthread_mutex_unlock(&m->mu);
    }
    srv_buf_puts(b, "{\"name\":");
    srv_buf_json_str(b, model ? model : "");
    srv_buf_printf(b, ",\"version\":\"%lld\",\"last_inference\":%lld,\"inference_count\":%llu,\"execution_count\":%llu,"
                      "\"inference_stats\":{",
                   (long long)version, (long long)v.last_ms, (unsigned long long)v.inferences,
                   (unsigned long long)v.executions);
    for (int i = 0; i < SRV_ST_COUNT; i++) {
        if (i) srv_buf_puts(b, ",");
        srv_dur_json(b, srv_st_names[i], v.d[i].count, v.d[i].ns);
    }
    srv_buf_puts(b, ",");
    srv_dur_json(b, "cache_hit", 0, 0);
    srv_buf_puts(b, ",");
    srv_dur_json(b, "cache_miss", 0, 0);
    srv_buf_puts(b, "},\"batch_stats\":[");
    for (int i = 0; i < v.nbatch; i++) {
        srv_buf_printf(b, "%s{\"batch_size\":%lld,", i ? "," : "", (long long)batch[i].size);
        srv_dur_json(b, "compute_input", batch[i].count, batch[i].in_ns);
        srv_buf_puts(b, ",");
        srv_dur_json(b, "compute_infer", batch[i].count, batch[i].infer_ns);
        srv_buf_puts(b, ",");
        srv_dur_json(b, "compute_output", batch[i].count, batch[i].out_ns);
        srv_buf_puts(b, "}");
    }
    srv_buf_puts(b, "],\"memory_usage\":[]}");
    free(batch);
}

/* ---- rendering ---- */

static void srv_num(srv_buf *b, double v) {
    if (v == (double)(int64_t)v && v > -9e15 && v < 9e15) srv_buf_printf(b, "%lld", (long long)v);
    else srv_buf_printf(b, "%.17g", v);
}

static void srv_render_stats(srv_buf *b, const srv_metrics *m) {
    srv_buf_puts(b, "# HELP tensord_inference_stats_count Triton statistics: inference requests (success, fail) "
                      "and the phases of successful ones, by version.\n# TYPE tensord_inference_stats_count counter\n");
    for (int j = 0; j < m->nv && !b->oom; j++)
        for (int i = 0; i < SRV_ST_COUNT; i++)
            srv_buf_printf(b, "tensord_inference_stats_count{%s,stat=\"%s\"} %llu\n", m->v[j].k.key, srv_st_names[i],
                           (unsigned long long)m->v[j].d[i].count);
    srv_buf_puts(b, "# HELP tensord_inference_stats_ns Triton statistics: cumulative duration of each entry of "
                    "tensord_inference_stats_count, nanoseconds.\n# TYPE tensord_inference_stats_ns counter\n");
    for (int j = 0; j < m->nv && !b->oom; j++)
        for (int i = 0; i < SRV_ST_COUNT; i++)
            srv_buf_printf(b, "tensord_inference_stats_ns{%s,stat=\"%s\"} %llu\n", m->v[j].k.key, srv_st_names[i],
                           (unsigned long long)m->v[j].d[i].ns);
    srv_buf_puts(b, "# HELP tensord_inference_count Inferences (rows) of successful requests.\n"
                    "# TYPE tensord_inference_count counter\n");
    for (int j = 0; j < m->nv && !b->oom; j++)
        srv_buf_printf(b, "tensord_inference_count{%s} %llu\n", m->v[j].k.key, (unsigned long long)m->v[j].inferences);
    srv_buf_puts(b, "# HELP tensord_inference_exec_count Engine runs (a batch, or one unbatched request).\n"
                    "# TYPE tensord_inference_exec_count counter\n");
    for (int j = 0; j < m->nv && !b->oom; j++)
        srv_buf_printf(b, "tensord_inference_exec_count{%s} %llu\n", m->v[j].k.key,
                       (unsigned long long)m->v[j].executions);
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
            const char *sep = s->k.key[0] ? "," : "";
            if (f->type != SRV_M_HISTOGRAM) {
                srv_buf_printf(&b, "%s{%s} ", f->name, s->k.key);
                srv_num(&b, s->value);
                srv_buf_puts(&b, "\n");
                continue;
            }
            uint64_t cum = 0;
            for (int k = 0; k <= f->nbounds; k++) {
                cum += s->buckets[k];
                if (k < f->nbounds) srv_buf_printf(&b, "%s_bucket{%s%sle=\"%.17g\"} %llu\n", f->name, s->k.key, sep,
                                                   f->bounds[k], (unsigned long long)cum);
                else srv_buf_printf(&b, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", f->name, s->k.key, sep,
                                    (unsigned long long)cum);
            }
            srv_buf_printf(&b, "%s_sum{%s} ", f->name, s->k.key);
            srv_num(&b, s->sum);
            srv_buf_printf(&b, "\n%s_count{%s} %llu\n", f->name, s->k.key, (unsigned long long)s->count);
        }
    }
    srv_render_stats(&b, m);
    srv_buf_puts(&b, "# HELP tensord_device_lost 1 for each device a sticky error made unusable until the server "
                     "restarts (its CUDA context is corrupted); devices that work are not listed.\n"
                     "# TYPE tensord_device_lost gauge\n");
    for (int i = 0; i < m->nlost && !b.oom; i++) srv_buf_printf(&b, "tensord_device_lost{device=\"%s\"} 1\n", m->lost[i]);
    srv_buf_printf(&b,
                   "# HELP tensord_metrics_dropped_series_total Records dropped because a metric reached its "
                   "series limit.\n# TYPE tensord_metrics_dropped_series_total counter\n"
                   "tensord_metrics_dropped_series_total %llu\n",
                   (unsigned long long)m->dropped);
    pthread_mutex_unlock(&m->mu);
    return srv_buf_take(&b, len);
}

void srv_metrics_device_lost(srv_metrics *m, const char *device) {
    if (!m || !device) return;
    pthread_mutex_lock(&m->mu);
    int known = 0;
    for (int i = 0; i < m->nlost && !known; i++) known = strcmp(m->lost[i], device) == 0;
    if (!known && m->nlost < SRV_METRICS_LOST_MAX) snprintf(m->lost[m->nlost++], sizeof m->lost[0], "%s", device);
    pthread_mutex_unlock(&m->mu);
}
