"""Execution instances per version (Triton's instance_group count): --instances_per_version, and a model config's
`instance_count` (a tensord extension) that overrides it. Unbatched requests to one version run at once on as many
instances as it has; with one they run one at a time. Also: the default (usable cores / intra-op threads), bad
values refused at start, the instance gauges, outputs equal to onnxruntime under concurrency, and a request that
waits for a busy instance past its deadline (504).

How overlap is shown without a speed bar: two slow requests are sent at once; the server's Triton statistics give
the engine time of both runs (compute_infer, summed) and the time they waited for an instance (queue). Both runs
lie inside the client's window [first send, last reply], so when their summed engine time exceeds that window by
X, they overlapped by at least X. With two instances that lower bound must be a substantial part of a run, and
neither waited; with one it must be about zero, and the second waited about one run.
"""
import json
import os
import subprocess
import threading
import time

import numpy as np
import pytest

import serving_util as u

TARGET_S = 0.7  # one slow request's run time, calibrated


def metrics(s):
    r = s.get("/metrics")
    assert r.status_code == 200
    return r.text


def calibrate_rows(s, model, target):
    x = {"instances": u.randn((8, 512), seed=1).tolist()}
    assert s.post_json(f"/v1/models/{model}:predict", x).status_code == 200
    t0 = time.monotonic()
    assert s.post_json(f"/v1/models/{model}:predict", x).status_code == 200
    per_row = (time.monotonic() - t0) / 8
    return int(min(512, max(1, round(target / max(per_row, 1e-4)))))


def pair(s, model, body):
    """Send two copies of body to model at once. -> (window s, summed engine s, summed queue s, replies)."""
    window, infer, queue, res = u.timed_pair(s, model,
                                             lambda i: s.post_json(f"/v1/models/{model}:predict", body, timeout=120))
    for r in res:
        assert r.status_code == 200, r.text[:300]
    return window, infer, queue, res


@pytest.fixture(scope="module")
def slow():
    return u.slow_model()


@pytest.fixture(scope="module")
def mm():
    return u.mm_model(64, 32, seed=11)


@pytest.fixture(scope="module")
def srv(tmp_path_factory, slow, mm):
    """--instances_per_version=2 with one thread per run; 'two' takes the flag, 'one' sets instance_count: 1,
    'mm' sets instance_count: 3 and has a warm-up file."""
    tmp = tmp_path_factory.mktemp("instances")
    for name in ("two", "one"):
        u.write_version(tmp / name, 1, slow)
    warm = json.dumps({"instances": u.randn((2, 64), seed=2).tolist()}) + "\n"
    u.write_version(tmp / "mm", 1, mm, files={"assets.extra/warmup.jsonl": warm})
    conf = u.write_text(tmp / "models.config", u.instance_config_text([
        {"name": "two", "base_path": str(tmp / "two")},
        {"name": "one", "base_path": str(tmp / "one"), "instance_count": 1},
        {"name": "mm", "base_path": str(tmp / "mm"), "instance_count": 3}]))
    s = u.Server(tmp, config_file=conf, threads=1, extra=["--instances_per_version=2", "--rest_api_num_threads=8"])
    s.rows = calibrate_rows(s, "two", TARGET_S)
    yield s
    u.server_fixture_finalize(s)


def test_two_instances_run_two_slow_requests_at_once(srv, slow):
    x = u.randn((srv.rows, 512), seed=3)
    body = {"instances": x.tolist()}
    pair(srv, "two", body)  # compiles this shape's plan on both instances
    tries = []
    for _ in range(2):
        window, infer, queue, res = pair(srv, "two", body)
        overlap = infer - window  # lower bound of the time both runs were in progress
        tries.append(dict(window=round(window, 3), infer=round(infer, 3), queue=round(queue, 3),
                          overlap_at_least=round(overlap, 3)))
        if overlap >= 0.25 * infer and queue <= 0.15 * infer:
            break
    else:
        pytest.fail(f"two slow requests to a version with 2 instances did not overlap ({srv.rows} rows each): "
                    f"{tries}\n{srv.describe()}")
    want = u.ort_run(slow, {"x": x})["y"]
    for r in res:
        u.assert_close(np.array(r.json()["predictions"]), want, "slow model on 2 instances")


def test_one_instance_runs_them_one_after_the_other(srv):
    body = {"instances": u.randn((srv.rows, 512), seed=4).tolist()}
    pair(srv, "one", body)
    tries = []
    for _ in range(2):
        window, infer, queue, _ = pair(srv, "one", body)
        overlap = infer - window
        tries.append(dict(window=round(window, 3), infer=round(infer, 3), queue=round(queue, 3),
                          overlap_at_least=round(overlap, 3)))
        # serialised: the window holds both runs back to back, and the second waited about one run
        if overlap <= 0.1 * infer and queue >= 0.3 * infer:
            break
    else:
        pytest.fail(f"with instance_count: 1 the two requests did not run one after the other: {tries}\n"
                    f"{srv.describe()}")


