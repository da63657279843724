#!/usr/bin/env python3
"""bench/precision_bench.py - tensord's fp32, bf16 and int8 plans on ResNet-50 and the BERT-base-shaped encoder at
batch 16, from one run on this machine's CPU, with onnxruntime int8 on the same QDQ models (issue 13).

For every model (--models, default resnet50,bert_base):
  1. the float model and a seeded batch-16 input come from bench/realarch_export.py (run by the Python that has
     torch, cached under bench/out/realarch/ exactly as bench/realarch.py caches them);
  2. two int8 QDQ models are made from it, calibrated on --calib seeded inputs of the same distribution as the
     timed input (a different seed), under bench/out/precision/<model>/:
       tensord-QDQ  `tensord quantize` (minmax, per-channel int8 weights, uint8 activations) of a bundle whose
                    version 1 is the float model, written as version 2 (redone every run: it is tensord's code);
       ORT-QDQ      onnxruntime.quantization.quantize_static, QuantFormat.QDQ, per_channel=True, activations
                    QUInt8, weights QInt8, MinMax, ORT's default operator set (cached by its settings);
  3. checks, one `tensord predict` per variant under ONEDNN_VERBOSE=1: fp32 against PyTorch's output (<= 1e-4),
     bf16 and both int8 variants against tensord's fp32 output (max rel err; ResNet-50: top-1 agreement over the
     batch; BERT: mean cosine similarity per token; onnxruntime's int8 output against the same fp32 output, for
     scale) and each int8 variant against onnxruntime on the same QDQ model; the oneDNN implementation names of the
     convolution/matmul steps, per variant, say which ISA ran;
  4. with --profile lowp (default: bf16 and int8) or all, one `TENSORD_PROFILE=1 tensord bench` per variant: where
     the time goes by operator type, with the layout reorders inside steps, the Q/DQ nodes left standalone (not
     fused) and the Conv/MatMul steps left in float;
  5. timing: --rounds alternating rounds; in every round each runner runs one block (a fresh `tensord bench`
     process per tensord variant, a block of session.run() calls per onnxruntime session), so load from other
     tenants hits every runner alike; each runner's time is the median of its round medians. Runners: tensord
     fp32, bf16, int8 on both QDQ models; onnxruntime on both QDQ models.

The variants run as `--precision fp32`, `--precision bf16` and `--precision int8` (the QDQ models). A binary without
the flag, or one that refuses bf16 on this CPU, gets its bf16 row reported as `refused: <message>`; fp32 and int8
then run without the flag (the QDQ patterns are fused into int8 kernels at load time either way).

Targets (issue 13): throughput at batch 16, int8 >= 2.5x and bf16 >= 1.8x tensord fp32; tensord int8 latency
<= 1.0x onnxruntime int8 on the same QDQ model. Unmet targets are reported, not failed on. Exit status 0 only if
every fp32 and int8 tensord variant ran and fp32 matched PyTorch.

  .venv/bin/python bench/precision_bench.py [--models resnet50,bert_base] [--threads T] [--quick] [--save]
"""
import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import machine  # noqa: E402
import realarch  # noqa: E402  (export and the oneDNN `ref*` step parser)
from common import (TOL, command_line, fmt, input_args, machine_info, max_rel_err, ort_session, print_notes,  # noqa: E402
                    run_tensord, tensord_bench, time_ort)

MODELS = ["resnet50", "bert_base"]
BATCH = 16
CALIB_SEED = 7013
TARGET = {"bf16": 1.8, "int8": 2.5}  # throughput x tensord fp32
ORT_TARGET = 1.0                      # tensord int8 ms / onnxruntime int8 ms on the same QDQ model
CPU_FLAGS = ["avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8",
             "avx512_fp16"]
GEMM_PRIMS = ("convolution", "matmul", "inner_product", "deconvolution")


