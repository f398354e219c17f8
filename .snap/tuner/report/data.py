"""What a report is made of, read from a run directory: the budget, the plan, the run record
(run.json: the storage the search used and the studies), the search's Optuna studies, the
verdicts and the A/Bs.

A run directory is what `tuner run -o DIR` writes (shapes.parquet, budget.parquet, plan.md,
verdicts.parquet, run.json; its A/Bs under DIR/ab/<label>/ab.json when `tuner ab -o DIR/ab` put
them there) or what `tuner ab` writes per batch size (artifacts/ab/<label>/ab.json). Anything
missing is None / empty with the reason in words, never an exception: a report of a CPU run
says that the search did not run and why.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from ..errors import TunerError
from ..tables import atomic_write_bytes

__all__ = ["AB_FILE", "RUN_RECORD", "RunData", "StudyData", "TrialPoint", "check_record",
           "load_run", "load_studies", "read_record", "record_path", "record_run", "sqlite_file"]

RUN_RECORD = "run.json"
AB_FILE = "ab.json"
SQLITE = "sqlite:///"


# ---------------------------------------------------------------------------------- run.json
def sqlite_file(url: str) -> Path | None:
    """The database file of a sqlite:/// URL, None for other URLs."""
    if not url.startswith(SQLITE):
        return None
    return Path(url[len(SQLITE):])


def record_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / RUN_RECORD


