/* cli-evaluate.c - `tensord evaluate`: score a bundle's version on a labelled dataset, optionally against another
 * version (engine/train/eval.h does the work).
 *
 * stdout: one JSON object, {"version", "examples", "accuracy" | "mse", "against": {...}}; stderr: a readable
 * summary. Errors are one `error: ...` line on stderr with exit 1; bad usage exits 2.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/train/eval.h"
#include "cli.h"

#define EVAL_MAX_FILES 64

int srv_cmd_evaluate(int argc, char **argv);

static void evaluate_usage(FILE *f) {
    fprintf(f, "usage: tensord evaluate --model-base-path DIR --version N --data FILE[,FILE] [--against M]\n"
               "         [--batch-size B] [--threads T] [--precision fp32|bf16|fp16|int8] [--against-precision P]\n"
               "  --precision runs version N at that precision (fp32 default); --against-precision does so for M, so\n"
               "  `--version 2 --precision bf16 --against 2` measures what bf16 costs version 2.\n");
}

static void add_num(cJSON *o, const char *k, double v) {
    if (isfinite(v)) cJSON_AddNumberToObject(o, k, v);
    else cJSON_AddNullToObject(o, k);
}

int srv_cmd_evaluate(int argc, char **argv) {
    const char *base = NULL, *files[EVAL_MAX_FILES];
    char *owned[EVAL_MAX_FILES];
    int nfiles = 0, nowned = 0, rc = 2;
    long long version = -1, against = 0, bs = 256, threads = 0;
    eng_precision prec = ENG_PRECISION_FP32, prec_b = ENG_PRECISION_FP32;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            evaluate_usage(stdout);
            rc = 0;
            goto out;
        }
        if ((v = srv_flag(argc, argv, &i, "--model-base-path"))) {
            base = v;
        } else if ((v = srv_flag(argc, argv, &i, "--version"))) {
            if (srv_flag_i64("--version", v, 1, &version)) goto out;
        } else if ((v = srv_flag(argc, argv, &i, "--against"))) {
            if (srv_flag_i64("--against", v, 1, &against)) goto out;
        } else if ((v = srv_flag(argc, argv, &i, "--batch-size"))) {
            if (srv_flag_i64("--batch-size", v, 1, &bs)) goto out;
        } else if ((v = srv_flag(argc, argv, &i, "--threads"))) {
            if (srv_flag_i64("--threads", v, 0, &threads) || threads > 4096) {
                if (threads > 4096) fprintf(stderr, "error: --threads: '%s' is too large\n", v);
                goto out;
            }
        } else if ((v = srv_flag(argc, argv, &i, "--precision"))) {
            if (eng_precision_parse(v, &prec) != ENG_STATUS_OK) {
                fprintf(stderr, "error: --precision: %s\n", eng_last_error());
                goto out;
            }
        } else if ((v = srv_flag(argc, argv, &i, "--against-precision"))) {
            if (eng_precision_parse(v, &prec_b) != ENG_STATUS_OK) {
                fprintf(stderr, "error: --against-precision: %s\n", eng_last_error());
                goto out;
            }
        } else if ((v = srv_flag(argc, argv, &i, "--data"))) {
            if (nowned == EVAL_MAX_FILES || !(owned[nowned] = strdup(v))) {
                fprintf(stderr, "error: --data: given too many times\n");
                goto out;
            }
            for (char *tok = strtok(owned[nowned++], ","); tok; tok = strtok(NULL, ","))
                if (*tok) {
                    if (nfiles == EVAL_MAX_FILES) {
                        fprintf(stderr, "error: --data: more than %d files\n", EVAL_MAX_FILES);
                        goto out;
                    }
                    files[nfiles++] = tok;
                }
        } else {
            fprintf(stderr, "error: unknown option '%s'\n", argv[i]);
            evaluate_usage(stderr);
            goto out;
        }
    }
    if (!base || !*base || version < 0 || nfiles == 0) {
        fprintf(stderr, "error: %s is required\n", !base || !*base ? "--model-base-path" : version < 0 ? "--version" : "--data");
        evaluate_usage(stderr);
        goto out;
    }
    eng_eval_opts o = {.batch_size = bs, .nthreads = (int)threads, .precision = prec, .precision_b = prec_b};
    eng_eval_report r;
    if (eng_eval_versions(base, version, against, files, nfiles, &o, &r) != ENG_STATUS_OK) {
        fprintf(stderr, "error: %s\n", eng_last_error());
        eng_eval_report_free(&r);
        rc = 1;
        goto out;
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "version", (double)version);
    cJSON_AddStringToObject(j, "precision", eng_precision_name(prec));
    cJSON_AddNumberToObject(j, "examples", (double)r.examples);
    const int cls = r.a.classification;
    add_num(j, cls ? "accuracy" : "mse", cls ? r.a.accuracy : r.a.mse);
    fprintf(stderr, "%s: version %lld on %lld examples: %s %.4f%s\n", base, version, (long long)r.examples,
            cls ? "accuracy" : "mse", cls ? 100 * r.a.accuracy : r.a.mse, cls ? "%" : "");
    if (against > 0) {
        cJSON *a = cJSON_AddObjectToObject(j, "against");
        cJSON_AddNumberToObject(a, "version", (double)against);
        cJSON_AddStringToObject(a, "precision", eng_precision_name(prec_b));
        if (cls) {
            add_num(a, "accuracy", r.b.accuracy);
            add_num(a, "agreement", r.cmp.agreement);
            add_num(a, "accuracy_delta", r.cmp.accuracy_delta);
            fprintf(stderr, "  version %lld: accuracy %.4f%%; agreement %.4f%%; delta (%lld - %lld) %+.4f points\n",
                    against, 100 * r.b.accuracy, 100 * r.cmp.agreement, version, against, 100 * r.cmp.accuracy_delta);
        } else {
            add_num(a, "mse", r.b.mse);
            add_num(a, "mean_sq_diff", r.cmp.mean_sq_diff);
            add_num(a, "mse_delta", r.cmp.mse_delta);
            fprintf(stderr, "  version %lld: mse %.6g; mean squared difference %.6g; delta (%lld - %lld) %+.6g\n",
                    against, r.b.mse, r.cmp.mean_sq_diff, version, against, r.cmp.mse_delta);
        }
    }
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    eng_eval_report_free(&r);
    if (!s) {
        fprintf(stderr, "error: out of memory\n");
        rc = 1;
        goto out;
    }
    printf("%s\n", s);
    free(s);
    rc = fflush(stdout) == 0 ? 0 : 1;
out:
    for (int i = 0; i < nowned; i++) free(owned[i]);
    return rc;
}
