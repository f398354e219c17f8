"""Trial claims and retries: which trial measures a config, and what happens to one that did not.

The contract
------------
Every valid config of a study is measured once, by one trial, across all workers of all hosts
sharing the storage, and no config is lost to a worker that died. The storage is the only shared
state: every rule below reads the study's trials from it at the moment it decides, and every
trial that does not measure ends in a state that nothing counts (`read_state`).

A trial *claims* its config by writing it (user attr ``config``) and only then reads the study
again (`taken`); the view a worker read before its trial is stale by the time a sampler has
proposed. "Earlier" is (``datetime_start``, number); with several hosts it is as good as their
clocks. The seven rules, each implemented once, here:

1. **Queue seeding** (`seed_queue`): a new study's queue gets the default config first
   (``role: default``), then the family's known configs (``role: known``, tuner_kernels/candidates.py),
   then the sampler's startup configs (grid: every other valid config). Only the
   supervisor that created the study seeds it; another one waits for the ``queue_seeded`` study
   attr (while the queue keeps growing, or at most SEED_WAIT_S after it stopped growing: then
   the creator died, and it enqueues what is missing itself). Enqueued params that the
   study already holds are not enqueued again.
2. **Duplicate replay** (`replay`): the study has a finished trial standing for the config: the
   new trial copies its state, value, attrs and constraints with ``duplicate_of``; no GPU time,
   not counted.
3. **Step aside** (`step_aside`): an earlier trial is RUNNING with the config: FAIL
   ``skipped: trial N is measuring this config`` with ``duplicate_of``; not counted. An earlier
   RUNNING trial that has not written its config yet (its sampler is choosing) is waited for, at
   most CLAIM_WAIT_S. If the earlier trial's worker dies, rule 5 retries that trial.
4. **Trials cap** (`check_trial_cap`): near ``--trials``, a trial for which the measured trials
   plus the earlier RUNNING ones already reach the cap steps back: FAIL
   ``skipped: --trials reached by other workers``, not counted; a queued config goes back into the
   queue with its role.
5. **Retry of dead workers' trials** (`fail_trial`, `retry_stale_trial`, `maybe_retry`): a trial
   whose worker died (crash, kill -9, Ctrl-C twice: the supervisor records ``worker died (...)``
   or ``interrupted: ...``) or vanished with its host (heartbeat older than the grace period:
   Optuna fails it, no reason recorded) is FAIL, not counted, and its config is enqueued once
   more (``retry_of``), unless that config already killed MAX_DEATHS_PER_CONFIG workers (then
   that FAIL stands for the config and counts). A hang past ``--trial-timeout`` is FAIL
   ``timeout: ...`` and not retried: it costs a whole timeout. A measurement is stored when its
   trial is told: a worker killed after the objective returned but before the tell (a few
   storage writes) loses it, and the retry measures that config again; this is the one way a
   config is measured twice. Another trial may measure the config in the moment between the
   FAIL and the retry's enqueue (a random draw of an emptied grid queue): the study is then done
   with the retry still queued, and a later run answers it as a duplicate (rule 2).
6. **Orphans** (`fail_orphans`): a RUNNING trial with no config, older than the grace period, is
   a worker that died between creating the trial and its first heartbeat (Optuna's heartbeat
   check never sees it): FAIL ``worker died: before the trial started``, not counted, its queued
   config enqueued again (``retry_of``, so a retry may itself be retried this way). Each trial is
   read again right before it is failed. A live worker slower than the grace period between
   creating its trial and writing the config (a loaded host) is failed the same way; its config
   write then fails, and it measures nothing.
7. **Unexplored** (`enqueue_unexplored`): after MAX_SAMPLER_REPEATS trials in a row of one
   worker on one study that spent no GPU time (duplicates, constraint violations, step-asides),
   the worker enqueues a valid config that no trial has, measures or queues
   (``role: unexplored``); if another worker takes it meanwhile, rule 2 or 3 answers.

What counts: `read_state`. A study is done (`study_done`) when every valid config has a trial
standing for it (``exhausted``) or ``--trials`` measured trials exist (``trials``); configs in
flight count as tried for choosing what to start, not for deciding the study is finished.
"""

from __future__ import annotations

import datetime
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

from .planning import StudyPlan, config_key, full_config, known_params
from .samplers import constraints_from_attrs, is_feasible, set_constraints, startup_configs

