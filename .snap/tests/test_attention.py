"""Decode attention family under the Triton interpreter (CPU): GQA/MQA correctness, head stacking,
deterministic split-KV, the interface."""



import hashlib  # noqa: E402

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from tuner_kernels import attention, get_family  # noqa: E402
from tuner.spaces import space_for  # noqa: E402

# p is rounded to bf16 before the P·V dot (as in flash attention) and the output to bf16.
TOLERANCE = {"bfloat16": 1.5e-2, "float16": 2e-3}

GQA = {"batch": 2, "heads": 8, "kv_heads": 2, "kv_len": 70, "head_dim": 64, "dtype": "bfloat16"}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


@pytest.fixture(scope="module")
def gqa_inputs():
    inputs = attention.make_inputs(GQA, "cpu", seed=0)
    return inputs, attention.reference(inputs)


def test_kernels_run_under_the_interpreter():
    assert isinstance(attention.decode_attention_kernel, InterpretedFunction)
    assert isinstance(attention.combine_kernel, InterpretedFunction)


@pytest.mark.parametrize("config", [
    {"HEADS_PER_BLOCK": 1, "BLOCK_N": 32, "SPLIT_KV": 1},   # no stacking: one query head a program
    {"HEADS_PER_BLOCK": 4, "BLOCK_N": 32, "SPLIT_KV": 1},   # the whole GQA group in one tl.dot
    {"HEADS_PER_BLOCK": 2, "BLOCK_N": 16, "SPLIT_KV": 3},   # ragged last split (70 = 5 tiles / 3)
    {"HEADS_PER_BLOCK": 4, "BLOCK_N": 16, "SPLIT_KV": 4},
], ids=lambda c: f"hpb{c['HEADS_PER_BLOCK']}-n{c['BLOCK_N']}-s{c['SPLIT_KV']}")
def test_gqa_matches_fp32_reference(gqa_inputs, config):
    inputs, ref = gqa_inputs
    out = torch.full_like(inputs["q"], float("nan"))  # poisoned: every element must be written
    attention.launch(inputs, config, out=out)
    assert not torch.isnan(out).any()
    assert rel_err(out, ref) < TOLERANCE["bfloat16"]
    assert torch.allclose(out.float(), ref, atol=5e-2, rtol=5e-2)


def test_split_kv_is_deterministic(gqa_inputs):
    inputs, ref = gqa_inputs
    config = {"HEADS_PER_BLOCK": 2, "BLOCK_N": 16, "SPLIT_KV": 4}
    first, second = attention.launch(inputs, config), attention.launch(inputs, config)
    assert digest(first) == digest(second)
    assert rel_err(first, ref) < TOLERANCE["bfloat16"]


def test_mqa_all_heads_share_one_kv_head_and_odd_head_dim():
    # MQA (16 query heads, 1 KV head), head_dim 80 (padded to 128 with masks), ragged kv_len.
    shape = {"batch": 1, "heads": 16, "kv_heads": 1, "kv_len": 33, "head_dim": 80, "dtype": "float16"}
    inputs = attention.make_inputs(shape, "cpu", seed=1)
    ref = attention.reference(inputs)
    for config in ({"HEADS_PER_BLOCK": 16, "BLOCK_N": 16, "SPLIT_KV": 2},
                   {"HEADS_PER_BLOCK": 1, "BLOCK_N": 32, "SPLIT_KV": 1}):
        assert rel_err(attention.launch(inputs, config), ref) < TOLERANCE["float16"]


def test_heads_per_block_must_divide_the_group(gqa_inputs):
    inputs, _ = gqa_inputs
    with pytest.raises(ValueError, match="HEADS_PER_BLOCK 3"):
        attention.launch(inputs, {"HEADS_PER_BLOCK": 3, "BLOCK_N": 16, "SPLIT_KV": 1})
    space = space_for("attention", "cuda")
    assert not space.allows({"HEADS_PER_BLOCK": 8, "BLOCK_N": 32, "SPLIT_KV": 1, "num_warps": 4,
                             "num_stages": 2}, GQA)  # group is 4


def test_default_config_runs_and_satisfies_every_space(gqa_inputs):
    inputs, ref = gqa_inputs
    assert rel_err(attention.launch(inputs, attention.default_config(GQA, "cuda")), ref) < TOLERANCE["bfloat16"]
    for batch, heads, kv_heads in ((1, 32, 8), (8, 32, 8), (1, 32, 32), (1, 64, 1), (4, 28, 4)):
        for kv_len in (70, 1024, 8192, 32768):
            for head_dim in (64, 128):
                shape = {"batch": batch, "heads": heads, "kv_heads": kv_heads, "kv_len": kv_len,
                         "head_dim": head_dim, "dtype": "bfloat16"}
                for backend in ("cuda", "hip", "dcu"):
                    config = attention.default_config(shape, backend)
                    assert space_for("attention", backend).allows(config, shape), (backend, shape, config)


