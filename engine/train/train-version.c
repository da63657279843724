/* train-version.c - writing the trained model as version N+1 of the bundle, atomically (see train.h).
 *
 * Everything is built in the directory engine/bundle.c stages, <base>/.tmp-<N+1>-<pid>/: model.onnx (the base
 * graph with the trained initializer values and BatchNorm running statistics), metrics.json (with
 * "preprocessing": what eng_dataset_fit did to each column), signature.json (the base's, if any, with the same
 * "preprocessing"; eng_bundle_sig_derive), and what the base version's signature and warm-up need that the
 * new version needs as well: the labels_file its signature.json names and assets.extra/warmup.jsonl (the same
 * inputs, so the same warm-up requests), copied byte for byte. Each file is written atomically; eng_bundle_publish then fsyncs them
 * and the directory, renames it to <base>/<N+1> without replacing anything and fsyncs the base. On any error
 * the temp directory and what it holds are removed, so readers see a complete version or none. JSON is
 * written with cJSON (NaN becomes null).
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../bundle.h"
#include "../ir/file-io.h"
#include "../ir/onnx.h"
#include "train-impl.h"

static cJSON *num(double v) { return cJSON_CreateNumber(isfinite(v) ? v : NAN); }

static const char *optim_name(eng_optim_kind k) {
    return k == ENG_OPTIM_SGD ? "sgd" : k == ENG_OPTIM_ADAM ? "adam" : k == ENG_OPTIM_ADAMW ? "adamw" : "?";
}

static const char *sched_name(eng_lr_schedule k) {
    return k == ENG_LR_CONSTANT ? "constant" : k == ENG_LR_STEP ? "step" : k == ENG_LR_COSINE ? "cosine" : "?";
}

char *trn_metrics_json(const trn_ctx *c) {
    const eng_train_opts *o = c->o;
    cJSON *root = cJSON_CreateObject();
    cJSON *ep = cJSON_AddArrayToObject(root, "epochs");
    for (int64_t i = 0; i < c->st.nepochs; i++) {
        const trn_epoch *e = &c->st.epochs[i];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddItemToObject(x, "epoch", cJSON_CreateNumber((double)e->epoch));
        cJSON_AddItemToObject(x, "loss", num(e->loss));
        cJSON_AddItemToObject(x, "accuracy", num(e->accuracy));
        cJSON_AddItemToObject(x, "val_loss", num(e->val_loss));
        cJSON_AddItemToObject(x, "val_accuracy", num(e->val_accuracy));
        cJSON_AddItemToObject(x, "learning_rate", num(e->lr));
        cJSON_AddItemToObject(x, "examples_per_sec", num(e->examples_per_sec));
        cJSON_AddItemToObject(x, "seconds", num(e->seconds));
        cJSON_AddItemToArray(ep, x);
    }
    cJSON *steps = cJSON_AddArrayToObject(root, "steps");
    for (int64_t i = 0; i < c->st.nsteps; i++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddItemToObject(x, "step", cJSON_CreateNumber((double)c->st.steps[i].step));
        cJSON_AddItemToObject(x, "loss", num(c->st.steps[i].loss));
        cJSON_AddItemToArray(steps, x);
    }
    cJSON *s = cJSON_AddObjectToObject(root, "settings");
    cJSON *df = cJSON_AddArrayToObject(s, "data");
    for (int i = 0; i < o->ndata; i++) cJSON_AddItemToArray(df, cJSON_CreateString(o->data_files[i]));
    cJSON *vf = cJSON_AddArrayToObject(s, "val_data");
    for (int i = 0; i < o->nval; i++) cJSON_AddItemToArray(vf, cJSON_CreateString(o->val_files[i]));
    cJSON_AddNumberToObject(s, "val_split", o->val_split);
    cJSON_AddNumberToObject(s, "epochs", o->epochs);
    cJSON_AddNumberToObject(s, "batch_size", (double)o->batch_size);
    cJSON_AddStringToObject(s, "optimizer", optim_name(o->optim.kind));
    cJSON_AddItemToObject(s, "learning_rate", num(o->optim.lr));
    cJSON_AddItemToObject(s, "momentum", num(o->optim.momentum));
    cJSON_AddBoolToObject(s, "nesterov", o->optim.nesterov);
    cJSON_AddItemToObject(s, "weight_decay", num(o->optim.weight_decay));
    cJSON_AddItemToObject(s, "clipnorm", num(o->optim.clipnorm));
    cJSON_AddNumberToObject(s, "accum_steps", o->optim.accum_steps);
    cJSON_AddStringToObject(s, "lr_schedule", sched_name(o->optim.schedule));
    cJSON_AddNumberToObject(s, "warmup_steps", (double)o->optim.warmup_steps);
    cJSON_AddNumberToObject(s, "step_size", (double)o->optim.step_size);
    cJSON_AddItemToObject(s, "gamma", num(o->optim.gamma));
    cJSON_AddStringToObject(s, "loss", eng_loss_name(o->loss));
    cJSON_AddNumberToObject(s, "from_logits", o->from_logits);
    cJSON *fz = cJSON_AddArrayToObject(s, "freeze");
    for (int i = 0; i < o->nfreeze; i++) cJSON_AddItemToArray(fz, cJSON_CreateString(o->freeze[i]));
    cJSON_AddNumberToObject(s, "replicas", c->R);
    cJSON_AddNumberToObject(s, "processes", c->W); /* ranks of a multi-process (MPI) job */
    cJSON_AddStringToObject(s, "precision", o->precision == ENG_PRECISION_BF16   ? "mixed_bf16"
                                            : o->precision == ENG_PRECISION_FP16 ? "mixed_fp16"
                                                                                 : "fp32");
    static const char *const lsm[] = {"none", "dynamic", "fixed"};
    cJSON_AddStringToObject(s, "loss_scale", lsm[c->ls.mode]);
    if (c->ls.mode != ENG_LOSS_SCALE_NONE) {
        cJSON *ls = cJSON_AddObjectToObject(root, "loss_scaling");
        cJSON_AddNumberToObject(ls, "final_scale", c->ls.scale);
        cJSON_AddNumberToObject(ls, "skipped_steps", (double)c->ls.skipped);
        cJSON_AddNumberToObject(ls, "growth_steps", (double)c->ls.growth_steps);
    }
    cJSON_AddNumberToObject(s, "seed", (double)o->seed);
    cJSON_AddNumberToObject(s, "early_stopping_patience", o->early_stopping_patience);
    cJSON_AddStringToObject(s, "monitor", o->monitor ? o->monitor : "val_loss");
    cJSON_AddBoolToObject(s, "keep_best", o->keep_best);
    cJSON_AddNumberToObject(s, "max_steps", (double)o->max_steps);
    cJSON_AddBoolToObject(s, "shuffle", !o->no_shuffle);
    cJSON_AddNumberToObject(s, "replace_head", (double)o->replace_head);
    cJSON_AddBoolToObject(s, "cache_frozen", !o->no_cache_frozen);
    cJSON_AddBoolToObject(s, "recompute", o->recompute);
    if (o->recompute) {
        cJSON *rc = cJSON_AddObjectToObject(root, "recompute");
        cJSON_AddNumberToObject(rc, "segments", c->recompute.segments);
        cJSON_AddNumberToObject(rc, "nodes", c->recompute.nodes);
    }
    if (c->reps && c->reps[0].s) { /* the training plan's activation memory (one replica, its last step's plan) */
        eng_plan_stats ps;
        eng_session_last_stats(c->reps[0].s, &ps);
        cJSON_AddNumberToObject(root, "activations_mib", (double)ps.arena_bytes / 1048576.0);
    }
    if (o->nfreeze > 0) { /* the frozen layers: computed once per example, or every step and why */
        cJSON *fz = cJSON_AddObjectToObject(root, "frozen_features");
        cJSON_AddBoolToObject(fz, "cached", c->frozen.cached);
        if (c->frozen.cached) {
            cJSON_AddNumberToObject(fz, "tensors", c->frozen.tensors);
            cJSON_AddNumberToObject(fz, "mib", c->frozen.bytes / 1048576.0);
            cJSON_AddNumberToObject(fz, "examples", (double)c->train->n);
            cJSON_AddNumberToObject(fz, "seconds", c->frozen.seconds);
        } else {
            cJSON_AddStringToObject(fz, "reason", c->frozen.why);
        }
    }
    cJSON_AddNumberToObject(s, "trainable_params", c->ntrain);
    cJSON *pre = cJSON_Parse(c->preprocessing);
    cJSON_AddItemToObject(root, "preprocessing", pre ? pre : cJSON_CreateString(c->preprocessing));
    cJSON_AddNumberToObject(root, "base_version", (double)c->base_version);
    cJSON_AddNumberToObject(root, "steps_run", (double)c->st.global_step);
    if (c->st.best_epoch > 0) cJSON_AddNumberToObject(root, "best_epoch", (double)c->st.best_epoch);
    struct rusage ru; /* the process's peak resident memory so far: weights, optimizer state, plans, data */
    if (getrusage(RUSAGE_SELF, &ru) == 0) cJSON_AddNumberToObject(root, "peak_rss_mib", (double)ru.ru_maxrss / 1024.0);
    char *txt = cJSON_Print(root);
    cJSON_Delete(root);
    return txt;
}

