"""Budget screening: worked examples checked by hand, pruning decisions, and bad input.

Units: every time is in µs unless the name says ms; shares are fractions (0.005 = 0.5%).
The H200 spec profile used below has read bandwidth 4.8e12 B/s and bf16 matmul 989e12 flop/s.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pandas as pd
import pytest

from tuner import units

from tuner import budget, shapetable
from tuner.units import Threshold
from tuner.cli import main
from tuner.device import load_profile, save_profile
from tuner.errors import TunerError

H200 = load_profile("h200")


def gemm_row(**overrides) -> dict:
    """A decode linear of Qwen2.5-0.5B at batch 4 (o_proj: n = k = 896), 24 calls per step."""
    row = dict(op="aten::mm", family="gemm", phase="decode", m=4, n=896, k=896, batch=1,
               dtype="bfloat16", layout="NT", calls=144, steps=6, calls_per_step=24.0,
               us_per_call=5.0, step_us=30_000.0, step_gpu_us=4_000.0, share=0.004,
               kernels="gemv_kernel", source="hand-built", device="NVIDIA H200")
    row.update(overrides)
    return row


def table(*rows: dict) -> pd.DataFrame:
    return shapetable.normalize(pd.DataFrame(list(rows)))


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code: int, err: str, match: str) -> None:
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tuner: error:"), err
    assert match in lines[0], lines[0]


# ------------------------------------------------------------------------------ bytes, flops, floor
def test_gemm_bytes_flops_and_floor_by_hand():
    row = table(gemm_row()).iloc[0]
    nbytes, nflops, why = budget.bytes_and_flops(row)
    # A[4,896] + B[896,896] + out[4,896] = 3584 + 802816 + 3584 = 809984 elements x 2 bytes
    assert why == "" and nbytes == 1_619_968
    assert nflops == 2 * 4 * 896 * 896 == 6_422_528
    # memory: 1619968 B / 4.8e12 B/s = 0.33749 µs; compute: 6422528 / 989e12 = 0.0065 µs
    assert budget.floor_us(nbytes, nflops, "bfloat16", H200) == pytest.approx(0.33749, rel=1e-4)


def test_addmm_reads_the_bias_and_bmm_counts_the_batch():
    bias = table(gemm_row(op="aten::addmm", n=1152)).iloc[0]
    # 4*896 + 896*1152 + 4*1152 + 1152 (bias) = 3584 + 1032192 + 4608 + 1152 = 1041536 elements
    assert budget.bytes_and_flops(bias)[0] == 2 * 1_041_536
    bmm = table(gemm_row(op="aten::bmm", m=16, n=32, k=64, batch=8, dtype="float32")).iloc[0]
    # 8 x (16*64 + 64*32 + 16*32) = 8 x 3584 = 28672 elements x 4 bytes; flops 2*16*32*64*8
    assert budget.bytes_and_flops(bmm)[:2] == (28_672 * 4, 2 * 16 * 32 * 64 * 8)


def test_prefill_gemm_is_compute_bound():
    row = table(gemm_row(phase="prefill", m=512, n=4864, k=896)).iloc[0]
    nbytes, nflops, _ = budget.bytes_and_flops(row)
    # memory: (512*896 + 896*4864 + 512*4864) * 2 = 14614528 B / 4.8e12 = 3.0447 µs
    # compute: 2*512*4864*896 = 4462739456 flop / 989e12 = 4.5124 µs  -> the floor
    assert nbytes / 4.8e12 * 1e6 == pytest.approx(3.0447, rel=1e-4)
    assert budget.floor_us(nbytes, nflops, "bfloat16", H200) == pytest.approx(4.5124, rel=1e-4)
    # fp8 matmuls may beat the bf16 rate, so only the (lower) bandwidth floor applies to them
    assert budget.floor_us(nbytes, nflops, "float8_e4m3fn", H200) == pytest.approx(3.0447, rel=1e-4)


def test_attention_bytes_and_flops_by_hand():
    row = table(gemm_row(op="aten::scaled_dot_product_attention", family="attention", batch=4,
                         heads=14, kv_heads=2, q_len=1, kv_len=133, head_dim=64)).iloc[0]
    nbytes, nflops, why = budget.bytes_and_flops(row)
    # q + out: 2 * 4*14*1*64 = 7168; k + v cache: 2 * 4*2*133*64 = 136192 -> 143360 elements x 2 B
    assert why == "" and nbytes == 286_720
    assert nflops == 4 * 4 * 14 * 1 * 133 * 64 == 1_906_688


def test_rows_without_a_model_keep_the_whole_baseline_as_headroom():
    rows = table(gemm_row(family="attention", op="aten::_flash_attention_forward"),
                 gemm_row(dtype="complex32"))
    result = budget.compute(rows, H200, threshold=Threshold(us_per_token=100.0))
    assert result["floor_us"].isna().all()
    # no floor: the headroom can be at most the baseline, 5 µs x 24 calls = 120 µs per token
    assert (result["headroom_us_per_token"] == 120.0).all()
    # 0.5 x 120 = 60 < 100 µs: pruned, and the reason says the floor was unknown
    assert (result["verdict"] == "prune").all()
    assert result["reason"].str.contains("floor unknown").all()


# ------------------------------------------------------------------------------ headroom and verdict
def test_headroom_per_token_share_and_default_verdict_by_hand():
    result = budget.compute(table(gemm_row()), H200, threshold=units.DEFAULT_THRESHOLD)
    row = result.iloc[0]
    # per call: 5 - 0.33749 = 4.66251 µs; per token: x 24 calls x hit rate 1 = 111.90 µs
    assert row["headroom_us_per_call"] == pytest.approx(4.66251, rel=1e-4)
    assert row["headroom_us_per_token"] == pytest.approx(111.900, rel=1e-4)
    # share of a 30 ms = 30000 µs step: 111.9 / 30000 = 0.373%
    assert row["headroom_share"] == pytest.approx(0.0037300, rel=1e-3)
    # default: 0.5 x 0.373% = 0.187% < 0.5% -> prune
    assert row["verdict"] == "prune" and "< 0.5%" in row["reason"]
    # GPU busy 4 ms of 30 ms = 13.3%: launch-bound
    assert row["gpu_busy_share"] == pytest.approx(4000 / 30000) and row["launch_bound"]


def test_threshold_in_us_and_hit_rate_move_the_decision():
    rows = table(gemm_row())
    # 0.5 x 111.9 = 55.95 µs/token: >= 50 µs keeps, >= 60 µs does not
    assert budget.compute(rows, H200, threshold=Threshold(us_per_token=50.0)).at[0, "verdict"] == "keep"
    assert budget.compute(rows, H200, threshold=Threshold(us_per_token=60.0)).at[0, "verdict"] == "prune"
    # hit rate 0.5 halves it: 0.5 x 55.95 = 27.97 µs/token < 50 -> prune
    half = budget.compute(rows, H200, threshold=Threshold(us_per_token=50.0), hit_rate=0.5)
    assert half.at[0, "headroom_us_per_token"] == pytest.approx(55.950, rel=1e-4)
    assert half.at[0, "verdict"] == "prune"
    # safety 1.0 (trust the full headroom): 111.9 >= 100 -> keep
    full = budget.compute(rows, H200, threshold=Threshold(us_per_token=100.0, safety=1.0))
    assert full.at[0, "verdict"] == "keep"


def test_graph_captured_budgets_against_gpu_busy_time():
    result = budget.compute(table(gemm_row()), H200, threshold=units.DEFAULT_THRESHOLD,
                            graph_captured=True)
    # 111.9 µs / 4000 µs GPU busy = 2.80%; 0.5 x 2.80% = 1.40% >= 0.5% -> keep
    assert result.at[0, "headroom_share"] == pytest.approx(0.027975, rel=1e-3)
    assert result.at[0, "verdict"] == "keep" and "GPU-busy step" in result.at[0, "reason"]


def test_baseline_at_or_below_the_floor_is_pruned_with_its_reason():
    # lm_head: 4x896 @ 896x151936 bf16 = (3584 + 136134656 + 607744) * 2 B = 273.49 MB
    # floor 273491968 / 4.8e12 = 56.98 µs; a baseline of 50 µs is under it (L2-hot or a low profile)
    result = budget.compute(table(gemm_row(n=151936, calls_per_step=1.0, us_per_call=50.0)), H200,
                            threshold=Threshold(us_per_token=1.0))
    assert result.at[0, "floor_us"] == pytest.approx(56.977, rel=1e-4)
    assert result.at[0, "headroom_us_per_call"] == 0.0
    assert result.at[0, "verdict"] == "prune" and "already at the floor" in result.at[0, "reason"]


def test_cpu_only_rows_are_kept_and_say_why():
    result = budget.compute(table(gemm_row(us_per_call=math.nan)), H200,
                            threshold=units.DEFAULT_THRESHOLD)
    assert math.isnan(result.at[0, "baseline_us"])
    assert result.at[0, "verdict"] == "keep"
    assert "no GPU time" in result.at[0, "reason"] and "--measure" in result.at[0, "reason"]


def test_ranking_and_surviving_rows():
    rows = table(gemm_row(n=896, us_per_call=5.0),                    # 111.9 µs/token
                 gemm_row(n=4864, us_per_call=12.0),                  # floor 1.83 -> 244 µs/token
                 gemm_row(phase="prefill", m=512, n=4864, us_per_call=40.0, step_us=29_000.0,
                          step_gpu_us=20_000.0))
    result = budget.compute(rows, H200, threshold=Threshold(us_per_token=100.0))
    # decode first, largest headroom per token first; then prefill
    assert list(result["phase"]) == ["decode", "decode", "prefill"]
    assert list(result["n"]) == [4864, 896, 4864]
    # (12 - 1.8277) x 24 = 244.1; x 0.5 = 122 >= 100 keep. 111.9 x 0.5 = 56 < 100 prune.
    # prefill: (40 - 4.5124) x 24 = 851.7, x 0.5 = 425.9 >= 100 keep
    assert list(result["verdict"]) == ["keep", "prune", "keep"]
    kept = budget.surviving(result)
    assert list(kept["n"]) == [4864, 4864] and set(kept["verdict"]) == {"keep"}


def test_budget_parquet_roundtrip(tmp_path):
    result = budget.compute(table(gemm_row()), H200, threshold=units.DEFAULT_THRESHOLD)
    back = budget.read(budget.write(result, tmp_path / "b.parquet"))
    assert list(back.columns) == list(result.columns)
    assert back.at[0, "verdict"] == "prune"
    with pytest.raises(TunerError, match="not a budget table"):
        budget.surviving(table(gemm_row()))


# --------------------------------------------------------------------------------- Amdahl, estimate
def test_amdahl_and_design_worked_examples():
    # DESIGN.md: "a 1.3x kernel that saves 3 µs per call, 48 times a token, moves a 44 ms token by
    # 0.34%": 3 µs x 48 = 144 µs / 44000 µs = 0.327%; with 3.1 µs: 148.8 / 44000 = 0.338%.
    assert budget.saving_per_token(3.1, 48) / 44_000 == pytest.approx(0.003382, rel=1e-3)
    # "a 1.08x GEMV that runs 129 times a token moves it by 3-4%": the step-time cut is
    # f x (1 - 1/1.08) = 0.0741 f, so 3-4% needs the GEMV to take f = 0.405 ... 0.54 of the step.
    # With f = 0.47: 1 / (0.53 + 0.47/1.08) = 1.0361x, i.e. the step is 3.48% shorter.
    whole = budget.amdahl(0.47, 1.08)
    assert whole == pytest.approx(1.03607, rel=1e-4)
    assert 0.03 < 1 - 1 / whole < 0.04
    assert 1 - 1 / budget.amdahl(0.40, 1.08) < 0.03 < 1 - 1 / budget.amdahl(0.41, 1.08)
    # 0.47 x 44000 µs / 129 calls = 160.3 µs per call; 1.08x saves 160.3 x (1 - 1/1.08) = 11.87 µs
    assert budget.saving_per_call_needed(0.47, 44_000, 129) == pytest.approx(160.31, rel=1e-4)
    assert budget.amdahl(0.0, 5.0) == 1.0 and budget.amdahl(1.0, 2.0) == 2.0
    with pytest.raises(TunerError):
        budget.amdahl(1.2, 1.08)
    with pytest.raises(TunerError):
        budget.amdahl(0.5, 0.0)


def test_estimate_saving_target_and_amdahl(capsys):
    code, out, _ = run_cli(capsys, "estimate", "--saving-us", "3.1", "--calls-per-step", "48",
                           "--step-ms", "44")
    # 3.1 µs x 48 = 148.8 µs per token; 148.8 / 44000 µs = 0.338%
    assert code == 0 and "148.8 us" in out and "0.338%" in out and "44 ms" in out
    code, out, _ = run_cli(capsys, "estimate", "--target", "1%", "--calls-per-step", "48",
                           "--step-ms", "44")
    # 1% of 44000 µs = 440 µs per token; / 48 calls = 9.17 µs per call
    assert code == 0 and "440 us per token" in out and "9.17 us per call" in out
    code, out, _ = run_cli(capsys, "estimate", "--speedup", "1.08", "--share", "0.88")
    # 1 / (0.12 + 0.88/1.08) = 1 / 0.934815 = 1.0697x; 1 - 0.934815 = 6.52% shorter
    assert code == 0 and "1.07x faster" in out and "6.52% shorter" in out
    code, out, _ = run_cli(capsys, "estimate", "--saving-us", "3.1", "--calls-per-step", "48",
                           "--step-us", "44000", "--hit-rate", "0.5")
    # 3.1 x 48 x 0.5 = 74.4 µs; / 44000 = 0.169%
    assert code == 0 and "74.4 us" in out and "0.169%" in out


@pytest.mark.parametrize("argv, match", [
    (["--saving-us", "-3", "--calls-per-step", "48", "--step-ms", "44"], "--saving-us must be"),
    (["--saving-us", "3", "--calls-per-step", "0", "--step-ms", "44"], "--calls-per-step must be"),
    (["--saving-us", "3", "--calls-per-step", "48", "--step-ms", "abc"], "--step-ms must be a number"),
    (["--saving-us", "3", "--calls-per-step", "48"], "--step-ms"),
    (["--saving-us", "3", "--speedup", "1.1", "--share", "0.5"], "exactly one of"),
    ([], "exactly one of"),
    (["--speedup", "1.08"], "needs both"),
    (["--speedup", "1.08", "--share", "1.5"], "--share must be a share"),
    (["--speedup", "-2", "--share", "0.5"], "--speedup must be"),
    (["--target", "150%", "--calls-per-step", "48", "--step-ms", "44"], "--target must be"),
])
def test_estimate_bad_input_is_one_line_exit_2(capsys, argv, match):
    code, _, err = run_cli(capsys, "estimate", *argv)
    assert_one_line_error(code, err, match)


# --------------------------------------------------------------------------------- parsing units
def test_parse_units():
    assert units.parse_bandwidth("4.8TB/s") == pytest.approx(4.8e12)
    assert units.parse_bandwidth("4800 GB/s") == pytest.approx(4.8e12)
    assert units.parse_bandwidth("1TiB/s") == 2.0**40
    assert units.parse_matmul_rate("989TFLOPs") == pytest.approx(989e12)
    assert units.parse_matmul_rate("989 TFLOP/s") == pytest.approx(989e12)
    assert units.parse_matmul_rate("1.3PFLOPS") == pytest.approx(1.3e15)
    assert units.parse_threshold("0.5%") == Threshold(share=0.005)
    assert units.parse_threshold("40us") == Threshold(us_per_token=40.0)
    assert units.parse_threshold("40µs") == Threshold(us_per_token=40.0)
    assert units.parse_threshold("0.04ms").us_per_token == pytest.approx(40.0)
    for bad in ("abc", "40", "-1%", "0us", "5 parsecs", "nan%"):
        with pytest.raises(TunerError):
            units.parse_threshold(bad)
    for bad in ("-4.8TB/s", "4.8", "fast", "0GB/s"):
        with pytest.raises(TunerError):
            units.parse_bandwidth(bad)
    with pytest.raises(TunerError):
        units.parse_matmul_rate("989 TB/s")


# --------------------------------------------------------------------------------- tuner budget CLI
def test_budget_cli_prints_ranked_table_and_writes_parquet(tmp_path, capsys):
    shapes = shapetable.write(table(gemm_row(n=896), gemm_row(n=4864, us_per_call=12.0)),
                              tmp_path / "s.parquet")
    out_path = tmp_path / "b.parquet"
    code, out, _ = run_cli(capsys, "budget", str(shapes), "--device", "h200", "--min-saving", "100us",
                           "-o", str(out_path))
    assert code == 0
    assert "published datasheet peaks, not measured" in out
    assert "launch-bound" in out and "graph-captured" in out
    lines = out.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("decode "))
    assert "n=4864" in lines[first] and "keep" in lines[first]
    assert "n=896 " in lines[first + 1] and "prune" in lines[first + 1]
    assert "kept 1 of 2 shapes" in out
    written = budget.read(out_path)
    assert list(written["verdict"]) == ["keep", "prune"] and (written["profile_source"] == "spec").all()


def test_budget_cli_rate_overrides_replace_the_profile(tmp_path, capsys):
    shapes = shapetable.write(table(gemm_row()), tmp_path / "s.parquet")
    code, out, _ = run_cli(capsys, "budget", str(shapes), "--bandwidth", "1.6TB/s",
                           "--matmul-rate", "500TFLOPs", "-o", str(tmp_path / "b.parquet"))
    assert code == 0 and "rates given on the command line" in out
    # 1619968 B / 1.6e12 B/s = 1.01248 µs
    assert budget.read(tmp_path / "b.parquet").at[0, "floor_us"] == pytest.approx(1.01248, rel=1e-4)


def test_budget_cli_cpu_only_rows_warn(tmp_path, capsys):
    shapes = shapetable.write(table(gemm_row(us_per_call=math.nan)), tmp_path / "s.parquet")
    code, out, err = run_cli(capsys, "budget", str(shapes), "--device", "h200",
                             "-o", str(tmp_path / "b.parquet"))
    assert code == 0 and "no GPU time" in out and "cannot be budgeted" in err


def test_budget_cli_measure_without_gpu_is_one_line(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    shapes = shapetable.write(table(gemm_row()), tmp_path / "s.parquet")
    code, _, err = run_cli(capsys, "budget", str(shapes), "--device", "h200", "--measure",
                           "-o", str(tmp_path / "b.parquet"))
    assert_one_line_error(code, err, "needs a CUDA or ROCm GPU")


@pytest.mark.parametrize("extra, match", [
    ([], "no device profile"),
    (["--device", "tpu9"], "unknown device profile"),
    (["--bandwidth", "4.8TB/s"], "both --bandwidth and --matmul-rate"),
    (["--device", "h200", "--bandwidth=-4.8TB/s"], "--bandwidth must be positive"),
    (["--device", "h200", "--matmul-rate", "lots"], "cannot read --matmul-rate"),
    (["--device", "h200", "--min-saving", "abc"], "cannot read --min-saving"),
    (["--device", "h200", "--min-saving", "40"], "cannot read --min-saving"),
    (["--device", "h200", "--hit-rate", "1.5"], "hit rate must be in (0, 1]"),
    (["--device", "h200", "--hit-rate", "0"], "--hit-rate must be a positive"),
    (["--device", "h200", "--safety", "2"], "--safety must be in (0, 1]"),
    (["--device", "h200", "--phase", "prefill"], "no prefill rows; phases present: decode"),
])
def test_budget_cli_bad_input_is_one_line_exit_2(tmp_path, capsys, monkeypatch, extra, match):
    monkeypatch.chdir(tmp_path)  # no saved profiles under artifacts/devices here
    # a device no spec profile matches: without --device there is no profile to pick
    shapes = shapetable.write(table(gemm_row(device="Some Unknown GPU")), tmp_path / "s.parquet")
    code, _, err = run_cli(capsys, "budget", str(shapes), *extra)
    assert_one_line_error(code, err, match)


def test_budget_cli_picks_the_tables_device_without_device_flag(tmp_path, capsys, monkeypatch):
    """As `tuner run` does: the table's device name picks its spec profile, labelled as such."""
    monkeypatch.chdir(tmp_path)
    shapes = shapetable.write(table(gemm_row()), tmp_path / "s.parquet")
    code, out, _ = run_cli(capsys, "budget", str(shapes), "-o", str(tmp_path / "b.parquet"))
    assert code == 0 and "NVIDIA H200 (spec)" in out and "not measured" in out


