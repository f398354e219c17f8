"""`harvest()`: one rank's trace files -> the ShapeTable, written and reported."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from .. import shapetable
from ..errors import TunerError
from .files import resolve_pairs
from .graphs import read_captures
from .mlp import fold_gated_mlp
from .moe import check_topk
from .printing import report
from .shapes import regroup_kv_heads
from .table import aggregate
from .trace import read_trace

__all__ = ["HarvestResult", "check_kv_heads", "check_topk", "harvest"]


def check_kv_heads(kv_heads: int | None) -> None:
    """A TunerError unless `kv_heads` is None or a positive count."""
    if kv_heads is not None and kv_heads < 1:
        raise TunerError(f"--kv-heads must be >= 1, got {kv_heads}")


@dataclass
class HarvestResult:
    table: pd.DataFrame
    traces: list
    output: Path | None = None
    captures: list = field(default_factory=list)   # the graph capture traces joined
    notes: list = field(default_factory=list)      # notes on the table (harvest --gated-mlp)


def harvest(paths: list, output=None, *, rank: int | None = None, steps: int | None = None,
            phase: str | None = None, quiet: bool = False, capture: list | None = None,
            device_name: str | None = None, kv_heads: int | None = None,
            topk: int | None = None, gated_mlp: bool = False) -> HarvestResult:
    """Harvest one rank's trace(s) into a ShapeTable; write it when `output` is given.

    `capture`: the traces of the CUDA/HIP-graph captures whose replays `paths` hold (else a
    capture_traces/ folder beside the traces of a profiler directory is used); `device_name`
    names the GPU when a trace does not; `kv_heads`: the model's KV heads, to read decode
    attention calls on a repeated KV cache as the grouped call serving runs
    (shapes.regroup_kv_heads; a note on each trace says how many calls were read so); `topk`:
    the model's top-k (num_experts_per_tok), to read transformers' grouped-mm experts (two
    aten::_grouped_mm calls a block, rows m * topk) as one moe call each (moe.grouped_mm_calls;
    a note on each trace says how many were read, and why any were left out); `gated_mlp`: read
    each dense gated MLP's gate, up and down linear rows as one moe row of experts 1, top-k 1
    (mlp.fold_gated_mlp; its notes, after `--gated-mlp: `, are the result's `notes`).
    """
    check_kv_heads(kv_heads)
    check_topk(topk)
    replays, captures = resolve_pairs(list(paths), rank, capture)
    graphs = read_captures(captures, topk) if captures else []
    traces = [read_trace(f, steps=steps, graphs=graphs, device_name=device_name, topk=topk)
              for f in replays]
    if kv_heads is not None:
        for t in traces:
            n = regroup_kv_heads(t.calls, kv_heads)
            t.notes.append(f"--kv-heads {kv_heads}: {n} decode attention call(s) recorded on a "
                           f"repeated KV cache (kv_heads = heads) read as the grouped call"
                           if n else f"--kv-heads {kv_heads}: no decode attention call with as "
                           "many KV heads as query heads, a multiple of it: nothing regrouped")
    table = aggregate(traces, phase)
    notes: list = []
    if gated_mlp:
        table, folded = fold_gated_mlp(table)
        notes = [f"--gated-mlp: {note}" for note in folded]
    result = HarvestResult(table, traces, captures=[str(c) for c in captures], notes=notes)
    if output is not None:
        try:
            result.output = shapetable.write(table, output)
        except OSError as exc:  # a directory, under a file, read-only (the CLI checks first)
            raise TunerError(f"-o {output}: cannot write the table: "
                             f"{exc.strerror or exc}") from None
    if not quiet:
        report(result)
    return result
