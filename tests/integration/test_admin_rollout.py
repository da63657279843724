"""A rollout through the admin API, end to end against the real binary, as an MLOps engineer would run it (issue 11's
Done-when): a model with versions 1 and 2 added over the admin port, labels stable/canary, an 80/20 split over REST
and gRPC, sticky users, explicit version and label requests, shadow traffic, promote and rollback. Every change
(labels, traffic, promote, rollback) happens under a steady background load of REST and gRPC predicts, none of which
may fail; the split is measured on the test's own predicts with that load paused. Then the automatic rollback of a canary that fails on a share
of its inputs (settings from the model config file), and the label rules: a label loads its version first and
pins it; a version that cannot load is refused with its load error.

Each version of the models here answers with its own number (serving_util.version_model), and every reply says
which version answered (X-Model-Version on REST, model_spec.version on gRPC), so the split is read off the replies.
"""
import threading
import time

import grpc
import numpy as np
import requests
from onnx import TensorProto, helper

import grpc_util as g
import serving_util as u
from admin_util import admin_model, admin_req, admin_server, wait_for_rollback


class Load:
    """Predicts on a few threads until stopped: every reply must be 200 (REST) or OK (gRPC)."""

    def __init__(self, srv, model, threads=2, grpc_too=True):
        self.srv, self.model, self.failures, self.count = srv, model, [], 0
        self.stop_ev = threading.Event()
        self.threads = [threading.Thread(target=self._rest, daemon=True) for _ in range(threads)]
        if grpc_too:
            self.threads.append(threading.Thread(target=self._grpc, daemon=True))

    def _rest(self):
        s = requests.Session()
        while not self.stop_ev.is_set():
            r = self.srv.post_json(f"/v1/models/{self.model}:predict", {"instances": [[0.0]]}, session=s)
            self.count += 1
            if r.status_code != 200:
                self.failures.append(("rest", r.status_code, r.text))

    def _grpc(self):
        stub = g.predict_stub(self.srv)
        while not self.stop_ev.is_set():
            try:
                g.grpc_version(stub, self.model)
                self.count += 1
            except grpc.RpcError as e:
                self.failures.append(("grpc", e.code().name, e.details()))
            time.sleep(0.005)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop_ev.set()
        for t in self.threads:
            t.join(timeout=30)


def _version_count(srv, model, version):
    text = srv.get("/monitoring/prometheus/metrics").text
    return sum(v for _, v in u.metric_samples(text, "tensord_request_count", model=model, version=str(version)))


