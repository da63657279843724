"""bench/grpc_bench.py - tensord's gRPC and REST front doors, and MLServer on the same ONNX file, measured in one run.

    .venv/bin/python bench/grpc_bench.py [--save] [--duration S] [--bin build/tensord] [--mlserver-venv DIR]

What it does (about 3-4 minutes at the default 5 s per row on 2 cores; all on 127.0.0.1):
  1. builds build/bench/grpc_load from bench/grpc_load.c (gcc -O2, gRPC C core from libgrpc-dev): a closed-loop
     client that keeps N unary calls in flight on 1-2 channels, each re-issued when it completes, and prints
     requests / errors / p50 / p99 / mean latency as one JSON line;
  2. writes two bundles under bench/out/grpc/: `cnn`, the seed CNN (bench/models.py build_cnn, as
     bench/serve_bench.py serves it: x [N,1,28,28] -> [N,10]) and `resnet18`, torchvision's ResNet-18 (random
     init, BatchNorm statistics randomised; x [N,3,224,224] -> [N,1000]) exported to ONNX by
     bench/realarch_export.py with the system Python (cached in bench/out/realarch/ as realarch.py caches it);
  3. serializes one request per protocol, one row each ([1,...] float32, the same numbers, rounded to 4 decimals so
     that JSON and binary carry the same values): TF Serving REST JSON {"instances": ...}, KServe v2 REST JSON
     {"inputs": [{"data": flat}]}, TF Serving PredictRequest (tf.make_tensor_proto: tensor_content) and KServe
     ModelInferRequest (raw_input_contents) with the pip protobuf modules (tensorflow-serving-api, tritonclient);
  4. starts `tensord serve` with its defaults (no thread flags) and, per protocol: checks one answer against
     onnxruntime (max rel err <= 1e-4) and takes the idle latency of one request, warms up for --warmup s
     (default 1) at the largest stream count, then measures each stream count S, starting from an idle server,
     for max(--duration, 3 x S x idle latency) s (at most 4 x --duration): REST with wrk (keep-alive, the Lua
     POST script of serve_bench.py), gRPC with grpc_load. After every wrk run single requests are sent until one
     is answered at idle speed: wrk abandons its last requests in the server, and they must not land in the next
     row (grpc_load waits for its own calls). A row of 3 x S idle latencies holds mostly answers that waited
     behind a full queue of S, so p50/p99 describe the loaded server, not the ramp from idle;
  5. starts MLServer (PyPI `mlserver`, in its own venv: never in .venv, whose pins conflict) serving the same
     model.onnx through bench/mlserver_runtime/onnx_runtime.py (an MLModel whose load() makes an onnxruntime
     InferenceSession with onnxruntime's defaults and whose predict() runs it), and measures KServe v2 REST and
     gRPC ModelInfer the same way;
  6. prints the table and the ratios: tensord gRPC / tensord REST JSON at the largest stream count (target >= 1.3x
     on the seed CNN) and tensord / MLServer per protocol and stream count (target >= 5x).
--save also writes bench/results/grpc-cpu.md (machine, date, git commit, tool versions, settings, table, ratios).

Settings, so that neither server is tuned: tensord runs with its own defaults (one execution instance using all
cores per inference, 4 HTTP threads per core); MLServer with its defaults (parallel_workers 1 inference worker
process, adaptive batching off, metrics on) except `debug: false`, which only turns off its per-request access log
(debug defaults to true; with it on MLServer would be slower, which would flatter tensord). The load generators run
on the same cores as the servers (1 thread at 1 stream, 2 otherwise, for wrk and grpc_load alike): the numbers are
for comparison within one run, not absolute capacity.

The MLServer venv: --mlserver-venv DIR (must have bin/mlserver and onnxruntime), else bench/out/mlserver-venv,
created from PyPI on first use (pip install mlserver onnxruntime 'uvloop<0.22'). uvloop >= 0.22 kills MLServer
1.7's inference workers at start ("There is no current event loop", SeldonIO/MLServer#2286); a venv that has it is
pinned back to uvloop<0.22 with a printed note.

Besides req/s and latency each row has the CPU time per answered request of the server (its whole process tree:
MLServer's inference workers included) and of the load generator, and "other CPU %": the share of the machine used
by processes outside this benchmark during the row (/proc/stat less the server, the load generator and this
script); a row with more than a few % had company and its numbers are suspect. Before each row the script waits
(0.5 s samples) while something else keeps over 10 % of the machine busy, up to --quiet-wait s over the whole run.

Exit status: 0 when every tensord row ran with no failed request and every answer matched; 1 otherwise (MLServer's
own failures, e.g. wrk's 10 s timeouts, are notes only; the targets are reported, not failed on); 2 when a tool is
missing.
"""
import argparse
import datetime
import json
import math
import os
import platform
import resource
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import machine  # noqa: E402
import models as bench_models  # noqa: E402
import serve_bench  # noqa: E402  (Proc, http, free_port, run_wrk, need_wrk, write_bundle, LUA)

