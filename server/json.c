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

/* "%.{p}g" digits of |v| (v = m * 2^e exactly): N = |v| * 10^s rounded half to even, exact (128-bit). */
static uint64_t srv_f32_round(uint32_t m, int e, int s) {
    static const uint64_t p10u[] = {1ull, 10ull, 100ull, 1000ull, 10000ull, 100000ull, 1000000ull, 10000000ull,
                                    100000000ull, 1000000000ull, 10000000000ull, 100000000000ull,
                                    1000000000000ull, 10000000000000ull, 100000000000000ull,
                                    1000000000000000ull, 10000000000000000ull, 100000000000000000ull,
                                    1000000000000000000ull, 10000000000000000000ull};
    unsigned __int128 num = m, den = 1;
    int as = s < 0 ? -s : s;
    unsigned __int128 pw = as <= 19 ? (unsigned __int128)p10u[as] : (unsigned __int128)p10u[19] * p10u[as - 19];
    if (s >= 0) num *= pw;
    else den = pw;
    if (e >= 0) num <<= e;
    else den <<= -e;
    unsigned __int128 n = num / den, r2 = (num % den) * 2;
    if (r2 > den || (r2 == den && (n & 1))) n++;
    return (uint64_t)n;
}

/* Write (neg, N with p digits, decimal exponent x) as "%.{p}g" does (trailing zeros dropped). */
static int srv_g_write(char *s, int neg, uint64_t n, int p, int x) {
    char dg[10];
    for (int i = p - 1; i >= 0; i--) {
        dg[i] = (char)('0' + n % 10);
        n /= 10;
    }
    int nd = p;
    while (nd > 1 && dg[nd - 1] == '0') nd--;
    char *w = s;
    if (neg) *w++ = '-';
    if (x < -4 || x >= p) {
        *w++ = dg[0];
        if (nd > 1) {
            *w++ = '.';
            for (int i = 1; i < nd; i++) *w++ = dg[i];
        }
        *w++ = 'e';
        *w++ = x < 0 ? '-' : '+';
        int ax = x < 0 ? -x : x;
        if (ax >= 100) *w++ = (char)('0' + ax / 100);
        *w++ = (char)('0' + ax / 10 % 10);
        *w++ = (char)('0' + ax % 10);
    } else if (x >= 0) {
        for (int i = 0; i <= x; i++) *w++ = i < nd ? dg[i] : '0';
        if (nd > x + 1) {
            *w++ = '.';
            for (int i = x + 1; i < nd; i++) *w++ = dg[i];
        }
    } else {
        *w++ = '0';
        *w++ = '.';
        for (int i = 0; i < -x - 1; i++) *w++ = '0';
        for (int i = 0; i < nd; i++) *w++ = dg[i];
    }
    *w = 0;
    return (int)(w - s);
}

static unsigned __int128 srv_pow10_128(int k) { /* 0 <= k <= 38 */
    unsigned __int128 r = 1;
    while (k-- > 0) r *= 10;
    return r;
}

/* m * 2^e >= 10^k, exactly (|k| <= 22, -80 < e < 60). */
static int srv_f32_ge_pow10(uint32_t m, int e, int k) {
    unsigned __int128 a = m, b = 1;
    if (k >= 0) b = srv_pow10_128(k);
    else a *= srv_pow10_128(-k);
    if (e >= 0) a <<= e;
    else b <<= -e;
    return a >= b;
}

/* The shortest "%.{p}g" (p = 6..9) of a finite float f that strtof reads back as f, into s (>= 32 bytes):
 * the same text as trying snprintf + strtof for p = 6, 7, 8, 9, computed with exact integer rounding and
 * one correctly rounded double operation per candidate. Falls back to that loop outside 1e-14..1e22. */
