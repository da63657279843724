/* bundle.h - private to the registry: reading a model's base path (version directories), a version's
 * signature.json / labels, and the loaded-version object (session, signature, batcher, reference count).
 * The disk functions keep no state; a version object is immutable after load except for its refcount.
 */
#ifndef SRV_BUNDLE_H
#define SRV_BUNDLE_H

#include "../engine/plan/plan.h"
#include "metrics.h"
#include "registry.h"

/* What tells "this version directory changed" apart: model.onnx identity and mtime, signature.json's mtime,
 * the directory's mtime. */
typedef struct srv_bundle_stamp {
    int64_t onnx_mtime_ns, onnx_size, dir_mtime_ns, sig_mtime_ns;
    uint64_t onnx_ino;
} srv_bundle_stamp;

typedef struct srv_bundle_ver {
    int64_t version;
    srv_bundle_stamp stamp;
} srv_bundle_ver;

/* 1 if name is a plain positive decimal integer that fits int64 (digits only, no sign, no leading zero). */
int srv_bundle_parse_version(const char *name, int64_t *version);
int srv_bundle_stamp_equal(const srv_bundle_stamp *a, const srv_bundle_stamp *b);

/* Version directories under base, highest first (malloc'd *out). Non-integer names, dot-dirs (".tmp-*")
 * and non-directories are skipped. NOT_FOUND if base cannot be read. */
srv_code srv_bundle_scan(const char *model, const char *base, srv_bundle_ver **out, int *n, srv_error *err);

/* One signature entry as written in signature.json (before it is resolved against the graph). */
typedef struct srv_bundle_alias {
    char *client, *onnx;
    eng_dtype dtype;             /* UNDEFINED: not given */
    int ndim;                    /* -1: not given */
    int64_t dims[ENG_MAX_DIMS];
} srv_bundle_alias;

/* A version's served signature and metadata. */
typedef struct srv_bundle_sig {
    /* from signature.json (all optional) */
    srv_bundle_alias *in_alias, *out_alias;
    int nin_alias, nout_alias;
    int has_inputs, has_outputs;
    eng_precision precision;
    char **labels;
    int nlabels;
    /* resolved against the graph */
    srv_io *inputs, *outputs;
    int ninputs, noutputs;
    int *out_index;              /* noutputs: position of outputs[i] in the graph's output list */
} srv_bundle_sig;

/* Read <vdir>/signature.json (absent: defaults) and labels; errors name model, version and file. */
srv_code srv_bundle_sig_read(const char *model, int64_t version, const char *vdir, srv_bundle_sig *sig,
                             srv_error *err);
/* Fill inputs/outputs from the graph and the aliases read before. */
srv_code srv_bundle_sig_resolve(const char *model, int64_t version, const char *vdir, const eng_graph *g,
                                srv_bundle_sig *sig, srv_error *err);
void srv_bundle_sig_free(srv_bundle_sig *sig);

/* Read a whole regular file of at most max bytes (NUL-terminated, malloc'd). -1 with errno on failure
 * (ENOENT when absent, EFBIG when larger than max). */
int srv_bundle_read_file(const char *path, size_t max, char **buf, size_t *len);

/* ---- a loaded version (the registry's srv_version) ---- */

#include <pthread.h>
#include <stdatomic.h>

#include "../engine/plan/session.h"

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
} srv_version_ctx;

/* Reads the signature, loads and plans model.onnx, starts the batcher, replays the warm-up file. No lock is
 * held. On success *out has one reference; on failure the half-built object was destroyed (so the registry
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
