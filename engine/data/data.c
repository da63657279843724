/* data.c - datasets: the column store every reader fills, file-format dispatch, gzip reading, the validation
 * split, fitting a column to a model input, and the shared deterministic PRNG (see data.h).
 *
 * Invariants: every column of a dataset is a tensor [n, ...] with the same n >= 1 and eng_alloc'd data the
 * dataset owns; column names are unique; the sum of column bytes never exceeds ENG_DATA_MAX_BYTES (checked
 * before each allocation, so an absurd header fails with a message rather than an allocation). A failed load
 * frees everything it built and leaves *out NULL.
 */
#include "data-impl.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "../ir/file-io.h"

/* ---- PRNG: xoshiro256** seeded by splitmix64 ---- */

static uint64_t eng_splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void eng_rng_seed(eng_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = eng_splitmix64(&x);
}

static inline uint64_t eng_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t eng_rng_u64(eng_rng *r) {
    uint64_t *s = r->s;
    uint64_t res = eng_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = eng_rotl(s[3], 45);
    return res;
}

uint64_t eng_rng_below(eng_rng *r, uint64_t n) {
    unsigned __int128 m = (unsigned __int128)eng_rng_u64(r) * n;
    uint64_t lo = (uint64_t)m;
    if (lo < n) {
        uint64_t t = -n % n;
        while (lo < t) {
            m = (unsigned __int128)eng_rng_u64(r) * n;
            lo = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

float eng_rng_uniform(eng_rng *r) { return (float)(eng_rng_u64(r) >> 40) * (1.0f / 16777216.0f); }

float eng_rng_normal(eng_rng *r) {
    /* u1 in (0, 1] so the log is finite; 53-bit doubles keep the tails honest. */
    double u1 = ((double)(eng_rng_u64(r) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = (double)(eng_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void eng_rng_permutation(eng_rng *r, int64_t *perm, int64_t n) {
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)eng_rng_below(r, (uint64_t)i + 1);
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

/* ---- files ---- */

int eng_data_is_gzip(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    unsigned char m[2] = {0, 0};
    size_t k = fread(m, 1, 2, f);
    fclose(f);
    return k == 2 && m[0] == 0x1f && m[1] == 0x8b;
}

/* Inflate gzip members (concatenated members are joined, as gzip -d does). */
static eng_status eng_data_gunzip(const char *path, const uint8_t *in, size_t inlen, size_t limit, uint8_t **buf,
                                  size_t *len) {
    /* The trailer's ISIZE (length mod 2^32 of the last member) is a good first guess for single-member files. */
    size_t cap = inlen >= 4 ? (size_t)(in[inlen - 4] | in[inlen - 3] << 8 | in[inlen - 2] << 16 |
                                       (uint32_t)in[inlen - 1] << 24)
                            : 0;
    if (cap < inlen * 2) cap = inlen * 2;
    if (cap > limit) cap = limit;
    if (cap < 64) cap = 64;
    uint8_t *out = malloc(cap + 1);
    if (!out) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes to inflate", path, cap);
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (inflateInit2(&zs, 15 + 16) != Z_OK) {
        free(out);
        return eng_err(ENG_STATUS_INTERNAL, "%s: inflateInit2 failed", path);
    }
    size_t n = 0, consumed = 0;
    eng_status st = ENG_STATUS_OK;
    for (;;) {
        if (n == cap) {
            if (cap >= limit) {
                st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: decompresses to more than the limit of %zu bytes", path,
                             limit);
                break;
            }
            size_t nc = cap > limit / 2 ? limit : cap * 2;
            uint8_t *nb = realloc(out, nc + 1);
            if (!nb) {
                st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes to inflate", path, nc);
                break;
            }
            out = nb;
            cap = nc;
        }
        size_t in_left = inlen - consumed, out_left = cap - n;
        zs.next_in = (Bytef *)(in + consumed);
        zs.avail_in = in_left > (1u << 30) ? (1u << 30) : (uInt)in_left;
        zs.next_out = out + n;
        zs.avail_out = out_left > (1u << 30) ? (1u << 30) : (uInt)out_left;
        uInt ai = zs.avail_in, ao = zs.avail_out;
        int zr = inflate(&zs, Z_NO_FLUSH);
        consumed += ai - zs.avail_in;
        n += ao - zs.avail_out;
        if (zr == Z_STREAM_END) {
            if (consumed == inlen) break;
            inflateReset(&zs); /* next member */
            continue;
        }
        if (zr == Z_BUF_ERROR && consumed == inlen) {
            st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: gzip data is truncated (after %zu input bytes)", path,
                         consumed);
            break;
        }
        if (zr != Z_OK && zr != Z_BUF_ERROR) {
            st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: corrupt gzip data near input byte %zu: %s", path, consumed,
                         zs.msg ? zs.msg : "inflate error");
            break;
        }
    }
    inflateEnd(&zs);
    if (st != ENG_STATUS_OK) {
        free(out);
        return st;
    }
    out[n] = 0;
    *buf = out;
    *len = n;
    return ENG_STATUS_OK;
}

eng_status eng_data_read(const char *path, size_t limit, uint8_t **buf, size_t *len) {
    *buf = NULL;
    *len = 0;
    uint8_t *raw;
    size_t rawlen;
    ENG_TRY(eng_file_read(path, limit, &raw, &rawlen));
    if (rawlen >= 2 && raw[0] == 0x1f && raw[1] == 0x8b) {
        eng_status st = eng_data_gunzip(path, raw, rawlen, limit, buf, len);
        free(raw);
        return st;
    }
    *buf = raw;
    *len = rawlen;
    return ENG_STATUS_OK;
}

/* ---- the column store ---- */

int64_t eng_data_bytes(const eng_dataset *d) {
    int64_t b = 0;
    for (int i = 0; i < d->ncols; i++) b += (int64_t)eng_tensor_nbytes(&d->cols[i].t);
    return b;
}

eng_status eng_data_alloc(const eng_dataset *d, eng_tensor *t, const char *file, const char *col) {
    char what[512], sb[160];
    snprintf(what, sizeof what, "%s: column '%s'", file, col);
    t->data = NULL;
    if (t->ndim < 1 || t->ndim > ENG_MAX_DIMS)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: rank %d is outside [1, %d]", what, t->ndim, ENG_MAX_DIMS);
    size_t nb;
    ENG_TRY(eng_tensor_nbytes_checked(t, what, &nb));
    int64_t have = d ? eng_data_bytes(d) : 0;
    if ((int64_t)nb > ENG_DATA_MAX_BYTES - have)
        return eng_err(ENG_STATUS_OUT_OF_MEMORY,
                       "%s: %s %s needs %zu bytes; with the %lld already loaded that exceeds the dataset limit of "
                       "%lld bytes (ENG_DATA_MAX_BYTES)",
                       what, eng_dtype_name(t->dtype), eng_shape_str(t->dims, t->ndim, sb, sizeof sb), nb,
                       (long long)have, (long long)ENG_DATA_MAX_BYTES);
    t->data = eng_alloc(nb ? nb : 1);
    if (!t->data) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes", what, nb);
    return ENG_STATUS_OK;
}

eng_status eng_data_add(eng_dataset *d, const char *name, eng_tensor *t, const char *file) {
    char s1[160];
    eng_status st = ENG_STATUS_OK;
    if (t->ndim < 1 || t->dims[0] < 1) {
        st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: column '%s' %s has no examples", file, name,
                     eng_shape_str(t->dims, t->ndim, s1, sizeof s1));
    } else if (eng_dataset_find(d, name) >= 0) {
        st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: column '%s' is already provided by %s", file, name, d->source);
    } else if (d->ncols > 0 && t->dims[0] != d->n) {
        st = eng_err(ENG_STATUS_INVALID_ARGUMENT,
                     "%s: column '%s' has %lld examples but column '%s' (%s) has %lld; all files must agree", file,
                     name, (long long)t->dims[0], d->cols[0].name, d->source, (long long)d->n);
    } else if ((int64_t)eng_tensor_nbytes(t) > ENG_DATA_MAX_BYTES - eng_data_bytes(d)) {
        st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: column '%s' would take the dataset over %lld bytes "
                     "(ENG_DATA_MAX_BYTES)", file, name, (long long)ENG_DATA_MAX_BYTES);
    }
    eng_data_column *nc = st == ENG_STATUS_OK ? realloc(d->cols, (size_t)(d->ncols + 1) * sizeof *nc) : NULL;
    char *nm = nc ? strdup(name) : NULL;
    if (st == ENG_STATUS_OK && (!nc || !nm)) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: out of memory", file);
    if (nc) d->cols = nc;
    if (st != ENG_STATUS_OK) {
        free(nm);
        eng_free(t->data);
        t->data = NULL;
        return st;
    }
    d->cols[d->ncols].name = nm;
    d->cols[d->ncols].t = *t;
    d->ncols++;
    d->n = t->dims[0];
    t->data = NULL;
    return ENG_STATUS_OK;
}

eng_status eng_data_check_finite(const char *file, const char *col, const eng_tensor *t) {
    if (!eng_dtype_is_float(t->dtype)) return ENG_STATUS_OK;
    int64_t n = eng_tensor_numel(t), per = t->dims[0] > 0 ? n / t->dims[0] : 1;
    if (per < 1) per = 1;
    int64_t bad = -1;
    if (t->dtype == ENG_DTYPE_F32) {
        const float *p = t->data;
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(p[i])) {
                bad = i;
                break;
            }
    } else {
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(eng_tensor_get_f64(t, i))) {
                bad = i;
                break;
            }
    }
    if (bad < 0) return ENG_STATUS_OK;
    return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: column '%s', example %lld: non-finite value %g (element %lld)",
                   file, col, (long long)(bad / per), eng_tensor_get_f64(t, bad), (long long)(bad % per));
}

