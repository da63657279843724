"""Training on device backends (issue 14), on the host-memory test device "sim" (kernels/sim: a device's buffers,
copies and failure modes, the CPU's kernels for a subset of ops; no GPU here).

- `--devices sim:0` trains to the same weights as the CPU (sim runs the CPU's kernels: within 1e-6 of the scale),
  and `--devices sim:0,sim:1` (two replicas, one per device) to the same weights as `--replicas 2` on the CPU.
- A kernel launch failure inside a training step (TENSORD_SIM_FAIL_KERNEL) fails the job with the reason, the node
  and the step's kernel named, and no version is written.
- A device that is not there (cuda:0 on a machine without a GPU; sim:7 of 2) is refused before training, naming it.
"""
import os
import subprocess

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

TIMEOUT = 180


@pytest.fixture
def setup(tensord_bin, tmp_path):
    base = tmp_path / "m"
    cp = subprocess.run([tensord_bin, "init", "--arch", "mlp", "--opt", "input=20", "--opt", "hidden=32",
                         "--opt", "classes=3", "--seed", "0", "--out", str(base / "1")],
                        capture_output=True, text=True, timeout=TIMEOUT)
    assert cp.returncode == 0, cp.stderr
    rng = np.random.default_rng(1)
    x = rng.random((400, 20)).astype(np.float32)
    y = (x[:, :3].sum(1) * 2).astype(np.int64) % 3
    data = tmp_path / "d.npz"
    np.savez(data, x=x, label=y)
    return base, data


def train(tensord_bin, base, data, version, extra=(), env=None):
    args = [tensord_bin, "train", "--model-base-path", str(base), "--base-version", "1", "--new-version", str(version),
            "--data", str(data), "--epochs", "2", "--batch-size", "40", "--optimizer", "adam", "--lr", "0.01",
            "--loss", "sparse_categorical_crossentropy", "--seed", "3", "--threads", "1", "--no-progress", *extra]
    return subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT, env={**os.environ, **(env or {})})


def weights(base, version):
    m = onnx.load(str(base / str(version) / "model.onnx"))
    return {i.name: numpy_helper.to_array(i) for i in m.graph.initializer if i.data_type == onnx.TensorProto.FLOAT}


def close(a, b):
    assert a.keys() == b.keys()
    for k in a:
        scale = max(1.0, float(np.abs(a[k]).max()))
        np.testing.assert_allclose(a[k], b[k], rtol=0, atol=1e-6 * scale, err_msg=k)


def test_one_and_two_devices_train_to_the_cpu_weights(tensord_bin, setup):
    base, data = setup
    for v, extra in [(2, ()), (3, ("--devices", "sim:0")), (4, ("--replicas", "2")), (5, ("--devices", "sim:0,sim:1"))]:
        cp = train(tensord_bin, base, data, v, extra)
        assert cp.returncode == 0, cp.stdout + cp.stderr
        if "sim" in " ".join(extra):  # the plans ran on the device, and the log names what ran on the CPU
            assert "steps on the device" in cp.stderr, cp.stderr
    close(weights(base, 2), weights(base, 3))
    close(weights(base, 4), weights(base, 5))
    w1, w3 = weights(base, 1), weights(base, 3)
    assert any(not np.array_equal(w1[k], w3[k]) for k in w1), "training changed nothing"


def test_a_kernel_failing_inside_a_step_fails_the_job_and_writes_nothing(tensord_bin, setup):
    base, data = setup
    cp = train(tensord_bin, base, data, 2, ("--devices", "sim:0"), env={"TENSORD_SIM_FAIL_KERNEL": "matmul:7"})
    assert cp.returncode != 0
    err = cp.stdout + cp.stderr
    assert "injected launch failure" in err and "matmul" in err, err
    assert not (base / "2").exists(), "a failed job wrote a version"
    assert sorted(p.name for p in base.iterdir() if p.name.isdigit()) == ["1"]


@pytest.mark.parametrize("dev,why", [("cuda:0", "not available"), ("sim:7", "sim has 2 devices"),
                                     ("tpu:0", "unknown kind 'tpu'")])
def test_devices_that_are_not_there_are_refused_before_training(tensord_bin, setup, dev, why):
    base, data = setup
    cp = train(tensord_bin, base, data, 2, ("--devices", dev))
    if dev == "cuda:0" and cp.returncode == 0:
        pytest.skip("this machine has a CUDA device")
    assert cp.returncode != 0
    assert why in cp.stdout + cp.stderr and dev.split(":")[0] in cp.stdout + cp.stderr
    assert not (base / "2").exists()
