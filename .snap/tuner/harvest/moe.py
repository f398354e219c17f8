"""Fused mixture-of-experts calls: the shape of one MoE layer call from the dims of its ops.

A MoE call is the outermost MoE op (config.MOE_OPS: vLLM's `vllm::moe_forward`, the engines'
`*::outplace_fused_experts` / `*::inplace_fused_experts`, tuner.serving's `tuner::moe`). Its
shape is what the tuner_kernels/moe.py family reads off a ShapeTable row of family `moe`: m tokens,
n = the intermediate size, k = the hidden size, the experts and the top-k, and the weights'
dtype. Each field comes from the dims of the call's op or of the ops inside it:

| op | Input Dims | gives |
| --- | --- | --- |
| `vllm::moe_forward(_shared)` | hidden_states [m, hidden], router_logits [m, E] | m, hidden, E (router) |
| `*::outplace_fused_experts`, `*::inplace_fused_experts` | hidden_states [m, hidden], w1 [E, 2 inter, hidden], w2 [E, hidden, inter], topk_weights, topk_ids [m, topk] | all (dtype: w1's) |
| `tuner::moe` | x [m, hidden], w1 [E, 2 inter, hidden], w2 [E, hidden, inter], topk_ids [m, topk], topk_weights, block | all (dtype: w1's) |
| `_moe_C::topk_softmax`, `sgl_kernel::topk_softmax` | topk_weights [m, topk] | m, topk |
| `_moe_C::moe_align_block_size`, `sgl_kernel::moe_align_block_size` | topk_ids [m, topk] | m, topk |
| triton_kernels `TopK` / `SortTokens` (vLLM's gpt-oss path) | logits [m, E] / expt_indx [m, topk] | m, E / m, topk |
| `aten::view` of uint8 [E, hidden/2, 2 inter] and [E, inter/2, hidden] (gpt-oss MXFP4) | the packed w1, w2 | inter, E, dtype `mxfp4` |

Sources that disagree, or fields no op gives, leave the call out with the reason (a note of the
trace): never a row of guessed numbers. The experts are the weights' E where the weights are
among the dims (with expert parallelism the router's E is the global count), else the router's.

transformers' grouped-mm experts leave no MoE op: each block runs two `aten::_grouped_mm` calls
among plain ops, up [R, hidden] x [E, hidden, 2 inter] and down [R, inter] x [E, inter, hidden]
(offsets [E]), R = m * topk. Their dims cannot tell m and the top-k apart; `harvest --topk K`
says the top-k, and `grouped_mm_calls` reads each such pair as one moe call of m = R / K.
"""

from __future__ import annotations

import numbers

from ..errors import TunerError
from .records import Call, Op
from .shapes import _dtype, _input

__all__ = ["FIELDS", "MXFP4", "check_topk", "grouped_mm_calls", "grouped_mm_hint",
           "grouped_mm_none", "grouped_mm_notes", "moe_call", "moe_notes"]

FIELDS = ("m", "experts", "topk", "hidden", "inter", "dtype")
MXFP4 = "mxfp4"   # 4-bit weights packed two to a uint8 byte, vLLM's MXFP4 (gpt-oss) path


def _matrix(dims: list, i: int) -> list | None:
    d = _input(dims, i)
    return d if d is not None and len(d) == 2 else None


def _experts_facts(op: Op, ids_at: int, signature: str) -> dict:
    """The whole shape from an op whose inputs are x [m, hidden], w1 [E, 2 inter, hidden], w2
    [E, hidden, inter] and, at input `ids_at`, topk_ids [m, topk] (`signature` names them all,
    for the note); dtype: w1's."""
    name, dims = op.name, op.dims
    x, ids = _matrix(dims, 0), _matrix(dims, ids_at)
    w1, w2 = _input(dims, 1), _input(dims, 2)
    if x is None or ids is None or w1 is None or w2 is None or len(w1) != 3 or len(w2) != 3:
        return {"problem": f"{name}'s dims are not {signature}"}
    hidden = x[1]
    if not (w1[2] == hidden == w2[1] and w1[1] == 2 * w2[2] and w1[0] == w2[0]):
        return {"problem": f"{name}'s w1 {w1} and w2 {w2} are not [E, 2 inter, hidden] and "
                           f"[E, hidden, inter] at hidden {hidden} (packed or non-gated "
                           "weights)"}
    return {"m": x[0], "hidden": hidden, "experts": w1[0], "inter": w2[2], "topk": ids[1],
            "dtype": _dtype(op.types, 1)}


