/* jobs-submit.c - a training job's submission checked up front (jobs.h): every field's type and range, the model and
 * its base version, the datasets and their columns against the model's inputs; the worker's job file; the API's view
 * of a job. Refusals are INVALID_ARGUMENT (400) naming the field, NOT_FOUND (404) for an unknown model or dataset.
 */
#define _GNU_SOURCE
#include "jobs-impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/bundle.h"
#include "engine/ir/tensor.h"
#include "engine/train/loss-scale.h"
#include "kernels/kernel.h"

static const char *const job_keys[] = {
    "model", "base_version", "dataset", "val_dataset", "val_split", "epochs", "batch_size", "optimizer",
    "learning_rate", "momentum", "nesterov", "weight_decay", "clipnorm", "schedule", "loss", "from_logits", "freeze",
    "early_stopping", "devices", "precision", "threads", "seed", "on_complete", "checkpoint_every", "max_steps", "kind",
    "loss_scale", "loss_scale_growth_steps", "shuffle", "cache_frozen", "recompute", "bucket_mb", NULL};
/* A quantize job ("kind": "quantize": tensord quantize as the worker) takes these. */
static const char *const quant_keys[] = {"kind", "model", "base_version", "dataset", "val_dataset", "method",
                                         "per_channel", "exclude", "threads", "on_complete", NULL};
static const char *const qmethods[] = {"minmax", "percentile", "entropy", NULL};
static const char *const optimizers[] = {"sgd", "adam", "adamw", NULL};
static const char *const losses[] = {"sparse_categorical_crossentropy", "categorical_crossentropy",
                                     "binary_crossentropy", "mse", "cosine_similarity", NULL};
static const char *const monitors[] = {"val_loss", "val_accuracy", "loss", "accuracy", NULL};
static const char *const schedules[] = {"constant", "step", "cosine", NULL};

static int in_set(const char *s, const char *const *set) {
    for (int i = 0; s && set[i]; i++)
        if (!strcmp(s, set[i])) return 1;
    return 0;
}

static void set_list(const char *const *set, char *buf, size_t cap) {
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; set[i] && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, "%s%s", i ? ", " : "", set[i]);
}

cJSON *job_parse(const char *text) { return text ? cJSON_Parse(text) : NULL; }


/* A number field in [lo, hi] (integral when integer); absent: *v unchanged, 0. -1 with err when bad. */
static int num_field(const cJSON *o, const char *key, double lo, double hi, int integer, double *v, srv_error *err) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!f) return 0;
    if (!cJSON_IsNumber(f) || !isfinite(f->valuedouble) || f->valuedouble < lo || f->valuedouble > hi ||
        (integer && f->valuedouble != floor(f->valuedouble))) {
        srv_err(err, SRV_INVALID_ARGUMENT, "\"%s\" must be %s in [%g, %g]", key, integer ? "an integer" : "a number", lo,
                hi);
        return -1;
    }
    *v = f->valuedouble;
    return 1;
}

/* A string field from set (set NULL: a valid name); absent: 0. */
static int str_field(const cJSON *o, const char *key, const char *const *set, const char **v, srv_error *err) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!f) return 0;
    if (!cJSON_IsString(f) || (set ? !in_set(f->valuestring, set) : !srv_name_valid(f->valuestring))) {
        char list[256];
        if (set) set_list(set, list, sizeof list);
        srv_err(err, SRV_INVALID_ARGUMENT, set ? "\"%s\" must be one of: %s" : "\"%s\" must be a name (%s)", key,
                set ? list : "[A-Za-z0-9_.-], at most 255 bytes, not . or ..");
        return -1;
    }
    *v = f->valuestring;
    return 1;
}

static int only_keys(const cJSON *o, const char *const *keys, const char *what, srv_error *err) {
    for (const cJSON *k = o->child; k; k = k->next)
        if (!in_set(k->string, keys)) {
            char list[1024];
            set_list(keys, list, sizeof list);
            srv_err(err, SRV_INVALID_ARGUMENT, "%s has no field \"%.100s\" (fields: %s)", what, k->string, list);
            return -1;
        }
    return 0;
}

static int64_t numel_of(const cJSON *shape, int *free_dims) {
    int64_t n = 1;
    const cJSON *d;
    cJSON_ArrayForEach(d, shape) {
        if (!cJSON_IsNumber(d) || d->valuedouble < 0) (*free_dims)++;
        else n *= (int64_t)d->valuedouble;
    }
    return n;
}

