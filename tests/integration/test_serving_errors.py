"""Bad requests and hostile clients against `tensord serve`: each is answered with the right HTTP status and a
JSON {"error": "..."} body (KServe endpoints too), and afterwards the server still serves a good request.

  m    features [N,4] -> scores [N,4]   (names chosen so that "the message names the input" is checkable)
  two  a [N,3], b [N,3] -> y

Also: a slow client holding partial requests open (dropped after --rest_api_connection_timeout_seconds=2 while
others are served), 1,000 connections opened at once, and SIGTERM while requests are in flight (they complete,
exit status 0).
"""
import errno
import json
import os
import selectors
import shutil
import socket
import subprocess
import threading
import time

import numpy as np
import pytest
import requests

import serving_util as u


@pytest.fixture(scope="module")
def model():
    return u.mm_model(4, 4, seed=3, xname="features", yname="scores")


@pytest.fixture(scope="module")
def srv(tmp_path_factory, model):
    tmp = tmp_path_factory.mktemp("errors")
    u.write_version(tmp / "models" / "m", 1, model)
    u.write_version(tmp / "models" / "two", 1, u.two_input_model(3))
    conf = u.write_text(tmp / "models.config", u.model_config_text(
        [{"name": "m", "base_path": str(tmp / "models" / "m")}, {"name": "two", "base_path": str(tmp / "models" / "two")}]))
    s = u.Server(tmp, config_file=conf, extra=["--rest_api_connection_timeout_seconds=2"])
    yield s
    u.server_fixture_finalize(s)


def assert_serving(srv, model):
    """The server is alive and answers a good TF Serving and a good KServe request correctly."""
    assert srv.alive(), f"tensord died\n{srv.describe()}"
    x = u.randn((2, 4), seed=99)
    want = u.ort_run(model, {"features": x})["scores"]
    r = srv.post_json("/v1/models/m:predict", {"instances": x.tolist()})
    assert r.status_code == 200, f"good predict after the bad one: HTTP {r.status_code} {r.content[:300]!r}\n{srv.describe()}"
    u.assert_close(r.json()["predictions"], want, "predictions after the bad request")
    r = srv.post_json("/v2/models/m/infer", {"inputs": [{"name": "features", "shape": [2, 4], "datatype": "FP32",
                                                          "data": x.reshape(-1).tolist()}]})
    assert r.status_code == 200, f"good infer after the bad one: HTTP {r.status_code} {r.content[:300]!r}"
    u.assert_close(np.array(r.json()["outputs"][0]["data"]).reshape(2, 4), want, "infer output after the bad request")


def predict(srv, body, path="/v1/models/m:predict"):
    return srv.post(path, data=body if isinstance(body, (str, bytes)) else json.dumps(body),
                    headers={"Content-Type": "application/json"})


def infer(srv, body, path="/v2/models/m/infer"):
    return predict(srv, body, path)


def kin(shape, data, datatype="FP32", name="features"):
    return {"inputs": [{"name": name, "shape": shape, "datatype": datatype, "data": data}]}


# ----------------------------------------------------------------------------------------------------------------
# malformed bodies

@pytest.mark.parametrize("body", ['{"instances": [[1,2,3,4]', "not json", "", '{"instances": [[1,2,3,4]]} trailing',
                                  '{"instances": [[1,2,3,4],]}', "[]", '{"nothing": 1}', '{"instances": 5}'])
def test_malformed_json_predict(srv, model, body):
    u.check_error(predict(srv, body), 400)
    assert_serving(srv, model)


@pytest.mark.parametrize("body", ['{"inputs": [', "{}", '{"inputs": {}}', '{"inputs": [{"name": "features"}]}'])
def test_malformed_json_infer(srv, model, body):
    u.check_error(infer(srv, body), 400)
    assert_serving(srv, model)


