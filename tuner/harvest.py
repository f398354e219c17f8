"""`tuner harvest`: real call shapes from torch profiler (Kineto / Chrome) traces.

A trace is read once, streaming (ijson), keeping only what the table needs:
- the GEMM and attention CPU ops (with "Input Dims", "Input type", "Input Strides"),
- the runtime launch events (thread, time, correlation id),
- the GPU activities (kernels, memsets, memcopies),
- the step annotations (ProfilerStep#N, vLLM execute_context_..., SGLang step[...], prefill/decode).

Then:
1. GEMM ops nest (linear -> matmul -> mm): by time containment on the same thread, the innermost
   GEMM-family op is the call; an attention op and everything under it is one attention call.
2. Each GPU activity goes to the op that launched it: its runtime event (same correlation id) lies
   inside the op on the same thread; without a runtime event the activity's own External id is used.
   A split-K reduce kernel is launched inside its GEMM op, so it counts for that GEMM.
3. Steps come from the markers (or `--steps N`, or the whole trace as one step); each step is
   prefill, decode or other (annotation, else attention q_len, else GEMM m).
4. Calls are grouped by signature and phase into the ShapeTable (tuner.shapetable).

The public API: `read_trace`, `harvest`, `aggregate`, `live`, `watch`, `summarize`.
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import gzip
import importlib
import importlib.util
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from . import shapetable
from .errors import TunerError, info, warn

try:  # the C backend is ~10x faster; fall back to whatever ijson has
    import ijson.backends.yajl2_c as ijson
except ImportError:  # pragma: no cover - depends on the ijson build
    import ijson  # type: ignore[no-redef]

import ijson as _ijson_common

JSON_ERRORS = (_ijson_common.common.JSONError, _ijson_common.common.IncompleteJSONError)

# ----------------------------------------------------------------------------------------- op sets
GEMM_CORE = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm"}
GEMM_WRAPPERS = {"aten::linear", "aten::matmul"}
GEMM_OPS = GEMM_CORE | GEMM_WRAPPERS

# Attention ops whose q/k are [batch, heads, len, head_dim].
ATTN_BHLD = {
    "aten::scaled_dot_product_attention",
    "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention",
    "aten::_scaled_dot_product_attention_math",
    "aten::_scaled_dot_product_fused_attention_overrideable",
    "aten::_cudnn_attention_forward",
}
# Attention ops whose q/k are [batch, len, heads, head_dim] (or [tokens, heads, head_dim] varlen).
ATTN_BLHD = {
    "aten::_flash_attention_forward",
    "aten::_efficient_attention_forward",
}
# Other attention ops (flash-attn, vLLM, custom): "attn"/"attention" in a CPU op's name, or the
# vLLM flash-attention extension's ops; never a backward op.
ATTN_NAME_RE = re.compile(r"attn|attention|_vllm_fa\d|mha_(?:varlen_)?fwd", re.IGNORECASE)

GPU_CATS = {"kernel", "gpu_memset", "gpu_memcpy"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver", "runtime"}

DTYPES = {
    "c10::BFloat16": "bfloat16",
    "c10::Half": "float16",
    "float": "float32",
    "double": "float64",
    "c10::Float8_e4m3fn": "float8_e4m3fn",
    "c10::Float8_e5m2": "float8_e5m2",
    "c10::Float8_e4m3fnuz": "float8_e4m3fnuz",
    "c10::Float8_e5m2fnuz": "float8_e5m2fnuz",
    "signed char": "int8",
    "unsigned char": "uint8",
    "short int": "int16",
    "int": "int32",
    "long int": "int64",
    "bool": "bool",
    "c10::complex<float>": "complex64",
    "c10::complex<double>": "complex128",
}

PROFILER_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
# vLLM: execute_context_X(Y)_generation_Z(W) (X prefill requests with Y tokens, Z decode requests
# with W tokens); newer builds insert a counter (execute_7_context_...) and shape details in ().
VLLM_STEP_RE = re.compile(r"^execute_(?:\d+_)?context_(\d+)\(([^)]*)\)_generation_(\d+)\(([^)]*)\)")
SGLANG_STEP_RE = re.compile(r"^step\[(DECODE|EXTEND|PREFILL|MIXED|IDLE)\b", re.IGNORECASE)
PHASE_WORDS = {"prefill": "prefill", "decode": "decode", "extend": "prefill", "generate": "decode"}

TRACE_SUFFIXES = (".json", ".json.gz")
# vLLM: <instance>-rank-3.<time>.pt.trace.json.gz; SGLang: <time>-TP-3[-DP-0...].trace.json.gz;
# torch DDP scripts: rank_3, rank3.
RANK_RE = re.compile(r"(?:\brank[-_]?|[-_]rank[-_]?|-TP-)(\d+)", re.IGNORECASE)

LAUNCH_BOUND = 0.60   # GPU busy below this fraction of the step: launch-bound warning
UNATTRIBUTED_WARN = 0.005


# --------------------------------------------------------------------------------------- records
@dataclass
class Op:
    """A GEMM-family or attention CPU op, as recorded."""
    name: str
    tid: object
    ts: float
    end: float
    ext: int | None
    dims: list
    types: list
    strides: list
    concrete: list
    kind: str              # "gemm" or "attention"
    parent: int = -1       # index of the enclosing GEMM/attention op on the same thread
    has_gemm_child: bool = False


@dataclass
class Call:
    """One GEMM or attention call with its shape and the GPU time of the kernels it launched."""
    op: str
    family: str
    m: int
    n: int
    k: int
    batch: int
    dtype: str
    layout: str
    ts: float
    heads: int | None = None
    kv_heads: int | None = None
    q_len: int | None = None
    kv_len: int | None = None
    head_dim: int | None = None
    gpu_us: float = 0.0
    n_kernels: int = 0
    kernels: dict = field(default_factory=dict)   # kernel name -> count
    step: int = -1


@dataclass
class Step:
    name: str
    start: float
    end: float              # CPU end of the marker
    phase: str = "other"
    phase_from: str = ""    # what decided the phase
    gpu_end: float = 0.0    # end of the last GPU activity launched in the step
    intervals: list = field(default_factory=list)   # GPU activity (start, end)
    n_calls: int = 0
    weight: int = 1         # --steps N on a trace without markers: one window that is N steps

    @property
    def wall_us(self) -> float:
        return (max(self.end, self.gpu_end) - self.start) / self.weight

    @property
    def gpu_busy_us(self) -> float:
        return union_length(self.intervals) / self.weight


@dataclass
class TraceData:
    """What one trace contributes: its calls and steps, plus facts for the summary."""
    path: str
    device: str
    backend: str                 # cuda, hip, or cpu
    rank: int | None
    has_gpu: bool
    calls: list
    steps: list
    gpu_total_us: float = 0.0    # sum of all GPU activity durations
    gpu_in_calls_us: float = 0.0
    gpu_other_ops_us: float = 0.0
    gpu_unattributed_us: float = 0.0
    n_unattributed: int = 0
    steps_from: str = ""
    notes: list = field(default_factory=list)


# ------------------------------------------------------------------------------------ file access
def _open_bytes(path: Path):
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


def _read_errors(path: Path, exc: BaseException) -> TunerError:
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


def _read_header(path: Path) -> dict:
    """Read the small top-level keys that precede traceEvents (device, rank, record_shapes).

    Stops at traceEvents, so only the head of the file is read. Returns {"format": "object" |
    "array", "deviceProperties": [...], "distributedInfo": {...}, "record_shapes": ...,
    "has_events": bool-or-None (None: not seen before the end of the header)}.
    """
    header: dict = {"format": None, "has_events": None}
    if path.is_file() and path.stat().st_size == 0:
        raise TunerError(f"{path}: empty file, not a trace")
    wanted = {"deviceProperties", "distributedInfo", "record_shapes"}
    f = _open_bytes(path)
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
        raise _read_errors(path, exc) from None
    finally:
        f.close()
    return header


def trace_rank(path: Path) -> int | None:
    """The rank a trace file belongs to: from its name (rank-3, -TP-3, ...), else its header."""
    m = RANK_RE.search(path.name)
    if m:
        return int(m.group(1))
    try:
        rank = (_read_header(path).get("distributedInfo") or {}).get("rank")
    except TunerError:
        return None
    return int(rank) if isinstance(rank, (int, float)) else None


def is_trace_file(path: Path) -> bool:
    name = path.name.lower()
    return path.is_file() and name.endswith(TRACE_SUFFIXES) and not name.endswith(".meta.json")


def resolve_inputs(paths: list, rank: int | None = None) -> list[Path]:
    """Expand directories (one file per rank: pick one rank) and check ranks are never mixed."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
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
                out.extend(chosen)
            else:
                if rank is not None:
                    raise TunerError(f"--rank {rank}: the traces in {p} do not say their rank")
                if len(files) > 1:
                    info(f"{p}: {len(files)} trace files and no rank in their names; harvesting "
                         f"the first, {files[0].name} (pass a file to choose)")
                out.append(files[0])
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


