"""`tuner rank`: turn search leads into verdicts a serving team can trust.

For every study in a storage (filtered by family and device) the best few *distinct* feasible
configs are re-measured in this process: the three parity facts (tuner.parity: bitwise equal to
the serving path, the output class and the default config's, the error against an fp32 reference
beside the serving path's own) and a paired, interleaved timing against the baseline (the path
serving uses today) and against the family's default config (tuner.bench.compare). Three gates
decide:

- parity: ``accuracy`` by default (error at most ``margin`` x the serving path's on every seed),
  or ``kernel`` (bitwise equal to the default config) or ``baseline`` (bitwise equal to the
  serving path); every verdict row carries all three facts, whatever gate was used;
- speedup: the lower confidence bound of the paired ratio against the baseline >= ``min_speedup``;
- budget: projected saving per token = saving per call x calls_per_step x hit_rate reaches the
  threshold (µs per token, or a share of the step, as in tuner/budget.py).

Survivors are ranked by projected µs saved per token, never by ratio; the best survivor of a shape
is ``accept``, other survivors of the same shape ``runner-up``. Every rejected candidate stays in
the table with its reason. Measurement and decision are separate: `decide` is a pure function
over measured numbers, and `rank` takes a swappable `measure` function.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from .errors import CandidateFailure, TunerError, info, one_line, warn
from .parity import DEFAULT_GATE, DEFAULT_MARGIN, ParityFacts, resolve_gate
from .tables import read_parquet, write_parquet
from .units import Threshold, parse_threshold

__all__ = ["BASELINE_PATH", "DEFAULT_MIN_SPEEDUP", "DEFAULT_TOP", "IDENTITY_COLUMNS",
           "MEASURED_COLUMNS", "PARITY_COLUMNS", "VERDICTS_DIR", "VERDICT_COLUMNS", "Candidate",
           "Measured", "Pair", "StudyInfo", "best_distinct", "config_text", "decide", "decide_one",
           "feasible", "fp_fusion_default", "identity_columns", "load_studies", "make_measure",
           "markdown", "measure_on_gpu", "order", "parity_text", "rank", "read", "storage_url",
           "summary_lines", "trials_note", "write"]

VERDICTS_DIR = Path("artifacts") / "verdicts"
DEFAULT_MIN_SPEEDUP = 1.01
DEFAULT_TOP = 3

# The Verdict table (DESIGN.md), in this order, then the extra columns below.
VERDICT_COLUMNS = [
    "rank", "shape", "family", "config", "baseline_us", "candidate_us", "speedup", "speedup_low",
    "speedup_high", "parity_mode", "parity_error", "parity", "saving_us_per_call",
    "calls_per_step", "hit_rate", "saving_us_per_token", "share_of_step", "decision", "reason",
]
# The three parity facts of every candidate, whatever gate decided (tuner.parity.ParityFacts).
PARITY_COLUMNS = ["parity_margin", "bitwise_vs_baseline", "bitwise_vs_default", "parity_class",
                  "default_class", "error_vs_reference", "baseline_error_vs_reference",
                  "error_ratio", "parity_seeds"]
# How the baseline was timed (tuner.bench.baseline_path: 'eager', 'torch.compile', 'torch.compile
# max-autotune', a grouped SDPA form for attention, 'eager (torch.compile failed: ...)'; tables
# without the column were eager) and the GPU kernels it launched (the one a candidate beat).
BASELINE_PATH = "baseline_path"
BASELINE_KERNEL = "baseline_kernel"
MEASURED_COLUMNS = [
    "default_us", "speedup_vs_default", "noise_pct", "search_us", "trial", "step_us", "phase",
    "study", "shape_json", "device", BASELINE_PATH, BASELINE_KERNEL,
]
# Where and with what the numbers were measured (export copies these into its files).
IDENTITY_COLUMNS = [
    "device_name", "arch", "backend", "torch", "triton", "kernel_hash", "fp_fusion", "measured_at",
]

ACCEPT, RUNNER_UP, REJECT = "accept", "runner-up", "reject"


# ----------------------------------------------------------------------------- inputs / numbers
@dataclass
class StudyInfo:
    """One study, as far as rank needs it (from the pinned study user attrs)."""

    name: str
    family: str
    shape: dict
    shape_key: str
    device: str
    calls_per_step: float
    step_us: float
    hit_rate: float = 1.0
    phase: str = ""
    backend: str = "cuda"
    baseline_us: float | None = None
    default_us: float | None = None
    default_config: dict | None = None
    candidates: list["Candidate"] = field(default_factory=list)
    trials_note: str = ""  # what the study's trials were, for a study without any candidate


@dataclass
class Candidate:
    config: dict
    search_us: float  # median µs the search measured
    trial: int


@dataclass
class Pair:
    """What rank needs from tuner.bench.Paired."""

    reference_us: float
    candidate_us: float
    speedup: float
    speedup_low: float
    speedup_high: float
    noise_pct: float = 0.0


@dataclass
class Measured:
    """Everything measured for one candidate. `failure` set: it did not compile/run."""

    config: dict
    parity: ParityFacts | None = None  # the three parity facts (tuner.parity)
    vs_baseline: Pair | None = None
    vs_default: Pair | None = None
    failure: str = ""
    baseline_path: str = "eager"  # how the baseline was timed (tuner.bench.baseline_path)
    baseline_kernel: str = ""  # the kernels it launched (tuner.bench.launched_kernels)


MeasureFn = Callable[[StudyInfo, Candidate, str], Measured]


# ------------------------------------------------------------------------------ decision logic
def config_text(config: dict) -> str:
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def parity_text(facts: ParityFacts | None, gate: str, margin: float) -> str:
    """'accuracy ok: <the three facts>' or 'accuracy FAILED (why): <the three facts>'."""
    if facts is None:
        return "not checked"
    why = facts.failure(gate, margin)
    verdict = f"{gate} ok" if not why else f"{gate} FAILED ({why})"
    return f"{verdict}: {facts.describe()}"


def decide_one(study: StudyInfo, cand: Candidate, meas: Measured, *, min_speedup: float,
               threshold: Threshold, gate: str = DEFAULT_GATE,
               margin: float = DEFAULT_MARGIN) -> dict:
    """One verdict row from measured numbers. Pure: no GPU, no I/O."""
    row: dict[str, Any] = {
        "rank": 0,
        "shape": study.shape_key,
        "family": study.family,
        "config": config_text(cand.config),
        "baseline_us": math.nan, "candidate_us": math.nan,
        "speedup": math.nan, "speedup_low": math.nan, "speedup_high": math.nan,
        "parity_mode": gate,
        "parity_error": float(meas.parity.error_vs_reference) if meas.parity else math.nan,
        "parity": parity_text(meas.parity, gate, margin),
        "saving_us_per_call": math.nan,
        "calls_per_step": float(study.calls_per_step),
        "hit_rate": float(study.hit_rate),
        "saving_us_per_token": math.nan,
        "share_of_step": math.nan,
        "decision": REJECT,
        "reason": "",
        "default_us": math.nan, "speedup_vs_default": math.nan, "noise_pct": math.nan,
        "search_us": float(cand.search_us), "trial": int(cand.trial),
        "step_us": float(study.step_us), "phase": study.phase, "study": study.name,
        "shape_json": json.dumps(study.shape, sort_keys=True), "device": study.device,
        "parity_margin": float(margin),
        **_fact_columns(meas.parity),
        BASELINE_PATH: meas.baseline_path,
        BASELINE_KERNEL: meas.baseline_kernel,
    }
    if meas.vs_baseline is not None:
        b = meas.vs_baseline
        saving = b.reference_us - b.candidate_us
        per_token = saving * study.calls_per_step * study.hit_rate
        row.update(baseline_us=b.reference_us, candidate_us=b.candidate_us, speedup=b.speedup,
                   speedup_low=b.speedup_low, speedup_high=b.speedup_high,
                   noise_pct=b.noise_pct, saving_us_per_call=saving,
                   saving_us_per_token=per_token,
                   share_of_step=per_token / study.step_us if study.step_us > 0 else math.nan)
    if meas.vs_default is not None:
        row.update(default_us=meas.vs_default.reference_us,
                   speedup_vs_default=meas.vs_default.speedup)

    if meas.failure:
        row["reason"] = f"failed: {meas.failure}"
        return row
    if meas.parity is None or not meas.parity.passes(gate, margin):
        row["reason"] = f"parity: {parity_text(meas.parity, gate, margin)}"
        return row
    b = meas.vs_baseline
    if b is None:
        row["reason"] = "failed: no timing against the baseline"
        return row
    if not b.speedup_low >= min_speedup:  # NaN fails too
        if b.speedup_high >= min_speedup:
            row["reason"] = (f"noise: {b.speedup:.3f}x but its lower bound {b.speedup_low:.3f} "
                             f"< {min_speedup:g} (A/A noise ±{b.noise_pct:.2f}%)")
        else:
            row["reason"] = (f"not faster: {b.speedup:.3f}x [{b.speedup_low:.3f}, "
                             f"{b.speedup_high:.3f}] < {min_speedup:g} against the baseline")
        return row
    d = meas.vs_default
    is_default = (study.default_config is not None
                  and config_text(meas.config) == config_text(study.default_config))
    if d is not None and d.speedup_high < 1.0 and not is_default:
        # the default config (trial 0 of the study) serves this shape faster: export that one.
        # The default against itself is an A/A pair, whose bound can dip under 1 by noise.
        row["reason"] = (f"slower than the default config: {d.speedup:.3f}x [{d.speedup_low:.3f}, "
                         f"{d.speedup_high:.3f}] against {d.reference_us:.2f} us")
        return row
    if not threshold.passes(row["saving_us_per_token"], study.step_us):
        row["reason"] = (f"too small: saves {row['saving_us_per_token']:.2f} us/token "
                         f"({_pct(row['share_of_step'])} of the step) < {threshold.describe()}")
        return row
    row["decision"] = ACCEPT
    row["reason"] = (f"passes: {b.speedup_low:.3f}x lower bound, "
                     f"{row['saving_us_per_token']:.2f} us/token")
    return row


def _fact_columns(facts: ParityFacts | None) -> dict:
    if facts is None:
        return {"bitwise_vs_baseline": None, "bitwise_vs_default": None, "parity_class": "",
                "default_class": "", "error_vs_reference": math.nan,
                "baseline_error_vs_reference": math.nan, "error_ratio": math.nan,
                "parity_seeds": 0}
    return {"bitwise_vs_baseline": bool(facts.bitwise_vs_baseline),
            "bitwise_vs_default": bool(facts.bitwise_vs_default),
            "parity_class": facts.parity_class, "default_class": facts.default_class,
            "error_vs_reference": float(facts.error_vs_reference),
            "baseline_error_vs_reference": float(facts.baseline_error_vs_reference),
            "error_ratio": float(facts.error_ratio), "parity_seeds": int(facts.seeds)}


def _pct(x: float) -> str:
    if x is None or math.isnan(x):
        return "n/a"
    return f"{x * 100:.2f}%" if abs(x) >= 1e-3 else f"{x * 100:.2g}%"  # 0.0015%, not 0.00%


def decide(studies: list[tuple[StudyInfo, list[tuple[Candidate, Measured]]]], *,
           min_speedup: float = DEFAULT_MIN_SPEEDUP,
           threshold: Threshold | str | None = None, gate: str = DEFAULT_GATE,
           margin: float = DEFAULT_MARGIN) -> pd.DataFrame:
    """All verdict rows, ranked: accepted by projected µs/token (one per shape), then runners-up,
    then rejected. Pure: takes measured numbers, returns the table."""
    threshold = parse_threshold(threshold)
    gate = resolve_gate(gate, quiet=True)
    options = dict(min_speedup=min_speedup, threshold=threshold, gate=gate, margin=margin)
    rows = []
    for study, measured in studies:
        study_rows = [decide_one(study, cand, meas, **options) for cand, meas in measured]
        if not measured:  # a shape without any feasible result is a result too
            row = decide_one(study, Candidate({}, math.nan, -1),
                             Measured(config={}, failure="x"), **options)
            row.update(config="", parity="", reason="no candidate: no feasible completed trial "
                       f"in the study{' (' + study.trials_note + ')' if study.trials_note else ''}")
            study_rows.append(row)
        passing = [r for r in study_rows if r["decision"] == ACCEPT]
        passing.sort(key=lambda r: -r["saving_us_per_token"])
        for r in passing[1:]:
            r["decision"] = RUNNER_UP
            r["reason"] = (f"passes, but {passing[0]['config']} saves more "
                           f"({passing[0]['saving_us_per_token']:.2f} us/token)")
        rows += study_rows
    table = pd.DataFrame(rows, columns=VERDICT_COLUMNS + PARITY_COLUMNS + MEASURED_COLUMNS)
    return order(table)


def order(table: pd.DataFrame) -> pd.DataFrame:
    """Accepted first by saving per token, then runners-up, then rejected; `rank` 1.. for accepted."""
    if table.empty:
        return table
    weight = table["decision"].map({ACCEPT: 0, RUNNER_UP: 1, REJECT: 2}).fillna(3)
    saving = table["saving_us_per_token"].fillna(-math.inf)
    table = table.assign(_w=weight, _s=saving).sort_values(["_w", "_s"], ascending=[True, False])
    table = table.drop(columns=["_w", "_s"]).reset_index(drop=True)
    accepted = table["decision"] == ACCEPT
    table["rank"] = 0
    table.loc[accepted, "rank"] = range(1, int(accepted.sum()) + 1)
    return table


# ------------------------------------------------------------------------------- reading studies
def storage_url(storage: str | None) -> str:
    """A storage URL; a plain path means a SQLite file; None means tuner.search's default."""
    if not storage:
        from . import search

        return search.DEFAULT_STORAGE
    if "://" in storage:
        return storage
    return f"sqlite:///{Path(storage)}"


