/* loss-scale.c - loss scaling for mixed-precision training (see loss-scale.h). */
#include "loss-scale.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void eng_loss_scaler_init(eng_loss_scaler *s, eng_loss_scale_mode mode, double init, int64_t growth_steps) {
    memset(s, 0, sizeof *s);
    s->mode = mode;
    s->scale = mode == ENG_LOSS_SCALE_NONE ? 1.0 : init > 0 ? init : ENG_LOSS_SCALE_INIT;
    s->growth_steps = growth_steps > 0 ? growth_steps : ENG_LOSS_SCALE_GROWTH_STEPS;
}

float eng_loss_scaler_value(const eng_loss_scaler *s) { return s->scale > FLT_MAX ? INFINITY : (float)s->scale; }

/* 1 when all n floats are finite. Branch-free per element (vectorised); NaN fails the <= test. */
static int all_finite(const float *g, int64_t n) {
    int bad = 0;
#pragma omp simd reduction(| : bad)
    for (int64_t k = 0; k < n; k++) bad |= !(fabsf(g[k]) <= FLT_MAX);
    return !bad;
}

int eng_loss_scaler_observe(eng_loss_scaler *s, int finite) {
    if (s->mode == ENG_LOSS_SCALE_NONE) return 1;
    if (!finite || !isfinite(eng_loss_scaler_value(s))) {
        s->skipped++;
        s->good = 0;
        if (s->mode == ENG_LOSS_SCALE_FIXED) return -1;
        s->scale *= 0.5;
        return s->scale < ENG_LOSS_SCALE_MIN ? -1 : 0;
    }
    if (s->mode == ENG_LOSS_SCALE_DYNAMIC && ++s->good >= s->growth_steps) {
        s->scale *= 2.0;
        s->good = 0;
    }
    return 1;
}

int eng_loss_scaler_step(eng_loss_scaler *s, float *const *grads, const int64_t *n, int count) {
    if (s->mode == ENG_LOSS_SCALE_NONE) return 1;
    int ok = isfinite(eng_loss_scaler_value(s));
    for (int i = 0; i < count && ok; i++) ok = all_finite(grads[i], n[i]);
    if (ok) {
        float inv = (float)(1.0 / s->scale);
        for (int i = 0; i < count; i++) {
            float *g = grads[i];
#pragma omp simd
            for (int64_t k = 0; k < n[i]; k++) g[k] *= inv;
        }
    }
    return eng_loss_scaler_observe(s, ok);
}

int eng_loss_scale_parse(const char *text, eng_loss_scale_mode *mode, double *value) {
    *value = 0;
    if (!text) return -1;
    if (!strcmp(text, "none")) {
        *mode = ENG_LOSS_SCALE_NONE;
        return 0;
    }
    if (!strcmp(text, "dynamic")) {
        *mode = ENG_LOSS_SCALE_DYNAMIC;
        return 0;
    }
    char *end = NULL;
    double v = strtod(text, &end);
    if (end == text || *end || !(v > 0) || !isfinite(v) || v > FLT_MAX) return -1;
    *mode = ENG_LOSS_SCALE_FIXED;
    *value = v;
    return 0;
}
