"""Which files to harvest: trace files, profiler directories (one file per rank), ranks."""

from __future__ import annotations

from pathlib import Path

from ..errors import TunerError, info
from . import config
from .reading import read_header

__all__ = ["CAPTURE_DIR", "trace_rank", "is_trace_file", "resolve_inputs", "resolve_pairs",
           "default_output"]

# a profiler directory holding this folder beside its step traces: the graph capture traces
CAPTURE_DIR = "capture_traces"


def trace_rank(path: Path) -> int | None:
    """The rank a trace file belongs to: from its name (rank-3, -TP-3, ...), else its header."""
    path = Path(path)
    m = config.RANK_RE.search(path.name)
    if m:
        return int(m.group(1))
    try:
        rank = (read_header(path).get("distributedInfo") or {}).get("rank")
    except TunerError:
        return None
    return int(rank) if isinstance(rank, (int, float)) else None


def is_trace_file(path: Path) -> bool:
    name = path.name.lower()
    return (path.is_file() and name.endswith(config.TRACE_SUFFIXES)
            and not name.endswith(".meta.json"))


def resolve_inputs(paths: list, rank: int | None = None, *, every_file: bool = False) -> list[Path]:
    """Expand directories (one file per rank: pick one rank) and check ranks are never mixed.
    `every_file`: a directory whose files give no rank yields all of them, not the first."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            out.extend(_directory_files(p, rank, every_file))
        else:
            if not p.exists():
                raise TunerError(f"trace not found: {p}")
            out.append(p)
    if len(out) > 1:
        ranks = {f: trace_rank(f) for f in out}
        if rank is not None:
            keep = [f for f in out if ranks[f] in (rank, None)]
            if not keep:
                raise TunerError(f"none of the traces is of rank {rank}")
            out = keep
        known = sorted({ranks[f] for f in out if ranks[f] is not None})
        if len(known) > 1:
            raise TunerError(f"the traces come from ranks {', '.join(map(str, known))}; harvest "
                             "one rank at a time (--rank R), ranks are never merged")
    return out


def resolve_pairs(paths: list, rank: int | None = None,
                  capture: list | None = None) -> tuple[list[Path], list[Path]]:
    """(replay or plain traces, graph capture traces) of one rank.

    The captures are `capture` (files or directories), else the capture_traces/ folder of a
    profiler directory among `paths`. Replays and captures of two ranks are an error.
    """
    replays = resolve_inputs(list(paths), rank)
    captures: list[Path] = []
    if capture:
        captures = resolve_inputs(list(capture), rank, every_file=True)
    else:
        for raw in paths:
            folder = Path(raw) / CAPTURE_DIR
            if Path(raw).is_dir() and folder.is_dir() and any(is_trace_file(f)
                                                               for f in folder.iterdir()):
                captures.extend(_directory_files(folder, rank, True))
        if captures:
            info(f"pairing {len(replays)} trace(s) with the {len(captures)} graph capture "
                 f"trace(s) in {CAPTURE_DIR}/")
    known = {trace_rank(f) for f in replays} | {trace_rank(f) for f in captures}
    known.discard(None)
    if len(known) > 1:
        raise TunerError(f"the replay and capture traces come from ranks "
                         f"{', '.join(map(str, sorted(known)))}; pair traces of one rank")
    return replays, captures


def _directory_files(p: Path, rank: int | None, every_file: bool = False) -> list[Path]:
    """The trace files of one rank in a profiler directory."""
    files = sorted(f for f in p.iterdir() if is_trace_file(f))
    if not files:
        raise TunerError(f"no trace files (*.json, *.json.gz) in directory {p}")
    ranks = {f: trace_rank(f) for f in files}
    known = sorted({r for r in ranks.values() if r is not None})
    if known:
        want = rank if rank is not None else (0 if 0 in known else known[0])
        chosen = [f for f in files if ranks[f] == want]
        if not chosen:
            raise TunerError(f"no trace of rank {want} in {p} (ranks there: "
                             f"{', '.join(map(str, known))})")
        if len(known) > 1 or rank is None:
            info(f"{p}: {len(files)} trace files, ranks {', '.join(map(str, known))}; "
                 f"harvesting rank {want} ({len(chosen)} file(s)); --rank chooses")
        return chosen
    if rank is not None:
        raise TunerError(f"--rank {rank}: the traces in {p} do not say their rank")
    if every_file:
        return files
    if len(files) > 1:
        info(f"{p}: {len(files)} trace files and no rank in their names; harvesting "
             f"the first, {files[0].name} (pass a file to choose)")
    return [files[0]]


def default_output(path: Path) -> Path:
    """shapes/<trace stem>.parquet (the stem without .pt.trace.json.gz and such)."""
    name = Path(path).name
    for suffix in (".gz", ".json", ".trace", ".pt"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return Path("shapes") / f"{name or 'trace'}.parquet"