def test_budget_cli_empty_table_and_bad_rows(tmp_path, capsys):
    empty = shapetable.write(shapetable.empty(), tmp_path / "empty.parquet")
    code, _, err = run_cli(capsys, "budget", str(empty), "--device", "h200")
    assert_one_line_error(code, err, "nothing to budget")
    negative = tmp_path / "neg.parquet"
    pd.DataFrame([gemm_row(us_per_call=-5.0)]).to_parquet(negative)  # shapetable.write refuses it
    code, _, err = run_cli(capsys, "budget", str(negative), "--device", "h200")
    assert_one_line_error(code, err, "column 'us_per_call', row 0: -5.0 is negative")
    code, _, err = run_cli(capsys, "budget", str(tmp_path / "missing.parquet"), "--device", "h200")
    assert_one_line_error(code, err, "not found")


def test_min_kernel_floor_by_hand():
    # o_proj: bytes floor 0.3375 µs; with a 2.5 µs fixed floor: (5 - 2.5) x 24 = 60 µs per token
    rows = table(gemm_row())
    result = budget.compute(rows, H200, threshold=Threshold(us_per_token=40.0), min_kernel_us=2.5)
    assert result.at[0, "floor_us"] == 2.5
    assert result.at[0, "headroom_us_per_token"] == pytest.approx(60.0)
    assert result.at[0, "verdict"] == "prune"  # 0.5 x 60 = 30 < 40 µs/token
    # without the fixed floor: 0.5 x 111.9 = 55.95 >= 40 -> keep
    assert budget.compute(rows, H200, threshold=Threshold(us_per_token=40.0)).at[0, "verdict"] == "keep"
    with pytest.raises(TunerError, match="minimum kernel time"):
        budget.compute(rows, H200, min_kernel_us=-1.0)