def _facts(op: Op) -> dict:
    """What one op's dims say about the call: some of FIELDS, "router_experts", "packed" (a
    packed weight view's sizes) or "problem" (why its dims cannot be read)."""
    name, dims = op.name, op.dims
    if name.endswith("fused_experts"):
        return _experts_facts(op, 4, "hidden_states [m, hidden], w1, w2 [E, ., .], "
                                     "topk_weights, topk_ids [m, topk]")
    if name == "tuner::moe":
        return _experts_facts(op, 3, "x [m, hidden], w1, w2 [E, ., .], topk_ids [m, topk], "
                                     "topk_weights, block")
    if name.startswith("vllm::moe_forward"):
        x, logits = _matrix(dims, 0), _matrix(dims, 1)
        if x is None:
            return {"problem": f"{name}'s hidden_states is not [m, hidden]"}
        out = {"m": x[0], "hidden": x[1]}
        if logits is not None and logits[0] == x[0]:
            out["router_experts"] = logits[1]
        return out
    if name == "TopK":
        logits = _matrix(dims, 0)
        return {"m": logits[0], "router_experts": logits[1]} if logits else {}
    if name == "SortTokens":
        ids = _matrix(dims, 1)
        return {"m": ids[0], "topk": ids[1]} if ids else {}
    if name == "aten::view":
        return {"packed": _input(dims, 0)}
    ids = _matrix(dims, 0)        # topk_softmax's topk_weights, align's topk_ids
    return {"m": ids[0], "topk": ids[1]} if ids else {}


def _packed_weights(views: list, hidden: int | None) -> tuple[dict, str]:
    """(experts, inter, dtype) of the gpt-oss MXFP4 path from its packed weight views: w1 [E,
    hidden/2, 2 inter] and w2 [E, inter/2, hidden], uint8; ({}, why) when they are not that."""
    if hidden is None:
        return {}, ""
    w1s = {tuple(v) for v in views if 2 * v[1] == hidden}
    w2s = {tuple(v) for v in views if v[2] == hidden}
    pairs = {(w1[0], 2 * w2[1]) for w1 in w1s for w2 in w2s
             if w1[0] == w2[0] and w1[2] == 4 * w2[1]}
    if len(pairs) != 1:
        return {}, (f"its packed uint8 weight views {sorted(map(list, set(map(tuple, views))))} "
                    f"are not one w1 [E, hidden/2, 2 inter] and w2 [E, inter/2, hidden] at "
                    f"hidden {hidden}")
    experts, inter = pairs.pop()
    return {"experts": experts, "inter": inter, "dtype": MXFP4}, ""


def moe_call(ops: list[Op], i: int, members: list[int]) -> tuple[Call | None, str]:
    """(the Call of MoE op i, "") from its dims and those of `members` (the MoE ops inside it,
    in time order), or (None, why it gives no shape)."""
    op = ops[i]
    facts: dict = {}
    where: dict = {}
    views: list = []
    for j in [i] + members:
        found = _facts(ops[j])
        if "problem" in found:
            return None, found["problem"]
        view = found.pop("packed", None)
        if view is not None:
            views.append(view)
        for key, value in found.items():
            if key in facts and facts[key] != value:
                return None, (f"{key} {facts[key]} from {where[key]} but {value} from "
                              f"{ops[j].name}")
            facts.setdefault(key, value)
            where.setdefault(key, ops[j].name)
    if "inter" not in facts and views:
        packed, why = _packed_weights(views, facts.get("hidden"))
        if why:
            return None, why
        facts.update(packed)
    router = facts.pop("router_experts", None)
    facts.setdefault("experts", router)
    if facts["experts"] is None:
        del facts["experts"]
    missing = [f for f in FIELDS if f not in facts]
    if missing:
        return None, (f"the dims of {op.name} and the ops inside it give no "
                      f"{', '.join(missing)}")
    if min(facts[f] for f in FIELDS if f != "dtype") <= 0 or facts["topk"] > facts["experts"]:
        sizes = ", ".join(f"{f}={facts[f]}" for f in FIELDS)
        return None, f"a zero size or a top-k above the experts ({sizes})"
    return Call(op=op.name, family="moe", m=facts["m"], n=facts["inter"], k=facts["hidden"],
                batch=1, dtype=facts["dtype"], layout="", ts=op.ts, experts=facts["experts"],
                topk=facts["topk"]), ""


def moe_notes(problems: list[str]) -> list[str]:
    """One note per reason MoE ops gave no call, with how many."""
    counts: dict = {}
    for why in problems:
        counts[why] = counts.get(why, 0) + 1
    return [f"{n} MoE call(s) left out, their dims do not give the shape: {why}"
            for why, n in counts.items()]


def _grouped_dims(op: Op) -> list | None:
    """[R, k, E, n] of an aten::_grouped_mm of A [R, k] by B [E, k, n] with offsets [E] (what
    transformers' grouped-mm experts run), else None."""
    a, b, offs = _input(op.dims, 0), _input(op.dims, 1), _input(op.dims, 2)
    if a is None or b is None or offs is None or len(a) != 2 or len(b) != 3 \
            or offs != [b[0]] or a[1] != b[1]:
        return None
    return [a[0], a[1], b[0], b[2]]


def _text(op: Op) -> str:
    return f"{op.dims[0]} x {op.dims[1]}" if len(op.dims) >= 2 else str(op.dims)


