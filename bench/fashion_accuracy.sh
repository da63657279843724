#!/usr/bin/env bash
# fashion_accuracy.sh - the Done-when check for training: the seed CNN (tensord init --arch cnn) trained with Adam
# (lr 1e-3, batch 64) for 3 epochs on the 60,000 Fashion-MNIST training images reaches >= 0.88 accuracy on the
# 10,000 test images. Training runs through `tensord train`; the test accuracy is measured independently by
# `tensord predict` on the written version (argmax vs the t10k labels). Exits 1 below the bar.
#   bench/fashion_accuracy.sh [--threads T] [--replicas R]   (env: TENSORD_BIN, PY, FASHION_DIR, KEEP=1)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${TENSORD_BIN:-$ROOT/build/tensord}"
PY="${PY:-$ROOT/.venv/bin/python}"
DATA="${FASHION_DIR:-/usr/share/datasets/fashion-mnist}"
BAR=0.88
WORK="$(mktemp -d /tmp/fashion-acc-XXXXXX)"
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$WORK"' EXIT

"$BIN" init --arch cnn --seed 0 --out "$WORK/fashion/1"
start=$(date +%s.%N)
"$BIN" train --model-base-path "$WORK/fashion" \
    --data "$DATA/train-images-idx3-ubyte.gz,$DATA/train-labels-idx1-ubyte.gz" \
    --val-data "$DATA/t10k-images-idx3-ubyte.gz,$DATA/t10k-labels-idx1-ubyte.gz" \
    --epochs 3 --batch-size 64 --optimizer adam --lr 1e-3 --loss sparse_categorical_crossentropy --seed 0 "$@" \
    | tee "$WORK/train.out"
end=$(date +%s.%N)

"$PY" - "$DATA" "$WORK" <<'PYEOF'
import gzip, sys
import numpy as np
data, work = sys.argv[1], sys.argv[2]
with gzip.open(f"{data}/t10k-images-idx3-ubyte.gz") as f:
    x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28).astype(np.float32) / 255.0
with gzip.open(f"{data}/t10k-labels-idx1-ubyte.gz") as f:
    y = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64)
np.save(f"{work}/x.npy", x)
np.save(f"{work}/y.npy", y)
PYEOF
"$BIN" predict --model "$WORK/fashion/2" --input "x=$WORK/x.npy" --output-dir "$WORK/pred" >/dev/null
"$PY" - "$WORK" "$BAR" "$("$PY" -c "print($end - $start)")" <<'PYEOF'
import glob, json, sys
import numpy as np
work, bar, secs = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
out = glob.glob(f"{work}/pred/*.npy")
assert len(out) == 1, out
p = np.load(out[0])
y = np.load(f"{work}/y.npy")
acc = float((p.argmax(1) == y).mean())
m = json.load(open(f"{work}/fashion/2/metrics.json"))
eps = [e["examples_per_sec"] for e in m["epochs"]]
print(f"fashion-mnist seed CNN, Adam lr 1e-3, batch 64, 3 epochs: test accuracy {acc:.4f} (bar {bar}), "
      f"training wall time {secs:.1f} s, examples/s per epoch {', '.join(f'{e:.0f}' for e in eps)}")
sys.exit(0 if acc >= bar else 1)
PYEOF
