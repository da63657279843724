"""bench/models.py - deterministic ONNX builders for the benchmark and cross-check architectures.

Every builder returns an onnx.ModelProto (opset 17, float32, symbolic batch dimension "N") whose weights are
drawn from numpy's seeded PCG64 generator, so the same arguments always give byte-identical models. Weights use
He scaling (std = sqrt(2 / fan_in)) in front of ReLU and Glorot scaling elsewhere, so activations keep unit-ish
magnitude through the depth of the network and relative-error comparisons stay meaningful.

The default arguments are the benchmark sizes; tests/integration builds smaller versions of the same graphs by
passing smaller sizes.

  mlp          784-512-512-10, Gemm + Relu, Softmax             input x [N,784]          -> y [N,10]
  cnn          Conv(32,3x3 valid)+Relu, MaxPool 2x2, Flatten,    input x [N,1,28,28]      -> y [N,10]
               MatMul+Add 10, Softmax
  resnet       stem conv3x3/16+BN+Relu, 3 stages x 2 basic       input x [N,3,64,64]      -> y [N,10]
               blocks (16/32/64, stride 2 + 1x1 projection at
               stage 2 and 3 start), GlobalAveragePool, Flatten,
               Gemm 10
  transformer  4 BERT-style post-LN encoder layers, d=256,       input x [N,128,256]      -> y [N,128,256]
               4 heads, FFN 1024, Gelu as the Erf decomposition  (no pooled head: the output is the last
                                                                 layer's hidden states)

Run as a script to write all four to a directory: python bench/models.py OUTDIR
"""
import math
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
BATCH = "N"


