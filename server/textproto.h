/* textproto.h - a small reader for protobuf text format (what TF Serving's config files use) and for the
 * same structure written as JSON, into one tree: messages hold named fields; a repeated field is simply
 * several children with the same name; scalars keep their text (strings unquoted and unescaped).
 * Limits: nesting depth SRV_TP_MAX_DEPTH, input size SRV_TP_MAX_BYTES. Errors give line and column.
 */
#ifndef SRV_TEXTPROTO_H
#define SRV_TEXTPROTO_H

#include <stddef.h>
#include <stdint.h>

#include "srv.h"

#define SRV_TP_MAX_DEPTH 32
#define SRV_TP_MAX_BYTES (16 << 20)

typedef struct srv_tp {
    char *name;        /* field name ("" for the root) */
    char *scalar;      /* scalar text, NULL for a message */
    struct srv_tp *kids;
    int nkids, cap;
} srv_tp;

/* Parse text format. *out is a root message; free with srv_tp_free. what names the source in errors. */
srv_code srv_tp_parse_text(const char *text, size_t len, const char *what, srv_tp **out, srv_error *err);
/* Parse JSON (objects -> messages, arrays -> repeated fields, scalars -> text). */
srv_code srv_tp_parse_json(const char *text, size_t len, const char *what, srv_tp **out, srv_error *err);
/* Read a file and parse it as JSON if its first non-space byte is '{' and it parses as JSON, else as text. */
srv_code srv_tp_parse_file(const char *path, srv_tp **out, srv_error *err);
void srv_tp_free(srv_tp **t);

/* i-th child named name (i counts only those), or NULL. */
const srv_tp *srv_tp_get(const srv_tp *m, const char *name, int i);
int srv_tp_count(const srv_tp *m, const char *name);
/* Scalar accessors on a child: return 0 and set *out, or -1 (absent) / -2 (wrong type; err filled naming it). */
int srv_tp_int(const srv_tp *m, const char *name, int64_t *out, srv_error *err);
int srv_tp_double(const srv_tp *m, const char *name, double *out, srv_error *err);
int srv_tp_bool(const srv_tp *m, const char *name, int *out, srv_error *err);
const char *srv_tp_str(const srv_tp *m, const char *name);
/* Wrapped scalars as TF Serving's batching file writes them: `max_batch_size { value: 32 }` or `max_batch_size: 32`. */
int srv_tp_wrapped_int(const srv_tp *m, const char *name, int64_t *out, srv_error *err);

#endif
