/* test_graphs.c - device plans replayed as graphs (engine/plan/plan-graph.c) on the test device "sim", whose graphs
 * record work instead of running it and replay the records at launch as CUDA Graphs do (kernels/sim/sim-graph.c):
 * outputs bit-equal to the CPU's run after run with new input values in new host buffers, one capture then
 * launches; the switches that turn graphs off and the plans that must not use them; a kernel failing during the
 * capture, and a launch failing, leave the plan running eagerly with the right results or the eager error. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "engine/plan/plan.h"
#include "kernels/backend-impl.h"
#include "graph-fixture.h"

enum { B = 4, K = 16, H = 32, RUNS = 7 };

/* x[B,K] -> MatMul W -> Add b -> Relu -> Flatten (an alias) -> Add x2[B,H] (a second input, first read mid-run) ->
 * MatMul W2 -> Softmax -> y. Outputs: y, relu, Identity(x2) (an alias of an input: the caller's memory). With
 * `cpu_step`, a LayerNormalization (no sim kernel: the CPU) after the first Add. */
static eng_graph *net(int cpu_step) {
    static float w[K * H], b[H], s[H], z[H], w2[H * H];
    unsigned seed = 5;
    for (int i = 0; i < K * H; i++) w[i] = gfx_frand(&seed);
    for (int i = 0; i < H; i++) b[i] = gfx_frand(&seed), s[i] = 1.0f + gfx_frand(&seed), z[i] = gfx_frand(&seed);
    for (int i = 0; i < H * H; i++) w2[i] = gfx_frand(&seed);
    eng_graph *g = eng_graph_new();
    g->opset = 17;
    int x = input_f32(g, "x", 2, (int64_t[]){B, K}), x2 = input_f32(g, "x2", 2, (int64_t[]){B, H});
    int W = init_f32(g, "W", 2, (int64_t[]){K, H}, w), bb = init_f32(g, "b", 1, (int64_t[]){H}, b);
    int W2 = init_f32(g, "W2", 2, (int64_t[]){H, H}, w2);
    int mm = gfx_node(g, "mm", "MatMul", (int[]){x, W}, 2);
    int add = gfx_node(g, "add", "Add", (int[]){mm, bb}, 2);
    if (cpu_step) {
        int S = init_f32(g, "scale", 1, (int64_t[]){H}, s), Z = init_f32(g, "bias", 1, (int64_t[]){H}, z);
        add = gfx_node(g, "ln", "LayerNormalization", (int[]){add, S, Z}, 3);
    }
    int relu = gfx_node(g, "relu", "Relu", (int[]){add}, 1);
    int fl = gfx_node(g, "flat", "Flatten", (int[]){relu}, 1);
    int add2 = gfx_node(g, "add2", "Add", (int[]){fl, x2}, 2);
    int mm2 = gfx_node(g, "mm2", "MatMul", (int[]){add2, W2}, 2);
    int y = gfx_node(g, "y", "Softmax", (int[]){mm2}, 1);
    int xid = gfx_node(g, "x2_id", "Identity", (int[]){x2}, 1);
    list_add(&g->outputs, &g->noutputs, y);
    list_add(&g->outputs, &g->noutputs, relu);
    list_add(&g->outputs, &g->noutputs, xid);
    return g;
}

/* Inputs of run `run`: new values, and in a buffer of their own (host staging must not be the caller's memory). */
typedef struct feed { float x[B * K], x2[B * H]; } feed;
static void fill(feed *f, int run) {
    unsigned seed = 1000u + 77u * (unsigned)run;
    for (int i = 0; i < B * K; i++) f->x[i] = 3.0f * gfx_frand(&seed);
    for (int i = 0; i < B * H; i++) f->x2[i] = gfx_frand(&seed);
}
static void as_inputs(feed *f, eng_tensor in[2]) {
    in[0] = (eng_tensor){.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {B, K}, .data = f->x};
    in[1] = (eng_tensor){.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {B, H}, .data = f->x2};
}

/* Runs the graph RUNS times on the CPU and on sim (opts o) with new inputs each run, asserting bit-equal outputs after
 * every run unless a run is expected to fail (fail_run, 1-based; 0: none), which must fail with `fail_msg` in its
 * error. *st: the sim plan's stats at the end. */
