/* onnx-tensor.c - TensorProto decoding (raw_data, typed fields, external data), file reading helpers,
 * the protobuf nesting pre-check, and eng_onnx_tensor_load_file.
 *
 * Invariants:
 *  - a decoded tensor's byte size is computed with overflow checks and never exceeds the bytes actually
 *    present (raw_data length, typed-field count, or the external file's size), so a tiny file cannot make us
 *    allocate a huge buffer;
 *  - external data paths are relative, have no ".." component, and must resolve (symlinks included) to a file
 *    inside the model's directory; they are read with explicit offset/length bounds checks;
 *  - string, complex and segmented tensors are refused with ENG_STATUS_UNSUPPORTED naming the tensor.
 */
#include "onnx-impl.h"
#include "file-io.h"
#include "seq.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *eng_tp_name(const Onnx__TensorProto *tp) { return tp->name ? tp->name : ""; }

/* ---- protobuf nesting pre-check ---- */

static int eng_pb_varint(const uint8_t *p, size_t len, size_t *pos, uint64_t *v) {
    uint64_t r = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (*pos >= len) return 0;
        uint8_t b = p[(*pos)++];
        if (shift < 64) r |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = r;
            return 1;
        }
    }
    return 0;
}

/* 1 = fine or malformed (left to protobuf-c), 0 = nested too deep. */
static int eng_pb_depth_ok(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t len, int depth) {
    if (depth > ENG_ONNX_MAX_MSG_DEPTH) return 0;
    size_t pos = 0;
    while (pos < len) {
        uint64_t tag, v;
        if (!eng_pb_varint(p, len, &pos, &tag)) return 1;
        switch (tag & 7) {
        case 0:
            if (!eng_pb_varint(p, len, &pos, &v)) return 1;
            break;
        case 1:
            if (len - pos < 8) return 1;
            pos += 8;
            break;
        case 5:
            if (len - pos < 4) return 1;
            pos += 4;
            break;
        case 2: {
            if (!eng_pb_varint(p, len, &pos, &v) || v > len - pos) return 1;
            uint64_t id = tag >> 3;
            const ProtobufCFieldDescriptor *f =
                id <= UINT32_MAX ? protobuf_c_message_descriptor_get_field(d, (unsigned)id) : NULL;
            if (f && f->type == PROTOBUF_C_TYPE_MESSAGE &&
                !eng_pb_depth_ok((const ProtobufCMessageDescriptor *)f->descriptor, p + pos, (size_t)v, depth + 1))
                return 0;
            pos += (size_t)v;
            break;
        }
        default:
            return 1;
        }
    }
    return 1;
}

eng_status eng_onnx_check_nesting(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len) {
    if (!eng_pb_depth_ok(d, buf, len, 0))
        return eng_err(ENG_STATUS_INVALID_MODEL, "protobuf messages nested deeper than %d levels (%s)",
                       ENG_ONNX_MAX_MSG_DEPTH, d->name);
    return ENG_STATUS_OK;
}

/* ---- external data ---- */

static eng_status eng_parse_u64(const char *s, const char *tname, const char *key, uint64_t *out) {
    if (!s || !*s) return eng_err(ENG_STATUS_INVALID_MODEL, "tensor '%s': external data '%s' is empty", tname, key);
    uint64_t v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9' || v > (UINT64_MAX - 9) / 10)
            return eng_err(ENG_STATUS_INVALID_MODEL, "tensor '%s': external data '%s' = '%.64s' is not a valid size",
                           tname, key, s);
        v = v * 10 + (uint64_t)(*p - '0');
    }
    *out = v;
    return ENG_STATUS_OK;
}

