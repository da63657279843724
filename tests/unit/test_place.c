/* test_place.c - device plans (engine/plan/plan-place.c) on the host-memory test device "sim" (kernels/sim): steps
 * placed where the device has the kernel, the rest on the CPU with counted copies, results bit-equal to the CPU's;
 * device names; the bad conditions a GPU has (out of memory while planning, a kernel failing inside a run). sim
 * maps its buffers PROT_NONE outside its own kernels and copies, so a CPU step handed device memory would crash
 * this test instead of passing by luck. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/plan/plan.h"
#include "engine/plan/session.h"
#include "kernels/backend-impl.h"
#include "graph-fixture.h"

enum { B = 4, K = 16, H = 32 };

/* x[B,K] -> MatMul W[K,H] -> Add b -> LayerNormalization (sim has no kernel: the CPU) -> Relu -> MatMul W2[H,H]
 *   -> Softmax -> y; plus Relu's output as a second graph output. */
static eng_graph *mlp(void) {
    static float w[K * H], b[H], s[H], z[H], w2[H * H];
    unsigned seed = 7;
    for (int i = 0; i < K * H; i++) w[i] = gfx_frand(&seed);
    for (int i = 0; i < H; i++) b[i] = gfx_frand(&seed), s[i] = 1.0f + gfx_frand(&seed), z[i] = gfx_frand(&seed);
    for (int i = 0; i < H * H; i++) w2[i] = gfx_frand(&seed);
    eng_graph *g = eng_graph_new();
    g->opset = 17;
    int x = input_f32(g, "x", 2, (int64_t[]){B, K});
    int W = init_f32(g, "W", 2, (int64_t[]){K, H}, w), bb = init_f32(g, "b", 1, (int64_t[]){H}, b);
    int S = init_f32(g, "scale", 1, (int64_t[]){H}, s), Z = init_f32(g, "bias", 1, (int64_t[]){H}, z);
    int W2 = init_f32(g, "W2", 2, (int64_t[]){H, H}, w2);
    int mm = gfx_node(g, "mm", "MatMul", (int[]){x, W}, 2);
    int add = gfx_node(g, "add", "Add", (int[]){mm, bb}, 2);
    int ln = gfx_node(g, "ln", "LayerNormalization", (int[]){add, S, Z}, 3);
    int relu = gfx_node(g, "relu", "Relu", (int[]){ln}, 1);
    int mm2 = gfx_node(g, "mm2", "MatMul", (int[]){relu, W2}, 2);
    int y = gfx_node(g, "y", "Softmax", (int[]){mm2}, 1);
    list_add(&g->outputs, &g->noutputs, y);
    list_add(&g->outputs, &g->noutputs, relu);
    return g;
}

static void feed(float *x) {
    unsigned seed = 99;
    for (int i = 0; i < B * K; i++) x[i] = 2.0f * gfx_frand(&seed);
}

static eng_status run(const krn_backend *b, eng_precision prec, float *y, float *r, eng_plan_stats *st) {
    eng_graph *g = mlp();
    float x[B * K];
    feed(x);
    eng_tensor in = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {B, K}, .data = x};
    eng_plan_opts o = {.backend = b, .nthreads = 1, .precision = prec};
    eng_plan *p = NULL;
    eng_status s = eng_plan_new(g, &o, &in, &p);
    eng_tensor out[2];
    for (int rep = 0; s == ENG_STATUS_OK && rep < 2; rep++) s = eng_plan_run(p, &in, out); /* twice: reuse */
    if (s == ENG_STATUS_OK) {
        memcpy(y, out[0].data, sizeof(float) * B * H);
        memcpy(r, out[1].data, sizeof(float) * B * H);
        if (st) eng_plan_get_stats(p, st);
    }
    eng_plan_free(&p);
    eng_graph_free(&g);
    return s;
}

