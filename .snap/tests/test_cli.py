"""The command line, consistently, and bad input to budget, rank, export and bench.

Every case runs `tuner.cli.main` on real inputs (the bundled example trace and shape table, a
verdict table from tuner.rank.decide) and asserts one `tuner: error:` line with exit 2, nothing
written, or the documented output.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from tuner import cli, rank, shapetable
from tuner.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "shapes" / "examples"
TRACE = EXAMPLES / "qwen25_05b_b4_decode.pt.trace.json.gz"
TABLE = EXAMPLES / "qwen25_05b_b4_decode.parquet"
MINE = ("budget", "estimate", "device", "bench", "rank", "export")


def run(capsys, *argv):
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse's own exits
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_error(code, err, *needles):
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (code, err)
    assert len(lines) == 1 and lines[0].startswith("tuner: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


# ------------------------------------------------------------------------------ the parser
def test_no_command_prints_one_line_and_the_commands(capsys):
    code, out, err = run(capsys)
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert lines[0].startswith("tuner: error: give a command")
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    names = list(sub.choices)
    assert len(names) >= 9
    assert [line.split()[0] for line in lines[1:]] == names


@pytest.mark.parametrize("command", MINE)
def test_every_command_has_a_description_and_states_its_defaults(command):
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser = sub.choices[command]
    assert parser.description and len(parser.description) > 60, command
    for action in parser._actions:
        if action.default in (None, False, argparse.SUPPRESS) or action.help is None:
            continue
        if isinstance(action.default, list) and not action.default:
            continue
        assert "default" in action.help, (command, action.option_strings, action.help)


def test_an_unknown_flag_is_one_line(capsys):
    one_error(*run(capsys, "estimate", "--bogus", "1")[::2], "unrecognized arguments: --bogus",
              "--help")
    one_error(*run(capsys, "budget")[::2], "required: shapes", "tuner budget --help")


def test_debug_keeps_the_exit_code_and_shows_the_traceback(capsys, tmp_path):
    code, _, err = run(capsys, "budget", tmp_path / "missing.parquet", "--device", "h200")
    one_error(code, err, "shape table not found")
    code, _, err = run(capsys, "--debug", "budget", tmp_path / "missing.parquet", "--device", "h200")
    assert code == 2
    assert "Traceback (most recent call last)" in err
    assert err.strip().splitlines()[-1].startswith("tuner: error: shape table not found")


def test_a_trace_given_to_budget_says_what_it_is(capsys, tmp_path):
    code, out, err = run(capsys, "budget", TRACE, "--device", "h200", "-o", tmp_path / "b.parquet")
    one_error(code, err, "gzip-compressed JSON file (a profiler trace?)", "not a shape table",
              f"tuner harvest {TRACE}")
    plain = tmp_path / "trace.json"
    plain.write_text('{"traceEvents": []}')
    one_error(*run(capsys, "budget", plain, "--device", "h200")[::2], "a JSON file (a profiler trace?)")
    assert not (tmp_path / "b.parquet").exists()


# ------------------------------------------------------------------------- shape tables
@pytest.mark.parametrize("column,value,why", [
    ("m", float("nan"), "is empty (NaN)"),
    ("n", "4096", "is not a number"),
    ("us_per_call", "fast", "is not a number"),
    ("calls_per_step", float("inf"), "is not a finite number"),
    ("k", -896, "is negative"),
    ("batch", 1.5, "is not a whole number"),
    ("dtype", None, "is empty"),
    ("phase", "warmup", "is not one of prefill, decode, other"),
])
def test_a_shape_table_with_a_bad_cell_is_refused_naming_column_and_row(capsys, tmp_path, column,
                                                                         value, why):
    raw = pd.read_parquet(TABLE)
    row = 3
    if isinstance(value, str) and column not in ("phase", "dtype"):
        raw[column] = raw[column].astype(str)  # parquet holds one type per column: all text
        row = 0
    else:
        raw[column] = raw[column].astype(object)
        raw.at[3, column] = value
    path = tmp_path / "bad.parquet"
    raw.to_parquet(path)
    line = one_error(*run(capsys, "budget", path, "--device", "h200", "-o",
                          tmp_path / "out.parquet")[::2], f"column {column!r}, row {row}", why)
    assert "tuner harvest" in line or "phase" in column
    assert files_under(tmp_path) == ["bad.parquet"]


# ------------------------------------------------------------------------- output paths
def unwritable_outputs(tmp_path: Path) -> dict[str, Path]:
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    (tmp_path / "a_dir").mkdir()
    return {"a directory": tmp_path / "a_dir", "under a file": a_file / "out.parquet",
            "read-only": Path("/proc/tuner-test/out.parquet")}


@pytest.mark.parametrize("case", ["a directory", "under a file", "read-only"])
def test_budget_output_that_cannot_be_written_fails_first(capsys, tmp_path, case):
    target = unwritable_outputs(tmp_path)[case]
    before = files_under(tmp_path)
    code, out, err = run(capsys, "budget", TABLE, "--device", "h200", "-o", target)
    one_error(code, err, "-o")
    assert out == ""  # no work done, nothing printed
    assert files_under(tmp_path) == before


def test_budget_writes_a_0644_table_and_no_temp_file(capsys, tmp_path):
    out = tmp_path / "deep" / "budget.parquet"
    code, stdout, _ = run(capsys, "budget", TABLE, "--device", "h200", "-o", out)
    assert code == 0 and "budget written to" in stdout
    assert files_under(tmp_path) == ["deep", "deep/budget.parquet"]
    assert out.stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("case", ["a directory", "under a file", "read-only"])
def test_rank_and_export_outputs_that_cannot_be_written_fail_first(capsys, tmp_path, case):
    targets = unwritable_outputs(tmp_path)
    target = targets[case] if case != "a directory" else tmp_path / "a_file"
    before = files_under(tmp_path)
    # rank: before it looks for a GPU or a study
    one_error(*run(capsys, "rank", "--device", "h200", "-o", target)[::2], "-o")
    one_error(*run(capsys, "export", "-o", target)[::2], "-o")
    assert files_under(tmp_path) == before
    one_error(*run(capsys, "rank", "--device", "h200", "--name", "../escape",
                   "-o", tmp_path / "v")[::2], "--name '../escape'")


@pytest.mark.parametrize("mode", ["trace", "live", "watch"])
@pytest.mark.parametrize("case", ["a directory", "under a file", "read-only"])
def test_harvest_output_that_cannot_be_written_fails_first(capsys, tmp_path, case, mode):
    """harvest -o a directory, under a file, in a read-only place: an internal error (exit 1)
    once the trace was read, and `--watch` found it only when the first trace came. Now one
    line, exit 2, before any trace is read, profiled or watched."""
    target = unwritable_outputs(tmp_path)[case]
    watched = tmp_path / "watched"
    watched.mkdir()
    shutil.copy(TRACE, watched / "t.pt.trace.json.gz")  # --watch would harvest it at once
    before = files_under(tmp_path)
    source = {"trace": [TRACE],
              "live": ["--live", f"{ROOT / 'tests/fixtures/traces/tiny_decoder.py'}:TinyDecoder",
                       "--steps", "1"],
              "watch": ["--watch", watched, "--interval", "0.1"]}[mode]
    code, out, err = run(capsys, "harvest", *source, "-o", target)
    one_error(code, err, f"-o {target if case == 'a directory' else target.parent}")
    assert out == ""
    assert files_under(tmp_path) == before


@pytest.mark.parametrize("interval", ["-1", "nan", "inf", "0"])
def test_harvest_watch_interval_must_be_a_positive_number(capsys, tmp_path, interval):
    """--interval -1 / nan: an internal error (time.sleep's ValueError) after the first poll."""
    code, out, err = run(capsys, "harvest", "--watch", tmp_path, "-o", tmp_path / "t.parquet",
                         f"--interval={interval}")
    one_error(code, err, "--interval must be a positive number of seconds")
    assert out == "" and files_under(tmp_path) == []


# ---------------------------------------------------------------------------------- export
def verdict_table():
    from tests.test_export_runtime import ENTRIES, verdicts

    return verdicts(ENTRIES)


def test_export_refuses_bad_rows_and_never_writes_outside(capsys, tmp_path):
    table = verdict_table()
    bad = table.copy()
    bad.loc[0, "config"] = json.dumps({**json.loads(bad.loc[0, "config"]), "BLOCK_K": 3})
    bad.loc[1, "shape_json"] = "{not json"
    escape = table.iloc[[2]].copy()
    escape["device"] = "../../escaped"
    evil_family = table.iloc[[2]].copy()
    evil_family["family"] = "../../gemv"
    evil_family["device"] = "nvidia-h200-b"
    parquet, _ = rank.write(pd.concat([bad, escape, evil_family], ignore_index=True),
                            tmp_path / "verdicts", "mixed")
    out = tmp_path / "export"
    code, stdout, err = run(capsys, "export", parquet, "-o", out)
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("tuner: warning: not exporting")]
    assert len(warnings) == 4, err
    assert any("BLOCK_K=3 is not in the gemv/cuda space" in w for w in warnings)
    assert any("does not parse as JSON" in w for w in warnings)
    assert any("is not a plain name" in w for w in warnings)
    assert any("unknown family" in w for w in warnings)
    assert files_under(tmp_path.parent / tmp_path.name) == sorted(
        ["export", "export/nvidia-h200", "export/nvidia-h200/gemv.json",
         "export/nvidia-h200/manifest.json", "verdicts", "verdicts/mixed.md",
         "verdicts/mixed.parquet"])
    doc = json.loads((out / "nvidia-h200" / "gemv.json").read_text())
    assert list(doc["configs"]) == [bad.loc[2, "shape"]]  # the one good row of `bad`
    assert not (tmp_path.parent / "escaped").exists()
    for path in (out / "nvidia-h200").iterdir():
        assert path.stat().st_mode & 0o777 == 0o644
    # every row refused: one error, nothing written
    only_bad, _ = rank.write(bad.iloc[[0]], tmp_path / "verdicts", "bad")
    shutil.rmtree(out)
    code, _, err = run(capsys, "export", only_bad, "-o", out)
    assert code == 2 and err.splitlines()[-1].startswith("tuner: error: no exportable configs")
    assert err.splitlines()[0].startswith("tuner: warning: not exporting")
    assert not out.exists() or files_under(out) == []


