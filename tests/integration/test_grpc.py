"""The gRPC front door (issue 10) with the clients users have: tensorflow-serving-api (PredictionService,
ModelService), tritonclient.grpc (KServe v2 GRPCInferenceService) and grpcio-health-checking, against the real
`tensord serve --port=P` on loopback.

Reference answers come from the same server's REST front door and from no code of ours:
  - float outputs are compared BIT FOR BIT with REST v2 infer with binary_data_output (raw little-endian bytes),
    and with REST :predict (its JSON floats are the shortest text strtof reads back, so they round-trip exactly
    through float32); within conftest's tolerance with onnxruntime;
  - integer, double and bool outputs are compared exactly with numpy (and onnxruntime) on the same inputs.

Models (module fixture `srv`):
  m      x float [N,4] -> y [N,4]                   serving_util.mm_model
  cnn    x float [N,1,28,28] -> y [N,10]            the seed CNN
  cls    x float [N,4] -> probs [N,3]               classifier_model, labels from signature.json
  reg    x float [N,4] -> y [N,1]                   regress_model
  two    a, b float [N,3] -> y = 2a + b             two_input_model
  pair   a, b float [N,3] -> s = a + b, p = a * b   two outputs, for output_filter
  t_i64 / t_i32 / t_f64 / t_f16   x [N,2] -> y = x + c  in that dtype;  t_bool  x bool [N,2] -> y = Not(x)
  v      y = x*0 + version, versions 1, 2, 3 (policy all), labels stable -> 1, canary -> 2
Other tests start their own servers (reload config, explicit model control, health while not ready, hot swap,
two execution instances).
"""
import ipaddress
import json
import os
import shutil
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
import tritonclient.grpc as tgrpc  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2  # noqa: E402
from tensorflow_serving.apis import (classification_pb2, get_model_metadata_pb2, get_model_status_pb2,  # noqa: E402
                                     model_management_pb2, model_service_pb2_grpc, predict_pb2,
                                     prediction_service_pb2_grpc, regression_pb2)
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

import serving_util as u  # noqa: E402
from grpc_util import RPC_TIMEOUT, check_status, rpc_error  # noqa: E402,F401

CLASS_LABELS = ["cat", "dog", "bird"]
AVAILABLE = get_model_status_pb2.ModelVersionStatus.AVAILABLE
END = get_model_status_pb2.ModelVersionStatus.END


# ----------------------------------------------------------------------------------------------------------------
# models and helpers

def typed_model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
                          initializer=[numpy_helper.from_array(np.asarray(a), n) for n, a in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", u.OPSET)], producer_name="tensord-tests")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


# name -> (onnx elem type, numpy dtype, constant added or None for Not)
TYPED = {"t_i64": (TensorProto.INT64, np.int64, np.int64([3, -(1 << 40)])),
         "t_i32": (TensorProto.INT32, np.int32, np.int32([7, -100000])),
         "t_f64": (TensorProto.DOUBLE, np.float64, np.float64([0.1, -1e-300])),
         "t_f16": (TensorProto.FLOAT16, np.float16, np.float16([0.5, -2.0])),
         "t_bool": (TensorProto.BOOL, np.bool_, None)}


def add_const_model(elem, c):
    return typed_model([helper.make_node("Add", ["x", "c"], ["y"])], [("x", elem, ["N", 2])], [("y", elem, ["N", 2])],
                       [("c", c)])


def not_model():
    return typed_model([helper.make_node("Not", ["x"], ["y"])], [("x", TensorProto.BOOL, ["N", 2])],
                       [("y", TensorProto.BOOL, ["N", 2])])


def pair_model():
    F = TensorProto.FLOAT
    return typed_model([helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Mul", ["a", "b"], ["p"])],
                       [("a", F, ["N", 3]), ("b", F, ["N", 3])], [("s", F, ["N", 3]), ("p", F, ["N", 3])])


def ort_typed(model, feeds):
    """onnxruntime on feeds of any dtype (serving_util.ort_run casts to float32)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(names, feeds)))


def bits_equal(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    if got.dtype.kind == "f":
        g, w = got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}")
        diff = np.flatnonzero(g.reshape(-1) != w.reshape(-1))
        assert diff.size == 0, (f"{what}: {diff.size} of {got.size} values differ in their bits, first at flat index "
                                f"{diff[0]}: {got.reshape(-1)[diff[0]]!r} vs {want.reshape(-1)[diff[0]]!r}")
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


V2_DTYPES = {np.dtype(np.float32): "FP32", np.dtype(np.float64): "FP64", np.dtype(np.int64): "INT64",
             np.dtype(np.int32): "INT32", np.dtype(np.bool_): "BOOL", np.dtype(np.float16): "FP16"}
V2_NUMPY = {v: k for k, v in V2_DTYPES.items()}


def rest_v2_binary(srv, model, feeds, version=None):
    """REST v2 infer with binary inputs and binary_data_output: {output name: array of the raw reply bytes}."""
    arrs = [(n, np.ascontiguousarray(a)) for n, a in feeds.items()]
    hdr = {"inputs": [{"name": n, "shape": list(a.shape), "datatype": V2_DTYPES[a.dtype],
                       "parameters": {"binary_data_size": a.nbytes}} for n, a in arrs],
           "parameters": {"binary_data_output": True}}
    js = json.dumps(hdr).encode()
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    r = srv.post(path, data=js + b"".join(a.astype(a.dtype.newbyteorder("<")).tobytes() for _, a in arrs),
                 headers={"Inference-Header-Content-Length": str(len(js)), "Content-Type": "application/octet-stream"})
    assert r.status_code == 200, f"REST v2 {path}: HTTP {r.status_code}: {r.content[:500]!r}"
    n = int(r.headers["Inference-Header-Content-Length"])
    head = json.loads(r.content[:n])
    pos, out = n, {}
    for o in head["outputs"]:
        size = o["parameters"]["binary_data_size"]
        out[o["name"]] = np.frombuffer(r.content[pos:pos + size], dtype=V2_NUMPY[o["datatype"]]).reshape(o["shape"])
        pos += size
    return out


def rest_predict(srv, model, feeds, path_suffix=""):
    """REST :predict in the columnar form: {output name: float32 array} (single output: the model's one name)."""
    body = {"inputs": {n: a.tolist() for n, a in feeds.items()}}
    r = srv.post_json(f"/v1/models/{model}{path_suffix}:predict", body)
    assert r.status_code == 200, f"REST :predict {model}: HTTP {r.status_code}: {r.content[:500]!r}"
    return r.json()["outputs"]


def tensor(arr):
    """The tensor_content form, as a user writes it: tf.make_tensor_proto of a numpy array. For bool, which
    make_tensor_proto writes as bool_val, the content (one byte per element, as TensorFlow reads it) by hand."""
    arr = np.ascontiguousarray(arr)
    tp = tf.make_tensor_proto(arr)
    if not tp.tensor_content and arr.dtype == np.bool_:
        tp = tensor_pb2.TensorProto(dtype=types_pb2.DT_BOOL, tensor_shape=shape_proto(arr.shape),
                                    tensor_content=arr.astype(np.uint8).tobytes())
    assert tp.tensor_content or arr.size <= 1, "make_tensor_proto did not use tensor_content"
    return tp


def shape_proto(shape):
    return tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in shape])


def val_tensor(arr):
    """The typed *_val form of arr (float_val, double_val, int_val, int64_val, half_val, bool_val)."""
    arr = np.asarray(arr)
    flat = arr.reshape(-1)
    tp = tensor_pb2.TensorProto(tensor_shape=shape_proto(arr.shape))
    if arr.dtype == np.float32:
        tp.dtype = types_pb2.DT_FLOAT
        tp.float_val.extend(flat.tolist())
    elif arr.dtype == np.float64:
        tp.dtype = types_pb2.DT_DOUBLE
        tp.double_val.extend(flat.tolist())
    elif arr.dtype == np.int32:
        tp.dtype = types_pb2.DT_INT32
        tp.int_val.extend(flat.tolist())
    elif arr.dtype == np.int64:
        tp.dtype = types_pb2.DT_INT64
        tp.int64_val.extend(flat.tolist())
    elif arr.dtype == np.float16:
        tp.dtype = types_pb2.DT_HALF
        tp.half_val.extend(flat.view(np.uint16).astype(np.int32).tolist())  # the IEEE half bits, as TF writes them
    elif arr.dtype == np.bool_:
        tp.dtype = types_pb2.DT_BOOL
        tp.bool_val.extend(flat.tolist())
    else:
        raise AssertionError(arr.dtype)
    assert not tp.tensor_content
    return tp


def decode(tp, what):
    """A reply TensorProto -> numpy; it must use tensor_content (the spec) and no *_val field."""
    vals = [f.name for f, _ in tp.ListFields() if f.name.endswith("_val")]
    assert not vals, f"{what}: reply tensor uses {vals}, expected tensor_content"
    return tf.make_ndarray(tp)


def predict_req(model, feeds, version=None, label=None, signature=None, output_filter=(), form=tensor):
    req = predict_pb2.PredictRequest()
    req.model_spec.name = model
    if version is not None:
        req.model_spec.version.value = version
    if label is not None:
        req.model_spec.version_label = label
    if signature is not None:
        req.model_spec.signature_name = signature
    for n, a in feeds.items():
        req.inputs[n].CopyFrom(a if isinstance(a, tensor_pb2.TensorProto) else form(a))
    req.output_filter.extend(output_filter)
    return req


def version_status_of(srv, name):
    r = srv.get(f"/v1/models/{name}", timeout=10)
    if r.status_code != 200:
        return {}
    return {int(e["version"]): e for e in r.json()["model_version_status"]}


def wait_for(cond, timeout, what, srv):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout} s waiting for {what}\n{srv.describe()}")


