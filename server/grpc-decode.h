/* grpc-decode.h - gRPC requests -> a version's inputs (grpc-decode.c): the request decoders the fuzz target
 * feeds. Each returns INVALID_ARGUMENT naming the input (expected vs got) and leaves `in` empty on failure;
 * max_bytes bounds each decoded tensor. */
#ifndef SRV_GRPC_DECODE_H
#define SRV_GRPC_DECODE_H

#include "grpc-tensor.h"
#include "registry.h"
#include "tensorflow_serving.pb-c.h"

/* "" and "serving_default" are the one signature every version serves. */
srv_code srv_signature_check(const char *signature_name, srv_error *err);
srv_code srv_grpc_predict_decode(const Tensorflow__Serving__PredictRequest *rq, const srv_version_info *info,
                                 size_t max_bytes, srv_tensors *in, srv_error *err);
/* Classify / Regress: one row per tf.Example, each input from the feature of its name (context features too). */
srv_code srv_grpc_examples_decode(const Tensorflow__Serving__Input *input, const srv_version_info *info,
                                  size_t max_bytes, srv_tensors *in, srv_error *err);
srv_code srv_grpc_infer_decode(const Inference__ModelInferRequest *rq, const srv_version_info *info, size_t max_bytes,
                               srv_tensors *in, srv_error *err);

#endif
