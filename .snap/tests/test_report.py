"""tuner report: report.html from a run directory, read back as HTML.

The recorded run is the bundled example (Qwen2.5-0.5B, batch 4) as its first run measured it on an
H200 (benchmarks/logs/2026-12-01/): the budget is computed here from the example trace with that
H200's measured profile; the studies are made by the real search orchestration (worker
processes, SQLite) with an objective that replays that run's per-shape times (its baseline, its
default config and its best config; other configs are slower by a deterministic amount); the
verdict table is tuner.rank.decide over that run's re-measured numbers (1_run.log); the
A/B is that run's ab.json as written on the H200. Every report is parsed (html.parser): its
headings, one embedded image per chart, its table rows, and that nothing points outside the file.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
from matplotlib.colors import to_rgb

from tuner import ab, rank, report, run, runtime, search
from tuner.cli import main
from tuner.device import choose_profile
from tuner.parity import ParityFacts
from tuner.report import charts, data as report_data
from tuner.search import TrialResult

from conftest import EXAMPLES, ROOT

LIVE = EXAMPLES / "qwen25_05b_b4_live.pt.trace.json.gz"
DECODE = EXAMPLES / "qwen25_05b_b4_decode.pt.trace.json.gz"
LOGS = ROOT / "benchmarks" / "logs" / "2026-12-01"
H200 = LOGS / "nvidia-h200.device.json"
EXAMPLE_AB = LOGS / "1_ab_qwen05b_b4.json"
HERE = Path(__file__).resolve().parent
TINY = f"{HERE / 'fixtures' / 'ab' / 'tiny_lm.py'}:TinyDecode"
SECTIONS = ["Budget", "Search plan", "Search", "Verdicts", "A/B: end to end"]


def cfg(rows, block_k, warps, *, split_k=1, use_dot=0, stages=1) -> dict:
    return {"BLOCK_K": block_k, "ROWS_PER_BLOCK": rows, "SPLIT_K": split_k, "USE_DOT": use_dot,
            "num_stages": stages, "num_warps": warps}


# 1_run.log, the search summary: shape -> (baseline us, default us, best us, best config)
SEARCHED = {
    "m=4,n=128,k=896,dtype=bfloat16,bias=1": (3.82, 2.33, 2.33, cfg(1, 1024, 4)),
    "m=4,n=4864,k=896,dtype=bfloat16": (5.09, 5.35, 5.35, cfg(32, 128, 4, use_dot=1, stages=4)),
    "m=4,n=896,k=4864,dtype=bfloat16": (7.15, 6.41, 6.24, cfg(1, 1024, 2)),
    "m=4,n=896,k=896,dtype=bfloat16,bias=1": (4.82, 3.37, 3.22, cfg(2, 1024, 4)),
    "m=4,n=896,k=896,dtype=bfloat16": (4.56, 3.28, 3.28, cfg(1, 1024, 4)),
}
# 1_run.log, rank: (shape, calls, config, baseline us, candidate us, speedup, low, high,
# error, output class, default us (for "slower than the default config")). The log's accept lines
# do not print the config: the search's best config of the shape is taken. The rejected rows'
# candidate times are the log's speedup applied to the baseline.
RANKED = [
    ("m=4,n=128,k=896,dtype=bfloat16,bias=1", 48, cfg(1, 1024, 4), 4.14, 2.38, 1.740, 1.740, 1.741,
     1.77e-3, "eee6bf86cdbffa21", None),
    ("m=4,n=896,k=4864,dtype=bfloat16", 24, cfg(1, 1024, 2), 7.89, 6.30, 1.251, 1.250, 1.252,
     1.66e-3, "bf577b8e918dac4e", None),
    ("m=4,n=896,k=896,dtype=bfloat16,bias=1", 24, cfg(2, 1024, 4), 4.80, 3.26, 1.475, 1.474, 1.477,
     1.69e-3, "dffeceba9926bcff", None),
    ("m=4,n=896,k=896,dtype=bfloat16", 24, cfg(1, 1024, 4), 4.56, 3.26, 1.400, 1.399, 1.401,
     1.67e-3, "de4b164f249509e0", None),
    ("m=4,n=896,k=896,dtype=bfloat16,bias=1", 24, cfg(2, 1024, 8), 4.80, 3.559, 1.349, 1.340,
     1.355, 1.69e-3, "dffeceba9926bcff", 3.37),
    ("m=4,n=896,k=4864,dtype=bfloat16", 24, cfg(1, 2048, 4), 7.89, 7.827, 1.008, 1.007, 1.008,
     1.66e-3, "bf577b8e918dac4e", None),
    ("m=4,n=4864,k=896,dtype=bfloat16", 48, cfg(32, 128, 4, use_dot=1, stages=4), 5.09, 5.352,
     0.951, 0.950, 0.953, 1.70e-3, "c0ffee00c0ffee00", None),
    ("m=4,n=4864,k=896,dtype=bfloat16", 48, cfg(32, 128, 4, use_dot=1, stages=3), 5.09, 5.674,
     0.897, 0.896, 0.898, 1.70e-3, "c0ffee00c0ffee00", None),
    ("m=4,n=4864,k=896,dtype=bfloat16", 48, cfg(16, 128, 4, use_dot=1, stages=3), 5.09, 5.981,
     0.851, 0.849, 0.852, 1.70e-3, "c0ffee00c0ffee00", None),
]
STEP_US = 2198.0  # the example's decode step, GPU busy (1_run.log)


# ------------------------------------------------------------------- the replayed objective
class RecordedObjective:
    """Recorded times for this shape: its baseline, its default and its best config exactly;
    any other config slower than the best by 6% per step away from it in the space's choices
    (plus up to 3% from a hash of the config, the same in every worker process), so a search
    closes in on the best as a real one does; a split-K config changes the summation order, so
    its bytes mismatch."""

    def __init__(self, plan):
        self.plan = plan
        self.base, self.default_us, self.best_us, self.best = SEARCHED[plan.shape_key]

    def baseline_us(self) -> float:
        return self.base

    def evaluate(self, config: dict) -> TrialResult:
        key = search.config_key(config)
        if config == self.plan.default_config:
            us = self.default_us
        elif config == self.best:
            us = self.best_us
        else:
            choices = self.plan.space.params
            steps = sum(abs(choices[p].index(config[p]) - choices[p].index(self.best[p]))
                        for p in choices if self.best.get(p) in choices[p])
            frac = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
            us = self.best_us * (1.01 + 0.06 * steps + 0.03 * frac)
        return trial_result(round(us, 4), key, same_class=config.get("SPLIT_K", 1) == 1)


def trial_result(us: float, key: str, *, same_class: bool) -> TrialResult:
    """A measured trial: bitwise equal to the default config's output or not (split-K). Written
    for TrialResult with the three parity facts, and for its earlier form (hash and class)."""
    if "facts" in TrialResult.__dataclass_fields__:
        facts = ParityFacts(False, same_class, key[:16] if not same_class else "d" * 16, "d" * 16,
                            1.7e-3, 1.7e-3, 1.0 if same_class else 3.0, 0, 3)
        return TrialResult(median_us=us, noise_pct=0.3, facts=facts)
    return TrialResult(median_us=us, noise_pct=0.3, output_hash=key[:16],
                       parity="exact" if same_class else "mismatch", rel_err=0.0)


def make_recorded(plan):
    return RecordedObjective(plan)


def recorded_verdicts() -> pd.DataFrame:
    studies: dict = {}
    for shape, calls, config, base, cand, s, low, high, err, cls, default_us in RANKED:
        info = studies.setdefault(shape, (rank.StudyInfo(
            name=f"nvidia-h200:gemv:{shape}", family="gemv",
            shape=dict(zip(("m", "n", "k"), (int(p.split("=")[1]) for p in shape.split(",")[:3]))),
            shape_key=shape, device="nvidia-h200", calls_per_step=float(calls), step_us=STEP_US,
            phase="decode"), []))
        facts = ParityFacts(False, True, cls, cls, err, err, 1.0, 0, 3)
        vs_default = (rank.Pair(default_us, cand, default_us / cand, 0.947, 0.948, 0.3)
                      if default_us else None)
        info[1].append((rank.Candidate(config, cand, len(info[1])),
                        rank.Measured(config, facts, rank.Pair(base, cand, s, low, high, 0.3),
                                      vs_default)))
    return rank.decide(list(studies.values()), gate="kernel", threshold="0.5%")


def build_recorded_run(directory: Path, trials: int = 8, sampler: str = "tpe") -> Path:
    """The recorded run directory of the bundled example, from recorded numbers (module
    docstring), with its report rendered by `tuner report`."""
    result = run.run(DECODE, graph_captured=True, device=str(H200), out_dir=directory, gpu=False,
                     out=lambda line: None)
    profile, _ = choose_profile(str(H200), ["NVIDIA H200"], gpu=False)
    plans, _ = search.study_plans(result.plan, "gemv", profile, device_key="nvidia-h200",
                                  parity_mode="accuracy", source=str(result.shapes_path))
    url = f"sqlite:///{directory / 'studies.db'}"
    search.run_search(plans, search.SearchSettings(
        storage=url, trials=trials, timeout_s=240, gpus=["0"], objective=make_recorded,
        progress=False, seed=0, sampler=sampler))
    rank.write(recorded_verdicts(), directory, "verdicts")
    report_data.record_run(directory, storage=url, studies=[p.study_name for p in plans],
                           searched=True, options={"family": "gemv", "graph_captured": True})
    (directory / "ab" / "QwenDecode-b4").mkdir(parents=True)
    shutil.copy(EXAMPLE_AB, directory / "ab" / "QwenDecode-b4" / "ab.json")
    assert main(["report", str(directory)]) == 0
    return directory / "report.html"


# ------------------------------------------------------------------------- reading the page
class Page(HTMLParser):
    """Headings, and per section (its id): images, tables (row counts, cell texts), notes."""

    def __init__(self, text: str):
        super().__init__()
        self.headings: list[tuple[str, str]] = []
        self.sections: dict[str, dict] = {}
        self.urls: list[str] = []
        self.tags: set[str] = set()
        self._section = ""
        self._heading = None
        self._cell = None
        self._note = None
        self.feed(text)

    def _here(self) -> dict:
        return self.sections.setdefault(self._section, {"images": [], "tables": [], "notes": []})

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.add(tag)
        for name in ("src", "href", "action", "data", "poster"):
            if attrs.get(name):
                self.urls.append(attrs[name])
        if tag == "section":
            self._section = attrs.get("id", "")
        elif tag in ("h1", "h2", "h3"):
            self._heading = [tag, ""]
        elif tag == "img":
            self._here()["images"].append(attrs.get("src", ""))
        elif tag == "table":
            self._here()["tables"].append([])
        elif tag == "tr" and self._here()["tables"]:
            self._here()["tables"][-1].append([])
        elif tag == "td":
            self._cell = ""
        elif tag == "div" and "note" in (attrs.get("class") or "").split():
            self._note = ""

    def handle_endtag(self, tag):
        if tag in ("h1", "h2", "h3") and self._heading:
            self.headings.append((self._heading[0], self._heading[1].strip()))
            self._heading = None
        elif tag == "td" and self._cell is not None:
            self._here()["tables"][-1][-1].append(self._cell.strip())
            self._cell = None
        elif tag == "div" and self._note is not None:
            self._here()["notes"].append(self._note.strip())
            self._note = None

    def handle_data(self, text):
        if self._heading is not None:
            self._heading[1] += text
        if self._cell is not None:
            self._cell += text
        if self._note is not None:
            self._note += text

    def rows(self, section: str, index: int = 0) -> list[list[str]]:
        """The body rows of a section's index-th table (the header row has no td)."""
        return [r for r in self.sections[section]["tables"][index] if r]


