"""Samplers and constraints: how a study proposes configs and how it learns which are infeasible.

Every kernel parameter is a list of choices (per-parameter ``suggest_categorical``), so:

Every study's queue starts with the default config and the family's known configs
(tuner_kernels/candidates.py: measured winners and their neighbours), whatever the sampler.

- ``tpe`` (default): multivariate TPE with ``constant_liar`` (parallel workers on one study do not
  all propose the same point); its startup trials are random *valid* configs from the queue
  (`startup_configs`), since its own random startup would mostly propose combinations the space's
  constraints forbid.
- ``gp``: Optuna's GPSampler (categorical parameters and constraints), the same startup queue.
- ``random``: RandomSampler.
- ``grid``: every valid config is enqueued once (default first, then a seeded shuffle); the
  sampler only answers when the queue ran empty under a worker (`queue_sampler`).
- ``cmaes`` is refused: CMA-ES needs continuous or integer ranges.

Constraints (Optuna 5 ``Trial.set_constraint``; every trial gets both keys, GPSampler needs the
same keys on all): ``space`` (the config is outside the space's constraints: PRUNED, no GPU time)
and ``parity`` (the output is not feasible under the parity mode: COMPLETE with its time).
0 = feasible, 1 = violated. Older Optuna reads the same values through ``constraints_func``.
"""

from __future__ import annotations

import random

from ..errors import TunerError
from .planning import StudyPlan, known_params, valid_params

__all__ = ["CONSTRAINT_KEYS", "SAMPLERS", "check_sampler",
           "constraints_from_attrs", "is_feasible", "make_sampler", "n_startup",
           "queue_sampler", "set_constraints", "startup_configs"]

SAMPLERS = ("tpe", "grid", "random", "gp", "cmaes")
CONSTRAINT_KEYS = ("space", "parity")


def check_sampler(name: str) -> None:
    if name == "cmaes":
        raise TunerError("--sampler cmaes does not fit: CMA-ES needs continuous or integer ranges "
                         "and every kernel parameter here is a list of choices (categorical); "
                         "use tpe, gp, random or grid")
    if name not in SAMPLERS:
        raise TunerError(f"unknown sampler {name!r}; expected one of {', '.join(SAMPLERS)}")


def n_startup(n_valid: int) -> int:
    """Trials before TPE / GP start modelling (the default config plus random valid configs)."""
    return max(4, min(10, n_valid // 16))


def startup_configs(plan: StudyPlan, sampler: str, seed: int | None) -> list[dict]:
    """What a new study's queue holds after the default config and the known configs
    (`known_params`, every sampler): random valid configs for the startup phase of tpe / gp,
    every other valid config (seeded shuffle) for grid, nothing for random. Params only (the
    searched parameters)."""
    default = {k: plan.default_config.get(k) for k in plan.space.params}
    known = known_params(plan)
    rest = [c for c in valid_params(plan) if c != default and c not in known]
    random.Random(f"{seed}:{plan.study_name}").shuffle(rest)
    if sampler == "grid":
        return rest
    if sampler in ("tpe", "gp"):
        return rest[:max(0, n_startup(plan.n_valid) - 1)]
    return []


def make_sampler(name: str, seed: int | None, n_valid: int, valid: list[dict] | None = None):
    """`valid`: the plan's valid configs (`valid_params`); --sampler grid draws only from them."""
    import optuna

    check_sampler(name)
    legacy = not hasattr(optuna.trial.Trial, "set_constraint")
    cfunc = {"constraints_func": constraints_from_attrs} if legacy else {}
    # Optuna 4.9 deprecated the independent-sampling warning (and warns that it did when the
    # flag is passed); older versions warn on every fallback unless it is off
    version = tuple(int(p) for p in optuna.__version__.split(".")[:2] if p.isdigit())
    if version < (4, 9):
        cfunc["warn_independent_sampling"] = False
    if name == "tpe":
        return optuna.samplers.TPESampler(
            seed=seed, multivariate=True, constant_liar=True,
            n_startup_trials=n_startup(n_valid), **cfunc)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=n_startup(n_valid), **cfunc)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return queue_sampler(seed, list(valid or []))


def queue_sampler(seed: int | None, valid: list[dict]):
    """--sampler grid: every valid config is in the queue, so a trial is sampled only when the
    queue ran empty between a worker's look at the study and its trial (another worker popped
    the last config). Such a trial draws a random *valid* config, which the study already has
    (measured, or being measured): it is answered as a duplicate, with no GPU time. (A plain
    RandomSampler would draw each parameter on its own, often a combination the constraints
    forbid: a PRUNED trial that stands for no config.) Optuna is imported only here."""
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


def set_constraints(trial, space: float, parity: float) -> None:
    """Optuna >= 5: Trial.set_constraint. Older: the samplers' constraints_func reads user attrs."""
    if hasattr(trial, "set_constraint"):
        trial.set_constraint("space", float(space))
        trial.set_constraint("parity", float(parity))


def constraints_from_attrs(frozen) -> tuple[float, float]:
    """(space, parity) read back from a trial's user attrs (Optuna < 5's constraints_func)."""
    failure = str(frozen.user_attrs.get("failure") or "")
    parity = frozen.user_attrs.get("parity")
    return (1.0 if failure.startswith("constraint") else 0.0,
            1.0 if parity is not None and parity == "mismatch" else 0.0)


def is_feasible(frozen) -> bool:
    constraints = getattr(frozen, "constraints", None)
    if constraints:
        return all(v <= 0 for v in constraints.values())
    return max(constraints_from_attrs(frozen)) <= 0
