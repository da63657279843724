"""bench/rnn_bench.py - recurrent text classifiers on the CPU: tensord vs onnxruntime, measured in the same run.

  .venv/bin/python bench/rnn_bench.py                 # all four models, batches 1 and 32, 2 threads
  .venv/bin/python bench/rnn_bench.py --save          # also writes bench/results/rnn-lstm-cpu.md
  .venv/bin/python bench/rnn_bench.py --quick         # smoke run
  .venv/bin/python bench/rnn_bench.py --impl plain    # force tensord's implementation (TENSORD_RNN_IMPL=plain|onednn)
  .venv/bin/python bench/rnn_bench.py --check         # cross-check tensord against onnxruntime on ~90 small RNN/GRU/LSTM
                                                       # nodes (directions, lengths, states, peepholes, clip, activations)

Models (float32, opset 14, seeded weights, symbolic batch N), written as an exporter writes them (PyTorch's
nn.Embedding + nn.LSTM(batch_first=True) + nn.Linear: Gather, Transpose to time-major, the recurrent op with B and
no initial_h, the last hidden state, Gemm):
  lstm:  ids int64 [N, 64] -> Gather(10k x 128) -> Transpose -> LSTM hidden 256 -> Y_h [1, N, 256] -> Squeeze
         -> Gemm 2 -> [N, 2]
  bigru: the same with a bidirectional GRU (linear_before_reset=1, as PyTorch exports it) hidden 256 -> Y_h
         [2, N, 256] -> Transpose -> Reshape [N, 512] -> Gemm 2 -> [N, 2]
For each model and batch: alternating rounds of onnxruntime runs (intra_op threads = --threads, inter_op 1) and one
`tensord bench` process with the same thread count, the same model file and the same inputs (bench/common.py's
alternate); the printed ratio is tensord median / ORT median (< 1: tensord faster). Outputs are compared with
`tensord predict` (max rel err <= 1e-4).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402

VOCAB, EMB, HID, SEQ, CLASSES = 10000, 128, 256, 64, 2


def build_model(kind, seed=0):
    rng = np.random.default_rng(seed)

    def init(name, shape, scale):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    bi = kind == "bigru"
    D, G = (2, 3) if bi else (1, 4)
    s = 1.0 / np.sqrt(HID)
    inits = [init("emb", (VOCAB, EMB), 1.0), init("W", (D, G * HID, EMB), s), init("R", (D, G * HID, HID), s),
             init("B", (D, 2 * G * HID), s), init("fc_w", (CLASSES, D * HID), 1.0 / np.sqrt(D * HID)),
             init("fc_b", (CLASSES,), 0.1),
             numpy_helper.from_array(np.array([0], np.int64), "axes0"),
             numpy_helper.from_array(np.array([-1, D * HID], np.int64), "flat")]
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["e"], axis=0),
             helper.make_node("Transpose", ["e"], ["x"], perm=[1, 0, 2])]
    if bi:
        nodes += [helper.make_node("GRU", ["x", "W", "R", "B"], ["", "h"], hidden_size=HID, direction="bidirectional",
                                   linear_before_reset=1),
                  helper.make_node("Transpose", ["h"], ["ht"], perm=[1, 0, 2]),
                  helper.make_node("Reshape", ["ht", "flat"], ["last"])]
    else:
        nodes += [helper.make_node("LSTM", ["x", "W", "R", "B"], ["", "h"], hidden_size=HID),
                  helper.make_node("Squeeze", ["h", "axes0"], ["last"])]
    nodes.append(helper.make_node("Gemm", ["last", "fc_w", "fc_b"], ["logits"], transB=1))
    g = helper.make_graph(nodes, kind, [helper.make_tensor_value_info("ids", TP.INT64, ["N", SEQ])],
                          [helper.make_tensor_value_info("logits", TP.FLOAT, ["N", CLASSES])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)], producer_name="tensord-bench")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def build_keras(kind, seed=0):
    """What a Keras user exports: the same classifier written in Keras 3 and converted by tf2onnx (opset 17).
    keras_masked_lstm: Embedding(mask_zero=True) -> LSTM(256) -> Dense(2), which tf2onnx writes as a Loop whose body
    is the LSTM cell with the mask; keras_gru: Embedding -> GRU(256) -> Dense(2), a Loop too (tf2onnx never emits an
    ONNX GRU for Keras). Returns (model, input name, output file name as `tensord predict` writes it)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf  # noqa: E402 (heavy: only when asked for)
    import tf2onnx  # noqa: E402
    tf.keras.utils.set_random_seed(seed)
    inp = tf.keras.Input((SEQ,), dtype="int32")
    x = tf.keras.layers.Embedding(VOCAB, EMB, mask_zero=kind == "keras_masked_lstm")(inp)
    x = (tf.keras.layers.LSTM(HID) if kind == "keras_masked_lstm" else tf.keras.layers.GRU(HID))(x)
    km = tf.keras.Model(inp, tf.keras.layers.Dense(CLASSES)(x))
    spec = (tf.TensorSpec((None, SEQ), tf.int32, name="ids"),)
    fn = tf.function(lambda v: km(v), input_signature=spec)
    m, _ = tf2onnx.convert.from_function(fn, input_signature=spec, opset=17)
    return m, m.graph.output[0].name.replace(":", "_")