class Stubs:
    def __init__(self, srv, options=()):
        self.channel = srv.grpc_channel(options)
        self.predict = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)
        self.model = model_service_pb2_grpc.ModelServiceStub(self.channel)
        self.kserve = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def close(self):
        self.channel.close()


# ----------------------------------------------------------------------------------------------------------------
# the module server

@pytest.fixture(scope="module")
def models():
    ms = {"m": u.mm_model(4, 4, seed=8), "cnn": u.cnn_model(), "cls": u.classifier_model(4, 3),
          "reg": u.regress_model(4), "two": u.two_input_model(3), "pair": pair_model(), "t_bool": not_model()}
    for name, (elem, _, c) in TYPED.items():
        if c is not None:
            ms[name] = add_const_model(elem, c)
    return ms


@pytest.fixture(scope="module")
def srv(tmp_path_factory, models):
    tmp = tmp_path_factory.mktemp("grpc")
    cfg = []
    for name, model in models.items():
        base = tmp / "models" / name
        u.write_version(base, 1, model, signature={"labels": CLASS_LABELS} if name == "cls" else None)
        cfg.append({"name": name, "base_path": str(base)})
    for v in (1, 2, 3):
        u.write_version(tmp / "models" / "v", v, u.version_model(v))
    cfg.append({"name": "v", "base_path": str(tmp / "models" / "v"), "policy": "all",
                "labels": {"stable": 1, "canary": 2}})
    conf = u.write_text(tmp / "models.config", u.model_config_text(cfg))
    s = u.Server(tmp, config_file=conf, grpc=True)
    wait_for(lambda: len(version_status_of(s, "v")) == 3 and
             all(e["state"] == "AVAILABLE" for e in version_status_of(s, "v").values()), 30, "v 1..3 AVAILABLE", s)
    yield s
    u.server_fixture_finalize(s)


@pytest.fixture(scope="module")
def stubs(srv):
    st = Stubs(srv)
    yield st
    st.close()


def grpc_predict(stubs, req, what):
    try:
        return stubs.predict.Predict(req, timeout=RPC_TIMEOUT)
    except grpc.RpcError as e:
        pytest.fail(f"{what}: Predict failed with {e.code().name}: {e.details()!r}")


# ----------------------------------------------------------------------------------------------------------------
# the flags: --port (0 = off), --grpc_api_host (defaults to --rest_api_host)

