"""The ShapeTable data contract (DESIGN.md): one row per distinct call signature and phase.

Every stage that reads or writes shape tables goes through `read` / `write` here, so the columns
stay exactly those DESIGN.md lists. Extra attention columns (heads, kv_heads, q_len, kv_len,
head_dim, traced_kv_heads), `traced_compiled` and the moe columns (experts, topk) are allowed
after the contract columns.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .errors import TunerError
from .tables import read_parquet, write_parquet

__all__ = ["MOE_COLUMNS", "OPTIONAL_COLUMNS", "PHASES", "REQUIRED_STRINGS", "attribution_key", "empty",
           "normalize", "read", "validate", "write"]

COLUMNS: dict[str, str] = {
    "op": "string",
    "family": "string",
    "phase": "string",
    "m": "int64",
    "n": "int64",
    "k": "int64",
    "batch": "int64",
    "dtype": "string",
    "layout": "string",
    "calls": "int64",
    "steps": "int64",
    "calls_per_step": "float64",
    "us_per_call": "float64",
    "step_us": "float64",
    "step_gpu_us": "float64",
    "share": "float64",
    "kernels": "string",
    "source": "string",
    "device": "string",
}

# Optional columns for attention rows (batch is in `batch`).
ATTENTION_COLUMNS: dict[str, str] = {
    "heads": "Int64",
    "kv_heads": "Int64",
    "q_len": "Int64",
    "kv_len": "Int64",
    "head_dim": "Int64",
    # harvest --kv-heads: the KV heads of the cache the traced call read (= heads) when it was
    # regrouped from a repeated KV cache; the baseline then repeats the cache as the trace did
    "traced_kv_heads": "Int64",
}

# Optional columns of any row: traced_compiled = 1 when an Inductor graph of a torch.compile'd
# step ran the call (docs/harvest.md says how harvest tells): rank then times the baseline
# compiled, as that step runs it; written only when some call was. bias = 1 on a linear op
# (aten::linear, tuner::linear, tuner::norm_linear) given a bias: the gemv family then keys the
# shape with it, as it does an addmm row
OPTIONAL_COLUMNS: dict[str, str] = {"traced_compiled": "Int64", "bias": "Int64"}

# Optional columns of moe rows (m tokens, n = intermediate size, k = hidden: tuner_kernels/moe.py's
# shape_from_row): the layer's experts and the experts each token is routed to; written only
# when the table has a moe row, empty (NA) in its other rows
MOE_COLUMNS: dict[str, str] = {"experts": "Int64", "topk": "Int64"}

PHASES = ("prefill", "decode", "other")


def empty() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in COLUMNS.items()})


# String columns that must hold a value in every row (the others may be empty).
REQUIRED_STRINGS = ("op", "family", "phase", "dtype")


def _bad_cell(values: pd.Series, kind: str) -> tuple[int, object, str] | None:
    """(row, value, why) of the first cell of `values` that a column of `kind` cannot hold:
    'int' (finite whole numbers >= 0), 'Int' (the same, or empty), 'float' (numbers or empty:
    NaN means unknown; no infinities, no negatives), 'string' (text or empty), 'required'
    (text)."""
    for row, value in enumerate(values.tolist()):
        missing = value is None or value is pd.NA or (isinstance(value, float) and value != value)
        if kind in ("string", "required"):
            if missing:
                if kind == "required":
                    return row, value, "is empty"
                continue
            if not isinstance(value, str):
                return row, value, "is not text"
            continue
        if missing:
            if kind in ("int", ):
                return row, value, "is empty (NaN)"
            continue
        if isinstance(value, (bool, str, bytes)) or not hasattr(value, "__float__"):
            return row, value, "is not a number"
        number = float(value)
        if number != number or number in (float("inf"), float("-inf")):
            return row, value, "is not a finite number"
        if number < 0:
            return row, value, "is negative"
        if kind in ("int", "Int") and number != int(number):
            return row, value, "is not a whole number"
    return None


def validate(df: pd.DataFrame, where: str = "shape table") -> None:
    """TunerError (one line, naming the column and the row) for a cell the ShapeTable contract
    cannot hold: text or NaN in an integer column, text or an infinity in a float column, a
    negative size or count, an empty op/family/phase/dtype, an unknown phase."""
    columns = dict(COLUMNS, **{c: t for c, t in {**ATTENTION_COLUMNS, **OPTIONAL_COLUMNS, **MOE_COLUMNS}.items()
                               if c in df.columns})
    for column, dtype in columns.items():
        if column not in df.columns:
            continue
        kind = {"int64": "int", "Int64": "Int", "float64": "float"}.get(dtype)
        if kind is None:
            kind = "required" if column in REQUIRED_STRINGS else "string"
        bad = _bad_cell(df[column], kind)
        if bad is not None:
            row, value, why = bad
            raise TunerError(f"{where}: column {column!r}, row {row}: {value!r} {why}; "
                             f"not a valid ShapeTable (make one with `tuner harvest`)")
    for row, phase in enumerate(df["phase"].tolist()):
        if phase not in PHASES:
            raise TunerError(f"{where}: column 'phase', row {row}: {phase!r} is not one of "
                             f"{', '.join(PHASES)}")


def normalize(df: pd.DataFrame, where: str = "shape table") -> pd.DataFrame:
    """Return `df` with the contract columns first, in order and with their dtypes; a cell the
    contract cannot hold is a TunerError naming its column and row (`validate`)."""
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise TunerError(f"{where} lacks columns: {', '.join(missing)}")
    validate(df, where)
    extra = [c for c in df.columns if c not in COLUMNS]
    out = df[list(COLUMNS) + extra].copy()
    for c, t in COLUMNS.items():
        out[c] = out[c].astype(t)
    for c, t in {**ATTENTION_COLUMNS, **OPTIONAL_COLUMNS, **MOE_COLUMNS}.items():
        if c in out.columns:
            out[c] = out[c].astype(t)
    return out.reset_index(drop=True)


def write(df: pd.DataFrame, path: str | Path) -> Path:
    return write_parquet(normalize(df), path)


def read(path: str | Path) -> pd.DataFrame:
    return normalize(read_parquet(path, "shape table"), where=f"shape table {path}")


def attribution_key(row: dict) -> str:
    """The attribution table's name of a harvested row's call: 'm=..,n=..,k=..' for a linear,
    'attention b=.. h=.. kv=.. d=..' for decode attention, 'moe m=.. E=.. top.. hidden=..
    inter=..' for a MoE call (from a ShapeTable row, n = inter and k = hidden, or from a moe
    family shape, which names hidden and inter). The KV head count is left out: the
    baseline's call runs on the KV heads transformers repeated for it, the tuned one on the
    grouped cache itself (tuner.serving), and they are the same call of the step."""
    if row.get("family") == "attention":
        return (f"attention b={row.get('batch')} h={row.get('heads')} kv={row.get('kv_len')} "
                f"d={row.get('head_dim')}")
    if row.get("family") == "moe":
        hidden, inter = (row["hidden"], row["inter"]) if "hidden" in row else (row.get("k"),
                                                                               row.get("n"))
        return (f"moe m={row.get('m')} E={row.get('experts')} top{row.get('topk')} "
                f"hidden={hidden} inter={inter}")
    return f"m={row.get('m')},n={row.get('n')},k={row.get('k')}"
