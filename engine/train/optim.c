/* optim.c - SGD (momentum, Nesterov), Adam and AdamW over flat float32 buffers (see optim.h).
 *
 * One eng_optim_apply call:
 *   1. accumulation (accum_steps > 1): grads are summed into per-parameter accumulators; only the last call
 *      of a group applies, with g = sum / accum_steps.
 *   2. the global L2 norm of g (double accumulation) is recorded; clipnorm > 0 scales g by clipnorm / norm
 *      when norm > clipnorm (torch.nn.utils.clip_grad_norm_ / Keras global_clipnorm).
 *   3. weight_decay: SGD/Adam add wd*w to the (clipped) gradient (L2, as torch does: clipping sees the loss
 *      gradient only); AdamW first shrinks w by lr*wd*w (decoupled, Keras/torch AdamW).
 *   4. the update with the learning rate of this step (schedule below), then step++.
 * Learning rate for update number s (0-based, s = updates applied so far):
 *   s < warmup_steps:  lr * s / warmup_steps                          (linear warm-up from 0)
 *   else t = s - warmup_steps:  constant lr | step lr * gamma^floor(t / step_size) |
 *                               cosine min_lr + (lr - min_lr) * (1 + cos(pi * min(t, decay_steps) / decay_steps)) / 2
 * Adam: t = step + 1; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; w -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps).
 *
 * The element loops are the "optim" kernel family (kernels/krn-optim.h: optim_accumulate, optim_sum_squares,
 * optim_update), called once per parameter buffer through a backend's kernel table: the CPU's, resolved once in
 * eng_optim_new (eng_optim_apply), or the one given to eng_optim_apply_on. This file computes what is the same for
 * every element of an update on the host (learning rate, clip scale, bias corrections in double) and passes it in
 * krn_optim_params; the CPU kernels keep the operation order of the loops that used to live here (bit-identical).
 *
 * Where the state lives: host memory (eng_alloc) from eng_optim_new. The first eng_optim_apply_on with a non-host
 * backend moves it to that backend's buffers (krn_buf_alloc + krn_buf_set, then the host copies are freed); from
 * then on the optimizer belongs to that backend: apply_on with any other backend and eng_optim_apply are refused,
 * state_save / state_load copy through krn_buf_get / krn_buf_set on the context of the last apply_on call, and
 * eng_optim_free frees the device buffers on it. The global norm is the host's sum, in parameter order, of the
 * per-parameter float64 sums of squares (read back from the device: one krn_buf_get + krn_ctx_sync per update).
 *
 * State layout (eng_optim_state_save): a fixed header {magic "TDOPTST\0", u32 version, u32 kind, u32 nparams,
 * u32 slots, i64 step, i64 accum_count, i64 total floats} followed by nparams i64 sizes and then each slot's
 * buffers (slot-major: all of slot 0's params, then slot 1's ...), native byte order. Load checks every
 * header field and size against this optimizer and the exact byte length.
 */
#include "optim.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/kernel.h"
#include "../../kernels/krn-optim.h"
#include "../ir/tensor.h"

#define OPTIM_STATE_MAGIC "TDOPTST"
#define OPTIM_STATE_VERSION 1u
#define OPTIM_MAX_SLOTS 3

/* The optim kernels of one backend. */
typedef struct optim_kernels {
    const krn_backend *b;
    const krn_kernel *update, *sumsq, *accum;
} optim_kernels;