def test_deep_nesting(srv, model):
    deep = "[" * 10000 + "1" + "]" * 10000
    u.check_error(predict(srv, '{"instances": ' + deep + "}"), 400)
    u.check_error(predict(srv, '{"inputs": {"features": ' + deep + "}}"), 400)
    u.check_error(predict(srv, '{"a":' * 10000 + "1" + "}" * 10000), 400)
    u.check_error(infer(srv, '{"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32", "data": '
                             + deep + "}]}"), 400)
    # unbalanced: 10,000 opening brackets only
    u.check_error(predict(srv, '{"instances": ' + "[" * 10000), 400)
    assert_serving(srv, model)


# ----------------------------------------------------------------------------------------------------------------
# wrong names, dtypes, shapes

def test_wrong_input_name(srv, model):
    u.check_error(predict(srv, {"instances": [{"nope": [1, 2, 3, 4]}]}), 400, "nope")
    u.check_error(predict(srv, {"inputs": {"nope": [[1, 2, 3, 4]]}}), 400, "nope")
    u.check_error(infer(srv, kin([1, 4], [1, 2, 3, 4], name="nope")), 400, "nope")
    # a required input missing
    u.check_error(predict(srv, {"instances": [{"a": [1, 2, 3]}]}, "/v1/models/two:predict"), 400, "b")
    u.check_error(infer(srv, kin([1, 3], [1, 2, 3], name="a"), "/v2/models/two/infer"), 400, "b")
    assert_serving(srv, model)


def test_wrong_dtype(srv, model):
    u.check_error(predict(srv, {"instances": [["a", "b", "c", "d"]]}), 400, "features")
    u.check_error(predict(srv, {"inputs": {"features": [["a", "b", "c", "d"]]}}), 400, "features")
    u.check_error(predict(srv, {"instances": [[{"x": 1}, 2, 3, 4]]}), 400)
    u.check_error(infer(srv, kin([1, 4], ["a", "b", "c", "d"], datatype="BYTES")), 400, "features")
    u.check_error(infer(srv, kin([1, 4], [1, 2, 3, 4], datatype="INT64")), 400, "features")
    u.check_error(infer(srv, kin([1, 4], ["a", "b", "c", "d"])), 400, "features")
    u.check_error(infer(srv, kin([1, 4], [1, 2, 3, 4], datatype="NOT_A_TYPE")), 400)
    assert_serving(srv, model)


def test_wrong_shape(srv, model):
    msg = u.check_error(predict(srv, {"instances": [[1, 2, 3]]}), 400, "features")
    assert "4" in msg and "3" in msg, f"shape error should say expected vs got: {msg!r}"
    msg = u.check_error(predict(srv, {"inputs": {"features": [[1, 2, 3, 4, 5]]}}), 400, "features")
    assert "4" in msg and "5" in msg, f"shape error should say expected vs got: {msg!r}"
    u.check_error(predict(srv, {"instances": [[1, 2, 3, 4], [1, 2]]}), 400)  # ragged
    u.check_error(predict(srv, {"instances": [[[1, 2, 3, 4]]]}), 400, "features")  # rank 3
    u.check_error(predict(srv, {"instances": []}), 400)
    msg = u.check_error(infer(srv, kin([1, 3], [1, 2, 3])), 400, "features")
    assert "4" in msg and "3" in msg, f"shape error should say expected vs got: {msg!r}"
    u.check_error(infer(srv, kin([2, 4], [1, 2, 3, 4])), 400, "features")  # declared shape vs data count
    u.check_error(infer(srv, kin([1, -4], [1, 2, 3, 4])), 400)
    assert_serving(srv, model)