def listening(pid):
    """{(ip, port)} of the TCP sockets process pid listens on (from /proc/<pid>/fd and /proc/net/tcp{,6})."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    out = set()
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] != "0A" or f[9] not in inodes:  # 0A: LISTEN
                continue
            addr, port = f[1].split(":")
            if v6:  # four 32-bit words in host order; a v4-mapped address reads as its IPv4 form
                a6 = ipaddress.IPv6Address(b"".join(bytes.fromhex(addr[i:i + 8])[::-1] for i in range(0, 32, 8)))
                ip = str(a6.ipv4_mapped or a6)
            else:
                ip = ".".join(str(int(addr[i:i + 2], 16)) for i in (6, 4, 2, 0))
            out.add((ip, int(port, 16)))
    return out


def test_grpc_port_and_host_flags(tmp_path):
    u.write_version(tmp_path / "m", 1, u.mm_model(seed=81))
    with u.Server(tmp_path, base_path=str(tmp_path / "m")) as s:  # --port=0: no gRPC listener
        assert listening(s.proc.pid) == {("127.0.0.1", s.port)}, \
            f"with --port=0 only REST listens: {listening(s.proc.pid)} (REST {s.port})"
    with u.Server(tmp_path, base_path=str(tmp_path / "m"), grpc=True) as s:  # host from --rest_api_host
        assert listening(s.proc.pid) == {("127.0.0.1", s.port), ("127.0.0.1", s.grpc_port)}, \
            f"gRPC should listen on --rest_api_host 127.0.0.1: {listening(s.proc.pid)} (REST {s.port}, gRPC {s.grpc_port})"
    with u.Server(tmp_path, base_path=str(tmp_path / "m"), grpc=True, extra=["--grpc_api_host=0.0.0.0"]) as s:
        got = listening(s.proc.pid)
        assert ("127.0.0.1", s.port) in got and (("0.0.0.0", s.grpc_port) in got or ("::", s.grpc_port) in got), \
            f"--grpc_api_host=0.0.0.0: {got} (REST {s.port}, gRPC {s.grpc_port})"
        st = Stubs(s)
        try:
            assert health_pb2.HealthCheckResponse.SERVING == st.health.Check(
                health_pb2.HealthCheckRequest(service=""), timeout=RPC_TIMEOUT).status
        finally:
            st.close()


# ----------------------------------------------------------------------------------------------------------------
# 1. tensorflow-serving-api: Predict, GetModelMetadata, GetModelStatus

@pytest.mark.parametrize("model,shape", [("m", (3, 4)), ("cnn", (2, 1, 28, 28))])
@pytest.mark.parametrize("form", ["tensor_content", "float_val"])
def test_predict_float_bit_exact_with_rest(srv, stubs, models, model, shape, form):
    x = u.randn(shape, seed=11)
    tp = tensor(x) if form == "tensor_content" else val_tensor(x)
    assert (form == "float_val") == bool(tp.float_val)
    resp = grpc_predict(stubs, predict_req(model, {"x": tp}), f"{model} {form}")
    assert set(resp.outputs) == {"y"}, f"outputs {sorted(resp.outputs)}"
    assert resp.model_spec.name == model and resp.model_spec.version.value == 1, f"model_spec {resp.model_spec}"
    assert resp.outputs["y"].dtype == types_pb2.DT_FLOAT
    got = decode(resp.outputs["y"], f"{model} y")
    bits_equal(got, rest_v2_binary(srv, model, {"x": x})["y"], f"{model} ({form}) gRPC vs REST v2 binary")
    bits_equal(got, np.asarray(rest_predict(srv, model, {"x": x}), dtype=np.float32),
               f"{model} ({form}) gRPC vs REST :predict")
    u.assert_close(got, u.ort_run(models[model], {"x": x})["y"], f"{model} ({form}) vs onnxruntime")


def test_predict_make_tensor_proto_of_a_python_list(srv, stubs):
    """The other way users write it: tf.make_tensor_proto(list of floats, dtype, shape)."""
    x = u.randn((2, 4), seed=12)
    tp = tf.make_tensor_proto(x.reshape(-1).tolist(), dtype=tf.float32, shape=[2, 4])
    got = decode(grpc_predict(stubs, predict_req("m", {"x": tp}), "list form").outputs["y"], "y")
    bits_equal(got, rest_v2_binary(srv, "m", {"x": x})["y"], "make_tensor_proto(list) vs REST")


def test_predict_val_shorter_than_shape_repeats_the_last_value(srv, stubs):
    """TensorFlow's rule for the *_val fields (tensor.cc, Tensor::FromProto): fewer values than elements repeat the
    last one. tf.make_tensor_proto(0.25, shape=[2, 4]) sends float_val=[0.25] with shape [2, 4]."""
    tp = tf.make_tensor_proto(0.25, dtype=tf.float32, shape=[2, 4])
    assert list(tp.float_val) == [0.25] and not tp.tensor_content
    got = decode(grpc_predict(stubs, predict_req("m", {"x": tp}), "short float_val").outputs["y"], "y")
    bits_equal(got, rest_v2_binary(srv, "m", {"x": np.full((2, 4), 0.25, np.float32)})["y"], "filled float_val")


def test_predict_two_inputs(srv, stubs):
    a, b = u.randn((2, 3), seed=13), u.randn((2, 3), seed=14)
    resp = grpc_predict(stubs, predict_req("two", {"a": a, "b": val_tensor(b)}), "two")
    got = decode(resp.outputs["y"], "y")
    bits_equal(got, rest_v2_binary(srv, "two", {"a": a, "b": b})["y"], "two inputs vs REST")
    u.assert_close(got, 2 * a + b, "2a + b")


def test_get_model_metadata_matches_rest(srv, stubs):
    for name in ("m", "two", "cnn", "t_i64", "t_bool"):
        req = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        req.model_spec.name = name
        resp = stubs.predict.GetModelMetadata(req, timeout=RPC_TIMEOUT)
        assert resp.model_spec.name == name and resp.model_spec.version.value == 1, resp.model_spec
        assert set(resp.metadata) == {"signature_def"}, sorted(resp.metadata)
        any_ = resp.metadata["signature_def"]
        assert any_.type_url.endswith("/tensorflow.serving.SignatureDefMap"), any_.type_url
        sigmap = get_model_metadata_pb2.SignatureDefMap()
        assert any_.Unpack(sigmap), f"Any does not unpack as SignatureDefMap: {any_.type_url}"
        assert "serving_default" in sigmap.signature_def, sorted(sigmap.signature_def)
        sig = sigmap.signature_def["serving_default"]
        rest = srv.get(f"/v1/models/{name}/metadata").json()
        rsig = rest["metadata"]["signature_def"]["signature_def"]["serving_default"]
        assert sig.method_name == rsig.get("method_name", ""), (sig.method_name, rsig)
        for kind in ("inputs", "outputs"):
            got = getattr(sig, kind)
            assert set(got) == set(rsig[kind]), (name, kind, sorted(got), sorted(rsig[kind]))
            for k, info in got.items():
                r = rsig[kind][k]
                assert types_pb2.DataType.Name(info.dtype) == r["dtype"], (name, k, info.dtype, r)
                dims = [d.size for d in info.tensor_shape.dim]
                assert dims == [int(d["size"]) for d in r["tensor_shape"]["dim"]], (name, k, dims, r)
                assert dims[0] == -1, f"{name} {k}: the batch dim is dynamic, want -1: {dims}"
                assert info.name == r.get("name", ""), (name, k, info.name, r)


def test_get_model_metadata_versioned_and_errors(stubs):
    req = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    req.model_spec.name = "v"
    req.model_spec.version.value = 2
    assert stubs.predict.GetModelMetadata(req, timeout=RPC_TIMEOUT).model_spec.version.value == 2
    req.model_spec.name = "nope"
    check_status(rpc_error(stubs.predict.GetModelMetadata, req), grpc.StatusCode.NOT_FOUND, "nope")
    req = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["no_such_field"])
    req.model_spec.name = "m"
    check_status(rpc_error(stubs.predict.GetModelMetadata, req), grpc.StatusCode.INVALID_ARGUMENT, "no_such_field")


def test_get_model_status_matches_rest(srv, stubs):
    for name in ("m", "v"):
        req = get_model_status_pb2.GetModelStatusRequest()
        req.model_spec.name = name
        resp = stubs.model.GetModelStatus(req, timeout=RPC_TIMEOUT)
        got = sorted((s.version, s.state, s.status.error_code, s.status.error_message) for s in resp.model_version_status)
        rest = version_status_of(srv, name)
        want = sorted((v, get_model_status_pb2.ModelVersionStatus.State.Value(e["state"]), 0, e["status"]["error_message"])
                      for v, e in rest.items())
        assert got == want, f"{name}: gRPC {got}, REST {want}"
        assert all(s.state == AVAILABLE for s in resp.model_version_status), resp
    req = get_model_status_pb2.GetModelStatusRequest()
    req.model_spec.name = "v"
    req.model_spec.version.value = 2
    resp = stubs.model.GetModelStatus(req, timeout=RPC_TIMEOUT)
    assert [(s.version, s.state) for s in resp.model_version_status] == [(2, AVAILABLE)], resp
    req.model_spec.version.value = 9
    check_status(rpc_error(stubs.model.GetModelStatus, req), grpc.StatusCode.NOT_FOUND, "9")
    req = get_model_status_pb2.GetModelStatusRequest()
    req.model_spec.name = "nope"
    check_status(rpc_error(stubs.model.GetModelStatus, req), grpc.StatusCode.NOT_FOUND, "nope")


def reload_config(stubs, entries):
    """HandleReloadConfigRequest with [(name, base_path)]; returns (response or None, RpcError or None)."""
    req = model_management_pb2.ReloadConfigRequest()
    for name, base in entries:
        c = req.config.model_config_list.config.add()
        c.name, c.base_path, c.model_platform = name, base, "onnx"
    try:
        return stubs.model.HandleReloadConfigRequest(req, timeout=60), None
    except grpc.RpcError as e:
        return None, e


def grpc_status(stubs, name):
    req = get_model_status_pb2.GetModelStatusRequest()
    req.model_spec.name = name
    try:
        return {s.version: s.state for s in stubs.model.GetModelStatus(req, timeout=10).model_version_status}
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.NOT_FOUND:
            return None
        raise


def test_handle_reload_config_adds_and_removes_models(tmp_path):
    ma, mb = u.mm_model(4, 4, seed=21), u.cnn_model()
    u.write_version(tmp_path / "a", 1, ma)
    u.write_version(tmp_path / "b", 1, mb)
    conf = u.write_text(tmp_path / "models.config", u.model_config_text([{"name": "a", "base_path": str(tmp_path / "a")}]))
    with u.Server(tmp_path, config_file=conf, grpc=True) as s:
        st = Stubs(s)
        try:
            assert grpc_status(st, "b") is None, "b is not configured yet"
            resp, err = reload_config(st, [("a", str(tmp_path / "a")), ("b", str(tmp_path / "b"))])
            assert err is None, f"reload adding b: {err.code().name}: {err.details()!r}\n{s.describe()}"
            assert resp.status.error_code == 0, f"reload adding b: {resp.status}"
            wait_for(lambda: grpc_status(st, "b") == {1: AVAILABLE}, 30, "b version 1 AVAILABLE over gRPC", s)
            x = u.randn((2, 1, 28, 28), seed=22)
            got = decode(grpc_predict(st, predict_req("b", {"x": x}), "b after reload").outputs["y"], "b y")
            bits_equal(got, rest_v2_binary(s, "b", {"x": x})["y"], "b: gRPC vs REST")
            u.assert_close(got, u.ort_run(mb, {"x": x})["y"], "b vs onnxruntime")
            assert grpc_status(st, "a") == {1: AVAILABLE}, "a kept"
            xa = u.randn((1, 4), seed=23)
            bits_equal(decode(grpc_predict(st, predict_req("a", {"x": xa}), "a").outputs["y"], "a y"),
                       rest_v2_binary(s, "a", {"x": xa})["y"], "a after reload")
            # an invalid config (a model listed twice) is refused and changes nothing
            resp, err = reload_config(st, [("b", str(tmp_path / "b")), ("b", str(tmp_path / "a"))])
            if err is not None:
                assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details())
                assert "b" in err.details()
            else:
                assert resp.status.error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0], resp.status
            assert grpc_status(st, "a") == {1: AVAILABLE} and grpc_status(st, "b") == {1: AVAILABLE}
            # a model left out of the new list is removed
            resp, err = reload_config(st, [("b", str(tmp_path / "b"))])
            assert err is None and resp.status.error_code == 0, (err and err.details(), resp and resp.status)
            wait_for(lambda: grpc_status(st, "a") in (None, {1: END}), 30, "a to be removed", s)
            e = rpc_error(st.predict.Predict, predict_req("a", {"x": xa}))
            assert e.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE), (e.code(), e.details())
            grpc_predict(st, predict_req("b", {"x": x}), "b after a was removed")
        finally:
            st.close()


# ----------------------------------------------------------------------------------------------------------------
# 2. dtypes, versions, labels, signatures, output_filter, Classify, Regress

def typed_input(name, n=3):
    elem, dt, _ = TYPED[name]
    rng = np.random.default_rng(31)
    if dt == np.bool_:
        return rng.integers(0, 2, (n, 2)).astype(np.bool_)
    if dt == np.int64:
        return np.int64([[1 << 50, -(1 << 61)], [-7, 0], [(1 << 62) - 5, 123456789012]])[:n]
    if dt == np.int32:
        return rng.integers(-2 ** 30, 2 ** 30, (n, 2)).astype(np.int32)
    return rng.standard_normal((n, 2)).astype(dt)


@pytest.mark.parametrize("form", ["tensor_content", "val"])
@pytest.mark.parametrize("name", list(TYPED))
def test_predict_typed_inputs(srv, stubs, models, name, form):
    _, dt, c = TYPED[name]
    x = typed_input(name)
    tp = tensor(x) if form == "tensor_content" else val_tensor(x)
    resp = grpc_predict(stubs, predict_req(name, {"x": tp}), f"{name} {form}")
    got = decode(resp.outputs["y"], f"{name} y")
    want = np.logical_not(x) if c is None else (x + c).astype(dt)
    bits_equal(got, want, f"{name} ({form}) vs numpy")
    bits_equal(got, ort_typed(models[name], {"x": x})["y"], f"{name} ({form}) vs onnxruntime")


@pytest.mark.parametrize("name", list(TYPED))
def test_predict_typed_input_wrong_dtype(stubs, name):
    """Every typed model refuses a float tensor for its input, naming it and both dtypes."""
    e = rpc_error(stubs.predict.Predict, predict_req(name, {"x": u.randn((1, 2))}))
    msg = check_status(e, grpc.StatusCode.INVALID_ARGUMENT, "'x'")
    assert "float" in msg.lower(), f"message does not say what was sent (float): {msg!r}"


def test_version_number_label_and_default(stubs):
    x = np.float32([[5.0]])

    def ver(**kw):
        resp = grpc_predict(stubs, predict_req("v", {"x": x}, **kw), f"v {kw}")
        return float(decode(resp.outputs["y"], "y")[0, 0]), resp.model_spec

    for v in (1, 2, 3):
        got, spec = ver(version=v)
        assert got == v and spec.version.value == v, (v, got, spec)
    got, spec = ver()
    assert got == 3.0 and spec.version.value == 3, f"no version: the highest AVAILABLE answers, got {got} {spec}"
    for label, v in (("stable", 1), ("canary", 2)):
        got, spec = ver(label=label)
        assert got == v, f"label {label}: version {got}, want {v}"
        assert spec.version.value == v or spec.version_label == label, spec
    check_status(rpc_error(stubs.predict.Predict, predict_req("v", {"x": x}, version=9)), grpc.StatusCode.NOT_FOUND, "9")
    check_status(rpc_error(stubs.predict.Predict, predict_req("v", {"x": x}, label="nope")), grpc.StatusCode.NOT_FOUND,
                 "nope")
    check_status(rpc_error(stubs.predict.Predict, predict_req("nope", {"x": x})), grpc.StatusCode.NOT_FOUND, "nope")


def test_signature_name(srv, stubs):
    x = u.randn((1, 4), seed=41)
    want = rest_v2_binary(srv, "m", {"x": x})["y"]
    for sig in ("", "serving_default"):
        got = decode(grpc_predict(stubs, predict_req("m", {"x": x}, signature=sig), sig).outputs["y"], "y")
        bits_equal(got, want, f"signature_name {sig!r}")
    e = rpc_error(stubs.predict.Predict, predict_req("m", {"x": x}, signature="nope"))
    assert e.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION), (e.code(), e.details())
    assert "nope" in e.details(), e.details()


def test_output_filter(srv, stubs):
    a, b = u.randn((2, 3), seed=42), u.randn((2, 3), seed=43)
    rest = rest_v2_binary(srv, "pair", {"a": a, "b": b})
    resp = grpc_predict(stubs, predict_req("pair", {"a": a, "b": b}), "pair")
    assert set(resp.outputs) == {"s", "p"}, sorted(resp.outputs)
    for flt in (["p"], ["s"], ["s", "p"]):
        resp = grpc_predict(stubs, predict_req("pair", {"a": a, "b": b}, output_filter=flt), f"filter {flt}")
        assert set(resp.outputs) == set(flt), f"output_filter {flt}: got {sorted(resp.outputs)}"
        for k in flt:
            bits_equal(decode(resp.outputs[k], k), rest[k], f"output {k} with output_filter {flt}")
    msg = check_status(rpc_error(stubs.predict.Predict, predict_req("pair", {"a": a, "b": b}, output_filter=["nope"])),
                       grpc.StatusCode.INVALID_ARGUMENT, "nope")
    assert msg


def test_predict_bad_inputs(stubs):
    x = u.randn((1, 4), seed=44)
    check_status(rpc_error(stubs.predict.Predict, predict_req("m", {"nope": x})), grpc.StatusCode.INVALID_ARGUMENT,
                 "nope")
    check_status(rpc_error(stubs.predict.Predict, predict_req("two", {"a": u.randn((1, 3))})),
                 grpc.StatusCode.INVALID_ARGUMENT, "'b'")
    msg = check_status(rpc_error(stubs.predict.Predict, predict_req("m", {"x": u.randn((1, 3))})),
                       grpc.StatusCode.INVALID_ARGUMENT, "'x'")
    assert "4" in msg and "3" in msg, f"shape error should say expected vs got: {msg!r}"
    msg = check_status(rpc_error(stubs.predict.Predict, predict_req("m", {"x": np.int64([[1, 2, 3, 4]])})),
                       grpc.StatusCode.INVALID_ARGUMENT, "'x'")
    assert "int64" in msg.lower() and "float" in msg.lower(), f"dtype error should say expected vs got: {msg!r}"
    grpc_predict(stubs, predict_req("m", {"x": x}), "after bad inputs")


def examples(x):
    out = []
    for row in x:
        ex = tf.train.Example()
        ex.features.feature["x"].float_list.value.extend(row.tolist())
        out.append(ex)
    return out


def test_classify_matches_rest(srv, stubs, models):
    x = u.randn((3, 4), seed=45)
    req = classification_pb2.ClassificationRequest()
    req.model_spec.name = "cls"
    req.input.example_list.examples.extend(examples(x))
    resp = stubs.predict.Classify(req, timeout=RPC_TIMEOUT)
    assert resp.model_spec.name == "cls" and resp.model_spec.version.value == 1, resp.model_spec
    cl = resp.result.classifications
    assert len(cl) == 3, resp
    r = srv.post_json("/v1/models/cls:classify", {"examples": [{"x": row} for row in x.tolist()]})
    assert r.status_code == 200, r.content[:300]
    rest = r.json()["results"]
    want = u.ort_run(models["cls"], {"x": x})["probs"]
    for i, c in enumerate(cl):
        assert [k.label for k in c.classes] == [p[0] for p in rest[i]] == CLASS_LABELS, (c, rest[i])
        scores = np.float32([k.score for k in c.classes])
        bits_equal(scores, np.float32([p[1] for p in rest[i]]), f"classify scores of example {i} vs REST")
        u.assert_close(scores, want[i], f"classify scores of example {i} vs onnxruntime")


def test_regress_matches_rest(srv, stubs, models):
    x = u.randn((3, 4), seed=46)
    req = regression_pb2.RegressionRequest()
    req.model_spec.name = "reg"
    req.input.example_list.examples.extend(examples(x))
    resp = stubs.predict.Regress(req, timeout=RPC_TIMEOUT)
    got = np.float32([r.value for r in resp.result.regressions])
    r = srv.post_json("/v1/models/reg:regress", {"examples": [{"x": row} for row in x.tolist()]})
    assert r.status_code == 200, r.content[:300]
    bits_equal(got, np.float32(r.json()["results"]), "regress vs REST")
    u.assert_close(got, u.ort_run(models["reg"], {"x": x})["y"].reshape(-1), "regress vs onnxruntime")
    # a model that is not single-input single-output cannot regress
    req.model_spec.name = "pair"
    e = rpc_error(stubs.predict.Regress, req)
    assert e.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION), (e.code(), e.details())


# ----------------------------------------------------------------------------------------------------------------
# 3. tritonclient.grpc (KServe v2)

@pytest.fixture(scope="module")
def triton(srv):
    c = tgrpc.InferenceServerClient(url=srv.grpc_target)
    yield c
    c.close()


def test_triton_health_and_metadata(srv, triton):
    assert triton.is_server_live() is True
    assert triton.is_server_ready() is True
    assert triton.is_model_ready("m") is True
    assert triton.is_model_ready("v", "2") is True
    for name, ver in (("nope", ""), ("m", "9")):
        try:
            ready = triton.is_model_ready(name, ver)
        except InferenceServerException as e:
            assert e.status() == "StatusCode.NOT_FOUND", (name, ver, e.status(), str(e))
        else:
            assert ready is False, f"is_model_ready({name!r}, {ver!r}) = {ready}"
    md = triton.get_server_metadata(as_json=True)
    rest = srv.get("/v2").json()
    assert md["name"] == rest["name"] and md["version"] == rest["version"], (md, rest)
    # the gRPC side may offer fewer extensions (it has no ModelConfig / ModelStatistics), never others
    assert set(md.get("extensions", [])) <= set(rest["extensions"]), (md, rest)
    for name in ("m", "two", "t_i64", "t_bool", "pair"):
        md = triton.get_model_metadata(name, as_json=True)
        rest = srv.get(f"/v2/models/{name}").json()
        assert md["name"] == name and md["versions"] == [str(v) for v in rest["versions"]], (md, rest)
        assert md.get("platform", "") == rest.get("platform", ""), (md, rest)
        for kind in ("inputs", "outputs"):
            got = [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in md[kind]]
            want = [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in rest[kind]]
            assert got == want, (name, kind, got, want)
    with pytest.raises(InferenceServerException) as ei:
        triton.get_model_metadata("nope")
    assert ei.value.status() == "StatusCode.NOT_FOUND", ei.value.status()


@pytest.mark.parametrize("model,feeds", [
    ("m", lambda: {"x": u.randn((3, 4), seed=51)}),
    ("cnn", lambda: {"x": u.randn((2, 1, 28, 28), seed=52)}),
    ("two", lambda: {"a": u.randn((2, 3), seed=53), "b": u.randn((2, 3), seed=54)}),
    ("t_i64", lambda: {"x": typed_input("t_i64")}),
    ("t_i32", lambda: {"x": typed_input("t_i32")}),
    ("t_f64", lambda: {"x": typed_input("t_f64")}),
    ("t_f16", lambda: {"x": typed_input("t_f16")}),
    ("t_bool", lambda: {"x": typed_input("t_bool")})])
def test_triton_infer_numpy_bit_exact_with_rest(srv, triton, models, model, feeds):
    feeds = feeds()
    inputs = []
    for n, a in feeds.items():
        i = tgrpc.InferInput(n, list(a.shape), V2_DTYPES[a.dtype])
        i.set_data_from_numpy(a)
        inputs.append(i)
    res = triton.infer(model, inputs, client_timeout=RPC_TIMEOUT)
    rest = rest_v2_binary(srv, model, feeds)
    resp = res.get_response()
    assert resp.model_name == model and resp.model_version == "1", (resp.model_name, resp.model_version)
    assert len(resp.raw_output_contents) == len(resp.outputs) == len(rest), "replies use raw_output_contents"
    for name, want in rest.items():
        got = res.as_numpy(name)
        assert got is not None, f"output {name} missing"
        bits_equal(got, want, f"{model} {name}: tritonclient.grpc vs REST v2 binary")
    if model in ("m", "cnn"):
        u.assert_close(res.as_numpy("y"), u.ort_run(models[model], feeds)["y"], f"{model} vs onnxruntime")


CONTENTS = {np.dtype(np.float32): "fp32_contents", np.dtype(np.float64): "fp64_contents",
            np.dtype(np.int64): "int64_contents", np.dtype(np.int32): "int_contents", np.dtype(np.bool_): "bool_contents"}


@pytest.mark.parametrize("model", ["m", "two", "t_i64", "t_i32", "t_f64", "t_bool"])
def test_kserve_model_infer_typed_contents(srv, stubs, model):
    """ModelInfer with the typed `contents` (not raw_input_contents); the reply's raw_output_contents equals REST."""
    feeds = {"m": {"x": u.randn((2, 4), seed=55)}, "two": {"a": u.randn((2, 3), seed=56), "b": u.randn((2, 3), seed=57)}}
    feeds = feeds.get(model) or {"x": typed_input(model)}
    req = service_pb2.ModelInferRequest(model_name=model, id="req-7")
    for n, a in feeds.items():
        t = req.inputs.add(name=n, datatype=V2_DTYPES[a.dtype], shape=list(a.shape))
        getattr(t.contents, CONTENTS[a.dtype]).extend(a.reshape(-1).tolist())
    resp = stubs.kserve.ModelInfer(req, timeout=RPC_TIMEOUT)
    assert resp.id == "req-7" and resp.model_name == model, (resp.id, resp.model_name)
    rest = rest_v2_binary(srv, model, feeds)
    assert len(resp.raw_output_contents) == len(resp.outputs) == len(rest), resp
    for o, raw in zip(resp.outputs, resp.raw_output_contents):
        want = rest[o.name]
        assert o.datatype == V2_DTYPES[want.dtype] and list(o.shape) == list(want.shape), o
        bits_equal(np.frombuffer(raw, dtype=want.dtype.newbyteorder("<")).astype(want.dtype).reshape(want.shape), want,
                   f"{model} {o.name}: typed contents vs REST")