def predict_err(binary, model_path, feed_files, want, threads, env, out_file="logits"):
    with tempfile.TemporaryDirectory() as d:
        cp, err, _ = common.run_tensord([binary, "predict", "--model", model_path, *common.input_args(feed_files),
                                         "--output-dir", d, "--threads", str(threads)], 300, env)
        if cp is None:
            return None, "predict " + err
        got = np.load(os.path.join(d, out_file + ".npy"))
        return common.max_rel_err(got, want), ""


def main_bench(a):
    binary = a.bin
    outdir = a.out
    os.makedirs(outdir, exist_ok=True)
    env = {"TENSORD_RNN_IMPL": a.impl} if a.impl else None
    if env:
        os.environ.update(env)  # the tensord children inherit it
    load_start = os.getloadavg()[0]
    t_start = time.perf_counter()
    notes, rows = [], []
    for kind in a.models.split(","):
        mdir = os.path.join(outdir, kind)
        os.makedirs(mdir, exist_ok=True)
        path = os.path.join(mdir, "model.onnx")
        keras = kind.startswith("keras_")
        m, out_file = build_keras(kind) if keras else (build_model(kind), "logits")
        onnx.save(m, path)
        for batch in [int(b) for b in a.batches.split(",")]:
            ids = np.random.default_rng(batch).integers(1, VOCAB, (batch, SEQ)).astype(np.int32 if keras else np.int64)
            if kind == "keras_masked_lstm":  # padded text: row r keeps 64 - 2r tokens (at least 16)
                for r in range(batch):
                    ids[r, max(16, SEQ - 2 * r):] = 0
            f = os.path.join(mdir, f"ids_b{batch}.npy")
            np.save(f, ids)
            sess = common.ort_session(path, a.threads)
            r = common.alternate(sess, {"ids": ids}, {"ids": f}, binary=binary, model_path=path,
                                 label=f"{kind} b{batch}", rounds=a.rounds, warmup=a.warmup,
                                 iterations=a.iterations, budget=a.budget, min_iterations=a.min_iterations,
                                 threads=a.threads, timeout=lambda n, ms: 60 + n * ms * 20 / 1e3, notes=notes)
            err, why = (None, r["td_err"]) if r["td_med"] is None else predict_err(binary, path, {"ids": f},
                                                                                  r["ort_outs"][0], a.threads, env,
                                                                                  out_file)
            status = why or ("ok" if err is not None and err <= common.TOL else "MISMATCH")
            ratio = r["td_med"] / r["ort_med"] if r["td_med"] else None
            rows.append((kind, batch, r["td_med"], r["ort_med"], ratio, r["td_p90"], r["ort_p90"], err, r["n"], status))
            print(f"{kind:6s} b{batch:<3d} tensord {common.fmt(r['td_med'])} ms  ORT {common.fmt(r['ort_med'])} ms  "
                  f"ratio {common.fmt(ratio, 2)}  err {err if err is None else f'{err:.1e}'}  {status}", flush=True)
    body = ["| model | batch | tensord median ms | ORT median ms | ratio tensord/ORT | tensord p90 ms | ORT p90 ms | "
            "max rel err | ORT runs | status |", "|---|---|---|---|---|---|---|---|---|---|"]
    for k, b, tm, om, ra, tp, op, e, n, st in rows:
        body.append(f"| {k} | {b} | {common.fmt(tm)} | {common.fmt(om)} | {common.fmt(ra, 2)} | {common.fmt(tp)} | "
                    f"{common.fmt(op)} | {'n/a' if e is None else f'{e:.1e}'} | {n} | {st} |")
    impl = describe_impl(binary, outdir, a.threads, env)
    intro = ("Generated by `.venv/bin/python bench/rnn_bench.py --save` (see the docstring of bench/rnn_bench.py). "
             "Median/p90 of one inference of the whole batch (ms); ratio < 1 means tensord is faster. Models: "
             f"Embedding {EMB} over a {VOCAB // 1000}k vocabulary (Gather), sequence {SEQ}, hidden {HID}, last hidden "
             "state -> Gemm to 2 classes; lstm = LSTM, bigru = bidirectional GRU with linear_before_reset=1 (both "
             "written as PyTorch exports them); keras_masked_lstm / keras_gru = the same classifier in Keras 3 "
             "(Embedding(mask_zero=True) -> LSTM, and Embedding -> GRU) converted by tf2onnx, which writes both as an "
             "ONNX Loop over the cell (the masked rows are padded: row r has max(16, 64 - 2r) tokens).")
    common.write_result("CPU recurrent models: tensord vs onnxruntime", intro, a.threads, load_start,
                        [f"onnxruntime: {common.ort.__version__} (CPUExecutionProvider, intra_op {a.threads}, "
                         "inter_op 1, sequential, ORT_ENABLE_ALL)", f"tensord recurrent kernel: {impl}"],
                        body, notes, "rnn-lstm-cpu.md" if a.save else None)
    common.print_notes([], load_start, "rnn_bench", t_start)
    return 0 if all(r[-1] == "ok" for r in rows) else 1


