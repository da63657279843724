"""Gradient buckets that overlap the backward pass (engine/train/train-buckets.c), on the test device "sim".

Replicas on devices all-reduce their gradients in buckets of about --bucket-mb MB, each sent (on a communication
context of the replica's, after an event on the plan's context) as soon as the backward pass has made its last
gradient, as PyTorch DDP does. sim runs every call synchronously but records what a device would have overlapped: a
bucket whose all-reduce was issued while the plan's context still had kernels to run.

- One and two replicas with buckets (several per step, one, and none: --bucket-mb 0) train to the CPU's weights.
- The bucket count per step follows DDP's rule over the gradients in the order they become ready, and buckets before
  the last are all-reduced before the backward pass's last kernel (the sim counter in the trainer's log line).
- A kernel failing mid-step (forward or backward) on one replica neither hangs the other nor writes a version.
- Gradient accumulation and loss scaling train to the CPU's weights with buckets; loss scaling with accumulation
  takes the host path, which has no buckets.
"""
import json
import re
import subprocess

import numpy as np
import pytest

from train_util import close_weights as close, mlp_and_data, run_adam as train, weights

TIMEOUT = 180
STEPS = 20  # 2 epochs of 400 rows in batches of 40


@pytest.fixture
def setup(tensord_bin, tmp_path):
    return mlp_and_data(tensord_bin, tmp_path, 400)


def buckets(stderr):
    """(buckets per step, sent, sent during the run, sim groups overlapped, sim groups) from the trainer's log."""
    m = re.search(r"gradient buckets: (\d+) per step", stderr)
    t = re.search(r"gradient buckets: (\d+) sent by \d+ replicas, (\d+) of them while the backward pass ran "
                  r"\(sim: (\d+) of (\d+) groups overlapped", stderr)
    assert m and t, stderr
    return (int(m.group(1)),) + tuple(int(x) for x in t.groups())


def ddp_buckets(w, cap_mb):
    """DDP's rule over the MLP's gradients in the order the backward pass makes them (the head's, then dense_1's;
    kernel before bias): a bucket closes once it holds cap bytes."""
    order = sorted(w, key=lambda k: (not k.startswith("head"), not k.endswith("kernel")))
    n, size = 0, 0
    for k in order:
        size += w[k].size * 4
        if size >= cap_mb * 1e6:
            n, size = n + 1, 0
    return n + (size > 0)


def test_buckets_train_to_the_cpu_weights_and_overlap_the_backward_pass(tensord_bin, setup):
    base, data = setup
    w1 = weights(base, 1)
    runs = {2: ("--replicas", "2"), 3: ("--devices", "sim:0,sim:1", "--bucket-mb", "0"),
            4: ("--devices", "sim:0,sim:1", "--bucket-mb", "0.000001"), 5: ("--devices", "sim:0,sim:1"),
            6: ("--devices", "sim:0,sim:1", "--bucket-mb", "0.002"), 7: ("--devices", "sim:0,sim:1", "--bucket-mb", "0.0001"),
            8: (), 9: ("--devices", "sim:0", "--bucket-mb", "0.000001")}
    out = {}
    for v, extra in runs.items():
        cp = train(tensord_bin, base, data, v, extra)
        assert cp.returncode == 0, cp.stdout + cp.stderr
        out[v] = cp.stderr
    for v in (3, 4, 5, 6, 7):
        close(weights(base, 2), weights(base, v))
    close(weights(base, 8), weights(base, 9))
    assert any(not np.array_equal(w1[k], weights(base, 4)[k]) for k in w1), "training changed nothing"
    assert "gradient buckets" not in out[3], out[3]  # --bucket-mb 0: all-reduced after the run, as before
    assert "gradient buckets" not in out[9], out[9]  # one replica in one process: nothing to all-reduce
    for v, cap in ((4, 0.000001), (5, 25), (6, 0.002), (7, 0.0001)):
        nb, sent, during, overlapped, groups = buckets(out[v])
        assert nb == ddp_buckets(w1, cap), (cap, nb, out[v])
        assert sent == groups == STEPS * 2 * nb, out[v]
        assert during == sent, out[v]  # every bucket went from inside the run, none waited for its end
        # every bucket but the last was all-reduced before the backward pass's last kernel, on every step and rank
        assert overlapped >= STEPS * 2 * (nb - 1), out[v]
    assert [ddp_buckets(w1, c) for c in (0.000001, 0.002, 0.0001, 25)] == [len(w1), 2, 3, 1]


