"""The read curve (tuner.ceilings): the readers read every byte, the fitted read latency is the
line under every point, and the budget's floor and `tuner device`'s profile carry it.

The readers run on the CPU interpreter (TRITON_INTERPRET=1, tiny buffers: their times mean
nothing there); the tma reader's descriptor path runs there too. What they measure on the H200
is in BENCHMARKS.md (scripts/gpu/read_ceiling.py)."""

from __future__ import annotations

import dataclasses
import json
import math
import os

import pandas as pd
import pytest
import torch

from tuner import budget, ceilings, device, shapetable
from tuner.device import DeviceProfile, load_profile

interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="interpreter tests need TRITON_INTERPRET=1 at import")


@interpreter
@pytest.mark.parametrize("name", list(ceilings.READERS))
def test_every_reader_sums_every_value_of_the_buffer(name):
    torch.manual_seed(0)
    buf = ceilings.read_sets(1 << 20, 1, "cpu")[0]["buf"]  # 4 chunks of 256 KiB
    expected = int(buf.to(torch.int64).sum())
    paths = (True, False) if ceilings.READERS[name][0] == "tma" else (False,)
    for use_desc in paths:
        partials = ceilings.reader_call(name, sms=3, use_desc=use_desc)({"buf": buf})
        assert int(partials.to(torch.int64).sum()) == expected, (name, use_desc)


def test_read_sets_are_whole_chunks_of_random_values():
    sets = ceilings.read_sets(3 * ceilings.CHUNK_BYTES + 1000, 2, "cpu")
    assert len(sets) == 2
    assert all(s["buf"].numel() * 4 == 3 * ceilings.CHUNK_BYTES for s in sets)
    assert not torch.equal(sets[0]["buf"], sets[1]["buf"])  # fresh values, never zeros
    assert ceilings.read_sets(10, 1, "cpu")[0]["buf"].numel() * 4 == ceilings.CHUNK_BYTES


@interpreter
def test_measure_read_curve_keeps_the_fastest_reader_and_records_failures():
    readers = ["stream-4096x16-w8", "tma-16x256-s4-p2"]
    curve = ceilings.measure_read_curve([256 << 10], readers=readers, device="cpu", cache="warm",
                                        groups=1, replays=1, target_graph_us=1.0, min_calls=1)
    (point,) = curve["points"]
    assert point["bytes"] == 256 << 10
    assert set(point["readers"]) == set(readers)
    assert point["reader"] in readers
    assert point["us"] == min(v for v in point["readers"].values() if isinstance(v, float))
    assert "one buffer" in curve["method"]


def test_fit_is_the_largest_latency_under_every_point():
    bw = 4e12  # bytes/s: 4 MB a µs
    points = [{"bytes": 4e6, "us": 3.0}, {"bytes": 40e6, "us": 12.5}, {"bytes": 400e6, "us": 101.5}]
    # gaps: 3 - 1 = 2, 12.5 - 10 = 2.5, 101.5 - 100 = 1.5 -> 1.5
    assert ceilings.fit(points, bw) == pytest.approx(1.5)
    assert all(ceilings.fit(points, bw) + p["bytes"] / bw * 1e6 <= p["us"] + 1e-9 for p in points)
    # a point faster than the bandwidth allows (a drifting bandwidth reading) clips it at zero
    assert ceilings.fit([{"bytes": 400e6, "us": 90.0}], bw) == 0.0
    # failed points are skipped; nothing measured is no latency
    assert ceilings.fit([{"bytes": 4e6, "us": float("nan")}], bw) == 0.0
    assert ceilings.fit([], bw) == 0.0


def _decode_row(**overrides) -> dict:
    row = dict(op="aten::mm", family="gemm", phase="decode", m=1, n=4096, k=4096, batch=1,
               dtype="bfloat16", layout="NT", calls=720, steps=10, calls_per_step=72.0,
               us_per_call=12.0, step_us=20_000.0, step_gpu_us=20_000.0, share=0.04,
               kernels="nvjet", source="hand-built", device="NVIDIA H200")
    row.update(overrides)
    return row


def test_budget_floor_adds_the_read_latency():
    h200 = load_profile("h200")  # spec: 4.8e12 B/s, no read latency
    assert h200.read_latency_us == 0.0
    rows = shapetable.normalize(pd.DataFrame([_decode_row()]))
    plain = budget.compute(rows, h200)
    nbytes = (4096 * 4096 + 4096 + 4096) * 2
    assert plain.at[0, "floor_us"] == pytest.approx(nbytes / 4.8e12 * 1e6)
    timed = budget.compute(rows, dataclasses.replace(h200, read_latency_us=2.5))
    assert timed.at[0, "floor_us"] == pytest.approx(2.5 + nbytes / 4.8e12 * 1e6)
    # the headroom shrinks by the latency on every call of the step
    assert (plain.at[0, "headroom_us_per_token"] - timed.at[0, "headroom_us_per_token"]
            == pytest.approx(2.5 * 72))
    # the compute term does not get it: a prefill GEMM stays at flops / rate
    big = shapetable.normalize(pd.DataFrame([_decode_row(m=8192, phase="prefill")]))
    flops_us = 2 * 8192 * 4096 * 4096 / 989e12 * 1e6
    assert budget.compute(big, dataclasses.replace(h200, read_latency_us=2.5)).at[0, "floor_us"] \
        == pytest.approx(flops_us)