def feasible(trial) -> bool:
    attrs = trial.user_attrs
    if attrs.get("failure"):
        return False
    if attrs.get("parity") == "mismatch":
        return False
    constraints = getattr(trial, "constraints", None) or trial.system_attrs.get("constraints")
    values = constraints.values() if isinstance(constraints, dict) else (constraints or [])
    if any(v is not None and v > 0 for v in values):
        return False
    return bool(attrs.get("config"))


def best_distinct(trials, top: int, default_config: dict | None = None,
                  study_name: str = "") -> list[Candidate]:
    """The `top` fastest distinct configs among feasible COMPLETE trials (by median_us), plus
    the family's default config when it was measured feasible but is not among them: a search
    time of a few µs is noisy, and when the re-measurement shows the default is the fastest, the
    default is the config to export (on the H200 every top-3 candidate of one shape lost to it)."""
    import optuna

    seen = set()
    ranked = []
    for t in trials:
        if t.state != optuna.trial.TrialState.COMPLETE or not feasible(t):
            continue
        us = t.user_attrs.get("median_us", t.value)
        if us is None or (isinstance(us, float) and math.isnan(us)):
            continue
        config = t.user_attrs["config"]
        if not isinstance(config, dict) or not _is_number(us):
            bad = ("config", config) if not isinstance(config, dict) else ("median_us", us)
            raise TunerError(f"trial {t.number}{_of_study(study_name)}: user attribute "
                             f"{bad[0]} is {_shown(bad[1])}, not a "
                             f"{'dict' if bad[0] == 'config' else 'number'}: the study storage "
                             f"is damaged (delete that trial or its study, or search again)")
        ranked.append((float(us), t.number, dict(config)))
    ranked.sort(key=lambda item: (item[0], item[1]))
    out = []
    for us, number, config in ranked:
        key = config_text(config)
        if key in seen:
            continue
        seen.add(key)
        out.append(Candidate(config=config, search_us=us, trial=number))
        if len(out) >= top:
            break
    if default_config is not None and config_text(default_config) not in seen:
        for us, number, config in ranked:
            if config_text(config) == config_text(default_config):
                out.append(Candidate(config=config, search_us=us, trial=number))
                break
    return out


