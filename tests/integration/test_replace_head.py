"""`tensord train --replace-head N` (issue 17): new labels, same backbone.

- The seed CNN (10 classes) gets a 3-class head and trains one epoch on Fashion-MNIST relabelled into 3 groups with
  its convolution frozen: the new version outputs [N, 3], onnxruntime loads it and agrees with `tensord predict`,
  it beats chance by far on held-out images, the frozen weights are bit-identical to the base version's, the base
  version is untouched, and metrics.json records the setting.
- A label past the new head's classes is refused before training; so is a model whose output is not computed by a
  Gemm/MatMul classifier (the error names the node and its op), with nothing written.
"""
import gzip
import json
import os
import subprocess

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

FASHION = "/usr/share/datasets/fashion-mnist"
TIMEOUT = 300
GROUP = {0: 0, 2: 0, 4: 0, 6: 0, 1: 1, 5: 1, 7: 1, 9: 1, 3: 2, 8: 2}  # tops / bottoms and shoes / bags and dresses


def fashion(n, offset=0):
    if not os.path.isfile(f"{FASHION}/train-images-idx3-ubyte.gz"):
        pytest.fail("Fashion-MNIST is missing: make deps installs dataset-fashion-mnist")
    with gzip.open(f"{FASHION}/train-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)[offset:offset + n]
    with gzip.open(f"{FASHION}/train-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)[offset:offset + n]
    return x.astype(np.float32) / 255, np.array([GROUP[int(v)] for v in y], np.int64)


def train(tensord_bin, base, data, *extra):
    return subprocess.run([tensord_bin, "train", "--model-base-path", str(base), "--base-version", "1", "--data",
                           str(data), "--epochs", "1", "--batch-size", "64", "--optimizer", "adam", "--lr", "0.002",
                           "--loss", "sparse_categorical_crossentropy", "--seed", "1", "--threads", "2", "--no-progress",
                           *extra], capture_output=True, text=True, timeout=TIMEOUT)


def inits(path):
    return {i.name: numpy_helper.to_array(i) for i in onnx.load(str(path)).graph.initializer}


def test_new_head_on_a_frozen_backbone(tensord_bin, tmp_path):
    base = tmp_path / "m"
    cp = subprocess.run([tensord_bin, "init", "--arch", "cnn", "--seed", "0", "--out", str(base / "1")],
                        capture_output=True, text=True, timeout=TIMEOUT)
    assert cp.returncode == 0, cp.stderr
    before = (base / "1" / "model.onnx").read_bytes()
    x, y = fashion(4000)
    np.savez(tmp_path / "d.npz", x=x, label=y)
    cp = train(tensord_bin, base, tmp_path / "d.npz", "--replace-head", "3", "--freeze", "conv1/")
    assert cp.returncode == 0, cp.stderr
    v2 = base / "2" / "model.onnx"
    m = onnx.load(str(v2))
    dims = [d.dim_value or d.dim_param for d in m.graph.output[0].type.tensor_type.shape.dim]
    assert dims[-1] == 3, dims
    w1, w2 = inits(base / "1" / "model.onnx"), inits(v2)
    assert w2["head/kernel"].shape == (w1["head/kernel"].shape[0], 3) and w2["head/bias"].shape == (3,)
    for k in ("conv1/kernel", "conv1/bias"):
        assert np.array_equal(w1[k], w2[k]), f"{k} was frozen but changed"
    assert (base / "1" / "model.onnx").read_bytes() == before, "the base version was modified"
    settings = json.load(open(base / "2" / "metrics.json"))["settings"]
    assert settings["replace_head"] == 3, settings

    xt, yt = fashion(1000, offset=50000)
    sess = ort.InferenceSession(str(v2))
    p = sess.run(None, {sess.get_inputs()[0].name: xt})[0]
    assert p.shape == (1000, 3)
    acc = float((p.argmax(1) == yt).mean())
    print(f"3-class head on a frozen conv, one epoch on 4,000 images: held-out accuracy {acc:.3f}")
    assert acc > 0.7, acc  # chance is about 0.4 (the largest group)
    np.save(tmp_path / "xt.npy", xt[:64])
    cp = subprocess.run([tensord_bin, "predict", "--model", str(base / "2"), "--input", f"x={tmp_path / 'xt.npy'}",
                         "--output-dir", str(tmp_path / "out")], capture_output=True, text=True, timeout=TIMEOUT)
    assert cp.returncode == 0, cp.stderr
    ours = np.load(tmp_path / "out" / "probabilities.npy")
    assert np.abs(ours - p[:64]).max() <= 1e-5


def test_labels_past_the_new_head_and_non_classifier_outputs_are_refused(tensord_bin, tmp_path):
    base = tmp_path / "m"
    subprocess.run([tensord_bin, "init", "--arch", "cnn", "--seed", "0", "--out", str(base / "1")], check=True,
                   capture_output=True, timeout=TIMEOUT)
    x, y = fashion(256)
    np.savez(tmp_path / "d.npz", x=x, label=y)
    cp = train(tensord_bin, base, tmp_path / "d.npz", "--replace-head", "2")  # labels 0..2
    assert cp.returncode == 1 and "label" in cp.stderr and "2" in cp.stderr, cp.stderr
    assert sorted(os.listdir(base)) == ["1"], os.listdir(base)

    # y = Relu(x @ W): no classifier at the output
    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "W")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
                           helper.make_node("Relu", ["h"], ["y"], name="act")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], [w])
    other = tmp_path / "o"
    os.makedirs(other / "1")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(other / "1" / "model.onnx"))
    np.savez(tmp_path / "o.npz", x=np.ones((8, 4), np.float32), label=np.zeros(8, np.int64))
    cp = train(tensord_bin, other, tmp_path / "o.npz", "--replace-head", "2")
    assert cp.returncode == 1, cp.stdout + cp.stderr
    assert "act" in cp.stderr and "Relu" in cp.stderr and "replace-head" in cp.stderr, cp.stderr
    assert sorted(os.listdir(other)) == ["1"]
    cp = train(tensord_bin, other, tmp_path / "o.npz", "--replace-head", "0")
    assert cp.returncode == 2 and "replace-head" in cp.stderr, cp.stderr


