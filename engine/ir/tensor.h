/* tensor.h - dtypes and tensor views.
 *
 * eng_dtype values are ONNX's TensorProto.DataType numbers, so they can be written to disk and compared with
 * ONNX files directly; the enum is append-only. A tensor is a view: dtype, shape and a data pointer to dense
 * row-major memory it does not own. Shapes have at most ENG_MAX_DIMS dims; a rank-0 tensor has one element.
 */
#ifndef ENG_TENSOR_H
#define ENG_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define ENG_MAX_DIMS 8
/* Largest tensor we agree to allocate or describe (bytes); bigger declared sizes are refused, not attempted. */
#define ENG_MAX_TENSOR_BYTES ((int64_t)1 << 38)

typedef enum eng_dtype {
    ENG_DTYPE_UNDEFINED = 0,
    ENG_DTYPE_F32 = 1,
    ENG_DTYPE_U8 = 2,
    ENG_DTYPE_I8 = 3,
    ENG_DTYPE_U16 = 4,
    ENG_DTYPE_I16 = 5,
    ENG_DTYPE_I32 = 6,
    ENG_DTYPE_I64 = 7,
    ENG_DTYPE_STRING = 8, /* recognised, never computed on */
    ENG_DTYPE_BOOL = 9,   /* one byte, 0 or 1 */
    ENG_DTYPE_F16 = 10,
    ENG_DTYPE_F64 = 11,
    ENG_DTYPE_U32 = 12,
    ENG_DTYPE_U64 = 13,
    ENG_DTYPE_BF16 = 16,
    ENG_DTYPE_SEQUENCE = 1000, /* tensord's own, never in a TensorProto: a sequence of tensors (engine/ir/seq.h) */
} eng_dtype;

/* Bytes per element; 0 for dtypes we cannot hold (string, complex, undefined). */
size_t eng_dtype_size(eng_dtype dt);
/* "float32", "int64", ... ("dtype(N)" for unknown values; static storage). */
const char *eng_dtype_name(eng_dtype dt);
/* numpy's dtype string for .npy headers ("<f4", "|b1", ...); NULL if none. */
const char *eng_dtype_npy(eng_dtype dt);
/* Parse a name as printed by eng_dtype_name, or numpy/TF spellings (float, DT_FLOAT, FP32, f4...). */
eng_dtype eng_dtype_parse(const char *s);
int eng_dtype_is_float(eng_dtype dt); /* f16 bf16 f32 f64 */
int eng_dtype_is_int(eng_dtype dt);   /* signed/unsigned integers (not bool) */

typedef struct eng_tensor {
    eng_dtype dtype;
    int ndim;
    int64_t dims[ENG_MAX_DIMS];
    void *data; /* not owned; NULL for "absent" or "shape only" */
} eng_tensor;

/* Number of elements; -1 if a dim is negative or the product overflows int64. */
int64_t eng_shape_numel(const int64_t *dims, int ndim);
int64_t eng_tensor_numel(const eng_tensor *t);
/* Bytes of data, with overflow and ENG_MAX_TENSOR_BYTES checks; sets an error naming `what` on failure. */
eng_status eng_tensor_nbytes_checked(const eng_tensor *t, const char *what, size_t *out);
size_t eng_tensor_nbytes(const eng_tensor *t); /* unchecked: only for shapes already validated */
/* Rows [r0, r0 + rows) of t along its first dimension (t->dims[0] counts t's rows), as a view of t's data. */
eng_tensor eng_tensor_rows(const eng_tensor *t, int64_t r0, int64_t rows);
/* "[2,3,4]" into buf; returns buf. */
char *eng_shape_str(const int64_t *dims, int ndim, char *buf, size_t n);
int eng_shape_equal(const eng_tensor *a, const eng_tensor *b);
/* n tensors pairwise: same dtype, and the same shape unless the dtype is UNDEFINED (an input not fed). */
int eng_shapes_equal_n(const eng_tensor *a, const eng_tensor *b, int n);

/* Numeric conversions used across kernels. */
float eng_f16_to_f32(uint16_t h);
uint16_t eng_f32_to_f16(float f); /* round to nearest even */
float eng_bf16_to_f32(uint16_t h);
uint16_t eng_f32_to_bf16(float f); /* round to nearest even */

/* Read element i of any numeric dtype as double / int64 (bool as 0/1). */
double eng_tensor_get_f64(const eng_tensor *t, int64_t i);
int64_t eng_tensor_get_i64(const eng_tensor *t, int64_t i);
/* Write element i from double (rounded/truncated per C cast rules, f16/bf16 rounded to nearest even). */
void eng_tensor_set_f64(eng_tensor *t, int64_t i, double v);
void eng_tensor_set_i64(eng_tensor *t, int64_t i, int64_t v);

/* Convert n elements between any two numeric dtypes with ONNX Cast semantics (float->int truncates,
 * anything->bool is != 0). Returns INVALID_ARGUMENT naming the dtypes if either is not numeric. */
eng_status eng_convert(const void *src, eng_dtype sdt, void *dst, eng_dtype ddt, int64_t n);

/* 64-byte aligned allocation (NULL on failure or if nbytes exceeds ENG_MAX_TENSOR_BYTES); free with eng_free. */
void *eng_alloc(size_t nbytes);
void eng_free(void *p);
/* Give t (dtype and shape set, data NULL) eng_alloc'd memory of its size (at least 1 byte); errors name `what`. */
eng_status eng_tensor_alloc_data(eng_tensor *t, const char *what);

#endif
