"""`tuner search` on the command line when something is wrong: no GPU, GPU ids the
machine lacks, a search that produced nothing, no shape worth a search, bad storage URLs, a
trace given instead of a shape table. Each ends with one `tuner: error:` line and exit code 2;
never a traceback, never a silent exit 0."""

from __future__ import annotations

import pytest

from tuner import search, shapetable
from tuner.cli import main
from tuner.errors import TunerError
from tuner.search import gpus

from test_search import EXAMPLE, ROOT, _table

TRACE = ROOT / "shapes" / "examples" / "qwen25_05b_b4_decode.pt.trace.json.gz"


def _error_lines(err: str) -> list[str]:
    assert "Traceback" not in err, err
    return [line for line in err.splitlines() if line.startswith("tuner: error:")]


def _one_error(capsys) -> str:
    """The command's stderr ends with its one error line; returns it."""
    captured = capsys.readouterr()
    errors = _error_lines(captured.err)
    assert len(errors) == 1 and captured.err.strip().splitlines()[-1] == errors[0], captured.err
    return errors[0]


@pytest.fixture
def shapes(tmp_path):
    return shapetable.write(_table([(1, 14336, 4096, 200.0, 32.0)]), tmp_path / "shapes.parquet")


@pytest.fixture
def fakes(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "tests"))


def test_search_without_a_gpu_says_so_before_asking_for_a_device(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(gpus, "have_gpu", lambda: False)
    table = _table([(1, 14336, 4096, 200.0, 32.0)]).assign(device="Some Unknown GPU")
    path = shapetable.write(table, tmp_path / "shapes.parquet")
    for extra in ([], ["--gpus", "0"], ["--gpus", "0,1", "--device", "h200"]):
        assert main(["search", str(path), "--family", "gemv", *extra]) == 2
        line = _one_error(capsys)
        assert "needs a GPU" in line and "--device" not in line, line
    assert not (tmp_path / "artifacts").exists()


def test_gpu_ids_the_machine_does_not_have_are_refused(monkeypatch):
    monkeypatch.setattr(gpus, "have_gpu", lambda: True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    search.require_gpu(["0", "1"])
    with pytest.raises(TunerError, match="no GPU 2 here"):
        search.require_gpu(["1", "2"])


def test_search_whose_every_trial_failed_exits_non_zero_and_says_why(shapes, tmp_path, capsys,
                                                                     fakes):
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    rc = main(["search", str(shapes), "--device", "h200", "--storage", url, "--trials", "3",
               "--gpus", "0", "--objective", "test_search:make_failing", "--no-progress"])
    assert rc == 2
    out = capsys.readouterr()
    assert "m=1,n=14336,k=4096,dtype=bfloat16" in out.out  # the summary is printed first
    errors = _error_lines(out.err)
    assert errors == [errors[-1]] and out.err.strip().splitlines()[-1] == errors[0]
    assert "every one of the 3 measured trials failed" in errors[0]
    assert "ptxas fatal: unsupported arch" in errors[0]


def test_search_whose_workers_all_died_exits_non_zero_and_says_why(shapes, tmp_path, capsys,
                                                                   fakes):
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    rc = main(["search", str(shapes), "--device", "h200", "--storage", url, "--trials", "3",
               "--gpus", "0", "--objective", "test_search:make_broken", "--no-progress"])
    assert rc == 2
    captured = capsys.readouterr()
    errors = _error_lines(captured.err)
    assert len(errors) == 1 and "every worker died" in errors[0]
    assert "CUDA driver initialization failed" in errors[0]
    assert "giving that GPU up" in captured.err  # the warning when it happened


def test_no_shape_worth_a_search_names_min_saving_and_graph_captured(capsys, fakes):
    base = ["search", str(EXAMPLE), "--device", "h200", "--objective", "test_search:make_fake"]
    assert main(base) == 2
    line = _one_error(capsys)
    assert "lower --min-saving" in line and "add --graph-captured" in line
    assert "launch-bound (GPU busy 7% of the step)" in line and "5 gemv shape(s)" in line
    # budgeted against the GPU-busy step already: only the threshold is left to lower
    assert main(base + ["--graph-captured", "--min-saving", "50%"]) == 2
    line = _one_error(capsys)
    assert "lower --min-saving" in line and "--graph-captured" not in line


@pytest.mark.parametrize("case", ["under a file", "a directory", "garbage file", "postgres down"])
def test_bad_storage_urls_end_with_one_error_line(case, shapes, tmp_path, capsys, fakes):
    if case == "under a file":
        (tmp_path / "file").write_text("x")
        url, expect = f"sqlite:///{tmp_path / 'file' / 'studies.db'}", "cannot create the folder"
    elif case == "a directory":
        (tmp_path / "dir.db").mkdir()
        url, expect = f"sqlite:///{tmp_path / 'dir.db'}", "is a directory"
    elif case == "garbage file":
        (tmp_path / "junk.db").write_bytes(bytes(range(256)) * 64)
        url, expect = f"sqlite:///{tmp_path / 'junk.db'}", "not a database"
    else:
        url, expect = "postgresql://tuner:s3cret@127.0.0.1:1/tuner", "127.0.0.1"
    rc = main(["search", str(shapes), "--device", "h200", "--storage", url, "--trials", "2",
               "--gpus", "0", "--objective", "test_search:make_fake", "--no-progress"])
    assert rc == 2
    line = _one_error(capsys)
    assert "cannot open the study storage" in line and expect in line, line
    assert "s3cret" not in line


def test_search_given_a_trace_names_it_and_the_command_that_takes_it(capsys, fakes):
    assert main(["search", str(TRACE), "--device", "h200",
                 "--objective", "test_search:make_fake"]) == 2
    line = _one_error(capsys)
    assert "is a profiler trace, not a shape table" in line and "tuner harvest" in line


def test_a_plain_path_as_storage_is_a_sqlite_file(shapes, tmp_path, capsys, fakes):
    path = tmp_path / "plain" / "studies.db"
    assert main(["search", str(shapes), "--device", "h200", "--storage", str(path),
                 "--trials", "2", "--gpus", "0", "--objective", "test_search:make_fake",
                 "--no-progress"]) == 0
    assert path.is_file() and path.stat().st_size > 0
