#!/usr/bin/env bash
# The timing protocol's A/A noise and the decode GEMV at m = 1 and 4 (H200: about 8 minutes).
#   PYTHONPATH=$PWD bash scripts/gpu/timing_noise_gemv.sh        (log: $OUT/gemv.log)
# Rows it produces in BENCHMARKS.md: "Timing protocol: A/A noise".
#   1. `tuner device`: the device profile (read bandwidth, bf16 matmul rate)
#   2. the gpu-marked tests of the gemv family
#   3. A/A noise of the timing protocol (a callable paired against itself, cold L2)
#   4. cold-L2 m=1 and m=4 decode shapes: torch linear vs default config vs best of a quick
#      sweep (paired, interleaved comparisons), table last (superseded by sweep_linears.sh).
# CPU smoke test of the Python part (tiny shapes, interpreter, no GPU):
#   GEMV_SMOKE=1 TRITON_INTERPRET=1 OUT=/tmp/gemv bash scripts/gpu/timing_noise_gemv.sh
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0;; esac
set -u
OUT="${OUT:-artifacts/gpu}"
mkdir -p "$OUT"
LOG="$OUT/gemv.log"
export PYTHONPATH="${PYTHONPATH:-$PWD}"
TABLE_BUDGET_S="${TABLE_BUDGET_S:-250}"

{
echo "=== gemv.sh  $(date -u +%FT%TZ)  host $(hostname)"
python - <<'EOF'
import torch, triton
print("torch", torch.__version__, "cuda", torch.version.cuda, "hip", getattr(torch.version, "hip", None),
      "triton", triton.__version__, "gpu", torch.cuda.is_available() and torch.cuda.get_device_name())
EOF
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu --format=csv 2>/dev/null || true

echo
echo "=== 1. tuner device"
if [ "${GEMV_SMOKE:-0}" = "1" ]; then
    echo "(smoke: skipped)"
else
    timeout 180 python -m tuner.cli device --out artifacts/devices || echo "tuner device FAILED (rc $?)"
fi

echo
echo "=== 2. gpu tests (tests/test_device.py -m gpu)"
if [ "${GEMV_SMOKE:-0}" = "1" ]; then
    echo "(smoke: skipped)"
else
    timeout 150 python -m pytest -q -m gpu tests/test_device.py -p no:cacheprovider \
        || echo "gpu tests FAILED or timed out (rc $?)"
fi

echo
echo "=== 2b. tuner bench (CLI) on one shape, with a small sweep"
if [ "${GEMV_SMOKE:-0}" = "1" ]; then
    timeout 120 python -m tuner.cli bench --shape m=2,n=37,k=100 --dtype float16 --torch-device cpu \
        --cache warm --groups 2 --replays 1 --sweep --max-configs 2 || echo "tuner bench FAILED"
else
    timeout 90 python -m tuner.cli bench --family gemv --shape m=1,n=14336,k=5120 \
        --config ROWS_PER_BLOCK=32,BLOCK_K=128,SPLIT_K=1,num_warps=4,USE_DOT=1,num_stages=3 \
        --sweep --max-configs 12 --top 5 || echo "tuner bench FAILED (rc $?)"
fi

echo
echo "=== 3+4. A/A noise and the decode table (budget ${TABLE_BUDGET_S}s)"
TABLE_BUDGET_S="$TABLE_BUDGET_S" timeout $((TABLE_BUDGET_S + 90)) python - <<'EOF'
import math, os, sys, time, traceback
import torch

from tuner_kernels import get_family
from tuner import bench, parity, device
from tuner.spaces import space_for

t_start = time.time()
smoke = os.environ.get("GEMV_SMOKE") == "1"
budget = float(os.environ.get("TABLE_BUDGET_S", "250"))
fam = get_family("gemv")
dev = "cpu" if smoke else None
timer_opts = dict(device="cpu", target_graph_us=1.0, min_calls=1) if smoke else {}
G = dict(groups=2, replays=1) if smoke else dict(groups=10, replays=10)
SWEEP_G = dict(groups=1, replays=1) if smoke else dict(groups=5, replays=5)

profile = None if smoke else device.find_saved_profile()
bw = profile.read_bandwidth_bytes_per_s if profile else None
print("profile:", profile.name if profile else None,
      f"read {bw / 1e12:.3f} TB/s" if bw else "")
backend = "cuda" if smoke else bench.backend_name()
print("backend", backend)

NK = [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (14336, 5120), (34816, 5120),
      (5120, 17408), (151936, 4096)]
MODELS = {"8B (4096 hidden)": [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336)],
          "27B-class (5120 hidden)": [(14336, 5120), (34816, 5120), (5120, 17408)],
          "lm_head": [(151936, 4096)]}
MS = [1, 4]
if smoke:
    NK = [(37, 100)]
    MODELS = {"smoke": NK}
    MS = [3]

def shape_of(m, n, k):
    return {"m": m, "n": n, "k": k, "dtype": "bfloat16"}

