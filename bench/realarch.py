#!/usr/bin/env python3
"""bench/realarch.py - real architectures (torchvision CNNs, BERT-base, GPT-2 small): tensord against onnxruntime,
checked against PyTorch.

  1. bench/realarch_export.py, run by the system Python that has torch (--torch-python, default /usr/bin/python3),
     exports every model from PyTorch into bench/out/realarch/<model>/ with seeded inputs and PyTorch's outputs
     (cached: a second run with the same settings exports nothing);
  2. for every (model, batch): `tensord predict` with ONEDNN_VERBOSE=1, whose output is compared with PyTorch's
         rel err = max|tensord - torch| / max|torch|      (must be <= 1e-4)
     and whose oneDNN verbose `exec` lines are scanned for implementations named `ref*` (oneDNN's reference
     kernels: correct, and one to three orders of magnitude slower than the jit ones);
  3. onnxruntime's output on the same inputs, compared with PyTorch's the same way (for scale: what error a
     mature runtime has on the same graph);
  4. timing as bench/run.py does it (bench/common.py): --rounds alternating rounds of a block of ORT runs and one
     `tensord bench` process. tensord's iterations per round are ORT's, but at most what fits in half of --timeout
     at the speed `tensord predict` showed in step 2 (load included), so a very slow model still gets a number;
     the runs column shows both counts when they differ.
Every tensord call has the limit --timeout (default 300 s); one that runs past it is reported as a timeout.

Prints a markdown table and, under it, every distinct ref step (primitive, implementation, shapes, how many times);
--save writes bench/results/realarch-cpu.md. Exit status 0 only if every model exported, ran and matched PyTorch
(ref steps are reported, not failed on: tests/integration/test_realarch.py fails on them).
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from common import (TOL, alternate, command_line, fmt, input_args, machine_info, max_rel_err, ort_session,  # noqa: E402
                    print_notes, run_tensord)

EXPORTER = os.path.join(HERE, "realarch_export.py")
# kept in step with realarch_export.MODELS (that module imports torch, which this Python does not have)
MODELS = ["resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b1", "densenet121",
          "convnext_tiny", "regnet_y_400mf", "googlenet", "mnasnet1_0", "swin_t", "bert_base", "gpt2_small"]


# ---- oneDNN verbose ----
RefStep = collections.namedtuple("RefStep", "primitive impl prop mds attrs problem")


def ref_steps(verbose_text):
    """The oneDNN `exec` lines whose implementation starts with `ref`, as RefStep tuples (one per executed line).
    oneDNN 2.x verbose: onednn_verbose,exec,<engine>,<primitive>,<impl>,<prop_kind>,<memory descs>,<attrs>,<aux>,
    <problem desc>,<ms>; 1.x/`dnnl_verbose` lines have the same fields."""
    out = []
    for line in verbose_text.splitlines():
        if not (line.startswith("onednn_verbose,exec,") or line.startswith("dnnl_verbose,exec,")):
            continue
        f = line.split(",")
        if len(f) < 10:
            continue
        if f[4].startswith("ref"):
            out.append(RefStep(f[3], f[4], f[5], f[6], f[7].strip(), f[-2]))
    return out


def ref_summary(steps):
    """'<count> (<kinds>)', e.g. '37 (convolution)', or '0'."""
    if not steps:
        return "0"
    kinds = sorted({s.primitive for s in steps})
    return f"{len(steps)} ({', '.join(kinds)})"


def ref_detail(steps):
    """Lines 'count x primitive impl problem [mds] [attrs]', most frequent first."""
    c = collections.Counter(steps)
    return [f"{n} x {s.primitive} {s.impl} {s.problem}  [{s.mds}]" + (f"  [{s.attrs}]" if s.attrs else "")
            for s, n in sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))]


# ---- export ----
def export(args):
    cmd = [args.torch_python, EXPORTER, "--out", args.out, "--models", ",".join(args.models),
           "--batches", ",".join(map(str, args.batches)), "--size", str(args.size), "--seq", str(args.seq),
           "--threads", str(args.threads)]
    if args.layers is not None:
        cmd += ["--layers", str(args.layers)]
    print("export: " + " ".join(cmd), file=sys.stderr, flush=True)
    try:
        cp = subprocess.run(cmd, timeout=args.export_timeout)
    except FileNotFoundError:
        return f"{args.torch_python} not found (it must have torch and torchvision: `make deps`)"
    except subprocess.TimeoutExpired:
        return f"export timed out after {args.export_timeout} s"
    return "" if cp.returncode == 0 else f"exporter exit {cp.returncode}"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of: " + ",".join(MODELS))
    p.add_argument("--batches", default="1,16", help="comma-separated batch sizes (default 1,16)")
    p.add_argument("--size", type=int, default=224, help="image side of the vision models (default 224)")
    p.add_argument("--seq", type=int, default=128, help="sequence length of the transformers (default 128)")
    p.add_argument("--layers", type=int, default=None, help="transformer layers (default 12)")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads for both runtimes (default 2)")
    p.add_argument("--iterations", type=int, default=50, help="most timed runs per (model, batch) (default 50)")
    p.add_argument("--min-iterations", type=int, default=3, help="fewest timed ORT runs (default 3)")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs before timing (default 2)")
    p.add_argument("--budget", type=float, default=6.0,
                   help="seconds of timed runs per runtime per (model, batch), at ORT's speed (default 6)")
    p.add_argument("--rounds", type=int, default=3, help="alternating timing rounds per runtime (default 3)")
    p.add_argument("--timeout", type=float, default=300.0, help="limit of every tensord call, seconds (default 300)")
    p.add_argument("--export-timeout", type=float, default=3600.0, help="limit of the export step (default 3600)")
    p.add_argument("--quick", action="store_true", help="smoke run: <=6 iterations, 1 s budget, 1 warm-up, 1 round")
    p.add_argument("--save", action="store_true", help="write bench/results/realarch-cpu.md")
    p.add_argument("--bin", default=os.environ.get("TENSORD_BIN", os.path.join(ROOT, "build", "tensord")),
                   help="tensord binary (default $TENSORD_BIN or build/tensord)")
    p.add_argument("--torch-python", default=os.environ.get("TENSORD_TORCH_PYTHON", "/usr/bin/python3"),
                   help="Python with torch/torchvision for the export (default $TENSORD_TORCH_PYTHON or "
                        "/usr/bin/python3)")
    p.add_argument("--out", default=os.path.join(HERE, "out", "realarch"),
                   help="exported models and scratch (default bench/out/realarch)")
    a = p.parse_args()
    if a.quick:
        a.iterations, a.budget, a.warmup, a.rounds = min(a.iterations, 6), 1.0, 1, 1
        a.min_iterations = min(a.min_iterations, 2)
    a.models = [m.strip() for m in a.models.split(",") if m.strip()]
    bad = [m for m in a.models if m not in MODELS]
    if bad:
        p.error(f"unknown model(s) {','.join(bad)}; choose from {','.join(MODELS)}")
    a.batches = sorted({int(b) for b in a.batches.split(",") if b.strip()})
    return a


def bench_one(args, name, meta, mdir, batch, sess, notes, ref_lists):
    """One table row for (model, batch)."""
    row = dict(model=name, batch=batch, td_med=None, ort_med=None, td_err=None, ort_err=None, ref="n/a",
               n="", status=[])
    feed_files = {i: os.path.join(mdir, meta["input_file"].format(input=i, batch=batch)) for i in meta["inputs"]}
    feeds = {i: np.load(f) for i, f in feed_files.items()}
    want = np.load(os.path.join(mdir, meta["reference_file"].format(batch=batch)))
    mpath = os.path.join(mdir, "model.onnx")

    # correctness and ref steps: one `tensord predict` under ONEDNN_VERBOSE=1 (the session path is the one
    # `tensord bench` times: both call eng_session_run once per inference)
    odir = os.path.join(mdir, f"pred_b{batch}")
    os.makedirs(odir, exist_ok=True)
    for f in os.listdir(odir):
        os.remove(os.path.join(odir, f))
    t0 = time.perf_counter()
    cp, err, _ = run_tensord([args.bin, "predict", "--model", mpath, *input_args(feed_files), "--output-dir", odir,
                              "--threads", str(args.threads)], args.timeout, env={"ONEDNN_VERBOSE": "1"})
    t_pred = time.perf_counter() - t0
    if cp is None:
        row["status"].append(("timeout: " if "timed out" in err else "") + "predict " + err)
    else:
        steps = ref_steps(cp.stdout + "\n" + cp.stderr)
        row["ref"] = ref_summary(steps)
        ref_lists[(name, batch)] = steps
        try:
            got = np.load(os.path.join(odir, meta["outputs"][0] + ".npy"))
            if got.shape != want.shape:
                row["status"].append(f"shape {got.shape} != torch {want.shape}")
            else:
                row["td_err"] = max_rel_err(got, want)
                if not np.isfinite(row["td_err"]) or row["td_err"] > TOL:
                    row["status"].append(f"MISMATCH vs torch (> {TOL:g})")
        except (OSError, ValueError) as e:
            row["status"].append(f"predict output unreadable: {e}")

    # timing; tensord's iterations are capped to what fits in half the limit at predict's speed
    slow = cp is not None and t_pred > 1.0
    per = max(t_pred, 1e-3)
    td_warm = min(args.warmup, int(0.25 * args.timeout / per)) if slow else args.warmup

    def td_iters(n):
        return max(1, min(n, int(0.5 * args.timeout / per) - td_warm)) if slow else n

    t = alternate(sess, feeds, feed_files, binary=None if cp is None else args.bin, model_path=mpath,
                  label=f"{name} b={batch}", rounds=1 if slow and t_pred * 3 > args.timeout / 4 else args.rounds,
                  warmup=args.warmup, iterations=args.iterations, budget=args.budget,
                  min_iterations=args.min_iterations, threads=args.threads, notes=notes,
                  timeout=lambda n, ort_ms: args.timeout, td_iterations=td_iters, td_warmup=td_warm)
    row["ort_med"], row["td_med"] = t["ort_med"], t["td_med"]
    row["ort_err"] = max_rel_err(t["ort_outs"][0], want)
    row["n"] = str(t["n"]) if t["td_n"] in (0, t["n"]) else f"{t['n']} / {t['td_n']}"
    if t["td_err"]:
        row["status"].append(("timeout: " if "timed out" in t["td_err"] else "") + t["td_err"])
    return row


def main():
    args = parse_args()
    args.load_start = os.getloadavg()[0]
    t_start = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    have_bin = os.path.isfile(args.bin) and os.access(args.bin, os.X_OK)
    if not have_bin:
        print(f"error: tensord binary {args.bin} not found (run `make`)", file=sys.stderr)
        return 1
    export_err = export(args)
    rows, notes, ref_lists, ok = [], [], {}, not export_err
    if export_err:
        print(f"error: {export_err}", file=sys.stderr)
    for name in args.models:
        mdir = os.path.join(args.out, name)
        try:
            with open(os.path.join(mdir, "meta.json")) as f:
                meta = json.load(f)
        except (OSError, ValueError) as e:
            rows.append(dict(model=name, batch="-", td_med=None, ort_med=None, td_err=None, ort_err=None,
                             ref="n/a", n="", status=[f"not exported: {e}"]))
            ok = False
            continue
        if "error" in meta:
            rows.append(dict(model=name, batch="-", td_med=None, ort_med=None, td_err=None, ort_err=None,
                             ref="n/a", n="", status=["skipped: " + meta["error"]]))
            continue
        sess = ort_session(os.path.join(mdir, "model.onnx"), args.threads)
        for batch in args.batches:
            if batch not in meta.get("batches", []):
                rows.append(dict(model=name, batch=batch, td_med=None, ort_med=None, td_err=None, ort_err=None,
                                 ref="n/a", n="", status=["not exported (see the exporter's messages)"]))
                ok = False
                continue
            row = bench_one(args, name, meta, mdir, batch, sess, notes, ref_lists)
            ok = ok and not row["status"]
            rows.append(row)
            print(f"{name} b={batch}: tensord {fmt(row['td_med'])} ms, ORT {fmt(row['ort_med'])} ms, "
                  f"err {fmt(row['td_err'], 8)}, ref {row['ref']} {'; '.join(row['status'])} "
                  f"[{time.perf_counter() - t_start:.0f} s]", file=sys.stderr, flush=True)
        del sess

    hdr = ("| model | batch | tensord median ms | ORT median ms | ratio tensord/ORT | tensord rel err vs torch "
           "| ORT rel err vs torch | ref steps | runs (ORT / tensord) | status |")
    lines = [hdr, "|" + "---|" * 10]
    for r in rows:
        ratio = r["td_med"] / r["ort_med"] if r["td_med"] is not None and r["ort_med"] else None
        e1 = "n/a" if r["td_err"] is None else f"{r['td_err']:.1e}"
        e2 = "n/a" if r["ort_err"] is None else f"{r['ort_err']:.1e}"
        lines.append(f"| {r['model']} | {r['batch']} | {fmt(r['td_med'])} | {fmt(r['ort_med'])} | {fmt(ratio, 2)} "
                     f"| {e1} | {e2} | {r['ref']} | {r['n']} | {'; '.join(r['status']) or 'ok'} |")
    table = "\n".join(lines)
    detail = []
    for (name, batch), steps in ref_lists.items():
        if steps:
            detail.append(f"\n{name} b={batch}: {len(steps)} ref steps")
            detail += ["  " + d for d in ref_detail(steps)]
    print(table)
    if detail:
        print("\noneDNN reference-kernel (ref*) steps, per model and batch (count x primitive impl problem "
              "[memory descs] [attrs]):" + "\n".join(detail))
    print_notes(notes, args.load_start, "realarch", t_start)

    if args.save:
        res = os.path.join(HERE, "results")
        os.makedirs(res, exist_ok=True)
        path = os.path.join(res, "realarch-cpu.md")
        with open(path, "w") as f:
            f.write("# CPU inference on real architectures: tensord vs onnxruntime, checked against PyTorch\n\n")
            f.write("Generated by `.venv/bin/python bench/realarch.py --save` (see bench/README.md). Median latency "
                    "of one inference of the batch; rel err = max|runtime - torch| / max|torch| (tensord's must be "
                    f"<= {TOL:g}); ratio < 1 means tensord is faster; ref steps = oneDNN primitives executed by a "
                    "reference (`ref*`) implementation in one inference (plus the one-time weight reorders).\n\n")
            for k, v in machine_info(args.threads, args.load_start):
                f.write(f"- {k}: {v}\n")
            f.write(f"- models: size {args.size}, seq {args.seq}, transformer layers "
                    f"{args.layers if args.layers is not None else 12}\n")
            f.write(f"- command: `{command_line()}`\n\n")
            f.write(table + "\n")
            if detail:
                f.write("\n## oneDNN reference-kernel steps\n\n```" + "\n".join(detail) + "\n```\n")
            if notes:
                f.write("\n" + "\n".join("- note: " + n_ for n_ in notes) + "\n")
        print(f"wrote {os.path.relpath(path, ROOT)}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