# ----------------------------------------------------------------------------------- the parse
@dataclass
class _Raw:
    ops: list
    runtimes: dict          # correlation -> (tid, ts, ext)
    activities: list        # (ts, dur, corr, ext, name)
    annotations: list       # (name, tid, ts, end)
    cpu_ext: set
    n_cpu_ops: int
    n_cpu_ops_with_dims: int
    n_gemm_like_no_dims: int
    first_ts: float
    last_ts: float
    backend: str
    device_ids: set


def _is_attention(name: str) -> bool:
    if name in ATTN_BHLD or name in ATTN_BLHD:
        return True
    lower = name.lower()
    if "backward" in lower or "bwd" in lower:
        return False
    if name.startswith("aten::"):
        return "attention" in name
    return bool(ATTN_NAME_RE.search(name))


def _parse_events(path: Path, fmt: str) -> _Raw:
    ops: list = []
    runtimes: dict = {}
    activities: list = []
    annotations: list = []
    cpu_ext: set = set()
    n_cpu = n_dims = n_nodims = 0
    first_ts, last_ts = math.inf, -math.inf
    hip = False
    device_ids: set = set()
    kernel_names: dict = {}
    attention_cache: dict = {}

    prefix = "item" if fmt == "array" else "traceEvents.item"
    f = _open_bytes(path)
    try:
        for e in ijson.items(f, prefix, use_float=True):
            if not isinstance(e, dict) or e.get("ph") != "X":
                continue
            cat = e.get("cat")
            if cat == "cpu_op" or cat == "operator":
                n_cpu += 1
                args = e.get("args") or {}
                ts = e.get("ts")
                dur = e.get("dur") or 0.0
                if ts is None:
                    continue
                if ts < first_ts:
                    first_ts = ts
                if ts + dur > last_ts:
                    last_ts = ts + dur
                ext = args.get("External id")
                if ext is not None:
                    cpu_ext.add(ext)
                dims = args.get("Input Dims")
                if dims is not None:
                    n_dims += 1
                name = e.get("name", "")
                if name in GEMM_OPS:
                    kind = "gemm"
                else:
                    kind = attention_cache.get(name)
                    if kind is None:
                        kind = attention_cache[name] = "attention" if _is_attention(name) else ""
                    if not kind:
                        continue
                if dims is None:
                    n_nodims += 1
                ops.append(Op(name, e.get("tid"), ts, ts + dur, ext, dims or [],
                              args.get("Input type") or [], args.get("Input Strides") or [],
                              args.get("Concrete Inputs") or [], kind))
            elif cat in GPU_CATS:
                args = e.get("args") or {}
                ts, dur = e.get("ts"), e.get("dur")
                if ts is None or dur is None:
                    continue
                name = e.get("name", "")
                name = kernel_names.setdefault(name, name)
                activities.append((ts, dur, args.get("correlation"), args.get("External id"),
                                   name))
                dev = args.get("device")
                if dev is not None:
                    device_ids.add(dev)
                if ts + dur > last_ts:
                    last_ts = ts + dur
            elif cat in RUNTIME_CATS:
                args = e.get("args") or {}
                corr = args.get("correlation")
                if corr is not None:
                    runtimes[corr] = (e.get("tid"), e.get("ts"), args.get("External id"))
                if not hip and e.get("name", "").startswith("hip"):
                    hip = True
            elif cat == "user_annotation":
                ts = e.get("ts")
                if ts is None:
                    continue
                name = e.get("name", "")
                if (name.startswith(("ProfilerStep#", "execute_", "step["))
                        or name.lower() in PHASE_WORDS):
                    annotations.append((name, e.get("tid"), ts, ts + (e.get("dur") or 0.0)))
    except TunerError:
        raise
    except Exception as exc:  # noqa: BLE001 - every decode/parse failure becomes one line
        raise _read_errors(path, exc) from None
    finally:
        f.close()
    backend = "hip" if hip else ("cuda" if activities else "cpu")
    return _Raw(ops, runtimes, activities, annotations, cpu_ext, n_cpu, n_dims, n_nodims,
                first_ts, last_ts, backend, device_ids)


