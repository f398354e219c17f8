"""The worker: one process per GPU, running one trial at a time through Optuna's ask and tell.

Loop (`worker_main`): pick the unfinished study with the least GPU time per unit of weight
(weighted fair share: over the night each shape gets time in proportion to its headroom µs per
token), stay on it for a slice, run one trial (`run_trial`), report to the supervisor, repeat.
When nothing is left to start but trials of an unfinished study are still running (another
worker's, perhaps on a host that died), it waits for them: a dead host's trial goes stale, is
failed and retried (claims rule 5), and this worker measures it.

A trial (`run_trial`): ``study.ask()``; the trial's heartbeat runs in a thread (`Heartbeat`) until
the decision; the config is claimed, replayed, stepped aside or measured (tuner.search.claims);
the objective's result goes to the trial in one place (`record_result`); ``study.tell()``.

Messages to the supervisor are the dataclasses below, sent over a one-way pipe.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from . import claims
from .claims import Ending
from .objective import Objective, TrialResult, evaluate, resolve_factory
from .planning import SearchSettings, StudyPlan, config_key, full_config, valid_params
from ..parity import DEFAULT_MARGIN
from .samplers import make_sampler, set_constraints
from .storage import make_storage, plain

__all__ = ["BaselineStarted", "EXIT_CONTEXT_LOST", "Heartbeat", "TrialEnded", "TrialStarted",
           "WorkerArgs", "WorkerError", "WorkerExited", "pick", "record_result", "run_trial",
           "slice_s", "worker_main"]

EXIT_CONTEXT_LOST = 3  # a worker exits with this after a trial corrupted its GPU context
WAIT_S = 0.5  # a worker with nothing to start polls this often for other trials to end


# ------------------------------------------------------------------------------- messages
@dataclass(frozen=True)
class TrialStarted:
    slot: int
    study_name: str
    number: int
    trial_id: int
    at: float


@dataclass(frozen=True)
class BaselineStarted:
    slot: int
    study_name: str
    at: float


@dataclass(frozen=True)
class TrialEnded:
    slot: int
    study_name: str
    number: int
    ending: Ending
    best: float | None  # the study's best feasible µs as this worker knows it
    at: float


@dataclass(frozen=True)
class WorkerError:
    """The worker itself failed (not a candidate): it exits non-zero after this message."""

    slot: int
    reason: str
    at: float


@dataclass(frozen=True)
class WorkerExited:
    slot: int
    at: float


@dataclass
class WorkerArgs:
    slot: int
    gpu: str | None
    plans: list[StudyPlan]
    settings: SearchSettings
    deadline: float | None
    seed: int | None


# ------------------------------------------------------------------------------- one trial
class Heartbeat:
    """The trial's heartbeat, recorded now and then every interval in a thread, as
    ``study.optimize`` does: a trial whose heartbeat stops (its worker or host died) goes stale."""

    def __init__(self, storage, trial_id: int):
        interval = getattr(storage, "get_heartbeat_interval", lambda: None)()
        self.storage, self.trial_id, self.interval = storage, trial_id, interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.storage.record_heartbeat(self.trial_id)
            except Exception:  # noqa: BLE001 - a lost beat only makes the trial look stale sooner
                pass

    def __enter__(self) -> "Heartbeat":
        if self.interval:
            self.storage.record_heartbeat(self.trial_id)
            self._thread = threading.Thread(target=self._beat, daemon=True, name="heartbeat")
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def record_result(trial, result: TrialResult, parity_mode: str,
                  parity_margin: float = DEFAULT_MARGIN) -> Ending:
    """The objective's result -> the trial's user attrs and constraints; how the trial ends.
    The one place a measurement is written to a trial."""
    if result.failure:
        trial.set_user_attr("failure", str(result.failure))
        return Ending("FAIL", "failed", fatal=bool(result.fatal))
    if result.median_us is None or not _finite(result.median_us):
        trial.set_user_attr("failure", "error: the objective gave no finite time")
        return Ending("FAIL", "failed", fatal=bool(result.fatal))
    trial.set_user_attr("median_us", float(result.median_us))
    trial.set_user_attr("noise_pct", None if result.noise_pct is None else float(result.noise_pct))
    # the three parity facts, whatever the gate; `parity` is the gate it passed, or "mismatch"
    facts = result.facts
    for name, value in (facts.to_attrs() if facts is not None else {}).items():
        trial.set_user_attr(name, value)
    infeasible = facts is None or not facts.passes(parity_mode, parity_margin)
    trial.set_user_attr("parity", "mismatch" if infeasible else parity_mode)
    set_constraints(trial, space=0.0, parity=1.0 if infeasible else 0.0)
    if trial.user_attrs.get("role") == "default":
        trial.study.set_user_attr("default_us", float(result.median_us))
    return Ending("COMPLETE", "mismatch" if infeasible else "ok", value=float(result.median_us),
                  fatal=bool(result.fatal))


def _finite(x) -> bool:
    try:
        return x is not None and float(x) == float(x) and abs(float(x)) != float("inf")
    except (TypeError, ValueError):
        return False


def _decide(trial, plan: StudyPlan, state, objective: Objective, started: Callable[[Any], None],
            trials: int | None, worker: str | None) -> Ending:
    from optuna.trial import TrialState

    params = {name: trial.suggest_categorical(name, list(choices))
              for name, choices in plan.space.params.items()}
    config = full_config(plan.default_config, params)
    if worker:
        trial.set_user_attr("worker", worker)
    trial.set_user_attr("config", plain(config))
    started(trial)
    if not plan.space.allows(params, plan.shape):
        trial.set_user_attr("failure", "constraint: outside the search space's constraints")
        set_constraints(trial, space=1.0, parity=0.0)
        return Ending("PRUNED", "constraint")
    prior = claims.taken(trial, plan, config_key(config))
    if prior is not None:
        if prior.state == TrialState.RUNNING:
            return claims.step_aside(trial, prior)
        return claims.replay(trial, prior)
    if trials is not None and state.measured + state.running + 16 >= trials:
        stepped_back = claims.check_trial_cap(trial, plan, trials, params)
        if stepped_back is not None:
            return stepped_back
    return record_result(trial, evaluate(objective, config), plan.parity_mode, plan.parity_margin)


def run_trial(study, plan: StudyPlan, state, objective: Objective,
              started: Callable[[Any], None] = lambda trial: None,
              trials: int | None = None, worker: str | None = None) -> tuple[int, Ending]:
    """One trial by ask and tell. `state`: the study as read before it (for the --trials cap);
    `started(trial)` is called once the trial has claimed its config; `worker` names who runs it
    (user attr ``worker``: host/supervisor pid/GPU). Returns (number, ending)."""
    import optuna
    from optuna.trial import TrialState

    trial = study.ask()
    with Heartbeat(study._storage, trial._trial_id):
        try:
            ending = _decide(trial, plan, state, objective, started, trials, worker)
        except optuna.exceptions.UpdateFinishedTrialError:
            return trial.number, Ending("FAIL", "lost")  # failed meanwhile (stale, or the supervisor)
    told = study.tell(trial, ending.value if ending.state == "COMPLETE" else None,
                      state=TrialState[ending.state], skip_if_finished=True)
    if told.state != TrialState[ending.state]:
        return trial.number, Ending("FAIL", "lost")
    return trial.number, ending


# ---------------------------------------------------------------------------- the loop
def pick(states: dict, plans: list[StudyPlan], settings: SearchSettings,
         slot: int) -> StudyPlan | None:
    """The unfinished study with the least GPU time per unit of weight (weighted fair share)."""
    open_plans = [p for p in plans if not claims.study_done(states[p.study_name], p, settings.trials)]
    if not open_plans:
        return None
    n = len(plans)
    order = {p.study_name: i for i, p in enumerate(plans)}
    return min(open_plans, key=lambda p: (states[p.study_name].spent_s / max(p.weight, 1e-12),
                                          (order[p.study_name] - slot) % n))


def slice_s(settings: SearchSettings, n_plans: int) -> float:
    """How long a worker stays on the study it picked before it compares all studies again
    (reading every study's trials costs a few ms per trial; a slice keeps that off each trial)."""
    if settings.slice_s is not None:
        return settings.slice_s
    if settings.timeout_s:
        return max(0.0, min(60.0, settings.timeout_s / (4 * max(1, n_plans))))
    return 60.0


def _read_all(studies: dict, plans: list[StudyPlan], settings: SearchSettings) -> dict:
    """Every study's state, after failing its stale trials and orphans (claims rules 5, 6)."""
    from optuna.storages import fail_stale_trials

    states = {}
    for p in plans:
        study = studies[p.study_name]
        if settings.heartbeat_s:
            fail_stale_trials(study)
        trials = study.get_trials(deepcopy=False)
        if claims.fail_orphans(study, trials, settings.grace_s):
            trials = study.get_trials(deepcopy=False)
        states[p.study_name] = claims.read_state(trials, p)
    return states


def worker_main(args: WorkerArgs, conn, stop_event) -> None:
    """Entry point of a worker process (spawned)."""
    if args.gpu is not None:
        hip = bool(args.plans) and args.plans[0].backend in ("hip", "dcu")
        os.environ["HIP_VISIBLE_DEVICES" if hip else "CUDA_VISIBLE_DEVICES"] = str(args.gpu)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides when to stop
    try:
        _loop(args, conn, stop_event)
    except Exception as exc:  # noqa: BLE001 - the worker itself failed: say why, then exit 1
        text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]
        try:
            conn.send(WorkerError(args.slot, text, time.time()))
            conn.close()
        finally:
            os._exit(1)
    conn.send(WorkerExited(args.slot, time.time()))
    conn.close()


