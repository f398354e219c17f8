#!/usr/bin/env bash
# GPU batch of 2026-12-01, late (issue 15): the attention family in the batch-32 step, now that
# tuner.serving takes transformers' static-cache decode calls (a mask of the query row, a scale).
#   1. the attention graph-replay tests (tests/test_serving_gpu.py -k decode_attention);
#   2. Qwen3-8B batch 32: trace (tuner ab --trace-only), harvest, tuner search --family attention
#      (SEARCH_S, default 40 s), rank, export with the saved gemm verdicts (GEMM_VERDICTS), then
#      tuner ab --compile with that export (gemm + attention) and with the gemm export alone.
# Usage: DEVICE_JSON=benchmarks/logs/2026-12-01/nvidia-h200.device.json bash scripts/gpu/run15.sh
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG="$OUT/session.log"; W=$(mktemp -d /tmp/s15.XXXXXX)
SEARCH_S=${SEARCH_S:-40}
GEMM_VERDICTS=${GEMM_VERDICTS:-benchmarks/logs/2026-12-01/late/14a_verdicts_qwen3_8b-b32.parquet}
source scripts/gpu/setup.sh
CFG=shapes/examples/models/qwen3_8b.json
stamp "gpu tests: decode attention"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_serving_gpu.py -k decode_attention 2>&1 | tail -n 8 | tee -a "$LOG"
stamp "trace"
timeout 180 python3 -m tuner.cli ab --hf-config $CFG --batch 32 --trace-only -o "$W/trace" > "$W/trace.log" 2>&1; echo "trace rc=$?" | tee -a "$LOG"
rep=$(ls "$W"/trace/*/traces/baseline_replay.pt.trace.json | head -n 1); cap=$(ls "$W"/trace/*/traces/baseline_capture.pt.trace.json | head -n 1)
stamp "harvest"
timeout 120 python3 -m tuner.cli harvest "$rep" --capture "$cap" -o "$W/shapes.parquet" 2>&1 | tail -n 6 | tee -a "$LOG"
stamp "search attention ${SEARCH_S}s"
timeout $((SEARCH_S + 90)) python3 -m tuner.cli search "$W/shapes.parquet" --family attention --graph-captured \
  --timeout "${SEARCH_S}s" --storage "$W/studies.db" --no-progress --device $DEV > "$W/search.log" 2>&1
echo "search rc=$?" | tee -a "$LOG"; grep -v "Warning\|warn" "$W/search.log" | tail -n 8 | tee -a "$LOG"
stamp "rank attention"
timeout 200 python3 -m tuner.cli rank --storage "$W/studies.db" --family attention --top 2 -o "$W/verdicts" > "$W/rank.log" 2>&1
echo "rank rc=$?" | tee -a "$LOG"; grep -v "re-measuring" "$W/rank.log" | tail -n 10 | tee -a "$LOG"
timeout 60 python3 -m tuner.cli export "$W"/verdicts/*.parquet "$GEMM_VERDICTS" -o "$W/export" 2>&1 | tail -n 5 | tee -a "$LOG"
for arm in both gemm; do
  stamp "ab --compile ($arm)"
  E="$W/export/nvidia-h200"; [ $arm = gemm ] && { mkdir -p "$W/gemm_only"; cp "$E/gemm.json" "$E/manifest.json" "$W/gemm_only/"; E="$W/gemm_only"; }
  timeout 200 python3 -m tuner.cli ab --hf-config $CFG --batch 32 --compile --export "$E" \
    --steps 16 --groups 12 --replays 8 -o "$W/ab_$arm" > "$W/ab_$arm.log" 2>&1; echo "ab rc=$?" | tee -a "$LOG"
  grep -v "^  \.\. \|Warning\|warn" "$W/ab_$arm.log" | tail -n 20 | tee -a "$LOG"
  cp "$W"/ab_$arm/*/ab.json "$OUT/ab_$arm.json" 2>/dev/null
  [ $(( $(date +%s) - T0 )) -gt 380 ] && break
done
rm -rf "$W"/trace/*/traces "$W"/ab_*/*/traces
tar -czf "$OUT/session.tar.gz" -C "$W" . 2>/dev/null
stamp "done"
