/* npy.c - numpy .npy reader/writer (see npy.h).
 *
 * Format: "\x93NUMPY", major, minor, header length (u16 for v1, u32 for v2/v3), then an ASCII (v3: UTF-8)
 * Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with spaces and a
 * final '\n'; then the raw C-order little-endian data.
 * Invariants: the header is parsed strictly (known keys only, each exactly once, header at most 64 KiB);
 * the data size computed from shape and dtype with overflow checks must equal the bytes after the header
 * exactly; writes go through a temp file + fsync + rename (file-io.h). Written files use version 1.0 (2.0 when
 * the header would not fit), 64-byte aligned data as numpy does.
 */
#include "npy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file-io.h"
#include "graph.h"

#define ENG_NPY_MAX_HEADER 65536
#define ENG_NPY_MAX_FILE ((size_t)ENG_MAX_TENSOR_BYTES + ENG_NPY_MAX_HEADER + 16)

typedef struct eng_npy_parser {
    const char *p, *end;
    const char *what;
} eng_npy_parser;

static void eng_npy_ws(eng_npy_parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}

static int eng_npy_lit(eng_npy_parser *ps, const char *lit) {
    eng_npy_ws(ps);
    size_t n = strlen(lit);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, lit, n) != 0) return 0;
    ps->p += n;
    return 1;
}

/* Quoted string (' or ") into buf (at most n-1 chars). */
static int eng_npy_str(eng_npy_parser *ps, char *buf, size_t n) {
    eng_npy_ws(ps);
    if (ps->p >= ps->end || (*ps->p != '\'' && *ps->p != '"')) return 0;
    char q = *ps->p++;
    size_t k = 0;
    while (ps->p < ps->end && *ps->p != q) {
        if (k + 1 >= n || *ps->p == '\\') return 0;
        buf[k++] = *ps->p++;
    }
    if (ps->p >= ps->end) return 0;
    ps->p++;
    buf[k] = '\0';
    return 1;
}

static int eng_npy_int(eng_npy_parser *ps, int64_t *out) {
    eng_npy_ws(ps);
    int64_t v = 0;
    int digits = 0;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        if (v > (INT64_MAX - 9) / 10) return 0;
        v = v * 10 + (*ps->p++ - '0');
        digits++;
    }
    if (ps->p < ps->end && *ps->p == 'L') ps->p++; /* Python 2 longs */
    *out = v;
    return digits > 0;
}

static eng_dtype eng_npy_descr(const char *d) {
    static const struct { const char *s; eng_dtype dt; } tab[] = {
        {"f4", ENG_DTYPE_F32}, {"f8", ENG_DTYPE_F64}, {"f2", ENG_DTYPE_F16}, {"i1", ENG_DTYPE_I8},
        {"u1", ENG_DTYPE_U8},  {"i2", ENG_DTYPE_I16}, {"u2", ENG_DTYPE_U16}, {"i4", ENG_DTYPE_I32},
        {"u4", ENG_DTYPE_U32}, {"i8", ENG_DTYPE_I64}, {"u8", ENG_DTYPE_U64}, {"b1", ENG_DTYPE_BOOL},
    };
    char order = d[0];
    if (order != '<' && order != '|' && order != '=') return ENG_DTYPE_UNDEFINED;
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (strcmp(d + 1, tab[i].s) == 0) {
            int one_byte = tab[i].s[1] == '1';
            /* '|' (not applicable) only for one-byte types; '<' and '=' (native, little-endian here) for all */
            if (order == '|' && !one_byte) return ENG_DTYPE_UNDEFINED;
            return tab[i].dt;
        }
    return ENG_DTYPE_UNDEFINED;
}

static eng_status eng_npy_parse_header(const char *h, size_t n, const char *what, eng_tensor *t) {
    eng_npy_parser ps = {h, h + n, what};
    int have_descr = 0, have_order = 0, have_shape = 0;
    char key[32], descr[32];
    if (!eng_npy_lit(&ps, "{")) goto bad;
    for (;;) {
        if (eng_npy_lit(&ps, "}")) break;
        if (!eng_npy_str(&ps, key, sizeof key) || !eng_npy_lit(&ps, ":")) goto bad;
        if (strcmp(key, "descr") == 0 && !have_descr) {
            have_descr = 1;
            if (!eng_npy_str(&ps, descr, sizeof descr)) goto bad;
            t->dtype = eng_npy_descr(descr);
            if (t->dtype == ENG_DTYPE_UNDEFINED) {
                if (descr[0] == '>')
                    return eng_err(ENG_STATUS_UNSUPPORTED, "%s: big-endian dtype '%s' is not supported", what, descr);
                return eng_err(ENG_STATUS_UNSUPPORTED, "%s: dtype '%s' is not supported", what, descr);
            }
        } else if (strcmp(key, "fortran_order") == 0 && !have_order) {
            have_order = 1;
            if (eng_npy_lit(&ps, "True"))
                return eng_err(ENG_STATUS_UNSUPPORTED, "%s: fortran_order True is not supported", what);
            if (!eng_npy_lit(&ps, "False")) goto bad;
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            have_shape = 1;
            if (!eng_npy_lit(&ps, "(")) goto bad;
            t->ndim = 0;
            for (;;) {
                if (eng_npy_lit(&ps, ")")) break;
                int64_t d;
                if (!eng_npy_int(&ps, &d)) goto bad;
                if (t->ndim >= ENG_MAX_DIMS)
                    return eng_err(ENG_STATUS_UNSUPPORTED, "%s: rank exceeds the limit of %d dims", what,
                                   ENG_MAX_DIMS);
                t->dims[t->ndim++] = d;
                if (eng_npy_lit(&ps, ")")) break;
                if (!eng_npy_lit(&ps, ",")) goto bad;
            }
        } else {
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: unexpected or repeated header key '%s'", what, key);
        }
        if (eng_npy_lit(&ps, "}")) break;
        if (!eng_npy_lit(&ps, ",")) goto bad;
    }
    eng_npy_ws(&ps);
    if (ps.p != ps.end) goto bad;
    if (!have_descr || !have_order || !have_shape)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: header lacks %s", what,
                       !have_descr ? "'descr'" : !have_order ? "'fortran_order'" : "'shape'");
    return ENG_STATUS_OK;
