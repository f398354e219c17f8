"""The moe family against its baselines on Qwen3-30B-A3B expert shapes (scripts/gpu/moe.sh).

For m in MOE_MS (default 1,2,4,8,16,32,64): E = 128, top-k 8, hidden 2048, moe intermediate 768,
bf16. Input sets share one set of weights (1.2 GB) and differ in x and routing, so consecutive
calls touch different experts and read them from HBM (cold, as in a decode step). Per m:
  1. parity facts (tuner.parity.Checker, 2 seeds) of the default config and of each screened one;
  2. screening: the default config, the known candidates (tuner_kernels.candidates: the GEMV
     path's and the MMA path's measured winners) and MOE_CONFIGS seeded samples of
     search_spaces/moe.yaml, each timed once (tuner.bench.time_config, short);
  3. paired, interleaved comparisons (tuner.bench.compare) of the best screened config and the
     default against the baseline (torch._grouped_mm, or the per-expert loop where torch lacks
     it); the per-expert loop baseline timed at m = 1 and the largest m;
  4. the floor: the touched experts' bytes (tuner_kernels.cost.moe_cost) / the measured read bandwidth
     of the visible GPU's saved profile under artifacts/devices (falls back to tuner.device's spec);
  5. where the best config's time goes: the align step, the up GEMM, the down GEMM and the
     reduce (the GEMV path has only the two GEMVs), each timed alone under the same protocol (their sum is not the launch's
     time: alone, each starts on an idle GPU).
Prints one line per timed callable, then two tables; writes $OUT/moe_bench.json.
CPU smoke (interpreter, tiny shape): MOE_SMOKE=1 TRITON_INTERPRET=1 python scripts/gpu/moe_bench.py
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

import torch

from tuner_kernels import get_family, moe
from tuner_kernels.candidates import candidate_configs
from tuner import bench, parity
from tuner.spaces import space_for

SMOKE = os.environ.get("MOE_SMOKE") == "1"
OUT = os.environ.get("OUT", "artifacts/gpu")
MS = [int(v) for v in os.environ.get("MOE_MS", "1,2,4,8,16,32,64").split(",")]
N_CONFIGS = int(os.environ.get("MOE_CONFIGS", "6"))
BASE = {"experts": 128, "topk": 8, "hidden": 2048, "inter": 768, "dtype": "bfloat16"}
if SMOKE:
    MS, N_CONFIGS = [1, 3], 2
    BASE = {"experts": 4, "topk": 2, "hidden": 64, "inter": 32, "dtype": "bfloat16"}
SETS = 8
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TIMER = {} if DEVICE == "cuda" else {"target_graph_us": 1.0, "min_calls": 1}
GROUPS, REPLAYS = (5, 5) if not SMOKE else (1, 1)


def read_bandwidth() -> float:
    from tuner.device import find_saved_profile  # the visible GPU's saved profile (setup.sh)
    from tuner.errors import TunerError

    try:
        profile = find_saved_profile()
    except TunerError:  # a saved file that does not read as a profile
        profile = None
    return profile.read_bandwidth_bytes_per_s if profile else 4.8e12  # else the H200's spec


def input_sets(shape: dict) -> list[dict]:
    base = moe.make_inputs(shape, DEVICE, seed=100)
    sets = []
    for i in range(SETS):
        # x and routing of another seed (inter 1: its own weights are tiny and thrown away)
        fresh = moe.make_inputs({**shape, "inter": 1}, DEVICE, seed=200 + i)
        sets.append({**base, "x": fresh["x"], "topk_ids": fresh["topk_ids"],
                     "topk_weights": fresh["topk_weights"]})
    return sets


def facts_text(f) -> str:
    if f is None:
        return "-"
    return (f"err {f.error_vs_reference:.2e} (baseline {f.baseline_error_vs_reference:.2e}, "
            f"ratio {f.error_ratio:.2f}) bitwise-vs-baseline {int(f.bitwise_vs_baseline)} "
            f"bitwise-vs-default {int(f.bitwise_vs_default)}")


PARTS = ("align", "up", "down", "reduce")


def breakdown(shape: dict, config: dict, sets: list[dict]) -> dict:
    """µs of each part of one launch of `config` (PARTS), each timed alone on the same input
    sets: the align step (moe_align_kernel where the plan has it, else the torch ops), then the
    planned GEMM and reduce calls one at a time."""
    block_m = int(config["BLOCK_SIZE_M"])
    planned = [{**s, "calls": moe.launch_plan(s, config)[1]} for s in sets]
    if int(config.get("GEMV", 0)):  # two launches: no align, no reduce
        return {name: (bench.time_callable(lambda inputs, i=i: inputs["calls"][i].run(), planned,
                                           groups=GROUPS, replays=REPLAYS, **TIMER).median_us
                       if name in ("up", "down") else 0.0)
                for i, name in zip((None, 0, 1, None), PARTS)}
    in_kernel = planned[0]["calls"][0].kernel is moe.moe_align_kernel
    first = 1 if in_kernel else 0  # the up projection's index in the plan

    def align(inputs):
        if in_kernel:
            inputs["calls"][0].run()
        else:
            moe.align(inputs["topk_ids"], shape["experts"], block_m)

    def kernel(i):
        return lambda inputs: inputs["calls"][i].run()

    fns = {"align": align, "up": kernel(first), "down": kernel(first + 1),
           "reduce": kernel(first + 2)}
    return {name: bench.time_callable(fns[name], planned, groups=GROUPS, replays=REPLAYS,
                                      **TIMER).median_us for name in PARTS}


def main() -> int:
    family = get_family("moe")
    backend = bench.backend_name(DEVICE) if DEVICE == "cuda" else "cuda"
    bandwidth = read_bandwidth()
    print(f"device {torch.cuda.get_device_name() if DEVICE == 'cuda' else 'cpu'}; read bandwidth "
          f"{bandwidth / 1e12:.2f} TB/s; grouped-mm baseline: "
          f"{moe.grouped_mm_available(DEVICE)}; torch {torch.__version__}", flush=True)
    rows = []
    for m in MS:
        t0 = time.time()
        shape = {"m": m, **BASE}
        sets = input_sets(shape)
        checker = parity.Checker(family, shape, seeds=2, device=DEVICE)
        default = family.default_config(shape, backend)
        space = space_for("moe", backend)
        kept = space.configs(shape)
        known = space.known(candidate_configs("moe", shape, backend), shape, default)
        picks = random.Random(m).sample(kept, min(N_CONFIGS, len(kept)))
        screened = []
        for config in [default] + known + [c for c in picks if c != default and c not in known]:
            try:
                f = checker.facts(config)
                t = bench.time_config(family, shape, config, input_sets=sets, device=DEVICE,
                                      groups=GROUPS, replays=REPLAYS, **TIMER)
            except Exception as exc:  # noqa: BLE001 - a failing config is a row
                print(f"m={m} FAILED {config}: {str(exc).splitlines()[0][:200]}", flush=True)
                continue
            ok = f.failure("accuracy") == ""
            print(f"m={m} screen {t.median_us:9.2f} us  parity {'ok' if ok else 'FAIL'}  {config}",
                  flush=True)
            screened.append((t.median_us, ok, config, f))
        passing = [s for s in screened if s[1]] or screened
        best_us, _, best, best_facts = min(passing, key=lambda s: s[0])
        vs_base = bench.compare(family, shape, best, "baseline", input_sets=sets, device=DEVICE,
                                groups=2 * GROUPS, replays=REPLAYS, **TIMER)
        default_vs_base = bench.compare(family, shape, default, "baseline", input_sets=sets,
                                        device=DEVICE, groups=2 * GROUPS, replays=REPLAYS, **TIMER)
        loop_us = None
        if m in (MS[0], MS[-1]):
            loop = bench.time_callable(moe.loop_baseline, sets, groups=GROUPS, replays=REPLAYS,
                                       **TIMER)
            loop_us = loop.median_us
        floor_us = family.bytes_moved(shape) / bandwidth * 1e6
        parts = breakdown(shape, best, sets)
        print(f"m={m} parts of the best config, each alone: "
              + ", ".join(f"{k} {v:.2f} us" for k, v in parts.items()), flush=True)
        row = {"m": m, "baseline_us": vs_base.reference_us, "default_us": default_vs_base.candidate_us,
               "best_us": vs_base.candidate_us, "loop_us": loop_us, "floor_us": floor_us,
               "best_over_floor": vs_base.candidate_us / floor_us,
               "speedup": vs_base.speedup, "speedup_low": vs_base.speedup_low,
               "speedup_high": vs_base.speedup_high, "noise_pct": vs_base.noise_pct,
               "default_speedup": default_vs_base.speedup, "best": best,
               "best_facts": facts_text(best_facts), "baseline_facts": facts_text(checker.baseline_facts()),
               "screened": len(screened), "parts_us": parts,
               "seconds": round(time.time() - t0, 1)}
        rows.append(row)
        print(f"m={m} baseline {row['baseline_us']:.2f} us, default {row['default_us']:.2f}, best "
              f"{row['best_us']:.2f} ({row['speedup']:.3f}x [{row['speedup_low']:.3f}, "
              f"{row['speedup_high']:.3f}]), loop {loop_us}, floor {floor_us:.2f} us; best "
              f"{best}; parity {row['best_facts']}; {row['seconds']} s", flush=True)
        os.makedirs(OUT, exist_ok=True)
        json.dump(rows, open(os.path.join(OUT, "moe_bench.json"), "w"), indent=2, default=str)
    print()
    print(f"| m | baseline µs | default µs | best µs | best/floor | speedup [95%] | noise % | "
          f"loop µs | floor µs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        loop = f"{r['loop_us']:.1f}" if r["loop_us"] else "-"
        print(f"| {r['m']} | {r['baseline_us']:.2f} | {r['default_us']:.2f} | {r['best_us']:.2f} | "
              f"{r['best_over_floor']:.2f} | {r['speedup']:.3f} [{r['speedup_low']:.3f}, "
              f"{r['speedup_high']:.3f}] | {r['noise_pct']:.1f} | {loop} | {r['floor_us']:.2f} |")
    print()
    print("| m | " + " | ".join(f"{p} µs" for p in PARTS) + " | sum µs | launch µs | floor µs |")
    print("|---|" + "---|" * (len(PARTS) + 3))
    for r in rows:
        parts = r["parts_us"]
        print(f"| {r['m']} | " + " | ".join(f"{parts[p]:.2f}" for p in PARTS)
              + f" | {sum(parts.values()):.2f} | {r['best_us']:.2f} | {r['floor_us']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