def test_baseline_is_sdpa_with_gqa(gqa_inputs):
    inputs, ref = gqa_inputs
    assert rel_err(attention.baseline(inputs), ref) < TOLERANCE["bfloat16"]


def test_shape_from_row_and_interface():
    family = get_family("attention")
    assert family is attention.FAMILY
    row = pd.Series({"family": "attention", "op": "aten::scaled_dot_product_attention", "batch": 8,
                     "dtype": "bfloat16", "heads": 32, "kv_heads": 8, "q_len": 1, "kv_len": 8192,
                     "head_dim": 128, "m": 0, "n": 0, "k": 0})
    shape = family.shape_from_row(row)
    assert shape == {"batch": 8, "heads": 32, "kv_heads": 8, "kv_len": 8192, "head_dim": 128,
                     "dtype": "bfloat16"}
    assert family.shape_key(shape) == "batch=8,heads=32,kv_heads=8,kv_len=8192,head_dim=128,dtype=bfloat16"
    assert family.shape_from_row({**row.to_dict(), "q_len": 512}) is None  # prefill
    assert family.shape_from_row({**row.to_dict(), "kv_heads": pd.NA}) is None
    assert family.shape_from_row({**row.to_dict(), "family": "gemm"}) is None
    assert attention.kv_bytes(shape) == 2 * 8 * 8 * 8192 * 128 * 2
    assert family.bytes_moved(shape) == attention.kv_bytes(shape) + 2 * 8 * 32 * 128 * 2
    assert family.flops(shape) == 4 * 8 * 32 * 8192 * 128


def test_a_call_traced_on_a_repeated_cache_keeps_the_grouped_key_and_the_traced_baseline():
    """harvest --kv-heads: the row's key is the grouped call serving runs; its baseline is the
    traced call, transformers' repeat_kv copy and SDPA on the repeated cache."""
    row = {"family": "attention", "batch": 2, "dtype": "bfloat16", "heads": 8, "kv_heads": 2,
           "q_len": 1, "kv_len": 70, "head_dim": 64, "traced_kv_heads": 8}
    shape = attention.shape_from_row(row)
    assert shape == {**GQA, "baseline_kv_heads": 8}
    assert attention.shape_key(shape) == attention.shape_key(GQA)
    assert attention.shape_from_row({**row, "traced_kv_heads": pd.NA}) == GQA
    assert attention.shape_from_row({**row, "traced_kv_heads": 3}) == GQA   # no GQA group

    inputs = attention.make_inputs(shape, "cpu", seed=0)
    grouped = attention.make_inputs(GQA, "cpu", seed=0)
    assert inputs["baseline_kv_heads"] == 8 and "baseline_kv_heads" not in grouped
    assert all(torch.equal(inputs[t], grouped[t]) for t in ("q", "k", "v"))
    repeated = {"q": inputs["q"], "k": inputs["k"].repeat_interleave(4, dim=1),
                "v": inputs["v"].repeat_interleave(4, dim=1)}
    assert torch.equal(attention.baseline(inputs), attention.baseline(repeated))
    # the kernel runs on the grouped cache: the extra input changes nothing
    config = {"HEADS_PER_BLOCK": 4, "BLOCK_N": 32, "SPLIT_KV": 1}
    assert torch.equal(attention.launch(inputs, config), attention.launch(grouped, config))
    from tuner.spaces import check_shape   # exports and the loader accept it
    assert check_shape("attention", shape) == ""
    assert "baseline_kv_heads 3" in check_shape("attention", {**GQA, "baseline_kv_heads": 3})
    with pytest.raises(ValueError, match="baseline_kv_heads"):
        attention.make_inputs({**GQA, "baseline_kv_heads": 3}, "cpu")


def test_parity_checker_on_attention():
    from tuner import parity

    split = {"HEADS_PER_BLOCK": 4, "BLOCK_N": 32, "SPLIT_KV": 2}
    checker = parity.Checker(attention.FAMILY, GQA, device="cpu", seeds=2)
    facts = checker.facts(split)
    assert facts.error_vs_reference < 1e-2 and facts.nonfinite == 0, facts
    assert facts.passes("accuracy"), facts  # as accurate as torch's SDPA on the same inputs
    again = parity.Checker(attention.FAMILY, GQA, device="cpu", seeds=2, default_config=split)
    assert again.facts(split).passes("kernel")  # a config reproduces its own bytes