static void shape_text(const cJSON *shape, char *buf, size_t cap) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    int i = 0;
    const cJSON *d;
    cJSON_ArrayForEach(d, shape) {
        if (k < cap) k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i++ ? "," : "", (long long)d->valuedouble);
    }
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

/* The dataset's columns fit the model's inputs the way training maps them (engine/train/train.c): a column named
 * after each input, or "x" for a model of one input, with as many values per example; and a "label" column. */
static srv_code check_columns(const adm_model_info *mi, const char *model, const char *ds, const char *columns_json,
                              int need_label, srv_error *err) {
    cJSON *cols = job_parse(columns_json);
    srv_code rc = SRV_OK;
    if (!cJSON_IsArray(cols)) {
        cJSON_Delete(cols);
        return srv_err(err, SRV_INTERNAL, "dataset '%s': its recorded columns cannot be read", ds);
    }
    char names[512] = "";
    size_t k = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cols) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(c, "name");
        if (cJSON_IsString(n) && k < sizeof names) k += (size_t)snprintf(names + k, sizeof names - k, "%s'%s'", k ? ", " : "", n->valuestring);
    }
    for (int i = 0; rc == SRV_OK && i < mi->ninputs; i++) {
        const adm_io *in = &mi->inputs[i];
        const cJSON *col = NULL, *x = NULL;
        cJSON_ArrayForEach(c, cols) {
            const cJSON *n = cJSON_GetObjectItemCaseSensitive(c, "name");
            if (!cJSON_IsString(n)) continue;
            if (!strcmp(n->valuestring, in->name)) col = c;
            if (!strcmp(n->valuestring, "x")) x = c;
        }
        if (!col && mi->ninputs == 1) col = x;
        if (!col) {
            rc = srv_err(err, SRV_INVALID_ARGUMENT, "dataset '%s' has no column for model '%s' version %lld input '%s' "
                         "(a column named '%s'%s); its columns: %s", ds, model, (long long)mi->version, in->name,
                         in->name, mi->ninputs == 1 ? " or 'x'" : "", names);
            break;
        }
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(col, "shape");
        int free_col = 0, free_in = 0;
        int64_t nc = numel_of(shape, &free_col), ni = 1;
        for (int d = 1; d < in->ndim; d++) {
            if (in->dims[d] < 0) free_in++;
            else ni *= in->dims[d];
        }
        if (in->ndim >= 1 && !free_in && !free_col && nc != ni) {
            char cs[128], is[128];
            shape_text(shape, cs, sizeof cs);
            size_t q = (size_t)snprintf(is, sizeof is, "[");
            for (int d = 1; d < in->ndim && q < sizeof is; d++)
                q += (size_t)snprintf(is + q, sizeof is - q, "%s%lld", d > 1 ? "," : "", (long long)in->dims[d]);
            if (q < sizeof is) snprintf(is + q, sizeof is - q, "]");
            const cJSON *cn = cJSON_GetObjectItemCaseSensitive(col, "name");
            rc = srv_err(err, SRV_INVALID_ARGUMENT, "dataset '%s' column '%s' has shape %s (%lld values) per example; "
                         "model '%s' version %lld input '%s' takes %s (%lld values) per example", ds,
                         cJSON_IsString(cn) ? cn->valuestring : "?", cs, (long long)nc, model, (long long)mi->version,
                         in->name, is, (long long)ni);
        }
    }
    int has_label = 0;
    cJSON_ArrayForEach(c, cols) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(c, "name");
        has_label |= cJSON_IsString(n) && !strcmp(n->valuestring, "label");
    }
    if (rc == SRV_OK && need_label && !has_label)
        rc = srv_err(err, SRV_INVALID_ARGUMENT, "dataset '%s' has no 'label' column to train against; its columns: %s", ds,
                     names);
    cJSON_Delete(cols);
    return rc;
}