Test(place, sim_runs_what_it_has_and_the_cpu_the_rest_bit_equal) {
    float y0[B * H], r0[B * H], y1[B * H], r1[B * H];
    cr_assert_eq(run(NULL, ENG_PRECISION_FP32, y0, r0, NULL), ENG_STATUS_OK, "%s", eng_last_error());
    eng_plan_stats st;
    cr_assert_eq(run(krn_backend_sim(), ENG_PRECISION_FP32, y1, r1, &st), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(memcmp(y0, y1, sizeof y0), 0, "softmax output differs from the CPU's");
    cr_assert_eq(memcmp(r0, r1, sizeof r0), 0, "relu output differs from the CPU's");
    /* MatMul, Add, Relu, MatMul, Softmax on sim; LayerNormalization on the CPU */
    cr_assert_eq(st.device_steps, 5, "device steps %d", st.device_steps);
    cr_assert_eq(st.fallback_steps, 1, "fallback steps %d", st.fallback_steps);
    /* x up; Add's output down to the CPU's LayerNorm, its output up again; y and relu down */
    cr_assert_eq(st.copies, 5, "copies %d", st.copies);
    cr_assert_eq(st.copy_bytes, sizeof(float) * (B * K + 4 * B * H));
    cr_assert_gt(st.device_bytes, sizeof(float) * (K * H + H * H)); /* weights uploaded, plus activations */
}

Test(place, bf16_plans_place_and_compute_in_bf16_on_the_device) {
    if (krn_backend_precision_check(NULL, ENG_DTYPE_BF16) != ENG_STATUS_OK) return; /* no AVX512_BF16 here */
    setenv("TENSORD_LOWP_ALL", "1", 1); /* these matmuls are below the sizes where bf16 pays */
    float y0[B * H], r0[B * H], y1[B * H], r1[B * H];
    eng_plan_stats st;
    cr_assert_eq(run(NULL, ENG_PRECISION_BF16, y0, r0, NULL), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(run(krn_backend_sim(), ENG_PRECISION_BF16, y1, r1, &st), ENG_STATUS_OK, "%s", eng_last_error());
    unsetenv("TENSORD_LOWP_ALL");
    cr_assert_eq(memcmp(y0, y1, sizeof y0), 0);
    cr_assert_gt(st.lowp_steps, 0);
}

Test(place, out_of_device_memory_fails_the_plan_with_the_device_named) {
    setenv("TENSORD_SIM_MEMORY", "8192", 1); /* two pages: the weights do not fit */
    float y[B * H], r[B * H];
    eng_status s = run(krn_backend_sim(), ENG_PRECISION_FP32, y, r, NULL);
    unsetenv("TENSORD_SIM_MEMORY");
    cr_assert_eq(s, ENG_STATUS_OUT_OF_MEMORY, "%s", eng_last_error());
    cr_assert(strstr(eng_last_error(), "sim:0: out of memory"), "%s", eng_last_error());
    size_t fr, tot;
    cr_assert_eq(krn_backend_mem_info(krn_backend_sim(), 0, &fr, &tot), ENG_STATUS_OK);
    cr_assert_eq(fr, tot, "the failed plan left %zu bytes allocated", tot - fr);
}

Test(place, a_kernel_failing_inside_a_run_fails_that_run_only) {
    eng_graph *g = mlp();
    float x[B * K];
    feed(x);
    eng_tensor in = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {B, K}, .data = x}, out[2];
    eng_plan_opts o = {.backend = krn_backend_sim(), .nthreads = 1};
    eng_plan *p = NULL;
    cr_assert_eq(eng_plan_new(g, &o, &in, &p), ENG_STATUS_OK, "%s", eng_last_error());
    setenv("TENSORD_SIM_FAIL_KERNEL", "softmax:1", 1);
    eng_status s = eng_plan_run(p, &in, out);
    cr_assert_eq(s, ENG_STATUS_INTERNAL);
    cr_assert(strstr(eng_last_error(), "node 'y' (Softmax)") && strstr(eng_last_error(), "injected"), "%s",
              eng_last_error());
    cr_assert_eq(eng_plan_run(p, &in, out), ENG_STATUS_OK, "%s", eng_last_error()); /* the next run is fine */
    unsetenv("TENSORD_SIM_FAIL_KERNEL");
    eng_plan_free(&p);
    eng_graph_free(&g);
}

Test(place, a_device_kernel_whose_init_fails_runs_that_node_on_the_cpu) {
    float y0[B * H], r0[B * H], y1[B * H], r1[B * H];
    cr_assert_eq(run(NULL, ENG_PRECISION_FP32, y0, r0, NULL), ENG_STATUS_OK, "%s", eng_last_error());
    setenv("TENSORD_SIM_FAIL_INIT", "softmax", 1); /* as a cuDNN / cuBLASLt algorithm search can fail */
    eng_plan_stats st;
    eng_status s = run(krn_backend_sim(), ENG_PRECISION_FP32, y1, r1, &st);
    unsetenv("TENSORD_SIM_FAIL_INIT");
    cr_assert_eq(s, ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(st.fallback_steps, 2, "LayerNorm and now Softmax on the CPU: %d", st.fallback_steps);
    cr_assert_eq(st.device_steps, 4);
    cr_assert_eq(memcmp(y0, y1, sizeof y0), 0);
    cr_assert_eq(memcmp(r0, r1, sizeof r0), 0);
}

Test(place, an_unnamed_node_is_named_by_the_value_it_writes) {
    eng_graph *g = mlp();
    for (int i = 0; i < g->nnodes; i++)
        if (!strcmp(g->nodes[i].op_type, "Softmax")) g->nodes[i].name[0] = 0; /* ONNX allows unnamed nodes */
    float x[B * K];
    feed(x);
    eng_tensor in = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {B, K}, .data = x}, out[2];
    eng_plan_opts o = {.backend = krn_backend_sim(), .nthreads = 1};
    eng_plan *p = NULL;
    cr_assert_eq(eng_plan_new(g, &o, &in, &p), ENG_STATUS_OK, "%s", eng_last_error());
    setenv("TENSORD_SIM_FAIL_KERNEL", "softmax", 1);
    eng_status s = eng_plan_run(p, &in, out);
    unsetenv("TENSORD_SIM_FAIL_KERNEL");
    cr_assert_eq(s, ENG_STATUS_INTERNAL);
    cr_assert(strstr(eng_last_error(), "node (Softmax) writing 'y': "), "%s", eng_last_error());
    eng_plan_free(&p);
    eng_graph_free(&g);
}

Test(place, sessions_take_a_device_and_skip_cpu_layouts) {
    eng_session_opts so = {.backend = krn_backend_sim(), .nthreads = 1};
    eng_session *s = NULL;
    cr_assert_eq(eng_session_new_graph(mlp(), &so, &s), ENG_STATUS_OK, "%s", eng_last_error());
    float x[B * K];
    feed(x);
    eng_tensor in = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {B, K}, .data = x}, out[2];
    const char *names[] = {"x"};
    cr_assert_eq(eng_session_run(s, 1, names, &in, out), ENG_STATUS_OK, "%s", eng_last_error());
    float y[B * H], r[B * H];
    cr_assert_eq(run(NULL, ENG_PRECISION_FP32, y, r, NULL), ENG_STATUS_OK);
    for (int i = 0; i < B * H; i++) cr_assert_float_eq(((float *)out[0].data)[i], y[i], 1e-6);
    eng_session_free(&s);
}

