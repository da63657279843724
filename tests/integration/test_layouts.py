"""Layout negotiation (engine/plan/fuse.c's layout pass, kernels/cpu/nn-*.c): the op orders exporters emit, run
through blocked (nChw16c, or NHWC when C % 16 != 0) activations, must give onnxruntime's answers and must never
run a oneDNN reference kernel or a step the planner calls slow.

Each case is built at two channel counts, 32 (nChw16c) and 24 (NHWC), batch 2, and checked three ways:
  - outputs vs onnxruntime (conftest's rule, 1e-4 of the output's scale), 1 and 2 threads;
  - ONEDNN_VERBOSE=1: no executed primitive whose implementation starts with `ref` (skipped without AVX-512);
  - TENSORD_PROFILE=1: no step marked [SLOW] and no `slow path` warning.
"""
import os
import subprocess

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import assert_matches_ort, check_model

F = TensorProto.FLOAT
OPSET = 17


def _avx512():
    try:
        with open("/proc/cpuinfo") as f:
            return " avx512f " in f.read().replace("\n", " ")
    except OSError:
        return False


class G:
    """A tiny graph builder: convs with seeded He-scaled weights, value names generated."""

    def __init__(self, c_in, hw, seed=0):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.n = [], [], 0
        self.c_in, self.hw = c_in, hw

    def _name(self, p):
        self.n += 1
        return f"{p}{self.n}"

    def const(self, arr):
        name = self._name("k")
        self.inits.append(numpy_helper.from_array(np.asarray(arr, dtype=np.float32 if np.asarray(arr).dtype.kind == "f" else None), name))
        return name

    def op(self, op, ins, **attrs):
        out = self._name("v")
        self.nodes.append(helper.make_node(op, ins, [out], name=self._name(op.lower()), **attrs))
        return out

    def conv(self, x, cin, cout, k=3, stride=1, group=1, pad=None, bias=True):
        pad = k // 2 if pad is None else pad
        w = (self.rng.standard_normal((cout, cin // group, k, k)) * np.sqrt(2.0 / (cin // group * k * k))).astype(np.float32)
        ins = [x, self.const(w)]
        if bias:
            ins.append(self.const((self.rng.standard_normal(cout) * 0.1).astype(np.float32)))
        return self.op("Conv", ins, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, group=group)

    def model(self, y):
        g = helper.make_graph(self.nodes, "layouts",
                              [helper.make_tensor_value_info("x", F, ["N", self.c_in, self.hw, self.hw])],
                              [helper.make_tensor_value_info(y, F, ["N", None, None, None] if "Gemm" not in self.nodes[-1].op_type else ["N", None])], initializer=self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tensord-tests")
        m.ir_version = 8
        return check_model(m)


def case_stem_pool_conv(c):
    """ResNet stem: Conv -> Relu -> MaxPool(3, s2, p1) -> Conv -> Conv (the 640x slow ResNet-18 pattern)."""
    g = G(3, 20)
    t = g.op("Relu", [g.conv("x", 3, c, k=7, stride=2, pad=3)])
    t = g.op("MaxPool", [t], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    t = g.op("Relu", [g.conv(t, c, c)])
    return g.model(g.conv(t, c, c, k=1, pad=0))


def case_residual_add_relu(c):
    """Conv -> Add(skip) -> Relu twice, then a strided block with a 1x1 projection on the skip."""
    g = G(c, 12)
    t = g.op("Relu", [g.conv("x", c, c)])
    t = g.op("Relu", [g.op("Add", [g.conv(t, c, c), "x"])])
    u = g.op("Relu", [g.conv(t, c, 2 * c, stride=2)])
    return g.model(g.op("Relu", [g.op("Add", [g.conv(u, 2 * c, 2 * c), g.conv(t, c, 2 * c, k=1, stride=2, pad=0)])]))


def case_depthwise_hardswish(c):
    """MobileNet: pointwise -> Clip(0,6) -> depthwise 3x3 (stride 2) -> HardSwish -> pointwise -> Add."""
    g = G(c, 14)
    t = g.op("Clip", [g.conv("x", c, 2 * c, k=1, pad=0), g.const(np.float32(0)), g.const(np.float32(6))])
    t = g.op("HardSwish", [g.conv(t, 2 * c, 2 * c, group=2 * c, stride=2)])
    t = g.conv(t, 2 * c, c, k=1, pad=0)
    return g.model(g.op("Add", [t, g.conv(t, c, c, group=c)]))


def case_se_block(c):
    """EfficientNet/RegNet SE: Conv -> SiLU (Sigmoid, Mul) -> GlobalAveragePool -> Conv -> Relu -> Conv ->
    HardSigmoid -> Mul(x, s) broadcast over H, W -> Conv; then a per-channel constant Mul and a scalar Add."""
    g = G(c, 10)
    x = g.conv("x", c, c)
    x = g.op("Mul", [x, g.op("Sigmoid", [x])])
    s = g.op("GlobalAveragePool", [x])
    s = g.op("Relu", [g.conv(s, c, 8, k=1, pad=0)])
    s = g.op("HardSigmoid", [g.conv(s, 8, c, k=1, pad=0)], alpha=1.0 / 6, beta=0.5)
    t = g.conv(g.op("Mul", [x, s]), c, c, k=1, pad=0)
    t = g.op("Mul", [t, g.const(np.linspace(0.5, 1.5, c, dtype=np.float32).reshape(c, 1, 1))])
    return g.model(g.conv(g.op("Add", [t, g.const(np.float32(0.25))]), c, c))


def case_concat_blocked(c):
    """DenseNet/GoogLeNet: Concat of conv branches on the channel axis -> Conv."""
    g = G(c, 9)
    a, b = g.conv("x", c, c), g.conv("x", c, c, k=1, pad=0)
    m = g.op("MaxPool", ["x"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    return g.model(g.conv(g.op("Concat", [a, b, m], axis=1), 3 * c, c))


def case_channel_shuffle(c):
    """ShuffleNet: Conv -> Reshape [N, 2, C/2, H, W] -> Transpose -> Reshape -> Conv."""
    g = G(c, 8)
    t = g.conv("x", c, c)
    t = g.op("Reshape", [t, g.const(np.array([0, 2, c // 2, 8, 8], dtype=np.int64))])
    t = g.op("Transpose", [t], perm=[0, 2, 1, 3, 4])
    t = g.op("Reshape", [t, g.const(np.array([0, c, 8, 8], dtype=np.int64))])
    return g.model(g.conv(t, c, c))


def case_resize_conv(c):
    """Decoder: Conv -> Resize (nearest, 2x) -> Conv."""
    g = G(c, 6)
    t = g.conv("x", c, c)
    t = g.op("Resize", [t, "", g.const(np.array([1, 1, 2, 2], dtype=np.float32))], mode="nearest")
    return g.model(g.conv(t, c, c))


def case_avgpool_ceil_flatten_gemm(c):
    """AveragePool (pads, ceil_mode) and MaxPool (ceil_mode) on blocked tensors -> Conv -> GAP -> Flatten -> Gemm."""
    g = G(c, 11)
    t = g.op("AveragePool", [g.conv("x", c, c)], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    t = g.op("MaxPool", [g.conv(t, c, c)], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)
    t = g.op("Flatten", [g.op("GlobalAveragePool", [g.conv(t, c, c)])])
    w = g.const((g.rng.standard_normal((10, c)) * 0.2).astype(np.float32))
    return g.model(g.op("Gemm", [t, w, g.const(np.zeros(10, np.float32))], transB=1))


def case_dense_block(c):
    """DenseNet: a 3-channel stem conv, two conv branches concatenated with it, a BatchNormalization no conv
    absorbs -> Relu -> 1x1 Conv, an all-zero Pad -> AveragePool (the transition), an Identity and an inference
    Dropout in the chain, then a final conv."""
    g = G(3, 12)
    s0 = g.op("Relu", [g.conv("x", 3, c)])
    a = g.conv(s0, c, 16)
    b = g.conv(g.op("Identity", [s0]), c, 16, k=1, pad=0)
    t = g.op("Concat", [s0, a, b], axis=1)
    bn = [g.const(np.linspace(0.5, 1.5, c + 32, dtype=np.float32)), g.const(np.linspace(-0.2, 0.2, c + 32, dtype=np.float32)),
          g.const(np.linspace(-0.1, 0.1, c + 32, dtype=np.float32)), g.const(np.linspace(0.5, 2.0, c + 32, dtype=np.float32))]
    t = g.op("Relu", [g.op("BatchNormalization", [t] + bn, epsilon=1e-5)])
    t = g.conv(t, c + 32, c, k=1, pad=0)
    t = g.op("Pad", [t, g.const(np.zeros(8, dtype=np.int64))], mode="constant")
    t = g.op("AveragePool", [t], kernel_shape=[2, 2], strides=[2, 2])
    t = g.op("Dropout", [t])
    return g.model(g.conv(t, c, c))


def case_expand_dw_s2(c):
    """An expand 1x1 conv (6c channels) feeding a stride-2 depthwise 3x3 conv, with and without biases and
    activations: engine/plan/fuse.c fuses each pair into one conv with a depthwise post-op."""
    g = G(3, 28)
    t = g.op("Relu", [g.conv("x", 3, c)])
    u = g.op("Clip", [g.conv(t, c, 6 * c, k=1, pad=0), g.const(np.float32(0)), g.const(np.float32(6))])
    u = g.op("Relu", [g.conv(u, 6 * c, 6 * c, group=6 * c, stride=2)])
    v = g.conv(g.conv(u, 6 * c, 2 * c, k=1, pad=0), 2 * c, 2 * c, group=2 * c, stride=2, bias=False)
    return g.model(g.conv(v, 2 * c, c, k=1, pad=0))


def case_mbconv(c):
    """MobileNet-V2 inverted residuals whose narrow width c (24: not a multiple of 16) sits between 6c-channel
    tensors: stem -> project to c -> 2 x (expand 6c, Relu6, depthwise, Relu6, project c, + skip) -> conv."""
    g = G(3, 16)
    t = g.op("Clip", [g.conv("x", 3, 32, stride=2), g.const(np.float32(0)), g.const(np.float32(6))])
    t = g.conv(t, 32, c, k=1, pad=0)
    for _ in range(2):
        u = g.op("Clip", [g.conv(t, c, 6 * c, k=1, pad=0), g.const(np.float32(0)), g.const(np.float32(6))])
        u = g.op("Clip", [g.conv(u, 6 * c, 6 * c, group=6 * c), g.const(np.float32(0)), g.const(np.float32(6))])
        t = g.op("Add", [g.conv(u, 6 * c, c, k=1, pad=0), t])
    return g.model(g.conv(t, c, 32))


CASES = {f.__name__[5:]: f for f in [case_expand_dw_s2, case_mbconv, case_dense_block, case_stem_pool_conv, case_residual_add_relu, case_depthwise_hardswish,
                                      case_se_block, case_concat_blocked, case_channel_shuffle, case_resize_conv,
                                      case_avgpool_ceil_flatten_gemm]}


def _feeds(model):
    shape = [2] + [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim[1:]]
    return {"x": np.random.default_rng(5).standard_normal(shape).astype(np.float32)}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("channels", [32, 24])
@pytest.mark.parametrize("case", list(CASES))
def test_layout_case_matches_ort(tensord, case, channels, threads):
    model = CASES[case](channels)
    feeds = _feeds(model)
    res = tensord.predict(tensord.save_model(model), feeds, threads=threads)
    assert_matches_ort(res, model, feeds)


def _bench(tensord, model, env):
    path = tensord.save_model(model)
    x = tensord.tmp / "x.npy"
    np.save(x, _feeds(model)["x"])
    cmd = [tensord.bin, "bench", "--model", str(path), "--input", f"x={x}", "--iterations", "1", "--warmup", "0",
           "--threads", "2"]
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, **env})
    assert cp.returncode == 0, f"tensord bench failed: {cp.stderr[-3000:]}"
    return cp.stdout + cp.stderr


@pytest.mark.parametrize("channels", [32, 24])
@pytest.mark.parametrize("case", list(CASES))
def test_layout_case_no_reference_kernels(tensord, case, channels):
    if not _avx512():
        pytest.skip("this CPU lacks AVX-512: oneDNN may rightly pick reference kernels here")
    out = _bench(tensord, CASES[case](channels), {"ONEDNN_VERBOSE": "1"})
    refs = [l for l in out.splitlines() if l.startswith("onednn_verbose,exec,") and l.split(",")[4].startswith("ref")]
    assert not refs, "oneDNN reference kernels ran:\n" + "\n".join(refs[:10])


@pytest.mark.parametrize("case", list(CASES))
def test_layout_case_no_slow_steps(tensord, case):
    out = _bench(tensord, CASES[case](32), {"TENSORD_PROFILE": "1"})
    assert "profile:" in out, f"TENSORD_PROFILE=1 printed no profile:\n{out[-2000:]}"
    slow = [l for l in out.splitlines() if "[SLOW]" in l or "slow path" in l]
    assert not slow, "slow steps:\n" + "\n".join(slow)


def test_dense_block_stays_blocked(tensord):
    """The DenseNet-style case at 32 channels negotiates one layout end to end: the only layout conversion is
    the last conv's output to the graph's plain NCHW, and the BatchNormalization ran as a conv."""
    out = _bench(tensord, case_dense_block(32), {"TENSORD_PROFILE": "1"})
    line = [l for l in out.splitlines() if "layout reorders inside steps" in l]
    assert line, out[-2000:]
    n = int(line[-1].split("profile:")[1].split()[0])
    assert n <= 1, f"expected at most 1 layout reorder, got {n}:\n{out[-4000:]}"
    assert "BatchNormalization" not in [l.split()[1] for l in out.splitlines() if l.startswith("  ") and len(l.split()) > 2], out[-3000:]


def test_narrow_stage_needs_no_conversion(tensord):
    """24-channel activations that only convs read take the zero-padded nChw16c layout: the MobileNet-style
    stage runs with no layout conversion but the last conv's output to plain NCHW."""
    out = _bench(tensord, case_mbconv(24), {"TENSORD_PROFILE": "1"})
    line = [l for l in out.splitlines() if "layout reorders inside steps" in l]
    assert line, out[-2000:]
    n = int(line[-1].split("profile:")[1].split()[0])
    assert n <= 1, f"expected at most 1 layout reorder, got {n}:\n{out[-4000:]}"


@pytest.mark.parametrize("split", ["0", "1"], ids=["fused", "two-primitives"])
def test_expand_depthwise_pair_fuses(tensord, split):
    """The 1x1 -> depthwise 3x3 pairs run as one step (oneDNN's depthwise post-op, `+dw3x3s<stride>`), or, with
    TENSORD_CONV_DW_SPLIT=1, as the fallback's two primitives in one step; both match onnxruntime."""
    env = {"TENSORD_CONV_DW_SPLIT": split} if split == "1" else {}
    model = case_expand_dw_s2(32)
    out = _bench(tensord, model, {"TENSORD_PROFILE": "1", **env})
    assert " steps=4 " in out, f"expected 4 steps (stem, two 1x1+depthwise pairs, last conv):\n{out[-3000:]}"
    block = out.split("mean ms per step", 1)[1].split("profile:", 1)[0]  # one plan's steps (split runs print one per chunk plan)
    steps = [l for l in block.splitlines()[1:] if l.startswith("  ") and len(l.split()) > 2]
    pairs = [l for l in steps if "+dw3x3s2" in l or ", then " in l]
    assert len(pairs) == 2, f"expected two fused 1x1+depthwise steps:\n{out[-3000:]}"
    if split == "1":
        assert all(", then " in l for l in pairs), "TENSORD_CONV_DW_SPLIT=1 still ran the fused primitive"
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        feeds = _feeds(model)
        assert_matches_ort(tensord.predict(tensord.save_model(model, "dw.onnx"), feeds, threads=2), model, feeds)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