def test_huge_declared_shape(srv, model):
    rss0 = srv.rss_kib()
    t0 = time.monotonic()
    u.check_error(infer(srv, kin([1099511627776, 1024], [1, 2, 3, 4])), 400, "features")
    # exactly 2^40 elements with the signature's trailing dim, so only the element count can reject it
    u.check_error(infer(srv, kin([274877906944, 4], [1, 2, 3, 4])), 400, "features")
    u.check_error(infer(srv, kin([4294967296, 4294967296, 16], [1, 2, 3, 4])), 400)  # product overflows int64
    for shape in ([1099511627776, 1024], [274877906944, 4]):
        hdr = json.dumps({"inputs": [{"name": "features", "shape": shape, "datatype": "FP32",
                                      "parameters": {"binary_data_size": 16}}]}).encode()
        r = srv.post("/v2/models/m/infer", data=hdr + np.zeros(4, "<f4").tobytes(),
                     headers={"Inference-Header-Content-Length": str(len(hdr)), "Content-Type": "application/octet-stream"})
        u.check_error(r, 400, "features")
    hdr = json.dumps({"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32",
                                  "parameters": {"binary_data_size": 1099511627776}}]}).encode()
    r = srv.post("/v2/models/m/infer", data=hdr + np.zeros(4, "<f4").tobytes(),
                 headers={"Inference-Header-Content-Length": str(len(hdr)), "Content-Type": "application/octet-stream"})
    u.check_error(r, 400)
    r = srv.post("/v2/models/m/infer", data=hdr, headers={"Inference-Header-Content-Length": "99999999999",
                                                         "Content-Type": "application/octet-stream"})
    u.check_error(r, 400)
    elapsed = time.monotonic() - t0
    grew = (srv.rss_kib() - rss0) / 1024
    assert elapsed < 10, f"rejecting huge shapes took {elapsed:.1f} s"
    assert grew < 100, f"RSS grew by {grew:.0f} MiB while rejecting a 2^40-element shape"
    assert_serving(srv, model)


def test_bad_signature_name(srv, model):
    u.check_error(predict(srv, {"signature_name": "nope", "instances": [[1, 2, 3, 4]]}), 400, "nope")
    assert_serving(srv, model)


# ----------------------------------------------------------------------------------------------------------------
# size limit

def _read_http_response(sock, deadline):
    """Read one HTTP/1.1 response (headers + Content-Length body) from a blocking socket; -> (status, body, raw)."""
    data = b""
    while b"\r\n\r\n" not in data:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    if not lines[0].startswith(b"HTTP/1."):
        return None, b"", data
    status = int(lines[0].split()[1])
    clen = None
    for line in lines[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            clen = int(v.strip())
    while clen is not None and len(body) < clen and time.monotonic() < deadline:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, socket.timeout):
            break
        if not chunk:
            break
        body += chunk
    return status, body, data


def test_body_65mib_raw(srv, model):
    """A 65 MiB POST (limit 64 MiB): 413 with a JSON error, sent the way a client without Expect does (the
    server may answer before the body is sent: stop sending when the answer arrives)."""
    size = 65 * 1024 * 1024
    head = (f"POST /v1/models/m:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {size}\r\n\r\n").encode()
    chunk = b"1," * (512 * 1024)
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    deadline = time.monotonic() + 60
    sel = selectors.DefaultSelector()
    try:
        sock.sendall(head)
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
        sent, buf, got, closed = 0, memoryview(b""), b"", False
        while time.monotonic() < deadline and not closed:
            want = selectors.EVENT_READ | (selectors.EVENT_WRITE if sent < size else 0)
            sel.modify(sock, want)
            for _, ev in sel.select(timeout=1):
                if ev & selectors.EVENT_READ:
                    try:
                        d = sock.recv(65536)
                    except ConnectionResetError:
                        d = b""
                    if not d:
                        closed = True
                    got += d
                if ev & selectors.EVENT_WRITE and sent < size and not closed:
                    if not len(buf):
                        buf = memoryview(chunk[:min(len(chunk), size - sent)])
                    try:
                        n = sock.send(buf)
                    except (BrokenPipeError, ConnectionResetError):
                        sent = size
                        continue
                    buf = buf[n:]
                    sent += n
            if b"\r\n\r\n" in got and sent >= size:
                hdr = got.split(b"\r\n\r\n")[0].lower()
                if b"content-length:" in hdr:
                    clen = int(hdr.split(b"content-length:")[1].split(b"\r\n")[0])
                    if len(got.split(b"\r\n\r\n", 1)[1]) >= clen:
                        break
            if b"\r\n\r\n" in got and sent < size:
                sent = size  # the answer came before the body was sent: stop sending, read the rest
    finally:
        sel.close()
        sock.close()
    assert got.startswith(b"HTTP/1."), f"no HTTP answer to a 65 MiB body (got {got[:200]!r})\n{srv.describe()}"
    status = int(got.split()[1])
    body = got.split(b"\r\n\r\n", 1)[1]
    u.check_raw_error(status, body, 413)
    assert_serving(srv, model)


