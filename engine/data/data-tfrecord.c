/* data-tfrecord.c - TFRecord files of tf.train.Example, raw or gzipped (TFRecordOptions "GZIP").
 *
 * Framing per record: uint64 length (LE), uint32 masked CRC-32C of those 8 bytes, the data, uint32 masked CRC-32C
 * of the data; mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8, as TensorFlow writes it. Both CRCs are checked.
 * Example{1: Features{1: map<string, Feature>}}; Feature{1: BytesList{1: repeated bytes}, 2: FloatList{1: repeated
 * float}, 3: Int64List{1: repeated int64}}; lists packed or not; unknown fields skipped as protobuf does.
 * Columns: one per feature, the schema set by record 0 and required of every record (same names, kinds and
 * counts). A feature with one value is a scalar per example ([N]); k values give [N, k]; float -> float32,
 * int64 -> int64; bytes -> uint8 [N, len] (k = 1) or [N, k, len] when every value has the same length, else
 * UNSUPPORTED. Pass 1 checks framing and CRCs and counts records; pass 2 decodes into exactly sized columns.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data-impl.h"

/* ---- CRC-32C (Castagnoli, reflected 0x82f63b78), slicing by 8 ---- */

static uint32_t eng_crc32c_tab[8][256];

static void eng_crc32c_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        eng_crc32c_tab[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            eng_crc32c_tab[t][i] = (eng_crc32c_tab[t - 1][i] >> 8) ^ eng_crc32c_tab[0][eng_crc32c_tab[t - 1][i] & 0xff];
}

