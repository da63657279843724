/* train.c - eng_train: set-up, the epoch loop, early stopping, checkpoints, and the final version (train.h).
 *
 * Set-up order (every check that can fail on bad input runs before the first step): base version -> base graph
 * -> training graph (set_training, loss, autodiff) and eval graph (base + loss, no autodiff) -> datasets fitted
 * to the model's inputs -> label range check -> sessions (one per replica, one for validation) -> optimizer ->
 * loader -> resume from the newest checkpoint if asked. State tensors (trainable params, then BatchNorm running
 * statistics) live in trainer-owned buffers and are fed to every run as inputs.
 *
 * Progress reports (opts.on_progress) read only trn_ctx state on the training thread; the cancel flag is polled
 * at step boundaries, before validation, before an epoch-end checkpoint and before the version is written.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "autodiff.h"
#include "../bundle.h"
#include "../ir/file-io.h"
#include "../ir/onnx.h"
#include "../plan/fuse.h"
#include "train-impl.h"
#include "../../kernels/krn-grad.h"

static eng_status ensure_in_list(int **list, int *n, int v) {
    for (int i = 0; i < *n; i++)
        if ((*list)[i] == v) return ENG_STATUS_OK;
    int *p = realloc(*list, ((size_t)*n + 1) * sizeof *p);
    if (!p) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    p[(*n)++] = v;
    *list = p;
    return ENG_STATUS_OK;
}

static eng_status ensure_input(eng_graph *g, const char *name) {
    int v = eng_graph_find_value(g, name);
    if (v < 0) return eng_err(ENG_STATUS_INTERNAL, "graph has no value '%s'", name);
    return ensure_in_list(&g->inputs, &g->ninputs, v);
}

/* The parameters are graph inputs of the training and evaluation graphs, fed from params[].w every run: drop those
 * graphs' copies of their initial values (keeping dtype and shape), so neither they nor the sessions' clones hold a
 * dead copy of the weights. After the data is fitted against the graph (an input without a value is a data column
 * there). */
static void drop_fed_inits(const trn_ctx *c, eng_graph *g) {
    for (int i = 0; i < c->nparams; i++) {
        int v = eng_graph_find_value(g, c->params[i].name);
        eng_value *val = v >= 0 ? &g->values[v] : NULL;
        if (!val || !val->init) continue;
        val->dtype = val->init->dtype;
        val->ndim = val->init->ndim;
        memcpy(val->dims, val->init->dims, sizeof val->dims);
        eng_value_set_init(g, v, NULL);
    }
}

static int output_index(const eng_graph *g, const char *name) {
    for (int i = 0; i < g->noutputs; i++)
        if (strcmp(g->values[g->outputs[i]].name, name) == 0) return i;
    return -1;
}

static eng_status ensure_output(eng_graph *g, const char *name, int *idx) {
    int v = eng_graph_find_value(g, name);
    if (v < 0) {
        *idx = -1;
        return ENG_STATUS_OK;
    }
    ENG_TRY(ensure_in_list(&g->outputs, &g->noutputs, v));
    *idx = output_index(g, name);
    return ENG_STATUS_OK;
}

static void json_escape(const char *s, char *out, size_t n) {
    size_t k = 0;
    for (; *s && k + 7 < n; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            out[k++] = '\\';
            out[k++] = (char)ch;
        } else if (ch < 0x20) {
            k += (size_t)snprintf(out + k, n - k, "\\u%04x", ch);
        } else {
            out[k++] = (char)ch;
        }
    }
    out[k] = 0;
}

static void pre_add(trn_ctx *c, const char *col, const char *desc) {
    char a[512], b[1024];
    json_escape(col, a, sizeof a);
    json_escape(desc, b, sizeof b);
    size_t k = strlen(c->preprocessing);
    if (k == 0) k = (size_t)snprintf(c->preprocessing, sizeof c->preprocessing, "{");
    else c->preprocessing[--k] = 0; /* drop the closing brace */
    snprintf(c->preprocessing + k, sizeof c->preprocessing - k, "%s\"%s\": \"%s\"}", k > 1 ? ", " : "", a, b);
}

/* Fit a dataset's columns to the model's data inputs and the label input. record: add to preprocessing. */
static eng_status fit_dataset(trn_ctx *c, eng_dataset *d, const eng_graph *gt, int record) {
    char desc[1024];
    for (int i = 0; i < c->ninputs; i++) {
        const char *in = c->input_names[i];
        const char *col = eng_dataset_find(d, in) >= 0 ? in : c->ninputs == 1 ? "x" : in;
        if (eng_dataset_find(d, col) < 0) {
            char cols[1024] = "";
            size_t k = 0;
            for (int j = 0; j < d->ncols && k < sizeof cols; j++)
                k += (size_t)snprintf(cols + k, sizeof cols - k, "%s'%s'", j ? ", " : "", d->cols[j].name);
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "dataset %s has no column '%s' for model input '%s' (columns: %s)",
                           d->source ? d->source : "", col, in, cols);
        }
        const eng_value *v = &gt->values[eng_graph_find_value(gt, in)];
        int64_t dims[ENG_MAX_DIMS];
        int nd = v->ndim;
        for (int k = 0; k < nd; k++) dims[k] = k == 0 ? -1 : v->dims[k];
        desc[0] = 0;
        ENG_TRY(eng_dataset_fit(d, col, in, v->dtype != ENG_DTYPE_UNDEFINED ? v->dtype : ENG_DTYPE_F32, nd, dims, desc,
                                sizeof desc));
        if (record) pre_add(c, in, desc);
    }
    if (eng_dataset_find(d, "label") < 0)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "dataset %s has no 'label' column", d->source ? d->source : "");
    const eng_value *lv = &gt->values[eng_graph_find_value(gt, "label")];
    int64_t dims[ENG_MAX_DIMS];
    for (int k = 0; k < lv->ndim; k++) dims[k] = k == 0 ? -1 : lv->dims[k];
    desc[0] = 0;
    ENG_TRY(eng_dataset_fit(d, "label", "label", lv->dtype, lv->ndim, dims, desc, sizeof desc));
    if (record) pre_add(c, "label", desc);
    return ENG_STATUS_OK;
}

