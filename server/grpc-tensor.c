/* grpc-tensor.c - tensors <-> the gRPC APIs' tensor messages: TensorFlow's TensorProto (every form TF
 * Serving clients send) and KServe v2's typed contents and raw bytes.
 *
 * Checks, before anything is allocated: a known dtype; at most ENG_MAX_DIMS dims, none negative; the element
 * count and byte size with overflow checks and within `max_bytes` (a shape of 2^40 elements is refused here,
 * whatever the message size); tensor_content / raw bytes exactly numel x dtype size; a typed value list in the
 * field of the tensor's dtype only, with as many values as elements (TensorProto also takes fewer: the last
 * value is repeated, as TensorFlow's Tensor::FromProto does), integers within the dtype's range. Every error
 * names the input, expected vs got.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpc-tensor.h"

typedef struct tf_type {
    int tf;
    eng_dtype dt;
    const char *name;
} tf_type;

static const tf_type tf_types[] = {
    {TENSORFLOW__DATA_TYPE__DT_FLOAT, ENG_DTYPE_F32, "DT_FLOAT"},   {TENSORFLOW__DATA_TYPE__DT_DOUBLE, ENG_DTYPE_F64, "DT_DOUBLE"},
    {TENSORFLOW__DATA_TYPE__DT_INT32, ENG_DTYPE_I32, "DT_INT32"},   {TENSORFLOW__DATA_TYPE__DT_UINT8, ENG_DTYPE_U8, "DT_UINT8"},
    {TENSORFLOW__DATA_TYPE__DT_INT16, ENG_DTYPE_I16, "DT_INT16"},   {TENSORFLOW__DATA_TYPE__DT_INT8, ENG_DTYPE_I8, "DT_INT8"},
    {TENSORFLOW__DATA_TYPE__DT_INT64, ENG_DTYPE_I64, "DT_INT64"},   {TENSORFLOW__DATA_TYPE__DT_BOOL, ENG_DTYPE_BOOL, "DT_BOOL"},
    {TENSORFLOW__DATA_TYPE__DT_BFLOAT16, ENG_DTYPE_BF16, "DT_BFLOAT16"}, {TENSORFLOW__DATA_TYPE__DT_UINT16, ENG_DTYPE_U16, "DT_UINT16"},
    {TENSORFLOW__DATA_TYPE__DT_HALF, ENG_DTYPE_F16, "DT_HALF"},     {TENSORFLOW__DATA_TYPE__DT_UINT32, ENG_DTYPE_U32, "DT_UINT32"},
    {TENSORFLOW__DATA_TYPE__DT_UINT64, ENG_DTYPE_U64, "DT_UINT64"}, {TENSORFLOW__DATA_TYPE__DT_STRING, ENG_DTYPE_STRING, "DT_STRING"},
};
#define NTF (sizeof tf_types / sizeof tf_types[0])

eng_dtype srv_tf_dtype_from(int tf) {
    for (size_t i = 0; i < NTF; i++)
        if (tf_types[i].tf == tf) return tf_types[i].dt;
    return ENG_DTYPE_UNDEFINED;
}

int srv_tf_dtype_to(eng_dtype dt) {
    for (size_t i = 0; i < NTF; i++)
        if (tf_types[i].dt == dt) return tf_types[i].tf;
    return TENSORFLOW__DATA_TYPE__DT_INVALID;
}

static const char *tf_name(int tf) {
    for (size_t i = 0; i < NTF; i++)
        if (tf_types[i].tf == tf) return tf_types[i].name;
    return "an unknown dtype";
}

/* Shape checks shared by both APIs: dims, numel, bytes within max_bytes. */
static srv_code shape_check(const char *name, eng_tensor *t, const int64_t *dims, size_t ndims, size_t max_bytes,
                            int64_t *numel, size_t *nbytes, srv_error *err) {
    if (ndims > ENG_MAX_DIMS)
        return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': shape has %zu dims, at most %d are supported", name,
                       ndims, ENG_MAX_DIMS);
    int64_t n = 1;
    for (size_t i = 0; i < ndims; i++) {
        if (dims[i] < 0)
            return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': dim %zu is %lld; sizes must be >= 0", name, i,
                           (long long)dims[i]);
        t->dims[i] = dims[i];
        if (dims[i] > 0 && n > INT64_MAX / dims[i]) n = -1;
        else if (n >= 0) n *= dims[i];
    }
    t->ndim = (int)ndims;
    size_t es = eng_dtype_size(t->dtype);
    char sb[200];
    if (n < 0 || (uint64_t)n > (uint64_t)max_bytes / (es ? es : 1))
        return srv_err(err, SRV_INVALID_ARGUMENT,
                       "input '%s': shape %s has too many elements: more than the %zu-byte limit on one tensor", name,
                       eng_shape_str(t->dims, t->ndim, sb, sizeof sb), max_bytes);
    *numel = n;
    *nbytes = (size_t)n * es;
    return SRV_OK;
}

