/* train-frozen.c - frozen features: with frozen layers (--freeze), the part of the training graph that no trained
 * parameter reaches is a fixed function of each example, so it runs once per example before the first step and its
 * results become data columns; the steps then run only the trained part (Keras' "feature extraction" recipe for
 * transfer learning, done for the user).
 *
 * The frozen part F: the nodes that read the data (a model input, directly or through other such nodes) and nothing
 * that changes during training: no trained parameter, no BatchNorm statistic being updated, not the label or the
 * loss scale, and that are not random (training Dropout and the Random* ops stay in the steps, with fresh masks) or
 * control flow. Its boundary: the values F produces that the rest of the graph (forward or backward) reads. The
 * training graph loses F's nodes and reads the boundary values as inputs; the model inputs only F read are no
 * longer fed.
 *
 * Each boundary value must hold one row per example (first dim = the batch), and a row must depend on its own
 * example only. The second is checked, not assumed: the first batch is computed again as part of a batch of another
 * size and composition, and the rows both hold must agree to 1e-4 of the tensor's magnitude (BatchNorm statistics
 * over the batch, attention across examples or a reshape that moves the batch would not). Otherwise, or when the
 * features would not fit TRN_FROZEN_MAX_BYTES, or when the job runs fewer steps than one epoch, training runs the
 * whole graph every step as before; metrics.json's "frozen_features" says which and why.
 *
 * Validation runs the whole model on the validation data (not cached).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../ops/op.h"
#include "eval.h"
#include "train-impl.h"

#define FZ_TOL 1e-4

static int is_param(const trn_ctx *c, const char *name) {
    for (int i = 0; i < c->nparams; i++)
        if (strcmp(c->params[i].name, name) == 0) return 1;
    return 0;
}

/* Ops whose result is not a fixed function of their inputs, or whose subgraphs this analysis does not look into. */
static int node_volatile(const eng_node *n) {
    for (int a = 0; a < n->nattr; a++)
        if (n->attrs[a].type == ENG_ATTR_GRAPH) return 1;
    const eng_op_def *d = eng_op_find(n->domain, n->op_type);
    return !d || (d->flags & ENG_OP_RANDOM);
}

static void fz_why(trn_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fz_why(trn_ctx *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->frozen.why, sizeof c->frozen.why, fmt, ap);
    va_end(ap);
}

/* Keep the nodes with frozen[n] != drop (in order), release the others. */
static void keep_nodes(eng_graph *g, const unsigned char *frozen, int drop) {
    int k = 0;
    for (int n = 0; n < g->nnodes; n++) {
        if (frozen[n] != drop) g->nodes[k++] = g->nodes[n];
        else eng_node_release(&g->nodes[n]);
    }
    g->nnodes = k;
    eng_graph_index_producers(g);
}

/* The nodes of gt: frozen[n] 1 for F's, 2 for constant ones (no data, nothing trained: both graphs keep them), 0 for
 * the others; the boundary values (bound[v]); counts of F's nodes and of the boundary in *nf, *nb. */
static eng_status analyse(const trn_ctx *c, const eng_graph *g, unsigned char *frozen, unsigned char *bound, int *nf,
                          int *nb) {
    unsigned char *taint = calloc((size_t)g->nvalues + 1, 1), *data = calloc((size_t)g->nvalues + 1, 1);
    int *order = malloc(((size_t)g->nnodes + 1) * sizeof *order);
    eng_status st = taint && data && order ? ENG_STATUS_OK : eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    if (st == ENG_STATUS_OK) st = eng_graph_topo_order(g, order);
    for (int v = 0; st == ENG_STATUS_OK && v < g->nvalues; v++) {
        const char *nm = g->values[v].name;
        taint[v] = is_param(c, nm) || !strcmp(nm, "label") || !strcmp(nm, TRN_LOSS_SCALE_INPUT);
    }
    for (int i = 0; st == ENG_STATUS_OK && i < c->ninputs; i++) {
        int v = eng_graph_find_value(g, c->input_names[i]);
        if (v >= 0) data[v] = 1;
    }
    *nf = *nb = 0;
    for (int k = 0; st == ENG_STATUS_OK && k < g->nnodes; k++) {
        const eng_node *n = &g->nodes[order[k]];
        int t = node_volatile(n), d = 0;
        for (int i = 0; i < n->nin; i++)
            if (n->inputs[i] >= 0) t |= taint[n->inputs[i]], d |= data[n->inputs[i]];
        for (int o = 0; o < n->nout; o++)
            if (n->outputs[o] >= 0) taint[n->outputs[o]] = (unsigned char)t, data[n->outputs[o]] = (unsigned char)d;
        frozen[order[k]] = t ? 0 : d ? 1 : 2;
        *nf += frozen[order[k]] == 1;
    }
    for (int n = 0; st == ENG_STATUS_OK && n < g->nnodes; n++) {
        if (frozen[n] == 1) continue;
        for (int i = 0; i < g->nodes[n].nin; i++) {
            int v = g->nodes[n].inputs[i];
            if (v >= 0 && g->values[v].producer >= 0 && frozen[g->values[v].producer] == 1) bound[v] = 1;
        }
    }
    for (int i = 0; st == ENG_STATUS_OK && i < g->noutputs; i++) {
        int v = g->outputs[i];
        if (g->values[v].producer >= 0 && frozen[g->values[v].producer] == 1) bound[v] = 1;
    }
    for (int v = 0; st == ENG_STATUS_OK && v < g->nvalues; v++) *nb += bound[v];
    free(taint);
    free(data);
    free(order);
    return st;
}

