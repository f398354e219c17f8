"""How fast can one kernel read N bytes, at the sizes decode weights have? (H200, ~2 min)

    PYTHONPATH=$PWD python3 scripts/gpu/read_ceiling.py        (log: $OUT/read_ceiling.log)

Rows it produces in BENCHMARKS.md: "The read curve" (and the L2, broadcast and program-count
figures under it).

A bar such as "≥ 95% of the measured read bandwidth" for every ≥ 64 MB decode linear at m = 1..8
takes the bandwidth from `tuner device`: a stream over gigabytes. A 100 MB weight is read
in ~25 µs, where a kernel's fixed cost (graph launch, first bytes from HBM, ramp, tail) is not
negligible. This measures that ceiling directly, with the kernels' own protocol (tuner.bench:
CUDA-graph replays, median of group medians, buffers rotated past 2 x L2):

1. the read curve (tuner.ceilings, every reader) at the byte counts of the 8B- and 27B-class
   decode weights and at 2 MiB .. 2 GiB, cold; the fit latency + bytes / bandwidth under it;
2. the same readers on one warm buffer of 2-48 MiB (reads from L2): the L2 read rate as the
   slope between sizes;
3. a broadcast read: every program reads one of a few chunks of a 1-2 MiB buffer, as the skinny
   GEMM's programs all read the activation tile at m = 64-256: the L2 rate of that pattern;
4. programs: the tma reader (32 KiB tiles, 4 stages: the skinny kernel's R64 x K256 weight tile)
   on a 96 MiB weight with a grid of 64 .. 264 programs, each streaming a contiguous share: how
   many programs one read of a decode weight needs (a 4096-row down projection in 64-row tiles
   is 64 programs).
READ_CEILING_PARTS (default 1234) picks the parts.

Tables last; a RESULTS-JSON line holds every number. CPU check (interpreter, tiny sizes, numbers
meaningless): READ_CEILING_SMOKE=1 python3 scripts/gpu/read_ceiling.py
"""

from __future__ import annotations

import json
import os
import sys
import time

if any(arg in ("-h", "--help") for arg in sys.argv[1:]):
    print(__doc__)
    raise SystemExit(0)
SMOKE = os.environ.get("READ_CEILING_SMOKE") == "1"
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tuner_kernels.common import sm_count  # noqa: E402
from tuner import bench, ceilings  # noqa: E402
from tuner.device import measure_read_bandwidth  # noqa: E402

START = time.time()
OUT = os.environ.get("OUT", "/tmp/out")
os.makedirs(OUT, exist_ok=True)
LOG = open(os.path.join(OUT, "read_ceiling.log"), "a")
DEVICE = "cpu" if SMOKE else "cuda"
TIMING = dict(groups=1, replays=1, target_graph_us=1.0) if SMOKE else dict(groups=5, replays=5)
RESULTS: dict = {}


def say(*args):
    line = f"[{time.time() - START:6.1f}s] " + " ".join(str(a) for a in args)
    print(line, flush=True)
    LOG.write(line + "\n")
    LOG.flush()


MiB = 1 << 20
WEIGHTS = {  # n x k bf16 weights of the decode linears (tags as in sweep_linears.sh)
    "kv 1024x4096": 1024 * 4096 * 2, "Gkv 2048x5376": 2048 * 5376 * 2,
    "q/o 4096x4096": 4096 * 4096 * 2, "Gq/Go 4096x5376": 4096 * 5376 * 2,
    "qkv 6144x4096": 6144 * 4096 * 2, "Gqkv 8192x5376": 8192 * 5376 * 2,
    "Qgate/down 12288x4096": 12288 * 4096 * 2, "Lgate/down 14336x4096": 14336 * 4096 * 2,
    "Qgate_up 24576x4096": 24576 * 4096 * 2, "Ggate/down 21504x5376": 21504 * 5376 * 2,
    "Lgate_up 28672x4096": 28672 * 4096 * 2, "Ggate_up 43008x5376": 43008 * 5376 * 2,
}
EXTRA = {"2 MiB": 2 * MiB, "4 MiB": 4 * MiB, "512 MiB": 512 * MiB, "1 GiB": 1024 * MiB,
         "2 GiB": 2048 * MiB}
