"""`tuner search`: Optuna search over kernel parameters for every surviving shape.

One Optuna study per (device, family, shape), named ``f"{device_key}:{family}:{shape_key}"``, all in
one storage (SQLite under artifacts/ by default, PostgreSQL for many hosts). Running the same
command again resumes: studies are loaded, finished trials are kept, trials that a dead worker left
RUNNING are failed by Optuna's heartbeat check and retried once.

Pieces, top to bottom:

- `plan_studies`: shape table -> budget (tuner.budget) -> one `StudyPlan` per surviving shape, with
  its search space (tuner.spaces, the backend's section), the family's default config and its weight
  (headroom µs per token). Pruned shapes come back with their reason.
- `run_search`: creates / loads the studies, starts one worker process per GPU ('spawn'), supervises
  them (restarts a worker that died, kills one whose trial hangs past the per-trial timeout, marks
  the trial it was running FAIL with the reason) and prints the summary.
- `_worker_main`: the loop in each worker: pick the study with the least GPU time per unit of weight
  (weighted fair share, so the time budget goes to shapes in proportion to what they could save),
  run one trial through `study.optimize(n_trials=1)` (Optuna's heartbeat and stale-trial check
  included), report to the parent, repeat.
- `Objective` / `TrialResult`: the only thing a trial needs from the GPU. `GpuObjective` times a
  config with tuner.bench (cold L2) and checks parity with tuner.parity; tests pass a cheap
  deterministic objective through the same path (`objective_factory`).

How a trial ends (docs/search.md has the table):
- config outside the space's constraints: PRUNED, constraint "space" = 1, no GPU time (TPE learns
  from infeasible PRUNED trials, so it stops proposing them);
- output differs from the reference: COMPLETE with its time, constraint "parity" = 1 (infeasible);
- compile error / out of resources / runtime error: FAIL with user attr `failure`;
- the worker died (crash, illegal memory access, kill -9) or was killed for hanging: FAIL with the
  reason; a death is retried once (enqueued again), a hang is not;
- a config this study already measured: answered from the earlier trial (user attr
  `duplicate_of`), no GPU time;
- a config an earlier trial of another worker is measuring right now: FAIL 'skipped' with
  `duplicate_of`, no GPU time (`_taken`: each config is measured once across workers).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import math
import os
import random
import re
import signal
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from .errors import TunerError, info, warn

DEFAULT_STORAGE = "sqlite:///artifacts/studies.db"
SAMPLERS = ("tpe", "grid", "random", "gp", "cmaes")
PARITY_MODES = ("tolerance", "exact")
DEFAULT_TRIALS = 100  # per shape, when neither --trials nor --timeout is given
CONSTRAINT_KEYS = ("space", "parity")  # every trial gets both (GPSampler needs the same keys)
EXIT_CONTEXT_LOST = 3  # a worker exits with this after a trial corrupted its GPU context
MAX_DEATHS_PER_CONFIG = 2  # a config that killed its worker this often is failed for good
MAX_RESTARTS_IN_A_ROW = 5  # a worker slot that dies this often without finishing a trial is given up
RETRYABLE_PREFIXES = ("worker died", "interrupted")
SKIPPED = "skipped:"  # failure prefix of a trial that stepped back before running (not counted)
MAX_SAMPLER_REPEATS = 20  # after this many duplicate / invalid proposals in a row, queue a fresh config
CLAIM_WAIT_S = 10.0  # a trial waits at most this long for an earlier trial to write its config


# ------------------------------------------------------------------------------ objective API
@dataclass
class TrialResult:
    """What one evaluated config produced. `failure` set means the candidate did not run."""

    median_us: float | None = None
    noise_pct: float | None = None
    output_hash: str = ""
    parity: str = ""  # "exact", "tolerance" or "mismatch"
    rel_err: float | None = None
    failure: str | None = None
    fatal: bool = False  # the GPU context is unusable: record the trial, then the worker exits


class Objective(Protocol):
    """What a trial needs from the GPU. Made in the worker process by an objective factory."""

    def baseline_us(self) -> float: ...

    def evaluate(self, config: dict) -> TrialResult: ...


# The objective factory: plan -> Objective, called in the worker (after CUDA_VISIBLE_DEVICES is
# set). Give a module-level function, or "module:function", so that 'spawn' can pickle it.
ObjectiveFactory = Callable[["StudyPlan"], Objective]

_CONTEXT_LOST_MARKERS = ("illegal memory access", "unspecified launch failure",
                         "device-side assert", "misaligned address", "illegal instruction",
                         "an illegal", "hipErrorIllegalAddress", "memory access fault")


class GpuObjective:
    """Times a config with tuner.bench (cold L2) and checks its parity with tuner.parity.

    The parity inputs, the reference output and the cold-L2 input sets are made once per shape
    (the first time they are needed) and reused by every trial of that shape in this worker.
    `device=None`: the worker's GPU; under TRITON_INTERPRET=1 without a GPU, the CPU (for checks of
    this code path only: interpreter times mean nothing)."""

    def __init__(self, plan: "StudyPlan", *, device=None, cache: str = "cold",
                 groups: int | None = None, replays: int | None = None):
        from kernels import get_family

        self.plan = plan
        self.family = get_family(plan.family)
        self.device = device if device is not None else _interpreter_device()
        self.cache = cache
        self.timer_options = {k: v for k, v in (("groups", groups), ("replays", replays)) if v}
        self._checker = None
        self._input_sets = None

    def _sets(self):
        from tuner import bench

        if self._input_sets is None:
            self._input_sets = bench.make_input_sets(self.family, self.plan.shape, self.cache,
                                                     self.device)
        return self._input_sets

    def baseline_us(self) -> float:
        from tuner import bench

        timing = bench.time_baseline(self.family, self.plan.shape, cache=self.cache,
                                     device=self.device, input_sets=self._sets(),
                                     **self.timer_options)
        return float(timing.median_us)

    def evaluate(self, config: dict) -> TrialResult:
        from tuner import bench, parity

        plan = self.plan
        try:
            if self._checker is None:
                self._checker = parity.Checker(self.family, plan.shape, reference="default",
                                               device=self.device)
            check = self._checker.check(config, plan.parity_mode)
            timing = bench.time_config(self.family, plan.shape, config, cache=self.cache,
                                       device=self.device, input_sets=self._sets(),
                                       **self.timer_options)
        except bench.CandidateFailure as exc:
            return TrialResult(failure=f"candidate: {exc}", fatal=_context_lost(str(exc)))
        except Exception as exc:  # noqa: BLE001 - any error of a candidate is data
            text = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
            return TrialResult(failure=f"error: {text}", fatal=_context_lost(str(exc)))
        parity_class = getattr(check, "parity_class", None)
        if parity_class is None:
            parity_class = ("exact" if check.output_hash == check.reference_hash
                            else "tolerance" if check.passed else "mismatch")
        return TrialResult(median_us=float(timing.median_us), noise_pct=float(timing.spread_pct),
                           output_hash=check.output_hash, parity=parity_class,
                           rel_err=float(check.rel_err))


def _interpreter_device():
    if os.environ.get("TRITON_INTERPRET") != "1":
        return None
    import torch

    return None if torch.cuda.is_available() else "cpu"


def gpu_objective(plan: "StudyPlan") -> Objective:
    """The default objective factory: real GPU timing and parity."""
    return GpuObjective(plan)


def _context_lost(text: str) -> bool:
    low = text.lower()
    return any(marker.lower() in low for marker in _CONTEXT_LOST_MARKERS)


def resolve_factory(factory: ObjectiveFactory | str | None) -> ObjectiveFactory:
    if factory is None:
        return gpu_objective
    if callable(factory):
        return factory
    module_name, _, attr = str(factory).partition(":")
    if not module_name or not attr:
        raise TunerError(f"--objective must look like 'module:function', got {factory!r}")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise TunerError(f"cannot load objective {factory!r}: {exc}") from None


# ------------------------------------------------------------------------------------ planning
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
    parity_mode: str = "exact"
    attrs: dict = field(default_factory=dict)  # calls_per_step, step_us, hit_rate, phase, source

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


def config_key(config: dict) -> str:
    return json.dumps(config, sort_keys=True, default=str)


def study_name(device_key: str, family: str, shape_key: str) -> str:
    return f"{device_key}:{family}:{shape_key}"


def device_key_of(profile) -> str:
    """The profile's key without the '-spec' tag: studies name the device, not the datasheet."""
    return re.sub(r"-spec$", "", profile.key)


