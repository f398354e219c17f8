"""Harvest of a transformers model's own decode step (a trace `tuner ab --trace-only` writes; here
on the CPU, eagerly): every step is decode, and its SDPA call reads as one query token per
sequence whatever the transformers version does with grouped heads (repeat_kv before SDPA, or,
from about 5.2x, the grouped query heads packed as the query length over the unrepeated cache).
"""

from __future__ import annotations

import json

import pytest

from tuner import harvest

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
