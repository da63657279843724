"""Recurrent and control-flow models made by real exporters (tf2onnx, torch.onnx) and by onnx.helper: tensord against
onnxruntime on the same inputs.

Comparison rule here: shapes and dtypes equal, integers exact, floats max|tensord - ort| <= 1e-4 * max(1, max|ort|)
(conftest's rule with an absolute floor of 1e-4 for outputs smaller than 1; the models are scaled so that their
outputs are of order 1). onnxruntime runs with graph optimisations off. Before tensord is asked,
every exported model is checked against its own framework (onnxruntime vs Keras / PyTorch, same rule), so a failure
that names tensord is tensord's.

  test_exported[model-case]    `tensord predict` on the models tests/integration/rnn_export.py writes (cached in
                               build/rnn-models/, re-exported when the exporter's settings change). What each graph
                               holds (EXPECT_OPS asserts the key ops: an exporter that changes its output is noticed):
      keras_lstm          tf2onnx 1.17, opset 17: Embedding (Gather) -> ONNX LSTM (forward, activations Sigmoid/Tanh/
                          Tanh, initial_h/c from Expand of zeros) -> MatMul+Add.  Needs: LSTM
      keras_bigru         Bidirectional(GRU(16)): tf2onnx does NOT rewrite Keras 3 GRUs into ONNX GRU (reset_after
                          True or False): two Loop nodes (forward, and backward over ReverseSequence) whose bodies
                          hold the GRU cell (MatMul/Split/Sigmoid/Tanh), trip count from Max of the sequence length,
                          TF's while-loop condition (Less/And) as the Loop's cond.  Needs: Loop (+ outer-scope reads)
      keras_masked_lstm   Embedding(mask_zero=True) -> LSTM: one Loop whose body is the LSTM cell plus the mask
                          select (Cast/Mul/Add of the per-step mask), padded rows (zeros at the end).  Needs: Loop
      keras_lstm_stack    LSTM(24, return_sequences) -> LSTM(16) -> Dense on float series: two ONNX LSTM nodes.
                          Needs: LSTM
      keras_simplernn, keras_gru_v1   SimpleRNN(16) and GRU(16, reset_after=False): tf2onnx writes both as a Loop
                          over the cell.  Needs: Loop
      keras_bilstm_seq    Bidirectional(LSTM(12, return_sequences)) -> Dense per step: one bidirectional LSTM.
      keras_conv_lstm_back  Conv1D(relu) -> LSTM(go_backwards) -> Dense: Conv, then an LSTM over ReverseSequence.
      torch_rnn_relu_h0   nn.RNN(8, 16, 2 layers, nonlinearity=relu, bidirectional), time-major, h0 an input: two
                          RNN nodes with activations Relu.  Needs: RNN
      torch_script_while  a scripted `while` on a data-dependent condition (no trip count), cases where it runs
                          and where it never does.  Needs: Loop with cond only
      torch_lstm          torch 1.13, opset 14: nn.LSTM(8,16, num_layers=2, bidirectional, batch_first), dynamic
                          N and T: two LSTM nodes (direction=bidirectional, no activations attribute), outputs y, h, c.
                          Needs: LSTM (bidirectional, Y layout [T,2,N,H] reshaped by torch's Transpose/Reshape)
      torch_gru           the same with nn.GRU: two GRU nodes, linear_before_reset=1.  Needs: GRU
      torch_lstm_packed   pack_padded_sequence(enforce_sorted=False) -> 2-layer bidirectional LSTM ->
                          pad_packed_sequence: torch 1.13 exports packing as the LSTM's sequence_lens input (no
                          Loop), unsorted rows as TopK/Gather/ScatterElements around it; y is 0 past each length.
                          Needs: LSTM with sequence_lens
      torch_script_ifloop torch.jit.script, data-dependent `if` and two `for` loops (trip count an input n, and
                          x.size(1)): If (then Mul / else Sub) + two Loops whose bodies read x.  Needs: If, Loop
      torch_script_list   torch.jit.script appending to a List[Tensor] then torch.stack: SequenceEmpty, Loop with
                          SequenceInsert in the body, ConcatFromSequence(new_axis=1).  Needs: Loop, sequence ops
  test_exported_batch_split    the batch-5 cases again on 2 threads with TENSORD_SPLIT_ROWS=2 (row chunks)
  test_handbuilt[model-case]   onnx.helper graphs for the exact semantics (HANDBUILT below; needs named per case)
  test_served_keras_lstm_rest  keras_lstm through `tensord serve`, TF Serving REST :predict with int token rows.
                               Needs: LSTM
  test_loop_limit_*            [needs --max_loop_iterations] the server refuses a request whose Loop would run more
                               iterations than the flag allows, naming the node and the limit
  test_loop_deadline_*         [needs Loop to honour the request deadline between iterations] a huge trip count with a
                               1 s deadline ends 504 (REST, --rest_api_timeout_in_ms=1000) / DEADLINE_EXCEEDED (gRPC
                               client timeout 1 s) within 5 s, and the server answers the next request
  test_loop_body_undefined_name [needs load-time checks of subgraph names] refused at load, naming the node

Exporters: torch runs in $TENSORD_TORCH_PYTHON (default /usr/bin/python3), tf2onnx in this Python. A missing exporter
skips its tests with the reason; anything else that goes wrong with an export fails.

Set TENSORD_CFMODELS_DIR=/some/dir to also write every model, its inputs and onnxruntime's outputs there, flat:
  <model>.onnx   <model>.<case>.in.<input>.npy   <model>.<case>.ort.<output>.npy   <model>.ops.txt
(file names: characters other than [A-Za-z0-9_.-] become '_').
"""
import functools
import json
import os
import subprocess
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import requests
from onnx import TensorProto, helper, numpy_helper

