/* cli-quantize.c - `tensord quantize`: post-training static quantization of a bundle's version N into version
 * N+1 in ONNX's QDQ form (engine/quant/quant.h), with an accuracy report (engine/train/eval.h).
 *
 * Order: every check that can refuse (version N, --exclude names, something to quantize, calibration data that
 * loads, is not empty and fits the model's inputs, --eval data that loads and fits) runs before anything is
 * written; the version is staged, its files written and fsynced, and published with one rename
 * (eng_bundle_stage / eng_bundle_publish), so a refusal or a failure leaves no version N+1.
 * The version holds model.onnx, signature.json copied byte for byte from version N (when it has one), and
 * metrics.json: {"quantization": {"method", "per_channel", "source_version", "nodes_quantized",
 * "nodes_excluded", "activations": {name: {scale, zero_point, dtype, min, max}}}, "evaluation": {"data",
 * "examples", "fp32": {"version", "accuracy"|"mse"}, "int8": {...}, "agreement"|"mean_sq_diff",
 * "accuracy_delta"|"mse_delta"}}. Without --eval the calibration data is used when it has a "label" column;
 * otherwise "evaluation" is null with a "reason".
 * stdout: the new version's path, then the report as one JSON line; errors: one `error: ...` line, exit 1;
 * usage: exit 2.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../engine/bundle.h"
#include "../engine/ir/file-io.h"
#include "../engine/ir/onnx.h"
#include "../engine/quant/quant.h"
#include "../engine/train/eval.h"
#include "cli.h"

#define QZ_MAX_FILES 64

int srv_cmd_quantize(int argc, char **argv);

static void quantize_usage(FILE *f) {
    fprintf(f, "usage: tensord quantize --model-base-path DIR --version N --calibration FILE[,FILE]\n"
               "         [--method minmax|percentile|entropy] [--per-channel|--per-tensor] [--exclude NODE]...\n"
               "         [--eval FILE[,FILE]] [--batch-size B] [--threads T] [--new-version V (default N+1)]\n");
}

typedef struct qz_args {
    const char *base;
    long long version, bs, threads, new_version; /* new_version 0: version + 1 */
    const char *calib[QZ_MAX_FILES], *eval[QZ_MAX_FILES], *exclude[QZ_MAX_FILES];
    int ncalib, neval, nexclude;
    char *owned[2 * QZ_MAX_FILES];
    int nowned;
    eng_quant_opts o;
} qz_args;

static int qz_split(qz_args *a, const char *flag, const char *v, const char **list, int *n) {
    if (a->nowned == 2 * QZ_MAX_FILES || !(a->owned[a->nowned] = strdup(v))) {
        fprintf(stderr, "error: %s: given too many times\n", flag);
        return -1;
    }
    int any = 0;
    for (char *tok = strtok(a->owned[a->nowned++], ","); tok; tok = strtok(NULL, ","))
        if (*tok) {
            if (*n == QZ_MAX_FILES) {
                fprintf(stderr, "error: %s: more than %d files\n", flag, QZ_MAX_FILES);
                return -1;
            }
            list[(*n)++] = tok;
            any = 1;
        }
    if (!any) fprintf(stderr, "error: %s: empty list\n", flag);
    return any ? 0 : -1;
}

