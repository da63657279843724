/* json.h - private helpers shared by the REST codecs (server/codec-*.c, server/rest*.c): a growable output
 * buffer with JSON writers (strings escaped, floats printed so they round-trip, NaN/Infinity as the JSON
 * strings "NaN", "Infinity", "-Infinity" so that every reply is strict JSON), strict base64, and the one place
 * where a parsed JSON leaf becomes a tensor element.
 *
 * Invariants: a srv_buf that failed to grow (or grew past its cap) sets oom and ignores further writes, so
 * writers need not check every call; srv_buf_take returns NULL then. Nothing here allocates more than the
 * caller asked for or the output needs.
 */
#ifndef SRV_JSON_H
#define SRV_JSON_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "srv.h"

/* Output buffer. Zero-initialize; max 0 means the default cap (1 GiB). */
typedef struct srv_buf {
    char *p;
    size_t len, cap, max;
    int oom;
} srv_buf;

void srv_buf_put(srv_buf *b, const void *s, size_t n);
void srv_buf_puts(srv_buf *b, const char *s);
void srv_buf_printf(srv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A JSON string literal with quotes; control chars, quotes and backslashes escaped. */
void srv_buf_json_str(srv_buf *b, const char *s);
/* Element i of t as a JSON value: a number, true/false, or for a non-finite float the string "NaN",
 * "Infinity" or "-Infinity" (never a bare NaN token: strict parsers refuse those). */
void srv_buf_json_elem(srv_buf *b, const eng_tensor *t, int64_t i);
/* The elements [off, off + prod(dims)) of t as nested lists following dims (ndim 0: a bare value). */
void srv_buf_json_nested(srv_buf *b, const eng_tensor *t, int64_t off, const int64_t *dims, int ndim);
/* Hand out the NUL-terminated text (malloc'd) and its length; NULL (and the buffer freed) after an OOM. */
char *srv_buf_take(srv_buf *b, size_t *len);
void srv_buf_free(srv_buf *b);

/* Base64 (standard alphabet). Decode is strict: only alphabet characters, '=' padding only at the end
 * (optional, but then the length must be consistent), at most cap bytes written. 0 on success, -1 on bad
 * input or if the result would exceed cap. srv_b64_decoded_len gives the exact size of a valid input
 * (-1 if the length/padding cannot be valid). */
int64_t srv_b64_decoded_len(const char *in, size_t n);
int srv_b64_decode(const char *in, size_t n, uint8_t *out, size_t cap, size_t *outlen);
/* malloc'd, NUL-terminated; NULL on OOM. */
char *srv_b64_encode(const void *in, size_t n, size_t *outlen);

/* Store the JSON leaf v as element idx of a dtype-dt buffer at dst. Numbers must fit the dtype exactly:
 * integers must be integral and within the dtype's exact range (int64: [-2^63, 2^63-1], judged on the number's
 * text, never on a rounded double); floats must be finite as parsed (1e400 is refused, not read as infinity)
 * and must not overflow the dtype (1e39 for float32). Bools only as true/false; float inputs also accept the
 * strings "NaN", "Infinity", "-Infinity" (what the writers above emit). Errors are INVALID_ARGUMENT naming
 * `what` (an input name), the flat index and the value as written. */
srv_code srv_json_store(const cJSON *v, eng_dtype dt, void *dst, int64_t idx, const char *what, srv_error *err);

/* Fast path for request bodies: a nested list of plain numbers at *p (after optional whitespace), in strict
 * JSON number syntax, rectangular, no empty list, at most max_rank levels, every element stored as dtype dt
 * exactly as srv_json_store would store the number (float, or an integral value in range). On success *data
 * is eng_alloc'd (row-major), dims/ndim give the shape, *p points past the list, and 1 is returned. Returns 0
 * (nothing allocated) for anything else, including every input srv_json_store would refuse: the caller then
 * takes the general cJSON path, which decides and words any error. Never recurses; bounded by max_rank. */
int srv_json_fast_array(const char **p, const char *end, eng_dtype dt, int max_rank, int64_t *dims, int *ndim,
                        void **data);
/* Skip JSON whitespace (space, tab, CR, LF). */
const char *srv_json_ws(const char *p, const char *end);

/* Parse after checking depth; NULL with err set (INVALID_ARGUMENT; RESOURCE_EXHAUSTED on OOM) on bad JSON.
 * Number nodes whose value a double may misstate (more than 15 characters, or an exponent) also carry their
 * text, NUL-terminated, in valuestring (freed by cJSON_Delete): srv_json_store and srv_json_int64 read it.
 * Test numbers with cJSON_IsNumber, strings with cJSON_IsString, never by valuestring != NULL. */
cJSON *srv_json_parse(const char *body, size_t len, srv_error *err);

/* The exact integral value of the number v in *out: 1 if v is a number, integral and in int64's range. */
int srv_json_int64(const cJSON *v, int64_t *out);

/* 1 if v is an object {"b64": "..."} (exactly that key). */
int srv_json_is_b64(const cJSON *v);

#endif
