"""The A/B verdict: pure functions over a recorded measurement (no GPU, no I/O).

Timing. Each arm's step time is the median of its group medians. The speedup is the median of
the per-group ratios baseline / tuned, with a bootstrap interval; the A/A arm gives the noise
floor: its per-group ratios baseline / aa should be 1, and the largest deviation of any group is
the margin the speedup's lower bound must clear (a bootstrap over groups alone is too narrow: an
A/A run on the H200 gave 1.0017 with a ±0.0004 interval).

Outputs. With random weights near-tied logits flip even between two runs of the same path, so a
free-running greedy decode diverges early and at random; its first divergence is reported, but
the gate is teacher-forced: every arm is fed the fp32 reference's tokens, and at each step its
logits are compared with the reference's. The tuned arm is within the floor when its worst logits
error is at most `margin` (the parity margin, 1.25) times the baseline arm's, and its top-1
agreement with the reference is no lower than the baseline's by more than the A/A arm's own
difference, or than two standard errors of the difference of two agreement rates over the
compared tokens (at least two tokens): a smaller difference is what another, equally accurate
rounding gives on near-tied logits.

Exit code: 0 when the tuned arm is faster beyond the A/A margin with outputs within the floor;
3 when it is slower (or not faster beyond the margin), its outputs are beyond the floor, or the
measurement crashed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from ..parity import DEFAULT_MARGIN
from ..shapetable import attribution_key
from ..timing import bootstrap_median_interval, median, spread_pct

__all__ = ["ABVerdict", "EXIT_FAIL", "EXIT_PASS", "attribution_rows", "decide", "markdown",
           "moe_calls", "paired_moe_keys", "summary_lines"]

EXIT_PASS, EXIT_FAIL = 0, 3


@dataclass
class ABVerdict:
    label: str
    arms: dict  # name -> {"median_us", "spread_pct", "groups"}
    speedup: float = math.nan  # baseline / tuned, median of per-group ratios
    speedup_low: float = math.nan
    speedup_high: float = math.nan
    aa_ratio: float = math.nan  # baseline / aa, median of per-group ratios
    aa_margin: float = math.nan  # largest |baseline / aa - 1| of any group
    faster: bool = False
    saving_us: float = math.nan  # baseline - tuned step time
    projected_us: float = math.nan  # the export's projected saving for the shapes served
    outputs: dict = field(default_factory=dict)
    outputs_ok: bool = False
    crashed: str = ""
    reasons: list = field(default_factory=list)
    attribution: list = field(default_factory=list)
    residual: dict = field(default_factory=dict)
    serving: dict = field(default_factory=dict)
    step_mode: str = "eager"  # how the decode step ran before capture: eager / torch.compile
    baseline: str = "eager"  # the step baseline (tuner.baselines.BASELINES) the arms ran
    # the step the tuned arm ran the export under (tuner ab --tuned-step) and its words; the
    # baseline's unless it was given
    tuned_step: str = "eager"
    tuned_step_mode: str = "eager"
    attention_baseline: str = ""  # the grouped SDPA form the baseline's decode attention ran
    # transformers' own attention (repeat_kv copy, then SDPA) timed beside a grouped-SDPA
    # baseline: {"median_us", "over_baseline_us"}; context, never counted as a tuner saving
    context: dict = field(default_factory=dict)
    # how the export's projected savings were measured (rank's baseline_path per entry used)
    projection_baselines: list = field(default_factory=list)
    # the linears' physical ceiling: the baseline step with every attributed linear shape at its
    # floor (bytes / bandwidth, flops / rate, the kernel floor) on `floor_profile`
    ceiling_step_us: float = math.nan
    floor_profile: str = ""
    # the kernels outside the attributed shapes whose time changed most (other_kernel_changes)
    other_kernels: list = field(default_factory=list)

    @property
    def ceiling_speedup(self) -> float:
        """The most any linear kernel could give this step: baseline / ceiling step."""
        base = (self.arms.get("baseline") or {}).get("median_us", math.nan)
        if not (math.isfinite(self.ceiling_step_us) and self.ceiling_step_us > 0):
            return math.nan
        return base / self.ceiling_step_us

    @property
    def linear_saving_us(self) -> float:
        """What the linears saved: the measured saving of the attributed linear shapes (those
        with a floor); NaN (null in JSON) when the attribution has none."""
        rows = [r for r in self.attribution
                if math.isfinite(float(r.get("floor_us", math.nan)))
                and math.isfinite(float(r.get("measured_saving_us", math.nan)))]
        if not rows:
            return math.nan
        return sum(float(r["measured_saving_us"]) for r in rows)

    @property
    def ceiling_reached(self) -> float:
        """The linears' measured saving as a share of their headroom (baseline - ceiling step).
        Attention and the other kernels are outside that headroom: counting the whole step's
        saving gave 298% for the eager Qwen3-8B batch-32 step with decode attention served."""
        base = (self.arms.get("baseline") or {}).get("median_us", math.nan)
        headroom = base - self.ceiling_step_us
        if not (math.isfinite(headroom) and headroom > 0):
            return math.nan
        return self.linear_saving_us / headroom

    @property
    def step_projected_us(self) -> float:
        """The projection against this step's own baseline kernels: over the shapes the export
        projects, the baseline arm's kernel time in the step minus the candidates' time as rank
        timed them alone. Where it is near the measured saving and the projection is not, the
        projection's error is the baseline's: its kernels ran otherwise in this step than rank
        timed them (another max-autotune draw, work fused into them, another L2 state)."""
        rows = _alone_rows(self.attribution)
        if not rows:
            return math.nan
        return sum(float(r["baseline_us"]) - float(r["alone_tuned_us"]) for r in rows)

    @property
    def measured_over_step_projected(self) -> float:
        if not (math.isfinite(self.step_projected_us) and self.step_projected_us > 0):
            return math.nan
        return self.saving_us / self.step_projected_us

    @property
    def exit_code(self) -> int:
        return EXIT_PASS if (self.faster and self.outputs_ok and not self.crashed) else EXIT_FAIL

    @property
    def measured_over_projected(self) -> float:
        if not (self.projected_us and self.projected_us > 0):
            return math.nan
        return self.saving_us / self.projected_us

    def to_json(self) -> dict:
        data = asdict(self)
        data["exit_code"] = self.exit_code
        data["measured_over_projected"] = self.measured_over_projected
        data["step_projected_us"] = self.step_projected_us
        data["measured_over_step_projected"] = self.measured_over_step_projected
        data["ceiling_speedup"] = self.ceiling_speedup
        data["ceiling_reached"] = self.ceiling_reached
        data["linear_saving_us"] = self.linear_saving_us
        return _finite(data)


def _finite(value):
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def first_divergence(tokens: list, other: list) -> int | None:
    """The first decode step (1-based) where two greedy token sequences differ, None if never."""
    for i, (a, b) in enumerate(zip(tokens, other)):
        if a != b:
            return i + 1
    return None


def _timing(verdict: ABVerdict, group_us: dict) -> None:
    for name, groups in group_us.items():
        verdict.arms[name] = {"median_us": median(groups), "spread_pct": spread_pct(groups),
                              "groups": list(groups)}
    base, tuned, aa = (group_us.get(k) for k in ("baseline", "tuned", "aa"))
    if base and tuned:
        ratios = [b / t for b, t in zip(base, tuned) if t > 0]
        verdict.speedup = median(ratios)
        verdict.speedup_low, verdict.speedup_high = bootstrap_median_interval(ratios)
        verdict.saving_us = verdict.arms["baseline"]["median_us"] - verdict.arms["tuned"]["median_us"]
    if base and aa:
        aa_ratios = [b / a for b, a in zip(base, aa) if a > 0]
        verdict.aa_ratio = median(aa_ratios)
        verdict.aa_margin = max(abs(r - 1.0) for r in aa_ratios)
    if math.isfinite(verdict.speedup_low) and math.isfinite(verdict.aa_margin):
        verdict.faster = verdict.speedup_low > 1.0 + verdict.aa_margin
        if not verdict.faster:
            verdict.reasons.append(
                f"not faster beyond the A/A margin: {verdict.speedup:.4f}x, lower bound "
                f"{verdict.speedup_low:.4f} <= 1 + {verdict.aa_margin:.4f}")


def _context(verdict: ABVerdict) -> None:
    """transformers' own attention path beside the grouped baseline: what its repeat_kv copies
    cost the step (a saving the tuned arm does not claim)."""
    arm = verdict.arms.get("repeat_kv")
    base = verdict.arms.get("baseline")
    if arm and base:
        verdict.context = {"median_us": arm["median_us"],
                           "over_baseline_us": arm["median_us"] - base["median_us"]}


def _outputs(verdict: ABVerdict, data: dict, margin: float) -> None:
    outputs = data.get("outputs") or {}
    free = outputs.get("free_running") or {}
    forced = outputs.get("teacher_forced") or {}
    reference = data.get("reference_tokens")
    base_tokens = free.get("baseline")
    report: dict = {"free_running": {}, "teacher_forced": {}}
    for name, tokens in free.items():
        report["free_running"][name] = {
            "first_divergence_vs_baseline": (first_divergence(tokens, base_tokens)
                                             if name != "baseline" and base_tokens else None),
            "first_divergence_vs_reference": (first_divergence(tokens, reference)
                                              if reference else None)}
    for name, rec in forced.items():
        errors = [e if e is not None else math.inf for e in rec["error"]]
        report["teacher_forced"][name] = {"max_error": max(errors) if errors else math.nan,
                                          "agreement": (sum(rec["agreement"]) / len(rec["agreement"])
                                                        if rec["agreement"] else math.nan)}
    verdict.outputs = report
    tf = report["teacher_forced"]
    if not {"baseline", "tuned"} <= set(tf):
        verdict.outputs_ok = False
        verdict.reasons.append("outputs not compared: no fp32 reference (run with --reference)")
        return
    settings = data.get("settings") or {}
    tokens = max(1, int(settings.get("steps", 1)) * int(settings.get("batch", 1)))
    aa_gap = abs(tf.get("aa", tf["baseline"])["agreement"] - tf["baseline"]["agreement"])
    # two standard errors of the difference of two agreement rates over `tokens` tokens: a
    # smaller difference is what any other equally accurate rounding gives on near-tied logits
    p = min(max(tf["baseline"]["agreement"], 0.0), 1.0)
    sampling = 2.0 * math.sqrt(2.0 * p * (1.0 - p) / tokens)
    floor = max(2.0 / tokens, aa_gap, sampling)
    base_err, tuned_err = tf["baseline"]["max_error"], tf["tuned"]["max_error"]
    error_ratio = tuned_err / base_err if base_err > 0 else (1.0 if tuned_err == 0 else math.inf)
    report["error_ratio"] = error_ratio
    report["agreement_floor"] = floor
    ok_error = error_ratio <= margin
    ok_tokens = tf["tuned"]["agreement"] >= tf["baseline"]["agreement"] - floor
    verdict.outputs_ok = ok_error and ok_tokens
    if not ok_error:
        verdict.reasons.append(f"logits error {tuned_err:.3g} is {error_ratio:.2f}x the baseline "
                               f"arm's {base_err:.3g} (> {margin:g}x)")
    if not ok_tokens:
        verdict.reasons.append(
            f"top-1 agreement with the fp32 reference {tf['tuned']['agreement']:.3f} < baseline "
            f"{tf['baseline']['agreement']:.3f} - floor {floor:.3f}")


def paired_moe_keys(tables: dict) -> set:
    """The attribution keys of the MoE calls both the baseline and the tuned arm's harvested
    tables have rows of. A MoE call is attributed only so: the tuned arm's tuner::moe call has
    a row, a compiled baseline's grouped-mm templates have none (docs/harvest.md), and
    a row in one arm only would move its time from 'other kernels' into the attributed shapes
    of that arm alone."""
    keys = [{attribution_key(r) for r in tables.get(arm) or () if r.get("family") == "moe"}
            for arm in ("baseline", "tuned")]
    return keys[0] & keys[1]


def attribution_rows(tables: dict, projected: dict, step_us: dict | None = None,
                     floors: dict | None = None, alone: dict | None = None) -> tuple[list, dict]:
    """Per shape (m, n, k): each arm's kernel time per step and kernels per call (from the
    harvested graph replays of the arms), the measured and the projected saving.

    `tables`: arm -> list of ShapeTable rows as dicts (op, family, m, n, k, calls_per_step,
    us_per_call, kernels, step_gpu_us); `projected`: 'm=..,n=..,k=..' -> projected saving µs per
    step; `step_us`: arm -> its timed step (median of the timed replays; the profiled replays'
    wall time carries the profiler's own cost, so it is not used); `alone`: shape -> the
    baseline's and the candidate's µs per step as rank timed them alone ({"baseline_us",
    "candidate_us"}: tuner.ab.projected_savings), kept as alone_baseline_us / alone_tuned_us.
    Returns (rows, residual) with
    residual: the timed step difference split into the attributed shapes' kernels, the other
    kernels (GPU-busy time outside them) and idle / launch gaps (timed step - GPU-busy time).
    MoE calls are attributed where both arms have rows of them (paired_moe_keys); elsewhere
    their time stays in the other kernels."""
    per: dict = {}
    totals: dict = {}
    moe_keys = paired_moe_keys(tables)
    for arm, rows in tables.items():
        busy = wall = math.nan
        attributed = 0.0
        for r in rows:
            if r.get("phase") not in (None, "decode", "other"):
                continue
            busy, wall = r.get("step_gpu_us", busy), r.get("step_us", wall)
            key = attribution_key(r)
            if r.get("family") == "moe" and key not in moe_keys:
                continue
            us = float(r.get("us_per_call") or 0.0) * float(r.get("calls_per_step") or 0.0)
            kernels = [k for k in str(r.get("kernels") or "").split("; ") if k]
            slot = per.setdefault(key, {}).setdefault(arm, {"us_per_step": 0.0, "calls": 0.0,
                                                            "kernels": set()})
            slot["us_per_step"] += us
            slot["calls"] += float(r.get("calls_per_step") or 0.0)
            slot["kernels"].update(kernels)
            attributed += us
        totals[arm] = {"busy_us": busy, "wall_us": wall, "attributed_us": attributed}
    rows = []
    for key, arms in per.items():
        base, tuned = arms.get("baseline"), arms.get("tuned")
        measured = (base["us_per_step"] - tuned["us_per_step"]) if base and tuned else math.nan
        proj = projected.get(key, math.nan)
        rows.append({
            "shape": key, "calls_per_step": (base or tuned)["calls"],
            "baseline_us": base["us_per_step"] if base else math.nan,
            "tuned_us": tuned["us_per_step"] if tuned else math.nan,
            "baseline_kernels": sorted(base["kernels"]) if base else [],
            "tuned_kernels": sorted(tuned["kernels"]) if tuned else [],
            "unfused": _unfused(base, tuned) if key.startswith("m=") else [],
            "measured_saving_us": measured, "projected_saving_us": proj,
            "alone_baseline_us": (alone or {}).get(key, {}).get("baseline_us", math.nan),
            "alone_tuned_us": (alone or {}).get(key, {}).get("candidate_us", math.nan),
            "floor_us": (floors or {}).get(key, math.nan)})
    rows.sort(key=lambda r: -(r["baseline_us"] if math.isfinite(r["baseline_us"]) else 0.0))
    residual = {}
    if "baseline" in totals and "tuned" in totals:
        b, t = totals["baseline"], totals["tuned"]
        wall_b = (step_us or {}).get("baseline", b["wall_us"])
        wall_t = (step_us or {}).get("tuned", t["wall_us"])
        residual = {
            "attributed_kernels_us": b["attributed_us"] - t["attributed_us"],
            "other_kernels_us": (b["busy_us"] - b["attributed_us"]) - (t["busy_us"] - t["attributed_us"]),
            "idle_and_launch_gaps_us": (wall_b - b["busy_us"]) - (wall_t - t["busy_us"]),
            "baseline_gpu_busy_us": b["busy_us"], "tuned_gpu_busy_us": t["busy_us"],
            "baseline_step_us": wall_b, "tuned_step_us": wall_t}
    return rows, residual


def _unfused(base: dict | None, tuned: dict | None) -> list[str]:
    """What the baseline step's kernels of a linear shape ('m=..,n=..,k=..' rows only: not
    attention or MoE) computed besides its matmul and the
    tuned step's do not (tuner.harvest.fused_neighbours): work the tuned step runs elsewhere."""
    from ..harvest import fused_neighbours

    if not base or not tuned:
        return []
    kept = fused_neighbours(tuned["kernels"])
    return [w for w in fused_neighbours(base["kernels"]) if w not in kept]


