"""`harvest()`: one rank's trace files -> the ShapeTable, written and reported."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from .. import shapetable
from .files import resolve_pairs
from .graphs import read_captures
from .printing import report
from .table import aggregate
from .trace import read_trace

__all__ = ["HarvestResult", "harvest"]


@dataclass
class HarvestResult:
    table: pd.DataFrame
    traces: list
    output: Path | None = None
    captures: list = field(default_factory=list)   # the graph capture traces joined


def harvest(paths: list, output=None, *, rank: int | None = None, steps: int | None = None,
            phase: str | None = None, quiet: bool = False, capture: list | None = None,
            device_name: str | None = None) -> HarvestResult:
    """Harvest one rank's trace(s) into a ShapeTable; write it when `output` is given.

    `capture`: the traces of the CUDA/HIP-graph captures whose replays `paths` hold (else a
    capture_traces/ folder beside the traces of a profiler directory is used); `device_name`
    names the GPU when a trace does not.
    """
    replays, captures = resolve_pairs(list(paths), rank, capture)
    graphs = read_captures(captures) if captures else []
    traces = [read_trace(f, steps=steps, graphs=graphs, device_name=device_name)
              for f in replays]
    table = aggregate(traces, phase)
    result = HarvestResult(table, traces, captures=[str(c) for c in captures])
    if output is not None:
        result.output = shapetable.write(table, output)
    if not quiet:
        report(result)
    return result
