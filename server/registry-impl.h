/* registry-impl.h - private to the registry's three files: the model table (registry.c), polling base paths
 * and reconciling versions with their policy (registry-poll.c), and the loader threads (loader.c).
 *
 * Locks (poll_mu before thr_mu or mu; thr_mu and mu are never held together):
 *   poll_mu  serialises reconcile steps (scan, decide, start loads, retire) and a loader's recording of its
 *            outcome. Never held while a load runs or while anyone waits for one (so a loader can always take
 *            it); the request path never takes it.
 *   thr_mu   the poller thread's stop/kick flags and condvar.
 *   mu       the model table: configs, labels, per-version states, the published (acquirable) versions, the
 *            loads in flight, the live-object and loader-thread counts. Held only briefly: never while parsing,
 *            planning, warming up or running a model, so a load never blocks requests (TF Serving #1866).
 *            Metrics may be recorded under it (metrics' own lock nests inside); nothing is logged under it
 *            (reg_notes collects lines to write after it is dropped).
 */
#ifndef SRV_REGISTRY_IMPL_H
#define SRV_REGISTRY_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "bundle.h"
#include "device.h"
#include "log.h"
#include "metrics.h"
#include "registry.h"
#include "version.h"

#define REG_KEEP_ENDED 32        /* END entries of versions gone from disk kept for status */
#define REG_FREE_GRACE_S 5.0     /* srv_registry_free waits this long for cancelled loads to stop */

typedef struct reg_ver {
    int64_t version;
    srv_state state;
    srv_code error_code;
    char *error_message;      /* NULL: none */
    srv_version *v;           /* published object (registry's reference), NULL if none */
    uint64_t ending_id;       /* retired object still referenced by requests, 0 if none */
    uint64_t load_id;         /* object id of the load in flight for this version, 0 if none */
    uint64_t last_load_id;    /* object id of the latest load started for it (srv_registry_load_model) */
    int failed;               /* load failed for this stamp: not retried until it changes */
    srv_bundle_stamp failed_stamp;
    int on_disk;
    int in_policy;            /* the version policy aspires it (not only a label's pin): default requests prefer these */
    int lost;                 /* retired because every device it ran on was lost: never loaded again in this process */
} reg_ver;

typedef struct reg_model {
    srv_model_config cfg;     /* label fields unused: labels live below */
    uint64_t gen;             /* identity across reconfiguration */
    reg_ver *vers;
    int nvers, cap;
    char **lnames;
    int64_t *lvers;
    int nl;
    int base_bad;             /* the last scan could not read the base path (logged once, and once on recovery) */
    int no_versions;          /* the last scan found no version directory (logged once) */
    int seen;                 /* explicit control: reconciled once (start-up, config change or load request) */
    int unloaded;             /* unloaded on request: left alone until srv_registry_load_model */
    uint64_t route_seq;       /* the traffic router's requests so far (srv_registry_route) */
    int64_t *pend;            /* versions named by labels waiting to be applied (reg_apply): pinned like lvers */
    int npend;
} reg_model;

/* One load in flight, owned by its loader thread (which frees it). Linked in r->loads until it finishes or
 * is abandoned (timed out, cancelled); an abandoned load's thread discards whatever it produces. */
typedef struct reg_load {
    srv_registry *r;
    char *model, *base;
    uint64_t gen;             /* the model's identity when it started */
    int64_t version;
    int instances;            /* execution instances for the version (srv_instances_resolve) */
    int instances_set;        /* 1: the model's instance_count or --instances_per_version set it */
    char *device;             /* the model's device spec, else the server's (server/device.h) */
    int precision;            /* the model config's precision, -1: the version's signature decides */
    uint64_t id;              /* the version object's id */
    srv_bundle_stamp stamp;   /* of the version directory when the load started */
    int64_t start_us, deadline_us;
    atomic_int cancel;        /* read by srv_version_load between its steps */
    int abandoned;            /* under mu */
    const char *why;          /* under mu: why it was abandoned (static text) */
    struct reg_load *next;    /* r->loads */
} reg_load;

/* Log lines gathered under mu and written after it is dropped. */
typedef struct reg_note {
    srv_log_level lv;
    const char *event;
    char *model;
    int64_t version;
    char *msg;
} reg_note;
typedef struct reg_notes {
    reg_note *n;
    int len, cap;
} reg_notes;

