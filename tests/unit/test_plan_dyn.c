/* test_plan_dyn.c - dynamic plans (shapes known only at run time) on the test device "sim" (engine/plan/plan-dyn.c):
 * each step placed when it runs, on sim where it has the kernel, the rest on the CPU, with counted copies; results
 * bit-equal to a CPU plan's (sim runs the CPU's kernels); a shape inference that needs data living on the device gets
 * a host copy; no device memory left after a run, a failed run, or the plan's free; a device kernel failing inside a
 * run fails that run naming the node; one whose init fails runs on the CPU instead. sim maps its buffers PROT_NONE
 * outside its own kernels and copies, so a CPU step handed device memory crashes this test. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "engine/plan/plan.h"
#include "kernels/backend-impl.h"
#include "graph-fixture.h"

enum { B = 4, K = 16, H = 8, R = B * H / 4, O = 3 };

static int node(eng_graph *g, const char *name, const char *type, const int *in, int nin) {
    int out = val(g, name);
    cr_assert_geq(eng_graph_add_node(g, name, type, "", in, nin, &out, 1), 0);
    return out;
}

static float frand(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffffff) / 16777216.0f - 0.5f;
}

/* x[B,K] -> MatMul W -> Relu -> LayerNormalization (no sim kernel: the CPU) -> Reshape to `shape` -> MatMul W2 -> y,
 * where shape = Cast<int64>(Mul(dims, one)) is computed on the device from the input dims[2] = {-1, 4}: Reshape's
 * shape inference needs it on the host. Outputs y [R,O] and Relu's output. */
static eng_graph *model(void) {
    static float w[K * H], s[H], z[H], w2[4 * O], one[2] = {1, 1};
    unsigned seed = 3;
    for (int i = 0; i < K * H; i++) w[i] = frand(&seed);
    for (int i = 0; i < H; i++) s[i] = 1.0f + frand(&seed), z[i] = frand(&seed);
    for (int i = 0; i < 4 * O; i++) w2[i] = frand(&seed);
    eng_graph *g = eng_graph_new();
    g->opset = 17;
    int x = input_f32(g, "x", 2, (int64_t[]){B, K}), dims = input_f32(g, "dims", 1, (int64_t[]){2});
    int W = init_f32(g, "W", 2, (int64_t[]){K, H}, w), S = init_f32(g, "scale", 1, (int64_t[]){H}, s);
    int Z = init_f32(g, "bias", 1, (int64_t[]){H}, z), W2 = init_f32(g, "W2", 2, (int64_t[]){4, O}, w2);
    int One = init_f32(g, "one", 1, (int64_t[]){2}, one);
    int mm = node(g, "mm", "MatMul", (int[]){x, W}, 2);
    int relu = node(g, "relu", "Relu", (int[]){mm}, 1);
    int ln = node(g, "ln", "LayerNormalization", (int[]){relu, S, Z}, 3);
    int d2 = node(g, "d2", "Mul", (int[]){dims, One}, 2);
    int shape = val(g, "shape");
    int cast = eng_graph_add_node(g, "cast", "Cast", "", &d2, 1, &shape, 1);
    eng_attr to = {.name = "to", .type = ENG_ATTR_INT, .i = ENG_DTYPE_I64};
    cr_assert_eq(eng_node_add_attr(g, cast, &to), ENG_STATUS_OK);
    int rs = node(g, "rs", "Reshape", (int[]){ln, shape}, 2);
    int y = node(g, "y", "MatMul", (int[]){rs, W2}, 2);
    list_add(&g->outputs, &g->noutputs, y);
    list_add(&g->outputs, &g->noutputs, relu);
    return g;
}

typedef struct fixture {
    eng_graph *g;
    eng_plan *p;
    float x[B * K], dims[2];
    eng_tensor in[2], out[2];
} fixture;

