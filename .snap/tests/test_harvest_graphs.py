"""tuner harvest on CUDA/HIP-graph capture + replay pairs: the real vLLM pair (MI300X, FULL graph,
../shared/traces), CUDA pairs (CUDA_PAIRS), vLLM PIECEWISE and SGLang pairs, directory pairing,
--watch with capture_traces/, and pairs that do not belong together.

Expected numbers are recomputed from the raw JSON with a deliberately plain join (the i-th
launch inside the capture window <-> the i-th kernel of the graph launch), not with
tuner.harvest's code.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tuner import harvest, shapetable
from tuner.errors import TunerError
from harvest_helpers import load_events, row, run_cli

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "traces"
VLLM_CAPTURE = "tracelens_mi300x_vllm_gptoss20b_decode_bs32_full_capture.pt.trace.json.gz"
VLLM_REPLAY = "tracelens_mi300x_vllm_gptoss20b_decode_bs32_full_replay.json.gz"

# CUDA capture + replay pairs: <name>_capture.pt.trace.json.gz, <name>_replay.pt.trace.json.gz
# and <name>.meta.json in tests/fixtures/traces. "cuda_full" is synthetic (make_synthetic.py);
# the H200 pairs of scripts/gpu/capture_pairs.py replace it once captured.
CUDA_PAIRS = ["cuda_full", "h200_decoder_full", "h200_decoder_full_bias_vllm"]


def pair(name: str) -> tuple[Path, Path, dict]:
    return (FIXTURES / f"{name}_capture.pt.trace.json.gz",
            FIXTURES / f"{name}_replay.pt.trace.json.gz",
            json.loads((FIXTURES / f"{name}.meta.json").read_text()))


# ------------------------------------------------------------------ the plain join, for the tests
GEMM_NAMES = ("aten::mm", "aten::addmm")


def _mnk(op: dict) -> tuple:
    dims = op["args"]["Input Dims"]
    a, b = (dims[1], dims[2]) if op["name"] == "aten::addmm" else (dims[0], dims[1])
    return a[0], b[1], a[1]


def plain_join(capture: Path, replay: Path) -> tuple[dict, float, float]:
    """({(m, n, k): [GPU us of each call]}, GPU us of the graph kernels, all GPU us) for a pair
    with one capture window: the i-th launch in the window is the i-th kernel the graph runs;
    a launch belongs to the GEMM op (mm/addmm) that contains it."""
    cap, rep = load_events(capture), load_events(replay)
    runtime = [e for e in cap if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    launches = sorted((e for e in runtime if re.search(
        r"LaunchKernel|^cuLaunch|^(cuda|hip)Mem(cpy|set)", e["name"])), key=lambda e: e["ts"])
    marks = [e["ts"] for e in runtime if "BeginCapture" in e["name"] or "EndCapture" in e["name"]]
    if marks:
        begin, end = min(marks), max(marks)
    else:             # no capture markers: the captured launches are those that ran nothing
        ran = {e["args"].get("correlation") for e in cap
               if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")}
        unrun = [e["ts"] for e in launches if e["args"]["correlation"] not in ran]
        begin, end = min(unrun), max(unrun)
    launches = [e for e in launches if begin <= e["ts"] <= end]
    gemms = [e for e in cap if e.get("cat") == "cpu_op" and e["name"] in GEMM_NAMES
             and begin <= e["ts"] <= end]
    gpu = [e for e in rep if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")]
    graph_launches = [e["args"]["correlation"] for e in rep
                      if e.get("cat") in ("cuda_runtime", "cuda_driver")
                      and "GraphLaunch" in e["name"]]
    per_call: dict = {}
    graph_us = 0.0
    for corr in graph_launches:
        kernels = sorted((e for e in gpu if e["args"].get("correlation") == corr),
                         key=lambda e: e["ts"])
        assert len(kernels) == len(launches)
        us_of_op: dict = {}          # External id of the GEMM op -> its kernels' us this launch
        for launch, kernel in zip(launches, kernels):
            graph_us += kernel["dur"]
            holders = [g for g in gemms if g["ts"] <= launch["ts"] <= g["ts"] + g["dur"]]
            if holders:
                op = max(holders, key=lambda g: g["ts"])      # the innermost
                ext = op["args"]["External id"]
                us_of_op[ext] = us_of_op.get(ext, 0.0) + kernel["dur"]
        ops = {g["args"]["External id"]: g for g in gemms}
        for ext, us in us_of_op.items():
            per_call.setdefault(_mnk(ops[ext]), []).append(us)
    return per_call, graph_us, sum(e["dur"] for e in gpu)


# ------------------------------------------------------------------------- the real vLLM pair
@pytest.fixture(scope="module")
def vllm_pair(shared_traces, tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm") / "vllm.parquet"
    result = harvest.harvest([shared_traces / VLLM_REPLAY], out, quiet=True,
                             capture=[shared_traces / VLLM_CAPTURE])
    return result, shapetable.read(out)


def test_vllm_pair_decode_gemms_at_m32(shared_traces, vllm_pair):
    """qkv 2880 -> 5120, o 4096 -> 2880, router 2880 -> 32: 24 calls per decode step each (24
    layers), their GPU time the replay's kernels at the capture's launch positions."""
    _, df = vllm_pair
    per_call, _, _ = plain_join(shared_traces / VLLM_CAPTURE, shared_traces / VLLM_REPLAY)
    assert sorted(per_call) == [(32, 32, 2880), (32, 2880, 4096), (32, 5120, 2880)]
    assert set(df.phase) == {"decode"} and set(df.steps) == {1}
    for (m, n, k), us in per_call.items():
        r = row(df, op="aten::addmm", m=m, n=n, k=k)
        assert r.calls_per_step == 24 == len(us)
        assert r.us_per_call == pytest.approx(statistics.median(us))
        assert r.us_per_call > 0 and r.kernels.startswith("Cijk_")    # Tensile GEMMs
        assert (r["dtype"], r.layout, r.batch) == ("bfloat16", "NT", 1)
    # the lm_head runs eagerly after the graph: its own kernel, through the External id
    events = load_events(shared_traces / VLLM_REPLAY)
    mm = next(e for e in events if e.get("name") == "aten::mm")
    head_us = sum(e["dur"] for e in events if e.get("cat") == "kernel"
                  and e["args"].get("External id") == mm["args"]["External id"])
    head = row(df, op="aten::mm", m=32, n=201088, k=2880)
    assert head.calls_per_step == 1 and head.us_per_call == pytest.approx(head_us)


def test_vllm_pair_attention_row(vllm_pair):
    """vllm::unified_attention_with_output: q [32 tokens, 64 heads, 64], k [32, 8, 64] (the KV
    cache is not an input): decode, so q_len 1 and batch 32; kv_len from the annotation
    generation_32(sq32sk55086...): 55086 KV tokens over 32 requests."""
    _, df = vllm_pair
    att = row(df, family="attention")
    assert att.op == "vllm::unified_attention_with_output" and att.calls_per_step == 24
    assert (att.batch, att.heads, att.kv_heads, att.q_len, att.head_dim) == (32, 64, 8, 1, 64)
    assert att.kv_len == round(55086 / 32) == att.n
    import tuner_kernels.attention as family

    assert family.shape_from_row(att) == {"batch": 32, "heads": 64, "kv_heads": 8,
                                          "kv_len": 1721, "head_dim": 64, "dtype": "bfloat16"}


def test_vllm_pair_marks_only_the_calls_its_compiled_graphs_ran(vllm_pair):
    """vLLM compiles the layers' linears into Inductor graphs (25 "## Call CompiledFxGraph"
    ranges in the capture) and runs attention, a custom op, and the lm_head outside them: only
    the linears' rows are traced_compiled, so rank times only their baseline compiled. The MoE
    layers (vllm::moe_forward, a custom op called inside the graphs) are not marked."""
    from tuner_kernels import get_family
    from tuner.spaces import with_row_measure_keys

    result, df = vllm_pair
    marked = {(r.op, int(r.m), int(r.n), int(r.k)): r.traced_compiled for r in df.itertuples()}
    assert marked[("aten::addmm", 32, 5120, 2880)] == 1 and marked[("aten::addmm", 32, 2880, 4096)] == 1
    assert marked[("aten::addmm", 32, 32, 2880)] == 1
    assert pd.isna(marked[("aten::mm", 32, 201088, 2880)])   # the lm_head, eager after the graph
    att = row(df, family="attention")
    assert pd.isna(att.traced_compiled)
    assert "baseline_compiled" not in with_row_measure_keys(
        get_family("attention").shape_from_row(att), att)
    moe = row(df, family="moe")    # a custom op the graph calls as it is: it ran eager
    assert pd.isna(moe.traced_compiled)
    assert any("72 of 121 calls ran inside Inductor's compiled graphs" in n and "49 ran eager" in n
               for n in result.traces[0].notes)


def test_vllm_pair_prints_the_joined_share(shared_traces, capsys, tmp_path):
    rc, out, err = run_cli(capsys, shared_traces / VLLM_REPLAY, "--capture",
                           shared_traces / VLLM_CAPTURE, "-o", tmp_path / "v.parquet",
                           "--device-name", "AMD Instinct MI300X")
    assert rc == 0, err
    _, graph_us, total_us = plain_join(shared_traces / VLLM_CAPTURE, shared_traces / VLLM_REPLAY)
    share = 100 * graph_us / total_us
    assert 90 < share < 100
    assert (f"graph replay: 1 of 1 graph launches joined with the capture ({VLLM_CAPTURE}: "
            f"capture_32_FULL): 421 kernels, {share:.1f}% of the replay's GPU time") in out
    assert "0.0% unattributed" in out and "has no owning op" not in err
    assert "launch-bound" not in err          # a graph replay is graph-captured already
    assert set(shapetable.read(tmp_path / "v.parquet").device) == {"AMD Instinct MI300X"}
    assert "names no GPU" not in err


def test_vllm_pair_unknown_device_is_said_once(shared_traces, vllm_pair, capsys):
    result, df = vllm_pair
    assert set(df.device) == {"unknown"} and not result.traces[0].device_known
    harvest.report(result)
    err = capsys.readouterr().err
    assert err.count("names no GPU") == 1 and "--device-name" in err


def test_vllm_replay_alone_says_to_pass_the_capture(shared_traces, capsys, tmp_path):
    rc, out, err = run_cli(capsys, shared_traces / VLLM_REPLAY, "-o", tmp_path / "r.parquet")
    assert rc == 0 and "(421 kernels) has no owning op" in err and "--capture" in err


def test_vllm_capture_alone_says_what_it_is(shared_traces, capsys, tmp_path):
    rc, out, err = run_cli(capsys, shared_traces / VLLM_CAPTURE, "-o", tmp_path / "c.parquet")
    assert rc == 0 and "holds 1 CUDA/HIP-graph capture" in err and "--capture" in err


def test_directory_with_capture_traces_is_paired(shared_traces, tmp_path, capsys, vllm_pair):
    d = tmp_path / "vllm_profile"
    (d / "capture_traces").mkdir(parents=True)
    shutil.copy(shared_traces / VLLM_REPLAY, d / "rank-0.replay.pt.trace.json.gz")
    shutil.copy(shared_traces / VLLM_CAPTURE, d / "capture_traces" / "rank-0.capture.json.gz")
    rc, out, err = run_cli(capsys, d, "-o", tmp_path / "d.parquet")
    assert rc == 0 and "pairing 1 trace(s) with the 1 graph capture trace(s)" in err
    paired = shapetable.read(tmp_path / "d.parquet")
    _, explicit = vllm_pair
    cols = ["op", "m", "n", "k", "calls_per_step", "us_per_call"]
    assert paired[cols].equals(explicit[cols])


def test_pairs_that_do_not_belong_together_are_refused(shared_traces, capsys, tmp_path):
    capture, _, _ = pair("cuda_full")
    rc, out, err = run_cli(capsys, shared_traces / VLLM_REPLAY, "--capture", capture,
                           "-o", tmp_path / "x.parquet")
    assert rc == 2 and err.startswith("tuner: error: ") and err.count("\n") == 1
    assert "do not belong together" in err and not (tmp_path / "x.parquet").exists()
    rc, _, err = run_cli(capsys, shared_traces / VLLM_REPLAY, "--capture",
                         shared_traces / VLLM_REPLAY)
    assert rc == 2 and "not a capture trace" in err


# ---------------------------------------------------------------------------------- CUDA pairs
@pytest.mark.parametrize("name", CUDA_PAIRS)
def test_cuda_pair_gemm_rows(name, capsys, tmp_path):
    """CUDA: the capture's launches name no kernel; the launch count and kinds join them."""
    capture, replay, meta = pair(name)
    rc, out, err = run_cli(capsys, replay, "--capture", capture, "-o", tmp_path / "t.parquet")
    assert rc == 0, err
    df = shapetable.read(tmp_path / "t.parquet")
    per_call, graph_us, total_us = plain_join(capture, replay)
    decode = df[df.phase == "decode"]
    assert set(decode.steps) == {meta["steps"]}
    for m, n, k, calls_per_step in meta["gemms"]:
        r = row(decode, family="gemm", m=m, n=n, k=k)
        assert r.calls_per_step == calls_per_step
        if (m, n, k) in per_call:                 # in the graph (else eager, e.g. the lm_head)
            assert len(per_call[(m, n, k)]) == calls_per_step * meta["steps"]
            assert r.us_per_call == pytest.approx(statistics.median(per_call[(m, n, k)]))
    att = meta.get("attention")
    if att:
        a = row(decode, family="attention")
        assert a.calls_per_step == att["calls_per_step"]
        for key in ("batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim"):
            assert a[key] == att[key], key
    share = 100 * graph_us / total_us
    assert "of the replay's GPU time" in out and f"{share:.1f}%" in out
    assert "has no owning op" not in err