def parse(path: Path) -> Page:
    text = path.read_text()
    assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text.replace("file://", "")), \
        "the report must not point outside the file"
    page = Page(text)
    assert [h for t, h in page.headings if t == "h2"] == SECTIONS
    for url in page.urls:
        assert url.startswith("data:image/png;base64,"), url
    assert not {"script", "link", "iframe"} & page.tags
    return page


# ------------------------------------------------------------------------------------- tests
@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    monkeypatch.setattr(run, "have_gpu", lambda: False)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    return build_recorded_run(tmp_path_factory.mktemp("recorded") / "run")


def test_cpu_run_writes_the_budget_and_plan_report(tmp_path, capsys):
    """README command 1 on a CPU: the report has the budget and the plan; the search, the
    verdicts and the A/B say they did not run and why."""
    out = tmp_path / "run"
    assert main(["run", str(LIVE), "--graph-captured", "-o", str(out)]) == 0
    assert f"report: {out / 'report.html'}" in capsys.readouterr().out
    page = parse(out / "report.html")
    budget = pd.read_parquet(out / "budget.parquet")
    phases = budget["phase"].nunique()
    # the step chart, then one headroom chart per phase
    assert len(page.sections["budget"]["images"]) == 1 + phases
    assert len(page.rows("budget", 0)) == phases
    every = page.rows("budget", 1)
    assert len(every) == len(budget)
    assert sorted(r[8] for r in every) == sorted(budget["verdict"])
    plan_rows = page.rows("plan")
    planned = run.plan_search(budget, "gemv", 1800)["shape_key"]
    assert sorted(r[0] for r in plan_rows) == sorted(planned) and len(planned) == 5
    for name in ("search", "verdicts"):
        assert page.sections[name]["images"] == []
        (text,) = page.sections[name]["notes"]
        assert text.startswith("not run:") and "search needs a GPU" in text
    assert page.sections["ab"]["notes"][0].startswith("not run: no A/B for this run")
    assert json.loads((out / "run.json").read_text())["searched"] is False


