/* metrics.h - Prometheus metrics (text exposition format 0.0.4) and Triton's per-version statistics, kept in
 * one store so that /metrics and GET /v2/models/.../stats always report the same figures.
 *
 * One srv_metrics per server process (a handle, not a global). Every series carries model and version
 * labels (and label="..." where the request named a version label). Thread-safe; recording is a short
 * mutex-protected update (no allocation once a series exists), rendering takes a snapshot under the mutex.
 * Series:
 *   tensord_request_count{model,version,label,api,protocol,status}   counter (status = code name, "OK"...;
 *                                                                            protocol = rest|grpc)
 *   tensord_request_latency_us{model,version,label,api,protocol}     histogram (buckets in microseconds)
 *   tensord_queue_latency_us{model,version}                          histogram (batching queue wait)
 *   tensord_batch_size{model,version}                                histogram (rows per executed batch)
 *   tensord_padded_batch_size{model,version}                         histogram
 *   tensord_model_load_latency_ms{model,version}                     gauge (last load)
 *   tensord_model_swap_count{model,version,event}                    counter (event = load|unload|load_failed)
 *   tensord_model_weights_bytes{model,version}                       gauge (removed when the version ends)
 *   tensord_model_version_state{model,version}                       gauge (TF Serving state number)
 *   tensord_model_instances{model,version}                           gauge (execution instances)
 *   tensord_model_instance_bytes{model,version,instance}             gauge (weights + largest plan arena of one
 *                                                                            instance; removed with the version)
 *   tensord_device_memory_bytes{model,version,device}               gauge (device memory a version's instances on
 *                                                                            that device hold: every cached plan's
 *                                                                            device arena and constants; devices
 *                                                                            only, not "cpu"; removed with the version)
 *   tensord_device_lost{device}                                      gauge (1 for each device lost to a sticky
 *                                                                            error: unusable until a restart; devices
 *                                                                            that work are not listed)
 *   tensord_inference_stats_count{model,version,stat}                counter  } Triton's inference_stats, stat =
 *   tensord_inference_stats_ns{model,version,stat}                   counter  } success|fail|queue|compute_input|
 *                                                                               compute_infer|compute_output
 *   tensord_inference_count{model,version}                           counter (rows of successful inferences)
 *   tensord_inference_exec_count{model,version}                      counter (engine runs: batches or requests)
 *
 * Cardinality. Label values come from the server, never verbatim from a URL: the REST handlers pass the model
 * and version that served a request ("" when none did), a version label only if it is configured for the
 * model (else "unknown"), and fixed api and status names. A version is "live" from the first state the
 * registry reports for it (START..UNLOADING) until srv_metrics_forget: series of live versions are always
 * recorded; all other series count against a cap of SRV_METRICS_MAX_SERIES per metric, past which new ones are
 * dropped (tensord_metrics_dropped_series_total). So the cap can never hide a served version.
 */
#ifndef SRV_METRICS_H
#define SRV_METRICS_H

#include <stddef.h>
#include <stdint.h>

typedef struct srv_metrics srv_metrics;
struct srv_buf;

srv_metrics *srv_metrics_new(void);
void srv_metrics_free(srv_metrics **m);

/* label may be NULL; api "predict", "classify", "regress", "infer", "metadata", "status", "reload"; protocol
 * "rest" or "grpc" (NULL: "rest"), the front door that took the request. */
void srv_metrics_request(srv_metrics *m, const char *model, int64_t version, const char *label, const char *api,
                         const char *protocol, int code, int64_t latency_us);

/* Where one inference request spent its time, in nanoseconds of srv_metrics_clock_ns. */
typedef struct srv_infer_times {
    int64_t input_ns;  /* decoding the request body into tensors */
    int64_t queue_ns;  /* from decoded to the start of the engine run that computed it (batching queue, worker
                        * pool, waiting for the version's run lock) */
    int64_t infer_ns;  /* that engine run */
    int64_t output_ns; /* copying the outputs out of the run and encoding the reply */
    int64_t rows;      /* inferences in the request (its batch size; 1 for a model without a batch dimension) */
} srv_infer_times;

