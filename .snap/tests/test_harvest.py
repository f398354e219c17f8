"""tuner harvest on real traces (../shared/traces, the bundled example) and bad-input fixtures.

Expected numbers were read from the traces themselves (ProfilerStep windows, Input Dims, kernel
External ids), independently of tuner.harvest; the tests recompute the timing ones from the raw
JSON where that is cheap.
"""

from __future__ import annotations

import gzip
import json
import math
import os
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
EXAMPLES = ROOT / "shapes" / "examples"
EXAMPLE = ROOT / "shapes" / "examples" / "qwen25_05b_b4_decode.pt.trace.json.gz"
CPU_TRACE = FIXTURES / "cpu_tiny_decoder.pt.trace.json.gz"


# ------------------------------------------------------------------- the qwen H200 trace (CUDA)
@pytest.fixture(scope="module")
def qwen():
    return harvest.harvest([EXAMPLE], quiet=True)


def test_qwen_steps_and_phases(qwen):
    [t] = qwen.traces
    assert t.device == "NVIDIA H200" and t.backend == "cuda"
    assert [s.phase for s in t.steps] == ["prefill"] + ["decode"] * 6
    df = qwen.table
    assert set(df[df.phase == "decode"].steps) == {6}
    assert set(df[df.phase == "prefill"].steps) == {1}
    assert list(df.columns[: len(shapetable.COLUMNS)]) == list(shapetable.COLUMNS)


def test_qwen_decode_gemm_shapes(qwen):
    df = qwen.table
    dec = df[(df.phase == "decode") & (df.family == "gemm")]
    q = row(dec, op="aten::addmm", m=4, n=896, k=896)      # q_proj (bias)
    assert q.calls_per_step == 24 and q.calls == 144
    assert q["dtype"] == "bfloat16" and q.layout == "NT" and q.batch == 1
    assert row(dec, op="aten::addmm", m=4, n=128, k=896).calls_per_step == 48   # k_proj, v_proj
    assert row(dec, op="aten::mm", m=4, n=896, k=896).calls_per_step == 24      # o_proj
    assert row(dec, op="aten::mm", m=4, n=4864, k=896).calls_per_step == 48     # gate, up
    assert row(dec, op="aten::mm", m=4, n=896, k=4864).calls_per_step == 24     # down
    assert row(dec, op="aten::mm", m=4, n=151936, k=896).calls_per_step == 1    # tied lm_head
    # linear -> matmul -> mm counts once: 24 layers x 7 linears + lm_head per step
    linears = dec[dec.op.isin(["aten::mm", "aten::addmm"])]
    assert (linears.calls_per_step.sum()) == 24 * 7 + 1


def test_qwen_prefill_m_is_512(qwen):
    pre = qwen.table[(qwen.table.phase == "prefill") & (qwen.table.op != "aten::bmm")]
    gemm = pre[pre.family == "gemm"]
    assert set(gemm.m) == {512}
    assert row(gemm, op="aten::addmm", n=896, k=896).calls_per_step == 24


def test_qwen_attention_dims(qwen):
    att = qwen.table[qwen.table.family == "attention"]
    assert set(att.op) == {"aten::scaled_dot_product_attention"}   # cudnn inner ops: same call
    assert set(att.heads) == {14} and set(att.kv_heads) == {2} and set(att.head_dim) == {64}
    assert set(att.batch) == {4}
    pre = row(att, phase="prefill")
    assert pre.q_len == 128 and pre.kv_len == 128 and pre.calls_per_step == 24
    dec = att[att.phase == "decode"]
    assert set(dec.q_len) == {1}
    assert sorted(dec.kv_len) == [129, 130, 131, 132, 133, 134]   # the KV cache grows a step
    assert dec.calls.sum() == 6 * 24


