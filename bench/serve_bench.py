"""bench/serve_bench.py - tensord serve's REST overhead against a bare libmicrohttpd server, measured in one run.

    .venv/bin/python bench/serve_bench.py [--save] [--duration S] [--bin build/tensord]

What it does (about 1-2 minutes; all on 127.0.0.1):
  1. builds build/bench/bare_mhd from bench/bare_mhd.c (gcc -O2 ... -lmicrohttpd): libmicrohttpd in tensord's
     REST threading mode (internal polling thread + epoll + a pool of N threads, keep-alive) answering
     POST /v1/models/m:predict with a fixed small JSON body;
  2. writes two bundles under bench/out/serve/: `tiny` (x [N,4] -> MatMul 4x4 + Add) and `cnn`, the seed CNN
     (bench/models.py build_cnn: Conv 32x3x3 + Relu, MaxPool 2, Flatten, Dense 10, Softmax on [N,1,28,28]);
  3. drives tensord (tiny) and bare_mhd with wrk (Lua script for the POST body, keep-alive) at 1 and 64
     connections: throughput, p50, p99 and the tensord/bare ratios;
  4. per-request overhead outside compute = tensord p50 at 1 connection - the tiny model's median compute
     time from `tensord bench` (in-process, same session thread count);
  5. the CNN at 64 connections with and without --enable_batching (max_batch_size 64; batch_timeout_micros
     2000 with num_batch_threads 1, and 0 with num_batch_threads = cores, as TF Serving's guide suggests for
     CPU serving) and the throughput gain.
--save also writes bench/results/serving-cpu.md (CPU model, cores, date, git commit, tool versions).

Both servers get the same HTTP thread count (--rest_api_num_threads; default 4 x cores, tensord's default) and
tensord runs each inference on --session-threads threads (default 1: without batching, concurrent requests fill the
cores); with batching the one batch thread runs each batch on --batch-session-threads threads (default: one row
with 1 and one with all usable cores, so that a batching row can use the whole machine too). wrk runs on the same cores as the
servers: numbers are for comparison within one run, not absolute capacity.
Needs wrk (Debian package `wrk`); when it is missing and we are root, it is installed with apt-get.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import machine  # noqa: E402
import models as bench_models  # noqa: E402

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

LUA = r"""
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = assert(io.open(os.getenv("BENCH_BODY"), "rb"))
wrk.body = f:read("*a")
f:close()
done = function(summary, latency, requests)
  io.write(string.format(
    "BENCH_JSON {\"requests\": %d, \"duration_us\": %d, \"p50_us\": %d, \"p99_us\": %d, \"mean_us\": %.1f, " ..
    "\"status_errors\": %d, \"connect_errors\": %d, \"read_errors\": %d, \"write_errors\": %d, \"timeouts\": %d}\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), latency.mean,
    summary.errors.status, summary.errors.connect, summary.errors.read, summary.errors.write, summary.errors.timeout))
