#!/usr/bin/env bash
# The whole decode step against each baseline a user could pick instead (tuner ab --baseline):
# eager, torch.compile and torch.compile max-autotune, on 8B-shaped models with random weights.
#   SAVED="qwen3_8b:1:benchmarks/logs/2026-12-01/exports/qwen3_8b-b1 ..." BASELINES=max-autotune,compile \
#     bash scripts/gpu/ab_baselines.sh                        (log: $OUT/ab_baselines.log)
#   TUNE="qwen3_8b:1" BASELINES=max-autotune bash scripts/gpu/ab_baselines.sh
# Rows it produces in BENCHMARKS.md: "Whole decode step against the strongest baseline".
# SAVED="MODEL:BATCH:EXPORT_DIR ...": tuner ab of a saved export against every baseline in
#   BASELINES (default max-autotune).
# TUNE="MODEL:BATCH ...": the user's day against the first of BASELINES: trace the decode step as
#   TRACE_BASELINE runs it (default that first baseline; eager traces the same shapes without
#   max-autotune's minutes of compile), harvest (--kv-heads, and --topk for a MoE, from the config), search the linears (gemv at
#   batch <= 8, gemm above; SEARCH_S seconds, default 45) and the grouped decode attention
#   (ATTN_S, default 30; 0 skips it) and, for a MoE config, the moe family (MOE_S, default 60),
#   tuner rank --baseline RANK_BASELINE (default the first of BASELINES; max-autotune: the kernel
#   max-autotune picks for each shape; for attention the fastest SDPA on the grouped cache) with
#   RANK_FLAGS, export, then tuner ab against
#   every baseline in BASELINES with that export: measured against projected per baseline.
#   CONFIRM=1: then export again without the entries whose calls that step (against the first
#   baseline) ran slower (tuner export --drop-step-losses) and, before DEADLINE_S, A/B that export.
# GATED_MLP=1: a dense model's MLPs as the moe family at experts 1 (tuner harvest --gated-mlp:
#   gate/up + SiLU·mul in one launch, down in a second, searched for MOE_S seconds; tuner.serving
#   routes them where the export keeps them), its other linears as gemv / gemm.
# MIN_SAVING: the search's and rank's --min-saving (default theirs, 0.5% of the traced step; a
#   time per token such as 10us holds against a compiled step shorter than the eager one traced).
# LAYERS: keep the first LAYERS decoder layers of every config (written under the work folder;
#   a 48-layer MoE config and its fp32 reference do not fit one H200 together).
# GPU_TESTS: pytest targets run first (marker gpu). AB_STEPS / AB_GROUPS / AB_REPLAYS: tuner ab's (8 / 10
# / 8). AB_FLAGS: more tuner ab flags for every A/B (e.g. --fold-norms). FOLD=1: after each
# A/B, the same A/B again with --fold-norms (norms folded into the tuned projections, residual
# adds into their kernels), into <its folder>-folded. AB_S: the timeout of one tuner ab (default 300 s; never past LIMIT_S, default 585, after
# the start). DEADLINE_S: no new A/B starts after this many seconds (default 500). DEVICE_JSON: a
# saved device profile (default the measured one of the card found, H200 or H100).
# Writes $OUT/ab_baselines.log and $OUT/ab_baselines.tar.gz (every ab.json / ab.md, verdicts,
# exports, search and rank logs, the studies; no traces).
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0;; esac
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG="$OUT/ab_baselines.log"
W=$(mktemp -d /tmp/ab_baselines.XXXXXX); mkdir -p "$W/keep"
source scripts/gpu/setup.sh
BASELINES=${BASELINES:-max-autotune}
FIRST=${BASELINES%%,*}
TRACE_BASELINE=${TRACE_BASELINE:-$FIRST}; RANK_BASELINE=${RANK_BASELINE:-$FIRST}
MIN=""; [ -n "${MIN_SAVING:-}" ] && MIN="--min-saving $MIN_SAVING"
AB_STEPS=${AB_STEPS:-8}; AB_GROUPS=${AB_GROUPS:-10}; AB_REPLAYS=${AB_REPLAYS:-8}
AB_S=${AB_S:-300}; DEADLINE_S=${DEADLINE_S:-500}; LIMIT_S=${LIMIT_S:-585}
SEARCH_S=${SEARCH_S:-45}; ATTN_S=${ATTN_S:-30}; MOE_S=${MOE_S:-60}
mkdir -p "$W/models"
config() {  # the config tuner ab reads for model $1: the example's, or its first LAYERS layers
  local src=shapes/examples/models/$1.json
  [ -z "${LAYERS:-}" ] && { echo "$src"; return; }
  python3 -c "import json, sys; c = json.load(open('$src')); c['num_hidden_layers'] = int('$LAYERS'); \
json.dump(c, open('$W/models/$1.json', 'w'), indent=1)" && echo "$W/models/$1.json"
}
late() { [ $(( $(date +%s) - T0 )) -gt "$DEADLINE_S" ]; }
keep() {  # everything small of a folder into the tarball's tree, then the tarball
  mkdir -p "$W/keep/$2"
  (cd "$1" && find . -type f \( -name 'ab.json' -o -name 'ab.md' -o -name '*.log' -o -name '*.md' \
     -o -name '*.parquet' -o -name 'gemv.json' -o -name 'gemm.json' -o -name 'attention.json' -o -name 'moe.json' \
     -o -name 'manifest.json' -o -name 'measurement.json' -o -name 'studies.db' \) -not -path '*/traces/*' \
     -not -path './keep/*' -exec cp --parents {} "$W/keep/$2/" \;)
  tar -czf "$OUT/ab_baselines.tar.gz" -C "$W/keep" .
}
ab() {  # model batch export_dir out_dir baselines [more tuner ab flags]
  left=$(( LIMIT_S - $(date +%s) + T0 )); each=$AB_S; [ "$each" -gt "$left" ] && each=$left
  timeout "$left" python3 -m tuner.cli ab \
    --hf-config "$(config "$1")" --batch "$2" --export "$3" --baseline "$5" \
    --steps "$AB_STEPS" --groups "$AB_GROUPS" --replays "$AB_REPLAYS" --timeout "${each}s" -o "$4" ${AB_FLAGS:-} \
    "${@:6}" > "$4.log" 2>&1; echo "ab rc=$?" | tee -a "$LOG"
  grep -v "Warning\|warn\|written:\|report:\|_TORCH_SDPA" "$4.log" | tail -n 60 | tee -a "$LOG"
  rm -rf "$4"/*/traces
}
folded_ab() {  # FOLD=1: the same A/B again, norms and residual adds folded (into <out_dir>-folded)
  [ -n "${FOLD:-}" ] || return 0
  late && { stamp "skip the folded ab $1 b$2 (deadline)"; return 0; }
  stamp "$1 b$2: ab against $5 with the norms folded (--fold-norms)"
  ab "$1" "$2" "$3" "$4-folded" "$5" --fold-norms
}
if [ -n "${GPU_TESTS:-}" ]; then
  stamp "gpu tests: $GPU_TESTS"
  timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider $GPU_TESTS 2>&1 | tail -n 15 | tee -a "$LOG"
fi
for item in ${SAVED:-}; do
  IFS=: read -r model batch dir <<< "$item"
  late && { stamp "skip $model b$batch (deadline)"; continue; }
  stamp "ab $model b$batch against $BASELINES (export $dir)"
  ab "$model" "$batch" "$dir" "$W/saved-$model-b$batch" "$BASELINES"
  folded_ab "$model" "$batch" "$dir" "$W/saved-$model-b$batch" "$BASELINES"
  keep "$W" saved
done
for item in ${TUNE:-}; do
  IFS=: read -r model batch <<< "$item"
  late && { stamp "skip tuning $model b$batch (deadline)"; continue; }
  cfg=$(config "$model"); D="$W/tune-$model-b$batch"; mkdir -p "$D"
  family=gemv; [ "$batch" -gt 8 ] && family=gemm
  kv=$(python3 -c "import json; c = json.load(open('$cfg')); print(c.get('num_key_value_heads') or c['num_attention_heads'])")
  stamp "$model b$batch: trace the $TRACE_BASELINE step"
  timeout 300 python3 -m tuner.cli ab --hf-config "$cfg" --batch "$batch" --trace-only \
    --baseline "$TRACE_BASELINE" -o "$D/trace" > "$D/trace.log" 2>&1; echo "trace rc=$?" | tee -a "$LOG"
  rep=$(ls "$D"/trace/*/traces/baseline_replay.pt.trace.json 2>/dev/null | head -n 1)
  cap=$(ls "$D"/trace/*/traces/baseline_capture.pt.trace.json 2>/dev/null | head -n 1)
  stamp "$model b$batch: harvest"
  topk=$(python3 -c "import json; k = json.load(open('$cfg')).get('num_experts_per_tok'); print(f'--topk {k}' if k else '')")
  gated=""; [ -n "${GATED_MLP:-}" ] && gated="--gated-mlp"
  timeout 120 python3 -m tuner.cli harvest "$rep" --capture "$cap" --kv-heads "$kv" $topk $gated \
    -o "$D/shapes.parquet" > "$D/harvest.log" 2>&1; tail -n 16 "$D/harvest.log" | tee -a "$LOG"
  moe=$(python3 -c "import json; print('moe' if json.load(open('$cfg')).get('num_experts') else '')")
  [ -n "$gated" ] && moe=moe
  for fam in $family attention $moe; do
    secs=$SEARCH_S; [ "$fam" = attention ] && secs=$ATTN_S; [ "$fam" = moe ] && secs=$MOE_S
    [ "$secs" -gt 0 ] || continue
    stamp "$model b$batch: search $fam ${secs}s"
    timeout $((secs + 120)) python3 -m tuner.cli search "$D/shapes.parquet" --family "$fam" \
      --graph-captured --timeout "${secs}s" --storage "$D/studies.db" --no-progress $MIN \
      --device "$DEV" > "$D/search_$fam.log" 2>&1
    echo "search rc=$?" | tee -a "$LOG"; tail -n 6 "$D/search_$fam.log" | tee -a "$LOG"
  done
  stamp "$model b$batch: rank --baseline $RANK_BASELINE $MIN ${RANK_FLAGS:-}"
  timeout 300 python3 -m tuner.cli rank --storage "$D/studies.db" --top 2 --baseline "$RANK_BASELINE" \
    $MIN ${RANK_FLAGS:-} -o "$D/verdicts" > "$D/rank.log" 2>&1
  echo "rank rc=$?" | tee -a "$LOG"; grep -v "re-measuring" "$D/rank.log" | tail -n 16 | tee -a "$LOG"
  timeout 60 python3 -m tuner.cli export "$D"/verdicts/*.parquet -o "$D/export" 2>&1 | tail -n 6 | tee -a "$LOG"
  keep "$D" "tune-$model-b$batch"
  late && { stamp "skip ab $model b$batch (deadline)"; continue; }
  stamp "$model b$batch: ab against $BASELINES with this export"
  exp=$(ls -d "$D"/export/*/ 2>/dev/null | head -n 1)
  [ -n "$exp" ] || { stamp "$model b$batch: no export, no ab"; continue; }
  ab "$model" "$batch" "$exp" "$D/ab" "$BASELINES"
  folded_ab "$model" "$batch" "$exp" "$D/ab" "$BASELINES"
  keep "$D" "tune-$model-b$batch"
  [ -n "${CONFIRM:-}" ] || continue
  abj=$(ls "$D"/ab/*-"$FIRST"/ab.json 2>/dev/null | head -n 1)
  [ -n "$abj" ] || { stamp "$model b$batch: no A/B against $FIRST, nothing to confirm"; continue; }
  stamp "$model b$batch: export without the entries the step ran slower ($abj)"
  timeout 60 python3 -m tuner.cli export "$D"/verdicts/*.parquet -o "$D/export-confirmed" \
    --drop-step-losses "$abj" > "$D/export-confirmed.log" 2>&1
  tail -n 8 "$D/export-confirmed.log" | tee -a "$LOG"; keep "$D" "tune-$model-b$batch"
  grep -q "not exported" "$D/export-confirmed.log" \
    || { stamp "$model b$batch: the step ran no exported call slower: nothing to confirm"; continue; }
  late && { stamp "skip the confirming ab $model b$batch (deadline)"; continue; }
  stamp "$model b$batch: ab against $BASELINES with the confirmed export"
  ab "$model" "$batch" "$D/export-confirmed/$(basename "$exp")" "$D/ab-confirmed" "$BASELINES"
  keep "$D" "tune-$model-b$batch"
done
stamp "done"
