#!/usr/bin/env bash
# The tiled GEMM at prefill and decode sizes against cuBLAS, and decode attention against SDPA
# (H200: about 7 minutes).
#   PYTHONPATH=$PWD bash scripts/gpu/sweep_gemm_attention.sh        (log: $OUT/kernels.log)
# Rows it produces in BENCHMARKS.md: "GEMM at prefill sizes" and "Decode attention".
#   1. Device: measured read bandwidth (tuner.device.measure_read_bandwidth, 2 GB buffer).
#   2. Decode attention (first: fewer, cheaper cases), bf16, head_dim 128, cold KV: achieved
#      KV-read bandwidth vs the measured read bandwidth at long context (batch 8 / 1, 32q/8kv,
#      32K; batch 8 at 16K); time vs SDPA (default dispatch, paired; and every SDPA backend
#      alone) for 32q/8kv, 32q/32kv, 64q/1kv at batch 1 and 8, kv_len 8K; the best
#      HEADS_PER_BLOCK=1 (no stacking) config vs the best.
#   3. GEMM on Llama-3-8B linears (q/o 4096x4096, kv 1024x4096, gate/up 14336x4096,
#      down 4096x14336; NT layout as F.linear) at m = 4096, 16, 512, 64, 2048, 32, 8:
#      a bounded sweep (candidates filtered by search_spaces/gemm.yaml, with and without TMA),
#      the best paired against torch.matmul (cuBLAS); cold caches (input sets rotated past
#      2 x L2: weights and activations come from HBM, as in a prefill step), TFLOP/s, ratio,
#      rel. error of the best.
# Timing: tuner.bench (CUDA-graph replays, median of group medians, paired interleaved compare).
# Budget KERNELS_BUDGET_S (default 420 s): attention starts no case after 45 %, GEMM no shape
# after 95 %. Never stops on a failing case (each failure is logged). A RESULTS-JSON line holds
# every number; results tables last.
# CPU check of the Python (interpreter, tiny shapes):
#   KERNELS_SMOKE=1 OUT=/tmp/out bash scripts/gpu/sweep_gemm_attention.sh
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0;; esac
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
python3 - 2>&1 <<'PY' | tee "$OUT/kernels.log"
import json
import math
import os
import time
import traceback

SMOKE = os.environ.get("KERNELS_SMOKE") == "1"
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"
BUDGET_S = float(os.environ.get("KERNELS_BUDGET_S", "420"))
START = time.time()

import torch  # noqa: E402
import triton  # noqa: E402

from tuner_kernels import attention, gemm  # noqa: E402
from tuner import bench  # noqa: E402
from tuner.spaces import space_for  # noqa: E402

DEVICE = "cpu" if SMOKE else None
CACHE = "warm" if SMOKE else "cold"
SWEEP = dict(groups=1, replays=1, min_calls=1) if SMOKE else dict(groups=5, replays=5)
PAIRED = dict(groups=2, replays=1, min_calls=1) if SMOKE else dict(groups=10, replays=5)
RESULTS = {"gemm": [], "attention": [], "bandwidth": None}


def elapsed() -> float:
    return time.time() - START


def over_budget(fraction: float) -> bool:
    return elapsed() > BUDGET_S * fraction


def say(*args):
    print(f"[{elapsed():6.1f}s]", *args, flush=True)


def sync():
    if torch.cuda.is_available() and not SMOKE:
        torch.cuda.synchronize()


def free():
    if torch.cuda.is_available() and not SMOKE:
        torch.cuda.empty_cache()


def short(config: dict) -> str:
    keys = {"BLOCK_M": "M", "BLOCK_N": "N", "BLOCK_K": "K", "GROUP_M": "G", "SPLIT_K": "sk",
            "HEADS_PER_BLOCK": "hpb", "SPLIT_KV": "skv", "num_warps": "w", "num_stages": "s", "TMA": "tma"}
    return ",".join(f"{keys.get(k, k)}{v}" for k, v in config.items() if k in keys)


