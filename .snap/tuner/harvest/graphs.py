"""Joining a CUDA/HIP-graph replay trace with the trace of the graph's capture.

A server that replays its decode step as a graph writes two kinds of traces: the *capture*
(CPU ops with Input Dims, and the launches made while capturing: nothing runs, so no kernels;
on ROCm each launch names its kernel in args.kernel) and the *replay* (one graph launch whose
kernels carry its correlation id and no op). The join:

1. In the capture, each stream-capture window (cudaStreamBeginCapture .. EndCapture, or
   hipStream...) is one graph: its launches in order, each with the call (GEMM/attention op)
   that made it, if any.
2. In the replay, each graph launch (cudaGraphLaunch / hipGraphLaunch) runs its kernels, in time
   order. A captured graph matches when it launched as many kernels, of the same kinds
   (kernel, memcpy, memset), with the same names where the capture records them (ROCm); on
   CUDA the launch count and kinds decide.
3. The i-th replayed kernel is the i-th captured launch: each captured call gets the GPU time
   of its kernels, once per graph launch, in the replay's step.

Several matching graphs that hold the same calls (vLLM PIECEWISE pieces of the middle layers)
are one; different ones (graphs captured for several batch sizes) are told apart by the step's
token count (the smallest captured batch that holds it, as vLLM pads); otherwise the launch is
ambiguous and stays unjoined.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import TunerError
from .attribution import call_owner, index_ops, mark_compiled, select_calls
from .moe import check_topk
from .reading import read_events, read_header
from .records import Call, RawTrace

__all__ = ["CapturedLaunch", "CapturedGraph", "GraphJoin", "read_captures", "capture_windows",
           "graph_launches", "join_replay"]

LAUNCH_RE = re.compile(r"LaunchKernel|LaunchCooperativeKernel|^cuLaunch"
                       r"|^(?:cuda|hip|cu)Mem(?:cpy|set)")
GRAPH_LAUNCH_RE = re.compile(r"GraphLaunch")
BEGIN_CAPTURE_RE = re.compile(r"BeginCapture")
END_CAPTURE_RE = re.compile(r"EndCapture")
CAPTURE_MARK_RE = re.compile(r"BeginCapture|EndCapture")


_API_COPY_RE = re.compile(r"^(?:cuda|hip|cu)Mem(cpy|set)")


def api_kind(api: str) -> str:
    """kernel, memcpy or memset: what a launching runtime call puts into the graph."""
    m = _API_COPY_RE.match(api)
    return "mem" + m.group(1) if m else "kernel"


def activity_kind(name: str) -> str:
    """kernel, memcpy or memset: what a GPU activity is ("Memcpy DtoD (...)", "Memset (...)")."""
    if name.startswith("Memcpy"):
        return "memcpy"
    if name.startswith("Memset"):
        return "memset"
    return "kernel"


@dataclass
class CapturedLaunch:
    kind: str                 # kernel, memcpy, memset
    kernel: str | None        # the kernel's name, where the capture records it (ROCm)
    call: Call | None         # the captured GEMM/attention call that launched it
    in_op: bool               # launched inside some CPU op (a call or another op)


@dataclass
class CapturedGraph:
    source: str               # capture file name
    label: str                # the annotation around the capture (capture_32_FULL), or "graph N"
    launches: list            # CapturedLaunch, in launch order
    calls: list               # the captured calls, in order (also those that launched nothing)
    batch: int | None         # the most common GEMM m of its calls: the batch it was captured at
    compiled_regions: int = 0  # Inductor graph-call ranges in its capture trace (calls marked)
    notes: list = field(default_factory=list)   # notes of its capture trace (MoE calls left out)

    def signature(self) -> tuple:
        """What makes two graphs the same for the join: launches and the calls' shapes."""
        return tuple((x.kind, x.kernel, _call_key(x.call)) for x in self.launches)


def _call_key(c: Call | None):
    if c is None:
        return None
    return (c.op, c.m, c.n, c.k, c.batch, c.dtype, c.layout, c.heads, c.kv_heads, c.q_len,
            c.kv_len, c.head_dim, c.experts, c.topk)


