"""Hot swap under load: versions appear and disappear on disk the way a deployer writes them (built in
<base>/.tmp-<n>-<pid>/, then rename()d), while client threads send predicts without pause.

The model is y = x * 0 + version, so every answer says which version computed it.
"""
import os
import shutil
import threading
import time

import numpy as np
import pytest
import requests

import serving_util as u

CLIENTS = 16
MAX_LOAD_SECONDS = 25  # hard bound on the client threads; the scenario itself takes ~5-10 s


def status(srv, path):
    r = srv.get(path, timeout=10)
    return r.status_code, (r.json() if r.headers.get("Content-Type", "").startswith("application/json") or
                           r.content[:1] in (b"{", b"[") else r.content)


def version_states(srv):
    code, body = status(srv, "/v1/models/m")
    if code != 200:
        return {}
    return {int(e["version"]): e for e in body["model_version_status"]}


def wait_for(cond, timeout, what, srv):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout} s waiting for {what}; model status now {version_states(srv)}\n{srv.describe()}")


def test_hot_swap_under_load(tmp_path):
    base = tmp_path / "m"
    u.write_version(base, 1, u.version_model(1))
    srv = u.Server(tmp_path, base_path=str(base), poll=0.2)
    stop = threading.Event()
    hard_end = time.monotonic() + MAX_LOAD_SECONDS
    per_thread = [[] for _ in range(CLIENTS)]   # (time, version) per reply
    failures = [[] for _ in range(CLIENTS)]
    available_seen = set()                      # versions the status endpoint reported AVAILABLE

    def client(i):
        sess = requests.Session()
        x = [[float(i)]]
        while not stop.is_set() and time.monotonic() < hard_end:
            try:
                r = srv.post_json("/v1/models/m:predict", {"instances": x}, session=sess, timeout=10)
            except requests.RequestException as e:
                failures[i].append(f"{type(e).__name__}: {e}")
                continue
            if r.status_code != 200:
                failures[i].append(f"HTTP {r.status_code}: {r.content[:200]!r}")
                continue
            try:
                v = r.json()["predictions"][0][0]
            except (ValueError, KeyError, IndexError, TypeError):
                failures[i].append(f"bad body {r.content[:200]!r}")
                continue
            per_thread[i].append((time.monotonic(), v))

    def watch_available():
        for v, e in version_states(srv).items():
            if e["state"] == "AVAILABLE":
                available_seen.add(v)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(CLIENTS)]
    try:
        watch_available()
        for t in threads:
            t.start()
        time.sleep(1.0)
        for v in (2, 3, 4):
            u.write_version(base, v, u.version_model(v))
            wait_for(lambda: version_states(srv).get(v, {}).get("state") == "AVAILABLE", 20,
                     f"version {v} to become AVAILABLE", srv)
            watch_available()
            time.sleep(0.5)
        shutil.rmtree(base / "1")
        time.sleep(0.6)
        u.write_version(base, 5, b"this is not an ONNX model \x00\x01\x02 garbage" * 50)

        def v5_ended():
            code, body = status(srv, "/v1/models/m/versions/5")
            if code != 200:
                return None
            (e,) = body["model_version_status"]
            return e if e["state"] == "END" else None

        e5 = wait_for(v5_ended, 20, "corrupt version 5 to reach END", srv)
        watch_available()
        time.sleep(1.0)  # keep the load on after the failed load
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=15)

    try:
        assert all(not t.is_alive() for t in threads), "client threads did not stop"
        nfail = sum(len(f) for f in failures)
        nok = sum(len(p) for p in per_thread)
        examples = [f for fs in failures for f in fs][:5]
        assert nfail == 0, f"{nfail} failed requests out of {nfail + nok} during hot swap, e.g. {examples}\n{srv.describe()}"
        assert nok >= CLIENTS * 5, f"only {nok} requests completed"
        served = sorted({v for p in per_thread for _, v in p})
        assert set(served) <= {1.0, 2.0, 3.0, 4.0}, f"served versions {served}: something not in 1..4 answered"
        assert 4.0 in served, f"version 4 never served: {served}"
        for i, p in enumerate(per_thread):
            vs = [v for _, v in p]
            back = [(a, b) for a, b in zip(vs, vs[1:]) if b < a]
            assert not back, f"client {i}: served version went backwards {back[:3]} (sequence {vs[:50]}...)"
        assert available_seen >= {1, 2, 3, 4}, f"status endpoint showed AVAILABLE only for {available_seen}"
        # the corrupt version: END with an error; version 4 keeps serving
        assert e5["status"]["error_code"] != "OK" and e5["status"]["error_message"].strip(), \
            f"version 5 reached END without an error: {e5}"
        states = version_states(srv)
        assert states.get(4, {}).get("state") == "AVAILABLE", f"version 4 not AVAILABLE after 5 failed: {states}"
        assert states.get(1, {}).get("state") in (None, "END"), f"removed version 1: {states.get(1)}"
        r = srv.post_json("/v1/models/m:predict", {"instances": [[0.0]]})
        assert r.status_code == 200 and r.json()["predictions"] == [[4.0]], f"{r.status_code} {r.content[:200]!r}"
        code, body = status(srv, "/v1/models/m")
        print(f"{nok} requests, versions served {served}; final status {body}")
    finally:
        srv.stop()


def test_policy_all_serves_every_version(tmp_path):
    base = tmp_path / "m"
    for v in (1, 2, 3):
        u.write_version(base, v, u.version_model(v))
    conf = u.write_text(tmp_path / "models.config", u.model_config_text(
        [{"name": "m", "base_path": str(base), "policy": "all"}]))
    with u.Server(tmp_path, config_file=conf, poll=0.2) as srv:
        states = wait_for(lambda: (lambda s: s if len(s) == 3 and all(e["state"] == "AVAILABLE" for e in s.values())
                                   else None)(version_states(srv)), 20, "versions 1, 2, 3 AVAILABLE", srv)
        assert sorted(states) == [1, 2, 3], states
        for v in (1, 2, 3):
            r = srv.post_json(f"/v1/models/m/versions/{v}:predict", {"instances": [[5.0]]})
            assert r.status_code == 200 and r.json()["predictions"] == [[float(v)]], f"v{v}: {r.content[:200]!r}"
            r = srv.post_json(f"/v2/models/m/versions/{v}/infer",
                              {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [5.0]}]})
            assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [float(v)], f"v{v}: {r.content[:200]!r}"
        r = srv.post_json("/v1/models/m:predict", {"instances": [[5.0]]})
        assert r.json()["predictions"] == [[3.0]], "without a version the highest AVAILABLE one answers"
        # a new version joins, the others stay
        u.write_version(base, 4, u.version_model(4))
        wait_for(lambda: version_states(srv).get(4, {}).get("state") == "AVAILABLE", 20, "version 4 AVAILABLE", srv)
        for v in (1, 2, 3, 4):
            r = srv.post_json(f"/v1/models/m/versions/{v}:predict", {"instances": [[5.0]]})
            assert r.status_code == 200 and r.json()["predictions"] == [[float(v)]], f"v{v}: {r.content[:200]!r}"
        # a removed one leaves
        shutil.rmtree(base / "2")
        wait_for(lambda: version_states(srv).get(2, {}).get("state") in (None, "END"), 20, "version 2 to end", srv)
        r = srv.post_json("/v1/models/m/versions/2:predict", {"instances": [[5.0]]})
        assert r.status_code in (404, 503), f"removed version 2 still answers: HTTP {r.status_code}"
        u.error_text(r)
