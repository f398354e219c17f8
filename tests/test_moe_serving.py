"""tuner.serving's MoE route: a transformers Qwen3-MoE model (random weights, tiny sizes) whose
experts modules run torch.ops.tuner.moe (tuner_kernels.moe under the Triton interpreter on the CPU)
with an export written by tuner.export; the fallbacks; `tuner ab` on an MoE config. The GPU test
(marker `gpu`) captures the routed block in a CUDA graph.
Run the GPU test with: TRITON_INTERPRET=0 python3 -m pytest -m gpu tests/test_moe_serving.py"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from tuner_kernels import get_family, moe as family
from tuner import runtime, serving

from test_serving import (  # noqa: F401 (device: a fixture)
    IDENTITY, assert_replays_as_eager, device, rel_err, write_export)

pytest.importorskip("transformers")

HERE = Path(__file__).resolve().parent
TINY_MOE = HERE / "fixtures" / "ab" / "tiny_qwen3_moe.json"
# the tiny config's MoE structure (experts, topk, hidden, inter) at m tokens
SHAPE = {"experts": 8, "topk": 2, "hidden": 64, "inter": 32, "dtype": "bfloat16"}


def moe_shape(m: int) -> dict:
    return {"m": m, **SHAPE}


def tiny_decode(batch: int = 2, dtype=torch.bfloat16, device_name: str = "cpu"):
    """The tiny Qwen3-MoE config as `tuner ab --hf-config` builds it (tuner.ab.harness)."""
    from tuner.ab.harness import hf_factory, make_harness

    return make_harness(hf_factory(TINY_MOE), batch=batch, prompt=4, steps=2, dtype=dtype,
                        device=device_name)


def block_and_input(m: int = 2, seed: int = 0, device_name: str = "cpu"):
    """The first layer's Qwen3MoeSparseMoeBlock (bf16) and an [m, 1, hidden] input."""
    harness = tiny_decode(device_name=device_name)
    block = harness.model.model.layers[0].mlp
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, 1, SHAPE["hidden"], generator=g).to(torch.bfloat16).to(device_name)
    return block, x


def test_the_tiny_config_builds_qwen3_moe_blocks_the_route_reads_as_stored():
    harness = tiny_decode()
    blocks = [layer.mlp for layer in harness.model.model.layers]
    assert [type(b).__name__ for b in blocks] == ["Qwen3MoeSparseMoeBlock"] * 2
    assert serving.moe_layout(blocks[0].experts) == (8, 64, 32)
    assert serving.moe_layout(blocks[0]) is None  # the block itself has no expert weights


@pytest.mark.parametrize("model_type,experts,layout", [
    ("mixtral", {"num_local_experts": 8, "intermediate_size": 32}, (8, 64, 32)),
    ("qwen2_moe", {"num_experts": 8, "moe_intermediate_size": 32,
                   "shared_expert_intermediate_size": 64, "intermediate_size": 64}, (8, 64, 32)),
    # transposed, interleaved gate / up columns, biases, a clamped SwiGLU: not the kernel's
    ("gpt_oss", {"num_local_experts": 8, "intermediate_size": 32}, None),
    # stored as the kernel reads them, but its SwiGLU clamps gate and up (swiglu_limit)
    ("deepseek_v4", {"num_local_experts": 8, "intermediate_size": 32}, None),
])
def test_which_transformers_experts_the_route_takes(model_type, experts, layout):
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"this transformers has no {model_type}")

    config = transformers.AutoConfig.for_model(
        model_type, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_hidden_layers=1, vocab_size=128, num_experts_per_tok=2, **experts)
    model = transformers.AutoModelForCausalLM.from_config(config)
    found = [serving.moe_layout(m) for m in model.modules() if hasattr(m, "gate_up_proj")]
    assert found == [layout]