static uint32_t eng_crc32c(const uint8_t *p, size_t n) {
    uint32_t c = 0xffffffffu;
    while (n >= 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        c = eng_crc32c_tab[7][lo & 0xff] ^ eng_crc32c_tab[6][(lo >> 8) & 0xff] ^ eng_crc32c_tab[5][(lo >> 16) & 0xff] ^
            eng_crc32c_tab[4][lo >> 24] ^ eng_crc32c_tab[3][p[4]] ^ eng_crc32c_tab[2][p[5]] ^
            eng_crc32c_tab[1][p[6]] ^ eng_crc32c_tab[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--) c = (c >> 8) ^ eng_crc32c_tab[0][(c ^ *p++) & 0xff];
    return c ^ 0xffffffffu;
}

static uint32_t eng_crc_mask(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }

static uint32_t eng_rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ---- protobuf wire format ---- */

typedef struct eng_pb {
    const uint8_t *p, *end;
} eng_pb;

static int eng_pb_varint(eng_pb *b, uint64_t *v) {
    uint64_t r = 0;
    for (int s = 0; s < 70; s += 7) {
        if (b->p >= b->end) return 0;
        uint8_t c = *b->p++;
        r |= (uint64_t)(c & 0x7f) << s;
        if (!(c & 0x80)) {
            *v = r;
            return 1;
        }
    }
    return 0;
}

/* Next field: number, wire type, and for wire type 2 the sub-buffer; other types are skipped into *skip. */
static int eng_pb_field(eng_pb *b, uint32_t *num, int *wt, eng_pb *sub, uint64_t *val) {
    uint64_t key;
    if (!eng_pb_varint(b, &key)) return 0;
    *num = (uint32_t)(key >> 3);
    *wt = (int)(key & 7);
    switch (*wt) {
    case 0: return eng_pb_varint(b, val);
    case 1:
        if (b->end - b->p < 8) return 0;
        memcpy(val, b->p, 8);
        b->p += 8;
        return 1;
    case 5:
        if (b->end - b->p < 4) return 0;
        *val = eng_rd32(b->p);
        b->p += 4;
        return 1;
    case 2: {
        uint64_t n;
        if (!eng_pb_varint(b, &n) || n > (uint64_t)(b->end - b->p)) return 0;
        sub->p = b->p;
        sub->end = b->p + n;
        b->p += n;
        return 1;
    }
    default: return 0;
    }
}

enum { ENG_TF_BYTES = 1, ENG_TF_FLOAT = 2, ENG_TF_INT64 = 3 };

typedef struct eng_tfval {
    int kind;
    int64_t count;
    int64_t blen; /* bytes: length of each value (-1 if they differ) */
    eng_pb list;  /* the *List message */
} eng_tfval;

/* Count (and for bytes, measure) the values of a *List message. */
static int eng_tf_scan_list(eng_tfval *v) {
    eng_pb b = v->list, sub;
    uint32_t num;
    int wt;
    uint64_t val;
    v->count = 0;
    v->blen = -2;
    while (b.p < b.end) {
        if (!eng_pb_field(&b, &num, &wt, &sub, &val)) return 0;
        if (num != 1) continue;
        if (v->kind == ENG_TF_BYTES) {
            if (wt != 2) return 0;
            int64_t l = sub.end - sub.p;
            v->blen = v->blen == -2 ? l : v->blen == l ? l : -1;
            v->count++;
        } else if (v->kind == ENG_TF_FLOAT) {
            if (wt == 5) v->count++;
            else if (wt == 2 && (sub.end - sub.p) % 4 == 0) v->count += (sub.end - sub.p) / 4;
            else return 0;
        } else {
            if (wt == 0) {
                v->count++;
            } else if (wt == 2) {
                while (sub.p < sub.end) {
                    if (!eng_pb_varint(&sub, &val)) return 0;
                    v->count++;
                }
            } else {
                return 0;
            }
        }
    }
    return 1;
}

/* Write the values into out (float32, int64 or bytes). */
static void eng_tf_read_list(const eng_tfval *v, void *out) {
    eng_pb b = v->list, sub;
    uint32_t num;
    int wt;
    uint64_t val;
    int64_t k = 0;
    while (b.p < b.end && eng_pb_field(&b, &num, &wt, &sub, &val)) {
        if (num != 1) continue;
        if (v->kind == ENG_TF_BYTES) {
            memcpy((uint8_t *)out + k * v->blen, sub.p, (size_t)v->blen);
            k++;
        } else if (v->kind == ENG_TF_FLOAT) {
            if (wt == 5) {
                uint32_t u = (uint32_t)val;
                memcpy((float *)out + k++, &u, 4);
            } else {
                memcpy((float *)out + k, sub.p, (size_t)(sub.end - sub.p));
                k += (sub.end - sub.p) / 4;
            }
        } else {
            if (wt == 0) {
                ((int64_t *)out)[k++] = (int64_t)val;
            } else {
                while (sub.p < sub.end && eng_pb_varint(&sub, &val)) ((int64_t *)out)[k++] = (int64_t)val;
            }
        }
    }
}

typedef struct eng_tfcol {
    char *name;
    eng_tfval v;
    eng_tensor t;
} eng_tfcol;

/* Visit each (name, value) of an Example; cb returns a status. */
typedef eng_status (*eng_tf_visit)(void *ctx, const char *name, size_t nlen, eng_tfval *v);

static eng_status eng_tf_example(const char *path, int64_t rec, size_t off, const uint8_t *p, size_t n,
                                 eng_tf_visit cb, void *ctx) {
    eng_pb ex = {p, p + n}, feats, entry, sub;
    uint32_t num;
    int wt;
    uint64_t val;
#define ENG_TF_BAD(why)                                                                                              \
    return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: record %lld (offset %zu): malformed tf.train.Example: %s", path, \
                   (long long)rec, off, why)
    while (ex.p < ex.end) {
        if (!eng_pb_field(&ex, &num, &wt, &feats, &val)) ENG_TF_BAD("bad protobuf framing");
        if (num != 1 || wt != 2) continue;
        while (feats.p < feats.end) {
            if (!eng_pb_field(&feats, &num, &wt, &entry, &val)) ENG_TF_BAD("bad Features framing");
            if (num != 1 || wt != 2) continue;
            const uint8_t *key = NULL;
            size_t klen = 0;
            eng_tfval fv = {0};
            int have_val = 0;
            while (entry.p < entry.end) {
                if (!eng_pb_field(&entry, &num, &wt, &sub, &val)) ENG_TF_BAD("bad feature map entry");
                if (num == 1 && wt == 2) {
                    key = sub.p;
                    klen = (size_t)(sub.end - sub.p);
                } else if (num == 2 && wt == 2) {
                    eng_pb feat = sub, lst;
                    fv.kind = 0;
                    while (feat.p < feat.end) {
                        if (!eng_pb_field(&feat, &num, &wt, &lst, &val)) ENG_TF_BAD("bad Feature framing");
                        if (num >= 1 && num <= 3 && wt == 2) {
                            fv.kind = (int)num;
                            fv.list = lst;
                        }
                    }
                    have_val = 1;
                }
            }
            if (!key || klen == 0 || klen > 200) ENG_TF_BAD("feature without a usable name");
            char name[256];
            memcpy(name, key, klen);
            name[klen] = '\0';
            if (!have_val || !fv.kind)
                return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: record %lld (offset %zu): feature '%s' has no "
                               "value list", path, (long long)rec, off, name);
            if (!eng_tf_scan_list(&fv))
                return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: record %lld (offset %zu): feature '%s': malformed "
                               "value list", path, (long long)rec, off, name);
            ENG_TRY(cb(ctx, name, klen, &fv));
        }
    }