def test_rollout_through_the_admin_api_end_to_end(tmp_path):
    base = str(tmp_path / "fm")
    for v in (1, 2):
        u.write_version(base, v, u.version_model(v))
    srv, aport = admin_server(tmp_path, grpc=True)
    with srv:
        # the model is added with the default policy (latest): only version 2 loads
        r = admin_req(aport, "POST", "/v1/admin/models", json={"name": "fm", "base_path": base})
        assert r.status_code == 201, r.text
        m = admin_model(aport, "fm")
        assert [v["version"] for v in m["versions"] if v["state"] == "AVAILABLE"] == [2], m
        with Load(srv, "fm") as load:
            # a label on version 1 (on disk, not loaded) loads it first and returns once it is AVAILABLE
            r = admin_req(aport, "PUT", "/v1/admin/models/fm/labels/stable", json={"version": 1})
            assert r.status_code == 200, r.text
            m = admin_model(aport, "fm")
            assert {v["version"]: v["state"] for v in m["versions"]}.get(1) == "AVAILABLE", m
            r = admin_req(aport, "PUT", "/v1/admin/models/fm/labels/canary", json={"version": 2})
            assert r.status_code == 200, r.text
            r = admin_req(aport, "PUT", "/v1/admin/models/fm/traffic",
                          json={"routes": {"stable": 80, "canary": 20}, "sticky_header": "X-User-Id"})
            assert r.status_code == 200, r.text
            time.sleep(1.0)  # the policy's poller runs every 0.2 s: the pinned version 1 must stay
            assert admin_model(aport, "fm")["labels"] == {"stable": 1, "canary": 2}
        assert not load.failures, load.failures[:5]
        assert load.count > 50, "the background load sent almost nothing: the test proved little"

        # The split is read off our own predicts alone: the router's picks follow one low-discrepancy sequence per
        # model, and a concurrent client would take a random-looking share of it.
        s = requests.Session()
        got = [u.rest_version(srv, s, "/v1/models/fm:predict") for _ in range(2000)]
        share = got.count(2) / len(got)
        assert set(got) == {1, 2}
        assert abs(share - 0.20) <= 0.03, f"version 2 answered {share:.3f} of 2,000 REST predicts, want 0.20 +- 0.03"
        stub = g.predict_stub(srv)
        gv = [g.grpc_version(stub, "fm") for _ in range(300)]
        gshare = gv.count(2) / len(gv)
        assert abs(gshare - 0.20) <= 0.03, f"version 2 answered {gshare:.3f} of 300 gRPC predicts, want 0.20 +- 0.03"

        # the same X-User-Id always gets the same version, over REST and gRPC
        first = {}
        for i in range(60):
            user = f"user-{i}"
            vs = {u.rest_version(srv, s, "/v1/models/fm:predict", headers={"X-User-Id": user}) for _ in range(4)}
            assert len(vs) == 1, f"{user} was answered by versions {vs}"
            first[user] = vs.pop()
            assert g.grpc_version(stub, "fm", metadata=(("x-user-id", user),)) == first[user], user
        assert set(first.values()) == {1, 2}, "60 users all on one version with an 80/20 split"

        # explicit version and label requests ignore the split
        assert {u.rest_version(srv, s, "/v1/models/fm/versions/2:predict") for _ in range(50)} == {2}
        assert {u.rest_version(srv, s, "/v1/models/fm/labels/stable:predict") for _ in range(50)} == {1}
        assert {u.rest_version(srv, s, "/v1/models/fm/labels/canary:predict") for _ in range(50)} == {2}

        # per-route request counts and latency are in Prometheus, by label
        text = srv.get("/monitoring/prometheus/metrics").text
        for label, version in (("stable", "1"), ("canary", "2")):
            assert u.metric_samples(text, "tensord_request_count", model="fm", version=version, label=label,
                                    status="OK"), label
            lat = u.metric_samples(text, "tensord_request_latency_us_count", model="fm", version=version,
                                   label=label)
            assert lat and sum(v for _, v in lat) > 0, f"no per-route latency for {label}"

        # shadow: every reply from stable, and the canary's counter rises by the same count
        r = admin_req(aport, "PUT", "/v1/admin/models/fm/traffic",
                      json={"routes": {"stable": 100}, "shadow": "canary"})
        assert r.status_code == 200, r.text
        before = _version_count(srv, "fm", 2)
        n = 200
        assert {u.rest_version(srv, s, "/v1/models/fm:predict") for _ in range(n)} == {1}, \
            "a shadowed request was answered by the shadow"
        end = time.monotonic() + 30
        while _version_count(srv, "fm", 2) < before + n and time.monotonic() < end:
            time.sleep(0.05)
        assert _version_count(srv, "fm", 2) == before + n, \
            f"canary counted {_version_count(srv, 'fm', 2) - before} shadow copies of {n} requests"

        with Load(srv, "fm") as load:
            # promote gives 100 % to version 2, rollback 100 % back to version 1
            assert admin_req(aport, "PUT", "/v1/admin/models/fm/traffic",
                             json={"routes": {"stable": 80, "canary": 20}}).status_code == 200
            r = admin_req(aport, "POST", "/v1/admin/models/fm:promote")
            assert r.status_code == 200, r.text
            assert {u.rest_version(srv, s, "/v1/models/fm:predict") for _ in range(300)} == {2}
            assert {g.grpc_version(stub, "fm") for _ in range(100)} == {2}
            assert admin_model(aport, "fm")["labels"]["stable"] == 2
            r = admin_req(aport, "POST", "/v1/admin/models/fm:rollback")
            assert r.status_code == 200, r.text
            assert {u.rest_version(srv, s, "/v1/models/fm:predict") for _ in range(300)} == {1}
            assert {g.grpc_version(stub, "fm") for _ in range(100)} == {1}
            time.sleep(1.0)
        assert not load.failures, load.failures[:5]
        assert load.count > 50, "the background load sent almost nothing: the test proved little"

        # no admin route on the inference ports: not on REST, and no such service on gRPC
        assert srv.get("/v1/admin/models").status_code in (400, 404)
        ch = srv.grpc_channel()
        for method in ("/tensord.admin.Admin/ListModels", "/v1/admin/models"):
            e = g.rpc_error(ch.unary_unary(method, request_serializer=lambda x: x, response_deserializer=lambda x: x),
                            b"")
            assert e.code() == grpc.StatusCode.UNIMPLEMENTED, (method, e.code(), e.details())


def _failing_canary(version=2):
    """version_model's signature (x [N,1] -> y [N,1], y = version) but y also adds table[int(x)] from a 2-entry
    table: any x >= 2 is an index out of range, so the version fails on those inputs and serves the rest."""
    nodes = [helper.make_node("Cast", ["x"], ["xi"], to=TensorProto.INT64),
             helper.make_node("Gather", ["table", "xi"], ["gx"], axis=0),
             helper.make_node("Mul", ["x", "zero"], ["t"]),
             helper.make_node("Add", ["t", "ver"], ["tv"]),
             helper.make_node("Add", ["tv", "gx"], ["y"])]
    return u._model(nodes, [("x", ["N", 1])], [("y", ["N", 1])],
                    [("table", np.float32([0.0, 0.0])), ("zero", np.float32([0.0])),
                     ("ver", np.float32([version]))])


