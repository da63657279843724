#!/usr/bin/env python3
"""LSTM training cost on the CPU: tensord's forward kernel ("rnn") against its gradient kernel ("rnn_grad", com.tensord
LSTMGrad, which recomputes the forward), a whole `tensord train` step, and PyTorch's CPU LSTM doing the same.

  .venv/bin/python bench/rnn_train_bench.py                # batch 32 and batch 1, 2 threads, 5 rounds
  .venv/bin/python bench/rnn_train_bench.py --save         # also writes bench/results/rnn-train-cpu.md
  .venv/bin/python bench/rnn_train_bench.py --quick        # smoke run (2 rounds, fewer iterations)

Kernel rows (seq --seq, batch 32, input 128, hidden 256, one direction, biases; batch 1 at seq 64): two one-node
models run by `tensord bench` with every tensor a graph input (weights change between training steps, so nothing is
packed once): fwd.onnx, LSTM(X, W, R, B) -> Y, Y_h; grad.onnx, com.tensord LSTMGrad(dY, dY_h, -, X, W, R, B) ->
dX, dW, dR, dB (the gradients `tensord train` asks of it). PyTorch: torch.nn.LSTM(128, 256) on the same shapes,
forward under no_grad, and forward + backward of sum(Y * dY) + sum(Y_h * dY_h) with every parameter and the input
requiring grad; its backward is the difference of the two medians (PyTorch keeps the forward's gates, tensord's
gradient kernel recomputes them, so the tensord backward column includes a forward).
Train rows: the text classifier of tests/integration/test_rnn_train.py at benchmark size (vocabulary 1000,
embedding 128, LSTM hidden 256, sequence --seq, 2 classes; Gather -> Transpose -> LSTM -> Y_h -> Gemm), one epoch of
--train-examples examples at batch 32, plain SGD; tensord: 1000 * batch / examples_per_sec of its metrics.json
(time inside training steps); PyTorch: the same model (nn.Embedding, nn.LSTM, nn.Linear, cross entropy, SGD), the
median step over the epoch after 3 warm-up steps.
--rounds alternating rounds (one tensord process per row and round, then the PyTorch worker), medians over rounds of
each round's median. --baseline BIN times a second tensord build (say, one from before a kernel change) in the same
rounds. Threads: tensord --threads, torch.set_num_threads. The PyTorch side runs in the system Python
(--torch-python, default /usr/bin/python3, Debian's python3-torch); this file is also that side's worker (--worker).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
INPUT, HID, VOCAB, CLASSES = 128, 256, 1000, 2


# ---- the PyTorch side (system Python) ----

def torch_worker(a):
    import time

    import torch
    import torch.nn as nn
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    out = {"torch": torch.__version__, "kernels": {}}

    def med(f, n, warm=3):
        for _ in range(warm):
            f()
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            f()
            ts.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ts)

    for seq, batch in json.loads(a.shapes):
        lstm = nn.LSTM(INPUT, HID)
        x = torch.randn(seq, batch, INPUT, requires_grad=True)
        dy, dh = torch.randn(seq, batch, HID), torch.randn(1, batch, HID)

        def fwd():
            with torch.no_grad():
                lstm(x)

        def step():
            y, (h, _) = lstm(x)
            lstm.zero_grad(set_to_none=True)
            x.grad = None
            ((y * dy).sum() + (h * dh).sum()).backward()

        f, fb = med(fwd, a.iterations), med(step, a.iterations)
        out["kernels"][f"{seq}x{batch}"] = {"fwd_ms": f, "fwd_bwd_ms": fb}

    if a.train_examples:
        class Clf(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb, self.lstm, self.fc = nn.Embedding(VOCAB, INPUT), nn.LSTM(INPUT, HID), nn.Linear(HID, CLASSES)

            def forward(self, tok):  # tok [N, T]
                _, (h, _) = self.lstm(self.emb(tok).transpose(0, 1))
                return self.fc(h[0])

        m = Clf()
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        g = np.random.default_rng(1)
        tok = torch.from_numpy(g.integers(0, VOCAB, (a.train_examples, a.seq)))
        lab = torch.from_numpy(g.integers(0, CLASSES, a.train_examples))
        ts = []
        for i in range(0, a.train_examples - 31, 32):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(m(tok[i:i + 32]), lab[i:i + 32]).backward()
            opt.step()
            ts.append((time.perf_counter() - t0) * 1e3)
        out["train_step_ms"] = statistics.median(ts[3:] if len(ts) > 6 else ts)
    print(json.dumps(out))


# ---- the tensord side ----

def lstm_models(tmp, seq, batch, seed=0):
    """fwd.onnx, grad.onnx and their input files for one shape."""
    import onnx
    from onnx import TensorProto as TP
    from onnx import helper, numpy_helper  # noqa: F401
    rng = np.random.default_rng(seed)
    s = 1.0 / np.sqrt(HID)
    arrs = {"X": rng.standard_normal((seq, batch, INPUT)), "W": rng.uniform(-s, s, (1, 4 * HID, INPUT)),
            "R": rng.uniform(-s, s, (1, 4 * HID, HID)), "B": rng.uniform(-s, s, (1, 8 * HID)),
            "dY": rng.standard_normal((seq, 1, batch, HID)), "dY_h": rng.standard_normal((1, batch, HID))}
    files = {}
    for k, v in arrs.items():
        files[k] = os.path.join(tmp, f"{k}_{seq}x{batch}.npy")
        np.save(files[k], v.astype(np.float32))

    def vi(name, shape):
        return helper.make_tensor_value_info(name, TP.FLOAT, list(shape))

    ins = [vi(k, arrs[k].shape) for k in ("X", "W", "R", "B")]
    fwd = helper.make_graph([helper.make_node("LSTM", ["X", "W", "R", "B"], ["Y", "Y_h"], hidden_size=HID)], "fwd",
                            ins, [vi("Y", (seq, 1, batch, HID)), vi("Y_h", (1, batch, HID))])
    grad = helper.make_graph(
        [helper.make_node("LSTMGrad", ["dY", "dY_h", "", "X", "W", "R", "B"], ["dX", "dW", "dR", "dB"],
                          domain="com.tensord", hidden_size=HID)], "grad",
        [vi("dY", arrs["dY"].shape), vi("dY_h", arrs["dY_h"].shape)] + ins,
        [vi("dX", arrs["X"].shape), vi("dW", arrs["W"].shape), vi("dR", arrs["R"].shape), vi("dB", arrs["B"].shape)])
    paths = {}
    for name, g, opsets in (("fwd", fwd, [("", 14)]), ("grad", grad, [("", 14), ("com.tensord", 1)])):
        m = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
        m.ir_version = 8
        paths[name] = os.path.join(tmp, f"{name}_{seq}x{batch}.onnx")
        onnx.save(m, paths[name])
    return paths, {k: files[k] for k in ("X", "W", "R", "B")}, {k: files[k] for k in ("dY", "dY_h", "X", "W", "R", "B")}


def classifier_base(tmp, seq, examples):
    """The LSTM text classifier (tests/integration/test_rnn_train.py's, at benchmark size) and a dataset."""
    import onnx
    from onnx import TensorProto as TP
    from onnx import helper, numpy_helper
    rng = np.random.default_rng(0)
    u = lambda s, *shape: rng.uniform(-s, s, shape).astype(np.float32)  # noqa: E731
    s = 1.0 / np.sqrt(HID)
    w = {"emb": u(1.0, VOCAB, INPUT), "W": u(s, 1, 4 * HID, INPUT), "R": u(s, 1, 4 * HID, HID), "B": u(s, 1, 8 * HID),
         "Wo": u(s, CLASSES, HID), "bo": u(s, CLASSES)}
    inits = [numpy_helper.from_array(v, k) for k, v in w.items()]
    inits.append(numpy_helper.from_array(np.array([0], np.int64), "axes0"))
    nodes = [helper.make_node("Gather", ["emb", "tokens"], ["x_bte"]),
             helper.make_node("Transpose", ["x_bte"], ["x_tbe"], perm=[1, 0, 2]),
             helper.make_node("LSTM", ["x_tbe", "W", "R", "B"], ["", "Y_h"], hidden_size=HID),
             helper.make_node("Squeeze", ["Y_h", "axes0"], ["h"]),
             helper.make_node("Gemm", ["h", "Wo", "bo"], ["logits"], transB=1)]
    g = helper.make_graph(nodes, "lstm_classifier", [helper.make_tensor_value_info("tokens", TP.INT64, ["N", seq])],
                          [helper.make_tensor_value_info("logits", TP.FLOAT, ["N", CLASSES])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    base = os.path.join(tmp, "clf")
    os.makedirs(os.path.join(base, "1"), exist_ok=True)
    onnx.save(m, os.path.join(base, "1", "model.onnx"))
    d = np.random.default_rng(1)
    data = os.path.join(tmp, "clf.npz")
    np.savez(data, tokens=d.integers(0, VOCAB, (examples, seq)).astype(np.int64),
             label=d.integers(0, CLASSES, examples).astype(np.int64))
    return base, data


def tensord_train_step_ms(binary, base, data, threads, timeout):
    import shutil
    for v in os.listdir(base):
        if v != "1":
            shutil.rmtree(os.path.join(base, v))
    cp = subprocess.run([binary, "train", "--model-base-path", base, "--data", data, "--epochs", "1", "--batch-size",
                         "32", "--optimizer", "sgd", "--lr", "0.01", "--momentum", "0", "--loss",
                         "sparse_categorical_crossentropy", "--from-logits", "true", "--threads", str(threads),
                         "--no-progress"], capture_output=True, text=True, timeout=timeout)
    if cp.returncode != 0:
        return None, (cp.stderr.strip().splitlines() or ["?"])[-1][:160]
    ep = json.load(open(os.path.join(base, "2", "metrics.json")))["epochs"][-1]
    return 1e3 * 32 / ep["examples_per_sec"], ""


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--shapes", default="[]", help=argparse.SUPPRESS)
    p.add_argument("--tensord", default=os.environ.get("TENSORD_BIN", os.path.join(ROOT, "build", "tensord")))
    p.add_argument("--torch-python", default=os.environ.get("TENSORD_TORCH_PYTHON", "/usr/bin/python3"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seq", type=int, default=50)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--train-examples", type=int, default=1024, help="0: no train rows")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--baseline", default="", help="a second tensord binary (an older build) timed in the same rounds; "
                   "its rows are marked (baseline)")
    p.add_argument("--save", action="store_true")
    a = p.parse_args()
    if a.worker:
        return torch_worker(a)
    sys.path.insert(0, HERE)
    import common
    if a.quick:
        a.rounds, a.iterations, a.train_examples = 2, 10, min(a.train_examples, 256)
    load_start = os.getloadavg()[0]
    shapes = [(a.seq, 32), (64, 1)]
    bins = [("", a.tensord)] + ([(" (baseline)", a.baseline)] if a.baseline else [])
    res = {(lab, s): {"fwd": [], "grad": []} for lab, _ in bins for s in shapes}
    tres = {s: {"t_fwd": [], "t_fb": []} for s in shapes}
    train, t_train, notes, torch_ver = {lab: [] for lab, _ in bins}, [], [], "?"
    with tempfile.TemporaryDirectory(prefix="rnn-train-bench-") as tmp:
        models = {s: lstm_models(tmp, *s) for s in shapes}
        clf = classifier_base(tmp, a.seq, a.train_examples) if a.train_examples else None
        for rnd in range(a.rounds):
            for lab, binary in bins:
                for s in shapes:
                    paths, ffeed, gfeed = models[s]
                    for kind, feeds in (("fwd", ffeed), ("grad", gfeed)):
                        med, _, err, _ = common.tensord_bench(binary, paths[kind], feeds, iterations=a.iterations,
                                                              warmup=3, threads=a.threads, timeout=300)
                        if med is None:
                            notes.append(f"round {rnd}: tensord{lab} {kind} {s}: {err}")
                        else:
                            res[(lab, s)][kind].append(med)
                if clf:
                    ms, err = tensord_train_step_ms(binary, clf[0], clf[1], a.threads, 900)
                    if ms is None:
                        notes.append(f"round {rnd}: tensord{lab} train: {err}")
                    else:
                        train[lab].append(ms)
            cmd = [a.torch_python, os.path.abspath(__file__), "--worker", "--threads", str(a.threads), "--seq",
                   str(a.seq), "--iterations", str(a.iterations), "--train-examples", str(a.train_examples),
                   "--shapes", json.dumps(shapes)]
            try:
                cp = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
                if cp.returncode != 0:
                    notes.append(f"round {rnd}: PyTorch worker exit {cp.returncode}: {cp.stderr.strip()[-200:]}")
                    continue
                out = json.loads(cp.stdout.strip().splitlines()[-1])
            except (OSError, subprocess.TimeoutExpired, ValueError) as e:
                notes.append(f"round {rnd}: PyTorch worker: {e}")
                continue
            torch_ver = out["torch"]
            for s in shapes:
                k = out["kernels"][f"{s[0]}x{s[1]}"]
                tres[s]["t_fwd"].append(k["fwd_ms"])
                tres[s]["t_fb"].append(k["fwd_bwd_ms"])
            if "train_step_ms" in out:
                t_train.append(out["train_step_ms"])

    def m(v):
        return statistics.median(v) if v else None

    f = common.fmt
    body = ["| seq x batch | tensord forward ms | tensord backward ms (incl. recomputed forward) | backward / forward "
            "| PyTorch forward ms | PyTorch forward+backward ms | PyTorch backward ms (difference) "
            "| PyTorch backward / forward | rounds |",
            "|---|---|---|---|---|---|---|---|---|"]
    for lab, _ in bins:
        for s in shapes:
            r, t = res[(lab, s)], tres[s]
            tf, tg, pf, pfb = m(r["fwd"]), m(r["grad"]), m(t["t_fwd"]), m(t["t_fb"])
            pb = pfb - pf if pf is not None and pfb is not None else None
            ratio = tg / tf if tf and tg else None
            body.append(f"| {s[0]} x {s[1]}{lab} | {f(tf, 2)} | {f(tg, 2)} | {f(ratio, 2)} | {f(pf, 2)} "
                        f"| {f(pfb, 2)} | {f(pb, 2)} | {f(pb / pf if pb and pf else None, 2)} "
                        f"| {len(r['grad'])} / {len(t['t_fb'])} |")
    if a.train_examples:
        body += ["", "| LSTM classifier training step, batch 32 | tensord ms | PyTorch ms | tensord / PyTorch |",
                 "|---|---|---|---|"]
        for lab, _ in bins:
            tt, pt = m(train[lab]), m(t_train)
            body.append(f"| seq {a.seq}, vocab {VOCAB}, embedding {INPUT}, hidden {HID}, SGD{lab} | {f(tt, 2)} "
                        f"| {f(pt, 2)} | {f(tt / pt if tt and pt else None, 2)} |")
    intro = ("tensord's LSTM forward kernel against its gradient kernel (com.tensord LSTMGrad, which recomputes the "
             "forward before backpropagating), each a one-node model under `tensord bench` with the weights as graph "
             "inputs, and PyTorch's CPU nn.LSTM on the same shapes; then one training step of an LSTM text classifier "
             "in `tensord train` and in PyTorch. Medians over alternating rounds; see bench/rnn_train_bench.py.")
    extra = [f"PyTorch: {torch_ver} ({a.torch_python})", f"tensord binary: {os.path.relpath(a.tensord, ROOT)}"
             + (f"; baseline: {a.baseline}" if a.baseline else ""),
             f"input {INPUT}, hidden {HID}, one direction, biases, no sequence_lens"]
    common.write_result("LSTM training on the CPU: forward vs backward, tensord vs PyTorch", intro, a.threads,
                        load_start, extra, body, notes, "rnn-train-cpu.md" if a.save else None)


if __name__ == "__main__":
    sys.exit(main())
