/* grpc_load.c - a closed-loop load generator for one unary gRPC method, on the gRPC C core client API.
 *
 *   grpc_load TARGET METHOD REQUEST_FILE CONCURRENCY DURATION_S [--threads T] [--channels C] [--dump FILE]
 *             [--warmup W] [--deadline-ms D]
 *
 *   TARGET        host:port (plaintext HTTP/2, no TLS)
 *   METHOD        full method path, e.g. /inference.GRPCInferenceService/ModelInfer
 *   REQUEST_FILE  the request message, already serialized (protobuf wire bytes); every call sends these bytes
 *   CONCURRENCY   calls kept in flight; each is re-issued as soon as it completes
 *   DURATION_S    seconds measured (a float), after the warm-up; calls completing later are drained, not counted
 *   --threads T   completion-queue threads (default 1 for CONCURRENCY 1, else 2); the calls are split among them
 *   --channels C  channels (HTTP/2 connections), at least one per thread (default: one per thread); calls are
 *                 spread round-robin over a thread's channels
 *   --warmup W    seconds of the same load before the measured window (default 0): completions in it are not
 *                 counted, so the window starts with the server's queue already at its steady depth
 *   --dump FILE   write the first OK response message's bytes to FILE (for a correctness check by the caller)
 *   --deadline-ms per-call deadline (default 30000)
 *
 * Prints one JSON line on stdout:
 *   {"requests": OK calls completed in the window, "errors": non-OK calls in it, "late": calls completed after
 *    it (the drain), "first_error": "code N: message" or null, "warmup_us": ..., "duration_us": the window,
 *    "rps": requests / window, "p50_us", "p99_us", "mean_us", "max_us": latency of the counted calls,
 *    "concurrency": N, "threads": T, "channels": C}
 * Counted are the calls that complete inside the measured window, whenever they started. Latency is from
 * grpc_call_start_batch to the completion of the call's one batch (send metadata + message + close, receive
 * metadata + message + status), i.e. what a unary stub's blocking call would see. Exit status 0 when the run
 * completed (errors are reported, not failed on), 2 for bad arguments or setup failures.
 *
 * Invariants: each thread owns its completion queue, channels and call slots; the only shared state is the
 * read-only request slice and the stop time. No allocation per call besides what gRPC core does.
 */
#include <errno.h>
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct load_slot {
    grpc_call *call;
    grpc_byte_buffer *send;
    grpc_byte_buffer *recv;
    grpc_metadata_array md_initial;
    grpc_metadata_array md_trailing;
    grpc_status_code status;
    grpc_slice details;
    int64_t t0_ns;
    grpc_channel *channel;
} load_slot;

typedef struct load_thread {
    int nslots, nchannels;
    load_slot *slots;
    grpc_channel **channels;
    grpc_completion_queue *cq;
    uint32_t *lat_us; /* (nlat) latencies of OK calls completed before the stop time */
    size_t nlat, caplat;
    long errors, late; /* late: calls that completed after the window (drained), any status */
    int first_code;
    char first_msg[512];
    int dumped;
    pthread_t tid;
} load_thread;

static grpc_slice g_method, g_request;
static const char *g_target, *g_dump;
static int64_t g_warm_end_ns, g_stop_ns;
static int g_deadline_ms = 30000;
static pthread_mutex_t g_dump_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_dump_done;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void die(const char *msg) {
    fprintf(stderr, "grpc_load: %s\n", msg);
    exit(2);
}

/* Starts one unary call in `s` on its channel; returns 0, or -1 if gRPC refused the batch. */
static int slot_start(load_thread *t, load_slot *s) {
    gpr_timespec deadline =
        gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(g_deadline_ms, GPR_TIMESPAN));
    s->call =
        grpc_channel_create_call(s->channel, NULL, GRPC_PROPAGATE_DEFAULTS, t->cq, g_method, NULL, deadline, NULL);
    if (!s->call) return -1;
    s->send = grpc_raw_byte_buffer_create(&g_request, 1);
    s->recv = NULL;
    grpc_metadata_array_init(&s->md_initial);
    grpc_metadata_array_init(&s->md_trailing);
    s->details = grpc_empty_slice();
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = s->send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &s->md_initial;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &s->recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &s->md_trailing;
    ops[5].data.recv_status_on_client.status = &s->status;
    ops[5].data.recv_status_on_client.status_details = &s->details;
    s->t0_ns = now_ns();
    if (grpc_call_start_batch(s->call, ops, 6, s, NULL) != GRPC_CALL_OK) {
        grpc_byte_buffer_destroy(s->send);
        grpc_metadata_array_destroy(&s->md_initial);
        grpc_metadata_array_destroy(&s->md_trailing);
        grpc_call_unref(s->call);
        s->call = NULL;
        return -1;
    }
    return 0;
}