def test_kserve_model_infer_errors(stubs):
    req = service_pb2.ModelInferRequest(model_name="m")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 4]).contents.fp32_contents.extend([1, 2, 3])
    msg = check_status(rpc_error(stubs.kserve.ModelInfer, req), grpc.StatusCode.INVALID_ARGUMENT, "'x'")
    assert "4" in msg and "3" in msg, f"count error should say expected vs got: {msg!r}"
    req = service_pb2.ModelInferRequest(model_name="m")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    req.raw_input_contents.append(b"\0" * 12)
    check_status(rpc_error(stubs.kserve.ModelInfer, req), grpc.StatusCode.INVALID_ARGUMENT, "'x'")
    req = service_pb2.ModelInferRequest(model_name="m", model_version="9")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 4]).contents.fp32_contents.extend([1, 2, 3, 4])
    check_status(rpc_error(stubs.kserve.ModelInfer, req), grpc.StatusCode.NOT_FOUND, "9")
    req.model_name, req.model_version = "nope", ""
    check_status(rpc_error(stubs.kserve.ModelInfer, req), grpc.StatusCode.NOT_FOUND, "nope")


def test_triton_repository_index(srv, triton):
    idx = triton.get_model_repository_index(as_json=True)
    seen = {(e["name"], e.get("version", "")): e.get("state", "") for e in idx.get("models", [])}
    rest = srv.post("/v2/repository/index", data="{}").json()
    want = {(e["name"], str(e.get("version", ""))): e.get("state", "") for e in rest}
    assert seen == want, f"gRPC index {seen} != REST {want}"
    for name in ("m", "cnn", "t_bool"):
        assert seen.get((name, "1")) == "READY", (name, seen)