def test_report_from_recorded_search_rank_and_ab(recorded):
    page = parse(recorded)
    # search: one chart per study; its table has the recorded baseline and default per shape
    assert len(page.sections["search"]["images"]) == len(SEARCHED)
    rows = {r[0]: r for r in page.rows("search")}
    assert set(rows) == set(SEARCHED)
    for shape, (base, default_us, best_us, _) in SEARCHED.items():
        assert rows[shape][5:7] == [f"{base:.2f}", f"{default_us:.2f}"]
        # the best the search found: at most the default config's (trial 0), at least the run's best
        assert best_us <= float(rows[shape][7]) <= default_us
        assert int(rows[shape][1]) >= 8
    # verdicts: one chart, one row per candidate, with the decisions and the parity facts
    assert len(page.sections["verdicts"]["images"]) == 1
    verdicts = page.rows("verdicts")
    assert len(verdicts) == len(RANKED)
    assert [r[3] for r in verdicts].count("accept") == 4
    assert [r[0] for r in verdicts if r[3] == "accept"] == ["1", "2", "3", "4"]
    reasons = [r[-1] for r in verdicts if r[3] == "reject"]
    assert sorted(x.split(":")[0] for x in reasons) == ["not faster"] * 4 + [
        "slower than the default config"]
    # the three parity facts: bitwise = serving path / = default config; error vs fp32
    assert all(r[7].startswith("no / yes; ") for r in verdicts)
    assert verdicts[0][7] == "no / yes; 1.77e-03 vs 1.77e-03 (1.00×)"
    # the A/B: three charts (arms, measured vs projected, outputs) and its tables
    recorded_ab = json.loads(EXAMPLE_AB.read_text())
    assert len(page.sections["ab"]["images"]) == 3
    arms = page.rows("ab", 0)
    assert {r[0]: r[1] for r in arms} == {
        name: f"{arm['median_us']:.1f}" for name, arm in recorded_ab["arms"].items()}
    attribution = page.rows("ab", 1)
    assert [r[0] for r in attribution] == [r["shape"] for r in recorded_ab["attribution"]]
    # the recorded A/B has no projection: the run's accepted verdicts stand for it, said so
    assert any(n.startswith("projection: this A/B recorded no projection")
               for n in page.sections["ab"]["notes"])
    by_shape = {r[0]: r for r in attribution}
    assert by_shape["m=4,n=128,k=896"][4:6] == ["83.0", "84.5"]  # measured, projected
    assert by_shape["m=4,n=896,k=896"][4:6] == ["59.9", "68.2"]  # bias and no bias: 2 verdicts
    assert by_shape["m=4,n=4864,k=896"][5] == "–"  # nothing accepted, nothing projected
    assert [r[0] for r in page.rows("ab", 2)] == ["baseline", "tuned", "aa"]
    assert ("h3", "QwenDecode-b4 PASS") in page.headings
    assert not any(n.startswith("not run") for s in page.sections.values() for n in s["notes"])


