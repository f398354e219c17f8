"""Which op is a call, and which call (and step) each GPU activity belongs to.

1. GEMM ops nest (linear -> matmul -> mm): by time containment on the same thread, the innermost
   GEMM-family op is the call; an attention op and everything under it is one attention call.
2. Each GPU activity goes to the op that launched it: its runtime event (same correlation id) lies
   inside the op on the same thread; without a runtime event the activity's own External id is
   used. A split-K reduce kernel is launched inside its GEMM op, so it counts for that GEMM.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from .moe import grouped_mm_calls, grouped_mm_hint, grouped_mm_notes, moe_call, moe_notes
from .records import Call, Op, RawTrace, Step
from .shapes import call_and_empty_size
from .steps import step_of

__all__ = ["OpIndex", "index_ops", "call_owner", "select_calls", "mark_compiled", "GpuSplit",
           "ext_is_correlation", "attribute_activities"]


@dataclass
class OpIndex:
    """The GEMM/attention ops of a trace, nested per thread, for "which op holds this launch"."""
    ops: list                # Op, with .parent set
    by_tid: dict             # tid -> (starts, op indices) sorted by start

    def innermost(self, tid, ts: float) -> int:
        """The innermost op on thread `tid` whose interval contains `ts`, or -1."""
        entry = self.by_tid.get(tid)
        if entry is None:
            return -1
        starts, idx = entry
        j = bisect.bisect_right(starts, ts) - 1
        if j < 0:
            return -1
        # The op that started last before ts contains it, or one of its ancestors does (ops
        # nest): an op containing ts that started earlier also contains that op.
        i = idx[j]
        ops = self.ops
        while i >= 0:
            if ops[i].ts <= ts <= ops[i].end:
                return i
            i = ops[i].parent
        return -1


def index_ops(ops: list[Op]) -> OpIndex:
    """Set each op's parent (innermost enclosing GEMM/attention op on its thread)."""
    by_tid: dict = {}
    for i, op in enumerate(ops):
        by_tid.setdefault(op.tid, []).append(i)
    index = {}
    for tid, idx in by_tid.items():
        idx.sort(key=lambda i: (ops[i].ts, -ops[i].end))
        stack: list[int] = []
        for i in idx:
            op = ops[i]
            while stack and ops[stack[-1]].end < op.ts:
                stack.pop()
            # a child must end within its parent (tiny float slack)
            while stack and ops[stack[-1]].end + 1e-3 < op.end:
                stack.pop()
            op.parent = stack[-1] if stack else -1
            stack.append(i)
        index[tid] = ([ops[i].ts for i in idx], idx)
    for op in ops:
        if op.kind == "gemm":
            p = op.parent
            while p >= 0:
                ops[p].has_gemm_child = True
                p = ops[p].parent
    return OpIndex(ops, index)


def _attention_call_above(ops: list[Op], i: int, calls: dict) -> int:
    """The outermost attention call among op i and its ancestors, or -1."""
    found = -1
    while i >= 0:
        if ops[i].kind == "attention" and i in calls:
            found = i
        i = ops[i].parent
    return found


def _moe_op_above(ops: list[Op], i: int) -> int:
    """The outermost MoE op (kind "moe") among op i and its ancestors, or -1."""
    found = -1
    while i >= 0:
        if ops[i].kind == "moe":
            found = i
        i = ops[i].parent
    return found


def _grouped_call_above(ops: list[Op], i: int) -> int:
    """The moe call (its op index) of a grouped matmul pair that op i is, or is inside, or -1."""
    while i >= 0:
        if ops[i].grouped_call >= 0:
            return ops[i].grouped_call
        i = ops[i].parent
    return -1


def _grouped_mm_above(ops: list[Op], i: int) -> bool:
    """Whether op i lies inside a grouped matmul (kind grouped_mm), read as a call or not."""
    i = ops[i].parent
    while i >= 0:
        if ops[i].kind == "grouped_mm":
            return True
        i = ops[i].parent
    return False


def call_owner(ops: list[Op], i: int, calls: dict) -> int:
    """The call that a GPU activity launched inside op i belongs to, or -1 (another op's).

    Under an attention call: that call. Else the GEMM (or MoE) call op i is. Else, in either
    grouped matmul of a pair read as a moe call (harvest --topk), that call. Else, inside a MoE
    call, that call (its align / sort and expert GEMM kernels), except what the router's top-k
    op inside it launched (moe_topk: the router's, as the moe family takes topk_ids as input).
    A linear inside a MoE op (vLLM's shared experts) stays its own call."""
    attn = _attention_call_above(ops, i, calls)
    if attn >= 0:
        return attn
    if i in calls:
        return i
    grouped = _grouped_call_above(ops, i)
    if grouped >= 0:
        return grouped
    if ops[i].kind == "moe_topk":
        return -1
    moe = _moe_op_above(ops, i)
    return moe if moe in calls else -1


