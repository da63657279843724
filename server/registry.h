/* registry.h - the model registry: models, their versions, version policies, loading, hot swap.
 *
 * Life of a version (TF Serving's states): START (seen on disk, aspired) -> LOADING (parse ONNX, plan,
 * warm up by replaying <version>/assets.extra/warmup.jsonl, a TF Serving REST predict body per line) ->
 * AVAILABLE (published: requests can acquire it) -> UNLOADING (left the policy: no new acquires; waits for
 * in-flight references to drop) -> END. A load failure goes START/LOADING -> END with error_code/error_message
 * kept in status; it never disturbs serving versions (availability-preserving: a newer version is published
 * BEFORE an older one that left the policy is retired).
 *
 * Loading: each load runs on a thread of its own, never on the poller, and without the registry lock while it
 * parses, plans or warms up, so a slow or stuck load blocks neither requests, nor the poller, nor a newer
 * version's load. A load that runs past load_timeout_s fails that version alone (END, DEADLINE_EXCEEDED); its
 * thread's late result is discarded. Every file a load reads is opened non-blocking, inside the version
 * directory, regular files only (srv_bundle_open): a FIFO as model.onnx fails that version at once.
 * Every load, failure, retirement and base-path problem is logged on stderr (server/log.h).
 *
 * Concurrency: the request path (acquire/release) takes a short per-registry lock and an atomic reference.
 * srv_version objects are reference counted: a version is freed only after the registry dropped it AND its
 * last request released it.
 */
#ifndef SRV_REGISTRY_H
#define SRV_REGISTRY_H

#include "batcher.h"

#include <stdatomic.h>
#include "srv.h"

typedef enum srv_state {
    SRV_STATE_UNKNOWN = 0,
    SRV_STATE_START = 10,
    SRV_STATE_LOADING = 20,
    SRV_STATE_AVAILABLE = 30,
    SRV_STATE_UNLOADING = 40,
    SRV_STATE_END = 50,
} srv_state;
const char *srv_state_name(srv_state s); /* "AVAILABLE", ... */

typedef enum srv_policy { SRV_POLICY_LATEST = 0, SRV_POLICY_ALL = 1, SRV_POLICY_SPECIFIC = 2 } srv_policy;

typedef struct srv_model_config {
    char *name;
    char *base_path;
    char *platform;          /* informational ("onnx", "tensorflow" accepted) */
    srv_policy policy;
    int latest_n;            /* SRV_POLICY_LATEST: keep the N highest versions (default 1) */
    int64_t *versions;       /* SRV_POLICY_SPECIFIC */
    int nversions;
    char **label_names;      /* version_labels */
    int64_t *label_versions;
    int nlabels;
    int precision;           /* tensord's `precision: "bf16"`: every version of the model runs at this eng_precision,
                              * whatever its signature.json says; -1 (or absent, 0 after memset: see precision_set) */
    int precision_set;       /* 1: `precision` was given; 0: each version's signature.json decides (fp32 default) */
    int instance_count;      /* execution instances per version (tensord's `instance_count`, Triton's
                              * instance_group count), 1..SRV_MAX_INSTANCES; 0: the server's default */
    char *device;            /* tensord's `device`: where its versions run, one device or a comma-separated list
                              * (server/device.h); NULL: the server's --device */
    /* Traffic (tensord's `traffic { ... }`): requests that name neither a version nor a label go to one of these
     * configured labels with probability weight / sum; sticky_header (may be NULL): requests with that header (gRPC
     * metadata) of the same value always go to the same label while the weights stay; shadow (may be NULL): a
     * label whose version also gets a copy of each routed request, off its critical path (reply discarded). */
    int nroutes;
    char **route_labels;
    int *route_weights;
    char *sticky_header;
    char *shadow;
    /* Automatic rollback of the canary (the one route beside "stable"): when over the last ar_window_s seconds it
     * answered at least ar_min_requests routed requests and its error share exceeds ar_max_error_rate, or its p99
     * latency exceeds ar_max_p99_ratio x stable's, its route is dropped (server/admin-ops.c's monitor). */
    int ar_on;
    double ar_max_error_rate, ar_max_p99_ratio;
    int ar_window_s, ar_min_requests;
} srv_model_config;
#define SRV_MAX_INSTANCES 64
void srv_model_config_free(srv_model_config *c); /* frees contents */

