"""Harvest of fused MoE calls (tuner/harvest/moe.py) on the real vLLM gpt-oss-20b pair cut to two
layers (tests/fixtures/traces/vllm_gptoss20b_moe_2l_*, cut_vllm_moe.py), the engines'
fused-experts op dims, the rows the moe family and the budget read, and what is left out."""
from __future__ import annotations

import contextlib
import gzip
import json
import math
import statistics
from pathlib import Path

import pandas as pd
import pytest

from harvest_helpers import load_events, row
from tuner import budget, harvest, shapetable
from tuner.device import load_profile
from tuner.harvest.moe import moe_call
from tuner.harvest.records import Op

FIXTURES = Path(__file__).parent / "fixtures" / "traces"
CAPTURE = FIXTURES / "vllm_gptoss20b_moe_2l_capture.pt.trace.json.gz"
REPLAY = FIXTURES / "vllm_gptoss20b_moe_2l_replay.pt.trace.json.gz"
MOE_KERNELS = ("_sum_bitmatrix_rows", "_combined_routing_memset", "_combined_routing_compute",
               "_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1_swiglu",
               "_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1", "_finalize_matmul_scatter_bf16")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    out = tmp_path_factory.mktemp("moe") / "gptoss.parquet"
    result = harvest.harvest([REPLAY], out, quiet=True, capture=[CAPTURE],
                             device_name="AMD Instinct MI300X")
    return result, shapetable.read(out), out


def _replay_moe_us() -> list[float]:
    """Per layer: the summed GPU time of its MoE kernels (the top-k kernel is the router's),
    straight from the replay's JSON: the graph's kernels in time order, one run per layer."""
    kernels = sorted((e for e in load_events(REPLAY) if e.get("cat") == "kernel"),
                     key=lambda e: e["ts"])
    per_layer, current = [], 0.0
    for e in kernels:
        if e["name"] in MOE_KERNELS:
            current += e["dur"]
            if e["name"] == "_finalize_matmul_scatter_bf16":   # the last kernel of a layer's MoE
                per_layer.append(current)
                current = 0.0
    return per_layer


def test_the_gptoss_moe_layer_is_one_row_with_its_shape_and_time(pair):
    result, df, _out = pair
    moe = row(df, family="moe")
    assert moe.op == "vllm::moe_forward" and moe.phase == "decode"
    # hidden_states [32, 3072] (2880 padded), router_logits [32, 32], SortTokens [32, 4], the
    # packed w1 [32, 1536, 5888] and w2 [32, 1472, 3072]
    assert (moe.m, moe.experts, moe.topk, moe.k, moe.n) == (32, 32, 4, 3072, 2944)
    assert moe["dtype"] == "mxfp4" and moe.batch == 1
    assert moe.calls_per_step == 2 and moe.calls == 2
    per_layer = _replay_moe_us()
    assert len(per_layer) == 2 and min(per_layer) > 0
    assert moe.us_per_call == pytest.approx(statistics.median(per_layer), rel=1e-9)
    assert set(moe.kernels.split("; ")) == set(MOE_KERNELS)
    assert pd.isna(moe.traced_compiled)          # a custom op the compiled graph calls as it is
    # the dense rows are still there, with no experts / topk
    router = row(df, op="aten::addmm", n=32, k=2880)
    assert router.calls_per_step == 2 and pd.isna(router.experts) and pd.isna(router.topk)


def test_no_moe_kernel_is_counted_twice_or_as_a_gemm(pair):
    result, df, _out = pair
    for r in df[df.family != "moe"].itertuples():
        assert not any(k in MOE_KERNELS or k == "_topk_forward" for k in r.kernels.split("; "))
    assert "_topk_forward" not in row(df, family="moe").kernels    # the router's top-k
    t = result.traces[0]
    in_rows = sum(c.gpu_us for c in t.calls)
    assert in_rows == pytest.approx(t.gpu_in_calls_us, rel=1e-9)
    assert t.gpu_in_calls_us + t.gpu_other_ops_us + t.gpu_unattributed_us == pytest.approx(
        t.gpu_total_us, rel=1e-9)


