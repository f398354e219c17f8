"""Offline compiles of the moe space for sm90 and gfx942 (the DCU space against gfx942 as a gfx9
proxy) on a CPU-only host: every kernel of the default, of a GEMV-path config and of sampled kept
configs compiles, fits shared memory / LDS and does not spill; the shared-memory constraint's
estimate bounds what Triton allocates. One compile child per backend, made once per session."""

import functools
import json
import random

import pytest
from triton.backends.compiler import GPUTarget

from tuner_kernels import moe
from tuner_kernels.common import compile_configs
from tuner.spaces import space_for

TARGETS = {"cuda": GPUTarget("cuda", 90, 32), "hip": GPUTarget("hip", "gfx942", 64),
           "dcu": GPUTarget("hip", "gfx942", 64)}
SHARED_LIMIT = {"cuda": 232448, "hip": 65536, "dcu": 65536}
SHAPES = [{"m": 1, "experts": 128, "topk": 8, "hidden": 2048, "inter": 768, "dtype": "bfloat16"},
          {"m": 64, "experts": 128, "topk": 8, "hidden": 2048, "inter": 768, "dtype": "bfloat16"}]
SAMPLES = {"cuda": 2, "hip": 1, "dcu": 1}
# 5 stages of two 64x128 A tiles and a 128x256 B tile: 800 KB, far over sm90's 227 KB
OVERFLOW = {"GEMV": 0, "BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 8,
            "SPLIT_K": 1, "SPLIT_K_UP": 1, "num_warps": 8, "num_stages": 5}


def smem_estimate(config: dict) -> int:
    """search_spaces/moe.yaml's cuda pipeline-buffer estimate."""
    c = config
    a_tiles = 1 if c.get("SPLIT_K_UP", 1) == 1 else 2 * c["SPLIT_K_UP"]
    return c["num_stages"] * (2 * c["BLOCK_SIZE_M"] * c["BLOCK_SIZE_K"] * a_tiles
                              + c["BLOCK_SIZE_K"] * c["BLOCK_SIZE_N"]) * 2


@functools.lru_cache(maxsize=None)
def jobs(backend: str) -> list:
    space = space_for("moe", backend)
    rng = random.Random(0)
    out = []
    for shape in SHAPES:
        kept = space.configs(shape)
        default = moe.default_config(shape, backend)
        # the split up projection (fp32 partials summed by the down projection's A loads)
        split_up = {**default, "SPLIT_K_UP": 4 if shape["m"] == 1 else 2}
        # the GEMV path (two FMA kernels, a 2-stage loop-level pipeline)
        gemv = {**default, "GEMV": 1, "BLOCK_SIZE_N": 8, "BLOCK_SIZE_K": 512, "num_stages": 2}
        for config in [default, split_up, gemv] + rng.sample(kept, SAMPLES[backend]):
            out.append((shape, config))
    if backend == "cuda":
        out.append((SHAPES[1], OVERFLOW))
    return out


@functools.lru_cache(maxsize=None)
def compiled(backend: str) -> dict:
    results = {}
    for (shape, config), reports in zip(jobs(backend), compile_configs("moe", jobs(backend),
                                                                       TARGETS[backend])):
        results[json.dumps([shape, config], sort_keys=True)] = reports
        for r in reports if not isinstance(reports, str) else []:
            print(f"{backend:4} {r.kernel:18} regs={r.n_regs:3} spills={r.n_spills:3} "
                  f"shared={r.shared:6} m={shape['m']} {config}")
    return results


@pytest.mark.parametrize("backend", ["cuda", "hip", "dcu"])
def test_kept_configs_compile_fit_and_do_not_spill(backend):
    space = space_for("moe", backend)
    results = compiled(backend)
    for shape, config in jobs(backend):
        if config is OVERFLOW:
            continue
        assert space.allows(config, shape)
        reports = results[json.dumps([shape, config], sort_keys=True)]
        assert not isinstance(reports, str), f"{config} did not compile: {reports}"
        align = ["moe_align_kernel"] if moe.align_in_kernel(
            shape["m"] * shape["topk"], shape["experts"]) else []
        if config["GEMV"]:
            assert [r.kernel for r in reports] == ["moe_gemv_up_kernel", "moe_gemv_down_kernel"]
        else:
            assert [r.kernel for r in reports] == align + ["moe_gemm_kernel", "moe_gemm_kernel",
                                                           "moe_reduce_kernel"]
        for report in reports:
            assert report.shared <= SHARED_LIMIT[backend], (report, config)
            assert report.n_spills == 0, (report, config)
            assert report.n_regs > 0
            if backend == "cuda" and report.kernel == "moe_gemm_kernel":
                assert report.shared <= smem_estimate(config), (report, config)
            if backend == "cuda" and report.kernel.startswith("moe_gemv"):
                # the space's estimates of the GEMV path's stages: gate, up and x chunks (up);
                # a W and an act tile of each of the topk experts (down)
                stages, tile = config["num_stages"], config["BLOCK_SIZE_N"] * config["BLOCK_SIZE_K"]
                bound = (stages * (2 * config["BLOCK_SIZE_N"] + 1) * config["BLOCK_SIZE_K"] * 2
                         if report.kernel == "moe_gemv_up_kernel"
                         else max(1, stages - 1) * shape["topk"] * 2 * tile * 2)
                assert report.shared <= max(bound, 1024), (report, config)


def test_the_shared_memory_constraint_rejects_a_config_that_overflows():
    assert not space_for("moe", "cuda").allows(OVERFLOW, SHAPES[1])
    reports = compiled("cuda")[json.dumps([SHAPES[1], OVERFLOW], sort_keys=True)]
    # Triton refuses it (out of resources) or allocates more than an sm90 block has
    assert isinstance(reports, str) or max(r.shared for r in reports) > SHARED_LIMIT["cuda"]


@pytest.mark.parametrize("backend", ["cuda", "hip"])
def test_the_align_kernel_compiles_without_spills_up_to_its_expert_reach(backend):
    """moe_align_kernel's one-hot tiles are [align_chunk(experts), experts], of one size whatever
    the experts: up to ALIGN_MAX_EXPERTS it compiles for sm90 and gfx942 without spilling (32-pair
    chunks spilled at 512 experts on sm90, at 1024 on gfx942)."""
    shape = {"m": 64, "experts": moe.ALIGN_MAX_EXPERTS, "topk": 8, "hidden": 256, "inter": 128,
             "dtype": "bfloat16"}
    (reports,) = compile_configs("moe", [(shape, moe.default_config(shape, backend))],
                                 TARGETS[backend])
    assert not isinstance(reports, str), reports
    (align,) = [r for r in reports if r.kernel == "moe_align_kernel"]
    assert align.n_spills == 0 and align.n_regs > 0, align
