"""The admin room against the real binary: the token-guarded listener on --admin_port (loopback), model management,
labels and traffic through it, its security rules, promote/rollback, the state kept across a restart, `tensord
admin`, and the automatic rollback of a slow canary. (Issue 11; the whole rollout sequence and the rollback of a
failing canary are in test_admin_rollout.py.)
"""
import os
import socket

import pytest
import requests

import serving_util as u

from admin_util import TOKEN, admin_req as _req, admin_server as _admin_server, wait_admin, wait_for_rollback


def _listening(port):
    """Local addresses listening on port (from /proc/net/tcp{,6})."""
    out = set()
    for f in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(f).read().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            parts = ln.split()
            addr, st = parts[1], parts[3]
            ip, p = addr.split(":")
            if st == "0A" and int(p, 16) == port:
                out.add(ip)
    return out


@pytest.fixture(scope="module")
def admin(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("admin")
    srv, aport = _admin_server(tmp, extra=[f"--model_root={tmp}"])
    yield srv, aport, tmp
    u.server_fixture_finalize(srv)


ROUTES = [("GET", "/v1/admin/models", None), ("POST", "/v1/admin/models", {"name": "x", "base_path": "/tmp"}),
          ("DELETE", "/v1/admin/models/m", None), ("PUT", "/v1/admin/models/m/labels/l", {"version": 1}),
          ("GET", "/v1/admin/models/m/traffic", None), ("PUT", "/v1/admin/models/m/traffic", {"routes": {}})]


@pytest.mark.parametrize("token", [None, "wrong", TOKEN[:-1] + ("0" if TOKEN[-1] != "0" else "1")])
def test_every_route_needs_the_token(tmp_path, token):
    srv, aport = _admin_server(tmp_path)  # its own server: the failures here start a back-off
    with srv:
        for i, (method, path, body) in enumerate(ROUTES):
            r = _req(aport, method, path, token=token, json=body)
            want = (401,) if i < 4 else (401, 429)  # the 5th failure within a minute starts the back-off
            assert r.status_code in want, f"{method} {path} with token {token!r}: {r.status_code} {r.text}"
        assert srv.post_json("/v1/models/m:predict", {"instances": [[0.0]]}).status_code == 200


def test_manage_a_model_labels_and_traffic(admin):
    srv, aport, tmp = admin
    base = str(tmp / "fm")
    for v in (1, 2):
        u.write_version(base, v, u.version_model(v))
    r = _req(aport, "POST", "/v1/admin/models", json={"name": "fm", "base_path": base, "version_policy": {"all": {}}})
    assert r.status_code == 201, r.text
    names = [m["name"] for m in r.json()["models"]]
    assert "fm" in names and "m" in names
    assert srv.post_json("/v1/models/fm/versions/1:predict", {"instances": [[0.0]]}).json()["predictions"] == [[1.0]]
    assert _req(aport, "POST", "/v1/admin/models", json={"name": "fm", "base_path": base}).status_code == 409
    for label, v in (("stable", 1), ("canary", 2)):
        r = _req(aport, "PUT", f"/v1/admin/models/fm/labels/{label}", json={"version": v})
        assert r.status_code == 200, r.text
    r = _req(aport, "PUT", "/v1/admin/models/fm/labels/x", json={"version": 7})
    assert r.status_code == 400 and "7" in r.json()["error"], r.text
    r = _req(aport, "PUT", "/v1/admin/models/fm/traffic", json={"routes": {"stable": 80, "canary": 20}})
    assert r.status_code == 200, r.text
    assert r.json()["routes"] == {"stable": 80, "canary": 20}
    s = requests.Session()
    got = [int(srv.post_json("/v1/models/fm:predict", {"instances": [[0.0]]}, session=s).headers["X-Model-Version"])
           for _ in range(500)]
    assert abs(got.count(2) / 500 - 0.2) <= 0.03, got.count(2)
    r = _req(aport, "PUT", "/v1/admin/models/fm/traffic", json={"routes": {"stable": 80, "nightly": 20}})
    assert r.status_code == 400 and "nightly" in r.json()["error"], r.text
    assert _req(aport, "GET", "/v1/admin/models/fm/traffic").json()["routes"] == {"stable": 80, "canary": 20}
    r = _req(aport, "DELETE", "/v1/admin/models/fm")
    assert r.status_code == 200, r.text
    assert srv.post_json("/v1/models/fm:predict", {"instances": [[0.0]]}).status_code == 404
    assert _req(aport, "DELETE", "/v1/admin/models/fm").status_code == 404


def test_a_model_that_does_not_load_is_not_added(admin):
    srv, aport, tmp = admin
    bad = tmp / "bad" / "1"
    bad.mkdir(parents=True)
    (bad / "model.onnx").write_bytes(b"not an onnx model")
    r = _req(aport, "POST", "/v1/admin/models", json={"name": "bad", "base_path": str(tmp / "bad")})
    assert r.status_code == 400, r.text
    assert "bad" in r.json()["error"]
    assert "bad" not in [m["name"] for m in _req(aport, "GET", "/v1/admin/models").json()["models"]]
    assert srv.post_json("/v1/models/m:predict", {"instances": [[0.0]]}).status_code == 200


@pytest.mark.parametrize("name", ["..", "a/b", "a\x00b", "x" * 256, "", "bad name"])
def test_bad_names_are_refused(admin, name):
    _, aport, tmp = admin
    r = _req(aport, "POST", "/v1/admin/models", json={"name": name, "base_path": str(tmp / "m")})
    assert r.status_code == 400, (name, r.status_code, r.text)


def test_model_root_confines_base_paths(admin, tmp_path):
    _, aport, tmp = admin
    outside = str(tmp_path / "outside")
    u.write_version(outside, 1, u.version_model(1))
    r = _req(aport, "POST", "/v1/admin/models", json={"name": "out", "base_path": outside})
    assert r.status_code == 403, r.text
    link = tmp / "link"
    os.symlink(outside, link)
    r = _req(aport, "POST", "/v1/admin/models", json={"name": "out", "base_path": str(link)})
    assert r.status_code == 403, r.text


def test_body_over_limit_is_413(admin):
    _, aport, _ = admin
    r = _req(aport, "POST", "/v1/admin/models", data=b"{" + b" " * (2 << 20) + b"}",
             headers={"Content-Type": "application/json"})
    assert r.status_code == 413, r.status_code


def test_admin_routes_absent_from_inference_ports_and_loopback_only(admin):
    srv, aport, _ = admin
    assert srv.get("/v1/admin/models", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 404
    addrs = _listening(aport)
    assert addrs and all(a in ("0100007F", "00000000000000000000000001000000") for a in addrs), addrs


def test_short_token_keeps_the_admin_port_closed(tmp_path):
    srv, aport = _admin_server(tmp_path, token="0123456789abcdef")  # 16 characters
    with srv:
        assert "admin API not opened" in srv.stderr() and "32 characters" in srv.stderr(), srv.stderr()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", aport), timeout=2).close()
        assert srv.post_json("/v1/models/m:predict", {"instances": [[0.0]]}).status_code == 200


def test_repeated_failures_are_slowed_down(tmp_path):
    srv, aport = _admin_server(tmp_path)
    with srv:
        codes = [_req(aport, "GET", "/v1/admin/models", token="nope").status_code for _ in range(8)]
        assert codes[:4] == [401] * 4 and 429 in codes, codes
        assert _req(aport, "GET", "/v1/admin/models").status_code == 429  # even the right token waits out the back-off


def test_promote_and_rollback_without_a_failed_request(admin):
    import threading
    srv, aport, tmp = admin
    base = str(tmp / "pr")
    for v in (1, 2):
        u.write_version(base, v, u.version_model(v))
    assert _req(aport, "POST", "/v1/admin/models", json={"name": "pr", "base_path": base,
                                                          "version_policy": {"all": {}}}).status_code == 201
    for label, v in (("stable", 1), ("canary", 2)):
        assert _req(aport, "PUT", f"/v1/admin/models/pr/labels/{label}", json={"version": v}).status_code == 200
    assert _req(aport, "POST", "/v1/admin/models/pr:rollback").status_code == 400  # nothing to roll back yet
    assert _req(aport, "PUT", "/v1/admin/models/pr/traffic",
                json={"routes": {"stable": 80, "canary": 20}}).status_code == 200
    failures, stop = [], threading.Event()

    def load():  # predicts all along: none may fail
        s = requests.Session()
        while not stop.is_set():
            r = srv.post_json("/v1/models/pr:predict", {"instances": [[0.0]]}, session=s)
            if r.status_code != 200:
                failures.append((r.status_code, r.text))

    t = threading.Thread(target=load, daemon=True)
    t.start()
    try:
        def versions(n=200):
            s = requests.Session()
            return {int(srv.post_json("/v1/models/pr:predict", {"instances": [[0.0]]}, session=s).headers["X-Model-Version"])
                    for _ in range(n)}
        assert versions() == {1, 2}
        r = _req(aport, "POST", "/v1/admin/models/pr:promote")
        assert r.status_code == 200, r.text
        assert r.json()["routes"] == {"stable": 100}
        assert versions() == {2}, "after promote every request goes to version 2"
        labels = [m for m in _req(aport, "GET", "/v1/admin/models").json()["models"] if m["name"] == "pr"][0]["labels"]
        assert labels["stable"] == 2
        r = _req(aport, "POST", "/v1/admin/models/pr:rollback")
        assert r.status_code == 200, r.text
        assert versions() == {1}, "after rollback every request goes back to version 1"
        # rollback with a canary route in place only drops the route
        assert _req(aport, "PUT", "/v1/admin/models/pr/traffic",
                    json={"routes": {"stable": 50, "canary": 50}}).status_code == 200
        assert _req(aport, "POST", "/v1/admin/models/pr:rollback").status_code == 200
        assert versions() == {1}
    finally:
        stop.set()
        t.join(timeout=30)
    assert not failures, failures[:5]


def test_tensord_admin_command(admin, tmp_path):
    import json
    import subprocess
    srv, aport, tmp = admin
    base = str(tmp / "cli")
    for v in (1, 2):
        u.write_version(base, v, u.version_model(v))
    tok = tmp_path / "token"
    tok.write_text(TOKEN + "\n")

    def run(*args, token_file=str(tok)):
        cmd = [u.tensord_bin(), "admin", f"--admin_url=http://127.0.0.1:{aport}"]
        if token_file:
            cmd.append(f"--admin_token_file={token_file}")
        return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=60,
                              env={k: v for k, v in os.environ.items() if k != "TENSORD_ADMIN_TOKEN"})

    p = run("add", "cli", base, "--policy", "all")
    assert p.returncode == 0, p.stderr
    assert "cli" in [m["name"] for m in json.loads(p.stdout)["models"]]
    assert run("label", "cli", "stable", "1").returncode == 0
    assert run("label", "cli", "canary", "2").returncode == 0
    p = run("traffic", "cli", "--routes", "stable=90,canary=10", "--sticky", "X-User-Id")
    assert p.returncode == 0, p.stderr
    shown = json.loads(run("traffic", "cli").stdout)
    assert shown == {"routes": {"stable": 90, "canary": 10}, "sticky_header": "X-User-Id", "shadow": None,
                     "auto_rollback": None, "last_auto_rollback": None}, shown
    p = run("promote", "cli")
    assert p.returncode == 0 and json.loads(p.stdout)["routes"] == {"stable": 100}, p.stderr
    assert run("rollback", "cli").returncode == 0
    p = run("label", "cli", "x", "9")
    assert p.returncode == 1 and "error:" in p.stderr and "9" in p.stderr, (p.returncode, p.stderr)
    assert run("remove", "cli").returncode == 0
    p = run("models", token_file=None)
    assert p.returncode == 2 and "no admin token" in p.stderr, p.stderr
    assert run("frobnicate").returncode == 2


def test_restart_keeps_models_labels_and_routes(tmp_path):
    """SIGTERM and start again with the same --state_dir: the models added, the labels and the traffic split (and
    the promote history that rollback uses) are as before, and a model of the start-up config that was removed
    through the admin API stays removed until it is added again."""
    state = tmp_path / "state"
    state.mkdir()
    base = str(tmp_path / "m")
    for v in (1, 2):
        u.write_version(base, v, u.version_model(v))
    other = str(tmp_path / "other")
    for v in (1, 2, 3):
        u.write_version(other, v, u.version_model(v))

    def start():
        aport = u.free_port()
        env = dict(os.environ, TENSORD_ADMIN_TOKEN=TOKEN)
        s = u.Server(tmp_path, base_path=base, env=env, extra=[f"--admin_port={aport}", f"--state_dir={state}"])
        wait_admin(aport)
        return s, aport

    srv, aport = start()
    with srv:
        assert _req(aport, "POST", "/v1/admin/models", json={"name": "other", "base_path": other,
                                                              "version_policy": {"all": {}}}).status_code == 201
        for label, v in (("stable", 1), ("canary", 3)):
            assert _req(aport, "PUT", f"/v1/admin/models/other/labels/{label}", json={"version": v}).status_code == 200
        assert _req(aport, "PUT", "/v1/admin/models/other/traffic",
                    json={"routes": {"stable": 70, "canary": 30}, "sticky_header": "X-User-Id",
                          "auto_rollback": {"max_error_rate": 0.05, "window_s": 20,
                                            "min_requests": 1000000}}).status_code == 200
        before = [m for m in _req(aport, "GET", "/v1/admin/models").json()["models"] if m["name"] == "other"][0]
        assert _req(aport, "DELETE", "/v1/admin/models/m").status_code == 200  # the start-up flags' model
        assert srv.post_json("/v1/models/m:predict", {"instances": [[0.0]]}).status_code == 404
    assert (state / "tensord-state.sqlite3").exists()
    srv, aport = start()
    with srv:
        srv.wait_ready()
        after = [m for m in _req(aport, "GET", "/v1/admin/models").json()["models"] if m["name"] == "other"]
        assert after, "the added model did not come back"
        after = after[0]
        assert "m" not in [m["name"] for m in _req(aport, "GET", "/v1/admin/models").json()["models"]], \
            "a removed model came back after the restart"
        assert srv.post_json("/v1/models/m:predict", {"instances": [[0.0]]}).status_code == 404
        assert after["labels"] == before["labels"] == {"stable": 1, "canary": 3}
        assert after["traffic"] == before["traffic"] and after["traffic"]["auto_rollback"]["window_s"] == 20
        assert after["version_policy"] == "all"
        s = requests.Session()
        got = [int(srv.post_json("/v1/models/other:predict", {"instances": [[0.0]]}, session=s).headers["X-Model-Version"])
               for _ in range(300)]
        assert set(got) == {1, 3} and abs(got.count(3) / 300 - 0.3) <= 0.05, got.count(3)
        assert _req(aport, "POST", "/v1/admin/models/other:promote").status_code == 200
    srv, aport = start()
    with srv:  # the promote and its history survive too: rollback puts stable back to 1
        srv.wait_ready()
        m = [m for m in _req(aport, "GET", "/v1/admin/models").json()["models"] if m["name"] == "other"][0]
        assert m["labels"]["stable"] == 3 and m["traffic"]["routes"] == {"stable": 100}, m
        r = _req(aport, "POST", "/v1/admin/models/other:rollback")
        assert r.status_code == 200, r.text
        m = [m for m in _req(aport, "GET", "/v1/admin/models").json()["models"] if m["name"] == "other"][0]
        assert m["labels"]["stable"] == 1, m
        # adding the removed model again serves it, also after the next restart
        assert _req(aport, "POST", "/v1/admin/models", json={"name": "m", "base_path": base}).status_code == 201
    srv, aport = start()
    with srv:
        srv.wait_ready()
        assert srv.post_json("/v1/models/m:predict", {"instances": [[0.0]]}).status_code == 200


def _slow_model(layers=48, d=512, seed=3):
    """The signature of serving_util.version_model (x [N,1] -> y [N,1]) but many matrix products slower."""
    import numpy as np
    from onnx import helper
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("MatMul", ["x", "w_in"], ["h0"])]
    inits = [("w_in", rng.standard_normal((1, d)).astype(np.float32) * 0.1)]
    for i in range(layers):
        nodes.append(helper.make_node("MatMul", [f"h{i}", f"w{i}"], [f"t{i}"]))
        nodes.append(helper.make_node("Tanh", [f"t{i}"], [f"h{i + 1}"]))
        inits.append((f"w{i}", rng.standard_normal((d, d)).astype(np.float32) * (1.0 / d ** 0.5)))
    nodes.append(helper.make_node("MatMul", [f"h{layers}", "w_out"], ["y"]))
    inits.append(("w_out", rng.standard_normal((d, 1)).astype(np.float32) * 0.1))
    return u._model(nodes, [("x", ["N", 1])], [("y", ["N", 1])], inits)


