"""`tensord init`: the model zoo written as bundle versions.

For every architecture (defaults, and a non-default variant) `tensord init` writes DIR/1 whose model.onnx passes
onnx.checker (full check) and gives the same outputs in onnxruntime as in `tensord predict` (conftest's rule:
max|tensord - ort| / max|ort| <= 1e-4), with signature.json naming the graph's inputs/outputs and zoo.json the
arch, every option and the seed. The seed fixes the bytes. init refuses an existing version directory and bad
arch/option/version values with a clean error naming them; the written version is served by `tensord serve`.
"""
import json
import os
import subprocess

import numpy as np
import onnx
import pytest

from conftest import TIMEOUT, assert_clean_error, assert_no_crash, check_model, max_rel_err, ort_run, Result, TOL

ARCHS = ["mlp", "cnn", "resnet-small", "transformer-encoder", "vit-tiny", "two-tower"]

# (arch, options, output name, output columns)
CASES = [
    ("mlp", [], "probabilities", 10),
    ("mlp", ["input=1,6,6", "hidden=8", "activation=gelu", "classes=4", "softmax=0"], "logits", 4),
    ("cnn", [], "probabilities", 10),
    ("cnn", ["input=3,16,12", "filters=5", "kernel=5", "pool=3", "classes=7"], "probabilities", 7),
    ("resnet-small", [], "probabilities", 10),
    ("resnet-small", ["input=1,12,12", "width=4", "blocks=1", "classes=3", "softmax=0"], "logits", 3),
    ("transformer-encoder", [], "probabilities", 2),
    ("transformer-encoder", ["vocab=50", "seq=9", "d=12", "heads=3", "layers=1", "ffn=20", "classes=5"],
     "probabilities", 5),
    ("vit-tiny", [], "probabilities", 10),
    ("vit-tiny", ["input=1,8,12", "patch=4", "d=8", "heads=2", "layers=1", "ffn=16", "softmax=0"], "logits", 10),
    ("two-tower", [], "probability", 1),
    ("two-tower", ["users=7", "items=3", "dim=4"], "probability", 1),
]


def run_init(binary, *args):
    cmd = [binary, "init", *args]
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"tensord init timed out after {TIMEOUT} s: {' '.join(cmd)}")
    return Result(cp, {})


def init_ok(binary, out, arch, opts=(), seed=None):
    args = ["--arch", arch, "--out", str(out)]
    for o in opts:
        args += ["--opt", o]
    if seed is not None:
        args += ["--seed", str(seed)]
    res = run_init(binary, *args)
    assert_no_crash(res)
    assert res.returncode == 0, f"tensord init {' '.join(args)} failed\n{res.describe()}"
    return res


def feeds_for(model, batch=2, seed=0):
    """Random inputs for the model's graph inputs: floats in [-1, 1), ids below their embedding table's rows."""
    rng = np.random.default_rng(seed)
    inits = {i.name: i for i in model.graph.initializer}
    rows = {}
    for n in model.graph.node:
        if n.op_type == "Gather" and n.input[0] in inits:
            rows[n.input[1]] = inits[n.input[0]].dims[0]
    feeds = {}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        t = inp.type.tensor_type
        dims = [d.dim_value if d.dim_value > 0 else batch for d in t.shape.dim]
        if t.elem_type == onnx.TensorProto.INT64:
            feeds[inp.name] = rng.integers(0, rows[inp.name], size=dims, dtype=np.int64)
        else:
            feeds[inp.name] = rng.uniform(-1, 1, size=dims).astype(np.float32)
    return feeds