# ------------------------------------------------------------------------------------ op nesting
def _nest(ops: list[Op]) -> dict:
    """Set each op's parent (innermost enclosing GEMM/attention op on its thread).

    Returns {tid: (starts, indices)} sorted by start, for `_innermost`.
    """
    by_tid: dict = {}
    for i, op in enumerate(ops):
        by_tid.setdefault(op.tid, []).append(i)
    index = {}
    for tid, idx in by_tid.items():
        idx.sort(key=lambda i: (ops[i].ts, -ops[i].end))
        stack: list[int] = []
        for i in idx:
            op = ops[i]
            while stack and ops[stack[-1]].end < op.ts:
                stack.pop()
            # a child must end within its parent (tiny float slack)
            while stack and ops[stack[-1]].end + 1e-3 < op.end:
                stack.pop()
            op.parent = stack[-1] if stack else -1
            stack.append(i)
        index[tid] = ([ops[i].ts for i in idx], idx)
    for i, op in enumerate(ops):
        if op.kind == "gemm":
            p = op.parent
            while p >= 0:
                ops[p].has_gemm_child = True
                p = ops[p].parent
    return index


def _innermost(ops: list[Op], index: dict, tid, ts: float) -> int:
    """The innermost GEMM/attention op on thread `tid` whose interval contains `ts`, or -1."""
    entry = index.get(tid)
    if entry is None:
        return -1
    starts, idx = entry
    j = bisect.bisect_right(starts, ts) - 1
    # walk back: the candidate, then its ancestors, until one contains ts
    if j < 0:
        return -1
    # The op that started last before ts contains it, or one of its ancestors does (ops nest):
    # an op containing ts that started earlier also contains that op.
    i = idx[j]
    while i >= 0:
        if ops[i].ts <= ts <= ops[i].end:
            return i
        i = ops[i].parent
    return -1


def _attention_call_above(ops: list[Op], i: int, calls: dict) -> int:
    """The outermost attention call among op i and its ancestors, or -1."""
    found = -1
    while i >= 0:
        if ops[i].kind == "attention" and i in calls:
            found = i
        i = ops[i].parent
    return found


def _call_owner(ops: list[Op], i: int, calls: dict) -> int:
    """The call that a GPU activity launched inside op i belongs to, or -1 (another op's)."""
    attn = _attention_call_above(ops, i, calls)
    if attn >= 0:
        return attn
    return i if i in calls else -1


# -------------------------------------------------------------------------------- shapes of calls
def _dtype(types: list, i: int) -> str:
    if i < len(types) and types[i]:
        return DTYPES.get(types[i], types[i])
    return "unknown"


def _mat_flag(dims: list, strides: list, i: int) -> str:
    """'N' if matrix input i is row-major in its last two dims, 'T' if it is a transposed view."""
    if i >= len(strides) or i >= len(dims):
        return "N"
    d, s = dims[i], strides[i]
    if not isinstance(d, list) or not isinstance(s, list) or len(d) < 2 or len(s) < 2:
        return "N"
    rows, cols = d[-2], d[-1]
    s_row, s_col = s[-2], s[-1]
    if s_col == 1 and (s_row >= cols or rows == 1):
        return "N"
    if s_row == 1 and (s_col >= rows or cols == 1):
        return "T"
    return "N" if s_col == 1 else "T"


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out


