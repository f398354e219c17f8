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
from .search import have_gpu
from .units import DEFAULT_THRESHOLD, parse_duration, parse_threshold
from .errors import TunerError

__all__ = ["RUNS_DIR", "RunResult", "check_trace", "harvest_trace", "plan_lines", "plan_markdown",
           "plan_search", "run", "run_search", "run_stages", "trace_name"]

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
    storage: str | None = None  # the study storage the search used
    ab_exit: int | None = None  # tuner run --ab: the A/B's exit code


# ------------------------------------------------------------------------------------- helpers
def trace_name(trace: str | Path) -> str:
    name = Path(trace).name
    for suffix in (".gz", ".json", ".trace", ".pt"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name) or "trace"


def harvest_trace(trace: str | Path, top: int = 8, kv_heads: int | None = None,
                  topk: int | None = None, gated_mlp: bool = False) -> pd.DataFrame:
    """Harvest the trace (tuner.harvest; `kv_heads`: its regrouping of repeated-KV decode
    attention; `topk`: its reading of transformers' grouped-mm experts as moe calls;
    `gated_mlp`: its reading of dense gated MLPs as moe rows) and print its summary and top
    rows."""
    from . import harvest

    result = harvest.harvest([str(trace)], quiet=True, kv_heads=kv_heads, topk=topk,
                             gated_mlp=gated_mlp)
    harvest.report(result, top=top)
    return result.table


def plan_search(budget: pd.DataFrame, family: str, timeout_s: float) -> pd.DataFrame:
    """Which shapes the search would spend time on and how much: tuner.search's planner on this
    run's budget (`search.plan_shapes`), with the time budget shared by weight as tuner search
    shares it (column `seconds`)."""
    from . import search

    plan, _ = search.plan_shapes(budget, family)
    return plan.assign(seconds=search.share_seconds(list(plan["weight"]), timeout_s))


def check_trace(trace: Path) -> None:
    """A trace must exist and be a trace: a parquet table given instead is named, with the
    command that takes it."""
    if not trace.exists():
        raise TunerError(f"trace not found: {trace}")
    if not trace.is_file():
        return  # a profiler directory: harvest reads it
    with open(trace, "rb") as f:
        magic = f.read(4)
    if magic != b"PAR1":
        return
    try:
        import pyarrow.parquet as pq

        columns = set(pq.read_schema(trace).names)
    except Exception:  # noqa: BLE001 - a damaged parquet file: still not a trace
        columns = set()
    if "decision" in columns:
        what, command = "a verdict table (from `tuner rank`)", f"`tuner export {trace}`"
    elif "verdict" in columns:
        what, command = "a budget table (from `tuner budget`)", f"`tuner search {trace}`"
    else:
        what, command = "a shape table (from `tuner harvest`)", \
            f"`tuner budget {trace}` or `tuner search {trace}`"
    raise TunerError(f"{trace} is {what}, not a profiler trace: `tuner run` takes a torch "
                     f"profiler trace (.json, .json.gz); give the table to {command}")


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
def run_search(plans: list, *, storage: str | None, timeout_s: float, out=print,
               objective=None, trials: int | None = None) -> str:
    """tuner.search over the plans under the time budget (every visible GPU); the storage URL.
    A search that produced nothing (every worker died, every trial failed) is an error."""
    from . import search

    url = search.storage_url(storage, search.DEFAULT_STORAGE)
    settings = search.SearchSettings(storage=url, timeout_s=timeout_s, trials=trials,
                                     objective=objective)
    summary = search.run_search(plans, settings)
    out(search.format_summary(summary))
    why = search.problem(summary)
    if why:
        raise TunerError(f"the search produced nothing to rank: {why}")
    return url


def run(trace: str | Path, **options) -> RunResult:
    """The main job (`run_stages`, with its keyword arguments), then report.html and run.json
    (the study storage) in the run directory: tuner.report."""
    from .report import write_run_report

    ab_target, ab_batch = options.pop("ab", None), options.pop("ab_batch", 1)
    result = run_stages(trace, **options)
    gpu = have_gpu() if options.get("gpu") is None else options["gpu"]
    write_run_report(result, options, gpu=gpu, out=options.get("out", print))
    if ab_target:
        step = options.get("baseline") or ("compile" if options.get("compiled_baseline") else "")
        result.ab_exit = run_ab(result, ab_target, ab_batch, gpu=gpu, out=options.get("out", print),
                                baseline=step)
    return result