def test_automatic_rollback_of_a_canary_failing_on_a_share_of_inputs(tmp_path):
    base = str(tmp_path / "m")
    u.write_version(base, 1, u.version_model(1))
    u.write_version(base, 2, _failing_canary(2))
    cfg = u.model_config_text([{"name": "m", "base_path": base, "labels": {"stable": 1, "canary": 2}}])
    ar = ("    traffic {\n      routes { key: 'stable' value: 50 }\n      routes { key: 'canary' value: 50 }\n"
          "      auto_rollback { max_error_rate: 0.05 window_s: 10 min_requests: 40 }\n    }\n")
    cfg_path = u.write_text(str(tmp_path / "models.config"), cfg.replace("  }\n}", ar + "  }\n}"))
    srv, aport = admin_server(tmp_path, config_file=cfg_path)
    with srv:
        traffic = admin_req(aport, "GET", "/v1/admin/models/m/traffic").json()
        assert traffic["auto_rollback"] == {"max_error_rate": 0.05, "window_s": 10, "min_requests": 40}, traffic
        # the policy is latest{1}: version 1 serves only because the stable label pins it
        seen, failures, stop = [], [], threading.Event()

        def load(k):
            s = requests.Session()
            i = 0
            while not stop.is_set():
                i += 1
                x = 5.0 if i % 5 == k else 0.5  # one input in five is one the canary cannot serve
                r = srv.post_json("/v1/models/m:predict", {"instances": [[x]]}, session=s)
                if r.status_code == 200:
                    seen.append((time.monotonic(), int(r.headers["X-Model-Version"])))
                else:
                    failures.append((time.monotonic(), x, r.status_code, r.text))

        threads = [threading.Thread(target=load, args=(k,), daemon=True) for k in range(2)]
        for t in threads:
            t.start()
        try:
            traffic, rolled = wait_for_rollback(aport, "m")
            time.sleep(1.5)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=30)
        assert rolled, f"no automatic rollback within 40 s: {traffic}"
        why = traffic["last_auto_rollback"]["reason"]
        assert "canary" in why and "failed" in why and "%" in why, why
        assert any(v == 2 for _, v in seen), "the canary never answered: the test proved nothing"
        assert failures, "the canary never failed: the test proved nothing"
        # only the canary's own failures: inputs it cannot serve, before the rollback; none since
        assert all(x == 5.0 for _, x, _, _ in failures), failures[:3]
        assert all(t <= rolled + 0.3 for t, _, _, _ in failures), "requests failed after the rollback"
        assert all("version 2" in text for _, _, _, text in failures), failures[:3]
        assert all(v == 1 for t, v in seen if t > rolled + 0.3), "requests reached the canary after the rollback"
        text = srv.get("/monitoring/prometheus/metrics").text
        assert u.metric_samples(text, "tensord_model_swap_count", model="m", event="auto_rollback")
        assert "auto_rollback" in srv.stderr()


def test_a_label_loads_its_version_or_names_the_load_error(tmp_path):
    base = str(tmp_path / "m")
    for v in (1, 2):
        u.write_version(base, v, u.version_model(v))
    srv, aport = admin_server(tmp_path, base=base)
    with srv:
        s = requests.Session()
        assert {v["version"] for v in admin_model(aport, "m")["versions"] if v["state"] == "AVAILABLE"} == {2}
        r = admin_req(aport, "PUT", "/v1/admin/models/m/labels/old", json={"version": 1})
        assert r.status_code == 200, r.text
        assert u.rest_version(srv, s, "/v1/models/m/labels/old:predict") == 1
        assert u.rest_version(srv, s) == 2, "requests naming no version stay on the policy's version"
        # a version on disk that cannot load: the call fails with the load error, the label stays where it was
        u.write_version(base, 3, b"not a protobuf")
        time.sleep(1.0)  # the poller tries version 3 (latest) and fails; version 2 keeps serving
        r = admin_req(aport, "PUT", "/v1/admin/models/m/labels/old", json={"version": 3})
        assert r.status_code in (400, 409, 412), r.text
        assert "version 3" in r.text and "failed to load" in r.text and "old" in r.text, r.text
        assert u.rest_version(srv, s, "/v1/models/m/labels/old:predict") == 1
        r = admin_req(aport, "PUT", "/v1/admin/models/m/labels/old", json={"version": 9})
        assert r.status_code in (400, 404, 409, 412) and "not under base path" in r.text, r.text
        # moving the label away unpins version 1: the policy retires it
        assert admin_req(aport, "PUT", "/v1/admin/models/m/labels/old", json={"version": 2}).status_code == 200
        end = time.monotonic() + 20
        while time.monotonic() < end:
            states = {v["version"]: v["state"] for v in admin_model(aport, "m")["versions"]}
            if states.get(1) in ("END", "UNLOADING", None):
                break
            time.sleep(0.1)
        assert states.get(1) in ("END", "UNLOADING", None), states
        assert u.rest_version(srv, s) == 2