def test_the_moe_family_reads_the_row_and_refuses_mxfp4(pair):
    from tuner_kernels import get_family

    _result, df, _out = pair
    moe = row(df, family="moe")
    family = get_family("moe")
    assert family.shape_from_row(moe) is None    # its kernels run bf16 / fp16 weights
    as_bf16 = moe.copy()
    as_bf16["dtype"] = "bfloat16"
    assert family.shape_from_row(as_bf16) == {"m": 32, "experts": 32, "topk": 4, "hidden": 3072,
                                              "inter": 2944, "dtype": "bfloat16"}


def test_budget_gives_a_served_moe_row_its_family_floor(pair, tmp_path, capsys):
    from tuner_kernels import get_family
    from tuner.cli import main

    _result, df, _out = pair
    profile = load_profile("h200")
    judged = budget.compute(df, profile)
    mx = judged[judged.family == "moe"].iloc[0]
    assert math.isnan(mx.floor_us) and "moe family serves no such row" in mx.reason

    table = df.copy()
    table.loc[table.family == "moe", "dtype"] = "bfloat16"   # the same shape with bf16 weights
    shapes = shapetable.write(table, tmp_path / "bf16.parquet")
    assert main(["budget", str(shapes), "--device", "h200", "-o", str(tmp_path / "b.parquet")]) == 0
    out = capsys.readouterr().out
    assert "m=32 E=32 top4 hidden=3072 inter=2944" in out
    written = budget.read(tmp_path / "b.parquet")
    moe = written[written.family == "moe"].iloc[0]
    family = get_family("moe")
    shape = family.shape_from_row(moe)
    assert moe.bytes == family.bytes_moved(shape) and moe.flops == family.flops(shape)
    assert moe.floor_us == pytest.approx(budget.floor_us(moe.bytes, moe.flops, "bfloat16", profile))
    assert moe.floor_us > 0


def test_a_capture_without_the_packed_weights_gives_no_moe_row_and_says_why(tmp_path):
    """Without the weight views nothing gives the intermediate size: no row (never a guessed
    one), a note naming what is missing, and the MoE kernels are other ops, not a GEMM's."""
    trace = json.loads(gzip.open(CAPTURE).read())
    trace["traceEvents"] = [e for e in trace["traceEvents"] if not (
        e.get("name") == "aten::view" and (e.get("args") or {}).get("Input type", [""])[0]
        == "unsigned char")]
    capture = tmp_path / "no_views_capture.pt.trace.json.gz"
    with gzip.open(capture, "wt") as f:
        json.dump(trace, f)
    result = harvest.harvest([REPLAY], tmp_path / "t.parquet", quiet=True, capture=[capture],
                             device_name="AMD Instinct MI300X")
    df = result.table
    assert "moe" not in set(df.family) and "experts" not in df.columns
    notes = result.traces[0].notes
    assert any("2 MoE call(s) left out" in n and "vllm::moe_forward" in n
               and "give no inter, dtype" in n for n in notes), notes
    for r in df.itertuples():
        assert not any(k in MOE_KERNELS for k in r.kernels.split("; "))


def _op(name, ts, end, dims, types=()):
    return Op(name, 1, ts, end, None, dims, list(types), [], "moe")


def test_fused_experts_dims_give_the_whole_shape():
    """vLLM's and SGLang's fused-experts ops: hidden_states, w1 [E, 2 inter, hidden], w2 [E,
    hidden, inter], topk_weights, topk_ids (their fused_moe.py signatures)."""
    dims = [[8, 2048], [128, 1536, 2048], [128, 2048, 768], [8, 8], [8, 8], [], []]
    types = ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "float", "int"]
    for name in ("vllm::outplace_fused_experts", "sglang::inplace_fused_experts"):
        c, why = moe_call([_op(name, 0.0, 10.0, dims, types)], 0, [])
        assert why == "" and (c.m, c.experts, c.topk, c.k, c.n, c.dtype, c.family) == (
            8, 128, 8, 2048, 768, "bfloat16", "moe")