class _Builder:
    """Collects nodes and initializers with unique names; one per model."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes = []
        self.inits = []
        self.count = {}

    def name(self, base):
        i = self.count.get(base, 0)
        self.count[base] = i + 1
        return f"{base}_{i}"

    def const(self, base, arr):
        n = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(arr), n))
        return n

    def weight(self, base, shape, fan_in, fan_out=None, he=False):
        if he:
            std = math.sqrt(2.0 / fan_in)
        else:
            std = math.sqrt(2.0 / (fan_in + (fan_out if fan_out is not None else fan_in)))
        return self.const(base, (self.rng.standard_normal(shape) * std).astype(np.float32))

    def small(self, base, shape, scale=0.05):
        return self.const(base, (self.rng.standard_normal(shape) * scale).astype(np.float32))

    def node(self, op, inputs, n_out=1, name=None, **attrs):
        nm = name or self.name(op.lower())
        outs = [f"{nm}_out{i}" if n_out > 1 else f"{nm}_out" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=nm, **attrs))
        return outs if n_out > 1 else outs[0]

    def model(self, graph_name, inputs, outputs):
        g = helper.make_graph(self.nodes, graph_name, inputs, outputs, initializer=self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tensord-bench")
        m.ir_version = 8
        onnx.checker.check_model(m)
        return m

    # ---- layers ----
    def dense(self, x, n_in, n_out, he=False, use_gemm=True):
        w = self.weight("W", (n_in, n_out), n_in, n_out, he=he)
        b = self.small("B", (n_out,))
        if use_gemm:
            return self.node("Gemm", [x, w, b])
        return self.node("Add", [self.node("MatMul", [x, w]), b])

    def conv(self, x, c_in, c_out, k, stride=1, pad=0, group=1, bias=True, he=True):
        fan_in = (c_in // group) * k * k
        w = self.weight("Wc", (c_out, c_in // group, k, k), fan_in, he=he)
        ins = [x, w] + ([self.small("Bc", (c_out,))] if bias else [])
        return self.node("Conv", ins, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, group=group)

    def bn(self, x, c):
        scale = self.const("bn_scale", (1.0 + 0.1 * self.rng.standard_normal(c)).astype(np.float32))
        bias = self.small("bn_bias", (c,), 0.1)
        mean = self.small("bn_mean", (c,), 0.1)
        var = self.const("bn_var", (1.0 + 0.2 * self.rng.random(c)).astype(np.float32))
        return self.node("BatchNormalization", [x, scale, bias, mean, var], epsilon=1e-5)

    def layernorm(self, x, d):
        g = self.const("ln_gamma", (1.0 + 0.1 * self.rng.standard_normal(d)).astype(np.float32))
        b = self.small("ln_beta", (d,), 0.1)
        return self.node("LayerNormalization", [x, g, b], axis=-1, epsilon=1e-5)

    def gelu_erf(self, x):
        # x * 0.5 * (1 + erf(x / sqrt(2))): the form onnxruntime fuses into Gelu.
        d = self.node("Div", [x, self.const("sqrt2", np.array(math.sqrt(2.0), np.float32))])
        e = self.node("Erf", [d])
        a = self.node("Add", [e, self.const("one", np.array(1.0, np.float32))])
        m = self.node("Mul", [x, a])
        return self.node("Mul", [m, self.const("half", np.array(0.5, np.float32))])


def _io(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def build_mlp(sizes=(784, 512, 512, 10), seed=1):
    """sizes[0] inputs, Gemm+Relu hidden layers, a Gemm to sizes[-1] logits and Softmax."""
    b = _Builder(seed)
    h = "x"
    for i in range(len(sizes) - 1):
        last = i == len(sizes) - 2
        h = b.dense(h, sizes[i], sizes[i + 1], he=not last)
        if not last:
            h = b.node("Relu", [h])
    b.node("Softmax", [h], name="y", axis=-1)
    b.nodes[-1].output[0] = "y"
    return b.model("mlp", [_io("x", [BATCH, sizes[0]])], [_io("y", [BATCH, sizes[-1]])])


def build_cnn(hw=28, c_in=1, channels=32, classes=10, seed=2):
    """Conv(channels,3x3,valid)+Relu -> MaxPool 2x2 -> Flatten -> MatMul+Add(classes) -> Softmax."""
    b = _Builder(seed)
    h = b.node("Relu", [b.conv("x", c_in, channels, 3)])
    h = b.node("MaxPool", [h], kernel_shape=[2, 2], strides=[2, 2])
    side = (hw - 2) // 2
    h = b.node("Flatten", [h], axis=1)
    h = b.dense(h, channels * side * side, classes, use_gemm=False)
    b.node("Softmax", [h], name="y", axis=-1)
    b.nodes[-1].output[0] = "y"
    return b.model("cnn", [_io("x", [BATCH, c_in, hw, hw])], [_io("y", [BATCH, classes])])


def build_resnet(hw=64, c_in=3, widths=(16, 32, 64), blocks=2, classes=10, seed=3):
    """ResNet-style: stem conv3x3+BN+Relu, len(widths) stages of `blocks` basic blocks; the first block of every
    stage after the first has stride 2 and a 1x1 stride-2 projection conv (+BN) on the skip path."""
    b = _Builder(seed)
    h = b.node("Relu", [b.bn(b.conv("x", c_in, widths[0], 3, pad=1, bias=False), widths[0])])
    c = widths[0]
    for si, w in enumerate(widths):
        for bi in range(blocks):
            stride = 2 if (si > 0 and bi == 0) else 1
            y = b.node("Relu", [b.bn(b.conv(h, c, w, 3, stride=stride, pad=1, bias=False), w)])
            y = b.bn(b.conv(y, w, w, 3, pad=1, bias=False), w)
            skip = h
            if stride != 1 or c != w:
                skip = b.bn(b.conv(h, c, w, 1, stride=stride, bias=False), w)
            h = b.node("Relu", [b.node("Add", [y, skip])])
            c = w
    h = b.node("GlobalAveragePool", [h])
    h = b.node("Flatten", [h], axis=1)
    w_ = b.weight("W", (classes, c), c, classes)
    b.node("Gemm", [h, w_, b.small("B", (classes,))], name="y", transB=1)
    b.nodes[-1].output[0] = "y"
    return b.model("resnet", [_io("x", [BATCH, c_in, hw, hw])], [_io("y", [BATCH, classes])])


def build_resnet50(hw=224, classes=1000, seed=5):
    """ResNet-50 v1.5's shape (torchvision's): stem conv7x7/2 + BN + Relu + MaxPool3x3/2, bottleneck stages of
    3, 4, 6, 3 blocks (1x1 -> 3x3 (stride here) -> 1x1 x4, projection on the first block of each stage), global
    average pool, Dense(classes). Random weights: for GPU runs where torchvision is absent (tests/gpu/run.sh); input
    "x" [N, 3, hw, hw], output "y" [N, classes]."""
    b = _Builder(seed)
    h = b.node("Relu", [b.bn(b.conv("x", 3, 64, 7, stride=2, pad=3, bias=False), 64)])
    h = b.node("MaxPool", [h], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c = 64
    for si, (w, n) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3))):
        for bi in range(n):
            stride = 2 if (si > 0 and bi == 0) else 1
            y = b.node("Relu", [b.bn(b.conv(h, c, w, 1, bias=False), w)])
            y = b.node("Relu", [b.bn(b.conv(y, w, w, 3, stride=stride, pad=1, bias=False), w)])
            y = b.bn(b.conv(y, w, 4 * w, 1, bias=False), 4 * w)
            skip = h if (stride == 1 and c == 4 * w) else b.bn(b.conv(h, c, 4 * w, 1, stride=stride, bias=False), 4 * w)
            h = b.node("Relu", [b.node("Add", [y, skip])])
            c = 4 * w
    h = b.node("Flatten", [b.node("GlobalAveragePool", [h])], axis=1)
    b.node("Gemm", [h, b.weight("W", (classes, c), c, classes), b.small("B", (classes,))], name="y", transB=1)
    b.nodes[-1].output[0] = "y"
    return b.model("resnet50", [_io("x", [BATCH, 3, hw, hw])], [_io("y", [BATCH, classes])])


def build_transformer(layers=4, d=256, heads=4, seq=128, ffn=1024, seed=4):
    """Post-LN BERT encoder layers over float embeddings x [N,seq,d]; output y [N,seq,d] (hidden states)."""
    assert d % heads == 0
    dh = d // heads
    b = _Builder(seed)
    split = b.const("shape_split", np.array([0, 0, heads, dh], np.int64))  # 0 copies N and seq
    merge = b.const("shape_merge", np.array([0, 0, d], np.int64))
    scale = b.const("scale", np.array(1.0 / math.sqrt(dh), np.float32))
    h = "x"
    for _ in range(layers):
        q = b.node("Transpose", [b.node("Reshape", [b.dense(h, d, d, use_gemm=False), split])], perm=[0, 2, 1, 3])
        k = b.node("Transpose", [b.node("Reshape", [b.dense(h, d, d, use_gemm=False), split])], perm=[0, 2, 3, 1])
        v = b.node("Transpose", [b.node("Reshape", [b.dense(h, d, d, use_gemm=False), split])], perm=[0, 2, 1, 3])
        s = b.node("Mul", [b.node("MatMul", [q, k]), scale])  # [N,H,S,S]
        p = b.node("Softmax", [s], axis=-1)
        a = b.node("MatMul", [p, v])  # [N,H,S,dh]
        a = b.node("Reshape", [b.node("Transpose", [a], perm=[0, 2, 1, 3]), merge])
        o = b.dense(a, d, d, use_gemm=False)
        h = b.layernorm(b.node("Add", [o, h]), d)
        f = b.gelu_erf(b.dense(h, d, ffn, use_gemm=False))
        f = b.dense(f, ffn, d, use_gemm=False)
        h = b.layernorm(b.node("Add", [f, h]), d)
    b.nodes[-1].output[0] = "y"
    return b.model("transformer", [_io("x", [BATCH, seq, d])], [_io("y", [BATCH, seq, d])])


BENCH_MODELS = {
    "mlp": (build_mlp, (784,)),
    "cnn": (build_cnn, (1, 28, 28)),
    "resnet": (build_resnet, (3, 64, 64)),
    "transformer": (build_transformer, (128, 256)),
}


def make_input(per_sample_shape, batch, seed=0):
    """Standard-normal float32 input [batch, *per_sample_shape], seeded."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch,) + tuple(per_sample_shape)).astype(np.float32)


def write_model(model, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    onnx.save_model(model, path)
    return path


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "out")
    for name, (fn, _) in BENCH_MODELS.items():
        p = write_model(fn(), os.path.join(out, name, "model.onnx"))
        print(p)
