"""The REST server under hostile and careless clients (issue 9): each test reproduces one way the server was
made to misbehave, against the real binary on loopback.

  port in use            a second `tensord serve` on a taken port exits non-zero with "address in use"
  slow clients           2,100 trickling connections from one address: predict and health still answer at once;
                         a trickle does not extend --rest_api_header_timeout_seconds
  connection limits      at --rest_api_connection_limit: immediate 503 + Retry-After, health still answers;
                         --rest_api_per_ip_connection_limit: 503 naming the address, other addresses served
  drain deadline         requests still running at --drain_seconds get 503; exit within a second, status 3
  framing                duplicate Content-Length, Content-Length + Transfer-Encoding, raw NUL in the URL: 400 and
                         close (first request and a later keep-alive one); 431 / 414 bodies are JSON
  content codings        gzip / deflate request bodies (tritonclient and raw), the limit on the inflated size (zip
                         bomb), corrupt data, unknown coding; compressed replies on Accept-Encoding
  demo address           `make serve-demo` binds 127.0.0.1; the listen address is logged

Counts and times are bounded; every socket has a timeout. Source address 127.0.0.2 (Linux routes all of
127/8 to loopback) stands in for "another client address".
"""
import gzip
import json
import os
import resource
import signal
import socket
import subprocess
import threading
import time
import zlib

import numpy as np
import pytest
import requests

import serving_util as u


@pytest.fixture(scope="module")
def model():
    return u.mm_model(4, 4, seed=3)


@pytest.fixture(scope="module")
def wide():
    return u.mm_model(4, 512, seed=4)  # one row -> 512 floats: a reply well over the 1 KiB compression floor


def start(tmp, model, extra=(), wide=None):
    u.write_version(tmp / "m", 1, model)
    models = [{"name": "m", "base_path": str(tmp / "m")}]
    if wide is not None:
        u.write_version(tmp / "wide", 1, wide)
        models.append({"name": "wide", "base_path": str(tmp / "wide")})
    conf = u.write_text(tmp / "models.config", u.model_config_text(models))
    return u.Server(tmp, config_file=conf, extra=list(extra))


def good_predict(srv, model, timeout=5, source=None):
    x = u.randn((1, 4), seed=5)
    body = json.dumps({"instances": x.tolist()}).encode()
    status, _, data = raw_request(srv.port, b"POST /v1/models/m:predict HTTP/1.1\r\nHost: t\r\nContent-Type: "
                                  b"application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body,
                                  timeout=timeout, source=source)
    if status == 200:
        u.assert_close(json.loads(data)["predictions"], u.ort_run(model, {"x": x})["y"], "predict")
    return status, data


def predict_soon(srv, model, when, timeout=5):
    """A good predict answers 200 within timeout (the server notices closed connections asynchronously)."""
    end = time.monotonic() + timeout
    while True:
        st, body = good_predict(srv, model)
        if st == 200 or time.monotonic() > end:
            break
        time.sleep(0.05)
    assert st == 200, f"{when}: HTTP {st} {body[:200]!r}"


def connect(port, source=None, timeout=5):
    return socket.create_connection(("127.0.0.1", port), timeout=timeout,
                                    source_address=(source, 0) if source else None)


def read_response(s, timeout=5):
    """One HTTP/1.1 response from s: (status, headers dict lower-case, body). Reads by Content-Length."""
    s.settimeout(timeout)
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = s.recv(65536)
        if not d:
            raise ConnectionError(f"closed before a full response head: {buf[:300]!r}")
        buf += d
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    hdrs = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    n = int(hdrs.get("content-length", "0"))
    while len(body) < n:
        d = s.recv(65536)
        if not d:
            break
        body += d
    return status, hdrs, body[:n]


def raw_request(port, data, timeout=5, source=None):
    with connect(port, source, timeout) as s:
        s.sendall(data)
        st, hdrs, body = read_response(s, timeout)
        return st, hdrs, body