static eng_status map_columns(trn_ctx *c, const eng_dataset *d) {
    for (int i = 0; i < c->ninputs; i++) {
        int col = eng_dataset_find(d, c->input_names[i]);
        if (col < 0) col = eng_dataset_find(d, "x");
        c->input_col[i] = col;
    }
    c->label_col = eng_dataset_find(d, "label");
    return ENG_STATUS_OK;
}

static eng_status check_labels(const eng_dataset *d, int64_t classes, const char *what) {
    int col = eng_dataset_find(d, "label");
    const eng_tensor *t = &d->cols[col].t;
    int64_t n = eng_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) {
        int64_t v = eng_tensor_get_i64(t, i);
        if (v < 0 || v >= classes)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT,
                           "%s data: label %lld at example %lld is out of range for a model with %lld classes (valid: 0..%lld)",
                           what, (long long)v, (long long)i, (long long)classes, (long long)classes - 1);
    }
    return ENG_STATUS_OK;
}

static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
}

static int monitor_is_max(const char *m) { return m && strstr(m, "accuracy") != NULL; }

static double monitor_value(const char *m, const trn_epoch *e) {
    if (!m || strcmp(m, "val_loss") == 0) return e->val_loss;
    if (strcmp(m, "val_accuracy") == 0) return e->val_accuracy;
    if (strcmp(m, "accuracy") == 0) return e->accuracy;
    return e->loss;
}

