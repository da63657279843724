"""Training golden test (Done-when item of the training issue): 5 optimizer steps of an MLP and of the seed CNN,
with SGD-momentum and with Adam, through the real `tensord train` CLI, against the float64 numpy reference of
tests/golden/reference.py (hand-written forward/backward, no tensord code).

Each case writes the model bundle (version 1, fixed initial weights) and one batch as data.npz, runs
`tensord train ... --batch-size <whole batch> --max-steps 5 --val-split 0` (one step per epoch on the whole
batch, so the loader's shuffling cannot change the gradient), then compares
  - the per-step losses from metrics.json "steps": [{"step": k, "loss": ...}] (loss at the weights before
    update k) with the reference losses, relative error |a-b|/|b|;
  - every initializer of the new version's model.onnx with the reference weights, norm-wise relative error
    max|a-b| / max|b| per tensor.
Losses must be within 1e-5. Weights must be within 1e-5, or, where an ordinary float32 numpy run of the same
steps (reference.train(..., dtype=float32)) is itself further than 1e-5 from float64, no further than that
run: Adam divides by sqrt(v), so a weight whose gradient is tiny (float32 cancellation in its sum) gets a
visibly different step. Measured (this case only): mlp/adam W1, float32 numpy 2.6e-5 vs float64; tensord
~1e-5. Every measured error and its bound are printed (pytest -s).
A self-check of the reference's backward against central differences runs first (no binary needed).
"""
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "golden"))
import reference  # noqa: E402

TOL = 1e-5
CASES = [(m, o) for m in ("mlp", "cnn") for o in ("sgd", "adam")]


def test_reference_backward_matches_finite_differences():
    for model in reference.MODELS:
        err = reference.grad_check(model)
        print(f"reference {model}: backward vs central differences, max rel err {err:.2e}")
        assert err < 1e-6, f"{model}: hand-written backward is off by {err:.3g}"


def test_reference_forward_matches_onnxruntime():
    import onnxruntime as ort

    for model, (setup, _) in reference.MODELS.items():
        w, x, y = setup()
        m = reference.onnx_model(model, w)
        for n in m.graph.node:  # the reference trains BatchNorm on batch statistics: onnxruntime's training mode
            if n.op_type == "BatchNormalization":
                n.attribute.append(onnx.helper.make_attribute("training_mode", 1))
                n.output.extend([n.output[0] + "/running_mean", n.output[0] + "/running_var"])
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        p = s.run(None, {"x": x})[0].astype(np.float64)
        ort_loss = -np.mean(np.log(p[np.arange(len(y)), y]))
        ref_loss = reference.train(model, "sgd", steps=1)[0][0]
        assert abs(ort_loss - ref_loss) / ref_loss < 1e-6, (model, ort_loss, ref_loss)


def _rel(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


@pytest.mark.parametrize("model,opt", CASES, ids=[f"{m}-{o}" for m, o in CASES])
def test_golden_training(tensord_bin, tmp_path, model, opt):
    setup, _ = reference.MODELS[model]
    w0, x, y = setup()
    base = tmp_path / model
    (base / "1").mkdir(parents=True)
    onnx.save(reference.onnx_model(model, w0), str(base / "1" / "model.onnx"))
    data = tmp_path / "data.npz"
    np.savez(str(data), x=x, label=y)
    hp = reference.OPTIMS[opt]
    cmd = [tensord_bin, "train", "--model-base-path", str(base), "--data", str(data),
           "--epochs", str(reference.STEPS), "--batch-size", str(len(y)), "--optimizer", hp["optimizer"],
           "--lr", repr(hp["lr"]), "--loss", "sparse_categorical_crossentropy", "--max-steps", str(reference.STEPS),
           "--seed", "1", "--val-split", "0", "--threads", "1", "--no-progress"]
    if opt == "sgd":
        cmd += ["--momentum", repr(hp["momentum"])]
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, f"{' '.join(cmd)}\nexit {cp.returncode}\n{cp.stderr[-4000:]}\n{cp.stdout[-2000:]}"
    out = base / "2"
    assert (out / "model.onnx").is_file(), f"no version 2 written: {sorted(os.listdir(base))}"

    ref_losses, ref_w = reference.train(model, opt)
    _, f32_w = reference.train(model, opt, dtype=np.float32)
    metrics = json.loads((out / "metrics.json").read_text())
    steps = metrics.get("steps")
    assert steps is not None, "metrics.json has no per-step 'steps' list"
    assert [s["step"] for s in steps] == list(range(1, reference.STEPS + 1)), steps
    loss_err = [abs(s["loss"] - r) / abs(r) for s, r in zip(steps, ref_losses)]
    got = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(out / "model.onnx")).graph.initializer}
    w_err = {k: _rel(got[k], ref_w[k]) for k in ref_w}
    w_bound = {k: max(TOL, _rel(f32_w[k], ref_w[k])) for k in ref_w}
    print(f"\ngolden {model}/{opt}: loss rel err per step "
          + " ".join(f"{e:.2e}" for e in loss_err) + "; weights (err/bound) "
          + " ".join(f"{k} {e:.2e}/{w_bound[k]:.1e}" for k, e in w_err.items()))
    assert max(loss_err) <= TOL, f"loss relative errors {loss_err} (tensord {[s['loss'] for s in steps]}, " \
                                 f"reference {list(ref_losses)})"
    for k, e in w_err.items():
        assert got[k].shape == ref_w[k].shape, (k, got[k].shape, ref_w[k].shape)
        assert e <= w_bound[k], f"{model}/{opt}: weight {k} relative error {e:.3g} > {w_bound[k]:.3g}"