/* Refuse absolute paths, ".." components and anything that resolves outside base_dir. *full: realpath'd. */
static eng_status eng_external_path(const char *base_dir, const char *loc, const char *tname, char **full) {
    *full = NULL;
    if (!loc || !*loc)
        return eng_err(ENG_STATUS_INVALID_MODEL, "tensor '%s': external data has no 'location'", tname);
    if (loc[0] == '/' || loc[0] == '\\')
        return eng_err(ENG_STATUS_INVALID_MODEL, "tensor '%s': external data location '%.200s' is an absolute path",
                       tname, loc);
    for (const char *p = loc; *p;) {
        const char *e = p;
        while (*e && *e != '/' && *e != '\\') e++;
        if (e - p == 2 && p[0] == '.' && p[1] == '.')
            return eng_err(ENG_STATUS_INVALID_MODEL,
                           "tensor '%s': external data location '%.200s' contains '..' (must stay in the model's "
                           "directory)", tname, loc);
        p = *e ? e + 1 : e;
    }
    size_t nb = strlen(base_dir), nl = strlen(loc);
    if (nb + nl + 2 > PATH_MAX)
        return eng_err(ENG_STATUS_INVALID_MODEL, "tensor '%s': external data path is too long", tname);
    char *joined = malloc(nb + nl + 2);
    if (!joined) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "tensor '%s': out of memory", tname);
    memcpy(joined, base_dir, nb);
    joined[nb] = '/';
    memcpy(joined + nb + 1, loc, nl + 1);
    char *rbase = realpath(base_dir, NULL);
    if (!rbase) {
        eng_status st = eng_err(ENG_STATUS_NOT_FOUND, "tensor '%s': model directory '%s' cannot be resolved: %s",
                                tname, base_dir, strerror(errno));
        free(joined);
        return st;
    }
    char *rfile = realpath(joined, NULL);
    if (!rfile) {
        int e = errno;
        eng_status st = eng_err(e == ENOENT ? ENG_STATUS_NOT_FOUND : ENG_STATUS_IO,
                                "tensor '%s': external data file '%s' cannot be opened: %s", tname, joined, strerror(e));
        free(rbase);
        free(joined);
        return st;
    }
    free(joined);
    size_t lb = strlen(rbase);
    int inside = strncmp(rfile, rbase, lb) == 0 && (rfile[lb] == '/' || (lb == 1 && rbase[0] == '/'));
    free(rbase);
    if (!inside) {
        eng_status st = eng_err(ENG_STATUS_INVALID_MODEL,
                                "tensor '%s': external data location '%.200s' resolves to '%.200s', outside the "
                                "model's directory", tname, loc, rfile);
        free(rfile);
        return st;
    }
    *full = rfile;
    return ENG_STATUS_OK;
}

static eng_status eng_external_read(const Onnx__TensorProto *tp, const char *base_dir, size_t nbytes, void *dst) {
    const char *tname = eng_tp_name(tp);
    const char *loc = NULL, *off_s = NULL, *len_s = NULL;
    for (size_t i = 0; i < tp->n_external_data; i++) {
        const Onnx__StringStringEntryProto *e = tp->external_data[i];
        if (!e || !e->key) continue;
        if (strcmp(e->key, "location") == 0) loc = e->value;
        else if (strcmp(e->key, "offset") == 0) off_s = e->value;
        else if (strcmp(e->key, "length") == 0) len_s = e->value;
    }
    if (!base_dir)
        return eng_err(ENG_STATUS_INVALID_MODEL,
                       "tensor '%s': uses external data ('%.200s') but the model was loaded from memory with no base "
                       "directory", tname, loc ? loc : "");
    uint64_t off = 0, length = nbytes;
    if (off_s) ENG_TRY(eng_parse_u64(off_s, tname, "offset", &off));
    if (len_s) ENG_TRY(eng_parse_u64(len_s, tname, "length", &length));
    if (length != nbytes)
        return eng_err(ENG_STATUS_INVALID_MODEL, "tensor '%s': external data length %llu, expected %zu from its shape",
                       tname, (unsigned long long)length, nbytes);
    char *full;
    ENG_TRY(eng_external_path(base_dir, loc, tname, &full));
    int fd;
    uint64_t fsize;
    eng_status st = eng_file_open_regular(full, base_dir, &fd, &fsize); /* never blocks on a FIFO */
    if (st != ENG_STATUS_OK) {
        free(full);
        return eng_err_prefix(st, "tensor '%s': external data: ", tname);
    }
    if (off > fsize || nbytes > fsize - off) {
        st = eng_err(ENG_STATUS_INVALID_MODEL,
                     "tensor '%s': external data '%s' holds %llu bytes, too few for offset %llu + length %zu", tname,
                     full, (unsigned long long)fsize, (unsigned long long)off, nbytes);
    } else {
        size_t got = 0;
        while (got < nbytes) {
            ssize_t r = pread(fd, (char *)dst + got, nbytes - got, (off_t)(off + got));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
                st = eng_err(ENG_STATUS_IO, "tensor '%s': reading external data '%s' failed at byte %llu: %s", tname,
                             full, (unsigned long long)(off + got), r == 0 ? "file shrank" : strerror(errno));
                break;
            }
            got += (size_t)r;
        }
    }
    close(fd);
    free(full);
    return st;
}

