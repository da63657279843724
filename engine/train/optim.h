/* optim.h - optimizers over flat float32 parameter buffers (Keras semantics and defaults).
 *
 *   SGD:   v = momentum*v - lr*g; w += v            (nesterov: w += momentum*v - lr*g)
 *   Adam:  m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2; w -= lr * mhat / (sqrt(vhat) + eps), bias-corrected
 *   AdamW: Adam plus decoupled weight decay: w -= lr * weight_decay * w
 * weight_decay for SGD/Adam is L2 added to the gradient (g += wd*w). clipnorm > 0 rescales all gradients
 * together when their global L2 norm exceeds it. accum_steps > 1 sums gradients over that many calls and
 * applies one update on the last (averaged). Learning rate schedules: constant, step (lr * gamma^floor(step /
 * step_size)), cosine (decay to min_lr over decay_steps), each with an optional linear warm-up from 0 over
 * warmup_steps. `step` counts applied updates.
 */
#ifndef ENG_OPTIM_H
#define ENG_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "../ir/status.h"

typedef enum eng_optim_kind { ENG_OPTIM_SGD = 0, ENG_OPTIM_ADAM = 1, ENG_OPTIM_ADAMW = 2 } eng_optim_kind;
typedef enum eng_lr_schedule { ENG_LR_CONSTANT = 0, ENG_LR_STEP = 1, ENG_LR_COSINE = 2 } eng_lr_schedule;

typedef struct eng_optim_opts {
    eng_optim_kind kind;
    float lr;               /* default 0.01 (SGD), 0.001 (Adam/AdamW) when 0 */
    float momentum;         /* SGD */
    int nesterov;
    float beta1, beta2, eps;/* Adam defaults 0.9, 0.999, 1e-7 (Keras) when 0 */
    float weight_decay;
    float clipnorm;         /* 0: off */
    int accum_steps;        /* <= 1: off */
    eng_lr_schedule schedule;
    int64_t step_size;      /* STEP */
    float gamma;            /* STEP */
    int64_t decay_steps;    /* COSINE */
    float min_lr;           /* COSINE */
    int64_t warmup_steps;
} eng_optim_opts;

/* "sgd", "adam", "adamw"; -1 if unknown. */
int eng_optim_parse(const char *name);

typedef struct eng_optim eng_optim;

eng_status eng_optim_new(const eng_optim_opts *o, int nparams, const int64_t *sizes, eng_optim **out);
void eng_optim_free(eng_optim **o);
/* Learning rate for the next update. */
float eng_optim_lr(const eng_optim *o);
int64_t eng_optim_step_count(const eng_optim *o);
/* Feed one step's gradients; applies an update (returns *applied = 1) unless accumulating. Thread-compatible.
 * params/grads are host buffers; runs the CPU backend's "optim" kernels (kernels/krn-optim.h). Refused once the
 * state has moved to a device backend (eng_optim_apply_on). */
eng_status eng_optim_apply(eng_optim *o, float *const *params, const float *const *grads, int *applied);
/* eng_optim_apply for parameters and gradients that live in backend b's buffers (sizes[p] floats each), run as b's
 * "optim" kernels queued on ctx (b's execution context; NULL for host backends). Same results as eng_optim_apply
 * (the CPU kernels are the reference; a device agrees to float rounding). For a host backend the state stays in
 * host memory and the two entry points may be mixed. For a non-host backend the first call moves the state
 * (moments, accumulators, including what earlier eng_optim_apply calls or a state_load left) into b's buffers
 * (krn_buf_alloc + krn_buf_set, waits for the copies, frees the host copies); from then on the optimizer belongs to
 * b: eng_optim_apply and apply_on with another backend are refused, and state_save / state_load / eng_optim_free
 * reach the state through the ctx of the LAST apply_on call, which must stay valid until eng_optim_free. Each
 * applying call reads the per-parameter sums of squares back (krn_buf_get + krn_ctx_sync: one wait per update) to
 * form the global norm on the host; the update itself is queued and not waited for: sync ctx before reading
 * params. Returns UNSUPPORTED naming the kernel when b has no optim kernels. */
typedef struct krn_backend krn_backend; /* kernels/kernel.h */
typedef struct krn_ctx krn_ctx;
eng_status eng_optim_apply_on(eng_optim *o, const krn_backend *b, krn_ctx *ctx, float *const *params,
                              const float *const *grads, int *applied);
/* Loss scaling done by the update itself (device-resident training): the gradients of later updates are multiplied
 * by unscale (1 / the loss scale) before anything else reads them, and with skip_nonfinite an update whose gradient
 * norm is not finite (an overflow at this scale) changes nothing and counts no step; eng_optim_last_finite then
 * says 0. Defaults: 1, 0. */
void eng_optim_set_unscale(eng_optim *o, float unscale, int skip_nonfinite);
int eng_optim_last_finite(const eng_optim *o);
/* Global L2 norm of the last gradients applied (before clipping), for logging. */
float eng_optim_last_grad_norm(const eng_optim *o);
/* Checkpoint: the whole state (moments, step, accumulators) as bytes; restore checks sizes. With the state on a
 * device backend both copy through it and wait for the copies (krn_ctx_sync) before returning. */
size_t eng_optim_state_size(const eng_optim *o);
eng_status eng_optim_state_save(const eng_optim *o, void *buf, size_t len);
eng_status eng_optim_state_load(eng_optim *o, const void *buf, size_t len);

#endif
