"""Registry hardening against the real binary (issue 9, items 8 and 9, and Triton's load/unload):

  - a FIFO (or any non-regular file) in a version directory fails that version at once, naming the file and
    what it is; a newer good version loads behind it;
  - a load that runs past --model_load_timeout_seconds fails that version alone (DEADLINE_EXCEEDED) while the
    older version keeps serving and a newer one still loads;
  - a symlink that leaves the version directory is refused;
  - loads, failures, retirements and a bad --model_base_path are logged on stderr, once each, as text or as
    JSON lines (--log_format=json);
  - with --model_control_mode=explicit, tritonclient's load_model / unload_model / is_model_ready /
    get_model_repository_index work, agree with /metrics, and need the admin token when one is configured.

Loopback only; every wait is bounded.
"""
import json
import os
import re
import shutil
import time

import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import serving_util as u

BOUND = 15  # seconds any expected change may take


# ----------------------------------------------------------------------------------------------------------------
# helpers

stage_version = u.stage_version


def fifo_model(tmp):
    os.mkfifo(os.path.join(tmp, "model.onnx"))


def versions(srv, model="m"):
    r = srv.get(f"/v1/models/{model}", timeout=10)
    if r.status_code != 200:
        return {}
    return {int(e["version"]): e for e in r.json()["model_version_status"]}


def wait_for(cond, what, srv, timeout=BOUND):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout} s waiting for {what}; status {versions(srv)}\n{srv.describe()}")


def state_is(srv, version, state, model="m"):
    e = versions(srv, model).get(version)
    return e if e and e["state"] == state else None


def predict_version(srv, model="m"):
    """The version_model answer: y = version."""
    r = srv.post_json(f"/v1/models/{model}:predict", {"instances": [[1.0]]})
    assert r.status_code == 200, f"{r.status_code} {r.content[:300]!r}\n{srv.describe()}"
    return int(round(r.json()["predictions"][0][0]))


def log_lines(srv, event, model="m", version=None):
    pat = rf"\b{re.escape(event)} model={re.escape(model)}" + (rf" version={version}:" if version else r"[ :]")
    return [ln for ln in srv.stderr().splitlines() if re.search(pat, ln)]


def metric(srv, name, **labels):
    s = u.metric_samples(srv.get("/metrics").text, name, **labels)
    return s[0][1] if s else None


def slow_version(records=150):
    """fill() for a version whose warm-up takes many seconds: u.slow_model (268M multiply-adds per row) and
    `records` warm-up requests of 4 rows (stage_version writes it aside and renames it in)."""
    model = u.slow_model()
    row = "[" + ",".join(["0.5"] * 512) + "]"
    line = '{"instances":[' + ",".join([row] * 4) + "]}"

    def fill(tmp):
        with open(os.path.join(tmp, "model.onnx"), "wb") as f:
            f.write(model.SerializeToString())
        os.makedirs(os.path.join(tmp, "assets.extra"))
        with open(os.path.join(tmp, "assets.extra", "warmup.jsonl"), "w") as f:
            for _ in range(records):
                f.write(line + "\n")
    return fill



# ----------------------------------------------------------------------------------------------------------------
# item 8: non-regular files, symlinks, load deadlines

def test_fifo_model_fails_at_once_and_the_newer_version_loads(tmp_path):
    base = tmp_path / "m"
    stage_version(base, 1, fifo_model)
    with u.Server(tmp_path, base_path=str(base), poll=0.2, ready=False) as srv:
        e = wait_for(lambda: state_is(srv, 1, "END"), "version 1 (a FIFO model.onnx) to fail", srv)
        msg = e["status"]["error_message"]
        assert "is a FIFO, not a regular file" in msg and "model.onnx" in msg and "version 1" in msg, msg
        assert e["status"]["error_code"] != "OK"
        u.write_version(base, 2, u.version_model(2))
        wait_for(lambda: state_is(srv, 2, "AVAILABLE"), "version 2 to load behind the FIFO version", srv)
        assert predict_version(srv) == 2
        assert any("FIFO" in ln for ln in log_lines(srv, "load_failed", version=1)), srv.describe()


