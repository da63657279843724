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
} srv_admin_hist;

typedef struct srv_admin_ctx {
    srv_registry *reg;
    const char *model_root; /* --model_root: base paths must resolve inside it (NULL: any) */
    pthread_mutex_t mu;     /* one admin change at a time (and the history) */
    srv_admin_hist hist[SRV_ADMIN_MODELS];
    adm_state *state;       /* --state_dir's SQLite file: every change is written there (NULL: not kept) */
} srv_admin_ctx;

adm_ops srv_admin_ops(srv_admin_ctx *a);
/* At start, after the model config file: apply the kept admin changes on top (models added, labels, traffic,
 * the promote history). Models the state names that neither it nor the config file can serve are logged. */
srv_code srv_admin_restore(srv_admin_ctx *a, srv_error *err);

#endif
