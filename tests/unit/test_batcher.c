/* test_batcher.c - server/batcher.c: blocking and asynchronous submission from many threads, every request gets
 * exactly its own rows back, refusals, deadlines in the queue, and a free that drains queued requests.
 *
 * The batch function multiplies each row by 2 and adds the row's first value to a per-batch counter, so the
 * test can check both the values and that requests were really merged. The unit-test link has only
 * libtensord.a, so the server sources under test are included here. `make test` also runs this under
 * AddressSanitizer (a worker reading a completed request after freeing it is caught there).
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/batcher.c"
#include "server/srv.c"

static atomic_int g_batches, g_max_rows;
static atomic_int g_sleep_us;

static srv_code double_rows(void *ctx, const srv_tensors *in, srv_tensors *out, srv_error *err) {
    (void)ctx;
    int us = atomic_load(&g_sleep_us);
    if (us) usleep((useconds_t)us);
    eng_tensor t = in->t[0];
    int64_t n = eng_tensor_numel(&t);
    float *y = eng_alloc((size_t)n * sizeof(float) + 1);
    if (!y) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "oom");
    for (int64_t i = 0; i < n; i++) y[i] = 2.f * ((const float *)t.data)[i];
    t.data = y;
    if (srv_tensors_add(out, "y", &t) != 0) {
        eng_free(y);
        return srv_err(err, SRV_RESOURCE_EXHAUSTED, "oom");
    }
    atomic_fetch_add(&g_batches, 1);
    int rows = (int)in->t[0].dims[0], m = atomic_load(&g_max_rows);
    while (rows > m && !atomic_compare_exchange_weak(&g_max_rows, &m, rows)) {
    }
    return SRV_OK;
}

static srv_batcher *new_batcher(int64_t max_batch, int64_t timeout_us, int threads, int64_t max_enqueued) {
    srv_batch_opts o;
    srv_batch_opts_default(&o);
    o.max_batch_size = max_batch;
    o.batch_timeout_micros = timeout_us;
    o.num_batch_threads = threads;
    o.max_enqueued_batches = max_enqueued;
    atomic_store(&g_batches, 0);
    atomic_store(&g_max_rows, 0);
    atomic_store(&g_sleep_us, 0);
    return srv_batcher_new(&o, double_rows, NULL, NULL);
}

/* One request: `rows` rows of 3 floats, values id*10 + row. */
typedef struct req {
    srv_tensors in, out;
    float x[4 * 3];
    char *name;
    int64_t rows;
    int id;
    atomic_int done;
    srv_code code;
    srv_error err;
} req;

static void req_init(req *r, int id, int64_t rows) {
    memset(r, 0, sizeof *r);
    r->id = id;
    r->rows = rows;
    for (int i = 0; i < rows * 3; i++) r->x[i] = (float)(id * 10 + i / 3);
    eng_tensor t = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {rows, 3}, .data = r->x};
    r->in.n = 1;
    r->in.names = calloc(1, sizeof(char *));
    r->in.t = calloc(1, sizeof(eng_tensor));
    r->name = strdup("x");
    r->in.names[0] = r->name;
    r->in.t[0] = t;
}

static void req_check(req *r) {
    cr_assert_eq(r->code, SRV_OK, "request %d: %s", r->id, r->err.msg);
    cr_assert_eq(r->out.n, 1, "request %d: outputs", r->id);
    cr_assert_eq(r->out.t[0].dims[0], r->rows, "request %d: rows", r->id);
    const float *y = r->out.t[0].data;
    for (int i = 0; i < r->rows * 3; i++)
        cr_assert_eq(y[i], 2.f * r->x[i], "request %d element %d: %g, want %g", r->id, i, y[i], 2.f * r->x[i]);
}

static void req_free(req *r) {
    srv_tensors_free(&r->out);
    free(r->in.names);
    free(r->in.t);
    free(r->name);
}

static void on_done(void *arg, srv_code code, const srv_error *err) {
    req *r = arg;
    r->code = code;
    if (code != SRV_OK) r->err = *err;
    atomic_store(&r->done, 1);
}

#define NREQ 192

typedef struct worker_arg {
    srv_batcher *b;
    req *reqs;
    int from, to, async;
} worker_arg;

static void *submitter(void *p) {
    worker_arg *a = p;
    for (int i = a->from; i < a->to; i++) {
        req *r = &a->reqs[i];
        if (a->async && (i % 3)) { /* two in three asynchronous, the rest blocking: both kinds share batches */
            srv_batcher_submit_async(a->b, &r->in, &r->out, 0, NULL, on_done, r);
        } else {
            r->code = srv_batcher_submit(a->b, &r->in, &r->out, 0, &r->err);
            atomic_store(&r->done, 1);
        }
    }
    return NULL;
}

static void wait_all(req *reqs, int n) {
    for (int spins = 0; spins < 20000; spins++) {
        int all = 1;
        for (int i = 0; i < n && all; i++) all = atomic_load(&reqs[i].done);
        if (all) return;
        usleep(1000);
    }
    cr_assert_fail("requests did not complete within 20 s");
}