/* An inference request (api "predict", "classify", "regress" or "infer") ended with code after latency_ns
 * from its arrival: srv_metrics_request, plus the version's statistics when version > 0 (the version that
 * served it): success with t's durations, or fail. t may be NULL for a failure. */
void srv_metrics_infer(srv_metrics *m, const char *model, int64_t version, const char *label, const char *api,
                       const char *protocol, int code, int64_t latency_ns, const srv_infer_times *t);

/* CLOCK_MONOTONIC in nanoseconds (srv_now_us's clock, finer). */
int64_t srv_metrics_clock_ns(void);
/* One engine run of a version (version.c): rows rows, started at start_ns, engine done at infer_end_ns,
 * outputs copied out at end_ns. Counts an execution and its batch size (only while the version is AVAILABLE
 * or UNLOADING: warm-up runs are not counted) and remembers the times for the calling thread. m may be NULL. */
void srv_metrics_run(srv_metrics *m, const char *model, int64_t version, int64_t rows, int64_t start_ns,
                     int64_t infer_end_ns, int64_t end_ns);
/* Fill t's queue, infer and output times for a request decoded at decoded_ns and run by now: from the calling
 * thread's last srv_metrics_run when it started at or after decoded_ns (an inline run, or the batch a batch
 * worker just ran), else (run on a thread this one cannot see: a blocking batched predict) all of it as infer. */
void srv_infer_times_run(srv_infer_times *t, int64_t decoded_ns);

void srv_metrics_queue(srv_metrics *m, const char *model, int64_t version, int64_t queue_us);
void srv_metrics_batch(srv_metrics *m, const char *model, int64_t version, int64_t rows, int64_t padded_rows);
void srv_metrics_load(srv_metrics *m, const char *model, int64_t version, double load_ms, size_t weight_bytes);
void srv_metrics_swap(srv_metrics *m, const char *model, int64_t version, const char *event);
/* A version is published with n execution instances holding bytes[i] each (srv_version_metrics_instances):
 * tensord_model_instances and one tensord_model_instance_bytes series per instance; series of instances >= n
 * (left by an earlier object of the same version number) are dropped. */
void srv_metrics_instances(srv_metrics *m, const char *model, int64_t version, int n, const size_t *bytes);
/* Instance idx of a version now holds bytes (it grew: a larger plan ran). The gauge keeps the largest value
 * recorded, so late or reordered updates never lower it. */
void srv_metrics_instance_bytes(srv_metrics *m, const char *model, int64_t version, int idx, size_t bytes);
/* Device `device` ("cuda:0": resolved names only, never client text) was lost to a sticky error: its
 * tensord_device_lost series reads 1 from now on. Idempotent. */
void srv_metrics_device_lost(srv_metrics *m, const char *device);
/* Device memory a version holds on each of its n devices (names[i], e.g. "cuda:0", bytes[i]): sets the gauges;
 * this version's series of other devices (an earlier object of the same version number) are dropped. */
void srv_metrics_device_memory(srv_metrics *m, const char *model, int64_t version, int n, const char *const *names,
                               const size_t *bytes);
/* The registry's state of a version (TF Serving numbering); 10..40 make the version live (see above). */
void srv_metrics_state(srv_metrics *m, const char *model, int64_t version, int state);
/* The version ended: drop its request, latency, queue, batch, weights and state series and its statistics;
 * it is no longer live. Its lifecycle history (load latency, swap events) stays. */
void srv_metrics_forget(srv_metrics *m, const char *model, int64_t version);

/* Append Triton's $model_stat JSON object for (model, version) to b (all zero when nothing was recorded). */
void srv_metrics_stats_json(srv_metrics *m, const char *model, int64_t version, struct srv_buf *b);

/* malloc'd text; *len gets its length. */
char *srv_metrics_render(srv_metrics *m, size_t *len);

#endif