/* One input or output of a served signature. */
typedef struct srv_io {
    char *name;              /* name clients use (signature alias, default the ONNX name) */
    char *onnx_name;         /* graph value name */
    eng_dtype dtype;
    int ndim;                /* -1: unknown rank */
    int64_t dims[ENG_MAX_DIMS]; /* -1: unknown (e.g. batch) */
} srv_io;

typedef struct srv_version srv_version;

/* Read-only view of a published version; valid while a reference is held. */
typedef struct srv_version_info {
    const char *model;
    int64_t version;
    const char *path;
    const srv_io *inputs;
    int ninputs;
    const srv_io *outputs;
    int noutputs;
    const char *const *labels; /* class labels for :classify, from signature.json; NULL if none */
    int nlabels;
    size_t weight_bytes;
    double load_ms;
} srv_version_info;
const srv_version_info *srv_version_get_info(const srv_version *v);

/* Run inference on a held version: inputs by client name (all required inputs present, validated against
 * the signature: dtype and shape errors name the input with expected vs got). out receives the outputs in
 * signature order. Goes through the version's batcher when batching is on; otherwise runs on a free execution
 * instance, waiting for one while all are busy. deadline_us: absolute srv_now_us() deadline, 0 for none (when it
 * passes before the run starts, also while waiting for an instance: DEADLINE_EXCEEDED). cancel (may be NULL):
 * once it reads non-zero while the request waits for an instance, it ends CANCELLED (SRV_CANCEL_DEADLINE:
 * DEADLINE_EXCEEDED) without running. */
srv_code srv_version_predict(srv_version *v, const srv_tensors *in, srv_tensors *out, int64_t deadline_us,
                             const atomic_int *cancel, srv_error *err);
/* srv_version_predict through the version's batcher without waiting (srv_batcher_submit_async): 0 when the
 * version does not batch this request (no batcher, an input without a batch dimension); the caller then uses
 * srv_version_predict. Otherwise 1, and done(arg, code, err) runs exactly once: on a batch worker once out holds
 * the outputs, or before this returns when the request is refused (bad input, queue full, deadline passed).
 * in and out must stay valid, and v held, until then. cancel (may be NULL): see srv_batcher_submit_async. */
int srv_version_predict_async(srv_version *v, const srv_tensors *in, srv_tensors *out, int64_t deadline_us,
                              const atomic_int *cancel, srv_batch_done_fn done, void *arg);
/* 1 if srv_version_predict(v, in) is expected to return within about budget_us without waiting: no batcher,
 * a measured per-row run time (exponential average of earlier runs) times in's rows within the budget, and
 * an execution instance that is free or only held by a run that was itself expected to be that quick (fewer
 * runs in progress or waiting that were not expected to be quick than the version has instances). 0 when
 * unknown (no run measured yet). The REST server runs such requests on its polling thread. */
int srv_version_quick(srv_version *v, const srv_tensors *in, int64_t budget_us);
/* Execution instances of the version (runs of it that can proceed at once; Triton's instance_group count). */
int srv_version_instances(const srv_version *v);
/* Where instance i (0..srv_version_instances-1) runs: its resolved device name ("cpu", "cuda:0", "sim:1"); *gpu
 * (may be NULL) gets the device index, -1 for the CPU. */
const char *srv_version_instance_device(const srv_version *v, int i, int *gpu);

typedef struct srv_metrics srv_metrics;

