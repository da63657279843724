/* data-csv.c - CSV datasets (RFC 4180 with the usual leniencies), raw or gzipped.
 *
 * The first non-blank record is the header. The column named "label" (else the last one) becomes column "label"
 * (int64 when every value is an integer, else float32); the others, in file order, form "x" [N, ncols - 1]
 * float32. Fields may be quoted ("" escapes a quote; quoted fields may hold commas and newlines); spaces around
 * a field are ignored; CRLF and LF both end a record; blank lines are skipped; a UTF-8 BOM is skipped. Every
 * data field must be a finite number; a record with a different field count than the header is an error.
 * Messages give the 1-based line on which the record starts and the 0-based example.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data-impl.h"

typedef struct eng_csv {
    const char *p, *end, *path;
    int64_t line; /* line of the current position (1-based) */
    char *fb;     /* field bytes, each NUL-terminated */
    size_t fb_len, fb_cap;
    size_t *off; /* field start offsets into fb */
    int nf, nf_cap;
} eng_csv;

static int eng_csv_put(eng_csv *c, char ch) {
    if (c->fb_len + 1 >= c->fb_cap) {
        size_t nc = c->fb_cap ? c->fb_cap * 2 : 256;
        char *nb = realloc(c->fb, nc);
        if (!nb) return 0;
        c->fb = nb;
        c->fb_cap = nc;
    }
    c->fb[c->fb_len++] = ch;
    return 1;
}

static int eng_csv_field_start(eng_csv *c) {
    if (c->nf == c->nf_cap) {
        int nc = c->nf_cap ? c->nf_cap * 2 : 16;
        size_t *no = realloc(c->off, (size_t)nc * sizeof *no);
        if (!no) return 0;
        c->off = no;
        c->nf_cap = nc;
    }
    c->off[c->nf++] = c->fb_len;
    return 1;
}

/* Next record into fields. Returns 1 with a record, 0 at end of input, -1 on error (message set). *blank is
 * set for an empty line. *start_line is the line the record began on. */
static int eng_csv_record(eng_csv *c, int *blank, int64_t *start_line) {
    c->nf = 0;
    c->fb_len = 0;
    *blank = 0;
    *start_line = c->line;
    if (c->p >= c->end) return 0;
    if (!eng_csv_field_start(c)) goto oom;
    int any = 0;
    for (;;) {
        /* one field: skip leading spaces, then quoted or plain */
        while (c->p < c->end && (*c->p == ' ' || *c->p == '\t')) c->p++;
        if (c->p < c->end && *c->p == '"') {
            any = 1;
            int64_t qline = c->line;
            c->p++;
            for (;;) {
                if (c->p >= c->end) {
                    eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: line %lld: unterminated quoted field", c->path,
                            (long long)qline);
                    return -1;
                }
                char ch = *c->p++;
                if (ch == '"') {
                    if (c->p < c->end && *c->p == '"') {
                        c->p++;
                    } else {
                        break;
                    }
                }
                if (ch == '\n') c->line++;
                if (!eng_csv_put(c, ch)) goto oom;
            }
            while (c->p < c->end && (*c->p == ' ' || *c->p == '\t')) c->p++;
            if (c->p < c->end && *c->p != ',' && *c->p != '\n' && *c->p != '\r') {
                eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: line %lld: unexpected '%c' after a quoted field", c->path,
                        (long long)c->line, *c->p);
                return -1;
            }
        } else {
            size_t start = c->fb_len;
            while (c->p < c->end && *c->p != ',' && *c->p != '\n' && *c->p != '\r') {
                if (*c->p == '"') {
                    eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: line %lld: stray quote inside an unquoted field",
                            c->path, (long long)c->line);
                    return -1;
                }
                if (!eng_csv_put(c, *c->p++)) goto oom;
                any = 1;
            }
            while (c->fb_len > start && (c->fb[c->fb_len - 1] == ' ' || c->fb[c->fb_len - 1] == '\t')) c->fb_len--;
        }
        if (!eng_csv_put(c, '\0')) goto oom;
        if (c->p < c->end && *c->p == ',') {
            c->p++;
            any = 1;
            if (!eng_csv_field_start(c)) goto oom;
            continue;
        }
        /* end of record */
        if (c->p < c->end && *c->p == '\r') c->p++;
        if (c->p < c->end && *c->p == '\n') c->p++;
        c->line++;
        *blank = !any;
        return 1;
    }
oom:
    eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: out of memory parsing line %lld", c->path, (long long)c->line);
    return -1;
}

static const char *eng_csv_f(const eng_csv *c, int i) { return c->fb + c->off[i]; }