def unfused_line(v: "ABVerdict") -> str:
    """One sentence on the linears whose baseline kernels fused neighbours the tuned step runs
    apart (the attribution's 'unfused'), or ''."""
    parts = [f"{r['shape']} ({', '.join(r['unfused'])})" for r in v.attribution
             if r.get("unfused")]
    if not parts:
        return ""
    return ("the baseline's kernels of " + "; ".join(parts) + " also computed that work, which "
            "the tuned step runs in kernels of its own (an exported linear is opaque to the "
            "compiler): it is among the other kernels, and no per-shape projection counts it")


OTHER_KERNELS_SHOWN = 8


def other_kernel_changes(kernels: dict, attribution: list, top: int = OTHER_KERNELS_SHOWN) -> list:
    """The kernels outside the attributed shapes whose time per step changed most between the
    baseline and the tuned arm: where "other kernels" in the residual went.

    `kernels`: arm -> {kernel name: (µs per step, launches per step)} of its profiled replays
    (tuner.harvest.kernel_totals); `attribution`: attribution_rows' rows, whose kernels (per
    arm) are left out. A kernel name only one arm runs (a fusion one arm's compile made and the
    other's did not) is a change from or to zero. Returns at most `top` rows
    {kernel, baseline_us, tuned_us, change_us (tuned - baseline), baseline_launches,
    tuned_launches}, the largest |change| first."""
    base, tuned = kernels.get("baseline"), kernels.get("tuned")
    if not base or not tuned:
        return []
    skip = {"baseline": {k for r in attribution for k in r.get("baseline_kernels") or ()},
            "tuned": {k for r in attribution for k in r.get("tuned_kernels") or ()}}
    base = {k: v for k, v in base.items() if k not in skip["baseline"]}
    tuned = {k: v for k, v in tuned.items() if k not in skip["tuned"]}
    rows = []
    for name in set(base) | set(tuned):
        b_us, b_n = base.get(name, (0.0, 0.0))
        t_us, t_n = tuned.get(name, (0.0, 0.0))
        rows.append({"kernel": name, "baseline_us": b_us, "tuned_us": t_us,
                     "change_us": t_us - b_us, "baseline_launches": b_n, "tuned_launches": t_n})
    rows.sort(key=lambda r: (-abs(r["change_us"]), r["kernel"]))
    return rows[:top]


