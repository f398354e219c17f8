"""The gemv search spaces compile for real GPU targets on a CPU-only host (no GPU needed).

Triton 3.6 compiles for GPUTarget("hip", "gfx942", 64) to AMDGCN + hsaco and for
GPUTarget("cuda", 90, 32) to PTX + cubin. We read the register (VGPR), spill and LDS / shared
memory figures from the compiled kernel and assert they fit the hardware.

Compiles run in a child process when this pytest session imported Triton under
TRITON_INTERPRET=1 (the interpreter tests do): Triton's own jit functions are then interpreter
objects that cannot be compiled.

The default run compiles a representative subset (every k-th config of each space, plus the
configs with the largest register estimate, for m = 1 and m = 8 and a ragged shape). The whole hip
space (about 1440 + 950 + 180 configs for the three shapes, ~0.3-0.9 s each) is `slow`: run it with
TUNER_RUN_SLOW=1. Upstream Triton does not know Hygon's gfx926/928/936/938, so the dcu space is
compiled for gfx90a (CDNA2, wave64, 64 KiB LDS) as a proxy.
"""

from __future__ import annotations

import os

import pytest

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402

from tuner_kernels import gemv  # noqa: E402
from tuner_kernels.common import compile_configs  # noqa: E402
from tuner.spaces import space_for  # noqa: E402

GFX942 = GPUTarget("hip", "gfx942", 64)
GFX90A = GPUTarget("hip", "gfx90a", 64)  # DCU proxy
SM90 = GPUTarget("cuda", 90, 32)

LIMITS = {  # registers per lane, LDS / shared bytes per workgroup
    "gfx942": (512, 64 * 1024),  # 256 arch VGPRs + 256 AGPRs; 64 KiB LDS
    "gfx90a": (512, 64 * 1024),
    90: (255, 227 * 1024),
}

SHAPES = [
    {"m": 1, "n": 4096, "k": 4096, "dtype": "bfloat16"},
    {"m": 8, "n": 14336, "k": 4096, "dtype": "bfloat16"},
    {"m": 3, "n": 37, "k": 100, "dtype": "bfloat16"},  # ragged: the masked path
]


def _register_estimate(config: dict, shape: dict) -> int:
    return (shape["m"] + 1) * config["ROWS_PER_BLOCK"] * config["BLOCK_K"] // config["num_warps"]


def _representative(configs: list[dict], shape: dict, every: int, heaviest: int) -> list[dict]:
    ordered = sorted(configs, key=lambda c: sorted(c.items()))
    picked = ordered[::every]
    picked += sorted(configs, key=lambda c: -_register_estimate(c, shape))[:heaviest]
    unique = []
    for c in picked:
        if c not in unique:
            unique.append(c)
    return unique


