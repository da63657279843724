/* train-device.c - training with the weights on the device (see train-impl.h).
 *
 * When every replica runs on a device of one backend (one replica, or several with the backend's collectives: NCCL
 * on CUDA) in one process, the trainer keeps each replica's weights in its device's
 * memory: the training session reads them there and leaves the gradients and BatchNorm updates there
 * (eng_session_opts.dev_inputs / dev_outputs: no copies per step but the batch and the loss). After its run each
 * replica, on its own thread, all-reduces its gradients in place on the device, each scaled by its share of the
 * batch (rows / B, so the sum is the full batch's mean gradient, as one replica would compute it), and applies the
 * update to its own copy with its own optimizer (eng_optim_apply_on: the optimizer kernels). Every replica applies
 * the same update to the same weights, so the copies stay equal and no weights travel. Rank 0's optimizer is the
 * trainer's (the one checkpoints save); the others are clones of its state. Across processes (mpirun, or the
 * TENSORD_COORDINATOR rendezvous), when the backend has multi-process collectives (NCCL; sim) ONE communicator spans
 * every process's replicas (global rank = process rank * R + r; krn_comm_new_ranks with an id made by rank 0 and
 * broadcast over the job's eng_comm), so each replica's all-reduce already covers the whole job and only the loss
 * and accuracy cross the job's eng_comm (trn_dev_world). Without them (a CUDA build without NCCL), each process
 * reduces its replicas on the device first, then rank 0's sums go through host memory and MPI and back to every
 * replica before the update (trn_dev_world); the coordinator refuses that path (gradients travel through NCCL or
 * MPI only). Loss scaling (mixed_fp16) stays on the
 * device too: the update unscales the gradients and skips itself when their norm overflowed, and the trainer's
 * scaler is told (eng_loss_scaler_observe); not with gradient accumulation (the host path then).
 *
 * With buckets (o->bucket_mb, train-buckets.c) the all-reduces are not left to the end of the run: each bucket of
 * gradients goes, on a communication context of the replica's, as soon as the backward pass has made it, and the
 * update waits for the last one.
 *
 * The host copies (trn_param.w) are refreshed from rank 0 by trn_weights_to_host when host code reads them, and
 * pushed to every replica by trn_weights_to_device after a resume (with the optimizer state).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train-impl.h"

eng_status trn_dev_plan(trn_ctx *c, const eng_graph *gt, eng_session_opts *so) {
    /* loss scaling with accumulation: an overflowed micro-step would leave its infinities in the accumulators */
    if (c->o->ndevices <= 0 || (c->ls.mode != ENG_LOSS_SCALE_NONE && c->o->optim.accum_steps > 1))
        return ENG_STATUS_OK;
    const krn_backend *b = NULL;
    for (int r = 0; r < c->R; r++) {
        eng_session_opts o = *so;
        ENG_TRY(trn_replica_device(c->o, r, &o));
        if (!o.backend || krn_backend_is_host(o.backend) || (b && o.backend != b)) return ENG_STATUS_OK;
        b = o.backend;
    }
    if ((c->R > 1 || c->W > 1) && !krn_backend_has_comm(b)) return ENG_STATUS_OK;
    c->dev = b;
    c->dev_in = calloc((size_t)gt->ninputs + 1, 1);
    c->dev_out = calloc((size_t)gt->noutputs + 1, 1);
    if (!c->dev_in || !c->dev_out) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; i < gt->ninputs; i++)
        for (int k = 0; k < c->nparams; k++)
            if (strcmp(gt->values[gt->inputs[i]].name, c->params[k].name) == 0) c->dev_in[i] = 1;
    for (int k = 0; k < c->nparams; k++)
        if (c->params[k].out >= 0) c->dev_out[c->params[k].out] = 1;
    so->dev_inputs = c->dev_in;
    so->dev_outputs = c->dev_out;
    return ENG_STATUS_OK;
}

static size_t param_bytes(const trn_param *p) { return (size_t)(p->n > 0 ? p->n : 1) * sizeof(float); }

/* Copy the trainer's optimizer state into replica r's (before either has moved to a device). */
static eng_status optim_clone(trn_ctx *c, trn_replica *rp) {
    size_t n = eng_optim_state_size(c->optim);
    void *buf = malloc(n ? n : 1);
    if (!buf) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    eng_status st = eng_optim_state_save(c->optim, buf, n);
    if (st == ENG_STATUS_OK) st = eng_optim_state_load(rp->optim, buf, n);
    free(buf);
    return st;
}