/* ---- TensorProto decoding ---- */

static eng_status eng_count_check(const char *tname, const char *field, size_t have, int64_t want) {
    if ((uint64_t)have != (uint64_t)want)
        return eng_err(ENG_STATUS_INVALID_MODEL, "tensor '%s': %s has %zu elements, expected %lld from its dims", tname,
                       field, have, (long long)want);
    return ENG_STATUS_OK;
}

eng_status eng_onnx_tensor_decode(const Onnx__TensorProto *tp, const char *base_dir, eng_tensor **out) {
    *out = NULL;
    const char *tname = eng_tp_name(tp);
    char what[300];
    snprintf(what, sizeof what, "tensor '%.200s'", tname);
    if (!tp->has_data_type || tp->data_type == 0)
        return eng_err(ENG_STATUS_INVALID_MODEL, "tensor '%s': data_type is missing or UNDEFINED", tname);
    eng_dtype dt = (eng_dtype)tp->data_type;
    if (dt == ENG_DTYPE_STRING)
        return eng_err(ENG_STATUS_UNSUPPORTED, "tensor '%s': string tensors are not supported", tname);
    if (eng_dtype_size(dt) == 0)
        return eng_err(ENG_STATUS_UNSUPPORTED, "tensor '%s': data_type %d is not supported", tname, (int)tp->data_type);
    if (tp->segment)
        return eng_err(ENG_STATUS_UNSUPPORTED, "tensor '%s': segmented tensors are not supported", tname);
    if (tp->n_dims > ENG_MAX_DIMS)
        return eng_err(ENG_STATUS_UNSUPPORTED, "tensor '%s': rank %zu exceeds the limit of %d dims", tname, tp->n_dims,
                       ENG_MAX_DIMS);
    eng_tensor t = {.dtype = dt, .ndim = (int)tp->n_dims};
    for (size_t i = 0; i < tp->n_dims; i++) {
        if (tp->dims[i] < 0)
            return eng_err(ENG_STATUS_INVALID_MODEL, "tensor '%s': dim %zu is negative (%lld)", tname, i,
                           (long long)tp->dims[i]);
        t.dims[i] = tp->dims[i];
    }
    size_t nb;
    ENG_TRY(eng_tensor_nbytes_checked(&t, what, &nb));
    int64_t numel = eng_tensor_numel(&t);
    int external = tp->has_data_location && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;

    /* Validate that the bytes are present before allocating. */
    if (external) {
        if (tp->has_raw_data && tp->raw_data.len)
            return eng_err(ENG_STATUS_INVALID_MODEL, "tensor '%s': has both external data and raw_data", tname);
    } else if (tp->has_raw_data) {
        if (tp->raw_data.len != nb)
            return eng_err(ENG_STATUS_INVALID_MODEL, "tensor '%s': raw_data has %zu bytes, expected %zu for %s %s",
                           tname, tp->raw_data.len, nb, eng_dtype_name(dt),
                           eng_shape_str(t.dims, t.ndim, (char[160]){0}, 160));
    } else {
        switch (dt) {
        case ENG_DTYPE_F32: ENG_TRY(eng_count_check(tname, "float_data", tp->n_float_data, numel)); break;
        case ENG_DTYPE_F64: ENG_TRY(eng_count_check(tname, "double_data", tp->n_double_data, numel)); break;
        case ENG_DTYPE_I64: ENG_TRY(eng_count_check(tname, "int64_data", tp->n_int64_data, numel)); break;
        case ENG_DTYPE_U32:
        case ENG_DTYPE_U64: ENG_TRY(eng_count_check(tname, "uint64_data", tp->n_uint64_data, numel)); break;
        default: ENG_TRY(eng_count_check(tname, "int32_data", tp->n_int32_data, numel)); break;
        }
    }
    t.data = eng_alloc(nb);
    if (!t.data) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "tensor '%s': cannot allocate %zu bytes", tname, nb);
    eng_status st = ENG_STATUS_OK;
    if (external) {
        st = eng_external_read(tp, base_dir, nb, t.data);
    } else if (tp->has_raw_data) {
        if (nb) memcpy(t.data, tp->raw_data.data, nb);
        if (dt == ENG_DTYPE_BOOL)
            for (size_t i = 0; i < nb; i++) ((uint8_t *)t.data)[i] = ((uint8_t *)t.data)[i] != 0;
    } else {
        size_t n = (size_t)numel;
        void *d = t.data;
        switch (dt) {
        case ENG_DTYPE_F32: if (n) memcpy(d, tp->float_data, n * 4); break;
        case ENG_DTYPE_F64: if (n) memcpy(d, tp->double_data, n * 8); break;
        case ENG_DTYPE_I64: if (n) memcpy(d, tp->int64_data, n * 8); break;
        case ENG_DTYPE_U64: if (n) memcpy(d, tp->uint64_data, n * 8); break;
        case ENG_DTYPE_U32: for (size_t i = 0; i < n; i++) ((uint32_t *)d)[i] = (uint32_t)tp->uint64_data[i]; break;
        case ENG_DTYPE_I32: if (n) memcpy(d, tp->int32_data, n * 4); break;
        case ENG_DTYPE_BOOL: for (size_t i = 0; i < n; i++) ((uint8_t *)d)[i] = tp->int32_data[i] != 0; break;
        case ENG_DTYPE_U8:
        case ENG_DTYPE_I8: for (size_t i = 0; i < n; i++) ((uint8_t *)d)[i] = (uint8_t)tp->int32_data[i]; break;
        default: /* u16 i16 f16 bf16: 16-bit patterns */
            for (size_t i = 0; i < n; i++) ((uint16_t *)d)[i] = (uint16_t)tp->int32_data[i];
            break;
        }
    }
    if (st != ENG_STATUS_OK) {
        eng_free(t.data);
        return st;
    }
    eng_tensor *r = malloc(sizeof *r);
    if (!r) {
        eng_free(t.data);
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "tensor '%s': out of memory", tname);
    }
    *r = t;
    *out = r;
    return ENG_STATUS_OK;
}

