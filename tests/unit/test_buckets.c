/* test_buckets.c - what gradient buckets stand on (engine/train/train-buckets.c): a plan's output-ready reports
 * (eng_plan_opts.on_ready, engine/plan/plan-ready.c) and the bucketed collective (krn_comm_allreduce_many) on the
 * test device "sim", whose counters say whether a collective overlapped the plan's remaining kernels.
 *
 * Graph: x[B,K] -> MatMul W -> Relu (output 1) -> MatMul W2 -> Softmax (output 0). On sim every step is on the
 * device: Relu's output is final after the second MatMul (its last reader), Softmax's after the last step. An
 * all-reduce issued from the report (a one-rank communicator with prescale 2) doubles Relu's output in place while
 * the plan still has Softmax to run: the plan's Softmax output must stay the CPU's (it read Relu before), the
 * returned Relu output must be twice the CPU's, and sim must count one overlapped group. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine/plan/plan.h"
#include "kernels/backend-impl.h"
#include "graph-fixture.h"

enum { B = 4, K = 8, H = 16 };

static float w1[K * H], w2[H * H], x[B * K];

static eng_graph *net(void) {
    unsigned s = 5;
    for (int i = 0; i < K * H; i++) s = s * 1664525u + 1013904223u, w1[i] = (float)(s >> 8 & 0xffff) / 65536.0f - 0.5f;
    for (int i = 0; i < H * H; i++) s = s * 1664525u + 1013904223u, w2[i] = (float)(s >> 8 & 0xffff) / 65536.0f - 0.5f;
    for (int i = 0; i < B * K; i++) s = s * 1664525u + 1013904223u, x[i] = (float)(s >> 8 & 0xffff) / 32768.0f - 1.0f;
    eng_graph *g = eng_graph_new();
    g->opset = 17;
    int xv = input_f32(g, "x", 2, (int64_t[]){B, K});
    int W = init_f32(g, "W", 2, (int64_t[]){K, H}, w1), W2 = init_f32(g, "W2", 2, (int64_t[]){H, H}, w2);
    int mm = gfx_node(g, "mm", "MatMul", (int[]){xv, W}, 2);
    int relu = gfx_node(g, "relu", "Relu", (int[]){mm}, 1);
    int mm2 = gfx_node(g, "mm2", "MatMul", (int[]){relu, W2}, 2);
    int y = gfx_node(g, "y", "Softmax", (int[]){mm2}, 1);
    list_add(&g->outputs, &g->noutputs, y);
    list_add(&g->outputs, &g->noutputs, relu);
    return g;
}

typedef struct report { int idx[4], n, during; void *data[4]; } report;
typedef struct recorder {
    report r[8];
    int n;
    const krn_backend *b;
    krn_ctx *comm_ctx; /* a second context: the collective waits for the plan's event there */
    krn_comm *comm;
    krn_event *ev;
    int reduce_relu;   /* all-reduce output 1 (prescale 2) from its report */
    eng_status st;
} recorder;

static void on_ready(void *arg, krn_ctx *ctx, const int *idx, const eng_tensor *outs, int n) {
    recorder *rc = arg;
    cr_assert_lt(rc->n, 8);
    report *r = &rc->r[rc->n++];
    r->n = n;
    r->during = ctx != NULL;
    for (int j = 0; j < n && j < 4; j++) r->idx[j] = idx[j], r->data[j] = outs[j].data;
    for (int j = 0; j < n; j++) {
        if (!rc->reduce_relu || idx[j] != 1) continue;
        float *buf = outs[j].data;
        size_t len = (size_t)eng_tensor_numel(&outs[j]);
        eng_status st = ctx ? krn_event_record(rc->b, ctx, rc->ev) : ENG_STATUS_OK;
        if (st == ENG_STATUS_OK) st = krn_event_wait(rc->b, rc->comm_ctx, rc->ev);
        if (st == ENG_STATUS_OK) st = krn_comm_allreduce_many(rc->b, rc->comm, 0, rc->comm_ctx, &buf, &len, 1, 2.0f);
        if (st != ENG_STATUS_OK) rc->st = st;
    }
}