def test_qwen_gpu_times_match_the_raw_trace(qwen):
    """us_per_call = median over calls of the summed kernels the op launched (External id)."""
    events = load_events(EXAMPLE)
    kernels: dict = {}
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memset"):
            kernels.setdefault(e["args"]["External id"], []).append(e["dur"])
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                   if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep"))
    decode = steps[1:]
    per_call = []
    for e in events:
        if e.get("cat") == "cpu_op" and e["name"] == "aten::mm":
            a, b = e["args"]["Input Dims"]
            if a == [4, 4864] and b == [4864, 896] and any(s <= e["ts"] <= t for s, t in decode):
                per_call.append(sum(kernels[e["args"]["External id"]]))
    assert len(per_call) == 144
    down = row(qwen.table, phase="decode", op="aten::mm", n=896, k=4864)
    assert down.us_per_call == pytest.approx(statistics.median(per_call))
    assert "splitKreduce" in down.kernels    # the split-K reduce belongs to its GEMM
    # GPU busy per decode step: one stream, so the union equals the summed durations
    launches = {e["args"]["correlation"]: e["ts"] for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e["args"]}
    busy = []
    for s, t in decode:
        busy.append(sum(e["dur"] for e in events if e.get("cat") in ("kernel", "gpu_memset")
                        and s <= launches[e["args"]["correlation"]] <= t))
    assert down.step_gpu_us == pytest.approx(statistics.median(busy), rel=1e-6)
    cpu_wall = statistics.median(t - s for s, t in decode)
    assert cpu_wall <= down.step_us <= cpu_wall * 1.01
    assert down.share == pytest.approx(down.us_per_call * down.calls_per_step / down.step_us)


def test_qwen_cli_prints_top_rows_and_launch_bound(capsys, tmp_path):
    out_file = tmp_path / "q.parquet"
    rc, out, err = run_cli(capsys, EXAMPLE, "-o", out_file, "--top", "4")
    assert rc == 0
    assert "top 4 of 21 rows by share" in out and f"wrote 21 rows to {out_file}" in out
    assert "decode step is launch-bound: the GPU is busy 7%" in err
    table = shapetable.read(out_file)
    assert table.share.is_monotonic_decreasing


def test_phase_filter_and_bundled_table(capsys, tmp_path):
    rc, out, _ = run_cli(capsys, EXAMPLE, "--phase", "decode", "-o", tmp_path / "d.parquet")
    assert rc == 0
    df = shapetable.read(tmp_path / "d.parquet")
    assert set(df.phase) == {"decode"} and len(df) == 13
    bundled = shapetable.read(ROOT / "shapes" / "examples" / "qwen25_05b_b4_decode.parquet")
    fresh = harvest.harvest([EXAMPLE], quiet=True).table
    pd.testing.assert_frame_equal(bundled.drop(columns="source"), fresh.drop(columns="source"))


