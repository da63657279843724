/* jobs.h - training jobs over the admin API (issue 12): submission checked against the model and the dataset, a
 * persistent queue in the state store, worker processes (`tensord train --job FILE`), live progress, cancel, resume
 * after a server restart, and the rollout of the finished version through the router.
 *
 * Routes (bearer token checked by admin.c):
 *   POST /v1/admin/jobs                 {"model", "base_version": n | "latest" | label, "dataset", "val_dataset"? |
 *                                       "val_split"?, "epochs", "batch_size", "optimizer", "learning_rate", "momentum"?,
 *                                       "weight_decay"?, "schedule"?, "loss", "freeze"?, "early_stopping"?, "devices"?,
 *                                       "precision"?, "threads"?, "seed"?, "on_complete"?: {"action": "none" | "promote" |
 *                                       "canary", "traffic_percent"?, "label"?, "min_val_accuracy"?, "max_val_loss"?}}
 *                                       Or {"kind": "quantize", "model", "base_version"?, "dataset" (calibration),
 *                                       "val_dataset"? (the accuracy report and the gates), "method"? (minmax |
 *                                       percentile | entropy), "per_channel"?, "exclude"?: [node...], "threads"?,
 *                                       "on_complete"?}: `tensord quantize` as the worker, writing the int8 QDQ version.
 *                                       -> 201 the job (QUEUED). Checked up front: unknown keys, types and ranges, the
 *                                       model and its base version (AVAILABLE), the datasets, their columns against
 *                                       the model's inputs, devices (cpu only in this build), precision (fp32, or mixed_bf16 where the CPU has AVX512_BF16; mixed_fp16 is refused on
 *                                       the CPU).
 *   GET  /v1/admin/jobs                 {"jobs": [job...]}, newest first
 *   GET  /v1/admin/jobs/{id}            one job: state, epoch, step, loss, metrics, examples/s, ETA, the version it
 *                                       wrote, its metrics.json and TensorBoard directory, the rollout, the reason
 *   GET  /v1/admin/jobs/{id}/events     Server-Sent Events: `event: start` (a worker started: examples, steps per
 *                                       epoch, the step it resumed from), `event: progress` (steps, <= 10 a second),
 *                                       `event: epoch`, and `event: state` (every state change; the stream ends after
 *                                       the job ends). A stream opened mid-run first replays the run's events.
 *   POST /v1/admin/jobs/{id}:cancel     a queued job ends CANCELLED at once; a running one at its next step, with no
 *                                       version written (its checkpoints are deleted)
 *
 * Life of a job: QUEUED (row written) -> RUNNING (a worker process of its own, so a crash never harms serving; at
 * most max_concurrent at once on the CPU; each job gets a version number no other job of the model has had) ->
 * SUCCEEDED (the worker wrote the version atomically; on_complete then applies: promote moves the `stable` label
 * and all traffic to it; canary labels it and routes traffic_percent to it beside `stable`; the gates refuse to
 * roll out a version whose val_accuracy / val_loss misses them, the job still SUCCEEDS with the reason) | FAILED
 * (the worker's error, or the signal that killed it; no partial version) | CANCELLED.
 * When a job starts, the model's current version is pinned as `stable` with all routed traffic (if it has no `stable`
 * label or no routes yet), so the new version, which the version policy may load, takes no traffic before the
 * rollout (and none with on_complete none: it is then served only to requests that name it). A server stopped with jobs running leaves them RUNNING in the store and stops their workers; the next
 * start queues them again and their workers resume from their last checkpoint.
 */
#ifndef ADM_JOBS_H
#define ADM_JOBS_H

#include <microhttpd.h>

#include "admin.h"
#include "datasets.h"
#include "state.h"

typedef struct adm_jobs adm_jobs;

typedef struct adm_jobs_opts {
    adm_state *state;           /* required (not owned) */
    adm_datasets *datasets;     /* required (not owned) */
    adm_ops ops;                /* the server's calls (model info, labels, traffic, promote) */
    const char *state_dir;      /* job files and worker logs in <state_dir>/jobs/ */
    const char *worker_exe;     /* the tensord binary the workers run */
    int max_concurrent;         /* CPU jobs at once; <= 0: 1 */
} adm_jobs_opts;

/* Starts the scheduler; jobs left RUNNING by an earlier process are queued again to resume. NULL with err. */
adm_jobs *adm_jobs_new(const adm_jobs_opts *o, srv_error *err);
/* Stops the scheduler and the running workers (their jobs stay RUNNING in the store, to resume at the next start);
 * call after the admin listener stopped. Sets *j NULL. */
void adm_jobs_free(adm_jobs **j);

/* Answer a request under /v1/admin/jobs (body: its JSON body, may be NULL). */
enum MHD_Result adm_jobs_handle(adm_jobs *j, struct MHD_Connection *c, const char *method, const char *url,
                                const char *body, size_t len);

#endif
