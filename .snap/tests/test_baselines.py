"""The strongest baselines (tuner.baselines) in `tuner ab` and `tuner rank`: the step baselines
(eager, compile, max-autotune), the grouped-cache SDPA that replaces transformers' repeat_kv path
in the baseline arms, and that copy timed as context, never as a tuner saving."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tuner_kernels.attention import make_inputs, reference
from tuner import baselines
from tuner.ab import verdict as abv
from tuner.ab.measure import ABSettings, measure
from tuner.cli import main
from tuner.errors import TunerError

HERE = Path(__file__).resolve().parent
TINY = f"{HERE / 'fixtures' / 'ab' / 'tiny_lm.py'}:TinyDecode"

TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": 2, "vocab_size": 256, "max_position_embeddings": 256,
              "rms_norm_eps": 1e-5, "head_dim": 16}


def test_baseline_names_parse_and_bad_ones_are_refused():
    assert baselines.parse_baselines("eager, max-autotune") == ["eager", "max-autotune"]
    with pytest.raises(TunerError, match="unknown baseline 'fast'"):
        baselines.parse_baselines("eager,fast")
    with pytest.raises(TunerError, match="twice"):
        baselines.parse_baselines("compile,compile")
    with pytest.raises(TunerError, match="one or more"):
        baselines.parse_baselines(" , ")
    assert baselines.strongest_available(gpu=False) == "eager"
    assert baselines.COMPILE_MODES["max-autotune"] == "max-autotune-no-cudagraphs"


def test_compile_step_passes_the_mode_only_to_inductor(monkeypatch):
    seen = {}

    def fake_compile(fn, **kwargs):
        seen.update(kwargs)
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    step = lambda: 1  # noqa: E731
    assert baselines.compile_step(step, "eager") is step and not seen
    baselines.compile_step(step, "max-autotune")
    assert seen == {"backend": "inductor", "dynamic": False, "mode": "max-autotune-no-cudagraphs"}
    seen.clear()
    baselines.compile_step(step, "compile", backend="aot_eager")
    assert seen == {"backend": "aot_eager", "dynamic": False}


@pytest.mark.parametrize("masked", [False, True])
def test_every_grouped_sdpa_form_that_runs_matches_the_reference_without_a_copy(masked):
    shape = {"batch": 3, "heads": 8, "kv_heads": 2, "kv_len": 40, "head_dim": 16,
             "dtype": "bfloat16"}
    inputs = make_inputs(shape, "cpu", 1)
    if masked:
        valid = torch.zeros(3, 1, 40, dtype=torch.bool)
        valid[..., :29] = True
        inputs["mask"] = valid
    want = reference(inputs)
    ran = []
    for form in baselines.sdpa_forms():
        try:
            got = baselines.grouped_sdpa(inputs, form)
        except RuntimeError:  # a backend that does not take this call on the CPU
            continue
        ran.append(form)
        assert got.shape == want.shape
        assert float((got.float() - want).abs().max()) < 2e-2, form
    assert {f.layout for f in ran} == {"packed", "gqa"}  # the math backend runs both


def test_the_grouped_op_is_what_a_trace_records_as_the_decode_call():
    """tuner::grouped_sdpa takes q [b, h, 1, d] and the grouped k / v: harvest reads it as the
    decode attention call tuner.serving replaces (heads and KV heads as they are)."""
    from tuner.harvest.config import ATTN_BHLD

    assert "tuner::grouped_sdpa" in ATTN_BHLD
    op = baselines.grouped_sdpa_op()
    q = torch.randn(2, 4, 1, 8)
    k, v = torch.randn(2, 2, 10, 8), torch.randn(2, 2, 10, 8)
    out = op(q, k, v, None, None, "packed", "MATH")
    want = reference({"q": q[:, :, 0], "k": k, "v": v})
    assert out.shape == (2, 4, 1, 8) and torch.allclose(out[:, :, 0], want, atol=1e-5)


@pytest.fixture
def llama_config(tmp_path):
    pytest.importorskip("transformers")
    path = tmp_path / "tiny_llama.json"
    path.write_text(json.dumps(TINY_LLAMA))
    return path


def test_a_grouped_model_runs_grouped_sdpa_in_its_baseline_and_repeat_kv_as_context(
        llama_config, tmp_path):
    (tmp_path / "export").mkdir()
    settings = ABSettings(batch=2, prompt=4, steps=3, groups=2, replays=1, device="cpu",
                          export_dir=str(tmp_path / "export"), out_dir=str(tmp_path / "ab"),
                          families=("gemv",), profile_steps=1, baseline="eager")
    stages = []
    data = measure(("hf", str(llama_config)), settings, stages.append)
    assert any(s.startswith("attention baseline") for s in stages)
    assert data["attention_baseline"]["layout"] == "packed"
    assert data["attention_baseline"]["shape"]["kv_heads"] == 2
    assert set(data["group_us"]) == {"baseline", "tuned", "aa", "repeat_kv"}
    forced = data["outputs"]["teacher_forced"]
    # the grouped call computes what transformers' repeat_kv path computes, up to bf16 rounding
    for got, want in zip(forced["baseline"]["error"], forced["repeat_kv"]["error"]):
        assert math.isclose(got, want, rel_tol=0.05, abs_tol=1e-3)
    assert forced["aa"] == forced["baseline"]
    # the baseline arm's trace records the grouped call; the context arm is not profiled
    assert "repeat_kv" not in data["traces"]
    capture = Path(data["traces"]["baseline"]["capture"]).read_text()
    assert "tuner::grouped_sdpa" in capture
    v = abv.decide(data, label="tiny")
    assert v.baseline == "eager" and v.attention_baseline == "SDPA packed (math)"
    assert set(v.context) == {"median_us", "over_baseline_us"}
    lines = "\n".join(abv.summary_lines(v))
    assert "not counted as a tuner saving" in lines and "grouped cache" in lines
    assert "repeat_kv" in abv.markdown(v)


def test_transformers_attention_can_stay_the_baseline(llama_config, tmp_path):
    (tmp_path / "export").mkdir()
    settings = ABSettings(batch=1, prompt=4, steps=2, groups=2, replays=1, device="cpu",
                          export_dir=str(tmp_path / "export"), out_dir=str(tmp_path / "ab"),
                          families=("gemv",), profile=False, reference=False,
                          grouped_attention=False)
    data = measure(("hf", str(llama_config)), settings)
    assert "attention_baseline" not in data and set(data["group_us"]) == {"baseline", "tuned", "aa"}


def test_the_verdict_names_its_baseline_and_where_the_projection_was_measured():
    data = {"settings": {"compile": "inductor", "baseline": "max-autotune"},
            "baseline": "max-autotune",
            "group_us": {"baseline": [100.0, 101.0, 100.5], "tuned": [90.0, 90.5, 90.2],
                         "aa": [100.2, 100.9, 100.4]}}
    v = abv.decide(data, label="m-b1-max-autotune", projected={"m=1,n=8,k=8": 12.0},
                   projection_baselines=["eager", "max-autotune", "eager"])
    assert v.step_mode.startswith("torch.compile max-autotune")
    assert v.projection_baselines == ["eager", "max-autotune"]
    line = next(x for x in abv.summary_lines(v) if x.strip().startswith("saving"))
    assert "measured against: eager, max-autotune" in line
    assert "baseline max-autotune" in abv.summary_lines(v)[0]


def test_ab_flags_for_baselines_are_checked_in_one_line(capsys):
    assert main(["ab", TINY, "--baseline", "fastest"]) == 2
    assert "unknown baseline 'fastest'" in capsys.readouterr().err
    assert main(["ab", TINY, "--compile", "--baseline", "max-autotune"]) == 2
    assert "--compile is --baseline compile" in capsys.readouterr().err


def test_ab_without_a_gpu_names_the_baselines_it_would_run(capsys):
    from tuner import ab

    if ab._have_gpu():
        pytest.skip("this machine has a GPU")
    assert main(["ab", TINY, "--baseline", "eager,max-autotune"]) == 2
    out = capsys.readouterr().out
    assert "against the baseline eager and max-autotune" in out


@pytest.mark.parametrize("target, words", [
    ("no_such_module_anywhere:Decode", "cannot import no_such_module_anywhere"),
    ("missing/file.py:Decode", "file not found"),
    (f"{HERE / 'fixtures' / 'ab' / 'tiny_lm.py'}:NoSuchThing", "has no attribute 'NoSuchThing'"),
])
def test_a_harness_that_cannot_be_found_is_one_line_before_the_gpu_check(capsys, target, words):
    assert main(["ab", target]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tuner: error:") and words in err and "GPU" not in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_module_that_raises_on_import_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad_harness.py"
    bad.write_text("raise ValueError('no model here')\n")
    assert main(["ab", f"{bad}:Decode"]) == 2
    err = capsys.readouterr().err
    assert "importing" in err and "ValueError: no model here" in err and "Traceback" not in err


def test_a_harness_that_raises_in_the_child_is_one_line(tmp_path):
    from tuner.ab.child import run_child

    bad = tmp_path / "raising_harness.py"
    bad.write_text("def Decode(batch):\n    raise RuntimeError('weights missing')\n")
    settings = ABSettings(batch=1, prompt=4, steps=1, groups=2, replays=1, device="cpu",
                          reference=False, profile=False, out_dir=str(tmp_path / "ab"))
    result = run_child(("callable", f"{bad}:Decode"), settings, tmp_path / "work", timeout_s=120)
    assert not result.ok and result.returncode == 2
    assert "building the model failed: RuntimeError: weights missing" in result.usage_error


@pytest.mark.gpu
def test_the_max_autotune_arm_captures_and_replays_in_one_graph(llama_config, tmp_path):
    """max-autotune without Inductor's own CUDA graphs, inside the harness's one graph: every arm
    captures, the A/A arm replays the baseline's compiled step bit for bit."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA or ROCm GPU")
    (tmp_path / "export").mkdir()
    settings = ABSettings(batch=2, prompt=8, steps=3, groups=3, replays=2, device="cuda",
                          export_dir=str(tmp_path / "export"), out_dir=str(tmp_path / "ab"),
                          families=("gemv",), profile=False, baseline="max-autotune",
                          compile="inductor")
    stages = []
    data = measure(("hf", str(llama_config)), settings, stages.append)
    assert any("max-autotune, torch.compile inductor" in s for s in stages)
    # the repeat_kv context arm runs beside the eager baseline only (one more compile here)
    assert set(data["group_us"]) == {"baseline", "tuned", "aa"}
    assert all(math.isfinite(g) and g > 0 for groups in data["group_us"].values() for g in groups)
    forced = data["outputs"]["teacher_forced"]
    assert forced["aa"] == forced["baseline"]
    assert data["attention_baseline"]["form"]


