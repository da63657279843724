"""Serving on devices: `tensord serve --device SPEC` and a model config's `device` field (server/device.h), run on
"sim", the engine's host-memory test device (TENSORD_SIM_MEMORY caps its memory, TENSORD_SIM_DEVICES sets how many,
TENSORD_SIM_FAIL_KERNEL=name:N fails the N-th launch of a kernel), since this machine has no GPU.

Bad conditions, each with the server kept serving what it can:
  - a version that does not fit its device's memory fails its own load (RESOURCE_EXHAUSTED, "out of memory",
    naming the device); a small model on the same device serves, equal to the CPU and to onnxruntime;
  - a kernel that fails inside a batch fails that request (HTTP 500, gRPC INTERNAL) with the engine's text, and the
    next requests are answered correctly;
  - `--device cuda:0` with no GPU fails that model's load with "not available" and the reason; cpu models serve;
  - bad device specs are refused at start, naming the model and the device;
  - `--device sim:0,sim:1`: one instance per device (or instance_count spread round-robin), answers equal the CPU's,
    tensord_device_memory_bytes for both devices, Triton's config lists KIND_GPU groups;
  - the default ("auto") logs "no CUDA device, using CPU" exactly once.
"""
import json
import os
import subprocess
import threading
import time

import numpy as np
import pytest

import serving_util as u

EXACT = 1e-5  # sim runs the CPU's kernels: answers equal the CPU's and onnxruntime's to this (max abs / max |want|)
NO_CUDA = "no CUDA device, using CPU"


def sim_env(**kw):
    env = dict(os.environ)
    for k in ("TENSORD_SIM_MEMORY", "TENSORD_SIM_DEVICES", "TENSORD_SIM_FAIL_KERNEL", "TENSORD_DEVICE"):
        env.pop(k, None)
    env.update({k: str(v) for k, v in kw.items()})
    return env


def big_model():
    """y = x @ W with a 4 MiB W (x [N,1024] -> y [N,1024])."""
    return u._model([u.helper.make_node("MatMul", ["x", "W"], ["y"])], [("x", ["N", 1024])], [("y", ["N", 1024])],
                    [("W", u.randn((1024, 1024), 21, 0.05))])


def config(models):
    """[{name, base_path, device?, instance_count?}] -> model_config_list text."""
    out = ["model_config_list {"]
    for m in models:
        out.append(f"  config {{ name: '{m['name']}' base_path: '{m['base_path']}' model_platform: 'onnx'")
        if "device" in m:
            out.append(f"    device: '{m['device']}'")
        if "instance_count" in m:
            out.append(f"    instance_count: {m['instance_count']}")
        out.append("  }")
    return "\n".join(out + ["}"]) + "\n"


def statuses(srv, model):
    r = srv.get(f"/v1/models/{model}", timeout=10)
    if r.status_code != 200:
        return []
    return r.json()["model_version_status"]


def wait_settled(srv, models, timeout=60):
    """Wait until version 1 of every model is AVAILABLE or END; -> {model: its status entry}."""
    end = time.monotonic() + timeout
    out = {}
    while time.monotonic() < end:
        out = {}
        for m in models:
            st = [e for e in statuses(srv, m) if e["version"] == "1" and e["state"] in ("AVAILABLE", "END")]
            if st:
                out[m] = st[0]
        if len(out) == len(models):
            return out
        time.sleep(0.05)
    pytest.fail(f"models {models} did not settle within {timeout} s: {out}\n{srv.describe()}")


def predict(srv, model, x):
    r = srv.post_json(f"/v1/models/{model}:predict", {"instances": x.tolist()})
    assert r.status_code == 200, f"{model}: HTTP {r.status_code} {r.text[:500]}\n{srv.describe()}"
    return np.array(r.json()["predictions"], dtype=np.float64)


def assert_exact(got, want, what):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    err = u.max_rel_err(got, want)
    assert err <= EXACT, f"{what}: max|got-want|/max|want| = {err:.3e} > {EXACT:g}"


def metrics(srv):
    r = srv.get("/metrics")
    assert r.status_code == 200
    return r.text


def no_gpu_here():
    """The tests that need the CUDA device to be missing skip on a machine that has one."""
    cp = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True) if _which("nvidia-smi") else None
    return not (cp and cp.returncode == 0 and "GPU" in cp.stdout)


def _which(cmd):
    return any(os.access(os.path.join(p, cmd), os.X_OK) for p in os.environ.get("PATH", "").split(os.pathsep))


@pytest.fixture(scope="module")
def mm():
    return u.mm_model(64, 32, seed=11)


# ----------------------------------------------------------------------------------------------------------------
# a. out of device memory while loading a version

