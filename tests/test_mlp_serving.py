"""tuner.serving's dense gated MLP route (tuner.serving_mlp): a transformers Llama model (random
weights, tiny sizes) whose MLPs run torch.ops.tuner.moe at experts 1, top-k 1 (tuner_kernels.moe
under the Triton interpreter on the CPU) with an export written by tuner.export; the merged
gate / up weight; the fallbacks; one graph under torch.compile. The GPU test (marker `gpu`)
captures the routed MLP in a CUDA graph.
Run the GPU test with: TRITON_INTERPRET=0 python3 -m pytest -m gpu tests/test_mlp_serving.py"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tuner_kernels import moe as family
from tuner import serving
from tuner.layouts import gated_mlp_layout

from test_serving import (  # noqa: F401 (device: a fixture)
    assert_replays_as_eager, device, rel_err, write_export)

pytest.importorskip("transformers")

HERE = Path(__file__).resolve().parent
TINY_LLAMA = HERE / "fixtures" / "ab" / "tiny_llama_gqa.json"
HIDDEN, INTER = 256, 512  # the tiny config's
GEMV = {"GEMV": 1, "BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
        "SPLIT_K": 1, "SPLIT_K_UP": 1, "num_warps": 4, "num_stages": 1}


def mlp_shape(m: int) -> dict:
    return {"m": m, "experts": 1, "topk": 1, "hidden": HIDDEN, "inter": INTER,
            "dtype": "bfloat16"}


def mlp_and_input(m: int = 2, seed: int = 0, device_name: str = "cpu"):
    """The first layer's LlamaMLP of the tiny config (bf16) and an [m, 1, hidden] input."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(TINY_LLAMA)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16).to(device_name).eval()
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, 1, HIDDEN, generator=g).to(torch.bfloat16).to(device_name)
    return model, model.model.layers[0].mlp, x


def test_the_layout_reads_transformers_gated_mlps_and_nothing_else():
    model, mlp, _x = mlp_and_input()
    assert gated_mlp_layout(mlp) == (HIDDEN, INTER)
    assert [gated_mlp_layout(m) for m in model.modules()].count((HIDDEN, INTER)) == 2
    assert gated_mlp_layout(model.model.layers[0]) is None  # a decoder layer is not one
    mlp.act_fn = torch.nn.GELU()
    assert gated_mlp_layout(mlp) is None  # another activation than the kernel's SiLU


@torch.no_grad()
def test_a_served_mlp_runs_the_moe_kernels_on_its_merged_weight(device):
    model, mlp, x = mlp_and_input()
    expected = mlp(x)
    gate, up = mlp.gate_proj.weight, mlp.up_proj.weight
    values = torch.cat([gate, up]).clone()
    write_export(device, [("moe", mlp_shape(2), GEMV)])
    with serving.installed(model, export_dir=device / "nvidia-h200", families=("moe",)) as handle:
        assert len(handle.mlps) == 2 and handle.status()["moe"].startswith("loaded: 1 entr")
        assert mlp.gate_proj.weight is gate and mlp.up_proj.weight is up  # the same Parameters
        assert gate.untyped_storage().data_ptr() == up.untyped_storage().data_ptr()
        assert torch.equal(torch.cat([gate, up]), values)  # ... on one tensor, same values
        out = mlp(x)
        hits = handle.hits()["moe"]
    assert hits == {family.shape_key(mlp_shape(2)): 1}
    assert out.shape == expected.shape and rel_err(out, expected) < 1e-2
    assert "forward" not in mlp.__dict__ and "_tuner_mlp" not in mlp.__dict__
    assert torch.equal(mlp(x), expected)  # uninstalled: transformers' own forward again


@torch.no_grad()
def test_without_an_entry_of_its_structure_no_mlp_is_touched(device):
    model, mlp, x = mlp_and_input()
    expected = mlp(x)
    pointer = mlp.gate_proj.weight.data_ptr()
    other = {**mlp_shape(2), "inter": 2 * INTER}  # another model's MLP
    write_export(device, [("moe", other, GEMV)])
    with serving.installed(model, export_dir=device / "nvidia-h200", families=("moe",)) as handle:
        assert handle.mlps == []
        assert torch.equal(mlp(x), expected)
    assert mlp.gate_proj.weight.data_ptr() == pointer