struct eng_optim {
    eng_optim_opts o;   /* defaults resolved */
    int nparams;
    int64_t *sizes;     /* nparams */
    int nslots;         /* state buffers per parameter: SGD+momentum 1 (velocity), Adam 2 (m, v), +1 accumulator */
    int slot_m, slot_v, slot_acc; /* slot index or -1 */
    float **slots[OPTIM_MAX_SLOTS]; /* slots[s][p]: sizes[p] floats each, eng_alloc'd; all NULL once on a device */
    double *host_ss;    /* nparams per-parameter sums of squares (host path) */
    int64_t step;       /* updates applied */
    int64_t accum_count;/* gradients summed into the accumulators since the last update */
    float last_norm;
    optim_kernels cpu;  /* resolved in eng_optim_new */
    /* device state: set by the first eng_optim_apply_on with a non-host backend */
    optim_kernels dev;  /* dev.b NULL: the state is on the host */
    krn_ctx *dev_ctx;   /* the context of the last apply_on call */
    float **dslots[OPTIM_MAX_SLOTS]; /* dslots[s][p]: sizes[p] floats in dev.b's buffers (NULL for size 0) */
    double *dev_ss;     /* nparams float64 sums of squares, dev.b's buffer */
    double *dev_ss_host;/* nparams, krn_host_alloc'd (pinned on CUDA): where dev_ss is read back */
    float unscale;      /* eng_optim_set_unscale: a factor on the gradients of the next update (1/loss scale) */
    int skip_nonfinite; /* ... and that update is skipped when their norm is not finite (last_finite says) */
    int last_finite;
};

typedef struct optim_state_header {
    char magic[8];
    uint32_t version, kind, nparams, nslots;
    int64_t step, accum_count, total;
} optim_state_header;

int eng_optim_parse(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "sgd")) return ENG_OPTIM_SGD;
    if (!strcmp(name, "adam")) return ENG_OPTIM_ADAM;
    if (!strcmp(name, "adamw")) return ENG_OPTIM_ADAMW;
    return -1;
}

static const char *optim_name(eng_optim_kind k) {
    return k == ENG_OPTIM_SGD ? "sgd" : k == ENG_OPTIM_ADAM ? "adam" : k == ENG_OPTIM_ADAMW ? "adamw" : "?";
}

/* The optim kernels of backend b into *k; UNSUPPORTED naming the backend and the kernel when one is missing. */
static eng_status optim_kernels_find(const krn_backend *b, optim_kernels *k) {
    static const char *const names[3] = {"optim_update", "optim_sum_squares", "optim_accumulate"};
    const krn_kernel *found[3];
    for (int i = 0; i < 3; i++) {
        found[i] = krn_backend_find(b, names[i]);
        if (!found[i])
            return eng_err(ENG_STATUS_UNSUPPORTED, "optimizer: backend %s has no kernel %s", krn_backend_name(b),
                           names[i]);
    }
    *k = (optim_kernels){.b = b, .update = found[0], .sumsq = found[1], .accum = found[2]};
    return ENG_STATUS_OK;
}

/* Frees the device state (on the context of the last apply_on) and returns the optimizer to "no device". */
static void optim_dev_free(eng_optim *o) {
    const krn_backend *b = o->dev.b;
    if (!b) return;
    for (int s = 0; s < o->nslots; s++) {
        if (!o->dslots[s]) continue;
        for (int p = 0; p < o->nparams; p++)
            if (o->dslots[s][p]) krn_buf_free(b, o->dev_ctx, o->dslots[s][p]);
        free(o->dslots[s]);
        o->dslots[s] = NULL;
    }
    if (o->dev_ss) krn_buf_free(b, o->dev_ctx, o->dev_ss);
    if (o->dev_ss_host) krn_host_free(b, o->dev_ss_host);
    o->dev_ss = o->dev_ss_host = NULL;
    o->dev = (optim_kernels){0};
    o->dev_ctx = NULL;
}