eng_status eng_onnx_tensor_load_file(const char *path, eng_tensor **out, char **name) {
    if (!path || !out) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "eng_onnx_tensor_load_file: NULL argument");
    *out = NULL;
    if (name) *name = NULL;
    uint8_t *buf;
    size_t len;
    ENG_TRY(eng_file_read(path, ENG_ONNX_MAX_FILE_BYTES, &buf, &len));
    eng_status st = eng_onnx_check_nesting(&onnx__tensor_proto__descriptor, buf, len);
    if (st != ENG_STATUS_OK) {
        free(buf);
        return eng_err_prefix(st, "%s: ", path);
    }
    Onnx__TensorProto *tp = onnx__tensor_proto__unpack(NULL, len, buf);
    free(buf);
    if (!tp) return eng_err(ENG_STATUS_INVALID_MODEL, "%s: not a valid serialized TensorProto", path);
    char *dir = eng_file_dirname(path);
    char *nm = name ? strdup(tp->name ? tp->name : "") : NULL;
    if (!dir || (name && !nm)) {
        st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
    } else {
        st = eng_onnx_tensor_decode(tp, dir, out);
        if (st != ENG_STATUS_OK) eng_err_prefix(st, "%s: ", path);
    }
    free(dir);
    onnx__tensor_proto__free_unpacked(tp, NULL);
    if (st == ENG_STATUS_OK && name) *name = nm;
    else free(nm);
    return st;
}

