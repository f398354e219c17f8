"""`harvest()`: one rank's trace files -> the ShapeTable, written and reported."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .. import shapetable
from .aggregate import aggregate
from .files import resolve_inputs
from .printing import report
from .trace import read_trace

__all__ = ["HarvestResult", "harvest"]


@dataclass
class HarvestResult:
    table: pd.DataFrame
    traces: list
    output: Path | None = None


def harvest(paths: list, output=None, *, rank: int | None = None, steps: int | None = None,
            phase: str | None = None, quiet: bool = False) -> HarvestResult:
    """Harvest one rank's trace(s) into a ShapeTable; write it when `output` is given."""
    files = resolve_inputs(list(paths), rank)
    traces = [read_trace(f, steps=steps) for f in files]
    table = aggregate(traces, phase)
    result = HarvestResult(table, traces)
    if output is not None:
        result.output = shapetable.write(table, output)
    if not quiet:
        report(result)
    return result
