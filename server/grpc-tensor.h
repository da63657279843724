/* grpc-tensor.h - tensors <-> TensorFlow's TensorProto and KServe v2's tensor contents (grpc-tensor.c). */
#ifndef SRV_GRPC_TENSOR_H
#define SRV_GRPC_TENSOR_H

#include "codec.h"
#include "kserve.pb-c.h"
#include "pbcheck.h"
#include "srv.h"
#include "tensorflow.pb-c.h"

/* TF DataType number <-> dtype (ENG_DTYPE_UNDEFINED / DT_INVALID when there is none). */
eng_dtype srv_tf_dtype_from(int tf);
int srv_tf_dtype_to(eng_dtype dt);

/* A TensorProto (tensor_content, or the typed value list of its dtype) -> t (data eng_alloc'd; the caller frees
 * it). name names the input in errors; a tensor over max_bytes is refused before anything is allocated. */
srv_code srv_tfproto_decode(const Tensorflow__TensorProto *p, const char *name, size_t max_bytes, eng_tensor *t,
                            srv_error *err);

/* A TensorProto of t as tensor_content, pointing at t's data (valid while t is). */
typedef struct srv_tfproto_out {
    Tensorflow__TensorProto proto;
    Tensorflow__TensorShapeProto shape;
    Tensorflow__TensorShapeProto__Dim dims[ENG_MAX_DIMS];
    Tensorflow__TensorShapeProto__Dim *dimp[ENG_MAX_DIMS];
} srv_tfproto_out;
srv_code srv_tfproto_encode(const eng_tensor *t, const char *name, srv_tfproto_out *o, srv_error *err);

/* KServe v2: an input of datatype dt and shape from raw bytes (raw non-NULL) or typed contents (c, may be NULL)
 * -> t (eng_alloc'd data). */
srv_code srv_kserve_contents_decode(const char *name, eng_dtype dt, const int64_t *shape, size_t nshape,
                                    const Inference__InferTensorContents *c, const ProtobufCBinaryData *raw,
                                    size_t max_bytes, eng_tensor *t, srv_error *err);

#endif
