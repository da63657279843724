"""`tensord evaluate` (and `tensord quantize`) end to end: the real binary on the seed CNN trained briefly on
Fashion-MNIST, checked against numpy computations on `tensord predict` outputs and against onnxruntime.
"""
import gzip
import json
import os
import subprocess

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from conftest import SANITIZER_MARKS

FASHION = "/usr/share/datasets/fashion-mnist"
TEST_FILES = f"{FASHION}/t10k-images-idx3-ubyte.gz,{FASHION}/t10k-labels-idx1-ubyte.gz"
TIMEOUT = 600


def run(binary, *args, timeout=TIMEOUT):
    cp = subprocess.run([binary, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    for mark in SANITIZER_MARKS:
        assert mark not in cp.stderr, cp.stderr[-4000:]
    assert cp.returncode >= 0, f"crashed with signal {-cp.returncode}\n{cp.stderr[-4000:]}"
    return cp


def assert_clean_error(cp, *words):
    assert cp.returncode == 1, f"exit {cp.returncode}\n{cp.stderr}\n{cp.stdout}"
    lines = [l for l in cp.stderr.splitlines() if l.startswith("error: ")]
    assert len(lines) == 1, cp.stderr
    for w in words:
        assert w.lower() in lines[0].lower(), f"{w!r} not in {lines[0]!r}"


def idx(name):
    with gzip.open(os.path.join(FASHION, name)) as f:
        raw = f.read()
    if "labels" in name:
        return np.frombuffer(raw, np.uint8, offset=8)
    return np.frombuffer(raw, np.uint8, offset=16).reshape(-1, 28, 28)


def predict(binary, model, feeds, tmp):
    tmp.mkdir(parents=True, exist_ok=True)
    cmd = ["predict", "--model", model, "--output-dir", tmp, "--threads", 4]
    for k, v in feeds.items():
        np.save(tmp / f"{k}.npy", v)
        cmd += ["--input", f"{k}={tmp / (k + '.npy')}"]
    cp = run(binary, *cmd)
    assert cp.returncode == 0, cp.stderr
    outs = [f for f in os.listdir(tmp) if f.endswith(".npy") and f[:-4] not in feeds]
    assert len(outs) == 1, outs
    return np.load(tmp / outs[0])


def versions(base):
    return sorted(int(d) for d in os.listdir(base) if d.isdigit())


@pytest.fixture(scope="module")
def fashion():
    if not os.path.isfile(os.path.join(FASHION, "t10k-images-idx3-ubyte.gz")):
        pytest.skip("Fashion-MNIST not installed (make deps: dataset-fashion-mnist)")
    return {"xtr": idx("train-images-idx3-ubyte.gz"), "ytr": idx("train-labels-idx1-ubyte.gz"),
            "xte": idx("t10k-images-idx3-ubyte.gz"), "yte": idx("t10k-labels-idx1-ubyte.gz")}


@pytest.fixture(scope="module")
def cnn(tensord_bin, tmp_path_factory, fashion):
    """Seed CNN as version 1, one short epoch on 2,000 Fashion-MNIST examples as version 2."""
    tmp = tmp_path_factory.mktemp("cnn")
    data = tmp / "fashion2k.npz"
    # images scaled to [0, 1] as the IDX reader does for the test files (an npz of uint8 stays 0..255)
    np.savez(data, x=fashion["xtr"][:2000].astype(np.float32) / 255, y=fashion["ytr"][:2000])
    cal = tmp / "calib.npz"
    np.savez(cal, x=fashion["xtr"][2000:2500].astype(np.float32) / 255, y=fashion["ytr"][2000:2500])
    base = tmp / "cnn"
    cp = run(tensord_bin, "init", "--arch", "cnn", "--seed", 0, "--out", base / "1")
    assert cp.returncode == 0, cp.stderr
    cp = run(tensord_bin, "train", "--model-base-path", base, "--data", data, "--epochs", 1, "--batch-size", 64,
             "--optimizer", "adam", "--lr", 0.001, "--loss", "sparse_categorical_crossentropy", "--seed", 7,
             "--no-progress")
    assert cp.returncode == 0, cp.stderr
    assert versions(base) == [1, 2]
    return {"base": base, "tmp": tmp, "data": data, "calib": cal}


def evaluate(binary, base, version, data=TEST_FILES, *extra):
    return run(binary, "evaluate", "--model-base-path", base, "--version", version, "--data", data, *extra)


def numpy_accuracy(binary, model, x, y, tmp):
    p = predict(binary, model, {"x": (x.astype(np.float32) / 255).reshape(-1, 1, 28, 28)}, tmp)
    assert p.shape == (len(y), 10)
    return p.argmax(1), float((p.argmax(1) == y).mean())


def test_evaluate_accuracy_matches_predict_argmax(tensord_bin, cnn, fashion):
    cp = evaluate(tensord_bin, cnn["base"], 2)
    assert cp.returncode == 0, cp.stderr
    r = json.loads(cp.stdout)
    assert r["version"] == 2 and r["examples"] == 10000
    _, want = numpy_accuracy(tensord_bin, cnn["base"] / "2" / "model.onnx", fashion["xte"], fashion["yte"],
                             cnn["tmp"] / "pred2")
    print(f"fp32 test accuracy of the trained seed CNN: {100 * r['accuracy']:.2f}%")
    assert r["accuracy"] == pytest.approx(want, abs=1e-12)
    assert r["accuracy"] > 0.5
    assert "accuracy" in cp.stderr and "10000" in cp.stderr
    assert "against" not in r


def test_evaluate_against_previous_version(tensord_bin, cnn, fashion):
    cp = evaluate(tensord_bin, cnn["base"], 2, TEST_FILES, "--against", 1, "--batch-size", 333, "--threads", 2)
    assert cp.returncode == 0, cp.stderr
    r = json.loads(cp.stdout)
    p2, a2 = numpy_accuracy(tensord_bin, cnn["base"] / "2" / "model.onnx", fashion["xte"], fashion["yte"],
                            cnn["tmp"] / "pred2b")
    p1, a1 = numpy_accuracy(tensord_bin, cnn["base"] / "1" / "model.onnx", fashion["xte"], fashion["yte"],
                            cnn["tmp"] / "pred1")
    assert r["accuracy"] == pytest.approx(a2, abs=1e-12)
    a = r["against"]
    assert a["version"] == 1
    assert a["accuracy"] == pytest.approx(a1, abs=1e-12)
    assert a["agreement"] == pytest.approx(float((p1 == p2).mean()), abs=1e-12)
    assert a["agreement"] < 1
    assert a["accuracy_delta"] == pytest.approx(a2 - a1, abs=1e-12)
    assert "agreement" in cp.stderr


def test_evaluate_regression_mse(tensord_bin, tmp_path):
    base = tmp_path / "mlp"
    cp = run(tensord_bin, "init", "--arch", "mlp", "--opt", "input=16", "--opt", "hidden=32", "--opt", "classes=4",
             "--out", base / "1")
    assert cp.returncode == 0, cp.stderr
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 16)).astype(np.float32)
    y = rng.uniform(size=(300, 4)).astype(np.float32)
    np.savez(tmp_path / "reg.npz", x=x, label=y)
    cp = evaluate(tensord_bin, base, 1, tmp_path / "reg.npz", "--against", 1, "--batch-size", 64)
    assert cp.returncode == 0, cp.stderr
    r = json.loads(cp.stdout)
    p = predict(tensord_bin, base / "1" / "model.onnx", {"x": x}, tmp_path / "pred")
    want = float(np.mean((p.astype(np.float64) - y) ** 2))
    assert r["mse"] == pytest.approx(want, rel=1e-6)
    assert r["against"]["mean_sq_diff"] == 0 and r["against"]["mse_delta"] == 0
    assert "accuracy" not in r