static srv_code check_on_complete(const cJSON *oc, int has_val, srv_error *err) {
    static const char *const keys[] = {"action", "traffic_percent", "label", "min_val_accuracy", "max_val_loss", NULL};
    static const char *const actions[] = {"none", "promote", "canary", NULL};
    if (!cJSON_IsObject(oc)) return srv_err(err, SRV_INVALID_ARGUMENT, "\"on_complete\" must be an object");
    if (only_keys(oc, keys, "\"on_complete\"", err)) return err->code;
    const char *action = "none", *label = "canary";
    double pct = 10, x = 0;
    if (str_field(oc, "action", actions, &action, err) < 0 || str_field(oc, "label", NULL, &label, err) < 0 ||
        num_field(oc, "traffic_percent", 1, 99, 1, &pct, err) < 0 || num_field(oc, "min_val_accuracy", 0, 1, 0, &x, err) < 0 ||
        num_field(oc, "max_val_loss", 0, 1e30, 0, &x, err) < 0)
        return srv_err(err, SRV_INVALID_ARGUMENT, "on_complete: %s", err->msg);
    if (!strcmp(label, "stable"))
        return srv_err(err, SRV_INVALID_ARGUMENT, "on_complete: \"label\" cannot be 'stable' (the version serving now)");
    if ((cJSON_GetObjectItemCaseSensitive(oc, "min_val_accuracy") || cJSON_GetObjectItemCaseSensitive(oc, "max_val_loss")) &&
        !has_val)
        return srv_err(err, SRV_INVALID_ARGUMENT, "on_complete: the min_val_accuracy / max_val_loss gates need a validation "
                       "set (\"val_dataset\" or \"val_split\")");
    return SRV_OK;
}