eng_status eng_optim_new(const eng_optim_opts *opts, int nparams, const int64_t *sizes, eng_optim **out) {
    if (!opts || !out || nparams < 0 || (nparams > 0 && !sizes))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer: NULL argument or negative parameter count");
    *out = NULL;
    eng_optim_opts o = *opts;
    const char *nm = optim_name(o.kind);
    if (o.kind != ENG_OPTIM_SGD && o.kind != ENG_OPTIM_ADAM && o.kind != ENG_OPTIM_ADAMW)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer: unknown kind %d", (int)o.kind);
    if (o.lr == 0) o.lr = o.kind == ENG_OPTIM_SGD ? 0.01f : 0.001f;
    if (o.kind != ENG_OPTIM_SGD) {
        if (o.beta1 == 0) o.beta1 = 0.9f;
        if (o.beta2 == 0) o.beta2 = 0.999f;
        if (o.eps == 0) o.eps = 1e-7f;
    }
    if (!(o.lr > 0) || !isfinite(o.lr))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer %s: learning rate %g must be > 0", nm, (double)o.lr);
    if (!(o.momentum >= 0 && o.momentum < 1))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer %s: momentum %g must be in [0, 1)", nm, (double)o.momentum);
    if (o.nesterov && o.momentum == 0)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer %s: nesterov needs momentum > 0", nm);
    if (o.kind != ENG_OPTIM_SGD && !(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1 && o.eps > 0))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer %s: beta1 %g, beta2 %g must be in [0, 1) and eps %g > 0",
                       nm, (double)o.beta1, (double)o.beta2, (double)o.eps);
    if (!(o.weight_decay >= 0) || !(o.clipnorm >= 0))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer %s: weight_decay %g and clipnorm %g must be >= 0", nm,
                       (double)o.weight_decay, (double)o.clipnorm);
    if (o.accum_steps < 1) o.accum_steps = 1;
    if (o.warmup_steps < 0)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer %s: warmup_steps %lld must be >= 0", nm,
                       (long long)o.warmup_steps);
    if (o.schedule == ENG_LR_STEP && (o.step_size <= 0 || !(o.gamma > 0)))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer %s: step schedule needs step_size > 0 (got %lld) and gamma > 0 (got %g)",
                       nm, (long long)o.step_size, (double)o.gamma);
    if (o.schedule == ENG_LR_COSINE && (o.decay_steps <= 0 || !(o.min_lr >= 0)))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer %s: cosine schedule needs decay_steps > 0 (got %lld) and min_lr >= 0",
                       nm, (long long)o.decay_steps);
    if (o.schedule != ENG_LR_CONSTANT && o.schedule != ENG_LR_STEP && o.schedule != ENG_LR_COSINE)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer %s: unknown learning rate schedule %d", nm, (int)o.schedule);
    for (int p = 0; p < nparams; p++)
        if (sizes[p] < 0 || sizes[p] > ENG_MAX_TENSOR_BYTES / 4)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer %s: parameter %d has size %lld", nm, p, (long long)sizes[p]);

    eng_optim *op = calloc(1, sizeof *op);
    if (!op) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "optimizer %s", nm);
    op->o = o;
    op->unscale = 1.0f;
    op->last_finite = 1;
    op->nparams = nparams;
    op->slot_m = op->slot_v = op->slot_acc = -1;
    if (o.kind == ENG_OPTIM_SGD) {
        if (o.momentum > 0) op->slot_m = op->nslots++;
    } else {
        op->slot_m = op->nslots++;
        op->slot_v = op->nslots++;
    }
    if (o.accum_steps > 1) op->slot_acc = op->nslots++;
    op->sizes = malloc((size_t)(nparams ? nparams : 1) * sizeof *op->sizes);
    if (!op->sizes) goto oom;
    if (nparams) memcpy(op->sizes, sizes, (size_t)nparams * sizeof *sizes);
    for (int s = 0; s < op->nslots; s++) {
        op->slots[s] = calloc((size_t)(nparams ? nparams : 1), sizeof(float *));
        if (!op->slots[s]) goto oom;
        for (int p = 0; p < nparams; p++) {
            size_t nb = (size_t)sizes[p] * sizeof(float);
            op->slots[s][p] = eng_alloc(nb ? nb : 64);
            if (!op->slots[s][p]) goto oom;
            memset(op->slots[s][p], 0, nb);
        }
    }
    op->host_ss = calloc((size_t)(nparams ? nparams : 1), sizeof(double));
    if (!op->host_ss) goto oom;
    eng_status st = optim_kernels_find(krn_backend_cpu(), &op->cpu);
    if (st != ENG_STATUS_OK) {
        eng_optim_free(&op);
        return st;
    }
    *out = op;
    return ENG_STATUS_OK;
oom:
    eng_optim_free(&op);
    return eng_err(ENG_STATUS_OUT_OF_MEMORY, "optimizer %s: state for %d parameters", nm, nparams);
}

void eng_optim_free(eng_optim **po) {
    if (!po || !*po) return;
    eng_optim *o = *po;
    optim_dev_free(o);
    for (int s = 0; s < o->nslots; s++) {
        if (!o->slots[s]) continue;
        for (int p = 0; p < o->nparams; p++) eng_free(o->slots[s][p]);
        free(o->slots[s]);
    }
    free(o->host_ss);
    free(o->sizes);
    free(o);
    *po = NULL;
}