/* A SequenceProto (onnx-data.proto: 1 name, 2 elem_type, 3 tensor_values, 4 sparse_tensor_values, 5 sequence_values,
 * 6 map_values, 7 optional_values) of dense tensors, read field by field: protobuf-c has no descriptor for it here
 * (Debian's libonnx-dev ships onnx.proto only). */
eng_status eng_onnx_seq_load_file(const char *path, eng_tensor **out) {
    *out = NULL;
    uint8_t *buf;
    size_t len, pos = 0;
    ENG_TRY(eng_file_read(path, ENG_ONNX_MAX_FILE_BYTES, &buf, &len));
    eng_tensor *items = NULL, **owned = NULL;
    int64_t n = 0, cap = 0, elem = 0;
    eng_status st = ENG_STATUS_OK;
    char *dir = eng_file_dirname(path);
    if (!dir) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    while (st == ENG_STATUS_OK && pos < len) {
        uint64_t tag, v;
        if (!eng_pb_varint(buf, len, &pos, &tag)) goto bad;
        int field = (int)(tag >> 3), wt = (int)(tag & 7);
        if (wt == 0) {
            if (!eng_pb_varint(buf, len, &pos, &v)) goto bad;
            if (field == 2) elem = (int64_t)v;
            continue;
        }
        if (wt != 2 || !eng_pb_varint(buf, len, &pos, &v) || v > len - pos) goto bad;
        if (field == 3) {
            if (n == cap) {
                cap = cap ? cap * 2 : 8;
                eng_tensor *ni = realloc(items, (size_t)cap * sizeof *ni);
                eng_tensor **no = realloc(owned, (size_t)cap * sizeof *no);
                if (ni) items = ni;
                if (no) owned = no;
                if (!ni || !no) {
                    st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
                    break;
                }
            }
            Onnx__TensorProto *tp = onnx__tensor_proto__unpack(NULL, (size_t)v, buf + pos);
            if (!tp) goto bad;
            st = eng_onnx_tensor_decode(tp, dir, &owned[n]);
            onnx__tensor_proto__free_unpacked(tp, NULL);
            if (st == ENG_STATUS_OK) items[n] = *owned[n], n++;
        } else if (field >= 4 && field <= 7) {
            st = eng_err(ENG_STATUS_UNSUPPORTED, "%s: sequences of sparse tensors, sequences, maps or optionals are not "
                         "supported", path);
        }
        pos += (size_t)v;
    }
    if (st == ENG_STATUS_OK) {
        eng_tensor *t = malloc(sizeof *t);
        if (!t) st = eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
        else if ((st = eng_seq_make(n ? items[0].dtype : (eng_dtype)elem, items, n, t)) != ENG_STATUS_OK) free(t);
        else *out = t;
    }
    if (0) {
    bad:
        st = eng_err(ENG_STATUS_INVALID_MODEL, "%s: not a valid serialized SequenceProto", path);
    }
    for (int64_t i = 0; i < n; i++) eng_tensor_destroy(&owned[i]);
    free(owned);
    free(items);
    free(dir);
    free(buf);
    return st;
}