/* One communicator over every process's replicas: rank 0 makes the backend's id and broadcasts it with its replica
 * count over the job's eng_comm (a failure to make the id travels instead, so that no rank waits for an id that
 * never comes); every process checks its R against rank 0's and they agree on the outcome (an all-reduce of the
 * mismatches, so all stop alike); then every process joins its R devices as global ranks wrank*R .. wrank*R+R-1 of
 * W*R. Every process calls it at the same point (all use the device path alike). */
static eng_status dev_comm_world(trn_ctx *c, const int *devs) {
    struct {
        int32_t ok, R0;
        krn_comm_id id;
        char why[512];
    } msg;
    memset(&msg, 0, sizeof msg);
    if (c->wrank == 0) {
        eng_status st = krn_comm_id_new(c->dev, &msg.id);
        msg.ok = st == ENG_STATUS_OK;
        msg.R0 = c->R;
        if (!msg.ok) snprintf(msg.why, sizeof msg.why, "%s", eng_last_error());
    }
    ENG_TRY(eng_comm_bcast(c->world, c->wrank, &msg, sizeof msg));
    if (!msg.ok)
        return eng_err(ENG_STATUS_INTERNAL, "rank %d: rank 0 could not make the %s communicator id: %s", c->wrank,
                       krn_backend_name(c->dev), msg.why);
    float bad = c->R != msg.R0;
    ENG_TRY(eng_comm_allreduce(c->world, c->wrank, &bad, 1, 0));
    if (bad > 0)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "rank %d of %d runs %d replicas and rank 0 runs %d (%g of the %d "
                       "processes differ from rank 0): every process must run the same number of replicas (--replicas / "
                       "--devices) for one communicator across them", c->wrank, c->W, c->R, (int)msg.R0, bad, c->W);
    int nranks = c->W * c->R;
    eng_status st = krn_comm_new_ranks(c->dev, &msg.id, nranks, c->wrank * c->R, c->R, devs, &c->dcomm);
    if (st != ENG_STATUS_OK)
        return eng_err_prefix(st, "rank %d: joining the %s communicator across %d processes (global ranks %d..%d of %d): ",
                              c->wrank, krn_backend_name(c->dev), c->W, c->wrank * c->R, c->wrank * c->R + c->R - 1, nranks);
    c->dcomm_world = 1;
    fprintf(stderr, "tensord: rank %d: gradients all-reduced on the devices by one %s communicator over %d processes x "
            "%d devices (%d ranks); none through host memory\n", c->wrank, krn_backend_name(c->dev), c->W, c->R, nranks);
    return ENG_STATUS_OK;
}

eng_status trn_dev_alloc(trn_ctx *c) {
    if (!c->dev) return ENG_STATUS_OK;
    int devs[256];
    int64_t *sizes = malloc(((size_t)c->ntrain + 1) * sizeof *sizes);
    if (!sizes) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; i < c->ntrain; i++) sizes[i] = c->params[i].n;
    eng_status st = ENG_STATUS_OK;
    for (int r = 0; r < c->R && st == ENG_STATUS_OK; r++) {
        trn_replica *rp = &c->reps[r];
        eng_session_opts o = {0};
        st = trn_replica_device(c->o, r, &o);
        devs[r] = o.device;
        if (st == ENG_STATUS_OK) st = krn_ctx_new(c->dev, o.device, &rp->dctx);
        if (st == ENG_STATUS_OK && (!(rp->dw = calloc((size_t)c->nparams + 1, sizeof *rp->dw)) ||
                                    !(rp->dz = calloc((size_t)c->nparams + 1, sizeof *rp->dz)) ||
                                    !(rp->gbuf = calloc((size_t)c->nparams + 1, sizeof *rp->gbuf))))
            st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
        for (int k = 0; st == ENG_STATUS_OK && k < c->nparams; k++) {
            st = krn_buf_alloc(c->dev, rp->dctx, param_bytes(&c->params[k]), &rp->dw[k]);
            if (st != ENG_STATUS_OK) eng_err_prefix(st, "replica %d, weight '%s': ", r, c->params[k].name);
            else rp->feed[c->feed_train.n + 1 + k].data = rp->dw[k];
        }
        if (st == ENG_STATUS_OK && r > 0) st = eng_optim_new(&c->o->optim, c->ntrain, sizes, &rp->optim);
        if (st == ENG_STATUS_OK && r > 0) st = optim_clone(c, rp);
    }
    free(sizes);
    if (st == ENG_STATUS_OK && c->W > 1 && krn_backend_has_comm_ranks(c->dev)) {
        st = dev_comm_world(c, devs);
    } else if (st == ENG_STATUS_OK && (c->R > 1 || c->W > 1)) {
        st = krn_comm_new(c->dev, c->R, devs, &c->dcomm);
        if (st != ENG_STATUS_OK) eng_err_prefix(st, "the replicas' collective on %s: ", krn_backend_name(c->dev));
    }
    c->dev_dirty = 1; /* nothing uploaded yet */
    if (st == ENG_STATUS_OK) st = trn_weights_to_device(c);
    return st;
}

