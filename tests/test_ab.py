"""tuner ab: the verdict on recorded A/B data, and the measurement path on the CPU.

The measurement (three arms, tokens, logits against the fp32 reference, timing, profiled
replays) runs on a tiny pure-torch decoder (tests/fixtures/ab/tiny_lm.py) on the CPU without
graphs (eager "replays": the numbers mean nothing); the tuned arm runs the Triton kernels under
the interpreter through tuner.serving with an export written by tuner.export. A crashing arm is
measured in a child process and reported with its stage.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from tuner import ab, runtime
from tuner.ab import verdict as abv
from tuner.ab import child as ab_child
from tuner.ab.child import run_child
from tuner.ab.measure import ABSettings, measure
from tuner.cli import main

HERE = Path(__file__).resolve().parent
TINY = f"{HERE / 'fixtures' / 'ab' / 'tiny_lm.py'}:TinyDecode"


def recorded(base=100.0, tuned=90.0, aa=100.0, jitter=0.2, tuned_err=1.0e-2, base_err=1.0e-2,
             tuned_agree=0.95, base_agree=0.95, aa_agree=0.95, steps=8, batch=2) -> dict:
    groups = 10
    wiggle = [jitter * ((i % 3) - 1) for i in range(groups)]
    forced = {name: {"error": [err] * steps, "agreement": [agree] * steps}
              for name, err, agree in (("baseline", base_err, base_agree),
                                       ("tuned", tuned_err, tuned_agree),
                                       ("aa", base_err, aa_agree))}
    ref = [[1, 2]] * steps
    return {"settings": {"steps": steps, "batch": batch},
            "group_us": {"baseline": [base + w for w in wiggle],
                         "tuned": [tuned + w for w in wiggle],
                         "aa": [aa + w for w in reversed(wiggle)]},
            "reference_tokens": ref,
            "outputs": {"teacher_forced": forced,
                        "free_running": {"baseline": ref, "tuned": ref[:3] + [[9, 9]] * (steps - 3),
                                         "aa": ref}}}


# ------------------------------------------------------------------------------ the verdict
def test_faster_beyond_the_aa_margin_with_outputs_in_the_floor_passes():
    v = abv.decide(recorded(), label="x")
    assert v.speedup == pytest.approx(100 / 90, rel=1e-3) and v.faster
    assert v.aa_margin < 0.01 and v.saving_us == pytest.approx(10.0)
    assert v.outputs_ok and v.exit_code == abv.EXIT_PASS
    fr = v.outputs["free_running"]
    assert fr["tuned"]["first_divergence_vs_baseline"] == 4
    assert fr["aa"]["first_divergence_vs_baseline"] is None


def test_a_speedup_inside_the_aa_noise_fails():
    # the A/A arm wanders by 2%: a 1% faster tuned arm is not evidence
    data = recorded(tuned=99.0)
    data["group_us"]["aa"] = [100.0 + (2.0 if i % 2 else -2.0) for i in range(10)]
    v = abv.decide(data, label="x")
    assert not v.faster and v.exit_code == abv.EXIT_FAIL
    assert "not faster beyond the A/A margin" in v.reasons[0]


def test_a_slower_tuned_arm_fails():
    v = abv.decide(recorded(tuned=105.0), label="x")
    assert v.speedup < 1 and v.exit_code == abv.EXIT_FAIL


def test_less_accurate_or_diverging_outputs_fail():
    worse = abv.decide(recorded(tuned_err=2.0e-2), label="x")
    assert not worse.outputs_ok and "2.00x the baseline" in worse.reasons[0]
    assert worse.exit_code == abv.EXIT_FAIL
    # agreement over 16 tokens at p = 0.95: the floor is 2 standard errors of the difference
    # of two rates, 2 * sqrt(2 * 0.95 * 0.05 / 16) = 0.154 (more than two tokens, 0.125)
    diverged = abv.decide(recorded(tuned_agree=0.95 - 3 / 16), label="x")
    assert not diverged.outputs_ok and "agreement" in diverged.reasons[0]
    assert diverged.outputs["agreement_floor"] == pytest.approx(0.1541, abs=1e-3)
    within = abv.decide(recorded(tuned_agree=0.95 - 2 / 16), label="x")
    assert within.outputs_ok
    # the H200 run of Qwen3-8B at batch 32: 0.512 against 0.525 over 16 x 32 tokens is noise
    h200 = abv.decide(recorded(tuned_agree=0.512, base_agree=0.525, aa_agree=0.525, batch=32,
                               steps=16), label="x")
    assert h200.outputs_ok and h200.outputs["agreement_floor"] > 0.05


def test_a_crash_is_a_reported_failure():
    v = abv.decide(None, label="x", crashed="the measurement process died at 'capture: tuned arm'")
    assert v.exit_code == abv.EXIT_FAIL and "capture: tuned arm" in abv.markdown(v)
    assert "CRASHED" in "\n".join(abv.summary_lines(v))


def test_attribution_splits_the_saving_per_shape_and_the_residual():
    base = [{"op": "aten::mm", "family": "gemm", "phase": "decode", "m": 1, "n": 4096, "k": 4096,
             "calls_per_step": 36.0, "us_per_call": 10.0, "kernels": "cublas_gemv; splitk_reduce",
             "step_us": 1000.0, "step_gpu_us": 900.0}]
    tuned = [{"op": "tuner::linear", "family": "gemm", "phase": "decode", "m": 1, "n": 4096,
              "k": 4096, "calls_per_step": 36.0, "us_per_call": 8.0, "kernels": "_gemv_kernel",
              "step_us": 880.0, "step_gpu_us": 820.0}]
    rows, residual = abv.attribution_rows({"baseline": base, "tuned": tuned},
                                          {"m=1,n=4096,k=4096": 60.0},
                                          {"baseline": 1000.0, "tuned": 880.0})
    (row,) = rows
    assert row["measured_saving_us"] == pytest.approx(72.0)
    assert row["projected_saving_us"] == 60.0
    assert row["baseline_kernels"] == ["cublas_gemv", "splitk_reduce"]
    assert residual["attributed_kernels_us"] == pytest.approx(72.0)
    assert residual["other_kernels_us"] == pytest.approx((900 - 360) - (820 - 288))
    assert residual["idle_and_launch_gaps_us"] == pytest.approx(100 - 60)


def test_the_grouped_attention_call_pairs_with_the_repeated_baseline_call():
    """The baseline's decode SDPA runs on KV heads transformers repeated (kv_heads = heads); the
    tuned arm's tuner::decode_attention on the grouped cache: one row, with its saving."""
    att = {"family": "attention", "phase": "decode", "batch": 32, "heads": 32, "kv_len": 146,
           "head_dim": 128, "calls_per_step": 36.0, "step_us": 8000.0, "step_gpu_us": 7800.0}
    base = [dict(att, op="aten::scaled_dot_product_attention", kv_heads=32, us_per_call=40.0,
                 kernels="cudnn_flash")]
    tuned = [dict(att, op="tuner::decode_attention", kv_heads=8, us_per_call=19.0,
                  kernels="decode_attention_kernel", step_us=5700.0, step_gpu_us=5500.0)]
    key = "attention b=32 h=32 kv=146 d=128"
    (row,), _ = abv.attribution_rows({"baseline": base, "tuned": tuned}, {key: 267.0},
                                     {"baseline": 8000.0, "tuned": 5700.0})
    assert row["shape"] == key and row["calls_per_step"] == 36.0
    assert row["measured_saving_us"] == pytest.approx(36 * 21.0)
    assert row["projected_saving_us"] == 267.0


