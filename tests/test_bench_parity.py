"""Parity (exact / tolerance) and the timing protocol's logic, on the CPU under the interpreter.

The CPU runs of the protocol (no CUDA graph, perf_counter clocks) check its bookkeeping: input-set
rotation, groups, medians, paired ratios and their interval, failures as data. The GPU runs of
the protocol are in tests/test_device.py (a module that never sets TRITON_INTERPRET)."""

from __future__ import annotations

import dataclasses
import os


import pytest  # noqa: E402
import torch  # noqa: E402

from kernels import get_family  # noqa: E402
from tuner import bench, timing, parity  # noqa: E402
from tuner.errors import TunerError  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="interpreter tests need TRITON_INTERPRET=1 at import")

GEMV = get_family("gemv")
SMALL = {"m": 3, "n": 37, "k": 100, "dtype": "bfloat16"}
CPU_TIMING = dict(device="cpu", target_graph_us=1.0, min_calls=1)


def _half_writing_family():
    """gemv whose launch leaves the last output column unwritten (a real partial write)."""

    def launch(inputs, config, out=None):
        if out is None:
            out = torch.empty(inputs["x"].shape[0], inputs["weight"].shape[0],
                              dtype=inputs["x"].dtype)
        sub = {"x": inputs["x"], "weight": inputs["weight"][:-1]}
        GEMV.launch(sub, config, out=out[:, :-1])
        return out

    return dataclasses.replace(GEMV, name="gemv-half", launch=launch)


# ------------------------------------------------------------------------------------ parity
def test_default_config_is_exact_against_itself_and_within_tolerance():
    config = GEMV.default_config(SMALL, "cuda")
    result = parity.check(GEMV, SMALL, config, mode="exact", device="cpu")
    assert result.passed and result.reason == ""
    assert result.output_hash == result.reference_hash
    assert 0 < result.rel_err < parity.REL_ERR_BOUNDS["bfloat16"]
    assert result.parity_class == "exact"


def test_unwritten_elements_fail_both_modes():
    family = _half_writing_family()
    config = {"ROWS_PER_BLOCK": 4, "BLOCK_K": 32, "SPLIT_K": 1}
    checker = parity.Checker(family, SMALL, reference="baseline", device="cpu")
    for mode in ("exact", "tolerance"):
        result = checker.check(config, mode)
        assert not result.passed
        assert "NaN" in result.reason and f"{SMALL['m']} of" in result.reason
        assert result.parity_class == "mismatch"


def test_nan_never_passes():
    checker = parity.Checker(GEMV, SMALL, device="cpu")
    out = checker.run(GEMV.default_config(SMALL, "cuda"))
    assert checker.judge(out, "tolerance").passed
    out[1, 5] = float("nan")
    for mode in ("exact", "tolerance"):
        result = checker.judge(out, mode)
        assert not result.passed and "NaN" in result.reason
        assert result.rel_err == float("inf")


def test_different_summation_order_changes_hash_but_passes_tolerance():
    # fp16 keeps 11 bits: over 2048 outputs of k = 4096 a different fp32 summation order flips
    # the rounding of a few outputs (measured: the hashes differ), far below the 1e-3 bound.
    shape = {"m": 8, "n": 256, "k": 4096, "dtype": "float16"}
    reference = {"ROWS_PER_BLOCK": 64, "BLOCK_K": 1024, "SPLIT_K": 1}
    split = {"ROWS_PER_BLOCK": 64, "BLOCK_K": 512, "SPLIT_K": 8}
    checker = parity.Checker(GEMV, shape, reference=reference, device="cpu")
    assert checker.check(reference, "exact").passed  # the same config reproduces its bytes
    exact = checker.check(split, "exact")
    assert not exact.passed and "differs" in exact.reason
    tolerant = checker.check(split, "tolerance")
    assert tolerant.passed and tolerant.parity_class == "tolerance"
    assert tolerant.rel_err < parity.REL_ERR_BOUNDS["float16"]


def test_tolerance_fails_a_wrong_result():
    checker = parity.Checker(GEMV, SMALL, device="cpu")
    out = checker.run(GEMV.default_config(SMALL, "cuda"))
    out[:, :4] = out[:, :4] * 1.5  # a wrong block of outputs
    result = checker.judge(out, "tolerance")
    assert not result.passed and "rel err" in result.reason


def test_failing_config_is_a_candidate_failure():
    checker = parity.Checker(GEMV, SMALL, device="cpu")
    with pytest.raises(bench.CandidateFailure) as info:
        checker.check({"ROWS_PER_BLOCK": 3, "BLOCK_K": 32, "SPLIT_K": 1})
    assert "power of two" in info.value.reason


def test_output_hash_sees_shape_dtype_and_bytes():
    a = torch.arange(6, dtype=torch.float16).reshape(2, 3)
    assert parity.output_hash(a) == parity.output_hash(a.clone())
    assert parity.output_hash(a) != parity.output_hash(a.reshape(3, 2))
    assert parity.output_hash(a) != parity.output_hash(a.to(torch.bfloat16))
    b = a.clone()
    b.view(torch.int16)[1, 2] += 1  # the next fp16 value: one bit differs
    assert parity.output_hash(a) != parity.output_hash(b)


def test_bounds_and_unknown_dtype():
    assert parity.bound_for(torch.bfloat16) == 1e-2
    assert parity.bound_for("float16") == 1e-3
    with pytest.raises(TunerError):
        parity.bound_for(torch.int8)


