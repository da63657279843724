/* session.h - the engine's front door: a loaded model plus a cache of compiled plans, keyed by (input shapes,
 * precision, backend), so one loaded model can run at fp32 and bf16 side by side (eng_session_run_at).
 *
 * A session owns its graph (after load-time rewrites such as fusion). eng_session_run validates inputs by name
 * against the model's declared inputs (unknown or missing names, dtype, rank and fixed dims, each error naming
 * the input with expected vs got), finds or compiles the plan for these shapes (compiled once, reused; up to
 * max_plans kept, least recently used evicted) and runs it. Runs on one session are serialised by a mutex;
 * use one session per concurrent stream, or batch requests.
 */
#ifndef ENG_SESSION_H
#define ENG_SESSION_H

#include "../ir/graph.h"
#include "plan.h"

typedef struct eng_session_opts {
    int nthreads;        /* <= 0: all cores */
    eng_precision precision;    /* of eng_session_run; refused at load when the backend cannot run it fast */
    const krn_backend *backend; /* NULL: CPU. A device backend (krn_backend_by_name): steps it supports run there */
    int device;          /* index of the backend's device */
    int no_fuse;         /* 1: skip fusion rewrites */
    const char *const *fp32_nodes; /* reduced precision: nodes kept fp32 (eng_plan_opts); must outlive the session */
    int nfp32_nodes;
    int max_plans;       /* <= 0: 16 */
    const unsigned char *dev_inputs;  /* device sessions: eng_plan_opts.dev_inputs / dev_outputs (by graph input /   */
    const unsigned char *dev_outputs; /* output index); must outlive the session                                     */
    /* eng_plan_opts.on_ready / ready_arg for every plan of this session (a trainer's gradient buckets) */
    void (*on_ready)(void *arg, krn_ctx *ctx, const int *idx, const eng_tensor *outs, int n);
    void *ready_arg;
} eng_session_opts;

typedef struct eng_session eng_session;

/* path: a model.onnx file, or a directory that holds model.onnx (a bundle's version directory). */
eng_status eng_session_new_file(const char *path, const eng_session_opts *opts, eng_session **out);
/* Takes ownership of g (freed on error too). */
eng_status eng_session_new_graph(eng_graph *g, const eng_session_opts *opts, eng_session **out);

const eng_graph *eng_session_graph(const eng_session *s);

/* inputs[i] is the tensor named names[i]; every graph input that is not an initializer must be given.
 * outputs: g->noutputs views into session memory, valid until the next run on this session or its free. */
eng_status eng_session_run(eng_session *s, int nin, const char *const *names, const eng_tensor *inputs,
                           eng_tensor *outputs);

/* As eng_session_run, at precision prec (which may differ from the session's: its plans are cached apart). */
eng_status eng_session_run_at(eng_session *s, eng_precision prec, int nin, const char *const *names,
                              const eng_tensor *inputs, eng_tensor *outputs);

/* Stats of the plan used by the last run (zeroed if none). */
void eng_session_last_stats(const eng_session *s, eng_plan_stats *st);
/* Device sessions: device memory held now: its shared weights (once) plus every cached plan's activations and own
 * constants. 0 on the CPU. Thread-safe (takes the session's lock: not while a run of it is in progress on the
 * calling thread). */
size_t eng_session_device_bytes(eng_session *s);

void eng_session_free(eng_session **s);

#endif