def test_moe_dims_that_do_not_give_a_shape_give_no_call():
    # the layer op alone: m, hidden and the router's E, but no top-k, weights or dtype
    alone = [_op("vllm::moe_forward", 0.0, 10.0, [[32, 3072], [32, 32], [], []])]
    c, why = moe_call(alone, 0, [])
    assert c is None and "give no topk, inter, dtype" in why
    # int4-packed (or non-gated) weights: w1 [E, 2 inter, hidden / 2] is not read as a shape
    packed = [[8, 2048], [128, 1536, 1024], [128, 2048, 384], [8, 8], [8, 8]]
    c, why = moe_call([_op("vllm::inplace_fused_experts", 0.0, 1.0, packed)], 0, [])
    assert c is None and "are not [E, 2 inter, hidden]" in why
    # two ops that disagree on the top-k
    ops = [_op("vllm::moe_forward", 0.0, 10.0, [[32, 3072], [32, 32]]),
           _op("SortTokens", 1.0, 2.0, [[32, 4], [32, 4], []]),
           _op("_moe_C::moe_align_block_size", 3.0, 4.0, [[32, 2], [], []])]
    c, why = moe_call(ops, 0, [1, 2])
    assert c is None and why == "topk 4 from SortTokens but 2 from _moe_C::moe_align_block_size"


def test_a_table_without_moe_columns_still_reads(tmp_path):
    """A ShapeTable written before the moe columns (or of a dense model) has no experts / topk:
    it reads as it was, and the moe family serves none of its rows."""
    from tuner_kernels import get_family

    table = pd.DataFrame([dict(op="aten::mm", family="gemm", phase="decode", m=4, n=896, k=896,
                               batch=1, dtype="bfloat16", layout="NT", calls=24, steps=1,
                               calls_per_step=24.0, us_per_call=4.0, step_us=1000.0,
                               step_gpu_us=500.0, share=0.1, kernels="k", source="s",
                               device="d")])
    back = shapetable.read(shapetable.write(table, tmp_path / "old.parquet"))
    assert "experts" not in back.columns and back.m.tolist() == [4]
    assert get_family("moe").shape_from_row(back.iloc[0]) is None


def test_moe_columns_round_trip(pair):
    _result, df, out = pair
    assert str(df.experts.dtype) == "Int64" and str(df.topk.dtype) == "Int64"
    again = shapetable.read(out)
    assert again.experts.tolist() == df.experts.tolist()


# the dims and types the CPU profiler records for tuner.serving's op in the tiny Qwen3-MoE decode
# step (tests/fixtures/ab/tiny_qwen3_moe.json at batch 2: E 8, top-2, hidden 64, inter 32)
TUNER_MOE_DIMS = [[2, 64], [8, 64, 64], [8, 64, 32], [2, 2], [2, 2], []]
TUNER_MOE_TYPES = ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "long int",
                   "c10::BFloat16", "Scalar"]


def test_tuner_moe_dims_give_the_whole_shape():
    """tuner.serving's op: x [m, hidden], w1 [E, 2 inter, hidden], w2 [E, hidden, inter],
    topk_ids [m, topk], topk_weights [m, topk], block."""
    c, why = moe_call([_op("tuner::moe", 0.0, 10.0, TUNER_MOE_DIMS, TUNER_MOE_TYPES)], 0, [])
    assert why == "" and (c.op, c.family, c.m, c.experts, c.topk, c.k, c.n, c.dtype) == (
        "tuner::moe", "moe", 2, 8, 2, 64, 32, "bfloat16")
    # 16 tokens at top-4 on 128 experts, hidden 2048, inter 768 (Qwen3-30B-A3B's experts)
    dims = [[16, 2048], [128, 1536, 2048], [128, 2048, 768], [16, 4], [16, 4], []]
    c, why = moe_call([_op("tuner::moe", 0.0, 1.0, dims, TUNER_MOE_TYPES)], 0, [])
    assert (c.m, c.experts, c.topk, c.k, c.n) == (16, 128, 4, 2048, 768)
    # topk_ids missing from its place (input 3): no shape, and the note names the signature
    c, why = moe_call([_op("tuner::moe", 0.0, 1.0, dims[:3], TUNER_MOE_TYPES)], 0, [])
    assert c is None and why.startswith("tuner::moe's dims are not x [m, hidden]")


