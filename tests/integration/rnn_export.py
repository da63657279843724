#!/usr/bin/python3
"""tests/integration/rnn_export.py - recurrent and control-flow models exported by torch.onnx, with PyTorch's outputs.

Run with the system Python that has torch (Debian python3-torch; $TENSORD_TORCH_PYTHON, default /usr/bin/python3),
by tests/integration/test_rnn_models.py:

    /usr/bin/python3 tests/integration/rnn_export.py --out DIR

For every model it writes
    DIR/<name>/model.onnx              torch.onnx.export, opset OPSET, batch (and, for the RNNs, time) axes symbolic
    DIR/<name>/<case>_<input>.npy      seeded inputs of each case (a case is one batch size / sequence length / branch)
    DIR/<name>/<case>_torch_<output>.npy   PyTorch's outputs on those inputs (eval mode, no_grad)
    DIR/<name>/meta.json               settings, torch version, input/output names, cases, the op types of the graph
                                       and of its subgraphs, or "error" with why torch could not export it

Models:
    torch_lstm         nn.LSTM(8, 16, num_layers=2, bidirectional=True, batch_first=True): x [N,T,8] -> y [N,T,32],
                       h [4,N,16], c [4,N,16]. Exported as two LSTM nodes (direction=bidirectional, no activations
                       attribute, layer 2 reads layer 1 through Transpose/Reshape).
    torch_gru          nn.GRU, same sizes: x -> y, h. Two GRU nodes with linear_before_reset=1.
    torch_lstm_packed  x [N,T,8], lengths [N] int64 (rows unsorted) -> pack_padded_sequence(enforce_sorted=False) ->
                       the 2-layer bidirectional LSTM -> pad_packed_sequence(total_length=T): y [N,T,32] (zeros past
                       each row's length), h [4,N,16]. torch 1.13 exports packing as the LSTM's sequence_lens input
                       (Cast of `lengths`), the unsorted order as TopK + Gather before and Gather after.
    torch_script_ifloop  torch.jit.script of: `if x.sum() > 0: y = x*2 else: y = x-1`, then `for i in range(n):
                       y = y + i*x` (n: an int64 scalar input), then `for j in range(x.size(1)): y = y*0.5 +
                       x[:, j:j+1]` (trip count from a shape). Exported as If + two Loops whose bodies read x
                       (outer scope).
    torch_script_list  torch.jit.script of a loop that appends a tensor per step to a List[Tensor] and
                       torch.stack()s it: SequenceEmpty outside, SequenceInsert inside the Loop body (the sequence is a
                       loop-carried value), ConcatFromSequence(new_axis=1) after.

A model whose meta.json has the same settings is not exported again. Files are written under a temporary name and
renamed, meta.json last.
"""
import argparse
import collections
import io
import json
import os
import sys
import time
import warnings

import numpy as np

SEED = 20240917
OPSET = 14          # torch.onnx (torch 1.13's default; If/Loop/sequence ops export at 14)
KERAS_OPSET = 17    # tf2onnx
KERAS_T = 12        # tokens / time steps of the Keras models
KERAS_VOCAB = 50
EXPORTER_VERSION = 3  # bump when anything that changes the written files changes


