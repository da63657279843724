/* cli-train.c - `tensord train`: fine-tune a bundle's version and write the next version (engine/train/train.h).
 *
 * Two front doors, one mapping onto eng_train_opts: command-line flags (`tensord train --model-base-path ...`)
 * and a job file (`tensord train --job FILE`, written by the server's job queue). Every option is one row of
 * train_table (its flag, its job-file key, its JSON type) and is set by train_set() from its text value,
 * whichever door it came through, so both get the same parsing, ranges and messages.
 *
 * Flags: prints the new version's path and its final metrics on stdout; errors are one `error: ...` line on
 * stderr with exit 1; bad usage exits 2.
 *
 * Job mode: FILE is one JSON object; an unknown key, a missing required key, a key given twice or a value of the
 * wrong type or range is an error naming the field ("schedule.gamma", "data_files[2]"). stdout carries only the
 * protocol, one JSON object per line, each flushed (the server reads them through a pipe; NaN is null):
 *   {"event":"start", ...}   once set-up and resume are done
 *   {"event":"step", ...}    at most 10 a second, plus always the first step this process runs and the first and
 *                            last step of every epoch (and the max_steps-th)
 *   {"event":"epoch", ...}   after each epoch's validation
 *   {"event":"done", ...}    exit 0
 *   {"event":"cancelled"}    exit 3: SIGTERM or SIGINT sets the engine's cancel flag; the run stops at the next
 *                            step boundary, writes no version and keeps its checkpoints (resume: true continues).
 *                            A second signal ends the process at once (the default action). If stdout breaks
 *                            (the reader is gone), the run is cancelled the same way.
 *   {"event":"error","message":"..."}  exit 1 (a bad job file too); the message also goes to stderr
 * Usage errors (--job with other options) exit 2. Human-readable text goes to stderr only.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../engine/ir/file-io.h"
#ifdef TENSORD_MPI
#include <mpi.h>
#endif

#include "../engine/train/allreduce.h"
#include "../engine/train/rendezvous.h"
#include "../engine/train/loss-scale.h"
#include "../engine/train/train.h"
#include "cli.h"

#define TRAIN_MAX_FILES 64
#define TRAIN_MAX_OWNED (4 * TRAIN_MAX_FILES)
#define TRAIN_JOB_MAX_BYTES ((size_t)1 << 20)
#define TRAIN_EXIT_CANCELLED 3

int srv_cmd_train(int argc, char **argv);

static void train_usage(FILE *f) {
    fprintf(f,
            "usage: tensord train --model-base-path DIR [--base-version N] [--new-version N] --data FILE[,FILE]\n"
            "         [--val-data FILE[,FILE]] --epochs E --batch-size B --optimizer sgd|adam|adamw --lr X [--momentum M]\n"
            "         [--nesterov] [--weight-decay W] [--clipnorm C] [--accum-steps K] [--lr-schedule constant|step|cosine]\n"
            "         [--warmup-steps W] [--step-size S --gamma G] [--decay-steps D] [--min-lr X]\n"
            "         --loss sparse_categorical_crossentropy|categorical_crossentropy|binary_crossentropy|mse|cosine_similarity\n"
            "         [--from-logits true|false] [--shuffle true|false] [--val-split 0.1] [--freeze PREFIX]... [--cache-frozen true|false]\n"
            "         [--threads T] [--replicas R] [--resume] [--checkpoint-every K] [--seed S] [--early-stopping-patience P]\n"
            "         [--monitor val_loss|val_accuracy|loss|accuracy] [--keep-best] [--recompute] [--max-steps N] [--precision fp32|mixed_bf16|mixed_fp16]\n"
            "         [--loss-scale none|dynamic|SCALE] [--loss-scale-growth-steps N] [--replace-head CLASSES]\n"
            "         [--devices cpu|cuda:N[,cuda:M...]] [--bucket-mb MB] [--no-progress]\n"
            "       tensord train --job FILE   (JSON job file; JSON lines on stdout: start, step, epoch, done|cancelled|error)\n");
}

/* ---- the option table ---- */

typedef enum train_id {
    T_MODEL_BASE_PATH, T_BASE_VERSION, T_NEW_VERSION, T_DATA, T_VAL_DATA, T_VAL_SPLIT, T_EPOCHS, T_BATCH_SIZE,
    T_OPTIMIZER, T_LR, T_MOMENTUM, T_NESTEROV, T_WEIGHT_DECAY, T_CLIPNORM, T_ACCUM_STEPS, T_SCHEDULE, T_WARMUP_STEPS,
    T_STEP_SIZE, T_GAMMA, T_DECAY_STEPS, T_MIN_LR, T_LOSS, T_FROM_LOGITS, T_SHUFFLE, T_CACHE_FROZEN, T_RECOMPUTE, T_FREEZE, T_THREADS, T_REPLICAS, T_RESUME,
    T_CHECKPOINT_EVERY, T_SEED, T_PATIENCE, T_MONITOR, T_KEEP_BEST, T_MAX_STEPS, T_PRECISION, T_LOSS_SCALE,
    T_LOSS_SCALE_GROWTH, T_REPLACE_HEAD, T_DEVICES, T_BUCKET_MB,
    T_NO_PROGRESS, T_JOB_ID, T_COUNT
} train_id;

typedef enum train_jtype { J_STR, J_INT, J_NUM, J_BOOL, J_STRS, J_STR_NUM /* a string or a number */ } train_jtype;

enum { REQ_FLAG = 1, REQ_JOB = 2 }; /* REQ_JOB on "a.b": required when object "a" is given */
enum { F_VALUE = 0, F_SWITCH = 1, F_SPLIT = 2 }; /* flag form: takes a value | no value ("true") | comma list */

