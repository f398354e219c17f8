#!/usr/bin/env bash
# `tuner run` on the bundled example, then `tuner ab` of its model with the export (one GPU).
#   PYTHONPATH=$PWD bash scripts/gpu/run_example.sh        (optuna importable; log: $OUT/run.log)
# Rows it produces in BENCHMARKS.md: "The bundled example" (tuner run's verdicts per shape) and
# the example's row of "The whole decode step".
#   1. tuner run: harvest -> budget (--graph-captured) -> search gemv -> rank -> export;
#   2. tuner ab shapes/examples/qwen_live.py:QwenDecode --batch 4: the model's decode step as a
#      CUDA graph three ways (baseline, tuned, A/A) with the export: step times, the A/A margin,
#      outputs against an fp32 reference, the saving per shape against the projection
#      ($OUT/ab.md).
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0;; esac
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
LOG="$OUT/run.log"
WORK=${RUN_WORK:-$(mktemp -d /tmp/tuner-run.XXXXXX)}
TRACE=shapes/examples/qwen25_05b_b4_decode.pt.trace.json.gz
TIMEOUT=${RUN_TIMEOUT:-3m}
export PYTHONUNBUFFERED=1
: > "$LOG"
{
  echo "== tuner run $TRACE --family gemv --graph-captured --timeout $TIMEOUT  ($(date -u +%H:%M:%SZ))"
  python3 -m tuner.cli run "$TRACE" --family gemv --graph-captured --timeout "$TIMEOUT" \
    --storage "$WORK/studies.db" -o "$WORK/run" --export-dir "$WORK/export"
  echo "tuner run: rc=$?  ($(date -u +%H:%M:%SZ))"
  key=$(ls "$WORK/export" 2>/dev/null | head -n 1)
  echo "== tuner ab shapes/examples/qwen_live.py:QwenDecode --batch 4 --export $WORK/export/$key"
  python3 -m tuner.cli ab shapes/examples/qwen_live.py:QwenDecode --batch 4 \
    --export "$WORK/export/$key" -o "$WORK/ab"
  echo "tuner ab: rc=$?  ($(date -u +%H:%M:%SZ))"
  cp "$WORK"/ab/*/ab.md "$OUT/ab.md" 2>/dev/null
} 2>&1 | tee -a "$LOG"
