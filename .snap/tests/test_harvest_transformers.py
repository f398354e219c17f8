"""Harvest of a transformers model's own decode step (a trace `tuner ab --trace-only` writes; here
on the CPU, eagerly): every step is decode, and its SDPA call reads as one query token per
sequence whatever the transformers version does with grouped heads (repeat_kv before SDPA, or,
from about 5.2x, the grouped query heads packed as the query length over the unrepeated cache).
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tuner_kernels import get_family
from tuner import harvest
from tuner.cli import main as cli_main

TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": 3, "vocab_size": 256, "max_position_embeddings": 256,
              "rms_norm_eps": 1e-5, "head_dim": 16}


def test_a_transformers_decode_step_harvests_as_decode_with_its_query_heads(tmp_path):
    pytest.importorskip("transformers")
    import transformers.integrations.sdpa_attention as hf_sdpa

    from tuner.ab.measure import ABSettings, measure

    config = tmp_path / "tiny_llama.json"
    config.write_text(json.dumps(TINY_LLAMA))
    settings = ABSettings(batch=2, prompt=8, steps=4, device="cpu", trace_only=True,
                          reference=False, out_dir=str(tmp_path / "ab"))
    traces = measure(("hf", str(config)), settings, lambda stage: None)["traces"]["baseline"]
    result = harvest.harvest([traces["replay"]])
    rows = result.table
    assert set(rows["phase"]) == {"decode"}
    (att,) = rows[rows["family"] == "attention"].to_dict("records")
    assert (att["batch"], att["heads"], att["q_len"], att["head_dim"]) == (2, 4, 1, 16)
    # transformers that packs the grouped query heads leaves the cache unrepeated: its 2 KV heads
    packs = hasattr(hf_sdpa, "pack_gqa")
    assert att["kv_heads"] == (2 if packs else 4)

    # --kv-heads 2 (the model's num_key_value_heads): the grouped call serving runs, either way
    out = tmp_path / "grouped.parquet"
    assert cli_main(["harvest", traces["replay"], "--kv-heads", "2", "-o", str(out)]) == 0
    grouped = pd.read_parquet(out)
    (att2,) = grouped[grouped["family"] == "attention"].to_dict("records")
    assert (att2["heads"], att2["kv_heads"], att2["q_len"]) == (4, 2, 1)
    assert att2["calls_per_step"] == att["calls_per_step"]
    # a regrouped row keeps the KV heads the traced call read: its baseline repeats the cache
    if packs:   # nothing regrouped: no such column
        assert "traced_kv_heads" not in grouped.columns
    else:
        assert att2["traced_kv_heads"] == 4
        assert get_family("attention").shape_from_row(att2)["baseline_kv_heads"] == 4
    again = harvest.harvest([traces["replay"]], kv_heads=2)
    note = " ".join(again.traces[0].notes)
    assert ("nothing regrouped" in note) if packs else ("read as the grouped call" in note)


def _call(heads, kv_heads, q_len):
    from tuner.harvest.records import Call

    return Call("aten::scaled_dot_product_attention", "attention", q_len, 162, 128, 4,
                "bfloat16", "", 0.0, heads=heads, kv_heads=kv_heads, q_len=q_len, kv_len=162,
                head_dim=128)


def test_kv_heads_regroups_only_repeated_decode_calls_of_a_proper_divisor():
    from tuner.harvest.shapes import regroup_kv_heads

    calls = [_call(32, 32, 1), _call(32, 32, 7), _call(32, 8, 1), _call(20, 20, 1),
             _call(8, 8, 1)]
    assert regroup_kv_heads(calls, 8) == 1
    assert [c.kv_heads for c in calls] == [8, 32, 8, 20, 8]   # prefill, grouped, 20 % 8, MHA


def test_kv_heads_must_be_positive(capsys):
    assert cli_main(["harvest", "x.json", "--kv-heads", "0"]) != 0
    assert "--kv-heads must be >= 1" in capsys.readouterr().err


def _sdpa_op(q, k, mask, q_strides=None):
    from tuner.harvest.records import Op

    dims = [q, k, k, mask, [], [], [], []]
    strides = [q_strides or [], [], [], [], [], [], [], []]
    types = ["c10::BFloat16"] * 3 + ["bool", "Scalar", "Scalar", "Scalar", "Scalar"]
    return Op("aten::scaled_dot_product_attention", 1, 0.0, 1.0, None, dims, types, strides,
              "attention")


@pytest.mark.parametrize("case, q, k, mask, strides, expected", [
    # transformers' packing: 32 query heads on 8 KV heads, one token, kv_len 162
    ("packed", [4, 8, 4, 128], [4, 8, 162, 128], [4, 1, 1, 162], [4096, 512, 128, 1],
     (32, 8, 1)),
    ("packed, no strides recorded", [4, 8, 4, 128], [4, 8, 162, 128], [1, 1, 1, 162], None,
     (32, 8, 1)),
    # a cross-attention prefill (8 queries over 257 encoder keys, a key-padding mask), its
    # query transposed from [batch, len, heads, d]
    ("cross-attention", [2, 12, 8, 64], [2, 12, 257, 64], [2, 1, 1, 257],
     [6144, 64, 768, 1], (12, 12, 8)),
    # encoder self-attention with a padding mask: kv_len = q_len
    ("encoder", [2, 12, 8, 64], [2, 12, 8, 64], [2, 1, 1, 8], [6144, 512, 64, 1], (12, 12, 8)),
    # a causal prefill's mask has a row per query
    ("prefill", [1, 8, 4, 128], [1, 8, 162, 128], [1, 1, 4, 162], [4096, 512, 128, 1],
     (8, 8, 4)),
    # multi-query: 48 query heads packed on one KV head
    ("mqa", [2, 1, 48, 128], [2, 1, 162, 128], [2, 1, 1, 162], [6144, 6144, 128, 1],
     (48, 1, 1)),
    # more packed rows than any GQA group
    ("long", [1, 8, 256, 128], [1, 8, 1024, 128], [1, 1, 1, 1024], [262144, 32768, 128, 1],
     (8, 8, 256)),
])
def test_only_transformers_packed_decode_is_unpacked(case, q, k, mask, strides, expected):
    from tuner.harvest.shapes import attention_shape

    shape = attention_shape(_sdpa_op(q, k, mask, strides))
    assert (shape["heads"], shape["kv_heads"], shape["q_len"]) == expected, case


def test_kv_heads_does_not_go_with_watch(tmp_path, capsys):
    assert cli_main(["harvest", "--watch", str(tmp_path), "--kv-heads", "8"]) != 0
    assert "--kv-heads goes with TRACE... or --live" in capsys.readouterr().err