# ------------------------------------------------------------------- the bundled example (measured)
# shapes/examples/qwen25_05b_b4_decode.parquet: harvested from the H200 trace of Qwen2.5-0.5B-shaped
# decode at batch 4 (eager, no CUDA graphs). Its decode step is 29957 µs wall but the GPU is busy only
# 2198 µs of it (7.3%): launch-bound.
EXAMPLE = shapetable.read(Path(__file__).resolve().parent.parent / "shapes" / "examples"
                          / "qwen25_05b_b4_decode.parquet")


def test_example_default_threshold_prunes_everything_and_says_launch_bound():
    result = budget.compute(EXAMPLE, H200, threshold=units.DEFAULT_THRESHOLD)
    assert len(result) == len(EXAMPLE) and (result["verdict"] == "prune").all()
    decode = result[result["phase"] == "decode"]
    assert decode["launch_bound"].all()
    assert decode["gpu_busy_share"].iloc[0] == pytest.approx(2198.104 / 29957.295, rel=1e-4)
    # k/v projections (addmm m=4 n=128 k=896, 48 calls/step, 3.872 µs measured):
    # bytes (4*896 + 896*128 + 4*128 + 128) * 2 = 237824 B -> 0.049547 µs floor;
    # (3.872 - 0.049547) x 48 = 183.48 µs/token; / 29957.3 µs = 0.612%; x 0.5 = 0.306% < 0.5%
    top = decode.iloc[0]
    assert (top["op"], top["m"], top["n"], top["k"]) == ("aten::addmm", 4, 128, 896)
    assert top["floor_us"] == pytest.approx(0.049547, rel=1e-4)
    assert top["headroom_us_per_token"] == pytest.approx(183.48, rel=1e-4)
    assert top["headroom_share"] == pytest.approx(0.006125, rel=1e-3)
    # ... and the reason points at the GPU-busy time: 183.48 / 2198.1 = 8.35%
    assert "launch-bound: 8.35% of GPU-busy time" in top["reason"]


