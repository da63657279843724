/* train-loop.c - one training step over R data-parallel replicas, validation, and the progress bar.
 *
 * A step: the batch is cut into R contiguous shards (sizes differ by at most one row; a shard may be empty
 * when the batch has fewer than R rows). Replica r runs its own session on its shard and packs its outputs
 * into one float buffer: [grad of each trainable param | BatchNorm updates | loss | accuracy], each scaled by
 * rows_r * R / B so that the all-reduce MEAN is the row-weighted mean, i.e. exactly the full-batch mean that
 * one replica would compute. One all-reduce per step (summation in rank order: deterministic). The calling
 * thread is rank 0; it applies the optimizer to the shared weight buffers after joining the others, so every
 * replica reads the same weights next step.
 *
 * Several processes (c->W > 1, an MPI job): every process loads the same global batch; process k's replica r takes
 * shard k*R + r of W*R (scaled by rows * W*R / B), and after the local all-reduce rank 0's pack is averaged across
 * the processes, so every process applies the same update to the same weights.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "train-impl.h"


double trn_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int find_output(const eng_graph *g, const char *name) {
    for (int i = 0; i < g->noutputs; i++)
        if (strcmp(g->values[g->outputs[i]].name, name) == 0) return i;
    return -1;
}

/* names/feed arrays: the graph's data inputs (m), "label", then every state tensor (weights are always fed), then
 * (training graph with loss scaling) the loss scale. */
static eng_status feed_init(trn_ctx *c, int training, int *nfeed, const char ***names, eng_tensor **feed) {
    const trn_feedmap *m = training ? &c->feed_train : &c->feed_eval;
    int scaled = training && c->ls.mode != ENG_LOSS_SCALE_NONE;
    int n = m->n + 1 + c->nparams + scaled;
    *names = calloc((size_t)n, sizeof **names);
    *feed = calloc((size_t)n, sizeof **feed);
    if (!*names || !*feed) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; i < m->n; i++) (*names)[i] = m->names[i];
    (*names)[m->n] = "label";
    for (int i = 0; i < c->nparams; i++) {
        (*names)[m->n + 1 + i] = c->params[i].name;
        (*feed)[m->n + 1 + i] = c->params[i].t;
    }
    if (scaled) {
        (*names)[n - 1] = TRN_LOSS_SCALE_INPUT;
        (*feed)[n - 1] = (eng_tensor){.dtype = ENG_DTYPE_F32, .ndim = 0, .data = &c->ls_value};
    }
    *nfeed = n;
    return ENG_STATUS_OK;
}

/* Point the data entries of feed at rows [row0, row0 + rows) of the batch (columns by m). */
static void feed_rows(const trn_feedmap *m, eng_tensor *feed, const eng_batch *b, int64_t row0, int64_t rows) {
    for (int i = 0; i <= m->n; i++)
        feed[i] = eng_tensor_rows(&b->cols[i < m->n ? m->col[i] : m->label_col], row0, rows);
}

eng_status trn_replica_device(const eng_train_opts *o, int r, eng_session_opts *so) {
    so->backend = NULL;
    so->device = 0;
    if (o->ndevices <= 0) return ENG_STATUS_OK;
    const char *d = o->devices[r % o->ndevices];
    eng_status st = krn_backend_by_name(d, &so->backend, &so->device);
    return st == ENG_STATUS_OK ? st : eng_err_prefix(st, "replica %d: ", r);
}

