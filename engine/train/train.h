/* train.h - the training loop behind `tensord train` (Keras model.fit semantics).
 *
 * eng_train loads version `base_version` of the model under model_base_path, builds the training graph
 * (training behaviour for Dropout/BatchNorm -> loss -> autodiff over the trainable parameters), feeds batches
 * from the data pipeline, applies the optimizer, evaluates on the validation set after every epoch, and
 * writes version N+1 atomically through engine/bundle.h: built in <base>/.tmp-<N+1>-<pid>/ (model.onnx: the same
 * graph with the new weights; metrics.json: per-epoch loss/accuracy for train and validation plus the run's
 * settings; signature.json recording the input preprocessing), fsync'd, then rename()d to <base>/<N+1>. On any
 * error (including ENOSPC) the temp dir is removed and no version directory appears. Version names follow the
 * bundle rule (eng_bundle_parse_version): a stray "007/" or "3.bak/" is neither a base nor counted for N.
 *
 * Checkpoints go to <base>/.train-<N+1>/ckpt-<step>.bin every checkpoint_every steps and at each epoch end
 * (weights, optimizer state, BN statistics, epoch/step, RNG state, metrics so far; written atomically).
 * resume=1 continues from the newest checkpoint there and, with the same seed and options, ends at the same
 * weights as an uninterrupted run. TensorBoard event files go to <base>/logs/<N+1>/ (scalars: loss,
 * accuracy, val_loss, val_accuracy, learning_rate, examples_per_sec).
 *
 * Version number: N+1 above is new_version when the caller gives one (a job queue hands out distinct numbers so
 * that two runs on one model never race for the same N+1); an existing <base>/<new_version> (of any kind) is
 * an error naming it, raised before anything is written. Checkpoints and logs then use that number too.
 *
 * Progress and cancel: on_progress (optional) is called on the thread that called eng_train: once when set-up
 * (and resume) is done, after every optimizer step, and at each epoch end after validation (also for the
 * partial epoch a max_steps stop closes). It must not call back into this run. `cancel` (optional) is read
 * between steps, before validation and before the version is written; once it is non-zero the run stops
 * there and returns ENG_STATUS_CANCELLED ("cancelled"): no version is written, no checkpoint after that, and the
 * checkpoint directory is left as it is (the caller decides whether to delete it; resume continues from it).
 *
 * Data parallelism: replicas R > 1 runs R copies of the training graph on R threads, each on its shard of
 * every batch (B/R rows), and averages gradients through an eng_comm all-reduce (engine/train/allreduce.h) before
 * one optimizer update, so R replicas at batch B give the same weights as 1 replica at batch B (within float
 * tolerance; BatchNorm statistics are per-shard, as without SyncBN).
 */
#ifndef ENG_TRAIN_H
#define ENG_TRAIN_H

#include <stdatomic.h>
#include <stdint.h>

#include "loss.h"
#include "optim.h"
#include "../plan/plan.h"

typedef enum eng_train_progress_kind {
    ENG_TRAIN_PROGRESS_STEP = 0,  /* after an optimizer step (after its checkpoint, if one was due) */
    ENG_TRAIN_PROGRESS_EPOCH = 1, /* at an epoch's end, after validation */
    ENG_TRAIN_PROGRESS_START = 2, /* once, when set-up and resume are done, before the first step */
} eng_train_progress_kind;

/* What on_progress sees; valid only during the call. NaN marks a value not computed. */
typedef struct eng_train_progress {
    eng_train_progress_kind kind;
    int64_t version;               /* the version this run writes */
    int epoch;                     /* current epoch, 1-based */
    int epochs;
    int64_t step;                  /* steps done in this epoch (STEP: 1-based index of the step just done) */
    int64_t steps_per_epoch;
    int64_t global_step;           /* steps done in the run, including those before a resume */
    int64_t resumed_from_step;     /* global step the run resumed from (0: a fresh start) */
    int64_t examples, val_examples;/* training / validation examples (after the split) */
    double loss, accuracy;         /* running means over this epoch so far (accuracy NaN: the loss has none) */
    double val_loss, val_accuracy; /* EPOCH only; NaN otherwise and when there is no validation data */
    double examples_per_sec;       /* over this epoch so far */
    double eta_s;                  /* steps left in the run (epochs, max_steps) / recent step rate; NaN at START */
    double learning_rate;          /* STEP: the rate of the update just applied; EPOCH: for the next update */
    int early_stop;                /* EPOCH: early stopping ends the run after this epoch */
} eng_train_progress;