def _loop(args: WorkerArgs, conn, stop_event) -> None:
    import warnings

    import optuna

    # study.ask() warns, once per trial, that a heartbeat storage is meant for Study.optimize;
    # this loop runs the heartbeat itself (`Heartbeat`, as optimize does), so the warning is noise
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")

    settings = args.settings
    storage = make_storage(settings.storage, settings.heartbeat_s, settings.grace_s)
    factory = resolve_factory(settings.objective)
    studies = {p.study_name: optuna.load_study(
        study_name=p.study_name, storage=storage,
        sampler=make_sampler(settings.sampler, args.seed, p.n_valid, valid_params(p)))
        for p in args.plans}
    ahead = _compile_ahead(args, studies)
    try:
        _trials(args, conn, stop_event, factory, studies)
    finally:
        if ahead is not None:
            ahead.close()


def _compile_ahead(args: WorkerArgs, studies: dict):
    """Start compiling every study's queued configs in the background (tuner.precompile), the
    studies' first configs first; None when compile threads are off."""
    threads = int(args.settings.compile_threads or 0)
    if threads <= 0 or not args.plans:
        return None
    from tuner_kernels import get_family

    from ..precompile import CompileAhead

    backend = "hip" if args.plans[0].backend in ("hip", "dcu") else "cuda"
    queues = [[(get_family(p.family), p.shape, c)
               for c in claims.queued_configs(studies[p.study_name], p)] for p in args.plans]
    ahead = CompileAhead(backend, threads)
    ahead.submit([job for round_ in itertools.zip_longest(*queues) for job in round_ if job])
    return ahead