# ---- machine / oneDNN ----
def cpu_flags():
    """{flag: present} for CPU_FLAGS, from `lscpu` (else /proc/cpuinfo)."""
    text = machine.run_out("lscpu")
    line = next((ln for ln in text.splitlines() if ln.startswith("Flags:")), "")
    if not line:
        try:
            with open("/proc/cpuinfo") as f:
                line = next((ln for ln in f if ln.startswith("flags")), "")
        except OSError:
            line = ""
    have = set(line.split(":", 1)[-1].split())
    return {f: f in have for f in CPU_FLAGS}


def dnnl_info(verbose_text):
    """(version, isa) from oneDNN's verbose `info` lines, '' where absent."""
    ver = isa = ""
    for ln in verbose_text.splitlines():
        if not (ln.startswith("onednn_verbose,info") or ln.startswith("dnnl_verbose,info")):
            continue
        if not ver and "oneDNN v" in ln:
            ver = ln.split("oneDNN", 1)[1].split("(")[0].strip()
        m = re.search(r"isa:(.*)$", ln)
        if m and not isa:
            isa = m.group(1).strip()
    return ver, isa


def dnnl_impls(verbose_text):
    """Counter of (primitive, implementation, src dtype, weights dtype) over the oneDNN `exec` lines of the
    convolution/matmul/inner-product primitives, and the number of `reorder` exec lines (one-time weight reorders
    included: the text is one `tensord predict`)."""
    c, reorders = collections.Counter(), 0
    for ln in verbose_text.splitlines():
        if not (ln.startswith("onednn_verbose,exec,") or ln.startswith("dnnl_verbose,exec,")):
            continue
        f = ln.split(",")
        if len(f) < 7:
            continue
        if f[3] == "reorder":
            reorders += 1
        elif f[3] in GEMM_PRIMS:
            dt = dict(re.findall(r"\b(src|wei)[_:]([a-z0-9]+)", f[6]))
            c[(f[3], f[4], dt.get("src", "?"), dt.get("wei", "?"))] += 1
    return c, reorders


