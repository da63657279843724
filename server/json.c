/* json.c - JSON depth pre-check, output buffer and writers, strict base64, JSON leaf -> tensor element
 * (see json.h and codec.h).
 *
 * srv_json_depth_ok is a single linear pass that never recurses, so it is safe on any input; every body
 * goes through it before cJSON sees it, which bounds the depth of every later recursive walk.
 */
#include "json.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"

#define SRV_BUF_DEFAULT_MAX ((size_t)1 << 30)

int srv_json_depth_ok(const char *body, size_t len, int max_depth) {
    int depth = 0;
    for (size_t i = 0; i < len; i++) {
        char c = body[i];
        if (c == '"') {
            for (i++; i < len && body[i] != '"'; i++)
                if (body[i] == '\\') i++; /* skip the escaped character */
        } else if (c == '[' || c == '{') {
            if (++depth > max_depth) return 0;
        } else if (c == ']' || c == '}') {
            if (depth > 0) depth--;
        }
    }
    return 1;
}

cJSON *srv_json_parse(const char *body, size_t len, srv_error *err) {
    if (!body || len == 0) {
        srv_err(err, SRV_INVALID_ARGUMENT, "empty request body");
        return NULL;
    }
    if (!srv_json_depth_ok(body, len, SRV_JSON_MAX_DEPTH)) {
        srv_err(err, SRV_INVALID_ARGUMENT, "JSON nests deeper than %d levels", SRV_JSON_MAX_DEPTH);
        return NULL;
    }
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!j) {
        size_t off = end && end >= body ? (size_t)(end - body) : 0;
        srv_err(err, SRV_INVALID_ARGUMENT, "malformed JSON near byte %zu", off);
        return NULL;
    }
    /* Trailing bytes other than whitespace (or a NUL terminator) are an error, as in TF Serving. */
    if (end) {
        for (const char *p = end; p < body + len; p++) {
            if (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n' || *p == '\0') continue;
            srv_err(err, SRV_INVALID_ARGUMENT, "malformed JSON: trailing data at byte %zu", (size_t)(p - body));
            cJSON_Delete(j);
            return NULL;
        }
    }
    return j;
}

int srv_json_is_b64(const cJSON *v) {
    return cJSON_IsObject(v) && v->child && !v->child->next && v->child->string &&
           strcmp(v->child->string, "b64") == 0;
}

/* ---- output buffer ---- */

static int srv_buf_reserve(srv_buf *b, size_t n) {
    if (b->oom) return 0;
    size_t max = b->max ? b->max : SRV_BUF_DEFAULT_MAX;
    if (n >= max || b->len >= max - n) {
        b->oom = 1;
        return 0;
    }
    size_t need = b->len + n + 1;
    if (need <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap = cap > max / 2 ? max + 1 : cap * 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return 0;
    }
    b->p = p;
    b->cap = cap;
    return 1;
}

void srv_buf_put(srv_buf *b, const void *s, size_t n) {
    if (!srv_buf_reserve(b, n)) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void srv_buf_puts(srv_buf *b, const char *s) { srv_buf_put(b, s, strlen(s)); }

void srv_buf_printf(srv_buf *b, const char *fmt, ...) {
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        srv_buf_put(b, small, (size_t)n);
        return;
    }
    if (!srv_buf_reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void srv_buf_json_str(srv_buf *b, const char *s) {
    srv_buf_put(b, "\"", 1);
    const char *run = s;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p >= 0x20 && *p != '"' && *p != '\\') continue;
        srv_buf_put(b, run, (size_t)((const char *)p - run));
        switch (*p) {
        case '"': srv_buf_puts(b, "\\\""); break;
        case '\\': srv_buf_puts(b, "\\\\"); break;
        case '\n': srv_buf_puts(b, "\\n"); break;
        case '\r': srv_buf_puts(b, "\\r"); break;
        case '\t': srv_buf_puts(b, "\\t"); break;
        default: srv_buf_printf(b, "\\u%04x", *p); break;
        }
        run = (const char *)p + 1;
    }
    srv_buf_puts(b, run);
    srv_buf_put(b, "\"", 1);
}

/* Shortest %g form that reads back to the same value (at most 9 / 17 significant digits). */
static void srv_buf_float(srv_buf *b, double v, int is_f32) {
    if (isnan(v)) { srv_buf_puts(b, "NaN"); return; }
    if (isinf(v)) { srv_buf_puts(b, v < 0 ? "-Infinity" : "Infinity"); return; }
    char s[64];
    int lo = is_f32 ? 6 : 15, hi = is_f32 ? 9 : 17;
    for (int p = lo; p <= hi; p++) {
        snprintf(s, sizeof s, "%.*g", p, v);
        if (p == hi) break;
        if (is_f32 ? strtof(s, NULL) == (float)v : strtod(s, NULL) == v) break;
    }
    srv_buf_puts(b, s);
}