def time_or_reason(family, shape, config, sets, **opts):
    try:
        return bench.time_config(family, shape, config, cache=CACHE, device=DEVICE, input_sets=sets,
                                 **{**SWEEP, **opts})
    except Exception as exc:  # noqa: BLE001 - CandidateFailure and anything else: logged, go on
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"


def rel_err_of(family, config, inputs) -> float:
    out = family.launch(inputs, config).float()
    ref = family.reference(inputs)
    return float((out - ref).norm() / ref.norm())


def sweep(family, shape, candidates, sets):
    """[(config, Timing)] of the candidates that ran, fastest first; failures logged."""
    timed = []
    for config in candidates:
        result = time_or_reason(family, shape, config, sets)
        if isinstance(result, str):
            say(f"   {short(config):44} FAILED {result}")
            continue
        timed.append((config, result))
        say(f"   {short(config):44} {result.median_us:9.2f} us  (spread {result.spread_pct:.1f}%)")
    return sorted(timed, key=lambda item: item[1].median_us)


def unique(configs):
    seen, out = set(), []
    for c in configs:
        key = json.dumps(c, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


# ------------------------------------------------------------------------------------ device
backend = "cuda"
if not SMOKE:
    backend = bench.backend_name()
    props = torch.cuda.get_device_properties(0)
    say(f"device {props.name}  SMs {props.multi_processor_count}  L2 {bench.l2_bytes() / 2**20:.0f} MiB  "
        f"torch {torch.__version__}  triton {triton.__version__}  backend {backend}")
    try:
        from tuner.device import measure_read_bandwidth
        bw = measure_read_bandwidth(2 << 30)
        RESULTS["bandwidth"] = bw["bytes_per_s"]
        say(f"measured read bandwidth {bw['bytes_per_s'] / 1e12:.3f} TB/s "
            f"(triton stream {bw['triton_stream_bytes_per_s'] / 1e12:.3f}, torch sum {bw['torch_sum_bytes_per_s'] / 1e12:.3f}; "
            f"{bw['buffer_bytes'] / 2**30:.1f} GiB)")
    except Exception as exc:  # noqa: BLE001
        say(f"read bandwidth measurement failed: {exc}")
else:
    say("SMOKE: CPU, TRITON_INTERPRET=1, tiny shapes, warm cache; the numbers mean nothing")
    RESULTS["bandwidth"] = 1e9

# --------------------------------------------------------------------------------------- GEMM
LLAMA3_8B = [("q/o", 4096, 4096), ("kv", 1024, 4096), ("gate/up", 14336, 4096), ("down", 4096, 14336)]
# Interleaved large / small m, so that a spent time budget cuts the least informative shapes.
M_ORDER = (4096, 16, 512, 64, 2048, 32, 8)
if SMOKE:
    LLAMA3_8B, M_ORDER = [("tiny", 40, 72)], (300, 17)


def gemm_candidates(shape: dict) -> list[dict]:
    """The default config plus a bounded list, each with and without TMA (cuda), kept by the space."""
    m = shape["m"]
    if m >= 256:
        tiles = [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (256, 128, 64, 8, 3),
                 (128, 128, 64, 8, 4), (128, 128, 64, 4, 4), (64, 256, 64, 4, 4)]
        configs = [{"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "SPLIT_K": 1, "SWAP_AB": 0,
                    "num_warps": w, "num_stages": s, "TMA": tma}
                   for bm, bn, bk, w, s in tiles for tma in (0, 1)]
    else:
        bm = max(16, min(64, 1 << (m - 1).bit_length()))
        configs = [{"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 128, "GROUP_M": 1, "SPLIT_K": sk, "SWAP_AB": 0,
                    "num_warps": 4, "num_stages": 4, "TMA": tma}
                   for bn in (64, 128) for sk in (1, 2, 4, 8) for tma in (0, 1)]
        configs += [{"BLOCK_M": bm, "BLOCK_N": 32, "BLOCK_K": 128, "GROUP_M": 1, "SPLIT_K": sk, "SWAP_AB": 0,
                     "num_warps": 4, "num_stages": 4, "TMA": 0} for sk in (4, 8)]
    space = space_for("gemm", backend)
    configs = [{k: v for k, v in c.items() if k in space.params} for c in configs]  # no TMA on hip
    kept = [c for c in configs if space.allows(c, shape)]
    return unique([gemm.default_config(shape, backend)] + kept)


def run_gemm():
    say("== GEMM (NT, bf16): bounded sweep per shape, best vs torch.matmul, cold caches")
    for m in M_ORDER:
        for name, n, k in LLAMA3_8B:
            if over_budget(0.95):
                say(f"GEMM: time budget spent; skipping m={m} {name}")
                continue
            shape = {"m": m, "n": n, "k": k, "dtype": "bfloat16", "layout": "NT"}
            say(f"-- gemm {name} {gemm.shape_key(shape)}")
            try:
                sets = bench.make_input_sets(gemm.FAMILY, shape, CACHE, DEVICE)
                base = time_or_reason(gemm.FAMILY, shape, "baseline", sets)
                if isinstance(base, str):
                    say(f"   baseline FAILED {base}")
                    continue
                say(f"   torch.matmul {base.median_us:9.2f} us   ({len(sets)} input sets, "
                    f"{sum(bench._tensor_bytes(s) for s in sets) / 2**20:.0f} MiB rotated)")
                ranked = sweep(gemm.FAMILY, shape, gemm_candidates(shape), sets)
                if not ranked:
                    continue
                best, best_t = ranked[0]
                paired = bench.compare(gemm.FAMILY, shape, best, "baseline", cache=CACHE, device=DEVICE,
                                       input_sets=sets, **PAIRED)
                err = rel_err_of(gemm.FAMILY, best, sets[0])
                flops = gemm.flops(shape)
                row = {"weight": name, "m": m, "n": n, "k": k, "best": short(best),
                       "ours_us": paired.candidate_us, "torch_us": paired.reference_us,
                       "ours_tflops": flops / paired.candidate_us / 1e6,
                       "ours_tbps": gemm.bytes_moved(shape) / paired.candidate_us / 1e6,
                       "torch_tflops": flops / paired.reference_us / 1e6,
                       "speedup": paired.speedup, "low": paired.speedup_low, "high": paired.speedup_high,
                       "noise_pct": paired.noise_pct, "rel_err": err,
                       "default_us": next((t.median_us for c, t in ranked
                                           if c == gemm.default_config(shape, backend)), None)}
                RESULTS["gemm"].append(row)
                say(f"   best {short(best)}: ours {row['ours_us']:.2f} us ({row['ours_tflops']:.0f} TFLOP/s) "
                    f"vs torch {row['torch_us']:.2f} us ({row['torch_tflops']:.0f} TFLOP/s): "
                    f"speedup {row['speedup']:.3f} [{row['low']:.3f}, {row['high']:.3f}], rel err {err:.1e}")
                del sets
            except Exception:  # noqa: BLE001
                say("   FAILED\n" + traceback.format_exc(limit=3))
            free()


# ---------------------------------------------------------------------------------- attention
def attention_candidates(shape: dict) -> list[dict]:
    group = shape["heads"] // shape["kv_heads"]
    stacked = max(d for d in range(1, min(group, 64) + 1) if group % d == 0)
    configs = []
    for hpb in sorted({1, stacked}):
        programs = shape["batch"] * shape["heads"] // hpb
        s0 = 1
        while programs * s0 < 264 and s0 < 64:  # ~2 programs per SM on a 132-SM H200
            s0 *= 2
        for split in sorted({max(1, s0 // 2), s0, min(64, s0 * 2)}):
            for block_n in (64, 128):
                for stages in (2, 3):
                    configs.append({"HEADS_PER_BLOCK": hpb, "BLOCK_N": block_n, "SPLIT_KV": split,
                                    "num_warps": 4, "num_stages": stages})
    if SMOKE:
        configs = [{"HEADS_PER_BLOCK": hpb, "BLOCK_N": 16, "SPLIT_KV": s, "num_warps": 4, "num_stages": 2}
                   for hpb in sorted({1, stacked}) for s in (1, 2)]
    space = space_for("attention", backend)
    kept = [c for c in configs if space.allows(c, shape)]
    return unique([attention.default_config(shape, backend)] + kept)


def sdpa_backends(sets):
    """{backend name: Timing or failure reason} for every SDPA backend forced alone."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    results = {}
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        which = getattr(SDPBackend, name, None)
        if which is None:
            continue

        def fn(inputs, which=which):
            with sdpa_kernel(which):
                return attention.baseline(inputs)

        try:
            results[name] = bench.time_callable(fn, sets, cache=CACHE, **SWEEP)
        except Exception as exc:  # noqa: BLE001
            results[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
    return results


def run_attention_case(shape: dict, tag: str):
    say(f"-- attention [{tag}] {attention.shape_key(shape)}  (KV {attention.kv_bytes(shape) / 2**20:.0f} MiB)")
    sets = bench.make_input_sets(attention.FAMILY, shape, CACHE, DEVICE)
    ranked = sweep(attention.FAMILY, shape, attention_candidates(shape), sets)
    if not ranked:
        return
    best, best_t = ranked[0]
    unstacked = [(c, t) for c, t in ranked if c["HEADS_PER_BLOCK"] == 1]
    paired = bench.compare(attention.FAMILY, shape, best, "baseline", cache=CACHE, device=DEVICE,
                           input_sets=sets, **PAIRED)
    backends = sdpa_backends(sets)
    for name, result in backends.items():
        say(f"   SDPA {name:20} " + (f"{result.median_us:9.2f} us" if not isinstance(result, str) else f"FAILED {result}"))
    ok = {n: r for n, r in backends.items() if not isinstance(r, str)}
    sdpa_best = min(ok.items(), key=lambda item: item[1].median_us) if ok else None
    bw = RESULTS["bandwidth"] or float("nan")
    kv = attention.kv_bytes(shape)
    row = {"tag": tag, "shape": attention.shape_key(shape), "best": short(best),
           "ours_us": paired.candidate_us, "sdpa_us": paired.reference_us, "speedup": paired.speedup,
           "low": paired.speedup_low, "high": paired.speedup_high,
           "sdpa_best_backend": sdpa_best[0] if sdpa_best else None,
           "sdpa_best_us": sdpa_best[1].median_us if sdpa_best else None,
           "kv_tbps": kv / paired.candidate_us / 1e6, "kv_pct_of_read_bw": 100 * kv / (paired.candidate_us * 1e-6) / bw,
           "sdpa_kv_tbps": kv / paired.reference_us / 1e6,
           "hpb1_us": unstacked[0][1].median_us if unstacked else None,
           "hpb1_best": short(unstacked[0][0]) if unstacked else None,
           "rel_err": rel_err_of(attention.FAMILY, best, sets[0])}
    row["stacking_gain"] = row["hpb1_us"] / best_t.median_us if row["hpb1_us"] else None
    RESULTS["attention"].append(row)
    say(f"   best {row['best']}: {row['ours_us']:.2f} us, KV read {row['kv_tbps']:.2f} TB/s "
        f"({row['kv_pct_of_read_bw']:.0f}% of measured read bandwidth); SDPA (default) {row['sdpa_us']:.2f} us "
        f"({row['sdpa_kv_tbps']:.2f} TB/s): speedup {row['speedup']:.2f} [{row['low']:.2f}, {row['high']:.2f}]; "
        f"HEADS_PER_BLOCK=1 best {row['hpb1_us'] or float('nan'):.2f} us; rel err {row['rel_err']:.1e}")
    del sets
    free()


def run_attention():
    say("== decode attention (bf16, head_dim 128), cold KV")
    if SMOKE:
        cases = [({"batch": 2, "heads": 8, "kv_heads": 2, "kv_len": 70, "head_dim": 64, "dtype": "bfloat16"}, "gqa")]
    else:
        long = [(8, 32, 8, 32768), (1, 32, 8, 32768), (8, 32, 8, 16384)]
        gqa = [(1, 32, 8), (8, 32, 8), (1, 32, 32), (8, 32, 32), (1, 64, 1), (8, 64, 1)]
        cases = [({"batch": b, "heads": h, "kv_heads": kv, "kv_len": n, "head_dim": 128, "dtype": "bfloat16"},
                  "long") for b, h, kv, n in long]
        cases += [({"batch": b, "heads": h, "kv_heads": kv, "kv_len": 8192, "head_dim": 128, "dtype": "bfloat16"},
                   f"{h}q/{kv}kv") for b, h, kv in gqa]
    for shape, tag in cases:
        if over_budget(0.45):
            say(f"attention: time budget for this section spent; skipping {attention.shape_key(shape)}")
            continue
        try:
            run_attention_case(shape, tag)
        except Exception:  # noqa: BLE001
            say("   FAILED\n" + traceback.format_exc(limit=3))
            free()


# Attention first: fewer, cheaper cases; GEMM then takes the rest of the budget.
run_attention()
run_gemm()

# ------------------------------------------------------------------------------------ summary
print("\nRESULTS-JSON " + json.dumps(RESULTS))
print(f"\n== GEMM (Llama-3-8B linears, NT, bf16, cold): best of a bounded sweep vs torch.matmul  [{elapsed():.0f}s]")
print(f"{'weight':8} {'m':>5} {'n':>6} {'k':>6}  {'ours us':>9} {'torch us':>9} {'ours TF/s':>9} {'torch TF/s':>10} {'ours TB/s':>9}  {'speedup [95% CI]':>22}  best config")
for r in sorted(RESULTS["gemm"], key=lambda r: (r["m"], r["n"], r["k"])):
    print(f"{r['weight']:8} {r['m']:5} {r['n']:6} {r['k']:6}  {r['ours_us']:9.2f} {r['torch_us']:9.2f} "
          f"{r['ours_tflops']:9.0f} {r['torch_tflops']:10.0f} {r['ours_tbps']:9.2f}  {r['speedup']:6.3f} [{r['low']:.3f}, {r['high']:.3f}]  {r['best']}")
bw = RESULTS["bandwidth"]
print(f"\n== decode attention (bf16, d=128, cold KV); measured read bandwidth {bw / 1e12 if bw else float('nan'):.2f} TB/s")
print(f"{'case':9} {'shape':52} {'ours us':>8} {'KV TB/s':>7} {'%bw':>4} {'SDPA us':>8} {'vs SDPA':>7} {'best SDPA backend':>26} {'hpb=1 us':>8} {'stack gain':>10}  best config")
for r in RESULTS["attention"]:
    sb = f"{r['sdpa_best_backend']} {r['sdpa_best_us']:.1f}" if r["sdpa_best_backend"] else "-"
    print(f"{r['tag']:9} {r['shape']:52} {r['ours_us']:8.2f} {r['kv_tbps']:7.2f} {r['kv_pct_of_read_bw']:4.0f} "
          f"{r['sdpa_us']:8.2f} {r['speedup']:7.2f} {sb:>26} {r['hpb1_us'] or float('nan'):8.2f} "
          f"{r['stacking_gain'] or float('nan'):10.2f}  {r['best']}")
PY
