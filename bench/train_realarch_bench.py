#!/usr/bin/env python3
"""Fine-tuning real architectures on CPU (issue 17): `tensord train` against PyTorch and Keras/TensorFlow-CPU, the
same architectures, measured in the same run, alternating.

    .venv/bin/python bench/train_realarch_bench.py [--models a,b] [--rounds 2] [--threads 2] [--no-keras] [--save]

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

Loss agreement: before timing, each model trains 10 steps in file order (tensord --shuffle false --max-steps 10;
SGD lr 1e-3, the model's batch size, every parameter) on both sides from the same weights and data; the table shows the largest
relative difference of the 10 losses (bar 1e-4), and beside it how far PyTorch's own losses move between 1 thread
and --threads threads: float32 rounding alone, amplified where a BatchNorm normalises a channel of near-constant
values (small batches, 2x2 maps), can move a loss by more than the bar, so that spread is the floor any float32
implementation can be held to.

Keras (TensorFlow-CPU from bench/requirements.txt) has the models it defines itself: keras.applications
MobileNetV2 and EfficientNetB0 (weights=None, classes 10, no softmax) and ResNet-18 written here in Keras layers;
NHWC, intra/inter-op threads = --threads. Its numbers are a reference, not the same weights (Keras initialises its
own), and its EfficientNetB0 keeps Keras' dropout (0.2) and drop-connect, which the other two sides set to 0.
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
    "bert_base": (64, 16, None),
    "vit_tiny": (64, 16, None),
    "resnet_small": (2048, 64, None),
    "transformer_enc": (1024, 64, None),
}
LOSS_STEPS, LOSS_LR = 10, 0.001


# ---- the Keras side (this file, run as a worker in the virtualenv) ----
def keras_model(name):
    import keras
    from keras import layers
    if name == "mobilenet_v2":
        return keras.applications.MobileNetV2(input_shape=(64, 64, 3), weights=None, classes=10,
                                              classifier_activation=None), "predictions"
    if name == "efficientnet_b0":
        return keras.applications.EfficientNetB0(input_shape=(96, 96, 3), weights=None, classes=10,
                                                 classifier_activation=None), "predictions"
    # torchvision's ResNet-18 in Keras layers (NHWC)
    def bn(x):
        return layers.BatchNormalization(epsilon=1e-5, momentum=0.9)(x)

    def block(x, c, s):
        y = layers.ReLU()(bn(layers.Conv2D(c, 3, s, padding="same", use_bias=False)(x)))
        y = bn(layers.Conv2D(c, 3, 1, padding="same", use_bias=False)(y))
        if s != 1 or x.shape[-1] != c:
            x = bn(layers.Conv2D(c, 1, s, use_bias=False)(x))
        return layers.ReLU()(layers.Add()([x, y]))

    inp = keras.Input((64, 64, 3))
    x = layers.ReLU()(bn(layers.Conv2D(64, 7, 2, padding="same", use_bias=False)(inp)))
    x = layers.MaxPooling2D(3, 2, padding="same")(x)
    for i, c in enumerate((64, 128, 256, 512)):
        x = block(block(x, c, 1 if i == 0 else 2), c, 1)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inp, layers.Dense(10, name="fc")(x)), "fc"


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
            layer.trainable = layer.name == head
    model.compile(optimizer=keras.optimizers.Adam(1e-3, epsilon=1e-7),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    d = np.load(data)
    x = np.ascontiguousarray(d["x"].transpose(0, 2, 3, 1))
    y = d["label"]

    class Timer(keras.callbacks.Callback):
        job = 0.0

        def on_epoch_begin(self, epoch, logs=None):
            self.t0 = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            dt = time.perf_counter() - self.t0
            self.eps, self.loss, self.job = len(x) / dt, logs["loss"], self.job + dt

    t = Timer()
    model.fit(x, y, batch_size=batch, epochs=2, shuffle=True, verbose=0, callbacks=[t])
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"eps": t.eps, "job_eps": 2 * len(x) / t.job, "loss": t.loss, "rss_mib": rss,
                      "tf": tf.__version__}))


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


def torch_losses(a, name, data, batch, threads):
    out = run([a.torch_python, TORCH_MODELS, "losses", name, os.path.join(a.cache, name), data, str(batch),
               str(threads), f"sgd:{LOSS_LR}:0", "float32"], f"PyTorch {name} (losses)")
    return json.loads(out.strip().splitlines()[-1])["losses"]


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
    p.add_argument("--save", action="store_true", help="write bench/results/training-realarch-cpu.md")
    a = p.parse_args()
    t_start, load0 = time.perf_counter(), os.getloadavg()[0]
    rows, notes, versions = [], [], {}
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
            # the first 10 steps' losses from the same weights and data, in file order
            m = tensord_train(a, base, ldata, batch, "full", spec, version,
                              ["--epochs", "1", "--shuffle", "false", "--max-steps", str(LOSS_STEPS), "--optimizer",
                               "sgd", "--lr", str(LOSS_LR)])
            version += 1
            ours = [s["loss"] for s in m["steps"]][:LOSS_STEPS]
            theirs = {t: torch_losses(a, name, ldata, batch, t) for t in sorted({a.threads, 1})}
            rel = max_rel(ours, theirs[a.threads])
            floor = max_rel(theirs[1], theirs[a.threads])
            print(f"{name}: first {LOSS_STEPS} losses tensord {ours[0]:.6f} .. {ours[-1]:.6f}, PyTorch "
                  f"{theirs[a.threads][0]:.6f} .. {theirs[a.threads][-1]:.6f}: max relative difference {rel:.1e} "
                  f"(PyTorch 1 vs {a.threads} threads: {floor:.1e})", flush=True)
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