from conftest import ROOT, assert_clean_error, assert_no_crash
import serving_util as su

TOL = 1e-4
F, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
CACHE = os.path.join(ROOT, "build", "rnn-models")
EXPORTER = os.path.join(ROOT, "tests", "integration", "rnn_export.py")
TORCH_PYTHON = os.environ.get("TENSORD_TORCH_PYTHON", "/usr/bin/python3")
EXPORT_TIMEOUT = 600
CF_DIR = os.environ.get("TENSORD_CFMODELS_DIR", "")


# ----------------------------------------------------------------------------------------------------------------
# comparison, onnxruntime, the dump for colleagues

def safe_name(name):
    """The file name `tensord predict` gives an output (server/cli-run.c safe_name)."""
    s = "".join(c if (c.isascii() and (c.isalnum() or c in "_-")) or (c == "." and i > 0) else "_"
                for i, c in enumerate(name))
    return s or "_"


def check_close(got, want, what):
    assert got.shape == want.shape, f"{what}: shape {got.shape}, onnxruntime {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, onnxruntime {want.dtype}"
    if want.dtype.kind != "f":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    if want.size == 0:
        return
    assert np.all(np.isfinite(got) == np.isfinite(want)), f"{what}: non-finite values differ"
    g, w = got.astype(np.float64), want.astype(np.float64)
    err = float(np.max(np.abs(g - w)))
    scale = max(1.0, float(np.max(np.abs(w))))
    assert err <= TOL * scale, f"{what}: max|diff| = {err:.3e} > {TOL:g} * {scale:.3g}"


def ort_session(model_bytes):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


def ort_outputs(model_bytes, feeds):
    s = ort_session(model_bytes)
    names = [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(names, feeds)))


def op_summary(graph, prefix=""):
    """'Op' and 'Loop.body/Op' names of a graph and its subgraphs (any depth)."""
    ops = set()
    for n in graph.node:
        ops.add(prefix + n.op_type)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                ops |= op_summary(a.g, f"{prefix}{n.op_type}.{a.name}/")
    return ops


def dump(model_name, model_bytes, case, feeds, want):
    """Under TENSORD_CFMODELS_DIR: the model, the case's inputs and onnxruntime's outputs, for debugging."""
    if not CF_DIR:
        return
    os.makedirs(CF_DIR, exist_ok=True)
    base = os.path.join(CF_DIR, safe_name(model_name))
    with open(base + ".onnx", "wb") as f:
        f.write(model_bytes)
    with open(base + ".ops.txt", "w") as f:
        f.write("\n".join(sorted(op_summary(onnx.load_from_string(model_bytes).graph))) + "\n")
    for k, v in feeds.items():
        np.save(f"{base}.{safe_name(case)}.in.{safe_name(k)}.npy", v)
    for k, v in want.items():
        np.save(f"{base}.{safe_name(case)}.ort.{safe_name(k)}.npy", v)


def tensord_vs_ort(tensord, model_bytes, feeds, name, case):
    """onnxruntime's outputs, dumped; then `tensord predict` on the same feeds, compared output by output."""
    want = ort_outputs(model_bytes, feeds)
    dump(name, model_bytes, case, feeds, want)
    res = tensord.predict(tensord.save_model(model_bytes, f"{safe_name(name)}.onnx"), feeds)
    assert_no_crash(res)
    assert res.returncode == 0, f"{name} [{case}]: tensord predict failed\n{res.describe()}"
    for oname, w in want.items():
        key = safe_name(oname)
        assert key in res.outputs, \
            f"{name} [{case}]: output {oname!r} ({key}.npy) not written; got {sorted(res.outputs)}"
        check_close(res.outputs[key], w, f"{name} [{case}] output {oname!r}")
    return want


# ----------------------------------------------------------------------------------------------------------------
# exported models

# ops each exported graph must contain (from the table in the docstring): an exporter that emits something else
# makes the test fail here rather than silently cover less
EXPECT_OPS = {
    "keras_lstm": {"LSTM"},
    "keras_bigru": {"Loop", "ReverseSequence", "Loop.body/MatMul", "Loop.body/Sigmoid"},
    "keras_masked_lstm": {"Loop", "Loop.body/Sigmoid", "Loop.body/Tanh"},
    "keras_lstm_stack": {"LSTM"},
    "torch_lstm": {"LSTM"},
    "torch_gru": {"GRU"},
    "torch_lstm_packed": {"LSTM", "TopK"},
    "torch_script_ifloop": {"If", "Loop", "If.then_branch/Mul", "If.else_branch/Sub"},
    "torch_script_list": {"SequenceEmpty", "Loop", "Loop.body/SequenceInsert", "ConcatFromSequence"},
    "keras_simplernn": {"Loop", "Loop.body/MatMul"},
    "keras_gru_v1": {"Loop", "Loop.body/Sigmoid"},
    "keras_bilstm_seq": {"LSTM"},
    "keras_conv_lstm_back": {"Conv", "LSTM", "ReverseSequence"},
    "torch_rnn_relu_h0": {"RNN"},
    "torch_script_while": {"Loop", "Loop.body/Less"},
}
EXPORTED_CASES = {
    "keras_lstm": ["b1", "b5"], "keras_bigru": ["b1", "b5"], "keras_masked_lstm": ["b1", "b5"],
    "keras_lstm_stack": ["b1", "b5"],
    "torch_lstm": ["b1_t7", "b5_t4"], "torch_gru": ["b1_t7", "b5_t4"], "torch_lstm_packed": ["b1_t6", "b5_t7"],
    "torch_script_ifloop": ["b1_pos_n3", "b5_neg_n5", "b5_pos_n0", "b5_mixed_n2"],
    "torch_script_list": ["b1_t5", "b5_t2"],
    "keras_simplernn": ["b1", "b5"], "keras_gru_v1": ["b1", "b5"], "keras_bilstm_seq": ["b1", "b5"],
    "keras_conv_lstm_back": ["b1", "b5"],
    "torch_rnn_relu_h0": ["t5_b3", "t2_b1"], "torch_script_while": ["small", "done"],
}