# ------------------------------------------------------------------------------------ timing
def test_statistics():
    assert timing.median([3.0, 1.0, 2.0]) == 2.0
    assert timing.median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert timing.spread_pct([99.0, 100.0, 101.0]) == pytest.approx(1.0)
    values = [1.0 + 0.01 * ((i * 7) % 5 - 2) for i in range(20)]
    low, high = timing.bootstrap_median_interval(values)
    assert low <= timing.median(values) <= high
    assert (low, high) == timing.bootstrap_median_interval(values)  # seeded
    speedup, lo, hi = bench.paired_from_groups([10.0, 10.2, 9.9, 10.1], [5.0, 5.1, 5.0, 5.05])
    assert lo <= speedup <= hi and 1.9 < speedup < 2.1


def test_calls_per_graph_cycles_every_input_set():
    calls = timing.GraphTimer._calls_per_graph(est_us=3.0, sets=13, target_graph_us=1000.0)
    assert calls % 13 == 0 and calls * 3.0 >= 1000.0
    assert timing.GraphTimer._calls_per_graph(280.0, 2, 1000.0) == 8
    assert timing.GraphTimer._calls_per_graph(0.5, 256, 1000.0) <= timing.MAX_CALLS_PER_GRAPH


def test_cold_input_sets_exceed_twice_l2():
    l2 = 50_000
    sets = bench.make_input_sets(GEMV, SMALL, "cold", device="cpu", l2=l2)
    per_set = sum(t.numel() * t.element_size() for t in sets[0].values())
    assert len(sets) >= 2 and len(sets) * per_set > 2 * l2
    assert not torch.equal(sets[0]["weight"], sets[1]["weight"])
    assert len(bench.make_input_sets(GEMV, SMALL, "warm", device="cpu")) == 1
    with pytest.raises(TunerError):
        bench.make_input_sets(GEMV, SMALL, "lukewarm", device="cpu")


def test_protocol_on_cpu_times_groups_and_pairs():
    timing = bench.time_baseline(GEMV, SMALL, cache="cold", groups=4, replays=3,
                                 input_sets=bench.make_input_sets(GEMV, SMALL, "cold", "cpu",
                                                                  l2=20_000),
                                 **CPU_TIMING)
    assert len(timing.group_us) == 4 and timing.median_us > 0
    assert timing.calls_per_graph % timing.input_sets == 0
    # the interpreted Triton kernel is far slower on the CPU than torch's linear: the paired
    # comparison must say so, with an interval around its median ratio
    paired = bench.compare(GEMV, SMALL, "default", "baseline", cache="warm", groups=2,
                           replays=1, **CPU_TIMING)
    assert paired.speedup_low <= paired.speedup <= paired.speedup_high
    assert paired.speedup < 0.5
    assert paired.reference_us < paired.candidate_us


def test_failing_candidate_is_reported_not_raised_by_bench_one():
    checker = parity.Checker(GEMV, SMALL, device="cpu")
    sets = bench.make_input_sets(GEMV, SMALL, "warm", device="cpu")
    row = bench.bench_one(GEMV, SMALL, "bad", {"ROWS_PER_BLOCK": 3, "BLOCK_K": 32, "SPLIT_K": 1},
                          checker=checker, input_sets=sets, cache="warm", groups=1, replays=1,
                          **CPU_TIMING)
    assert "power of two" in row.failure
    text = bench.format_rows([row])
    assert "failed" in text
    with pytest.raises(bench.CandidateFailure):
        bench.time_config(GEMV, SMALL, {"ROWS_PER_BLOCK": 3, "BLOCK_K": 32, "SPLIT_K": 1},
                          cache="warm", groups=1, replays=1, **CPU_TIMING)


def test_parse_shape_and_config():
    assert bench.parse_shape("m=1,n=14336,k=5120") == {"m": 1, "n": 14336, "k": 5120,
                                                        "dtype": "bfloat16"}
    assert bench.parse_shape("m=2,n=8,k=8", "float16")["dtype"] == "float16"
    assert bench.parse_config("ROWS_PER_BLOCK=4, BLOCK_K=512") == {"ROWS_PER_BLOCK": 4,
                                                                    "BLOCK_K": 512}
    with pytest.raises(TunerError):
        bench.parse_shape("m1")


def test_timing_on_cpu_refused_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(TunerError):
        bench._device("cpu")


def test_tuner_bench_cli_on_cpu(capsys):
    from tuner.cli import main

    rc = main(["bench", "--family", "gemv", "--shape", "m=2,n=37,k=100", "--dtype", "float16",
               "--torch-device", "cpu", "--cache", "warm", "--groups", "2", "--replays", "1",
               "--config", "ROWS_PER_BLOCK=4,BLOCK_K=32,SPLIT_K=2", "--sweep",
               "--max-configs", "1", "--top", "2"])
    out = capsys.readouterr().out
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].startswith("gemv m=2,n=37,k=100,dtype=float16  cache=warm")
    for label in ("baseline", "default", "config"):
        row = next(line for line in lines if line.startswith(label + " "))
        assert "failed" not in row and ("exact" in row or "tolerance" in row)
    assert "sweep: 2 configs, 0 failed, 0 parity mismatches" in out
    assert "distinct output hashes" in out
