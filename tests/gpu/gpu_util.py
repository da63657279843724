"""What the GPU script's Python stages share (tests/gpu/attention_check.py, graphs_check.py): `tensord bench` of one
model run once per environment variant, its median ms and output parsed."""
import os
import re
import subprocess


def bench_variants(binary, model, inputs, dev, iterations, variants, timeout):
    """`tensord bench --model model --device dev` with inputs ({name: .npy path}) once per (label, env) of variants ->
    {label: (median ms or None when it failed, stdout, stderr)}."""
    out = {}
    args = [a for k, path in inputs.items() for a in ("--input", f"{k}={path}")]
    for label, env in variants:
        cp = subprocess.run([binary, "bench", "--model", model, "--device", dev, "--iterations", str(iterations),
                             "--warmup", "5"] + args, capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, **env})
        med = re.search(r"median_ms=([0-9.]+)", cp.stdout)
        out[label] = (float(med.group(1)) if cp.returncode == 0 and med else None, cp.stdout, cp.stderr)
    return out