struct srv_registry {
    srv_registry_opts opts;
    char device[SRV_DEVICE_SPEC_MAX + 1]; /* opts.device points here */
    srv_batch_opts batch;
    pthread_mutex_t mu, poll_mu, thr_mu;
    pthread_cond_t live_cv, thr_cv, load_cv;
    reg_model **models;
    int nmodels;
    atomic_int routed_models; /* models with traffic routes: 0 lets the request path skip the router unlocked */
    atomic_int dead;          /* a version was retired for lost devices (srv_registry_live 0); dead_why under mu */
    char dead_why[SRV_ERR_MAX];
    uint64_t next_gen, next_id;
    int live;
    /* loads (under mu) */
    reg_load *loads;          /* in flight and not abandoned */
    int nthreads;             /* loader threads still running, abandoned ones included */
    uint64_t load_events;     /* bumped whenever a load finishes or is abandoned (load_cv is broadcast) */
    int closing;              /* srv_registry_free began: no new loads; waiters return */
    /* poller (under thr_mu) */
    pthread_t thr;
    int thr_running, stop, kick, polled_once;
    double poll_s;
};

/* ---- registry.c ---- */
reg_model *reg_find_model(srv_registry *r, const char *name);
reg_model *reg_find_model_gen(srv_registry *r, const char *name, uint64_t gen);
reg_ver *reg_find_ver(reg_model *m, int64_t version);
reg_ver *reg_get_ver(reg_model *m, int64_t version); /* under mu; NULL on OOM; invalidates pointers into vers */
void reg_set_error(reg_ver *e, srv_code code, const char *msg);
/* Under mu: detach m's published versions into out (room for count_published(m) more), marking them UNLOADING. */
int reg_count_published(const reg_model *m);
void reg_detach_all(reg_model *m, srv_version **out, int *n);
/* Drop the registry's reference on each of vs (logged as retired, with why) and free the array. No lock held. */
void reg_retire(srv_registry *r, srv_version **vs, int n, const char *why);
void reg_metrics_state(srv_registry *r, const char *model, int64_t version, srv_state s);
double reg_load_timeout_s(const srv_registry *r);

void reg_note_add(reg_notes *ns, srv_log_level lv, const char *event, const char *model, int64_t version,
                  const char *fmt, ...) __attribute__((format(printf, 6, 7)));
void reg_notes_flush(reg_notes *ns); /* writes and frees; no lock held */

/* ---- loader.c ---- */
/* Under mu: start loading version e of m (state LOADING) on a thread of its own. 0, or -1 when no thread could
 * be started (e is then END with the reason, not marked failed: the next poll retries). */
int reg_load_start(srv_registry *r, reg_model *m, reg_ver *e, const srv_bundle_stamp *stamp, reg_notes *ns);
/* Under mu: stop counting on l: unlinked, told to stop, its late result discarded. Its version entry, if still
 * l's, goes END with code and msg (and is marked failed for l's stamp when failed is set). */
void reg_load_abandon(srv_registry *r, reg_load *l, srv_code code, const char *msg, int failed, reg_notes *ns);
/* Under mu: abandon every load past its deadline (DEADLINE_EXCEEDED, failed). */
void reg_load_expire(srv_registry *r, reg_notes *ns);
/* Under mu: the earliest deadline of a load in flight, 0 if none. */
int64_t reg_load_next_deadline(srv_registry *r);
/* Under mu: wait until r->load_events differs from seen, the earliest load deadline passes, until_us passes
 * (0: no limit of its own), or the registry closes. */
void reg_load_wait(srv_registry *r, uint64_t seen, int64_t until_us);

/* ---- registry-poll.c ---- */
/* The model set the poller scans; see registry-poll.c. */
typedef struct poll_job {
    char *name, *base;
    srv_policy policy;
    int latest_n;
    int64_t *versions;
    int nversions;
    int64_t *pins;            /* versions labels point at (applied or pending): aspired whatever the policy */
    int npins;
    uint64_t gen;
} poll_job;
/* Under mu: a copy of m's config for reconciling without the lock. 0, or -1 on OOM. */
int reg_job_of(const reg_model *m, poll_job *j);
void reg_jobs_free(poll_job *jobs, int n); /* the n jobs' contents and the array */
/* Reconcile until no load of the jobs' aspired versions is in flight (each bounded by the load timeout),
 * waiting without any lock between rounds. scan_err (may be NULL) gets the first job's scan failure. */
void reg_reconcile_wait(srv_registry *r, const poll_job *jobs, int n, srv_error *scan_err);

#endif
