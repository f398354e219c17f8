#!/usr/bin/env bash
# GPU batch of 2026-12-01 (afternoon), one H200, < 9.5 minutes: the issue-15 kernel sweep over
# the 8B and 27B-class decode linears (kernels15.sh, KERNELS15_SET=all, with balanced-rows twins
# of the skinny candidates). The serving graph-safety tests run with the A/Bs (run2.sh
# GPU_TESTS=tests/test_serving_gpu.py).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD" TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
echo "== kernels15 all $(date -u +%H:%M:%S)"
OUT="$OUT" KERNELS15_SET=all KERNELS15_BUDGET_S=${K15:-420} timeout 540 bash scripts/gpu/kernels15.sh \
  > "$OUT/k15.out" 2>&1
echo "kernels15 rc=$?"
grep -v RESULTS-JSON "$OUT/k15.out" | grep -v "^\[ *[0-9.]*s\]    " | tail -n 160 | cut -c1-200
echo "== done $(date -u +%H:%M:%S)"
