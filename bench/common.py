"""bench/common.py - what the tensord-vs-onnxruntime benchmarks share (bench/run.py, bench/realarch.py).

  ort_session      onnxruntime CPU session configured like every benchmark here (intra T, inter 1, sequential,
                   ORT_ENABLE_ALL)
  time_ort         warm-up, then n single session.run() calls timed with perf_counter; n fits a time budget
  run_tensord      one tensord process with a timeout; failures become one line of text, never an exception
  parse_bench      the `median_ms=<x> p90_ms=<y>` last line of `tensord bench`
  tensord_bench    one `tensord bench` process (extra flags, extra environment): (median, p90) or why not
  alternate        --rounds rounds of (a block of ORT runs, one `tensord bench` process), so a burst of load from
                   other tenants of the machine hits both runtimes; medians over rounds of each round's median/p90
  max_rel_err      max|got - want| / max|want| over all elements (the benchmarks' and the tests' correctness rule)
  machine_info     the (key, value) lines every results file records about the machine
"""
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
if HERE not in sys.path:
    sys.path.insert(0, HERE)
import machine  # noqa: E402

TOL = 1e-4


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


def run_tensord(cmd, timeout, env=None):
    """Runs one tensord command; returns (CompletedProcess or None, error text, cpu seconds / wall seconds).
    `env`: extra environment variables for the child."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    w0 = time.perf_counter()
    full_env = None if env is None else {**os.environ, **env}
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
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


def parse_bench(stdout):
    """(median ms, p90 ms) from `tensord bench`'s last line, or None."""
    last = (stdout.strip().splitlines() or [""])[-1]
    m = re.search(r"median_ms=([0-9.eE+-]+)\s+p90_ms=([0-9.eE+-]+)", last)
    return (float(m.group(1)), float(m.group(2))) if m else None


def input_args(feed_files):
    """`--input NAME=FILE` arguments for {name: file}."""
    args = []
    for name, path in feed_files.items():
        args += ["--input", f"{name}={path}"]
    return args


def tensord_bench(binary, model_path, feed_files, *, iterations, warmup, threads, timeout, extra_args=(), env=None):
    """One `tensord bench` process. Returns (median ms, p90 ms, error text, cpu seconds / wall seconds): the times
    are None and the error says why (`exit 2: error: unknown option ...`, `timed out ...`, unparsed output) when it
    failed; never raises. `extra_args` go after the common flags (e.g. `--precision bf16`); `env` as run_tensord."""
    cp, err, util = run_tensord([binary, "bench", "--model", model_path, *input_args(feed_files),
                                 "--iterations", str(iterations), "--warmup", str(warmup),
                                 "--threads", str(threads), *extra_args], timeout, env)
    if cp is None:
        return None, None, err, util
    parsed = parse_bench(cp.stdout)
    if parsed is None:
        last = (cp.stdout.strip().splitlines() or [""])[-1]
        return None, None, f"output unparsed: {last[:80]!r}", util
    return parsed[0], parsed[1], "", util


