"""Frozen features (issue 17): with --freeze, the layers no trained parameter reaches run once per example before the
first step, and the steps run the trained part only (engine/train/train-frozen.c).

- The same job with the cache on and off (--cache-frozen false) gives the same losses, step by step, and the same
  trained weights: shuffled batches, a partial last batch, a second model input that only the head reads, and a
  training Dropout inside the frozen layers (it stays in the steps, drawing the same masks).
- metrics.json says what was cached (values, MiB, examples, seconds), or why not: frozen layers that mix the
  examples of a batch (a mean over the batch) are found by computing rows inside two different batches, and then
  run every step; so do jobs shorter than an epoch and jobs that turn the cache off.
"""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from train_util import train_version, weights

TIMEOUT = 180


def build(path, mix=False, dropout=False):
    """x [N,6] -> body: MatMul(body.w) -> Relu [-> minus its mean over the batch] [-> training Dropout 0.5]
    -> head: MatMul(head.w) + head.b + m (a second input [N,3] only the head reads) -> logits [N,3]."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((6, 16)).astype(np.float32) * 0.5, "body.w"),
             numpy_helper.from_array(rng.standard_normal((16, 3)).astype(np.float32) * 0.3, "head.w"),
             numpy_helper.from_array(np.zeros(3, np.float32), "head.b")]
    nodes = [helper.make_node("MatMul", ["x", "body.w"], ["h1"], name="body_mm"),
             helper.make_node("Relu", ["h1"], ["h"], name="body_relu")]
    if mix:
        nodes += [helper.make_node("ReduceMean", ["h"], ["mu"], axes=[0], keepdims=1, name="body_mean"),
                  helper.make_node("Sub", ["h", "mu"], ["hc"], name="body_center")]
    last = "hc" if mix else "h"
    if dropout:
        inits += [numpy_helper.from_array(np.array(0.5, np.float32), "drop_ratio"),
                  numpy_helper.from_array(np.array(True), "drop_train")]
        nodes.append(helper.make_node("Dropout", [last, "drop_ratio", "drop_train"], ["hd"], name="body_drop"))
        last = "hd"
    nodes += [helper.make_node("MatMul", [last, "head.w"], ["z"], name="head_mm"),
              helper.make_node("Add", ["z", "head.b"], ["z2"], name="head_bias"),
              helper.make_node("Add", ["z2", "m"], ["logits"], name="head_m")]
    g = helper.make_graph(nodes, "frozen", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6]),
                                             helper.make_tensor_value_info("m", TensorProto.FLOAT, ["N", 3])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    (path / "1").mkdir(parents=True)
    onnx.save(model, str(path / "1" / "model.onnx"))
    return path


def data(tmp_path, n=100):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, 6)).astype(np.float32)
    m = rng.standard_normal((n, 3)).astype(np.float32) * 0.1
    np.savez(tmp_path / "d.npz", x=x, m=m, label=(x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5))
    return tmp_path / "d.npz"


def train(tensord_bin, base, npz, version, *extra):
    return train_version(tensord_bin, base, npz, version,
                         ["--epochs", "3", "--batch-size", "16", "--optimizer", "sgd", "--lr", "0.1", "--loss",
                          "sparse_categorical_crossentropy", "--from-logits", "true", "--freeze", "body.", "--seed", "4",
                          *extra], TIMEOUT)


def same_job(tensord_bin, base, npz):
    on = train(tensord_bin, base, npz, 2)
    off = train(tensord_bin, base, npz, 3, "--cache-frozen", "false")
    a, b = [s["loss"] for s in on["steps"]], [s["loss"] for s in off["steps"]]
    assert len(a) == len(b) == 21, (len(a), len(b))  # 3 epochs of 7 batches (6 of 16, one of 4)
    np.testing.assert_allclose(a, b, rtol=1e-5)
    assert a[-1] < a[0], a
    wa, wb = weights(base, 2), weights(base, 3)
    for k in ("head.w", "head.b"):
        np.testing.assert_allclose(wa[k], wb[k], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(wa["body.w"], weights(base, 1)["body.w"])
    assert off["frozen_features"] == {"cached": False, "reason": "turned off (cache_frozen false)"}
    assert on["settings"]["cache_frozen"] is True and off["settings"]["cache_frozen"] is False
    return on


def test_cached_features_train_the_head_as_the_whole_graph_does(tensord_bin, tmp_path):
    base = build(tmp_path / "m")
    on = same_job(tensord_bin, base, data(tmp_path))
    f = on["frozen_features"]
    assert f["cached"] is True and f["tensors"] == 1 and f["examples"] == 100, f
    assert abs(f["mib"] - 100 * 16 * 4 / 2**20) < 1e-9 and f["seconds"] > 0, f


def test_training_dropout_in_the_frozen_layers_stays_in_the_steps(tensord_bin, tmp_path):
    base = build(tmp_path / "m", dropout=True)
    on = same_job(tensord_bin, base, data(tmp_path))
    assert on["frozen_features"]["cached"] is True, on["frozen_features"]


def test_frozen_layers_that_mix_examples_are_not_cached(tensord_bin, tmp_path):
    base = build(tmp_path / "m", mix=True)
    m = train(tensord_bin, base, data(tmp_path), 2)
    f = m["frozen_features"]
    assert f["cached"] is False and "mix examples" in f["reason"] and "'hc'" in f["reason"], f
    assert len(m["steps"]) == 21 and np.isfinite(m["steps"][-1]["loss"])


def test_a_job_shorter_than_an_epoch_runs_the_frozen_layers_each_step(tensord_bin, tmp_path):
    base = build(tmp_path / "m")
    m = train(tensord_bin, base, data(tmp_path), 2, "--max-steps", "3")
    f = m["frozen_features"]
    assert f["cached"] is False and "fewer steps (3) than one epoch (7)" in f["reason"], f
    assert len(m["steps"]) == 3
