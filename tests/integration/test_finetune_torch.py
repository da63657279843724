"""Fine-tuning models exported from PyTorch in training mode (issue 17): `tensord train` against PyTorch itself.

The models are written here in torch and exported with torch.onnx's TrainingMode.TRAINING (BatchNormalization a node
with training_mode=1 and its statistics as extra outputs, Linear as MatMul over a Transpose of the weight, nothing
folded), in the system Python that has torch (make deps installs python3-torchvision); the same weights go to the
torch side as a state_dict.

- The first 10 steps' losses (SGD, file order: --shuffle false) agree with PyTorch's within 1e-4 relative, for a CNN
  with BatchNorm, a depthwise convolution, max pooling, SiLU (exported as x * Sigmoid(x), trained as one node) and a
  residual add, and for nn.TransformerEncoderLayer over an embedding (every Linear trained through its Transpose).
- Head only (--freeze on the backbone): the frozen BatchNorms run on their running statistics and keep them (Keras'
  trainable=False; PyTorch's eval mode for those modules), the losses agree with PyTorch's the same way, and the
  backbone is bit-identical afterwards.
- The version written from a training-mode export serves: its BatchNormalizations are in inference form (one output,
  no training_mode=1), and onnxruntime agrees with `tensord predict` on it.
- metrics.json records the order setting and the process's peak resident memory.
"""
import json
import os
import subprocess

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

TIMEOUT = 300
TORCH_PYTHON = os.environ.get("TENSORD_TORCH_PYTHON", "/usr/bin/python3")

MODELS = r'''
import json, sys, torch, torch.nn as nn, torch.nn.functional as F

class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.dw = nn.Sequential(nn.Conv2d(16, 16, 3, 1, 1, groups=16, bias=False), nn.BatchNorm2d(16), nn.ReLU6())
        self.pw = nn.Sequential(nn.Conv2d(16, 32, 1, bias=False), nn.BatchNorm2d(32))
        self.short = nn.Sequential(nn.Conv2d(16, 32, 1, bias=False), nn.BatchNorm2d(32), nn.SiLU())
        self.head = nn.Linear(32, 5)
    def forward(self, x):
        x = self.pool(self.stem(x))
        x = F.relu(self.pw(self.dw(x)) + self.short(x))
        return self.head(x.mean((2, 3)))

class Enc(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(50, 32)
        self.layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, activation="gelu", batch_first=True)
        self.head = nn.Linear(32, 3)
    def forward(self, t):
        return self.head(self.layer(self.tok(t)).mean(1))

def build(name):
    torch.manual_seed(7)
    return CNN() if name == "cnn" else Enc()

def example(name):
    return torch.randn(2, 3, 16, 16) if name == "cnn" else torch.randint(0, 50, (2, 12))

cmd, name, out = sys.argv[1], sys.argv[2], sys.argv[3]
if cmd == "export":
    m = build(name).train()
    iname = "x" if name == "cnn" else "t"
    torch.onnx.export(m, (example(name),), out + "/model.onnx", input_names=[iname], output_names=["logits"],
                      dynamic_axes={iname: {0: "N"}, "logits": {0: "N"}}, opset_version=17,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    torch.save(m.state_dict(), out + "/state.pt")
else:  # losses NAME DIR DATA.npz HEAD THREADS: 10 SGD steps of 8 in file order
    import numpy as np
    data, head, threads = sys.argv[4], sys.argv[5] == "1", int(sys.argv[6])
    torch.set_num_threads(threads)
    m = build(name)
    m.load_state_dict(torch.load(out + "/state.pt"))
    m.train()
    if head:
        for k, p in m.named_parameters():
            p.requires_grad_(k.startswith("head."))
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.eval()
    opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=float(sys.argv[7]))
    d = np.load(data)
    x = torch.from_numpy(d["x" if name == "cnn" else "t"])
    y = torch.from_numpy(d["label"])
    losses = []
    for i in range(10):
        opt.zero_grad()
        loss = F.cross_entropy(m(x[8 * i:8 * i + 8]), y[8 * i:8 * i + 8])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    print(json.dumps(losses))
'''


def torch_run(tmp_path, *args):
    script = tmp_path / "models.py"
    script.write_text(MODELS)
    cp = subprocess.run([TORCH_PYTHON, str(script), *map(str, args)], capture_output=True, text=True, timeout=TIMEOUT)
    assert cp.returncode == 0, cp.stderr[-3000:]
    return cp.stdout


@pytest.fixture(scope="module", autouse=True)
def have_torch():
    cp = subprocess.run([TORCH_PYTHON, "-c", "import torch"], capture_output=True, text=True)
    if cp.returncode != 0:
        pytest.fail(f"{TORCH_PYTHON} has no torch (make deps installs python3-torchvision)")


def exported(tmp_path, name):
    base = tmp_path / name
    (base / "1").mkdir(parents=True)
    torch_run(tmp_path, "export", name, base / "1")
    (tmp_path / f"{name}-state").mkdir()
    os.replace(base / "1" / "state.pt", tmp_path / f"{name}-state" / "state.pt")
    return base


def data(tmp_path, name, n=80):
    rng = np.random.default_rng(3)
    if name == "cnn":
        cols = {"x": rng.standard_normal((n, 3, 16, 16), dtype=np.float32), "label": rng.integers(0, 5, n)}
    else:
        cols = {"t": rng.integers(0, 50, (n, 12)), "label": rng.integers(0, 3, n)}
    path = tmp_path / f"{name}.npz"
    np.savez(path, **cols)
    return path


