"""Study planning: shape table -> budget -> one `StudyPlan` per kernel shape worth a search.

This is the one planner: `tuner search` (`plan_studies`) and `tuner run` (`plan_shapes` +
`study_plans` on the budget it writes) both use it, so the same data gives the same studies.

- `judge`: the table's rows of a kernel family, budgeted (tuner.budget) against the wall step or,
  with `graph_captured`, the GPU-busy step.
- `plan_shapes`: the kept rows grouped per kernel shape. Rows of one shape in one phase (e.g.
  addmm and mm of one linear) run in the same step: their calls and headroom add up (baseline
  and floor become call-weighted means). One shape in several phases is one study, described by
  its largest phase (calls, step, phase) and weighted by the headroom of all of them.
- `study_plans`: a `StudyPlan` per planned shape: the search space of the profile's backend, the
  family's default config, the weight (headroom µs per token: the share of the time budget),
  and the study attributes. `step_us` is the budget's `step_basis_us`, the step the share was
  taken of (the GPU-busy step under --graph-captured), and `step_basis` says which; rank's
  share-of-step gate reads them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..errors import TunerError, warn
from ..parity import DEFAULT_GATE, DEFAULT_MARGIN, GATES
from ..spaces import with_row_measure_keys

__all__ = ["DEFAULT_STORAGE", "DEFAULT_TRIALS", "LaunchBound", "PARITY_MODES", "SearchSettings",
           "StudyPlan", "backend_of", "config_key", "full_config", "judge", "known_params",
           "launch_bound", "make_plan", "plan_shapes", "plan_studies", "share_seconds", "share_time",
           "study_name", "study_plans", "valid_params"]

DEFAULT_STORAGE = "sqlite:///artifacts/studies.db"
DEFAULT_TRIALS = 100  # per shape, when neither --trials nor --timeout is given
PARITY_MODES = GATES  # the parity gates (tuner.parity): baseline, kernel, accuracy


@dataclass
class StudyPlan:
    """Everything a worker needs to search one shape (picklable)."""

    study_name: str
    family: str
    shape: dict
    shape_key: str
    device_key: str
    backend: str
    space: Any  # tuner.spaces.SearchSpace
    default_config: dict
    weight: float  # headroom µs per token: the share of the time budget
    valid_keys: tuple[str, ...]  # every config the space allows, as config_key strings
    known_keys: tuple[str, ...] = ()  # tuner_kernels.candidates' configs the space allows (queued first)
    parity_mode: str = DEFAULT_GATE  # the gate that makes a trial feasible (tuner.parity)
    attrs: dict = field(default_factory=dict)  # calls_per_step, step_us, step_basis, hit_rate, ...
    parity_margin: float = DEFAULT_MARGIN

    @property
    def n_valid(self) -> int:
        return len(self.valid_keys)


@dataclass
class SearchSettings:
    storage: str = DEFAULT_STORAGE
    sampler: str = "tpe"
    trials: int | None = None  # measured trials per shape
    timeout_s: float | None = None  # wall time of the whole search
    gpus: list[str] | None = None  # GPU ids, one worker each; None: every visible GPU
    seed: int = 0
    trial_timeout_s: float = 600.0  # a trial (compile + parity + timing) longer than this hangs
    heartbeat_s: int = 10
    grace_s: int = 60
    objective: Any = None  # ObjectiveFactory, "module:function", or None (GPU)
    progress: bool = True
    slice_s: float | None = None  # a worker re-picks its study this often (None: from the timeout)
    compile_threads: int | None = None  # per worker, compiling queued configs ahead (0: off;
    # None: tuner.precompile.auto_threads for the GPU objective, off for a test's objective)


def config_key(config: dict) -> str:
    return json.dumps(config, sort_keys=True, default=str)


def full_config(default: dict, params: dict) -> dict:
    """A candidate config: the default config with the searched parameters replaced."""
    return {**default, **params}


def study_name(device_key: str, family: str, shape_key: str) -> str:
    return f"{device_key}:{family}:{shape_key}"


def backend_of(profile) -> str:
    """The search space section of a profile: cuda, hip or dcu."""
    return "dcu" if getattr(profile, "is_dcu", False) else profile.backend


def valid_params(plan: StudyPlan) -> list[dict]:
    """Every valid config of the plan, as the searched parameters only."""
    return [{k: c[k] for k in plan.space.params} for c in map(json.loads, plan.valid_keys)]


def known_params(plan: StudyPlan) -> list[dict]:
    """The plan's known configs (tuner_kernels/candidates.py), as the searched parameters only."""
    return [{k: c[k] for k in plan.space.params} for c in map(json.loads, plan.known_keys)]


