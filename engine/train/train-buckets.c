/* train-buckets.c - device-resident replicas all-reduce their gradients in buckets while the backward pass runs, as
 * PyTorch DDP and Horovod do.
 *
 * The trainer groups the parameters that have a training-graph output (gradients, and BatchNorm running statistics,
 * which are all-reduced like them) into buckets of about o->bucket_mb MB, in the order their outputs become final:
 * by the position, in the training graph's topological order, of the last node that writes or reads the output (the
 * backward pass makes the last layer's gradients first). A bucket closes once it holds at least the cap (DDP's rule;
 * a parameter larger than the cap is a bucket of its own). The buckets come from the graph and the options alone, so
 * they are the same on every rank (replica thread or process).
 *
 * During a replica's run its plan reports outputs as they become final (eng_plan_opts.on_ready, right after the
 * kernels of the last step touching them were queued on the plan's context). When bucket b's last output is in and
 * every bucket before b was sent, the replica records an event on the plan's context; its communication context
 * (one per replica, on the same device) waits for it and runs the bucket's all-reduces as one group
 * (krn_comm_allreduce_many: ncclGroupStart / End on CUDA), while the plan's context goes on with the backward pass.
 * After the run (trn_buckets_finish) the replica sends what is left, records `done` on the communication context and
 * makes its compute context wait for it before the optimizer update.
 *
 * Invariant: every rank sends every bucket, in bucket order, once per step, whatever happened to it: a bucket waits
 * for the ones before it; a replica that failed mid-run (or ran no rows) sends its unsent buckets with zeros
 * (trn_dev_zeros) after its run, and each all-reduce is prescaled by the replica's share of the batch, as
 * trn_dev_update does without buckets. So the collectives meet on every rank in one order, and nothing hangs.
 * Loss scaling with gradient accumulation takes the host path (train-device.c), which has no buckets.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train-impl.h"
#include "../../kernels/backend-impl.h" /* krn_sim_stats for the closing log line */

struct trn_buckets {
    int n;             /* buckets per step */
    int *start;        /* n + 1: bucket b holds order[start[b] .. start[b + 1]) */
    int *order;        /* parameter indices, in the order their outputs become final */
    int *of_out;       /* per training-graph output: its bucket, or -1 */
    int *param_of_out; /* per training-graph output: its parameter, or -1 */
    int noutputs;
    int maxcount;      /* parameters in the largest bucket */
    double cap;        /* bytes */
};

struct trn_bucket_rep {
    krn_ctx *cctx;     /* the communication context (stream) */
    krn_event *ev;     /* recorded on the plan's context when a bucket is complete */
    krn_event *done;   /* recorded on cctx after the step's last bucket */
    int *left;         /* per bucket: outputs not reported yet in this run */
    int next;          /* the next bucket to send */
    int running;       /* between trn_buckets_begin and trn_buckets_finish */
    float share;       /* the replica's share of the batch (prescale) */
    eng_status st;     /* the step's first error in a collective or an event */
    char err[512];
    float **bufs;      /* maxcount: one bucket's buffers and sizes */
    size_t *ns;
    int64_t sent, during;
};

