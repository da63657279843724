#!/usr/bin/env python3
"""reference.py - float64 numpy reference for tensord's training golden test.

Two models, written as ONNX graphs with fixed float32 initial weights, and one fixed batch each:
  mlp: x[N,784] -> MatMul W1[784,32] + b1 -> Relu -> MatMul W2[32,10] + b2 -> Softmax      (N = 16)
  cnn: x[N,1,10,10] -> Conv conv_W[4,1,3,3] + conv_b -> Relu -> MaxPool 2x2/2 -> Flatten
       -> MatMul dense_W[64,10] + dense_b -> Softmax                                        (N = 8)
Loss: sparse categorical cross-entropy (mean over the batch), computed from the logits (what tensord does for a
model ending in Softmax). Forward and backward are written by hand here in float64 (no tensord code, no
autodiff), then 5 optimizer steps on the same batch:
  sgd:  v = momentum*v - lr*g; w += v                     (Keras SGD, momentum 0.9, lr 0.1)
  adam: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
        w -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)  (lr 0.001, b1 0.9, b2 0.999, eps 1e-7)
The loss recorded for step k is the loss of the batch at the weights before update k (what a trainer logs).

Usage: reference.py OUT   writes, for each model M and optimizer O,
  OUT/M/1/model.onnx             the model bundle (version 1) with the initial weights
  OUT/M/data.npz                 members "x" (float32) and "label" (int64): the batch
  OUT/M/x.npy, OUT/M/label.npy   the same batch as separate .npy files (for C tests)
  OUT/M_O/losses.npy             float64 [5]
  OUT/M_O/<initializer>.npy      float64 final weights, one per initializer
  OUT/M_O/<initializer>_f32.npy  the same 5 steps in plain float32 numpy (float32): the error an ordinary
                                 float32 implementation makes, used as the yardstick where 1e-5 is too tight
  OUT/manifest.json              cases, hyper-parameters, initializer names
"""
import json
import os
import sys

import numpy as np

STEPS = 5
OPTIMS = {
    "sgd": {"optimizer": "sgd", "lr": 0.1, "momentum": 0.9},
    "adam": {"optimizer": "adam", "lr": 0.001, "beta1": 0.9, "beta2": 0.999, "eps": 1e-7},
}


# ---- models: initial weights and data (float32, fixed seeds) ----

def glorot(rng, shape, fan_in, fan_out):
    lim = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-lim, lim, size=shape).astype(np.float32)


def mlp_setup():
    rng = np.random.default_rng(20240601)
    w = {
        "W1": glorot(rng, (784, 32), 784, 32),
        "b1": (0.01 * rng.standard_normal(32)).astype(np.float32),
        "W2": glorot(rng, (32, 10), 32, 10),
        "b2": (0.01 * rng.standard_normal(10)).astype(np.float32),
    }
    x = rng.uniform(0.0, 1.0, size=(16, 784)).astype(np.float32)
    y = rng.integers(0, 10, size=16).astype(np.int64)
    return w, x, y


def cnn_setup():
    rng = np.random.default_rng(20240602)
    w = {
        "conv_W": glorot(rng, (4, 1, 3, 3), 9, 36),
        "conv_b": (0.01 * rng.standard_normal(4)).astype(np.float32),
        "dense_W": glorot(rng, (64, 10), 64, 10),
        "dense_b": (0.01 * rng.standard_normal(10)).astype(np.float32),
    }
    x = rng.uniform(0.0, 1.0, size=(8, 1, 10, 10)).astype(np.float32)
    y = rng.integers(0, 10, size=8).astype(np.int64)
    return w, x, y


# ---- float64 forward + backward ----

def sce_from_logits(z, y):
    """mean sparse CCE and dLoss/dz."""
    n = z.shape[0]
    m = z.max(axis=1, keepdims=True)
    e = np.exp(z - m)
    s = e.sum(axis=1, keepdims=True)
    loss = float(np.mean(m[:, 0] + np.log(s[:, 0]) - z[np.arange(n), y]))
    dz = e / s
    dz[np.arange(n), y] -= 1.0
    return loss, dz / n


