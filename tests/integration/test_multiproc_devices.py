"""One device communicator spanning processes (engine/train/rendezvous.c, kernels/sim/sim-comm.c, train-device.c).

The job's processes build ONE communicator over all their replicas (global rank = process rank x R + r), whose id
rank 0 makes and hands out: over MPI under mpirun, or through the coordinator at TENSORD_COORDINATOR (a Kubernetes
indexed Job: TENSORD_RANK, TENSORD_WORLD_SIZE). Here the device is "sim", whose communicator is a POSIX
shared-memory segment every rank maps (the CUDA backend's is NCCL's ncclCommInitRank; no GPU here).

- Two processes joined through the coordinator, with one and with two devices each, and the same under
  `mpirun -np 2`, write the weights of one process (within 1e-5 of the scale); every rank says its gradients went
  through the one communicator (none through host memory); one version, written by rank 0; no segment left behind.
- Bad conditions end with a non-zero exit, a message naming the problem, and no version: a rank out of range, world
  sizes that differ, a rank that joins twice, a coordinator nobody reaches (short timeout), a bad TENSORD_COORDINATOR,
  a rank killed mid-run (the other stops instead of hanging), and the CPU backend with TENSORD_WORLD_SIZE=2 outside
  mpirun (gradients only ever travel through NCCL or MPI).
"""
import glob
import json
import os
import re
import signal
import socket
import subprocess
import time

import numpy as np
import pytest

from train_util import adam_args, mlp_and_data, weights

TIMEOUT = 120
LINE = r"gradients all-reduced on the devices by one sim communicator over 2 processes x %d devices \(%d ranks\)"


@pytest.fixture
def setup(tensord_bin, tmp_path):
    return mlp_and_data(tensord_bin, tmp_path, 600)


def train_args(tensord_bin, base, data, version, epochs=3, batch=48, extra=()):
    # batch 48 over 600 rows: 12 full batches and one of 24 per epoch, which 2 x 2 shards split unevenly
    return adam_args(tensord_bin, base, data, version, epochs, batch, extra)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank, world, port, **more):
    env = dict(os.environ, TENSORD_RANK=str(rank), TENSORD_WORLD_SIZE=str(world),
               TENSORD_COORDINATOR="127.0.0.1:%d" % port, TENSORD_COORDINATOR_TIMEOUT="30",
               TENSORD_SIM_COMM_TIMEOUT="30")
    env.update(more)
    return env


def start(args, env):
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(procs, timeout=TIMEOUT):
    out = []
    try:
        for p in procs:
            o, e = p.communicate(timeout=timeout)
            out.append((p.returncode, o, e))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def sim_segments():
    return set(glob.glob("/dev/shm/tensord-sim-*"))


def assert_same_weights(base, v_ref, v, what):
    one, two = weights(base, v_ref), weights(base, v)
    assert one.keys() == two.keys() and one
    for k in one:
        scale = max(1.0, float(np.abs(one[k]).max()))
        err = float(np.abs(one[k] - two[k]).max())
        assert err <= 1e-5 * scale, f"{what}: {k} differs by {err} (scale {scale})"