def test_vllm_file_names_cannot_leave_the_folder(tmp_path):
    from tuner import export

    doc = {"device": {"name": "../../../x y"}, "family": "gemv", "configs": {
        "a": {"shape": {"m": 4, "n": 896, "k": 896, "dtype": "bfloat16"}, "config": {"R": 1}}}}
    (name,) = export.vllm_documents(doc)
    assert "/" not in name and name.startswith("N=896,K=896,device_name=_.._.._x_y")


# ----------------------------------------------------------------------------------- bench
@pytest.mark.parametrize("shape,why", [
    ("m=1,n=14336", "shape lacks k"),
    ("m=1,n=big,k=5120", "n='big' is not an integer"),
    ("m=0,n=14336,k=5120", "m=0 must be a positive size"),
    ("m=1,n=-4,k=5120", "n=-4 must be a positive size"),
    ("m=1,n=14336,k=5120,dtype=int4", "dtype 'int4' is not one of bfloat16, float16"),
    ("m=1,n=14336,k=5120,heads=2", "unknown shape key(s) heads"),
    ("m=1,n", "item 'n' is not KEY=VALUE"),
    ("m=1,m=2,n=1,k=1", "m is given twice"),
])
def test_bench_shape_is_validated_before_any_gpu_work(capsys, shape, why):
    one_error(*run(capsys, "bench", "--family", "gemv", "--shape", shape)[::2], why)