eng_status trn_weights_to_device(trn_ctx *c) {
    if (!c->dev) return ENG_STATUS_OK;
    for (int r = 0; r < c->R; r++) {
        trn_replica *rp = &c->reps[r];
        for (int k = 0; k < c->nparams; k++)
            ENG_TRY(krn_buf_set(c->dev, rp->dctx, rp->dw[k], c->params[k].w, (size_t)c->params[k].n * sizeof(float)));
        ENG_TRY(krn_ctx_sync(c->dev, rp->dctx));
        if (r > 0) ENG_TRY(optim_clone(c, rp)); /* after a resume: the checkpoint's optimizer state, everywhere */
    }
    c->dev_dirty = 0;
    return ENG_STATUS_OK;
}

eng_status trn_weights_to_host(trn_ctx *c) {
    if (!c->dev || !c->dev_dirty) return ENG_STATUS_OK;
    trn_replica *r0 = &c->reps[0];
    for (int k = 0; k < c->nparams; k++)
        ENG_TRY(krn_buf_get(c->dev, r0->dctx, c->params[k].w, r0->dw[k], (size_t)c->params[k].n * sizeof(float)));
    ENG_TRY(krn_ctx_sync(c->dev, r0->dctx));
    c->dev_dirty = 0;
    return ENG_STATUS_OK;
}

/* Zeros standing in for param k's gradient on a replica that ran no rows (or failed) this step: it still joins the
 * collective, contributing nothing. Zeroed on every use (the all-reduce writes the sum into it). */
eng_status trn_dev_zeros(trn_ctx *c, trn_replica *rp, int k, void **out) {
    size_t nb = param_bytes(&c->params[k]);
    if (!rp->dz[k]) ENG_TRY(krn_buf_alloc(c->dev, rp->dctx, nb, &rp->dz[k]));
    float *z = calloc(1, nb);
    if (!z) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    eng_status st = krn_buf_set(c->dev, rp->dctx, rp->dz[k], z, nb);
    if (st == ENG_STATUS_OK) st = krn_ctx_sync(c->dev, rp->dctx); /* z is freed now */
    free(z);
    *out = rp->dz[k];
    return st;
}

/* BatchNorm statistics into the weights, then the update (gb: the reduced gradients / statistics per param). */
static eng_status dev_apply(trn_ctx *c, trn_replica *rp, void *const *gb) {
    float *grads[c->ntrain > 0 ? c->ntrain : 1];
    float *params[c->ntrain > 0 ? c->ntrain : 1];
    for (int k = 0; k < c->nparams; k++) {
        const trn_param *p = &c->params[k];
        if (p->out < 0) continue;
        if (p->is_bn) {
            ENG_TRY(krn_buf_copy(c->dev, rp->dctx, rp->dw[k], gb[k], (size_t)p->n * sizeof(float)));
        } else {
            grads[k] = gb[k];
            params[k] = rp->dw[k];
        }
    }
    int applied = 0;
    eng_optim *o = rp->rank == 0 ? c->optim : rp->optim;
    /* loss scaling: the update unscales the gradients and skips itself if they overflowed (every replica sees the
     * same all-reduced gradients, so all decide alike); the trainer's scaler learns the outcome from rank 0 */
    int scaled = c->ls.mode != ENG_LOSS_SCALE_NONE;
    eng_optim_set_unscale(o, scaled ? (float)(1.0 / c->ls.scale) : 1.0f, scaled);
    eng_status st = eng_optim_apply_on(o, c->dev, rp->dctx, params, (const float *const *)grads, &applied);
    rp->finite = eng_optim_last_finite(o);
    if (st == ENG_STATUS_OK) st = krn_ctx_sync(c->dev, rp->dctx); /* the next step's plan reads the weights */
    return st;
}