def test_coordinator_ranks_on_devices_write_the_weights_of_one_process(tensord_bin, setup):
    base, data = setup
    before = sim_segments()
    cp = subprocess.run(train_args(tensord_bin, base, data, 2), capture_output=True, text=True, timeout=TIMEOUT)
    assert cp.returncode == 0, cp.stderr
    # version 5: small gradient buckets (train-buckets.c), all-reduced across both processes during the backward pass
    for v, devices, nd, more in ((3, "sim:0", 1, ()), (4, "sim:0,sim:1", 2, ()),
                                 (5, "sim:0,sim:1", 2, ("--bucket-mb", "0.0001"))):
        port = free_port()
        procs = [start(train_args(tensord_bin, base, data, v, extra=("--devices", devices) + more),
                       rank_env(r, 2, port)) for r in (1, 0)]  # rank 1 first: it waits for the coordinator with backoff
        (rc1, out1, err1), (rc0, out0, err0) = finish(procs)
        assert rc0 == 0 and rc1 == 0, f"rank 0:\n{err0}\nrank 1:\n{err1}"
        for err in (err0, err1):
            assert re.search(LINE % (nd, 2 * nd), err), err
        assert "all 2 ranks joined" in err0, err0
        if more:
            b = re.search(r"gradient buckets: (\d+) per step", err0)
            assert b and int(b.group(1)) > 1, err0
        assert out0.count("version %d:" % v) == 1 and "version" not in out1, (out0, out1)
        assert_same_weights(base, 2, v, f"version {v} ({devices} per process)")
        m = json.load(open(base / str(v) / "metrics.json"))
        assert m["settings"]["processes"] == 2, m["settings"]
        m1 = json.load(open(base / "2" / "metrics.json"))
        assert abs(m["epochs"][-1]["loss"] - m1["epochs"][-1]["loss"]) <= 1e-5, (m["epochs"][-1], m1["epochs"][-1])
    assert sorted(os.listdir(base)) == ["1", "2", "3", "4", "5", "logs"], os.listdir(base)
    assert sim_segments() <= before, "a sim communicator's shared-memory segment was left behind"


def test_mpi_ranks_on_devices_share_one_communicator(tensord_bin, mpirun, setup):
    """Under mpirun the id travels by MPI_Bcast; the gradients go through the sim communicator, not MPI."""
    base, data = setup
    cp = subprocess.run(train_args(tensord_bin, base, data, 2), capture_output=True, text=True, timeout=TIMEOUT)
    assert cp.returncode == 0, cp.stderr
    for v, devices, nd in ((3, "sim:0", 1), (4, "sim:0,sim:1", 2)):
        cp = subprocess.run(mpirun + ["-np", "2"] + train_args(tensord_bin, base, data, v, extra=("--devices", devices)),
                            capture_output=True, text=True, timeout=TIMEOUT)
        assert cp.returncode == 0, cp.stdout + cp.stderr
        assert len(re.findall(LINE % (nd, 2 * nd), cp.stderr)) == 2, cp.stderr  # both ranks
        assert cp.stdout.count("version %d:" % v) == 1, cp.stdout
        assert_same_weights(base, 2, v, f"mpirun, version {v} ({devices} per process)")


def refused(tensord_bin, base, data, envs, devices="sim:0", timeout=60):
    procs = [start(train_args(tensord_bin, base, data, 2, epochs=1, extra=("--devices", devices)), env) for env in envs]
    res = finish(procs, timeout=timeout)
    for rc, out, err in res:
        assert rc != 0, out + err
    assert not (base / "2").exists(), "a version was written by a failed job"
    return [err for _, _, err in res]


def test_rank_out_of_range_is_refused(tensord_bin, setup):
    base, data = setup
    [err] = refused(tensord_bin, base, data, [rank_env(2, 2, free_port())])
    assert "TENSORD_RANK=2 is not below TENSORD_WORLD_SIZE=2" in err, err


@pytest.mark.parametrize("value", ["nohost", "host:0", "host:99999", ":8503"])
def test_a_bad_coordinator_address_is_refused(tensord_bin, setup, value):
    base, data = setup
    [err] = refused(tensord_bin, base, data, [dict(rank_env(1, 2, 1), TENSORD_COORDINATOR=value)])
    assert f"TENSORD_COORDINATOR={value} is not host:port" in err, err


def test_world_sizes_that_differ_are_refused_by_rank_0(tensord_bin, setup):
    base, data = setup
    port = free_port()
    t0 = time.time()
    err0, err1 = refused(tensord_bin, base, data, [rank_env(0, 2, port), rank_env(1, 3, port)])
    assert time.time() - t0 < 25, "the refusal waited for the timeout"
    msg = "rank 1 says TENSORD_WORLD_SIZE=3, rank 0 has TENSORD_WORLD_SIZE=2"
    assert msg in err0 and "refused rank 1" in err0, err0  # rank 0's log
    assert "refused this rank: " + msg in err1, err1