/* Runs net() on b (NULL: the CPU) with dev_outputs (NULL: host outputs); y, relu: the outputs, copied to the host. */
static eng_status run(const krn_backend *b, const unsigned char *dev_out, recorder *rc, float *y, float *relu) {
    eng_graph *g = net();
    eng_tensor in = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {B, K}, .data = x}, out[2];
    eng_plan_opts o = {.backend = b, .nthreads = 1, .dev_outputs = dev_out, .on_ready = rc ? on_ready : NULL,
                       .ready_arg = rc};
    eng_plan *p = NULL;
    eng_status st = eng_plan_new(g, &o, &in, &p);
    if (st == ENG_STATUS_OK) st = eng_plan_run(p, &in, out);
    if (st == ENG_STATUS_OK && rc && rc->n > 0) /* the reports named the memory the run returns */
        for (int i = 0; i < rc->n; i++)
            for (int j = 0; j < rc->r[i].n; j++) cr_assert_eq(rc->r[i].data[j], out[rc->r[i].idx[j]].data);
    for (int i = 0; st == ENG_STATUS_OK && i < 2; i++) {
        float *dst = i == 0 ? y : relu;
        size_t nb = sizeof(float) * B * H;
        if (dev_out && dev_out[i]) st = krn_buf_get(b, rc ? rc->comm_ctx : NULL, dst, out[i].data, nb);
        else memcpy(dst, out[i].data, nb);
    }
    eng_plan_free(&p);
    eng_graph_free(&g);
    return st;
}