def _is_mat(d) -> bool:
    return isinstance(d, list) and len(d) >= 2 and all(isinstance(x, (int, float)) for x in d)


def gemm_shape(op: Op) -> dict | None:
    """m, n, k, batch, dtype, layout of a GEMM-family op (DESIGN.md convention), or None."""
    name, dims, types, strides = op.name, op.dims, op.types, op.strides
    if name in ("aten::addmm", "aten::baddbmm"):
        a, b = 1, 2
    else:
        a, b = 0, 1
    if len(dims) <= max(a, b):
        return None
    da, db = dims[a], dims[b]
    if name == "aten::linear":
        # input [..., k], weight [n, k]: B is the transposed view of the weight
        if not isinstance(da, list) or len(da) < 1 or not _is_mat(db) or len(db) != 2:
            return None
        m = _prod(da[:-1]) if len(da) > 1 else 1
        n, k = int(db[0]), int(db[1])
        flag_a = _mat_flag(dims, strides, a) if len(da) >= 2 else "N"
        flag_b = "T" if _mat_flag(dims, strides, b) == "N" else "N"
        return dict(m=m, n=n, k=k, batch=1, dtype=_dtype(types, a), layout=flag_a + flag_b)
    if not _is_mat(da) or not _is_mat(db):
        return None
    if name in ("aten::bmm", "aten::baddbmm"):
        if len(da) != 3 or len(db) != 3:
            return None
        batch, m, k, n = int(da[0]), int(da[1]), int(da[2]), int(db[2])
    elif name == "aten::matmul":
        if len(db) == 2:      # [..., m, k] @ [k, n]: folds into one GEMM
            batch, m, k, n = 1, _prod(da[:-1]), int(da[-1]), int(db[1])
        else:
            lead = da[:-2] if len(da) >= len(db) else db[:-2]
            batch, m, k, n = _prod(lead), int(da[-2]), int(da[-1]), int(db[-1])
    else:                     # mm, addmm, _scaled_mm
        if len(da) != 2 or len(db) != 2:
            return None
        batch, m, k, n = 1, int(da[0]), int(da[1]), int(db[1])
    layout = _mat_flag(dims, strides, a) + _mat_flag(dims, strides, b)
    return dict(m=m, n=n, k=k, batch=batch, dtype=_dtype(types, a), layout=layout)


def attention_shape(op: Op) -> dict | None:
    """batch, heads, kv_heads, q_len, kv_len, head_dim of an attention op, as far as dims go."""
    dims = op.dims
    if len(dims) < 2 or not _is_mat(dims[0]) or not isinstance(dims[1], list):
        return None
    q, kk = dims[0], dims[1]
    out = dict(batch=None, heads=None, kv_heads=None, q_len=None, kv_len=None, head_dim=None)
    if len(q) == 4:
        if op.name in ATTN_BHLD or (op.name not in ATTN_BLHD and "scaled_dot_product" in op.name):
            out.update(batch=q[0], heads=q[1], q_len=q[2], head_dim=q[3])
            if len(kk) == 4:
                out.update(kv_heads=kk[1], kv_len=kk[2])
        else:
            out.update(batch=q[0], q_len=q[1], heads=q[2], head_dim=q[3])
            if len(kk) == 4:
                out.update(kv_len=kk[1], kv_heads=kk[2])
    elif len(q) == 3:
        # varlen [tokens, heads, head_dim]; batch from cu_seqlens_q ([batch + 1]) when present
        out.update(heads=q[1], head_dim=q[2])
        if len(kk) == 3:
            out.update(kv_heads=kk[1])
        for d in dims[2:6]:
            if isinstance(d, list) and len(d) == 1 and d[0] and d[0] > 1:
                out["batch"] = int(d[0]) - 1
                break
        if out["batch"]:
            out["q_len"] = int(q[0]) // out["batch"] if q[0] % out["batch"] == 0 else None
    else:
        return None
    out = {k: (int(v) if v is not None else None) for k, v in out.items()}
    out["dtype"] = _dtype(op.types, 0)
    return out


def _make_call(op: Op) -> Call | None:
    if op.kind == "gemm":
        s = gemm_shape(op)
        if s is None:
            return None
        return Call(op=op.name, family="gemm", ts=op.ts, **s)
    s = attention_shape(op)
    if s is None:
        return None
    return Call(op=op.name, family="attention", ts=op.ts,
                m=s["q_len"] or 0, n=s["kv_len"] or 0, k=s["head_dim"] or 0,
                batch=s["batch"] or 0, dtype=s["dtype"], layout="",
                heads=s["heads"], kv_heads=s["kv_heads"], q_len=s["q_len"],
                kv_len=s["kv_len"], head_dim=s["head_dim"])


# ----------------------------------------------------------------------------------------- steps
def union_length(intervals: list) -> float:
    """Total length of the union of (start, end) intervals (GPU busy time, not a sum)."""
    if not intervals:
        return 0.0
    total = 0.0
    cur_s = cur_e = None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    total += cur_e - cur_s
    return total


