"""The one study planner (tuner.search.planning), used by `tuner search` and `tuner run` alike.

A fixed bug: `tuner search --graph-captured` stored the wall step as the study's `step_us`
while `tuner run --graph-captured` stored the GPU-busy step, and rank's share-of-step gate reads
it: the same data was judged differently after one command than after the other.
"""

from __future__ import annotations

import pandas as pd
import pytest

from tuner import budget, rank, run, search, shapetable
from tuner.cli import main
from tuner.device import load_profile

from test_search import EXAMPLE, ROOT, _table

H200 = load_profile("h200")


def _plans_by_name(plans):
    return {p.study_name: p for p in plans}


def test_graph_captured_search_and_run_record_the_step_rank_judges_against(tmp_path, monkeypatch):
    """Bug 1: the same trace planned by `tuner search` and by `tuner run` gives the same studies,
    and under --graph-captured their step is the GPU-busy step (what the budget took the share
    of), read back by rank from the stored study."""
    table = shapetable.read(EXAMPLE)
    gpu_busy = float(table.loc[table["phase"] == "decode", "step_gpu_us"].iloc[0])
    wall = float(table.loc[table["phase"] == "decode", "step_us"].iloc[0])
    assert gpu_busy < wall / 10  # the example is launch-bound: the two steps differ a lot

    searched, _ = search.plan_studies(table, "gemv", H200, graph_captured=True)
    judged = budget.compute(table, H200, graph_captured=True)
    planned = run.plan_search(judged, "gemv", 240.0)
    ran, _ = search.study_plans(planned, "gemv", H200)
    assert len(searched) == 5
    assert _plans_by_name(searched).keys() == _plans_by_name(ran).keys()
    for name, plan in _plans_by_name(searched).items():
        other = _plans_by_name(ran)[name]
        assert plan.attrs == other.attrs and plan.weight == pytest.approx(other.weight)
        assert plan.attrs["step_us"] == pytest.approx(gpu_busy)
        assert plan.attrs["step_basis"] == "gpu_busy"
    wall_plans, _ = search.plan_studies(table, "gemv", H200, threshold=_us_threshold())
    assert wall_plans and all(p.attrs["step_us"] == pytest.approx(wall)
                              and p.attrs["step_basis"] == "wall" for p in wall_plans)

    # end to end: what `tuner search --graph-captured` stores is what rank judges against
    monkeypatch.syspath_prepend(str(ROOT / "tests"))
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    assert main(["search", str(EXAMPLE), "--device", "h200", "--graph-captured", "--storage", url,
                 "--trials", "2", "--gpus", "0", "--objective", "test_search:make_fake",
                 "--no-progress"]) == 0
    studies = rank.load_studies(url, family="gemv", device="nvidia-h200")
    assert len(studies) == 5
    assert all(s.step_us == pytest.approx(gpu_busy) for s in studies)


def _us_threshold():
    from tuner.units import parse_threshold

    return parse_threshold("1us")


def test_rows_of_one_shape_in_one_phase_add_calls_and_headroom():
    """Two rows that gemv serves with one kernel shape in one phase (the same linear, traced as
    two layouts): one study, their calls and headroom added, baseline call-weighted."""
    table = _table([(1, 14336, 4096, 200.0, 32.0), (1, 14336, 4096, 100.0, 16.0)])
    table.loc[1, "layout"] = "NN"
    judged = budget.compute(table, H200)
    plans, skipped = search.plan_studies(table, "gemv", H200)
    assert skipped == [] and len(plans) == 1
    plan = plans[0]
    assert plan.attrs["calls_per_step"] == 48.0
    assert plan.weight == pytest.approx(judged["headroom_us_per_token"].sum())
    planned, _ = search.plan_shapes(judged, "gemv")
    assert planned.loc[0, "baseline_us"] == pytest.approx((200.0 * 32 + 100.0 * 16) / 48)


def test_one_shape_in_two_phases_is_one_study_described_by_its_largest_phase():
    """The same decode linear also seen in another phase with fewer calls: one study, weighted by
    both phases' headroom, its calls, step and phase those of the larger one."""
    table = _table([(1, 14336, 4096, 200.0, 8.0), (1, 14336, 4096, 200.0, 32.0)])
    table.loc[0, ["phase", "step_us", "step_gpu_us"]] = ["other", 50000.0, 40000.0]
    judged = budget.compute(table, H200, threshold=_us_threshold())
    assert (judged["verdict"] == "keep").all()
    plans, _ = search.plan_studies(table, "gemv", H200, threshold=_us_threshold())
    assert len(plans) == 1
    plan = plans[0]
    assert plan.attrs["phase"] == "decode" and plan.attrs["calls_per_step"] == 32.0
    assert plan.attrs["step_us"] == 20000.0
    assert plan.weight == pytest.approx(judged["headroom_us_per_token"].sum())


