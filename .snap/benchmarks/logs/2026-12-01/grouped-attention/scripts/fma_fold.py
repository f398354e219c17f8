"""Session experiment (issue 15, m = 2..8 at the read bandwidth): the folded-accumulator FMA
prototype (scripts/gpu/proto_gemv_fold.py) against torch, the gemv family's default and its
known candidates (kernels.candidates) on the 8B decode linears, cold L2, CUDA-graph replays
(tuner.bench.time_callable, 5 groups x 5 replays), plus each prototype config's error against
fp32 next to torch's. Prints one table; RESULTS-JSON line with every number.
  PYTHONPATH=$PWD python3 scripts/gpu/fma_fold.py   (FOLD_M="2 4 8", FOLD_BUDGET_S=200)
"""
import json
import os
import sys
import time

SMOKE = os.environ.get("FOLD_SMOKE") == "1"  # CPU check of the script (interpreter, tiny shapes)
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import proto_gemv_fold as proto  # noqa: E402

from kernels import gemv  # noqa: E402
from kernels.candidates import candidate_configs  # noqa: E402
from tuner import bench  # noqa: E402
from tuner.spaces import space_for  # noqa: E402

START = time.time()
BUDGET_S = float(os.environ.get("FOLD_BUDGET_S", "200"))
MS = [int(v) for v in os.environ.get("FOLD_M", "2 4 8").split()]
SHAPES = [(4096, 12288), (4096, 14336), (12288, 4096), (14336, 4096), (24576, 4096),
          (28672, 4096), (6144, 4096), (4096, 4096)]
TILES = [(4, 512, 8), (8, 512, 4), (16, 512, 8), (16, 256, 4), (8, 256, 4), (16, 256, 8),
         (32, 256, 8), (16, 128, 2), (32, 512, 8), (8, 256, 2)]
BW = None
RESULTS = []


DEV = "cpu" if SMOKE else "cuda"
if SMOKE:
    SHAPES, TILES = [(64, 256)], [(16, 128, 2)]


def timed(fn, sets):
    if SMOKE:
        return bench.time_callable(fn, sets, cache="warm", groups=1, replays=1,
                                   target_graph_us=1.0, min_calls=1).median_us
    return bench.time_callable(fn, sets, cache="cold", groups=5, replays=5).median_us


def main():
    global BW
    from tuner.device import measure_read_bandwidth
    BW = 1e12 if SMOKE else measure_read_bandwidth()
    bw = float(BW["bytes_per_s"]) if isinstance(BW, dict) else float(BW)
    print(f"read bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    space = space_for("gemv", "cuda")
    for m in MS:
        for n, k in SHAPES:
            if time.time() - START > BUDGET_S:
                print("budget reached", flush=True)
                return bw
            shape = {"m": m, "n": n, "k": k, "dtype": "bfloat16"}
            sets = bench.make_input_sets(gemv.FAMILY, shape, "warm" if SMOKE else "cold", DEV)
            floor_us = (n * k * 2 + m * k * 2 + m * n * 2) / bw * 1e6
            row = {"m": m, "n": n, "k": k, "floor_us": floor_us}
            row["torch"] = timed(lambda i: torch.nn.functional.linear(i["x"], i["weight"]), sets)
            default = gemv.default_config(shape, "cuda")
            row["default"] = timed(lambda i: gemv.launch(i, default), sets)
            best_known, best_cfg = float("inf"), None
            known = space.known(candidate_configs("gemv", shape), shape, default)[:2 if SMOKE else None]
            for cfg in known:
                try:
                    t = timed(lambda i, c=cfg: gemv.launch(i, c), sets)
                except Exception as exc:  # noqa: BLE001 - a failing candidate is a row note
                    print(f"  known {cfg} failed: {exc}", flush=True)
                    continue
                if t < best_known:
                    best_known, best_cfg = t, cfg
            row["known"], row["known_cfg"] = best_known, best_cfg
            ref = sets[0]["x"].float() @ sets[0]["weight"].float().T
            torch_err = (torch.nn.functional.linear(sets[0]["x"], sets[0]["weight"]).float()
                         - ref).abs().max().item()
            row["fold"] = {}
            for r, bk, nw in TILES:
                outs = [torch.empty(m, n, device=DEV, dtype=torch.bfloat16) for _ in sets]
                calls = [proto.plan(s["x"], s["weight"], o, r, bk, nw) for s, o in zip(sets, outs)]
                index = {id(s): j for j, s in enumerate(sets)}
                try:
                    t = timed(lambda i: calls[index[id(i)]].run(), sets)
                    calls[0].run()
                    if not SMOKE:
                        torch.cuda.synchronize()
                    err = (outs[0].float() - ref).abs().max().item()
                except Exception as exc:  # noqa: BLE001
                    print(f"  fold {r},{bk},{nw} failed: {exc}", flush=True)
                    continue
                row["fold"][f"{r},{bk},{nw}"] = {"us": t, "err_ratio": err / max(torch_err, 1e-12)}
            RESULTS.append(row)
            bf = min(row["fold"].items(), key=lambda kv: kv[1]["us"]) if row["fold"] else (None, {"us": float("nan")})
            print(f"m={m} {n}x{k}: torch {row['torch']:.2f} default {row['default']:.2f} known "
                  f"{best_known:.2f} fold {bf[1]['us']:.2f} ({bf[0]}) floor {floor_us:.2f}  "
                  f"[{time.time() - START:.0f}s]", flush=True)
    return bw


if __name__ == "__main__":
    bw = main()
    print("\n  m       n x k  torch  known  fold  fold%bw known%bw  fold/torch  fold/known  fold tile     err")
    for r in RESULTS:
        if not r["fold"]:
            continue
        tile, best = min(r["fold"].items(), key=lambda kv: kv[1]["us"])
        print(f"{r['m']:3d} {r['n']:6d}x{r['k']:<5d} {r['torch']:6.2f} {r['known']:6.2f} {best['us']:6.2f}"
              f"  {100 * r['floor_us'] / best['us']:5.1f}  {100 * r['floor_us'] / r['known']:6.1f}"
              f"     {r['torch'] / best['us']:6.3f}      {r['known'] / best['us']:6.3f}  {tile:12s} {best['err_ratio']:.2f}")
    print("RESULTS-JSON " + json.dumps({"bandwidth": bw, "rows": RESULTS}))
