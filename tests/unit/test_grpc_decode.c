/* test_grpc_decode.c - the gRPC request decoders without a server: the wire-format check (pbcheck.c), TensorProto
 * and KServe v2 contents -> tensors (grpc-tensor.c), and the request decoders (grpc-decode.c). Each bad input
 * must be refused with the right code and a message naming what is wrong; good ones give the exact bytes.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "server/grpc-decode.c"
#include "server/grpc-tensor.c"
#include "server/pbcheck.c"
#include "server/codec-kserve.c"
#include "server/codec-tfs.c"
#include "server/json.c"
#include "server/srv.c"
#include "kserve.pb-c.c"
#include "tensorflow.pb-c.c"
#include "tensorflow_serving.pb-c.c"
#include "wellknown.pb-c.c"

static srv_io g_inputs[2] = {
    {.name = "x", .onnx_name = "x", .dtype = ENG_DTYPE_F32, .ndim = 2, .dims = {-1, 3}},
    {.name = "k", .onnx_name = "k", .dtype = ENG_DTYPE_I8, .ndim = 1, .dims = {-1}},
};
static const srv_version_info g_info = {.model = "m", .version = 1, .inputs = g_inputs, .ninputs = 1};
static const srv_version_info g_info2 = {.model = "m", .version = 1, .inputs = g_inputs, .ninputs = 2};

typedef struct one_input {
    Tensorflow__Serving__PredictRequest rq;
    Tensorflow__Serving__PredictRequest__InputsEntry ent, *entp;
    Tensorflow__TensorProto tp;
    Tensorflow__TensorShapeProto shape;
    Tensorflow__TensorShapeProto__Dim dims[4], *dimp[4];
} one_input;

static void one_init(one_input *o, const char *name, int dtype, const int64_t *dims, int nd) {
    tensorflow__serving__predict_request__init(&o->rq);
    tensorflow__serving__predict_request__inputs_entry__init(&o->ent);
    tensorflow__tensor_proto__init(&o->tp);
    tensorflow__tensor_shape_proto__init(&o->shape);
    for (int i = 0; i < nd; i++) {
        tensorflow__tensor_shape_proto__dim__init(&o->dims[i]);
        o->dims[i].size = dims[i];
        o->dimp[i] = &o->dims[i];
    }
    o->shape.n_dim = (size_t)nd;
    o->shape.dim = o->dimp;
    o->tp.dtype = dtype;
    o->tp.tensor_shape = &o->shape;
    o->ent.key = (char *)name;
    o->ent.value = &o->tp;
    o->entp = &o->ent;
    o->rq.n_inputs = 1;
    o->rq.inputs = &o->entp;
}

/* Through the wire: pack, check, unpack, decode (what the server does). */
static srv_code decode_wire(one_input *o, const srv_version_info *info, srv_tensors *in, srv_error *err) {
    size_t n = protobuf_c_message_get_packed_size(&o->rq.base);
    uint8_t *buf = malloc(n + 1);
    protobuf_c_message_pack(&o->rq.base, buf);
    Tensorflow__Serving__PredictRequest *rq = (Tensorflow__Serving__PredictRequest *)srv_grpc_unpack(
        &tensorflow__serving__predict_request__descriptor, buf, n, 64 << 20, err);
    free(buf);
    if (!rq) return err->code;
    srv_code rc = srv_grpc_predict_decode(rq, info, 64 << 20, in, err);
    protobuf_c_message_free_unpacked(&rq->base, NULL);
    return rc;
}

Test(grpc_decode, tensor_content_exact_bytes) {
    float x[6] = {1, 2, 3, 4, 5, -6.5f};
    one_input o;
    one_init(&o, "x", TENSORFLOW__DATA_TYPE__DT_FLOAT, (int64_t[]){2, 3}, 2);
    o.tp.tensor_content = srv_pb_bytes(x, sizeof x);
    srv_tensors in = {0};
    srv_error err = {0};
    cr_assert_eq(decode_wire(&o, &g_info, &in, &err), SRV_OK, "%s", err.msg);
    cr_assert_eq(in.n, 1);
    cr_expect_str_eq(in.names[0], "x");
    cr_expect_eq(in.t[0].dtype, ENG_DTYPE_F32);
    cr_expect(in.t[0].ndim == 2 && in.t[0].dims[0] == 2 && in.t[0].dims[1] == 3);
    cr_expect(memcmp(in.t[0].data, x, sizeof x) == 0);
    srv_tensors_free(&in);
}

