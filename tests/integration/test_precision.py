"""Precision end to end through the real binary: `tensord bench|predict|evaluate --precision`, a served model's
precision from its model config or its signature.json, refusals that name why (fp16 on this CPU, int8 on a float
model, an unknown name), and `tensord train --precision mixed_bf16` writing a version whose accuracy tracks fp32's.

bf16 cases skip (printing why) on a CPU without AVX512_BF16; the fp16 refusal holds everywhere (no fast fp16 CPU
kernel in this build's oneDNN).
"""
import json
import os
import subprocess
import time

import numpy as np
import pytest
import requests

from conftest import SANITIZER_MARKS
from serving_util import Server, mm_model, write_version

FASHION = "/usr/share/datasets/fashion-mnist"
TIMEOUT = 600


def run(binary, *args):
    cp = subprocess.run([binary, *map(str, args)], capture_output=True, text=True, timeout=TIMEOUT)
    for mark in SANITIZER_MARKS:
        assert mark not in cp.stderr, cp.stderr[-4000:]
    assert cp.returncode >= 0, f"crashed with signal {-cp.returncode}\n{cp.stderr[-4000:]}"
    return cp


def bf16_available():
    flags = open("/proc/cpuinfo").read()
    return " avx512_bf16" in flags or " amx_bf16" in flags


needs_bf16 = pytest.mark.skipif(not bf16_available(), reason="this CPU has no AVX512_BF16 / AMX: bf16 is refused here")