def test_triton_load_unload_refused_without_explicit_mode(triton):
    for fn in (triton.load_model, triton.unload_model):
        with pytest.raises(InferenceServerException) as ei:
            fn("m")
        assert ei.value.status() == "StatusCode.UNAVAILABLE", (fn.__name__, ei.value.status(), str(ei.value))
        assert "explicit" in str(ei.value), str(ei.value)
    assert triton.is_model_ready("m")


def test_triton_load_unload_explicit_mode(tmp_path):
    base, other = tmp_path / "e", tmp_path / "other"
    me = u.mm_model(4, 4, seed=61)
    u.write_version(base, 1, me)
    u.write_version(other, 1, u.version_model(1))
    cfg = u.write_text(tmp_path / "models.config", u.model_config_text([
        {"name": "e", "base_path": str(base)}, {"name": "other", "base_path": str(other)}]))
    token = "grpc-admin-token-0123456789"
    tok = u.write_text(tmp_path / "token", token + "\n")
    with u.Server(tmp_path, config_file=cfg, poll=0.1, grpc=True,
                  extra=["--model_control_mode=explicit", f"--admin_token_file={tok}"]) as s:
        c = tgrpc.InferenceServerClient(url=s.grpc_target)
        auth = {"authorization": f"Bearer {token}"}
        x = u.randn((2, 4), seed=62)

        def infer():
            i = tgrpc.InferInput("x", [2, 4], "FP32")
            i.set_data_from_numpy(x)
            return c.infer("e", [i], client_timeout=RPC_TIMEOUT).as_numpy("y")

        try:
            assert c.is_model_ready("e") and c.is_model_ready("other")
            # without the admin token: UNAUTHENTICATED, nothing changes
            with pytest.raises(InferenceServerException) as ei:
                c.unload_model("e")
            assert ei.value.status() == "StatusCode.UNAUTHENTICATED", (ei.value.status(), str(ei.value))
            with pytest.raises(InferenceServerException) as ei:
                c.unload_model("e", headers={"authorization": "Bearer wrong"})
            assert ei.value.status() == "StatusCode.UNAUTHENTICATED", (ei.value.status(), str(ei.value))
            assert c.is_model_ready("e")
            c.unload_model("e", headers=auth)
            assert not c.is_model_ready("e")
            with pytest.raises(InferenceServerException) as ei:
                infer()
            assert ei.value.status() in ("StatusCode.NOT_FOUND", "StatusCode.UNAVAILABLE"), ei.value.status()
            idx = {(m["name"], m.get("version")): m.get("state") for m in c.get_model_repository_index(as_json=True)["models"]}
            assert idx.get(("e", "1")) == "UNAVAILABLE", idx
            assert c.is_model_ready("other")
            c.load_model("e", headers=auth)
            assert c.is_model_ready("e")
            got = infer()
            bits_equal(got, rest_v2_binary(s, "e", {"x": x})["y"], "e after load: gRPC vs REST")
            u.assert_close(got, u.ort_run(me, {"x": x})["y"], "e after load vs onnxruntime")
            with pytest.raises(InferenceServerException) as ei:
                c.load_model("nope", headers=auth)
            assert ei.value.status() == "StatusCode.NOT_FOUND" and "nope" in str(ei.value), ei.value.status()
        finally:
            c.close()


