"""Every REST inference reply says which version answered it: the header `X-Model-Version` (TF Serving's :predict,
:classify and :regress, and KServe v2's infer, which also carries `model_version` in its body). The models here
answer with their own version number (serving_util.version_model), so the header can be checked against the
answer itself. Errors carry no version.
"""
import pytest

import serving_util as u


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mv")
    base = str(tmp / "m")
    for v in (1, 2, 3):
        u.write_version(base, v, u.version_model(v))
    cfg = str(tmp / "models.config")
    u.write_text(cfg, u.model_config_text([{"name": "m", "base_path": base, "policy": "all",
                                           "labels": {"stable": 1, "canary": 2}}]))
    s = u.Server(tmp, config_file=cfg)
    yield s
    u.server_fixture_finalize(s)


@pytest.mark.parametrize("path,want", [
    ("/v1/models/m:predict", 3),                   # no version named: the latest
    ("/v1/models/m/versions/1:predict", 1),
    ("/v1/models/m/labels/canary:predict", 2),
    ("/v1/models/m/labels/stable:regress", 1),
])
def test_tfs_replies_name_the_version(srv, path, want):
    body = {"examples": [{"x": 5.0}]} if path.endswith(":regress") else {"instances": [[5.0]]}
    r = srv.post_json(path, body)
    assert r.status_code == 200, r.text
    assert r.headers.get("X-Model-Version") == str(want), dict(r.headers)
    got = r.json()["results"][0] if path.endswith(":regress") else r.json()["predictions"][0][0]
    assert got == want, f"the answer came from version {got}, the header says {r.headers.get('X-Model-Version')}"


@pytest.mark.parametrize("path,want", [("/v2/models/m/infer", 3), ("/v2/models/m/versions/2/infer", 2)])
def test_kserve_replies_name_the_version(srv, path, want):
    r = srv.post_json(path, {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0.0]}]})
    assert r.status_code == 200, r.text
    assert r.headers.get("X-Model-Version") == str(want), dict(r.headers)
    j = r.json()
    assert j["model_version"] == str(want), j
    assert j["outputs"][0]["data"] == [float(want)], j


def test_errors_name_no_version(srv):
    r = srv.post_json("/v1/models/m/versions/1:predict", {"instances": [["not a number"]]})
    assert r.status_code == 400, r.text
    assert "X-Model-Version" not in r.headers, dict(r.headers)
    r = srv.post_json("/v1/models/m/versions/9:predict", {"instances": [[1.0]]})
    assert r.status_code == 404, r.text
    assert "X-Model-Version" not in r.headers
