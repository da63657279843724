/* state-jobs.h - training jobs in the admin state store (the `jobs` table of schema 3): one row per job, written
 * when it is submitted, started, makes progress (throttled by the caller), and ends. Every call is one transaction
 * under the store's lock (state-impl.h); a refused call leaves the file as it was.
 */
#ifndef ADM_STATE_JOBS_H
#define ADM_STATE_JOBS_H

#include <stdint.h>

#include "state.h"

typedef struct adm_job_rec {
    int64_t id;               /* assigned by adm_state_job_add */
    char *model;
    char *dataset;
    char *val_dataset;        /* NULL: none */
    char *spec_json;          /* the submitted job, as accepted (JSON object) */
    char *state;              /* QUEUED | RUNNING | SUCCEEDED | FAILED | CANCELLED */
    int64_t base_version, new_version;
    char *progress_json;      /* the last progress event (JSON object), NULL: none yet */
    char *result_json;        /* how it ended: version, metrics, rollout (JSON object), NULL: not ended */
    char *reason;             /* why it failed, was cancelled, or was not rolled out; NULL: none */
    int64_t created_ms, started_ms, ended_ms; /* 0: not yet */
} adm_job_rec;
void adm_job_rec_free(adm_job_rec *r); /* contents; leaves *r zeroed */

/* Insert r (its id is set); state must be QUEUED. */
srv_code adm_state_job_add(adm_state *s, adm_job_rec *r, srv_error *err);
/* Write r's state, versions, spec, progress, result, reason and times to row r->id. NOT_FOUND when absent. */
srv_code adm_state_job_update(adm_state *s, const adm_job_rec *r, srv_error *err);
/* Only progress_json of row id (the frequent write). */
srv_code adm_state_job_progress(adm_state *s, int64_t id, const char *progress_json, srv_error *err);
srv_code adm_state_job_get(adm_state *s, int64_t id, adm_job_rec *out, srv_error *err); /* NOT_FOUND */
/* Every job, newest first (state filter NULL) or only those in state; *out NULL when *n is 0. */
srv_code adm_state_job_list(adm_state *s, const char *state, adm_job_rec **out, int *n, srv_error *err);
/* The highest new_version any job of model ever had (0: none): versions are never handed out twice. */
srv_code adm_state_job_max_version(adm_state *s, const char *model, int64_t *v, srv_error *err);

#endif