@dataclass
class GraphJoin:
    """What joining one replay trace with the captured graphs gave."""
    assignments: dict = field(default_factory=dict)   # activity index -> (Call | None, in_op)
    calls: list = field(default_factory=list)         # the joined call instances (replay time)
    n_launches: int = 0           # graph launches in the replay
    n_joined: int = 0             # of them joined to a captured graph
    kernels_joined: int = 0
    graphs_used: Counter = field(default_factory=Counter)   # "file: label" -> launches
    problems: list = field(default_factory=list)             # why launches stayed unjoined


# ---------------------------------------------------------------------------------- the capture
def _runtimes_named(raw: RawTrace, pattern: re.Pattern) -> list[tuple]:
    """(correlation, tid, ts) of the runtime calls whose name matches, in time order. The names
    are few and interned, so each is matched once."""
    names = {api for _tid, _ts, _ext, api in raw.runtimes.values()}
    wanted = {api for api in names if pattern.search(api)}
    if not wanted:
        return []
    return sorted(((corr, tid, ts) for corr, (tid, ts, _ext, api) in raw.runtimes.items()
                   if api in wanted), key=lambda r: r[2])


def capture_windows(raw: RawTrace) -> list[tuple]:
    """(tid, begin ts, end ts) of each stream-capture window (...BeginCapture .. ...EndCapture
    on one thread), in time order."""
    begins: dict = {}
    windows = []
    for _corr, tid, ts in _runtimes_named(raw, CAPTURE_MARK_RE):
        api = raw.runtimes[_corr][3]
        if BEGIN_CAPTURE_RE.search(api):
            begins[tid] = ts
        elif tid in begins:
            windows.append((tid, begins.pop(tid), ts))
    return windows


def _unrun_launches_window(raw: RawTrace) -> list[tuple]:
    """A trace without capture markers: one window over the launches that ran no GPU activity
    (captured launches run nothing), on the thread that made most of them; [] if none."""
    ran = {a[2] for a in raw.activities}
    by_tid: dict = {}
    for corr, (tid, ts, _ext, api) in raw.runtimes.items():
        if corr not in ran and LAUNCH_RE.search(api):
            by_tid.setdefault(tid, []).append(ts)
    if not by_tid:
        return []
    tid, times = max(by_tid.items(), key=lambda item: len(item[1]))
    return [(tid, min(times), max(times))]


def _window_label(raw: RawTrace, tid, start: float, end: float, i: int) -> str:
    """The innermost annotation around a capture window (e.g. vLLM's capture_32_FULL)."""
    best = None
    for name, a_tid, a_ts, a_end in raw.capture_labels:
        if a_ts <= start and end <= a_end and (best is None or a_ts >= best[1]):
            best = (name, a_ts)
    return best[0] if best else f"graph {i + 1}"


def graphs_of_capture(path: Path, raw: RawTrace, topk: int | None = None) -> list[CapturedGraph]:
    """The graphs one capture trace holds (one per capture window); `topk`: harvest --topk."""
    windows = capture_windows(raw)
    if not windows and not graph_launches(raw):   # a replay is no capture
        windows = _unrun_launches_window(raw)
    if not windows:
        return []
    index = index_ops(raw.ops)
    capture_notes: list = []
    calls, _unparsed, _empty = select_calls(raw.ops, capture_notes, topk)
    mark_compiled(calls, raw.ops, raw.compiled_regions)
    call_at = {i: c for i, c in calls.items()}
    launches_by_tid: dict = {}
    for corr, (tid, ts, ext, api) in raw.runtimes.items():
        if LAUNCH_RE.search(api):
            launches_by_tid.setdefault(tid, []).append((ts, corr, ext, api))
    for lst in launches_by_tid.values():
        lst.sort(key=lambda x: x[0])
    graphs = []
    for i, (tid, start, end) in enumerate(windows):
        launches = []
        for ts, corr, ext, api in launches_by_tid.get(tid, []):
            if not start <= ts <= end:
                continue
            inner = index.innermost(tid, ts)
            owner = call_owner(index.ops, inner, call_at) if inner >= 0 else -1
            call = call_at.get(owner) if owner >= 0 else None
            in_op = call is not None or (ext is not None and ext in raw.cpu_ext)
            launches.append(CapturedLaunch(api_kind(api), raw.launch_kernels.get(corr), call,
                                           in_op))
        window_calls = [c for j, c in sorted(call_at.items())
                        if index.ops[j].tid == tid and start <= c.ts <= end]
        window_calls.sort(key=lambda c: c.ts)
        ms = Counter(c.m for c in window_calls if c.family == "gemm" and c.batch == 1)
        graphs.append(CapturedGraph(path.name, _window_label(raw, tid, start, end, i), launches,
                                    window_calls, ms.most_common(1)[0][0] if ms else None,
                                    len(raw.compiled_regions),
                                    [f"{path.name}: {n}" for n in capture_notes]))
    return graphs