# -------------------------------------------------------------------- vLLM PIECEWISE, SGLang FULL
def test_vllm_piecewise_pieces_and_eager_attention(capsys, tmp_path):
    """make_synthetic.py: 3 layers in 4 graph pieces, captured at batch 16 and 8; the replay's
    steps run 8 tokens, so the batch-8 pieces are joined (the two middle pieces are the same
    graph), and the attention between the pieces is eager."""
    capture, replay, meta = pair("vllm_piecewise")
    rc, out, err = run_cli(capsys, replay, "--capture", capture, "-o", tmp_path / "p.parquet")
    assert rc == 0, err
    assert "12 of 12 graph launches joined" in out and "capture_8_PIECEWISE x12" in out
    df = shapetable.read(tmp_path / "p.parquet")
    assert set(df.phase) == {"decode"} and set(df.steps) == {3}
    # kernel us in make_synthetic.py: base + 0.2 * step, so the median is base + 0.2
    for (m, n, k, cps), base in zip(meta["gemms"], (6.0, 4.0, 9.0, 8.0)):
        r = row(df, family="gemm", m=m, n=n, k=k)
        assert r.calls_per_step == cps and r.us_per_call == pytest.approx(base + 0.2)
    att = df[df.family == "attention"]
    assert sorted(att.kv_len) == meta["attention"]["kv_lens"]    # one per step's annotation
    assert att.calls_per_step.sum() == meta["attention"]["calls_per_step"]
    assert set(att.batch) == {8} and set(att.q_len) == {1} and set(att.kv_heads) == {2}
    assert sorted(att.us_per_call) == [12.0, 13.0, 14.0]          # eager: 12 + step


