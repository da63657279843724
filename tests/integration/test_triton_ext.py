"""Triton's extensions that tritonclient users call, against the real binary with tritonclient.http, and the
metrics behind them:

  get_model_config          GET /v2/models/{m}[/versions/{v}]/config: Triton's JSON (platform, max_batch_size,
                            dims without the batch dim, dynamic_batching only with batching, instance_group)
  get_inference_statistics  GET /v2/models[/{m}[/versions/{v}]]/stats: per-version counts and durations, which
                            must agree with /metrics (they come from the same store), /v1 requests included
  classification            InferRequestedOutput(name, class_count=k): BYTES "value:index[:label]", top k by
                            value, descending, shape [batch, k]; JSON and binary
  metrics cardinality       20k requests with junk version labels leave one label="unknown" series, and a
                            version deployed afterwards gets all its series; a retired version's series go

See serving_util.py for the server helper. Every HTTP call carries a timeout.
"""
import threading
import time

import numpy as np
import pytest
import requests

import serving_util as u

try:
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException
except ImportError as e:  # a missing test dependency is a broken setup, not a reason to skip
    pytest.fail(f"tritonclient[http] (tests/requirements.txt) is not installed: {e}; run `make deps`",
                allow_module_level=True)

LABELS = ["cat", "dog", "bird", "fish", "frog"]
INFER_APIS = ("predict", "classify", "regress", "infer")
BATCHING = """max_batch_size { value: 8 }
batch_timeout_micros { value: 2000 }
max_enqueued_batches { value: 16 }
num_batch_threads { value: 2 }
"""


def fixed_model():
    """y = x + 1 with static shapes x [2,3] -> y [2,3]: no batch dimension for Triton (max_batch_size 0)."""
    from onnx import helper
    return u._model([helper.make_node("Add", ["x", "one"], ["y"])], [("x", [2, 3])], [("y", [2, 3])],
                    [("one", np.float32([1.0]))])


@pytest.fixture(scope="module")
def models():
    return {"cls": u.classifier_model(4, 5, seed=21), "nolab": u.classifier_model(4, 5, seed=22),
            "st": u.mm_model(4, 4, seed=23), "fixed": fixed_model()}


def _config(tmp, models):
    cfg = []
    for name, model in models.items():
        base = tmp / "models" / name
        u.write_version(base, 1, model, signature={"labels": LABELS} if name == "cls" else None)
        cfg.append({"name": name, "base_path": str(base)})
    return u.write_text(tmp / "models.config", u.model_config_text(cfg))


@pytest.fixture(scope="module")
def srv(tmp_path_factory, models):
    tmp = tmp_path_factory.mktemp("triton_ext")
    s = u.Server(tmp, config_file=_config(tmp, models))
    yield s
    u.server_fixture_finalize(s)


@pytest.fixture(scope="module")
def bsrv(tmp_path_factory, models):
    tmp = tmp_path_factory.mktemp("triton_ext_batching")
    bp = u.write_text(tmp / "batching.config", BATCHING)
    s = u.Server(tmp, config_file=_config(tmp, models),
                 extra=["--enable_batching", f"--batching_parameters_file={bp}", "--rest_api_num_threads=16"])
    yield s
    u.server_fixture_finalize(s)


def client(s):
    return httpclient.InferenceServerClient(url=f"127.0.0.1:{s.port}", connection_timeout=10, network_timeout=30)


def metrics(s):
    r = s.get("/metrics")
    assert r.status_code == 200, f"GET /metrics: HTTP {r.status_code}"
    return r.text


def request_counts(text, model, version):
    """(OK, not OK) inference requests of (model, version) in tensord_request_count, over labels and APIs."""
    ok = bad = 0
    for lb, v in u.metric_samples(text, "tensord_request_count", model=model, version=str(version)):
        if lb.get("api") not in INFER_APIS:
            continue
        if lb.get("status") == "OK":
            ok += v
        else:
            bad += v
    return ok, bad


# ----------------------------------------------------------------------------------------------------------------
# model configuration

def instances(srv, model):
    """The execution instances /metrics reports for the model's version 1 (Triton's instance_group count)."""
    got = u.metric_samples(srv.get("/metrics").text, "tensord_model_instances", model=model, version="1")
    assert len(got) == 1, got
    return int(got[0][1])