Test(grpc_decode, tensor_content_length_disagrees) {
    float x[5] = {0};
    one_input o;
    one_init(&o, "x", TENSORFLOW__DATA_TYPE__DT_FLOAT, (int64_t[]){2, 3}, 2);
    o.tp.tensor_content = srv_pb_bytes(x, sizeof x);
    srv_tensors in = {0};
    srv_error err = {0};
    cr_assert_eq(decode_wire(&o, &g_info, &in, &err), SRV_INVALID_ARGUMENT);
    cr_expect(strstr(err.msg, "'x'") && strstr(err.msg, "20 bytes") && strstr(err.msg, "needs 24"), "%s", err.msg);
    cr_expect_eq(in.n, 0);
}

Test(grpc_decode, huge_shape_refused_before_allocating) {
    float x = 1;
    one_input o;
    one_init(&o, "x", TENSORFLOW__DATA_TYPE__DT_FLOAT, (int64_t[]){1 << 20, 1 << 20}, 2); /* 2^40 elements */
    o.tp.n_float_val = 1;
    o.tp.float_val = &x;
    srv_tensors in = {0};
    srv_error err = {0};
    cr_assert_eq(decode_wire(&o, &g_info, &in, &err), SRV_INVALID_ARGUMENT);
    cr_expect(strstr(err.msg, "too many elements") && strstr(err.msg, "[1048576,1048576]"), "%s", err.msg);
    o.tp.n_float_val = 0;
    o.tp.tensor_content = srv_pb_bytes(&x, sizeof x);
    cr_assert_eq(decode_wire(&o, &g_info, &in, &err), SRV_INVALID_ARGUMENT);
    int64_t neg[2] = {-1, 3};
    one_init(&o, "x", TENSORFLOW__DATA_TYPE__DT_FLOAT, neg, 2);
    o.tp.tensor_content = srv_pb_bytes(&x, sizeof x);
    cr_assert_eq(decode_wire(&o, &g_info, &in, &err), SRV_INVALID_ARGUMENT);
    cr_expect(strstr(err.msg, "dim 0 is -1"), "%s", err.msg);
}

Test(grpc_decode, typed_values_fill_and_limits) {
    float v[2] = {7, 8};
    one_input o;
    one_init(&o, "x", TENSORFLOW__DATA_TYPE__DT_FLOAT, (int64_t[]){1, 3}, 2);
    o.tp.n_float_val = 2;
    o.tp.float_val = v;
    srv_tensors in = {0};
    srv_error err = {0};
    cr_assert_eq(decode_wire(&o, &g_info, &in, &err), SRV_OK, "%s", err.msg);
    const float *f = in.t[0].data;
    cr_expect(f[0] == 7 && f[1] == 8 && f[2] == 8, "fewer values repeat the last (TensorFlow's rule)");
    srv_tensors_free(&in);
    float many[4] = {1, 2, 3, 4};
    o.tp.n_float_val = 4;
    o.tp.float_val = many;
    cr_assert_eq(decode_wire(&o, &g_info, &in, &err), SRV_INVALID_ARGUMENT);
    cr_expect(strstr(err.msg, "float_val has 4 values") != NULL, "%s", err.msg);
    int32_t iv[3] = {1, 2, 3};
    o.tp.n_float_val = 0;
    o.tp.n_int_val = 3;
    o.tp.int_val = iv;
    cr_assert_eq(decode_wire(&o, &g_info, &in, &err), SRV_INVALID_ARGUMENT);
    cr_expect(strstr(err.msg, "float_val") && strstr(err.msg, "other value fields"), "%s", err.msg);
    o.tp.n_int_val = 0;
    cr_assert_eq(decode_wire(&o, &g_info, &in, &err), SRV_INVALID_ARGUMENT);
    cr_expect(strstr(err.msg, "needs 3 values") != NULL, "%s", err.msg);
}

