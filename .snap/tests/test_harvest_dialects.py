"""tuner harvest on the older and odder trace dialects, custom attention ops, the decode kv_len
buckets, and inputs that are no trace at all (FIFOs, devices, parquet, SQLite).

The dialect fixtures are made by tests/fixtures/traces/make_synthetic.py; the 2021-schema and
External-id-is-correlation ones are the real MI250 trace (../shared/traces) rewritten, so their
table must equal the original's.
"""

from __future__ import annotations

import gzip
import json
import os
import sqlite3
import statistics
import threading
from pathlib import Path

import pandas as pd
import pytest

from tuner import harvest, shapetable
from tuner.harvest import table as table_module
from harvest_helpers import row, run_cli

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "traces"
MI250 = "hta_mi250_rocm62_train.json.gz"


SHAPE_COLUMNS = ["op", "phase", "m", "n", "k", "batch", "dtype", "layout", "calls",
                 "calls_per_step", "us_per_call", "step_us", "step_gpu_us"]


# ----------------------------------------------------------------------------------- dialects
def test_kineto_2021_schema_reads_like_the_original(shared_traces):
    """Operator / Runtime / Kernel categories, lowercase "external id", string tids,
    ProfilerStep#N as an Operator, "Input dims": the same table as the 2022+ original."""
    original = harvest.harvest([shared_traces / MI250], quiet=True)
    old = harvest.harvest([FIXTURES / "kineto2021_mi250.json.gz"], quiet=True)
    pd.testing.assert_frame_equal(old.table[SHAPE_COLUMNS], original.table[SHAPE_COLUMNS])
    [t] = old.traces
    assert t.steps_from == "ProfilerStep#N markers" and t.backend == "hip"
    assert original.traces[0].gpu_in_calls_us > 0
    assert t.gpu_in_calls_us == pytest.approx(original.traces[0].gpu_in_calls_us)


def test_external_id_is_the_correlation(shared_traces, capsys):
    """Kernels whose External id is their launch's correlation id (and no correlation arg):
    linked through the runtime launch nested in the op, as the original trace links them."""
    original = harvest.harvest([shared_traces / MI250], quiet=True)
    res = harvest.harvest([FIXTURES / "ext_is_corr_mi250.json.gz"], quiet=True)
    pd.testing.assert_frame_equal(res.table[SHAPE_COLUMNS], original.table[SHAPE_COLUMNS])
    [t] = res.traces
    assert t.gpu_unattributed_us == pytest.approx(original.traces[0].gpu_unattributed_us)
    assert t.gpu_in_calls_us == pytest.approx(original.traces[0].gpu_in_calls_us)
    assert any("External id is their launch's correlation id" in n for n in t.notes)


def test_inductor_mm_with_out_has_three_input_dims(capsys, tmp_path):
    rc, out, err = run_cli(capsys, FIXTURES / "inductor_mm_out.pt.trace.json.gz",
                           "-o", tmp_path / "i.parquet")
    assert rc == 0, err
    df = shapetable.read(tmp_path / "i.parquet")
    mm = row(df, op="aten::mm")
    assert (mm.m, mm.n, mm.k, mm.layout, mm.calls_per_step, mm.us_per_call) == \
        (16, 128, 64, "NT", 1, 3.5)
    addmm = row(df, op="aten::addmm")
    assert (addmm.m, addmm.n, addmm.k, addmm.us_per_call) == (16, 128, 64, 4.5)


def test_device_name_missing_and_given(shared_traces, capsys, tmp_path):
    capture = FIXTURES / "vllm_piecewise_capture.pt.trace.json.gz"
    replay = FIXTURES / "vllm_piecewise_replay.pt.trace.json.gz"
    rc, out, err = run_cli(capsys, replay, "--capture", capture, "-o", tmp_path / "a.parquet")
    assert rc == 0 and err.count("names no GPU") == 1 and "--device-name" in err
    assert set(shapetable.read(tmp_path / "a.parquet").device) == {"unknown"}
    rc, out, err = run_cli(capsys, replay, "--capture", capture, "-o", tmp_path / "b.parquet",
                           "--device-name", "AMD Instinct MI300X")
    assert rc == 0 and "names no GPU" not in err and "AMD Instinct MI300X [hip]" in out
    from tuner.device import spec_key_for

    device = set(shapetable.read(tmp_path / "b.parquet").device)
    assert device == {"AMD Instinct MI300X"} and spec_key_for(device.pop()) == "mi300x"


