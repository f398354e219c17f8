"""Parity facts and gates (baseline / kernel / accuracy) and the timing protocol's logic, on the CPU under the interpreter.

The CPU runs of the protocol (no CUDA graph, perf_counter clocks) check its bookkeeping: input-set
rotation, groups, medians, paired ratios and their interval, failures as data. The GPU runs of
the protocol are in tests/test_device.py (a module that never sets TRITON_INTERPRET)."""

from __future__ import annotations

import dataclasses
import os


import pytest  # noqa: E402
import torch  # noqa: E402

from tuner_kernels import get_family  # noqa: E402
from tuner import bench, timing, parity  # noqa: E402
from tuner.errors import TunerError  # noqa: E402

from conftest import needs_cxx  # noqa: E402

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
def _torch_family():
    """gemv whose 'kernel' is the serving path itself: bitwise equal to the baseline."""

    def launch(inputs, config, out=None):
        result = GEMV.baseline(inputs)
        if out is None:
            return result
        out.copy_(result)
        return out

    return dataclasses.replace(GEMV, name="gemv-torch", launch=launch)


def _coarse_family(chunk: int = 16):
    """gemv that rounds every partial sum over `chunk` values of k to bf16 before adding them:
    a real, less accurate summation (what an accumulator in the output dtype does)."""

    def launch(inputs, config, out=None):
        x, w = inputs["x"].float(), inputs["weight"].float()
        k = x.shape[1]
        acc = torch.zeros(x.shape[0], w.shape[0], dtype=torch.bfloat16)
        for start in range(0, k, chunk):
            part = x[:, start:start + chunk] @ w[:, start:start + chunk].T
            acc = (acc.float() + part.to(torch.bfloat16).float()).to(torch.bfloat16)
        if out is None:
            return acc
        out.copy_(acc)
        return out

    return dataclasses.replace(GEMV, name="gemv-coarse", launch=launch)


def test_the_default_config_is_in_its_own_class():
    checker = parity.Checker(GEMV, SMALL, device="cpu")
    facts = checker.facts(GEMV.default_config(SMALL, "cuda"))
    assert facts.bitwise_vs_default and facts.parity_class == facts.default_class
    assert facts.seeds == parity.DEFAULT_SEEDS and facts.nonfinite == 0
    assert 0 < facts.error_vs_reference < 1e-2 and 0 < facts.baseline_error_vs_reference < 1e-2
    assert facts.error_ratio == pytest.approx(facts.error_ratio)  # finite
    assert facts.passes("kernel") and facts.failure("kernel") == ""
    assert facts.error_ratio == pytest.approx(1.0, abs=0.25) and facts.passes("accuracy")
    # at k = 100 the interpreter's fp32 sums round like torch's: whichever it is, the fact agrees
    # with the hashes
    assert facts.bitwise_vs_baseline == (facts.parity_class == checker.baseline_class)
    assert facts.passes("baseline") == facts.bitwise_vs_baseline


def test_a_config_outside_the_default_class_is_named_and_judged_by_accuracy():
    # fp16 keeps 11 bits: over 2048 outputs of k = 4096 a different fp32 summation order flips
    # the rounding of a few outputs (the hashes differ) at the same accuracy.
    shape = {"m": 8, "n": 256, "k": 4096, "dtype": "float16"}
    default = {"ROWS_PER_BLOCK": 64, "BLOCK_K": 1024, "SPLIT_K": 1}
    split = {"ROWS_PER_BLOCK": 64, "BLOCK_K": 512, "SPLIT_K": 8}
    checker = parity.Checker(GEMV, shape, device="cpu", default_config=default, seeds=2)
    assert checker.facts(default).bitwise_vs_default  # the same config reproduces its bytes
    facts = checker.facts(split)
    assert not facts.bitwise_vs_default and facts.parity_class != facts.default_class
    assert "differs from the default config's" in facts.failure("kernel")
    assert facts.error_ratio < parity.DEFAULT_MARGIN and facts.passes("accuracy")


def test_the_serving_path_itself_is_bitwise_equal_to_the_baseline():
    family = _torch_family()
    checker = parity.Checker(family, SMALL, device="cpu")
    facts = checker.facts({"ROWS_PER_BLOCK": 4, "BLOCK_K": 32, "SPLIT_K": 1})
    assert facts.bitwise_vs_baseline and facts.error_ratio == 1.0
    assert facts.passes("baseline") and facts.passes("accuracy")
    assert facts.describe().startswith("BITWISE EQUAL TO THE SERVING PATH")
    assert checker.baseline_facts().bitwise_vs_baseline


def test_unwritten_elements_fail_every_gate():
    family = _half_writing_family()
    checker = parity.Checker(family, SMALL, device="cpu",
                             default_config=GEMV.default_config(SMALL, "cuda"))
    facts = checker.facts({"ROWS_PER_BLOCK": 4, "BLOCK_K": 32, "SPLIT_K": 1})
    assert facts.nonfinite == SMALL["m"] * facts.seeds
    assert facts.error_vs_reference == float("inf") and facts.error_ratio == float("inf")
    for gate in parity.GATES:
        assert not facts.passes(gate) and "NaN" in facts.failure(gate)


