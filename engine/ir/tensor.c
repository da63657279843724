/* tensor.c - dtype table, shape arithmetic with overflow checks, numeric conversions (see tensor.h). */
#include "tensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

size_t eng_dtype_size(eng_dtype dt) {
    switch (dt) {
    case ENG_DTYPE_F32: case ENG_DTYPE_I32: case ENG_DTYPE_U32: return 4;
    case ENG_DTYPE_U8: case ENG_DTYPE_I8: case ENG_DTYPE_BOOL: return 1;
    case ENG_DTYPE_U16: case ENG_DTYPE_I16: case ENG_DTYPE_F16: case ENG_DTYPE_BF16: return 2;
    case ENG_DTYPE_I64: case ENG_DTYPE_U64: case ENG_DTYPE_F64: return 8;
    default: return 0;
    }
}

static const struct { eng_dtype dt; const char *name; const char *npy; } eng_dtype_table[] = {
    {ENG_DTYPE_F32, "float32", "<f4"}, {ENG_DTYPE_U8, "uint8", "|u1"},    {ENG_DTYPE_I8, "int8", "|i1"},
    {ENG_DTYPE_U16, "uint16", "<u2"},  {ENG_DTYPE_I16, "int16", "<i2"},   {ENG_DTYPE_I32, "int32", "<i4"},
    {ENG_DTYPE_I64, "int64", "<i8"},   {ENG_DTYPE_STRING, "string", NULL}, {ENG_DTYPE_BOOL, "bool", "|b1"},
    {ENG_DTYPE_F16, "float16", "<f2"}, {ENG_DTYPE_F64, "float64", "<f8"}, {ENG_DTYPE_U32, "uint32", "<u4"},
    {ENG_DTYPE_U64, "uint64", "<u8"},  {ENG_DTYPE_BF16, "bfloat16", NULL}, {ENG_DTYPE_SEQUENCE, "sequence", NULL},
};
#define ENG_NDTYPES (sizeof eng_dtype_table / sizeof eng_dtype_table[0])

const char *eng_dtype_name(eng_dtype dt) {
    for (size_t i = 0; i < ENG_NDTYPES; i++)
        if (eng_dtype_table[i].dt == dt) return eng_dtype_table[i].name;
    static _Thread_local char buf[32];
    snprintf(buf, sizeof buf, "dtype(%d)", (int)dt);
    return buf;
}

const char *eng_dtype_npy(eng_dtype dt) {
    for (size_t i = 0; i < ENG_NDTYPES; i++)
        if (eng_dtype_table[i].dt == dt) return eng_dtype_table[i].npy;
    return NULL;
}

eng_dtype eng_dtype_parse(const char *s) {
    static const struct { const char *s; eng_dtype dt; } alias[] = {
        {"float", ENG_DTYPE_F32},   {"DT_FLOAT", ENG_DTYPE_F32},   {"FP32", ENG_DTYPE_F32},   {"f4", ENG_DTYPE_F32},
        {"double", ENG_DTYPE_F64},  {"DT_DOUBLE", ENG_DTYPE_F64},  {"FP64", ENG_DTYPE_F64},   {"f8", ENG_DTYPE_F64},
        {"half", ENG_DTYPE_F16},    {"DT_HALF", ENG_DTYPE_F16},    {"FP16", ENG_DTYPE_F16},   {"f2", ENG_DTYPE_F16},
        {"DT_BFLOAT16", ENG_DTYPE_BF16}, {"BF16", ENG_DTYPE_BF16},
        {"DT_INT8", ENG_DTYPE_I8},  {"INT8", ENG_DTYPE_I8},        {"DT_UINT8", ENG_DTYPE_U8}, {"UINT8", ENG_DTYPE_U8},
        {"DT_INT16", ENG_DTYPE_I16}, {"INT16", ENG_DTYPE_I16},     {"DT_UINT16", ENG_DTYPE_U16}, {"UINT16", ENG_DTYPE_U16},
        {"DT_INT32", ENG_DTYPE_I32}, {"INT32", ENG_DTYPE_I32},     {"int", ENG_DTYPE_I32},
        {"DT_INT64", ENG_DTYPE_I64}, {"INT64", ENG_DTYPE_I64},     {"long", ENG_DTYPE_I64},
        {"DT_UINT32", ENG_DTYPE_U32}, {"UINT32", ENG_DTYPE_U32},   {"DT_UINT64", ENG_DTYPE_U64}, {"UINT64", ENG_DTYPE_U64},
        {"DT_BOOL", ENG_DTYPE_BOOL}, {"BOOL", ENG_DTYPE_BOOL},     {"b1", ENG_DTYPE_BOOL},
        {"DT_STRING", ENG_DTYPE_STRING}, {"BYTES", ENG_DTYPE_STRING},
    };
    if (!s) return ENG_DTYPE_UNDEFINED;
    for (size_t i = 0; i < ENG_NDTYPES; i++)
        if (strcasecmp(eng_dtype_table[i].name, s) == 0) return eng_dtype_table[i].dt;
    for (size_t i = 0; i < sizeof alias / sizeof alias[0]; i++)
        if (strcasecmp(alias[i].s, s) == 0) return alias[i].dt;
    return ENG_DTYPE_UNDEFINED;
}

