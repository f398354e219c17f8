"""The report's sections, each from a `RunData`: budget, plan, search, verdicts, A/B.

Every section function returns (html, card): the section's HTML and the one-line summary shown
at the top of the page. A section whose data are missing says "not run: why" (or "not
available: why") and never raises; charts are drawn when matplotlib imports (`charts_ok`) and
the tables carry every number either way.
"""

from __future__ import annotations

import json
import math
import re

import pandas as pd

from ..shapetable import attribution_key
from ..units import Threshold, parse_threshold
from . import charts
from .html import esc, figure, markdown_table, note, num, pill, section, table

__all__ = ["ab_only", "ab_section", "budget_section", "parse_threshold_text", "plan_section",
           "search_section", "verdicts_section"]

_THRESHOLD = re.compile(r"if ([0-9.eE+-]+) x its headroom >= ([0-9.eE+-]+)(%| us/token)")


def parse_threshold_text(text: str) -> Threshold | None:
    """The Threshold behind budget's `threshold` column ('keep a shape if 0.5 x its headroom >=
    0.5% of the step'), None when the text is not one."""
    match = _THRESHOLD.search(str(text))
    if not match:
        return None
    safety, value, unit = match.groups()
    try:
        return parse_threshold(value + ("%" if unit == "%" else "us"), safety=float(safety))
    except Exception:  # noqa: BLE001 - a text that only looks like one
        return None


def _threshold_us(threshold: Threshold | None, step_us: float) -> float | None:
    if threshold is None:
        return None
    if threshold.us_per_token is not None:
        return threshold.us_per_token
    return threshold.share * step_us if step_us and math.isfinite(step_us) else None


def _chart(make, caption: str, alt: str, charts_ok: bool) -> str:
    if not charts_ok:
        return ""
    return figure(charts.png(make()), caption, alt)


AB_ONLY = ("this folder holds one A/B (`tuner ab`): the budget, the plan, the search and the "
           "verdicts are in the report of the `tuner run` that made the export")


def ab_only(data) -> bool:
    """A folder `tuner ab` wrote: A/Bs and nothing of a run."""
    return bool(data.abs) and data.budget is None and data.plan_md is None \
        and data.verdicts is None and not data.record


def _missing(data, default: str) -> str:
    return AB_ONLY if ab_only(data) else default


def _charts_note(charts_ok: bool, why: str) -> str:
    return "" if charts_ok else note("charts not drawn",
                                     why + "; the tables below have the numbers")


def _run_threshold(data) -> Threshold | None:
    if data.budget is not None and "threshold" in data.budget.columns and len(data.budget):
        return parse_threshold_text(data.budget["threshold"].iloc[0])
    return None


# ----------------------------------------------------------------------------------- budget
def _shape_label(row) -> str:
    from ..budget import describe_shape

    dtype = "" if str(row["dtype"]) == "bfloat16" else f" {row['dtype']}"
    return f"{str(row['op']).removeprefix('aten::')} {describe_shape(row)}{dtype}"