end
"""


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--save", action="store_true", help="write bench/results/serving-cpu.md")
    p.add_argument("--duration", type=float, default=4.0, help="seconds per wrk run (default 4)")
    p.add_argument("--bin", default=os.environ.get("TENSORD_BIN", os.path.join(ROOT, "build", "tensord")))
    p.add_argument("--http-threads", type=int, default=4 * (os.cpu_count() or 1),
                   help="HTTP worker threads for both servers (default 4 x cores)")
    p.add_argument("--session-threads", type=int, default=1,
                   help="tensord threads per inference run without batching (default 1: concurrent requests use the cores)")
    p.add_argument("--batch-session-threads", default=f"1,{len(os.sched_getaffinity(0))}",
                   help="tensord threads per inference run with batching, one CNN row each (default 1 and all usable "
                        "cores, since the one batch thread runs every batch)")
    p.add_argument("--connections", default="1,64", help="wrk connection counts for the tiny model (default 1,64)")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "serve"), help="scratch directory")
    return p.parse_args()


# ----------------------------------------------------------------------------------------------------------------
# tools

def need_wrk():
    w = shutil.which("wrk")
    if w:
        return w
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print("wrk not found: installing the Debian package (add `wrk` to the Makefile's deps)", file=sys.stderr)
        subprocess.run(["apt-get", "install", "-y", "-q", "wrk"], check=False, stdout=subprocess.DEVNULL)
        w = shutil.which("wrk")
    if not w:
        sys.exit("error: wrk is not installed (apt-get install wrk)")
    return w


def build_tool(name, libs, needs=""):
    """Compile bench/NAME.c to build/bench/NAME (gcc -O2) when the binary is missing or older than its source."""
    src = os.path.join(ROOT, "bench", name + ".c")
    out = os.path.join(ROOT, "build", "bench", name)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    if not os.path.exists(out) or os.path.getmtime(out) < os.path.getmtime(src):
        cmd = ["gcc", "-O2", "-Wall", "-Wextra", "-o", out, src, *libs, "-lpthread"]
        cp = subprocess.run(cmd, capture_output=True, text=True)
        if cp.returncode != 0:
            sys.exit(f"error: building {name} failed{needs}:\n{' '.join(cmd)}\n{cp.stderr[-2000:]}")
    return out


def build_bare():
    return build_tool("bare_mhd", ["-lmicrohttpd"])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method, url, body=None, timeout=10):
    req = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError) as e:
        return None, str(e).encode()


class Proc:
    """A server process on a free loopback port; ready when `probe` (method, path) answers 200."""

    def __init__(self, name, argv_fn, probe, logdir, timeout=60):
        self.name = name
        self.port = free_port()
        self.log = open(os.path.join(logdir, f"{name}.log"), "w+b")
        self.argv = argv_fn(self.port)
        self.p = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.p.poll() is not None:
                raise RuntimeError(f"{name} exited {self.p.returncode}: {self.tail()}")
            st, _ = http(probe[0], self.url(probe[1]), probe[2] if len(probe) > 2 else None, timeout=2)
            if st == 200:
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{name} not ready within {timeout} s: {self.tail()}")

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def tail(self, n=1500):
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")[-n:]

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()
        return self.p.returncode


def run_wrk(wrk, url, body_path, connections, duration, lua_path):
    threads = 1 if connections == 1 else min(2, os.cpu_count() or 1)
    cmd = [wrk, f"-t{threads}", f"-c{connections}", f"-d{duration:g}s", "--timeout", "10s", "-s", lua_path, url]
    env = dict(os.environ, BENCH_BODY=body_path)
    cp = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=duration + 60)
    m = re.search(r"BENCH_JSON (\{.*\})", cp.stdout)
    if cp.returncode != 0 or not m:
        return {"error": f"wrk exit {cp.returncode}: {(cp.stderr or cp.stdout)[-300:]}"}
    r = json.loads(m.group(1))
    r["rps"] = r["requests"] / max(r["duration_us"] / 1e6, 1e-9)
    r["errors"] = r["status_errors"] + r["connect_errors"] + r["read_errors"] + r["write_errors"] + r["timeouts"]
    return r


# ----------------------------------------------------------------------------------------------------------------
# bundles

def tiny_model():
    rng = np.random.default_rng(0)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["t"]), helper.make_node("Add", ["t", "B"], ["y"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        initializer=[numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "W"),
                     numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "B")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="tensord-bench")
    m.ir_version = 8
    return m


def write_bundle(base, model):
    vdir = os.path.join(base, "1")
    if os.path.isdir(base):
        shutil.rmtree(base)
    os.makedirs(vdir)
    path = os.path.join(vdir, "model.onnx")
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path


def compute_ms(binary, model_path, x, out, threads, tag="tiny", iterations=300):
    """Median single-inference time from `tensord bench` (in-process; no HTTP)."""
    npy = os.path.join(out, f"x_{tag}.npy")
    np.save(npy, x)
    cmd = [binary, "bench", "--model", model_path, "--input", f"x={npy}", "--iterations", str(iterations), "--warmup", "5",
           "--threads", str(threads)]
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return None, "tensord bench timed out"
    m = re.search(r"median_ms=([0-9.eE+-]+)", cp.stdout + cp.stderr)
    if cp.returncode != 0 or not m:
        return None, f"tensord bench exit {cp.returncode}: {(cp.stderr or cp.stdout)[-200:]}"
    return float(m.group(1)), ""


# ----------------------------------------------------------------------------------------------------------------

def machine_info(args, wrk):
    cpu, usable, commit, out = machine.cpu_model(), machine.usable_cpus(), machine.git_commit(), machine.run_out
    wrk_v = (subprocess.run([wrk, "--version"], capture_output=True, text=True).stdout.splitlines() or [""])[0]
    mhd = out("dpkg-query", "-W", "-f", "${Version}", "libmicrohttpd-dev") or "?"
    return [
        ("date", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")),
        ("cpu", cpu),
        ("logical cpus (online / usable by this process)", f"{os.cpu_count()} / {usable}"),
        ("git commit", commit),
        ("kernel", platform.release()),
        ("wrk", wrk_v.strip() or "?"),
        ("libmicrohttpd", mhd),
        ("HTTP threads (both servers) / tensord threads per inference (batching off / on)",
         f"{args.http_threads} / {args.session_threads} / {args.batch_session_threads}"),
        ("wrk run length", f"{args.duration:g} s per row, keep-alive, wrk on the same cores"),
        ("load average (1 min) at start / end", f"{args.load_start:.2f} / {os.getloadavg()[0]:.2f}"
                                                 + ("  (machine was busy: numbers are noisy)"
                                                    if max(args.load_start, os.getloadavg()[0]) > usable else "")),
    ]


def fmt(x, nd=0):
    return "n/a" if x is None else f"{x:,.{nd}f}"


def main():
    args = parse_args()
    args.load_start = os.getloadavg()[0]
    t_start = time.monotonic()
    if not (os.path.isfile(args.bin) and os.access(args.bin, os.X_OK)):
        sys.exit(f"error: {args.bin} not found: build it with `make SERVE=1`")
    wrk = need_wrk()
    bare_bin = build_bare()
    os.makedirs(args.out, exist_ok=True)
    logdir = os.path.join(args.out, "logs")
    shutil.rmtree(logdir, ignore_errors=True)
    os.makedirs(logdir)
    lua = os.path.join(args.out, "post.lua")
    with open(lua, "w") as f:
        f.write(LUA)

    tiny = tiny_model()
    tiny_path = write_bundle(os.path.join(args.out, "tiny"), tiny)
    cnn = bench_models.build_cnn()
    cnn_path = write_bundle(os.path.join(args.out, "cnn"), cnn)
    x_tiny = np.float32([[1.0, 2.0, 3.0, 4.0]])
    tiny_body = os.path.join(args.out, "tiny.json")
    with open(tiny_body, "w") as f:
        json.dump({"instances": x_tiny.tolist()}, f)
    x_cnn = np.round(bench_models.make_input((1, 28, 28), 1), 4).astype(np.float32)
    cnn_body = os.path.join(args.out, "cnn.json")
    with open(cnn_body, "w") as f:
        json.dump({"instances": x_cnn.tolist()}, f)
    conns = [int(c) for c in args.connections.split(",")]
    notes = []

    def tensord_argv(model_dir, extra=(), session_threads=None):
        st = args.session_threads if session_threads is None else session_threads
        return lambda port: [args.bin, "serve", f"--rest_api_port={port}", "--rest_api_host=127.0.0.1", "--port=0",
                             "--model_name=m", f"--model_base_path={model_dir}",
                             f"--rest_api_num_threads={args.http_threads}",
                             f"--tensorflow_intra_op_parallelism={st}", *extra]

    def check_predict(proc, body_path, model, x):
        with open(body_path, "rb") as f:
            st, body = http("POST", proc.url("/v1/models/m:predict"), f.read())
        if st != 200:
            return f"predict answered HTTP {st}: {body[:200]!r}"
        import onnxruntime as ort
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        got = np.asarray(json.loads(body)["predictions"], dtype=np.float64)
        err = float(np.max(np.abs(got - want))) / max(float(np.max(np.abs(want))), 1e-30)
        return "" if err <= 1e-4 else f"wrong answer: max rel err {err:.2e}"

    def bench_server(name, argv_fn, probe, body_path, conn_list, model=None, x=None):
        res = {}
        try:
            proc = Proc(name, argv_fn, probe, logdir)
        except RuntimeError as e:
            notes.append(f"{name}: did not start: {e}")
            return res
        try:
            if model is not None:
                bad = check_predict(proc, body_path, model, x)
                if bad:
                    notes.append(f"{name}: {bad}")
                    return res
            run_wrk(wrk, proc.url("/v1/models/m:predict"), body_path, max(conn_list), 1.0, lua)  # warm-up
            for c in conn_list:
                r = run_wrk(wrk, proc.url("/v1/models/m:predict"), body_path, c, args.duration, lua)
                res[c] = r
                if "error" in r:
                    notes.append(f"{name} c={c}: {r['error']}")
                elif r["errors"]:
                    notes.append(f"{name} c={c}: {r['errors']} failed requests (non-2xx {r['status_errors']}, "
                                 f"connect {r['connect_errors']}, read {r['read_errors']}, write {r['write_errors']}, "
                                 f"timeout {r['timeouts']})")
            if "batching" in name:
                st, text = http("GET", proc.url("/metrics"))
                if st == 200:
                    vals = {}
                    for line in text.decode("utf-8", "replace").splitlines():
                        m = re.match(r'^tensord_batch_size_(sum|count)\{[^}]*model="m"[^}]*\}\s+(\S+)', line)
                        if m:
                            vals[m.group(1)] = vals.get(m.group(1), 0.0) + float(m.group(2))
                    if vals.get("count"):
                        res["mean_batch"] = vals["sum"] / vals["count"]
        finally:
            rc = proc.stop()
            if rc != 0:
                notes.append(f"{name}: exit status {rc} after SIGTERM: {proc.p.args[:2]}")
        return res

    print("bench: bare libmicrohttpd ...", file=sys.stderr)
    bare = bench_server("bare_mhd", lambda port: [bare_bin, str(port), str(args.http_threads)],
                        ("POST", "/v1/models/m:predict", b"{}"), tiny_body, conns)
    print("bench: tensord, tiny model ...", file=sys.stderr)
    tens = bench_server("tensord-tiny", tensord_argv(os.path.join(args.out, "tiny")), ("GET", "/v2/health/ready"),
                        tiny_body, conns, tiny, x_tiny)
    print("bench: tensord bench (compute only) ...", file=sys.stderr)
    comp_ms, why = compute_ms(args.bin, tiny_path, x_tiny, args.out, args.session_threads)
    if comp_ms is None:
        notes.append(f"compute time: {why}")
    print("bench: CNN at 64 connections, batching off / on ...", file=sys.stderr)
    # TF Serving's batching guide: a timeout of a few ms for throughput; for CPU-only serving, start from
    # batch_timeout_micros 0 with num_batch_threads = cores (batches then form from whatever is queued).
    bcfgs = []
    for timeout_us, bthreads in ((2000, 1), (0, os.cpu_count() or 1)):
        bfile = os.path.join(args.out, f"batching-{timeout_us}-{bthreads}.config")
        with open(bfile, "w") as f:
            f.write(f"max_batch_size {{ value: 64 }}\nbatch_timeout_micros {{ value: {timeout_us} }}\n"
                    f"max_enqueued_batches {{ value: 100 }}\nnum_batch_threads {{ value: {bthreads} }}\n")
        bcfgs.append((f"timeout {timeout_us} µs, {bthreads} batch thread(s)", bfile))
    cnn_dir = os.path.join(args.out, "cnn")
    cnn_off = bench_server("tensord-cnn", tensord_argv(cnn_dir), ("GET", "/v2/health/ready"), cnn_body, [64], cnn, x_cnn)
    cnn_ms = {b: compute_ms(args.bin, cnn_path, bench_models.make_input((1, 28, 28), b), args.out, args.session_threads,
                            f"cnn{b}", 50)[0] for b in (1, 64)}
    cnn_on = []
    for k, (blabel, bfile) in enumerate(bcfgs):
        for bst in [int(t) for t in str(args.batch_session_threads).split(",")]:
            cnn_on.append((f"{blabel}, {bst} thread(s) per inference",
                           bench_server(f"tensord-cnn-batching-{k}-t{bst}",
                                        tensord_argv(cnn_dir, ["--enable_batching", f"--batching_parameters_file={bfile}"], bst),
                                        ("GET", "/v2/health/ready"), cnn_body, [64], cnn, x_cnn)))

    # ---- report
    def g(res, c, k):
        r = res.get(c)
        return None if not r or "error" in r else r[k]

    def ratio(a, b):
        return "n/a" if a is None or b is None or b == 0 else f"{a / b:.2f}"

    lines = ["| server | model | connections | req/s | p50 µs | p99 µs | failed |", "|---|---|---|---|---|---|---|"]
    for name, res, model in (("bare libmicrohttpd", bare, "(fixed reply)"), ("tensord", tens, "tiny 4x4")):
        for c in conns:
            lines.append(f"| {name} | {model} | {c} | {fmt(g(res, c, 'rps'))} | {fmt(g(res, c, 'p50_us'))} | "
                         f"{fmt(g(res, c, 'p99_us'))} | {fmt(g(res, c, 'errors'))} |")
    lines += ["", "| connections | throughput tensord/bare | p50 tensord/bare | p99 tensord/bare |", "|---|---|---|---|"]
    for c in conns:
        lines.append(f"| {c} | {ratio(g(tens, c, 'rps'), g(bare, c, 'rps'))} | "
                     f"{ratio(g(tens, c, 'p50_us'), g(bare, c, 'p50_us'))} | "
                     f"{ratio(g(tens, c, 'p99_us'), g(bare, c, 'p99_us'))} |")
    p50_1 = g(tens, 1, "p50_us")
    over = None if p50_1 is None or comp_ms is None else p50_1 - comp_ms * 1000
    bare_1 = g(bare, 1, "p50_us")
    lines += ["", f"Per-request overhead outside compute (tensord p50 at 1 connection - model compute median from "
                  f"`tensord bench`): **{fmt(over)} µs** (p50 {fmt(p50_1)} µs - compute "
                  f"{fmt(None if comp_ms is None else comp_ms * 1000, 1)} µs); bare libmicrohttpd p50 at 1 connection: "
                  f"{fmt(bare_1)} µs, so tensord's own share is about "
                  f"{fmt(None if over is None or bare_1 is None else over - bare_1)} µs.", ""]
    off = g(cnn_off, 64, "rps")
    ons = [(bst, g(res, 64, "rps")) for bst, res in cnn_on]
    best = max((r for _, r in ons if r is not None), default=None)
    lines += ["| seed CNN [N,1,28,28], 64 connections | req/s | p50 µs | p99 µs | failed | mean rows per batch |",
              "|---|---|---|---|---|---|"]
    rows = [(f"batching off ({args.session_threads} thread(s) per inference)", cnn_off)]
    rows += [(f"--enable_batching (max 64, {label})", res) for label, res in cnn_on]
    for name, res in rows:
        mb = res.get("mean_batch")
        lines.append(f"| {name} | {fmt(g(res, 64, 'rps'))} | {fmt(g(res, 64, 'p50_us'))} | {fmt(g(res, 64, 'p99_us'))} | "
                     f"{fmt(g(res, 64, 'errors'))} | {'-' if mb is None else f'{mb:.1f}'} |")
    if cnn_ms[1] and cnn_ms[64]:
        lines += ["", f"CNN compute alone (`tensord bench`, {args.session_threads} thread): batch 1 {cnn_ms[1] * 1000:.0f} µs, "
                      f"batch 64 {cnn_ms[64] * 1000:.0f} µs = {cnn_ms[64] * 1000 / 64:.0f} µs per row: batching can gain "
                      f"at most {cnn_ms[1] * 64 / cnn_ms[64]:.2f}x per core from the kernels."]
    gains = ", ".join(f"{ratio(r, off)}x with {label}" for label, r in ons)
    lines += ["", f"Throughput gain from batching (batched req/s / unbatched req/s): **{ratio(best, off)}x** at best "
                  f"({gains})", ""]
    for n in notes:
        lines.append("- note: " + " / ".join(x.strip() for x in n.strip().splitlines() if x.strip()))
    elapsed = time.monotonic() - t_start
    lines.append(f"- bench wall time: {elapsed:.0f} s; server logs in {os.path.relpath(logdir, ROOT)}")
    table = "\n".join(lines)
    print(table)
    if args.save:
        info = machine_info(args, wrk)
        doc = ["# Serving on CPU: tensord REST vs a bare libmicrohttpd server", "",
               "Generated by `.venv/bin/python bench/serve_bench.py --save` (see the script's docstring). wrk drives "
               "POST /v1/models/m:predict with keep-alive on 127.0.0.1; the bare server answers a fixed body without "
               "parsing, so the ratio is tensord's REST + JSON + scheduling cost over libmicrohttpd's floor.", ""]
        doc += [f"- {k}: {v}" for k, v in info] + ["", table, ""]
        path = os.path.join(ROOT, "bench", "results", "serving-cpu.md")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("\n".join(doc))
        print(f"wrote {os.path.relpath(path, ROOT)}", file=sys.stderr)
    return 0 if not notes else 1


if __name__ == "__main__":
    sys.exit(main())
