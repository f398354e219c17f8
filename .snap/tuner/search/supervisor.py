"""The supervisor: creates the studies, runs one worker process per GPU and watches them.

`run_search(plans, settings)`: prepare the studies (`prepare_studies`: attributes, stale trials,
the queue), start one worker per GPU ('spawn' context, the GPU chosen before torch loads), read
their messages (tuner.search.worker's dataclasses), and handle every way a worker ends in one
place (`_reap`):

- exit code 0: it found nothing left to do (or the time / Ctrl-C stopped it);
- it died (crash, kill -9, illegal memory access): its trial in flight is FAIL
  ``worker died (signal SIGSEGV)`` and retried once (claims rule 5), then a fresh worker starts;
- it hung past ``--trial-timeout``: killed (SIGKILL), the trial FAIL ``timeout: ...``, not retried;
- it exited after a trial lost its GPU context (EXIT_CONTEXT_LOST): it recorded the trial
  itself; a fresh worker starts;
- Ctrl-C twice: killed, the trial FAIL ``interrupted: ...`` and retried on the next run.

A GPU whose worker dies more than MAX_RESTARTS_IN_A_ROW times in a row without finishing a trial
is given up with a warning; the summary says when every GPU was.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import time
from dataclasses import dataclass, field

from ..errors import TunerError, info, warn
from . import claims
from .gpus import require_gpu, visible_gpus
from .planning import DEFAULT_TRIALS, SearchSettings, StudyPlan
from .samplers import check_sampler
from .storage import make_storage, plain
from .summary import SearchSummary, summarize
from .worker import (EXIT_CONTEXT_LOST, BaselineStarted, TrialEnded, TrialStarted, WorkerArgs,
                     WorkerError, WorkerExited, worker_main)

__all__ = ["MAX_RESTARTS_IN_A_ROW", "prepare_studies", "run_search", "visible_gpus"]

MAX_RESTARTS_IN_A_ROW = 5  # a worker slot that dies this often without finishing a trial is given up


def prepare_studies(plans: list[StudyPlan], settings: SearchSettings) -> None:
    """Create (or load) every study; set its attributes; fail stale trials and orphans; seed its
    queue (claims rule 1: only the supervisor that created a study seeds it)."""
    import optuna
    from optuna.storages import fail_stale_trials

    storage = make_storage(settings.storage, settings.heartbeat_s, settings.grace_s)
    for plan in plans:
        try:
            study = optuna.create_study(study_name=plan.study_name, storage=storage,
                                        direction="minimize")
            created = True
        except optuna.exceptions.DuplicatedStudyError:
            study = optuna.load_study(study_name=plan.study_name, storage=storage)
            created = False
        attrs = study.user_attrs
        wanted = {"family": plan.family, "shape": plan.shape, "shape_key": plan.shape_key,
                  "device": plan.device_key, "backend": plan.backend,
                  "default_config": plan.default_config, "parity_mode": plan.parity_mode, "parity_margin": plan.parity_margin,
                  "weight_us_per_token": plan.weight, "n_valid_configs": plan.n_valid,
                  **{k: plan.attrs.get(k) for k in ("calls_per_step", "step_us", "step_basis",
                                                    "hit_rate", "phase", "source")}}
        if not created and "baseline_us" in attrs and attrs.get("shape") != plain(plan.shape):
            # the same call measured another way (a key in no study name: harvest --kv-heads'
            # baseline_kv_heads): its baseline is measured again (worker._measure_baseline)
            study.set_user_attr("baseline_stale", True)
        for name, value in wanted.items():
            if attrs.get(name) != plain(value):
                study.set_user_attr(name, plain(value))
        fail_stale_trials(study)
        claims.fail_orphans(study, study.get_trials(deepcopy=False), settings.grace_s)
        claims.seed_queue(study, plan, settings.sampler, settings.seed, created=created)


@dataclass
class _Slot:
    index: int
    gpu: str | None
    process: object = None
    conn: object = None
    current: TrialStarted | BaselineStarted | None = None  # what the worker is doing now
    deaths_in_a_row: int = 0
    finished: bool = False
    given_up: bool = False
    trials: int = 0
    restarts: int = 0
    worker_error: str = ""  # what the worker said before it exited non-zero (WorkerError)
    last_error: str = ""  # the last reason this slot's worker ended abnormally


@dataclass
class _Run:
    """The supervisor's own state, for `_reap`."""

    settings: SearchSettings
    storage: object
    deadline: float | None
    interrupts: int = 0
    stopping: bool = False
    warnings: list[str] = field(default_factory=list)