@torch.no_grad()
def test_the_routed_block_matches_the_reference_as_closely_as_transformers(device, monkeypatch):
    block, x = block_and_input(m=3)
    launched = []
    original = family.launch

    def spy(inputs, config, out=None):
        launched.append(inputs)
        return original(inputs, config, out)

    monkeypatch.setattr(family, "launch", spy)
    expected = block(x)
    _, weights, ids = block.gate(x.view(-1, SHAPE["hidden"]))
    experts = block.experts
    reference = family.reference({"x": x.view(-1, SHAPE["hidden"]), "w1": experts.gate_up_proj,
                                  "w2": experts.down_proj, "topk_ids": ids,
                                  "topk_weights": weights.float()}).view(x.shape)
    write_export(device, [("moe", moe_shape(3))])
    with serving.installed(block, export_dir=device / "nvidia-h200", families=("moe",)) as handle:
        assert handle.experts == [experts]
        out = block(x)
        hits = handle.hits()
    assert hits == {"moe": {family.shape_key(moe_shape(3)): 1}}
    # the kernel read the module's own parameters: no copy, no rearranged second set
    assert len(launched) == 1
    assert launched[0]["w1"].data_ptr() == experts.gate_up_proj.data_ptr()
    assert launched[0]["w2"].data_ptr() == experts.down_proj.data_ptr()
    err, base_err = rel_err(out, reference), rel_err(expected, reference)
    assert err < 8e-3 and err <= 1.25 * base_err + 1e-4  # the family's accuracy gate
    assert "forward" not in experts.__dict__ and "_tuner_moe" not in experts.__dict__
    assert torch.equal(block(x), expected)  # uninstalled: transformers' own path again


@torch.no_grad()
def test_the_routed_model_decodes_as_the_unrouted_one(device):
    harness = tiny_decode()
    harness.prefill()
    expected = harness.decode()
    write_export(device, [("moe", moe_shape(2))])
    with serving.installed(harness.model, export_dir=device / "nvidia-h200") as handle:
        assert len(handle.experts) == 2
        harness.prefill()  # 8 prompt tokens: two octaves from the m = 2 entry, transformers'
        out = harness.decode()
        hits = handle.hits()
    assert hits["moe"] == {family.shape_key(moe_shape(2)): 2}  # 2 layers' decode calls
    assert rel_err(out, expected) < 2e-2


@torch.no_grad()
def test_a_call_at_an_m_not_exported_takes_the_nearest_m(device, monkeypatch):
    block, _ = block_and_input()
    wide = {**family.default_config(moe_shape(16), "cuda"), "BLOCK_SIZE_N": 32}
    write_export(device, [("moe", moe_shape(1)), ("moe", moe_shape(16), wide)])
    configs = []
    original = family.launch
    monkeypatch.setattr(family, "launch", lambda inputs, config, out=None: (
        configs.append(config), original(inputs, config, out))[1])
    with serving.installed(block, export_dir=device / "nvidia-h200", families=("moe",)) as handle:
        assert handle.status()["moe"].startswith("loaded: 2 entries")
        for m in (2, 12):
            block(torch.randn(m, 1, SHAPE["hidden"]).to(torch.bfloat16))
        hits = handle.hits()["moe"]
    # m = 2 is an octave from the m = 1 entry's bucket, m = 12 in the m = 16 entry's bucket
    assert hits == {family.shape_key(moe_shape(1)): 1, family.shape_key(moe_shape(16)): 1}
    assert configs[0]["BLOCK_SIZE_N"] == 64 and configs[1]["BLOCK_SIZE_N"] == 32


@torch.no_grad()
def test_a_failing_kernel_runs_transformers_experts_with_one_warning(device, caplog,
                                                                      monkeypatch):
    block, x = block_and_input()
    expected = block(x)
    write_export(device, [("moe", moe_shape(2))])

    def broken(*args, **kwargs):
        raise RuntimeError("out of resources: shared memory")

    monkeypatch.setattr(family, "launch", broken)
    caplog.set_level(logging.WARNING, logger="tuner.serving")
    with serving.installed(block, export_dir=device / "nvidia-h200", families=("moe",)):
        first, second = block(x), block(x)
    assert torch.equal(first, expected) and torch.equal(second, expected)  # bit for bit
    warnings = [r.getMessage() for r in caplog.records if r.name == "tuner.serving"]
    assert len(warnings) == 1 and "out of resources" in warnings[0]
    assert "baseline path runs" in warnings[0]