EXPORT_R18 = """
import sys, torch, torchvision
torch.manual_seed(0)
m = torchvision.models.resnet18(num_classes=1000).eval()
torch.onnx.export(m, torch.randn(2, 3, 32, 32), sys.argv[1], input_names=["input"], output_names=["logits"],
                  opset_version=14, dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}})
"""


def fashion_rgb32(n, offset=0):
    """Fashion-MNIST as a torchvision CNN takes it: padded to 32x32, normalised, tiled to 3 channels, 10 labels."""
    with gzip.open(f"{FASHION}/train-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)[offset:offset + n]
    with gzip.open(f"{FASHION}/train-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)[offset:offset + n].astype(np.int64)
    x = (np.pad(x, ((0, 0), (2, 2), (2, 2))).astype(np.float32) / 255 - 0.286) / 0.353
    return np.ascontiguousarray(np.repeat(x[:, None], 3, axis=1)), y


def test_torchvision_resnet18_new_head_frozen_backbone(tensord_bin, tmp_path):
    """torchvision's ResNet-18 exported by torch.onnx (random weights: nothing is downloaded here, so no ImageNet
    weights), every backbone weight frozen (`--freeze onnx::`: torch.onnx names the BN-folded conv weights so), a new
    10-class head trained one epoch on 3,000 Fashion-MNIST images: far above chance (10 %) on 1,000 held-out ones,
    and the backbone bit-identical."""
    torch_python = os.environ.get("TENSORD_TORCH_PYTHON", "/usr/bin/python3")
    have = subprocess.run([torch_python, "-c", "import torch, torchvision"], capture_output=True, text=True)
    if have.returncode != 0:
        pytest.skip(f"{torch_python} has no torch/torchvision (make deps installs python3-torchvision)")
    base = tmp_path / "r18"
    (base / "1").mkdir(parents=True)
    cp = subprocess.run([torch_python, "-c", EXPORT_R18, str(base / "1" / "model.onnx")], capture_output=True,
                        text=True, timeout=TIMEOUT)
    assert cp.returncode == 0, cp.stderr
    x, y = fashion_rgb32(3000)
    np.savez(tmp_path / "train.npz", input=x, label=y)
    xv, yv = fashion_rgb32(1000, offset=50000)
    np.savez(tmp_path / "val.npz", input=xv, label=yv)
    cp = subprocess.run([tensord_bin, "train", "--model-base-path", str(base), "--base-version", "1", "--data",
                         str(tmp_path / "train.npz"), "--val-data", str(tmp_path / "val.npz"), "--epochs", "1",
                         "--batch-size", "64", "--optimizer", "adam", "--lr", "0.003", "--loss",
                         "sparse_categorical_crossentropy", "--from-logits", "true", "--replace-head", "10", "--freeze",
                         "onnx::", "--seed", "1", "--threads", "2", "--no-progress"],
                        capture_output=True, text=True, timeout=TIMEOUT)
    assert cp.returncode == 0, cp.stderr
    metrics = json.loads((base / "2" / "metrics.json").read_text())
    val_acc = metrics["epochs"][-1]["val_accuracy"]
    assert val_acc > 0.45, f"val_accuracy {val_acc} after one epoch (chance 0.10)\n{cp.stdout}"
    a, b = inits(base / "1" / "model.onnx"), inits(base / "2" / "model.onnx")
    frozen = [k for k in a if k.startswith("onnx::")]
    assert len(frozen) >= 20
    for k in frozen:
        assert np.array_equal(a[k], b[k]), f"frozen weight {k} changed"
    assert b["fc.weight"].shape == (10, 512) and not np.array_equal(a["fc.weight"][:10], b["fc.weight"])