def test_default_output_path(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, _ = run_cli(capsys, EXAMPLE, "--top", "1")
    assert rc == 0 and "wrote 21 rows to shapes/qwen25_05b_b4_decode.parquet" in out
    assert (tmp_path / "shapes" / "qwen25_05b_b4_decode.parquet").exists()


# ------------------------------------------------------------------------ other real traces
def test_rocm_mi250(shared_traces):
    res = harvest.harvest([shared_traces / "hta_mi250_rocm62_train.json.gz"], quiet=True)
    [t] = res.traces
    assert t.backend == "hip" and t.device == "AMD Radeon Graphics"
    df = res.table
    fwd = row(df, op="aten::addmm")            # linear(128 -> 128) on a [5, 128] batch
    assert (fwd.m, fwd.n, fwd.k, fwd["dtype"], fwd.layout) == (5, 128, 128, "float32", "NT")
    assert fwd.kernels.startswith("Cijk_") or "Cijk_" in fwd.kernels   # Tensile kernel
    events = load_events(shared_traces / "hta_mi250_rocm62_train.json.gz")
    launched = [e["dur"] for e in events if e.get("cat") == "kernel"
                and e["args"].get("External id") == 13]       # the addmm's External id
    assert fwd.us_per_call == pytest.approx(sum(launched))
    bwd = row(df, op="aten::mm")               # weight gradient: x^T [128, 5] @ grad [5, 128]
    assert (bwd.m, bwd.n, bwd.k, bwd.layout) == (128, 128, 5, "TN")
    assert set(df.phase) == {"other"} and set(df.steps) == {1}


def test_external_id_links_kernels_without_runtime_events(shared_traces, tmp_path):
    src = shared_traces / "hta_mi250_rocm62_train.json.gz"
    stripped = _rewrite(src, tmp_path / "no_runtime.json.gz",
                        lambda e: None if e.get("cat") == "cuda_runtime" else e.get("name"))
    full = harvest.harvest([src], quiet=True).table
    bare = harvest.harvest([stripped], quiet=True).table
    assert list(bare.us_per_call) == pytest.approx(list(full.us_per_call))


def test_v100_without_shapes_says_how_to_recapture(shared_traces, capsys):
    rc, out, err = run_cli(capsys, shared_traces / "hta_v100_noshapes_train.pt.trace.json.gz")
    assert rc == 2
    assert "record_shapes" in err and "torch.profiler.profile(record_shapes=True)" in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_cpu_only_third_party_trace(shared_traces, capsys):
    rc, _, err = run_cli(capsys, shared_traces / "hta_cpu_only.pt.trace.json.gz")
    assert rc == 2 and "CPU-only trace" in err and "no GEMM or attention ops" in err


def test_triton_trace_has_no_gemm(shared_traces, capsys):
    rc, _, err = run_cli(capsys, shared_traces / "hta_a100_triton.json.gz")
    assert rc == 2 and "no GEMM or attention ops" in err and "3 CPU ops" in err


# ------------------------------------------------------------------ CPU-only trace with shapes
def test_cpu_trace_shapes_without_gpu_times(capsys, tmp_path):
    rc, out, err = run_cli(capsys, CPU_TRACE, "-o", tmp_path / "c.parquet")
    assert rc == 0
    assert "CPU-only trace (no GPU kernels)" in err and "NaN" in err
    df = shapetable.read(tmp_path / "c.parquet")
    assert df.us_per_call.isna().all() and df.share.isna().all() and df.step_gpu_us.isna().all()
    assert (df.step_us > 0).all()
    pre = df[df.phase == "prefill"]
    assert set(pre.steps) == {1} and set(df[df.phase == "decode"].steps) == {3}
    # tiny_decoder.py: batch 2, prompt 16, hidden 64, 4 heads, 2 KV heads, 2 layers
    assert row(pre, op="aten::addmm", n=32).calls_per_step == 4     # k, v proj x 2 layers
    assert row(pre, op="aten::addmm", n=32).m == 32
    att = row(pre, family="attention")
    assert (att.batch, att.heads, att.kv_heads, att.q_len, att.kv_len, att.head_dim) == \
        (2, 4, 2, 16, 16, 16)
    dec_att = df[(df.phase == "decode") & (df.family == "attention")]
    assert set(dec_att.q_len) == {1} and sorted(dec_att.kv_len) == [17, 18, 19]


def _rewrite(src: Path, dst: Path, rename) -> Path:
    trace = json.loads(gzip.open(src).read())
    events = []
    for e in trace["traceEvents"]:
        name = rename(e)
        if name is None:
            continue
        if name != e.get("name"):
            e = dict(e, name=name)
        events.append(e)
    trace["traceEvents"] = events
    with gzip.open(dst, "wt") as f:
        json.dump(trace, f)
    return dst


def _step_renamer(prefill_name, decode_name):
    def rename(e):
        name = e.get("name", "")
        if e.get("cat") == "user_annotation" and name.startswith("ProfilerStep#"):
            return prefill_name if name == "ProfilerStep#0" else decode_name
        return name
    return rename


def test_vllm_annotations_give_steps_and_phases(tmp_path):
    trace = _rewrite(CPU_TRACE, tmp_path / "vllm.json.gz", _step_renamer(
        "execute_context_2(32)_generation_0(0)", "execute_context_0(0)_generation_2(2)"))
    t = harvest.read_trace(trace)
    assert "vLLM" in t.steps_from
    assert [s.phase for s in t.steps] == ["prefill", "decode", "decode", "decode"]


def test_sglang_annotations_decide_the_phase(tmp_path):
    # all four steps are called DECODE: the annotation wins over the attention q_len
    trace = _rewrite(CPU_TRACE, tmp_path / "sgl.json.gz",
                     _step_renamer("step[DECODE bs=2]", "step[DECODE bs=2]"))
    t = harvest.read_trace(trace)
    assert "SGLang" in t.steps_from and [s.phase for s in t.steps] == ["decode"] * 4
    trace = _rewrite(CPU_TRACE, tmp_path / "sgl2.json.gz",
                     _step_renamer("step[EXTEND bs=2 toks=32]", "step[DECODE bs=2]"))
    assert [s.phase for s in harvest.read_trace(trace).steps] == ["prefill"] + ["decode"] * 3


def test_no_markers_whole_trace_or_steps_n(tmp_path, capsys):
    trace = _rewrite(CPU_TRACE, tmp_path / "nomark.json.gz",
                     lambda e: None if e.get("name", "").startswith("ProfilerStep#") else
                     e.get("name"))
    rc, _, err = run_cli(capsys, trace, "-o", tmp_path / "a.parquet")
    assert rc == 0 and "the whole trace is counted as one step" in err
    one = shapetable.read(tmp_path / "a.parquet")
    assert set(one.steps) == {1}
    rc, _, err = run_cli(capsys, trace, "--steps", "4", "-o", tmp_path / "b.parquet")
    assert rc == 0 and "whole trace" not in err
    four = shapetable.read(tmp_path / "b.parquet")
    assert set(four.steps) == {4}
    merged = one.merge(four, on=["op", "m", "n", "k", "batch", "phase"], suffixes=("1", "4"))
    assert len(merged) == len(one)
    assert (merged.calls_per_step1 == 4 * merged.calls_per_step4).all()
    assert list(merged.step_us1) == pytest.approx(list(4 * merged.step_us4))


# -------------------------------------------------------------------------- files and ranks
def test_directory_picks_rank_0_and_rank_chooses(shared_traces, tmp_path, capsys):
    d = tmp_path / "profile"
    d.mkdir()
    shutil.copy(CPU_TRACE, d / "host-rank-0.1700000000.pt.trace.json.gz")
    shutil.copy(shared_traces / "hta_mi250_rocm62_train.json.gz",
                d / "host-rank-1.1700000000.pt.trace.json.gz")
    res = harvest.harvest([d], quiet=True)
    assert [t.device for t in res.traces] == ["cpu"]
    res = harvest.harvest([d], rank=1, quiet=True)
    assert [t.device for t in res.traces] == ["AMD Radeon Graphics"]
    with pytest.raises(TunerError, match="ranks 0, 1"):
        harvest.harvest(sorted(d.iterdir()), quiet=True)     # never merge ranks
    with pytest.raises(TunerError, match="no trace of rank 5"):
        harvest.harvest([d], rank=5, quiet=True)


@pytest.mark.parametrize("name, rank", [
    ("0a1b-rank-3.1732000000123.pt.trace.json.gz", 3),      # vLLM
    ("1732000000.123-TP-2-DP-0.trace.json.gz", 2),          # SGLang
    ("llama_tp8_rank_5.json", 5),
    ("trace.json", None),
])
def test_rank_from_file_name(tmp_path, name, rank):
    p = tmp_path / name
    p.write_text('{"traceEvents": []}')
    assert harvest.trace_rank(p) == rank


def test_two_traces_of_one_rank_merge(tmp_path):
    a = shutil.copy(CPU_TRACE, tmp_path / "a.pt.trace.json.gz")
    b = shutil.copy(CPU_TRACE, tmp_path / "b.pt.trace.json.gz")
    one = harvest.harvest([a], quiet=True).table
    two = harvest.harvest([a, b], quiet=True).table
    assert (two.calls.values == 2 * one.calls.values).all()
    assert (two.steps.values == 2 * one.steps.values).all()
    assert (two.calls_per_step.values == one.calls_per_step.values).all()


# ------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("name, message", [
    ("missing.json", "trace not found"),
    ("not_json.json", "not a JSON trace"),
    ("truncated.json.gz", "gzip stream ends early"),
    ("truncated.json", "JSON ends early"),
    ("no_trace_events.json", "JSON without traceEvents"),
])
def test_bad_input_is_one_line_exit_2(capsys, name, message, tmp_path):
    rc, out, err = run_cli(capsys, FIXTURES / name, "-o", tmp_path / "x.parquet")
    assert rc == 2
    assert err.startswith("tuner: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "x.parquet").exists()


def test_empty_file(capsys, tmp_path):
    (tmp_path / "empty.json").write_text("")
    rc, _, err = run_cli(capsys, tmp_path / "empty.json", "-o", tmp_path / "x.parquet")
    assert rc == 2 and "empty file, not a trace" in err and err.count("\n") == 1


def test_unattributed_kernels_are_reported(capsys, tmp_path):
    rc, out, err = run_cli(capsys, FIXTURES / "graph_replay.json.gz", "-o", tmp_path / "g.parquet")
    assert rc == 0
    [t] = harvest.harvest([FIXTURES / "graph_replay.json.gz"], quiet=True).traces
    graph_us = 100.0 + 120.0 + 80.0          # the three replayed kernels (make_fixtures.py)
    assert t.gpu_unattributed_us == pytest.approx(graph_us) and t.n_unattributed == 3
    share = 100 * graph_us / t.gpu_total_us
    assert f"{share:.1f}% of GPU time (3 kernels) has no owning op" in err
    assert f"{share:.1f}% unattributed" in out


def test_cli_needs_one_mode(capsys):
    rc, _, err = run_cli(capsys)
    assert rc == 2 and "exactly one of" in err
    rc, _, err = run_cli(capsys, "--live", "tests/fixtures/traces/tiny_decoder.py:TinyDecoder")
    assert rc == 2 and "--steps" in err


# -------------------------------------------------------------------------------- live, watch
def test_live_profiles_a_callable(capsys, tmp_path):
    saved = tmp_path / "live.pt.trace.json.gz"
    rc, out, err = run_cli(capsys, "--live", f"{FIXTURES / 'tiny_decoder.py'}:TinyDecoder",
                           "--steps", "3", "--save-trace", saved, "-o", tmp_path / "l.parquet")
    assert rc == 0 and saved.exists()
    df = shapetable.read(tmp_path / "l.parquet")
    assert set(df[df.phase == "prefill"].steps) == {1}
    assert set(df[df.phase == "decode"].steps) == {2}
    assert row(df, phase="prefill", op="aten::addmm", n=32).m == 32
    assert "ProfilerStep#N markers" in out
    rc, _, err = run_cli(capsys, "--live", "no_such_module_xyz:f", "--steps", "1")
    assert rc == 2 and "cannot import no_such_module_xyz" in err


def test_watch_harvests_new_files_and_stops_on_ctrl_c(tmp_path):
    d, out = tmp_path / "traces", tmp_path / "merged.parquet"
    d.mkdir()
    # keep the caller's PYTHONPATH (on the GPU machine ijson and optuna come from there)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    proc = subprocess.Popen([sys.executable, "-m", "tuner.cli", "harvest", "--watch", str(d),
                             "-o", str(out), "--interval", "0.2"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        data = CPU_TRACE.read_bytes()
        part = d / "w1.pt.trace.json.gz"
        with open(part, "wb") as f:                  # a file still being written
            f.write(data[:5000])
            f.flush()
            time.sleep(1.0)
            assert not out.exists()
            f.write(data[5000:])
        deadline = time.time() + 30
        while not out.exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert proc.poll() is None, f"tuner harvest --watch ended early: {proc.communicate()[1]}"
        assert shapetable.read(out).steps.max() == 3
        shutil.copy(CPU_TRACE, d / "w-rank-1.pt.trace.json.gz")   # another rank: skipped
        shutil.copy(CPU_TRACE, d / "w2.pt.trace.json.gz")
        deadline = time.time() + 30
        while time.time() < deadline and shapetable.read(out).steps.max() != 6:
            time.sleep(0.2)
        assert shapetable.read(out).steps.max() == 6        # two traces merged
    finally:
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr and "2 trace(s) harvested" in stderr
    assert "skipping w-rank-1.pt.trace.json.gz: rank 1" in stderr


class _Polls:
    """Stands in for time.sleep inside `harvest.watch`: records each wait and runs the action
    planned for the end of that poll (1-based), so a test changes the folder between polls."""

    def __init__(self, monkeypatch, plan: dict):
        self.waits: list[float] = []
        self.plan = plan
        monkeypatch.setattr(harvest.watching.time, "sleep", self)

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        action = self.plan.get(len(self.waits))
        if action:
            action()


def test_watch_says_once_that_a_file_ends_early_and_reads_it_again_when_it_changes(
        tmp_path, capsys, monkeypatch):
    """A trace cut short that stays so (a copy that failed half way): it was read again every
    other poll, forever, without a word. Now one line says so, it is not read again until it
    changes, and once whole it is harvested."""
    d, out = tmp_path / "traces", tmp_path / "merged.parquet"
    d.mkdir()
    data = CPU_TRACE.read_bytes()
    cut = d / "w1.pt.trace.json.gz"
    cut.write_bytes(data[:len(data) // 2])
    reads = []
    real = harvest.watching.read_trace
    monkeypatch.setattr(harvest.watching, "read_trace",
                        lambda path, **kw: reads.append(path.name) or real(path, **kw))
    polls = _Polls(monkeypatch, {12: lambda: cut.write_bytes(data)})
    assert harvest.watch(d, out, interval=0.5, max_polls=16) == 1
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "w1.pt.trace.json.gz" in line]
    assert said == [
        "tuner: warning: w1.pt.trace.json.gz: the gzip stream ends early (truncated file, or "
        "still being written?); read again when it changes",
        "harvested w1.pt.trace.json.gz"], err
    assert reads == ["w1.pt.trace.json.gz"] * 2     # cut short once, then whole
    assert polls.waits == [0.5] * 16
    assert shapetable.read(out).steps.max() == 3


def test_watch_says_once_that_its_folder_is_gone_backs_off_and_goes_on(tmp_path, capsys,
                                                                     monkeypatch):
    """The watched folder removed (a cleanup, an unmounted share): it was polled at the same
    pace without a word. Now one line says it, the polls slow down (doubling, up to a minute)
    and, when it is back, one line says that and its new traces are merged with the first."""
    d, out = tmp_path / "traces", tmp_path / "merged.parquet"
    d.mkdir()
    shutil.copy(CPU_TRACE, d / "w1.pt.trace.json.gz")

    def come_back():
        d.mkdir()
        shutil.copy(CPU_TRACE, d / "w2.pt.trace.json.gz")

    polls = _Polls(monkeypatch, {3: lambda: shutil.rmtree(d), 12: come_back})
    assert harvest.watch(d, out, interval=2, max_polls=16) == 2
    err = capsys.readouterr().err
    gone = [line for line in err.splitlines() if "is gone" in line]
    assert gone == [f"tuner: warning: --watch {d}: the folder is gone; polling it ever more "
                    "slowly (up to every 60 s) until it is back; Ctrl-C stops"], err
    assert err.count("the folder is back") == 1
    assert polls.waits == [2, 2, 2, 4, 8, 16, 32, 60, 60, 60, 60, 60, 2, 2, 2, 2]
    assert shapetable.read(out).steps.max() == 6       # both traces, one before, one after
    assert "Traceback" not in err


def test_pure_python_ijson_backend_gives_the_same_table(monkeypatch):
    import ijson.backends.python as slow

    fast = harvest.harvest([CPU_TRACE], quiet=True).table
    monkeypatch.setattr(harvest.reading, "ijson", slow)
    pd.testing.assert_frame_equal(harvest.harvest([CPU_TRACE], quiet=True).table, fast)


def test_union_length():
    assert harvest.union_length([(0, 10), (5, 15), (20, 30)]) == 25
    assert harvest.union_length([]) == 0
    assert math.isclose(harvest.union_length([(0, 1), (0, 1)]), 1)


# ------------------------------------------------------- traces captured on the H200 by the product
def test_real_cuda_graph_replay_is_unattributed(capsys, tmp_path):
    """scripts/gpu/harvest_live.sh captured this with `tuner harvest --live` on an H200: one eager mm
    per step, then a CUDA-graph replay whose kernels have no owning op."""
    path = FIXTURES / "cuda_graph_replay_h200.pt.trace.json.gz"
    [t] = harvest.harvest([path], quiet=True).traces
    assert t.n_unattributed > 0
    share = 100 * t.gpu_unattributed_us / t.gpu_total_us
    assert 50 < share < 100  # most GPU time in that trace is the replayed graph
    rc, _, err = run_cli(capsys, path, "-o", tmp_path / "g.parquet")
    assert rc == 0 and f"{share:.1f}% of GPU time" in err and "no owning op" in err


def test_bundled_live_example_matches_the_model():
    """The README's example, captured with `tuner harvest --live shapes/examples/qwen_live.py`:
    Qwen2.5-0.5B shapes (hidden 896, MLP 4864, 24 layers, vocab 151936), batch 4, prompt 128."""
    table = harvest.harvest([EXAMPLES / "qwen25_05b_b4_live.pt.trace.json.gz"], quiet=True).table
    decode = table[(table.phase == "decode") & (table.family == "gemm")]
    by_shape = {(r.m, r.n, r.k): r.calls_per_step for r in decode.itertuples()
                if r.op.endswith("mm") and r.batch == 1}
    assert by_shape[(4, 4864, 896)] == 48      # gate and up, 24 layers
    assert by_shape[(4, 896, 4864)] == 24      # down
    assert by_shape[(4, 151936, 896)] == 1     # tied lm_head
    assert set(table.steps[table.phase == "decode"]) == {7}
    prefill_mm = table[(table.phase == "prefill") & (table.op == "aten::mm")]
    assert set(prefill_mm.m[prefill_mm.n != 151936]) == {512}   # 4 sequences x 128 prompt tokens
    assert set(prefill_mm.m[prefill_mm.n == 151936]) == {4}     # logits of the last token only
