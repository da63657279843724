"""Helpers the admin-room tests share: a server with the admin port open (token from TENSORD_ADMIN_TOKEN), and
admin calls with the bearer token."""
import os
import socket
import time

import requests

import serving_util as u

TOKEN = "a3f1c9e07b5d4e2a8c6f0b1d3e5a7c9f"  # 32 hex characters = 128 bits


def admin_server(tmp_path, extra=(), token=TOKEN, base=None, **kw):
    """A Server with --admin_port; without base, model 'm' with versions 1 and 2 (serving_util.version_model)."""
    if base is None and "config_file" not in kw:
        base = str(tmp_path / "m")
        for v in (1, 2):
            u.write_version(base, v, u.version_model(v))
    aport = u.free_port()
    env = dict(os.environ, TENSORD_ADMIN_TOKEN=token)
    srv = u.Server(tmp_path, base_path=base, env=env, extra=[f"--admin_port={aport}", *extra], **kw)
    wait_admin(aport)
    return srv, aport


def wait_for_rollback(aport, model, timeout=40, poll=0.1):
    """Poll the model's traffic until all of it is on stable (an automatic rollback): (traffic, monotonic time it was
    seen), or (the last traffic, None) after timeout seconds."""
    end, traffic = time.monotonic() + timeout, None
    while time.monotonic() < end:
        traffic = admin_req(aport, "GET", f"/v1/admin/models/{model}/traffic").json()
        if traffic["routes"] == {"stable": 100}:
            return traffic, time.monotonic()
        time.sleep(poll)
    return traffic, None


def wait_admin(aport, timeout=30):
    """The admin listener opens after the inference ports: wait until it accepts connections."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", aport), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)


def admin_req(aport, method, path, token=TOKEN, **kw):
    h = kw.pop("headers", {})
    if token is not None:
        h["Authorization"] = f"Bearer {token}"
    return requests.request(method, f"http://127.0.0.1:{aport}{path}", headers=h, timeout=120, **kw)


def admin_model(aport, name):
    """The model's entry in GET /v1/admin/models (None when it is not listed)."""
    ms = [m for m in admin_req(aport, "GET", "/v1/admin/models").json()["models"] if m["name"] == name]
    return ms[0] if ms else None
