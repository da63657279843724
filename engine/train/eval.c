/* eval.c - scoring a model on a labelled dataset and comparing two models' predictions (see eval.h).
 *
 * Invariants: a dataset is fitted before any run (so a shape error names the column and input before any
 * compute); predictions are copied out of session memory batch by batch into eng_eval_preds, which owns them;
 * the argmax takes the first maximum, as numpy does, so scores match a numpy recomputation exactly.
 */
#include "eval.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>

#include "../bundle.h"
#include "../plan/session.h"

static void col_list(const eng_dataset *d, char *buf, size_t cap) {
    size_t k = 0;
    buf[0] = 0;
    for (int j = 0; j < d->ncols && k < cap; j++)
        k += (size_t)snprintf(buf + k, cap - k, "%s'%s'", j ? ", " : "", d->cols[j].name);
}

void eng_eval_rows(const eng_dataset *d, const int *cols, int ncols, int64_t b0, int64_t rows, eng_tensor *in) {
    for (int i = 0; i < ncols; i++) in[i] = eng_tensor_rows(&d->cols[cols[i]].t, b0, rows);
}

eng_status eng_eval_fit(const eng_graph *g, eng_dataset *d, const char *what, int *cols, int *ncols) {
    int nin = 0;
    for (int i = 0; i < g->ninputs; i++)
        if (!g->values[g->inputs[i]].init) nin++;
    if (nin == 0) return eng_err(ENG_STATUS_INVALID_MODEL, "%s has no data inputs", what);
    int k = 0;
    char desc[512];
    for (int i = 0; i < g->ninputs; i++) {
        const eng_value *v = &g->values[g->inputs[i]];
        if (v->init) continue;
        const char *col = eng_dataset_find(d, v->name) >= 0 ? v->name : nin == 1 ? "x" : v->name;
        if (eng_dataset_find(d, col) < 0) {
            char cl[1024];
            col_list(d, cl, sizeof cl);
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "dataset %s has no column '%s' for input '%s' of %s (columns: %s)",
                           d->source ? d->source : "", col, v->name, what, cl);
        }
        if (v->ndim < 1)
            return eng_err(ENG_STATUS_UNSUPPORTED, "%s: input '%s' has %s rank; evaluation needs a batched input", what,
                           v->name, v->ndim < 0 ? "an unknown" : "zero");
        int64_t dims[ENG_MAX_DIMS];
        for (int j = 0; j < v->ndim; j++) dims[j] = j == 0 ? -1 : v->dims[j];
        eng_status st = eng_dataset_fit(d, col, v->name, v->dtype != ENG_DTYPE_UNDEFINED ? v->dtype : ENG_DTYPE_F32,
                                        v->ndim, dims, desc, sizeof desc);
        if (st != ENG_STATUS_OK) return eng_err_prefix(st, "%s: dataset %s: ", what, d->source ? d->source : "");
        cols[k++] = eng_dataset_find(d, col);
    }
    *ncols = k;
    return ENG_STATUS_OK;
}

void eng_eval_preds_free(eng_eval_preds *p) {
    if (!p) return;
    free(p->out);
    free(p->cls);
    memset(p, 0, sizeof *p);
}

/* Score p->out against the label column; decides classification vs regression. */
static eng_status eval_score(const eng_dataset *d, const char *what, int out_ndim, eng_eval_preds *p) {
    int li = eng_dataset_find(d, "label");
    if (li < 0) {
        char cl[1024];
        col_list(d, cl, sizeof cl);
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "dataset %s has no 'label' column to score %s against (columns: %s)",
                       d->source ? d->source : "", what, cl);
    }
    const eng_tensor *lt = &d->cols[li].t;
    int64_t lper = 1;
    for (int j = 1; j < lt->ndim; j++) lper *= lt->dims[j];
    p->classification = eng_dtype_is_int(lt->dtype) && lper == 1 && out_ndim == 2 && p->per >= 2;
    if (p->classification) {
        p->cls = malloc(sizeof *p->cls * (size_t)p->n);
        if (!p->cls) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
        int64_t hit = 0;
        for (int64_t e = 0; e < p->n; e++) {
            int64_t y = eng_tensor_get_i64(lt, e);
            if (y < 0 || y >= p->per)
                return eng_err(ENG_STATUS_INVALID_ARGUMENT,
                               "dataset %s: label %lld at example %lld is out of range for %s with %lld classes "
                               "(valid: 0..%lld)",
                               d->source ? d->source : "", (long long)y, (long long)e, what, (long long)p->per,
                               (long long)p->per - 1);
            const float *row = p->out + e * p->per;
            int64_t best = 0;
            for (int64_t c = 1; c < p->per; c++)
                if (row[c] > row[best]) best = c;
            p->cls[e] = best;
            hit += best == y;
        }
        p->accuracy = (double)hit / (double)p->n;
        p->mse = NAN;
        return ENG_STATUS_OK;
    }
    if (lper != p->per) {
        char ls[160];
        eng_shape_str(lt->dims, lt->ndim, ls, sizeof ls);
        return eng_err(ENG_STATUS_INVALID_ARGUMENT,
                       "dataset %s: label column %s has %lld elements per example but the output of %s has %lld "
                       "(classification needs integer labels and an output [N, classes >= 2])",
                       d->source ? d->source : "", ls, (long long)lper, what, (long long)p->per);
    }
    double s = 0;
    int64_t total = p->n * p->per;
    for (int64_t i = 0; i < total; i++) {
        double diff = (double)p->out[i] - eng_tensor_get_f64(lt, i);
        s += diff * diff;
    }
    p->mse = s / (double)total;
    p->accuracy = NAN;
    return ENG_STATUS_OK;
}

