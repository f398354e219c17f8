"""The records harvest builds from a trace: ops as recorded, calls with their shapes, steps, and
what one trace contributes to the table."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Op", "Call", "Step", "RawTrace", "TraceData", "union_length"]


@dataclass
class Op:
    """A GEMM-family, attention or MoE CPU op (or an op inside a MoE call), as recorded."""
    name: str
    tid: object
    ts: float
    end: float
    ext: int | None
    dims: list
    types: list
    strides: list
    kind: str              # "gemm", "attention", "moe", "moe_part" / "moe_topk" (inside a moe
                           # call), or "grouped_mm" (config.GROUPED_MM_OP)
    parent: int = -1       # index of the enclosing GEMM/attention op on the same thread
    has_gemm_child: bool = False
    grouped_call: int = -1  # grouped_mm read with its partner as one moe call (harvest --topk):
                            # the index of the op that call is keyed by (the up projection's)


@dataclass
class Call:
    """One GEMM, attention or MoE call with its shape and the GPU time of the kernels it launched
    (a MoE call: m tokens, n = intermediate size, k = hidden, experts, topk; tuner/harvest/moe.py)."""
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
    traced_kv_heads: int | None = None   # harvest --kv-heads: the repeated cache's KV heads
    traced_compiled: int | None = None   # 1: ran inside a torch.compile'd (Inductor) graph
    bias: int | None = None       # 1: a linear op given a bias (config.LINEAR_BIAS_INPUT)
    tokens: int | None = None     # varlen attention: query tokens of all requests (q's dim 0)
    experts: int | None = None    # moe: experts of the layer (w1's E)
    topk: int | None = None       # moe: experts each token is routed to
    linears: int = 1              # linear calls its kernel computes (shapes.reduction_linears)
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
    tokens: int | None = None    # tokens the step runs, when its marker says (vLLM, SGLang)
    kv_mean: int | None = None   # mean KV length of its decode requests, when the marker says

    @property
    def wall_us(self) -> float:
        return (max(self.end, self.gpu_end) - self.start) / self.weight

    @property
    def gpu_busy_us(self) -> float:
        return union_length(self.intervals) / self.weight


@dataclass
class RawTrace:
    """What the streaming read keeps of a trace's events (see reading.read_events)."""
    ops: list               # Op
    runtimes: dict          # correlation -> (tid, ts, ext, runtime call name)
    activities: list        # (ts, dur, corr, ext, name)
    annotations: list       # (name, tid, ts, end)
    cpu_ext: set            # External ids of all CPU ops
    n_cpu_ops: int
    n_cpu_ops_with_dims: int
    n_gemm_like_no_dims: int
    first_ts: float
    last_ts: float
    backend: str            # cuda, hip, or cpu
    device_ids: set
    launch_kernels: dict = field(default_factory=dict)   # correlation -> kernel name (ROCm)
    device_labels: list = field(default_factory=list)    # GPU process names from metadata
    capture_labels: list = field(default_factory=list)   # (name, tid, ts, end): *capture* labels
    dialects: list = field(default_factory=list)         # names of the dialects seen
    malformed: dict = field(default_factory=dict)        # what was wrong -> events skipped
    compiled_regions: list = field(default_factory=list)  # (tid, ts, end): Inductor graph calls


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
    graph: object = None         # graphs.GraphJoin when the trace was joined with captures
    gpu_joined_us: float = 0.0   # GPU time of the replayed kernels joined to captured launches
    device_known: bool = True    # False: the trace names no GPU (device is "unknown")
    compiled_kernels: int = 0    # Inductor-generated kernels in it: a torch.compile'd step


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