def test_version_that_does_not_fit_the_device_fails_alone(tmp_path, mm):
    big = big_model()
    u.write_version(tmp_path / "small", 1, mm)
    u.write_version(tmp_path / "big", 1, big)
    conf = u.write_text(tmp_path / "models.config", config([
        {"name": "small", "base_path": str(tmp_path / "small"), "device": "sim:0"},
        {"name": "big", "base_path": str(tmp_path / "big"), "device": "sim:0"},
        {"name": "small_cpu", "base_path": str(tmp_path / "small"), "device": "cpu"}]))
    # 2 MB of device memory: the big model's 4 MiB weight can never fit; the small one needs ~9 KB
    with u.Server(tmp_path, config_file=conf, ready=False, env=sim_env(TENSORD_SIM_MEMORY=2_000_000)) as s:
        st = wait_settled(s, ["small", "big", "small_cpu"])
        assert st["big"]["state"] == "END", st
        bst = st["big"]["status"]
        assert bst["error_code"] == "RESOURCE_EXHAUSTED", bst
        for word in ("out of memory", "sim:0", "big"):
            assert word in bst["error_message"], (word, bst)
        assert st["small"]["state"] == "AVAILABLE" and st["small_cpu"]["state"] == "AVAILABLE", st
        r = s.post_json("/v1/models/big:predict", {"instances": [[0.0] * 1024]})
        assert r.status_code in (404, 503), r.text
        for seed in range(3):
            x = u.randn((1 + seed, 64), seed=40 + seed)
            got = predict(s, "small", x)
            assert_exact(got, predict(s, "small_cpu", x), "sim:0 vs cpu")
            assert_exact(got, u.ort_run(mm, {"x": x})["y"], "sim:0 vs onnxruntime")
        assert "load_failed model=big" in s.stderr() and "out of memory" in s.stderr()
        dev = {lb["model"]: v for lb, v in u.metric_samples(metrics(s), "tensord_device_memory_bytes", device="sim:0")}
        assert set(dev) == {"small"} and dev["small"] > 0, dev


# ----------------------------------------------------------------------------------------------------------------
# b. a kernel failing inside a batch

BATCHING = """max_batch_size { value: 8 }
batch_timeout_micros { value: 2000 }
max_enqueued_batches { value: 16 }
num_batch_threads { value: 1 }
"""


def test_kernel_failure_in_a_batch_fails_that_request_only(tmp_path, mm):
    u.write_version(tmp_path / "m", 1, mm)
    bp = u.write_text(tmp_path / "batching.config", BATCHING)
    # the load compiles one plan per device instance (one MatMul launch: #1); the first request's batch is #2
    env = sim_env(TENSORD_SIM_FAIL_KERNEL="matmul:2")
    with u.Server(tmp_path, base_path=tmp_path / "m", model_name="m", grpc=True, env=env,
                  extra=["--device=sim:0", "--enable_batching", f"--batching_parameters_file={bp}"]) as s:
        results = []
        for i in range(6):
            x = u.randn((2, 64), seed=60 + i)
            r = s.post_json("/v1/models/m:predict", {"instances": x.tolist()})
            results.append((x, r))
        failed = [r for _, r in results if r.status_code != 200]
        assert len(failed) == 1, [(r.status_code, r.text[:200]) for _, r in results]
        msg = u.check_error(failed[0], 500, "injected launch failure", "sim:0", "matmul")
        assert "model 'm' version 1" in msg, msg
        first_bad = next(i for i, (_, r) in enumerate(results) if r.status_code != 200)
        assert any(r.status_code == 200 for _, r in results[first_bad + 1:]), "nothing answered after the failure"
        for x, r in results:
            if r.status_code == 200:
                assert_exact(np.array(r.json()["predictions"]), u.ort_run(mm, {"x": x})["y"], "after the failure")
        # gRPC (KServe v2): a failing launch is INTERNAL with the text; the next request is answered
        import grpc
        import tritonclient.grpc as tg
        cl = tg.InferenceServerClient(s.grpc_target)
        x = u.randn((1, 64), seed=99)

        def infer():
            inp = tg.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            return cl.infer("m", [inp], client_timeout=30)

        assert_exact(infer().as_numpy("y"), u.ort_run(mm, {"x": x})["y"], "gRPC before")
        cl.close()
    # a second server process counts launches from 1 again: fail the 3rd (probe #1, a good gRPC request #2)
    env = sim_env(TENSORD_SIM_FAIL_KERNEL="matmul:3")
    with u.Server(tmp_path, base_path=tmp_path / "m", model_name="m", grpc=True, env=env,
                  extra=["--device=sim:0", "--enable_batching", f"--batching_parameters_file={bp}"]) as s:
        cl = tg.InferenceServerClient(s.grpc_target)
        assert_exact(infer().as_numpy("y"), u.ort_run(mm, {"x": x})["y"], "gRPC first")
        with pytest.raises(Exception) as ei:
            infer()
        e = ei.value
        code = e.status() if hasattr(e, "status") else None
        assert code in ("StatusCode.INTERNAL", grpc.StatusCode.INTERNAL, "INTERNAL"), (code, str(e))
        assert "injected launch failure" in str(e) and "sim:0" in str(e), str(e)
        assert_exact(infer().as_numpy("y"), u.ort_run(mm, {"x": x})["y"], "gRPC after")
        cl.close()


