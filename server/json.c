/* json.c - JSON depth pre-check, output buffer and writers, strict base64, JSON leaf -> tensor element
 * (see json.h and codec.h).
 *
 * srv_json_depth_ok is a single linear pass that never recurses, so it is safe on any input; every body
 * goes through it before cJSON sees it, which bounds the depth of every later recursive walk.
 *
 * Numbers: cJSON keeps only a double, which cannot hold every int64 (2^63-1 reads as 2^63) and turns 1e400
 * into infinity. srv_json_parse therefore hands the text of each number that a double may misstate to its
 * node (see json.h), and every conversion into a dtype judges integers on that exact text and refuses
 * non-finite parses; the fast list reader does the same from its own exact mantissa and exponent.
 */
#include "json.h"

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

/* ---- number texts for cJSON nodes ---- */

static int srv_num_char(char c) {
    return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
}

/* Can the double of a number token mislead? Not for a token of at most 15 characters without an exponent: it
 * has at most 15 significant digits and a magnitude below 10^15 < 2^50, so its double is exact when it is an
 * integer and never integral when it is not (10^(int digits + fraction digits) < 2^52). */
static int srv_num_text_wanted(const char *s, size_t n) {
    if (n > 15) return 1;
    for (size_t i = 0; i < n; i++)
        if (s[i] == 'e' || s[i] == 'E') return 1;
    return 0;
}

static int srv_text_int(const char *s, size_t n, int *neg, uint64_t *mag);
static int srv_double_int(double d, int *neg, uint64_t *mag);
enum { SRV_JINT_FRACTION = 0, SRV_JINT_OK = 1, SRV_JINT_HUGE = 2 };

/* Does number token s (parsed by cJSON as d) need its text on the node? When the double would judge it as an
 * integer differently from its exact value (2^63-1 reads as 2^63; 1e-400 as the integer 0), and for every
 * integer past 2^53 or beyond 64 bits (1e19, 1e400, 1e39, 400 digits), which an error message then quotes as
 * written. Most floats ("0.1234...") are fractions both ways and keep no text, so a body of them costs no
 * allocation here. */
static int srv_num_needs_text(const char *s, size_t n, double d) {
    if (!srv_num_text_wanted(s, n)) return 0;
    int ne, nd;
    uint64_t me, md;
    int re = srv_text_int(s, n, &ne, &me);
    if (re == SRV_JINT_HUGE || (re == SRV_JINT_OK && me > (1ull << 53))) return 1;
    return re != srv_double_int(d, &nd, &md) || (re == SRV_JINT_OK && me != md);
}

/* The next number token at or after body[*pos], outside strings (skipped as srv_json_depth_ok does): a number
 * is the only token that starts with '-' or a digit, and in a document cJSON accepted it is one maximal run of
 * number characters. 1 with its bounds and *pos past it; 0 at the end. */
static int srv_json_next_num(const char *body, size_t len, size_t *pos, const char **s, size_t *n) {
    for (size_t i = *pos; i < len; i++) {
        char c = body[i];
        if (c == '"') {
            for (i++; i < len && body[i] != '"'; i++)
                if (body[i] == '\\') i++;
            continue;
        }
        if (c != '-' && !(c >= '0' && c <= '9')) continue;
        size_t st = i;
        while (i < len && srv_num_char(body[i])) i++;
        *s = body + st;
        *n = i - st;
        *pos = i;
        return 1;
    }
    *pos = len;
    return 0;
}

/* Walk root's number nodes in document order (cJSON keeps members and elements in text order) alongside the
 * number tokens of body, giving the nodes that need it (srv_num_needs_text) a copy of their text; with body
 * NULL, free every kept text instead. Returns 0; 1 when nodes and tokens do not pair up one to one (then no
 * text may be trusted: the caller clears them); -1 on OOM. Iterative: an explicit stack bounded by the depth
 * check. */
