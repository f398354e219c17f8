"""One trace file -> TraceData: its calls (with shapes and GPU times) and its steps (with phases).

read -> select calls -> steps -> GPU attribution -> drop empty steps -> phases.
"""

from __future__ import annotations

import contextlib
import gc
from collections import Counter
from pathlib import Path

from ..errors import TunerError
from . import config
from .attribution import attribute_activities, index_ops, mark_compiled, select_calls
from .files import trace_rank
from .graphs import capture_windows, graph_launches, join_replay
from .moe import check_topk, grouped_mm_none
from .reading import OP_WITHOUT_TIME, read_events, read_header
from .records import RawTrace, Step, TraceData
from .shapes import complete_decode_attention, split_linears
from .steps import classify_steps, step_of, steps_from_markers, whole_trace_steps

__all__ = ["fused_neighbours", "kernel_totals", "read_trace"]


@contextlib.contextmanager
def _no_gc():
    """Pause the cyclic GC: the parse keeps ~10^6 small acyclic objects alive, and the collector
    re-scanning them as they pile up costs more than the parse (39 s -> 23 s on a 1 GB trace)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def read_trace(path, steps: int | None = None, *, graphs: list | None = None,
               device_name: str | None = None, topk: int | None = None) -> TraceData:
    """Parse one trace file into its calls and steps (see the module docstring).

    `graphs` (graphs.read_captures) are the CUDA/HIP graphs captured for this replay trace: its
    graph launches are joined with them. `device_name` names the GPU when the trace does not.
    `topk` (harvest --topk): read transformers' grouped-mm experts as moe calls of this top-k.
    """
    check_topk(topk)
    with _no_gc():
        return _read_trace(Path(path), steps, graphs or [], device_name, topk)


def compiled_kernels(raw: RawTrace) -> int:
    """How many of the trace's GPU kernels torch.compile (Inductor) generated (its triton_poi_ /
    triton_red_ / ... names, config.INDUCTOR_KERNEL_RE): a torch.compile'd step has hundreds."""
    names = [a[4] for a in raw.activities] or list(raw.launch_kernels.values())
    return sum(1 for name in names if config.INDUCTOR_KERNEL_RE.match(str(name)))


def _mark_compiled_calls(raw: RawTrace, call_of_op: dict, graphs: list, calls: list,
                         compiled: int, notes: list) -> None:
    """traced_compiled = 1 on the calls a torch.compile'd graph ran: per call where Inductor's
    graph-call ranges are in the trace (or in the captures joined with it), else, when Inductor's
    kernels are, on every call of the trace (older torch records no such range)."""
    regions = len(raw.compiled_regions) + sum(g.compiled_regions for g in graphs)
    mark_compiled(call_of_op, raw.ops, raw.compiled_regions)  # captured calls: graphs_of_capture
    if regions:
        inside = sum(1 for c in calls if c.traced_compiled == 1)
        eager = len(calls) - inside
        if inside:
            notes.append(f"a torch.compile'd step: {inside} of {len(calls)} calls ran inside "
                         "Inductor's compiled graphs; their rows say so (traced_compiled) and "
                         "rank times their baseline compiled"
                         + (f"; {eager} ran eager outside them" if eager else ""))
        return
    if compiled:
        for c in calls:
            c.traced_compiled = 1
        notes.append(f"a torch.compile'd step ({compiled} Inductor kernels, no record of which "
                     "calls its graphs ran): every row says so (traced_compiled), and rank times "
                     "their baseline compiled")