def test_the_search_chart_draws_the_recorded_times(recorded):
    record = report_data.read_record(recorded.parent)
    studies, why = report_data.load_studies(record["storage"], record["studies"])
    assert why == "" and len(studies) == len(SEARCHED)
    for study in studies:
        base, default_us, best_us, best_config = SEARCHED[study.shape_key]
        fig = charts.search_figure(study)
        left, right = fig.axes
        for ax in (left, right):
            flat = {round(line.get_ydata()[0], 4) for line in ax.get_lines()
                    if len(set(line.get_ydata())) == 1 and len(line.get_ydata()) == 2}
            assert {base, default_us} <= flat
        (best_line,) = [line for line in left.get_lines() if line.get_label() == "best so far"]
        ys = list(best_line.get_ydata())
        measured = [p.us for p in study.trials if p.outcome == "ok"]
        assert ys == sorted(ys, reverse=True) and ys[-1] == min(measured) == study.best().us
        assert ys[0] == pytest.approx(default_us)  # trial 0 measures the default config
        assert best_us <= ys[-1]


def test_the_budget_chart_marks_kept_and_pruned_against_the_threshold(recorded):
    budget = pd.read_parquet(recorded.parent / "budget.parquet")
    decode = budget[budget["phase"] == "decode"]
    items = [{"label": str(i), "headroom": float(r.headroom_us_per_token), "verdict": r.verdict,
              "unjudged": False} for i, r in enumerate(decode.itertuples())]
    threshold = 0.005 * float(decode["step_basis_us"].median())
    fig = charts.budget_figure(items, threshold_us=threshold, safety=0.5,
                               threshold_text="0.5% of the step", phase="decode")
    (ax,) = fig.axes
    (line,) = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert line.get_xdata()[0] == pytest.approx(threshold)
    solid = [p for p in ax.patches if p.get_alpha() is None]
    assert len(solid) == len(items)
    for patch, item in zip(solid, items):
        kept = patch.get_width() >= threshold
        assert kept == (item["verdict"] == "keep")
        assert patch.get_facecolor()[:3] == pytest.approx(
            to_rgb(charts.COLORS["keep" if kept else "prune"]))