static eng_status write_text(const char *dir, const char *name, const char *txt) {
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return trn_write_file(p, txt, strlen(txt));
}

#define TRN_EXTRA_DIR "assets.extra"
#define TRN_WARMUP_FILE TRN_EXTRA_DIR "/warmup.jsonl"
#define TRN_COPY_LIMIT ((size_t)256 << 20)

/* Copy <from>/<rel> to <to>/<rel> if it exists (a regular file inside <from>: eng_file_open_regular). */
static eng_status trn_copy_extra(const char *from, const char *to, const char *rel) {
    char src[4400], dst[4400];
    snprintf(src, sizeof src, "%s/%s", from, rel);
    snprintf(dst, sizeof dst, "%s/%s", to, rel);
    int fd;
    uint64_t size;
    eng_status st = eng_file_open_regular(src, from, &fd, &size);
    if (st == ENG_STATUS_NOT_FOUND) {
        eng_err_clear();
        return ENG_STATUS_OK;
    }
    if (st != ENG_STATUS_OK) return st;
    close(fd);
    uint8_t *buf = NULL;
    size_t n = 0;
    ENG_TRY(eng_file_read(src, TRN_COPY_LIMIT, &buf, &n));
    const char *slash = strchr(rel, '/');
    if (slash) { /* one directory level: assets.extra/ */
        char d[4400];
        snprintf(d, sizeof d, "%s/%.*s", to, (int)(slash - rel), rel);
        if (mkdir(d, 0755) != 0 && errno != EEXIST) {
            free(buf);
            return eng_err(ENG_STATUS_IO, "cannot create '%s': %s", d, strerror(errno));
        }
    }
    st = trn_write_file(dst, buf, n);
    free(buf);
    if (st == ENG_STATUS_OK && slash) {
        char d[4400];
        snprintf(d, sizeof d, "%s/%.*s", to, (int)(slash - rel), rel);
        st = eng_file_sync(d);
    }
    return st;
}

