"""Device plans for shapes known only at run time (engine/plan/plan-dyn.c), on "sim", the host-memory test device whose
buffers fault when a CPU step touches them.

Each model's shapes depend on data, so its plan is dynamic; each step is placed when it runs: on the device where sim
has the kernel (MatMul, Relu, Add, Mul, Cast, ReduceMax, Transpose, ...), on the CPU otherwise (NonZero, GatherND,
TopK, Loop), with the data copied where the step runs. Checked for each:
  - `tensord predict --device sim:0` equals onnxruntime (max rel err 1e-5), every output, the integer ones exactly;
  - `tensord bench --device sim:0` says dynamic=1 and device_steps > 0 (such a plan ran wholly on the CPU before),
    with fallback_steps, copies and their bytes exactly as the placement implies (the last run's, after warm-up).
Models:
  - nonzero: x [N,8] -> MatMul -> Relu -> NonZero -> Transpose -> GatherND(relu, idx) and the indices;
  - reshape_computed: a Reshape whose target shape is computed on the device (Mul, Cast of an input), so its shape
    inference needs data that lives on the device (copied to the host first), then a device MatMul;
  - topk_computed_k: TopK whose k is Cast(Mul(kf, 1)) computed on the device, its values into a device MatMul;
  - loop_between_matmuls: MatMul -> Loop (trip count computed on the device from data; a scan output, so its shape
    is known only when it ran; body on the CPU) -> MatMul.
"""
import os
import re
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import max_rel_err

F, I64 = TensorProto.FLOAT, TensorProto.INT64
EXACT = 1e-5


def rnd(shape, seed, scale=0.5):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
                          initializer=[numpy_helper.from_array(np.asarray(a), n) for n, a in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="tensord-tests")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def nonzero():
    n = [helper.make_node("MatMul", ["x", "W"], ["t"]), helper.make_node("Relu", ["t"], ["r"]),
         helper.make_node("NonZero", ["r"], ["nz"]), helper.make_node("Transpose", ["nz"], ["idx"], perm=[1, 0]),
         helper.make_node("GatherND", ["r", "idx"], ["y"])]
    m = model(n, [("x", F, ["N", 8])], [("y", F, ["K"]), ("idx", I64, ["K", 2])], [("W", rnd((8, 8), 1))])
    return m, {"x": rnd((5, 8), 2, 1.0)}


def reshape_computed():
    n = [helper.make_node("MatMul", ["x", "W"], ["t"]), helper.make_node("Relu", ["t"], ["r"]),
         helper.make_node("Mul", ["dims", "one"], ["d2"]), helper.make_node("Cast", ["d2"], ["shape"], to=I64),
         helper.make_node("Reshape", ["r", "shape"], ["rs"]), helper.make_node("MatMul", ["rs", "W2"], ["y"])]
    m = model(n, [("x", F, ["N", 8]), ("dims", F, [2])], [("y", F, ["M", 3])],
              [("W", rnd((8, 8), 3)), ("W2", rnd((4, 3), 4)), ("one", np.ones((2,), np.float32))])
    return m, {"x": rnd((6, 8), 5, 1.0), "dims": np.array([-1, 4], np.float32)}


def topk_computed_k():
    n = [helper.make_node("MatMul", ["x", "W"], ["t"]), helper.make_node("Mul", ["kf", "one"], ["k2"]),
         helper.make_node("Cast", ["k2"], ["k"], to=I64), helper.make_node("TopK", ["t", "k"], ["vals", "ind"], axis=-1),
         helper.make_node("MatMul", ["vals", "W3"], ["y"])]
    m = model(n, [("x", F, ["N", 8]), ("kf", F, [1])], [("y", F, ["N", 2]), ("ind", I64, ["N", "K"])],
              [("W", rnd((8, 8), 6)), ("W3", rnd((3, 2), 7)), ("one", np.ones((1,), np.float32))])
    return m, {"x": rnd((4, 8), 8, 1.0), "kf": np.array([3], np.float32)}