@torch.no_grad()
def test_a_damaged_export_runs_transformers_experts_with_one_warning(device, caplog):
    block, x = block_and_input()
    expected = block(x)
    write_export(device, [("moe", moe_shape(2))])
    path = device / "nvidia-h200" / "moe.json"
    path.write_text(path.read_text().replace('"BLOCK_SIZE_N": 64', '"BLOCK_SIZE_N": 48'))
    caplog.set_level(logging.WARNING)
    with serving.installed(block, export_dir=device / "nvidia-h200", families=("moe",)) as handle:
        first, second = block(x), block(x)
        assert handle.status()["moe"].startswith("refused:")
        assert not handle.hits() and sum(handle.misses()["moe"].values()) == 2
    assert torch.equal(first, expected) and torch.equal(second, expected)
    refused = [r.getMessage() for r in caplog.records if "refusing" in r.getMessage()]
    assert len(refused) == 1 and "sha256" in refused[0]


@torch.no_grad()
def test_the_routed_block_compiles_in_one_graph(device):
    block, x = block_and_input()
    write_export(device, [("moe", moe_shape(2))])
    with serving.installed(block, export_dir=device / "nvidia-h200", families=("moe",)) as handle:
        eager = block(x)
        torch._dynamo.reset()
        compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
        out = compiled(x)  # fullgraph: a graph break would raise here
        hits = handle.hits()["moe"]
    torch._dynamo.reset()
    assert torch.equal(out, eager)
    assert hits == {family.shape_key(moe_shape(2)): 2}  # the compiled call ran tuner.moe too


# ---------------------------------------------------------------------------- tuner ab
def test_ab_on_an_moe_config_says_it_routes_the_moe_blocks(capsys):
    from tuner import ab
    from tuner.cli import main

    if ab._have_gpu():
        pytest.skip("this machine has a GPU")
    assert main(["ab", "--hf-config", str(TINY_MOE), "--batch", "1"]) == 2
    out = capsys.readouterr().out
    assert "tuner ab would build --hf-config" in out and "at batch 1" in out
    assert "routes its 2 MoE blocks (8 experts, top-2, hidden 64, inter 32) through tuner.moe" in out
    assert ("attributes MoE calls per shape only where both arms' harvested tables have MoE "
            "rows") in out
    assert main(["ab", "--hf-config", str(TINY_MOE), "--family", "gemv,gemm"]) == 2
    assert "MoE" not in capsys.readouterr().out  # moe not installed: nothing said about it


def test_moe_calls_without_harvested_moe_rows_are_said_to_be_unattributed():
    from tuner.ab import moe_attribution_note

    serving_data = {"hits": {"moe": {"m=2,experts=8": 6}, "gemv": {"m=2,n=64": 4}}}
    linear = {"family": "gemm", "m": 2, "n": 64, "k": 64}
    note = moe_attribution_note(serving_data, {"baseline": [linear], "tuned": [linear]})
    assert note.startswith("MoE: 6 calls ran tuner.moe") and "not attributed per shape" in note
    moe = {"family": "moe", "m": 2, "n": 32, "k": 64, "experts": 8, "topk": 2}
    # the tuned arm's tuner::moe row alone is not attributed (the baseline has none): said so
    assert moe_attribution_note(serving_data, {"baseline": [linear], "tuned": [linear, moe]}) \
        == note
    assert moe_attribution_note(serving_data, {"baseline": [moe], "tuned": [linear, moe]}) == ""
    assert moe_attribution_note({"hits": {"gemv": {"m=2,n=64": 4}}}, {}) == ""


