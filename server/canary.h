/* canary.h - per-route outcome windows for automatic rollback: for each (model, route label), requests, errors and
 * a latency histogram in one-second buckets over the last SRV_CANARY_SECONDS seconds. The request path reports
 * every routed request (srv_canary_observe); the rollback monitor reads a window (srv_canary_window). Thread-safe;
 * at most SRV_CANARY_SERIES series (more are not tracked).
 */
#ifndef SRV_CANARY_H
#define SRV_CANARY_H

#include <stdint.h>

#define SRV_CANARY_SECONDS 128
#define SRV_CANARY_SERIES 256

typedef struct srv_canary srv_canary;

srv_canary *srv_canary_new(void);
void srv_canary_free(srv_canary **c);

void srv_canary_observe(srv_canary *c, const char *model, const char *label, int ok, int64_t latency_us);

typedef struct srv_canary_stats {
    int64_t requests, errors;
    int64_t p99_us; /* 0 when no request */
} srv_canary_stats;
/* The last window_s seconds (1..SRV_CANARY_SECONDS) of (model, label). */
srv_canary_stats srv_canary_window(srv_canary *c, const char *model, const char *label, int window_s);
/* Forget a series (after a rollback, so that the next canary starts with a clean window). */
void srv_canary_reset(srv_canary *c, const char *model, const char *label);

#endif