def _short(name: str, width: int = 96) -> str:
    return name if len(name) <= width else name[:width - 1] + "…"


def _ceiling(verdict: ABVerdict) -> None:
    """The baseline step with every attributed linear shape (rows with a floor) at its floor."""
    base = (verdict.arms.get("baseline") or {}).get("median_us", math.nan)
    rows = [r for r in verdict.attribution
            if math.isfinite(r.get("floor_us", math.nan)) and math.isfinite(r["baseline_us"])]
    if rows and math.isfinite(base):
        verdict.ceiling_step_us = base - sum(max(r["baseline_us"] - r["floor_us"], 0.0)
                                             for r in rows)


def decide(data: dict | None, *, label: str, crashed: str = "", tables: dict | None = None,
           projected: dict | None = None, margin: float = DEFAULT_MARGIN,
           floors: dict | None = None, floor_profile: str = "",
           projection_baselines: list | None = None, kernels: dict | None = None,
           alone: dict | None = None) -> ABVerdict:
    """The verdict of one A/B from its recorded measurement (module docstring). `floors` (shape
    -> floor µs per step, see attribution_rows) give the linears' ceiling; it informs, it does
    not decide. `projection_baselines`: how the export's savings behind the projection were
    measured (rank's baseline_path of each entry used). `kernels` (arm -> kernel totals of its
    profiled replays) name where the other kernels' time went (other_kernel_changes). `alone`
    (shape -> rank's alone timings per step, attribution_rows) splits the projection's error
    into the baseline's and the candidates' (projection_split)."""
    verdict = ABVerdict(label=label, arms={}, crashed=crashed)
    if crashed or data is None:
        verdict.reasons.append(f"crashed: {crashed or 'no measurement'}")
        return verdict
    settings = data.get("settings") or {}
    backend = settings.get("compile") or ""
    verdict.baseline = data.get("baseline") or settings.get("baseline") or (
        "compile" if backend else "eager")
    verdict.tuned_step = data.get("tuned_step") or verdict.baseline
    verdict.step_mode = step_words(verdict.baseline, backend)
    verdict.tuned_step_mode = step_words(verdict.tuned_step, backend)
    verdict.attention_baseline = (data.get("attention_baseline") or {}).get("form") or ""
    verdict.serving = data.get("serving") or {}
    _timing(verdict, data.get("group_us") or {})
    _context(verdict)
    _outputs(verdict, data, margin)
    if tables:
        timed = {name: arm["median_us"] for name, arm in verdict.arms.items()}
        verdict.attribution, verdict.residual = attribution_rows(tables, projected or {}, timed,
                                                                 floors, alone)
        if floors:
            verdict.floor_profile = floor_profile
            _ceiling(verdict)
    if kernels:
        verdict.other_kernels = other_kernel_changes(kernels, verdict.attribution)
    if projected:
        verdict.projected_us = sum(v for v in projected.values() if math.isfinite(v))
    verdict.projection_baselines = sorted(set(projection_baselines or ()))
    return verdict


