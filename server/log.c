/* log.c - the serving process's log lines (see log.h). */
#define _GNU_SOURCE
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "json.h"

static atomic_int srv_log_mode;

void srv_log_set_json(int json) { atomic_store(&srv_log_mode, json ? 1 : 0); }
int srv_log_json(void) { return atomic_load(&srv_log_mode); }

static const char *srv_log_level_name(srv_log_level lv) {
    return lv == SRV_LOG_ERROR ? "error" : lv == SRV_LOG_WARN ? "warning" : "info";
}

void srv_log(srv_log_level lv, const char *event, const char *model, int64_t version, const char *fmt, ...) {
    char msg[2048], ts[40];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    struct timespec now;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    size_t tl = strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(ts + tl, sizeof ts - tl, ".%03ldZ", now.tv_nsec / 1000000);
    srv_buf b = {0};
    if (srv_log_json()) {
        srv_buf_puts(&b, "{\"ts\":\"");
        srv_buf_puts(&b, ts);
        srv_buf_puts(&b, "\",\"level\":\"");
        srv_buf_puts(&b, srv_log_level_name(lv));
        srv_buf_puts(&b, "\",\"event\":");
        srv_buf_json_str(&b, event ? event : "");
        if (model) {
            srv_buf_puts(&b, ",\"model\":");
            srv_buf_json_str(&b, model);
        }
        if (version > 0) srv_buf_printf(&b, ",\"version\":%lld", (long long)version);
        srv_buf_puts(&b, ",\"msg\":");
        srv_buf_json_str(&b, msg);
        srv_buf_puts(&b, "}\n");
    } else {
        srv_buf_printf(&b, "%s tensord %s%s%s", ts, lv == SRV_LOG_INFO ? "" : lv == SRV_LOG_WARN ? "warning: " : "error: ",
                       event ? event : "", model ? " model=" : "");
        if (model) srv_buf_puts(&b, model);
        if (version > 0) srv_buf_printf(&b, " version=%lld", (long long)version);
        srv_buf_printf(&b, ": %s\n", msg);
    }
    size_t len = 0;
    char *line = srv_buf_take(&b, &len);
    if (!line) { /* out of memory: the message alone, still one write */
        fputs(msg, stderr);
        fputc('\n', stderr);
        return;
    }
    for (size_t off = 0; off < len;) {
        ssize_t w = write(STDERR_FILENO, line + off, len - off);
        if (w <= 0) break;
        off += (size_t)w;
    }
    free(line);
}
