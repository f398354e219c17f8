"""tuner export and the runtime loader: round trip, refusals, nearest m, hit counts, atomicity.

Verdicts come from tuner.rank.decide on recorded numbers; the kernel hash and the default configs
are the real tuner_kernels.gemv ones. Only the device identity is given (this machine has no GPU).
"""

from __future__ import annotations

import json
import os


import pytest  # noqa: E402

from tuner_kernels import get_family  # noqa: E402
from tuner import export, rank, runtime  # noqa: E402
from tuner.cli import main  # noqa: E402
from tuner.errors import TunerError  # noqa: E402
from tuner.spaces import space_for  # noqa: E402
from tuner.parity import ParityFacts  # noqa: E402

GEMV = get_family("gemv")
IDENTITY = {"key": "nvidia-h200", "name": "NVIDIA H200", "arch": "sm90", "backend": "cuda",
            "torch": "2.11.0+cu130", "triton": "3.6.0"}
STEP_US = 2198.0


def tuned(shape: dict, rows: int) -> dict:
    """A config of the gemv cuda space for `shape` with ROWS_PER_BLOCK = rows (the loader drops
    configs the space does not allow)."""
    configs = [c for c in space_for("gemv", "cuda").configs(shape) if c["ROWS_PER_BLOCK"] == rows]
    return min(configs, key=lambda c: sorted(c.items()))


# recorded parity facts of a candidate in the default config's class, as accurate as torch
RECORDED_FACTS = ParityFacts(False, True, "a1b2c3d4e5f60718", "a1b2c3d4e5f60718", 1.6e-3, 1.5e-3,
                             1.07, 0, 3)


def verdicts(entries, identity=IDENTITY, kernel_hash=None, mode="accuracy"):
    """A verdict table with one accepted row per (m, n, k, rows, saving per call)."""
    studies = []
    for m, n, k, rows, saving in entries:
        shape = {"m": m, "n": n, "k": k, "dtype": "bfloat16"}
        key = GEMV.shape_key(shape)
        s = rank.StudyInfo(name=f"{identity['key']}:gemv:{key}", family="gemv", shape=shape,
                           shape_key=key, device=identity["key"], calls_per_step=48.0,
                           step_us=STEP_US, phase="decode")
        c = rank.Candidate(config=tuned(shape, rows), search_us=4.0, trial=1)
        base = 4.0 + saving
        m_ = rank.Measured(config=c.config, parity=RECORDED_FACTS,
                           vs_baseline=rank.Pair(base, 4.0, base / 4.0, base / 4.0 - 0.02,
                                                 base / 4.0 + 0.02, 0.6))
        studies.append((s, [(c, m_)]))
    table = rank.decide(studies, threshold="1us", gate=mode)
    assert (table["decision"] == "accept").all()
    table["device_name"] = identity["name"]
    table["arch"] = identity["arch"]
    table["backend"] = identity["backend"]
    table["torch"] = identity["torch"]
    table["triton"] = identity["triton"]
    table["kernel_hash"] = kernel_hash or GEMV.source_hash()
    table["fp_fusion"] = True
    table["measured_at"] = "2026-11-29T12:00:00+00:00"
    return table


@pytest.fixture
def loader(monkeypatch, tmp_path):
    """The runtime loader reading tmp_path/export/nvidia-h200, on 'an H200'."""
    monkeypatch.setattr(runtime, "current_identity", lambda: dict(IDENTITY))
    monkeypatch.setenv("TUNER_EXPORT_DIR", str(tmp_path / "export" / "nvidia-h200"))
    runtime.reset()
    yield tmp_path / "export"
    runtime.reset()


ENTRIES = [(1, 896, 896, 2, 0.5), (4, 896, 896, 4, 0.6), (4, 4864, 896, 8, 0.8)]


