"""Numbers at their limits and empty batches against `tensord serve` (issue 9, items 5 and 7).

  f     x float32 [N, D] -> y = Concat(Log(x), 1 / x) [N, 2D]   (x = [-1, 0] gives NaN, -Inf, -1, +Inf)
  i64   x int64 [N, 2]   -> y = Identity(x)
  i32   x int32 [N, 2]   -> y = Identity(x)
  mm    x float32 [N, 4] -> y                                   (serving_util.mm_model)
  cnn   x float32 [N, 1, 28, 28] -> y [N, 10]                  (the seed CNN: its kernels cannot run zero rows)
  bad   x float32 [N, 4] -> Reshape(x, [3, -1])                 (fails inside the run for every batch size but 3)

Every reply, error or not, must be strict JSON (json.loads with NaN/Infinity tokens refused). Out-of-range
numbers are 400 naming the input and the value; int64 bounds are exact on both sides; non-finite outputs come
back as the strings "NaN", "Infinity", "-Infinity" and can be sent back as a request; empty batches in every
form are 400 naming the input (or 200 with zero rows), never 500; an engine failure names model and version.
"""
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import serving_util as u

I64_MAX = 2 ** 63 - 1
I64_MIN = -2 ** 63


def _typed_model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
                          initializer=[numpy_helper.from_array(np.asarray(a), n) for n, a in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", u.OPSET)], producer_name="tensord-tests")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def nonfinite_model():
    return _typed_model([helper.make_node("Log", ["x"], ["l"]), helper.make_node("Div", ["one", "x"], ["r"]),
                         helper.make_node("Concat", ["l", "r"], ["y"], axis=1)],
                        [("x", TensorProto.FLOAT, ["N", "D"])], [("y", TensorProto.FLOAT, ["N", "D2"])],
                        [("one", np.float32([1.0]))])


def identity_model(elem):
    return _typed_model([helper.make_node("Identity", ["x"], ["y"])], [("x", elem, ["N", 2])], [("y", elem, ["N", 2])])


def failing_model():
    return _typed_model([helper.make_node("Reshape", ["x", "shape"], ["y"])], [("x", TensorProto.FLOAT, ["N", 4])],
                        [("y", TensorProto.FLOAT, [3, "K"])], [("shape", np.int64([3, -1]))])


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hardening_json")
    models = {"f": nonfinite_model(), "i64": identity_model(TensorProto.INT64),
              "i32": identity_model(TensorProto.INT32), "mm": u.mm_model(4, 4), "cnn": u.cnn_model(),
              "bad": failing_model()}
    for name, m in models.items():
        u.write_version(tmp / "models" / name, 1, m)
    conf = u.write_text(tmp / "models.config", u.model_config_text(
        [{"name": n, "base_path": str(tmp / "models" / n)} for n in models]))
    s = u.Server(tmp, config_file=conf)
    yield s
    u.server_fixture_finalize(s)


def _no_constants(tok):
    raise ValueError(f"non-standard JSON token {tok!r}")


def strict(resp):
    """The body as strict JSON: bare NaN / Infinity / -Infinity tokens fail the test."""
    try:
        return json.loads(resp.content.decode("utf-8"), parse_constant=_no_constants)
    except ValueError as e:
        pytest.fail(f"HTTP {resp.status_code} reply is not strict JSON ({e}): {resp.content[:500]!r}")


def post(srv, path, body):
    r = srv.post(path, data=body if isinstance(body, (str, bytes)) else json.dumps(body),
                 headers={"Content-Type": "application/json"})
    strict(r)
    return r


def v2(name, shape, data, datatype="FP32", extra=None):
    inp = {"name": name, "shape": shape, "datatype": datatype, "data": data}
    if extra:
        inp.update(extra)
    return {"inputs": [inp]}


def still_serving(srv):
    assert srv.alive(), f"tensord died\n{srv.describe()}"
    r = post(srv, "/v1/models/i64:predict", {"instances": [[1, -2]]})
    assert r.status_code == 200 and r.json() == {"predictions": [[1, -2]]}, r.content


# ------------------------------------------------------------------------------------------------------------
# numbers out of range

BIG = "1" * 400

# (path, raw body): every way a float reaches the fast list reader or the cJSON path, in both APIs
FLOAT_OVERFLOW = [
    ("/v1/models/f:predict", '{"instances": [[1e400, 1]]}'),
    ("/v1/models/f:predict", '{"instances": [{"x": [1, -1e400]}]}'),
    ("/v1/models/f:predict", '{"inputs": {"x": [[1e400, 1]]}}'),
    ("/v1/models/f:predict", '{"instances": [[%s, 1]]}' % BIG),
    ("/v1/models/f:predict", '{"inputs": [[1, -%s]]}' % BIG),
    ("/v1/models/f:predict", '{"instances": [[1e39, 1]]}'),
    ("/v1/models/f:predict", '{"instances": [{"x": [1, -1e39]}]}'),
    ("/v1/models/f:regress", '{"examples": [{"x": [1e400, 1]}]}'),
    ("/v2/models/f/infer", '{"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1e400, 1]}]}'),
    ("/v2/models/f/infer", '{"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "parameters": {}, '
     '"data": [1, %s]}]}' % BIG),
    ("/v2/models/f/infer", '{"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1e39, 1]}]}'),
]


@pytest.mark.parametrize("path,body", FLOAT_OVERFLOW)
def test_float_overflow_is_400(srv, path, body):
    r = post(srv, path, body)
    msg = u.check_error(r, 400, "'x'", "out of range")
    if "1e39" in body:
        assert "float32" in msg, msg
    else:
        assert "1e400" in msg or "characters)" in msg, f"message does not quote the value: {msg!r}"
    still_serving(srv)


INT64_BAD = [
    ("9223372036854775808", "9223372036854775808"),
    ("-9223372036854775809", "-9223372036854775809"),
    ("1e19", "1e19"),
    (BIG, "400 characters"),
    ("-" + BIG, "401 characters"),
]


@pytest.mark.parametrize("value,quoted", INT64_BAD)
def test_int64_out_of_range_is_400(srv, value, quoted):
    bodies = [("/v1/models/i64:predict", '{"instances": [[1, %s]]}' % value),
              ("/v1/models/i64:predict", '{"instances": [{"x": [%s, 1]}]}' % value),
              ("/v1/models/i64:predict", '{"inputs": {"x": [[%s, 1]]}}' % value),
              ("/v2/models/i64/infer", '{"inputs": [{"name": "x", "shape": [1, 2], "datatype": "INT64", '
               '"data": [1, %s]}]}' % value),
              ("/v2/models/i64/infer", '{"inputs": [{"name": "x", "shape": [1, 2], "datatype": "INT64", '
               '"parameters": {}, "data": [%s, 1]}]}' % value)]
    for path, body in bodies:
        msg = u.check_error(post(srv, path, body), 400, "'x'", "out of range for int64", quoted)
        assert "9223372036854775807" in msg, f"the range is not given: {msg!r}"
    still_serving(srv)


def test_int64_exact_bounds_accepted(srv):
    rows = [[I64_MAX, I64_MIN], [I64_MAX - 1, I64_MIN + 1], [2 ** 53 + 1, -(2 ** 53 + 1)]]
    for fmt in ("instances", "named", "inputs"):
        body = {"instances": rows} if fmt == "instances" else \
            {"instances": [{"x": r} for r in rows]} if fmt == "named" else {"inputs": {"x": rows}}
        r = post(srv, "/v1/models/i64:predict", body)
        assert r.status_code == 200, f"{fmt}: {r.content[:300]!r}"
        got = strict(r)
        assert got == ({"outputs": rows} if fmt == "inputs" else {"predictions": rows}), f"{fmt}: {got}"
    for extra in (None, {"parameters": {}}):
        r = post(srv, "/v2/models/i64/infer", v2("x", [3, 2], sum(rows, []), "INT64", extra))
        assert r.status_code == 200, r.content[:300]
        assert strict(r)["outputs"][0]["data"] == sum(rows, []), r.content[:300]


def test_int32_exact_bounds(srv):
    r = post(srv, "/v1/models/i32:predict", {"instances": [[2 ** 31 - 1, -2 ** 31]]})
    assert r.status_code == 200 and strict(r) == {"predictions": [[2 ** 31 - 1, -2 ** 31]]}, r.content
    for v in (2 ** 31, -2 ** 31 - 1):
        u.check_error(post(srv, "/v1/models/i32:predict", {"instances": [[1, v]]}), 400, "'x'", "out of range for int32", str(v))
        u.check_error(post(srv, "/v2/models/i32/infer", v2("x", [1, 2], [v, 1], "INT32")), 400, "'x'", str(v))
    u.check_error(post(srv, "/v1/models/i32:predict", {"instances": [[1, 1.5]]}), 400, "'x'", "integer")
    still_serving(srv)


# ------------------------------------------------------------------------------------------------------------
# non-finite outputs

WANT_ROW = ["NaN", "-Infinity", -1, "Infinity"]  # Log(-1), Log(0), 1/-1, 1/0


def test_nonfinite_outputs_are_strings_v1(srv):
    r = post(srv, "/v1/models/f:predict", {"instances": [[-1, 0]]})
    assert r.status_code == 200, r.content
    assert strict(r) == {"predictions": [WANT_ROW]}, r.content
    r = post(srv, "/v1/models/f:predict", {"inputs": {"x": [[-1, 0], [1, 2]]}})
    assert r.status_code == 200, r.content
    out = strict(r)["outputs"]
    assert out[0] == WANT_ROW and out[1][0] == 0 and out[1][2] == 1, out


def test_nonfinite_outputs_are_strings_v2(srv):
    for extra in (None, {"parameters": {}}):
        r = post(srv, "/v2/models/f/infer", v2("x", [1, 2], [-1, 0], extra=extra))
        assert r.status_code == 200, r.content
        o = strict(r)["outputs"][0]
        assert o["shape"] == [1, 4] and o["data"] == WANT_ROW, o


def test_nonfinite_reply_is_a_valid_request(srv):
    """The reply's strings go back in as float inputs: Log / Div of NaN and +-Inf, in both APIs."""
    r = post(srv, "/v1/models/f:predict", {"instances": [[-1, 0]]})
    row = strict(r)["predictions"][0]
    r2 = post(srv, "/v1/models/f:predict", {"instances": [row]})
    assert r2.status_code == 200, r2.content
    got = strict(r2)["predictions"][0]
    assert got == ["NaN", "NaN", "NaN", "Infinity", "NaN", 0, -1, 0], got  # 1/-Inf is -0, read as 0
    r3 = post(srv, "/v2/models/f/infer", v2("x", [1, 4], row))
    assert r3.status_code == 200, r3.content
    assert strict(r3)["outputs"][0]["data"] == got, r3.content
    u.check_error(post(srv, "/v1/models/f:predict", {"instances": [["inf", 1]]}), 400, "'x'")


# ------------------------------------------------------------------------------------------------------------
# empty batches

EMPTY = [
    ("/v1/models/cnn:predict", {"instances": []}),
    ("/v1/models/cnn:predict", {"inputs": []}),
    ("/v1/models/cnn:predict", {"inputs": {"x": []}}),
    ("/v2/models/cnn/infer", v2("x", [0, 1, 28, 28], [])),
    ("/v2/models/cnn/infer", v2("x", [0, 1, 28, 28], [], extra={"parameters": {}})),
    ("/v1/models/mm:predict", {"inputs": {"x": []}}),
    ("/v2/models/mm/infer", v2("x", [0, 4], [])),
    ("/v1/models/mm:classify", {"examples": []}),
    ("/v1/models/mm:regress", {"examples": []}),
    # a zero in a non-batch dim
    ("/v1/models/f:predict", {"instances": [[]]}),
    ("/v1/models/f:predict", {"inputs": {"x": [[], []]}}),
    ("/v2/models/f/infer", v2("x", [2, 0], [])),
    ("/v2/models/cnn/infer", v2("x", [1, 0, 28, 28], [])),
]


@pytest.mark.parametrize("path,body", EMPTY)
def test_empty_batch_never_500(srv, path, body):
    r = post(srv, path, body)
    assert r.status_code in (200, 400), f"{path} {body}: HTTP {r.status_code} {r.content[:300]!r}"
    if r.status_code == 400:
        msg = u.check_error(r, 400, "'x'")
        assert any(w in msg.lower() for w in ("empty", "no elements", "shape")), msg
        assert "primitive" not in msg and "kernel" not in msg, f"internal detail as the message: {msg!r}"
    else:  # answered with zero rows
        got = strict(r)
        rows = got.get("predictions", got.get("outputs", got.get("results")))
        assert rows in ([], None) or (isinstance(rows, list) and all(o.get("shape", [0])[0] == 0 for o in rows)), got
    still_serving(srv)


def test_engine_failure_names_model_and_version(srv):
    r = post(srv, "/v1/models/bad:predict", {"instances": [[1, 2, 3, 4]]})
    assert r.status_code != 200, r.content
    msg = u.error_text(r)
    assert msg.startswith("model 'bad' version 1: inference failed: "), msg
    assert len(msg) > len("model 'bad' version 1: inference failed: "), msg
    r = post(srv, "/v2/models/bad/infer", v2("x", [1, 4], [1, 2, 3, 4]))
    assert u.error_text(r).startswith("model 'bad' version 1: inference failed: "), r.content
    still_serving(srv)