def test_instance_gauges_and_the_model_setting_overrides_the_flag(srv):
    text = metrics(srv)
    count = {lb["model"]: v for lb, v in u.metric_samples(text, "tensord_model_instances")}
    assert count == {"two": 2, "one": 1, "mm": 3}, count
    weights = {lb["model"]: v for lb, v in u.metric_samples(text, "tensord_model_weights_bytes")}
    for model, n in (("two", 2), ("one", 1), ("mm", 3)):
        got = {lb["instance"]: v for lb, v in u.metric_samples(text, "tensord_model_instance_bytes", model=model)}
        assert sorted(got) == [str(i) for i in range(n)], (model, got)
        for inst, b in got.items():
            # weights plus the arena of a plan it ran: every instance here has run (warm-up on each for mm,
            # the concurrent pairs for two)
            assert weights[model] < b < weights[model] + (1 << 30), (model, inst, b, weights[model])
    assert "3 execution instances" in srv.stderr() and "2 execution instances" in srv.stderr()


def test_outputs_equal_onnxruntime_under_concurrency(srv, mm):
    errs = []

    def worker(k):
        try:
            for i in range(10):
                x = u.randn((1 + (i + k) % 4, 64), seed=100 * k + i)
                r = srv.post_json("/v1/models/mm:predict", {"instances": x.tolist()})
                assert r.status_code == 200, r.text
                u.assert_close(np.array(r.json()["predictions"]), u.ort_run(mm, {"x": x})["y"], f"worker {k} req {i}")
        except BaseException as e:  # noqa: BLE001 - reported below
            errs.append(repr(e))

    ths = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(6)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(timeout=120)
    assert all(not t.is_alive() for t in ths), "client threads hung"
    assert not errs, errs[:3]


def test_waiting_for_a_busy_instance_respects_the_deadline(tmp_path, srv, slow):
    u.write_version(tmp_path / "one", 1, slow)
    conf = u.write_text(tmp_path / "models.config", u.instance_config_text(
        [{"name": "one", "base_path": str(tmp_path / "one"), "instance_count": 1}]))
    rows = min(512, int(srv.rows * 1.5))  # about 1 s
    with u.Server(tmp_path, config_file=conf, threads=1, extra=["--rest_api_timeout_in_ms=250"]) as s:
        body = {"instances": u.randn((rows, 512), seed=5).tolist()}
        res = {}

        def first():
            t0 = time.monotonic()
            r = s.post_json("/v1/models/one:predict", body, timeout=60)
            res["first"] = (time.monotonic() - t0, r)

        t = threading.Thread(target=first, daemon=True)
        t.start()
        time.sleep(0.05)
        t0 = time.monotonic()
        r2 = s.post_json("/v1/models/one:predict", {"instances": u.randn((1, 512)).tolist()}, timeout=60)
        second_s = time.monotonic() - t0
        t.join(timeout=60)
        first_s, r1 = res["first"]
        assert r1.status_code == 200, r1.text[:300]  # started before its deadline: runs to the end
        msg = u.check_error(r2, 504, "deadline", "execution instance")
        assert second_s < first_s, (f"the waiting request was answered after {second_s:.2f} s, not at its deadline "
                                    f"while the first still ran ({first_s:.2f} s): {msg}")


def test_default_is_cores_over_intra_op_threads(tmp_path, mm):
    u.write_version(tmp_path / "m", 1, mm)
    cores = len(os.sched_getaffinity(0))
    for threads, want in ((1, min(64, cores)), (0, 1)):
        with u.Server(tmp_path, base_path=str(tmp_path / "m"), threads=threads) as s:
            got = u.metric_samples(metrics(s), "tensord_model_instances", model="m")
            assert [v for _, v in got] == [want], (threads, cores, got)


def _refused(tmp_path, args, *must):
    cmd = [u.tensord_bin(), "serve", "--rest_api_port=0", "--port=0"] + args
    try:
        p = subprocess.run(cmd, capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"tensord started with {args} instead of refusing it")
    text = (p.stdout + p.stderr).decode("utf-8", "replace")
    assert p.returncode in (1, 2), (args, p.returncode, text)
    for m in must:
        assert m in text, (args, m, text)


def test_bad_counts_are_refused_at_start(tmp_path, mm):
    u.write_version(tmp_path / "m", 1, mm)
    base = [f"--model_base_path={tmp_path / 'm'}", "--model_name=m"]
    for bad in ("0", "65", "two", "-1"):
        _refused(tmp_path, base + [f"--instances_per_version={bad}"], "--instances_per_version")
    for i, bad in enumerate(("0", "65", "'x'")):
        conf = u.write_text(tmp_path / f"bad{i}.config", u.instance_config_text(
            [{"name": f"bad{i}", "base_path": str(tmp_path / "m"), "instance_count": bad}]))
        _refused(tmp_path, [f"--model_config_file={conf}"], f"model 'bad{i}'", "instance_count", "1..64")
    conf = u.write_text(tmp_path / "bad.json", json.dumps(
        {"model_config_list": {"config": [{"name": "js", "base_path": str(tmp_path / "m"), "instance_count": 100}]}}))
    _refused(tmp_path, [f"--model_config_file={conf}"], "model 'js'", "instance_count")