const char *eng_data_col_name(const char *stem) {
    if (strcmp(stem, "y") == 0 || strcmp(stem, "labels") == 0) return "label";
    return stem;
}

void eng_data_gather(const eng_tensor *src, const int64_t *idx, int64_t k, void *dst) {
    size_t row = eng_tensor_nbytes(src) / (size_t)src->dims[0];
    const uint8_t *s = src->data;
    uint8_t *o = dst;
    switch (row) { /* the common small rows (labels) without a memcpy call */
    case 8:
        for (int64_t i = 0; i < k; i++) memcpy(o + (size_t)i * 8, s + (size_t)idx[i] * 8, 8);
        break;
    case 4:
        for (int64_t i = 0; i < k; i++) memcpy(o + (size_t)i * 4, s + (size_t)idx[i] * 4, 4);
        break;
    default:
        for (int64_t i = 0; i < k; i++) memcpy(o + (size_t)i * row, s + (size_t)idx[i] * row, row);
    }
}

/* ---- load ---- */

static int eng_ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcasecmp(s + a - b, suf) == 0;
}

typedef eng_status (*eng_data_reader)(eng_dataset *, const char *);

static eng_data_reader eng_data_pick(const char *path) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char name[256];
    snprintf(name, sizeof name, "%s", base);
    if (eng_ends_with(name, ".gz")) name[strlen(name) - 3] = '\0';
    if (eng_ends_with(name, ".npy")) return eng_data_load_npy;
    if (eng_ends_with(name, ".npz")) return eng_data_load_npz;
    if (eng_ends_with(name, ".csv")) return eng_data_load_csv;
    if (eng_ends_with(name, ".jsonl") || eng_ends_with(name, ".ndjson")) return eng_data_load_jsonl;
    if (eng_ends_with(name, ".tfrecord") || eng_ends_with(name, ".tfrecords")) return eng_data_load_tfrecord;
    if (eng_ends_with(name, ".idx") || strstr(name, "-ubyte") || strstr(name, ".ubyte"))
        return eng_data_load_idx;
    for (const char *q = strstr(name, "idx"); q; q = strstr(q + 1, "idx"))
        if (q[3] >= '1' && q[3] <= '8') return eng_data_load_idx; /* "idx3" as in train-images-idx3 */
    /* No telling name: sniff the (possibly gzipped) content. */
    gzFile g = gzopen(path, "rb");
    if (!g) return NULL;
    unsigned char m[8] = {0};
    int k = gzread(g, m, sizeof m);
    gzclose(g);
    if (k >= 6 && memcmp(m, "\x93NUMPY", 6) == 0) return eng_data_load_npy;
    if (k >= 4 && memcmp(m, "PK\x03\x04", 4) == 0) return eng_data_load_npz;
    if (k >= 4 && m[0] == 0 && m[1] == 0 && m[2] >= 0x08 && m[2] <= 0x0e && m[3] >= 1 && m[3] <= ENG_MAX_DIMS)
        return eng_data_load_idx;
    return NULL;
}