srv_code job_check(adm_jobs *j, const cJSON *b, adm_job_rec *rec, srv_error *err) {
    memset(rec, 0, sizeof *rec);
    if (!cJSON_IsObject(b)) return srv_err(err, SRV_INVALID_ARGUMENT, "the job must be a JSON object");
    static const char *const kinds[] = {"train", "quantize", NULL};
    const char *kind = "train";
    if (str_field(b, "kind", kinds, &kind, err) < 0) return err->code;
    int quant = !strcmp(kind, "quantize");
    if (only_keys(b, quant ? quant_keys : job_keys, quant ? "a quantize job" : "a training job", err)) return err->code;
    const char *model = NULL, *ds = NULL, *vds = NULL, *s = NULL;
    double v = 0;
    if (str_field(b, "model", NULL, &model, err) < 0 || !model)
        return model ? err->code : srv_err(err, SRV_INVALID_ARGUMENT, "\"model\" is required (a served model's name)");
    if (str_field(b, "dataset", NULL, &ds, err) < 0 || !ds)
        return ds ? err->code : srv_err(err, SRV_INVALID_ARGUMENT, "\"dataset\" is required (an uploaded dataset's id)");
    if (str_field(b, "val_dataset", NULL, &vds, err) < 0) return err->code;
    /* numbers */
    static const struct { const char *key; double lo, hi; int integer, required; } nums[] = {
        {"epochs", 1, 10000, 1, 1}, {"batch_size", 1, 65536, 1, 1}, {"learning_rate", 1e-12, 10, 0, 1},
        {"val_split", 0, 0.99, 0, 0}, {"momentum", 0, 0.9999, 0, 0}, {"weight_decay", 0, 10, 0, 0},
        {"clipnorm", 1e-12, 1e12, 0, 0}, {"threads", 0, 1024, 1, 0}, {"seed", 0, 9007199254740991.0, 1, 0},
        {"checkpoint_every", 0, 1e12, 1, 0}, {"max_steps", 0, 1e15, 1, 0}, {"bucket_mb", 0, 1e6, 0, 0}};
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        int r = num_field(b, nums[i].key, nums[i].lo, nums[i].hi, nums[i].integer, &v, err);
        if (r < 0) return err->code;
        if (r == 0 && nums[i].required && !quant)
            return srv_err(err, SRV_INVALID_ARGUMENT, "\"%s\" is required", nums[i].key);
    }
    char list[256];
    if (quant) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(b, "per_channel"), *e;
        if (str_field(b, "method", qmethods, &s, err) < 0) return err->code;
        if (f && !cJSON_IsBool(f)) return srv_err(err, SRV_INVALID_ARGUMENT, "\"per_channel\" must be true or false");
        if ((f = cJSON_GetObjectItemCaseSensitive(b, "exclude"))) {
            if (!cJSON_IsArray(f)) return srv_err(err, SRV_INVALID_ARGUMENT, "\"exclude\" must be a list of node names");
            cJSON_ArrayForEach(e, f) if (!cJSON_IsString(e) || !*e->valuestring || strlen(e->valuestring) > 255 ||
                                         e->valuestring[0] == '-')
                return srv_err(err, SRV_INVALID_ARGUMENT, "\"exclude\" must be a list of node names");
        }
        goto model_and_data;
    }
    if (str_field(b, "optimizer", optimizers, &s, err) <= 0) {
        set_list(optimizers, list, sizeof list);
        return s ? err->code : srv_err(err, SRV_INVALID_ARGUMENT, "\"optimizer\" is required: one of %s", list);
    }
    s = NULL;
    if (str_field(b, "loss", losses, &s, err) <= 0) {
        set_list(losses, list, sizeof list);
        return s ? err->code : srv_err(err, SRV_INVALID_ARGUMENT, "\"loss\" is required: one of %s", list);
    }
    const cJSON *f;
    if ((f = cJSON_GetObjectItemCaseSensitive(b, "nesterov")) && !cJSON_IsBool(f))
        return srv_err(err, SRV_INVALID_ARGUMENT, "\"nesterov\" must be true or false");
    if ((f = cJSON_GetObjectItemCaseSensitive(b, "from_logits")) && !cJSON_IsBool(f))
        return srv_err(err, SRV_INVALID_ARGUMENT, "\"from_logits\" must be true or false");
    if ((f = cJSON_GetObjectItemCaseSensitive(b, "shuffle")) && !cJSON_IsBool(f))
        return srv_err(err, SRV_INVALID_ARGUMENT, "\"shuffle\" must be true or false");
    if ((f = cJSON_GetObjectItemCaseSensitive(b, "cache_frozen")) && !cJSON_IsBool(f))
        return srv_err(err, SRV_INVALID_ARGUMENT, "\"cache_frozen\" must be true or false");
    if ((f = cJSON_GetObjectItemCaseSensitive(b, "recompute")) && !cJSON_IsBool(f))
        return srv_err(err, SRV_INVALID_ARGUMENT, "\"recompute\" must be true or false");
    if ((f = cJSON_GetObjectItemCaseSensitive(b, "freeze"))) {
        const cJSON *e;
        if (!cJSON_IsArray(f)) return srv_err(err, SRV_INVALID_ARGUMENT, "\"freeze\" must be a list of name prefixes");
        cJSON_ArrayForEach(e, f) if (!cJSON_IsString(e) || !*e->valuestring || strlen(e->valuestring) > 255)
            return srv_err(err, SRV_INVALID_ARGUMENT, "\"freeze\" must be a list of name prefixes (strings)");
    }
    if ((f = cJSON_GetObjectItemCaseSensitive(b, "schedule"))) {
        static const char *const keys[] = {"kind", "warmup_steps", "step_size", "gamma", "decay_steps", "min_lr", NULL};
        const char *kind = NULL;
        if (!cJSON_IsObject(f) || only_keys(f, keys, "\"schedule\"", err) || str_field(f, "kind", schedules, &kind, err) <= 0 ||
            num_field(f, "warmup_steps", 0, 1e12, 1, &v, err) < 0 || num_field(f, "step_size", 1, 1e12, 1, &v, err) < 0 ||
            num_field(f, "gamma", 0, 1, 0, &v, err) < 0 || num_field(f, "decay_steps", 1, 1e12, 1, &v, err) < 0 ||
            num_field(f, "min_lr", 0, 10, 0, &v, err) < 0) {
            set_list(schedules, list, sizeof list);
            if (!err->msg[0]) srv_err(err, SRV_INVALID_ARGUMENT, "\"kind\" must be one of: %s", list);
            return srv_err(err, SRV_INVALID_ARGUMENT, "\"schedule\": %s", err->msg);
        }
    }
    if ((f = cJSON_GetObjectItemCaseSensitive(b, "early_stopping"))) {
        static const char *const keys[] = {"patience", "monitor", NULL};
        const char *mon = NULL;
        if (!cJSON_IsObject(f) || only_keys(f, keys, "\"early_stopping\"", err) ||
            num_field(f, "patience", 1, 1e6, 1, &v, err) <= 0 || str_field(f, "monitor", monitors, &mon, err) < 0)
            return srv_err(err, SRV_INVALID_ARGUMENT, "\"early_stopping\" takes {\"patience\": n >= 1, \"monitor\": "
                           "val_loss|val_accuracy|loss|accuracy}");
    }
    const krn_backend *pb = NULL; /* the first device's backend: the one the precision must run on */
    if ((f = cJSON_GetObjectItemCaseSensitive(b, "devices"))) {
        const cJSON *e;
        if (!cJSON_IsArray(f) || cJSON_GetArraySize(f) == 0)
            return srv_err(err, SRV_INVALID_ARGUMENT, "\"devices\" must be a list such as [\"cpu\"]");
        if (cJSON_GetArraySize(f) > 64) return srv_err(err, SRV_INVALID_ARGUMENT, "\"devices\" lists more than 64");
        cJSON_ArrayForEach(e, f) {
            if (!cJSON_IsString(e)) return srv_err(err, SRV_INVALID_ARGUMENT, "\"devices\" must be a list of strings");
            const krn_backend *kb;
            /* refused now, with the reason, not by the worker later: a device this machine does not have */
            if (krn_backend_by_name(e->valuestring, &kb, NULL) != ENG_STATUS_OK)
                return srv_err(err, SRV_INVALID_ARGUMENT, "\"devices\": %s", eng_last_error());
            if (!pb) pb = kb;
        }
    }
    if ((f = cJSON_GetObjectItemCaseSensitive(b, "precision"))) {
        if (!cJSON_IsString(f))
            return srv_err(err, SRV_INVALID_ARGUMENT, "\"precision\" must be \"fp32\", \"mixed_bf16\" or \"mixed_fp16\"");
        int bf = !strcmp(f->valuestring, "mixed_bf16"), hf = !strcmp(f->valuestring, "mixed_fp16");
        if (!bf && !hf && strcmp(f->valuestring, "fp32") != 0)
            return srv_err(err, SRV_INVALID_ARGUMENT, "precision '%.40s' is unknown: fp32, mixed_bf16 or mixed_fp16",
                           f->valuestring);
        /* refused now, not by the worker later, where this machine cannot run it fast */
        if ((bf || hf) && krn_backend_precision_check(pb, bf ? ENG_DTYPE_BF16 : ENG_DTYPE_F16) != ENG_STATUS_OK)
            return srv_err(err, SRV_INVALID_ARGUMENT, "precision '%s': %s", f->valuestring, eng_last_error());
    }
    if ((f = cJSON_GetObjectItemCaseSensitive(b, "loss_scale"))) {
        char num[64];
        const char *t = cJSON_IsString(f) ? f->valuestring : NULL;
        if (cJSON_IsNumber(f)) snprintf(num, sizeof num, "%.17g", f->valuedouble), t = num;
        eng_loss_scale_mode m;
        double x;
        if (!t || eng_loss_scale_parse(t, &m, &x))
            return srv_err(err, SRV_INVALID_ARGUMENT, "\"loss_scale\" must be \"none\", \"dynamic\" or a positive "
                           "float32 scale");
    }
    if ((f = cJSON_GetObjectItemCaseSensitive(b, "loss_scale_growth_steps")) &&
        (!cJSON_IsNumber(f) || f->valuedouble < 1 || f->valuedouble != floor(f->valuedouble) || f->valuedouble > 1e15))
        return srv_err(err, SRV_INVALID_ARGUMENT, "\"loss_scale_growth_steps\" must be an integer >= 1");