Test(grpc_decode, int8_range_half_and_bool) {
    int32_t iv[2] = {5, 300};
    one_input o;
    one_init(&o, "k", TENSORFLOW__DATA_TYPE__DT_INT8, (int64_t[]){2}, 1);
    o.tp.n_int_val = 2;
    o.tp.int_val = iv;
    srv_tensors in = {0};
    srv_error err = {0};
    cr_assert_eq(decode_wire(&o, &g_info2, &in, &err), SRV_INVALID_ARGUMENT);
    cr_expect(strstr(err.msg, "300") && strstr(err.msg, "out of range"), "%s", err.msg);
    iv[1] = -7;
    cr_assert_eq(decode_wire(&o, &g_info2, &in, &err), SRV_OK, "%s", err.msg);
    cr_expect(((int8_t *)in.t[0].data)[0] == 5 && ((int8_t *)in.t[0].data)[1] == -7);
    srv_tensors_free(&in);
    /* half_val carries the 16 bits of each value */
    eng_tensor t;
    Tensorflow__TensorProto tp = TENSORFLOW__TENSOR_PROTO__INIT;
    Tensorflow__TensorShapeProto sh = TENSORFLOW__TENSOR_SHAPE_PROTO__INIT;
    Tensorflow__TensorShapeProto__Dim d = TENSORFLOW__TENSOR_SHAPE_PROTO__DIM__INIT, *dp = &d;
    d.size = 2;
    sh.n_dim = 1;
    sh.dim = &dp;
    tp.tensor_shape = &sh;
    tp.dtype = TENSORFLOW__DATA_TYPE__DT_HALF;
    int32_t hv[2] = {0x3c00, 0xc000}; /* 1.0, -2.0 */
    tp.n_half_val = 2;
    tp.half_val = hv;
    cr_assert_eq(srv_tfproto_decode(&tp, "h", 1 << 20, &t, &err), SRV_OK, "%s", err.msg);
    cr_expect(eng_f16_to_f32(((uint16_t *)t.data)[0]) == 1.0f && eng_f16_to_f32(((uint16_t *)t.data)[1]) == -2.0f);
    eng_free(t.data);
    tp.dtype = TENSORFLOW__DATA_TYPE__DT_BOOL;
    tp.n_half_val = 0;
    protobuf_c_boolean bv[2] = {1, 0};
    tp.n_bool_val = 2;
    tp.bool_val = bv;
    cr_assert_eq(srv_tfproto_decode(&tp, "b", 1 << 20, &t, &err), SRV_OK, "%s", err.msg);
    cr_expect(((uint8_t *)t.data)[0] == 1 && ((uint8_t *)t.data)[1] == 0);
    eng_free(t.data);
    tp.dtype = TENSORFLOW__DATA_TYPE__DT_STRING;
    cr_expect_eq(srv_tfproto_decode(&tp, "s", 1 << 20, &t, &err), SRV_INVALID_ARGUMENT);
    cr_expect(strstr(err.msg, "DT_STRING") != NULL, "%s", err.msg);
}

Test(grpc_decode, unknown_and_repeated_inputs) {
    float x[3] = {0};
    one_input o;
    one_init(&o, "nope", TENSORFLOW__DATA_TYPE__DT_FLOAT, (int64_t[]){1, 3}, 2);
    o.tp.tensor_content = srv_pb_bytes(x, sizeof x);
    srv_tensors in = {0};
    srv_error err = {0};
    cr_assert_eq(decode_wire(&o, &g_info, &in, &err), SRV_INVALID_ARGUMENT);
    cr_expect(strstr(err.msg, "unknown input 'nope'") && strstr(err.msg, "'x'"), "%s", err.msg);
    /* a map key given twice on the wire */
    o.ent.key = "x";
    Tensorflow__Serving__PredictRequest__InputsEntry *two[2] = {&o.ent, &o.ent};
    o.rq.n_inputs = 2;
    o.rq.inputs = two;
    cr_assert_eq(decode_wire(&o, &g_info, &in, &err), SRV_INVALID_ARGUMENT);
    cr_expect(strstr(err.msg, "given twice") != NULL, "%s", err.msg);
    o.rq.n_inputs = 0;
    cr_assert_eq(decode_wire(&o, &g_info, &in, &err), SRV_INVALID_ARGUMENT);
    cr_expect(strstr(err.msg, "no inputs") != NULL, "%s", err.msg);
}

