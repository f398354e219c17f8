"""`tuner export --format vllm|sglang` for the moe family: the files are found and read by the
engines' own documented rules (get_config_file_name, get_moe_configs, try_get_optimal_moe_config
in vLLM's fused_moe and SGLang's fused_moe_triton), re-implemented here from those rules, and
every key of every entry is checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner_kernels import get_family
from tuner import export, rank
from tuner.cli import main
from tuner.parity import ParityFacts
from tuner.spaces import space_for

MOE = get_family("moe")
IDENTITY = {"key": "nvidia-h200", "name": "NVIDIA H200", "arch": "sm90", "backend": "cuda",
            "torch": "2.11.0+cu130", "triton": "3.6.0"}
QWEN = {"experts": 128, "topk": 8, "hidden": 2048, "inter": 768, "dtype": "bfloat16"}
FACTS = ParityFacts(False, True, "a1b2c3d4e5f60718", "a1b2c3d4e5f60718", 1.6e-3, 1.5e-3, 1.07, 0, 3)
ENGINE_KEYS = {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps",
               "num_stages"}


def tuned(shape: dict, index: int, split_k: int = 1, split_up: int = 1, gemv: int = 0) -> dict:
    """The index-th config of the moe cuda space for `shape` with SPLIT_K = split_k,
    SPLIT_K_UP = split_up and GEMV = gemv."""
    configs = [c for c in space_for("moe", "cuda").configs(shape)
               if c["SPLIT_K"] == split_k and c["SPLIT_K_UP"] == split_up and c["GEMV"] == gemv]
    return sorted(configs, key=lambda c: sorted(c.items()))[index]


def verdicts(entries) -> "pd.DataFrame":
    """One accepted verdict row per (shape, config, saving µs per call)."""
    studies = []
    for shape, config, saving in entries:
        key = MOE.shape_key(shape)
        s = rank.StudyInfo(name=f"nvidia-h200:moe:{key}", family="moe", shape=shape,
                           shape_key=key, device="nvidia-h200", calls_per_step=48.0,
                           step_us=9000.0, phase="decode")
        c = rank.Candidate(config=config, search_us=40.0, trial=1)
        base = 40.0 + saving
        m_ = rank.Measured(config=config, parity=FACTS,
                           vs_baseline=rank.Pair(base, 40.0, base / 40, base / 40 - 0.02,
                                                 base / 40 + 0.02, 0.6))
        studies.append((s, [(c, m_)]))
    table = rank.decide(studies, threshold="1us", gate="accuracy")
    assert (table["decision"] == "accept").all()
    for column in ("arch", "backend", "torch", "triton"):
        table[column] = IDENTITY[column]
    table["device_name"] = IDENTITY["name"]
    table["kernel_hash"] = MOE.source_hash()
    table["fp_fusion"] = True
    table["measured_at"] = "2026-12-03T12:00:00+00:00"
    return table


# ------------------------------------------ the engines' lookup, as their sources document it
def engine_file_name(E: int, N: int, torch_device_name: str, engine: str) -> str:
    """get_config_file_name(E, N, dtype=None) for bf16 / fp16 (config dtype string None): spaces
    in the device name become underscores; vLLM maps every H200 variant to NVIDIA_H200."""
    device_name = torch_device_name.replace(" ", "_")
    if engine == "vllm" and "H200" in device_name.split("_"):
        device_name = "NVIDIA_H200"
    return f"E={E},N={N},device_name={device_name}.json"


def engine_lookup(folder: Path, engine: str, w2_shape: tuple, M: int, torch_device_name: str,
                  triton_version: str) -> dict | None:
    """try_get_optimal_moe_config: E, _, N = w2_shape; the file from the config folder (vLLM:
    VLLM_TUNED_CONFIG_FOLDER; SGLang: configs/triton_<version with _>/); keys int(key) (vLLM
    drops a 'triton_version' key first, SGLang does not); the key nearest to M, the first of
    equally near ones in file order."""
    E, _, N = w2_shape
    name = engine_file_name(E, N, torch_device_name, engine)
    path = folder / name if engine == "vllm" else (
        folder / f"triton_{triton_version.replace('.', '_')}" / name)
    if not path.exists():
        return None
    tuned_config = json.loads(path.read_text())
    if engine == "vllm":
        tuned_config.pop("triton_version", None)
    configs = {int(key): val for key, val in tuned_config.items()}
    return configs[min(configs.keys(), key=lambda x: abs(x - M))]


ENTRIES = [({**QWEN, "m": 1}, 0, 3.0), ({**QWEN, "m": 8}, 1, 2.0), ({**QWEN, "m": 64}, 2, 5.0)]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("device_name", ["NVIDIA H200", "NVIDIA H200 NVL"])
def test_engine_resolves_the_exported_file_by_its_own_rules(tmp_path, engine, device_name):
    entries = [(shape, tuned(shape, i), saving) for shape, i, saving in ENTRIES]
    table = verdicts(entries)
    table["device_name"] = device_name
    export.export(table, out_root=tmp_path, formats=("native", engine))
    folder = tmp_path / "nvidia-h200" / engine / "moe"
    w2_shape = (QWEN["experts"], QWEN["hidden"], QWEN["inter"])
    by_m = {shape["m"]: config for shape, config, _ in entries}
    # each measured m resolves to its own config; other m to the nearest measured one (ties:
    # the smaller, first in the file)
    expected_m = {1: 1, 2: 1, 4: 1, 5: 8, 8: 8, 36: 8, 37: 64, 64: 64, 4096: 64}
    for M, nearest in expected_m.items():
        got = engine_lookup(folder, engine, w2_shape, M, device_name, IDENTITY["triton"])
        assert got is not None, f"{engine} finds no file for {device_name}"
        assert set(got) == ENGINE_KEYS  # every key the kernel reads, nothing it would choke on
        assert all(type(v) is int and v > 0 for v in got.values())
        assert got == {k: by_m[nearest][k] for k in ENGINE_KEYS}, (M, nearest)
    (only,) = [p for p in folder.rglob("*.json")]
    data = json.loads(only.read_text())
    assert list(data) == ["1", "8", "64"]  # the m the verdicts measured, no others


def test_entries_the_engine_kernel_cannot_run_are_left_out_with_a_warning(tmp_path, capsys):
    split, split_up, gemv = {**QWEN, "m": 16}, {**QWEN, "m": 4}, {**QWEN, "m": 2}
    entries = [({**QWEN, "m": 1}, tuned({**QWEN, "m": 1}, 0), 3.0),
               (split, tuned(split, 0, split_k=2), 2.0),
               (split_up, tuned(split_up, 0, split_up=4), 2.5),
               (gemv, tuned(gemv, 0, gemv=1), 4.0)]
    export.export(verdicts(entries), out_root=tmp_path, formats=("native", "vllm"))
    (path,) = (tmp_path / "nvidia-h200" / "vllm" / "moe").iterdir()
    assert list(json.loads(path.read_text())) == ["1"]
    err = capsys.readouterr().err
    assert "SPLIT_K 2" in err and "SPLIT_K_UP 4" in err and "GEMV" in err
    # the native file keeps all four
    native = json.loads((tmp_path / "nvidia-h200" / "moe.json").read_text())
    assert len(native["configs"]) == 4


def test_export_cli_writes_the_sglang_layout(tmp_path, capsys):
    entries = [(shape, tuned(shape, i), saving) for shape, i, saving in ENTRIES]
    parquet, _ = rank.write(verdicts(entries), tmp_path / "verdicts", "nvidia-h200-moe")
    rc = main(["export", str(parquet), "-o", str(tmp_path / "export"), "--format", "sglang"])
    out = capsys.readouterr().out
    assert rc == 0
    expected = (tmp_path / "export" / "nvidia-h200" / "sglang" / "moe" / "triton_3_6_0"
                / "E=128,N=768,device_name=NVIDIA_H200.json")
    assert expected.exists()
    assert "SGLang layout" in out
    assert not (tmp_path / "export" / "nvidia-h200" / "vllm").exists()


def test_file_names_follow_the_engines_naming():
    assert export.moe_config_file_name(8, 7168, "NVIDIA_H100_80GB_HBM3") == \
        "E=8,N=7168,device_name=NVIDIA_H100_80GB_HBM3.json"
    assert export.moe_config_file_name(8, 7168, "X", dtype="fp8_w8a8").endswith(",dtype=fp8_w8a8.json")
    assert export.engine_device_name("NVIDIA H200 NVL", "vllm") == "NVIDIA_H200"
    assert export.engine_device_name("NVIDIA H200 NVL", "sglang") == "NVIDIA_H200_NVL"
    assert export.engine_device_name("NVIDIA H100 80GB HBM3", "vllm") == "NVIDIA_H100_80GB_HBM3"
