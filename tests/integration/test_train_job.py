"""`tensord train --job FILE`: the worker the server's job queue runs, driven as the queue drives it.

The real binary trains the seed CNN (`tensord init --arch cnn`) on 512 Fashion-MNIST examples (Debian's
dataset-fashion-mnist, read here with numpy into an .npz). Checked: stdout is only the protocol (every line strict
JSON: NaN must be null), start -> step... -> epoch ... -> done in order with the steps counting up, the last step of
every epoch sent, the epoch lines equal to metrics.json; version new_version appears complete and nothing else is
left in the base path; SIGTERM mid-run -> exit 3, {"event":"cancelled"} last, no version, the checkpoint directory
kept; kill -9 after a checkpoint, then the same job with "resume": true completes from it; bad job files (unknown
key, wrong type, an existing new_version, mixed_fp16 on the CPU, a CUDA device, ...) -> exit 1 and one error line naming
the field, with nothing written; --job with other options is a usage error (exit 2).
"""
import copy
import glob
import gzip
import json
import os
import signal
import subprocess

import numpy as np
import pytest

from conftest import SANITIZER_MARKS

FASHION = "/usr/share/datasets/fashion-mnist"
TIMEOUT = 120


def strict_json(line):
    def no_constants(name):
        raise ValueError(f"non-standard JSON constant {name} in {line!r}")
    return json.loads(line, parse_constant=no_constants)


def idx(path):
    b = gzip.open(path).read()
    nd = b[3]
    dims = [int.from_bytes(b[4 + 4 * i:8 + 4 * i], "big") for i in range(nd)]
    return np.frombuffer(b, np.uint8, offset=4 + 4 * nd).reshape(dims)


@pytest.fixture(scope="module")
def fashion_npz(tmp_path_factory):
    """512 training examples as x [512, 28, 28] float32 in [0, 1] and label int64 (engine/data/data.h's NPZ)."""
    path = str(tmp_path_factory.mktemp("data") / "fashion512.npz")
    x = idx(os.path.join(FASHION, "train-images-idx3-ubyte.gz"))[:512].astype(np.float32) / 255
    y = idx(os.path.join(FASHION, "train-labels-idx1-ubyte.gz"))[:512].astype(np.int64)
    np.savez(path, x=x, label=y)
    return path


@pytest.fixture
def base(tensord_bin, tmp_path):
    """A bundle with the seed CNN as version 1."""
    b = str(tmp_path / "models" / "fm")
    cp = subprocess.run([tensord_bin, "init", "--arch", "cnn", "--seed", "1", "--out", os.path.join(b, "1")],
                        capture_output=True, text=True, timeout=TIMEOUT)
    assert cp.returncode == 0, cp.stderr
    return b


def make_job(base, data, **over):
    job = {"job_id": 7, "model_base_path": base, "base_version": 1, "new_version": 5, "data_files": [data],
           "val_split": 0.125, "epochs": 2, "batch_size": 32, "optimizer": "adam", "learning_rate": 0.001,
           "schedule": {"kind": "constant"}, "loss": "sparse_categorical_crossentropy",
           "early_stopping": {"patience": 5, "monitor": "val_loss"}, "threads": 1, "replicas": 1,
           "precision": "fp32", "devices": ["cpu"], "seed": 3, "resume": False, "checkpoint_every": 4}
    job.update(over)
    return job


def write_job(tmp_path, job, name="job.json"):
    path = str(tmp_path / name)
    with open(path, "w") as f:
        f.write(job if isinstance(job, str) else json.dumps(job))
    return path


def check_stderr(stderr):
    for mark in SANITIZER_MARKS:
        assert mark not in stderr, stderr[-4000:]


def run_job(binary, path):
    cp = subprocess.run([binary, "train", "--job", path], capture_output=True, text=True, timeout=TIMEOUT)
    check_stderr(cp.stderr)
    assert cp.returncode >= 0, f"crashed with signal {-cp.returncode}\n{cp.stderr[-4000:]}"
    return cp, [strict_json(l) for l in cp.stdout.splitlines()]