/* Is model input i read by a node of F (want 1) or of the rest (want 0)? */
static int input_read(const trn_ctx *c, const eng_graph *g, const unsigned char *frozen, int want, int i) {
    int v = eng_graph_find_value(g, c->input_names[i]);
    for (int n = 0; v >= 0 && n < g->nnodes; n++)
        if ((frozen[n] == 1) == want)
            for (int k = 0; k < g->nodes[n].nin; k++)
                if (g->nodes[n].inputs[k] == v) return 1;
    return 0;
}

/* Feed rows [r0, r0 + rows) of c->train to F. */
static eng_status run_rows(trn_ctx *c, eng_session *s, int nin, const char **names, const int *cols, eng_tensor *feed,
                           int64_t r0, int64_t rows, eng_tensor *outs) {
    eng_eval_rows(c->train, cols, nin, r0, rows, feed);
    return eng_session_run(s, nin, names, feed, outs);
}

/* Largest |x| over rows [0, rows) of t, and the largest difference of those rows between a (from row a0) and b
 * (from row b0). */
static void compare_rows(const eng_tensor *a, int64_t a0, const eng_tensor *b, int64_t b0, int64_t rows, double *mag,
                         double *diff) {
    int64_t per = eng_tensor_numel(a) / a->dims[0];
    *mag = *diff = 0;
    for (int64_t i = 0; i < rows * per; i++) {
        double x = eng_tensor_get_f64(a, a0 * per + i), y = eng_tensor_get_f64(b, b0 * per + i);
        if (fabs(x) > *mag) *mag = fabs(x);
        double d = fabs(x - y);
        if (!(d <= *diff)) *diff = isnan(d) ? INFINITY : d;
    }
}

/* Does a run's output t of rows examples hold one row per example? If not, says so in c->frozen.why. */
static int row_major(trn_ctx *c, const char *vn, const eng_tensor *t, int64_t rows) {
    if (t->ndim >= 1 && t->dims[0] == rows) return 1;
    fz_why(c, "frozen value '%s' does not hold one row per example (first dim %lld)", vn,
           t->ndim < 1 ? 0LL : (long long)t->dims[0]);
    return 0;
}

/* Rows [from, from + rows) of out into rows [to, to + rows) of column i. */
static eng_status store_rows(eng_dataset *fd, int i, const eng_tensor *out, int64_t from, int64_t to, int64_t rows) {
    const eng_tensor *t = &fd->cols[i].t;
    size_t rb = eng_tensor_nbytes(t) / (size_t)fd->n;
    if (out->dtype != t->dtype || out->ndim != t->ndim || out->ndim < 1 || out->dims[0] < from + rows ||
        eng_tensor_nbytes(out) != rb * (size_t)out->dims[0])
        return eng_err(ENG_STATUS_INTERNAL, "frozen value '%s' changed shape between batches", fd->cols[i].name);
    memcpy((char *)t->data + (size_t)to * rb, (const char *)out->data + (size_t)from * rb, rb * (size_t)rows);
    return ENG_STATUS_OK;
}

/* The features: F over every training example (first batch checked as above). On success c->ftrain holds one column
 * per boundary value (named after it) plus the inputs G still reads and the label; *ok = 0 with c->frozen.why set
 * when the features cannot be used. */
