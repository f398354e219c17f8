#!/usr/bin/env bash
# The gemm family at prefill sizes against cuBLAS, then the prefill and mixed steps end to end
# (H200: about 7 minutes; each part under its own timeout, a failing part never loses the others).
#   bash scripts/gpu/prefill_gemm.sh                  (logs and results under $OUT, default /tmp/out)
# Rows it produces in BENCHMARKS.md: the per-shape prefill GEMM table and the prefill / mixed
# `tuner ab` rows.
#   1. scripts/gpu/prefill_gemm.py (its docstring): Llama-3.1-8B linears (n, k) = (6144, 4096),
#      (4096, 4096), (28672, 4096), (4096, 14336) at m = 128 ... 8192, and the unfused (1024, 4096),
#      (14336, 4096) at m = PROMPT_TOKENS when it is among GEMM_M (what transformers' Llama
#      runs); per shape torch.matmul, the default config, the persistent-schedule configs
#      (SCHEDULE 1 / 2) and the known tiled ones, timed with tuner.bench on cold caches; the fastest paired against torch (speedup
#      with its 95% interval), its parity facts, TFLOP/s and % of the measured bf16 matmul rate;
#      the paired results ranked (tuner.rank.decide) and exported (tuner.export) for part 2.
#      GEMM_BUDGET_S (default 140): no shape starts after it; GEMM_TIMEOUT_S (default 190);
#      GEMM_M: the m values, comma-separated (default all seven); GEMM_ALL=1: every known config
#      of a shape (--all-known), compiled ahead.
#   2. tuner ab --phase prefill --prompt-tokens $PROMPT_TOKENS (default 2048, batch 1) and
#      tuner ab --phase mixed (the decode step of MIXED_BATCH sequences, default 8, plus one
#      PROMPT_TOKENS chunk) on AB_CONFIG (default shapes/examples/models/llama31_8b.json) with
#      part 1's export, against the default baseline (AB_BASELINE names another, e.g. eager, the
#      fastest to set up); AB_PHASES: the phases (default "prefill mixed"; none: part 1 only); AB_TIMEOUT_S
#      (default 165) each (worst case of the whole script
#      about 9.5 min, typically less). At MIXED_BATCH <= 8 the decode
#      linears are gemv calls, which part 1 does not export: only the chunk's linears are tuned.
# Writes $OUT/prefill_gemm.log (everything), $OUT/gemm.log, $OUT/gemm_results.json,
# $OUT/export/ (part 1's export), $OUT/ab_<phase>.log, $OUT/ab_<phase>.json / .md; the short
# table last.
# CPU check of part 1 (interpreter, tiny shapes, no export) and of part 2's flags (tuner ab says
# what it would run and exits 2 without a GPU):  PREFILL_SMOKE=1 bash scripts/gpu/prefill_gemm.sh
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0;; esac
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG="$OUT/prefill_gemm.log"; : > "$LOG"
W=$(mktemp -d /tmp/prefill_gemm.XXXXXX)
SMOKE=${PREFILL_SMOKE:-0}
PROMPT_TOKENS=${PROMPT_TOKENS:-2048}; MIXED_BATCH=${MIXED_BATCH:-8}
AB_CONFIG=${AB_CONFIG:-shapes/examples/models/llama31_8b.json}
AB_TIMEOUT_S=${AB_TIMEOUT_S:-165}
if [ "$SMOKE" = 1 ]; then
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
  T0=$(date +%s)
  stamp() { echo "== $1  (+$(( $(date +%s) - T0 ))s)" | tee -a "$LOG"; }
  SMOKE_FLAG=--smoke
else
  source scripts/gpu/setup.sh
  SMOKE_FLAG=
fi

stamp "part 1: gemm vs torch.matmul at m = 128 ... 8192"
ALL_FLAG=; [ "${GEMM_ALL:-0}" = 1 ] && ALL_FLAG=--all-known
timeout "${GEMM_TIMEOUT_S:-190}" python3 scripts/gpu/prefill_gemm.py --out "$W/gemm" \
  --budget-s "${GEMM_BUDGET_S:-140}" ${GEMM_M:+--m "$GEMM_M"} --ab-m "$PROMPT_TOKENS" \
  $ALL_FLAG $SMOKE_FLAG \
  > "$OUT/gemm.log" 2>&1