class Worker:
    """A running `tensord train --job`, read line by line as the server reads it through a pipe."""

    def __init__(self, binary, path):
        self.p = subprocess.Popen([binary, "train", "--job", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, bufsize=1)
        self.events = []

    def until(self, pred):
        """Read events until pred(event) holds; returns that event (fails if the stream ends first)."""
        for line in self.p.stdout:
            ev = strict_json(line)
            self.events.append(ev)
            if pred(ev):
                return ev
        self.p.wait(timeout=TIMEOUT)
        pytest.fail(f"stream ended (exit {self.p.returncode}) before the awaited event: {self.events[-3:]}\n"
                    f"{self.p.stderr.read()[-4000:]}")

    def finish(self):
        out, err = self.p.communicate(timeout=TIMEOUT)
        check_stderr(err)
        self.events += [strict_json(l) for l in out.splitlines()]
        return self.p.returncode, err


def entries(base):
    return sorted(os.listdir(base))


# ---- the happy path ----

def test_job_streams_progress_and_writes_new_version(tensord_bin, base, fashion_npz, tmp_path):
    cp, ev = run_job(tensord_bin, write_job(tmp_path, make_job(base, fashion_npz)))
    assert cp.returncode == 0, cp.stderr
    kinds = [e["event"] for e in ev]
    assert kinds[0] == "start" and kinds[-1] == "done", kinds
    assert set(kinds) == {"start", "step", "epoch", "done"}, kinds

    start = ev[0]
    assert start == {"event": "start", "job_id": 7, "epochs": 2, "steps_per_epoch": 14, "examples": 448,
                     "val_examples": 64, "new_version": 5, "resumed_from_step": 0}, start

    # steps count up, epoch lines close each epoch, and the last step of every epoch is sent
    steps = [e for e in ev if e["event"] == "step"]
    g = [s["global_step"] for s in steps]
    assert g == sorted(set(g)) and g[0] == 1 and g[-1] == 28, g
    for s in steps:
        assert s["global_step"] == (s["epoch"] - 1) * 14 + s["step"], s
        assert s["epochs"] == 2 and s["steps_per_epoch"] == 14, s
        assert s["loss"] > 0 and 0 <= s["accuracy"] <= 1, s
        assert s["examples_per_sec"] > 0 and s["eta_s"] >= 0 and s["learning_rate"] == 0.001, s
    assert [(s["epoch"], s["step"]) for s in steps if s["step"] in (1, 14)] == [(1, 1), (1, 14), (2, 1), (2, 14)]
    epochs = [e for e in ev if e["event"] == "epoch"]
    assert [e["epoch"] for e in epochs] == [1, 2]
    for i, e in enumerate(kinds):
        if e == "epoch":  # after its epoch's last step, before the next epoch's first
            assert ev[i - 1]["event"] == "step" and ev[i - 1]["step"] == 14 and ev[i - 1]["epoch"] == ev[i]["epoch"]

    # the version, and the numbers the lines carried are the ones metrics.json keeps
    v5 = os.path.join(base, "5")
    done = ev[-1]
    assert done["version"] == 5 and done["path"] == v5 and done["epochs_run"] == 2 and done["steps"] == 28, done
    m = json.load(open(os.path.join(v5, "metrics.json")))
    assert m["base_version"] == 1 and m["steps_run"] == 28
    for line, rec in zip(epochs, m["epochs"]):
        for k in ("loss", "accuracy", "val_loss", "val_accuracy"):
            assert line[k] == rec[k], (k, line, rec)
    for k in ("loss", "accuracy", "val_loss", "val_accuracy"):
        assert done[k] == m["epochs"][-1][k], k
    assert epochs[-1]["loss"] < epochs[0]["loss"], epochs
    assert os.path.isfile(os.path.join(v5, "model.onnx"))
    assert entries(base) == ["1", "5", "logs"], entries(base)
    assert os.listdir(os.path.join(base, "logs")) == ["5"]


def test_job_on_device_replicas_trains_as_on_the_cpu(tensord_bin, base, fashion_npz, tmp_path):
    """A job file's "devices" reach the trainer: the same job on two sim devices (the admin API's "devices": device-
    resident replicas, their gradients all-reduced on the devices) ends at the weights of two CPU replicas."""
    cp, ev = run_job(tensord_bin, write_job(tmp_path, make_job(base, fashion_npz, replicas=2, new_version=5)))
    assert cp.returncode == 0 and ev[-1]["event"] == "done", cp.stderr
    cp, ev = run_job(tensord_bin, write_job(tmp_path, make_job(base, fashion_npz, devices=["sim:0", "sim:1"],
                                                               new_version=6), "job2.json"))
    assert cp.returncode == 0 and ev[-1]["event"] == "done", cp.stderr
    assert "plan on sim:1" in cp.stderr, cp.stderr
    import onnx
    from onnx import numpy_helper
    w = [{i.name: numpy_helper.to_array(i) for i in onnx.load(os.path.join(base, v, "model.onnx")).graph.initializer}
         for v in ("5", "6")]
    for k in w[0]:
        assert np.abs(w[0][k] - w[1][k]).max() <= 1e-5 * max(1.0, float(np.abs(w[0][k]).max())), k


def test_job_without_validation_writes_null_not_nan(tensord_bin, base, fashion_npz, tmp_path):
    job = make_job(base, fashion_npz, epochs=1, new_version=2)
    del job["val_split"], job["early_stopping"]
    cp, ev = run_job(tensord_bin, write_job(tmp_path, job))  # strict_json refuses NaN
    assert cp.returncode == 0, cp.stderr
    assert ev[0]["val_examples"] == 0
    epoch = [e for e in ev if e["event"] == "epoch"][0]
    assert epoch["val_loss"] is None and epoch["val_accuracy"] is None, epoch
    assert ev[-1]["val_loss"] is None and ev[-1]["version"] == 2
    assert entries(base) == ["1", "2", "logs"]


def test_job_loss_scale_reaches_the_trainer(tensord_bin, base, fashion_npz, tmp_path):
    """"loss_scale" as a number (a fixed scale) and as "dynamic": the done line and metrics.json carry the scale and
    the skipped-step count; nothing overflows here, so no step is skipped."""
    for v, ls, want, mode in ((2, 1024, 1024, "fixed"), (3, "dynamic", 32768, "dynamic")):
        job = make_job(base, fashion_npz, epochs=1, new_version=v, loss_scale=ls, loss_scale_growth_steps=1000)
        cp, ev = run_job(tensord_bin, write_job(tmp_path, job))
        assert cp.returncode == 0, cp.stderr
        done = ev[-1]
        assert done["event"] == "done" and done["loss_scale"] == want and done["skipped_steps"] == 0, done
        m = json.load(open(os.path.join(base, str(v), "metrics.json")))
        assert m["settings"]["loss_scale"] == mode, m["settings"]
        assert m["loss_scaling"] == {"final_scale": want, "skipped_steps": 0, "growth_steps": 1000}, m["loss_scaling"]


# ---- cancel and resume ----

def test_sigterm_cancels_without_a_version(tensord_bin, base, fashion_npz, tmp_path):
    job = make_job(base, fashion_npz, epochs=200, checkpoint_every=2)
    del job["early_stopping"]  # the run must still be going when the signal comes
    w = Worker(tensord_bin, write_job(tmp_path, job))
    w.until(lambda e: e["event"] == "step" and e["global_step"] >= 2)  # a checkpoint is on disk
    w.p.send_signal(signal.SIGTERM)
    rc, err = w.finish()
    assert rc == 3, err
    assert w.events[-1] == {"event": "cancelled"}, w.events[-3:]
    assert [e["event"] for e in w.events[:-1]].count("done") == 0
    assert not os.path.exists(os.path.join(base, "5")), "no version after a cancel"
    assert not [n for n in entries(base) if n.startswith(".tmp-")], entries(base)
    ck = glob.glob(os.path.join(base, ".train-5", "ckpt-*.bin"))
    assert ck, "the checkpoint directory is kept for the caller"
    last_step = max(e["global_step"] for e in w.events if e["event"] == "step")
    assert last_step < 200 * 14


def test_kill9_then_resume_continues_from_the_checkpoint(tensord_bin, base, fashion_npz, tmp_path):
    job = make_job(base, fashion_npz, epochs=30, checkpoint_every=5)
    del job["early_stopping"]  # all 30 epochs run, whatever the validation loss does
    path = write_job(tmp_path, job)
    w = Worker(tensord_bin, path)
    w.until(lambda e: e["event"] == "step" and e["global_step"] >= 5)
    w.p.kill()
    w.finish()
    assert w.p.returncode == -signal.SIGKILL
    assert not os.path.exists(os.path.join(base, "5")), "killed before the end: no version"
    saved = [int(os.path.basename(p)[5:-4]) for p in glob.glob(os.path.join(base, ".train-5", "ckpt-*.bin"))]
    assert saved, os.listdir(base)

    job["resume"] = True
    cp, ev = run_job(tensord_bin, write_job(tmp_path, job, "resume.json"))
    assert cp.returncode == 0, cp.stderr
    start = ev[0]
    assert start["event"] == "start" and start["resumed_from_step"] == max(saved) > 0, (start, saved)
    steps = [e["global_step"] for e in ev if e["event"] == "step"]
    assert steps[0] == max(saved) + 1 and steps[-1] == 30 * 14, steps
    assert ev[-1]["event"] == "done" and ev[-1]["steps"] == 30 * 14 and ev[-1]["version"] == 5
    assert json.load(open(os.path.join(base, "5", "metrics.json")))["steps_run"] == 30 * 14
    assert entries(base) == ["1", "5", "logs"], entries(base)


# ---- bad job files ----

def _without(key):
    def f(job):
        del job[key]
    return f


BAD = [
    ("unknown_key", lambda j: j.update(learning_rte=0.1), "learning_rte"),
    ("unknown_nested_key", lambda j: j["schedule"].update(gama=0.5), "schedule.gama"),
    ("wrong_type", lambda j: j.update(epochs="2"), "epochs"),
    ("not_an_integer", lambda j: j.update(batch_size=32.5), "batch_size"),
    ("nested_wrong_type", lambda j: j["early_stopping"].update(patience=True), "early_stopping.patience"),
    ("file_not_a_string", lambda j: j.update(data_files=[j["data_files"][0], 3]), "data_files[1]"),
    ("missing_field", _without("new_version"), "new_version"),
    ("existing_new_version", lambda j: j.update(new_version=1), "new_version"),
    ("out_of_range", lambda j: j.update(epochs=0), "epochs"),
    ("unknown_optimizer", lambda j: j.update(optimizer="lion"), "optimizer"),
    ("mixed_fp16", lambda j: j.update(precision="mixed_fp16"), "fp16"),
    ("cuda_device", lambda j: j.update(devices=["cuda:0"]), "devices"),
    ("bad_loss_scale", lambda j: j.update(loss_scale="huge"), "loss_scale"),
    ("loss_scale_wrong_type", lambda j: j.update(loss_scale=True), "loss_scale"),
    ("loss_scale_growth_zero", lambda j: j.update(loss_scale_growth_steps=0), "loss_scale_growth_steps"),
    ("duplicate_key", None, "epochs"),
    ("not_json", None, "not valid JSON"),
]


@pytest.mark.parametrize("name,change,field", BAD, ids=[b[0] for b in BAD])
def test_bad_job_file_names_the_field(tensord_bin, base, fashion_npz, tmp_path, name, change, field):
    job = make_job(base, fashion_npz)
    if name == "duplicate_key":
        text = json.dumps(job)[:-1] + ', "epochs": 3}'
    elif name == "not_json":
        text = json.dumps(job)[:-1]
    else:
        change(job)
        text = job
    cp, ev = run_job(tensord_bin, write_job(tmp_path, text))
    assert cp.returncode == 1, (cp.returncode, cp.stdout, cp.stderr)
    assert len(ev) == 1 and ev[0]["event"] == "error", ev
    msg = ev[0]["message"]
    assert field in msg, msg
    if name == "mixed_fp16":  # no fast fp16 on the CPU backend: refused before anything is written
        assert "cpu" in msg and "fp16" in msg, msg
    if name == "cuda_device":
        assert "CUDA" in msg and "cuda:0" in msg, msg
    if name == "existing_new_version":
        assert os.path.join(base, "1") in msg, msg
    assert entries(base) == ["1"], "nothing written for a refused job"


def test_job_with_other_options_is_a_usage_error(tensord_bin, base, fashion_npz, tmp_path):
    path = write_job(tmp_path, make_job(base, fashion_npz))
    cp = subprocess.run([tensord_bin, "train", "--job", path, "--epochs", "3"], capture_output=True, text=True,
                        timeout=TIMEOUT)
    assert cp.returncode == 2 and cp.stdout == "", (cp.returncode, cp.stdout)
    assert "--job" in cp.stderr
    cp = subprocess.run([tensord_bin, "train", "--job", str(tmp_path / "missing.json")], capture_output=True,
                        text=True, timeout=TIMEOUT)
    assert cp.returncode == 1
    ev = [strict_json(l) for l in cp.stdout.splitlines()]
    assert len(ev) == 1 and ev[0]["event"] == "error" and "missing.json" in ev[0]["message"], ev