static double optim_lr_at(const eng_optim_opts *o, int64_t s) {
    double lr = o->lr;
    if (s < o->warmup_steps) return lr * (double)s / (double)o->warmup_steps;
    int64_t t = s - o->warmup_steps;
    switch (o->schedule) {
    case ENG_LR_STEP: return lr * pow((double)o->gamma, (double)(t / o->step_size));
    case ENG_LR_COSINE: {
        double f = (double)(t < o->decay_steps ? t : o->decay_steps) / (double)o->decay_steps;
        return o->min_lr + (lr - o->min_lr) * 0.5 * (1.0 + cos(M_PI * f));
    }
    default: return lr;
    }
}

float eng_optim_lr(const eng_optim *o) { return o ? (float)optim_lr_at(&o->o, o->step) : 0.0f; }
int64_t eng_optim_step_count(const eng_optim *o) { return o ? o->step : 0; }
float eng_optim_last_grad_norm(const eng_optim *o) { return o ? o->last_norm : 0.0f; }

void eng_optim_set_unscale(eng_optim *o, float unscale, int skip_nonfinite) {
    o->unscale = unscale;
    o->skip_nonfinite = skip_nonfinite;
}

int eng_optim_last_finite(const eng_optim *o) { return o ? o->last_finite : 1; }

/* A float32 vector view of n elements (an absent tensor when data is NULL). */
static eng_tensor optim_vec(const void *data, int64_t n) {
    eng_tensor t = {.dtype = data ? ENG_DTYPE_F32 : ENG_DTYPE_UNDEFINED, .ndim = 1, .dims = {n}, .data = (void *)data};
    return t;
}

static eng_status optim_run(const krn_kernel *k, krn_ctx *ctx, const void *params, const eng_tensor *in, int nin,
                            eng_tensor *out, int nout) {
    krn_call c = {.params = params, .in = in, .nin = nin, .out = out, .nout = nout,
                  .nthreads = ctx ? 1 : omp_get_max_threads(), .ctx = ctx};
    return k->exec(&c);
}

/* Moves the state to non-host backend k->b (first apply_on with it): device buffers, the host state copied over,
 * then the host copies freed. On failure the state stays on the host, untouched. */
static eng_status optim_dev_init(eng_optim *o, const optim_kernels *k, krn_ctx *ctx) {
    const krn_backend *b = k->b;
    o->dev = *k;
    o->dev_ctx = ctx;
    eng_status st = ENG_STATUS_OK;
    size_t ssb = (size_t)(o->nparams ? o->nparams : 1) * sizeof(double);
    st = krn_buf_alloc(b, ctx, ssb, (void **)&o->dev_ss);
    if (st == ENG_STATUS_OK) st = krn_host_alloc(b, ssb, (void **)&o->dev_ss_host);
    for (int s = 0; s < o->nslots && st == ENG_STATUS_OK; s++) {
        o->dslots[s] = calloc((size_t)(o->nparams ? o->nparams : 1), sizeof(float *));
        if (!o->dslots[s]) {
            st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "optimizer %s: device state table", optim_name(o->o.kind));
            break;
        }
        for (int p = 0; p < o->nparams && st == ENG_STATUS_OK; p++) {
            size_t nb = (size_t)o->sizes[p] * sizeof(float);
            if (!nb) continue;
            st = krn_buf_alloc(b, ctx, nb, (void **)&o->dslots[s][p]);
            if (st == ENG_STATUS_OK) st = krn_buf_set(b, ctx, o->dslots[s][p], o->slots[s][p], nb);
        }
    }
    if (st == ENG_STATUS_OK) st = krn_ctx_sync(b, ctx); /* the host slots are read until here */
    if (st != ENG_STATUS_OK) {
        optim_dev_free(o);
        return st;
    }
    for (int s = 0; s < o->nslots; s++)
        for (int p = 0; p < o->nparams; p++) {
            eng_free(o->slots[s][p]);
            o->slots[s][p] = NULL;
        }
    return ENG_STATUS_OK;
}