def step_words(step: str, backend: str) -> str:
    """How a step ran, in words: eager, or torch.compile'd in a mode (tuner.baselines)."""
    backend = backend or "inductor"
    return {"compile": f"torch.compile ({backend})",
            "max-autotune": f"torch.compile max-autotune ({backend}, without Inductor's CUDA "
                            f"graphs)"}.get(step, "eager")


def _tuned_words(v: ABVerdict) -> str:
    """'' when the tuned arm ran the baseline's step, else what it ran, for the headers."""
    return "" if v.tuned_step == v.baseline else (
        f"; the tuned arm: the export under {v.tuned_step_mode}")


# ------------------------------------------------------------------------------------ printing
def moe_calls(serving: dict) -> int:
    """How many calls the tuned arm ran through tuner.moe (serving: the arm's hits)."""
    return int(sum(((serving or {}).get("hits") or {}).get("moe", {}).values()))


def _ceiling_moe_words(v: ABVerdict) -> str:
    """'; linears only: ...' where the tuned arm ran tuner.moe: the ceiling of linear tuning
    leaves out the MoE calls (not attributed per shape), so the step may beat it."""
    calls = moe_calls(v.serving)
    if not calls:
        return ""
    return (f"; linears only: the {calls} tuner.moe calls of the tuned arm are not in it, and "
            f"their saving can take the step past it")