def test_model_config(srv):
    c = client(srv)
    try:
        for cfg in (c.get_model_config("cls"), c.get_model_config("cls", model_version="1")):
            assert cfg["name"] == "cls" and cfg["platform"] == "onnxruntime_onnx", cfg
            # dim 0 of every input and output is dynamic: Triton's ONNX auto-complete gives max_batch_size 4
            assert cfg["max_batch_size"] == 4, cfg
            assert [(i["name"], i["data_type"], i["dims"]) for i in cfg["input"]] == [("x", "TYPE_FP32", [4])], cfg
            assert [(o["name"], o["data_type"], o["dims"]) for o in cfg["output"]] == [("probs", "TYPE_FP32", [5])], cfg
            assert "dynamic_batching" not in cfg, f"batching is off: {cfg}"
            assert [(g["count"], g["kind"]) for g in cfg["instance_group"]] == [(instances(srv, "cls"), "KIND_CPU")], cfg
        fixed = c.get_model_config("fixed")
        assert fixed["max_batch_size"] == 0, fixed
        assert fixed["input"][0]["dims"] == [2, 3] and fixed["output"][0]["dims"] == [2, 3], fixed
        with pytest.raises(InferenceServerException):
            c.get_model_config("no_such_model")
        with pytest.raises(InferenceServerException):
            c.get_model_config("cls", model_version="7")
    finally:
        c.close()
    r = srv.post("/v2/models/cls/config", data="{}")
    u.check_error(r, 405)


def test_model_config_batching(bsrv):
    c = client(bsrv)
    try:
        cfg = c.get_model_config("st")
        assert cfg["max_batch_size"] == 8, cfg
        assert cfg["input"][0]["dims"] == [4] and cfg["output"][0]["dims"] == [4], cfg
        assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 2000, cfg
        assert [(g["count"], g["kind"]) for g in cfg["instance_group"]] == [(instances(bsrv, "st"), "KIND_CPU")], cfg
    finally:
        c.close()


def test_server_metadata_lists_extensions(srv):
    c = client(srv)
    try:
        ext = c.get_server_metadata()["extensions"]
    finally:
        c.close()
    for e in ("classification", "model_configuration", "statistics", "binary_tensor_data"):
        assert e in ext, ext


# ----------------------------------------------------------------------------------------------------------------
# statistics

def _stat(stats, name, version):
    got = [m for m in stats["model_stats"] if m["name"] == name and m["version"] == str(version)]
    assert len(got) == 1, f"{name}/{version} once in {stats}"
    return got[0]


def _check_stats(stat, text, model, ok, bad, rows):
    inf = stat["inference_stats"]
    assert inf["success"]["count"] == ok, stat
    assert inf["fail"]["count"] == bad, stat
    for k in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert inf[k]["count"] == ok, (k, stat)
    assert inf["compute_infer"]["ns"] > 0 and inf["compute_input"]["ns"] > 0 and inf["success"]["ns"] > 0, stat
    assert inf["success"]["ns"] >= inf["compute_infer"]["ns"], stat
    assert stat["inference_count"] == rows, stat
    assert stat["last_inference"] > 1.5e12, stat  # ms since the epoch
    # the same figures in /metrics
    assert request_counts(text, model, 1) == (ok, bad), (request_counts(text, model, 1), stat)
    for k, v in inf.items():
        if k.startswith("cache"):
            continue
        got = u.metric_samples(text, "tensord_inference_stats_count", model=model, version="1", stat=k)
        assert [x for _, x in got] == [v["count"]], (k, got, v)
        got = u.metric_samples(text, "tensord_inference_stats_ns", model=model, version="1", stat=k)
        assert [x for _, x in got] == [v["ns"]], (k, got, v)
    assert [x for _, x in u.metric_samples(text, "tensord_inference_count", model=model, version="1")] == [rows]
    assert [x for _, x in u.metric_samples(text, "tensord_inference_exec_count", model=model, version="1")] == \
        [stat["execution_count"]]