def test_evaluate_missing_version(tensord_bin, cnn):
    cp = evaluate(tensord_bin, cnn["base"], 9)
    assert_clean_error(cp, "version 9", str(cnn["base"]), "versions: 1, 2")
    cp = evaluate(tensord_bin, cnn["base"], 2, TEST_FILES, "--against", 7)
    assert_clean_error(cp, "version 7", str(cnn["base"]))
    assert cp.stdout == ""


def test_evaluate_shape_does_not_fit(tensord_bin, cnn, tmp_path):
    np.savez(tmp_path / "bad.npz", x=np.zeros((10, 27, 27), np.uint8), y=np.zeros(10, np.uint8))
    cp = evaluate(tensord_bin, cnn["base"], 2, tmp_path / "bad.npz")
    assert_clean_error(cp, "column 'x'", "input 'x'", "version 2", "[10,27,27]")
    np.savez(tmp_path / "nox.npz", images=np.zeros((10, 28, 28), np.uint8), y=np.zeros(10, np.uint8))
    cp = evaluate(tensord_bin, cnn["base"], 2, tmp_path / "nox.npz")
    assert_clean_error(cp, "no column 'x'", "images")
    np.savez(tmp_path / "nolabel.npz", x=np.zeros((10, 28, 28), np.uint8))
    cp = evaluate(tensord_bin, cnn["base"], 2, tmp_path / "nolabel.npz")
    assert_clean_error(cp, "'label'")
    np.savez(tmp_path / "badlabel.npz", x=np.zeros((10, 28, 28), np.uint8), y=np.full(10, 12, np.uint8))
    cp = evaluate(tensord_bin, cnn["base"], 2, tmp_path / "badlabel.npz")
    assert_clean_error(cp, "label 12", "example 0", "10 classes")