static void dump_response(grpc_byte_buffer *bb) {
    pthread_mutex_lock(&g_dump_lock);
    if (!g_dump_done) {
        g_dump_done = 1;
        FILE *f = fopen(g_dump, "wb");
        if (f) {
            grpc_byte_buffer_reader r;
            if (grpc_byte_buffer_reader_init(&r, bb)) {
                grpc_slice sl;
                while (grpc_byte_buffer_reader_next(&r, &sl)) {
                    fwrite(GRPC_SLICE_START_PTR(sl), 1, GRPC_SLICE_LENGTH(sl), f);
                    grpc_slice_unref(sl);
                }
                grpc_byte_buffer_reader_destroy(&r);
            }
            fclose(f);
        } else {
            fprintf(stderr, "grpc_load: cannot write %s: %s\n", g_dump, strerror(errno));
        }
    }
    pthread_mutex_unlock(&g_dump_lock);
}

/* Records the finished call in `s`, frees its per-call state. */
static void slot_finish(load_thread *t, load_slot *s, int ok, int64_t t1_ns) {
    int good = ok && s->status == GRPC_STATUS_OK;
    if (t1_ns >= g_warm_end_ns && t1_ns <= g_stop_ns) {
        if (good) {
            if (t->nlat == t->caplat) {
                t->caplat = t->caplat ? 2 * t->caplat : 65536;
                t->lat_us = realloc(t->lat_us, t->caplat * sizeof *t->lat_us);
                if (!t->lat_us) die("out of memory");
            }
            int64_t us = (t1_ns - s->t0_ns) / 1000;
            t->lat_us[t->nlat++] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
        } else {
            if (t->errors++ == 0) {
                t->first_code = ok ? (int)s->status : -1;
                if (!ok) snprintf(t->first_msg, sizeof t->first_msg, "completion queue reported failure");
                else snprintf(t->first_msg, sizeof t->first_msg, "%.*s", (int)GRPC_SLICE_LENGTH(s->details),
                              (const char *)GRPC_SLICE_START_PTR(s->details));
            }
        }
    }
    if (t1_ns > g_stop_ns) t->late++;
    if (good && g_dump && s->recv && !g_dump_done) dump_response(s->recv);
    if (s->recv) grpc_byte_buffer_destroy(s->recv);
    grpc_byte_buffer_destroy(s->send);
    grpc_metadata_array_destroy(&s->md_initial);
    grpc_metadata_array_destroy(&s->md_trailing);
    grpc_slice_unref(s->details);
    grpc_call_unref(s->call);
    s->call = NULL;
}

static grpc_channel *channel_new(int id) {
    grpc_arg args[3];
    args[0].type = GRPC_ARG_INTEGER; /* distinct channels get distinct connections */
    args[0].key = GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL;
    args[0].value.integer = 1;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_CHANNEL_ID;
    args[1].value.integer = id;
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[2].value.integer = -1;
    grpc_channel_args ca = {3, args};
    grpc_channel_credentials *cred = grpc_insecure_credentials_create();
    grpc_channel *ch = grpc_channel_create(g_target, cred, &ca);
    grpc_channel_credentials_release(cred);
    return ch;
}

