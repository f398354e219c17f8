#!/usr/bin/env bash
# Decode linears against torch and against their read ceiling, m = 1..256 (H200: under 7 minutes).
#   PYTHONPATH=$PWD bash scripts/gpu/sweep_linears.sh        (log: $OUT/sweep_linears.log)
# Rows it produces in BENCHMARKS.md: "Decode linears" (per case: torch and best µs, TB/s, % of the
# read ceiling, speedup with its 95% interval, parity) and "Per model: the decode step's linears".
#
# For the Qwen3-8B and Llama-3.1-8B decode linears (split and merged: q/o 4096x4096, kv
# 1024x4096, qkv 6144x4096, gate/up 12288|14336x4096, gate_up 24576|28672x4096, down
# 4096x12288|14336; NT bf16, n x k = weight [out, in]) and the Gemma-3-27B-shaped ones, at
# m = 1, 4, 8 (gemv family) and 16, 32, 64, 128, 256 (gemm family):
#   0. device, measured read bandwidth (tuner.device.measure_read_bandwidth, 2 GiB; again at
#      the end), A/A noise of the protocol on two shapes;
#   1. compiles every candidate of every case first, in a thread pool (tuner.precompile:
#      JITFunction.warmup on meta tensors, the launches then hit the in-memory cache; compiles
#      not started within SWEEP_PRECOMPILE_S, default 150 s, happen at first launch);
#   2. per case: torch (F.linear's cuBLAS path: the family baseline), the family default and the
#      known candidate lists (tuner_kernels/candidates.py) per variant (gemv: FMA, FMA with a register
#      double buffer (num_stages 2, "fma-pref"), FMA pipelined by cp.async (3-4, "fma-pipe"),
#      USE_DOT 1 tl.dot ("dot"), USE_DOT 2 swap-AB wgmma/TMA kernel ("skinny"); gemm:
#      the tiled kernel with / without TMA, SWAP_AB 1 skinny kernel with / without TMA; split-K
#      where the weight rows alone give too few programs), all filtered by the cuda search space;
#      parity facts of every candidate on fresh random inputs (tuner.parity.Checker: bitwise vs
#      torch, the default's class, error vs fp32 over torch's); sweep timing (tuner.bench, CUDA
#      graph replays, cold L2, 5x5); the best (accuracy gate) and the default then paired against
#      torch (tuner.bench.compare, 10 groups, 95% interval); a graph-safety check of the best
#      (captured, inputs overwritten in place, replayed: must equal an eager run on the new data).
#   0b. the read ceiling of every weight (tuner.ceilings: the fastest read-only kernel on the same
#      bytes, cold, graph replays): what one kernel can reach at that size, beside the 2 GiB
#      stream's bandwidth;
#   3. tables last: per case (TB/s, % of measured bandwidth and of the read ceiling, speedup [95% CI], parity, winner),
#      the best time of each variant per case (which variant wins), and per model the decode step
#      of its linears (sum over layers) against bytes / bandwidth and torch.
# SWEEP_SET=8b (default) | 27b (Gemma-3-27B-shaped linears, 5376 hidden) | all picks the shapes;
# SWEEP_M="128,256" (default: all eight) picks the batch sizes.
# Budget SWEEP_BUDGET_S (default 390 s): no case starts after it; cases are ordered so a cut
# drops the least informative last. A RESULTS-JSON line holds every number
# (scripts/kernel_ceilings.py reads it). SWEEP_PLAN_ONLY=1 prints the candidates of each case.
# CPU check of the Python (interpreter, tiny shapes, numbers meaningless):
#   SWEEP_SMOKE=1 OUT=/tmp/sweep bash scripts/gpu/sweep_linears.sh
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0;; esac
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv 2>/dev/null || true
  git log -1 --format='commit %H %s' 2>/dev/null || true
  git status --short -- kernels search_spaces scripts/gpu/sweep_linears.sh 2>/dev/null | head -20
} 2>&1 | tee "$OUT/sweep_linears.log"
python3 - 2>&1 <<'PY' | tee -a "$OUT/sweep_linears.log"
import json
import os
import time
import traceback