typedef struct srv_registry_opts {
    int session_threads;         /* threads per inference run; <= 0: all cores */
    int instances_per_version;   /* execution instances of each version unless its model sets instance_count;
                                  * <= 0: max(1, usable cores / session_threads) (srv_instances_resolve) */
    const srv_batch_opts *batching; /* NULL: batching off */
    int allow_labels_for_unavailable; /* --allow_version_labels_for_unavailable_models */
    srv_metrics *metrics;        /* may be NULL */
    double load_timeout_s;       /* --model_load_timeout_seconds: a longer load fails that version only; <= 0: 600 */
    int explicit_control;        /* --model_control_mode=explicit: no poller; models load/unload on request
                                  * (srv_registry_load_model / srv_registry_unload_model) */
    const char *device;          /* --device: where versions of models without a `device` run (server/device.h);
                                  * copied; NULL: "auto" */
} srv_registry_opts;

typedef struct srv_registry srv_registry;

srv_registry *srv_registry_new(const srv_registry_opts *o);
/* Stops the poller, cancels loads in flight and waits for their threads (up to 5 s; a load still stuck in a
 * read then keeps the registry allocated for the rest of the process, logged), retires every version (waiting
 * for in-flight requests), frees; sets *r NULL. No other call on r may run concurrently but releases. */
void srv_registry_free(srv_registry **r);

/* Replace the served model set: new models are added, removed ones retired, changed policies/labels
 * applied. Validates names ([A-Za-z0-9_.-]+), duplicate names, labels pointing at versions. Copies the configs.
 * Labels pin: a version a label points at is loaded and kept loaded whatever the version policy says (the policy
 * decides the rest), so a label may name a version that is on disk but not loaded: the call loads it first and
 * returns once it is AVAILABLE. A label whose version is not on disk or fails to load is FAILED_PRECONDITION naming
 * the label, the version and why (not found, the load error), and the model's labels stay as they were (unless
 * allow_labels_for_unavailable, which applies them at once). Requests naming neither version nor label go to the
 * highest version the policy serves, or, while none is up, the highest a label pins. */
srv_code srv_registry_set_config(srv_registry *r, const srv_model_config *cfgs, int n, srv_error *err);

/* Per-model changes (the admin room's): add model c, or replace the model of that name (policy, labels, traffic),
 * leaving every other model as it is; validation and labels as in srv_registry_set_config. */
srv_code srv_registry_put_model(srv_registry *r, const srv_model_config *c, srv_error *err);
/* Remove one model: its loads are cancelled and its versions retired (each unloads once its in-flight requests
 * end); does not wait. NOT_FOUND when it is not served. */
srv_code srv_registry_remove_model(srv_registry *r, const char *model, srv_error *err);
/* Set or move one label of model (loading its version first when it is on disk but not loaded; see above). */
srv_code srv_registry_set_label(srv_registry *r, const char *model, const char *label, int64_t version, srv_error *err);
/* A copy of one model's config (labels and traffic included); free with srv_model_config_free. NOT_FOUND. */
srv_code srv_registry_get_model(srv_registry *r, const char *model, srv_model_config *out, srv_error *err);
/* A deep copy of s into d (labels and traffic included); 0, or -1 on OOM (d then empty). */
int srv_model_config_copy(srv_model_config *d, const srv_model_config *s);
/* Set label to version in c (added when c has no such label). */
srv_code srv_model_config_set_label(srv_model_config *c, const char *label, int64_t version, srv_error *err);

/* A copy of the served model set (labels and traffic included), in order: change one model and hand it back to
 * srv_registry_set_config, which applies only what differs. Free each with srv_model_config_free, then the array. */
srv_code srv_registry_get_config(srv_registry *r, srv_model_config **out, int *n, srv_error *err);

/* After a change and its loads: SRV_OK when each of cfgs' models has a version AVAILABLE, else the error of its
 * highest version (naming model, version and reason), or NOT_FOUND when none was found under its base path. */
srv_code srv_registry_check_available(srv_registry *r, const srv_model_config *cfgs, int n, srv_error *err);

/* Scan every model's base path and load/unload to match the policies. Blocks until the loads it needs have
 * ended (each succeeds, fails, or passes load_timeout_s), then retires what they replace. With explicit control
 * it looks only at models it never looked at (new in the config). Thread-safe. */
void srv_registry_poll(srv_registry *r);
/* srv_registry_poll now, then a background poller every poll_seconds (<= 0, or explicit control: none). */
int srv_registry_start(srv_registry *r, double poll_seconds);