static int srv_f32_fmt(float f, char *s) {
    static const double p10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    double v = fabs((double)f);
    int neg = signbit(f) != 0;
    if (v == 0) return srv_g_write(s, neg, 0, 6, 0);
    int e;
    double fr = frexp(v, &e); /* v = fr * 2^e, fr in [0.5, 1): fr * 2^24 is an integer for a float */
    uint32_t m = (uint32_t)ldexp(fr, 24);
    e -= 24;
    int x = (int)floor(log10(v)); /* may be off by one: fixed exactly below */
    if (x >= -14 && x <= 21) {
        if (!srv_f32_ge_pow10(m, e, x)) x--;
        else if (srv_f32_ge_pow10(m, e, x + 1)) x++;
    }
    if (x < -14 || x > 22) {
        for (int p = 6;; p++) {
            int len = snprintf(s, 32, "%.*g", p, (double)f);
            if (p == 9 || strtof(s, NULL) == f) return len;
        }
    }
    for (int p = 6; p <= 9; p++) {
        int xp = x;
        uint64_t n = srv_f32_round(m, e, p - 1 - x);
        if (n >= (uint64_t)p10[p]) { /* rounded up to 10^p */
            n /= 10;
            xp++;
        }
        if (p == 9) return srv_g_write(s, neg, n, p, xp);
        int k = xp - (p - 1); /* the candidate is n * 10^k, |k| <= 22 */
        double d = k >= 0 ? (double)n * p10[k] : (double)n / p10[-k];
        float r = (float)d;
        double other = (double)nextafterf(r, d > (double)r ? INFINITY : -INFINITY);
        int ok;
        if (d != (double)r && d - (double)r == other - d) { /* on a float midpoint: double rounding: ask strtof */
            srv_g_write(s, neg, n, p, xp);
            ok = strtof(s, NULL) == f;
        } else {
            ok = (neg ? -r : r) == f;
        }
        if (ok) return srv_g_write(s, neg, n, p, xp);
    }
    return 0; /* not reached */
}

/* Shortest %g form that reads back to the same value (at most 9 / 17 significant digits). */
static void srv_buf_float(srv_buf *b, double v, int is_f32) {
    if (isnan(v)) { srv_buf_puts(b, "NaN"); return; }
    if (isinf(v)) { srv_buf_puts(b, v < 0 ? "-Infinity" : "Infinity"); return; }
    char s[64];
    if (is_f32) {
        srv_buf_put(b, s, (size_t)srv_f32_fmt((float)v, s));
        return;
    }
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

/* ---- fast numeric lists ---- */

const char *srv_json_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    return p;
}

/* Eight ASCII digits in the little-endian word v? (SWAR: each byte in '0'..'9') */
static inline int srv_is_8digits(uint64_t v) {
    return (((v & 0xF0F0F0F0F0F0F0F0ull) | (((v + 0x0606060606060606ull) & 0xF0F0F0F0F0F0F0F0ull) >> 4)) ==
            0x3333333333333333ull);
}

/* The value of eight ASCII digits (first digit in the lowest byte): pairs, then quads, then the octet. */
static inline uint32_t srv_parse_8digits(uint64_t v) {
    v -= 0x3030303030303030ull;
    v = (v * 10) + (v >> 8);                                                      /* pairs in bytes 0,2,4,6 */
    v = (((v & 0x000000FF000000FFull) * 100 + ((v >> 16) & 0x000000FF000000FFull)));  /* quads in 0 and 4 */
    return (uint32_t)((v & 0xFFFFFFFFull) * 10000 + (v >> 32));
}

static inline int srv_ndigits8(uint64_t m) { /* digits of 0 < m < 10^8 */
    return 1 + (m >= 10) + (m >= 100) + (m >= 1000) + (m >= 10000) + (m >= 100000) + (m >= 1000000) +
           (m >= 10000000);
}

/* Digits at *p (at most `cap` significant ones go into *m, counted in *sd; the rest only count in *skipped and
 * set *inexact when nonzero). frac: digits after the decimal point (each significant one scales by 1/10, and
 * leading zeros of a zero mantissa too). Returns the end. Eight digits at a time while they fit. */
static const char *srv_digits(const char *p, const char *end, uint64_t *m, int *sd, int *scale, int *inexact, int frac) {
    while (end - p >= 8 && *sd + 8 <= 19) {
        uint64_t v;
        memcpy(&v, p, 8);
        if (!srv_is_8digits(v)) break;
        uint64_t was = *m;
        *m = was * 100000000u + srv_parse_8digits(v);
        if (was) *sd += 8;
        else *sd = *m ? srv_ndigits8(*m) : 0;
        if (frac) *scale -= 8;
        p += 8;
    }
    for (; p < end && *p >= '0' && *p <= '9'; p++) {
        if (*m == 0 && *p == '0') {
            if (frac) (*scale)--; /* leading zeros are not significant */
        } else if (*sd < 19) {
            *m = *m * 10 + (uint64_t)(*p - '0'), (*sd)++;
            if (frac) (*scale)--;
        } else {
            if (!frac) (*scale)++;
            *inexact |= *p != '0';
        }
    }
    return p;
}

/* A JSON number read but not yet converted: value = (-1)^neg * m * 10^e10, exactly unless `inexact` (nonzero
 * digits past the 19th were dropped). [start, end) is its text. */
typedef struct srv_jnum {
    uint64_t m;
    int e10, inexact, neg;
    const char *start, *end;
} srv_jnum;