static int srv_json_number_walk(cJSON *root, const char *body, size_t len) {
    cJSON *stack[2 * SRV_JSON_MAX_DEPTH + 2];
    int sp = 0;
    size_t pos = 0;
    cJSON *n = root;
    for (;;) {
        if (cJSON_IsNumber(n)) {
            const char *s;
            size_t tn;
            if (!body) {
                free(n->valuestring);
                n->valuestring = NULL;
            } else if (!srv_json_next_num(body, len, &pos, &s, &tn)) {
                return 1;
            } else if (srv_num_needs_text(s, tn, n->valuedouble) && !n->valuestring) {
                if (!(n->valuestring = strndup(s, tn))) return -1;
            }
        }
        if ((cJSON_IsArray(n) || cJSON_IsObject(n)) && n->child) {
            if (sp >= (int)(sizeof stack / sizeof *stack)) return 1;
            stack[sp++] = n;
            n = n->child;
            continue;
        }
        for (;;) {
            if (sp == 0) {
                const char *s;
                size_t tn;
                return body && srv_json_next_num(body, len, &pos, &s, &tn) ? 1 : 0; /* tokens left over */
            }
            if (n->next) {
                n = n->next;
                break;
            }
            n = stack[--sp];
        }
    }
}

/* Give the number nodes of root (parsed from body) whose double may mislead their text. 0, or -1 on OOM. */
static int srv_json_attach_texts(cJSON *root, const char *body, size_t len) {
    int rc = srv_json_number_walk(root, body, len);
    if (rc != 0) srv_json_number_walk(root, NULL, 0);
    return rc < 0 ? -1 : 0;
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
    if (srv_json_attach_texts(j, body, len) != 0) {
        srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory reading the numbers of the request");
        cJSON_Delete(j);
        return NULL;
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

/* Shortest %g form that reads back to the same value (at most 9 / 17 significant digits); non-finite values as
 * the strings TF Serving's clients read back ("NaN", "Infinity", "-Infinity"). */
static void srv_buf_float(srv_buf *b, double v, int is_f32) {
    if (isnan(v)) { srv_buf_puts(b, "\"NaN\""); return; }
    if (isinf(v)) { srv_buf_puts(b, v < 0 ? "\"-Infinity\"" : "\"Infinity\""); return; }
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

/* ---- exact integers ---- */

static const uint64_t srv_p10u[20] = {1ull, 10ull, 100ull, 1000ull, 10000ull, 100000ull, 1000000ull, 10000000ull,
                                      100000000ull, 1000000000ull, 10000000000ull, 100000000000ull,
                                      1000000000000ull, 10000000000000ull, 100000000000000ull,
                                      1000000000000000ull, 10000000000000000ull, 100000000000000000ull,
                                      1000000000000000000ull, 10000000000000000000ull};

/* What a number is as an integer (SRV_JINT_*, declared above): OK with sign and magnitude (|v| <= UINT64_MAX),
 * a fraction, or integral but beyond 64 bits. */

/* The exact integer value of number text s[0..n) (strict JSON syntax, as cJSON accepted it): digit j of the
 * digits (integer part then fraction) weighs 10^(nint - 1 - j + exp). Linear in n; exponents are clamped at
 * 10^9, far past any 64-bit value. */
static int srv_text_int(const char *s, size_t n, int *neg, uint64_t *mag) {
    const char *p = s, *end = s + n;
    *neg = 0;
    *mag = 0;
    if (p < end && *p == '-') *neg = 1, p++;
    const char *i0 = p;
    while (p < end && *p >= '0' && *p <= '9') p++;
    const char *f0 = p, *f1 = p;
    int64_t ni = p - i0;
    if (p < end && *p == '.') {
        f0 = ++p;
        while (p < end && *p >= '0' && *p <= '9') p++;
        f1 = p;
    }
    int64_t nf = f1 - f0, ex = 0;
    if (p < end && (*p == 'e' || *p == 'E')) {
        int eneg = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-')) eneg = *p++ == '-';
        for (; p < end && *p >= '0' && *p <= '9'; p++)
            if (ex < 1000000000) ex = ex * 10 + (*p - '0');
        if (eneg) ex = -ex;
    }
    int64_t first = -1, last = -1;
    for (int64_t j = 0; j < ni + nf; j++)
        if ((j < ni ? i0[j] : f0[j - ni]) != '0') {
            if (first < 0) first = j;
            last = j;
        }
    if (first < 0) return SRV_JINT_OK; /* zero */
    if (ni - 1 - last + ex < 0) return SRV_JINT_FRACTION;
    if (ni - first + ex > 20) return SRV_JINT_HUGE; /* more than 20 digits */
    uint64_t m = 0;
    for (int64_t j = first; j <= last; j++) {
        unsigned d = (unsigned)((j < ni ? i0[j] : f0[j - ni]) - '0');
        if (m > (UINT64_MAX - d) / 10) return SRV_JINT_HUGE;
        m = m * 10 + d;
    }
    for (int64_t k = ni - 1 - last + ex; k > 0; k--) {
        if (m > UINT64_MAX / 10) return SRV_JINT_HUGE;
        m *= 10;
    }
    *mag = m;
    return SRV_JINT_OK;
}

/* The double d as an integer, the way srv_text_int judges text. */
static int srv_double_int(double d, int *neg, uint64_t *mag) {
    *neg = signbit(d) != 0;
    *mag = 0;
    if (!isfinite(d)) return SRV_JINT_HUGE;
    if (d != floor(d)) return SRV_JINT_FRACTION;
    if (fabs(d) >= 18446744073709551616.0) return SRV_JINT_HUGE;
    *mag = (uint64_t)fabs(d);
    return SRV_JINT_OK;
}

/* The number v as an integer: exactly from its text when srv_json_parse kept it, else from the double, which
 * judges it the same way then (srv_num_needs_text). */
static int srv_json_num_int(const cJSON *v, int *neg, uint64_t *mag) {
    if (v->valuestring) return srv_text_int(v->valuestring, strlen(v->valuestring), neg, mag);
    return srv_double_int(v->valuedouble, neg, mag);
}

/* Largest magnitude of a negative (nmax) and of a positive (pmax) value of an integer dtype: exact bounds. */
static void srv_int_bounds(eng_dtype dt, uint64_t *nmax, uint64_t *pmax) {
    switch (dt) {
    case ENG_DTYPE_U8: *nmax = 0, *pmax = UINT8_MAX; break;
    case ENG_DTYPE_I8: *nmax = 128, *pmax = INT8_MAX; break;
    case ENG_DTYPE_U16: *nmax = 0, *pmax = UINT16_MAX; break;
    case ENG_DTYPE_I16: *nmax = 32768, *pmax = INT16_MAX; break;
    case ENG_DTYPE_U32: *nmax = 0, *pmax = UINT32_MAX; break;
    case ENG_DTYPE_I32: *nmax = 2147483648ull, *pmax = INT32_MAX; break;
    case ENG_DTYPE_U64: *nmax = 0, *pmax = UINT64_MAX; break;
    default: *nmax = 9223372036854775808ull, *pmax = INT64_MAX; break;
    }
}

/* Store (-1)^neg * mag as element i of an integer dtype; 0 (nothing stored) when it is out of range. */
static int srv_int_put(eng_dtype dt, void *dst, size_t i, int neg, uint64_t mag) {
    uint64_t nmax, pmax;
    srv_int_bounds(dt, &nmax, &pmax);
    if (mag > (neg ? nmax : pmax)) return 0;
    int64_t sv = !neg ? (int64_t)(mag & INT64_MAX) : mag == 9223372036854775808ull ? INT64_MIN : -(int64_t)mag;
    switch (dt) {
    case ENG_DTYPE_U8: ((uint8_t *)dst)[i] = (uint8_t)mag; break;
    case ENG_DTYPE_I8: ((int8_t *)dst)[i] = (int8_t)sv; break;
    case ENG_DTYPE_U16: ((uint16_t *)dst)[i] = (uint16_t)mag; break;
    case ENG_DTYPE_I16: ((int16_t *)dst)[i] = (int16_t)sv; break;
    case ENG_DTYPE_U32: ((uint32_t *)dst)[i] = (uint32_t)mag; break;
    case ENG_DTYPE_I32: ((int32_t *)dst)[i] = (int32_t)sv; break;
    case ENG_DTYPE_U64: ((uint64_t *)dst)[i] = mag; break;
    case ENG_DTYPE_I64: ((int64_t *)dst)[i] = sv; break;
    default: return 0;
    }
    return 1;
}

int srv_json_int64(const cJSON *v, int64_t *out) {
    int neg;
    uint64_t mag;
    if (!cJSON_IsNumber(v) || srv_json_num_int(v, &neg, &mag) != SRV_JINT_OK) return 0;
    return srv_int_put(ENG_DTYPE_I64, out, 0, neg, mag);
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

/* The number v as the client wrote it, for messages: its text (long ones cut, with their length), else its
 * double in 15 digits (the most a kept-textless token has) or 17 where 15 do not read back. */
static const char *srv_json_num_str(const cJSON *v, char *buf, size_t cap) {
    const char *s = v->valuestring;
    if (!s) {
        snprintf(buf, cap, "%.15g", v->valuedouble);
        if (strtod(buf, NULL) != v->valuedouble) snprintf(buf, cap, "%.17g", v->valuedouble);
        return buf;
    }
    size_t n = strlen(s);
    if (n <= 40) snprintf(buf, cap, "%s", s);
    else snprintf(buf, cap, "%.24s... (%zu characters)", s, n);
    return buf;
}

/* Float inputs: a finite number that does not overflow dt, or one of the three strings. */
static srv_code srv_json_store_float(const cJSON *v, eng_dtype dt, void *dst, int64_t idx, const char *what,
                                     srv_error *err) {
    const char *dn = eng_dtype_name(dt);
    char vs[80];
    double d;
    if (cJSON_IsNumber(v)) {
        d = v->valuedouble;
        if (!isfinite(d))
            return srv_err(err, SRV_INVALID_ARGUMENT,
                           "input '%s': element %lld: value %s is out of range for %s: it overflows even a double "
                           "(send the string \"Infinity\" or \"-Infinity\" for an infinite value)",
                           what, (long long)idx, srv_json_num_str(v, vs, sizeof vs), dn);
    } else if (cJSON_IsString(v) && (!strcmp(v->valuestring, "NaN") || !strcmp(v->valuestring, "Infinity") ||
                                     !strcmp(v->valuestring, "-Infinity"))) {
        d = v->valuestring[0] == 'N' ? NAN : v->valuestring[0] == '-' ? -INFINITY : INFINITY;
    } else {
        return srv_err(err, SRV_INVALID_ARGUMENT,
                       "input '%s': element %lld: expected a number (or \"NaN\", \"Infinity\", \"-Infinity\") for %s, "
                       "got %s",
                       what, (long long)idx, dn, srv_json_kind(v));
    }
    float f = (float)d;
    uint16_t h = 0;
    const char *max = NULL; /* set when a finite d overflows dt */
    switch (dt) {
    case ENG_DTYPE_F64: ((double *)dst)[idx] = d; return SRV_OK;
    case ENG_DTYPE_F32:
        if (isinf(f) && isfinite(d)) max = "3.4028235e+38";
        else ((float *)dst)[idx] = f;
        break;
    case ENG_DTYPE_F16:
        h = eng_f32_to_f16(f);
        if ((h & 0x7fff) == 0x7c00 && isfinite(d)) max = "65504";
        else ((uint16_t *)dst)[idx] = h;
        break;
    default:
        h = eng_f32_to_bf16(f);
        if ((h & 0x7fff) == 0x7f80 && isfinite(d)) max = "3.3895314e+38";
        else ((uint16_t *)dst)[idx] = h;
        break;
    }
    if (max)
        return srv_err(err, SRV_INVALID_ARGUMENT,
                       "input '%s': element %lld: value %s is out of range for %s: finite as a double, it overflows "
                       "%s (largest finite magnitude %s)",
                       what, (long long)idx, srv_json_num_str(v, vs, sizeof vs), dn, dn, max);
    return SRV_OK;
}

srv_code srv_json_store(const cJSON *v, eng_dtype dt, void *dst, int64_t idx, const char *what, srv_error *err) {
    const char *dn = eng_dtype_name(dt);
    char vs[80];
    if (dt == ENG_DTYPE_BOOL) {
        if (!cJSON_IsBool(v))
            return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': element %lld: expected true/false for bool, got %s",
                           what, (long long)idx, srv_json_kind(v));
        ((uint8_t *)dst)[idx] = cJSON_IsTrue(v) ? 1 : 0;
        return SRV_OK;
    }
    if (eng_dtype_is_float(dt)) return srv_json_store_float(v, dt, dst, idx, what, err);
    if (!eng_dtype_is_int(dt))
        return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': dtype %s cannot be given as JSON", what, dn);
    if (!cJSON_IsNumber(v))
        return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': element %lld: expected an integer for %s, got %s", what,
                       (long long)idx, dn, srv_json_kind(v));
    int neg;
    uint64_t mag, nmax, pmax;
    int r = srv_json_num_int(v, &neg, &mag);
    if (r == SRV_JINT_FRACTION)
        return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': element %lld: expected an integer for %s, got %s", what,
                       (long long)idx, dn, srv_json_num_str(v, vs, sizeof vs));
    if (r == SRV_JINT_OK && srv_int_put(dt, dst, (size_t)idx, neg, mag)) return SRV_OK;
    srv_int_bounds(dt, &nmax, &pmax);
    if (r == SRV_JINT_OK && !v->valuestring) /* the exact value, which the double may round in print */
        snprintf(vs, sizeof vs, "%s%llu", neg && mag ? "-" : "", (unsigned long long)mag);
    else
        srv_json_num_str(v, vs, sizeof vs);
    return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': element %lld: value %s is out of range for %s [%s%llu, %llu]",
                   what, (long long)idx, vs, dn, nmax ? "-" : "", (unsigned long long)nmax, (unsigned long long)pmax);
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

/* The exact integer value of n (never through a double): 1 with *mag when n is integral and the 19 significant
 * digits the reader keeps hold it exactly; 0 otherwise (a fraction, too large, or more digits: the general
 * path then judges the text). */
static int srv_jnum_int(const srv_jnum *n, uint64_t *mag) {
    uint64_t m = n->m;
    *mag = 0;
    if (m == 0) return 1;
    if (n->inexact) return 0;
    if (n->e10 >= 0) {
        for (int k = 0; k < n->e10; k++) {
            if (m > UINT64_MAX / 10) return 0;
            m *= 10;
        }
    } else {
        if (n->e10 < -19 || m % srv_p10u[-n->e10]) return 0;
        m /= srv_p10u[-n->e10];
    }
    *mag = m;
    return 1;
}

/* Store n as element i like srv_json_store; 0 if it would refuse it. */
static int srv_json_fast_store(const srv_jnum *n, eng_dtype dt, void *dst, size_t i) {
    uint64_t mag;
    switch (dt) {
    case ENG_DTYPE_F32: {
        float f = (float)srv_jnum_double(n);
        if (isinf(f)) return 0; /* overflows float32 (or the double itself) */
        ((float *)dst)[i] = f;
        return 1;
    }
    case ENG_DTYPE_F64: {
        double d = srv_jnum_double(n);
        if (!isfinite(d)) return 0;
        ((double *)dst)[i] = d;
        return 1;
    }
    default: break;
    }
    if (!eng_dtype_is_int(dt) || !srv_jnum_int(n, &mag)) return 0;
    return srv_int_put(dt, dst, i, n->neg, mag);
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
        else if (!srv_json_fast_store(&num, dt, buf, n)) goto fail;
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
