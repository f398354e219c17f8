"""What `tuner harvest` prints: the warnings, the step summary and the top rows by share."""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

import pandas as pd

from ..errors import warn
from . import config

__all__ = ["report", "summarize", "format_table"]


def report(result, top: int = 12, stream=None) -> None:
    """Print the warnings, the step summary and the top rows by share of a HarvestResult."""
    stream = stream or sys.stdout
    for t in result.traces:
        for note in t.notes:
            warn(f"{Path(t.path).name}: {note}")
        if not t.has_gpu:
            warn(f"{Path(t.path).name}: CPU-only trace (no GPU kernels): shapes and calls per step "
                 "are real, GPU times are unknown (us_per_call, step_gpu_us, share are NaN)")
        elif (t.gpu_total_us > 0
              and t.gpu_unattributed_us / t.gpu_total_us > config.UNATTRIBUTED_WARN):
            hint = ("" if t.graph is not None else "; pass the trace of the graph capture with "
                    "--capture to join them, or profile eagerly (no graphs)")
            warn(f"{Path(t.path).name}: {100 * t.gpu_unattributed_us / t.gpu_total_us:.1f}% of GPU "
                 f"time ({t.n_unattributed} kernels) has no owning op (e.g. CUDA-graph replays) "
                 f"and is in no row{hint}")
    for note in getattr(result, "notes", []):     # on the table (harvest --gated-mlp)
        warn(note)
    unknown = [Path(t.path).name for t in result.traces if not t.device_known]
    if unknown:
        warn(f"{', '.join(unknown)}: the trace names no GPU (deviceProperties has no name): "
             "device 'unknown'; pass --device-name NAME (e.g. 'AMD Instinct MI300X') so budget "
             "picks the right device profile")
    for line in summarize(result):
        print(line, file=stream)
    df = result.table
    replayed = any(t.graph is not None and t.graph.n_joined for t in result.traces)
    for ph in ("prefill", "decode", "other"):
        rows = df[df.phase == ph]
        if rows.empty or replayed:    # a graph replay is graph-captured already
            continue
        step_us, gpu_us = rows.step_us.iloc[0], rows.step_gpu_us.iloc[0]
        if step_us > 0 and not math.isnan(gpu_us) and gpu_us / step_us < config.LAUNCH_BOUND:
            warn(f"the {ph} step is launch-bound: the GPU is busy {100 * gpu_us / step_us:.0f}% "
                 f"of the step ({gpu_us:.0f} of {step_us:.0f} us); kernel savings will not show "
                 "until the step is graph-captured (CUDA/HIP graphs)")
    print(format_table(df, top), file=stream)
    if result.output is not None:
        print(f"wrote {len(df)} rows to {result.output}", file=stream)


def summarize(result) -> list[str]:
    """One line per trace (device, calls, steps per phase) and its GPU time split."""
    lines = []
    for t in result.traces:
        phases: dict = {}
        for s in t.steps:
            phases.setdefault(s.phase, []).append(s)
        parts = []
        for ph, st in phases.items():
            wall = statistics.median([s.wall_us for s in st])
            parts.append(f"{ph} {sum(s.weight for s in st)} (median {wall / 1000:.2f} ms)")
        lines.append(f"{Path(t.path).name}: {t.device} [{t.backend}], {len(t.calls)} calls; steps "
                     f"from {t.steps_from}: {', '.join(parts)}")
        if t.has_gpu and t.gpu_total_us > 0:
            lines.append(f"  GPU time: {100 * t.gpu_in_calls_us / t.gpu_total_us:.1f}% in GEMM/"
                         f"attention/MoE calls, "
                         f"{100 * t.gpu_other_ops_us / t.gpu_total_us:.1f}% other "
                         f"ops, {100 * t.gpu_unattributed_us / t.gpu_total_us:.1f}% unattributed")
        g = t.graph
        if g is not None and g.n_launches:
            used = ", ".join(f"{name}" + (f" x{n}" if n > 1 else "")
                             for name, n in g.graphs_used.items())
            share = 100 * t.gpu_joined_us / t.gpu_total_us if t.gpu_total_us > 0 else 0.0
            lines.append(f"  graph replay: {g.n_joined} of {g.n_launches} graph launches joined "
                         f"with the capture ({used}): {g.kernels_joined} kernels, {share:.1f}% "
                         "of the replay's GPU time")
    return lines


def format_table(df: pd.DataFrame, top: int = 12) -> str:
    cols = ["op", "phase", "m", "n", "k", "batch", "dtype", "layout", "calls_per_step",
            "us_per_call", "share"]
    view = df.head(top)[cols].copy()
    view["op"] = view["op"].str.replace("aten::", "", regex=False)
    view["share"] = (100 * view["share"]).map(lambda v: "n/a" if pd.isna(v) else f"{v:.2f}%")
    view["us_per_call"] = view["us_per_call"].map(lambda v: "n/a" if pd.isna(v) else f"{v:.2f}")
    view["calls_per_step"] = view["calls_per_step"].map(lambda v: f"{v:g}")
    title = f"top {len(view)} of {len(df)} rows by share of the step:"
    return title + "\n" + view.to_string(index=False)