# ----------------------------------------------------------------------------------------------------------------
# 4. grpc.health.v1

def health_check(stubs, service):
    return stubs.health.Check(health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT).status


def first_watch(stubs, service, timeout=10):
    call = stubs.health.Watch(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
    try:
        return next(call).status
    finally:
        call.cancel()


def test_health_check_and_watch(stubs):
    S = health_pb2.HealthCheckResponse
    assert health_check(stubs, "") == S.SERVING
    for name in ("m", "cnn", "v"):
        assert health_check(stubs, name) == S.SERVING, name
    e = rpc_error(stubs.health.Check, health_pb2.HealthCheckRequest(service="nope"))
    assert e.code() == grpc.StatusCode.NOT_FOUND, (e.code(), e.details())
    assert first_watch(stubs, "") == S.SERVING
    assert first_watch(stubs, "m") == S.SERVING
    assert first_watch(stubs, "nope") == S.SERVICE_UNKNOWN


def test_health_not_serving_until_every_model_has_a_version(tmp_path):
    """A configured model with no version yet: "" and that model NOT_SERVING, the other SERVING; Watch("") sends
    NOT_SERVING first, then SERVING once the version is written."""
    S = health_pb2.HealthCheckResponse
    u.write_version(tmp_path / "good", 1, u.mm_model(seed=71))
    os.makedirs(tmp_path / "late")
    cfg = u.write_text(tmp_path / "models.config", u.model_config_text([
        {"name": "good", "base_path": str(tmp_path / "good")}, {"name": "late", "base_path": str(tmp_path / "late")}]))
    with u.Server(tmp_path, config_file=cfg, poll=0.1, grpc=True, ready=False) as s:
        st = Stubs(s)
        try:
            wait_for(lambda: health_check(st, "good") == S.SERVING, 30, "good SERVING", s)
            assert health_check(st, "") == S.NOT_SERVING
            assert health_check(st, "late") == S.NOT_SERVING
            # a configured model with no version yet: the status REST gives, in gRPC terms
            x = u.randn((1, 4), seed=73)
            r = s.post_json("/v1/models/late:predict", {"instances": x.tolist()})
            want = {404: grpc.StatusCode.NOT_FOUND, 503: grpc.StatusCode.UNAVAILABLE}.get(r.status_code)
            assert want is not None, f"REST predict on a model without a version: HTTP {r.status_code} {r.content[:200]!r}"
            check_status(rpc_error(st.predict.Predict, predict_req("late", {"x": x})), want, "late")
            c = tgrpc.InferenceServerClient(url=s.grpc_target)
            try:
                assert c.is_server_live() is True and c.is_server_ready() is False
            finally:
                c.close()
            call = st.health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=60)
            seen = []
            try:
                seen.append(next(call).status)
                assert seen == [S.NOT_SERVING], seen
                u.write_version(tmp_path / "late", 1, u.mm_model(seed=72))
                for msg in call:
                    seen.append(msg.status)
                    if msg.status == S.SERVING:
                        break
            except grpc.RpcError as e:
                pytest.fail(f"Watch ended with {e.code().name} {e.details()!r}; statuses seen {seen}\n{s.describe()}")
            finally:
                call.cancel()
            assert seen[-1] == S.SERVING and S.SERVING not in seen[:-1], seen
            assert health_check(st, "late") == S.SERVING and health_check(st, "") == S.SERVING
        finally:
            st.close()


