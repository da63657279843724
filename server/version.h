/* version.h - private to the registry: the loaded-version object behind registry.h's opaque srv_version
 * (execution instances, resolved signature, batcher, reference count) and how it is loaded and destroyed. The
 * request-path functions on it (srv_version_predict, _release, _get_info, ...) are declared in registry.h.
 * A version object is immutable after load except for its refcount, which instances are busy, and run-time
 * estimates (version.c).
 */
#ifndef SRV_VERSION_H
#define SRV_VERSION_H

#include <pthread.h>
#include <stdatomic.h>

#include "../engine/plan/session.h"
#include "bundle.h"
#include "device.h"
#include "metrics.h"
#include "registry.h"

/* One execution instance of a version. */
typedef struct srv_instance {
    eng_session *sess;
    int busy;                   /* under the version's inst_mu */
    size_t weight_bytes;        /* initializers of this instance's (fused) graph */
    _Atomic size_t arena_bytes; /* largest activation arena of a plan it ran (eng_session_last_stats) */
    srv_device dev;             /* where it runs (instance i: the spec's device i % n) */
    int lost;                   /* under the version's inst_mu: its device was lost (srv_device_lost): it takes no
                                 * more runs */
    /* Device memory (non-host devices) the session holds, as of its last run (eng_session_device_bytes: the weights
     * once, plus each cached plan's activations). Written by the instance's holder; read by metrics. */
    _Atomic size_t dev_bytes;
} srv_instance;

struct srv_version {
    srv_version_info info;
    char *model, *path;
    int64_t version;
    uint64_t id;
    atomic_int refs;
    srv_bundle_sig sig;
    /* Execution instances (Triton's instance_group count): each its own session built from its own copy of the
     * parsed graph, so they share no mutable state. A run takes a free one (inst_mu, inst_cv) and holds it until
     * its outputs are copied out (session outputs are views). */
    srv_instance *inst;
    int ninst;               /* sessions built (all of them once loaded) */
    int ninst_alloc;         /* entries of inst */
    pthread_mutex_t inst_mu;
    pthread_cond_t inst_cv;  /* CLOCK_MONOTONIC (srv_now_us's clock): an instance was freed */
    int pin;                 /* under inst_mu: >= 0 while warming up instance `pin` alone; -1 otherwise */
    _Atomic int64_t row_ns;  /* exponential average of run time per input row (ns); 0: not measured yet */
    atomic_int slow_runs;    /* runs in progress or waiting for an instance not expected to be quick */
    srv_batcher *batcher;
    srv_metrics *metrics;
    srv_registry *reg;       /* told when this object is destroyed */
    char devices[SRV_DEVICE_SPEC_MAX + 1]; /* the distinct devices of its instances, comma-separated ("cpu", ...) */
    pthread_mutex_t dev_mu;  /* orders device-memory gauge updates (srv_version_metrics_devices) */
};

typedef struct srv_version_ctx {
    srv_registry *reg;
    uint64_t id;                 /* unique per object, chosen by the registry */
    int session_threads;
    int instances;               /* execution instances, 1..SRV_MAX_INSTANCES (srv_instances_resolve) */
    int instances_set;           /* 1: instances came from the model's instance_count or the server's flag; 0: the
                                  * default, which a device list replaces with one per device (srv_device_instances) */
    const char *device;          /* device spec (server/device.h); NULL: "auto" */
    const srv_batch_opts *batching; /* NULL: off; must outlive the version */
    srv_metrics *metrics;        /* may be NULL */
    const atomic_int *cancel;    /* may be NULL; once non-zero the load stops at its next step (CANCELLED) */
    int precision;               /* eng_precision the model config sets; -1: the version's signature.json decides */
} srv_version_ctx;

/* Resolves the device spec (a device that is not available fails the load: UNAVAILABLE with the reason), reads the
 * signature, parses model.onnx once and builds the instances' sessions from copies of the graph, each on its device;
 * on a device, compiles one plan per instance (a one-row batch of zeros) so that a version that does not fit the
 * device's memory fails here (RESOURCE_EXHAUSTED naming the device), not at its first request; starts the batcher,
 * replays the warm-up file on every instance. No lock is held. Every file is opened through srv_bundle_open (never blocks; stays in the version directory). Checks
 * ctx->cancel between steps and between warm-up records. On success *out has one reference; on failure the half-built object was destroyed (so the registry
 * was told through srv_registry_version_ended). Errors name model, version and file. */
srv_code srv_version_load(const srv_version_ctx *ctx, const char *model, const char *base, int64_t version,
                          srv_version **out, srv_error *err);
/* The instance count a version of a model gets: the model's instance_count when > 0, else the server's
 * --instances_per_version when > 0, else max(1, usable cores (sched_getaffinity) / session_threads), where
 * session_threads <= 0 means all cores (so 1 instance); capped at SRV_MAX_INSTANCES. */
int srv_instances_resolve(int model_count, int server_count, int session_threads);
/* Records v's instance gauges (count, bytes per instance) and device memory per device in v->metrics; no-op when
 * NULL. Thread-safe. */
void srv_version_metrics_instances(srv_version *v);
/* Device health: 1 when every execution instance of v runs on a lost device (srv_device_lost), so that v can answer
 * nothing until the server restarts; why[cap] gets "device <name> is lost (<first error>)" for one of them. Logs
 * nothing and takes no lock (the registry calls it under its own). */
int srv_version_all_lost(const srv_version *v, char *why, size_t cap);
/* Frees v (its last reference is gone), then calls srv_registry_version_ended. */
void srv_version_destroy(srv_version *v);
/* Defined in registry.c: object `id` (model, version) is gone: its status entry goes END and its metrics
 * gauges are dropped (unless a newer object of the same version number is published). Takes the registry
 * lock; must be the last thing done with a version object. model may be NULL (allocation failed). */
void srv_registry_version_ended(srv_registry *r, const char *model, int64_t version, uint64_t id);
/* Defined in registry.c: a device was found lost. Every published version of every model whose instances are all on
 * lost devices (srv_version_all_lost) is retired at once: its status goes UNLOADING, then END, with UNAVAILABLE and
 * the reason; it is never loaded again in this process (the poller leaves it alone), and the server is no longer
 * live (srv_registry_live). Versions with an instance left on a working device keep serving on it. Takes the
 * registry lock; call with no lock held. */
void srv_registry_sweep_lost(srv_registry *r);

#endif