def fmt_cfg(c):
    short = {"ROWS_PER_BLOCK": "R", "BLOCK_K": "BK", "SPLIT_K": "S", "num_warps": "w",
             "num_stages": "st", "waves_per_eu": "wpe"}
    return ",".join(f"{short.get(k, k)}{v}" for k, v in c.items())

# ---- 3. A/A noise
print("\n--- A/A noise: the same callable against itself, paired and interleaved (20 groups x 10 replays)")
aa_shapes = [shape_of(1, 4096, 4096), shape_of(1, 14336, 4096)] if not smoke else [shape_of(1, 37, 100)]
for s in aa_shapes:
    for which in ("baseline", "default") if not smoke else ("baseline",):
        try:
            p = bench.aa_noise(fam, s, which, cache="warm" if smoke else "cold",
                               **({"groups": 2, "replays": 1} if smoke else {}), **timer_opts)
            print(f"A/A {which:<8} {fam.shape_key(s)}: ratio {p.speedup:.4f} "
                  f"[{p.speedup_low:.4f}, {p.speedup_high:.4f}]  group spread "
                  f"±{p.reference.spread_pct:.2f}% / ±{p.candidate.spread_pct:.2f}%  "
                  f"median {p.reference_us:.2f} / {p.candidate_us:.2f} us")
        except Exception as exc:
            print(f"A/A {which} {fam.shape_key(s)} FAILED: {type(exc).__name__}: {exc}")

# ---- 4. decode table
# The quick sweep is a budgeted hill climb from the default config over the shape's search space:
# time every untried neighbour (ROWS_PER_BLOCK, BLOCK_K, num_warps, SPLIT_K halved or doubled),
# move to the best, repeat until nothing improves; then random configs of the space until the
# case's share of the budget is spent.
STEPS = {"ROWS_PER_BLOCK": (0.5, 2), "BLOCK_K": (0.5, 2), "num_warps": (0.5, 2), "SPLIT_K": (0.5, 2)}

def neighbours(c, allowed):
    out = []
    steps = dict(STEPS, num_stages=(0.5, 2)) if c.get("USE_DOT") else STEPS
    for key, factors in steps.items():
        for f in factors:
            v = int(c[key] * f)
            cand = {**c, key: v}
            if v >= 1 and cand in allowed and cand not in out:
                out.append(cand)
    seeds = []
    if not c.get("USE_DOT"):  # also try the pipelined tl.dot variant from three starting points
        for rows, block_k, stages in ((32, 128, 4), (32, 256, 3), (64, 128, 4)):
            seeds.append({**c, "USE_DOT": 1, "ROWS_PER_BLOCK": rows, "BLOCK_K": block_k,
                          "num_warps": 4, "num_stages": stages})
    # FMA starting points that won somewhere in the first H200 run (one row and a long BLOCK_K:
    # many programs, all of a row's loads in flight at once)
    for rows, block_k, warps in ((1, 1024, 4), (1, 2048, 4), (1, 4096, 4), (4, 512, 8)):
        seeds.append({**c, "USE_DOT": 0, "ROWS_PER_BLOCK": rows, "BLOCK_K": block_k,
                      "num_warps": warps, "num_stages": 1})
    for cand in seeds:
        if cand in allowed and cand not in out:
            out.append(cand)
    return out