eng_status eng_eval_model(const char *path, const char *what, eng_dataset *d, const eng_eval_opts *opts,
                          eng_eval_preds *p) {
    memset(p, 0, sizeof *p);
    eng_session_opts so = {0};
    so.nthreads = opts ? opts->nthreads : 0;
    so.precision = opts ? opts->precision : ENG_PRECISION_FP32;
    int64_t bs = opts && opts->batch_size > 0 ? opts->batch_size : 256;
    eng_session *s = NULL;
    eng_status st = eng_session_new_file(path, &so, &s);
    if (st != ENG_STATUS_OK) return eng_err_prefix(st, "%s: ", what);
    const eng_graph *g = eng_session_graph(s);
    int *cols = calloc((size_t)g->ninputs + 1, sizeof *cols);
    const char **names = calloc((size_t)g->ninputs + 1, sizeof *names);
    eng_tensor *in = calloc((size_t)g->ninputs + 1, sizeof *in);
    eng_tensor *outs = calloc((size_t)g->noutputs + 1, sizeof *outs);
    int ncols = 0, out_ndim = 0;
    if (!cols || !names || !in || !outs) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    if (st == ENG_STATUS_OK && g->noutputs < 1) st = eng_err(ENG_STATUS_INVALID_MODEL, "%s has no outputs", what);
    if (st == ENG_STATUS_OK) st = eng_eval_fit(g, d, what, cols, &ncols);
    if (st == ENG_STATUS_OK) {
        int k = 0;
        for (int i = 0; i < g->ninputs; i++)
            if (!g->values[g->inputs[i]].init) names[k++] = g->values[g->inputs[i]].name;
        p->n = d->n;
    }
    const char *oname = st == ENG_STATUS_OK ? g->values[g->outputs[0]].name : "";
    for (int64_t b0 = 0; st == ENG_STATUS_OK && b0 < d->n; b0 += bs) {
        int64_t rows = d->n - b0 < bs ? d->n - b0 : bs;
        eng_eval_rows(d, cols, ncols, b0, rows, in);
        st = eng_session_run(s, ncols, names, in, outs);
        if (st != ENG_STATUS_OK) {
            st = eng_err_prefix(st, "%s: examples %lld..%lld: ", what, (long long)b0, (long long)(b0 + rows - 1));
            break;
        }
        const eng_tensor *o = &outs[0];
        int64_t numel = eng_tensor_numel(o);
        char os[160];
        eng_shape_str(o->dims, o->ndim, os, sizeof os);
        if (o->ndim < 1 || o->dims[0] != rows || numel < 0 || (rows > 0 && numel % rows) ||
            (b0 > 0 && (numel / rows != p->per || o->ndim != out_ndim))) {
            st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: output '%s' has shape %s for a batch of %lld examples; "
                         "evaluation needs a batched output [N, ...] of the same size for every example",
                         what, oname, os, (long long)rows);
            break;
        }
        if (b0 == 0) {
            p->per = numel / rows;
            out_ndim = o->ndim;
            if (p->per < 1 || p->n > INT64_MAX / (int64_t)sizeof(float) / p->per) {
                st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: output '%s' %s is too large to keep for %lld examples",
                             what, oname, os, (long long)p->n);
                break;
            }
            p->out = malloc(sizeof(float) * (size_t)(p->n * p->per));
            if (!p->out) {
                st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory keeping the outputs of %s", what);
                break;
            }
        }
        st = eng_convert(o->data, o->dtype, p->out + b0 * p->per, ENG_DTYPE_F32, numel);
        if (st != ENG_STATUS_OK) st = eng_err_prefix(st, "%s: output '%s': ", what, oname);
    }
    if (st == ENG_STATUS_OK) st = eval_score(d, what, out_ndim, p);
    free(cols);
    free(names);
    free(in);
    free(outs);
    eng_session_free(&s);
    if (st != ENG_STATUS_OK) eng_eval_preds_free(p);
    return st;
}