echo "part 1 rc=$?" | tee -a "$LOG"
cat "$OUT/gemm.log" >> "$LOG"
cp "$W/gemm/results.json" "$OUT/gemm_results.json" 2>/dev/null
EXPORT=$(ls -d "$W"/gemm/export/*/ 2>/dev/null | head -n 1)
[ -n "$EXPORT" ] && mkdir -p "$OUT/export" && cp -r "$EXPORT". "$OUT/export/"

for phase in ${AB_PHASES:-prefill mixed}; do
  [ "$phase" = none ] && continue
  batch=1; [ "$phase" = mixed ] && batch=$MIXED_BATCH
  stamp "part 2: tuner ab --phase $phase --prompt-tokens $PROMPT_TOKENS --batch $batch"
  export_flag=(--export "${EXPORT:-$W/no-export}")
  if [ -z "$EXPORT" ] && [ "$SMOKE" != 1 ]; then
    echo "no export from part 1 (nothing accepted or part 1 failed): tuner ab $phase skipped" | tee -a "$LOG"
    continue
  fi
  timeout $((AB_TIMEOUT_S + 15)) python3 -m tuner.cli ab --hf-config "$AB_CONFIG" --phase "$phase" \
    --prompt-tokens "$PROMPT_TOKENS" --batch "$batch" "${export_flag[@]}" --steps 4 --groups 8 \
    --replays 4 --timeout "${AB_TIMEOUT_S}s" -o "$W/ab_$phase" \
    ${AB_BASELINE:+--baseline "$AB_BASELINE"} > "$OUT/ab_$phase.log" 2>&1
  echo "tuner ab $phase rc=$?" | tee -a "$LOG"
  grep -v "^  \.\. " "$OUT/ab_$phase.log" | tail -n 30 | tee -a "$LOG"
  json=$(ls "$W"/ab_$phase/*/ab.json 2>/dev/null | tail -n 1)
  [ -n "$json" ] && cp "$json" "$OUT/ab_$phase.json" && cp "${json%.json}.md" "$OUT/ab_$phase.md"
done

stamp "summary"
{
  sed -n '/^== gemm vs torch.matmul/,$p' "$OUT/gemm.log"
  python3 - "$OUT" <<'PY'
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
print("\n== tuner ab (prefill / mixed)")
print(f"{'phase':8} {'baseline':13} {'base us':>9} {'tuned us':>9} {'speedup [95%]':>22} "
      f"{'A/A':>6} {'meas/proj':>9} {'outputs':>7} exit")
for phase in ("prefill", "mixed"):
    path = out / f"ab_{phase}.json"
    try:
        v = json.loads(path.read_text())
    except (OSError, ValueError):
        print(f"{phase:8} (no ab.json: see ab_{phase}.log)")
        continue
    arms = v.get("arms") or {}

    def median(arm):
        value = (arms.get(arm) or {}).get("median_us")
        return f"{value:9.1f}" if isinstance(value, (int, float)) else "        -"

    def num(key, fmt):
        value = v.get(key)
        return format(value, fmt) if isinstance(value, (int, float)) else "-"

    print(f"{phase:8} {str(v.get('baseline')):13} {median('baseline')} {median('tuned')} "
          f"{num('speedup', '6.3f'):>6} [{num('speedup_low', '.3f')}, {num('speedup_high', '.3f')}] "
          f"{num('aa_ratio', '6.3f'):>6} {num('measured_over_projected', '9.2f'):>9} "
          f"{'ok' if v.get('outputs_ok') else 'NO':>7} {v.get('exit_code')}"
          + (f"  crashed: {v['crashed'][:80]}" if v.get("crashed") else ""))
PY
} 2>&1 | tee -a "$LOG"
rm -rf "$W"/ab_*/*/traces
stamp "done"