def test_fifo_beside_a_good_version_with_policy_all(tmp_path):
    base = tmp_path / "m"
    stage_version(base, 1, fifo_model)
    u.write_version(base, 2, u.version_model(2))
    cfg = u.write_text(tmp_path / "models.config", u.model_config_text([{"name": "m", "base_path": str(base),
                                                                          "policy": "all"}]))
    t0 = time.monotonic()
    with u.Server(tmp_path, config_file=cfg, poll=0.2, ready=True, start_timeout=BOUND) as srv:
        assert time.monotonic() - t0 < BOUND
        assert state_is(srv, 2, "AVAILABLE"), versions(srv)
        e = wait_for(lambda: state_is(srv, 1, "END"), "version 1 to fail", srv)
        assert "is a FIFO, not a regular file" in e["status"]["error_message"], e


def test_fifo_external_data_and_escaping_symlink_fail_only_their_version(tmp_path):
    import onnx
    base = tmp_path / "m"
    u.write_version(base, 1, u.version_model(1))
    outside = tmp_path / "outside.onnx"
    outside.write_bytes(u.version_model(9).SerializeToString())
    with u.Server(tmp_path, base_path=str(base), poll=0.2) as srv:
        assert predict_version(srv) == 1

        def ext_fifo(tmp):  # initializers in model.onnx.data, which is a FIFO
            m = u.version_model(2)
            onnx.save_model(m, os.path.join(tmp, "model.onnx"), save_as_external_data=True,
                            all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=0)
            os.unlink(os.path.join(tmp, "model.onnx.data"))
            os.mkfifo(os.path.join(tmp, "model.onnx.data"))
        stage_version(base, 2, ext_fifo)
        e = wait_for(lambda: state_is(srv, 2, "END"), "version 2 (FIFO external data) to fail", srv)
        msg = e["status"]["error_message"]
        assert "model.onnx.data" in msg and "is a FIFO, not a regular file" in msg, msg
        assert predict_version(srv) == 1

        stage_version(base, 3, lambda tmp: os.symlink(str(outside), os.path.join(tmp, "model.onnx")))
        e = wait_for(lambda: state_is(srv, 3, "END"), "version 3 (model.onnx -> outside) to fail", srv)
        msg = e["status"]["error_message"]
        assert "outside the directory" in msg and "outside.onnx" in msg, msg
        assert predict_version(srv) == 1, "a refused symlink must not serve the file it points at"

        def inner_link(tmp):  # a symlink that stays inside the version directory is fine
            with open(os.path.join(tmp, "real.onnx"), "wb") as f:
                f.write(u.version_model(4).SerializeToString())
            os.symlink("real.onnx", os.path.join(tmp, "model.onnx"))
        stage_version(base, 4, inner_link)
        wait_for(lambda: state_is(srv, 4, "AVAILABLE"), "version 4 (inner symlink) to load", srv)
        assert predict_version(srv) == 4


def test_a_load_past_the_timeout_fails_only_that_version(tmp_path):
    base = tmp_path / "m"
    u.write_version(base, 1, u.version_model(1))
    with u.Server(tmp_path, base_path=str(base), poll=0.2, extra=["--model_load_timeout_seconds=1"]) as srv:
        assert predict_version(srv) == 1
        t0 = time.monotonic()
        stage_version(base, 2, slow_version())
        wait_for(lambda: state_is(srv, 2, "LOADING"), "version 2 to start loading", srv)
        assert predict_version(srv) == 1, "version 1 serves while 2 loads"
        e = wait_for(lambda: state_is(srv, 2, "END"), "version 2 to time out", srv)
        took = time.monotonic() - t0
        st = e["status"]
        assert st["error_code"] == "DEADLINE_EXCEEDED", e
        assert "load took longer than --model_load_timeout_seconds=1" in st["error_message"], e
        assert took < 8, f"the 1 s deadline was applied after {took:.1f} s"
        assert predict_version(srv) == 1
        # a newer good version still loads (nothing queued behind the abandoned load), and is not retried
        u.write_version(base, 3, u.version_model(3))
        wait_for(lambda: state_is(srv, 3, "AVAILABLE"), "version 3 to load", srv)
        assert predict_version(srv) == 3
        assert len(log_lines(srv, "load_failed", version=2)) == 1, srv.describe()
        assert metric(srv, "tensord_model_swap_count", model="m", version="2", event="load_failed") == 1