def _moe_row(op: str, us_per_call: float, m: int = 8, **over) -> dict:
    """A harvested moe row of a 48-layer step (Qwen3-30B-A3B's experts at m tokens)."""
    return {"op": op, "family": "moe", "phase": "decode", "m": m, "n": 768, "k": 2048,
            "experts": 128, "topk": 8, "batch": 1, "dtype": "bfloat16", "calls_per_step": 48.0,
            "us_per_call": us_per_call, "kernels": f"{op}_kernel", "step_us": 9000.0,
            "step_gpu_us": 8000.0, **over}


def test_moe_calls_are_attributed_where_both_arms_have_their_rows():
    linear = {"op": "aten::mm", "family": "gemm", "phase": "decode", "m": 8, "n": 4096,
              "k": 2048, "calls_per_step": 48.0, "us_per_call": 10.0, "kernels": "gemm",
              "step_us": 9000.0, "step_gpu_us": 8000.0}
    key = "moe m=8 E=128 top8 hidden=2048 inter=768"
    base = [linear, _moe_row("vllm::outplace_fused_experts", 60.0)]
    tuned = [dict(linear, step_gpu_us=7000.0), _moe_row("tuner::moe", 40.0, step_gpu_us=7000.0)]
    rows, residual = abv.attribution_rows({"baseline": base, "tuned": tuned}, {key: 900.0},
                                          {"baseline": 9000.0, "tuned": 8000.0})
    moe = next(r for r in rows if r["shape"] == key)
    assert moe["calls_per_step"] == 48.0 and moe["measured_saving_us"] == pytest.approx(48 * 20.0)
    assert moe["projected_saving_us"] == 900.0
    assert moe["baseline_kernels"] == ["vllm::outplace_fused_experts_kernel"]
    assert residual["attributed_kernels_us"] == pytest.approx(48 * 20.0)
    assert residual["other_kernels_us"] == pytest.approx((8000 - 48 * 70) - (7000 - 48 * 50))

    # the tuned arm's row alone (transformers' grouped-mm experts give the baseline none): not
    # attributed; its time stays in the tuned arm's other kernels, as the baseline's does
    rows, residual = abv.attribution_rows({"baseline": [linear], "tuned": tuned}, {key: 900.0},
                                          {"baseline": 9000.0, "tuned": 8000.0})
    assert [r["shape"] for r in rows] == ["m=8,n=4096,k=2048"]
    assert residual["attributed_kernels_us"] == pytest.approx(0.0)
    assert residual["other_kernels_us"] == pytest.approx((8000 - 480) - (7000 - 480))
    # and so with rows of two different MoE shapes
    other = [linear, _moe_row("vllm::outplace_fused_experts", 60.0, m=16)]
    assert abv.paired_moe_keys({"baseline": other, "tuned": tuned}) == set()
    assert abv.paired_moe_keys({"baseline": base, "tuned": tuned}) == {key}


def test_the_ceiling_is_the_baseline_step_with_every_linear_at_its_floor():
    data = recorded(base=1000.0, tuned=900.0, aa=1000.0)
    base = [{"op": "aten::mm", "family": "gemm", "phase": "decode", "m": 1, "n": 4096, "k": 4096,
             "calls_per_step": 10.0, "us_per_call": 30.0, "kernels": "gemv", "step_us": 1000.0,
             "step_gpu_us": 950.0},
            {"op": "attention", "family": "attention", "phase": "decode", "batch": 1, "heads": 8,
             "kv_heads": 8, "kv_len": 64, "head_dim": 64, "calls_per_step": 10.0,
             "us_per_call": 5.0, "kernels": "sdpa", "step_us": 1000.0, "step_gpu_us": 950.0}]
    tuned = [dict(base[0], op="tuner::linear", us_per_call=21.0), base[1]]
    v = abv.decide(data, label="x", tables={"baseline": base, "tuned": tuned},
                   floors={"m=1,n=4096,k=4096": 200.0}, floor_profile="H200 (test)")
    # 300 µs of linear kernels per step, 200 at the floor: at most 1000 / 900
    assert v.ceiling_step_us == pytest.approx(900.0)
    assert v.ceiling_speedup == pytest.approx(1000.0 / 900.0, rel=1e-3)
    # the linears saved 90 µs of their 100 µs headroom; the step's other 10 µs are not theirs
    assert v.linear_saving_us == pytest.approx(90.0)
    assert v.ceiling_reached == pytest.approx(0.9, rel=1e-3)
    (linear,) = [r for r in v.attribution if r["shape"].startswith("m=")]
    assert linear["floor_us"] == 200.0
    text = abv.markdown(v)
    assert "Decode step: eager" in text and "Ceiling of linear tuning" in text and "H200 (test)" in text
    assert v.to_json()["ceiling_speedup"] == pytest.approx(1000.0 / 900.0, rel=1e-3)
    # without floors there is no ceiling, and no line about one
    plain = abv.decide(data, label="x", tables={"baseline": base, "tuned": tuned})
    assert not math.isfinite(plain.ceiling_step_us) and "Ceiling" not in abv.markdown(plain)


