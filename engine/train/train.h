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
 * Data parallelism: replicas R > 1 runs R copies of the training graph on R threads, each on its shard of
 * every batch (B/R rows), and averages gradients through an eng_comm all-reduce (engine/train/allreduce.h) before
 * one optimizer update, so R replicas at batch B give the same weights as 1 replica at batch B (within float
 * tolerance; BatchNorm statistics are per-shard, as without SyncBN).
 */
#ifndef ENG_TRAIN_H
#define ENG_TRAIN_H

#include <stdint.h>

#include "loss.h"
#include "optim.h"

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
    int replicas;                  /* data-parallel replicas, >= 1 */
    int resume;
    int64_t checkpoint_every;      /* steps; 0: only at epoch ends */
    uint64_t seed;
    int early_stopping_patience;   /* epochs without improvement of `monitor`; 0: off */
    const char *monitor;           /* "val_loss" (default) or "val_accuracy", "loss", "accuracy" */
    int keep_best;                 /* write the best epoch's weights (by monitor) instead of the last */
    int progress;                  /* progress bar on stderr */
    int64_t max_steps;             /* stop after this many updates (0: no limit); for tests and golden checks */
} eng_train_opts;

typedef struct eng_train_result {
    int64_t version;               /* the version written */
    char path[4096];               /* its directory */
    int epochs_run;
    int64_t steps;
    double loss, accuracy, val_loss, val_accuracy; /* last epoch (NaN where not computed) */
    double examples_per_sec;
} eng_train_result;

eng_status eng_train(const eng_train_opts *o, eng_train_result *res);

#endif
