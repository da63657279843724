"""CUDA Graphs in serving (engine/plan/plan-graph.c), on "sim", the engine's host-memory test device, whose graphs
record work at capture and replay it at launch as CUDA's do (kernels/sim/sim-graph.c): a served plan whose steps all
run on the device answers its first request of a shape eagerly, captures the second and launches the graph for every
later one. Checked here:
  - many requests with new values each (three batch sizes, so three plans, each past its capture) answer equal to
    onnxruntime, with and without dynamic batching;
  - the served path does capture: a kernel that cannot be captured (TENSORD_SIM_FAIL_CAPTURE) makes the server say so
    once per plan on stderr, naming the device, and the answers stay right (eager);
  - TENSORD_CUDA_GRAPHS=0 turns graphs off in the server (no capture is tried).
"""
import os

import numpy as np

import serving_util as u
from serving_util import helper

EXACT = 1e-5  # sim runs the CPU's kernels (max abs / max |want|)


def sim_env(**kw):
    env = dict(os.environ)
    for k in ("TENSORD_SIM_MEMORY", "TENSORD_SIM_DEVICES", "TENSORD_SIM_FAIL_KERNEL", "TENSORD_SIM_FAIL_CAPTURE",
              "TENSORD_SIM_FAIL_GRAPH", "TENSORD_CUDA_GRAPHS", "TENSORD_DEVICE", "TENSORD_PROFILE"):
        env.pop(k, None)
    env.update({k: str(v) for k, v in kw.items()})
    return env


def mlp_model(din=24, hid=32, dout=10, seed=3):
    """probs = softmax(relu(x @ W1 + b1) @ W2), x [N,din]: every op has a sim kernel, so every step is on the device."""
    return u._model([helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
                     helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "W2"], ["t"]),
                     helper.make_node("Softmax", ["t"], ["y"], axis=-1)],
                    [("x", ["N", din])], [("y", ["N", dout])],
                    [("W1", u.randn((din, hid), seed, 0.4)), ("b1", u.randn((hid,), seed + 1, 0.3)),
                     ("W2", u.randn((hid, dout), seed + 2, 0.4))])


def predict(srv, x):
    r = srv.post_json("/v1/models/m:predict", {"instances": x.tolist()})
    assert r.status_code == 200, f"HTTP {r.status_code} {r.text[:500]}\n{srv.describe()}"
    return np.array(r.json()["predictions"], dtype=np.float64)


def check_many(srv, model, n=30, seed0=500):
    """n requests, batch sizes 1, 2, 3 in turn, new values each: every answer equal to onnxruntime's."""
    for i in range(n):
        x = u.randn((1 + i % 3, 24), seed=seed0 + i, scale=1.5)
        got = predict(srv, x)
        want = u.ort_run(model, {"x": x})["y"]
        assert got.shape == want.shape, (got.shape, want.shape)
        err = u.max_rel_err(got, want)
        assert err <= EXACT, f"request {i + 1} (batch {x.shape[0]}): max rel err {err:.3e}"


def test_graph_runs_answer_every_request_right(tmp_path):
    m = mlp_model()
    u.write_version(tmp_path / "m", 1, m)
    with u.Server(tmp_path, base_path=tmp_path / "m", model_name="m", env=sim_env(),
                  extra=["--device=sim:0"]) as s:
        check_many(s, m)
        err = s.stderr()
        assert "running it eagerly" not in err, err[-2000:]
        assert "on the CPU" not in err, err[-2000:]  # every step on the device: the plans are eligible


BATCHING = """max_batch_size { value: 4 }
batch_timeout_micros { value: 1000 }
max_enqueued_batches { value: 16 }
num_batch_threads { value: 2 }
"""


def test_graph_runs_under_dynamic_batching(tmp_path):
    m = mlp_model(seed=9)
    u.write_version(tmp_path / "m", 1, m)
    bp = u.write_text(tmp_path / "batching.config", BATCHING)
    with u.Server(tmp_path, base_path=tmp_path / "m", model_name="m", env=sim_env(),
                  extra=["--device=sim:0", "--enable_batching", f"--batching_parameters_file={bp}"]) as s:
        check_many(s, m, n=24, seed0=900)
        assert "running it eagerly" not in s.stderr(), s.stderr()[-2000:]


def test_served_plans_capture_and_fall_back_when_a_capture_fails(tmp_path):
    m = mlp_model(seed=4)
    u.write_version(tmp_path / "m", 1, m)
    with u.Server(tmp_path, base_path=tmp_path / "m", model_name="m", env=sim_env(TENSORD_SIM_FAIL_CAPTURE="matmul"),
                  extra=["--device=sim:0"]) as s:
        check_many(s, m, n=12, seed0=700)
        err = s.stderr()
        lines = [ln for ln in err.splitlines() if "graph capture failed" in ln]
        assert lines, f"no capture was tried in the server:\n{err[-2000:]}"
        assert all("sim:0" in ln and "matmul" in ln and "running it eagerly" in ln for ln in lines), lines
        assert len(lines) <= 3, lines  # once per plan (batch sizes 1, 2, 3), not per request


def test_graphs_off_in_the_server(tmp_path):
    m = mlp_model(seed=6)
    u.write_version(tmp_path / "m", 1, m)
    env = sim_env(TENSORD_SIM_FAIL_CAPTURE="matmul", TENSORD_CUDA_GRAPHS="0")
    with u.Server(tmp_path, base_path=tmp_path / "m", model_name="m", env=env, extra=["--device=sim:0"]) as s:
        check_many(s, m, n=9, seed0=800)
        assert "graph capture" not in s.stderr(), s.stderr()[-2000:]
