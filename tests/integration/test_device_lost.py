"""A device lost to a sticky error (a CUDA illegal address: the context is corrupted and every later call on that
device fails until the process restarts), on the host-memory test device "sim": TENSORD_SIM_LOSE_DEVICE=name:N[:D]
makes the N-th exec of kernel `name` (on sim:D) fail that way and loses its device (kernels/sim/sim-backend.c).

What the server does (README "Bad conditions"):
  - the request whose batch hit the error fails HTTP 500 / gRPC INTERNAL, naming the device and saying it is lost;
  - instances on the lost device take no more work; a version with instances on other devices keeps serving there
    (and the server stays ready and live);
  - a version left with no instance is retired: later requests fail at once with 503 / UNAVAILABLE naming the device,
    its status goes END with UNAVAILABLE and the reason, it is not reloaded, /v2/health/ready and /v2/health/live
    answer 503 (and gRPC ServerLive false), so a Kubernetes liveness probe restarts the pod;
  - models on the CPU keep answering correctly; the log has one device_lost line; tensord_device_lost{device} is 1;
  - a non-sticky launch failure (TENSORD_SIM_FAIL_KERNEL) loses nothing.
Training on a lost device fails the job with the reason and writes no version.
"""
import concurrent.futures as cf
import os
import subprocess
import time

import numpy as np
import pytest

import serving_util as u
from test_device_serving import BATCHING, assert_exact, config, metrics, predict, sim_env, statuses, wait_settled
from train_util import mlp_and_data

LOSE = "TENSORD_SIM_LOSE_DEVICE"


def env_lose(spec, **kw):
    e = sim_env(**kw)
    e.pop(LOSE, None)
    e[LOSE] = spec
    return e


@pytest.fixture(scope="module")
def mm():
    return u.mm_model(64, 32, seed=11)


def post(srv, model, x):
    return srv.post_json(f"/v1/models/{model}:predict", {"instances": x.tolist()})


def lost_samples(srv):
    return {lb["device"]: v for lb, v in u.metric_samples(metrics(srv), "tensord_device_lost")}


def wait_state(srv, model, state, timeout=20):
    end = time.monotonic() + timeout
    st = []
    while time.monotonic() < end:
        st = [e for e in statuses(srv, model) if e["version"] == "1"]
        if st and st[0]["state"] == state:
            return st[0]
        time.sleep(0.05)
    pytest.fail(f"model {model} version 1 did not reach {state} within {timeout} s: {st}\n{srv.describe()}")


def test_lost_device_fails_its_batch_then_its_model_goes_unavailable_and_the_server_not_live(tmp_path, mm):
    u.write_version(tmp_path / "m", 1, mm)
    bp = u.write_text(tmp_path / "batching.config", BATCHING)
    conf = u.write_text(tmp_path / "models.config", config([
        {"name": "gpu", "base_path": str(tmp_path / "m"), "device": "sim:0"},
        {"name": "cpu", "base_path": str(tmp_path / "m"), "device": "cpu"}]))
    # the load's device probe is sim matmul exec #1; the first request's batch is #2
    env = env_lose("matmul:2")
    with u.Server(tmp_path, config_file=conf, grpc=True, env=env,
                  extra=["--enable_batching", f"--batching_parameters_file={bp}"]) as s:
        wait_settled(s, ["gpu", "cpu"])
        assert s.get("/v2/health/live").status_code == 200 and s.get("/v2/health/ready").status_code == 200
        assert lost_samples(s) == {}, "a device reported lost before any failure"

        x = u.randn((2, 64), seed=70)
        r = post(s, "gpu", x)
        msg = u.check_error(r, 500, "injected illegal memory access", "sim:0", "lost", "restart")
        assert "model 'gpu' version 1" in msg, msg

        # later requests to the model on the lost device fail at once (no hang, no 500), naming the device
        for i in range(3):
            t0 = time.monotonic()
            r = post(s, "gpu", u.randn((1, 64), seed=80 + i))
            assert time.monotonic() - t0 < 5, "a request to the lost device's model hung"
            m2 = u.check_error(r, 503, "sim:0", "lost", "restart")
            assert "gpu" in m2, m2

        # the CPU model answers, correctly
        for i in range(3):
            x = u.randn((1 + i, 64), seed=90 + i)
            assert_exact(predict(s, "cpu", x), u.ort_run(mm, {"x": x})["y"], "cpu model after the loss")

        # health: neither ready nor live (only a restart cures the device); model readiness per model
        live = s.get("/v2/health/live")
        u.check_error(live, 503, "lost", "sim:0", "restart")
        assert s.get("/v2/health/ready").status_code == 503
        assert s.get("/v2/models/gpu/ready").status_code != 200
        assert s.get("/v2/models/cpu/ready").status_code == 200

        # TF Serving status: END with UNAVAILABLE and the reason; not reloaded by the poller (poll is 0.2 s)
        st = wait_state(s, "gpu", "END")
        assert st["status"]["error_code"] == "UNAVAILABLE", st
        for w in ("sim:0", "lost", "injected illegal memory access", "restart"):
            assert w in st["status"]["error_message"], (w, st)
        time.sleep(1.0)
        st2 = [e for e in statuses(s, "gpu") if e["version"] == "1"][0]
        assert st2 == st, f"the lost version changed after polls: {st} -> {st2}"
        assert [e["state"] for e in statuses(s, "cpu")] == ["AVAILABLE"]

        # gRPC (KServe v2): ServerLive false, the lost model UNAVAILABLE with the reason, the CPU model answers
        import grpc
        import tritonclient.grpc as tg
        cl = tg.InferenceServerClient(s.grpc_target)
        assert cl.is_server_live() is False and cl.is_server_ready() is False
        assert cl.is_model_ready("gpu") is False and cl.is_model_ready("cpu") is True
        xg = u.randn((1, 64), seed=99)

        def infer(model):
            inp = tg.InferInput("x", list(xg.shape), "FP32")
            inp.set_data_from_numpy(xg)
            return cl.infer(model, [inp], client_timeout=30)

        assert_exact(infer("cpu").as_numpy("y"), u.ort_run(mm, {"x": xg})["y"], "gRPC cpu")
        with pytest.raises(Exception) as ei:
            infer("gpu")
        code = ei.value.status() if hasattr(ei.value, "status") else None
        assert code in ("StatusCode.UNAVAILABLE", grpc.StatusCode.UNAVAILABLE, "UNAVAILABLE"), (code, str(ei.value))
        assert "sim:0" in str(ei.value) and "lost" in str(ei.value), str(ei.value)
        cl.close()

        # one log line for the lost device; the metric names it (and only it)
        err = s.stderr()
        lines = [ln for ln in err.splitlines() if "device_lost" in ln]
        assert len(lines) == 1 and "sim:0" in lines[0] and "injected illegal memory access" in lines[0], lines
        assert "load_failed model=gpu" not in err, "the lost version was loaded again:\n" + err
        assert lost_samples(s) == {"sim:0": 1.0}
        assert s.alive()