def test_the_ceiling_of_linear_tuning_says_it_leaves_out_the_moe_calls():
    """A MoE step can beat the linears' ceiling (the 16-layer Qwen3-30B-A3B step: 1.34x against
    a 1.15x ceiling): where the tuned arm ran tuner.moe, the ceiling line says it counts the
    linears only; a dense step's line says nothing of MoE."""
    from tuner.ab import verdict as abv

    arms = {"baseline": {"median_us": 2288.3, "spread_pct": 0.18, "groups": [2288.3] * 10},
            "tuned": {"median_us": 1703.6, "spread_pct": 0.11, "groups": [1703.6] * 10}}
    moe_step = abv.ABVerdict(label="moe", arms=arms, ceiling_step_us=1989.8,
                             floor_profile="NVIDIA H200",
                             serving={"hits": {"moe": {"m=1,experts=128": 64}, "gemv": {"m=1": 8}}})
    dense = abv.ABVerdict(label="dense", arms=arms, ceiling_step_us=1989.8,
                          floor_profile="NVIDIA H200", serving={"hits": {"gemv": {"m=1": 8}}})
    words = "linears only: the 64 tuner.moe calls of the tuned arm are not in it"
    (line,) = [x for x in abv.summary_lines(moe_step) if "ceiling" in x]
    assert "1.1500x at most" in line and words in line
    assert words in abv.markdown(moe_step)
    assert "tuner.moe" not in "\n".join(abv.summary_lines(dense)) + abv.markdown(dense)


def test_ab_measures_an_moe_model_on_the_cpu(device, tmp_path):
    from tuner.ab import verdict as abv
    from tuner.ab.measure import ABSettings, measure

    write_export(device, [("moe", moe_shape(2))])
    settings = ABSettings(batch=2, prompt=4, steps=2, groups=2, replays=1, device="cpu",
                          export_dir=str(device / "nvidia-h200"), out_dir=str(tmp_path / "ab"),
                          families=("moe",), profile=False)
    data = measure(("hf", str(TINY_MOE)), settings)
    # (and transformers' repeat_kv attention, timed as context beside the grouped-KV baseline)
    assert set(data["group_us"]) == {"baseline", "tuned", "aa", "repeat_kv"}
    hits = data["serving"]["hits"]["moe"]
    assert list(hits) == [family.shape_key(moe_shape(2))] and sum(hits.values()) >= 2
    forced = data["outputs"]["teacher_forced"]
    assert forced["aa"] == forced["baseline"]
    assert abv.decide(data, label="tiny-moe").outputs["error_ratio"] < 1.25