eng_status eng_data_load_csv(eng_dataset *d, const char *path) {
    uint8_t *buf;
    size_t len;
    ENG_TRY(eng_data_read(path, ENG_DATA_MAX_FILE, &buf, &len));
    eng_csv c = {.p = (const char *)buf, .end = (const char *)buf + len, .path = path, .line = 1};
    if (len >= 3 && memcmp(buf, "\xef\xbb\xbf", 3) == 0) c.p += 3;
    eng_status st = ENG_STATUS_OK;
    char **names = NULL;
    float *x = NULL;
    double *y = NULL;
    int ncols = 0, lab = -1, blank, r;
    int64_t rows = 0, cap = 0, ln;
    while ((r = eng_csv_record(&c, &blank, &ln)) == 1 && blank) {}
    if (r < 0) {
        st = ENG_STATUS_INVALID_ARGUMENT;
        goto done;
    }
    if (r == 0) {
        st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: the dataset is empty (no header row)", path);
        goto done;
    }
    ncols = c.nf;
    if (ncols < 2) {
        st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: line %lld: the header has %d column; need features and a label",
                     path, (long long)ln, ncols);
        goto done;
    }
    names = calloc((size_t)ncols, sizeof *names);
    if (!names) goto oom;
    for (int i = 0; i < ncols; i++) {
        if (!(names[i] = strdup(eng_csv_f(&c, i)))) goto oom;
        if (strcmp(names[i], "label") == 0) lab = i;
    }
    if (lab < 0) lab = ncols - 1;
    int nx = ncols - 1;
    while ((r = eng_csv_record(&c, &blank, &ln)) == 1) {
        if (blank) continue;
        if (c.nf != ncols) {
            st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: line %lld (example %lld): %d fields, the header has %d",
                         path, (long long)ln, (long long)rows, c.nf, ncols);
            goto done;
        }
        if (rows == cap) {
            int64_t nc = cap ? cap * 2 : 1024;
            if ((double)nc * (nx * 4.0 + 8.0) > (double)(ENG_DATA_MAX_BYTES - eng_data_bytes(d)))
                nc = cap + 1024;
            if ((double)nc * (nx * 4.0 + 8.0) > (double)(ENG_DATA_MAX_BYTES - eng_data_bytes(d))) {
                st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: line %lld: the data exceeds the dataset limit of %lld "
                             "bytes (ENG_DATA_MAX_BYTES)", path, (long long)ln, (long long)ENG_DATA_MAX_BYTES);
                goto done;
            }
            float *nxp = realloc(x, (size_t)nc * (size_t)nx * sizeof *x);
            if (nxp) x = nxp;
            double *nyp = realloc(y, (size_t)nc * sizeof *y);
            if (nyp) y = nyp;
            if (!nxp || !nyp) goto oom;
            cap = nc;
        }
        for (int i = 0, k = 0; i < ncols; i++) {
            const char *f = eng_csv_f(&c, i);
            char *e;
            errno = 0;
            double v = strtod(f, &e);
            if (*f == '\0' || *e != '\0') {
                st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: line %lld (example %lld), column '%s': %s '%.40s'",
                             path, (long long)ln, (long long)rows, names[i], *f ? "not a number:" : "empty field", f);
                goto done;
            }
            if (!isfinite(v) || (i != lab && !isfinite((float)v))) {
                st = eng_err(ENG_STATUS_INVALID_ARGUMENT,
                             "%s: line %lld: column '%s', example %lld: non-finite value '%.40s'", path, (long long)ln,
                             names[i], (long long)rows, f);
                goto done;
            }
            if (i == lab)
                y[rows] = v;
            else
                x[rows * nx + k++] = (float)v;
        }
        rows++;
    }
    if (r < 0) {
        st = ENG_STATUS_INVALID_ARGUMENT;
        goto done;
    }
    if (rows == 0) {
        st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: the dataset is empty (a header and no data rows)", path);
        goto done;
    }
    int integral = 1;
    for (int64_t i = 0; i < rows && integral; i++) integral = y[i] == floor(y[i]) && fabs(y[i]) < 9.0e15;
    eng_tensor tx = {.dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {rows, nx}};
    eng_tensor ty = {.dtype = integral ? ENG_DTYPE_I64 : ENG_DTYPE_F32, .ndim = 1, .dims = {rows}};
    if ((st = eng_data_alloc(d, &tx, path, "x")) != ENG_STATUS_OK) goto done;
    memcpy(tx.data, x, (size_t)rows * (size_t)nx * sizeof *x);
    free(x);
    x = NULL;
    if ((st = eng_data_add(d, "x", &tx, path)) != ENG_STATUS_OK) goto done;
    if ((st = eng_data_alloc(d, &ty, path, "label")) != ENG_STATUS_OK) goto done;
    for (int64_t i = 0; i < rows; i++) {
        if (integral)
            ((int64_t *)ty.data)[i] = (int64_t)y[i];
        else
            ((float *)ty.data)[i] = (float)y[i];
    }
    st = eng_data_add(d, "label", &ty, path);
    goto done;
oom:
    st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
done:
    if (names)
        for (int i = 0; i < ncols; i++) free(names[i]);
    free(names);
    free(x);
    free(y);
    free(c.fb);
    free(c.off);
    free(buf);
    return st;
}