def _grouped_pair(up: Op, down: Op, topk: int) -> tuple[Call | None, bool, str]:
    """(the moe call, True, "") when `up` and `down` are the up and down projections of one gated
    block and their rows divide by `topk`; (None, True, why) when they are such a pair that gives
    no shape; (None, False, why) when they are no such pair."""
    u, d = _grouped_dims(up), _grouped_dims(down) if down is not None else None
    if u is None:
        return None, False, (f"{_text(up)} is not [rows, k] x [E, k, n] with offsets [E]")
    if d is None or not (u[0] == d[0] and u[2] == d[2] and u[3] == 2 * d[1] and d[3] == u[1]):
        return None, False, (f"{_text(up)} is not followed by the down projection of a gated "
                             f"block ([rows, inter] x [E, inter, hidden], 2 inter = its n): next "
                             + (_text(down) if down is not None else "nothing"))
    rows, hidden, experts, inter = u[0], u[1], u[2], d[1]
    dtype, down_dtype = _dtype(up.types, 1), _dtype(down.types, 1)
    if dtype != down_dtype:
        return None, True, f"the up and down weights differ in dtype ({dtype}, {down_dtype})"
    if rows % topk:
        return None, True, (f"{rows} rows (m * topk) of {_text(up)} do not divide by the top-k "
                            f"{topk}")
    m = rows // topk
    if min(m, hidden, experts, inter) <= 0 or topk > experts:
        return None, True, (f"a zero size or a top-k above the experts (m={m}, experts={experts}, "
                            f"topk={topk}, hidden={hidden}, inter={inter})")
    return Call(op=up.name, family="moe", m=m, n=inter, k=hidden, batch=1, dtype=dtype,
                layout="", ts=up.ts, experts=experts, topk=topk), True, ""


def grouped_mm_calls(ops: list[Op], indices: list[int], topk: int
                     ) -> tuple[list[tuple[int, int, Call]], list[str]]:
    """([(up op index, down op index, moe call)], [why, per grouped matmul left out]) of the
    grouped matmuls `indices` (ops of kind grouped_mm outside any MoE op): on each thread, in
    time order, a grouped matmul and the next one are one call when they are the up and down
    projections of one gated block (same rows R and experts E, up's n = 2 x down's k = 2 inter,
    down's n = up's k = hidden), with m = R / topk; a grouped matmul that starts no such pair
    is left out, and the next one may start a pair."""
    by_tid: dict = {}
    for i in indices:
        by_tid.setdefault(ops[i].tid, []).append(i)
    pairs, problems = [], []
    for seq in by_tid.values():
        seq.sort(key=lambda i: ops[i].ts)
        j = 0
        while j < len(seq):
            nxt = ops[seq[j + 1]] if j + 1 < len(seq) else None
            call, paired, why = _grouped_pair(ops[seq[j]], nxt, topk)
            if call is not None:
                pairs.append((seq[j], seq[j + 1], call))
            else:
                problems.extend([why] * (2 if paired else 1))
            j += 2 if paired else 1
    return pairs, problems


def grouped_mm_notes(topk: int, read: int, problems: list[str]) -> list[str]:
    """What `harvest --topk` did with a trace's grouped matmuls: how many pairs it read as moe
    calls, and one note per reason it left some out, with how many (none without any grouped
    matmul: `grouped_mm_none` says so once per trace, captures included)."""
    counts: dict = {}
    for why in problems:
        counts[why] = counts.get(why, 0) + 1
    lines = [f"--topk {topk}: {2 * read} aten::_grouped_mm call(s) read as {read} moe "
             f"call(s) (a block's up and down projections each, m = rows / {topk})"] if read else []
    return lines + [f"--topk {topk}: {n} aten::_grouped_mm call(s) left out, no moe row: {why}"
                    for why, n in counts.items()]


def grouped_mm_none(topk: int) -> str:
    """The note of `harvest --topk` on a trace (and its captures) without any grouped matmul."""
    return (f"--topk {topk}: no aten::_grouped_mm call (transformers' grouped-mm experts) in the "
            "trace: nothing read as a moe call")


def grouped_mm_hint(count: int) -> list[str]:
    """Without `harvest --topk`: one note when the trace holds grouped matmuls (outside any MoE
    op), which give no row then, and what reads them."""
    if not count:
        return []
    return [f"{count} aten::_grouped_mm call(s) (transformers' grouped-mm MoE experts) give no "
            "row: their dims hold m * topk, not m and the top-k apart; pass --topk K (the "
            "model's num_experts_per_tok) to read each block's up and down pair as one moe call"]


def check_topk(topk) -> None:
    """A TunerError unless `topk` (harvest --topk) is None or a count >= 1."""
    if topk is not None and (isinstance(topk, bool) or not isinstance(topk, numbers.Integral)
                             or topk < 1):
        raise TunerError(f"--topk must be an integer >= 1 (the model's num_experts_per_tok), "
                         f"got {topk!r}")
