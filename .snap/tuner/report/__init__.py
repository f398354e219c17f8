"""`tuner report DIR`: one self-contained HTML page a person would rather look at than read.

`render(run_dir)` writes DIR/report.html from what a run directory holds: the budget (headroom
per shape against the threshold, the step's wall and GPU-busy time), the search plan, the
search (best-so-far against trials and time per Optuna study, read from the storage the run
recorded in run.json), the verdicts (projected µs per token, accepted and rejected with the
three parity facts) and the A/Bs (step time per arm with its noise band, measured against
projected saving per shape, token agreement against the A/A floor). Charts are matplotlib PNGs
embedded as base64 (the optional ``report`` extra; without it the page has the tables and says
so); nothing is fetched over a network and the file opens from disk.

`tuner run` and `tuner ab` call `write_run_report` / `write_ab_report` when they finish; a report
that cannot be written there is a warning, never a failed run. docs/report.md is the user's
page. Modules: data (reading a run directory), charts, html, sections.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import TunerError, one_line, warn
from ..tables import atomic_write_bytes
from . import charts
from .data import RUN_RECORD, RunData, load_run, record_run
from .html import note, page, section
from .sections import (ab_only, ab_section, budget_section, plan_section, search_section,
                       verdicts_section)

__all__ = ["REPORT_NAME", "RUN_RECORD", "RunData", "load_run", "record_run", "render",
           "render_html", "write_ab_report", "write_run_report"]

REPORT_NAME = "report.html"


# Each section: its anchor and heading (as its function writes them) and the files it shows.
_SECTIONS = (("Budget", "budget", "Budget", "budget.parquet"),
             ("Plan", "plan", "Search plan", "plan.md"),
             ("Search", "search", "Search", "run.json and its study storage"),
             ("Verdicts", "verdicts", "Verdicts", "verdicts.parquet"),
             ("A/B", "ab", "A/B: end to end", "ab.json"))


def render_html(data: RunData) -> str:
    """The page for a loaded run directory. A section whose files hold what it cannot show (a
    damaged file) says so in its place, and the rest of the page is drawn; each such file is
    added to `data.problems`."""
    charts_ok, charts_why = charts.available()
    makers = {"Budget": lambda: budget_section(data, charts_ok, charts_why),
              "Plan": lambda: plan_section(data),
              "Search": lambda: search_section(data, charts_ok, charts_why),
              "Verdicts": lambda: verdicts_section(data, charts_ok, charts_why),
              "A/B": lambda: ab_section(data, charts_ok, charts_why)}
    sections, cards = [], []
    for title, anchor, heading, files in _SECTIONS:
        try:
            html_text, card = makers[title]()
        except Exception as exc:  # noqa: BLE001 - a damaged file: name it, draw the rest
            why = (f"{heading}: {files} in {data.path} holds what the report cannot show "
                   f"({one_line(exc)})")
            data.problems.append(why)
            html_text, card = section(anchor, heading, note("not available", why)), "damaged"
        sections.append(html_text)
        cards.append((title, card))
    options = data.record.get("options") or {}
    only_ab = ab_only(data)
    bits = [f"{'A/B' if only_ab else 'run'} directory {data.path}"]
    if options.get("family"):
        bits.append(f"family {options['family']}")
    if data.budget is not None and "profile" in data.budget.columns and len(data.budget):
        bits.append(f"device profile {data.budget['profile'].iloc[0]}")
    name = data.path.resolve().name
    # cards: budget, search, verdicts, A/B (the plan's line goes with the budget's)
    top = [("Budget", f"{cards[0][1]}; {cards[1][1]}"), cards[2], cards[3], cards[4]]
    if only_ab:  # the run's own report has these
        top = [(title, "in the run's report") for title, _ in top[:3]] + [top[3]]
    return page(f"tuner report: {name}", "; ".join(bits), top, sections)


def render(run_dir: str | Path, *, storage: str | None = None, ab: list | tuple = (),
           output: str | Path | None = None) -> Path:
    """Write the report of `run_dir` (default DIR/report.html) and return its path.
    `storage` replaces the study storage recorded in run.json; `ab` adds A/B folders or ab.json
    files to those found in DIR (DIR/ab.json, DIR/ab/*/ab.json). TunerError when DIR is not a
    run directory or the report cannot be written."""
    data = load_run(run_dir, storage=storage, ab=ab)
    target = Path(output) if output else Path(run_dir) / REPORT_NAME
    text = render_html(data)
    for problem in data.problems:  # the page says each in its section too
        warn(f"report: {problem}")
    try:
        return atomic_write_bytes(target, text.encode("utf-8"))
    except OSError as exc:
        raise TunerError(f"cannot write the report {target}: {exc.strerror or exc}") from None


def _quietly(run_dir: Path, out) -> Path | None:
    try:
        path = render(run_dir)
    except Exception as exc:  # noqa: BLE001 - the run's own outputs are written; say it and go on
        warn(f"the report of {run_dir} was not written ({one_line(exc)}); "
             f"`tuner report {run_dir}` tries again")
        return None
    ok, why = charts.available()
    out(f"report: {path}" + ("" if ok else f" (tables only: {why})"))
    return path


def write_run_report(result, options: dict, *, gpu: bool, out=print) -> Path | None:
    """After `tuner run`: run.json (the storage the search used, its studies, or why there was
    no search) and report.html in the run directory. Never raises."""
    why = ""
    if not result.searched:
        if result.plan is not None and result.plan.empty:
            why = "no shape survives the budget, so there was nothing to search"
        elif not gpu:
            why = ("search needs a GPU and none was visible when this run was made; the same "
                   "`tuner run` on a CUDA or ROCm machine searches, ranks and exports")
        else:
            why = "no planned shape has a valid config in the search space"
    studies = []
    if result.verdicts is not None and "study" in result.verdicts.columns:
        studies = [s for s in dict.fromkeys(result.verdicts["study"]) if s]
    try:
        record_run(result.out_dir, storage=getattr(result, "storage", None), studies=studies,
                   searched=result.searched, not_searched=why, options=options)
    except Exception as exc:  # noqa: BLE001 - as for the report itself
        warn(f"{result.out_dir / RUN_RECORD} was not written ({one_line(exc)})")
    return _quietly(Path(result.out_dir), out)


def write_ab_report(directory: str | Path, out=print) -> Path | None:
    """After `tuner ab` wrote DIR/ab.json: DIR/report.html with the A/B. Never raises."""
    return _quietly(Path(directory), out)