def test_a_rank_joining_twice_is_refused(tensord_bin, setup):
    base, data = setup
    port = free_port()
    errs = refused(tensord_bin, base, data, [rank_env(0, 3, port), rank_env(1, 3, port), rank_env(1, 3, port)])
    assert "rank 1 joined twice" in errs[0], errs[0]
    assert sum("rank 1 joined twice" in e for e in errs[1:]) == 2, errs  # the refused one, and the one rank 0 dropped


def test_an_unreachable_coordinator_times_out(tensord_bin, setup):
    base, data = setup
    t0 = time.time()
    [err] = refused(tensord_bin, base, data, [rank_env(1, 2, free_port(), TENSORD_COORDINATOR_TIMEOUT="1.5")])
    assert time.time() - t0 < 20
    assert "could not reach the coordinator (rank 0) at 127.0.0.1:" in err and "within 1.5 s" in err, err


def test_rank_0_alone_times_out_naming_the_missing_ranks(tensord_bin, setup):
    base, data = setup
    [err] = refused(tensord_bin, base, data, [rank_env(0, 3, free_port(), TENSORD_COORDINATOR_TIMEOUT="1")])
    assert "1 of 3 ranks joined within 1 s" in err and "missing: ranks 1, 2" in err, err


def test_a_killed_rank_stops_the_other_without_a_hang(tensord_bin, setup):
    base, data = setup
    port = free_port()
    args = train_args(tensord_bin, base, data, 5, epochs=100000, batch=8, extra=("--devices", "sim:0"))
    p0, p1 = start(args, rank_env(0, 2, port)), start(args, rank_env(1, 2, port))
    try:
        time.sleep(3.0)  # joined and well into training
        assert p0.poll() is None and p1.poll() is None, "a rank ended early"
        p1.send_signal(signal.SIGKILL)
        p1.wait()
        _, err0 = p0.communicate(timeout=45)
    finally:
        for p in (p0, p1):
            if p.poll() is None:
                p.kill()
                p.wait()
                pytest.fail("rank 0 still running 45 s after rank 1 was killed: the job hung")
    assert p0.returncode != 0
    assert "rank 1" in err0, err0[-2000:]
    assert not (base / "5").exists()


def test_cpu_training_across_processes_needs_mpirun(tensord_bin, setup):
    base, data = setup
    for extra in ((), ("--devices", "cpu")):
        cp = subprocess.run(train_args(tensord_bin, base, data, 2, epochs=1, extra=extra), capture_output=True,
                            text=True, timeout=TIMEOUT, env=rank_env(0, 2, free_port()))
        assert cp.returncode == 1, cp.stdout + cp.stderr
        assert "TENSORD_WORLD_SIZE=2 without mpirun" in cp.stderr and "mpirun -np 2" in cp.stderr, cp.stderr
        assert "Gradients only ever travel through NCCL or MPI" in cp.stderr, cp.stderr
        assert not (base / "2").exists()


def test_processes_with_different_replica_counts_are_refused(tensord_bin, setup):
    base, data = setup
    port = free_port()
    procs = [start(train_args(tensord_bin, base, data, 2, epochs=1, extra=("--devices", d)), rank_env(r, 2, port))
             for r, d in ((0, "sim:0"), (1, "sim:0,sim:1"))]
    res = finish(procs, timeout=60)
    for rc, out, err in res:
        assert rc != 0, out + err
        assert "every process must run the same number of replicas" in err, err
    assert "rank 1 of 2 runs 2 replicas and rank 0 runs 1" in res[1][2], res[1][2]
    assert not (base / "2").exists()
