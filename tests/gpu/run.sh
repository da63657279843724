#!/usr/bin/env bash
# tests/gpu/run.sh - the GPU checks of issue 14 in one call, on a machine with an NVIDIA GPU (an estimated 7 minutes
# on one H200; never run on one yet). Prepare HERE with tests/gpu/pack.sh (builds with CUDA, bundles binaries +
# libraries + test data into .gpu/bundle.tar.xz), then through the device tool:  run(command="bash tests/gpu/run.sh", carry=[".gpu"]).
# Without the bundle it uses build/ (a machine that builds tensord itself).
#
# Stages, each timed and recorded pass / FAIL / skip in $OUT/summary.md (plus each stage's log in $OUT):
#   devices   the plugin loads and sees the device (tensord predict --device on a tiny model)
#   ops       test_ops: every ONNX node-test op on cpu, sim and cuda, each precision, against the CPU's fp32
#   attention attention layers fused into one FusedAttention step on the device, vs onnxruntime (fp32 1e-4, bf16
#             3e-2), and a BERT-base-shaped layer's median ms fused vs unfused (tests/gpu/attention_check.py)
#   matmul    gpu_bench: the backend's fp16/bf16 matmul kernel vs a bare cuBLASLt call, TFLOP/s (bar: >= 0.70)
#   parity    tensord train on the device vs the CPU, same seed and data: weights after 2 epochs (MLP, seed CNN)
#   train     examples/s on the device vs the CPU: seed CNN, ResNet-50 (torchvision's export, or the same
#             architecture from bench/models.py when torchvision is absent), the BERT-base-shaped encoder (fp32 and
#             mixed_bf16, bf16 MFU)
#   graphs    CUDA Graphs: ResNet-50 served at batch 1 on the device, requests with new values vs onnxruntime (graph
#             replays from the third), and `tensord bench` batch 1 with graphs on vs TENSORD_CUDA_GRAPHS=0
#             (tests/gpu/graphs_check.py)
#   serve     ResNet-50 served on the device: predictions vs onnxruntime; gRPC ModelInfer throughput at 64
#             concurrent clients with and without dynamic batching (bar: batched >= 3x unbatched)
# Environment: TENSORD_GPU_DEVICE (default cuda:0); TENSORD_GPU_QUICK=1 shrinks every size (checks the script
# itself, e.g. with TENSORD_GPU_DEVICE=sim:0 on a machine without a GPU); OUT (the device tool sets it).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/build/gpu-out}
mkdir -p "$OUT"
DEV=${TENSORD_GPU_DEVICE:-cuda:0}
QUICK=${TENSORD_GPU_QUICK:-0}
PY=${PYTHON:-python3}
WORK=$(mktemp -d /tmp/tdgpu.XXXXXX)
S=$OUT/summary.md
T0=$(date +%s)

if [ -f .gpu/bundle.tar.xz ]; then
    mkdir -p "$WORK/pack" && tar -xJf .gpu/bundle.tar.xz -C "$WORK/pack"
    BIN=$WORK/pack/bin DATA=$WORK/pack/data
    export LD_LIBRARY_PATH=$WORK/pack/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export TENSORD_CUDA_PLUGIN=$BIN/libtensord_cuda.so
else
    BIN=$ROOT/build DATA=/usr/share/libonnx-testdata/data
    cp build/tests/test_ops build/tests/gpu_bench "$BIN/" 2>/dev/null || true
    [ -x build/bench/grpc_load ] && cp build/bench/grpc_load "$BIN/"
fi
# cuBLAS / cuDNN / NCCL: the toolkit's, else the pip wheels' (PyTorch's nvidia-* packages)
WHEEL_LIBS=$($PY - <<'PY' 2>/dev/null
import glob, os, site
dirs = []
for sp in site.getsitepackages():
    dirs += sorted(glob.glob(os.path.join(sp, "nvidia", "*", "lib")))
print(":".join(dirs))
PY
)
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/cuda/lib64${WHEEL_LIBS:+:$WHEEL_LIBS}

{
    echo "# tests/gpu/run.sh on $(hostname), $(date -u +%Y-%m-%dT%H:%MZ)"
    echo
    echo "- device: $DEV; $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo 'nvidia-smi absent')"
    echo "- CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo "- quick: $QUICK"
    echo
    echo "| stage | result | seconds | figures |"
    echo "|---|---|---|---|"
} > "$S"

FIG=""
stage() { # stage NAME CMD...: runs CMD with its log in $OUT/NAME.log; FIG (set by CMD) goes in the row
    local name=$1; shift
    local t=$(date +%s) rc
    FIG=""
    "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    local r=pass
    [ $rc -ne 0 ] && r=FAIL
    [ $rc -eq 77 ] && r=skip
    [ -f "$WORK/$name.fig" ] && FIG=$(cat "$WORK/$name.fig")
    echo "| $name | $r | $(( $(date +%s) - t )) | $FIG |" >> "$S"
    echo "== $name: $r ($FIG)"
}

