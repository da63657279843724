#!/usr/bin/env python3
"""Fine-tuning real architectures on CPU (issue 17): `tensord train` against PyTorch and Keras/TensorFlow-CPU, the
same architectures, measured in the same run, alternating.

    .venv/bin/python bench/train_realarch_bench.py [--models a,b] [--rounds 2] [--threads 2] [--no-keras] [--save]
    .venv/bin/python bench/train_realarch_bench.py --numerics [--models a,b] [--save]   (the numerical checks only)

Models (bench/train_realarch_models.py builds and exports them from torch/torchvision; nothing is downloaded):
torchvision ResNet-18 and MobileNetV2 at 64x64, EfficientNet-B0 at 96x96, the BERT-base-shaped encoder at sequence
128 (batch 16), ViT-tiny (224x224, patch 16), and the zoo's resnet-small and transformer-encoder written in torch.
Each model is exported once with torch.onnx in training mode (BatchNormalization stays a node computing batch
statistics; nothing folded), and tensord trains that ONNX file while PyTorch trains the module it came from, with
the same initial weights (a state_dict saved beside it). Random inputs and labels, seeded.

Each model runs two ways:
  full  every parameter trained
  head  the classifier only (tensord: --freeze on every other top-level parameter prefix; PyTorch: requires_grad
        False on them and their BatchNorms in eval mode; Keras: trainable=False on the backbone). Frozen BatchNorms
        keep their statistics on all three sides, as Keras' trainable=False does. tensord computes the frozen
        backbone's features once per example before the first step (metrics.json "frozen_features") and its steps
        run the classifier alone; PyTorch and Keras run the backbone's forward pass every step.
Both: Adam lr 1e-3 (eps 1e-7 on every side), cross-entropy on logits, 2 epochs; examples/s of the LAST epoch and of
the WHOLE JOB (both epochs, plus tensord's one-time frozen-feature pass) (tensord: metrics.json, time inside training
steps; PyTorch and Keras: the epochs' wall time). --rounds alternating rounds (tensord, PyTorch, Keras, tensord,
...); medians; ratio = tensord / PyTorch (> 1: tensord faster). For head-only the whole-job ratio is the one to
read: the last epoch's compares a classifier with a backbone. Peak RSS per side:
tensord's metrics.json (peak_rss_mib), the PyTorch and Keras workers' getrusage.

Loss agreement: before timing, each model trains 10 steps in file order (tensord --shuffle false --max-steps 10; SGD
lr 1e-3, the model's batch size, every parameter) on both sides from the same weights and data; the table shows the
largest relative difference of the 10 losses (bar 1e-4), and beside it how far PyTorch's own losses move between 1
thread and --threads threads: float32 rounding alone can move a loss by more than the bar, so that spread is the floor
any float32 implementation can be held to. (On torchvision's MobileNetV2 at 64x64, one of the last layer's 327,680
ReLU6 inputs lies within float32 rounding of 0, so float32 and float64 put it on opposite sides of the kink; that one
flip moves the step-0 gradient by 0.7%, and the losses apart within 3 SGD steps, on PyTorch as on tensord.) --numerics
goes further and times nothing: the same 10 losses against PyTorch in float64 too, and every parameter's step-0
gradient against PyTorch's float64 one (tensord's read back from one SGD step of lr 1e6), beside PyTorch float32's own
error (bench/results/training-realarch-numerics-cpu.md).

Keras (TensorFlow-CPU from bench/requirements.txt) runs keras.applications MobileNetV2 and EfficientNetB0
(weights=None, classes 10, no softmax) where Keras defines the model, and the other five written here in Keras layers
to the PyTorch side's architecture (ResNet-18, resnet-small, the BERT-base-shaped encoder, ViT-tiny, the zoo encoder:
the same parameter counts, BatchNorm statistics aside); NHWC, intra/inter-op threads = --threads. Its numbers are a
reference, not the same weights (Keras initialises its own), and its EfficientNetB0 keeps Keras' dropout (0.2) and
drop-connect, which the other two sides set to 0.
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
sys.path.insert(0, HERE)

TORCH_MODELS = os.path.join(HERE, "train_realarch_models.py")
# name: (examples in the timed data, batch, Keras builder name or None)
MODELS = {
    "resnet18": (512, 64, "resnet18"),
    "mobilenet_v2": (512, 64, "mobilenet_v2"),
    "efficientnet_b0": (256, 64, "efficientnet_b0"),
    "bert_base": (64, 16, "bert_base"),
    "vit_tiny": (64, 16, "vit_tiny"),
    "resnet_small": (2048, 64, "resnet_small"),
    "transformer_enc": (1024, 64, "transformer_enc"),
}
LOSS_STEPS, LOSS_LR = 10, 0.001


# ---- the Keras side (this file, run as a worker in the virtualenv) ----
def keras_transformer(x, d, heads, ffn, layers_n, eps, pre_norm, mask=None):
    """The encoder stack as the PyTorch side builds it: post-norm (BERT, nn.TransformerEncoderLayer) or pre-norm
    (torchvision's ViT) layers of multi-head self-attention and a GELU (erf) MLP, dropout 0."""
    from keras import layers
    for _ in range(layers_n):
        h = layers.LayerNormalization(epsilon=eps)(x) if pre_norm else x
        a = layers.MultiHeadAttention(heads, d // heads)(h, h, attention_mask=mask)
        x = layers.Add()([x, a])
        x = x if pre_norm else layers.LayerNormalization(epsilon=eps)(x)
        h = layers.LayerNormalization(epsilon=eps)(x) if pre_norm else x
        x = layers.Add()([x, layers.Dense(d)(layers.Dense(ffn, activation="gelu")(h))])
        x = x if pre_norm else layers.LayerNormalization(epsilon=eps)(x)
    return x


def keras_model(name):
    """(model, names of its head's layers): keras.applications where Keras defines the model, else the PyTorch
    side's architecture written in Keras layers."""
    import keras
    from keras import layers, ops

    class AddPosition(layers.Layer):  # a learned [seq, d] table added to every example (BERT, ViT, the zoo encoder)
        def build(self, shape):
            self.pos = self.add_weight(shape=tuple(shape[1:]), initializer=keras.initializers.RandomNormal(0, 0.02))

        def call(self, x):
            return x + self.pos

    class ClassToken(layers.Layer):  # ViT's learned class token, prepended
        def build(self, shape):
            self.cls = self.add_weight(shape=(1, 1, shape[-1]), initializer="zeros")

        def call(self, x):
            return ops.concatenate([ops.broadcast_to(self.cls, (ops.shape(x)[0], 1, x.shape[-1])), x], axis=1)

    if name == "mobilenet_v2":
        return keras.applications.MobileNetV2(input_shape=(64, 64, 3), weights=None, classes=10,
                                              classifier_activation=None), ("predictions",)
    if name == "efficientnet_b0":
        return keras.applications.EfficientNetB0(input_shape=(96, 96, 3), weights=None, classes=10,
                                                 classifier_activation=None), ("predictions",)
    if name == "bert_base":
        tok, am = keras.Input((128,), dtype="int64"), keras.Input((128,), dtype="int64")
        mask = layers.Lambda(lambda m: ops.cast(m[:, None, :], "bool"))(am)
        x = layers.LayerNormalization(epsilon=1e-12)(AddPosition()(layers.Embedding(30522, 768)(tok)))
        x = keras_transformer(x, 768, 12, 3072, 12, 1e-12, False, mask)
        x = layers.Dense(768, activation="tanh", name="pooler")(x[:, 0])
        return keras.Model([tok, am], layers.Dense(2, name="classifier")(x)), ("pooler", "classifier")
    if name == "transformer_enc":
        tok = keras.Input((128,), dtype="int64")
        x = layers.LayerNormalization(epsilon=1e-5)(AddPosition()(layers.Embedding(1000, 128)(tok)))
        x = keras_transformer(x, 128, 4, 512, 2, 1e-5, False)
        return keras.Model(tok, layers.Dense(2, name="head")(layers.GlobalAveragePooling1D()(x))), ("head",)
    if name == "vit_tiny":
        inp = keras.Input((224, 224, 3))
        x = layers.Reshape((196, 192))(layers.Conv2D(192, 16, 16)(inp))
        x = AddPosition()(ClassToken()(x))
        x = layers.LayerNormalization(epsilon=1e-6)(keras_transformer(x, 192, 3, 768, 12, 1e-6, True))
        return keras.Model(inp, layers.Dense(10, name="heads")(x[:, 0])), ("heads",)

    # torchvision's ResNet-18, or the zoo's resnet-small, in Keras layers (NHWC)
    def bn(x, eps):
        return layers.BatchNormalization(epsilon=eps, momentum=0.9)(x)

    def block(x, c, s, eps):
        y = layers.ReLU()(bn(layers.Conv2D(c, 3, s, padding="same", use_bias=False)(x), eps))
        y = bn(layers.Conv2D(c, 3, 1, padding="same", use_bias=False)(y), eps)
        if s != 1 or x.shape[-1] != c:
            x = bn(layers.Conv2D(c, 1, s, use_bias=False)(x), eps)
        return layers.ReLU()(layers.Add()([x, y]))

    if name == "resnet_small":
        inp = keras.Input((32, 32, 3))
        x = layers.ReLU()(bn(layers.Conv2D(16, 3, 1, padding="same", use_bias=False)(inp), 1e-3))
        for i, c in enumerate((16, 32, 64)):
            x = block(block(x, c, 1 if i == 0 else 2, 1e-3), c, 1, 1e-3)
        return keras.Model(inp, layers.Dense(10, name="head")(layers.GlobalAveragePooling2D()(x))), ("head",)
    inp = keras.Input((64, 64, 3))
    x = layers.ReLU()(bn(layers.Conv2D(64, 7, 2, padding="same", use_bias=False)(inp), 1e-5))
    x = layers.MaxPooling2D(3, 2, padding="same")(x)
    for i, c in enumerate((64, 128, 256, 512)):
        x = block(block(x, c, 1 if i == 0 else 2, 1e-5), c, 1, 1e-5)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inp, layers.Dense(10, name="fc")(x)), ("fc",)


def keras_worker(name, data, batch, threads, mode):
    import resource
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    import keras
    keras.utils.set_random_seed(0)
    model, head = keras_model(name)
    if mode == "head":
        for layer in model.layers:
            layer.trainable = layer.name in head
    model.compile(optimizer=keras.optimizers.Adam(1e-3, epsilon=1e-7),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    d = np.load(data)
    # the PyTorch side's inputs, in order; images NCHW -> NHWC
    x = [np.ascontiguousarray(d[k].transpose(0, 2, 3, 1)) if d[k].ndim == 4 else d[k]
         for k in d.files if k != "label"]
    x = x[0] if len(x) == 1 else x
    y = d["label"]

    class Timer(keras.callbacks.Callback):
        job = 0.0

        def on_epoch_begin(self, epoch, logs=None):
            self.t0 = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            dt = time.perf_counter() - self.t0
            self.eps, self.loss, self.job = len(y) / dt, logs["loss"], self.job + dt

    t = Timer()
    model.fit(x, y, batch_size=batch, epochs=2, shuffle=True, verbose=0, callbacks=[t])
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"eps": t.eps, "job_eps": 2 * len(y) / t.job, "loss": t.loss, "rss_mib": rss,
                      "params": model.count_params(), "tf": tf.__version__}))


