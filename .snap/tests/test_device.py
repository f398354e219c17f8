"""Device detection through faked device properties, profiles, `tuner device` without a GPU, and
(GPU only) the measurements and the timing protocol on real hardware.

This module never sets TRITON_INTERPRET, so its gpu tests can run alone on a GPU machine:
    python -m pytest -q -m gpu tests/test_device.py
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from tuner import device
from tuner.cli import main
from tuner.errors import TunerError


def _props(**fields):
    return SimpleNamespace(**fields)


H200 = _props(name="NVIDIA H200", multi_processor_count=132, L2_cache_size=50331648,
              major=9, minor=0, warp_size=32, total_memory=150_000_000_000)
MI300X = _props(name="AMD Instinct MI300X", multi_processor_count=304, L2_cache_size=4194304,
                gcnArchName="gfx942:sramecc+:xnack-", warp_size=64, major=9, minor=4)
# A Hygon DCU as torch reports it on ROCm; older torch builds have no warp_size attribute.
HYGON = _props(name="K100_AI", multi_processor_count=120, L2_cache_size=8388608,
               gcnArchName="gfx936:sramecc+:xnack-", major=9, minor=3)
MI250_NO_L2 = _props(name="AMD Instinct MI250X", multi_processor_count=110,
                     gcnArchName="gfx90a:sramecc+:xnack-")


def test_cuda_h200_from_props():
    f = device.detect_fields(H200, hip_version=None, cuda_version="12.8")
    assert f == {"backend": "cuda", "vendor": "nvidia", "name": "NVIDIA H200", "arch": "sm90",
                 "warp_size": 32, "multiprocessors": 132, "l2_bytes": 50331648, "is_dcu": False}


def test_rocm_mi300x_is_amd_wave64():
    f = device.detect_fields(MI300X, hip_version="6.4.43482", cuda_version=None)
    assert (f["backend"], f["vendor"], f["arch"], f["warp_size"], f["is_dcu"]) == \
        ("hip", "amd", "gfx942", 64, False)
    assert f["multiprocessors"] == 304 and f["l2_bytes"] == 4194304


@pytest.mark.parametrize("arch", ["gfx926", "gfx928", "gfx936", "gfx938"])
def test_hygon_arches_are_dcu(arch):
    props = _props(**{**vars(HYGON), "gcnArchName": f"{arch}:sramecc+:xnack-"})
    f = device.detect_fields(props, hip_version="5.7.24164", cuda_version=None)
    assert f["is_dcu"] and f["vendor"] == "hygon" and f["arch"] == arch
    assert f["warp_size"] == 64  # no warp_size attribute: wave64 on ROCm


def test_missing_optional_attributes():
    f = device.detect_fields(MI250_NO_L2, hip_version="6.0", cuda_version=None)
    assert f["arch"] == "gfx90a" and f["l2_bytes"] == 0 and not f["is_dcu"]
    with pytest.raises(TunerError):
        device.detect_fields(_props(name="mystery"), hip_version=None, cuda_version=None)


def test_profile_roundtrip_with_notes(tmp_path):
    fields = device.detect_fields(H200, None, "12.8")
    profile = device.DeviceProfile(**fields, read_bandwidth_bytes_per_s=4.3e12,
                                   bf16_matmul_flops_per_s=7.0e14, versions={"torch": "x"},
                                   measured_at="2026-11-29T12:00:00+00:00",
                                   notes={"read_bandwidth": {"buffer_bytes": 1}})
    path = device.save_profile(profile, tmp_path)
    assert path.name == "nvidia-h200.json"
    loaded = device.load_profile(path)
    assert loaded == profile
    assert device.load_profile("nvidia-h200", directory=tmp_path) == profile
    text = device.describe(loaded)
    assert "sm90" in text and "4.300 TB/s" in text
    # a profile written before `notes` existed still loads
    data = json.loads(path.read_text())
    data.pop("notes")
    (tmp_path / "old.json").write_text(json.dumps(data))
    assert device.load_profile(tmp_path / "old.json").notes == {}


def test_spec_profiles_still_load():
    assert device.load_profile("h200").source == "spec"


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


@pytest.mark.skipif(_has_gpu(), reason="checks the no-GPU path")
def test_tuner_device_without_gpu_is_one_line_exit_2(capsys, tmp_path):
    rc = main(["device", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("tuner: error: no CUDA or ROCm GPU")
    assert not list(tmp_path.iterdir())
    rc = main(["bench", "--shape", "m=1,n=64,k=64"])
    assert rc == 2


# --------------------------------------------------------------------------------------- GPU
def _compiled_kernels_or_skip():
    from tuner_kernels import gemv

    if type(gemv._gemv_kernel).__name__ == "InterpretedFunction" or \
            os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("kernels were imported under TRITON_INTERPRET=1: run `pytest -m gpu "
                    "tests/test_device.py` alone")


@pytest.mark.gpu
def test_gpu_measure_profile(tmp_path):
    _compiled_kernels_or_skip()
    profile = device.measure(buffer_bytes=2 << 30, matmul_size=8192)
    notes = profile.notes["read_bandwidth"]
    # the streaming Triton read is the measurement; torch.sum is only a floor (measured on the
    # H200: 4.28-4.58 TB/s streaming against 0.75 TB/s for torch's int32 -> int64 sum)
    a, b = notes["triton_stream_bytes_per_s"], notes["torch_sum_bytes_per_s"]
    assert a >= 0.9 * b
    # the profile's bandwidth is the read curve's slope where that is higher (tuner.ceilings)
    slope = profile.notes["read_curve"]["slope_bytes_per_s"]
    assert profile.read_bandwidth_bytes_per_s == max(a, b, slope)
    assert notes["from"] == ("read curve slope" if slope > max(a, b) else "event-timed stream")
    assert 1e11 < profile.read_bandwidth_bytes_per_s < 2e13
    assert 1e13 < profile.bf16_matmul_flops_per_s < 1e16
    assert profile.l2_bytes > 0 and profile.multiprocessors > 0
    # the read curve: every size read by some reader, and the read latency a line under all of it
    points = profile.notes["read_curve"]["points"]
    assert len(points) >= 5 and all(p["us"] > 0 and p["reader"] for p in points)
    bw = profile.read_bandwidth_bytes_per_s
    assert 0 < profile.read_latency_us < 20
    assert all(profile.read_latency_us + p["bytes"] / bw * 1e6 <= p["us"] * (1 + 1e-9)
               for p in points)
    print(device.describe(profile))


@pytest.mark.gpu
def test_gpu_gemv_matches_reference_and_is_deterministic():
    _compiled_kernels_or_skip()
    from tuner_kernels import get_family
    from tuner import bench, parity

    fam = get_family("gemv")
    backend = bench.backend_name()
    for m, n, k in [(1, 4096, 4096), (3, 1000, 3000), (8, 14336, 5120), (4, 37, 100)]:
        shape = {"m": m, "n": n, "k": k, "dtype": "bfloat16"}
        checker = parity.Checker(fam, shape)
        for config in [fam.default_config(shape, backend),
                       {"ROWS_PER_BLOCK": 2, "BLOCK_K": 256, "SPLIT_K": 4, "num_warps": 4},
                       {"ROWS_PER_BLOCK": 32, "BLOCK_K": 128, "SPLIT_K": 2, "num_warps": 4,
                        "USE_DOT": 1, "num_stages": 3}]:  # bf16 tl.dot: GPU-only check
            if backend != "cuda":
                config = {**config, "waves_per_eu": 0}
            first = checker.facts(config)
            again = checker.facts(config)
            assert first.passes("accuracy"), (shape, config, first.describe())
            assert first.parity_class == again.parity_class  # reproducible bytes
        base = checker.baseline_facts()
        assert base.bitwise_vs_baseline and base.error_ratio == 1.0


@pytest.mark.gpu
def test_gpu_protocol_aa_and_cold_vs_warm():
    _compiled_kernels_or_skip()
    from tuner_kernels import get_family
    from tuner import bench

    fam = get_family("gemv")
    shape = {"m": 1, "n": 4096, "k": 4096, "dtype": "bfloat16"}  # 32 MiB: fits a 50 MiB L2
    aa = bench.aa_noise(fam, shape, "default", cache="cold")
    print(f"A/A default {aa.speedup:.4f} [{aa.speedup_low:.4f}, {aa.speedup_high:.4f}]")
    assert 0.97 < aa.speedup < 1.03
    cold = bench.time_baseline(fam, shape, cache="cold")
    warm = bench.time_baseline(fam, shape, cache="warm")
    print(f"torch linear 4096x4096: cold {cold.median_us:.2f} us, warm {warm.median_us:.2f} us")
    assert cold.rotated_bytes > 2 * bench.l2_bytes()
    assert cold.median_us >= 0.98 * warm.median_us
