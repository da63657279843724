#!/usr/bin/python3
"""bench/train_realarch_models.py - the PyTorch side of bench/train_realarch_bench.py (issue 17): builds each model,
exports it for training, and trains it. Runs in the system Python that has torch/torchvision (Debian python3-torch,
python3-torchvision; `make deps`).

    /usr/bin/python3 bench/train_realarch_models.py export NAME DIR
        DIR/1/model.onnx   torch.onnx.export(training=TrainingMode.TRAINING, opset 17): BatchNormalization stays a
                           node in training mode (nothing folded into the convolutions), batch dimension "N"
        DIR/state.pt       the same weights as a state_dict, for the PyTorch side
        DIR/spec.json      inputs (name, shape without batch, dtype, token range), classes, the head's parameter
                           prefixes, the backbone's freeze prefixes (parameter names as both sides spell them)
    /usr/bin/python3 bench/train_realarch_models.py train NAME DIR DATA.npz BATCH THREADS EPOCHS MODE
        MODE full | head. Adam (lr 1e-3, eps 1e-7 as Keras and tensord), cross-entropy on logits, shuffled batches,
        EPOCHS epochs, each timed (examples/s of the last one, and of all of them). head: every backbone parameter requires_grad=False and every BatchNorm in
        the backbone in eval mode (statistics kept, Keras' trainable=False). Prints one JSON line: examples/s (last epoch, whole job), the
        last epoch's mean loss, peak RSS (MiB), the torch version.
    /usr/bin/python3 bench/train_realarch_models.py losses NAME DIR DATA.npz BATCH THREADS OPT float32|float64
        the loss-agreement check: 10 full fine-tuning steps in file order, OPT sgd:LR:MOMENTUM or adam:LR; prints
        the 10 losses.
    /usr/bin/python3 bench/train_realarch_models.py grads NAME DIR DATA.npz BATCH THREADS OUT.npz
        the gradient check: every parameter's gradient at step 0 in float32 and float64, and the starting weights.

Models (weights=None; seeded; dropout and stochastic depth 0 so both sides compute the same function):
    resnet18         torchvision, 10 classes, x [N,3,64,64]
    mobilenet_v2     torchvision, 10 classes, x [N,3,64,64]
    efficientnet_b0  torchvision, 10 classes, x [N,3,96,96]
    bert_base        BERT-base-shaped encoder (12 post-LN layers, d 768, 12 heads, FFN 3072, erf GELU, the layers
                     of bench/realarch_export.py) on tokens [N,128] (vocabulary 30522) + position embeddings + LN,
                     HF's additive attention mask from attention_mask [N,128], pooler (first token, Dense + tanh),
                     classifier Dense(2)
    vit_tiny         torchvision VisionTransformer: 224x224, patch 16, 12 layers, d 192, 3 heads, MLP 768, 10 classes
    resnet_small     the zoo's CIFAR ResNet (tensord init --arch resnet-small) written in torch, x [N,3,32,32]
    transformer_enc  the zoo's BERT-style transformer-encoder (2 layers, d 128) written in torch, tokens [N,128]
"""
import json
import math
import os
import resource
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from realarch_export import BertLayer  # noqa: E402

SEED = 20261202


# the zoo's resnet-small and transformer-encoder, written in torch to the same definitions
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