#undef ENG_TF_BAD
    return ENG_STATUS_OK;
}

typedef struct eng_tfctx {
    const char *path;
    int64_t rec, nrec;
    size_t off;
    eng_tfcol *cols;
    int ncols, seen;
} eng_tfctx;

static const char *eng_tf_kind(int k) { return k == ENG_TF_BYTES ? "bytes" : k == ENG_TF_FLOAT ? "float" : "int64"; }

static eng_status eng_tf_schema_cb(void *vctx, const char *name, size_t nlen, eng_tfval *v) {
    eng_tfctx *c = vctx;
    for (int i = 0; i < c->ncols; i++)
        if (strcmp(c->cols[i].name, name) == 0)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: record 0: feature '%s' appears twice", c->path, name);
    if (v->count == 0)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: record 0: feature '%s' has no values", c->path, name);
    if (v->kind == ENG_TF_BYTES && v->blen < 0)
        return eng_err(ENG_STATUS_UNSUPPORTED, "%s: record 0: bytes feature '%s' holds values of different lengths; "
                       "only fixed-length bytes are supported", c->path, name);
    eng_tfcol *n = realloc(c->cols, (size_t)(c->ncols + 1) * sizeof *n);
    if (!n) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: out of memory", c->path);
    c->cols = n;
    eng_tfcol *col = &n[c->ncols];
    memset(col, 0, sizeof *col);
    if (!(col->name = strdup(name))) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: out of memory", c->path);
    c->ncols++;
    col->v = *v;
    eng_tensor *t = &col->t;
    t->dims[0] = c->nrec;
    t->ndim = 1;
    if (v->count > 1) t->dims[t->ndim++] = v->count;
    if (v->kind == ENG_TF_BYTES) t->dims[t->ndim++] = v->blen;
    t->dtype = v->kind == ENG_TF_BYTES ? ENG_DTYPE_U8 : v->kind == ENG_TF_FLOAT ? ENG_DTYPE_F32 : ENG_DTYPE_I64;
    return ENG_STATUS_OK;
}

static eng_status eng_tf_fill_cb(void *vctx, const char *name, size_t nlen, eng_tfval *v) {
    eng_tfctx *c = vctx;
    eng_tfcol *col = NULL;
    for (int i = 0; i < c->ncols && !col; i++)
        if (strcmp(c->cols[i].name, name) == 0) col = &c->cols[i];
    if (!col)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: record %lld (offset %zu): feature '%s' is not in record 0",
                       c->path, (long long)c->rec, c->off, name);
    if (col->v.kind != v->kind || col->v.count != v->count || (v->kind == ENG_TF_BYTES && v->blen != col->v.blen))
        return eng_err(v->kind == ENG_TF_BYTES && v->blen != col->v.blen ? ENG_STATUS_UNSUPPORTED
                                                                         : ENG_STATUS_INVALID_ARGUMENT,
                       "%s: record %lld (offset %zu): feature '%s' is %lld %s value(s)%s; record 0 has %lld %s "
                       "value(s)", c->path, (long long)c->rec, c->off, name, (long long)v->count,
                       eng_tf_kind(v->kind), v->kind == ENG_TF_BYTES ? " (bytes of another length)" : "",
                       (long long)col->v.count, eng_tf_kind(col->v.kind));
    size_t row = eng_tensor_nbytes(&col->t) / (size_t)c->nrec;
    uint8_t *dst = (uint8_t *)col->t.data + row * (size_t)c->rec;
    eng_tf_read_list(v, dst);
    if (v->kind == ENG_TF_FLOAT)
        for (int64_t i = 0; i < v->count; i++)
            if (!isfinite(((float *)dst)[i]))
                return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: column '%s', example %lld (record offset %zu): "
                               "non-finite value %g", c->path, name, (long long)c->rec, c->off, ((float *)dst)[i]);
    c->seen++;
    return ENG_STATUS_OK;
}

