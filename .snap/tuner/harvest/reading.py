"""Reading a trace file: open it (gzip or not), read its header, stream its events.

The events are parsed streaming (ijson, with its C backend when available) and only what the
table needs is kept (config.py declares it per dialect): the GEMM/attention CPU ops, the runtime
launch records, the GPU activities and the step annotations. Memory follows the number of those
events, not the size of the JSON. Every decode or parse failure becomes one TunerError line.
"""

from __future__ import annotations

import gzip
import math
import os
import stat
import zlib
from pathlib import Path

import numpy as np

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
MAX_NESTING = 1000   # real traces nest < 10 deep; ijson's memory grows with the depth squared

_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
_BRACKET_STEP = np.zeros(256, dtype=np.int32)
_BRACKET_STEP[list(b"[{")] = 1
_BRACKET_STEP[list(b"]}")] = -1


class _NestingGuard:
    """A binary stream that refuses JSON nested deeper than MAX_NESTING before ijson sees it.

    ijson keeps one prefix string per open level (its length grows with the level), so its memory
    grows with the square of the depth: 2.3 GB at 30,000 nested brackets. The guard keeps the
    brackets of each chunk (bytes.translate) and follows the depth with a cumulative sum; strings
    are not told apart (a real trace's strings hold balanced brackets, if any). About 1 s per GB.
    """

    def __init__(self, stream, path: Path):
        self.stream, self.path, self.depth = stream, path, 0

    def read(self, n: int = -1) -> bytes:
        data = self.stream.read(n)
        brackets = data.translate(None, _NOT_BRACKETS)
        if brackets:
            depth = self.depth + np.cumsum(_BRACKET_STEP[np.frombuffer(brackets, np.uint8)])
            if int(depth.max()) > MAX_NESTING:
                raise TunerError(f"{self.path}: JSON nested deeper than {MAX_NESTING} levels, not "
                                 "a profiler trace")
            self.depth = max(0, int(depth[-1]))
        return data

    def close(self) -> None:
        self.stream.close()


