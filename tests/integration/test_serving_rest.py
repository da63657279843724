"""Every REST endpoint of `tensord serve`, called the way curl users and stock clients do, answers checked
against TF Serving's REST API and KServe v2 (Triton's HTTP protocol); numbers checked against onnxruntime.

  main server (one per module; --model_config_file with four models):
    m       x [N,4] -> y [N,4]             (MatMul + Add)
    two     a [N,3], b [N,3] -> y = 2a + b
    cls     x [N,4] -> probs [N,3]         (softmax; signature.json gives class labels)
    reg     x [N,4] -> y [N,1]
  labels server: model_version_policy specific {1, 2} with version_labels stable -> 1
  readiness server: the model directory is empty at start; version 1 appears later

See serving_util.py for the server helper and the comparison rule.
"""
import json
import struct

import numpy as np
import pytest
import requests

import serving_util as u

CLASS_LABELS = ["cat", "dog", "bird"]


@pytest.fixture(scope="module")
def models():
    return {"m": u.mm_model(4, 4, seed=1), "two": u.two_input_model(3), "cls": u.classifier_model(4, 3),
            "reg": u.regress_model(4)}


@pytest.fixture(scope="module")
def srv(tmp_path_factory, models):
    tmp = tmp_path_factory.mktemp("rest")
    cfg = []
    for name, model in models.items():
        base = tmp / "models" / name
        sig = {"labels": CLASS_LABELS} if name == "cls" else None
        u.write_version(base, 1, model, signature=sig)
        cfg.append({"name": name, "base_path": str(base)})
    conf = u.write_text(tmp / "models.config", u.model_config_text(cfg))
    s = u.Server(tmp, config_file=conf)
    yield s
    u.server_fixture_finalize(s)


def ok_json(resp):
    assert resp.status_code == 200, f"HTTP {resp.status_code}: {resp.content[:1000]!r}"
    try:
        return resp.json()
    except ValueError:
        pytest.fail(f"reply is not JSON: {resp.content[:500]!r}")


OK_STATUS = {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}


# ----------------------------------------------------------------------------------------------------------------
# TF Serving: status and metadata

def test_model_status(srv):
    body = ok_json(srv.get("/v1/models/m"))
    assert body == {"model_version_status": [OK_STATUS]}, body


def test_model_version_status(srv):
    body = ok_json(srv.get("/v1/models/m/versions/1"))
    assert body == {"model_version_status": [OK_STATUS]}, body


def _dims(shape):
    assert shape.get("unknown_rank", False) is False, shape
    return [int(d["size"]) for d in shape["dim"]]


