"""The ShapeTable data contract (DESIGN.md): one row per distinct call signature and phase.

Every stage that reads or writes shape tables goes through `read` / `write` here, so the columns
stay exactly those DESIGN.md lists. Extra attention columns (heads, kv_heads, q_len, kv_len,
head_dim) are allowed after the contract columns.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .errors import TunerError
from .tables import read_parquet, write_parquet

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
}

PHASES = ("prefill", "decode", "other")


def empty() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in COLUMNS.items()})


def normalize(df: pd.DataFrame) -> pd.DataFrame:
    """Return `df` with the contract columns first, in order and with their dtypes."""
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise TunerError(f"shape table lacks columns: {', '.join(missing)}")
    extra = [c for c in df.columns if c not in COLUMNS]
    out = df[list(COLUMNS) + extra].copy()
    for c, t in COLUMNS.items():
        out[c] = out[c].astype(t)
    for c, t in ATTENTION_COLUMNS.items():
        if c in out.columns:
            out[c] = out[c].astype(t)
    return out.reset_index(drop=True)


def write(df: pd.DataFrame, path: str | Path) -> Path:
    return write_parquet(normalize(df), path)


def read(path: str | Path) -> pd.DataFrame:
    return normalize(read_parquet(path, "shape table"))
