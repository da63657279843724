"""Helpers for the serving integration tests (test_serving_*.py): run the real `tensord serve` on loopback, build
tiny model bundles with onnx.helper, talk HTTP, and compare with onnxruntime.

  Server(...)            starts `build/tensord serve` on 127.0.0.1 with a free REST port (gRPC off: --port=0;
                         with grpc=True a second free port for gRPC: srv.grpc_port, srv.grpc_target),
                         waits for GET /v2/health/live == 200 (and, if ready=True, /v2/health/ready == 200);
                         stop() sends SIGTERM and asserts exit status 0 and no sanitizer report. stderr goes to a
                         file in the test's tmp dir and is shown in every failure message (server.describe()).
  write_version(...)     writes <base>/<n>/model.onnx the way a deployer does: into <base>/.tmp-<n>-<pid>/, fsync,
                         then os.rename() (DESIGN.md: a version directory is complete or absent).
  model builders         mm_model (x [N,din] -> y), two_input_model (a, b -> y), classifier_model (softmax),
                         regress_model ([N,1]), version_model (y = x*0 + version), slow_model (a MatMul chain
                         whose cost per row is set by its size; for drain/batching tests), cnn_model (the seed CNN).
  ort_run / assert_close reference outputs and the comparison rule of conftest.py (max|got-want|/max|want| <= 1e-4).
  check_error(resp, ...) status code is one of the expected, body is JSON {"error": "<non-empty>"} naming things.

Every test that uses a Server must be bounded in time: all HTTP calls here carry timeouts.
"""
import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import requests
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
F = TensorProto.FLOAT
OPSET = 17
TOL = 1e-4
HTTP_TIMEOUT = 20
SANITIZER_MARKS = ("AddressSanitizer", "LeakSanitizer", "ThreadSanitizer", "runtime error:", "MemorySanitizer")


def tensord_bin():
    path = os.environ.get("TENSORD_BIN", os.path.join(ROOT, "build", "tensord"))
    if not os.path.isabs(path):
        path = os.path.join(ROOT, path)
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.fail(f"tensord binary not found or not executable: {path} (build it with `make SERVE=1`, or set TENSORD_BIN)")
    return path


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------------------------------------------
# the server process