static void recorder_init(recorder *rc, const krn_backend *b) {
    memset(rc, 0, sizeof *rc);
    rc->b = b;
    if (!b) return;
    cr_assert_eq(krn_ctx_new(b, 0, &rc->comm_ctx), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(krn_comm_new(b, 1, (int[]){0}, &rc->comm), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(krn_event_new(b, rc->comm_ctx, &rc->ev), ENG_STATUS_OK, "%s", eng_last_error());
}

static void recorder_free(recorder *rc) {
    if (!rc->b) return;
    krn_event_free(rc->b, &rc->ev);
    krn_comm_free(rc->b, &rc->comm);
    krn_ctx_free(rc->b, &rc->comm_ctx);
}

Test(ready, a_device_plan_reports_each_output_after_its_last_step) {
    float y0[B * H], r0[B * H], y1[B * H], r1[B * H];
    cr_assert_eq(run(NULL, NULL, NULL, y0, r0), ENG_STATUS_OK, "%s", eng_last_error());
    recorder rc;
    recorder_init(&rc, krn_backend_sim());
    rc.reduce_relu = 1;
    krn_sim_stats s0, s1;
    krn_sim_stats_get(&s0);
    const unsigned char dev_out[2] = {1, 1};
    cr_assert_eq(run(krn_backend_sim(), dev_out, &rc, y1, r1), ENG_STATUS_OK, "%s", eng_last_error());
    krn_sim_stats_get(&s1);
    cr_assert_eq(rc.st, ENG_STATUS_OK, "%s", eng_last_error());
    /* relu after mm2 (its last reader), then y after Softmax: two reports, both during the run */
    cr_assert_eq(rc.n, 2, "%d reports", rc.n);
    cr_assert(rc.r[0].n == 1 && rc.r[0].idx[0] == 1 && rc.r[0].during);
    cr_assert(rc.r[1].n == 1 && rc.r[1].idx[0] == 0 && rc.r[1].during);
    cr_assert_eq(memcmp(y0, y1, sizeof y0), 0, "Softmax read Relu's output after its all-reduce");
    for (int i = 0; i < B * H; i++) cr_assert_eq(r1[i], 2.0f * r0[i], "relu[%d]: %g vs 2 x %g", i, r1[i], r0[i]);
    cr_assert_eq(s1.groups - s0.groups, 1);
    cr_assert_eq(s1.allreduces - s0.allreduces, 1);
    cr_assert_eq(s1.overlapped - s0.overlapped, 1, "the all-reduce did not overlap the plan's Softmax");
    recorder_free(&rc);
}

Test(ready, outputs_copied_at_the_end_and_host_plans_report_after_the_run) {
    float y[B * H], r[B * H];
    for (int dev = 0; dev <= 1; dev++) {
        recorder rc;
        recorder_init(&rc, dev ? krn_backend_sim() : NULL);
        cr_assert_eq(run(rc.b, NULL, &rc, y, r), ENG_STATUS_OK, "%s", eng_last_error());
        cr_assert_eq(rc.n, 1, "%s: %d reports", dev ? "sim" : "cpu", rc.n);
        cr_assert(rc.r[0].n == 2 && rc.r[0].idx[0] == 0 && rc.r[0].idx[1] == 1 && !rc.r[0].during);
        recorder_free(&rc);
    }
}

Test(ready, a_failing_run_stops_reporting_at_its_failing_step) {
    float y[B * H], r[B * H];
    recorder rc;
    recorder_init(&rc, krn_backend_sim());
    const unsigned char dev_out[2] = {1, 1};
    setenv("TENSORD_SIM_FAIL_KERNEL", "softmax", 1);
    eng_status st = run(krn_backend_sim(), dev_out, &rc, y, r);
    unsetenv("TENSORD_SIM_FAIL_KERNEL");
    cr_assert_eq(st, ENG_STATUS_INTERNAL);
    cr_assert(strstr(eng_last_error(), "node 'y' (Softmax)"), "%s", eng_last_error());
    cr_assert(rc.n == 1 && rc.r[0].idx[0] == 1 && rc.r[0].during, "relu is reported, y is not: %d reports", rc.n);
    recorder_free(&rc);
}

/* ---- the bucketed collective, two ranks on their own threads ---- */

typedef struct rank_arg {
    const krn_backend *b;
    krn_comm *cm;
    int rank;
    float pre;
    eng_status st;
    float got[3][40];
} rank_arg;

static const size_t lens[3] = {7, 0, 40};

static float v(int rank, int j, size_t i) { return (float)(rank * 100 + j * 10) + 0.5f * (float)i; }

static void *rank_main(void *p) {
    rank_arg *a = p;
    krn_ctx *c = NULL;
    float *bufs[3] = {0};
    a->st = krn_ctx_new(a->b, a->rank, &c);
    for (int j = 0; j < 3 && a->st == ENG_STATUS_OK; j++) {
        float h[40];
        for (size_t i = 0; i < lens[j]; i++) h[i] = v(a->rank, j, i);
        a->st = krn_buf_alloc(a->b, c, sizeof h, (void **)&bufs[j]);
        if (a->st == ENG_STATUS_OK) a->st = krn_buf_set(a->b, c, bufs[j], h, lens[j] * sizeof(float));
    }
    if (a->st == ENG_STATUS_OK) a->st = krn_comm_allreduce_many(a->b, a->cm, a->rank, c, bufs, lens, 3, a->pre);
    for (int j = 0; j < 3 && a->st == ENG_STATUS_OK; j++) a->st = krn_buf_get(a->b, c, a->got[j], bufs[j], lens[j] * sizeof(float));
    for (int j = 0; j < 3; j++)
        if (bufs[j]) krn_buf_free(a->b, c, bufs[j]);
    krn_ctx_free(a->b, &c);
    return NULL;
}

static void many(const krn_backend *b, const char *what) {
    krn_comm *cm = NULL;
    cr_assert_eq(krn_comm_new(b, 2, (int[]){0, 1}, &cm), ENG_STATUS_OK, "%s", eng_last_error());
    rank_arg a[2] = {{b, cm, 0, 0.25f, 0, {{0}}}, {b, cm, 1, 0.75f, 0, {{0}}}};
    pthread_t th[2];
    for (int r = 0; r < 2; r++) pthread_create(&th[r], NULL, rank_main, &a[r]);
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(a[r].st, ENG_STATUS_OK, "%s, rank %d: %s", what, r, eng_last_error());
        for (int j = 0; j < 3; j++)
            for (size_t i = 0; i < lens[j]; i++) {
                float want = 0.25f * v(0, j, i) + 0.75f * v(1, j, i);
                cr_assert_eq(a[r].got[j][i], want, "%s: rank %d buffer %d [%zu]: %g vs %g", what, r, j, i,
                             a[r].got[j][i], want);
            }
    }
    krn_comm_free(b, &cm);
}

Test(comm, allreduce_many_sums_every_buffer_with_each_ranks_prescale) {
    krn_sim_stats s0, s1;
    krn_sim_stats_get(&s0);
    many(krn_backend_sim(), "sim's grouped hook");
    krn_sim_stats_get(&s1);
    cr_assert_eq(s1.groups - s0.groups, 2, "one group per rank");
    cr_assert_eq(s1.allreduces - s0.allreduces, 6);
    cr_assert_eq(s1.overlapped, s0.overlapped, "nothing waited for another context here");
    /* a backend without the grouped hook: the all-reduces one by one (kernels/backend.c) */
    krn_backend plain = *krn_backend_sim();
    plain.comm_allreduce_many = NULL;
    many(&plain, "one by one");
    krn_sim_stats_get(&s0);
    cr_assert_eq(s0.groups, s1.groups, "the fallback went through the grouped hook");
}
