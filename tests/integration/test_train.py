"""`tensord train` end to end: the real binary fine-tunes zoo models (`tensord init`) on small npz datasets.

Checked: version N+1 appears complete (model.onnx loads in onnxruntime, metrics.json is sane and the loss
falls, TensorBoard scalars read back with tensorboard's own EventFileLoader); a run stopped by --max-steps and
resumed ends at the same weights as an uninterrupted one (1e-6); 2 replicas at batch B equal 1 replica at
batch B (1e-5, a model without BatchNorm/Dropout); bad input (empty dataset, labels out of range, NaN in the
data, shape mismatch, a full disk via tmpfs and via the TENSORD_TEST_FAIL_WRITE_AFTER hook, a NaN loss) fails
cleanly: exit 1, one `error:` line naming the problem, and no partial version directory in the base path.
"""
import glob
import gzip
import json
import os
import shutil
import subprocess

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from conftest import SANITIZER_MARKS

FASHION = "/usr/share/datasets/fashion-mnist"
TIMEOUT = 600


def run(binary, *args, env=None, timeout=TIMEOUT):
    e = dict(os.environ)
    if env:
        e.update(env)
    cp = subprocess.run([binary, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=e)
    for mark in SANITIZER_MARKS:
        assert mark not in cp.stderr, cp.stderr[-4000:]
    assert cp.returncode >= 0, f"crashed with signal {-cp.returncode}\n{cp.stderr[-4000:]}"
    return cp


def init(binary, base, arch="mlp", opts=("input=16", "hidden=32", "classes=4"), seed=0):
    args = ["init", "--arch", arch, "--seed", seed, "--out", os.path.join(base, "1")]
    for o in opts:
        args += ["--opt", o]
    cp = run(binary, *args)
    assert cp.returncode == 0, cp.stderr


def blobs(path, n=600, d=16, classes=4, seed=0, nan_at=None, labels=None):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    w = np.random.default_rng(1).normal(size=(d, classes))
    y = np.argmax(x @ w, 1).astype(np.int64) if labels is None else labels
    if nan_at is not None:
        x[nan_at, 3] = np.nan
    np.savez(path, x=x, label=y)
    return path


def train(binary, base, data, *extra, env=None):
    args = ["train", "--model-base-path", base, "--data", data, "--batch-size", 32, "--optimizer", "adam", "--lr",
            0.01, "--loss", "sparse_categorical_crossentropy", "--seed", 7, "--no-progress"]
    if "--epochs" not in extra:
        args += ["--epochs", 2]
    return run(binary, *args, *extra, env=env)


def weights(version_dir):
    m = onnx.load(os.path.join(version_dir, "model.onnx"))
    return {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}


def assert_clean_error(cp, *words):
    assert cp.returncode == 1, f"exit {cp.returncode}\n{cp.stderr}"
    lines = [l for l in cp.stderr.splitlines() if l.startswith("error: ")]
    assert lines, cp.stderr
    for w in words:
        assert w in cp.stderr, f"'{w}' not in: {cp.stderr}"


def assert_versions(base, expected):
    """Only complete integer version dirs; no temp dirs left behind."""
    names = os.listdir(base)
    assert not [n for n in names if n.startswith(".tmp-")], names
    got = sorted(int(n) for n in names if n.isdigit())
    assert got == expected, names
    for v in got:
        assert os.path.isfile(os.path.join(base, str(v), "model.onnx")), v


# ---- happy paths ----

def test_train_writes_next_version(tensord_bin, tmp_path):
    base = str(tmp_path / "m")
    init(tensord_bin, base)
    data = blobs(str(tmp_path / "d.npz"))
    cp = train(tensord_bin, base, data, "--epochs", 4, "--val-split", 0.1)
    assert cp.returncode == 0, cp.stderr
    v2 = os.path.join(base, "2")
    assert cp.stdout.splitlines()[0] == v2
    assert_versions(base, [1, 2])
    assert not os.path.exists(os.path.join(base, ".train-2")), "checkpoints of a finished run are removed"

    m = json.load(open(os.path.join(v2, "metrics.json")))
    assert m["base_version"] == 1
    ep = m["epochs"]
    assert [e["epoch"] for e in ep] == [1, 2, 3, 4]
    for e in ep:
        for k in ("loss", "accuracy", "val_loss", "val_accuracy", "learning_rate", "examples_per_sec", "seconds"):
            assert isinstance(e[k], float) or isinstance(e[k], int), (k, e)
        assert 0 <= e["accuracy"] <= 1 and 0 <= e["val_accuracy"] <= 1
    assert ep[-1]["loss"] < ep[0]["loss"] * 0.8, ep
    assert ep[-1]["val_accuracy"] > 0.6, ep
    steps = m["steps"]
    assert len(steps) == 4 * 17 and steps[0]["step"] == 1, len(steps)
    assert np.mean([s["loss"] for s in steps[-10:]]) < np.mean([s["loss"] for s in steps[:10]])
    assert m["settings"]["batch_size"] == 32 and m["settings"]["optimizer"] == "adam"
    assert "x" in m["preprocessing"] and "label" in m["preprocessing"]
    # signature.json: the base's, plus the preprocessing the data went through (so serving and evaluation can
    # apply the same), which the server accepts when it loads the version
    sig = json.load(open(os.path.join(v2, "signature.json")))
    pre = sig.pop("preprocessing")
    assert "x" in pre and "label" in pre, pre
    assert sig == json.load(open(os.path.join(base, "1", "signature.json")))

    # the new version runs in onnxruntime and differs from the base
    s = ort.InferenceSession(os.path.join(v2, "model.onnx"))
    x = np.load(data)["x"][:5]
    p = s.run(None, {"x": x})[0]
    assert p.shape == (5, 4) and np.allclose(p.sum(1), 1, atol=1e-5)
    w1, w2 = weights(os.path.join(base, "1")), weights(v2)
    assert w1.keys() == w2.keys()
    assert any(not np.array_equal(w1[k], w2[k]) for k in w1)

    # TensorBoard reads the scalars back
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    files = glob.glob(os.path.join(base, "logs", "2", "events.out.tfevents.*"))
    assert len(files) == 1, files
    seen = {}
    for ev in EventFileLoader(files[0]).Load():
        for v in ev.summary.value:
            val = v.simple_value if v.HasField("simple_value") else float(np.asarray(v.tensor.float_val)[0])
            seen.setdefault(v.tag, []).append((ev.step, val))
    for tag in ("loss", "accuracy", "val_loss", "val_accuracy", "learning_rate", "examples_per_sec"):
        assert [st for st, _ in seen[tag]] == [1, 2, 3, 4], (tag, seen.get(tag))
    assert abs(seen["loss"][-1][1] - ep[-1]["loss"]) < 1e-5

    # a second run on top of version 2 writes version 3
    cp = train(tensord_bin, base, data, "--epochs", 1)
    assert cp.returncode == 0, cp.stderr
    assert_versions(base, [1, 2, 3])
    assert json.load(open(os.path.join(base, "3", "metrics.json")))["base_version"] == 2


def test_version_names_follow_the_bundle_rule(tensord_bin, tmp_path):
    """Names the server ignores are not versions for the trainer either (engine/bundle.c's one rule): with 1/ and
    a stray 007/ (and other non-version names) in the base path, training bases on 1 and writes 2 (a scan that
    read "007" as 7 would base on 7/, which does not exist, or write 8)."""
    base = str(tmp_path / "m")
    init(tensord_bin, base)
    for name in ("007", "+5", "3.bak", ".tmp-9-1"):
        os.mkdir(os.path.join(base, name))
    shutil.copy(os.path.join(base, "1", "model.onnx"), os.path.join(base, "007", "model.onnx"))
    data = blobs(str(tmp_path / "d.npz"))
    cp = train(tensord_bin, base, data, "--epochs", 1)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.splitlines()[0] == os.path.join(base, "2"), cp.stdout
    assert json.load(open(os.path.join(base, "2", "metrics.json")))["base_version"] == 1
    assert sorted(os.listdir(base)) == sorted(["1", "2", "007", "+5", "3.bak", ".tmp-9-1", "logs"]), os.listdir(base)
    assert os.listdir(os.path.join(base, "007")) == ["model.onnx"], "the stray directory is left alone"
    # a plain file with a version name is not a version either: the next run bases on 2 and writes 3
    with open(os.path.join(base, "12"), "w") as f:
        f.write("a file, not a version directory")
    cp = train(tensord_bin, base, data, "--epochs", 1)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.splitlines()[0] == os.path.join(base, "3"), cp.stdout
    assert json.load(open(os.path.join(base, "3", "metrics.json")))["base_version"] == 2


def test_resume_equals_uninterrupted(tensord_bin, tmp_path):
    data = blobs(str(tmp_path / "d.npz"))
    a, b, c = (str(tmp_path / n) for n in "abc")
    for base in (a, c):
        init(tensord_bin, base)
    # a: stopped after 23 updates (mid epoch 2); its checkpoint is left in .train-2
    cp = train(tensord_bin, a, data, "--epochs", 3, "--max-steps", 23, "--val-split", 0.1)
    assert cp.returncode == 0, cp.stderr
    assert json.load(open(os.path.join(a, "2", "metrics.json")))["steps_run"] == 23
    ck = os.path.join(a, ".train-2")
    assert os.path.isfile(os.path.join(ck, "ckpt-23.bin")), os.listdir(ck)
    # b: the base version plus a's checkpoints, resumed
    os.makedirs(b)
    shutil.copytree(os.path.join(a, "1"), os.path.join(b, "1"))
    shutil.copytree(ck, os.path.join(b, ".train-2"))
    cp = train(tensord_bin, b, data, "--epochs", 3, "--val-split", 0.1, "--resume")
    assert cp.returncode == 0, cp.stderr
    # c: uninterrupted
    cp = train(tensord_bin, c, data, "--epochs", 3, "--val-split", 0.1)
    assert cp.returncode == 0, cp.stderr
    wb, wc = weights(os.path.join(b, "2")), weights(os.path.join(c, "2"))
    for k in wc:
        assert np.max(np.abs(wb[k] - wc[k])) <= 1e-6, k
    mb = json.load(open(os.path.join(b, "2", "metrics.json")))
    mc = json.load(open(os.path.join(c, "2", "metrics.json")))
    assert [s["loss"] for s in mb["steps"]] == pytest.approx([s["loss"] for s in mc["steps"]], abs=1e-6)
    assert len(mb["epochs"]) == 3


def test_replicas_match_single(tensord_bin, tmp_path):
    data = blobs(str(tmp_path / "d.npz"))
    out = []
    for r in (1, 2):
        base = str(tmp_path / f"r{r}")
        init(tensord_bin, base)
        cp = run(tensord_bin, "train", "--model-base-path", base, "--data", data, "--epochs", 2, "--batch-size", 32,
                 "--optimizer", "sgd", "--lr", 0.1, "--momentum", 0.9, "--loss", "sparse_categorical_crossentropy",
                 "--seed", 3, "--replicas", r, "--threads", 1, "--no-progress")
        assert cp.returncode == 0, cp.stderr
        out.append(weights(os.path.join(base, "2")))
    for k in out[0]:
        assert np.max(np.abs(out[0][k] - out[1][k])) <= 1e-5, k


def test_cnn_on_fashion_slice(tensord_bin, tmp_path):
    if not os.path.isfile(os.path.join(FASHION, "train-images-idx3-ubyte.gz")):
        pytest.skip("Fashion-MNIST not installed (make deps: dataset-fashion-mnist)")
    with gzip.open(os.path.join(FASHION, "train-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)[:2000]
    with gzip.open(os.path.join(FASHION, "train-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)[:2000]
    data = str(tmp_path / "fashion2k.npz")
    np.savez(data, x=x, y=y)  # uint8 images, uint8 labels: the trainer converts and reshapes to [N,1,28,28]
    base = str(tmp_path / "cnn")
    init(tensord_bin, base, arch="cnn", opts=("filters=8",))
    cp = run(tensord_bin, "train", "--model-base-path", base, "--data", data, "--epochs", 1, "--batch-size", 64,
             "--optimizer", "adam", "--lr", 0.001, "--loss", "sparse_categorical_crossentropy", "--val-split", 0.1,
             "--no-progress")
    assert cp.returncode == 0, cp.stderr
    m = json.load(open(os.path.join(base, "2", "metrics.json")))
    losses = [s["loss"] for s in m["steps"]]
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) * 0.8, losses
    s = ort.InferenceSession(os.path.join(base, "2", "model.onnx"))
    p = s.run(None, {"x": (x[:200].astype(np.float32) / 255).reshape(-1, 1, 28, 28)})[0]
    assert (p.argmax(1) == y[:200]).mean() > 0.5


# ---- bad input ----

def test_empty_dataset(tensord_bin, tmp_path):
    base = str(tmp_path / "m")
    init(tensord_bin, base)
    data = str(tmp_path / "empty.npz")
    np.savez(data, x=np.zeros((0, 16), np.float32), label=np.zeros((0,), np.int64))
    assert_clean_error(train(tensord_bin, base, data), "empty")
    assert_versions(base, [1])


def test_labels_out_of_range(tensord_bin, tmp_path):
    base = str(tmp_path / "m")
    init(tensord_bin, base)
    y = np.zeros(100, np.int64)
    y[42] = 7
    data = blobs(str(tmp_path / "d.npz"), n=100, labels=y)
    assert_clean_error(train(tensord_bin, base, data), "label 7", "example 42", "4 classes")
    assert_versions(base, [1])


def test_nan_in_data(tensord_bin, tmp_path):
    base = str(tmp_path / "m")
    init(tensord_bin, base)
    data = blobs(str(tmp_path / "d.npz"), nan_at=17)
    assert_clean_error(train(tensord_bin, base, data), "17")
    assert_versions(base, [1])


def test_shape_mismatch(tensord_bin, tmp_path):
    base = str(tmp_path / "m")
    init(tensord_bin, base)
    data = blobs(str(tmp_path / "d.npz"), d=15)
    cp = train(tensord_bin, base, data)
    assert_clean_error(cp, "15", "16")
    assert_versions(base, [1])


def test_nan_loss_stops_with_epoch_and_step(tensord_bin, tmp_path):
    base = str(tmp_path / "m")
    init(tensord_bin, base)
    data = blobs(str(tmp_path / "d.npz"))
    cp = run(tensord_bin, "train", "--model-base-path", base, "--data", data, "--epochs", 2, "--batch-size", 32,
             "--optimizer", "sgd", "--lr", 1e30, "--loss", "sparse_categorical_crossentropy", "--no-progress")
    assert_clean_error(cp, "epoch 1 step")
    assert_versions(base, [1])


def test_write_failure_hook(tensord_bin, tmp_path):
    """TENSORD_TEST_FAIL_WRITE_AFTER=0: the first file the trainer writes itself (metrics.json, after model.onnx)
    fails with ENOSPC; the temp version dir (already holding model.onnx) must vanish."""
    base = str(tmp_path / "m")
    init(tensord_bin, base)
    data = blobs(str(tmp_path / "d.npz"))
    cp = train(tensord_bin, base, data, "--epochs", 1, env={"TENSORD_TEST_FAIL_WRITE_AFTER": "0"})
    assert_clean_error(cp, "metrics.json", "No space left on device")
    assert_versions(base, [1])


def test_disk_full_tmpfs(tensord_bin, tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        # a model whose next version cannot fit: ~100 KB of weights on a 256 KB filesystem holding 1 already
        base = str(mnt / "m")
        init(tensord_bin, base, opts=("input=16", "hidden=1500", "classes=4"))
        data = blobs(str(tmp_path / "d.npz"), n=64)
        cp = train(tensord_bin, base, data, "--epochs", 1)
        assert_clean_error(cp, "No space left on device")
        assert str(mnt) in cp.stderr, cp.stderr  # names the file
        assert_versions(base, [1])
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_keep_best_and_checkpoint_every(tensord_bin, tmp_path):
    base = str(tmp_path / "m")
    init(tensord_bin, base)
    data = blobs(str(tmp_path / "d.npz"))
    cp = train(tensord_bin, base, data, "--epochs", 3, "--val-split", 0.2, "--keep-best", "--checkpoint-every", 5,
               "--max-steps", 12)
    assert cp.returncode == 0, cp.stderr
    m = json.load(open(os.path.join(base, "2", "metrics.json")))
    vl = [e["val_loss"] for e in m["epochs"]]
    assert m["best_epoch"] == int(np.argmin(vl)) + 1, (m["best_epoch"], vl)
    # periodic checkpoints are pruned to the newest two; the max-steps stop leaves one at step 12
    ck = sorted(os.listdir(os.path.join(base, ".train-2")))
    assert ck == ["ckpt-10.bin", "ckpt-12.bin"], ck


def test_trained_version_is_served(tensord_bin, tmp_path):
    """The version tensord train writes (with preprocessing in signature.json) loads in `tensord serve` and
    answers predict with the same outputs as onnxruntime on the written model.onnx."""
    import serving_util as su

    base = str(tmp_path / "m")
    init(tensord_bin, base)
    data = blobs(str(tmp_path / "d.npz"))
    cp = train(tensord_bin, base, data, "--epochs", 1, "--val-split", 0.1)
    assert cp.returncode == 0, cp.stderr
    x = np.load(data)["x"][:3]
    want = ort.InferenceSession(os.path.join(base, "2", "model.onnx")).run(None, {"x": x})[0]
    with su.Server(tmp_path, base_path=base) as s:
        st = s.get("/v1/models/m").json()
        assert st["model_version_status"][0]["version"] == "2", st
        assert st["model_version_status"][0]["state"] == "AVAILABLE", st
        r = s.post_json("/v1/models/m:predict", {"instances": x.tolist()})
        assert r.status_code == 200, r.text
        su.assert_close(np.array(r.json()["predictions"], np.float32), want, "served predictions")


def test_early_stopping_and_keep_best(tensord_bin, tmp_path):
    """Validation data whose labels are noise: the model gets more confidently wrong on it every epoch, so val_loss
    rises after the first epochs; with patience 2 the run stops long before 40 epochs, and --keep-best writes the
    weights of the epoch with the lowest val_loss."""
    base = str(tmp_path / "m")
    init(tensord_bin, base)
    data = blobs(str(tmp_path / "d.npz"))
    noise = np.random.default_rng(3).integers(0, 4, size=200).astype(np.int64)
    val = blobs(str(tmp_path / "v.npz"), n=200, seed=5, labels=noise)
    cp = train(tensord_bin, base, data, "--epochs", 40, "--val-data", val, "--early-stopping-patience", 2,
               "--monitor", "val_loss", "--keep-best")
    assert cp.returncode == 0, cp.stderr
    ep = json.load(open(os.path.join(base, "2", "metrics.json")))["epochs"]
    assert 3 <= len(ep) < 40, f"early stopping did not stop the run: {len(ep)} epochs"
    vl = [e["val_loss"] for e in ep]
    best = int(np.argmin(vl))
    assert best == len(ep) - 3, f"stopped {len(ep) - 1 - best} epochs after the best, patience is 2: {vl}"
    # the written weights are the best epoch's: evaluating them gives the best val_loss
    v = np.load(val)
    p = ort.InferenceSession(os.path.join(base, "2", "model.onnx")).run(None, {"x": v["x"]})[0]
    loss = float(-np.mean(np.log(np.clip(p[np.arange(len(noise)), noise], 1e-7, 1))))
    assert abs(loss - vl[best]) <= 1e-3 * max(1.0, vl[best]), (loss, vl)


def test_two_tower_binary_crossentropy(tensord_bin, tmp_path):
    """The two-tower recommender trains with binary cross-entropy on (user, item) -> clicked data and its loss falls."""
    base = str(tmp_path / "rec")
    cp = run(tensord_bin, "init", "--arch", "two-tower", "--opt", "users=50", "--opt", "items=40", "--opt", "dim=8",
             "--out", os.path.join(base, "1"))
    assert cp.returncode == 0, cp.stderr
    rng = np.random.default_rng(0)
    u = rng.integers(0, 50, 3000).astype(np.int64)
    i = rng.integers(0, 40, 3000).astype(np.int64)
    label = ((u % 2) == (i % 2)).astype(np.float32).reshape(-1, 1)  # users like items of their parity
    path = str(tmp_path / "clicks.npz")
    np.savez(path, user=u, item=i, label=label)
    cp = run(tensord_bin, "train", "--model-base-path", base, "--data", path, "--epochs", 8, "--batch-size", 64,
             "--optimizer", "adam", "--lr", 0.05, "--loss", "binary_crossentropy", "--val-split", 0.1, "--seed", 1,
             "--no-progress")
    assert cp.returncode == 0, cp.stderr
    ep = json.load(open(os.path.join(base, "2", "metrics.json")))["epochs"]
    assert ep[-1]["loss"] < 0.5 * ep[0]["loss"], ep
    assert ep[-1]["val_accuracy"] > 0.9, ep


def test_trained_version_keeps_labels_and_warmup(tensord_bin, tmp_path):
    """The base version's labels_file (named in its signature.json) and assets.extra/warmup.jsonl are copied into
    the version tensord train writes, so it loads and warms up like the base (before, the new version's
    signature.json named a labels file that was not there)."""
    import serving_util as su

    base = str(tmp_path / "m")
    init(tensord_bin, base)
    v1 = os.path.join(base, "1")
    sig_path = os.path.join(v1, "signature.json")
    sig = json.load(open(sig_path)) if os.path.exists(sig_path) else {}
    sig["labels_file"] = "classes.txt"
    with open(sig_path, "w") as f:
        json.dump(sig, f)
    labels = "north\neast\nsouth\nwest\n"
    with open(os.path.join(v1, "classes.txt"), "w") as f:
        f.write(labels)
    os.makedirs(os.path.join(v1, "assets.extra"))
    warm = json.dumps({"instances": np.zeros((2, 16), np.float32).tolist()}) + "\n"
    with open(os.path.join(v1, "assets.extra", "warmup.jsonl"), "w") as f:
        f.write(warm)
    data = blobs(str(tmp_path / "d.npz"))
    cp = train(tensord_bin, base, data, "--epochs", 1)
    assert cp.returncode == 0, cp.stderr
    v2 = os.path.join(base, "2")
    assert open(os.path.join(v2, "classes.txt")).read() == labels
    assert open(os.path.join(v2, "assets.extra", "warmup.jsonl")).read() == warm
    assert json.load(open(os.path.join(v2, "signature.json"))).get("labels_file") == "classes.txt"
    assert not glob.glob(os.path.join(base, ".tmp-*")), os.listdir(base)
    with su.Server(tmp_path, base_path=base) as s:
        st = s.get("/v1/models/m").json()["model_version_status"][0]
        assert st["version"] == "2" and st["state"] == "AVAILABLE", st
