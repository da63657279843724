"""Dataset uploads on the admin port against the real binary (issue 12): Debian's Fashion-MNIST IDX pair as a
multipart upload (records and SHA-256 checked against the files), NPZ, NPY and CSV bodies, the read and delete
routes, and the refusals, each of which must leave nothing under <state_dir>/datasets: malformed IDX, NPZ and CSV
files (400 with the reader's message), an IDX pair whose counts differ, bad names and formats, an upload over
--max_upload_bytes (by Content-Length, and a chunked body that grows past it), over --dataset_quota_bytes, and a
client that goes away mid-upload. Every dataset route answers 401 without the token.
"""
import gzip
import hashlib
import io
import os
import socket
import time

import numpy as np
import pytest
import requests

import serving_util as u
from admin_util import TOKEN, admin_req, admin_server

FM = "/usr/share/datasets/fashion-mnist"
TRAIN = (f"{FM}/train-images-idx3-ubyte.gz", f"{FM}/train-labels-idx1-ubyte.gz")
TEST = (f"{FM}/t10k-images-idx3-ubyte.gz", f"{FM}/t10k-labels-idx1-ubyte.gz")


def _read(p):
    with open(p, "rb") as f:
        return f.read()


def _server(tmp, *flags):
    state = tmp / "state"
    state.mkdir()
    srv, aport = admin_server(tmp, extra=[f"--state_dir={state}", *flags])
    return srv, aport, state / "datasets"


def _stored(root):
    """What is under <state_dir>/datasets, temp dirs included."""
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


def _upload(aport, name, fmt, token=TOKEN, **kw):
    return admin_req(aport, "POST", f"/v1/admin/datasets?name={name}&format={fmt}", token=token, **kw)


def _idx_pair(images, labels):
    return {"images": ("images.gz", images, "application/octet-stream"),
            "labels": ("labels.gz", labels, "application/octet-stream")}


def _npz(compressed=True, **arrays):
    b = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(b, **arrays)
    return b.getvalue()


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    srv, aport, root = _server(tmp_path_factory.mktemp("datasets"))
    yield srv, aport, root
    u.server_fixture_finalize(srv)


def test_fashion_mnist_idx_pair_as_multipart(ds):
    if not os.path.exists(TRAIN[0]):
        pytest.fail(f"{TRAIN[0]} is missing: install Debian's dataset-fashion-mnist (make deps)")
    _, aport, root = ds
    for name, (ip, lp), n in (("fm-train", TRAIN, 60000), ("fm-test", TEST, 10000)):
        images, labels = _read(ip), _read(lp)
        r = _upload(aport, name, "idx", files=_idx_pair(images, labels))
        assert r.status_code == 201, r.text
        j = r.json()
        assert j["dataset"] == name and j["format"] == "idx" and j["records"] == n, j
        assert j["sha256"] == hashlib.sha256(images + labels).hexdigest(), j
        assert j["bytes"] == len(images) + len(labels)
        assert j["columns"] == [{"name": "x", "dtype": "float32", "shape": [28, 28]},
                                {"name": "label", "dtype": "int64", "shape": []}], j
        assert j["files"] == ["images-idx-ubyte.gz", "labels-idx-ubyte.gz"]
        assert _read(root / name / "images-idx-ubyte.gz") == images  # stored as received
        g = admin_req(aport, "GET", f"/v1/admin/datasets/{name}")
        assert g.status_code == 200 and g.json() == j, g.text
    lst = admin_req(aport, "GET", "/v1/admin/datasets").json()["datasets"]
    names = [d["dataset"] for d in lst]
    assert names.index("fm-test") < names.index("fm-train"), names  # newest first
    assert not [e for e in _stored(root) if e.startswith(".tmp-")]

    # the pair the other way round in the body hashes the same; an IDX pair whose counts differ is refused
    r = _upload(aport, "fm-rev", "idx", files=[("labels", ("l", _read(TEST[1]))), ("images", ("i", _read(TEST[0])))])
    assert r.status_code == 201 and r.json()["sha256"] == hashlib.sha256(_read(TEST[0]) + _read(TEST[1])).hexdigest()
    before = _stored(root)
    r = _upload(aport, "fm-mixed", "idx", files=_idx_pair(_read(TRAIN[0]), _read(TEST[1])))
    assert r.status_code == 400, r.text
    assert "10000" in r.json()["error"] and "60000" in r.json()["error"] and "fm-mixed" in r.json()["error"], r.text
    assert _stored(root) == before


