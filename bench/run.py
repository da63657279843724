#!/usr/bin/env python3
"""bench/run.py - CPU inference benchmark: tensord against onnxruntime, measured in the same run.

For every (model, batch) pair it
  1. writes the model (bench/models.py, seeded) and a seeded standard-normal input under bench/out/,
  2. times onnxruntime (CPU EP, intra_op_num_threads=T, inter_op_num_threads=1, ORT_SEQUENTIAL,
     ORT_ENABLE_ALL) as many single session.run() calls timed with time.perf_counter after warm-up,
  3. runs `tensord bench --threads T` on the same model file and input with the same iteration count,
  4. runs `tensord predict` and compares its output with ORT's:
         max rel err = max|tensord - ort| / max|ort|      (over every element of every output)
     which must be <= 1e-4.
It prints one markdown table; with --save it also writes the table and the machine description to
bench/results/inference-cpu.md. Exit status is 0 only if every tensord run succeeded and matched.

The iteration count per pair is min(--iterations, what fits in --budget seconds at ORT's speed), at least
--min-iterations, so the transformer at batch 64 does not dominate the wall time.
"""
import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import models  # noqa: E402
from common import (TOL, alternate, command_line, fmt, machine_info, max_rel_err, ort_session, print_notes,  # noqa: E402
                    run_tensord)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2, help="intra-op threads for both runtimes (default 2)")
    p.add_argument("--iterations", type=int, default=100, help="most timed runs per (model, batch) (default 100)")
    p.add_argument("--min-iterations", type=int, default=5, help="fewest timed runs per (model, batch) (default 5)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs before timing (default 3)")
    p.add_argument("--budget", type=float, default=6.0,
                   help="seconds of timed runs per runtime per (model, batch), at ORT's speed (default 6)")
    p.add_argument("--models", default=",".join(models.BENCH_MODELS),
                   help="comma-separated subset of: " + ",".join(models.BENCH_MODELS))
    p.add_argument("--batches", default="1,64", help="comma-separated batch sizes (default 1,64)")
    p.add_argument("--rounds", type=int, default=3, help="alternating timing rounds per runtime (default 3)")
    p.add_argument("--quick", action="store_true", help="smoke run: <=10 iterations, 1 s budget, 1 warm-up")
    p.add_argument("--save", action="store_true", help="write bench/results/inference-cpu.md")
    p.add_argument("--bin", default=os.environ.get("TENSORD_BIN", os.path.join(ROOT, "build", "tensord")),
                   help="tensord binary (default $TENSORD_BIN or build/tensord)")
    p.add_argument("--out", default=os.path.join(HERE, "out"), help="scratch directory (default bench/out)")
    a = p.parse_args()
    if a.quick:
        a.iterations, a.budget, a.warmup = min(a.iterations, 10), 1.0, 1
        a.min_iterations = min(a.min_iterations, 3)
    a.models = [m.strip() for m in a.models.split(",") if m.strip()]
    for m in a.models:
        if m not in models.BENCH_MODELS:
            p.error(f"unknown model {m!r}; choose from {','.join(models.BENCH_MODELS)}")
    a.batches = [int(b) for b in a.batches.split(",") if b.strip()]
    return a