def test_sglang_full_graph_with_paged_attention(capsys, tmp_path):
    capture, replay, meta = pair("sglang_full")
    rc, out, err = run_cli(capsys, replay, "--capture", capture, "-o", tmp_path / "s.parquet")
    assert rc == 0, err
    assert "steps from SGLang step[...] annotations: decode 4" in out
    df = shapetable.read(tmp_path / "s.parquet")
    for m, n, k, cps in meta["gemms"]:
        assert row(df, family="gemm", m=m, n=n, k=k).calls_per_step == cps
    a = row(df, family="attention")
    att = meta["attention"]
    assert (a.batch, a.heads, a.kv_heads, a.q_len, a.head_dim) == (
        att["batch"], att["heads"], att["kv_heads"], att["q_len"], att["head_dim"])
    assert pd.isna(a.kv_len) and a.calls_per_step == att["calls_per_step"]   # dims do not say
    assert a.us_per_call == pytest.approx(7.0 + 0.05 * 1.5)      # median of 7 + 0.05 * step


def test_ambiguous_graphs_are_not_joined(tmp_path):
    """The PIECEWISE replay without its step annotations: the pieces of batch 16 and 8 cannot
    be told apart, so no launch is joined and the pair is refused."""
    capture, replay, _ = pair("vllm_piecewise")
    trace = json.loads(gzip.open(replay).read())
    trace["traceEvents"] = [e for e in trace["traceEvents"]
                            if not str(e.get("name", "")).startswith("execute_")]
    bare = tmp_path / "bare.json.gz"
    with gzip.open(bare, "wt") as f:
        json.dump(trace, f)
    with pytest.raises(TunerError, match="different captured graphs"):
        harvest.harvest([bare], capture=[capture], quiet=True)