static srv_code alloc_data(const char *name, eng_tensor *t, size_t nbytes, srv_error *err) {
    t->data = eng_alloc(nbytes ? nbytes : 1);
    if (!t->data) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "input '%s': out of memory for %zu bytes", name, nbytes);
    return SRV_OK;
}

/* A value check failed after the data was allocated: free it, so that a failed decode owns nothing. */
static srv_code drop_on_error(eng_tensor *t, srv_code rc) {
    if (rc != SRV_OK) {
        eng_free(t->data);
        t->data = NULL;
    }
    return rc;
}

/* Store n integer values (from 32- or 64-bit arrays, signed or not) into t, checking each fits the dtype;
 * numel > n repeats the last value (fill). */
static srv_code put_ints(const char *name, eng_tensor *t, int64_t numel, const void *vals, size_t n, int width,
                         int is_unsigned, srv_error *err) {
    int64_t lo = 0, hi = 0;
    int check = 1;
    switch (t->dtype) {
    case ENG_DTYPE_I8: lo = INT8_MIN, hi = INT8_MAX; break;
    case ENG_DTYPE_U8: lo = 0, hi = UINT8_MAX; break;
    case ENG_DTYPE_I16: lo = INT16_MIN, hi = INT16_MAX; break;
    case ENG_DTYPE_U16: lo = 0, hi = UINT16_MAX; break;
    case ENG_DTYPE_I32: lo = INT32_MIN, hi = INT32_MAX; break;
    case ENG_DTYPE_U32: lo = 0, hi = UINT32_MAX; break;
    case ENG_DTYPE_BOOL: lo = 0, hi = 1; break;
    default: check = 0; break; /* I64, U64: every value of the field fits */
    }
    for (int64_t i = 0; i < numel; i++) {
        size_t k = (size_t)i < n ? (size_t)i : n - 1;
        int64_t v;
        uint64_t u = 0;
        if (width == 64) {
            if (is_unsigned) u = ((const uint64_t *)vals)[k], v = (int64_t)u;
            else v = ((const int64_t *)vals)[k];
        } else {
            v = is_unsigned ? (int64_t)((const uint32_t *)vals)[k] : (int64_t)((const int32_t *)vals)[k];
        }
        if (check && (v < lo || v > hi || (is_unsigned && width == 64 && u > (uint64_t)INT64_MAX)))
            return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': value %lld at index %lld is out of range for %s",
                           name, (long long)v, (long long)k, eng_dtype_name(t->dtype));
        if (t->dtype == ENG_DTYPE_U64 && !is_unsigned && v < 0)
            return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': value %lld at index %lld is out of range for %s",
                           name, (long long)v, (long long)k, eng_dtype_name(t->dtype));
        if (t->dtype == ENG_DTYPE_U64) ((uint64_t *)t->data)[i] = is_unsigned ? u : (uint64_t)v;
        else if (t->dtype == ENG_DTYPE_BOOL) ((uint8_t *)t->data)[i] = (uint8_t)v;
        else eng_tensor_set_i64(t, i, v);
    }
    return SRV_OK;
}