def train(tensord_bin, base, npz, lr, *extra):
    cp = subprocess.run([tensord_bin, "train", "--model-base-path", str(base), "--base-version", "1", "--data",
                         str(npz), "--epochs", "1", "--batch-size", "8", "--optimizer", "sgd", "--lr", str(lr),
                         "--loss", "sparse_categorical_crossentropy", "--from-logits", "true", "--shuffle", "false",
                         "--max-steps", "10", "--threads", "2", "--no-progress", *extra],
                        capture_output=True, text=True, timeout=TIMEOUT)
    assert cp.returncode == 0, cp.stderr[-3000:]
    return json.loads((base / "2" / "metrics.json").read_text())


def torch_losses(tmp_path, name, npz, head, lr):
    return json.loads(torch_run(tmp_path, "losses", name, tmp_path / f"{name}-state", npz, int(head), 2, lr))


def inits(path):
    return {i.name: numpy_helper.to_array(i) for i in onnx.load(str(path)).graph.initializer}


def max_rel(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


@pytest.mark.parametrize("name", ["cnn", "encoder"])
def test_first_ten_losses_agree_with_pytorch(tensord_bin, tmp_path, name):
    tname = "cnn" if name == "cnn" else "enc"
    base = exported(tmp_path, tname)
    npz = data(tmp_path, tname)
    m = train(tensord_bin, base, npz, 0.01)
    ours = [s["loss"] for s in m["steps"]]
    theirs = torch_losses(tmp_path, tname, npz, False, 0.01)
    assert len(ours) == 10, ours
    rel = max_rel(ours, theirs)
    print(f"{name}: 10 losses {ours[0]:.5f} .. {ours[-1]:.5f}, max relative difference to PyTorch {rel:.1e}")
    assert rel <= 1e-4, f"tensord {ours}\nPyTorch {theirs}"
    assert ours[-1] != ours[0]
    # every parameter moved (a weight read through a Transpose included), none was left behind
    a, b = inits(base / "1" / "model.onnx"), inits(base / "2" / "model.onnx")
    moved = [k for k in a if a[k].dtype == np.float32 and "running" not in k and not np.array_equal(a[k], b[k])]
    trainable = [k for k in a if a[k].dtype == np.float32 and "running" not in k and a[k].ndim > 0]
    assert sorted(moved) == sorted(trainable), set(trainable) - set(moved)
    assert m["settings"]["shuffle"] is False and m["peak_rss_mib"] > 10, m


def test_head_only_keeps_frozen_batchnorm_statistics(tensord_bin, tmp_path):
    base = exported(tmp_path, "cnn")
    npz = data(tmp_path, "cnn")
    freeze = [a for p in ("stem.", "dw.", "pw.", "short.") for a in ("--freeze", p)]
    m = train(tensord_bin, base, npz, 0.05, *freeze)
    ours = [s["loss"] for s in m["steps"]]
    theirs = torch_losses(tmp_path, "cnn", npz, True, 0.05)
    rel = max_rel(ours, theirs)
    print(f"head only: 10 losses {ours[0]:.5f} .. {ours[-1]:.5f}, max relative difference to PyTorch {rel:.1e}")
    assert rel <= 1e-4, f"tensord {ours}\nPyTorch {theirs}"
    assert m["frozen_features"]["cached"] is True, m["frozen_features"]  # one epoch: the backbone ran once
    a, b = inits(base / "1" / "model.onnx"), inits(base / "2" / "model.onnx")
    for k in a:
        if k.startswith("head."):
            assert not np.array_equal(a[k], b[k]), k
        else:  # weights and running statistics alike
            assert np.array_equal(a[k], b[k]), f"{k} changed although frozen"


def test_the_version_written_from_a_training_export_serves(tensord_bin, tmp_path):
    base = exported(tmp_path, "cnn")
    npz = data(tmp_path, "cnn")
    train(tensord_bin, base, npz, 0.01)
    m = onnx.load(str(base / "2" / "model.onnx"))
    bns = [n for n in m.graph.node if n.op_type == "BatchNormalization"]
    assert len(bns) == 4
    for n in bns:
        assert len(n.output) == 1 and all(a.name != "training_mode" or a.i == 0 for a in n.attribute), n
    x = np.random.default_rng(5).standard_normal((6, 3, 16, 16), dtype=np.float32)
    want = ort.InferenceSession(str(base / "2" / "model.onnx")).run(None, {"x": x})[0]
    np.save(tmp_path / "x.npy", x)
    cp = subprocess.run([tensord_bin, "predict", "--model", str(base / "2"), "--input", f"x={tmp_path / 'x.npy'}",
                         "--output-dir", str(tmp_path / "out")], capture_output=True, text=True, timeout=TIMEOUT)
    assert cp.returncode == 0, cp.stderr
    got = np.load(tmp_path / "out" / "logits.npy")
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    # inference form: one row alone gives the same logits as inside the batch (no batch statistics)
    one = ort.InferenceSession(str(base / "2" / "model.onnx")).run(None, {"x": x[:1]})[0]
    assert np.abs(one - want[:1]).max() <= 1e-5 * np.abs(want).max()