def _trials(args: WorkerArgs, conn, stop_event, factory, studies: dict) -> None:
    from optuna.storages import fail_stale_trials

    settings = args.settings
    objectives: dict[str, Objective] = {}
    streak: dict[str, int] = {}  # trials in a row that spent no GPU time, per study
    rng = random.Random(args.seed)
    plan, state, slice_end = None, None, 0.0
    parent = os.getppid()
    worker = f"{socket.gethostname()}/{parent}/gpu{args.gpu}"
    while not stop_event.is_set() and (args.deadline is None or time.time() < args.deadline):
        if os.getppid() != parent:
            return  # the supervisor was killed: do not go on unsupervised
        if plan is not None and time.time() < slice_end:
            # within a time slice: stay on this study and read only its trials
            state = claims.read_state(studies[plan.study_name].get_trials(deepcopy=False), plan)
            if claims.study_done(state, plan, settings.trials):
                plan = None
        else:
            plan = None
        if plan is None:
            states = _read_all(studies, args.plans, settings)
            plan = pick(states, args.plans, settings, args.slot)
            if plan is None:
                unfinished = any(not claims.study_done(states[p.study_name], p, settings.trials,
                                                       in_flight_counts=False) for p in args.plans)
                if unfinished and settings.heartbeat_s:
                    stop_event.wait(WAIT_S)  # trials in flight may yet fail and be retried
                    continue
                return
            state = states[plan.study_name]
            slice_end = time.time() + slice_s(settings, len(args.plans))
        study = studies[plan.study_name]
        if plan.study_name not in objectives:
            objectives.clear()  # one shape's inputs on the GPU at a time
            objectives[plan.study_name] = factory(plan)
        objective = objectives[plan.study_name]
        if "baseline_us" not in study.user_attrs or study.user_attrs.get("baseline_stale"):
            _measure_baseline(study, plan, objective, conn, args.slot)
        if settings.heartbeat_s:
            fail_stale_trials(study)
        name = plan.study_name
        number, ending = run_trial(
            study, plan, state, objective, trials=settings.trials, worker=worker,
            started=lambda t: conn.send(TrialStarted(args.slot, name, t.number, t._trial_id,
                                                     time.time())))
        streak[name] = 0 if ending.used_gpu else streak.get(name, 0) + 1
        if streak[name] >= claims.MAX_SAMPLER_REPEATS:
            claims.enqueue_unexplored(study, plan, state, rng)  # claims rule 7
            streak[name] = 0
        best = state.best.value if state.best is not None else None
        if ending.kind == "ok" and (best is None or ending.value < best):
            best = ending.value
        conn.send(TrialEnded(args.slot, name, number, ending, best, time.time()))
        if ending.fatal:
            conn.close()
            os._exit(EXIT_CONTEXT_LOST)  # the GPU context is corrupt: a fresh worker takes over


def _measure_baseline(study, plan: StudyPlan, objective: Objective, conn, slot: int) -> None:
    """The baseline (torch's path) of a shape, once, by the first worker on it."""
    conn.send(BaselineStarted(slot, plan.study_name, time.time()))
    study.set_user_attr("baseline_stale", False)
    try:
        study.set_user_attr("baseline_us", float(objective.baseline_us()))
    except Exception as exc:  # noqa: BLE001 - the search goes on without a baseline
        study.set_user_attr("baseline_us", None)
        study.set_user_attr("baseline_error", f"{type(exc).__name__}: {exc}"[:500])