# ----------------------------------------------------------------------------------------------------------------
# 5. hot swap under gRPC load

CLIENTS = 12
MAX_LOAD_SECONDS = 25


def test_hot_swap_under_grpc_load(tmp_path):
    base = tmp_path / "m"
    u.write_version(base, 1, u.version_model(1))
    s = u.Server(tmp_path, base_path=str(base), poll=0.2, grpc=True)
    channels = [s.grpc_channel() for _ in range(4)]
    stop = threading.Event()
    hard_end = time.monotonic() + MAX_LOAD_SECONDS
    per_thread = [[] for _ in range(CLIENTS)]
    failures = [[] for _ in range(CLIENTS)]
    available_seen = set()

    def client(i):
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channels[i % len(channels)])
        req = predict_req("m", {"x": np.float32([[float(i)]])})
        while not stop.is_set() and time.monotonic() < hard_end:
            try:
                resp = stub.Predict(req, timeout=10)
                v = float(tf.make_ndarray(resp.outputs["y"])[0, 0])
            except grpc.RpcError as e:
                failures[i].append(f"{e.code().name}: {e.details()}")
                continue
            except Exception as e:  # noqa: BLE001 - a malformed reply is a failure too
                failures[i].append(f"{type(e).__name__}: {e}")
                continue
            per_thread[i].append((time.monotonic(), v, resp.model_spec.version.value))

    def watch_available():
        for v, e in version_status_of(s, "m").items():
            if e["state"] == "AVAILABLE":
                available_seen.add(v)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(CLIENTS)]
    try:
        watch_available()
        for t in threads:
            t.start()
        time.sleep(1.0)
        for v in (2, 3, 4):
            u.write_version(base, v, u.version_model(v))
            wait_for(lambda: version_status_of(s, "m").get(v, {}).get("state") == "AVAILABLE", 20,
                     f"version {v} AVAILABLE", s)
            watch_available()
            time.sleep(0.5)
        shutil.rmtree(base / "1")
        time.sleep(0.6)
        u.write_version(base, 5, b"this is not an ONNX model \x00\x01 garbage" * 50)
        wait_for(lambda: version_status_of(s, "m").get(5, {}).get("state") == "END", 20, "corrupt version 5 END", s)
        watch_available()
        time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=15)
    try:
        assert all(not t.is_alive() for t in threads), "client threads did not stop"
        nfail = sum(len(f) for f in failures)
        nok = sum(len(p) for p in per_thread)
        examples_ = [f for fs in failures for f in fs][:5]
        assert nfail == 0, f"{nfail} failed gRPC calls of {nfail + nok} during hot swap, e.g. {examples_}\n{s.describe()}"
        assert nok >= CLIENTS * 5, f"only {nok} calls completed"
        served = sorted({v for p in per_thread for _, v, _ in p})
        assert set(served) <= {1.0, 2.0, 3.0, 4.0}, f"served versions {served}: something not in 1..4 answered"
        assert 4.0 in served, f"version 4 never served: {served}"
        mismatched = [(v, spec) for p in per_thread for _, v, spec in p if float(spec) != v]
        assert not mismatched, f"model_spec.version disagrees with the version that computed: {mismatched[:5]}"
        for i, p in enumerate(per_thread):
            vs = [v for _, v, _ in p]
            back = [(a, b) for a, b in zip(vs, vs[1:]) if b < a]
            assert not back, f"client {i}: served version went backwards {back[:3]}"
        assert available_seen >= {1, 2, 3, 4}, available_seen
        # after the swap: only 4 answers, and version 1 (removed) is gone over gRPC too
        st = Stubs(s)
        try:
            resp = grpc_predict(st, predict_req("m", {"x": np.float32([[0.0]])}), "after swap")
            assert float(tf.make_ndarray(resp.outputs["y"])[0, 0]) == 4.0
            e = rpc_error(st.predict.Predict, predict_req("m", {"x": np.float32([[0.0]])}, version=1))
            assert e.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE), (e.code(), e.details())
        finally:
            st.close()
        print(f"{nok} gRPC calls, versions served {served}")
    finally:
        for ch in channels:
            ch.close()
        s.stop()