size() { if [ "$QUICK" = 1 ]; then echo "$2"; else echo "$1"; fi; }

# ---- devices
st_devices() {
    $PY - "$WORK" <<'PY' || return 1
import sys, numpy as np
np.save(sys.argv[1] + "/x.npy", np.ones((2, 20), np.float32))
PY
    "$BIN/tensord" init --arch mlp --opt input=20 --opt hidden=16 --opt classes=3 --seed 0 --out "$WORK/mlp/1" || return 1
    "$BIN/tensord" bench --model "$WORK/mlp/1" --input x="$WORK/x.npy" --device "$DEV" --iterations 5 | tee "$WORK/dev.txt" || return 1
    grep -o 'device=[^ ]* device_steps=[0-9]* fallback_steps=[0-9]*' "$WORK/dev.txt" > "$WORK/devices.fig"
    grep -q 'device_steps=' "$WORK/dev.txt"
}
stage devices st_devices

# ---- ops
st_ops() {
    local args=()
    for s in node pytorch-converted pytorch-operator simple; do
        [ -d "$DATA/$s" ] && args+=(--data "$DATA/$s" --expect "$( [ -f "$DATA/expected-$s.txt" ] && echo "$DATA/expected-$s.txt" || echo "tests/conformance/expected-$s.txt")")
    done
    "$BIN/test_ops" "${args[@]}" --threads 4
    local rc=$?
    { grep -E '^test_ops: [0-9]' "$OUT/ops.log"; grep -E '^skipped: cuda' "$OUT/ops.log" | cut -c1-160; } | tr '\n' ' ' | tr '|' '/' > "$WORK/ops.fig"
    return $rc
}
stage ops st_ops

# ---- fused attention
st_attention() {
    mkdir -p "$WORK/attn"
    $PY tests/gpu/attention_check.py "$BIN/tensord" "$DEV" "$WORK/attn" $( [ "$QUICK" = 1 ] && echo --quick ) | tee "$WORK/attn.out"
    local rc=${PIPESTATUS[0]}
    tail -1 "$WORK/attn.out" | tr '|' '/' > "$WORK/attention.fig"
    return $rc
}
stage attention st_attention

# ---- matmul
st_matmul() {
    case "$DEV" in cuda*) ;; *) echo "no cuBLASLt reference on $DEV"; return 77;; esac
    "$BIN/gpu_bench" --device "$DEV" --size "$(size 8192 1024)" --iters "$(size 30 3)" | tee "$WORK/mm.json" || return 1
    $PY - "$WORK/mm.json" "$WORK/matmul.fig" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
open(sys.argv[2], "w").write("; ".join(f"{r['dtype']} {r['tensord_tflops']} vs cuBLASLt {r['cublaslt_tflops']} TFLOP/s = {r['ratio']:.2f}" for r in rows))
sys.exit(0 if rows and all(r.get("ratio", 0) >= 0.70 for r in rows) else 1)
PY
}
stage matmul st_matmul

# ---- parity and training speed (tensord train; data written here)
gen_data() { # gen_data FILE KIND N
    $PY - "$@" <<'PY'
import sys, numpy as np
path, kind, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
r = np.random.default_rng(1)
if kind == "mlp":
    x = r.random((n, 20)).astype(np.float32); y = (x[:, :3].sum(1) * 2).astype(np.int64) % 3
elif kind == "cnn":
    x = r.random((n, 1, 28, 28)).astype(np.float32); y = (x.mean((1, 2, 3)) * 20).astype(np.int64) % 10
elif kind.startswith("img"):
    s = int(kind[3:]); x = r.standard_normal((n, 3, s, s)).astype(np.float32); y = r.integers(0, 10, n)
elif kind.startswith("tok"):
    seq = int(kind[3:]); x = r.integers(0, 30522, (n, seq)); y = r.integers(0, 2, n)
np.savez(path, **{("tokens" if kind.startswith("tok") else "x"): x, "label": y})
PY
}
train() { # train BASE DATA VERSION DEVICES BATCH EPOCHS [extra...]
    local base=$1 data=$2 v=$3 devs=$4 b=$5 e=$6; shift 6
    "$BIN/tensord" train --model-base-path "$base" --base-version 1 --new-version "$v" --data "$data" --epochs "$e" \
        --batch-size "$b" --optimizer adam --lr 0.001 --loss sparse_categorical_crossentropy --seed 3 --no-progress \
        --devices "$devs" "$@"
}
eps() { $PY -c "import json,sys; m=json.load(open(sys.argv[1])); print('%.0f' % m['epochs'][-1]['examples_per_sec'])" "$1/$2/metrics.json"; }