static eng_status build(trn_ctx *c) {
    const eng_train_opts *o = c->o;
    if (o->loss_scale < 0 || o->loss_scale > ENG_LOSS_SCALE_FIXED + 1)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "loss scale mode %d is unknown", o->loss_scale);
    if (o->loss_scale_init < 0 || !isfinite(o->loss_scale_init) || o->loss_scale_init > 3.4e38)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "loss scale %g is not a positive float32", o->loss_scale_init);
    eng_loss_scale_mode lsm = o->loss_scale ? (eng_loss_scale_mode)(o->loss_scale - 1)
                              : o->precision == ENG_PRECISION_FP16 ? ENG_LOSS_SCALE_DYNAMIC : ENG_LOSS_SCALE_NONE;
    eng_loss_scaler_init(&c->ls, lsm, o->loss_scale_init, o->loss_scale_growth_steps);
    if (snprintf(c->base, sizeof c->base, "%s", o->model_base_path) >= (int)sizeof c->base)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "model base path too long");
    int64_t highest; /* version names as the server reads them: "007" or "3.bak" are not versions */
    ENG_TRY(eng_bundle_latest(c->base, &highest));
    c->base_version = o->base_version > 0 ? o->base_version : highest;
    if (c->base_version <= 0) return eng_err(ENG_STATUS_NOT_FOUND, "no version directory under '%s'", c->base);
    if (o->new_version > 0) {
        c->new_version = o->new_version;
        char vdir[4300];
        struct stat sb;
        ENG_TRY(eng_bundle_path(vdir, sizeof vdir, c->base, c->new_version, NULL));
        if (lstat(vdir, &sb) == 0)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "new_version %lld: '%s' already exists (nothing was written)",
                           (long long)c->new_version, vdir);
    } else {
        c->new_version = (highest > c->base_version ? highest : c->base_version) + 1;
    }
    char path[4300];
    ENG_TRY(eng_bundle_path(path, sizeof path, c->base, c->base_version, ENG_BUNDLE_MODEL_FILE));
    ENG_TRY(eng_onnx_load_file(path, &c->g0));
    eng_graph *g0 = c->g0;
    /* the graph that is evaluated and written as the new version runs BatchNormalization on its running statistics
     * even when the model was exported in training mode; the training graph below switches it back */
    eng_status is = eng_graph_set_inference(g0);
    if (is != ENG_STATUS_OK) return eng_err_prefix(is, "model '%s': ", path);
    if (g0->noutputs < 1) return eng_err(ENG_STATUS_INVALID_MODEL, "model '%s' has no outputs", path);
    if (o->replace_head > 0) {
        eng_status hs = trn_replace_head(g0, o->replace_head, o->seed);
        if (hs != ENG_STATUS_OK) return eng_err_prefix(hs, "model '%s': ", path);
    }
    c->pred = g0->values[g0->outputs[0]].name;
    c->input_names = calloc((size_t)g0->ninputs + 1, sizeof *c->input_names);
    c->input_col = calloc((size_t)g0->ninputs + 1, sizeof *c->input_col);
    if (!c->input_names || !c->input_col) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; i < g0->ninputs; i++)
        if (!g0->values[g0->inputs[i]].init) c->input_names[c->ninputs++] = g0->values[g0->inputs[i]].name;
    if (c->ninputs == 0) return eng_err(ENG_STATUS_INVALID_MODEL, "model '%s' has no data inputs", path);
    if (eng_graph_find_value(g0, "label") >= 0)
        return eng_err(ENG_STATUS_UNSUPPORTED, "model '%s' already has a value named 'label'", path);

    /* training graph */
    eng_graph *gt = eng_graph_clone(g0);
    if (!gt) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    eng_status st = eng_graph_set_training(gt, o->freeze, o->nfreeze);
    if (st == ENG_STATUS_OK) st = eng_loss_append(gt, o->loss, c->pred, o->from_logits, &c->loss_name);
    const char **tn = NULL;
    int ntn = 0;
    if (st == ENG_STATUS_OK) st = eng_trainable_params(gt, o->freeze, o->nfreeze, &tn, &ntn);
    if (st == ENG_STATUS_OK && ntn == 0)
        st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "nothing to train: the model has no trainable float initializers%s",
                     o->nfreeze ? " left after --freeze" : "");
    int nbn = 0;
    for (int i = 0; st == ENG_STATUS_OK && i < gt->noutputs; i++)
        if (strncmp(gt->values[gt->outputs[i]].name, "bn_update/", 10) == 0) nbn++;
    if (st == ENG_STATUS_OK) {
        c->params = calloc((size_t)(ntn + nbn), sizeof *c->params);
        if (!c->params) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    for (int i = 0; st == ENG_STATUS_OK && i < ntn + nbn; i++) {
        const char *name = NULL;
        if (i < ntn) {
            name = tn[i];
        } else {
            int seen = 0;
            for (int k = 0; k < gt->noutputs; k++) {
                const char *on = gt->values[gt->outputs[k]].name;
                if (strncmp(on, "bn_update/", 10) == 0 && seen++ == i - ntn) name = on + 10;
            }
        }
        int v = eng_graph_find_value(g0, name);
        const eng_tensor *init = v >= 0 ? g0->values[v].init : NULL;
        if (!init || init->dtype != ENG_DTYPE_F32) {
            st = eng_err(ENG_STATUS_UNSUPPORTED, "parameter '%s' is not a float32 initializer of the base model", name);
            break;
        }
        trn_param *p = &c->params[c->nparams++];
        p->name = strdup(name);
        p->n = eng_tensor_numel(init);
        p->is_bn = i >= ntn;
        p->w = eng_alloc((size_t)(p->n > 0 ? p->n : 1) * sizeof(float));
        if (o->keep_best) p->best = eng_alloc((size_t)(p->n > 0 ? p->n : 1) * sizeof(float));
        if (!p->name || !p->w || (o->keep_best && !p->best)) {
            st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
            break;
        }
        memcpy(p->w, init->data, (size_t)p->n * sizeof(float));
        p->t = *init;
        p->t.data = p->w;
    }
    c->ntrain = ntn;
    /* after the parameter list (Constant nodes it hoists are not parameters), before autodiff (Gelu chains become
     * one node with one gradient) */
    if (st == ENG_STATUS_OK) st = eng_graph_fuse_act_ops(gt);
    /* loss scaling: the backward pass starts from a scalar input the trainer feeds every step */
    if (st == ENG_STATUS_OK && c->ls.mode != ENG_LOSS_SCALE_NONE) {
        int v = eng_graph_find_value(gt, TRN_LOSS_SCALE_INPUT) >= 0 ? -1 : eng_graph_add_value(gt, TRN_LOSS_SCALE_INPUT);
        if (v < 0) {
            st = eng_err(ENG_STATUS_UNSUPPORTED, "model '%s' already has a value named '%s'", path, TRN_LOSS_SCALE_INPUT);
        } else {
            gt->values[v].dtype = ENG_DTYPE_F32;
            gt->values[v].ndim = 0;
            st = ensure_input(gt, TRN_LOSS_SCALE_INPUT);
        }
    }
    if (st == ENG_STATUS_OK) {
        eng_grad_spec gs = {.loss = c->loss_name, .params = tn, .nparams = ntn,
                            .loss_scale = c->ls.mode != ENG_LOSS_SCALE_NONE ? TRN_LOSS_SCALE_INPUT : NULL};
        int nfwd = gt->nnodes;
        st = eng_autodiff(gt, &gs);
        if (st == ENG_STATUS_OK && o->recompute) st = eng_graph_recompute(gt, nfwd, &c->recompute);
    }
    free(tn);
    for (int i = 0; st == ENG_STATUS_OK && i < c->nparams; i++) st = ensure_input(gt, c->params[i].name);
    int dummy;
    if (st == ENG_STATUS_OK) st = ensure_output(gt, c->loss_name, &dummy);

    /* data (fitted against the training graph, which holds the model inputs and the label input) */
    eng_dataset *all = NULL;
    if (st == ENG_STATUS_OK) st = eng_dataset_load(o->data_files, o->ndata, &all);
    if (st == ENG_STATUS_OK) st = fit_dataset(c, all, gt, 1);
    if (st == ENG_STATUS_OK && o->nval > 0) {
        st = eng_dataset_load(o->val_files, o->nval, &c->val);
        if (st == ENG_STATUS_OK) st = fit_dataset(c, c->val, gt, 0);
        if (st != ENG_STATUS_OK) eng_err_prefix(st, "validation data: ");
        c->train = all;
        all = NULL;
    } else if (st == ENG_STATUS_OK && o->val_split > 0) {
        st = eng_dataset_split(all, o->val_split, o->seed, &c->train, &c->val);
        eng_dataset_free(&all);
    } else if (st == ENG_STATUS_OK) {
        c->train = all;
        all = NULL;
    }
    eng_dataset_free(&all);
    if (st == ENG_STATUS_OK && c->train->n <= 0)
        st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "no training examples left after the validation split");
    if (st == ENG_STATUS_OK) st = map_columns(c, c->train);
    c->feed_eval = (trn_feedmap){.n = c->ninputs, .names = (const char **)c->input_names, .col = c->input_col,
                                 .label_col = c->label_col};
    c->feed_train = c->feed_eval;
    if (st == ENG_STATUS_OK && c->val) {
        /* the val dataset was fitted the same way; its columns may sit in another order */
        for (int i = 0; i < c->ninputs; i++) {
            int a = eng_dataset_find(c->val, c->train->cols[c->input_col[i]].name);
            if (a != c->input_col[i] || eng_dataset_find(c->val, "label") != c->label_col)
                st = eng_err(ENG_STATUS_UNSUPPORTED, "validation data must have the same columns as the training data");
        }
    }
    if (st == ENG_STATUS_OK && o->loss == ENG_LOSS_SPARSE_CCE) {
        const eng_value *pv = &g0->values[g0->outputs[0]];
        int64_t classes = pv->ndim >= 2 ? pv->dims[pv->ndim - 1] : -1;
        if (classes > 0) {
            st = check_labels(c->train, classes, "training");
            if (st == ENG_STATUS_OK && c->val) st = check_labels(c->val, classes, "validation");
        }
    }

    /* sessions */
    if (st == ENG_STATUS_OK) drop_fed_inits(c, gt);
    if (st == ENG_STATUS_OK) st = trn_frozen_features(c, gt);
    if (st == ENG_STATUS_OK) st = trn_replicas_new(c, gt);
    eng_graph_free(&gt);
    if (st == ENG_STATUS_OK && c->R > 1) st = eng_comm_new_threads(c->R, &c->comm);
    if (st == ENG_STATUS_OK && c->val) {
        eng_graph *ge = eng_graph_clone(g0);
        const char *ln = NULL;
        if (!ge) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
        if (st == ENG_STATUS_OK) st = eng_loss_append(ge, o->loss, c->pred, o->from_logits, &ln);
        if (st == ENG_STATUS_OK) st = ensure_output(ge, ln, &c->eval_loss_out);
        if (st == ENG_STATUS_OK) st = ensure_output(ge, "metric/accuracy", &c->eval_acc_out);
        for (int i = 0; st == ENG_STATUS_OK && i < c->nparams; i++) st = ensure_input(ge, c->params[i].name);
        if (st == ENG_STATUS_OK) drop_fed_inits(c, ge);
        if (st == ENG_STATUS_OK) {
            eng_session_opts so = {.nthreads = o->nthreads, .no_fuse = 1, .precision = o->precision};
            st = trn_replica_device(o, 0, &so);
            if (st == ENG_STATUS_OK && o->precision != ENG_PRECISION_FP32) {
                st = trn_output_layer_nodes(ge, c->pred, &c->fp32_eval);
                so.fp32_nodes = (const char *const *)c->fp32_eval.names;
                so.nfp32_nodes = c->fp32_eval.n;
            }
            if (st == ENG_STATUS_OK) st = eng_session_new_graph(ge, &so, &c->eval);
            else eng_graph_free(&ge);
        } else {
            eng_graph_free(&ge);
        }
        if (st != ENG_STATUS_OK) eng_err_prefix(st, "validation graph: ");
    }
    if (st != ENG_STATUS_OK) return st;

    int64_t *sizes = malloc(((size_t)c->ntrain + 1) * sizeof *sizes);
    if (!sizes) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; i < c->ntrain; i++) sizes[i] = c->params[i].n;
    st = eng_optim_new(&o->optim, c->ntrain, sizes, &c->optim);
    if (st == ENG_STATUS_OK) st = trn_dev_alloc(c); /* device-resident replicas: their weights and optimizers */
    free(sizes);
    ENG_TRY(st);
    eng_loader_opts lo = {.batch_size = o->batch_size, .shuffle = !o->no_shuffle, .seed = o->seed, .drop_remainder = 0, .prefetch = 2};
    ENG_TRY(eng_loader_new(c->ftrain ? c->ftrain : c->train, &lo, &c->loader));
    c->steps_per_epoch = eng_loader_steps_per_epoch(c->loader);

    uint64_t fp = 0x74656e736f7264ull;
    fp = mix(fp, (uint64_t)o->batch_size);
    fp = mix(fp, o->seed);
    fp = mix(fp, (uint64_t)c->train->n);
    fp = mix(fp, (uint64_t)o->optim.kind);
    fp = mix(fp, (uint64_t)c->nparams);
    fp = mix(fp, (uint64_t)o->keep_best);
    c->st.fingerprint = fp;
    eng_rng_seed(&c->st.rng, o->seed);
    c->st.best = monitor_is_max(o->monitor) ? -INFINITY : INFINITY;
    snprintf(c->ckpt_dir, sizeof c->ckpt_dir, "%s/.train-%lld", c->base, (long long)c->new_version);
    return ENG_STATUS_OK;
}