def test_profile_with_read_curve_roundtrips_and_describes(tmp_path):
    fields = device.detect_fields(type("P", (), {"name": "NVIDIA H200", "multi_processor_count": 132,
                                                  "L2_cache_size": 60 << 20, "major": 9,
                                                  "minor": 0})(), None, "13.0")
    points = [{"bytes": 32 << 20, "us": 10.0, "reader": "stream-4096x8-w8", "readers": {}},
              {"bytes": 128 << 20, "us": 33.0, "reader": "tma-32x256-s4-p1", "readers": {}}]
    profile = DeviceProfile(**fields, read_bandwidth_bytes_per_s=4.4e12,
                            bf16_matmul_flops_per_s=7.9e14,
                            notes={"read_curve": {"points": points, "latency_us": 2.1}},
                            read_latency_us=2.1)
    path = device.save_profile(profile, tmp_path)
    assert device.load_profile(path) == profile
    text = device.describe(profile)
    assert "2.10 us a read kernel" in text and "32 MiB 10.0 us" in text
    # a profile written before the field still loads, with no latency
    data = json.loads(path.read_text())
    data.pop("read_latency_us")
    (tmp_path / "old.json").write_text(json.dumps(data))
    assert device.load_profile(tmp_path / "old.json").read_latency_us == 0.0
    assert "read latency not measured" in device.describe(load_profile("h200"))


def test_slope_is_the_least_squares_rate_over_the_big_sizes():
    # the H200's cold read curve of 2026-12-01 (scripts/gpu/read_ceiling.py, BENCHMARKS.md): the
    # fastest reader's µs at 8 MiB .. 2 GiB
    mib = 1 << 20
    measured = {8: 4.27, 32: 9.19, 48: 12.75, 96: 23.68, 112: 27.28, 192: 45.67, 224: 52.70,
                512: 117.15, 1024: 231.03, 2048: 458.32}
    points = [{"bytes": m * mib, "us": us} for m, us in measured.items()]
    bw, intercept = ceilings.slope(points)
    assert bw == pytest.approx(4.706e12, rel=2e-3)  # the script's least squares: 4.706 TB/s
    assert intercept == pytest.approx(2.50, abs=0.05)
    latency = ceilings.fit(points, bw)
    assert 1.5 < latency < intercept  # the line under every point, 8 MiB included
    assert all(latency + p["bytes"] / bw * 1e6 <= p["us"] + 1e-9 for p in points)
    # a 117 MB weight: no reader beat 91.6% of that bandwidth
    assert 112 * mib / (measured[112] * 1e-6) / bw == pytest.approx(0.915, abs=0.005)
    # too few big points, or a line that does not rise: no slope
    assert math.isnan(ceilings.slope(points[:1])[0])
    assert math.isnan(ceilings.slope([{"bytes": 64 * mib, "us": 20.0},
                                      {"bytes": 128 * mib, "us": 19.0}])[0])


def _compile_readers(_request: dict) -> list:
    """In a child without TRITON_INTERPRET (tuner_kernels.common.run_without_interpreter): every
    persistent reader's launch for a 96 MiB buffer (meta tensors), compiled for sm90 (TMA
    descriptors for the tma kind) and gfx942 (pointer loads): [backend, reader, shared bytes,
    bulk tensor copies, cp.async copies]."""
    import re

    from triton.backends.compiler import GPUTarget

    from tuner_kernels import common

    common._TORCH_TO_TRITON.setdefault(torch.int32, "i32")  # the readers' buffers are int32
    buf = torch.empty((96 << 20) // 4, dtype=torch.int32, device="meta")
    out = []
    for target in (GPUTarget("cuda", 90, 32), GPUTarget("hip", "gfx942", 64)):
        for name, (kind, _meta, _warps, _per_sm) in ceilings.READERS.items():
            if kind == "stream":
                continue
            call, _ = ceilings.reader_plan(name, buf, 132, use_desc=target.backend == "cuda")
            report = common.compile_call(call, target, with_asm=True)
            out.append([target.backend, name, report.shared,
                        len(re.findall(r"cp\.async\.bulk\.tensor", report.asm)),
                        len(re.findall(r"cp\.async\.c[ga]", report.asm))])
    return out


def test_the_persistent_readers_compile_to_pipelined_copies_for_sm90_and_gfx942():
    """Offline (no GPU): on sm90 the tma readers stream their tiles with bulk tensor copies
    (TMA) through STAGES - 1 shared-memory buffers, the cpasync reader with cp.async; on gfx942
    both compile with pointer loads (the path `measure_read_curve` takes on hip)."""
    from tuner_kernels.common import run_without_interpreter

    rows = {(backend, name): (shared, bulk, cpasync) for backend, name, shared, bulk, cpasync
            in run_without_interpreter("tests.test_ceilings:_compile_readers", {})}
    for name, (kind, meta, _w, _p) in ceilings.READERS.items():
        if kind == "stream":
            continue
        shared, bulk, cpasync = rows[("cuda", name)]
        tile = meta["BLOCK_R"] * ceilings.TMA_COLUMNS * 4
        assert shared >= (meta["STAGES"] - 1) * tile, (name, shared)
        if kind == "tma":
            assert bulk > 0 and cpasync == 0, name
        else:
            assert bulk == 0 and cpasync > 0, name
        assert ("hip", name) in rows
