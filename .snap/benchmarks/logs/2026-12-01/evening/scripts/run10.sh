#!/usr/bin/env bash
# GPU batches of 2026-12-01 evening (issue 15): the fused split-K reduce and programmatic
# dependent launch.
#   1. kernels15 (KERNELS15_SET, default all);
#   2. the graph-safety tests of tests/test_serving_gpu.py selected by TESTS_K.
# Logs under $OUT. Ran at 5dcbd70 (default TESTS_K then also took the fused-reduce test) and at
# e423bf6 (KERNELS15_SET=8b, PDL twins); both knobs are gone since (docs/kernels.md).
# Usage: OUT=... bash scripts/gpu/run10.sh
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH="$PWD" TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
T0=$(date +%s)
stamp() { echo "== $1  (+$(( $(date +%s) - T0 ))s)" | tee -a "$OUT/session.log"; }
stamp "kernels15 ${KERNELS15_SET:-all}"
KERNELS15_SET=${KERNELS15_SET:-all} KERNELS15_BUDGET_S=${KERNELS15_BUDGET_S:-330} timeout 470 bash scripts/gpu/kernels15.sh > /dev/null 2>&1
echo "kernels15 rc=$?" | tee -a "$OUT/session.log"
stamp "gpu tests"
timeout ${TESTS_S:-110} python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_serving_gpu.py \
  -k "${TESTS_K:-batch_32 or balanced}" 2>&1 | tail -n 25 | tee -a "$OUT/session.log"
stamp "done"