def main():
    args = parse_args()
    args.load_start = os.getloadavg()[0]
    os.makedirs(args.out, exist_ok=True)
    have_bin = os.path.isfile(args.bin) and os.access(args.bin, os.X_OK)
    if not have_bin:
        print(f"warning: tensord binary {args.bin} not found (run `make`); timing onnxruntime only", file=sys.stderr)

    rows, notes, ok = [], [], have_bin
    t_start = time.perf_counter()
    for name in args.models:
        fn, per_sample = models.BENCH_MODELS[name]
        mdir = os.path.join(args.out, name)
        mpath = models.write_model(fn(), os.path.join(mdir, "model.onnx"))
        sess = ort_session(mpath, args.threads)
        in_name = sess.get_inputs()[0].name
        out_names = [o.name for o in sess.get_outputs()]
        for batch in args.batches:
            x = models.make_input(per_sample, batch, seed=batch)
            xpath = os.path.join(mdir, f"x_b{batch}.npy")
            np.save(xpath, x)
            # Timing alternates between the runtimes in --rounds rounds (each a fresh `tensord bench` process and a
            # block of ORT runs), so a burst of load from other tenants of the machine hits both; the reported
            # median/p90 are the medians over rounds of each round's median/p90.
            t = alternate(sess, {in_name: x}, {in_name: xpath}, binary=args.bin if have_bin else None,
                          model_path=mpath, label=f"{name} b={batch}", rounds=args.rounds, warmup=args.warmup,
                          iterations=args.iterations, budget=args.budget, min_iterations=args.min_iterations,
                          threads=args.threads, notes=notes,
                          timeout=lambda n, ort_ms: 120 + 20 * (args.warmup + n) * ort_ms / 1e3)
            ort_outs, n_total = t["ort_outs"], t["n"]
            row = dict(model=name, batch=batch, n=n_total, ort_med=t["ort_med"], ort_p90=t["ort_p90"],
                       td_med=t["td_med"], td_p90=t["td_p90"], err=None, status=t["td_err"])
            print(f"{name} b={batch}: ort median {row['ort_med']:.3f} ms over {n_total} runs", file=sys.stderr, flush=True)
            if have_bin:
                timeout = 120 + 20 * (args.warmup + n_total) * row["ort_med"] / 1e3
                odir = os.path.join(mdir, f"pred_b{batch}")
                os.makedirs(odir, exist_ok=True)
                for f in os.listdir(odir):
                    os.remove(os.path.join(odir, f))
                cp, err, _ = run_tensord([args.bin, "predict", "--model", mpath, "--input", f"{in_name}={xpath}",
                                          "--output-dir", odir, "--threads", str(args.threads)], timeout)
                if cp is None:
                    row["status"] = (row["status"] + "; " if row["status"] else "") + "predict " + err
                else:
                    try:
                        errs = [max_rel_err(np.load(os.path.join(odir, o + ".npy")), w)
                                for o, w in zip(out_names, ort_outs)]
                        row["err"] = max(errs)
                        if row["err"] > TOL:
                            row["status"] = (row["status"] + "; " if row["status"] else "") + f"MISMATCH (> {TOL:g})"
                    except (OSError, ValueError) as e:
                        row["status"] = f"predict output unreadable: {e}"
                if row["status"]:
                    ok = False
            rows.append(row)

    hdr = ("| model | batch | tensord median ms | ORT median ms | ratio tensord/ORT | tensord p90 ms | ORT p90 ms "
           "| max rel err | runs | status |")
    lines = [hdr, "|" + "---|" * 10]
    for r in rows:
        ratio = r["td_med"] / r["ort_med"] if r["td_med"] is not None and r["ort_med"] > 0 else None
        err = "n/a" if r["err"] is None else f"{r['err']:.1e}"
        lines.append(f"| {r['model']} | {r['batch']} | {fmt(r['td_med'])} | {fmt(r['ort_med'])} | {fmt(ratio, 2)} "
                     f"| {fmt(r['td_p90'])} | {fmt(r['ort_p90'])} | {err} | {r['n']} | {r['status'] or 'ok'} |")
    table = "\n".join(lines)
    print(table)
    print_notes(notes, args.load_start, "bench", t_start)

    if args.save:
        info = machine_info(args.threads, args.load_start)
        res = os.path.join(HERE, "results")
        os.makedirs(res, exist_ok=True)
        path = os.path.join(res, "inference-cpu.md")
        with open(path, "w") as f:
            f.write("# CPU inference: tensord vs onnxruntime\n\n")
            f.write("Generated by `.venv/bin/python bench/run.py --save` (see bench/README.md). ")
            f.write(f"Median/p90 of single-inference latency; max rel err = max|tensord-ORT| / max|ORT| "
                    f"(must be <= {TOL:g}); ratio < 1 means tensord is faster.\n\n")
            for k, v in info:
                f.write(f"- {k}: {v}\n")
            f.write(f"- command: `{command_line()}`\n\n")
            f.write(table + "\n")
            if notes:
                f.write("\n" + "\n".join("- note: " + n_ for n_ in notes) + "\n")
        print(f"wrote {os.path.relpath(path, ROOT)}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