def test_a_newer_version_loads_while_an_older_load_is_still_running(tmp_path):
    base = tmp_path / "m"
    u.write_version(base, 1, u.version_model(1))
    with u.Server(tmp_path, base_path=str(base), poll=0.2, extra=["--model_load_timeout_seconds=120"]) as srv:
        stage_version(base, 2, slow_version(records=400))
        wait_for(lambda: state_is(srv, 2, "LOADING"), "version 2 to start loading", srv)
        t0 = time.monotonic()
        u.write_version(base, 3, u.version_model(3))
        wait_for(lambda: state_is(srv, 3, "AVAILABLE"), "version 3 to load while 2 still loads", srv, timeout=10)
        assert time.monotonic() - t0 < 10
        assert predict_version(srv) == 3
        e = wait_for(lambda: state_is(srv, 2, "END"), "the superseded load of version 2 to be cancelled", srv)
        assert "cancelled" in e["status"]["error_message"], e
        # SIGTERM with a cancelled load still winding down: exit 0, promptly (Server.stop asserts both)


# ----------------------------------------------------------------------------------------------------------------
# item 9: the log

def test_a_bad_base_path_is_logged_once_and_its_recovery_too(tmp_path):
    base = tmp_path / "mistyped"
    with u.Server(tmp_path, base_path=str(base), poll=0.1, ready=False) as srv:
        lines = wait_for(lambda: log_lines(srv, "base_path"), "the bad base path to be logged", srv)
        time.sleep(1.0)  # ten more polls: still one line
        lines = log_lines(srv, "base_path")
        assert len(lines) == 1, lines
        assert str(base) in lines[0] and "cannot read base path" in lines[0] and "error" in lines[0], lines
        u.write_version(base, 1, u.version_model(1))
        assert srv.wait_ready(BOUND), srv.describe()
        lines = log_lines(srv, "base_path")
        assert len(lines) == 2 and "can be read again" in lines[1], lines
        assert len(log_lines(srv, "load", version=1)) == 1, srv.describe()


def test_load_failure_and_retirement_are_logged_as_text(tmp_path):
    base = tmp_path / "m"
    u.write_version(base, 1, u.version_model(1))
    with u.Server(tmp_path, base_path=str(base), poll=0.2) as srv:
        u.write_version(base, 2, b"this is not a protobuf")
        wait_for(lambda: state_is(srv, 2, "END"), "version 2 to fail", srv)
        u.write_version(base, 3, u.version_model(3))
        wait_for(lambda: state_is(srv, 1, "END") and state_is(srv, 3, "AVAILABLE"), "3 to replace 1", srv)
        wait_for(lambda: log_lines(srv, "retire", version=1), "the retirement of version 1 to be logged", srv)
        load1 = log_lines(srv, "load", version=1)
        assert len(load1) == 1 and "loaded in" in load1[0] and "weight bytes" in load1[0], load1
        fail2 = log_lines(srv, "load_failed", version=2)
        assert len(fail2) == 1 and "model.onnx" in fail2[0] and "error" in fail2[0], fail2
        retire1 = log_lines(srv, "retire", version=1)
        assert len(retire1) == 1 and "left the version policy" in retire1[0], retire1
        assert len(log_lines(srv, "load", version=3)) == 1
        # the order a reader needs: 3 is loaded before 1 is retired
        text = srv.stderr()
        assert text.index(log_lines(srv, "load", version=3)[0]) < text.index(retire1[0])