def read_captures(paths: list, topk: int | None = None) -> list[CapturedGraph]:
    """The graphs of the capture traces; a capture trace without any capture window is an
    error (it is no capture). `topk`: harvest --topk (transformers' grouped-mm experts)."""
    check_topk(topk)
    graphs: list[CapturedGraph] = []
    for p in paths:
        p = Path(p)
        header = read_header(p)
        if not header.get("has_events"):
            raise TunerError(f"{p}: JSON without traceEvents, not a torch profiler trace")
        raw = read_events(p, header["format"])
        found = graphs_of_capture(p, raw, topk)
        if not found:
            raise TunerError(f"{p}: no graph capture in it (no cudaStreamBeginCapture / "
                             "hipStreamBeginCapture ... EndCapture, no launch that ran nothing): "
                             "not a capture trace")
        graphs.extend(found)
    return graphs


# ----------------------------------------------------------------------------------- the replay
def graph_launches(raw: RawTrace) -> dict:
    """{correlation: (tid, ts)} of the replay's graph launches."""
    return {corr: (tid, ts) for corr, tid, ts in _runtimes_named(raw, GRAPH_LAUNCH_RE)}


def _matches(graph: CapturedGraph, kinds: list, names: list) -> bool:
    if len(graph.launches) != len(kinds):
        return False
    for launch, kind, name in zip(graph.launches, kinds, names):
        if launch.kind != kind or (launch.kernel is not None and launch.kernel != name):
            return False
    return True


def _choose(candidates: list[CapturedGraph], tokens: int | None) -> tuple:
    """(graph, "") or (None, why not)."""
    distinct: dict = {}
    for g in candidates:
        distinct.setdefault(g.signature(), g)
    if len(distinct) == 1:
        return next(iter(distinct.values())), ""
    if tokens is not None:
        fits = [g for g in distinct.values() if g.batch is not None and g.batch >= tokens]
        if fits:
            smallest = min(g.batch for g in fits)
            best = [g for g in fits if g.batch == smallest]
            if len(best) == 1:
                return best[0], ""
    return None, (f"matches {len(distinct)} different captured graphs "
                  f"({', '.join(sorted({g.label for g in distinct.values()}))}) and the step does "
                  "not say which (pass the capture of one batch size)")


def join_replay(raw: RawTrace, graphs: list[CapturedGraph], step_tokens) -> GraphJoin:
    """Join the replay's graph launches with the captured graphs (see the module docstring).

    `step_tokens(ts)` gives the token count of the replay step at ts, or None.
    """
    join = GraphJoin()
    launches = graph_launches(raw)
    if not launches:
        return join
    by_launch: dict = {corr: [] for corr in launches}
    for idx, (ts, _dur, corr, _ext, _name) in enumerate(raw.activities):
        if corr in by_launch:
            by_launch[corr].append((ts, idx))
    join.n_launches = len(launches)
    for corr, (tid, launch_ts) in sorted(launches.items(), key=lambda item: item[1][1]):
        run = [idx for _ts, idx in sorted(by_launch[corr])]
        kinds = [activity_kind(raw.activities[i][4]) for i in run]
        names = [raw.activities[i][4] for i in run]
        candidates = [g for g in graphs if _matches(g, kinds, names)]
        if not candidates:
            join.problems.append(f"a graph launch of {len(run)} kernels matches no captured graph")
            continue
        graph, why = _choose(candidates, step_tokens(launch_ts))
        if graph is None:
            join.problems.append(f"a graph launch of {len(run)} kernels {why}")
            continue
        instances = {id(c): replace(c, ts=launch_ts, gpu_us=0.0, n_kernels=0, kernels={})
                     for c in graph.calls}
        join.calls.extend(instances.values())
        for idx, launch in zip(run, graph.launches):
            call = instances.get(id(launch.call)) if launch.call is not None else None
            join.assignments[idx] = (call, launch.in_op)
        join.n_joined += 1
        join.kernels_joined += len(run)
        join.graphs_used[f"{graph.source}: {graph.label}"] += 1
    return join