model_and_data:;
    double vsplit = 0;
    num_field(b, "val_split", 0, 0.99, 0, &vsplit, err);
    if (vds && vsplit > 0)
        return srv_err(err, SRV_INVALID_ARGUMENT, "give \"val_dataset\" or \"val_split\", not both");
    const cJSON *oc = cJSON_GetObjectItemCaseSensitive(b, "on_complete");
    if (oc && check_on_complete(oc, vds || vsplit > 0, err) != SRV_OK) return err->code;
    /* the model and its base version */
    const cJSON *bv = cJSON_GetObjectItemCaseSensitive(b, "base_version");
    char vbuf[300] = "latest";
    if (bv && cJSON_IsNumber(bv) && bv->valuedouble >= 1 && bv->valuedouble == floor(bv->valuedouble) && bv->valuedouble < 1e15)
        snprintf(vbuf, sizeof vbuf, "%lld", (long long)bv->valuedouble);
    else if (bv && cJSON_IsString(bv) && (srv_name_valid(bv->valuestring)))
        snprintf(vbuf, sizeof vbuf, "%s", bv->valuestring);
    else if (bv)
        return srv_err(err, SRV_INVALID_ARGUMENT, "\"base_version\" must be a version number, \"latest\" or a label");
    adm_model_info *mi = calloc(1, sizeof *mi);
    if (!mi) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    srv_code rc = j->o.ops.model_info(j->o.ops.ctx, model, vbuf, mi, err);
    if (rc != SRV_OK) rc = srv_err(err, rc, "job: %s", err->msg);
    adm_dataset_files df = {0}, vf = {0};
    if (rc == SRV_OK) rc = adm_datasets_files(j->o.datasets, ds, &df, err);
    if (rc == SRV_OK && vds) rc = adm_datasets_files(j->o.datasets, vds, &vf, err);
    if (rc == SRV_OK) rc = check_columns(mi, model, ds, df.columns_json, !quant, err);
    if (rc == SRV_OK && vds) rc = check_columns(mi, model, vds, vf.columns_json, 1, err);
    int64_t maxv = 0;
    if (rc == SRV_OK) rc = adm_state_job_max_version(j->o.state, model, &maxv, err);
    if (rc == SRV_OK) {
        /* the version to write: above every version on disk (eng_bundle's scan happens in the worker too, which
         * refuses an existing one) and above every version an earlier job of this model had */
        int64_t disk = 0;
        if (eng_bundle_latest(mi->base_path, &disk) != ENG_STATUS_OK || disk < mi->version) disk = mi->version;
        rec->model = strdup(model);
        rec->dataset = strdup(ds);
        rec->val_dataset = vds ? strdup(vds) : NULL;
        rec->state = strdup("QUEUED");
        rec->base_version = mi->version;
        rec->new_version = (disk > maxv ? disk : maxv) + 1;
        rec->spec_json = cJSON_PrintUnformatted(b);
        if (!rec->model || !rec->dataset || (vds && !rec->val_dataset) || !rec->state || !rec->spec_json)
            rc = srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    }
    adm_dataset_files_free(&df);
    adm_dataset_files_free(&vf);
    free(mi);
    if (rc != SRV_OK) adm_job_rec_free(rec);
    return rc;
}

