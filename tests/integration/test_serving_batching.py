"""Dynamic batching (--enable_batching with a TF Serving batching parameters file): concurrent requests are
merged, each gets its own rows back, the Prometheus batch-size histogram shows merged batches, and a full
queue answers 429 at once.
"""
import json
import threading
import time

import numpy as np
import pytest
import requests

import serving_util as u

N_OVERFLOW = 24
BATCHING = """max_batch_size { value: 8 }
batch_timeout_micros { value: 5000 }
max_enqueued_batches { value: 4 }
num_batch_threads { value: 1 }
allowed_batch_sizes: 4
allowed_batch_sizes: 8
"""


@pytest.fixture(scope="module")
def models():
    return {"m": u.mm_model(4, 4, seed=8), "slow": u.slow_model()}


@pytest.fixture(scope="module")
def srv(tmp_path_factory, models):
    tmp = tmp_path_factory.mktemp("batching")
    cfg = []
    for name, model in models.items():
        u.write_version(tmp / "models" / name, 1, model)
        cfg.append({"name": name, "base_path": str(tmp / "models" / name)})
    conf = u.write_text(tmp / "models.config", u.model_config_text(cfg))
    bp = u.write_text(tmp / "batching.config", BATCHING)
    s = u.Server(tmp, config_file=conf, extra=["--enable_batching", f"--batching_parameters_file={bp}",
                                               "--rest_api_num_threads=32"])
    yield s
    u.server_fixture_finalize(s)


def run_threads(n, fn):
    out = [None] * n
    ths = [threading.Thread(target=lambda i=i: out.__setitem__(i, fn(i)), daemon=True) for i in range(n)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(timeout=120)
    assert all(not t.is_alive() for t in ths), "client threads hung"
    return out


def histogram(text, name, **labels):
    """{le: cumulative count} and _count of a Prometheus histogram."""
    buckets = {lb["le"]: v for lb, v in u.metric_samples(text, name + "_bucket", **labels)}
    count = sum(v for _, v in u.metric_samples(text, name + "_count", **labels))
    return buckets, count


def test_concurrent_requests_correct(srv, models):
    """16 threads x 8 single-row (and a few multi-row) requests: every reply holds exactly its own rows."""
    def worker(i):
        sess = requests.Session()
        bad = []
        for k in range(8):
            rows = 1 if k < 6 else 1 + (i + k) % 3
            x = u.randn((rows, 4), seed=1000 * i + k)
            want = u.ort_run(models["m"], {"x": x})["y"]
            api = k % 2
            if api == 0:
                r = srv.post_json("/v1/models/m:predict", {"instances": x.tolist()}, session=sess)
                got = r.json().get("predictions") if r.status_code == 200 else None
            else:
                r = srv.post_json("/v2/models/m/infer", {"inputs": [{"name": "x", "shape": [rows, 4], "datatype": "FP32",
                                                                     "data": x.reshape(-1).tolist()}]}, session=sess)
                got = np.array(r.json()["outputs"][0]["data"]).reshape(rows, 4) if r.status_code == 200 else None
            if got is None:
                bad.append(f"HTTP {r.status_code} {r.content[:200]!r}")
                continue
            got = np.asarray(got, dtype=np.float64)
            if got.shape != want.shape or u.max_rel_err(got, want) > u.TOL:
                bad.append(f"thread {i} request {k}: got {got.tolist()} want {want.tolist()}")
        return bad

    bad = [b for bs in run_threads(16, worker) for b in bs]
    assert not bad, f"{len(bad)} wrong replies under batching, e.g. {bad[:3]}\n{srv.describe()}"

    r = srv.get("/monitoring/prometheus/metrics")
    assert r.status_code == 200
    buckets, count = histogram(r.text, "tensord_batch_size", model="m", version="1")
    assert count > 0, f"no tensord_batch_size histogram for m/1:\n{r.text[:3000]}"
    le1 = buckets.get("1", buckets.get("1.0"))
    assert le1 is not None, f"tensord_batch_size has no le=\"1\" bucket: {buckets}"
    assert count - le1 > 0, f"no executed batch had more than one row (count {count}, <=1: {le1}): batching is not merging"
    pbuckets, pcount = histogram(r.text, "tensord_padded_batch_size", model="m", version="1")
    assert pcount == count, f"padded batch histogram count {pcount} != batch histogram count {count}"
    # padding goes to an allowed size (4 or 8): nothing padded may land strictly between 1 and 4... every padded
    # batch is 4 or 8 rows, so the le=2 bucket (if present) must be empty
    for le in ("1", "2", "3"):
        if le in pbuckets:
            assert pbuckets[le] == 0, f"padded batches of <= {le} rows with allowed_batch_sizes 4, 8: {pbuckets}"
    assert u.metric_samples(r.text, "tensord_queue_latency_us_count", model="m", version="1"), "no queue latency histogram"


def test_queue_overflow_429(srv, models):
    """The queue holds max_enqueued_batches * max_batch_size = 32 rows. 24 concurrent keep-alive clients each send
    8 rows to a slow model (one batch thread) at once: the queue overflows, so some answer 429 with a JSON error at
    once; the others are correct."""
    slow = models["slow"]
    x0 = u.randn((8, 512), seed=1)
    t0 = time.monotonic()
    r = srv.post_json("/v1/models/slow:predict", {"instances": x0.tolist()}, timeout=60)
    one = time.monotonic() - t0
    assert r.status_code == 200, f"HTTP {r.status_code} {r.content[:300]!r}"
    xs = [u.randn((8, 512), seed=200 + i) for i in range(N_OVERFLOW)]
    bodies = [json.dumps({"instances": x.tolist()}) for x in xs]
    barrier = threading.Barrier(N_OVERFLOW)

    def worker(i):
        # a keep-alive client: its connection is opened (and accepted by some HTTP thread) before the burst, so
        # the burst does not depend on how the server spreads a burst of new connections over its threads
        sess = requests.Session()
        sess.get(srv.url("/v1/models/slow"), timeout=30)
        time.sleep(0.01 * i)
        barrier.wait(timeout=60)
        t = time.monotonic()
        r = sess.post(srv.url("/v1/models/slow:predict"), data=bodies[i], timeout=120)
        return r, time.monotonic() - t

    res = run_threads(N_OVERFLOW, worker)
    codes = [r.status_code for r, _ in res]
    n429 = codes.count(429)
    assert set(codes) <= {200, 429}, f"status codes {codes}\n{srv.describe()}"
    assert n429 > 0, (f"no 429 with {N_OVERFLOW} x 8 rows queued against a 32-row queue (one 8-row batch takes {one * 1e3:.0f} ms); "
                      f"codes {codes}")
    for (r, dt), x in zip(res, xs):
        if r.status_code == 429:
            u.error_text(r)
            assert dt < max(2.0, one), f"429 came after {dt:.2f} s: a full queue must refuse at once"
        else:
            u.assert_close(r.json()["predictions"], u.ort_run(slow, {"x": x})["y"], "slow model under batching")
    print(f"codes: {codes.count(200)} x 200, {n429} x 429; one 8-row batch {one * 1e3:.0f} ms")
    # and the server still answers
    r = srv.post_json("/v1/models/m:predict", {"instances": [[1, 2, 3, 4]]})
    assert r.status_code == 200