L2_SIZES = [2 * MiB, 4 * MiB, 8 * MiB, 16 * MiB, 24 * MiB, 32 * MiB, 48 * MiB]
if SMOKE:
    WEIGHTS, EXTRA, L2_SIZES = {"tiny": 512 << 10}, {"tinier": 256 << 10}, [256 << 10, 512 << 10]


def bandwidth() -> float:
    if SMOKE:
        return 1e9
    bw = measure_read_bandwidth(2 << 30)
    say(f"measured read bandwidth {bw['bytes_per_s'] / 1e12:.3f} TB/s (triton stream "
        f"{bw['triton_stream_bytes_per_s'] / 1e12:.3f}; 2 GiB, as sweep_linears.sh)")
    return bw["bytes_per_s"]


def curve(sizes: dict, cache: str) -> list[dict]:
    points = ceilings.measure_read_curve(  # the smoke run reads one buffer (the interpreter)
        list(sizes.values()), device=DEVICE, cache="warm" if SMOKE else cache, **TIMING,
        progress=lambda p: say(f"   {cache} {p['bytes'] / MiB:8.1f} MiB  best {p['reader']} "
                               f"{p['us']:.2f} us  ({p['bytes'] / p['us'] / 1e6:.2f} TB/s)"))["points"]
    for tag, p in zip(sizes, points):
        p["tag"] = tag
    return points


@triton.jit
def broadcast_read(src, dst, CHUNKS: tl.constexpr, BLOCK: tl.constexpr, STEPS: tl.constexpr):
    """Program p sums chunk p % CHUNKS (STEPS x BLOCK int32) of a small buffer: many programs
    read the same bytes, as the skinny GEMM's programs all read the activation tile."""
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    base = src + (pid % CHUNKS) * BLOCK * STEPS
    for i in tl.static_range(STEPS):
        acc += tl.load(base + i * BLOCK + offs)
    tl.store(dst + pid, tl.sum(acc, axis=0))


def broadcast(chunks: int, programs: int) -> dict:
    block, steps = (256, 4) if SMOKE else (4096, 16)
    buf = torch.randint(-1000, 1000, (chunks * block * steps,), dtype=torch.int32, device=DEVICE)
    dst = torch.empty(programs, dtype=torch.int32, device=DEVICE)

    def fn(inputs):
        broadcast_read[(programs,)](inputs["buf"], dst, CHUNKS=chunks, BLOCK=block, STEPS=steps,
                                    num_warps=8)

    t = bench.time_callable(fn, [{"buf": buf}], cache="warm", **TIMING)
    nbytes = programs * block * steps * 4
    row = {"buffer_bytes": buf.numel() * 4, "programs": programs, "bytes_read": nbytes,
           "us": t.median_us, "tbps": nbytes / t.median_us / 1e6}
    say(f"   broadcast {row['buffer_bytes'] / MiB:.1f} MiB buffer, {programs} programs: "
        f"{row['us']:.2f} us, {row['tbps']:.2f} TB/s")
    return row