def test_the_tuned_steps_tuner_moe_calls_harvest_as_moe_rows(tmp_path, monkeypatch):
    """The tiny Qwen3-MoE decode step profiled on the CPU (record_shapes) with and without
    tuner.serving routing its experts (an export of the m = 2 shape, the kernel under the
    Triton interpreter): the routed step gives one moe row of its 2 layers' calls; transformers'
    own grouped-mm experts give none: two aten::_grouped_mm calls a layer, whose dims hold
    m * topk, not m and the top-k apart."""
    pytest.importorskip("transformers")
    import torch
    from torch.profiler import ProfilerActivity, profile

    from test_serving import IDENTITY, write_export
    from tuner import runtime, serving
    from tuner.ab.harness import hf_factory, make_harness

    monkeypatch.setattr(runtime, "current_identity", lambda: dict(IDENTITY))
    monkeypatch.delenv("TUNER_EXPORT_DIR", raising=False)
    runtime.reset()
    shape = {"m": 2, "experts": 8, "topk": 2, "hidden": 64, "inter": 32, "dtype": "bfloat16"}
    write_export(tmp_path / "export", [("moe", shape)])
    harness = make_harness(hf_factory(Path(__file__).parent / "fixtures" / "ab"
                                      / "tiny_qwen3_moe.json"),
                           batch=2, prompt=4, steps=2, dtype=torch.bfloat16, device="cpu")
    traces = {}
    with torch.no_grad():
        harness.prefill()
        for arm in ("baseline", "tuned"):
            with (serving.installed(harness.model, export_dir=tmp_path / "export" / "nvidia-h200",
                                    families=("moe",)) if arm == "tuned"
                  else contextlib.nullcontext()):
                with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                    harness.decode()
            traces[arm] = tmp_path / f"{arm}.pt.trace.json"
            prof.export_chrome_trace(str(traces[arm]))
    runtime.reset()
    tuned = harvest.harvest([traces["tuned"]], quiet=True).table
    moe = row(tuned, family="moe")
    assert moe.op == "tuner::moe" and moe["dtype"] == "bfloat16" and moe.batch == 1
    assert (moe.m, moe.experts, moe.topk, moe.k, moe.n) == (2, 8, 2, 64, 32)
    assert moe.calls == 2 and moe.calls_per_step == 2    # one call per layer
    base = harvest.harvest([traces["baseline"]], quiet=True).table
    assert "moe" not in set(base.family)
    # read with the config's top-k (as tuner ab reads its arms), the grouped-mm pair is a moe
    # row of the same attribution key as the routed step's tuner::moe row: the A/B pairs them
    from tuner.shapetable import attribution_key

    with_topk = harvest.harvest([traces["baseline"]], quiet=True, topk=2).table
    grouped_row = row(with_topk, family="moe")
    assert attribution_key(grouped_row.to_dict()) == attribution_key(moe.to_dict())
    events = json.loads(traces["baseline"].read_text())["traceEvents"]
    grouped = [e for e in events if e.get("name") == "aten::_grouped_mm"]
    assert len(grouped) == 4    # up and down per layer: [m * topk, .] x [E, ., .], offsets [E]
    assert [e["args"]["Input Dims"][:3] for e in grouped[:2]] == [
        [[4, 64], [8, 64, 64], [8]], [[4, 32], [8, 32, 64], [8]]]


# ------------------------------------------------------- transformers' grouped-mm experts, --topk
# A tiny Qwen3-MoE (2 layers, hidden 64, 4 experts, top-2, expert intermediate 32) run on the CPU
# under torch.profiler (record_shapes, one ProfilerStep#N a forward): transformers' grouped-mm
# experts (its default) leave two aten::_grouped_mm calls a layer and no MoE op. Batch 3, prompt
# 5: the prefill has m = 15 tokens (30 rows), each decode step m = 3 (6 rows).
GROUPED = dict(layers=2, hidden=64, experts=4, topk=2, inter=32, batch=3, prompt=5, decode=2)


def _tiny_qwen3_moe():
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    g = GROUPED
    config = Qwen3MoeConfig(vocab_size=128, hidden_size=g["hidden"], intermediate_size=64,
                            moe_intermediate_size=g["inter"], num_hidden_layers=g["layers"],
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                            num_experts=g["experts"], num_experts_per_tok=g["topk"],
                            decoder_sparse_step=1, max_position_embeddings=64)
    torch.manual_seed(0)
    return Qwen3MoeForCausalLM(config).to(torch.bfloat16).eval()


def _cache_kwargs(model, out) -> dict:
    """The KV cache of `out` as the next forward takes it (`cache` from transformers ~5.2x,
    `past_key_values` before)."""
    import inspect

    if "cache" in inspect.signature(model.forward).parameters:
        return {"cache": out["cache"] if "cache" in out else out.past_key_values}
    return {"past_key_values": out.past_key_values}