/* 0, 1 (--help printed) or 2 (usage error printed). */
static int qz_parse(qz_args *a, int argc, char **argv) {
    a->version = -1;
    a->o.method = ENG_QUANT_MINMAX;
    a->o.per_channel = 1;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            quantize_usage(stdout);
            return 1;
        }
        if (strcmp(argv[i], "--per-channel") == 0) a->o.per_channel = 1;
        else if (strcmp(argv[i], "--per-tensor") == 0) a->o.per_channel = 0;
        else if ((v = srv_flag(argc, argv, &i, "--model-base-path"))) a->base = v;
        else if ((v = srv_flag(argc, argv, &i, "--version"))) {
            if (srv_flag_i64("--version", v, 1, &a->version)) return 2;
        } else if ((v = srv_flag(argc, argv, &i, "--new-version"))) {
            if (srv_flag_i64("--new-version", v, 1, &a->new_version)) return 2;
        } else if ((v = srv_flag(argc, argv, &i, "--batch-size"))) {
            if (srv_flag_i64("--batch-size", v, 1, &a->bs)) return 2;
        } else if ((v = srv_flag(argc, argv, &i, "--threads"))) {
            if (srv_flag_i64("--threads", v, 0, &a->threads)) return 2;
            if (a->threads > 4096) {
                fprintf(stderr, "error: --threads: '%s' is too large\n", v);
                return 2;
            }
        } else if ((v = srv_flag(argc, argv, &i, "--method"))) {
            int m = eng_quant_method_parse(v);
            if (m < 0) {
                fprintf(stderr, "error: --method: unknown method '%s' (minmax, percentile, entropy)\n", v);
                return 2;
            }
            a->o.method = (eng_quant_method)m;
        } else if ((v = srv_flag(argc, argv, &i, "--calibration"))) {
            if (qz_split(a, "--calibration", v, a->calib, &a->ncalib)) return 2;
        } else if ((v = srv_flag(argc, argv, &i, "--eval"))) {
            if (qz_split(a, "--eval", v, a->eval, &a->neval)) return 2;
        } else if ((v = srv_flag(argc, argv, &i, "--exclude"))) {
            if (!*v || a->nexclude == QZ_MAX_FILES) {
                fprintf(stderr, "error: --exclude: %s\n", *v ? "given too many times" : "empty node name");
                return 2;
            }
            a->exclude[a->nexclude++] = v;
            /* `--exclude A B ...`: the names that follow, up to the next flag */
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0 && a->nexclude < QZ_MAX_FILES)
                a->exclude[a->nexclude++] = argv[++i];
        } else {
            fprintf(stderr, "error: unknown option '%s'\n", argv[i]);
            quantize_usage(stderr);
            return 2;
        }
    }
    if (!a->base || !*a->base || a->version < 0 || a->ncalib == 0) {
        fprintf(stderr, "error: %s is required\n",
                !a->base || !*a->base ? "--model-base-path" : a->version < 0 ? "--version" : "--calibration");
        quantize_usage(stderr);
        return 2;
    }
    a->o.exclude = a->exclude;
    a->o.nexclude = a->nexclude;
    a->o.batch_size = a->bs;
    a->o.nthreads = (int)a->threads;
    return 0;
}

static void qz_num(cJSON *o, const char *k, double v) {
    if (isfinite(v)) cJSON_AddNumberToObject(o, k, v);
    else cJSON_AddNullToObject(o, k);
}

static cJSON *qz_files(const char *const *f, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateString(f[i]));
    return a;
}

static cJSON *qz_report(const qz_args *a, const eng_graph *g, const eng_quant_plan *p) {
    cJSON *q = cJSON_CreateObject();
    cJSON_AddStringToObject(q, "method", eng_quant_method_name(a->o.method));
    cJSON_AddBoolToObject(q, "per_channel", a->o.per_channel);
    cJSON_AddNumberToObject(q, "source_version", (double)a->version);
    cJSON_AddStringToObject(q, "format", "QDQ");
    cJSON_AddItemToObject(q, "calibration_data", qz_files(a->calib, a->ncalib));
    cJSON *nq = cJSON_AddArrayToObject(q, "nodes_quantized"), *ne = cJSON_AddArrayToObject(q, "nodes_excluded");
    for (int i = 0; i < p->nnodes; i++) cJSON_AddItemToArray(nq, cJSON_CreateString(g->nodes[p->nodes[i]].name));
    for (int i = 0; i < p->nexcluded; i++) cJSON_AddItemToArray(ne, cJSON_CreateString(g->nodes[p->excluded[i]].name));
    cJSON *acts = cJSON_AddObjectToObject(q, "activations");
    for (int i = 0; i < p->nacts; i++) {
        const eng_quant_act *x = &p->acts[i];
        cJSON *o = cJSON_AddObjectToObject(acts, g->values[x->value].name);
        if (!o) continue;
        qz_num(o, "scale", x->scale);
        cJSON_AddNumberToObject(o, "zero_point", x->zero_point);
        cJSON_AddStringToObject(o, "dtype", eng_dtype_name(x->dtype));
        qz_num(o, "min", x->min);
        qz_num(o, "max", x->max);
    }
    return q;
}