def alternate(sess, feeds, feed_files, *, binary, model_path, label, rounds, warmup, iterations, budget,
              min_iterations, threads, timeout, notes, td_iterations=None, td_warmup=None):
    """Times both runtimes in `rounds` alternating rounds (a tensord failure ends the rounds there). `binary` None
    times ORT only. `timeout(n, ort_ms)` gives
    the limit of the `tensord bench` call that follows an ORT block of n runs whose median was ort_ms.
    `td_iterations(n)` / `td_warmup` override tensord's count per round (default: the same n and warm-up as ORT).
    Appends cpu-overuse notes to `notes`. Returns a dict: ort_outs, ort_med, ort_p90, n (ORT runs in all),
    td_n (tensord runs in all), td_med, td_p90 (None if tensord failed or was not run), td_err (why it failed)."""
    ort_meds, ort_p90s, td_meds, td_p90s, n_total, td_total, td_err = [], [], [], [], 0, 0, ""
    ort_outs = None
    for _ in range(rounds):
        ort_outs, ort_ms, n, ort_util = time_ort(sess, feeds, warmup, max(1, iterations // rounds),
                                                 budget / rounds, max(1, min_iterations // rounds))
        n_total += n
        ort_meds.append(float(np.median(ort_ms)))
        ort_p90s.append(float(np.percentile(ort_ms, 90)))
        if ort_util > threads + 0.5:
            notes.append(f"{label}: onnxruntime used {ort_util:.1f} cores for {threads} threads")
        if binary is None:
            continue
        tn = n if td_iterations is None else td_iterations(n)
        tw = warmup if td_warmup is None else td_warmup
        med, p90, err, td_util = tensord_bench(binary, model_path, feed_files, iterations=tn, warmup=tw,
                                               threads=threads, timeout=timeout(n, ort_meds[-1]))
        if med is None:
            td_meds, td_err = None, "bench " + err
            break
        td_total += tn
        td_meds.append(med)
        td_p90s.append(p90)
        if td_util > threads + 0.5:
            notes.append(f"{label}: tensord used {td_util:.1f} cores (cpu/wall, incl. load) for --threads {threads}")
    ok_td = binary is not None and td_meds
    return dict(ort_outs=ort_outs, ort_med=float(np.median(ort_meds)), ort_p90=float(np.median(ort_p90s)),
                n=n_total, td_n=td_total, td_med=float(np.median(td_meds)) if ok_td else None,
                td_p90=float(np.median(td_p90s)) if ok_td else None, td_err=td_err)


def max_rel_err(got, want):
    scale = max(float(np.max(np.abs(want))), 1e-30)
    return float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) / scale


def machine_info(threads, load_start):
    cpu, affinity, commit = machine.cpu_model(), machine.usable_cpus(), machine.git_commit()
    load_end = os.getloadavg()[0]
    return [
        ("date", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")),
        ("cpu", cpu),
        ("logical cpus (online / usable by this process)", f"{os.cpu_count()} / {affinity}"),
        ("threads (both runtimes)", str(threads)),
        ("onnxruntime", f"{ort.__version__} (CPUExecutionProvider, inter_op 1, sequential, ORT_ENABLE_ALL)"),
        ("numpy / python", f"{np.__version__} / {platform.python_version()}"),
        ("tensord commit", commit),
        ("load average (1 min) at start / end", f"{load_start:.2f} / {load_end:.2f}"
                                                 + ("  (machine was busy: timings are noisy)"
                                                    if max(load_start, load_end) > affinity else "")),
        ("kernel", platform.release()),
    ]


def load_note(load_start):
    """A note line if other work competed with the benchmark, else None."""
    load_end = os.getloadavg()[0]
    if max(load_start, load_end) > (os.cpu_count() or 1):
        return (f"note: load average {load_start:.1f} at start, {load_end:.1f} at end on {os.cpu_count()} cpus: "
                "other work competed with the benchmark, timings are noisy")
    return None


def print_notes(notes, load_start, label, t_start):
    """The end of a benchmark's printout: its notes, the load note if other work competed, and its wall time."""
    for n_ in notes:
        print("note: " + n_)
    ln = load_note(load_start)
    if ln:
        print(ln)
    print(f"{label} wall time {time.perf_counter() - t_start:.0f} s", file=sys.stderr)


def write_result(title, intro, threads, load_start, extra_info, body, notes, save_name=None):
    """A results page: title, intro, the machine (onnxruntime lines left out), extra_info ("key: value" lines), the
    command, the body lines (a table), then the notes and the load note as "- " items. Printed; written to
    bench/results/<save_name> when given."""
    lines = [f"# {title}", "", intro, ""]
    lines += [f"- {k}: {v}" for k, v in machine_info(threads, load_start) if not k.startswith("onnxruntime")]
    lines += [f"- {x}" for x in extra_info] + [f"- command: `{command_line()}`", ""] + list(body)
    tail = list(notes) + [n_ for n_ in [load_note(load_start)] if n_]
    if tail:
        lines += [""] + [f"- {n_}" for n_ in tail]
    text = "\n".join(lines) + "\n"
    print(text)
    if save_name:
        with open(os.path.join(ROOT, "bench", "results", save_name), "w") as f:
            f.write(text)


def fmt(x, nd=3):
    return "n/a" if x is None else f"{x:.{nd}f}"


def command_line():
    return " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])
