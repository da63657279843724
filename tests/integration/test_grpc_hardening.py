"""The gRPC front door under hostile or unlucky clients (issue 10): unknown services and methods, protobuf that
does not parse, tensors whose bytes disagree with their shape, a 2^40-element shape, a message over
--grpc_max_receive_message_bytes, calls cancelled or timed out while queued in the batcher, 1,000 streams opened
and dropped, and SIGTERM with calls in flight.

Each test checks the status the client gets AND that the server keeps serving afterwards (a good Predict whose
output equals onnxruntime's).
"""
import os
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import grpc  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2  # noqa: E402
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc  # noqa: E402

import serving_util as u  # noqa: E402
from grpc_util import RPC_TIMEOUT, check_status, rpc_error  # noqa: E402,F401

PREDICT = "/tensorflow.serving.PredictionService/Predict"


def predict_req(model, feeds, version=None):
    req = predict_pb2.PredictRequest()
    req.model_spec.name = model
    if version is not None:
        req.model_spec.version.value = version
    for n, a in feeds.items():
        req.inputs[n].CopyFrom(a if isinstance(a, tensor_pb2.TensorProto) else tf.make_tensor_proto(a))
    return req


def raw_tensor(dtype, shape, content=b"", float_val=()):
    return tensor_pb2.TensorProto(dtype=dtype, tensor_content=content, float_val=list(float_val),
                                  tensor_shape=tensor_shape_pb2.TensorShapeProto(
                                      dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in shape]))


def raw_call(channel, method, payload, timeout=RPC_TIMEOUT):
    """Send payload bytes as the request of method (no client-side serialisation) -> (reply bytes, None) or
    (None, RpcError)."""
    fn = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    try:
        return fn(payload, timeout=timeout), None
    except grpc.RpcError as e:
        return None, e


def metrics(srv):
    r = srv.get("/monitoring/prometheus/metrics")
    assert r.status_code == 200, f"metrics: HTTP {r.status_code}"
    return r.text


def request_count(srv, status, model="m"):
    return sum(v for _, v in u.metric_samples(metrics(srv), "tensord_request_count", model=model, status=status))


@pytest.fixture(scope="module")
def mm():
    return u.mm_model(4, 4, seed=8)


@pytest.fixture(scope="module")
def slow():
    return u.slow_model()


@pytest.fixture(scope="module")
def srv(tmp_path_factory, mm, slow):
    tmp = tmp_path_factory.mktemp("grpc_hardening")
    u.write_version(tmp / "m", 1, mm)
    u.write_version(tmp / "slow", 1, slow)
    conf = u.write_text(tmp / "models.config", u.model_config_text(
        [{"name": "m", "base_path": str(tmp / "m")}, {"name": "slow", "base_path": str(tmp / "slow")}]))
    s = u.Server(tmp, config_file=conf, grpc=True)
    yield s
    u.server_fixture_finalize(s)


@pytest.fixture(scope="module")
def channel(srv):
    ch = srv.grpc_channel()
    yield ch
    ch.close()


@pytest.fixture(scope="module")
def stub(channel):
    return prediction_service_pb2_grpc.PredictionServiceStub(channel)


def assert_serving(srv, mm, seed=0, rows=2):
    """The server is alive and a good Predict on a fresh channel equals onnxruntime."""
    assert srv.alive(), f"tensord died\n{srv.describe()}"
    ch = srv.grpc_channel()
    try:
        x = u.randn((rows, 4), seed=seed)
        try:
            resp = prediction_service_pb2_grpc.PredictionServiceStub(ch).Predict(predict_req("m", {"x": x}),
                                                                              timeout=RPC_TIMEOUT)
        except grpc.RpcError as e:
            pytest.fail(f"good Predict after the test failed: {e.code().name}: {e.details()!r}\n{srv.describe()}")
        u.assert_close(tf.make_ndarray(resp.outputs["y"]), u.ort_run(mm, {"x": x})["y"], "good Predict")
    finally:
        ch.close()


# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("method", [
    "/no.such.Service/Method", "/tensorflow.serving.PredictionService/NoSuchMethod",
    "/tensorflow.serving.ModelService/Predict", "/inference.GRPCInferenceService/ModelStreamInfer",
    "/inference.GRPCInferenceService/NoSuchMethod", "/grpc.health.v1.Health/List", "/", "/x"])
def test_unknown_service_or_method_is_unimplemented(srv, channel, mm, method):
    _, e = raw_call(channel, method, predict_req("m", {"x": u.randn((1, 4))}).SerializeToString())
    assert e is not None, f"{method} answered OK"
    assert e.code() == grpc.StatusCode.UNIMPLEMENTED, f"{method}: {e.code().name} {e.details()!r}"
    assert_serving(srv, mm)


@pytest.mark.parametrize("cut", ["half", "last_byte", "garbage", "bad_varint"])
def test_unparseable_protobuf_is_invalid_argument(srv, channel, mm, cut):
    good = predict_req("m", {"x": u.randn((2, 4), seed=1)}).SerializeToString()
    reply, e = raw_call(channel, PREDICT, good)
    assert e is None and reply, "the uncut request must work"
    payload = {"half": good[:len(good) // 2], "last_byte": good[:-1],
               "garbage": b"\xff\xff\xff\xff\x0f\x00junk",
               "bad_varint": b"\x0a" + b"\xff" * 11}[cut]
    _, e = raw_call(channel, PREDICT, payload)
    assert e is not None, f"a {cut} PredictRequest answered OK"
    check_status(e, grpc.StatusCode.INVALID_ARGUMENT)
    assert_serving(srv, mm)


@pytest.mark.parametrize("nbytes", [28, 36, 1])
def test_tensor_content_length_disagrees_with_shape(srv, stub, mm, nbytes):
    tp = raw_tensor(types_pb2.DT_FLOAT, [2, 4], content=b"\x00" * nbytes)
    msg = check_status(rpc_error(stub.Predict, predict_req("m", {"x": tp})), grpc.StatusCode.INVALID_ARGUMENT, "'x'")
    assert ("32" in msg and str(nbytes) in msg) or ("8" in msg and str(nbytes // 4) in msg), \
        f"message should say expected (32 bytes / 8 elements) vs got ({nbytes} bytes): {msg!r}"
    assert_serving(srv, mm)


def test_float_val_count_disagrees_with_shape(srv, stub, mm):
    """More values than the shape holds is an error in TensorFlow too (fewer repeat the last one)."""
    tp = raw_tensor(types_pb2.DT_FLOAT, [2, 4], float_val=[1.0] * 9)
    check_status(rpc_error(stub.Predict, predict_req("m", {"x": tp})), grpc.StatusCode.INVALID_ARGUMENT, "'x'")
    assert_serving(srv, mm)


def test_huge_shape_is_refused_quickly_without_allocating(srv, stub, mm):
    rss0 = srv.rss_kib()
    t0 = time.monotonic()
    cases = [raw_tensor(types_pb2.DT_FLOAT, [1 << 20, 1 << 20], content=b"\x00" * 16),
             raw_tensor(types_pb2.DT_FLOAT, [1 << 38, 4], content=b"\x00" * 16),  # 2^40 elements, right inner dim
             raw_tensor(types_pb2.DT_FLOAT, [1 << 38, 4], float_val=[1.0, 2.0, 3.0, 4.0]),  # a fill would be 4 TiB
             raw_tensor(types_pb2.DT_FLOAT, [1 << 38, 4]),  # no values at all: TensorFlow fills zeros
             raw_tensor(types_pb2.DT_FLOAT, [1 << 32, 1 << 32, 16], content=b"\x00" * 16),  # overflows int64
             raw_tensor(types_pb2.DT_FLOAT, [-1, 4], content=b"\x00" * 16)]
    for tp in cases:
        dims = [d.size for d in tp.tensor_shape.dim]
        e = rpc_error(stub.Predict, predict_req("m", {"x": tp}))
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, f"shape {dims}: {e.code().name} {e.details()!r}"
        assert "'x'" in e.details(), f"shape {dims}: message does not name the input: {e.details()!r}"
    elapsed = time.monotonic() - t0
    grew = (srv.rss_kib() - rss0) / 1024
    assert elapsed < 10, f"refusing huge shapes took {elapsed:.1f} s"
    assert grew < 100, f"RSS grew by {grew:.0f} MiB while refusing 2^40-element shapes"
    assert_serving(srv, mm)


def test_default_limit_is_64_mib_not_grpc_4_mib(srv, mm):
    """An 8 MiB request is over gRPC's own 4 MiB default and under tensord's 64 MiB: it must work; 65 MiB is
    RESOURCE_EXHAUSTED."""
    ch = srv.grpc_channel([("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)])
    try:
        st = prediction_service_pb2_grpc.PredictionServiceStub(ch)
        x = u.randn(((8 << 20) // 16, 4), seed=3)
        try:
            resp = st.Predict(predict_req("m", {"x": x}), timeout=120)
        except grpc.RpcError as e:
            pytest.fail(f"8 MiB Predict: {e.code().name} {e.details()!r}")
        u.assert_close(tf.make_ndarray(resp.outputs["y"]), u.ort_run(mm, {"x": x})["y"], "8 MiB Predict")
        big = raw_tensor(types_pb2.DT_FLOAT, [(65 << 20) // 16, 4], content=b"\x00" * (65 << 20))
        e = rpc_error(st.Predict, predict_req("m", {"x": big}), timeout=120)
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, f"65 MiB: {e.code().name} {e.details()!r}"
    finally:
        ch.close()
    assert_serving(srv, mm)


def test_message_over_the_configured_limit(tmp_path, mm):
    u.write_version(tmp_path / "m", 1, mm)
    with u.Server(tmp_path, base_path=str(tmp_path / "m"), grpc=True,
                  extra=["--grpc_max_receive_message_bytes=1048576"]) as s:
        ch = s.grpc_channel([("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)])
        try:
            st = prediction_service_pb2_grpc.PredictionServiceStub(ch)
            x = u.randn(((2 << 20) // 16, 4), seed=4)  # 2 MiB of tensor_content
            e = rpc_error(st.Predict, predict_req("m", {"x": x}))
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, f"2 MiB over a 1 MiB limit: {e.code().name} {e.details()!r}"
            x = u.randn(((900 << 10) // 16, 4), seed=5)  # 900 KiB: under the limit
            try:
                resp = st.Predict(predict_req("m", {"x": x}), timeout=RPC_TIMEOUT)
            except grpc.RpcError as e:
                pytest.fail(f"900 KiB under a 1 MiB limit: {e.code().name} {e.details()!r}\n{s.describe()}")
            u.assert_close(tf.make_ndarray(resp.outputs["y"]), u.ort_run(mm, {"x": x})["y"], "900 KiB Predict")
        finally:
            ch.close()
        assert_serving(s, mm)


# ----------------------------------------------------------------------------------------------------------------
# calls that end while queued in the batcher

BATCH_TIMEOUT_S = 3.0
BATCHING = f"""max_batch_size {{ value: 64 }}
batch_timeout_micros {{ value: {int(BATCH_TIMEOUT_S * 1e6)} }}
max_enqueued_batches {{ value: 16 }}
num_batch_threads {{ value: 1 }}
"""


@pytest.fixture(scope="module")
def batching(tmp_path_factory, mm):
    tmp = tmp_path_factory.mktemp("grpc_batching")
    u.write_version(tmp / "m", 1, mm)
    bp = u.write_text(tmp / "batching.config", BATCHING)
    s = u.Server(tmp, base_path=str(tmp / "m"), grpc=True,
                 extra=["--enable_batching", f"--batching_parameters_file={bp}"])
    yield s
    u.server_fixture_finalize(s)


def full_batch_serves(s, mm, seed):
    """64 rows fill a batch, so it runs at once (no wait for the batch timeout); equals onnxruntime."""
    ch = s.grpc_channel()
    try:
        x = u.randn((64, 4), seed=seed)
        try:
            resp = prediction_service_pb2_grpc.PredictionServiceStub(ch).Predict(predict_req("m", {"x": x}), timeout=20)
        except grpc.RpcError as e:
            pytest.fail(f"full-batch Predict: {e.code().name} {e.details()!r}\n{s.describe()}")
        u.assert_close(tf.make_ndarray(resp.outputs["y"]), u.ort_run(mm, {"x": x})["y"], "full-batch Predict")
    finally:
        ch.close()


def wait_count(s, status, want, within):
    end = time.monotonic() + within
    got = request_count(s, status)
    while got < want and time.monotonic() < end:
        time.sleep(0.05)
        got = request_count(s, status)
    return got


def test_cancelled_while_queued_in_the_batcher(batching, mm):
    s = batching
    full_batch_serves(s, mm, 1)
    before = request_count(s, "CANCELLED")
    ch = s.grpc_channel()
    try:
        st = prediction_service_pb2_grpc.PredictionServiceStub(ch)
        fut = st.Predict.future(predict_req("m", {"x": u.randn((1, 4), seed=2)}), timeout=30)
        time.sleep(0.3)
        assert not fut.done(), "a lone 1-row request must wait for the batch timeout"
        t_cancel = time.monotonic()
        assert fut.cancel(), "the call could not be cancelled"
        got = wait_count(s, "CANCELLED", before + 1, 1.5)
        took = time.monotonic() - t_cancel
        assert got == before + 1, (f"tensord_request_count{{status=\"CANCELLED\"}} went {before} -> {got} within "
                                   f"{took:.2f} s of the cancel (the batch timeout is {BATCH_TIMEOUT_S} s)\n"
                                   f"{[l for l in metrics(s).splitlines() if 'tensord_request_count' in l]}")
    finally:
        ch.close()
    assert request_count(s, "OK") >= 1
    full_batch_serves(s, mm, 3)


def test_deadline_passes_while_queued_in_the_batcher(batching, mm):
    s = batching
    full_batch_serves(s, mm, 4)
    before = request_count(s, "DEADLINE_EXCEEDED")
    ch = s.grpc_channel()
    try:
        st = prediction_service_pb2_grpc.PredictionServiceStub(ch)
        t0 = time.monotonic()
        e = rpc_error(st.Predict, predict_req("m", {"x": u.randn((1, 4), seed=5)}), timeout=0.3)
        assert e.code() == grpc.StatusCode.DEADLINE_EXCEEDED, (e.code(), e.details())
        got = wait_count(s, "DEADLINE_EXCEEDED", before + 1, 1.5)
        took = time.monotonic() - t0
        assert got == before + 1, (f"tensord_request_count{{status=\"DEADLINE_EXCEEDED\"}} went {before} -> {got} "
                                   f"within {took:.2f} s of the call (deadline 0.3 s, batch timeout {BATCH_TIMEOUT_S} s)"
                                   f"\n{[l for l in metrics(s).splitlines() if 'tensord_request_count' in l]}")
    finally:
        ch.close()
    full_batch_serves(s, mm, 6)


OVERFLOW = """max_batch_size { value: 8 }
batch_timeout_micros { value: 5000 }
max_enqueued_batches { value: 4 }
num_batch_threads { value: 1 }
"""


def test_full_batching_queue_is_resource_exhausted(tmp_path, slow):
    """The queue holds max_enqueued_batches * max_batch_size = 32 rows; 24 concurrent 8-row Predicts on a slow
    model overflow it: some answer RESOURCE_EXHAUSTED, the others are correct, nothing else."""
    u.write_version(tmp_path / "slow", 1, slow)
    bp = u.write_text(tmp_path / "batching.config", OVERFLOW)
    with u.Server(tmp_path, base_path=str(tmp_path / "slow"), model_name="slow", grpc=True,
                  extra=["--enable_batching", f"--batching_parameters_file={bp}"]) as s:
        chans = [s.grpc_channel() for _ in range(4)]
        try:
            st = [prediction_service_pb2_grpc.PredictionServiceStub(c) for c in chans]
            st[0].Predict(predict_req("slow", {"x": u.randn((8, 512), seed=1)}), timeout=60)
            xs = [u.randn((8, 512), seed=200 + i) for i in range(24)]
            futs = [st[i % 4].Predict.future(predict_req("slow", {"x": x}), timeout=120) for i, x in enumerate(xs)]
            codes, bad = [], []
            for f, x in zip(futs, xs):
                try:
                    out = tf.make_ndarray(f.result().outputs["y"])
                except grpc.RpcError as e:
                    codes.append(e.code().name)
                    if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and not (e.details() or "").strip():
                        bad.append("RESOURCE_EXHAUSTED without a message")
                    continue
                codes.append("OK")
                if u.max_rel_err(out, u.ort_run(slow, {"x": x})["y"]) > u.TOL:
                    bad.append("wrong output")
            assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"}, f"codes {codes}\n{s.describe()}"
            assert "RESOURCE_EXHAUSTED" in codes, f"no RESOURCE_EXHAUSTED with 24 x 8 rows against a 32-row queue: {codes}"
            assert "OK" in codes and not bad, (codes, bad)
            st[0].Predict(predict_req("slow", {"x": u.randn((8, 512), seed=2)}), timeout=60)
        finally:
            for c in chans:
                c.close()


# ----------------------------------------------------------------------------------------------------------------
# 1,000 streams opened and dropped

def test_thousand_streams_opened_and_dropped(tmp_path, mm, slow):
    """Its own server: the test ends with SIGTERM and exit status 0, so dropped calls must not hold up the drain."""
    u.write_version(tmp_path / "m", 1, mm)
    u.write_version(tmp_path / "slow", 1, slow)
    conf = u.write_text(tmp_path / "models.config", u.model_config_text(
        [{"name": "m", "base_path": str(tmp_path / "m")}, {"name": "slow", "base_path": str(tmp_path / "slow")}]))
    with u.Server(tmp_path, config_file=conf, grpc=True) as s:
        thousand_streams(s, mm)


def thousand_streams(srv, mm):
    N, NCH = 1000, 20
    rss0, threads0 = srv.rss_kib(), srv.thread_count()
    channels = [srv.grpc_channel() for _ in range(NCH)]  # one connection each
    futs = []
    peak_threads = threads0
    xs = [u.randn((16, 512), seed=k) for k in range(7)]  # 16 rows: the 1,000 calls are many seconds of work
    try:
        for i in range(N):
            st = prediction_service_pb2_grpc.PredictionServiceStub(channels[i % NCH])
            futs.append(st.Predict.future(predict_req("slow", {"x": xs[i % len(xs)]}), timeout=120))
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:  # the server now holds up to N calls
            peak_threads = max(peak_threads, srv.thread_count())
            time.sleep(0.1)
        assert srv.alive(), f"tensord died with {N} streams open\n{srv.describe()}"
        for f in futs[::2]:
            f.cancel()
    finally:
        for ch in channels:  # the rest are dropped with their connections
            ch.close()
    done = [f for f in futs if f.done()]
    assert len(done) == N, f"{N - len(done)} futures not done after cancel/close"
    # the server drops the abandoned work and answers again
    end = time.monotonic() + 60
    last = None
    while time.monotonic() < end:
        peak_threads = max(peak_threads, srv.thread_count())
        ch = srv.grpc_channel()
        try:
            prediction_service_pb2_grpc.PredictionServiceStub(ch).Predict(
                predict_req("m", {"x": u.randn((1, 4))}), timeout=5)
            break
        except grpc.RpcError as e:
            last = f"{e.code().name}: {e.details()}"
        finally:
            ch.close()
    else:
        pytest.fail(f"no good Predict within 60 s of dropping {N} streams (last: {last})\n{srv.describe()}")
    grew = (srv.rss_kib() - rss0) / 1024
    # the dropped calls' work and threads go: no more than a few threads above the start within 30 s
    end = time.monotonic() + 30
    while srv.thread_count() > threads0 + 32 and time.monotonic() < end:
        time.sleep(0.2)
    settled = srv.thread_count()
    summary = (f"threads {threads0} before, peak {peak_threads} with {N} streams open, {settled} 30 s after the drop; "
               f"RSS +{grew:.0f} MiB; slow calls by status so far: "
               f"{ {st: request_count(srv, st, 'slow') for st in ('OK', 'CANCELLED', 'DEADLINE_EXCEEDED', 'UNAVAILABLE')} }")
    print(summary)
    assert grew < 300, f"RSS grew by {grew:.0f} MiB after {N} dropped streams ({summary})"
    assert peak_threads <= threads0 + 128, f"thread count not bounded: {summary}"
    assert settled <= threads0 + 32, f"the dropped calls still hold threads (their work was not abandoned): {summary}"
    assert_serving(srv, mm)


# ----------------------------------------------------------------------------------------------------------------
# SIGTERM while gRPC calls are in flight

def test_sigterm_drains_inflight_grpc_calls(tmp_path, slow):
    u.write_version(tmp_path / "slow", 1, slow)
    s = u.Server(tmp_path, base_path=str(tmp_path / "slow"), model_name="slow", grpc=True)
    channels = []
    try:
        channels = [s.grpc_channel() for _ in range(3)]
        stubs = [prediction_service_pb2_grpc.PredictionServiceStub(ch) for ch in channels]
        health = health_pb2_grpc.HealthStub(channels[0])
        assert health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status == \
            health_pb2.HealthCheckResponse.SERVING

        def call(i, rows, seed):
            x = u.randn((rows, 512), seed=seed)
            t0 = time.monotonic()
            try:
                out = tf.make_ndarray(stubs[i].Predict(predict_req("slow", {"x": x}), timeout=120).outputs["y"])
            except grpc.RpcError as e:
                out = e
            return x, out, t0, time.monotonic()

        call(0, 2, 0)
        _, out, t0, t1 = call(0, 4, 1)
        assert not isinstance(out, grpc.RpcError), out
        per_row = (t1 - t0) / 4
        rows = int(min(128, max(1, round(0.4 / max(per_row, 1e-4)))))
        results = [None] * 3
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, call(i, rows, 10 + i)), daemon=True)
                   for i in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.25)  # the three calls reach the server (one waits for an instance); a call that arrives after
        t_sig = time.monotonic()  # SIGTERM is refused UNAVAILABLE, which is right but not what this test checks
        s.signal()
        # while draining (once the server has logged that it drains): not SERVING (NOT_SERVING, or the call refused)
        end = time.monotonic() + 5
        while "tensord drain:" not in s.stderr() and time.monotonic() < end:
            time.sleep(0.01)
        assert "tensord drain:" in s.stderr(), f"no drain log line within 5 s of SIGTERM\n{s.describe()}"
        try:
            during = health_pb2.HealthCheckResponse.ServingStatus.Name(
                health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status)
        except grpc.RpcError as e:
            during = e.code().name
        for t in threads:
            t.join(timeout=120)
        assert all(r is not None for r in results), f"a call did not return\n{s.describe()}"
        for x, out, _, _ in results:
            assert not isinstance(out, grpc.RpcError), \
                f"in-flight call during SIGTERM drain: {out.code().name} {out.details()!r}\n{s.describe()}"
            u.assert_close(out, u.ort_run(slow, {"x": x})["y"], "drained call")
        assert any(t_done > t_sig for _, _, _, t_done in results), \
            f"no call was still running at SIGTERM (rows={rows}, {per_row * 1e3:.1f} ms/row): the test proved nothing"
        s.wait_exit(timeout=60)
        assert during in ("NOT_SERVING", "UNAVAILABLE"), \
            f"Health.Check('') while draining answered {during}, want NOT_SERVING (or the call refused)\n{s.describe()}"
    finally:
        for ch in channels:
            ch.close()
        s.kill()
