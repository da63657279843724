/* train-impl.h - what the training files share (engine/train*.c); not a public interface.
 *
 *   train.c          eng_train: base version, graphs (training + eval), data, sessions, the epoch loop,
 *                    progress reports and the cancel flag
 *   train-loop.c     one step over R replicas (threads + all-reduce), validation, progress bar
 *   train-ckpt.c     checkpoints (binary, versioned, CRC-checked) and the atomic write helper with its test hook
 *   train-version.c  writing version N+1 (model.onnx, metrics.json, signature.json) atomically
 *
 * Invariants: the trainer owns one float32 buffer per state tensor (trainable params and BatchNorm running
 * statistics); every session reads them as graph inputs each run, so no session ever holds stale weights.
 */
#ifndef ENG_TRAIN_IMPL_H
#define ENG_TRAIN_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "allreduce.h"
#include "../data/data.h"
#include "../plan/session.h"
#include "tfevents.h"
#include "train.h"
#include "loss-scale.h"
#include "recompute.h"

typedef struct trn_param {
    char *name;
    eng_tensor t;   /* float32, the initializer's shape; data = w */
    float *w;       /* current value (eng_alloc'd) */
    float *best;    /* keep_best snapshot, or NULL */
    int64_t n;      /* elements */
    int is_bn;      /* BatchNorm running statistic: updated from "bn_update/<name>", not by the optimizer */
    int out;        /* training graph output index: "grad/<name>" or "bn_update/<name>"; -1 if absent */
    int64_t off;    /* offset of this tensor in a replica's packed all-reduce buffer */
} trn_param;

typedef struct trn_epoch {
    int64_t epoch; /* 1-based, as Keras prints it */
    double loss, accuracy, val_loss, val_accuracy, lr, examples_per_sec, seconds;
} trn_epoch;

typedef struct trn_stepm {
    int64_t step; /* 1-based */
    double loss;
} trn_stepm;

/* Everything a checkpoint holds besides tensors and optimizer state. */
typedef struct trn_state {
    int64_t epoch;          /* current epoch, 0-based */
    int64_t step_in_epoch;  /* batches done in the current epoch */
    int64_t global_step;    /* batches done overall */
    eng_rng rng;
    double ep_loss_sum, ep_acc_sum, ep_seconds; /* partial-epoch accumulators (sums weighted by rows) */
    int64_t ep_rows;
    double best;            /* best monitored value so far (early stopping / keep_best) */
    int64_t best_epoch;     /* 1-based; 0: none */
    int64_t wait;           /* epochs without improvement */
    uint64_t fingerprint;   /* settings that must match on resume (batch size, seed, replicas, params) */
    trn_epoch *epochs;
    int64_t nepochs, cap_epochs;
    trn_stepm *steps;
    int64_t nsteps, cap_steps;
} trn_state;

#define TRN_MAX_STEPS_KEPT 100000 /* per-step losses kept for metrics.json */
#define TRN_RATE_WINDOW 32        /* recent steps the ETA's step rate is taken over */

eng_status trn_state_add_epoch(trn_state *s, const trn_epoch *e);
eng_status trn_state_add_step(trn_state *s, int64_t step, double loss);
void trn_state_free(trn_state *s);

/* A named float buffer a checkpoint saves or restores (restore fills data, which must hold n floats). */
typedef struct trn_ckpt_tensor {
    const char *name;
    float *data;
    int64_t n;
} trn_ckpt_tensor;

/* Atomic whole-file write (temp + fsync + rename + fsync dir); errors name the path.
 * Test hook: TENSORD_TEST_FAIL_WRITE_AFTER=N in the environment makes writes fail with ENOSPC once the
 * process has written N bytes through this function (simulates a full disk deterministically). */
eng_status trn_write_file(const char *path, const void *buf, size_t n);

/* Checkpoint file: "TDCKPT01", format version, state, tensors by name, optimizer bytes, CRC-32 of all. */
eng_status trn_ckpt_write(const char *path, const trn_state *st, const trn_ckpt_tensor *t, int nt, const void *optim,
                          size_t optim_len);