static eng_status write_ckpt(trn_ctx *c) {
    if (c->wrank != 0) return ENG_STATUS_OK; /* rank 0 writes for the job */
    ENG_TRY(trn_weights_to_host(c));
    if (mkdir(c->ckpt_dir, 0755) != 0 && errno != EEXIST)
        return eng_err(ENG_STATUS_IO, "cannot create checkpoint directory '%s': %s", c->ckpt_dir, strerror(errno));
    int nt = c->nparams * (c->o->keep_best ? 2 : 1);
    trn_ckpt_tensor *t = calloc((size_t)nt + 1, sizeof *t);
    char **names = calloc((size_t)nt + 1, sizeof *names);
    size_t olen = eng_optim_state_size(c->optim);
    void *ob = malloc(olen + 1);
    eng_status st = t && names && ob ? ENG_STATUS_OK : eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; st == ENG_STATUS_OK && i < c->nparams; i++) {
        t[i] = (trn_ckpt_tensor){c->params[i].name, c->params[i].w, c->params[i].n};
        if (c->o->keep_best) {
            size_t l = strlen(c->params[i].name) + 6;
            names[i] = malloc(l);
            if (!names[i]) {
                st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
                break;
            }
            snprintf(names[i], l, "best/%s", c->params[i].name);
            t[c->nparams + i] = (trn_ckpt_tensor){names[i], c->params[i].best, c->params[i].n};
        }
    }
    if (st == ENG_STATUS_OK) st = eng_optim_state_save(c->optim, ob, olen);
    char path[4400];
    snprintf(path, sizeof path, "%s/ckpt-%lld.bin", c->ckpt_dir, (long long)c->st.global_step);
    if (st == ENG_STATUS_OK) st = trn_ckpt_write(path, &c->st, t, nt, ob, olen);
    if (st == ENG_STATUS_OK) trn_ckpt_prune(c->ckpt_dir, 2);
    for (int i = 0; names && i < nt; i++) free(names[i]);
    free(names);
    free(t);
    free(ob);
    return st;
}