class BertClassifier(nn.Module):
    def __init__(self, vocab=30522, seq=128, layers=12, d=768, heads=12, ffn=3072, classes=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.ln = nn.LayerNorm(d, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(d, heads, ffn) for _ in range(layers))
        self.pooler = nn.Linear(d, d)
        self.classifier = nn.Linear(d, classes)

    def forward(self, tokens, attention_mask):
        x = self.ln(self.emb(tokens) + self.pos)
        m = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            x = layer(x, m)
        return self.classifier(torch.tanh(self.pooler(x[:, 0])))


def efficientnet_b0():  # torchvision 0.14's efficientnet_b0() fixes dropout at 0.2
    from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf
    setting, last = _efficientnet_conf("efficientnet_b0", width_mult=1.0, depth_mult=1.0)
    return EfficientNet(setting, dropout=0.0, stochastic_depth_prob=0.0, num_classes=10, last_channel=last)


# name: (constructor, inputs [(name, shape, dtype, token range)], classes, head prefixes)
def specs():
    tv = torchvision.models
    img = lambda s: [("x", [3, s, s], "float32", 0)]  # noqa: E731
    tok = [("tokens", [128], "int64", 30522), ("attention_mask", [128], "int64", 2)]
    return {
        "resnet18": (lambda: tv.resnet18(num_classes=10), img(64), 10, ["fc."]),
        "mobilenet_v2": (lambda: tv.mobilenet_v2(num_classes=10, dropout=0.0), img(64), 10, ["classifier."]),
        "efficientnet_b0": (efficientnet_b0, img(96), 10, ["classifier."]),
        "bert_base": (BertClassifier, tok, 2, ["pooler.", "classifier."]),
        "vit_tiny": (lambda: tv.VisionTransformer(image_size=224, patch_size=16, num_layers=12, num_heads=3,
                                                  hidden_dim=192, mlp_dim=768, num_classes=10), img(224), 10,
                     ["heads."]),
        "resnet_small": (ResNetSmall, [("x", [3, 32, 32], "float32", 0)], 10, ["head."]),
        "transformer_enc": (Encoder, [("t", [128], "int64", 1000)], 2, ["head."]),
    }


def build(name):
    torch.manual_seed(SEED)
    return specs()[name][0]()


def backbone_prefixes(model, head):
    """Top-level module / parameter names that are not the head: what --freeze gets for head-only training."""
    tops = sorted({k.split(".")[0] + "." if "." in k else k for k in model.state_dict()})
    return [t for t in tops if not any(t.startswith(h) for h in head)]


def export(name, out):
    ctor, inputs, classes, head = specs()[name]
    model = build(name)
    os.makedirs(os.path.join(out, "1"), exist_ok=True)
    args = tuple(torch.zeros([2] + shape, dtype=getattr(torch, dt)) + (1 if dt == "int64" and rng == 2 else 0)
                 for _, shape, dt, rng in inputs)
    names = [i[0] for i in inputs]
    dyn = {n: {0: "N"} for n in names + ["logits"]}
    tmp = os.path.join(out, "1", "model.onnx.tmp")
    model.train()
    torch.onnx.export(model, args, tmp, input_names=names, output_names=["logits"], dynamic_axes=dyn,
                      opset_version=17, training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    os.replace(tmp, os.path.join(out, "1", "model.onnx"))
    torch.save(model.state_dict(), os.path.join(out, "state.pt"))
    spec = {"name": name, "inputs": [{"name": n, "shape": s, "dtype": d, "range": r} for n, s, d, r in inputs],
            "classes": classes, "head": head, "freeze": backbone_prefixes(model, head),
            "params": sum(p.numel() for p in model.parameters()), "torch": torch.__version__}
    with open(os.path.join(out, "spec.json"), "w") as f:
        json.dump(spec, f, indent=1)


def set_head_only(model, head):
    for k, p in model.named_parameters():
        p.requires_grad_(any(k.startswith(h) for h in head))
    for k, m in model.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and not any(k.startswith(h) for h in head):
            m.eval()


def load(name, out, dtype=torch.float32):
    spec = json.load(open(os.path.join(out, "spec.json")))
    model = build(name)
    model.load_state_dict(torch.load(os.path.join(out, "state.pt")))
    model.train()
    return spec, model.to(dtype)


def step_fn(model, opt, xs, y):
    def step(idx):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(*[x[idx] for x in xs]), y[idx])
        loss.backward()
        opt.step()
        return loss.item()
    return step


def inputs(spec, data, dtype):
    d = np.load(data)
    xs = [torch.from_numpy(d[i["name"]]) for i in spec["inputs"]]
    return [x.to(dtype) if x.is_floating_point() else x for x in xs], torch.from_numpy(d["label"])


def losses(name, out, data, batch, threads, opt_name, dtype_name):
    """10 steps in file order from the saved weights: full fine-tuning with OPT = sgd:LR:MOMENTUM or adam:LR
    (eps 1e-7), in float32 or float64 (the reference for how far float32 rounding alone moves the losses)."""
    torch.set_num_threads(threads)
    dtype = getattr(torch, dtype_name)
    spec, model = load(name, out, dtype)
    kind, *hp = opt_name.split(":")
    opt = (torch.optim.SGD(model.parameters(), lr=float(hp[0]), momentum=float(hp[1])) if kind == "sgd"
           else torch.optim.Adam(model.parameters(), lr=float(hp[0]), eps=1e-7))
    xs, y = inputs(spec, data, dtype)
    step = step_fn(model, opt, xs, y)
    print(json.dumps({"losses": [step(torch.arange(i * batch, (i + 1) * batch)) for i in range(10)]}))


def grads(name, out, data, batch, threads, dest):
    """The gradient of every parameter at step 0 (the first BATCH rows, training mode) in float32 and float64, and
    the starting float32 weights, into DEST (npz keys f32/NAME, f64/NAME, w/NAME)."""
    torch.set_num_threads(threads)
    res = {}
    for dtype, key in ((torch.float32, "f32/"), (torch.float64, "f64/")):
        spec, model = load(name, out, dtype)
        xs, y = inputs(spec, data, dtype)
        F.cross_entropy(model(*[x[:batch] for x in xs]), y[:batch]).backward()
        for n, p in model.named_parameters():
            res[key + n] = p.grad.detach().double().numpy()
            if dtype == torch.float32:
                res["w/" + n] = p.detach().numpy().copy()
    np.savez(dest, **res)


def train(name, out, data, batch, threads, epochs, mode):
    torch.set_num_threads(threads)
    spec, model = load(name, out)
    if mode == "head":
        set_head_only(model, spec["head"])
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3, eps=1e-7)
    xs, y = inputs(spec, data, torch.float32)
    step, n = step_fn(model, opt, xs, y), len(y)
    g = torch.Generator().manual_seed(0)
    eps, loss_mean, job = 0.0, 0.0, 0.0
    for _ in range(epochs):
        perm = torch.randperm(n, generator=g)
        t0, total = time.perf_counter(), 0.0
        for i in range(0, n, batch):
            idx = perm[i:i + batch]
            total += step(idx) * len(idx)
        dt = time.perf_counter() - t0
        eps, loss_mean, job = n / dt, total / n, job + dt
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"eps": eps, "job_eps": epochs * n / job, "loss": loss_mean, "rss_mib": rss,
                      "torch": torch.__version__}))


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "export":
        return export(sys.argv[2], sys.argv[3])
    a = sys.argv
    if len(a) == 9 and a[1] == "train":
        return train(a[2], a[3], a[4], int(a[5]), int(a[6]), int(a[7]), a[8])
    if len(a) == 9 and a[1] == "losses":
        return losses(a[2], a[3], a[4], int(a[5]), int(a[6]), a[7], a[8])
    if len(a) == 8 and a[1] == "grads":
        return grads(a[2], a[3], a[4], int(a[5]), int(a[6]), a[7])
    sys.exit(__doc__)


if __name__ == "__main__":
    main()