def make_plan(*, family: str, shape: dict, shape_key: str, device_key: str, backend: str, space,
              default_config: dict, weight: float, parity_mode: str = DEFAULT_GATE,
              attrs: dict | None = None, parity_margin: float = DEFAULT_MARGIN,
              known_configs: Sequence[dict] = ()) -> StudyPlan:
    """A plan for one shape; checks the space and the default config. Under the `kernel` gate
    only configs that can pass are searched: the space's order parameters stay at the default
    config's values (its output class, as far as the space declares). `known_configs`
    (partial configs, tuner_kernels.candidates) become the plan's known configs where the space allows
    them."""
    default = dict(default_config)
    if parity_mode == "kernel":
        space = space.within_class_of(default)
    valid = space.configs(shape)
    searched = {k: default[k] for k in space.params if k in default}
    outside = {k: default[k] for k, v in space.params.items() if k in default and default[k] not in v}
    if outside:
        warn(f"{shape_key}: the default config has values outside the search space {outside}; "
             f"it is timed for the study's default_us but cannot be a trial")
    elif len(searched) == len(space.params) and not space.allows(searched, shape):
        warn(f"{shape_key}: the default config violates the search space's constraints")
    return StudyPlan(study_name=study_name(device_key, family, shape_key), family=family,
                     shape=dict(shape), shape_key=shape_key, device_key=device_key, backend=backend,
                     space=space, default_config=default,
                     weight=float(weight) if weight and math.isfinite(weight) and weight > 0 else 0.0,
                     valid_keys=tuple(config_key(full_config(default, c)) for c in valid),
                     known_keys=tuple(config_key(full_config(default, c))
                                      for c in space.known(list(known_configs), shape, default)),
                     parity_mode=parity_mode, attrs=dict(attrs or {}),
                     parity_margin=float(parity_margin))


# ------------------------------------------------------------------------------- the planner
def family_rows(table, family: str):
    """The table's rows that the kernel family serves (its `shape_from_row` accepts them)."""
    from tuner_kernels import get_family

    fam = get_family(family)
    return table[[fam.shape_from_row(r) is not None for _, r in table.iterrows()]].reset_index(drop=True)


def judge(table, family: str, profile, *, threshold=None, graph_captured: bool = False):
    """The budget (tuner.budget.compute) of the table's rows of `family`."""
    from tuner import budget

    rows = family_rows(table, family)
    if rows.empty:
        raise TunerError(f"the shape table has no {family} shapes "
                         f"(ops/families in it: {', '.join(sorted(set(table['family'].astype(str))))})")
    kwargs = {"threshold": threshold} if threshold is not None else {}
    return budget.compute(rows, profile, graph_captured=graph_captured, **kwargs)