def _check_raw(path: Path, raw: RawTrace, notes: list, joining: bool) -> None:
    """The errors a trace with nothing to harvest gets, and the notes on what was skipped.
    A replay joined with captures may hold no shaped op itself (the capture has the shapes)."""
    untimed = raw.malformed.get(OP_WITHOUT_TIME, 0)
    if raw.malformed:
        n = sum(raw.malformed.values())
        what = "; ".join(f"{why}: {k}" for why, k in sorted(raw.malformed.items()))
        notes.append(f"{n} malformed events skipped ({what})"
                     + (f"; a call whose every op lacks its times is missing from the table"
                        if untimed else ""))
    if untimed and not raw.ops and not joining:
        raise TunerError(f"{path}: none of its {untimed} GEMM/attention ops has a usable start "
                         "time, duration and thread (ts, dur, tid), so which op is the call "
                         "(linear > matmul > mm) and which kernels it launched cannot be told; "
                         "re-export the trace with complete events")
    if raw.n_cpu_ops == 0 and not raw.activities:
        skipped = f" ({notes[-1]})" if raw.malformed else ""
        raise TunerError(f"{path}: the trace has no CPU ops and no GPU kernels (empty trace)"
                         f"{skipped}")
    if joining:
        return
    ops = raw.ops
    if not ops:
        kind = "CPU-only trace, " if not raw.activities else ""
        raise TunerError(f"{path}: {kind}no GEMM or attention ops (aten::mm/addmm/bmm/linear/"
                         f"matmul, scaled_dot_product_attention, flash-attention) among its "
                         f"{raw.n_cpu_ops} CPU ops; nothing to harvest")
    if raw.n_cpu_ops_with_dims == 0 or raw.n_gemm_like_no_dims == len(ops):
        raise TunerError(f"{path}: recorded without record_shapes ({len(ops)} GEMM/attention ops "
                         "but no Input Dims); re-capture with "
                         "torch.profiler.profile(record_shapes=True)")
    if raw.n_gemm_like_no_dims:
        notes.append(f"{raw.n_gemm_like_no_dims} GEMM/attention ops had no Input Dims and are "
                     "skipped")


def _steps(raw: RawTrace, steps: int | None, notes: list) -> tuple[list[Step], str]:
    step_list, steps_from = steps_from_markers(raw.annotations)
    if step_list and steps:
        notes.append(f"--steps {steps} ignored: the trace has step markers ({steps_from})")
    if not step_list:
        step_list, steps_from = whole_trace_steps(raw.first_ts, raw.last_ts, steps, notes)
    return step_list, steps_from


def _assign_calls(calls: list, step_list: list[Step]) -> int:
    """Set each call's step; return how many fall outside every step."""
    starts = [s.start for s in step_list]
    outside = 0
    for c in calls:
        c.step = step_of(starts, step_list, c.ts)
        if c.step < 0:
            outside += 1
        else:
            step_list[c.step].n_calls += 1
    return outside


def _drop_empty_steps(step_list: list[Step], calls: list, notes: list) -> list[Step]:
    """Drop steps with no call and no GPU activity (e.g. the ProfilerStep the profiler opens when
    it stops), renumbering the calls' steps."""
    kept = [j for j, s in enumerate(step_list) if s.n_calls or s.intervals]
    if len(kept) == len(step_list):
        return step_list
    remap = {old: new for new, old in enumerate(kept)}
    dropped = len(step_list) - len(kept)
    for c in calls:
        c.step = remap.get(c.step, -1)
    if kept:
        notes.append(f"{dropped} empty step marker(s) ignored")
    return [step_list[j] for j in kept]


