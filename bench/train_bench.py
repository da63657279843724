#!/usr/bin/env python3
"""Training throughput on CPU: `tensord train` vs Keras on TensorFlow-CPU, same models, measured in the same run.

Models: the seed CNN (Conv2D 32 3x3 + ReLU, MaxPool 2, Flatten, Dense 10, Softmax; tensord NCHW, Keras NHWC as
TF's CPU convolutions need) and the MLP (784 -> 512 -> 512 -> 10, ReLU, Softmax). Both: Adam lr 1e-3, sparse
categorical cross-entropy, batch 64, 2 threads (tensord --threads 2; TF intra_op = inter_op = 2), on the first
`--examples` Fashion-MNIST training images. Each side runs `--epochs` epochs and the LAST epoch's examples/s is
reported, so plan compilation / tf.function tracing of the first epoch is excluded on both sides. tensord's
figure is from metrics.json (time inside training steps); Keras's from a callback timing the same epoch.
ratio = tensord / Keras examples/s (> 1: tensord faster).

  .venv/bin/python bench/train_bench.py [--examples 6400] [--epochs 2] [--save]
TensorFlow comes from bench/requirements.txt (pip install -r bench/requirements.txt), not tests/.
"""
import argparse
import datetime
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import machine  # noqa: E402
FASHION = "/usr/share/datasets/fashion-mnist"


def load_fashion(n):
    with gzip.open(os.path.join(FASHION, "train-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)[:n]
    with gzip.open(os.path.join(FASHION, "train-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)[:n].astype(np.int64)
    return x, y


def tensord_run(binary, arch, data, epochs, threads, work):
    base = os.path.join(work, arch)
    opts = ["--opt", "input=784"] if arch == "mlp" else []
    subprocess.run([binary, "init", "--arch", arch, "--seed", "0", *opts, "--out", os.path.join(base, "1")],
                   check=True, capture_output=True)
    t0 = time.time()
    cp = subprocess.run([binary, "train", "--model-base-path", base, "--data", data, "--epochs", str(epochs),
                         "--batch-size", "64", "--optimizer", "adam", "--lr", "1e-3", "--loss",
                         "sparse_categorical_crossentropy", "--threads", str(threads), "--seed", "0", "--no-progress"],
                        capture_output=True, text=True)
    wall = time.time() - t0
    if cp.returncode != 0:
        raise RuntimeError(f"tensord train {arch} failed: {cp.stderr}")
    m = json.load(open(os.path.join(base, "2", "metrics.json")))
    e = m["epochs"][-1]
    return e["examples_per_sec"], e["loss"], wall


def keras_run(arch, x, y, epochs, threads):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    tf.keras.utils.set_random_seed(0)
    L = tf.keras.layers
    if arch == "mlp":
        model = tf.keras.Sequential([L.Input((784,)), L.Dense(512, activation="relu"), L.Dense(512, activation="relu"),
                                     L.Dense(10, activation="softmax")])
        xs = x.reshape(len(x), 784).astype(np.float32) / 255
    else:
        model = tf.keras.Sequential([L.Input((28, 28, 1)), L.Conv2D(32, 3, activation="relu"), L.MaxPooling2D(2),
                                     L.Flatten(), L.Dense(10, activation="softmax")])
        xs = x.reshape(len(x), 28, 28, 1).astype(np.float32) / 255
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])

    class Timer(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.t0 = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.last = time.perf_counter() - self.t0
            self.loss = logs["loss"]

    t = Timer()
    t0 = time.time()
    model.fit(xs, y, batch_size=64, epochs=epochs, shuffle=True, verbose=0, callbacks=[t])
    return len(xs) / t.last, t.loss, time.time() - t0, tf.__version__


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=6400)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default="cnn,mlp")
    ap.add_argument("--save", action="store_true", help="write bench/results/training-cpu.md")
    a = ap.parse_args()
    binary = os.environ.get("TENSORD_BIN", os.path.join(ROOT, "build", "tensord"))
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        sys.exit("tensorflow is not installed: .venv/bin/pip install -r bench/requirements.txt")
    load0 = os.getloadavg()[0]
    x, y = load_fashion(a.examples)
    work = tempfile.mkdtemp(prefix="train-bench-")
    rows = []
    tfv = "?"
    try:
        data = os.path.join(work, "fashion.npz")
        np.savez(data, x=x.astype(np.float32) / 255, label=y)  # same scaling as the Keras side
        for arch in a.models.split(","):
            t_eps, t_loss, t_wall = tensord_run(binary, arch, data, a.epochs, a.threads, work)
            k_eps, k_loss, k_wall, tfv = keras_run(arch, x, y, a.epochs, a.threads)
            rows.append((arch, t_eps, k_eps, t_eps / k_eps, t_loss, k_loss, t_wall, k_wall))
            print(f"{arch}: tensord {t_eps:.0f} ex/s, keras {k_eps:.0f} ex/s, ratio {t_eps / k_eps:.2f}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load1 = os.getloadavg()[0]
    head = ("| model | batch | tensord examples/s | Keras examples/s | ratio tensord/Keras | tensord last-epoch loss | "
            "Keras last-epoch loss | tensord wall s | Keras wall s |\n|---|---|---|---|---|---|---|---|---|\n")
    table = head + "".join(f"| {r[0]} | 64 | {r[1]:.0f} | {r[2]:.0f} | {r[3]:.2f} | {r[4]:.4f} | {r[5]:.4f} | "
                           f"{r[6]:.1f} | {r[7]:.1f} |\n" for r in rows)
    print(table)
    if a.save:
        commit, cpu = machine.git_commit(), machine.cpu_model()
        busy = "  (machine was busy: timings are noisy)" if max(load0, load1) > a.threads else ""
        md = (f"# CPU training throughput: tensord vs Keras (TensorFlow-CPU)\n\n"
              f"Generated by `.venv/bin/python bench/train_bench.py --save` (see the script's docstring). Last epoch's "
              f"examples/s of {a.epochs} epochs on {a.examples} Fashion-MNIST images, Adam 1e-3, batch 64; "
              f"ratio > 1 means tensord is faster.\n\n"
              f"- date: {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC\n- cpu: {cpu}\n"
              f"- logical cpus: {os.cpu_count()}\n- threads (both): {a.threads}\n- tensorflow: {tfv}\n"
              f"- python: {platform.python_version()}\n- tensord commit: {commit}\n"
              f"- load average (1 min) at start / end: {load0:.2f} / {load1:.2f}{busy}\n\n{table}")
        os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
        with open(os.path.join(ROOT, "bench", "results", "training-cpu.md"), "w") as f:
            f.write(md)


if __name__ == "__main__":
    main()