SMOKE = os.environ.get("SWEEP_SMOKE") == "1"
PLAN_ONLY = os.environ.get("SWEEP_PLAN_ONLY") == "1"  # print the candidates per case, exit
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"
BUDGET_S = float(os.environ.get("SWEEP_BUDGET_S", "390"))
PRECOMPILE_S = float(os.environ.get("SWEEP_PRECOMPILE_S", "150"))  # then compile lazily
START = time.time()

import torch  # noqa: E402
import triton  # noqa: E402

from tuner_kernels import gemm, gemv  # noqa: E402
from tuner_kernels.candidates import candidate_configs  # noqa: E402
from tuner import bench, parity  # noqa: E402
from tuner.spaces import space_for  # noqa: E402

DEVICE = "cpu" if SMOKE else None
CACHE = "warm" if SMOKE else "cold"
TINY = dict(target_graph_us=1.0, min_calls=1) if SMOKE else {}
SWEEP = dict(groups=1, replays=1, **TINY) if SMOKE else dict(groups=5, replays=5)
PAIRED = dict(groups=2, replays=1, **TINY) if SMOKE else dict(groups=10, replays=5)
SEEDS = 1 if SMOKE else 3
GATE, MARGIN = "accuracy", parity.DEFAULT_MARGIN
RESULTS = {"cases": [], "bandwidth": None, "bandwidth_end": None, "aa": [], "compile": {}}


def elapsed() -> float:
    return time.time() - START


def say(*args):
    print(f"[{elapsed():6.1f}s]", *args, flush=True)


def sync():
    if torch.cuda.is_available() and not SMOKE:
        torch.cuda.synchronize()


def free():
    if torch.cuda.is_available() and not SMOKE:
        torch.cuda.empty_cache()


def reason(exc) -> str:
    text = getattr(exc, "reason", None) or str(exc)
    return f"{type(exc).__name__}: {text.strip().splitlines()[0][:200] if text.strip() else ''}"


# ------------------------------------------------------------------------------------- shapes
MODELS = {  # name: (layers, [(linear, n, k, calls per layer)] split, merged)
    "Qwen3-8B": (36, [("q", 4096, 4096, 1), ("k", 1024, 4096, 1), ("v", 1024, 4096, 1),
                      ("o", 4096, 4096, 1), ("gate", 12288, 4096, 1), ("up", 12288, 4096, 1),
                      ("down", 4096, 12288, 1)],
                 [("qkv", 6144, 4096, 1), ("o", 4096, 4096, 1), ("gate_up", 24576, 4096, 1),
                  ("down", 4096, 12288, 1)]),
    "Llama-3.1-8B": (32, [("q", 4096, 4096, 1), ("k", 1024, 4096, 1), ("v", 1024, 4096, 1),
                          ("o", 4096, 4096, 1), ("gate", 14336, 4096, 1), ("up", 14336, 4096, 1),
                          ("down", 4096, 14336, 1)],
                     [("qkv", 6144, 4096, 1), ("o", 4096, 4096, 1), ("gate_up", 28672, 4096, 1),
                      ("down", 4096, 14336, 1)]),
}
NK = [(4096, 4096, "q/o"), (1024, 4096, "kv"), (6144, 4096, "qkv"), (12288, 4096, "Qgate/up"),
      (14336, 4096, "Lgate/up"), (4096, 12288, "Qdown"), (4096, 14336, "Ldown"),
      (24576, 4096, "Qgate_up"), (28672, 4096, "Lgate_up")]
MODELS_27B = {  # Gemma-3-27B-shaped: hidden 5376, ffn 21504, 32 q / 16 kv heads of 128, 62 layers
    "Gemma-3-27B": (62, [("q", 4096, 5376, 1), ("k", 2048, 5376, 1), ("v", 2048, 5376, 1),
                         ("o", 5376, 4096, 1), ("gate", 21504, 5376, 1), ("up", 21504, 5376, 1),
                         ("down", 5376, 21504, 1)],
                    [("qkv", 8192, 5376, 1), ("o", 5376, 4096, 1), ("gate_up", 43008, 5376, 1),
                     ("down", 5376, 21504, 1)]),
}
NK_27B = [(4096, 5376, "Gq"), (2048, 5376, "Gkv"), (5376, 4096, "Go"), (8192, 5376, "Gqkv"),
          (21504, 5376, "Ggate/up"), (5376, 21504, "Gdown"), (43008, 5376, "Ggate_up")]