bad:;
    char near[64];
    size_t off = (size_t)(ps.p - h), nn = n - off < sizeof near - 1 ? n - off : sizeof near - 1;
    memcpy(near, ps.p, nn);
    near[nn] = '\0';
    return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: malformed header at offset %zu near '%s'", what, off, near);
}

eng_status eng_npy_load_buffer(const void *buf, size_t len, const char *what, eng_tensor **out) {
    if (!what) what = "<npy buffer>";
    if (!out || (!buf && len)) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: NULL buffer or output", what);
    *out = NULL;
    const uint8_t *b = buf;
    if (len < 10 || memcmp(b, "\x93NUMPY", 6) != 0)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: not a .npy file (bad magic)", what);
    int major = b[6];
    size_t hlen, hoff;
    if (major == 1) {
        hlen = (size_t)b[8] | (size_t)b[9] << 8;
        hoff = 10;
    } else if (major == 2 || major == 3) {
        if (len < 12) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: truncated header", what);
        hlen = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
        hoff = 12;
    } else {
        return eng_err(ENG_STATUS_UNSUPPORTED, "%s: .npy format version %d.%d is not supported", what, major, b[7]);
    }
    if (hlen > ENG_NPY_MAX_HEADER)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: header of %zu bytes exceeds the limit of %d", what, hlen,
                       ENG_NPY_MAX_HEADER);
    if (hlen > len - hoff)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: header claims %zu bytes, file has %zu after the preamble",
                       what, hlen, len - hoff);
    const char *h = (const char *)b + hoff;
    if (hlen == 0 || h[hlen - 1] != '\n')
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: header does not end with a newline", what);
    for (size_t i = 0; i < hlen; i++)
        if (h[i] == '\0') return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: header contains a NUL byte", what);
    eng_tensor t = {0};
    ENG_TRY(eng_npy_parse_header(h, hlen, what, &t));
    size_t nb;
    ENG_TRY(eng_tensor_nbytes_checked(&t, what, &nb));
    size_t have = len - hoff - hlen;
    if (have != nb) {
        char sb[160];
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: shape %s of %s needs %zu data bytes, file has %zu", what,
                       eng_shape_str(t.dims, t.ndim, sb, sizeof sb), eng_dtype_name(t.dtype), nb, have);
    }
    t.data = eng_alloc(nb);
    eng_tensor *r = malloc(sizeof *r);
    if (!t.data || !r) {
        eng_free(t.data);
        free(r);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes", what, nb);
    }
    if (nb) memcpy(t.data, b + hoff + hlen, nb);
    if (t.dtype == ENG_DTYPE_BOOL)
        for (size_t i = 0; i < nb; i++) ((uint8_t *)t.data)[i] = ((uint8_t *)t.data)[i] != 0;
    *r = t;
    *out = r;
    return ENG_STATUS_OK;
}

eng_status eng_npy_load(const char *path, eng_tensor **out) {
    if (!path || !out) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "eng_npy_load: NULL argument");
    *out = NULL;
    uint8_t *buf;
    size_t len;
    ENG_TRY(eng_file_read(path, ENG_NPY_MAX_FILE, &buf, &len));
    eng_status st = eng_npy_load_buffer(buf, len, path, out);
    free(buf);
    return st;
}

eng_status eng_npy_save(const char *path, const eng_tensor *t) {
    if (!path || !t) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "eng_npy_save: NULL argument");
    const char *descr = eng_dtype_npy(t->dtype);
    if (!descr)
        return eng_err(ENG_STATUS_UNSUPPORTED, "%s: dtype %s cannot be stored in .npy", path, eng_dtype_name(t->dtype));
    size_t nb;
    ENG_TRY(eng_tensor_nbytes_checked(t, path, &nb));
    if (nb && !t->data) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: tensor has no data", path);
    char dict[512];
    int k = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (int i = 0; i < t->ndim; i++)
        k += snprintf(dict + k, sizeof dict - (size_t)k, "%lld,%s", (long long)t->dims[i],
                      (i + 1 < t->ndim) ? " " : "");
    if (t->ndim > 1) k--; /* numpy writes (2, 3) but (5,) */
    k += snprintf(dict + k, sizeof dict - (size_t)k, "), }");
    /* preamble + header (+ '\n') padded to a multiple of 64 */
    size_t pre = 10, total = pre + (size_t)k + 1;
    total = (total + 63) & ~(size_t)63;
    uint8_t hdr[640];
    memset(hdr, ' ', sizeof hdr);
    memcpy(hdr, "\x93NUMPY\x01\x00", 8);
    size_t hlen = total - pre;
    hdr[8] = (uint8_t)(hlen & 0xff);
    hdr[9] = (uint8_t)(hlen >> 8);
    memcpy(hdr + pre, dict, (size_t)k);
    hdr[total - 1] = '\n';
    eng_atomic_file f;
    ENG_TRY(eng_atomic_open(&f, path));
    eng_status st = eng_atomic_write(&f, hdr, total);
    if (st == ENG_STATUS_OK && nb) st = eng_atomic_write(&f, t->data, nb);
    if (st == ENG_STATUS_OK) return eng_atomic_commit(&f);
    eng_atomic_abort(&f);
    return st;
}