def _python_has(python, modules):
    """'' if `python` imports every module, else why not."""
    try:
        cp = subprocess.run([python, "-c", f"import {', '.join(modules)}"], capture_output=True, text=True,
                            timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{python} not usable: {e}"
    if cp.returncode != 0:
        last = (cp.stderr.strip().splitlines() or ["?"])[-1]
        return f"{python} cannot import {', '.join(modules)}: {last}"
    return ""


@functools.lru_cache(maxsize=None)
def export(framework):
    """Runs the exporter for one framework once per session: ("skip" | "fail" | "", message)."""
    python, modules = ((TORCH_PYTHON, ["torch", "onnx"]) if framework == "torch"
                       else (sys.executable, ["tensorflow", "keras", "tf2onnx"]))
    why = _python_has(python, modules)
    if why:
        return "skip", f"{framework} exporter missing: {why}"
    cmd = [python, EXPORTER, "--framework", framework, "--out", CACHE]
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=EXPORT_TIMEOUT,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""})
    except subprocess.TimeoutExpired:
        return "fail", f"export timed out after {EXPORT_TIMEOUT} s: {' '.join(cmd)}"
    if cp.returncode != 0:
        return "fail", f"exporter failed (exit {cp.returncode}): {' '.join(cmd)}\n{(cp.stdout + cp.stderr)[-3000:]}"
    return "", cp.stdout


def exported_meta(name):
    state, msg = export("torch" if name.startswith("torch_") else "keras")
    if state == "skip":
        pytest.skip(msg)
    if state == "fail":
        pytest.fail(msg)
    with open(os.path.join(CACHE, name, "meta.json")) as f:
        meta = json.load(f)
    if "error" in meta:  # the exporter's own limitation (e.g. a construct torch 1.13 cannot export)
        pytest.fail(f"{name}: {meta['error']}")
    return meta


@pytest.mark.parametrize("name,case", [(n, c) for n, cs in EXPORTED_CASES.items() for c in cs])
def test_exported(tensord, name, case):
    meta = exported_meta(name)
    mdir = os.path.join(CACHE, name)
    with open(os.path.join(mdir, "model.onnx"), "rb") as f:
        model_bytes = f.read()
    ops = op_summary(onnx.load_from_string(model_bytes).graph)
    missing = EXPECT_OPS[name] - ops
    assert not missing, f"{name}: the exporter no longer emits {sorted(missing)}; graph ops: {sorted(ops)}"
    feeds = {i: np.load(os.path.join(mdir, meta["input_file"].format(case=case, input=i))) for i in meta["inputs"]}
    # the export itself: onnxruntime agrees with the framework that made it
    want = ort_outputs(model_bytes, feeds)
    for o in meta["outputs"]:
        ref = np.load(os.path.join(mdir, meta["reference_file"].format(case=case, output=o)))
        check_close(want[o].astype(ref.dtype), ref, f"{name} [{case}] EXPORT CHECK onnxruntime vs "
                                                    f"{meta['settings']['framework']} output {o!r}")
    tensord_vs_ort(tensord, model_bytes, feeds, name, case)


@pytest.mark.parametrize("name,case", [(n, c) for n, cs in EXPORTED_CASES.items() for c in cs if c.startswith("b5")])
def test_exported_batch_split(tensord, name, case):
    """The batch-5 cases on two threads with TENSORD_SPLIT_ROWS=2 (as test_crosscheck's batch-split test): the
    planner may run row chunks separately only where rows are independent. torch_script_ifloop's If reads x.sum()
    over the whole batch (b5_mixed_n2: chunks would disagree), the Keras Loops' trip count is the batch's longest
    row."""
    meta = exported_meta(name)
    mdir = os.path.join(CACHE, name)
    with open(os.path.join(mdir, "model.onnx"), "rb") as f:
        model_bytes = f.read()
    feeds = {i: np.load(os.path.join(mdir, meta["input_file"].format(case=case, input=i))) for i in meta["inputs"]}
    want = ort_outputs(model_bytes, feeds)
    os.environ["TENSORD_SPLIT_ROWS"] = "2"
    try:
        res = tensord.predict(tensord.save_model(model_bytes, f"{safe_name(name)}.onnx"), feeds, threads=2)
    finally:
        del os.environ["TENSORD_SPLIT_ROWS"]
    assert_no_crash(res)
    assert res.returncode == 0, f"{name} [{case}] split: tensord predict failed\n{res.describe()}"
    for oname, w in want.items():
        check_close(res.outputs[safe_name(oname)], w, f"{name} [{case}] threads=2 split rows=2 output {oname!r}")


# ----------------------------------------------------------------------------------------------------------------
# hand-built graphs: each returns (model, {case: feeds})

def vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))