def test_a_shape_the_budget_cannot_judge_gets_the_smallest_share():
    """A kept row without a trace time (no GPU time recorded) has no headroom: it is searched
    with the smallest known weight, in `tuner search` and in `tuner run`'s plan alike."""
    table = _table([(1, 14336, 4096, 200.0, 32.0), (1, 4096, 4096, 40.0, 32.0),
                    (1, 8192, 4096, float("nan"), 32.0)])
    plans, _ = search.plan_studies(table, "gemv", H200)
    weights = {p.shape_key.split(",")[1]: p.weight for p in plans}
    assert weights["n=8192"] == pytest.approx(min(weights["n=14336"], weights["n=4096"]))
    planned = run.plan_search(budget.compute(table, H200), "gemv", 100.0)
    assert planned["seconds"].sum() == pytest.approx(100.0)
    assert dict(zip(planned["shape_key"], planned["weight"])) == pytest.approx(
        {p.shape_key: p.weight for p in plans})
    shares = search.share_time(plans, 100.0)
    assert sorted(shares.values()) == pytest.approx(sorted(planned["seconds"]))


def test_launch_bound_hint_counts_the_shapes_a_graph_captured_budget_keeps():
    table = shapetable.read(EXAMPLE)
    judged = search.judge(table, "gemv", H200)
    hint = search.launch_bound(judged, table, "gemv", H200)
    assert hint is not None and hint.shapes == 5 and 0.05 < hint.gpu_busy_share < 0.1
    assert "--graph-captured" in hint.hint("gemv")
    captured = search.judge(table, "gemv", H200, graph_captured=True)
    assert search.launch_bound(captured, table, "gemv", H200) is None
    assert isinstance(judged, pd.DataFrame)


def test_one_call_measured_two_ways_is_one_study_and_says_so(capsys):
    """A decode attention call harvested with --kv-heads (its baseline: the repeated cache) and
    the same call from a table without (torch's grouped SDPA): one study name, one baseline;
    the planner says so instead of silently picking one."""
    rows = shapetable.read(ROOT / "shapes" / "examples" / "qwen25_05b_b4_decode.parquet")
    attention = rows[(rows["family"] == "attention") & (rows["phase"] == "decode")].head(1)
    table = pd.concat([attention, attention.assign(traced_kv_heads=14)], ignore_index=True)
    table["traced_kv_heads"] = table["traced_kv_heads"].astype("Int64")
    judged = budget.compute(table, H200, threshold=_us_threshold())
    planned, _ = search.plan_shapes(judged, "attention")
    assert len(planned) == 1
    assert "measured 2 ways" in capsys.readouterr().err
    planned, _ = search.plan_shapes(budget.compute(attention, H200, threshold=_us_threshold()),
                                    "attention")
    assert "measured" not in capsys.readouterr().err


def test_a_compiled_steps_shapes_are_planned_with_the_compiled_baseline():
    """The compiled Qwen3-8B batch-1 step's trace (H200): every planned gemv study's shape says
    baseline_compiled, so rank times its baseline as that compiled step runs it; the study's
    shape key is the served call's."""
    from tuner import harvest

    fixtures = ROOT / "tests" / "fixtures" / "traces"
    table = harvest.harvest(
        [fixtures / "h200_qwen3_8b_compiled_b1_replay.pt.trace.json.gz"],
        capture=[fixtures / "h200_qwen3_8b_compiled_b1_capture.pt.trace.json.gz"],
        quiet=True).table
    planned, _ = search.plan_shapes(search.judge(table, "gemv", H200, graph_captured=True), "gemv")
    assert len(planned) >= 4
    assert all(s.get("baseline_compiled") == 1 for s in planned["shape"])
    assert all("baseline_compiled" not in key for key in planned["shape_key"])
    # budget --measure times the same baseline as the search and rank
    gemv_rows = table[(table["family"] == "gemm") & (table["m"] == 1)]
    family, shape = budget.kernel_shape(gemv_rows.iloc[0])
    assert family.name == "gemv" and shape["baseline_compiled"] == 1