/* Restores state (fresh: st must be zeroed or freed; its arrays are replaced), every tensor in t by name
 * (missing name or different size is an error naming both), and *optim (malloc'd) / *optim_len. */
eng_status trn_ckpt_read(const char *path, trn_state *st, trn_ckpt_tensor *t, int nt, void **optim, size_t *optim_len);
/* Newest checkpoint (highest step) in dir: *found = 0 if none (or no dir). */
eng_status trn_ckpt_latest(const char *dir, char *path, size_t cap, int *found);
/* Remove all ckpt-*.bin in dir except the newest `keep`. */
void trn_ckpt_prune(const char *dir, int keep);

/* ---- the trainer ---- */

typedef struct trn_replica trn_replica;
typedef struct trn_buckets trn_buckets;       /* train-buckets.c */
typedef struct trn_bucket_rep trn_bucket_rep;

/* train-precision.c: the output layer's nodes, kept fp32 in mixed-precision training (names owned). */
typedef struct trn_fp32_nodes {
    char **names;
    int n;
} trn_fp32_nodes;
eng_status trn_output_layer_nodes(const eng_graph *g, const char *pred, trn_fp32_nodes *out);
void trn_fp32_nodes_free(trn_fp32_nodes *f);

#define TRN_LOSS_SCALE_INPUT "train/loss_scale" /* the training graph's loss-scale input (loss scaling on) */

/* The data inputs a session is fed, and the columns of the loader's dataset they come from (then the label). */
typedef struct trn_feedmap {
    int n;
    const char **names;
    int *col;
    int label_col;
} trn_feedmap;

/* train-frozen.c: the frozen layers' features computed once (see there), for metrics.json. */
typedef struct trn_frozen {
    int cached;       /* 1: the steps run the trained part only */
    int tensors;      /* boundary values kept per example */
    double bytes;     /* their memory */
    double seconds;   /* time to find and compute them (before the first step) */
    char why[512];    /* not cached: the reason ("" when there are no frozen layers) */
} trn_frozen;
#define TRN_FROZEN_MAX_BYTES ((int64_t)4 << 30)