/* Scan one number in strict JSON syntax at p; 0 if the text is not one (or is longer than 63 bytes, as cJSON). */
static int srv_json_scan_num(const char *p, const char *end, srv_jnum *n) {
    const char *start = p;
    int neg = 0, sd = 0, scale = 0, inexact = 0, ex = 0, exneg = 0, nex = 0;
    uint64_t m = 0;
    if (p < end && *p == '-') neg = 1, p++;
    if (p >= end) return 0;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        p = srv_digits(p, end, &m, &sd, &scale, &inexact, 0);
    } else {
        return 0;
    }
    if (p < end && *p == '.') {
        const char *f0 = ++p;
        p = srv_digits(p, end, &m, &sd, &scale, &inexact, 1);
        if (p == f0) return 0;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) exneg = *p++ == '-';
        for (; p < end && *p >= '0' && *p <= '9'; p++, nex++)
            if (ex < 100000) ex = ex * 10 + (*p - '0');
        if (!nex) return 0;
    }
    if (p - start > 63) return 0; /* cJSON reads at most 63 characters of a number */
    *n = (srv_jnum){.m = m, .e10 = (exneg ? -ex : ex) + scale, .inexact = inexact, .neg = neg, .start = start, .end = p};
    return 1;
}

static const double srv_d10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* The double strtod gives for n (correctly rounded). A mantissa below 2^53 with a decimal exponent within +-22
 * is one correctly rounded double multiplication or division of exact operands (Clinger's fast path). Up to
 * 19 significant digits and an exponent within +-27 are converted with one x87 extended-precision operation,
 * then rounded to double; a result within one extended ulp of a double rounding boundary, and anything else,
 * goes to strtod. */
static double srv_jnum_double(const srv_jnum *n) {
    static const long double p10[] = {1e0L, 1e1L, 1e2L, 1e3L, 1e4L, 1e5L, 1e6L, 1e7L, 1e8L, 1e9L,
                                      1e10L, 1e11L, 1e12L, 1e13L, 1e14L, 1e15L, 1e16L, 1e17L, 1e18L, 1e19L,
                                      1e20L, 1e21L, 1e22L, 1e23L, 1e24L, 1e25L, 1e26L, 1e27L};
    uint64_t m = n->m;
    int e10 = n->e10;
    double d;
    if (m == 0) return n->neg ? -0.0 : 0.0;
    if (!n->inexact && m < (1ull << 53) && e10 >= -22 && e10 <= 22) {
        d = e10 >= 0 ? (double)m * srv_d10[e10] : (double)m / srv_d10[-e10];
        return n->neg ? -d : d;
    }
    if (!n->inexact && e10 >= -27 && e10 <= 27) {
        long double r = e10 >= 0 ? (long double)m * p10[e10] : (long double)m / p10[-e10];
        union { long double ld; struct { uint64_t mant; uint16_t se; } b; } u;
        memset(&u, 0, sizeof u);
        u.ld = r;
        unsigned low = (unsigned)(u.b.mant & 0x7ff); /* the 11 bits a double drops; 0x400: a midpoint */
        if (low < 0x3ff || low > 0x401) {
            d = (double)r;
            return n->neg ? -d : d;
        }
    }
    char tmp[72];
    memcpy(tmp, n->start, (size_t)(n->end - n->start));
    tmp[n->end - n->start] = '\0';
    return strtod(tmp, NULL); /* sign included */
}

/* (float) of the double strtod gives for n, without computing that double exactly: (double)m and one division
 * or multiplication by an exact power of ten are within 2 double ulps of it, so their float rounding is the
 * same unless the double lies within a few ulps of a point halfway between two floats (the 29 bits a float
 * drops near 0x10000000). 0 then, or outside the normal float range: the caller converts the slow way. */
static int srv_jnum_f32(const srv_jnum *n, float *out) {
    if (n->m == 0) {
        *out = n->neg ? -0.0f : 0.0f;
        return 1;
    }
    if (n->inexact || n->e10 < -22 || n->e10 > 22) return 0;
    double d = n->e10 >= 0 ? (double)n->m * srv_d10[n->e10] : (double)n->m / srv_d10[-n->e10];
    if (!(d >= 0x1p-126 && d < 0x1p127)) return 0; /* normal floats only, far from overflow */
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    int64_t low = (int64_t)(bits & 0x1fffffff) - 0x10000000;
    if (low >= -8 && low <= 8) return 0;
    float f = (float)d;
    *out = n->neg ? -f : f;
    return 1;
}

/* Store d as element i like srv_json_store; 0 if it would refuse it. */
static int srv_json_fast_store(double d, eng_dtype dt, void *dst, size_t i) {
    switch (dt) {
    case ENG_DTYPE_F32:
        if (!(fabs(d) <= FLT_MAX)) return 0;
        ((float *)dst)[i] = (float)d;
        return 1;
    case ENG_DTYPE_F64:
        if (!isfinite(d)) return 0;
        ((double *)dst)[i] = d;
        return 1;
    default: break;
    }
    if (!eng_dtype_is_int(dt) || !isfinite(d) || d != floor(d)) return 0;
    switch (dt) {
    case ENG_DTYPE_U8: if (d < 0 || d >= 256.0) return 0; ((uint8_t *)dst)[i] = (uint8_t)d; return 1;
    case ENG_DTYPE_I8: if (d < -128.0 || d >= 128.0) return 0; ((int8_t *)dst)[i] = (int8_t)d; return 1;
    case ENG_DTYPE_U16: if (d < 0 || d >= 65536.0) return 0; ((uint16_t *)dst)[i] = (uint16_t)d; return 1;
    case ENG_DTYPE_I16: if (d < -32768.0 || d >= 32768.0) return 0; ((int16_t *)dst)[i] = (int16_t)d; return 1;
    case ENG_DTYPE_U32: if (d < 0 || d >= 4294967296.0) return 0; ((uint32_t *)dst)[i] = (uint32_t)d; return 1;
    case ENG_DTYPE_I32:
        if (d < -2147483648.0 || d >= 2147483648.0) return 0;
        ((int32_t *)dst)[i] = (int32_t)d;
        return 1;
    case ENG_DTYPE_U64:
        if (d < 0 || d >= 18446744073709551616.0) return 0;
        ((uint64_t *)dst)[i] = (uint64_t)d;
        return 1;
    case ENG_DTYPE_I64:
        if (d < -9223372036854775808.0 || d >= 9223372036854775808.0) return 0;
        ((int64_t *)dst)[i] = (int64_t)d;
        return 1;
    default: return 0;
    }
}

int srv_json_fast_array(const char **pp, const char *end, eng_dtype dt, int max_rank, int64_t *dims, int *ndim,
                        void **data) {
    size_t es = eng_dtype_size(dt);
    if (es == 0 || dt == ENG_DTYPE_BOOL || dt == ENG_DTYPE_F16 || dt == ENG_DTYPE_BF16 || max_rank < 1 ||
        max_rank > ENG_MAX_DIMS)
        return 0;
    const char *p = srv_json_ws(*pp, end);
    if (p >= end || *p != '[') return 0;
    int64_t cnt[ENG_MAX_DIMS + 1];
    int known[ENG_MAX_DIMS + 1] = {0};
    int depth = 0, leaf = -1; /* leaf: the depth at which numbers sit (the rank) */
    size_t n = 0, cap = 0;
    uint8_t *buf = NULL;
    for (;;) {
        /* at the start of a value */
        p = srv_json_ws(p, end);
        if (p >= end) goto fail;
        if (*p == '[') {
            if (depth >= max_rank || (leaf >= 0 && depth >= leaf)) goto fail;
            cnt[depth++] = 0;
            p = srv_json_ws(p + 1, end);
            if (p >= end || *p == ']') goto fail; /* empty list: the general path decides */
            continue;
        }
        srv_jnum num;
        if (depth == 0 || !srv_json_scan_num(p, end, &num)) goto fail;
        p = num.end;
        if (leaf < 0) leaf = depth;
        else if (depth != leaf) goto fail;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 1024;
            uint8_t *nb = realloc(buf, nc * es);
            if (!nb) goto fail;
            buf = nb;
            cap = nc;
        }
        float f;
        if (dt == ENG_DTYPE_F32 && srv_jnum_f32(&num, &f)) ((float *)buf)[n] = f;
        else if (!srv_json_fast_store(srv_jnum_double(&num), dt, buf, n)) goto fail;
        n++;
        /* after a value: ',' or ']' (closing lists) */
        for (;;) {
            cnt[depth - 1]++;
            p = srv_json_ws(p, end);
            if (p >= end) goto fail;
            if (*p == ',') {
                p++;
                break;
            }
            if (*p != ']') goto fail;
            p++;
            depth--;
            if (!known[depth]) {
                known[depth] = 1;
                dims[depth] = cnt[depth];
            } else if (dims[depth] != cnt[depth]) {
                goto fail;
            }
            if (depth == 0) goto done;
        }
    }
done:
    for (int i = 0; i < leaf; i++)
        if (!known[i]) goto fail;
    *ndim = leaf;
    *data = eng_alloc(n * es);
    if (!*data) goto fail;
    memcpy(*data, buf, n * es);
    free(buf);
    *pp = p;
    return 1;
fail:
    free(buf);
    return 0;
}
