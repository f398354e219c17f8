"""Helpers the harvest test modules share: the CLI run, a trace's events, one row of a table."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

from tuner.cli import main


def run_cli(capsys, *argv):
    """`tuner harvest ARGV...` in process: (exit code, stdout, stderr)."""
    rc = main(["harvest", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def load_events(path: Path) -> list[dict]:
    return json.loads(gzip.open(path).read())["traceEvents"]


def row(df, **where):
    """The one row of `df` whose columns equal `where` (fails unless exactly one matches)."""
    sel = df
    for k, v in where.items():
        sel = sel[sel[k] == v]
    assert len(sel) == 1, f"expected one row for {where}, got {len(sel)}"
    return sel.iloc[0]