int eng_dtype_is_float(eng_dtype dt) {
    return dt == ENG_DTYPE_F32 || dt == ENG_DTYPE_F64 || dt == ENG_DTYPE_F16 || dt == ENG_DTYPE_BF16;
}

int eng_dtype_is_int(eng_dtype dt) {
    switch (dt) {
    case ENG_DTYPE_U8: case ENG_DTYPE_I8: case ENG_DTYPE_U16: case ENG_DTYPE_I16: case ENG_DTYPE_I32:
    case ENG_DTYPE_I64: case ENG_DTYPE_U32: case ENG_DTYPE_U64: return 1;
    default: return 0;
    }
}

int64_t eng_shape_numel(const int64_t *dims, int ndim) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (dims[i] < 0) return -1;
        if (dims[i] != 0 && n > INT64_MAX / dims[i]) return -1;
        n *= dims[i];
    }
    return n;
}

int64_t eng_tensor_numel(const eng_tensor *t) { return eng_shape_numel(t->dims, t->ndim); }

eng_status eng_tensor_nbytes_checked(const eng_tensor *t, const char *what, size_t *out) {
    char sb[160];
    size_t es = eng_dtype_size(t->dtype);
    if (es == 0)
        return eng_err(ENG_STATUS_UNSUPPORTED, "%s: dtype %s is not supported", what, eng_dtype_name(t->dtype));
    if (t->ndim < 0 || t->ndim > ENG_MAX_DIMS)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s: rank %d exceeds the limit of %d dims", what, t->ndim,
                       ENG_MAX_DIMS);
    int64_t n = eng_tensor_numel(t);
    if (n < 0 || n > ENG_MAX_TENSOR_BYTES / (int64_t)es)
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: shape %s of %s is too large (limit %lld bytes)", what,
                       eng_shape_str(t->dims, t->ndim, sb, sizeof sb), eng_dtype_name(t->dtype),
                       (long long)ENG_MAX_TENSOR_BYTES);
    *out = (size_t)n * es;
    return ENG_STATUS_OK;
}

size_t eng_tensor_nbytes(const eng_tensor *t) {
    int64_t n = eng_tensor_numel(t);
    return n < 0 ? 0 : (size_t)n * eng_dtype_size(t->dtype);
}

eng_tensor eng_tensor_rows(const eng_tensor *t, int64_t r0, int64_t rows) {
    eng_tensor v = *t;
    if (t->ndim < 1) return v;
    size_t rb = t->dims[0] > 0 ? eng_tensor_nbytes(t) / (size_t)t->dims[0] : 0;
    v.dims[0] = rows;
    if (t->data) v.data = (char *)t->data + (size_t)r0 * rb;
    return v;
}