@pytest.mark.parametrize("arch,opts,out_name,cols", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_init_matches_onnxruntime(tensord_bin, tensord, tmp_path, arch, opts, out_name, cols):
    base = tmp_path / "models" / "zoo_model"
    res = init_ok(tensord_bin, base / "1", arch, opts, seed=3)
    vdir = base / "1"
    assert str(vdir) in res.stdout, res.describe()
    assert sorted(os.listdir(base)) == ["1"], f"temp files left behind: {os.listdir(base)}"
    assert {"model.onnx", "signature.json", "zoo.json"} <= set(os.listdir(vdir))

    model = check_model(onnx.load(str(vdir / "model.onnx")))
    assert model.opset_import[0].version == 17
    assert [o.name for o in model.graph.output] == [out_name]
    input_names = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    assert input_names == (["user", "item"] if arch == "two-tower" else
                           ["tokens"] if arch == "transformer-encoder" else ["x"])
    # every initializer has a layer-style name (fine-tuning freezes by prefix)
    for t in model.graph.initializer:
        assert "/" in t.name and t.name.split("/")[-1] in (
            "kernel", "bias", "gamma", "beta", "moving_mean", "moving_variance", "embeddings"), t.name

    sig = json.loads((vdir / "signature.json").read_text())
    sd = sig["signature_defs"]["serving_default"]
    assert set(sig) == {"signature_defs"}
    assert list(sd["inputs"]) == input_names
    assert sd["outputs"][out_name]["shape"] == [-1, cols]
    assert sd["outputs"][out_name]["dtype"] == "float32"
    zoo = json.loads((vdir / "zoo.json").read_text())
    assert zoo["arch"] == arch and zoo["seed"] == 3
    for o in opts:
        k, v = o.split("=", 1)
        assert zoo["options"][k] == v
    assert zoo["parameters"] == sum(int(np.prod(t.dims)) for t in model.graph.initializer)

    feeds = feeds_for(model)
    got = tensord.predict(vdir, feeds)
    assert_no_crash(got)
    assert got.returncode == 0, got.describe()
    want = ort_run(model, feeds)[out_name]
    g = got.outputs[out_name]
    assert g.shape == want.shape == (2, cols)
    assert np.all(np.isfinite(g))
    err = max_rel_err(g, want)
    assert err <= TOL, f"{arch}: max|tensord-ort|/max|ort| = {err:.3e}"
    if out_name == "probabilities":
        np.testing.assert_allclose(g.sum(axis=1), 1.0, atol=1e-5)
    if out_name == "probability":
        assert np.all((g > 0) & (g < 1))


def test_seed_cnn_layers(tensord_bin, tmp_path):
    init_ok(tensord_bin, tmp_path / "cnn" / "1", "cnn")
    m = onnx.load(str(tmp_path / "cnn" / "1" / "model.onnx"))
    assert [n.op_type for n in m.graph.node] == ["Conv", "Relu", "MaxPool", "Flatten", "Gemm", "Softmax"]
    shapes = {t.name: list(t.dims) for t in m.graph.initializer}
    assert shapes == {"conv1/kernel": [32, 1, 3, 3], "conv1/bias": [32], "head/kernel": [5408, 10], "head/bias": [10]}
    conv = {a.name: onnx.helper.get_attribute_value(a) for a in m.graph.node[0].attribute}
    assert conv["pads"] == [0, 0, 0, 0] and conv["strides"] == [1, 1]
    pool = {a.name: onnx.helper.get_attribute_value(a) for a in m.graph.node[2].attribute}
    assert pool["kernel_shape"] == [2, 2] and pool["strides"] == [2, 2]
    dims = [d.dim_value or d.dim_param for d in m.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["N", 1, 28, 28]
    # Glorot uniform limit for the conv kernel: sqrt(6 / (9 + 288)); biases zero
    w = onnx.numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == "conv1/kernel"))
    lim = np.sqrt(6 / (9 + 288))
    assert np.abs(w).max() <= lim and np.abs(w).max() > 0.8 * lim
    b = onnx.numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == "head/bias"))
    assert not b.any()


@pytest.mark.parametrize("arch", ARCHS)
def test_seed_fixes_bytes(tensord_bin, tmp_path, arch):
    for d, seed in (("a", 11), ("b", 11), ("c", 12)):
        init_ok(tensord_bin, tmp_path / d / "1", arch, seed=seed)
    a, b, c = ((tmp_path / d / "1" / "model.onnx").read_bytes() for d in "abc")
    assert a == b, f"{arch}: the same seed gave different model.onnx bytes"
    inits = lambda raw: {t.name: t.raw_data or t.SerializeToString() for t in onnx.load_from_string(raw).graph.initializer}
    ia, ic = inits(a), inits(c)
    assert ia.keys() == ic.keys()
    assert any(ia[k] != ic[k] for k in ia), f"{arch}: different seeds gave the same weights"


def test_refuses_existing_version(tensord_bin, tmp_path):
    base = tmp_path / "m"
    init_ok(tensord_bin, base / "1", "cnn", seed=1)
    before = (base / "1" / "model.onnx").read_bytes()
    res = run_init(tensord_bin, "--arch", "mlp", "--out", str(base / "1"))
    assert_clean_error(res, str(base / "1"), "exists")
    assert (base / "1" / "model.onnx").read_bytes() == before
    assert sorted(os.listdir(base)) == ["1"]
    # an empty directory counts as existing too (rename(2) would silently replace it)
    (base / "2").mkdir()
    assert_clean_error(run_init(tensord_bin, "--arch", "cnn", "--out", str(base / "2") + "/"), "exists")
    assert os.listdir(base / "2") == []
    init_ok(tensord_bin, base / "3", "cnn")
    assert sorted(os.listdir(base)) == ["1", "2", "3"]