typedef struct eng_train_opts {
    const char *model_base_path;
    int64_t base_version;          /* 0: the highest version present (eng_bundle_latest) */
    const char *const *data_files; /* joined into one dataset (engine/data/data.h) */
    int ndata;
    const char *const *val_files;  /* optional separate validation data (else val_split) */
    int nval;
    double val_split;              /* fraction of data held out when val_files is empty; 0: no validation */
    int epochs;
    int64_t batch_size;
    eng_optim_opts optim;
    eng_loss_kind loss;
    int from_logits;               /* -1 auto (see loss.h) */
    const char *const *freeze;     /* initializer name prefixes not trained */
    int nfreeze;
    int nthreads;                  /* threads per replica's kernels; <= 0 all cores / replicas */
    int replicas;                  /* data-parallel replicas (threads of this process), >= 1 */
    const char *const *devices;    /* where the replicas run ("cpu", "cuda:N", "sim:N"; kernels/kernel.h's
                                    * krn_backend_by_name): replica r on devices[r % ndevices]; replicas is raised to
                                    * ndevices when lower. Steps a device lacks run on the CPU (engine/plan/plan-place.c).
                                    * The trainer's weights and optimizer stay in host memory: each step copies the
                                    * weights in and the gradients out. NULL / 0: every replica on the CPU */
    int ndevices;
    double bucket_mb;              /* device-resident replicas with collectives: gradients are all-reduced in buckets
                                    * of about this many MB (10^6 bytes), each sent while the backward pass goes on
                                    * (train-buckets.c); 0: 25 (PyTorch DDP's bucket_cap_mb); < 0: no buckets (every
                                    * gradient all-reduced after the replica's whole run) */
    struct eng_comm *world;        /* optional (allreduce.h, e.g. eng_comm_new_mpi): this process is one rank of a
                                    * multi-process job. Every rank reads the same data in the same order; rank k of W
                                    * trains on shards k*R .. k*R+R-1 of each global batch (W*R shards in all), and
                                    * the gradients are averaged across ranks after the local replicas. Only rank 0
                                    * writes checkpoints, TensorBoard events and the version, and reports progress;
                                    * a resume reads rank 0's checkpoint (a shared filesystem). Owned by the caller. */
    eng_precision precision;       /* fp32; bf16 = mixed_bf16 (Keras' mixed_bfloat16 policy): convs and matmuls,
                                    * forward and backward, multiply in bf16 (fp32 accumulation) on fp32 master
                                    * weights and optimizer state; the output layer and the loss stay fp32.
                                    * fp16 (mixed_fp16) is refused where the backend has no fast fp16 */
    int loss_scale;                /* 0: default (dynamic for fp16, none otherwise); else an eng_loss_scale_mode + 1
                                    * (loss-scale.h): 1 none, 2 dynamic, 3 fixed at loss_scale_init */
    double loss_scale_init;        /* dynamic: the initial scale; fixed: the scale (<= 0: 2^15) */
    int64_t loss_scale_growth_steps; /* dynamic: finite steps in a row before the scale doubles (<= 0: 2000) */
    int resume;
    int64_t checkpoint_every;      /* steps; 0: only at epoch ends */
    uint64_t seed;
    int early_stopping_patience;   /* epochs without improvement of `monitor`; 0: off */
    const char *monitor;           /* "val_loss" (default) or "val_accuracy", "loss", "accuracy" */
    int keep_best;                 /* write the best epoch's weights (by monitor) instead of the last */
    int recompute;                 /* gradient checkpointing: the backward pass recomputes the forward activations
                                    * it reads, segment by segment, instead of keeping them (recompute.c) */
    int progress;                  /* progress bar on stderr */
    int64_t max_steps;             /* stop after this many updates (0: no limit); for tests and golden checks */
    int no_shuffle;                /* 1: batches in the data's order every epoch (Keras fit(shuffle=False)); 0: a
                                    * new order per epoch from `seed` */
    int no_cache_frozen;           /* 1: with --freeze, run the frozen layers every step instead of computing their
                                    * features once per example before the first step (train-frozen.c) */
    int64_t replace_head;          /* > 0: the classifier producing the first output is replaced by a new one with
                                    * this many classes (Glorot uniform kernel, zero bias, from `seed`) before
                                    * training; the new version keeps it (train-head.c) */
    int64_t new_version;           /* version to write; 0: the highest version present + 1 (see above) */
    void (*on_progress)(void *arg, const eng_train_progress *p); /* optional; see above */
    void *progress_arg;
    const atomic_int *cancel;      /* optional; non-zero: stop at the next step boundary (see above) */
} eng_train_opts;

typedef struct eng_train_result {
    int64_t version;               /* the version written */
    char path[4096];               /* its directory */
    int epochs_run;
    int64_t steps;
    double loss, accuracy, val_loss, val_accuracy; /* last epoch (NaN where not computed) */
    double examples_per_sec;
    double loss_scale;             /* the final loss scale (1 without loss scaling) */
    int64_t skipped_steps;         /* steps whose update loss scaling skipped (non-finite gradients) */
} eng_train_result;

eng_status eng_train(const eng_train_opts *o, eng_train_result *res);

#endif
