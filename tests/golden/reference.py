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
import math
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


# ---- ResNet basic block (BatchNorm in training mode) and post-LN transformer encoder block ----
# Both are checked with Adam only, ADAM_STEPS steps, plus every parameter's gradient at step 0.
# No conv bias before BatchNorm and no key bias in attention: those gradients are exactly zero in exact
# arithmetic (BN removes a per-channel constant; q.bk is constant along the softmax axis), so a relative error
# on them would compare rounding noise, and Adam would turn that noise into full-size steps.
ADAM_STEPS = 3
BN_EPS = 1e-3      # as the zoo's mdl_b_batchnorm
LN_EPS = 1e-5      # as the zoo's mdl_b_layernorm
HEADS = 2


def resnet_setup():
    rng = np.random.default_rng(20240603)
    c = 4
    w = {
        "conv1_W": glorot(rng, (c, c, 3, 3), c * 9, c * 9),
        "bn1_gamma": (1.0 + 0.1 * rng.standard_normal(c)).astype(np.float32),
        "bn1_beta": (0.1 * rng.standard_normal(c)).astype(np.float32),
        "conv2_W": glorot(rng, (c, c, 3, 3), c * 9, c * 9),
        "bn2_gamma": (1.0 + 0.1 * rng.standard_normal(c)).astype(np.float32),
        "bn2_beta": (0.1 * rng.standard_normal(c)).astype(np.float32),
        "fc_W": glorot(rng, (c, 3), c, 3),
        "fc_b": (0.01 * rng.standard_normal(3)).astype(np.float32),
    }
    x = rng.standard_normal((4, c, 6, 6)).astype(np.float32)
    y = rng.integers(0, 3, size=4).astype(np.int64)
    return w, x, y


def conv3x3_same(x, wt):
    """Conv 3x3, pad 1, stride 1, no bias: output and the patches (for the backward)."""
    cols = im2col(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), 3)    # [N,H,W,C,3,3]
    return np.einsum("nhwcij,fcij->nfhw", cols, wt), cols


def conv3x3_same_back(dy, cols, wt):
    dw = np.einsum("nfhw,nhwcij->fcij", dy, cols)
    dcols = np.einsum("nfhw,fcij->nhwcij", dy, wt)
    n, hh, ww = dcols.shape[0], dcols.shape[1], dcols.shape[2]
    dxp = np.zeros((n, wt.shape[1], hh + 2, ww + 2), dtype=dy.dtype)
    for i in range(3):
        for j in range(3):
            dxp[:, :, i:i + hh, j:j + ww] += dcols[:, :, :, :, i, j].transpose(0, 3, 1, 2)
    return dxp[:, :, 1:-1, 1:-1], dw


def bn_train(x, g, b):
    """BatchNormalization with batch statistics (biased variance), per channel over (N, H, W)."""
    mu = x.mean((0, 2, 3), keepdims=True)
    var = ((x - mu) ** 2).mean((0, 2, 3), keepdims=True)
    inv = 1.0 / np.sqrt(var + BN_EPS)
    xh = (x - mu) * inv
    return xh * g[None, :, None, None] + b[None, :, None, None], (xh, inv)


def bn_train_back(dy, cache, g):
    xh, inv = cache
    dxh = dy * g[None, :, None, None]
    dx = inv * (dxh - dxh.mean((0, 2, 3), keepdims=True) - xh * (dxh * xh).mean((0, 2, 3), keepdims=True))
    return dx, (dy * xh).sum((0, 2, 3)), dy.sum((0, 2, 3))


def resnet_loss_grad(w, x, y):
    c1, cols1 = conv3x3_same(x, w["conv1_W"])
    b1, bc1 = bn_train(c1, w["bn1_gamma"], w["bn1_beta"])
    r1 = np.maximum(b1, 0.0)
    c2, cols2 = conv3x3_same(r1, w["conv2_W"])
    b2, bc2 = bn_train(c2, w["bn2_gamma"], w["bn2_beta"])
    s = b2 + x
    r2 = np.maximum(s, 0.0)
    p = r2.mean((2, 3))                                               # GlobalAveragePool + Flatten: [N,C]
    z = p @ w["fc_W"] + w["fc_b"]
    loss, dz = sce_from_logits(z, y)
    g = {"fc_W": p.T @ dz, "fc_b": dz.sum(0)}
    dp = dz @ w["fc_W"].T
    ds = np.broadcast_to(dp[:, :, None, None] / (r2.shape[2] * r2.shape[3]), r2.shape) * (s > 0)
    dc2, g["bn2_gamma"], g["bn2_beta"] = bn_train_back(ds, bc2, w["bn2_gamma"])
    dr1, g["conv2_W"] = conv3x3_same_back(dc2, cols2, w["conv2_W"])
    db1 = dr1 * (b1 > 0)
    dc1, g["bn1_gamma"], g["bn1_beta"] = bn_train_back(db1, bc1, w["bn1_gamma"])
    _, g["conv1_W"] = conv3x3_same_back(dc1, cols1, w["conv1_W"])
    return loss, g