/* One call of eng_optim_apply / eng_optim_apply_on with the kernels k (of backend k->b, context ctx), the state
 * buffers slots, the per-parameter sums of squares written to ss_out (k->b's buffer) and read on the host at ss. */
static eng_status optim_apply_with(eng_optim *o, const optim_kernels *k, krn_ctx *ctx, float **const *slots,
                                   double *ss_out, double *ss, float *const *params, const float *const *grads,
                                   int *applied) {
    if (!o || (o->nparams > 0 && (!params || !grads)))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer: NULL argument");
    if (applied) *applied = 0;
    const char *nm = optim_name(o->o.kind);
    for (int p = 0; p < o->nparams; p++)
        if (o->sizes[p] > 0 && (!params[p] || !grads[p]))
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer %s: parameter %d has no %s buffer", nm, p,
                           params[p] ? "gradient" : "weight");
    const eng_optim_opts *opt = &o->o;
    int host = krn_backend_is_host(k->b);
    eng_status st = ENG_STATUS_OK;
    const float *const *g = grads;
    float gs = 1.0f;
    if (o->slot_acc >= 0) {
        float **acc = slots[o->slot_acc];
        for (int p = 0; p < o->nparams && st == ENG_STATUS_OK; p++) {
            if (!o->sizes[p]) continue;
            eng_tensor in[2] = {optim_vec(acc[p], o->sizes[p]), optim_vec(grads[p], o->sizes[p])};
            eng_tensor out[1] = {in[0]};
            st = optim_run(k->accum, ctx, NULL, in, 2, out, 1);
        }
        if (st != ENG_STATUS_OK) return st;
        if (++o->accum_count < opt->accum_steps) return ENG_STATUS_OK;
        g = (const float *const *)acc;
        gs = 1.0f / (float)opt->accum_steps;
    }
    gs *= o->unscale;
    krn_optim_sumsq_params sp = {.scale = gs};
    for (int p = 0; p < o->nparams && st == ENG_STATUS_OK; p++) {
        if (!o->sizes[p]) {
            if (host) ss_out[p] = 0;
            continue;
        }
        eng_tensor in[1] = {optim_vec(g[p], o->sizes[p])};
        eng_tensor out[1] = {{.dtype = ENG_DTYPE_F64, .ndim = 0, .data = ss_out + p}};
        st = optim_run(k->sumsq, ctx, &sp, in, 1, out, 1);
    }
    if (!host && st == ENG_STATUS_OK && o->nparams) {
        /* a size-0 parameter's slot was never written: zero it on the host after the copy */
        st = krn_buf_get(k->b, ctx, ss, ss_out, (size_t)o->nparams * sizeof(double));
        if (st == ENG_STATUS_OK) st = krn_ctx_sync(k->b, ctx);
        for (int p = 0; p < o->nparams; p++)
            if (!o->sizes[p]) ss[p] = 0;
    }
    if (st != ENG_STATUS_OK) return st;
    double sum = 0;
    for (int p = 0; p < o->nparams; p++) sum += ss[p];
    double norm = sqrt(sum);
    o->last_finite = isfinite(norm);
    if (o->skip_nonfinite && !o->last_finite) { /* a loss-scaled step that overflowed: no update, the step not counted */
        if (o->slot_acc >= 0) o->accum_count = 0;
        return ENG_STATUS_OK;
    }
    o->last_norm = (float)norm;
    if (opt->clipnorm > 0 && norm > opt->clipnorm) gs = (float)((double)gs * opt->clipnorm / norm);

    float lr = (float)optim_lr_at(opt, o->step);
    krn_optim_params up = {.lr = lr, .gscale = gs, .weight_decay = opt->weight_decay};
    if (opt->kind == ENG_OPTIM_SGD) {
        up.kind = o->slot_m < 0 ? KRN_OPTIM_SGD : opt->nesterov ? KRN_OPTIM_NESTEROV : KRN_OPTIM_MOMENTUM;
        up.momentum = opt->momentum;
    } else {
        double t = (double)(o->step + 1);
        up.kind = KRN_OPTIM_ADAM;
        up.inv_bc1 = (float)(1.0 / (1.0 - pow((double)opt->beta1, t)));
        up.inv_bc2 = (float)(1.0 / (1.0 - pow((double)opt->beta2, t)));
        up.weight_decay = opt->kind == ENG_OPTIM_ADAM ? opt->weight_decay : 0.0f;
        up.decoupled_decay = opt->kind == ENG_OPTIM_ADAMW ? lr * opt->weight_decay : 0.0f;
        up.beta1 = opt->beta1;
        up.beta2 = opt->beta2;
        up.eps = opt->eps;
    }
    for (int p = 0; p < o->nparams && st == ENG_STATUS_OK; p++) {
        int64_t n = o->sizes[p];
        if (!n) continue;
        eng_tensor in[4] = {optim_vec(params[p], n), optim_vec(g[p], n),
                            optim_vec(o->slot_m >= 0 ? slots[o->slot_m][p] : NULL, n),
                            optim_vec(o->slot_v >= 0 ? slots[o->slot_v][p] : NULL, n)};
        /* the accumulator (g itself then) is zeroed by the update after it is read */
        eng_tensor out[4] = {in[0], in[2], in[3], optim_vec(o->slot_acc >= 0 ? g[p] : NULL, n)};
        st = optim_run(k->update, ctx, &up, in, 4, out, 4);
    }
    if (st != ENG_STATUS_OK) return st;
    if (o->slot_acc >= 0) o->accum_count = 0;
    o->step++;
    if (applied) *applied = 1;
    return ENG_STATUS_OK;
}

