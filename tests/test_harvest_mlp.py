"""`harvest --gated-mlp` (tuner/harvest/mlp.py): a dense decoder layer's gate, up and down
projections read as one moe row of experts 1, top-k 1, on real inputs: the harvested table of a
Qwen3-8B decode step (H200, max-autotune), the bundled Qwen2.5-0.5B trace (eager, prefill and
decode), a real graph capture + replay pair of Llama-3.1-8B cut to 2 layers, the CPU trace of
the tiny decoder (whose MLP is up, SiLU, down: no gate), and a tiny Qwen2 profiled live on the
CPU (no GPU times).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from tuner import harvest, run, shapetable
from tuner.cli import main
from tuner.harvest.mlp import OP, fold_gated_mlp
from tuner_kernels.moe import shape_from_row

ROOT = Path(__file__).resolve().parent.parent
QWEN3_8B = (ROOT / "benchmarks" / "logs" / "2026-12-04" / "qwen3_8b_b1_max_autotune"
            / "tune-qwen3_8b-b1" / "shapes.parquet")
EXAMPLES = ROOT / "shapes" / "examples"
QWEN25 = EXAMPLES / "qwen25_05b_b4_decode.parquet"
QWEN25_TRACE = EXAMPLES / "qwen25_05b_b4_decode.pt.trace.json.gz"
TRACES = ROOT / "tests" / "fixtures" / "traces"
LLAMA_2L = TRACES / "h200_llama31_8b_2l_b1_max_autotune"


def _row(df: pd.DataFrame, **where) -> dict:
    hit = df
    for column, value in where.items():
        hit = hit[hit[column] == value]
    (row,) = hit.to_dict("records")
    return row


def _others(df: pd.DataFrame, drop: list[tuple]) -> pd.DataFrame:
    """The rows of `df` that are not the (phase, n, k) linears of `drop` nor moe rows, without
    the moe columns, in order."""
    keep = df["family"] != "moe"
    for phase, n, k in drop:
        keep &= ~((df["phase"] == phase) & (df["n"] == n) & (df["k"] == k)
                  & df["family"].isin(["gemm", "gemv"]))
    out = df[keep].drop(columns=[c for c in shapetable.MOE_COLUMNS if c in df.columns])
    return out.reset_index(drop=True)


# ------------------------------------------------------------------- the 8B decode step's table
def test_the_8b_steps_gate_up_and_down_read_as_one_moe_row():
    table = shapetable.read(QWEN3_8B)
    up = _row(table, family="gemm", m=1, n=12288, k=4096)
    down = _row(table, family="gemm", m=1, n=4096, k=12288)
    assert (up["calls_per_step"], down["calls_per_step"]) == (72.0, 36.0)

    out, notes = fold_gated_mlp(table)
    mlp = _row(out, family="moe")
    assert mlp["op"] == OP and mlp["phase"] == "decode"
    assert (mlp["m"], mlp["n"], mlp["k"], mlp["experts"], mlp["topk"]) == (1, 12288, 4096, 1, 1)
    assert (mlp["batch"], mlp["layout"], mlp["dtype"]) == (1, "", "bfloat16")
    assert (mlp["calls"], mlp["steps"], mlp["calls_per_step"]) == (180, 5, 36.0)
    assert mlp["us_per_call"] == pytest.approx(2 * up["us_per_call"] + down["us_per_call"])
    assert mlp["us_per_call"] == pytest.approx(2 * 23.824 + 26.8645)
    assert mlp["share"] == pytest.approx(up["share"] + down["share"])
    for column in ("step_us", "step_gpu_us", "source", "device", "traced_compiled"):
        assert mlp[column] == down[column], column
    for column in ("heads", "kv_heads", "q_len", "kv_len", "head_dim", "traced_kv_heads"):
        assert pd.isna(mlp[column]), column
    # both rows' kernels: the gate/up reductions and the down one (Inductor fused the SiLU·mul
    # into it, so the trace timed that with the down projection)
    kernels = mlp["kernels"].split("; ")
    assert kernels == up["kernels"].split("; ") + down["kernels"].split("; ")
    assert any("mul_silu" in k for k in kernels)

    # the two linear rows are gone, every other row is as it was (and in its order)
    assert len(out) == len(table) - 1
    assert not ((out["family"] == "gemm") & out["n"].isin([12288]) & (out["k"] == 4096)).any()
    assert not ((out["family"] == "gemm") & (out["n"] == 4096) & (out["k"] == 12288)).any()
    pd.testing.assert_frame_equal(_others(out, []),
                                  _others(table, [("decode", 12288, 4096),
                                                  ("decode", 4096, 12288)]))
    assert out["experts"].isna().sum() == len(out) - 1
    # the step's GEMM/attention share is the same: no call counted twice, none lost
    assert out["share"].sum() == pytest.approx(table["share"].sum())
    assert list(out["share"]) == sorted(out["share"], reverse=True)

    assert notes == ["gated MLP decode m=1 hidden=4096 inter=12288: 72 + 36 linear calls a step "
                     "read as 36 moe calls (experts 1, top-k 1), us_per_call = 2 x up's + "
                     "down's; the SiLU·mul between them is no linear call: counted only where a "
                     "linear's kernel fused it"]
    assert shape_from_row(mlp) == {"m": 1, "experts": 1, "topk": 1, "hidden": 4096,
                                   "inter": 12288, "dtype": "bfloat16"}


def test_the_folded_table_is_a_shapetable_that_round_trips(tmp_path):
    out, _ = fold_gated_mlp(shapetable.read(QWEN3_8B))
    back = shapetable.read(shapetable.write(out, tmp_path / "folded.parquet"))
    pd.testing.assert_frame_equal(back, out)
    assert shape_from_row(_row(back, family="moe"))["inter"] == 12288


def test_calls_not_two_to_one_stay_linears_with_a_note():
    table = shapetable.read(QWEN3_8B)
    up = (table["n"] == 12288) & (table["k"] == 4096)
    table.loc[up, "calls"] = 350
    table.loc[up, "calls_per_step"] = 70.0
    out, notes = fold_gated_mlp(table)
    pd.testing.assert_frame_equal(out, table)
    assert notes == ["decode m=1 n=12288 k=4096: 70 calls a step, not twice the 36 of n=4096 "
                     "k=12288: not a gated MLP's up and down (two calls of one to one of the "
                     "other), left as linears"]


def test_a_non_gated_mlp_stays_linears_with_a_note():
    # the tiny decoder's MLP is down(silu(up(x))): up [m, 128] from [m, 64] once a layer, down
    # once: 1:1
    result = harvest.harvest([TRACES / "cpu_tiny_decoder.pt.trace.json.gz"], quiet=True,
                             gated_mlp=True)
    plain = harvest.harvest([TRACES / "cpu_tiny_decoder.pt.trace.json.gz"], quiet=True)
    pd.testing.assert_frame_equal(result.table, plain.table)
    assert result.notes == [
        f"--gated-mlp: {ph} m={m} n=128 k=64: 2 calls a step, not twice the 2 of n=64 k=128: not a gated "
        "MLP's up and down (two calls of one to one of the other), left as linears"
        for ph, m in (("prefill", 32), ("decode", 2))]
    assert plain.notes == []


def test_a_table_without_any_pair_comes_back_unchanged_with_a_note():
    result = harvest.harvest([TRACES / "custom_attention.pt.trace.json.gz"], quiet=True,
                             gated_mlp=True)
    plain = harvest.harvest([TRACES / "custom_attention.pt.trace.json.gz"], quiet=True)
    pd.testing.assert_frame_equal(result.table, plain.table)
    assert result.notes == ["--gated-mlp: no gated MLP found: no linear rows of one phase, m and dtype with "
                            "shapes n=I k=H and n=H k=I (I != H): nothing folded"]
    # the 8B table without its MLP rows: no pair left either
    table = shapetable.read(QWEN3_8B)
    table = table[~table["n"].isin([12288]) & ~table["k"].isin([12288])].reset_index(drop=True)
    out, notes = fold_gated_mlp(table)
    assert out is table and notes[0].startswith("no gated MLP found")


def test_a_pair_that_is_no_plain_linear_mlp_stays_with_why():
    table = shapetable.read(QWEN3_8B)
    mlp = table["n"].isin([12288]) | table["k"].isin([12288])
    nn = table.copy()
    nn.loc[mlp, "layout"] = "NN"
    out, notes = fold_gated_mlp(nn)
    pd.testing.assert_frame_equal(out, nn)
    assert notes == ["decode m=1 n=12288 k=4096 and n=4096 k=12288: layout NN, not NT (x by a "
                     "[n, k] weight): left as linears"]
    biased = table.assign(bias=pd.array([1 if b else pd.NA for b in mlp], dtype="Int64"))
    out, notes = fold_gated_mlp(biased)
    assert (out["family"] != "moe").all()
    assert notes[0].endswith("given a bias, which the moe family has none of: left as linears")
    # a second row of the up shape (another op): which two are one MLP's is not known
    twice = pd.concat([table, table[table["n"] == 12288].assign(op="aten::mm")],
                      ignore_index=True)
    out, notes = fold_gated_mlp(twice)
    assert (out["family"] != "moe").all()
    assert notes == ["decode m=1 n=12288 k=4096 and n=4096 k=12288: several rows of one shape "
                     "(inductor::mm_reduction, aten::mm): which are one MLP's is not known, "
                     "left as linears"]


def test_each_phase_folds_on_its_own():
    table = shapetable.read(QWEN25)
    out, notes = fold_gated_mlp(table)
    for phase, m, calls in (("prefill", 512, 24), ("decode", 4, 144)):
        up = _row(table, phase=phase, n=4864, k=896)
        down = _row(table, phase=phase, n=896, k=4864)
        mlp = _row(out, phase=phase, family="moe")
        assert (mlp["m"], mlp["n"], mlp["k"], mlp["calls"], mlp["calls_per_step"]) == \
            (m, 4864, 896, calls, 24.0)
        assert mlp["us_per_call"] == pytest.approx(2 * up["us_per_call"] + down["us_per_call"])
        assert shape_from_row(mlp) == {"m": m, "experts": 1, "topk": 1, "hidden": 896,
                                       "inter": 4864, "dtype": "bfloat16"}
    assert len(out) == len(table) - 2 and len(notes) == 2
    pd.testing.assert_frame_equal(
        _others(out, []), _others(table, [(p, n, k) for p in ("prefill", "decode")
                                          for n, k in ((4864, 896), (896, 4864))]))


# ------------------------------------------------------------------------------- the command line
def test_tuner_harvest_gated_mlp_end_to_end(tmp_path, capsys):
    replay = LLAMA_2L.with_name(LLAMA_2L.name + "_replay.pt.trace.json.gz")
    capture = LLAMA_2L.with_name(LLAMA_2L.name + "_capture.pt.trace.json.gz")
    plain, folded = tmp_path / "plain.parquet", tmp_path / "folded.parquet"
    assert main(["harvest", str(replay), "--capture", str(capture), "-o", str(plain)]) == 0
    capsys.readouterr()
    assert main(["harvest", str(replay), "--capture", str(capture), "--gated-mlp",
                 "-o", str(folded)]) == 0
    out, err = capsys.readouterr()
    assert ("tuner: warning: --gated-mlp: gated MLP decode m=1 hidden=4096 inter=14336: 4 + 2 "
            "linear calls a step read as 2 moe calls (experts 1, top-k 1)") in err
    assert "gated MLP (gate, up, down) decode" in out and f"wrote 5 rows to {folded}" in out
    before, after = shapetable.read(plain), shapetable.read(folded)
    up = _row(before, n=14336, k=4096)
    down = _row(before, n=4096, k=14336)
    mlp = _row(after, family="moe")
    assert (mlp["m"], mlp["n"], mlp["k"], mlp["experts"], mlp["topk"]) == (1, 14336, 4096, 1, 1)
    assert (mlp["calls_per_step"], mlp["traced_compiled"]) == (2.0, 1)
    assert mlp["us_per_call"] == pytest.approx(2 * up["us_per_call"] + down["us_per_call"])
    assert mlp["share"] == pytest.approx(up["share"] + down["share"])
    pd.testing.assert_frame_equal(_others(after, []),
                                  _others(before, [("decode", 14336, 4096),
                                                   ("decode", 4096, 14336)]))


def test_gated_mlp_does_not_go_with_watch(tmp_path, capsys):
    code = main(["harvest", "--watch", str(tmp_path), "--gated-mlp"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2
    assert lines == ["tuner: error: --gated-mlp goes with TRACE... or --live, not --watch"]
    assert list(tmp_path.iterdir()) == []


def test_tuner_run_passes_gated_mlp_to_its_harvest(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(run, "have_gpu", lambda: False)
    assert main(["run", str(QWEN25_TRACE), "--gated-mlp", "--family", "moe",
                 "-o", str(tmp_path / "run")]) == 0
    captured = capsys.readouterr()
    assert "--gated-mlp: gated MLP decode m=4 hidden=896 inter=4864" in captured.err
    shapes = shapetable.read(tmp_path / "run" / "shapes.parquet")
    assert sorted(shapes.loc[shapes["family"] == "moe", "m"]) == [4, 512]
    assert "1 distinct moe shape(s) to search" in captured.out


def test_live_cpu_profile_keeps_unknown_times_unknown(monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.setenv("TUNER_QWEN_TINY", "1")   # hidden 64, inter 128, 2 layers, fp32 on CPU
    result = harvest.live(f"{EXAMPLES / 'qwen_live.py'}:QwenDecode", 3, quiet=True,
                          gated_mlp=True)
    folded = result.table[result.table["family"] == "moe"]
    assert sorted(folded["phase"]) == ["decode", "prefill"]
    for mlp in folded.to_dict("records"):
        assert (mlp["n"], mlp["k"], mlp["experts"], mlp["topk"]) == (128, 64, 1, 1)
        assert mlp["calls_per_step"] == 2.0           # one a layer
        assert math.isnan(mlp["us_per_call"]) and math.isnan(mlp["share"])  # no GPU: unknown
        # the CPU ran it in float32, which the moe family does not run (bf16 / fp16): the row
        # says what ran, and the family reads no shape from it
        assert mlp["dtype"] == "float32" and shape_from_row(mlp) is None
    assert [" ".join(n.split()[:4]) for n in result.notes] == [
        "--gated-mlp: gated MLP prefill", "--gated-mlp: gated MLP decode"]