def test_body_65mib_curl(srv, model, tmp_path):
    """The same with curl (which sends Expect: 100-continue for big bodies)."""
    curl = shutil.which("curl")
    assert curl, "curl is not installed (apt-get install curl)"
    p = tmp_path / "big.json"
    with open(p, "wb") as f:
        f.truncate(65 * 1024 * 1024)
    cp = subprocess.run([curl, "-sS", "--max-time", "60", "-o", str(tmp_path / "out"), "-w", "%{http_code}",
                         "-H", "Content-Type: application/json", "--data-binary", f"@{p}",
                         srv.url("/v1/models/m:predict")], capture_output=True, text=True, timeout=90)
    assert cp.stdout.strip() == "413", f"curl: HTTP {cp.stdout!r} {cp.stderr!r}"
    u.check_raw_error(413, (tmp_path / "out").read_bytes(), 413)
    assert_serving(srv, model)


# ----------------------------------------------------------------------------------------------------------------
# unknown models, versions, labels; path traversal

@pytest.mark.parametrize("method,path", [
    ("GET", "/v1/models/nope"), ("GET", "/v1/models/nope/metadata"), ("POST", "/v1/models/nope:predict"),
    ("POST", "/v1/models/nope:classify"), ("GET", "/v2/models/nope"), ("POST", "/v2/models/nope/infer"),
    ("GET", "/v1/models/m/versions/9"), ("GET", "/v1/models/m/versions/9/metadata"),
    ("POST", "/v1/models/m/versions/9:predict"), ("GET", "/v2/models/m/versions/9"),
    ("POST", "/v2/models/m/versions/9/infer")])
def test_unknown_model_or_version(srv, model, method, path):
    if "classify" in path:
        body = {"examples": [{"features": [1, 2, 3, 4]}]}
    elif "v1" in path:
        body = {"instances": [[1, 2, 3, 4]]}
    else:
        body = kin([1, 4], [1, 2, 3, 4])
    r = srv.get(path) if method == "GET" else predict(srv, body, path)
    u.check_error(r, 404, "nope" if "nope" in path else "9")
    assert_serving(srv, model)


def test_unknown_model_ready(srv, model):
    for path in ("/v2/models/nope/ready", "/v2/models/m/versions/9/ready"):
        r = srv.get(path)
        # KServe v2: "A 200 status code indicates true and a 4xx status code indicates false"; an unknown model
        # or version is not "loading" (503) but absent (Triton: 400; tensord's other endpoints: 404)
        assert r.status_code in (400, 404), f"GET {path}: HTTP {r.status_code}, want 4xx (404) for an unknown model/version"
        u.error_text(r)


@pytest.mark.parametrize("method,path", [("GET", "/v1/models/m/labels/nope"),
                                         ("POST", "/v1/models/m/labels/nope:predict"),
                                         ("GET", "/v1/models/m/labels/nope/metadata")])
def test_unknown_label(srv, model, method, path):
    r = srv.get(path) if method == "GET" else predict(srv, {"instances": [[1, 2, 3, 4]]}, path)
    u.check_error(r, (404, 400), "nope")
    assert_serving(srv, model)