@pytest.fixture(scope="module")
def grouped_trace(tmp_path_factory):
    """The CPU trace of one prefill and GROUPED['decode'] decode steps of the tiny Qwen3-MoE."""
    pytest.importorskip("transformers")
    import torch
    from torch.profiler import ProfilerAction, ProfilerActivity, profile

    model = _tiny_qwen3_moe()
    ids = torch.randint(0, 128, (GROUPED["batch"], GROUPED["prompt"]),
                        generator=torch.Generator().manual_seed(1))
    path = tmp_path_factory.mktemp("grouped") / "tiny_qwen3_moe.pt.trace.json"
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                                  schedule=lambda _step: ProfilerAction.RECORD) as prof:
        out = model(ids, use_cache=True)
        for _ in range(GROUPED["decode"]):
            prof.step()
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            out = model(nxt, use_cache=True, **_cache_kwargs(model, out))
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    grouped = [e for e in events if e.get("name") == "aten::_grouped_mm"]
    if not grouped:
        pytest.skip("this transformers / torch runs no aten::_grouped_mm on the CPU")
    return path


def _linear_ms(df) -> set:
    """The m of the table's GEMM rows: the model's linears run on all of a step's tokens."""
    return set(df[df.family == "gemm"].m)


def test_topk_reads_each_blocks_grouped_mm_pair_as_one_moe_call(grouped_trace):
    g = GROUPED
    events = json.loads(grouped_trace.read_text())["traceEvents"]
    dims = [e["args"]["Input Dims"][:3] for e in events if e.get("name") == "aten::_grouped_mm"]
    steps = 1 + g["decode"]
    assert len(dims) == 2 * g["layers"] * steps            # up and down, per layer and step
    rows = g["batch"] * g["prompt"] * g["topk"]
    assert dims[:2] == [[[rows, g["hidden"]], [g["experts"], g["hidden"], 2 * g["inter"]],
                         [g["experts"]]],
                        [[rows, g["inter"]], [g["experts"], g["inter"], g["hidden"]],
                         [g["experts"]]]]

    result = harvest.harvest([grouped_trace], quiet=True, topk=g["topk"])
    df = result.table
    moe = df[df.family == "moe"]
    assert sorted(moe.phase) == ["decode", "prefill"]
    for phase, m, n_steps in (("prefill", g["batch"] * g["prompt"], 1),
                              ("decode", g["batch"], g["decode"])):
        r = row(df, family="moe", phase=phase)
        assert r.op == "aten::_grouped_mm" and r["dtype"] == "bfloat16" and r.batch == 1
        assert (r.m, r.experts, r.topk, r.k, r.n) == (m, g["experts"], g["topk"], g["hidden"],
                                                      g["inter"])
        assert r.calls == g["layers"] * n_steps and r.calls_per_step == g["layers"]
        assert r.layout == ""
    # the moe family reads the row as its shape
    from tuner_kernels import get_family

    assert get_family("moe").shape_from_row(row(df, family="moe", phase="decode")) == {
        "m": g["batch"], "experts": g["experts"], "topk": g["topk"], "hidden": g["hidden"],
        "inter": g["inter"], "dtype": "bfloat16"}
    # the per-expert aten::mm the CPU runs inside each grouped matmul are no GEMM rows: every
    # GEMM row is a linear of all the step's tokens
    assert _linear_ms(df) == {g["batch"] * g["prompt"], g["batch"]}
    notes = result.traces[0].notes
    n_grouped = 2 * g["layers"] * steps
    assert (f"--topk 2: {n_grouped} aten::_grouped_mm call(s) read as {n_grouped // 2} moe "
            "call(s) (a block's up and down projections each, m = rows / 2)") in notes
    assert not any("left out" in n for n in notes), notes


def test_without_topk_grouped_mm_gives_no_row_and_a_hint(grouped_trace):
    g = GROUPED
    result = harvest.harvest([grouped_trace], quiet=True)
    df = result.table
    assert "moe" not in set(df.family) and "experts" not in df.columns
    assert not (df.op == "aten::_grouped_mm").any()
    # nor are the per-expert matmuls inside the grouped ones read as GEMM rows of the routing's
    # token counts
    assert _linear_ms(df) == {g["batch"] * g["prompt"], g["batch"]}
    n_grouped = 2 * g["layers"] * (1 + g["decode"])
    assert any(n.startswith(f"{n_grouped} aten::_grouped_mm call(s) (transformers' grouped-mm "
                            "MoE experts) give no row") and "pass --topk K" in n
               for n in result.traces[0].notes), result.traces[0].notes


