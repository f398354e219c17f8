"""The read curve: how fast one kernel can read N bytes from device memory, by size.

`tuner device`'s read bandwidth is measured on a buffer of gigabytes, where the fixed cost of a
kernel (its launch inside a graph, the first bytes' latency from HBM, the ramp over the
multiprocessors, the tail of the last programs) vanishes. A decode linear reads 8-240 MB in one
kernel of 2-60 µs, where that fixed cost is several percent of the time: no kernel reads a
117 MB weight at the big-buffer bandwidth. The read curve measures what one kernel can do at
each size, as the kernels themselves are timed (tuner.bench's protocol: CUDA-graph replays,
median of group medians, buffers rotated past 2 x L2 so every read comes from HBM), with a few
read-only streaming kernels (tuner.readers), keeping the fastest at each size:

- `stream`: many programs, each summing STEPS x BLOCK int32 values with wide loads, all its
  loads issued before the first add (`tuner.readers.stream_read_kernel`, the bandwidth kernel);
- `tma`: one or two programs a multiprocessor, each walking its contiguous share of the buffer in
  [BLOCK_R, 256] int32 tiles through a pipeline of STAGES tensor-memory-accelerator copies into
  shared memory (sm90; the weight path of the skinny GEMM kernel without its MMAs). Under the
  interpreter and on hip it runs with pointer loads;
- `cpasync`: the same walk with pointer loads, which Triton pipelines through cp.async stages
  (sm90; LDS on gfx9).

From the curve, `slope` gives the read bandwidth as the slope of the least-squares line through
the points of 32 MiB and more (t = intercept + bytes / bandwidth): the rate each further byte
costs, free of the fixed cost. `fit` then takes the line below every point: the largest constant
`latency` with which `bytes / bandwidth` plus it stays at or under every measured time. The
budget's floor of a call is `latency + bytes / bandwidth` (tuner.budget.floor_us): still a time
no measured reader beat, and no longer a floor that small shapes only seem to have headroom over.

Why the slope and not one timed stream (`tuner.device.measure_read_bandwidth`, the profile's
only bandwidth before): on the H200 (2026-12-01, BENCHMARKS.md) that event-timed 2-4 GiB stream read
3.93-4.60 TB/s in four measurements of one machine within ten minutes, while the same stream
kernel in graph replays read 2 GiB at 4.69 TB/s and the curve's slope was 4.71 TB/s. A floor
from the low reading is no floor: the kernels' own "% of bandwidth" went past 100%.

The second floor of the measuring core (docs/interfaces.md): it stands on the read-only kernels
(tuner.readers, whose names it re-exports), the timer (tuner.timing) and the detection
(tuner.hardware); the device profile (tuner.device) stands on it.
"""

from __future__ import annotations

import math

from .errors import CandidateFailure
from .hardware import is_hip, l2_cache_bytes
from .readers import CHUNK_BYTES, READERS, TMA_COLUMNS, read_sets, reader_call, reader_plan
from .timing import cold_sets, time_callable

__all__ = ["CHUNK_BYTES", "READ_CURVE_BYTES", "READERS", "TMA_COLUMNS", "choose_bandwidth", "fit",
           "measure_read_curve", "read_sets", "reader_call", "reader_plan", "slope"]

# from a quarter MiB (the smallest decode linears: a 0.5B model's projections) to 2 GiB; the small
# sizes keep the read latency under what small reads take (its line must stay under every point)
READ_CURVE_BYTES = (256 << 10, 1 << 20, 2 << 20, 4 << 20) + tuple(
    mib << 20 for mib in (8, 16, 32, 64, 128, 256, 512, 1024, 2048))
SLOPE_MIN_BYTES = 32 << 20  # the line's slope is fitted over sizes from here up


