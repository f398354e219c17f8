"""`harvest --gated-mlp`: a dense decoder layer's gate, up and down projections as one moe row.

A dense decoder layer's MLP (Llama, Qwen3, Mistral) is down_proj(silu(gate_proj(x)) * up_proj(x)):
per layer, two linears of [m, inter] from [m, hidden] (gate and up share one shape) and one
back. In the ShapeTable they are two linear rows (family gemm or gemv) of one phase, m and dtype:
up n = I, k = H at twice the calls per step of down n = H, k = I. The moe kernel family
(tuner_kernels/moe.py) at experts = 1, top-k = 1 computes silu(gate) · up from a merged
[2 · inter, hidden] weight in one launch and the down projection in a second: the call
tuner.serving runs for such an MLP. `fold_gated_mlp` reads each such pair of rows as one moe row
(m, n = inter, k = hidden, experts 1, topk 1): its calls are the down row's (one per layer and
step), its time per call twice up's plus down's (the GPU time of the call's three linears). The
SiLU · mul between them is no linear call: where it ran as a kernel of its own (eager) it is in
no linear row and not counted; where a compiler fused it into a linear's kernel (Inductor: the
down projection's `..._mm_mul_silu_...` reduction) it counts with that linear, as the trace timed
it. The two linear rows go: their calls are the moe row's now.
"""

from __future__ import annotations

import pandas as pd

from .. import shapetable

__all__ = ["LINEAR_FAMILIES", "OP", "fold_gated_mlp"]

OP = "gated MLP (gate, up, down)"
LINEAR_FAMILIES = ("gemm", "gemv")
# the columns two linear rows must agree in to be one MLP's (those of them the table has)
_AGREE = ("phase", "m", "dtype", "batch", "layout", "bias", "traced_compiled", "traced_kv_heads",
          "source", "device")
_SILU = ("the SiLU·mul between them is no linear call: counted only where a linear's kernel "
         "fused it")


def _missing(value) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and value != value)


def _key(row: pd.Series, columns: list[str]) -> tuple:
    return tuple(None if _missing(row[c]) else row[c] for c in columns)


def _where(row: pd.Series) -> str:
    return f"{row['phase']} m={row['m']}"


def _why_not_linear(row: pd.Series) -> str:
    """Why a pair of linear rows like `row` is no nn.Linear MLP the moe family runs ("": it is)."""
    if _missing(row["layout"]) or row["layout"] != "NT":
        layout = "" if _missing(row["layout"]) else row["layout"]
        return f"layout {layout or 'unknown'}, not NT (x by a [n, k] weight)"
    if "bias" in row.index and not _missing(row["bias"]) and int(row["bias"]) == 1:
        return "given a bias, which the moe family has none of"
    return ""


def _folded_row(up: pd.Series, down: pd.Series) -> dict:
    row = {c: down[c] for c in down.index}
    for column in {**shapetable.ATTENTION_COLUMNS, **shapetable.OPTIONAL_COLUMNS}:
        if column in row and column != "traced_compiled":
            row[column] = pd.NA
    kernels = [k for r in (up, down) if not _missing(r["kernels"])
               for k in str(r["kernels"]).split("; ") if k]
    row.update(op=OP, family="moe", n=int(up["n"]), k=int(up["k"]), batch=1, layout="",
               us_per_call=2 * float(up["us_per_call"]) + float(down["us_per_call"]),
               share=float(up["share"]) + float(down["share"]),
               kernels="; ".join(dict.fromkeys(kernels)), experts=1, topk=1)
    return row


def _pair_notes(a: pd.Series, b: pd.Series) -> tuple[tuple | None, str]:
    """((up, down), note) when rows `a` and `b` (transposed shapes) are one gated MLP's, else
    (None, why they are left as linears)."""
    if a["calls_per_step"] == 2 * b["calls_per_step"]:
        up, down = a, b
    elif b["calls_per_step"] == 2 * a["calls_per_step"]:
        up, down = b, a
    else:
        more, fewer = (a, b) if (a["calls_per_step"], a["n"]) >= (b["calls_per_step"],
                                                                  b["n"]) else (b, a)
        return None, (f"{_where(more)} n={more['n']} k={more['k']}: "
                      f"{more['calls_per_step']:g} calls a step, not twice the "
                      f"{fewer['calls_per_step']:g} of n={fewer['n']} k={fewer['k']}: not a "
                      "gated MLP's up and down (two calls of one to one of the other), left as "
                      "linears")
    why = _why_not_linear(up)
    if why:
        return None, (f"{_where(up)} n={up['n']} k={up['k']} and n={down['n']} k={down['k']}: "
                      f"{why}: left as linears")
    return (up, down), (f"gated MLP {_where(up)} hidden={up['k']} inter={up['n']}: "
                        f"{up['calls_per_step']:g} + {down['calls_per_step']:g} linear calls a "
                        f"step read as {down['calls_per_step']:g} moe calls (experts 1, top-k 1), "
                        f"us_per_call = 2 x up's + down's; {_SILU}")