SHAPE_SET = os.environ.get("SWEEP_SET", "8b")  # 8b (default), 27b, or all
if SHAPE_SET not in ("8b", "27b", "all"):
    raise SystemExit(f"SWEEP_SET must be 8b, 27b or all, not {SHAPE_SET!r}")
if SHAPE_SET == "27b":
    MODELS, NK = MODELS_27B, NK_27B
elif SHAPE_SET == "all":
    MODELS, NK = {**MODELS, **MODELS_27B}, NK + NK_27B
M_ORDER = (1, 32, 4, 128, 16, 8, 64, 256)  # interleaved: a spent budget cuts the m=256 cases last
if os.environ.get("SWEEP_M"):
    try:
        M_ORDER = tuple(dict.fromkeys(int(v) for v in os.environ["SWEEP_M"].split(",")))
    except ValueError:
        M_ORDER = ()
    if not M_ORDER or min(M_ORDER) < 1:
        raise SystemExit("SWEEP_M must be comma-separated batch sizes >= 1, not "
                         f"{os.environ['SWEEP_M']!r}")
if SMOKE:
    NK, M_ORDER = [(72, 96, "tiny"), (40, 104, "tiny2")], (1, 3, 17)
    MODELS = {"tiny": (2, [("a", 72, 96, 1)], [("a", 72, 96, 1), ("b", 40, 104, 1)])}


def family_for(m: int):
    return gemv.FAMILY if m <= gemv.MAX_M else gemm.FAMILY


def shape_for(m: int, n: int, k: int) -> dict:
    if m <= gemv.MAX_M:
        return {"m": m, "n": n, "k": k, "dtype": "bfloat16"}
    return {"m": m, "n": n, "k": k, "dtype": "bfloat16", "layout": "NT"}


SMS = 132 if SMOKE or PLAN_ONLY else torch.cuda.get_device_properties(0).multi_processor_count


def variant(family, config: dict) -> str:
    if family is gemv.FAMILY:
        dot = int(config.get("USE_DOT", 0))
        if dot == 0:
            return {1: "fma", 2: "fma-pref"}.get(int(config.get("num_stages", 1)), "fma-pipe")
        return "dot" if dot == 1 else ("skinny-bal" if int(config.get("BALANCE_N", 0)) else "skinny")
    name = "skinny" if int(config.get("SWAP_AB", 0)) else "tiled"
    return (name + ("-tma" if int(config.get("TMA", 0)) else "")
            + ("-bal" if int(config.get("BALANCE_N", 0)) else ""))


def short(config: dict) -> str:
    keys = {"ROWS_PER_BLOCK": "R", "BLOCK_M": "M", "BLOCK_N": "N", "BLOCK_K": "K", "SPLIT_K": "sk",
            "GROUP_M": "g", "num_warps": "w", "num_stages": "s", "USE_DOT": "dot", "TMA": "tma",
            "SWAP_AB": "swap", "BALANCE_N": "bal"}
    skip = {"GROUP_M": 1, "SPLIT_K": 1, "USE_DOT": 0, "TMA": 0, "SWAP_AB": 0, "BALANCE_N": 0}
    return ",".join(f"{keys[k]}{v}" for k, v in config.items() if k in keys and skip.get(k) != v)


def candidates(family, shape: dict) -> list[dict]:
    """The default, then the family's known configs (tuner_kernels/candidates.py: the lists a search
    queues first) that the cuda space allows."""
    space = space_for(family.name, "cuda")
    default = family.default_config(shape, "cuda", sm_count=SMS)
    return [default] + space.known(candidate_configs(family.name, shape, "cuda", SMS), shape,
                                   default)


CASES = [(m, n, k, tag) for m in M_ORDER for n, k, tag in NK]
if PLAN_ONLY:
    total = 0
    for m, n, k, tag in CASES:
        fam = family_for(m)
        configs = candidates(fam, shape_for(m, n, k))
        total += len(configs)
        print(f"m={m} {n}x{k} {fam.name}: {len(configs)}: " + "  ".join(
            f"{variant(fam, c)}:{short(c)}" for c in configs))
    print(f"{len(CASES)} cases, {total} candidates")
    raise SystemExit(0)