def closed_after(s, timeout=3):
    """True if the server closes s (EOF or reset) within timeout, with nothing more sent."""
    s.settimeout(timeout)
    try:
        return s.recv(65536) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def assert_json_error(status, body, want_status, *words):
    assert status == want_status, f"HTTP {status} (want {want_status}): {body[:300]!r}"
    try:
        obj = json.loads(body)
    except ValueError:
        pytest.fail(f"HTTP {status} body is not JSON: {body[:300]!r}")
    assert isinstance(obj, dict) and isinstance(obj.get("error"), str) and obj["error"], obj
    for w in words:
        assert w.lower() in obj["error"].lower(), f"error {obj['error']!r} does not mention {w!r}"


def raise_nofile(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(n, hard), hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# ----------------------------------------------------------------------------------------------------------------
# 1. a port in use

def test_second_server_on_same_port_fails(tmp_path, model):
    srv = start(tmp_path, model)
    try:
        other = tmp_path / "other"
        u.write_version(other, 1, u.version_model(7))
        p = subprocess.run([u.tensord_bin(), "serve", f"--rest_api_port={srv.port}", "--rest_api_host=127.0.0.1",
                            "--port=0", "--model_name=m", f"--model_base_path={other}"],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode != 0, f"second server on a taken port exited {p.returncode}\n{p.stderr}"
        assert "address in use" in p.stderr, f"no 'address in use' in the second server's log:\n{p.stderr}"
        assert str(srv.port) in p.stderr, p.stderr
        for _ in range(10):  # the first server still answers everything, with its own model
            st, body = good_predict(srv, model)
            assert st == 200, body
    finally:
        srv.stop()


# ----------------------------------------------------------------------------------------------------------------
# 2. slow clients

def open_trickling(port, n, source=None):
    """n connections, each having sent one byte of a request head."""
    socks = []
    for _ in range(n):
        try:
            s = connect(port, source, timeout=5)
            s.sendall(b"P")
            socks.append(s)
        except OSError:
            pass  # refused or reset by the server's limits: fine
    return socks


@pytest.mark.parametrize("slow_source", ["127.0.0.1", "127.0.0.2"])
def test_2100_slow_clients_from_one_address(tmp_path, model, slow_source):
    raise_nofile(8192)
    srv = start(tmp_path, model)
    socks = []
    try:
        socks = open_trickling(srv.port, 2100, source=slow_source)
        assert len(socks) >= 2000, f"only {len(socks)} of 2100 connects succeeded"
        for s in socks[:50]:  # a second byte: the trickle goes on
            try:
                s.send(b"O")
            except OSError:
                pass
        for what, fn in (("predict", lambda: good_predict(srv, model, timeout=5)),
                         ("health", lambda: raw_request(srv.port, b"GET /v2/health/ready HTTP/1.1\r\nHost: t\r\n\r\n")[::2])):
            t0 = time.monotonic()
            st, body = fn()
            dt = time.monotonic() - t0
            assert st == 200, f"{what} with 2100 slow clients from {slow_source}: HTTP {st} {body[:300]!r}\n{srv.describe()}"
            assert dt < 1.0, f"{what} took {dt:.2f} s with 2100 slow clients from {slow_source}"
        # the slow address holds at most its per-address share; every reply the slow ones got is a JSON 503/408
        open_count, replies = 0, {}
        for s in socks:
            s.setblocking(False)
            try:
                d = s.recv(4096, socket.MSG_PEEK)
                if d:
                    st = int(d.split()[1])
                    replies[st] = replies.get(st, 0) + 1
                    assert st in (408, 503), d[:300]
                    assert json.loads(d.partition(b"\r\n\r\n")[2])["error"]
            except BlockingIOError:
                open_count += 1
            except OSError:
                pass
        # its share (256) plus the 16 provisional slots a connection over the share waits in
        assert open_count <= 256 + 16, f"{open_count} trickling connections from one address still open (limit 256)"
        assert replies.get(503, 0) > 0, f"no 503 for connections over the per-address limit: {replies}"
    finally:
        for s in socks:
            s.close()
        srv.stop()


@pytest.mark.parametrize("part", ["head", "body"])
def test_trickle_does_not_extend_header_deadline(tmp_path, model, part):
    """One byte every 0.25 s (MHD's idle timeout would restart on each): cut about 2 s after the accept."""
    srv = start(tmp_path, model, extra=["--rest_api_header_timeout_seconds=2"])
    try:
        s = connect(srv.port)
        if part == "head":
            prefix, trickle = b"", b"POST /v1/models/m:predict HTTP/1.1\r\nHost: t\r\nX-Slow: " + b"a" * 200
        else:
            prefix, trickle = b"POST /v1/models/m:predict HTTP/1.1\r\nHost: t\r\nContent-Length: 400\r\n\r\n", b"[" * 400
        t0 = time.monotonic()
        data = b""
        try:
            s.sendall(prefix)
            for i in range(len(trickle)):
                s.send(trickle[i:i + 1])
                s.settimeout(0.25)
                try:
                    d = s.recv(4096)
                    data += d
                    if not d or data:
                        break
                except socket.timeout:
                    pass
                if time.monotonic() - t0 > 15:
                    break
        except (BrokenPipeError, ConnectionResetError):
            pass
        dt = time.monotonic() - t0
        assert 1.5 <= dt <= 5.0, f"a trickling {part} was cut after {dt:.2f} s (deadline 2 s from the accept)"
        if data:
            st = int(data.split()[1])
            assert_json_error(st, data.partition(b"\r\n\r\n")[2], 408, "rest_api_header_timeout_seconds")
        s.close()
        st, body = good_predict(srv, model)
        assert st == 200, body
    finally:
        srv.stop()


# ----------------------------------------------------------------------------------------------------------------
# 2b. the connection limits: 503 at once, health still answers

def keepalive_clients(port, n, source=None):
    """Up to n connections that each completed one request and stay open (keep-alive), idle; stops at the first
    refusal (this process may hold a connection of its own to the server, from an HTTP client's pool)."""
    out = []
    for _ in range(n):
        s = connect(port, source)
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n")
        st, _, body = read_response(s)
        if st != 200:
            s.close()
            break
        out.append(s)
    assert len(out) >= n - 1, f"only {len(out)} of {n} keep-alive connections accepted"
    return out


def test_connection_limit_503_and_health(tmp_path, model):
    srv = start(tmp_path, model, extra=["--rest_api_connection_limit=8", "--rest_api_per_ip_connection_limit=1000"])
    held = []
    try:
        time.sleep(0.5)
        held = keepalive_clients(srv.port, 8)
        t0 = time.monotonic()
        with connect(srv.port) as s:
            s.sendall(b"POST /v1/models/m:predict HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}")
            st, hdrs, body = read_response(s)
        assert time.monotonic() - t0 < 1.0, "the refusal at the limit was not immediate"
        assert_json_error(st, body, 503, "connection limit", "rest_api_connection_limit")
        assert hdrs.get("retry-after"), f"503 without Retry-After: {hdrs}"
        for path in (b"/v2/health/ready", b"/v2/health/live", b"/v1/models/m", b"/v2/models/m/ready"):
            st, _, body = raw_request(srv.port, b"GET " + path + b" HTTP/1.1\r\nHost: t\r\n\r\n")
            assert st == 200, f"health {path!r} at the connection limit: HTTP {st} {body[:200]!r}"
        for s in held:
            s.close()
        held = []
        predict_soon(srv, model, "after the held connections closed")
    finally:
        for s in held:
            s.close()
        srv.stop()


def test_per_address_limit(tmp_path, model):
    srv = start(tmp_path, model, extra=["--rest_api_per_ip_connection_limit=4"])
    held = []
    try:
        # Keep-alive connections from 127.0.0.1 until the server refuses one. This process may hold a connection
        # of its own to the server (an HTTP client's pool), so the refusal comes at the 4th or 5th.
        refused = None
        for _ in range(5):
            s = connect(srv.port)
            s.sendall(b"GET /v1/models/m HTTP/1.1\r\nHost: t\r\n\r\n")
            st, hdrs, body = read_response(s)
            if st != 200:
                refused = (st, hdrs, body)
                s.close()
                break
            held.append(s)
        assert refused, "5 connections from one address were all accepted with --rest_api_per_ip_connection_limit=4"
        assert len(held) >= 3, f"refused already at connection {len(held) + 1} (limit 4)"
        st, hdrs, body = refused
        assert_json_error(st, body, 503, "127.0.0.1", "rest_api_per_ip_connection_limit")
        assert hdrs.get("retry-after")
        st, body = good_predict(srv, model, source="127.0.0.2")
        assert st == 200, f"another address while 127.0.0.1 is at its limit: HTTP {st} {body[:200]!r}"
        held.pop().close()
        predict_soon(srv, model, "after one connection closed")
    finally:
        for s in held:
            s.close()
        srv.stop()


# ----------------------------------------------------------------------------------------------------------------
# 4. the drain deadline

def test_drain_deadline_enforced(tmp_path):
    slow = u.slow_model()
    u.write_version(tmp_path / "slow", 1, slow)
    s = u.Server(tmp_path, base_path=str(tmp_path / "slow"), model_name="slow", extra=["--drain_seconds=1"])
    try:
        def call(rows, seed, timeout=120, body=None):
            body = body or json.dumps({"instances": u.randn((rows, 512), seed=seed).tolist()})
            t0 = time.monotonic()
            r = requests.post(s.url("/v1/models/slow:predict"), data=body, timeout=timeout)
            return r, t0, time.monotonic()

        call(4, 0)  # first run of this batch size plans it; the second is the measure
        r, t0, t1 = call(4, 1)
        assert r.status_code == 200, r.text[:300]
        per_row = (t1 - t0) / 4
        rows = int(min(512, max(4, round(6.0 / max(per_row, 1e-4)))))  # ~6 s per request: far past the deadline
        results = [None] * 3
        bodies = [json.dumps({"instances": u.randn((rows, 512), seed=10 + i).tolist()}) for i in range(3)]

        def run(i):
            try:
                results[i] = call(rows, 0, timeout=60, body=bodies[i])
            except requests.RequestException as e:
                results[i] = e
        threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        time.sleep(1.0)  # all three sent and running (each needs ~6 s)
        t_sig = time.monotonic()
        s.signal(signal.SIGTERM)
        try:
            rc = s.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"tensord still running 30 s after SIGTERM with --drain_seconds=1\n{s.describe()}")
        t_exit = time.monotonic() - t_sig
        s.stopped = True
        for t in threads:
            t.join(timeout=30)
        assert t_exit <= 2.0 + 0.5, f"exit {t_exit:.2f} s after SIGTERM (--drain_seconds=1: within 2 s)\n{s.describe()}"
        assert rc == 3 or all(isinstance(x, tuple) and x[0].status_code == 200 for x in results), \
            f"exit status {rc} after cutting requests off (want 3)\n{s.describe()}"
        cut = 0
        for res in results:
            assert isinstance(res, tuple), f"an in-flight request got no HTTP answer: {res!r}\n{s.describe()}"
            r, _, t_done = res
            if r.status_code == 200:  # it finished within the drain second (the calibration was off): fine
                assert t_done - t_sig <= 1.3, f"HTTP 200 {t_done - t_sig:.2f} s after SIGTERM, past --drain_seconds=1"
                continue
            assert r.status_code == 503, f"in-flight request at the deadline: HTTP {r.status_code} {r.text[:200]}"
            assert "drain_seconds" in r.json()["error"], r.text
            assert t_done - t_sig <= 2.5, f"503 came {t_done - t_sig:.2f} s after SIGTERM"
            cut += 1
        assert cut, f"no request was still running at the deadline ({rows} rows, {per_row * 1e3:.1f} ms/row): proved nothing"
        assert "drain deadline" in s.stderr() and "status 3" in s.stderr(), s.describe()
    finally:
        s.kill()


# ----------------------------------------------------------------------------------------------------------------
# 6. framing

PREDICT_BODY = b'{"instances": [[1, 2, 3, 4]]}'
SMUGGLED = b"GET /v1/models/m/metadata HTTP/1.1\r\nHost: t\r\n\r\n"


def framing_cases():
    n = str(len(PREDICT_BODY)).encode()
    return {
        "two Content-Length": b"POST /v1/models/m:predict HTTP/1.1\r\nHost: t\r\nContent-Length: " + n +
                              b"\r\nContent-Length: " + str(len(PREDICT_BODY) + len(SMUGGLED)).encode() + b"\r\n\r\n" +
                              PREDICT_BODY + SMUGGLED,
        "equal Content-Length twice": b"POST /v1/models/m:predict HTTP/1.1\r\nHost: t\r\nContent-Length: " + n +
                                      b"\r\ncontent-length: " + n + b"\r\n\r\n" + PREDICT_BODY + SMUGGLED,
        "Content-Length and chunked": b"POST /v1/models/m:predict HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n"
                                      b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % len(PREDICT_BODY) +
                                      PREDICT_BODY + b"\r\n0\r\n\r\n" + SMUGGLED,
        "NUL in the URL": b"GET /v1/models/m\x00junk HTTP/1.1\r\nHost: t\r\n\r\n" + SMUGGLED,
    }


@pytest.fixture(scope="module")
def srv(tmp_path_factory, model, wide):
    s = start(tmp_path_factory.mktemp("hardening"), model, wide=wide,
              extra=["--rest_api_max_body_bytes=1048576"])
    yield s
    u.server_fixture_finalize(s)


@pytest.mark.parametrize("case", list(framing_cases()))
@pytest.mark.parametrize("keepalive", [False, True])
def test_framing_refused(srv, model, case, keepalive):
    with connect(srv.port) as s:
        if keepalive:  # a good request first: the bad one is then parsed by the keep-alive path
            s.sendall(b"GET /v1/models/m HTTP/1.1\r\nHost: t\r\n\r\n")
            st, _, _ = read_response(s)
            assert st == 200
        s.sendall(framing_cases()[case])
        st, hdrs, body = read_response(s)
        assert_json_error(st, body, 400)
        assert closed_after(s), f"{case}: the connection stayed open after the 400 (a smuggled request could follow)"
    st, body = good_predict(srv, model)
    assert st == 200, body


def test_nul_after_name_not_served_as_model(srv):
    st, _, body = raw_request(srv.port, b"GET /v1/models/m\x00junk HTTP/1.1\r\nHost: t\r\n\r\n")
    assert_json_error(st, body, 400, "NUL")
    st, _, body = raw_request(srv.port, b"GET /v1/models/m%00junk HTTP/1.1\r\nHost: t\r\n\r\n")
    assert st in (400, 404), body
    assert b'"model_version_status"' not in body


@pytest.mark.parametrize("what", ["header", "url"])
def test_oversized_head_errors_are_json(srv, what):
    if what == "header":
        req = b"GET /v1/models/m HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 40000 + b"\r\n\r\n"
        want = 431
    else:
        req = b"GET /v1/models/" + b"a" * 12000 + b" HTTP/1.1\r\nHost: t\r\n\r\n"
        want = 414
    with connect(srv.port) as s:
        try:
            s.sendall(req)
        except (BrokenPipeError, ConnectionResetError):
            pass
        st, hdrs, body = read_response(s)
    assert hdrs.get("content-type", "").startswith("application/json"), hdrs
    assert_json_error(st, body, want)


# ----------------------------------------------------------------------------------------------------------------
# content codings

def test_tritonclient_compression(srv, model, wide):
    import tritonclient.http as httpclient
    c = httpclient.InferenceServerClient(url=f"127.0.0.1:{srv.port}", connection_timeout=10, network_timeout=20)
    try:
        x = u.randn((3, 4), seed=8)
        for name, mdl in (("m", model), ("wide", wide)):
            want = u.ort_run(mdl, {"x": x})["y"]
            for req_alg in ("gzip", "deflate", None):
                for resp_alg in ("gzip", "deflate", None):
                    for binary in (True, False):
                        inp = httpclient.InferInput("x", [3, 4], "FP32")
                        inp.set_data_from_numpy(x, binary_data=binary)
                        res = c.infer(name, [inp], outputs=[httpclient.InferRequestedOutput("y", binary_data=binary)],
                                      request_compression_algorithm=req_alg, response_compression_algorithm=resp_alg)
                        u.assert_close(res.as_numpy("y"), want,
                                       f"{name} request {req_alg} response {resp_alg} binary {binary}")
    finally:
        c.close()


def test_gzip_predict_and_compressed_reply(srv, wide):
    x = u.randn((2, 4), seed=9)
    body = json.dumps({"instances": x.tolist()}).encode()
    for enc, data in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body)),
                      ("deflate", zlib.compress(body)[2:-4])):  # raw deflate too, as some clients send it
        r = srv.post("/v1/models/wide:predict", data=data,
                     headers={"Content-Encoding": enc, "Content-Type": "application/json", "Accept-Encoding": "gzip"},
                     stream=True)
        assert r.status_code == 200, r.content[:300]
        assert r.headers.get("Content-Encoding") == "gzip", r.headers
        raw = r.raw.read(decode_content=False)
        got = json.loads(gzip.decompress(raw))["predictions"]
        u.assert_close(got, u.ort_run(wide, {"x": x})["y"], f"{enc} predict")
    # identity when not asked, and when q=0
    for ae in ("identity", "gzip;q=0, deflate;q=0", None):
        st, hdrs, _ = raw_request(srv.port, b"POST /v1/models/wide:predict HTTP/1.1\r\nHost: t\r\nContent-Length: " +
                                  str(len(body)).encode() + (b"\r\nAccept-Encoding: " + ae.encode() if ae else b"") +
                                  b"\r\n\r\n" + body)
        assert st == 200 and "content-encoding" not in hdrs, (ae, hdrs)


