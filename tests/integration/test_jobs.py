"""Training jobs over the admin API, end to end against the real binary (issue 12's Done-when), as an ML engineer
would run them: the seed CNN served as version 1, Debian's Fashion-MNIST uploaded as datasets (IDX pairs,
multipart), a 1-epoch fine-tuning job with on_complete canary 20 % followed over its Server-Sent Events until it
SUCCEEDS, version 2 taking 20 % of 2,000 predicts, then promote; the job's validation accuracy checked against an
independent `tensord predict` over the test set. Then the faults (kill -9 of the worker, SIGTERM and restart of the
server mid-job, cancel) and the bad submissions.
"""
import gzip
import json
import os
import signal
import subprocess
import threading
import time

import numpy as np
import pytest
import requests

import serving_util as u
from admin_util import TOKEN, admin_req, admin_server, wait_admin

FM = "/usr/share/datasets/fashion-mnist"


def _idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _upload_idx(aport, name, images, labels):
    with open(images, "rb") as fi, open(labels, "rb") as fl:
        r = requests.post(f"http://127.0.0.1:{aport}/v1/admin/datasets", params={"name": name, "format": "idx"},
                          files={"images": ("images.gz", fi), "labels": ("labels.gz", fl)},
                          headers={"Authorization": f"Bearer {TOKEN}"}, timeout=300)
    assert r.status_code == 201, r.text
    return r.json()


def _upload_npz(aport, tmp_path, name, x, y):
    p = str(tmp_path / f"{name}.npz")
    np.savez(p, x=x, label=y)
    with open(p, "rb") as f:
        r = requests.post(f"http://127.0.0.1:{aport}/v1/admin/datasets", params={"name": name, "format": "npz"},
                          data=f, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=300)
    assert r.status_code == 201, r.text
    return r.json()


def _events(aport, job_id, until=("SUCCEEDED", "FAILED", "CANCELLED"), timeout=600, on_event=None):
    """Follow the job's SSE stream: [(event, data)] until a state event in `until` (or the stream ends)."""
    out = []
    with requests.get(f"http://127.0.0.1:{aport}/v1/admin/jobs/{job_id}/events", stream=True, timeout=timeout,
                      headers={"Authorization": f"Bearer {TOKEN}"}) as r:
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream"), r.text
        ev, end = None, time.monotonic() + timeout
        for line in r.iter_lines(decode_unicode=True):
            if time.monotonic() > end:
                break
            if line.startswith("event: "):
                ev = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                out.append((ev, data))
                if on_event:
                    on_event(ev, data)
                if ev == "state" and data.get("state") in until:
                    break
    return out


def _job(aport, job_id):
    r = admin_req(aport, "GET", f"/v1/admin/jobs/{job_id}")
    assert r.status_code == 200, r.text
    return r.json()


def _wait_job(aport, job_id, pred, timeout=300):
    end, j = time.monotonic() + timeout, None
    while time.monotonic() < end:
        j = _job(aport, job_id)
        if pred(j):
            return j
        time.sleep(0.1)
    pytest.fail(f"job {job_id} never reached the expected state: {j}")