def trials_note(trials) -> str:
    """'12 trials: 7 complete, 3 failed, 2 parity mismatch' for a study's trials."""
    import optuna

    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    mismatch = sum(1 for t in complete if t.user_attrs.get("parity") == "mismatch")
    failed = sum(1 for t in trials if t.state == optuna.trial.TrialState.FAIL)
    return (f"{len(trials)} trials: {len(complete)} complete, {failed} failed, "
            f"{mismatch} parity mismatch")


def _is_number(x) -> bool:
    """A real number (NaN included: an unmeasured time); not a bool, a string or a list."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _of_study(name: str) -> str:
    return f" of study {name}" if name else ""


# The pinned study attributes rank reads (docs/interfaces.md): what each must hold.
_STUDY_ATTRS = {
    "family": (str, "a family name"), "shape": (dict, "a dict"), "shape_key": (str, "a string"),
    "device": (str, "a string"), "phase": (str, "a string"), "backend": (str, "a string"),
    "calls_per_step": (float, "a number >= 0"), "step_us": (float, "a number >= 0"),
    "hit_rate": (float, "a number >= 0"), "baseline_us": (float, "a number >= 0"),
    "default_us": (float, "a number >= 0"), "default_config": (dict, "a dict"),
}


def _check_study_attrs(name: str, attrs: dict) -> None:
    """A TunerError naming the first pinned attribute of a study that holds the wrong kind of
    value (a damaged or hand-edited storage); absent and None values are left to the defaults."""
    for key, (kind, what) in _STUDY_ATTRS.items():
        value = attrs.get(key)
        if value is None and key not in ("family", "shape"):
            continue
        number = _is_number(value) and not value < 0
        ok = number if kind is float else isinstance(value, kind)
        if not ok:
            raise TunerError(f"study {name}: user attribute {key} is {_shown(value)}, not "
                             f"{what}: the study storage is damaged (delete the study or search "
                             f"that shape again)")


def load_studies(storage: str | None, *, family: str | None = None, device: str | None = None,
                 top: int = DEFAULT_TOP, names: list[str] | None = None) -> list[StudyInfo]:
    """The tuner studies in a storage (optionally only these study names), each with its best
    `top` distinct feasible configs."""
    import optuna

    url = storage_url(storage)
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).exists():
        raise TunerError(f"no study storage at {url[len('sqlite:///'):]}: run `tuner search` "
                         f"first, or give --storage")
    try:
        summaries = optuna.study.get_all_study_summaries(url, include_best_trial=False)
    except Exception as exc:  # bad URL, server down
        raise TunerError(f"cannot open study storage {url}: {exc}") from None
    studies = []
    for summary in summaries:
        attrs = summary.user_attrs
        if "family" not in attrs or "shape" not in attrs:
            continue  # not a tuner study
        if family and attrs["family"] != family:
            continue
        if device and attrs.get("device") != device:
            continue
        if names is not None and summary.study_name not in names:
            continue
        _check_study_attrs(summary.study_name, attrs)
        study = optuna.load_study(study_name=summary.study_name, storage=url)
        info_ = StudyInfo(
            name=summary.study_name, family=attrs["family"], shape=dict(attrs["shape"]),
            shape_key=attrs.get("shape_key") or summary.study_name.split(":", 2)[-1],
            device=attrs.get("device", ""), calls_per_step=float(attrs.get("calls_per_step", 0)),
            step_us=float(attrs.get("step_us") or 0.0), hit_rate=float(attrs.get("hit_rate", 1.0)),
            phase=attrs.get("phase", ""), backend=attrs.get("backend", "cuda"),
            baseline_us=attrs.get("baseline_us"), default_us=attrs.get("default_us"),
            default_config=attrs.get("default_config"))
        trials = study.get_trials(deepcopy=False)
        info_.candidates = best_distinct(trials, top, info_.default_config, summary.study_name)
        info_.trials_note = trials_note(trials)
        studies.append(info_)
    if not studies:
        what = " ".join(x for x in (family and f"family {family}", device and f"device {device}")
                        if x)
        raise TunerError(f"no tuner studies{' for ' + what if what else ''} in {url}")
    return studies


# ---------------------------------------------------------------------------------- measurement
def measure_on_gpu(study: StudyInfo, cand: Candidate, gate: str, *, device=None,
                   cache: str = "cold", baseline: str = "baseline", **compare_options) -> Measured:
    """The parity facts, then paired timing against the baseline and the default config (GPU).
    A candidate failing `gate` (on the default margin) is not timed; `decide` judges the facts.

    `baseline`: how the baseline is timed, a tuner.bench reference: 'baseline' (eager),
    'compiled-baseline' (under torch.compile, as a compiling server runs it) or
    'max-autotune-baseline' (torch.compile max-autotune: the kernel Inductor picks for that exact
    shape; for attention the fastest grouped SDPA); parity still compares with the eager path.
    A study whose shape says baseline_compiled (harvested from a torch.compile'd step) is timed
    compiled at least (tuner.bench resolves 'baseline' so, for the search too). The baseline's
    kernels (`Measured.baseline_kernel`) are read from one profiled call on the GPU.
    `device`, `cache` and `compare_options` (groups, replays, ...) go to tuner.bench.compare;
    device='cpu' only under TRITON_INTERPRET=1 (tests: the numbers mean nothing)."""
    from tuner_kernels import get_family

    from . import bench, parity

    family = get_family(study.family)  # bench and parity take the KernelFamily
    meas = Measured(config=cand.config)
    try:
        checker = parity.Checker(family, study.shape, device=device,
                                 default_config=study.default_config, backend=study.backend)
        meas.parity = checker.facts(cand.config)
        if not meas.parity.passes(gate):
            return meas
        for name in (baseline, "default"):
            r = bench.compare(family, study.shape, cand.config, name, cache=cache, device=device,
                              **compare_options)
            pair = Pair(r.reference_us, r.candidate_us, r.speedup, r.speedup_low,
                        r.speedup_high, r.noise_pct)
            if name == baseline:
                meas.vs_baseline = pair
                meas.baseline_path = bench.baseline_path(family, study.shape, baseline)
                meas.baseline_kernel = " + ".join(bench.launched_kernels(
                    family, study.shape, baseline, device=device))[:160]
            else:
                meas.vs_default = pair
    except CandidateFailure as exc:
        meas.failure = str(exc) or type(exc).__name__
    except TunerError:
        raise
    except Exception as exc:  # a candidate crash is data, not the end of the ranking
        meas.failure = one_line(exc)
    return meas


def make_measure(*, device=None, cache: str = "cold", baseline: str = "baseline",
                 **compare_options) -> MeasureFn:
    """A `measure` for `rank` with these timing options (see `measure_on_gpu`)."""

    def measure(study: StudyInfo, cand: Candidate, gate: str) -> Measured:
        return measure_on_gpu(study, cand, gate, device=device, cache=cache, baseline=baseline,
                              **compare_options)

    return measure


def identity_columns(family: str) -> dict:
    """Device, versions, kernel hash and numerics-changing compile options of this process."""
    from . import runtime

    ident = runtime.current_identity() or {}
    try:
        khash = runtime.kernel_hash(family)
    except Exception as exc:  # a family without kernels yet
        warn(f"cannot hash the {family} kernel source: {exc}")
        khash = ""
    return {
        "device_name": ident.get("name", ""), "arch": ident.get("arch", ""),
        "backend": ident.get("backend", ""), "torch": ident.get("torch", ""),
        "triton": ident.get("triton", ""), "kernel_hash": khash,
        "fp_fusion": fp_fusion_default(),
    }


def fp_fusion_default() -> bool:
    """Triton's default FP fusion (FMA contraction) setting: it changes numerics."""
    try:
        from triton import knobs

        return bool(knobs.language.default_fp_fusion)
    except Exception:
        return True


def rank(storage: str | None = None, *, family: str | None = None, device: str | None = None,
         top: int = DEFAULT_TOP, parity_mode: str = DEFAULT_GATE, margin: float = DEFAULT_MARGIN,
         min_speedup: float = DEFAULT_MIN_SPEEDUP, threshold: Threshold | str | None = None,
         measure: MeasureFn | None = None, identity: Callable[[str], dict] | None = None,
         progress: bool = True, names: list[str] | None = None,
         compiled_baseline: bool = False, baseline: str = "") -> pd.DataFrame:
    """Load studies, re-measure their best distinct configs, decide. Returns the verdict table.
    `parity_mode`: the gate (baseline, kernel, accuracy; exact / tolerance are deprecated names).
    `baseline`: the step baseline the candidates must beat (tuner.baselines.BASELINES: 'eager',
    'compile', 'max-autotune'; `measure_on_gpu`); `compiled_baseline` is the older name of
    'compile'. Studies of a compiled step's trace are timed compiled at least (their shape says
    baseline_compiled); each row's `baseline_path` says how its baseline was timed and
    `baseline_kernel` what it ran. A custom `measure` times it its own way (make_measure's
    `baseline`)."""
    gate = resolve_gate(parity_mode, quiet=True)
    if not (margin >= 1.0):
        raise TunerError(f"--parity-margin must be at least 1, not {margin}")
    if not (min_speedup > 0):
        raise TunerError(f"--min-speedup must be positive, not {min_speedup}")
    threshold = parse_threshold(threshold)
    studies = load_studies(storage, family=family, device=device, top=top, names=names)
    from .baselines import check_baseline, eager_share_note

    step = check_baseline(baseline or ("compile" if compiled_baseline else "eager"))
    note = eager_share_note(step, threshold, [s.step_us for s in studies
                                              if not s.shape.get("baseline_compiled")],
                            len(studies))
    if note:
        warn(note)
    if measure is None:
        from .bench import REFERENCES

        _require_gpu()
        measure = make_measure(baseline=REFERENCES[step])
    identity = identity or identity_columns
    measured = []
    for i, study in enumerate(studies, 1):
        results = []
        if not study.candidates:
            warn(f"{study.name}: no feasible completed trial to rank")
        for cand in study.candidates:
            if progress:
                info(f"[{i}/{len(studies)}] {study.family} {study.shape_key}: "
                     f"re-measuring {config_text(cand.config)}")
            results.append((cand, measure(study, cand, gate)))
        measured.append((study, results))
    table = decide(measured, min_speedup=min_speedup, threshold=threshold, gate=gate,
                   margin=margin)
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    idents = {fam: identity(fam) for fam in table["family"].unique()} if len(table) else {}
    for col in IDENTITY_COLUMNS:
        if col == "measured_at":
            table[col] = now
        else:
            table[col] = [idents[f].get(col, "") for f in table["family"]]
    return table


def _require_gpu() -> None:
    from .errors import NoGPUError

    try:
        import torch

        ok = torch.cuda.is_available()
    except ImportError:
        ok = False
    if not ok:
        raise NoGPUError("rank re-measures candidates and needs a CUDA or ROCm GPU; none is "
                         "visible here")


# ------------------------------------------------------------------------------------- outputs
def write(table: pd.DataFrame, out_dir: str | Path = VERDICTS_DIR, name: str = "verdicts"
          ) -> tuple[Path, Path]:
    """Write <out_dir>/<name>.parquet and .md atomically; returns both paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    parquet = out_dir / f"{name}.parquet"
    md = out_dir / f"{name}.md"
    write_parquet(table, parquet)
    tmp = md.with_suffix(".md.tmp")
    tmp.write_text(markdown(table))
    tmp.replace(md)
    return parquet, md


def read(path: str | Path) -> pd.DataFrame:
    table = read_parquet(path, "verdict table", " (run `tuner rank` first)")
    missing = [c for c in VERDICT_COLUMNS if c not in table.columns]
    if missing:
        raise TunerError(f"{path} is not a verdict table (lacks {', '.join(missing)})")
    return table


def _f(x: float, fmt: str) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def markdown(table: pd.DataFrame) -> str:
    """The verdict table as markdown: the DESIGN.md columns, ranked."""
    lines = [
        "| # | shape | family | config | baseline (kernel) | baseline µs | candidate µs | "
        "speedup [low, high] | parity | saving µs/call | calls/step | hit rate | saving µs/token | "
        "share of step | decision | reason |",
        "|---|---|---|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in table.itertuples(index=False):
        speed = ("" if math.isnan(r.speedup) else
                 f"{r.speedup:.3f}x [{r.speedup_low:.3f}, {r.speedup_high:.3f}]")
        lines.append(
            f"| {r.rank or ''} | {r.shape} | {r.family} | {f'`{r.config}`' if r.config else ''} | "
            f"{_baseline_cell(r)} | {_f(r.baseline_us, '.2f')} | "
            f"{_f(r.candidate_us, '.2f')} | {speed} | {r.parity} | "
            f"{_f(r.saving_us_per_call, '.2f')} | {_f(r.calls_per_step, '.1f')} | "
            f"{_f(r.hit_rate, '.2f')} | {_f(r.saving_us_per_token, '.2f')} | "
            f"{_pct(r.share_of_step) if not math.isnan(r.share_of_step) else ''} | "
            f"{r.decision} | {r.reason} |")
    return "\n".join(lines) + "\n"


def _baseline_cell(row) -> str:
    """'torch.compile max-autotune: `triton_tem_fused_mm_0`' (tables before these columns:
    'eager')."""
    path = getattr(row, BASELINE_PATH, None) or "eager"
    kernel = getattr(row, BASELINE_KERNEL, None)
    return f"{path}: `{kernel}`" if isinstance(kernel, str) and kernel else str(path)


def summary_lines(table: pd.DataFrame, limit: int = 20) -> list[str]:
    """The ranking as short printable lines: winners with µs/token, rejected with reasons."""
    out = []
    accepted = table[table["decision"] == ACCEPT]
    if accepted.empty:
        out.append("no candidate passed every gate")
    else:
        total = accepted["saving_us_per_token"].sum()
        out.append(f"{len(accepted)} shape(s) with a winning config, projected "
                   f"{total:.2f} us/token saved in total:")
        for r in accepted.head(limit).itertuples(index=False):
            if r.bitwise_vs_baseline:
                out.append(f"  #{r.rank} {r.family} {r.shape}: BITWISE EQUAL TO THE SERVING PATH "
                           f"(the model computes exactly what it computed before)")
            out.append(f"  #{r.rank} {r.family} {r.shape}: {r.speedup:.3f}x "
                       f"[{r.speedup_low:.3f}, {r.speedup_high:.3f}] over {_baseline_cell(r)}, "
                       f"{r.baseline_us:.2f} -> {r.candidate_us:.2f} us x "
                       f"{r.calls_per_step:g}/step = {r.saving_us_per_token:.2f} us/token "
                       f"({_pct(r.share_of_step)} of the step); parity {r.parity}")
    rejected = table[table["decision"] == REJECT]
    if not rejected.empty:
        out.append(f"{len(rejected)} candidate(s) rejected:")
        for r in rejected.head(limit).itertuples(index=False):
            out.append(f"  {r.family} {r.shape} {r.config}: {r.reason}")
        if len(rejected) > limit:
            out.append(f"  ... and {len(rejected) - limit} more (see the verdict table)")
    runners = int((table["decision"] == RUNNER_UP).sum())
    if runners:
        out.append(f"{runners} runner-up candidate(s) also passed (see the verdict table)")
    return out