def loop_between_matmuls():
    body = helper.make_graph(
        [helper.make_node("Identity", ["cin"], ["cout"]), helper.make_node("Mul", ["h", "half"], ["h1"]),
         helper.make_node("Add", ["h1", "tenth"], ["hout"]), helper.make_node("Identity", ["h1"], ["hscan"])],
        "body", [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("cin", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("h", F, ["N", 8])],
        [helper.make_tensor_value_info("cout", TensorProto.BOOL, []), helper.make_tensor_value_info("hout", F, ["N", 8]),
         helper.make_tensor_value_info("hscan", F, ["N", 8])],
        initializer=[numpy_helper.from_array(np.float32(0.5), "half"), numpy_helper.from_array(np.float32(0.1), "tenth")])
    n = [helper.make_node("MatMul", ["x", "W"], ["t"]), helper.make_node("Mul", ["mf", "onef"], ["m2"]),
         helper.make_node("Cast", ["m2"], ["trips"], to=I64),
         helper.make_node("Loop", ["trips", "cond", "t"], ["hl", "hs"], body=body),
         helper.make_node("MatMul", ["hl", "W2"], ["y"])]
    m = model(n, [("x", F, ["N", 8]), ("mf", F, [])], [("y", F, ["N", 4]), ("hs", F, ["M", "N", 8])],
              [("W", rnd((8, 8), 9)), ("W2", rnd((8, 4), 10)), ("onef", np.float32(1.0)), ("cond", np.array(True))])
    return m, {"x": rnd((3, 8), 11, 1.0), "mf": np.array(3, np.float32)}


# model -> (its builder, device steps, CPU steps, copies, bytes copied) of one run. The device session fuses MatMul +
# Relu into one step; weights are uploaded once per session (not counted); a Reshape is a copy, not a kernel step.
MODELS = {
    # fused MatMul-Relu | NonZero, Transpose (int64 [2,K] on the host: shape arithmetic stays there), GatherND;
    # x [5,8] up, relu down
    "nonzero": (nonzero, 1, 3, 2, 2 * 5 * 8 * 4),
    # fused MatMul-Relu, Mul, Cast, MatMul; x up, dims up, the computed shape down for Reshape's inference
    # (only it: not the tensor being reshaped), y down
    "reshape_computed": (reshape_computed, 4, 0, 4, 6 * 8 * 4 + 2 * 4 + 2 * 8 + 12 * 3 * 4),
    # MatMul, Mul, Cast, MatMul | TopK; x up, kf up, k down, t down for TopK, its values up, y down
    "topk_computed_k": (topk_computed_k, 4, 1, 6, 2 * 4 * 8 * 4 + 4 + 8 + 4 * 3 * 4 + 4 * 2 * 4),
    # MatMul, Mul, Cast, MatMul | Loop; x up, mf up, the trip count down, t down for the Loop, its result up, y down
    "loop_between_matmuls": (loop_between_matmuls, 4, 1, 6, 2 * 3 * 8 * 4 + 4 + 8 + 3 * 8 * 4 + 3 * 4 * 4),
}


def save(tmp_path, m, feeds):
    path = tmp_path / "model.onnx"
    onnx.save(m, str(path))
    args = []
    for k, v in feeds.items():
        np.save(tmp_path / f"{k}.npy", v)
        args += ["--input", f"{k}={tmp_path / (k + '.npy')}"]
    return path, args


def env():
    e = dict(os.environ)
    for k in ("TENSORD_SIM_MEMORY", "TENSORD_SIM_FAIL_KERNEL", "TENSORD_SIM_FAIL_INIT"):
        e.pop(k, None)
    return e


def reference(m, feeds):
    ort = pytest.importorskip("onnxruntime")
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in m.graph.output]
    return dict(zip(names, s.run(names, feeds)))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_dynamic_model_on_sim_equals_onnxruntime(tensord_bin, tmp_path, name):
    build = MODELS[name][0]
    m, feeds = build()
    path, args = save(tmp_path, m, feeds)
    cmd = [tensord_bin, "predict", "--model", str(path), "--output-dir", str(tmp_path / "out"), "--device", "sim:0",
           "--threads", "1"] + args
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env())
    assert cp.returncode == 0, f"{name}: exit {cp.returncode}\n{cp.stderr[-3000:]}"
    assert "runs on the CPU, not sim" not in cp.stderr, cp.stderr
    want = reference(m, feeds)
    for o in m.graph.output:
        got = np.load(tmp_path / "out" / f"{o.name}.npy")
        assert got.shape == want[o.name].shape, f"{name}: {o.name} shape {got.shape}, onnxruntime {want[o.name].shape}"
        if got.dtype.kind in "iub":
            assert np.array_equal(got, want[o.name]), f"{name}: {o.name} differs from onnxruntime"
        else:
            err = max_rel_err(got, want[o.name])
            assert err <= EXACT, f"{name}: {o.name} max rel err {err:.3e} against onnxruntime"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_dynamic_model_bench_on_sim_counts_device_steps(tensord_bin, tmp_path, name):
    build, want_dev, want_cpu, want_copies, want_bytes = MODELS[name]
    m, feeds = build()
    path, args = save(tmp_path, m, feeds)
    cmd = [tensord_bin, "bench", "--model", str(path), "--device", "sim:0", "--threads", "1", "--iterations", "3",
           "--warmup", "1"] + args
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env())
    assert cp.returncode == 0, f"{name}: exit {cp.returncode}\n{cp.stderr[-3000:]}"
    stat = dict(re.findall(r"(\w+)=(\S+)", cp.stdout.splitlines()[0]))
    assert stat.get("dynamic") == "1", cp.stdout
    assert stat.get("device") == "sim:0", cp.stdout
    got = tuple(int(stat[k]) for k in ("device_steps", "fallback_steps", "copies", "copy_bytes"))
    assert got == (want_dev, want_cpu, want_copies, want_bytes), \
        f"{name}: (device steps, CPU steps, copies, bytes) {got}, expected {(want_dev, want_cpu, want_copies, want_bytes)}" \
        f"\n{cp.stdout}"
    assert want_dev + want_cpu == int(stat["steps"]), cp.stdout
    assert int(stat["device_bytes"]) == 0, cp.stdout  # nothing held on the device between runs