def budget_section(data, charts_ok: bool, charts_why: str) -> tuple[str, str]:
    budget = data.budget
    if budget is None:
        why = data.budget_note or _missing(data, f"no budget.parquet in {data.path}")
        return section("budget", "Budget", note("not run", why)), "not run"
    threshold = _run_threshold(data)
    basis = str(budget["step_basis"].iloc[0]) if "step_basis" in budget.columns else "wall"
    basis_text = "the GPU-busy step (--graph-captured)" if basis == "gpu_busy" else "the wall step"
    profile = str(budget["profile"].iloc[0]) if "profile" in budget.columns else "unknown"
    if "profile_source" in budget.columns and "spec" in str(budget["profile_source"].iloc[0]):
        profile += ": published datasheet peaks, not measured"
    parts = [f"<p>Device profile {esc(profile)}; {esc(budget['threshold'].iloc[0])}, against "
             f"{esc(basis_text)}. Headroom = (baseline − physical floor) µs per call × calls "
             f"per step × hit rate: the most any kernel could save per token.</p>",
             _charts_note(charts_ok, charts_why)]
    phases, phase_rows = [], []
    for phase, rows in budget.groupby("phase", sort=False):
        wall, gpu = float(rows["step_us"].median()), float(rows["step_gpu_us"].median())
        phases.append({"phase": phase, "wall_us": wall, "gpu_us": gpu, "basis": basis})
        busy = gpu / wall if wall > 0 else math.nan
        phase_rows.append([phase, num(wall / 1000, ".2f"), num(gpu / 1000, ".2f"),
                           num(busy * 100, ".1f") + "%", "yes" if busy < 0.6 else "no",
                           int((rows["verdict"] == "keep").sum()),
                           int((rows["verdict"] == "prune").sum())])
    finite = [p for p in phases if p["wall_us"] > 0 and math.isfinite(p["wall_us"])
              and math.isfinite(p["gpu_us"])]
    if finite:
        parts.append(_chart(lambda: charts.step_figure(finite),
                            "The step per phase: wall time and the part the GPU is busy (from "
                            "the trace's step markers). A step busy under 60% is launch-bound "
                            "until graph-captured.", "step time per phase", charts_ok))
    parts.append(table(["phase", "step ms (wall)", "GPU busy ms", "GPU busy", "launch-bound",
                        "kept", "pruned"], phase_rows, numeric={1, 2, 3, 5, 6}))
    for phase, rows in budget.groupby("phase", sort=False):
        step = float(rows["step_basis_us"].median())
        thr = _threshold_us(threshold, step)
        items = [{"label": _shape_label(r), "headroom": float(r["headroom_us_per_token"]),
                  "verdict": str(r["verdict"]),
                  "unjudged": str(r["reason"]).startswith("not budgeted")}
                 for _, r in rows.iterrows()]
        more = f" ({len(items) - charts.MAX_ROWS} smaller rows only in the table)" \
            if len(items) > charts.MAX_ROWS else ""
        parts.append(_chart(
            lambda items=items, thr=thr, phase=phase: charts.budget_figure(
                items, threshold_us=thr, safety=threshold.safety if threshold else 1.0,
                threshold_text=threshold.target() if threshold else "unknown", phase=phase),
            f"{phase}: headroom per shape in µs per token, kept (green) and pruned (grey); the "
            f"line is the threshold the solid part must reach{more}.",
            f"headroom per shape, {phase}", charts_ok))
    rows_html = []
    for _, r in budget.iterrows():
        kind = "good" if r["verdict"] == "keep" else "meh"
        rows_html.append([r["phase"], str(r["op"]).removeprefix("aten::"), _shape_label(r)
                          .split(" ", 1)[1], num(r["calls_per_step"], ".1f"),
                          num(r["floor_us"], ".3g"), num(r["baseline_us"], ".3g"),
                          num(r["headroom_us_per_token"], ".3g"),
                          num(r["headroom_share"] * 100, ".3g") + "%",
                          pill(str(r["verdict"]), kind), r["reason"]])
    parts.append(f"<details><summary>Every shape: {len(budget)} rows with floor, baseline, "
                 f"headroom and the reason</summary>")
    parts.append(table(["phase", "op", "shape", "calls/step", "floor µs", "baseline µs",
                        "headroom µs/token", "share", "verdict", "reason"], rows_html,
                       numeric={3, 4, 5, 6, 7}, raw={8}))
    parts.append("</details>")
    kept = int((budget["verdict"] == "keep").sum())
    return section("budget", "Budget", "".join(parts)), f"{kept} of {len(budget)} shapes kept"


