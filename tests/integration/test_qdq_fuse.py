"""The QDQ rewrite (engine/plan/fuse-qdq.c) on real QDQ models, through the real binary.

  test_ort_qdq        onnxruntime quantize_static (QuantFormat.QDQ, per tensor and per channel) of the small CNN and
                      MLP of test_quant_models.py: with the rewrite on, outputs equal onnxruntime's within one output
                      quantization step, and equal the TENSORD_NO_QDQ_FUSE=1 outputs within that step; the profile
                      (TENSORD_PROFILE=1 tensord bench) shows QLinearConv/QLinearMatMul steps on oneDNN's int8
                      implementation and no float Conv/MatMul left, and shows none of them with the switch set.
  test_tensord_quantize  `tensord quantize` output of `tensord init --arch cnn`: its Conv is followed by Relu ->
                      MaxPool (no Q), so it becomes ConvInteger + Cast + Mul + Add (float output); the Gemm is left
                      alone. Outputs agree with onnxruntime and with the switch set; prints both bench medians.
"""
import os
import re
import subprocess

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from conftest import assert_no_crash, ort_run
from test_quant_models import BUILDERS, output_step, quantize, randn

pytest.importorskip("onnxruntime.quantization")


def env(fuse):
    e = dict(os.environ)
    e.pop("TENSORD_NO_QDQ_FUSE", None)
    if not fuse:
        e["TENSORD_NO_QDQ_FUSE"] = "1"
    return e


def predict(binary, model, feeds, tmp, fuse):
    out = tmp / f"out-{int(fuse)}"
    out.mkdir(parents=True, exist_ok=True)
    cmd = [binary, "predict", "--model", str(model), "--output-dir", str(out), "--threads", "2"]
    for k, a in feeds.items():
        np.save(tmp / f"{k}.npy", a)
        cmd += ["--input", f"{k}={tmp / (k + '.npy')}"]
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env(fuse))
    assert_no_crash(cp)
    assert cp.returncode == 0, cp.stderr
    outs = sorted(f for f in os.listdir(out) if f.endswith(".npy"))
    assert len(outs) == 1, outs
    return np.load(out / outs[0])


def bench(binary, model, feeds, tmp, fuse, iterations=20):
    """(profile lines, median ms) of TENSORD_PROFILE=1 tensord bench."""
    cmd = [binary, "bench", "--model", str(model), "--iterations", str(iterations), "--threads", "2"]
    for k, a in feeds.items():
        np.save(tmp / f"{k}.npy", a)
        cmd += ["--input", f"{k}={tmp / (k + '.npy')}"]
    e = env(fuse)
    e["TENSORD_PROFILE"] = "1"
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=e)
    assert cp.returncode == 0, cp.stderr
    med = float(re.search(r"median_ms=([0-9.]+)", cp.stdout + cp.stderr).group(1))
    steps = [ln.split() for ln in (cp.stdout + cp.stderr).splitlines() if re.match(r"^\s+[0-9.]+\s+[A-Z]", ln)]
    return steps, med


def step_ops(steps):
    return [s[1] for s in steps]


CASES = [(a, h) for a in ("cnn", "mlp") for h in ("static-qdq-per-tensor", "static-qdq-per-channel")]


