#!/usr/bin/env bash
# GPU batch (one H200): the compiled A/Bs again with the exports of the two earlier batches
# (benchmarks/logs/2026-12-01/exports/: Qwen3-8B-shaped at batch 1 (gemv) and 32 (gemm)), now
# that harvest reads the compiled step's traces: per-shape attribution and the linears' ceiling.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" artifacts/devices
cp benchmarks/logs/2026-12-01/nvidia-h200.device.json artifacts/devices/nvidia-h200.json
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >/dev/null 2>&1 || echo "wheel install failed"
export PYTHONPATH="$PWD:/tmp/site" TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
for batch in 1 32; do
  echo "== qwen3_8b b$batch: tuner ab --compile $(date -u +%H:%M:%S)"
  timeout 270 python3 -m tuner.cli ab --hf-config shapes/examples/models/qwen3_8b.json \
    --batch "$batch" --compile --export "benchmarks/logs/2026-12-01/exports/qwen3_8b-b$batch" \
    --steps 16 --groups 12 --replays 8 -o /tmp/abc > "$OUT/abc_b$batch.log" 2>&1
  echo "rc=$?"
  grep -v "^  \.\. \|Warning\|warn" "$OUT/abc_b$batch.log" | tail -n 22
  cp /tmp/abc/qwen3_8b-b$batch/ab.json "$OUT/abc_qwen3_8b-b$batch.json" 2>/dev/null
  cp /tmp/abc/qwen3_8b-b$batch/ab.md "$OUT/abc_qwen3_8b-b$batch.md" 2>/dev/null
done