/* Explicit model control (explicit_control; Triton's POST /v2/repository/models/{m}/load): re-read model's base
 * path and load what its policy asks for, also after srv_registry_unload_model, retrying versions that failed
 * before; returns once those loads ended (each bounded by load_timeout_s), after retiring what they replace.
 * SRV_OK when every load it started succeeded and a version is AVAILABLE. UNAVAILABLE when explicit control is
 * off; NOT_FOUND for a model not in the config, an unreadable base path or one without a matching version;
 * otherwise the code and message of the highest version that failed (naming model, version and reason). */
srv_code srv_registry_load_model(srv_registry *r, const char *model, srv_error *err);
/* Retire every version of model (each unloads when its last in-flight request ends) and cancel its loads in
 * flight; it stays configured, and nothing loads it again until srv_registry_load_model. Does not wait.
 * UNAVAILABLE when explicit control is off, NOT_FOUND for a model not in the config. */
srv_code srv_registry_unload_model(srv_registry *r, const char *model, srv_error *err);

/* Take a reference on a version to serve a request: version > 0 explicit, label non-NULL by label,
 * otherwise the highest AVAILABLE version. NOT_FOUND names the model/version/label; a version that exists
 * but is not yet/no longer available is UNAVAILABLE. Never blocks on loading. */
srv_version *srv_registry_acquire(srv_registry *r, const char *model, int64_t version, const char *label,
                                  srv_error *err);
void srv_version_release(srv_version *v);

typedef struct srv_version_status {
    char *model;
    int64_t version;
    srv_state state;
    srv_code error_code;
    char *error_message;     /* "" if none */
} srv_version_status;

/* Status of a model's versions (version > 0 or label: just that one), highest first. model NULL: every
 * model (for /v2/repository/index). Caller frees with srv_status_free. NOT_FOUND for an unknown model. */
srv_code srv_registry_status(srv_registry *r, const char *model, int64_t version, const char *label,
                             srv_version_status **out, int *n, srv_error *err);
void srv_status_free(srv_version_status *s, int n);

/* 1 if the model is configured (whatever the state of its versions). */
int srv_registry_has_model(srv_registry *r, const char *model);
/* The traffic router (model's `traffic` config), called by the request path for requests that name neither a
 * version nor a label. srv_registry_sticky_header: 1 and the header's name in buf when the model routes by one.
 * srv_registry_route: 1 when the model has routes: label gets the chosen route's label (by sticky's hash when
 * sticky is non-NULL, else the next of the model's evenly spread picks), shadow its shadow label ("" when none). */
int srv_registry_sticky_header(srv_registry *r, const char *model, char *buf, size_t cap);
int srv_registry_route(srv_registry *r, const char *model, const char *sticky, char *label, size_t cap, char *shadow,
                       size_t scap);

/* The model name metrics may record for a request (client names never become label values): model when a version
 * served it (served) or when it is configured and the request did not fail NOT_FOUND, else "". */
const char *srv_registry_metrics_model(srv_registry *r, const char *model, int served, srv_code code);

/* 1 if label is one of the model's configured version labels (metrics record only those by name). */
int srv_registry_has_label(srv_registry *r, const char *model, const char *label);
/* The batching options every version runs with, NULL when batching is off (fixed at srv_registry_new). */
const srv_batch_opts *srv_registry_batching(const srv_registry *r);

/* 1 when every configured model has at least one AVAILABLE version (health/ready). */
int srv_registry_ready(srv_registry *r);
/* Liveness (/v2/health/live, gRPC ServerLive): 1 until a version had to be retired because every device it runs on
 * was lost to a sticky error (srv_registry_sweep_lost); 0 from then on, with the first such reason in why[cap] (may
 * be NULL), since only a restart of the process recovers a corrupted CUDA context (a Kubernetes liveness probe then
 * restarts the pod). A lost device whose versions still run elsewhere leaves the server live. */
int srv_registry_live(srv_registry *r, char *why, size_t cap);

#endif
