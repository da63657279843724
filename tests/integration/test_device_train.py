"""Training on device backends (issue 14), on the host-memory test device "sim" (kernels/sim: a device's buffers,
copies and failure modes, the CPU's kernels for a subset of ops; no GPU here).

- `--devices sim:0` trains to the same weights as the CPU (sim runs the CPU's kernels: within 1e-6 of the scale),
  and `--devices sim:0,sim:1` (two replicas, one per device) to the same weights as `--replicas 2` on the CPU.
- A kernel launch failure inside a training step (TENSORD_SIM_FAIL_KERNEL) fails the job with the reason, the node
  and the step's kernel named, and no version is written.
- A device that is not there (cuda:0 on a machine without a GPU; sim:7 of 2) is refused before training, naming it.
- Replicas on devices keep their weights, gradients and optimizer state on the device and all-reduce there (no
  weight copies per step), and a run resumed from a checkpoint ends at the uninterrupted run's weights.
"""
import json
import re
import shutil
import subprocess

import numpy as np
import pytest

from train_util import close_weights as close, mlp_and_data, run_adam as train, weights

TIMEOUT = 180


@pytest.fixture
def setup(tensord_bin, tmp_path):
    return mlp_and_data(tensord_bin, tmp_path, 400)


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


@pytest.mark.parametrize("devices", ["sim:0", "sim:0,sim:1"])
def test_a_kernel_failing_inside_a_step_fails_the_job_and_writes_nothing(tensord_bin, setup, devices):
    # with two replicas, the one that failed still joins the gradient all-reduce (no hang), then the job fails
    base, data = setup
    cp = train(tensord_bin, base, data, 2, ("--devices", devices), env={"TENSORD_SIM_FAIL_KERNEL": "matmul:7"})
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


def plan_copies(stderr):
    """Copies per run of the first training plan the log names ('N copies, B bytes per run')."""
    m = re.search(r"plan on sim:\d: .*?; (\d+) copies, (\d+) bytes per run", stderr)
    assert m, stderr
    return int(m.group(1))


def test_device_replicas_keep_weights_and_optimizer_on_the_device(tensord_bin, setup):
    """Replicas on devices read their weights and write their gradients in device memory, all-reduce the gradients
    there (sim's collective; NCCL on CUDA) and apply the update as a kernel there, so a training step copies only
    the batch and the loss; loss scaling with gradient accumulation takes the host path, which also copies every
    weight in and every gradient out. A run stopped mid-way and resumed from its
    checkpoint (device weights brought to the host for it, pushed back with the optimizer state after the resume)
    ends at the uninterrupted run's weights."""
    base, data = setup
    one = train(tensord_bin, base, data, 2, ("--devices", "sim:0", "--val-split", "0.1"))
    two = train(tensord_bin, base, data, 3, ("--devices", "sim:0,sim:1", "--val-split", "0.1"))
    host = train(tensord_bin, base, data, 5, ("--devices", "sim:0", "--val-split", "0.1", "--loss-scale", "128",
                                              "--accum-steps", "2"))
    assert one.returncode == 0 and two.returncode == 0 and host.returncode == 0, one.stderr + two.stderr + host.stderr
    ntensors = len(weights(base, 1))
    # the host path: every weight in, every gradient out, and the loss scale (one more graph input)
    assert plan_copies(host.stderr) - plan_copies(one.stderr) == 2 * ntensors + 1, one.stderr + host.stderr
    assert plan_copies(two.stderr) == plan_copies(one.stderr), two.stderr
    # stop after 7 updates (mid epoch 1 of 2), then resume into a copy of the tree
    stop = train(tensord_bin, base, data, 4, ("--devices", "sim:0", "--val-split", "0.1", "--max-steps", "7",
                                              "--checkpoint-every", "3"))
    assert stop.returncode == 0, stop.stderr
    ck = base / ".train-4"
    assert (ck / "ckpt-7.bin").is_file(), list(ck.iterdir())
    other = base.parent / "m2"
    other.mkdir()
    shutil.copytree(base / "1", other / "1")
    shutil.copytree(ck, other / ".train-4")
    res = train(tensord_bin, other, data, 4, ("--devices", "sim:0", "--val-split", "0.1", "--resume"))
    assert res.returncode == 0, res.stderr
    close(weights(base, 2), weights(other, 4))


def test_loss_scaling_runs_on_the_device_like_the_cpu(tensord_bin, setup):
    """Loss scaling on the device (the update unscales the gradients and skips itself on an overflow): a fixed scale
    (128, exact in float) and the dynamic scaler train to the CPU's weights, with the same scaler history."""
    base, data = setup
    cpu = train(tensord_bin, base, data, 2, ("--loss-scale", "128"))
    dev = train(tensord_bin, base, data, 3, ("--devices", "sim:0,sim:1", "--loss-scale", "128"))
    hostrep = train(tensord_bin, base, data, 4, ("--replicas", "2", "--loss-scale", "128"))
    one = train(tensord_bin, base, data, 5, ("--devices", "sim:0", "--loss-scale", "128"))
    assert all(p.returncode == 0 for p in (cpu, dev, hostrep, one)), cpu.stderr + dev.stderr + hostrep.stderr + one.stderr
    close(weights(base, 2), weights(base, 5))
    close(weights(base, 4), weights(base, 3))
    huge = train(tensord_bin, base, data, 6, ("--devices", "sim:0", "--loss-scale", "dynamic"))
    hcpu = train(tensord_bin, base, data, 7, ("--loss-scale", "dynamic"))
    assert huge.returncode == 0 and hcpu.returncode == 0, huge.stderr + hcpu.stderr
    close(weights(base, 7), weights(base, 6))
    ls6 = json.load(open(base / "6" / "metrics.json"))["loss_scaling"]
    ls7 = json.load(open(base / "7" / "metrics.json"))["loss_scaling"]
    assert ls6 == ls7, (ls6, ls7)
    # a fixed scale near float's limit: the device ends as the host does (here the gradients overflow and the job
    # fails as diverged, or they do not and both train to the same weights)
    hb = train(tensord_bin, base, data, 8, ("--loss-scale", "3e38"))
    db = train(tensord_bin, base, data, 9, ("--devices", "sim:0", "--loss-scale", "3e38"))
    assert (hb.returncode == 0) == (db.returncode == 0), hb.stderr + db.stderr
    if hb.returncode == 0:
        close(weights(base, 8), weights(base, 9))
    else:
        assert "not finite" in db.stdout + db.stderr and not (base / "9").exists()


def test_version_says_which_devices_this_binary_sees(tensord_bin):
    cp = subprocess.run([tensord_bin, "version"], capture_output=True, text=True, timeout=TIMEOUT)
    assert cp.returncode == 0
    line = cp.stdout.splitlines()[1]
    assert line.startswith("devices: cpu; "), cp.stdout
    assert "no CUDA device, using CPU (" in line or "using CUDA (" in line, line
    # a built plugin loads (every engine symbol it needs is exported); only a driver or a device may be missing
    assert "did not load" not in line and "another tensord" not in line, line