# ------------------------------------------------------------------------------------ device
def read_bandwidth() -> float | None:
    if SMOKE:
        return 1e9
    try:
        from tuner.device import measure_read_bandwidth

        bw = measure_read_bandwidth(2 << 30)
        say(f"measured read bandwidth {bw['bytes_per_s'] / 1e12:.3f} TB/s (triton stream "
            f"{bw['triton_stream_bytes_per_s'] / 1e12:.3f}, torch sum {bw['torch_sum_bytes_per_s'] / 1e12:.3f}; "
            f"{bw['buffer_bytes'] / 2**30:.1f} GiB)")
        return bw["bytes_per_s"]
    except Exception as exc:  # noqa: BLE001
        say(f"read bandwidth measurement failed: {reason(exc)}")
        return None


if not SMOKE:
    props = torch.cuda.get_device_properties(0)
    say(f"device {props.name}  SMs {props.multi_processor_count}  L2 {bench.l2_bytes() / 2**20:.0f} MiB  "
        f"torch {torch.__version__}  triton {triton.__version__}  backend {bench.backend_name()}")
    if bench.backend_name() != "cuda":
        say("this script is for an NVIDIA sm90 GPU (its candidates are the cuda space's)")
else:
    say("SMOKE: CPU, TRITON_INTERPRET=1, tiny shapes, warm cache; the numbers mean nothing")
RESULTS["bandwidth"] = read_bandwidth()
BW = RESULTS["bandwidth"] or float("nan")


def read_ceilings() -> dict:
    """{weight bytes: µs}: the read curve (tuner.ceilings: the fastest of a few read-only kernels,
    cold, graph replays) at the byte count of every weight of the cases: the most one kernel
    reading that weight can do here, now (the bandwidth above is a stream over 2 GiB)."""
    if SMOKE:
        return {}
    from tuner import ceilings

    sizes = sorted({n * k * 2 for n, k, _ in NK})
    try:
        points = ceilings.measure_read_curve(sizes)["points"]
    except Exception as exc:  # noqa: BLE001
        say(f"read curve failed: {reason(exc)}")
        return {}
    RESULTS["read_curve"] = points
    global BW
    chosen, source = ceilings.choose_bandwidth(BW, points)  # tuner device's rule
    if source == "read curve slope":
        say(f"read bandwidth from the read curve's slope: {chosen / 1e12:.3f} TB/s (the event-timed "
            f"stream read {BW / 1e12:.3f})")
    BW = RESULTS["bandwidth"] = chosen
    say("read curve (fastest reader a size): " + ", ".join(
        f"{p['bytes'] / 2**20:.0f} MiB {p['us']:.2f} us ({100 * p['bytes'] / (p['us'] * 1e-6) / BW:.0f}%)"
        for p in points))
    return {size: p["us"] for size, p in zip(sizes, points) if p["us"] == p["us"]}


CEILINGS = read_ceilings()


def ceiling_us(n: int, k: int, nbytes: int) -> float:
    """The read ceiling of a case: its weight's measured read time, plus its other bytes
    (activations, output) at the measured bandwidth; NaN where the curve has no such weight."""
    weight = n * k * 2
    if weight not in CEILINGS:
        return float("nan")
    return CEILINGS[weight] + (nbytes - weight) / BW * 1e6


# ----------------------------------------------------------------------- compile everything
def precompile(jobs) -> dict:
    """{(family, shape_key, config_json): failure reason} after compiling every kernel of every
    job in a thread pool (tuner.precompile: the search workers' compile-ahead, blocking here;
    compiles not started within SWEEP_PRECOMPILE_S happen at first launch)."""
    if SMOKE:
        return {}
    from tuner.precompile import precompile as compile_all

    threads = max(2, min(14, (os.cpu_count() or 4) - 2))
    report = compile_all(jobs, "cuda", threads=threads, deadline=time.time() + PRECOMPILE_S)
    failures = {(jobs[i][0].name, jobs[i][0].shape_key(jobs[i][1]),
                 json.dumps(jobs[i][2], sort_keys=True)): why for i, why in report.failures.items()}
    RESULTS["compile"] = {"jobs": len(jobs), "kernel_warmups": report.compiled, "workers": threads,
                          "seconds": round(report.seconds, 1), "failures": len(failures),
                          "skipped": report.skipped}
    say(f"precompiled {report.compiled} kernel launches of {len(jobs)} (shape, config) jobs with "
        f"{threads} threads in {report.seconds:.1f} s; {len(failures)} jobs failed to plan/compile, "
        f"{report.skipped} not started by the deadline")
    for key, why in list(failures.items())[:10]:
        say(f"   compile failure {key}: {why}")
    return failures


