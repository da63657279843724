/* srv.h - what every serving file shares: status codes (gRPC's numbering, so REST and gRPC map the same way),
 * an error value that carries a message, and named tensor sets that own their data.
 */
#ifndef SRV_SRV_H
#define SRV_SRV_H

#include <stddef.h>
#include <stdint.h>

#include "../engine/ir/tensor.h"

typedef enum srv_code {
    SRV_OK = 0,
    SRV_CANCELLED = 1,
    SRV_UNKNOWN = 2,
    SRV_INVALID_ARGUMENT = 3,
    SRV_DEADLINE_EXCEEDED = 4,
    SRV_NOT_FOUND = 5,
    SRV_ALREADY_EXISTS = 6,
    SRV_PERMISSION_DENIED = 7,
    SRV_RESOURCE_EXHAUSTED = 8,
    SRV_FAILED_PRECONDITION = 9,
    SRV_ABORTED = 10,
    SRV_OUT_OF_RANGE = 11,
    SRV_UNIMPLEMENTED = 12,
    SRV_INTERNAL = 13,
    SRV_UNAVAILABLE = 14,
    SRV_DATA_LOSS = 15,
    SRV_UNAUTHENTICATED = 16,
} srv_code;

#define TENSORD_VERSION "0.1.0"

#define SRV_ERR_MAX 1024

/* Values of a request's cancel flag (infer.h, batcher.h): the client went away, or its deadline passed. */
#define SRV_CANCEL_CLIENT 1
#define SRV_CANCEL_DEADLINE 2

typedef struct srv_error {
    srv_code code;
    char msg[SRV_ERR_MAX];
} srv_error;

/* Set err (may be NULL) and return code. printf-style. */
srv_code srv_err(srv_error *err, srv_code code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Map an engine status (with eng_last_error()) onto err. */
srv_code srv_err_from_eng(srv_error *err, eng_status st, const char *prefix);
/* "INVALID_ARGUMENT", ... */
const char *srv_code_name(srv_code c);
/* HTTP status for a code, following TF Serving's REST mapping (400, 404, 429, 503, 504, 500, 501...). */
int srv_code_http(srv_code c);

/* Named tensors that own their names and data (eng_alloc'd). */
typedef struct srv_tensors {
    int n;
    char **names;
    eng_tensor *t;
} srv_tensors;

/* Append a tensor: copies name; takes ownership of t->data (must come from eng_alloc). -1 on OOM. */
int srv_tensors_add(srv_tensors *s, const char *name, const eng_tensor *t);
/* Append a deep copy of t (copies data). */
int srv_tensors_add_copy(srv_tensors *s, const char *name, const eng_tensor *t);
/* Index of name, -1 if absent. */
int srv_tensors_find(const srv_tensors *s, const char *name);
void srv_tensors_free(srv_tensors *s); /* frees contents, leaves s zeroed */

/* Names must match [A-Za-z0-9_.-]+, not "." or "..", at most 255 chars. */
int srv_name_valid(const char *name);
/* rm -rf path: a file or a directory tree, symlinks not followed; a missing path is fine. 0, or -1 with errno. */
int srv_remove_tree(const char *path);

/* 1 if the header value hdr is "Bearer <token>" (scheme case-insensitive; REST's Authorization header and
 * gRPC's authorization metadata). Takes the same time wherever hdr and token first differ. */
int srv_bearer_ok(const char *hdr, const char *token);

/* Monotonic microseconds. */
int64_t srv_now_us(void);

#endif
