"""Budget screening: can a shape matter at all, before any search? (DESIGN.md "Budget before search")

For every ShapeTable row and a DeviceProfile this module computes

- the bytes a call must move (each input read once, the output written once) and its flops;
- the physical floor of one call: max(read latency + bytes / read bandwidth, flops / matmul
  rate), in µs (the read latency: the device profile's measured fixed cost of a reading
  kernel, tuner.ceilings; 0 in profiles without it);
- the baseline µs per call (the trace's `us_per_call`, or a re-measurement with `--measure`);
- the headroom: the most any kernel could save, per call (baseline − floor, clipped at 0), per
  step (× calls_per_step × hit_rate) and as a share of the step time;
- a keep / prune verdict: keep a shape when `safety` × its headroom per step still reaches the
  threshold (µs per step or a share of the step), with the reason in words; a compute-bound call
  (flops / matmul rate sets its floor: prefill-sized GEMMs) whose baseline is within the safety
  margin of that floor (headroom <= (1 - safety) x floor) is pruned as served at the compute floor.

"Per token" means per step of the row's phase: one decode step produces one token for every
sequence in the batch, so a saving of X µs per decode step lowers every sequence's time per
generated token (inter-token latency) by X µs. The share of the step is the same whether you read
it as latency or throughput. For prefill rows a "step" is one prefill forward pass (time to first
token). docs/budget.md explains the model and the default threshold.

Every number here is in µs, bytes, flops, bytes/s or flop/s; shares are fractions (0.005 = 0.5%).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from tuner_kernels.cost import attention_cost, dtype_bytes, dtype_name, gemm_cost

from .device import DeviceProfile
from .errors import NoGPUError, TunerError, warn
from .tables import check_output_file, read_parquet, write_parquet
from .units import DEFAULT_THRESHOLD, Threshold, is_number, pct as _pct

__all__ = ["BIAS_OPS", "COMPUTE_FLOOR_DTYPES", "LAUNCH_BOUND_GPU_BUSY", "PHASE_ORDER", "amdahl",
           "bytes_and_flops", "call_floor_us", "check_profile", "compute", "compute_floor_lines",
           "compute_floor_us",
           "default_output", "describe_shape",
           "empty_size",
           "floor_us", "format_table", "kernel_families", "kernel_shape", "measure_baselines",
           "phase_notes", "read", "run_command", "saving_per_call_needed", "saving_per_token",
           "surviving", "write"]

# The profile measures the dense bf16 matmul rate. It bounds fp16/bf16 matmuls and, because fp32
# and fp64 matmuls are never faster than bf16 on these GPUs, it is still a valid (low) floor for
# them. FP8/INT8 matmuls can run faster than bf16, so for them only the bandwidth floor is used:
# the floor must never exceed what the hardware can do, or pruning would drop shapes that matter.
COMPUTE_FLOOR_DTYPES = ("bfloat16", "float16", "half", "float32", "float", "float64", "double")

# Ops whose GEMM has a bias vector of n elements (out = bias + A @ B).
BIAS_OPS = ("aten::addmm", "aten::baddbmm")

# A step whose GPU is busy for less than this share of its wall time is launch-bound: the CPU
# launching kernels sets the pace, so a faster kernel only lengthens the GPU's idle gaps and the
# step gets no shorter until it is graph-captured (CUDA/HIP graphs).
LAUNCH_BOUND_GPU_BUSY = 0.60

PHASE_ORDER = {"decode": 0, "prefill": 1, "other": 2}


# --------------------------------------------------------------------------------- the model
def amdahl(f: float, s: float) -> float:
    """Whole-step speedup when a part taking share `f` of the step gets `s` times faster."""
    if not (math.isfinite(f) and 0 <= f <= 1):
        raise TunerError(f"Amdahl: the share of the step must be in [0, 1], got {f!r}")
    if not (math.isfinite(s) and s > 0):
        raise TunerError(f"Amdahl: the speedup must be a positive number, got {s!r}")
    return 1.0 / ((1.0 - f) + f / s)


def saving_per_token(saving_us_per_call: float, calls_per_step: float, hit_rate: float = 1.0) -> float:
    """µs saved per step (= per generated token of each sequence, for decode)."""
    return saving_us_per_call * calls_per_step * hit_rate


def saving_per_call_needed(share: float, step_us: float, calls_per_step: float,
                           hit_rate: float = 1.0) -> float:
    """The saving per call (µs) that moves a step of `step_us` by `share`."""
    return share * step_us / (calls_per_step * hit_rate)


def _int_or_none(row, column: str) -> int | None:
    if column not in row or pd.isna(row[column]):
        return None
    return int(row[column])


def bytes_and_flops(row) -> tuple[float, float, str]:
    """(bytes moved, flops, why-not) for one ShapeTable row, by the kernels' cost model
    (tuner_kernels.cost, the same one the families' bytes_moved / flops use); NaN and a reason when
    unknown."""
    family = str(row["family"])
    if family == "moe":
        return _family_bytes_and_flops(row, family)
    size = dtype_bytes(row["dtype"])
    if size is None:
        return math.nan, math.nan, f"unknown dtype {row['dtype']!r}"
    if family == "gemm":
        m, n, k, batch = (int(row[c]) for c in ("m", "n", "k", "batch"))
        nbytes, nflops = gemm_cost(m, n, k, batch=batch, elem_bytes=size,
                                   bias=str(row["op"]) in BIAS_OPS)
        return float(nbytes), float(nflops), ""
    if family == "attention":
        heads = _int_or_none(row, "heads")
        kv_heads = _int_or_none(row, "kv_heads") or heads
        q_len = _int_or_none(row, "q_len")
        kv_len = _int_or_none(row, "kv_len")
        head_dim = _int_or_none(row, "head_dim")
        if None in (heads, q_len, kv_len, head_dim):
            return math.nan, math.nan, "attention row lacks heads/q_len/kv_len/head_dim"
        nbytes, nflops = attention_cost(batch=int(row["batch"]), heads=heads, kv_heads=kv_heads,
                                        q_len=q_len, kv_len=kv_len, head_dim=head_dim,
                                        elem_bytes=size)
        return float(nbytes), float(nflops), ""
    return math.nan, math.nan, f"no byte/flop model for family {family!r}"


def _family_bytes_and_flops(row, name: str) -> tuple[float, float, str]:
    """bytes_and_flops of a row by its kernel family's own cost (moe: tuner_kernels.cost.moe_cost
    through the family's shape_from_row / bytes_moved / flops)."""
    from tuner_kernels import get_family

    family = get_family(name)
    shape = family.shape_from_row(row)
    if shape is None:
        return math.nan, math.nan, (f"the {name} family serves no such row ({row['dtype']} "
                                    "weights, or sizes it cannot read)")
    return float(family.bytes_moved(shape)), float(family.flops(shape)), ""


def compute_floor_us(nflops: float, dtype: str, profile: DeviceProfile) -> float:
    """flops / measured matmul rate in µs (0 for dtypes the bf16 rate does not bound)."""
    if dtype_name(dtype) not in COMPUTE_FLOOR_DTYPES or not math.isfinite(nflops):
        return 0.0
    return nflops / profile.bf16_matmul_flops_per_s * 1e6


def floor_us(nbytes: float, nflops: float, dtype: str, profile: DeviceProfile) -> float:
    """Physical floor of one call in µs: max(read latency + bytes / bandwidth, flops / matmul
    rate). The read latency is the profile's measured fixed cost of a kernel that reads device
    memory (tuner.ceilings; 0 where not measured)."""
    latency = float(getattr(profile, "read_latency_us", 0.0) or 0.0)
    memory_us = latency + nbytes / profile.read_bandwidth_bytes_per_s * 1e6
    return max(memory_us, compute_floor_us(nflops, dtype, profile))


def call_floor_us(row, profile: DeviceProfile, min_kernel_us: float = 0.0
                  ) -> tuple[float, float, float, str]:
    """(bytes, flops, floor µs, why-not) of one ShapeTable row: `floor_us` of its bytes and
    flops, at least `min_kernel_us` (the kernel floor); the floor is `min_kernel_us` (or NaN)
    when the row has no byte/flop model, with the reason."""
    nbytes, nflops, no_model = bytes_and_flops(row)
    floor = floor_us(nbytes, nflops, row["dtype"], profile) if not no_model else math.nan
    if min_kernel_us > 0:
        floor = max(floor, min_kernel_us) if math.isfinite(floor) else min_kernel_us
    return nbytes, nflops, floor, no_model


# The sizes of a row that, when zero, leave no work. An attention row's unknown sizes are NaN,
# and its m, n and batch hold q_len, kv_len and the batch or 0 where those are unknown (a paged
# call outside a decode step): its own columns say, not those.
_SIZES = {"gemm": ("m", "n", "k", "batch"),
          "attention": ("heads", "kv_heads", "q_len", "kv_len", "head_dim"),
          "moe": ("m", "n", "k", "experts", "topk")}


def empty_size(row) -> str:
    """The name of a size of a ShapeTable row that is zero ("m", "heads", ...), or ""."""
    for column in _SIZES.get(str(row["family"]), ()):
        value = row[column] if column in row else None
        if value is not None and not pd.isna(value) and value == 0:
            return column
    return ""


def check_profile(profile: DeviceProfile) -> None:
    for field, value in (("read bandwidth", profile.read_bandwidth_bytes_per_s),
                         ("bf16 matmul rate", profile.bf16_matmul_flops_per_s)):
        if not (is_number(value) and value > 0):
            raise TunerError(f"device profile {profile.name!r} has no usable {field} ({value!r})")


def _check_table(table: pd.DataFrame) -> None:
    if len(table) == 0:
        raise TunerError("the shape table is empty: nothing to budget "
                         "(did harvest find any matmul or attention calls?)")
    for column in ("us_per_call", "calls_per_step", "step_us", "step_gpu_us"):
        values = pd.to_numeric(table[column], errors="coerce")
        bad = values[values < 0]
        if len(bad):
            raise TunerError(f"the shape table has a negative {column} ({bad.iloc[0]:g} in row "
                             f"{bad.index[0]}): not a valid ShapeTable")


def compute(table: pd.DataFrame, profile: DeviceProfile, *, threshold: Threshold = DEFAULT_THRESHOLD,
            hit_rate: float = 1.0, graph_captured: bool = False, min_kernel_us: float | None = None,
            baseline_us: pd.Series | None = None) -> pd.DataFrame:
    """The budget of every row of a ShapeTable on `profile`.

    Returns the ShapeTable columns plus: bytes, flops, floor_us, baseline_us, baseline_source,
    headroom_us_per_call, hit_rate, headroom_us_per_token, step_basis_us, headroom_share,
    gpu_busy_share, launch_bound, verdict ("keep" / "prune"), reason, and the profile and
    threshold used. Sorted by phase (decode first), then by headroom per token, largest first.

    `graph_captured=True` compares with the GPU-busy time of the step (`step_gpu_us`, about what
    the step takes once CUDA-graph captured) instead of its wall time (`step_us`).
    `min_kernel_us` is a fixed per-call floor: the shortest time one kernel takes inside a graph
    (None: the profile's measured `kernel_floor_us`; 0: the pure bytes/flops floor).
    `baseline_us` (aligned with `table`'s index; NaN = keep the trace's value) replaces the
    trace's `us_per_call`, e.g. with `measure_baselines`.
    """
    _check_table(table)
    check_profile(profile)
    if not (is_number(hit_rate) and 0 < hit_rate <= 1):
        raise TunerError(f"the hit rate must be in (0, 1], got {hit_rate!r}")
    if min_kernel_us is None:  # the device's measured cost of one kernel inside a graph
        min_kernel_us = float(getattr(profile, "kernel_floor_us", 0.0) or 0.0)
    if not (is_number(min_kernel_us) and min_kernel_us >= 0):
        raise TunerError(f"the minimum kernel time must be >= 0 us, got {min_kernel_us!r}")

    rows = []
    for index, row in table.iterrows():
        nbytes, nflops, floor, no_model = call_floor_us(row, profile, min_kernel_us)

        baseline, baseline_source = float(row["us_per_call"]), "trace"
        if baseline_us is not None and index in baseline_us.index and pd.notna(baseline_us[index]):
            baseline, baseline_source = float(baseline_us[index]), "measured"

        # Unknown floor: the headroom cannot exceed the baseline, so use that upper bound.
        headroom_call = baseline - (floor if math.isfinite(floor) else 0.0)
        headroom_call = max(headroom_call, 0.0) if math.isfinite(headroom_call) else math.nan
        calls = float(row["calls_per_step"])
        headroom_token = saving_per_token(headroom_call, calls, hit_rate)

        step_wall, step_gpu = float(row["step_us"]), float(row["step_gpu_us"])
        step_basis = step_gpu if graph_captured else step_wall
        if not (math.isfinite(step_basis) and step_basis > 0):
            step_basis = math.nan
        share = headroom_token / step_basis
        gpu_busy = step_gpu / step_wall if step_wall > 0 else math.nan
        launch_bound = bool(gpu_busy < LAUNCH_BOUND_GPU_BUSY) if math.isfinite(gpu_busy) else False

        compute_bound = bool(not no_model
                             and compute_floor_us(nflops, row["dtype"], profile) >= floor)
        verdict, reason = _verdict(threshold, baseline=baseline, floor=floor, no_model=no_model,
                                   calls=calls, headroom_token=headroom_token, share=share,
                                   graph_captured=graph_captured, compute_bound=compute_bound)
        zero = empty_size(row)
        if zero:  # no call shape at all: never kept, whatever time the trace gave it
            verdict, reason = "prune", (f"{zero} = 0: a call on an empty tensor does no work "
                                        "(nothing to tune; a damaged trace?)")
        if verdict == "prune" and launch_bound and not graph_captured and step_gpu > 0 \
                and not zero:
            reason += f"; launch-bound: {_pct(headroom_token / step_gpu)} of GPU-busy time"
        rows.append({
            "bytes": nbytes, "flops": nflops, "floor_us": floor,
            "baseline_us": baseline, "baseline_source": baseline_source,
            "headroom_us_per_call": headroom_call, "hit_rate": float(hit_rate),
            "headroom_us_per_token": headroom_token, "step_basis_us": step_basis,
            "headroom_share": share, "gpu_busy_share": gpu_busy, "launch_bound": launch_bound,
            "compute_bound": compute_bound, "verdict": verdict,
            "reason": reason,
        })

    out = pd.concat([table.reset_index(drop=True), pd.DataFrame(rows)], axis=1)
    out["profile"] = profile.name
    out["profile_source"] = profile.source
    out["threshold"] = threshold.describe()
    out["step_basis"] = "gpu_busy" if graph_captured else "wall"
    out["_phase_order"] = out["phase"].map(PHASE_ORDER).fillna(len(PHASE_ORDER))
    out = out.sort_values(["_phase_order", "headroom_us_per_token"], ascending=[True, False],
                          na_position="last", kind="stable")
    return out.drop(columns="_phase_order").reset_index(drop=True)


def _verdict(threshold: Threshold, *, baseline: float, floor: float, no_model: str, calls: float,
             headroom_token: float, share: float, graph_captured: bool,
             compute_bound: bool = False) -> tuple[str, str]:
    """keep / prune and why. Prune only on evidence: a row that cannot be judged is kept.

    `compute_bound`: the floor is flops / measured matmul rate (a prefill-sized GEMM). That
    rate is the library's own (torch.matmul on large square operands), so a baseline within the
    safety margin of it, headroom <= (1 - safety) x floor, is the library already serving the
    call at the compute floor: pruned whatever its calls per step add up to."""
    if not math.isfinite(baseline):
        return "keep", ("not budgeted: no GPU time for this call in the trace (CPU-only trace?); "
                        "rerun `tuner budget --measure` on the GPU")
    if not (math.isfinite(calls) and calls > 0):
        return "keep", "not budgeted: calls per step unknown (no step markers in the trace?)"
    if math.isfinite(floor) and baseline <= floor:
        return "prune", (f"baseline {baseline:.3g} us is already at the floor {floor:.3g} us "
                         f"(nothing to gain)")
    if compute_bound and math.isfinite(floor) and baseline - floor <= (1 - threshold.safety) * floor:
        return "prune", (f"compute-bound: baseline {baseline:.3g} us runs at "
                         f"{_pct(floor / baseline)} of the measured matmul rate, within the safety "
                         f"{threshold.safety:g} of its floor {floor:.3g} us (at most "
                         f"{1 - threshold.safety:.0%} above it): the library already serves it "
                         f"at the compute floor")
    step_word = "GPU-busy step" if graph_captured else "step"
    floor_note = f" (floor unknown: {no_model})" if no_model else ""
    realistic = threshold.safety * headroom_token
    if threshold.share is not None:
        if not math.isfinite(share):
            return "keep", f"not budgeted: no {step_word} time to take a share of"
        got, need = threshold.safety * share, threshold.share
        text = (f"{threshold.safety:g} x {headroom_token:.3g} us/token = {_pct(got)} of the "
                f"{step_word}")
        target = f"{_pct(need)}"
    else:
        got, need = realistic, threshold.us_per_token
        text = f"{threshold.safety:g} x {headroom_token:.3g} us/token = {realistic:.3g} us/token"
        target = f"{need:g} us/token"
    if got >= need:
        return "keep", f"{text} >= {target}{floor_note}"
    return "prune", f"{text} < {target}{floor_note}"


def compute_floor_lines(budget: pd.DataFrame) -> list[str]:
    """One line per shape pruned because the library already serves it at the compute floor
    (`_verdict`), with its reason: what `tuner budget` and `tuner run` say before any search."""
    if "compute_bound" not in budget.columns:
        return []
    pruned = budget[(budget["verdict"] == "prune") & budget["compute_bound"].fillna(False)
                    & budget["reason"].str.startswith("compute-bound")]
    return [f"pruned at the compute floor: {row['phase']} {describe_shape(row)} "
            f"({_num(float(row['calls_per_step']))} calls/step): {row['reason']}"
            for _, row in pruned.iterrows()]


def surviving(budget: pd.DataFrame) -> pd.DataFrame:
    """The rows the search should spend GPU time on (verdict == "keep"), best first."""
    if "verdict" not in budget.columns:
        raise TunerError("not a budget table (no verdict column): run `tuner budget` first")
    return budget[budget["verdict"] == "keep"].reset_index(drop=True)


def write(budget: pd.DataFrame, path: str | Path) -> Path:
    return write_parquet(budget, path)


def read(path: str | Path) -> pd.DataFrame:
    budget = read_parquet(path, "budget table")
    if "verdict" not in budget.columns:
        raise TunerError(f"{path} is not a budget table (no verdict column)")
    return budget


# ------------------------------------------------------------------------------ measuring baselines
def kernel_families() -> list:
    """The kernel families that can be imported here (a warning for each one that cannot)."""
    import tuner_kernels as kernels

    families = []
    for name in kernels.family_names():
        try:
            families.append(kernels.get_family(name))
        except ImportError as exc:
            warn(f"kernel family {name} cannot be imported ({exc}); its rows keep the trace's time")
    return families


def kernel_shape(row, families: list | None = None) -> tuple | None:
    """(KernelFamily, shape dict) of the kernel family that serves a ShapeTable row, or None; the
    shape carries the row's measurement keys (baseline_compiled for a compiled step's row), so
    `measure_baselines` times the baseline the search and rank time."""
    from .spaces import with_row_measure_keys

    for family in kernel_families() if families is None else families:
        shape = with_row_measure_keys(family.shape_from_row(row), row)
        if shape is not None:
            return family, shape
    return None


def measure_baselines(table: pd.DataFrame) -> pd.Series:
    """Re-measure the baseline µs per call of every row on this machine's GPU (cold L2).

    Uses `tuner.bench.time_baseline` (CUDA-graph replays, the path serving uses today). Rows that
    no kernel family serves, or whose measurement fails, keep NaN (the trace's time is used).
    """
    try:
        import torch
    except ImportError:
        raise NoGPUError("--measure needs torch and a CUDA or ROCm GPU; torch is not installed") from None
    if not torch.cuda.is_available():
        raise NoGPUError("--measure needs a CUDA or ROCm GPU and none is visible on this machine")
    from . import bench

    families = kernel_families()
    measured = pd.Series(math.nan, index=table.index, dtype="float64")
    for index, row in table.iterrows():
        found = kernel_shape(row, families)
        if found is None:
            warn(f"row {index} ({row['op']}, {describe_shape(row)}): no kernel family serves it; "
                 f"keeping the trace's time")
            continue
        family, shape = found
        try:
            # bench takes the KernelFamily object (it calls family.make_inputs / family.baseline)
            measured[index] = bench.time_baseline(family, shape, cache="cold").median_us
        except Exception as exc:  # one failing shape must not stop the budget
            warn(f"row {index} ({family.name} {shape}): baseline measurement failed ({exc}); "
                 f"keeping the trace's time")
    return measured


# --------------------------------------------------------------------------------------- printing
def _num(value: float, digits: int = 3) -> str:
    return "n/a" if not math.isfinite(value) else f"{value:.{digits}g}"


def describe_shape(row) -> str:
    heads = _int_or_none(row, "heads")
    if str(row["family"]) == "attention" and heads is not None:
        return (f"b={row['batch']} h={heads}/{_int_or_none(row, 'kv_heads') or heads} "
                f"q={_int_or_none(row, 'q_len')} kv={_int_or_none(row, 'kv_len')} "
                f"d={_int_or_none(row, 'head_dim')}")
    if str(row["family"]) == "moe":
        return (f"m={row['m']} E={_int_or_none(row, 'experts')} top{_int_or_none(row, 'topk')} "
                f"hidden={row['k']} inter={row['n']}")
    text = f"m={row['m']} n={row['n']} k={row['k']}"
    return text + (f" b={row['batch']}" if int(row["batch"]) > 1 else "")


def phase_notes(budget: pd.DataFrame) -> list[str]:
    """One line per phase: step time, GPU busy share, and the launch-bound warning."""
    notes = []
    for phase, rows in budget.groupby("phase", sort=False):
        step, gpu = rows["step_us"].median(), rows["step_gpu_us"].median()
        busy = gpu / step if step > 0 else math.nan
        line = (f"{phase}: step {_num(step / 1000)} ms wall, GPU busy {_num(gpu / 1000)} ms "
                f"({_pct(busy)})")
        if math.isfinite(busy) and busy < LAUNCH_BOUND_GPU_BUSY:
            line += (" -- launch-bound: kernel savings will not reach the user until the step is "
                     "graph-captured (CUDA/HIP graphs)")
            if (rows["step_basis"] == "wall").all():
                line += "; --graph-captured budgets against the GPU-busy time instead"
        notes.append(line)
    return notes


def format_table(budget: pd.DataFrame) -> str:
    """The budget as aligned text, one line per shape."""
    header = ("phase", "op", "shape", "dtype", "calls/step", "floor us", "base us", "save us/call",
              "save us/token", "share", "verdict", "reason")
    lines = [header]
    for _, row in budget.iterrows():
        lines.append((
            str(row["phase"]), str(row["op"]).removeprefix("aten::"), describe_shape(row),
            str(row["dtype"]),
            _num(float(row["calls_per_step"])), _num(row["floor_us"]), _num(row["baseline_us"]),
            _num(row["headroom_us_per_call"]), _num(row["headroom_us_per_token"]),
            _pct(row["headroom_share"]), str(row["verdict"]), str(row["reason"]),
        ))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)) + "  " + line[-1]
                     for line in lines)