# ---------------------------------------------------------------------------------- --watch
def test_watch_joins_replays_with_captures_that_arrive_later(tmp_path):
    d, out = tmp_path / "prof", tmp_path / "merged.parquet"
    d.mkdir()
    capture, replay, meta = pair("cuda_full")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    proc = subprocess.Popen([sys.executable, "-m", "tuner.cli", "harvest", "--watch", str(d),
                             "-o", str(out), "--interval", "0.2"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def wait_for(check):
        deadline = time.time() + 30
        while time.time() < deadline and proc.poll() is None:
            if out.exists() and check(shapetable.read(out)):
                return True
            time.sleep(0.2)
        return False

    try:
        shutil.copy(replay, d / "replay.pt.trace.json.gz")          # no capture yet
        assert wait_for(lambda df: len(df) == 1)                      # only the eager lm_head
        (d / "capture_traces").mkdir()
        shutil.copy(capture, d / "capture_traces" / "capture.pt.trace.json.gz")
        assert wait_for(lambda df: len(df) == len(meta["gemms"]) + 1), "capture never joined"
    finally:
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "Traceback" not in stderr, stderr
    assert "read the graph capture capture.pt.trace.json.gz (1 graph(s))" in stderr


def test_live_graph_needs_a_gpu(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: scripts/gpu/capture_pairs.py runs --live --graph")
    rc, _, err = run_cli(capsys, "--live", f"{FIXTURES / 'tiny_decoder.py'}:TinyDecoder",
                         "--steps", "2", "--graph")
    assert rc == 2 and "needs a CUDA or ROCm GPU" in err and err.count("\n") == 1
    rc, _, err = run_cli(capsys, FIXTURES / "cuda_full_replay.pt.trace.json.gz", "--graph")
    assert rc == 2 and "--graph goes with --live" in err


def test_a_torch_compiled_step_harvests_as_its_linears_and_attention():
    # Qwen3-8B-shaped, batch 1, torch.compile (inductor) before the graph capture, on the H200
    # (`tuner ab --compile --trace-only`, 2026-12-01). Inductor names its fused elementwise
    # kernels after the ops they fused ("triton_poi_fused__scaled_dot_product_cudnn_attention_
    # _to_copy_..."): those are other kernels, not attention calls (they once made every row of
    # this step an attention-led "prefill")
    capture = FIXTURES / "h200_qwen3_8b_compiled_b1_capture.pt.trace.json.gz"
    replay = FIXTURES / "h200_qwen3_8b_compiled_b1_replay.pt.trace.json.gz"
    table = harvest.harvest([replay], capture=[capture], quiet=True).table
    assert set(table["phase"]) == {"decode"}
    linears = table[table["family"] == "gemm"]
    got = {(int(r.m), int(r.n), int(r.k)): float(r.calls_per_step) for r in linears.itertuples()}
    assert got[(1, 12288, 4096)] == 72 and got[(1, 4096, 12288)] == 36
    assert got[(1, 4096, 4096)] == 72 and got[(1, 1024, 4096)] == 72
    attention = table[table["family"] == "attention"]
    assert len(attention) == 1 and int(attention.iloc[0]["calls_per_step"]) == 36
    assert not any(str(op).startswith("triton_") for op in table["op"])
    assert (linears["us_per_call"] > 0).all()


def test_a_torch_compiled_steps_rows_say_so_and_an_eager_steps_do_not(tmp_path):
    """Inductor's kernels in a trace (1815 in this compiled Qwen3-8B step) mark its rows
    traced_compiled = 1, with a note; the planner then measures them with baseline_compiled, so
    rank times the baseline as that step runs it. An eager step's table has no such column."""
    from tuner_kernels import get_family
    from tuner import shapetable
    from tuner.spaces import check_shape, served_shape, with_row_measure_keys

    capture = FIXTURES / "h200_qwen3_8b_compiled_b1_capture.pt.trace.json.gz"
    replay = FIXTURES / "h200_qwen3_8b_compiled_b1_replay.pt.trace.json.gz"
    result = harvest.harvest([replay], capture=[capture], quiet=True)
    table = result.table
    assert (table["traced_compiled"] == 1).all()
    assert result.traces[0].compiled_kernels == 1815
    # the whole step is one Inductor graph (one "## Call CompiledFxGraph" range in the capture)
    assert any("1450 of 1450 calls ran inside Inductor's compiled graphs" in n
               for n in result.traces[0].notes), result.traces[0].notes
    gemm = get_family("gemm")
    row = table[(table["family"] == "gemm") & (table["n"] == 12288)].iloc[0]
    shape = with_row_measure_keys(gemm.shape_from_row(row), row)
    assert shape is None  # m = 1 is gemv's
    gemv = get_family("gemv")
    shape = with_row_measure_keys(gemv.shape_from_row(row), row)
    assert shape["baseline_compiled"] == 1 and check_shape("gemv", shape) == ""
    assert "baseline_compiled" not in served_shape("gemv", shape)
    assert gemv.shape_key(shape) == gemv.shape_key(served_shape("gemv", shape))
    assert "not 1" in check_shape("gemv", dict(shape, baseline_compiled=2))

    eager = harvest.harvest([FIXTURES / "h200_decoder_full_replay.pt.trace.json.gz"],
                            capture=[FIXTURES / "h200_decoder_full_capture.pt.trace.json.gz"],
                            quiet=True)
    assert "traced_compiled" not in eager.table.columns
    for _, row in eager.table.iterrows():
        shape = with_row_measure_keys(gemv.shape_from_row(row), row)
        assert shape is None or "baseline_compiled" not in shape
    # the column survives a ShapeTable write and read
    back = shapetable.read(shapetable.write(table, tmp_path / "shapes.parquet"))
    assert (back["traced_compiled"] == 1).all()


def test_a_compiled_trace_without_inductors_ranges_marks_every_row(tmp_path):
    """Where the trace records Inductor's kernels but not the ranges of its graph calls (the
    same compiled capture with them taken out, as an older torch writes it), harvest cannot tell
    which calls a graph ran: every row is marked, and the note says why."""
    capture = FIXTURES / "h200_qwen3_8b_compiled_b1_capture.pt.trace.json.gz"
    replay = FIXTURES / "h200_qwen3_8b_compiled_b1_replay.pt.trace.json.gz"
    data = json.loads(gzip.open(capture).read())
    kept = [e for e in data["traceEvents"] if not str(e.get("name", "")).startswith("## Call CompiledFxGraph")]
    assert len(kept) == len(data["traceEvents"]) - 1
    data["traceEvents"] = kept
    bare = tmp_path / "compiled_capture.pt.trace.json.gz"
    bare.write_bytes(gzip.compress(json.dumps(data).encode()))
    result = harvest.harvest([replay], capture=[bare], quiet=True)
    assert (result.table["traced_compiled"] == 1).all()
    assert any("1815 Inductor kernels, no record of which calls its graphs ran" in n
               for n in result.traces[0].notes)
