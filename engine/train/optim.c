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
 * Invariants: the scale factors (clip scale, bias corrections) are computed once per update in double and
 * the element loops are branch-free float loops the compiler vectorises; parameters of at least
 * OPTIM_OMP_MIN elements are split across OpenMP threads (the result does not depend on the thread count:
 * every element's update is independent; only the logged gradient norm, reduced in double, may differ in its last bits).
 * State layout (eng_optim_state_save): a fixed header {magic "TDOPTST\0", u32 version, u32 kind, u32 nparams,
 * u32 slots, i64 step, i64 accum_count, i64 total floats} followed by nparams i64 sizes and then each slot's
 * buffers (slot-major: all of slot 0's params, then slot 1's ...), native byte order. Load checks every
 * header field and size against this optimizer and the exact byte length.
 */
#include "optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../ir/tensor.h"

#define OPTIM_OMP_MIN 32768
#define OPTIM_STATE_MAGIC "TDOPTST"
#define OPTIM_STATE_VERSION 1u
#define OPTIM_MAX_SLOTS 3

struct eng_optim {
    eng_optim_opts o;   /* defaults resolved */
    int nparams;
    int64_t *sizes;     /* nparams */
    int nslots;         /* state buffers per parameter: SGD+momentum 1 (velocity), Adam 2 (m, v), +1 accumulator */
    int slot_m, slot_v, slot_acc; /* slot index or -1 */
    float **slots[OPTIM_MAX_SLOTS]; /* slots[s][p]: sizes[p] floats each, eng_alloc'd */
    int64_t step;       /* updates applied */
    int64_t accum_count;/* gradients summed into the accumulators since the last update */
    float last_norm;
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
    *out = op;
    return ENG_STATUS_OK;
oom:
    eng_optim_free(&op);
    return eng_err(ENG_STATUS_OUT_OF_MEMORY, "optimizer %s: state for %d parameters", nm, nparams);
}

void eng_optim_free(eng_optim **po) {
    if (!po || !*po) return;
    eng_optim *o = *po;
    for (int s = 0; s < o->nslots; s++) {
        if (!o->slots[s]) continue;
        for (int p = 0; p < o->nparams; p++) eng_free(o->slots[s][p]);
        free(o->slots[s]);
    }
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

/* Sum of squares in float over 4096-element blocks (vectorised), blocks summed in double. */
static double sum_squares(const float *g, int64_t n, float scale) {
    double ss = 0;
#pragma omp parallel for reduction(+ : ss) if (n >= OPTIM_OMP_MIN) schedule(static)
    for (int64_t b = 0; b < n; b += 4096) {
        int64_t e = b + 4096 < n ? b + 4096 : n;
        float acc = 0;
#pragma omp simd reduction(+ : acc)
        for (int64_t i = b; i < e; i++) {
            float x = g[i] * scale;
            acc += x * x;
        }
        ss += acc;
    }
    return ss;
}

/* g_eff = gs * g + wd * w for the kernels below (gs folds clipping and the accumulation average). */

static void sgd_plain(float *restrict w, const float *restrict g, int64_t n, float lr, float gs, float wd) {
#pragma omp parallel for simd if (n >= OPTIM_OMP_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) w[i] -= lr * (gs * g[i] + wd * w[i]);
}

static void sgd_momentum(float *restrict w, const float *restrict g, float *restrict v, int64_t n, float lr, float gs,
                         float wd, float mom, int nesterov) {
    if (nesterov) {
#pragma omp parallel for simd if (n >= OPTIM_OMP_MIN) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            float ge = gs * g[i] + wd * w[i];
            float vi = mom * v[i] - lr * ge;
            v[i] = vi;
            w[i] += mom * vi - lr * ge;
        }
    } else {
#pragma omp parallel for simd if (n >= OPTIM_OMP_MIN) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            float ge = gs * g[i] + wd * w[i];
            float vi = mom * v[i] - lr * ge;
            v[i] = vi;
            w[i] += vi;
        }
    }
}

/* Adam step; wd: L2 coefficient (Adam), dwd: decoupled factor lr*weight_decay (AdamW). Note: GCC vectorises
 * this loop only with -fno-math-errno (sqrtf's errno path); the build's default flags keep it scalar. */