def _seed_cnn(base, version=1):
    out = f"{base}/{version}"
    p = subprocess.run([u.tensord_bin(), "init", "--arch", "cnn", "--seed", "1", "--out", out], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return out


JOB = {"epochs": 1, "batch_size": 64, "optimizer": "adam", "learning_rate": 0.001,
       "loss": "sparse_categorical_crossentropy"}


def test_fine_tune_and_roll_out_end_to_end(tmp_path):
    base = str(tmp_path / "fm")
    _seed_cnn(base)
    state = tmp_path / "state"
    state.mkdir()
    srv, aport = admin_server(tmp_path, base=base, extra=[f"--state_dir={state}"])
    with srv:
        failures, stop = [], threading.Event()
        x0 = (_idx(f"{FM}/t10k-images-idx3-ubyte.gz")[:1].astype(np.float32) / 255).reshape(1, 1, 28, 28)

        def load():  # predicts all along: none may fail
            s = requests.Session()
            while not stop.is_set():
                r = srv.post_json("/v1/models/m:predict", {"instances": x0.tolist()}, session=s)
                if r.status_code != 200:
                    failures.append((r.status_code, r.text))
                time.sleep(0.01)

        t = threading.Thread(target=load, daemon=True)
        t.start()
        try:
            train = _upload_idx(aport, "fm-train", f"{FM}/train-images-idx3-ubyte.gz", f"{FM}/train-labels-idx1-ubyte.gz")
            test = _upload_idx(aport, "fm-test", f"{FM}/t10k-images-idx3-ubyte.gz", f"{FM}/t10k-labels-idx1-ubyte.gz")
            assert train["records"] == 60000 and test["records"] == 10000
            r = admin_req(aport, "POST", "/v1/admin/jobs", json={
                "model": "m", "base_version": 1, "dataset": "fm-train", "val_dataset": "fm-test", **JOB,
                "on_complete": {"action": "canary", "traffic_percent": 20}})
            assert r.status_code == 201, r.text
            job = r.json()
            assert job["state"] == "QUEUED" and job["new_version"] == 2
            evs = _events(aport, job["id"])
            kinds = [e for e, _ in evs]
            assert "progress" in kinds and "epoch" in kinds, kinds[:20]
            steps = [d["global_step"] for e, d in evs if e == "progress"]
            assert steps == sorted(steps) and steps[-1] > steps[0], "progress does not count up"
            final = evs[-1][1]
            assert evs[-1][0] == "state" and final["state"] == "SUCCEEDED", evs[-3:]
            assert final["version"] == 2 and final["result"]["rollout"]["applied"], final
            assert os.path.isfile(f"{base}/2/metrics.json")
            assert final["result"]["metrics_json"] == f"{base}/2/metrics.json"
            assert os.path.isdir(final["result"]["tensorboard_dir"])
            val_acc = final["val_accuracy"]
            traffic = admin_req(aport, "GET", "/v1/admin/models/m/traffic").json()
            assert traffic["routes"] == {"stable": 80, "canary": 20}, traffic
            s = requests.Session()
            got = [int(srv.post_json("/v1/models/m:predict", {"instances": x0.tolist()}, session=s)
                       .headers["X-Model-Version"]) for _ in range(2000)]
            share = got.count(2) / len(got)
            assert abs(share - 0.20) <= 0.03, f"version 2 answered {share:.3f} of 2,000 predicts, want 0.20 +- 0.03"
            assert admin_req(aport, "POST", "/v1/admin/models/m:promote").status_code == 200
            assert {int(srv.post_json("/v1/models/m:predict", {"instances": x0.tolist()}, session=s)
                        .headers["X-Model-Version"]) for _ in range(200)} == {2}
        finally:
            stop.set()
            t.join(timeout=30)
        assert not failures, failures[:5]
    # the job's validation accuracy against an independent `tensord predict` over the test set
    xs = (_idx(f"{FM}/t10k-images-idx3-ubyte.gz").astype(np.float32) / 255).reshape(-1, 1, 28, 28)
    ys = _idx(f"{FM}/t10k-labels-idx1-ubyte.gz")
    np.save(tmp_path / "x.npy", xs)
    sig = json.load(open(f"{base}/2/signature.json"))
    in_name = next(iter(sig["signature_defs"]["serving_default"]["inputs"]))
    p = subprocess.run([u.tensord_bin(), "predict", "--model", f"{base}/2", "--input", f"{in_name}={tmp_path}/x.npy",
                        "--output-dir", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.stderr, sig)
    outs = [f for f in os.listdir(tmp_path / "out") if f.endswith(".npy")]
    probs = np.load(tmp_path / "out" / outs[0])
    acc = float((probs.argmax(axis=1) == ys).mean())
    assert abs(acc - val_acc) <= 0.005, f"the job reported val_accuracy {val_acc}, tensord predict measures {acc}"


def _small_job_server(tmp_path, n=6000):
    base = str(tmp_path / "fm")
    _seed_cnn(base)
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    srv, aport = admin_server(tmp_path, base=base, extra=[f"--state_dir={state}"])
    xs = _idx(f"{FM}/train-images-idx3-ubyte.gz")[:n].astype(np.float32) / 255
    ys = _idx(f"{FM}/train-labels-idx1-ubyte.gz")[:n].astype(np.int64)
    return base, state, srv, aport, xs, ys


def _versions_on_disk(base):
    return sorted(int(d) for d in os.listdir(base) if d.isdigit())


def test_kill_9_of_the_worker_fails_the_job_and_serving_goes_on(tmp_path):
    base, state, srv, aport, xs, ys = _small_job_server(tmp_path)
    with srv:
        _upload_npz(aport, tmp_path, "small", xs, ys)
        r = admin_req(aport, "POST", "/v1/admin/jobs", json={"model": "m", "dataset": "small", **JOB, "epochs": 50,
                                                             "batch_size": 32})
        assert r.status_code == 201, r.text
        jid = r.json()["id"]
        j = _wait_job(aport, jid, lambda j: j["state"] == "RUNNING" and (j.get("global_step") or 0) >= 5)
        os.kill(j["worker_pid"], signal.SIGKILL)
        j = _wait_job(aport, jid, lambda j: j["state"] in ("FAILED", "SUCCEEDED", "CANCELLED"))
        assert j["state"] == "FAILED" and "signal 9" in j["reason"], j
        assert _versions_on_disk(base) == [1], "a killed worker left a version behind"
        assert srv.post_json("/v1/models/m:predict", {"instances": [xs[0].reshape(1, 28, 28).tolist()]}).status_code == 200


def test_cancel_writes_no_version(tmp_path):
    base, state, srv, aport, xs, ys = _small_job_server(tmp_path)
    with srv:
        _upload_npz(aport, tmp_path, "small", xs, ys)
        jid = admin_req(aport, "POST", "/v1/admin/jobs", json={"model": "m", "dataset": "small", **JOB, "epochs": 50,
                                                               "batch_size": 32}).json()["id"]
        queued_job = admin_req(aport, "POST", "/v1/admin/jobs", json={"model": "m", "dataset": "small", **JOB}).json()
        queued = queued_job["id"]
        assert queued_job["new_version"] == 3, "two jobs of one model must get distinct version numbers"
        _wait_job(aport, jid, lambda j: j["state"] == "RUNNING" and (j.get("global_step") or 0) >= 3)
        r = admin_req(aport, "DELETE", "/v1/admin/datasets/small")  # a queued and a running job use it
        assert r.status_code == 409 and str(jid) in r.text, r.text
        r = admin_req(aport, "POST", f"/v1/admin/jobs/{queued}:cancel")  # still queued behind the first
        assert r.status_code == 200 and r.json()["state"] == "CANCELLED", r.text
        r = admin_req(aport, "POST", f"/v1/admin/jobs/{jid}:cancel")
        assert r.status_code == 202, r.text
        j = _wait_job(aport, jid, lambda j: j["state"] not in ("QUEUED", "RUNNING"))
        assert j["state"] == "CANCELLED", j
        assert _versions_on_disk(base) == [1], "a cancelled job wrote a version"
        assert not [d for d in os.listdir(base) if d.startswith(".train-")], "its checkpoints were left behind"
        assert admin_req(aport, "POST", f"/v1/admin/jobs/{jid}:cancel").status_code == 409
        assert admin_req(aport, "DELETE", "/v1/admin/datasets/small").status_code == 200  # no job uses it now


def test_server_restart_mid_job_resumes_from_its_checkpoint(tmp_path):
    base, state, srv, aport, xs, ys = _small_job_server(tmp_path)
    with srv:
        _upload_npz(aport, tmp_path, "small", xs, ys)
        r = admin_req(aport, "POST", "/v1/admin/jobs", json={"model": "m", "dataset": "small", **JOB, "epochs": 3,
                                                             "batch_size": 32, "checkpoint_every": 5,
                                                             "on_complete": {"action": "promote"}})
        jid = r.json()["id"]
        _wait_job(aport, jid, lambda j: j["state"] == "RUNNING" and (j.get("global_step") or 0) >= 15)
        srv.signal(signal.SIGTERM)
        assert srv.wait_exit() == 0
    aport2 = u.free_port()
    env = dict(os.environ, TENSORD_ADMIN_TOKEN=TOKEN)
    srv2 = u.Server(tmp_path, base_path=base, env=env, extra=[f"--admin_port={aport2}", f"--state_dir={state}"])
    with srv2:
        wait_admin(aport2)
        jobs = admin_req(aport2, "GET", "/v1/admin/jobs").json()["jobs"]
        assert [j["id"] for j in jobs] == [jid], jobs
        starts = []
        evs = _events(aport2, jid, timeout=300)
        assert evs[-1][1]["state"] == "SUCCEEDED", evs[-3:]
        starts = [d for e, d in evs if e == "start"]
        assert starts and starts[-1]["resumed_from_step"] > 0, f"the job did not resume from a checkpoint: {starts}"
        assert _versions_on_disk(base) == [1, 2]
        assert srv2.post_json("/v1/models/m/labels/stable:predict",
                              {"instances": [xs[0].reshape(1, 28, 28).tolist()]}).headers["X-Model-Version"] == "2"
    aport3 = u.free_port()
    srv3 = u.Server(tmp_path, base_path=base, env=env, extra=[f"--admin_port={aport3}", f"--state_dir={state}"])
    with srv3:  # a finished job is still listed after a restart, with its version and result
        wait_admin(aport3)
        jobs = admin_req(aport3, "GET", "/v1/admin/jobs").json()["jobs"]
        assert [(j["id"], j["state"], j["version"]) for j in jobs] == [(jid, "SUCCEEDED", 2)], jobs
        assert jobs[0]["result"]["rollout"]["applied"] is True


def test_bad_submissions_are_refused_up_front(tmp_path):
    base, state, srv, aport, xs, ys = _small_job_server(tmp_path, n=256)
    with srv:
        _upload_npz(aport, tmp_path, "small", xs, ys)
        _upload_npz(aport, tmp_path, "wide", np.zeros((64, 30, 30), np.float32), ys[:64])

        def post(body):
            return admin_req(aport, "POST", "/v1/admin/jobs", json=body)

        ok = {"model": "m", "dataset": "small", **JOB}
        cases = [
            ({**ok, "dataset": "wide"}, 400, ["wide", "900", "784"]),         # shape does not fit the model
            ({**ok, "model": "nope"}, 404, ["nope"]),
            ({**ok, "dataset": "missing"}, 404, ["missing"]),
            ({**ok, "dataset": "../etc"}, 400, ["dataset"]),
            ({**ok, "model": "a/b"}, 400, ["model"]),
            ({**ok, "epochs": 0}, 400, ["epochs"]),
            ({**ok, "optimizer": "lbfgs"}, 400, ["optimizer"]),
            ({**ok, "frobnicate": 1}, 400, ["frobnicate"]),
            ({**ok, "devices": ["cuda:0"]}, 400, ["cuda:0", "CUDA"]),
            ({**ok, "precision": "mixed_fp16"}, 400, ["mixed_fp16", "fp16"]),
            ({**ok, "precision": "bf17"}, 400, ["bf17"]),
            ({**ok, "loss_scale": "huge"}, 400, ["loss_scale"]),
            ({**ok, "cache_frozen": "yes"}, 400, ["cache_frozen"]),
            ({**ok, "recompute": 1}, 400, ["recompute"]),
            ({**ok, "loss_scale": -4}, 400, ["loss_scale"]),
            ({**ok, "loss_scale_growth_steps": 0.5}, 400, ["loss_scale_growth_steps"]),
            ({**ok, "bucket_mb": -1}, 400, ["bucket_mb"]),
            ({**ok, "bucket_mb": "25"}, 400, ["bucket_mb"]),
            ({**ok, "base_version": 7}, 404, ["7"]),
            ({**ok, "on_complete": {"action": "canary", "min_val_accuracy": 0.9}}, 400, ["validation"]),
            ({**ok, "on_complete": {"action": "launch"}}, 400, ["action"]),
        ]
        for body, status, words in cases:
            r = post(body)
            assert r.status_code == status, (body, r.status_code, r.text)
            for w in words:
                assert w in r.text, (body, r.text)
        r = admin_req(aport, "POST", "/v1/admin/jobs", data=b'{"model": "m\\u0000x"}',
                      headers={"Content-Type": "application/json"})
        assert r.status_code == 400, r.text
        assert admin_req(aport, "GET", "/v1/admin/jobs").json()["jobs"] == [], "a refused job was queued"
        for method, path in (("GET", "/v1/admin/jobs"), ("POST", "/v1/admin/jobs"), ("GET", "/v1/admin/jobs/1"),
                             ("GET", "/v1/admin/jobs/1/events"), ("POST", "/v1/admin/jobs/1:cancel")):
            r = admin_req(aport, method, path, token=None, json={})
            assert r.status_code == 401, (method, path, r.status_code)


def test_fine_tune_with_the_tensord_admin_command(tmp_path):
    """The README's `tensord admin` walk-through: upload (an IDX pair and an npz), train with a canary, follow the
    job's events to its end, list jobs and datasets."""
    base, state, srv, aport, xs, ys = _small_job_server(tmp_path, n=1024)
    tok = tmp_path / "token"
    tok.write_text(TOKEN + "\n")

    def run(*args):
        p = subprocess.run([u.tensord_bin(), "admin", f"--admin_url=http://127.0.0.1:{aport}",
                            f"--admin_token_file={tok}", *args], capture_output=True, text=True, timeout=300,
                           env={k: v for k, v in os.environ.items() if k != "TENSORD_ADMIN_TOKEN"})
        return p

    with srv:
        p = run("upload", "fm-test", "--images", f"{FM}/t10k-images-idx3-ubyte.gz",
                "--labels", f"{FM}/t10k-labels-idx1-ubyte.gz")
        assert p.returncode == 0 and json.loads(p.stdout)["records"] == 10000, p.stderr
        np.savez(tmp_path / "small.npz", x=xs, label=ys)
        p = run("upload", "small", str(tmp_path / "small.npz"), "--format", "npz")
        assert p.returncode == 0 and json.loads(p.stdout)["records"] == 1024, p.stderr
        p = run("upload", "bad", str(tmp_path / "small.npz"), "--format", "idx")
        assert p.returncode == 1 and "error:" in p.stderr, (p.returncode, p.stderr)
        p = run("train", "m", "small", "--val", "fm-test", "--epochs", "1", "--batch-size", "64", "--canary", "10")
        assert p.returncode == 0, p.stderr
        jid = json.loads(p.stdout)["id"]
        p = run("follow", str(jid))
        assert p.returncode == 0, p.stderr
        states = [json.loads(ln[6:])["state"] for ln in p.stdout.splitlines()
                  if ln.startswith("data: ") and '"state"' in ln and ln[6:].startswith('{"id"')]
        assert states and states[-1] == "SUCCEEDED", p.stdout[-2000:]
        assert "event: progress" in p.stdout
        jobs = json.loads(run("jobs").stdout)["jobs"]
        assert jobs[0]["id"] == jid and jobs[0]["version"] == 2
        assert json.loads(run("traffic", "m").stdout)["routes"] == {"stable": 90, "canary": 10}
        assert {d["dataset"] for d in json.loads(run("datasets").stdout)["datasets"]} == {"fm-test", "small"}
        p = run("cancel", str(jid))
        assert p.returncode == 1 and "already ended" in p.stderr, p.stderr
        assert run("delete-dataset", "small").returncode == 0


def test_quantize_job_rolls_out_an_int8_canary(tmp_path):
    """"kind": "quantize": `tensord quantize` as the worker, its int8 version gated and rolled out like a training
    job's."""
    base, state, srv, aport, xs, ys = _small_job_server(tmp_path, n=1024)
    with srv:
        _upload_npz(aport, tmp_path, "calib", xs[:512], ys[:512])
        _upload_npz(aport, tmp_path, "val", xs[512:], ys[512:])
        r = admin_req(aport, "POST", "/v1/admin/jobs", json={"kind": "quantize", "model": "m", "dataset": "calib",
                                                             "epochs": 1})
        assert r.status_code == 400 and "epochs" in r.text, r.text
        r = admin_req(aport, "POST", "/v1/admin/jobs", json={"kind": "quantize", "model": "m", "dataset": "calib",
                                                             "method": "kmeans"})
        assert r.status_code == 400 and "method" in r.text, r.text
        r = admin_req(aport, "POST", "/v1/admin/jobs", json={
            "kind": "quantize", "model": "m", "dataset": "calib", "val_dataset": "val", "method": "minmax",
            "on_complete": {"action": "canary", "traffic_percent": 30, "min_val_accuracy": 0.0}})
        assert r.status_code == 201, r.text
        job = r.json()
        evs = _events(aport, job["id"], timeout=300)
        final = evs[-1][1]
        assert final["state"] == "SUCCEEDED", final
        assert final["version"] == 2 and final["result"]["rollout"]["applied"], final
        metrics = json.load(open(f"{base}/2/metrics.json"))
        assert metrics["quantization"]["method"] == "minmax" and metrics["quantization"]["nodes_quantized"]
        assert final["result"]["val_accuracy"] == metrics["evaluation"]["int8"]["accuracy"]
        assert admin_req(aport, "GET", "/v1/admin/models/m/traffic").json()["routes"] == {"stable": 70, "canary": 30}
        x = xs[512:520].reshape(8, 1, 28, 28).tolist()
        r1 = srv.post_json("/v1/models/m/labels/stable:predict", {"instances": x})
        r2 = srv.post_json("/v1/models/m/labels/canary:predict", {"instances": x})
        assert r1.status_code == 200 and r2.status_code == 200, (r1.text, r2.text)
        assert r2.headers["X-Model-Version"] == "2"
        p1 = np.array(r1.json()["predictions"]).argmax(1)
        p2 = np.array(r2.json()["predictions"]).argmax(1)
        assert (p1 == p2).mean() >= 0.75, (p1, p2)  # the int8 version mostly agrees with fp32