def test_instances_on_another_device_keep_serving(tmp_path, mm):
    u.write_version(tmp_path / "m", 1, mm)
    # instance 0 on sim:0, instance 1 on sim:1; the load probes each (sim:0's matmul #1); a request takes the
    # lowest-numbered free instance, so the first one runs on sim:0 (its matmul #2) and loses it
    env = env_lose("matmul:2:0")
    with u.Server(tmp_path, base_path=tmp_path / "m", model_name="m", env=env, extra=["--device=sim:0,sim:1"]) as s:
        x = u.randn((2, 64), seed=100)
        u.check_error(post(s, "m", x), 500, "sim:0", "lost", "injected illegal memory access")
        for i in range(6):  # sequential, then concurrent: all on sim:1
            x = u.randn((1 + i % 3, 64), seed=110 + i)
            assert_exact(predict(s, "m", x), u.ort_run(mm, {"x": x})["y"], "after sim:0 was lost")
        xs = [u.randn((2, 64), seed=130 + i) for i in range(8)]
        with cf.ThreadPoolExecutor(4) as ex:
            outs = list(ex.map(lambda x: predict(s, "m", x), xs))
        for x, got in zip(xs, outs):
            assert_exact(got, u.ort_run(mm, {"x": x})["y"], "concurrent, after sim:0 was lost")
        assert s.get("/v2/health/ready").status_code == 200
        assert s.get("/v2/health/live").status_code == 200
        assert [e["state"] for e in statuses(s, "m")] == ["AVAILABLE"]
        assert lost_samples(s) == {"sim:0": 1.0}
        lines = [ln for ln in s.stderr().splitlines() if "device_lost" in ln]
        assert len(lines) == 1 and "sim:0" in lines[0], lines


def test_a_non_sticky_failure_loses_nothing(tmp_path, mm):
    u.write_version(tmp_path / "m", 1, mm)
    env = sim_env(TENSORD_SIM_FAIL_KERNEL="matmul:2")
    with u.Server(tmp_path, base_path=tmp_path / "m", model_name="m", env=env, extra=["--device=sim:0"]) as s:
        u.check_error(post(s, "m", u.randn((1, 64), seed=1)), 500, "injected launch failure", "sim:0")
        x = u.randn((3, 64), seed=2)
        assert_exact(predict(s, "m", x), u.ort_run(mm, {"x": x})["y"], "after a non-sticky failure")
        assert s.get("/v2/health/live").status_code == 200 and s.get("/v2/health/ready").status_code == 200
        assert lost_samples(s) == {}
        assert "device_lost" not in s.stderr()


@pytest.mark.parametrize("devices", ["sim:0", "sim:0,sim:1"])
def test_training_on_a_lost_device_fails_with_the_reason_and_writes_nothing(tensord_bin, tmp_path, devices):
    base, data = mlp_and_data(tensord_bin, tmp_path, 400)
    args = [tensord_bin, "train", "--model-base-path", str(base), "--base-version", "1", "--new-version", "2",
            "--data", str(data), "--epochs", "2", "--batch-size", "40", "--optimizer", "adam", "--lr", "0.01",
            "--loss", "sparse_categorical_crossentropy", "--seed", "3", "--threads", "1", "--no-progress",
            "--devices", devices]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORD_SIM_")}
    env[LOSE] = "matmul:7:0"
    t0 = time.monotonic()
    cp = subprocess.run(args, capture_output=True, text=True, timeout=180, env=env)
    out = cp.stdout + cp.stderr
    assert cp.returncode != 0, out
    assert time.monotonic() - t0 < 120, "the job took too long to fail"
    assert "injected illegal memory access" in out and "sim:0" in out and "lost" in out, out
    assert not (base / "2").exists(), "a failed job wrote a version"
    assert sorted(p.name for p in base.iterdir() if p.name.isdigit()) == ["1"]