P_TFS_REST, P_V2_REST, P_TFS_GRPC, P_V2_GRPC = "REST TF Serving JSON", "REST KServe v2 JSON", \
    "gRPC TF Serving Predict", "gRPC KServe ModelInfer"
PROTOCOLS = [P_TFS_REST, P_V2_REST, P_TFS_GRPC, P_V2_GRPC]
MLSERVER_PROTOCOLS = [P_V2_REST, P_V2_GRPC]
M_PREDICT = "/tensorflow.serving.PredictionService/Predict"
M_INFER = "/inference.GRPCInferenceService/ModelInfer"
MODEL_LABEL = {"cnn": "seed CNN [1,1,28,28]", "resnet18": "ResNet-18 [1,3,224,224]"}
TOL = 1e-4
DRAIN_S = 180


def drain(url, body, idle_s):
    """Waits until the server answers `body` about as fast as when idle (3x + 10 ms), i.e. the requests wrk left
    in its queue are done; returns how many requests that took, None if still busy after DRAIN_S."""
    t_end = time.monotonic() + DRAIN_S
    n = 0
    while time.monotonic() < t_end:
        t0 = time.monotonic()
        st, _ = serve_bench.http("POST", url, body, timeout=DRAIN_S)
        n += 1
        if st == 200 and time.monotonic() - t0 <= 3 * idle_s + 0.01:
            return n
    return None


CLK_TCK = os.sysconf("SC_CLK_TCK")


def tree_cpu_s(pid):
    """CPU seconds (user + system) used so far by process `pid` and all its descendants (MLServer's workers)."""
    stats = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(d)] = (int(fields[1]), int(fields[11]) + int(fields[12]))  # ppid, utime + stime
    tree, total, grew = {pid}, 0, True
    while grew:
        grew = False
        for p, (pp, _) in stats.items():
            if pp in tree and p not in tree:
                tree.add(p)
                grew = True
    for p in tree:
        total += stats.get(p, (0, 0))[1]
    return total / CLK_TCK