@pytest.mark.parametrize("path", [
    "/v1/models/..%2F..%2Fetc", "/v1/models/..%2F..%2Fetc/metadata", "/v1/models/..%2F..%2Fetc:predict",
    "/v1/models/../x", "/v1/models/../x:predict", "/v1/models/%2e%2e", "/v1/models/..", "/v1/models/.",
    "/v1/models/m/versions/1/../../../etc", "/v1/models/m%2F..%2F..", "/v2/models/..%2F..%2Fetc",
    "/v2/models/../x", "/v2/models/..%2F..%2Fetc/infer", "/v2/models/../x/ready", "/v1/models/m/versions/abc",
    "/v1/models/m/versions/-1", "/v1/models/m/versions/99999999999999999999999", "/v1/models/m%00", "/v1/nothing"])
def test_bad_paths(srv, model, path):
    for method in ("GET", "POST"):
        body = b'{"instances": [[1, 2, 3, 4]]}' if method == "POST" else None
        status, hdrs, data = srv.raw(method, path, body=body, headers={"Content-Type": "application/json"})
        assert status != 200, f"{method} {path}: HTTP 200 {data[:300]!r}"
        u.check_raw_error(status, data, (400, 404, 405))
    assert_serving(srv, model)


# ----------------------------------------------------------------------------------------------------------------
# slow clients

def test_slow_clients_dropped(srv, model):
    """20 connections hold partial requests open (10 mid-headers, 10 mid-body); good requests are served meanwhile;
    every partial connection is closed about --rest_api_connection_timeout_seconds=2 after its last byte."""
    socks = []
    for i in range(20):
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        if i % 2:
            s.sendall(b"POST /v1/models/m:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: app")
        else:
            s.sendall(b"POST /v1/models/m:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 200\r\n\r\n{\"inst")
        socks.append((s, time.monotonic()))
    try:
        t_end = time.monotonic() + 1.2
        n = 0
        while time.monotonic() < t_end:
            t0 = time.monotonic()
            r = srv.post_json("/v1/models/m:predict", {"instances": [[1, 2, 3, 4]]}, timeout=5)
            assert r.status_code == 200, f"good request while slow clients hold connections: HTTP {r.status_code}"
            assert time.monotonic() - t0 < 1.5, "good request took > 1.5 s while slow clients hold connections"
            n += 1
        assert n >= 3
        for s, t_sent in socks:
            s.settimeout(max(0.1, t_sent + 12 - time.monotonic()))
            data = b""
            try:
                while True:
                    d = s.recv(4096)
                    if not d:
                        break
                    data += d
            except ConnectionResetError:
                pass
            except socket.timeout:
                pytest.fail(f"a partial request was still open 12 s after its last byte (timeout 2 s)\n{srv.describe()}")
            dt = time.monotonic() - t_sent
            assert dt >= 1.0, f"partial request dropped after {dt:.2f} s, before the 2 s timeout"
            assert dt <= 8.0, f"partial request dropped only after {dt:.2f} s (timeout 2 s)"
            assert not data or data.startswith(b"HTTP/1.1 4"), f"unexpected bytes on a timed-out connection: {data[:200]!r}"
    finally:
        for s, _ in socks:
            s.close()
    assert_serving(srv, model)


# ----------------------------------------------------------------------------------------------------------------
# many connections at once

