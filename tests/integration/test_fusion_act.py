"""Activations that exporters write as elementwise chains (engine/plan/fuse-act.c) fuse into the conv or matmul
before them, in every operand order, and chains that compute anything else stay unfused and still right.

Each case: outputs vs onnxruntime (1e-4 of the output's scale), and the TENSORD_PROFILE=1 step list says
whether the chain's ops ran as steps of their own.
"""
import os
import subprocess

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import assert_matches_ort, check_model

F = TensorProto.FLOAT
SQRT_2_PI = float(np.sqrt(2 / np.pi))


def _consts(**vals):
    return [numpy_helper.from_array(np.array(v, dtype=np.float32), k) for k, v in vals.items()]


def _model(head, chain, consts, conv):
    """head: Conv (x [N,8,6,6]) or MatMul (x [N,5,16]) producing 'h'; chain: nodes from 'h' to 'y'."""
    rng = np.random.default_rng(3)
    if conv:
        inits = [numpy_helper.from_array((rng.standard_normal((16, 8, 3, 3)) * 0.3).astype(np.float32), "w")]
        nodes = [helper.make_node("Conv", ["x", "w"], ["h"], pads=[1, 1, 1, 1])]
        xin = helper.make_tensor_value_info("x", F, ["N", 8, 6, 6])
    else:
        inits = [numpy_helper.from_array((rng.standard_normal((16, 24)) * 0.5).astype(np.float32), "w")]
        nodes = [helper.make_node("MatMul", ["x", "w"], ["h"])]
        xin = helper.make_tensor_value_info("x", F, ["N", 5, 16])
    g = helper.make_graph(nodes + chain, "act", [xin], [helper.make_tensor_value_info("y", F, ["N", None, None, None] if conv else ["N", None, None])],
                          initializer=inits + consts)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="tensord-tests")
    m.ir_version = 8
    return check_model(m)


N = helper.make_node

CHAINS = {
    # name: (nodes, consts, fuses)
    "silu": ([N("Sigmoid", ["h"], ["s"]), N("Mul", ["h", "s"], ["y"])], {}, True),
    "silu_swapped": ([N("Sigmoid", ["h"], ["s"]), N("Mul", ["s", "h"], ["y"])], {}, True),
    "gelu_erf_div": ([N("Div", ["h", "r2"], ["a"]), N("Erf", ["a"], ["b"]), N("Add", ["b", "one"], ["c"]),
                      N("Mul", ["h", "c"], ["d"]), N("Mul", ["d", "half"], ["y"])],
                     dict(r2=np.sqrt(2), one=1, half=0.5), True),
    "gelu_erf_half_first": ([N("Mul", ["h", "ir2"], ["a"]), N("Erf", ["a"], ["b"]), N("Add", ["one", "b"], ["c"]),
                             N("Mul", ["half", "h"], ["d"]), N("Mul", ["d", "c"], ["y"])],
                            dict(ir2=1 / np.sqrt(2), one=1, half=0.5), True),
    "gelu_tanh_pow": ([N("Pow", ["h", "three"], ["p"]), N("Mul", ["p", "k"], ["q"]), N("Add", ["h", "q"], ["r"]),
                       N("Mul", ["r", "s2p"], ["t"]), N("Tanh", ["t"], ["u"]), N("Add", ["u", "one"], ["v"]),
                       N("Mul", ["h", "half"], ["w2"]), N("Mul", ["w2", "v"], ["y"])],
                      dict(three=3, k=0.044715, s2p=SQRT_2_PI, one=1, half=0.5), True),
    "gelu_tanh_cube_by_mul": ([N("Mul", ["h", "h"], ["h2"]), N("Mul", ["h2", "h"], ["p"]), N("Mul", ["k", "p"], ["q"]),
                               N("Add", ["q", "h"], ["r"]), N("Mul", ["s2p", "r"], ["t"]), N("Tanh", ["t"], ["u"]),
                               N("Add", ["one", "u"], ["v"]), N("Mul", ["v", "h"], ["w2"]), N("Mul", ["w2", "half"], ["y"])],
                              dict(k=0.044715, s2p=SQRT_2_PI, one=1, half=0.5), True),
    "hardswish_by_hardsigmoid": ([N("HardSigmoid", ["h"], ["s"], alpha=1 / 6, beta=0.5), N("Mul", ["h", "s"], ["y"])],
                                 {}, True),
    "hardswish_by_clip": ([N("Add", ["h", "three"], ["a"]), N("Clip", ["a", "zero", "six"], ["b"]),
                           N("Mul", ["h", "b"], ["c"]), N("Div", ["c", "six"], ["y"])],
                          dict(three=3, zero=0, six=6), True),
    # near misses: they compute something else and must stay as they are
    "tanh_wrong_constant": ([N("Pow", ["h", "three"], ["p"]), N("Mul", ["p", "k"], ["q"]), N("Add", ["h", "q"], ["r"]),
                             N("Mul", ["r", "s2p"], ["t"]), N("Tanh", ["t"], ["u"]), N("Add", ["u", "one"], ["v"]),
                             N("Mul", ["h", "half"], ["w2"]), N("Mul", ["w2", "v"], ["y"])],
                            dict(three=3, k=0.044715, s2p=0.9, one=1, half=0.5), False),
    "silu_times_two": ([N("Sigmoid", ["h"], ["s"]), N("Mul", ["h", "s"], ["a"]), N("Mul", ["a", "two"], ["y"])],
                       dict(two=2), True),  # the SiLU part fuses; the extra Mul stays a step of its own
}


def _steps(tensord, model, feeds):
    path = tensord.save_model(model, f"m{np.random.randint(1 << 30)}.onnx")
    x = tensord.tmp / "x.npy"
    np.save(x, feeds["x"])
    cp = subprocess.run([tensord.bin, "bench", "--model", str(path), "--input", f"x={x}", "--iterations", "1",
                         "--warmup", "0", "--threads", "1"], capture_output=True, text=True, timeout=60,
                        env={**os.environ, "TENSORD_PROFILE": "1"})
    assert cp.returncode == 0, cp.stderr[-2000:]
    lines = cp.stderr.split("mean ms per step", 1)[1].splitlines()[1:]
    return [l.split()[1] for l in lines if l.startswith("  ") and len(l.split()) > 1]


@pytest.mark.parametrize("conv", [True, False], ids=["conv", "matmul"])
@pytest.mark.parametrize("case", list(CHAINS))
def test_activation_chain(tensord, case, conv):
    nodes, consts, fuses = CHAINS[case]
    model = _model(None, nodes, _consts(**consts), conv)
    shape = (2, 8, 6, 6) if conv else (2, 5, 16)
    feeds = {"x": (np.random.default_rng(1).standard_normal(shape) * 2).astype(np.float32)}
    res = tensord.predict(tensord.save_model(model), feeds)
    assert_matches_ort(res, model, feeds)
    ops = _steps(tensord, model, feeds)
    fused_op = "FusedConv" if conv else "FusedMatMul"
    chain_ops = {"Sigmoid", "Erf", "Tanh", "HardSigmoid", "Clip", "Pow"}
    if fuses:
        assert fused_op in ops and not chain_ops & set(ops), f"{case}: expected one fused step, got {ops}"
    else:
        assert chain_ops & set(ops), f"{case}: a chain that is no known activation was fused away: {ops}"
