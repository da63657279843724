/* data-npz.c - numpy .npy and .npz datasets.
 *
 * .npy: one array; the column is named after the file stem ("y" and "labels" become "label"). A gzipped .npy
 * is accepted too. .npz: a zip archive of .npy members (np.savez: stored; np.savez_compressed: deflated), one
 * column per member. The central directory is authoritative (numpy writes local headers with zip64 size
 * placeholders and sometimes data descriptors), each member's local header is checked, its data is inflated
 * into a buffer of exactly the declared size and its CRC-32 verified before the .npy parser sees it. Zip64
 * archives (over 65535 members or 4 GiB), encrypted members and methods other than stored/deflate are refused.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "data-impl.h"
#include "../ir/graph.h"
#include "../ir/npy.h"

static eng_status eng_npy_add(eng_dataset *d, eng_tensor *t, const char *what, const char *file, const char *stem) {
    const char *col = eng_data_col_name(stem);
    eng_status st = ENG_STATUS_OK;
    char sb[160];
    if (t->ndim < 1)
        st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: a scalar array cannot be a dataset column (need [N, ...])",
                     what);
    else if (t->dims[0] < 1)
        st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: the dataset is empty (shape %s)", what,
                     eng_shape_str(t->dims, t->ndim, sb, sizeof sb));
    else
        st = eng_data_check_finite(what, col, t);
    if (st != ENG_STATUS_OK) {
        eng_tensor_destroy(&t);
        return st;
    }
    eng_tensor c = *t;
    free(t); /* the struct only: the column takes the data */
    return eng_data_add(d, col, &c, file);
}

static void eng_stem(const char *name, const char *ext, char *out, size_t n) {
    const char *b = strrchr(name, '/');
    b = b ? b + 1 : name;
    snprintf(out, n, "%s", b);
    size_t l = strlen(out);
    if (l > 3 && strcmp(out + l - 3, ".gz") == 0) out[l -= 3] = '\0';
    size_t e = strlen(ext);
    if (l > e && strcmp(out + l - e, ext) == 0) out[l - e] = '\0';
}

eng_status eng_data_load_npy(eng_dataset *d, const char *path) {
    uint8_t *buf;
    size_t len;
    ENG_TRY(eng_data_read(path, ENG_DATA_MAX_FILE, &buf, &len));
    eng_tensor *t = NULL;
    eng_status st = eng_npy_load_buffer(buf, len, path, &t);
    free(buf);
    if (st != ENG_STATUS_OK) return st;
    char stem[256];
    eng_stem(path, ".npy", stem, sizeof stem);
    return eng_npy_add(d, t, path, path, stem);
}

static uint32_t eng_le16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static uint32_t eng_le32(const uint8_t *p) { return eng_le16(p) | eng_le16(p + 2) << 16; }
static uint64_t eng_le64(const uint8_t *p) { return eng_le32(p) | (uint64_t)eng_le32(p + 4) << 32; }

/* Sizes and offset from a zip64 extra field (id 1) for the fields that hold 0xffffffff. */
static int eng_zip64_extra(const uint8_t *x, size_t xlen, uint64_t *usize, uint64_t *csize, uint64_t *lho) {
    while (xlen >= 4) {
        uint32_t id = eng_le16(x), sz = eng_le16(x + 2);
        if (sz > xlen - 4) return 0;
        if (id == 1) {
            const uint8_t *p = x + 4, *e = x + 4 + sz;
            uint64_t *f[3] = {usize, csize, lho};
            for (int i = 0; i < 3; i++) {
                if (*f[i] != 0xffffffffu) continue;
                if (e - p < 8) return 0;
                *f[i] = eng_le64(p);
                p += 8;
            }
            return 1;
        }
        x += 4 + sz;
        xlen -= 4 + sz;
    }
    return 0;
}