def _check_all_fit(target, configs, shape, record_property):
    """Compile every config for target (in a child process when this session imported Triton
    under the interpreter) and assert registers, spills and LDS / shared memory fit."""
    rows = compile_configs("gemv", [(shape, c) for c in configs], target)
    max_regs, max_shared = LIMITS[target.arch]
    results = []
    for config, row in zip(configs, rows):
        assert not isinstance(row, str), (config, row)  # a failure reason
        res = row[0]  # the main kernel (a split-K reduce follows it)
        record_property(f"{target.arch}:{gemv.FAMILY.shape_key(shape)}:{config}", res)
        for report in row:
            assert 0 < report.n_regs <= max_regs, (config, report)
            assert report.n_spills == 0, (config, report)
            assert report.shared <= max_shared, (config, report)
        results.append(res)
    return results


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: gemv.FAMILY.shape_key(s))
def test_hip_space_subset_compiles_for_gfx942(shape, record_property):
    configs = space_for("gemv", "hip").configs(shape)
    assert configs
    picked = _representative(configs, shape, every=max(1, len(configs) // 6), heaviest=3)
    results = _check_all_fit(GFX942, picked, shape, record_property)
    assert all(r.wide_loads > 0 for r in results if shape["k"] % 64 == 0)


def test_waves_per_eu_reaches_the_amd_compiler(record_property):
    shape = SHAPES[0]
    base = {"ROWS_PER_BLOCK": 4, "BLOCK_K": 1024, "SPLIT_K": 1, "num_warps": 4, "num_stages": 1}
    loose, tight = _check_all_fit(GFX942, [{**base, "waves_per_eu": 0},
                                           {**base, "waves_per_eu": 4}], shape, record_property)
    assert tight.waves_per_eu_attr  # the occupancy hint reaches the LLVM IR
    assert tight.n_regs <= 128 < 512 and loose.n_regs > 0


@pytest.mark.parametrize("shape", SHAPES[:2], ids=lambda s: gemv.FAMILY.shape_key(s))
def test_cuda_space_sample_compiles_for_sm90(shape, record_property):
    configs = space_for("gemv", "cuda").configs(shape)
    picked = _representative(configs, shape, every=max(1, len(configs) // 4), heaviest=2)
    _check_all_fit(SM90, picked, shape, record_property)


def test_default_configs_load_w_with_wide_vectors(record_property):
    """The FMA variant's W tile loads compile to 16-byte vector loads (ld.global.v4 /
    global_load_dwordx4); the m = 4 default (the skinny kernel) loads W with TMA into wgmma."""
    shape = {"m": 1, "n": 14336, "k": 4096, "dtype": "bfloat16"}
    (cuda,) = _check_all_fit(SM90, [gemv.default_config(shape, "cuda", 132)], shape,
                             record_property)
    assert cuda.wide_loads > 0
    (hip,) = _check_all_fit(GFX942, [gemv.default_config(shape, "hip", 304)], shape,
                            record_property)
    assert hip.wide_loads > 0
    m4 = {**shape, "m": 4}
    dot = gemv.default_config(m4, "cuda", 132)
    assert dot["USE_DOT"] == 2  # the skinny kernel: W through TMA into wgmma
    ((res,),) = compile_configs("gemv", [(m4, dot)], SM90, with_asm=True)
    assert "wgmma" in res.asm and "cp.async.bulk.tensor" in res.asm and res.n_spills == 0


def test_dcu_space_sample_compiles_for_gfx90a_proxy(record_property):
    shape = SHAPES[0]
    configs = space_for("gemv", "dcu").configs(shape)
    assert all(c["BLOCK_K"] <= 1024 and c["waves_per_eu"] <= 2 for c in configs)
    assert all(c["ROWS_PER_BLOCK"] <= 8 for c in configs if not c["USE_DOT"])
    picked = _representative(configs, shape, every=max(1, len(configs) // 4), heaviest=1)
    _check_all_fit(GFX90A, picked, shape, record_property)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TUNER_RUN_SLOW") != "1",
                    reason="whole hip space: ~15-30 minutes of compiles; set TUNER_RUN_SLOW=1")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: gemv.FAMILY.shape_key(s))
def test_whole_hip_space_compiles_for_gfx942(shape, record_property):
    _check_all_fit(GFX942, space_for("gemv", "hip").configs(shape), shape, record_property)


# ------------------------------------------- the skinny (USE_DOT 2) and pipelined FMA variants
M1 = {"m": 1, "n": 14336, "k": 4096, "dtype": "bfloat16"}
SKINNY_CUDA = {"ROWS_PER_BLOCK": 128, "BLOCK_K": 128, "SPLIT_K": 1, "num_warps": 4,
               "num_stages": 4, "USE_DOT": 2, "BALANCE_N": 0}
PREFETCH = {"ROWS_PER_BLOCK": 1, "BLOCK_K": 1024, "SPLIT_K": 1, "num_warps": 4, "num_stages": 2,
            "USE_DOT": 0, "BALANCE_N": 0}
CP_ASYNC = {**PREFETCH, "num_stages": 3}


def test_skinny_variant_is_wgmma_fed_by_tma_on_sm90(record_property):
    """USE_DOT 2: the W tile is wgmma's M side, read by TMA (cp.async.bulk.tensor) into exactly
    num_stages shared-memory stages (+ barriers), with few registers and no spills; a split-K
    config adds the reduce kernel; a ragged k (rows not 16-byte aligned) takes the pointer
    kernel, still wgmma."""
    jobs = [(M1, SKINNY_CUDA), ({**M1, "m": 8}, {**SKINNY_CUDA, "num_warps": 8}),
            ({**M1, "n": 1024}, {**SKINNY_CUDA, "ROWS_PER_BLOCK": 64, "SPLIT_K": 8}),
            ({"m": 3, "n": 100, "k": 1001, "dtype": "bfloat16"},
             {**SKINNY_CUDA, "ROWS_PER_BLOCK": 64, "BLOCK_K": 64, "num_stages": 3})]
    rows = compile_configs("gemv", jobs, SM90, with_asm=True)
    for (shape, config), row in zip(jobs, rows):
        assert not isinstance(row, str), (config, row)
        main = row[0]
        record_property(f"sm90:{gemv.FAMILY.shape_key(shape)}:{config}", main.n_regs)
        assert "wgmma.mma_async" in main.asm and main.n_spills == 0
        stages = config["num_stages"] * (config["ROWS_PER_BLOCK"] + 16) * config["BLOCK_K"] * 2
        if shape["k"] % 8 == 0:
            assert main.kernel == "skinny_tma_kernel" and "cp.async.bulk.tensor" in main.asm
            assert stages <= main.shared <= stages + 1024 and main.n_regs <= 64
        else:  # unaligned rows: element loads through registers (168 registers, no spills)
            assert main.kernel == "skinny_kernel"
        assert len(row) == (2 if config["SPLIT_K"] > 1 else 1)


def test_fma_loop_with_more_w_in_flight_on_sm90(record_property):
    """num_stages 2: the register double buffer (the next W tile a predicated 16-byte load in the
    loop, no shared memory); 3: Triton's cp.async pipeline, exactly (num_stages - 1) x (m + 1) x
    ROWS x BLOCK_K x 2 bytes of stages, the bytes the cuda constraint counts."""
    m4 = {**M1, "m": 4}
    jobs = [(M1, PREFETCH), (m4, PREFETCH), (M1, CP_ASYNC), (m4, CP_ASYNC)]
    rows = compile_configs("gemv", jobs, SM90, with_asm=True)
    for (shape, config), row in zip(jobs, rows):
        assert not isinstance(row, str), (config, row)
        main = row[0]
        record_property(f"sm90:{gemv.FAMILY.shape_key(shape)}:{config}", main.n_regs)
        assert main.n_spills == 0
        if config["num_stages"] == 2:
            assert main.shared <= 64 and main.wide_loads >= shape["m"] + 2
            assert "cp.async" not in main.asm
        else:
            staged = (config["num_stages"] - 1) * (shape["m"] + 1) * config["BLOCK_K"] * 2
            assert main.shared == staged and "cp.async.cg.shared.global" in main.asm
    assert space_for("gemv", "cuda").allows(CP_ASYNC, m4)


def test_new_variants_compile_for_gfx942(record_property):
    """The hip space's USE_DOT 2 (pointer loads through LDS, MFMA) and register double buffer
    compile without spills within the 64 KiB LDS, with 16-byte loads."""
    space = space_for("gemv", "hip")
    skinny = {"ROWS_PER_BLOCK": 128, "BLOCK_K": 64, "SPLIT_K": 1, "num_warps": 8, "num_stages": 2,
              "USE_DOT": 2, "waves_per_eu": 0, "BALANCE_N": 0}
    prefetch = {"ROWS_PER_BLOCK": 2, "BLOCK_K": 1024, "SPLIT_K": 1, "num_warps": 4,
                "num_stages": 2, "USE_DOT": 0, "waves_per_eu": 2, "BALANCE_N": 0}
    for config in (skinny, prefetch):
        assert space.allows(config, M1) and space.allows(config, {**M1, "m": 8})
    results = _check_all_fit(GFX942, [skinny, prefetch], M1, record_property)
    assert all(r.wide_loads > 0 for r in results)
    results = _check_all_fit(GFX942, [skinny, prefetch], {**M1, "m": 8}, record_property)
    assert all(r.wide_loads > 0 for r in results)


def test_the_rms_norm_prologue_compiles_for_sm90_and_gfx942(record_property):
    """The FMA kernel carrying the RMSNorm (NORM; some with the residual epilogue, HAS_RES, and
    one with that alone): the H200's m = 1 winner (one row a program, 2048-wide k steps, 8
    warps) and the norm-capable configs of every FMA loop form at m = 1, 2, 4 and 8 compile for
    sm90 and gfx942 without spills, the W tile still in 16-byte loads (registers and vector
    loads: the loop's forms 1 and 2)."""
    one_row = {"ROWS_PER_BLOCK": 1, "BLOCK_K": 2048, "SPLIT_K": 1, "num_warps": 8,
               "USE_DOT": 0, "num_stages": 1, "BALANCE_N": 0}
    normed = {**M1, "norm": 1}
    jobs = [(normed, one_row), ({**normed, "m": 4, "residual": 1}, PREFETCH),
            ({**normed, "m": 8, "residual": 1}, one_row),
            ({**normed, "n": 1024, "m": 2}, CP_ASYNC), ({**M1, "residual": 1}, one_row),
            ({"m": 3, "n": 37, "k": 100, "dtype": "bfloat16", "bias": 1, "norm": 1},
             {**one_row, "BLOCK_K": 64, "num_warps": 1})]
    for target in (SM90, GFX942):
        hip = {"waves_per_eu": 0} if target is GFX942 else {}
        rows = compile_configs("gemv", [(s, {**c, **hip}) for s, c in jobs], target)
        for (shape, config), row in zip(jobs, rows):
            assert not isinstance(row, str), (target, config, row)
            (main,) = row
            record_property(f"{target.arch}:{gemv.FAMILY.shape_key(shape)}:norm:{config}",
                            main.n_regs)
            assert main.n_spills == 0 and 0 < main.n_regs <= LIMITS[target.arch][0], (shape, main)
            per_thread = (config["ROWS_PER_BLOCK"] * config["BLOCK_K"]
                          // (target.warp_size * config["num_warps"]))
            if shape["k"] % 8 == 0 and config["num_stages"] <= 2 and per_thread >= 8:
                assert main.wide_loads > 0, (target, shape, config)  # (3+: cp.async stages)