def _steps_from_markers(annotations: list) -> tuple[list[Step], str]:
    vllm = [a for a in annotations if VLLM_STEP_RE.match(a[0])]
    sglang = [a for a in annotations if SGLANG_STEP_RE.match(a[0])]
    prof = [a for a in annotations if PROFILER_STEP_RE.match(a[0])]
    if vllm:
        steps = []
        for name, _tid, ts, end in vllm:
            m = VLLM_STEP_RE.match(name)
            ctx, gen = int(m.group(1)), int(m.group(3))
            phase = "prefill" if ctx > 0 else ("decode" if gen > 0 else "other")
            steps.append(Step(name, ts, end, phase, "vLLM annotation"))
        return _no_overlap(steps), "vLLM execute_context_*_generation_* annotations"
    if sglang:
        steps = []
        for name, _tid, ts, end in sglang:
            kind = SGLANG_STEP_RE.match(name).group(1).upper()
            phase = {"DECODE": "decode", "EXTEND": "prefill", "PREFILL": "prefill",
                     "MIXED": "prefill"}.get(kind, "other")
            steps.append(Step(name, ts, end, phase, "SGLang annotation"))
        return _no_overlap(steps), "SGLang step[...] annotations"
    if prof:
        steps = [Step(name, ts, end) for name, _tid, ts, end in prof]
        return _no_overlap(steps), "ProfilerStep#N markers"
    return [], ""


def _no_overlap(steps: list[Step]) -> list[Step]:
    """Sort steps by start; a step nested in the previous one (same marker twice) is dropped."""
    steps.sort(key=lambda s: s.start)
    out: list[Step] = []
    for s in steps:
        if out and s.start < out[-1].end and s.end <= out[-1].end:
            continue
        out.append(s)
    return out


def _step_of(starts: list, steps: list[Step], ts: float) -> int:
    j = bisect.bisect_right(starts, ts) - 1
    if j >= 0 and ts <= steps[j].end:
        return j
    return -1


def _classify_steps(steps: list[Step], calls: list[Call], annotations: list) -> None:
    """Give each step without an annotated phase a phase: prefill, decode or other."""
    starts = [s.start for s in steps]
    # 1. a "prefill"/"decode" user annotation inside the step
    for name, _tid, ts, _end in annotations:
        word = PHASE_WORDS.get(name.lower())
        if word is None:
            continue
        j = _step_of(starts, steps, ts)
        if j >= 0 and not steps[j].phase_from:
            steps[j].phase, steps[j].phase_from = word, f"'{name}' annotation"
    # 2. attention q_len; 3. GEMM m relative to the other steps
    q_lens: dict = {}
    ms: dict = {}
    for c in calls:
        if c.step < 0:
            continue
        if c.family == "attention" and c.q_len:
            q_lens.setdefault(c.step, []).append(c.q_len)
        elif c.family == "gemm" and c.batch == 1:
            ms.setdefault(c.step, []).append(c.m)
    typical = {j: statistics.median_low(v) for j, v in ms.items()}
    distinct = sorted(set(typical.values()))
    for j, s in enumerate(steps):
        if s.phase_from:
            continue
        if j in q_lens:
            s.phase = "decode" if max(q_lens[j]) == 1 else "prefill"
            s.phase_from = "attention q_len"
        elif j in typical and len(distinct) > 1:
            s.phase = "decode" if typical[j] == distinct[0] else "prefill"
            s.phase_from = "GEMM m"


