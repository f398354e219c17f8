"""What a trial needs from the GPU: the `Objective` interface, its result, and the GPU objective.

A worker process makes one objective per shape with an *objective factory* (``plan -> Objective``)
after its GPU is chosen (CUDA_VISIBLE_DEVICES set). The default factory is `gpu_objective`
(`GpuObjective`: tuner.parity's Checker against the default config, then tuner.bench's timing with
cold L2). Tests pass a cheap deterministic factory through the same interface, as a module-level
function or ``"module:function"`` so that the 'spawn' start method can pickle it.

`evaluate` is the one call the worker makes: whatever the objective raises becomes a
`TrialResult` with `failure` set (faults are data), and a failure whose text says the GPU
context is gone is marked `fatal` (the worker records the trial, then exits for a fresh one).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

from ..errors import TunerError
from ..parity import ParityFacts

if TYPE_CHECKING:
    from .planning import StudyPlan

__all__ = ["GpuObjective", "Objective", "ObjectiveFactory", "TrialResult", "context_lost",
           "evaluate", "gpu_objective", "resolve_factory"]


@dataclass
class TrialResult:
    """What one evaluated config produced. `failure` set means the candidate did not run."""

    median_us: float | None = None
    noise_pct: float | None = None
    facts: ParityFacts | None = None  # the three parity facts (tuner.parity), None: not checked
    failure: str | None = None
    fatal: bool = False  # the GPU context is unusable: record the trial, then the worker exits


class Objective(Protocol):
    """What a trial needs from the GPU. Made in the worker process by an objective factory."""

    def baseline_us(self) -> float: ...

    def evaluate(self, config: dict) -> TrialResult: ...


ObjectiveFactory = Callable[["StudyPlan"], Objective]

_CONTEXT_LOST_MARKERS = ("illegal memory access", "unspecified launch failure",
                         "device-side assert", "misaligned address", "illegal instruction",
                         "an illegal", "hipErrorIllegalAddress", "memory access fault")


def context_lost(text: str) -> bool:
    """Does an error text say that the GPU context is corrupt (every later launch fails)?"""
    low = text.lower()
    return any(marker.lower() in low for marker in _CONTEXT_LOST_MARKERS)


def _error_result(prefix: str, exc: BaseException) -> TrialResult:
    text = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
    return TrialResult(failure=f"{prefix}{text}", fatal=context_lost(str(exc)))


def evaluate(objective: Objective, config: dict) -> TrialResult:
    """`objective.evaluate(config)`; an exception is a failed candidate, not the worker's end."""
    try:
        return objective.evaluate(config)
    except Exception as exc:  # noqa: BLE001 - a candidate's error is data
        return _error_result("error: ", exc)


class GpuObjective:
    """Times a config with tuner.bench (cold L2) and checks its parity with tuner.parity.

    The parity inputs, the reference output and the cold-L2 input sets are made once per shape
    (the first time they are needed) and reused by every trial of that shape in this worker.
    `device=None`: the worker's GPU; under TRITON_INTERPRET=1 without a GPU, the CPU (for checks of
    this code path only: interpreter times mean nothing)."""

    def __init__(self, plan: "StudyPlan", *, device=None, cache: str = "cold",
                 groups: int | None = None, replays: int | None = None):
        from tuner_kernels import get_family

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
                self._checker = parity.Checker(self.family, plan.shape, device=self.device,
                                               default_config=plan.default_config,
                                               backend=plan.backend)
            facts = self._checker.facts(config)
            timing = bench.time_config(self.family, plan.shape, config, cache=self.cache,
                                       device=self.device, input_sets=self._sets(),
                                       **self.timer_options)
        except bench.CandidateFailure as exc:
            return TrialResult(failure=f"candidate: {exc}", fatal=context_lost(str(exc)))
        except Exception as exc:  # noqa: BLE001 - any error of a candidate is data
            return _error_result("error: ", exc)
        return TrialResult(median_us=float(timing.median_us), noise_pct=float(timing.spread_pct),
                           facts=facts)


def _interpreter_device():
    if os.environ.get("TRITON_INTERPRET") != "1":
        return None
    import torch

    return None if torch.cuda.is_available() else "cpu"


def gpu_objective(plan: "StudyPlan") -> Objective:
    """The default objective factory: real GPU timing and parity."""
    return GpuObjective(plan)


def resolve_factory(factory: ObjectiveFactory | str | None) -> ObjectiveFactory:
    """A factory from a callable, ``"module:function"``, or None (the GPU objective)."""
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