def _traffic(s, c, model, rows_list):
    """Successes over v2 (tritonclient, binary and JSON) and /v1, then failures over both: (ok, bad, rows)."""
    ok = rows = 0
    for i, n in enumerate(rows_list):
        x = u.randn((n, 4), seed=300 + i)
        if i % 3 == 2:
            r = s.post_json(f"/v1/models/{model}:predict", {"instances": x.tolist()})
            assert r.status_code == 200, r.content[:300]
        else:
            inp = httpclient.InferInput("x", [n, 4], "FP32")
            inp.set_data_from_numpy(x, binary_data=i % 2 == 0)
            c.infer(model, [inp], model_version="1")
        ok += 1
        rows += n
    bad = 0
    inp = httpclient.InferInput("x", [1, 5], "FP32")  # wrong shape: refused after the version was acquired
    inp.set_data_from_numpy(u.randn((1, 5), seed=1))
    for _ in range(2):
        with pytest.raises(InferenceServerException):
            c.infer(model, [inp])
        bad += 1
    r = s.post_json(f"/v1/models/{model}:predict", {"instances": [[1, 2]]})
    u.check_error(r, 400)
    bad += 1
    r = s.post(f"/v1/models/{model}:predict", data="{not json", headers={"Content-Type": "application/json"})
    u.check_error(r, 400)
    bad += 1
    return ok, bad, rows


def test_inference_statistics(srv):
    c = client(srv)
    try:
        ok, bad, rows = _traffic(srv, c, "st", [1, 2, 3, 1, 4, 2, 1])
        one = c.get_inference_statistics("st", model_version="1")
        assert len(one["model_stats"]) == 1, one
        text = metrics(srv)
        stat = _stat(one, "st", 1)
        _check_stats(stat, text, "st", ok, bad, rows)
        assert stat["execution_count"] == ok, stat  # no batching: one run per successful request
        assert sum(b["compute_infer"]["count"] for b in stat["batch_stats"]) == ok, stat
        assert {b["batch_size"] for b in stat["batch_stats"]} == {1, 2, 3, 4}, stat
        assert _stat(c.get_inference_statistics("st"), "st", 1) == stat
        every = c.get_inference_statistics()
        assert _stat(every, "st", 1) == stat
        for name in ("cls", "nolab", "fixed"):
            _stat(every, name, 1)
        with pytest.raises(InferenceServerException):
            c.get_inference_statistics("st", model_version="5")
        with pytest.raises(InferenceServerException):
            c.get_inference_statistics("no_such_model")
    finally:
        c.close()


def test_inference_statistics_batching(bsrv):
    """Through the batcher (asynchronous requests, merged batches): the same agreement with /metrics, and queue
    time is the wait in the batching queue."""
    c = client(bsrv)
    try:
        ok, bad, rows = _traffic(bsrv, c, "st", [1, 2, 1, 3])

        def burst(i):
            cc = client(bsrv)
            try:
                inp = httpclient.InferInput("x", [1, 4], "FP32")
                inp.set_data_from_numpy(u.randn((1, 4), seed=900 + i))
                for _ in range(5):
                    cc.infer("st", [inp])
            finally:
                cc.close()

        ths = [threading.Thread(target=burst, args=(i,), daemon=True) for i in range(6)]
        for t in ths:
            t.start()
        for t in ths:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in ths), "client threads hung"
        ok += 30
        rows += 30
        stat = _stat(c.get_inference_statistics("st", model_version="1"), "st", 1)
        _check_stats(stat, metrics(bsrv), "st", ok, bad, rows)
        assert stat["execution_count"] <= ok, stat
        assert stat["inference_stats"]["queue"]["ns"] > 0, stat
    finally:
        c.close()


# ----------------------------------------------------------------------------------------------------------------
# classification

def _expected(probs, k, labels):
    out = []
    for row in np.atleast_2d(probs):
        order = sorted(range(len(row)), key=lambda i: (-float(row[i]), i))[:k]
        out.append([f"{float(row[i]):f}:{i}" + (f":{labels[i]}" if labels else "") for i in order])
    return out


def _strings(arr):
    return [[e.decode() if isinstance(e, bytes) else str(e) for e in row] for row in arr]


@pytest.mark.parametrize("server", ["srv", "bsrv"])
@pytest.mark.parametrize("model,labels", [("cls", LABELS), ("nolab", None)])
def test_classification(request, server, model, labels, models):
    s = request.getfixturevalue(server)
    x = u.randn((3, 4), seed=77)
    probs = u.ort_run(models[model], {"x": x})["probs"]
    c = client(s)
    try:
        for k in (1, 3, 7):
            for binary in (True, False):
                inp = httpclient.InferInput("x", [3, 4], "FP32")
                inp.set_data_from_numpy(x, binary_data=binary)
                out = httpclient.InferRequestedOutput("probs", binary_data=binary, class_count=k)
                res = c.infer(model, [inp], outputs=[out])
                got = res.as_numpy("probs")
                kk = min(k, 5)
                assert got.shape == (3, kk), (k, binary, got)
                assert res.get_output("probs")["datatype"] == "BYTES", res.get_response()
                want = _expected(probs, kk, labels)
                got_s = _strings(got)
                for r in range(3):
                    assert [e.split(":", 1)[1] for e in got_s[r]] == [e.split(":", 1)[1] for e in want[r]], \
                        (k, binary, got_s, want)
                    for g, w in zip(got_s[r], want[r]):
                        assert abs(float(g.split(":")[0]) - float(w.split(":")[0])) <= 1e-5, (g, w)
    finally:
        c.close()


