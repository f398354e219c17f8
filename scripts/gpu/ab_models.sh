#!/usr/bin/env bash
# The user's day on 8B-shaped models (random weights), then the whole decode step both ways.
#   MODELS="qwen3_8b:1 qwen3_8b:32" PYTHONPATH=$PWD bash scripts/gpu/ab_models.sh   (log: $OUT/ab_models.log)
# Rows it produces in BENCHMARKS.md: "The whole decode step" (the linears-only rows, eager and
# compiled) and the search-throughput table (SEARCH_NOAHEAD=1).
# For each MODEL:BATCH (a config in shapes/examples/models/): trace the baseline decode step
# (tuner ab --trace-only), harvest the graph capture + replay pair, search (SEARCH_S seconds,
# default 60, --graph-captured; gemv for batch <= 8, gemm above), rank, export, and tuner ab with
# that export; with COMPILE_AB=1 also tuner ab --compile (the torch.compile'd step) with the same
# export (EAGER_AB=0: the compiled A/B only); SEARCH_NOAHEAD=1 first runs the same search with
# --compile-threads 0 into another storage (trials per shape, both ways). GPU_TESTS: pytest
# targets run first (marker gpu). DEVICE_JSON: a saved device profile (default the measured one of
# the card found, H200 or H100: scripts/gpu/setup.sh).
# Writes $OUT/ab_<model>-b<batch>.json/.md (eager), abc_<model>-b<batch>.json/.md (compiled),
# verdicts_<model>-b<batch>.md, export_<model>-b<batch>/ and ab_models.tar.gz (everything).
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0;; esac
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/ab_models.XXXXXX)
LOG="$OUT/ab_models.log"
SEARCH_S=${SEARCH_S:-60}
source scripts/gpu/setup.sh
if [ -n "${GPU_TESTS:-}" ]; then
  stamp "gpu tests"
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider $GPU_TESTS 2>&1 | tail -n 25 | tee -a "$LOG"
fi
for item in ${MODELS:-qwen3_8b:1}; do
  model=${item%%:*}; batch=${item##*:}; cfg=shapes/examples/models/$model.json
  D="$W/$model-b$batch"; mkdir -p "$D"
  family=gemv; [ "$batch" -gt 8 ] && family=gemm
  stamp "$model b$batch: trace the baseline step"
  timeout 180 python3 -m tuner.cli ab --hf-config "$cfg" --batch "$batch" --trace-only \
    -o "$D/trace" > "$D/trace.log" 2>&1; echo "trace rc=$?" | tee -a "$LOG"
  rep=$(ls "$D"/trace/*/traces/baseline_replay.pt.trace.json 2>/dev/null | head -n 1)
  cap=$(ls "$D"/trace/*/traces/baseline_capture.pt.trace.json 2>/dev/null | head -n 1)
  stamp "$model b$batch: harvest"
  timeout 120 python3 -m tuner.cli harvest "$rep" --capture "$cap" -o "$D/shapes.parquet" \
    2>&1 | tail -n 14 | tee -a "$LOG"
  if [ "${SEARCH_NOAHEAD:-0}" = 1 ]; then  # the same search without compiling ahead: trials per shape
    stamp "$model b$batch: search $family ${SEARCH_S}s, --compile-threads 0"
    timeout $((SEARCH_S + 90)) python3 -m tuner.cli search "$D/shapes.parquet" --family "$family" \
      --graph-captured --timeout "${SEARCH_S}s" --storage "$D/studies_noahead.db" --no-progress \
      --compile-threads 0 --device "$DEV" > "$D/search_noahead.log" 2>&1
    echo "search rc=$?" | tee -a "$LOG"; tail -n 8 "$D/search_noahead.log" | tee -a "$LOG"
  fi
  stamp "$model b$batch: search $family ${SEARCH_S}s"
  timeout $((SEARCH_S + 90)) python3 -m tuner.cli search "$D/shapes.parquet" --family "$family" \
    --graph-captured --timeout "${SEARCH_S}s" --storage "$D/studies.db" --no-progress \
    --device "$DEV" > "$D/search.log" 2>&1
  echo "search rc=$?" | tee -a "$LOG"; tail -n 12 "$D/search.log" | tee -a "$LOG"
  stamp "$model b$batch: rank"
  timeout 200 python3 -m tuner.cli rank --storage "$D/studies.db" --family "$family" --top 2 \
    -o "$D/verdicts" > "$D/rank.log" 2>&1; echo "rank rc=$?" | tee -a "$LOG"
  grep -v "re-measuring" "$D/rank.log" | tail -n 20 | tee -a "$LOG"
  timeout 60 python3 -m tuner.cli export "$D"/verdicts/*.parquet -o "$D/export" 2>&1 | tail -n 4 | tee -a "$LOG"
  if [ "${EAGER_AB:-1}" = 1 ]; then
    stamp "$model b$batch: tuner ab"
    timeout 240 python3 -m tuner.cli ab --hf-config "$cfg" --batch "$batch" \
      --export "$D/export/$KEY" --steps 16 --groups 12 --replays 8 -o "$D/ab" \
      > "$D/ab.log" 2>&1; echo "ab rc=$?" | tee -a "$LOG"
    grep -v "^  \.\. " "$D/ab.log" | tail -n 26 | tee -a "$LOG"
  fi
  if [ -n "${COMPILE_AB:-}" ]; then
    stamp "$model b$batch: tuner ab --compile"
    timeout ${COMPILE_AB_S:-300} python3 -m tuner.cli ab --hf-config "$cfg" --batch "$batch" --compile \
      --export "$D/export/$KEY" --steps 16 --groups 12 --replays 8 -o "$D/abc" \
      > "$D/abc.log" 2>&1; echo "ab --compile rc=$?" | tee -a "$LOG"
    grep -v "^  \.\. " "$D/abc.log" | tail -n 26 | tee -a "$LOG"
    rm -rf "$D"/abc/*/traces
    cp "$D"/abc/*/ab.json "$OUT/abc_$model-b$batch.json" 2>/dev/null
    cp "$D"/abc/*/ab.md "$OUT/abc_$model-b$batch.md" 2>/dev/null
  fi
  rm -rf "$D"/trace/*/traces "$D"/ab/*/traces
  cp "$D"/ab/*/ab.json "$OUT/ab_$model-b$batch.json" 2>/dev/null
  cp "$D"/ab/*/ab.md "$OUT/ab_$model-b$batch.md" 2>/dev/null
  cp "$D"/verdicts/*.md "$OUT/verdicts_$model-b$batch.md" 2>/dev/null
  mkdir -p "$OUT/export_$model-b$batch" && cp -r "$D"/export/$KEY/. "$OUT/export_$model-b$batch/" 2>/dev/null
done
stamp "pack"
cp "$LOG" "$W/"
tar -czf "$OUT/ab_models.tar.gz" -C "$W" . 2>/dev/null
ls -la "$OUT" | tee -a "$LOG"
stamp "done"
