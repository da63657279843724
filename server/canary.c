/* canary.c - per-route outcome windows (see canary.h). Latencies go into 96 log-spaced buckets (4 per power of
 * two from 1 us to 16 s), enough to tell a 2x slower p99 apart; p99 is the upper edge of the bucket holding it. */
#include "canary.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NB 96 /* 4 per power of two: 1 us .. 2^24 us (16 s) */

typedef struct cn_sec {
    int64_t sec;
    int64_t requests, errors;
    uint32_t hist[NB];
} cn_sec;

typedef struct cn_series {
    char model[256], label[256];
    cn_sec secs[SRV_CANARY_SECONDS];
} cn_series;

struct srv_canary {
    pthread_mutex_t mu;
    cn_series *series[SRV_CANARY_SERIES];
    int n;
};

static int64_t cn_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec;
}

static int cn_bucket(int64_t us) {
    if (us < 1) us = 1;
    int b = (int)(log2((double)us) * 4.0);
    return b < 0 ? 0 : b >= NB ? NB - 1 : b;
}

static int64_t cn_upper(int b) { return (int64_t)ceil(pow(2.0, (b + 1) / 4.0)); }

srv_canary *srv_canary_new(void) {
    srv_canary *c = calloc(1, sizeof *c);
    if (c) pthread_mutex_init(&c->mu, NULL);
    return c;
}

void srv_canary_free(srv_canary **pc) {
    if (!pc || !*pc) return;
    srv_canary *c = *pc;
    for (int i = 0; i < c->n; i++) free(c->series[i]);
    pthread_mutex_destroy(&c->mu);
    free(c);
    *pc = NULL;
}

static cn_series *cn_find(srv_canary *c, const char *model, const char *label, int create) {
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->series[i]->model, model) && !strcmp(c->series[i]->label, label)) return c->series[i];
    if (!create || c->n == SRV_CANARY_SERIES) return NULL;
    cn_series *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    snprintf(s->model, sizeof s->model, "%s", model);
    snprintf(s->label, sizeof s->label, "%s", label);
    c->series[c->n++] = s;
    return s;
}

void srv_canary_observe(srv_canary *c, const char *model, const char *label, int ok, int64_t latency_us) {
    if (!c || !model || !label) return;
    int64_t now = cn_now_s();
    pthread_mutex_lock(&c->mu);
    cn_series *s = cn_find(c, model, label, 1);
    if (s) {
        cn_sec *b = &s->secs[now % SRV_CANARY_SECONDS];
        if (b->sec != now) memset(b, 0, sizeof *b), b->sec = now;
        b->requests++;
        if (!ok) b->errors++;
        else b->hist[cn_bucket(latency_us)]++;
    }
    pthread_mutex_unlock(&c->mu);
}

srv_canary_stats srv_canary_window(srv_canary *c, const char *model, const char *label, int window_s) {
    srv_canary_stats st = {0};
    if (!c) return st;
    if (window_s < 1) window_s = 1;
    if (window_s > SRV_CANARY_SECONDS) window_s = SRV_CANARY_SECONDS;
    int64_t now = cn_now_s();
    uint64_t hist[NB] = {0}, ok = 0;
    pthread_mutex_lock(&c->mu);
    cn_series *s = cn_find(c, model, label, 0);
    for (int i = 0; s && i < SRV_CANARY_SECONDS; i++) {
        const cn_sec *b = &s->secs[i];
        if (b->sec <= now - window_s || b->sec > now || b->requests == 0) continue;
        st.requests += b->requests;
        st.errors += b->errors;
        for (int k = 0; k < NB; k++) hist[k] += b->hist[k], ok += b->hist[k];
    }
    pthread_mutex_unlock(&c->mu);
    if (ok > 0) {
        uint64_t need = (ok * 99 + 99) / 100, run = 0;
        for (int k = 0; k < NB; k++)
            if ((run += hist[k]) >= need) {
                st.p99_us = cn_upper(k);
                break;
            }
    }
    return st;
}

void srv_canary_reset(srv_canary *c, const char *model, const char *label) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    cn_series *s = cn_find(c, model, label, 0);
    if (s) memset(s->secs, 0, sizeof s->secs);
    pthread_mutex_unlock(&c->mu);
}