def backend_of(profile) -> str:
    return "dcu" if getattr(profile, "is_dcu", False) else profile.backend


def make_plan(*, family: str, shape: dict, shape_key: str, device_key: str, backend: str, space,
              default_config: dict, weight: float, parity_mode: str = "exact",
              attrs: dict | None = None) -> StudyPlan:
    """A plan for one shape; checks the space and the default config."""
    valid = space.configs(shape)
    default = dict(default_config)
    searched = {k: default[k] for k in space.params if k in default}
    if any(k in default and default[k] not in v for k, v in space.params.items()):
        outside = {k: default[k] for k, v in space.params.items() if k in default and default[k] not in v}
        warn(f"{shape_key}: the default config has values outside the search space {outside}; "
             f"it is timed for the study's default_us but cannot be a trial")
    elif len(searched) == len(space.params) and not space.allows(searched, shape):
        warn(f"{shape_key}: the default config violates the search space's constraints")
    return StudyPlan(study_name=study_name(device_key, family, shape_key), family=family,
                     shape=dict(shape), shape_key=shape_key, device_key=device_key, backend=backend,
                     space=space, default_config=default,
                     weight=float(weight) if weight and math.isfinite(weight) and weight > 0 else 0.0,
                     valid_keys=tuple(config_key(_full_config(default, c)) for c in valid),
                     parity_mode=parity_mode, attrs=dict(attrs or {}))


def _full_config(default: dict, params: dict) -> dict:
    """A candidate config: the default config with the searched parameters replaced."""
    return {**default, **params}


def plan_studies(table, family: str, profile, *, threshold=None, parity_mode: str = "exact",
                 source: str = "", spaces_dir: Path | None = None, graph_captured: bool = False
                 ) -> tuple[list[StudyPlan], list[tuple[str, str]]]:
    """Budget the table's rows of `family` on `profile`; a plan per surviving shape.

    Returns (plans, skipped) with skipped = [(shape_key, reason)]. Rows of one shape (e.g. the same
    linear in several phases) are merged: their headroom per token adds up.
    """
    from kernels import get_family
    from tuner import budget, spaces

    fam = get_family(family)
    backend = backend_of(profile)
    rows = table[[fam.shape_from_row(r) is not None for _, r in table.iterrows()]]
    if rows.empty:
        raise TunerError(f"the shape table has no {family} shapes "
                         f"(ops/families in it: {', '.join(sorted(set(table['family'].astype(str))))})")
    kwargs = {"threshold": threshold} if threshold is not None else {}
    judged = budget.compute(rows.reset_index(drop=True), profile, graph_captured=graph_captured,
                            **kwargs)
    space = spaces.space_for(family, backend, spaces_dir) if spaces_dir else spaces.space_for(family, backend)
    dkey = device_key_of(profile)
    sm_count = int(getattr(profile, "multiprocessors", 0) or 0) or None
    merged: dict[str, dict] = {}
    skipped: list[tuple[str, str]] = []
    for _, row in judged.iterrows():
        shape = fam.shape_from_row(row)
        key = fam.shape_key(shape)
        if row["verdict"] != "keep":
            skipped.append((key, f"{row['phase']}: {row['reason']}"))
            continue
        weight = float(row["headroom_us_per_token"])
        if key in merged:
            merged[key]["weight"] += weight if math.isfinite(weight) else 0.0
            continue
        merged[key] = {"shape": shape, "weight": weight if math.isfinite(weight) else 0.0,
                       "attrs": {"calls_per_step": float(row["calls_per_step"]),
                                 "step_us": float(row["step_us"]),
                                 "hit_rate": float(row.get("hit_rate", 1.0)),
                                 "phase": str(row["phase"]), "source": source}}
    # shapes kept in one phase are searched, so drop them from the skipped list
    skipped = [(k, r) for k, r in skipped if k not in merged]
    plans = []
    for key, item in merged.items():
        shape = item["shape"]
        default = _default_config(fam, shape, backend, sm_count)
        plan = make_plan(family=family, shape=shape, shape_key=key, device_key=dkey, backend=backend,
                         space=space, default_config=default, weight=item["weight"],
                         parity_mode=parity_mode, attrs=item["attrs"])
        if plan.n_valid == 0:
            skipped.append((key, "no config of the search space satisfies its constraints"))
            continue
        plans.append(plan)
    known = [w for w in (p.weight for p in plans) if w > 0]
    floor = min(known) if known else 1.0
    for plan in plans:  # a kept shape without a budget (unknown headroom) gets the smallest share
        if plan.weight <= 0:
            plan.weight = floor
    return plans, skipped


def _default_config(fam, shape: dict, backend: str, sm_count: int | None) -> dict:
    """The family's default config; pass the profile's SM count when the family takes one, so the
    parent process never initialises a GPU context."""
    try:
        params = inspect.signature(fam.default_config).parameters
    except (TypeError, ValueError):
        params = {}
    if sm_count and "sm_count" in params:
        return dict(fam.default_config(shape, backend, sm_count=sm_count))
    return dict(fam.default_config(shape, backend))


def share_time(plans: list[StudyPlan], total_s: float) -> dict[str, float]:
    """Seconds of GPU time each study gets out of `total_s`, in proportion to its weight."""
    total_w = sum(p.weight for p in plans)
    if total_w <= 0:
        return {p.study_name: total_s / max(1, len(plans)) for p in plans}
    return {p.study_name: total_s * p.weight / total_w for p in plans}


