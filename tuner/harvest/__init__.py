"""`tuner harvest`: real call shapes from torch profiler (Kineto / Chrome) traces.

A trace is read once, streaming, keeping only what the table needs (config.py declares it):
GEMM/attention CPU ops, runtime launches, GPU activities and step annotations. Then calls are
chosen among the nested ops and each GPU activity is given to the call that launched it
(attribution.py), steps come from markers and get a phase (steps.py), and the calls are grouped
by signature and phase into the ShapeTable (table.py).

Modules: config (what is kept, as data), reading (files, header, the event stream), shapes
(m/n/k from Input Dims), attribution, steps, graphs (capture + replay join), trace (one file ->
TraceData), table (calls -> ShapeTable rows), files (directories, ranks, capture folders),
pipeline (`harvest`), mlp (`--gated-mlp`: dense gated MLPs as moe rows), printing, profiling
(`live`), watching (`watch`).
"""

from .files import (
    CAPTURE_DIR,
    default_output,
    is_trace_file,
    resolve_inputs,
    resolve_pairs,
    trace_rank,
)
from .graphs import read_captures
from .mlp import fold_gated_mlp
from .pipeline import HarvestResult, check_kv_heads, check_topk, harvest
from .printing import format_table, report, summarize
from .profiling import live, load_callable
from .records import Call, Op, Step, TraceData, union_length
from .shapes import attention_shape, gemm_shape
from .table import KEY_FIELDS, aggregate
from .trace import fused_neighbours, kernel_totals, read_trace
from .watching import watch

__all__ = [
    "harvest", "HarvestResult", "check_kv_heads", "check_topk", "report", "summarize",
    "format_table", "fold_gated_mlp",
    "read_trace", "kernel_totals", "fused_neighbours", "TraceData", "aggregate", "KEY_FIELDS",
    "resolve_inputs", "resolve_pairs", "CAPTURE_DIR", "default_output", "trace_rank",
    "is_trace_file", "read_captures",
    "live", "load_callable", "watch",
    "gemm_shape", "attention_shape", "union_length", "Op", "Call", "Step",
]
