"""Attention layers as exporters write them, for the fused-attention tests (test_fused_attention.py) and the GPU
script's attention stage (tests/gpu/attention_check.py): numpy and onnx only."""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT
OPSET = 17


def rnd(shape, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def attention_model(n=2, s=5, heads=2, dh=4, scale_op="Div", mask="input", softmax_axis=-1, scores_out=False,
                    q_rank_known=True):
    """x [N, S, E] -> one self-attention layer (no output projection) -> y [N, S, E], E = heads * dh."""
    e = heads * dh
    nodes, inits = [], []
    for name, seed in (("q", 1), ("k", 2), ("v", 3)):
        inits.append(numpy_helper.from_array(rnd((e, e), seed, 1.0 / np.sqrt(e)), f"W{name}"))
        nodes.append(helper.make_node("MatMul", ["x", f"W{name}"], [f"{name}0"]))
        nodes.append(helper.make_node("Reshape", [f"{name}0", "split"], [f"{name}1"]))
    inits.append(numpy_helper.from_array(np.array([0, 0, heads, dh], np.int64), "split"))
    inits.append(numpy_helper.from_array(np.array([0, 0, e], np.int64), "merge"))
    if q_rank_known:
        nodes.append(helper.make_node("Transpose", ["q1"], ["Q"], perm=[0, 2, 1, 3]))
    else:  # Q's rank is not visible to the rewrite: a Shape-driven Reshape
        nodes.append(helper.make_node("Transpose", ["q1"], ["qt"], perm=[0, 2, 1, 3]))
        nodes.append(helper.make_node("Shape", ["qt"], ["qshape"]))
        nodes.append(helper.make_node("Reshape", ["qt", "qshape"], ["Q"]))
    nodes.append(helper.make_node("Transpose", ["k1"], ["KT"], perm=[0, 2, 3, 1]))
    nodes.append(helper.make_node("Transpose", ["v1"], ["V"], perm=[0, 2, 1, 3]))
    nodes.append(helper.make_node("MatMul", ["Q", "KT"], ["S0"]))
    cur = "S0"
    if scale_op:
        c = np.float32(np.sqrt(dh)) if scale_op in ("Div", "RDiv") else np.float32(1 / np.sqrt(dh))
        inits.append(numpy_helper.from_array(np.array(c, np.float32), "c"))
        ins = ["c", cur] if scale_op == "RDiv" else [cur, "c"]
        nodes.append(helper.make_node("Div" if scale_op in ("Div", "RDiv") else "Mul", ins, ["S1"]))
        cur = "S1"
    inputs = [helper.make_tensor_value_info("x", F, ["N", s, e])]
    if mask == "input":
        inputs.append(helper.make_tensor_value_info("mask", F, ["N", 1, 1, s]))
    elif mask == "causal":
        causal = np.triu(np.full((s, s), -1e4, np.float32), 1)
        inits.append(numpy_helper.from_array(causal, "mask"))
    if mask:
        nodes.append(helper.make_node("Add", [cur, "mask"], ["S2"]))
        cur = "S2"
    nodes.append(helper.make_node("Softmax", [cur], ["P"], axis=softmax_axis))
    nodes.append(helper.make_node("MatMul", ["P", "V"], ["o0"]))
    nodes.append(helper.make_node("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]))
    nodes.append(helper.make_node("Reshape", ["o1", "merge"], ["y"]))
    outputs = [helper.make_tensor_value_info("y", F, ["N", s, e])]
    if scores_out:
        outputs.append(helper.make_tensor_value_info(cur, F, ["N", heads, s, s]))
    g = helper.make_graph(nodes, "attention", inputs, outputs, initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tensord-tests")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def feeds(model, n=2, s=5, e=8, seed=7):
    """Inputs of attention_model: x, and the padding mask where the model takes one (the second sequence padded)."""
    out = {"x": rnd((n, s, e), seed)}
    if any(i.name == "mask" for i in model.graph.input):
        m = np.zeros((n, 1, 1, s), np.float32)
        m[1, 0, 0, s - 2:] = -1e4  # the second sequence is padded by two tokens
        out["mask"] = m
    return out


def raw_attention_model(q, kt, v, m):
    """Q, KT, V and the mask M as graph inputs of the given shapes (batch dims broadcasting between them):
    y = MatMul(Softmax(MatMul(Q, KT) * 0.3 + M), V)."""
    inputs = [helper.make_tensor_value_info(n, F, list(s)) for n, s in (("Q", q), ("KT", kt), ("V", v), ("M", m))]
    nodes = [helper.make_node("MatMul", ["Q", "KT"], ["S0"]), helper.make_node("Mul", ["S0", "c"], ["S1"]),
             helper.make_node("Add", ["S1", "M"], ["S2"]), helper.make_node("Softmax", ["S2"], ["P"]),
             helper.make_node("MatMul", ["P", "V"], ["y"])]
    g = helper.make_graph(nodes, "raw_attention", inputs, [helper.make_tensor_value_info("y", F, None)],
                          initializer=[numpy_helper.from_array(np.array(0.3, np.float32), "c")])
    m_ = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tensord-tests")
    m_.ir_version = 8
    return m_