def select_calls(ops: list[Op], notes: list | None = None,
                 topk: int | None = None) -> tuple[dict, int, int]:
    """{op index: Call}, how many GEMM/attention ops gave no shape and how many calls had a
    zero size (shapes.call_and_empty_size: dropped).

    Attention calls first: the outermost attention op whose dims give a shape (an autograd
    wrapper without dims leaves the call to the op inside it). With `topk` (harvest --topk),
    transformers' grouped-mm experts: each pair of grouped matmuls of a block outside any MoE op
    is one moe call (moe.grouped_mm_calls), keyed by the up projection's op. Then GEMM calls:
    the innermost GEMM-family op, unless it is part of an attention call or inside a grouped
    matmul, read as a call or not (the CPU runs a grouped matmul as one mm per expert inside it:
    token counts of the routing, no call a serving build makes). Then MoE calls: the outermost
    MoE op, its shape from its dims and those of the MoE ops inside it (moe.moe_call). Why MoE
    ops or grouped matmuls gave no call (and how many pairs were read; without `topk`, how many
    grouped matmuls --topk would read) is appended to `notes`.
    """
    attention: dict[int, Call] = {}
    unparsed = empty = 0
    for i, op in enumerate(ops):
        if op.kind == "attention" and op.dims:
            c, zero = call_and_empty_size(op)
            if c is None:
                unparsed += 1
            elif zero:
                empty += 1
            else:
                attention[i] = c
    calls: dict[int, Call] = {i: c for i, c in attention.items()
                              if _attention_call_above(ops, ops[i].parent, attention) < 0}
    found_notes: list[str] = []
    grouped = [i for i, op in enumerate(ops) if op.kind == "grouped_mm"]
    for i in grouped:
        ops[i].grouped_call = -1
    if topk is not None:
        pairs, problems = grouped_mm_calls(
            ops, [i for i in grouped if _moe_op_above(ops, i) < 0], topk)
        for up, down, c in pairs:
            calls[up] = c
            ops[up].grouped_call = ops[down].grouped_call = up
        found_notes.extend(grouped_mm_notes(topk, len(pairs), problems))
    else:
        found_notes.extend(grouped_mm_hint(sum(_moe_op_above(ops, i) < 0 for i in grouped)))
    for i, op in enumerate(ops):
        if op.kind != "gemm" or not op.dims or op.has_gemm_child:
            continue
        if _attention_call_above(ops, op.parent, calls) >= 0 or _grouped_mm_above(ops, i):
            continue
        c, zero = call_and_empty_size(op)
        if c is None:
            unparsed += 1
        elif zero:
            empty += 1
        else:
            calls[i] = c
    moe_problems: list[str] = []
    members: dict = {}
    for j, op in enumerate(ops):
        if op.kind.startswith("moe"):
            top = _moe_op_above(ops, j)
            if top >= 0:
                members.setdefault(top, []).append(j)
    for i, inside in members.items():
        if _attention_call_above(ops, i, calls) >= 0:
            continue
        c, why = moe_call(ops, i, sorted((j for j in inside if j != i), key=lambda j: ops[j].ts))
        if c is not None:
            calls[i] = c
        else:
            moe_problems.append(why)
    if notes is not None:
        notes.extend(moe_notes(moe_problems) + found_notes)
    return calls, unparsed, empty


def mark_compiled(calls: dict, ops: list[Op], regions: list) -> int:
    """Set traced_compiled = 1 on each GEMM / attention call whose op starts inside one of
    `regions` on its thread ((tid, ts, end) of Inductor's compiled-graph calls,
    RawTrace.compiled_regions: they do not nest); return how many calls that marks."""
    spans: dict = {}
    for tid, start, end in regions:
        spans.setdefault(tid, []).append((start, end))
    starts = {}
    for tid, lst in spans.items():
        lst.sort()
        starts[tid] = [start for start, _ in lst]
    marked = 0
    for i, call in calls.items():
        if call.family == "moe":
            # the engines' MoE layer ops are custom ops a compiled graph calls as they are: the
            # call ran eager inside it (and the moe family's baseline is no Inductor graph)
            continue
        op = ops[i]
        j = bisect.bisect_right(starts.get(op.tid, []), op.ts) - 1
        if j >= 0 and op.ts <= spans[op.tid][j][1]:
            call.traced_compiled = 1
            marked += 1
    return marked


@dataclass
class GpuSplit:
    """Where a trace's GPU time went."""
    total_us: float = 0.0
    in_calls_us: float = 0.0
    other_ops_us: float = 0.0        # launched by a CPU op that is no GEMM/attention call
    unattributed_us: float = 0.0     # no owning op at all (e.g. CUDA-graph replays)
    n_unattributed: int = 0
    joined_us: float = 0.0           # replayed graph kernels joined to a captured launch


