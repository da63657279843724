"""Models quantized by onnxruntime's own tool run in `tensord predict` and agree with onnxruntime.

  test_quantized_model      a small float MLP and CNN built here with onnx.helper, quantized with
                            onnxruntime.quantization: quantize_dynamic (int8 and uint8 weights: DynamicQuantizeLinear,
                            MatMulInteger, ConvInteger), quantize_static in QDQ format (QuantizeLinear/DequantizeLinear,
                            per tensor and per channel), and quantize_static in QOperator format on models whose
                            QOperator form uses only default-domain ops (QLinearMatMul, QLinearConv).
  test_qoperator_contrib_ops quantize_static QOperator on models with bias / residual Adds and a Mul: onnxruntime
                            writes com.microsoft's QLinearAdd and QLinearMul, which run and agree with onnxruntime;
                            another com.microsoft op ends in a clean error naming it.

Tolerance: one quantization step of the output. Both runtimes do the same integer arithmetic, but the float ops
between a DequantizeLinear and the next QuantizeLinear (oneDNN vs MLAS summation order) can put a value that lies
within an ulp of a rounding tie on the other side of it; that moves the quantized value by one step, and the
output by at most one step of its own scale where nothing downstream amplifies it. The step is the scale of the
DequantizeLinear that produces the output when there is one (QDQ/QOperator), else the output's range / 255 (the
8-bit resolution of the dynamic models' last activation quantization). On these models the outputs are in fact
bit-identical today; the bound is what the arithmetic guarantees, not what this machine happens to show.
"""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import assert_clean_error, assert_no_crash, ort_run

ort_quant = pytest.importorskip("onnxruntime.quantization")
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType  # noqa: E402

F = TensorProto.FLOAT


def randn(shape, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def make(nodes, inputs, outputs, inits):
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, F, s) for n, s in outputs],
        initializer=[numpy_helper.from_array(a, n) for n, a in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="tensord-tests")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def mlp(bias=True):
    """16 -> 32 -> 24 -> 5: MatMul(+Add)+Relu, MatMul(+Add)+Relu, MatMul(+Add)."""
    nodes, inits, h = [], [], "x"
    sizes = [16, 32, 24, 5]
    for i in range(3):
        nodes.append(helper.make_node("MatMul", [h, f"W{i}"], [f"m{i}"]))
        inits.append((f"W{i}", randn((sizes[i], sizes[i + 1]), 1 + i, 0.3)))
        h = f"m{i}"
        if bias:
            nodes.append(helper.make_node("Add", [h, f"B{i}"], [f"a{i}"]))
            inits.append((f"B{i}", randn((sizes[i + 1],), 11 + i, 0.1)))
            h = f"a{i}"
        if i < 2:
            nodes.append(helper.make_node("Relu", [h], [f"r{i}"]))
            h = f"r{i}"
    nodes[-1].output[0] = "y"
    return make(nodes, [("x", ["N", 16])], [("y", ["N", 5])], inits), (4, 16)