@pytest.fixture(scope="module")
def mlp(tensord_bin, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prec")
    cp = run(tensord_bin, "init", "--arch", "mlp", "--seed", 3, "--out", tmp / "mlp" / "1")
    assert cp.returncode == 0, cp.stderr
    x = np.random.default_rng(0).random((64, 784), dtype=np.float32)
    np.save(tmp / "x.npy", x)
    return {"tmp": tmp, "base": tmp / "mlp", "x": tmp / "x.npy"}


def predict(binary, model, x, out, *extra):
    cp = run(binary, "predict", "--model", model, "--input", f"x={x}", "--output-dir", out, *extra)
    assert cp.returncode == 0, cp.stderr
    files = [f for f in os.listdir(out) if f.endswith(".npy")]
    return np.load(os.path.join(out, files[0]))


@needs_bf16
def test_bench_and_predict_at_bf16(tensord_bin, mlp):
    cp = run(tensord_bin, "bench", "--model", mlp["base"] / "1", "--input", f"x={mlp['x']}", "--iterations", 3,
             "--precision", "bf16")
    assert cp.returncode == 0, cp.stderr
    line = [l for l in cp.stdout.splitlines() if "precision=" in l][0]
    assert "precision=bf16" in line and "steps" in line and "in bf16" in line, line
    p32 = predict(tensord_bin, mlp["base"] / "1", mlp["x"], mlp["tmp"] / "p32")
    p16 = predict(tensord_bin, mlp["base"] / "1", mlp["x"], mlp["tmp"] / "p16", "--precision", "bf16")
    assert p16.dtype == np.float32 and p16.shape == p32.shape
    err = np.abs(p16 - p32).max()
    assert 0 < err < 2e-2, err  # bf16 rounding, not a different model
    assert (p16.argmax(1) == p32.argmax(1)).mean() >= 0.95


@pytest.mark.parametrize("prec,words", [("fp16", ["fp16", "cpu"]), ("int8", ["no quantized ops", "tensord quantize"])])
def test_refused_precisions_name_why(tensord_bin, mlp, prec, words):
    cp = run(tensord_bin, "bench", "--model", mlp["base"] / "1", "--input", f"x={mlp['x']}", "--iterations", 1,
             "--precision", prec)
    assert cp.returncode == 1, cp.stdout
    err = [l for l in cp.stderr.splitlines() if l.startswith("error: ")]
    assert len(err) == 1, cp.stderr
    for w in words:
        assert w in err[0], err[0]


def test_unknown_precision_is_a_usage_error(tensord_bin, mlp):
    cp = run(tensord_bin, "bench", "--model", mlp["base"] / "1", "--input", f"x={mlp['x']}", "--precision", "half")
    assert cp.returncode == 2 and "half" in cp.stderr and "bf16" in cp.stderr, cp.stderr
    cp = run(tensord_bin, "evaluate", "--model-base-path", mlp["base"], "--version", 1, "--data", mlp["x"],
             "--precision", "float8")
    assert cp.returncode == 2 and "float8" in cp.stderr, cp.stderr


def _config(tmp, base, precision):
    path = tmp / f"models-{precision}.config"
    path.write_text('model_config_list { config { name: "m" base_path: "%s" model_platform: "onnx" precision: "%s" } }\n'
                    % (base, precision))
    return path


@needs_bf16
def test_served_precision_from_model_config_and_signature(tensord_bin, tmp_path):
    base = tmp_path / "m"
    write_version(str(base), 1, mm_model(din=64, dout=64, seed=4))
    x = np.random.default_rng(2).standard_normal((32, 64)).astype(np.float32)
    body = {"instances": x.tolist()}
    outs = {}
    for prec in ("fp32", "bf16"):
        (tmp_path / prec).mkdir()
        with Server(tmp_path / prec, config_file=str(_config(tmp_path, base, prec))) as srv:
            r = srv.post_json("/v1/models/m:predict", body)
            assert r.status_code == 200, (r.text, srv.describe())
            outs[prec] = np.array(r.json()["predictions"], np.float32)
    d = np.abs(outs["bf16"] - outs["fp32"]).max()
    assert 0 < d < 0.05 * np.abs(outs["fp32"]).max(), d
    # the same bf16 through the version's signature.json instead of the config
    base2 = tmp_path / "m2"
    write_version(str(base2), 1, mm_model(din=64, dout=64, seed=4), signature={"precision": "bf16"})
    (tmp_path / "sig").mkdir()
    with Server(tmp_path / "sig", base_path=str(base2)) as srv:
        r = srv.post_json("/v1/models/m:predict", body)
        assert r.status_code == 200, (r.text, srv.describe())
        np.testing.assert_array_equal(np.array(r.json()["predictions"], np.float32), outs["bf16"])


@pytest.mark.parametrize("how", ["config", "signature"])
def test_served_version_at_a_refused_precision_fails_to_load_with_the_reason(tensord_bin, tmp_path, how):
    base = tmp_path / "m"
    sig = {"precision": "fp16"} if how == "signature" else None
    write_version(str(base), 1, mm_model(din=8, dout=4), signature=sig)
    kw = {"config_file": str(_config(tmp_path, base, "fp16"))} if how == "config" else {"base_path": str(base)}
    (tmp_path / how).mkdir()
    with Server(tmp_path / how, ready=False, **kw) as srv:
        for _ in range(200):
            st = srv.get("/v1/models/m").json()
            vs = st.get("model_version_status", [])
            if vs and vs[0]["state"] == "END":
                break
            time.sleep(0.05)
        msg = vs[0]["status"]["error_message"]
        assert "fp16" in msg and "cpu" in msg, st
        r = srv.post_json("/v1/models/m:predict", {"instances": [[0.0] * 8]})
        assert r.status_code in (404, 503), r.text


def test_config_rejects_an_unknown_precision(tensord_bin, tmp_path):
    base = tmp_path / "m"
    write_version(str(base), 1, mm_model())
    cp = subprocess.run([tensord_bin, "serve", "--rest_api_port=0", "--port=0", "--admin_port=0",
                         f"--model_config_file={_config(tmp_path, base, 'fp12')}"], capture_output=True, text=True,
                        timeout=60)
    assert cp.returncode != 0 and "fp12" in cp.stderr and "precision" in cp.stderr, cp.stderr


@needs_bf16
def test_mixed_bf16_training_tracks_fp32(tensord_bin, tmp_path):
    """The seed CNN, one epoch on 4,000 Fashion-MNIST images at fp32 and at mixed_bf16 from the same start: both
    learn (accuracy on 2,000 held-out images well above chance), within 2 points of each other, and metrics.json
    records the precision. (The 3-epoch, 60,000-image comparison is bench/precision_accuracy.sh.)"""
    if not os.path.isfile(os.path.join(FASHION, "train-images-idx3-ubyte.gz")):
        pytest.skip("Fashion-MNIST not installed (make deps: dataset-fashion-mnist)")
    import gzip
    with gzip.open(f"{FASHION}/train-images-idx3-ubyte.gz") as f:
        xs = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)[:6000].astype(np.float32) / 255
    with gzip.open(f"{FASHION}/train-labels-idx1-ubyte.gz") as f:
        ys = np.frombuffer(f.read(), np.uint8, offset=8)[:6000].astype(np.int64)
    np.savez(tmp_path / "train.npz", x=xs[:4000], y=ys[:4000])
    np.savez(tmp_path / "test.npz", x=xs[4000:], y=ys[4000:])
    base = tmp_path / "cnn"
    assert run(tensord_bin, "init", "--arch", "cnn", "--seed", 0, "--out", base / "1").returncode == 0
    acc = {}
    for v, prec in ((2, "fp32"), (3, "mixed_bf16")):
        cp = run(tensord_bin, "train", "--model-base-path", base, "--base-version", 1, "--new-version", v, "--data",
                 tmp_path / "train.npz", "--epochs", 1, "--batch-size", 64, "--optimizer", "adam", "--lr", 0.001,
                 "--loss", "sparse_categorical_crossentropy", "--seed", 1, "--precision", prec, "--no-progress")
        assert cp.returncode == 0, cp.stderr
        m = json.load(open(base / str(v) / "metrics.json"))
        assert m["settings"]["precision"] == prec, m["settings"]
        cp = run(tensord_bin, "evaluate", "--model-base-path", base, "--version", v, "--data", tmp_path / "test.npz")
        assert cp.returncode == 0, cp.stderr
        acc[prec] = json.loads(cp.stdout)["accuracy"]
    print(f"one epoch on 4,000 images: fp32 {100 * acc['fp32']:.2f}%, mixed_bf16 {100 * acc['mixed_bf16']:.2f}%")
    assert acc["fp32"] > 0.6 and acc["mixed_bf16"] > 0.6, acc
    assert abs(acc["fp32"] - acc["mixed_bf16"]) < 0.02, acc
    # the two runs differ: bf16 really changed the arithmetic
    w2 = open(base / "2" / "model.onnx", "rb").read()
    w3 = open(base / "3" / "model.onnx", "rb").read()
    assert w2 != w3


@needs_bf16
def test_evaluate_reports_what_bf16_costs(tensord_bin, mlp):
    data = mlp["tmp"] / "eval.npz"
    x = np.random.default_rng(5).random((200, 784), dtype=np.float32)
    np.savez(data, x=x, y=np.arange(200) % 10)
    cp = run(tensord_bin, "evaluate", "--model-base-path", mlp["base"], "--version", 1, "--precision", "bf16",
             "--against", 1, "--data", data)
    assert cp.returncode == 0, cp.stderr
    r = json.loads(cp.stdout)
    assert r["precision"] == "bf16" and r["against"]["precision"] == "fp32", r
    assert r["against"]["agreement"] >= 0.9, r