def mlp_loss_grad(w, x, y):
    a1 = x @ w["W1"] + w["b1"]
    h = np.maximum(a1, 0.0)
    z = h @ w["W2"] + w["b2"]
    loss, dz = sce_from_logits(z, y)
    g = {"W2": h.T @ dz, "b2": dz.sum(0)}
    da1 = (dz @ w["W2"].T) * (a1 > 0)
    g["W1"] = x.T @ da1
    g["b1"] = da1.sum(0)
    return loss, g


def im2col(x, k):
    """x [N,C,H,W] -> patches [N, OH, OW, C, k, k] (valid, stride 1)."""
    n, c, hh, ww = x.shape
    oh, ow = hh - k + 1, ww - k + 1
    out = np.empty((n, oh, ow, c, k, k), dtype=x.dtype)
    for i in range(k):
        for j in range(k):
            out[:, :, :, :, i, j] = x[:, :, i:i + oh, j:j + ow].transpose(0, 2, 3, 1)
    return out


def cnn_loss_grad(w, x, y):
    n = x.shape[0]
    f = w["conv_W"].shape[0]
    cols = im2col(x, 3)                                               # [N,8,8,1,3,3]
    a = np.einsum("nhwcij,fcij->nfhw", cols, w["conv_W"]) + w["conv_b"][None, :, None, None]
    r = np.maximum(a, 0.0)                                            # [N,F,8,8]
    oh = r.shape[2] // 2
    win = r.reshape(n, f, oh, 2, oh, 2).transpose(0, 1, 2, 4, 3, 5).reshape(n, f, oh, oh, 4)
    arg = win.argmax(-1)                                              # first max in row-major window order
    p = np.take_along_axis(win, arg[..., None], -1)[..., 0]           # [N,F,4,4]
    flat = p.reshape(n, -1)                                           # [N,64] (C-order, as ONNX Flatten)
    z = flat @ w["dense_W"] + w["dense_b"]
    loss, dz = sce_from_logits(z, y)
    g = {"dense_W": flat.T @ dz, "dense_b": dz.sum(0)}
    dp = (dz @ w["dense_W"].T).reshape(n, f, oh, oh)
    dwin = np.zeros_like(win)
    np.put_along_axis(dwin, arg[..., None], dp[..., None], -1)
    dr = dwin.reshape(n, f, oh, oh, 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(r.shape)
    da = dr * (a > 0)
    g["conv_W"] = np.einsum("nfhw,nhwcij->fcij", da, cols)
    g["conv_b"] = da.sum((0, 2, 3))
    return loss, g


MODELS = {"mlp": (mlp_setup, mlp_loss_grad), "cnn": (cnn_setup, cnn_loss_grad)}


# ---- optimizers (float64) ----

def train(model, opt, steps=STEPS, dtype=np.float64):
    """Losses and final weights. dtype=np.float32 runs the same steps in plain float32 numpy: how far an
    ordinary float32 implementation lands from the float64 reference (the conditioning yardstick)."""
    setup, loss_grad = MODELS[model]
    w32, x, y = setup()
    w = {k: v.astype(dtype) for k, v in w32.items()}
    x = x.astype(dtype)
    hp = OPTIMS[opt]
    s1 = {k: np.zeros_like(v) for k, v in w.items()}
    s2 = {k: np.zeros_like(v) for k, v in w.items()}
    losses = []
    for t in range(1, steps + 1):
        loss, g = loss_grad(w, x, y)
        losses.append(loss)
        for k in w:
            g[k] = g[k].astype(dtype)
            if hp["optimizer"] == "sgd":
                s1[k] = hp["momentum"] * s1[k] - hp["lr"] * g[k]
                w[k] = w[k] + s1[k]
            else:
                b1, b2 = hp["beta1"], hp["beta2"]
                s1[k] = b1 * s1[k] + (1 - b1) * g[k]
                s2[k] = b2 * s2[k] + (1 - b2) * g[k] ** 2
                mh = s1[k] / (1 - b1 ** t)
                vh = s2[k] / (1 - b2 ** t)
                w[k] = w[k] - hp["lr"] * mh / (np.sqrt(vh) + hp["eps"])
    return np.array(losses), w


# ---- ONNX export ----

def onnx_model(model, w):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(v, name=k) for k, v in w.items()]
    if model == "mlp":
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 784])
        nodes = [
            helper.make_node("MatMul", ["x", "W1"], ["mm1"], name="dense1/matmul"),
            helper.make_node("Add", ["mm1", "b1"], ["a1"], name="dense1/bias"),
            helper.make_node("Relu", ["a1"], ["h1"], name="relu1"),
            helper.make_node("MatMul", ["h1", "W2"], ["mm2"], name="dense2/matmul"),
            helper.make_node("Add", ["mm2", "b2"], ["logits"], name="dense2/bias"),
            helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax", axis=-1),
        ]
    else:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 10, 10])
        nodes = [
            helper.make_node("Conv", ["x", "conv_W", "conv_b"], ["c1"], name="conv", kernel_shape=[3, 3],
                             pads=[0, 0, 0, 0], strides=[1, 1]),
            helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
            helper.make_node("MaxPool", ["r1"], ["p1"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
            helper.make_node("Flatten", ["p1"], ["f1"], name="flatten", axis=1),
            helper.make_node("MatMul", ["f1", "dense_W"], ["mm"], name="dense/matmul"),
            helper.make_node("Add", ["mm", "dense_b"], ["logits"], name="dense/bias"),
            helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax", axis=-1),
        ]
    out = helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 10])
    g = helper.make_graph(nodes, f"golden_{model}", [x], [out], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="tensord-golden")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def write_all(out):
    import onnx

    manifest = {"steps": STEPS, "optimizers": OPTIMS, "models": {}}
    for model, (setup, _) in MODELS.items():
        w32, x, y = setup()
        os.makedirs(os.path.join(out, model, "1"), exist_ok=True)
        onnx.save(onnx_model(model, w32), os.path.join(out, model, "1", "model.onnx"))
        np.savez(os.path.join(out, model, "data.npz"), x=x, label=y)
        np.save(os.path.join(out, model, "x.npy"), x)
        np.save(os.path.join(out, model, "label.npy"), y)
        manifest["models"][model] = {"params": list(w32.keys()), "batch": int(x.shape[0]),
                                     "x_shape": list(x.shape)}
        for opt in OPTIMS:
            losses, w = train(model, opt)
            d = os.path.join(out, f"{model}_{opt}")
            os.makedirs(d, exist_ok=True)
            np.save(os.path.join(d, "losses.npy"), losses)
            for k, v in w.items():
                np.save(os.path.join(d, f"{k}.npy"), v)
            _, w_f32 = train(model, opt, dtype=np.float32)
            for k, v in w_f32.items():
                np.save(os.path.join(d, f"{k}_f32.npy"), v.astype(np.float32))
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


def grad_check(model, h=1e-6):
    """Max relative error of the hand-written backward against central differences (float64)."""
    setup, loss_grad = MODELS[model]
    w32, x, y = setup()
    w = {k: v.astype(np.float64) for k, v in w32.items()}
    x = x.astype(np.float64)
    _, g = loss_grad(w, x, y)
    rng = np.random.default_rng(7)
    worst = 0.0
    for k, v in w.items():
        idx = [tuple(rng.integers(0, s) for s in v.shape) for _ in range(12)]
        for i in idx:
            old = v[i]
            v[i] = old + h
            lp, _ = loss_grad(w, x, y)
            v[i] = old - h
            lm, _ = loss_grad(w, x, y)
            v[i] = old
            num = (lp - lm) / (2 * h)
            scale = max(np.abs(g[k]).max(), 1e-12)
            worst = max(worst, abs(num - g[k][i]) / scale)
    return worst


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    write_all(sys.argv[1])