# -------------------------------------------------------------------------------------- read one
@contextlib.contextmanager
def _no_gc():
    """Pause the cyclic GC: the parse keeps ~10^6 small acyclic objects alive, and the collector
    re-scanning them as they pile up costs more than the parse (39 s -> 23 s on a 1 GB trace)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def read_trace(path, steps: int | None = None) -> TraceData:
    """Parse one trace file into its calls and steps (see the module docstring)."""
    with _no_gc():
        return _read_trace(Path(path), steps)


def _read_trace(path: Path, steps: int | None) -> TraceData:
    header = _read_header(path)
    if not header.get("has_events"):
        raise TunerError(f"{path}: JSON without traceEvents, not a torch profiler trace")
    raw = _parse_events(path, header["format"])
    if raw.n_cpu_ops == 0 and not raw.activities:
        raise TunerError(f"{path}: the trace has no CPU ops and no GPU kernels (empty trace)")
    notes: list[str] = []

    ops = raw.ops
    if not ops:
        kind = "CPU-only trace, " if not raw.activities else ""
        raise TunerError(f"{path}: {kind}no GEMM or attention ops (aten::mm/addmm/bmm/linear/"
                         f"matmul, scaled_dot_product_attention, flash-attention) among its "
                         f"{raw.n_cpu_ops} CPU ops; nothing to harvest")
    if raw.n_cpu_ops_with_dims == 0 or raw.n_gemm_like_no_dims == len(ops):
        raise TunerError(f"{path}: recorded without record_shapes ({len(ops)} GEMM/attention ops "
                         "but no Input Dims); re-capture with "
                         "torch.profiler.profile(record_shapes=True)")
    if raw.n_gemm_like_no_dims:
        notes.append(f"{raw.n_gemm_like_no_dims} GEMM/attention ops had no Input Dims and are "
                     "skipped")

    index = _nest(ops)
    # Attention calls first: the outermost attention op whose dims give a shape (an autograd
    # wrapper without dims leaves the call to the op inside it).
    attention: dict[int, Call] = {}
    unparsed = 0
    for i, op in enumerate(ops):
        if op.kind == "attention" and op.dims:
            c = _make_call(op)
            if c is None:
                unparsed += 1
            else:
                attention[i] = c
    call_of_op: dict[int, Call] = {i: c for i, c in attention.items()
                                   if _attention_call_above(ops, ops[i].parent, attention) < 0}
    # GEMM calls: the innermost GEMM-family op, unless it is part of an attention call
    for i, op in enumerate(ops):
        if op.kind != "gemm" or not op.dims or op.has_gemm_child:
            continue
        if _attention_call_above(ops, op.parent, call_of_op) >= 0:
            continue
        c = _make_call(op)
        if c is None:
            unparsed += 1
        else:
            call_of_op[i] = c
    if unparsed:
        notes.append(f"{unparsed} GEMM/attention ops whose dims give no GEMM or attention shape "
                     "(e.g. a matrix-vector matmul) are skipped")
    if not call_of_op:
        raise TunerError(f"{path}: no GEMM or attention call with a usable shape")

    # ---- steps
    step_list, steps_from = _steps_from_markers(raw.annotations)
    whole = Step("whole trace", raw.first_ts, raw.last_ts)
    if step_list and steps:
        notes.append(f"--steps {steps} ignored: the trace has step markers ({steps_from})")
    if not step_list:
        if steps:
            whole.weight = int(steps)
            steps_from = f"--steps {steps} over the whole trace"
        else:
            steps_from = "whole trace as one step"
            notes.append("no step markers (ProfilerStep#N, vLLM or SGLang annotations): the whole "
                         "trace is counted as one step; pass --steps N if it holds N steps")
        step_list = [whole]
    starts = [s.start for s in step_list]

    calls = list(call_of_op.values())
    outside = 0
    for c in calls:
        c.step = _step_of(starts, step_list, c.ts)
        if c.step < 0:
            outside += 1
        else:
            step_list[c.step].n_calls += 1

    # ---- GPU activities -> owning call, step intervals
    gpu_total = gpu_calls = gpu_other = gpu_unattr = 0.0
    n_unattr = 0
    owner_cache: dict = {}
    op_of_ext = {op.ext: i for i, op in enumerate(ops) if op.ext is not None}
    for ts, dur, corr, ext, kname in raw.activities:
        gpu_total += dur
        rt = raw.runtimes.get(corr) if corr is not None else None
        owner = -1
        launch_ts = ts
        rext = None
        if rt is not None and rt[1] is not None:
            tid, rts, rext = rt
            launch_ts = rts
            key = (tid, rts)
            if key in owner_cache:
                owner = owner_cache[key]
            else:
                inner = _innermost(ops, index, tid, rts)
                owner = _call_owner(ops, inner, call_of_op) if inner >= 0 else -1
                owner_cache[key] = owner
        if owner < 0:   # no launch inside a GEMM/attention op: the External id may still say
            for e_id in (ext, rext):
                if e_id is not None and e_id in op_of_ext:
                    owner = _call_owner(ops, op_of_ext[e_id], call_of_op)
                    break
        attributed = owner >= 0 or (ext is not None and ext in raw.cpu_ext) \
            or (rext is not None and rext in raw.cpu_ext)
        c = call_of_op.get(owner) if owner >= 0 else None
        if c is not None:
            c.gpu_us += dur
            c.n_kernels += 1
            c.kernels[kname] = c.kernels.get(kname, 0) + 1
            gpu_calls += dur
        elif attributed:
            gpu_other += dur
        else:
            gpu_unattr += dur
            n_unattr += 1
        j = _step_of(starts, step_list, launch_ts)
        if j >= 0:
            st = step_list[j]
            # relative to the step start: absolute times (~1e12 us) would cost precision
            st.intervals.append((ts - st.start, ts - st.start + dur))
            if ts + dur > st.gpu_end:
                st.gpu_end = ts + dur

    # drop empty steps (e.g. the ProfilerStep the profiler opens when it stops)
    kept = [j for j, s in enumerate(step_list) if s.n_calls or s.intervals]
    if len(kept) < len(step_list):
        remap = {old: new for new, old in enumerate(kept)}
        dropped = len(step_list) - len(kept)
        step_list = [step_list[j] for j in kept]
        for c in calls:
            c.step = remap.get(c.step, -1)
        if len(step_list) > 0:
            notes.append(f"{dropped} empty step marker(s) ignored")
    if outside:
        notes.append(f"{outside} calls outside any step are not counted")
    calls = [c for c in calls if c.step >= 0]
    if not calls:
        raise TunerError(f"{path}: no GEMM or attention call falls inside a step")
    _classify_steps(step_list, calls, raw.annotations)

    device = _device_name(header, raw)
    rank = trace_rank(path) if RANK_RE.search(path.name) else (
        (header.get("distributedInfo") or {}).get("rank"))
    return TraceData(path=str(path), device=device, backend=raw.backend, rank=rank,
                     has_gpu=bool(raw.activities), calls=calls, steps=step_list,
                     gpu_total_us=gpu_total, gpu_in_calls_us=gpu_calls,
                     gpu_other_ops_us=gpu_other, gpu_unattributed_us=gpu_unattr,
                     n_unattributed=n_unattr, steps_from=steps_from, notes=notes)


def _device_name(header: dict, raw: _Raw) -> str:
    props = header.get("deviceProperties") or []
    if not raw.activities:
        return "cpu"
    if isinstance(props, list) and props:
        for p in props:
            if isinstance(p, dict) and p.get("id") in raw.device_ids and p.get("name"):
                return str(p["name"])
        if isinstance(props[0], dict) and props[0].get("name"):
            return str(props[0]["name"])
    return "unknown"


# ------------------------------------------------------------------------------------- aggregate
KEY_FIELDS = ("op", "family", "m", "n", "k", "batch", "dtype", "layout",
              "heads", "kv_heads", "q_len", "kv_len", "head_dim")


def aggregate(traces: list[TraceData], phase: str | None = None) -> pd.DataFrame:
    """Group the calls of one or more traces (of one rank) into the ShapeTable."""
    phase_steps: dict[str, list[Step]] = {}
    for t in traces:
        for s in t.steps:
            phase_steps.setdefault(s.phase, []).append(s)
    has_gpu = any(t.has_gpu for t in traces)
    groups: dict = {}
    for t in traces:
        for c in t.calls:
            ph = t.steps[c.step].phase
            key = tuple(getattr(c, f) for f in KEY_FIELDS) + (ph,)
            groups.setdefault(key, []).append(c)
    source = ", ".join(dict.fromkeys(Path(t.path).name for t in traces))
    device = ", ".join(dict.fromkeys(t.device for t in traces))
    rows = []
    for key, cs in groups.items():
        ph = key[-1]
        if phase and ph != phase:
            continue
        fields = dict(zip(KEY_FIELDS, key[:-1]))
        st = phase_steps[ph]
        n_steps = sum(s.weight for s in st)
        wall = [s.wall_us for s in st for _ in range(s.weight)]
        busy = [s.gpu_busy_us for s in st for _ in range(s.weight)]
        step_us = statistics.median(wall) if wall else math.nan
        timed = [c.gpu_us for c in cs if c.n_kernels]
        us = statistics.median(timed) if (has_gpu and timed) else math.nan
        step_gpu = statistics.median(busy) if has_gpu and busy else math.nan
        cps = len(cs) / n_steps
        kernels: dict = {}
        for c in cs:
            for kn, cnt in c.kernels.items():
                kernels[kn] = kernels.get(kn, 0) + cnt
        rows.append(dict(
            **{k: v for k, v in fields.items() if k not in shapetable.ATTENTION_COLUMNS},
            phase=ph, calls=len(cs), steps=n_steps, calls_per_step=cps, us_per_call=us,
            step_us=step_us, step_gpu_us=step_gpu,
            share=(us * cps / step_us) if step_us and step_us > 0 else math.nan,
            kernels="; ".join(sorted(kernels, key=lambda n: -kernels[n])),
            source=source, device=device,
            **{k: fields[k] for k in shapetable.ATTENTION_COLUMNS},
        ))
    if not rows:
        found = sorted(phase_steps)
        raise TunerError(f"no calls in phase {phase!r} (phases in the trace: {', '.join(found)})")
    df = pd.DataFrame(rows)
    df = df.sort_values(["share", "calls_per_step", "us_per_call"], ascending=False,
                        na_position="last", kind="stable")
    return shapetable.normalize(df)


# ----------------------------------------------------------------------------------- top level
@dataclass
class HarvestResult:
    table: pd.DataFrame
    traces: list
    output: Path | None = None


def default_output(path: Path) -> Path:
    """shapes/<trace stem>.parquet (the stem without .pt.trace.json.gz and such)."""
    name = path.name
    for suffix in (".gz", ".json", ".trace", ".pt"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return Path("shapes") / f"{name or 'trace'}.parquet"


def harvest(paths: list, output=None, *, rank: int | None = None, steps: int | None = None,
            phase: str | None = None, quiet: bool = False) -> HarvestResult:
    """Harvest one rank's trace(s) into a ShapeTable; write it when `output` is given."""
    files = resolve_inputs(list(paths), rank)
    traces = [read_trace(f, steps=steps) for f in files]
    table = aggregate(traces, phase)
    result = HarvestResult(table, traces)
    if output is not None:
        result.output = shapetable.write(table, output)
    if not quiet:
        report(result)
    return result


