#!/usr/bin/env bash
# GPU batch (one H200, < 9.5 minutes): Qwen3-8B-shaped at batch 32 through the user's day with
# the eager and the compiled A/B (run2.sh COMPILE_AB=1), then the compiled batch-1 step's
# graph capture + replay traces (tuner ab --trace-only --compile), kept gzipped under $OUT to read
# how harvest joins a torch.compile'd step.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
DEVICE_JSON=benchmarks/logs/2026-12-01/nvidia-h200.device.json MODELS="qwen3_8b:32" COMPILE_AB=1 \
  COMPILE_AB_S=330 SEARCH_S=40 OUT="$OUT" timeout 480 bash scripts/gpu/run2.sh 2>&1 | \
  grep -v "^\[transformers\]\|UserWarning\|warnings.warn\|_warn_once\|RuntimeWarning\|study.ask" | tail -n 75
echo "== compiled b1 traces"
export PYTHONPATH="$PWD:/tmp/site" TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
timeout 100 python3 -m tuner.cli ab --hf-config shapes/examples/models/qwen3_8b.json --batch 1 \
  --compile --trace-only --steps 4 -o /tmp/ctr > /tmp/ctr.log 2>&1; echo "trace rc=$?"; tail -n 3 /tmp/ctr.log
for f in /tmp/ctr/*/traces/*.json; do gzip -c "$f" > "$OUT/compiled_$(basename "$f").gz"; done
ls -la "$OUT"
