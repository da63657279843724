"""Cross-checks `tensord predict` against onnxruntime on small graphs, and checks the CLI's bad-input behaviour.

  test_bench_architecture   the four bench/models.py architectures at reduced sizes, batch 1 and 3
  test_graph                hand-built graphs: broadcasting, Reshape/Transpose chains, Concat/Slice/Gather,
                            reductions, Softmax, Conv (groups/strides/pads/dilations), pooling, MatMul/Gemm
  test_bad_*                malformed models and requests: exit 1 with an `error:` message, never a crash

Every model here is built with onnx.helper in the test's tmp dir and is small, so each test takes well under a
second. Comparison rule and "clean error" are defined in conftest.py.
"""
import re
import subprocess

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import models as bench_models
from conftest import Result, assert_clean_error, assert_matches_ort, check_model

F = TensorProto.FLOAT
I64 = TensorProto.INT64
OPSET = 17


def rng(seed=0):
    return np.random.default_rng(seed)


def randn(shape, seed=0, scale=1.0):
    return (rng(seed).standard_normal(shape) * scale).astype(np.float32)


def make(nodes, inputs, outputs, inits=(), opset=OPSET, check=True):
    """inputs/outputs: [(name, elem_type, shape)]; inits: [(name, array)]."""
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        initializer=[numpy_helper.from_array(np.asarray(a), n) for n, a in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="tensord-tests")
    m.ir_version = 8
    return check_model(m) if check else m


# --------------------------------------------------------------------------------------------------------------
# the bench architectures, small

SMALL_ARCH = {
    "mlp": (lambda: bench_models.build_mlp(sizes=(64, 48, 32, 10)), (64,)),
    "mlp-full": (lambda: bench_models.build_mlp(), (784,)),
    "cnn": (lambda: bench_models.build_cnn(hw=12, channels=8), (1, 12, 12)),
    "cnn-full": (lambda: bench_models.build_cnn(), (1, 28, 28)),
    "resnet": (lambda: bench_models.build_resnet(hw=16, widths=(4, 8, 16), blocks=2), (3, 16, 16)),
    # >= 32 channels: Winograd convolutions, including residual ones (sum post-op)
    "resnet-wide": (lambda: bench_models.build_resnet(hw=16, widths=(32, 64, 64), blocks=2), (3, 16, 16)),
    "transformer": (lambda: bench_models.build_transformer(layers=2, d=32, heads=4, seq=8, ffn=64), (8, 32)),
}


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("arch", sorted(SMALL_ARCH))
def test_bench_architecture(tensord, arch, batch):
    build, per_sample = SMALL_ARCH[arch]
    model = build()
    feeds = {"x": bench_models.make_input(per_sample, batch, seed=batch)}
    res = tensord.predict(tensord.save_model(model), feeds)
    assert_matches_ort(res, model, feeds)


@pytest.mark.parametrize("arch", ["resnet-wide", "cnn", "transformer"])
def test_bench_architecture_two_threads_batch_split(tensord, arch):
    """Two threads and a batch of 5 in chunks of 2: each worker thread runs its own sub-plan, so oneDNN
    primitives run on threads other than the one that created them (user scratchpads), plus a tail chunk."""
    build, per_sample = SMALL_ARCH[arch]
    model = build()
    feeds = {"x": bench_models.make_input(per_sample, 5, seed=5)}
    os.environ["TENSORD_SPLIT_ROWS"] = "2"
    try:
        res = tensord.predict(tensord.save_model(model), feeds, threads=2)
    finally:
        del os.environ["TENSORD_SPLIT_ROWS"]
    assert_matches_ort(res, model, feeds)


def test_model_directory_and_threads(tensord):
    """--model may name a directory holding model.onnx; --threads 2 gives the same answer."""
    model = bench_models.build_cnn(hw=10, channels=4)
    tensord.save_model(model)
    feeds = {"x": bench_models.make_input((1, 10, 10), 2, seed=7)}
    assert_matches_ort(tensord.predict(tensord.tmp, feeds, threads=2), model, feeds)


# --------------------------------------------------------------------------------------------------------------
# hand-built graphs: each case returns (model, feeds)