JOBS = []
PLAN = {}
for m, n, k, tag in CASES:
    fam = family_for(m)
    shape = shape_for(m, n, k)
    PLAN[(m, n, k)] = candidates(fam, shape)
    JOBS += [(fam, shape, c) for c in PLAN[(m, n, k)]]
say(f"{len(CASES)} cases, {len(JOBS)} (shape, config) candidates in all "
    f"({min(len(v) for v in PLAN.values())}-{max(len(v) for v in PLAN.values())} a case, default included)")
COMPILE_FAILURES = precompile(JOBS)


# ------------------------------------------------------------------------------------- A/A
def aa(m, n, k):
    fam, shape = family_for(m), shape_for(m, n, k)
    try:
        p = bench.aa_noise(fam, shape, "baseline", cache=CACHE, device=DEVICE, **PAIRED)
        row = {"shape": fam.shape_key(shape), "ratio": p.speedup, "low": p.speedup_low,
               "high": p.speedup_high, "spread_pct": p.noise_pct}
        RESULTS["aa"].append(row)
        say(f"A/A torch {row['shape']}: {p.speedup:.4f} [{p.speedup_low:.4f}, {p.speedup_high:.4f}], "
            f"group spread ±{p.noise_pct:.2f}%")
    except Exception as exc:  # noqa: BLE001
        say(f"A/A {m}x{n}x{k} failed: {reason(exc)}")


aa(1, 4096, 4096) if not SMOKE else aa(1, 72, 96)
aa(32, 14336, 4096) if not SMOKE else aa(17, 72, 96)


# -------------------------------------------------------------------------------- the cases
def graph_safe(family, shape, config) -> str:
    """'ok' when a CUDA graph of one launch, replayed after the inputs were overwritten in place
    with new random values, gives the bytes of an eager launch on those values."""
    if SMOKE:
        return "n/a (cpu)"
    try:
        first = family.make_inputs(shape, torch.device("cuda"), 77)
        second = family.make_inputs(shape, torch.device("cuda"), 78)
        out = family.launch(first, config)  # compiled and warm before the capture
        sync()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            family.launch(first, config, out=out)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            family.launch(first, config, out=out)
        for name, tensor in first.items():
            tensor.copy_(second[name])
        out.fill_(float("nan"))
        graph.replay()
        sync()
        eager = family.launch(second, config)
        sync()
        same = parity.output_hash(out) == parity.output_hash(eager)
        return "ok" if same else "STALE"
    except Exception as exc:  # noqa: BLE001
        return f"failed: {reason(exc)[:80]}"