@pytest.mark.parametrize("args,must", [
    (["--arch", "resnet"], ["unknown arch 'resnet'", "resnet-small"]),
    (["--arch", "mlp", "--opt", "hiden=3"], ["unknown option 'hiden'", "hidden"]),
    (["--arch", "mlp", "--opt", "hidden=3,x"], ["option 'hidden'", "3,x"]),
    (["--arch", "mlp", "--opt", "classes=0"], ["option 'classes'", "out of range"]),
    (["--arch", "mlp", "--opt", "activation=swish"], ["option 'activation'", "swish"]),
    (["--arch", "mlp", "--opt", "classes=2", "--opt", "classes=3"], ["option 'classes'", "twice"]),
    (["--arch", "transformer-encoder", "--opt", "heads=3"], ["option 'heads'", "d=128"]),
    (["--arch", "vit-tiny", "--opt", "patch=5"], ["option 'patch'"]),
    (["--arch", "cnn", "--opt", "kernel=40"], ["option 'kernel'"]),
    (["--arch", "two-tower", "--opt", "users=16777216", "--opt", "dim=65536"], ["parameters"]),
    (["--arch", "cnn", "--seed", "-1"], ["--seed"]),
])
def test_bad_arch_or_option(tensord_bin, tmp_path, args, must):
    base = tmp_path / "m"
    res = run_init(tensord_bin, *args, "--out", str(base / "1"))
    assert_clean_error(res, *must)
    assert not base.exists() or os.listdir(base) == [], "nothing may be written on error"


@pytest.mark.parametrize("out,must", [
    ("m/0", ["'0'", "positive integer"]),
    ("m/01", ["'01'", "positive integer"]),
    ("m/v1", ["'v1'", "positive integer"]),
    ("m/-1", ["'-1'"]),
    ("bad name/1", ["'bad name'"]),
])
def test_bad_version_path(tensord_bin, tmp_path, out, must):
    res = run_init(tensord_bin, "--arch", "cnn", "--out", str(tmp_path / out))
    assert_clean_error(res, *must)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("args", [[], ["--arch", "cnn"], ["--out", "x/1"], ["--arch", "cnn", "--out", "x/1", "--opt", "novalue"],
                                  ["--arch", "cnn", "--out", "x/1", "--frobnicate"]])
def test_usage_errors(tensord_bin, tmp_path, args):
    cp = subprocess.run([tensord_bin, "init", *args], capture_output=True, text=True, timeout=TIMEOUT, cwd=tmp_path)
    assert cp.returncode == 2, f"exit {cp.returncode}\n{cp.stderr}"
    assert "error: " in cp.stderr and "usage" in cp.stderr.lower()
    assert os.listdir(tmp_path) == []


def test_list(tensord_bin):
    cp = subprocess.run([tensord_bin, "init", "--list"], capture_output=True, text=True, timeout=TIMEOUT)
    assert cp.returncode == 0, cp.stderr
    for arch in ARCHS:
        assert f"\n{arch}\n" in "\n" + cp.stdout
    for opt in ("hidden=512,512", "filters=32", "blocks=2", "heads=4", "patch=4", "dim=32", "softmax=1"):
        assert f"--opt {opt}" in cp.stdout


def test_served(tensord_bin, tmp_path):
    """The written version (signature.json included) is accepted by `tensord serve` and answers predict."""
    import serving_util as u
    base = tmp_path / "fashion"
    init_ok(tensord_bin, base / "1", "cnn", seed=9)
    model = onnx.load(str(base / "1" / "model.onnx"))
    x = np.random.default_rng(1).uniform(0, 1, size=(2, 1, 28, 28)).astype(np.float32)
    want = ort_run(model, {"x": x})["probabilities"]
    with u.Server(tmp_path, base_path=str(base), model_name="fashion") as s:
        r = s.post_json("/v1/models/fashion:predict", {"instances": x.tolist()})
        assert r.status_code == 200, f"{r.status_code} {r.text}\n{s.describe()}"
        got = np.array(r.json()["predictions"], dtype=np.float32)
        assert got.shape == (2, 10)
        assert max_rel_err(got, want) <= TOL