srv_code srv_tfproto_decode(const Tensorflow__TensorProto *p, const char *name, size_t max_bytes, eng_tensor *t,
                            srv_error *err) {
    memset(t, 0, sizeof *t);
    t->dtype = srv_tf_dtype_from(p->dtype);
    if (t->dtype == ENG_DTYPE_UNDEFINED || t->dtype == ENG_DTYPE_STRING)
        return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': dtype %s (%d) is not supported", name, tf_name(p->dtype),
                       (int)p->dtype);
    int64_t dims[ENG_MAX_DIMS + 1];
    size_t nd = p->tensor_shape ? p->tensor_shape->n_dim : 0;
    if (p->tensor_shape && p->tensor_shape->unknown_rank)
        return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': tensor_shape has unknown_rank; a request needs its shape",
                       name);
    if (nd > ENG_MAX_DIMS)
        return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': shape has %zu dims, at most %d are supported", name, nd,
                       ENG_MAX_DIMS);
    for (size_t i = 0; i < nd; i++) dims[i] = p->tensor_shape->dim[i]->size;
    int64_t numel;
    size_t nbytes;
    srv_code rc = shape_check(name, t, dims, nd, max_bytes, &numel, &nbytes, err);
    if (rc != SRV_OK) return rc;
    char sb[200];
    const char *sh = eng_shape_str(t->dims, t->ndim, sb, sizeof sb);
    if (p->tensor_content.len > 0) {
        if (p->tensor_content.len != nbytes)
            return srv_err(err, SRV_INVALID_ARGUMENT,
                           "input '%s': tensor_content has %zu bytes, but shape %s of %s needs %zu (%lld elements x %zu)",
                           name, p->tensor_content.len, sh, tf_name(p->dtype), nbytes, (long long)numel,
                           eng_dtype_size(t->dtype));
        if ((rc = alloc_data(name, t, nbytes, err)) != SRV_OK) return rc;
        memcpy(t->data, p->tensor_content.data, nbytes);
        return SRV_OK;
    }
    /* the typed list of this dtype, and no other */
    size_t n = 0;
    const char *field = "";
    switch (t->dtype) {
    case ENG_DTYPE_F32: n = p->n_float_val, field = "float_val"; break;
    case ENG_DTYPE_F64: n = p->n_double_val, field = "double_val"; break;
    case ENG_DTYPE_F16: case ENG_DTYPE_BF16: n = p->n_half_val, field = "half_val"; break;
    case ENG_DTYPE_I64: n = p->n_int64_val, field = "int64_val"; break;
    case ENG_DTYPE_BOOL: n = p->n_bool_val, field = "bool_val"; break;
    case ENG_DTYPE_U32: n = p->n_uint32_val, field = "uint32_val"; break;
    case ENG_DTYPE_U64: n = p->n_uint64_val, field = "uint64_val"; break;
    default: n = p->n_int_val, field = "int_val"; break;
    }
    size_t total = p->n_float_val + p->n_double_val + p->n_half_val + p->n_int64_val + p->n_bool_val + p->n_uint32_val +
                   p->n_uint64_val + p->n_int_val + p->n_string_val;
    if (total != n)
        return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': dtype %s takes its values in %s (or tensor_content), "
                       "but other value fields are set", name, tf_name(p->dtype), field);
    if (numel == 0 && n == 0) return alloc_data(name, t, 0, err);
    if (n == 0)
        return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': shape %s needs %lld values, but neither %s nor "
                       "tensor_content holds any", name, sh, (long long)numel, field);
    if ((int64_t)n > numel)
        return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': %s has %zu values, but shape %s holds %lld", name, field,
                       n, sh, (long long)numel);
    if ((rc = alloc_data(name, t, nbytes, err)) != SRV_OK) return rc;
    for (int64_t i = 0; i < numel; i++) {
        size_t k = (size_t)i < n ? (size_t)i : n - 1;
        switch (t->dtype) {
        case ENG_DTYPE_F32: ((float *)t->data)[i] = p->float_val[k]; break;
        case ENG_DTYPE_F64: ((double *)t->data)[i] = p->double_val[k]; break;
        case ENG_DTYPE_F16: case ENG_DTYPE_BF16: ((uint16_t *)t->data)[i] = (uint16_t)(p->half_val[k] & 0xffff); break;
        default: i = numel; break; /* integers below */
        }
    }
    switch (t->dtype) {
    case ENG_DTYPE_F32: case ENG_DTYPE_F64: case ENG_DTYPE_F16: case ENG_DTYPE_BF16: return SRV_OK;
    case ENG_DTYPE_I64: rc = put_ints(name, t, numel, p->int64_val, n, 64, 0, err); break;
    case ENG_DTYPE_U64: rc = put_ints(name, t, numel, p->uint64_val, n, 64, 1, err); break;
    case ENG_DTYPE_U32: rc = put_ints(name, t, numel, p->uint32_val, n, 32, 1, err); break;
    case ENG_DTYPE_BOOL: rc = put_ints(name, t, numel, p->bool_val, n, 32, 0, err); break;
    default: rc = put_ints(name, t, numel, p->int_val, n, 32, 0, err); break;
    }
    return drop_on_error(t, rc);
}