__all__ = ["CLAIM_WAIT_S", "Ending", "MAX_DEATHS_PER_CONFIG", "MAX_SAMPLER_REPEATS",
           "NO_GPU_KINDS", "ORPHAN", "QUEUE_SEEDED", "RETRYABLE_PREFIXES", "SEED_WAIT_S", "SKIPPED",
           "StudyState", "check_trial_cap", "enqueue_unexplored", "fail_orphans", "queued_configs", "fail_trial",
           "is_death", "maybe_retry", "read_state", "replay", "retry_stale_trial", "seed_queue",
           "step_aside", "study_done", "taken", "trial_params", "was_enqueued"]

SKIPPED = "skipped:"  # failure prefix of a trial that stepped back before running (not counted)
RETRYABLE_PREFIXES = ("worker died", "interrupted")
MAX_DEATHS_PER_CONFIG = 2  # a config that killed its worker this often is failed for good
MAX_SAMPLER_REPEATS = 20  # after this many trials in a row without GPU work, queue a fresh config
CLAIM_WAIT_S = 10.0  # a trial waits at most this long for an earlier trial to write its config
SEED_WAIT_S = 10.0  # a supervisor waits at most this long for another one to seed a new study
ORPHAN = "worker died: before the trial started"  # rule 6's failure reason (not counted)
QUEUE_SEEDED = "queue_seeded"  # study user attr: the queue has its default and startup configs
NO_GPU_KINDS = ("constraint", "duplicate", "skipped", "lost")


@dataclass(frozen=True)
class Ending:
    """How a trial ends: what to tell Optuna and what it was.

    kind: ``ok`` (feasible, measured), ``mismatch`` (measured, parity infeasible), ``failed``
    (the candidate did not run), ``constraint`` (outside the space), ``duplicate`` (replayed),
    ``skipped`` (stepped aside or back), ``lost`` (finished by someone else meanwhile)."""

    state: str  # "COMPLETE", "PRUNED" or "FAIL"
    kind: str
    value: float | None = None  # told with COMPLETE
    fatal: bool = False  # the GPU context is lost: the worker exits after this trial

    @property
    def used_gpu(self) -> bool:
        return self.kind not in NO_GPU_KINDS


# ----------------------------------------------------------------------------- reading a study
def trial_params(trial) -> dict:
    """The searched parameters of a trial: suggested, or fixed by the queue before it started."""
    return dict(trial.params or trial.system_attrs.get("fixed_params") or {})


def is_death(trial) -> bool:
    """A FAIL trial whose worker died (or vanished: no reason recorded) rather than a candidate
    that failed in a living worker."""
    reason = trial.user_attrs.get("failure")
    return reason is None or (str(reason).startswith(RETRYABLE_PREFIXES) and reason != ORPHAN)


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
    failures: dict = field(default_factory=dict)  # failure reason -> count (measured trials)