def transformer_setup():
    rng = np.random.default_rng(20240604)
    d, f = 8, 16
    w = {}
    for k in ("q", "k", "v", "o"):
        w["W" + k] = glorot(rng, (d, d), d, d)
        if k != "k":
            w["b" + k] = (0.1 * rng.standard_normal(d)).astype(np.float32)
    w["ln1_gamma"] = (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32)
    w["ln1_beta"] = (0.1 * rng.standard_normal(d)).astype(np.float32)
    w["ff1_W"] = glorot(rng, (d, f), d, f)
    w["ff1_b"] = (0.1 * rng.standard_normal(f)).astype(np.float32)
    w["ff2_W"] = glorot(rng, (f, d), f, d)
    w["ff2_b"] = (0.1 * rng.standard_normal(d)).astype(np.float32)
    w["ln2_gamma"] = (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32)
    w["ln2_beta"] = (0.1 * rng.standard_normal(d)).astype(np.float32)
    w["head_W"] = glorot(rng, (d, 3), d, 3)
    w["head_b"] = (0.01 * rng.standard_normal(3)).astype(np.float32)
    x = rng.standard_normal((2, 5, d)).astype(np.float32)
    y = rng.integers(0, 3, size=2).astype(np.int64)
    return w, x, y


def ln(x, g, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    inv = 1.0 / np.sqrt(var + LN_EPS)
    xh = (x - mu) * inv
    return xh * g + b, (xh, inv)


def ln_back(dy, cache, g):
    xh, inv = cache
    dxh = dy * g
    dx = inv * (dxh - dxh.mean(-1, keepdims=True) - xh * (dxh * xh).mean(-1, keepdims=True))
    return dx, (dy * xh).sum((0, 1)), dy.sum((0, 1))


_erf = np.vectorize(math.erf)


def transformer_loss_grad(w, x, y):
    n, t, d = x.shape
    dh = d // HEADS
    scale = 1.0 / math.sqrt(dh)
    q = (x @ w["Wq"] + w["bq"]).reshape(n, t, HEADS, dh).transpose(0, 2, 1, 3)     # [N,H,T,dh]
    kt = (x @ w["Wk"]).reshape(n, t, HEADS, dh).transpose(0, 2, 3, 1)             # [N,H,dh,T]
    v = (x @ w["Wv"] + w["bv"]).reshape(n, t, HEADS, dh).transpose(0, 2, 1, 3)     # [N,H,T,dh]
    s = (q @ kt) * scale
    e = np.exp(s - s.max(-1, keepdims=True))
    a = e / e.sum(-1, keepdims=True)
    o = (a @ v).transpose(0, 2, 1, 3).reshape(n, t, d)
    h1 = x + o @ w["Wo"] + w["bo"]
    l1, lc1 = ln(h1, w["ln1_gamma"], w["ln1_beta"])
    u = l1 @ w["ff1_W"] + w["ff1_b"]
    erfu = _erf(u / math.sqrt(2.0)).astype(u.dtype)
    gu = 0.5 * u * (1.0 + erfu)
    h2 = l1 + gu @ w["ff2_W"] + w["ff2_b"]
    l2, lc2 = ln(h2, w["ln2_gamma"], w["ln2_beta"])
    p = l2.mean(1)                                                                 # ReduceMean over T: [N,D]
    z = p @ w["head_W"] + w["head_b"]
    loss, dz = sce_from_logits(z, y)
    g = {"head_W": p.T @ dz, "head_b": dz.sum(0)}
    dl2 = np.broadcast_to((dz @ w["head_W"].T)[:, None, :] / t, l2.shape)
    dh2, g["ln2_gamma"], g["ln2_beta"] = ln_back(dl2, lc2, w["ln2_gamma"])
    g["ff2_W"] = np.einsum("ntf,ntd->fd", gu, dh2)
    g["ff2_b"] = dh2.sum((0, 1))
    dgu = dh2 @ w["ff2_W"].T
    du = dgu * (0.5 * (1.0 + erfu) + u * np.exp(-0.5 * u * u) / math.sqrt(2.0 * math.pi))
    g["ff1_W"] = np.einsum("ntd,ntf->df", l1, du)
    g["ff1_b"] = du.sum((0, 1))
    dl1 = dh2 + du @ w["ff1_W"].T
    dh1, g["ln1_gamma"], g["ln1_beta"] = ln_back(dl1, lc1, w["ln1_gamma"])
    g["Wo"] = np.einsum("ntd,nte->de", o, dh1)
    g["bo"] = dh1.sum((0, 1))
    do = (dh1 @ w["Wo"].T).reshape(n, t, HEADS, dh).transpose(0, 2, 1, 3)          # [N,H,T,dh]
    da = do @ v.transpose(0, 1, 3, 2)
    dv = a.transpose(0, 1, 3, 2) @ do
    ds = a * (da - (da * a).sum(-1, keepdims=True)) * scale
    dq = ds @ kt.transpose(0, 1, 3, 2)                                             # [N,H,T,dh]
    dkt = q.transpose(0, 1, 3, 2) @ ds                                             # [N,H,dh,T]
    dq = dq.transpose(0, 2, 1, 3).reshape(n, t, d)
    dk = dkt.transpose(0, 3, 1, 2).reshape(n, t, d)
    dv = dv.transpose(0, 2, 1, 3).reshape(n, t, d)
    g["Wq"] = np.einsum("ntd,nte->de", x, dq)
    g["bq"] = dq.sum((0, 1))
    g["Wk"] = np.einsum("ntd,nte->de", x, dk)
    g["Wv"] = np.einsum("ntd,nte->de", x, dv)
    g["bv"] = dv.sum((0, 1))
    return loss, g


MODELS = {"mlp": (mlp_setup, mlp_loss_grad), "cnn": (cnn_setup, cnn_loss_grad),
          "resnet": (resnet_setup, resnet_loss_grad), "transformer": (transformer_setup, transformer_loss_grad)}
# optimizers and steps per model
RUNS = {"mlp": (("sgd", "adam"), STEPS), "cnn": (("sgd", "adam"), STEPS),
        "resnet": (("adam",), ADAM_STEPS), "transformer": (("adam",), ADAM_STEPS)}


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
    elif model == "cnn":
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
    elif model == "resnet":
        # BatchNormalization in inference form (5 inputs, one output), as the zoo writes it:
        # eng_graph_set_training turns it into training_mode=1 with running-stat outputs.
        c = w["conv1_W"].shape[0]
        inits += [numpy_helper.from_array(np.zeros(c, np.float32), name=f"bn{i}_mean") for i in (1, 2)]
        inits += [numpy_helper.from_array(np.ones(c, np.float32), name=f"bn{i}_var") for i in (1, 2)]
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", c, 6, 6])
        conv = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1])
        nodes = [
            helper.make_node("Conv", ["x", "conv1_W"], ["c1"], name="conv1", **conv),
            helper.make_node("BatchNormalization", ["c1", "bn1_gamma", "bn1_beta", "bn1_mean", "bn1_var"], ["b1"],
                             name="bn1", epsilon=BN_EPS, momentum=0.99),
            helper.make_node("Relu", ["b1"], ["r1"], name="relu1"),
            helper.make_node("Conv", ["r1", "conv2_W"], ["c2"], name="conv2", **conv),
            helper.make_node("BatchNormalization", ["c2", "bn2_gamma", "bn2_beta", "bn2_mean", "bn2_var"], ["b2"],
                             name="bn2", epsilon=BN_EPS, momentum=0.99),
            helper.make_node("Add", ["b2", "x"], ["s"], name="residual"),
            helper.make_node("Relu", ["s"], ["r2"], name="relu2"),
            helper.make_node("GlobalAveragePool", ["r2"], ["gap"], name="gap"),
            helper.make_node("Flatten", ["gap"], ["f"], name="flatten", axis=1),
            helper.make_node("Gemm", ["f", "fc_W", "fc_b"], ["logits"], name="fc"),
            helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax", axis=-1),
        ]
    else:  # transformer: post-LN encoder block, as models/transformer.c
        d = w["Wq"].shape[0]
        dh = d // HEADS
        inits += [numpy_helper.from_array(np.array([0, 0, HEADS, dh], np.int64), name="shape_heads"),
                  numpy_helper.from_array(np.array([0, 0, d], np.int64), name="shape_merge"),
                  numpy_helper.from_array(np.array(1.0 / math.sqrt(dh), np.float32), name="attn_scale"),
                  numpy_helper.from_array(np.array(math.sqrt(2.0), np.float32), name="sqrt2"),
                  numpy_helper.from_array(np.array(1.0, np.float32), name="one"),
                  numpy_helper.from_array(np.array(0.5, np.float32), name="half")]
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5, d])
        mk = helper.make_node
        nodes = [
            mk("MatMul", ["x", "Wq"], ["q0"], name="q/matmul"), mk("Add", ["q0", "bq"], ["q1"], name="q/bias"),
            mk("Reshape", ["q1", "shape_heads"], ["q2"], name="q/reshape"),
            mk("Transpose", ["q2"], ["q"], name="q/transpose", perm=[0, 2, 1, 3]),
            mk("MatMul", ["x", "Wk"], ["k1"], name="k/matmul"),
            mk("Reshape", ["k1", "shape_heads"], ["k2"], name="k/reshape"),
            mk("Transpose", ["k2"], ["kt"], name="k/transpose", perm=[0, 2, 3, 1]),
            mk("MatMul", ["x", "Wv"], ["v0"], name="v/matmul"), mk("Add", ["v0", "bv"], ["v1"], name="v/bias"),
            mk("Reshape", ["v1", "shape_heads"], ["v2"], name="v/reshape"),
            mk("Transpose", ["v2"], ["v"], name="v/transpose", perm=[0, 2, 1, 3]),
            mk("MatMul", ["q", "kt"], ["s0"], name="scores/matmul"),
            mk("Mul", ["s0", "attn_scale"], ["s"], name="scores/scale"),
            mk("Softmax", ["s"], ["a"], name="attn/softmax", axis=-1),
            mk("MatMul", ["a", "v"], ["o0"], name="context/matmul"),
            mk("Transpose", ["o0"], ["o1"], name="context/transpose", perm=[0, 2, 1, 3]),
            mk("Reshape", ["o1", "shape_merge"], ["o2"], name="context/reshape"),
            mk("MatMul", ["o2", "Wo"], ["o3"], name="o/matmul"), mk("Add", ["o3", "bo"], ["o"], name="o/bias"),
            mk("Add", ["x", "o"], ["h1"], name="attn/residual"),
            mk("LayerNormalization", ["h1", "ln1_gamma", "ln1_beta"], ["l1"], name="ln1", axis=-1, epsilon=LN_EPS),
            mk("MatMul", ["l1", "ff1_W"], ["u0"], name="ff1/matmul"), mk("Add", ["u0", "ff1_b"], ["u"], name="ff1/bias"),
            mk("Div", ["u", "sqrt2"], ["g0"], name="gelu/div"), mk("Erf", ["g0"], ["g1"], name="gelu/erf"),
            mk("Add", ["g1", "one"], ["g2"], name="gelu/add"), mk("Mul", ["u", "g2"], ["g3"], name="gelu/mul"),
            mk("Mul", ["g3", "half"], ["gu"], name="gelu/mul_1"),
            mk("MatMul", ["gu", "ff2_W"], ["f0"], name="ff2/matmul"), mk("Add", ["f0", "ff2_b"], ["f"], name="ff2/bias"),
            mk("Add", ["l1", "f"], ["h2"], name="ffn/residual"),
            mk("LayerNormalization", ["h2", "ln2_gamma", "ln2_beta"], ["l2"], name="ln2", axis=-1, epsilon=LN_EPS),
            mk("ReduceMean", ["l2"], ["p"], name="pool", axes=[1], keepdims=0),
            mk("Gemm", ["p", "head_W", "head_b"], ["logits"], name="head"),
            mk("Softmax", ["logits"], ["probabilities"], name="softmax", axis=-1),
        ]
    classes = w[{"mlp": "b2", "cnn": "dense_b", "resnet": "fc_b", "transformer": "head_b"}[model]].shape[0]
    out = helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", classes])
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
        opts, steps = RUNS[model]
        manifest["models"][model] = {"params": list(w32.keys()), "batch": int(x.shape[0]),
                                     "x_shape": list(x.shape), "optimizers": list(opts), "steps": steps}
        _, g0 = MODELS[model][1]({k: v.astype(np.float64) for k, v in w32.items()}, x.astype(np.float64), y)
        os.makedirs(os.path.join(out, model, "grad0"), exist_ok=True)
        for k, v in g0.items():
            np.save(os.path.join(out, model, "grad0", f"{k}.npy"), np.ascontiguousarray(v, dtype=np.float64))
        for opt in opts:
            losses, w = train(model, opt, steps)
            d = os.path.join(out, f"{model}_{opt}")
            os.makedirs(d, exist_ok=True)
            np.save(os.path.join(d, "losses.npy"), losses)
            for k, v in w.items():
                np.save(os.path.join(d, f"{k}.npy"), v)
            _, w_f32 = train(model, opt, steps, dtype=np.float32)
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