static void run_many(int async) {
    srv_batcher *b = new_batcher(16, 2000, 2, 100);
    cr_assert_not_null(b);
    req *reqs = calloc(NREQ, sizeof *reqs);
    for (int i = 0; i < NREQ; i++) req_init(&reqs[i], i, 1 + i % 3);
    pthread_t th[8];
    worker_arg wa[8];
    for (int t = 0; t < 8; t++) {
        wa[t] = (worker_arg){b, reqs, t * NREQ / 8, (t + 1) * NREQ / 8, async};
        pthread_create(&th[t], NULL, submitter, &wa[t]);
    }
    for (int t = 0; t < 8; t++) pthread_join(th[t], NULL);
    wait_all(reqs, NREQ);
    for (int i = 0; i < NREQ; i++) req_check(&reqs[i]);
    cr_expect_gt(atomic_load(&g_max_rows), 3, "requests were never merged (largest batch %d rows)", atomic_load(&g_max_rows));
    cr_expect_leq(atomic_load(&g_max_rows), 16);
    srv_batcher_free(&b);
    for (int i = 0; i < NREQ; i++) req_free(&reqs[i]);
    free(reqs);
}

Test(batcher, blocking_requests_get_their_own_rows) { run_many(0); }

Test(batcher, async_and_blocking_requests_share_batches) { run_many(1); }

Test(batcher, async_refusal_runs_the_callback_at_once) {
    srv_batcher *b = new_batcher(2, 1000, 1, 1);
    req r;
    req_init(&r, 1, 3); /* 3 rows > max_batch_size 2 */
    srv_batcher_submit_async(b, &r.in, &r.out, 0, NULL, on_done, &r);
    cr_assert(atomic_load(&r.done), "callback did not run before submit returned");
    cr_expect_eq(r.code, SRV_INVALID_ARGUMENT);
    cr_expect(strstr(r.err.msg, "max_batch_size") != NULL, "%s", r.err.msg);
    srv_batcher_free(&b);
    req_free(&r);
}

Test(batcher, async_deadline_passes_in_the_queue) {
    srv_batcher *b = new_batcher(1, 0, 1, 100);
    atomic_store(&g_sleep_us, 200000); /* each batch takes 200 ms */
    req slow, late;
    req_init(&slow, 1, 1);
    req_init(&late, 2, 1);
    srv_batcher_submit_async(b, &slow.in, &slow.out, 0, NULL, on_done, &slow);
    usleep(20000); /* the worker is now busy with `slow` */
    srv_batcher_submit_async(b, &late.in, &late.out, srv_now_us() + 50000, NULL, on_done, &late);
    wait_all(&slow, 1);
    wait_all(&late, 1);
    req_check(&slow);
    cr_expect_eq(late.code, SRV_DEADLINE_EXCEEDED, "got %s: %s", srv_code_name(late.code), late.err.msg);
    srv_batcher_free(&b);
    req_free(&slow);
    req_free(&late);
}

/* A cancelled request leaves the queue while the worker waits for the batch to fill (10 s here): it is answered
 * CANCELLED without running, and the request queued beside it still runs. */
Test(batcher, async_cancel_leaves_the_queue) {
    srv_batcher *b = new_batcher(8, 10000000, 1, 100);
    req gone, kept;
    req_init(&gone, 1, 1);
    req_init(&kept, 2, 1);
    atomic_int cancel = 0;
    srv_batcher_submit_async(b, &gone.in, &gone.out, 0, &cancel, on_done, &gone);
    srv_batcher_submit_async(b, &kept.in, &kept.out, 0, NULL, on_done, &kept);
    usleep(20000);
    cr_expect(!atomic_load(&gone.done), "answered before it was cancelled");
    atomic_store(&cancel, 1);
    for (int i = 0; i < 5000 && !atomic_load(&gone.done); i++) usleep(1000); /* liveness: 5 s against a 10 s batch */
    cr_assert(atomic_load(&gone.done), "the cancelled request stayed in the queue");
    cr_expect_eq(gone.code, SRV_CANCELLED, "got %s: %s", srv_code_name(gone.code), gone.err.msg);
    cr_expect_eq(atomic_load(&g_batches), 0, "a batch ran: the cancelled request should not run");
    cr_expect(!atomic_load(&kept.done), "the other request left the queue too");
    srv_batcher_free(&b); /* runs what is queued */
    cr_expect(atomic_load(&kept.done));
    req_check(&kept);
    cr_expect_eq(atomic_load(&g_max_rows), 1, "the batch held the cancelled request's row");
    req_free(&gone);
    req_free(&kept);
}

Test(batcher, free_drains_queued_async_requests) {
    srv_batcher *b = new_batcher(4, 100000, 1, 100); /* long timeout: requests sit in the queue */
    req reqs[6];
    for (int i = 0; i < 6; i++) {
        req_init(&reqs[i], i, 1);
        srv_batcher_submit_async(b, &reqs[i].in, &reqs[i].out, 0, NULL, on_done, &reqs[i]);
    }
    srv_batcher_free(&b); /* returns only after every queued request completed */
    for (int i = 0; i < 6; i++) {
        cr_assert(atomic_load(&reqs[i].done), "request %d was dropped", i);
        req_check(&reqs[i]);
        req_free(&reqs[i]);
    }
}
