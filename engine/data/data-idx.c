/* data-idx.c - IDX files (the MNIST / Fashion-MNIST layout), raw or gzipped.
 *
 * Layout: two zero bytes, a type byte (0x08 = unsigned byte; the others exist but are refused here), a rank
 * byte, rank big-endian uint32 dims, then the data in C order. The byte count the dims give must equal what
 * follows the header exactly. Rank 1 -> column "label" (int64); rank >= 2 -> column "x" (float32, value / 255).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data-impl.h"

static const char *eng_idx_type_name(int t) {
    switch (t) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0b: return "int16";
    case 0x0c: return "int32";
    case 0x0d: return "float32";
    case 0x0e: return "float64";
    default: return NULL;
    }
}

eng_status eng_data_load_idx(eng_dataset *d, const char *path) {
    uint8_t *buf;
    size_t len;
    ENG_TRY(eng_data_read(path, ENG_DATA_MAX_FILE, &buf, &len));
    eng_status st = ENG_STATUS_OK;
    eng_tensor t = {0};
    if (len < 4 || buf[0] != 0 || buf[1] != 0) {
        st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: not an IDX file (bad magic %02x %02x %02x %02x)", path,
                     len > 0 ? buf[0] : 0, len > 1 ? buf[1] : 0, len > 2 ? buf[2] : 0, len > 3 ? buf[3] : 0);
        goto done;
    }
    int type = buf[2], rank = buf[3];
    if (!eng_idx_type_name(type)) {
        st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: not an IDX file (unknown type byte 0x%02x)", path, type);
        goto done;
    }
    if (type != 0x08) {
        st = eng_err(ENG_STATUS_UNSUPPORTED, "%s: IDX element type %s is not supported (only unsigned byte)", path,
                     eng_idx_type_name(type));
        goto done;
    }
    if (rank < 1 || rank > ENG_MAX_DIMS) {
        st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: IDX rank %d is outside [1, %d]", path, rank, ENG_MAX_DIMS);
        goto done;
    }
    size_t hdr = 4 + 4 * (size_t)rank;
    if (len < hdr) {
        st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: truncated IDX header (%zu bytes, need %zu)", path, len, hdr);
        goto done;
    }
    t.ndim = rank;
    for (int i = 0; i < rank; i++) {
        const uint8_t *p = buf + 4 + 4 * i;
        t.dims[i] = (int64_t)((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]);
    }
    int64_t numel = eng_shape_numel(t.dims, t.ndim);
    char sb[160];
    eng_shape_str(t.dims, t.ndim, sb, sizeof sb);
    if (numel < 0 || (uint64_t)numel != len - hdr) {
        st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: IDX dims %s need %lld data bytes but the file has %zu%s", path,
                     sb, (long long)numel, len - hdr, (uint64_t)numel > len - hdr ? " (truncated?)" : "");
        goto done;
    }
    if (t.dims[0] < 1) {
        st = eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: the dataset is empty (IDX dims %s)", path, sb);
        goto done;
    }
    const uint8_t *src = buf + hdr;
    const char *col = rank == 1 ? "label" : "x";
    t.dtype = rank == 1 ? ENG_DTYPE_I64 : ENG_DTYPE_F32;
    if ((st = eng_data_alloc(d, &t, path, col)) != ENG_STATUS_OK) goto done;
    if (rank == 1) {
        int64_t *o = t.data;
        for (int64_t i = 0; i < numel; i++) o[i] = src[i];
    } else {
        float lut[256], *o = t.data;
        for (int i = 0; i < 256; i++) lut[i] = (float)i / 255.0f;
        for (int64_t i = 0; i < numel; i++) o[i] = lut[src[i]];
    }
    st = eng_data_add(d, col, &t, path);
done:
    free(buf);
    return st;
}
