#!/usr/bin/env bash
# Run GPU scripts on a lent GPU machine in one call, each under a time limit:
#   bash scripts/gpu/run_all.sh timing_noise_gemv sweep_gemm_attention ...
# Installs the carried wheels (.whl/: optuna and what it needs, ijson), records the environment,
# then runs scripts/gpu/<name>.sh for each name (AREA_TIMEOUT seconds each, default 480). Each
# script writes its log under $OUT; the environment goes to $OUT/env.log.
# Rows it produces in BENCHMARKS.md: those of the scripts it runs.
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0;; esac
set -u
cd "$(dirname "$0")/../.."
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || echo "wheel install failed"
fi
export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; export OUT
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  python3 -c "import optuna; print('optuna', optuna.__version__)"
  git log -1 --format='commit %H %s' 2>/dev/null || true
} 2>&1 | tee "$OUT/env.log"
status=()
for area in "$@"; do
  start=$(date +%s)
  timeout --signal=INT --kill-after=20 "${AREA_TIMEOUT:-480}" bash "scripts/gpu/$area.sh"
  rc=$?
  status+=("$area rc=$rc $(( $(date +%s) - start ))s")
done
echo "== areas"; printf '%s\n' "${status[@]}" | tee -a "$OUT/env.log"