# ------------------------------------------------------------------ rank --baseline max-autotune
def test_the_max_autotune_reference_compiles_in_that_mode(monkeypatch):
    from tuner_kernels import get_family
    from tuner import bench

    monkeypatch.setattr(bench, "_COMPILED_BASELINES", {})
    seen = []

    def fake_compile(fn, **kwargs):
        seen.append(kwargs.get("mode"))
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    family = get_family("gemv")
    shape = {"m": 1, "n": 16, "k": 32, "dtype": "bfloat16"}
    name, fn = bench._callable_for(family, shape, bench.MAX_AUTOTUNE_BASELINE, "cuda")
    assert seen == ["max-autotune-no-cudagraphs"] and "max-autotune" in name
    assert bench._callable_for(family, shape, bench.COMPILED_BASELINE, "cuda")[1] is not fn
    assert seen == ["max-autotune-no-cudagraphs", "default"]  # one wrapper a family and mode
    assert bench.baseline_path(family, shape, bench.MAX_AUTOTUNE_BASELINE) == \
        "torch.compile max-autotune"
    inputs = family.make_inputs(shape, "cpu", 0)
    assert torch.equal(fn(inputs), family.baseline(inputs))


def test_the_strongest_attention_baseline_is_grouped_sdpa_in_its_fastest_form(monkeypatch):
    """rank --baseline max-autotune for attention: SDPA on the grouped cache in the form
    fastest_sdpa_form picks (timed once a shape), also for a call traced on a repeated cache."""
    from tuner_kernels import get_family
    from tuner import bench

    monkeypatch.setattr(bench, "_ATTENTION_FORMS", {})
    picked = []

    def fastest(shape, **options):
        picked.append(shape)
        return baselines.SDPAForm("gqa", "MATH"), []

    monkeypatch.setattr(baselines, "fastest_sdpa_form", fastest)
    family = get_family("attention")
    shape = {"batch": 2, "heads": 8, "kv_heads": 2, "kv_len": 24, "head_dim": 16,
             "dtype": "bfloat16", "baseline_kv_heads": 8}
    name, fn = bench._callable_for(family, shape, bench.MAX_AUTOTUNE_BASELINE, "cuda")
    bench._callable_for(family, shape, bench.MAX_AUTOTUNE_BASELINE, "cuda")
    assert len(picked) == 1 and "baseline_kv_heads" not in picked[0]
    assert name == "baseline (SDPA gqa (math))"
    inputs = family.make_inputs(shape, "cpu", 0)
    assert float((fn(inputs).float() - reference(inputs)).abs().max()) < 2e-2
    assert bench.baseline_path(family, shape, bench.MAX_AUTOTUNE_BASELINE) == "SDPA gqa (math)"