def run_search(plans: list[StudyPlan], settings: SearchSettings,
               skipped: list[tuple[str, str]] | None = None) -> SearchSummary:
    """Search every plan with one worker process per GPU; returns the summary."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    check_sampler(settings.sampler)
    if not plans:
        raise TunerError("nothing to search: every shape was skipped")
    if settings.trials is None and settings.timeout_s is None:
        settings = dataclasses.replace(settings, trials=DEFAULT_TRIALS)
    if settings.objective is None:
        require_gpu()
    gpus = list(settings.gpus) if settings.gpus else (visible_gpus() if settings.objective is None
                                                      else ["0"])
    if settings.compile_threads is None:  # the GPU objective compiles; a test's does not
        from ..precompile import auto_threads

        settings = dataclasses.replace(
            settings, compile_threads=auto_threads(len(gpus)) if settings.objective is None else 0)
    started = time.time()
    deadline = started + settings.timeout_s if settings.timeout_s else None
    prepare_studies(plans, settings)

    ctx = mp.get_context("spawn")
    stop_event = ctx.Event()
    slots = [_Slot(i, g) for i, g in enumerate(gpus)]
    run = _Run(settings, make_storage(settings.storage, settings.heartbeat_s, settings.grace_s),
               deadline)
    bars = _Bars(slots, settings.progress)

    def start(slot: _Slot) -> None:
        reader, writer = ctx.Pipe(duplex=False)
        seed = None if settings.seed is None else settings.seed + 1000 * slot.index + slot.restarts
        args = WorkerArgs(slot.index, slot.gpu, plans, settings, deadline, seed)
        slot.process = ctx.Process(target=worker_main, args=(args, writer, stop_event),
                                   name=f"tuner-search-{slot.index}", daemon=True)
        slot.process.start()
        writer.close()
        slot.conn, slot.current = reader, None

    def on_sigint(signum, frame):
        run.interrupts += 1
        stop_event.set()
        if run.interrupts == 1:
            info("tuner search: stopping after the trials in flight (Ctrl-C again to abort them)")

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
                    _on_message(slot, conn.recv(), bars)
                except (EOFError, OSError):
                    conn.close()
                    slot.conn = None
            run.stopping = stop_event.is_set() or (deadline is not None and time.time() >= deadline)
            for slot in slots:
                if not slot.finished and _reap(slot, run, bars):
                    start(slot)
    finally:
        for slot in slots:
            if slot.process is not None and slot.process.is_alive():
                slot.process.kill()
                slot.process.join()
                _record_exit(slot, run.storage, "interrupted: search stopped", retry=True)
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        bars.close()
    return summarize(plans, settings, skipped or [], interrupted=run.interrupts > 0,
                     wall_s=time.time() - started, restarts=sum(s.restarts for s in slots),
                     workers=len(slots), given_up=[s.last_error for s in slots if s.given_up])


def _reap(slot: _Slot, run: _Run, bars: "_Bars") -> bool:
    """Handle a worker that ended (or must be ended): the one place a dead or hung worker's
    trial becomes a recorded failure. Returns True when the slot needs a fresh worker."""
    settings = run.settings
    hung = slot.current is not None and time.time() - slot.current.at > settings.trial_timeout_s
    if run.interrupts >= 2 or hung:
        slot.process.kill()
        slot.process.join()
    if slot.process.is_alive():
        if slot.conn is None:  # pipe closed: the worker is exiting
            slot.process.join(timeout=5)
        return False
    slot.process.join()
    _drain(slot, bars)
    code = slot.process.exitcode
    if code == 0:
        slot.finished = True
        return False
    if run.interrupts >= 2:
        reason, retry = "interrupted: Ctrl-C twice", True
    elif hung:
        reason, retry = (f"timeout: no result after {settings.trial_timeout_s:.0f}s; "
                         f"worker killed"), False
    elif code == EXIT_CONTEXT_LOST:
        reason, retry = "", False  # the worker recorded the trial itself
    else:
        reason, retry = f"worker died ({_exit_text(code)})", True
    if reason:
        _record_exit(slot, run.storage, reason, retry=retry)
    if code != EXIT_CONTEXT_LOST:
        slot.deaths_in_a_row += 1
        slot.last_error = slot.worker_error or reason or "GPU context lost"
    slot.worker_error = ""
    if run.stopping:
        slot.finished = True
        return False
    if slot.deaths_in_a_row > MAX_RESTARTS_IN_A_ROW:
        warn(f"worker on GPU {slot.gpu} died {slot.deaths_in_a_row} times without finishing a "
             f"trial ({slot.last_error}); giving that GPU up")
        slot.finished = slot.given_up = True
        return False
    slot.restarts += 1
    bars.note(slot, f"restart ({reason or 'GPU context lost'})")
    return True


def _record_exit(slot: _Slot, storage, reason: str, *, retry: bool) -> None:
    """What the ended worker was doing becomes a failure: its trial FAIL with `reason` (retried
    once when `retry`, claims rule 5), or its baseline measurement a `baseline_error`."""
    import optuna

    current, slot.current = slot.current, None
    if current is None:
        return
    study = optuna.load_study(study_name=current.study_name, storage=storage)
    if isinstance(current, BaselineStarted):
        study.set_user_attr("baseline_us", None)
        study.set_user_attr("baseline_error", reason)
        return
    claims.fail_trial(study, current.trial_id, reason, retry=retry)


def _exit_text(code: int | None) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def _on_message(slot: _Slot, message, bars: "_Bars") -> None:
    if isinstance(message, (TrialStarted, BaselineStarted)):
        slot.current = message
        if isinstance(message, BaselineStarted):
            bars.note(slot, f"baseline {_short(message.study_name)}")
    elif isinstance(message, TrialEnded):
        slot.current = None
        slot.deaths_in_a_row = 0
        if message.ending.used_gpu:
            slot.trials += 1
            bars.done(slot, message.study_name, message.best)
    elif isinstance(message, WorkerError):
        slot.worker_error = f"worker error: {message.reason}"
    elif isinstance(message, WorkerExited):
        slot.current = None


def _drain(slot: _Slot, bars: "_Bars") -> None:
    """Read what an ended worker left in its pipe."""
    if slot.conn is None:
        return
    try:
        while slot.conn.poll():
            _on_message(slot, slot.conn.recv(), bars)
    except (EOFError, OSError):
        pass
    slot.conn.close()
    slot.conn = None


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