def test_evaluate_missing_file_and_usage(tensord_bin, cnn, tmp_path):
    cp = evaluate(tensord_bin, cnn["base"], 2, tmp_path / "nope.npz")
    assert_clean_error(cp, "nope.npz")
    cp = run(tensord_bin, "evaluate", "--model-base-path", cnn["base"], "--data", TEST_FILES)
    assert cp.returncode == 2 and "--version" in cp.stderr
    cp = run(tensord_bin, "evaluate", "--model-base-path", cnn["base"], "--version", "x", "--data", TEST_FILES)
    assert cp.returncode == 2
    cp = run(tensord_bin, "evaluate", "--bogus")
    assert cp.returncode == 2


# ---- tensord quantize ----

def quantize(binary, base, version, calib, *extra):
    return run(binary, "quantize", "--model-base-path", base, "--version", version, "--calibration", calib, *extra)


def copy_bundle(src, dst, keep=(1, 2)):
    import shutil
    dst.mkdir(parents=True)
    for v in keep:
        shutil.copytree(src / str(v), dst / str(v))
    return dst


def check_quantized(binary, base, new, x, y, tmp, nodes):
    """Version `new` is QDQ, loads in onnxruntime and matches tensord on it; returns (fp32, int8) accuracy."""
    vdir = base / str(new)
    assert sorted(os.listdir(vdir)) == ["metrics.json", "model.onnx", "signature.json"]
    assert open(vdir / "signature.json").read() == open(base / str(new - 1) / "signature.json").read()
    m = onnx.load(vdir / "model.onnx")
    onnx.checker.check_model(m, full_check=True)
    ops = [n.op_type for n in m.graph.node]
    assert ops.count("QuantizeLinear") >= 1 and ops.count("DequantizeLinear") >= 2 * len(nodes), ops
    inits = {t.name: t for t in m.graph.initializer}
    for n in m.graph.node:
        if n.name in nodes:  # each quantized node reads dequantized activation and weight
            for i in n.input[:2]:
                prod = [p for p in m.graph.node if i in p.output]
                assert prod and prod[0].op_type == "DequantizeLinear", (n.name, i)
                w = prod[0].input[0]
                if w in inits:
                    assert inits[w].data_type == onnx.TensorProto.INT8
    sess = ort.InferenceSession(str(vdir / "model.onnx"), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x})[0]
    got = predict(binary, vdir / "model.onnx", {"x": x}, tmp)
    assert got.shape == want.shape
    diff = np.abs(got.astype(np.float64) - want)
    agree = float((got.argmax(1) == want.argmax(1)).mean())
    print(f"  tensord vs onnxruntime on version {new}: max|diff| {diff.max():.2e}, argmax agreement {agree:.4f}")
    assert diff.max() < 2e-2 and agree >= 0.998
    metrics = json.load(open(vdir / "metrics.json"))
    ev = metrics["evaluation"]
    return metrics, ev["fp32"]["accuracy"], ev["int8"]["accuracy"], float((got.argmax(1) == y).mean())


