/* metrics.h - Prometheus metrics, rendered as text exposition format (version 0.0.4).
 *
 * One srv_metrics per server process (a handle, not a global). Every series carries model and version
 * labels (and label="..." where the request named a version label). Thread-safe; recording is a short
 * mutex-protected update, rendering takes a snapshot.
 * Series:
 *   tensord_request_count{model,version,label,api,status}            counter (status = code name, "OK"...)
 *   tensord_request_latency_us{model,version,api}                    histogram (buckets in microseconds)
 *   tensord_queue_latency_us{model,version}                          histogram (batching queue wait)
 *   tensord_batch_size{model,version}                                histogram (rows per executed batch)
 *   tensord_padded_batch_size{model,version}                         histogram
 *   tensord_model_load_latency_ms{model,version}                     gauge (last load)
 *   tensord_model_swap_count{model,version,event}                    counter (event = load|unload|load_failed)
 *   tensord_model_weights_bytes{model,version}                       gauge (removed when the version ends)
 *   tensord_model_version_state{model,version}                       gauge (TF Serving state number)
 */
#ifndef SRV_METRICS_H
#define SRV_METRICS_H

#include <stddef.h>
#include <stdint.h>

typedef struct srv_metrics srv_metrics;

srv_metrics *srv_metrics_new(void);
void srv_metrics_free(srv_metrics **m);

/* label may be NULL; api "predict", "classify", "regress", "infer", "metadata", "status". */
void srv_metrics_request(srv_metrics *m, const char *model, int64_t version, const char *label, const char *api,
                         int code, int64_t latency_us);
void srv_metrics_queue(srv_metrics *m, const char *model, int64_t version, int64_t queue_us);
void srv_metrics_batch(srv_metrics *m, const char *model, int64_t version, int64_t rows, int64_t padded_rows);
void srv_metrics_load(srv_metrics *m, const char *model, int64_t version, double load_ms, size_t weight_bytes);
void srv_metrics_swap(srv_metrics *m, const char *model, int64_t version, const char *event);
void srv_metrics_state(srv_metrics *m, const char *model, int64_t version, int state);
/* The version ended: drop its gauges (weights, state). */
void srv_metrics_forget(srv_metrics *m, const char *model, int64_t version);

/* malloc'd text; *len gets its length. */
char *srv_metrics_render(srv_metrics *m, size_t *len);

#endif
