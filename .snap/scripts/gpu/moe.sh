#!/usr/bin/env bash
# The moe family on Qwen3-30B-A3B expert shapes (E 128, top-k 8, hidden 2048, moe intermediate
# 768, bf16) at decode m = 1..64 on one H200 (about 6 minutes).
#   PYTHONPATH=$PWD bash scripts/gpu/moe.sh        (log: $OUT/moe.log, rows: $OUT/moe_bench.json)
# Rows it produces in BENCHMARKS.md: "Fused MoE (per shape)".
#   1. the gpu-marked moe tests (graph capture and replay of the whole launch; tests/test_moe_gpu.py)
#   2. scripts/gpu/moe_bench.py: per m, parity facts and a short screen (the default config and
#      MOE_CONFIGS, default 6, seeded samples of search_spaces/moe.yaml), then the best and the
#      default paired against the baseline (torch._grouped_mm), the per-expert loop baseline at the
#      smallest and largest m, and the touched experts' bytes / measured read bandwidth
#      (the device profile of setup.sh: DEVICE_JSON); table last. MOE_MS picks the m values.
# Each part runs under its own timeout (MOE_TEST_S, MOE_BENCH_S), so one failure keeps the other.
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0;; esac
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG="$OUT/moe.log"
source scripts/gpu/setup.sh
export OUT
{
python3 - <<'PY'
import torch, triton
print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__,
      "gpu", torch.cuda.is_available() and torch.cuda.get_device_name())
PY
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu --format=csv 2>/dev/null || true
} 2>&1 | tee -a "$LOG"
stamp "1. gpu tests: tests/test_moe_gpu.py"
timeout "${MOE_TEST_S:-90}" python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_moe_gpu.py 2>&1 \
  | tail -n 12 | tee -a "$LOG" || true
stamp "2. moe family vs baselines (scripts/gpu/moe_bench.py)"
timeout "${MOE_BENCH_S:-330}" python3 scripts/gpu/moe_bench.py > "$OUT/moe_bench.log" 2>&1
echo "moe_bench rc $?" | tee -a "$LOG"
grep -v '^|' "$OUT/moe_bench.log" | tail -n 40 >> "$LOG"
stamp "done"
echo
echo "=== moe per-shape table (µs; best/floor = best µs / (touched bytes / read bandwidth))"
grep '^|' "$OUT/moe_bench.log" || { echo "(no table: moe_bench did not finish; last lines:)"; tail -n 5 "$OUT/moe_bench.log"; }