def _read_trace(path: Path, steps: int | None, graphs: list, device_name: str | None,
                topk: int | None) -> TraceData:
    header = read_header(path)
    if not header.get("has_events"):
        raise TunerError(f"{path}: JSON without traceEvents, not a torch profiler trace")
    raw = read_events(path, header["format"])
    notes: list[str] = []
    joining = bool(graphs) and bool(graph_launches(raw))
    _check_raw(path, raw, notes, joining)

    index = index_ops(raw.ops)
    call_of_op, unparsed, empty = select_calls(raw.ops, notes, topk)
    if unparsed:
        notes.append(f"{unparsed} GEMM/attention ops whose dims give no GEMM or attention shape "
                     "(e.g. a matrix-vector matmul) are skipped")
    if empty:
        notes.append(f"{empty} GEMM/attention calls with a zero size in their dims (an empty "
                     "tensor, or a damaged trace) are skipped: no work to tune")
    if not call_of_op and not joining:
        why = "; ".join(notes[-(bool(unparsed) + bool(empty)):]) if unparsed or empty else ""
        raise TunerError(f"{path}: no GEMM or attention call with a usable shape"
                         + (f" ({why})" if why else ""))
    windows = [] if graphs else capture_windows(raw)
    if windows:
        notes.append(f"it holds {len(windows)} CUDA/HIP-graph capture(s): their calls "
                     "ran no kernels here; pass this trace with --capture beside the replay trace "
                     "to give them the replay's GPU times")

    step_list, steps_from = _steps(raw, steps, notes)
    join = _join(path, raw, graphs, step_list, notes) if graphs else None
    calls = list(call_of_op.values()) + (join.calls if join else [])
    if join:
        notes.extend(dict.fromkeys(n for g in graphs for n in g.notes))
    if topk is not None and not any(config.GROUPED_MM_OP in n for n in notes):
        notes.append(grouped_mm_none(topk))
    outside = _assign_calls(calls, step_list)
    split = attribute_activities(raw, index, call_of_op, step_list, notes,
                                 joined=join.assignments if join else None)
    step_list = _drop_empty_steps(step_list, calls, notes)
    if outside:
        notes.append(f"{outside} calls outside any step are not counted")
    calls = [c for c in calls if c.step >= 0]
    if not calls:
        raise TunerError(f"{path}: no GEMM or attention call falls inside a step")
    classify_steps(step_list, calls, raw.annotations)
    completed = complete_decode_attention(calls, step_list)
    if completed:
        notes.append(f"{completed} decode attention calls without a batch in their dims (paged "
                     "KV cache): q_len 1 and batch = query tokens; kv_len from the step marker "
                     "where the dims do not give it")

    compiled = compiled_kernels(raw)
    _mark_compiled_calls(raw, call_of_op, graphs, calls, compiled, notes)
    multi = [c for c in calls if c.linears > 1]
    if multi:
        notes.append(f"{len(multi)} fused Inductor kernels (matrix-vector reductions) computed "
                     f"{sum(c.linears for c in multi)} linear calls, several at a time: each "
                     "counts as a call with an equal share of its kernel's time")
        calls = split_linears(calls)

    rank = trace_rank(path) if config.RANK_RE.search(path.name) else (
        (header.get("distributedInfo") or {}).get("rank"))
    device, known = _device_name(header, raw, device_name)
    return TraceData(path=str(path), device=device, backend=raw.backend,
                     rank=rank if isinstance(rank, int) else None, has_gpu=bool(raw.activities),
                     calls=calls, steps=step_list,
                     gpu_total_us=split.total_us, gpu_in_calls_us=split.in_calls_us,
                     gpu_other_ops_us=split.other_ops_us,
                     gpu_unattributed_us=split.unattributed_us,
                     n_unattributed=split.n_unattributed, steps_from=steps_from, notes=notes,
                     graph=join, gpu_joined_us=split.joined_us, device_known=known,
                     compiled_kernels=compiled)


def _join(path: Path, raw: RawTrace, graphs: list, step_list: list[Step], notes: list):
    """Join the replay's graph launches with the captured graphs; refuse when none matches."""
    if not graph_launches(raw):
        notes.append("no graph launches (cudaGraphLaunch / hipGraphLaunch) in it: the capture "
                     "traces are not used")
        return None
    starts = [s.start for s in step_list]

    def step_tokens(ts):
        j = step_of(starts, step_list, ts)
        return step_list[j].tokens if j >= 0 else None

    join = join_replay(raw, graphs, step_tokens)
    if not join.n_joined:
        sizes = sorted({len(g.launches) for g in graphs})
        raise TunerError(f"{path}: its {join.n_launches} graph launch(es) match none of the "
                         f"{len(graphs)} captured graph(s) ({', '.join(map(str, sizes))} launches; "
                         f"{join.problems[0]}): the replay and capture traces do not belong "
                         "together")
    if join.problems:
        worst = Counter(join.problems).most_common(1)[0][0]
        notes.append(f"{join.n_launches - join.n_joined} of {join.n_launches} graph launches not "
                     f"joined ({worst}); their kernels are in no row")
    return join