def report(result: HarvestResult, top: int = 12, stream=None) -> None:
    """Print the warnings, the step summary and the top rows by share."""
    stream = stream or sys.stdout
    for t in result.traces:
        for note in t.notes:
            warn(f"{Path(t.path).name}: {note}")
        if not t.has_gpu:
            warn(f"{Path(t.path).name}: CPU-only trace (no GPU kernels): shapes and calls per step "
                 "are real, GPU times are unknown (us_per_call, step_gpu_us, share are NaN)")
        elif t.gpu_total_us > 0 and t.gpu_unattributed_us / t.gpu_total_us > UNATTRIBUTED_WARN:
            warn(f"{Path(t.path).name}: {100 * t.gpu_unattributed_us / t.gpu_total_us:.1f}% of GPU "
                 f"time ({t.n_unattributed} kernels) has no owning op (e.g. CUDA-graph replays) "
                 "and is in no row; profile eagerly (no graphs) to see those calls")
    for line in summarize(result):
        print(line, file=stream)
    df = result.table
    for ph in ("prefill", "decode", "other"):
        rows = df[df.phase == ph]
        if rows.empty:
            continue
        step_us, gpu_us = rows.step_us.iloc[0], rows.step_gpu_us.iloc[0]
        if step_us > 0 and not math.isnan(gpu_us) and gpu_us / step_us < LAUNCH_BOUND:
            warn(f"the {ph} step is launch-bound: the GPU is busy {100 * gpu_us / step_us:.0f}% "
                 f"of the step ({gpu_us:.0f} of {step_us:.0f} us); kernel savings will not show "
                 "until the step is graph-captured (CUDA/HIP graphs)")
    print(format_table(df, top), file=stream)
    if result.output is not None:
        print(f"wrote {len(df)} rows to {result.output}", file=stream)