def test_the_verdict_table_names_the_baseline_kernel_it_beat():
    import pandas as pd

    from tuner import rank

    row = {c: None for c in ("rank", "shape", "family", "config", "parity", "decision", "reason")}
    row.update(rank=1, shape="m=1,n=8,k=8", family="gemv", config="{}", parity="accuracy ok",
               decision="accept", reason="", baseline_us=5.0, candidate_us=4.0, speedup=1.25,
               speedup_low=1.2, speedup_high=1.3, saving_us_per_call=1.0, calls_per_step=2.0,
               hit_rate=1.0, saving_us_per_token=2.0, share_of_step=0.01,
               baseline_path="torch.compile max-autotune",
               baseline_kernel="triton_tem_fused_mm_0")
    text = rank.markdown(pd.DataFrame([row]))
    assert "torch.compile max-autotune: `triton_tem_fused_mm_0`" in text
    old = {k: v for k, v in row.items() if k not in ("baseline_path", "baseline_kernel")}
    assert "| eager |" in rank.markdown(pd.DataFrame([old]))  # tables from before the columns


def test_rank_baseline_flags_are_one_line(capsys):
    assert main(["rank", "--baseline", "max-autotune", "--compiled-baseline",
                 "--device", "h200"]) == 2
    assert "--compiled-baseline is --baseline compile" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["rank", "--baseline", "fastest"])
    assert exit_.value.code == 2 and "invalid choice" in capsys.readouterr().err