static eng_status compute(trn_ctx *c, eng_graph *gf, int nin, const char **names, const int *cols, int *ok) {
    const eng_train_opts *o = c->o;
    *ok = 0;
    eng_session_opts so = {.nthreads = o->nthreads, .no_fuse = 0, .precision = o->precision};
    eng_session *s = NULL;
    int nout = gf->noutputs;
    eng_status st = trn_replica_device(o, 0, &so);
    if (st == ENG_STATUS_OK) st = eng_session_new_graph(gf, &so, &s);
    else eng_graph_free(&gf);
    ENG_TRY(st);
    const eng_graph *g = eng_session_graph(s);
    eng_tensor *feed = calloc((size_t)nin + 1, sizeof *feed), *outs = calloc((size_t)nout + 1, sizeof *outs);
    eng_tensor *first = calloc((size_t)nout + 1, sizeof *first);
    eng_dataset *fd = calloc(1, sizeof *fd);
    if (!feed || !outs || !first || !fd || !(fd->cols = calloc((size_t)nout + 1, sizeof *fd->cols)))
        st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    int64_t n = c->train->n, a = o->batch_size < n ? o->batch_size : n;
    if (st == ENG_STATUS_OK) fd->n = n;
    /* the first batch, kept for the check */
    if (st == ENG_STATUS_OK) st = run_rows(c, s, nin, names, cols, feed, 0, a, outs);
    double bytes = 0;
    for (int i = 0; st == ENG_STATUS_OK && i < nout; i++) {
        const char *vn = g->values[g->outputs[i]].name;
        if (!row_major(c, vn, &outs[i], a)) goto done;
        first[i] = outs[i];
        first[i].data = NULL;
        size_t nb = 0;
        st = eng_tensor_nbytes_checked(&first[i], vn, &nb);
        if (st == ENG_STATUS_OK && !(first[i].data = eng_alloc(nb ? nb : 1)))
            st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
        if (st == ENG_STATUS_OK) memcpy(first[i].data, outs[i].data, nb);
        bytes += (double)nb / (double)a * (double)n;
    }
    if (st == ENG_STATUS_OK && bytes > (double)TRN_FROZEN_MAX_BYTES) {
        fz_why(c, "the features would take %.0f MiB, over the limit of %lld MiB", bytes / 1048576.0,
               (long long)(TRN_FROZEN_MAX_BYTES >> 20));
        goto done;
    }
    /* the last rows of the first batch again, inside the next batch (of the same size where the data allows: no
     * second plan): rows [h, h + m), of which [h, a) are in both and the others are kept. One example per batch
     * (a == 1): nothing to mix. */
    int64_t h = a > 4 ? a - 4 : 1, m = n - h < a ? n - h : a;
    if (st == ENG_STATUS_OK && a >= 2) st = run_rows(c, s, nin, names, cols, feed, h, m, outs);
    for (int i = 0; st == ENG_STATUS_OK && a >= 2 && i < nout; i++) {
        const char *vn = g->values[g->outputs[i]].name;
        double mag, diff;
        if (!row_major(c, vn, &outs[i], m)) goto done;
        compare_rows(&first[i], h, &outs[i], 0, a - h, &mag, &diff);
        if (!(diff <= FZ_TOL * (mag > 1e-30 ? mag : 1e-30))) {
            fz_why(c, "the frozen layers mix examples: value '%s' moves by %.3g (largest value %.3g) when the batch "
                   "around a row changes", vn, diff, mag);
            goto done;
        }
    }
    /* every example, batch by batch; the first batch is already there */
    for (int i = 0; st == ENG_STATUS_OK && i < nout; i++) {
        eng_data_column *col = &fd->cols[fd->ncols];
        col->t = first[i];
        col->t.dims[0] = n;
        col->t.data = NULL;
        size_t nb = 0;
        st = eng_tensor_nbytes_checked(&col->t, g->values[g->outputs[i]].name, &nb);
        if (st == ENG_STATUS_OK && !(col->name = strdup(g->values[g->outputs[i]].name)))
            st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
        if (st == ENG_STATUS_OK && !(col->t.data = eng_alloc(nb ? nb : 1)))
            st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory for the frozen features (%zu bytes)", nb);
        if (col->name) fd->ncols++;
        if (st == ENG_STATUS_OK) memcpy(col->t.data, first[i].data, eng_tensor_nbytes(&first[i]));
    }
    for (int i = 0; st == ENG_STATUS_OK && a >= 2 && h + m > a && i < nout; i++) /* the check batch's new rows */
        st = store_rows(fd, i, &outs[i], a - h, a, h + m - a);
    /* the rest in batches of a; the last one ends at n, overlapping rows already done rather than compiling a plan
     * for a smaller batch */
    for (int64_t r0 = a >= 2 ? h + m : a; st == ENG_STATUS_OK && r0 < n; r0 += a) {
        int64_t rows = n - r0 < a ? n - r0 : a, start = r0 + rows - a;
        st = run_rows(c, s, nin, names, cols, feed, start, a, outs);
        for (int i = 0; st == ENG_STATUS_OK && i < nout; i++) st = store_rows(fd, i, &outs[i], r0 - start, r0, rows);
    }
    if (st == ENG_STATUS_OK) {
        c->ftrain = fd;
        fd = NULL;
        c->frozen.bytes = bytes;
        *ok = 1;
    }
done:
    for (int i = 0; first && i < nout; i++) eng_free(first[i].data);
    free(first);
    free(feed);
    free(outs);
    eng_dataset_free(&fd);
    eng_session_free(&s);
    return st;
}