static eng_status bk_oom(void) { return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory for the gradient buckets"); }

static int is_identity(const eng_node *n) { return n->nin == 1 && n->nout == 1 && !strcmp(n->op_type, "Identity"); }

/* Per training-graph output: the topological position of the last node writing or reading it (INT_MAX: none), an
 * Identity naming it (autodiff's grad/<p>, an alias in the plan: no work) followed back to the value it names. */
static eng_status ready_keys(const eng_graph *g, int *key) {
    int *order = malloc(((size_t)g->nnodes + 1) * sizeof *order), *last = malloc(((size_t)g->nvalues + 1) * sizeof *last);
    int *src = malloc(((size_t)g->nvalues + 1) * sizeof *src);
    eng_status st = order && last && src ? eng_graph_topo_order(g, order) : bk_oom();
    for (int v = 0; st == ENG_STATUS_OK && v < g->nvalues; v++) last[v] = -1, src[v] = v;
    for (int i = 0; st == ENG_STATUS_OK && i < g->nnodes; i++) {
        const eng_node *n = &g->nodes[order[i]];
        if (is_identity(n)) {
            if (n->inputs[0] >= 0 && n->outputs[0] >= 0) src[n->outputs[0]] = src[n->inputs[0]];
            continue;
        }
        for (int j = 0; j < n->nin; j++)
            if (n->inputs[j] >= 0) last[src[n->inputs[j]]] = i;
        for (int j = 0; j < n->nout; j++)
            if (n->outputs[j] >= 0) last[src[n->outputs[j]]] = i;
    }
    for (int o = 0; st == ENG_STATUS_OK && o < g->noutputs; o++) {
        int v = src[g->outputs[o]];
        key[o] = last[v] >= 0 ? last[v] : INT_MAX;
    }
    free(order);
    free(last);
    free(src);
    return st;
}

static eng_status buckets_build(trn_ctx *c, const eng_graph *g, trn_buckets *bk) {
    int np = c->nparams, no = g->noutputs;
    int *key = malloc(((size_t)no + 1) * sizeof *key);
    bk->start = malloc(((size_t)np + 2) * sizeof *bk->start);
    bk->order = malloc(((size_t)np + 1) * sizeof *bk->order);
    bk->of_out = malloc(((size_t)no + 1) * sizeof *bk->of_out);
    bk->param_of_out = malloc(((size_t)no + 1) * sizeof *bk->param_of_out);
    if (!key || !bk->start || !bk->order || !bk->of_out || !bk->param_of_out) {
        free(key);
        return bk_oom();
    }
    eng_status st = ready_keys(g, key);
    if (st != ENG_STATUS_OK) {
        free(key);
        return eng_err_prefix(st, "gradient buckets: ");
    }
    bk->noutputs = no;
    for (int o = 0; o < no; o++) bk->of_out[o] = bk->param_of_out[o] = -1;
    int m = 0;
    for (int k = 0; k < np; k++) { /* stable insertion by (key, parameter index) */
        int o = c->params[k].out;
        if (o < 0 || o >= no) continue;
        int j = m++;
        while (j > 0 && key[c->params[bk->order[j - 1]].out] > key[o]) {
            bk->order[j] = bk->order[j - 1];
            j--;
        }
        bk->order[j] = k;
    }
    free(key);
    double bytes = 0;
    int open = 0;
    bk->n = 0;
    bk->maxcount = 0;
    for (int i = 0; i < m; i++) {
        const trn_param *p = &c->params[bk->order[i]];
        if (!open) bk->start[bk->n] = i, open = 1;
        bytes += (double)p->n * sizeof(float);
        bk->of_out[p->out] = bk->n;
        bk->param_of_out[p->out] = bk->order[i];
        if (bytes >= bk->cap || i == m - 1) {
            int cnt = i + 1 - bk->start[bk->n];
            if (cnt > bk->maxcount) bk->maxcount = cnt;
            bk->n++;
            bytes = 0;
            open = 0;
        }
    }
    bk->start[bk->n] = m;
    return ENG_STATUS_OK;
}

eng_status trn_buckets_new(trn_ctx *c) {
    if (c->bk || !c->dev || !c->dcomm || c->o->bucket_mb < 0) return ENG_STATUS_OK;
    trn_buckets *bk = calloc(1, sizeof *bk);
    if (!bk) return bk_oom();
    c->bk = bk;
    bk->cap = (c->o->bucket_mb > 0 ? c->o->bucket_mb : 25.0) * 1e6;
    ENG_TRY(buckets_build(c, eng_session_graph(c->reps[0].s), bk));
    for (int r = 0; r < c->R; r++) {
        trn_replica *rp = &c->reps[r];
        trn_bucket_rep *q = rp->bq = calloc(1, sizeof *q);
        if (!q || !(q->left = calloc((size_t)bk->n + 1, sizeof *q->left)) ||
            !(q->bufs = calloc((size_t)bk->maxcount + 1, sizeof *q->bufs)) ||
            !(q->ns = calloc((size_t)bk->maxcount + 1, sizeof *q->ns)))
            return bk_oom();
        eng_session_opts o = {0};
        ENG_TRY(trn_replica_device(c->o, r, &o));
        eng_status st = krn_ctx_new(c->dev, o.device, &q->cctx);
        if (st == ENG_STATUS_OK) st = krn_event_new(c->dev, q->cctx, &q->ev);
        if (st == ENG_STATUS_OK) st = krn_event_new(c->dev, q->cctx, &q->done);
        if (st != ENG_STATUS_OK) return eng_err_prefix(st, "replica %d, the gradient buckets' context: ", r);
    }
    if (c->wrank == 0) {
        char first[256] = "";
        size_t k = 0;
        for (int i = bk->start[0]; bk->n > 0 && i < bk->start[1] && k < sizeof first - 1; i++)
            k += (size_t)snprintf(first + k, sizeof first - k, "%s'%s'", i > bk->start[0] ? ", " : "",
                                  c->params[bk->order[i]].name);
        fprintf(stderr, "tensord: gradient buckets: %d per step of about %g MB, sent while the backward pass runs "
                "(the first: %s)\n", bk->n, bk->cap / 1e6, first);
    }
    return ENG_STATUS_OK;
}

static void note(trn_bucket_rep *q, eng_status st) {
    if (st == ENG_STATUS_OK || q->st != ENG_STATUS_OK) return;
    q->st = st;
    snprintf(q->err, sizeof q->err, "%s", eng_last_error());
}

/* Send bucket q->next: after the work queued on ctx (NULL: that work is complete), with this replica's gradients
 * (have) or zeros. Every call is made whatever failed before; failures are noted. */
static void send_next(trn_ctx *c, trn_replica *rp, krn_ctx *ctx, int have) {
    const trn_buckets *bk = c->bk;
    trn_bucket_rep *q = rp->bq;
    int b = q->next++, cnt = 0;
    if (ctx) {
        eng_status st = krn_event_record(c->dev, ctx, q->ev);
        if (st == ENG_STATUS_OK) st = krn_event_wait(c->dev, q->cctx, q->ev);
        if (st != ENG_STATUS_OK) note(q, eng_err_prefix(st, "replica %d, gradient bucket %d: ", rp->rank, b + 1));
    }
    for (int i = bk->start[b]; i < bk->start[b + 1]; i++) {
        int k = bk->order[i];
        void *buf = have ? rp->gbuf[k] : NULL;
        if (!buf) {
            eng_status st = trn_dev_zeros(c, rp, k, &buf);
            if (st != ENG_STATUS_OK) note(q, st);
            rp->gbuf[k] = buf;
        }
        q->bufs[cnt] = buf;
        /* no buffer (out of device memory for the zeros): still make the call, of no floats (sim then fails the
         * all-reduce on every rank: the lengths differ) */
        q->ns[cnt++] = buf ? (size_t)c->params[k].n : 0;
    }
    eng_status st = krn_comm_allreduce_many(c->dev, c->dcomm, rp->rank, q->cctx, q->bufs, q->ns, cnt, q->share);
    if (st != ENG_STATUS_OK) note(q, eng_err_prefix(st, "replica %d, gradient bucket %d of %d: ", rp->rank, b + 1, bk->n));
    q->sent++;
    q->during += ctx != NULL;
}

void trn_buckets_begin(trn_ctx *c, trn_replica *rp) {
    trn_bucket_rep *q = rp->bq;
    if (!q) return;
    const trn_buckets *bk = c->bk;
    for (int b = 0; b < bk->n; b++) q->left[b] = bk->start[b + 1] - bk->start[b];
    for (int k = 0; k < c->nparams; k++) rp->gbuf[k] = NULL;
    q->next = 0;
    q->share = trn_replica_share(rp);
    q->st = ENG_STATUS_OK;
    q->err[0] = 0;
    q->running = 1;
}

void trn_buckets_ready(void *arg, krn_ctx *ctx, const int *idx, const eng_tensor *outs, int n) {
    trn_replica *rp = arg;
    trn_bucket_rep *q = rp->bq;
    trn_ctx *c = rp->c;
    if (!q || !q->running) return;
    const trn_buckets *bk = c->bk;
    for (int j = 0; j < n; j++) {
        int o = idx[j];
        if (o < 0 || o >= bk->noutputs || bk->of_out[o] < 0) continue;
        rp->gbuf[bk->param_of_out[o]] = outs[j].data;
        q->left[bk->of_out[o]]--;
    }
    while (q->next < bk->n && q->left[q->next] == 0) send_next(c, rp, ctx, 1);
}

eng_status trn_buckets_finish(trn_ctx *c, trn_replica *rp, int ok) {
    trn_bucket_rep *q = rp->bq;
    const trn_buckets *bk = c->bk;
    int have = ok && rp->rows > 0;
    q->running = 0;
    if (have) /* the outputs as the run returned them (the same memory the reports named) */
        for (int k = 0; k < c->nparams; k++)
            if (c->params[k].out >= 0) rp->gbuf[k] = rp->outs[c->params[k].out].data;
    while (q->next < bk->n) send_next(c, rp, NULL, have);
    eng_status st = krn_event_record(c->dev, q->cctx, q->done);
    if (st == ENG_STATUS_OK) st = krn_event_wait(c->dev, rp->dctx, q->done); /* the update after the last bucket */
    if (st != ENG_STATUS_OK) note(q, eng_err_prefix(st, "replica %d, after the gradient buckets: ", rp->rank));
    return q->st == ENG_STATUS_OK ? ENG_STATUS_OK : eng_err(q->st, "%s", q->err);
}

void trn_buckets_counts(const trn_ctx *c, int *nbuckets, int64_t *sent, int64_t *during) {
    *nbuckets = c->bk ? c->bk->n : 0;
    *sent = *during = 0;
    for (int r = 0; c->bk && c->reps && r < c->R; r++)
        if (c->reps[r].bq) *sent += c->reps[r].bq->sent, *during += c->reps[r].bq->during;
}

void trn_buckets_free(trn_ctx *c) {
    trn_buckets *bk = c->bk;
    if (!bk) return;
    int nb;
    int64_t sent, during;
    trn_buckets_counts(c, &nb, &sent, &during);
    if (c->wrank == 0 && sent > 0) {
        char sim[128] = "";
        if (c->dev == krn_backend_sim()) {
            krn_sim_stats s;
            krn_sim_stats_get(&s);
            snprintf(sim, sizeof sim, " (sim: %ld of %ld groups overlapped the compute context's kernels)", s.overlapped,
                     s.groups);
        }
        fprintf(stderr, "tensord: gradient buckets: %lld sent by %d replicas, %lld of them while the backward pass ran%s\n",
                (long long)sent, c->R, (long long)during, sim);
    }
    for (int r = 0; c->reps && r < c->R; r++) {
        trn_bucket_rep *q = c->reps[r].bq;
        if (!q) continue;
        if (q->cctx) (void)krn_ctx_sync(c->dev, q->cctx);
        krn_event_free(c->dev, &q->ev);
        krn_event_free(c->dev, &q->done);
        krn_ctx_free(c->dev, &q->cctx);
        free(q->left);
        free(q->bufs);
        free(q->ns);
        free(q);
        c->reps[r].bq = NULL;
    }
    free(bk->start);
    free(bk->order);
    free(bk->of_out);
    free(bk->param_of_out);
    free(bk);
    c->bk = NULL;
}