def _f(value, fmt: str) -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) \
        else format(value, fmt)


def summary_lines(v: ABVerdict) -> list[str]:
    out = [f"A/B {v.label} (baseline {v.baseline}: the step {v.step_mode}{_tuned_words(v)}, "
           f"one CUDA/HIP graph"
           + (f"; decode attention {v.attention_baseline} on the grouped cache"
              if v.attention_baseline else "") + ")"]
    if v.crashed:
        out.append(f"  CRASHED: {v.crashed}")
        out.append("  verdict: FAIL (exit 3)")
        return out
    for name in ("baseline", "tuned", "aa", "repeat_kv"):
        arm = v.arms.get(name)
        if arm:
            out.append(f"  {name:<8} {arm['median_us']:10.1f} us/step  (±{arm['spread_pct']:.2f}% "
                       f"over {len(arm['groups'])} groups)")
    out.append(f"  speedup  {_f(v.speedup, '.4f')}x [{_f(v.speedup_low, '.4f')}, "
               f"{_f(v.speedup_high, '.4f')}]; A/A {_f(v.aa_ratio, '.4f')}x, margin "
               f"±{_f(v.aa_margin, '.4f')}")
    out.append(f"  saving   {_f(v.saving_us, '.1f')} us/step measured, "
               f"{_f(v.projected_us, '.1f')} projected (measured/projected "
               f"{_f(v.measured_over_projected, '.2f')})" + _projection_note(v))
    split = projection_split(v, "us")
    if split:
        out.append(f"  split    {split}")
    if v.context:
        out.append(f"  context  transformers' own attention (repeat_kv copy, then SDPA) "
                   f"{v.context['median_us']:.1f} us/step, {v.context['over_baseline_us']:+.1f} us "
                   f"against the grouped baseline: not counted as a tuner saving")
    tf = (v.outputs or {}).get("teacher_forced") or {}
    if tf:
        parts = [f"{n} err {_f(r['max_error'], '.2e')} agree {_f(r['agreement'], '.3f')}"
                 for n, r in tf.items()]
        out.append("  outputs  teacher-forced vs fp32 reference: " + "; ".join(parts))
    fr = (v.outputs or {}).get("free_running") or {}
    if fr:
        parts = [f"{n} vs baseline {r['first_divergence_vs_baseline'] or 'never'}, vs reference "
                 f"{r['first_divergence_vs_reference'] or 'never'}" for n, r in fr.items()]
        out.append("  greedy   first divergence (step): " + "; ".join(parts))
    if math.isfinite(v.ceiling_step_us):
        out.append(f"  ceiling  every linear at its floor: {v.ceiling_step_us:.1f} us/step, "
                   f"{_f(v.ceiling_speedup, '.4f')}x at most; the linears saved "
                   f"{_f(v.linear_saving_us, '.1f')} us of it, {_f(100 * v.ceiling_reached, '.0f')}% "
                   f"({v.floor_profile}){_ceiling_moe_words(v)}")
    for row in v.attribution[:12]:
        out.append(f"    {row['shape']:<40} x{row['calls_per_step']:<5g} base "
                   f"{_f(row['baseline_us'], '8.1f')} tuned {_f(row['tuned_us'], '8.1f')} us/step, "
                   f"saved {_f(row['measured_saving_us'], '7.1f')} (projected "
                   f"{_f(row['projected_saving_us'], '.1f')})")
    unfused = unfused_line(v)
    if unfused:
        out.append(f"  unfused  {unfused}")
    if v.residual:
        r = v.residual
        out.append(f"  residual attributed shapes {_f(r['attributed_kernels_us'], '.1f')} us, other "
                   f"kernels {_f(r['other_kernels_us'], '.1f')} us, idle/launch gaps "
                   f"{_f(r['idle_and_launch_gaps_us'], '.1f')} us")
    if v.other_kernels:
        out.append("  other kernels, the largest changes (us/step tuned - baseline; launches/step "
                   "baseline -> tuned):")
        for k in v.other_kernels:
            out.append(f"    {k['change_us']:+8.1f}  {k['baseline_launches']:g} -> "
                       f"{k['tuned_launches']:g}  {_short(k['kernel'])}")
    draw = draw_note(v)
    if draw:
        out.append(f"  note     {draw}")
    verdict = "PASS (exit 0)" if v.exit_code == EXIT_PASS else "FAIL (exit 3)"
    out.append(f"  verdict: {verdict}" + (": " + "; ".join(v.reasons) if v.reasons else ""))
    return out


