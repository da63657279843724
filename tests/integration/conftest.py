"""Shared fixtures for the integration tests: they run the real tensord binary and compare it with onnxruntime.

The binary is $TENSORD_BIN (default build/tensord). If it is missing every test that needs it FAILS: a missing
binary is a broken build, not a reason to skip.

Reference outputs come from onnxruntime with graph optimisations disabled (op-by-op semantics, nothing fused).
Outputs match when  max|tensord - ort| / max|ort| <= 1e-4  over the whole tensor (the norm-wise relative error
bench/run.py also uses), with identical shapes and dtypes.

A "clean error" is: exit status 1, an `error: ...` line on stderr, and no sanitizer report (AddressSanitizer,
LeakSanitizer, UBSan `runtime error:`). A signal exit (negative return code here) is a crash.
"""
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

TOL = 1e-4
TIMEOUT = 120
SANITIZER_MARKS = ("AddressSanitizer", "LeakSanitizer", "ThreadSanitizer", "runtime error:", "MemorySanitizer")


@pytest.fixture(scope="session")
def tensord_bin():
    path = os.environ.get("TENSORD_BIN", os.path.join(ROOT, "build", "tensord"))
    if not os.path.isabs(path):
        path = os.path.join(ROOT, path)
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.fail(f"tensord binary not found or not executable: {path} (build it with `make`, or set TENSORD_BIN)")
    return path


class Result:
    def __init__(self, cp, outputs):
        self.returncode = cp.returncode
        self.stdout = cp.stdout
        self.stderr = cp.stderr
        self.outputs = outputs  # {output name: np.ndarray}; empty unless exit 0

    def describe(self):
        return f"exit {self.returncode}\n--- stderr ---\n{self.stderr[-4000:]}\n--- stdout ---\n{self.stdout[-2000:]}"


class Tensord:
    """Runs `tensord predict` on a model and numpy inputs inside a per-test tmp directory."""

    def __init__(self, binary, tmp_path):
        self.bin = binary
        self.tmp = tmp_path
        self.n = 0

    def save_model(self, model, name="model.onnx"):
        p = self.tmp / name
        if isinstance(model, (bytes, bytearray)):
            p.write_bytes(model)
        else:
            p.write_bytes(model.SerializeToString())
        return p

    def predict(self, model_path, feeds, threads=1, extra=()):
        self.n += 1
        run_dir = self.tmp / f"run{self.n}"
        out_dir = run_dir / "out"
        out_dir.mkdir(parents=True)
        cmd = [self.bin, "predict", "--model", str(model_path), "--output-dir", str(out_dir), "--threads", str(threads)]
        for name, arr in feeds.items():
            p = run_dir / f"in_{len(cmd)}.npy"
            np.save(p, arr)
            cmd += ["--input", f"{name}={p}"]
        cmd += list(extra)
        try:
            cp = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"tensord timed out after {TIMEOUT} s (hang): {' '.join(cmd)}")
        outs = {}
        if cp.returncode == 0:
            for f in sorted(os.listdir(out_dir)):
                if f.endswith(".npy"):
                    outs[f[:-4]] = np.load(out_dir / f)
        return Result(cp, outs)


@pytest.fixture(scope="session")
def mpirun():
    """The mpirun command line for the multi-process training tests; missing mpirun fails under CI, else skips."""
    path = shutil.which("mpirun")
    if not path:
        msg = "mpirun not found: install openmpi-bin and libopenmpi-dev (make deps) and rebuild"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    # root in CI: OpenMPI refuses to run as root without these; --oversubscribe: a 1-core runner still has 2 slots
    return [path, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]


@pytest.fixture
def tensord(tensord_bin, tmp_path):
    return Tensord(tensord_bin, tmp_path)


def ort_run(model, feeds):
    """Reference outputs {name: array} from onnxruntime, op by op (no graph optimisations), one thread."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def max_rel_err(got, want):
    if want.size == 0:
        return 0.0
    scale = max(float(np.max(np.abs(want.astype(np.float64)))), 1e-30)
    return float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) / scale


def assert_no_crash(res):
    assert res.returncode >= 0, f"tensord was killed by signal {-res.returncode} (crash)\n{res.describe()}"
    for mark in SANITIZER_MARKS:
        assert mark not in res.stderr, f"sanitizer report ({mark})\n{res.describe()}"


def assert_matches_ort(res, model, feeds):
    """tensord's run `res` succeeded and every graph output matches onnxruntime on the same feeds."""
    assert_no_crash(res)
    assert res.returncode == 0, f"tensord predict failed\n{res.describe()}"
    want = ort_run(model, feeds)
    for name, w in want.items():
        assert name in res.outputs, f"output {name!r} not written; got {sorted(res.outputs)}\n{res.describe()}"
        g = res.outputs[name]
        assert g.shape == w.shape, f"output {name!r}: shape {g.shape}, onnxruntime {w.shape}"
        assert g.dtype == w.dtype, f"output {name!r}: dtype {g.dtype}, onnxruntime {w.dtype}"
        if w.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w, err_msg=f"output {name!r}")
        elif w.dtype.kind == "f":
            assert np.all(np.isfinite(g) == np.isfinite(w)), f"output {name!r}: non-finite values differ"
            fin = np.isfinite(w)
            err = max_rel_err(g[fin], w[fin])
            assert err <= TOL, f"output {name!r}: max|tensord-ort|/max|ort| = {err:.3e} > {TOL:g}"
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"output {name!r}")


def assert_clean_error(res, *must_contain, pattern=None):
    """Exit 1, an `error:` line on stderr that mentions every string in must_contain (case-insensitive) and
    matches the regex `pattern` if given; no crash, no sanitizer report."""
    assert_no_crash(res)
    assert res.returncode == 1, f"expected exit status 1, got {res.returncode}\n{res.describe()}"
    assert re.search(r"(^|\n)error: ", res.stderr), f"no 'error: ' line on stderr\n{res.describe()}"
    low = res.stderr.lower()
    for s in must_contain:
        assert s.lower() in low, f"error message does not mention {s!r}\n{res.describe()}"
    if pattern is not None:
        assert re.search(pattern, res.stderr, re.I), f"error message does not match /{pattern}/\n{res.describe()}"


def check_model(model):
    onnx.checker.check_model(model, full_check=True)
    return model