void srv_buf_json_elem(srv_buf *b, const eng_tensor *t, int64_t i) {
    const void *d = t->data;
    switch (t->dtype) {
    case ENG_DTYPE_F32: { srv_buf_float(b, ((const float *)d)[i], 1); return; }
    case ENG_DTYPE_F64: { srv_buf_float(b, ((const double *)d)[i], 0); return; }
    case ENG_DTYPE_F16: { srv_buf_float(b, eng_f16_to_f32(((const uint16_t *)d)[i]), 1); return; }
    case ENG_DTYPE_BF16: { srv_buf_float(b, eng_bf16_to_f32(((const uint16_t *)d)[i]), 1); return; }
    case ENG_DTYPE_BOOL: { srv_buf_puts(b, ((const uint8_t *)d)[i] ? "true" : "false"); return; }
    case ENG_DTYPE_U8: { srv_buf_printf(b, "%u", (unsigned)((const uint8_t *)d)[i]); return; }
    case ENG_DTYPE_I8: { srv_buf_printf(b, "%d", (int)((const int8_t *)d)[i]); return; }
    case ENG_DTYPE_U16: { srv_buf_printf(b, "%u", (unsigned)((const uint16_t *)d)[i]); return; }
    case ENG_DTYPE_I16: { srv_buf_printf(b, "%d", (int)((const int16_t *)d)[i]); return; }
    case ENG_DTYPE_U32: { srv_buf_printf(b, "%lu", (unsigned long)((const uint32_t *)d)[i]); return; }
    case ENG_DTYPE_I32: { srv_buf_printf(b, "%ld", (long)((const int32_t *)d)[i]); return; }
    case ENG_DTYPE_U64: { srv_buf_printf(b, "%llu", (unsigned long long)((const uint64_t *)d)[i]); return; }
    case ENG_DTYPE_I64: { srv_buf_printf(b, "%lld", (long long)((const int64_t *)d)[i]); return; }
    default: { srv_buf_puts(b, "null"); return; }
    }
}

void srv_buf_json_nested(srv_buf *b, const eng_tensor *t, int64_t off, const int64_t *dims, int ndim) {
    if (ndim <= 0) { srv_buf_json_elem(b, t, off); return; }
    int64_t inner = eng_shape_numel(dims + 1, ndim - 1);
    srv_buf_put(b, "[", 1);
    for (int64_t i = 0; i < dims[0] && !b->oom; i++) {
        if (i) srv_buf_put(b, ",", 1);
        if (ndim == 1) srv_buf_json_elem(b, t, off + i);
        else srv_buf_json_nested(b, t, off + i * inner, dims + 1, ndim - 1);
    }
    srv_buf_put(b, "]", 1);
}

char *srv_buf_take(srv_buf *b, size_t *len) {
    if (!b->oom && !b->p) srv_buf_put(b, "", 0);
    if (b->oom || !b->p) {
        srv_buf_free(b);
        return NULL;
    }
    char *p = b->p;
    if (len) *len = b->len;
    b->p = NULL;
    b->len = b->cap = 0;
    return p;
}

void srv_buf_free(srv_buf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* ---- base64 ---- */

static const char srv_b64_chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static int srv_b64_val(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

int64_t srv_b64_decoded_len(const char *in, size_t n) {
    size_t pad = 0;
    while (pad < 2 && n > pad && in[n - 1 - pad] == '=') pad++;
    if (pad && n % 4 != 0) return -1;
    size_t body = n - pad;
    if (body % 4 == 1) return -1;
    return (int64_t)(body / 4 * 3 + (body % 4 ? body % 4 - 1 : 0));
}

int srv_b64_decode(const char *in, size_t n, uint8_t *out, size_t cap, size_t *outlen) {
    int64_t want = srv_b64_decoded_len(in, n);
    if (want < 0 || (uint64_t)want > cap) return -1;
    size_t pad = 0;
    while (pad < 2 && n > pad && in[n - 1 - pad] == '=') pad++;
    size_t body = n - pad, o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < body; i++) {
        int v = srv_b64_val((unsigned char)in[i]);
        if (v < 0) return -1;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (uint8_t)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    if (outlen) *outlen = o;
    return o == (size_t)want ? 0 : -1;
}

char *srv_b64_encode(const void *in, size_t n, size_t *outlen) {
    if (n > (SIZE_MAX - 1) / 4 * 3 - 3) return NULL;
    size_t m = (n + 2) / 3 * 4;
    char *s = malloc(m + 1);
    if (!s) return NULL;
    const uint8_t *p = in;
    size_t o = 0, i = 0;
    for (; i + 2 < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        s[o++] = srv_b64_chars[v >> 18];
        s[o++] = srv_b64_chars[(v >> 12) & 63];
        s[o++] = srv_b64_chars[(v >> 6) & 63];
        s[o++] = srv_b64_chars[v & 63];
    }
    if (i < n) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0);
        s[o++] = srv_b64_chars[v >> 18];
        s[o++] = srv_b64_chars[(v >> 12) & 63];
        s[o++] = i + 1 < n ? srv_b64_chars[(v >> 6) & 63] : '=';
        s[o++] = '=';
    }
    s[o] = '\0';
    if (outlen) *outlen = o;
    return s;
}

