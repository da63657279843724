/* version.h - private to the registry: the loaded-version object behind registry.h's opaque srv_version
 * (session, resolved signature, batcher, reference count) and how it is loaded and destroyed. The request-path
 * functions on it (srv_version_predict, _release, _get_info, ...) are declared in registry.h.
 * A version object is immutable after load except for its refcount and run-time estimates (version.c).
 */
#ifndef SRV_VERSION_H
#define SRV_VERSION_H

#include <pthread.h>
#include <stdatomic.h>

#include "../engine/plan/session.h"
#include "bundle.h"
#include "metrics.h"
#include "registry.h"

struct srv_version {
    srv_version_info info;
    char *model, *path;
    int64_t version;
    uint64_t id;
    atomic_int refs;
    srv_bundle_sig sig;
    eng_session *sess;
    pthread_mutex_t run_mu; /* one run + output copy at a time (session outputs are views) */
    _Atomic int64_t row_ns;  /* exponential average of run time per input row (ns); 0: not measured yet */
    atomic_int slow_runs;    /* runs in progress or waiting for run_mu not expected to be quick */
    srv_batcher *batcher;
    srv_metrics *metrics;
    srv_registry *reg;       /* told when this object is destroyed */
};

typedef struct srv_version_ctx {
    srv_registry *reg;
    uint64_t id;                 /* unique per object, chosen by the registry */
    int session_threads;
    const srv_batch_opts *batching; /* NULL: off; must outlive the version */
    srv_metrics *metrics;        /* may be NULL */
    const atomic_int *cancel;    /* may be NULL; once non-zero the load stops at its next step (CANCELLED) */
} srv_version_ctx;

/* Reads the signature, loads and plans model.onnx, starts the batcher, replays the warm-up file. No lock is
 * held. Every file is opened through srv_bundle_open (never blocks; stays in the version directory). Checks
 * ctx->cancel between steps and between warm-up records. On success *out has one reference; on failure the half-built object was destroyed (so the registry
 * was told through srv_registry_version_ended). Errors name model, version and file. */
srv_code srv_version_load(const srv_version_ctx *ctx, const char *model, const char *base, int64_t version,
                          srv_version **out, srv_error *err);
/* Frees v (its last reference is gone), then calls srv_registry_version_ended. */
void srv_version_destroy(srv_version *v);
/* Defined in registry.c: object `id` (model, version) is gone: its status entry goes END and its metrics
 * gauges are dropped (unless a newer object of the same version number is published). Takes the registry
 * lock; must be the last thing done with a version object. model may be NULL (allocation failed). */
void srv_registry_version_ended(srv_registry *r, const char *model, int64_t version, uint64_t id);

#endif