def case_broadcast_arith():
    nodes = [helper.make_node("Add", ["a", "b"], ["t0"]),          # [2,3,4] + [4]
             helper.make_node("Mul", ["t0", "c"], ["t1"]),         # * [3,1]
             helper.make_node("Sub", ["t1", "s"], ["t2"]),         # - scalar
             helper.make_node("Div", ["t2", "d"], ["t3"]),         # / [2,1,1]
             helper.make_node("Max", ["t3", "b", "z"], ["t4"]),    # variadic with broadcast
             helper.make_node("Pow", ["t4", "two"], ["y"])]
    d = np.abs(randn((2, 1, 1), 4)) + 0.5
    m = make(nodes, [("a", F, [2, 3, 4]), ("b", F, [4]), ("c", F, [3, 1])], [("y", F, [2, 3, 4])],
             [("s", np.float32(0.25)), ("d", d), ("z", np.zeros((1, 4), np.float32)), ("two", np.float32(2.0))])
    return m, {"a": randn((2, 3, 4), 1), "b": randn((4,), 2), "c": randn((3, 1), 3)}


def case_unary_chain():
    nodes = [helper.make_node("Abs", ["x"], ["t0"]), helper.make_node("Sqrt", ["t0"], ["t1"]),
             helper.make_node("Tanh", ["x"], ["t2"]), helper.make_node("Sigmoid", ["t1"], ["t3"]),
             helper.make_node("Exp", ["t2"], ["t4"]), helper.make_node("Neg", ["t3"], ["t5"]),
             helper.make_node("Add", ["t4", "t5"], ["t6"]), helper.make_node("Erf", ["t6"], ["t7"]),
             helper.make_node("Clip", ["t7", "lo", "hi"], ["y"])]
    m = make(nodes, [("x", F, [3, 17])], [("y", F, [3, 17])], [("lo", np.float32(-0.5)), ("hi", np.float32(0.6))])
    return m, {"x": randn((3, 17), 5, 2.0)}


def case_reshape_transpose_chain():
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["t0"]),                 # [2,3,4,5] -> [2,12,5]  (0,-1,5)
             helper.make_node("Transpose", ["t0"], ["t1"], perm=[2, 0, 1]),     # [5,2,12]
             helper.make_node("Reshape", ["t1", "s2"], ["t2"]),                 # [5,2,3,4]
             helper.make_node("Transpose", ["t2"], ["t3"], perm=[3, 1, 0, 2]),  # [4,2,5,3]
             helper.make_node("Unsqueeze", ["t3", "ax"], ["t4"]),               # [4,1,2,5,3]
             helper.make_node("Squeeze", ["t4", "ax"], ["t5"]),
             helper.make_node("Flatten", ["t5"], ["t6"], axis=2),               # [8,15]
             helper.make_node("Transpose", ["t6"], ["y"])]                      # [15,8]
    m = make(nodes, [("x", F, [2, 3, 4, 5])], [("y", F, [15, 8])],
             [("s1", np.array([0, -1, 5], np.int64)), ("s2", np.array([5, 2, 3, 4], np.int64)),
              ("ax", np.array([1], np.int64))])
    return m, {"x": randn((2, 3, 4, 5), 6)}


def case_concat_slice_gather():
    nodes = [helper.make_node("Concat", ["a", "b"], ["t0"], axis=1),                         # [3,7,4]
             helper.make_node("Slice", ["t0", "st", "en", "axs", "stp"], ["t1"]),            # [3,3,2]
             helper.make_node("Gather", ["t0", "idx"], ["t2"], axis=1),                      # [3,2,2,4]
             helper.make_node("Gather", ["a", "idx0"], ["t3"], axis=0),                      # [4,2,4]
             helper.make_node("Split", ["t0", "sp"], ["p0", "p1"], axis=1),                  # [3,2,4] [3,5,4]
             helper.make_node("Slice", ["p1", "st2", "en2", "axs2", "stp2"], ["t4"]),        # negative step
             helper.make_node("Concat", ["p0", "t4"], ["t5"], axis=1)]
    m = make(nodes, [("a", F, [3, 2, 4]), ("b", F, [3, 5, 4])],
             [("t1", F, [3, 3, 2]), ("t2", F, [3, 2, 2, 4]), ("t3", F, [4, 2, 4]), ("t5", F, [3, 4, 4])],
             [("st", np.array([1, -1], np.int64)), ("en", np.array([100, -5], np.int64)),
              ("axs", np.array([1, 2], np.int64)), ("stp", np.array([2, -2], np.int64)),
              ("idx", np.array([[0, 6], [-1, 3]], np.int64)), ("idx0", np.array([2, 0, 1, -3], np.int64)),
              ("sp", np.array([2, 5], np.int64)),
              ("st2", np.array([-1], np.int64)), ("en2", np.array([-4], np.int64)),
              ("axs2", np.array([1], np.int64)), ("stp2", np.array([-2], np.int64))])
    return m, {"a": randn((3, 2, 4), 7), "b": randn((3, 5, 4), 8)}