/* The labels_file the base version's signature.json names (a plain file name, as the server requires), or
 * "" when there is none. */
static eng_status trn_labels_file(const char *vdir, char *out, size_t cap) {
    out[0] = 0;
    char p[4400];
    snprintf(p, sizeof p, "%s/" ENG_BUNDLE_SIGNATURE_FILE, vdir);
    uint8_t *buf = NULL;
    size_t n = 0;
    eng_status st = eng_file_read(p, (size_t)16 << 20, &buf, &n);
    if (st == ENG_STATUS_NOT_FOUND) {
        eng_err_clear();
        return ENG_STATUS_OK;
    }
    if (st != ENG_STATUS_OK) return st;
    cJSON *root = cJSON_ParseWithLength((const char *)buf, n);
    free(buf);
    const cJSON *lf = root ? cJSON_GetObjectItemCaseSensitive(root, "labels_file") : NULL;
    if (cJSON_IsString(lf) && lf->valuestring[0] && !strchr(lf->valuestring, '/') && strcmp(lf->valuestring, ".") &&
        strcmp(lf->valuestring, "..") && strlen(lf->valuestring) < cap)
        snprintf(out, cap, "%s", lf->valuestring);
    cJSON_Delete(root);
    return ENG_STATUS_OK;
}

/* Remove what trn_copy_extra put below tmp (eng_file_remove_dir removes one flat directory). */
static void trn_remove_extras(const char *tmp) {
    char p[4400];
    snprintf(p, sizeof p, "%s/" TRN_WARMUP_FILE, tmp);
    unlink(p);
    snprintf(p, sizeof p, "%s/" TRN_EXTRA_DIR, tmp);
    rmdir(p);
}