def model_of(nodes, inputs, outputs, inits=(), opset=17, check=True):
    g = helper.make_graph(nodes, "g", inputs, outputs,
                          initializer=[numpy_helper.from_array(np.asarray(a), n) for n, a in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="tensord-tests")
    m.ir_version = 8
    if check:
        onnx.checker.check_model(m, full_check=True)
    return m


def randn(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def hb_loop_trip_cond_scan():
    """Loop(M, cond, v=x) with a scan output; the body's cond is i < stop (stop read from the outer graph), so the
    loop ends on M or on cond, whichever is first; cond=False or M=0 runs no iteration (scan output [0,2,3]).
    Needs: Loop (trip count, cond, scan outputs, zero-trip)."""
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=F), helper.make_node("Mul", ["x", "fi"], ["t"]),
         helper.make_node("Add", ["v_in", "t"], ["v_out"]), const("half", np.float32(0.5)),
         helper.make_node("Mul", ["v_out", "half"], ["s_out"]), helper.make_node("Less", ["i", "stop"], ["c_out"])],
        "body", [vi("i", I64, []), vi("c_in", BOOL, []), vi("v_in", F, [2, 3])],
        [vi("c_out", BOOL, []), vi("v_out", F, [2, 3]), vi("s_out", F, [2, 3])])
    m = model_of([helper.make_node("Loop", ["M", "cond", "x"], ["v", "s"], body=body, name="trip_cond_loop")],
                 [vi("x", F, [2, 3]), vi("M", I64, []), vi("cond", BOOL, []), vi("stop", I64, [])],
                 [vi("v", F, [2, 3]), vi("s", F, ["K", 2, 3])])
    x = randn((2, 3), 1)

    def c(M, cond, stop):
        return {"x": x, "M": np.array(M, np.int64), "cond": np.array(cond), "stop": np.array(stop, np.int64)}
    return m, {"M4": c(4, True, 100), "cond_stops_at_3": c(10, True, 2), "cond_false": c(5, False, 100),
               "M0": c(0, True, 100)}


def hb_loop_while_no_trip_count():
    """Loop with M omitted (""): a while loop on cond only, v doubles until its sum passes a threshold.
    Needs: Loop without M."""
    body = helper.make_graph(
        [const("two", np.float32(2.0)), helper.make_node("Mul", ["v_in", "two"], ["v_out"]),
         helper.make_node("ReduceSum", ["v_out"], ["sum"], keepdims=0),
         helper.make_node("Less", ["sum", "limit"], ["c_out"]), helper.make_node("Identity", ["v_out"], ["s_out"])],
        "body", [vi("i", I64, []), vi("c_in", BOOL, []), vi("v_in", F, [3])],
        [vi("c_out", BOOL, []), vi("v_out", F, [3]), vi("s_out", F, [3])])
    m = model_of([helper.make_node("Loop", ["", "cond", "x"], ["v", "s"], body=body, name="while_loop")],
                 [vi("x", F, [3]), vi("cond", BOOL, []), vi("limit", F, [])], [vi("v", F, [3]), vi("s", F, ["K", 3])])
    x = np.array([0.5, 1.0, 0.25], np.float32)
    return m, {"limit100": {"x": x, "cond": np.array(True), "limit": np.array(100.0, np.float32)},
               "limit0": {"x": x, "cond": np.array(True), "limit": np.array(0.0, np.float32)}}