def test_without_matplotlib_the_report_keeps_its_tables(recorded, tmp_path, monkeypatch):
    monkeypatch.setattr(charts, "available", lambda: (False, "matplotlib is not installed"))
    out = report.render(recorded.parent, output=tmp_path / "plain.html")
    page = parse(out)
    assert all(s["images"] == [] for s in page.sections.values())
    assert any(n.startswith("charts not drawn: matplotlib is not installed")
               for n in page.sections["budget"]["notes"])
    assert len(page.rows("verdicts")) == len(RANKED)


def test_a_moved_storage_or_a_missing_ab_is_a_note_not_a_crash(recorded, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(recorded.parent, copy)
    for suffix in ("", "-wal", "-shm"):  # SQLite in WAL mode: the file and its journal
        if (copy / f"studies.db{suffix}").exists():
            (copy / f"studies.db{suffix}").rename(tmp_path / f"elsewhere.db{suffix}")
    shutil.rmtree(copy / "ab")
    record = json.loads((copy / "run.json").read_text())
    record["storage"] = f"sqlite:///{copy / 'studies.db'}"
    (copy / "run.json").write_text(json.dumps(record))
    page = parse(report.render(copy))
    (text,) = page.sections["search"]["notes"]
    assert text.startswith("not available:") and "not there any more" in text
    assert page.sections["ab"]["notes"][0].startswith("not run: no A/B")
    assert len(page.rows("verdicts")) == len(RANKED)
    # --storage points the report at the moved file
    page = parse(report.render(copy, storage=f"sqlite:///{tmp_path / 'elsewhere.db'}"))
    assert len(page.sections["search"]["images"]) == len(SEARCHED)


def test_report_errors_are_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a directory" in err[0]
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a run directory" in err[0]
    assert not (tmp_path / "empty" / "report.html").exists()
    (tmp_path / "empty" / "plan.md").write_text("# Search plan (gemv, 1 min)\n")
    assert main(["report", str(tmp_path / "empty"), "--ab", str(tmp_path)]) == 2
    assert "--ab" in capsys.readouterr().err


def test_an_ab_directory_gets_its_own_report(tmp_path):
    """`tuner ab` (here on the CPU with the tiny decoder) writes report.html beside ab.json."""
    lines = []
    settings = ab.ABSettings(prompt=4, steps=2, groups=2, replays=1, device="cpu",
                             families=("gemv",), profile=False)
    ab.run(("callable", TINY), batches=[2], settings=settings, out_root=tmp_path, out=lines.append)
    directory = tmp_path / "TinyDecode-b2-eager"  # <model>-b<batch>-<baseline>
    assert (directory / "ab.json").exists()
    assert f"  report: {directory / 'report.html'}" in lines
    page = parse(directory / "report.html")
    assert len(page.sections["ab"]["images"]) == 3
    for name in ("budget", "plan", "search", "verdicts"):
        (text,) = page.sections[name]["notes"]
        assert text.startswith("not run: this folder holds one A/B (`tuner ab`)")
    assert page.headings[0] == ("h1", "tuner report: TinyDecode-b2-eager")


def test_an_ab_with_its_own_tuned_step_names_both_steps_in_its_report(tmp_path):
    settings = ab.ABSettings(prompt=4, steps=2, groups=2, replays=1, device="cpu",
                             families=("gemv",), profile=False, compile="aot_eager",
                             tuned_step="compile")
    ab.run(("callable", TINY), batches=[2], settings=settings, baselines=["eager"],
           out_root=tmp_path, out=lambda line: None)
    directory = tmp_path / "TinyDecode-b2-eager-tuned-compile"
    record = json.loads((directory / "ab.json").read_text())
    assert record["baseline"] == "eager" and record["tuned_step"] == "compile"
    html_text = (directory / "report.html").read_text()
    assert ("Baseline eager: the step eager; the tuned arm: the export under torch.compile "
            "(aot_eager).") in html_text


def test_a_crashed_ab_given_with_ab_is_its_reason(recorded, tmp_path):
    from tuner.ab import verdict as abv

    crashed = abv.decide(None, label="crashy-b1", crashed="capture: tuned arm: SIGSEGV")
    (tmp_path / "crashy").mkdir()
    (tmp_path / "crashy" / "ab.json").write_text(json.dumps(crashed.to_json()))
    page = parse(report.render(recorded.parent, ab=[tmp_path / "crashy"],
                               output=tmp_path / "with_crash.html"))
    assert {("h3", "crashy-b1 FAIL"), ("h3", "QwenDecode-b4 PASS")} <= set(page.headings)
    assert "crashed: capture: tuned arm: SIGSEGV" in page.sections["ab"]["notes"]
    assert len(page.sections["ab"]["images"]) == 3  # the crashed one draws nothing


@pytest.mark.slow
def test_tuner_run_on_a_gpu_records_its_storage(tmp_path, monkeypatch):
    """The GPU path (timing swapped out): run.json names the SQLite file the search used, as an
    absolute URL, and the report reads the studies from it."""
    from test_run import IDENTITY, cheap_objective, replayed_measure

    monkeypatch.setattr(runtime, "current_identity", lambda: dict(IDENTITY))
    monkeypatch.chdir(tmp_path)
    result = run.run(DECODE, graph_captured=True, timeout="2m", trials=3, min_saving="75us",
                     storage="studies.db", out_dir="run", export_root="export", gpu=True,
                     out=lambda line: None, objective=cheap_objective, measure=replayed_measure)
    assert result.searched and len(result.plan) == 1
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["storage"] == f"sqlite:///{tmp_path / 'studies.db'}"
    assert record["studies"] == list(dict.fromkeys(result.verdicts["study"]))
    monkeypatch.chdir(ROOT)  # the recorded URL is absolute: any folder works
    page = parse(report.render(tmp_path / "run"))
    assert len(page.sections["search"]["images"]) == 1
    assert len(page.rows("verdicts")) == len(result.verdicts)


def test_the_fallback_projection_names_attention_calls_as_the_ab_does():
    """An A/B that recorded no projection takes the run's accepted verdicts; attention verdicts
    must land on the A/B's attention row (its name has no m, n, k). Real inputs: the H200 A/B of
    Llama-3.1-8B at batch 32 with its projections removed, and that run's attention
    verdicts, the accepted one's cache length set to the A/B's traced call (146; the verdict's
    own trace had 162, which names another call)."""
    logs = ROOT / "benchmarks/logs/2026-12-01/compiled-attention"
    recorded_ab = json.loads((logs / "18b_abc_llama31_8b-b32.json").read_text())
    bare = dict(recorded_ab, projected_us=None,
                attribution=[dict(r, projected_saving_us=None) for r in recorded_ab["attribution"]])
    verdicts = pd.read_parquet(logs / "18b_verdicts_attention_llama31_8b-b32.parquet")
    accepted = verdicts[verdicts["decision"] == "accept"]
    assert len(accepted) == 1 and (verdicts["decision"] == "reject").sum() == 1
    other_call, _ = report.sections._with_projection(bare, verdicts)
    total = float(accepted["saving_us_per_token"].iloc[0])
    assert other_call["projected_us"] == pytest.approx(total)
    assert all(r["projected_saving_us"] is None for r in other_call["attribution"])
    shape = json.loads(accepted["shape_json"].iloc[0])
    verdicts.loc[accepted.index, "shape_json"] = json.dumps(dict(shape, kv_len=146))
    with_projection, why = report.sections._with_projection(bare, verdicts)
    projected = {r["shape"]: r["projected_saving_us"] for r in with_projection["attribution"]}
    assert projected["attention b=32 h=32 kv=146 d=128"] == pytest.approx(3713.938, abs=1e-3)
    matched = [k for k, v in projected.items() if v is not None]
    assert matched == ["attention b=32 h=32 kv=146 d=128"]
    assert with_projection["measured_over_projected"] == pytest.approx(
        recorded_ab["saving_us"] / 3713.938, rel=1e-6)
    assert why.startswith("this A/B recorded no projection")


# ------------------------------------------------------------ one damaged file of a run folder
def _ab(change):
    def damage(path: Path) -> None:
        ab_json = json.loads(path.read_text())
        change(ab_json)
        path.write_text(json.dumps(ab_json))
    return damage


def _record(change):
    def damage(path: Path) -> None:
        record = json.loads(path.read_text())
        change(record)
        path.write_text(json.dumps(record))
    return damage


def _into_directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


AB_JSON = "ab/QwenDecode-b4/ab.json"
DAMAGES = {
    # name: (file, damage, what the line says of it, the section it is in)
    "ab.json cut short": (AB_JSON, lambda p: p.write_bytes(p.read_bytes()[:700]),
                          "not an A/B verdict (not JSON", "ab"),
    "ab.json not UTF-8": (AB_JSON, lambda p: p.write_bytes(b"\xff\xfe" + p.read_bytes()),
                          "not an A/B verdict (not UTF-8 text)", "ab"),
    "ab.json arms a string": (AB_JSON, _ab(lambda a: a.update(arms="fast")),
                              "arms is 'fast', not a JSON object (not shown)", "ab"),
    "ab.json attribution a string": (AB_JSON, _ab(lambda a: a.update(attribution="x")),
                                     "attribution is 'x', not a JSON list (not shown)", "ab"),
    "ab.json an arm a string": (AB_JSON, _ab(lambda a: a["arms"].update(baseline="x")),
                                "damaged, not shown", "ab"),
    "ab.json outputs' arms a list": (AB_JSON, _ab(lambda a: a["outputs"].update(
        teacher_forced=[1, 2])), "damaged, not shown", "ab"),
    "run.json cut short": ("run.json", lambda p: p.write_bytes(p.read_bytes()[:40]),
                           "cannot be read (not JSON", "search"),
    "run.json studies a number": ("run.json", _record(lambda r: r.update(studies=5)),
                                  "studies is 5, not a list of study names (left out)", "search"),
    "run.json options a string": ("run.json", _record(lambda r: r.update(options="gemv")),
                                  "options is 'gemv', not an object (left out)", "search"),
    "run.json a directory": ("run.json", _into_directory, "cannot be read (Is a directory)",
                             "search"),
    "plan.md not UTF-8": ("plan.md", lambda p: p.write_bytes(b"\xff" + p.read_bytes()),
                          "cannot be read (not UTF-8 text)", "plan"),
    "plan.md a directory": ("plan.md", _into_directory, "cannot be read (Is a directory)",
                            "plan"),
}


@pytest.mark.parametrize("name", list(DAMAGES))
def test_a_damaged_file_is_named_and_the_rest_of_the_page_drawn(recorded, tmp_path, capsys,
                                                                name):
    """One damaged file of the recorded run folder (ab.json, run.json, plan.md): `tuner
    report` exits 0, names the file on one warning line and in its section, and draws every
    other section as it does for the whole folder. Before, an ab.json of the wrong shape,
    run.json's studies or options of the wrong kind and a plan.md that is not UTF-8 ended in
    'internal error' (exit 1) with no page."""
    rel, damage, says, where = DAMAGES[name]
    whole = parse(recorded)
    copy = tmp_path / "run"
    shutil.copytree(recorded.parent, copy)
    (copy / "report.html").unlink()
    damage(copy / rel)
    code = main(["report", str(copy)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.strip() == f"report: {copy / 'report.html'}"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tuner: warning: report: {copy / rel}"), err
    assert says in lines[0], lines[0]
    page = parse(copy / "report.html")
    assert any(str(copy / rel) in text and says in text
               for text in page.sections[where]["notes"]), page.sections[where]["notes"]
    for other in {"budget", "plan", "search", "verdicts", "ab"} - {where}:
        if where == "search" and other == "verdicts":
            continue     # the verdicts still show; their studies come from run.json
        assert page.sections[other] == whole.sections[other], other
    assert page.rows("verdicts") == whole.rows("verdicts")


def _json_paths(value, prefix=()):
    """Every path into a JSON value (the first three items of a list)."""
    if prefix:
        yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _json_paths(item, prefix + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value[:3]):
            yield from _json_paths(item, prefix + (i,))


GARBAGE = ["x", None, [], {}, -1, 1e308, True, [1, "a"], {"a": "b"}]


def test_fuzzed_ab_and_run_records_never_stop_the_report(recorded, tmp_path, capsys):
    """ab.json and run.json with one value anywhere replaced by a value of another kind (a
    seeded sample of the 1,200 or so such cases): every report is written, exit 0, no internal
    error; the budget and plan sections are as for the whole folder."""
    import random

    whole = parse(recorded)
    copy = tmp_path / "run"
    shutil.copytree(recorded.parent, copy)
    originals = {rel: json.loads((copy / rel).read_text()) for rel in (AB_JSON, "run.json")}
    cases = [(rel, path, garbage) for rel, value in originals.items()
             for path in _json_paths(value) for garbage in GARBAGE]
    assert len(cases) > 1000
    for rel, path, garbage in random.Random(32).sample(cases, 24):
        damaged = json.loads(json.dumps(originals[rel]))
        parent = damaged
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = garbage
        (copy / rel).write_text(json.dumps(damaged))
        code = main(["report", str(copy)])
        out, err = capsys.readouterr()
        assert code == 0 and "internal error" not in err and "Traceback" not in err, (path, err)
        page = parse(copy / "report.html")
        for section_id in ("budget", "plan"):
            assert page.sections[section_id] == whole.sections[section_id], (path, garbage)
        (copy / rel).write_text(json.dumps(originals[rel]))