Test(grpc_decode, wire_check) {
    float x[6] = {0};
    one_input o;
    one_init(&o, "x", TENSORFLOW__DATA_TYPE__DT_FLOAT, (int64_t[]){2, 3}, 2);
    o.tp.tensor_content = srv_pb_bytes(x, sizeof x);
    size_t n = protobuf_c_message_get_packed_size(&o.rq.base);
    uint8_t *buf = malloc(n);
    protobuf_c_message_pack(&o.rq.base, buf);
    srv_error err = {0};
    size_t cost = 0;
    cr_expect_eq(srv_pb_check(&tensorflow__serving__predict_request__descriptor, buf, n, 1 << 20, &cost, &err), 0, "%s",
                 err.msg);
    cr_expect(cost >= sizeof x, "cost %zu", cost);
    for (size_t cut = 1; cut < n; cut++) { /* every truncation is refused, by the check or by protobuf-c */
        ProtobufCMessage *m = srv_grpc_unpack(&tensorflow__serving__predict_request__descriptor, buf, cut, 1 << 20, &err);
        if (m) {
            protobuf_c_message_free_unpacked(m, NULL);
            continue; /* a cut at a field boundary is a valid (shorter) message */
        }
        cr_expect_eq(err.code, SRV_INVALID_ARGUMENT, "cut at %zu: %s", cut, err.msg);
    }
    cr_expect_eq(srv_pb_check(&tensorflow__serving__predict_request__descriptor, buf, n, 16, &cost, &err), -1);
    cr_expect_eq(err.code, SRV_RESOURCE_EXHAUSTED, "%s", err.msg);
    uint8_t group[] = {0x0b, 0x0c}; /* field 1, start group / end group */
    cr_expect_eq(srv_pb_check(&tensorflow__serving__predict_request__descriptor, group, 2, 1 << 20, NULL, &err), -1);
    cr_expect_eq(err.code, SRV_INVALID_ARGUMENT);
    /* 100,000 empty inputs entries: 3 bytes each on the wire, far more once unpacked */
    size_t k = 100000;
    uint8_t *many = malloc(2 * k);
    for (size_t i = 0; i < k; i++) many[2 * i] = 0x12, many[2 * i + 1] = 0x00;
    cr_expect_eq(srv_pb_check(&tensorflow__serving__predict_request__descriptor, many, 2 * k, 1 << 20, &cost, &err), -1);
    cr_expect_eq(err.code, SRV_RESOURCE_EXHAUSTED, "%s", err.msg);
    free(many);
    free(buf);
}

Test(grpc_decode, kserve_inputs) {
    Inference__ModelInferRequest rq = INFERENCE__MODEL_INFER_REQUEST__INIT;
    Inference__ModelInferRequest__InferInputTensor x = INFERENCE__MODEL_INFER_REQUEST__INFER_INPUT_TENSOR__INIT, *xp = &x;
    Inference__InferTensorContents c = INFERENCE__INFER_TENSOR_CONTENTS__INIT;
    int64_t shape[2] = {1, 3};
    float v[3] = {1, 2, 3};
    x.name = "x";
    x.datatype = "FP32";
    x.n_shape = 2;
    x.shape = shape;
    c.n_fp32_contents = 3;
    c.fp32_contents = v;
    x.contents = &c;
    rq.n_inputs = 1;
    rq.inputs = &xp;
    srv_tensors in = {0};
    srv_error err = {0};
    cr_assert_eq(srv_grpc_infer_decode(&rq, &g_info, 1 << 20, &in, &err), SRV_OK, "%s", err.msg);
    cr_expect(memcmp(in.t[0].data, v, sizeof v) == 0);
    srv_tensors_free(&in);
    c.n_fp32_contents = 2;
    cr_assert_eq(srv_grpc_infer_decode(&rq, &g_info, 1 << 20, &in, &err), SRV_INVALID_ARGUMENT);
    cr_expect(strstr(err.msg, "fp32_contents has 2 values") != NULL, "%s", err.msg);
    x.datatype = "FP64";
    cr_assert_eq(srv_grpc_infer_decode(&rq, &g_info, 1 << 20, &in, &err), SRV_INVALID_ARGUMENT);
    cr_expect(strstr(err.msg, "expecting FP32") != NULL, "%s", err.msg);
    x.datatype = "FP32";
    x.contents = NULL;
    ProtobufCBinaryData raw = srv_pb_bytes(v, 8);
    rq.n_raw_input_contents = 1;
    rq.raw_input_contents = &raw;
    cr_assert_eq(srv_grpc_infer_decode(&rq, &g_info, 1 << 20, &in, &err), SRV_INVALID_ARGUMENT);
    cr_expect(strstr(err.msg, "raw_input_contents has 8 bytes") != NULL, "%s", err.msg);
    raw.len = sizeof v;
    cr_assert_eq(srv_grpc_infer_decode(&rq, &g_info, 1 << 20, &in, &err), SRV_OK, "%s", err.msg);
    cr_expect(memcmp(in.t[0].data, v, sizeof v) == 0);
    srv_tensors_free(&in);
    rq.n_raw_input_contents = 2;
    ProtobufCBinaryData raws[2] = {raw, raw};
    rq.raw_input_contents = raws;
    cr_assert_eq(srv_grpc_infer_decode(&rq, &g_info, 1 << 20, &in, &err), SRV_INVALID_ARGUMENT);
    cr_expect(strstr(err.msg, "2 entries for 1 inputs") != NULL, "%s", err.msg);
}