def test_npz_npy_and_csv_uploads(ds):
    _, aport, root = ds
    x = np.arange(40 * 6, dtype=np.float32).reshape(40, 2, 3) / 7
    y = np.arange(40, dtype=np.int64) % 3
    for name, compressed in (("npz-deflated", True), ("npz-stored", False)):
        body = _npz(compressed, x=x, label=y)
        r = _upload(aport, name, "npz", data=body)
        assert r.status_code == 201, r.text
        j = r.json()
        assert j["records"] == 40 and j["sha256"] == hashlib.sha256(body).hexdigest(), j
        assert {c["name"]: (c["dtype"], c["shape"]) for c in j["columns"]} == {"x": ("float32", [2, 3]),
                                                                              "label": ("int64", [])}, j

    b = io.BytesIO()
    np.save(b, x)
    r = _upload(aport, "npy-one", "npy", data=b.getvalue())
    assert r.status_code == 201 and r.json()["records"] == 40 and r.json()["files"] == ["x.npy"], r.text
    yb = io.BytesIO()
    np.save(yb, y)
    r = _upload(aport, "npy-parts", "npy", files={"x": ("x.npy", b.getvalue()), "label": ("y.npy", yb.getvalue())})
    assert r.status_code == 201, r.text
    assert [c["name"] for c in r.json()["columns"]] == ["x", "label"], r.text

    csv = "f1,f2,label\n" + "".join(f"{i * 0.5},{-i},{i % 2}\n" for i in range(25))
    # a raw body as `curl --data-binary` sends it (form-urlencoded content type): still the file, not a form
    r = _upload(aport, "csv", "csv", data=csv.encode(),
                headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 201, r.text
    assert r.json()["records"] == 25 and r.json()["columns"][0] == {"name": "x", "dtype": "float32", "shape": [2]}
    gz = gzip.compress(csv.encode())
    r = _upload(aport, "csv-gz", "csv", data=gz)
    assert r.status_code == 201 and r.json()["files"] == ["data.csv.gz"], r.text
    assert r.json()["sha256"] == hashlib.sha256(gz).hexdigest()
    r = _upload(aport, "csv", "csv", data=csv.encode())
    assert r.status_code == 409 and "'csv' exists" in r.json()["error"], r.text


def test_malformed_files_are_refused_naming_the_problem(ds):
    _, aport, root = ds
    labels = _read(TEST[1])
    bad_magic = b"\x01\x02\x08\x03" + bytes(100)
    idx = gzip.decompress(_read(TEST[0]))
    truncated_idx = idx[: len(idx) - 784 * 3 - 5]
    good_npz = _npz(x=np.ones((10, 3), np.float32), label=np.zeros(10, np.int64))
    nan_npz = _npz(x=np.array([[1.0], [np.nan]], np.float32), label=np.zeros(2, np.int64))
    cases = [
        ("idx", {"files": _idx_pair(bad_magic, labels)}, ["not an IDX file", "images-idx-ubyte"]),
        ("idx", {"files": _idx_pair(truncated_idx, labels)}, ["images-idx-ubyte", "truncated"]),
        ("idx", {"files": {"images": ("i", _read(TEST[0]))}}, ["'labels' is missing"]),
        ("idx", {"data": _read(TEST[0])}, ["multipart", "'images'"]),
        ("npz", {"data": good_npz[: len(good_npz) // 2]}, ["data.npz"]),
        ("npz", {"data": nan_npz}, ["non-finite", "example 1"]),
        ("npz", {"data": b"this is not a zip"}, ["data.npz"]),
        ("csv", {"data": b"a,b,label\n1,2,0\n3,oops,1\n"}, ["line 3", "'oops'", "column 'b'"]),
        ("csv", {"data": b"a,label\n1,0\nNaN,1\n"}, ["line 3", "non-finite"]),
        ("csv", {"data": b"a,b,label\n1,2,0\n3,4\n"}, ["line 3", "fields"]),
        ("jsonl", {"data": b'{"inputs": {"x": [1, 2]}, "label": 0}\nnot json\n'}, ["line 2"]),
        ("tfrecord", {"data": b"\x00" * 40}, ["data.tfrecord"]),
    ]
    before = _stored(root)
    for i, (fmt, kw, words) in enumerate(cases):
        name = f"bad-{i}"
        r = _upload(aport, name, fmt, **kw)
        assert r.status_code == 400, f"{fmt} case {i}: {r.status_code} {r.text}"
        msg = r.json()["error"]
        assert name in msg, msg
        for w in words:
            assert w in msg, f"{fmt} case {i}: {w!r} not in {msg!r}"
        assert ".tmp-" not in msg, msg
        assert _stored(root) == before, f"{fmt} case {i} left {set(_stored(root)) - set(before)}"
        assert admin_req(aport, "GET", f"/v1/admin/datasets/{name}").status_code == 404


def test_names_and_formats_are_refused(ds):
    _, aport, root = ds
    before = _stored(root)
    body = b"a,label\n1,0\n"
    for raw in ("..", ".", "a/b", "a%2Fb", "a%00b", "%2E%2E", "a%20b", "n" * 256, ""):
        r = admin_req(aport, "POST", f"/v1/admin/datasets?name={raw}&format=csv", data=body)
        assert r.status_code == 400, f"{raw!r}: {r.status_code} {r.text}"
        assert "dataset name" in r.json()["error"], r.text
    r = admin_req(aport, "POST", "/v1/admin/datasets?name=a%00b&format=csv", data=body)
    assert "NUL" in r.json()["error"], r.text
    r = admin_req(aport, "POST", f"/v1/admin/datasets?name={'n' * 256}&format=csv", data=body)
    assert "256 bytes" in r.json()["error"], r.text
    assert _upload(aport, "n" * 255, "csv", data=body).status_code == 201
    assert admin_req(aport, "DELETE", f"/v1/admin/datasets/{'n' * 255}").status_code == 200
    for fmt in ("xls", "IDX", ""):
        r = _upload(aport, "okname", fmt, data=body)
        assert r.status_code == 400 and "format" in r.json()["error"] and "okname" in r.json()["error"], r.text
    r = admin_req(aport, "POST", "/v1/admin/datasets?name=okname", data=body)
    assert r.status_code == 400 and "format" in r.json()["error"], r.text
    for path in ("/v1/admin/datasets/..", "/v1/admin/datasets/a%2Fb", "/v1/admin/datasets/a%20b"):
        r = admin_req(aport, "GET", path)
        assert r.status_code in (400, 404), f"{path}: {r.status_code} {r.text}"
    assert admin_req(aport, "GET", "/v1/admin/datasets/x/y").status_code == 404
    r = admin_req(aport, "PUT", "/v1/admin/datasets/x")
    assert r.status_code == 405 and "GET" in r.headers.get("Allow", ""), r.text
    assert admin_req(aport, "DELETE", "/v1/admin/datasets").status_code == 405
    assert _stored(root) == before


def test_delete_and_list(ds):
    _, aport, root = ds
    csv = b"a,label\n1,0\n2,1\n"
    assert _upload(aport, "to-delete", "csv", data=csv).status_code == 201
    assert (root / "to-delete" / "data.csv").is_file()
    r = admin_req(aport, "DELETE", "/v1/admin/datasets/to-delete")
    assert r.status_code == 200, r.text
    assert not (root / "to-delete").exists()
    assert "to-delete" not in [d["dataset"] for d in admin_req(aport, "GET", "/v1/admin/datasets").json()["datasets"]]
    r = admin_req(aport, "GET", "/v1/admin/datasets/to-delete")
    assert r.status_code == 404 and "'to-delete'" in r.json()["error"]
    r = admin_req(aport, "DELETE", "/v1/admin/datasets/to-delete")
    assert r.status_code == 404 and "'to-delete'" in r.json()["error"]
    assert _upload(aport, "to-delete", "csv", data=csv).status_code == 201  # the name is free again


def test_every_dataset_route_needs_the_token(tmp_path):
    srv, aport, root = _server(tmp_path)  # its own server: failed logins start a back-off
    with srv:
        routes = [("GET", "/v1/admin/datasets", {}), ("GET", "/v1/admin/datasets/x", {}),
                  ("DELETE", "/v1/admin/datasets/x", {}),
                  ("POST", "/v1/admin/datasets?name=x&format=csv", {"data": b"a,label\n1,0\n"})]
        for method, path, kw in routes:
            r = admin_req(aport, method, path, token=None, **kw)
            assert r.status_code == 401, f"{method} {path}: {r.status_code} {r.text}"
        assert _stored(root) == []


def _post_raw(aport, head, body_parts, pause=0.0):
    """A hand-made request on a socket (chunked bodies, early replies); the reply's status and text."""
    s = socket.create_connection(("127.0.0.1", aport), timeout=30)
    try:
        s.sendall(head.encode())
        for p in body_parts:
            try:
                s.sendall(p)
            except (BrokenPipeError, ConnectionResetError):
                break  # the server answered early and closed: read the answer
            if pause:
                time.sleep(pause)
        out = b""
        while True:
            try:
                k = s.recv(65536)
            except ConnectionResetError:
                break
            if not k:
                break
            out += k
            if b"\r\n\r\n" in out:
                h, _, b = out.partition(b"\r\n\r\n")
                cl = [ln for ln in h.split(b"\r\n") if ln.lower().startswith(b"content-length:")]
                if cl and len(b) >= int(cl[0].split(b":")[1]):
                    break
    finally:
        s.close()
    status = int(out.split(b" ")[1]) if out.startswith(b"HTTP/") else 0
    return status, out.partition(b"\r\n\r\n")[2].decode(errors="replace")


def test_limits_leave_nothing_on_disk(tmp_path):
    srv, aport, root = _server(tmp_path, "--max_upload_bytes=100000", "--dataset_quota_bytes=150000")
    with srv:
        images = _read(TEST[0])  # 4.4 MB, over the limit
        auth = f"Authorization: Bearer {TOKEN}\r\n"
        # Content-Length over the limit: 413 before the body is read (the client waits for 100-continue)
        st, text = _post_raw(aport, "POST /v1/admin/datasets?name=big&format=idx HTTP/1.1\r\nHost: x\r\n" + auth +
                             f"Content-Length: {len(images)}\r\nExpect: 100-continue\r\n\r\n", [])
        assert st == 413 and "--max_upload_bytes" in text and "'big'" in text, text
        # the same with requests, which sends the body without waiting
        r = _upload(aport, "big", "idx", files=_idx_pair(images, _read(TEST[1])))
        assert r.status_code == 413 and "--max_upload_bytes" in r.json()["error"], r.text
        assert _stored(root) == []

        # a chunked body that grows past the limit
        def chunks():
            yield b"a,label\n"
            for _ in range(20000):
                yield b"1,0\n2,1\n"
        r = _upload(aport, "grow", "csv", data=chunks())
        assert r.status_code == 413 and "--max_upload_bytes" in r.json()["error"], r.text
        assert _stored(root) == []

        # a client gone mid-upload
        s = socket.create_connection(("127.0.0.1", aport))
        s.sendall((f"POST /v1/admin/datasets?name=gone&format=csv HTTP/1.1\r\nHost: x\r\n{auth}"
                   "Content-Length: 90000\r\n\r\na,label\n" + "1,0\n" * 1000).encode())
        for _ in range(200):
            if _stored(root):
                break
            time.sleep(0.01)
        assert [e for e in _stored(root) if e.startswith(".tmp-")], "the upload's temp dir never appeared"
        s.close()
        for _ in range(300):
            if not _stored(root):
                break
            time.sleep(0.01)
        assert _stored(root) == [], "a client gone mid-upload left files"

        # the quota: 150000 bytes in all
        body = b"a,label\n" + b"1,0\n" * 20000  # 80008 bytes
        assert _upload(aport, "q1", "csv", data=body).status_code == 201
        r = _upload(aport, "q2", "csv", data=body)
        assert r.status_code == 413 and "--dataset_quota_bytes" in r.json()["error"] and "'q2'" in r.json()["error"], r.text
        r = _upload(aport, "q3", "csv", files={"f": ("f.csv", body)})  # multipart: refused while it streams
        assert r.status_code == 413 and "--dataset_quota_bytes" in r.json()["error"], r.text
        assert _stored(root) == ["q1"]
        assert admin_req(aport, "DELETE", "/v1/admin/datasets/q1").status_code == 200
        assert _upload(aport, "q2", "csv", data=body).status_code == 201
        assert _stored(root) == ["q2"]


def test_nul_in_the_path_is_refused(ds):
    _, aport, root = ds
    assert _upload(aport, "nul-target", "csv", data=b"a,label\n1,0\n").status_code == 201
    for method in ("GET", "DELETE"):
        r = admin_req(aport, method, "/v1/admin/datasets/nul-target%00x")
        assert r.status_code == 400 and "NUL" in r.json()["error"], f"{method}: {r.status_code} {r.text}"
    assert (root / "nul-target").is_dir()