st_parity() {
    local ok=0 fig=""
    for arch in mlp cnn; do
        local base=$WORK/p-$arch opts=(--opt input=20 --opt hidden=32 --opt classes=3)
        [ $arch = cnn ] && opts=()
        "$BIN/tensord" init --arch $arch "${opts[@]}" --seed 0 --out "$base/1" || return 1
        gen_data "$WORK/p-$arch.npz" $arch 512
        train "$base" "$WORK/p-$arch.npz" 2 cpu 64 2 || return 1
        train "$base" "$WORK/p-$arch.npz" 3 "$DEV" 64 2 || return 1
        local d
        d=$($PY - "$base" <<'PY'
import sys, onnx
from onnx import numpy_helper
w = lambda v: {i.name: numpy_helper.to_array(i) for i in onnx.load(f"{sys.argv[1]}/{v}/model.onnx").graph.initializer}
a, b = w(2), w(3)
print(max(float(abs(a[k] - b[k]).max() / max(1e-6, abs(a[k]).max())) for k in a if a[k].dtype.kind == "f"))
PY
) || return 1
        fig="$fig $arch max rel diff $d;"
        $PY -c "import sys; sys.exit(0 if float('$d') <= 1e-3 else 1)" || ok=1
    done
    echo "$fig" > "$WORK/parity.fig"
    return $ok
}
stage parity st_parity

st_train() {
    local fig="" rc=0
    # seed CNN
    "$BIN/tensord" init --arch cnn --seed 0 --out "$WORK/t-cnn/1" || return 1
    gen_data "$WORK/t-cnn.npz" cnn "$(size 16384 512)"
    train "$WORK/t-cnn" "$WORK/t-cnn.npz" 2 cpu 64 1 && train "$WORK/t-cnn" "$WORK/t-cnn.npz" 3 "$DEV" 64 1 || rc=1
    [ $rc = 0 ] && fig="cnn $(eps "$WORK/t-cnn" 3) vs cpu $(eps "$WORK/t-cnn" 2) ex/s;"
    # ResNet-50: torchvision's (weights=None) exported by bench/realarch_export.py, else the zoo ResNet
    local rn=$WORK/t-rn s=$(size 224 64)
    if $PY bench/realarch_export.py --out "$WORK/ra" --models resnet50 --batches 1 --size "$s" >/dev/null 2>&1 &&
       [ -f "$WORK/ra/resnet50/model.onnx" ]; then
        rname="ResNet-50 (torchvision, ${s}px)"
    else # the same architecture written with onnx.helper (bench/models.py build_resnet50), random weights
        mkdir -p "$WORK/ra/resnet50"
        $PY -c "import sys; sys.path.insert(0, 'bench'); import models; models.write_model(models.build_resnet50(hw=$s), '$WORK/ra/resnet50/model.onnx')" || return 1
        rname="ResNet-50 (bench/models.py, ${s}px; no torchvision here)"
    fi
    mkdir -p "$rn/1" && cp "$WORK/ra/resnet50/model.onnx" "$rn/1/"
    gen_data "$WORK/t-rn.npz" img$s "$(size 2048 64)"
    gen_data "$WORK/t-rn-cpu.npz" img$s "$(size 128 32)"
    if train "$rn" "$WORK/t-rn.npz" 3 "$DEV" 32 1 --replace-head 10 && train "$rn" "$WORK/t-rn-cpu.npz" 2 cpu 32 1 --replace-head 10; then
        fig="$fig $rname $(eps "$rn" 3) vs cpu $(eps "$rn" 2) ex/s;"
    else rc=1; fi
    # BERT-base-shaped encoder, seq 128, batch 16: fp32 and mixed_bf16; MFU from the model's FLOPs
    local L=$(size 12 2) D=$(size 768 128) seq=$(size 128 32) en=$WORK/t-bert
    "$BIN/tensord" init --arch transformer-encoder --opt vocab=30522 --opt seq=$seq --opt d=$D --opt heads=$(size 12 4) \
        --opt layers=$L --opt ffn=$((4 * D)) --opt classes=2 --seed 0 --out "$en/1" || return 1
    gen_data "$WORK/t-bert.npz" tok$seq "$(size 1024 64)"
    gen_data "$WORK/t-bert-cpu.npz" tok$seq "$(size 64 32)"
    if train "$en" "$WORK/t-bert.npz" 3 "$DEV" 16 1 && train "$en" "$WORK/t-bert.npz" 4 "$DEV" 16 1 --precision mixed_bf16 &&
       train "$en" "$WORK/t-bert-cpu.npz" 2 cpu 16 1; then
        local e3 e4 e2 mfu
        e3=$(eps "$en" 3); e4=$(eps "$en" 4); e2=$(eps "$en" 2)
        # training FLOPs per example: 6 x (12 L D^2 weights) x seq + 12 L seq^2 D (attention scores, fwd+bwd)
        mfu=$($PY -c "L,D,S=$L,$D,$seq; f=6*12*L*D*D*S+12*L*S*S*D; print(f'{100*f*$e4/989e12:.2f}')")
        fig="$fig encoder fp32 $e3, bf16 $e4 vs cpu $e2 ex/s, bf16 MFU ${mfu}% of 989 TFLOP/s;"
    else rc=1; fi
    echo "$fig" > "$WORK/train.fig"
    return $rc
}
stage train st_train

