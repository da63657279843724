"""Batch-parallel execution (engine/plan/plan-split.c): a batch runs as sub-batches on separate threads only when
every node keeps batch rows independent, and the answer never changes.

Each model runs with 2 threads and TENSORD_SPLIT_ROWS=3 on a batch of 8 (chunks of 3, 3 and a tail of 2, so
both the per-worker plans and the tail plan run). `tensord bench` reports whether the plan split
(`batch_split=2 threads x 3 rows`); `tensord predict` output is compared with onnxruntime.

The models that must NOT split each mix rows in one way (softmax or a reduction over the batch axis, a constant
computed from the batch size, a transpose moving the batch axis, a constant with N rows, a partial slice or a
gather along the batch axis, MaxPool indices, a reshape that folds rows together). If the analysis wrongly
accepted one, the split run would give a different answer, so each is also compared with onnxruntime.
"""
import os
import subprocess

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import assert_clean_error, assert_matches_ort, check_model

N = 8
ROWS = 3
ENV = {"TENSORD_SPLIT_ROWS": str(ROWS)}
rng = np.random.default_rng(7)


def init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "split", inputs, outputs, list(inits))
    return check_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))


def vin(name, shape, dt=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dt, shape)


def run_env(extra=None):
    env = dict(os.environ)
    env.update(ENV)
    env.update(extra or {})
    return env


def split_line(tensord_bin, path, feeds, tmp_path, env_extra=None):
    """Runs `tensord bench` once; returns its stats line."""
    cmd = [tensord_bin, "bench", "--model", str(path), "--threads", "2", "--iterations", "1", "--warmup", "0"]
    for k, (name, arr) in enumerate(feeds.items()):
        p = tmp_path / f"bench_in{k}.npy"
        np.save(p, arr)
        cmd += ["--input", f"{name}={p}"]
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=run_env(env_extra))
    assert cp.returncode == 0, cp.stderr
    return [l for l in cp.stdout.splitlines() if l.startswith("model=")][0]


def predict(tensord, path, feeds, env_extra=None):
    old = dict(os.environ)
    os.environ.update(ENV)
    os.environ.update(env_extra or {})
    try:
        return tensord.predict(path, feeds, threads=2)
    finally:
        os.environ.clear()
        os.environ.update(old)


# ---- models whose rows are independent: must split and match ----

