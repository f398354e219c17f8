#!/usr/bin/env bash
# `tuner run` on the bundled example, on the GPU (about 6 of the 8 minutes allowed):
#   1. tuner run: harvest -> budget (--graph-captured) -> search gemv (3 min) -> rank -> export;
#      prints winning shapes with projected us per token and rejected ones with their reasons;
#   2. loader check: the model's decode linears (every gemv row of the example's decode step, as
#      many calls as one step makes) run through kernels.gemv.linear with the export, and the
#      loader's hit counts show which exported entries served them; outputs checked against torch;
#   3. one decode step's linears captured in a CUDA graph: torch's linear vs the tuned GEMV.
# Full log: $OUT/run.log. The last lines are the results table.
# Usage (repo root, PYTHONPATH=$PWD, optuna importable): bash scripts/gpu/run.sh
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
LOG="$OUT/run.log"
WORK=${RUN_WORK:-$(mktemp -d /tmp/tuner-run.XXXXXX)}
TRACE=shapes/examples/qwen25_05b_b4_decode.pt.trace.json.gz
TIMEOUT=${RUN_TIMEOUT:-3m}
export PYTHONUNBUFFERED=1
: > "$LOG"

{
  echo "== tuner run $TRACE --family gemv --graph-captured --timeout $TIMEOUT  ($(date -u +%H:%M:%SZ))"
  echo "   work dir $WORK"
  python3 -m tuner.cli run "$TRACE" --family gemv --graph-captured --timeout "$TIMEOUT" \
    --storage "$WORK/studies.db" -o "$WORK/run" --export-dir "$WORK/export"
  echo "tuner run: rc=$?  ($(date -u +%H:%M:%SZ))"
} 2>&1 | tee -a "$LOG"