def impl_summary(c):
    """'convolution brgconv:avx512_core_vnni u8/s8 x53, matmul brg:avx512_core f32/f32 x1', most used first."""
    if not c:
        return "no oneDNN convolution/matmul steps"
    return ", ".join(f"{p} {impl} {s}/{w} x{n}" for (p, impl, s, w), n in
                     sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


# ---- TENSORD_PROFILE ----
def profile_summary(stderr, stdout=""):
    """From `TENSORD_PROFILE=1 tensord bench` stderr: a dict with total ms, per-op-type (ms, steps), the counts of
    in-step layout reorders and dtype conversions, standalone Q/DQ nodes, Conv/MatMul/Gemm steps computing in fp32
    (no int8 kernel, no `compute=` dtype) and [SLOW] steps, and what the bench line says about the precision
    (`precision=bf16 (54 steps, 51 activations in bf16)`); None when there is no profile (a batch-split plan
    prints none)."""
    m = re.search(r"precision=(\S+(?: \([^)]*\))?)", stdout)
    lines = stderr.splitlines()
    try:
        start = next(i for i, ln in enumerate(lines) if ln.startswith("profile:") and "mean ms per step" in ln)
    except StopIteration:
        return None
    by_op, tot, reorder, conv, qdq, flt, slow = collections.defaultdict(lambda: [0.0, 0]), 0.0, 0, 0, 0, 0, 0
    for ln in lines[start + 1:]:
        parts = ln.split()
        if not ln.startswith("  ") or len(parts) < 2:
            break
        try:
            ms = float(parts[0])
        except ValueError:
            break
        op = parts[1]
        by_op[op][0] += ms
        by_op[op][1] += 1
        tot += ms
        reorder += ln.count("+reorder")
        conv += ln.count("+convert")
        slow += "[SLOW]" in ln
        qdq += op in ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear")
        flt += (op in ("Conv", "MatMul", "Gemm", "FusedConv", "FusedMatMul", "FusedGemm") and "int8" not in ln
                and "compute=" not in ln)
    return dict(total=tot, by_op=dict(by_op), reorders=reorder, converts=conv, qdq=qdq, fp32_gemm=flt, slow=slow,
                precision=m.group(1) if m else "")


def profile_line(p, top=6):
    if p is None:
        return "no profile printed (batch-split plan?)"
    ops = sorted(p["by_op"].items(), key=lambda kv: -kv[1][0])[:top]
    share = ", ".join(f"{op} {ms:.0f} ms/{n}" for op, (ms, n) in ops)
    return ((f"precision={p['precision']}; " if p["precision"] else "")
            + f"sum of step means {p['total']:.0f} ms: {share}; {p['reorders']} in-step layout reorders, "
            f"{p['converts']} in-step conversions, {p['qdq']} standalone Q/DQ steps, {p['fp32_gemm']} Conv/MatMul/"
            f"Gemm steps in fp32, {p['slow']} [SLOW]")


# ---- models ----
def calib_inputs(meta, mdir, n):
    """{input: [n, ...]} seeded calibration inputs shaped and typed like the timed batch-16 inputs: standard normal
    floats; an int64 attention mask with each row's padding at the end (as realarch_export.py makes it)."""
    rng = np.random.default_rng(CALIB_SEED)
    out = {}
    for name in meta["inputs"]:
        ref = np.load(os.path.join(mdir, meta["input_file"].format(input=name, batch=BATCH)), mmap_mode="r")
        shape = (n,) + tuple(ref.shape[1:])
        if np.issubdtype(ref.dtype, np.integer):
            seq = shape[-1]
            lens = rng.integers(max(1, seq // 4), seq + 1, size=n)
            out[name] = (np.arange(seq)[None, :] < lens[:, None]).astype(ref.dtype)
        else:
            out[name] = rng.standard_normal(shape).astype(ref.dtype)
    return out


def link_or_copy(src, dst):
    if os.path.exists(dst) and os.path.samefile(src, dst):
        return
    if os.path.lexists(dst):
        os.remove(dst)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def tensord_quantize(args, src, wdir, calib_file):
    """bundle/1/model.onnx = the float model; `tensord quantize` writes bundle/2. Returns (path, error)."""
    bundle = os.path.join(wdir, "bundle")
    os.makedirs(os.path.join(bundle, "1"), exist_ok=True)
    link_or_copy(src, os.path.join(bundle, "1", "model.onnx"))
    shutil.rmtree(os.path.join(bundle, "2"), ignore_errors=True)
    cp, err, _ = run_tensord([args.bin, "quantize", "--model-base-path", bundle, "--version", "1",
                              "--calibration", calib_file, "--threads", str(args.threads)], args.timeout)
    if cp is None:
        return None, "tensord quantize " + err
    path = os.path.join(bundle, "2", "model.onnx")
    return (path, "") if os.path.isfile(path) else (None, "tensord quantize wrote no version 2")


def ort_quantize(args, src, wdir, calib, settings):
    """quantize_static in QDQ form, cached in ort_qdq.onnx with its settings in ort_qdq.json. (path, error)."""
    import onnxruntime
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    path, key_path = os.path.join(wdir, "ort_qdq.onnx"), os.path.join(wdir, "ort_qdq.json")
    key = {"source": settings, "calib": args.calib, "calib_seed": CALIB_SEED, "onnxruntime": onnxruntime.__version__,
           "format": "QDQ", "per_channel": True, "activation": "QUInt8", "weight": "QInt8", "method": "MinMax",
           "op_types": args.ort_op_types or None}
    try:
        with open(key_path) as f:
            if json.load(f) == key and os.path.isfile(path):
                return path, ""
    except (OSError, ValueError):
        pass

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{k: v[i:i + 8] for k, v in calib.items()} for i in range(0, args.calib, 8)])

        def get_next(self):
            return next(self.it, None)

    tmp = path + ".tmp.onnx"
    try:
        quantize_static(src, tmp, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        op_types_to_quantize=args.ort_op_types or None)
    except Exception as e:  # onnxruntime's own limitation on this graph: report it as the row's status
        return None, f"quantize_static: {type(e).__name__}: {str(e).strip()[:160]}"
    os.replace(tmp, path)
    with open(key_path, "w") as f:
        json.dump(key, f, indent=1)
    return path, ""


# ---- output checks ----
def compare(name, got, want):
    """'rel 2.1e-02, top-1 16/16' (ResNet-50 logits) or 'rel 3.1e-02, cos 0.9995' (hidden states)."""
    s = f"rel {max_rel_err(got, want):.1e}"
    if name != "bert_base" and got.ndim == 2:
        s += f", top-1 {int(np.sum(np.argmax(got, 1) == np.argmax(want, 1)))}/{got.shape[0]}"
    else:
        a = got.reshape(-1, got.shape[-1]).astype(np.float64)
        b = want.reshape(-1, want.shape[-1]).astype(np.float64)
        cos = np.sum(a * b, 1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-30)
        s += f", cos {float(np.mean(cos)):.4f}"
    return s


# ---- one model ----
class Variant:
    """A tensord runner (fp32, bf16, int8 on a QDQ model) or an onnxruntime session on a QDQ model."""

    def __init__(self, key, label, model, extra=(), sess=None):
        self.key, self.label, self.model, self.extra, self.sess = key, label, model, list(extra), sess
        self.err = ""          # why it has no time (refused, failed, not made)
        self.refused = False   # bf16 not offered by this tensord/CPU: reported, not failed on
        self.out = None        # its output on the timed input
        self.est = None        # seconds per run, for sizing the rounds
        self.meds, self.p90s, self.n = [], [], 0
        self.isa, self.reorders, self.refs, self.profile = None, 0, [], None
        self.check = ""        # output check text
        self.mismatch = False  # fp32 disagrees with PyTorch: timed, and the run fails
        self.ort = None        # tensord int8 variant: the onnxruntime session on the same QDQ model

    @property
    def ms(self):
        return float(np.median(self.meds)) if self.meds and not self.err else None


def predict(args, v, feed_files, odir, out_name):
    """`tensord predict` of variant v under ONEDNN_VERBOSE=1: fills v.out, v.isa, v.reorders, v.refs, v.est.
    Returns the verbose text ('' on failure, with v.err set)."""
    shutil.rmtree(odir, ignore_errors=True)
    os.makedirs(odir)
    t0 = time.perf_counter()
    cp, err, _ = run_tensord([args.bin, "predict", "--model", v.model, *input_args(feed_files), "--output-dir", odir,
                              "--threads", str(args.threads), *v.extra], args.timeout,
                             env={"ONEDNN_VERBOSE": "1", "OMP_NUM_THREADS": str(args.threads)})
    v.est = time.perf_counter() - t0
    if cp is None:
        v.err = err
        return ""
    text = cp.stdout + "\n" + cp.stderr
    v.isa, v.reorders = dnnl_impls(text)
    v.refs = realarch.ref_steps(text)
    try:
        v.out = np.load(os.path.join(odir, out_name + ".npy"))
    except (OSError, ValueError) as e:
        v.err = f"predict output unreadable: {e}"
    return text


def refusal(err):
    """'exit 2: error: unknown option ...' -> 'refused: unknown option ...'; a crash stays a failure."""
    m = re.match(r"exit (\d+): (?:error: )?(.*)$", err)
    return (True, f"refused: {m.group(2)}") if m else (False, f"failed: {err}")


def run_model(args, name, info):
    """All variants of one model: prepared, checked, profiled and timed. Returns (the tensord variants fp32, bf16,
    int8 tensord-QDQ, int8 ORT-QDQ; the onnxruntime sessions' variants; notes)."""
    mdir = os.path.join(args.out, name)
    with open(os.path.join(mdir, "meta.json")) as f:
        meta = json.load(f)
    if "error" in meta:
        raise RuntimeError("not exported: " + meta["error"])
    if BATCH not in meta.get("batches", []):
        raise RuntimeError(f"batch {BATCH} not exported")
    src = os.path.join(mdir, "model.onnx")
    feed_files = {i: os.path.join(mdir, meta["input_file"].format(input=i, batch=BATCH)) for i in meta["inputs"]}
    feeds = {i: np.load(p) for i, p in feed_files.items()}
    torch_out = np.load(os.path.join(mdir, meta["reference_file"].format(batch=BATCH)))
    out_name = meta["outputs"][0]
    wdir = os.path.join(args.work, name)
    os.makedirs(wdir, exist_ok=True)
    notes = []

    def log(msg):
        print(f"{name}: {msg} [{time.perf_counter() - args.t_start:.0f} s]", file=sys.stderr, flush=True)

    # --- int8 models ---
    calib = calib_inputs(meta, mdir, args.calib)
    calib_file = os.path.join(wdir, "calib.npz")
    np.savez(calib_file, **calib)
    t0 = time.perf_counter()
    td_q, td_q_err = tensord_quantize(args, src, wdir, calib_file)
    log(f"tensord quantize {fmt(time.perf_counter() - t0, 1)} s {td_q_err}")
    t0 = time.perf_counter()
    ort_q, ort_q_err = ort_quantize(args, src, wdir, calib, meta["settings"])
    log(f"onnxruntime quantize_static {fmt(time.perf_counter() - t0, 1)} s {ort_q_err}")
    del calib

    fp32 = Variant("fp32", "fp32", src, [] if args.has_precision is False else ["--precision", "fp32"])
    bf16 = Variant("bf16", "bf16", src, ["--precision", "bf16"])
    i8t = Variant("int8", "int8 (tensord quantize)", td_q, ["--precision", "int8"])
    i8o = Variant("int8", "int8 (ORT quantize_static)", ort_q, ["--precision", "int8"])
    i8t.err, i8o.err = td_q_err, ort_q_err
    tds = [fp32, bf16, i8t, i8o]

    # --- checks under ONEDNN_VERBOSE=1 ---
    text = predict(args, fp32, feed_files, os.path.join(wdir, "pred_fp32"), out_name)
    if fp32.err and "unknown option '--precision'" in fp32.err:
        args.has_precision = False
        fp32.err, fp32.extra = "", []
        text = predict(args, fp32, feed_files, os.path.join(wdir, "pred_fp32"), out_name)
    elif not fp32.err:
        args.has_precision = True
    if args.has_precision is False:
        bf16.extra = i8t.extra = i8o.extra = []
    if text and not info.get("dnnl"):
        info["dnnl"] = dnnl_info(text)
    if args.has_precision is False:
        bf16.refused, bf16.err = True, "refused: this tensord has no --precision flag (unknown option '--precision')"
    else:
        predict(args, bf16, feed_files, os.path.join(wdir, "pred_bf16"), out_name)
        if bf16.err:
            bf16.refused, bf16.err = refusal(bf16.err)
    for v in (i8t, i8o):
        if not v.err:
            predict(args, v, feed_files, os.path.join(wdir, "pred_" + ("td" if v is i8t else "ort")), out_name)
    fp32_check = "n/a"
    if fp32.out is not None:
        e = max_rel_err(fp32.out, torch_out)
        fp32_check = f"vs torch rel {e:.1e}" + ("" if e <= TOL else f" MISMATCH (> {TOL:g})")
        fp32.mismatch = e > TOL
    fp32.check = fp32_check
    for v in (bf16, i8t, i8o):
        v.check = ("vs fp32 " + compare(name, v.out, fp32.out)) if v.out is not None and fp32.out is not None else ""

    # --- onnxruntime on both QDQ models ---
    orts = []
    for v, q in ((i8o, ort_q), (i8t, td_q)):
        if q is None:
            continue
        t0 = time.perf_counter()
        try:
            o = Variant("ort", f"onnxruntime on {v.label}", q, sess=ort_session(q, args.threads))
            o.out = o.sess.run(None, feeds)[0]
        except Exception as e:  # onnxruntime refusing a QDQ model is a result, not a crash of the benchmark
            notes.append(f"{name}: onnxruntime cannot run the {v.label} model: {type(e).__name__}: {str(e)[:160]}")
            continue
        o.est = time.perf_counter() - t0
        v.ort = o
        orts.append(o)
        if fp32.out is not None:
            v.check = (v.check + " " if v.check else "") + f"(ORT: {compare(name, o.out, fp32.out)})"
        if v.out is not None:
            v.check += f"; vs ORT rel {max_rel_err(v.out, o.out):.1e}"
    log("checks: " + "; ".join(f"{v.label} {v.err or v.check}" for v in tds))

    # --- profiles ---
    for v in tds:
        if v.err or args.profile == "none" or (args.profile == "lowp" and v.key == "fp32"):
            continue
        cp, err, _ = run_tensord([args.bin, "bench", "--model", v.model, *input_args(feed_files), "--iterations",
                                  "2", "--warmup", "0", "--threads", str(args.threads), *v.extra], args.timeout,
                                 env={"TENSORD_PROFILE": "1", "OMP_NUM_THREADS": str(args.threads)})
        v.profile = profile_summary(cp.stderr, cp.stdout) if cp is not None else None
        if cp is None:
            notes.append(f"{name} {v.label}: profile run failed: {err}")

    # --- timing: alternating rounds ---
    runners = [v for v in tds if not v.err] + orts
    per_round = args.budget / args.rounds
    max_n = max(1, args.iterations // args.rounds)
    min_n = max(1, args.min_iterations // args.rounds)
    for r in range(args.rounds):
        for v in runners:
            if v.err:
                continue
            if v.sess is not None:
                _, ms, n, util = time_ort(v.sess, feeds, args.warmup, max_n, per_round, min_n)
                v.meds.append(float(np.median(ms)))
                v.p90s.append(float(np.percentile(ms, 90)))
                v.est = v.meds[-1] / 1e3
                if util > args.threads + 0.5:
                    notes.append(f"{name} {v.label}: onnxruntime used {util:.1f} cores for {args.threads} threads")
            else:
                n = int(max(min_n, min(max_n, per_round / max(v.est, 1e-3))))
                warm = args.warmup if v.est < 1.0 else 0  # `tensord bench` always runs once untimed first
                med, p90, err, util = tensord_bench(args.bin, v.model, feed_files, iterations=n, warmup=warm,
                                                    threads=args.threads, timeout=args.timeout, extra_args=v.extra,
                                                    env={"OMP_NUM_THREADS": str(args.threads)})
                if med is None:
                    v.err = "bench " + err
                    continue
                v.meds.append(med)
                v.p90s.append(p90)
                v.est = med / 1e3
                if util > args.threads + 0.5:
                    notes.append(f"{name} {v.label}: tensord used {util:.1f} cores (cpu/wall, incl. load) for "
                                 f"--threads {args.threads}")
            v.n += n
        log(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{v.label} {fmt(v.meds[-1] if v.meds else None, 1)} ms"
                                                          for v in runners))
    return tds, orts, notes


# ---- table ----
def rows_for(name, tds):
    unit = "seq/s" if name == "bert_base" else "img/s"
    fp = tds[0].ms
    lines = []
    for v in tds:
        ms = v.ms
        x = fp / ms if fp and ms else None
        tput = f"{BATCH * 1e3 / ms:.1f} {unit}" if ms else "n/a"
        ort_ms = v.ort.ms if v.ort is not None else None
        ratio = ms / ort_ms if ms and ort_ms else None
        if v.key == "fp32":
            target, met = "(baseline)", ""
        else:
            target = f">= {TARGET[v.key]}x fp32" + (f", <= {ORT_TARGET}x ORT" if v.key == "int8" else "")
            met = "n/a" if x is None else ("yes" if x >= TARGET[v.key] else "no")
            if v.key == "int8":
                met = f"{met}; ORT: " + ("n/a" if ratio is None else ("yes" if ratio <= ORT_TARGET else "no"))
        check = v.err if v.err else v.check
        if v.err and v.check and not v.refused:
            check = f"{v.err}; {v.check}"
        lines.append(f"| {name} | {v.label} | {fmt(ms, 1) if ms else ('refused' if v.refused else 'n/a')} | {tput} "
                     f"| {fmt(x, 2) if x else 'n/a'} | {target} | {met} | {fmt(ort_ms, 1) if ort_ms else ''} "
                     f"| {fmt(ratio, 2) if ratio else ''} | {check} | {len(v.meds)} x {v.n // max(1, len(v.meds))} |")
    return lines


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of: " + ",".join(MODELS))
    p.add_argument("--threads", type=int, default=machine.usable_cpus(),
                   help="intra-op threads for both runtimes (default: every usable cpu)")
    p.add_argument("--rounds", type=int, default=3, help="alternating timing rounds (default 3)")
    p.add_argument("--budget", type=float, default=8.0,
                   help="seconds of timed runs per runner per model, over all rounds (default 8)")
    p.add_argument("--iterations", type=int, default=30, help="most timed runs per runner per model (default 30)")
    p.add_argument("--min-iterations", type=int, default=3,
                   help="fewest timed runs per runner per model (default 3; at least 1 per round)")
    p.add_argument("--warmup", type=int, default=1,
                   help="untimed runs per block (tensord: after its untimed first run; none when a run takes over "
                        "1 s) (default 1)")
    p.add_argument("--calib", type=int, default=32, help="calibration inputs for both quantizers (default 32)")
    p.add_argument("--ort-op-types", default="",
                   help="comma-separated op_types_to_quantize for onnxruntime (default: its own default set)")
    p.add_argument("--profile", choices=["none", "lowp", "all"], default="lowp",
                   help="TENSORD_PROFILE=1 summary of these variants: lowp = bf16 and int8 (default lowp)")
    p.add_argument("--timeout", type=float, default=600.0, help="limit of every tensord call, seconds (default 600)")
    p.add_argument("--export-timeout", type=float, default=1800.0, help="limit of the export step (default 1800)")
    p.add_argument("--size", type=int, default=224, help="image side of ResNet-50 (default 224)")
    p.add_argument("--seq", type=int, default=128, help="sequence length of the encoder (default 128)")
    p.add_argument("--layers", type=int, default=None, help="encoder layers (default 12)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 1 round, 1 s budget, <= 2 iterations, no warm-up, 8 calibration inputs")
    p.add_argument("--save", action="store_true", help="write bench/results/precision-cpu.md")
    p.add_argument("--bin", default=os.environ.get("TENSORD_BIN", os.path.join(ROOT, "build", "tensord")),
                   help="tensord binary (default $TENSORD_BIN or build/tensord)")
    p.add_argument("--torch-python", default=os.environ.get("TENSORD_TORCH_PYTHON", "/usr/bin/python3"),
                   help="Python with torch/torchvision for the export (default $TENSORD_TORCH_PYTHON or "
                        "/usr/bin/python3)")
    p.add_argument("--out", default=os.path.join(HERE, "out", "realarch"),
                   help="exported float models, shared with realarch.py (default bench/out/realarch)")
    p.add_argument("--work", default=os.path.join(HERE, "out", "precision"),
                   help="quantized models and scratch (default bench/out/precision)")
    a = p.parse_args()
    if a.quick:
        a.rounds, a.budget, a.iterations, a.min_iterations, a.warmup = 1, 1.0, min(a.iterations, 2), 1, 0
        a.calib = min(a.calib, 8)
    a.models = [m.strip() for m in a.models.split(",") if m.strip()]
    bad = [m for m in a.models if m not in MODELS]
    if bad:
        p.error(f"unknown model(s) {','.join(bad)}; choose from {','.join(MODELS)}")
    if a.calib < 1 or a.rounds < 1 or a.threads < 1:
        p.error("--calib, --rounds and --threads must be >= 1")
    a.ort_op_types = [t.strip() for t in a.ort_op_types.split(",") if t.strip()]
    a.batches = [BATCH]
    a.has_precision = None
    return a


def main():
    args = parse_args()
    args.load_start = os.getloadavg()[0]
    args.t_start = time.perf_counter()
    if not (os.path.isfile(args.bin) and os.access(args.bin, os.X_OK)):
        print(f"error: tensord binary {args.bin} not found (run `make`)", file=sys.stderr)
        return 1
    os.makedirs(args.out, exist_ok=True)
    export_err = realarch.export(args)
    if export_err:
        print(f"error: {export_err}", file=sys.stderr)
    info, lines, isa_lines, prof_lines, notes, ok = {}, [], [], [], [], not export_err
    for name in args.models:
        try:
            tds, orts, n = run_model(args, name, info)
        except (OSError, ValueError, RuntimeError) as e:
            lines.append(f"| {name} | - | n/a | n/a | n/a | | | | | failed: {e} | |")
            ok = False
            continue
        notes += n
        lines += rows_for(name, tds)
        ok = ok and not tds[0].mismatch and not any(v.err for v in tds if not v.refused)
        for v in tds:
            if v.isa is not None:
                refs = f"; {realarch.ref_summary(v.refs)} ref steps" if v.refs else ""
                isa_lines.append(f"- {name} {v.label}: {impl_summary(v.isa)}; {v.reorders} reorder execs "
                                 f"(one predict, weight reorders included){refs}")
            if v.profile is not None:
                prof_lines.append(f"- {name} {v.label}: {profile_line(v.profile)}")
        del orts

    flags = cpu_flags()
    ver, isa = info.get("dnnl", ("", ""))
    hdr = ("| model | precision | tensord ms per batch-16 | throughput | x vs tensord fp32 | target | met? "
           "| ORT ms (same QDQ model) | tensord/ORT | output check | rounds x runs |")
    table = "\n".join([hdr, "|" + "---|" * 11] + lines)
    isa_text = "\n".join(
        [f"- oneDNN {ver or '?'}, ISA it reports: {isa or '? (no ONEDNN_VERBOSE info line)'}",
         "- CPU flags (lscpu): " + ", ".join(f"{f} {'yes' if v else 'no'}" for f, v in flags.items())] + isa_lines)
    print(table)
    print("\nWhich ISA oneDNN used (implementation of each convolution/matmul exec in one `tensord predict` under "
          "ONEDNN_VERBOSE=1; src/weights dtypes):")
    print(isa_text)
    if prof_lines:
        print("\nWhere the time goes (TENSORD_PROFILE=1, mean ms per step summed by operator type, first run "
              "included):")
        print("\n".join(prof_lines))
    print_notes(notes, args.load_start, "precision_bench", args.t_start)

    if args.save:
        res = os.path.join(HERE, "results")
        os.makedirs(res, exist_ok=True)
        path = os.path.join(res, "precision-cpu.md")
        with open(path, "w") as f:
            f.write("# CPU precision plans: tensord fp32 / bf16 / int8 at batch 16, and onnxruntime int8 on the same "
                    "QDQ models\n\n")
            f.write("Generated by `.venv/bin/python bench/precision_bench.py --save` (see bench/README.md). tensord "
                    "ms = median over alternating rounds of `tensord bench`'s median; throughput = 16 / that; "
                    "x vs fp32 = throughput ratio to tensord fp32 (targets: int8 >= 2.5x, bf16 >= 1.8x); "
                    "tensord/ORT = tensord int8 latency / onnxruntime's on the same QDQ model (target <= 1.0). "
                    "Output checks: rel = max|a - b| / max|b|.\n\n")
            for k, v in machine_info(args.threads, args.load_start):
                f.write(f"- {k}: {v}\n")
            f.write(f"- models: ResNet-50 {args.size} px, BERT-base-shaped encoder seq {args.seq}, "
                    f"{args.layers if args.layers is not None else 12} layers; batch {BATCH}; "
                    f"{args.calib} calibration inputs\n")
            f.write(f"- command: `{command_line()}`\n\n")
            f.write(table + "\n\n## Which ISA oneDNN used\n\n" + isa_text + "\n")
            if prof_lines:
                f.write("\n## Where the time goes (TENSORD_PROFILE=1)\n\n" + "\n".join(prof_lines) + "\n")
            if notes:
                f.write("\n" + "\n".join("- note: " + n_ for n_ in notes) + "\n")
        print(f"wrote {os.path.relpath(path, ROOT)}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
