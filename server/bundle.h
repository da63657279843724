/* bundle.h - private to the registry: what the server reads from a model's base path beyond the layout itself
 * (which lives in engine/bundle.h: version names, scanning, paths, writing): the change stamps of each version
 * directory, and a version's signature.json / labels resolved into the served signature. The loaded-version
 * object is in version.h. Nothing here keeps state.
 */
#ifndef SRV_BUNDLE_H
#define SRV_BUNDLE_H

#include "../engine/plan/plan.h"
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

int srv_bundle_stamp_equal(const srv_bundle_stamp *a, const srv_bundle_stamp *b);

/* Version directories under base, highest first (malloc'd *out), each with its stamp: eng_bundle_scan's list
 * (non-version names such as "007", ".tmp-*" and non-directories skipped). NOT_FOUND if base cannot be read. */
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

/* The one opener for every file a load reads from a version directory (model.onnx, signature.json, the
 * labels_file, assets.extra/warmup.jsonl; external data goes through the same engine opener): path must
 * resolve (symlinks followed) inside vdir and be a regular file, and is opened O_RDONLY|O_NONBLOCK|O_CLOEXEC
 * (eng_file_open_regular), so no FIFO, device or escaping symlink in a version directory can make a load block
 * or read outside it. SRV_OK with *fd (close() it) and *size; SRV_NOT_FOUND when absent; otherwise
 * SRV_INVALID_ARGUMENT. why (why_cap bytes) gets the reason, naming the path and what it is
 * ("'<path>' is a FIFO, not a regular file"). */
srv_code srv_bundle_open(const char *vdir, const char *path, int *fd, uint64_t *size, char *why, size_t why_cap);
/* A whole file of at most max bytes through srv_bundle_open (NUL-terminated, malloc'd); codes and why as there
 * (a larger file is INVALID_ARGUMENT). */
srv_code srv_bundle_read(const char *vdir, const char *path, size_t max, char **buf, size_t *len, char *why,
                         size_t why_cap);

#endif
