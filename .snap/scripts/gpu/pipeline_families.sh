#!/usr/bin/env bash
# The gemm and attention families through search and rank on the bundled example (about 3 min):
# prefill GEMMs (m=512) and decode attention rows. A check that the pipeline runs for every
# family on the GPU, not a benchmark (25 s searches).
#   PYTHONPATH=$PWD bash scripts/gpu/pipeline_families.sh        (log: $OUT/families.log)
# Rows it produces in BENCHMARKS.md: "Every family through search and rank".
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0;; esac
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG="$OUT/families.log"
: > "$LOG"
S="sqlite:////tmp/families.db"
T=shapes/examples/qwen25_05b_b4_live.parquet
for fam in gemm attention; do
  echo "== tuner search --family $fam" | tee -a "$LOG"
  timeout --kill-after=10 70 python3 -m tuner.cli search "$T" --family "$fam" --timeout 25s \
    --device h200 --min-saving 1us --storage "$S" --no-progress 2>&1 | tee -a "$LOG"
  echo "rc=${PIPESTATUS[0]}" | tee -a "$LOG"
  echo "== tuner rank --family $fam" | tee -a "$LOG"
  timeout --kill-after=10 60 python3 -m tuner.cli rank --family "$fam" --storage "$S" --top 1 \
    --min-saving 0.1us -o /tmp/families-verdicts 2>&1 | tail -n 25 | tee -a "$LOG"
  echo "rc=${PIPESTATUS[0]}" | tee -a "$LOG"
done