static eng_status resume(trn_ctx *c) {
    char path[4400];
    int found = 0;
    ENG_TRY(trn_ckpt_latest(c->ckpt_dir, path, sizeof path, &found));
    if (!found) return ENG_STATUS_OK; /* nothing to resume: start from the beginning */
    int nt = c->nparams * (c->o->keep_best ? 2 : 1);
    trn_ckpt_tensor *t = calloc((size_t)nt + 1, sizeof *t);
    char **names = calloc((size_t)nt + 1, sizeof *names);
    if (!t || !names) {
        free(t);
        free(names);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    eng_status st = ENG_STATUS_OK;
    for (int i = 0; i < c->nparams && st == ENG_STATUS_OK; i++) {
        t[i] = (trn_ckpt_tensor){c->params[i].name, c->params[i].w, c->params[i].n};
        if (c->o->keep_best) {
            size_t l = strlen(c->params[i].name) + 6;
            names[i] = malloc(l);
            if (!names[i]) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
            else snprintf(names[i], l, "best/%s", c->params[i].name);
            t[c->nparams + i] = (trn_ckpt_tensor){names[i], c->params[i].best, c->params[i].n};
        }
    }
    uint64_t fp = c->st.fingerprint;
    void *ob = NULL;
    size_t olen = 0;
    if (st == ENG_STATUS_OK) st = trn_ckpt_read(path, &c->st, t, nt, &ob, &olen);
    if (st == ENG_STATUS_OK && c->st.fingerprint != fp)
        st = eng_err(ENG_STATUS_INVALID_ARGUMENT,
                     "checkpoint '%s' was written with different settings (batch size, seed, data size, optimizer or "
                     "--keep-best); resume with the same options or remove '%s'",
                     path, c->ckpt_dir);
    if (st == ENG_STATUS_OK) st = eng_optim_state_load(c->optim, ob, olen);
    if (st == ENG_STATUS_OK && c->st.epoch < c->o->epochs)
        st = eng_loader_seek(c->loader, c->st.epoch, c->st.step_in_epoch);
    if (st == ENG_STATUS_OK && c->o->progress)
        fprintf(stderr, "resuming from %s (epoch %lld, step %lld)\n", path, (long long)c->st.epoch + 1,
                (long long)c->st.step_in_epoch);
    for (int i = 0; i < nt; i++) free(names[i]);
    free(names);
    free(t);
    free(ob);
    return st;
}

static void tb_epoch(trn_ctx *c, const trn_epoch *e) {
    if (!c->tb) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double wt = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
    const char *tags[] = {"loss", "accuracy", "val_loss", "val_accuracy", "learning_rate", "examples_per_sec"};
    double vals[] = {e->loss, e->accuracy, e->val_loss, e->val_accuracy, e->lr, e->examples_per_sec};
    for (int i = 0; i < 6; i++)
        if (isfinite(vals[i])) eng_tfevents_scalar(c->tb, tags[i], e->epoch, wt, (float)vals[i]);
}

/* Close the epoch in progress: validation, metrics, TensorBoard, early stopping. *stop set when patience ran out. */
static eng_status end_epoch(trn_ctx *c, trn_epoch *e, int *stop) {
    const eng_train_opts *o = c->o;
    e->epoch = c->st.epoch + 1;
    e->loss = c->st.ep_rows ? c->st.ep_loss_sum / (double)c->st.ep_rows : NAN;
    e->accuracy = c->st.ep_rows ? c->st.ep_acc_sum / (double)c->st.ep_rows : NAN;
    e->lr = eng_optim_lr(c->optim);
    e->seconds = c->st.ep_seconds;
    e->examples_per_sec = c->st.ep_seconds > 0 ? (double)c->st.ep_rows / c->st.ep_seconds : 0;
    ENG_TRY(trn_validate(c, &e->val_loss, &e->val_accuracy));
    double m = monitor_value(o->monitor, e);
    int improved = monitor_is_max(o->monitor) ? m > c->st.best : m < c->st.best;
    if (improved) {
        c->st.best = m;
        c->st.best_epoch = e->epoch;
        c->st.wait = 0;
        if (o->keep_best)
            for (int i = 0; i < c->nparams; i++) memcpy(c->params[i].best, c->params[i].w, (size_t)c->params[i].n * 4);
    } else {
        c->st.wait++;
        if (o->early_stopping_patience > 0 && c->st.wait >= o->early_stopping_patience) *stop = 1;
    }
    return ENG_STATUS_OK;
}

/* The cancel flag; in a multi-process job any rank's flag, agreed on by every rank (they all reach the same
 * checks in the same order), so that all stop at the same step instead of one waiting in an all-reduce. */
static int cancelled(trn_ctx *c) {
    float f = c->o->cancel && atomic_load(c->o->cancel) != 0;
    if (c->W > 1 && (c->world_st = eng_comm_allreduce(c->world, c->wrank, &f, 1, 0)) != ENG_STATUS_OK) return 1;
    return f > 0;
}

static eng_status cancel_now(trn_ctx *c) {
    if (c->progress_drawn) fputc('\n', stderr);
    c->progress_drawn = 0;
    if (c->world_st != ENG_STATUS_OK) /* the job's communicator failed (a rank gone): its message says which */
        return c->world_st;
    return eng_err(ENG_STATUS_CANCELLED, "cancelled");
}

/* Steps left in the run (epochs, capped by max_steps) over the mean of the recent step times; NaN before the
 * first step of this process. Early stopping cannot be foreseen, so this is an upper bound for such runs. */
static double eta_s(const trn_ctx *c) {
    int64_t total = (int64_t)c->o->epochs * c->steps_per_epoch;
    if (c->o->max_steps > 0 && c->o->max_steps < total) total = c->o->max_steps;
    int64_t left = total > c->st.global_step ? total - c->st.global_step : 0;
    if (left == 0) return 0;
    int64_t n = c->nstep_dt < TRN_RATE_WINDOW ? c->nstep_dt : TRN_RATE_WINDOW;
    if (n == 0) return NAN;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += c->step_dt[i];
    return (double)left * sum / (double)n;
}

/* Call opts.on_progress. e: the epoch just closed (EPOCH), else NULL; lr: STEP's learning rate. */
static void report(trn_ctx *c, eng_train_progress_kind kind, const trn_epoch *e, double lr, int early_stop) {
    const eng_train_opts *o = c->o;
    if (!o->on_progress || c->wrank != 0) return;
    double r = (double)c->st.ep_rows;
    eng_train_progress p = {
        .kind = kind,
        .version = c->new_version,
        .epoch = (int)(c->st.epoch < o->epochs ? c->st.epoch + 1 : o->epochs),
        .epochs = o->epochs,
        .step = c->st.step_in_epoch,
        .steps_per_epoch = c->steps_per_epoch,
        .global_step = c->st.global_step,
        .resumed_from_step = c->resumed_from,
        .examples = c->train ? c->train->n : 0,
        .val_examples = c->val ? c->val->n : 0,
        .loss = r > 0 ? c->st.ep_loss_sum / r : NAN,
        .accuracy = r > 0 ? c->st.ep_acc_sum / r : NAN,
        .val_loss = NAN,
        .val_accuracy = NAN,
        .examples_per_sec = c->st.ep_seconds > 0 ? r / c->st.ep_seconds : NAN,
        .eta_s = kind == ENG_TRAIN_PROGRESS_START ? NAN : eta_s(c),
        .learning_rate = kind == ENG_TRAIN_PROGRESS_START ? eng_optim_lr(c->optim) : lr,
        .early_stop = early_stop,
    };
    if (e) {
        p.epoch = (int)e->epoch;
        p.loss = e->loss;
        p.accuracy = e->accuracy;
        p.val_loss = e->val_loss;
        p.val_accuracy = e->val_accuracy;
        p.examples_per_sec = e->examples_per_sec;
        p.learning_rate = e->lr;
    }
    o->on_progress(o->progress_arg, &p);
}

static eng_status loop(trn_ctx *c) {
    const eng_train_opts *o = c->o;
    int stop = 0;
    while (!stop && c->st.epoch < o->epochs) {
        for (;;) {
            if (cancelled(c)) return cancel_now(c);
            eng_batch b;
            int end = 0;
            double t0 = trn_now(), loss, acc; /* epoch seconds include waiting for the loader */
            ENG_TRY(eng_loader_next(c->loader, &b, &end));
            if (end) break;
            if (o->max_steps > 0 && c->st.global_step >= o->max_steps) {
                c->stopped_by_max_steps = 1;
                stop = 1;
                break;
            }
            /* training Dropout draws its mask from (node seed + global step): a new mask every step, and the same
             * masks again after --resume */
            krn_grad_dropout_set_step(c->st.global_step);
            double lr = eng_optim_lr(c->optim);
            ENG_TRY(trn_step(c, &b, &loss, &acc));
            if (!isfinite(loss)) {
                if (c->progress_drawn) fputc('\n', stderr);
                return eng_err(ENG_STATUS_INVALID_ARGUMENT,
                               "loss became %s at epoch %lld step %lld (global step %lld); try a lower learning rate or "
                               "check the data",
                               isnan(loss) ? "NaN" : "infinite", (long long)c->st.epoch + 1,
                               (long long)c->st.step_in_epoch + 1, (long long)c->st.global_step + 1);
            }
            c->st.global_step++;
            c->st.step_in_epoch++;
            c->st.ep_loss_sum += loss * (double)b.rows;
            c->st.ep_acc_sum += acc * (double)b.rows;
            c->st.ep_rows += b.rows;
            double dt = trn_now() - t0;
            c->st.ep_seconds += dt;
            c->step_dt[c->nstep_dt++ % TRN_RATE_WINDOW] = dt;
            ENG_TRY(trn_state_add_step(&c->st, c->st.global_step, loss));
            double r = c->st.ep_rows;
            trn_progress(c, c->st.step_in_epoch, c->st.ep_loss_sum / r, c->st.ep_acc_sum / r,
                         c->st.ep_seconds > 0 ? r / c->st.ep_seconds : 0, 0);
            if (o->checkpoint_every > 0 && c->st.global_step % o->checkpoint_every == 0) ENG_TRY(write_ckpt(c));
            report(c, ENG_TRAIN_PROGRESS_STEP, NULL, lr, 0); /* after the checkpoint: a report means it is on disk */
        }
        if (cancelled(c)) return cancel_now(c);
        if (c->stopped_by_max_steps) {
            ENG_TRY(write_ckpt(c)); /* so that --resume continues from here */
            if (c->st.ep_rows > 0) { /* the partial epoch is reported in metrics.json, not kept in the checkpoint */
                trn_epoch e;
                int dummy = 0;
                ENG_TRY(end_epoch(c, &e, &dummy));
                ENG_TRY(trn_state_add_epoch(&c->st, &e));
                tb_epoch(c, &e);
                report(c, ENG_TRAIN_PROGRESS_EPOCH, &e, e.lr, 0);
            }
            break;
        }
        trn_epoch e;
        ENG_TRY(end_epoch(c, &e, &stop));
        ENG_TRY(trn_state_add_epoch(&c->st, &e));
        tb_epoch(c, &e);
        report(c, ENG_TRAIN_PROGRESS_EPOCH, &e, e.lr, stop);
        if (o->progress) {
            double r = c->st.ep_rows ? (double)c->st.ep_rows : 1;
            trn_progress(c, c->st.step_in_epoch, c->st.ep_loss_sum / r, c->st.ep_acc_sum / r, e.examples_per_sec, 1);
            fprintf(stderr, "epoch %lld/%d: loss %.4f acc %.4f val_loss %.4f val_acc %.4f (%.1fs)%s\n", (long long)e.epoch,
                    o->epochs, e.loss, e.accuracy, e.val_loss, e.val_accuracy, e.seconds,
                    stop ? " - early stopping" : "");
        }
        c->st.epoch++;
        c->st.step_in_epoch = 0;
        c->st.ep_loss_sum = c->st.ep_acc_sum = c->st.ep_seconds = 0;
        c->st.ep_rows = 0;
        if (!stop && c->st.epoch < o->epochs) {
            if (cancelled(c)) return cancel_now(c);
            ENG_TRY(write_ckpt(c));
        }
    }
    if (c->progress_drawn) fputc('\n', stderr);
    return ENG_STATUS_OK;
}

static void ctx_free(trn_ctx *c) {
    eng_optim_free(&c->optim); /* before the replicas: its state may live on their device context */
    trn_replicas_free(c);
    eng_session_free(&c->eval);
    trn_fp32_nodes_free(&c->fp32_train);
    trn_fp32_nodes_free(&c->fp32_eval);
    eng_comm_free(&c->comm);
    eng_loader_free(&c->loader);
    eng_dataset_free(&c->train);
    eng_dataset_free(&c->val);
    if (c->ftrain) { /* the frozen features' feed map is its own (names included) */
        for (int i = 0; i < c->feed_train.n; i++) free((char *)c->feed_train.names[i]);
        free(c->feed_train.names);
        free(c->feed_train.col);
    }
    eng_dataset_free(&c->ftrain);
    for (int i = 0; c->params && i < c->nparams; i++) {
        free(c->params[i].name);
        eng_free(c->params[i].w);
        eng_free(c->params[i].best);
    }
    free(c->params);
    free(c->input_names);
    free(c->input_col);
    eng_graph_free(&c->g0);
    trn_state_free(&c->st);
    eng_tfevents_close(&c->tb);
}

eng_status eng_train(const eng_train_opts *o, eng_train_result *res) {
    memset(res, 0, sizeof *res);
    res->loss = res->accuracy = res->val_loss = res->val_accuracy = NAN;
    if (!o->model_base_path) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "model base path is required");
    if (o->new_version < 0)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "new_version must be >= 1 (or 0: the next free one), got %lld",
                       (long long)o->new_version);
    if (o->ndata < 1) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "no training data files given");
    if (o->epochs < 1) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "epochs must be >= 1, got %d", o->epochs);
    if (o->batch_size < 1) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "batch size must be >= 1, got %lld", (long long)o->batch_size);
    if (o->replicas < 1 || o->replicas > 256)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "replicas must be in [1, 256], got %d", o->replicas);
    if (!(o->val_split >= 0 && o->val_split < 1))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "validation split must be in [0, 1), got %g", o->val_split);
    const char *m = o->monitor ? o->monitor : "val_loss";
    if (strcmp(m, "val_loss") && strcmp(m, "val_accuracy") && strcmp(m, "loss") && strcmp(m, "accuracy"))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "unknown monitor '%s' (val_loss, val_accuracy, loss, accuracy)", m);
    if ((o->early_stopping_patience > 0 || o->keep_best) && strncmp(m, "val_", 4) == 0 && o->nval == 0 &&
        o->val_split <= 0)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "monitoring '%s' needs validation data (--val-data or --val-split)", m);
    trn_ctx c;
    memset(&c, 0, sizeof c);
    c.o = o;
    c.R = o->replicas;
    if (o->ndevices < 0 || o->ndevices > 256)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "devices: %d listed, at most 256", o->ndevices);
    for (int d = 0; d < o->ndevices; d++) {
        const krn_backend *b;
        if (krn_backend_by_name(o->devices[d], &b, NULL) != ENG_STATUS_OK)
            return eng_err_prefix(ENG_STATUS_INVALID_ARGUMENT, "devices: ");
    }
    if (c.R < o->ndevices) c.R = o->ndevices;
    c.W = 1;
    c.world = o->world;
    if (c.world) {
        c.W = eng_comm_size(c.world);
        c.wrank = eng_comm_rank(c.world);
        if (c.wrank < 0 || c.wrank >= c.W)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "the %s communicator has no rank for this process",
                           eng_comm_kind(c.world));
    }
    c.eval_acc_out = -1;
    eng_status st = build(&c);
    /* the coordinator (rendezvous.c) carries metrics and flags, never gradients: those travel through a device
     * communicator spanning the processes (NCCL) or MPI */
    if (st == ENG_STATUS_OK && c.W > 1 && strcmp(eng_comm_kind(c.world), "coordinator") == 0 && !c.dcomm_world)
        st = eng_err(ENG_STATUS_UNSUPPORTED, "rank %d of %d joined through TENSORD_COORDINATOR, which carries no gradients, "
                     "but this job's replicas cannot all-reduce on their devices across processes (every replica must "
                     "run on a device whose backend has multi-process collectives, NCCL: --devices cuda:0,...; and not "
                     "with loss scaling and gradient accumulation together); run the ranks under mpirun instead",
                     c.wrank, c.W);
    if (st == ENG_STATUS_OK && o->resume) st = resume(&c);
    if (st == ENG_STATUS_OK && o->resume) st = trn_weights_to_device(&c); /* the checkpoint's weights */
    if (st == ENG_STATUS_OK && cancelled(&c)) st = cancel_now(&c);
    if (st == ENG_STATUS_OK && c.wrank == 0) {
        char logdir[4400];
        snprintf(logdir, sizeof logdir, "%s/logs/%lld", c.base, (long long)c.new_version);
        st = eng_tfevents_open(logdir, &c.tb);
    }
    if (st == ENG_STATUS_OK) {
        c.resumed_from = c.st.global_step;
        report(&c, ENG_TRAIN_PROGRESS_START, NULL, NAN, 0);
        st = loop(&c);
    }
    if (st == ENG_STATUS_OK && cancelled(&c)) st = cancel_now(&c);
    if (st == ENG_STATUS_OK) {
        eng_status s2 = eng_tfevents_close(&c.tb);
        if (s2 != ENG_STATUS_OK && o->progress) fprintf(stderr, "warning: %s\n", eng_last_error());
        if (c.wrank == 0) st = trn_weights_to_host(&c);
        if (st == ENG_STATUS_OK && c.wrank == 0) st = trn_write_version(&c, res);
        else res->version = c.new_version; /* rank 0 writes it */
    }
    if (st == ENG_STATUS_OK) {
        if (!c.stopped_by_max_steps && c.wrank == 0) eng_file_remove_dir(c.ckpt_dir);
        res->epochs_run = (int)c.st.nepochs;
        res->steps = c.st.global_step;
        if (c.st.nepochs > 0) {
            const trn_epoch *e = &c.st.epochs[c.st.nepochs - 1];
            res->loss = e->loss;
            res->accuracy = e->accuracy;
            res->val_loss = e->val_loss;
            res->val_accuracy = e->val_accuracy;
            res->examples_per_sec = e->examples_per_sec;
        }
        res->loss_scale = c.ls.scale;
        res->skipped_steps = c.ls.skipped;
    }
    ctx_free(&c);
    return st;
}