eng_status eng_eval_compare(const eng_eval_preds *a, const eng_eval_preds *b, eng_eval_cmp *c) {
    memset(c, 0, sizeof *c);
    if (a->n != b->n || a->per != b->per || a->classification != b->classification)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT,
                       "cannot compare predictions: %lld examples x %lld outputs (%s) vs %lld x %lld (%s)",
                       (long long)a->n, (long long)a->per, a->classification ? "classification" : "regression",
                       (long long)b->n, (long long)b->per, b->classification ? "classification" : "regression");
    if (a->classification) {
        int64_t same = 0;
        for (int64_t e = 0; e < a->n; e++) same += a->cls[e] == b->cls[e];
        c->agreement = (double)same / (double)a->n;
        c->accuracy_delta = a->accuracy - b->accuracy;
        c->mean_sq_diff = NAN;
        c->mse_delta = NAN;
    } else {
        double s = 0;
        for (int64_t i = 0; i < a->n * a->per; i++) {
            double d = (double)a->out[i] - (double)b->out[i];
            s += d * d;
        }
        c->mean_sq_diff = s / (double)(a->n * a->per);
        c->mse_delta = a->mse - b->mse;
        c->agreement = NAN;
        c->accuracy_delta = NAN;
    }
    return ENG_STATUS_OK;
}

/* NOT_FOUND naming base, the version and the versions present, unless <base>/<version>/model.onnx exists. */
static eng_status eval_check_version(const char *base, int64_t version) {
    char path[4096];
    struct stat sb;
    ENG_TRY(eng_bundle_path(path, sizeof path, base, version, ENG_BUNDLE_MODEL_FILE));
    if (version > 0 && stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) return ENG_STATUS_OK;
    int64_t *vs = NULL;
    int n = 0;
    if (eng_bundle_scan(base, &vs, &n) != ENG_STATUS_OK)
        return eng_err(ENG_STATUS_NOT_FOUND, "model base path '%s' cannot be read (%s)", base, eng_last_error());
    char list[512] = "none";
    size_t k = 0;
    for (int i = n - 1; i >= 0 && k < sizeof list; i--)
        k += (size_t)snprintf(list + k, sizeof list - k, "%s%lld", k ? ", " : "", (long long)vs[i]);
    free(vs);
    return eng_err(ENG_STATUS_NOT_FOUND, "model '%s' has no version %lld (versions: %s)", base, (long long)version,
                   list);
}

eng_status eng_eval_versions(const char *base, int64_t version, int64_t against, const char *const *files, int nfiles,
                             const eng_eval_opts *opts, eng_eval_report *r) {
    memset(r, 0, sizeof *r);
    r->version = version;
    r->against = against;
    ENG_TRY(eval_check_version(base, version));
    if (against > 0) ENG_TRY(eval_check_version(base, against));
    eng_dataset *d = NULL;
    ENG_TRY(eng_dataset_load(files, nfiles, &d));
    r->examples = d->n;
    char path[4096], what[4200];
    eng_status st = eng_bundle_path(path, sizeof path, base, version, NULL);
    eng_eval_opts oa = opts ? *opts : (eng_eval_opts){0}, ob = oa;
    ob.precision = oa.precision_b;
    snprintf(what, sizeof what, "model '%s' version %lld at %s", base, (long long)version, eng_precision_name(oa.precision));
    if (st == ENG_STATUS_OK) st = eng_eval_model(path, what, d, &oa, &r->a);
    if (st == ENG_STATUS_OK && against > 0) {
        st = eng_bundle_path(path, sizeof path, base, against, NULL);
        snprintf(what, sizeof what, "model '%s' version %lld at %s", base, (long long)against, eng_precision_name(ob.precision));
        if (st == ENG_STATUS_OK) st = eng_eval_model(path, what, d, &ob, &r->b);
        if (st == ENG_STATUS_OK) st = eng_eval_compare(&r->a, &r->b, &r->cmp);
        if (st != ENG_STATUS_OK && r->a.n && r->b.n)
            st = eng_err_prefix(st, "versions %lld and %lld: ", (long long)version, (long long)against);
    }
    eng_dataset_free(&d);
    return st;
}

void eng_eval_report_free(eng_eval_report *r) {
    if (!r) return;
    eng_eval_preds_free(&r->a);
    eng_eval_preds_free(&r->b);
}
