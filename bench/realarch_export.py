#!/usr/bin/python3
"""bench/realarch_export.py - real architectures exported from PyTorch, with PyTorch's outputs as the reference.

Run with the system Python that has torch/torchvision (Debian python3-torch, python3-torchvision; `make deps`):

    /usr/bin/python3 bench/realarch_export.py --out DIR [--models a,b] [--batches 1,16] [--size 224]
                                              [--seq 128] [--layers L]

For every model it writes
    DIR/<name>/model.onnx           torch.onnx.export, opset 17, batch dimension symbolic ("N") on every input/output
    DIR/<name>/<input>_b<B>.npy     seeded inputs for every batch B (x: standard normal float32; bert_base's
                                    attention_mask: int64 0/1, each row's padding at the end)
    DIR/<name>/torch_b<B>.npy       PyTorch's float32 output on those inputs (eval mode, no_grad)
    DIR/<name>/meta.json            the settings that made the files, the input/output names and file patterns,
                                    or "error" with why the model could not be exported (then it is skipped)

Models: the torchvision definitions (weights=None, so nothing is downloaded) of
    resnet18 resnet50 mobilenet_v2 mobilenet_v3_small efficientnet_b1 densenet121 convnext_tiny regnet_y_400mf
    googlenet (aux_logits=False, init_weights=True) mnasnet1_0 swin_t
on x [N,3,size,size] -> logits [N,1000], and two transformers written here from torch.nn:
    bert_base   12 post-LN encoder layers, d=768, 12 heads, FFN 3072, GELU (erf), x [N,seq,768] float embeddings
                and attention_mask [N,seq] int64; the mask becomes HF BERT's additive (1-mask)*-10000 at
                [N,1,1,seq], added to the scores: MatMul -> Mul 1/sqrt(dh) -> Add mask -> Softmax -> MatMul
    gpt2_small  12 pre-LN decoder layers, d=768, 12 heads, FFN 3072, GPT-2's tanh GELU
                0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3))), causal mask as GPT-2 applies it (Where on a lower-
                triangular buffer, -10000 above the diagonal), final LayerNorm; x [N,seq,768] float embeddings
Both output the last hidden states [N,seq,768] (no pooler, no LM head).

Weights are torch's default initialisation under torch.manual_seed(SEED) (torchvision's own init where it has one),
then every BatchNorm's running_mean ~ N(0, 0.1), running_var ~ U(0.5, 1.5), weight ~ U(0.5, 1.5), bias ~ N(0, 0.1),
every LayerNorm's weight ~ U(0.5, 1.5), bias ~ N(0, 0.1), and ConvNeXt's layer_scale (1e-6 at init, which would make
every block's branch invisible at a 1e-4 tolerance) ~ U(0.1, 1). The transformers' Linear weights are
N(0, 1/fan_in), biases N(0, 0.02), so the attention scores have unit-ish variance and the softmax is not flat.

Cache: a model is skipped when its meta.json records the same settings and every requested batch's files exist;
a model whose settings match but that lacks some batches only computes those (the model is rebuilt from the seed
and the existing model.onnx is kept). Files are written to a temporary name and renamed, meta.json last, so an
interrupted run never leaves a half file that looks complete.
"""
import argparse
import json
import math
import os
import sys
import time
import warnings

import numpy as np
import torch
import torch.nn as nn
import torchvision

SEED = 20240801
OPSET = 17
EXPORTER_VERSION = 1  # bump when anything that changes the written files changes

VISION = ["resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b1", "densenet121",
          "convnext_tiny", "regnet_y_400mf", "googlenet", "mnasnet1_0", "swin_t"]
TRANSFORMERS = ["bert_base", "gpt2_small"]
MODELS = VISION + TRANSFORMERS


# ---- transformers ----
class SelfAttention(nn.Module):
    """Multi-head self-attention written out (not nn.MultiheadAttention) so the ONNX graph is
    MatMul(q, k^T) -> Mul 1/sqrt(dh) -> Add mask / Where causal -> Softmax -> MatMul(., v)."""

    def __init__(self, d, heads, causal=False, seq=None):
        super().__init__()
        self.h, self.dh = heads, d // heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.causal = causal
        if causal:
            self.register_buffer("bias", torch.tril(torch.ones(seq, seq, dtype=torch.bool)).view(1, 1, seq, seq))

    def split(self, t):  # [N,S,d] -> [N,h,S,dh]
        return t.view(t.size(0), t.size(1), self.h, self.dh).transpose(1, 2)

    def forward(self, x, add_mask=None):
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.dh)
        if add_mask is not None:
            s = s + add_mask
        if self.causal:
            n = s.size(-1)
            s = torch.where(self.bias[:, :, :n, :n], s, torch.tensor(-10000.0, dtype=s.dtype))
        p = torch.softmax(s, dim=-1)
        c = torch.matmul(p, v).transpose(1, 2)
        return self.o(c.reshape(c.size(0), c.size(1), self.h * self.dh))


