"""`tuner run`: the main job on the bundled example.

On a CPU machine it harvests, budgets and prints the search plan, says that search needs a GPU
and exits 0. The whole pipeline (search -> rank -> export -> runtime loader) also runs here with
the GPU timing swapped out: a cheap deterministic objective for the real search orchestration
(worker processes, SQLite studies) and recorded paired timings for rank.
"""

from __future__ import annotations

import json
import math

import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from tuner import rank, run, runtime  # noqa: E402
from tuner.cli import main  # noqa: E402
from tuner.errors import TunerError  # noqa: E402
from tuner import units  # noqa: E402
from tuner.device import choose_profile  # noqa: E402

from conftest import EXAMPLES  # noqa: E402

TRACE = EXAMPLES / "qwen25_05b_b4_decode.pt.trace.json.gz"
IDENTITY = {"key": "nvidia-h200", "name": "NVIDIA H200", "arch": "sm90", "backend": "cuda",
            "torch": "2.11.0+cu130", "triton": "3.6.0"}


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    """These tests take the CPU path even on a GPU machine (the GPU path is scripts/gpu/run_example.sh)."""
    monkeypatch.setattr(run, "have_gpu", lambda: False)


def test_run_on_cpu_stops_after_the_plan(tmp_path, capsys):
    rc = main(["run", str(TRACE), "-o", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert rc == 0
    assert "search needs a GPU" in out
    assert "NVIDIA H200 (spec)" in out and "not measured" in out
    budget = pd.read_parquet(tmp_path / "run" / "budget.parquet")
    shapes = pd.read_parquet(tmp_path / "run" / "shapes.parquet")
    assert len(budget) == len(shapes) == 21
    assert set(budget["verdict"]) <= {"keep", "prune"}
    # the example is launch-bound (decode GPU busy ~7% of the wall step): nothing passes against
    # the wall step, and the run says how many gemv shapes would under CUDA graphs
    assert "0 distinct gemv shape(s) to search" in out
    assert "5 gemv shape(s) would be worth a search" in out
    assert (tmp_path / "run" / "plan.md").exists()


def test_run_passes_kv_heads_to_harvest(tmp_path, capsys):
    # the example's SDPA calls are already grouped (14 query heads on 2 KV heads): none to regroup
    rc = main(["run", str(TRACE), "--kv-heads", "2", "-o", str(tmp_path / "run")])
    assert rc == 0
    assert "--kv-heads 2: no decode attention call" in capsys.readouterr().err
    assert main(["run", str(TRACE), "--kv-heads", "0", "-o", str(tmp_path / "bad")]) != 0
    assert "--kv-heads must be >= 1" in capsys.readouterr().err


def test_run_graph_captured_plan_shares_the_time_budget(tmp_path, capsys):
    rc = main(["run", str(TRACE), "--graph-captured", "--timeout", "4m",
               "-o", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert rc == 0 and "search needs a GPU" in out
    assert "search plan: 5 gemv shape(s), 4.0 min in total" in out
    result = run.run(TRACE, graph_captured=True, timeout="4m", out_dir=tmp_path / "again",
                        gpu=False, out=lambda line: None)
    plan = result.plan
    assert sorted(plan["shape_key"]) == ["m=4,n=128,k=896,dtype=bfloat16,bias=1",
                                         "m=4,n=4864,k=896,dtype=bfloat16",
                                         "m=4,n=896,k=4864,dtype=bfloat16",
                                         "m=4,n=896,k=896,dtype=bfloat16",
                                         "m=4,n=896,k=896,dtype=bfloat16,bias=1"]
    assert plan["seconds"].sum() == pytest.approx(240.0)
    # time in proportion to headroom per token
    ratio = plan["seconds"] / plan["headroom_us_per_token"]
    assert ratio.max() == pytest.approx(ratio.min())
    # n=896,k=896: the q projection (addmm, with bias) and the o projection (mm) are measured as
    # called, so they are two kernel shapes of 24 calls per step, each with its own trace time
    q = plan[plan["shape_key"] == "m=4,n=896,k=896,dtype=bfloat16,bias=1"].iloc[0]
    o = plan[plan["shape_key"] == "m=4,n=896,k=896,dtype=bfloat16"].iloc[0]
    assert q["calls_per_step"] == o["calls_per_step"] == 24.0
    assert q["baseline_us"] == pytest.approx(4.608, abs=1e-3)
    assert o["baseline_us"] == pytest.approx(4.288, abs=1e-3)
    assert "| m=4,n=4864,k=896,dtype=bfloat16 | 48.0 |" in result.plan_path.read_text()


def test_run_bad_input_is_one_line(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope.json.gz")]) == 2
    assert "trace not found" in capsys.readouterr().err
    assert main(["run", str(TRACE), "--timeout", "soon", "-o", str(tmp_path)]) == 2
    assert "--timeout" in capsys.readouterr().err


def test_parse_duration():
    assert units.parse_duration("30m") == 1800
    assert units.parse_duration("1h30m") == 5400
    assert units.parse_duration("90s") == 90
    assert units.parse_duration("45") == 45
    for bad in ("0", "-5m", "5 minutes", ""):
        with pytest.raises(TunerError):
            units.parse_duration(bad)


def test_profile_choice(tmp_path, monkeypatch):
    from tuner.device import load_profile, save_profile

    monkeypatch.chdir(tmp_path)
    profile, label = choose_profile(None, ["NVIDIA H100 80GB HBM3"])
    assert profile.source == "spec" and "H100" in profile.name and "not measured" in label
    with pytest.raises(TunerError, match="give --device"):
        choose_profile(None, ["Some Unknown GPU"])
    # a measured profile for the trace's device wins over the spec one
    measured = load_profile("h200")
    measured.name, measured.source = "NVIDIA H200", "measured"
    save_profile(measured)
    profile, label = choose_profile(None, ["NVIDIA H200"])
    assert profile.source == "measured" and "measured profile" in label
    profile, label = choose_profile("mi300x", ["NVIDIA H200"])
    assert profile.arch == "gfx942" and "--device" in label


# ------------------------------------------------ the whole pipeline with the GPU swapped out
class CheapObjective:
    """Deterministic stand-in for the GPU timing: a smooth function of the config."""

    def __init__(self, plan):
        self.plan = plan

    def baseline_us(self) -> float:
        return 5.0

    def evaluate(self, config):
        from tuner.search import TrialResult

        rows = math.log2(config["ROWS_PER_BLOCK"])
        block = math.log2(config["BLOCK_K"])
        # 2.6 .. 4.3 us, all faster than the 5.0 us baseline: every shape gets a winner
        us = 2.5 + 0.3 * abs(rows - 2) + 0.2 * abs(block - 8) + 0.1 * config["SPLIT_K"]
        from tuner.parity import ParityFacts

        ok = config["SPLIT_K"] == 1  # split-K 'loses accuracy' here: infeasible
        facts = ParityFacts(False, ok, f"{int(us * 1000):016x}", "0000aaaa1111bbbb", 1.6e-3,
                            1.6e-3, 1.0 if ok else 3.0, 0, 3)
        return TrialResult(median_us=us, noise_pct=0.5, facts=facts)


def cheap_objective(plan):
    return CheapObjective(plan)


def _recorded_facts():
    from tuner.parity import ParityFacts

    return ParityFacts(False, True, "a1b2c3d4e5f60718", "a1b2c3d4e5f60718", 1.6e-3, 1.5e-3,
                       1.07, 0, 3)


def replayed_measure(study, candidate, parity_mode):
    """Rank's re-measurement, replayed: the candidate at its search time against 5.0 us."""
    us = candidate.search_us
    return rank.Measured(config=candidate.config,
                         parity=_recorded_facts(),
                         vs_baseline=rank.Pair(5.0, us, 5.0 / us, 5.0 / us - 0.01,
                                               5.0 / us + 0.01, 0.5))


@pytest.mark.slow
def test_whole_pipeline_with_swapped_gpu_timing(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime, "current_identity", lambda: dict(IDENTITY))
    ranked_with = []
    rank_call = rank.rank

    def rank_spy(*args, **kwargs):
        ranked_with.append(kwargs.get("compiled_baseline"))
        return rank_call(*args, **kwargs)

    monkeypatch.setattr(rank, "rank", rank_spy)
    lines = []
    result = run.run(TRACE, graph_captured=True, timeout="2m", trials=6,
                        storage=str(tmp_path / "studies.db"), out_dir=tmp_path / "run",
                        export_root=tmp_path / "export", gpu=True, out=lines.append,
                        objective=cheap_objective, measure=replayed_measure,
                        compiled_baseline=True)  # tuner run --compiled-baseline
    text = "\n".join(lines)
    assert result.searched and ranked_with == [True]  # the flag reaches rank
    verdicts = result.verdicts
    assert set(verdicts[rank.BASELINE_PATH]) == {"eager"}  # what the replayed measure says
    accepted = verdicts[verdicts["decision"] == "accept"]
    assert sorted(accepted["shape"]) == sorted(result.plan["shape_key"])
    assert (accepted["rank"] >= 1).all()
    # ranked by projected us per token: 48-call shapes above the 24-call one at equal savings
    assert accepted["saving_us_per_token"].is_monotonic_decreasing
    assert "shape(s) with a winning config" in text and "exported" in text

    doc = json.loads((tmp_path / "export" / "nvidia-h200" / "gemv.json").read_text())
    assert sorted(doc["configs"]) == sorted(accepted["shape"])
    for entry in doc["configs"].values():
        assert entry["config"]["SPLIT_K"] == 1  # mismatching configs never win
        assert entry["measured"]["baseline_path"] == "eager"

    # the serving side: the loader hits every exported entry
    monkeypatch.setenv("TUNER_EXPORT_DIR", str(tmp_path / "export" / "nvidia-h200"))
    runtime.reset()
    try:
        for key, entry in doc["configs"].items():
            assert runtime.config_for("gemv", entry["shape"]) == entry["config"]
        assert runtime.hit_counts() == {"gemv": {key: 1 for key in doc["configs"]}}
    finally:
        runtime.reset()


def test_run_given_a_table_says_what_it_is_and_which_command_takes_it(tmp_path, capsys):
    """`tuner run SHAPES.parquet`: a shape table is not a trace; the error names the command."""
    shapes = EXAMPLES / "qwen25_05b_b4_decode.parquet"
    assert main(["run", str(shapes), "-o", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tuner: error:")
    assert "is a shape table (from `tuner harvest`), not a profiler trace" in err[0]
    assert f"`tuner budget {shapes}` or `tuner search {shapes}`" in err[0]
    assert not (tmp_path / "run").exists()
    budget_table = pd.read_parquet(shapes).assign(verdict="keep")
    budget_table.to_parquet(tmp_path / "budget.parquet")
    assert main(["run", str(tmp_path / "budget.parquet")]) == 2
    assert "is a budget table (from `tuner budget`)" in capsys.readouterr().err


class FailingObjective(CheapObjective):
    def evaluate(self, config):
        from tuner.search import TrialResult

        return TrialResult(failure="candidate: OutOfResources: shared memory")


def failing_objective(plan):
    return FailingObjective(plan)


def test_run_whose_search_produced_nothing_says_why(tmp_path, monkeypatch):
    """Every trial failed: `tuner run` stops before rank with the reason, not an empty ranking."""
    monkeypatch.setattr(runtime, "current_identity", lambda: dict(IDENTITY))
    with pytest.raises(TunerError, match="every one of the .* measured trials failed.*OutOfResources"):
        run.run(TRACE, graph_captured=True, timeout="1m", trials=2,
                storage=str(tmp_path / "studies.db"), out_dir=tmp_path / "run",
                export_root=tmp_path / "export", gpu=True, out=lambda line: None,
                objective=failing_objective, measure=replayed_measure)
    assert not (tmp_path / "export").exists()


def test_run_says_which_shapes_the_library_serves_at_the_compute_floor(tmp_path, capsys):
    # the example's prefill lm_head (m = 512, n = 151936, k = 896) runs at 72% of the matmul rate
    rc = main(["run", str(TRACE), "--family", "gemm", "-o", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert rc == 0
    lines = [line for line in out.splitlines() if line.startswith("pruned at the compute floor")]
    assert len(lines) == 1 and "prefill m=512 n=151936 k=896" in lines[0]
    assert out.index("pruned at the compute floor") < out.index("search needs a GPU")