def test_thousand_connections(srv, model):
    """1,000 sockets connect at once, then each sends a predict; each gets a complete HTTP answer (200 with the
    right body, or a 503/429 refusal with a JSON error) or a clean refusal (connection refused/reset/closed
    without bytes); nothing hangs; the server answers afterwards."""
    N = 1000
    x = [[1.0, 2.0, 3.0, 4.0]]
    want = u.ort_run(model, {"features": np.float32(x)})["scores"]
    body = json.dumps({"instances": x}).encode()
    req = (f"POST /v1/models/m:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body
    sel = selectors.DefaultSelector()
    conns = {}
    refused = 0
    for i in range(N):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        rc = s.connect_ex(("127.0.0.1", srv.port))
        if rc not in (0, errno.EINPROGRESS):
            refused += 1
            s.close()
            continue
        conns[s] = {"sent": 0, "data": b"", "done": False}
        sel.register(s, selectors.EVENT_WRITE)
    deadline = time.monotonic() + 90
    pending = len(conns)
    statuses = {}
    try:
        while pending and time.monotonic() < deadline:
            for key, ev in sel.select(timeout=1):
                s = key.fileobj
                c = conns[s]
                if ev & selectors.EVENT_WRITE:
                    err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    try:
                        if err:
                            raise ConnectionRefusedError(err, os.strerror(err))
                        c["sent"] += s.send(req[c["sent"]:])
                    except (ConnectionError, OSError):
                        c["done"] = "refused"
                    if c["done"] or c["sent"] == len(req):
                        sel.modify(s, selectors.EVENT_READ)
                    if c["done"]:
                        sel.unregister(s)
                        pending -= 1
                    continue
                try:
                    d = s.recv(65536)
                except ConnectionError:
                    d = None
                if d:
                    c["data"] += d
                    continue
                c["done"] = "reset" if d is None else "eof"
                sel.unregister(s)
                pending -= 1
        hung = [c for c in conns.values() if not c["done"]]
        bad = []
        for c in conns.values():
            if not c["done"]:
                continue
            if not c["data"]:
                statuses["refused"] = statuses.get("refused", 0) + 1
                continue
            head, _, rbody = c["data"].partition(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 "):
                bad.append(c["data"][:200])
                continue
            st = int(head.split()[1])
            statuses[st] = statuses.get(st, 0) + 1
            try:
                obj = json.loads(rbody)
            except ValueError:
                bad.append(c["data"][:300])
                continue
            if st == 200:
                if max_err(obj.get("predictions"), want) > u.TOL:
                    bad.append(c["data"][:300])
            elif st not in (429, 503) or not isinstance(obj, dict) or "error" not in obj:
                bad.append(c["data"][:300])
    finally:
        for s in conns:
            s.close()
        sel.close()
    summary = f"statuses {statuses}, refused at connect {refused}, hung {len(hung)}, bad {len(bad)}"
    assert not hung, f"{len(hung)} connections neither answered nor closed within 90 s: {summary}\n{srv.describe()}"
    assert not bad, f"bad answers: {bad[:3]}; {summary}"
    assert statuses.get(200, 0) > 0, f"no connection got an answer: {summary}"
    print(summary)
    assert_serving(srv, model)


def max_err(got, want):
    try:
        return u.max_rel_err(np.asarray(got, dtype=np.float64), want)
    except (TypeError, ValueError):
        return float("inf")


# ----------------------------------------------------------------------------------------------------------------
# SIGTERM drains in-flight requests

def test_sigterm_drains_inflight(tmp_path):
    slow = u.slow_model()
    u.write_version(tmp_path / "slow", 1, slow)
    s = u.Server(tmp_path, base_path=str(tmp_path / "slow"), model_name="slow")
    try:
        def call(rows, seed):
            x = u.randn((rows, 512), seed=seed)
            t0 = time.monotonic()
            r = requests.post(s.url("/v1/models/slow:predict"), data=json.dumps({"instances": x.tolist()}), timeout=120)
            return x, r, t0, time.monotonic()

        call(2, 0)
        _, r, t0, t1 = call(4, 1)  # calibrate: aim at ~300 ms per request
        assert r.status_code == 200, f"HTTP {r.status_code} {r.content[:300]!r}\n{s.describe()}"
        per_row = (t1 - t0) / 4
        rows = int(min(128, max(1, round(0.3 / max(per_row, 1e-4)))))
        results = [None] * 3
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, call(rows, 10 + i))) for i in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.1)
        t_sig = time.monotonic()
        s.signal()
        for t in threads:
            t.join(timeout=120)
        assert all(r is not None for r in results), f"a request did not return\n{s.describe()}"
        for x, r, _, _ in results:
            assert r.status_code == 200, (f"in-flight request during SIGTERM drain: HTTP {r.status_code} "
                                          f"{r.content[:300]!r}\n{s.describe()}")
            u.assert_close(r.json()["predictions"], u.ort_run(slow, {"x": x})["y"], "drained request")
        assert any(t_done > t_sig for _, _, _, t_done in results), \
            f"no request was still running at SIGTERM (rows={rows}, {per_row * 1e3:.1f} ms/row): the test proved nothing"
        s.wait_exit(timeout=60)
    finally:
        s.kill()