class BertLayer(nn.Module):
    def __init__(self, d, heads, ffn):
        super().__init__()
        self.attn = SelfAttention(d, heads)
        self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-12), nn.LayerNorm(d, eps=1e-12)
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
        self.act = nn.GELU()

    def forward(self, x, add_mask):
        x = self.ln1(x + self.attn(x, add_mask))
        return self.ln2(x + self.fc2(self.act(self.fc1(x))))


class Bert(nn.Module):
    def __init__(self, layers, d=768, heads=12, ffn=3072):
        super().__init__()
        self.layers = nn.ModuleList(BertLayer(d, heads, ffn) for _ in range(layers))

    def forward(self, x, attention_mask):
        m = attention_mask[:, None, None, :].to(x.dtype)  # HF BERT's get_extended_attention_mask
        m = (1.0 - m) * -10000.0
        for layer in self.layers:
            x = layer(x, m)
        return x


def gelu_gpt2(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class GPT2Block(nn.Module):
    def __init__(self, d, heads, ffn, seq):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-5), nn.LayerNorm(d, eps=1e-5)
        self.attn = SelfAttention(d, heads, causal=True, seq=seq)
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(gelu_gpt2(self.fc1(self.ln2(x))))


class GPT2(nn.Module):
    def __init__(self, layers, seq, d=768, heads=12, ffn=3072):
        super().__init__()
        self.blocks = nn.ModuleList(GPT2Block(d, heads, ffn, seq) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, eps=1e-5)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.ln_f(x)


# ---- building ----
def settings_for(name, a):
    s = {"model": name, "seed": SEED, "opset": OPSET, "exporter": EXPORTER_VERSION,
         "torch": torch.__version__, "torchvision": torchvision.__version__}
    if name in TRANSFORMERS:
        s.update(seq=a.seq, layers=a.layers if a.layers is not None else 12, d=768, heads=12, ffn=3072)
    else:
        s.update(size=a.size)
    return s


def randomize(model, g):
    """Randomised normalisation statistics/affines (see the file comment); `g` is a seeded torch.Generator."""
    def u(t, lo, hi):
        t.copy_(torch.rand(t.shape, generator=g) * (hi - lo) + lo)

    def n(t, std):
        t.copy_(torch.randn(t.shape, generator=g) * std)

    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                n(m.running_mean, 0.1)
                u(m.running_var, 0.5, 1.5)
                if m.affine:
                    u(m.weight, 0.5, 1.5)
                    n(m.bias, 0.1)
            elif isinstance(m, nn.LayerNorm) and m.elementwise_affine:
                u(m.weight, 0.5, 1.5)
                n(m.bias, 0.1)
            elif isinstance(m, nn.Linear) and isinstance(model, (Bert, GPT2)):
                n(m.weight, 1.0 / math.sqrt(m.in_features))
                n(m.bias, 0.02)
            if hasattr(m, "layer_scale") and isinstance(m.layer_scale, torch.Tensor):  # ConvNeXt CNBlock
                u(m.layer_scale, 0.1, 1.0)


def build(name, s):
    torch.manual_seed(SEED)
    if name == "bert_base":
        m = Bert(s["layers"])
    elif name == "gpt2_small":
        m = GPT2(s["layers"], s["seq"])
    elif name == "googlenet":
        m = torchvision.models.googlenet(weights=None, aux_logits=False, init_weights=True)
    else:
        m = getattr(torchvision.models, name)(weights=None)
    randomize(m, torch.Generator().manual_seed(SEED + 1))
    return m.eval()


def io_spec(name):
    """(input names, output names) of the exported graph."""
    if name == "bert_base":
        return ["x", "attention_mask"], ["y"]
    return ["x"], ["y"]