def test_linear_floors_cost_each_linear_shape_on_the_device_profile():
    rows = [{"op": "aten::mm", "family": "gemm", "phase": "decode", "m": 1, "n": 4096, "k": 4096,
             "batch": 1, "dtype": "bfloat16", "calls_per_step": 36.0},
            {"op": "attention", "family": "attention", "phase": "decode", "dtype": "bfloat16",
             "calls_per_step": 36.0}]
    floors, label = ab.linear_floors(rows, "NVIDIA H200")
    assert set(floors) == {"m=1,n=4096,k=4096"} and "H200" in label
    per_call = floors["m=1,n=4096,k=4096"] / 36.0
    # 33.6 MB at the H200's few TB/s: a handful of µs a call
    assert 5.0 < per_call < 10.0
    assert ab.linear_floors(rows, "cpu")[0] == {}


# ------------------------------------------------------------------ the measurement on CPU
@pytest.fixture
def export_dir(monkeypatch, tmp_path):
    """An export for the tiny LM's decode linears at batch 2 (written by tuner.export)."""
    from test_serving import IDENTITY, write_export

    monkeypatch.setattr(runtime, "current_identity", lambda: dict(IDENTITY))
    monkeypatch.delenv("TUNER_EXPORT_DIR", raising=False)
    runtime.reset()
    shapes = [("gemv", {"m": 2, "n": 64, "k": 64, "dtype": "bfloat16", "bias": 1}),
              ("gemv", {"m": 2, "n": 32, "k": 64, "dtype": "bfloat16", "bias": 1}),
              ("gemv", {"m": 2, "n": 64, "k": 96, "dtype": "bfloat16"})]
    write_export(tmp_path / "export", shapes)
    yield tmp_path / "export" / "nvidia-h200"
    runtime.reset()


def test_the_measurement_runs_every_arm_on_the_cpu(export_dir, tmp_path):
    settings = ABSettings(batch=2, prompt=4, steps=3, groups=2, replays=1,
                          export_dir=str(export_dir), out_dir=str(tmp_path / "ab"), device="cpu",
                          families=("gemv",), profile_steps=2)
    stages = []
    data = measure(("callable", TINY), settings, stages.append)
    assert stages[0].startswith("reference") and stages[-1] == "done"
    assert any(s.startswith("capture: tuned") for s in stages)
    assert set(data["group_us"]) == {"baseline", "tuned", "aa"}
    assert all(len(g) == 2 for g in data["group_us"].values())
    hits = data["serving"]["hits"]["gemv"]
    assert sum(hits.values()) >= 3  # the tuned arm's linears ran the Triton kernels
    forced = data["outputs"]["teacher_forced"]
    assert len(forced["tuned"]["error"]) == 3 and forced["baseline"]["error"][0] > 0
    assert forced["aa"] == forced["baseline"]  # the same path twice: the same numbers
    assert len(data["outputs"]["free_running"]["tuned"]) == 3
    for arm in ("baseline", "tuned", "aa"):
        assert Path(data["traces"][arm]["capture"]).exists()
    v = abv.decide(data, label="tiny")
    json.dumps(v.to_json())  # plain JSON, NaN as null
    assert v.outputs["error_ratio"] < 1.25  # the tuned kernels are as accurate as torch's


def test_the_compiled_step_runs_both_ways_and_the_tuned_arm_still_hits(export_dir, tmp_path):
    # aot_eager: Dynamo and AOTAutograd as --compile runs them, without needing a C++ compiler
    settings = ABSettings(batch=2, prompt=4, steps=2, groups=2, replays=1, compile="aot_eager",
                          export_dir=str(export_dir), out_dir=str(tmp_path / "ab"), device="cpu",
                          families=("gemv",), profile=False)
    stages = []
    data = measure(("callable", TINY), settings, stages.append)
    assert any("torch.compile aot_eager" in s for s in stages)
    # the compiled tuned step calls tuner::linear (installing recompiled it) ...
    assert sum(data["serving"]["hits"]["gemv"].values()) >= 3
    forced = data["outputs"]["teacher_forced"]
    # ... and uninstalling went back to the baseline's compiled code: A/A is the baseline
    assert forced["aa"] == forced["baseline"]
    v = abv.decide(data, label="tiny")
    assert v.step_mode == "torch.compile (aot_eager)"
    assert v.outputs["error_ratio"] < 1.25


def test_the_tuned_arm_can_run_its_own_step_beside_an_eager_baseline(export_dir, tmp_path):
    # --tuned-step compile beside --baseline eager: only the tuned arm is compiled (aot_eager)
    settings = ABSettings(batch=2, prompt=4, steps=2, groups=2, replays=1, compile="aot_eager",
                          baseline="eager", tuned_step="compile", export_dir=str(export_dir),
                          out_dir=str(tmp_path / "ab"), device="cpu", families=("gemv",),
                          profile_steps=1)
    stages = []
    data = measure(("callable", TINY), settings, stages.append)
    # each arm is profiled running its own step: only the tuned arm's is a compiled region
    compiled = {arm: "Torch-Compiled Region" in Path(data["traces"][arm]["capture"]).read_text()
                for arm in ("baseline", "tuned", "aa")}
    assert compiled == {"baseline": False, "tuned": True, "aa": False}
    captures = [s for s in stages if s.startswith("capture:")]
    assert captures[0] == "capture: baseline arm"
    assert "capture: tuned arm (compile, torch.compile aot_eager" in captures[1]
    assert captures[2] == "capture: aa arm"
    assert data["baseline"] == "eager" and data["tuned_step"] == "compile"
    assert sum(data["serving"]["hits"]["gemv"].values()) >= 3  # the compiled step still hits
    forced = data["outputs"]["teacher_forced"]
    assert forced["aa"] == forced["baseline"]
    v = abv.decide(data, label="tiny")
    assert v.step_mode == "eager" and v.tuned_step_mode == "torch.compile (aot_eager)"
    assert "the tuned arm: the export under torch.compile (aot_eager)" in abv.summary_lines(v)[0]
    assert "Tuned arm: the export under torch.compile (aot_eager)." in abv.markdown(v)