def case_gather_runtime_indices():
    nodes = [helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)]
    m = make(nodes, [("ids", I64, [2, 5])], [("y", F, [2, 5, 6])], [("table", randn((11, 6), 9))])
    return m, {"ids": np.array([[0, 10, 3, 3, -1], [5, 6, 7, 8, -11]], np.int64)}


def case_reductions():
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[1, 3], keepdims=1),
             helper.make_node("ReduceSum", ["x", "ax"], ["s"], keepdims=0),
             helper.make_node("ReduceMax", ["x"], ["mx"], axes=[-1], keepdims=0),
             helper.make_node("ReduceMin", ["x"], ["mn"], axes=[0], keepdims=1),
             helper.make_node("ReduceProd", ["x"], ["p"], axes=[2], keepdims=0),
             helper.make_node("ReduceL2", ["x"], ["l2"], keepdims=1),  # all axes
             helper.make_node("ArgMax", ["x"], ["am"], axis=2, keepdims=0)]
    shp = [2, 3, 4, 5]
    m = make(nodes, [("x", F, shp)],
             [("m", F, [2, 1, 4, 1]), ("s", F, [2, 5]), ("mx", F, [2, 3, 4]), ("mn", F, [1, 3, 4, 5]),
              ("p", F, [2, 3, 5]), ("l2", F, [1, 1, 1, 1]), ("am", I64, [2, 3, 5])],
             [("ax", np.array([1, 2], np.int64))])
    return m, {"x": randn(shp, 10)}


def case_softmax():
    nodes = [helper.make_node("Softmax", ["x"], ["a"], axis=1),
             helper.make_node("Softmax", ["x"], ["b"]),  # default axis -1
             helper.make_node("LogSoftmax", ["x"], ["c"], axis=0)]
    shp = [3, 4, 33]
    m = make(nodes, [("x", F, shp)], [("a", F, shp), ("b", F, shp), ("c", F, shp)])
    x = randn(shp, 11, 4.0)
    x[0, 0, :] += 80.0  # large logits: the max must be subtracted
    return m, {"x": x}