static cJSON *qz_eval_json(const char *const *files, int n, int64_t fv, int64_t qv, const eng_eval_preds *f,
                           const eng_eval_preds *q, const eng_eval_cmp *c) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddItemToObject(e, "data", qz_files(files, n));
    cJSON_AddNumberToObject(e, "examples", (double)f->n);
    const char *m = f->classification ? "accuracy" : "mse";
    cJSON *a = cJSON_AddObjectToObject(e, "fp32"), *b = cJSON_AddObjectToObject(e, "int8");
    cJSON_AddNumberToObject(a, "version", (double)fv);
    qz_num(a, m, f->classification ? f->accuracy : f->mse);
    cJSON_AddNumberToObject(b, "version", (double)qv);
    qz_num(b, m, q->classification ? q->accuracy : q->mse);
    if (f->classification) {
        qz_num(e, "agreement", c->agreement);
        qz_num(e, "accuracy_delta", c->accuracy_delta); /* int8 - fp32 */
    } else {
        qz_num(e, "mean_sq_diff", c->mean_sq_diff);
        qz_num(e, "mse_delta", c->mse_delta);
    }
    return e;
}

static eng_status qz_write(const char *dir, const char *name, const void *buf, size_t n) {
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    eng_atomic_file f;
    ENG_TRY(eng_atomic_open(&f, p));
    eng_status st = eng_atomic_write(&f, buf, n);
    if (st != ENG_STATUS_OK) {
        eng_atomic_abort(&f);
        return st;
    }
    return eng_atomic_commit(&f);
}

