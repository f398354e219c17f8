#!/usr/bin/env bash
# Real capture + replay traces of a model's decode step cut to a few layers, as a baseline runs it:
# the linears keep the full model's shapes, so the kernels a baseline picks for each shape are the
# ones it picks in the whole model, at a fraction of the compile time. Harvest fixtures come from here.
#   MODEL=llama31_8b LAYERS=2 BATCHES="1 8 32" BASELINE=max-autotune bash scripts/gpu/trace_fixture.sh
# Writes $OUT/trace_fixture.log and $OUT/trace_fixture.tar.gz (per batch: the capture and replay
# traces, the progress log and measurement.json).
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0;; esac
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG="$OUT/trace_fixture.log"
source scripts/gpu/setup.sh
MODEL=${MODEL:-llama31_8b}; LAYERS=${LAYERS:-2}; BATCHES=${BATCHES:-"1 8 32"}
BASELINE=${BASELINE:-max-autotune}
W=$(mktemp -d /tmp/trace_fixture.XXXXXX)
python3 - "$MODEL" "$LAYERS" "$W/$MODEL-${LAYERS}l.json" <<'PY'
import json, sys
config = json.load(open(f"shapes/examples/models/{sys.argv[1]}.json"))
config["num_hidden_layers"] = int(sys.argv[2])
json.dump(config, open(sys.argv[3], "w"), indent=1)
PY
for b in $BATCHES; do
  stamp "$MODEL ($LAYERS layers) b$b: trace the $BASELINE step"
  timeout 200 python3 -m tuner.cli ab --hf-config "$W/$MODEL-${LAYERS}l.json" --batch "$b" \
    --trace-only --baseline "$BASELINE" -o "$W/b$b" > "$W/b$b.log" 2>&1
  echo "trace rc=$?" | tee -a "$LOG"; grep -v "Warning\|warn" "$W/b$b.log" | tail -n 4 | tee -a "$LOG"
done
(cd "$W" && tar -czf "$OUT/trace_fixture.tar.gz" --exclude='*.pt' .)
stamp "done"
