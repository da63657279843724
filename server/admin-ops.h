/* admin-ops.h - the call table the server hands the admin room (admin/admin.h), over the registry. */
#ifndef SRV_ADMIN_OPS_H
#define SRV_ADMIN_OPS_H

#include "admin/admin.h"
#include "admin/state.h"
#include "registry.h"

#include <pthread.h>

#define SRV_ADMIN_HISTORY 16 /* stable versions remembered per model, for rollback after a promote */
#define SRV_ADMIN_MODELS 256

typedef struct srv_admin_hist {
    char model[256];
    int64_t prev[SRV_ADMIN_HISTORY]; /* stable's versions before each promote, newest last */
    int n;
    char reason[512];                /* the last automatic rollback's reason ("" none; under rmu) */
    int64_t reason_ms;
} srv_admin_hist;

typedef struct srv_admin_ctx {
    srv_registry *reg;
    const char *model_root; /* --model_root: base paths must resolve inside it (NULL: any) */
    pthread_mutex_t mu;     /* one admin change at a time (and the history) */
    srv_admin_hist hist[SRV_ADMIN_MODELS];
    adm_state *state;       /* --state_dir's SQLite file: every change is written there (NULL: not kept) */
    struct srv_canary *canary; /* routed requests' outcomes (the request path's), read by the monitor */
    struct srv_metrics *m;
    pthread_mutex_t rmu;    /* the monitor's wake-ups and the rollback reasons */
    pthread_cond_t mon_cv;
    pthread_t mon;
    int mon_on, mon_stop;
} srv_admin_ctx;

adm_ops srv_admin_ops(srv_admin_ctx *a);
/* At start, after the model config file: apply the kept admin changes on top (models added, labels, traffic,
 * the promote history). Models the state names that neither it nor the config file can serve are logged. */
srv_code srv_admin_restore(srv_admin_ctx *a, srv_error *err);
/* The automatic-rollback monitor: every 250 ms, each model with auto_rollback and a canary route is checked
 * against its window (canary.h); a crossing drops the route (logged, an "auto_rollback" swap event in metrics, the
 * reason in GET traffic and in the state's history). Stop it before the request path is freed. */
struct srv_canary;
struct srv_metrics;
int srv_admin_monitor_start(srv_admin_ctx *a, struct srv_canary *canary, struct srv_metrics *m);
void srv_admin_monitor_stop(srv_admin_ctx *a);

#endif
