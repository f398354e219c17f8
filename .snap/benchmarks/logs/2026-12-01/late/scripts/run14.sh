#!/usr/bin/env bash
# GPU batches of 2026-12-01, late (issue 15): known configs queued first + compile-ahead.
#   1. scripts/gpu/run2.sh for MODELS (the user's day: trace, harvest, search, rank, export,
#      tuner ab --compile), with its environment (SEARCH_S, SEARCH_NOAHEAD, GPU_TESTS, ...);
#   2. tuner ab --compile of saved exports, for a same-machine comparison:
#      AB_EXPORTS="label:model:batch:export_dir ..." (logs $OUT/abx_<label>.md/.json).
# Usage: DEVICE_JSON=benchmarks/logs/2026-12-01/nvidia-h200.device.json MODELS=llama31_8b:32 \
#   AB_EXPORTS="aft:qwen3_8b:32:benchmarks/logs/2026-12-01/exports/qwen3_8b-b32" bash scripts/gpu/run14.sh
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [ -n "${MODELS:-}" ]; then bash scripts/gpu/run2.sh; fi
export PYTHONPATH="$PWD:/tmp/site" TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
T0=$(date +%s)
for item in ${AB_EXPORTS:-}; do
  IFS=: read -r label model batch dir <<< "$item"
  echo "== ab --compile $label ($model b$batch, $dir)  (+$(( $(date +%s) - T0 ))s)" | tee -a "$OUT/session.log"
  W=$(mktemp -d /tmp/abx.XXXXXX)
  timeout ${COMPILE_AB_S:-240} python3 -m tuner.cli ab --hf-config "shapes/examples/models/$model.json" \
    --batch "$batch" --compile --export "$dir" --steps 16 --groups 12 --replays 8 -o "$W" \
    > "$W/abx.log" 2>&1; echo "ab rc=$?" | tee -a "$OUT/session.log"
  grep -v "^  \.\. " "$W/abx.log" | grep -v "Warning\|warn" | tail -n 22 | tee -a "$OUT/session.log"
  cp "$W"/*/ab.json "$OUT/abx_$label.json" 2>/dev/null; cp "$W"/*/ab.md "$OUT/abx_$label.md" 2>/dev/null
done
echo "== done  (+$(( $(date +%s) - T0 ))s)" | tee -a "$OUT/session.log"