# ----------------------------------------------------------------------------------------------------------------
# c. a device that is not there

@pytest.mark.skipif(not no_gpu_here(), reason="this machine has a GPU: cuda:0 is available")
def test_cuda_without_a_gpu_fails_that_model_and_cpu_models_serve(tmp_path, mm):
    u.write_version(tmp_path / "m", 1, mm)
    conf = u.write_text(tmp_path / "models.config", config([
        {"name": "gpu", "base_path": str(tmp_path / "m")},  # takes --device
        {"name": "cpu", "base_path": str(tmp_path / "m"), "device": "cpu"}]))
    with u.Server(tmp_path, config_file=conf, ready=False, extra=["--device=cuda:0"], env=sim_env()) as s:
        st = wait_settled(s, ["gpu", "cpu"])
        assert st["gpu"]["state"] == "END", st
        gst = st["gpu"]["status"]
        assert gst["error_code"] == "UNAVAILABLE", gst
        for word in ("not available", "cuda:0", "gpu"):
            assert word in gst["error_message"], (word, gst)
        assert len(gst["error_message"].split("not available", 1)[1].strip(": ")) > 5, "no reason given: " + str(gst)
        assert st["cpu"]["state"] == "AVAILABLE", st
        assert s.get("/v2/models/gpu/ready").status_code != 200
        x = u.randn((3, 64), seed=5)
        assert_exact(predict(s, "cpu", x), u.ort_run(mm, {"x": x})["y"], "cpu model")
        assert s.alive()
        cfg = s.get("/v2/models/cpu/config").json()
        assert [(g["kind"], g["gpus"]) for g in cfg["instance_group"]] == [("KIND_CPU", [])], cfg


def run_serve(tmp_path, args, env=None):
    cmd = [u.tensord_bin(), "serve", "--rest_api_port=0", "--port=0", "--admin_port=0"] + args
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30, env=env or sim_env())
    except subprocess.TimeoutExpired:
        pytest.fail(f"tensord serve did not exit on a bad device spec: {cmd}")


@pytest.mark.parametrize("spec,words", [
    ("tpu:0", ["tpu:0", "unknown kind"]),
    ("sim:7", ["sim:7", "2 devices"]),
    ("sim:0,,sim:1", ["empty entry"]),
    ("cuda:x", ["cuda:x"]),
])
def test_bad_device_specs_are_refused_at_start(tmp_path, mm, spec, words):
    u.write_version(tmp_path / "m", 1, mm)
    cp = run_serve(tmp_path, [f"--model_base_path={tmp_path / 'm'}", f"--device={spec}"])
    assert cp.returncode not in (0, None) and cp.returncode > 0, cp
    for w in ["--device"] + words:
        assert w in cp.stderr, (w, cp.stderr)
    conf = u.write_text(tmp_path / "models.config", config([
        {"name": "good", "base_path": str(tmp_path / "m")},
        {"name": "badmodel", "base_path": str(tmp_path / "m"), "device": spec}]))
    cp = run_serve(tmp_path, [f"--model_config_file={conf}"])
    assert cp.returncode > 0, cp
    for w in ["model 'badmodel'"] + words:
        assert w in cp.stderr, (w, cp.stderr)


def test_json_config_device_list_and_bad_entry(tmp_path, mm):
    """The JSON form: "device": "sim:0,sim:1" or a list; a bad entry names the model."""
    u.write_version(tmp_path / "m", 1, mm)
    conf = {"model_config_list": {"config": [
        {"name": "a", "base_path": str(tmp_path / "m"), "device": ["sim:1", "sim:0"], "instance_count": 3}]}}
    path = u.write_text(tmp_path / "models.json", json.dumps(conf))
    with u.Server(tmp_path, config_file=path, env=sim_env()) as s:
        cfg = s.get("/v2/models/a/config").json()
        groups = [(g["kind"], g["count"], g["gpus"]) for g in cfg["instance_group"]]
        assert groups == [("KIND_GPU", 2, [1]), ("KIND_GPU", 1, [0])], cfg
        x = u.randn((2, 64), seed=8)
        assert_exact(predict(s, "a", x), u.ort_run(mm, {"x": x})["y"], "json config on sim")
    conf["model_config_list"]["config"][0]["device"] = ["sim:0", "warp:1"]
    path = u.write_text(tmp_path / "bad.json", json.dumps(conf))
    cp = run_serve(tmp_path, [f"--model_config_file={path}"])
    assert cp.returncode > 0 and "model 'a'" in cp.stderr and "warp:1" in cp.stderr, cp.stderr