typedef struct trn_ctx {
    const eng_train_opts *o;
    char base[4096];
    int64_t base_version, new_version;
    eng_graph *g0;          /* base model (owned) */
    const char *pred;       /* g0's first output */
    const char *loss_name;  /* in the training/eval graphs */
    trn_param *params;
    int nparams, ntrain;    /* ntrain: trainable ones (the first ntrain entries) */
    int64_t pack_n;         /* floats in a replica's packed buffer: grads, bn updates, loss, accuracy */
    /* data */
    eng_dataset *train, *val;
    int ninputs;            /* model data inputs */
    char **input_names;
    int *input_col;         /* dataset column for each model input */
    int label_col;
    char preprocessing[4096]; /* JSON object text {"x": "...", "label": "..."} */
    trn_feedmap feed_eval;  /* the model inputs, their columns in train / val (input_names, input_col, label_col) */
    trn_feedmap feed_train; /* the training graph's: feed_eval, or (frozen features) columns of ftrain (owned) */
    eng_dataset *ftrain;    /* frozen features: the training data the loader reads (NULL: c->train) */
    trn_frozen frozen;
    eng_recompute_stats recompute; /* --recompute: what the rewrite did */
    eng_loader *loader;
    int64_t steps_per_epoch;
    /* sessions */
    int R;
    trn_replica *reps;
    /* Device-resident training (train-device.c; replicas on devices of one backend, one process): the weights, the
     * gradients and the optimizer state stay on the device, the session reading and writing them there
     * (eng_session_opts.dev_inputs / dev_outputs) and the update running as a kernel (eng_optim_apply_on). The host
     * copies (trn_param.w) are brought up to date by trn_weights_to_host before host code reads them (validation,
     * checkpoints, keep_best, the version) and pushed back by trn_weights_to_device after a resume. */
    const krn_backend *dev;          /* NULL: the host path */
    krn_comm *dcomm;                 /* R > 1 or W > 1: the replicas' collective (NCCL on CUDA) */
    int dcomm_world;                 /* dcomm spans every process's replicas (W*R ranks; krn_comm_new_ranks): the
                                      * gradients never leave the devices, trn_dev_world only sums the metrics */
    float *dev_pack;                 /* W > 1: the process's reduced gradients on their way through MPI */
    unsigned char *dev_in, *dev_out; /* the training session's masks (by graph input / output) */
    int dev_dirty;                   /* the device weights changed since the last trn_weights_to_host */
    struct trn_buckets *bk;          /* gradient buckets overlapping the backward pass (train-buckets.c), or NULL */
    eng_comm *comm;         /* the R local replicas (threads) */
    eng_comm *world;        /* the processes of a multi-process job (o->world), NULL alone */
    int W, wrank;           /* world size (1 alone) and this process's rank */
    eng_status world_st;    /* the last cancel-flag all-reduce over world failed (its message is the last error) */
    eng_session *eval;
    trn_fp32_nodes fp32_train, fp32_eval; /* mixed precision: output-layer nodes of the two graphs */
    int eval_loss_out, eval_acc_out;
    eng_optim *optim;
    eng_loss_scaler ls;     /* loss scaling (mode NONE: off) */
    float ls_value;         /* the scale fed this step (the "train/loss_scale" input of the training graph) */
    /* bookkeeping */
    trn_state st;
    eng_tfevents *tb;
    char ckpt_dir[4200];
    double t_start, last_draw;
    int progress_drawn;
    int stopped_by_max_steps;
    int64_t resumed_from;   /* global step resume() restored (0: a fresh start) */
    double step_dt[TRN_RATE_WINDOW]; /* seconds of the last steps (ring), for the ETA */
    int64_t nstep_dt;       /* steps recorded in step_dt (all time; index = n % TRN_RATE_WINDOW) */
} trn_ctx;

struct trn_replica {
    trn_ctx *c;
    int rank;
    eng_session *s;
    int nfeed;
    const char **names;
    eng_tensor *feed;
    eng_tensor *outs;
    float *pack;          /* c->pack_n floats */
    int loss_out, acc_out;/* output indices (acc -1 when the loss has no accuracy metric) */
    int direct;           /* R == 1 and rows > 0: trn_step reads grads / BN updates straight from outs (the plan's
                           * buffers, valid until the next run) instead of copying them into pack */
    const eng_batch *b;
    int64_t row0, rows;
    eng_status st;
    char err[1024];
    double loss, acc;     /* device-resident mode: this shard's loss and accuracy (means over its rows) */
    int finite;           /* device-resident mode: its last update's gradients were finite (loss scaling) */
    /* device-resident mode (train-device.c): this replica's context, weights, gradient stand-ins for a step it has
     * no rows for, and optimizer (rank 0 uses the trainer's) */
    krn_ctx *dctx;
    void **dw, **dz;
    void **gbuf;          /* this step's reduced gradient / statistic per param (device memory) */
    eng_optim *optim;
    struct trn_bucket_rep *bq;  /* this replica's bucket state: its communication context, events (train-buckets.c) */
};


/* train-head.c: --replace-head (see eng_train_opts.replace_head); the graph is unchanged on error. */
eng_status trn_replace_head(eng_graph *g, int64_t classes, uint64_t seed);

/* train-frozen.c: with frozen layers, compute their features for every training example and take them out of gt
 * (which then reads c->ftrain's columns through c->feed_train); when that cannot be done, c->frozen.why says why
 * and gt is unchanged. Errors only for out of memory or a failing run. After drop_fed_inits, before the sessions. */
eng_status trn_frozen_features(trn_ctx *c, eng_graph *gt);

