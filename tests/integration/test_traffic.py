"""The traffic router, configured in the model config file (tensord's `traffic { routes {...} sticky_header shadow }`
inside a model's `config { ... }`), against the real binary over REST and gRPC. The models answer with their own
version number (serving_util.version_model), and every reply names the version (X-Model-Version, model_spec).

- 80/20 between the labels stable (v1) and canary (v2): 2,000 REST predicts split 20% +- 3%, 300 gRPC predicts too.
- A sticky header (X-User-Id; gRPC metadata x-user-id) keeps a user on one version; users spread by the weights.
- Requests that name a version or a label ignore the split.
- Shadow: with all traffic on stable and shadow canary, every reply comes from stable while canary's request
  counter rises by the same count.
- A route whose label names an unknown label is refused at start with an error naming it.
No request fails at any point.
"""
import subprocess

import grpc
import pytest
import requests

import grpc_util as g
import serving_util as u


def _config(base, routes, sticky=None, shadow=None):
    text = u.model_config_text([{"name": "m", "base_path": base, "policy": "all",
                                 "labels": {"stable": 1, "canary": 2}}])
    t = "    traffic {\n" + "".join(f"      routes {{ key: '{k}' value: {w} }}\n" for k, w in routes.items())
    if sticky:
        t += f"      sticky_header: '{sticky}'\n"
    if shadow:
        t += f"      shadow: '{shadow}'\n"
    t += "    }\n"
    return text.replace("  }\n}", t + "  }\n}")  # inside the model's config { }


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    b = str(tmp_path_factory.mktemp("traffic") / "m")
    for v in (1, 2):
        u.write_version(b, v, u.version_model(v))
    return b


def _serve(tmp_path, base, **kw):
    cfg = str(tmp_path / "models.config")
    u.write_text(cfg, _config(base, **kw))
    return u.Server(tmp_path, config_file=cfg, grpc=True)


_rest_version = u.rest_version
_grpc_stub = g.predict_stub
_grpc_version = g.grpc_version


def test_weighted_split_rest_and_grpc(tmp_path, base):
    with _serve(tmp_path, base, routes={"stable": 80, "canary": 20}) as srv:
        s = requests.Session()
        got = [_rest_version(srv, s) for _ in range(2000)]
        share = got.count(2) / len(got)
        assert set(got) == {1, 2}
        assert abs(share - 0.20) <= 0.03, f"canary answered {share:.3f} of 2,000 REST predicts, want 0.20 +- 0.03"
        stub = _grpc_stub(srv)
        g = [_grpc_version(stub) for _ in range(300)]
        gshare = g.count(2) / len(g)
        assert abs(gshare - 0.20) <= 0.03, f"canary answered {gshare:.3f} of 300 gRPC predicts, want 0.20 +- 0.03"
        # naming a version or a label ignores the split
        assert {_rest_version(srv, s, "/v1/models/m/versions/2:predict") for _ in range(50)} == {2}
        assert {_rest_version(srv, s, "/v1/models/m/labels/stable:predict") for _ in range(50)} == {1}
        text = srv.get("/monitoring/prometheus/metrics").text
        canary = sum(v for _, v in u.metric_samples(text, "tensord_request_count", model="m", version="2",
                                                    label="canary", status="OK"))
        assert canary >= got.count(2) + g.count(2), "routed requests are counted under their route's label"


def test_sticky_header_keeps_a_user_on_one_version(tmp_path, base):
    with _serve(tmp_path, base, routes={"stable": 50, "canary": 50}, sticky="X-User-Id") as srv:
        s = requests.Session()
        users = [f"user-{i}" for i in range(200)]
        first = {}
        for user in users:
            first[user] = _rest_version(srv, s, headers={"X-User-Id": user})
        for user in users[:50]:
            assert {_rest_version(srv, s, headers={"X-User-Id": user}) for _ in range(5)} == {first[user]}, user
        share = sum(1 for v in first.values() if v == 2) / len(users)
        assert 0.35 <= share <= 0.65, f"{share:.2f} of 200 users on canary with 50/50 weights"
        stub = _grpc_stub(srv)
        for user in users[:20]:  # the same user over gRPC (metadata keys are lowercase) lands on the same version
            assert _grpc_version(stub, metadata=(("x-user-id", user),)) == first[user], user


def test_shadow_copies_requests_to_the_canary(tmp_path, base):
    with _serve(tmp_path, base, routes={"stable": 100}, shadow="canary") as srv:
        def canary_count():
            text = srv.get("/monitoring/prometheus/metrics").text
            return sum(v for _, v in u.metric_samples(text, "tensord_request_count", model="m", version="2"))
        before = canary_count()
        s = requests.Session()
        n = 200
        assert {_rest_version(srv, s) for _ in range(n)} == {1}, "a shadowed request was answered by the shadow"
        import time
        end = time.monotonic() + 30
        while canary_count() < before + n and time.monotonic() < end:  # shadows run off the critical path
            time.sleep(0.05)
        assert canary_count() == before + n, f"canary counted {canary_count() - before} shadow copies of {n} requests"


def test_route_to_an_unknown_label_is_a_startup_error(tmp_path, base):
    cfg = str(tmp_path / "models.config")
    u.write_text(cfg, _config(base, routes={"stable": 90, "nightly": 10}))
    p = subprocess.run([u.tensord_bin(), "serve", "--rest_api_port=0", "--port=0", f"--model_config_file={cfg}"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "nightly" in p.stderr and "version labels" in p.stderr, p.stderr