def _device_name(header: dict, raw: RawTrace, given: str | None) -> tuple[str, bool]:
    """The GPU's name (and whether the trace said it): deviceProperties, a top-level device name,
    or a GPU process label in the metadata; `given` (--device-name) wins."""
    if not raw.activities:
        return "cpu", True
    if given:
        return given, True
    props = header.get("deviceProperties") or []
    if isinstance(props, list):
        named = [p for p in props if isinstance(p, dict) and isinstance(p.get("name"), str)
                 and p["name"].strip()]
        for p in named:
            if p.get("id") in raw.device_ids:
                return p["name"], True
        if named:
            return named[0]["name"], True
    for key in ("deviceName", "device_name"):
        if isinstance(header.get(key), str) and header[key].strip():
            return header[key], True
    for label in raw.device_labels:
        if config.GPU_NAME_RE.search(label):
            return label, True
    return "unknown", False


def kernel_totals(path) -> tuple[dict, int]:
    """Every GPU activity of a trace by name: ({name: (µs per step, launches per step)}, steps).

    Steps are the trace's step markers (e.g. torch.profiler's ProfilerStep#N), else the whole
    trace is one step. What `tuner ab` uses to name the kernels outside the attributed shapes
    whose time changed between two arms."""
    path = Path(path)
    header = read_header(path)
    if not header.get("has_events"):
        raise TunerError(f"{path}: JSON without traceEvents, not a torch profiler trace")
    with _no_gc():
        raw = read_events(path, header["format"])
    steps = len(steps_from_markers(raw.annotations)[0]) or 1
    totals: dict = {}
    for _ts, dur, _corr, _ext, name in raw.activities:
        us, count = totals.get(name, (0.0, 0))
        totals[name] = (us + float(dur), count + 1)
    return {name: (us / steps, count / steps) for name, (us, count) in totals.items()}, steps


# The words fused_neighbours reports, in this order (config.INDUCTOR_FUSED_RE: the ops an
# Inductor kernel fused, e.g. a residual add and an RMSNorm with a linear's mm).
FUSED_WORDS = ("RMSNorm", "LayerNorm", "residual add", "SiLU", "rotary", "embedding")
# an add among these is a position's, rotary's or a scatter's, not the residual stream's
_NOT_RESIDUAL = frozenset({"arange", "index", "scatter", "cat", "neg", "cos", "sin"})


def _kernel_neighbours(ops: set) -> set:
    words = set()
    if "rsqrt" in ops:
        words.add("LayerNorm" if ops & {"sub", "var"} else "RMSNorm")
    if "add" in ops and not ops & _NOT_RESIDUAL:
        words.add("residual add")
    if "silu" in ops:
        words.add("SiLU")
    if ops & {"cos", "sin"}:
        words.add("rotary")
    if "embedding" in ops:
        words.add("embedding")
    return words


def fused_neighbours(kernels) -> list[str]:
    """What a compiled step computes inside its linears' kernels besides the matmul: the
    FUSED_WORDS of every Inductor kernel among `kernels` whose fused ops include a linear's
    matmul (`mm`, `addmm` with a bias), e.g. ['RMSNorm', 'residual add'] for max-autotune's
    batch-1 reduction that normalises the hidden state and multiplies it by the weight in one
    kernel. An exported linear is an opaque op to Inductor: these run as kernels of their own
    beside it. Read from names only: a norm is told by its rsqrt (LayerNorm where it also
    subtracts the mean), an add is the residual's unless the kernel also makes positions,
    rotary or a scatter."""
    words: set = set()
    for name in kernels:
        m = config.INDUCTOR_FUSED_RE.match(str(name))
        ops = set(m.group(1).split("_")) if m else set()
        if ops & {"mm", "addmm"} and "grouped_mm" not in m.group(1):  # MoE's is no linear
            words |= _kernel_neighbours(ops)
    return [w for w in FUSED_WORDS if w in words]