def conv_net():
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "s", "bb", "mu", "var"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "r1"], ["res"]),
        helper.make_node("Relu", ["res"], ["r2"]),
        helper.make_node("MaxPool", ["r2"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["p"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"]),
        helper.make_node("Gemm", ["flat", "wf", "bf"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["y"], axis=1),
    ]
    inits = [init("w1", f32(16, 3, 3, 3) * 0.3), init("b1", f32(16)), init("s", np.abs(f32(16)) + 0.5),
             init("bb", f32(16)), init("mu", f32(16)), init("var", np.abs(f32(16)) + 0.5),
             init("w2", f32(16, 16, 3, 3) * 0.1), init("wf", f32(10, 16)), init("bf", f32(10))]
    m = model(nodes, [vin("x", ["N", 3, 12, 12])], [vin("y", ["N", 10])], inits)
    return m, {"x": f32(N, 3, 12, 12)}


def seq_net():
    """Transformer-style block: embedding Gather, reshapes built from Shape(x), per-head attention, LayerNorm,
    reductions over non-batch axes, concat/slice/pad/tile/expand/where/split/topk/argmax along other axes,
    and a second input with a fixed first dim (passed whole to every sub-batch)."""
    d, L, H = 8, 6, 2
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"], axis=0),                       # [N,L,d]
        helper.make_node("Add", ["emb", "bias_in"], ["e"]),                                   # bias_in [1,1,d]
        helper.make_node("MatMul", ["e", "wq"], ["q"]),
        helper.make_node("Shape", ["e"], ["shp"]),
        helper.make_node("Slice", ["shp", "zero1", "one1"], ["nb"]),                          # [N]
        helper.make_node("Concat", ["nb", "heads"], ["qshape"], axis=0),                      # [N,L,H,d/H]
        helper.make_node("Reshape", ["q", "qshape"], ["qh"]),
        helper.make_node("Transpose", ["qh"], ["qt"], perm=[0, 2, 1, 3]),                    # [N,H,L,dh]
        helper.make_node("Transpose", ["qh"], ["kt"], perm=[0, 2, 3, 1]),                    # [N,H,dh,L]
        helper.make_node("MatMul", ["qt", "kt"], ["att"]),                                    # [N,H,L,L]
        helper.make_node("Softmax", ["att"], ["pr"], axis=-1),
        helper.make_node("MatMul", ["pr", "qt"], ["ctx"]),                                    # [N,H,L,dh]
        helper.make_node("Transpose", ["ctx"], ["ctxt"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctxt", "rows_shape"], ["flat"]),                        # [N*L, d]
        helper.make_node("LayerNormalization", ["flat", "ln_s", "ln_b"], ["ln"], axis=-1),
        helper.make_node("Reshape", ["ln", "back_shape"], ["h"]),                             # [N,L,d]
        helper.make_node("ReduceSum", ["h", "ax2"], ["pooled"], keepdims=0),                  # [N,L]
        helper.make_node("Concat", ["pooled", "pooled"], ["cat"], axis=1),                    # [N,2L]
        helper.make_node("Slice", ["cat", "s_st", "s_en", "s_ax"], ["sl"]),                   # [N,L]
        helper.make_node("Pad", ["sl", "pads"], ["pd"]),                                      # [N,L+2]
        helper.make_node("Tile", ["pd", "reps"], ["tl"]),                                     # [N,2(L+2)]
        helper.make_node("Greater", ["tl", "zero_f"], ["pos"]),
        helper.make_node("Where", ["pos", "tl", "scale"], ["wh"]),                            # scale is input [1,1]
        helper.make_node("Split", ["wh", "halves"], ["a", "b"], axis=1),
        helper.make_node("Mul", ["a", "b"], ["ab"]),
        helper.make_node("TopK", ["ab", "k2"], ["top", "topi"], axis=-1),
        helper.make_node("ArgMax", ["h"], ["am"], axis=2, keepdims=0),                         # [N,L]
        helper.make_node("Unsqueeze", ["top", "ax2"], ["top3"]),                              # [N,2,1]
        helper.make_node("Expand", ["top3", "exp_shape"], ["y"]),                             # [N,2,4]
    ]
    inits = [init("table", f32(20, d)), init("wq", f32(d, d)), init("zero1", np.array([0], np.int64)),
             init("one1", np.array([1], np.int64)), init("heads", np.array([L, H, d // H], np.int64)),
             init("rows_shape", np.array([-1, d], np.int64)), init("ln_s", f32(d)), init("ln_b", f32(d)),
             init("back_shape", np.array([-1, L, d], np.int64)), init("ax2", np.array([2], np.int64)),
             init("s_st", np.array([2], np.int64)), init("s_en", np.array([2 + L], np.int64)),
             init("s_ax", np.array([1], np.int64)), init("pads", np.array([0, 1, 0, 1], np.int64)),
             init("reps", np.array([1, 2], np.int64)), init("zero_f", np.array(0, np.float32)),
             init("halves", np.array([L + 2, L + 2], np.int64)), init("k2", np.array([2], np.int64)),
             init("exp_shape", np.array([1, 1, 4], np.int64))]
    m = model(nodes, [vin("ids", ["N", L], TensorProto.INT64), vin("bias_in", [1, 1, d]), vin("scale", [1, 1])],
              [vin("y", ["N", 2, 4]), vin("topi", ["N", 2], TensorProto.INT64), vin("am", ["N", L], TensorProto.INT64)],
              inits)
    feeds = {"ids": rng.integers(0, 20, (N, L)).astype(np.int64), "bias_in": f32(1, 1, d), "scale": f32(1, 1)}
    return m, feeds


@pytest.mark.parametrize("build", [conv_net, seq_net], ids=["conv", "seq"])
def test_independent_rows_split_and_match(tensord, tensord_bin, tmp_path, build):
    m, feeds = build()
    path = tensord.save_model(m)
    line = split_line(tensord_bin, path, feeds, tmp_path)
    assert f"batch_split=2 threads x {ROWS} rows" in line, line
    assert_matches_ort(predict(tensord, path, feeds), m, feeds)
    # and the same answer with the split turned off
    off = predict(tensord, path, feeds, {"TENSORD_BATCH_SPLIT": "0"})
    on = predict(tensord, path, feeds)
    for k in on.outputs:
        np.testing.assert_allclose(on.outputs[k], off.outputs[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_split_chosen_without_forcing(tensord, tensord_bin, tmp_path):
    """No TENSORD_SPLIT_ROWS: a conv net whose activations outweigh its weights splits on its own."""
    m, _ = conv_net()
    feeds = {"x": f32(16, 3, 12, 12)}
    path = tensord.save_model(m)
    line = split_line(tensord_bin, path, feeds, tmp_path, {"TENSORD_SPLIT_ROWS": ""})
    assert "batch_split=2 threads" in line, line
    assert "batch_split" not in split_line(tensord_bin, path, {"x": f32(1, 3, 12, 12)}, tmp_path)


# ---- models that mix rows: must not split, and must still match ----

def single(op_nodes, out_shape, inits=(), x_shape=("N", 6), out_dt=TensorProto.FLOAT):
    m = model(op_nodes, [vin("x", list(x_shape))], [vin("y", out_shape, out_dt)], inits)
    return m


MIXING = {
    "softmax_axis0": lambda: single([helper.make_node("Softmax", ["x"], ["y"], axis=0)], ["N", 6]),
    "reduce_axis0": lambda: single([helper.make_node("ReduceMean", ["x"], ["m"], axes=[0], keepdims=1),
                                    helper.make_node("Sub", ["x", "m"], ["y"])], ["N", 6]),
    "reduce_all": lambda: single([helper.make_node("ReduceSum", ["x"], ["s"], keepdims=1),
                                  helper.make_node("Mul", ["x", "s"], ["y"])], ["N", 6]),
    "divide_by_batch_size": lambda: single([helper.make_node("Shape", ["x"], ["sh"]),
                                            helper.make_node("Gather", ["sh", "i0"], ["n"], axis=0),
                                            helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
                                            helper.make_node("Div", ["x", "nf"], ["y"])], ["N", 6],
                                           [init("i0", np.array(0, np.int64))]),
    "gram_matrix": lambda: single([helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
                                   helper.make_node("MatMul", ["xt", "x"], ["y"])], [6, 6]),
    "batch_in_matmul_reduction": lambda: single([helper.make_node("MatMul", ["w", "x"], ["y"])], [3, 6],
                                                [init("w", f32(3, N))]),
    "const_with_n_rows": lambda: single([helper.make_node("Add", ["x", "c"], ["y"])], ["N", 6],
                                        [init("c", f32(N, 6))]),
    "concat_axis0": lambda: single([helper.make_node("Concat", ["x", "x"], ["y"], axis=0)], ["M", 6]),
    "partial_slice_axis0": lambda: single([helper.make_node("Slice", ["x", "st", "en", "ax"], ["y"])], ["M", 6],
                                          [init("st", np.array([1], np.int64)), init("en", np.array([N], np.int64)),
                                           init("ax", np.array([0], np.int64))]),
    "gather_rows": lambda: single([helper.make_node("Gather", ["x", "ix"], ["y"], axis=0)], [3, 6],
                                  [init("ix", np.array([5, 0, 7], np.int64))]),
    "cumsum_axis0": lambda: single([helper.make_node("CumSum", ["x", "a0"], ["y"])], ["N", 6],
                                   [init("a0", np.array(0, np.int64))]),
    "reshape_folds_rows": lambda: single([helper.make_node("Reshape", ["x", "s"], ["r"]),
                                          helper.make_node("ReduceSum", ["r", "a1"], ["y"], keepdims=0)], [4],
                                         [init("s", np.array([4, -1], np.int64)), init("a1", np.array([1], np.int64))]),
    "flatten_axis0": lambda: single([helper.make_node("Flatten", ["x"], ["f"], axis=0),
                                     helper.make_node("Softmax", ["f"], ["y"], axis=1)], [1, "M"]),
    "maxpool_indices": lambda: model([helper.make_node("MaxPool", ["x"], ["p", "y"], kernel_shape=[2, 2])],
                                     [vin("x", ["N", 2, 4, 4])], [vin("y", ["N", 2, 3, 3], TensorProto.INT64)]),
}


@pytest.mark.parametrize("name", sorted(MIXING))
def test_row_mixing_models_do_not_split(tensord, tensord_bin, tmp_path, name):
    m = MIXING[name]()
    x_shape = [d.dim_value if d.HasField("dim_value") else N for d in m.graph.input[0].type.tensor_type.shape.dim]
    feeds = {"x": f32(*x_shape)}
    path = tensord.save_model(m)
    line = split_line(tensord_bin, path, feeds, tmp_path)
    assert "batch_split" not in line, f"{name} must not split: {line}"
    assert_matches_ort(predict(tensord, path, feeds), m, feeds)


def test_error_inside_a_sub_batch_reaches_the_caller(tensord, tensord_bin, tmp_path):
    """An index out of range in row 7 (the tail chunk, run by one worker) is a clean error naming the node."""
    m = model([helper.make_node("Gather", ["table", "ids"], ["e"], axis=0),
               helper.make_node("Relu", ["e"], ["y"])],
              [vin("ids", ["N", 4], TensorProto.INT64)], [vin("y", ["N", 4, 8])], [init("table", f32(20, 8))])
    ids = rng.integers(0, 20, (N, 4)).astype(np.int64)
    path = tensord.save_model(m)
    assert "batch_split=2 threads x 3 rows" in split_line(tensord_bin, path, {"ids": ids}, tmp_path)
    ids[7, 2] = 99
    assert_clean_error(predict(tensord, path, {"ids": ids}), "gather")