def measure_read_curve(sizes=READ_CURVE_BYTES, *, readers=None, groups: int = 5,
                       replays: int = 5, device=None, cache: str = "cold", progress=None,
                       **timer_options) -> dict:
    """The read curve on the current GPU (or `device`): for each size, every reader timed over
    buffers rotated past 2 x L2 (cache "cold"; "warm": one buffer, read from L2 where it fits)
    in CUDA-graph replays (tuner.bench's protocol), the fastest kept. Returns {"points":
    [{"bytes", "us", "reader", "readers": {name: us or failure}}], "method"}. A reader that
    fails (compile, launch, capture) is recorded and skipped; `progress(point)` is called after
    each size. On a CPU device (tests, TRITON_INTERPRET=1) the tma reader uses pointer loads and
    the numbers mean nothing."""
    import torch

    from tuner_kernels.common import sm_count

    dev = torch.device(device) if device is not None else torch.device("cuda")
    gpu = dev.type == "cuda"
    sms = sm_count(dev) if gpu else 4
    names = list(readers or READERS)
    hip = is_hip()
    l2 = l2_cache_bytes(dev)
    free = torch.cuda.mem_get_info(dev)[0] if gpu else None
    points = []
    for nbytes in sizes:
        count = 1 if cache == "warm" else cold_sets(nbytes, l2)
        if free is not None and count * nbytes > free // 2:
            points.append({"bytes": int(nbytes), "us": math.nan, "reader": None,
                           "readers": {}, "skipped": "not enough free device memory"})
            continue
        sets = read_sets(nbytes, count, dev)
        actual = sets[0]["buf"].numel() * 4
        timed = {}
        for name in names:
            fn = reader_call(name, sms, use_desc=gpu and not hip)
            try:
                options = {"min_calls": len(sets), **timer_options}
                timing = time_callable(fn, sets, cache=cache, groups=groups,
                                             replays=replays, **options)
                timed[name] = timing.median_us
            except CandidateFailure as exc:
                timed[name] = f"failed: {exc.reason}"
        ok = {k: v for k, v in timed.items() if isinstance(v, float)}
        best = min(ok, key=ok.get) if ok else None
        points.append({"bytes": actual, "us": ok[best] if best else math.nan, "reader": best,
                       "readers": timed})
        if progress:
            progress(points[-1])
        del sets
        if gpu:
            torch.cuda.empty_cache()
    return {"points": points,
            "method": (f"fastest of {len(names)} read-only kernels ({', '.join(names)}) at each "
                       f"size; median of {groups} groups of {replays} CUDA-graph replays, "
                       + ("buffers rotated past 2 x L2" if cache == "cold" else "one buffer"))}


def slope(points: list[dict], min_bytes: int = SLOPE_MIN_BYTES) -> tuple[float, float]:
    """(bytes/s, intercept µs) of the least-squares line t = intercept + bytes / bandwidth
    through the measured points of at least `min_bytes`; (nan, nan) with fewer than two such
    points or a line that does not rise."""
    pts = [(float(p["bytes"]), float(p["us"])) for p in points
           if p.get("bytes", 0) >= min_bytes and isinstance(p.get("us"), (int, float))
           and math.isfinite(float(p["us"]))]
    if len(pts) < 2:
        return math.nan, math.nan
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    us_per_byte = sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else 0.0
    if us_per_byte <= 0:
        return math.nan, math.nan
    return 1e6 / us_per_byte, my - us_per_byte * mx


def choose_bandwidth(stream_bytes_per_s: float, points: list[dict]) -> tuple[float, str]:
    """(bytes/s, where from) of `tuner device`'s read bandwidth: the read curve's `slope` where
    it is higher than the event-timed stream (`tuner.device.measure_read_bandwidth`), else the
    stream. One rule for the profile, sweep_linears.sh and read_ceiling.py."""
    slope_bw, _ = slope(points)
    if math.isfinite(slope_bw) and slope_bw > stream_bytes_per_s:
        return slope_bw, "read curve slope"
    return stream_bytes_per_s, "event-timed stream"


def fit(points: list[dict], bandwidth: float) -> float:
    """The read latency in µs: the largest constant L with L + bytes / bandwidth <= us at every
    measured point (clipped at 0; 0 without points). `bandwidth` in bytes/s."""
    gaps = [float(p["us"]) - float(p["bytes"]) / bandwidth * 1e6 for p in points
            if isinstance(p.get("us"), (int, float)) and math.isfinite(float(p["us"]))]
    return max(0.0, min(gaps)) if gaps and bandwidth > 0 else 0.0