def read_state(trials, plan: StudyPlan, now: float | None = None) -> StudyState:
    from optuna.trial import TrialState

    now = time.time() if now is None else now
    state = StudyState()
    deaths: dict[str, int] = {}
    for t in trials:
        params = trial_params(t)
        config = t.user_attrs.get("config") or (full_config(plan.default_config, params)
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
            if not is_feasible(t):
                state.infeasible += 0 if duplicate else 1
            elif state.best is None or t.value < state.best.value:
                state.best = t
            state.known.setdefault(key, t)
        elif t.state == TrialState.PRUNED:
            state.constraint += 0 if duplicate else 1
            state.known.setdefault(key, t)
        elif t.state == TrialState.FAIL:
            reason = str(t.user_attrs.get("failure", ""))
            if reason.startswith(SKIPPED) or reason == ORPHAN or duplicate:
                continue  # no GPU time: stepped aside or back, never started, or replayed
            if is_death(t):
                deaths[key] = deaths.get(key, 0) + 1
                if deaths[key] < MAX_DEATHS_PER_CONFIG:
                    continue  # retried (rule 5): the retry is the measurement that counts
            state.known.setdefault(key, t)
            state.failed += 1
            state.measured += 1
            reason = reason or "worker lost (heartbeat stale)"
            state.failures[reason] = state.failures.get(reason, 0) + 1
    return state


def study_done(state: StudyState, plan: StudyPlan, trials: int | None, *,
               in_flight_counts: bool = True) -> str:
    """Why a study needs no more trials ('' while it does). With `in_flight_counts`, configs
    being measured count as tried (nothing is left to *start*: a second worker does not spin on
    the last config); without it, the study is finished only when those trials have ended."""
    in_flight = state.in_flight if in_flight_counts else set()
    if all(k in state.known or k in in_flight for k in plan.valid_keys):
        return "exhausted"
    running = state.running if in_flight_counts else 0
    if trials is not None and state.measured + running >= trials:
        return "trials"
    return ""


# ---------------------------------------------------------------------- 1. queue seeding
def seed_queue(study, plan: StudyPlan, sampler: str, seed: int | None, *, created: bool,
               wait_s: float = SEED_WAIT_S) -> int:
    """Rule 1: enqueue the default config and the startup configs once; returns how many."""
    from optuna.trial import TrialState

    storage = study._storage
    if study.user_attrs.get(QUEUE_SEEDED):
        return 0
    deadline, seen = time.time() + (0.0 if created else wait_s), 0
    while time.time() < deadline:  # another supervisor created the study and is seeding it
        if storage.get_study_user_attrs(study._study_id).get(QUEUE_SEEDED):
            return 0
        trials = study.get_trials(deepcopy=False)
        if any(t.state != TrialState.WAITING for t in trials):
            break  # a study that ran trials before this rule existed: it was seeded then
        if len(trials) > seen:  # the creator is still enqueuing: give it time
            deadline, seen = time.time() + wait_s, len(trials)
        time.sleep(0.2)
    present = {config_key(trial_params(t)) for t in study.get_trials(deepcopy=False)
               if trial_params(t)}
    queue = []
    default = {k: plan.default_config[k] for k in plan.space.params if k in plan.default_config}
    if (len(default) == len(plan.space.params)
            and all(v in plan.space.params[k] for k, v in default.items())):
        queue.append((default, "default"))
    queue += [(params, "known") for params in known_params(plan)]
    role = "grid" if sampler == "grid" else "startup"
    queue += [(params, role) for params in startup_configs(plan, sampler, seed)]
    added = 0
    for params, role in queue:
        if config_key(params) not in present:
            study.enqueue_trial(params, user_attrs={"role": role})
            added += 1
    study.set_user_attr(QUEUE_SEEDED, True)
    return added


def queued_configs(study, plan: StudyPlan) -> list[dict]:
    """The full configs of the study's WAITING (queued) trials, in queue order: what its workers
    measure next (a worker compiles them ahead, tuner.precompile)."""
    from optuna.trial import TrialState

    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        params = t.system_attrs.get("fixed_params") or {}
        if params:
            out.append(full_config(plan.default_config, dict(params)))
    return out


# ------------------------------------------------------------- 2, 3. replay and step aside
def taken(trial, plan: StudyPlan, key: str):
    """The trial that already has this config, read from the storage now: the one whose outcome
    stands for it (finished), or one measuring it right now that started before this trial
    (RUNNING); None when this trial is the one to measure it. Called after the trial wrote its
    config, so of two trials taking a config at the same moment the later one sees the earlier.
    Raises UpdateFinishedTrialError when this trial itself is being failed meanwhile (rule 6 on a
    slow worker, or rule 5): it must not measure, its retry will."""
    import optuna
    from optuna.trial import TrialState

    mine = (trial.datetime_start, trial.number)
    while True:
        trials = trial.study.get_trials(deepcopy=False)
        me = next((t for t in trials if t.number == trial.number), None)
        if me is not None and (me.state != TrialState.RUNNING or "failure" in me.user_attrs):
            raise optuna.exceptions.UpdateFinishedTrialError(
                f"trial {trial.number} was failed while it claimed its config")
        others = [t for t in trials if t.number != trial.number]
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


def replay(trial, prior) -> Ending:
    """Rule 2: answer a config the study already has from its earlier trial; no GPU time."""
    from optuna.trial import TrialState

    trial.set_user_attr("duplicate_of", prior.number)
    from ..parity import FACT_FIELDS

    for name in ("median_us", "noise_pct", "parity", "failure", *FACT_FIELDS):
        if name in prior.user_attrs:
            trial.set_user_attr(name, prior.user_attrs[name])
    space_c, parity_c = constraints_from_attrs(prior)
    constraints = getattr(prior, "constraints", None) or {}
    set_constraints(trial, space=constraints.get("space", space_c),
                    parity=constraints.get("parity", parity_c))
    if prior.state == TrialState.COMPLETE:
        return Ending("COMPLETE", "duplicate", value=float(prior.value))
    if prior.state == TrialState.PRUNED:
        return Ending("PRUNED", "duplicate")
    if "failure" not in prior.user_attrs:
        trial.set_user_attr("failure", "failed before")
    return Ending("FAIL", "duplicate")


def step_aside(trial, running) -> Ending:
    """Rule 3: an earlier trial is measuring this config right now: no GPU time here."""
    trial.set_user_attr("duplicate_of", running.number)
    trial.set_user_attr("failure", f"{SKIPPED} trial {running.number} is measuring this config")
    return Ending("FAIL", "skipped")


# ----------------------------------------------------------------------------- 4. the cap
def was_enqueued(trial) -> bool:
    """Whether the trial runs a queued config (Optuna keeps it as the 'fixed_params' system
    attribute; Optuna 5's Trial no longer exposes system_attrs, its stored copy does)."""
    frozen = trial.study._storage.get_trial(trial._trial_id)
    return "fixed_params" in frozen.system_attrs


def check_trial_cap(trial, plan: StudyPlan, trials: int, params: dict) -> Ending | None:
    """Rule 4: None when this trial may measure; else it steps back (queued config requeued)."""
    from optuna.trial import TrialState

    others = trial.study.get_trials(deepcopy=False)
    state = read_state([t for t in others if t.number != trial.number], plan)
    mine = (trial.datetime_start, trial.number)
    earlier_running = sum(1 for t in others
                          if t.state == TrialState.RUNNING and t.number != trial.number
                          and t.datetime_start is not None and (t.datetime_start, t.number) < mine)
    if state.measured + earlier_running < trials:
        return None
    if was_enqueued(trial):
        trial.study.enqueue_trial(params, user_attrs={k: v for k, v in trial.user_attrs.items()
                                                      if k in ("role", "retry_of")})
    trial.set_user_attr("failure", SKIPPED + " --trials reached by other workers")
    return Ending("FAIL", "skipped")


# ------------------------------------------------------------------ 5. dead workers' trials
def maybe_retry(study, trial) -> bool:
    """Enqueue a dead worker's trial once more, unless its config killed workers too often."""
    from optuna.trial import TrialState

    params = trial_params(trial)
    if not params:
        return False  # died before it had a config: nothing to retry
    deaths = sum(1 for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
                 if trial_params(t) == params and is_death(t))
    if deaths >= MAX_DEATHS_PER_CONFIG:
        return False
    study.enqueue_trial(params, user_attrs={"retry_of": trial.number})
    return True


def retry_stale_trial(study, trial) -> None:
    """Optuna's heartbeat callback: a trial whose worker vanished (kill -9, host crash) was
    failed by the stale-heartbeat check; retry it."""
    maybe_retry(study, trial)


def fail_trial(study, trial_id: int, reason: str, *, retry: bool) -> bool:
    """The one place a trial whose worker died is recorded: FAIL with `reason` (if it is still
    RUNNING), then retried once when `retry`. False when it had already finished."""
    import optuna
    from optuna.trial import TrialState

    storage = study._storage
    try:
        if storage.get_trial(trial_id).state != TrialState.RUNNING:
            return False
        storage.set_trial_user_attr(trial_id, "failure", reason)
        storage.set_trial_state_values(trial_id, TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        return False
    if retry:
        maybe_retry(study, storage.get_trial(trial_id))
    return True


# ------------------------------------------------------------------------------ 6. orphans
def fail_orphans(study, trials, grace_s: float | None) -> int:
    """Rule 6: fail RUNNING trials without a config older than the grace period (each read again
    from the storage right before it is failed); a queued config goes back into the queue, with
    ``retry_of`` this trial. Returns how many were failed. A live worker slower than the grace
    period between asking its trial and writing its config is failed too: its config write then
    raises UpdateFinishedTrialError and it measures nothing (`run_trial`: "lost")."""
    import optuna
    from optuna.trial import TrialState

    limit = datetime.timedelta(seconds=float(grace_s or 60))

    def orphan(t) -> bool:
        return (t.state == TrialState.RUNNING and "config" not in t.user_attrs
                and t.datetime_start is not None
                and datetime.datetime.now() - t.datetime_start >= limit)

    failed = 0
    for t in trials:
        if not orphan(t):
            continue
        # `trials` may be seconds old on a loaded host: a slow but live worker may have claimed
        # its config since; read the trial again right before failing it
        t = study._storage.get_trial(t._trial_id)
        if not orphan(t):
            continue
        try:
            study._storage.set_trial_user_attr(t._trial_id, "failure", ORPHAN)
            study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
        failed += 1
        fixed = t.system_attrs.get("fixed_params")
        if fixed:
            study.enqueue_trial(dict(fixed), user_attrs={"retry_of": t.number})
    return failed


# ----------------------------------------------------------------------------- 7. unexplored
def enqueue_unexplored(study, plan: StudyPlan, state: StudyState, rng: random.Random) -> bool:
    """Rule 7: queue a valid config no trial has, measures or queues (per `state`)."""
    fresh = [k for k in plan.valid_keys
             if k not in state.known and k not in state.in_flight and k not in state.queued]
    if not fresh:
        return False
    config = json.loads(rng.choice(fresh))
    study.enqueue_trial({k: config[k] for k in plan.space.params}, user_attrs={"role": "unexplored"})
    return True
