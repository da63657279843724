/* test_loss_scale.c - the loss scaler (engine/train/loss-scale.c) on crafted gradients: finite gradients are divided
 * by the scale exactly (a power of two) and the dynamic scale doubles after growth_steps of them; an inf or NaN
 * anywhere skips the step, halves the dynamic scale and restarts the growth count; a fixed scale or a dynamic one
 * halved below ENG_LOSS_SCALE_MIN reports divergence (-1); a scale past FLT_MAX feeds inf (that step overflows);
 * NONE leaves gradients alone; the parser takes none, dynamic and positive float32 values only.
 */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>

#include "engine/train/loss-scale.h"

Test(loss_scale, defaults_and_none) {
    eng_loss_scaler s;
    eng_loss_scaler_init(&s, ENG_LOSS_SCALE_DYNAMIC, 0, 0);
    cr_expect_eq(s.scale, 32768.0);
    cr_expect_eq(s.growth_steps, 2000);
    eng_loss_scaler_init(&s, ENG_LOSS_SCALE_NONE, 64, 3);
    cr_expect_eq(s.scale, 1.0);
    float g[2] = {NAN, 3.0f}, *gp[1] = {g};
    int64_t n[1] = {2};
    cr_expect_eq(eng_loss_scaler_step(&s, gp, n, 1), 1);
    cr_expect(isnan(g[0]));
    cr_expect_eq(g[1], 3.0f, "NONE does not touch gradients");
}

Test(loss_scale, finite_steps_unscale_exactly_and_grow) {
    eng_loss_scaler s;
    eng_loss_scaler_init(&s, ENG_LOSS_SCALE_DYNAMIC, 1024, 3);
    float a[37], b[5];
    for (int i = 0; i < 37; i++) a[i] = (float)(i - 18) * 0.37f * 1024.0f;
    for (int i = 0; i < 5; i++) b[i] = 1e-30f * (float)(i + 1) * 1024.0f;
    float *gp[2] = {a, b};
    int64_t n[2] = {37, 5};
    cr_assert_eq(eng_loss_scaler_step(&s, gp, n, 2), 1);
    for (int i = 0; i < 37; i++) cr_expect_eq(a[i], (float)(i - 18) * 0.37f, "a[%d] %g", i, a[i]);
    for (int i = 0; i < 5; i++) cr_expect_eq(b[i], 1e-30f * (float)(i + 1), "b[%d]", i);
    cr_expect_eq(s.scale, 1024.0);
    cr_expect_eq(eng_loss_scaler_step(&s, gp, n, 2), 1);
    cr_expect_eq(eng_loss_scaler_step(&s, gp, n, 2), 1);
    cr_expect_eq(s.scale, 2048.0, "doubles after 3 finite steps");
    cr_expect_eq(s.good, 0);
    cr_expect_eq(s.skipped, 0);
}

Test(loss_scale, inf_or_nan_skips_and_halves) {
    eng_loss_scaler s;
    eng_loss_scaler_init(&s, ENG_LOSS_SCALE_DYNAMIC, 4096, 2);
    float a[40] = {0}, b[3] = {1, 2, 3};
    float *gp[2] = {a, b};
    int64_t n[2] = {40, 3};
    cr_assert_eq(eng_loss_scaler_step(&s, gp, n, 2), 1); /* good = 1 */
    a[33] = INFINITY;
    cr_expect_eq(eng_loss_scaler_step(&s, gp, n, 2), 0);
    cr_expect_eq(s.scale, 2048.0);
    cr_expect_eq(s.skipped, 1);
    cr_expect_eq(s.good, 0, "the growth count restarts");
    cr_expect_eq(b[0], 1.0f / 4096.0f, "a skipped step leaves the gradients as they were (b unscaled only by the first step)");
    a[33] = 0;
    b[2] = NAN; /* in the last array, last element */
    cr_expect_eq(eng_loss_scaler_step(&s, gp, n, 2), 0);
    cr_expect_eq(s.scale, 1024.0);
    cr_expect_eq(s.skipped, 2);
    b[2] = -FLT_MAX; /* finite */
    cr_expect_eq(eng_loss_scaler_step(&s, gp, n, 2), 1);
}

Test(loss_scale, divergence_is_reported) {
    eng_loss_scaler s;
    float g[1] = {NAN}, *gp[1] = {g};
    int64_t n[1] = {1};
    eng_loss_scaler_init(&s, ENG_LOSS_SCALE_FIXED, 256, 0);
    cr_expect_eq(eng_loss_scaler_step(&s, gp, n, 1), -1, "a fixed scale cannot recover");
    cr_expect_eq(s.scale, 256.0);
    eng_loss_scaler_init(&s, ENG_LOSS_SCALE_DYNAMIC, 1.0, 0);
    int r = 0, steps = 0;
    while ((r = eng_loss_scaler_step(&s, gp, n, 1)) == 0) steps++;
    cr_expect_eq(r, -1);
    cr_expect_eq(steps, 24, "halved from 1 down to 2^-24 (24 skips), then below it -> diverged (got %d skips)", steps);
}

Test(loss_scale, a_scale_past_float_max_feeds_inf_and_that_step_is_skipped) {
    eng_loss_scaler s;
    eng_loss_scaler_init(&s, ENG_LOSS_SCALE_DYNAMIC, 0x1p127, 1);
    float g[2] = {1, 2}, *gp[1] = {g};
    int64_t n[1] = {2};
    cr_expect_eq(eng_loss_scaler_value(&s), 0x1p127f);
    cr_assert_eq(eng_loss_scaler_step(&s, gp, n, 1), 1);
    cr_expect_eq(s.scale, 0x1p128);
    cr_expect(isinf(eng_loss_scaler_value(&s)));
    g[0] = g[1] = 5; /* even finite gradients: the seed was inf */
    cr_expect_eq(eng_loss_scaler_step(&s, gp, n, 1), 0);
    cr_expect_eq(s.scale, 0x1p127);
}

Test(loss_scale, parse) {
    eng_loss_scale_mode m;
    double v;
    cr_expect_eq(eng_loss_scale_parse("none", &m, &v), 0);
    cr_expect_eq(m, ENG_LOSS_SCALE_NONE);
    cr_expect_eq(eng_loss_scale_parse("dynamic", &m, &v), 0);
    cr_expect_eq(m, ENG_LOSS_SCALE_DYNAMIC);
    cr_expect_eq(eng_loss_scale_parse("1024", &m, &v), 0);
    cr_expect_eq(m, ENG_LOSS_SCALE_FIXED);
    cr_expect_eq(v, 1024.0);
    const char *bad[] = {"", "0", "-8", "nan", "inf", "1e39", "12x", "Dynamic", NULL};
    for (int i = 0; bad[i]; i++) cr_expect_eq(eng_loss_scale_parse(bad[i], &m, &v), -1, "'%s'", bad[i]);
    cr_expect_eq(eng_loss_scale_parse(NULL, &m, &v), -1);
}