static void *thread_main(void *arg) {
    load_thread *t = arg;
    int inflight = 0;
    for (int i = 0; i < t->nslots; i++) {
        if (slot_start(t, &t->slots[i]) == 0) inflight++;
        else t->errors++;
    }
    while (inflight > 0) {
        grpc_event ev = grpc_completion_queue_next(t->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type != GRPC_OP_COMPLETE) continue;
        int64_t t1 = now_ns();
        load_slot *s = ev.tag;
        slot_finish(t, s, ev.success, t1);
        inflight--;
        if (t1 < g_stop_ns) {
            if (slot_start(t, s) == 0) inflight++;
            else t->errors++;
        }
    }
    return NULL;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static uint32_t pct(const uint32_t *v, size_t n, double p) { /* nearest-rank percentile of sorted v */
    if (!n) return 0;
    size_t k = (size_t)(p / 100.0 * (double)n + 0.999999);
    if (k < 1) k = 1;
    if (k > n) k = n;
    return v[k - 1];
}

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s TARGET METHOD REQUEST_FILE CONCURRENCY DURATION_S [--threads T] [--channels C] "
                        "[--dump FILE] [--warmup W] [--deadline-ms D]\n", argv[0]);
        return 2;
    }
    g_target = argv[1];
    const char *method = argv[2], *reqfile = argv[3];
    int conc = atoi(argv[4]);
    double dur = atof(argv[5]), warm = 0;
    int nthreads = conc > 1 ? 2 : 1, nchannels = 0;
    for (int i = 6; i < argc; i++) {
        if (i + 1 >= argc) die("a flag needs a value");
        if (!strcmp(argv[i], "--threads")) nthreads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--channels")) nchannels = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dump")) g_dump = argv[++i];
        else if (!strcmp(argv[i], "--warmup")) warm = atof(argv[++i]);
        else if (!strcmp(argv[i], "--deadline-ms")) g_deadline_ms = atoi(argv[++i]);
        else die("unknown flag");
    }
    if (conc < 1 || dur <= 0 || warm < 0 || nthreads < 1 || g_deadline_ms < 1)
        die("CONCURRENCY, DURATION_S, --threads, --deadline-ms must be > 0 and --warmup >= 0");
    if (nthreads > conc) nthreads = conc;
    if (nchannels < nthreads) nchannels = nthreads;

    FILE *f = fopen(reqfile, "rb");
    if (!f) die("cannot open REQUEST_FILE");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(n > 0 ? (size_t)n : 1);
    if (!buf || (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n)) die("cannot read REQUEST_FILE");
    fclose(f);

    grpc_init();
    g_method = grpc_slice_from_static_string(method);
    g_request = grpc_slice_from_static_buffer(buf, (size_t)n);

    load_thread *th = calloc((size_t)nthreads, sizeof *th);
    if (!th) die("out of memory");
    int chan_id = 0;
    for (int k = 0; k < nthreads; k++) {
        load_thread *t = &th[k];
        t->nslots = conc / nthreads + (k < conc % nthreads);
        t->nchannels = nchannels / nthreads + (k < nchannels % nthreads);
        t->slots = calloc((size_t)t->nslots, sizeof *t->slots);
        t->channels = calloc((size_t)t->nchannels, sizeof *t->channels);
        if (!t->slots || !t->channels) die("out of memory");
        t->cq = grpc_completion_queue_create_for_next(NULL);
        for (int c = 0; c < t->nchannels; c++) t->channels[c] = channel_new(++chan_id);
        for (int i = 0; i < t->nslots; i++) t->slots[i].channel = t->channels[i % t->nchannels];
    }

    int64_t t0 = now_ns();
    g_warm_end_ns = t0 + (int64_t)(warm * 1e9);
    g_stop_ns = g_warm_end_ns + (int64_t)(dur * 1e9);
    for (int k = 0; k < nthreads; k++)
        if (pthread_create(&th[k].tid, NULL, thread_main, &th[k]) != 0) die("pthread_create failed");
    for (int k = 0; k < nthreads; k++) pthread_join(th[k].tid, NULL);
    int64_t elapsed_ns = now_ns() - g_warm_end_ns;
    if (elapsed_ns > g_stop_ns - g_warm_end_ns) elapsed_ns = g_stop_ns - g_warm_end_ns; /* the measured window */

    size_t total = 0;
    long errors = 0, late = 0;
    int first_code = 0;
    const char *first_msg = NULL;
    for (int k = 0; k < nthreads; k++) {
        total += th[k].nlat;
        errors += th[k].errors;
        late += th[k].late;
        if (th[k].errors && !first_msg) {
            first_code = th[k].first_code;
            first_msg = th[k].first_msg;
        }
    }
    uint32_t *all = malloc((total ? total : 1) * sizeof *all);
    if (!all) die("out of memory");
    size_t off = 0;
    double sum = 0;
    for (int k = 0; k < nthreads; k++) {
        memcpy(all + off, th[k].lat_us, th[k].nlat * sizeof *all);
        off += th[k].nlat;
    }
    for (size_t i = 0; i < total; i++) sum += all[i];
    qsort(all, total, sizeof *all, cmp_u32);

    printf("{\"requests\": %zu, \"errors\": %ld, \"late\": %ld, \"first_error\": ", total, errors, late);
    if (first_msg) {
        char e[600];
        snprintf(e, sizeof e, "code %d: %s", first_code, first_msg);
        json_str(stdout, e);
    } else {
        fputs("null", stdout);
    }
    printf(", \"warmup_us\": %lld, \"duration_us\": %lld, \"rps\": %.1f, \"p50_us\": %u, \"p99_us\": %u, "
           "\"mean_us\": %.1f, \"max_us\": %u, \"concurrency\": %d, \"threads\": %d, \"channels\": %d}\n",
           (long long)((g_warm_end_ns - t0) / 1000), (long long)(elapsed_ns / 1000), total / (elapsed_ns / 1e9),
           pct(all, total, 50), pct(all, total, 99), total ? sum / total : 0.0, total ? all[total - 1] : 0, conc,
           nthreads, nchannels);
    fflush(stdout);

    for (int k = 0; k < nthreads; k++) {
        for (int c = 0; c < th[k].nchannels; c++) grpc_channel_destroy(th[k].channels[c]);
        grpc_completion_queue_shutdown(th[k].cq);
        while (grpc_completion_queue_next(th[k].cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
               GRPC_QUEUE_SHUTDOWN) {
        }
        grpc_completion_queue_destroy(th[k].cq);
        free(th[k].slots);
        free(th[k].channels);
        free(th[k].lat_us);
    }
    free(th);
    free(all);
    grpc_shutdown();
    free(buf);
    return 0;
}
