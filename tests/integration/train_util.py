"""What training tests share: a small MLP base version and a learnable 3-class dataset (test_mpi_train.py,
test_device_train.py, ...), the `tensord train` command lines of the data-parallel tests, running `tensord train` for a
version's metrics, and reading and comparing a version's float weights."""
import json
import os
import subprocess

import numpy as np
import onnx
from onnx import numpy_helper


def mlp_and_data(tensord_bin, tmp_path, rows, timeout=180):
    """<tmp>/m/1: `tensord init` MLP 20-32-3 (seed 0); <tmp>/d.npz: `rows` rows of x in [0,1)^20, label from x[:3]."""
    base = tmp_path / "m"
    cp = subprocess.run([tensord_bin, "init", "--arch", "mlp", "--opt", "input=20", "--opt", "hidden=32",
                         "--opt", "classes=3", "--seed", "0", "--out", str(base / "1")],
                        capture_output=True, text=True, timeout=timeout)
    assert cp.returncode == 0, cp.stderr
    rng = np.random.default_rng(1)
    x = rng.random((rows, 20)).astype(np.float32)
    y = (x[:, :3].sum(1) * 2).astype(np.int64) % 3
    data = tmp_path / "d.npz"
    np.savez(data, x=x, label=y)
    return base, data


def weights(base, version):
    m = onnx.load(str(base / str(version) / "model.onnx"))
    return {i.name: numpy_helper.to_array(i) for i in m.graph.initializer if i.data_type == onnx.TensorProto.FLOAT}


def train_version(tensord_bin, base, data, version, args, timeout=180):
    """`tensord train` from version 1 of base into `version` on data, with args; the new version's metrics.json."""
    cp = subprocess.run([tensord_bin, "train", "--model-base-path", str(base), "--base-version", "1", "--new-version",
                         str(version), "--data", str(data), "--threads", "2", "--no-progress", *args],
                        capture_output=True, text=True, timeout=timeout)
    assert cp.returncode == 0, cp.stderr[-3000:]
    return json.loads((base / str(version) / "metrics.json").read_text())


def adam_args(tensord_bin, base, data, version, epochs, batch, extra=()):
    """`tensord train` from version 1 into `version`: Adam lr 0.01, seed 3, one thread, the data-parallel tests' job."""
    return [tensord_bin, "train", "--model-base-path", str(base), "--base-version", "1", "--new-version", str(version),
            "--data", str(data), "--epochs", str(epochs), "--batch-size", str(batch), "--optimizer", "adam",
            "--lr", "0.01", "--loss", "sparse_categorical_crossentropy", "--seed", "3", "--threads", "1",
            "--no-progress", *extra]


def run_adam(tensord_bin, base, data, version, extra=(), env=None, batch=40, timeout=180):
    """adam_args for 2 epochs, run; the CompletedProcess (env: added to the environment)."""
    return subprocess.run(adam_args(tensord_bin, base, data, version, 2, batch, extra), capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def close_weights(a, b, tol=1e-6):
    """Two versions' weights (weights()) equal within tol x max(1, max|a|) per tensor."""
    assert a.keys() == b.keys()
    for k in a:
        scale = max(1.0, float(np.abs(a[k]).max()))
        np.testing.assert_allclose(a[k], b[k], rtol=0, atol=tol * scale, err_msg=k)
