"""Helpers the gRPC tests share: expect an error from a call, and check its status and message."""
import grpc
import pytest

RPC_TIMEOUT = 30


def rpc_error(fn, *a, **kw):
    """Call fn expecting a grpc.RpcError; returns it (fails if the call succeeded)."""
    kw.setdefault("timeout", RPC_TIMEOUT)
    try:
        resp = fn(*a, **kw)
    except grpc.RpcError as e:
        return e
    pytest.fail(f"call succeeded, expected an error: {str(resp)[:500]}")


def check_status(e, code, *must_contain):
    """e has status code and a non-empty message naming each of must_contain (case-insensitive); returns it."""
    assert e.code() == code, f"expected {code.name}, got {e.code().name}: {e.details()!r}"
    msg = e.details() or ""
    assert msg.strip(), f"{code.name} with an empty message"
    for s in must_contain:
        assert s.lower() in msg.lower(), f"{code.name} message does not mention {s!r}: {msg!r}"
    return msg


def predict_stub(srv):
    from tensorflow_serving.apis import prediction_service_pb2_grpc
    return prediction_service_pb2_grpc.PredictionServiceStub(srv.grpc_channel())


def grpc_version(stub, model="m", metadata=(), x=1.0):
    """A TF Serving gRPC Predict on a serving_util.version_model bundle; returns the version that answered
    (model_spec.version, checked against the answer itself)."""
    import numpy as np
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2
    rq = predict_pb2.PredictRequest()
    rq.model_spec.name = model
    rq.inputs["x"].CopyFrom(tf.make_tensor_proto(np.float32([[x]])))
    r = stub.Predict(rq, timeout=RPC_TIMEOUT, metadata=metadata)
    v = r.model_spec.version.value
    assert float(tf.make_ndarray(r.outputs["y"])[0][0]) == v
    return v
