"""The runtime loader never takes a serving process down: one test per corruption.

Each case starts from a real export (tuner.export of verdicts from tuner.rank.decide, as in
test_export_runtime), corrupts it the way a disk, an editor or a killed process would, and checks
what the serving process sees: the baseline path (`lookup` -> None), exactly one warning through
logging ("tuner.runtime"), and the good entries of a file still served.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_export_runtime import ENTRIES, IDENTITY, runtime_warnings, verdicts
from tuner import export, runtime

GOOD = {"m": 4, "n": 4864, "k": 896, "dtype": "bfloat16"}
OTHER = {"m": 1, "n": 896, "k": 896, "dtype": "bfloat16"}


@pytest.fixture
def exported(monkeypatch, tmp_path):
    monkeypatch.setattr(runtime, "current_identity", lambda: dict(IDENTITY))
    directory = tmp_path / "export" / "nvidia-h200"
    monkeypatch.setenv("TUNER_EXPORT_DIR", str(directory))
    runtime.reset()
    export.export(verdicts(ENTRIES), out_root=tmp_path / "export")
    yield directory
    runtime.reset()


def resign(directory: Path) -> None:
    """Make the manifest vouch for the family file as it is now (an export that wrote it so)."""
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["families"]["gemv"]["sha256"] = hashlib.sha256(
        (directory / "gemv.json").read_bytes()).hexdigest()
    (directory / "manifest.json").write_text(json.dumps(manifest))


def edit(directory: Path, change, sign: bool = True) -> None:
    path = directory / "gemv.json"
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))
    if sign:
        resign(directory)


def lookups(shapes=(GOOD, OTHER), times=3):
    return [[runtime.lookup("gemv", s) for s in shapes] for _ in range(times)][-1]


# ----------------------------------------------------------- whole-file corruptions: refused
def truncate(directory):
    data = (directory / "gemv.json").read_bytes()
    (directory / "gemv.json").write_bytes(data[: len(data) // 2])


FILE_FAULTS = {
    "truncated": (truncate, "cannot read"),
    "garbage bytes": (lambda d: (d / "gemv.json").write_bytes(b"\x00\xff" * 50), "cannot read"),
    "a list": (lambda d: (d / "gemv.json").write_text("[1, 2]"), "not a JSON object"),
    "configs not a mapping": (lambda d: edit(d, lambda doc: doc.update(configs=[1])),
                              "no 'configs' mapping"),
    "deep nesting": (lambda d: (d / "gemv.json").write_text("[" * 100000 + "]" * 100000),
                     "cannot read"),
    "a directory": (lambda d: ((d / "gemv.json").unlink(), (d / "gemv.json").mkdir()),
                    "not a regular file"),
    "device is a string": (lambda d: edit(d, lambda doc: doc.update(device="H200")), "refusing"),
    "manifest missing": (lambda d: (d / "manifest.json").unlink(), "no manifest.json"),
    "manifest garbage": (lambda d: (d / "manifest.json").write_text("{oops"),
                         "manifest.json is unreadable"),
    "manifest without the family": (
        lambda d: (d / "manifest.json").write_text(json.dumps({"families": {}})),
        "lists no gemv file"),
    "edited after export": (lambda d: edit(d, lambda doc: doc.update(parity_mode="tolerance"),
                                           sign=False), "the file changed after export"),
    "manifest kernel hash": (lambda d: (d / "manifest.json").write_text(json.dumps(
        {**json.loads((d / "manifest.json").read_text()), "families": {"gemv": {
            **json.loads((d / "manifest.json").read_text())["families"]["gemv"],
            "kernel_hash": "0" * 16}}})), "manifest.json kernel hash"),
    "manifest versions": (lambda d: (d / "manifest.json").write_text(json.dumps(
        {**json.loads((d / "manifest.json").read_text()),
         "versions": {"torch": "2.11.0+cu130", "triton": "3.5.0"}})), "manifest.json versions"),
}


@pytest.mark.parametrize("fault", FILE_FAULTS)
def test_a_corrupt_file_runs_the_baseline_with_one_warning(exported, caplog, fault):
    corrupt, needle = FILE_FAULTS[fault]
    corrupt(exported)
    caplog.clear()
    assert lookups() == [None, None]
    assert runtime.config_for("gemv", GOOD) == runtime.default_config("gemv", GOOD, "cuda")
    warnings = runtime_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert needle in warnings[0], warnings[0]
    assert runtime.hit_counts() == {}
    status = runtime.status()["gemv"]
    assert status.startswith(("refused", "unreadable")), status


# ----------------------------------------------------------- entry corruptions: dropped
def set_entry(key_part, change):
    def apply(doc):
        (key,) = [k for k in doc["configs"] if k.startswith(key_part)]
        change(doc["configs"], key)
    return apply


def config_change(**values):
    return set_entry("m=4,n=896,", lambda configs, key: configs[key]["config"].update(values))


ENTRY_FAULTS = {
    "BLOCK_K=3": (config_change(BLOCK_K=3), "BLOCK_K=3 is not in the gemv/cuda space"),
    "unknown key": (config_change(BLOCK_Q=4), "unknown parameter(s) BLOCK_Q"),
    "string value": (config_change(BLOCK_K="512"), "BLOCK_K='512' is not a number"),
    "NaN": (config_change(SPLIT_K=float("nan")), "SPLIT_K=nan is not a number"),
    "boolean": (config_change(USE_DOT=True), "USE_DOT=True is not a number"),
    "missing key": (set_entry("m=4,n=896,", lambda c, k: c[k]["config"].pop("num_warps")),
                    "missing parameter(s) num_warps"),
    "constraint": (config_change(SPLIT_K=16), "constraint"),
    "config not a mapping": (set_entry("m=4,n=896,", lambda c, k: c[k].update(config=[1])),
                             "config is not a mapping"),
    "entry not a mapping": (set_entry("m=4,n=896,", lambda c, k: c.update({k: "x"})),
                            "the entry is not a mapping"),
    "shape m is text": (set_entry("m=4,n=896,", lambda c, k: c[k]["shape"].update(m="4")),
                        "m='4' is not a positive integer"),
    "shape negative": (set_entry("m=4,n=896,", lambda c, k: c[k]["shape"].update(n=-896)),
                       "n=-896 is not a positive integer"),
    "shape dtype": (set_entry("m=4,n=896,", lambda c, k: c[k]["shape"].update(dtype="int8")),
                    "dtype 'int8'"),
    "shape lacks k": (set_entry("m=4,n=896,", lambda c, k: c[k]["shape"].pop("k")),
                      "shape lacks k"),
}


@pytest.mark.parametrize("fault", ENTRY_FAULTS)
def test_a_bad_entry_is_dropped_with_one_warning_and_the_rest_is_used(exported, caplog, fault):
    corrupt, needle = ENTRY_FAULTS[fault]
    edit(exported, corrupt)
    caplog.clear()
    bad = {"m": 4, "n": 896, "k": 896, "dtype": "bfloat16"}
    assert runtime.lookup("gemv", GOOD) is not None  # the good entries are still served
    for _ in range(3):
        found = runtime.lookup("gemv", bad)
        # the dropped entry never answers; nearest m (the m=1 entry) may
        assert found is None or found == runtime.lookup("gemv", OTHER)
    warnings = runtime_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "dropping entry" in warnings[0] and "m=4,n=896" in warnings[0]
    assert needle in warnings[0], warnings[0]
    assert runtime.status()["gemv"].startswith("loaded: 2 entries") and "(1 dropped)" in \
        runtime.status()["gemv"]


# ----------------------------------------------------------- what callers pass
@pytest.mark.parametrize("shape", [
    None, [], "m=4", {"m": [4], "n": 896}, {"m": object(), "n": 1}, {}, {"m": "x", "n": 896,
                                                                         "k": 896,
                                                                         "dtype": "bfloat16"},
])
def test_lookup_never_raises_on_what_a_caller_passes(exported, caplog, shape):
    assert runtime.lookup("gemv", shape) is None
    assert runtime.lookup("no-such-family", {"m": 1}) is None
    assert runtime.lookup("gemv", GOOD) is not None
    assert runtime.resolve("gemv", shape) == (None, None)


# ----------------------------------------------------------- a kill mid-write
KILL = r"""
import os, signal, sys
from tuner import export, tables
def die(fd):
    os.kill(os.getpid(), signal.SIGKILL)
tables.os.fsync = die
export.atomic_write_json(sys.argv[1], {"configs": {"new": 1}})
"""


def test_a_kill_mid_write_leaves_the_old_file_and_a_temp_file_nobody_trips_on(exported, caplog):
    path = exported / "gemv.json"
    before = path.read_bytes()
    proc = subprocess.run([sys.executable, "-c", KILL, str(path)], cwd=Path(__file__).parent.parent,
                          capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert path.read_bytes() == before
    temps = [p.name for p in exported.iterdir() if p.name.endswith(".tmp")]
    assert len(temps) == 1 and temps[0].startswith(".gemv.json."), temps
    caplog.clear()
    assert runtime.lookup("gemv", GOOD) is not None  # the loader reads the old file, no warning
    assert runtime_warnings(caplog) == []
    export.export(verdicts(ENTRIES), out_root=exported.parent)  # the next export cleans up
    assert sorted(p.name for p in exported.iterdir()) == ["gemv.json", "manifest.json"]
    for p in exported.iterdir():
        assert p.stat().st_mode & 0o777 == 0o644
    assert os.access(path, os.R_OK)
