"""Multi-process training under MPI (issue 15): `mpirun -np 2 tensord train ...` against one process.

- Two ranks (and two ranks x two replica threads) with the same global batch write the same weights as one
  process, within 1e-5 of the weights' scale; only rank 0 writes: one version, one logs/<v>, no checkpoint left
  behind; metrics.json says processes = 2.
- A rank killed mid-run ends the job with a non-zero exit naming the killed rank, within the timeout (no hang), and
  no version is written.
- Two ranks with device-resident replicas (`--devices sim:0`, and two devices each) write the weights of one process,
  with no weight copies per step (one sim communicator spans both ranks' devices, its id sent by MPI_Bcast; the
  weights stay on the devices; test_multiproc_devices.py checks the gradients never reach host memory).
- `--job` (the admin worker's mode) under mpirun is refused, and so is TENSORD_WORLD_SIZE > 1 on CPUs outside mpirun
  (the Kubernetes training template's variables: its coordinator serves device communicators, NCCL, only).

Needs OpenMPI's mpirun (`make deps` installs it). Without it the tests skip, saying so, except under CI=true, where a
missing mpirun is a broken install and fails.
"""
import json
import os
import re
import signal
import subprocess
import time

import numpy as np
import pytest

from train_util import adam_args, mlp_and_data, weights

TIMEOUT = 120


@pytest.fixture
def setup(tensord_bin, tmp_path):
    return mlp_and_data(tensord_bin, tmp_path, 600)


def train_args(tensord_bin, base, data, version, epochs=3, batch=48, extra=()):
    # batch 48 over 600 rows: 12 full batches and one of 24 per epoch, which 2 x 2 shards split unevenly
    return adam_args(tensord_bin, base, data, version, epochs, batch, extra)


def test_two_ranks_write_the_weights_of_one_process(tensord_bin, mpirun, setup):
    base, data = setup
    cp = subprocess.run(train_args(tensord_bin, base, data, 2), capture_output=True, text=True, timeout=TIMEOUT)
    assert cp.returncode == 0, cp.stderr
    runs = {3: ["-np", "2"], 4: ["-np", "2"]}
    for v, np_args in runs.items():
        extra = ("--replicas", "2") if v == 4 else ()
        cp = subprocess.run(mpirun + np_args + train_args(tensord_bin, base, data, v, extra=extra),
                            capture_output=True, text=True, timeout=TIMEOUT)
        assert cp.returncode == 0, cp.stdout + cp.stderr
        assert cp.stdout.count("version %d:" % v) == 1, f"rank 0 alone reports:\n{cp.stdout}"
        one, two = weights(base, 2), weights(base, v)
        assert one.keys() == two.keys() and one
        for k in one:
            scale = max(1.0, float(np.abs(one[k]).max()))
            err = float(np.abs(one[k] - two[k]).max())
            assert err <= 1e-5 * scale, f"version {v}: {k} differs by {err} (scale {scale})"
        m = json.load(open(base / str(v) / "metrics.json"))
        assert m["settings"]["processes"] == 2, m["settings"]
        m1 = json.load(open(base / "2" / "metrics.json"))
        assert abs(m["epochs"][-1]["loss"] - m1["epochs"][-1]["loss"]) <= 1e-5, (m["epochs"][-1], m1["epochs"][-1])
    assert sorted(os.listdir(base)) == ["1", "2", "3", "4", "logs"], os.listdir(base)
    assert sorted(os.listdir(base / "logs")) == ["2", "3", "4"]


def test_two_ranks_on_devices_write_the_weights_of_one_process(tensord_bin, mpirun, setup):
    """Device-resident replicas across processes (engine/train/train-device.c): one communicator spans every rank's
    replicas ("sim", a device in host memory; its id goes out by MPI_Bcast), so each replica's all-reduce covers the
    job; the weights equal one process's on the CPU within 1e-5."""
    base, data = setup
    cp = subprocess.run(train_args(tensord_bin, base, data, 2), capture_output=True, text=True, timeout=TIMEOUT)
    assert cp.returncode == 0, cp.stderr
    alone = subprocess.run(train_args(tensord_bin, base, data, 5, extra=("--devices", "sim:0")), capture_output=True,
                           text=True, timeout=TIMEOUT)
    assert alone.returncode == 0, alone.stderr
    copies = re.search(r"(\d+) copies, \d+ bytes per run", alone.stderr).group(1)  # no weight traffic per step
    for v, devices in ((3, "sim:0"), (4, "sim:0,sim:1")):
        cp = subprocess.run(mpirun + ["-np", "2"] + train_args(tensord_bin, base, data, v, extra=("--devices", devices)),
                            capture_output=True, text=True, timeout=TIMEOUT)
        assert cp.returncode == 0, cp.stdout + cp.stderr
        assert re.search(r"; %s copies, \d+ bytes per run" % copies, cp.stderr), cp.stderr
        one, two = weights(base, 2), weights(base, v)
        for k in one:
            scale = max(1.0, float(np.abs(one[k]).max()))
            err = float(np.abs(one[k] - two[k]).max())
            assert err <= 1e-5 * scale, f"version {v} ({devices}): {k} differs by {err} (scale {scale})"


def rank_pid(rank):
    """The pid of the `tensord train` process that is MPI rank `rank` (from its environment)."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            if len(cmd) < 2 or not cmd[0].endswith(b"tensord") or cmd[1] != b"train":
                continue
            with open(f"/proc/{d}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
            return int(d)
    return None


def test_a_killed_rank_fails_the_job_without_a_hang(tensord_bin, mpirun, setup):
    base, data = setup
    p = subprocess.Popen(mpirun + ["-np", "2"] + train_args(tensord_bin, base, data, 5, epochs=100000, batch=8),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pid, t0 = None, time.time()
        while pid is None and time.time() - t0 < 30 and p.poll() is None:
            time.sleep(0.2)
            pid = rank_pid(1)
        assert pid, "rank 1 never started"
        time.sleep(1.0)  # well into training (thousands of steps a second)
        os.kill(pid, signal.SIGKILL)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
            pytest.fail("mpirun still running 60 s after rank 1 was killed: the job hung")
    assert p.returncode != 0, out + err
    assert "rank 1" in err and ("signal 9" in err or "Killed" in err), err[-2000:]
    assert not (base / "5").exists(), "a version was written by a failed job"


def test_job_mode_under_mpirun_is_refused(tensord_bin, mpirun, setup, tmp_path):
    job = tmp_path / "job.json"
    job.write_text("{}")
    cp = subprocess.run(mpirun + ["-np", "2", tensord_bin, "train", "--job", str(job)], capture_output=True, text=True,
                        timeout=TIMEOUT)
    assert cp.returncode != 0
    assert "under mpirun" in cp.stderr, cp.stderr


def test_world_size_without_a_coordinator_is_refused(tensord_bin, setup):
    """deploy/k8s/train-job.yaml's TENSORD_WORLD_SIZE > 1 outside mpirun on CPUs: refused, not N pods training alone
    (the coordinator hands out device communicators only; gradients travel through NCCL or MPI)."""
    base, data = setup
    env = dict(os.environ, TENSORD_WORLD_SIZE="2", TENSORD_RANK="0", TENSORD_COORDINATOR="tensord-train-0.x:8503")
    cp = subprocess.run(train_args(tensord_bin, base, data, 2, epochs=1), capture_output=True, text=True,
                        timeout=TIMEOUT, env=env)
    assert cp.returncode == 1, cp.stdout + cp.stderr
    assert "TENSORD_WORLD_SIZE=2" in cp.stderr and "mpirun" in cp.stderr, cp.stderr
    assert not (base / "2").exists()