def test_device_name_from_the_metadata_labels(tmp_path):
    """No name in deviceProperties, but the GPU process label names the model."""
    trace = json.loads(gzip.open(FIXTURES / "vllm_piecewise_replay.pt.trace.json.gz").read())
    trace["traceEvents"] += [
        {"ph": "M", "name": "process_labels", "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0,
         "args": {"name": "AMD Instinct MI300X"}}]
    path = tmp_path / "labelled.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(trace, f)
    [t] = harvest.harvest([path], quiet=True,
                          capture=[FIXTURES / "vllm_piecewise_capture.pt.trace.json.gz"]).traces
    assert t.device == "AMD Instinct MI300X" and t.device_known


# --------------------------------------------------------------------------- custom attention
@pytest.fixture(scope="module")
def custom():
    return harvest.harvest([FIXTURES / "custom_attention.pt.trace.json.gz"], quiet=True).table


def test_ragged_prefill_attention(custom):
    """FlashInfer ragged prefill: q [64 tokens, 8, 64], k [64, 2, 64], qo/kv indptr [5]: 4
    requests of 16 query and 16 KV tokens."""
    r = row(custom, phase="prefill", family="attention")
    assert r.op == "flashinfer::batch_prefill_with_ragged_kv_cache_ragged_run"
    assert (r.batch, r.heads, r.kv_heads, r.q_len, r.kv_len, r.head_dim) == (4, 8, 2, 16, 16, 64)
    assert (r.m, r.n, r.k, r.us_per_call) == (16, 16, 64, 11.0)


def test_fp8_unified_attention_and_paged_decode(custom):
    dec = custom[(custom.phase == "decode") & (custom.family == "attention")]
    fp8 = row(dec, op="vllm::unified_attention_with_output")
    assert fp8["dtype"] == "float8_e4m3fn"
    assert (fp8.batch, fp8.heads, fp8.kv_heads, fp8.q_len, fp8.head_dim) == (4, 8, 2, 1, 64)
    assert pd.isna(fp8.kv_len)        # neither the dims nor a vLLM marker give it
    paged = row(dec, op="flashinfer::batch_decode_with_paged_kv_cache_run")
    assert (paged.batch, paged.heads, paged.kv_heads, paged.q_len, paged.head_dim) == \
        (4, 8, 2, 1, 64)
    assert paged.us_per_call == 4.0


# -------------------------------------------------------------------------- decode kv buckets
def test_decode_attention_rows_are_bucketed_by_kv_len(tmp_path):
    """12 decode steps with another KV length each (1000 + 13 step^2 + 7 (step % 3)), 2 calls per
    step: at most MAX_KV_ROWS rows whose calls per step add up to 2, each row's kv_len a KV
    length seen, and every call in the row nearest its KV length (the loader's rule)."""
    res = harvest.harvest([FIXTURES / "sglang_decode_many_kv.pt.trace.json.gz"], quiet=True)
    att = res.table[res.table.family == "attention"]
    seen = sorted({c.kv_len for c in res.traces[0].calls if c.family == "attention"})
    assert len(seen) == 12 and len(att) == table_module.MAX_KV_ROWS
    assert att.calls_per_step.sum() == pytest.approx(2) and att.calls.sum() == 24
    reps = sorted(int(v) for v in att.kv_len)
    assert set(reps) <= set(seen) and list(att.n) == list(att.kv_len)
    # the row each call sits in is the one tuner.runtime's nearest lookup picks for it
    for kv in seen:
        nearest = min(reps, key=lambda r: (abs(r - kv), r))
        calls = [c for c in res.traces[0].calls if c.family == "attention" and c.kv_len == kv]
        in_row = att[att.kv_len == nearest]
        assert len(in_row) == 1 and len(calls) == 2
    counted = {int(r.kv_len): int(r.calls) for r in att.itertuples()}
    expected: dict = {}
    for kv in seen:
        nearest = min(reps, key=lambda r: (abs(r - kv), r))
        expected[nearest] = expected.get(nearest, 0) + 2
    assert counted == expected
    # us_per_call is the median over the row's calls (kernel us = 5 + kv / 1000)
    for r in att.itertuples():
        kvs = [kv for kv in seen if min(reps, key=lambda x: (abs(x - kv), x)) == r.kv_len]
        assert r.us_per_call == pytest.approx(statistics.median(
            [5.0 + kv / 1000 for kv in kvs for _ in range(2)]))


