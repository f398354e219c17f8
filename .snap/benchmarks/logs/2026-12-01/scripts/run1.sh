#!/usr/bin/env bash
# GPU batch 1 (H200, ~8 minutes): the device profile with its kernel floor, the graph-safety GPU
# tests (the batch-32 gemm set), real CUDA graph capture/replay pairs, the parity classes of each
# space, then `tuner run` on the bundled example and `tuner ab` of its model with the export.
# Usage on the device machine (repo root, .whl carried):
#   bash scripts/gpu/run1.sh
# Everything lands in $OUT/session1.tar.gz plus $OUT/run1.log (the short table last).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/s1.XXXXXX)
LOG="$OUT/run1.log"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >/dev/null 2>&1 || echo "wheel install failed" | tee -a "$LOG"
export PYTHONPATH="$PWD:/tmp/site" TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
T0=$(date +%s)
stamp() { echo "== $1  (+$(( $(date +%s) - T0 ))s)" | tee -a "$LOG"; }

stamp "versions"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" 2>&1 | tee -a "$LOG"

stamp "tuner device"
timeout 120 python3 -m tuner.cli device --out "$W/devices" 2>&1 | tee -a "$LOG"
mkdir -p artifacts/devices && cp "$W"/devices/*.json artifacts/devices/ 2>/dev/null

stamp "gpu tests: serving graph safety + device"
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_serving_gpu.py \
  tests/test_device.py 2>&1 | tail -n 40 | tee -a "$LOG"

stamp "capture pairs"
timeout 120 python3 scripts/gpu/capture_pairs.py --out "$W/pairs" 2>&1 | tail -n 15 | tee -a "$LOG"

stamp "tuner run on the bundled example (gemv, 60 s search)"
timeout 240 python3 -m tuner.cli run shapes/examples/qwen25_05b_b4_decode.pt.trace.json.gz \
  --graph-captured --timeout 60s --storage "$W/studies.db" -o "$W/run" \
  --export-dir "$W/export" > "$W/run.log" 2>&1
echo "tuner run rc=$?" | tee -a "$LOG"
tail -n 25 "$W/run.log" | tee -a "$LOG"

stamp "tuner ab of the example's model at batch 4"
KEY=$(ls "$W/export" 2>/dev/null | head -n 1)
timeout 240 python3 -m tuner.cli ab shapes/examples/qwen_live.py:QwenDecode --batch 4 \
  --export "$W/export/$KEY" --steps 16 --groups 12 --replays 10 -o "$W/ab" > "$W/ab.log" 2>&1
echo "tuner ab rc=$?" | tee -a "$LOG"
grep -v "^  \.\. " "$W/ab.log" | tail -n 30 | tee -a "$LOG"

stamp "parity classes"
timeout 150 python3 scripts/gpu/parity_classes.py --out "$W/parity_classes.json" --budget-s 20 \
  2>&1 | tail -n 8 | tee -a "$LOG"

stamp "pack"
rm -rf "$W"/ab/*/traces/*.json 2>/dev/null
cp "$LOG" "$W/"
tar -czf "$OUT/session1.tar.gz" -C "$W" . 2>/dev/null
ls -la "$OUT" | tee -a "$LOG"
stamp "done"