# ---- serving: ResNet-50 on the device, predictions and throughput
free_port() { $PY -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])"; }
st_serve() {
    local m=$WORK/ra/resnet50/model.onnx
    [ -f "$m" ] || { echo "no ResNet-50 (the train stage writes it)"; return 77; }
    mkdir -p "$WORK/srv/resnet50/1" && cp "$m" "$WORK/srv/resnet50/1/"
    local fig="" rc=0
    for mode in unbatched batched; do
        local rp gp extra=()
        rp=$(free_port); gp=$(free_port)
        if [ $mode = batched ]; then
            printf 'max_batch_size { value: 64 }\nbatch_timeout_micros { value: 2000 }\nnum_batch_threads { value: 4 }\n' > "$WORK/batch.txt"
            extra=(--enable_batching --batching_parameters_file="$WORK/batch.txt")
        fi
        "$BIN/tensord" serve --model_name=resnet50 --model_base_path="$WORK/srv/resnet50" --rest_api_port="$rp" \
            --port="$gp" --device="$DEV" "${extra[@]}" > "$OUT/serve-$mode.log" 2>&1 &
        local pid=$!
        for _ in $(seq 600); do curl -sf "http://127.0.0.1:$rp/v1/models/resnet50" >/dev/null 2>&1 && break; sleep 0.2; done
        if [ $mode = unbatched ]; then
            $PY - "$rp" "$m" "$(size 224 64)" <<'PY' || rc=1
import json, sys, urllib.request, numpy as np, onnxruntime as ort
port, model = sys.argv[1], sys.argv[2]
s = int(sys.argv[3])
x = np.random.default_rng(0).standard_normal((2, 3, s, s)).astype(np.float32)
req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/resnet50/infer", data=json.dumps({"inputs": [
    {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}).encode())
got = np.array(json.load(urllib.request.urlopen(req, timeout=120))["outputs"][0]["data"], np.float32).reshape(2, -1)
want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
err = float(abs(got - want).max() / abs(want).max())
print("max rel err vs onnxruntime", err)
sys.exit(0 if err <= 1e-3 else 1)
PY
        fi
        "$BIN/grpc_load" "127.0.0.1:$gp" /inference.GRPCInferenceService/ModelInfer "$DATA/resnet50_infer_$(size 224 64).pb" 64 \
            "$(size 15 3)" --threads 4 --warmup 3 | tee "$WORK/load-$mode.json" || rc=1
        kill $pid; wait $pid 2>/dev/null
    done
    local r
    r=$($PY - "$WORK" <<'PY'
import json, sys
u, b = (json.load(open(f"{sys.argv[1]}/load-{m}.json")) for m in ("unbatched", "batched"))
print(f"{u['rps']:.0f} {b['rps']:.0f} {b['rps'] / max(u['rps'], 1e-9):.2f}")
PY
) || return 1
    set -- $r
    echo "ResNet-50 64 clients: unbatched $1 req/s, batched $2 req/s = $3x" > "$WORK/serve.fig"
    $PY -c "import sys; sys.exit(0 if $3 >= 3.0 else 1)" || rc=1
    return $rc
}
stage serve st_serve

# ---- CUDA Graphs
st_graphs() {
    local m=$WORK/ra/resnet50/model.onnx
    [ -f "$m" ] || { echo "no ResNet-50 (the train stage writes it)"; return 77; }
    mkdir -p "$WORK/graphs"
    $PY tests/gpu/graphs_check.py "$BIN/tensord" "$DEV" "$WORK/graphs" "$m" $( [ "$QUICK" = 1 ] && echo --quick ) | tee "$WORK/graphs.out"
    local rc=${PIPESTATUS[0]}
    tail -1 "$WORK/graphs.out" | tr '|' '/' > "$WORK/graphs.fig"
    return $rc
}
stage graphs st_graphs

echo >> "$S"
echo "total $(( $(date +%s) - T0 )) s" >> "$S"
cat "$S"
grep -q '| FAIL |' "$S" && exit 1
exit 0
