#!/usr/bin/env bash
# `tuner harvest --live` on a GPU (about 2 minutes on one H200): the bundled example's live capture.
#   PYTHONPATH=$PWD OUT=/some/dir bash scripts/gpu/harvest_live.sh        (log: $OUT/harvest.log)
# Rows it produces in BENCHMARKS.md: none; it writes the example trace and table that
# shapes/examples/ ships.
# 1. `tuner harvest --live shapes/examples/qwen_live.py:QwenDecode --steps 8`: the Qwen2.5-0.5B-
#    shaped model (random bf16 weights, needs transformers), batch 4, prompt 128: 1 prefill and
#    7 decode steps under torch.profiler; writes the raw trace and its ShapeTable to $OUT:
#      $OUT/qwen25_05b_b4_live.pt.trace.json.gz, $OUT/qwen25_05b_b4_live.parquet
# 2. Harvests the saved trace again from the file (must give the same table) and the decode phase.
# 3. Profiles CUDA-graph replays (tests/fixtures/traces/graph_replay_live.py): the replayed kernels
#    have no owning op and must be reported as unattributed GPU time ($OUT/cuda_graph_replay.*).
# 4. Runs tests/test_harvest.py on this machine.
# A failing step is reported and the script goes on.
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0;; esac
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/harvest_out}"
mkdir -p "$OUT"
LOG="$OUT/harvest.log"
: > "$LOG"
export PYTHONPATH="${PYTHONPATH:-$PWD}"
STATUS=()

step() {  # step NAME COMMAND...: run, log, remember pass/fail
    local name="$1"; shift
    echo "=== $name: $*" | tee -a "$LOG"
    local t0=$SECONDS
    if "$@" 2>&1 | tee -a "$LOG"; test "${PIPESTATUS[0]}" -eq 0; then
        STATUS+=("$name|ok|$((SECONDS - t0)) s")
    else
        STATUS+=("$name|FAILED|$((SECONDS - t0)) s")
    fi
}

step env python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'hip', torch.version.hip); print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'NO GPU'); import transformers; print('transformers', transformers.__version__)"

step live python3 -m tuner.cli harvest --live shapes/examples/qwen_live.py:QwenDecode --steps 8 \
    --save-trace "$OUT/qwen25_05b_b4_live.pt.trace.json.gz" -o "$OUT/qwen25_05b_b4_live.parquet" --top 25

step reharvest python3 -m tuner.cli harvest "$OUT/qwen25_05b_b4_live.pt.trace.json.gz" \
    -o "$OUT/qwen25_05b_b4_live_again.parquet" --top 5

step same-table python3 - "$OUT" <<'PY'
import sys
from pathlib import Path
import pandas as pd
from tuner import shapetable
out = Path(sys.argv[1])
a = shapetable.read(out / "qwen25_05b_b4_live.parquet")
b = shapetable.read(out / "qwen25_05b_b4_live_again.parquet")
pd.testing.assert_frame_equal(a, b)
print("live table == table harvested from the saved trace:", len(a), "rows")
PY

step decode-only python3 -m tuner.cli harvest "$OUT/qwen25_05b_b4_live.pt.trace.json.gz" \
    --phase decode -o "$OUT/qwen25_05b_b4_live_decode.parquet" --top 10

# CUDA-graph replays: kernels with no owning op must show up as an unattributed share (warning)
step graph python3 -m tuner.cli harvest --live tests/fixtures/traces/graph_replay_live.py:GraphReplay \
    --steps 4 --save-trace "$OUT/cuda_graph_replay.pt.trace.json.gz" -o "$OUT/cuda_graph_replay.parquet"

step tests python3 -m pytest -q tests/test_harvest.py

{
    echo
    echo "=== results (harvest) ==="
    python3 - "$OUT" <<'PY' || echo "(no live table)"
import sys
from pathlib import Path
from tuner import shapetable
df = shapetable.read(Path(sys.argv[1]) / "qwen25_05b_b4_live.parquet")
for ph in ("prefill", "decode"):
    d = df[df.phase == ph]
    if d.empty:
        continue
    print(f"{ph}: {int(d.steps.iloc[0])} steps, step {d.step_us.iloc[0]:.0f} us, GPU busy "
          f"{d.step_gpu_us.iloc[0]:.0f} us, GEMM/attention share {100 * d.share.sum():.1f}%")
cols = ["op", "phase", "m", "n", "k", "calls_per_step", "us_per_call", "share"]
print(df[cols].head(8).to_string(index=False))
PY
    printf '%-12s %-7s %s\n' step result time
    for s in "${STATUS[@]}"; do IFS='|' read -r n r t <<< "$s"; printf '%-12s %-7s %s\n' "$n" "$r" "$t"; done
} 2>&1 | tee -a "$LOG"