def test_zip_bomb_and_bad_codings(srv, model):
    bomb = gzip.compress(b" " * (64 << 20), compresslevel=9)  # 64 MiB inflated; limit is 1 MiB
    assert len(bomb) < 1 << 20
    r = srv.post("/v1/models/m:predict", data=bomb, headers={"Content-Encoding": "gzip"})
    u.check_error(r, (413,), "limit")
    r = srv.post("/v1/models/m:predict", data=b"\x1f\x8b\x08\x00garbage-not-gzip", headers={"Content-Encoding": "gzip"})
    u.check_error(r, (400,), "gzip")
    r = srv.post("/v1/models/m:predict", data=gzip.compress(PREDICT_BODY)[:-6], headers={"Content-Encoding": "gzip"})
    u.check_error(r, (400,), "gzip")
    r = srv.post("/v1/models/m:predict", data=PREDICT_BODY, headers={"Content-Encoding": "br"})
    u.check_error(r, (415,), "br")
    st, body = good_predict(srv, model)
    assert st == 200, body


# ----------------------------------------------------------------------------------------------------------------
# 10. where the demo listens

def test_demo_binds_loopback_and_address_logged(srv):
    p = subprocess.run(["make", "-n", "serve-demo"], cwd=u.ROOT, capture_output=True, text=True, timeout=60)
    line = [ln for ln in p.stdout.splitlines() if "tensord serve" in ln or "tensord\" serve" in ln]
    assert line and "--rest_api_host=127.0.0.1" in line[-1], f"serve-demo does not bind 127.0.0.1:\n{p.stdout}"
    assert f"REST API on 127.0.0.1:{srv.port}" in srv.stderr(), srv.describe()