# ------------------------------------------------------------------------------------- plan
def plan_section(data) -> tuple[str, str]:
    if data.plan_md is None:
        if data.plan_note:
            return section("plan", "Search plan", note("not available", data.plan_note)), \
                "not available"
        why = _missing(data, f"no plan.md in {data.path}")
        return section("plan", "Search plan", note("not run", why)), "not run"
    title = next((line.lstrip("# ").strip() for line in data.plan_md.splitlines()
                  if line.startswith("#")), "Search plan")
    header, rows = markdown_table(data.plan_md)
    body = f"<p>{esc(title)}: the shapes the search spends time on, each in proportion to what " \
           f"it could save per token.</p>"
    if not rows:
        body += note("nothing to search", "no shape survives the budget (see its reasons above)")
        return section("plan", "Search plan", body), "no shape to search"
    body += table(header, rows, numeric=set(range(1, len(header))))
    return section("plan", "Search plan", body), f"{len(rows)} shapes to search"


# ----------------------------------------------------------------------------------- search
def _not_searched(data) -> str:
    record = data.record
    if record.get("not_searched"):
        return record["not_searched"]
    if data.verdicts is None:
        return _missing(data, "this run directory has no record of a search (run.json)")
    return ""


def search_section(data, charts_ok: bool, charts_why: str) -> tuple[str, str]:
    damaged = note("run record partly read", data.record_note) if data.record_note else ""
    if not data.studies:
        why = _not_searched(data) if not data.search_note else ""
        box = note("not run", why) if why else note("not available", data.search_note or
                                                    "no study to show")
        return section("search", "Search", damaged + box), "not run" if why else "not available"
    parts = [damaged, f"<p>{len(data.studies)} Optuna studies in "
             f"<code>{esc(data.record.get('storage') or '')}</code>; open them interactively "
             f"with <code>optuna-dashboard {esc(data.record.get('storage') or 'URL')}</code>.</p>",
             _charts_note(charts_ok, charts_why)]
    if data.search_note:
        parts.append(note("partly available", data.search_note))
    rows = []
    for study in data.studies:
        parts.append(_chart(lambda s=study: charts.search_figure(s),
                            f"{study.name}: best time so far against trials measured (left) and "
                            f"against time (right); dashed: the baseline, dotted: the default "
                            f"config.", f"search of {study.shape_key}", charts_ok))
        c, best = study.counts(), study.best()
        rows.append([study.shape_key, c["ok"] + c["mismatch"] + c["failed"], c["ok"],
                     c["mismatch"], c["failed"], num(study.baseline_us), num(study.default_us),
                     num(best.us if best else None),
                     num(study.baseline_us / best.us if best and study.baseline_us else None,
                         ".3f"),
                     num(study.default_us / best.us if best and study.default_us else None,
                         ".3f"),
                     f"<code>{esc(charts.short_config(best.config))}</code>" if best else ""])
    parts.append(table(["shape", "measured", "parity ok", "mismatch", "failed", "baseline µs",
                        "default µs", "best µs", "vs baseline", "vs default", "best config"],
                       rows, numeric=set(range(1, 10)), raw={10}))
    total = sum(sum(s.counts()[k] for k in ("ok", "mismatch", "failed")) for s in data.studies)
    return section("search", "Search", "".join(parts)), \
        f"{len(data.studies)} studies, {total} trials measured"


# --------------------------------------------------------------------------------- verdicts
def _config(text) -> dict:
    try:
        return json.loads(text) if text else {}
    except ValueError:
        return {}


