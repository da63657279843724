/* jobs-impl.h - private to the job queue's files: jobs.c (queue, workers, progress, SSE, rollout) and jobs-submit.c
 * (checking a submission, the worker's job file, the API's view of a job).
 *
 * Lock: j->mu guards the running list, each run's event log and flags, and stopping; j->cv is broadcast on every
 * change (new event, run ended, new job, stop). The state store has its own lock; it is never taken under j->mu
 * for long writes except the short job-row updates of the scheduler.
 */
#ifndef ADM_JOBS_IMPL_H
#define ADM_JOBS_IMPL_H

#include <pthread.h>
#include <sys/types.h>

#include <cjson/cJSON.h>

#include "jobs.h"
#include "state-jobs.h"

#define JOB_EVENTS_MAX 20000 /* events a run keeps for SSE replay (the oldest progress events go first) */

typedef struct job_ev {
    char type[16];             /* progress | epoch | state */
    char *json;
} job_ev;

/* A running job: its worker and its event log. Referenced by the running list and by each SSE stream. */
typedef struct job_run {
    int64_t id;
    pid_t pid;
    int out_fd;                /* the worker's stdout (JSON lines) */
    pthread_t reader;
    int cancel_requested, ended, refs;
    job_ev *evs;
    int nev, cap;
    int64_t base_seq;          /* the sequence number of evs[0] */
    char *progress;            /* the last progress or epoch event (JSON), NULL none */
    struct job_run *next;
} job_run;

struct adm_jobs {
    adm_jobs_opts o;
    char *state_dir, *worker_exe, *jobs_dir;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job_run *runs;
    int nrunning;
    int stopping;
    pthread_t sched;
    int sched_on;
};

/* ---- jobs-submit.c ---- */
/* Check a submitted body against the model, its base version and the datasets; fill rec (QUEUED, model, dataset,
 * val_dataset, base_version, new_version, spec_json: the body with its defaults). Errors name the field. */
srv_code job_check(adm_jobs *j, const cJSON *body, adm_job_rec *rec, srv_error *err);
/* The worker's job file (JSON text, malloc'd) for rec; resume: continue from the newest checkpoint. */
char *job_worker_file(adm_jobs *j, const adm_job_rec *rec, int resume, srv_error *err);
/* A quantize job's worker: argv of `tensord quantize` for rec (NULL-terminated, malloc'd; free with job_argv_free). */
char **job_quantize_argv(adm_jobs *j, const adm_job_rec *rec, const char *exe, srv_error *err);
void job_argv_free(char **argv);
/* The "done" event of a quantize worker that wrote version at path: version, path, and val_accuracy / val_loss (MSE)
 * from its metrics.json's int8 evaluation (null when none). */
cJSON *job_quantize_done(const char *path, int64_t version);
/* The API's view of a job: the row, its spec, result and the last progress (live overrides the stored one). */
cJSON *job_view(const adm_job_rec *r, const char *live_progress);
/* A JSON object from text, or NULL. */
cJSON *job_parse(const char *text);

#endif