{
  echo "== loader check  ($(date -u +%H:%M:%SZ))"
  RUN_DIR="$WORK/run" EXPORT_ROOT="$WORK/export" python3 - <<'EOF'
import json
import os
import sys
from pathlib import Path

import pandas as pd
import torch

from kernels import gemv
from tuner import runtime

run_dir, export_root = Path(os.environ["RUN_DIR"]), Path(os.environ["EXPORT_ROOT"])
gpu = torch.cuda.is_available()
if gpu:
    device = "cuda"
    ident = runtime.current_identity()
else:  # CPU dry run under TRITON_INTERPRET=1: pretend to be the export's device
    device = "cpu"
    found = sorted(export_root.glob("*/gemv.json"))
    doc = json.loads(found[0].read_text()) if found else {}
    ident = {**doc.get("device", {"key": "none", "name": "none", "arch": "none"}),
             "triton": doc.get("versions", {}).get("triton", ""), "torch": torch.__version__}
    runtime.current_identity = lambda: ident
export_dir = export_root / ident["key"]
os.environ["TUNER_EXPORT_DIR"] = str(export_dir)
path = export_dir / "gemv.json"
doc = json.loads(path.read_text()) if path.exists() else {"configs": {}}
print(f"export {path}: {len(doc['configs'])} entries" + ("" if path.exists() else " (none written)"))

table = pd.read_parquet(run_dir / "shapes.parquet")
rows = []
for _, r in table[table["phase"] == "decode"].iterrows():
    shape = gemv.FAMILY.shape_from_row(r)
    if shape is not None:
        rows.append((r["op"], shape, int(round(r["calls_per_step"]))))
if not gpu:  # the interpreter is slow: only the small shapes, one call each
    rows = [(op, s, 1) for op, s, _ in rows if s["n"] * s["k"] <= 896 * 896]
print(f"decode linears per step: {sum(c for _, _, c in rows)} calls of {len(rows)} shapes")

torch.manual_seed(0)
calls = []  # one entry per call of one step: (x, weight, bias)
for op, shape, n_calls in rows:
    dtype = gemv.DTYPES[shape["dtype"]]
    for _ in range(n_calls):  # distinct weights per call, as the layers of a model
        w = (torch.randn(shape["n"], shape["k"], device=device) / shape["k"] ** 0.5).to(dtype)
        x = torch.randn(shape["m"], shape["k"], device=device).to(dtype)
        b = torch.randn(shape["n"], device=device).to(dtype) if op.endswith("addmm") else None
        calls.append((x, w, b))

runtime.reset()
worst = 0.0
for x, w, b in calls:  # one eager decode step through the serving entry point
    out = gemv.linear(x, w, b)
    ref = torch.nn.functional.linear(x.float(), w.float(), None if b is None else b.float())
    err = ((out.float() - ref).norm() / ref.norm()).item()
    worst = max(worst, err)
hits, misses = runtime.hit_counts().get("gemv", {}), runtime.miss_counts().get("gemv", {})
print(f"loader: {runtime.status()}")
print(f"hits {hits}")
print(f"misses (torch path) {misses}")
print(f"worst relative error against fp32 over the step: {worst:.2e}")
not_hit = sorted(set(doc["configs"]) - set(hits))
exported_hit = len(doc["configs"]) - len(not_hit)
verdict = "OK" if doc["configs"] and not not_hit else ("NO EXPORT" if not doc["configs"] else "MISSED")
print(f"LOADER CHECK {verdict}: {exported_hit}/{len(doc['configs'])} exported entries hit, "
      f"{sum(hits.values())} calls tuned, {sum(misses.values())} on the torch path (no exported entry)"
      + (f"; never hit: {not_hit}" if not_hit else ""))

if gpu:  # one decode step's linears, CUDA-graph captured: torch vs the tuned path
    def step_torch():
        for x, w, b in calls:
            torch.nn.functional.linear(x, w, b)

    def step_tuned():
        for x, w, b in calls:
            gemv.linear(x, w, b)

    def graph_us(fn, groups=15, replays=20):
        fn(); torch.cuda.synchronize()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        g.replay(); torch.cuda.synchronize()
        meds = []
        for _ in range(groups):
            times = []
            for _ in range(replays):
                a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(); g.replay(); e.record(); e.synchronize()
                times.append(a.elapsed_time(e) * 1000.0)
            meds.append(sorted(times)[len(times) // 2])
        return sorted(meds)[len(meds) // 2], (max(meds) - min(meds)) / 2

    try:
        runtime.reset(counts_only=True)
        t_torch, s_torch = graph_us(step_torch)
        t_tuned, s_tuned = graph_us(step_tuned)
        t_torch2, _ = graph_us(step_torch)  # A/B/A: drift check
        print(f"STEP LINEARS (CUDA graph, {len(calls)} calls): torch {t_torch:.1f} us "
              f"(±{s_torch:.1f}; again {t_torch2:.1f}), tuned gemv {t_tuned:.1f} us (±{s_tuned:.1f}), "
              f"saving {t_torch - t_tuned:.1f} us per step")
        verdicts = run_dir / "verdicts.parquet"
        if verdicts.exists():
            v = pd.read_parquet(verdicts)
            acc = v[v["decision"] == "accept"]
            print(f"projected by rank for the accepted shapes: "
                  f"{acc['saving_us_per_token'].sum():.1f} us per step")
    except Exception as exc:  # the check above stands on its own
        print(f"step timing failed: {type(exc).__name__}: {exc}")
sys.exit(0)
EOF
  echo "loader check: rc=$?  ($(date -u +%H:%M:%SZ))"
} 2>&1 | tee -a "$LOG"

{
  echo "== results"
  if [ -f "$WORK/run/verdicts.md" ]; then cat "$WORK/run/verdicts.md"; else echo "(no verdict table)"; fi
  grep -E "shape\(s\) with a winning config|^  #[0-9]|rejected:|^  gemv |LOADER CHECK|STEP LINEARS|projected by rank|nothing exported|tuner run: rc" "$LOG" || true
} 2>&1 | tee -a "$OUT/run.results.tmp"
cat "$OUT/run.results.tmp" >> "$LOG"
rm -f "$OUT/run.results.tmp"
