/* status.c - thread-local error messages (see status.h). */
#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define ENG_ERR_MAX 2048

static _Thread_local char eng_err_buf[ENG_ERR_MAX];

eng_status eng_err(eng_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(eng_err_buf, sizeof eng_err_buf, fmt, ap);
    va_end(ap);
    return st;
}

eng_status eng_err_prefix(eng_status st, const char *fmt, ...) {
    char old[ENG_ERR_MAX];
    char pre[ENG_ERR_MAX];
    memcpy(old, eng_err_buf, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    size_t np = strnlen(pre, sizeof pre - 1);
    size_t no = strnlen(old, sizeof old - 1);
    if (np > sizeof eng_err_buf - 1) np = sizeof eng_err_buf - 1;
    if (no > sizeof eng_err_buf - 1 - np) no = sizeof eng_err_buf - 1 - np;
    memcpy(eng_err_buf, pre, np);
    memcpy(eng_err_buf + np, old, no);
    eng_err_buf[np + no] = '\0';
    return st;
}

const char *eng_last_error(void) { return eng_err_buf; }

void eng_err_clear(void) { eng_err_buf[0] = '\0'; }

const char *eng_status_name(eng_status st) {
    switch (st) {
    case ENG_STATUS_OK: return "OK";
    case ENG_STATUS_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case ENG_STATUS_INVALID_MODEL: return "INVALID_MODEL";
    case ENG_STATUS_UNSUPPORTED: return "UNSUPPORTED";
    case ENG_STATUS_NOT_FOUND: return "NOT_FOUND";
    case ENG_STATUS_OUT_OF_MEMORY: return "OUT_OF_MEMORY";
    case ENG_STATUS_IO: return "IO";
    case ENG_STATUS_INTERNAL: return "INTERNAL";
    case ENG_STATUS_NEEDS_DATA: return "NEEDS_DATA";
    case ENG_STATUS_CANCELLED: return "CANCELLED";
    case ENG_STATUS_DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    }
    return "UNKNOWN";
}