# ---------------------------------------------------------------------------- on the GPU
@pytest.mark.gpu
@torch.no_grad()
def test_the_routed_block_replays_in_a_cuda_graph_as_it_runs_eagerly(device):
    """Warm up, capture the routed block, replay on new inputs copied into the captured buffer:
    the bytes of the eager routed call, every replay, and the kernel ran (hits)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA/HIP GPU")
    block, static = block_and_input(m=4, device_name="cuda")
    write_export(device, [("moe", moe_shape(4))])
    with serving.installed(block, export_dir=device / "nvidia-h200", families=("moe",)) as handle:
        handle.warmup(lambda: block(static))
        assert_replays_as_eager(block, static)
        hits = handle.hits()["moe"]
    assert sum(hits.values()) >= 5  # warmup, the warm call, the capture, the eager calls


@torch.no_grad()
def test_the_router_linear_of_a_moe_block_runs_the_exported_gemv(device):
    """Qwen3-MoE's router is a module of its own that calls F.linear on its weight, not an
    nn.Linear: installed, that call takes the gemv entry of its (m, experts, hidden) shape, the
    router's top-k choice stays transformers' own computation, and compiled the call is the op
    (fullgraph: the mode traces); uninstalled, the router's forward is the class's again."""
    block, x = block_and_input(m=2)
    router = block.gate
    expected = router(x.view(-1, SHAPE["hidden"]))
    shape = {"m": 2, "n": SHAPE["experts"], "k": SHAPE["hidden"], "dtype": "bfloat16"}
    write_export(device, [("gemv", shape)])
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with serving.installed(block, export_dir=device / "nvidia-h200", families=("gemv",)) as handle:
        assert handle.routers == [router] and handle.linears == []
        logits, scores, ids = router(x.view(-1, SHAPE["hidden"]))
        hits = handle.hits()["gemv"]
        torch._dynamo.reset()
        compiled = torch.compile(router, fullgraph=True, backend=backend)(
            x.view(-1, SHAPE["hidden"]))
    torch._dynamo.reset()
    assert hits == {get_family("gemv").shape_key(shape): 1}
    assert rel_err(logits, expected[0]) < 8e-3
    assert torch.equal(ids, expected[2]) and torch.equal(compiled[2], ids)
    ops = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert sum("tuner.linear" in op for op in ops) == 1
    assert "forward" not in router.__dict__ and "_tuner_linear" not in router.__dict__
    assert all(torch.equal(a, b) for a, b in zip(router(x.view(-1, SHAPE["hidden"])), expected))


def test_ab_harvests_the_arms_of_a_moe_config_with_its_topk(monkeypatch, device, tmp_path):
    """One A/B as `tuner ab` runs it (tuner.ab._one), from a recorded measurement (an H100's
    Qwen3-8B b1 child, tests/fixtures/ab/): each arm's traces are read as `tuner harvest --topk`
    reads them for a MoE config (its num_experts_per_tok; transformers' grouped-mm experts in the
    baseline arm then give moe rows that pair with the tuned arm's tuner::moe rows), and ab.json's
    attribution names the export entry serving each call, measured and projected saving beside
    it. A dense config's moe_topk is None: no topk is passed."""
    import json

    import pandas as pd

    from tuner import ab, harvest
    from tuner.ab.child import ChildResult
    from tuner.harvest.pipeline import HarvestResult

    shape = {"m": 1, "n": 4096, "k": 4096, "dtype": "bfloat16"}
    write_export(device, [("gemv", shape)])  # 5.0 -> 4.0 us a call
    data = json.loads((HERE / "fixtures" / "ab" / "measurement_qwen3_8b_b1_h100.json").read_text())
    monkeypatch.setattr(ab, "run_child", lambda *a, **k: ChildResult(True, data, 0, "done", "",
                                                                     1.0))
    seen = []

    def harvested(paths, capture=None, quiet=False, topk=None, gated_mlp=False):
        assert not gated_mlp  # a MoE model's export holds no dense MLP entries
        seen.append(topk)
        arm = Path(paths[0]).name.split("_")[0]
        row = {"op": "tuner::linear" if arm == "tuned" else "inductor::mm_reduction",
               "family": "gemm", "phase": "decode", "batch": 1, "layout": "NT",
               "calls_per_step": 72.0, "us_per_call": 12.2 if arm == "tuned" else 14.4,
               "kernels": "_gemv_kernel" if arm == "tuned" else "triton_red_fused_mm_t_0",
               "step_gpu_us": 6000.0, "step_us": 6300.0, **shape}
        return HarvestResult(table=pd.DataFrame([row]), traces=list(paths))

    monkeypatch.setattr(harvest, "harvest", harvested)
    settings = ab.ABSettings(steps=8, groups=10, replays=8)
    folder = device / "nvidia-h200"
    verdict = ab._one(("hf", str(TINY_MOE)), "tiny", 1, "max-autotune", settings, str(folder),
                      str(tmp_path / "ab"), 60, out=lambda line: None)
    assert seen == [2, 2, 2]  # baseline, tuned and A/A arms, each with the config's top-k
    record = json.loads((tmp_path / "ab" / "tiny-b1-max-autotune" / "ab.json").read_text())
    (row,) = record["attribution"]
    assert row["shape"] == "m=1,n=4096,k=4096"
    assert row["export_entries"] == [{"family": "gemv", "key": "m=1,n=4096,k=4096,dtype=bfloat16"}]
    assert row["measured_saving_us"] == pytest.approx(2.2 * 72)
    assert row["projected_saving_us"] == pytest.approx(72.0)
    assert verdict.arms["baseline"]["median_us"] == pytest.approx(6319.8, abs=0.05)
    ab._harvest({"baseline": {"replay": "baseline_replay.json", "capture": "c.json"}},
                ab.moe_topk(("hf", str(HERE / "fixtures" / "ab" / "tiny_llama_gqa.json"))))
    assert seen[-1] is None
