"""Device-event timing: a timer that only times (sweeps, pairing and parity sit on top).

One implementation of the event timer that every stage uses (bench's protocol, `tuner device`'s
ceilings, `tuner ab`'s whole-step arms):

- `time_events(fn, repeats)`: µs per call of `fn`, one pair of device events around each call.
- `GraphTimer(fn, input_sets)`: a CUDA/HIP graph of many calls of `fn` cycling through input sets;
  `group(replays)` times that many replays with device events and returns the median µs per call.
- `ReplayTimer(replay, calls)`: the same timed replays for a graph made elsewhere (a model's
  whole decode step: `calls=1`).
- `time_callable(fn, input_sets)`: `groups` groups of timed replays of one GraphTimer, as a
  `Timing` (median of the group medians, their spread); `cold_sets` says how many input sets a
  cold timing rotates (their bytes past 2 x L2).
- statistics over groups: `median`, `spread_pct`, `bootstrap_median_interval`.

The ground floor of the measuring core (docs/interfaces.md): it imports `tuner.errors` and
`tuner.hardware` only; the read curve (tuner.ceilings), the device profile (tuner.device) and the
timing protocol (tuner.bench: input sets of a family's shape, pairing, sweeps) stand on it.

On a CPU device (only for tests under TRITON_INTERPRET=1) the same protocol runs without a graph,
timed with time.perf_counter: it checks the code path, its numbers mean nothing.
A callable that fails to compile, launch or capture raises `CandidateFailure(reason)`.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

from .errors import CandidateFailure, one_line
from .hardware import is_hip

__all__ = ["DEFAULT_GROUPS", "DEFAULT_REPLAYS", "GraphTimer", "MAX_CALLS_PER_GRAPH",
           "MAX_INPUT_SETS", "ReplayTimer", "TARGET_GRAPH_US", "Timing",
           "bootstrap_median_interval", "cold_sets", "median", "set_bytes", "spread_pct",
           "time_callable", "time_events"]

DEFAULT_GROUPS = 10
DEFAULT_REPLAYS = 10
MAX_INPUT_SETS = 256
TARGET_GRAPH_US = 1000.0
MAX_CALLS_PER_GRAPH = 2000
HIP_MAX_LAUNCHES_PER_GRAPH = 1000
LAUNCHES_PER_CALL_BOUND = 2  # e.g. a split-k GEMV: main kernel + reduction


# -------------------------------------------------------------------------------- statistics
def median(values: list[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        raise ValueError("median of nothing")
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def spread_pct(values: list[float]) -> float:
    """(max - min) / 2 of the values, as a percentage of their median."""
    mid = median(values)
    return 100.0 * (max(values) - min(values)) / 2.0 / mid if mid > 0 else float("inf")


def bootstrap_median_interval(values: list[float], *, resamples: int = 2000,
                              level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the median (deterministic: seeded)."""
    if len(values) < 2:
        return (values[0], values[0]) if values else (float("nan"), float("nan"))
    rng = random.Random(seed)
    n = len(values)
    meds = sorted(median([values[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    lo = meds[int(math.floor((1 - level) / 2 * (resamples - 1)))]
    hi = meds[int(math.ceil((1 + level) / 2 * (resamples - 1)))]
    return lo, hi


# ------------------------------------------------------------------------------- event timers
def time_events(fn, repeats: int, *, warmup: int = 1) -> list[float]:
    """µs per call of fn(), one device-event pair around each call, after `warmup` calls."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return times


class ReplayTimer:
    """Timed replays of a captured graph (`replay`, e.g. CUDAGraph.replay) that makes `calls`
    calls per replay. `gpu=False`: `replay` runs eagerly on the CPU, timed with perf_counter."""

    def __init__(self, replay, calls: int = 1, *, gpu: bool = True):
        self._replay = replay
        self.calls = int(calls)
        self.gpu = gpu

    def group(self, replays: int) -> float:
        """Median µs per call over `replays` timed replays."""
        try:
            if not self.gpu:
                times = []
                for _ in range(replays):
                    t0 = time.perf_counter()
                    self._replay()
                    times.append((time.perf_counter() - t0) * 1e6 / self.calls)
                return median(times)
            import torch

            starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
            for i in range(replays):
                starts[i].record()
                self._replay()
                ends[i].record()
            ends[-1].synchronize()
        except Exception as exc:  # noqa: BLE001 - a replay fault is the candidate's
            raise CandidateFailure(one_line(exc)) from None
        return median([s.elapsed_time(e) * 1e3 / self.calls for s, e in zip(starts, ends)])


def _first_device(inputs: dict):
    for value in inputs.values():
        if hasattr(value, "device"):
            return value.device
    raise ValueError("input set holds no tensor")


class GraphTimer(ReplayTimer):
    """A CUDA graph of `calls` calls of fn cycling through input sets, and its timed replays.

    Warm-up first (every set once: compiles, library heuristics, allocations), then a short eager
    loop estimates the time per call; the graph holds enough calls for a replay of about
    `target_graph_us` (a multiple of the number of sets; on ROCm at most ~1000 launches)."""

    def __init__(self, fn, input_sets: list[dict], *, target_graph_us: float = TARGET_GRAPH_US,
                 min_calls: int = 8):
        import torch

        self.sets = input_sets
        gpu = _first_device(input_sets[0]).type == "cuda"
        try:
            for inputs in input_sets:
                fn(inputs)
            if gpu:
                torch.cuda.synchronize()
            est_us = self._estimate_us(fn, gpu)
            calls = self._calls_per_graph(est_us, len(input_sets), target_graph_us, min_calls)

            def body():
                for i in range(calls):
                    fn(input_sets[i % len(input_sets)])

            replay = body
            if gpu:
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    fn(input_sets[0])  # one more eager call on a side stream before capture
                torch.cuda.current_stream().wait_stream(stream)
                torch.cuda.synchronize()
                self.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.graph):
                    body()
                torch.cuda.synchronize()
                replay = self.graph.replay
            super().__init__(replay, calls, gpu=gpu)
            self._replay()  # the first replay uploads the graph
            if gpu:
                torch.cuda.synchronize()
        except CandidateFailure:
            raise
        except Exception as exc:  # noqa: BLE001 - every compile/launch/capture fault is data
            raise CandidateFailure(one_line(exc)) from None

    def _estimate_us(self, fn, gpu: bool) -> float:
        n = max(len(self.sets), 8 if gpu else 1)
        calls = [lambda i=i: fn(self.sets[i % len(self.sets)]) for i in range(n)]
        if gpu:
            import torch

            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for call in calls:
                call()
            end.record()
            end.synchronize()
            return max(start.elapsed_time(end) * 1e3 / n, 0.5)
        t0 = time.perf_counter()
        for call in calls:
            call()
        return max((time.perf_counter() - t0) * 1e6 / n, 0.5)

    @staticmethod
    def _calls_per_graph(est_us: float, sets: int, target_graph_us: float,
                         min_calls: int = 8) -> int:
        """Enough calls for a replay of ~target_graph_us, a multiple of the number of sets, at
        most MAX_CALLS_PER_GRAPH (ROCm: ~1000 launches, two per call)."""
        cap = MAX_CALLS_PER_GRAPH
        if is_hip():
            cap = HIP_MAX_LAUNCHES_PER_GRAPH // LAUNCHES_PER_CALL_BOUND
        calls = max(sets, math.ceil(target_graph_us / est_us), min_calls)
        calls = math.ceil(calls / sets) * sets
        if calls > cap:
            calls = (cap // sets) * sets if sets <= cap else cap
        return calls


# ---------------------------------------------------------------------------- timing a callable
@dataclass
class Timing:
    median_us: float  # median of group medians, µs per call
    spread_pct: float  # (max - min) / 2 of the group medians, as % of the median
    group_us: list[float]
    cache: str  # "cold" or "warm"
    calls_per_graph: int = 0
    input_sets: int = 0
    rotated_bytes: int = 0  # bytes of all input sets together (cold: > 2 x L2 unless capped)

    @classmethod
    def from_groups(cls, groups: list[float], cache: str, timer: GraphTimer) -> "Timing":
        """The Timing of `timer`'s group medians."""
        return cls(median_us=median(groups), spread_pct=spread_pct(groups),
                   group_us=list(groups), cache=cache, calls_per_graph=timer.calls,
                   input_sets=len(timer.sets), rotated_bytes=sum(set_bytes(s) for s in timer.sets))


def set_bytes(inputs: dict) -> int:
    """Bytes of the tensors of one input set."""
    total = 0
    for value in inputs.values():
        if hasattr(value, "element_size") and hasattr(value, "numel"):
            total += value.element_size() * value.numel()
    return total


def cold_sets(per_set_bytes: int, l2: int) -> int:
    """How many input sets of `per_set_bytes` a cold timing rotates: enough that their bytes
    exceed 2 x L2 (`l2` bytes), at least 2, at most MAX_INPUT_SETS (tiny shapes: then the
    rotation is short of 2 x L2)."""
    return min(MAX_INPUT_SETS, max(2, math.ceil(2 * l2 / max(1, per_set_bytes)) + 1))


def time_callable(fn, input_sets: list[dict], *, cache: str = "cold", groups: int = DEFAULT_GROUPS,
                  replays: int = DEFAULT_REPLAYS, **timer_options) -> Timing:
    """Time fn(inputs) under the protocol on ready-made input sets."""
    timer = GraphTimer(fn, input_sets, **timer_options)
    results = [timer.group(replays) for _ in range(groups)]
    return Timing.from_groups(results, cache, timer)