def _conv_case(c_in, c_out, hw, k, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group=1, bias=True,
               auto_pad=None, n=2, seed=12):
    w = randn((c_out, c_in // group, k[0], k[1]), seed, 0.3)
    attrs = dict(kernel_shape=list(k), strides=list(strides), dilations=list(dilations), group=group)
    if auto_pad:
        attrs["auto_pad"] = auto_pad
    else:
        attrs["pads"] = list(pads)
    ins = ["x", "w"] + (["b"] if bias else [])
    inits = [("w", w)] + ([("b", randn((c_out,), seed + 1))] if bias else [])
    node = helper.make_node("Conv", ins, ["y"], **attrs)
    m = make([node], [("x", F, [n, c_in, hw[0], hw[1]])], [("y", F, ["n", "c", "h", "w"])], inits)
    return m, {"x": randn((n, c_in, hw[0], hw[1]), seed + 2)}


def _pool_case(op, hw=(9, 10), c=3, **attrs):
    m = make([helper.make_node(op, ["x"], ["y"], **attrs)], [("x", F, [2, c, hw[0], hw[1]])],
             [("y", F, ["n", "c", "h", "w"])])
    return m, {"x": randn((2, c, hw[0], hw[1]), 13)}


def _conv_pool_case(hw, pool_k, pool_s, c_out=32):
    """Conv + Relu + MaxPool: fused into one blocked-layout kernel that pools 16 channels x 16 columns at a time
    and transposes them to NCHW (widths here are not multiples of 16)."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=list(pool_k), strides=list(pool_s))]
    m = make(nodes, [("x", F, ["N", 3, hw[0], hw[1]])], [("y", F, ["N", c_out, "h", "w"])],
             [("w", randn((c_out, 3, 3, 3), 40, 0.3)), ("b", randn((c_out,), 41))])
    return m, {"x": randn((3, 3, hw[0], hw[1]), 42)}


def case_matmul_gemm():
    nodes = [helper.make_node("MatMul", ["a", "b"], ["mm"]),                                       # [2,5,3,6]
             helper.make_node("Gemm", ["p", "q", "r"], ["gm"], transA=1, transB=1, alpha=0.5, beta=2.0),
             helper.make_node("MatMul", ["v", "b2"], ["mv"])]                                      # 1-D x 2-D
    m = make(nodes, [("a", F, [2, 1, 3, 4]), ("b", F, [5, 4, 6]), ("p", F, [7, 3])],
             [("mm", F, [2, 5, 3, 6]), ("gm", F, [3, 5]), ("mv", F, [6])],
             [("q", randn((5, 7), 14)), ("r", randn((1, 5), 15)), ("v", randn((4,), 16)), ("b2", randn((4, 6), 17))])
    return m, {"a": randn((2, 1, 3, 4), 18), "b": randn((5, 4, 6), 19), "p": randn((7, 3), 20)}


def case_layernorm_batchnorm():
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], axis=-1, epsilon=1e-5),
             helper.make_node("BatchNormalization", ["x4", "s", "bb", "mu", "var"], ["bn"], epsilon=1e-3)]
    m = make(nodes, [("x", F, [2, 3, 16]), ("x4", F, [2, 4, 3, 3])], [("ln", F, [2, 3, 16]), ("bn", F, [2, 4, 3, 3])],
             [("g", randn((16,), 21)), ("b", randn((16,), 22)), ("s", randn((4,), 23)), ("bb", randn((4,), 24)),
              ("mu", randn((4,), 25)), ("var", np.abs(randn((4,), 26)) + 0.1)])
    return m, {"x": randn((2, 3, 16), 27, 3.0) + 5.0, "x4": randn((2, 4, 3, 3), 28)}


def case_shape_ops():
    """Shape -> Gather -> Concat -> Reshape: a shape computed at run time, as exporters emit it."""
    nodes = [helper.make_node("Shape", ["x"], ["sh"]),
             helper.make_node("Gather", ["sh", "i0"], ["n"], axis=0),
             helper.make_node("Concat", ["n", "m1"], ["ns"], axis=0),
             helper.make_node("Reshape", ["x", "ns"], ["y"]),
             helper.make_node("ConstantOfShape", ["sh"], ["z"], value=helper.make_tensor("v", F, [1], [1.5])),
             helper.make_node("Expand", ["e", "sh"], ["ex"])]
    m = make(nodes, [("x", F, ["N", 3, 4])], [("y", F, ["N", 12]), ("z", F, ["N", 3, 4]), ("ex", F, ["N", 3, 4])],
             [("i0", np.array([0], np.int64)), ("m1", np.array([-1], np.int64)), ("e", randn((3, 1), 29))])
    return m, {"x": randn((5, 3, 4), 30)}


GRAPHS = {
    "broadcast-arith": case_broadcast_arith,
    "unary-chain": case_unary_chain,
    "reshape-transpose-chain": case_reshape_transpose_chain,
    "concat-slice-gather-split": case_concat_slice_gather,
    "gather-runtime-indices": case_gather_runtime_indices,
    "reductions": case_reductions,
    "softmax": case_softmax,
    "matmul-gemm": case_matmul_gemm,
    "layernorm-batchnorm": case_layernorm_batchnorm,
    "shape-ops": case_shape_ops,
    "conv-basic": lambda: _conv_case(3, 8, (9, 9), (3, 3)),
    "conv-stride-pad": lambda: _conv_case(4, 6, (11, 10), (3, 3), strides=(2, 2), pads=(1, 1, 1, 1)),
    "conv-asym-pad-stride": lambda: _conv_case(2, 5, (10, 7), (3, 2), strides=(2, 3), pads=(0, 1, 2, 0)),
    "conv-groups": lambda: _conv_case(6, 4, (8, 8), (3, 3), group=2, pads=(1, 1, 1, 1), bias=False),
    "conv-depthwise": lambda: _conv_case(8, 8, (9, 9), (3, 3), group=8, strides=(2, 2), pads=(1, 1, 1, 1)),
    "conv-dilated": lambda: _conv_case(3, 4, (12, 12), (3, 3), dilations=(2, 2), pads=(2, 2, 2, 2)),
    "conv-1x1": lambda: _conv_case(16, 8, (5, 5), (1, 1), n=3),
    "conv-same-upper": lambda: _conv_case(3, 4, (7, 8), (4, 4), strides=(2, 2), auto_pad="SAME_UPPER"),
    "conv-relu-maxpool-38-wide": lambda: _conv_pool_case((10, 38), (2, 2), (2, 2)),
    "conv-relu-maxpool-3x3-stride1": lambda: _conv_pool_case((7, 35), (3, 3), (1, 1), c_out=48),
    "maxpool-2x2": lambda: _pool_case("MaxPool", kernel_shape=[2, 2], strides=[2, 2]),
    "maxpool-3x3-pad-stride": lambda: _pool_case("MaxPool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    "maxpool-ceil": lambda: _pool_case("MaxPool", kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
    "avgpool-exclude-pad": lambda: _pool_case("AveragePool", kernel_shape=[3, 3], strides=[2, 2],
                                              pads=[1, 1, 1, 1], count_include_pad=0),
    "avgpool-include-pad": lambda: _pool_case("AveragePool", kernel_shape=[3, 2], strides=[1, 2],
                                              pads=[1, 0, 1, 1], count_include_pad=1),
    "global-avgpool": lambda: _pool_case("GlobalAveragePool"),
    "global-maxpool": lambda: _pool_case("GlobalMaxPool"),
}


@pytest.mark.parametrize("case", list(GRAPHS))
def test_graph(tensord, case):
    model, feeds = GRAPHS[case]()
    res = tensord.predict(tensord.save_model(model), feeds)
    assert_matches_ort(res, model, feeds)


# --------------------------------------------------------------------------------------------------------------
# bad input: every one must end in exit 1 with an `error:` message, never a crash


def _tiny_model(input_name="x", shape=("N", 4)):
    nodes = [helper.make_node("MatMul", [input_name, "w"], ["t"], name="mm"),
             helper.make_node("Relu", ["t"], ["y"], name="act")]
    return make(nodes, [(input_name, F, list(shape))], [("y", F, [shape[0], 3])], [("w", randn((4, 3), 31))])


def _good_feed(name="x"):
    return {name: randn((2, 4), 32)}


def test_tiny_model_works(tensord):
    """The base model of the bad-input tests runs; otherwise those tests would prove nothing."""
    m = _tiny_model()
    assert_matches_ort(tensord.predict(tensord.save_model(m), _good_feed()), m, _good_feed())


@pytest.mark.parametrize("frac", [0.0, 0.05, 0.25, 0.5, 0.75, 0.98, "last-1"])
def test_bad_truncated_model(tensord, frac):
    blob = _tiny_model().SerializeToString()
    cut = len(blob) - 1 if frac == "last-1" else max(1, int(len(blob) * frac))
    cut_blob = blob[:cut]
    with pytest.raises(Exception):  # the premise: onnx's own parser rejects this prefix
        onnx.load_model_from_string(cut_blob)
    res = tensord.predict(tensord.save_model(cut_blob), _good_feed())
    assert_clean_error(res)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_bad_garbage_bytes(tensord, seed):
    blob = rng(seed).integers(0, 256, size=4096 * seed, dtype=np.uint8).tobytes()
    res = tensord.predict(tensord.save_model(blob), _good_feed())
    assert_clean_error(res)


def test_bad_empty_file(tensord):
    """An empty file parses as an empty ModelProto: no graph, which must be an error."""
    res = tensord.predict(tensord.save_model(b""), _good_feed())
    assert_clean_error(res)


def test_bad_missing_model_file(tensord):
    res = tensord.predict(tensord.tmp / "does-not-exist.onnx", _good_feed())
    assert_clean_error(res)


def test_bad_unknown_op(tensord):
    nodes = [helper.make_node("Relu", ["x"], ["t"], name="first_relu"),
             helper.make_node("FrobnicateTensor", ["t"], ["y"], name="the_weird_node")]
    m = make(nodes, [("x", F, ["N", 4])], [("y", F, ["N", 4])], check=False)
    res = tensord.predict(tensord.save_model(m), _good_feed())
    assert_clean_error(res, "the_weird_node", "FrobnicateTensor")


def test_bad_wrong_input_name(tensord):
    m = _tiny_model(input_name="pixel_values")
    res = tensord.predict(tensord.save_model(m), {"not_an_input": randn((2, 4), 33)})
    assert_clean_error(res, "pixel_values", "not_an_input")


def test_bad_missing_input(tensord):
    nodes = [helper.make_node("Add", ["first_in", "second_in"], ["y"], name="add")]
    m = make(nodes, [("first_in", F, [2, 4]), ("second_in", F, [2, 4])], [("y", F, [2, 4])])
    res = tensord.predict(tensord.save_model(m), {"first_in": randn((2, 4), 34)})
    assert_clean_error(res, "second_in")


@pytest.mark.parametrize("dtype,name", [(np.int32, "int32"), (np.float64, None), (np.uint8, "uint8")])
def test_bad_wrong_dtype(tensord, dtype, name):
    m = _tiny_model(input_name="pixel_values")
    res = tensord.predict(tensord.save_model(m), {"pixel_values": np.ones((2, 4), dtype)})
    # expected float32 vs got <dtype>; float64 may be spelled float64 or double
    assert_clean_error(res, "pixel_values", "float", pattern=name if name else r"float64|double")


def test_bad_wrong_rank(tensord):
    m = _tiny_model(input_name="pixel_values")
    res = tensord.predict(tensord.save_model(m), {"pixel_values": randn((2, 4, 1), 35)})
    # names the input and says expected vs got: the shapes ([N,4] vs [2,4,1]) or the ranks (2 vs 3)
    assert_clean_error(res, "pixel_values")
    got = re.search(r"2\s*[,x]\s*4\s*[,x]\s*1|got\W{0,3}(rank\W{0,3})?3\b", res.stderr, re.I)
    want = re.search(r"\[\s*(N|-1|\?)\s*,\s*4\s*\]|expected\W{0,3}(rank\W{0,3})?2\b|rank\W{0,3}2\b", res.stderr, re.I)
    assert got and want, f"error message does not say expected [N,4] (rank 2) vs got [2,4,1] (rank 3)\n{res.describe()}"


def test_bad_wrong_static_dim(tensord):
    m = _tiny_model(input_name="pixel_values")
    res = tensord.predict(tensord.save_model(m), {"pixel_values": randn((2, 5), 36)})
    assert_clean_error(res, "pixel_values")
    got = re.search(r"2\s*[,x]\s*5|got\W{0,3}5\b", res.stderr, re.I)
    want = re.search(r"\[\s*(N|-1|\?)\s*,\s*4\s*\]|expected\W{0,3}4\b", res.stderr, re.I)
    assert got and want, f"error message does not say expected [N,4] vs got [2,5]\n{res.describe()}"


def _huge_initializer_model(dims, raw=b"\0" * 16):
    t = TensorProto()
    t.name = "huge"
    t.data_type = F
    t.dims.extend(dims)
    t.raw_data = raw
    nodes = [helper.make_node("Add", ["x", "huge"], ["y"], name="add_huge")]
    m = make(nodes, [("x", F, [2, 4])], [("y", F, None)], check=False)
    m.graph.initializer.append(t)
    return m


@pytest.mark.parametrize("dims", [[1 << 40, 1 << 40], [1 << 62, 4], [1 << 31, 1 << 31, 1 << 31],
                                  [1 << 50, 1], [-1, 4], [4, -8]],
                         ids=["2^40x2^40", "2^62x4", "2^31^3", "2^50", "neg-first", "neg-second"])
def test_bad_huge_initializer(tensord, dims):
    res = tensord.predict(tensord.save_model(_huge_initializer_model(dims)), _good_feed())
    assert_clean_error(res)


def _huge_shape_model(shape, op):
    """x [2,4] -> op driven by the int64 initializer `shp` = shape -> y."""
    if op == "ConstantOfShape":
        nodes = [helper.make_node("ConstantOfShape", ["shp"], ["big"], name="cos_huge",
                                  value=helper.make_tensor("v", F, [1], [1.0])),
                 helper.make_node("Add", ["big", "x"], ["y"], name="add")]
    elif op == "Expand":
        nodes = [helper.make_node("Expand", ["x", "shp"], ["big"], name="expand_huge"),
                 helper.make_node("ReduceSum", ["big"], ["y"], name="sum", keepdims=0)]
    else:  # Reshape to a shape whose element count overflows or cannot match the input's 8
        nodes = [helper.make_node("Reshape", ["x", "shp"], ["y"], name="reshape_huge")]
    return make(nodes, [("x", F, [2, 4])], [("y", F, None)], [("shp", np.array(shape, np.int64))], check=False)


@pytest.mark.parametrize("op,shape", [
    ("ConstantOfShape", [1 << 31, 1 << 31, 1 << 31]),   # element count overflows int64
    ("ConstantOfShape", [1 << 20, 1 << 20, 1 << 10]),   # 2^50 floats: 4 PiB, past any address space
    ("ConstantOfShape", [1 << 62, 2]),                  # overflows on the multiply by 2
    ("ConstantOfShape", [4, -3]),
    ("Expand", [1 << 40, 1 << 40, 2, 4]),
    ("Expand", [1 << 31, 1 << 31, 1 << 31, 4]),
    ("Reshape", [1 << 40, 1 << 40]),
    ("Reshape", [-1, 1 << 62]),
], ids=lambda v: v if isinstance(v, str) else "x".join(str(d) for d in v))
def test_bad_huge_runtime_shape(tensord, op, shape):
    res = tensord.predict(tensord.save_model(_huge_shape_model(shape, op)), _good_feed())
    assert_clean_error(res)


def test_bad_initializer_data_too_short(tensord):
    """dims [4,3] but 5 bytes of raw_data: the loader must notice, not read past the buffer."""
    m = _tiny_model()
    m.graph.initializer[0].raw_data = b"\x01" * 5
    res = tensord.predict(tensord.save_model(m), _good_feed())
    assert_clean_error(res)


def test_bad_npy_file(tensord):
    """An input file that is not a valid .npy is an error naming the input."""
    m = _tiny_model(input_name="pixel_values")
    mp = tensord.save_model(m)
    bad = tensord.tmp / "bad.npy"
    bad.write_bytes(b"\x93NUMPY\x01\x00garbage-header-without-a-dict" + b"\0" * 40)
    out = tensord.tmp / "o"
    out.mkdir()
    cp = subprocess.run([tensord.bin, "predict", "--model", str(mp), "--input", f"pixel_values={bad}",
                         "--output-dir", str(out)], capture_output=True, text=True, timeout=60)
    assert_clean_error(Result(cp, {}), "pixel_values")


def test_bench_cli_output(tensord):
    """`tensord bench` ends with `median_ms=<x> p90_ms=<y>`: bench/run.py parses exactly that line."""
    m = _tiny_model()
    mp = tensord.save_model(m)
    x = tensord.tmp / "x.npy"
    np.save(x, randn((2, 4), 37))
    cp = subprocess.run([tensord.bin, "bench", "--model", str(mp), "--input", f"x={x}", "--iterations", "5",
                         "--warmup", "1", "--threads", "1"], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, f"exit {cp.returncode}\n{cp.stderr[-2000:]}"
    last = (cp.stdout.strip().splitlines() or [""])[-1]
    mt = re.fullmatch(r"median_ms=([0-9.eE+-]+)\s+p90_ms=([0-9.eE+-]+)", last.strip())
    assert mt, f"last stdout line is {last!r}"
    med, p90 = float(mt.group(1)), float(mt.group(2))
    assert 0 <= med <= p90, f"median {med} p90 {p90}"
