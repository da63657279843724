#!/usr/bin/env python3
"""Builds the bundled demo model: the seed CNN (Conv2D(32,3)+ReLU -> MaxPool 2 -> Flatten -> Dense 10 -> Softmax)
on Fashion-MNIST from Debian's dataset-fashion-mnist package, as a versioned bundle <out>/fashion/1/model.onnx.

The conv filters are random (seeded); the dense layer is fitted in closed form (ridge regression on the conv
features of 12,000 training images), so the demo gives real predictions without a training run. tensord's own
training (`tensord train`) will replace this once it lands. Also writes the first 16 test images as
<out>/images.npy and their labels as <out>/labels.npy.
"""
import argparse
import gzip
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

DATA = "/usr/share/datasets/fashion-mnist"
CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def features(x, w, b):
    """x [N,28,28] float32 -> conv3x3(32, valid) + relu -> maxpool 2 -> flatten [N, 32*13*13] (NCHW order)."""
    n = x.shape[0]
    cols = np.stack([x[:, i:i + 26, j:j + 26] for i in range(3) for j in range(3)], axis=-1)  # [N,26,26,9]
    y = np.maximum(cols @ w.reshape(32, 9).T + b, 0)  # [N,26,26,32]
    y = y.reshape(n, 13, 2, 13, 2, 32).max(axis=(2, 4))  # [N,13,13,32]
    return y.transpose(0, 3, 1, 2).reshape(n, -1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="build/demo")
    args = ap.parse_args()
    rng = np.random.default_rng(7)
    xtr = read_idx(f"{DATA}/train-images-idx3-ubyte.gz")[:12000].astype(np.float32) / 255.0
    ytr = read_idx(f"{DATA}/train-labels-idx1-ubyte.gz")[:12000]
    xte = read_idx(f"{DATA}/t10k-images-idx3-ubyte.gz").astype(np.float32) / 255.0
    yte = read_idx(f"{DATA}/t10k-labels-idx1-ubyte.gz")
    w = (rng.standard_normal((32, 1, 3, 3)) * np.sqrt(2.0 / 9)).astype(np.float32)
    b = np.zeros(32, np.float32)
    f = features(xtr, w, b)
    onehot = np.eye(10, dtype=np.float32)[ytr] * 2 - 1
    a = f.T @ f + 1.0 * np.eye(f.shape[1], dtype=np.float32)
    wd = np.linalg.solve(a, f.T @ onehot).astype(np.float32)  # [5408, 10]
    bd = np.zeros(10, np.float32)
    acc = float((np.argmax(features(xte[:2000], w, b) @ wd, 1) == yte[:2000]).mean())

    inits = [numpy_helper.from_array(w, "conv.weight"), numpy_helper.from_array(b, "conv.bias"),
             numpy_helper.from_array(wd * 4.0, "dense.weight"), numpy_helper.from_array(bd, "dense.bias"),
             numpy_helper.from_array(np.array([-1, 5408], np.int64), "flat.shape")]
    nodes = [helper.make_node("Conv", ["images", "conv.weight", "conv.bias"], ["c"], name="conv", kernel_shape=[3, 3]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Reshape", ["p", "flat.shape"], ["f"], name="flatten"),
             helper.make_node("MatMul", ["f", "dense.weight"], ["m"], name="dense"),
             helper.make_node("Add", ["m", "dense.bias"], ["logits"], name="dense_bias"),
             helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax", axis=-1)]
    graph = helper.make_graph(nodes, "fashion_cnn",
                              [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 1, 28, 28])],
                              [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tensord-demo")
    onnx.checker.check_model(model)
    vdir = os.path.join(args.out, "fashion", "1")
    os.makedirs(vdir, exist_ok=True)
    tmp = os.path.join(vdir, ".model.onnx.tmp")
    onnx.save(model, tmp)
    os.replace(tmp, os.path.join(vdir, "model.onnx"))
    np.save(os.path.join(args.out, "images.npy"), xte[:16].reshape(16, 1, 28, 28))
    np.save(os.path.join(args.out, "labels.npy"), yte[:16].astype(np.int64))
    print(f"demo model: {vdir}/model.onnx (dense layer fitted on 12k images; held-out accuracy {acc:.3f})")


if __name__ == "__main__":
    main()