typedef struct train_opt {
    train_id id;
    const char *flag;  /* NULL: job file only */
    const char *key;   /* job file key, "object.key" when nested; NULL: flag only */
    train_jtype type;  /* the value's JSON type */
    int flag_form;
    int req;
    long long lo, hi;  /* J_INT range */
} train_opt;

#define NOLIM LLONG_MIN, LLONG_MAX
static const train_opt train_table[] = {
    {T_MODEL_BASE_PATH, "--model-base-path", "model_base_path", J_STR, F_VALUE, REQ_FLAG | REQ_JOB, NOLIM},
    {T_BASE_VERSION, "--base-version", "base_version", J_INT, F_VALUE, REQ_JOB, 0, LLONG_MAX},
    {T_NEW_VERSION, "--new-version", "new_version", J_INT, F_VALUE, REQ_JOB, 1, LLONG_MAX},
    {T_DATA, "--data", "data_files", J_STRS, F_SPLIT, REQ_FLAG | REQ_JOB, NOLIM},
    {T_VAL_DATA, "--val-data", "val_files", J_STRS, F_SPLIT, 0, NOLIM},
    {T_VAL_SPLIT, "--val-split", "val_split", J_NUM, F_VALUE, 0, NOLIM},
    {T_EPOCHS, "--epochs", "epochs", J_INT, F_VALUE, REQ_FLAG | REQ_JOB, 1, INT_MAX},
    {T_BATCH_SIZE, "--batch-size", "batch_size", J_INT, F_VALUE, REQ_FLAG | REQ_JOB, 1, LLONG_MAX},
    {T_OPTIMIZER, "--optimizer", "optimizer", J_STR, F_VALUE, REQ_FLAG | REQ_JOB, NOLIM},
    {T_LR, "--lr", "learning_rate", J_NUM, F_VALUE, REQ_JOB, NOLIM},
    {T_MOMENTUM, "--momentum", "momentum", J_NUM, F_VALUE, 0, NOLIM},
    {T_NESTEROV, "--nesterov", "nesterov", J_BOOL, F_SWITCH, 0, NOLIM},
    {T_WEIGHT_DECAY, "--weight-decay", "weight_decay", J_NUM, F_VALUE, 0, NOLIM},
    {T_CLIPNORM, "--clipnorm", "clipnorm", J_NUM, F_VALUE, 0, NOLIM},
    {T_ACCUM_STEPS, "--accum-steps", "accum_steps", J_INT, F_VALUE, 0, 1, INT_MAX},
    {T_SCHEDULE, "--lr-schedule", "schedule.kind", J_STR, F_VALUE, REQ_JOB, NOLIM},
    {T_WARMUP_STEPS, "--warmup-steps", "schedule.warmup_steps", J_INT, F_VALUE, 0, 0, LLONG_MAX},
    {T_STEP_SIZE, "--step-size", "schedule.step_size", J_INT, F_VALUE, 0, 1, LLONG_MAX},
    {T_GAMMA, "--gamma", "schedule.gamma", J_NUM, F_VALUE, 0, NOLIM},
    {T_DECAY_STEPS, "--decay-steps", "schedule.decay_steps", J_INT, F_VALUE, 0, 1, LLONG_MAX},
    {T_MIN_LR, "--min-lr", "schedule.min_lr", J_NUM, F_VALUE, 0, NOLIM},
    {T_LOSS, "--loss", "loss", J_STR, F_VALUE, REQ_FLAG | REQ_JOB, NOLIM},
    {T_FROM_LOGITS, "--from-logits", "from_logits", J_BOOL, F_VALUE, 0, NOLIM},
    {T_FREEZE, "--freeze", "freeze", J_STRS, F_VALUE, 0, NOLIM},
    {T_THREADS, "--threads", "threads", J_INT, F_VALUE, 0, 0, INT_MAX},
    {T_REPLICAS, "--replicas", "replicas", J_INT, F_VALUE, 0, 1, INT_MAX},
    {T_RESUME, "--resume", "resume", J_BOOL, F_SWITCH, REQ_JOB, NOLIM},
    {T_CHECKPOINT_EVERY, "--checkpoint-every", "checkpoint_every", J_INT, F_VALUE, 0, 0, LLONG_MAX},
    {T_SEED, "--seed", "seed", J_INT, F_VALUE, 0, 0, LLONG_MAX},
    {T_PATIENCE, "--early-stopping-patience", "early_stopping.patience", J_INT, F_VALUE, REQ_JOB, 0, INT_MAX},
    {T_MONITOR, "--monitor", "early_stopping.monitor", J_STR, F_VALUE, 0, NOLIM},
    {T_KEEP_BEST, "--keep-best", "keep_best", J_BOOL, F_SWITCH, 0, NOLIM},
    {T_MAX_STEPS, "--max-steps", "max_steps", J_INT, F_VALUE, 0, 0, LLONG_MAX},
    {T_SHUFFLE, "--shuffle", "shuffle", J_BOOL, F_VALUE, 0, NOLIM},
    {T_CACHE_FROZEN, "--cache-frozen", "cache_frozen", J_BOOL, F_VALUE, 0, NOLIM},
    {T_RECOMPUTE, "--recompute", "recompute", J_BOOL, F_SWITCH, 0, NOLIM},
    {T_PRECISION, "--precision", "precision", J_STR, F_VALUE, REQ_JOB, NOLIM},
    {T_LOSS_SCALE, "--loss-scale", "loss_scale", J_STR_NUM, F_VALUE, 0, NOLIM},
    {T_LOSS_SCALE_GROWTH, "--loss-scale-growth-steps", "loss_scale_growth_steps", J_INT, F_VALUE, 0, 1, LLONG_MAX},
    {T_REPLACE_HEAD, "--replace-head", "replace_head", J_INT, F_VALUE, 0, 1, 1 << 24},
    {T_DEVICES, "--devices", "devices", J_STRS, F_SPLIT, REQ_JOB, NOLIM},
    {T_BUCKET_MB, "--bucket-mb", "bucket_mb", J_NUM, F_VALUE, 0, NOLIM},
    {T_NO_PROGRESS, "--no-progress", NULL, J_BOOL, F_SWITCH, 0, NOLIM},
    {T_JOB_ID, NULL, "job_id", J_INT, F_VALUE, REQ_JOB, 0, LLONG_MAX},
};
#define TRAIN_NOPTS ((int)(sizeof train_table / sizeof train_table[0]))

