/* cli-train.c - `tensord train`: fine-tune a bundle's version and write the next version (engine/train/train.h).
 *
 * Prints the new version's path and its final metrics on stdout; errors are one `error: ...` line on stderr
 * with exit 1; bad usage exits 2.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/train/train.h"
#include "cli.h"

#define TRAIN_MAX_FILES 64

int srv_cmd_train(int argc, char **argv);

static void train_usage(FILE *f) {
    fprintf(f,
            "usage: tensord train --model-base-path DIR [--base-version N] --data FILE[,FILE] [--val-data FILE[,FILE]]\n"
            "         --epochs E --batch-size B --optimizer sgd|adam|adamw --lr X [--momentum M] [--nesterov]\n"
            "         [--weight-decay W] [--clipnorm C] [--accum-steps K] [--lr-schedule constant|step|cosine]\n"
            "         [--warmup-steps W] [--step-size S --gamma G] [--decay-steps D] [--min-lr X]\n"
            "         --loss sparse_categorical_crossentropy|categorical_crossentropy|binary_crossentropy|mse|cosine_similarity\n"
            "         [--from-logits true|false] [--val-split 0.1] [--freeze PREFIX]... [--threads T] [--replicas R]\n"
            "         [--resume] [--checkpoint-every K] [--seed S] [--early-stopping-patience P]\n"
            "         [--monitor val_loss|val_accuracy|loss|accuracy] [--keep-best] [--max-steps N] [--no-progress]\n");
}

static int split_files(char *v, const char **out, int *n, const char *flag) {
    for (char *tok = strtok(v, ","); tok; tok = strtok(NULL, ",")) {
        if (!*tok) continue;
        if (*n == TRAIN_MAX_FILES) {
            fprintf(stderr, "error: %s: more than %d files\n", flag, TRAIN_MAX_FILES);
            return 2;
        }
        out[(*n)++] = tok;
    }
    return 0;
}

/* strict numeric parsing: the whole string must be a number */
static int num_d(const char *flag, const char *v, double *out) {
    char *end;
    *out = strtod(v, &end);
    if (end == v || *end || !isfinite(*out)) {
        fprintf(stderr, "error: %s: '%s' is not a number\n", flag, v);
        return 2;
    }
    return 0;
}

static int num_i(const char *flag, const char *v, long long lo, long long *out) {
    char *end;
    *out = strtoll(v, &end, 10);
    if (end == v || *end || *out < lo) {
        fprintf(stderr, "error: %s: '%s' is not an integer >= %lld\n", flag, v, lo);
        return 2;
    }
    return 0;
}

