"""Fused attention (engine/plan/fuse-attn.c, kernels/krn-attn.h): on a device session, MatMul -> [Div|Mul by a
constant] -> [Add mask] -> Softmax(last axis) -> MatMul becomes one com.tensord FusedAttention node. Run here on
"sim" (the host-memory test device, which runs the CPU reference kernel kernels/cpu/nn-attn.c); the CUDA kernel
(kernels/cuda/cuda-attn.cu) is checked against the same reference by tests/gpu/run.sh's op suite.

  - attention layers written as torch.onnx / tf2onnx write them (heads split by Reshape + Transpose, K transposed by
    its Transpose, a [N,1,1,S] padding mask, a constant causal mask, Mul or Div scales, no scale, no mask) fuse and
    equal onnxruntime on sim; the CPU session of the same model does not fuse (its matmuls stay oneDNN's) and equals
    it too;
  - chains that must not fuse do not, and still answer right: Softmax over another axis, the scores also a graph
    output, a Div of a constant by the scores, an unknown-rank Q;
  - the BERT-base export of test_realarch.py (torch.onnx, 2 layers) fuses every layer's attention on sim and equals
    PyTorch. GPT-2-small's does not fuse (a limit, not a goal): its causal mask is Where(bias, scores, -1e4), which
    replaces scores where an additive mask adds to them, and the scores' Shape is also read; it runs unfused on sim
    and equals PyTorch.
"""
import os
import subprocess

import numpy as np
import onnx
import pytest

from attention_models import attention_model, feeds, raw_attention_model, rnd
from conftest import TOL, max_rel_err


def run(tensord_bin, tmp_path, model, x, device, env=None):
    """`tensord predict` with TENSORD_PROFILE=1 (and env) -> (outputs by name, FusedAttention steps in the profile,
    stderr)."""
    mdir = tmp_path / device.replace(":", "_")
    mdir.mkdir(exist_ok=True)
    path = mdir / "model.onnx"
    onnx.save(model, str(path))
    cmd = [tensord_bin, "predict", "--model", str(path), "--output-dir", str(mdir / "out"), "--device", device]
    for k, v in x.items():
        np.save(mdir / f"{k}.npy", v)
        cmd += ["--input", f"{k}={mdir / (k + '.npy')}"]
    full = {**os.environ, "TENSORD_PROFILE": "1"}
    full.pop("TENSORD_NO_ATTENTION_FUSE", None)
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**full, **(env or {})})
    assert cp.returncode == 0, f"{' '.join(cmd)}: exit {cp.returncode}\n{cp.stderr[-3000:]}"
    outs = {o.name: np.load(mdir / "out" / f"{o.name}.npy") for o in model.graph.output}
    fused = sum(1 for line in cp.stderr.splitlines() if " FusedAttention " in f" {line} ")
    return outs, fused, cp.stderr


def reference(model, x):
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    return dict(zip(names, sess.run(names, x)))