def test_the_loader_serves_each_call_from_the_row_that_counted_it(monkeypatch):
    """Export one config per bucketed row (shaped as tuner_kernels.attention.shape_from_row reads the
    row), load them into tuner.runtime as its loader does, and look each call's real KV length
    up: the nearest-kv_len lookup lands on the row whose calls include that call."""
    import tuner_kernels.attention as family
    from tuner import runtime

    res = harvest.harvest([FIXTURES / "sglang_decode_many_kv.pt.trace.json.gz"], quiet=True)
    att = res.table[res.table.family == "attention"]
    loaded = runtime.LoadedExport("attention", None, "loaded")
    for r in att.itertuples():
        shape = family.shape_from_row(att.loc[r.Index])
        assert shape is not None and shape["kv_len"] == r.kv_len
        config = {"row_kv_len": int(r.kv_len)}
        loaded.entries[runtime.shape_tuple(shape)] = (f"kv{r.kv_len}", config)
        rest = runtime.shape_tuple({k: v for k, v in shape.items() if k != "kv_len"})
        loaded.by_rest.setdefault(rest, []).append((shape["kv_len"], f"kv{r.kv_len}", config))
    monkeypatch.setitem(runtime._LOADED, "attention", loaded)
    counted: dict = {}
    for c in res.traces[0].calls:
        if c.family != "attention":
            continue
        shape = {"batch": c.batch, "heads": c.heads, "kv_heads": c.kv_heads, "kv_len": c.kv_len,
                 "head_dim": c.head_dim, "dtype": c.dtype}
        config, _key = runtime.resolve("attention", shape)
        counted[config["row_kv_len"]] = counted.get(config["row_kv_len"], 0) + 1
    assert counted == {int(r.kv_len): int(r.calls) for r in att.itertuples()}


def test_kv_buckets_keep_few_lengths_and_follow_the_nearest_rule():
    buckets = table_module.kv_buckets(list(range(100, 300)) + [1000] * 50, max_rows=3)
    reps = sorted(set(buckets.values()))
    assert len(reps) == 3 and 1000 in reps
    for kv, rep in buckets.items():
        assert rep == min(reps, key=lambda r: (abs(r - kv), r))
    assert table_module.kv_buckets([5, 6, 7]) == {5: 5, 6: 6, 7: 7}
    # a tie goes to the smaller KV length, as in the loader
    assert table_module.kv_buckets([10, 10, 15, 20, 20], max_rows=2) == {10: 10, 15: 10, 20: 20}


# ------------------------------------------------------------------------------- not a trace
def test_fifo_is_refused_not_read_forever(tmp_path, capsys):
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    opened = threading.Event()

    def writer():   # if harvest opened the FIFO for reading, this unblocks it; it must not
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            opened.set()
            os.close(fd)
        except OSError:
            pass

    rc, _, err = run_cli(capsys, fifo, "-o", tmp_path / "x.parquet")
    writer()
    assert rc == 2 and "is a FIFO (named pipe), not a trace file" in err
    assert err.count("\n") == 1 and not opened.is_set()


def test_device_file_is_refused(capsys, tmp_path):
    rc, _, err = run_cli(capsys, "/dev/zero", "-o", tmp_path / "x.parquet")
    assert rc == 2 and "/dev/zero is a device file, not a trace file" in err
    assert err.count("\n") == 1


def test_tables_and_databases_say_which_command_takes_them(capsys, tmp_path):
    shapes = ROOT / "shapes" / "examples" / "qwen25_05b_b4_decode.parquet"
    rc, _, err = run_cli(capsys, shapes, "-o", tmp_path / "x.parquet")
    assert rc == 2 and err.count("\n") == 1
    assert ("qwen25_05b_b4_decode.parquet is a shape table: `tuner budget` / `tuner search` "
            "take it") in err
    budget = shapetable.read(shapes).assign(floor_us=1.0)
    budget.to_parquet(tmp_path / "b.parquet")
    rc, _, err = run_cli(capsys, tmp_path / "b.parquet")
    assert rc == 2 and "is a budget table" in err
    db = tmp_path / "studies.db"
    sqlite3.connect(db).execute("create table t (x int)").connection.commit()
    rc, _, err = run_cli(capsys, db)
    assert rc == 2 and "is an SQLite database" in err and "--storage sqlite:///" in err


@pytest.mark.parametrize("content, message", [
    ('{"traceEvents": {"ph": "X"}}', "traceEvents is a JSON object, not a list of events"),
    ('{"traceEvents": "events"}', "traceEvents is a string, not a list of events"),
    ('"a string"', "top-level JSON is a string"),
    ('17', "top-level JSON is a number"),
    ('[[[[' * 300 + ']]]]' * 300, "nested deeper than 1000 levels"),
])
def test_wrong_top_level_types(capsys, tmp_path, content, message):
    p = tmp_path / "t.json"
    p.write_text(content)
    rc, _, err = run_cli(capsys, p, "-o", tmp_path / "x.parquet")
    assert rc == 2 and message in err and err.count("\n") == 1, err


def test_gzip_inside_is_sniffed_too(capsys, tmp_path):
    p = tmp_path / "t.json.gz"
    with gzip.open(p, "wt") as f:
        json.dump({"traceEvents": 5}, f)
    rc, _, err = run_cli(capsys, p)
    assert rc == 2 and "traceEvents is a number" in err