def summarize(result: HarvestResult) -> list[str]:
    lines = []
    for t in result.traces:
        phases: dict = {}
        for s in t.steps:
            phases.setdefault(s.phase, []).append(s)
        parts = []
        for ph, st in phases.items():
            wall = statistics.median([s.wall_us for s in st])
            parts.append(f"{ph} {sum(s.weight for s in st)} (median {wall / 1000:.2f} ms)")
        lines.append(f"{Path(t.path).name}: {t.device} [{t.backend}], {len(t.calls)} calls; steps "
                     f"from {t.steps_from}: {', '.join(parts)}")
        if t.has_gpu and t.gpu_total_us > 0:
            lines.append(f"  GPU time: {100 * t.gpu_in_calls_us / t.gpu_total_us:.1f}% in GEMM/"
                         f"attention calls, {100 * t.gpu_other_ops_us / t.gpu_total_us:.1f}% other "
                         f"ops, {100 * t.gpu_unattributed_us / t.gpu_total_us:.1f}% unattributed")
    return lines


def format_table(df: pd.DataFrame, top: int = 12) -> str:
    cols = ["op", "phase", "m", "n", "k", "batch", "dtype", "layout", "calls_per_step",
            "us_per_call", "share"]
    view = df.head(top)[cols].copy()
    view["op"] = view["op"].str.replace("aten::", "", regex=False)
    view["share"] = (100 * view["share"]).map(lambda v: "n/a" if pd.isna(v) else f"{v:.2f}%")
    view["us_per_call"] = view["us_per_call"].map(lambda v: "n/a" if pd.isna(v) else f"{v:.2f}")
    view["calls_per_step"] = view["calls_per_step"].map(lambda v: f"{v:g}")
    title = f"top {len(view)} of {len(df)} rows by share of the step:"
    return title + "\n" + view.to_string(index=False)


# ------------------------------------------------------------------------------------------ live
def load_callable(target: str):
    """Import MODULE:CALLABLE or path/to/file.py:CALLABLE; a class is instantiated once."""
    if ":" not in target:
        raise TunerError(f"--live wants MODULE:CALLABLE or path/to/file.py:CALLABLE, got {target!r}")
    mod_name, _, attr = target.rpartition(":")
    try:
        if mod_name.endswith(".py") or os.sep in mod_name:
            file = Path(mod_name)
            if not file.exists():
                raise TunerError(f"--live: file not found: {file}")
            spec = importlib.util.spec_from_file_location(f"_tuner_live_{file.stem}", file)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(mod_name)
    except TunerError:
        raise
    except ImportError as exc:
        raise TunerError(f"--live: cannot import {mod_name}: {exc}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise TunerError(f"--live: {mod_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if isinstance(obj, type):
        try:
            obj = obj()
        except Exception as exc:  # noqa: BLE001 - the user's code; --debug shows the traceback
            raise TunerError(f"--live: creating {target} failed: {type(exc).__name__}: "
                             f"{exc}") from exc
    if not callable(obj):
        raise TunerError(f"--live: {target} is not callable")
    return obj


def live(target: str, steps: int, output=None, *, save_trace=None, phase: str | None = None,
         quiet: bool = False) -> HarvestResult:
    """Run CALLABLE `steps` times under torch.profiler (record_shapes on, one profiler step per
    call), export the trace and harvest it."""
    import torch
    from torch.profiler import ProfilerAction, ProfilerActivity, profile

    if steps is None or steps < 1:
        raise TunerError("--live needs --steps N (N >= 1): how many calls to profile")
    fn = load_callable(target)
    activities = [ProfilerActivity.CPU]
    gpu = torch.cuda.is_available()
    if gpu:
        activities.append(ProfilerActivity.CUDA)
    tmpdir = tempfile.mkdtemp(prefix="tuner_live_")
    try:
        raw = Path(tmpdir) / "live.pt.trace.json"
        # A schedule makes the profiler record ProfilerStep#N markers; this one records always.
        with profile(activities=activities, record_shapes=True,
                     schedule=lambda step: ProfilerAction.RECORD) as prof:
            for i in range(steps):
                if i:
                    prof.step()     # closes ProfilerStep#(i-1), opens ProfilerStep#i
                try:
                    fn()
                except Exception as exc:  # noqa: BLE001 - the user's code; --debug re-raises
                    raise TunerError(f"--live: call {i + 1} of {target} failed: "
                                     f"{type(exc).__name__}: {exc}") from exc
                if gpu:
                    torch.cuda.synchronize()
        prof.export_chrome_trace(str(raw))
        trace = raw
        if save_trace:
            save = Path(save_trace)
            save.parent.mkdir(parents=True, exist_ok=True)
            if save.name.endswith(".gz"):
                with open(raw, "rb") as src, gzip.open(save, "wb", compresslevel=6) as dst:
                    shutil.copyfileobj(src, dst)
            else:
                shutil.copyfile(raw, save)
            trace = save
            info(f"saved the raw trace to {save}")
        return harvest([trace], output, phase=phase, quiet=quiet)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


# ----------------------------------------------------------------------------------------- watch
def watch(directory, output, *, rank: int | None = None, steps: int | None = None,
          phase: str | None = None, interval: float = 2.0, max_polls: int | None = None) -> int:
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
                r = trace_rank(f) if RANK_RE.search(f.name) else None
                if r is not None and r != chosen_rank:
                    bad.add(f)
                    info(f"skipping {f.name}: rank {r} (harvesting rank {chosen_rank}; --rank "
                         "chooses)")
                    continue
                try:
                    done[f] = read_trace(f, steps=steps)
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