# ---- the driver ----
def run(cmd, what, timeout=3600):
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if cp.returncode != 0:
        sys.exit(f"{what} failed (exit {cp.returncode}):\n{cp.stderr[-4000:]}")
    return cp.stdout


def export(a, name, cache):
    """The model's ONNX file, state_dict and spec under build/, rebuilt when the exporter changed."""
    d = os.path.join(cache, name)
    stamp = os.path.getmtime(TORCH_MODELS)
    spec = os.path.join(d, "spec.json")
    if not (os.path.exists(spec) and os.path.getmtime(spec) > stamp):
        run([a.torch_python, TORCH_MODELS, "export", name, d], f"exporting {name}")
    return json.load(open(spec))


def make_data(spec, n, path, seed):
    rng = np.random.default_rng(seed)
    d = {}
    for i in spec["inputs"]:
        shape = [n] + i["shape"]
        if i["dtype"] == "float32":
            d[i["name"]] = rng.standard_normal(shape, dtype=np.float32)
        elif i["range"] == 2:  # attention mask: each row's padding at the end
            lens = rng.integers(shape[1] // 4, shape[1] + 1, n)
            d[i["name"]] = (np.arange(shape[1])[None, :] < lens[:, None]).astype(np.int64)
        else:
            d[i["name"]] = rng.integers(0, i["range"], shape).astype(np.int64)
    d["label"] = rng.integers(0, spec["classes"], n).astype(np.int64)
    np.savez(path, **d)


def tensord_train(a, base, data, batch, mode, spec, version, extra=()):
    freeze = [f for p in spec["freeze"] + ["onnx::"] for f in ("--freeze", p)] if mode == "head" else []
    run([a.bin, "train", "--model-base-path", base, "--base-version", "1", "--new-version", str(version), "--data",
         data, "--batch-size", str(batch), "--optimizer", "adam", "--lr", "0.001", "--loss",
         "sparse_categorical_crossentropy", "--from-logits", "true", "--seed", "0", "--threads", str(a.threads),
         "--no-progress", *freeze, *extra], f"tensord train {os.path.basename(base)} ({mode})")
    return json.load(open(os.path.join(base, str(version), "metrics.json")))


def torch_train(a, name, d, data, batch, epochs, mode):
    out = run([a.torch_python, TORCH_MODELS, "train", name, d, data, str(batch), str(a.threads), str(epochs), mode],
              f"PyTorch {name} ({mode})")
    return json.loads(out.strip().splitlines()[-1])


def keras_train(a, kname, data, batch, mode):
    out = run([sys.executable, os.path.abspath(__file__), "--keras-worker", kname, data, str(batch), str(a.threads),
               mode], f"Keras {kname} ({mode})")
    return json.loads(out.strip().splitlines()[-1])


def torch_losses(a, name, data, batch, threads, dtype="float32"):
    out = run([a.torch_python, TORCH_MODELS, "losses", name, os.path.join(a.cache, name), data, str(batch),
               str(threads), f"sgd:{LOSS_LR}:0", dtype], f"PyTorch {name} (losses, {dtype})")
    return json.loads(out.strip().splitlines()[-1])["losses"]


GRAD_LR = 1e6  # one SGD step this long: w1 = w0 - lr*g, so (w0 - w1) / lr is g to float32's last bits


def onnx_weights(path):
    import onnx
    from onnx import numpy_helper
    return {i.name: numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer}


def match_params(w0, torch_w):
    """{PyTorch parameter: (ONNX initializer, transposed)}: the same name, or else the initializer that holds the
    same values transposed (torch.onnx writes a Linear's weight that a MatMul reads as onnx::MatMul_N = W^T)."""
    out, spare = {}, [k for k in w0 if k not in torch_w]
    for n, w in torch_w.items():
        if n in w0 and w0[n].shape == w.shape:
            out[n] = (n, False)
            continue
        for k in spare:
            if w.ndim == 2 and w0[k].shape == w.T.shape and np.array_equal(w0[k], w.T):
                out[n] = (k, True)
                spare.remove(k)
                break
    return out


def grad_errors(a, name, spec, base, ldata, batch, tmp, version):
    """Step-0 gradients against PyTorch's float64 ones: the relative error (2-norm over every compared parameter)
    of tensord's (one SGD step of GRAD_LR, from the weights it wrote) and of PyTorch's float32 ones."""
    gpath = os.path.join(tmp, "grads.npz")
    run([a.torch_python, TORCH_MODELS, "grads", name, os.path.join(a.cache, name), ldata, str(batch), str(a.threads),
         gpath], f"PyTorch {name} (gradients)")
    t = np.load(gpath)
    tensord_train(a, base, ldata, batch, "full", spec, version,
                  ["--epochs", "1", "--shuffle", "false", "--max-steps", "1", "--optimizer", "sgd", "--lr",
                   str(GRAD_LR)])
    w0 = onnx_weights(os.path.join(base, "1", "model.onnx"))
    w1 = onnx_weights(os.path.join(base, str(version), "model.onnx"))
    names = [k[2:] for k in t.files if k.startswith("w/")]
    match = match_params(w0, {n: t["w/" + n] for n in names})
    ref = td = pt = 0.0
    for n, (k, tr) in match.items():
        g = (w0[k].astype(np.float64) - w1[k].astype(np.float64)) / GRAD_LR
        r = t["f64/" + n]
        ref += float((r * r).sum())
        td += float((((g.T if tr else g) - r) ** 2).sum())
        pt += float(((t["f32/" + n] - r) ** 2).sum())
    return {"grad_td": (td / ref) ** 0.5, "grad_pt": (pt / ref) ** 0.5, "params": len(match), "of": len(names)}


def numerics(a, name, spec, base, ldata, batch, tmp, version, full):
    """The first 10 steps' losses from the same weights and data, in file order (SGD, every parameter), tensord vs
    PyTorch float32 at --threads and at 1 thread; with full, also against PyTorch in float64, and the step-0
    gradients (grad_errors)."""
    m = tensord_train(a, base, ldata, batch, "full", spec, version,
                      ["--epochs", "1", "--shuffle", "false", "--max-steps", str(LOSS_STEPS), "--optimizer", "sgd",
                       "--lr", str(LOSS_LR)])
    ours = [s["loss"] for s in m["steps"]][:LOSS_STEPS]
    theirs = {t: torch_losses(a, name, ldata, batch, t) for t in sorted({a.threads, 1})}
    r = {"rel": max_rel(ours, theirs[a.threads]), "floor": max_rel(theirs[1], theirs[a.threads])}
    msg = (f"{name}: first {LOSS_STEPS} losses tensord {ours[0]:.6f} .. {ours[-1]:.6f}, PyTorch "
           f"{theirs[a.threads][0]:.6f} .. {theirs[a.threads][-1]:.6f}: max relative difference {r['rel']:.1e} "
           f"(PyTorch 1 vs {a.threads} threads: {r['floor']:.1e})")
    if full:
        f64 = torch_losses(a, name, ldata, batch, a.threads, "float64")
        r.update(td64=max_rel(ours, f64), pt64=max_rel(theirs[a.threads], f64),
                 steps=next((i for i, (x, y) in enumerate(zip(ours, theirs[a.threads]))
                             if abs(x - y) > 1e-4 * abs(y)), len(ours)))
        r.update(grad_errors(a, name, spec, base, ldata, batch, tmp, version + 1))
        msg += (f"; vs PyTorch float64: tensord {r['td64']:.1e}, PyTorch float32 {r['pt64']:.1e}; step-0 gradient "
                f"error vs float64: tensord {r['grad_td']:.1e}, PyTorch float32 {r['grad_pt']:.1e} "
                f"({r['params']} of {r['of']} parameters)")
    print(msg, flush=True)
    return r


def numerics_row(name, batch, r):
    return (f"| {name} | {batch} | {r['rel']:.1e} | {r['floor']:.1e} | {r['steps']} | {r['td64']:.1e} | "
            f"{r['pt64']:.1e} | {r['grad_td']:.1e} | {r['grad_pt']:.1e} | {r['params']} / {r['of']} |")


def tensord_job_eps(m, n):
    """Examples/s over the whole job: every epoch's time inside the steps, plus the frozen features' one-time pass."""
    fz = m.get("frozen_features") or {}
    secs = sum(e["seconds"] for e in m["epochs"]) + (fz["seconds"] if fz.get("cached") else 0.0)
    return len(m["epochs"]) * n / secs


def max_rel(xs, ys):
    return max(abs(x - y) / max(abs(y), 1e-30) for x, y in zip(xs, ys))


def rng_str(xs, nd=0):
    return f"{min(xs):.{nd}f}–{max(xs):.{nd}f}" if len(xs) > 1 else f"{xs[0]:.{nd}f}"


def main():
    if len(sys.argv) == 7 and sys.argv[1] == "--keras-worker":
        return keras_worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
    from common import write_result
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--modes", default="full,head")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-keras", action="store_true")
    p.add_argument("--bin", default=os.environ.get("TENSORD_BIN", os.path.join(ROOT, "build", "tensord")))
    p.add_argument("--torch-python", default="/usr/bin/python3")
    p.add_argument("--cache", default=os.path.join(ROOT, "build", "train-realarch"))
    p.add_argument("--numerics", action="store_true",
                   help="only the numerical checks, deeper: losses and step-0 gradients against PyTorch in float64 too "
                        "(--save: bench/results/training-realarch-numerics-cpu.md)")
    p.add_argument("--save", action="store_true", help="write bench/results/training-realarch-cpu.md")
    a = p.parse_args()
    t_start, load0 = time.perf_counter(), os.getloadavg()[0]
    rows, notes, versions, numrows = [], [], {}, []
    for name in a.models.split(","):
        n, batch, kname = MODELS[name]
        spec = export(a, name, a.cache)
        versions["torch"] = spec["torch"]
        with tempfile.TemporaryDirectory(prefix=f"train-{name}-") as tmp:
            base = os.path.join(tmp, "m")
            os.makedirs(base)
            os.symlink(os.path.join(a.cache, name, "1"), os.path.join(base, "1"))
            data, ldata = os.path.join(tmp, "d.npz"), os.path.join(tmp, "loss.npz")
            make_data(spec, n, data, 0)
            make_data(spec, LOSS_STEPS * batch, ldata, 1)
            version = 2
            nm = numerics(a, name, spec, base, ldata, batch, tmp, version, a.numerics)
            version += 2
            rel, floor = nm["rel"], nm["floor"]
            if a.numerics:
                numrows.append(numerics_row(name, batch, nm))
                continue
            for mode in a.modes.split(","):
                td, pt, kr, rss = [], [], [], {"td": [], "pt": [], "kr": []}
                job = {"td": [], "pt": [], "kr": []}
                for r in range(a.rounds):
                    m = tensord_train(a, base, data, batch, mode, spec, version, ["--epochs", "2"])
                    version += 1
                    td.append(m["epochs"][-1]["examples_per_sec"])
                    job["td"].append(tensord_job_eps(m, n))
                    rss["td"].append(m["peak_rss_mib"])
                    w = torch_train(a, name, os.path.join(a.cache, name), data, batch, 2, mode)
                    pt.append(w["eps"])
                    job["pt"].append(w["job_eps"])
                    rss["pt"].append(w["rss_mib"])
                    line = (f"{name} {mode} round {r + 1}: last epoch / whole job: tensord {td[-1]:.1f} / "
                            f"{job['td'][-1]:.1f}, PyTorch {pt[-1]:.1f} / {job['pt'][-1]:.1f}")
                    if kname and not a.no_keras:
                        k = keras_train(a, kname, data, batch, mode)
                        kr.append(k["eps"])
                        job["kr"].append(k["job_eps"])
                        rss["kr"].append(k["rss_mib"])
                        versions["tf"] = k["tf"]
                        line += f", Keras {kr[-1]:.1f} / {job['kr'][-1]:.1f}"
                    fz = m.get("frozen_features")
                    if fz:
                        line += (f"; frozen features {'computed once in %.2f s' % fz['seconds'] if fz['cached'] else ''}"
                                 f"{'' if fz['cached'] else 'not cached: ' + fz['reason']}")
                    print(line + " examples/s", flush=True)
                med = statistics.median
                mt, mp, jt, jp = med(td), med(pt), med(job["td"]), med(job["pt"])
                kcell = (f"{rng_str(kr, 1)} | {mt / med(kr):.2f}× / {jt / med(job['kr']):.2f}×" if kr else "— | —")
                krss = f"{max(rss['kr']):.0f}" if kr else "—"
                rows.append(f"| {name} | {mode} | {batch} | {rng_str(td, 1)} | {rng_str(pt, 1)} | {mt / mp:.2f}× | "
                            f"**{jt / jp:.2f}×** ({jt:.1f} / {jp:.1f}) | {kcell} | "
                            f"{max(rss['td']):.0f} / {max(rss['pt']):.0f} / {krss} | {rel:.1e} ({floor:.1e}) |")
    if a.numerics:
        write_result(
            "Fine-tuning real architectures: numerical agreement with PyTorch (CPU)",
            f"Generated by `.venv/bin/python bench/train_realarch_bench.py --numerics --save` (see its docstring). "
            f"Full fine-tuning, SGD lr {LOSS_LR}, the model's batch size, examples in file order, the same weights "
            f"and data on both sides. Losses: the largest relative difference of the first {LOSS_STEPS} steps' "
            "losses (bar 1e-4), and how many leading steps stay within it. Gradients: every parameter's gradient at "
            f"step 0 (tensord's from one SGD step of lr {GRAD_LR:g} and the weights it wrote), relative error (2-norm over "
            "all compared parameters) against PyTorch computing in float64.", a.threads, load0,
            [f"torch: {versions.get('torch', '?')} ({a.torch_python}), threads {a.threads}"],
            ["| model | batch | losses: tensord vs PyTorch float32, max rel. | PyTorch float32, 1 vs "
             f"{a.threads} threads | leading steps within 1e-4 | losses vs PyTorch float64: tensord | vs float64: "
             "PyTorch float32 | step-0 gradient error vs float64: tensord | PyTorch float32 | parameters compared |",
             "|---|---|---|---|---|---|---|---|---|---|"] + numrows, notes,
            "training-realarch-numerics-cpu.md" if a.save else None)
        return
    head = ["| model | mode | batch | tensord examples/s, last epoch | PyTorch examples/s, last epoch | tensord / "
            "PyTorch, last epoch | tensord / PyTorch, whole job (examples/s) | Keras examples/s, last epoch | "
            "tensord / Keras (last epoch / whole job) | peak RSS MiB (tensord / PyTorch / Keras) | 10 losses vs "
            f"PyTorch, max rel. (PyTorch 1 vs {a.threads} threads) |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    extra = [f"torch: {versions.get('torch', '?')} ({a.torch_python}), threads {a.threads}",
             f"tensorflow: {versions.get('tf', 'not run')}, intra/inter-op threads {a.threads}",
             f"rounds: {a.rounds}, alternating"]
    write_result("Fine-tuning real architectures: tensord vs PyTorch and Keras (CPU)",
                 "Generated by `.venv/bin/python bench/train_realarch_bench.py --save` (see its docstring). 2 "
                 "epochs; examples/s of the last epoch and of the whole job (both epochs, and tensord's one-time "
                 "frozen-feature pass); ratios of the medians. full: every parameter trained; head: the classifier "
                 "only, the backbone frozen (its BatchNorms keep their statistics; tensord computes the backbone's "
                 "features once per example, so its last head-only epoch runs the classifier alone and the whole-job "
                 "ratio is the one to read).", a.threads, load0, extra,
                 head + rows, notes, "training-realarch-cpu.md" if a.save else None)
    print(f"wall time {time.perf_counter() - t_start:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