def test_classification_unbatched(srv, models):
    """A model without a batch dimension (max_batch_size 0): the whole output is one classification, shape [k]."""
    x = u.randn((2, 3), seed=79)
    y = u.ort_run(models["fixed"], {"x": x})["y"].flatten()
    want = [f"{float(y[i]):f}:{i}" for i in sorted(range(6), key=lambda i: (-float(y[i]), i))[:4]]
    c = client(srv)
    try:
        for binary in (True, False):
            inp = httpclient.InferInput("x", [2, 3], "FP32")
            inp.set_data_from_numpy(x, binary_data=binary)
            res = c.infer("fixed", [inp], outputs=[httpclient.InferRequestedOutput("y", binary_data=binary,
                                                                                   class_count=4)])
            got = res.as_numpy("y")
            assert got.shape == (4,), got
            got_s = _strings([got])[0]
            assert [g.split(":", 1)[1] for g in got_s] == [w.split(":", 1)[1] for w in want], (got_s, want)
    finally:
        c.close()


def test_classification_raw_json(srv, models):
    x = u.randn((2, 4), seed=78)
    probs = u.ort_run(models["cls"], {"x": x})["probs"]
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4], "data": x.flatten().tolist()}],
            "outputs": [{"name": "probs", "parameters": {"classification": 2}}]}
    r = srv.post_json("/v2/models/cls/infer", body)
    assert r.status_code == 200, r.content[:500]
    o = r.json()["outputs"][0]
    assert o["datatype"] == "BYTES" and o["shape"] == [2, 2], o
    assert len(o["data"]) == 4 and all(isinstance(e, str) and e.count(":") == 2 for e in o["data"]), o
    want = _expected(probs, 2, LABELS)
    assert [e.split(":", 1)[1] for e in o["data"]] == [e.split(":", 1)[1] for row in want for e in row], (o, want)
    # k = 0 is the raw tensor; a negative or fractional count is refused
    body["outputs"][0]["parameters"]["classification"] = 0
    o = srv.post_json("/v2/models/cls/infer", body).json()["outputs"][0]
    assert o["datatype"] == "FP32" and o["shape"] == [2, 5], o
    for bad in (-1, 1.5, "2"):
        body["outputs"][0]["parameters"]["classification"] = bad
        u.check_error(srv.post_json("/v2/models/cls/infer", body), 400, "classification")


# ----------------------------------------------------------------------------------------------------------------
# metrics cardinality: URL junk never fills the metrics; retired versions' series go

def _version_state(s, model, version):
    r = s.get(f"/v1/models/{model}")
    if r.status_code != 200:
        return None
    for e in r.json()["model_version_status"]:
        if e["version"] == str(version):
            return e["state"]
    return None


def _wait(what, fn, s, timeout=30):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if fn():
            return
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}\n{s.describe()}")


