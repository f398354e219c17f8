"""`tuner search`: Optuna search over kernel parameters for every surviving shape.

One Optuna study per (device, family, shape), named ``f"{device_key}:{family}:{shape_key}"``, all in
one storage (SQLite under artifacts/ by default, PostgreSQL for many hosts). Running the same
command again resumes. docs/search.md is the user's page; the modules, in the order a search
uses them:

- `planning`: shape table -> budget -> `StudyPlan`s (the one planner, also used by `tuner run`),
  `SearchSettings`, the time shares.
- `objective`: the `Objective` interface, `TrialResult`, the GPU objective.
- `storage`: the Optuna storage for a URL (SQLite tuned for many writers, PostgreSQL).
- `samplers`: tpe / gp / random / grid, and the ``space`` / ``parity`` constraints.
- `claims`: which trial measures a config and what happens to one that did not (the contract
  for duplicates, step-asides, the --trials cap, retries, orphans and the unexplored queue).
- `gpus`: the GPUs of this machine a search runs on, and refusing ids it lacks.
- `worker`: one process per GPU, one trial at a time by ask and tell; its messages.
- `supervisor`: the studies, the workers, and every way a worker can end.
- `summary`: what the storage holds at the end, per shape; why a search produced nothing.
- `stage`: `search(...)`, the whole `tuner search` command.
"""

from __future__ import annotations

from .claims import (CLAIM_WAIT_S, MAX_DEATHS_PER_CONFIG, MAX_SAMPLER_REPEATS, RETRYABLE_PREFIXES,
                     SKIPPED, Ending, StudyState, fail_orphans, read_state, study_done,
                     was_enqueued)
from .gpus import have_gpu, parse_gpus, require_gpu, visible_gpus
from .objective import (GpuObjective, Objective, ObjectiveFactory, TrialResult, gpu_objective,
                        resolve_factory)
from .planning import (DEFAULT_STORAGE, DEFAULT_TRIALS, PARITY_MODES, LaunchBound, SearchSettings,
                       StudyPlan, backend_of, config_key, judge, known_params, launch_bound,
                       make_plan,
                       plan_shapes, plan_studies, share_seconds, share_time, study_name,
                       study_plans, valid_params)
from .samplers import (CONSTRAINT_KEYS, SAMPLERS, check_sampler, make_sampler, n_startup,
                       set_constraints, startup_configs)
from .stage import search
from .storage import make_storage, plain, storage_url
from .summary import SearchSummary, ShapeResult, format_summary, problem, summarize
from .supervisor import prepare_studies, run_search
from .worker import EXIT_CONTEXT_LOST, record_result, run_trial

__all__ = [
    "CLAIM_WAIT_S", "CONSTRAINT_KEYS", "DEFAULT_STORAGE", "DEFAULT_TRIALS", "EXIT_CONTEXT_LOST",
    "Ending", "GpuObjective", "LaunchBound", "MAX_DEATHS_PER_CONFIG", "MAX_SAMPLER_REPEATS",
    "Objective", "ObjectiveFactory", "PARITY_MODES", "RETRYABLE_PREFIXES", "SAMPLERS", "SKIPPED",
    "SearchSettings", "SearchSummary", "ShapeResult", "StudyPlan", "StudyState", "TrialResult",
    "backend_of", "check_sampler", "config_key", "fail_orphans", "format_summary", "gpu_objective",
    "have_gpu", "judge", "known_params", "launch_bound", "make_plan", "make_sampler",
    "make_storage", "n_startup",
    "parse_gpus", "plain", "plan_shapes", "plan_studies", "prepare_studies",
    "problem", "read_state", "record_result", "require_gpu", "resolve_factory", "run_search",
    "run_trial", "search", "set_constraints", "share_seconds", "share_time", "startup_configs",
    "storage_url", "study_done", "study_name", "study_plans", "summarize", "valid_params",
    "visible_gpus", "was_enqueued",
]