@pytest.mark.parametrize("method", ["minmax", "entropy"])
def test_quantize_cnn(tensord_bin, cnn, fashion, method, tmp_path):
    base = copy_bundle(cnn["base"], tmp_path / "cnn")
    cp = quantize(tensord_bin, base, 2, cnn["calib"], "--method", method, "--eval", TEST_FILES, "--threads", 4)
    assert cp.returncode == 0, cp.stderr
    assert versions(base) == [1, 2, 3]
    assert cp.stdout.splitlines()[0] == str(base / "3")
    x = (fashion["xte"].astype(np.float32) / 255).reshape(-1, 1, 28, 28)
    metrics, fp32, int8, int8_np = check_quantized(tensord_bin, base, 3, x, fashion["yte"], tmp_path / "p", ["conv1/Conv", "head/Gemm"])
    q = metrics["quantization"]
    assert q["method"] == method and q["per_channel"] is True and q["source_version"] == 2
    assert q["nodes_quantized"] == ["conv1/Conv", "head/Gemm"] and q["nodes_excluded"] == []
    assert set(q["activations"]) == {"x", "flatten"}
    assert metrics["evaluation"]["examples"] == 10000
    assert int8 == pytest.approx(int8_np, abs=1e-12)
    print(f"seed CNN {method}: fp32 {100 * fp32:.2f}%  int8 {100 * int8:.2f}%  "
          f"agreement {100 * metrics['evaluation']['agreement']:.2f}%")
    assert abs(fp32 - int8) <= 0.01
    # step 1's evaluate agrees with the report
    cp = evaluate(tensord_bin, base, 3, TEST_FILES, "--against", 2)
    r = json.loads(cp.stdout)
    assert r["accuracy"] == pytest.approx(int8, abs=1e-12) and r["against"]["accuracy"] == pytest.approx(fp32, abs=1e-12)


@pytest.mark.parametrize("method", ["minmax", "entropy"])
def test_quantize_mlp(tensord_bin, fashion, method, tmp_path):
    base = tmp_path / "mlp"
    cp = run(tensord_bin, "init", "--arch", "mlp", "--seed", 0, "--out", base / "1")
    assert cp.returncode == 0, cp.stderr
    data = tmp_path / "train.npz"
    np.savez(data, x=fashion["xtr"][:2000].astype(np.float32) / 255, y=fashion["ytr"][:2000])
    cp = run(tensord_bin, "train", "--model-base-path", base, "--data", data, "--epochs", 1, "--batch-size", 64,
             "--optimizer", "adam", "--lr", 0.001, "--loss", "sparse_categorical_crossentropy", "--seed", 7,
             "--no-progress")
    assert cp.returncode == 0, cp.stderr
    cal = tmp_path / "cal.npz"
    np.savez(cal, x=fashion["xtr"][2000:2500].astype(np.float32) / 255, y=fashion["ytr"][2000:2500])
    cp = quantize(tensord_bin, base, 2, cal, "--method", method, "--eval", TEST_FILES)
    assert cp.returncode == 0, cp.stderr
    x = (fashion["xte"].astype(np.float32) / 255).reshape(-1, 784)
    nodes = ["dense_1/Gemm", "dense_2/Gemm", "head/Gemm"]
    metrics, fp32, int8, int8_np = check_quantized(tensord_bin, base, 3, x, fashion["yte"], tmp_path / "p", nodes)
    assert metrics["quantization"]["nodes_quantized"] == nodes
    assert int8 == pytest.approx(int8_np, abs=1e-12)
    print(f"MLP {method}: fp32 {100 * fp32:.2f}%  int8 {100 * int8:.2f}%  "
          f"agreement {100 * metrics['evaluation']['agreement']:.2f}%")
    assert abs(fp32 - int8) <= 0.01