def run_ab(result: RunResult, target: str, batch: int, *, gpu: bool, out=print,
           baseline: str = "") -> int:
    """`tuner run --ab MODULE:CALLABLE`: the model's decode step both ways with this run's export
    (tuner.ab), against `baseline` (the one rank measured against; default the strongest the
    machine runs); without a GPU, or with nothing exported, say what it would run."""
    from . import ab
    from .runtime import current_identity

    spec = ("callable", target)
    if not gpu:
        for line in ab.plan_lines(spec, [batch], ab.ABSettings()):
            out(line)
        out("tuner ab needs a GPU: none is visible here, so the A/B was not run")
        return 0
    if not result.exported:
        out("no A/B: nothing was exported, so the tuned arm would be the baseline")
        return 0
    key = (current_identity() or {}).get("key", "")
    manifest = next((p for p in result.exported if p.name == "manifest.json"
                     and p.parent.name == key), None)
    export_dir = manifest.parent if manifest is not None else result.exported[0].parent
    settings = ab.ABSettings(export_dir=str(export_dir))
    return ab.run(spec, batches=[int(batch)], settings=settings,
                  baselines=[baseline] if baseline else None, out_root=result.out_dir / "ab",
                  out=out)


def run_stages(trace: str | Path, *, family: str = "gemv", timeout: str | float = "30m",
               storage: str | None = None, device: str | None = None, min_saving: str | None = None,
               out_dir: str | Path | None = None, export_root: str | Path | None = None,
               top: int = 3, parity: str = "accuracy", min_speedup: float = 1.01,
               parity_margin: float = 1.25,
               graph_captured: bool = False, gpu: bool | None = None, out=print,
               trials: int | None = None, objective=None, measure=None,
               kv_heads: int | None = None, compiled_baseline: bool = False,
               baseline: str = "", topk: int | None = None,
               gated_mlp: bool = False) -> RunResult:
    """The main job. `gpu=None` detects; False forces the CPU path (harvest, budget, plan);
    `kv_heads`: the model's KV heads for harvest (`tuner harvest --kv-heads`); `topk`: the
    model's top-k for harvest (`tuner harvest --topk`: transformers' grouped-mm experts);
    `gated_mlp`: harvest's reading of dense gated MLPs as moe rows (`tuner harvest --gated-mlp`);
    `baseline`: what rank measures the candidates against (`tuner rank --baseline`: eager,
    compile, max-autotune; `compiled_baseline` is the older name of 'compile').

    `objective` (a tuner.search objective factory) and `measure` (a tuner.rank measure function)
    replace the GPU timing, for tests of the whole pipeline on a CPU."""
    from . import budget as budget_mod
    from . import search, shapetable
    from .harvest import check_topk
    from .runtime import EXPORT_ROOT

    timeout_s = parse_duration(timeout)
    check_topk(topk)
    trace = Path(trace)
    check_trace(trace)
    out_dir = Path(out_dir) if out_dir else RUNS_DIR / trace_name(trace)
    result = RunResult(out_dir=out_dir)
    gpu = have_gpu() if gpu is None else gpu

    # 1. harvest
    table = harvest_trace(trace, kv_heads=kv_heads, topk=topk, gated_mlp=gated_mlp)
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
    for line in budget_mod.compute_floor_lines(budget):
        out(line)
    for line in plan_lines(plan, family, timeout_s):
        out(line)
    if plan.empty:
        hint = search.launch_bound(budget, table, family, profile, threshold=threshold)
        if hint is not None:
            out(f"note: {hint.hint(family)}")
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
    plans, _ = search.study_plans(plan, family, profile, device_key=ident["key"],
                                  parity_mode=parity, parity_margin=parity_margin,
                                  source=str(result.shapes_path))
    if not plans:
        out("nothing to search: no planned shape has a valid config in the search space")
        return result
    out(f"search: {len(plans)} shape(s) on this machine's GPUs for {_fmt_seconds(timeout_s)}")
    url = run_search(plans, storage=storage, timeout_s=timeout_s, out=out, objective=objective,
                     trials=trials)
    result.searched, result.storage = True, url
    verdicts = rank_mod.rank(url, family=family, device=ident.get("key"), top=top,
                             parity_mode=parity, margin=parity_margin, min_speedup=min_speedup,
                             threshold=min_saving, measure=measure,
                             names=[p.study_name for p in plans],
                             compiled_baseline=compiled_baseline, baseline=baseline)
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