static eng_status eng_npz_member(eng_dataset *d, const char *path, const uint8_t *buf, size_t len,
                                 const uint8_t *ce, int idx) {
    uint32_t flags = eng_le16(ce + 8), method = eng_le16(ce + 10), crc = eng_le32(ce + 16);
    uint64_t csize = eng_le32(ce + 20), usize = eng_le32(ce + 24), lho = eng_le32(ce + 42);
    uint32_t nlen = eng_le16(ce + 28), xlen = eng_le16(ce + 30);
    char name[256], what[600];
    if (nlen >= sizeof name)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: member %d has a name of %u bytes", path, idx, nlen);
    memcpy(name, ce + 46, nlen);
    name[nlen] = '\0';
    snprintf(what, sizeof what, "%s: member '%s'", path, name);
    if (nlen == 0 || name[nlen - 1] == '/') return ENG_STATUS_OK; /* a directory entry */
    if ((csize == 0xffffffffu || usize == 0xffffffffu || lho == 0xffffffffu) &&
        !eng_zip64_extra(ce + 46 + nlen, xlen, &usize, &csize, &lho))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: bad zip64 extra field", what);
    if (flags & 1) return eng_err(ENG_STATUS_UNSUPPORTED, "%s: encrypted members are not supported", what);
    if (method != 0 && method != 8)
        return eng_err(ENG_STATUS_UNSUPPORTED, "%s: compression method %u is not supported (stored or deflate)",
                       what, method);
    if (nlen < 5 || strcmp(name + nlen - 4, ".npy") != 0)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: not an .npy array", what);
    if (lho > len || len - lho < 30 || eng_le32(buf + lho) != 0x04034b50)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: bad local header at offset %llu", what,
                       (unsigned long long)lho);
    uint64_t data = lho + 30 + eng_le16(buf + lho + 26) + eng_le16(buf + lho + 28);
    if (data > len || csize > len - data)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: data (%llu bytes at offset %llu) runs past the end of the "
                       "file (truncated?)", what, (unsigned long long)csize, (unsigned long long)data);
    if (method == 0 && csize != usize)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: stored member with sizes %llu != %llu", what,
                       (unsigned long long)csize, (unsigned long long)usize);
    if (method == 8 && usize / 1032 > csize + 1) /* deflate expands at most ~1032:1 */
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: declares %llu bytes from %llu compressed, more than deflate "
                       "can produce", what, (unsigned long long)usize, (unsigned long long)csize);
    int64_t room = ENG_DATA_MAX_BYTES - eng_data_bytes(d);
    if (usize > (uint64_t)room)
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: %llu bytes uncompressed exceeds the dataset limit of %lld "
                       "bytes (ENG_DATA_MAX_BYTES)", what, (unsigned long long)usize, (long long)ENG_DATA_MAX_BYTES);
    const uint8_t *raw = buf + data;
    uint8_t *owned = NULL;
    if (method == 8) {
        owned = malloc(usize ? usize : 1);
        if (!owned) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: cannot allocate %llu bytes", what,
                                   (unsigned long long)usize);
        z_stream zs;
        memset(&zs, 0, sizeof zs);
        if (inflateInit2(&zs, -15) != Z_OK) {
            free(owned);
            return eng_err(ENG_STATUS_INTERNAL, "%s: inflateInit2 failed", what);
        }
        uint64_t in_done = 0, out_done = 0;
        int zr = Z_OK;
        while (zr == Z_OK) {
            zs.next_in = (Bytef *)(raw + in_done);
            zs.avail_in = (uInt)(csize - in_done > (1u << 30) ? (1u << 30) : csize - in_done);
            zs.next_out = owned + out_done;
            zs.avail_out = (uInt)(usize - out_done > (1u << 30) ? (1u << 30) : usize - out_done);
            uInt ai = zs.avail_in, ao = zs.avail_out;
            zr = inflate(&zs, Z_NO_FLUSH);
            in_done += ai - zs.avail_in;
            out_done += ao - zs.avail_out;
            if (zr == Z_OK && ai == zs.avail_in && ao == zs.avail_out) zr = Z_BUF_ERROR; /* no progress */
        }
        inflateEnd(&zs);
        if (zr != Z_STREAM_END || out_done != usize) {
            free(owned);
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: corrupt deflate data (%llu of %llu bytes inflated)", what,
                           (unsigned long long)out_done, (unsigned long long)usize);
        }
        raw = owned;
    }
    uint32_t got = (uint32_t)crc32(0L, Z_NULL, 0);
    for (uint64_t off = 0; off < usize; off += 1u << 30)
        got = (uint32_t)crc32(got, raw + off, (uInt)(usize - off > (1u << 30) ? (1u << 30) : usize - off));
    eng_status st = ENG_STATUS_OK;
    if (got != crc) {
        st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: CRC-32 mismatch (stored %08x, computed %08x)", what, crc, got);
    } else {
        eng_tensor *t = NULL;
        st = eng_npy_load_buffer(raw, usize, what, &t);
        if (st == ENG_STATUS_OK) {
            name[nlen - 4] = '\0';
            st = eng_npy_add(d, t, what, path, name);
        }
    }
    free(owned);
    return st;
}

eng_status eng_data_load_npz(eng_dataset *d, const char *path) {
    uint8_t *buf;
    size_t len;
    ENG_TRY(eng_data_read(path, ENG_DATA_MAX_FILE, &buf, &len));
    eng_status st = ENG_STATUS_OK;
    /* End of central directory: 22 bytes + a comment of up to 65535. */
    size_t eocd = (size_t)-1;
    for (size_t back = 22; back <= len && back <= 22 + 65535; back++)
        if (eng_le32(buf + len - back) == 0x06054b50) {
            eocd = len - back;
            break;
        }
    if (eocd == (size_t)-1) {
        st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: not a zip archive (no end-of-central-directory record; "
                     "truncated?)", path);
        goto done;
    }
    uint32_t nent = eng_le16(buf + eocd + 10), cdsize = eng_le32(buf + eocd + 12), cdoff = eng_le32(buf + eocd + 16);
    if (nent == 0xffff || cdoff == 0xffffffffu || cdsize == 0xffffffffu ||
        (eocd >= 20 && eng_le32(buf + eocd - 20) == 0x07064b50)) {
        st = eng_err(ENG_STATUS_UNSUPPORTED, "%s: zip64 archives are not supported", path);
        goto done;
    }
    if ((uint64_t)cdoff + cdsize > eocd) {
        st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: central directory (%u bytes at %u) lies outside the file", path,
                     cdsize, cdoff);
        goto done;
    }
    if (nent == 0) {
        st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: the archive is empty", path);
        goto done;
    }
    size_t p = cdoff, end = (size_t)cdoff + cdsize;
    for (uint32_t i = 0; i < nent && st == ENG_STATUS_OK; i++) {
        if (end - p < 46 || eng_le32(buf + p) != 0x02014b50) {
            st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: bad central directory entry %u at offset %zu", path, i, p);
            break;
        }
        size_t elen = 46 + (size_t)eng_le16(buf + p + 28) + eng_le16(buf + p + 30) + eng_le16(buf + p + 32);
        if (elen > end - p) {
            st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: central directory entry %u overruns the directory", path, i);
            break;
        }
        st = eng_npz_member(d, path, buf, len, buf + p, (int)i);
        p += elen;
    }
done:
    free(buf);
    return st;
}
