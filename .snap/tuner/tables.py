"""Tables and output files on disk: atomic writes, writable-path checks, and reads that fail with
one clear line.

Shared by the stages that write tables (shape tables, budgets, verdicts) and exports:

- `check_output_file(path, flag)` / `check_output_dir(path, flag)`: before any work, refuse an
  output that cannot be written (a directory where a file goes, a path under a file, a read-only
  place), proved by creating and removing a probe file, so nothing is left behind;
- `atomic_write_bytes(path, data)`: a temp file in the same folder, fsynced, mode 0644, moved
  into place with os.replace; on any error the temp file is removed and the old file stays;
- `write_parquet` / `read_parquet`: parquet through those; a file that is not a parquet table
  (a profiler trace, a directory, a FIFO) is named for what it is, with the command that takes it.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import tempfile
from pathlib import Path

import pandas as pd

from .errors import TunerError

__all__ = ["FILE_MODE", "TEMP_SUFFIX", "atomic_write_bytes", "check_output_dir",
           "check_output_file", "read_parquet", "remove_stale_temps", "write_parquet"]

FILE_MODE = 0o644  # outputs are configs and tables other users (a serving process) read
TEMP_SUFFIX = ".tmp"


# ------------------------------------------------------------------------ writable outputs
def _nearest_existing(path: Path) -> Path:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def _probe_dir(directory: Path, flag: str, target: Path) -> None:
    """Create and remove a file in `directory`: the one honest test of writability (root ignores
    permission bits; a read-only mount does not)."""
    try:
        fd, name = tempfile.mkstemp(prefix=".tuner-probe-", suffix=TEMP_SUFFIX, dir=directory)
    except OSError as exc:
        raise TunerError(f"{flag} {target}: cannot write in {directory}: "
                         f"{exc.strerror or exc}") from None
    os.close(fd)
    os.unlink(name)


def check_output_dir(path: str | Path, flag: str = "-o") -> Path:
    """Fail now (TunerError) unless files can be created in directory `path` (made if missing).
    Creates nothing."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise TunerError(f"{flag} {path}: exists and is not a directory")
    existing = _nearest_existing(path)
    if not existing.is_dir():
        raise TunerError(f"{flag} {path}: {existing} is a file, not a directory")
    _probe_dir(existing, flag, path)
    return path


def check_output_file(path: str | Path, flag: str = "-o") -> Path:
    """Fail now (TunerError) unless file `path` can be written (its folders made if missing):
    not a directory, not under a file, not in a read-only place. Creates nothing."""
    path = Path(path)
    if path.is_dir():
        raise TunerError(f"{flag} {path}: is a directory; give a file name")
    if path.exists() and not path.is_file():
        raise TunerError(f"{flag} {path}: exists and is not a regular file")
    check_output_dir(path.parent, flag)
    return path


# ----------------------------------------------------------------------------- atomic writes
def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` via a temp file in the same folder (`.<name>.<random>.tmp`),
    fsynced, mode 0644, then os.replace. On any error (or a signal) the temp file is removed and
    an existing `path` is left as it was; a process killed outright leaves at most that temp file,
    which readers never open (they read `path`) and `remove_stale_temps` clears."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), FILE_MODE)
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def remove_stale_temps(directory: str | Path, recursive: bool = True) -> list[Path]:
    """Remove temp files a killed writer left in `directory` (`.<name>.<random>.tmp`)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    pattern = f".*{TEMP_SUFFIX}"
    found = directory.rglob(pattern) if recursive else directory.glob(pattern)
    removed = []
    for stale in found:
        if stale.is_file():
            try:
                stale.unlink()
                removed.append(stale)
            except OSError:
                pass
    return removed


# ---------------------------------------------------------------------------------- parquet
def write_parquet(df: pd.DataFrame, path: str | Path) -> Path:
    """Write `df` to `path` atomically (see atomic_write_bytes): readers never see half a file."""
    buffer = io.BytesIO()
    df.to_parquet(buffer, index=False)  # serialise fully before touching the disk
    return atomic_write_bytes(path, buffer.getvalue())


def _what_it_is(path: Path) -> str | None:
    """A short description of a file that is not parquet (None: looks like parquet or unknown)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
    except OSError:
        return None
    if head.startswith(b"PAR1"):
        return None
    if head.startswith(b"\x1f\x8b"):
        try:
            with gzip.open(path, "rb") as fh:
                inner = fh.read(64).lstrip()
        except (OSError, EOFError):
            inner = b""
        if inner[:1] in (b"{", b"["):
            return "a gzip-compressed JSON file (a profiler trace?)"
        return "a gzip file"
    if head.lstrip()[:1] in (b"{", b"["):
        return "a JSON file (a profiler trace?)"
    if head.startswith(b"SQLite format 3"):
        return "an SQLite database (an Optuna study storage?)"
    return None


def read_parquet(path: str | Path, what: str, hint: str = "") -> pd.DataFrame:
    """Read a table; a missing, non-regular or non-parquet file is a TunerError naming `what` it
    should be and what it is."""
    path = Path(path)
    if not path.exists():
        raise TunerError(f"{what} not found: {path}{hint}")
    if path.is_dir():
        raise TunerError(f"{path} is a directory, not a {what} (a .parquet file){hint}")
    mode = path.stat().st_mode
    if not stat.S_ISREG(mode):  # a FIFO or a device would be read forever
        raise TunerError(f"{path} is not a regular file, not a {what}")
    kind = _what_it_is(path)
    if kind is not None:
        takes = ""
        if "trace" in kind:
            takes = (f": `tuner harvest {path}` makes a shape table of it, `tuner run {path}` "
                     "does the whole job")
        raise TunerError(f"{path} is {kind}, not a {what} (parquet){takes}")
    try:
        # one open file: a writer's os.replace between pyarrow's footer read and its page reads
        # would otherwise mix two files ("Couldn't deserialize thrift"); the handle keeps the
        # file this read started on (`tuner harvest --watch` rewrites its table while others read)
        with open(path, "rb") as fh:
            return pd.read_parquet(fh)
    except Exception as exc:  # pyarrow raises several types for a bad file
        text = str(exc).strip().splitlines()
        raise TunerError(f"cannot read {what} {path}: {text[0] if text else type(exc).__name__}"
                         f"{hint}") from None