eng_status eng_optim_apply(eng_optim *o, float *const *params, const float *const *grads, int *applied) {
    if (o && o->dev.b)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer %s: its state lives on backend %s since the first "
                       "eng_optim_apply_on with it; host buffers cannot be updated", optim_name(o->o.kind),
                       krn_backend_name(o->dev.b));
    if (!o) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer: NULL argument");
    return optim_apply_with(o, &o->cpu, NULL, o->slots, o->host_ss, o->host_ss, params, grads, applied);
}

eng_status eng_optim_apply_on(eng_optim *o, const krn_backend *b, krn_ctx *ctx, float *const *params,
                              const float *const *grads, int *applied) {
    if (!o || !b) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer: NULL argument");
    const char *nm = optim_name(o->o.kind);
    if (krn_backend_is_host(b)) {
        if (o->dev.b)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer %s: its state lives on backend %s, not on %s", nm,
                           krn_backend_name(o->dev.b), krn_backend_name(b));
        optim_kernels k = o->cpu;
        if (b != o->cpu.b) ENG_TRY(optim_kernels_find(b, &k));
        return optim_apply_with(o, &k, ctx, o->slots, o->host_ss, o->host_ss, params, grads, applied);
    }
    if (o->dev.b && o->dev.b != b)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer %s: its state lives on backend %s, not on %s", nm,
                       krn_backend_name(o->dev.b), krn_backend_name(b));
    if (!o->dev.b) {
        optim_kernels k;
        ENG_TRY(optim_kernels_find(b, &k));
        ENG_TRY(optim_dev_init(o, &k, ctx));
    }
    o->dev_ctx = ctx;
    return optim_apply_with(o, &o->dev, ctx, o->dslots, o->dev_ss, o->dev_ss_host, params, grads, applied);
}

/* ---- checkpoint state ---- */

static int64_t optim_total_floats(const eng_optim *o) {
    int64_t t = 0;
    for (int p = 0; p < o->nparams; p++) t += o->sizes[p];
    return t * o->nslots;
}

size_t eng_optim_state_size(const eng_optim *o) {
    if (!o) return 0;
    return sizeof(optim_state_header) + (size_t)o->nparams * sizeof(int64_t) +
           (size_t)optim_total_floats(o) * sizeof(float);
}

