#!/usr/bin/env bash
# The decode attention family added to saved exports, and the whole decode step with them.
#   DEVICE_JSON=benchmarks/logs/2026-12-01/nvidia-h200.device.json \
#   ATTN="llama31_8b:1:benchmarks/logs/2026-12-01/late/exports/llama31_8b-b1" \
#   PYTHONPATH=$PWD bash scripts/gpu/ab_attention.sh        (log: $OUT/ab_attention.log)
# Rows it produces in BENCHMARKS.md: "The whole decode step" (the rows with attention, and any
# saved export re-measured through AB_EXPORTS).
#   1. ATTN="model:batch:base_export ...": trace the baseline step (tuner ab --trace-only), harvest,
#      tuner search --family attention (SEARCH_S, default 40 s), rank, export into a copy of
#      base_export (the manifest keeps its other families), then tuner ab --compile with it;
#   AB_EAGER=1: every tuner ab without --compile (the eager step); GROUPED=1: search the grouped
#   attention call (tuner harvest --kv-heads from the model's config) instead of the repeated-KV
#   one the trace records; GPU_TESTS: pytest targets run first (marker gpu); RANK_ARGS: extra
#   tuner rank flags; TRACE_COMPILE=1: trace the torch.compile'd step (tuner ab --trace-only
#   --compile), so harvest marks its rows traced_compiled and rank times their baseline compiled
#   without a flag;
#   2. AB_EXPORTS="label:model:batch:export_dir ...": tuner ab --compile of saved exports.
# Writes $OUT/abc_<model>-b<batch>.json/.md, $OUT/abx_<label>.json/.md,
# $OUT/verdicts_attention_<model>-b<batch>.parquet/.md, $OUT/export_<model>-b<batch>/.
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0;; esac
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG="$OUT/ab_attention.log"; SEARCH_S=${SEARCH_S:-40}
source scripts/gpu/setup.sh
AB_FLAG=--compile; [ "${AB_EAGER:-0}" = 1 ] && AB_FLAG=  # AB_EAGER=1: the eager step (tuner ab without --compile)
if [ -n "${GPU_TESTS:-}" ]; then
  stamp "gpu tests: $GPU_TESTS"
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider $GPU_TESTS 2>&1 | tail -n 8 | tee -a "$LOG"
fi
ab_compile() {  # model batch export_dir out_dir name
  timeout ${COMPILE_AB_S:-240} python3 -m tuner.cli ab --hf-config "shapes/examples/models/$1.json" \
    --batch "$2" $AB_FLAG --export "$3" --steps 16 --groups 12 --replays 8 -o "$4" \
    > "$4.log" 2>&1; echo "ab rc=$?" | tee -a "$LOG"
  grep -v "^  \.\. \|Warning\|warn" "$4.log" | tail -n 22 | tee -a "$LOG"
  cp "$4"/*/ab.json "$OUT/$5.json" 2>/dev/null; cp "$4"/*/ab.md "$OUT/$5.md" 2>/dev/null
  rm -rf "$4"/*/traces
}
for item in ${ATTN:-}; do
  IFS=: read -r model batch base <<< "$item"
  D=$(mktemp -d /tmp/ab_attention.XXXXXX); cfg=shapes/examples/models/$model.json; tag=$model-b$batch
  stamp "$tag: trace"
  TRACE_FLAG=; [ "${TRACE_COMPILE:-0}" = 1 ] && TRACE_FLAG=--compile
  timeout 180 python3 -m tuner.cli ab --hf-config "$cfg" --batch "$batch" --trace-only $TRACE_FLAG -o "$D/trace" \
    > "$D/trace.log" 2>&1; echo "trace rc=$?" | tee -a "$LOG"
  rep=$(ls "$D"/trace/*/traces/baseline_replay.pt.trace.json | head -n 1)
  cap=$(ls "$D"/trace/*/traces/baseline_capture.pt.trace.json | head -n 1)
  stamp "$tag: harvest"
  KV=""  # GROUPED=1: search the grouped call serving runs (head stacking), not the repeated one
  [ "${GROUPED:-0}" = 1 ] && KV="--kv-heads $(python3 -c "import json; c = json.load(open('$cfg')); print(c.get('num_key_value_heads') or c['num_attention_heads'])")"
  timeout 120 python3 -m tuner.cli harvest "$rep" --capture "$cap" $KV -o "$D/shapes.parquet" 2>&1 | tail -n 14 | tee -a "$LOG"
  cp "$D/shapes.parquet" "$OUT/shapes_$tag.parquet" 2>/dev/null
  stamp "$tag: search attention ${SEARCH_S}s"
  timeout $((SEARCH_S + 90)) python3 -m tuner.cli search "$D/shapes.parquet" --family attention --graph-captured \
    --timeout "${SEARCH_S}s" --storage "$D/studies.db" --no-progress --device $DEV > "$D/search.log" 2>&1
  echo "search rc=$?" | tee -a "$LOG"; grep -v "Warning\|warn" "$D/search.log" | tail -n 6 | tee -a "$LOG"
  stamp "$tag: rank attention"
  timeout 200 python3 -m tuner.cli rank --storage "$D/studies.db" --family attention --top 2 ${RANK_ARGS:-} \
    -o "$D/verdicts" > "$D/rank.log" 2>&1
  echo "rank rc=$?" | tee -a "$LOG"; grep -v "re-measuring" "$D/rank.log" | tail -n 8 | tee -a "$LOG"
  mkdir -p "$D/export/$KEY"; cp "$base"/*.json "$D/export/$KEY/"
  rm -f "$D/export/$KEY/attention.json"  # the base's own attention entries are replaced
  timeout 60 python3 -m tuner.cli export "$D"/verdicts/*.parquet -o "$D/export" 2>&1 | tail -n 5 | tee -a "$LOG"
  cp "$D"/verdicts/$KEY-attention.parquet "$OUT/verdicts_attention_$tag.parquet" 2>/dev/null
  cp "$D"/verdicts/$KEY-attention.md "$OUT/verdicts_attention_$tag.md" 2>/dev/null
  mkdir -p "$OUT/export_$tag"; cp "$D"/export/$KEY/*.json "$OUT/export_$tag/"
  [ -f "$D/export/$KEY/attention.json" ] || { stamp "$tag: no attention export, no ab"; continue; }
  stamp "$tag: ab --compile (base export + attention)"
  ab_compile "$model" "$batch" "$D/export/$KEY" "$D/abc" "abc_$tag"
done
for item in ${AB_EXPORTS:-}; do
  IFS=: read -r label model batch dir <<< "$item"
  [ $(( $(date +%s) - T0 )) -gt ${AB_DEADLINE_S:-400} ] && { stamp "skip ab $label (time)"; continue; }
  stamp "ab --compile $label ($model b$batch, $dir)"
  ab_compile "$model" "$batch" "$dir" "$(mktemp -d /tmp/abx.XXXXXX)/ab" "abx_$label"
done
stamp "done"