# ------------------------------------------------------------------------------ tuner budget
def default_output(shapes: str | Path) -> Path:
    """artifacts/budget/<shape table name>.parquet"""
    return Path("artifacts") / "budget" / (Path(shapes).name.removesuffix(".parquet") + ".parquet")


def run_command(shapes: str | Path, *, device=None, bandwidth=None, matmul_rate=None,
                threshold: Threshold = DEFAULT_THRESHOLD, hit_rate: float = 1.0,
                phase: str = "all", graph_captured: bool = False, min_kernel_us: float | None = None,
                measure: bool = False, output: str | Path | None = None, out=print) -> Path:
    """`tuner budget`: read the shape table, choose the device profile, budget every row, print
    the table through `out` and write the budget parquet (the output path is checked first)."""
    from . import shapetable
    from .device import choose_profile

    output = Path(output) if output else default_output(shapes)
    check_output_file(output, "-o")  # before any work
    table = shapetable.read(shapes)
    if phase != "all":
        present = sorted(table["phase"].dropna().unique())
        table = table[table["phase"] == phase]
        if len(table) == 0:
            raise TunerError(f"{shapes} has no {phase} rows; phases present: "
                             f"{', '.join(present) or 'none'}")
    profile, where = choose_profile(device, list(table["device"].dropna().unique()),
                                    bandwidth=bandwidth, matmul_rate=matmul_rate)
    measured = measure_baselines(table) if measure else None
    result = compute(table, profile, threshold=threshold, hit_rate=hit_rate,
                     graph_captured=graph_captured, min_kernel_us=min_kernel_us,
                     baseline_us=measured)

    out(f"budget of {shapes}")
    out(f"device: {where}: read {profile.read_bandwidth_bytes_per_s / 1e12:.3g} TB/s, bf16 matmul "
        f"{profile.bf16_matmul_flops_per_s / 1e12:.3g} TFLOP/s")
    out(f"threshold: {threshold.describe()}; hit rate {hit_rate:g}; per token = per step of "
        f"the phase")
    if measured is not None:
        count = int(measured.notna().sum())
        out(f"baselines: {count} re-measured on this GPU (cold L2), {len(result) - count} "
            f"from the trace")
    for note in phase_notes(result):
        out(note)
    out("")
    out(format_table(result))
    unbudgeted = result["baseline_us"].isna().sum()
    if unbudgeted:
        warn(f"{unbudgeted} of {len(result)} shapes have no GPU time in the trace (CPU-only "
             "trace?): they cannot be budgeted and are kept; rerun with --measure on the GPU")
    write(result, output)
    kept = int((result["verdict"] == "keep").sum())
    floor_lines = compute_floor_lines(result)
    if floor_lines:
        out("")
    for line in floor_lines:
        out(line)
    out(f"\nkept {kept} of {len(result)} shapes; budget written to {output}")
    return output
