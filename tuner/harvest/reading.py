"""Reading a trace file: open it (gzip or not), read its header, stream its events.

The events are parsed streaming (ijson, with its C backend when available) and only what the
table needs is kept (config.py declares it per dialect): the GEMM/attention CPU ops, the runtime
launch records, the GPU activities and the step annotations. Memory follows the number of those
events, not the size of the JSON. Every decode or parse failure becomes one TunerError line.
"""

from __future__ import annotations

import gzip
import math
import zlib
from pathlib import Path

from ..errors import TunerError
from . import config
from .records import Op, RawTrace
from .shapes import is_attention

try:  # the C backend is ~10x faster; fall back to whatever ijson has
    import ijson.backends.yajl2_c as ijson
except ImportError:  # pragma: no cover - depends on the ijson build
    import ijson  # type: ignore[no-redef]

import ijson as _ijson_common

__all__ = ["open_bytes", "read_header", "read_events"]

JSON_ERRORS = (_ijson_common.common.JSONError, _ijson_common.common.IncompleteJSONError)


# ------------------------------------------------------------------------------------ file access
def open_bytes(path: Path):
    """Open a trace as a binary stream, gunzipping if the file starts with the gzip magic."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise TunerError(f"trace not found: {path}") from None
    except IsADirectoryError:
        raise TunerError(f"{path} is a directory, not a trace file") from None
    except OSError as exc:
        raise TunerError(f"cannot open trace {path}: {exc.strerror or exc}") from None
    magic = f.read(2)
    f.seek(0)
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=f, mode="rb")
    return f


def _read_error(path: Path, exc: BaseException) -> TunerError:
    """Turn a low-level read/parse failure into one clear line."""
    if isinstance(exc, EOFError):
        return TunerError(f"{path}: the gzip stream ends early (truncated file, or still being "
                          "written?)")
    if isinstance(exc, (zlib.error, gzip.BadGzipFile)):
        return TunerError(f"{path}: corrupt gzip data ({exc})")
    if isinstance(exc, _ijson_common.common.IncompleteJSONError) and "premature EOF" in str(exc):
        return TunerError(f"{path}: the JSON ends early (truncated file, or still being written?)")
    if isinstance(exc, JSON_ERRORS):
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return TunerError(f"{path}: not a JSON trace ({msg[:120]})")
    if isinstance(exc, UnicodeDecodeError):
        return TunerError(f"{path}: not a JSON trace (not UTF-8 text)")
    return TunerError(f"{path}: cannot read trace ({type(exc).__name__}: {exc})")


# ----------------------------------------------------------------------------------------- header
def read_header(path: Path) -> dict:
    """Read the small top-level keys that precede traceEvents (device, rank, record_shapes).

    Stops at traceEvents, so only the head of the file is read. Returns {"format": "object" |
    "array", "deviceProperties": [...], "distributedInfo": {...}, "record_shapes": ...,
    "has_events": bool-or-None (None: not seen before the end of the header)}.
    """
    header: dict = {"format": None, "has_events": None}
    if path.is_file() and path.stat().st_size == 0:
        raise TunerError(f"{path}: empty file, not a trace")
    wanted = {"deviceProperties", "distributedInfo", "record_shapes"}
    f = open_bytes(path)
    try:
        events = ijson.parse(f, use_float=True)
        builder = None
        building = None
        for prefix, event, value in events:
            if header["format"] is None:
                if event == "start_map":
                    header["format"] = "object"
                    continue
                if event == "start_array":
                    header["format"] = "array"
                    header["has_events"] = True
                    break
                raise TunerError(f"{path}: not a trace (top-level JSON is a {event}, expected an "
                                 "object with traceEvents)")
            if building is not None:
                if prefix == building and event in ("end_map", "end_array") and builder is not None:
                    builder.event(event, value)
                    header[building] = builder.value
                    building, builder = None, None
                    continue
                builder.event(event, value)
                continue
            if event == "map_key" and prefix == "":
                if value == "traceEvents":
                    header["has_events"] = True
                    break
                continue
            if prefix in wanted:
                if event in ("start_map", "start_array"):
                    builder = _ijson_common.ObjectBuilder()
                    builder.event(event, value)
                    building = prefix
                else:
                    header[prefix] = value
        else:
            if header["format"] is None:
                raise TunerError(f"{path}: empty file, not a trace")
            header["has_events"] = False
    except TunerError:
        raise
    except Exception as exc:  # noqa: BLE001 - every decode/parse failure becomes one line
        raise _read_error(path, exc) from None
    finally:
        f.close()
    return header


# ----------------------------------------------------------------------------------------- events
class _Sink:
    """What the event loop collects; `raw()` freezes it into a RawTrace."""

    def __init__(self):
        self.ops: list = []
        self.runtimes: dict = {}
        self.activities: list = []
        self.annotations: list = []
        self.cpu_ext: set = set()
        self.n_cpu = self.n_dims = self.n_nodims = 0
        self.first_ts, self.last_ts = math.inf, -math.inf
        self.hip = False
        self.device_ids: set = set()
        self.kernel_names: dict = {}      # interned GPU activity names
        self.op_kinds: dict = {}          # op name -> "gemm" / "attention" / ""

    def raw(self) -> RawTrace:
        backend = "hip" if self.hip else ("cuda" if self.activities else "cpu")
        return RawTrace(self.ops, self.runtimes, self.activities, self.annotations, self.cpu_ext,
                        self.n_cpu, self.n_dims, self.n_nodims, self.first_ts, self.last_ts,
                        backend, self.device_ids)


def _arg(args: dict, keys: tuple):
    for key in keys:
        value = args.get(key)
        if value is not None:
            return value
    return None


def _keep_op(e: dict, dialect: config.Dialect, s: _Sink) -> None:
    s.n_cpu += 1
    args = e.get("args") or {}
    ts = e.get("ts")
    dur = e.get("dur") or 0.0
    if ts is None:
        return
    if ts < s.first_ts:
        s.first_ts = ts
    if ts + dur > s.last_ts:
        s.last_ts = ts + dur
    ext = _arg(args, dialect.ext_keys)
    if ext is not None:
        s.cpu_ext.add(ext)
    dims = _arg(args, dialect.dims_keys)
    if dims is not None:
        s.n_dims += 1
    name = e.get("name", "")
    if name in config.GEMM_OPS:
        kind = "gemm"
    else:
        kind = s.op_kinds.get(name)
        if kind is None:
            kind = s.op_kinds[name] = "attention" if is_attention(name) else ""
        if not kind:
            return
    if dims is None:
        s.n_nodims += 1
    s.ops.append(Op(name, e.get("tid"), ts, ts + dur, ext, dims or [],
                    args.get("Input type") or [], args.get("Input Strides") or [],
                    args.get("Concrete Inputs") or [], kind))


def _keep_gpu(e: dict, dialect: config.Dialect, s: _Sink) -> None:
    args = e.get("args") or {}
    ts, dur = e.get("ts"), e.get("dur")
    if ts is None or dur is None:
        return
    name = e.get("name", "")
    name = s.kernel_names.setdefault(name, name)
    s.activities.append((ts, dur, args.get("correlation"), _arg(args, dialect.ext_keys), name))
    dev = args.get("device")
    if dev is not None:
        s.device_ids.add(dev)
    if ts + dur > s.last_ts:
        s.last_ts = ts + dur


def _keep_runtime(e: dict, dialect: config.Dialect, s: _Sink) -> None:
    args = e.get("args") or {}
    corr = args.get("correlation")
    if corr is not None:
        s.runtimes[corr] = (e.get("tid"), e.get("ts"), _arg(args, dialect.ext_keys))
    if not s.hip and e.get("name", "").startswith("hip"):
        s.hip = True


def _keep_annotation(e: dict, dialect: config.Dialect, s: _Sink) -> None:
    ts = e.get("ts")
    if ts is None:
        return
    name = e.get("name", "")
    if name.startswith(config.ANNOTATION_PREFIXES) or name.lower() in config.PHASE_WORDS:
        s.annotations.append((name, e.get("tid"), ts, ts + (e.get("dur") or 0.0)))


_KEEP = {"op": _keep_op, "gpu": _keep_gpu, "runtime": _keep_runtime,
         "annotation": _keep_annotation}


def read_events(path: Path, fmt: str) -> RawTrace:
    """Stream the trace's events once and keep what config.py declares (see the module doc)."""
    sink = _Sink()
    kinds = config.CATEGORY_KINDS
    prefix = "item" if fmt == "array" else "traceEvents.item"
    f = open_bytes(path)
    try:
        for e in ijson.items(f, prefix, use_float=True):
            if not isinstance(e, dict) or e.get("ph") != "X":
                continue
            found = kinds.get(e.get("cat"))
            if found is not None:
                dialect, kind = found
                _KEEP[kind](e, dialect, sink)
    except TunerError:
        raise
    except Exception as exc:  # noqa: BLE001 - every decode/parse failure becomes one line
        raise _read_error(path, exc) from None
    finally:
        f.close()
    return sink.raw()