# --------------------------------------------- harvest reads max-autotune's GEMM templates
MAX_AUTOTUNE_PAIR = HERE / "fixtures" / "traces" / "h200_tiny_llama_max_autotune"


def test_max_autotunes_triton_gemm_templates_are_read_as_linear_calls():
    """A real max-autotune decode step (H200): Inductor lowered every linear to a Triton template
    kernel, some with a norm or an activation fused in; each is one call of its linear shape, so
    `tuner ab` attributes a max-autotune baseline per shape and rank's studies can come from it."""
    from tuner import harvest
    from tuner.harvest.config import INDUCTOR_GEMM_OP

    meta = json.loads((MAX_AUTOTUNE_PAIR.parent / (MAX_AUTOTUNE_PAIR.name + ".meta.json"))
                      .read_text())
    result = harvest.harvest([f"{MAX_AUTOTUNE_PAIR}_replay.pt.trace.json.gz"],
                             capture=[f"{MAX_AUTOTUNE_PAIR}_capture.pt.trace.json.gz"], quiet=True)
    table = result.table
    linears = table[table.op == INDUCTOR_GEMM_OP]
    got = {f"m={r.m},n={r.n},k={r.k}": r.calls_per_step for r in linears.itertuples()}
    assert got == meta["linears_per_step"]
    assert set(linears.layout) == {"NT"} and set(linears.family) == {"gemm"}
    assert (linears.us_per_call > 1.0).all() and linears.traced_compiled.all()
    kernels = [k.strip() for k in ";".join(linears.kernels).split(";")]
    assert kernels and all(k.startswith("triton_tem_fused_") for k in kernels)


MAX_AUTOTUNE_B1_PAIR = HERE / "fixtures" / "traces" / "h200_llama31_8b_2l_b1_max_autotune"


def test_max_autotunes_fused_matrix_vector_reductions_are_read_as_linear_calls():
    """A real max-autotune decode step at batch 1 (H200, Llama-3.1-8B's linears): Inductor made
    every m = 1 linear a reduction fused with its norm, activation, residual or cache write, k and
    v (and gate and up) two at a time in one kernel, an embedding table gathered inside some.
    Every linear is one call of its shape, the fused pairs split into two calls of half the time,
    and no table is read as a linear."""
    from tuner import harvest
    from tuner.harvest.config import INDUCTOR_GEMV_OP

    meta = json.loads((MAX_AUTOTUNE_B1_PAIR.parent / (MAX_AUTOTUNE_B1_PAIR.name + ".meta.json"))
                      .read_text())
    result = harvest.harvest([f"{MAX_AUTOTUNE_B1_PAIR}_replay.pt.trace.json.gz"],
                             capture=[f"{MAX_AUTOTUNE_B1_PAIR}_capture.pt.trace.json.gz"],
                             quiet=True)
    table = result.table
    linears = table[table.op == INDUCTOR_GEMV_OP]
    got = {f"m={r.m},n={r.n},k={r.k}": r.calls_per_step for r in linears.itertuples()}
    assert got == meta["linears_per_step"]
    assert set(linears.layout) == {"NT"} and set(linears.family) == {"gemm"}
    assert linears.traced_compiled.all()
    kernels = [k.strip() for k in ";".join(linears.kernels).split(";")]
    assert kernels and all(k.startswith("triton_red_fused_") for k in kernels)
    # the lm_head reads 1 GiB: no split; gate and up share a kernel, so each is half of it
    by = {(r.n, r.k): r.us_per_call for r in linears.itertuples()}
    assert by[(128256, 4096)] > 4 * by[(14336, 4096)] > 0