static void copy_item(cJSON *dst, const cJSON *src, const char *key) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(src, key);
    if (f) cJSON_AddItemToObject(dst, key, cJSON_Duplicate(f, 1));
}

static cJSON *files_array(const adm_dataset_files *f) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < f->nfiles; i++) cJSON_AddItemToArray(a, cJSON_CreateString(f->files[i]));
    return a;
}

char *job_worker_file(adm_jobs *j, const adm_job_rec *r, int resume, srv_error *err) {
    cJSON *spec = job_parse(r->spec_json), *w = cJSON_CreateObject();
    adm_model_info *mi = calloc(1, sizeof *mi);
    adm_dataset_files df = {0}, vf = {0};
    char *out = NULL, vb[32];
    snprintf(vb, sizeof vb, "%lld", (long long)r->base_version);
    srv_code rc = !spec || !w || !mi ? srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory") : SRV_OK;
    if (rc == SRV_OK) rc = j->o.ops.model_info(j->o.ops.ctx, r->model, vb, mi, err);
    if (rc == SRV_OK) rc = adm_datasets_files(j->o.datasets, r->dataset, &df, err);
    if (rc == SRV_OK && r->val_dataset) rc = adm_datasets_files(j->o.datasets, r->val_dataset, &vf, err);
    if (rc == SRV_OK) {
        cJSON_AddNumberToObject(w, "job_id", (double)r->id);
        cJSON_AddStringToObject(w, "model_base_path", mi->base_path);
        cJSON_AddNumberToObject(w, "base_version", (double)r->base_version);
        cJSON_AddNumberToObject(w, "new_version", (double)r->new_version);
        cJSON_AddItemToObject(w, "data_files", files_array(&df));
        if (r->val_dataset) cJSON_AddItemToObject(w, "val_files", files_array(&vf));
        static const char *const pass[] = {"val_split", "epochs", "batch_size", "optimizer", "learning_rate", "momentum",
                                           "nesterov", "weight_decay", "clipnorm", "schedule", "loss", "from_logits",
                                           "freeze", "early_stopping", "threads", "seed", "max_steps", "shuffle",
                                           "cache_frozen", "recompute", "loss_scale", "loss_scale_growth_steps", "bucket_mb", NULL};
        for (int i = 0; pass[i]; i++) copy_item(w, spec, pass[i]);
        const cJSON *pr = cJSON_GetObjectItemCaseSensitive(spec, "precision");
        cJSON_AddStringToObject(w, "precision", cJSON_IsString(pr) ? pr->valuestring : "fp32");
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(spec, "devices");
        if (cJSON_IsArray(want)) {
            cJSON_AddItemToObject(w, "devices", cJSON_Duplicate(want, 1));
        } else {
            cJSON *dev = cJSON_AddArrayToObject(w, "devices");
            cJSON_AddItemToArray(dev, cJSON_CreateString("cpu"));
        }
        cJSON_AddBoolToObject(w, "resume", resume);
        const cJSON *ce = cJSON_GetObjectItemCaseSensitive(spec, "checkpoint_every");
        double every = 0;
        if (cJSON_IsNumber(ce)) {
            every = ce->valuedouble;
        } else { /* about ten checkpoints an epoch, so a restart loses little */
            const cJSON *bs = cJSON_GetObjectItemCaseSensitive(spec, "batch_size"), *vs = cJSON_GetObjectItemCaseSensitive(spec, "val_split");
            double n = (double)df.records * (1.0 - (cJSON_IsNumber(vs) ? vs->valuedouble : 0.0));
            double steps = cJSON_IsNumber(bs) && bs->valuedouble > 0 ? ceil(n / bs->valuedouble) : 100;
            every = fmax(1, floor(steps / 10));
        }
        cJSON_AddNumberToObject(w, "checkpoint_every", every);
        if (!(out = cJSON_PrintUnformatted(w))) rc = srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    }
    adm_dataset_files_free(&df);
    adm_dataset_files_free(&vf);
    free(mi);
    cJSON_Delete(spec);
    cJSON_Delete(w);
    return rc == SRV_OK ? out : NULL;
}

