"""Compile the gemm and attention search spaces for real GPU targets on a CPU-only host.

triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32)) runs the whole CUDA pipeline down
to ptxas (bundled with triton), and GPUTarget("hip", "gfx942", 64) the whole AMD pipeline down to
an hsaco. Hygon DCU archs (gfx926/928/936/938) are unknown to upstream Triton: the dcu spaces are
compiled for gfx942 as a gfx9 proxy. Each test prints n_regs / n_spills / shared per kernel.
"""

import random

import pytest
from triton.backends.compiler import GPUTarget

from kernels import attention, gemm
from kernels.gemm import compile_config
from tuner.spaces import space_for

TARGETS = {"cuda": GPUTarget("cuda", 90, 32), "hip": GPUTarget("hip", "gfx942", 64),
           "dcu": GPUTarget("hip", "gfx942", 64)}  # DCU: gfx942 as the gfx9 proxy
SHARED_LIMIT = {"cuda": 232448, "hip": 65536, "dcu": 65536}  # sm90 227 KB; gfx9 64 KB LDS
FAMILIES = {"gemm": gemm, "attention": attention}
SHAPES = {
    "gemm": [{"m": 4096, "n": 4096, "k": 4096, "dtype": "bfloat16", "layout": "NT"},
             {"m": 16, "n": 14336, "k": 4096, "dtype": "bfloat16", "layout": "NT"}],
    "attention": [{"batch": 1, "heads": 32, "kv_heads": 8, "kv_len": 8192, "head_dim": 128, "dtype": "bfloat16"},
                  {"batch": 1, "heads": 64, "kv_heads": 1, "kv_len": 8192, "head_dim": 64, "dtype": "bfloat16"}],
}
SAMPLES = {"cuda": 2, "hip": 2, "dcu": 1}  # random kept configs per shape, plus the default


def gemm_smem_estimate(config: dict) -> int:
    """The pipeline-buffer estimate of search_spaces/gemm.yaml (before any backend discount)."""
    return config["num_stages"] * (config["BLOCK_M"] * config["BLOCK_K"] + config["BLOCK_K"] * config["BLOCK_N"]) * 2


def compile_and_print(family: str, shape: dict, config: dict, backend: str):
    reports = compile_config(FAMILIES[family], shape, config, TARGETS[backend])
    for r in reports:
        print(f"{backend:4} {family:9} {r.kernel:24} regs={r.n_regs:3} spills={r.n_spills:4} "
              f"shared={r.shared:6} {config}")
    return reports


@pytest.mark.parametrize("backend", ["cuda", "hip", "dcu"])
@pytest.mark.parametrize("family", ["gemm", "attention"])
def test_configs_the_space_keeps_compile_and_fit(family, backend):
    space = space_for(family, backend)
    rng = random.Random(0)
    for shape in SHAPES[family]:
        kept = space.configs(shape)
        assert kept, f"{family}/{backend}: the space keeps no config for {shape}"
        configs = [FAMILIES[family].default_config(shape, backend)] + rng.sample(kept, SAMPLES[backend])
        for config in configs:
            assert space.allows(config, shape)
            for report in compile_and_print(family, shape, config, backend):
                assert report.shared <= SHARED_LIMIT[backend], (report, config)
                assert report.n_spills == 0, (report, config)
                assert report.n_regs > 0
                if family == "gemm" and report.kernel == "gemm_kernel":
                    # The constraint's estimate is an upper bound of what Triton allocates.
                    assert report.shared <= gemm_smem_estimate(config), (report, config)


def test_shared_memory_constraints_reject_configs_that_overflow():
    shape = SHAPES["gemm"][0]
    # sm90: 5 stages of 128x64 + 64x256 bf16 tiles = 240 KB > 227 KB.
    big = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": 1,
           "num_warps": 8, "num_stages": 5}
    assert not space_for("gemm", "cuda").allows(big, shape)
    (report,) = compile_and_print("gemm", shape, big, "cuda")
    assert report.shared > SHARED_LIMIT["cuda"]
    # The same tile at 4 stages is kept, and fits.
    assert space_for("gemm", "cuda").allows({**big, "num_stages": 4}, shape)
    (report,) = compile_and_print("gemm", shape, {**big, "num_stages": 4}, "cuda")
    assert report.shared <= SHARED_LIMIT["cuda"]
    # gfx942: 3 stages (2 LDS buffers) of 32x128 + 128x128 tiles = 80 KB > 64 KB LDS.
    lds = {"BLOCK_M": 32, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "SPLIT_K": 1, "num_warps": 8,
           "num_stages": 3, "waves_per_eu": 0, "matrix_instr_nonkdim": 16, "kpack": 1}
    assert not space_for("gemm", "hip").allows(lds, shape)
    (report,) = compile_and_print("gemm", shape, lds, "hip")
    assert report.shared > SHARED_LIMIT["hip"]


def test_register_constraint_rejects_a_config_that_spills():
    shape = SHAPES["gemm"][0]
    # 256x256 fp32 accumulator over 8 warps = 256 registers per thread before anything else.
    spilling = {"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 32, "GROUP_M": 8, "SPLIT_K": 1,
                "num_warps": 8, "num_stages": 3}
    assert not space_for("gemm", "cuda").allows(spilling, shape)
    (report,) = compile_and_print("gemm", shape, spilling, "cuda")
    assert report.n_spills > 0