def _sentence(text: str) -> str:
    """A summary clause as a sentence of ab.md: capital first letter, full stop."""
    return f"{text[0].upper()}{text[1:]}."


def draw_note(v: ABVerdict) -> str:
    """Where a max-autotune compile is in the A/B: its kernels were picked by timing them at
    compile time, so another process may compile the same step to other kernels (the A/A arm
    shares the baseline's compile and cannot show it); '' otherwise."""
    if "max-autotune" not in (v.baseline, v.tuned_step):
        return ""
    return ("max-autotune picks its kernels by timing them while it compiles: this figure is one "
            "draw of the compile, which the A/A margin does not cover; repeat it in a fresh "
            "process (TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 for a new draw) before quoting it "
            "(docs/ab.md)")


def _alone_rows(attribution: list) -> list:
    """The attribution rows the projection split reads: both arms timed in the step and both
    timed alone by rank (the shapes the export projects)."""
    return [r for r in attribution
            if all(math.isfinite(float(r.get(f, math.nan)) if r.get(f) is not None else math.nan)
                   for f in ("alone_baseline_us", "alone_tuned_us", "baseline_us", "tuned_us"))]


def projection_split(v: ABVerdict, unit: str = "µs") -> str:
    """Where the projection's error lies, from the shapes it projects: their baseline kernels in
    this step against rank's alone timings of the baseline, their tuned kernels in this step
    against rank's alone timings of the candidates, and the saving projected against this
    step's own baseline kernels (ABVerdict.step_projected_us); '' without such shapes."""
    rows = _alone_rows(v.attribution)
    if not rows:
        return ""
    base = sum(float(r["baseline_us"]) for r in rows)
    base_alone = sum(float(r["alone_baseline_us"]) for r in rows)
    tuned = sum(float(r["tuned_us"]) for r in rows)
    tuned_alone = sum(float(r["alone_tuned_us"]) for r in rows)
    return (f"the projected shapes' baseline kernels took {base:.1f} {unit} a step here against "
            f"{base_alone:.1f} as rank timed them alone, their tuned kernels {tuned:.1f} against "
            f"{tuned_alone:.1f}; against this step's own baseline kernels the export projects "
            f"{v.step_projected_us:.1f} {unit} (measured/projected "
            f"{_f(v.measured_over_step_projected, '.2f')})")


