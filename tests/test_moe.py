"""MoE family under the Triton interpreter (CPU): the expert MLPs against an fp32 reference, the
align step, the baselines, the default config inside the space, the cost model and rows."""

import math

import pytest
import torch
import torch.nn.functional as F
from triton.runtime.interpreter import InterpretedFunction

from tuner_kernels import get_family, moe
from tuner_kernels.cost import moe_cost, touched_experts
from tuner.spaces import check_shape, space_for

TINY = {"m": 3, "experts": 4, "topk": 2, "hidden": 64, "inter": 32, "dtype": "bfloat16"}
# hidden 48 and inter 40: neither a multiple of BLOCK_SIZE_K 32 (masked K tails in both GEMMs)
RAGGED = {"m": 5, "experts": 6, "topk": 3, "hidden": 48, "inter": 40, "dtype": "bfloat16"}
BASE = {"GEMV": 0, "BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1,
        "SPLIT_K": 1, "SPLIT_K_UP": 1, "num_warps": 4, "num_stages": 2}
SERVED = [  # Qwen3-30B-A3B, Mixtral-8x7B, gpt-oss-20b decode and a prefill-sized batch
    {"m": 1, "experts": 128, "topk": 8, "hidden": 2048, "inter": 768, "dtype": "bfloat16"},
    {"m": 64, "experts": 128, "topk": 8, "hidden": 2048, "inter": 768, "dtype": "bfloat16"},
    {"m": 16, "experts": 8, "topk": 2, "hidden": 4096, "inter": 14336, "dtype": "bfloat16"},
    {"m": 4, "experts": 32, "topk": 4, "hidden": 2880, "inter": 2880, "dtype": "bfloat16"},
    {"m": 2048, "experts": 128, "topk": 8, "hidden": 2048, "inter": 768, "dtype": "float16"},
]


def rel_err(out, ref) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


def test_kernels_run_under_the_interpreter():
    assert isinstance(moe.moe_gemm_kernel, InterpretedFunction)


@pytest.mark.parametrize("shape,config", [
    (TINY, moe.default_config(TINY, "cuda")),
    (RAGGED, BASE),
    # several M blocks per expert and grouped launch order
    ({**RAGGED, "m": 12, "experts": 3}, {**BASE, "GROUP_SIZE_M": 4}),
    # split K of the down projection (inter 64 = 2 splits of 32)
    ({**TINY, "inter": 64}, {**BASE, "SPLIT_K": 2}),
], ids=["default", "ragged", "grouped", "split-k"])
def test_kernel_matches_the_fp32_reference_as_closely_as_the_baseline(shape, config):
    inputs = moe.make_inputs(shape, "cpu", seed=3)
    ref = moe.reference(inputs)
    out = torch.full((shape["m"], shape["hidden"]), float("nan"), dtype=torch.bfloat16)
    moe.launch(inputs, config, out=out)  # poisoned: every element must be written
    assert not torch.isnan(out).any()
    err = rel_err(out, ref)
    assert err < 8e-3
    assert err <= 1.25 * rel_err(moe.baseline(inputs), ref) + 1e-4


GEMV = {**BASE, "GEMV": 1, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 32, "num_stages": 1}


@pytest.mark.parametrize("shape,change", [
    (TINY, {}),
    # hidden 48, inter 40: ragged K chunks of 32 in both loops, and a last slice of 8 rows
    (RAGGED, {"BLOCK_SIZE_N": 16}),
    # one chunk: all of hidden 64, longer than inter 48; 4 rows a program, two pipeline stages
    ({**TINY, "inter": 48}, {"BLOCK_SIZE_N": 4, "BLOCK_SIZE_K": 64, "num_stages": 2}),
    # an expert shared by two tokens' pairs, every token of the 3 experts (12 pairs)
    ({**RAGGED, "m": 12, "experts": 3}, {}),
], ids=["tiny", "ragged", "long-chunk", "shared-experts"])
def test_the_gemv_path_matches_the_reference_in_two_launches(shape, change):
    """GEMV = 1: the up launch writes silu(gate) · up per pair, the down launch sums each token's
    topk experts in order; no align, no reduce; every output written (poisoned), as close to
    fp32 as the baseline, the same bytes run to run, and inside the space for the shape."""
    config = {**GEMV, **change}
    assert space_for("moe", "cuda").check(config, shape) == ""
    inputs = moe.make_inputs(shape, "cpu", seed=4)
    _, calls = moe.launch_plan(inputs, config)
    assert [c.kernel for c in calls] == [moe.moe_gemv_up_kernel, moe.moe_gemv_down_kernel]
    ref = moe.reference(inputs)
    out = torch.full((shape["m"], shape["hidden"]), float("nan"), dtype=torch.bfloat16)
    moe.launch(inputs, config, out=out)
    assert not torch.isnan(out).any()
    assert rel_err(out, ref) <= 1.25 * rel_err(moe.baseline(inputs), ref) + 1e-4
    assert torch.equal(out, moe.launch(inputs, config))