def test_rows_that_do_not_divide_by_the_topk_give_the_note_and_no_row(grouped_trace):
    g = GROUPED
    # --topk 4: the prefill's 30 rows and the decode's 6 do not divide by 4
    result = harvest.harvest([grouped_trace], quiet=True, topk=4)
    df = result.table
    assert "moe" not in set(df.family)
    assert _linear_ms(df) == {g["batch"] * g["prompt"], g["batch"]}
    notes = result.traces[0].notes
    prefill = [n for n in notes if "30 rows (m * topk)" in n]
    decode = [n for n in notes if "6 rows (m * topk)" in n]
    # each pair is left out whole (its up and down), named by the up projection's dims
    assert prefill == ["--topk 4: 4 aten::_grouped_mm call(s) left out, no moe row: 30 rows "
                       "(m * topk) of [30, 64] x [4, 64, 64] do not divide by the top-k 4"]
    assert decode == ["--topk 4: 8 aten::_grouped_mm call(s) left out, no moe row: 6 rows "
                      "(m * topk) of [6, 64] x [4, 64, 64] do not divide by the top-k 4"]
    assert not any("read as" in n for n in notes)
    # --topk 8: more than the 4 experts (6 rows do not divide, 30 neither): no row either way
    assert "moe" not in set(harvest.harvest([grouped_trace], quiet=True, topk=8).table.family)


def test_topk_on_a_trace_without_grouped_mm_says_so(tmp_path):
    result = harvest.harvest([Path("shapes/examples/qwen25_05b_b4_decode.pt.trace.json.gz")],
                             quiet=True, topk=2)
    assert "moe" not in set(result.table.family)
    assert ("--topk 2: no aten::_grouped_mm call (transformers' grouped-mm experts) in the "
            "trace: nothing read as a moe call") in result.traces[0].notes


def test_the_pairs_kernels_are_the_moe_calls_time(grouped_trace, tmp_path):
    """The trace as a GPU would record it (no per-expert mm inside the grouped matmuls, one
    kernel launched inside each): both kernels of a block are its moe call's time, in no GEMM
    row and not unattributed."""
    d = json.loads(grouped_trace.read_text())
    d["deviceProperties"] = [{"id": 0, "name": "NVIDIA H200"}]
    events = d["traceEvents"]
    grouped = [e for e in events if e.get("name") == "aten::_grouped_mm"]

    def inside(e):
        return any(g["tid"] == e.get("tid") and g["ts"] <= e["ts"]
                   and e["ts"] + e.get("dur", 0) <= g["ts"] + g["dur"] for g in grouped)

    kept = [e for e in events if not (e.get("name") == "aten::mm" and inside(e))]
    for j, g in enumerate(grouped):
        up = "hidden" if g["args"]["Input Dims"][0][1] == GROUPED["hidden"] else "inter"
        mid, corr = g["ts"] + g["dur"] / 2, 900000 + j
        kept.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                     "pid": g["pid"], "tid": g["tid"], "ts": mid, "dur": 1.0,
                     "args": {"correlation": corr}})
        kept.append({"ph": "X", "cat": "kernel", "name": f"grouped_gemm_{up}", "pid": 0,
                     "tid": 7, "ts": mid + 2.0, "dur": 10.0 if up == "hidden" else 6.0,
                     "args": {"correlation": corr, "device": 0, "stream": 7}})
    d["traceEvents"] = kept
    path = tmp_path / "as_gpu.pt.trace.json"
    path.write_text(json.dumps(d))
    result = harvest.harvest([path], quiet=True, topk=GROUPED["topk"])
    df = result.table
    for phase in ("prefill", "decode"):
        r = row(df, family="moe", phase=phase)
        assert r.us_per_call == pytest.approx(16.0)
        assert set(r.kernels.split("; ")) == {"grouped_gemm_hidden", "grouped_gemm_inter"}
    for r in df[df.family != "moe"].itertuples():
        assert "grouped_gemm" not in str(r.kernels)
    t = result.traces[0]
    assert t.gpu_in_calls_us == pytest.approx(16.0 * len(grouped) / 2)
    assert t.gpu_unattributed_us == pytest.approx(0.0)