int srv_cmd_quantize(int argc, char **argv) {
    qz_args a;
    memset(&a, 0, sizeof a);
    int rc = qz_parse(&a, argc, argv);
    if (rc) {
        for (int i = 0; i < a.nowned; i++) free(a.owned[i]);
        return rc == 1 ? 0 : 2;
    }
    char src[4096], what[4200], tmp[4096] = "", path[4400];
    snprintf(what, sizeof what, "model '%s' version %lld", a.base, a.version);
    int64_t newv = a.new_version > 0 ? (int64_t)a.new_version : (int64_t)a.version + 1;
    eng_graph *g = NULL, *qg = NULL;
    eng_dataset *cal = NULL, *ev = NULL;
    eng_quant_plan plan = {0};
    eng_eval_preds pf = {0}, pq = {0};
    eng_eval_cmp cmp = {0};
    cJSON *metrics = NULL;
    char *mtxt = NULL, *eval_reason = NULL;
    uint8_t *sig = NULL;
    size_t siglen = 0;
    int staged = 0;
    struct stat sb;
    eng_status st = eng_bundle_path(src, sizeof src, a.base, a.version, NULL);
    if (st == ENG_STATUS_OK) {
        snprintf(path, sizeof path, "%s/" ENG_BUNDLE_MODEL_FILE, src);
        if (stat(path, &sb) != 0) st = eng_err(ENG_STATUS_NOT_FOUND, "%s does not exist (no %s)", what, path);
    }
    if (st == ENG_STATUS_OK) {
        if (eng_bundle_path(path, sizeof path, a.base, newv, NULL) == ENG_STATUS_OK && stat(path, &sb) == 0)
            st = eng_err(ENG_STATUS_IO, "model '%s' already has version %lld; quantize writes version N+1",
                         a.base, (long long)newv);
    }
    if (st == ENG_STATUS_OK) {
        snprintf(path, sizeof path, "%s/" ENG_BUNDLE_MODEL_FILE, src);
        st = eng_onnx_load_file(path, &g);
        if (st != ENG_STATUS_OK) st = eng_err_prefix(st, "%s: ", what);
    }
    if (st == ENG_STATUS_OK) st = eng_quant_select(g, what, &a.o, &plan);
    if (st == ENG_STATUS_OK) {
        st = eng_dataset_load(a.calib, a.ncalib, &cal);
        if (st != ENG_STATUS_OK) st = eng_err_prefix(st, "calibration data: ");
    }
    if (st == ENG_STATUS_OK) {
        st = eng_quant_calibrate(g, what, cal, &a.o, &plan);
        if (st != ENG_STATUS_OK) st = eng_err_prefix(st, "calibration data: ");
    }
    /* evaluation data: --eval, else the calibration data when it is labelled */
    const char *const *ef = a.neval ? a.eval : a.calib;
    int nef = a.neval ? a.neval : a.ncalib;
    if (st == ENG_STATUS_OK && a.neval) {
        st = eng_dataset_load(a.eval, a.neval, &ev);
        if (st != ENG_STATUS_OK) st = eng_err_prefix(st, "--eval data: ");
    } else if (st == ENG_STATUS_OK) {
        if (eng_dataset_find(cal, "label") >= 0) {
            ev = cal;
            cal = NULL;
        } else {
            eval_reason = "the calibration data has no 'label' column and no --eval data was given";
        }
    }
    if (st == ENG_STATUS_OK && ev) {
        st = eng_eval_model(src, what, ev, &(eng_eval_opts){.batch_size = a.bs, .nthreads = (int)a.threads}, &pf);
        if (st != ENG_STATUS_OK && a.neval) st = eng_err_prefix(st, "--eval data: ");
    }
    if (st == ENG_STATUS_OK) st = eng_quant_rewrite(g, &plan, &a.o, &qg);
    if (st == ENG_STATUS_OK) {
        snprintf(path, sizeof path, "%s/" ENG_BUNDLE_SIGNATURE_FILE, src);
        st = eng_file_read(path, (size_t)16 << 20, &sig, &siglen);
        if (st == ENG_STATUS_NOT_FOUND) {
            eng_err_clear();
            st = ENG_STATUS_OK;
        }
    }
    /* ---- write: stage, files, evaluate the staged model, publish ---- */
    if (st == ENG_STATUS_OK) {
        st = eng_bundle_stage(a.base, newv, tmp, sizeof tmp);
        staged = st == ENG_STATUS_OK;
    }
    if (st == ENG_STATUS_OK) {
        snprintf(path, sizeof path, "%s/" ENG_BUNDLE_MODEL_FILE, tmp);
        st = eng_onnx_save_file(qg, path, (size_t)1 << 30);
    }
    if (st == ENG_STATUS_OK && sig) st = qz_write(tmp, ENG_BUNDLE_SIGNATURE_FILE, sig, siglen);
    if (st == ENG_STATUS_OK && ev) {
        char qwhat[4200];
        snprintf(qwhat, sizeof qwhat, "model '%s' version %lld (quantized)", a.base, (long long)newv);
        st = eng_eval_model(tmp, qwhat, ev, &(eng_eval_opts){.batch_size = a.bs, .nthreads = (int)a.threads}, &pq);
        if (st == ENG_STATUS_OK) st = eng_eval_compare(&pq, &pf, &cmp);
    }
    if (st == ENG_STATUS_OK) {
        metrics = cJSON_CreateObject();
        cJSON_AddItemToObject(metrics, "quantization", qz_report(&a, g, &plan));
        if (ev) {
            cJSON_AddItemToObject(metrics, "evaluation", qz_eval_json(ef, nef, a.version, newv, &pf, &pq, &cmp));
        } else {
            cJSON_AddNullToObject(metrics, "evaluation");
            cJSON_AddStringToObject(metrics, "evaluation_skipped", eval_reason);
        }
        mtxt = cJSON_Print(metrics);
        st = mtxt ? qz_write(tmp, "metrics.json", mtxt, strlen(mtxt))
                  : eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory writing metrics.json");
    }
    if (st == ENG_STATUS_OK) st = eng_bundle_publish(a.base, newv, tmp);
    if (st != ENG_STATUS_OK) {
        fprintf(stderr, "error: %s\n", eng_last_error());
        if (staged) eng_file_remove_dir(tmp);
        rc = 1;
    } else {
        char *line = cJSON_PrintUnformatted(metrics);
        eng_bundle_path(path, sizeof path, a.base, newv, NULL);
        printf("%s\n%s\n", path, line ? line : "{}");
        free(line);
        fprintf(stderr, "%s: quantized %d node(s) (%s, %s), %d excluded -> version %lld\n", what, plan.nnodes,
                eng_quant_method_name(a.o.method), a.o.per_channel ? "per-channel" : "per-tensor", plan.nexcluded,
                (long long)newv);
        if (ev && pf.classification)
            fprintf(stderr, "  accuracy on %lld examples: fp32 %.2f%%, int8 %.2f%% (%+.2f points), agreement %.2f%%\n",
                    (long long)pf.n, 100 * pf.accuracy, 100 * pq.accuracy, 100 * cmp.accuracy_delta,
                    100 * cmp.agreement);
        else if (ev)
            fprintf(stderr, "  mse on %lld examples: fp32 %.6g, int8 %.6g\n", (long long)pf.n, pf.mse, pq.mse);
        rc = fflush(stdout) == 0 ? 0 : 1;
    }
    cJSON_Delete(metrics);
    free(mtxt);
    free(sig);
    eng_eval_preds_free(&pf);
    eng_eval_preds_free(&pq);
    eng_quant_plan_free(&plan);
    eng_graph_free(&g);
    eng_graph_free(&qg);
    eng_dataset_free(&cal);
    eng_dataset_free(&ev);
    for (int i = 0; i < a.nowned; i++) free(a.owned[i]);
    return rc;
}