def torch_models():
    """name -> (module builder, input names, output names, dynamic axes, cases builder); imports torch."""
    from typing import List

    import torch
    import torch.nn as nn
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    class Packed(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.LSTM(8, 16, num_layers=2, bidirectional=True, batch_first=True)

        def forward(self, x, lengths):
            p = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            out, (h, _) = self.rnn(p)
            y, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
            return y, h

    class IfLoop(nn.Module):
        def forward(self, x, n):
            if bool(x.sum() > 0):
                y = x * 2
            else:
                y = x - 1
            for i in range(int(n)):
                y = y + i * x
            for j in range(x.size(1)):
                y = y * 0.5 + x[:, j:j + 1]
            return y

    class ListLoop(nn.Module):
        def forward(self, x):
            outs: List[torch.Tensor] = []
            h = torch.zeros_like(x[:, 0])
            for t in range(x.size(1)):
                h = torch.tanh(h * 0.5 + x[:, t])
                outs.append(h)
            return torch.stack(outs, 1)

    def rnn_cases(g, nin=8):
        return {"b1_t7": {"x": g.standard_normal((1, 7, nin)).astype(np.float32)},
                "b5_t4": {"x": g.standard_normal((5, 4, nin)).astype(np.float32)}}

    def packed_cases(g):
        return {"b1_t6": {"x": g.standard_normal((1, 6, 8)).astype(np.float32), "lengths": np.array([6], np.int64)},
                "b5_t7": {"x": g.standard_normal((5, 7, 8)).astype(np.float32),
                          "lengths": np.array([3, 7, 1, 5, 7], np.int64)}}

    def ifloop_cases(g):
        pos = np.abs(g.standard_normal((1, 4))).astype(np.float32)
        neg = -np.abs(g.standard_normal((5, 3))).astype(np.float32)
        return {"b1_pos_n3": {"x": pos, "n": np.array(3, np.int64)},
                "b5_neg_n5": {"x": neg, "n": np.array(5, np.int64)},
                "b5_pos_n0": {"x": -neg, "n": np.array(0, np.int64)},  # zero-trip Loop: y passes through
                # the If reads the sum over the whole batch: positive, while rows 2-3 alone sum negative (a
                # runtime that ran row chunks separately would take the other branch for them)
                "b5_mixed_n2": {"x": np.array([[3, 2, 1], [2, 2, 2], [-1, -2, -1], [-1, -1, -2], [0.5, 1, 0]],
                                              np.float32), "n": np.array(2, np.int64)}}

    def list_cases(g):
        return {"b1_t5": {"x": g.standard_normal((1, 5, 3)).astype(np.float32)},
                "b5_t2": {"x": g.standard_normal((5, 2, 3)).astype(np.float32)}}

    class RNNRelu(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.RNN(8, 16, num_layers=2, nonlinearity="relu", bidirectional=True)

        def forward(self, x, h0):
            return self.rnn(x, h0)

    class WhileLoop(nn.Module):
        def forward(self, x, limit):
            y = x
            i = 0
            while bool(y.abs().sum() < limit):
                y = y * 2 + 1
                i += 1
            return y, torch.tensor(i)

    def rnn_h0_cases(g):  # time-major, with initial states: [layers * 2, N, 16]
        return {"t5_b3": {"x": g.standard_normal((5, 3, 8)).astype(np.float32),
                          "h0": g.standard_normal((4, 3, 16)).astype(np.float32)},
                "t2_b1": {"x": g.standard_normal((2, 1, 8)).astype(np.float32),
                          "h0": g.standard_normal((4, 1, 16)).astype(np.float32)}}

    def while_cases(g):
        return {"small": {"x": (g.standard_normal((2, 3)) * 0.01).astype(np.float32), "limit": np.array(50, np.float32)},
                "done": {"x": np.full((2, 3), 10, np.float32), "limit": np.array(1, np.float32)}}

    nt = {0: "N", 1: "T"}
    return {
        "torch_rnn_relu_h0": (RNNRelu, ["x", "h0"], ["y", "h"],
                              {"x": {0: "T", 1: "N"}, "h0": {1: "N"}, "y": {0: "T", 1: "N"}, "h": {1: "N"}},
                              rnn_h0_cases),
        "torch_script_while": (lambda: torch.jit.script(WhileLoop()), ["x", "limit"], ["y", "n"],
                               {"x": {0: "N", 1: "D"}, "y": {0: "N", 1: "D"}}, while_cases),
        "torch_lstm": (lambda: nn.LSTM(8, 16, num_layers=2, bidirectional=True, batch_first=True), ["x"],
                       ["y", "h", "c"], {"x": nt, "y": nt, "h": {1: "N"}, "c": {1: "N"}}, rnn_cases),
        "torch_gru": (lambda: nn.GRU(8, 16, num_layers=2, bidirectional=True, batch_first=True), ["x"], ["y", "h"],
                      {"x": nt, "y": nt, "h": {1: "N"}}, rnn_cases),
        "torch_lstm_packed": (Packed, ["x", "lengths"], ["y", "h"],
                              {"x": nt, "lengths": {0: "N"}, "y": nt, "h": {1: "N"}}, packed_cases),
        "torch_script_ifloop": (lambda: torch.jit.script(IfLoop()), ["x", "n"], ["y"],
                                {"x": {0: "N", 1: "D"}, "y": {0: "N", 1: "D"}}, ifloop_cases),
        "torch_script_list": (lambda: torch.jit.script(ListLoop()), ["x"], ["y"],
                              {"x": nt, "y": nt}, list_cases),
    }


def op_types(graph, into):
    """Counts op types of a graph and, under "<op>.<attr>/", of its subgraphs."""
    import onnx
    for n in graph.node:
        into[n.op_type] += 1
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                sub = collections.Counter()
                op_types(a.g, sub)
                for k, v in sub.items():
                    into[f"{n.op_type}.{a.name}/{k}"] += v
    return into


def keras_models():
    """name -> (model builder, input spec (name, shape without batch, dtype), cases builder); imports TensorFlow."""
    import keras
    L = keras.layers
    T, V = KERAS_T, KERAS_VOCAB

    # N(0, 1) embeddings and Dense kernels (Keras' defaults give logits of about 0.01, where the comparison's
    # absolute floor of 1e-4 would be loose): states and logits of order 1
    def emb(**kw):
        return L.Embedding(V, 16, embeddings_initializer=keras.initializers.RandomNormal(stddev=1.0), **kw)

    def dense(n):
        return L.Dense(n, kernel_initializer=keras.initializers.RandomNormal(stddev=1.0))

    def tokens(g, lengths):
        """int32 [len(lengths), T]: ids 1..V-1, zeros (padding) after each row's length."""
        x = g.integers(1, V, (len(lengths), T)).astype(np.int32)
        for r, n in enumerate(lengths):
            x[r, n:] = 0
        return x

    def text_cases(g):
        return {"b1": {"tokens": tokens(g, [T])}, "b5": {"tokens": tokens(g, [T, T, T, T, T])}}

    def padded_cases(g):
        return {"b1": {"tokens": tokens(g, [8])}, "b5": {"tokens": tokens(g, [T, 5, 1, 9, T])}}

    def series_cases(g):
        return {"b1": {"x": g.standard_normal((1, T, 6)).astype(np.float32)},
                "b5": {"x": g.standard_normal((5, T, 6)).astype(np.float32)}}

    tok = ("tokens", [T], "int32")
    return {
        "keras_lstm": (lambda: keras.Sequential([keras.Input((T,), dtype="int32"), emb(), L.LSTM(32), dense(4)]),
                       tok, text_cases),
        "keras_bigru": (lambda: keras.Sequential([keras.Input((T,), dtype="int32"), emb(),
                                                  L.Bidirectional(L.GRU(16)), dense(4)]), tok, text_cases),
        "keras_masked_lstm": (lambda: keras.Sequential([keras.Input((T,), dtype="int32"), emb(mask_zero=True),
                                                        L.LSTM(32), dense(4)]), tok, padded_cases),
        "keras_lstm_stack": (lambda: keras.Sequential([keras.Input((T, 6)), L.LSTM(24, return_sequences=True),
                                                       L.LSTM(16), dense(3)]), ("x", [T, 6], "float32"),
                             series_cases),
        # more layer settings users have: SimpleRNN and GRU(reset_after=False) (both Loops), a bidirectional
        # LSTM returning sequences, Conv1D before a backwards LSTM (LSTM over ReverseSequence)
        "keras_simplernn": (lambda: keras.Sequential([keras.Input((T, 6)), L.SimpleRNN(16), dense(3)]),
                            ("x", [T, 6], "float32"), series_cases),
        "keras_gru_v1": (lambda: keras.Sequential([keras.Input((T, 6)), L.GRU(16, reset_after=False), dense(3)]),
                         ("x", [T, 6], "float32"), series_cases),
        "keras_bilstm_seq": (lambda: keras.Sequential([keras.Input((T, 6)),
                                                       L.Bidirectional(L.LSTM(12, return_sequences=True)), dense(3)]),
                             ("x", [T, 6], "float32"), series_cases),
        "keras_conv_lstm_back": (lambda: keras.Sequential([keras.Input((T, 6)), L.Conv1D(8, 3, activation="relu"),
                                                           L.LSTM(16, go_backwards=True), dense(3)]),
                                 ("x", [T, 6], "float32"), series_cases),
    }


def flat(outs):
    import torch
    if isinstance(outs, torch.Tensor):
        return [outs]
    r = []
    for o in outs:
        r += flat(o)
    return r


def save_npy(path, arr):
    tmp = path + ".tmp.npy"
    np.save(tmp, arr)
    os.replace(tmp, path)


def cached(meta_path, settings):
    try:
        with open(meta_path) as f:
            return json.load(f).get("settings") == settings
    except (OSError, ValueError):
        return False


def write_export(mdir, meta, model_bytes, cases, run):
    """Writes model.onnx, every case's inputs and the framework's outputs (run(feeds) -> [arrays]), meta.json last."""
    import onnx
    m = onnx.load_from_string(model_bytes)
    meta["ops"] = dict(sorted(op_types(m.graph, collections.Counter()).items()))
    meta["opset_import"] = {o.domain or "ai.onnx": o.version for o in m.opset_import}
    meta["graph_inputs"] = [i.name for i in m.graph.input]
    meta["graph_outputs"] = [o.name for o in m.graph.output]
    tmp = os.path.join(mdir, "model.onnx.tmp")
    with open(tmp, "wb") as f:
        f.write(model_bytes)
    os.replace(tmp, os.path.join(mdir, "model.onnx"))
    for cname, feeds in cases.items():
        got = run(feeds)
        assert len(got) == len(meta["outputs"]), f"{meta['settings']['model']}: {len(got)} outputs"
        for i in meta["inputs"]:
            save_npy(os.path.join(mdir, meta["input_file"].format(case=cname, input=i)), feeds[i])
        for o, t in zip(meta["outputs"], got):
            save_npy(os.path.join(mdir, meta["reference_file"].format(case=cname, output=o)), np.asarray(t))


def finish(mdir, meta, t0):
    meta["export_s"] = round(time.perf_counter() - t0, 2)
    tmp = os.path.join(mdir, "meta.json.tmp")
    with open(tmp, "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(tmp, os.path.join(mdir, "meta.json"))
    return meta.get("error") or f"exported in {meta['export_s']} s: {meta['ops']}"


def export_torch(name, spec, out):
    import torch
    build, ins, outs, dyn, cases_fn = spec
    mdir = os.path.join(out, name)
    os.makedirs(mdir, exist_ok=True)
    settings = {"model": name, "seed": SEED, "opset": OPSET, "exporter": EXPORTER_VERSION,
                "framework": f"torch {torch.__version__}"}
    if cached(os.path.join(mdir, "meta.json"), settings):
        return "cached"
    t0 = time.perf_counter()
    torch.manual_seed(SEED)
    mod = build()
    mod.eval()
    cases = cases_fn(np.random.default_rng(SEED))
    meta = {"settings": settings, "inputs": ins, "outputs": outs, "cases": sorted(cases),
            "input_file": "{case}_{input}.npy", "reference_file": "{case}_ref_{output}.npy"}
    first = cases[sorted(cases)[0]]
    buf = io.BytesIO()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(mod, tuple(torch.from_numpy(first[i]) for i in ins), buf, input_names=ins,
                              output_names=outs, dynamic_axes=dyn, opset_version=OPSET)
    except Exception as e:  # the exporter's own limitation: recorded, the test says so
        meta["error"] = f"torch {torch.__version__} onnx export failed: {type(e).__name__}: {str(e)[:500]}"
        return finish(mdir, meta, t0)

    def run(feeds):
        with torch.no_grad():
            return [t.numpy() for t in flat(mod(*(torch.from_numpy(feeds[i]) for i in ins)))]
    write_export(mdir, meta, buf.getvalue(), cases, run)
    return finish(mdir, meta, t0)


def export_keras(name, spec, out):
    """tf2onnx.convert.from_function on a tf.function with an input_signature (from_keras does not take Keras 3
    models); batch dimension None. The graph's output keeps tf2onnx's name (Identity:0)."""
    import keras
    import tensorflow as tf
    import tf2onnx
    build, (iname, ishape, idtype), cases_fn = spec
    mdir = os.path.join(out, name)
    os.makedirs(mdir, exist_ok=True)
    settings = {"model": name, "seed": SEED, "opset": KERAS_OPSET, "exporter": EXPORTER_VERSION,
                "framework": f"tensorflow {tf.__version__} keras {keras.__version__} tf2onnx {tf2onnx.__version__}"}
    if cached(os.path.join(mdir, "meta.json"), settings):
        return "cached"
    t0 = time.perf_counter()
    keras.utils.set_random_seed(SEED)
    model = build()
    cases = cases_fn(np.random.default_rng(SEED))
    sig = [tf.TensorSpec([None] + list(ishape), getattr(tf, idtype), name=iname)]

    @tf.function(input_signature=sig)
    def serve(x):
        return model(x, training=False)

    meta = {"settings": settings, "inputs": [iname], "cases": sorted(cases),
            "input_file": "{case}_{input}.npy", "reference_file": "{case}_ref_{output}.npy"}
    try:
        proto, _ = tf2onnx.convert.from_function(serve, input_signature=sig, opset=KERAS_OPSET)
    except Exception as e:
        meta["error"] = f"tf2onnx {tf2onnx.__version__} conversion failed: {type(e).__name__}: {str(e)[:500]}"
        return finish(mdir, meta, t0)
    meta["outputs"] = [o.name for o in proto.graph.output]
    write_export(mdir, meta, proto.SerializeToString(), cases,
                 lambda feeds: [model(feeds[iname], training=False).numpy()])
    return finish(mdir, meta, t0)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--framework", choices=["torch", "keras"], default="torch")
    p.add_argument("--models", default="", help="comma-separated subset (default: all of the framework's)")
    a = p.parse_args()
    if a.framework == "torch":
        import torch
        torch.set_num_threads(1)
        table, export = torch_models(), export_torch
    else:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        table, export = keras_models(), export_keras
    names = [n for n in a.models.split(",") if n] or list(table)
    for n in names:
        if n not in table:
            sys.exit(f"unknown model {n!r}; known: {', '.join(table)}")
        print(f"{n}: {export(n, table[n], a.out)}", flush=True)


if __name__ == "__main__":
    main()
