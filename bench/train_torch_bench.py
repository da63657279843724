#!/usr/bin/env python3
"""Training throughput of the zoo's deeper models: `tensord train` vs PyTorch (Debian's python3-torch) on CPU, the
same architecture on both sides, measured in the same run, alternating (issue 17's measurement).

Models (tensord `init --arch`, defaults; PyTorch written here to the same definitions, PyTorch's default init):
  resnet-small         CIFAR ResNet v1: Conv3x3(16)+BN+ReLU, 3 stages x 2 basic blocks at 16/32/64 channels (stride 2
                       and a 1x1 conv+BN shortcut entering stages 2 and 3), GlobalAveragePool, Dense(10); BN eps 1e-3;
                       input [N,3,32,32] random, random labels
  transformer-encoder  BERT-style post-LN: token + position embeddings, LN, 2 layers of 4-head self-attention (d 128)
                       and a GELU FFN (512), mean over positions, Dense(2); tokens [N,128] from a vocabulary of 1000
Both: Adam lr 1e-3, sparse categorical cross-entropy, batch --batch, --threads threads (tensord --threads;
torch.set_num_threads), --examples examples, 2 epochs, the LAST epoch's examples/s (tensord's metrics.json: time inside
training steps; PyTorch: the epoch's wall time over its steps). --rounds alternating rounds; medians.
ratio = tensord / PyTorch (> 1: tensord faster).

  .venv/bin/python bench/train_torch_bench.py [--examples 2048] [--batch 64] [--rounds 2] [--threads 2] [--save]
The PyTorch side runs in the system Python (--torch-python, default /usr/bin/python3), which has torch: make deps
installs python3-torchvision, which brings it. This file is also that side's worker (--worker).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if "--worker" in sys.argv:  # the PyTorch side, in the system Python
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
else:
    sys.path.insert(0, HERE)
    from common import write_result  # noqa: E402
    nn = type("nn", (), {"Module": object})  # the model classes below are only instantiated in the worker


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout, eps=1e-3)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout, eps=1e-3)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout, eps=1e-3))

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return F.relu(y + (self.short(x) if self.short is not None else x))


class ResNetSmall(nn.Module):
    def __init__(self, width=16, blocks=2, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width, eps=1e-3), nn.ReLU())
        layers, cin = [], width
        for s, w in enumerate((width, 2 * width, 4 * width)):
            for b in range(blocks):
                layers.append(Block(cin, w, 2 if (s > 0 and b == 0) else 1))
                cin = w
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(cin, classes)

    def forward(self, x):
        return self.head(self.layers(self.stem(x)).mean((2, 3)))


class Encoder(nn.Module):
    def __init__(self, vocab=1000, seq=128, d=128, heads=4, layers=2, ffn=512, classes=2):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.ln = nn.LayerNorm(d)
        self.layers = nn.ModuleList([nn.TransformerEncoderLayer(d, heads, ffn, dropout=0.0, activation="gelu",
                                                                batch_first=True, norm_first=False)
                                     for _ in range(layers)])
        self.head = nn.Linear(d, classes)

    def forward(self, t):
        x = self.ln(self.tok(t) + self.pos)
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(1))


def data_for(arch, n, tmp):
    rng = np.random.default_rng(0)
    path = os.path.join(tmp, f"{arch}.npz")
    if arch == "resnet-small":
        x = rng.random((n, 3, 32, 32), dtype=np.float32)
        y = rng.integers(0, 10, n).astype(np.int64)
        np.savez(path, x=x, label=y)
    else:
        x = rng.integers(0, 1000, (n, 128)).astype(np.int64)
        y = (x[:, :8].sum(1) % 2).astype(np.int64)
        np.savez(path, tokens=x, label=y)
    return path, x, y


def run_tensord(a, base, data, version):
    cmd = [a.bin, "train", "--model-base-path", base, "--base-version", "1", "--new-version", str(version), "--data",
           data, "--epochs", "2", "--batch-size", str(a.batch), "--optimizer", "adam", "--lr", "0.001", "--loss",
           "sparse_categorical_crossentropy", "--seed", "0", "--threads", str(a.threads), "--no-progress"]
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if cp.returncode != 0:
        sys.exit(f"tensord train failed:\n{cp.stderr[-3000:]}")
    e = json.load(open(os.path.join(base, str(version), "metrics.json")))["epochs"][-1]
    return e["examples_per_sec"], e["loss"]


def torch_worker(arch, npz, batch, threads):
    torch.set_num_threads(threads)
    d = np.load(npz)
    x = d["x"] if arch == "resnet-small" else d["tokens"]
    eps, loss = run_torch(batch, arch, x, d["label"])
    print(json.dumps({"eps": eps, "loss": loss, "torch": torch.__version__}))


def run_torch_side(a, arch, data):
    cp = subprocess.run([a.torch_python, os.path.abspath(__file__), "--worker", arch, data, str(a.batch), str(a.threads)],
                        capture_output=True, text=True, timeout=3600)
    if cp.returncode != 0:
        sys.exit(f"PyTorch side failed:\n{cp.stderr[-3000:]}")
    return json.loads(cp.stdout.strip().splitlines()[-1])


def run_torch(batch, arch, x, y):
    torch.manual_seed(0)
    model = ResNetSmall() if arch == "resnet-small" else Encoder()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    model.train()
    eps, loss_sum = 0.0, 0.0
    for epoch in range(2):
        perm = torch.randperm(len(xt))
        t0, loss_sum, seen = time.perf_counter(), 0.0, 0
        for i in range(0, len(xt), batch):
            idx = perm[i:i + batch]
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
            loss_sum += loss.item() * len(idx)
            seen += len(idx)
        eps = seen / (time.perf_counter() - t0)
    return eps, loss_sum / len(xt)


def main():
    if len(sys.argv) == 6 and sys.argv[1] == "--worker":
        return torch_worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples", type=int, default=2048)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--bin", default=os.environ.get("TENSORD_BIN", os.path.join(ROOT, "build", "tensord")))
    p.add_argument("--torch-python", default="/usr/bin/python3")
    p.add_argument("--save", action="store_true", help="write bench/results/training-torch-cpu.md")
    a = p.parse_args()
    tv = "?"
    load0 = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="torch-train-") as tmp:
        for arch in ("resnet-small", "transformer-encoder"):
            data, _, _ = data_for(arch, a.examples, tmp)
            base = os.path.join(tmp, arch)
            subprocess.run([a.bin, "init", "--arch", arch, "--seed", "0", "--out", os.path.join(base, "1")],
                           check=True, capture_output=True)
            td, pt, v = [], [], 2
            for r in range(a.rounds):
                e, ltd = run_tensord(a, base, data, v)
                v += 1
                td.append(e)
                w = run_torch_side(a, arch, data)
                f, lpt, tv = w["eps"], w["loss"], w["torch"]
                pt.append(f)
                print(f"{arch} round {r + 1}: tensord {e:.0f}, PyTorch {f:.0f} examples/s "
                      f"(last-epoch loss {ltd:.4f} / {lpt:.4f})", flush=True)
            mt, mp = statistics.median(td), statistics.median(pt)
            rows.append(f"| {arch} | {a.batch} | {min(td):.0f}–{max(td):.0f} | {min(pt):.0f}–{max(pt):.0f} | "
                        f"**{mt / mp:.2f}×** |")
    write_result("Training throughput: tensord vs PyTorch (CPU)",
                 "Generated by `.venv/bin/python bench/train_torch_bench.py --save` (see its docstring). Last epoch's "
                 "examples/s of 2, alternating rounds; ratio of the medians (tensord / PyTorch).", a.threads, load0,
                 [f"torch: {tv} ({a.torch_python}), threads {a.threads}"],
                 ["| model | batch | tensord examples/s | PyTorch examples/s | ratio |", "|---|---|---|---|---|"] + rows,
                 [], "training-torch-cpu.md" if a.save else None)

if __name__ == "__main__":
    main()