char *eng_shape_str(const int64_t *dims, int ndim, char *buf, size_t n) {
    size_t k = 0;
    if (n == 0) return buf;
    k += (size_t)snprintf(buf + k, n - k, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, i ? ",%lld" : "%lld", (long long)dims[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

int eng_shape_equal(const eng_tensor *a, const eng_tensor *b) {
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->dims[i] != b->dims[i]) return 0;
    return 1;
}

int eng_shapes_equal_n(const eng_tensor *a, const eng_tensor *b, int n) {
    for (int i = 0; i < n; i++)
        if (a[i].dtype != b[i].dtype || (a[i].dtype != ENG_DTYPE_UNDEFINED && !eng_shape_equal(&a[i], &b[i]))) return 0;
    return 1;
}

float eng_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) bits = sign;
        else { /* subnormal: renormalise */
            int e = -1;
            do { e++; man <<= 1; } while (!(man & 0x400));
            bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) bits = sign | 0x7f800000u | (man << 13);
    else bits = sign | ((exp + 112) << 23) | (man << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t eng_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* overflow after rounding */
    if (ax < 0x38800000u) { /* subnormal or zero in f16 */
        if (ax < 0x33000000u) return (uint16_t)sign;
        uint32_t e = ax >> 23, m = (ax & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14 + (113 - e) - 1 */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((ax >> 13) - (112u << 10));
    uint32_t rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
    return (uint16_t)(sign | r);
}

float eng_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t eng_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

double eng_tensor_get_f64(const eng_tensor *t, int64_t i) {
    const void *p = t->data;
    switch (t->dtype) {
    case ENG_DTYPE_F32: return ((const float *)p)[i];
    case ENG_DTYPE_F64: return ((const double *)p)[i];
    case ENG_DTYPE_F16: return eng_f16_to_f32(((const uint16_t *)p)[i]);
    case ENG_DTYPE_BF16: return eng_bf16_to_f32(((const uint16_t *)p)[i]);
    case ENG_DTYPE_U8: return ((const uint8_t *)p)[i];
    case ENG_DTYPE_I8: return ((const int8_t *)p)[i];
    case ENG_DTYPE_U16: return ((const uint16_t *)p)[i];
    case ENG_DTYPE_I16: return ((const int16_t *)p)[i];
    case ENG_DTYPE_I32: return ((const int32_t *)p)[i];
    case ENG_DTYPE_I64: return (double)((const int64_t *)p)[i];
    case ENG_DTYPE_U32: return ((const uint32_t *)p)[i];
    case ENG_DTYPE_U64: return (double)((const uint64_t *)p)[i];
    case ENG_DTYPE_BOOL: return ((const uint8_t *)p)[i] != 0;
    default: return 0;
    }
}

int64_t eng_tensor_get_i64(const eng_tensor *t, int64_t i) {
    const void *p = t->data;
    switch (t->dtype) {
    case ENG_DTYPE_I64: return ((const int64_t *)p)[i];
    case ENG_DTYPE_I32: return ((const int32_t *)p)[i];
    case ENG_DTYPE_U64: return (int64_t)((const uint64_t *)p)[i];
    case ENG_DTYPE_U32: return ((const uint32_t *)p)[i];
    case ENG_DTYPE_U8: return ((const uint8_t *)p)[i];
    case ENG_DTYPE_I8: return ((const int8_t *)p)[i];
    case ENG_DTYPE_U16: return ((const uint16_t *)p)[i];
    case ENG_DTYPE_I16: return ((const int16_t *)p)[i];
    case ENG_DTYPE_BOOL: return ((const uint8_t *)p)[i] != 0;
    default: {
        double d = eng_tensor_get_f64(t, i);
        if (d != d) return 0;
        if (d >= 9.2e18) return INT64_MAX;
        if (d <= -9.2e18) return INT64_MIN;
        return (int64_t)d;
    }
    }
}

void eng_tensor_set_f64(eng_tensor *t, int64_t i, double v) {
    void *p = t->data;
    switch (t->dtype) {
    case ENG_DTYPE_F32: ((float *)p)[i] = (float)v; break;
    case ENG_DTYPE_F64: ((double *)p)[i] = v; break;
    case ENG_DTYPE_F16: ((uint16_t *)p)[i] = eng_f32_to_f16((float)v); break;
    case ENG_DTYPE_BF16: ((uint16_t *)p)[i] = eng_f32_to_bf16((float)v); break;
    case ENG_DTYPE_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    default: eng_tensor_set_i64(t, i, (v != v) ? 0 : (v >= 9.2e18 ? INT64_MAX : (v <= -9.2e18 ? INT64_MIN : (int64_t)v)));
    }
}

void eng_tensor_set_i64(eng_tensor *t, int64_t i, int64_t v) {
    void *p = t->data;
    switch (t->dtype) {
    case ENG_DTYPE_I64: ((int64_t *)p)[i] = v; break;
    case ENG_DTYPE_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case ENG_DTYPE_U64: ((uint64_t *)p)[i] = (uint64_t)v; break;
    case ENG_DTYPE_U32: ((uint32_t *)p)[i] = (uint32_t)v; break;
    case ENG_DTYPE_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case ENG_DTYPE_I8: ((int8_t *)p)[i] = (int8_t)v; break;
    case ENG_DTYPE_U16: ((uint16_t *)p)[i] = (uint16_t)v; break;
    case ENG_DTYPE_I16: ((int16_t *)p)[i] = (int16_t)v; break;
    case ENG_DTYPE_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    default: eng_tensor_set_f64(t, i, (double)v);
    }
}

eng_status eng_convert(const void *src, eng_dtype sdt, void *dst, eng_dtype ddt, int64_t n) {
    if (!eng_dtype_size(sdt) || !eng_dtype_size(ddt))
        return eng_err(ENG_STATUS_UNSUPPORTED, "cannot convert %s to %s", eng_dtype_name(sdt), eng_dtype_name(ddt));
    if (sdt == ddt) {
        memcpy(dst, src, (size_t)n * eng_dtype_size(sdt));
        return ENG_STATUS_OK;
    }
    eng_tensor s = {.dtype = sdt, .ndim = 1, .dims = {n}, .data = (void *)src};
    eng_tensor d = {.dtype = ddt, .ndim = 1, .dims = {n}, .data = dst};
    if (sdt == ENG_DTYPE_F32 && ddt == ENG_DTYPE_BF16) { /* bf16 plans: straight loops the compiler vectorises */
        const uint32_t *s32 = src;
        uint16_t *d16 = dst;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) {
            uint32_t x = s32[i];
            uint32_t r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
            d16[i] = (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? (x >> 16) | 0x40u : r); /* NaN stays NaN */
        }
    } else if (sdt == ENG_DTYPE_BF16 && ddt == ENG_DTYPE_F32) {
        const uint16_t *s16 = src;
        uint32_t *d32 = dst;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) d32[i] = (uint32_t)s16[i] << 16;
    } else if (sdt == ENG_DTYPE_F32 && ddt == ENG_DTYPE_F16) {
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = eng_f32_to_f16(((const float *)src)[i]);
    } else if (sdt == ENG_DTYPE_F16 && ddt == ENG_DTYPE_F32) {
        for (int64_t i = 0; i < n; i++) ((float *)dst)[i] = eng_f16_to_f32(((const uint16_t *)src)[i]);
    } else if (eng_dtype_is_float(sdt) || ddt == ENG_DTYPE_BOOL || eng_dtype_is_float(ddt)) {
        for (int64_t i = 0; i < n; i++) eng_tensor_set_f64(&d, i, eng_tensor_get_f64(&s, i));
        if (ddt == ENG_DTYPE_BOOL || !eng_dtype_is_float(ddt)) {
            /* exact int64 path for large integers going to float64 is handled below */
        }
        if (ddt == ENG_DTYPE_F64 && (sdt == ENG_DTYPE_I64 || sdt == ENG_DTYPE_U64))
            for (int64_t i = 0; i < n; i++)
                ((double *)dst)[i] = sdt == ENG_DTYPE_I64 ? (double)((const int64_t *)src)[i]
                                                          : (double)((const uint64_t *)src)[i];
    } else {
        for (int64_t i = 0; i < n; i++) eng_tensor_set_i64(&d, i, eng_tensor_get_i64(&s, i));
    }
    return ENG_STATUS_OK;
}

void *eng_alloc(size_t nbytes) {
    if (nbytes > (size_t)ENG_MAX_TENSOR_BYTES) return NULL;
    void *p = NULL;
    size_t sz = (nbytes + 63) & ~(size_t)63;
    if (sz == 0) sz = 64;
    if (posix_memalign(&p, 64, sz) != 0) return NULL;
    return p;
}

void eng_free(void *p) { free(p); }

eng_status eng_tensor_alloc_data(eng_tensor *t, const char *what) {
    size_t nb;
    ENG_TRY(eng_tensor_nbytes_checked(t, what, &nb));
    if (!(t->data = eng_alloc(nb ? nb : 1)))
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes", what, nb);
    return ENG_STATUS_OK;
}
