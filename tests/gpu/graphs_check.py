"""The GPU script's graphs stage (tests/gpu/run.sh): CUDA Graphs for fixed-shape plans on a real device.
1. `tensord serve --device DEV` on MODEL: REQUESTS requests of batch 1, each with new values, against onnxruntime
   (max |err| / max |want| <= 1e-3; from the third request on, the plan replays its graph);
2. `tensord bench` at batch 1, graphs on (the default) and off (TENSORD_CUDA_GRAPHS=0): median ms of each, and the
   graph counters bench prints (graph_launches > 0 with graphs on, 0 off).
Usage: graphs_check.py BIN DEVICE WORKDIR MODEL.onnx [--quick]. One JSON line of figures; exit 1 on a failed check."""
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_util import bench_variants  # noqa: E402

REQUESTS = 6


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    binary, dev, work, model = sys.argv[1:5]
    quick = "--quick" in sys.argv
    m = onnx.load(model)
    inp = m.graph.input[0]
    shape = [d.dim_value if d.dim_value > 0 else 1 for d in inp.type.tensor_type.shape.dim]
    shape[0] = 1
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    figs, ok = {}, True
    base = os.path.join(work, "srv", "m")
    os.makedirs(os.path.join(base, "1"), exist_ok=True)
    dst = os.path.join(base, "1", "model.onnx")
    if not os.path.exists(dst):
        onnx.save(m, dst)  # a copy: tensord refuses a model file that resolves outside its version directory
    rp, gp = free_port(), free_port()
    log = open(os.path.join(work, "graphs-serve.log"), "w")
    srv = subprocess.Popen([binary, "serve", "--model_name=m", f"--model_base_path={base}", f"--rest_api_port={rp}",
                            f"--port={gp}", f"--device={dev}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{rp}/v2/models/m/ready", timeout=2)
                break
            except OSError:
                time.sleep(0.2)
        errs = []
        for i in range(REQUESTS):
            x = np.random.default_rng(i).standard_normal(shape).astype(np.float32)
            body = json.dumps({"inputs": [{"name": inp.name, "shape": shape, "datatype": "FP32",
                                           "data": x.ravel().tolist()}]}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{rp}/v2/models/m/infer", data=body)
            got = np.array(json.load(urllib.request.urlopen(req, timeout=120))["outputs"][0]["data"], np.float32)
            want = sess.run(None, {inp.name: x})[0].ravel()
            errs.append(float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)))
        figs["serve_max_rel_err"] = f"{max(errs):.2e}"
        ok &= max(errs) <= 1e-3
        print("served requests, max rel err vs onnxruntime per request:", " ".join(f"{e:.2e}" for e in errs))
    finally:
        srv.terminate()
        srv.wait(timeout=60)
    x = os.path.join(work, "x1.npy")
    np.save(x, np.random.default_rng(99).standard_normal(shape).astype(np.float32))
    runs = bench_variants(binary, model, {inp.name: x}, dev, 20 if quick else 300,
                          (("graphs", {}), ("eager", {"TENSORD_CUDA_GRAPHS": "0"})), 600)
    for label, (med, stdout, err) in runs.items():
        print(f"bench {label}: {stdout.strip()}")
        if med is None:
            print(err[-2000:])
            ok = False
            continue
        figs[f"batch1_{label}_ms"] = med
        launches = re.search(r"graph_launches=(\d+)", stdout)
        n = int(launches.group(1)) if launches else 0
        ok &= (n > 0) if label == "graphs" else (n == 0)
        figs[f"{label}_graph_launches"] = n
    if "batch1_graphs_ms" in figs and "batch1_eager_ms" in figs:
        figs["graphs_speedup"] = round(figs["batch1_eager_ms"] / figs["batch1_graphs_ms"], 2)
    print(json.dumps(figs))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