def test_nan_never_passes():
    checker = parity.Checker(GEMV, SMALL, device="cpu")
    config = GEMV.default_config(SMALL, "cuda")
    outs = [checker.run(config, i) for i in range(len(checker.seeds))]
    assert checker.judge(outs).passes("kernel")
    outs[1][1, 5] = float("nan")
    facts = checker.judge(outs)
    assert facts.nonfinite == 1 and not any(facts.passes(g) for g in parity.GATES)


def test_a_less_accurate_config_fails_accuracy():
    family = _coarse_family()
    shape = {"m": 2, "n": 64, "k": 1024, "dtype": "bfloat16"}
    checker = parity.Checker(family, shape, device="cpu",
                             default_config=GEMV.default_config(shape, "cuda"))
    facts = checker.facts({})
    assert facts.error_ratio > parity.DEFAULT_MARGIN, facts
    assert "serving path's" in facts.failure("accuracy")
    assert facts.passes("accuracy", margin=facts.error_ratio * 1.01)  # the margin is the bar


def test_recorded_facts_round_trip_and_gate_logic():
    recorded = {"bitwise_vs_baseline": False, "bitwise_vs_default": True,
                "parity_class": "a1b2c3d4e5f60718", "default_class": "a1b2c3d4e5f60718",
                "error_vs_reference": 1.6e-3, "baseline_error_vs_reference": 1.5e-3,
                "error_ratio": 1.07, "nonfinite": 0, "seeds": 3}
    facts = parity.ParityFacts.from_attrs(recorded)
    assert facts.to_attrs() == recorded
    assert facts.passes("kernel") and facts.passes("accuracy") and not facts.passes("baseline")
    worse = parity.ParityFacts.from_attrs({**recorded, "error_ratio": 1.4})
    assert not worse.passes("accuracy") and worse.passes("accuracy", margin=1.5)
    nan = parity.ParityFacts.from_attrs({**recorded, "error_vs_reference": None,
                                         "error_ratio": None, "nonfinite": 2})
    assert nan.error_ratio == float("inf") and not nan.passes("kernel")
    assert nan.to_attrs()["error_ratio"] is None


def test_gate_names_and_deprecated_aliases(capsys):
    assert parity.resolve_gate("accuracy") == "accuracy" and parity.DEFAULT_GATE == "accuracy"
    assert parity.resolve_gate("exact") == "kernel"
    assert parity.resolve_gate("tolerance") == "accuracy"
    err = capsys.readouterr().err
    assert "--parity exact is deprecated: it means --parity kernel" in err
    assert "--parity tolerance is deprecated: it means --parity accuracy" in err
    with pytest.raises(TunerError, match="unknown parity gate"):
        parity.resolve_gate("bitwise")


def test_failing_config_is_a_candidate_failure():
    checker = parity.Checker(GEMV, SMALL, device="cpu")
    with pytest.raises(bench.CandidateFailure) as info:
        checker.facts({"ROWS_PER_BLOCK": 3, "BLOCK_K": 32, "SPLIT_K": 1})
    assert "power of two" in info.value.reason


def test_output_hash_sees_shape_dtype_and_bytes():
    a = torch.arange(6, dtype=torch.float16).reshape(2, 3)
    assert parity.output_hash(a) == parity.output_hash(a.clone())
    assert parity.output_hash(a) != parity.output_hash(a.reshape(3, 2))
    assert parity.output_hash(a) != parity.output_hash(a.to(torch.bfloat16))
    b = a.clone()
    b.view(torch.int16)[1, 2] += 1  # the next fp16 value: one bit differs
    assert parity.output_hash(a) != parity.output_hash(b)


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
    assert "=base" in lines[1] and "=dflt" in lines[1] and "x base" in lines[1]
    for label in ("baseline", "default", "config"):
        row = next(line for line in lines if line.startswith(label + " "))
        assert "failed" not in row and row.split()[5] in ("yes", "no"), row
    baseline_row = next(line for line in lines if line.startswith("baseline "))
    assert baseline_row.split()[5] == "yes" and "1.00x" in baseline_row  # the serving path itself
    assert "sweep: 2 configs, 0 failed, 0 fail --parity accuracy" in out
    assert "output classes" in out and "bitwise equal to the serving path" in out


@needs_cxx
def test_the_compiled_baseline_computes_the_eager_baselines_bytes():
    """rank --compiled-baseline times family.baseline under torch.compile (Inductor fuses the
    KV-cache copies of a regrouped attention call): on the CPU it gives the eager baseline's
    output bit for bit, with and without the served call's mask."""
    import torch

    from tuner_kernels import attention
    from tuner import bench

    shape = {"batch": 2, "heads": 8, "kv_heads": 2, "kv_len": 40, "head_dim": 64,
             "dtype": "bfloat16", "baseline_kv_heads": 8}
    from torch._dynamo.utils import counters

    inputs = attention.make_inputs(shape, "cpu", 0)
    mask = torch.ones(2, 1, 40, dtype=torch.bool)
    mask[:, :, -3:] = False
    compiled = bench.compiled_baseline(attention.FAMILY)
    assert bench.compiled_baseline(attention.FAMILY) is compiled  # one wrapper a family
    graphs = counters["stats"]["unique_graphs"]
    for x in (inputs, dict(inputs, mask=mask)):
        assert torch.equal(compiled(x), attention.baseline(x))
    assert counters["stats"]["unique_graphs"] > graphs  # Dynamo compiled it: not the eager path
    assert bench.baseline_path(attention.FAMILY, shape, bench.COMPILED_BASELINE) == "torch.compile"
    name, fn = bench._callable_for(attention.FAMILY, shape, bench.COMPILED_BASELINE, "cuda")
    assert fn is compiled and "torch.compile" in name