Test(place, a_sessions_plans_share_its_weights_on_the_device) {
    eng_session_opts so = {.backend = krn_backend_sim(), .nthreads = 1};
    eng_session *s = NULL;
    eng_graph *g = mlp();
    g->values[g->inputs[0]].dims[0] = -1; /* any batch */
    cr_assert_eq(eng_session_new_graph(g, &so, &s), ENG_STATUS_OK, "%s", eng_last_error());
    const char *names[] = {"x"};
    float x[8 * K];
    memset(x, 0, sizeof x);
    size_t w = sizeof(float) * (K * H + H + H * H); /* W, b, W2: what the device steps read */
    eng_plan_stats st[2];
    for (int i = 0; i < 2; i++) {
        eng_tensor in = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {4 * (i + 1), K}, .data = x}, out[2];
        cr_assert_eq(eng_session_run(s, 1, names, &in, out), ENG_STATUS_OK, "%s", eng_last_error());
        eng_session_last_stats(s, &st[i]);
        cr_assert_lt(st[i].device_bytes, w, "plan %d holds its own copy of the weights (%zu bytes)", i, st[i].device_bytes);
    }
    cr_assert_eq(eng_session_device_bytes(s), w + st[0].device_bytes + st[1].device_bytes);
    eng_session_free(&s);
    size_t fr, tot;
    cr_assert_eq(krn_backend_mem_info(krn_backend_sim(), 0, &fr, &tot), ENG_STATUS_OK);
    cr_assert_eq(fr, tot, "%zu device bytes left after the session", tot - fr);
}