def plan_shapes(judged, family: str):
    """The kept budget rows of `family`, one row per kernel shape to search; and the skipped
    shapes as [(shape_key, "phase: reason")] (pruned in every phase they appear in).

    Columns: shape_key, shape (dict), phase, calls_per_step, baseline_us, floor_us,
    headroom_us_per_token (all phases), headroom_share, step_us (the budget's step basis),
    step_basis ("wall" or "gpu_busy"), hit_rate, weight (headroom, or the smallest known one
    for a shape the budget could not judge). Largest headroom first."""
    import pandas as pd
    from tuner_kernels import get_family

    fam = get_family(family)
    shapes = [with_row_measure_keys(fam.shape_from_row(r), r) for _, r in judged.iterrows()]
    rows = judged.assign(kernel_shape=shapes)[[s is not None for s in shapes]]
    rows = rows.assign(shape_key=[fam.shape_key(s) for s in rows["kernel_shape"]])
    kept = rows[rows["verdict"] == "keep"]
    for key, group in kept.groupby("shape_key", sort=False):
        measured = {json.dumps(s, sort_keys=True) for s in group["kernel_shape"]}
        if len(measured) > 1:  # e.g. one row harvested with --kv-heads, one without
            warn(f"{key}: the table holds this call measured {len(measured)} ways (a "
                 "measurement key such as baseline_kv_heads or baseline_compiled differs "
                 "between its rows, e.g. tables harvested with and without --kv-heads, or of an "
                 "eager and a compiled step); one baseline is searched and ranked for all of "
                 "them")
    kept_keys = set(kept["shape_key"])
    skipped = [(r.shape_key, f"{r.phase}: {r.reason}") for r in rows.itertuples(index=False)
               if r.verdict != "keep" and r.shape_key not in kept_keys]
    columns = ["shape_key", "shape", "phase", "calls_per_step", "baseline_us", "floor_us",
               "headroom_us_per_token", "headroom_share", "step_us", "step_basis", "hit_rate",
               "weight"]
    if kept.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in columns}), skipped
    kept = kept.assign(_w=kept["headroom_us_per_token"].fillna(0.0).clip(lower=0.0),
                       _bc=kept["baseline_us"] * kept["calls_per_step"],
                       _fc=kept["floor_us"] * kept["calls_per_step"])
    per_phase = (kept.groupby(["shape_key", "phase"], sort=False)
                 .agg(shape=("kernel_shape", "first"), calls_per_step=("calls_per_step", "sum"),
                      _bc=("_bc", "sum"), _fc=("_fc", "sum"), headroom_us_per_token=("_w", "sum"),
                      headroom_share=("headroom_share", "sum"),
                      step_us=("step_basis_us", "first"), step_basis=("step_basis", "first"),
                      hit_rate=("hit_rate", "first"))
                 .reset_index())
    per_phase["baseline_us"] = per_phase["_bc"] / per_phase["calls_per_step"]
    per_phase["floor_us"] = per_phase["_fc"] / per_phase["calls_per_step"]
    per_phase = per_phase.sort_values("headroom_us_per_token", ascending=False, kind="stable")
    weights = per_phase.groupby("shape_key", sort=False)["headroom_us_per_token"].sum()
    planned = per_phase.drop_duplicates("shape_key", keep="first").drop(columns=["_bc", "_fc"])
    planned["headroom_us_per_token"] = planned["shape_key"].map(weights)
    known = [w for w in planned["headroom_us_per_token"] if w > 0]
    floor = min(known) if known else 1.0  # an unjudged shape gets the smallest share
    planned["weight"] = [w if w > 0 else floor for w in planned["headroom_us_per_token"]]
    planned = planned.sort_values("headroom_us_per_token", ascending=False, kind="stable")
    return planned[columns].reset_index(drop=True), skipped