@pytest.mark.parametrize("config", [GEMV, BASE], ids=["gemv", "grouped"])
def test_a_dense_gated_mlp_is_the_family_at_one_expert_against_transformers_mlp(config):
    """experts 1, top-k 1 (tuner harvest --gated-mlp): the inputs route every token to expert 0
    with weight 1, the baseline is transformers' MLP (three F.linear calls, silu · up in the
    dtype), and both kernel paths match the fp32 reference as closely as it does."""
    shape = {"m": 3, "experts": 1, "topk": 1, "hidden": 64, "inter": 48, "dtype": "bfloat16"}
    assert moe.dense_mlp(shape) and not moe.dense_mlp(TINY)
    assert space_for("moe", "cuda").check(config, shape) == ""
    inputs = moe.make_inputs(shape, "cpu", seed=5)
    assert torch.equal(inputs["topk_ids"], torch.zeros(3, 1, dtype=torch.int32))
    assert torch.equal(inputs["topk_weights"], torch.ones(3, 1))
    x, w1, w2 = inputs["x"], inputs["w1"][0], inputs["w2"][0]
    mlp = F.linear(F.silu(F.linear(x, w1[:48])) * F.linear(x, w1[48:]), w2)
    assert torch.equal(moe.baseline(inputs), mlp)
    ref = moe.reference(inputs)
    out = moe.launch(inputs, config)
    assert rel_err(out, ref) <= 1.25 * rel_err(mlp, ref) + 1e-4


def test_the_gemv_path_is_kept_to_decode_sizes_with_its_other_knobs_pinned():
    space = space_for("moe", "cuda")
    decode, prefill = SERVED[0], {**SERVED[0], "m": 128}
    gemv = [c for c in space.configs(decode) if c["GEMV"]]
    assert gemv and not [c for c in space.configs(prefill) if c["GEMV"]]
    assert all(c["BLOCK_SIZE_N"] <= 32 and c["BLOCK_SIZE_K"] >= 128 and c["SPLIT_K"] == 1
               and c["SPLIT_K_UP"] == 1 and c["GROUP_SIZE_M"] == 1 for c in gemv)
    # the MMA path keeps its tiles: no 8-row N tiles, no plain (1-stage) loop on sm90
    mma = {**moe.default_config(decode), "BLOCK_SIZE_N": 8}
    assert "BLOCK_SIZE_N >= 32" in space.check(mma, decode)
    assert "num_stages >= 2" in space.check({**moe.default_config(decode), "num_stages": 1},
                                            decode)


def test_split_k_changes_the_sums_but_is_deterministic():
    shape = {**TINY, "inter": 64}
    inputs = moe.make_inputs(shape, "cpu", seed=5)
    one = moe.launch(inputs, BASE)
    two = moe.launch(inputs, {**BASE, "SPLIT_K": 2})
    again = moe.launch(inputs, {**BASE, "SPLIT_K": 2})
    assert torch.equal(two, again)
    assert rel_err(two, moe.reference(inputs)) < 8e-3 and rel_err(one, moe.reference(inputs)) < 8e-3