@pytest.mark.parametrize("arch,how", CASES, ids=[f"{a}-{h}" for a, h in CASES])
def test_ort_qdq(tensord_bin, tmp_path, arch, how):
    model, shape = BUILDERS[arch]()
    q = quantize(tmp_path, model, shape, how)
    path = tmp_path / "q.onnx"
    onnx.save(q, path)
    feeds = {"x": randn(shape, 7)}
    want = ort_run(q, feeds)["y"].astype(np.float64)
    step = output_step(q, want)
    on = predict(tensord_bin, path, feeds, tmp_path, True).astype(np.float64)
    off = predict(tensord_bin, path, feeds, tmp_path, False).astype(np.float64)
    assert np.max(np.abs(on - want)) <= step * (1 + 1e-5), f"fused vs onnxruntime: {np.max(np.abs(on - want))} > {step}"
    assert np.max(np.abs(on - off)) <= step * (1 + 1e-5), f"fused vs unfused: {np.max(np.abs(on - off))} > {step}"

    steps, med_on = bench(tensord_bin, path, feeds, tmp_path, True)
    ops = step_ops(steps)
    want_ops = {"QLinearConv", "QLinearMatMul"} if arch == "cnn" else {"QLinearMatMul"}
    assert want_ops <= set(ops), f"rewrite did not happen: {ops}"
    assert not {"Conv", "FusedConv", "MatMul", "FusedMatMul"} & set(ops), ops
    for s in steps:
        if s[1].startswith("QLinear"):
            line = " ".join(s)
            assert "int8" in line and "reference" not in line, f"not on oneDNN's int8 path: {line}"
    steps, med_off = bench(tensord_bin, path, feeds, tmp_path, False)
    assert not [o for o in step_ops(steps) if o.startswith("QLinear") or o.endswith("Integer")], step_ops(steps)
    print(f"{arch} {how}: median {med_on:.4f} ms fused, {med_off:.4f} ms unfused")


def test_tensord_quantize(tensord_bin, tmp_path):
    base = tmp_path / "seed"
    run = lambda *a: subprocess.run([tensord_bin, *map(str, a)], capture_output=True, text=True, timeout=300)
    cp = run("init", "--arch", "cnn", "--seed", 0, "--out", base / "1")
    assert cp.returncode == 0, cp.stderr
    r = np.random.default_rng(0)
    np.savez(tmp_path / "cal.npz", x=r.random((64, 1, 28, 28), dtype=np.float32),
             y=r.integers(0, 10, 64).astype(np.uint8))
    cp = run("quantize", "--model-base-path", base, "--version", 1, "--calibration", tmp_path / "cal.npz")
    assert cp.returncode == 0, cp.stderr
    model = base / "2" / "model.onnx"
    q = onnx.load(str(model))
    feeds = {"x": r.random((16, 1, 28, 28), dtype=np.float32)}
    on = predict(tensord_bin, model, feeds, tmp_path, True).astype(np.float64)
    off = predict(tensord_bin, model, feeds, tmp_path, False).astype(np.float64)
    want = ort_run(q, feeds)[q.graph.output[0].name].astype(np.float64)
    # The output is float (softmax of a Gemm over the quantized flatten activation): the conv's integer form is
    # exact up to float32 rounding, so only a flatten value at a rounding tie can move, by one step of its scale;
    # bound: that step times the largest column L1 norm of the dequantized head weight (every element moving).
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    prod = {o: n for n in q.graph.node for o in n.output}
    fq = next(n for n in q.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "flatten")
    fstep = float(inits[fq.input[1]])
    gemm = next(n for n in q.graph.node if n.op_type == "Gemm")
    wdq = prod[gemm.input[1]]
    wq, ws = inits[wdq.input[0]].astype(np.float64), inits[wdq.input[1]].astype(np.float64)
    axis = next((a.i for a in wdq.attribute if a.name == "axis"), 1)
    w = wq * (ws.reshape([-1] + [1] * (wq.ndim - 1 - axis)) if ws.ndim else ws)
    bound = fstep * float(np.max(np.abs(w).sum(axis=1 if any(a.name == "transB" and a.i for a in gemm.attribute) else 0)))
    assert np.max(np.abs(on - want)) <= bound, (np.max(np.abs(on - want)), bound)
    assert np.max(np.abs(on - off)) <= bound, (np.max(np.abs(on - off)), bound)
    assert (on.argmax(1) == want.argmax(1)).mean() >= 0.9

    steps, med_on = bench(tensord_bin, model, feeds, tmp_path, True, iterations=300)
    ops = step_ops(steps)
    assert "ConvInteger" in ops and "Conv" not in ops and "FusedConv" not in ops, ops
    assert any("int8" in " ".join(s) for s in steps if s[1] == "ConvInteger"), steps
    steps, med_off = bench(tensord_bin, model, feeds, tmp_path, False, iterations=300)
    assert "ConvInteger" not in step_ops(steps)
    print(f"tensord quantize seed CNN, batch 16: median {med_on:.4f} ms fused, {med_off:.4f} ms unfused")