def _grouped_op(ts, a, b, tid=1, dtype="c10::BFloat16"):
    return Op("aten::_grouped_mm", tid, ts, ts + 1.0, None, [a, b, [b[0]], [], []],
              [dtype, dtype, "int"], [], "grouped_mm")


def test_grouped_mm_pairs_by_thread_and_order():
    """A pair is an up [R, h] x [E, h, 2i] followed on its thread by a down [R, i] x [E, i, h];
    a lone grouped matmul is left out with the reason and the next one may start a pair."""
    from tuner.harvest.moe import grouped_mm_calls

    up, down = ([8, 64], [4, 64, 64]), ([8, 32], [4, 32, 64])
    ops = [_grouped_op(0.0, *down),            # a down with no up before it
           _grouped_op(1.0, *up), _grouped_op(2.0, *down),
           _grouped_op(1.5, *up, tid=2), _grouped_op(2.5, *down, tid=2, dtype="float"),
           _grouped_op(3.0, [8, 64], [4, 64, 48])]    # non-gated: its n is no 2 x inter
    pairs, problems = grouped_mm_calls(ops, list(range(len(ops))), 2)
    assert [(u, d) for u, d, _ in pairs] == [(1, 2)]
    c = pairs[0][2]
    assert (c.family, c.m, c.experts, c.topk, c.k, c.n, c.dtype) == (
        "moe", 4, 4, 2, 64, 32, "bfloat16")
    assert len(problems) == 4
    # thread 1 (the lone down, the non-gated one last on it), then thread 2's pair, both left out
    assert problems[0].startswith("[8, 32] x [4, 32, 64] is not followed by the down")
    assert problems[1].startswith("[8, 64] x [4, 64, 48] is not followed by the down")
    assert problems[1].endswith("next nothing")
    assert problems[2:] == ["the up and down weights differ in dtype (bfloat16, float32)"] * 2


def test_topk_below_one_is_one_error_line(grouped_trace, capsys):
    from tuner.cli import main
    from tuner.errors import TunerError

    for bad in (0, -1):
        with pytest.raises(TunerError, match=r"--topk must be an integer >= 1"):
            harvest.harvest([grouped_trace], quiet=True, topk=bad)
    with pytest.raises(TunerError, match=r"--topk must be"):
        harvest.read_trace(grouped_trace, topk=0)
    assert main(["run", str(grouped_trace), "--topk", "0"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "tuner: error: --topk must be an integer >= 1 (the model's num_experts_per_tok), got 0"]
def test_harvest_cli_topk(grouped_trace, tmp_path, capsys):
    from harvest_helpers import run_cli

    rc, out, err = run_cli(capsys, grouped_trace, "--topk", "0", "-o", tmp_path / "t.parquet")
    assert rc == 2 and err.strip().splitlines() == [
        "tuner: error: --topk must be an integer >= 1 (the model's num_experts_per_tok), got 0"]
    assert not (tmp_path / "t.parquet").exists()
    rc, out, err = run_cli(capsys, grouped_trace, "--topk", "2", "-o", tmp_path / "t.parquet")
    assert rc == 0 and "--topk 2: 12 aten::_grouped_mm call(s) read as 6 moe call(s)" in err
    df = shapetable.read(tmp_path / "t.parquet")
    assert sorted(df[df.family == "moe"].m) == [3, 15]


def test_tuner_ab_reads_the_top_k_its_traced_step_needs_from_the_config():
    """`tuner ab --trace-only` prints the harvest command of its traces: with --topk K for a MoE
    config (K = num_experts_per_tok), without it for a dense one or a harness module."""
    from tuner import ab

    fixtures = Path(__file__).resolve().parent / "fixtures" / "ab"
    assert ab.moe_topk(("hf", str(fixtures / "tiny_qwen3_moe.json"))) == 2
    assert ab._topk_flag(("hf", str(fixtures / "tiny_qwen3_moe.json"))) == " --topk 2"
    assert ab.moe_topk(("hf", str(fixtures / "tiny_llama_gqa.json"))) is None
    assert ab._topk_flag(("module", "shapes/examples/qwen_live.py:QwenDecode")) == ""
