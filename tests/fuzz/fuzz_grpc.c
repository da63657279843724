/* fuzz_grpc.c - libFuzzer target for the gRPC request decoders: the first byte picks TF Serving's PredictRequest,
 * ClassificationRequest or KServe v2's ModelInferRequest, the rest goes through the server's own path (the wire
 * check and protobuf-c unpack of pbcheck.c, then grpc-decode.c against a two-input signature). Any byte string must
 * come back as a status, within the memory bound. */
#include <stddef.h>
#include <stdint.h>

#include "server/codec-kserve.c"
#include "server/codec-tfs.c"
#include "server/grpc-decode.c"
#include "server/grpc-tensor.c"
#include "server/json.c"
#include "server/pbcheck.c"
#include "server/srv.c"
#include "kserve.pb-c.c"
#include "tensorflow.pb-c.c"
#include "tensorflow_serving.pb-c.c"
#include "wellknown.pb-c.c"

static srv_io fz_inputs[2] = {
    {.name = "x", .onnx_name = "x", .dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {-1, 3}},
    {.name = "k", .onnx_name = "k", .dtype = ENG_DTYPE_I64, .ndim = 1, .dims = {-1}},
};
static const srv_version_info fz_info = {.model = "m", .version = 1, .inputs = fz_inputs, .ninputs = 2};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static const ProtobufCMessageDescriptor *const descs[3] = {&tensorflow__serving__predict_request__descriptor,
                                                               &tensorflow__serving__classification_request__descriptor,
                                                               &inference__model_infer_request__descriptor};
    int which = data[0] % 3;
    srv_error err = {0};
    ProtobufCMessage *m = srv_grpc_unpack(descs[which], data + 1, size - 1, 64 << 20, &err);
    if (!m) return 0;
    srv_tensors in = {0};
    const size_t max = 16 << 20;
    if (which == 0) srv_grpc_predict_decode((Tensorflow__Serving__PredictRequest *)m, &fz_info, max, &in, &err);
    else if (which == 1)
        srv_grpc_examples_decode(((Tensorflow__Serving__ClassificationRequest *)m)->input, &fz_info, max, &in, &err);
    else srv_grpc_infer_decode((Inference__ModelInferRequest *)m, &fz_info, max, &in, &err);
    srv_tensors_free(&in);
    protobuf_c_message_free_unpacked(m, NULL);
    return 0;
}