# ----------------------------------------------------------------------------------------------------------------
# d. two devices

def test_two_sim_devices_spread_instances_and_report_memory(tmp_path, mm):
    u.write_version(tmp_path / "two", 1, mm)
    u.write_version(tmp_path / "four", 1, mm)
    conf = u.write_text(tmp_path / "models.config", config([
        {"name": "two", "base_path": str(tmp_path / "two")},
        {"name": "four", "base_path": str(tmp_path / "four"), "instance_count": 4},
        {"name": "cpu", "base_path": str(tmp_path / "two"), "device": "cpu", "instance_count": 1}]))
    with u.Server(tmp_path, config_file=conf, extra=["--device=sim:0,sim:1", "--rest_api_num_threads=8"],
                  env=sim_env()) as s:
        text = metrics(s)
        inst = {lb["model"]: v for lb, v in u.metric_samples(text, "tensord_model_instances")}
        assert inst == {"two": 2, "four": 4, "cpu": 1}, inst
        weights = {lb["model"]: v for lb, v in u.metric_samples(text, "tensord_model_weights_bytes")}
        dev = {(lb["model"], lb["device"]): v for lb, v in u.metric_samples(text, "tensord_device_memory_bytes")}
        assert set(dev) == {("two", "sim:0"), ("two", "sim:1"), ("four", "sim:0"), ("four", "sim:1")}, dev
        for (model, d), b in dev.items():
            per_dev = 1 if model == "two" else 2  # instances on that device, each with its own plan
            assert b >= per_dev * weights[model], (model, d, b, weights[model])
        groups = [(g["kind"], g["count"], g["gpus"]) for g in s.get("/v2/models/two/config").json()["instance_group"]]
        assert groups == [("KIND_GPU", 1, [0]), ("KIND_GPU", 1, [1])], groups
        groups = [(g["kind"], g["count"], g["gpus"]) for g in s.get("/v2/models/four/config").json()["instance_group"]]
        assert groups == [("KIND_GPU", 2, [0]), ("KIND_GPU", 2, [1])], groups
        assert "2 execution instances on sim:0,sim:1" in s.stderr(), s.describe()

        errs = []

        def worker(k):
            try:
                for i in range(8):
                    x = u.randn((1 + (i + k) % 5, 64), seed=200 + 10 * k + i)
                    for model in ("two", "four"):
                        got = predict(s, model, x)
                        assert_exact(got, predict(s, "cpu", x), f"{model} vs cpu, worker {k} req {i}")
                        assert_exact(got, u.ort_run(mm, {"x": x})["y"], f"{model} vs onnxruntime")
            except BaseException as e:  # noqa: BLE001 - reported below
                errs.append(repr(e))

        ths = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(4)]
        for t in ths:
            t.start()
        for t in ths:
            t.join(timeout=120)
        assert all(not t.is_alive() for t in ths), "client threads hung"
        assert not errs, errs[:3]
        # new batch sizes compiled new plans, each with its own device buffers: the gauge grew on both devices
        after = {(lb["model"], lb["device"]): v for lb, v in u.metric_samples(metrics(s), "tensord_device_memory_bytes")}
        assert set(after) == set(dev), after
        assert after[("two", "sim:0")] > dev[("two", "sim:0")] or after[("two", "sim:1")] > dev[("two", "sim:1")], \
            (dev, after)


# ----------------------------------------------------------------------------------------------------------------
# e. auto

@pytest.mark.skipif(not no_gpu_here(), reason="this machine has a GPU: auto picks it")
def test_auto_without_a_gpu_uses_the_cpu_and_says_so_once(tmp_path, mm):
    u.write_version(tmp_path / "a", 1, mm)
    u.write_version(tmp_path / "b", 1, mm)
    conf = u.write_text(tmp_path / "models.config", config([
        {"name": "a", "base_path": str(tmp_path / "a")},
        {"name": "b", "base_path": str(tmp_path / "b"), "device": "auto", "instance_count": 2}]))
    with u.Server(tmp_path, config_file=conf, env=sim_env()) as s:
        x = u.randn((2, 64), seed=3)
        for model in ("a", "b"):
            assert_exact(predict(s, model, x), u.ort_run(mm, {"x": x})["y"], model)
            cfg = s.get(f"/v2/models/{model}/config").json()
            assert [g["kind"] for g in cfg["instance_group"]] == ["KIND_CPU"], cfg
        assert not u.metric_samples(metrics(s), "tensord_device_memory_bytes")
        text = s.stderr()
        assert text.count(NO_CUDA) == 1, s.describe()
        assert "2 execution instances on cpu" in text, s.describe()