cases = [(m, n, k) for m in MS for (n, k) in NK]
rows = []
print(f"\n--- decode table: {len(cases)} cases, cold L2 (inputs rotated past 2x L2)")
for ci, (m, n, k) in enumerate(cases):
    s = shape_of(m, n, k)
    left = budget - (time.time() - t_start)
    case_budget = left / (len(cases) - ci)
    t_case = time.time()
    r = {"m": m, "n": n, "k": k, "mb": fam.bytes_moved(s) / 1e6}
    try:
        sets = bench.make_input_sets(fam, s, "cold", dev) if not smoke else \
            bench.make_input_sets(fam, s, "warm", dev)
        checker = parity.Checker(fam, s, reference="default", device=dev)
        base = bench.bench_one(fam, s, "baseline", "baseline", checker=checker, input_sets=sets,
                               cache="cold", profile=profile, **G, **timer_opts)
        default = bench.bench_one(fam, s, "default", "default", checker=checker, input_sets=sets,
                                  cache="cold", profile=profile, **G, **timer_opts)
        r.update(base=base, default=default)
        allowed = space_for("gemv", backend).configs(s)
        swept, hashes, tried = [], set(), [default.config]
        current = default
        while not smoke or len(swept) < 2:
            todo = [c for c in neighbours(current.config, allowed) if c not in tried]
            if not todo:
                break
            for c in todo:
                if time.time() - t_case > 0.6 * case_budget:
                    break
                tried.append(c)
                row = bench.bench_one(fam, s, "sweep", c, checker=checker, input_sets=sets,
                                      cache="cold", profile=profile, **SWEEP_G, **timer_opts)
                swept.append(row)
                if row.output_hash:
                    hashes.add(row.output_hash)
            ok = [x for x in swept if not x.failure and x.parity != "mismatch"]
            step_best = min(ok, key=lambda x: x.median_us) if ok else None
            if step_best is None or step_best.median_us >= current.median_us or \
                    time.time() - t_case > 0.6 * case_budget:
                if step_best is not None and step_best.median_us < current.median_us:
                    current = step_best
                break
            current = step_best
        # the rest of the case's time: a seeded random sample of the rest of the space
        import random
        rng = random.Random(ci)
        for c in rng.sample(allowed, len(allowed)):
            if time.time() - t_case > 0.6 * case_budget or (smoke and len(swept) >= 3):
                break
            if c in tried:
                continue
            tried.append(c)
            row = bench.bench_one(fam, s, "sweep", c, checker=checker, input_sets=sets,
                                  cache="cold", profile=profile, **SWEEP_G, **timer_opts)
            swept.append(row)
            if row.output_hash:
                hashes.add(row.output_hash)
        good = sorted((x for x in swept + [default] if not x.failure and x.parity != "mismatch"),
                      key=lambda x: x.median_us)
        r.update(swept=len(swept), of=len(allowed), hashes=len(hashes | {default.output_hash}),
                 failed=sum(1 for x in swept if x.failure))
        best = good[0] if good else None
        if best is not None:
            best_cfg = best.config
            # re-time the best with the full protocol, paired against torch's linear
            pb = bench.compare(fam, s, best_cfg, "baseline", cache="cold", input_sets=sets,
                               **G, **timer_opts)
            pd = bench.compare(fam, s, "default", "baseline", cache="cold", input_sets=sets,
                               **G, **timer_opts)
            r.update(best=best, best_cfg=best_cfg, pb=pb, pd=pd)
        del sets
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    except Exception as exc:
        r["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        traceback.print_exc()
    rows.append(r)
    if "pb" in r:
        print(f"m={m} {n}x{k}: base {r['pb'].reference_us:.2f}us  default {r['pd'].candidate_us:.2f}us "
              f"({r['pd'].speedup:.3f}x)  best {r['pb'].candidate_us:.2f}us ({r['pb'].speedup:.3f}x "
              f"[{r['pb'].speedup_low:.3f},{r['pb'].speedup_high:.3f}]) {fmt_cfg(r['best_cfg'])}  "
              f"swept {r['swept']}/{r['of']} hashes {r['hashes']} failed {r['failed']}  "
              f"{time.time() - t_case:.1f}s", flush=True)
    else:
        print(f"m={m} {n}x{k}: {r.get('error', 'no result')}", flush=True)

def tbps(r, us):
    return r["mb"] * 1e6 / (us * 1e-6) / 1e12

print("\n=== RESULTS gemv (cold L2, bf16, µs per call; speedup = torch linear / kernel, paired, 95% CI)")
if bw:
    print(f"device read bandwidth (tuner device): {bw / 1e12:.3f} TB/s")
hdr = (f"{'m':>2} {'n x k':>13} {'MB':>7} | {'torch us':>8} {'TB/s':>5} | {'default':>8} {'TB/s':>5} "
       f"{'x':>6} | {'best':>8} {'TB/s':>5} {'x':>6} {'95% CI':>13} {'parity':>9} | config")
print(hdr)
for r in rows:
    if "pb" not in r:
        print(f"{r['m']:>2} {r['n']:>6}x{r['k']:<6} {r['mb']:>7.1f} | FAILED {r.get('error', '')}")
        continue
    pb, pd = r["pb"], r["pd"]
    print(f"{r['m']:>2} {r['n']:>6}x{r['k']:<6} {r['mb']:>7.1f} | {pb.reference_us:>8.2f} "
          f"{tbps(r, pb.reference_us):>5.2f} | {pd.candidate_us:>8.2f} {tbps(r, pd.candidate_us):>5.2f} "
          f"{pd.speedup:>6.3f} | {pb.candidate_us:>8.2f} {tbps(r, pb.candidate_us):>5.2f} "
          f"{pb.speedup:>6.3f} [{pb.speedup_low:.3f},{pb.speedup_high:.3f}] {r['best'].parity:>9} | "
          f"{fmt_cfg(r['best_cfg'])}")
for m in MS:
    for name, shapes in MODELS.items():
        sel = [r for r in rows if r["m"] == m and (r["n"], r["k"]) in shapes and "pb" in r]
        if sel:
            gd = math.exp(sum(math.log(r["pd"].speedup) for r in sel) / len(sel))
            gb = math.exp(sum(math.log(r["pb"].speedup) for r in sel) / len(sel))
            print(f"geomean m={m} {name}: default {gd:.3f}x  best {gb:.3f}x  ({len(sel)} shapes)")
big = [r for r in rows if "pb" in r and r["mb"] >= 64]
if big:
    print("shapes >= 64 MB, best TB/s: " + ", ".join(
        f"m{r['m']} {r['n']}x{r['k']} {tbps(r, r['pb'].candidate_us):.2f}" for r in big))
print(f"table time {time.time() - t_start:.0f}s")
EOF
echo "table rc $?"
echo "=== done $(date -u +%FT%TZ)"
} 2>&1 | tee "$LOG"