# ----------------------------------------------------------------------------------------------------------------
# 6. --instances_per_version=2 over gRPC (the way tests/integration/test_instances.py shows overlap)

TARGET_S = 0.7


def grpc_pair(s, stubs, model, x):
    """Two copies of a Predict at once over gRPC -> (window s, summed engine s, summed queue s, outputs)."""
    req = predict_req(model, {"x": x})

    def one(i):
        try:
            return tf.make_ndarray(stubs[i].predict.Predict(req, timeout=120).outputs["y"])
        except grpc.RpcError as e:
            return e

    window, infer, queue, outs = u.timed_pair(s, model, one)
    for out in outs:
        assert not isinstance(out, grpc.RpcError), f"{out.code().name}: {out.details()}"
    return window, infer, queue, outs


def test_two_instances_overlap_two_slow_grpc_requests(tmp_path):
    slow = u.slow_model()
    for name in ("two", "one"):
        u.write_version(tmp_path / name, 1, slow)
    conf = u.write_text(tmp_path / "models.config", u.instance_config_text([
        {"name": "two", "base_path": str(tmp_path / "two")},
        {"name": "one", "base_path": str(tmp_path / "one"), "instance_count": 1}]))
    with u.Server(tmp_path, config_file=conf, threads=1, grpc=True, extra=["--instances_per_version=2"]) as s:
        stubs = [Stubs(s), Stubs(s)]  # one channel (one HTTP/2 connection) per client, as two users would have
        try:
            x8 = u.randn((8, 512), seed=1)
            grpc_predict(stubs[0], predict_req("two", {"x": x8}), "warm-up")
            t0 = time.monotonic()
            grpc_predict(stubs[0], predict_req("two", {"x": x8}), "calibration")
            per_row = (time.monotonic() - t0) / 8
            rows = int(min(512, max(1, round(TARGET_S / max(per_row, 1e-4)))))
            x = u.randn((rows, 512), seed=3)
            want = u.ort_run(slow, {"x": x})["y"]
            results = {}
            for model, ok in (("two", lambda o, i, q: o >= 0.25 * i and q <= 0.15 * i),
                              ("one", lambda o, i, q: o <= 0.1 * i and q >= 0.3 * i)):
                grpc_pair(s, stubs, model, x)  # compiles this shape's plan on every instance
                tries = []
                for _ in range(2):
                    window, infer, queue, outs = grpc_pair(s, stubs, model, x)
                    overlap = infer - window
                    tries.append(dict(window=round(window, 3), infer=round(infer, 3), queue=round(queue, 3),
                                      overlap_at_least=round(overlap, 3)))
                    if ok(overlap, infer, queue):
                        break
                else:
                    pytest.fail(f"{model}: two slow gRPC Predicts ({rows} rows each) did not "
                                f"{'overlap' if model == 'two' else 'run one after the other'}: {tries}\n{s.describe()}")
                results[model] = tries
                for o in outs:
                    u.assert_close(o, want, f"slow model on {model}")
            print(results)
        finally:
            for st in stubs:
                st.close()