@pytest.mark.parametrize("dims, linears", [
    # k and v from one kernel: two weights, outputs [1, 1024] and the cache [1, 8, 162, 128]
    ([[1, 1, 4096], [1024, 4096], [1024, 4096], [1], [1, 1024], [1, 8, 162, 128]], 2),
    # q after a norm of the gathered embedding: the table has no [.., 128256] output
    ([[4096], [1, 1], [128256, 4096], [1, 1, 1], [4096, 4096], [1, 4096]], 1),
])
def test_a_fused_reduction_counts_each_weight_with_an_output_as_a_linear(dims, linears):
    from tuner.harvest.config import INDUCTOR_GEMV_OP
    from tuner.harvest.records import Op
    from tuner.harvest.shapes import gemm_shape

    op = Op(INDUCTOR_GEMV_OP, 1, 0.0, 1.0, None, dims, ["c10::BFloat16"] * len(dims), [], "gemm")
    shape = gemm_shape(op)
    assert shape["m"] == 1 and shape["linears"] == linears and shape["k"] == 4096


@pytest.mark.parametrize("dims, why", [
    ([[1, 4096], [128256, 4096], [1, 1]], "a gathered table: no output of its n"),
    ([[1, 4096], [4096, 4096], [1024, 4096], [1, 4096], [1, 1024]], "two weight shapes"),
    ([[1, 4096], [4096, 4096, 1], [1, 4096]], "no 2-D weight"),
])
def test_a_fused_reduction_whose_dims_do_not_say_gives_no_shape(dims, why):
    from tuner.harvest.config import INDUCTOR_GEMV_OP
    from tuner.harvest.records import Op
    from tuner.harvest.shapes import gemm_shape

    op = Op(INDUCTOR_GEMV_OP, 1, 0.0, 1.0, None, dims, ["c10::BFloat16"] * len(dims), [], "gemm")
    assert gemm_shape(op) is None, why


@pytest.mark.parametrize("dims, why", [
    ([[2, 1, 256], [256, 256]], "no output"),
    ([[2, 1, 256], [256, 256], [2, 128]], "output n is not the weight's"),
    ([[2, 1, 300], [256, 256], [2, 256]], "input is not m x k"),
    ([[2, 1, 256], [256, 256, 1], [2, 256]], "weight not 2-D"),
])
def test_a_template_call_whose_dims_do_not_fit_gives_no_shape(dims, why):
    from tuner.harvest.config import INDUCTOR_GEMM_OP
    from tuner.harvest.records import Op
    from tuner.harvest.shapes import gemm_shape

    op = Op(INDUCTOR_GEMM_OP, 1, 0.0, 1.0, None, dims, ["c10::BFloat16"] * len(dims), [], "gemm")
    assert gemm_shape(op) is None, why


def test_a_default_baseline_that_cannot_compile_the_step_falls_back_to_eager_and_says_so(
        tmp_path, monkeypatch, capsys):
    """The default is the strongest baseline the machine runs; a harness torch.compile cannot
    take crashes its baseline arm's capture: the A/B says so and measures against eager. A
    baseline the user named is never replaced."""
    from tuner import ab

    ran = []

    def one(spec, label, batch, baseline, settings, export_dir, out_root, timeout_s, out):
        ran.append(baseline)
        crashed = ("the measurement process died at '[ 12s] capture: baseline arm (max-autotune"
                   ", torch.compile inductor: the warm-up compiles)' (exit code 1)"
                   if baseline == "max-autotune" else "")
        return abv.ABVerdict(label=f"{label}-b{batch}-{baseline}", arms={}, crashed=crashed)

    monkeypatch.setattr(ab, "_have_gpu", lambda: True)
    monkeypatch.setattr(ab, "strongest_available", lambda gpu: "max-autotune")
    monkeypatch.setattr(ab, "_one", one)
    (tmp_path / "export").mkdir()
    settings = ABSettings(export_dir=str(tmp_path / "export"))
    ab.run(("callable", TINY), batches=[1], settings=settings, out_root=tmp_path)
    assert ran == ["max-autotune", "eager"]
    assert "measuring against eager instead" in capsys.readouterr().err
    ran.clear()
    ab.run(("callable", TINY), batches=[1], settings=settings, baselines=["max-autotune"],
           out_root=tmp_path)
    assert ran == ["max-autotune"]