class Server:
    """One `tensord serve` process. Either base_path (+ model_name) or config_file. extra: more flags."""

    def __init__(self, tmp, base_path=None, model_name="m", config_file=None, extra=(), poll=0.2, ready=True,
                 start_timeout=60, threads=1, env=None, grpc=False):
        self.tmp = str(tmp)
        self.grpc = grpc
        self.grpc_port = None
        self.base_path = base_path
        self.model_name = model_name
        self.config_file = config_file
        self.extra = list(extra)
        self.poll = poll
        self.threads = threads
        self.env = env
        self.proc = None
        self.port = None
        self.stderr_path = None
        self.errf = None
        self.stopped = False
        self._n = 0
        self.start(ready=ready, timeout=start_timeout)

    # -- lifecycle
    def cmd(self, port):
        c = [tensord_bin(), "serve", f"--rest_api_port={port}", "--rest_api_host=127.0.0.1",
             f"--port={self.grpc_port if self.grpc else 0}", "--admin_port=0"]
        if self.config_file:
            c.append(f"--model_config_file={self.config_file}")
        else:
            c += [f"--model_name={self.model_name}", f"--model_base_path={self.base_path}"]
        if self.poll is not None:
            c.append(f"--file_system_poll_wait_seconds={self.poll}")
        if self.threads:
            c.append(f"--tensorflow_intra_op_parallelism={self.threads}")
        return c + self.extra

    def start(self, ready=True, timeout=60):
        last = ""
        for attempt in range(3):  # a free port can be taken between free_port() and the server's bind
            self._n += 1
            self.port = free_port()
            if self.grpc:
                self.grpc_port = free_port()
                while self.grpc_port == self.port:
                    self.grpc_port = free_port()
            self.stderr_path = os.path.join(self.tmp, f"tensord-{self.port}-{self._n}.stderr")
            self.args = self.cmd(self.port)
            if self.errf:
                self.errf.close()
            self.errf = open(self.stderr_path, "w+b")
            self.proc = subprocess.Popen(self.args, stdout=self.errf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, start_new_session=True)
            if self._wait_http("/v2/health/live", timeout) and (not self.grpc or self._wait_tcp(self.grpc_port, timeout)):
                if ready and not self.wait_ready(timeout):
                    self.kill()
                    pytest.fail(f"tensord never became ready (GET /v2/health/ready != 200 within {timeout} s)\n"
                                f"{self.describe()}")
                return
            last = self.describe()
            self.kill()
            if "in use" not in last.lower():
                break
        pytest.fail(f"tensord did not answer GET /v2/health/live with 200 within {timeout} s"
                    f"{' (or did not accept connections on its gRPC port)' if self.grpc else ''}\n{last}")

    def _wait_tcp(self, port, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                return False
            try:
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
                return True
            except OSError:
                time.sleep(0.05)
        return False

    def _wait_http(self, path, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                return False
            try:
                r = requests.get(self.url(path), timeout=2)
                if r.status_code == 200:
                    return True
            except requests.RequestException:
                pass
            time.sleep(0.05)
        return False

    def wait_ready(self, timeout=60):
        return self._wait_http("/v2/health/ready", timeout)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)

    def wait_exit(self, timeout=45):
        """Wait for the process to end after a signal; assert exit status 0 and no sanitizer report."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"tensord did not exit within {timeout} s of SIGTERM (hang)\n{self.describe()}")
        self.stopped = True
        text = self.stderr()
        assert rc == 0, f"tensord exited with status {rc} after SIGTERM (negative: killed by signal {-rc})\n{self.describe()}"
        for mark in SANITIZER_MARKS:
            assert mark not in text, f"sanitizer report ({mark})\n{self.describe()}"
        return rc

    def stop(self, timeout=45):
        """SIGTERM, then assert exit 0 (also when the process already exited on its own: that must have been 0)."""
        if self.proc is None or self.stopped:
            return
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
        try:
            self.wait_exit(timeout)
        finally:
            self.errf.close()

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def rss_kib(self):
        return self._proc_status("VmRSS:")

    def thread_count(self):
        """Threads: of /proc/<pid>/status."""
        return self._proc_status("Threads:")

    def _proc_status(self, key):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
        return 0

    def stderr(self):
        try:
            with open(self.stderr_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def describe(self):
        rc = self.proc.poll() if self.proc else None
        return (f"command: {' '.join(self.args)}\nprocess: {'running' if rc is None else f'exited {rc}'}\n"
                f"--- tensord stderr (last 6000 chars) ---\n{self.stderr()[-6000:]}")

    # -- gRPC (grpc=True)
    @property
    def grpc_target(self):
        assert self.grpc, "Server(grpc=True) opens the gRPC port"
        return f"127.0.0.1:{self.grpc_port}"

    def grpc_channel(self, options=(), timeout=20):
        """A new insecure channel to the gRPC port with its own connection (grpcio would otherwise share one
        subchannel among channels with equal arguments), connected (grpc.channel_ready_future) within timeout.
        The caller closes it."""
        import grpc
        ch = grpc.insecure_channel(self.grpc_target, options=[("grpc.use_local_subchannel_pool", 1)] + list(options))
        try:
            grpc.channel_ready_future(ch).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            ch.close()
            pytest.fail(f"gRPC channel to {self.grpc_target} not ready within {timeout} s\n{self.describe()}")
        return ch

    # -- HTTP
    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, path, session=None, **kw):
        kw.setdefault("timeout", HTTP_TIMEOUT)
        return (session or requests).get(self.url(path), **kw)

    def post(self, path, session=None, **kw):
        kw.setdefault("timeout", HTTP_TIMEOUT)
        return (session or requests).post(self.url(path), **kw)

    def post_json(self, path, body, session=None, **kw):
        return self.post(path, session=session, data=json.dumps(body), headers={"Content-Type": "application/json"}, **kw)

    def raw(self, method, path, body=None, headers=None, timeout=HTTP_TIMEOUT):
        """A request with the path sent byte for byte (no client-side normalisation of '..' or %2F).
        Returns (status, headers dict, body bytes)."""
        import http.client
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            self.stop()
        else:
            self.kill()
            if self.errf:
                self.errf.close()


def server_fixture_finalize(srv):
    """For module fixtures: stop with SIGTERM and assert exit 0 (a failure here shows up as a teardown error)."""
    srv.stop()


# ----------------------------------------------------------------------------------------------------------------
# bundles and config files

def stage_version(base, version, fill):
    """Build <base>/.tmp-<version>-<pid>/ with fill(tmpdir), fsync it, then rename() it to <base>/<version>
    (DESIGN.md: a version directory is complete or absent). Returns the version directory."""
    base = str(base)
    os.makedirs(base, exist_ok=True)
    tmp = os.path.join(base, f".tmp-{version}-{os.getpid()}")
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    os.makedirs(tmp)
    fill(tmp)
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, os.path.join(base, str(version)))
    return os.path.join(base, str(version))


def write_version(base, version, model, signature=None, files=None):
    """Write <base>/<version>/ atomically (stage_version). model: onnx.ModelProto or bytes (bytes may be garbage,
    for corrupt-version tests)."""
    def fill(tmp):
        data = model if isinstance(model, (bytes, bytearray)) else model.SerializeToString()
        _write_synced(os.path.join(tmp, "model.onnx"), data)
        if signature is not None:
            _write_synced(os.path.join(tmp, "signature.json"), json.dumps(signature).encode())
        for name, content in (files or {}).items():
            p = os.path.join(tmp, name)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            _write_synced(p, content if isinstance(content, bytes) else content.encode())
    return stage_version(base, version, fill)


def _write_synced(path, data):
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def rest_version(srv, session, path="/v1/models/m:predict", headers=None, x=1.0):
    """A :predict on a version_model bundle; returns the version that answered (X-Model-Version, checked against the
    answer itself)."""
    r = srv.post(path, session=session, data=json.dumps({"instances": [[x]]}),
                 headers={"Content-Type": "application/json", **(headers or {})})
    assert r.status_code == 200, r.text
    v = int(r.headers["X-Model-Version"])
    assert r.json()["predictions"][0][0] == v, "the header and the answer disagree"
    return v


def write_text(path, text):
    with open(path, "w") as f:
        f.write(text)
    return str(path)


def model_config_text(models):
    """models: list of dicts {name, base_path, policy: None | 'all' | ('latest', n) | ('specific', [v...]),
    labels: {label: version}} -> TF Serving's model_config_list in protobuf text format."""
    out = ["model_config_list {"]
    for m in models:
        out.append("  config {")
        out.append(f"    name: '{m['name']}'")
        out.append(f"    base_path: '{m['base_path']}'")
        out.append("    model_platform: 'onnx'")
        pol = m.get("policy")
        if pol == "all":
            out.append("    model_version_policy { all {} }")
        elif isinstance(pol, tuple) and pol[0] == "latest":
            out.append(f"    model_version_policy {{ latest {{ num_versions: {pol[1]} }} }}")
        elif isinstance(pol, tuple) and pol[0] == "specific":
            vs = " ".join(f"versions: {v}" for v in pol[1])
            out.append(f"    model_version_policy {{ specific {{ {vs} }} }}")
        for k, v in (m.get("labels") or {}).items():
            out.append(f"    version_labels {{ key: '{k}' value: {v} }}")
        out.append("  }")
    out.append("}")
    return "\n".join(out) + "\n"


def instance_config_text(models):
    """[{name, base_path, instance_count (optional)}] -> model_config_list text with instance_count lines."""
    out = ["model_config_list {"]
    for m in models:
        out.append(f"  config {{ name: '{m['name']}' base_path: '{m['base_path']}' model_platform: 'onnx'")
        if "instance_count" in m:
            out.append(f"    instance_count: {m['instance_count']}")
        out.append("  }")
    return "\n".join(out + ["}"]) + "\n"


def engine_stats(s, model, version=1):
    """(seconds computing, seconds queued) of a version, from Triton's statistics extension."""
    r = s.get(f"/v2/models/{model}/versions/{version}/stats")
    assert r.status_code == 200, r.text
    st = r.json()["model_stats"][0]["inference_stats"]
    return st["compute_infer"]["ns"] / 1e9, st["queue"]["ns"] / 1e9


def timed_pair(s, model, call, join_s=150):
    """Run call(0) and call(1) at once (two threads released together) against version 1 of model.
    -> (window s from the first start to the last end, engine s, queue s from the version's statistics, results)."""
    import threading
    infer0, queue0 = engine_stats(s, model)
    go = threading.Barrier(2)
    res = [None, None]

    def one(i):
        go.wait(timeout=30)
        t0 = time.monotonic()
        out = call(i)
        res[i] = (t0, time.monotonic(), out)

    ths = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(2)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(timeout=join_s)
    assert all(not t.is_alive() for t in ths), "client threads hung"
    infer1, queue1 = engine_stats(s, model)
    window = max(e for _, e, _ in res) - min(b for b, _, _ in res)
    return window, infer1 - infer0, queue1 - queue0, [o for _, _, o in res]


# ----------------------------------------------------------------------------------------------------------------
# models

def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, F, s) for n, s in outputs],
        initializer=[numpy_helper.from_array(np.asarray(a), n) for n, a in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tensord-tests")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def randn(shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def mm_model(din=4, dout=4, seed=0, xname="x", yname="y"):
    """y = x @ W + b, x [N,din] -> y [N,dout]."""
    return _model([helper.make_node("MatMul", [xname, "W"], ["t"]), helper.make_node("Add", ["t", "B"], [yname])],
                  [(xname, ["N", din])], [(yname, ["N", dout])],
                  [("W", randn((din, dout), seed, 0.5)), ("B", randn((dout,), seed + 100, 0.5))])


def two_input_model(d=3):
    """y = 2a + b, a, b [N,d] -> y [N,d]."""
    return _model([helper.make_node("Mul", ["a", "two"], ["t"]), helper.make_node("Add", ["t", "b"], ["y"])],
                  [("a", ["N", d]), ("b", ["N", d])], [("y", ["N", d])], [("two", np.float32([2.0]))])


def classifier_model(din=4, classes=3, seed=5):
    """probs = softmax(x @ W), x [N,din] -> probs [N,classes]."""
    return _model([helper.make_node("MatMul", ["x", "W"], ["t"]), helper.make_node("Softmax", ["t"], ["probs"], axis=-1)],
                  [("x", ["N", din])], [("probs", ["N", classes])], [("W", randn((din, classes), seed))])


def regress_model(din=4, seed=6):
    """y = x @ w + 0.5, x [N,din] -> y [N,1]."""
    return _model([helper.make_node("MatMul", ["x", "W"], ["t"]), helper.make_node("Add", ["t", "B"], ["y"])],
                  [("x", ["N", din])], [("y", ["N", 1])], [("W", randn((din, 1), seed)), ("B", np.float32([0.5]))])


def version_model(version):
    """y = x * 0 + version, x [N,1] -> y [N,1]: every answer says which version computed it."""
    return _model([helper.make_node("Mul", ["x", "zero"], ["t"]), helper.make_node("Add", ["t", "ver"], ["y"])],
                  [("x", ["N", 1])], [("y", ["N", 1])], [("zero", np.float32([0.0])), ("ver", np.float32([version]))])


def slow_model(d=512, fan=64, layers=16, seed=7):
    """x [N,d] -> y [N,d]: each row is spread to a [fan, d] block (x * E, E a constant [fan, d]), pushed through
    `layers` MatMuls with one orthogonal [d,d] matrix (norm-preserving, so values stay O(1)), and averaged back
    over the fan axis. Cost per row: layers * fan * d * d multiply-adds (16*64*512*512 = 268M by default), with a
    small input and a ~1 MB weight, so requests are cheap to send but take a while to compute."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    nodes = [helper.make_node("Unsqueeze", ["x", "ax1"], ["x3"]), helper.make_node("Mul", ["x3", "E"], ["h0"])]
    for i in range(layers):
        nodes.append(helper.make_node("MatMul", [f"h{i}", "Q"], [f"h{i + 1}"]))
    nodes.append(helper.make_node("ReduceMean", [f"h{layers}"], ["y"], axes=[1], keepdims=0))
    return _model(nodes, [("x", ["N", d])], [("y", ["N", d])],
                  [("ax1", np.int64([1])), ("E", (rng.standard_normal((fan, d)) * 0.5 + 1).astype(np.float32)),
                   ("Q", q.astype(np.float32))])


def cnn_model():
    """The seed CNN (bench/models.py build_cnn): x [N,1,28,28] -> y [N,10]."""
    import sys
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import models as bench_models
    return bench_models.build_cnn()


# ----------------------------------------------------------------------------------------------------------------
# reference and comparisons

_sessions = {}


def ort_run(model, feeds):
    """{output name: array} from onnxruntime (no graph optimisations, one thread)."""
    key = id(model)
    sess = _sessions.get(key)
    if sess is None or sess[0] is not model:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        sess = (model, ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]))
        _sessions[key] = sess
    s = sess[1]
    names = [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(names, {k: np.asarray(v, dtype=np.float32) for k, v in feeds.items()})))


def max_rel_err(got, want):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if want.size == 0:
        return 0.0
    scale = max(float(np.max(np.abs(want))), 1e-30)
    return float(np.max(np.abs(got - want))) / scale


def assert_close(got, want, what="output"):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    err = max_rel_err(got, want)
    assert err <= TOL, f"{what}: max|got-want|/max|want| = {err:.3e} > {TOL:g}\ngot  {got}\nwant {want}"


def b64(arr):
    return base64.b64encode(np.ascontiguousarray(arr, dtype="<f4").tobytes()).decode()


def error_text(resp):
    """The JSON {"error": "..."} message of a reply, or fail describing the body."""
    try:
        body = resp.json() if hasattr(resp, "json") else json.loads(resp)
    except ValueError:
        pytest.fail(f"error reply is not JSON: HTTP {getattr(resp, 'status_code', '?')} body {resp.content[:500]!r}")
    assert isinstance(body, dict) and "error" in body, f"error reply has no 'error' key: {body!r}"
    msg = body["error"]
    assert isinstance(msg, str) and msg.strip(), f"'error' is not a non-empty string: {body!r}"
    return msg


def check_error(resp, statuses, *must_contain, pattern=None):
    """HTTP status in statuses (int or tuple), JSON {"error": msg}, msg mentions every must_contain (case-insensitive)."""
    if isinstance(statuses, int):
        statuses = (statuses,)
    assert resp.status_code in statuses, (f"expected HTTP {' or '.join(map(str, statuses))}, got {resp.status_code}: "
                                          f"{resp.content[:500]!r}")
    msg = error_text(resp)
    for s in must_contain:
        assert s.lower() in msg.lower(), f"error message does not mention {s!r}: {msg!r}"
    if pattern is not None:
        assert re.search(pattern, msg, re.I), f"error message does not match /{pattern}/: {msg!r}"
    return msg


def check_raw_error(status, body, statuses):
    if isinstance(statuses, int):
        statuses = (statuses,)
    assert status in statuses, f"expected HTTP {statuses}, got {status}: {body[:500]!r}"
    try:
        obj = json.loads(body)
    except ValueError:
        pytest.fail(f"error reply is not JSON: HTTP {status} body {body[:500]!r}")
    assert isinstance(obj, dict) and isinstance(obj.get("error"), str) and obj["error"].strip(), \
        f"error reply is not {{\"error\": \"...\"}}: {obj!r}"
    return obj["error"]


# ----------------------------------------------------------------------------------------------------------------
# Prometheus text

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\d+)?$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text):
    """-> list of (metric name, {label: value}, float value); comments skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m, f"not a Prometheus text sample line: {line!r}"
        labels = dict(_LABEL.findall(m.group(3) or ""))
        out.append((m.group(1), labels, float(m.group(4))))
    return out


def metric_samples(text, name, **labels):
    return [(lb, v) for n, lb, v in parse_prometheus(text) if n == name and all(lb.get(k) == v2 for k, v2 in labels.items())]