/* ---- JSON leaf -> element ---- */

static const char *srv_json_kind(const cJSON *v) {
    if (cJSON_IsBool(v)) return "a bool";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsArray(v)) return "a list";
    if (cJSON_IsObject(v)) return "an object";
    return "an unknown value";
}

srv_code srv_json_store(const cJSON *v, eng_dtype dt, void *dst, int64_t idx, const char *what, srv_error *err) {
    const char *dn = eng_dtype_name(dt);
    if (dt == ENG_DTYPE_BOOL) {
        if (!cJSON_IsBool(v))
            return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': element %lld: expected true/false for bool, got %s",
                           what, (long long)idx, srv_json_kind(v));
        ((uint8_t *)dst)[idx] = cJSON_IsTrue(v) ? 1 : 0;
        return SRV_OK;
    }
    double d;
    if (cJSON_IsNumber(v)) {
        d = v->valuedouble;
    } else if (eng_dtype_is_float(dt) && cJSON_IsString(v) &&
               (!strcmp(v->valuestring, "NaN") || !strcmp(v->valuestring, "Infinity") ||
                !strcmp(v->valuestring, "-Infinity"))) {
        d = v->valuestring[0] == 'N' ? NAN : v->valuestring[0] == '-' ? -INFINITY : INFINITY;
    } else {
        return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': element %lld: expected a number for %s, got %s", what,
                       (long long)idx, dn, srv_json_kind(v));
    }
    if (eng_dtype_is_float(dt)) {
        double lim = dt == ENG_DTYPE_F16 ? 65504.0 : dt == ENG_DTYPE_F64 ? DBL_MAX : FLT_MAX;
        if (isfinite(d) && fabs(d) > lim)
            return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': element %lld: value %g is out of range for %s",
                           what, (long long)idx, d, dn);
        switch (dt) {
        case ENG_DTYPE_F32: ((float *)dst)[idx] = (float)d; break;
        case ENG_DTYPE_F64: ((double *)dst)[idx] = d; break;
        case ENG_DTYPE_F16: ((uint16_t *)dst)[idx] = eng_f32_to_f16((float)d); break;
        default: ((uint16_t *)dst)[idx] = eng_f32_to_bf16((float)d); break;
        }
        return SRV_OK;
    }
    if (!eng_dtype_is_int(dt))
        return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': dtype %s cannot be given as JSON", what, dn);
    if (!isfinite(d) || d != floor(d))
        return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': element %lld: expected an integer for %s, got %g", what,
                       (long long)idx, dn, d);
    double lo, hi; /* inclusive lo, exclusive hi */
    switch (dt) {
    case ENG_DTYPE_U8: lo = 0, hi = 256.0; break;
    case ENG_DTYPE_I8: lo = -128.0, hi = 128.0; break;
    case ENG_DTYPE_U16: lo = 0, hi = 65536.0; break;
    case ENG_DTYPE_I16: lo = -32768.0, hi = 32768.0; break;
    case ENG_DTYPE_U32: lo = 0, hi = 4294967296.0; break;
    case ENG_DTYPE_I32: lo = -2147483648.0, hi = 2147483648.0; break;
    case ENG_DTYPE_U64: lo = 0, hi = 18446744073709551616.0; break;
    default: lo = -9223372036854775808.0, hi = 9223372036854775808.0; break;
    }
    if (d < lo || d >= hi)
        return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': element %lld: value %.17g is out of range for %s", what,
                       (long long)idx, d, dn);
    switch (dt) {
    case ENG_DTYPE_U8: ((uint8_t *)dst)[idx] = (uint8_t)d; break;
    case ENG_DTYPE_I8: ((int8_t *)dst)[idx] = (int8_t)d; break;
    case ENG_DTYPE_U16: ((uint16_t *)dst)[idx] = (uint16_t)d; break;
    case ENG_DTYPE_I16: ((int16_t *)dst)[idx] = (int16_t)d; break;
    case ENG_DTYPE_U32: ((uint32_t *)dst)[idx] = (uint32_t)d; break;
    case ENG_DTYPE_I32: ((int32_t *)dst)[idx] = (int32_t)d; break;
    case ENG_DTYPE_U64: ((uint64_t *)dst)[idx] = (uint64_t)d; break;
    default: ((int64_t *)dst)[idx] = (int64_t)d; break;
    }
    return SRV_OK;
}
