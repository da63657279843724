#!/usr/bin/env python3
"""bench/ab_bench.py - two tensord binaries (before / after a change) on bench/run.py's CPU models, interleaved.

For every (model, batch) of bench/run.py (bench/models.py, the same seeded models and inputs, written under --out),
it runs `tensord bench --threads T` with the BEFORE binary and the AFTER binary, alternating, --rounds times each,
and reports per binary the min and the median of the rounds' medians, and their ratio after/before (< 1: the change
made it faster). Both binaries must give the same predictions (`tensord predict`, max rel err <= 1e-4 vs each
other). Alternating makes a burst of load from other tenants of the machine hit both. Used for issue 14's "the CPU
backend runs through the new interface with no slowdown" (bench/results/backend-interface-cpu.md).

Usage: bench/ab_bench.py --before OLD/tensord [--after build/tensord] [--rounds 5] [--save NAME.md] [--title T]
"""
import argparse
import os
import sys
import time

import numpy as np
import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import models  # noqa: E402
from common import TOL, fmt, max_rel_err, run_tensord, tensord_bench, write_result  # noqa: E402


def predict(binary, mpath, in_name, xpath, odir, threads):
    os.makedirs(odir, exist_ok=True)
    for f in os.listdir(odir):
        os.remove(os.path.join(odir, f))
    cp, err, _ = run_tensord([binary, "predict", "--model", mpath, "--input", f"{in_name}={xpath}", "--output-dir", odir,
                              "--threads", str(threads)], 600)
    if cp is None:
        return None, err
    return [np.load(os.path.join(odir, f)) for f in sorted(os.listdir(odir))], ""


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, help="the binary before the change")
    p.add_argument("--after", default=os.path.join(ROOT, "build", "tensord"), help="the binary after (build/tensord)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iterations", type=int, default=50, help="timed runs per `tensord bench` (batch 64: a fifth)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--models", default=",".join(models.BENCH_MODELS))
    p.add_argument("--batches", default="1,64")
    p.add_argument("--out", default=os.path.join(HERE, "out"))
    p.add_argument("--save", default=None, help="write bench/results/<SAVE>")
    p.add_argument("--title", default="tensord before vs after a change: CPU inference, interleaved")
    p.add_argument("--intro", default="")
    args = p.parse_args()
    load_start = os.getloadavg()[0]
    t_start = time.perf_counter()
    rows, notes, ok, ratios_min, ratios_med = [], [], True, [], []
    for name in args.models.split(","):
        fn, per_sample = models.BENCH_MODELS[name]
        mdir = os.path.join(args.out, name)
        mpath = models.write_model(fn(), os.path.join(mdir, "model.onnx"))
        in_name = onnx.load(mpath).graph.input[0].name
        for batch in [int(b) for b in args.batches.split(",")]:
            xpath = os.path.join(mdir, f"x_b{batch}.npy")
            np.save(xpath, models.make_input(per_sample, batch, seed=batch))
            outs = {}
            for label, binary in (("before", args.before), ("after", args.after)):
                outs[label], err = predict(binary, mpath, in_name, xpath, os.path.join(mdir, f"ab_{label}_b{batch}"),
                                           args.threads)
                if outs[label] is None:
                    notes.append(f"{name} b={batch}: {label} predict failed: {err}")
                    ok = False
            same = None
            if outs["before"] is not None and outs["after"] is not None:
                same = max(max_rel_err(a, b) for a, b in zip(outs["after"], outs["before"]))
                if same > TOL:
                    ok = False
                    notes.append(f"{name} b={batch}: predictions differ by {same:.2e}")
            meds = {"before": [], "after": []}
            iters = max(5, args.iterations // (5 if batch > 1 else 1))
            for _ in range(args.rounds):
                for label, binary in (("before", args.before), ("after", args.after)):
                    med, _p90, err, _ = tensord_bench(binary, mpath, {in_name: xpath}, iterations=iters, warmup=3,
                                                      threads=args.threads, timeout=900)
                    if med is None:
                        notes.append(f"{name} b={batch}: {label}: {err}")
                        ok = False
                    else:
                        meds[label].append(med)
            if not meds["before"] or not meds["after"]:
                continue
            b_min, b_med = min(meds["before"]), float(np.median(meds["before"]))
            a_min, a_med = min(meds["after"]), float(np.median(meds["after"]))
            ratios_min.append(a_min / b_min)
            ratios_med.append(a_med / b_med)
            rows.append(f"| {name} | {batch} | {fmt(b_min, 4)} | {fmt(b_med, 4)} | {fmt(a_min, 4)} | {fmt(a_med, 4)} "
                        f"| {a_min / b_min:.3f} | {a_med / b_med:.3f} | {'n/a' if same is None else f'{same:.1e}'} |")
            print(rows[-1], file=sys.stderr, flush=True)
    body = ["| model | batch | before min | before median | after min | after median | after/before (min) "
            "| after/before (median) | predictions differ |", "|" + "---|" * 9] + rows
    if ratios_min:
        body += ["", f"Geometric mean after/before: {float(np.exp(np.mean(np.log(ratios_min)))):.3f} (min), "
                     f"{float(np.exp(np.mean(np.log(ratios_med)))):.3f} (median)."]
    intro = args.intro or (f"`tensord bench --threads {args.threads}` of two binaries on bench/run.py's models, "
                           f"alternated {args.rounds} times per (model, batch); ms, min and median of the rounds' "
                           "medians; predictions of the two binaries compared (max rel err).")
    write_result(args.title, intro, args.threads, load_start,
                 [f"before: `{args.before}`", f"after: `{args.after}`",
                  f"wall time {time.perf_counter() - t_start:.0f} s"], body, notes, args.save)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
