/* status.h - error reporting for libtensord.
 *
 * Library code never exits on bad input: it returns an eng_status and records a message that names the
 * thing (model, node, input, expected vs got). The message lives in thread-local storage, so concurrent
 * requests on different threads do not clobber each other's errors. The enum is append-only: callers and
 * child processes may pass its values on.
 */
#ifndef ENG_STATUS_H
#define ENG_STATUS_H

#include <stddef.h>

typedef enum eng_status {
    ENG_STATUS_OK = 0,
    ENG_STATUS_INVALID_ARGUMENT = 1, /* bad input from the caller: name, dtype, shape, value */
    ENG_STATUS_INVALID_MODEL = 2,    /* model file is corrupt or violates ONNX rules */
    ENG_STATUS_UNSUPPORTED = 3,      /* valid ONNX we do not implement (op, dtype, attribute) */
    ENG_STATUS_NOT_FOUND = 4,        /* file, input, output or kernel missing */
    ENG_STATUS_OUT_OF_MEMORY = 5,    /* allocation failed or a size would overflow/exceed limits */
    ENG_STATUS_IO = 6,               /* read/write failure */
    ENG_STATUS_INTERNAL = 7,         /* broken invariant or vendor library failure */
    ENG_STATUS_NEEDS_DATA = 8,       /* shape inference needs the value of a non-constant input */
    ENG_STATUS_CANCELLED = 9,        /* the caller asked a long operation to stop (e.g. eng_train's cancel flag) */
    ENG_STATUS_DEADLINE_EXCEEDED = 10, /* a run passed its deadline (engine/plan/plan.h: eng_run_set_deadline) */
} eng_status;

/* Record a message for the calling thread and return `st`. printf-style. Never fails. */
eng_status eng_err(eng_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefix the calling thread's message with more context ("node 'conv1' (Conv): " + old message). */
eng_status eng_err_prefix(eng_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Last message recorded on this thread ("" if none). Valid until the next eng_err on this thread. */
const char *eng_last_error(void);

void eng_err_clear(void);

const char *eng_status_name(eng_status st);

#define ENG_TRY(expr) do { eng_status st__ = (expr); if (st__ != ENG_STATUS_OK) return st__; } while (0)

#endif
