/* loss-scale.h - loss scaling for mixed-precision training (Keras' LossScaleOptimizer, PyTorch's GradScaler).
 *
 * The backward pass starts from dloss = scale instead of 1, so small fp16 gradients do not flush to zero; after
 * it, eng_loss_scaler_step checks every gradient: all finite -> they are divided by the scale in place and the
 * update goes ahead; any inf/NaN -> the step is skipped. Dynamic scaling halves the scale on a skipped step and
 * doubles it after growth_steps finite steps in a row (Keras' defaults: 2^15 and 2000). Scales are powers of two
 * when the initial one is, so scaling and unscaling are exact wherever nothing overflows.
 */
#ifndef ENG_LOSS_SCALE_H
#define ENG_LOSS_SCALE_H

#include <stdint.h>

#define ENG_LOSS_SCALE_INIT 32768.0
#define ENG_LOSS_SCALE_GROWTH_STEPS 2000
#define ENG_LOSS_SCALE_MIN 0x1p-24 /* a dynamic scale halved below this: the gradients are not finite at any scale */

typedef enum eng_loss_scale_mode {
    ENG_LOSS_SCALE_NONE = 0,
    ENG_LOSS_SCALE_DYNAMIC,
    ENG_LOSS_SCALE_FIXED,
} eng_loss_scale_mode;

typedef struct eng_loss_scaler {
    eng_loss_scale_mode mode;
    double scale;          /* the current scale (1 with NONE) */
    int64_t growth_steps;  /* DYNAMIC: finite steps in a row before the scale doubles */
    int64_t good;          /* finite steps since the last change */
    int64_t skipped;       /* steps skipped for a non-finite gradient, all time */
} eng_loss_scaler;

/* init <= 0: ENG_LOSS_SCALE_INIT; growth_steps <= 0: ENG_LOSS_SCALE_GROWTH_STEPS. */
void eng_loss_scaler_init(eng_loss_scaler *s, eng_loss_scale_mode mode, double init, int64_t growth_steps);

/* The value the backward pass is seeded with this step (float: a scale past FLT_MAX is inf, and the step that
 * uses it overflows and is skipped, which halves it). */
float eng_loss_scaler_value(const eng_loss_scaler *s);

/* grads[i] holds n[i] floats scaled by the current scale. Returns 1 (all finite: unscaled in place; apply the
 * update), 0 (skip this step; the dynamic scale halved) or -1 (not finite at a fixed scale, or the dynamic scale
 * fell below ENG_LOSS_SCALE_MIN: training has diverged; the caller fails). NONE: always 1, grads untouched. */
int eng_loss_scaler_step(eng_loss_scaler *s, float *const *grads, const int64_t *n, int count);
/* The same bookkeeping for gradients checked and unscaled elsewhere (device-resident training: the optimizer kernel
 * unscales them and skips the update when their norm is not finite, eng_optim_set_unscale): finite says whether
 * they were; returns as eng_loss_scaler_step. */
int eng_loss_scaler_observe(eng_loss_scaler *s, int finite);

/* "none", "dynamic" or a positive number (a fixed scale); 0 ok, -1 not one of those. */
int eng_loss_scale_parse(const char *text, eng_loss_scale_mode *mode, double *value);

#endif
