"""`tuner harvest --watch DIR`: keep one merged table up to date as traces appear.

Trace files in DIR are step traces; those in DIR/capture_traces/ are graph captures: each new
capture is joined with every replay trace (the replays are read again when one arrives).
A file that stays truncated is said once and read again only when it changes; a folder that
goes away is said once and polled ever more slowly (up to BACKOFF_MAX_S) until it is back.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from .. import shapetable
from ..tables import check_output_file
from ..errors import TunerError, info, warn
from . import config
from .files import CAPTURE_DIR, is_trace_file, trace_rank
from .graphs import read_captures
from .moe import check_topk
from .records import TraceData
from .table import aggregate
from .trace import read_trace

__all__ = ["BACKOFF_MAX_S", "check_interval", "watch"]

BACKOFF_MAX_S = 60.0   # the slowest poll of a folder that went away


def check_interval(interval) -> float:
    """A TunerError unless `interval` is a positive, finite number of seconds."""
    if not (isinstance(interval, (int, float)) and not isinstance(interval, bool)
            and math.isfinite(interval) and interval > 0):
        raise TunerError(f"--interval must be a positive number of seconds, not {interval!r}")
    return float(interval)


class _Folder:
    """The trace files of one folder that are complete: their size and mtime stayed the same for
    one poll; files of another rank (by their name) are skipped once, with a line. A file that
    ends early once complete is said once and waits (`truncated`) until its size or mtime
    changes. `gone`: the folder was there and is not now (said once by `watch`)."""

    def __init__(self, path: Path, rank: int):
        self.path, self.rank = path, rank
        self.seen: dict[Path, tuple] = {}
        self.skip: set[Path] = set()
        self.truncated: dict[Path, tuple] = {}   # file -> (size, mtime) it ended early at
        self.said_truncated: set[Path] = set()
        self.was_there = False
        self.gone = False
        self.said_gone = False

    def ready(self, done) -> list[Path]:
        try:
            entries = sorted(self.path.iterdir())
        except OSError:          # not there (yet, or any more), or not readable
            self.gone = self.was_there
            return []
        self.was_there, self.gone = True, False
        out = []
        for f in entries:
            if f in done or f in self.skip or not is_trace_file(f):
                continue
            try:
                st = f.stat()
            except FileNotFoundError:
                continue
            sig = (st.st_size, st.st_mtime_ns)
            if self.truncated.get(f) == sig:
                continue                 # ended early and not changed since: nothing new
            self.truncated.pop(f, None)
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
          device_name: str | None = None, topk: int | None = None) -> int:
    """Harvest new trace files in `directory` as they appear, keeping one merged table at
    `output` up to date; a file is read once its size and mtime stayed the same for one poll.
    Stops on Ctrl-C (or after `max_polls` polls). Returns the number of traces harvested.
    `topk`: as harvest's (transformers' grouped-mm experts read as moe calls)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise TunerError(f"--watch: not a directory: {directory}")
    interval = check_interval(interval)
    check_topk(topk)
    output = check_output_file(output, "-o")   # now, not at the first trace
    chosen_rank = rank if rank is not None else 0   # for files whose name gives a rank
    traces, captures = _Folder(directory, chosen_rank), _Folder(directory / CAPTURE_DIR,
                                                                 chosen_rank)
    done: dict[Path, TraceData] = {}
    graphs_of: dict[Path, list] = {}
    polls = 0
    sleep = interval
    info(f"watching {directory} for traces (every {interval:g} s; graph captures in "
         f"{CAPTURE_DIR}/); Ctrl-C stops")
    try:
        while max_polls is None or polls < max_polls:
            polls += 1
            new_graphs = False
            for f in captures.ready(graphs_of):
                got = _read(f, lambda p: read_captures([p], topk), captures)
                if got is not None:
                    graphs_of[f] = got
                    new_graphs = True
                    info(f"read the graph capture {f.name} ({len(got)} graph(s))")
            graphs = [g for gs in graphs_of.values() for g in gs]
            again = list(done) if new_graphs else []
            changed = False
            for f in again + traces.ready(done):
                got = _read(f, lambda p: read_trace(p, steps=steps, graphs=graphs,
                                                    device_name=device_name, topk=topk), traces)
                if got is not None:
                    done[f] = got
                    changed = True
                    if f not in again:
                        info(f"harvested {f.name}")
            if changed:
                table = aggregate(list(done.values()), phase)
                _write(table, output)
                print(f"{output}: {len(table)} rows from {len(done)} trace(s)", flush=True)
            sleep = _pause(directory, traces, captures, interval, sleep)
            time.sleep(sleep)
    except KeyboardInterrupt:
        info(f"stopped watching; {len(done)} trace(s) harvested into {output}")
    return len(done)


def _pause(directory: Path, traces: _Folder, captures: _Folder, interval: float,
           last: float) -> float:
    """The wait before the next poll: `interval`, doubled at each poll (up to BACKOFF_MAX_S)
    while the watched folder is gone; its going and its coming back are said once each, and
    so is a capture_traces/ folder that went away."""
    cap = max(interval, BACKOFF_MAX_S)
    if traces.gone:
        if not traces.said_gone:
            traces.said_gone = True
            warn(f"--watch {directory}: the folder is gone; polling it ever more slowly (up to "
                 f"every {cap:g} s) until it is back; Ctrl-C stops")
        return min(last * 2, cap)
    if traces.said_gone:
        traces.said_gone = False
        info(f"--watch {directory}: the folder is back; polling every {interval:g} s again")
    if captures.gone and not captures.said_gone:
        captures.said_gone = True
        warn(f"--watch {directory}: {CAPTURE_DIR}/ is gone; the graph captures read from it "
             "still join the replays")
    elif not captures.gone:
        captures.said_gone = False
    return interval


def _write(table, output: Path) -> None:
    try:
        shapetable.write(table, output)
    except OSError as exc:       # the folder went away or filled up since the check
        raise TunerError(f"-o {output}: cannot write the table: {exc.strerror or exc}") from None


def _read(f: Path, read, folder: _Folder):
    """read(f), or None: a file that ends early is said once and read again when its size or
    mtime changes (a writer still at it, or a truncated copy that will never grow); one that
    fails otherwise is skipped with a warning."""
    try:
        return read(f)
    except TunerError as exc:
        if "ends early" not in str(exc):
            warn(f"skipping {f.name}: {exc}")
            folder.skip.add(f)
            return None
        folder.seen.pop(f, None)
        try:
            st = f.stat()
            folder.truncated[f] = (st.st_size, st.st_mtime_ns)
        except OSError:
            pass                 # gone: nothing to read again
        if f not in folder.said_truncated:
            folder.said_truncated.add(f)
            warn(f"{f.name}: {str(exc).split(': ', 1)[-1]}; read again when it changes")
        return None