eng_status eng_optim_state_save(const eng_optim *o, void *buf, size_t len) {
    if (!o || !buf) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer state: NULL argument");
    size_t need = eng_optim_state_size(o);
    if (len < need)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer %s state: buffer of %zu bytes, need %zu",
                       optim_name(o->o.kind), len, need);
    optim_state_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, OPTIM_STATE_MAGIC, 8);
    h.version = OPTIM_STATE_VERSION;
    h.kind = (uint32_t)o->o.kind;
    h.nparams = (uint32_t)o->nparams;
    h.nslots = (uint32_t)o->nslots;
    h.step = o->step;
    h.accum_count = o->accum_count;
    h.total = optim_total_floats(o);
    char *b = buf;
    memcpy(b, &h, sizeof h);
    b += sizeof h;
    if (o->nparams) memcpy(b, o->sizes, (size_t)o->nparams * sizeof(int64_t));
    b += (size_t)o->nparams * sizeof(int64_t);
    eng_status st = ENG_STATUS_OK;
    for (int s = 0; s < o->nslots && st == ENG_STATUS_OK; s++)
        for (int p = 0; p < o->nparams && st == ENG_STATUS_OK; p++) {
            size_t nb = (size_t)o->sizes[p] * sizeof(float);
            if (!o->dev.b) memcpy(b, o->slots[s][p], nb);
            else if (nb) st = krn_buf_get(o->dev.b, o->dev_ctx, b, o->dslots[s][p], nb);
            b += nb;
        }
    if (o->dev.b) {
        eng_status sync = krn_ctx_sync(o->dev.b, o->dev_ctx); /* also when a get failed: buf must not be written later */
        if (st == ENG_STATUS_OK) st = sync;
    }
    return st;
}

eng_status eng_optim_state_load(eng_optim *o, const void *buf, size_t len) {
    if (!o || !buf) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer state: NULL argument");
    const char *nm = optim_name(o->o.kind);
    optim_state_header h;
    if (len < sizeof h)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer %s state: %zu bytes is shorter than the header", nm, len);
    memcpy(&h, buf, sizeof h);
    if (memcmp(h.magic, OPTIM_STATE_MAGIC, 8) != 0)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer %s state: bad magic (not optimizer state)", nm);
    if (h.version != OPTIM_STATE_VERSION)
        return eng_err(ENG_STATUS_UNSUPPORTED, "optimizer %s state: version %u, this build reads version %u", nm,
                       h.version, OPTIM_STATE_VERSION);
    if (h.kind != (uint32_t)o->o.kind)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer %s state: saved by optimizer %s", nm,
                       optim_name((eng_optim_kind)h.kind));
    if (h.nparams != (uint32_t)o->nparams || h.nslots != (uint32_t)o->nslots)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT,
                       "optimizer %s state: %u parameters x %u buffers saved, this optimizer has %d x %d", nm,
                       h.nparams, h.nslots, o->nparams, o->nslots);
    if (eng_optim_state_size(o) != len || h.total != optim_total_floats(o))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer %s state: %zu bytes, expected %zu", nm, len,
                       eng_optim_state_size(o));
    if (h.step < 0 || h.accum_count < 0 || h.accum_count >= o->o.accum_steps)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer %s state: step %lld / accumulation count %lld out of range",
                       nm, (long long)h.step, (long long)h.accum_count);
    const char *b = (const char *)buf + sizeof h;
    for (int p = 0; p < o->nparams; p++) {
        int64_t sz;
        memcpy(&sz, b + (size_t)p * sizeof sz, sizeof sz);
        if (sz != o->sizes[p])
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer %s state: parameter %d has %lld elements saved, %lld here",
                           nm, p, (long long)sz, (long long)o->sizes[p]);
    }
    b += (size_t)o->nparams * sizeof(int64_t);
    eng_status st = ENG_STATUS_OK;
    for (int s = 0; s < o->nslots && st == ENG_STATUS_OK; s++)
        for (int p = 0; p < o->nparams && st == ENG_STATUS_OK; p++) {
            size_t nb = (size_t)o->sizes[p] * sizeof(float);
            if (!o->dev.b) memcpy(o->slots[s][p], b, nb);
            else if (nb) st = krn_buf_set(o->dev.b, o->dev_ctx, o->dslots[s][p], b, nb);
            b += nb;
        }
    if (o->dev.b) {
        eng_status sync = krn_ctx_sync(o->dev.b, o->dev_ctx); /* buf is read until here */
        if (st == ENG_STATUS_OK) st = sync;
    }
    if (st != ENG_STATUS_OK) return st;
    o->step = h.step;
    o->accum_count = h.accum_count;
    return ENG_STATUS_OK;
}
