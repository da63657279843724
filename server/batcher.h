/* batcher.h - dynamic batching for one model version (TF Serving's --enable_batching semantics).
 *
 * Concurrent requests are merged along dimension 0 until max_batch_size rows are queued or
 * batch_timeout_micros passed since the first request of the batch; the merged batch is padded up to the
 * next allowed_batch_sizes entry (repeating the last row), run once, and the outputs are split back by rows.
 * Requests whose inputs cannot be concatenated with the open batch (different trailing dims or dtypes) start
 * a new batch. The queue is bounded: max_enqueued_batches * max_batch_size rows; beyond that submit returns
 * RESOURCE_EXHAUSTED at once (HTTP 429). num_batch_threads worker threads run batches.
 */
#ifndef SRV_BATCHER_H
#define SRV_BATCHER_H

#include <stdatomic.h>

#include "srv.h"

typedef struct srv_batch_opts {
    int64_t max_batch_size;       /* default 32 */
    int64_t batch_timeout_micros; /* default 1000 */
    int64_t max_enqueued_batches; /* default 100 */
    int64_t num_batch_threads;    /* default: number of cores */
    int64_t allowed_batch_sizes[32]; /* ascending; last must equal max_batch_size; 0 entries = none */
    int nallowed;
} srv_batch_opts;
void srv_batch_opts_default(srv_batch_opts *o);

/* The function a batch worker calls to run one merged batch: inputs in, outputs out (out is empty on entry;
 * the callee adds one tensor per output, batch dimension first). */
typedef srv_code (*srv_batch_run_fn)(void *ctx, const srv_tensors *in, srv_tensors *out, srv_error *err);

/* Called once per batch run with the real (unpadded) and padded row counts and the queue wait of the
 * oldest request, for metrics. May be NULL. */
typedef void (*srv_batch_observe_fn)(void *ctx, int64_t rows, int64_t padded_rows, int64_t queue_us);

typedef struct srv_batcher srv_batcher;

srv_batcher *srv_batcher_new(const srv_batch_opts *o, srv_batch_run_fn run, srv_batch_observe_fn observe, void *ctx);
/* Blocks until this request's rows came back or deadline_us (absolute srv_now_us, 0 none) passed.
 * Every input must have rank >= 1; its dim 0 is this request's row count (the same for all inputs).
 * out receives this request's slice of every output (owned copies). */
srv_code srv_batcher_submit(srv_batcher *b, const srv_tensors *in, srv_tensors *out, int64_t deadline_us,
                            srv_error *err);
/* The asynchronous form: queues the request and returns at once. done(arg, code, err) runs exactly once:
 * on a batch worker after the request's batch ran and out holds its rows (or its deadline passed while
 * queued), or on the calling thread, before this returns, when the request is refused at once (bad rows,
 * queue full, unloading). in (and everything it points to) must stay valid until done runs. A server thread
 * can hand a request over this way and go on: no thread waits for the batch. */
typedef void (*srv_batch_done_fn)(void *arg, srv_code code, const srv_error *err);
/* cancel (may be NULL) is watched while the request is queued: once it reads non-zero the request leaves the
 * queue without running (within about 10 ms while a worker waits for the batch to fill; at the latest when the
 * next batch forms) and done gets CANCELLED. A deadline that passes in the queue wakes the waiting worker too. */
void srv_batcher_submit_async(srv_batcher *b, const srv_tensors *in, srv_tensors *out, int64_t deadline_us,
                              const atomic_int *cancel, srv_batch_done_fn done, void *arg);
/* Finishes queued work, joins the workers, frees; sets *b NULL. */
void srv_batcher_free(srv_batcher **b);

#endif
