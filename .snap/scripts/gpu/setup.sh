# Sourced by the GPU scripts (ab_attention.sh) after they set LOG (and cd to the repository root): the
# carried optuna and ijson wheels into /tmp/site, the environment, a `stamp` for timed log lines, and the
# saved device profile (DEVICE_JSON) as artifacts/devices/nvidia-h200.json ($DEV).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >/dev/null 2>&1 || echo "wheel install failed" | tee -a "$LOG"
export PYTHONPATH="$PWD:/tmp/site" TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
python3 -c "import optuna, ijson" 2>/dev/null || echo "missing wheels (optuna, ijson): run" \
  "../shared/device/wheels.sh ijson==3.6.0 here and carry .whl" | tee -a "$LOG"
T0=$(date +%s)
stamp() { echo "== $1  (+$(( $(date +%s) - T0 ))s)" | tee -a "$LOG"; }
mkdir -p artifacts/devices
cp "${DEVICE_JSON:-benchmarks/logs/2026-12-01/nvidia-h200.device.json}" artifacts/devices/nvidia-h200.json
DEV=artifacts/devices/nvidia-h200.json