eng_status eng_dataset_load(const char *const *files, int nfiles, eng_dataset **out) {
    if (!out) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "eng_dataset_load: NULL output");
    *out = NULL;
    if (!files || nfiles < 1) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "eng_dataset_load: no files given");
    eng_dataset *d = calloc(1, sizeof *d);
    size_t srclen = 1;
    for (int i = 0; i < nfiles; i++) srclen += (files[i] ? strlen(files[i]) : 6) + 3;
    if (!d || !(d->source = malloc(srclen))) {
        free(d);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "eng_dataset_load: out of memory");
    }
    d->source[0] = '\0';
    eng_status st = ENG_STATUS_OK;
    for (int i = 0; i < nfiles && st == ENG_STATUS_OK; i++) {
        const char *f = files[i];
        if (!f) {
            st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "eng_dataset_load: file %d is NULL", i);
            break;
        }
        struct stat sb;
        if (stat(f, &sb) != 0) {
            st = eng_err(errno == ENOENT ? ENG_STATUS_NOT_FOUND : ENG_STATUS_IO, "%s: cannot open: %s", f,
                         strerror(errno));
            break;
        }
        eng_data_reader rd = eng_data_pick(f);
        if (!rd) {
            st = eng_err(ENG_STATUS_UNSUPPORTED,
                         "%s: unknown dataset format (expected .npy, .npz, .csv, .jsonl, .tfrecord or an IDX file, "
                         "optionally .gz)", f);
            break;
        }
        int before = d->ncols;
        st = rd(d, f);
        if (st == ENG_STATUS_OK && d->ncols == before)
            st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: holds no data columns", f);
        if (i) strcat(d->source, " + ");
        strcat(d->source, f);
    }
    if (st == ENG_STATUS_OK && (d->ncols == 0 || d->n < 1))
        st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: the dataset is empty", d->source);
    if (st != ENG_STATUS_OK) {
        eng_dataset_free(&d);
        return st;
    }
    *out = d;
    return ENG_STATUS_OK;
}

