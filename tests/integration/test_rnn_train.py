"""`tensord train` fine-tunes recurrent models: the gradients of LSTM and GRU (com.tensord LSTMGrad / GRUGrad).

The models are text classifiers written with onnx.helper: a Gather embedding over a small vocabulary, then an
LSTM (layout 0, through a Transpose; Y computed but unused) or a bidirectional GRU (layout 1, linear_before_reset=1,
Y omitted), the last hidden state Y_h into a Gemm that gives the logits. The dataset is text-like: token sequences
whose class says whether a keyword token occurs.

Checked: one epoch of Adam lowers the logged step loss (LSTM and GRU); three full-batch steps of plain SGD end at
the weights of a float64 numpy implementation of the same forward, loss (mean softmax cross entropy on logits,
engine/train/loss.c) and backward written here, within 1e-5 of the weights' scale.
"""
import json
import os
import subprocess

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from conftest import SANITIZER_MARKS

V, E, H, T, C = 24, 8, 12, 10, 2   # vocabulary, embedding, hidden, sequence length, classes
KEYWORD = 3


def run(binary, *args, timeout=120):
    cp = subprocess.run([binary, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    for mark in SANITIZER_MARKS:
        assert mark not in cp.stderr, cp.stderr[-4000:]
    assert cp.returncode == 0, f"exit {cp.returncode}\n{cp.stderr[-4000:]}"
    return cp


def init_weights(cell, ndir, seed=0):
    rng = np.random.default_rng(seed)
    G = 4 if cell == "LSTM" else 3
    u = lambda s, *shape: rng.uniform(-s, s, shape).astype(np.float32)
    return {"emb": u(0.5, V, E), "W": u(0.35, ndir, G * H, E), "R": u(0.35, ndir, G * H, H),
            "B": u(0.1, ndir, 2 * G * H), "Wo": u(0.4, C, ndir * H), "bo": u(0.1, C)}


def classifier(cell, w):
    """tokens [N, T] int64 -> logits [N, C]."""
    inits = [numpy_helper.from_array(v, k) for k, v in w.items()]
    nodes = [helper.make_node("Gather", ["emb", "tokens"], ["x_bte"])]
    if cell == "LSTM":  # layout 0: X [T, N, E]; Y_h [1, N, H]
        inits.append(numpy_helper.from_array(np.array([0], np.int64), "axes0"))
        nodes += [helper.make_node("Transpose", ["x_bte"], ["x_tbe"], perm=[1, 0, 2]),
                  helper.make_node("LSTM", ["x_tbe", "W", "R", "B"], ["Y", "Y_h"], hidden_size=H),
                  helper.make_node("Squeeze", ["Y_h", "axes0"], ["h"])]
    else:  # bidirectional GRU, layout 1: X [N, T, E]; Y_h [N, 2, H]
        nodes += [helper.make_node("GRU", ["x_bte", "W", "R", "B"], ["", "Y_h"], hidden_size=H,
                                   direction="bidirectional", linear_before_reset=1, layout=1),
                  helper.make_node("Flatten", ["Y_h"], ["h"], axis=1)]
    nodes.append(helper.make_node("Gemm", ["h", "Wo", "bo"], ["logits"], transB=1))
    g = helper.make_graph(nodes, cell.lower() + "_classifier",
                          [helper.make_tensor_value_info("tokens", TensorProto.INT64, ["N", T])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", C])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def save_base(tmp_path, name, model):
    base = tmp_path / name
    (base / "1").mkdir(parents=True)
    onnx.save(model, str(base / "1" / "model.onnx"))
    return base


def text_data(path, n, seed):
    """Sequences of 'words' (tokens 4..V-1); class 1 when the keyword token occurs (once or twice)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(4, V, size=(n, T))
    y = rng.integers(0, 2, size=n)
    for i in np.nonzero(y)[0]:
        x[i, rng.choice(T, size=rng.integers(1, 3), replace=False)] = KEYWORD
    np.savez(path, tokens=x.astype(np.int64), label=y.astype(np.int64))
    return x, y


def weights(version_dir):
    m = onnx.load(str(version_dir / "model.onnx"))
    return {t.name: numpy_helper.to_array(t) for t in m.graph.initializer if t.data_type == TensorProto.FLOAT}


def step_losses(version_dir):
    return [s["loss"] for s in json.load(open(version_dir / "metrics.json"))["steps"]]


# ---- float64 reference: embedding -> LSTM (i, o, f, c; sigmoid, tanh, tanh) -> Gemm -> mean softmax CE ----

def sig(v):
    return 1 / (1 + np.exp(-v))


def lstm_loss_and_grads(w, x, y):
    emb, W, R, B, Wo, bo = (w[k][0] if k in ("W", "R", "B") else w[k] for k in ("emb", "W", "R", "B", "Wo", "bo"))
    N = x.shape[0]
    X = emb[x]                               # [N, T, E]
    h, c = np.zeros((N, H)), np.zeros((N, H))
    bias = B[:4 * H] + B[4 * H:]
    tape = []
    for t in range(T):
        a = X[:, t] @ W.T + h @ R.T + bias
        i, o, f, g = sig(a[:, :H]), sig(a[:, H:2 * H]), sig(a[:, 2 * H:3 * H]), np.tanh(a[:, 3 * H:])
        cn = f * c + i * g
        tape.append((h, c, i, o, f, g, cn))
        h, c = o * np.tanh(cn), cn
    logits = h @ Wo.T + bo
    z = logits - logits.max(1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    loss = -np.mean(np.log(p[np.arange(N), y]))
    dlog = p.copy()
    dlog[np.arange(N), y] -= 1
    dlog /= N
    gr = {"Wo": dlog.T @ h, "bo": dlog.sum(0)}
    dh, dc = dlog @ Wo, np.zeros((N, H))
    dW, dR, dbias, dX = np.zeros_like(W), np.zeros_like(R), np.zeros(4 * H), np.zeros_like(X)
    for t in reversed(range(T)):
        hp, cp, i, o, f, g, cn = tape[t]
        tc = np.tanh(cn)
        dc = dc + dh * o * (1 - tc * tc)
        da = np.concatenate([dc * g * i * (1 - i), dh * tc * o * (1 - o), dc * cp * f * (1 - f),
                             dc * i * (1 - g * g)], 1)
        dW += da.T @ X[:, t]
        dR += da.T @ hp
        dbias += da.sum(0)
        dX[:, t] = da @ W
        dh, dc = da @ R, dc * f
    demb = np.zeros_like(emb)
    np.add.at(demb, x, dX)
    gr.update(emb=demb, W=dW[None], R=dR[None], B=np.concatenate([dbias, dbias])[None])
    return loss, gr


# ---- tests ----

def test_lstm_classifier_loss_falls_in_one_epoch(tensord_bin, tmp_path):
    base = save_base(tmp_path, "lstm", classifier("LSTM", init_weights("LSTM", 1)))
    text_data(tmp_path / "d.npz", 384, seed=1)
    run(tensord_bin, "train", "--model-base-path", base, "--data", tmp_path / "d.npz", "--epochs", 1, "--batch-size", 16,
        "--optimizer", "adam", "--lr", 0.03, "--loss", "sparse_categorical_crossentropy", "--from-logits", "true",
        "--seed", 5, "--threads", 2, "--no-progress")
    losses = step_losses(base / "2")
    assert len(losses) == 24, losses
    assert np.mean(losses[-4:]) < 0.75 * np.mean(losses[:4]), losses
    # every parameter moved, the LSTM's included
    w1, w2 = weights(base / "1"), weights(base / "2")
    for k in ("emb", "W", "R", "B", "Wo", "bo"):
        assert np.max(np.abs(w2[k] - w1[k])) > 1e-3, k


def test_gru_bidirectional_classifier_loss_falls(tensord_bin, tmp_path):
    base = save_base(tmp_path, "gru", classifier("GRU", init_weights("GRU", 2)))
    text_data(tmp_path / "d.npz", 384, seed=2)
    run(tensord_bin, "train", "--model-base-path", base, "--data", tmp_path / "d.npz", "--epochs", 1, "--batch-size", 16,
        "--optimizer", "adam", "--lr", 0.03, "--loss", "sparse_categorical_crossentropy", "--from-logits", "true",
        "--seed", 5, "--threads", 2, "--no-progress")
    losses = step_losses(base / "2")
    assert np.mean(losses[-4:]) < 0.75 * np.mean(losses[:4]), losses
    w1, w2 = weights(base / "1"), weights(base / "2")
    for k in ("emb", "W", "R", "B", "Wo", "bo"):
        assert np.max(np.abs(w2[k] - w1[k])) > 1e-3, k


def test_lstm_sgd_steps_match_numpy_float64(tensord_bin, tmp_path):
    """Three steps of plain SGD on one full batch (the loader's shuffle only permutes the rows of the mean) end at the
    weights a float64 numpy forward + backward gives; the logged losses match too."""
    w = init_weights("LSTM", 1, seed=3)
    base = save_base(tmp_path, "lstm", classifier("LSTM", w))
    x, y = text_data(tmp_path / "d.npz", 12, seed=4)
    lr, steps = 0.5, 3
    run(tensord_bin, "train", "--model-base-path", base, "--data", tmp_path / "d.npz", "--epochs", steps,
        "--batch-size", len(y), "--optimizer", "sgd", "--lr", lr, "--momentum", 0, "--loss",
        "sparse_categorical_crossentropy", "--from-logits", "true", "--seed", 1, "--threads", 1, "--no-progress")
    ref = {k: v.astype(np.float64) for k, v in w.items()}
    ref_losses = []
    for _ in range(steps):
        loss, g = lstm_loss_and_grads(ref, x, y)
        ref_losses.append(loss)
        for k in ref:
            ref[k] = ref[k] - lr * g[k]
    got = weights(base / "2")
    for k in ref:
        moved = np.max(np.abs(ref[k] - w[k]))
        assert moved > 1e-3, (k, moved)  # the checks below would be weak on a parameter that did not move
        err = np.max(np.abs(got[k] - ref[k])) / max(1.0, np.max(np.abs(ref[k])))
        assert err <= 1e-5, (k, err)
        # the sum of the three updates itself, to 0.1% of its size (float32 rounding leaves ~1e-5)
        assert np.max(np.abs((got[k] - w[k]) - (ref[k] - w[k]))) <= 1e-3 * moved, k
    assert np.allclose(step_losses(base / "2"), ref_losses, rtol=1e-5, atol=1e-6), (step_losses(base / "2"), ref_losses)