@torch.no_grad()
def test_rows_beyond_the_served_range_run_transformers_forward(device):
    model, mlp, _x = mlp_and_input()
    write_export(device, [("moe", mlp_shape(1), GEMV)])
    with serving.installed(model, export_dir=device / "nvidia-h200", families=("moe",)) as handle:
        (_hidden, rows, *_rest) = mlp.__dict__["_tuner_mlp"]
        beyond = max(high for _low, high in rows) + 1
        x = torch.randn(beyond, 1, HIDDEN).to(torch.bfloat16)
        out = mlp(x)
        assert not handle.hits().get("moe")  # not routed: no lookup, no kernel
    assert torch.equal(out, mlp(x))


@torch.no_grad()
def test_the_routed_mlp_compiles_in_one_graph(device):
    model, mlp, x = mlp_and_input()
    write_export(device, [("moe", mlp_shape(2), GEMV)])
    with serving.installed(model, export_dir=device / "nvidia-h200", families=("moe",)) as handle:
        eager = mlp(x)
        torch._dynamo.reset()
        compiled = torch.compile(mlp, fullgraph=True, backend="aot_eager")
        out = compiled(x)  # fullgraph: a graph break would raise here
        hits = handle.hits()["moe"]
    torch._dynamo.reset()
    assert torch.equal(out, eager)
    assert hits == {family.shape_key(mlp_shape(2)): 2}  # the compiled call ran tuner.moe too


def test_an_export_of_dense_mlps_is_told_from_a_moe_models(device, tmp_path):
    from tuner.serving_mlp import dense_mlp_export as dense_mlp_entries

    write_export(device, [("moe", mlp_shape(1), GEMV)])
    assert dense_mlp_entries(device / "nvidia-h200")
    moe_export = tmp_path / "moe-export"
    write_export(moe_export, [("moe", {**mlp_shape(1), "experts": 8, "topk": 2})])
    assert not dense_mlp_entries(moe_export / "nvidia-h200")  # a MoE model's experts
    assert not dense_mlp_entries(tmp_path / "nowhere") and not dense_mlp_entries(None)


@pytest.mark.gpu
@torch.no_grad()
def test_the_routed_mlp_replays_in_a_cuda_graph_as_it_runs_eagerly(device):
    """Warm up, capture the routed MLP, replay on new inputs copied into the captured buffer:
    the bytes of the eager routed call every replay, within bf16 rounding of transformers'
    own MLP, and the kernels ran (hits)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA/HIP GPU")
    model, mlp, static = mlp_and_input(m=1, device_name="cuda")
    expected = mlp(static)
    write_export(device, [("moe", mlp_shape(1), GEMV)])
    with serving.installed(model, export_dir=device / "nvidia-h200", families=("moe",)) as handle:
        handle.warmup(lambda: mlp(static))
        assert rel_err(mlp(static), expected) < 1e-2
        assert_replays_as_eager(mlp, static)
        hits = handle.hits()["moe"]
    assert sum(hits.values()) >= 5  # warmup, the checks, the warm call, the capture, eager


@torch.no_grad()
def test_a_merged_model_is_routed_on_its_own_memory_install_after_install(device):
    """Merged first (as tuner ab does before its baseline capture): install reuses the merged
    tensor, so a graph captured before it reads the same weights; so does a second install."""
    from tuner.serving_mlp import merge_gated_mlps, merged_gate_up

    model, mlp, x = mlp_and_input()
    expected = mlp(x)
    assert merged_gate_up(mlp) is None
    assert merge_gated_mlps(model) == 2
    w13 = merged_gate_up(mlp)
    assert w13 is not None and w13.shape == (1, 2 * INTER, HIDDEN)
    pointer = mlp.gate_proj.weight.data_ptr()
    assert torch.equal(mlp(x), expected)  # merged: the same values, the same forward
    write_export(device, [("moe", mlp_shape(2), GEMV)])
    for _ in range(2):
        with serving.installed(model, export_dir=device / "nvidia-h200", families=("moe",)):
            assert mlp.__dict__["_tuner_mlp"][2].data_ptr() == pointer
            assert rel_err(mlp(x), expected) < 1e-2
    assert mlp.gate_proj.weight.data_ptr() == pointer and merge_gated_mlps(model) == 2
    assert mlp.gate_proj.weight.data_ptr() == pointer


@torch.no_grad()
def test_warmup_on_rows_runs_each_routed_mlp_once_a_row_count(device):
    model, _mlp, _x = mlp_and_input()
    write_export(device, [("moe", mlp_shape(2), GEMV)])
    with serving.installed(model, export_dir=device / "nvidia-h200", families=("moe",)) as handle:
        handle.warmup(rows=(2, 64))  # 64 rows: beyond the served octave, transformers' forward
        hits = handle.hits()["moe"]
    assert hits == {family.shape_key(mlp_shape(2)): 2}  # two MLPs, one served row count each