def test_a_wrong_tuned_step_is_one_line(capsys):
    assert main(["ab", TINY, "--tuned-step", "fast"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tuner: error:") and "--tuned-step 'fast': choose from" in err
    assert len(err.strip().splitlines()) == 1
    assert main(["ab", TINY, "--tuned-step", "compile", "--trace-only"]) == 2
    assert "--tuned-step does not apply" in capsys.readouterr().err


def test_a_crashing_arm_is_reported_with_its_stage(tmp_path, monkeypatch):
    monkeypatch.setenv("AB_TINY_CRASH", "tuned")
    settings = ABSettings(batch=2, prompt=4, steps=2, groups=2, replays=1, device="cpu",
                          reference=False, profile=False, families=("gemv",),
                          out_dir=str(tmp_path / "ab"))
    result = run_child(("callable", TINY), settings, tmp_path / "work", timeout_s=300)
    assert not result.ok and result.returncode < 0
    assert "capture: tuned arm" in result.reason and "SIGSEGV" in result.reason


def test_a_measurement_past_its_timeout_is_said_to_have_timed_out(tmp_path):
    settings = ABSettings(batch=2, prompt=4, steps=2, groups=2, replays=1, device="cpu",
                          reference=False, profile=False, families=("gemv",),
                          out_dir=str(tmp_path / "ab"))
    result = run_child(("callable", TINY), settings, tmp_path / "work", timeout_s=0.5)
    assert not result.ok
    assert result.reason.startswith("timed out: no result after 0.5s (at: ")
    assert "tuner ab --timeout" in result.reason


def test_a_child_that_hangs_after_writing_its_measurement_keeps_the_result(tmp_path, monkeypatch):
    monkeypatch.setenv("AB_TINY_HANG_AT_EXIT", "1")
    monkeypatch.setattr(ab_child, "EXIT_GRACE_S", 1.0)
    settings = ABSettings(batch=2, prompt=4, steps=2, groups=2, replays=1, device="cpu",
                          reference=False, profile=False, families=("gemv",),
                          out_dir=str(tmp_path / "ab"))
    started = time.time()
    result = run_child(("callable", TINY), settings, tmp_path / "work", timeout_s=300)
    assert result.ok and result.reason == "" and result.data["group_us"]
    assert time.time() - started < 120  # killed after the grace, not at the timeout


def test_ab_without_a_gpu_says_what_it_would_run(capsys):
    if ab._have_gpu():
        pytest.skip("this machine has a GPU")
    rc = main(["ab", TINY, "--batch", "1,32"])
    captured = capsys.readouterr()
    assert rc == 2 and "tuner ab would build" in captured.out and "batch 1, 32" in captured.out
    assert captured.err.startswith("tuner: error:") and "needs a CUDA or ROCm GPU" in captured.err


def test_ab_usage_errors_are_one_line(capsys):
    assert main(["ab"]) == 2
    assert "exactly one of" in capsys.readouterr().err
    assert main(["ab", TINY, "--batch", "one"]) == 2
    assert "--batch wants" in capsys.readouterr().err


def test_a_max_autotune_figure_is_said_to_be_one_draw_of_the_compile():
    data = recorded()
    v = abv.decide(data, label="x")
    assert v.baseline == "eager" and abv.draw_note(v) == ""
    assert not any(line.startswith("  note") for line in abv.summary_lines(v))
    for baseline, tuned in (("max-autotune", None), ("eager", "max-autotune")):
        v = abv.decide(dict(data, baseline=baseline, tuned_step=tuned or baseline), label="x")
        (line,) = [l for l in abv.summary_lines(v) if l.startswith("  note")]
        assert "one draw of the compile" in line and "A/A margin does not cover" in line
        assert "Note: Max-autotune picks its kernels" in abv.markdown(v)


def test_the_verdict_json_has_no_nan():
    v = abv.decide(recorded(), label="x")
    text = json.dumps(v.to_json())
    assert "NaN" not in text and math.isfinite(v.speedup)


def test_trace_only_profiles_the_baseline_step(tmp_path):
    settings = ABSettings(batch=2, prompt=4, steps=2, device="cpu", trace_only=True,
                          out_dir=str(tmp_path / "ab"), profile_steps=2)
    data = measure(("callable", TINY), settings)
    assert set(data["traces"]) == {"baseline"} and "group_us" not in data
    assert Path(data["traces"]["baseline"]["replay"]).stat().st_size > 0


def test_run_with_ab_on_a_machine_without_gpu_says_what_the_ab_would_run(tmp_path, capsys):
    if ab._have_gpu():
        pytest.skip("this machine has a GPU")
    example = HERE.parent / "shapes" / "examples" / "qwen25_05b_b4_live.pt.trace.json.gz"
    rc = main(["run", str(example), "--graph-captured", "--ab", TINY, "--ab-batch", "2",
               "-o", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert rc == 0 and "tuner ab would build" in out and "at batch 2" in out
    assert "tuner ab needs a GPU" in out


def _attention_export_and_row(monkeypatch, tmp_path, exported_kv_heads: int) -> dict:
    """On 'an H200': an export of one decode attention entry (8 query heads on
    `exported_kv_heads`, kv_len 162; write_export records 5.0 -> 4.0 us a call) and the baseline
    step's harvested row of that call (kv_len 146, as transformers records it: kv_heads = heads)."""
    from test_serving import IDENTITY, write_export

    monkeypatch.setattr(runtime, "current_identity", lambda: dict(IDENTITY))
    monkeypatch.delenv("TUNER_EXPORT_DIR", raising=False)
    shape = {"batch": 4, "heads": 8, "kv_heads": exported_kv_heads, "kv_len": 162,
             "head_dim": 64, "dtype": "bfloat16"}
    write_export(tmp_path / "export", [("attention", shape)])
    return {"op": "aten::scaled_dot_product_attention", "family": "attention",
            "phase": "decode", "batch": 4, "heads": 8, "kv_heads": 8, "kv_len": 146,
            "head_dim": 64, "q_len": 1, "m": 1, "n": 146, "k": 64, "dtype": "bfloat16",
            "calls_per_step": 36.0, "us_per_call": 10.0}


def test_the_export_projects_its_attention_saving_at_the_nearest_kv_len(monkeypatch, tmp_path):
    """The step's decode attention (kv_len 146) resolves to the exported kv_len 162 entry as
    serving resolves it: its measured saving per call x the step's calls is projected."""
    row = _attention_export_and_row(monkeypatch, tmp_path, exported_kv_heads=8)
    projected = ab.projected_savings(tmp_path / "export" / "nvidia-h200", [row]).savings
    # write_export records 5.0 -> 4.0 us a call
    assert projected == {"attention b=4 h=8 kv=146 d=64": pytest.approx(36.0)}
    runtime.reset()


def test_the_baseline_steps_repeated_call_projects_the_entry_the_tuned_step_served(monkeypatch,
                                                                                 tmp_path):
    """The baseline step records transformers' call after repeat_kv (kv_heads = heads); the tuned
    step ran it on the model's grouped cache, whose entry (an export harvested with --kv-heads)
    is projected for that row (on the H200 the attention row said 'projected -'). A real MHA
    model's call (the tuned step ran it with kv_heads = heads too) takes no grouped entry."""
    row = _attention_export_and_row(monkeypatch, tmp_path, exported_kv_heads=2)
    tuned = {**row, "op": "tuner::decode_attention", "kv_heads": 2}
    folder = tmp_path / "export" / "nvidia-h200"
    assert ab.projected_savings(folder, [row], [tuned]).savings == {
        "attention b=4 h=8 kv=146 d=64": pytest.approx(36.0)}
    assert ab.projected_savings(folder, [row], [row]).savings == {}   # MHA: served as it was recorded
    assert ab.projected_savings(folder, [row]).savings == {}
    runtime.reset()


def test_the_projection_splits_its_error_into_the_baselines_and_the_candidates(monkeypatch,
                                                                                tmp_path):
    """rank timed max-autotune's kernels alone at 5.0 us a call and the candidates at 4.0
    (write_export). In the step (as on the H200, Qwen3-8B batch 1: another compile draw, an
    RMSNorm fused into one) the k/v baseline kernel took 3.65 us and the down one 10.0, the
    tuned kernels 3.81 and 4.1. rank projects 108 us; against the step's own baseline kernels
    the export projects 190.8, which the measured 180 is near: the baseline's error, not the
    candidates' (their 432 us alone took 437.9 in the step)."""
    from test_serving import IDENTITY, write_export

    monkeypatch.setattr(runtime, "current_identity", lambda: dict(IDENTITY))
    monkeypatch.delenv("TUNER_EXPORT_DIR", raising=False)
    write_export(tmp_path / "export", [
        ("gemv", {"m": 1, "n": 1024, "k": 4096, "dtype": "bfloat16"}),
        ("gemv", {"m": 1, "n": 4096, "k": 12288, "dtype": "bfloat16"})])

    def row(n, k, calls, us, **over):
        return {"op": "aten::mm", "family": "gemm", "phase": "decode", "m": 1, "n": n, "k": k,
                "batch": 1, "dtype": "bfloat16", "layout": "NT", "calls_per_step": calls,
                "us_per_call": us, "kernels": "triton_red_fused_mm", "step_us": 5281.6,
                "step_gpu_us": 5200.0, **over}

    base = [row(1024, 4096, 72.0, 3.65), row(4096, 12288, 36.0, 10.0)]
    tuned = [row(1024, 4096, 72.0, 3.81, op="tuner::linear", kernels="_gemv_kernel"),
             row(4096, 12288, 36.0, 4.1, op="tuner::linear", kernels="_gemv_kernel")]
    kv, down = "m=1,n=1024,k=4096", "m=1,n=4096,k=12288"
    projection = ab.projected_savings(tmp_path / "export" / "nvidia-h200", base, tuned)
    projected, alone = projection.savings, projection.alone
    assert projected == {kv: pytest.approx(72.0), down: pytest.approx(36.0)}
    assert alone == {kv: {"baseline_us": pytest.approx(360.0), "candidate_us": pytest.approx(288.0)},
                     down: {"baseline_us": pytest.approx(180.0),
                            "candidate_us": pytest.approx(144.0)}}
    v = abv.decide(recorded(base=5281.6, tuned=5101.6, aa=5281.6), label="x",
                   tables={"baseline": base, "tuned": tuned}, projected=projected, alone=alone)
    rows = {r["shape"]: r for r in v.attribution}
    assert rows[kv]["alone_baseline_us"] == pytest.approx(360.0)
    assert rows[down]["alone_tuned_us"] == pytest.approx(144.0)
    assert v.measured_over_projected == pytest.approx(180.0 / 108.0, rel=1e-3)
    assert v.step_projected_us == pytest.approx(72 * 3.65 - 288.0 + 360.0 - 144.0)
    assert v.measured_over_step_projected == pytest.approx(180.0 / 190.8, rel=1e-3)
    split = abv.projection_split(v)
    assert "baseline kernels took 622.8 µs a step here against 540.0" in split
    assert "tuned kernels 421.9 against 432.0" in split
    assert "the export projects 190.8 µs (measured/projected 0.94)" in abv.markdown(v)
    assert any(line.startswith("  split ") and "190.8 us" in line for line in abv.summary_lines(v))
    assert v.to_json()["measured_over_step_projected"] == pytest.approx(0.943, abs=1e-3)
    # the A/B's report.html says it beside the projection
    from tuner.report import write_ab_report
    folder = tmp_path / "x-b1-max-autotune"
    folder.mkdir()
    (folder / "ab.json").write_text(json.dumps(v.to_json()))
    write_ab_report(folder, out=lambda line: None)
    assert ("against this step's own baseline kernels (the baseline's kernels in the step, less "
            "the candidates as rank timed them alone) 190.8 projected (measured / projected 0.94)"
            in (folder / "report.html").read_text().replace("&#x27;", "'"))
    # no shape projected (no export): no split
    plain = abv.decide(recorded(), label="x", tables={"baseline": base, "tuned": tuned})
    assert abv.projection_split(plain) == "" and "Projection split" not in abv.markdown(plain)
    runtime.reset()


def test_the_export_projects_its_moe_saving_at_the_nearest_m(monkeypatch, tmp_path):
    """The moe.json entry at m = 16 serves the step's m = 12 calls (tuner.runtime's nearest m):
    its measured saving per call (write_export: 5.0 -> 4.0 us) x the step's 48 calls; a call of
    another structure (64 experts) has no entry. Without moe rows in the baseline step (its
    grouped-mm experts give none) the tuned step's tuner::moe rows are projected."""
    from tuner_kernels import get_family
    from test_serving import IDENTITY, write_export
    from tuner.shapetable import attribution_key

    monkeypatch.setattr(runtime, "current_identity", lambda: dict(IDENTITY))
    monkeypatch.delenv("TUNER_EXPORT_DIR", raising=False)
    write_export(tmp_path / "export", [("moe", {"m": 16, "experts": 128, "topk": 8,
                                                "hidden": 2048, "inter": 768,
                                                "dtype": "bfloat16"})])
    folder = tmp_path / "export" / "nvidia-h200"
    served = _moe_row("vllm::outplace_fused_experts", 60.0, m=12)
    other = _moe_row("vllm::outplace_fused_experts", 60.0, m=12, experts=64)
    key = "moe m=12 E=128 top8 hidden=2048 inter=768"
    projection = ab.projected_savings(folder, [served, other], [])
    assert projection.savings == {key: pytest.approx(48.0)}
    assert projection.paths == ["eager"]
    # the report names a verdict's moe shape (hidden, inter) as the attribution names the row
    shape = get_family("moe").shape_from_row(served)
    assert attribution_key({"family": "moe", **shape}) == attribution_key(served) == key
    tuned = _moe_row("tuner::moe", 40.0, m=12)
    assert ab.projected_savings(folder, [], [tuned]).savings == {key: pytest.approx(48.0)}
    # the baseline step's own moe rows are the calls projected when it has them
    assert ab.projected_savings(folder, [other], [tuned]).savings == {}
    # a step with no moe call anywhere projects none
    linear = {"op": "aten::mm", "family": "gemm", "phase": "decode", "m": 12, "n": 768,
              "k": 2048, "batch": 1, "dtype": "bfloat16", "layout": "NT", "calls_per_step": 48.0}
    assert ab.projected_savings(folder, [linear], [linear]).savings == {}
    runtime.reset()


def test_the_trace_only_hint_names_the_models_kv_heads(tmp_path):
    grouped = tmp_path / "llama.json"
    grouped.write_text(json.dumps({"num_attention_heads": 32, "num_key_value_heads": 8}))
    mha = tmp_path / "mha.json"
    mha.write_text(json.dumps({"num_attention_heads": 16}))
    assert ab._kv_heads_flag(("hf", str(grouped))) == " --kv-heads 8"
    assert ab._kv_heads_flag(("hf", str(mha))) == ""
    assert ab._kv_heads_flag(("hf", str(tmp_path / "missing.json"))) == ""
    assert ab._kv_heads_flag(("callable", "x.py:Step")) == ""


# --------------------------------------------------- --phase prefill / mixed (tuner.ab.harness)
TINY_LLAMA = HERE / "fixtures" / "ab" / "tiny_llama_gqa.json"


@pytest.fixture
def prefill_export(monkeypatch, tmp_path):
    """An export for the tiny Llama's k / v projections at m = 12 (a 12-token prompt)."""
    from test_serving import IDENTITY, write_export

    monkeypatch.setattr(runtime, "current_identity", lambda: dict(IDENTITY))
    monkeypatch.delenv("TUNER_EXPORT_DIR", raising=False)
    runtime.reset()
    write_export(tmp_path / "export",
                 [("gemm", {"m": 12, "n": 128, "k": 256, "dtype": "bfloat16", "layout": "NT"})])
    yield tmp_path / "export" / "nvidia-h200"
    runtime.reset()


@pytest.mark.parametrize("phase", ["prefill", "mixed"])
def test_the_prefill_and_mixed_steps_run_every_arm_on_the_cpu(prefill_export, tmp_path, phase):
    pytest.importorskip("transformers")
    settings = ABSettings(batch=1, prompt=4, steps=2, groups=2, replays=1, device="cpu",
                          export_dir=str(prefill_export), out_dir=str(tmp_path / "ab"),
                          families=("gemm",), profile=False, phase=phase, prompt_tokens=12)
    data = measure(("hf", str(TINY_LLAMA)), settings)
    assert set(data["group_us"]) == {"baseline", "tuned", "aa"}
    # the tuned step's 12-token linears ran the exported Triton config (both layers' k and v)
    hits = data["serving"]["hits"]["gemm"]
    assert hits and all(key.startswith("m=12,n=128,k=256") for key in hits)
    forced = data["outputs"]["teacher_forced"]
    assert forced["aa"] == forced["baseline"]
    rows = 2 if phase == "mixed" else 1  # mixed: the decode sequence, then the chunk
    assert all(len(step) == rows for step in data["reference_tokens"])
    assert len(data["reference_tokens"]) == 2 and len(forced["tuned"]["error"]) == 2
    v = abv.decide(data, label="tiny")
    assert v.outputs["error_ratio"] < 1.25


def test_the_prefill_step_slides_its_prompt_window():
    pytest.importorskip("transformers")
    import torch

    from tuner.ab.harness import HFPrefill, hf_factory, make_harness, phase_harness

    base = make_harness(hf_factory(TINY_LLAMA), batch=2, prompt=4, steps=2, dtype=torch.float32,
                        device="cpu")
    step = phase_harness(base, "prefill", 6)
    assert isinstance(step, HFPrefill) and step.window.shape == (2, 6)
    first = step.prefill()
    assert torch.equal(step.decode(), first)  # a replayed step rewrites the same cache slots
    window = step.window.clone()
    step.feed(torch.tensor([7, 8]))
    assert torch.equal(step.window[:, :-1], window[:, 1:]) and step.window[:, -1].tolist() == [7, 8]
    assert not torch.equal(step.decode(), first)
    step.prefill()
    assert torch.equal(step.window, window)


def test_phase_usage_errors_and_the_plan(capsys):
    assert main(["ab", TINY, "--phase", "prefill"]) == 2
    assert "--phase prefill needs --hf-config" in capsys.readouterr().err
    assert main(["ab", "--hf-config", str(TINY_LLAMA), "--phase", "mixed", "--prompt-tokens", "0"]) == 2
    assert "--prompt-tokens must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["ab", "--hf-config", str(TINY_LLAMA), "--phase", "chunked"])
    assert exit_info.value.code == 2
    capsys.readouterr()
    if ab._have_gpu():
        return
    assert main(["ab", "--hf-config", str(TINY_LLAMA), "--phase", "prefill", "--prompt-tokens", "512"]) == 2
    out = capsys.readouterr().out
    assert "capture its prefill step (the first forward of a 512-token prompt)" in out
    assert main(["ab", "--hf-config", str(TINY_LLAMA), "--phase", "mixed"]) == 2
    assert "decode step plus one 2048-token prefill chunk" in capsys.readouterr().out


def test_the_other_kernels_name_where_the_residual_went():
    attribution = [{"baseline_kernels": ["triton_tem_fused_mm_mul_silu"],
                    "tuned_kernels": ["skinny_tma_kernel"]}]
    kernels = {"baseline": {"triton_tem_fused_mm_mul_silu": (500.0, 36.0),
                            "triton_red_fused_rms_norm": (80.0, 72.0),
                            "triton_poi_fused_rotary": (40.0, 36.0)},
               "tuned": {"skinny_tma_kernel": (400.0, 36.0),
                         "triton_red_fused_rms_norm": (82.0, 72.0),
                         "triton_poi_fused_mul_silu": (150.0, 36.0),
                         "triton_poi_fused_rotary": (10.0, 36.0)}}
    rows = abv.other_kernel_changes(kernels, attribution, top=2)
    # the attributed linears' kernels are left out; a fusion the tuned compile no longer makes
    # shows as a kernel from zero
    assert [r["kernel"] for r in rows] == ["triton_poi_fused_mul_silu", "triton_poi_fused_rotary"]
    assert rows[0]["change_us"] == 150.0 and rows[0]["baseline_launches"] == 0.0
    assert rows[1]["change_us"] == -30.0
    v = abv.decide(recorded(), label="x", kernels=kernels)
    assert v.other_kernels and "triton_poi_fused_mul_silu" in abv.markdown(v)
    assert any("other kernels, the largest changes" in line for line in abv.summary_lines(v))
    assert abv.other_kernel_changes({"baseline": kernels["baseline"]}, attribution) == []


# kernels max-autotune compiled for Llama-3.1-8B's decode step at batch 1 on an H200 (the names
# a profiled A/B recorded): a residual add and RMSNorm fused into the q/k/v matmul's reduction,
# SiLU·mul into the down projection's, a plain template, a norm alone, cuBLAS
MAX_AUTOTUNE_B1 = {
    "norm_mm": "triton_red_fused__to_copy__unsafe_view_add_mean_mm_mul_pow_rsqrt_18",
    # the k/v projection with the cache position (arange, index_copy): its add is no residual's
    "norm_kv": "triton_red_fused__to_copy__unsafe_view_add_arange_index_copy_mean_mm_mul_pow_"
               "rsqrt_t_transpose_view_17",
    "rotary_mm": "triton_poi_fused__to_copy__unsafe_view_add_arange_bmm_cat_cos_expand_index_copy_"
                 "mm_mul_neg_sin_slice_transpose_unsqueeze_view_4",
    "silu_mm": "triton_red_fused__unsafe_view_mm_mul_silu_t_view_9",
    "mm": "triton_tem_fused_mm_t_view_8",
    "norm": "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_12",
    "cublas": "nvjet_sm90_tst_128x8_64x12_2x1_v_bz_splitK_TNT",
}


def test_the_neighbours_a_compiled_linear_fused_are_read_from_its_kernel_names():
    from tuner.harvest import fused_neighbours

    k = MAX_AUTOTUNE_B1
    assert fused_neighbours([k["norm_mm"]]) == ["RMSNorm", "residual add"]
    assert fused_neighbours([k["norm_kv"]]) == ["RMSNorm"]
    assert fused_neighbours([k["rotary_mm"]]) == ["rotary"]
    assert fused_neighbours([k["silu_mm"], k["mm"]]) == ["SiLU"]
    # a linear with a bias is an addmm; a LayerNorm subtracts its mean
    assert fused_neighbours(["triton_tem_fused_addmm_mean_mul_pow_rsqrt_3"]) == ["RMSNorm"]
    assert fused_neighbours(["triton_red_fused_addmm_native_layer_norm_rsqrt_sub_var_mean_2"]) \
        == ["LayerNorm"]
    # a grouped matmul (MoE) or a batched one (attention) is no linear's mm
    assert fused_neighbours(["triton_tem_fused__grouped_mm_mul_silu_1",
                             "triton_poi_fused_bmm_cos_sin_2"]) == []
    # no matmul in it (the norm the tuned step runs alone), a plain template, cuBLAS: nothing
    assert fused_neighbours([k["norm"], k["mm"], k["cublas"], "_gemv_kernel"]) == []


def test_a_linear_whose_baseline_kernel_fused_its_norm_says_the_tuned_step_runs_it_apart():
    k = MAX_AUTOTUNE_B1
    row = {"op": "aten::mm", "family": "gemv", "phase": "decode", "m": 1, "n": 1024, "k": 4096,
           "calls_per_step": 64.0, "step_us": 4800.0, "step_gpu_us": 4700.0}
    base = [dict(row, us_per_call=6.3, kernels=k["norm_mm"]),
            dict(row, n=4096, k=14336, us_per_call=31.0, kernels=k["silu_mm"])]
    tuned = [dict(row, op="tuner::linear", us_per_call=3.9, kernels="_gemv_kernel"),
             dict(row, op="aten::mm", n=4096, k=14336, us_per_call=30.0,
                  kernels=k["cublas"])]
    rows, _ = abv.attribution_rows({"baseline": base, "tuned": tuned}, {})
    unfused = {r["shape"]: r["unfused"] for r in rows}
    assert unfused == {"m=1,n=1024,k=4096": ["RMSNorm", "residual add"],
                       "m=1,n=4096,k=14336": ["SiLU"]}
    v = abv.decide(recorded(), label="x", tables={"baseline": base, "tuned": tuned})
    line = next(l for l in abv.summary_lines(v) if l.startswith("  unfused"))
    assert "m=1,n=1024,k=4096 (RMSNorm, residual add)" in line and "opaque" in line
    md = abv.markdown(v)
    assert "Unfused: The baseline's kernels of " in md and "(RMSNorm, residual add)" in md
    # the same kernels in both arms: nothing unfused, no line
    same, _ = abv.attribution_rows({"baseline": base, "tuned": base}, {})
    assert all(r["unfused"] == [] for r in same)


def test_kernel_totals_are_per_step_of_a_real_trace(shared_traces):
    from tuner.harvest import kernel_totals

    totals, steps = kernel_totals(shared_traces / "qwen25_05b_b4_decode.pt.trace.json.gz")
    assert steps == 7  # its ProfilerStep markers
    us, launches = totals["nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT"]
    assert us > 0 and launches * steps == pytest.approx(round(launches * steps))
    assert sum(us for us, _ in totals.values()) > 1000.0  # the 0.5B decode step's GPU time


def test_fold_norms_folds_the_tuned_arms_norms_and_says_so(monkeypatch, tmp_path):
    """tuner ab --fold-norms on a small Llama (CPU, interpreter): the tuned arm folds each decoder
    layer's two norms (every projection exported with a norm-capable config), its outputs stay
    as accurate as the baseline's, ab.md says how many were folded; without the flag none is."""
    pytest.importorskip("transformers")
    from test_serving import IDENTITY, write_export

    monkeypatch.setattr(runtime, "current_identity", lambda: dict(IDENTITY))
    monkeypatch.delenv("TUNER_EXPORT_DIR", raising=False)
    runtime.reset()
    from test_harvest_transformers import TINY_LLAMA

    path = tmp_path / "tiny_llama.json"
    path.write_text(json.dumps(dict(TINY_LLAMA, num_hidden_layers=2)))
    shapes = [{"m": 1, "n": n, "k": k, "dtype": "bfloat16"}
              for n, k in ((64, 64), (32, 64), (128, 64), (64, 128), (256, 64))]
    write_export(tmp_path / "export", [("gemv", s) for s in shapes])
    folded = {}
    for fold in (True, False):
        settings = ABSettings(batch=1, prompt=4, steps=2, groups=1, replays=1, device="cpu",
                              export_dir=str(tmp_path / "export" / "nvidia-h200"),
                              out_dir=str(tmp_path / f"ab-{fold}"), families=("gemv",),
                              profile=False, fold_norms=fold)
        data = measure(("hf", str(path)), settings, lambda stage: None)
        folded[fold] = data["serving"]["norms_folded"]
        v = abv.decide(data, label="tiny")
        assert v.outputs["error_ratio"] < 1.25
        md = abv.markdown(v)
        assert ("4 decoder-layer RMSNorms folded" in md) == fold
        assert ("0 residual adds into the kernels" in md) == fold  # eager: nothing compiled
    assert folded == {True: 4, False: 0}
    runtime.reset()


def test_an_export_leaves_out_the_entries_whose_calls_the_whole_step_ran_slower(monkeypatch,
                                                                               tmp_path, capsys):
    """tuner ab records which export entries served each attributed call; `tuner export
    --drop-step-losses ab.json` re-exports the same verdicts without the entries whose calls the
    step ran slower (a gemv entry, and the attention family's only entry, whose file goes with
    it), and keeps the one that saved time. An ab.json without the entries is refused."""
    from test_serving import IDENTITY, accepted_verdicts
    from tuner import rank

    monkeypatch.setattr(runtime, "current_identity", lambda: dict(IDENTITY))
    monkeypatch.delenv("TUNER_EXPORT_DIR", raising=False)
    gate_up = {"m": 1, "n": 1536, "k": 512, "dtype": "bfloat16"}
    down = {"m": 1, "n": 512, "k": 768, "dtype": "bfloat16"}
    attention = {"batch": 4, "heads": 8, "kv_heads": 8, "kv_len": 162, "head_dim": 64,
                 "dtype": "bfloat16"}
    table = accepted_verdicts([("gemv", gate_up), ("gemv", down), ("attention", attention)])
    parquet, _ = rank.write(table, tmp_path / "verdicts", "nvidia-h200-all")
    out = tmp_path / "export"
    assert main(["export", str(parquet), "-o", str(out)]) == 0
    folder = out / "nvidia-h200"

    def linear(shape):
        return {"op": "aten::mm", "family": "gemm", "phase": "decode", "batch": 1,
                "layout": "NT", "calls_per_step": 36.0, "us_per_call": 5.0, **shape}
    rows = [linear(gate_up), linear(down),
            {"op": "aten::scaled_dot_product_attention", "family": "attention",
             "phase": "decode", "q_len": 1, "m": 1, "n": 146, "k": 64, "calls_per_step": 36.0,
             "us_per_call": 10.0, **attention, "kv_len": 146}]
    projection = ab.projected_savings(folder, rows, [])
    projected, entries = projection.savings, projection.entries
    keys = {"gemv": sorted(json.loads((folder / "gemv.json").read_text())["configs"]),
            "attention": sorted(json.loads((folder / "attention.json").read_text())["configs"])}
    names = ["m=1,n=1536,k=512", "m=1,n=512,k=768", "attention b=4 h=8 kv=146 d=64"]
    assert sorted(projected) == sorted(entries) == sorted(names)
    gate_up_key = next(k for k in keys["gemv"] if "n=1536" in k)
    assert entries[names[0]] == [{"family": "gemv", "key": gate_up_key}]
    assert entries[names[2]] == [{"family": "attention", "key": keys["attention"][0]}]

    saved = {names[0]: -31.7, names[1]: 12.0, names[2]: -2.5}
    record = {"label": "tiny-b1-max-autotune", "attribution": [
        {"shape": n, "measured_saving_us": saved[n], "projected_saving_us": projected[n],
         "export_entries": entries[n]} for n in names],
        "arms": {"baseline": {"median_us": 5281.6}, "tuned": {"median_us": 4612.4}}}
    ab_json = tmp_path / "ab.json"
    ab_json.write_text(json.dumps(record))
    capsys.readouterr()
    assert main(["export", str(parquet), "-o", str(out), "--drop-step-losses", str(ab_json)]) == 0
    err = capsys.readouterr().err
    assert (f"not exported: gemv {gate_up_key}: the whole step (tiny-b1-max-autotune) ran its "
            f"calls m=1,n=1536,k=512 31.7 µs a step slower") in err
    assert "not exported: attention" in err
    # what the step would take without them: the two losses (34.2 µs) back at the baseline's
    assert ("tiny-b1-max-autotune: without those entries the tuned step would take about "
            "4578.2 µs against the baseline's 5281.6 (1.1536×, from 4612.4 µs and 1.1451×; an "
            "estimate from the per-shape rows: A/B the new export to measure it)") in err
    gemv = json.loads((folder / "gemv.json").read_text())["configs"]
    assert sorted(gemv) == [k for k in keys["gemv"] if k != gate_up_key]
    assert not (folder / "attention.json").exists()
    assert sorted(json.loads((folder / "manifest.json").read_text())["families"]) == ["gemv"]

    for r in record["attribution"]:
        del r["export_entries"]
    ab_json.write_text(json.dumps(record))
    assert main(["export", str(parquet), "-o", str(out), "--drop-step-losses", str(ab_json)]) == 2
    assert "an older `tuner ab`" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("[1, 2]")
    assert main(["export", str(parquet), "--drop-step-losses", str(tmp_path / "bad.json")]) == 2
    assert "not a `tuner ab` result" in capsys.readouterr().err
    runtime.reset()