def study_plans(planned, family: str, profile, *, device_key: str | None = None,
                parity_mode: str = DEFAULT_GATE, source: str = "",
                spaces_dir: Path | None = None, parity_margin: float = DEFAULT_MARGIN
                ) -> tuple[list[StudyPlan], list[tuple[str, str]]]:
    """A StudyPlan per planned shape (`plan_shapes`), named for `device_key` (default: the
    profile's); shapes without any valid config come back as skipped."""
    from tuner_kernels import get_family
    from tuner_kernels.candidates import candidate_configs
    from tuner import spaces

    fam = get_family(family)
    backend = backend_of(profile)
    space = spaces.space_for(family, backend, spaces_dir) if spaces_dir else spaces.space_for(family, backend)
    sm_count = int(getattr(profile, "multiprocessors", 0) or 0) or None
    dkey = device_key or profile.device_key
    plans, skipped = [], []
    for r in planned.itertuples(index=False):
        shape = dict(r.shape)
        default = fam.default_config(shape, backend, sm_count=sm_count)
        plan = make_plan(family=family, shape=shape, shape_key=r.shape_key, device_key=dkey,
                         backend=backend, space=space, default_config=dict(default),
                         weight=float(r.weight), parity_mode=parity_mode,
                         known_configs=candidate_configs(family, shape, backend, sm_count),
                         parity_margin=parity_margin, attrs={"calls_per_step": float(r.calls_per_step),
                                "step_us": float(r.step_us), "step_basis": str(r.step_basis),
                                "hit_rate": float(r.hit_rate), "phase": str(r.phase),
                                "source": source})
        if plan.n_valid == 0:
            skipped.append((r.shape_key, "no config of the search space satisfies its constraints"))
            continue
        plans.append(plan)
    return plans, skipped


def plan_studies(table, family: str, profile, *, threshold=None, parity_mode: str = DEFAULT_GATE,
                 source: str = "", spaces_dir: Path | None = None, graph_captured: bool = False,
                 device_key: str | None = None) -> tuple[list[StudyPlan], list[tuple[str, str]]]:
    """Budget the table's rows of `family` on `profile`; a plan per surviving kernel shape.
    Returns (plans, skipped) with skipped = [(shape_key, reason)]."""
    judged = judge(table, family, profile, threshold=threshold, graph_captured=graph_captured)
    planned, skipped = plan_shapes(judged, family)
    plans, empty = study_plans(planned, family, profile, device_key=device_key,
                               parity_mode=parity_mode, source=source, spaces_dir=spaces_dir)
    return plans, skipped + empty


@dataclass
class LaunchBound:
    """The traced steps are launch-bound: against the GPU-busy step `shapes` would be searched."""

    gpu_busy_share: float
    shapes: int

    def hint(self, family: str) -> str:
        return (f"the traced steps are launch-bound (GPU busy {self.gpu_busy_share * 100:.0f}% of "
                f"the step), so kernel savings are diluted by launch overhead here. Served under "
                f"CUDA/HIP graphs (as vLLM and SGLang run decode), {self.shapes} {family} shape(s) "
                f"would be worth a search: add --graph-captured to budget against the GPU-busy step.")


def launch_bound(judged, table, family: str, profile, *, threshold=None) -> LaunchBound | None:
    """For a budget against the wall step whose steps are launch-bound: how many shapes a
    --graph-captured budget would plan. None otherwise."""
    if judged.empty or (judged["step_basis"] != "wall").any() or not judged["launch_bound"].any():
        return None
    busy = float(judged.loc[judged["launch_bound"], "gpu_busy_share"].min())
    if family_rows(table, family).empty:
        return LaunchBound(busy, 0)
    captured = judge(table, family, profile, threshold=threshold, graph_captured=True)
    return LaunchBound(busy, len(plan_shapes(captured, family)[0]))


def share_seconds(weights: Sequence[float], total_s: float) -> list[float]:
    """`total_s` shared in proportion to the weights (equally when none is positive)."""
    total_w = sum(weights)
    if total_w <= 0:
        return [total_s / max(1, len(weights)) for _ in weights]
    return [total_s * w / total_w for w in weights]


def share_time(plans: list[StudyPlan], total_s: float) -> dict[str, float]:
    """Seconds of GPU time each study gets out of `total_s`, in proportion to its weight."""
    return dict(zip((p.study_name for p in plans), share_seconds([p.weight for p in plans], total_s)))