static int argv_add(char ***v, int *n, const char *s) {
    char **g = realloc(*v, (size_t)(*n + 2) * sizeof *g);
    if (!g) return -1;
    *v = g;
    if (!(g[*n] = strdup(s))) return -1;
    g[++*n] = NULL;
    return 0;
}

void job_argv_free(char **argv) {
    for (int i = 0; argv && argv[i]; i++) free(argv[i]);
    free(argv);
}

static int argv_files(char ***v, int *n, const char *flag, const adm_dataset_files *f) {
    size_t len = 1;
    for (int i = 0; i < f->nfiles; i++) len += strlen(f->files[i]) + 1;
    char *joined = calloc(1, len);
    if (!joined) return -1;
    for (int i = 0; i < f->nfiles; i++) {
        if (i) strcat(joined, ",");
        strcat(joined, f->files[i]);
    }
    int rc = argv_add(v, n, flag) || argv_add(v, n, joined);
    free(joined);
    return rc;
}

char **job_quantize_argv(adm_jobs *j, const adm_job_rec *r, const char *exe, srv_error *err) {
    cJSON *spec = job_parse(r->spec_json);
    adm_model_info *mi = calloc(1, sizeof *mi);
    adm_dataset_files df = {0}, vf = {0};
    char vb[32], nb[32];
    snprintf(vb, sizeof vb, "%lld", (long long)r->base_version);
    snprintf(nb, sizeof nb, "%lld", (long long)r->new_version);
    srv_code rc = !spec || !mi ? srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory") : SRV_OK;
    if (rc == SRV_OK) rc = j->o.ops.model_info(j->o.ops.ctx, r->model, vb, mi, err);
    if (rc == SRV_OK) rc = adm_datasets_files(j->o.datasets, r->dataset, &df, err);
    if (rc == SRV_OK && r->val_dataset) rc = adm_datasets_files(j->o.datasets, r->val_dataset, &vf, err);
    char **v = NULL;
    int n = 0, bad = rc != SRV_OK;
    if (!bad) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(spec, "method"), *pc = cJSON_GetObjectItemCaseSensitive(spec, "per_channel");
        const cJSON *th = cJSON_GetObjectItemCaseSensitive(spec, "threads"), *ex = cJSON_GetObjectItemCaseSensitive(spec, "exclude"), *e;
        bad = argv_add(&v, &n, exe) || argv_add(&v, &n, "quantize") || argv_add(&v, &n, "--model-base-path") ||
              argv_add(&v, &n, mi->base_path) || argv_add(&v, &n, "--version") || argv_add(&v, &n, vb) ||
              argv_add(&v, &n, "--new-version") || argv_add(&v, &n, nb) || argv_files(&v, &n, "--calibration", &df) ||
              (r->val_dataset && argv_files(&v, &n, "--eval", &vf)) ||
              (cJSON_IsString(m) && (argv_add(&v, &n, "--method") || argv_add(&v, &n, m->valuestring))) ||
              (cJSON_IsFalse(pc) && argv_add(&v, &n, "--per-tensor"));
        if (!bad && cJSON_IsNumber(th)) {
            char t[32];
            snprintf(t, sizeof t, "%lld", (long long)th->valuedouble);
            bad = argv_add(&v, &n, "--threads") || argv_add(&v, &n, t);
        }
        cJSON_ArrayForEach(e, ex) if (!bad && cJSON_IsString(e)) bad = argv_add(&v, &n, "--exclude") || argv_add(&v, &n, e->valuestring);
        if (bad) srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    }
    adm_dataset_files_free(&df);
    adm_dataset_files_free(&vf);
    free(mi);
    cJSON_Delete(spec);
    if (bad) {
        job_argv_free(v);
        return NULL;
    }
    return v;
}