void eng_dataset_free(eng_dataset **dp) {
    if (!dp || !*dp) return;
    eng_dataset *d = *dp;
    for (int i = 0; i < d->ncols; i++) {
        free(d->cols[i].name);
        eng_free(d->cols[i].t.data);
    }
    free(d->cols);
    free(d->source);
    free(d);
    *dp = NULL;
}

int eng_dataset_find(const eng_dataset *d, const char *name) {
    if (!d || !name) return -1;
    for (int i = 0; i < d->ncols; i++)
        if (strcmp(d->cols[i].name, name) == 0) return i;
    return -1;
}

/* ---- split ---- */

static eng_status eng_dataset_take(const eng_dataset *d, const int64_t *idx, int64_t k, const char *tag,
                                   eng_dataset **out) {
    eng_dataset *r = calloc(1, sizeof *r);
    size_t sl = strlen(d->source) + strlen(tag) + 4;
    if (!r || !(r->source = malloc(sl))) {
        free(r);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: out of memory splitting", d->source);
    }
    snprintf(r->source, sl, "%s [%s]", d->source, tag);
    for (int c = 0; c < d->ncols; c++) {
        eng_tensor t = d->cols[c].t;
        t.dims[0] = k;
        eng_status st = eng_data_alloc(NULL, &t, r->source, d->cols[c].name);
        if (st == ENG_STATUS_OK) {
            eng_data_gather(&d->cols[c].t, idx, k, t.data);
            st = eng_data_add(r, d->cols[c].name, &t, r->source);
        }
        if (st != ENG_STATUS_OK) {
            eng_dataset_free(&r);
            return st;
        }
    }
    *out = r;
    return ENG_STATUS_OK;
}

eng_status eng_dataset_split(const eng_dataset *d, double val_fraction, uint64_t seed, eng_dataset **train,
                             eng_dataset **val) {
    if (!d || !train || !val) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "eng_dataset_split: NULL argument");
    *train = *val = NULL;
    if (!(val_fraction > 0.0 && val_fraction < 1.0))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: validation fraction %g is not in (0, 1)", d->source,
                       val_fraction);
    int64_t nval = (int64_t)llround((double)d->n * val_fraction);
    if (nval < 1 || nval >= d->n)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT,
                       "%s: validation fraction %g of %lld examples leaves %s empty", d->source, val_fraction,
                       (long long)d->n, nval < 1 ? "the validation set" : "the training set");
    int64_t *perm = malloc((size_t)d->n * sizeof *perm);
    if (!perm) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: out of memory splitting", d->source);
    eng_rng r;
    eng_rng_seed(&r, seed);
    eng_rng_permutation(&r, perm, d->n);
    eng_status st = eng_dataset_take(d, perm, d->n - nval, "train", train);
    if (st == ENG_STATUS_OK) st = eng_dataset_take(d, perm + (d->n - nval), nval, "val", val);
    free(perm);
    if (st != ENG_STATUS_OK) eng_dataset_free(train);
    return st;
}