def test_batchnorm_statistics_go_in_the_buckets_too(tensord_bin, tmp_path):
    """A small ResNet (convs, BatchNorm, residual adds): its moving means and variances are all-reduced in buckets like
    the gradients (one bucket per tensor at 1e-6 MB), and two replicas on sim train to the CPU's weights."""
    base = tmp_path / "r"
    cp = subprocess.run([tensord_bin, "init", "--arch", "resnet-small", "--opt", "input=3,8,8", "--opt", "width=4",
                         "--opt", "blocks=1", "--opt", "classes=3", "--seed", "0", "--out", str(base / "1")],
                        capture_output=True, text=True, timeout=TIMEOUT)
    assert cp.returncode == 0, cp.stderr
    rng = np.random.default_rng(1)
    x = rng.random((96, 3, 8, 8)).astype(np.float32)
    data = tmp_path / "r.npz"
    np.savez(data, x=x, label=(x[:, 0, :2, :2].sum((1, 2)) * 2).astype(np.int64) % 3)
    out = {}
    for v, extra in {2: ("--replicas", "2"), 3: ("--devices", "sim:0,sim:1", "--bucket-mb", "0.000001"),
                     4: ("--devices", "sim:0,sim:1", "--bucket-mb", "0.0005")}.items():
        cp = train(tensord_bin, base, data, v, extra, batch=16)
        assert cp.returncode == 0, cp.stdout + cp.stderr
        out[v] = cp.stderr
    w1 = weights(base, 1)
    assert sum("moving_" in k for k in w1) > 0
    for v in (3, 4):
        close(weights(base, 2), weights(base, v))
    nb, sent, during, overlapped, groups = buckets(out[3])
    assert nb == len(w1) and sent == groups == 2 * 6 * 2 * nb and overlapped > 0, out[3]
    assert 1 < buckets(out[4])[0] < nb, out[4]


@pytest.mark.parametrize("fail", ["matmul:7", "grad_act:3"])
def test_a_replica_failing_mid_step_does_not_hang_the_buckets(tensord_bin, setup, fail):
    # forward (matmul) or backward (grad_act, ReLU's gradient: after the head's buckets were sent): the replica that
    # failed sends its remaining buckets with zeros, so the other's collectives meet; then the job fails naming the
    # kernel
    base, data = setup
    cp = train(tensord_bin, base, data, 2, ("--devices", "sim:0,sim:1", "--bucket-mb", "0.000001"),
               env={"TENSORD_SIM_FAIL_KERNEL": fail})
    assert cp.returncode != 0
    err = cp.stdout + cp.stderr
    assert "injected launch failure" in err and fail.split(":")[0] in err, err
    # every rank sent every bucket of every step it started (4 per step, 2 ranks); the failing one some after its run
    nb, sent, during, overlapped, groups = buckets(cp.stderr)
    assert nb == 4 and sent > 0 and sent % (2 * nb) == 0 and groups == sent, cp.stderr
    assert during < sent, cp.stderr
    assert sorted(p.name for p in base.iterdir() if p.name.isdigit()) == ["1"], "a failed job wrote a version"


def test_accumulation_and_loss_scaling_with_buckets(tensord_bin, setup):
    base, data = setup
    runs = {2: ("--replicas", "2", "--accum-steps", "2"),
            3: ("--devices", "sim:0,sim:1", "--bucket-mb", "0.000001", "--accum-steps", "2"),
            4: ("--replicas", "2", "--loss-scale", "128"),
            5: ("--devices", "sim:0,sim:1", "--bucket-mb", "0.000001", "--loss-scale", "128"),
            6: ("--devices", "sim:0,sim:1", "--bucket-mb", "0.000001", "--loss-scale", "128", "--accum-steps", "2")}
    out = {}
    for v, extra in runs.items():
        cp = train(tensord_bin, base, data, v, extra)
        assert cp.returncode == 0, cp.stdout + cp.stderr
        out[v] = cp.stderr
    close(weights(base, 2), weights(base, 3))
    close(weights(base, 4), weights(base, 5))
    assert buckets(out[3])[0] == 4 and buckets(out[5])[0] == 4
    assert "gradient buckets" not in out[6], out[6]  # loss scaling with accumulation: the host path


def test_bucket_mb_is_checked(tensord_bin, setup):
    base, data = setup
    cp = train(tensord_bin, base, data, 2, ("--devices", "sim:0,sim:1", "--bucket-mb", "-1"))
    assert cp.returncode != 0 and "--bucket-mb must be in [0, 1e6]" in cp.stdout + cp.stderr, cp.stderr
    assert not (base / "2").exists()


def test_a_job_file_takes_bucket_mb(tensord_bin, setup, tmp_path):
    base, data = setup
    job = {"job_id": 1, "model_base_path": str(base), "base_version": 1, "new_version": 2, "data_files": [str(data)],
           "epochs": 1, "batch_size": 40, "optimizer": "adam", "learning_rate": 0.01, "schedule": {"kind": "constant"},
           "loss": "sparse_categorical_crossentropy", "early_stopping": {"patience": 0}, "threads": 1,
           "precision": "fp32", "devices": ["sim:0", "sim:1"], "seed": 3, "resume": False, "bucket_mb": 0.000001}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    cp = subprocess.run([tensord_bin, "train", "--job", str(path)], capture_output=True, text=True, timeout=TIMEOUT)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert buckets(cp.stderr)[0] == len(weights(base, 1)), cp.stderr
    path.write_text(json.dumps({**job, "new_version": 3, "bucket_mb": "big"}))
    cp = subprocess.run([tensord_bin, "train", "--job", str(path)], capture_output=True, text=True, timeout=TIMEOUT)
    assert cp.returncode != 0 and "bucket_mb" in cp.stdout + cp.stderr, cp.stdout + cp.stderr