def record_run(run_dir: str | Path, *, storage: str | None, studies: list[str], searched: bool,
               not_searched: str = "", options: dict | None = None) -> Path:
    """Write run.json: where the run's studies live (a SQLite path made absolute, so `tuner
    report` finds it from any folder; a server URL with its password masked: give it again with
    `tuner report --storage`), which studies, and why the search did not run when it did not."""
    from ..search.storage import safe_url

    url = storage
    if url:
        path = sqlite_file(url)
        url = f"{SQLITE}{path.resolve()}" if path is not None and str(path) else safe_url(url)
    record = {"format": "tuner-run/1", "storage": url, "studies": list(studies),
              "searched": bool(searched), "not_searched": not_searched,
              "options": {k: v for k, v in (options or {}).items()
                          if isinstance(v, (str, int, float, bool)) and k != "out"},
              "written_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    data = (json.dumps(record, indent=2, sort_keys=True) + "\n").encode()
    return atomic_write_bytes(record_path(run_dir), data)


def read_record(run_dir: str | Path) -> dict:
    """run.json as a dict ({} when there is none or it cannot be read)."""
    return check_record(run_dir)[0]


# What each field of run.json must hold (record_run writes them so).
_RECORD_FIELDS = {"storage": (str, "a storage URL"), "studies": (list, "a list of study names"),
                  "searched": (bool, "true or false"), "not_searched": (str, "a text"),
                  "options": (dict, "an object"), "format": (str, "a text"),
                  "written_at": (str, "a text")}


def check_record(run_dir: str | Path) -> tuple[dict, list[str]]:
    """run.json as a dict ({} when there is none or it cannot be read) and what in it could not
    be used: an unreadable file, or a field of the wrong kind (left out of the dict)."""
    path = record_path(run_dir)
    if not path.exists():
        return {}, []
    try:
        record = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as exc:  # a directory, truncated JSON, not UTF-8
        return {}, [f"{path}: cannot be read ({_why(exc)}); the report goes without it"]
    if not isinstance(record, dict):
        return {}, [f"{path}: holds a JSON {type(record).__name__}, not the run record's "
                    f"object; the report goes without it"]
    problems = []
    for key, (kind, what) in _RECORD_FIELDS.items():
        value = record.get(key)
        if value is None:
            continue
        ok = isinstance(value, kind) and (key != "studies" or all(isinstance(v, str)
                                                                  for v in value))
        if not ok:
            problems.append(f"{path}: {key} is {_shown(value)}, not {what} (left out)")
            del record[key]
    return record, problems


def _why(exc: BaseException) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    if isinstance(exc, json.JSONDecodeError):
        return f"not JSON: {exc.msg}, line {exc.lineno} column {exc.colno}"
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


def _shown(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ------------------------------------------------------------------------------------ studies
@dataclass
class TrialPoint:
    number: int
    outcome: str  # measured: ok (feasible), mismatch (parity), failed; not: pruned, replayed
    us: float | None  # the trial's median µs (None: no time)
    elapsed_s: float | None  # seconds from the study's first trial start to this trial's end
    role: str = ""  # default, unexplored, ... (trial user attr `role`)
    config: dict = field(default_factory=dict)


@dataclass
class StudyData:
    name: str
    shape_key: str
    family: str
    baseline_us: float | None
    default_us: float | None
    trials: list[TrialPoint] = field(default_factory=list)  # finished trials, in order of ending

    def counts(self) -> dict:
        out = {"ok": 0, "mismatch": 0, "failed": 0, "pruned": 0, "replayed": 0}
        for t in self.trials:
            out[t.outcome] = out.get(t.outcome, 0) + 1
        return out

    def best(self) -> TrialPoint | None:
        ok = [t for t in self.trials if t.outcome == "ok" and t.us is not None]
        return min(ok, key=lambda t: (t.us, t.number)) if ok else None


def _finite(x) -> float | None:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _trial_points(trials) -> list[TrialPoint]:
    import optuna

    from ..rank import feasible
    from ..search.claims import ORPHAN, SKIPPED

    State = optuna.trial.TrialState
    ended = [t for t in trials if t.state in (State.COMPLETE, State.FAIL, State.PRUNED)
             and t.datetime_complete is not None]
    ended.sort(key=lambda t: (t.datetime_complete, t.number))
    starts = [t.datetime_start for t in trials if t.datetime_start is not None]
    first = min(starts) if starts else None
    points = []
    for t in ended:
        attrs = t.user_attrs
        us = _finite(attrs.get("median_us", t.value))
        failure = str(attrs.get("failure", ""))
        if "duplicate_of" in attrs or failure.startswith(SKIPPED) or failure == ORPHAN:
            outcome, us = "replayed", None  # answered from another trial, or never started
        elif t.state == State.COMPLETE and feasible(t):
            outcome = "ok"
        elif t.state == State.COMPLETE and attrs.get("parity") == "mismatch":
            outcome = "mismatch"
        elif t.state == State.PRUNED or failure.startswith("constraint"):
            outcome = "pruned"
        else:
            outcome, us = "failed", None
        elapsed = (t.datetime_complete - first).total_seconds() if first is not None else None
        points.append(TrialPoint(t.number, outcome, us, elapsed, str(attrs.get("role") or ""),
                                 dict(attrs.get("config") or {})))
    return points


def load_studies(url: str | None, names: list[str]) -> tuple[list[StudyData], str]:
    """The named studies of a storage, and '' or why (some of) them could not be read."""
    if not url:
        return [], "the run recorded no study storage"
    if not names:
        return [], "the run recorded no study names"
    if "***" in url:
        return [], (f"the storage {url} needs its password, which the run did not record: "
                    f"give it with `tuner report DIR --storage URL`")
    path = sqlite_file(url)
    if path is not None and not path.is_file():
        return [], (f"the study storage {path} is not there any more (moved or deleted?): give "
                    f"it with `tuner report DIR --storage sqlite:///PATH`")
    try:
        import optuna

        from ..search.storage import quiet_optuna

        quiet_optuna()
        storage = optuna.storages.RDBStorage(url, skip_table_creation=True)
    except Exception as exc:  # noqa: BLE001 - a broken file, a server that does not answer
        return [], f"cannot open the study storage {url}: {str(exc).splitlines()[0][:200]}"
    studies, missing = [], []
    for name in names:
        try:
            study = optuna.load_study(study_name=name, storage=storage)
        except Exception:  # noqa: BLE001 - a study deleted since the run
            missing.append(name)
            continue
        attrs = study.user_attrs
        studies.append(StudyData(
            name=name, shape_key=str(attrs.get("shape_key") or name.split(":", 2)[-1]),
            family=str(attrs.get("family") or ""), baseline_us=_finite(attrs.get("baseline_us")),
            default_us=_finite(attrs.get("default_us")),
            trials=_trial_points(study.get_trials(deepcopy=False))))
    why = f"{len(missing)} studies not in {url}: {', '.join(missing)}" if missing else ""
    return studies, why


# ---------------------------------------------------------------------------------- run dirs
@dataclass
class RunData:
    path: Path
    record: dict
    budget: pd.DataFrame | None = None
    budget_note: str = ""
    plan_md: str | None = None
    verdicts: pd.DataFrame | None = None
    verdicts_note: str = ""
    studies: list[StudyData] = field(default_factory=list)
    search_note: str = ""
    abs: list[tuple[Path, dict]] = field(default_factory=list)  # (ab.json path, its contents)
    ab_note: str = ""
    plan_note: str = ""
    record_note: str = ""  # what of run.json could not be read
    problems: list[str] = field(default_factory=list)  # each file (or part) that was not read


def _find_abs(directory: Path, extra: list) -> tuple[list[tuple[Path, dict]], list[str]]:
    """The A/Bs of `directory` (DIR/ab.json, DIR/ab/*/ab.json) and `extra`, and what could not
    be read."""
    paths = []
    if (directory / AB_FILE).is_file():
        paths.append(directory / AB_FILE)
    paths += sorted((directory / "ab").glob(f"*/{AB_FILE}"))
    problems = []
    for item in extra:
        item = Path(item)
        found = item if item.is_file() else item / AB_FILE
        if not found.is_file():
            raise TunerError(f"--ab {item}: no {AB_FILE} there (give the folder `tuner ab` wrote, "
                             f"artifacts/ab/<label>/)")
        paths.append(found)
    out, seen = [], set()
    for p in paths:
        if p.resolve() in seen:
            continue
        seen.add(p.resolve())
        try:
            data = json.loads(p.read_bytes().decode("utf-8"))
            if not isinstance(data, dict) or "arms" not in data:
                raise ValueError("no arms")
        except (OSError, ValueError) as exc:
            problems.append(f"{p}: not an A/B verdict ({_why(exc)})")
            continue
        out.append((p, _check_ab(p, data, problems)))
    return out, problems


# The parts of an ab.json the report reads, and what each must be (tuner.ab.verdict writes it).
_AB_FIELDS = {"arms": dict, "attribution": list, "outputs": dict, "residual": dict,
              "serving": dict, "reasons": list, "label": str, "crashed": str}


def _check_ab(path: Path, data: dict, problems: list) -> dict:
    """`data` without the parts of the wrong kind (each named in `problems`): the rest of the
    A/B is shown."""
    data = dict(data)
    for key, kind in _AB_FIELDS.items():
        value = data.get(key)
        if value is None or isinstance(value, kind):
            continue
        want = {dict: "object", list: "list", str: "string"}[kind]
        problems.append(f"{path}: {key} is {_shown(value)}, not a JSON {want} (not shown)")
        del data[key]
    return data


def load_run(directory: str | Path, *, storage: str | None = None,
             ab: list[str | Path] | tuple = ()) -> RunData:
    """Everything a report shows from `directory`. TunerError when it is not a run directory."""
    from .. import budget as budget_mod
    from .. import rank

    directory = Path(directory)
    if not directory.is_dir():
        raise TunerError(f"{directory} is not a directory: give the folder `tuner run` wrote "
                         f"(artifacts/run/<trace>/) or one `tuner ab` wrote "
                         f"(artifacts/ab/<label>/)")
    known = ("budget.parquet", "shapes.parquet", "plan.md", "verdicts.parquet", AB_FILE,
             RUN_RECORD)
    has_abs = any((directory / "ab").glob(f"*/{AB_FILE}"))
    if not any((directory / name).is_file() for name in known) and not has_abs:
        raise TunerError(f"{directory} is not a run directory: it has none of budget.parquet, "
                         f"verdicts.parquet, plan.md or ab.json (give the -o folder of `tuner "
                         f"run`, artifacts/run/<trace>/, or of `tuner ab`, artifacts/ab/<label>/)")
    record, problems = check_record(directory)
    data = RunData(path=directory, record=record, record_note="; ".join(problems))
    if (directory / "budget.parquet").exists():
        try:
            data.budget = budget_mod.read(directory / "budget.parquet")
        except TunerError as exc:
            data.budget_note = str(exc)
            problems.append(str(exc))
    plan = directory / "plan.md"
    if plan.exists():
        try:
            data.plan_md = plan.read_bytes().decode("utf-8")
        except (OSError, ValueError) as exc:
            data.plan_note = f"{plan}: cannot be read ({_why(exc)})"
            problems.append(data.plan_note)
    if (directory / "verdicts.parquet").exists():
        try:
            data.verdicts = rank.read(directory / "verdicts.parquet")
        except TunerError as exc:
            data.verdicts_note = str(exc)
            problems.append(str(exc))
    url = storage or data.record.get("storage")
    names = list(data.record.get("studies") or [])
    if not names and data.verdicts is not None and "study" in data.verdicts.columns:
        names = [s for s in dict.fromkeys(data.verdicts["study"]) if s]
    if url or names:
        data.studies, data.search_note = load_studies(url, names)
    data.abs, ab_problems = _find_abs(directory, list(ab))
    data.ab_note = "; ".join(ab_problems)
    data.problems = problems + ab_problems
    return data