static void adam_update(float *restrict w, const float *restrict g, float *restrict m, float *restrict v, int64_t n,
                        float lr, float gs, float wd, float dwd, float b1, float b2, float ibc1, float ibc2, float eps) {
    float c1 = 1.0f - b1, c2 = 1.0f - b2;
#pragma omp parallel for simd if (n >= OPTIM_OMP_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float wi = w[i];
        float ge = gs * g[i] + wd * wi;
        wi -= dwd * wi;
        float mi = b1 * m[i] + c1 * ge;
        float vi = b2 * v[i] + c2 * ge * ge;
        m[i] = mi;
        v[i] = vi;
        w[i] = wi - lr * (mi * ibc1) / (sqrtf(vi * ibc2) + eps);
    }
}

eng_status eng_optim_apply(eng_optim *o, float *const *params, const float *const *grads, int *applied) {
    if (!o || (o->nparams > 0 && (!params || !grads)))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer: NULL argument");
    if (applied) *applied = 0;
    for (int p = 0; p < o->nparams; p++)
        if (o->sizes[p] > 0 && (!params[p] || !grads[p]))
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "optimizer %s: parameter %d has no %s buffer",
                           optim_name(o->o.kind), p, params[p] ? "gradient" : "weight");
    const eng_optim_opts *opt = &o->o;
    const float *const *g = grads;
    float gs = 1.0f;
    if (o->slot_acc >= 0) {
        float **acc = o->slots[o->slot_acc];
        for (int p = 0; p < o->nparams; p++) {
            float *restrict a = acc[p];
            const float *restrict gp = grads[p];
            int64_t n = o->sizes[p];
#pragma omp parallel for simd if (n >= OPTIM_OMP_MIN) schedule(static)
            for (int64_t i = 0; i < n; i++) a[i] += gp[i];
        }
        if (++o->accum_count < opt->accum_steps) return ENG_STATUS_OK;
        g = (const float *const *)acc;
        gs = 1.0f / (float)opt->accum_steps;
    }
    double ss = 0;
    for (int p = 0; p < o->nparams; p++) ss += sum_squares(g[p], o->sizes[p], gs);
    double norm = sqrt(ss);
    o->last_norm = (float)norm;
    if (opt->clipnorm > 0 && norm > opt->clipnorm) gs = (float)((double)gs * opt->clipnorm / norm);

    float lr = (float)optim_lr_at(opt, o->step);
    if (opt->kind == ENG_OPTIM_SGD) {
        for (int p = 0; p < o->nparams; p++) {
            if (o->slot_m >= 0)
                sgd_momentum(params[p], g[p], o->slots[o->slot_m][p], o->sizes[p], lr, gs, opt->weight_decay,
                             opt->momentum, opt->nesterov);
            else
                sgd_plain(params[p], g[p], o->sizes[p], lr, gs, opt->weight_decay);
        }
    } else {
        double t = (double)(o->step + 1);
        float ibc1 = (float)(1.0 / (1.0 - pow((double)opt->beta1, t)));
        float ibc2 = (float)(1.0 / (1.0 - pow((double)opt->beta2, t)));
        float wd = opt->kind == ENG_OPTIM_ADAM ? opt->weight_decay : 0.0f;
        float dwd = opt->kind == ENG_OPTIM_ADAMW ? lr * opt->weight_decay : 0.0f;
        for (int p = 0; p < o->nparams; p++)
            adam_update(params[p], g[p], o->slots[o->slot_m][p], o->slots[o->slot_v][p], o->sizes[p], lr, gs, wd, dwd,
                        opt->beta1, opt->beta2, ibc1, ibc2, opt->eps);
    }
    if (o->slot_acc >= 0) {
        for (int p = 0; p < o->nparams; p++) memset(o->slots[o->slot_acc][p], 0, (size_t)o->sizes[p] * sizeof(float));
        o->accum_count = 0;
    }
    o->step++;
    if (applied) *applied = 1;
    return ENG_STATUS_OK;
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
    for (int s = 0; s < o->nslots; s++)
        for (int p = 0; p < o->nparams; p++) {
            size_t nb = (size_t)o->sizes[p] * sizeof(float);
            memcpy(b, o->slots[s][p], nb);
            b += nb;
        }
    return ENG_STATUS_OK;
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
    for (int s = 0; s < o->nslots; s++)
        for (int p = 0; p < o->nparams; p++) {
            size_t nb = (size_t)o->sizes[p] * sizeof(float);
            memcpy(o->slots[s][p], b, nb);
            b += nb;
        }
    o->step = h.step;
    o->accum_count = h.accum_count;
    return ENG_STATUS_OK;
}