/* What both front doors fill. Strings point into argv, the job file's cJSON tree or owned[] (comma splits). */
typedef struct train_args {
    eng_train_opts o;
    const char *data[TRAIN_MAX_FILES], *val[TRAIN_MAX_FILES], *freeze[TRAIN_MAX_FILES];
    char *owned[TRAIN_MAX_OWNED];
    int nowned;
    const char *devices[TRAIN_MAX_FILES];
    int ndevices;
    int64_t job_id;
} train_args;

static void train_args_init(train_args *a) {
    memset(a, 0, sizeof *a);
    a->o.replicas = 1;
    a->o.from_logits = -1;
    a->o.progress = 1;
    a->o.monitor = "val_loss";
    a->o.loss = (eng_loss_kind)-1;
    a->o.optim.kind = (eng_optim_kind)-1;
    a->o.data_files = a->data;
    a->o.val_files = a->val;
    a->o.freeze = a->freeze;
}

static void train_args_free(train_args *a) {
    for (int i = 0; i < a->nowned; i++) free(a->owned[i]);
    a->nowned = 0;
}

static int set_err(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int set_err(char *err, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
    return -1;
}

/* strict numeric parsing: the whole string must be a number */
static int parse_num(const char *name, const char *v, double *out, char *err, size_t n) {
    char *end;
    *out = strtod(v, &end);
    if (end == v || *end || !isfinite(*out)) return set_err(err, n, "%s: '%s' is not a number", name, v);
    return 0;
}

static int parse_int(const char *name, const char *v, long long lo, long long hi, long long *out, char *err, size_t n) {
    char *end;
    errno = 0;
    *out = strtoll(v, &end, 10);
    if (end == v || *end || errno || *out < lo || *out > hi) {
        if (hi == LLONG_MAX) return set_err(err, n, "%s: '%s' is not an integer >= %lld", name, v, lo);
        return set_err(err, n, "%s: '%s' is not an integer in [%lld, %lld]", name, v, lo, hi);
    }
    return 0;
}

static int parse_bool(const char *name, const char *v, int allow_auto, int *out, char *err, size_t n) {
    if (strcmp(v, "true") == 0 || strcmp(v, "1") == 0) *out = 1;
    else if (strcmp(v, "false") == 0 || strcmp(v, "0") == 0) *out = 0;
    else if (allow_auto && strcmp(v, "auto") == 0) *out = -1;
    else return set_err(err, n, "%s takes true or false%s, got '%s'", name, allow_auto ? " (or auto)" : "", v);
    return 0;
}

static int add_str(const char **list, int *count, const char *v, const char *name, char *err, size_t n) {
    if (!*v) return set_err(err, n, "%s: empty value", name);
    if (*count == TRAIN_MAX_FILES) return set_err(err, n, "%s: more than %d values", name, TRAIN_MAX_FILES);
    list[(*count)++] = v;
    return 0;
}

/* "cpu", "cuda:N", "sim:N" (kernels/kernel.h's grammar); each listed device runs one data-parallel replica. A device
 * that is not there (no GPU, an index past the last) is refused now, with the reason. */
static int add_device(train_args *a, const char *v, const char *name, char *err, size_t n) {
    const krn_backend *b;
    for (int i = 0; i < a->ndevices; i++)
        if (strcmp(a->devices[i], v) == 0) return set_err(err, n, "%s: '%s' is listed twice", name, v);
    if (a->ndevices == TRAIN_MAX_FILES) return set_err(err, n, "%s: more than %d devices", name, TRAIN_MAX_FILES);
    if (krn_backend_by_name(v, &b, NULL) != ENG_STATUS_OK) return set_err(err, n, "%s: %s", name, eng_last_error());
    if (strcmp(v, "auto") == 0) fprintf(stderr, "tensord: %s\n", krn_backend_auto_note());
    a->devices[a->ndevices++] = v;
    a->o.devices = a->devices;
    a->o.ndevices = a->ndevices;
    return 0;
}

/* Set option t from its text value v (a flag's argument or a job-file value turned into text). name: how the
 * user spelled the option, for messages ("--epochs", "field 'epochs'"). t->flag_form F_SPLIT and split set: v
 * is a comma-separated list (a copy is kept in a->owned). Returns 0, or -1 with a message in err. */
static int train_set(train_args *a, const train_opt *t, const char *name, const char *v, int split, char *err, size_t n) {
    eng_train_opts *o = &a->o;
    double d = 0;
    long long i = 0;
    int b = 0;
    if (t->type == J_INT && parse_int(name, v, t->lo, t->hi, &i, err, n)) return -1;
    if (t->type == J_NUM && parse_num(name, v, &d, err, n)) return -1;
    if (t->type == J_STRS && split) { /* a comma list: every non-empty element */
        if (a->nowned == TRAIN_MAX_OWNED) return set_err(err, n, "%s: given too many times", name);
        char *copy = strdup(v);
        if (!copy) return set_err(err, n, "out of memory");
        a->owned[a->nowned++] = copy;
        int any = 0;
        for (char *tok = strtok(copy, ","); tok; tok = strtok(NULL, ","))
            if (*tok) {
                any = 1;
                if (train_set(a, t, name, tok, 0, err, n)) return -1;
            }
        return any ? 0 : set_err(err, n, "%s: empty list", name);
    }
    switch (t->id) {
    case T_MODEL_BASE_PATH:
        if (!*v) return set_err(err, n, "%s: empty path", name);
        o->model_base_path = v;
        return 0;
    case T_BASE_VERSION: o->base_version = i; return 0;
    case T_NEW_VERSION: o->new_version = i; return 0;
    case T_DATA: return add_str(a->data, &o->ndata, v, name, err, n);
    case T_VAL_DATA: return add_str(a->val, &o->nval, v, name, err, n);
    case T_FREEZE: return add_str(a->freeze, &o->nfreeze, v, name, err, n);
    case T_VAL_SPLIT:
        if (!(d >= 0 && d < 1)) return set_err(err, n, "%s must be in [0, 1), got '%s'", name, v);
        o->val_split = d;
        return 0;
    case T_EPOCHS: o->epochs = (int)i; return 0;
    case T_BATCH_SIZE: o->batch_size = i; return 0;
    case T_OPTIMIZER: {
        int k = eng_optim_parse(v);
        if (k < 0) return set_err(err, n, "%s: unknown optimizer '%s' (sgd, adam, adamw)", name, v);
        o->optim.kind = (eng_optim_kind)k;
        return 0;
    }
    case T_LR:
        if (!(d >= 0)) return set_err(err, n, "%s must be >= 0 (0: the optimizer's default), got '%s'", name, v);
        o->optim.lr = (float)d;
        return 0;
    case T_MOMENTUM:
        if (!(d >= 0 && d < 1)) return set_err(err, n, "%s must be in [0, 1), got '%s'", name, v);
        o->optim.momentum = (float)d;
        return 0;
    case T_NESTEROV:
        if (parse_bool(name, v, 0, &b, err, n)) return -1;
        o->optim.nesterov = b;
        return 0;
    case T_WEIGHT_DECAY:
    case T_CLIPNORM:
    case T_MIN_LR:
        if (!(d >= 0)) return set_err(err, n, "%s must be >= 0, got '%s'", name, v);
        *(t->id == T_WEIGHT_DECAY ? &o->optim.weight_decay : t->id == T_CLIPNORM ? &o->optim.clipnorm : &o->optim.min_lr) =
            (float)d;
        return 0;
    case T_GAMMA:
        if (!(d > 0)) return set_err(err, n, "%s must be > 0, got '%s'", name, v);
        o->optim.gamma = (float)d;
        return 0;
    case T_ACCUM_STEPS: o->optim.accum_steps = (int)i; return 0;
    case T_SCHEDULE:
        if (strcmp(v, "constant") == 0) o->optim.schedule = ENG_LR_CONSTANT;
        else if (strcmp(v, "step") == 0) o->optim.schedule = ENG_LR_STEP;
        else if (strcmp(v, "cosine") == 0) o->optim.schedule = ENG_LR_COSINE;
        else return set_err(err, n, "%s: unknown schedule '%s' (constant, step, cosine)", name, v);
        return 0;
    case T_WARMUP_STEPS: o->optim.warmup_steps = i; return 0;
    case T_STEP_SIZE: o->optim.step_size = i; return 0;
    case T_DECAY_STEPS: o->optim.decay_steps = i; return 0;
    case T_LOSS: {
        int k = eng_loss_parse(v);
        if (k < 0)
            return set_err(err, n,
                           "%s: unknown loss '%s' (sparse_categorical_crossentropy, categorical_crossentropy, "
                           "binary_crossentropy, mse, cosine_similarity)",
                           name, v);
        o->loss = (eng_loss_kind)k;
        return 0;
    }
    case T_FROM_LOGITS: return parse_bool(name, v, 1, &o->from_logits, err, n);
    case T_SHUFFLE:
        if (parse_bool(name, v, 0, &b, err, n)) return -1;
        o->no_shuffle = !b;
        return 0;
    case T_RECOMPUTE:
        if (parse_bool(name, v, 0, &b, err, n)) return -1;
        o->recompute = b;
        return 0;
    case T_CACHE_FROZEN:
        if (parse_bool(name, v, 0, &b, err, n)) return -1;
        o->no_cache_frozen = !b;
        return 0;
    case T_BUCKET_MB: /* 0: no buckets (eng_train_opts.bucket_mb < 0) */
        if (!(d >= 0 && d <= 1e6)) return set_err(err, n, "%s must be in [0, 1e6] MB (0: no buckets), got '%s'", name, v);
        o->bucket_mb = d > 0 ? d : -1;
        return 0;
    case T_THREADS: o->nthreads = (int)i; return 0;
    case T_REPLICAS: o->replicas = (int)i; return 0;
    case T_RESUME:
        if (parse_bool(name, v, 0, &b, err, n)) return -1;
        o->resume = b;
        return 0;
    case T_CHECKPOINT_EVERY: o->checkpoint_every = i; return 0;
    case T_SEED: o->seed = (uint64_t)i; return 0;
    case T_PATIENCE: o->early_stopping_patience = (int)i; return 0;
    case T_MONITOR:
        if (strcmp(v, "val_loss") && strcmp(v, "val_accuracy") && strcmp(v, "loss") && strcmp(v, "accuracy"))
            return set_err(err, n, "%s: unknown monitor '%s' (val_loss, val_accuracy, loss, accuracy)", name, v);
        o->monitor = v;
        return 0;
    case T_KEEP_BEST:
        if (parse_bool(name, v, 0, &b, err, n)) return -1;
        o->keep_best = b;
        return 0;
    case T_MAX_STEPS: o->max_steps = i; return 0;
    case T_PRECISION:
        if (strcmp(v, "fp32") == 0) o->precision = ENG_PRECISION_FP32;
        else if (strcmp(v, "mixed_bf16") == 0) o->precision = ENG_PRECISION_BF16;
        else if (strcmp(v, "mixed_fp16") == 0) o->precision = ENG_PRECISION_FP16;
        else return set_err(err, n, "%s: unknown precision '%s' (fp32, mixed_bf16, mixed_fp16)", name, v);
        return 0;
    case T_LOSS_SCALE: {
        eng_loss_scale_mode m;
        double x;
        if (eng_loss_scale_parse(v, &m, &x))
            return set_err(err, n, "%s: '%s' is not none, dynamic or a positive float32 scale", name, v);
        o->loss_scale = (int)m + 1;
        o->loss_scale_init = x;
        return 0;
    }
    case T_LOSS_SCALE_GROWTH: o->loss_scale_growth_steps = i; return 0;
    case T_REPLACE_HEAD: o->replace_head = i; return 0;
    case T_DEVICES: return add_device(a, v, name, err, n);
    case T_NO_PROGRESS:
        if (parse_bool(name, v, 0, &b, err, n)) return -1;
        o->progress = !b;
        return 0;
    case T_JOB_ID: a->job_id = i; return 0;
    case T_COUNT: break;
    }
    return set_err(err, n, "%s: not handled", name);
}

/* ---- flags ---- */

/* Returns 0, or 2 after printing a usage error. */
static int train_parse_flags(train_args *a, int argc, char **argv) {
    int seen[T_COUNT] = {0};
    char err[1024];
    for (int i = 1; i < argc; i++) {
        const train_opt *t = NULL;
        const char *v = NULL;
        for (int k = 0; k < TRAIN_NOPTS && !t; k++) {
            const train_opt *c = &train_table[k];
            if (!c->flag) continue;
            if (c->flag_form == F_SWITCH) {
                if (strcmp(argv[i], c->flag) == 0) t = c, v = "true";
            } else if ((v = srv_flag(argc, argv, &i, c->flag))) {
                t = c;
            }
        }
        if (!t) {
            fprintf(stderr, "error: unknown option '%s'\n", argv[i]);
            return 2;
        }
        seen[t->id] = 1;
        if (train_set(a, t, t->flag, v, t->flag_form == F_SPLIT, err, sizeof err)) {
            fprintf(stderr, "error: %s\n", err);
            return 2;
        }
    }
    for (int k = 0; k < TRAIN_NOPTS; k++)
        if ((train_table[k].req & REQ_FLAG) && !seen[train_table[k].id]) {
            fprintf(stderr, "error: %s is required\n", train_table[k].flag);
            train_usage(stderr);
            return 2;
        }
    return 0;
}

/* ---- job file ---- */

static const char *json_type(const cJSON *j) {
    if (cJSON_IsString(j)) return "a string";
    if (cJSON_IsNumber(j)) return "a number";
    if (cJSON_IsBool(j)) return "a boolean";
    if (cJSON_IsNull(j)) return "null";
    if (cJSON_IsArray(j)) return "an array";
    if (cJSON_IsObject(j)) return "an object";
    return "an invalid value";
}

static const char *jtype_name(train_jtype t) {
    return t == J_STR ? "a string" : t == J_INT ? "an integer" : t == J_NUM ? "a number" : t == J_BOOL ? "true or false"
           : t == J_STR_NUM ? "a string or a number" : "an array of strings";
}

/* One scalar JSON value as the text train_set parses; NULL (message in err) when its type is wrong. */
static const char *job_text(const cJSON *j, train_jtype type, const char *name, char *buf, size_t cap, char *err,
                            size_t n) {
    if ((type == J_STR || type == J_STRS || type == J_STR_NUM) && cJSON_IsString(j)) return j->valuestring;
    if (type == J_BOOL && cJSON_IsBool(j)) return cJSON_IsTrue(j) ? "true" : "false";
    if ((type == J_NUM || type == J_STR_NUM) && cJSON_IsNumber(j)) {
        snprintf(buf, cap, "%.17g", j->valuedouble);
        return buf;
    }
    if (type == J_INT && cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (d == trunc(d) && fabs(d) <= 9007199254740992.0) {
            snprintf(buf, cap, "%.0f", d);
            return buf;
        }
        set_err(err, n, "%s: expected an integer, got %.17g", name, d);
        return NULL;
    }
    set_err(err, n, "%s: expected %s, got %s", name, type == J_STRS ? "a string" : jtype_name(type), json_type(j));
    return NULL;
}

static int is_object_key(const char *path) {
    size_t l = strlen(path);
    for (int k = 0; k < TRAIN_NOPTS; k++) {
        const char *key = train_table[k].key;
        if (key && strncmp(key, path, l) == 0 && key[l] == '.') return 1;
    }
    return 0;
}

/* Apply the members of obj (the top level: prefix ""; a nested object: "schedule."). */
static int job_walk(train_args *a, const cJSON *obj, const char *prefix, int *seen, char *err, size_t n) {
    char path[256], name[300], num[64];
    for (const cJSON *it = obj->child; it; it = it->next) {
        if (!it->string || strchr(it->string, '.'))
            return set_err(err, n, "unknown key '%s%.64s'", prefix, it->string ? it->string : "");
        if (snprintf(path, sizeof path, "%s%s", prefix, it->string) >= (int)sizeof path)
            return set_err(err, n, "key '%.64s...' is too long", path);
        if (is_object_key(path)) {
            if (!cJSON_IsObject(it)) return set_err(err, n, "field '%s': expected an object, got %s", path, json_type(it));
            for (const cJSON *dup = obj->child; dup != it; dup = dup->next)
                if (dup->string && strcmp(dup->string, it->string) == 0)
                    return set_err(err, n, "field '%s' is given twice", path);
            char sub[260];
            snprintf(sub, sizeof sub, "%s.", path);
            if (job_walk(a, it, sub, seen, err, n)) return -1;
            for (int k = 0; k < TRAIN_NOPTS; k++) { /* required members of a given object */
                const train_opt *t = &train_table[k];
                if (t->key && (t->req & REQ_JOB) && strncmp(t->key, sub, strlen(sub)) == 0 && !seen[t->id])
                    return set_err(err, n, "field '%s' is required when '%s' is given", t->key, path);
            }
            continue;
        }
        const train_opt *t = NULL;
        for (int k = 0; k < TRAIN_NOPTS && !t; k++)
            if (train_table[k].key && strcmp(train_table[k].key, path) == 0) t = &train_table[k];
        if (!t) return set_err(err, n, "unknown key '%s'", path);
        if (seen[t->id]) return set_err(err, n, "field '%s' is given twice", path);
        seen[t->id] = 1;
        snprintf(name, sizeof name, "field '%s'", path);
        if (t->type == J_STRS) {
            if (!cJSON_IsArray(it)) return set_err(err, n, "%s: expected an array of strings, got %s", name, json_type(it));
            int i = 0;
            for (const cJSON *e = it->child; e; e = e->next, i++) {
                char ename[320];
                snprintf(ename, sizeof ename, "field '%s[%d]'", path, i);
                const char *v = job_text(e, J_STRS, ename, num, sizeof num, err, n);
                if (!v || train_set(a, t, ename, v, 0, err, n)) return -1;
            }
            if (i == 0 && (t->req & REQ_JOB)) return set_err(err, n, "%s: empty array", name);
            continue;
        }
        const char *v = job_text(it, t->type, name, num, sizeof num, err, n);
        if (!v || train_set(a, t, name, v, 0, err, n)) return -1;
    }
    return 0;
}

/* Read and apply the job file. *tree keeps the strings a->o points at alive (cJSON_Delete it after the run). */
static int train_parse_job(train_args *a, const char *file, cJSON **tree, char *err, size_t n) {
    *tree = NULL;
    uint8_t *buf = NULL;
    size_t len = 0;
    if (eng_file_read(file, TRAIN_JOB_MAX_BYTES, &buf, &len) != ENG_STATUS_OK)
        return set_err(err, n, "job file: %s", eng_last_error());
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts((const char *)buf, len, &end, 0);
    size_t at = end ? (size_t)(end - (const char *)buf) : 0;
    while (root && at < len && (buf[at] == ' ' || buf[at] == '\n' || buf[at] == '\r' || buf[at] == '\t')) at++;
    int trailing = root && at < len && buf[at] != 0;
    free(buf);
    if (!root || trailing) {
        cJSON_Delete(root);
        return set_err(err, n, "job file '%s': not valid JSON (at byte %zu)", file, at);
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return set_err(err, n, "job file '%s': expected a JSON object", file);
    }
    *tree = root;
    int seen[T_COUNT] = {0};
    char e[1024];
    if (job_walk(a, root, "", seen, e, sizeof e)) return set_err(err, n, "job file '%s': %s", file, e);
    for (int k = 0; k < TRAIN_NOPTS; k++) {
        const train_opt *t = &train_table[k];
        if (t->key && (t->req & REQ_JOB) && !strchr(t->key, '.') && !seen[t->id])
            return set_err(err, n, "job file '%s': field '%s' is required", file, t->key);
    }
    a->o.progress = 0; /* stdout is the protocol; no progress bar */
    return 0;
}

/* ---- the job protocol on stdout ---- */

/* A rank of an mpirun job that failed: end every rank now (MPI_Abort), since the others may be waiting in an
 * all-reduce this rank will never join. The engine only returns the error; ending the process is the program's. */
static void train_mpi_abort(void) {
#ifdef TENSORD_MPI
    MPI_Abort(MPI_COMM_WORLD, 1);
#endif
    _exit(1);
}

static atomic_int train_cancel_flag; /* set by SIGTERM/SIGINT (and a broken stdout) in job mode */

static void train_on_signal(int sig) {
    (void)sig;
    atomic_store(&train_cancel_flag, 1);
}

typedef struct job_out {
    int64_t job_id;
    int64_t max_steps;
    double last_step; /* monotonic seconds of the last step line */
    int64_t steps_sent;
    int broken;       /* stdout failed: nothing more is written */
} job_out;

static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Print obj as one line and flush; deletes obj. A failed write cancels the run (the reader is gone). */
static void job_emit(job_out *j, cJSON *obj) {
    char *s = obj ? cJSON_PrintUnformatted(obj) : NULL;
    cJSON_Delete(obj);
    if (!s) {
        fprintf(stderr, "error: out of memory formatting a progress line\n");
        return;
    }
    if (!j->broken && (fputs(s, stdout) < 0 || fputc('\n', stdout) < 0 || fflush(stdout) != 0)) {
        j->broken = 1;
        atomic_store(&train_cancel_flag, 1);
        fprintf(stderr, "error: cannot write to stdout (%s); cancelling the run\n", strerror(errno));
    }
    free(s);
}

static cJSON *job_event(const char *event) {
    cJSON *o = cJSON_CreateObject();
    if (o) cJSON_AddStringToObject(o, "event", event);
    return o;
}

/* NaN and infinities become null (cJSON prints non-finite numbers as null; made explicit here). */
static void add_num(cJSON *o, const char *k, double v) {
    if (!o) return;
    if (isfinite(v)) cJSON_AddNumberToObject(o, k, v);
    else cJSON_AddNullToObject(o, k);
}

/* The engine keeps learning rates as float: print the float's shortest faithful text (0.001, not
 * 0.0010000000474974513). */
static double f32_text(double v) {
    char b[32];
    if (!isfinite(v)) return v;
    snprintf(b, sizeof b, "%.7g", v);
    return strtod(b, NULL);
}

static void job_on_progress(void *arg, const eng_train_progress *p) {
    job_out *j = arg;
    cJSON *o = NULL;
    if (p->kind == ENG_TRAIN_PROGRESS_START) {
        o = job_event("start");
        add_num(o, "job_id", (double)j->job_id);
        add_num(o, "epochs", p->epochs);
        add_num(o, "steps_per_epoch", (double)p->steps_per_epoch);
        add_num(o, "examples", (double)p->examples);
        add_num(o, "val_examples", (double)p->val_examples);
        add_num(o, "new_version", (double)p->version);
        add_num(o, "resumed_from_step", (double)p->resumed_from_step);
    } else if (p->kind == ENG_TRAIN_PROGRESS_STEP) {
        double now = mono_now();
        int always = j->steps_sent == 0 || p->step == 1 || p->step == p->steps_per_epoch ||
                     (j->max_steps > 0 && p->global_step == j->max_steps);
        if (!always && now - j->last_step < 0.1) return;
        j->last_step = now;
        j->steps_sent++;
        o = job_event("step");
        add_num(o, "epoch", p->epoch);
        add_num(o, "epochs", p->epochs);
        add_num(o, "step", (double)p->step);
        add_num(o, "steps_per_epoch", (double)p->steps_per_epoch);
        add_num(o, "global_step", (double)p->global_step);
        add_num(o, "loss", p->loss);
        add_num(o, "accuracy", p->accuracy);
        add_num(o, "examples_per_sec", p->examples_per_sec);
        add_num(o, "eta_s", p->eta_s);
        add_num(o, "learning_rate", f32_text(p->learning_rate));
    } else {
        o = job_event("epoch");
        add_num(o, "epoch", p->epoch);
        add_num(o, "epochs", p->epochs);
        add_num(o, "global_step", (double)p->global_step);
        add_num(o, "loss", p->loss);
        add_num(o, "accuracy", p->accuracy);
        add_num(o, "val_loss", p->val_loss);
        add_num(o, "val_accuracy", p->val_accuracy);
        add_num(o, "examples_per_sec", p->examples_per_sec);
        add_num(o, "learning_rate", f32_text(p->learning_rate));
        if (o) cJSON_AddBoolToObject(o, "early_stopping", p->early_stop);
    }
    job_emit(j, o);
}

static int job_error(job_out *j, const char *msg) {
    fprintf(stderr, "error: %s\n", msg);
    cJSON *o = job_event("error");
    if (o) cJSON_AddStringToObject(o, "message", msg);
    job_emit(j, o);
    return 1;
}

static int train_run_job(const char *file) {
    job_out j = {0};
    /* before anything slow, so that a cancel sent early is not lost */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = train_on_signal;
    sa.sa_flags = SA_RESTART | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    train_args a;
    train_args_init(&a);
    cJSON *tree = NULL;
    char err[2048];
    int rc;
    if (train_parse_job(&a, file, &tree, err, sizeof err)) {
        rc = job_error(&j, err);
    } else {
        j.job_id = a.job_id;
        j.max_steps = a.o.max_steps;
        a.o.on_progress = job_on_progress;
        a.o.progress_arg = &j;
        a.o.cancel = &train_cancel_flag;
        eng_train_result r;
        eng_status st = eng_train(&a.o, &r);
        if (st == ENG_STATUS_CANCELLED) {
            fprintf(stderr, "cancelled: no version written\n");
            job_emit(&j, job_event("cancelled"));
            rc = TRAIN_EXIT_CANCELLED;
        } else if (st != ENG_STATUS_OK) {
            snprintf(err, sizeof err, "%s", eng_last_error());
            rc = job_error(&j, err);
        } else {
            cJSON *o = job_event("done");
            add_num(o, "version", (double)r.version);
            if (o) cJSON_AddStringToObject(o, "path", r.path);
            add_num(o, "epochs_run", r.epochs_run);
            add_num(o, "steps", (double)r.steps);
            add_num(o, "loss", r.loss);
            add_num(o, "accuracy", r.accuracy);
            add_num(o, "val_loss", r.val_loss);
            add_num(o, "val_accuracy", r.val_accuracy);
            add_num(o, "examples_per_sec", r.examples_per_sec);
            add_num(o, "loss_scale", r.loss_scale);
            add_num(o, "skipped_steps", (double)r.skipped_steps);
            job_emit(&j, o);
            rc = 0;
        }
    }
    train_args_free(&a);
    cJSON_Delete(tree);
    return rc;
}

/* TENSORD_WORLD_SIZE > 1 without mpirun (a Kubernetes indexed Job): join the job through TENSORD_COORDINATOR
 * (engine/train/rendezvous.h). Only for replicas on devices whose backend has multi-process collectives (NCCL):
 * the coordinator's connections carry no gradients. 0 with *world set (NULL when the world size is 1), else 1
 * after printing why. */
static int train_join_coordinator(train_args *a, eng_comm **world) {
    *world = NULL;
    eng_rdv_opts ro;
    if (eng_rdv_opts_from_env(&ro) != ENG_STATUS_OK) {
        fprintf(stderr, "error: %s\n", eng_last_error());
        return 1;
    }
    if (ro.world_size == 1) return 0;
    const char *why = NULL, *dev = NULL;
    for (int d = 0; d < a->o.ndevices && !why; d++) {
        const krn_backend *b = NULL;
        if (krn_backend_by_name(a->o.devices[d], &b, NULL) != ENG_STATUS_OK) {
            fprintf(stderr, "error: --devices: %s\n", eng_last_error());
            return 1;
        }
        if (krn_backend_is_host(b)) why = "runs on the CPU", dev = a->o.devices[d];
        else if (!krn_backend_has_comm_ranks(b)) why = "has no collectives across processes (NCCL)", dev = a->o.devices[d];
    }
    if (a->o.ndevices == 0) why = "runs on the CPU", dev = "cpu";
    if (why) {
        fprintf(stderr, "error: TENSORD_WORLD_SIZE=%d without mpirun: training across processes through "
                "TENSORD_COORDINATOR needs every replica on a device whose backend has multi-process collectives "
                "(--devices cuda:0,...: NCCL), and device '%s' %s. Gradients only ever travel through NCCL or MPI: for "
                "CPU training across processes run the ranks under mpirun (mpirun -np %d tensord train ...)\n",
                ro.world_size, dev, why, ro.world_size);
        return 1;
    }
    if (eng_comm_new_coordinator(&ro, world) != ENG_STATUS_OK) {
        fprintf(stderr, "error: %s\n", eng_last_error());
        return 1;
    }
    return 0;
}

int srv_cmd_train(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            train_usage(stdout);
            return 0;
        }
    }
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--job") != 0 && strncmp(argv[i], "--job=", 6) != 0) continue;
        int k = 1;
        const char *job = srv_flag(argc, argv, &k, "--job");
        if (!job || k != argc - 1) {
            fprintf(stderr, "error: --job FILE takes no other options (the job file holds them all)\n");
            train_usage(stderr);
            return 2;
        }
        if (eng_comm_mpi_launched()) {
            fprintf(stderr, "error: --job runs as one process; under mpirun use the flags (tensord train --model-base-path ...)\n");
            return 2;
        }
        return train_run_job(job);
    }
    train_args a;
    train_args_init(&a);
    int rc = train_parse_flags(&a, argc, argv);
    /* under mpirun: this process is one rank of the job (engine/train/comm-mpi.c); otherwise, with
     * TENSORD_WORLD_SIZE > 1 (deploy/k8s/train-job.yaml), one rank of a job joined through TENSORD_COORDINATOR */
    eng_comm *world = NULL;
    const char *ws = getenv("TENSORD_WORLD_SIZE");
    if (rc == 0 && eng_comm_mpi_launched()) {
        if (eng_comm_new_mpi(&world) != ENG_STATUS_OK) {
            fprintf(stderr, "error: %s\n", eng_last_error());
            train_args_free(&a);
            return 1;
        }
        a.o.world = world;
        if (eng_comm_rank(world) != 0) a.o.progress = 0;
    } else if (rc == 0 && ws && *ws && strcmp(ws, "1") != 0) {
        if (train_join_coordinator(&a, &world) != 0) {
            train_args_free(&a);
            return 1;
        }
        a.o.world = world;
        if (world && eng_comm_rank(world) != 0) a.o.progress = 0;
    }
    if (rc == 0) {
        eng_train_result r;
        if (eng_train(&a.o, &r) != ENG_STATUS_OK) {
            if (world && strcmp(eng_comm_kind(world), "mpi") == 0) {
                fprintf(stderr, "error: rank %d of %d: %s\n", eng_comm_rank(world), eng_comm_size(world), eng_last_error());
                fflush(stderr);
                train_mpi_abort(); /* the other ranks may be waiting in an all-reduce: end the job */
            }
            /* the coordinator's ranks: exiting closes this rank's connections, which ends the others' waits */
            fprintf(stderr, "error: %s\n", eng_last_error());
            rc = 1;
        } else if (world && eng_comm_rank(world) != 0) {
            /* rank 0 reports and wrote the version */
        } else {
            printf("%s\n", r.path);
            printf("version %lld: epochs %d, steps %lld, loss %.6g, accuracy %.6g, val_loss %.6g, val_accuracy %.6g, "
                   "%.1f examples/s\n",
                   (long long)r.version, r.epochs_run, (long long)r.steps, r.loss, r.accuracy, r.val_loss,
                   r.val_accuracy, r.examples_per_sec);
            if (r.skipped_steps > 0 || r.loss_scale != 1.0)
                printf("loss scaling: final scale %g, %lld steps skipped on non-finite gradients\n", r.loss_scale,
                       (long long)r.skipped_steps);
        }
    }
    eng_comm_free(&world);
    train_args_free(&a);
    return rc;
}