def fold_gated_mlp(table: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """(the ShapeTable with each dense gated MLP's linear rows read as one moe row, notes).

    `table`: a ShapeTable (tuner.harvest.aggregate's, or one tuner.shapetable reads). Among its
    linear rows (family gemm or gemv, batch 1 or empty) of one phase, m and dtype (and the same
    layout, bias, traced_compiled, traced_kv_heads, source and device), a row up (n = I, k = H)
    and a row down (n = H, k = I), I != H, with up's calls_per_step exactly twice down's (gate
    and up share one shape: two calls a layer; down one), become ONE row: family moe, op `OP`,
    m, n = I, k = H, batch 1, layout "", experts 1, topk 1, the dtype, down's calls, steps,
    calls_per_step, step times, source and device, us_per_call = 2 x up's + down's (the GPU time
    of one MLP call's three linears; the SiLU·mul between them is no linear call: a kernel of its
    own is in no linear row and not counted, one fused into a linear's kernel counts with that
    linear), share = the two rows' shares summed, both rows' kernels; a NaN time stays NaN. The
    two rows are removed (no call counted twice). The table keeps the order aggregate gives it
    (by share), normalized by tuner.shapetable, with the moe columns experts and topk added where
    it had none.

    Notes: one line per folded pair; one per pair of transposed shapes left as linears, with
    why (calls not 2:1, a layout other than NT, a bias, several rows of one shape); a table
    without any such pair comes back as it was, with one note saying so.
    """
    df = table.reset_index(drop=True)
    agree = [c for c in _AGREE if c in df.columns]
    linear = df[df["family"].isin(LINEAR_FAMILIES)
                & (df["batch"].isna() | (df["batch"] == 1))]
    notes: list[str] = []
    drop: list[int] = []
    rows: list[dict] = []
    groups: dict = {}
    for i, r in linear.iterrows():
        groups.setdefault(_key(r, agree), []).append(i)
    for members in groups.values():
        shapes: dict = {}
        for i in members:
            shapes.setdefault((int(df.loc[i, "n"]), int(df.loc[i, "k"])), []).append(i)
        done: set = set()
        for (n, k), at in shapes.items():
            if n == k or (k, n) not in shapes or (n, k) in done:
                continue
            done.update({(n, k), (k, n)})
            other = shapes[(k, n)]
            if len(at) > 1 or len(other) > 1:
                r = df.loc[at[0]]
                ops = ", ".join(dict.fromkeys(str(df.loc[i, "op"]) for i in at + other))
                notes.append(f"{_where(r)} n={n} k={k} and n={k} k={n}: several rows of one "
                             f"shape ({ops}): which are one MLP's is not known, left as linears")
                continue
            pair, note = _pair_notes(df.loc[at[0]], df.loc[other[0]])
            notes.append(note)
            if pair is not None:
                up, down = pair
                rows.append(_folded_row(up, down))
                drop.extend([up.name, down.name])
    if not notes:
        return table, ["no gated MLP found: no linear rows of one phase, m and dtype "
                       "with shapes n=I k=H and n=H k=I (I != H): nothing folded"]
    if not rows:
        return table, notes
    out = df.drop(index=drop)
    for column in shapetable.MOE_COLUMNS:
        if column not in out.columns:
            out[column] = pd.NA
    out = pd.concat([out, pd.DataFrame(rows, columns=out.columns)], ignore_index=True)
    # aggregate's order: by share of the step, then calls per step and time per call
    out = out.sort_values(["share", "calls_per_step", "us_per_call"], ascending=False,
                          na_position="last", kind="stable")
    return shapetable.normalize(out), notes