def test_unknown_labels_do_not_fill_metrics(tmp_path):
    base_m, base_r = tmp_path / "m", tmp_path / "r"
    u.write_version(base_m, 1, u.mm_model(seed=31))
    u.write_version(base_r, 1, u.mm_model(seed=32))
    conf = u.write_text(tmp_path / "models.config", u.model_config_text(
        [{"name": "m", "base_path": str(base_m), "policy": "all", "labels": {"stable": 1}},
         {"name": "r", "base_path": str(base_r)}]))
    x = u.randn((1, 4), seed=33).tolist()
    with u.Server(tmp_path, config_file=conf, extra=["--rest_api_num_threads=8"]) as s:
        n_threads, per = 4, 5000
        failures = []

        def junk(t):
            sess = requests.Session()
            body = '{"instances": [[1, 2, 3, 4]]}'
            try:
                for i in range(per):
                    r = sess.post(s.url(f"/v1/models/m/labels/junk{t}_{i}:predict"), data=body, timeout=u.HTTP_TIMEOUT)
                    if r.status_code != 404:
                        failures.append(r.status_code)
            except requests.RequestException as e:
                failures.append(repr(e))
            finally:
                sess.close()

        t0 = time.monotonic()
        ths = [threading.Thread(target=junk, args=(t,), daemon=True) for t in range(n_threads)]
        for t in ths:
            t.start()
        for t in ths:
            t.join(timeout=240)
        assert not any(t.is_alive() for t in ths), f"junk-label clients hung\n{s.describe()}"
        assert not failures, f"{len(failures)} junk-label requests did not get 404, e.g. {failures[:3]}"
        took = time.monotonic() - t0
        # junk of the other kinds: versions, models, a label on a status request
        for i in range(50):
            assert s.post_json(f"/v1/models/m/versions/{9000 + i}:predict", {"instances": x}).status_code == 404
            assert s.post_json(f"/v1/models/junkmodel{i}:predict", {"instances": x}).status_code == 404
            assert s.get(f"/v1/models/m/labels/junkstatus{i}").status_code == 404
            assert s.post_json(f"/v2/models/m/versions/{9000 + i}/infer", {"inputs": []}).status_code in (400, 404)
        ok = s.post_json("/v1/models/m/labels/stable:predict", {"instances": x})
        assert ok.status_code == 200, ok.content[:300]

        text = metrics(s)
        samples = u.metric_samples(text, "tensord_request_count")
        labels = {lb.get("label") for lb, _ in samples} - {None}
        assert labels == {"unknown", "stable"}, f"label values beyond the configured ones: {sorted(labels)[:10]}"
        unknown = sum(v for lb, v in samples if lb.get("label") == "unknown")
        assert unknown == n_threads * per + 50, unknown
        assert sum(v for lb, v in samples if lb.get("label") == "stable" and lb.get("version") == "1") == 1
        versions = {lb.get("version") for lb, _ in samples}
        models = {lb.get("model") for lb, _ in samples}
        assert versions <= {"", "1"}, f"URL versions leaked into the metrics: {sorted(versions)[:10]}"
        assert models <= {"", "m", "r"}, f"URL model names leaked into the metrics: {sorted(models)[:10]}"
        assert len(samples) < 50, f"{len(samples)} request series after the junk requests"
        assert [v for _, v in u.metric_samples(text, "tensord_metrics_dropped_series_total")] == [0]

        # a version deployed afterwards gets its series
        u.write_version(base_m, 2, u.mm_model(seed=34))
        _wait("m version 2 AVAILABLE", lambda: _version_state(s, "m", 2) == "AVAILABLE", s)
        r = s.post_json("/v1/models/m/versions/2:predict", {"instances": x})
        assert r.status_code == 200, r.content[:300]
        c = client(s)
        try:
            inp = httpclient.InferInput("x", [1, 4], "FP32")
            inp.set_data_from_numpy(np.asarray(x, dtype=np.float32))
            c.infer("m", [inp], model_version="2")
            stat = _stat(c.get_inference_statistics("m", model_version="2"), "m", 2)
        finally:
            c.close()
        text = metrics(s)
        assert request_counts(text, "m", 2) == (2, 0), request_counts(text, "m", 2)
        assert stat["inference_stats"]["success"]["count"] == 2, stat
        assert u.metric_samples(text, "tensord_request_latency_us_count", model="m", version="2", api="predict")
        assert u.metric_samples(text, "tensord_model_version_state", model="m", version="2")

        # a retired version's request series (and statistics) go when it retires
        for _ in range(3):
            assert s.post_json("/v1/models/r:predict", {"instances": x}).status_code == 200
        assert request_counts(metrics(s), "r", 1) == (3, 0)
        u.write_version(base_r, 2, u.mm_model(seed=35))
        _wait("r version 1 to end", lambda: _version_state(s, "r", 1) in (None, "END"), s)
        _wait("r version 1's metrics to go",
              lambda: not u.metric_samples(metrics(s), "tensord_model_version_state", model="r", version="1"), s)
        text = metrics(s)
        for name in ("tensord_request_count", "tensord_request_latency_us_count", "tensord_inference_stats_count",
                     "tensord_inference_count"):
            assert not u.metric_samples(text, name, model="r", version="1"), (name, "r/1 still has series")
        assert u.metric_samples(text, "tensord_model_swap_count", model="r", version="1", event="unload")
        c = client(s)
        try:
            assert [m["version"] for m in c.get_inference_statistics("r")["model_stats"]] == ["2"]
        finally:
            c.close()
    print(f"{n_threads * per} junk-label requests in {took:.1f} s")
