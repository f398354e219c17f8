"""Fuzzing tuner harvest with malformed traces made from real ones.

Bases: the real MI250 (ROCm) and vLLM replay traces in ../shared/traces, a slice of the bundled
H200 example (shapes/examples) and the CPU tiny-decoder fixture. From them: truncations of the
gzip and of the JSON at many offsets, byte flips, wrong top-level types, events with missing or
wrongly typed ph/ts/dur/args/tid/name/correlation, negative, infinite or NaN durations, broken
dims, duplicate External ids and events, deep nesting. Each case must end with exit 0, a sane
table (no negative or NaN times, sizes or counts; no op counted twice) and a warning where the
damage is visible, or exit 2 and exactly one `tuner: error:` line; never a traceback. Cases run
in-process through tuner.cli.main. The test prints how many cases ended which way.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import io
import json
import math
import os
import random
import resource
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tuner import shapetable
from tuner.cli import main
from tuner.harvest import config
from tuner.harvest.shapes import is_attention

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "shapes" / "examples" / "qwen25_05b_b4_decode.pt.trace.json.gz"
CPU_TRACE = ROOT / "tests" / "fixtures" / "traces" / "cpu_tiny_decoder.pt.trace.json.gz"
KEPT = {"cpu_op", "kernel", "cuda_runtime", "gpu_memset", "gpu_memcpy", "user_annotation"}


def _example_slice() -> dict:
    """The first eighth of the bundled example's third step (3 decode layers), with the GPU
    activities its launches made."""
    trace = json.loads(gzip.open(EXAMPLE).read())
    events = trace["traceEvents"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                   if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep"))
    start, end = steps[2]
    end = start + (end - start) / 8
    cpu = [e for e in events if e.get("ph") == "X" and e.get("cat") != "kernel"
           and e.get("cat") not in ("gpu_memset", "gpu_memcpy") and start <= e["ts"] <= end]
    corrs = {e["args"].get("correlation") for e in cpu if e.get("cat") == "cuda_runtime"}
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")
           and e["args"].get("correlation") in corrs]
    marker = dict(next(e for e in events if e.get("name") == "ProfilerStep#3"), dur=end - start)
    meta = [e for e in events if e.get("ph") == "M"]
    kept = [e for e in cpu if e.get("name") != "ProfilerStep#3"]
    return dict(trace, traceEvents=meta + [marker] + kept + gpu)


@pytest.fixture(scope="module")
def bases(shared_traces) -> dict:
    def load(p):
        return json.loads(gzip.open(p).read())

    return {
        "mi250": load(shared_traces / "hta_mi250_rocm62_train.json.gz"),
        "vllm_replay": load(shared_traces /
                            "tracelens_mi300x_vllm_gptoss20b_decode_bs32_full_replay.json.gz"),
        "h200_slice": _example_slice(),
        "cpu_tiny": load(CPU_TRACE),
    }


# ------------------------------------------------------------------------------------ mutations
def _events(trace: dict) -> list:
    return trace["traceEvents"]


def _mutate_events(trace: dict, rng: random.Random, pick, change) -> dict:
    """A copy of `trace` where `change(event)` is applied to 30% of the events `pick` selects
    (at least one)."""
    out = copy.deepcopy(trace)
    chosen = [e for e in _events(out) if isinstance(e, dict) and pick(e)]
    assert chosen, "nothing to mutate"
    for e in rng.sample(chosen, max(1, int(0.3 * len(chosen)))):
        change(e)
    return out


def _is_op(e):
    return e.get("cat") == "cpu_op" and (e.get("name") in config.GEMM_OPS
                                         or is_attention(e.get("name", "")))


def _is_kept(e):
    return e.get("cat") in KEPT


def _gpu(e):
    return e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")


def _set(key, value):
    def change(e):
        e[key] = copy.deepcopy(value)
    return change


def _drop(key):
    def change(e):
        e.pop(key, None)
    return change


def _set_arg(key, value):
    def change(e):
        if isinstance(e.get("args"), dict):
            e["args"][key] = copy.deepcopy(value)
    return change


def _dims(value_of):
    def change(e):
        dims = e.get("args", {}).get("Input Dims")
        if isinstance(dims, list) and dims and isinstance(dims[0], list) and dims[0]:
            dims[0][0] = value_of(dims[0][0])
    return change


def _is_attention_op(e):
    return e.get("cat") == "cpu_op" and is_attention(e.get("name", ""))


def _dims_as_text(first: int):
    """Every size of the Input Dims entries from `first` on (the key, value, cache, offsets of
    an attention op) written as text: ["2", "2", "19", "16"]."""
    def change(e):
        dims = e.get("args", {}).get("Input Dims")
        if isinstance(dims, list):
            for i in range(first, len(dims)):
                if isinstance(dims[i], list) and dims[i]:
                    dims[i] = [str(x) for x in dims[i]]
    return change


EVENT_MUTATIONS = {
    # name: (pick, change); each is a visible damage: the run must warn or fail
    "ph missing": (_is_kept, _drop("ph")),
    "ph a number": (_is_kept, _set("ph", 88)),
    "ts missing": (_is_kept, _drop("ts")),
    "ts a string": (_is_kept, _set("ts", "soon")),
    "ts a list": (_is_kept, _set("ts", [1, 2])),
    "dur missing on kernels": (_gpu, _drop("dur")),
    "dur a string": (_is_kept, _set("dur", "3us")),
    "dur negative": (_is_kept, _set("dur", -5.0)),
    "dur infinite": (_is_kept, _set("dur", 1e400)),
    "dur enormous": (_is_kept, _set("dur", 1e300)),
    "args a list": (_is_kept, _set("args", [1, 2, 3])),
    "args a string": (_is_kept, _set("args", "none")),
    "name a number": (_is_kept, _set("name", 12)),
    "name a dict": (_is_kept, _set("name", {"a": 1})),
    "tid a list": (_is_kept, _set("tid", [1])),
    "tid a dict": (_is_kept, _set("tid", {"t": 1})),
    "correlation a list": (lambda e: e.get("cat") in ("kernel", "cuda_runtime"),
                           _set_arg("correlation", [7])),
    "correlation a dict": (lambda e: e.get("cat") in ("kernel", "cuda_runtime"),
                           _set_arg("correlation", {"c": 7})),
    "External id a list": (_is_kept, _set_arg("External id", [1])),
    "Input Dims a string": (_is_op, _set_arg("Input Dims", "[[4, 4]]")),
    "Input Dims negative": (_is_op, _dims(lambda d: -abs(d) - 1)),
    "Input Dims non-integer": (_is_op, _dims(lambda d: d + 0.5)),
    "Input Dims a string size": (_is_op, _dims(lambda d: "big")),
    "Input Dims huge": (_is_op, _dims(lambda d: 10 ** 30)),
    "Input Dims a bool": (_is_op, _dims(lambda d: True)),
    "Input type a list": (_is_op, _set_arg("Input type", [["c10::BFloat16"]])),
    "Input Strides strings": (_is_op, _set_arg("Input Strides", [["a", "b"], ["c"]])),
    "event a number": (_is_kept, None),
    # ops without their times: the nesting (linear > matmul > mm) is unknown; read as
    # zero-length, every level was a call (55 rows of 3563 calls from 21 of 1358)
    "dur missing on ops": (_is_op, _drop("dur")),
    "dur null on ops": (_is_op, _set("dur", None)),
    "Input Dims a zero": (_is_op, _dims(lambda d: 0)),              # was an m = 0 row
    "attention key dims as text": (_is_attention_op, _dims_as_text(1)),  # was kv_len 0
    "attention dims all text": (_is_attention_op, _dims_as_text(0)),
}
# What an event mutation may do to the table: lose calls (with a warning), never add calls or
# give a call a shape the undamaged trace has not (a zero, a lost KV length, a level counted).
SHAPE_KEY = ["family", "m", "n", "k", "heads", "kv_heads", "q_len", "kv_len", "head_dim"]


def _replace_with_number(trace: dict, rng: random.Random) -> dict:
    out = copy.deepcopy(trace)
    events = _events(out)
    for i in rng.sample(range(len(events)), max(1, len(events) // 5)):
        events[i] = 42
    return out


def _duplicate_ext(trace: dict, rng: random.Random) -> dict:
    out = copy.deepcopy(trace)
    for e in _events(out):
        if isinstance(e, dict) and _is_op(e) and isinstance(e.get("args"), dict):
            e["args"]["External id"] = 7
    return out


def _nan_text(trace: dict, rng: random.Random) -> bytes:
    out = copy.deepcopy(trace)
    for e in _events(out):
        if isinstance(e, dict) and _gpu(e):
            e["dur"] = math.nan
            break
    return json.dumps(out).encode()         # json writes NaN, which is no JSON


def _deep_args(depth: int):
    def make(trace: dict, rng: random.Random) -> bytes:
        text = json.dumps(trace)
        i = text.index('"args": {') + len('"args": {')
        return (text[:i] + '"deep": ' + "[" * depth + "]" * depth + ", " + text[i:]).encode()
    return make


events_only: set = set()   # the names of the cases made by EVENT_MUTATIONS


def cases(bases: dict) -> list:
    """[(name, bytes, must_warn, base name)]."""
    rng = random.Random(20260101)
    out = []
    for name, trace in bases.items():
        text = json.dumps(trace).encode()
        packed = gzip.compress(text)
        for frac in (0.02, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99):
            cut = max(20, int(len(packed) * frac))
            out.append((f"{name}: gzip cut at {cut}", packed[:cut], False, name))
            out.append((f"{name}: JSON cut at {int(len(text) * frac)}",
                        text[:int(len(text) * frac)], False, name))
        for _ in range(6):
            flipped = bytearray(text)
            for _ in range(rng.randint(1, 4)):
                flipped[rng.randrange(len(flipped))] = rng.randrange(256)
            out.append((f"{name}: byte flips", bytes(flipped), False, name))
        flipped = bytearray(packed)
        flipped[len(flipped) // 2] ^= 0xFF
        out.append((f"{name}: gzip byte flip", bytes(flipped), False, name))
        for what, (pick, change) in EVENT_MUTATIONS.items():
            if change is None:
                mutated = _replace_with_number(trace, rng)
            else:
                try:
                    mutated = _mutate_events(trace, rng, pick, change)
                except AssertionError:
                    continue     # e.g. a CPU-only trace has no kernels to break
            out.append((f"{name}: {what}", json.dumps(mutated).encode(), True, name))
            events_only.add(f"{name}: {what}")
        out.append((f"{name}: External ids all 7", json.dumps(_duplicate_ext(trace, rng)).encode(),
                    False, name))
        doubled = dict(trace, traceEvents=_events(trace) + _events(trace))
        out.append((f"{name}: every event twice", json.dumps(doubled).encode(), False, name))
        out.append((f"{name}: NaN duration", _nan_text(trace, rng), False, name))
        out.append((f"{name}: 5000-deep args", _deep_args(5000)(trace, rng), False, name))
    for top in ("[]", "{}", '"trace"', "1", "null", "true", '{"traceEvents": 5}',
                '{"traceEvents": {}}', '{"traceEvents": [1, 2, "x"]}', '{"traceEvents": null}',
                "[" * 2000 + "]" * 2000, '{"traceEvents": [' + "{" * 3 + "}" * 3 + "]}"):
        out.append((f"top level {top[:30]}", top.encode(), False, "none"))
    return out


# ---------------------------------------------------------------------------------------- checks
def _n_ops(data: bytes) -> int | None:
    """GEMM/attention CPU op events in the input (an upper bound on the calls), or None."""
    try:
        trace = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    except Exception:  # noqa: BLE001 - some inputs ijson reads are not json-module JSON
        return None
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    return sum(1 for e in events if isinstance(e, dict) and isinstance(e.get("name"), str)
               and (e["name"] in config.GEMM_OPS or is_attention(e["name"])))


def check_table(df, n_ops: int | None, name: str) -> None:
    assert len(df) > 0, name
    for col in ("m", "n", "k", "batch", "calls", "steps"):
        assert df[col].notna().all() and (df[col] >= 0).all(), (name, col)
    assert (df.calls >= 1).all() and (df.steps >= 1).all(), name
    cps = df.calls_per_step
    assert cps.map(math.isfinite).all() and (cps > 0).all(), name
    assert df.step_us.map(math.isfinite).all() and (df.step_us >= 0).all(), name
    for col in ("us_per_call", "step_gpu_us", "share"):
        values = df[col].dropna()
        assert values.map(math.isfinite).all() and (values >= 0).all(), (name, col)
    # a time is NaN only where no kernel was seen (CPU-only, or the call launched none)
    assert (df.us_per_call.notna() | (df.kernels == "")).all(), name
    for col in ("heads", "kv_heads", "q_len", "kv_len", "head_dim"):
        values = df[col].dropna()
        assert (values >= 1).all(), (name, col)       # unknown is NaN, never 0
    gemm = df[df.family == "gemm"]
    for col in ("m", "n", "k", "batch"):            # no empty-tensor shape
        assert (gemm[col] >= 1).all(), (name, col)
    if n_ops is not None:
        assert df.calls.sum() <= n_ops, f"{name}: {df.calls.sum()} calls from {n_ops} ops"


def _shapes(df) -> set:
    return {tuple(str(v) for v in r) for r in df[SHAPE_KEY].itertuples(index=False)}


def check_against_reference(df, ref, name: str) -> None:
    """A damaged trace's table never has more calls than the undamaged one's, nor a shape that
    one lacks."""
    assert df.calls.sum() <= ref.calls.sum(), (
        f"{name}: {df.calls.sum()} calls where the undamaged trace has {ref.calls.sum()}")
    new = _shapes(df) - _shapes(ref)
    assert not new, f"{name}: shapes the undamaged trace has not: {sorted(new)[:3]}"


def run_case(tmp_path: Path, name: str, data: bytes) -> tuple[int, str, str, Path]:
    trace = tmp_path / "case.json"
    trace.write_bytes(data)
    out = tmp_path / "case.parquet"
    if out.exists():
        out.unlink()
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        rc = main(["harvest", str(trace), "-o", str(out)])
    return rc, stdout.getvalue(), stderr.getvalue(), out


def test_fuzzed_traces_fail_cleanly_or_give_a_sane_table(bases, tmp_path, capsys):
    all_cases = cases(bases)
    assert len(all_cases) >= 100
    counts = {0: 0, 2: 0}
    reference: dict = {}
    for base, trace in bases.items():
        rc, _, _, out = run_case(tmp_path, base, json.dumps(trace).encode())
        reference[base] = shapetable.read(out) if rc == 0 else None
    for name, data, must_warn, base in all_cases:
        rc, out, err, table = run_case(tmp_path, name, data)
        assert "Traceback" not in err + out, name
        assert rc in counts, f"{name}: exit {rc}: {err}"
        counts[rc] += 1
        if rc == 2:
            lines = err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("tuner: error: "), (name, err)
            assert not table.exists(), name
            continue
        df = shapetable.read(table)
        check_table(df, _n_ops(data), name)
        if must_warn:
            assert "tuner: warning: " in err, f"{name}: the damage went unsaid"
        if name in events_only and reference[base] is not None:
            check_against_reference(df, reference[base], name)
        if name.endswith("every event twice") and reference[base] is not None:
            ref = reference[base]       # an op recorded twice is one call, a kernel one kernel
            assert list(df.calls) == list(ref.calls), name
            assert list(df.us_per_call.fillna(-1)) == list(ref.us_per_call.fillna(-1)), name
    with capsys.disabled():
        print(f"\nharvest fuzz: {len(all_cases)} malformed traces: {counts[0]} exit 0 with a "
              f"sane table, {counts[2]} exit 2 with one error line")
    assert counts[0] > 10 and counts[2] > 30


def test_fuzzed_traces_under_watch_are_said_once_and_not_read_again(bases, tmp_path, capsys,
                                                                     monkeypatch):
    """Every malformed trace of the suite that `tuner harvest` refuses, dropped into a folder
    `tuner harvest --watch` polls: one line names it (cut short: read again when it changes;
    otherwise skipped), it is read once over ten polls, the watch goes on (the table is never
    written from it), and none ends the watch."""
    from tuner.harvest import watching

    reads: list = []
    real = watching.read_trace
    monkeypatch.setattr(watching, "read_trace",
                        lambda path, **kw: reads.append(path.name) or real(path, **kw))
    monkeypatch.setattr(watching.time, "sleep", lambda seconds: None)
    refused = 0
    for i, (name, data, _, _) in enumerate(cases(bases)):
        if run_case(tmp_path, name, data)[0] != 2:
            continue
        refused += 1
        folder, out = tmp_path / f"watch{i}", tmp_path / f"watch{i}.parquet"
        folder.mkdir()
        (folder / "t.pt.trace.json").write_bytes(data)
        reads.clear()
        capsys.readouterr()
        assert watching.watch(folder, out, interval=1, max_polls=10) == 0, name
        err = capsys.readouterr().err
        said = [line for line in err.splitlines() if "t.pt.trace.json" in line]
        assert len(said) == 1 and said[0].startswith("tuner: warning: "), (name, err)
        assert ("read again when it changes" in said[0]) == ("ends early" in said[0]), said
        assert reads == ["t.pt.trace.json"], (name, reads)
        assert "Traceback" not in err and not out.exists(), name
    assert refused > 100


# --------------------------------------------------------------------------------------- memory
CHILD = """
import sys
from tuner.cli import main
print("exit", main(["harvest", sys.argv[1], "-o", sys.argv[2]]))
"""


def _limit_memory():      # a regression fails here, instead of taking the machine's memory
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


@pytest.mark.parametrize("where", ["args", "top"])
def test_memory_stays_bounded_on_100000_nested_brackets(tmp_path, where, capsys):
    """Before the nesting guard: 2.3 GB at 30,000 nested brackets, killed at 100,000."""
    n = 100_000
    if where == "args":
        text = '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "args": ' + "[" * n + "]" * n + "}]}"
    else:
        text = "[" * n + "]" * n
    trace = tmp_path / "deep.json"
    trace.write_text(text)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    with open(tmp_path / "out.txt", "w") as out, open(tmp_path / "err.txt", "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", CHILD, str(trace),
                                 str(tmp_path / "x.parquet")], stdout=out, stderr=err, env=env,
                                preexec_fn=_limit_memory)
        _, status, usage = os.wait4(proc.pid, 0)      # this child's own peak RSS
    peak_mb = usage.ru_maxrss / 1024
    out, err = (tmp_path / "out.txt").read_text(), (tmp_path / "err.txt").read_text()
    with capsys.disabled():
        print(f"\n{n} nested brackets ({where}): peak RSS {peak_mb:.0f} MB; {err.strip()}")
    assert os.waitstatus_to_exitcode(status) == 0 and "exit 2" in out, err
    assert "nested deeper than 1000 levels" in err and err.count("\n") == 1
    # the child's imports alone (pandas, torch through the CLI) take 250-400 MB; the parse
    # before the guard took 2.3 GB at 30,000 brackets and was killed at 100,000
    assert peak_mb < 1024


# ---------------------------------------------------- the damage classes one by one, on real traces
SHARED = ROOT.parent / "shared" / "traces"
VLLM_CAPTURE = SHARED / "tracelens_mi300x_vllm_gptoss20b_decode_bs32_full_capture.pt.trace.json.gz"


def _harvest(tmp_path: Path, trace: dict, *extra) -> tuple[int, str, Path]:
    """`tuner harvest` of `trace` (written as JSON) in process: (exit code, stderr, table)."""
    path, out = tmp_path / "damaged.json", tmp_path / "damaged.parquet"
    path.write_text(json.dumps(trace))
    if out.exists():
        out.unlink()
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        rc = main(["harvest", str(path), "-o", str(out), *extra])
    err = stderr.getvalue()
    assert "Traceback" not in err and "internal error" not in err, err
    return rc, err, out


def _only_error(rc: int, err: str, out: Path, *needles) -> str:
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("tuner: error: "), (rc, err)
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert not out.exists()
    return lines[0]


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("tuner: warning: ")]


@pytest.fixture(scope="module")
def example() -> dict:
    """The bundled H200 trace of Qwen2.5-0.5B (batch 4): 21 rows, 1358 calls, 3563 GEMM and
    attention op events (linear > matmul > mm, SDPA > cudnn > its forward)."""
    return json.loads(gzip.open(EXAMPLE).read())


@pytest.fixture(scope="module")
def example_table(example, tmp_path_factory) -> "object":
    rc, _, out = _harvest(tmp_path_factory.mktemp("reference"), example)
    assert rc == 0
    df = shapetable.read(out)
    assert (len(df), int(df.calls.sum())) == (21, 1358)
    return df


def _ops(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if isinstance(e, dict) and _is_op(e)]


def _per_shape(df) -> dict:
    """calls per (phase, family, m, n, k, batch): the op name of a row may change (a linear
    standing for the mm inside it), its shape may not."""
    return df.groupby(["phase", "family", "m", "n", "k", "batch"]).calls.sum().to_dict()


@pytest.mark.parametrize("key,value", [("dur", "missing"), ("dur", None), ("tid", [1])])
def test_ops_without_their_times_are_refused_not_counted_at_every_level(example, tmp_path, key,
                                                                         value):
    """Every GEMM/attention op without its dur (or thread): its nesting cannot be told. Read as
    zero-length, each level (linear, matmul, mm) was a call: 55 rows of 3563 calls where the
    trace has 21 of 1358, silently. Now one line, exit 2, no table."""
    trace = copy.deepcopy(example)
    ops = _ops(trace)
    assert len(ops) == 3563
    for e in ops:
        if value == "missing":
            e.pop(key)
        else:
            e[key] = value
    rc, err, out = _harvest(tmp_path, trace)
    _only_error(rc, err, out, "none of its 3563 GEMM/attention ops has a usable start time, "
                "duration and thread (ts, dur, tid)", "re-export the trace")


def test_some_ops_without_dur_lose_calls_with_a_warning_never_add_any(example, example_table,
                                                                     tmp_path):
    """A third of the op events without dur: those are skipped and said; a call survives where
    an op around or inside it kept its times (a linear without dur, its mm with). No shape
    gains a call, none appears that the trace lacks."""
    trace = copy.deepcopy(example)
    ops = _ops(trace)
    for e in random.Random(7).sample(ops, len(ops) // 3):
        del e["dur"]
    rc, err, out = _harvest(tmp_path, trace)
    assert rc == 0, err
    (said,) = [w for w in _warnings(err) if "malformed events skipped" in w]
    assert f"GEMM/attention ops without a usable ts, dur or tid: {len(ops) // 3}" in said
    assert "a call whose every op lacks its times is missing from the table" in said
    df, ref = shapetable.read(out), _per_shape(example_table)
    got = _per_shape(df)
    assert set(got) <= set(ref)
    assert all(calls <= ref[shape] for shape, calls in got.items())
    assert 0.8 * 1358 < df.calls.sum() < 1358      # most calls kept through their other level


def test_zero_dims_give_no_m0_rows(example, example_table, tmp_path):
    """The gate/up projections (n = 4864) with a zero first size in every op's dims: they were
    m = 0 rows (with kernel times, so budget kept one). Now those calls are skipped and said,
    every other row is as in the undamaged trace."""
    trace = copy.deepcopy(example)
    hit = 0
    for e in _ops(trace):
        dims = e["args"]["Input Dims"]
        out_features = {"aten::linear": 0, "aten::matmul": -1, "aten::mm": -1}.get(e["name"])
        if out_features is not None and dims[1][out_features] == 4864:   # weight [n, k] / [k, n]
            dims[0][0] = 0
            hit += 1
    assert hit
    rc, err, out = _harvest(tmp_path, trace)
    assert rc == 0, err
    df = shapetable.read(out)
    assert (df[df.family == "gemm"][["m", "n", "k", "batch"]] >= 1).all().all()
    gate_up = (example_table.n == 4864)
    skipped = int(example_table[gate_up].calls.sum())
    assert skipped == 6 * 48 + 48
    assert f"{skipped} GEMM/attention calls with a zero size in their dims" in err
    pd.testing.assert_frame_equal(
        df.drop(columns="source").reset_index(drop=True),
        example_table[~gate_up].drop(columns="source").reset_index(drop=True))

    for e in _ops(trace):                   # every call empty: nothing to harvest, one line
        for sizes in e["args"]["Input Dims"]:
            if sizes:
                sizes[0] = 0
    _only_error(*_harvest(tmp_path, trace), "no GEMM or attention call with a usable shape",
                "with a zero size in their dims")


@pytest.mark.parametrize("first", [1, 0])
def test_attention_dims_holding_text_are_skipped_not_rows_of_zeros(example, example_table,
                                                                   tmp_path, first):
    """The SDPA ops' key/value dims (first=1) or all their dims (first=0) written as text: with
    the key unread, the six decode attention rows merged into one of kv_len 0 (n = 0, kv_heads
    lost, 144 calls). Now those ops are skipped and said; the GEMM rows are untouched."""
    trace = copy.deepcopy(example)
    attention = [e for e in _ops(trace) if is_attention(e["name"])]
    assert len(attention) == 3 * 168           # SDPA > cudnn attention > its forward, 168 calls
    for e in attention:
        _dims_as_text(first)(e)
    rc, err, out = _harvest(tmp_path, trace)
    assert rc == 0, err
    df = shapetable.read(out)
    assert not (df.family == "attention").any()
    assert "504 GEMM/attention ops whose dims give no GEMM or attention shape" in err
    gemm = example_table[example_table.family == "gemm"]
    pd.testing.assert_frame_equal(df.drop(columns="source").reset_index(drop=True),
                                  gemm.drop(columns="source").reset_index(drop=True))


def test_paged_attention_with_a_damaged_key_is_skipped(tmp_path, shared_traces):
    """vLLM's unified attention in the real MI300X capture: q [32, 64, 64] with the key and the
    paged cache as text lost its KV heads silently. Now the call is skipped and said; the three
    linears and the MoE call of its layers stay."""
    trace = json.loads(gzip.open(shared_traces / VLLM_CAPTURE.name).read())
    rc, _, out = _harvest(tmp_path, trace)
    assert rc == 0
    ref = shapetable.read(out)
    assert ref[ref.family == "attention"].kv_heads.tolist() == [8]
    for e in trace["traceEvents"]:
        if isinstance(e, dict) and e.get("name") == "vllm::unified_attention_with_output":
            _dims_as_text(1)(e)
    rc, err, out = _harvest(tmp_path, trace)
    assert rc == 0, err
    df = shapetable.read(out)
    assert "24 GEMM/attention ops whose dims give no GEMM or attention shape" in err
    assert not (df.family == "attention").any()
    assert _per_shape(df) == _per_shape(ref[ref.family != "attention"])   # linears and MoE


def test_budget_never_keeps_an_empty_shape(tmp_path):
    """A shape table with m = 0 (an older harvest, another tool): budget prunes that row with
    its reason, where it kept it (the decode gate/up projection, 143 us/token of headroom)."""
    from tuner import budget
    from tuner.device import choose_profile

    table = shapetable.read(EXAMPLE.with_name("qwen25_05b_b4_decode.parquet"))
    profile = choose_profile("h200", [], gpu=False)[0]
    before = budget.compute(table, profile, graph_captured=True)
    gate_up = (before.phase == "decode") & (before.op == "aten::mm") & (before.n == 4864)
    assert before[gate_up].verdict.tolist() == ["keep"]
    damaged = table.copy()
    damaged.loc[(table.phase == "decode") & (table.op == "aten::mm") & (table.n == 4864), "m"] = 0
    path = tmp_path / "m0.parquet"
    shapetable.write(damaged, path)
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(["budget", str(path), "--device", "h200", "--graph-captured",
                     "-o", str(tmp_path / "b.parquet")]) == 0
    after = budget.read(tmp_path / "b.parquet")
    row = after[(after.phase == "decode") & (after.m == 0)]
    assert row.verdict.tolist() == ["prune"]
    assert row.reason.iloc[0].startswith("m = 0: a call on an empty tensor does no work")
    others = after[~((after.phase == "decode") & (after.m == 0))]
    assert (others.verdict == "keep").sum() == (before.verdict == "keep").sum() - 1