def test_quantize_exclude_per_tensor_default_eval(tensord_bin, cnn, tmp_path):
    base = copy_bundle(cnn["base"], tmp_path / "cnn")
    cp = quantize(tensord_bin, base, 2, cnn["calib"], "--per-tensor", "--method", "percentile", "--exclude", "head/Gemm")
    assert cp.returncode == 0, cp.stderr
    metrics = json.load(open(base / "3" / "metrics.json"))
    q = metrics["quantization"]
    assert q["nodes_quantized"] == ["conv1/Conv"] and q["nodes_excluded"] == ["head/Gemm"]
    assert q["per_channel"] is False and q["method"] == "percentile"
    assert metrics["evaluation"]["data"] == [str(cnn["calib"])] and metrics["evaluation"]["examples"] == 500
    m = onnx.load(base / "3" / "model.onnx")
    gemm = [n for n in m.graph.node if n.op_type == "Gemm"][0]
    assert "head/kernel" in gemm.input and "head/kernel" in {t.name for t in m.graph.initializer}
    ort.InferenceSession(str(base / "3" / "model.onnx"), providers=["CPUExecutionProvider"])


def test_quantize_refusals_write_nothing(tensord_bin, cnn, tmp_path):
    base = copy_bundle(cnn["base"], tmp_path / "cnn")
    np.savez(tmp_path / "bad.npz", x=np.zeros((10, 27, 27), np.float32), y=np.zeros(10, np.uint8))
    cp = quantize(tensord_bin, base, 2, tmp_path / "bad.npz")
    assert_clean_error(cp, "column 'x'", "input 'x'", "[10,27,27]")
    np.savez(tmp_path / "empty.npz", x=np.zeros((0, 28, 28), np.float32), y=np.zeros(0, np.uint8))
    cp = quantize(tensord_bin, base, 2, tmp_path / "empty.npz")
    assert_clean_error(cp, "empty.npz")
    (tmp_path / "empty.csv").write_text("")
    cp = quantize(tensord_bin, base, 2, tmp_path / "empty.csv")
    assert_clean_error(cp, "empty.csv")
    cp = quantize(tensord_bin, base, 2, cnn["calib"], "--exclude", "conv1/Conv", "nosuch/Node")
    assert_clean_error(cp, "nosuch/Node", "conv1/Conv")
    cp = quantize(tensord_bin, base, 2, cnn["calib"], "--exclude", "conv1/Conv", "--exclude", "head/Gemm")
    assert_clean_error(cp, "excluded")
    cp = quantize(tensord_bin, base, 5, cnn["calib"])
    assert_clean_error(cp, "version 5")
    cp = quantize(tensord_bin, base, 2, cnn["calib"], "--eval", tmp_path / "bad.npz")
    assert_clean_error(cp, "column 'x'")
    # a model with nothing to quantize
    from onnx import helper, TensorProto
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    relu = tmp_path / "relu"
    (relu / "1").mkdir(parents=True)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), relu / "1" / "model.onnx")
    np.savez(tmp_path / "r.npz", x=np.ones((8, 4), np.float32), y=np.zeros(8, np.int64))
    cp = quantize(tensord_bin, relu, 1, tmp_path / "r.npz")
    assert_clean_error(cp, "Conv, MatMul or Gemm", "version 1")
    assert versions(relu) == [1]
    assert sorted(os.listdir(base)) == ["1", "2"], os.listdir(base)  # no version 3, no staging leftovers
    cp = run(tensord_bin, "quantize", "--model-base-path", base, "--version", 2)
    assert cp.returncode == 2 and "--calibration" in cp.stderr
    cp = quantize(tensord_bin, base, 2, cnn["calib"], "--method", "magic")
    assert cp.returncode == 2 and "magic" in cp.stderr