def describe_impl(binary, outdir, threads, env):
    """What tensord's recurrent kernel chose, per model, from TENSORD_PROFILE's per-step lines."""
    out = []
    for kind in ("lstm", "bigru"):
        path = os.path.join(outdir, kind, "model.onnx")
        f = os.path.join(outdir, kind, "ids_b32.npy")
        if not os.path.exists(path) or not os.path.exists(f):
            continue
        cp, _, _ = common.run_tensord([binary, "bench", "--model", path, "--input", f"ids={f}", "--iterations", "1",
                                       "--warmup", "0", "--threads", str(threads)], 120,
                                      {**(env or {}), "TENSORD_PROFILE": "1"})
        text = (cp.stdout + cp.stderr) if cp is not None else ""
        line = next((ln for ln in text.splitlines() if ("LSTM" in ln or "GRU" in ln) and ("plain" in ln or "onednn" in ln)), "")
        for key in ("onednn", "plain"):
            if key in line:
                out.append(f"{kind}: " + line[line.index(key):].strip())
                break
    return "; ".join(out) or "(not reported)"


# ---- --check: tensord against onnxruntime on small nodes ----

def check_case(binary, op, direction="forward", layout=0, lens=None, h0=False, c0=False, P=False, B_=True, attrs=None,
               S=5, Bt=3, I=4, H=6, outs=("Y", "Yh", "Yc"), init=False, seed=0, threads=2):
    import onnxruntime as ort
    attrs = dict(attrs or {})
    G = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    D = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(seed)
    feeds = {"X": rng.standard_normal((Bt, S, I) if layout else (S, Bt, I)).astype(np.float32),
             "W": (rng.standard_normal((D, G * H, I)) * 0.5).astype(np.float32),
             "R": (rng.standard_normal((D, G * H, H)) * 0.5).astype(np.float32)}
    if B_:
        feeds["B"] = (rng.standard_normal((D, 2 * G * H)) * 0.5).astype(np.float32)
    if lens is not None:
        feeds["sl"] = np.array(lens, np.int32)
    hs = (Bt, D, H) if layout else (D, Bt, H)
    if h0:
        feeds["h0"] = rng.standard_normal(hs).astype(np.float32)
    if c0 and op == "LSTM":
        feeds["c0"] = rng.standard_normal(hs).astype(np.float32)
    if P and op == "LSTM":
        feeds["P"] = (rng.standard_normal((D, 3 * H)) * 0.5).astype(np.float32)
    order = ["X", "W", "R", "B", "sl", "h0", "c0", "P"][:8 if op == "LSTM" else 6]
    ins = [n if n in feeds else "" for n in order]
    while ins and ins[-1] == "":
        ins.pop()
    outs = [o for o in outs if not (o == "Yc" and op != "LSTM")]
    allouts = ["Y", "Yh", "Yc"][:3 if op == "LSTM" else 2]
    nouts = [o if o in outs else "" for o in allouts]
    while nouts and nouts[-1] == "":
        nouts.pop()
    weights = ("W", "R", "B", "P")

    def model(lay, with_inits, shapes):
        at = dict(attrs, layout=1) if lay else attrs
        node = helper.make_node(op, ins, nouts, hidden_size=H, direction=direction, **at)
        inits = [numpy_helper.from_array(feeds[n], n) for n in feeds if with_inits and n in weights]
        gin = [helper.make_tensor_value_info(n, TP.INT32 if n == "sl" else TP.FLOAT, feeds[n].shape if shapes else None)
               for n in feeds if not (with_inits and n in weights)]
        g = helper.make_graph([node], "g", gin, [helper.make_tensor_value_info(o, TP.FLOAT, None) for o in outs],
                              initializer=inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
        m.ir_version = 8
        return m

    # onnxruntime's CPU kernels refuse layout=1: its answer comes from the layout-0 node on transposed tensors
    f0 = {k: (v.transpose(1, 0, 2) if layout and k in ("X", "h0", "c0") else v) for k, v in feeds.items()}
    w0 = ort.InferenceSession(model(0, False, False).SerializeToString(), providers=["CPUExecutionProvider"]).run(None, f0)
    want = [w.transpose(2, 0, 1, 3) if layout and o == "Y" else w.transpose(1, 0, 2) if layout else w
            for o, w in zip(outs, w0)]
    with tempfile.TemporaryDirectory() as d:
        onnx.save(model(layout, init, True), d + "/m.onnx")
        cmd = [binary, "predict", "--model", d + "/m.onnx", "--output-dir", d + "/out", "--threads", str(threads)]
        for k, v in feeds.items():
            if init and k in weights:
                continue
            np.save(f"{d}/{k}.npy", v)
            cmd += ["--input", f"{k}={d}/{k}.npy"]
        cp = subprocess.run(cmd, capture_output=True, text=True)
        if cp.returncode:
            return f"FAIL tensord: {cp.stderr.strip()[-300:]}"
        errs = []
        for o, w in zip(outs, want):
            got = np.load(f"{d}/out/{o}.npy")
            if got.shape != w.shape:
                return f"FAIL shape {o} {got.shape} vs {w.shape}"
            errs.append(common.max_rel_err(got, w))
    e = max(errs)
    return ("ok" if e < 1e-5 else "FAIL") + f" max rel err {e:.1e}"


def check_cases():
    C = []
    for op in ["LSTM", "GRU", "RNN"]:
        for direction in ["forward", "reverse", "bidirectional"]:
            for layout in [0, 1]:
                C.append(dict(op=op, direction=direction, layout=layout, h0=True, c0=True))
                C.append(dict(op=op, direction=direction, layout=layout, lens=[5, 2, 3], init=True))
                C.append(dict(op=op, direction=direction, layout=layout, lens=[4, 0, 5], h0=True, c0=True))
        C.append(dict(op=op, direction="bidirectional", H=64, Bt=5, I=16, S=7, lens=[7, 3, 1, 6, 7], h0=True, c0=True,
                      init=True))
        C.append(dict(op=op, direction="bidirectional", H=64, Bt=1, I=16, S=7, h0=True, init=True, threads=1))
        C.append(dict(op=op, H=96, Bt=7, I=8, S=4, h0=True, init=True))
        C.append(dict(op=op, attrs={"clip": 0.7}, h0=True))
        C.append(dict(op=op, outs=("Yh",)))
        C.append(dict(op=op, outs=("Y",), B_=False))
    for lbr in [0, 1]:
        C.append(dict(op="GRU", attrs={"linear_before_reset": lbr}, h0=True, lens=[5, 1, 3]))
        C.append(dict(op="GRU", direction="bidirectional", attrs={"linear_before_reset": lbr}, H=80, Bt=4, init=True))
        C.append(dict(op="GRU", attrs={"linear_before_reset": lbr, "activations": ["HardSigmoid", "LeakyRelu"],
                                       "activation_alpha": [0.3, 0.1], "activation_beta": [0.4]}))
    C.append(dict(op="LSTM", P=True, h0=True, c0=True, direction="bidirectional"))
    C.append(dict(op="LSTM", attrs={"input_forget": 1}, P=True, h0=True, c0=True))
    C.append(dict(op="LSTM", attrs={"activations": ["HardSigmoid", "ScaledTanh", "Affine"],
                                    "activation_alpha": [0.3, 0.7, 1.5], "activation_beta": [0.4, 1.2, 0.1]}))
    C.append(dict(op="LSTM", direction="bidirectional",
                  attrs={"activations": ["Sigmoid", "Softsign", "Softplus", "sigmoid", "elu", "thresholdedrelu"],
                         "activation_alpha": [0.5, 0.2]}))
    C.append(dict(op="RNN", attrs={"activations": ["Relu"]}))
    C.append(dict(op="RNN", attrs={"activations": ["LeakyRelu"]}))
    C.append(dict(op="RNN", attrs={"activations": ["Sigmoid", "Relu"]}, direction="bidirectional"))
    C.append(dict(op="GRU", attrs={"activations": ["Sigmoid", "LeakyRelu"], "activation_alpha": [0.3]}))
    return C


def main_check(a):
    cases = check_cases()
    bad = 0
    for c in cases:
        r = check_case(a.bin, **c)
        if not r.startswith("ok"):
            bad += 1
        if bad and not r.startswith("ok") or a.verbose:
            print(r, c, flush=True)
    print(f"rnn --check: {len(cases) - bad}/{len(cases)} nodes match onnxruntime")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.environ.get("TENSORD_BIN", os.path.join(common.ROOT, "build", "tensord")))
    ap.add_argument("--out", default=os.path.join(common.ROOT, "bench", "out", "rnn"))
    ap.add_argument("--models", default="lstm,bigru,keras_masked_lstm,keras_gru")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--min-iterations", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--budget", type=float, default=6.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--impl", choices=["plain", "onednn"], help="force tensord's recurrent implementation")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--save", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.iterations, a.budget, a.rounds, a.min_iterations = 20, 1.0, 2, 2
    if a.check:
        return main_check(a)
    return main_bench(a)


if __name__ == "__main__":
    sys.exit(main())
