/* log.h - the serving process's log: one line per event on stderr, as text or as JSON (--log_format=json).
 *
 * Text:  2026-12-01T22:50:01.123Z tensord load_failed model=fashion version=3: <message>
 * JSON:  {"ts":"2026-12-01T22:50:01.123Z","level":"error","event":"load_failed","model":"fashion","version":3,
 *         "msg":"<message>"}
 * model may be NULL and version <= 0 (then those fields are left out). A line is written with one write(2), so
 * lines from different threads never interleave. The format is process-wide (set once at start-up, before any
 * thread logs): logging is the one piece of process state the serving code keeps outside a handle.
 */
#ifndef SRV_LOG_H
#define SRV_LOG_H

#include <stdint.h>

typedef enum srv_log_level { SRV_LOG_INFO = 0, SRV_LOG_WARN = 1, SRV_LOG_ERROR = 2 } srv_log_level;

/* json: 1 for JSON lines, 0 for text (the default). */
void srv_log_set_json(int json);
int srv_log_json(void);

/* event: a short snake_case word ("listen", "load", "load_failed", "retire", "drain", ...). */
void srv_log(srv_log_level lv, const char *event, const char *model, int64_t version, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#endif