def test_example_graph_captured_keeps_the_decode_linears_only():
    decode = EXAMPLE[EXAMPLE["phase"] == "decode"]
    result = budget.compute(decode, H200, threshold=units.DEFAULT_THRESHOLD, graph_captured=True)
    kept = budget.surviving(result)
    # the five decode linears (k/v, gate/up, down, q, o): 0.5 x headroom >= 0.5% of 2198 µs = 11 µs
    assert sorted(zip(kept["op"], kept["n"], kept["k"])) == [
        ("aten::addmm", 128, 896), ("aten::addmm", 896, 896), ("aten::mm", 896, 896),
        ("aten::mm", 896, 4864), ("aten::mm", 4864, 896)]
    pruned = result[result["verdict"] == "prune"]
    # lm_head: floor 273491968 B / 4.8e12 = 56.98 µs against 65.248 µs measured: 8.27 µs/token,
    # 0.376% of 2198 µs; x 0.5 = 0.188% < 0.5%.  Attention per kv_len: 4 calls x ~4.1 µs = 16.5 µs.
    lm_head = pruned[pruned["n"] == 151936].iloc[0]
    assert lm_head["floor_us"] == pytest.approx(56.977, rel=1e-4)
    assert lm_head["headroom_share"] == pytest.approx(0.003763, rel=1e-3)
    assert set(pruned["family"]) == {"gemm", "attention"} and len(pruned) == 8