cJSON *job_quantize_done(const char *path, int64_t version) {
    char mp[4400];
    snprintf(mp, sizeof mp, "%.4200s/metrics.json", path);
    FILE *f = fopen(mp, "r");
    char *text = NULL;
    size_t cap = 0, len = 0;
    if (f) {
        char buf[8192];
        size_t k;
        while ((k = fread(buf, 1, sizeof buf, f)) > 0 && len < (16u << 20)) {
            char *g = realloc(text, cap = len + k + 1);
            if (!g) break;
            text = g;
            memcpy(text + len, buf, k);
            len += k;
            text[len] = '\0';
        }
        fclose(f);
    }
    cJSON *m = job_parse(text), *d = cJSON_CreateObject();
    free(text);
    if (!d) {
        cJSON_Delete(m);
        return NULL;
    }
    cJSON_AddNumberToObject(d, "version", (double)version);
    cJSON_AddStringToObject(d, "path", path);
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(m, "evaluation"), "int8");
    const cJSON *acc = cJSON_GetObjectItemCaseSensitive(q, "accuracy"), *mse = cJSON_GetObjectItemCaseSensitive(q, "mse");
    if (cJSON_IsNumber(acc)) cJSON_AddNumberToObject(d, "val_accuracy", acc->valuedouble);
    else cJSON_AddNullToObject(d, "val_accuracy");
    if (cJSON_IsNumber(mse)) cJSON_AddNumberToObject(d, "val_loss", mse->valuedouble);
    else cJSON_AddNullToObject(d, "val_loss");
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(m, "evaluation");
    if (ev) cJSON_AddItemToObject(d, "evaluation", cJSON_Duplicate(ev, 1));
    cJSON_Delete(m);
    return d;
}

static void add_num_or_null(cJSON *o, const char *key, int64_t v) {
    if (v) cJSON_AddNumberToObject(o, key, (double)v);
    else cJSON_AddNullToObject(o, key);
}

cJSON *job_view(const adm_job_rec *r, const char *live_progress) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddNumberToObject(o, "id", (double)r->id);
    cJSON_AddStringToObject(o, "model", r->model);
    cJSON_AddStringToObject(o, "state", r->state);
    cJSON_AddStringToObject(o, "dataset", r->dataset);
    if (r->val_dataset) cJSON_AddStringToObject(o, "val_dataset", r->val_dataset);
    else cJSON_AddNullToObject(o, "val_dataset");
    add_num_or_null(o, "base_version", r->base_version);
    add_num_or_null(o, "new_version", r->new_version);
    cJSON *spec = job_parse(r->spec_json), *res = job_parse(r->result_json);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(spec, "epochs");
    if (cJSON_IsNumber(e)) cJSON_AddNumberToObject(o, "epochs", e->valuedouble);
    /* progress fields at the top level, as the dashboard and scripts read them */
    static const char *const pf[] = {"epoch", "step", "steps_per_epoch", "global_step", "loss", "accuracy", "val_loss",
                                     "val_accuracy", "examples_per_sec", "eta_s", "learning_rate", NULL};
    cJSON *prog = job_parse(live_progress ? live_progress : r->progress_json);
    for (int i = 0; pf[i]; i++) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(prog, pf[i]);
        if (f && !cJSON_GetObjectItemCaseSensitive(o, pf[i])) cJSON_AddItemToObject(o, pf[i], cJSON_Duplicate(f, 1));
        else if (!f) cJSON_AddNullToObject(o, pf[i]);
    }
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(res, "version");
    if (cJSON_IsNumber(ver)) cJSON_AddNumberToObject(o, "version", ver->valuedouble);
    else cJSON_AddNullToObject(o, "version");
    if (r->reason) cJSON_AddStringToObject(o, "reason", r->reason);
    else cJSON_AddNullToObject(o, "reason");
    add_num_or_null(o, "created_ms", r->created_ms);
    add_num_or_null(o, "started_ms", r->started_ms);
    add_num_or_null(o, "ended_ms", r->ended_ms);
    cJSON_AddItemToObject(o, "spec", spec ? spec : cJSON_CreateNull());
    cJSON_AddItemToObject(o, "result", res ? res : cJSON_CreateNull());
    cJSON_Delete(prog);
    return o;
}
