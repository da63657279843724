"""bench/quant_bench.py - tensord's oneDNN int8 kernels against onnxruntime on the same QOperator int8 models.

Not a test. Builds an MLP-ish (784-512-256-10, MatMul+Relu) and a CNN-ish (3x32x32 -> three Conv 3x3 + Relu stages
with MaxPool -> MatMul 10) float model with onnx.helper, quantizes both with onnxruntime.quantization.quantize_static
in QOperator format (uint8 activations, int8 weights, per tensor and per channel; no bias Add, so only
default-domain ops: QuantizeLinear, QLinearMatMul, QLinearConv, MaxPool, DequantizeLinear ...), then times
`tensord bench` (median of its runs) against onnxruntime session.run (median) at the same thread count, and prints
the ratio tensord / onnxruntime (< 1: tensord faster). With --ref it also times tensord with TENSORD_QUANT_REF=1,
the reference C loops, to show what the oneDNN path buys. Also prints the max difference of the outputs in
quantization steps of the last DequantizeLinear. Writes nothing outside a temp dir.

  .venv/bin/python bench/quant_bench.py [--binary build/hd/tensord] [--threads 2] [--batch 16] [--ref]
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import ort_session, parse_bench, run_tensord, time_ort  # noqa: E402

F = TensorProto.FLOAT


def randn(shape, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def make(nodes, x_shape, y_shape, inits):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, x_shape)],
                          [helper.make_tensor_value_info("y", F, y_shape)],
                          initializer=[numpy_helper.from_array(a, n) for n, a in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="tensord-bench")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def mlp():
    sizes, nodes, inits, h = [784, 512, 256, 10], [], [], "x"
    for i in range(3):
        nodes.append(helper.make_node("MatMul", [h, f"W{i}"], [f"m{i}"]))
        inits.append((f"W{i}", randn((sizes[i], sizes[i + 1]), 1 + i, 1.0 / np.sqrt(sizes[i]))))
        h = f"m{i}"
        if i < 2:
            nodes.append(helper.make_node("Relu", [h], [f"r{i}"]))
            h = f"r{i}"
    nodes[-1].output[0] = "y"
    return make(nodes, ["N", 784], ["N", 10], inits), (784,)


def cnn():
    nodes, inits, h, c = [], [], "x", 3
    for i, m in enumerate([32, 64, 128]):
        nodes += [helper.make_node("Conv", [h, f"Wc{i}", f"Bc{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        inits += [(f"Wc{i}", randn((m, c, 3, 3), 20 + i, 1.0 / np.sqrt(9 * c))), (f"Bc{i}", randn((m,), 30 + i, 0.1))]
        h, c = f"r{i}", m
        if i < 2:
            nodes.append(helper.make_node("MaxPool", [h], [f"p{i}"], kernel_shape=[2, 2], strides=[2, 2]))
            h = f"p{i}"
    nodes += [helper.make_node("Flatten", [h], ["f"]), helper.make_node("MatMul", ["f", "Wf"], ["y"])]
    inits.append(("Wf", randn((128 * 8 * 8, 10), 40, 0.01)))
    return make(nodes, ["N", 3, 32, 32], ["N", 10], inits), (3, 32, 32)


class Calib(CalibrationDataReader):
    def __init__(self, shape):
        self.it = iter([{"x": randn((8,) + shape, 100 + i)} for i in range(8)])

    def get_next(self):
        return next(self.it, None)


def last_dq_scale(model):
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in reversed(model.graph.node):
        if n.op_type == "DequantizeLinear" and n.input[1] in inits:
            return float(np.max(inits[n.input[1]]))
    return None


def bench_one(args, tmp, name, model, shape, per_channel):
    src, dst = os.path.join(tmp, f"{name}.onnx"), os.path.join(tmp, f"{name}-q.onnx")
    onnx.save(model, src)
    quantize_static(src, dst, Calib(shape), quant_format=QuantFormat.QOperator, per_channel=per_channel,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    q = onnx.load(dst)
    domains = {n.domain for n in q.graph.node} - {"", "ai.onnx"}
    ops = sorted({n.op_type for n in q.graph.node})
    label = f"{name}{' per-channel' if per_channel else ''} batch {args.batch}"
    if domains:
        print(f"{label}: skipped, non-default domains {domains}")
        return
    x = randn((args.batch,) + shape, 7)
    xf = os.path.join(tmp, f"{name}-x.npy")
    np.save(xf, x)
    sess = ort_session(dst, args.threads)
    outs, times, n, _ = time_ort(sess, {"x": x}, 20, args.iterations, 5.0, 20)
    ort_ms = float(np.median(times))
    cmd = [args.binary, "bench", "--model", dst, "--input", f"x={xf}", "--threads", str(args.threads),
           "--iterations", str(args.iterations), "--warmup", "20"]

    def tensord_ms(env=None):
        # OpenMP's team size pinned to --threads, as onnxruntime's pool is: on a machine shared with other work a
        # default-sized team waits a scheduler tick at every barrier
        cp, err, _ = run_tensord(cmd, 300, {"OMP_NUM_THREADS": str(args.threads), **(env or {})})
        if cp is None:
            return None, err
        return parse_bench(cp.stdout)[0], cp.stderr

    td, err = tensord_ms()
    if td is None:
        print(f"{label}: tensord failed: {err}")
        return
    slow = [ln for ln in err.splitlines() if "slow path" in ln]
    pred = os.path.join(tmp, f"{name}-out")
    subprocess.run([args.binary, "predict", "--model", dst, "--input", f"x={xf}", "--output-dir", pred,
                    "--threads", str(args.threads)], check=True, capture_output=True)
    got = np.load(os.path.join(pred, "y.npy"))
    step = last_dq_scale(q)
    diff = float(np.max(np.abs(got - outs[0])))
    line = (f"{label}: ops {','.join(ops)}\n  tensord {td:.3f} ms  onnxruntime {ort_ms:.3f} ms  "
            f"ratio {td / ort_ms:.2f}x  max|diff| {diff:.3g}" + (f" = {diff / step:.2f} steps" if step else ""))
    if args.ref:
        rms, _ = tensord_ms({"TENSORD_QUANT_REF": "1"})
        if rms:
            line += f"\n  tensord reference loops {rms:.3f} ms (oneDNN path {rms / td:.1f}x faster)"
    if slow:
        line += "\n  slow paths: " + "; ".join(slow[:3])
    print(line, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=os.path.join(os.path.dirname(HERE), "build", "tensord"))
    ap.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 1))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--ref", action="store_true", help="also time the reference C loops (TENSORD_QUANT_REF=1)")
    args = ap.parse_args()
    print(f"threads {args.threads}, onnxruntime vs {args.binary}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (model, shape) in (("mlp", mlp()), ("cnn", cnn())):
            for pc in (False, True):
                bench_one(args, tmp, name, model, shape, pc)


if __name__ == "__main__":
    main()