@pytest.mark.parametrize("config,why", [
    ("BLOCK_K=abc", "BLOCK_K='abc' is not a number"),
    ("BLOCK_K=nan", "is not a finite number"),
    ("BLOCK_Q=4", "unknown parameter(s) BLOCK_Q for gemv"),
    ("BLOCK_K", "is not KEY=VALUE"),
])
def test_bench_config_is_validated(capsys, config, why):
    one_error(*run(capsys, "bench", "--family", "gemv", "--shape", "m=1,n=896,k=896",
                   "--config", config)[::2], why)


def test_bench_parse_shape_reads_good_shapes():
    from tuner.bench import parse_config, parse_shape

    assert parse_shape("m=1, n=14336 ,k=5120") == {"m": 1, "n": 14336, "k": 5120, "dtype": "bfloat16"}
    assert parse_shape("m=512,n=896,k=896", family="gemm")["layout"] == "NT"
    assert parse_shape("batch=4,heads=14,kv_heads=2,kv_len=300,head_dim=64", "float16") == {
        "batch": 4, "heads": 14, "kv_heads": 2, "kv_len": 300, "head_dim": 64, "dtype": "float16"}
    assert parse_config("ROWS_PER_BLOCK=4,BLOCK_K=512", family="gemv") == {
        "ROWS_PER_BLOCK": 4, "BLOCK_K": 512}