def test_example_through_the_cli(tmp_path, capsys):
    out_path = tmp_path / "b.parquet"
    code, out, _ = run_cli(capsys, "budget", str(Path(__file__).resolve().parent.parent / "shapes"
                                                  / "examples" / "qwen25_05b_b4_decode.parquet"),
                           "--device", "h200", "--phase", "decode", "--min-saving", "40us",
                           "-o", str(out_path))
    # 0.5 x headroom >= 40 µs/token: k/v 91.7, gate/up 71.4, down 61.8, q 51.2, o 47.4 -> 5 kept
    assert code == 0 and "kept 5 of 13 shapes" in out
    assert "decode: step 30 ms wall, GPU busy 2.2 ms (7.34%) -- launch-bound" in out
    assert len(budget.surviving(budget.read(out_path))) == 5


def test_measure_wiring_replaces_the_trace_baseline(monkeypatch, capsys):
    """--measure's plumbing on CPU: the GPU timer is swapped for a fixed 2 µs; the real kernel
    families decide which rows are served (decode linears -> gemv, attention -> attention; the
    fp32 rotary bmm m=32 n=1 k=1 is served by none and keeps its trace time)."""
    torch = pytest.importorskip("torch")
    from tuner import bench

    seen = []

    def fake_time_baseline(family, shape, *, cache="cold", device=None):
        seen.append((family.name, cache))
        return bench.Timing(median_us=2.0, spread_pct=0.0, group_us=[2.0], cache=cache)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "time_baseline", fake_time_baseline)
    decode = EXAMPLE[EXAMPLE["phase"] == "decode"]
    measured = budget.measure_baselines(decode)
    assert "no kernel family serves it" in capsys.readouterr().err
    result = budget.compute(decode, H200, baseline_us=measured)
    by_source = result.groupby("baseline_source")["op"].apply(set).to_dict()
    assert by_source == {"measured": {"aten::mm", "aten::addmm", "aten::scaled_dot_product_attention"},
                         "trace": {"aten::bmm"}}
    assert (result.loc[result["baseline_source"] == "measured", "baseline_us"] == 2.0).all()
    assert {name for name, _ in seen} == {"gemv", "attention"} and {c for _, c in seen} == {"cold"}


