"""`tuner harvest --watch DIR`: keep one merged table up to date as traces appear."""

from __future__ import annotations

import time
from pathlib import Path

from .. import shapetable
from ..errors import TunerError, info, warn
from . import config
from .aggregate import aggregate
from .files import is_trace_file, trace_rank
from .records import TraceData
from .trace import read_trace

__all__ = ["watch"]


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
    seen: dict[Path, tuple] = {}
    done: dict[Path, TraceData] = {}
    bad: set[Path] = set()
    chosen_rank = rank if rank is not None else 0   # for files whose name gives a rank
    polls = 0
    info(f"watching {directory} for traces (every {interval:g} s); Ctrl-C stops")
    try:
        while max_polls is None or polls < max_polls:
            polls += 1
            changed = False
            for f in sorted(directory.iterdir()):
                if f in done or f in bad or not is_trace_file(f):
                    continue
                try:
                    st = f.stat()
                except FileNotFoundError:
                    continue
                sig = (st.st_size, st.st_mtime_ns)
                if seen.get(f) != sig or st.st_size == 0:
                    seen[f] = sig       # new or still growing: look again next poll
                    continue
                r = trace_rank(f) if config.RANK_RE.search(f.name) else None
                if r is not None and r != chosen_rank:
                    bad.add(f)
                    info(f"skipping {f.name}: rank {r} (harvesting rank {chosen_rank}; --rank "
                         "chooses)")
                    continue
                try:
                    done[f] = read_trace(f, steps=steps, device_name=device_name)
                except TunerError as exc:
                    if "ends early" in str(exc):
                        continue        # still being written after all: retry later
                    warn(f"skipping {f.name}: {exc}")
                    bad.add(f)
                    continue
                changed = True
                info(f"harvested {f.name}")
            if changed:
                table = aggregate(list(done.values()), phase)
                shapetable.write(table, output)
                print(f"{output}: {len(table)} rows from {len(done)} trace(s)", flush=True)
            time.sleep(interval)
    except KeyboardInterrupt:
        info(f"stopped watching; {len(done)} trace(s) harvested into {output}")
    return len(done)
