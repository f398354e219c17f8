#!/usr/bin/env bash
# GPU batch 3 (H200, < 9.5 minutes): real CUDA graph capture/replay fixtures, the parity classes
# of each space, Llama-3.1-8B-shaped at batch 1 through the user's day (run2.sh), and the
# issue-15 kernel sweep (kernels15.sh, budget KERNELS15_BUDGET_S).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/s3.XXXXXX)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH="$PWD:/tmp/site" TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
echo "== capture pairs"
timeout 90 python3 scripts/gpu/capture_pairs.py --out "$W/pairs" 2>&1 | tail -n 3
echo "== parity classes"
timeout 110 python3 scripts/gpu/parity_classes.py --out "$W/parity_classes.json" --budget-s 15 \
  2>&1 | tail -n 6 | tee "$W/parity_classes.txt"
echo "== llama31_8b b1"
OUT="$W/llama" DEVICE_JSON=benchmarks/logs/2026-12-01/nvidia-h200.device.json \
  MODELS="llama31_8b:1" SEARCH_S=45 timeout 240 bash scripts/gpu/run2.sh 2>&1 | \
  grep -E "^== |^A/B|^  (baseline|tuned|aa|speedup|saving|outputs|verdict)|winning|rc=" | head -40
echo "== kernels15"
OUT="$W" KERNELS15_BUDGET_S=${K15:-200} timeout 300 bash scripts/gpu/kernels15.sh > "$W/k15.out" 2>&1
tail -n 120 "$W/k15.out" | grep -v RESULTS-JSON | tail -n 70
tar -czf "$OUT/session3.tar.gz" -C "$W" . 2>/dev/null
ls -la "$OUT"