@pytest.mark.parametrize("shape", [TINY, RAGGED], ids=["tiny", "ragged"])
def test_a_split_up_projection_matches_the_reference_and_repeats_its_bytes(shape):
    """SPLIT_K_UP splits hidden over programs writing fp32 partials of the intermediate, which
    the down projection's A loads sum in a fixed order: as close to fp32 as the unsplit launch
    (the intermediate is not rounded to bf16 then), the same bytes run to run, and combined
    with the down projection's own SPLIT_K."""
    inputs = moe.make_inputs(shape, "cpu", seed=3)
    ref = moe.reference(inputs)
    one = moe.launch(inputs, BASE)
    for split_up, split_k in ((2, 1), (2, 2), (3, 1)):
        config = {**BASE, "SPLIT_K_UP": split_up, "SPLIT_K": split_k}
        out = moe.launch(inputs, config)
        assert torch.equal(out, moe.launch(inputs, config))
        assert rel_err(out, ref) <= rel_err(one, ref) * 1.05 + 1e-4, (split_up, split_k)
        assert rel_err(out, one.float()) < 8e-3


@pytest.mark.parametrize("block_m", [1, 4, 16])
def test_align_lists_every_pair_once_grouped_and_padded_by_expert(block_m):
    experts, m, topk = 7, 9, 3
    ids = torch.stack([torch.randperm(experts, generator=torch.Generator().manual_seed(i))[:topk]
                       for i in range(m)]).to(torch.int32)
    sorted_ids, expert_ids, total = moe.align(ids, experts, block_m)
    pairs = m * topk
    assert sorted_ids.numel() == moe.max_padded(pairs, experts, block_m)
    flat = ids.reshape(-1).tolist()
    real = [int(p) for p in sorted_ids.tolist() if p < pairs]
    assert sorted(real) == list(range(pairs))  # each pair exactly once
    counts = [flat.count(e) for e in range(experts)]
    assert int(total) == sum(math.ceil(c / block_m) * block_m for c in counts)
    for b in range(int(total) // block_m):
        block = sorted_ids[b * block_m:(b + 1) * block_m].tolist()
        members = [p for p in block if p < pairs]
        assert members, "a block inside the padded total holds pairs"
        assert all(flat[p] == int(expert_ids[b]) for p in members)
        assert members == sorted(members)
    assert all(p == pairs for p in sorted_ids[int(total):].tolist())


def _kernel_align(ids, experts, block_m):
    pairs = ids.numel()
    slots = moe.max_padded(pairs, experts, block_m)
    out = (torch.full((slots,), -7, dtype=torch.int32),
           torch.full((slots // block_m,), -7, dtype=torch.int32),
           torch.full((1,), -7, dtype=torch.int32))
    moe.moe_align_kernel[(1,)](ids.contiguous().view(-1), *out, pairs, experts, slots,
                               slots // block_m, BLOCK_SIZE_M=block_m,
                               E_BLOCK=1 << (experts - 1).bit_length(), CHUNK=moe.align_chunk(experts))
    return out


@pytest.mark.parametrize("experts,m,topk,block_m", [
    (7, 9, 3, 1), (7, 9, 3, 16), (128, 1, 8, 16), (128, 64, 8, 16), (128, 64, 8, 64),
    (32, 5, 4, 32)])
def test_the_align_kernel_gives_the_torch_align_bytes(experts, m, topk, block_m):
    """moe_align_kernel (one program, chunks of pairs) writes what `align` computes with torch
    ops: the same pair order (stable within an expert), sentinels, block experts and total; int64
    ids as transformers' router gives them. 512 pairs cross many chunks."""
    gen = torch.Generator().manual_seed(experts * 100 + m)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:topk] for _ in range(m)])
    expected = moe.align(ids, experts, block_m)
    got = _kernel_align(ids, experts, block_m)
    for name, want, have in zip(("sorted_ids", "expert_ids", "total"), expected, got):
        assert torch.equal(want.to(torch.int32), have), name