eng_status trn_write_version(trn_ctx *c, eng_train_result *res) {
    char tmp[4300], dst[4300], p[4400];
    ENG_TRY(eng_bundle_path(dst, sizeof dst, c->base, c->new_version, NULL));
    ENG_TRY(eng_bundle_stage(c->base, c->new_version, tmp, sizeof tmp));
    eng_status st = ENG_STATUS_OK;
    /* the base graph with the trained values */
    eng_graph *g = eng_graph_clone(c->g0);
    if (!g) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; i < c->nparams && st == ENG_STATUS_OK; i++) {
        const trn_param *tp = &c->params[i];
        int v = eng_graph_find_value(g, tp->name);
        if (v < 0 || !g->values[v].init || g->values[v].init->dtype != ENG_DTYPE_F32 ||
            eng_tensor_numel(g->values[v].init) != tp->n) {
            st = eng_err(ENG_STATUS_INTERNAL, "initializer '%s' changed shape", tp->name);
            break;
        }
        const float *src = c->o->keep_best && tp->best && c->st.best_epoch > 0 ? tp->best : tp->w;
        memcpy(g->values[v].init->data, src, (size_t)tp->n * sizeof(float));
    }
    if (st == ENG_STATUS_OK) {
        snprintf(p, sizeof p, "%s/" ENG_BUNDLE_MODEL_FILE, tmp);
        st = eng_onnx_save_file(g, p, (size_t)1 << 30);
    }
    eng_graph_free(&g);
    if (st == ENG_STATUS_OK) {
        char *m = trn_metrics_json(c);
        st = m ? write_text(tmp, "metrics.json", m) : eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
        free(m);
    }
    if (st == ENG_STATUS_OK) {
        char *s = NULL;
        st = eng_bundle_sig_derive(c->base, c->base_version, c->preprocessing, &s);
        if (st == ENG_STATUS_OK) st = write_text(tmp, ENG_BUNDLE_SIGNATURE_FILE, s);
        free(s);
    }
    if (st == ENG_STATUS_OK) { /* the base version's labels and warm-up requests serve the new one too */
        char from[4300], labels[256];
        st = eng_bundle_path(from, sizeof from, c->base, c->base_version, NULL);
        if (st == ENG_STATUS_OK) st = trn_labels_file(from, labels, sizeof labels);
        if (st == ENG_STATUS_OK && labels[0]) st = trn_copy_extra(from, tmp, labels);
        if (st == ENG_STATUS_OK) st = trn_copy_extra(from, tmp, TRN_WARMUP_FILE);
    }
    if (st == ENG_STATUS_OK) st = eng_bundle_publish(c->base, c->new_version, tmp);
    if (st != ENG_STATUS_OK) {
        trn_remove_extras(tmp);
        eng_file_remove_dir(tmp); /* a no-op once renamed (only the base's fsync failed) */
        return eng_err_prefix(st, "writing version %lld: ", (long long)c->new_version);
    }
    res->version = c->new_version;
    if (snprintf(res->path, sizeof res->path, "%s", dst) >= (int)sizeof res->path) res->path[sizeof res->path - 1] = 0;
    return ENG_STATUS_OK;
}