def _projection_note(v: ABVerdict) -> str:
    """Where the export's savings were measured against another baseline than this A/B's."""
    paths = [p for p in v.projection_baselines if p]
    if not paths or not math.isfinite(v.projected_us):
        return ""
    return f"; projected from savings rank measured against: {', '.join(paths)}"


def markdown(v: ABVerdict) -> str:
    lines = [f"# A/B: {v.label}", "", f"Baseline: **{v.baseline}**. Decode step: {v.step_mode}, "
             f"captured as one CUDA/HIP graph."
             + (f" Tuned arm: the export under {v.tuned_step_mode}."
                if v.tuned_step != v.baseline else "")
             + (f" Decode attention of the baseline arms: {v.attention_baseline} on the grouped "
                f"KV cache." if v.attention_baseline else "")
             + (f" Tuned arm: {v.serving['norms_folded']} decoder-layer RMSNorms folded into the "
                f"projections they feed (tuner.norm_linear), "
                f"{(v.serving or {}).get('residual_adds_fused', 0)} residual adds into the "
                f"kernels of the projections before them (tuner.linear_add; counted in the "
                f"graphs Inductor compiled, not in one its cache served)."
                if (v.serving or {}).get("norms_folded") else ""), ""]
    if v.crashed:
        return "\n".join(lines + [f"**Crashed:** {v.crashed}", "", "Verdict: FAIL (exit 3)", ""])
    lines += ["| arm | µs/step | spread |", "|---|---:|---:|"]
    for name in ("baseline", "tuned", "aa", "repeat_kv"):
        arm = v.arms.get(name)
        if arm:
            lines.append(f"| {name} | {arm['median_us']:.1f} | ±{arm['spread_pct']:.2f}% |")
    lines += ["", f"Speedup {_f(v.speedup, '.4f')}× [{_f(v.speedup_low, '.4f')}, "
              f"{_f(v.speedup_high, '.4f')}], A/A {_f(v.aa_ratio, '.4f')}× (margin "
              f"±{_f(v.aa_margin, '.4f')}). Saving {_f(v.saving_us, '.1f')} µs/step measured, "
              f"{_f(v.projected_us, '.1f')} projected ({_f(v.measured_over_projected, '.2f')})"
              f"{_projection_note(v)}.", ""]
    split = projection_split(v)
    if split:
        lines += [f"Projection split: {_sentence(split)}", ""]
    if v.context:
        lines += [f"Context (not counted as a tuner saving): transformers' own attention path, "
                  f"which copies the grouped KV cache per query head (repeat_kv) before SDPA, "
                  f"takes {v.context['median_us']:.1f} µs/step, "
                  f"{v.context['over_baseline_us']:+.1f} µs against the grouped baseline.", ""]
    if math.isfinite(v.ceiling_step_us):
        lines += [f"Ceiling of linear tuning: with every attributed linear shape at its floor the "
                  f"baseline step would take {v.ceiling_step_us:.1f} µs "
                  f"({_f(v.ceiling_speedup, '.4f')}× at most); the linears saved "
                  f"{_f(v.linear_saving_us, '.1f')} µs of that headroom "
                  f"({_f(100 * v.ceiling_reached, '.0f')}%). Floors on "
                  f"{v.floor_profile}{_ceiling_moe_words(v)}.", ""]
    tf = (v.outputs or {}).get("teacher_forced") or {}
    if tf:
        lines += ["| arm | max logits error vs fp32 | top-1 agreement |", "|---|---:|---:|"]
        for name, r in tf.items():
            lines.append(f"| {name} | {_f(r['max_error'], '.3e')} | {_f(r['agreement'], '.3f')} |")
        lines.append("")
    if v.attribution:
        lines += ["| shape | calls/step | baseline µs | tuned µs | saved µs | projected µs | "
                  "floor µs | kernels (baseline → tuned) |", "|---|---:|---:|---:|---:|---:|---:|---|"]
        for r in v.attribution:
            lines.append(f"| {r['shape']} | {r['calls_per_step']:g} | {_f(r['baseline_us'], '.1f')} | "
                         f"{_f(r['tuned_us'], '.1f')} | {_f(r['measured_saving_us'], '.1f')} | "
                         f"{_f(r['projected_saving_us'], '.1f')} | {_f(r.get('floor_us'), '.1f')} | "
                         f"{len(r['baseline_kernels'])} → {len(r['tuned_kernels'])} |")
        lines.append("")
    if v.residual:
        r = v.residual
        lines.append(f"Residual: attributed shapes {_f(r['attributed_kernels_us'], '.1f')} µs, other "
                     f"kernels {_f(r['other_kernels_us'], '.1f')} µs, idle / launch gaps "
                     f"{_f(r['idle_and_launch_gaps_us'], '.1f')} µs.")
        lines.append("")
    unfused = unfused_line(v)
    if unfused:
        lines += [f"Unfused: {_sentence(unfused)}", ""]
    if v.other_kernels:
        lines += ["Other kernels, the largest changes:", "",
                  "| kernel | baseline µs | tuned µs | change µs | launches (baseline → tuned) |",
                  "|---|---:|---:|---:|---|"]
        for k in v.other_kernels:
            name = _short(k["kernel"]).replace("|", "\\|")
            lines.append(f"| `{name}` | {k['baseline_us']:.1f} | {k['tuned_us']:.1f} | "
                         f"{k['change_us']:+.1f} | {k['baseline_launches']:g} → "
                         f"{k['tuned_launches']:g} |")
        lines.append("")
    draw = draw_note(v)
    if draw:
        lines += [f"Note: {_sentence(draw)}", ""]
    verdict = "PASS (exit 0)" if v.exit_code == EXIT_PASS else "FAIL (exit 3)"
    lines.append(f"Verdict: {verdict}" + (": " + "; ".join(v.reasons) if v.reasons else ""))
    return "\n".join(lines) + "\n"