static eng_status fx_new(fixture *f, const krn_backend *b) {
    memset(f, 0, sizeof *f);
    unsigned seed = 11;
    for (int i = 0; i < B * K; i++) f->x[i] = 2.0f * frand(&seed);
    f->dims[0] = -1, f->dims[1] = 4;
    f->g = model();
    f->in[0] = (eng_tensor){.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {B, K}, .data = f->x};
    f->in[1] = (eng_tensor){.dtype = ENG_DTYPE_F32, .ndim = 1, .dims = {2}, .data = f->dims};
    eng_plan_opts o = {.backend = b, .nthreads = 1};
    return eng_plan_new(f->g, &o, f->in, &f->p);
}

static void fx_free(fixture *f) {
    eng_plan_free(&f->p);
    eng_graph_free(&f->g);
}

static size_t sim_used(void) {
    size_t fr, tot;
    cr_assert_eq(krn_backend_mem_info(krn_backend_sim(), 0, &fr, &tot), ENG_STATUS_OK);
    return tot - fr;
}

/* The CPU plan's outputs: y [R,O], relu [B,H]. */
static void cpu_reference(float *y, float *relu) {
    fixture f;
    cr_assert_eq(fx_new(&f, NULL), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(eng_plan_run(f.p, f.in, f.out), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(f.out[0].ndim, 2);
    cr_assert(f.out[0].dims[0] == R && f.out[0].dims[1] == O);
    memcpy(y, f.out[0].data, sizeof(float) * R * O);
    memcpy(relu, f.out[1].data, sizeof(float) * B * H);
    fx_free(&f);
}

static void check_outputs(const fixture *f, const float *y, const float *relu) {
    cr_assert(f->out[0].dims[0] == R && f->out[0].dims[1] == O, "y is [%lld,%lld]", (long long)f->out[0].dims[0],
              (long long)f->out[0].dims[1]);
    cr_assert_eq(memcmp(f->out[0].data, y, sizeof(float) * R * O), 0, "y differs from the CPU plan's");
    cr_assert_eq(memcmp(f->out[1].data, relu, sizeof(float) * B * H), 0, "relu differs from the CPU plan's");
}

Test(plan_dyn, steps_run_on_sim_where_it_can_with_counted_copies_and_nothing_left_on_the_device) {
    float y[R * O], relu[B * H];
    cpu_reference(y, relu);
    fixture f;
    cr_assert_eq(fx_new(&f, krn_backend_sim()), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(eng_plan_dynamic(f.p), 1, "Reshape's shape is computed: the plan must be dynamic");
    for (int rep = 0; rep < 2; rep++) { /* the second run reuses nothing on the device, and leaves nothing */
        cr_assert_eq(eng_plan_run(f.p, f.in, f.out), ENG_STATUS_OK, "%s", eng_last_error());
        check_outputs(&f, y, relu);
        cr_assert_eq(sim_used(), 0, "run %d left %zu bytes on the device", rep, sim_used());
        eng_plan_stats st;
        eng_plan_get_stats(f.p, &st);
        cr_assert_eq(st.dynamic, 1);
        cr_assert_eq(st.steps, 6); /* the Reshape copies, no kernel */
        /* MatMul, Relu, Mul, Cast, MatMul on sim; LayerNormalization on the CPU */
        cr_assert_eq(st.device_steps, 5, "device steps %d", st.device_steps);
        cr_assert_eq(st.fallback_steps, 1, "fallback steps %d", st.fallback_steps);
        /* up: x, W, dims, one, the reshaped LayerNorm output, W2 (no session: constants per run); down: relu (for
         * LayerNorm, and then also the output), shape (for Reshape's inference), y */
        cr_assert_eq(st.copies, 9, "copies %d", st.copies);
        size_t f4 = sizeof(float);
        cr_assert_eq(st.copy_bytes, f4 * (B * K + K * H + 2 + 2 + R * 4 + 4 * O + B * H + R * O) + 2 * sizeof(int64_t),
                     "copy bytes %zu", st.copy_bytes);
        cr_assert_eq(st.device_bytes, 0);
    }
    fx_free(&f);
    cr_assert_eq(sim_used(), 0);
}

Test(plan_dyn, a_device_kernel_failing_fails_that_run_naming_the_node_and_frees_the_device) {
    float y[R * O], relu[B * H];
    cpu_reference(y, relu);
    fixture f;
    cr_assert_eq(fx_new(&f, krn_backend_sim()), ENG_STATUS_OK, "%s", eng_last_error());
    setenv("TENSORD_SIM_FAIL_KERNEL", "eltwise_cast", 1);
    eng_status s = eng_plan_run(f.p, f.in, f.out);
    unsetenv("TENSORD_SIM_FAIL_KERNEL");
    cr_assert_eq(s, ENG_STATUS_INTERNAL, "%s", eng_last_error());
    cr_assert(strstr(eng_last_error(), "node 'cast' (Cast)") && strstr(eng_last_error(), "injected"), "%s",
              eng_last_error());
    cr_assert_eq(sim_used(), 0, "the failed run left %zu bytes on the device", sim_used());
    cr_assert_eq(eng_plan_run(f.p, f.in, f.out), ENG_STATUS_OK, "%s", eng_last_error()); /* the next run is fine */
    check_outputs(&f, y, relu);
    fx_free(&f);
    cr_assert_eq(sim_used(), 0);
}

Test(plan_dyn, out_of_device_memory_in_a_run_fails_it_naming_the_device_and_frees_what_it_took) {
    fixture f;
    cr_assert_eq(fx_new(&f, krn_backend_sim()), ENG_STATUS_OK, "%s", eng_last_error());
    setenv("TENSORD_SIM_MEMORY", "8192", 1); /* two pages: x and W fit, MatMul's output does not */
    eng_status s = eng_plan_run(f.p, f.in, f.out);
    unsetenv("TENSORD_SIM_MEMORY");
    cr_assert_eq(s, ENG_STATUS_OUT_OF_MEMORY, "%s", eng_last_error());
    cr_assert(strstr(eng_last_error(), "node 'mm' (MatMul)") && strstr(eng_last_error(), "sim:0: out of memory"), "%s",
              eng_last_error());
    cr_assert_eq(sim_used(), 0, "the failed run left %zu bytes on the device", sim_used());
    fx_free(&f);
}

Test(plan_dyn, a_device_kernel_whose_init_fails_runs_that_node_on_the_cpu_from_then_on) {
    float y[R * O], relu[B * H];
    cpu_reference(y, relu);
    fixture f;
    cr_assert_eq(fx_new(&f, krn_backend_sim()), ENG_STATUS_OK, "%s", eng_last_error());
    setenv("TENSORD_SIM_FAIL_INIT", "matmul", 1); /* as a cuBLASLt algorithm search can fail */
    eng_status s = eng_plan_run(f.p, f.in, f.out);
    unsetenv("TENSORD_SIM_FAIL_INIT");
    cr_assert_eq(s, ENG_STATUS_OK, "%s", eng_last_error());
    check_outputs(&f, y, relu);
    for (int rep = 0; rep < 2; rep++) {
        eng_plan_stats st;
        eng_plan_get_stats(f.p, &st);
        cr_assert_eq(st.device_steps, 3, "run %d: Relu, Mul, Cast on sim: %d", rep, st.device_steps);
        cr_assert_eq(st.fallback_steps, 3, "run %d: both MatMuls and LayerNorm on the CPU: %d", rep, st.fallback_steps);
        cr_assert_eq(sim_used(), 0);
        /* the next run keeps them there although the init would now succeed */
        if (rep == 0) cr_assert_eq(eng_plan_run(f.p, f.in, f.out), ENG_STATUS_OK, "%s", eng_last_error());
    }
    check_outputs(&f, y, relu);
    fx_free(&f);
}

Test(plan_dyn, a_host_plan_with_dynamic_shapes_is_unchanged) {
    fixture f;
    cr_assert_eq(fx_new(&f, NULL), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(eng_plan_run(f.p, f.in, f.out), ENG_STATUS_OK, "%s", eng_last_error());
    eng_plan_stats st;
    eng_plan_get_stats(f.p, &st);
    cr_assert_eq(st.dynamic, 1);
    cr_assert_eq(st.device_steps, 0);
    cr_assert_eq(st.fallback_steps, 0);
    cr_assert_eq(st.copies, 0);
    fx_free(&f);
}