def children_cpu_s():
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def machine_busy_s():
    """CPU seconds the whole machine has been busy (all CPUs; /proc/stat minus idle and iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / CLK_TCK


def self_cpu_s():
    t = os.times()
    return t.user + t.system


def wait_quiet(budget):
    """Before a row (the server idle): waits while other processes keep more than 10 % of the machine busy, for
    at most budget[0] seconds, which it decrements; returns the seconds waited."""
    t0 = time.monotonic()
    while True:
        a, w = machine_busy_s(), time.monotonic()
        time.sleep(0.5)
        if (machine_busy_s() - a) / ((time.monotonic() - w) * machine.usable_cpus()) < 0.10:
            break
        if time.monotonic() - t0 >= budget[0]:
            break
    waited = time.monotonic() - t0 - 0.5
    budget[0] = max(0.0, budget[0] - waited)
    return max(0.0, waited)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--save", action="store_true", help="write bench/results/grpc-cpu.md")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per measured row (default 5)")
    p.add_argument("--warmup", type=float, default=1.0,
                   help="seconds of the same load just before each measured row (default 1)")
    p.add_argument("--bin", default=os.environ.get("TENSORD_BIN", os.path.join(ROOT, "build", "tensord")))
    p.add_argument("--mlserver-venv", default=None,
                   help="venv with mlserver + onnxruntime (default bench/out/mlserver-venv, created from PyPI)")
    p.add_argument("--no-mlserver", action="store_true", help="skip MLServer (tensord rows only)")
    p.add_argument("--quiet-wait", type=float, default=300,
                   help="seconds in all that rows may wait for other processes to leave the machine (default 300)")
    p.add_argument("--models", default="cnn,resnet18", help="subset of cnn,resnet18 (default both)")
    p.add_argument("--streams", default="1,64", help="concurrent streams / connections (default 1,64)")
    p.add_argument("--size", type=int, default=224, help="ResNet-18 image side (default 224)")
    p.add_argument("--torch-python", default=os.environ.get("TENSORD_TORCH_PYTHON", "/usr/bin/python3"),
                   help="Python with torch + torchvision for the export (default /usr/bin/python3)")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "grpc"), help="scratch directory")
    a = p.parse_args()
    a.models = [m.strip() for m in a.models.split(",") if m.strip()]
    if set(a.models) - set(MODEL_LABEL):
        p.error(f"--models: choose from {','.join(MODEL_LABEL)}")
    a.streams = sorted({int(s) for s in a.streams.split(",")})
    return a


# ----------------------------------------------------------------------------------------------------------------
# tools

def build_grpc_load():
    flags = machine.run_out("pkg-config", "--cflags", "--libs", "grpc").split() or ["-lgrpc", "-lgpr"]
    return serve_bench.build_tool("grpc_load", flags, needs=" (needs libgrpc-dev)")


def run_grpc_load(tool, target, method, req_path, streams, duration, dump=None):
    cmd = [tool, target, method, req_path, str(streams), f"{duration:g}"] + (["--dump", dump] if dump else [])
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60)
    except subprocess.TimeoutExpired:
        return {"error": "grpc_load timed out"}
    line = next((ln for ln in reversed(cp.stdout.splitlines()) if ln.startswith("{")), None)
    if cp.returncode != 0 or not line:
        return {"error": f"grpc_load exit {cp.returncode}: {(cp.stderr or cp.stdout)[-300:]}"}
    return json.loads(line)


def venv_py(venv, code):
    return machine.run_out(os.path.join(venv, "bin", "python"), "-c", code)


def mlserver_venv(args):
    """The venv MLServer runs from: --mlserver-venv, else bench/out/mlserver-venv (created from PyPI)."""
    venv = args.mlserver_venv or os.path.join(ROOT, "bench", "out", "mlserver-venv")
    if not os.path.exists(os.path.join(venv, "bin", "mlserver")):
        if args.mlserver_venv:
            sys.exit(f"error: --mlserver-venv {venv} has no bin/mlserver")
        print(f"bench: creating {os.path.relpath(venv, ROOT)} from PyPI (mlserver, onnxruntime) ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        pip = os.path.join(venv, "bin", "pip")
        cp = subprocess.run([pip, "install", "-q", "mlserver", "onnxruntime", "uvloop<0.22"])
        if cp.returncode != 0:
            sys.exit(f"error: pip install mlserver onnxruntime into {venv} failed")
    if not venv_py(venv, "import onnxruntime; print(1)"):
        sys.exit(f"error: {venv} has no onnxruntime (pip install onnxruntime there)")
    uv = venv_py(venv, "import uvloop; print(uvloop.__version__)")
    if uv and tuple(int(x) for x in uv.split(".")[:2]) >= (0, 22):
        print(f"bench: note: {venv} has uvloop {uv}, which kills MLServer's inference workers at start "
              "(SeldonIO/MLServer#2286); installing uvloop<0.22 there", file=sys.stderr)
        subprocess.run([os.path.join(venv, "bin", "pip"), "install", "-q", "uvloop<0.22"], check=False)
    return venv


# ----------------------------------------------------------------------------------------------------------------
# models, payloads, answers

def prepare_model(name, args):
    """Writes the tensord bundle bench/out/grpc/<name>/1/model.onnx; returns (model path, input x rounded to 4
    decimals, onnxruntime's output on x)."""
    import onnx
    import onnxruntime as ort
    if name == "cnn":
        model = bench_models.build_cnn()
        x = bench_models.make_input((1, 28, 28), 1)
    else:
        exp = os.path.join(ROOT, "bench", "out", "realarch")
        cmd = [args.torch_python, os.path.join(ROOT, "bench", "realarch_export.py"), "--out", exp,
               "--models", "resnet18", "--batches", "1", "--size", str(args.size)]
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        src = os.path.join(exp, "resnet18", "model.onnx")
        if cp.returncode != 0 or not os.path.isfile(src):
            raise RuntimeError(f"resnet18 export failed ({' '.join(cmd)}): {cp.stderr[-500:]}")
        model = onnx.load(src)
        x = np.load(os.path.join(exp, "resnet18", "x_b1.npy"))
    x = np.round(x, 4).astype(np.float32)
    path = serve_bench.write_bundle(os.path.join(args.out, name), model)
    so = ort.SessionOptions()
    want = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    return path, x, want


def write_payloads(d, x):
    """The four request bodies for input x ([1,...] float32): {protocol: path}."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2
    from tritonclient.grpc import service_pb2
    paths = {P_TFS_REST: os.path.join(d, "tfs.json"), P_V2_REST: os.path.join(d, "v2.json"),
             P_TFS_GRPC: os.path.join(d, "tfs_predict.bin"), P_V2_GRPC: os.path.join(d, "kserve_infer.bin")}
    with open(paths[P_TFS_REST], "w") as f:
        json.dump({"instances": x.tolist()}, f)
    with open(paths[P_V2_REST], "w") as f:
        json.dump({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                               "data": x.reshape(-1).tolist()}]}, f)
    req = predict_pb2.PredictRequest()
    req.model_spec.name = "m"
    req.inputs["x"].CopyFrom(tf.make_tensor_proto(x))
    assert req.inputs["x"].tensor_content, "make_tensor_proto did not use tensor_content"
    with open(paths[P_TFS_GRPC], "wb") as f:
        f.write(req.SerializeToString())
    ir = service_pb2.ModelInferRequest(model_name="m")
    t = ir.inputs.add()
    t.name, t.datatype = "x", "FP32"
    t.shape.extend(x.shape)
    ir.raw_input_contents.append(x.tobytes())
    with open(paths[P_V2_GRPC], "wb") as f:
        f.write(ir.SerializeToString())
    return paths


def decode_answer(proto, body):
    """The output array of one answer (bytes) of `proto`; raises ValueError with what was wrong."""
    if proto == P_TFS_REST:
        return np.asarray(json.loads(body)["predictions"], dtype=np.float64)
    if proto == P_V2_REST:
        o = json.loads(body)["outputs"][0]
        return np.asarray(o["data"], dtype=np.float64).reshape(o["shape"])
    if proto == P_TFS_GRPC:
        import tensorflow as tf
        from tensorflow_serving.apis import predict_pb2
        r = predict_pb2.PredictResponse()
        r.ParseFromString(body)
        if len(r.outputs) != 1:
            raise ValueError(f"PredictResponse has outputs {list(r.outputs)}, expected one")
        return tf.make_ndarray(next(iter(r.outputs.values()))).astype(np.float64)
    from tritonclient.grpc import service_pb2
    r = service_pb2.ModelInferResponse()
    r.ParseFromString(body)
    if len(r.outputs) != 1:
        raise ValueError(f"ModelInferResponse has {len(r.outputs)} outputs, expected one")
    o = r.outputs[0]
    if r.raw_output_contents:
        a = np.frombuffer(r.raw_output_contents[0], dtype=np.float32)
    else:
        a = np.asarray(o.contents.fp32_contents, dtype=np.float32)
    return a.astype(np.float64).reshape(list(o.shape))


def rel_err(got, want):
    if got.size != want.size:
        raise ValueError(f"answer has {got.size} values, expected {want.size} (shape {list(got.shape)} vs "
                         f"{list(want.shape)})")
    return float(np.max(np.abs(got.reshape(want.shape) - want))) / max(float(np.max(np.abs(want))), 1e-30)


# ----------------------------------------------------------------------------------------------------------------

def tool_versions(args, wrk, venv):
    out = machine.run_out
    v = [("wrk", (out(wrk, "--version").splitlines() or ["?"])[0].strip() or "?"),
         ("gRPC C core (grpc_load; tensord links the same)",
          f"libgrpc-dev {out('dpkg-query', '-W', '-f', '${Version}', 'libgrpc-dev') or '?'}"),
         ("tensord", out(args.bin, "version") or "?"),
         ("onnxruntime (.venv, reference answers)", __import__("onnxruntime").__version__)]
    if venv:
        v += [("MLServer", venv_py(venv, "import mlserver; print(mlserver.__version__)") or "?"),
              ("onnxruntime (MLServer venv)",
               venv_py(venv, "import onnxruntime; print(onnxruntime.__version__)") or "?"),
              ("uvloop / grpcio (MLServer venv)",
               venv_py(venv, "import uvloop, grpc; print(uvloop.__version__, '/', grpc.__version__)") or "?"),
              ("python (MLServer venv)", venv_py(venv, "import platform; print(platform.python_version())") or "?")]
    if "resnet18" in args.models:
        v.append(("torch / torchvision (export)",
                  out(args.torch_python, "-c", "import torch, torchvision; print(torch.__version__, '/', "
                      "torchvision.__version__)") or "?"))
    return v


def mlserver_defaults(venv):
    code = ("from mlserver.settings import Settings, ModelSettings, ModelParameters; import os, onnxruntime as o; "
            "s = Settings(); m = ModelSettings(name='m', implementation='mlserver.MLModel'); "
            "print(f'parallel_workers {s.parallel_workers} (default), adaptive batching max_batch_size '"
            "f'{m.max_batch_size} / max_batch_time {m.max_batch_time} (default: off), metrics_endpoint '"
            "f'{s.metrics_endpoint} (default), debug false (default {s.debug}: per-request access log); '"
            "f'onnxruntime InferenceSession defaults (intra-op threads 0 = one per core: {os.cpu_count()})')")
    return venv_py(venv, code) or "?"


fmt = serve_bench.fmt


def main():
    args = parse_args()
    args.load_start = os.getloadavg()[0]
    t_start = time.monotonic()
    if not (os.path.isfile(args.bin) and os.access(args.bin, os.X_OK)):
        print(f"error: {args.bin} not found: build it with `make`", file=sys.stderr)
        return 2
    wrk = serve_bench.need_wrk()
    gl = build_grpc_load()
    venv = None if args.no_mlserver else mlserver_venv(args)
    os.makedirs(args.out, exist_ok=True)
    logdir = os.path.join(args.out, "logs")
    shutil.rmtree(logdir, ignore_errors=True)
    os.makedirs(logdir)
    lua = os.path.join(args.out, "post.lua")
    with open(lua, "w") as f:
        f.write(serve_bench.LUA)
    notes, results = [], {}  # results[(model, server, protocol, streams)] = grpc_load / run_wrk dict
    smax = max(args.streams)
    no_grpc_host = []
    quiet, quiet_waits = [args.quiet_wait], []

    def tensord_argv(model_dir, grpc_port):
        def argv(port):
            a = [args.bin, "serve", f"--port={grpc_port}", f"--rest_api_port={port}", "--rest_api_host=127.0.0.1",
                 "--model_name=m", f"--model_base_path={model_dir}"]
            return a if no_grpc_host else a + ["--grpc_api_host=127.0.0.1"]
        return argv

    def mlserver_argv(root, model_path, grpc_port, metrics_port):
        mdir = os.path.join(root, "m")
        os.makedirs(mdir, exist_ok=True)
        with open(os.path.join(mdir, "model-settings.json"), "w") as f:
            json.dump({"name": "m", "implementation": "onnx_runtime.OnnxModel",
                       "parameters": {"uri": model_path}}, f, indent=1)

        def argv(port):
            with open(os.path.join(root, "settings.json"), "w") as f:
                json.dump({"host": "127.0.0.1", "http_port": port, "grpc_port": grpc_port,
                           "metrics_port": metrics_port, "debug": False,
                           "metrics_dir": os.path.join(root, ".metrics"),
                           "environments_dir": os.path.join(root, ".envs")}, f, indent=1)
            return ["env", f"PYTHONPATH={os.path.join(ROOT, 'bench', 'mlserver_runtime')}",
                    os.path.join(venv, "bin", "mlserver"), "start", root]
        return argv

    def measure(model, server, proc, grpc_port, protocols, payloads, want):
        for proto in protocols:
            key = (model, server, proto)
            grpc = proto in (P_TFS_GRPC, P_V2_GRPC)
            method = M_PREDICT if proto == P_TFS_GRPC else M_INFER
            target = f"127.0.0.1:{grpc_port}"
            url = proc.url("/v1/models/m:predict" if proto == P_TFS_REST else "/v2/models/m/infer")
            with open(payloads[proto], "rb") as f:
                req = f.read()

            def load(streams, seconds, dump=None):
                """One run from an idle server back to an idle server, with the CPU time per answer of the
                server (its process tree) and of the load generator, over every request the server answered
                in that span (the counted ones plus those answered after the window: grpc_load's drained calls,
                or the ~`streams` requests wrk abandoned plus the drain's probes)."""
                srv0, cli0, all0, me0, w0 = (tree_cpu_s(proc.p.pid), children_cpu_s(), machine_busy_s(), self_cpu_s(),
                                             time.monotonic())
                if grpc:  # grpc_load waits for its own calls: the server is idle when it returns
                    r = run_grpc_load(gl, target, method, payloads[proto], streams, seconds, dump=dump)
                    extra = r.get("late", 0) + r.get("errors", 0)
                else:
                    r = serve_bench.run_wrk(wrk, url, payloads[proto], streams, seconds, lua)
                    probes = drain(url, req, idle_s)  # wrk leaves its last requests in the server
                    if probes is None:
                        notes.append(f"{server} {model} {proto} x{streams}: still busy {DRAIN_S} s after the run")
                    extra = streams + (probes or 0)
                srv1, cli1, all1, me1, w1 = (tree_cpu_s(proc.p.pid), children_cpu_s(), machine_busy_s(), self_cpu_s(),
                                             time.monotonic())
                # CPU used by processes outside this benchmark while it ran, as a share of the machine
                other = (all1 - all0) - (srv1 - srv0) - (cli1 - cli0) - (me1 - me0)
                r["other_cpu_pct"] = max(0.0, 100 * other / ((w1 - w0) * machine.usable_cpus()))
                if "error" not in r and r["requests"]:
                    n = r["requests"] + extra
                    r["server_cpu_us"] = (srv1 - srv0) * 1e6 / n
                    r["client_cpu_us"] = (cli1 - cli0) * 1e6 / n
                return r

            # one answer checked against onnxruntime, with the idle latency of one request
            if grpc:
                dump = os.path.join(args.out, model, f"answer-{server}-{proto.split()[2]}.bin")
                if os.path.exists(dump):
                    os.remove(dump)
                w = load(1, 0.5, dump=dump)
                if "error" in w or not os.path.exists(dump):
                    notes.append(f"{server} {model} {proto}: no answer: {w.get('error') or w.get('first_error')}")
                    continue
                with open(dump, "rb") as f:
                    body = f.read()
                if w.get("errors"):
                    notes.append(f"{server} {model} {proto}: {w['errors']} failed calls in the check "
                                 f"({w['first_error']})")
                idle_s = w["p50_us"] / 1e6
            else:
                times = []
                for i in range(3):  # the first answer is checked; the fastest of the others is the idle latency
                    t0 = time.monotonic()
                    st, b = serve_bench.http("POST", url, req, timeout=120)
                    times.append(time.monotonic() - t0)
                    if st != 200:
                        break
                    if i == 0:
                        body = b
                if st != 200:
                    notes.append(f"{server} {model} {proto}: answered HTTP {st}: {b[:200]!r}")
                    continue
                idle_s = min(times[1:])
            try:
                err = rel_err(decode_answer(proto, body), want)
            except (ValueError, KeyError, IndexError, TypeError) as e:
                notes.append(f"{server} {model} {proto}: answer not understood: {type(e).__name__}: {e}")
                continue
            if err > TOL:
                notes.append(f"{server} {model} {proto}: wrong answer: max rel err {err:.2e} > {TOL:g}")
                continue
            load(smax, args.warmup)  # warm-up (connections, allocator, thread pools), then back to idle
            for s in args.streams:
                # every row starts from an idle server; a row long enough for 3 x streams answers at the idle
                # latency, so that most answers have waited behind a full queue (see the docstring)
                secs = float(math.ceil(min(max(args.duration, 3 * s * idle_s), 4 * args.duration)))  # wrk: whole s
                waited = wait_quiet(quiet)
                if waited > 0.5:
                    quiet_waits.append(waited)
                print(f"bench:   {server} {model} {proto} x{s}, {secs:.1f} s ...", file=sys.stderr)
                r = load(s, secs)
                r["max_rel_err"] = err
                r["seconds"] = secs
                results[key + (s,)] = r
                if "error" in r:
                    notes.append(f"{server} {model} {proto} x{s}: {r['error']}")
                elif r["errors"]:
                    why = r.get("first_error") or (f"non-2xx {r['status_errors']}, connect {r['connect_errors']}, "
                                                   f"read {r['read_errors']}, write {r['write_errors']}, "
                                                   f"timeout {r['timeouts']}")
                    notes.append(f"{server} {model} {proto} x{s}: {r['errors']} failed requests ({why})")
                elif not r["requests"]:
                    notes.append(f"{server} {model} {proto} x{s}: no request completed in {secs:.1f} s")

    def serve(name, argv_fn, grpc_port, model, protocols, payloads, want, timeout=120):
        try:
            proc = serve_bench.Proc(name, argv_fn, ("GET", "/v2/health/ready"), logdir, timeout=timeout)
        except RuntimeError as e:
            if name.startswith("tensord") and "--grpc_api_host" in str(e) and not no_grpc_host:
                no_grpc_host.append(1)
                notes.append("tensord: this binary has no --grpc_api_host flag; started without it")
                return serve(name, argv_fn, grpc_port, model, protocols, payloads, want, timeout)
            notes.append(f"{name}: did not start: {e}")
            return
        try:
            measure(model, name.split("-")[0], proc, grpc_port, protocols, payloads, want)
        finally:
            rc = proc.stop()
            if rc not in (0, None):
                notes.append(f"{name}: exit status {rc} after SIGTERM "
                             f"(log: {os.path.relpath(logdir, ROOT)}/{name}.log)")

    for model in args.models:
        print(f"bench: {model}: bundle, payloads ...", file=sys.stderr)
        try:
            path, x, want = prepare_model(model, args)
        except RuntimeError as e:
            notes.append(str(e))
            continue
        payloads = write_payloads(os.path.join(args.out, model), x)
        print(f"bench: {model}: tensord ...", file=sys.stderr)
        gport = serve_bench.free_port()
        serve(f"tensord-{model}", tensord_argv(os.path.join(args.out, model), gport), gport, model, PROTOCOLS,
              payloads, want)
        if venv:
            print(f"bench: {model}: MLServer ...", file=sys.stderr)
            gport, mport = serve_bench.free_port(), serve_bench.free_port()
            root = os.path.join(args.out, f"mlserver-{model}")
            serve(f"mlserver-{model}", mlserver_argv(root, os.path.abspath(path), gport, mport), gport, model,
                  MLSERVER_PROTOCOLS, payloads, want)

    # ---- report
    def g(model, server, proto, s, k):
        r = results.get((model, server, proto, s))
        return None if not r or "error" in r else r.get(k)

    def ratio(a, b):
        return None if a is None or b is None or b == 0 else a / b

    def rfmt(x, target=None):
        if x is None:
            return "n/a"
        return f"{x:.2f}x" + ("" if target is None else (" (meets)" if x >= target else " (**below**)"))

    lines = ["| model | server | protocol | streams | s | req/s | p50 µs | p99 µs | mean µs | failed | "
             "server CPU µs/req | client CPU µs/req | other CPU % |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for model in args.models:
        for server, protos in (("tensord", PROTOCOLS), ("mlserver", MLSERVER_PROTOCOLS)):
            if server == "mlserver" and not venv:
                continue
            for proto in protos:
                for s in args.streams:
                    who = "MLServer" if server == "mlserver" else server
                    lines.append(f"| {MODEL_LABEL[model]} | {who} | {proto} | "
                                 f"{s} | {fmt(g(model, server, proto, s, 'seconds'))} | "
                                 f"{fmt(g(model, server, proto, s, 'rps'))} | "
                                 f"{fmt(g(model, server, proto, s, 'p50_us'))} | "
                                 f"{fmt(g(model, server, proto, s, 'p99_us'))} | "
                                 f"{fmt(g(model, server, proto, s, 'mean_us'))} | "
                                 f"{fmt(g(model, server, proto, s, 'errors'))} | "
                                 f"{fmt(g(model, server, proto, s, 'server_cpu_us'))} | "
                                 f"{fmt(g(model, server, proto, s, 'client_cpu_us'))} | "
                                 f"{fmt(g(model, server, proto, s, 'other_cpu_pct'))} |")
    lines += ["", f"tensord gRPC / tensord REST JSON at {smax} streams: throughput (target >= 1.3x on the seed CNN), "
                  "and tensord's CPU time per request, REST / gRPC (> 1: gRPC costs the server less; the load "
                  "generators share the same cores, so a heavier client takes throughput from the server):", "",
              "| model | TF Serving: gRPC Predict / REST :predict | server CPU per request REST / gRPC | "
              "KServe: gRPC ModelInfer / REST v2 infer | server CPU per request REST / gRPC |",
              "|---|---|---|---|---|"]
    for model in args.models:
        t = 1.3 if model == "cnn" else None
        cells = []
        for rest, grpc in ((P_TFS_REST, P_TFS_GRPC), (P_V2_REST, P_V2_GRPC)):
            cells.append(rfmt(ratio(g(model, "tensord", grpc, smax, "rps"), g(model, "tensord", rest, smax, "rps")), t))
            cells.append(rfmt(ratio(g(model, "tensord", rest, smax, "server_cpu_us"),
                                    g(model, "tensord", grpc, smax, "server_cpu_us"))))
        lines.append(f"| {MODEL_LABEL[model]} | " + " | ".join(cells) + " |")
    if venv:
        lines += ["", "tensord / MLServer, same protocol, same model file (target >= 5x throughput):", "",
                  "| model | protocol | streams | throughput tensord/MLServer | p50 MLServer/tensord | "
                  "server CPU per request MLServer/tensord |", "|---|---|---|---|---|---|"]
        for model in args.models:
            for proto in MLSERVER_PROTOCOLS:
                for s in args.streams:
                    def mt(k):
                        return g(model, "mlserver", proto, s, k), g(model, "tensord", proto, s, k)
                    lines.append(f"| {MODEL_LABEL[model]} | {proto} | {s} | {rfmt(ratio(*mt('rps')[::-1]), 5)} | "
                                 f"{rfmt(ratio(*mt('p50_us')))} | {rfmt(ratio(*mt('server_cpu_us')))} |")
    lines.append("")
    for n in notes:
        lines.append("- note: " + " / ".join(x.strip() for x in n.strip().splitlines() if x.strip()))
    if quiet_waits:
        lines.append(f"- {len(quiet_waits)} rows waited {sum(quiet_waits):.0f} s in all for other processes to leave "
                     f"the machine (--quiet-wait {args.quiet_wait:g} s{'; used up' if quiet[0] <= 0 else ''})")
    busy = [(k, r["other_cpu_pct"]) for k, r in results.items() if r.get("other_cpu_pct", 0) > 10]
    if busy:
        lines.append(f"- warning: other processes used more than 10 % of the machine during {len(busy)} of "
                     f"{len(results)} rows (up to {max(v for _, v in busy):.0f} %): those numbers are suspect")
    expected = sum(len(args.streams) * (len(PROTOCOLS) + (len(MLSERVER_PROTOCOLS) if venv else 0)) for _ in args.models)
    elapsed = time.monotonic() - t_start
    lines.append(f"- {len(results)} of {expected} rows measured; bench wall time {elapsed:.0f} s; server logs in "
                 f"{os.path.relpath(logdir, ROOT)}")
    table = "\n".join(lines)
    print(table)
    # the exit status is tensord's: MLServer's own failures (e.g. wrk's 10 s timeouts) are notes only
    ok = not [n for n in notes if not n.startswith("mlserver")] and all(
        (m, "tensord", p, s) in results for m in args.models for p in PROTOCOLS for s in args.streams)
    if args.save:
        usable = machine.usable_cpus()
        load_end = os.getloadavg()[0]
        info = [("date", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")),
                ("cpu", machine.cpu_model()),
                ("logical cpus (online / usable by this process)", f"{os.cpu_count()} / {usable}"),
                ("git commit", machine.git_commit()),
                ("kernel", platform.release())]
        info += tool_versions(args, wrk, venv)
        info += [("tensord settings", "`tensord serve --port=P --grpc_api_host=127.0.0.1 --rest_api_host=127.0.0.1 "
                                      "--rest_api_port=P --model_name=m --model_base_path=DIR`, nothing else: defaults "
                                      "(--tensorflow_intra_op_parallelism 0 = all cores per inference, one execution "
                                      "instance, --rest_api_num_threads 0 = 4 per core)")]
        if venv:
            info.append(("MLServer settings",
                         mlserver_defaults(venv) + "; runtime bench/mlserver_runtime/onnx_runtime.py"))
        info += [("load generators", f"wrk (REST, keep-alive) and grpc_load (gRPC C core, unary calls kept in flight "
                                     f"on 1 channel per thread), 1 thread at 1 stream, 2 otherwise, on the same cores "
                                     f"as the server; {args.warmup:g} s warm-up per server and protocol; every row "
                                     f"starts from an idle server and runs max({args.duration:g} s, 3 x streams x "
                                     f"idle latency), at most {4 * args.duration:g} s (column s)"),
                 ("payloads", "one row per request, float32, the same values in every protocol (rounded to 4 "
                              "decimals); REST JSON bodies as TF Serving's {\"instances\"} and KServe v2's flat "
                              "\"data\"; gRPC TF Serving tensor_content, KServe raw_input_contents; every "
                              f"protocol's answer checked against onnxruntime (max rel err <= {TOL:g})"),
                 ("load average (1 min) at start / end", f"{args.load_start:.2f} / {load_end:.2f}"
                  + ("  (machine was busy: numbers are noisy)" if max(args.load_start, load_end) > usable else ""))]
        doc = ["# gRPC and REST serving on CPU: tensord against MLServer", "",
               "Generated by `.venv/bin/python bench/grpc_bench.py --save` (see the script's docstring). Closed-loop "
               "load on 127.0.0.1: N requests in flight, each re-sent when its answer arrives.", ""]
        doc += [f"- {k}: {v}" for k, v in info] + ["", table, ""]
        path = os.path.join(ROOT, "bench", "results", "grpc-cpu.md")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("\n".join(doc))
        print(f"wrote {os.path.relpath(path, ROOT)}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
