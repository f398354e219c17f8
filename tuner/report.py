"""`tuner run TRACE`: the main job in one command, and its summary.

harvest -> budget -> search (under a time budget) -> rank -> export, then a short summary of what
it found and where it wrote it. On a machine without a GPU it runs harvest and budget, prints the
search plan (which shapes, how much of the time budget each would get) and says plainly that the
search needs a GPU; that is a complete run for such a machine (exit code 0).

Outputs (``-o DIR``, default artifacts/run/<trace name>/): shapes.parquet, budget.parquet,
plan.md, verdicts.parquet + verdicts.md; the exported configs go to artifacts/export/<device>/
where the runtime loader looks for them (``--export-dir`` to change).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from .device import choose_profile
from .units import DEFAULT_THRESHOLD, parse_duration, parse_threshold
from .errors import TunerError, warn

RUNS_DIR = Path("artifacts") / "run"


@dataclass
class RunResult:
    out_dir: Path
    shapes_path: Path | None = None
    budget_path: Path | None = None
    plan_path: Path | None = None
    plan: pd.DataFrame | None = None
    profile_label: str = ""
    searched: bool = False
    verdicts_path: Path | None = None
    verdicts: pd.DataFrame | None = None
    exported: list[Path] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)  # the printed summary


# ------------------------------------------------------------------------------------- helpers
def trace_name(trace: str | Path) -> str:
    name = Path(trace).name
    for suffix in (".gz", ".json", ".trace", ".pt"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name) or "trace"


def have_gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def harvest_trace(trace: str | Path, top: int = 8) -> pd.DataFrame:
    """Harvest the trace (tuner.harvest) and print its summary and top rows."""
    from . import harvest

    result = harvest.harvest([str(trace)], quiet=True)
    harvest.report(result, top=top)
    return result.table


def family_rows(budget: pd.DataFrame, family: str) -> pd.DataFrame:
    """Budget rows the kernel family serves, with their shape dict and key (columns shape, key)."""
    from kernels import get_family

    fam = get_family(family)
    shapes, keys, keep = [], [], []
    for i, row in budget.iterrows():
        shape = fam.shape_from_row(row)
        if shape is not None:
            keep.append(i)
            shapes.append(shape)
            keys.append(fam.shape_key(shape))
    out = budget.loc[keep].copy()
    out["kernel_shape"] = shapes
    out["shape_key"] = keys
    return out.reset_index(drop=True)


def plan_search(budget: pd.DataFrame, family: str, timeout_s: float) -> pd.DataFrame:
    """Which shapes the search would spend time on and how much: the kept rows of the family,
    the time budget shared in proportion to what each could save per token (as tuner search
    does). Rows of one kernel shape (e.g. the same linear in two phases) are searched once."""
    rows = family_rows(budget, family)
    kept = rows[rows["verdict"] == "keep"]
    if kept.empty:
        return kept.assign(seconds=pd.Series(dtype=float))
    kept = kept.assign(_w=kept["headroom_us_per_token"].fillna(0.0).clip(lower=0.0),
                       _bc=kept["baseline_us"] * kept["calls_per_step"],
                       _fc=kept["floor_us"] * kept["calls_per_step"])
    # rows of one kernel shape in one phase (e.g. addmm and mm of the same linear) run in the
    # same step: their calls and headroom add up; baseline and floor are call-weighted means
    per_phase = (kept.groupby(["shape_key", "phase"], sort=False)
                 .agg(shape=("kernel_shape", "first"), calls_per_step=("calls_per_step", "sum"),
                      _bc=("_bc", "sum"), _fc=("_fc", "sum"),
                      headroom_us_per_token=("_w", "sum"), headroom_share=("headroom_share", "sum"),
                      step_us=("step_us", "first"), step_basis_us=("step_basis_us", "first"),
                      hit_rate=("hit_rate", "first"))
                 .reset_index())
    per_phase["baseline_us"] = per_phase["_bc"] / per_phase["calls_per_step"]
    per_phase["floor_us"] = per_phase["_fc"] / per_phase["calls_per_step"]
    # one shape in several phases: one study, described by its largest phase, weighted by all
    per_phase = per_phase.sort_values("headroom_us_per_token", ascending=False, kind="stable")
    weights = per_phase.groupby("shape_key", sort=False)["headroom_us_per_token"].sum()
    grouped = per_phase.drop_duplicates("shape_key", keep="first").drop(columns=["_bc", "_fc"])
    grouped["headroom_us_per_token"] = grouped["shape_key"].map(weights)
    grouped = grouped.reset_index(drop=True)
    total = grouped["headroom_us_per_token"].sum()
    if total > 0:
        grouped["seconds"] = timeout_s * grouped["headroom_us_per_token"] / total
    else:
        grouped["seconds"] = timeout_s / len(grouped)
    return grouped.sort_values("headroom_us_per_token", ascending=False).reset_index(drop=True)


def _fmt_seconds(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    if s >= 60:
        return f"{s / 60:.1f} min"
    return f"{s:.0f} s"


def _num(x, fmt=".2f") -> str:
    try:
        return "n/a" if x is None or math.isnan(float(x)) else format(float(x), fmt)
    except (TypeError, ValueError):
        return str(x)


def plan_lines(plan: pd.DataFrame, family: str, timeout_s: float) -> list[str]:
    if plan.empty:
        return [f"search plan: no {family} shape survives the budget; nothing to search"]
    out = [f"search plan: {len(plan)} {family} shape(s), {_fmt_seconds(timeout_s)} in total, "
           f"shared by what each could save per token:",
           f"  {'shape':<40} {'calls/step':>10} {'baseline us':>11} {'floor us':>9} "
           f"{'headroom us/token':>17} {'share':>7} {'time':>8}"]
    for r in plan.itertuples(index=False):
        out.append(f"  {r.shape_key:<40} {r.calls_per_step:>10.1f} {_num(r.baseline_us):>11} "
                   f"{_num(r.floor_us):>9} {_num(r.headroom_us_per_token):>17} "
                   f"{_num(r.headroom_share * 100 if r.headroom_share == r.headroom_share else None, '.2f') + '%':>7} "
                   f"{_fmt_seconds(r.seconds):>8}")
    return out


def plan_markdown(plan: pd.DataFrame, family: str, timeout_s: float, profile_label: str) -> str:
    lines = [f"# Search plan ({family}, {_fmt_seconds(timeout_s)})", "",
             f"Device profile: {profile_label}", "",
             "| shape | calls/step | baseline µs | floor µs | headroom µs/token | share | time |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in plan.itertuples(index=False):
        lines.append(f"| {r.shape_key} | {r.calls_per_step:.1f} | {_num(r.baseline_us)} | "
                     f"{_num(r.floor_us)} | {_num(r.headroom_us_per_token)} | "
                     f"{_num(r.headroom_share * 100)}% | {_fmt_seconds(r.seconds)} |")
    return "\n".join(lines) + "\n"


def _budget_counts(budget: pd.DataFrame, family: str, plan: pd.DataFrame) -> str:
    keep = int((budget["verdict"] == "keep").sum())
    return (f"budget: {len(budget)} shape row(s), {keep} kept, {len(budget) - keep} pruned; "
            f"{len(plan)} distinct {family} shape(s) to search")


# ------------------------------------------------------------------------------------ the job
def search_plans(plan: pd.DataFrame, *, family: str, profile, device_key: str, parity: str,
                 source: str) -> list:
    """tuner.search StudyPlans for the planned shapes (this run's budget decides, including
    --graph-captured; the studies are named for this machine's device)."""
    import inspect

    from kernels import get_family

    from . import search, spaces

    fam = get_family(family)
    backend = search.backend_of(profile)
    space = spaces.space_for(family, backend)
    takes_sm = "sm_count" in inspect.signature(fam.default_config).parameters
    plans = []
    for r in plan.itertuples(index=False):
        shape = dict(r.shape)
        default = (fam.default_config(shape, backend, sm_count=profile.multiprocessors or None)
                   if takes_sm else fam.default_config(shape, backend))
        study_plan = search.make_plan(
            family=family, shape=shape, shape_key=r.shape_key, device_key=device_key,
            backend=backend, space=space, default_config=default,
            weight=float(r.headroom_us_per_token), parity_mode=parity,
            attrs={"calls_per_step": float(r.calls_per_step), "step_us": float(r.step_basis_us),
                   "hit_rate": float(r.hit_rate), "phase": str(r.phase), "source": source})
        if study_plan.n_valid == 0:
            warn(f"{r.shape_key}: no config of the search space satisfies its constraints; skipped")
            continue
        plans.append(study_plan)
    return plans


def run_search(plans: list, *, storage: str | None, timeout_s: float, out=print,
               objective=None, trials: int | None = None) -> str:
    """tuner.search over the plans under the time budget (every visible GPU); the storage URL."""
    from . import search

    url = storage if storage and "://" in storage else (
        f"sqlite:///{storage}" if storage else search.DEFAULT_STORAGE)
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    settings = search.SearchSettings(storage=url, timeout_s=timeout_s, trials=trials,
                                     objective=objective)
    summary = search.run_search(plans, settings)
    out(search.format_summary(summary))
    return url


def run(trace: str | Path, *, family: str = "gemv", timeout: str | float = "30m",
        storage: str | None = None, device: str | None = None, min_saving: str | None = None,
        out_dir: str | Path | None = None, export_root: str | Path | None = None,
        top: int = 3, parity: str = "exact", min_speedup: float = 1.01,
        graph_captured: bool = False, gpu: bool | None = None, out=print,
        trials: int | None = None, objective=None, measure=None) -> RunResult:
    """The main job. `gpu=None` detects; False forces the CPU path (harvest, budget, plan).

    `objective` (a tuner.search objective factory) and `measure` (a tuner.rank measure function)
    replace the GPU timing, for tests of the whole pipeline on a CPU."""
    from . import budget as budget_mod
    from . import shapetable
    from .runtime import EXPORT_ROOT

    timeout_s = parse_duration(timeout)
    trace = Path(trace)
    if not trace.exists():
        raise TunerError(f"trace not found: {trace}")
    out_dir = Path(out_dir) if out_dir else RUNS_DIR / trace_name(trace)
    result = RunResult(out_dir=out_dir)
    gpu = have_gpu() if gpu is None else gpu

    # 1. harvest
    table = harvest_trace(trace)
    result.shapes_path = shapetable.write(table, out_dir / "shapes.parquet")
    out(f"harvest: {len(table)} call shape(s) from {trace} -> {result.shapes_path}")

    # 2. budget
    profile, result.profile_label = choose_profile(device, list(table["device"].dropna().unique()),
                                                   gpu=gpu)
    out(f"device profile: {result.profile_label}")
    threshold = parse_threshold(min_saving) if min_saving else DEFAULT_THRESHOLD
    budget = budget_mod.compute(table, profile, threshold=threshold,
                                graph_captured=graph_captured)
    result.budget_path = budget_mod.write(budget, out_dir / "budget.parquet")
    plan = plan_search(budget, family, timeout_s)
    result.plan = plan
    basis = "GPU-busy step (--graph-captured)" if graph_captured else "wall-time step"
    out(_budget_counts(budget, family, plan) + f" ({threshold.describe()}, against the {basis}) "
        f"-> {result.budget_path}")
    for line in plan_lines(plan, family, timeout_s):
        out(line)
    if plan.empty and not graph_captured and bool(budget["launch_bound"].any()):
        captured = budget_mod.compute(table, profile, threshold=threshold, graph_captured=True)
        n = len(plan_search(captured, family, timeout_s))
        busy = budget.loc[budget["launch_bound"], "gpu_busy_share"].min()
        out(f"note: the traced steps are launch-bound (GPU busy {busy * 100:.0f}% of the step), "
            f"so kernel savings are diluted by launch overhead here. Served under CUDA/HIP graphs "
            f"(as vLLM and SGLang run decode), {n} {family} shape(s) would be worth a search: "
            f"add --graph-captured to budget against the GPU-busy step.")
    result.plan_path = out_dir / "plan.md"
    result.plan_path.write_text(plan_markdown(plan, family, timeout_s, result.profile_label))

    if not gpu:
        out("search needs a GPU: none is visible here, so this run stopped after harvest, budget "
            f"and the plan above (written to {result.plan_path}). Run the same command on a CUDA "
            "or ROCm machine to search, rank and export.")
        return result
    if plan.empty:
        out(f"nothing to search: no {family} shape survives the budget")
        return result

    # 3. search, 4. rank, 5. export
    from . import export as export_mod
    from . import rank as rank_mod
    from .runtime import current_identity

    ident = current_identity() or {}
    if not ident.get("key"):
        raise TunerError("cannot identify this machine's GPU for naming the studies")
    plans = search_plans(plan, family=family, profile=profile, device_key=ident["key"],
                         parity=parity, source=str(result.shapes_path))
    if not plans:
        out("nothing to search: no planned shape has a valid config in the search space")
        return result
    out(f"search: {len(plans)} shape(s) on this machine's GPUs for {_fmt_seconds(timeout_s)}")
    url = run_search(plans, storage=storage, timeout_s=timeout_s, out=out, objective=objective,
                     trials=trials)
    result.searched = True
    verdicts = rank_mod.rank(url, family=family, device=ident.get("key"), top=top,
                             parity_mode=parity, min_speedup=min_speedup,
                             threshold=min_saving, measure=measure,
                             names=[p.study_name for p in plans])
    result.verdicts = verdicts
    result.verdicts_path, md = rank_mod.write(verdicts, out_dir, "verdicts")
    for line in rank_mod.summary_lines(verdicts):
        out(line)
    out(f"verdicts: {result.verdicts_path} and {md}")
    if (verdicts["decision"] == rank_mod.ACCEPT).any():
        result.exported = export_mod.export(verdicts, out_root=export_root or EXPORT_ROOT,
                                            family=family)
        out("exported (the runtime loader reads these):")
        for line in export_mod.summary_lines(result.exported):
            out(line)
    else:
        out("nothing exported: no candidate passed every gate (reasons in the verdict table)")
    return result