/* Initializers no node of g reads any more (the frozen layers' weights once F has left the graph). */
static void drop_unread_inits(eng_graph *g) {
    unsigned char *read = calloc((size_t)g->nvalues + 1, 1);
    if (!read) return; /* they only cost memory */
    for (int n = 0; n < g->nnodes; n++)
        for (int i = 0; i < g->nodes[n].nin; i++)
            if (g->nodes[n].inputs[i] >= 0) read[g->nodes[n].inputs[i]] = 1;
    for (int i = 0; i < g->noutputs; i++) read[g->outputs[i]] = 1;
    for (int i = 0; i < g->ninputs; i++) read[g->inputs[i]] = 1;
    for (int v = 0; v < g->nvalues; v++)
        if (!read[v] && g->values[v].init) eng_value_set_init(g, v, NULL);
    free(read);
}

/* Append a copy of c->train's column `col` to c->ftrain; its index in *out. */
static eng_status copy_column(trn_ctx *c, int col, int *out) {
    eng_dataset *d = c->ftrain;
    int have = eng_dataset_find(d, c->train->cols[col].name);
    if (have >= 0) {
        *out = have;
        return ENG_STATUS_OK;
    }
    eng_data_column *cols = realloc(d->cols, ((size_t)d->ncols + 1) * sizeof *cols);
    if (!cols) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    d->cols = cols;
    const eng_data_column *src = &c->train->cols[col];
    eng_data_column *dst = &d->cols[d->ncols];
    size_t nb = eng_tensor_nbytes(&src->t);
    dst->t = src->t;
    dst->name = strdup(src->name);
    dst->t.data = eng_alloc(nb ? nb : 1);
    if (!dst->name || !dst->t.data) {
        free(dst->name);
        eng_free(dst->t.data);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    memcpy(dst->t.data, src->t.data, nb);
    *out = d->ncols++;
    return ENG_STATUS_OK;
}

eng_status trn_frozen_features(trn_ctx *c, eng_graph *gt) {
    const eng_train_opts *o = c->o;
    double t0 = trn_now();
    if (o->nfreeze == 0) return ENG_STATUS_OK;
    if (o->no_cache_frozen) {
        fz_why(c, "turned off (cache_frozen false)");
        return ENG_STATUS_OK;
    }
    int64_t epoch_steps = o->batch_size > 0 ? (c->train->n + o->batch_size - 1) / o->batch_size : 0;
    if (o->max_steps > 0 && o->max_steps < epoch_steps) {
        fz_why(c, "the job runs fewer steps (%lld) than one epoch (%lld)", (long long)o->max_steps,
               (long long)epoch_steps);
        return ENG_STATUS_OK;
    }
    unsigned char *frozen = calloc((size_t)gt->nnodes + 1, 1), *bound = calloc((size_t)gt->nvalues + 1, 1);
    const char **names = calloc((size_t)c->ninputs + 1, sizeof *names);
    int *cols = calloc((size_t)c->ninputs + 1, sizeof *cols);
    int nf = 0, nb = 0, nin = 0, ok = 0;
    eng_status st = frozen && bound && names && cols ? ENG_STATUS_OK : eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    if (st == ENG_STATUS_OK) st = analyse(c, gt, frozen, bound, &nf, &nb);
    if (st == ENG_STATUS_OK && (nf == 0 || nb == 0)) fz_why(c, "no frozen layer reads the data");
    for (int i = 0; st == ENG_STATUS_OK && nb > 0 && i < c->ninputs; i++)
        if (input_read(c, gt, frozen, 1, i)) names[nin] = c->input_names[i], cols[nin++] = c->input_col[i];
    if (st == ENG_STATUS_OK && nf > 0 && nb > 0) {
        /* F: the frozen nodes, the model inputs they read, the boundary values as outputs */
        eng_graph *gf = eng_graph_clone(gt);
        if (!gf) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
        if (st == ENG_STATUS_OK) {
            keep_nodes(gf, frozen, 0);
            gf->ninputs = gf->noutputs = 0;
            for (int i = 0; i < nin; i++) gf->inputs[gf->ninputs++] = eng_graph_find_value(gf, names[i]);
            free(gf->outputs);
            if (!(gf->outputs = malloc((size_t)nb * sizeof *gf->outputs))) {
                eng_graph_free(&gf);
                st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
            }
        }
        for (int v = 0; st == ENG_STATUS_OK && v < gt->nvalues; v++)
            if (bound[v]) gf->outputs[gf->noutputs++] = v;
        if (st == ENG_STATUS_OK) st = compute(c, gf, nin, names, cols, &ok);
        if (st != ENG_STATUS_OK) { /* the whole graph may still train: say why and run it every step */
            fz_why(c, "the frozen layers could not run alone: %s", eng_last_error());
            st = ENG_STATUS_OK;
            ok = 0;
        }
    }
    if (st == ENG_STATUS_OK && ok) {
        /* G: the training graph without F, reading the boundary values and the inputs its own nodes read */
        int ntin = 0;
        const char **tn = calloc((size_t)(nb + c->ninputs) + 1, sizeof *tn);
        int *tc = calloc((size_t)(nb + c->ninputs) + 1, sizeof *tc);
        int *in = malloc(((size_t)gt->ninputs + nb + 1) * sizeof *in), nnew = 0;
        if (!tn || !tc || !in) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
        for (int i = 0; st == ENG_STATUS_OK && i < c->ftrain->ncols; i++) {
            int v = eng_graph_find_value(gt, c->ftrain->cols[i].name);
            eng_value *val = &gt->values[v];
            const eng_tensor *t = &c->ftrain->cols[i].t;
            val->dtype = t->dtype;
            val->ndim = t->ndim;
            for (int d = 0; d < t->ndim; d++) val->dims[d] = d == 0 ? -1 : t->dims[d];
            in[nnew++] = v;
            tc[ntin] = i;
            if (!(tn[ntin++] = strdup(val->name))) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
        }
        for (int i = 0; st == ENG_STATUS_OK && i < gt->ninputs; i++) {
            int keep = 1;
            for (int k = 0; k < c->ninputs; k++)
                if (!strcmp(gt->values[gt->inputs[i]].name, c->input_names[k]))
                    keep = input_read(c, gt, frozen, 0, k);
            if (keep) in[nnew++] = gt->inputs[i];
        }
        for (int k = 0; st == ENG_STATUS_OK && k < c->ninputs; k++)
            if (input_read(c, gt, frozen, 0, k)) {
                if (!(tn[ntin] = strdup(c->input_names[k]))) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
                if (st == ENG_STATUS_OK) st = copy_column(c, c->input_col[k], &tc[ntin]);
                ntin++;
            }
        int lab = -1;
        if (st == ENG_STATUS_OK) st = copy_column(c, c->label_col, &lab);
        if (st == ENG_STATUS_OK) {
            keep_nodes(gt, frozen, 1);
            drop_unread_inits(gt);
        }
        if (st == ENG_STATUS_OK) {
            free(gt->inputs);
            gt->inputs = in;
            gt->ninputs = nnew;
            in = NULL;
            c->feed_train = (trn_feedmap){.n = ntin, .names = tn, .col = tc, .label_col = lab};
            tn = NULL;
            tc = NULL;
            c->frozen.cached = 1;
            c->frozen.tensors = nb;
            if (c->ftrain->source == NULL) c->ftrain->source = strdup("frozen features");
        }
        if (st != ENG_STATUS_OK) eng_dataset_free(&c->ftrain); /* gt and the feed map are unchanged */
        for (int i = 0; tn && i < ntin; i++) free((char *)tn[i]);
        free(tn);
        free(tc);
        free(in);
    }
    c->frozen.seconds = trn_now() - t0;
    if (st == ENG_STATUS_OK && o->progress) {
        if (c->frozen.cached)
            fprintf(stderr, "frozen layers: %d value%s per example (%.1f MiB for %lld examples) computed once in %.1f s; "
                    "the steps run the trained layers only\n", c->frozen.tensors, c->frozen.tensors == 1 ? "" : "s",
                    c->frozen.bytes / 1048576.0, (long long)c->train->n, c->frozen.seconds);
        else
            fprintf(stderr, "frozen layers run every step: %s\n", c->frozen.why);
    }
    free(frozen);
    free(bound);
    free(names);
    free(cols);
    return st;
}
