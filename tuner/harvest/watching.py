"""`tuner harvest --watch DIR`: keep one merged table up to date as traces appear.

Trace files in DIR are step traces; those in DIR/capture_traces/ are graph captures: each new
capture is joined with every replay trace (the replays are read again when one arrives).
"""

from __future__ import annotations

import time
from pathlib import Path

from .. import shapetable
from ..errors import TunerError, info, warn
from . import config
from .files import CAPTURE_DIR, is_trace_file, trace_rank
from .graphs import read_captures
from .records import TraceData
from .table import aggregate
from .trace import read_trace

__all__ = ["watch"]


class _Folder:
    """The trace files of one folder that are complete: their size and mtime stayed the same for
    one poll; files of another rank (by their name) are skipped once, with a line."""

    def __init__(self, path: Path, rank: int):
        self.path, self.rank = path, rank
        self.seen: dict[Path, tuple] = {}
        self.skip: set[Path] = set()

    def ready(self, done) -> list[Path]:
        if not self.path.is_dir():
            return []
        out = []
        for f in sorted(self.path.iterdir()):
            if f in done or f in self.skip or not is_trace_file(f):
                continue
            try:
                st = f.stat()
            except FileNotFoundError:
                continue
            sig = (st.st_size, st.st_mtime_ns)
            if self.seen.get(f) != sig or st.st_size == 0:
                self.seen[f] = sig       # new or still growing: look again next poll
                continue
            r = trace_rank(f) if config.RANK_RE.search(f.name) else None
            if r is not None and r != self.rank:
                self.skip.add(f)
                info(f"skipping {f.name}: rank {r} (harvesting rank {self.rank}; --rank chooses)")
                continue
            out.append(f)
        return out


def watch(directory, output, *, rank: int | None = None, steps: int | None = None,
          phase: str | None = None, interval: float = 2.0, max_polls: int | None = None,
          device_name: str | None = None) -> int:
    """Harvest new trace files in `directory` as they appear, keeping one merged table at
    `output` up to date; a file is read once its size and mtime stayed the same for one poll.
    Stops on Ctrl-C (or after `max_polls` polls). Returns the number of traces harvested."""
    directory = Path(directory)
    if not directory.is_dir():
        raise TunerError(f"--watch: not a directory: {directory}")
    output = Path(output)
    chosen_rank = rank if rank is not None else 0   # for files whose name gives a rank
    traces, captures = _Folder(directory, chosen_rank), _Folder(directory / CAPTURE_DIR,
                                                                 chosen_rank)
    done: dict[Path, TraceData] = {}
    graphs_of: dict[Path, list] = {}
    polls = 0
    info(f"watching {directory} for traces (every {interval:g} s; graph captures in "
         f"{CAPTURE_DIR}/); Ctrl-C stops")
    try:
        while max_polls is None or polls < max_polls:
            polls += 1
            new_graphs = False
            for f in captures.ready(graphs_of):
                got = _read(f, lambda p: read_captures([p]), captures)
                if got is not None:
                    graphs_of[f] = got
                    new_graphs = True
                    info(f"read the graph capture {f.name} ({len(got)} graph(s))")
            graphs = [g for gs in graphs_of.values() for g in gs]
            again = list(done) if new_graphs else []
            changed = False
            for f in again + traces.ready(done):
                got = _read(f, lambda p: read_trace(p, steps=steps, graphs=graphs,
                                                    device_name=device_name), traces)
                if got is not None:
                    done[f] = got
                    changed = True
                    if f not in again:
                        info(f"harvested {f.name}")
            if changed:
                table = aggregate(list(done.values()), phase)
                shapetable.write(table, output)
                print(f"{output}: {len(table)} rows from {len(done)} trace(s)", flush=True)
            time.sleep(interval)
    except KeyboardInterrupt:
        info(f"stopped watching; {len(done)} trace(s) harvested into {output}")
    return len(done)


def _read(f: Path, read, folder: _Folder):
    """read(f), or None: a file still being written is retried at the next poll, one that
    fails otherwise is skipped with a warning."""
    try:
        return read(f)
    except TunerError as exc:
        if "ends early" not in str(exc):
            warn(f"skipping {f.name}: {exc}")
            folder.skip.add(f)
        else:
            folder.seen.pop(f, None)
        return None
