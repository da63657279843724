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
import datetime
import os
import platform
import re
import resource
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import machine  # noqa: E402
import models  # noqa: E402

TOL = 1e-4


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


def ort_session(path, threads):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def time_ort(sess, feeds, warmup, iterations, budget, min_iterations):
    """Returns (outputs, per-run ms array, iteration count used, cpu seconds / wall seconds)."""
    for _ in range(max(1, warmup)):
        outs = sess.run(None, feeds)
    t0 = time.perf_counter()
    sess.run(None, feeds)
    one = time.perf_counter() - t0
    n = int(max(min_iterations, min(iterations, budget / max(one, 1e-6))))
    times = np.empty(n)
    c0, w0 = time.process_time(), time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times[i] = (time.perf_counter() - t0) * 1e3
    wall = time.perf_counter() - w0
    # cpu/wall is meaningless over a few milliseconds (clock granularity): report it only for longer windows
    util = (time.process_time() - c0) / wall if wall >= 0.25 else 0.0
    return outs, times, n, util


def run_tensord(cmd, timeout):
    """Runs one tensord command; returns (CompletedProcess or None, error text, cpu seconds / wall seconds)."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    w0 = time.perf_counter()
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s", 0.0
    wall = time.perf_counter() - w0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    util = (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) / max(wall, 1e-9)
    if cp.returncode != 0:
        why = f"signal {-cp.returncode}" if cp.returncode < 0 else f"exit {cp.returncode}"
        msg = (cp.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        return None, f"{why}: {msg[:160]}", util
    return cp, "", util


def max_rel_err(got, want):
    scale = max(float(np.max(np.abs(want))), 1e-30)
    return float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) / scale


def machine_info(args):
    cpu, affinity, commit = machine.cpu_model(), machine.usable_cpus(), machine.git_commit()
    return [
        ("date", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")),
        ("cpu", cpu),
        ("logical cpus (online / usable by this process)", f"{os.cpu_count()} / {affinity}"),
        ("threads (both runtimes)", str(args.threads)),
        ("onnxruntime", f"{ort.__version__} (CPUExecutionProvider, inter_op 1, sequential, ORT_ENABLE_ALL)"),
        ("numpy / python", f"{np.__version__} / {platform.python_version()}"),
        ("tensord commit", commit),
        ("load average (1 min) at start / end", f"{args.load_start:.2f} / {os.getloadavg()[0]:.2f}"
                                                 + ("  (machine was busy: timings are noisy)"
                                                    if max(args.load_start, os.getloadavg()[0]) > affinity else "")),
        ("kernel", platform.release()),
    ]


def fmt(x, nd=3):
    return "n/a" if x is None else f"{x:.{nd}f}"


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
            ort_meds, ort_p90s, td_meds, td_p90s, n_total = [], [], [], [], 0
            for rnd in range(args.rounds):
                ort_outs, ort_ms, n, ort_util = time_ort(sess, {in_name: x}, args.warmup,
                                                         max(1, args.iterations // args.rounds), args.budget / args.rounds,
                                                         max(1, args.min_iterations // args.rounds))
                n_total += n
                ort_meds.append(float(np.median(ort_ms)))
                ort_p90s.append(float(np.percentile(ort_ms, 90)))
                if ort_util > args.threads + 0.5:
                    notes.append(f"{name} b={batch}: onnxruntime used {ort_util:.1f} cores for {args.threads} threads")
                if not have_bin:
                    continue
                timeout = 120 + 20 * (args.warmup + n) * ort_meds[-1] / 1e3
                cp, err, td_util = run_tensord([args.bin, "bench", "--model", mpath, "--input", f"{in_name}={xpath}",
                                                "--iterations", str(n), "--warmup", str(args.warmup),
                                                "--threads", str(args.threads)], timeout)
                if cp is None:
                    td_meds = None
                    row_err = "bench " + err
                    break
                last = (cp.stdout.strip().splitlines() or [""])[-1]
                m = re.search(r"median_ms=([0-9.eE+-]+)\s+p90_ms=([0-9.eE+-]+)", last)
                if not m:
                    td_meds = None
                    row_err = f"bench output unparsed: {last[:80]!r}"
                    break
                td_meds.append(float(m.group(1)))
                td_p90s.append(float(m.group(2)))
                if td_util > args.threads + 0.5:
                    notes.append(f"{name} b={batch}: tensord used {td_util:.1f} cores (cpu/wall, incl. load) "
                                 f"for --threads {args.threads}")
            row = dict(model=name, batch=batch, n=n_total, ort_med=float(np.median(ort_meds)),
                       ort_p90=float(np.median(ort_p90s)), td_med=None, td_p90=None, err=None, status="")
            print(f"{name} b={batch}: ort median {row['ort_med']:.3f} ms over {n_total} runs", file=sys.stderr, flush=True)
            if have_bin:
                if td_meds is None:
                    row["status"] = row_err
                else:
                    row["td_med"], row["td_p90"] = float(np.median(td_meds)), float(np.median(td_p90s))
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
    for n_ in notes:
        print("note: " + n_)
    load_end = os.getloadavg()[0]
    if max(args.load_start, load_end) > (os.cpu_count() or 1):
        print(f"note: load average {args.load_start:.1f} at start, {load_end:.1f} at end on {os.cpu_count()} cpus: "
              "other work competed with the benchmark, timings are noisy")
    print(f"bench wall time {time.perf_counter() - t_start:.0f} s", file=sys.stderr)

    if args.save:
        info = machine_info(args)
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
            f.write(f"- command: `{' '.join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])}`\n\n")
            f.write(table + "\n")
            if notes:
                f.write("\n" + "\n".join("- note: " + n_ for n_ in notes) + "\n")
        print(f"wrote {os.path.relpath(path, ROOT)}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
