"""`tuner search` as one call: check the machine, read the shape table, plan, search.

`search(...)` refuses what cannot work before any work: no GPU (before asking for a device
profile), GPU ids this machine does not have (both: tuner.search.gpus), an unusable storage. It
budgets the table (the one planner, tuner.search.planning), prints each skipped shape with its
reason and each planned study, and runs the supervisor's `run_search`. When no shape survives,
the error names --min-saving and, for a launch-bound trace budgeted against the wall step,
--graph-captured.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from ..errors import TunerError, info
from .gpus import have_gpu, parse_gpus, require_gpu, visible_gpus
from .objective import ObjectiveFactory
from .planning import (DEFAULT_STORAGE, SearchSettings, judge, launch_bound,
                       plan_shapes, share_time, study_plans)
from .samplers import check_sampler
from .storage import storage_url
from .summary import SearchSummary
from .supervisor import run_search

__all__ = ["check_gpu_stack", "have_gpu", "parse_gpus", "require_gpu", "search"]


def check_gpu_stack(family: str) -> None:
    """Fail in the parent, with one line, before workers start, when the GPU path cannot load."""
    try:
        importlib.import_module("tuner.bench")
        importlib.import_module("tuner.parity")
        importlib.import_module(f"tuner_kernels.{family}")
    except ImportError as exc:
        raise TunerError(f"the GPU objective cannot load: {exc}") from None


def read_shapes(path: str | Path):
    """The shape table; a profiler trace given instead is named as such."""
    from tuner import shapetable

    path = Path(path)
    if path.is_file():
        with open(path, "rb") as f:
            head = f.read(4)
        if head[:2] == b"\x1f\x8b" or head[:1] in (b"{", b"["):
            raise TunerError(f"{path} is a profiler trace, not a shape table: `tuner harvest "
                             f"{path} -o shapes.parquet` makes the table (or `tuner run {path}` "
                             f"does harvest, budget and search in one command)")
    return shapetable.read(path)


def search(shapes_path: str | Path, family: str, *, device=None, storage: str | None = None,
           timeout_s: float | None = None, trials: int | None = None, gpus: list[str] | None = None,
           sampler: str = "tpe", threshold=None, seed: int = 0, parity_mode: str = "accuracy",
           trial_timeout_s: float = 600.0, objective_factory: ObjectiveFactory | str | None = None,
           progress: bool = True, heartbeat_s: int = 10, grace_s: int = 60,
           graph_captured: bool = False, parity_margin: float = 1.25,
           compile_threads: int | None = None) -> SearchSummary:
    """`tuner search`: budget the shape table, then search every surviving shape.

    `device`: a DeviceProfile, a profile name/path, or None (tuner.device.choose_profile).
    `objective_factory` replaces the GPU objective: tests pass a cheap deterministic one through
    the same orchestration. `graph_captured` budgets against the GPU-busy step.
    """
    from tuner.device import choose_profile
    from tuner.parity import resolve_gate

    check_sampler(sampler)
    parity_mode = resolve_gate(parity_mode, quiet=True)
    if compile_threads is not None and compile_threads < 0:
        raise TunerError(f"--compile-threads must be 0 (off) or more, got {compile_threads}")
    if not parity_margin >= 1.0:
        raise TunerError(f"--parity-margin must be at least 1, got {parity_margin}")
    if trials is not None and trials < 1:
        raise TunerError(f"--trials must be at least 1, got {trials}")
    if timeout_s is not None and timeout_s <= 0:
        raise TunerError("--timeout must be positive")
    if objective_factory is None:
        require_gpu(gpus)
    table = read_shapes(shapes_path)
    if hasattr(device, "backend"):
        profile = device
    else:
        profile, label = choose_profile(device, list(table["device"].dropna().unique()),
                                        gpu=objective_factory is None)
        info(f"device profile: {label}")
    judged = judge(table, family, profile, threshold=threshold, graph_captured=graph_captured)
    planned, skipped = plan_shapes(judged, family)
    plans, empty = study_plans(planned, family, profile, parity_mode=parity_mode,
                               parity_margin=parity_margin, source=str(shapes_path))
    skipped += empty
    for key, reason in skipped:
        info(f"skip {key}: {reason}")
    if not plans:
        hint = launch_bound(judged, table, family, profile, threshold=threshold)
        extra = ""
        if hint is not None:
            extra = (f", or add --graph-captured: the traced steps are launch-bound (GPU busy "
                     f"{hint.gpu_busy_share * 100:.0f}% of the step) and against the GPU-busy "
                     f"step {hint.shapes} {family} shape(s) would be searched")
        raise TunerError(f"no {family} shape survives the budget: every shape was skipped "
                         f"(see the reasons above; lower --min-saving to search them anyway{extra})")
    settings = SearchSettings(storage=storage_url(storage, DEFAULT_STORAGE), sampler=sampler,
                              trials=trials, timeout_s=timeout_s, gpus=gpus, seed=seed,
                              trial_timeout_s=trial_timeout_s, heartbeat_s=heartbeat_s,
                              grace_s=grace_s, objective=objective_factory, progress=progress,
                              compile_threads=compile_threads)
    if settings.objective is None:
        check_gpu_stack(family)
    workers = len(gpus) if gpus else max(1, len(visible_gpus()))
    shares = share_time(plans, timeout_s * workers) if timeout_s else {}
    for plan in sorted(plans, key=lambda p: -p.weight):
        share = f", ~{shares[plan.study_name]:.0f} GPU-s" if shares else ""
        info(f"plan {plan.study_name}: {plan.weight:.3g} us/token headroom{share}, "
             f"{plan.n_valid} valid configs, {len(plan.known_keys)} known ones queued first")
    return run_search(plans, settings, skipped)