/* train-loop.c */
eng_status trn_replicas_new(trn_ctx *c, eng_graph *gt);
void trn_replicas_free(trn_ctx *c);
/* train-device.c. trn_dev_plan: whether this run trains device-resident (every replica on a device of one backend
 * with collectives, or one replica; one process; not loss scaling with accumulation): then sets c->dev and the
 * session masks in so.
 * trn_dev_alloc (after the replicas' sessions exist): contexts, weights, optimizers, the communicator. trn_dev_update,
 * in each replica's thread after its run (ok: its gradients are valid): all-reduce gradients and BatchNorm updates
 * on the device, apply the update there. */
eng_status trn_dev_plan(trn_ctx *c, const eng_graph *gt, eng_session_opts *so);
eng_status trn_dev_alloc(trn_ctx *c);
eng_status trn_dev_update(trn_ctx *c, trn_replica *rp, int ok);
/* Zeros standing in for param k's gradient on a replica that ran no rows (or failed): device memory of its own,
 * zeroed now (its context synchronised). */
eng_status trn_dev_zeros(trn_ctx *c, trn_replica *rp, int k, void **out);
/* Replica rp's share of the step's batch (its rows / the batch's): the prescale of its gradients' all-reduce, so the
 * sum over replicas is the whole batch's mean gradient. */
static inline float trn_replica_share(const trn_replica *rp) {
    return rp->b->rows > 0 ? (float)((double)rp->rows / (double)rp->b->rows) : 0.0f;
}
/* train-buckets.c: gradients all-reduced in buckets of about o->bucket_mb while the backward pass runs (PyTorch DDP's
 * scheme). trn_buckets_new (the trainer's thread, before a step's replicas start; once): when device-resident with
 * collectives and buckets on, the buckets from the training graph and each replica's communication context and
 * events; else nothing (c->bk stays NULL). trn_buckets_ready is the replicas' sessions' on_ready hook (its arg: the
 * replica). trn_buckets_begin before a replica's run; trn_buckets_finish after it (ok: its run succeeded), on its
 * thread: the buckets not sent yet (zeros where it failed), then its compute context waits for the last one; fills
 * rp->gbuf. trn_buckets_free logs the totals (TENSORD_VERBOSE or progress on) and frees. */
eng_status trn_buckets_new(trn_ctx *c);
void trn_buckets_ready(void *arg, krn_ctx *ctx, const int *idx, const eng_tensor *outs, int n);
void trn_buckets_begin(trn_ctx *c, trn_replica *rp);
eng_status trn_buckets_finish(trn_ctx *c, trn_replica *rp, int ok);
/* Buckets per step (0: no buckets) and, summed over steps and replicas, buckets sent and those sent during runs. */
void trn_buckets_counts(const trn_ctx *c, int *nbuckets, int64_t *sent, int64_t *during);
void trn_buckets_free(trn_ctx *c);
/* W > 1, on the trainer's thread after the replicas: the processes' sum of the reduced gradients (and of loss / acc,
 * the process's shares in, the job's out) through MPI, then every replica's update. */
eng_status trn_dev_world(trn_ctx *c, double *loss, double *acc);
void trn_dev_free(trn_ctx *c);
eng_status trn_weights_to_host(trn_ctx *c);
eng_status trn_weights_to_device(trn_ctx *c);
/* Run one batch through the replicas; on return loss/accuracy hold the batch means and the optimizer has been
 * applied. */
eng_status trn_step(trn_ctx *c, const eng_batch *b, double *loss, double *acc);
/* Validation loss/accuracy over c->val with the current weights (NaN when there is no validation data). */
eng_status trn_validate(trn_ctx *c, double *loss, double *acc);
void trn_progress(trn_ctx *c, int64_t step, double loss, double acc, double eps, int final);
double trn_now(void);

/* train-version.c */
eng_status trn_write_version(trn_ctx *c, eng_train_result *res);
/* metrics.json text (malloc'd). */
char *trn_metrics_json(const trn_ctx *c);

/* The backend and device replica r runs on (o->devices[r % ndevices]; the CPU when none are listed). */
eng_status trn_replica_device(const eng_train_opts *o, int r, eng_session_opts *so);

#endif