def run_case(m, n, k, tag):
    fam, shape = family_for(m), shape_for(m, n, k)
    key = fam.shape_key(shape)
    configs = PLAN[(m, n, k)]
    default = configs[0]
    say(f"-- {fam.name} {tag} {key}: {len(configs)} configs "
        f"({fam.bytes_moved(shape) / 1e6:.1f} MB, floor {fam.bytes_moved(shape) / BW * 1e6:.2f} us at the measured bandwidth)")
    sets = bench.make_input_sets(fam, shape, CACHE, DEVICE)
    checker = parity.Checker(fam, shape, device=DEVICE, seeds=SEEDS)
    base_t = bench.time_config(fam, shape, "baseline", cache=CACHE, device=DEVICE, input_sets=sets, **SWEEP)
    say(f"   torch {base_t.median_us:9.2f} us ({len(sets)} input sets, "
        f"{sum(bench._tensor_bytes(s) for s in sets) / 2**20:.0f} MiB rotated)")
    rows = []
    for config in configs:
        if config is not default and elapsed() > BUDGET_S + 15:  # lazily compiling, say
            say(f"   time budget spent: {len(configs) - len(rows)} configs of this case not run")
            break
        label = "default" if config is default else variant(fam, config)
        ckey = (fam.name, key, json.dumps(config, sort_keys=True))
        row = {"config": config, "variant": variant(fam, config), "label": label}
        if ckey in COMPILE_FAILURES:  # planning failed before any compile: still try it
            say(f"   (precompile of {short(config)} failed: {COMPILE_FAILURES[ckey]})")
        try:
            facts = checker.facts(config)
            t = bench.time_config(fam, shape, config, cache=CACHE, device=DEVICE, input_sets=sets, **SWEEP)
            row.update(us=t.median_us, spread=t.spread_pct, facts=facts.to_attrs(),
                       passes=facts.passes(GATE, MARGIN))
            say(f"   {label:9} {short(config):40} {t.median_us:9.2f} us  x{base_t.median_us / t.median_us:5.3f}  "
                f"{'=torch' if facts.bitwise_vs_baseline else ('=dflt' if facts.bitwise_vs_default else 'other')} "
                f"err x{facts.error_ratio:.2f}{'' if row['passes'] else '  FAILS ' + GATE}")
        except Exception as exc:  # noqa: BLE001 - a failing candidate is data
            row.update(us=None, failure=reason(exc))
            say(f"   {label:9} {short(config):40} FAILED {row['failure']}")
        rows.append(row)
    ok = [r for r in rows if r.get("us") is not None and r.get("passes")]
    case = {"m": m, "n": n, "k": k, "tag": tag, "family": fam.name, "shape": key,
            "bytes": fam.bytes_moved(shape), "torch_sweep_us": base_t.median_us, "rows": rows}
    if not ok:
        say("   no candidate ran and passed parity")
        RESULTS["cases"].append(case)
        return
    best = min(ok, key=lambda r: r["us"])
    by_variant = {}
    for r in ok:
        if r["variant"] not in by_variant or r["us"] < by_variant[r["variant"]]["us"]:
            by_variant[r["variant"]] = r
    case["by_variant"] = {v: {"us": r["us"], "config": r["config"]} for v, r in by_variant.items()}
    paired_best = bench.compare(fam, shape, best["config"], "baseline", cache=CACHE, device=DEVICE,
                                input_sets=sets, **PAIRED)
    drow = rows[0]
    paired_default = None
    if drow.get("us") is not None:
        paired_default = paired_best if best is drow else bench.compare(
            fam, shape, default, "baseline", cache=CACHE, device=DEVICE, input_sets=sets, **PAIRED)
    case.update(best=best["config"], best_variant=best["variant"], best_facts=best["facts"],
                torch_us=paired_best.reference_us, best_us=paired_best.candidate_us,
                speedup=paired_best.speedup, low=paired_best.speedup_low, high=paired_best.speedup_high,
                noise_pct=paired_best.noise_pct, graph=graph_safe(fam, shape, best["config"]))
    if paired_default is not None:
        case.update(default_us=paired_default.candidate_us, default_speedup=paired_default.speedup,
                    default_low=paired_default.speedup_low, default_high=paired_default.speedup_high)
    case["best_tbps"] = case["bytes"] / case["best_us"] / 1e6
    case["torch_tbps"] = case["bytes"] / case["torch_us"] / 1e6
    case["best_pct_bw"] = 100 * case["bytes"] / (case["best_us"] * 1e-6) / BW
    case["ceiling_us"] = ceiling_us(n, k, case["bytes"])
    case["best_pct_ceiling"] = 100 * case["ceiling_us"] / case["best_us"]
    f = best["facts"]
    say(f"   BEST {best['variant']} {short(best['config'])}: {case['best_us']:.2f} us vs torch {case['torch_us']:.2f} "
        f"({case['best_tbps']:.2f} TB/s, {case['best_pct_bw']:.0f}% of bw, {case['best_pct_ceiling']:.0f}% "
        f"of the read ceiling {case['ceiling_us']:.2f} us): x{case['speedup']:.3f} "
        f"[{case['low']:.3f}, {case['high']:.3f}]; default x{case.get('default_speedup', float('nan')):.3f}; "
        f"bitwise=torch {f['bitwise_vs_baseline']}, =default {f['bitwise_vs_default']}, "
        f"err {f['error_vs_reference']:.2e} (torch {f['baseline_error_vs_reference']:.2e}); graph {case['graph']}")
    RESULTS["cases"].append(case)


for m, n, k, tag in CASES:
    if elapsed() > BUDGET_S:
        say(f"time budget spent: skipping m={m} {n}x{k}")
        continue
    try:
        run_case(m, n, k, tag)
    except Exception:  # noqa: BLE001
        say(f"   case m={m} {n}x{k} FAILED\n" + traceback.format_exc(limit=4))
    free()

