"""Parquet tables on disk: atomic writes and reads that fail with one clear line.

Shared by the stages that write tables (shape tables, budgets, verdicts).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .errors import TunerError


def write_parquet(df: pd.DataFrame, path: str | Path) -> Path:
    """Write `df` to `path` through a temporary file and a rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    df.to_parquet(tmp, index=False)
    tmp.replace(path)
    return path


def read_parquet(path: str | Path, what: str, hint: str = "") -> pd.DataFrame:
    """Read a table; a missing or unreadable file is a TunerError naming `what` it should be."""
    path = Path(path)
    if not path.exists():
        raise TunerError(f"{what} not found: {path}{hint}")
    try:
        return pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises several types for a bad file
        raise TunerError(f"cannot read {what} {path}: {exc}") from None