def test_export_files_and_manifest(loader):
    written = export.export(verdicts(ENTRIES), out_root=loader)
    names = [p.name for p in written]
    assert names == ["gemv.json", "manifest.json"]  # the manifest last
    doc = json.loads((loader / "nvidia-h200" / "gemv.json").read_text())
    assert doc["device"] == {"key": "nvidia-h200", "name": "NVIDIA H200", "arch": "sm90",
                             "backend": "cuda"}
    assert doc["versions"] == {"torch": "2.11.0+cu130", "triton": "3.6.0"}
    assert doc["kernel_hash"] == GEMV.source_hash()
    assert doc["compile_options"] == {"enable_fp_fusion": True}
    assert doc["parity_mode"] == "accuracy"
    entry = doc["configs"]["m=4,n=4864,k=896,dtype=bfloat16"]
    assert entry["config"]["ROWS_PER_BLOCK"] == 8
    assert entry["measured"]["saving_us_per_token"] == pytest.approx(0.8 * 48)
    assert entry["measured"]["baseline_us"] == pytest.approx(4.8)
    manifest = json.loads((loader / "nvidia-h200" / "manifest.json").read_text())
    import hashlib

    gemv = manifest["families"]["gemv"]
    assert gemv["entries"] == 3
    assert gemv["sha256"] == hashlib.sha256(
        (loader / "nvidia-h200" / "gemv.json").read_bytes()).hexdigest()


def test_round_trip_exact_and_hit_counts(loader):
    export.export(verdicts(ENTRIES), out_root=loader)
    shape = {"m": 4, "n": 4864, "k": 896, "dtype": "bfloat16"}
    for _ in range(5):
        assert runtime.config_for("gemv", shape) == tuned(shape, 8)
    assert runtime.hit_counts() == {"gemv": {"m=4,n=4864,k=896,dtype=bfloat16": 5}}
    assert runtime.status()["gemv"].startswith("loaded: 3 entries")
    runtime.reset(counts_only=True)
    assert runtime.hit_counts() == {}


def test_loaded_once_then_cached(loader):
    export.export(verdicts(ENTRIES), out_root=loader)
    shape = {"m": 4, "n": 4864, "k": 896, "dtype": "bfloat16"}
    first = runtime.config_for("gemv", shape)
    (loader / "nvidia-h200" / "gemv.json").unlink()  # no re-read on the hot path
    assert runtime.config_for("gemv", shape) is first
    assert runtime.config_for("gemv", {"m": 1, "n": 896, "k": 896, "dtype": "bfloat16"}) == \
        tuned({"m": 1, "n": 896, "k": 896, "dtype": "bfloat16"}, 2)


def test_nearest_m_same_other_keys(loader):
    export.export(verdicts(ENTRIES), out_root=loader)
    base = {"n": 896, "k": 896, "dtype": "bfloat16"}
    assert runtime.config_for("gemv", {"m": 2, **base})["ROWS_PER_BLOCK"] == 2  # nearest m=1
    assert runtime.config_for("gemv", {"m": 3, **base})["ROWS_PER_BLOCK"] == 4  # nearest m=4
    assert runtime.config_for("gemv", {"m": 8, **base})["ROWS_PER_BLOCK"] == 4
    # torch dtypes as the serving entry point may pass them
    import torch

    assert runtime.config_for("gemv", {"m": 1, "n": 896, "k": 896,
                                       "dtype": torch.bfloat16})["ROWS_PER_BLOCK"] == 2
    assert runtime.hit_counts() == {"gemv": {"m=1,n=896,k=896,dtype=bfloat16": 2,
                                             "m=4,n=896,k=896,dtype=bfloat16": 2}}
    # other n, or other dtype: the family default, counted as a miss
    other = {"m": 4, "n": 1024, "k": 896, "dtype": "bfloat16"}
    assert runtime.config_for("gemv", other) == GEMV.default_config(other, "cuda")
    fp16 = {"m": 4, "n": 896, "k": 896, "dtype": "float16"}
    assert runtime.config_for("gemv", fp16) == GEMV.default_config(fp16, "cuda")
    assert runtime.miss_counts()["gemv"] == {"m=4,n=1024,k=896,dtype=bfloat16": 1,
                                             "m=4,n=896,k=896,dtype=float16": 1}