CASES = {  # attention_model options, FusedAttention steps expected on sim
    "div_input_mask": (dict(scale_op="Div", mask="input"), 1),
    "mul_causal_mask": (dict(scale_op="Mul", mask="causal"), 1),
    "no_scale_no_mask": (dict(scale_op=None, mask=None), 1),
    "mul_no_mask": (dict(scale_op="Mul", mask=None), 1),
    "softmax_axis_3": (dict(softmax_axis=3), 1),
    # chains whose meaning differs, or cannot be known to be the same: not fused, still right
    "softmax_other_axis": (dict(softmax_axis=2), 0),
    "scores_are_an_output": (dict(scores_out=True), 0),
    "constant_divided_by_scores": (dict(scale_op="RDiv"), 0),
    "q_rank_unknown": (dict(q_rank_known=False), 0),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_attention_fuses_where_it_may_and_matches(tensord_bin, tmp_path, case):
    opts, want_fused = CASES[case]
    m = attention_model(**opts)
    x = feeds(m)
    want = reference(m, x)
    got, fused, log = run(tensord_bin, tmp_path, m, x, "sim:0")
    assert fused == want_fused, f"{case}: {fused} FusedAttention steps on sim, expected {want_fused}\n{log[-2000:]}"
    for k in want:
        err = max_rel_err(got[k], want[k])
        assert err <= 1e-5, f"{case}: output {k}, sim vs onnxruntime {err:.3e}"
    if want_fused:
        cpu, fused_cpu, log = run(tensord_bin, tmp_path, m, x, "cpu")
        assert fused_cpu == 0, f"{case}: the CPU session fused attention (it keeps oneDNN's matmuls)\n{log[-2000:]}"
        assert max_rel_err(cpu["y"], want["y"]) <= 1e-5


BROADCAST = {  # Q, KT, V, M shapes
    "batch_dims_broadcast": ((1, 2, 3, 4), (3, 1, 4, 5), (3, 2, 5, 6), (3, 5)),
    "one_query_row_mask_rows": ((2, 1, 4), (2, 4, 7), (2, 7, 3), (2, 6, 7)),
    "one_key_column_mask_cols": ((2, 3, 4), (2, 4, 1), (2, 5, 3), (1, 5)),
    "rank5_mask_rank2": ((2, 1, 2, 3, 8), (1, 3, 2, 8, 9), (2, 3, 2, 9, 8), (3, 9)),
}


@pytest.mark.parametrize("case", sorted(BROADCAST))
def test_attention_broadcasting_matches(tensord_bin, tmp_path, case):
    """The fused op broadcasts exactly as the unfused chain: batch dims between Q, KT, V and the mask, a one-row Q
    against a mask with rows, a one-column KT against a mask with columns."""
    shapes = BROADCAST[case]
    m = raw_attention_model(*shapes)
    x = {n: rnd(s, k + 11) for k, (n, s) in enumerate(zip(("Q", "KT", "V", "M"), shapes))}
    want = reference(m, x)
    got, fused, log = run(tensord_bin, tmp_path, m, x, "sim:0")
    assert fused == 1, f"{case}: expected one FusedAttention step\n{log[-2000:]}"
    assert got["y"].shape == want["y"].shape, f"{case}: shape {got['y'].shape}, onnxruntime {want['y'].shape}"
    err = max_rel_err(got["y"], want["y"])
    assert err <= 1e-5, f"{case}: sim (fused) vs onnxruntime {err:.3e}"


def test_attention_disabled_by_env(tensord_bin, tmp_path):
    m = attention_model()
    x = feeds(m)
    got, fused, log = run(tensord_bin, tmp_path, m, x, "sim:0", env={"TENSORD_NO_ATTENTION_FUSE": "1"})
    assert fused == 0, f"TENSORD_NO_ATTENTION_FUSE=1 still fused\n{log[-2000:]}"
    assert max_rel_err(got["y"], reference(m, x)["y"]) <= 1e-5


@pytest.mark.parametrize("name,layers", [("bert_base", 2), ("gpt2_small", 0)])
def test_exported_transformers_on_device(tensord_bin, tmp_path, name, layers):
    """torch.onnx exports (test_realarch.py's cache): `layers` FusedAttention steps on sim; outputs equal PyTorch's."""
    import test_realarch as ra
    meta = ra.model_meta(name)
    mdir = os.path.join(ra.CACHE, name)
    x = {i: np.load(os.path.join(mdir, meta["input_file"].format(input=i, batch=ra.SMALL_BATCH)))
         for i in meta["inputs"]}
    model = onnx.load(os.path.join(mdir, "model.onnx"))
    got, fused, log = run(tensord_bin, tmp_path, model, x, "sim:0")
    assert fused == layers, f"{name}: {fused} FusedAttention steps, expected {layers}\n{log[-3000:]}"
    want = np.load(os.path.join(mdir, meta["reference_file"].format(batch=ra.SMALL_BATCH)))
    y = got[meta["outputs"][0]]
    err = max_rel_err(y, want)
    assert err <= TOL, f"{name}: sim (fused attention) vs PyTorch {err:.3e} > {TOL:g}"