eng_status trn_replicas_new(trn_ctx *c, eng_graph *gt) {
    c->reps = calloc((size_t)c->R, sizeof *c->reps);
    if (!c->reps) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    /* output indices, the same in every clone */
    int loss_out = find_output(gt, c->loss_name);
    if (loss_out < 0) return eng_err(ENG_STATUS_INTERNAL, "training graph has no output '%s'", c->loss_name);
    int acc_out = find_output(gt, "metric/accuracy");
    char nm[4200];
    int64_t off = 0;
    for (int i = 0; i < c->nparams; i++) {
        trn_param *p = &c->params[i];
        snprintf(nm, sizeof nm, "%s/%s", p->is_bn ? "bn_update" : "grad", p->name);
        p->out = find_output(gt, nm);
        if (p->out < 0 && !p->is_bn) return eng_err(ENG_STATUS_INTERNAL, "training graph has no output '%s'", nm);
        p->off = off;
        off += p->n;
    }
    c->pack_n = off + 2;
    int hw = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (hw < 1) hw = 1;
    if (c->W > 1) { /* the processes of a job on one host share its cores */
        const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
        int local = ls && atoi(ls) > 0 ? atoi(ls) : 1;
        hw = hw / local > 0 ? hw / local : 1;
    }
    eng_session_opts so = {.nthreads = c->o->nthreads > 0 ? c->o->nthreads : (hw / c->R > 0 ? hw / c->R : 1),
                           .no_fuse = 0, .precision = c->o->precision};
    if (c->o->precision != ENG_PRECISION_FP32) {
        ENG_TRY(trn_output_layer_nodes(gt, c->pred, &c->fp32_train));
        so.fp32_nodes = (const char *const *)c->fp32_train.names;
        so.nfp32_nodes = c->fp32_train.n;
    }
    ENG_TRY(trn_dev_plan(c, gt, &so)); /* device-resident weights (train-device.c): the sessions' masks */
    for (int r = 0; r < c->R; r++) {
        trn_replica *rp = &c->reps[r];
        rp->c = c;
        rp->rank = r;
        ENG_TRY(trn_replica_device(c->o, r, &so));
        if (c->dev && c->o->bucket_mb >= 0) { /* gradient buckets (train-buckets.c): the plan reports finished outputs */
            so.on_ready = trn_buckets_ready;
            so.ready_arg = rp;
        }
        eng_graph *g = eng_graph_clone(gt);
        if (!g) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory cloning the training graph");
        ENG_TRY(eng_session_new_graph(g, &so, &rp->s));
        ENG_TRY(feed_init(c, 1, &rp->nfeed, &rp->names, &rp->feed));
        rp->outs = calloc((size_t)gt->noutputs + 1, sizeof *rp->outs);
        rp->pack = eng_alloc((size_t)c->pack_n * sizeof(float));
        if (!rp->outs || !rp->pack) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    for (int r = 0; r < c->R; r++) {
        c->reps[r].loss_out = loss_out;
        c->reps[r].acc_out = acc_out;
    }
    return ENG_STATUS_OK;
}

void trn_replicas_free(trn_ctx *c) {
    trn_dev_free(c); /* after the optimizer (train.c ctx_free): its state may live on rank 0's context */
    if (!c->reps) return;
    for (int r = 0; r < c->R; r++) {
        trn_replica *rp = &c->reps[r];
        eng_session_free(&rp->s);
        free(rp->names);
        free(rp->feed);
        free(rp->outs);
        eng_free(rp->pack);
    }
    free(c->reps);
    c->reps = NULL;
}

/* Device-resident mode: run the shard, then (every rank, whatever happened) the device update (train-device.c). */
static eng_status replica_run_dev(trn_replica *rp) {
    trn_ctx *c = rp->c;
    eng_status st = ENG_STATUS_OK;
    rp->loss = rp->acc = 0;
    trn_buckets_begin(c, rp); /* gradient buckets: sent from inside the run (trn_buckets_ready) */
    if (rp->rows > 0) {
        feed_rows(&c->feed_train, rp->feed, rp->b, rp->row0, rp->rows);
        st = eng_session_run(rp->s, rp->nfeed, rp->names, rp->feed, rp->outs);
        if (st == ENG_STATUS_OK) {
            rp->loss = rp->loss_out >= 0 ? eng_tensor_get_f64(&rp->outs[rp->loss_out], 0) : NAN;
            rp->acc = rp->acc_out >= 0 ? eng_tensor_get_f64(&rp->outs[rp->acc_out], 0) : NAN;
        }
    }
    if (st != ENG_STATUS_OK) snprintf(rp->err, sizeof rp->err, "%s", eng_last_error());
    eng_status s2 = trn_dev_update(c, rp, st == ENG_STATUS_OK);
    if (st == ENG_STATUS_OK && s2 != ENG_STATUS_OK) {
        st = s2;
        snprintf(rp->err, sizeof rp->err, "%s", eng_last_error());
    }
    rp->st = st;
    return st;
}

static eng_status replica_run(trn_replica *rp) {
    trn_ctx *c = rp->c;
    if (c->dev) return replica_run_dev(rp);
    const eng_graph *g = eng_session_graph(rp->s);
    float *pack = rp->pack;
    eng_status st = ENG_STATUS_OK;
    rp->direct = c->R == 1 && c->W == 1 && rp->rows > 0;
    if (!rp->direct) memset(pack, 0, (size_t)c->pack_n * sizeof(float));
    if (rp->rows > 0) {
        feed_rows(&c->feed_train, rp->feed, rp->b, rp->row0, rp->rows);
        st = eng_session_run(rp->s, rp->nfeed, rp->names, rp->feed, rp->outs);
        if (st == ENG_STATUS_OK) {
            float scale = (float)((double)rp->rows * c->R * c->W / (double)rp->b->rows);
            for (int i = 0; i < c->nparams && st == ENG_STATUS_OK; i++) {
                const trn_param *p = &c->params[i];
                if (p->out < 0) continue;
                const eng_tensor *o = &rp->outs[p->out];
                if (o->dtype != ENG_DTYPE_F32 || eng_tensor_numel(o) != p->n) {
                    st = eng_err(ENG_STATUS_INTERNAL, "output '%s' has %lld elements of %s, expected %lld float32",
                                 g->values[g->outputs[p->out]].name, (long long)eng_tensor_numel(o),
                                 eng_dtype_name(o->dtype), (long long)p->n);
                    break;
                }
                if (rp->direct) continue;
                const float *src = o->data;
                float *dst = pack + p->off;
                if (scale == 1.0f) memcpy(dst, src, (size_t)p->n * sizeof(float));
                else
                    for (int64_t k = 0; k < p->n; k++) dst[k] = src[k] * scale;
            }
            int lo = rp->loss_out, ao = rp->acc_out;
            if (st == ENG_STATUS_OK) {
                pack[c->pack_n - 2] = lo >= 0 ? (float)eng_tensor_get_f64(&rp->outs[lo], 0) * scale : NAN;
                pack[c->pack_n - 1] = ao >= 0 ? (float)eng_tensor_get_f64(&rp->outs[ao], 0) * scale : NAN;
            }
        }
    }
    if (st != ENG_STATUS_OK) snprintf(rp->err, sizeof rp->err, "%s", eng_last_error());
    if (c->R > 1) {
        eng_status s2 = eng_comm_allreduce(c->comm, rp->rank, pack, c->pack_n, 1);
        if (st == ENG_STATUS_OK && s2 != ENG_STATUS_OK) {
            st = s2;
            snprintf(rp->err, sizeof rp->err, "%s", eng_last_error());
        }
    }
    rp->st = st;
    return st;
}

static void *replica_thread(void *arg) {
    replica_run(arg);
    return NULL;
}

static eng_status diverged(const trn_ctx *c, double scale) {
    return eng_err(ENG_STATUS_INVALID_ARGUMENT, "gradients are not finite at loss scale %g (%s loss scaling): training "
                   "diverged; try a lower learning rate or check the data", scale,
                   c->ls.mode == ENG_LOSS_SCALE_FIXED ? "fixed" : "dynamic");
}

eng_status trn_step(trn_ctx *c, const eng_batch *b, double *loss, double *acc) {
    int R = c->R, S = R * c->W; /* shards of the global batch: W processes x R replicas */
    int64_t B = b->rows, base = B / S, extra = B % S;
    for (int r = 0; r < R; r++) {
        trn_replica *rp = &c->reps[r];
        int64_t g = (int64_t)c->wrank * R + r; /* this replica's shard */
        rp->b = b;
        rp->row0 = g * base + (g < extra ? g : extra);
        rp->rows = base + (g < extra ? 1 : 0);
        rp->err[0] = 0;
    }
    c->ls_value = eng_loss_scaler_value(&c->ls);
    ENG_TRY(trn_buckets_new(c)); /* once, before the first step's replicas start (nothing without buckets) */
    pthread_t th[256];
    int started = 0;
    eng_status st = ENG_STATUS_OK;
    for (int r = 1; r < R; r++) {
        if (pthread_create(&th[r], NULL, replica_thread, &c->reps[r]) != 0) {
            /* cannot happen in practice; the all-reduce would deadlock without this rank, so stop here */
            for (int k = 1; k < r; k++) pthread_join(th[k], NULL);
            return eng_err(ENG_STATUS_INTERNAL, "cannot start replica thread %d", r);
        }
        started++;
    }
    replica_run(&c->reps[0]);
    for (int r = 1; r <= started; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < R; r++)
        if (c->reps[r].st != ENG_STATUS_OK) {
            return eng_err(c->reps[r].st, "%s%s", R > 1 ? "replica: " : "", c->reps[r].err);
        }
    if (c->dev) { /* each replica has applied the update to its device copy */
        double l = 0, a = 0;
        for (int r = 0; r < R; r++) {
            double share = b->rows > 0 ? (double)c->reps[r].rows / (double)b->rows : 0;
            if (c->reps[r].rows > 0) l += c->reps[r].loss * share, a += c->reps[r].acc * share;
        }
        if (c->W > 1) ENG_TRY(trn_dev_world(c, &l, &a));
        *loss = l;
        *acc = a;
        c->dev_dirty = 1;
        double scale = c->ls.scale;
        return eng_loss_scaler_observe(&c->ls, c->reps[0].finite) < 0 ? diverged(c, scale) : ENG_STATUS_OK;
    }
    const trn_replica *r0 = &c->reps[0];
    float *pack = r0->pack;
    if (c->W > 1) ENG_TRY(eng_comm_allreduce(c->world, c->wrank, pack, c->pack_n, 1));
    *loss = pack[c->pack_n - 2];
    *acc = pack[c->pack_n - 1];
    if (!isfinite(*loss)) return ENG_STATUS_OK; /* the caller reports NaN with epoch/step */
    /* BatchNorm running statistics: replace with the (replica-averaged) updates */
    float *grads[c->ntrain > 0 ? c->ntrain : 1];
    float *params[c->ntrain > 0 ? c->ntrain : 1];
    int64_t ns[c->ntrain > 0 ? c->ntrain : 1];
    for (int i = 0; i < c->nparams; i++) {
        trn_param *p = &c->params[i];
        const float *src = r0->direct ? (p->out >= 0 ? (const float *)r0->outs[p->out].data : NULL) : pack + p->off;
        if (p->is_bn) {
            if (p->out >= 0) memcpy(p->w, src, (size_t)p->n * sizeof(float));
        } else {
            grads[i] = (float *)src;
            params[i] = p->w;
            ns[i] = p->n;
        }
    }
    double scale = c->ls.scale;
    int go = eng_loss_scaler_step(&c->ls, grads, ns, c->ntrain);
    if (go < 0) return diverged(c, scale);
    if (!go) return ENG_STATUS_OK; /* overflow: this step's update is skipped, the scale halved */
    int applied = 0;
    st = eng_optim_apply(c->optim, params, (const float *const *)grads, &applied);
    return st;
}

eng_status trn_validate(trn_ctx *c, double *loss, double *acc) {
    *loss = NAN;
    *acc = NAN;
    if (!c->val || !c->eval) return ENG_STATUS_OK;
    ENG_TRY(trn_weights_to_host(c)); /* the eval session reads the host copies */
    eng_loader_opts lo = {.batch_size = c->o->batch_size, .shuffle = 0, .seed = 0, .drop_remainder = 0, .prefetch = 0};
    eng_loader *l = NULL;
    ENG_TRY(eng_loader_new(c->val, &lo, &l));
    int nfeed = 0;
    const char **names = NULL;
    eng_tensor *feed = NULL;
    eng_status st = feed_init(c, 0, &nfeed, &names, &feed);
    const eng_graph *g = eng_session_graph(c->eval);
    eng_tensor *outs = calloc((size_t)g->noutputs + 1, sizeof *outs);
    if (!outs && st == ENG_STATUS_OK) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    double ls = 0, as = 0;
    int64_t rows = 0;
    while (st == ENG_STATUS_OK) {
        eng_batch b;
        int end = 0;
        st = eng_loader_next(l, &b, &end);
        if (st != ENG_STATUS_OK || end) break;
        feed_rows(&c->feed_eval, feed, &b, 0, b.rows);
        st = eng_session_run(c->eval, nfeed, names, feed, outs);
        if (st != ENG_STATUS_OK) break;
        ls += eng_tensor_get_f64(&outs[c->eval_loss_out], 0) * (double)b.rows;
        if (c->eval_acc_out >= 0) as += eng_tensor_get_f64(&outs[c->eval_acc_out], 0) * (double)b.rows;
        rows += b.rows;
    }
    if (st == ENG_STATUS_OK && rows > 0) {
        *loss = ls / (double)rows;
        *acc = c->eval_acc_out >= 0 ? as / (double)rows : NAN;
    }
    if (st != ENG_STATUS_OK) eng_err_prefix(st, "validation: ");
    free(outs);
    free(names);
    free(feed);
    eng_loader_free(&l);
    return st;
}

static void fmt_dur(double s, char *buf, size_t n) {
    if (!(s >= 0) || s > 1e7) {
        snprintf(buf, n, "?");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

void trn_progress(trn_ctx *c, int64_t step, double loss, double acc, double eps, int final) {
    if (!c->o->progress || c->wrank != 0) return;
    double now = trn_now();
    if (!final && now - c->last_draw < 0.1) return;
    c->last_draw = now;
    int64_t S = c->steps_per_epoch;
    char eta[32];
    fmt_dur(eps > 0 && S > step ? (double)(S - step) * (double)c->o->batch_size / eps : 0, eta, sizeof eta);
    char accs[32] = "";
    if (acc == acc) snprintf(accs, sizeof accs, "  acc %.4f", acc);
    fprintf(stderr, "\repoch %lld/%d  step %lld/%lld  loss %.4f%s  %.0f ex/s  ETA %s   ", (long long)c->st.epoch + 1,
            c->o->epochs, (long long)step, (long long)S, loss, accs, eps, eta);
    if (final) fputc('\n', stderr);
    fflush(stderr);
    c->progress_drawn = !final;
}