@pytest.mark.parametrize("field,value", [
    ("device", "NVIDIA H100 80GB HBM3"),
    ("arch", "sm80"),
    ("triton", "3.5.1"),
    ("kernel_hash", "ffffffffffffffff"),
])
def test_mismatched_export_is_refused_with_one_warning(loader, caplog, field, value):
    export.export(verdicts(ENTRIES), out_root=loader)
    path = loader / "nvidia-h200" / "gemv.json"
    doc = json.loads(path.read_text())
    if field == "device":
        doc["device"]["name"] = value
    elif field == "arch":
        doc["device"]["arch"] = value
    elif field == "triton":
        doc["versions"]["triton"] = value
    else:
        doc["kernel_hash"] = value
    path.write_text(json.dumps(doc))
    caplog.clear()
    shapes = [{"m": m, "n": n, "k": k, "dtype": "bfloat16"} for m, n, k, _, _ in ENTRIES]
    for _ in range(3):
        for shape in shapes:
            assert runtime.config_for("gemv", shape) == GEMV.default_config(shape, "cuda")
    warnings = runtime_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "refusing" in warnings[0] and value in warnings[0]
    assert runtime.hit_counts() == {}
    assert sum(runtime.miss_counts()["gemv"].values()) == 9


def runtime_warnings(caplog) -> list[str]:
    """The runtime loader's warnings: through logging ('tuner.runtime'), not the CLI's printer."""
    return [r.getMessage() for r in caplog.records
            if r.name == "tuner.runtime" and r.levelname == "WARNING"]


def test_missing_export_warns_once_and_uses_defaults(loader, caplog):
    shape = {"m": 4, "n": 4864, "k": 896, "dtype": "bfloat16"}
    assert runtime.config_for("gemv", shape) == GEMV.default_config(shape, "cuda")
    assert runtime.config_for("gemv", shape) == GEMV.default_config(shape, "cuda")
    warnings = runtime_warnings(caplog)
    assert len(warnings) == 1 and "no export" in warnings[0]


def test_export_dir_default_is_per_device(monkeypatch):
    monkeypatch.delenv("TUNER_EXPORT_DIR", raising=False)
    assert str(runtime.export_dir(IDENTITY)) == os.path.join("artifacts", "export", "nvidia-h200")
    assert runtime.device_key_for("AMD Instinct MI300X") == "amd-instinct-mi300x"


def test_atomic_write_leaves_no_partial_file(tmp_path, monkeypatch):
    target = tmp_path / "gemv.json"
    export.atomic_write_json(target, {"configs": {"old": 1}})
    before = target.read_bytes()

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    from tuner import tables

    monkeypatch.setattr(tables.os, "fsync", broken_fsync)
    with pytest.raises(OSError):
        export.atomic_write_json(target, {"configs": {"new": 2}})
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gemv.json"]
    monkeypatch.undo()
    with pytest.raises(TypeError):  # not JSON: fails before touching the disk
        export.atomic_write_json(tmp_path / "other.json", {"x": object()})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gemv.json"]


def test_export_refuses_changed_kernel_and_empty_verdicts(tmp_path):
    with pytest.raises(TunerError, match="kernel source changed"):
        export.export(verdicts(ENTRIES, kernel_hash="0000000000000000"), out_root=tmp_path)
    table = verdicts(ENTRIES)
    table["decision"] = "reject"
    with pytest.raises(TunerError, match="no accepted configs"):
        export.export(table, out_root=tmp_path)
    assert not any(tmp_path.iterdir())


def test_vllm_format_keyed_by_m(tmp_path):
    written = export.export(verdicts(ENTRIES), out_root=tmp_path, formats=("native", "vllm"))
    vllm = tmp_path / "nvidia-h200" / "vllm" / "gemv"
    files = sorted(p.name for p in vllm.iterdir())
    assert files == ["N=4864,K=896,device_name=NVIDIA_H200,dtype=bfloat16.json",
                     "N=896,K=896,device_name=NVIDIA_H200,dtype=bfloat16.json"]
    data = json.loads((vllm / files[1]).read_text())
    assert list(data) == ["1", "4"]
    assert data["4"]["ROWS_PER_BLOCK"] == 4 and data["1"]["ROWS_PER_BLOCK"] == 2
    assert written[-1].name == "manifest.json"


