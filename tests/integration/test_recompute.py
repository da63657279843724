"""Gradient checkpointing (issue 17): `tensord train --recompute` recomputes, segment by segment, the forward
activations the backward pass reads (engine/train/recompute.c).

The same steps with and without it give the same losses and the same weights (a CNN with training BatchNorms and
residual adds, a transformer encoder, and an MLP whose training Dropout must not draw a second mask), while the training
plan's activation memory (metrics.json "activations_mib") shrinks where the activations are recomputable (by more
than 40% on the two zoo models here).
"""
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from train_util import train_version, weights

TIMEOUT = 300


def zoo(tensord_bin, base, arch, opts):
    cp = subprocess.run([tensord_bin, "init", "--arch", arch, *[a for o in opts for a in ("--opt", o)], "--opt",
                         "softmax=0", "--seed", "3", "--out", str(base / "1")], capture_output=True, text=True,
                        timeout=TIMEOUT)
    assert cp.returncode == 0, cp.stderr


def dropout_mlp(base, layers=6, width=48):
    rng = np.random.default_rng(0)
    inits, nodes, x = [numpy_helper.from_array(np.array(0.3, np.float32), "ratio"),
                       numpy_helper.from_array(np.array(True), "train")], [], "x"
    for i in range(layers):
        n_in, n_out = (10 if i == 0 else width), (3 if i == layers - 1 else width)
        inits += [numpy_helper.from_array((rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32),
                                          f"w{i}"), numpy_helper.from_array(np.zeros(n_out, np.float32), f"b{i}")]
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]), helper.make_node("Add", [f"m{i}", f"b{i}"],
                                                                                         [f"a{i}"])]
        x = f"a{i}"
        if i < layers - 1:
            nodes += [helper.make_node("Tanh", [x], [f"t{i}"]),
                      helper.make_node("Dropout", [f"t{i}", "ratio", "train"], [f"d{i}"])]
            x = f"d{i}"
    nodes.append(helper.make_node("Identity", [x], ["logits"]))
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 10])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])], inits)
    (base / "1").mkdir(parents=True)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(base / "1" / "model.onnx"))


def data(base, path, classes, n=64):
    m = onnx.load(str(base / "1" / "model.onnx"))
    inp = m.graph.input[0]
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim][1:]
    rng = np.random.default_rng(1)
    if inp.type.tensor_type.elem_type == TensorProto.INT64:
        x = rng.integers(0, 50, [n] + shape)
    else:
        x = rng.standard_normal([n] + shape).astype(np.float32)
    np.savez(path, **{inp.name: x, "label": rng.integers(0, classes, n)})
    return path


def train(tensord_bin, base, npz, version, *extra):
    return train_version(tensord_bin, base, npz, version,
                         ["--epochs", "1", "--batch-size", "16", "--optimizer", "sgd", "--lr", "0.05", "--loss",
                          "sparse_categorical_crossentropy", "--from-logits", "true", "--shuffle", "false",
                          "--max-steps", "4", *extra], TIMEOUT)


@pytest.mark.parametrize("name", ["resnet-small", "transformer-encoder", "dropout-mlp"])
def test_recompute_trains_the_same_with_less_activation_memory(tensord_bin, tmp_path, name):
    base = tmp_path / "m"
    if name == "resnet-small":
        zoo(tensord_bin, base, name, ["input=3,16,16", "width=8", "blocks=2", "classes=4"])
    elif name == "transformer-encoder":
        zoo(tensord_bin, base, name, ["vocab=50", "seq=16", "d=32", "heads=4", "layers=4", "ffn=64", "classes=4"])
    else:
        dropout_mlp(base)
    npz = data(base, tmp_path / "d.npz", 4 if name != "dropout-mlp" else 3)
    plain = train(tensord_bin, base, npz, 2)
    rc = train(tensord_bin, base, npz, 3, "--recompute")
    a, b = [s["loss"] for s in plain["steps"]], [s["loss"] for s in rc["steps"]]
    print(f"{name}: losses {a} / {b}; activations {plain['activations_mib']:.3f} -> {rc['activations_mib']:.3f} MiB, "
          f"{rc['recompute']}")
    assert len(a) == len(b) == 4 and a[-1] != a[0]
    np.testing.assert_allclose(b, a, rtol=1e-6)
    wa, wb = weights(base, 2), weights(base, 3)
    assert wa.keys() == wb.keys()
    for k in wa:
        np.testing.assert_allclose(wb[k], wa[k], rtol=1e-5, atol=1e-7, err_msg=k)
    assert rc["settings"]["recompute"] is True and plain["settings"]["recompute"] is False
    assert rc["recompute"]["segments"] >= 2 and rc["recompute"]["nodes"] > 0, rc["recompute"]
    if name != "dropout-mlp":  # there most of what the backward pass reads is Dropout's output, which is kept
        assert rc["activations_mib"] < 0.6 * plain["activations_mib"], (plain["activations_mib"], rc["activations_mib"])