@pytest.mark.gpu
def test_measure_on_the_gpu_gives_positive_baselines():
    decode = EXAMPLE[(EXAMPLE["phase"] == "decode") & (EXAMPLE["family"] == "gemm")].head(3)
    measured = budget.measure_baselines(decode)
    assert measured.notna().all() and (measured > 0).all()


def test_rows_that_cannot_be_judged_are_kept_with_the_reason():
    rows = table(gemm_row(calls_per_step=math.nan), gemm_row(n=4864, step_us=math.nan))
    result = budget.compute(rows, H200, threshold=units.DEFAULT_THRESHOLD)
    reasons = dict(zip(result["n"], result["reason"]))
    assert (result["verdict"] == "keep").all()
    assert "calls per step unknown" in reasons[896]
    assert "no step time" in reasons[4864]


def test_threshold_and_profile_validation():
    with pytest.raises(TunerError, match="exactly one"):
        Threshold()
    with pytest.raises(TunerError, match="exactly one"):
        Threshold(us_per_token=1.0, share=0.01)
    with pytest.raises(TunerError, match="below 100%"):
        Threshold(share=1.5)
    with pytest.raises(TunerError, match="positive"):
        Threshold(us_per_token=-3.0)
    broken = dataclasses.replace(H200, read_bandwidth_bytes_per_s=0.0)
    with pytest.raises(TunerError, match="no usable read bandwidth"):
        budget.compute(table(gemm_row()), broken)
    with pytest.raises(TunerError, match="empty"):
        budget.compute(shapetable.empty(), H200)