static void compare_runs(int cpu_step, eng_plan_opts o, int fail_run, const char *fail_msg, eng_plan_stats *st) {
    eng_graph *g = net(cpu_step);
    feed *f = calloc(RUNS, sizeof *f);
    cr_assert(f);
    for (int r = 0; r < RUNS; r++) fill(&f[r], r);
    eng_tensor in[2], ho[3], dout[3];
    as_inputs(&f[0], in);
    eng_plan_opts co = {.nthreads = 1};
    eng_plan *cp = NULL, *dp = NULL;
    cr_assert_eq(eng_plan_new(g, &co, in, &cp), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(eng_plan_new(g, &o, in, &dp), ENG_STATUS_OK, "%s", eng_last_error());
    for (int r = 0; r < RUNS; r++) {
        as_inputs(&f[r], in);
        cr_assert_eq(eng_plan_run(cp, in, ho), ENG_STATUS_OK, "%s", eng_last_error());
        eng_status s = eng_plan_run(dp, in, dout);
        if (r + 1 == fail_run) {
            cr_assert_neq(s, ENG_STATUS_OK, "run %d should have failed", r + 1);
            cr_assert(strstr(eng_last_error(), fail_msg), "run %d: %s", r + 1, eng_last_error());
            continue;
        }
        cr_assert_eq(s, ENG_STATUS_OK, "run %d: %s", r + 1, eng_last_error());
        cr_assert_eq(memcmp(ho[0].data, dout[0].data, sizeof(float) * B * H), 0, "run %d: y differs from the CPU's", r + 1);
        cr_assert_eq(memcmp(ho[1].data, dout[1].data, sizeof(float) * B * H), 0, "run %d: relu differs", r + 1);
        cr_assert_eq(memcmp(f[r].x2, dout[2].data, sizeof(float) * B * H), 0, "run %d: Identity(x2) differs", r + 1);
    }
    eng_plan_get_stats(dp, st);
    eng_plan_free(&cp);
    eng_plan_free(&dp);
    eng_graph_free(&g);
    free(f);
}

static eng_plan_opts sim_opts(void) { return (eng_plan_opts){.backend = krn_backend_sim(), .nthreads = 1}; }

Test(graphs, sim_replays_runs_with_new_inputs_bit_equal_to_the_cpu) {
    eng_plan_stats st;
    compare_runs(0, sim_opts(), 0, NULL, &st);
    cr_assert_eq(st.fallback_steps, 0);
    cr_assert_eq(st.graphs, 1, "graphs off: %s", st.graph_off ? st.graph_off : "?");
    cr_assert_null(st.graph_off);
    cr_assert_eq(st.graph_captures, 1);
    /* run 1 eager, run 2 captured and launched, runs 3.. launched */
    cr_assert_eq(st.graph_launches, RUNS - 1, "launches %lld", (long long)st.graph_launches);
}

Test(graphs, turned_off_by_env_or_option) {
    eng_plan_stats st;
    setenv("TENSORD_CUDA_GRAPHS", "0", 1);
    compare_runs(0, sim_opts(), 0, NULL, &st);
    unsetenv("TENSORD_CUDA_GRAPHS");
    cr_assert_eq(st.graphs, 0);
    cr_assert_eq(st.graph_captures, 0);
    cr_assert_eq(st.graph_launches, 0);
    cr_assert(st.graph_off && strstr(st.graph_off, "TENSORD_CUDA_GRAPHS=0"), "%s", st.graph_off);
    eng_plan_opts o = sim_opts();
    o.no_graphs = 1;
    compare_runs(0, o, 0, NULL, &st);
    cr_assert_eq(st.graph_launches, 0);
    cr_assert_eq(st.graph_captures, 0);
    cr_assert(st.graph_off && strstr(st.graph_off, "options"), "%s", st.graph_off);
}

Test(graphs, a_plan_with_a_cpu_step_is_not_captured) {
    eng_plan_stats st;
    compare_runs(1, sim_opts(), 0, NULL, &st);
    cr_assert_eq(st.fallback_steps, 1);
    cr_assert_eq(st.graphs, 0);
    cr_assert_eq(st.graph_captures, 0);
    cr_assert_eq(st.graph_launches, 0);
    cr_assert(st.graph_off && strstr(st.graph_off, "CPU"), "%s", st.graph_off);
}

Test(graphs, host_plans_have_no_graphs) {
    eng_graph *g = net(0);
    feed f;
    fill(&f, 0);
    eng_tensor in[2], out[3];
    as_inputs(&f, in);
    eng_plan_opts o = {.nthreads = 1};
    eng_plan *p = NULL;
    cr_assert_eq(eng_plan_new(g, &o, in, &p), ENG_STATUS_OK, "%s", eng_last_error());
    for (int r = 0; r < 3; r++) cr_assert_eq(eng_plan_run(p, in, out), ENG_STATUS_OK, "%s", eng_last_error());
    eng_plan_stats st;
    eng_plan_get_stats(p, &st);
    cr_assert_eq(st.graphs, 0);
    cr_assert_eq(st.graph_launches, 0);
    cr_assert_eq(krn_backend_has_graphs(NULL), 0);
    cr_assert_eq(krn_backend_has_graphs(krn_backend_sim()), 1);
    eng_plan_free(&p);
    eng_graph_free(&g);
}

/* Softmax runs once per run; recording it counts no exec, its replay does: the 2nd is the one the capturing run's
 * launch replays. That run fails at its sync with the kernel's error, as an eager run fails; the graph stays and the
 * later runs are right. */
Test(graphs, a_kernel_failing_in_the_captured_run_fails_that_run_only) {
    setenv("TENSORD_SIM_FAIL_KERNEL", "softmax:2", 1);
    eng_plan_stats st;
    compare_runs(0, sim_opts(), 2, "kernel 'softmax': injected launch failure", &st);
    unsetenv("TENSORD_SIM_FAIL_KERNEL");
    cr_assert_eq(st.graphs, 1);
    cr_assert_eq(st.graph_captures, 1);
    cr_assert_eq(st.graph_launches, RUNS - 1);
}

/* A kernel that fails every time: the eager warm-up run fails naming the node, each graph run fails naming the
 * kernel and the device; once it stops failing, the graph's runs are right again. */
Test(graphs, a_kernel_failing_always_fails_each_run_as_eager_runs_do) {
    setenv("TENSORD_SIM_FAIL_KERNEL", "softmax", 1);
    eng_graph *g = net(0);
    feed f;
    fill(&f, 0);
    eng_tensor in[2], out[3], ho[3];
    as_inputs(&f, in);
    eng_plan_opts o = sim_opts(), co = {.nthreads = 1};
    eng_plan *p = NULL, *cp = NULL;
    cr_assert_eq(eng_plan_new(g, &o, in, &p), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(eng_plan_new(g, &co, in, &cp), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(eng_plan_run(p, in, out), ENG_STATUS_INTERNAL);
    cr_assert(strstr(eng_last_error(), "node 'y' (Softmax)") && strstr(eng_last_error(), "injected launch failure"), "%s",
              eng_last_error());
    for (int r = 1; r < 3; r++) {
        cr_assert_eq(eng_plan_run(p, in, out), ENG_STATUS_INTERNAL, "run %d", r + 1);
        cr_assert(strstr(eng_last_error(), "sim:0") && strstr(eng_last_error(), "kernel 'softmax'") &&
                  strstr(eng_last_error(), "injected launch failure"), "run %d: %s", r + 1, eng_last_error());
    }
    unsetenv("TENSORD_SIM_FAIL_KERNEL");
    fill(&f, 1);
    cr_assert_eq(eng_plan_run(p, in, out), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(eng_plan_run(cp, in, ho), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(memcmp(ho[0].data, out[0].data, sizeof(float) * B * H), 0);
    eng_plan_stats st;
    eng_plan_get_stats(p, &st);
    cr_assert_eq(st.graph_captures, 1);
    cr_assert_eq(st.graph_launches, 3);
    eng_plan_free(&p);
    eng_plan_free(&cp);
    eng_graph_free(&g);
}

/* A kernel that cannot be captured (as a CUDA kernel allocating or synchronising in exec): the capture is discarded,
 * that run reruns eagerly from the start, and the plan stays eager, right every run. */
Test(graphs, a_failed_capture_leaves_the_plan_eager_and_right) {
    setenv("TENSORD_SIM_FAIL_CAPTURE", "matmul", 1);
    eng_plan_stats st;
    compare_runs(0, sim_opts(), 0, NULL, &st);
    unsetenv("TENSORD_SIM_FAIL_CAPTURE");
    cr_assert_eq(st.graphs, 0);
    cr_assert_eq(st.graph_captures, 0);
    cr_assert_eq(st.graph_launches, 0);
    cr_assert(st.graph_off && strstr(st.graph_off, "capture failed"), "%s", st.graph_off);
}

/* The 2nd graph launch (run 3) fails: that run reruns eagerly, right, and the plan stays eager. */
Test(graphs, a_failed_launch_reruns_eagerly) {
    setenv("TENSORD_SIM_FAIL_GRAPH", "2", 1);
    eng_plan_stats st;
    compare_runs(0, sim_opts(), 0, NULL, &st);
    unsetenv("TENSORD_SIM_FAIL_GRAPH");
    cr_assert_eq(st.graph_captures, 1);
    cr_assert_eq(st.graph_launches, 1);
    cr_assert_eq(st.graphs, 0);
    cr_assert(st.graph_off && strstr(st.graph_off, "launch failed"), "%s", st.graph_off);
}

/* sim's graphs themselves: recorded work does not run; a launch runs it with the pointers recorded, reading the host
 * memory they name at launch time; a sync while capturing invalidates the capture; the context stays usable. */
Test(graphs, sim_records_at_capture_and_runs_at_launch) {
    const krn_backend *b = krn_backend_sim();
    krn_ctx *c = NULL;
    cr_assert_eq(krn_ctx_new(b, 0, &c), ENG_STATUS_OK);
    float host[64], back[64], zero[64] = {0};
    void *d = NULL, *d2 = NULL;
    cr_assert_eq(krn_buf_alloc(b, c, sizeof host, &d), ENG_STATUS_OK);
    cr_assert_eq(krn_buf_alloc(b, c, sizeof host, &d2), ENG_STATUS_OK);
    cr_assert_eq(krn_buf_set(b, c, d, zero, sizeof zero), ENG_STATUS_OK);
    for (int i = 0; i < 64; i++) host[i] = (float)i;
    krn_graph *gr = NULL;
    cr_assert_eq(krn_graph_begin(b, c), ENG_STATUS_OK);
    cr_assert_eq(krn_buf_set(b, c, d, host, sizeof host), ENG_STATUS_OK);
    cr_assert_eq(krn_buf_copy(b, c, d2, d, sizeof host), ENG_STATUS_OK);
    cr_assert_eq(krn_graph_end(b, c, &gr), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_not_null(gr);
    cr_assert_eq(krn_buf_get(b, c, back, d, sizeof back), ENG_STATUS_OK);
    cr_assert_eq(memcmp(back, zero, sizeof back), 0, "a recorded copy ran at capture");
    cr_assert_eq(krn_graph_launch(b, c, gr), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(krn_buf_get(b, c, back, d2, sizeof back), ENG_STATUS_OK);
    cr_assert_eq(memcmp(back, host, sizeof back), 0);
    host[5] = -1.0f; /* the host memory named at capture is read at each launch */
    cr_assert_eq(krn_graph_launch(b, c, gr), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(krn_buf_get(b, c, back, d2, sizeof back), ENG_STATUS_OK);
    cr_assert_eq(back[5], -1.0f);
    krn_graph_free(b, &gr);
    cr_assert_null(gr);
    /* a sync during a capture invalidates it; the context works afterwards */
    cr_assert_eq(krn_graph_begin(b, c), ENG_STATUS_OK);
    cr_assert_eq(krn_buf_set(b, c, d, zero, sizeof zero), ENG_STATUS_OK);
    cr_assert_neq(krn_ctx_sync(b, c), ENG_STATUS_OK);
    cr_assert_neq(krn_graph_end(b, c, &gr), ENG_STATUS_OK);
    cr_assert(strstr(eng_last_error(), "sim:0") && strstr(eng_last_error(), "invalidated"), "%s", eng_last_error());
    cr_assert_null(gr);
    cr_assert_eq(krn_ctx_sync(b, c), ENG_STATUS_OK);
    cr_assert_eq(krn_buf_get(b, c, back, d2, sizeof back), ENG_STATUS_OK);
    cr_assert_eq(back[5], -1.0f, "the invalidated capture ran its copy");
    /* a graph whose buffer was freed after its capture fails its launch by name */
    cr_assert_eq(krn_graph_begin(b, c), ENG_STATUS_OK);
    cr_assert_eq(krn_buf_copy(b, c, d2, d, sizeof host), ENG_STATUS_OK);
    cr_assert_eq(krn_graph_end(b, c, &gr), ENG_STATUS_OK, "%s", eng_last_error());
    krn_buf_free(b, c, d);
    cr_assert_neq(krn_graph_launch(b, c, gr), ENG_STATUS_OK);
    cr_assert(strstr(eng_last_error(), "sim:0") && strstr(eng_last_error(), "not the device's"), "%s", eng_last_error());
    krn_graph_free(b, &gr);
    krn_buf_free(b, c, d2);
    /* host backends have none */
    cr_assert_eq(krn_graph_begin(NULL, NULL), ENG_STATUS_UNSUPPORTED);
    krn_ctx_free(b, &c);
}