eng_status trn_dev_update(trn_ctx *c, trn_replica *rp, int ok) {
    eng_status st = ENG_STATUS_OK, first = ENG_STATUS_OK;
    if (rp->bq) { /* buckets (train-buckets.c): most were sent during the run; the rest now, then the update waits */
        first = trn_buckets_finish(c, rp, ok);
        if (!ok || first != ENG_STATUS_OK) return first != ENG_STATUS_OK ? first : ENG_STATUS_INTERNAL;
        return c->W > 1 && !c->dcomm_world ? ENG_STATUS_OK : dev_apply(c, rp, rp->gbuf);
    }
    float share = trn_replica_share(rp);
    int have = ok && rp->rows > 0;
    /* every rank makes every collective call, in parameter order, whatever happened to it (or the others would
     * wait for it forever); a rank that failed contributes zeros and reports its own error after */
    for (int k = 0; k < c->nparams; k++) {
        const trn_param *p = &c->params[k];
        if (p->out < 0) continue;
        void *buf = NULL;
        if (have) buf = rp->outs[p->out].data;
        else if ((st = trn_dev_zeros(c, rp, k, &buf)) != ENG_STATUS_OK) return st; /* no buffer: nothing to call with */
        if (c->dcomm) { /* several replicas, or several processes (then it also scales a lone replica's share) */
            st = krn_comm_allreduce(c->dev, c->dcomm, rp->rank, rp->dctx, buf, (size_t)p->n, share);
            if (st != ENG_STATUS_OK && first == ENG_STATUS_OK) first = st;
        }
        rp->gbuf[k] = buf;
    }
    if (!ok || first != ENG_STATUS_OK) return first != ENG_STATUS_OK ? first : ENG_STATUS_INTERNAL;
    /* across processes without one communicator spanning them: the sums go through trn_dev_world first */
    if (c->W > 1 && !c->dcomm_world) return ENG_STATUS_OK;
    return dev_apply(c, rp, rp->gbuf);
}

eng_status trn_dev_world(trn_ctx *c, double *loss, double *acc) {
    if (c->dcomm_world) { /* the gradients were the job's sums and each replica applied them on its thread: only
                           * the metrics cross the processes */
        float m[2] = {(float)*loss, (float)*acc};
        ENG_TRY(eng_comm_allreduce(c->world, c->wrank, m, 2, 0));
        *loss = m[0];
        *acc = m[1];
        return ENG_STATUS_OK;
    }
    /* the processes' sums: rank 0's reduced gradients through host memory and MPI, then back to every replica */
    int64_t total = 0;
    for (int k = 0; k < c->nparams; k++)
        if (c->params[k].out >= 0) total += c->params[k].n;
    if (!c->dev_pack) ENG_TRY(krn_host_alloc(c->dev, (size_t)(total + 2) * sizeof(float), (void **)&c->dev_pack));
    float *pack = c->dev_pack;
    trn_replica *r0 = &c->reps[0];
    int64_t off = 0;
    for (int k = 0; k < c->nparams; k++) {
        const trn_param *p = &c->params[k];
        if (p->out < 0) continue;
        ENG_TRY(krn_buf_get(c->dev, r0->dctx, pack + off, r0->gbuf[k], (size_t)p->n * sizeof(float)));
        off += p->n;
    }
    ENG_TRY(krn_ctx_sync(c->dev, r0->dctx));
    pack[total] = (float)*loss;
    pack[total + 1] = (float)*acc;
    ENG_TRY(eng_comm_allreduce(c->world, c->wrank, pack, total + 2, 0));
    *loss = pack[total];
    *acc = pack[total + 1];
    for (int r = 0; r < c->R; r++) {
        trn_replica *rp = &c->reps[r];
        off = 0;
        for (int k = 0; k < c->nparams; k++) {
            const trn_param *p = &c->params[k];
            if (p->out < 0) continue;
            ENG_TRY(krn_buf_set(c->dev, rp->dctx, rp->gbuf[k], pack + off, (size_t)p->n * sizeof(float)));
            off += p->n;
        }
        ENG_TRY(dev_apply(c, rp, rp->gbuf));
    }
    return ENG_STATUS_OK;
}

void trn_dev_free(trn_ctx *c) {
    if (!c->dev) return;
    trn_buckets_free(c); /* its contexts and events, before the replicas' */
    krn_comm_free(c->dev, &c->dcomm);
    c->dcomm_world = 0;
    krn_host_free(c->dev, c->dev_pack);
    c->dev_pack = NULL;
    for (int r = 0; c->reps && r < c->R; r++) {
        trn_replica *rp = &c->reps[r];
        eng_optim_free(&rp->optim); /* before its context */
        if (rp->dctx) (void)krn_ctx_sync(c->dev, rp->dctx);
        for (int k = 0; k < c->nparams; k++) {
            if (rp->dw) krn_buf_free(c->dev, rp->dctx, rp->dw[k]);
            if (rp->dz) krn_buf_free(c->dev, rp->dctx, rp->dz[k]);
        }
        free(rp->dw);
        free(rp->dz);
        free(rp->gbuf);
        rp->dw = rp->dz = NULL;
        rp->gbuf = NULL;
        krn_ctx_free(c->dev, &rp->dctx);
    }
    free(c->dev_in);
    free(c->dev_out);
    c->dev_in = c->dev_out = NULL;
    c->dev = NULL;
}