# ----------------------------------------------------------------------------------- storage
def _quiet_optuna() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", category=FutureWarning, module="optuna")


def make_storage(url: str, heartbeat_s: int | None = 10, grace_s: int | None = 60):
    """An RDBStorage with heartbeats: trials a dead worker left RUNNING become FAIL once their
    heartbeat is `grace_s` old, and are retried once (`_retry_stale_trial`)."""
    try:
        import optuna
    except ImportError:
        raise TunerError("optuna is not installed: pip install optuna") from None
    _quiet_optuna()
    engine_kwargs: dict = {}
    sqlite_file = None
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///"):])
        if str(path) not in ("", ":memory:"):
            path.parent.mkdir(parents=True, exist_ok=True)
            sqlite_file = path
            _sqlite_wal(path)
        engine_kwargs = {"connect_args": {"timeout": 60}}
    kwargs: dict = {}
    if heartbeat_s:
        kwargs = {"heartbeat_interval": int(heartbeat_s), "grace_period": int(grace_s or 60)}
        accepted = inspect.signature(optuna.storages.RDBStorage.__init__).parameters
        callback_arg = ("heartbeat_stale_trial_callback" if "heartbeat_stale_trial_callback" in accepted
                        else "failed_trial_callback")
        kwargs[callback_arg] = _retry_stale_trial
    try:
        storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, **kwargs)
    except Exception as exc:  # noqa: BLE001 - bad URL, server down, missing driver
        raise TunerError(f"cannot open the study storage {url}: "
                         f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    if sqlite_file is not None:
        # Optuna commits every attribute separately; with SQLite's default (fsync per commit)
        # that is ~10 ms each, ~0.4 s per trial. In WAL mode, synchronous=NORMAL keeps the file
        # consistent after a crash or kill -9 (only a power loss can drop the last commits).
        # BEGIN IMMEDIATE takes the write lock before a transaction reads, so two workers cannot
        # both pop the same enqueued trial (SQLite ignores SELECT ... FOR UPDATE).
        import sqlalchemy

        sqlalchemy.event.listen(storage.engine, "connect", _sqlite_pragmas)
        sqlalchemy.event.listen(storage.engine, "begin", _sqlite_begin)
        storage.engine.dispose()
    return storage


def _sqlite_wal(path: Path) -> None:
    import sqlite3

    connection = sqlite3.connect(str(path), timeout=60)
    try:
        connection.execute("PRAGMA journal_mode=WAL")
    finally:
        connection.close()


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    dbapi_connection.isolation_level = None  # SQLAlchemy's "begin" event issues BEGIN itself
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _sqlite_begin(connection) -> None:
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def _retry_stale_trial(study, trial) -> None:
    """Heartbeat callback: a trial whose worker vanished (kill -9, host crash) is enqueued again,
    unless its config already killed a worker before."""
    _maybe_retry(study, trial)


def _maybe_retry(study, trial) -> bool:
    from optuna.trial import TrialState

    params = dict(trial.params or trial.system_attrs.get("fixed_params") or {})
    if not params:
        return False  # died before it had a config: nothing to retry
    deaths = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
        other = dict(t.params or t.system_attrs.get("fixed_params") or {})
        if other == params and _is_death(t):
            deaths += 1
    if deaths >= MAX_DEATHS_PER_CONFIG:
        return False
    study.enqueue_trial(params, user_attrs={"retry_of": trial.number})
    return True


def _is_death(trial) -> bool:
    """A FAIL trial whose worker died (or vanished: no reason recorded) rather than a candidate
    that failed in a living worker."""
    reason = trial.user_attrs.get("failure")
    return reason is None or str(reason).startswith(RETRYABLE_PREFIXES)


def _set_constraints(trial, space: float, parity: float) -> None:
    """Optuna >= 5: Trial.set_constraint. Older: the samplers' constraints_func reads user attrs."""
    if hasattr(trial, "set_constraint"):
        trial.set_constraint("space", float(space))
        trial.set_constraint("parity", float(parity))


def parity_ok(parity_class: str, parity_mode: str) -> bool:
    """Is a trial's parity class feasible under the search's parity mode?"""
    if parity_mode == "exact":
        return parity_class == "exact"
    return parity_class in ("exact", "tolerance")


def _constraints_from_attrs(frozen) -> tuple[float, float]:
    """constraints_func for Optuna < 5 (the values _set_constraints writes; under --parity
    exact the 'parity' attr of a non-exact output is 'tolerance' and Optuna 5 has the value)."""
    failure = str(frozen.user_attrs.get("failure") or "")
    parity = frozen.user_attrs.get("parity")
    return (1.0 if failure.startswith("constraint") else 0.0,
            1.0 if parity is not None and parity == "mismatch" else 0.0)


def _is_feasible(frozen) -> bool:
    constraints = getattr(frozen, "constraints", None)
    if constraints:
        return all(v <= 0 for v in constraints.values())
    return max(_constraints_from_attrs(frozen)) <= 0


def n_startup(n_valid: int) -> int:
    """Trials before TPE / GP start modelling (the default config plus random valid configs)."""
    return max(4, min(10, n_valid // 16))


def startup_configs(plan: StudyPlan, sampler: str, seed: int | None) -> list[dict]:
    """What a new study's queue starts with, after the default config: for tpe / gp, random
    *valid* configs for the startup phase (the sampler's own random startup would mostly propose
    combinations the constraints forbid: 85% of the gemv product for a typical decode shape); for
    grid, every other valid config (seeded shuffle). Params only (the searched parameters)."""
    default = {k: plan.default_config.get(k) for k in plan.space.params}
    rest = [c for c in valid_params(plan) if c != default]
    random.Random(f"{seed}:{plan.study_name}").shuffle(rest)
    if sampler == "grid":
        return rest
    if sampler in ("tpe", "gp"):
        return rest[:max(0, n_startup(plan.n_valid) - 1)]
    return []


def valid_params(plan: StudyPlan) -> list[dict]:
    """Every valid config of the plan, as the searched parameters only."""
    return [{k: c[k] for k in plan.space.params} for c in map(json.loads, plan.valid_keys)]


def make_sampler(name: str, seed: int | None, n_valid: int, valid: list[dict] | None = None):
    """`valid`: the plan's valid configs (`valid_params`); --sampler grid draws only from them."""
    import optuna

    legacy = not hasattr(optuna.trial.Trial, "set_constraint")
    cfunc = {"constraints_func": _constraints_from_attrs} if legacy else {}
    if name == "tpe":
        # multivariate: block sizes and warps interact; constant_liar: parallel workers on one
        # study do not all propose the same point.
        return optuna.samplers.TPESampler(
            seed=seed, multivariate=True, constant_liar=True,
            n_startup_trials=n_startup(n_valid), warn_independent_sampling=False, **cfunc)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=n_startup(n_valid),
                                         warn_independent_sampling=False, **cfunc)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":  # every valid config is enqueued; see _queue_sampler
        return _queue_sampler(seed, valid or [])
    raise TunerError(f"unknown sampler {name!r}; expected one of {', '.join(SAMPLERS)}")


def _queue_sampler(seed: int | None, valid: list[dict]):
    """--sampler grid: every valid config is in the queue, so a trial is sampled only when the
    queue ran empty between the worker's look at the study and its trial (another worker popped
    the last config). Such a trial draws a random *valid* config, which the study already has
    (measured, or being measured): it is answered as a duplicate, with no GPU time. (A
    RandomSampler would draw each parameter on its own, often a combination the constraints
    forbid: a PRUNED trial that stands for no config.)"""
    import optuna

    class QueueSampler(optuna.samplers.RandomSampler):
        def __init__(self):
            super().__init__(seed=seed)
            self._draw = random.Random(seed)
            self._config: dict = {}

        def before_trial(self, study, trial):
            super().before_trial(study, trial)
            self._config = self._draw.choice(valid) if valid else {}

        def sample_independent(self, study, trial, param_name, param_distribution):
            if param_name in self._config:
                return self._config[param_name]
            return super().sample_independent(study, trial, param_name, param_distribution)

    return QueueSampler()


def check_sampler(name: str) -> None:
    if name == "cmaes":
        raise TunerError("--sampler cmaes does not fit: CMA-ES needs continuous or integer ranges "
                         "and every kernel parameter here is a list of choices (categorical); "
                         "use tpe, gp, random or grid")
    if name not in SAMPLERS:
        raise TunerError(f"unknown sampler {name!r}; expected one of {', '.join(SAMPLERS)}")


# ------------------------------------------------------------------------------ study state
@dataclass
class StudyState:
    """What a study's trials say about its progress (read from the storage)."""

    measured: int = 0  # trials that used the GPU (complete or failed, no duplicates)
    running: int = 0
    failed: int = 0
    infeasible: int = 0  # parity mismatches
    constraint: int = 0  # configs outside the space (never run)
    spent_s: float = 0.0  # GPU seconds: finished trials' durations + running trials so far
    known: dict = field(default_factory=dict)  # config key -> trial standing for its outcome
    best: Any = None  # best feasible COMPLETE trial
    waiting: int = 0
    in_flight: set = field(default_factory=set)  # config keys of RUNNING trials
    queued: set = field(default_factory=set)  # config keys of WAITING trials


def read_state(trials, plan: StudyPlan, now: float | None = None) -> StudyState:
    from optuna.trial import TrialState

    now = time.time() if now is None else now
    state = StudyState()
    deaths: dict[str, int] = {}
    for t in trials:
        params = t.params or t.system_attrs.get("fixed_params") or {}
        config = t.user_attrs.get("config") or (_full_config(plan.default_config, params)
                                                if params else None)
        key = config_key(config) if config else f"trial {t.number}"  # never ran: no config
        if t.state == TrialState.WAITING:
            state.waiting += 1
            if params:
                state.queued.add(key)
            continue
        if t.state == TrialState.RUNNING:
            state.running += 1
            if t.user_attrs.get("config"):
                state.in_flight.add(key)
            if t.datetime_start is not None:
                state.spent_s += max(0.0, now - t.datetime_start.timestamp())
            continue
        if t.datetime_start is not None and t.datetime_complete is not None:
            state.spent_s += (t.datetime_complete - t.datetime_start).total_seconds()
        duplicate = "duplicate_of" in t.user_attrs
        if t.state == TrialState.COMPLETE:
            state.measured += 0 if duplicate else 1
            if not _is_feasible(t):
                state.infeasible += 0 if duplicate else 1
            elif state.best is None or t.value < state.best.value:
                state.best = t
            state.known.setdefault(key, t)
        elif t.state == TrialState.PRUNED:
            state.constraint += 0 if duplicate else 1
            state.known.setdefault(key, t)
        elif t.state == TrialState.FAIL:
            if str(t.user_attrs.get("failure", "")).startswith(SKIPPED):
                continue
            if _is_death(t):
                deaths[key] = deaths.get(key, 0) + 1
                state.failed += 1
                state.measured += 1
                if deaths[key] >= MAX_DEATHS_PER_CONFIG:
                    state.known.setdefault(key, t)
            else:
                state.failed += 0 if duplicate else 1
                state.measured += 0 if duplicate else 1
                state.known.setdefault(key, t)
    return state


def study_done(state: StudyState, plan: StudyPlan, trials: int | None) -> str:
    """Why a study needs no more trials ('' while it does). Configs in flight count as tried, so
    that a second worker does not spin on a study whose last config is being measured."""
    if all(k in state.known or k in state.in_flight for k in plan.valid_keys):
        return "exhausted"
    if trials is not None and state.measured + state.running >= trials:
        return "trials"
    return ""


# ---------------------------------------------------------------------------- study creation
def prepare_studies(plans: list[StudyPlan], settings: SearchSettings) -> None:
    """Create (or load) every study; set its attributes; enqueue the default config first, then
    `startup_configs` (the valid list for --sampler grid); fail stale trials."""
    import optuna
    from optuna.storages import fail_stale_trials

    storage = make_storage(settings.storage, settings.heartbeat_s, settings.grace_s)
    for plan in plans:
        study = optuna.create_study(study_name=plan.study_name, storage=storage,
                                    direction="minimize", load_if_exists=True)
        attrs = study.user_attrs
        wanted = {"family": plan.family, "shape": plan.shape, "shape_key": plan.shape_key,
                  "device": plan.device_key, "backend": plan.backend,
                  "default_config": plan.default_config, "parity_mode": plan.parity_mode,
                  "weight_us_per_token": plan.weight, "n_valid_configs": plan.n_valid,
                  "calls_per_step": plan.attrs.get("calls_per_step"),
                  "step_us": plan.attrs.get("step_us"), "hit_rate": plan.attrs.get("hit_rate"),
                  "phase": plan.attrs.get("phase"), "source": plan.attrs.get("source")}
        for name, value in wanted.items():
            if attrs.get(name) != value:
                study.set_user_attr(name, _plain(value))
        fail_stale_trials(study)
        trials = study.get_trials(deepcopy=False)
        fail_orphans(study, trials, settings.grace_s)
        if trials:
            continue  # resuming: the queue is already in the storage
        default_params = {k: plan.default_config[k] for k in plan.space.params
                          if k in plan.default_config}
        default_ok = (len(default_params) == len(plan.space.params)
                      and all(v in plan.space.params[k] for k, v in default_params.items()))
        if default_ok:
            study.enqueue_trial(default_params, user_attrs={"role": "default"})
        role = "grid" if settings.sampler == "grid" else "startup"
        for params in startup_configs(plan, settings.sampler, settings.seed):
            study.enqueue_trial(params, user_attrs={"role": role})


def fail_orphans(study, trials, grace_s: float | None) -> int:
    """Fail RUNNING trials whose worker died between creating the trial and starting its
    heartbeat (Optuna's heartbeat check never sees a trial without a heartbeat): no config
    recorded and older than the grace period. A queued config goes back into the queue."""
    import datetime

    import optuna
    from optuna.trial import TrialState

    now = datetime.datetime.now()
    limit = datetime.timedelta(seconds=float(grace_s or 60))
    failed = 0
    for t in trials:
        if (t.state != TrialState.RUNNING or "config" in t.user_attrs or t.datetime_start is None
                or now - t.datetime_start < limit):
            continue
        try:
            study._storage.set_trial_user_attr(t._trial_id, "failure",
                                               "worker died: before the trial started")
            if not study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
        failed += 1
        fixed = t.system_attrs.get("fixed_params")
        if fixed:
            study.enqueue_trial(dict(fixed), user_attrs={"retry_of": t.number})
    return failed


def _plain(value):
    """Plain JSON for optuna-dashboard: numpy scalars become Python numbers, NaN/inf None."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


# -------------------------------------------------------------------------------- the worker
class TrialFailed(Exception):
    """Raised inside the Optuna objective to end the trial as FAIL (caught by optimize)."""


@dataclass
class _WorkerArgs:
    slot: int
    gpu: str | None
    plans: list[StudyPlan]
    settings: SearchSettings
    deadline: float | None
    seed: int | None


def _pick(states: dict[str, StudyState], plans: list[StudyPlan], settings: SearchSettings,
          slot: int) -> StudyPlan | None:
    """The unfinished study with the least GPU time per unit of weight (weighted fair share)."""
    open_plans = [p for p in plans if not study_done(states[p.study_name], p, settings.trials)]
    if not open_plans:
        return None
    n = len(plans)
    order = {p.study_name: i for i, p in enumerate(plans)}
    return min(open_plans, key=lambda p: (states[p.study_name].spent_s / max(p.weight, 1e-12),
                                          (order[p.study_name] - slot) % n))


def _worker_main(args: _WorkerArgs, conn, stop_event) -> None:
    """Entry point of a worker process (spawned)."""
    if args.gpu is not None:
        var = "HIP_VISIBLE_DEVICES" if args.plans and args.plans[0].backend in ("hip", "dcu") \
            else "CUDA_VISIBLE_DEVICES"
        os.environ[var] = str(args.gpu)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    import optuna

    settings = args.settings
    storage = make_storage(settings.storage, settings.heartbeat_s, settings.grace_s)
    factory = resolve_factory(settings.objective)
    objectives: dict[str, Objective] = {}
    studies: dict[str, Any] = {}
    streak: dict[str, int] = {}  # trials in a row that the sampler spent on known / invalid configs
    rng = random.Random(args.seed)
    plan, slice_end = None, 0.0
    parent = os.getppid()
    while not stop_event.is_set() and (args.deadline is None or time.time() < args.deadline):
        if os.getppid() != parent:
            break  # the search was killed: do not go on unsupervised
        for p in args.plans:
            if p.study_name not in studies:
                studies[p.study_name] = optuna.load_study(
                    study_name=p.study_name, storage=storage,
                    sampler=make_sampler(settings.sampler, args.seed, p.n_valid, valid_params(p)))
        state = None
        if plan is not None and time.time() < slice_end:
            # within a time slice: stay on this study and read only its trials
            state = read_state(studies[plan.study_name].get_trials(deepcopy=False), plan)
            if study_done(state, plan, settings.trials):
                plan = None
        if plan is None or state is None:
            states = {}
            for p in args.plans:
                trials = studies[p.study_name].get_trials(deepcopy=False)
                if fail_orphans(studies[p.study_name], trials, settings.grace_s):
                    trials = studies[p.study_name].get_trials(deepcopy=False)
                states[p.study_name] = read_state(trials, p)
            plan = _pick(states, args.plans, settings, args.slot)
            if plan is None:
                break
            state = states[plan.study_name]
            slice_end = time.time() + _slice_s(settings, len(args.plans))
        study = studies[plan.study_name]
        if plan.study_name not in objectives:
            objectives.clear()  # one shape's inputs on the GPU at a time
            objectives[plan.study_name] = factory(plan)
        objective = objectives[plan.study_name]
        if "baseline_us" not in study.user_attrs:
            conn.send(("baseline", args.slot, plan.study_name, time.time()))
            try:
                study.set_user_attr("baseline_us", float(objective.baseline_us()))
            except Exception as exc:  # noqa: BLE001 - the search goes on without a baseline
                study.set_user_attr("baseline_us", None)
                study.set_user_attr("baseline_error", f"{type(exc).__name__}: {exc}"[:500])
        outcome: dict = {}
        try:
            study.optimize(lambda trial: _run_trial(trial, plan, state, objective, conn, args.slot,
                                                    outcome, settings.trials),
                           n_trials=1, catch=(TrialFailed,), gc_after_trial=False)
        except (ValueError, optuna.exceptions.UpdateFinishedTrialError) as exc:
            # Two workers popped the same enqueued trial (a race Optuna's RDB storage leaves open
            # without row locks); the second one's result cannot be told. Go on.
            if "Cannot tell" not in str(exc) and not isinstance(exc, optuna.exceptions.UpdateFinishedTrialError):
                raise
            outcome["what"] = "duplicate"
        best = state.best.value if state.best is not None else None
        if outcome.get("value") is not None and (best is None or outcome["value"] < best):
            best = outcome["value"]
        if outcome.get("what") in ("duplicate", "constraint", "skipped"):
            streak[plan.study_name] = streak.get(plan.study_name, 0) + 1
        else:
            streak[plan.study_name] = 0
        if streak[plan.study_name] >= MAX_SAMPLER_REPEATS:
            # the sampler keeps proposing what it has seen: queue a config nobody tried yet (the
            # state may be old by now: if another worker took it meanwhile, the trial is answered
            # as a duplicate, see _taken)
            fresh = [k for k in plan.valid_keys
                     if k not in state.known and k not in state.in_flight and k not in state.queued]
            if fresh:
                config = json.loads(rng.choice(fresh))
                study.enqueue_trial({k: config[k] for k in plan.space.params},
                                    user_attrs={"role": "unexplored"})
            streak[plan.study_name] = 0
        conn.send(("done", args.slot, plan.study_name, outcome.get("number"), outcome.get("what", ""),
                   best, time.time()))
        if outcome.get("fatal"):
            conn.close()
            os._exit(EXIT_CONTEXT_LOST)  # the GPU context is corrupt: the parent starts a fresh worker
    conn.send(("exit", args.slot, "", None, "", None, time.time()))
    conn.close()


def _slice_s(settings: SearchSettings, n_plans: int) -> float:
    """How long a worker stays on the study it picked before it compares all studies again
    (reading every study's trials costs a few ms per trial; a slice keeps that off each trial)."""
    if settings.slice_s is not None:
        return settings.slice_s
    if settings.timeout_s:
        return max(0.0, min(60.0, settings.timeout_s / (4 * max(1, n_plans))))
    return 60.0


def _was_enqueued(trial) -> bool:
    """Whether the trial runs a queued config (Optuna keeps it as the 'fixed_params' system
    attribute; Optuna 5's Trial no longer exposes system_attrs, its frozen copy does)."""
    frozen = trial.study._storage.get_trial(trial._trial_id)
    return "fixed_params" in frozen.system_attrs


def _check_trial_cap(trial, plan: StudyPlan, trials: int, params: dict, outcome: dict) -> None:
    """Near --trials, workers that picked the study at the same moment could overshoot: the
    trials that started later step back (FAIL 'skipped', not counted; a queued config goes back
    into the queue)."""
    from optuna.trial import TrialState

    others = trial.study.get_trials(deepcopy=False)
    state = read_state([t for t in others if t.number != trial.number], plan)
    mine = (trial.datetime_start, trial.number)
    earlier_running = sum(1 for t in others
                          if t.state == TrialState.RUNNING and t.number != trial.number
                          and t.datetime_start is not None and (t.datetime_start, t.number) < mine)
    if state.measured + earlier_running < trials:
        return
    if _was_enqueued(trial):
        trial.study.enqueue_trial(params, user_attrs={k: v for k, v in trial.user_attrs.items()
                                                      if k in ("role", "retry_of")})
    trial.set_user_attr("failure", SKIPPED + " --trials reached by other workers")
    outcome["what"] = "skipped"
    raise TrialFailed("skipped")


def _run_trial(trial, plan: StudyPlan, state: StudyState, objective: Objective, conn, slot: int,
               outcome: dict, trials: int | None = None) -> float:
    """The Optuna objective of one trial (runs inside study.optimize). `state`: the study as read
    just before this trial (for the --trials cap). Whether the config is taken is read again once
    the trial has written it (`_taken`): the other workers moved on since `state` was read."""
    from optuna.trial import TrialState

    params = {name: trial.suggest_categorical(name, list(choices))
              for name, choices in plan.space.params.items()}
    config = _full_config(plan.default_config, params)
    trial.set_user_attr("config", _plain(config))
    outcome["number"] = trial.number
    conn.send(("start", slot, plan.study_name, trial.number, trial._trial_id, time.time()))
    if not plan.space.allows(params, plan.shape):
        trial.set_user_attr("failure", "constraint: outside the search space's constraints")
        _set_constraints(trial, space=1.0, parity=0.0)
        outcome["what"] = "constraint"
        import optuna

        raise optuna.TrialPruned("constraint")
    key = config_key(config)
    prior = _taken(trial, plan, key)
    if prior is not None and prior.state == TrialState.RUNNING:
        return _step_aside(trial, prior, outcome)
    if prior is not None:
        return _replay(trial, prior, outcome)
    if trials is not None and state.measured + state.running + 16 >= trials:
        _check_trial_cap(trial, plan, trials, params, outcome)
    try:
        result = objective.evaluate(config)
    except Exception as exc:  # noqa: BLE001 - a candidate's error is data, not the end of the search
        text = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        result = TrialResult(failure=f"error: {text}", fatal=_context_lost(str(exc)))
    return _record(trial, result, outcome, plan.parity_mode)


def _record(trial, result: TrialResult, outcome: dict, parity_mode: str = "exact") -> float:
    outcome["fatal"] = bool(result.fatal)
    if result.failure:
        trial.set_user_attr("failure", str(result.failure))
        outcome["what"] = "failed"
        raise TrialFailed(result.failure)
    if result.median_us is None or not math.isfinite(result.median_us):
        trial.set_user_attr("failure", "error: the objective gave no finite time")
        outcome["what"] = "failed"
        raise TrialFailed("no time")
    trial.set_user_attr("median_us", float(result.median_us))
    trial.set_user_attr("noise_pct", None if result.noise_pct is None else float(result.noise_pct))
    trial.set_user_attr("output_hash", result.output_hash)
    trial.set_user_attr("parity", result.parity)
    trial.set_user_attr("rel_err", None if result.rel_err is None or not math.isfinite(result.rel_err)
                        else float(result.rel_err))
    infeasible = not parity_ok(result.parity, parity_mode)
    _set_constraints(trial, space=0.0, parity=1.0 if infeasible else 0.0)
    outcome["what"] = "mismatch" if infeasible else "ok"
    outcome["value"] = None if infeasible else float(result.median_us)
    if trial.user_attrs.get("role") == "default":
        trial.study.set_user_attr("default_us", float(result.median_us))
    return float(result.median_us)


def _taken(trial, plan: StudyPlan, key: str):
    """The trial that already has this config, read from the storage now: the one whose outcome
    stands for it (finished), or one measuring it right now that started before this trial
    (RUNNING); None when this trial is the one to measure it.

    Every trial writes its `config` before it calls this, so of two trials that take the same
    config at the same moment the later one sees the earlier one and steps aside. An earlier
    trial that has not written its config yet (its sampler is still choosing) might be about to
    take this one: wait for it, at most CLAIM_WAIT_S (older ones are orphans, see fail_orphans).
    "Earlier" is (datetime_start, number), as in _check_trial_cap; with PostgreSQL and several
    hosts it is only as good as their clocks."""
    from optuna.trial import TrialState

    mine = (trial.datetime_start, trial.number)
    while True:
        others = [t for t in trial.study.get_trials(deepcopy=False) if t.number != trial.number]
        known = read_state(others, plan).known.get(key)
        if known is not None:
            return known
        earlier = [t for t in others if t.state == TrialState.RUNNING
                   and t.datetime_start is not None and (t.datetime_start, t.number) < mine]
        for t in earlier:
            if t.user_attrs.get("config") and config_key(t.user_attrs["config"]) == key:
                return t
        now = time.time()
        if not any("config" not in t.user_attrs and now - t.datetime_start.timestamp() < CLAIM_WAIT_S
                   for t in earlier):
            return None
        time.sleep(0.05)


def _step_aside(trial, running, outcome: dict) -> float:
    """The config is being measured by an earlier trial right now: no GPU time here. FAIL
    'skipped' (not counted, TPE ignores it) with `duplicate_of`; if the earlier trial's worker
    dies, that trial is retried, so the config is not lost."""
    trial.set_user_attr("duplicate_of", running.number)
    trial.set_user_attr("failure", f"{SKIPPED} trial {running.number} is measuring this config")
    outcome["what"] = "duplicate"
    raise TrialFailed("skipped")


def _replay(trial, prior, outcome: dict) -> float:
    """Answer a config the study already has from its earlier trial; no GPU time."""
    import optuna
    from optuna.trial import TrialState

    trial.set_user_attr("duplicate_of", prior.number)
    for name in ("median_us", "noise_pct", "output_hash", "parity", "rel_err", "failure"):
        if name in prior.user_attrs:
            trial.set_user_attr(name, prior.user_attrs[name])
    space_c, parity_c = _constraints_from_attrs(prior)
    constraints = getattr(prior, "constraints", None) or {}
    _set_constraints(trial, space=constraints.get("space", space_c), parity=constraints.get("parity", parity_c))
    outcome["what"] = "duplicate"
    if prior.state == TrialState.COMPLETE:
        return float(prior.value)
    if prior.state == TrialState.PRUNED:
        raise optuna.TrialPruned("duplicate")
    raise TrialFailed(str(prior.user_attrs.get("failure") or "failed before"))


# -------------------------------------------------------------------------------- supervisor
@dataclass
class _Slot:
    index: int
    gpu: str | None
    process: Any = None
    conn: Any = None
    current: tuple | None = None  # (study_name, trial_number, trial_id, started_at) or baseline
    deaths_in_a_row: int = 0
    finished: bool = False
    trials: int = 0
    restarts: int = 0


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


@dataclass
class SearchSummary:
    shapes: list[ShapeResult]
    skipped: list[tuple[str, str]]
    interrupted: bool
    wall_s: float
    worker_restarts: int


def visible_gpus() -> list[str]:
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        text = os.environ.get(var)
        if text:
            return [g.strip() for g in text.split(",") if g.strip()]
    try:
        import torch

        count = torch.cuda.device_count()
    except Exception:  # noqa: BLE001
        count = 0
    return [str(i) for i in range(count)]


def run_search(plans: list[StudyPlan], settings: SearchSettings,
               skipped: list[tuple[str, str]] | None = None) -> SearchSummary:
    """Search every plan with one worker process per GPU; returns (and prints) the summary."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    check_sampler(settings.sampler)
    if not plans:
        raise TunerError("nothing to search: every shape was skipped")
    if settings.trials is None and settings.timeout_s is None:
        settings = dataclasses.replace(settings, trials=DEFAULT_TRIALS)
    gpus = list(settings.gpus) if settings.gpus else (visible_gpus() if settings.objective is None else [])
    if not gpus:
        if settings.objective is None:
            raise TunerError("no GPU visible: run on a GPU host or give --gpus 0,1")
        gpus = ["0"]
    started = time.time()
    deadline = started + settings.timeout_s if settings.timeout_s else None
    prepare_studies(plans, settings)

    ctx = mp.get_context("spawn")
    stop_event = ctx.Event()
    slots = [_Slot(i, g) for i, g in enumerate(gpus)]
    interrupts = {"count": 0}
    bars = _Bars(slots, settings.progress)
    storage = make_storage(settings.storage, settings.heartbeat_s, settings.grace_s)

    def start(slot: _Slot) -> None:
        reader, writer = ctx.Pipe(duplex=False)
        args = _WorkerArgs(slot.index, slot.gpu, plans, settings, deadline,
                           None if settings.seed is None else settings.seed + 1000 * slot.index + slot.restarts)
        slot.process = ctx.Process(target=_worker_main, args=(args, writer, stop_event),
                                   name=f"tuner-search-{slot.index}", daemon=True)
        slot.process.start()
        writer.close()
        slot.conn = reader
        slot.current = None

    def on_sigint(signum, frame):
        interrupts["count"] += 1
        stop_event.set()
        if interrupts["count"] == 1:
            info("tuner search: stopping after the trials in flight (Ctrl-C again to abort them)")

    previous = None
    try:
        previous = signal.signal(signal.SIGINT, on_sigint)
    except ValueError:  # not the main thread
        previous = None
    try:
        for slot in slots:
            start(slot)
        while not all(s.finished for s in slots):
            live = {s.conn: s for s in slots if not s.finished and s.conn is not None}
            for conn in wait(list(live), timeout=0.5):
                slot = live[conn]
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    conn.close()
                    slot.conn = None
                    continue
                _on_message(slot, message, bars)
            now = time.time()
            for slot in slots:
                if slot.finished:
                    continue
                hung = (slot.current is not None and now - slot.current[-1] > settings.trial_timeout_s)
                if interrupts["count"] >= 2 or hung:
                    slot.process.kill()
                    slot.process.join()
                if slot.process.is_alive():
                    if slot.conn is None:  # pipe closed: the worker is exiting
                        slot.process.join(timeout=5)
                    continue
                slot.process.join()
                _drain(slot, bars)
                code = slot.process.exitcode
                if code == 0:
                    slot.finished = True
                    continue
                if interrupts["count"] >= 2:
                    reason = "interrupted: Ctrl-C twice"
                elif hung:
                    reason = (f"timeout: no result after {settings.trial_timeout_s:.0f}s; "
                              f"worker killed")
                elif code == EXIT_CONTEXT_LOST:
                    reason = ""  # the worker recorded the trial itself
                else:
                    reason = f"worker died ({_exit_text(code)})"
                if reason:
                    _fail_in_flight(storage, slot, reason, retry=not hung)
                slot.deaths_in_a_row += 0 if code == EXIT_CONTEXT_LOST else 1
                stopping = stop_event.is_set() or (deadline is not None and now >= deadline)
                if stopping:
                    slot.finished = True
                elif slot.deaths_in_a_row > MAX_RESTARTS_IN_A_ROW:
                    warn(f"worker on GPU {slot.gpu} died {slot.deaths_in_a_row} times without "
                         f"finishing a trial; giving that GPU up")
                    slot.finished = True
                else:
                    slot.restarts += 1
                    bars.note(slot, f"restart ({reason or 'GPU context lost'})")
                    start(slot)
    finally:
        for slot in slots:
            if slot.process is not None and slot.process.is_alive():
                slot.process.kill()
                slot.process.join()
                _fail_in_flight(storage, slot, "interrupted: search stopped", retry=True)
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        bars.close()
    summary = summarize(plans, settings, skipped or [], interrupted=interrupts["count"] > 0,
                        wall_s=time.time() - started, restarts=sum(s.restarts for s in slots))
    return summary


def _exit_text(code: int | None) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def _on_message(slot: _Slot, message: tuple, bars: "_Bars") -> None:
    kind = message[0]
    if kind == "start":
        _, _, name, number, trial_id, at = message
        slot.current = (name, number, trial_id, at)
    elif kind == "baseline":
        _, _, name, at = message
        slot.current = (name, None, None, at)
        bars.note(slot, f"baseline {_short(name)}")
    elif kind == "done":
        _, _, name, number, what, best, _at = message
        slot.current = None
        slot.deaths_in_a_row = 0
        if what not in ("constraint", "duplicate", "skipped"):
            slot.trials += 1
            bars.done(slot, name, best)
    elif kind == "exit":
        slot.current = None


def _drain(slot: _Slot, bars: "_Bars") -> None:
    """Read what a finished worker left in its pipe."""
    if slot.conn is None:
        return
    try:
        while slot.conn.poll():
            _on_message(slot, slot.conn.recv(), bars)
    except (EOFError, OSError):
        pass
    slot.conn.close()
    slot.conn = None


def _fail_in_flight(storage, slot: _Slot, reason: str, retry: bool) -> None:
    """Mark the trial a dead worker was running FAIL with the reason; enqueue it again once."""
    import optuna
    from optuna.trial import TrialState

    if slot.current is None:
        return
    if slot.current[2] is None:  # the worker was measuring the baseline
        name = slot.current[0]
        slot.current = None
        study = optuna.load_study(study_name=name, storage=storage)
        study.set_user_attr("baseline_us", None)
        study.set_user_attr("baseline_error", reason)
        return
    name, number, trial_id, _ = slot.current
    slot.current = None
    try:
        frozen = storage.get_trial(trial_id)
        if frozen.state != TrialState.RUNNING:
            return
        storage.set_trial_user_attr(trial_id, "failure", reason)
        storage.set_trial_state_values(trial_id, TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        return
    if retry:
        study = optuna.load_study(study_name=name, storage=storage)
        _maybe_retry(study, storage.get_trial(trial_id))


def _short(name: str) -> str:
    return name.split(":", 2)[-1]


class _Bars:
    """One tqdm bar per worker: trials done, the shape it works on, the best µs of that shape."""

    def __init__(self, slots: list[_Slot], enabled: bool):
        self.bars = {}
        if not enabled:
            return
        from tqdm import tqdm

        for slot in slots:
            self.bars[slot.index] = tqdm(total=None, position=slot.index, unit="trial",
                                         desc=f"gpu {slot.gpu}", leave=True, dynamic_ncols=True,
                                         file=sys.stderr)

    def done(self, slot: _Slot, name: str, best: float | None) -> None:
        bar = self.bars.get(slot.index)
        if bar is not None:
            bar.update(1)
            best_text = f"{best:.2f}us" if best is not None else "-"
            bar.set_postfix_str(f"{_short(name)} best {best_text}")

    def note(self, slot: _Slot, text: str) -> None:
        bar = self.bars.get(slot.index)
        if bar is not None:
            bar.set_postfix_str(text)

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()


# ---------------------------------------------------------------------------------- summary
def summarize(plans: list[StudyPlan], settings: SearchSettings, skipped: list[tuple[str, str]],
              *, interrupted: bool = False, wall_s: float = 0.0, restarts: int = 0) -> SearchSummary:
    import optuna

    storage = make_storage(settings.storage, None, None)
    shapes = []
    for plan in plans:
        study = optuna.load_study(study_name=plan.study_name, storage=storage)
        trials = study.get_trials(deepcopy=False)
        state = read_state(trials, plan)
        status = study_done(state, plan, settings.trials) or (
            "stopped" if interrupted else "time" if settings.timeout_s else "incomplete")
        baseline = study.user_attrs.get("baseline_us")
        default_us = None
        for t in trials:
            if (t.user_attrs.get("role") == "default" and t.state.name == "COMPLETE"):
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
            best_trial=best.number if best is not None else None))
    return SearchSummary(shapes, list(skipped), interrupted, wall_s, restarts)


def format_summary(summary: SearchSummary) -> str:
    def num(v, fmt):
        return "-" if v is None else format(v, fmt)

    lines = []
    for key, reason in summary.skipped:
        lines.append(f"skipped {key}: {reason}")
    header = (f"{'shape':<40} {'us/tok':>7} {'trials':>6} {'fail':>4} {'infs':>4} "
              f"{'base us':>8} {'dflt us':>8} {'best us':>8} {'vs base':>7} {'vs dflt':>7}  "
              f"status     best config")
    lines.append(header)
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


# ----------------------------------------------------------------------------- the whole stage
def search(shapes_path: str | Path, family: str, *, device=None, storage: str | None = None,
           timeout_s: float | None = None, trials: int | None = None, gpus: list[str] | None = None,
           sampler: str = "tpe", threshold=None, seed: int = 0, parity_mode: str = "exact",
           trial_timeout_s: float = 600.0, objective_factory: ObjectiveFactory | str | None = None,
           progress: bool = True, heartbeat_s: int = 10, grace_s: int = 60,
           graph_captured: bool = False) -> SearchSummary:
    """`tuner search`: budget the shape table, then search every surviving shape.

    `device`: a DeviceProfile, a profile name/path (tuner.device.load_profile), or None (the only
    saved profile under artifacts/devices). `objective_factory` replaces the GPU objective: tests
    pass a cheap deterministic one through the same orchestration. `graph_captured` budgets
    against the GPU-busy step (as `tuner budget --graph-captured`).
    """
    from tuner import shapetable
    from tuner.device import choose_profile

    check_sampler(sampler)
    if parity_mode not in PARITY_MODES:
        raise TunerError(f"unknown parity mode {parity_mode!r}; expected {' or '.join(PARITY_MODES)}")
    if trials is not None and trials < 1:
        raise TunerError(f"--trials must be at least 1, got {trials}")
    if timeout_s is not None and timeout_s <= 0:
        raise TunerError("--timeout must be positive")
    table = shapetable.read(shapes_path)
    if hasattr(device, "backend"):
        profile = device
    else:
        profile, label = choose_profile(device, list(table["device"].dropna().unique()),
                                        gpu=objective_factory is None)
        info(f"device profile: {label}")
    plans, skipped = plan_studies(table, family, profile, threshold=threshold,
                                  parity_mode=parity_mode, source=str(shapes_path),
                                  graph_captured=graph_captured)
    for key, reason in skipped:
        info(f"skip {key}: {reason}")
    if not plans:
        raise TunerError(f"no {family} shape survives the budget: every shape was skipped "
                         f"(see the reasons above; lower --min-saving to search them anyway)")
    settings = SearchSettings(storage=storage or DEFAULT_STORAGE, sampler=sampler, trials=trials,
                              timeout_s=timeout_s, gpus=gpus, seed=seed,
                              trial_timeout_s=trial_timeout_s, heartbeat_s=heartbeat_s,
                              grace_s=grace_s, objective=objective_factory, progress=progress)
    if settings.objective is None:
        _check_gpu_stack(family)
    workers = len(gpus) if gpus else max(1, len(visible_gpus()))
    shares = share_time(plans, timeout_s * workers) if timeout_s else {}
    for plan in sorted(plans, key=lambda p: -p.weight):
        share = f", ~{shares[plan.study_name]:.0f} GPU-s" if shares else ""
        info(f"plan {plan.study_name}: {plan.weight:.3g} us/token headroom{share}, "
             f"{plan.n_valid} valid configs")
    return run_search(plans, settings, skipped)


def _check_gpu_stack(family: str) -> None:
    """Fail in the parent, with one line, before workers start, when the GPU path cannot work."""
    try:
        importlib.import_module("tuner.bench")
        importlib.import_module("tuner.parity")
        importlib.import_module(f"kernels.{family}")
    except ImportError as exc:
        raise TunerError(f"the GPU objective cannot load: {exc}") from None


def parse_gpus(text: str | None) -> list[str] | None:
    if text is None:
        return None
    gpus = [g.strip() for g in str(text).split(",") if g.strip()]
    if not gpus:
        raise TunerError(f"--gpus needs GPU ids like 0,1; got {text!r}")
    return gpus