/* ---- fit ---- */

eng_status eng_dataset_fit(eng_dataset *d, const char *col, const char *input_name, eng_dtype dt, int ndim,
                           const int64_t *dims, char *desc, size_t desc_len) {
    if (desc && desc_len) desc[0] = '\0';
    if (!d || !col || !input_name) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "eng_dataset_fit: NULL argument");
    int ci = eng_dataset_find(d, col);
    if (ci < 0) return eng_err(ENG_STATUS_NOT_FOUND, "%s: no column '%s' for model input '%s'", d->source, col,
                               input_name);
    eng_tensor *t = &d->cols[ci].t;
    char cs[160], ms[160];
    eng_shape_str(t->dims, t->ndim, cs, sizeof cs);
    if (ndim < 1 || ndim > ENG_MAX_DIMS || !dims)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "model input '%s' has rank %d; a batched input needs rank >= 1",
                       input_name, ndim);
    eng_shape_str(dims, ndim, ms, sizeof ms);
    if (!eng_dtype_size(dt))
        return eng_err(ENG_STATUS_UNSUPPORTED, "column '%s' %s: cannot feed model input '%s' of dtype %s", col, cs,
                       input_name, eng_dtype_name(dt));
    int64_t per = 1;
    for (int i = 1; i < t->ndim; i++) per *= t->dims[i];
    /* Target per-example shape: keep the column's when it already fits; else fill one free dim. */
    int64_t nd[ENG_MAX_DIMS];
    nd[0] = t->dims[0];
    int fits = t->ndim == ndim;
    for (int i = 1; i < ndim && fits; i++) fits = dims[i] < 0 || dims[i] == t->dims[i];
    if (fits) {
        memcpy(nd, t->dims, sizeof(int64_t) * (size_t)ndim);
    } else {
        int nfree = 0, fi = -1;
        int64_t fixed = 1;
        for (int i = 1; i < ndim; i++) {
            if (dims[i] < 0) {
                nfree++;
                fi = i;
                nd[i] = -1;
            } else {
                fixed *= dims[i];
                nd[i] = dims[i];
            }
        }
        if (nfree > 1)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT,
                           "column '%s' %s cannot be reshaped for model input '%s' %s: more than one free dim besides "
                           "the batch", col, cs, input_name, ms);
        if (nfree == 1) {
            if (fixed == 0 || per % fixed != 0)
                return eng_err(ENG_STATUS_INVALID_ARGUMENT,
                               "column '%s' %s (%lld elements per example) does not fit model input '%s' %s", col, cs,
                               (long long)per, input_name, ms);
            nd[fi] = per / fixed;
        } else if (fixed != per) {
            return eng_err(ENG_STATUS_INVALID_ARGUMENT,
                           "column '%s' %s has %lld elements per example but model input '%s' %s takes %lld", col,
                           cs, (long long)per, input_name, ms, (long long)fixed);
        }
    }
    eng_tensor nt = *t;
    nt.dtype = dt;
    nt.ndim = ndim;
    memcpy(nt.dims, nd, sizeof(int64_t) * (size_t)ndim);
    char ns[160];
    eng_shape_str(nt.dims, nt.ndim, ns, sizeof ns);
    eng_dtype old = t->dtype;
    if (dt != t->dtype) {
        /* The old column is freed after the copy, so account for both while converting. */
        nt.data = NULL;
        ENG_TRY(eng_data_alloc(d, &nt, d->source, col));
        eng_status st = eng_convert(t->data, t->dtype, nt.data, dt, eng_tensor_numel(t));
        if (st != ENG_STATUS_OK) {
            eng_free(nt.data);
            return eng_err_prefix(st, "column '%s' for model input '%s': ", col, input_name);
        }
        eng_free(t->data);
    }
    *t = nt;
    if (desc && desc_len) {
        if (old == dt && strcmp(cs, ns) == 0)
            snprintf(desc, desc_len, "%s: %s %s fed as-is to input '%s'", col, eng_dtype_name(dt), cs, input_name);
        else
            snprintf(desc, desc_len, "%s: %s %s -> %s %s for input '%s'", col, eng_dtype_name(old), cs,
                     eng_dtype_name(dt), ns, input_name);
    }
    return ENG_STATUS_OK;
}