def _yes(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return "yes" if bool(x) else "no"


def verdicts_section(data, charts_ok: bool, charts_why: str) -> tuple[str, str]:
    verdicts = data.verdicts
    if verdicts is None:
        why = (data.verdicts_note or _not_searched(data)
               or _missing(data, f"no verdicts.parquet in {data.path}"))
        return section("verdicts", "Verdicts", note("not run", why)), "not run"
    threshold = _run_threshold(data)
    step = float(pd.to_numeric(verdicts["step_us"], errors="coerce").median()) \
        if len(verdicts) else math.nan
    thr = _threshold_us(threshold, step)
    items = []
    for r in verdicts.itertuples(index=False):
        if not (isinstance(r.saving_us_per_token, float) and math.isfinite(r.saving_us_per_token)):
            continue
        head = (f"#{r.rank} accept" if r.decision == "accept" else
                r.decision if r.decision == "runner-up" else
                "reject: " + str(r.reason).split(":", 1)[0])
        label = f"{r.shape.split(',dtype')[0]} · {charts.short_config(_config(r.config))}"
        items.append({"label": label,
                      "saving": float(r.saving_us_per_token), "decision": r.decision,
                      "note": f"{r.saving_us_per_token:.1f} µs/token  {head}"})
    parts = [f"<p>Each candidate re-measured paired against the baseline and the default "
             f"config; gates in order: parity, speedup lower bound, slower than the default, "
             f"projected saving. Parity gate: "
             f"<b>{esc(', '.join(sorted(set(verdicts['parity_mode']))))}</b>; every row shows "
             f"all three parity facts.</p>",
             _charts_note(charts_ok, charts_why)]
    if items:
        parts.append(_chart(lambda: charts.verdict_figure(
            items, threshold_us=thr, threshold_text=threshold.target() if threshold else "?"),
            "Projected µs saved per token per candidate (accepted, runners-up, rejected with "
            "the gate that stopped it).", "projected saving per candidate", charts_ok))
    rows = []
    for r in verdicts.itertuples(index=False):
        kind = {"accept": "good", "runner-up": "warn"}.get(r.decision, "bad")
        speed = ("" if not math.isfinite(r.speedup) else
                 f"{r.speedup:.3f}× [{r.speedup_low:.3f}, {r.speedup_high:.3f}]")
        facts = (f"{_yes(getattr(r, 'bitwise_vs_baseline', None))} / "
                 f"{_yes(getattr(r, 'bitwise_vs_default', None))}; "
                 f"{num(getattr(r, 'error_vs_reference', None), '.2e')} vs "
                 f"{num(getattr(r, 'baseline_error_vs_reference', None), '.2e')} "
                 f"({num(getattr(r, 'error_ratio', None), '.2f')}×)")
        rows.append([r.rank or "", r.shape.replace(",dtype=bfloat16", ""),
                     f"<code>{esc(charts.short_config(_config(r.config)))}</code>",
                     pill(r.decision, kind), f"{num(r.baseline_us)} → {num(r.candidate_us)}",
                     speed, f"{num(r.saving_us_per_token)} ({num(r.share_of_step * 100, '.2f')}%)",
                     facts, r.reason])
    parts.append(table(["#", "shape (bf16)", "config", "decision", "µs per call",
                        "speedup [low, high]",
                        "µs/token (share)", "parity: bitwise = serving path / = default; "
                        "error vs fp32 (serving path's)", "reason"],
                       rows, numeric={0, 4, 5, 6}, raw={2, 3}))
    accepted = verdicts[verdicts["decision"] == "accept"]
    card = (f"{len(accepted)} accepted of {len(verdicts)}, projected "
            f"{accepted['saving_us_per_token'].sum():.1f} µs/token" if len(accepted)
            else f"none accepted of {len(verdicts)}")
    return section("verdicts", "Verdicts", "".join(parts)), card


# --------------------------------------------------------------------------------------- A/B
def _verdict_projection(verdicts) -> dict:
    """The A/B attribution's call name ('m=..,n=..,k=..', 'attention b=.. h=.. kv=.. d=..') ->
    the µs per token the run's accepted verdicts project for it."""
    out: dict = {}
    if verdicts is None:
        return out
    for r in verdicts[verdicts["decision"] == "accept"].itertuples(index=False):
        key = attribution_key(dict(_config(r.shape_json), family=r.family))
        out[key] = out.get(key, 0.0) + float(r.saving_us_per_token)
    return out


def _with_projection(ab: dict, verdicts) -> tuple[dict, str]:
    """An A/B that recorded no projection, given the run's verdicts' (and a note saying so)."""
    rows = ab.get("attribution") or []
    if ab.get("projected_us") is not None or any(
            r.get("projected_saving_us") is not None for r in rows):
        return ab, ""
    projected = _verdict_projection(verdicts)
    if not projected:
        return ab, ""
    ab = dict(ab, projected_us=sum(projected.values()),
              attribution=[dict(r, projected_saving_us=projected.get(r["shape"])) for r in rows])
    if ab.get("saving_us") is not None:
        ab["measured_over_projected"] = ab["saving_us"] / ab["projected_us"]
    return ab, ("this A/B recorded no projection: the projected savings shown are this run's "
                "accepted verdicts (µs per token per shape)")


def _ab_block(path, ab: dict, charts_ok: bool, verdicts=None) -> str:
    ab, projection_note = _with_projection(ab, verdicts)
    label = ab.get("label") or path.parent.name
    passed = ab.get("exit_code") == 0
    head = (f"<h3>{esc(label)} {pill('PASS' if passed else 'FAIL', 'good' if passed else 'bad')}"
            f"</h3><p><code>{esc(path)}</code></p>")
    if ab.get("crashed"):
        return head + note("crashed", ab["crashed"])
    parts = [head]
    if ab.get("step_mode"):
        tuned = ab.get("tuned_step_mode") if ab.get("tuned_step") not in (None, ab.get(
            "baseline")) else ""
        parts.append(f"<p>Baseline {esc(ab.get('baseline'))}: the step {esc(ab['step_mode'])}"
                     + (f"; the tuned arm: the export under {esc(tuned)}" if tuned else "")
                     + ".</p>")
    if ab.get("reasons"):
        parts.append(note("why it failed", "; ".join(ab["reasons"])))
    if ab.get("arms"):
        parts.append(_chart(lambda: charts.ab_steps_figure(ab),
                            "Step time per arm under CUDA graphs: the A/A arm (baseline again) "
                            "sets the noise floor the speedup's lower bound must clear.",
                            f"A/B step time per arm, {label}", charts_ok))
        arms = [a for a in charts.ARMS if a in ab["arms"]]
        parts.append(table(["arm", "µs per step", "spread", "groups"],
                           [[name, num(ab["arms"][name]["median_us"], ".1f"),
                             f"±{num(ab['arms'][name]['spread_pct'])}%",
                             len(ab["arms"][name]["groups"])] for name in arms],
                           numeric={1, 2, 3}))
    if projection_note:
        parts.append(note("projection", projection_note))
    parts.append(f"<p>Saving {num(ab.get('saving_us'), '.1f')} µs per step measured, "
                 f"{num(ab.get('projected_us'), '.1f')} projected (measured / projected "
                 f"{num(ab.get('measured_over_projected'))})"
                 + (f"; against this step's own baseline kernels (the baseline's kernels in the "
                    f"step, less the candidates as rank timed them alone) "
                    f"{num(ab['step_projected_us'], '.1f')} projected (measured / projected "
                    f"{num(ab.get('measured_over_step_projected'))})"
                    if ab.get("step_projected_us") is not None else "") + ".</p>")
    if ab.get("attribution") or ab.get("saving_us") is not None:
        parts.append(_chart(lambda: charts.ab_saving_figure(ab),
                            "Measured against projected saving: the whole step, then each call "
                            "shape's kernel time per step from the arms' profiled replays.",
                            f"A/B measured vs projected, {label}", charts_ok))
    if ab.get("attribution"):
        parts.append(table(
            ["shape", "calls/step", "baseline µs", "tuned µs", "saved µs", "projected µs",
             "kernels (baseline → tuned)", "fused in the baseline's kernels, not the tuned"],
            [[r["shape"], num(r["calls_per_step"], "g"), num(r["baseline_us"], ".1f"),
              num(r["tuned_us"], ".1f"), num(r["measured_saving_us"], ".1f"),
              num(r["projected_saving_us"], ".1f"),
              f"{len(r.get('baseline_kernels') or [])} → {len(r.get('tuned_kernels') or [])}",
              ", ".join(str(w) for w in r.get("unfused") or [])]
             for r in ab["attribution"]], numeric={1, 2, 3, 4, 5}))
    residual = ab.get("residual") or {}
    if residual:
        parts.append(f"<p>Residual: attributed shapes "
                     f"{num(residual.get('attributed_kernels_us'), '.1f')} µs, "
                     f"other kernels {num(residual.get('other_kernels_us'), '.1f')} µs, idle / "
                     f"launch gaps {num(residual.get('idle_and_launch_gaps_us'), '.1f')} µs.</p>")
    others = [k for k in ab.get("other_kernels") or [] if isinstance(k, dict)]
    if others:
        parts.append("<p>Other kernels, the largest changes:</p>" + table(
            ["kernel", "baseline µs", "tuned µs", "change µs", "launches (baseline → tuned)"],
            [[str(k.get("kernel"))[:110], num(k.get("baseline_us"), ".1f"),
              num(k.get("tuned_us"), ".1f"), num(k.get("change_us"), "+.1f"),
              f"{num(k.get('baseline_launches'), 'g')} → {num(k.get('tuned_launches'), 'g')}"]
             for k in others], numeric={1, 2, 3}))
    outputs = ab.get("outputs") or {}
    tf, fr = outputs.get("teacher_forced") or {}, outputs.get("free_running") or {}
    if tf:
        parts.append(_chart(lambda: charts.ab_tokens_figure(ab),
                            "Outputs against an fp32 reference of the same weights: the tuned "
                            "arm's agreement must stay above the baseline's minus the A/A floor, "
                            "its error within the margin.", f"A/B outputs, {label}", charts_ok))
        rows = []
        for name in [a for a in charts.ARMS if a in tf] + [a for a in tf if a not in charts.ARMS]:
            f = fr.get(name) or {}
            rows.append([name, num(tf[name].get("max_error"), ".3e"),
                         num(tf[name].get("agreement"), ".3f"),
                         f.get("first_divergence_vs_baseline") or "never",
                         f.get("first_divergence_vs_reference") or "never"])
        parts.append(table(["arm", "max logits error vs fp32", "top-1 agreement",
                            "greedy: first divergence vs baseline",
                            "greedy: first divergence vs reference"], rows,
                           numeric={1, 2, 3, 4}))
        parts.append(f"<p>Error ratio tuned / baseline {num(outputs.get('error_ratio'), '.4f')}; "
                     f"agreement floor {num(outputs.get('agreement_floor'), '.3f')}.</p>")
    else:
        parts.append(note("outputs not compared", "no fp32 reference in this A/B (--no-reference)"))
    serving = ab.get("serving") or {}
    if serving.get("status"):
        parts.append(table(["family", "export status", "shapes hit", "shapes missed"],
                           [[fam, status, len((serving.get("hits") or {}).get(fam) or {}),
                             len((serving.get("misses") or {}).get(fam) or {})]
                            for fam, status in serving["status"].items()], numeric={2, 3}))
    return "".join(parts)


def ab_section(data, charts_ok: bool, charts_why: str) -> tuple[str, str]:
    if not data.abs:
        why = data.ab_note or (
            "no A/B for this run: `tuner ab MODULE:CALLABLE --export artifacts/export/<device> "
            f"-o {data.path}/ab` measures the decode step both ways and puts it where this "
            "report finds it")
        return section("ab", "A/B: end to end", note("not run", why)), "not run"
    parts = [_charts_note(charts_ok, charts_why)]
    if data.ab_note:
        parts.append(note("skipped", data.ab_note))
    cards = []
    for path, ab in data.abs:
        try:
            block = _ab_block(path, ab, charts_ok, data.verdicts)
        except Exception as exc:  # noqa: BLE001 - a damaged ab.json: say which, show the rest
            why = f"{path}: damaged, not shown ({type(exc).__name__}: {str(exc)[:200]})"
            data.problems.append(why)
            parts.append(f"<h3>{esc(path.parent.name)}</h3>" + note("not available", why))
            cards.append("damaged")
            continue
        parts.append(block)
        cards.append(f"{num(ab.get('speedup'), '.3f')}×" if not ab.get("crashed") else "crashed")
    return section("ab", "A/B: end to end", "".join(parts)), ", ".join(cards)
