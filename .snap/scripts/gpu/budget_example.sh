#!/usr/bin/env bash
# The budget against a measured device profile, on the bundled example (one GPU, about 2 minutes):
# measure the device profile, budget the example against it (the saved profile is picked up from
# the table's device column), re-measure the baselines with --measure, and print trace vs
# measured baseline per decode shape.
#   PYTHONPATH=$PWD bash scripts/gpu/budget_example.sh        (log: $OUT/budget.log)
# Rows it produces in BENCHMARKS.md: none (docs/budget.md shows its output). No step stops it.
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0;; esac
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG="$OUT/budget.log"
SHAPES=shapes/examples/qwen25_05b_b4_decode.parquet
WORK=$(mktemp -d)
: > "$LOG"

step() {  # step "title" command...   (runs, logs, never stops the script)
  echo "== $1" | tee -a "$LOG"
  shift
  timeout --kill-after=10 240 "$@" 2>&1 | tee -a "$LOG"
  echo "rc=${PIPESTATUS[0]}" | tee -a "$LOG"
}

step "tuner device (measured profile, saved under artifacts/devices)" \
  python3 -m tuner.cli device
step "budget, measured profile matched from the table's device column, wall-time step" \
  python3 -m tuner.cli budget "$SHAPES" --phase decode -o "$WORK/wall.parquet"
# the measured profile if `tuner device` saved one, else the H200 spec peaks
PROFILE=$(ls -t artifacts/devices/*.json 2>/dev/null | head -n 1)
PROFILE=${PROFILE:-h200}
echo "profile for the next steps: $PROFILE" | tee -a "$LOG"
step "budget, as if graph-captured" \
  python3 -m tuner.cli budget "$SHAPES" --device "$PROFILE" --phase decode --graph-captured \
  -o "$WORK/graph.parquet"
step "budget --measure (baselines re-measured under CUDA graphs, cold L2)" \
  python3 -m tuner.cli budget "$SHAPES" --device "$PROFILE" --phase decode --graph-captured \
  --measure -o "$WORK/measured.parquet"
step "pytest -m gpu tests/test_budget.py" python3 -m pytest -q -m gpu tests/test_budget.py

echo "== results: decode shapes, trace vs re-measured baseline (us per call)" | tee -a "$LOG"
python3 - "$SHAPES" "$WORK" 2>&1 <<'EOF' | tee -a "$LOG"
import sys
from pathlib import Path

from tuner import budget

shapes, work = sys.argv[1], Path(sys.argv[2])
try:
    graph = budget.read(work / "graph.parquet")
    measured = budget.read(work / "measured.parquet")
except Exception as exc:
    print(f"no budget tables to compare: {exc}")
    raise SystemExit(0)
print(f"profile: {graph['profile'].iloc[0]} ({graph['profile_source'].iloc[0]})")
for table in (graph, measured):
    table["shape"] = [budget.describe_shape(row) for _, row in table.iterrows()]
keys = ["phase", "op", "shape", "dtype"]
merged = graph.merge(measured, on=keys, suffixes=("_trace", "_measured"))
print(f"{'op':<34} {'shape':<28} {'floor':>8} {'trace':>8} {'measured':>9} {'source':>8}  "
      f"{'verdict (trace)':<16} verdict (measured)")
for _, r in merged.iterrows():
    print(f"{r['op']:<34} {r['shape']:<28} {r['floor_us_trace']:>8.3g} {r['baseline_us_trace']:>8.3g} "
          f"{r['baseline_us_measured']:>9.3g} {r['baseline_source_measured']:>8}  "
          f"{r['verdict_trace']:<16} {r['verdict_measured']}")
EOF
rm -rf "$WORK"