Test(grpc_decode, examples_to_rows) {
    float a[3] = {1, 2, 3}, b[3] = {4, 5, 6};
    Tensorflow__FloatList fa = TENSORFLOW__FLOAT_LIST__INIT, fb = TENSORFLOW__FLOAT_LIST__INIT;
    fa.n_value = fb.n_value = 3;
    fa.value = a;
    fb.value = b;
    Tensorflow__Feature f[2] = {TENSORFLOW__FEATURE__INIT, TENSORFLOW__FEATURE__INIT};
    f[0].kind_case = f[1].kind_case = TENSORFLOW__FEATURE__KIND_FLOAT_LIST;
    f[0].float_list = &fa;
    f[1].float_list = &fb;
    Tensorflow__Features__FeatureEntry fe[2] = {TENSORFLOW__FEATURES__FEATURE_ENTRY__INIT,
                                                TENSORFLOW__FEATURES__FEATURE_ENTRY__INIT};
    Tensorflow__Features__FeatureEntry *fep[2] = {&fe[0], &fe[1]};
    Tensorflow__Features fs[2] = {TENSORFLOW__FEATURES__INIT, TENSORFLOW__FEATURES__INIT};
    Tensorflow__Example ex[2] = {TENSORFLOW__EXAMPLE__INIT, TENSORFLOW__EXAMPLE__INIT};
    Tensorflow__Example *exp_[2] = {&ex[0], &ex[1]};
    for (int i = 0; i < 2; i++) {
        fe[i].key = "x";
        fe[i].value = &f[i];
        fs[i].n_feature = 1;
        fs[i].feature = &fep[i];
        ex[i].features = &fs[i];
    }
    Tensorflow__Serving__ExampleList el = TENSORFLOW__SERVING__EXAMPLE_LIST__INIT;
    el.n_examples = 2;
    el.examples = exp_;
    Tensorflow__Serving__Input input = TENSORFLOW__SERVING__INPUT__INIT;
    input.kind_case = TENSORFLOW__SERVING__INPUT__KIND_EXAMPLE_LIST;
    input.example_list = &el;
    srv_tensors in = {0};
    srv_error err = {0};
    cr_assert_eq(srv_grpc_examples_decode(&input, &g_info, 1 << 20, &in, &err), SRV_OK, "%s", err.msg);
    cr_expect(in.t[0].ndim == 2 && in.t[0].dims[0] == 2 && in.t[0].dims[1] == 3);
    const float *y = in.t[0].data;
    cr_expect(y[0] == 1 && y[3] == 4 && y[5] == 6);
    srv_tensors_free(&in);
    fb.n_value = 2;
    cr_assert_eq(srv_grpc_examples_decode(&input, &g_info, 1 << 20, &in, &err), SRV_INVALID_ARGUMENT);
    cr_expect(strstr(err.msg, "2 values in example 1") != NULL, "%s", err.msg);
    el.n_examples = 0;
    cr_assert_eq(srv_grpc_examples_decode(&input, &g_info, 1 << 20, &in, &err), SRV_INVALID_ARGUMENT);
}

Test(grpc_decode, tensorproto_encode_round_trip) {
    int64_t v[6] = {1, -2, 3, 1LL << 40, 5, 6};
    eng_tensor t = {.dtype = ENG_DTYPE_I64, .ndim = 2, .dims = {3, 2}, .data = v};
    srv_tfproto_out o;
    srv_error err = {0};
    cr_assert_eq(srv_tfproto_encode(&t, "y", &o, &err), SRV_OK, "%s", err.msg);
    cr_expect_eq(o.proto.dtype, TENSORFLOW__DATA_TYPE__DT_INT64);
    eng_tensor back;
    cr_assert_eq(srv_tfproto_decode(&o.proto, "y", 1 << 20, &back, &err), SRV_OK, "%s", err.msg);
    cr_expect(back.ndim == 2 && back.dims[0] == 3 && back.dims[1] == 2);
    cr_expect(memcmp(back.data, v, sizeof v) == 0);
    eng_free(back.data);
}