def test_json_log_every_line_parses(tmp_path):
    base = tmp_path / "m"
    u.write_version(base, 1, u.version_model(1))
    srv = u.Server(tmp_path, base_path=str(base), poll=0.2, extra=["--log_format=json"])
    try:
        u.write_version(base, 2, b"garbage")
        wait_for(lambda: state_is(srv, 2, "END"), "version 2 to fail", srv)
        u.write_version(base, 3, u.version_model(3))
        wait_for(lambda: state_is(srv, 1, "END"), "version 1 to retire", srv)
        time.sleep(0.3)
    finally:
        srv.stop()
    events = {}
    for line in srv.stderr().splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            pytest.fail(f"a stderr line of a --log_format=json run is not JSON: {line!r}\n{srv.describe()}")
        assert isinstance(obj.get("event"), str) and isinstance(obj.get("msg"), str) and obj["msg"], obj
        assert obj.get("level") in ("info", "warning", "error"), obj
        if obj["event"] in ("load_start", "load", "load_failed", "retire"):
            assert obj.get("model") == "m" and isinstance(obj.get("version"), int), obj
            events.setdefault((obj["event"], obj["version"]), []).append(obj)
    assert len(events.get(("load", 1), [])) == 1, events
    assert len(events.get(("load_failed", 2), [])) == 1, events
    assert "protobuf" in events[("load_failed", 2)][0]["msg"] or "ONNX" in events[("load_failed", 2)][0]["msg"]
    assert len(events.get(("load", 3), [])) == 1, events
    assert len(events.get(("retire", 1), [])) == 1, events


# ----------------------------------------------------------------------------------------------------------------
# explicit model control (Triton's repository extension)

def triton(srv):
    return httpclient.InferenceServerClient(f"127.0.0.1:{srv.port}", network_timeout=60, connection_timeout=10)


def index_of(client, name="m"):
    return {int(e["version"]): e["state"] for e in client.get_model_repository_index() if e["name"] == name}


def test_explicit_mode_load_unload_with_tritonclient(tmp_path):
    base = tmp_path / "m"
    other = tmp_path / "other"
    u.write_version(base, 1, u.version_model(1))
    u.write_version(other, 1, u.version_model(1))
    cfg = u.write_text(tmp_path / "models.config", u.model_config_text([
        {"name": "m", "base_path": str(base)}, {"name": "other", "base_path": str(other)}]))
    with u.Server(tmp_path, config_file=cfg, poll=0.1, extra=["--model_control_mode=explicit"]) as srv:
        c = triton(srv)
        assert c.is_model_ready("m") and c.is_model_ready("other")  # loaded at start-up
        # the file-system poller changes nothing on its own
        u.write_version(base, 2, u.version_model(2))
        time.sleep(0.6)
        assert predict_version(srv) == 1
        assert 2 not in versions(srv)
        # load: re-reads the base path, publishes 2, retires 1
        c.load_model("m")
        assert c.is_model_ready("m")
        assert predict_version(srv) == 2
        idx = index_of(c)
        assert idx.get(2) == "READY", idx
        wait_for(lambda: state_is(srv, 1, "END"), "version 1 to end", srv)
        assert metric(srv, "tensord_model_version_state", model="m", version="2") == 30
        assert metric(srv, "tensord_model_swap_count", model="m", version="2", event="load") == 1
        assert metric(srv, "tensord_model_swap_count", model="m", version="1", event="unload") == 1
        assert metric(srv, "tensord_model_version_state", model="m", version="1") is None
        # unload: not ready, nothing serves, the other model untouched, and the poller does not bring it back
        c.unload_model("m")
        assert not c.is_model_ready("m")
        r = srv.post_json("/v1/models/m:predict", {"instances": [[1.0]]})
        assert r.status_code in (404, 503), r.content
        time.sleep(0.5)
        assert not c.is_model_ready("m")
        assert c.is_model_ready("other")
        wait_for(lambda: metric(srv, "tensord_model_version_state", model="m", version="2") is None,
                 "the unloaded version's state series to go", srv)
        assert metric(srv, "tensord_model_swap_count", model="m", version="2", event="unload") == 1
        assert index_of(c).get(2) == "UNAVAILABLE", index_of(c)
        assert log_lines(srv, "retire", version=2) and "unloaded on request" in log_lines(srv, "retire", version=2)[0]
        # load again
        c.load_model("m")
        assert c.is_model_ready("m") and predict_version(srv) == 2
        assert metric(srv, "tensord_model_swap_count", model="m", version="2", event="load") == 2
        assert metric(srv, "tensord_model_version_state", model="m", version="2") == 30
        # a failing load: an error naming the version and file; what served keeps serving
        u.write_version(base, 3, b"not a protobuf")
        with pytest.raises(InferenceServerException) as ei:
            c.load_model("m")
        assert "version 3" in str(ei.value) and "model.onnx" in str(ei.value), str(ei.value)
        assert ei.value.status() == "400", ei.value.status()
        assert c.is_model_ready("m") and predict_version(srv) == 2
        assert metric(srv, "tensord_model_swap_count", model="m", version="3", event="load_failed") == 1
        # unknown model
        with pytest.raises(InferenceServerException) as ei:
            c.load_model("nope")
        assert ei.value.status() == "404" and "nope" in str(ei.value)
        with pytest.raises(InferenceServerException) as ei:
            c.unload_model("nope")
        assert ei.value.status() == "404"
        # a configured model whose base path went away: 400 naming it, and what served keeps serving
        shutil.rmtree(other)
        with pytest.raises(InferenceServerException) as ei:
            c.load_model("other")
        assert ei.value.status() == "400" and "base path" in str(ei.value) and str(other) in str(ei.value)
        assert c.is_model_ready("other")
        # Triton's config/file overrides are refused
        with pytest.raises(InferenceServerException) as ei:
            c.load_model("m", config='{"backend": "onnxruntime"}')
        assert ei.value.status() == "400" and "not supported" in str(ei.value)
        # wrong methods
        r = srv.get("/v2/repository/models/m/load")
        assert r.status_code == 405 and r.headers.get("Allow") == "POST"