Test(place, device_resident_inputs_and_outputs_skip_the_copies) {
    eng_graph *g = mlp();
    int W = eng_graph_find_value(g, "W");
    list_add(&g->inputs, &g->ninputs, W); /* the weight is fed, in device memory, as a trainer feeds its weights */
    float y0[B * H], r0[B * H], xr[B * K];
    feed(xr);
    { /* the reference: the same graph on the CPU, the weight fed from host memory */
        eng_tensor hin[2] = {{.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {B, K}, .data = xr}, *g->values[W].init}, hout[2];
        eng_plan_opts ho = {.nthreads = 1};
        eng_plan *hp = NULL;
        cr_assert_eq(eng_plan_new(g, &ho, hin, &hp), ENG_STATUS_OK, "%s", eng_last_error());
        cr_assert_eq(eng_plan_run(hp, hin, hout), ENG_STATUS_OK, "%s", eng_last_error());
        memcpy(y0, hout[0].data, sizeof y0);
        memcpy(r0, hout[1].data, sizeof r0);
        eng_plan_free(&hp);
    }
    const krn_backend *b = krn_backend_sim();
    krn_ctx *ctx = NULL;
    cr_assert_eq(krn_ctx_new(b, 0, &ctx), ENG_STATUS_OK);
    void *dW;
    size_t wb = eng_tensor_nbytes(g->values[W].init);
    cr_assert_eq(krn_buf_alloc(b, ctx, wb, &dW), ENG_STATUS_OK);
    cr_assert_eq(krn_buf_set(b, ctx, dW, g->values[W].init->data, wb), ENG_STATUS_OK);
    float x[B * K];
    feed(x);
    eng_tensor in[2] = {{.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {B, K}, .data = x},
                        {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {K, H}, .data = dW}}, out[2];
    static const unsigned char din[2] = {0, 1}, dout[2] = {1, 0}; /* y stays on the device, relu comes back */
    eng_plan_opts o = {.backend = b, .nthreads = 1, .dev_inputs = din, .dev_outputs = dout};
    eng_plan *p = NULL;
    cr_assert_eq(eng_plan_new(g, &o, in, &p), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(eng_plan_run(p, in, out), ENG_STATUS_OK, "%s", eng_last_error());
    eng_plan_stats st;
    eng_plan_get_stats(p, &st);
    cr_assert_eq(st.copies, 4, "copies %d (x up, LayerNorm down and up, relu down)", st.copies);
    float y[B * H];
    cr_assert_eq(krn_buf_get(b, ctx, y, out[0].data, sizeof y), ENG_STATUS_OK); /* a device pointer */
    cr_assert_eq(krn_ctx_sync(b, ctx), ENG_STATUS_OK);
    cr_assert_eq(memcmp(y, y0, sizeof y), 0);
    cr_assert_eq(memcmp(out[1].data, r0, sizeof r0), 0);
    eng_plan_free(&p);
    /* on the CPU backend, or without a device step, device-resident I/O is refused by name */
    o.backend = NULL;
    cr_assert_eq(eng_plan_new(g, &o, in, &p), ENG_STATUS_UNSUPPORTED);
    cr_assert(strstr(eng_last_error(), "device-resident"), "%s", eng_last_error());
    krn_buf_free(b, ctx, dW);
    krn_ctx_free(b, &ctx);
    eng_graph_free(&g);
}

Test(place, device_names) {
    const krn_backend *b;
    int dev;
    cr_assert_eq(krn_backend_by_name("cpu", &b, &dev), ENG_STATUS_OK);
    cr_assert_eq(b, krn_backend_cpu());
    cr_assert_eq(krn_backend_by_name("sim:1", &b, &dev), ENG_STATUS_OK);
    cr_assert_eq(dev, 1);
    cr_assert_str_eq(krn_backend_name(b), "sim");
    cr_assert_eq(krn_backend_by_name("sim:2", &b, &dev), ENG_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(eng_last_error(), "sim has 2 devices (0..1)"), "%s", eng_last_error());
    cr_assert_eq(krn_backend_by_name("tpu:0", &b, &dev), ENG_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(eng_last_error(), "unknown kind 'tpu'"), "%s", eng_last_error());
    cr_assert_eq(krn_backend_by_name("cuda:x", &b, &dev), ENG_STATUS_INVALID_ARGUMENT);
    const krn_backend *cu = NULL;
    eng_status s = krn_backend_by_name("cuda:0", &cu, &dev);
    if (s != ENG_STATUS_OK) { /* no GPU here: the reason names what is missing */
        cr_assert_eq(s, ENG_STATUS_UNSUPPORTED);
        cr_assert(strstr(eng_last_error(), "device 'cuda:0' is not available: "), "%s", eng_last_error());
        const char *why = krn_cuda_unavailable_reason();
        cr_assert_str_neq(why, "");
        /* a built plugin must load (every engine symbol it calls exported by this binary) and fail only for want of
         * a driver or a device */
        cr_assert(!strstr(why, "did not load") && !strstr(why, "lacks") && !strstr(why, "another tensord"), "%s", why);
        cr_assert_eq(krn_backend_auto(&dev), krn_backend_cpu());
        cr_assert(!strncmp(krn_backend_auto_note(), "no CUDA device, using CPU (", 27), "%s", krn_backend_auto_note());
    } else {
        cr_assert_str_eq(krn_backend_name(cu), "cuda");
        cr_assert_eq(krn_backend_auto(&dev), cu);
    }
}

/* The optimizer update as a kernel on a device (engine/train/optim.c, kernels/krn-optim.h): weights, gradients and
 * the Adam moments in sim buffers give the CPU's weights bit for bit, clipping and a checkpoint of the state
 * included. */
#include "engine/train/optim.h"

Test(place, optimizer_updates_device_buffers_like_the_cpu) {
    enum { N0 = 37, N1 = 5 };
    int64_t sizes[2] = {N0, N1};
    eng_optim_opts oo = {.kind = ENG_OPTIM_ADAM, .lr = 0.01f, .clipnorm = 0.5f};
    eng_optim *cpu = NULL, *dev = NULL;
    cr_assert_eq(eng_optim_new(&oo, 2, sizes, &cpu), ENG_STATUS_OK);
    cr_assert_eq(eng_optim_new(&oo, 2, sizes, &dev), ENG_STATUS_OK);
    const krn_backend *b = krn_backend_sim();
    krn_ctx *ctx = NULL;
    cr_assert_eq(krn_ctx_new(b, 0, &ctx), ENG_STATUS_OK);
    float w[2][N0], g[2][N0], back[N0];
    void *dw[2], *dg[2];
    unsigned seed = 5;
    for (int p = 0; p < 2; p++) {
        int64_t n = sizes[p];
        for (int64_t i = 0; i < n; i++) w[p][i] = gfx_frand(&seed);
        cr_assert_eq(krn_buf_alloc(b, ctx, (size_t)n * 4, &dw[p]), ENG_STATUS_OK);
        cr_assert_eq(krn_buf_alloc(b, ctx, (size_t)n * 4, &dg[p]), ENG_STATUS_OK);
        cr_assert_eq(krn_buf_set(b, ctx, dw[p], w[p], (size_t)n * 4), ENG_STATUS_OK);
    }
    for (int step = 0; step < 3; step++) {
        for (int p = 0; p < 2; p++) {
            for (int64_t i = 0; i < sizes[p]; i++) g[p][i] = gfx_frand(&seed);
            cr_assert_eq(krn_buf_set(b, ctx, dg[p], g[p], (size_t)sizes[p] * 4), ENG_STATUS_OK);
        }
        float *wp[2] = {w[0], w[1]}, *dwp[2] = {dw[0], dw[1]};
        const float *gp[2] = {g[0], g[1]}, *dgp[2] = {dg[0], dg[1]};
        int a1 = 0, a2 = 0;
        cr_assert_eq(eng_optim_apply(cpu, wp, gp, &a1), ENG_STATUS_OK, "%s", eng_last_error());
        cr_assert_eq(eng_optim_apply_on(dev, b, ctx, dwp, dgp, &a2), ENG_STATUS_OK, "%s", eng_last_error());
        cr_assert(a1 && a2);
    }
    for (int p = 0; p < 2; p++) {
        cr_assert_eq(krn_buf_get(b, ctx, back, dw[p], (size_t)sizes[p] * 4), ENG_STATUS_OK);
        cr_assert_eq(krn_ctx_sync(b, ctx), ENG_STATUS_OK);
        cr_assert_eq(memcmp(back, w[p], (size_t)sizes[p] * 4), 0, "param %d differs from the CPU's update", p);
    }
    cr_assert_float_eq(eng_optim_last_grad_norm(cpu), eng_optim_last_grad_norm(dev), 0);
    { /* loss scaling on the device: an overflowed gradient skips the update, changing nothing */
        float inf[N0];
        for (int i = 0; i < N0; i++) inf[i] = i == 3 ? INFINITY : 1.0f;
        cr_assert_eq(krn_buf_set(b, ctx, dg[0], inf, sizeof(float) * N0), ENG_STATUS_OK);
        float *dwp[2] = {dw[0], dw[1]};
        const float *dgp[2] = {dg[0], dg[1]};
        int64_t steps = eng_optim_step_count(dev);
        int a = 1;
        eng_optim_set_unscale(dev, 1.0f / 1024, 1);
        cr_assert_eq(eng_optim_apply_on(dev, b, ctx, dwp, dgp, &a), ENG_STATUS_OK, "%s", eng_last_error());
        cr_assert(!a && !eng_optim_last_finite(dev) && eng_optim_step_count(dev) == steps);
        eng_optim_set_unscale(dev, 1.0f, 0);
    }
    size_t n1 = eng_optim_state_size(cpu), n2 = eng_optim_state_size(dev);
    cr_assert_eq(n1, n2);
    char *s1 = malloc(n1), *s2 = malloc(n2);
    cr_assert_eq(eng_optim_state_save(cpu, s1, n1), ENG_STATUS_OK);
    cr_assert_eq(eng_optim_state_save(dev, s2, n2), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(memcmp(s1, s2, n1), 0, "checkpointed optimizer state differs");
    free(s1);
    free(s2);
    eng_optim_free(&cpu);
    eng_optim_free(&dev);
    for (int p = 0; p < 2; p++) krn_buf_free(b, ctx, dw[p]), krn_buf_free(b, ctx, dg[p]);
    krn_ctx_free(b, &ctx);
}