def test_metadata(srv):
    body = ok_json(srv.get("/v1/models/m/metadata"))
    spec = body["model_spec"]
    assert spec["name"] == "m" and str(spec["version"]) == "1", spec
    sig = body["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert set(sig["inputs"]) == {"x"} and set(sig["outputs"]) == {"y"}, sig
    for io in (sig["inputs"]["x"], sig["outputs"]["y"]):
        assert io["dtype"] == "DT_FLOAT", io
        assert _dims(io["tensor_shape"]) == [-1, 4], io
    assert sig.get("method_name") == "tensorflow/serving/predict", sig
    # the versioned form answers the same
    body2 = ok_json(srv.get("/v1/models/m/versions/1/metadata"))
    assert body2["metadata"] == body["metadata"]


def test_metadata_two_inputs(srv):
    sig = ok_json(srv.get("/v1/models/two/metadata"))["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert set(sig["inputs"]) == {"a", "b"}, sig
    for name in ("a", "b"):
        assert sig["inputs"][name]["dtype"] == "DT_FLOAT"
        assert _dims(sig["inputs"][name]["tensor_shape"]) == [-1, 3]


# ----------------------------------------------------------------------------------------------------------------
# TF Serving: predict

def test_predict_row_one_input(srv, models):
    x = u.randn((3, 4), seed=11)
    body = ok_json(srv.post_json("/v1/models/m:predict", {"instances": x.tolist()}))
    assert set(body) == {"predictions"}, body
    u.assert_close(body["predictions"], u.ort_run(models["m"], {"x": x})["y"], "predictions")


def test_predict_row_named_one_input(srv, models):
    x = u.randn((2, 4), seed=12)
    body = ok_json(srv.post_json("/v1/models/m:predict", {"instances": [{"x": r} for r in x.tolist()]}))
    u.assert_close(body["predictions"], u.ort_run(models["m"], {"x": x})["y"], "predictions")


def test_predict_row_two_inputs(srv, models):
    a, b = u.randn((2, 3), seed=13), u.randn((2, 3), seed=14)
    inst = [{"a": a[i].tolist(), "b": b[i].tolist()} for i in range(2)]
    body = ok_json(srv.post_json("/v1/models/two:predict", {"instances": inst}))
    u.assert_close(body["predictions"], 2 * a + b, "predictions")


def test_predict_columnar_one_input(srv, models):
    x = u.randn((3, 4), seed=15)
    body = ok_json(srv.post_json("/v1/models/m:predict", {"inputs": x.tolist()}))
    assert set(body) == {"outputs"}, body
    u.assert_close(body["outputs"], u.ort_run(models["m"], {"x": x})["y"], "outputs")


def test_predict_columnar_two_inputs(srv):
    a, b = u.randn((4, 3), seed=16), u.randn((4, 3), seed=17)
    body = ok_json(srv.post_json("/v1/models/two:predict", {"inputs": {"a": a.tolist(), "b": b.tolist()}}))
    u.assert_close(body["outputs"], 2 * a + b, "outputs")


def test_predict_versioned_paths(srv, models):
    x = u.randn((1, 4), seed=18)
    want = u.ort_run(models["m"], {"x": x})["y"]
    body = ok_json(srv.post_json("/v1/models/m/versions/1:predict", {"instances": x.tolist()}))
    u.assert_close(body["predictions"], want, "predictions")


def test_predict_b64_row(srv, models):
    x = u.randn((2, 4), seed=19)
    body = ok_json(srv.post_json("/v1/models/m:predict", {"instances": [{"b64": u.b64(r)} for r in x]}))
    u.assert_close(body["predictions"], u.ort_run(models["m"], {"x": x})["y"], "predictions (b64 rows)")


def test_predict_b64_columnar_named(srv):
    a, b = u.randn((2, 3), seed=20), u.randn((2, 3), seed=21)
    body = ok_json(srv.post_json("/v1/models/two:predict", {"inputs": {"a": {"b64": u.b64(a)}, "b": {"b64": u.b64(b)}}}))
    u.assert_close(body["outputs"], 2 * a + b, "outputs (b64 columnar)")


def test_predict_signature_name(srv, models):
    x = u.randn((2, 4), seed=22)
    body = ok_json(srv.post_json("/v1/models/m:predict", {"signature_name": "serving_default", "instances": x.tolist()}))
    u.assert_close(body["predictions"], u.ort_run(models["m"], {"x": x})["y"], "predictions")


def test_classify(srv, models):
    x = u.randn((2, 4), seed=23)
    body = ok_json(srv.post_json("/v1/models/cls:classify", {"examples": [{"x": r} for r in x.tolist()]}))
    want = u.ort_run(models["cls"], {"x": x})["probs"]
    res = body["results"]
    assert len(res) == 2, body
    for i, row in enumerate(res):
        assert [p[0] for p in row] == CLASS_LABELS, f"labels from signature.json expected, got {row}"
        u.assert_close([p[1] for p in row], want[i], f"classify scores of example {i}")


def test_regress(srv, models):
    x = u.randn((3, 4), seed=24)
    body = ok_json(srv.post_json("/v1/models/reg:regress", {"examples": [{"x": r} for r in x.tolist()]}))
    want = u.ort_run(models["reg"], {"x": x})["y"].reshape(-1)
    u.assert_close(body["results"], want, "regress results")


# ----------------------------------------------------------------------------------------------------------------
# KServe v2

def test_v2_server_metadata(srv):
    body = ok_json(srv.get("/v2"))
    assert isinstance(body.get("name"), str) and body["name"], body
    assert isinstance(body.get("version"), str) and body["version"], body
    assert isinstance(body.get("extensions"), list), body


def test_v2_health(srv):
    for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/m/ready", "/v2/models/m/versions/1/ready"):
        r = srv.get(path)
        assert r.status_code == 200, f"GET {path}: HTTP {r.status_code} {r.content[:300]!r}"


@pytest.mark.parametrize("path", ["/v2/models/m", "/v2/models/m/versions/1"])
def test_v2_model_metadata(srv, path):
    body = ok_json(srv.get(path))
    assert body["name"] == "m", body
    assert "1" in [str(v) for v in body.get("versions", [])], body
    assert body["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}], body
    assert body["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}], body


def test_v2_infer_json(srv, models):
    x = u.randn((2, 4), seed=30)
    req = {"id": "req-42", "inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": x.reshape(-1).tolist()}]}
    body = ok_json(srv.post_json("/v2/models/m/infer", req))
    assert body.get("id") == "req-42", body
    assert body["model_name"] == "m" and str(body["model_version"]) == "1", body
    (out,) = body["outputs"]
    assert out["name"] == "y" and out["datatype"] == "FP32" and out["shape"] == [2, 4], out
    u.assert_close(np.array(out["data"]).reshape(out["shape"]), u.ort_run(models["m"], {"x": x})["y"], "infer output")


def test_v2_infer_json_versioned_two_inputs(srv):
    a, b = u.randn((2, 3), seed=31), u.randn((2, 3), seed=32)
    req = {"inputs": [{"name": "a", "shape": [2, 3], "datatype": "FP32", "data": a.tolist()},  # nested data
                      {"name": "b", "shape": [2, 3], "datatype": "FP32", "data": b.reshape(-1).tolist()}],
           "outputs": [{"name": "y"}]}
    body = ok_json(srv.post_json("/v2/models/two/versions/1/infer", req))
    (out,) = body["outputs"]
    assert out["shape"] == [2, 3], out
    u.assert_close(np.array(out["data"]).reshape(2, 3), 2 * a + b, "infer output")


def _binary_request(inputs, outputs, binary_out=True):
    """inputs: [(name, array)] sent as binary; -> (body bytes, header length)."""
    hdr = {"inputs": [{"name": n, "shape": list(a.shape), "datatype": "FP32",
                       "parameters": {"binary_data_size": a.nbytes}} for n, a in inputs],
           "outputs": [{"name": o, "parameters": {"binary_data": binary_out}} for o in outputs]}
    js = json.dumps(hdr).encode()
    return js + b"".join(np.ascontiguousarray(a, dtype="<f4").tobytes() for _, a in inputs), len(js)


def _parse_binary_reply(resp):
    assert resp.status_code == 200, f"HTTP {resp.status_code}: {resp.content[:1000]!r}"
    hl = resp.headers.get("Inference-Header-Content-Length")
    assert hl is not None, f"no Inference-Header-Content-Length in reply headers {dict(resp.headers)}"
    n = int(hl)
    assert 0 < n <= len(resp.content), f"Inference-Header-Content-Length {n} vs body of {len(resp.content)} bytes"
    hdr = json.loads(resp.content[:n])
    pos, outs = n, {}
    for o in hdr["outputs"]:
        size = o.get("parameters", {}).get("binary_data_size")
        assert size is not None and "data" not in o, f"output not binary: {o}"
        assert o["datatype"] == "FP32", o
        outs[o["name"]] = np.frombuffer(resp.content[pos:pos + size], dtype="<f4").reshape(o["shape"])
        pos += size
    assert pos == len(resp.content), f"{len(resp.content) - pos} trailing bytes after the binary outputs"
    return hdr, outs


def test_v2_infer_binary(srv, models):
    x = u.randn((3, 4), seed=33)
    body, hl = _binary_request([("x", x)], ["y"])
    r = srv.post("/v2/models/m/infer", data=body, headers={"Inference-Header-Content-Length": str(hl),
                                                          "Content-Type": "application/octet-stream"})
    hdr, outs = _parse_binary_reply(r)
    u.assert_close(outs["y"], u.ort_run(models["m"], {"x": x})["y"], "binary infer output")


def test_v2_infer_binary_in_json_out(srv, models):
    x = u.randn((2, 4), seed=34)
    body, hl = _binary_request([("x", x)], ["y"], binary_out=False)
    r = srv.post("/v2/models/m/infer", data=body, headers={"Inference-Header-Content-Length": str(hl),
                                                          "Content-Type": "application/octet-stream"})
    out = ok_json(r)["outputs"][0]
    u.assert_close(np.array(out["data"]).reshape(out["shape"]), u.ort_run(models["m"], {"x": x})["y"], "output")


def test_v2_infer_json_in_binary_out(srv):
    a, b = u.randn((2, 3), seed=35), u.randn((2, 3), seed=36)
    req = {"inputs": [{"name": "a", "shape": [2, 3], "datatype": "FP32", "data": a.reshape(-1).tolist()},
                      {"name": "b", "shape": [2, 3], "datatype": "FP32", "data": b.reshape(-1).tolist()}],
           "parameters": {"binary_data_output": True}}
    hdr, outs = _parse_binary_reply(srv.post_json("/v2/models/two/infer", req))
    u.assert_close(outs["y"], 2 * a + b, "binary output")


def test_v2_repository_index(srv):
    r = srv.post("/v2/repository/index", data="{}", headers={"Content-Type": "application/json"})
    body = ok_json(r)
    assert isinstance(body, list), body
    seen = {(e["name"], str(e.get("version"))): e for e in body}
    for name in ("m", "two", "cls", "reg"):
        assert (name, "1") in seen, f"model {name} version 1 missing from {body}"
        assert seen[(name, "1")].get("state") == "READY", f"Triton reports loaded models as READY: {seen[(name, '1')]}"


# ----------------------------------------------------------------------------------------------------------------
# metrics

@pytest.mark.parametrize("path", ["/monitoring/prometheus/metrics", "/metrics"])
def test_metrics(srv, path):
    x = u.randn((1, 4), seed=40)
    ok_json(srv.post_json("/v1/models/m:predict", {"instances": x.tolist()}))
    r = srv.get(path)
    assert r.status_code == 200, f"GET {path}: HTTP {r.status_code}"
    assert r.headers.get("Content-Type", "").startswith("text/plain"), r.headers
    samples = u.metric_samples(r.text, "tensord_request_count", model="m", version="1")
    assert samples, f"no tensord_request_count{{model=\"m\",version=\"1\"}} in:\n{r.text[:3000]}"
    assert sum(v for lb, v in samples if lb.get("api") == "predict" and lb.get("status") == "OK") >= 1, samples
    assert u.metric_samples(r.text, "tensord_request_latency_us_count", model="m", version="1"), \
        f"no request latency histogram for m/1:\n{r.text[:3000]}"


# ----------------------------------------------------------------------------------------------------------------
# a stock KServe client

def test_tritonclient_http(srv, models):
    try:
        import tritonclient.http as httpclient
    except ImportError as e:  # a missing test dependency is a broken setup, not a reason to skip
        pytest.fail(f"tritonclient[http] (tests/requirements.txt) is not installed: {e}; run `make deps`")
    c = httpclient.InferenceServerClient(url=f"127.0.0.1:{srv.port}", connection_timeout=10, network_timeout=20)
    try:
        assert c.is_server_live() and c.is_server_ready()
        assert c.is_model_ready("m")
        md = c.get_model_metadata("m")
        assert md["name"] == "m" and md["inputs"][0]["datatype"] == "FP32", md
        x = u.randn((2, 4), seed=41)
        want = u.ort_run(models["m"], {"x": x})["y"]
        for binary in (True, False):
            inp = httpclient.InferInput("x", [2, 4], "FP32")
            inp.set_data_from_numpy(x, binary_data=binary)
            out = httpclient.InferRequestedOutput("y", binary_data=binary)
            res = c.infer("m", [inp], outputs=[out], model_version="1")
            u.assert_close(res.as_numpy("y"), want, f"tritonclient infer (binary={binary})")
    finally:
        c.close()


# ----------------------------------------------------------------------------------------------------------------
# version labels with model_version_policy specific

def test_labels_and_specific_versions(tmp_path):
    base = tmp_path / "m"
    v1, v2, v3 = u.mm_model(seed=101), u.mm_model(seed=102), u.mm_model(seed=103)
    for v, model in ((1, v1), (2, v2), (3, v3)):
        u.write_version(base, v, model)
    conf = u.write_text(tmp_path / "models.config", u.model_config_text(
        [{"name": "m", "base_path": str(base), "policy": ("specific", [1, 2]), "labels": {"stable": 1}}]))
    with u.Server(tmp_path, config_file=conf) as s:
        body = ok_json(s.get("/v1/models/m"))
        got = sorted((e["version"], e["state"]) for e in body["model_version_status"])
        assert got == [("1", "AVAILABLE"), ("2", "AVAILABLE")], f"{body}\n{s.describe()}"
        body = ok_json(s.get("/v1/models/m/labels/stable"))
        assert body == {"model_version_status": [OK_STATUS]}, body
        x = u.randn((2, 4), seed=50)
        for path, model in (("/v1/models/m/labels/stable:predict", v1), ("/v1/models/m/versions/1:predict", v1),
                            ("/v1/models/m/versions/2:predict", v2), ("/v1/models/m:predict", v2)):
            body = ok_json(s.post_json(path, {"instances": x.tolist()}))
            u.assert_close(body["predictions"], u.ort_run(model, {"x": x})["y"], f"POST {path}")
        md = ok_json(s.get("/v1/models/m/labels/stable/metadata"))
        assert str(md["model_spec"]["version"]) == "1", md
        # version 3 is on disk but outside the policy: never loaded
        r = s.post_json("/v1/models/m/versions/3:predict", {"instances": x.tolist()})
        u.check_error(r, 404)


# ----------------------------------------------------------------------------------------------------------------
# readiness before the first version loads

def test_ready_503_until_first_version(tmp_path):
    base = tmp_path / "m"
    base.mkdir()
    with u.Server(tmp_path, base_path=str(base), ready=False, poll=0.2) as s:
        for path in ("/v2/health/ready", "/v2/models/m/ready"):
            r = s.get(path)
            assert r.status_code == 503, f"GET {path} before any version: HTTP {r.status_code}, want 503\n{s.describe()}"
        r = s.post_json("/v1/models/m:predict", {"instances": [[1, 2, 3, 4]]})
        assert r.status_code in (404, 503), f"predict before any version: HTTP {r.status_code} {r.content[:300]!r}"
        u.error_text(r)
        model = u.mm_model(seed=7)
        u.write_version(base, 1, model)
        assert s.wait_ready(timeout=30), f"not ready 30 s after version 1 appeared\n{s.describe()}"
        assert s.get("/v2/models/m/ready").status_code == 200
        x = u.randn((1, 4), seed=51)
        body = ok_json(s.post_json("/v1/models/m:predict", {"instances": x.tolist()}))
        u.assert_close(body["predictions"], u.ort_run(model, {"x": x})["y"], "predictions")


# ----------------------------------------------------------------------------------------------------------------
# concurrent requests without batching: each inference must use its own activations

def test_concurrent_requests_distinct_inputs(tmp_path):
    """8 client threads x 12 requests with distinct inputs, no batching, on the seed CNN (Conv/MaxPool/MatMul:
    oneDNN primitives and planned activation buffers) and a MatMul chain: every reply matches onnxruntime on its own
    input. The same input in every request (as in a load test) would hide shared buffers; distinct inputs do not."""
    cnn, chain = u.cnn_model(), u.slow_model(d=64, fan=8, layers=4)
    u.write_version(tmp_path / "cnn", 1, cnn)
    u.write_version(tmp_path / "chain", 1, chain)
    conf = u.write_text(tmp_path / "models.config", u.model_config_text(
        [{"name": "cnn", "base_path": str(tmp_path / "cnn")}, {"name": "chain", "base_path": str(tmp_path / "chain")}]))
    import threading
    with u.Server(tmp_path, config_file=conf) as s:
        def worker(i, out):
            sess = requests.Session()
            bad = []
            for k in range(12):
                name, model = ("cnn", cnn) if k % 2 == 0 else ("chain", chain)
                rows = 1 + (i + k) % 3
                x = u.randn((rows, 1, 28, 28) if name == "cnn" else (rows, 64), seed=100 * i + k)
                try:
                    r = s.post_json(f"/v1/models/{name}:predict", {"instances": x.tolist()}, session=sess, timeout=60)
                except requests.RequestException as e:
                    bad.append(f"{name}: {type(e).__name__}: {e}")
                    break
                if r.status_code != 200:
                    bad.append(f"{name}: HTTP {r.status_code} {r.content[:200]!r}")
                    continue
                want = u.ort_run(model, {"x": x})["y"]
                got = np.asarray(r.json()["predictions"], dtype=np.float64)
                if got.shape != want.shape or u.max_rel_err(got, want) > u.TOL:
                    bad.append(f"{name} thread {i} request {k}: max rel err "
                               f"{u.max_rel_err(got, want) if got.shape == want.shape else got.shape}")
            out[i] = bad

        out = [None] * 8
        ths = [threading.Thread(target=worker, args=(i, out), daemon=True) for i in range(8)]
        for t in ths:
            t.start()
        for t in ths:
            t.join(timeout=120)
        assert all(not t.is_alive() for t in ths), f"client threads hung\n{s.describe()}"
        bad = [b for bs in out for b in (bs or [])]
        assert s.alive(), f"tensord died under 8 concurrent clients: {bad[:3]}\n{s.describe()}"
        assert not bad, f"{len(bad)} wrong or failed replies under concurrency, e.g. {bad[:4]}\n{s.describe()}"