srv_code srv_tfproto_encode(const eng_tensor *t, const char *name, srv_tfproto_out *o, srv_error *err) {
    tensorflow__tensor_proto__init(&o->proto);
    tensorflow__tensor_shape_proto__init(&o->shape);
    o->proto.dtype = srv_tf_dtype_to(t->dtype);
    if (o->proto.dtype == TENSORFLOW__DATA_TYPE__DT_INVALID || t->dtype == ENG_DTYPE_STRING)
        return srv_err(err, SRV_UNIMPLEMENTED, "output '%s': dtype %s cannot be sent as a TensorProto", name,
                       eng_dtype_name(t->dtype));
    for (int i = 0; i < t->ndim; i++) {
        tensorflow__tensor_shape_proto__dim__init(&o->dims[i]);
        o->dims[i].size = t->dims[i];
        o->dimp[i] = &o->dims[i];
    }
    o->shape.n_dim = (size_t)t->ndim;
    o->shape.dim = o->dimp;
    o->proto.tensor_shape = &o->shape;
    o->proto.tensor_content.len = eng_tensor_nbytes(t);
    o->proto.tensor_content.data = t->data;
    return SRV_OK;
}

/* ---- KServe v2 ---- */

srv_code srv_kserve_contents_decode(const char *name, eng_dtype dt, const int64_t *shape, size_t nshape,
                                    const Inference__InferTensorContents *c, const ProtobufCBinaryData *raw,
                                    size_t max_bytes, eng_tensor *t, srv_error *err) {
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    int64_t numel;
    size_t nbytes;
    srv_code rc = shape_check(name, t, shape, nshape, max_bytes, &numel, &nbytes, err);
    if (rc != SRV_OK) return rc;
    char sb[200];
    const char *sh = eng_shape_str(t->dims, t->ndim, sb, sizeof sb);
    if (raw) {
        if (raw->len != nbytes)
            return srv_err(err, SRV_INVALID_ARGUMENT,
                           "input '%s': raw_input_contents has %zu bytes, but shape %s of %s needs %zu", name, raw->len,
                           sh, srv_kserve_dtype(dt), nbytes);
        if ((rc = alloc_data(name, t, nbytes, err)) != SRV_OK) return rc;
        if (nbytes) memcpy(t->data, raw->data, nbytes);
        return SRV_OK;
    }
    size_t n = 0;
    const char *field = NULL;
    if (c) switch (dt) {
        case ENG_DTYPE_BOOL: n = c->n_bool_contents, field = "bool_contents"; break;
        case ENG_DTYPE_I8: case ENG_DTYPE_I16: case ENG_DTYPE_I32: n = c->n_int_contents, field = "int_contents"; break;
        case ENG_DTYPE_I64: n = c->n_int64_contents, field = "int64_contents"; break;
        case ENG_DTYPE_U8: case ENG_DTYPE_U16: case ENG_DTYPE_U32: n = c->n_uint_contents, field = "uint_contents"; break;
        case ENG_DTYPE_U64: n = c->n_uint64_contents, field = "uint64_contents"; break;
        case ENG_DTYPE_F32: n = c->n_fp32_contents, field = "fp32_contents"; break;
        case ENG_DTYPE_F64: n = c->n_fp64_contents, field = "fp64_contents"; break;
        default: break;
        }
    if (!field)
        return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': datatype %s has no typed contents field; send it in "
                       "raw_input_contents", name, srv_kserve_dtype(dt));
    size_t total = c->n_bool_contents + c->n_int_contents + c->n_int64_contents + c->n_uint_contents +
                   c->n_uint64_contents + c->n_fp32_contents + c->n_fp64_contents + c->n_bytes_contents;
    if (total != n)
        return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': datatype %s takes its values in %s, but other contents "
                       "fields are set", name, srv_kserve_dtype(dt), field);
    if ((int64_t)n != numel)
        return srv_err(err, SRV_INVALID_ARGUMENT, "input '%s': %s has %zu values, but shape %s holds %lld", name, field,
                       n, sh, (long long)numel);
    if ((rc = alloc_data(name, t, nbytes, err)) != SRV_OK) return rc;
    if (numel == 0) return SRV_OK;
    switch (dt) {
    case ENG_DTYPE_F32: memcpy(t->data, c->fp32_contents, nbytes); return SRV_OK;
    case ENG_DTYPE_F64: memcpy(t->data, c->fp64_contents, nbytes); return SRV_OK;
    case ENG_DTYPE_BOOL: rc = put_ints(name, t, numel, c->bool_contents, n, 32, 0, err); break;
    case ENG_DTYPE_I64: rc = put_ints(name, t, numel, c->int64_contents, n, 64, 0, err); break;
    case ENG_DTYPE_U64: rc = put_ints(name, t, numel, c->uint64_contents, n, 64, 1, err); break;
    case ENG_DTYPE_U8: case ENG_DTYPE_U16: case ENG_DTYPE_U32: rc = put_ints(name, t, numel, c->uint_contents, n, 32, 1, err); break;
    default: rc = put_ints(name, t, numel, c->int_contents, n, 32, 0, err); break;
    }
    return drop_on_error(t, rc);
}
