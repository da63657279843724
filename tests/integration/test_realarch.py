"""Real architectures exported from PyTorch, small versions: tensord against PyTorch's own outputs, and no oneDNN
reference kernels.

bench/realarch_export.py (run by the system Python with torch/torchvision, $TENSORD_TORCH_PYTHON or
/usr/bin/python3) writes every suite model (torchvision CNNs with randomised BatchNorm statistics, swin_t, and the
BERT-base / GPT-2-small transformers cut to SMALL_LAYERS layers) at image side SMALL_SIZE, sequence SMALL_SEQ,
batch SMALL_BATCH into build/realarch-small/ (cached: the exporter skips a model whose files exist for the same
settings), then per model:

  test_realarch_matches_torch   `tensord predict` output vs PyTorch's: max|tensord - torch| / max|torch| <= 1e-4
  test_realarch_no_ref_kernels  no oneDNN `exec` verbose line of that run names a `ref*` implementation (oneDNN's
                                reference kernels: correct but 10-1000x slower than its jit ones); the failure lists
                                each primitive with its shapes. Skipped where /proc/cpuinfo lacks avx512f (there
                                oneDNN may legitimately have no jit kernel for a shape).

Both tests read one `tensord predict` run per model made with ONEDNN_VERBOSE=1 (verbose logging does not change
which kernel runs or what it computes), each run limited to TIMEOUT seconds.

torch missing is a broken environment: every test FAILS saying to run `make deps`, unless TENSORD_NO_TORCH=1 (then
they skip).
"""
import functools
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, TOL, max_rel_err

sys.path.insert(0, os.path.join(ROOT, "bench"))
from realarch import MODELS, ref_detail, ref_steps  # noqa: E402

SMALL_SIZE = 64
SMALL_SEQ = 32
SMALL_LAYERS = 2
SMALL_BATCH = 2
TIMEOUT = 120
EXPORT_TIMEOUT = 900
CACHE = os.path.join(ROOT, "build", "realarch-small")
TORCH_PYTHON = os.environ.get("TENSORD_TORCH_PYTHON", "/usr/bin/python3")


@functools.lru_cache(maxsize=None)
def exported():
    """Exports every model once per session; returns (error text or "", exporter output)."""
    try:
        cp = subprocess.run([TORCH_PYTHON, "-c", "import torch, torchvision"], capture_output=True, text=True,
                            timeout=120)
        if cp.returncode != 0:
            return (f"{TORCH_PYTHON} cannot import torch/torchvision ({(cp.stderr.strip().splitlines() or [''])[-1]}):"
                    " run `make deps` (or set TENSORD_NO_TORCH=1 to skip these tests)"), ""
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{TORCH_PYTHON} not usable ({e}): run `make deps` (or set TENSORD_NO_TORCH=1 to skip)", ""
    cmd = [TORCH_PYTHON, os.path.join(ROOT, "bench", "realarch_export.py"), "--out", CACHE,
           "--size", str(SMALL_SIZE), "--seq", str(SMALL_SEQ), "--layers", str(SMALL_LAYERS),
           "--batches", str(SMALL_BATCH)]
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=EXPORT_TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"export timed out after {EXPORT_TIMEOUT} s: {' '.join(cmd)}", ""
    log = cp.stdout + cp.stderr
    if cp.returncode != 0:
        return f"exporter failed (exit {cp.returncode}): {' '.join(cmd)}\n{log[-3000:]}", log
    return "", log


def model_meta(name):
    """meta.json of an exported model; fails (or skips under TENSORD_NO_TORCH=1) if export is impossible."""
    err, log = exported()
    if err:
        if os.environ.get("TENSORD_NO_TORCH") == "1":
            pytest.skip("TENSORD_NO_TORCH=1: " + err.splitlines()[0])
        pytest.fail(err)
    with open(os.path.join(CACHE, name, "meta.json")) as f:
        meta = json.load(f)
    if "error" in meta:  # the torch exporter's own limitation, recorded by realarch_export.py
        pytest.skip(f"{name}: {meta['error']}")
    assert SMALL_BATCH in meta["batches"], f"{name}: batch {SMALL_BATCH} not exported\n{log[-2000:]}"
    return meta


_runs = {}


def verbose_run(binary, name):
    """(CompletedProcess, output array) of `tensord predict` on the model under ONEDNN_VERBOSE=1; once per model."""
    if name in _runs:
        return _runs[name]
    meta = model_meta(name)
    mdir = os.path.join(CACHE, name)
    odir = os.path.join(mdir, "pred")
    os.makedirs(odir, exist_ok=True)
    for f in os.listdir(odir):
        os.remove(os.path.join(odir, f))
    cmd = [binary, "predict", "--model", os.path.join(mdir, "model.onnx"), "--output-dir", odir, "--threads", "2"]
    for i in meta["inputs"]:
        cmd += ["--input", f"{i}={os.path.join(mdir, meta['input_file'].format(input=i, batch=SMALL_BATCH))}"]
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT,
                            env={**os.environ, "ONEDNN_VERBOSE": "1"})
    except subprocess.TimeoutExpired:
        _runs[name] = (None, f"tensord predict on {name} timed out after {TIMEOUT} s: {' '.join(cmd)}")
        return _runs[name]
    if cp.returncode != 0:
        why = f"signal {-cp.returncode} (crash)" if cp.returncode < 0 else f"exit {cp.returncode}"
        _runs[name] = (None, f"tensord predict on {name}: {why}\n{cp.stderr[-3000:]}")
        return _runs[name]
    y = np.load(os.path.join(odir, meta["outputs"][0] + ".npy"))
    _runs[name] = (cp, y)
    return _runs[name]


@pytest.mark.parametrize("name", MODELS)
def test_realarch_matches_torch(tensord_bin, name):
    meta = model_meta(name)
    cp, y = verbose_run(tensord_bin, name)
    if cp is None:
        pytest.fail(y)
    want = np.load(os.path.join(CACHE, name, meta["reference_file"].format(batch=SMALL_BATCH)))
    assert y.shape == want.shape, f"{name}: output shape {y.shape}, torch {want.shape}"
    assert y.dtype == np.float32, f"{name}: output dtype {y.dtype}"
    assert np.all(np.isfinite(y)), f"{name}: non-finite outputs"
    err = max_rel_err(y, want)
    assert err <= TOL, f"{name}: max|tensord - torch| / max|torch| = {err:.3e} > {TOL:g}"


def has_avx512f():
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " avx512f" in line for line in f)
    except OSError:
        return False


@pytest.mark.parametrize("name", MODELS)
def test_realarch_no_ref_kernels(tensord_bin, name):
    if not has_avx512f():
        pytest.skip("/proc/cpuinfo lacks avx512f: oneDNN may have no jit kernel for some shapes on this CPU")
    model_meta(name)
    cp, y = verbose_run(tensord_bin, name)
    if cp is None:
        pytest.fail(y)
    text = cp.stdout + "\n" + cp.stderr
    assert ",exec," in text, f"{name}: no oneDNN verbose exec lines under ONEDNN_VERBOSE=1 (is oneDNN in use?)"
    steps = ref_steps(text)
    assert not steps, (f"{name}: {len(steps)} oneDNN steps ran a reference (ref*) implementation:\n  "
                       + "\n  ".join(ref_detail(steps)))