def test_a_decode_plan_aligns_in_one_launch_and_a_prefill_plan_with_torch_ops():
    decode = moe.make_inputs({**TINY, "m": 2}, "cpu")
    _, calls = moe.launch_plan(decode, BASE)
    assert [c.kernel for c in calls][0] is moe.moe_align_kernel and len(calls) == 4
    assert moe.align_in_kernel(moe.ALIGN_MAX_PAIRS, 128)
    assert not moe.align_in_kernel(moe.ALIGN_MAX_PAIRS + 1, 128)
    assert not moe.align_in_kernel(8, moe.ALIGN_MAX_EXPERTS + 1)
    wide = {"m": 4, "experts": moe.ALIGN_MAX_EXPERTS * 2, "topk": 2, "hidden": 32, "inter": 32,
            "dtype": "bfloat16"}
    _, calls = moe.launch_plan(moe.make_inputs(wide, "meta"), BASE)
    assert len(calls) == 3 and moe.moe_align_kernel not in [c.kernel for c in calls]


def test_the_baselines_agree_with_the_reference():
    inputs = moe.make_inputs(RAGGED, "cpu", seed=1)
    ref = moe.reference(inputs)
    assert moe.grouped_mm_available("cpu")
    assert rel_err(moe.grouped_baseline(inputs), ref) < 8e-3
    assert rel_err(moe.loop_baseline(inputs), ref) < 8e-3


def test_inputs_route_each_token_to_distinct_experts_with_normalised_weights():
    inputs = moe.make_inputs({**TINY, "m": 16, "experts": 8, "topk": 3}, "cpu", seed=2)
    ids = inputs["topk_ids"]
    assert all(len(set(row.tolist())) == 3 for row in ids)
    assert torch.allclose(inputs["topk_weights"].sum(-1), torch.ones(16))
    assert inputs["x"].abs().max() > 0
    again = moe.make_inputs({**TINY, "m": 16, "experts": 8, "topk": 3}, "cpu", seed=2)
    assert torch.equal(again["w2"], inputs["w2"]) and torch.equal(again["topk_ids"], ids)


@pytest.mark.parametrize("backend", ["cuda", "hip", "dcu"])
@pytest.mark.parametrize("shape", SERVED + [TINY, RAGGED], ids=lambda s: moe.shape_key(s))
def test_default_config_is_inside_the_space(shape, backend):
    config = moe.default_config(shape, backend)
    assert space_for("moe", backend).check(config, shape) == ""


def test_space_keeps_configs_for_decode_and_prefill_and_hip_knobs_only_on_hip():
    for shape in SERVED[:2]:
        assert space_for("moe", "cuda").configs(shape)
    assert "waves_per_eu" in space_for("moe", "hip").params
    assert "waves_per_eu" not in space_for("moe", "cuda").params
    # 16-row M tiles only for one token's eight pairs: bigger tiles only repeat padding
    kept = space_for("moe", "cuda").configs(SERVED[0])
    assert {c["BLOCK_SIZE_M"] for c in kept} == {16}


def test_cost_counts_the_touched_experts_weights_once():
    m1 = SERVED[0]
    per_expert = 3 * 768 * 2048 * 2
    assert touched_experts(1, 128, 8) == pytest.approx(8)
    assert moe.bytes_moved(m1) == 2 * 2048 * 2 + 8 * per_expert
    assert moe.flops(m1) == 2 * 8 * 3 * 768 * 2048
    # many tokens touch every expert, never more
    assert touched_experts(4096, 128, 8) == pytest.approx(128)
    nbytes, _ = moe_cost(m=4096, experts=128, topk=8, hidden=2048, inter=768)
    assert nbytes == pytest.approx(2 * 4096 * 2048 * 2 + 128 * per_expert, rel=1e-9)


def test_rows_shape_keys_and_the_registry():
    row = {"family": "moe", "m": 4, "n": 768, "k": 2048, "experts": 128, "topk": 8,
           "dtype": "bfloat16"}
    shape = moe.shape_from_row(row)
    assert shape == {"m": 4, "experts": 128, "topk": 8, "hidden": 2048, "inter": 768,
                     "dtype": "bfloat16"}
    assert check_shape("moe", shape) == ""
    assert moe.shape_from_row({**row, "family": "gemm"}) is None
    assert moe.shape_from_row({**row, "topk": 0}) is None
    assert "topk" in check_shape("moe", {**shape, "topk": 200})
    assert moe.shape_key(shape) == "m=4,experts=128,topk=8,hidden=2048,inter=768,dtype=bfloat16"
    assert get_family("moe") is moe.FAMILY