def test_explicit_mode_needs_the_admin_token(tmp_path):
    base = tmp_path / "m"
    u.write_version(base, 1, u.version_model(1))
    token = "s3cret-token-0123456789"
    tok = u.write_text(tmp_path / "token", token + "\n")
    with u.Server(tmp_path, base_path=str(base), poll=0.1,
                  extra=["--model_control_mode=explicit", f"--admin_token_file={tok}"]) as srv:
        for action in ("load", "unload"):
            r = srv.post(f"/v2/repository/models/m/{action}", data="{}")
            u.check_error(r, 401, "token")
            assert r.headers.get("WWW-Authenticate", "").startswith("Bearer"), r.headers
            r = srv.post(f"/v2/repository/models/m/{action}", data="{}",
                         headers={"Authorization": "Bearer " + token[:-1] + "X"})
            u.check_error(r, 401, "token")
            r = srv.post(f"/v2/repository/models/m/{action}", data="{}", headers={"Authorization": token})
            u.check_error(r, 401)
        assert triton(srv).is_model_ready("m"), "refused calls changed nothing"
        c = triton(srv)
        with pytest.raises(InferenceServerException) as ei:
            c.unload_model("m")
        assert ei.value.status() == "401"
        auth = {"Authorization": f"Bearer {token}"}
        c.unload_model("m", headers=auth)
        assert not c.is_model_ready("m")
        c.load_model("m", headers=auth)
        assert c.is_model_ready("m")
        r = srv.post("/v2/repository/models/m/unload", data="", headers=auth)
        assert r.status_code == 200 and r.json() == {}, r.content
    # the token from the environment works the same way
    env = dict(os.environ, TENSORD_ADMIN_TOKEN=token)
    with u.Server(tmp_path, base_path=str(base), poll=0.1, env=env, extra=["--model_control_mode=explicit"]) as srv:
        u.check_error(srv.post("/v2/repository/models/m/unload", data="{}"), 401)
        r = srv.post("/v2/repository/models/m/unload", data="{}", headers={"Authorization": f"bearer {token}"})
        assert r.status_code == 200, r.content


def test_repository_control_is_refused_without_explicit_mode(tmp_path):
    base = tmp_path / "m"
    u.write_version(base, 1, u.version_model(1))
    with u.Server(tmp_path, base_path=str(base), poll=0.2) as srv:
        for action in ("load", "unload"):
            msg = u.check_error(srv.post(f"/v2/repository/models/m/{action}", data="{}"), 503)
            assert "explicit model load / unload is not allowed" in msg and "--model_control_mode=explicit" in msg
        c = triton(srv)
        with pytest.raises(InferenceServerException) as ei:
            c.unload_model("m")
        assert ei.value.status() == "503"
        assert c.is_model_ready("m") and predict_version(srv) == 1