def cnn(bias=True):
    """(2, 8, 8) -> Conv 6x3x3 pad 1 + Relu -> MaxPool 2 -> Conv 8x3x3 + Relu -> Flatten -> MatMul(+Add) 4."""
    nodes = [helper.make_node("Conv", ["x", "Wc0", "Bc0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("MaxPool", ["r0"], ["p0"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p0", "Wc1", "Bc1"], ["c1"]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Flatten", ["r1"], ["f"]),
             helper.make_node("MatMul", ["f", "Wf"], ["y" if not bias else "h"])]
    inits = [("Wc0", randn((6, 2, 3, 3), 21, 0.3)), ("Bc0", randn((6,), 22, 0.1)),
             ("Wc1", randn((8, 6, 3, 3), 23, 0.2)), ("Bc1", randn((8,), 24, 0.1)), ("Wf", randn((32, 4), 25, 0.2))]
    if bias:
        nodes.append(helper.make_node("Add", ["h", "Bf"], ["y"]))
        inits.append(("Bf", randn((4,), 26, 0.1)))
    return make(nodes, [("x", ["N", 2, 8, 8])], [("y", ["N", 4])], inits), (3, 2, 8, 8)


class Calib(CalibrationDataReader):
    """Eight random batches: the calibration set quantize_static takes activation ranges from."""

    def __init__(self, shape):
        self.it = iter([{"x": randn(shape, 100 + i)} for i in range(8)])

    def get_next(self):
        return next(self.it, None)


def quantize(tmp_path, model, shape, how):
    src, dst = tmp_path / "float.onnx", tmp_path / f"{how}.onnx"
    onnx.save(model, src)
    if how.startswith("dynamic"):
        wt = QuantType.QInt8 if how == "dynamic-int8" else QuantType.QUInt8
        ort_quant.quantize_dynamic(str(src), str(dst), weight_type=wt)
    else:
        fmt, pc = how.split("-")[1], how.endswith("per-channel")
        ort_quant.quantize_static(str(src), str(dst), Calib(shape),
                                  quant_format=QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator,
                                  per_channel=pc, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return onnx.load(str(dst))


def output_step(model, want):
    """One quantization step of output y (see the module docstring)."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "DequantizeLinear" and n.output[0] == "y":
            return float(np.max(inits[n.input[1]]))
    lo, hi = min(0.0, float(want.min())), max(0.0, float(want.max()))
    return (hi - lo) / 255.0


# (model, quantization, quant ops the quantized model must contain)
CASES = [
    ("mlp", "dynamic-int8", {"DynamicQuantizeLinear", "MatMulInteger"}),
    ("mlp", "dynamic-uint8", {"DynamicQuantizeLinear", "MatMulInteger"}),
    ("mlp", "static-qdq-per-tensor", {"QuantizeLinear", "DequantizeLinear"}),
    ("mlp", "static-qdq-per-channel", {"QuantizeLinear", "DequantizeLinear"}),
    ("mlp-nobias", "static-qop-per-tensor", {"QuantizeLinear", "QLinearMatMul", "DequantizeLinear"}),
    ("mlp-nobias", "static-qop-per-channel", {"QuantizeLinear", "QLinearMatMul", "DequantizeLinear"}),
    ("cnn", "dynamic-int8", {"DynamicQuantizeLinear", "ConvInteger", "MatMulInteger"}),
    ("cnn", "dynamic-uint8", {"DynamicQuantizeLinear", "ConvInteger", "MatMulInteger"}),
    ("cnn", "static-qdq-per-tensor", {"QuantizeLinear", "DequantizeLinear"}),
    ("cnn", "static-qdq-per-channel", {"QuantizeLinear", "DequantizeLinear"}),
    ("cnn-nobias", "static-qop-per-tensor", {"QLinearConv", "QLinearMatMul"}),
    ("cnn-nobias", "static-qop-per-channel", {"QLinearConv", "QLinearMatMul"}),
]
BUILDERS = {"mlp": lambda: mlp(True), "mlp-nobias": lambda: mlp(False), "cnn": lambda: cnn(True),
            "cnn-nobias": lambda: cnn(False)}


@pytest.mark.parametrize("arch,how,ops", CASES, ids=[f"{a}-{h}" for a, h, _ in CASES])
def test_quantized_model(tensord, tmp_path, arch, how, ops):
    model, shape = BUILDERS[arch]()
    q = quantize(tmp_path, model, shape, how)
    types = {n.op_type for n in q.graph.node}
    assert ops <= types, f"{how} produced {sorted(types)}, expected {sorted(ops)} among them"
    assert all(n.domain in ("", "ai.onnx") for n in q.graph.node), \
        f"{how} produced contrib ops: {sorted({(n.domain, n.op_type) for n in q.graph.node if n.domain})}"
    assert_within_one_step(tensord, q, {"x": randn(shape, 7)})


def assert_within_one_step(tensord, q, feeds):
    """tensord predict on quantized model q: output y within one output step of onnxruntime's."""
    res = tensord.predict(tensord.save_model(q), feeds, threads=2)
    assert_no_crash(res)
    assert res.returncode == 0, f"tensord predict failed\n{res.describe()}"
    want = ort_run(q, feeds)["y"]
    got = res.outputs["y"]
    assert got.shape == want.shape and got.dtype == want.dtype, f"{got.shape} {got.dtype} vs {want.shape} {want.dtype}"
    step = output_step(q, want)
    err = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
    assert err <= step * (1 + 1e-5), f"max |tensord - ort| = {err:.6g} > one output step {step:.6g}"


def residual():
    """x [N,16] -> MatMul 16x16 -> Relu -> + x (QLinearAdd) -> * x (QLinearMul) -> + b[16] (broadcast) -> y."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Relu", ["m"], ["r"]),
             helper.make_node("Add", ["r", "x"], ["s"]), helper.make_node("Mul", ["s", "x"], ["p"]),
             helper.make_node("Add", ["p", "b"], ["y"])]
    return make(nodes, [("x", ["N", 16])], [("y", ["N", 16])],
                [("W", randn((16, 16), 3, 0.3)), ("b", randn((16,), 4, 0.5))]), (6, 16)


@pytest.mark.parametrize("arch", ["mlp", "residual"])
def test_qoperator_contrib_ops(tensord, tmp_path, arch):
    """QuantFormat.QOperator writes com.microsoft QLinearAdd (bias and residual adds, broadcasting ones too) and
    QLinearMul: they run, within one output step of onnxruntime."""
    model, shape = mlp(True) if arch == "mlp" else residual()
    q = quantize(tmp_path, model, shape, "static-qop-per-tensor")
    contrib = {n.op_type for n in q.graph.node if n.domain == "com.microsoft"}
    want_ops = {"QLinearAdd"} if arch == "mlp" else {"QLinearAdd", "QLinearMul"}
    assert want_ops <= contrib, f"expected {want_ops} among {sorted(contrib)}"
    assert_within_one_step(tensord, q, {"x": randn(shape, 7)})


def test_unknown_contrib_op_is_a_clean_error(tensord, tmp_path):
    model, shape = mlp(False)
    g = model.graph
    g.initializer.extend([numpy_helper.from_array(np.array(0.1, np.float32), "s"),
                          numpy_helper.from_array(np.array(0, np.uint8), "z")])
    g.node.append(helper.make_node("QLinearSigmoid", ["y", "s", "z", "s", "z"], ["y2"], domain="com.microsoft"))
    res = tensord.predict(tensord.save_model(model), {"x": randn(shape, 7)})
    assert_clean_error(res, "QLinearSigmoid", "com.microsoft", "not supported")


@pytest.mark.parametrize("per_column,bias,zp", [(False, False, False), (True, True, True), (True, False, True)])
def test_matmul_integer_to_float_matches_onnxruntime(tensord, tmp_path, per_column, bias, zp):
    """com.microsoft MatMulIntegerToFloat (onnxruntime's op, and what tensord's QDQ fusion writes for a dense layer
    with no Q after it), 3-D A against a 2-D weight, per-tensor or per-column scales, with and without bias and
    zero points: within float32 rounding of onnxruntime."""
    rng = np.random.default_rng(3)
    K, N = 48, 40
    a = rng.integers(0, 256, (2, 5, K), dtype=np.uint8)
    w = rng.integers(-127, 128, (K, N), dtype=np.int8)
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array(0.02, np.float32), "a_s"),
             numpy_helper.from_array((rng.random(N).astype(np.float32) * 0.01 + 0.001) if per_column
                                     else np.array(0.004, np.float32), "w_s")]
    ins = ["a", "W", "a_s", "w_s"]
    if zp or bias:
        inits.append(numpy_helper.from_array(np.array(131 if zp else 0, np.uint8), "a_zp"))
        inits.append(numpy_helper.from_array(np.zeros(N if per_column else (), np.int8), "w_zp"))
        ins += ["a_zp", "w_zp"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), "b"))
        ins.append("b")
    node = helper.make_node("MatMulIntegerToFloat", ins, ["y"], domain="com.microsoft")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.UINT8, [2, 5, K])],
                          [helper.make_tensor_value_info("y", F, [2, 5, N])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    res = tensord.predict(tensord.save_model(m), {"a": a}, threads=2)
    assert_no_crash(res)
    assert res.returncode == 0, res.describe()
    want = ort_run(m, {"a": a})["y"]
    got = res.outputs["y"]
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
