"""The GPU script's attention stage (tests/gpu/run.sh): attention layers (tests/integration/attention_models.py) on a
device through `tensord predict`, each fused into one FusedAttention step (TENSORD_PROFILE=1 shows it) and equal to
onnxruntime: fp32 within 1e-4, bf16 within 3e-2 (max |err| / max |want|); then `tensord bench` of a BERT-base-shaped
layer (batch 8, 128 tokens, 12 heads of 64) fused and unfused (TENSORD_NO_ATTENTION_FUSE=1), median ms of each.
Usage: attention_check.py BIN DEVICE WORKDIR [--quick]. Prints one JSON line of figures; exit 1 on a failed check."""
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from attention_models import attention_model, feeds  # noqa: E402
from gpu_util import bench_variants  # noqa: E402


def main():
    binary, dev, work = sys.argv[1:4]
    quick = "--quick" in sys.argv
    big = dict(n=2, s=33, heads=2, dh=64) if quick else dict(n=8, s=128, heads=12, dh=64)
    cases = {
        "div_input_mask": dict(n=2, s=5, heads=2, dh=4),
        "mul_causal_mask": dict(n=2, s=37, heads=3, dh=16, scale_op="Mul", mask="causal"),
        "no_scale_no_mask": dict(n=3, s=70, heads=2, dh=32, scale_op=None, mask=None),
        "d128_partial_tiles": dict(n=2, s=45 if quick else 200, heads=4, dh=128),
        "bert_shape": big,
    }
    figs, ok = {}, True
    for name, kw in cases.items():
        m = attention_model(**kw)
        x = feeds(m, n=kw["n"], s=kw["s"], e=kw["heads"] * kw["dh"])
        want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(["y"], x)[0]
        d = os.path.join(work, name)
        os.makedirs(d, exist_ok=True)
        onnx.save(m, os.path.join(d, "model.onnx"))
        ins = []
        for k, v in x.items():
            np.save(os.path.join(d, k + ".npy"), v)
            ins += ["--input", f"{k}={os.path.join(d, k + '.npy')}"]
        for prec, tol in (("fp32", 1e-4), ("bf16", 3e-2)):
            out = os.path.join(d, "out-" + prec)
            cp = subprocess.run([binary, "predict", "--model", os.path.join(d, "model.onnx"), "--output-dir", out,
                                 "--device", dev, "--precision", prec] + ins, capture_output=True, text=True,
                                timeout=300, env={**os.environ, "TENSORD_PROFILE": "1"})
            if cp.returncode != 0:
                print(f"{name} {prec}: exit {cp.returncode}\n{cp.stderr[-2000:]}")
                ok = False
                continue
            fused = sum(1 for line in cp.stderr.splitlines() if " FusedAttention " in f" {line} ")
            got = np.load(os.path.join(out, "y.npy")).astype(np.float32)
            err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
            good = fused == 1 and err <= tol
            ok &= good
            figs[f"{name}_{prec}"] = f"{err:.2e}{'' if fused == 1 else f' (fused steps {fused})'}"
            print(f"{name} {prec}: FusedAttention steps {fused}, max rel err vs onnxruntime {err:.3e} "
                  f"(bar {tol:g}) {'ok' if good else 'FAIL'}")
    d = os.path.join(work, "bert_shape")
    runs = bench_variants(binary, os.path.join(d, "model.onnx"), {k: os.path.join(d, k + ".npy") for k in ("x", "mask")},
                          dev, 10 if quick else 100, (("fused", {}), ("unfused", {"TENSORD_NO_ATTENTION_FUSE": "1"})), 300)
    for label, (med, _out, err) in runs.items():
        if med is None:
            print(f"bench {label} failed:\n{err[-2000:]}")
            ok = False
            continue
        figs[f"bert_layer_{label}_ms"] = med
    if "bert_layer_fused_ms" in figs and "bert_layer_unfused_ms" in figs:
        figs["bert_layer_speedup"] = round(figs["bert_layer_unfused_ms"] / figs["bert_layer_fused_ms"], 2)
    print(json.dumps(figs))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