/* Pass 1: framing and CRCs. Returns the record count in *nrec. */
static eng_status eng_tf_frames(const char *path, const uint8_t *buf, size_t len, int64_t *nrec) {
    size_t off = 0;
    int64_t k = 0;
    while (off < len) {
        if (len - off < 12)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: record %lld (offset %zu): truncated length header "
                           "(%zu bytes left)", path, (long long)k, off, len - off);
        uint64_t n;
        memcpy(&n, buf + off, 8); /* little-endian hosts only, as the rest of tensord */
        if (eng_rd32(buf + off + 8) != eng_crc_mask(eng_crc32c(buf + off, 8)))
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: record %lld (offset %zu): length CRC mismatch (corrupt "
                           "or not a TFRecord file)", path, (long long)k, off);
        if (n > len - off - 12 || len - off - 12 - n < 4)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: record %lld (offset %zu): truncated: %llu data bytes "
                           "declared, %zu left", path, (long long)k, off, (unsigned long long)n, len - off - 12);
        const uint8_t *data = buf + off + 12;
        if (eng_rd32(data + n) != eng_crc_mask(eng_crc32c(data, (size_t)n)))
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: record %lld (offset %zu): data CRC mismatch", path,
                           (long long)k, off);
        off += 12 + (size_t)n + 4;
        k++;
    }
    *nrec = k;
    return ENG_STATUS_OK;
}

eng_status eng_data_load_tfrecord(eng_dataset *d, const char *path) {
    static pthread_once_t crc_once = PTHREAD_ONCE_INIT;
    pthread_once(&crc_once, eng_crc32c_init);
    uint8_t *buf;
    size_t len;
    ENG_TRY(eng_data_read(path, ENG_DATA_MAX_FILE, &buf, &len));
    eng_tfctx c = {.path = path};
    eng_status st = eng_tf_frames(path, buf, len, &c.nrec);
    if (st == ENG_STATUS_OK && c.nrec == 0) st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: the dataset is empty", path);
    size_t off = 0;
    for (int64_t r = 0; r < c.nrec && st == ENG_STATUS_OK; r++) {
        uint64_t n;
        memcpy(&n, buf + off, 8);
        const uint8_t *data = buf + off + 12;
        c.rec = r;
        c.off = off;
        if (r == 0) {
            st = eng_tf_example(path, r, off, data, (size_t)n, eng_tf_schema_cb, &c);
            if (st == ENG_STATUS_OK && c.ncols == 0)
                st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: record 0 has no features", path);
            for (int i = 0; i < c.ncols && st == ENG_STATUS_OK; i++) {
                /* Account for the columns allocated so far: add them to the cap check via a scratch dataset. */
                int64_t pending = 0;
                for (int k = 0; k < i; k++) pending += (int64_t)eng_tensor_nbytes(&c.cols[k].t);
                if ((int64_t)eng_tensor_nbytes(&c.cols[i].t) > ENG_DATA_MAX_BYTES - eng_data_bytes(d) - pending) {
                    char sb[160];
                    st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: column '%s' %s with the rest exceeds the dataset "
                                 "limit of %lld bytes (ENG_DATA_MAX_BYTES)", path, c.cols[i].name,
                                 eng_shape_str(c.cols[i].t.dims, c.cols[i].t.ndim, sb, sizeof sb),
                                 (long long)ENG_DATA_MAX_BYTES);
                    break;
                }
                st = eng_data_alloc(d, &c.cols[i].t, path, c.cols[i].name);
            }
        }
        if (st != ENG_STATUS_OK) break;
        c.seen = 0;
        st = eng_tf_example(path, r, off, data, (size_t)n, eng_tf_fill_cb, &c);
        if (st == ENG_STATUS_OK && c.seen != c.ncols)
            st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: record %lld (offset %zu): %d features; record 0 has %d",
                         path, (long long)r, off, c.seen, c.ncols);
        off += 12 + (size_t)n + 4;
    }
    for (int i = 0; i < c.ncols; i++) {
        if (st == ENG_STATUS_OK)
            st = eng_data_add(d, c.cols[i].name, &c.cols[i].t, path);
        else
            eng_free(c.cols[i].t.data);
        free(c.cols[i].name);
    }
    free(c.cols);
    free(buf);
    return st;
}