def make_inputs(name, s, batch):
    """{input name: np.ndarray}, seeded by the batch size so every batch has its own inputs."""
    rng = np.random.default_rng(1000 + batch)
    if name in TRANSFORMERS:
        x = rng.standard_normal((batch, s["seq"], 768)).astype(np.float32)
    else:
        x = rng.standard_normal((batch, 3, s["size"], s["size"])).astype(np.float32)
    feeds = {"x": x}
    if name == "bert_base":
        seq = s["seq"]
        lens = rng.integers(max(1, seq // 4), seq + 1, size=batch)
        lens[0] = seq  # one unpadded row
        feeds["attention_mask"] = (np.arange(seq)[None, :] < lens[:, None]).astype(np.int64)
    return feeds


def atomic_save_npy(path, arr):
    tmp = path + ".tmp.npy"
    np.save(tmp, arr)
    os.replace(tmp, path)


def load_meta(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def export_one(name, a):
    """Exports one model (or completes its missing batches). Returns a one-line status."""
    s = settings_for(name, a)
    mdir = os.path.join(a.out, name)
    os.makedirs(mdir, exist_ok=True)
    meta_path = os.path.join(mdir, "meta.json")
    model_path = os.path.join(mdir, "model.onnx")
    ins, outs = io_spec(name)
    old = load_meta(meta_path)
    same = old is not None and old.get("settings") == s
    if same and "error" in old:
        return f"skipped (cached export error: {old['error']})"
    have = set(old.get("batches", [])) if same and os.path.isfile(model_path) else set()
    have = {b for b in have if all(os.path.isfile(os.path.join(mdir, f"{i}_b{b}.npy")) for i in ins)
            and os.path.isfile(os.path.join(mdir, f"torch_b{b}.npy"))}
    todo = [b for b in a.batches if b not in have]
    if not todo and same and os.path.isfile(model_path):
        return "cached"

    t0 = time.perf_counter()
    model = build(name, s)
    meta = {"settings": s, "inputs": ins, "outputs": outs, "input_file": "{input}_b{batch}.npy",
            "reference_file": "torch_b{batch}.npy", "batches": sorted(have)}
    if not (same and os.path.isfile(model_path)):
        example = make_inputs(name, s, 2)
        args = tuple(torch.from_numpy(example[i]) for i in ins)
        dyn = {n: {0: "N"} for n in ins + outs}
        tmp = model_path + ".tmp"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(model, args, tmp, opset_version=OPSET, input_names=ins, output_names=outs,
                                  dynamic_axes=dyn, do_constant_folding=True)
        except Exception as e:  # the exporter's own limitation: record it and skip the model
            msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
            meta["error"] = f"torch {torch.__version__} onnx export failed: {msg}"
            if os.path.exists(tmp):
                os.remove(tmp)
            with open(meta_path, "w") as f:
                json.dump(meta, f, indent=1)
            return "skipped (" + meta["error"] + ")"
        os.replace(tmp, model_path)
        meta["batches"] = []
        todo = list(a.batches)
    with torch.no_grad():
        for b in todo:
            feeds = make_inputs(name, s, b)
            y = model(*(torch.from_numpy(feeds[i]) for i in ins))
            for i in ins:
                atomic_save_npy(os.path.join(mdir, f"{i}_b{b}.npy"), feeds[i])
            atomic_save_npy(os.path.join(mdir, f"torch_b{b}.npy"), y.detach().numpy().astype(np.float32))
            meta["batches"] = sorted(set(meta["batches"]) | {b})
    meta["export_s"] = round(time.perf_counter() - t0, 2)
    tmp = meta_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(tmp, meta_path)
    return f"exported in {meta['export_s']:.1f} s (batches {','.join(map(str, todo))})"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of: " + ",".join(MODELS))
    p.add_argument("--batches", default="1,16", help="comma-separated batch sizes (default 1,16)")
    p.add_argument("--size", type=int, default=224, help="image side for the vision models (default 224)")
    p.add_argument("--seq", type=int, default=128, help="sequence length for the transformers (default 128)")
    p.add_argument("--layers", type=int, default=None, help="layers of the transformers (default 12)")
    p.add_argument("--threads", type=int, default=2, help="torch threads for the reference forward (default 2)")
    p.add_argument("--out", required=True, help="output directory")
    a = p.parse_args()
    a.models = [m.strip() for m in a.models.split(",") if m.strip()]
    bad = [m for m in a.models if m not in MODELS]
    if bad:
        p.error(f"unknown model(s) {','.join(bad)}; choose from {','.join(MODELS)}")
    a.batches = sorted({int(b) for b in a.batches.split(",") if b.strip()})
    torch.set_num_threads(a.threads)
    os.makedirs(a.out, exist_ok=True)
    failed = False
    for name in a.models:
        try:
            st = export_one(name, a)
        except Exception as e:  # a bug here, not an exporter limitation: report, continue, exit nonzero
            st, failed = f"FAILED: {type(e).__name__}: {e}", True
        print(f"{name}: {st}", file=sys.stderr, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