def programs_probe() -> list[dict]:
    nbytes = 8 * MiB if SMOKE else 96 * MiB
    count = 1 if SMOKE else max(2, -(-2 * bench.l2_bytes() // nbytes) + 1)
    sets = ceilings.read_sets(nbytes, count, DEVICE)
    sms = 4 if SMOKE else sm_count()
    rows = []
    for grid in ((2, 4) if SMOKE else (64, 96, 128, 132, 192, 256, 264)):
        fn = ceilings.reader_call("tma-32x256-s4-p1", sms, use_desc=not SMOKE, programs=grid)
        t = bench.time_callable(fn, sets, cache="warm" if SMOKE else "cold", **TIMING)
        rows.append({"bytes": sets[0]["buf"].numel() * 4, "programs": grid, "us": t.median_us})
        say(f"   {rows[-1]['bytes'] / MiB:.0f} MiB with {grid} programs: {t.median_us:.2f} us")
    return rows


def main():
    if not SMOKE:
        props = torch.cuda.get_device_properties(0)
        say(f"device {props.name}  SMs {props.multi_processor_count}  L2 {bench.l2_bytes() / MiB:.0f} MiB  "
            f"torch {torch.__version__}  triton {triton.__version__}")
    parts = os.environ.get("READ_CEILING_PARTS", "1234")
    RESULTS["bandwidth"] = bw = bandwidth()
    if "4" in parts:
        say("4. programs: the tma reader on one weight with a given grid")
        RESULTS["programs"] = programs_probe()
    if "1" in parts:
        say("1. the read curve, cold (buffers rotated past 2 x L2)")
        RESULTS["cold"] = curve({**WEIGHTS, **EXTRA}, "cold")
        RESULTS["bandwidth_end"] = bandwidth()
    if "2" in parts:
        say("2. the read curve, warm (one buffer: L2 where it fits)")
        RESULTS["warm"] = curve({f"{s / MiB:g} MiB": s for s in L2_SIZES}, "warm")
    if "3" in parts:
        say("3. broadcast reads (many programs, the same bytes)")
        sms = 4 if SMOKE else sm_count()
        RESULTS["broadcast"] = [broadcast(c, p * sms) for c, p in ((4, 4), (4, 8), (8, 8))]

    print("\nRESULTS-JSON " + json.dumps(RESULTS, default=str))
    for row in RESULTS.get("programs", []):
        print(f"programs: {row['bytes'] / MiB:.0f} MiB read by {row['programs']:3} programs "
              f"(tma, 32 KiB tiles, 4 stages): {row['us']:.2f} us")
    if "1" not in parts:
        return
    cold, bw_end = RESULTS["cold"], RESULTS["bandwidth_end"]
    slope_bw, t0 = ceilings.slope(cold)
    best_bw, _ = ceilings.choose_bandwidth(max(bw, bw_end), cold)  # tuner device's rule
    latency = ceilings.fit(cold, best_bw)
    readers = list(ceilings.READERS)
    print(f"\n== the read curve, cold: µs of each reader; best as % of the read bandwidth "
          f"{best_bw / 1e12:.3f} TB/s (tuner device's rule: the higher of the event-timed stream, "
          f"{bw / 1e12:.3f} TB/s at the start and {bw_end / 1e12:.3f} at the end, and the curve's slope)")
    print(f"{'size':>24} {'MiB':>7} " + " ".join(f"{r[:14]:>14}" for r in readers)
          + f" {'best us':>8} {'TB/s':>5} {'%bw':>5}")
    for p in cold:
        cells = [f"{p['readers'][r]:14.2f}" if isinstance(p['readers'].get(r), float) else f"{'fail':>14}"
                 for r in readers]
        print(f"{p['tag']:>24} {p['bytes'] / MiB:7.1f} " + " ".join(cells)
              + f" {p['us']:8.2f} {p['bytes'] / p['us'] / 1e6:5.2f} {100 * p['bytes'] / p['us'] / 1e6 / (best_bw / 1e12):5.1f}")
    print(f"\nread latency under the curve (tuner.ceilings.fit at {best_bw / 1e12:.3f} TB/s): "
          f"{latency:.2f} us; least squares over >= 32 MiB (tuner.ceilings.slope): {t0:.2f} us + "
          f"bytes / {slope_bw / 1e12:.3f} TB/s")
    print("what 95% of the measured bandwidth asks of one kernel, against the best reader:")
    for p in cold:
        if p["tag"] in WEIGHTS and p["bytes"] >= 64e6:
            need = p["bytes"] / (0.95 * best_bw) * 1e6
            print(f"   {p['tag']:>24}: 95% = {need:6.2f} us; best reader {p['us']:6.2f} us "
                  f"({'reachable' if p['us'] <= need else 'NOT reached by a pure read'})")
    if "2" not in parts or "3" not in parts:
        return
    warm = RESULTS["warm"]
    l2_bw, w0 = ceilings.slope([p for p in warm if p["bytes"] <= 32 * MiB], min_bytes=0)
    warm_text = ", ".join(f"{p['tag']} {p['us']:.2f} us" for p in warm)
    print(f"\n== warm (L2) reads: {warm_text}")
    print(f"   L2 read rate (slope, <= 32 MiB): {l2_bw / 1e12:.2f} TB/s, intercept {w0:.2f} us")
    for row in RESULTS["broadcast"]:
        print(f"   broadcast: {row['buffer_bytes'] / MiB:.0f} MiB read by {row['programs']} programs: "
              f"{row['tbps']:.2f} TB/s ({row['us']:.2f} us for {row['bytes_read'] / MiB:.0f} MiB)")


main()
