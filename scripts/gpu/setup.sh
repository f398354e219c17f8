# Sourced by the GPU scripts (ab_attention.sh) after they set LOG (and cd to the repository root): the
# carried optuna and ijson wheels into /tmp/site, the environment, a `stamp` for timed log lines, and the
# saved device profile ($DEV: DEVICE_JSON, default the measured profile of the card found: H200 or H100),
# copied under artifacts/devices/, and $KEY, the card's export folder name.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >/dev/null 2>&1 || echo "wheel install failed" | tee -a "$LOG"
export PYTHONPATH="$PWD:/tmp/site" TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
python3 -c "import optuna, ijson" 2>/dev/null || echo "missing wheels (optuna, ijson): run" \
  "../shared/device/wheels.sh ijson==3.6.0 here and carry .whl" | tee -a "$LOG"
T0=$(date +%s)
stamp() { echo "== $1  (+$(( $(date +%s) - T0 ))s)" | tee -a "$LOG"; }
mkdir -p artifacts/devices
if [ -z "${DEVICE_JSON:-}" ]; then
  DEVICE_JSON=benchmarks/logs/2026-12-01/nvidia-h200.device.json
  nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q "H100" \
    && DEVICE_JSON=benchmarks/logs/2026-12-06/moe_gemv/nvidia-h100-80gb-hbm3.json
fi
DEV=artifacts/devices/$(python3 -c "import json, sys; from tuner.device import profile_key; \
print(profile_key(json.load(open(sys.argv[1]))['name']))" "$DEVICE_JSON").json  # the name lookups use
cp "$DEVICE_JSON" "$DEV"
KEY=$(basename "$DEV" .json)  # this card's export folder name (tuner.runtime.device_key_for)
