"""The search summary: per shape what the storage holds, read at the end of a search.

Per shape: trials measured, failed and infeasible, GPU seconds, baseline / default / best µs,
the speedups and the status (`exhausted`, `trials`, `time`, `stopped`, `incomplete`).
`problem` says why a search that ran produced nothing (every GPU given up, every trial failed),
so the command can exit non-zero with that reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .claims import read_state, study_done
from .planning import SearchSettings, StudyPlan
from .storage import make_storage

__all__ = ["SearchSummary", "ShapeResult", "format_summary", "problem", "summarize"]


@dataclass
class ShapeResult:
    study_name: str
    shape_key: str
    weight_us_per_token: float
    status: str
    measured: int
    failed: int
    infeasible: int
    spent_s: float
    best_config: dict | None
    best_us: float | None
    baseline_us: float | None
    default_us: float | None
    speedup_vs_baseline: float | None
    speedup_vs_default: float | None
    best_trial: int | None
    failures: dict = field(default_factory=dict)  # failure reason -> count


@dataclass
class SearchSummary:
    shapes: list[ShapeResult]
    skipped: list[tuple[str, str]]
    interrupted: bool
    wall_s: float
    worker_restarts: int
    workers: int = 0
    given_up: list[str] = field(default_factory=list)  # per GPU given up: its last reason


def summarize(plans: list[StudyPlan], settings: SearchSettings, skipped: list[tuple[str, str]],
              *, interrupted: bool = False, wall_s: float = 0.0, restarts: int = 0,
              workers: int = 0, given_up: list[str] | None = None) -> SearchSummary:
    import optuna

    storage = make_storage(settings.storage, None, None)
    shapes = []
    for plan in plans:
        study = optuna.load_study(study_name=plan.study_name, storage=storage)
        trials = study.get_trials(deepcopy=False)
        state = read_state(trials, plan)
        status = study_done(state, plan, settings.trials, in_flight_counts=False) or (
            "stopped" if interrupted else "time" if settings.timeout_s else "incomplete")
        baseline = study.user_attrs.get("baseline_us")
        default_us = None
        for t in trials:
            if t.user_attrs.get("role") == "default" and t.state.name == "COMPLETE":
                default_us = t.value
        best = state.best
        best_us = best.value if best is not None else None
        if default_us is not None and study.user_attrs.get("default_us") != default_us:
            study.set_user_attr("default_us", default_us)
        shapes.append(ShapeResult(
            study_name=plan.study_name, shape_key=plan.shape_key, weight_us_per_token=plan.weight,
            status=status, measured=state.measured, failed=state.failed, infeasible=state.infeasible,
            spent_s=state.spent_s,
            best_config=dict(best.user_attrs.get("config") or {}) if best is not None else None,
            best_us=best_us, baseline_us=baseline, default_us=default_us,
            speedup_vs_baseline=(baseline / best_us) if baseline and best_us else None,
            speedup_vs_default=(default_us / best_us) if default_us and best_us else None,
            best_trial=best.number if best is not None else None, failures=dict(state.failures)))
    return SearchSummary(shapes, list(skipped), interrupted, wall_s, restarts, workers,
                         list(given_up or []))


def problem(summary: SearchSummary) -> str:
    """Why a search produced nothing ('' when it did, or when it was interrupted)."""
    if summary.interrupted:
        return ""
    if summary.workers and len(summary.given_up) >= summary.workers:
        return (f"every worker died: {len(summary.given_up)} GPU(s) given up, each after its "
                f"worker died repeatedly without finishing a trial (last: {summary.given_up[-1]})")
    measured = sum(s.measured for s in summary.shapes)
    if measured and all(s.failed == s.measured for s in summary.shapes):
        reasons: dict[str, int] = {}
        for s in summary.shapes:
            for reason, n in s.failures.items():
                reasons[reason] = reasons.get(reason, 0) + n
        reason, n = max(reasons.items(), key=lambda item: item[1]) if reasons else ("?", 0)
        return (f"every one of the {measured} measured trials failed; most often ({n}x): "
                f"{reason[:300]}")
    return ""


def format_summary(summary: SearchSummary) -> str:
    def num(v, fmt):
        return "-" if v is None else format(v, fmt)

    lines = [f"skipped {key}: {reason}" for key, reason in summary.skipped]
    lines.append(f"{'shape':<40} {'us/tok':>7} {'trials':>6} {'fail':>4} {'infs':>4} "
                 f"{'base us':>8} {'dflt us':>8} {'best us':>8} {'vs base':>7} {'vs dflt':>7}  "
                 f"status     best config")
    for s in sorted(summary.shapes, key=lambda s: -s.weight_us_per_token):
        config = json.dumps(s.best_config, sort_keys=True) if s.best_config else "-"
        lines.append(f"{s.shape_key:<40} {s.weight_us_per_token:>7.2f} {s.measured:>6} "
                     f"{s.failed:>4} {s.infeasible:>4} {num(s.baseline_us, '8.2f')} "
                     f"{num(s.default_us, '8.2f')} {num(s.best_us, '8.2f')} "
                     f"{num(s.speedup_vs_baseline, '7.3f')} {num(s.speedup_vs_default, '7.3f')}  "
                     f"{s.status:<10} {config}")
    tail = f"{len(summary.shapes)} shapes searched in {summary.wall_s:.0f}s"
    if summary.worker_restarts:
        tail += f", {summary.worker_restarts} worker restarts"
    if summary.interrupted:
        tail += " (interrupted: run the same command again to resume)"
    lines.append(tail)
    return "\n".join(lines)