def check_file(path: Path) -> None:
    """Refuse what is no regular file (a FIFO or a device would be read forever) and say what a
    known non-trace file is and which command takes it."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise TunerError(f"trace not found: {path}") from None
    except OSError as exc:
        raise TunerError(f"cannot open trace {path}: {exc.strerror or exc}") from None
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        raise TunerError(f"{path} is a directory, not a trace file")
    if not stat.S_ISREG(mode):
        kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else
                "a device file" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else
                "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
        raise TunerError(f"{path} is {kind}, not a trace file: save the trace to a file first")
    if st.st_size == 0:
        raise TunerError(f"{path}: empty file, not a trace")
    try:
        with open(path, "rb") as f:
            magic = f.read(16)
    except OSError as exc:
        raise TunerError(f"cannot open trace {path}: {exc.strerror or exc}") from None
    what = _known_file(path, magic)
    if what:
        raise TunerError(f"{path.name} is {what}, not a profiler trace")


def _known_file(path: Path, magic: bytes) -> str:
    """What a known non-trace file is, or "" (then it is read as a trace)."""
    if magic.startswith(b"PAR1"):
        return _parquet_kind(path)
    if magic.startswith(b"SQLite format 3\0"):
        return ("an SQLite database (an Optuna study? `tuner search` / `tuner rank` take it as "
                f"--storage sqlite:///{path})")
    if magic.startswith(b"PK\x03\x04"):
        return "a zip archive (a torch checkpoint or a wheel?)"
    return ""


def _parquet_kind(path: Path) -> str:
    try:
        import pyarrow.parquet as pq

        names = set(pq.read_schema(path).names)
    except Exception:  # noqa: BLE001 - an unreadable parquet is still no trace
        return "a parquet file"
    if {"decision", "saving_us_per_token"} <= names:
        return "a verdict table (from `tuner rank`): `tuner export` takes it"
    if "floor_us" in names:
        return ("a budget table (from `tuner budget`): `tuner search` takes the shape table it "
                "was made from")
    if {"op", "calls_per_step", "us_per_call"} <= names:
        return "a shape table: `tuner budget` / `tuner search` take it"
    return "a parquet file"


def open_bytes(path: Path):
    """Open a trace as a binary stream (gunzipped if it starts with the gzip magic), guarded
    against deep nesting."""
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
        return _NestingGuard(gzip.GzipFile(fileobj=f, mode="rb"), path)
    return _NestingGuard(f, path)


def _read_error(path: Path, exc: BaseException) -> TunerError:
    """Turn a low-level read/parse failure into one clear line."""
    if isinstance(exc, EOFError):
        return TunerError(f"{path}: the gzip stream ends early (truncated file, or still being "
                          "written?)")
    if isinstance(exc, (zlib.error, gzip.BadGzipFile)):
        return TunerError(f"{path}: corrupt gzip data ({_first_line(exc)})")
    if isinstance(exc, _ijson_common.common.IncompleteJSONError) and "premature EOF" in str(exc):
        return TunerError(f"{path}: the JSON ends early (truncated file, or still being written?)")
    if isinstance(exc, JSON_ERRORS):
        return TunerError(f"{path}: not a JSON trace ({_first_line(exc)[:120]})")
    if isinstance(exc, UnicodeDecodeError):
        return TunerError(f"{path}: not a JSON trace (not UTF-8 text)")
    if isinstance(exc, MemoryError):
        return TunerError(f"{path}: out of memory reading the trace")
    return TunerError(f"{path}: cannot read trace ({type(exc).__name__}: {_first_line(exc)[:200]})")


def _first_line(exc: BaseException) -> str:
    arg = exc.args[0] if exc.args else ""
    text = (arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(exc)).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# ----------------------------------------------------------------------------------------- header
def read_header(path: Path) -> dict:
    """Read the small top-level keys that precede traceEvents (device, rank, record_shapes).

    Stops at traceEvents, so only the head of the file is read. Returns {"format": "object" |
    "array", "deviceProperties": [...], "distributedInfo": {...}, "record_shapes": ...,
    "has_events": bool}. Refuses what is no regular trace file (check_file).
    """
    check_file(path)
    header: dict = {"format": None, "has_events": None}
    wanted = {"deviceProperties", "distributedInfo", "record_shapes", "deviceName", "device_name"}
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
                    _, kind, _ = next(events, (None, "end of file", None))
                    if kind != "start_array":
                        raise TunerError(f"{path}: traceEvents is a {_json_kind(kind)}, not a "
                                         "list of events")
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


def _json_kind(event: str) -> str:
    return {"start_map": "JSON object", "string": "string", "number": "number",
            "boolean": "boolean", "null": "null"}.get(event, event)


# ----------------------------------------------------------------------------------------- events
_NUMBER = (int, float)
MAX_DURATION_US = 1e12          # 11 days: a longer duration is a broken event
_IDS = (int, str)


def _time(x) -> bool:
    """A finite timestamp (not a bool, not NaN, not astronomically large)."""
    return type(x) in _NUMBER and -1e18 < x < 1e18


def _duration(x) -> bool:
    return type(x) in _NUMBER and 0 <= x <= MAX_DURATION_US


def _id(x):
    """An External id or correlation id usable as a key, else None."""
    return x if type(x) in _IDS else None


def _tid(x):
    """Thread ids as ints where they are numbers ("123" in the 2021 schema); None if unusable."""
    if type(x) is int:
        return x
    if type(x) is str:
        return int(x) if x.isdigit() else x
    return None


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
        self.names: dict = {}             # interned names (kernels, runtime calls)
        self.op_kinds: dict = {}          # op name -> "gemm" / "attention" / ""
        self.launch_kernels: dict = {}    # correlation -> kernel name a launch records (ROCm)
        self.device_labels: list = []     # GPU process names/labels from metadata events
        self.capture_labels: list = []    # annotations naming a graph capture
        self.compiled_regions: list = []  # (tid, ts, end) of Inductor's compiled-graph calls
        self.dialects: set = set()
        self.malformed: dict = {}         # what was wrong -> how many events
        self.repeated_launches = 0        # runtime events recorded twice (same id, thread, time)

    def bad(self, what: str) -> None:
        self.malformed[what] = self.malformed.get(what, 0) + 1

    def raw(self) -> RawTrace:
        backend = "hip" if self.hip else ("cuda" if self.activities else "cpu")
        if self.repeated_launches:
            # events recorded twice (traces concatenated, a merge gone wrong): a GPU activity
            # counts once; ops need nothing, a copy nests inside its original and is one call
            unique = sorted(set(self.activities), key=lambda a: a[0])
            self.malformed["events recorded twice (dropped)"] = (
                self.repeated_launches + len(self.activities) - len(unique))
            self.activities = unique
        return RawTrace(self.ops, self.runtimes, self.activities, self.annotations, self.cpu_ext,
                        self.n_cpu, self.n_dims, self.n_nodims, self.first_ts, self.last_ts,
                        backend, self.device_ids, launch_kernels=self.launch_kernels,
                        device_labels=self.device_labels, capture_labels=self.capture_labels,
                        dialects=sorted(self.dialects),
                        malformed=dict(self.malformed), compiled_regions=self.compiled_regions)


def _arg(args: dict, keys: tuple):
    for key in keys:
        value = args.get(key)
        if value is not None:
            return value
    return None


def _args(e: dict, s: _Sink) -> dict | None:
    args = e.get("args")
    if args is None:
        return {}
    if type(args) is not dict:
        s.bad("args not an object")
        return None
    return args


def _name(e: dict, s: _Sink) -> str | None:
    name = e.get("name", "")
    if type(name) is not str:
        s.bad("name not a string")
        return None
    return name


OP_WITHOUT_TIME = "GEMM/attention ops without a usable ts, dur or tid"


def _shaped_op(name) -> bool:
    return type(name) is str and (name in config.GEMM_OPS or is_attention(name)
                                  or bool(config.INDUCTOR_GEMM_RE.match(name))
                                  or bool(config.INDUCTOR_GEMV_RE.match(name)))


def _other_kind(name: str) -> str:
    """The kind of a kept op that is no GEMM: attention, moe (a MoE call), moe_part / moe_topk
    (ops inside one that add to its shape), "view" (kept only as a packed weight view),
    grouped_mm (transformers' grouped-mm experts: a moe call with `harvest --topk`), or ""."""
    if name in config.MOE_OPS:
        return "moe"
    if name in config.MOE_PARTS:
        return "moe_part"
    if name in config.MOE_TOPK_OPS:
        return "moe_topk"
    if name == config.MOE_PACKED_VIEW[0]:
        return "view"
    if name == config.GROUPED_MM_OP:
        return "grouped_mm"
    return "attention" if is_attention(name) else ""


def _packed_view(args: dict, dims) -> bool:
    """Whether an aten::view is of a 3-D uint8 tensor (config.MOE_PACKED_VIEW)."""
    types = args.get("Input type")
    return (type(types) is list and bool(types) and types[0] == config.MOE_PACKED_VIEW[1]
            and type(dims) is list and bool(dims) and type(dims[0]) is list
            and len(dims[0]) == 3)


def _keep_op(e: dict, dialect: config.Dialect, s: _Sink) -> None:
    ts, dur = e.get("ts"), e.get("dur")
    if not _time(ts) or not _duration(dur):
        # A complete event ('X') always has its duration. Without it an op's extent is unknown,
        # so neither which op nests in which (linear > matmul > mm: the innermost is the call)
        # nor which launches it made: read as zero-length, every level became a call of its own
        # (55 rows of 3563 calls from the 21 rows of 1358 of the bundled example).
        s.bad(OP_WITHOUT_TIME if _shaped_op(e.get("name"))
              else "ts or dur missing, not a number or negative")
        return
    if _tid(e.get("tid")) is None and _shaped_op(e.get("name")):
        s.bad(OP_WITHOUT_TIME)     # ops nest per thread: off its thread, a level is a call too
        return
    args, name = _args(e, s), _name(e, s)
    if args is None or name is None:
        return
    if dialect.steps_in_ops and (name.startswith(config.ANNOTATION_PREFIXES)
                                 or name.lower() in config.PHASE_WORDS):
        s.annotations.append((name, _tid(e.get("tid")), ts, ts + dur))
        return
    if name.startswith(config.COMPILED_REGION_PREFIX):
        s.compiled_regions.append((_tid(e.get("tid")), ts, ts + dur))
        return
    s.n_cpu += 1
    if ts < s.first_ts:
        s.first_ts = ts
    if ts + dur > s.last_ts:
        s.last_ts = ts + dur
    ext = _id(_arg(args, dialect.ext_keys))
    if ext is not None:
        s.cpu_ext.add(ext)
    dims = _arg(args, dialect.dims_keys)
    if dims is not None:
        if type(dims) is not list:
            s.bad("Input Dims not a list")
            dims = None
        else:
            s.n_dims += 1
    if name in config.GEMM_OPS:
        kind = "gemm"
    elif config.INDUCTOR_GEMM_RE.match(name):  # max-autotune's Triton GEMM template: a linear
        kind, name = "gemm", config.INDUCTOR_GEMM_OP
    elif config.INDUCTOR_GEMV_RE.match(name):  # an m = 1 matmul Inductor made a fused reduction
        kind, name = "gemm", config.INDUCTOR_GEMV_OP
    else:
        kind = s.op_kinds.get(name)
        if kind is None:
            kind = s.op_kinds[name] = _other_kind(name)
        if kind == "view":
            kind = "moe_part" if _packed_view(args, dims) else ""
        if not kind:
            return
    if dims is None and kind in ("gemm", "attention"):
        s.n_nodims += 1
    tid = _tid(e.get("tid"))
    types, strides = args.get("Input type") or [], args.get("Input Strides") or []
    s.ops.append(Op(name, tid, ts, ts + dur, ext, dims or [],
                    types if type(types) is list else [], strides if type(strides) is list else [],
                    kind))


def _keep_gpu(e: dict, dialect: config.Dialect, s: _Sink) -> None:
    ts, dur = e.get("ts"), e.get("dur")
    if not _time(ts) or not _duration(dur):
        s.bad("ts or dur missing, not a number or negative")
        return
    args, name = _args(e, s), _name(e, s)
    if args is None or name is None:
        return
    name = s.names.setdefault(name, name)
    s.activities.append((ts, dur, _id(args.get("correlation")),
                         _id(_arg(args, dialect.ext_keys)), name))
    dev = args.get("device")
    if type(dev) is int:
        s.device_ids.add(dev)
    if ts + dur > s.last_ts:
        s.last_ts = ts + dur


def _keep_runtime(e: dict, dialect: config.Dialect, s: _Sink) -> None:
    args, name = _args(e, s), _name(e, s)
    if args is None or name is None:
        return
    corr = _id(args.get("correlation"))
    ts = e.get("ts")
    if corr is not None:
        if not _time(ts):
            s.bad("ts missing or not a number")
            return
        api = s.names.setdefault(name, name)
        tid = _tid(e.get("tid"))
        before = s.runtimes.get(corr)
        if before is not None and before[1] == ts and before[0] == tid:
            s.repeated_launches += 1
        s.runtimes[corr] = (tid, ts, _id(_arg(args, dialect.ext_keys)), api)
        kernel = args.get("kernel")
        if type(kernel) is str:
            s.launch_kernels[corr] = s.names.setdefault(kernel, kernel)
    if not s.hip and name.startswith("hip"):
        s.hip = True


def _keep_annotation(e: dict, dialect: config.Dialect, s: _Sink) -> None:
    ts, dur = e.get("ts"), e.get("dur", 0.0)
    if dur is None:
        dur = 0.0
    name = _name(e, s)
    if name is None:
        return
    if name.startswith(config.COMPILED_REGION_PREFIX):
        if _time(ts) and _duration(dur):
            s.compiled_regions.append((_tid(e.get("tid")), ts, ts + dur))
        else:
            s.bad("ts or dur missing, not a number or negative")
        return
    lower = name.lower()
    step_or_phase = name.startswith(config.ANNOTATION_PREFIXES) or lower in config.PHASE_WORDS
    if step_or_phase or "capture" in lower:
        if not _time(ts) or not _duration(dur):
            s.bad("ts or dur missing, not a number or negative")
            return
        record = (name, _tid(e.get("tid")), ts, ts + dur)
        (s.annotations if step_or_phase else s.capture_labels).append(record)


def _keep_metadata(e: dict, s: _Sink) -> None:
    """process_name / process_labels of the GPU processes: where a device name may be."""
    if e.get("name") in ("process_name", "process_labels"):
        args = e.get("args")
        if type(args) is dict:
            for value in args.values():
                if type(value) is str and value not in s.device_labels:
                    s.device_labels.append(value)


_KEEP = {"op": _keep_op, "gpu": _keep_gpu, "runtime": _keep_runtime,
         "annotation": _keep_annotation}


def read_events(path: Path, fmt: str) -> RawTrace:
    """Stream the trace's events once and keep what config.py declares (see the module doc).

    Events of a kept category that are malformed (no or a wrongly typed ph/ts/dur/args/name,
    negative durations) are skipped and counted in RawTrace.malformed.
    """
    sink = _Sink()
    kinds = config.CATEGORY_KINDS
    prefix = "item" if fmt == "array" else "traceEvents.item"
    f = open_bytes(path)
    try:
        for e in ijson.items(f, prefix, use_float=True):
            if type(e) is not dict:
                sink.bad("event not an object")
                continue
            cat = e.get("cat")
            found = kinds.get(cat) if type(cat) is str else None
            if found is None:
                if e.get("ph") == "M":
                    _keep_metadata(e, sink)
                continue
            if e.get("ph") != "X":
                sink.bad("ph missing or not 'X'")
                continue
            dialect, kind = found
            sink.dialects.add(dialect.name)
            _KEEP[kind](e, dialect, sink)
    except TunerError:
        raise
    except Exception as exc:  # noqa: BLE001 - every decode/parse failure becomes one line
        raise _read_error(path, exc) from None
    finally:
        f.close()
    return sink.raw()