# ----------------------------------------------------------------------------------------------------------------
# a slow request must not hold up other connections while HTTP threads are idle

def test_slow_request_does_not_block_other_connections(tmp_path):
    """4 HTTP threads; 24 keep-alive connections opened at once; 2 of them send a slow predict (~0.4 s). Two
    threads stay idle, so a tiny predict on each of the other 22 connections must be answered at once (< half the
    slow request's time), not after the slow requests that happen to share its HTTP thread (head-of-line
    blocking: a handler that runs inference on the connection's polling thread stalls every connection that
    thread owns; with 24 connections on 4 threads, a slow connection's thread almost surely owns fast ones)."""
    slow, fast = u.slow_model(), u.mm_model(4, 4, seed=3, xname="features", yname="scores")
    u.write_version(tmp_path / "slow", 1, slow)
    u.write_version(tmp_path / "m", 1, fast)
    conf = u.write_text(tmp_path / "models.config", u.model_config_text(
        [{"name": "slow", "base_path": str(tmp_path / "slow")}, {"name": "m", "base_path": str(tmp_path / "m")}]))

    def req(path, body):
        return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode() + body

    with u.Server(tmp_path, config_file=conf, extra=["--rest_api_num_threads=4"]) as s:
        t0 = time.monotonic()
        r = s.post_json("/v1/models/slow:predict", {"instances": u.randn((2, 512)).tolist()})
        assert r.status_code == 200
        per_row = (time.monotonic() - t0) / 2
        rows = int(min(128, max(1, round(0.4 / max(per_row, 1e-4)))))
        slow_req = req("/v1/models/slow:predict", json.dumps({"instances": u.randn((rows, 512)).tolist()}).encode())
        fast_req = req("/v1/models/m:predict", b'{"instances": [[1, 2, 3, 4]]}')
        worst = []
        for trial in range(2):
            socks = [socket.create_connection(("127.0.0.1", s.port), timeout=30) for _ in range(24)]
            try:
                time.sleep(0.2)
                t_slow = time.monotonic()
                for k in socks[:2]:
                    k.sendall(slow_req)
                time.sleep(0.02)
                lat = []
                for k in socks[2:]:
                    t = time.monotonic()
                    k.sendall(fast_req)
                    st, body, raw = _read_http_response(k, time.monotonic() + 30)
                    lat.append(time.monotonic() - t)
                    assert st == 200, f"fast request: {raw[:300]!r}"
                for k in socks[:2]:
                    st, body, raw = _read_http_response(k, time.monotonic() + 60)
                    assert st == 200, f"slow request: {raw[:300]!r}"
                slow_t = time.monotonic() - t_slow
            finally:
                for k in socks:
                    k.close()
            worst.append((max(lat), slow_t, [round(x * 1e3) for x in lat]))
        for mx, slow_t, lat in worst:
            assert mx < slow_t / 2, (f"a tiny predict on an idle connection waited {mx * 1e3:.0f} ms while two slow "
                                     f"requests ({slow_t * 1e3:.0f} ms) ran and 2 of 4 HTTP threads were free: "
                                     f"head-of-line blocking (fast latencies ms: {lat}; all trials: {worst})")
