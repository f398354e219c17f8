#!/usr/bin/env bash
# Run GPU areas on the lent H200 in one call: bash scripts/gpu/run_all.sh gemv kernels ...
# Installs the carried wheels (.whl/: optuna and what it needs, ijson), records the environment,
# then runs scripts/gpu/<area>.sh for each area with a time limit (AREA_TIMEOUT seconds, default
# 480). Each area writes $OUT/<area>.log; the environment goes to $OUT/env.log.
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