def hb_loop_outer_scope():
    """The body reads an initializer (w), a main-graph node's output (t = 2x) and a graph input (x); cond omitted,
    M a main-graph initializer. Needs: Loop, outer-scope names."""
    body = helper.make_graph(
        [helper.make_node("MatMul", ["v_in", "w"], ["p"]), helper.make_node("Add", ["p", "t"], ["q"]),
         helper.make_node("Tanh", ["q"], ["r"]), helper.make_node("Sub", ["r", "x"], ["v_out"]),
         helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body", [vi("i", I64, []), vi("c_in", BOOL, []), vi("v_in", F, ["N", 4])],
        [vi("c_out", BOOL, []), vi("v_out", F, ["N", 4])])
    m = model_of([helper.make_node("Mul", ["x", "two"], ["t"]),
                  helper.make_node("Loop", ["M", "", "x"], ["y"], body=body, name="outer_scope_loop")],
                 [vi("x", F, ["N", 4])], [vi("y", F, ["N", 4])],
                 [("w", randn((4, 4), 2) * 0.5), ("two", np.float32(2.0)), ("M", np.array(3, np.int64))])
    return m, {"b1": {"x": randn((1, 4), 3)}, "b5": {"x": randn((5, 4), 4)}}


def hb_if_in_loop():
    """Loop -> If (i even) -> If (i > 2): three scope levels; the innermost branches read the Loop body's v_in and the
    main graph's x and `half`. Needs: Loop, If (nested), outer-scope names across two subgraph levels."""
    inner = helper.make_node(
        "If", ["late"], ["a"], name="inner_if",
        then_branch=helper.make_graph([helper.make_node("Sub", ["v_in", "x"], ["a_then"])], "inner_then", [],
                                      [vi("a_then", F, [2, 3])]),
        else_branch=helper.make_graph([helper.make_node("Add", ["v_in", "x"], ["a_else"])], "inner_else", [],
                                      [vi("a_else", F, [2, 3])]))
    outer = helper.make_node(
        "If", ["even"], ["v_out"], name="outer_if",
        then_branch=helper.make_graph([const("two_i", np.int64(2)),
                                       helper.make_node("Greater", ["i", "two_i"], ["late"]), inner,
                                       helper.make_node("Identity", ["a"], ["b_then"])],
                                      "outer_then", [], [vi("b_then", F, [2, 3])]),
        else_branch=helper.make_graph([helper.make_node("Mul", ["v_in", "half"], ["b_else"])], "outer_else", [],
                                      [vi("b_else", F, [2, 3])]))
    body = helper.make_graph(
        [const("two", np.int64(2)), helper.make_node("Mod", ["i", "two"], ["r"]), const("zero", np.int64(0)),
         helper.make_node("Equal", ["r", "zero"], ["even"]), outer, helper.make_node("Identity", ["c_in"], ["c_out"]),
         helper.make_node("Identity", ["v_out"], ["s_out"])],
        "body", [vi("i", I64, []), vi("c_in", BOOL, []), vi("v_in", F, [2, 3])],
        [vi("c_out", BOOL, []), vi("v_out", F, [2, 3]), vi("s_out", F, [2, 3])])
    m = model_of([helper.make_node("Loop", ["M", "", "x"], ["y", "trace"], body=body, name="if_loop")],
                 [vi("x", F, [2, 3]), vi("M", I64, [])], [vi("y", F, [2, 3]), vi("trace", F, ["K", 2, 3])],
                 [("half", np.float32(0.5))])
    return m, {"M7": {"x": randn((2, 3), 5), "M": np.array(7, np.int64)},
               "M1": {"x": randn((2, 3), 6), "M": np.array(1, np.int64)}}


def hb_scan16():
    """Scan (opset 16): one state, two scan inputs (a along axis 0 forward, b along axis 1 reversed), two scan
    outputs (y1 stacked on axis 1, y2 on axis 0 in reverse order). Needs: Scan with axes and directions."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["a_t", "b_t"], ["ab"]), helper.make_node("Add", ["s_in", "ab"], ["s_out"]),
         const("two", np.float32(2.0)), helper.make_node("Mul", ["s_out", "two"], ["y1_t"]),
         helper.make_node("Sub", ["a_t", "b_t"], ["y2_t"])],
        "body", [vi("s_in", F, [2]), vi("a_t", F, [2]), vi("b_t", F, [2])],
        [vi("s_out", F, [2]), vi("y1_t", F, [2]), vi("y2_t", F, [2])])
    m = model_of([helper.make_node("Scan", ["s0", "a", "b"], ["s", "y1", "y2"], body=body, num_scan_inputs=2,
                                   scan_input_axes=[0, 1], scan_input_directions=[0, 1], scan_output_axes=[1, 0],
                                   scan_output_directions=[0, 1], name="scan16")],
                 [vi("s0", F, [2]), vi("a", F, ["T", 2]), vi("b", F, [2, "T"])],
                 [vi("s", F, [2]), vi("y1", F, [2, "T"]), vi("y2", F, ["T", 2])], opset=16)
    return m, {"T5": {"s0": randn((2,), 7), "a": randn((5, 2), 8), "b": randn((2, 5), 9)},
               "T1": {"s0": randn((2,), 10), "a": randn((1, 2), 11), "b": randn((2, 1), 12)}}


def hb_if_branch_shapes():
    """If whose branches output different shapes ([4,3] = Concat(x, x) vs [1,3] = ReduceSum keepdims), used by a node
    after the If. Needs: If with a data-dependent output shape."""
    then_g = helper.make_graph([helper.make_node("Concat", ["x", "x"], ["t_out"], axis=0)], "then", [],
                               [vi("t_out", F, [4, 3])])
    else_g = helper.make_graph([const("ax", np.array([0], np.int64)),
                                helper.make_node("ReduceSum", ["x", "ax"], ["e_out"], keepdims=1)], "else", [],
                               [vi("e_out", F, [1, 3])])
    m = model_of([helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g, name="shape_if"),
                  helper.make_node("Mul", ["y", "x0"], ["z"])],
                 [vi("c", BOOL, []), vi("x", F, [2, 3])], [vi("y", F, ["R", 3]), vi("z", F, ["R", 3])],
                 [("x0", np.array([1.0, -2.0, 0.5], np.float32))])
    x = randn((2, 3), 13)
    return m, {"then": {"c": np.array(True), "x": x}, "else": {"c": np.array(False), "x": x}}


def hb_seq_construct_insert_concat():
    """SequenceConstruct(a, b) -> SequenceInsert(c) at the end -> SequenceInsert(a) at 0 and (b) at -1 ->
    ConcatFromSequence(axis=0) over tensors of different first dims, SequenceLength, and a new_axis=1 stack.
    Needs: SequenceConstruct, SequenceInsert, ConcatFromSequence, SequenceLength."""
    nodes = [helper.make_node("SequenceConstruct", ["a", "b"], ["s0"]),
             helper.make_node("SequenceInsert", ["s0", "c"], ["s1"]),                 # [a, b, c]
             const("p0", np.int64(0)), helper.make_node("SequenceInsert", ["s1", "a", "p0"], ["s2"]),   # [a, a, b, c]
             const("pm1", np.int64(-1)), helper.make_node("SequenceInsert", ["s1", "b", "pm1"], ["s3"]),  # [a, b, b, c]
             helper.make_node("ConcatFromSequence", ["s2"], ["y2"], axis=0),          # [7, 3]
             helper.make_node("ConcatFromSequence", ["s3"], ["y3"], axis=0),          # [8, 3]
             helper.make_node("SequenceLength", ["s2"], ["n2"]),
             helper.make_node("SequenceConstruct", ["a", "a", "a"], ["sa"]),
             helper.make_node("ConcatFromSequence", ["sa"], ["stack"], axis=-1, new_axis=1)]  # [1, 3, 3]
    m = model_of(nodes, [vi("a", F, [1, 3]), vi("b", F, [2, 3]), vi("c", F, [3, 3])],
                 [vi("y2", F, [7, 3]), vi("y3", F, [8, 3]), vi("n2", I64, []), vi("stack", F, [1, 3, 3])])
    return m, {"one": {"a": randn((1, 3), 14), "b": randn((2, 3), 15), "c": randn((3, 3), 16)}}


def hb_split_to_sequence_at():
    """SplitToSequence with a split list (axis 1), with no split and keepdims=0 (axis 0), with a scalar split (chunks
    of 4, last shorter); SequenceAt with positive and negative positions, SequenceLength.
    Needs: SplitToSequence, SequenceAt, SequenceLength."""
    nodes = [const("sp", np.array([1, 3, 2], np.int64)),
             helper.make_node("SplitToSequence", ["x", "sp"], ["s"], axis=1),
             const("m1", np.int64(-1)), helper.make_node("SequenceAt", ["s", "m1"], ["last"]),     # [4, 2]
             const("one", np.int64(1)), helper.make_node("SequenceAt", ["s", "one"], ["mid"]),     # [4, 3]
             helper.make_node("SequenceLength", ["s"], ["n"]),
             helper.make_node("SplitToSequence", ["x"], ["rows"], axis=0, keepdims=0),
             const("two", np.int64(2)), helper.make_node("SequenceAt", ["rows", "two"], ["row2"]),  # [6]
             const("four", np.int64(4)), helper.make_node("SplitToSequence", ["x", "four"], ["chunks"], axis=1),
             helper.make_node("SequenceAt", ["chunks", "one"], ["tail"]),                          # [4, 2]
             helper.make_node("SequenceLength", ["rows"], ["nrows"])]
    m = model_of(nodes, [vi("x", F, [4, 6])],
                 [vi("last", F, [4, 2]), vi("mid", F, [4, 3]), vi("n", I64, []), vi("row2", F, [6]),
                  vi("tail", F, [4, 2]), vi("nrows", I64, [])])
    return m, {"one": {"x": randn((4, 6), 17)}}


def hb_loop_builds_sequence():
    """SequenceEmpty -> Loop carrying the sequence, SequenceInsert(x * (i + 1)) in the body -> ConcatFromSequence(axis
    0, new_axis=1) after: what torch.onnx emits for a scripted List append (torch_script_list). Needs: Loop with a
    sequence loop-carried value, SequenceEmpty, SequenceInsert, ConcatFromSequence, SequenceLength."""
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=F), const("one", np.float32(1.0)),
         helper.make_node("Add", ["fi", "one"], ["f1"]), helper.make_node("Mul", ["x", "f1"], ["xi"]),
         helper.make_node("SequenceInsert", ["seq_in", "xi"], ["seq_out"]),
         helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body", [vi("i", I64, []), vi("c_in", BOOL, []),
                 helper.make_tensor_sequence_value_info("seq_in", F, [2, 3])],
        [vi("c_out", BOOL, []), helper.make_tensor_sequence_value_info("seq_out", F, [2, 3])])
    m = model_of([helper.make_node("SequenceEmpty", [], ["seq0"], dtype=F),
                  helper.make_node("Loop", ["M", "", "seq0"], ["seq"], body=body, name="seq_loop"),
                  helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=0, new_axis=1),
                  helper.make_node("SequenceLength", ["seq"], ["n"])],
                 [vi("x", F, [2, 3]), vi("M", I64, [])], [vi("y", F, ["K", 2, 3]), vi("n", I64, [])])
    x = randn((2, 3), 18)
    return m, {"M4": {"x": x, "M": np.array(4, np.int64)}, "M1": {"x": x, "M": np.array(1, np.int64)}}


HANDBUILT = {
    "hb_loop_trip_cond_scan": hb_loop_trip_cond_scan,
    "hb_loop_while_no_trip_count": hb_loop_while_no_trip_count,
    "hb_loop_outer_scope": hb_loop_outer_scope,
    "hb_if_in_loop": hb_if_in_loop,
    "hb_scan16": hb_scan16,
    "hb_if_branch_shapes": hb_if_branch_shapes,
    "hb_seq_construct_insert_concat": hb_seq_construct_insert_concat,
    "hb_split_to_sequence_at": hb_split_to_sequence_at,
    "hb_loop_builds_sequence": hb_loop_builds_sequence,
}
HANDBUILT_CASES = {
    "hb_loop_trip_cond_scan": ["M4", "cond_stops_at_3", "cond_false", "M0"],
    "hb_loop_while_no_trip_count": ["limit100", "limit0"],
    "hb_loop_outer_scope": ["b1", "b5"],
    "hb_if_in_loop": ["M7", "M1"],
    "hb_scan16": ["T5", "T1"],
    "hb_if_branch_shapes": ["then", "else"],
    "hb_seq_construct_insert_concat": ["one"],
    "hb_split_to_sequence_at": ["one"],
    "hb_loop_builds_sequence": ["M4", "M1"],
}


@pytest.mark.parametrize("name,case", [(n, c) for n, cs in HANDBUILT_CASES.items() for c in cs])
def test_handbuilt(tensord, name, case):
    model, cases = HANDBUILT[name]()
    assert sorted(cases) == sorted(HANDBUILT_CASES[name])
    tensord_vs_ort(tensord, model.SerializeToString(), cases[case], name, case)


# ----------------------------------------------------------------------------------------------------------------
# served: a Keras model through the REST front door

def test_served_keras_lstm_rest(tmp_path):
    """keras_lstm (int32 tokens [N,12] -> logits [N,4]) served, TF Serving REST :predict with token rows as a user
    sends them; answer vs onnxruntime. Needs: LSTM."""
    meta = exported_meta("keras_lstm")
    mdir = os.path.join(CACHE, "keras_lstm")
    with open(os.path.join(mdir, "model.onnx"), "rb") as f:
        model_bytes = f.read()
    tokens = np.load(os.path.join(mdir, meta["input_file"].format(case="b5", input="tokens")))
    want = ort_outputs(model_bytes, {"tokens": tokens})[meta["outputs"][0]]
    su.write_version(tmp_path / "models" / "m", 1, model_bytes)
    with su.Server(tmp_path, base_path=str(tmp_path / "models" / "m"), start_timeout=30) as srv:
        r = srv.post_json("/v1/models/m:predict", {"instances": tokens.tolist()})
        assert r.status_code == 200, f"HTTP {r.status_code}: {r.text[:1000]}\n{srv.describe()}"
        got = np.asarray(r.json()["predictions"], np.float32)
        check_close(got, want, "keras_lstm served over REST")
        r = srv.post_json("/v1/models/m:predict", {"instances": tokens[:1].tolist()})
        assert r.status_code == 200, f"HTTP {r.status_code}: {r.text[:1000]}\n{srv.describe()}"
        check_close(np.asarray(r.json()["predictions"], np.float32), want[:1], "keras_lstm served, one row")


# ----------------------------------------------------------------------------------------------------------------
# bad input through the server: Loop trip counts, deadlines, bad subgraphs

def counted_loop_model(d=4, heavy=False):
    """y = Loop(n) over v = x: v <- tanh(v @ w) + x per iteration. n: int64 scalar input. heavy: v [64,512] @ w
    [512,512] (about 33 MFLOP, milliseconds, per iteration); else v [N,d]."""
    dd = 512 if heavy else d
    body = helper.make_graph(
        [helper.make_node("MatMul", ["v_in", "w"], ["p"]), helper.make_node("Tanh", ["p"], ["q"]),
         helper.make_node("Add", ["q", "x"], ["v_out"]), helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body", [vi("i", I64, []), vi("c_in", BOOL, []), vi("v_in", F, ["N", dd])],
        [vi("c_out", BOOL, []), vi("v_out", F, ["N", dd])])
    return model_of([helper.make_node("Loop", ["n", "", "x"], ["y"], body=body, name="counted_loop")],
                    [vi("x", F, ["N", dd]), vi("n", I64, [])], [vi("y", F, ["N", dd])],
                    [("w", (randn((dd, dd), 21) / np.sqrt(dd)).astype(np.float32))])


def v2_request(x, n):
    return {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.reshape(-1).tolist()},
                       {"name": "n", "shape": [], "datatype": "INT64", "data": [int(n)]}]}


def v2_output(resp):
    assert resp.status_code == 200, f"HTTP {resp.status_code}: {resp.text[:1000]}"
    (out,) = resp.json()["outputs"]
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


def while_loop_model(d=4):
    """A Loop with no trip count: cond = i < n - 1 (n an int64 scalar input), so it runs n iterations that the
    server can only count as they run."""
    body = helper.make_graph(
        [helper.make_node("Tanh", ["v_in"], ["q"]), helper.make_node("Add", ["q", "x"], ["v_out"]),
         const("one", np.int64(1)), helper.make_node("Sub", ["n", "one"], ["last"]),
         helper.make_node("Less", ["i", "last"], ["c_out"])],
        "body", [vi("i", I64, []), vi("c_in", BOOL, []), vi("v_in", F, ["N", d])],
        [vi("c_out", BOOL, []), vi("v_out", F, ["N", d])])
    return model_of([const("yes", np.array(True)),
                     helper.make_node("Loop", ["", "yes", "x"], ["y"], body=body, name="while_loop")],
                    [vi("x", F, ["N", d]), vi("n", I64, [])], [vi("y", F, ["N", d])])


def test_loop_limit_rest(tmp_path):
    """[needs --max_loop_iterations] --max_loop_iterations=100, two models: counted_loop (trip count M = n) and
    while_loop (no M; cond stops it after n iterations). n=100 runs and matches onnxruntime; n=101 (M over the
    limit, known before the loop starts) and n=150 (the while loop running past it) are refused with HTTP 400 (or
    429 as RESOURCE_EXHAUSTED) naming the node and the limit (100); the server keeps serving. Not 504: the request
    itself is over a server limit and fails the same way every time, while 504 / DEADLINE_EXCEEDED tells clients and
    proxies that time ran out (and that a retry may succeed). A server without the flag does not start
    ("config: unknown flag" in the failure)."""
    models = {"counted": (counted_loop_model(), "counted_loop", 101), "while": (while_loop_model(), "while_loop", 150)}
    cfg = []
    for name, (model, _, _) in models.items():
        su.write_version(tmp_path / "models" / name, 1, model)
        cfg.append({"name": name, "base_path": str(tmp_path / "models" / name)})
    conf = su.write_text(tmp_path / "models.config", su.model_config_text(cfg))
    x = randn((2, 4), 22)
    with su.Server(tmp_path, config_file=conf, extra=["--max_loop_iterations=100"], start_timeout=30) as srv:
        for name, (model, node, over) in models.items():
            mb = model.SerializeToString()
            feeds = {"x": x, "n": np.array(100, np.int64)}
            want = ort_outputs(mb, feeds)
            dump(f"srv_{node}", mb, "n100", feeds, want)
            got = v2_output(srv.post_json(f"/v2/models/{name}/infer", v2_request(x, 100)))
            check_close(got, want["y"], f"{node} with n = the limit")
            r = srv.post_json(f"/v2/models/{name}/infer", v2_request(x, over))
            msg = su.check_error(r, (400, 429), node, "100")
            assert "iteration" in msg.lower(), f"{node}: the message does not say what the limit counts: {msg}"
            got = v2_output(srv.post_json(f"/v2/models/{name}/infer", v2_request(x, 3)))
            check_close(got, ort_outputs(mb, {"x": x, "n": np.array(3, np.int64)})["y"],
                        f"{node} after a refused request")


def _heavy_feeds():
    return randn((64, 512), 23)


def _dump_heavy(model, x):
    if CF_DIR:
        feeds = {"x": x, "n": np.array(2, np.int64)}
        mb = model.SerializeToString()
        dump("srv_counted_loop_heavy", mb, "n2", feeds, ort_outputs(mb, feeds))


def test_loop_deadline_rest(tmp_path):
    """[needs Loop to check the request deadline between iterations] --rest_api_timeout_in_ms=1000 and a Loop of
    500,000 heavy iterations (minutes; under the default --max_loop_iterations): HTTP 504 naming the deadline in under
    5 s, then a 2-iteration request is answered within 5 s (the loop really stopped)."""
    model = counted_loop_model(heavy=True)
    su.write_version(tmp_path / "models" / "m", 1, model)
    x = _heavy_feeds()
    _dump_heavy(model, x)
    with su.Server(tmp_path, base_path=str(tmp_path / "models" / "m"), extra=["--rest_api_timeout_in_ms=1000"],
                   start_timeout=30) as srv:
        t0 = time.monotonic()
        try:
            r = srv.post_json("/v2/models/m/infer", v2_request(x, 500_000), timeout=30)
        except requests.Timeout:
            pytest.fail(f"no answer within 30 s to a request with a 1 s deadline\n{srv.describe()}")
        elapsed = time.monotonic() - t0
        msg = su.check_error(r, 504, "deadline")
        assert "max_loop_iterations" not in msg, f"refused by the iteration limit, not the deadline: {msg}"
        assert elapsed < 5, f"504 after {elapsed:.1f} s (deadline 1 s)"
        t0 = time.monotonic()
        got = v2_output(srv.post_json("/v2/models/m/infer", v2_request(x, 2), timeout=30))
        assert time.monotonic() - t0 < 5, "the next request waited: the timed-out Loop kept running"
        check_close(got, ort_outputs(model.SerializeToString(), {"x": x, "n": np.array(2, np.int64)})["y"],
                    "after a timed-out request")


def test_loop_deadline_grpc(tmp_path):
    """[needs Loop to check the request deadline between iterations] TF Serving gRPC Predict with a 1 s client
    deadline on a Loop of 500,000 heavy iterations: DEADLINE_EXCEEDED in under 5 s; the next request is answered."""
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
    model = counted_loop_model(heavy=True)
    su.write_version(tmp_path / "models" / "m", 1, model)
    x = _heavy_feeds()
    _dump_heavy(model, x)

    def request(n):
        rq = predict_pb2.PredictRequest()
        rq.model_spec.name = "m"
        rq.inputs["x"].CopyFrom(tf.make_tensor_proto(x))
        rq.inputs["n"].CopyFrom(tf.make_tensor_proto(np.int64(n)))
        return rq

    with su.Server(tmp_path, base_path=str(tmp_path / "models" / "m"), grpc=True, start_timeout=30) as srv:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(srv.grpc_channel())
        t0 = time.monotonic()
        try:
            stub.Predict(request(500_000), timeout=1.0)
            pytest.fail("a 500,000-iteration Loop finished within a 1 s deadline?")
        except grpc.RpcError as e:
            elapsed = time.monotonic() - t0
            assert e.code() == grpc.StatusCode.DEADLINE_EXCEEDED, f"{e.code().name}: {e.details()}"
            assert "max_loop_iterations" not in (e.details() or ""), f"refused by the iteration limit: {e.details()}"
        assert elapsed < 5, f"DEADLINE_EXCEEDED after {elapsed:.1f} s"
        t0 = time.monotonic()
        r = stub.Predict(request(2), timeout=30)
        assert time.monotonic() - t0 < 5, "the next request waited: the timed-out Loop kept running"
        check_close(tf.make_ndarray(r.outputs["y"]),
                    ort_outputs(model.SerializeToString(), {"x": x, "n": np.array(2, np.int64)})["y"],
                    "after a timed-out request")


def test_loop_body_undefined_name(tensord):
    """[needs load-time checks of subgraph names] a Loop body reading `no_such_value`, defined nowhere: `tensord
    predict` refuses the model at load (exit 1) naming the node (bad_loop) and the name."""
    body = helper.make_graph(
        [helper.make_node("Add", ["v_in", "no_such_value"], ["v_out"]),
         helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body", [vi("i", I64, []), vi("c_in", BOOL, []), vi("v_in", F, [2])],
        [vi("c_out", BOOL, []), vi("v_out", F, [2])])
    m = model_of([helper.make_node("Loop", ["M", "", "x"], ["y"], body=body, name="bad_loop")],
                 [vi("x", F, [2])], [vi("y", F, [2])], [("M", np.array(2, np.int64))], check=False)
    feeds = {"x": np.ones(2, np.float32)}
    dump("bad_loop_undefined_name", m.SerializeToString(), "x1", feeds, {})
    res = tensord.predict(tensord.save_model(m), feeds)
    assert_clean_error(res, "bad_loop", "no_such_value")