def test_manifest_keeps_other_families(tmp_path):
    directory = tmp_path / "nvidia-h200"
    export.atomic_write_json(directory / "gemm.json", {"configs": {}})
    export.atomic_write_json(directory / "manifest.json", {
        "format": "tuner-export/1", "families": {"gemm": {"file": "gemm.json", "entries": 0},
                                                 "attention": {"file": "attention.json"}}})
    export.export(verdicts(ENTRIES), out_root=tmp_path)
    manifest = json.loads((directory / "manifest.json").read_text())
    assert sorted(manifest["families"]) == ["gemm", "gemv"]  # attention's file is gone


def test_export_cli_from_verdict_files(tmp_path, capsys):
    parquet, _ = rank.write(verdicts(ENTRIES), tmp_path / "verdicts", "nvidia-h200-gemv")
    rc = main(["export", str(parquet), "-o", str(tmp_path / "export"), "--format", "vllm"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "gemv.json: 3 config(s)" in out
    assert (tmp_path / "export" / "nvidia-h200" / "manifest.json").exists()
    rc = main(["export", str(tmp_path / "missing.parquet")])
    assert rc == 2 and "verdict table not found" in capsys.readouterr().err


def test_linear_uses_the_export_under_the_interpreter(loader):
    """tuner.serving.linear asks the loader; the exported entry is hit and the output is right."""
    import torch

    from tuner import serving

    shape = {"m": 2, "n": 40, "k": 64, "dtype": "bfloat16"}
    config = {"ROWS_PER_BLOCK": 4, "BLOCK_K": 64, "SPLIT_K": 1, "num_warps": 1, "num_stages": 1,
              "USE_DOT": 0, "BALANCE_N": 0}
    assert space_for("gemv", "cuda").check(config, shape) == ""
    table = verdicts([(2, 40, 64, 4, 0.5)])
    table["config"] = json.dumps(config, sort_keys=True, separators=(",", ":"))
    export.export(table, out_root=loader)
    inputs = GEMV.make_inputs(shape, "cpu", seed=3)
    out = serving.linear(inputs["x"], inputs["weight"])
    ref = GEMV.reference(inputs)
    assert torch.allclose(out.float(), ref, rtol=2e-2, atol=2e-2)
    assert runtime.hit_counts() == {"gemv": {"m=2,n=40,k=64,dtype=bfloat16": 1}}


def test_lookup_misses_are_none_so_serving_runs_the_baseline(loader):
    """A shape with no exported entry has no evidence that any Triton config beats torch: the
    serving entry points get None and run the baseline path (not the untuned default config)."""
    export.export(verdicts(ENTRIES), out_root=loader)
    other = {"m": 4, "n": 1024, "k": 896, "dtype": "bfloat16"}
    assert runtime.lookup("gemv", other) is None
    assert runtime.lookup("gemv", {"m": 2, "n": 896, "k": 896, "dtype": "bfloat16"}) == \
        tuned({"m": 1, "n": 896, "k": 896, "dtype": "bfloat16"}, 2)
    assert runtime.miss_counts()["gemv"] == {"m=4,n=1024,k=896,dtype=bfloat16": 1}
    assert runtime.lookup("gemm", {"m": 512, "n": 896, "k": 896, "dtype": "bfloat16",
                                   "layout": "NT"}) is None  # no gemm export at all


def test_serving_entry_points_run_torch_on_a_miss(loader):
    import torch

    from tuner_kernels import attention
    from tuner import serving

    export.export(verdicts(ENTRIES), out_root=loader)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(17, 40, generator=g).to(torch.bfloat16)
    w = torch.randn(33, 40, generator=g).to(torch.bfloat16)
    assert torch.equal(serving.linear(x, w), torch.nn.functional.linear(x, w))
    q = torch.randn(2, 8, 64, generator=g).to(torch.bfloat16)
    k = torch.randn(2, 2, 70, 64, generator=g).to(torch.bfloat16)
    v = torch.randn(2, 2, 70, 64, generator=g).to(torch.bfloat16)
    assert torch.equal(serving.decode_attention(q, k, v), attention.baseline({"q": q, "k": k, "v": v}))
    misses = runtime.miss_counts()
    assert misses["gemm"] == {"m=17,n=33,k=40,dtype=bfloat16,layout=NT": 1}
    assert len(misses["attention"]) == 1


def test_vllm_files_keep_bias_and_plain_linears_apart():
    doc = {"device": {"name": "NVIDIA H200"}, "family": "gemv", "configs": {
        "a": {"shape": {"m": 4, "n": 896, "k": 896, "dtype": "bfloat16"}, "config": {"R": 1}},
        "b": {"shape": {"m": 4, "n": 896, "k": 896, "dtype": "bfloat16", "bias": 1},
              "config": {"R": 2}}}}
    files = export.vllm_documents(doc)
    assert files == {
        "N=896,K=896,device_name=NVIDIA_H200,dtype=bfloat16.json": {"4": {"R": 1}},
        "N=896,K=896,device_name=NVIDIA_H200,dtype=bfloat16,bias=1.json": {"4": {"R": 2}}}


def test_a_regrouped_attention_call_exports_and_resolves_as_the_served_call(loader):
    """harvest --kv-heads gives the shape a measurement key (baseline_kv_heads: the baseline
    repeats the cache as the trace did); the export stores, and the loader indexes, the call
    serving looks up. On the H200 an entry that kept the key was never found: every call of
    the compiled Qwen3-8B batch-32 step missed (4622 us of attention a step, not 362)."""
    attention = get_family("attention")
    served = {"batch": 32, "heads": 32, "kv_heads": 8, "kv_len": 162, "head_dim": 128,
              "dtype": "bfloat16"}
    measured = {**served, "baseline_kv_heads": 32}
    key = attention.shape_key(measured)
    config = {"BLOCK_N": 64, "HEADS_PER_BLOCK": 4, "SPLIT_KV": 1, "num_warps": 4, "num_stages": 3}
    assert key == attention.shape_key(served) and not space_for("attention", "cuda").check(
        config, measured)
    s = rank.StudyInfo(name=f"nvidia-h200:attention:{key}", family="attention", shape=measured,
                       shape_key=key, device="nvidia-h200", calls_per_step=36.0, step_us=STEP_US,
                       phase="decode")
    c = rank.Candidate(config=config, search_us=9.7, trial=1)
    m_ = rank.Measured(config=config, parity=RECORDED_FACTS,
                       vs_baseline=rank.Pair(126.8, 9.7, 13.07, 13.05, 13.1, 0.2))
    table = rank.decide([(s, [(c, m_)])], threshold="1us", gate="accuracy")
    assert (table["decision"] == "accept").all()
    for column, value in (("device_name", "NVIDIA H200"), ("arch", "sm90"), ("backend", "cuda"),
                          ("torch", "2.11.0+cu130"), ("triton", "3.6.0"),
                          ("kernel_hash", attention.source_hash()), ("fp_fusion", True),
                          ("measured_at", "2026-12-01T18:40:00+00:00")):
        table[column] = value
    export.export(table, out_root=loader)
    doc = json.loads((loader / "nvidia-h200" / "attention.json").read_text())
    assert doc["configs"][key]["shape"] == served
    assert runtime.config_for("attention", served) == config
    assert runtime.hit_counts() == {"attention": {key: 1}}
    assert runtime.resolve("attention", measured) == (config, key)   # a shape_from_row shape

    # an export written before the fix (the key in the entry's shape) resolves the same way
    doc["configs"][key]["shape"] = measured
    path = loader / "nvidia-h200" / "attention.json"
    path.write_text(json.dumps(doc))
    runtime.reset()
    loaded = runtime.load_family("attention")
    assert loaded.status == "refused"   # its manifest's checksum no longer matches ...
    manifest = json.loads((loader / "nvidia-h200" / "manifest.json").read_text())
    import hashlib

    manifest["families"]["attention"]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (loader / "nvidia-h200" / "manifest.json").write_text(json.dumps(manifest))
    runtime.reset()
    assert runtime.config_for("attention", served) == config   # ... with it mended, a hit


def test_an_m_without_an_entry_takes_the_nearest_bucket_and_the_export_says_the_rule(loader):
    """gemm entries at a decode size (m = 16) and a prefill chunk (m = 512, 2048): a call at
    m = 200 takes m = 512's entry (its power-of-two bucket 256 is one octave from 512's, four
    from 16's) though 16 is nearer in m; m = 1500 (bucket 2048) takes 2048's; m = 24 takes 16's;
    m = 64 (two octaves from 16's bucket and from 512's) and m = 9000 (three from 2048's) take
    none: the baseline path."""
    from test_serving import write_export

    from tuner_kernels import gemm

    base = {"n": 4096, "k": 4096, "dtype": "bfloat16", "layout": "NT"}
    configs = {16: {"BLOCK_M": 16, "num_stages": 4}, 512: {"BLOCK_M": 128, "SCHEDULE": 1},
               2048: {"BLOCK_M": 128, "SCHEDULE": 2}}
    entries = []
    for m, change in configs.items():
        shape = {"m": m, **base}
        entries.append(("gemm", shape, {**gemm.default_config(shape, "cuda"), "TMA": 1, **change}))
    write_export(loader, entries)
    doc = json.loads((loader / "nvidia-h200" / "gemm.json").read_text())
    assert doc["m_bucket_rule"] == runtime.M_BUCKET_RULE == "pow2"
    assert sorted(e["m_bucket"] for e in doc["configs"].values()) == [16, 512, 2048]
    assert [runtime.m_bucket(m) for m in (1, 8, 9, 128, 129, 8192)] == [1, 8, 16, 128, 256, 8192]
    for m, served in ((200, 512), (1500, 2048), (24, 16), (300, 512), (4096, 2048)):
        _config, key = runtime.resolve("gemm", {"m": m, **base})
        assert key.startswith(f"m={served},"), (m, key)
    assert runtime.M_NEAREST_OCTAVES == 1
    for m in (64, 9000):
        assert runtime.resolve("gemm", {"m": m, **base}) == (None, None), m
    # the m a compiled step routes (tuner.serving's decision): exactly the m that resolve serves
    ranges = runtime.served_m_ranges("gemm", dict(base, batch=None))
    assert ranges == [(5, 32), (129, 4096)]  # buckets 8..32 (16's); 256..2048 (512's), ..4096
    for m in range(1, 10000):
        served = runtime.resolve("gemm", {"m": m, **base})[0] is not None
        assert served == any(low <= m <= high for low, high in ranges), m
    assert runtime.served_m_ranges("gemm", dict(base, n=1024)) == []


def test_the_kernel_hash_reads_the_code_not_its_comments_or_docstrings(tmp_path):
    """An export survives an edit of a family module's comments, docstrings or layout and is
    refused after an edit of any statement: the hash is of the code (code_digest)."""
    import dataclasses

    from tuner_kernels import code_digest

    base = b'"""doc"""\nimport math\n\n\ndef f(a):\n    """f doc"""\n    return a + 1  # one\n'
    same = b'"""other"""\nimport math\n\ndef f(a):\n    # a comment\n    return (a +\n            1)\n'
    changed = b'"""doc"""\nimport math\n\n\ndef f(a):\n    """f doc"""\n    return a + 2\n'
    assert code_digest(base) == code_digest(same) != code_digest(changed)
    path = tmp_path / "family.py"
    family = dataclasses.replace(GEMV, source_files=(path,))
    hashes = []
    for source in (base, same, changed):
        path.write_bytes(source)
        hashes.append(family.source_hash())
    assert hashes[0] == hashes[1] != hashes[2]