RESULTS["bandwidth_end"] = read_bandwidth()

# ------------------------------------------------------------------------------------ tables
print("\nRESULTS-JSON " + json.dumps(RESULTS, default=str))
done = {(c["m"], c["n"], c["k"]): c for c in RESULTS["cases"] if "best_us" in c}
variants = ["fma", "fma-pref", "fma-pipe", "dot", "skinny", "skinny-bal", "tiled", "tiled-tma",
            "skinny-tma", "skinny-tma-bal"]
print(f"\n== which variant wins: best sweep us of each variant per case (gemv m<=8, gemm m>=16)  [{elapsed():.0f}s]")
print(f"{'m':>3} {'n x k':>11} {'torch':>7} " + " ".join(f"{v:>10}" for v in variants))
for (m, n, k), c in sorted(done.items()):
    cells = [f"{c['by_variant'][v]['us']:10.2f}" if v in c["by_variant"] else f"{'-':>10}" for v in variants]
    print(f"{m:3} {f'{n}x{k}':>11} {c['torch_sweep_us']:7.2f} " + " ".join(cells))

print(f"\n== per case (paired vs torch, cold L2, bf16; measured read bw {BW / 1e12:.3f} TB/s (tuner device's rule), "
      f"the event-timed stream at the end "
      f"{(RESULTS['bandwidth_end'] or float('nan')) / 1e12:.3f}); parity: T = bitwise torch, D = default's class, "
      f"e = error / torch's; graph: replay after in-place input change")
print("%ceil: the read ceiling's time (the fastest read-only kernel on the same weight bytes, cold, "
      "graph replays; tuner.ceilings) over the best config's: what one kernel can reach at that size")
print(f"{'m':>3} {'n x k':>11} {'torch us':>8} {'best us':>8} {'TB/s':>5} {'%bw':>4} {'%ceil':>5} {'best x [95% CI]':>22} "
      f"{'dflt x':>6} {'par':>9} {'graph':>5}  winner")
for (m, n, k), c in sorted(done.items()):
    f = c["best_facts"]
    par = f"{'T' if f['bitwise_vs_baseline'] else '-'}{'D' if f['bitwise_vs_default'] else '-'} e{f['error_ratio']:.2f}"
    print(f"{m:3} {f'{n}x{k}':>11} {c['torch_us']:8.2f} {c['best_us']:8.2f} {c['best_tbps']:5.2f} {c['best_pct_bw']:4.0f} "
          f"{c.get('best_pct_ceiling', float('nan')):5.0f} "
          f"{c['speedup']:6.3f} [{c['low']:.3f},{c['high']:.3f}] {c.get('default_speedup', float('nan')):6.3f} "
          f"{par:>9} {c['graph'][:5]:>5}  {c['best_variant']}:{short(c['best'])}")
print("\n== per model: decode-step linears (layers x calls), sum of times; floor = bytes / measured bandwidth; "
      "read ceiling = the sum of the cases' read ceilings")
for model, (layers, split, merged) in MODELS.items():
    for kind, linears in (("split", split), ("merged", merged)):
        for m in sorted({c[0] for c in done}):
            have = [(n, k, calls) for _, n, k, calls in linears if (m, n, k) in done]
            if len(have) != len(linears):
                continue
            tot = lambda f: layers * sum(calls * f(done[(m, n, k)]) for n, k, calls in have)
            best, torch_us, dflt = tot(lambda c: c["best_us"]), tot(lambda c: c["torch_us"]), \
                tot(lambda c: c.get("default_us") or float("nan"))
            floor = tot(lambda c: c["bytes"] / BW * 1e6)
            ceil = tot(lambda c: c.get("ceiling_us", float("nan")))
            print(f"{model:12} {kind:6} m={m:<3} best {best:8.1f} us = {best / floor:.3f}x floor, "
                  f"{best / ceil:.3f}x read ceiling "
                  f"({tot(lambda c: c['bytes']) / best / 1e6:.2f} TB/s); torch {torch_us:8.1f}, default "
                  f"{dflt:8.1f}; vs torch: best x{torch_us / best:.3f}, default x{torch_us / dflt:.3f}")

missing = [f"m={m} {n}x{k}" for m, n, k, _ in CASES if (m, n, k) not in done]
if missing:
    print(f"not measured ({len(missing)}): " + ", ".join(missing))
PY