def test_budget_cli_finds_a_saved_measured_profile_for_the_tables_device(tmp_path, capsys,
                                                                          monkeypatch):
    # A measured profile saved by `tuner device` on that GPU: key nvidia-h200, 4.0e12 B/s
    monkeypatch.chdir(tmp_path)
    save_profile(dataclasses.replace(H200, name="NVIDIA H200", source="measured",
                                     read_bandwidth_bytes_per_s=4.0e12,
                                     measured_at="2026-11-29T12:00:00Z"))
    shapes = shapetable.write(table(gemm_row()), tmp_path / "s.parquet")
    code, out, _ = run_cli(capsys, "budget", str(shapes), "-o", str(tmp_path / "b.parquet"))
    assert code == 0
    assert "measured 2026-11-29T12:00:00Z" in out and "for the device 'NVIDIA H200'" in out
    # 1619968 B / 4.0e12 B/s = 0.404992 µs
    assert budget.read(tmp_path / "b.parquet").at[0, "floor_us"] == pytest.approx(0.404992, rel=1e-5)


# ------------------------------------------- compute-bound calls already at the compute floor
def test_a_compute_bound_call_near_its_floor_is_pruned_whatever_its_calls_add_up_to():
    # Llama-8B o_proj in a prefill of 8192 tokens: 2 x 8192 x 4096 x 4096 = 275 Gflop -> 278 us at
    # 989 Tflop/s, the bytes (168 MB) only 35 us: compute-bound. 32 calls a step.
    prefill = dict(phase="prefill", m=8192, n=4096, k=4096, calls_per_step=32.0,
                   step_us=60_000.0, step_gpu_us=59_000.0)
    floor = 2 * 8192 * 4096 * 4096 / 989e12 * 1e6
    near = budget.compute(table(gemm_row(**prefill, us_per_call=340.0)), H200).iloc[0]
    assert near["compute_bound"] and near["floor_us"] == pytest.approx(floor)
    # 0.5 x 62 us x 32 = 990 us = 1.6% of the step: the share rule alone would keep it
    assert 0.5 * near["headroom_us_per_token"] / 60_000 > 0.005
    assert near["verdict"] == "prune"
    assert near["reason"].startswith("compute-bound: baseline 340 us runs at 81.7% of the "
                                     "measured matmul rate, within the safety 0.5 of its floor")
    # 600 us (46% of the rate): 322 us above the floor, more than 50% of it: the share decides
    far = budget.compute(table(gemm_row(**prefill, us_per_call=600.0)), H200).iloc[0]
    assert far["verdict"] == "keep" and not far["reason"].startswith("compute-bound")
    # --safety 1 trusts the whole headroom: only a baseline at the floor itself is pruned
    trusting = budget.compute(table(gemm_row(**prefill, us_per_call=340.0)), H200,
                              threshold=Threshold(share=0.005, safety=1.0)).iloc[0]
    assert trusting["verdict"] == "keep"
    # a memory-bound decode linear is never judged by the compute floor
    decode = budget.compute(table(gemm_row(us_per_call=1.2)), H200).iloc[0]
    assert not decode["compute_bound"] and not decode["reason"].startswith("compute-bound")


def test_budget_on_a_real_trace_prunes_the_prefill_lm_head_at_the_compute_floor(capsys, tmp_path):
    # The bundled H200 trace's prefill lm_head (m = 512, n = 151936, k = 896: 139 Gflop, 141 us
    # at the spec rate) took 195 us: 72% of the rate, 54 us above its floor (< 50% of it).
    shapes = Path(__file__).resolve().parent.parent / "shapes" / "examples" / "qwen25_05b_b4_decode.parquet"
    code, out, _ = run_cli(capsys, "budget", str(shapes), "--device", "h200",
                           "-o", str(tmp_path / "b.parquet"))
    assert code == 0
    lines = [line for line in out.splitlines() if line.startswith("pruned at the compute floor")]
    assert len(lines) == 1 and "prefill m=512 n=151936 k=896" in lines[0], lines
    assert "runs at 72.4% of the measured matmul rate" in lines[0]
    result = budget.read(tmp_path / "b.parquet")
    pruned = result[result["reason"].str.startswith("compute-bound")]
    assert list(pruned["m"]) == [512] and list(pruned["n"]) == [151936]