@needs_cxx
def test_the_compiled_baseline_stays_compiled_past_dynamos_shape_limit():
    """Dynamo compiles a function for at most 8 shapes and runs it eagerly after that (with a
    log line only): a rank of a model's shapes at several batch sizes passes that. The compiled
    baseline compiles every shape (tiny decode linears on the CPU)."""
    from torch._dynamo.utils import counters

    family = get_family("gemv")
    compiled = bench.compiled_baseline(family)
    before = counters["stats"]["unique_graphs"]
    for i in range(12):
        inputs = family.make_inputs({"m": 1, "n": 8 + 8 * i, "k": 24, "dtype": "bfloat16"},
                                    "cpu", 0)
        assert torch.equal(compiled(inputs), family.baseline(inputs))
    assert counters["stats"]["unique_graphs"] - before == 12


def test_a_compiled_steps_shape_is_timed_against_the_compiled_baseline(monkeypatch):
    """'baseline' of a shape with baseline_compiled (a torch.compile'd step's call) resolves to
    the compiled baseline everywhere tuner.bench times it: the search's baseline, rank's pair."""
    family = get_family("gemv")
    shape = {"m": 1, "n": 16, "k": 32, "dtype": "bfloat16"}
    assert bench._callable_for(family, shape, "baseline", "cuda")[1] is family.baseline
    name, fn = bench._callable_for(family, dict(shape, baseline_compiled=1), "baseline", "cuda")
    assert fn is bench.compiled_baseline(family) and "torch.compile" in name
    timing = bench.time_baseline(family, dict(shape, baseline_compiled=1), cache="warm",
                                 device="cpu", groups=1, replays=1, min_calls=1,
                                 target_graph_us=1.0)
    assert timing.median_us > 0


def test_a_failed_compile_times_the_eager_baseline_and_says_so(monkeypatch):
    """torch.compile failing (a compile error, a build without a working Inductor) must not end a
    rank: the eager baseline is timed from then on, with one warning, and baseline_path says so."""
    import types

    monkeypatch.setattr(bench, "_COMPILED_BASELINES", {})
    monkeypatch.setattr(bench, "_COMPILE_FAILURES", {})

    def broken_compile(fn, **options):
        def run(inputs):
            raise RuntimeError("inductor: no C compiler found")
        return run

    monkeypatch.setattr(torch, "compile", broken_compile)
    warnings = []
    monkeypatch.setattr(bench, "warn", warnings.append)
    family = types.SimpleNamespace(name="fake", baseline=lambda inputs: inputs["x"] * 2)
    fn = bench.compiled_baseline(family)
    x = torch.arange(4.0)
    assert torch.equal(fn({"x": x}), x * 2) and torch.equal(fn({"x": x}), x * 2)
    assert len(warnings) == 1 and "no C compiler found" in warnings[0]
    path = bench.baseline_path(family, {"baseline_compiled": 1})
    assert path.startswith("eager (torch.compile failed: ") and "no C compiler" in path
    assert bench.baseline_path(family, {}) == "eager"


def test_a_baseline_is_named_by_its_longest_kernels_first():
    """The moe baseline (transformers' grouped-mm path) launches copies before its grouped GEMMs;
    a verdict names the GEMM it beat first. Launches and µs as one H200 call of the Qwen3-30B-A3B
    experts at m = 1 profiled them (the step's kernel listing: 21.9 µs a grouped GEMM)."""
    from tuner.bench import kernels_by_time

    copy = ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda("
            "at::TensorIteratorBase&)")
    grouped = ("_ZN7cutlass13device_kernelIN2at4cuda6detail25enable_3x_kernel_for_sm9xINS_4gemm6"
               "kernel13GemmUniversalINS5_17GroupProblemShape")
    prepare = "void at::cuda::detail::prepare_grouped_gemm_data<cutlass::bfloat16_t>"
    launches = [(copy, 1.3), (prepare, 1.6), (grouped, 21.9), (copy, 1.2), (prepare, 1.5),
                (grouped, 21.8)]
    assert kernels_by_time(launches) == [grouped, prepare, copy]
    # cuBLAS's split-K GEMV and its reduce: in launch order when the GEMM is the longer
    gemv = "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_TNT"
    reduce = "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>"
    assert kernels_by_time([(gemv, 7.9), (reduce, 1.6)]) == [gemv, reduce]
    assert kernels_by_time([]) == []