int srv_cmd_train(int argc, char **argv) {
    eng_train_opts o;
    memset(&o, 0, sizeof o);
    o.replicas = 1;
    o.from_logits = -1;
    o.progress = 1;
    o.monitor = "val_loss";
    o.loss = (eng_loss_kind)-1;
    o.optim.kind = (eng_optim_kind)-1;
    const char *data[TRAIN_MAX_FILES], *val[TRAIN_MAX_FILES], *freeze[TRAIN_MAX_FILES];
    char *owned[2 * TRAIN_MAX_FILES];
    int nowned = 0, rc = 0;
    o.data_files = data;
    o.val_files = val;
    o.freeze = freeze;
    for (int i = 1; i < argc && rc == 0; i++) {
        const char *v;
        double d;
        long long n;
        int is_val = 0;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            train_usage(stdout);
            return 0;
        } else if ((v = srv_flag(argc, argv, &i, "--model-base-path"))) o.model_base_path = v;
        else if ((v = srv_flag(argc, argv, &i, "--base-version"))) rc = num_i("--base-version", v, 0, &n), o.base_version = n;
        else if ((v = srv_flag(argc, argv, &i, "--data")) || (is_val = 1, v = srv_flag(argc, argv, &i, "--val-data"))) {
            char *copy = strdup(v);
            if (!copy || nowned == 2 * TRAIN_MAX_FILES) {
                free(copy);
                fprintf(stderr, "error: too many --data/--val-data options\n");
                rc = 2;
                continue;
            }
            owned[nowned++] = copy;
            rc = is_val ? split_files(copy, val, &o.nval, "--val-data") : split_files(copy, data, &o.ndata, "--data");
        } else if ((v = srv_flag(argc, argv, &i, "--epochs"))) rc = num_i("--epochs", v, 1, &n), o.epochs = (int)n;
        else if ((v = srv_flag(argc, argv, &i, "--batch-size"))) rc = num_i("--batch-size", v, 1, &n), o.batch_size = n;
        else if ((v = srv_flag(argc, argv, &i, "--optimizer"))) {
            int k = eng_optim_parse(v);
            if (k < 0) {
                fprintf(stderr, "error: --optimizer: unknown optimizer '%s' (sgd, adam, adamw)\n", v);
                rc = 2;
            }
            o.optim.kind = (eng_optim_kind)k;
        } else if ((v = srv_flag(argc, argv, &i, "--lr"))) rc = num_d("--lr", v, &d), o.optim.lr = (float)d;
        else if ((v = srv_flag(argc, argv, &i, "--momentum"))) rc = num_d("--momentum", v, &d), o.optim.momentum = (float)d;
        else if (strcmp(argv[i], "--nesterov") == 0) o.optim.nesterov = 1;
        else if ((v = srv_flag(argc, argv, &i, "--weight-decay"))) rc = num_d("--weight-decay", v, &d), o.optim.weight_decay = (float)d;
        else if ((v = srv_flag(argc, argv, &i, "--clipnorm"))) rc = num_d("--clipnorm", v, &d), o.optim.clipnorm = (float)d;
        else if ((v = srv_flag(argc, argv, &i, "--accum-steps"))) rc = num_i("--accum-steps", v, 1, &n), o.optim.accum_steps = (int)n;
        else if ((v = srv_flag(argc, argv, &i, "--lr-schedule"))) {
            if (strcmp(v, "constant") == 0) o.optim.schedule = ENG_LR_CONSTANT;
            else if (strcmp(v, "step") == 0) o.optim.schedule = ENG_LR_STEP;
            else if (strcmp(v, "cosine") == 0) o.optim.schedule = ENG_LR_COSINE;
            else {
                fprintf(stderr, "error: --lr-schedule: unknown schedule '%s' (constant, step, cosine)\n", v);
                rc = 2;
            }
        } else if ((v = srv_flag(argc, argv, &i, "--warmup-steps"))) rc = num_i("--warmup-steps", v, 0, &n), o.optim.warmup_steps = n;
        else if ((v = srv_flag(argc, argv, &i, "--step-size"))) rc = num_i("--step-size", v, 1, &n), o.optim.step_size = n;
        else if ((v = srv_flag(argc, argv, &i, "--gamma"))) rc = num_d("--gamma", v, &d), o.optim.gamma = (float)d;
        else if ((v = srv_flag(argc, argv, &i, "--decay-steps"))) rc = num_i("--decay-steps", v, 1, &n), o.optim.decay_steps = n;
        else if ((v = srv_flag(argc, argv, &i, "--min-lr"))) rc = num_d("--min-lr", v, &d), o.optim.min_lr = (float)d;
        else if ((v = srv_flag(argc, argv, &i, "--loss"))) {
            int k = eng_loss_parse(v);
            if (k < 0) {
                fprintf(stderr, "error: --loss: unknown loss '%s'\n", v);
                rc = 2;
            }
            o.loss = (eng_loss_kind)k;
        } else if ((v = srv_flag(argc, argv, &i, "--from-logits"))) {
            if (strcmp(v, "true") == 0 || strcmp(v, "1") == 0) o.from_logits = 1;
            else if (strcmp(v, "false") == 0 || strcmp(v, "0") == 0) o.from_logits = 0;
            else if (strcmp(v, "auto") == 0) o.from_logits = -1;
            else {
                fprintf(stderr, "error: --from-logits takes true or false, got '%s'\n", v);
                rc = 2;
            }
        } else if ((v = srv_flag(argc, argv, &i, "--val-split"))) {
            rc = num_d("--val-split", v, &d);
            if (!rc && !(d >= 0 && d < 1)) {
                fprintf(stderr, "error: --val-split must be in [0, 1), got '%s'\n", v);
                rc = 2;
            }
            o.val_split = d;
        } else if ((v = srv_flag(argc, argv, &i, "--freeze"))) {
            if (o.nfreeze == TRAIN_MAX_FILES) {
                fprintf(stderr, "error: too many --freeze prefixes\n");
                rc = 2;
            } else {
                freeze[o.nfreeze++] = v;
            }
        } else if ((v = srv_flag(argc, argv, &i, "--threads"))) rc = num_i("--threads", v, 0, &n), o.nthreads = (int)n;
        else if ((v = srv_flag(argc, argv, &i, "--replicas"))) rc = num_i("--replicas", v, 1, &n), o.replicas = (int)n;
        else if (strcmp(argv[i], "--resume") == 0) o.resume = 1;
        else if ((v = srv_flag(argc, argv, &i, "--checkpoint-every"))) rc = num_i("--checkpoint-every", v, 0, &n), o.checkpoint_every = n;
        else if ((v = srv_flag(argc, argv, &i, "--seed"))) rc = num_i("--seed", v, 0, &n), o.seed = (uint64_t)n;
        else if ((v = srv_flag(argc, argv, &i, "--early-stopping-patience")))
            rc = num_i("--early-stopping-patience", v, 0, &n), o.early_stopping_patience = (int)n;
        else if ((v = srv_flag(argc, argv, &i, "--monitor"))) o.monitor = v;
        else if (strcmp(argv[i], "--keep-best") == 0) o.keep_best = 1;
        else if ((v = srv_flag(argc, argv, &i, "--max-steps"))) rc = num_i("--max-steps", v, 0, &n), o.max_steps = n;
        else if (strcmp(argv[i], "--no-progress") == 0) o.progress = 0;
        else {
            fprintf(stderr, "error: unknown option '%s'\n", argv[i]);
            rc = 2;
        }
    }
    const char *missing = NULL;
    if (rc == 0) {
        if (!o.model_base_path) missing = "--model-base-path";
        else if (o.ndata == 0) missing = "--data";
        else if (o.epochs == 0) missing = "--epochs";
        else if (o.batch_size == 0) missing = "--batch-size";
        else if ((int)o.optim.kind < 0) missing = "--optimizer";
        else if ((int)o.loss < 0) missing = "--loss";
        if (missing) {
            fprintf(stderr, "error: %s is required\n", missing);
            train_usage(stderr);
            rc = 2;
        }
    }
    if (rc == 0) {
        eng_train_result r;
        if (eng_train(&o, &r) != ENG_STATUS_OK) {
            fprintf(stderr, "error: %s\n", eng_last_error());
            rc = 1;
        } else {
            printf("%s\n", r.path);
            printf("version %lld: epochs %d, steps %lld, loss %.6g, accuracy %.6g, val_loss %.6g, val_accuracy %.6g, "
                   "%.1f examples/s\n",
                   (long long)r.version, r.epochs_run, (long long)r.steps, r.loss, r.accuracy, r.val_loss,
                   r.val_accuracy, r.examples_per_sec);
        }
    }
    for (int i = 0; i < nowned; i++) free(owned[i]);
    return rc;
}
