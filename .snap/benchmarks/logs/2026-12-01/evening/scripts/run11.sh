#!/usr/bin/env bash
# GPU batch of 2026-12-01 evening (issue 15, ran at 887d5ff; the PDL knob it turns off was removed
# after this measurement): which of the two new knobs the whole step pays for.
# The Qwen3-8B batch-32 verdicts of session 12 (tuner rank; their down and k/v winners launch
# with PDL = 1 and sum split K with FUSE_REDUCE = 1) are exported twice more with a knob turned
# off in every config (same bytes: neither knob changes the sums), and each export is A/B'd in
# the compiled step (tuner ab --compile). An experiment, not the user's path: the projected
# savings in ab.md are those of the original verdicts.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >/dev/null 2>&1 || echo "wheel install failed"
export PYTHONPATH="$PWD:/tmp/site" TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
W=$(mktemp -d /tmp/s11.XXXXXX)
SRC=benchmarks/logs/2026-12-01/evening/12_verdicts_qwen3_8b-b32.parquet
mkdir -p artifacts/devices; cp benchmarks/logs/2026-12-01/nvidia-h200.device.json artifacts/devices/nvidia-h200.json
T0=$(date +%s)
stamp() { echo "== $1  (+$(( $(date +%s) - T0 ))s)" | tee -a "$OUT/session.log"; }
for variant in ${VARIANTS:-nopdl plain}; do
  stamp "$variant: export"
  python3 - "$SRC" "$W/$variant.parquet" "$variant" <<'PY' 2>&1 | tee -a "$OUT/session.log"
import json, sys
import pandas as pd
src, dst, variant = sys.argv[1:]
d = pd.read_parquet(src)
off = {"nopdl": {"PDL": 0}, "plain": {"PDL": 0, "FUSE_REDUCE": 0}}[variant]
def turn_off(text):
    config = json.loads(text)
    config.update({k: v for k, v in off.items() if k in config})
    return json.dumps(config, sort_keys=True, separators=(",", ":"))
d["config"] = d["config"].map(turn_off)
d.to_parquet(dst)
print(variant, d[d.decision == "accept"][["shape", "config"]].to_string(index=False))
PY
  timeout 60 python3 -m tuner.cli export "$W/$variant.parquet" -o "$W/export-$variant" 2>&1 | tail -n 3 | tee -a "$OUT/session.log"
  stamp "$variant: tuner ab --compile"
  timeout 280 python3 -m tuner.cli ab --hf-config shapes/examples/models/qwen3_8b.json --batch 32 --compile \
    --export "$W/export-$variant/nvidia-h200" --steps 16 --groups 12 --replays 8 -o "$W/ab-$variant" \
    > "$W/ab-$variant.log" 2>&1; echo "ab rc=$?" | tee -a "$OUT/session.log"
  grep -v "^  \.\. " "$W/ab-$variant.log" | tail -n 24 | tee -a "$OUT/session.log"
  cp "$W"/ab-$variant/*/ab.md "$OUT/abc_$variant.md" 2>/dev/null
  cp "$W"/ab-$variant/*/ab.json "$OUT/abc_$variant.json" 2>/dev/null
done
stamp "done"