def _op_of_ext(ops: list[Op]) -> tuple[dict, int]:
    """{External id: op index} over the ops whose id no other op shares, and how many ids were
    shared (a kernel linked only through a shared id could belong to either op)."""
    seen: dict = {}
    shared: set = set()
    for i, op in enumerate(ops):
        if op.ext is None:
            continue
        if op.ext in seen:
            shared.add(op.ext)
        seen[op.ext] = i
    for ext in shared:
        del seen[ext]
    return seen, len(shared)


def ext_is_correlation(raw: RawTrace) -> bool:
    """Whether the GPU activities without a correlation carry their launch's correlation id as
    External id (some Kineto builds), rather than their op's: more of those ids name a runtime
    launch than a CPU op."""
    as_corr = as_op = 0
    for _ts, _dur, corr, ext, _name in raw.activities:
        if corr is None and ext is not None:
            is_corr, is_op = ext in raw.runtimes, ext in raw.cpu_ext
            if is_corr and not is_op:
                as_corr += 1
            elif is_op and not is_corr:
                as_op += 1
    return as_corr > as_op


def attribute_activities(raw: RawTrace, index: OpIndex, calls: dict, steps: list[Step],
                         notes: list | None = None, joined: dict | None = None) -> GpuSplit:
    """Give each GPU activity to its call (GPU time, kernel names) and to its step (busy
    intervals, the step's GPU end); return the split of GPU time.

    `joined` ({activity index: (call or None, launched inside an op)}, from graphs.join_replay)
    decides for the replayed graph kernels: the captured call that launched each one.
    """
    joined = joined or {}
    ops = index.ops
    starts = [s.start for s in steps]
    split = GpuSplit()
    owner_cache: dict = {}
    op_of_ext, n_shared = _op_of_ext(ops)
    if n_shared and notes is not None:
        notes.append(f"{n_shared} External ids are shared by several GEMM/attention ops: kernels "
                     "linked only through them are not given to any call")
    ext_corr = ext_is_correlation(raw)
    if ext_corr and notes is not None:
        notes.append("the kernels' External id is their launch's correlation id: linked through "
                     "the runtime launches")
    for idx, (ts, dur, corr, ext, kname) in enumerate(raw.activities):
        split.total_us += dur
        if idx in joined:
            c, in_op = joined[idx]
            split.joined_us += dur
            _give(split, c, in_op, dur, kname)
            _add_to_step(steps, starts, raw.runtimes.get(corr, (None, ts))[1], ts, dur)
            continue
        if ext_corr and corr is None:
            corr, ext = ext, None
        elif ext is not None and ext == corr:
            ext = None                # a correlation id, not an op's External id
        rt = raw.runtimes.get(corr) if corr is not None else None
        owner = -1
        launch_ts = ts
        rext = None
        if rt is not None:
            tid, rts, rext, _api = rt
            if rext is not None and rext == corr:
                rext = None
            launch_ts = rts
            key = (tid, rts)
            if key in owner_cache:
                owner = owner_cache[key]
            else:
                inner = index.innermost(tid, rts)
                owner = call_owner(ops, inner, calls) if inner >= 0 else -1
                owner_cache[key] = owner
        if owner < 0:   # no launch inside a GEMM/attention op: the External id may still say
            for e_id in (ext, rext):
                if e_id is not None and e_id in op_of_ext:
                    owner = call_owner(ops, op_of_ext[e_id], calls)
                    break
        attributed = owner >= 0 or (ext is not None and ext in raw.cpu_ext) \
            or (rext is not None and rext in raw.cpu_ext)
        _give(split, calls.get(owner) if owner >= 0 else None, attributed, dur, kname)
        _add_to_step(steps, starts, launch_ts, ts, dur)
    return split


def _give(split: GpuSplit, c: Call | None, in_op: bool, dur: float, kname: str) -> None:
    """Book one GPU activity: to its call, to another op, or to nobody."""
    if c is not None:
        c.gpu_us += dur
        c.n_kernels += 1
        c.kernels[kname] = c.kernels.get(kname, 0) + 1
        split.in_calls_us += dur
    elif in_op:
        split.other_ops_us += dur
    else:
        split.unattributed_us += dur
        split.n_unattributed += 1


def _add_to_step(steps: list[Step], starts: list, launch_ts: float, ts: float, dur: float) -> None:
    """The activity counts for the step its launch lies in: busy interval and GPU end."""
    j = step_of(starts, steps, launch_ts)
    if j >= 0:
        st = steps[j]
        # relative to the step start: absolute times (~1e12 us) would cost precision
        st.intervals.append((ts - st.start, ts - st.start + dur))
        if ts + dur > st.gpu_end:
            st.gpu_end = ts + dur