def test_automatic_rollback_of_a_slow_canary(tmp_path):
    import threading
    import time
    base = str(tmp_path / "m")
    u.write_version(base, 1, u.version_model(1))
    u.write_version(base, 2, _slow_model())
    cfg = str(tmp_path / "models.config")
    u.write_text(cfg, u.model_config_text([{"name": "m", "base_path": base, "policy": "all",
                                           "labels": {"stable": 1, "canary": 2}}]))
    aport = u.free_port()
    env = dict(os.environ, TENSORD_ADMIN_TOKEN=TOKEN)
    with u.Server(tmp_path, config_file=cfg, env=env, extra=[f"--admin_port={aport}"]) as srv:
        wait_admin(aport)
        r = _req(aport, "PUT", "/v1/admin/models/m/traffic",
                 json={"routes": {"stable": 50, "canary": 50},
                       "auto_rollback": {"max_p99_ratio": 2.0, "window_s": 10, "min_requests": 20}})
        assert r.status_code == 200, r.text
        assert r.json()["auto_rollback"]["max_p99_ratio"] == 2.0
        failures, seen = [], []
        stop = threading.Event()

        def load():
            s = requests.Session()
            while not stop.is_set():
                r = srv.post_json("/v1/models/m:predict", {"instances": [[0.5]]}, session=s)
                if r.status_code != 200:
                    failures.append((r.status_code, r.text))
                else:
                    seen.append((time.monotonic(), int(r.headers["X-Model-Version"])))

        threads = [threading.Thread(target=load, daemon=True) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            traffic, rolled = wait_for_rollback(aport, "m", poll=0.2)
            rolled = rolled or time.monotonic()
            time.sleep(1.0)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=30)
        assert traffic and traffic["routes"] == {"stable": 100}, f"no automatic rollback within 40 s: {traffic}"
        why = traffic["last_auto_rollback"]["reason"]
        assert "p99" in why and "canary" in why, why
        assert any(v == 2 for _, v in seen), "the canary never answered: the test proved nothing"
        assert all(v == 1 for t, v in seen if t > rolled + 0.5), "requests still reached the canary after the rollback"
        assert not failures, failures[:5]
        assert "auto_rollback" in srv.stderr()
        text = srv.get("/monitoring/prometheus/metrics").text
        assert u.metric_samples(text, "tensord_model_swap_count", model="m", event="auto_rollback"), \
            "the rollback is not counted in metrics"