def test_real_decode_rows_group_of_seven():
    # The bundled Qwen2.5-0.5B trace: 14 query heads on 2 KV heads (group 7), kv_len 129..134.
    from pathlib import Path

    from tuner import shapetable

    table = shapetable.read(Path(__file__).resolve().parent.parent / "shapes" / "examples" / "qwen25_05b_b4_decode.parquet")
    shapes = [s for s in (attention.shape_from_row(row) for _, row in table.iterrows()) if s]
    decode_rows = table[(table["family"] == "attention") & (table["q_len"] == 1)]
    assert len(shapes) == len(decode_rows) > 0
    space = space_for("attention", "cuda")
    for shape in shapes:
        assert (shape["heads"], shape["kv_heads"], shape["head_dim"]) == (14, 2, 64)
        config = attention.default_config(shape, "cuda")
        assert config["HEADS_PER_BLOCK"] == 7 and 7 in space.params["HEADS_PER_BLOCK"]
        assert space.allows(config, shape)
        assert {c["HEADS_PER_BLOCK"] for c in space.configs(shape)} == {1, 7}
    shape = shapes[0]
    inputs = attention.make_inputs(shape, "cpu", seed=3)
    out = attention.launch(inputs, {"HEADS_PER_BLOCK": 7, "BLOCK_N": 64, "SPLIT_KV": 2})
    assert rel_err(out, attention.reference(inputs)) < TOLERANCE["bfloat16"]


@pytest.mark.parametrize("hpb,split", [(2, 1), (1, 2)])
def test_a_mask_of_the_query_row_and_a_scale_give_sdpas_result(hpb, split):
    """A static KV cache's decode call: boolean (True attends) or additive mask over the cache
    positions, broadcast over heads, and SDPA's explicit scale; split KV included. The error
    against the fp32 reference is torch's."""
    shape = {"batch": 3, "heads": 4, "kv_heads": 2, "kv_len": 40, "head_dim": 32,
             "dtype": "bfloat16"}
    inputs = attention.make_inputs(shape, "cpu", seed=3)
    lengths = torch.tensor([40, 17, 5])
    keep = (torch.arange(40)[None, :] < lengths[:, None])[:, None, None, :]
    additive = torch.where(keep, 0.0, -1e4).to(torch.bfloat16)
    config = {"HEADS_PER_BLOCK": hpb, "BLOCK_N": 16, "SPLIT_KV": split, "num_warps": 4,
              "num_stages": 1}
    for mask in (keep, additive):
        for scale in (None, 0.3):
            x = dict(inputs, mask=mask, scale=scale)
            ref = attention.reference(x)
            ours = (attention.launch(x, config).float() - ref).abs().max().item()
            torch_err = (attention.baseline(x).float() - ref).abs().max().item()
            assert ours <= 1.5 * torch_err + 1e-3, (mask.dtype, scale, ours, torch_err)
    # the short sequence ignores what its mask hides: other values there change nothing
    x = dict(inputs, mask=keep)
    before = attention.launch(x, config)
    k2 = inputs["k"].clone()
    k2[2, :, 5:] = 100.0
    after = attention.launch(dict(x, k=k2), config)
    assert torch.equal(before[2], after[2])


def test_a_mask_that_does_not_fit_one_query_row_is_refused():
    shape = {"batch": 2, "heads": 4, "kv_heads": 2, "kv_len": 16, "head_dim": 32,
             "dtype": "bfloat16"}
    inputs = attention.make_inputs(shape, "cpu", seed=0)
    config = attention.default_config(shape)
    with pytest.raises(ValueError, match="one query row"):
        attention.launch_plan(dict(inputs, mask=torch.ones(2, 1, 2, 16, dtype=torch.bool)), config)
    with pytest.raises(ValueError, match="does not broadcast"):
        attention.launch_plan(dict(inputs, mask=torch.ones(2, 1, 1, 15, dtype=torch.bool)), config)


@pytest.mark.parametrize("split", [1, 2])
def test_one_head_per_program_on_the_grouped_cache_equals_the_repeated_cache_bit_for_bit(split):
    """A config of the repeated-KV shape (heads = kv_heads after repeat_kv: one head per
    program) on the grouped cache it was repeated from gives the same bytes: tuner.runtime lets
    such an entry serve the grouped call, without the copy."""
    shape = {"batch": 2, "heads": 8, "kv_heads": 2, "kv_len": 40, "head_dim": 32,
             "dtype": "bfloat16"}
    inputs = attention.make_inputs(shape, "cpu", seed=4)
    keep = (torch.arange(40)[None, :] < torch.tensor([40, 23])[:, None])[:, None, None, :]
    grouped = dict(inputs, mask=keep, scale=0.2)
    repeated = dict(grouped, k=inputs["k"].repeat_interleave(4, dim=1),
                    v=inputs["v"].repeat_interleave(4, dim=1))
    config = {"HEADS_PER_BLOCK": 1, "BLOCK_N": 16, "SPLIT_KV": split, "num_warps": 2,
              "num_stages": 1}
    out = attention.launch(grouped, config)
    assert torch.equal(out, attention.launch(repeated, config))
    assert rel_err(out, attention.reference(grouped)) < TOLERANCE["bfloat16"]
