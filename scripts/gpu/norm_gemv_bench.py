"""The gemv FMA kernel with and without the RMSNorm it can carry (NORM) and the residual add its
epilogue can take (HAS_RES), config by config.

For each 8B decode linear at m = 1 (NORM_SHAPES, default the Llama-3.1-8B projections) and each
norm-capable config of the cuda space (USE_DOT 0, SPLIT_K 1: ROWS_PER_BLOCK 1-8, BLOCK_K
1024/2048, 4/8 warps, num_stages NORM_STAGES, default 1), time the plain kernel, the kernel
carrying the norm (on the weight with the norm's weight folded in: the form tuner.serving's
fold_norms runs) and the plain kernel adding a residual in its epilogue (tuner.linear_add)
(tuner.bench.time_config, cold input sets rotated past L2, CUDA-graph replays, medians). What it
answers: which config a folded projection should run, and what carrying the norm or the add
costs the kernel against the launch of a kernel of its own (3-5 µs on an H100 / H200).
Prints one line per config, then the best per shape; writes $OUT/norm_gemv_bench.json.
CPU smoke (interpreter, tiny shapes): NORM_SMOKE=1 TRITON_INTERPRET=1 python scripts/gpu/norm_gemv_bench.py
"""

from __future__ import annotations

import itertools
import json
import os

from tuner import bench
from tuner.spaces import space_for
from tuner_kernels import get_family

SMOKE = os.environ.get("NORM_SMOKE") == "1"
DEVICE, CACHE = ("cpu", "warm") if SMOKE else (None, "cold")
OUT = os.environ.get("OUT", "artifacts/gpu")
SHAPES = [tuple(int(v) for v in s.split("x"))
          for s in os.environ.get("NORM_SHAPES", "14336x4096,1024x4096,4096x4096,4096x14336").split(",")]
STAGES = tuple(int(v) for v in os.environ.get("NORM_STAGES", "1").split(","))
if SMOKE:
    SHAPES = [(64, 256)]


def configs(shape: dict) -> list[dict]:
    space = space_for("gemv", "cuda")
    found = []
    for rows, block_k, warps, stages in itertools.product((1, 2, 4, 8), (1024, 2048), (4, 8), STAGES):
        config = {"ROWS_PER_BLOCK": rows, "BLOCK_K": block_k, "SPLIT_K": 1, "num_warps": warps,
                  "USE_DOT": 0, "num_stages": stages, "BALANCE_N": 0}
        if SMOKE:
            config.update(BLOCK_K=64, num_warps=1)
        if (SMOKE or space.allows(config, shape)) and config not in found:
            found.append(config)
    return found[:2] if SMOKE else found


def main() -> None:
    family = get_family("gemv")
    rows_out = []
    groups, replays = (1, 1) if SMOKE else (6, 10)
    for n, k in SHAPES:
        plain = {"m": 1, "n": n, "k": k, "dtype": "bfloat16"}
        forms = (("plain_us", plain), ("norm_us", dict(plain, norm=1)),
                 ("residual_us", dict(plain, residual=1)))
        form_sets = {name: bench.make_input_sets(family, shape, CACHE, DEVICE)
                     for name, shape in forms}
        for config in configs(plain):
            row = {"n": n, "k": k, "config": config}
            for name, shape in forms:
                sets = form_sets[name]
                try:
                    row[name] = bench.time_config(family, shape, config, input_sets=sets,
                                                  cache=CACHE, device=DEVICE, groups=groups,
                                                  replays=replays).median_us
                except Exception as exc:  # noqa: BLE001 - a config that fails is a row
                    row[name] = None
                    row[name.replace("_us", "_error")] = f"{type(exc).__name__}: {str(exc)[:120]}"
            rows_out.append(row)
            c = config
            print(f"n={n} k={k} R{c['ROWS_PER_BLOCK']} BK{c['BLOCK_K']} w{c['num_warps']} "
                  f"s{c['num_stages']}: plain {row['plain_us']} norm {row['norm_us']} "
                  f"residual {row['residual_us']}", flush=True)
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "norm_gemv_bench.json"), "w") as f:
        json.dump(rows_out, f, indent=1)
    print("\n| n | k | best plain µs (config) | best norm µs (config) | norm / plain "
          "| best residual µs (config) | residual / plain |")
    print("|---:|---:|---|---|---:|---|---:|")

    def name(c):
        return f"R{c['ROWS_PER_BLOCK']} BK{c['BLOCK_K']} w{c['num_warps']} s{c['num_stages']}"

    for n, k in SHAPES:
        mine = [r for r in rows_out if r["n"] == n and r["k"] == k and r.get("norm_us")
                and r.get("plain_us") and r.get("residual_us")]
        if not mine:
            continue
        p = min(mine, key=lambda r: r["plain_us"])
        q = min(mine, key=lambda r: r["norm_us"])
        a = min(mine, key=lambda r: r["residual_us"])
        print(f"| {n} | {k} | {p['plain_us']:.2f} ({name(p['config'])}) | {q['norm_us']:.2f} "
              f"({name(q['config'])}) | {q['norm_us'] / p['plain_us']:.3f} | "
              f"{a['residual_us']:.2f} ({name(a['config'])}) | "
              f"{a['residual_us'] / p['plain_us']:.3f} |")


if __name__ == "__main__":
    main()
