"""Compile the gemm and attention search spaces for real GPU targets on a CPU-only host.

triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32)) runs the whole CUDA pipeline down
to ptxas (bundled with triton), and GPUTarget("hip", "gfx942", 64) the whole AMD pipeline down to
an hsaco. Hygon DCU archs (gfx926/928/936/938) are unknown to upstream Triton: the dcu spaces are
compiled for gfx942 as a gfx9 proxy. Each test prints n_regs / n_spills / shared per kernel.

`tuner_kernels.common.compile_configs` compiles in a clean subprocess when this process imported
triton.language under TRITON_INTERPRET=1 (other test modules set it); all jobs of a family and
target go through one call, made once per session.
"""

import functools
import json
import random

import pytest
from triton.backends.compiler import GPUTarget

from tuner_kernels import attention, gemm
from tuner_kernels.common import compile_configs
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

BIG = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": 1, "SWAP_AB": 0, "num_warps": 8, "num_stages": 5,
       "BALANCE_N": 0, "REDUCE_LAST": 0, "SCHEDULE": 0}
LDS = {"BLOCK_M": 32, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "SPLIT_K": 1, "SWAP_AB": 0, "num_warps": 8,
       "num_stages": 3, "waves_per_eu": 0, "matrix_instr_nonkdim": 16, "kpack": 1, "BALANCE_N": 0, "REDUCE_LAST": 0, "SCHEDULE": 0}
SPILLING = {"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 32, "GROUP_M": 8, "SPLIT_K": 1, "SWAP_AB": 0, "num_warps": 8, "num_stages": 3,
            "BALANCE_N": 0, "REDUCE_LAST": 0, "SCHEDULE": 0}
TMA = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": 1, "SWAP_AB": 0, "num_warps": 8,
       "num_stages": 4, "TMA": 1, "BALANCE_N": 0, "REDUCE_LAST": 0, "SCHEDULE": 0}


@functools.lru_cache(maxsize=None)
def sampled_jobs(family: str, backend: str) -> list[tuple[dict, dict]]:
    space = space_for(family, backend)
    rng = random.Random(0)
    jobs = []
    for shape in SHAPES[family]:
        kept = space.configs(shape)
        assert kept, f"{family}/{backend}: the space keeps no config for {shape}"
        for config in [FAMILIES[family].default_config(shape, backend)] + rng.sample(kept, SAMPLES[backend]):
            jobs.append((shape, config))
    return jobs


def extra_jobs(family: str, backend: str) -> list[tuple[dict, dict]]:
    if family != "gemm":
        return []
    big = SHAPES["gemm"][0]
    if backend == "cuda":
        return [(big, BIG), (big, {**BIG, "num_stages": 4}), (big, SPILLING),
                (big, TMA), ({**big, "layout": "NN"}, TMA)]
    if backend == "hip":
        return [(big, LDS)]
    return []


def key(family, backend, shape, config) -> str:
    return json.dumps([family, backend, shape, config], sort_keys=True)


@pytest.fixture(scope="module")
def compiled() -> dict:
    """Every job of this module compiled once: {key: [CompileReport] or failure reason}."""
    results = {}
    for family in FAMILIES:
        for backend in TARGETS:
            jobs = sampled_jobs(family, backend) + extra_jobs(family, backend)
            for (shape, config), reports in zip(jobs, compile_configs(family, jobs, TARGETS[backend])):
                results[key(family, backend, shape, config)] = reports
                for r in reports if not isinstance(reports, str) else []:
                    print(f"{backend:4} {family:9} {r.kernel:24} regs={r.n_regs:3} spills={r.n_spills:4} "
                          f"shared={r.shared:6} {config}")
    return results


def reports_for(compiled, family, backend, shape, config):
    reports = compiled[key(family, backend, shape, config)]
    assert not isinstance(reports, str), f"{family}/{backend} {config} did not compile: {reports}"
    return reports


def gemm_smem_estimate(config: dict) -> int:
    """The pipeline-buffer estimate of search_spaces/gemm.yaml (before the 1 KB margin)."""
    return config["num_stages"] * (config["BLOCK_M"] * config["BLOCK_K"] + config["BLOCK_K"] * config["BLOCK_N"]) * 2


@pytest.mark.parametrize("backend", ["cuda", "hip", "dcu"])
@pytest.mark.parametrize("family", ["gemm", "attention"])
def test_configs_the_space_keeps_compile_and_fit(compiled, family, backend):
    space = space_for(family, backend)
    for shape, config in sampled_jobs(family, backend):
        assert space.allows(config, shape)
        for report in reports_for(compiled, family, backend, shape, config):
            assert report.shared <= SHARED_LIMIT[backend], (report, config)
            assert report.n_spills == 0, (report, config)
            assert report.n_regs > 0
            if family == "gemm" and report.kernel.startswith("gemm"):
                # The constraint's estimate (+ 1 KB for TMA barriers) bounds what Triton allocates.
                assert report.shared <= gemm_smem_estimate(config) + 1024, (report, config)


def test_shared_memory_constraints_reject_configs_that_overflow(compiled):
    shape = SHAPES["gemm"][0]
    # sm90: 5 stages of 128x64 + 64x256 bf16 tiles = 240 KB > 227 KB.
    assert not space_for("gemm", "cuda").allows(BIG, shape)
    (report,) = reports_for(compiled, "gemm", "cuda", shape, BIG)
    assert report.shared > SHARED_LIMIT["cuda"]
    # The same tile at 4 stages is kept, and fits.
    assert space_for("gemm", "cuda").allows({**BIG, "num_stages": 4}, shape)
    (report,) = reports_for(compiled, "gemm", "cuda", shape, {**BIG, "num_stages": 4})
    assert report.shared <= SHARED_LIMIT["cuda"]
    # gfx942: 3 stages (2 LDS buffers) of 32x128 + 128x128 tiles = 80 KB > 64 KB LDS.
    assert not space_for("gemm", "hip").allows(LDS, shape)
    (report,) = reports_for(compiled, "gemm", "hip", shape, LDS)
    assert report.shared > SHARED_LIMIT["hip"]


def test_register_constraint_rejects_a_config_that_spills(compiled):
    shape = SHAPES["gemm"][0]
    # 256x256 fp32 accumulator over 8 warps = 256 registers per thread before anything else.
    assert not space_for("gemm", "cuda").allows(SPILLING, shape)
    (report,) = reports_for(compiled, "gemm", "cuda", shape, SPILLING)
    assert report.n_spills > 0


def test_tma_configs_compile_for_sm90(compiled):
    # TMA=1 takes the descriptor kernel for NT (weight [n, k]) and NN; the pipeline buffers are
    # the same as the pointer kernel's plus the barriers.
    for layout in ("NT", "NN"):
        shape = {**SHAPES["gemm"][0], "layout": layout}
        assert space_for("gemm", "cuda").allows(TMA, shape)
        (report,) = reports_for(compiled, "gemm", "cuda", shape, TMA)
        assert report.kernel == "gemm_tma_kernel" and report.n_spills == 0
        assert gemm_smem_estimate(TMA) < report.shared <= gemm_smem_estimate(TMA) + 1024


# ------------------------------------------------- SCHEDULE 3, the tail split
def test_tail_split_configs_compile_for_sm90_and_gfx942():
    """SCHEDULE 3 launches the tiled kernel twice (the whole waves over all of K, the partial
    wave's tiles split with the in-launch sum: TILE_PARTS): both compile for sm90 with wgmma,
    descriptor loads for TMA = 1, the split one with its arrival atomics; for gfx942 with pointer
    loads. No spills. (4096 x 6144 in 128 x 128 tiles: 1536 tiles, 11 waves of 132 and 84 left.)"""
    shape = {"m": 4096, "n": 6144, "k": 4096, "dtype": "bfloat16", "layout": "NT"}
    tail = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": 2,
            "SWAP_AB": 0, "num_warps": 8, "num_stages": 4, "BALANCE_N": 0, "REDUCE_LAST": 0,
            "SCHEDULE": 3}
    cuda = space_for("gemm", "cuda")
    jobs = [(shape, {**tail, "TMA": t}) for t in (0, 1)]
    for (shape, config), row in zip(jobs, compile_configs("gemm", jobs, TARGETS["cuda"], with_asm=True)):
        assert cuda.allows(config, shape), config
        assert not isinstance(row, str), (config, row)
        assert len(row) == 2, row  # the whole waves, then the split tail
        for report in row:
            print(f"cuda gemm {report.kernel:18} regs={report.n_regs:3} spills={report.n_spills} "
                  f"shared={report.shared:6} {config}")
            expected = "gemm_tma_kernel" if config["TMA"] else "gemm_kernel"
            assert report.kernel == expected and report.n_spills == 0
            assert "wgmma.mma_async" in report.asm
            assert ("cp.async.bulk.tensor" in report.asm) == bool(config["TMA"])
        assert "atom.global" not in row[0].asm and "atom.global" in row[1].asm
    amd = {**tail, "BLOCK_K": 32, "num_stages": 2, "waves_per_eu": 0, "matrix_instr_nonkdim": 16,
           "kpack": 1}
    assert space_for("gemm", "hip").allows(amd, shape)
    (row,) = compile_configs("gemm", [(shape, amd)], TARGETS["hip"])
    assert not isinstance(row, str), row
    assert [r.kernel for r in row] == ["gemm_kernel", "gemm_kernel"]
    assert all(r.n_spills == 0 and 0 < r.shared <= SHARED_LIMIT["hip"] for r in row)


# ------------------------------------------------- SCHEDULE, the persistent tile scheduler
PERSISTENT = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": 1, "SWAP_AB": 0,
              "num_warps": 8, "num_stages": 3, "BALANCE_N": 0, "REDUCE_LAST": 0}


def test_persistent_configs_compile_for_sm90_and_gfx942():
    """SCHEDULE 1 / 2 (the persistent kernel, the subtiled epilogue) for sm90, with descriptor
    loads (cp.async.bulk.tensor) for TMA = 1 on NT and NN and pointer loads for TMA = 0, all wgmma;
    for gfx942 with pointer loads only (no TMA on hip); a ragged shape takes the masked K loop.
    No spills; shared memory / LDS within the space's estimate (+ 1 KB for the barriers)."""
    big, ragged = SHAPES["gemm"][0], {**SHAPES["gemm"][0], "m": 1100, "k": 4000}
    cuda = space_for("gemm", "cuda")
    jobs = [(big, {**PERSISTENT, "SCHEDULE": s, "TMA": t}) for s in (1, 2) for t in (0, 1)]
    jobs += [({**big, "layout": "NN"}, {**PERSISTENT, "SCHEDULE": 2, "TMA": 1}),
             (ragged, {**PERSISTENT, "SCHEDULE": 1, "TMA": 0, "BLOCK_N": 128, "num_stages": 4})]
    for (shape, config), row in zip(jobs, compile_configs("gemm", jobs, TARGETS["cuda"], with_asm=True)):
        assert cuda.allows(config, shape), config
        assert not isinstance(row, str), (config, row)
        (main,) = row
        print(f"cuda gemm {main.kernel:24} regs={main.n_regs:3} spills={main.n_spills} "
              f"shared={main.shared:6} {shape['layout']} {config}")
        assert main.kernel == "gemm_persistent_kernel" and main.n_spills == 0
        assert "wgmma.mma_async" in main.asm
        assert ("cp.async.bulk.tensor" in main.asm) == bool(config["TMA"])
        assert gemm_smem_estimate(config) <= main.shared <= gemm_smem_estimate(config) + 1024
    hip = space_for("gemm", "hip")
    amd = {**PERSISTENT, "BLOCK_N": 128, "BLOCK_K": 32, "num_stages": 2, "waves_per_eu": 0,
           "matrix_instr_nonkdim": 16, "kpack": 1}
    jobs = [(big, {**amd, "SCHEDULE": 1}), (big, {**amd, "SCHEDULE": 2}),
            (ragged, {**amd, "SCHEDULE": 2})]
    for (shape, config), row in zip(jobs, compile_configs("gemm", jobs, TARGETS["hip"])):
        assert hip.allows(config, shape), config
        assert not isinstance(row, str), (config, row)
        (main,) = row
        print(f"hip  gemm {main.kernel:24} regs={main.n_regs:3} spills={main.n_spills} "
              f"shared={main.shared:6} {config}")
        assert main.kernel == "gemm_persistent_kernel" and main.n_spills == 0
        assert 0 < main.shared <= SHARED_LIMIT["hip"]


# ----------------------------------------------------------- SWAP_AB, the skinny decode kernel
SKINNY_SHAPES = [{"m": m, "n": n, "k": 4096, "dtype": "bfloat16", "layout": "NT"}
                 for m, n in ((16, 14336), (32, 6144), (128, 4096), (256, 28672))]
SKINNY_CUDA = [  # (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, TMA)
    (16, 64, 128, 4, 6, 1), (16, 128, 256, 4, 3, 1), (32, 128, 128, 4, 4, 1),
    (128, 128, 128, 8, 3, 1), (128, 64, 128, 4, 4, 0), (256, 128, 64, 8, 3, 1),
    (128, 256, 64, 8, 4, 1)]  # the 256-row tile of the m >= 128 known list


def _skinny(bm, bn, bk, w, s, tma):
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 1, "SPLIT_K": 1, "SWAP_AB": 1,
            "num_warps": w, "num_stages": s, "TMA": tma, "BALANCE_N": 0, "REDUCE_LAST": 0, "SCHEDULE": 0}


def test_skinny_configs_are_wgmma_fed_by_tma_on_sm90():
    """SWAP_AB 1: wgmma with the weight rows as its M side even at BLOCK_M 16, the weight read by
    TMA (cp.async.bulk.tensor) with TMA = 1 or by cp.async without; shared memory exactly the
    space's num_stages x (BLOCK_M + BLOCK_N) x BLOCK_K x 2 B estimate (+ 1 KB); no spills."""
    space = space_for("gemm", "cuda")
    jobs = []
    for params in SKINNY_CUDA:
        config = _skinny(*params)
        shape = next(s for s in SKINNY_SHAPES if s["m"] >= config["BLOCK_M"] or s["m"] == 256)
        assert space.allows(config, shape), (config, shape)
        jobs.append((shape, config))
    jobs.append(({**SKINNY_SHAPES[0], "n": 1024}, {**_skinny(*SKINNY_CUDA[0]), "SPLIT_K": 8}))
    for (shape, config), row in zip(jobs, compile_configs("gemm", jobs, TARGETS["cuda"], with_asm=True)):
        assert not isinstance(row, str), (config, row)
        main = row[0]
        print(f"cuda gemm {main.kernel:20} regs={main.n_regs:3} spills={main.n_spills} "
              f"shared={main.shared:6} {shape['m']}x{shape['n']} {config}")
        assert main.n_spills == 0 and "wgmma.mma_async" in main.asm
        assert main.kernel == ("skinny_tma_kernel" if config["TMA"] else "skinny_kernel")
        assert ("cp.async.bulk.tensor" in main.asm) == bool(config["TMA"])
        assert gemm_smem_estimate(config) <= main.shared <= gemm_smem_estimate(config) + 1024
        assert len(row) == (2 if config["SPLIT_K"] > 1 else 1)


def test_skinny_configs_compile_for_gfx942_and_the_spilling_one_is_rejected():
    amd = {"waves_per_eu": 0, "matrix_instr_nonkdim": 16, "kpack": 1}
    space = space_for("gemm", "hip")
    kept = [{**_skinny(bm, bn, 64, w, 2, 0), **amd} for bm, bn, w in
            ((16, 64, 4), (32, 128, 4), (64, 128, 8), (128, 128, 8), (256, 64, 4))]
    kept = [{k: v for k, v in c.items() if k != "TMA"} for c in kept]
    spilling = {**kept[-1], "BLOCK_N": 256, "num_warps": 8, "kpack": 2}
    shape = SKINNY_SHAPES[-1]
    assert all(space.allows(c, shape) for c in kept)
    # 256 x 256 over 8 waves: 128 accumulator values a lane, which the tiled kernel's rule
    # allows; the skinny kernel's (<= 64) does not, and gfx942 compiles show why
    assert not space.allows(spilling, shape)
    rows = compile_configs("gemm", [(shape, c) for c in kept + [spilling]], TARGETS["hip"])
    for config, row in zip(kept, rows):
        assert not isinstance(row, str), (config, row)
        print(f"hip  gemm {row[0].kernel:20} regs={row[0].n_regs:3} spills={row[0].n_spills} "
              f"shared={row[0].shared:6} {config}")
        assert row[0].n_spills == 0 and row[0].shared <= SHARED_LIMIT["hip"]
    assert rows[-1][0].n_spills > 0


# ------------------------------------------ REDUCE_LAST, the K splits summed in one launch
def test_reduce_last_compiles_to_one_kernel_for_sm90_and_gfx942():
    """REDUCE_LAST 1 on the tiled pointer and descriptor kernels and the skinny pair (sm90), and on
    the pointer kernels (gfx942): one kernel, no reduce kernel, no spills; on sm90 the arrival
    count is one acq_rel atomic at gpu scope behind a barrier, the partials read back from L2."""
    shape = {"m": 128, "n": 4096, "k": 4096, "dtype": "bfloat16", "layout": "NT"}
    base = {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 1, "SPLIT_K": 4,
            "REDUCE_LAST": 1, "num_warps": 4, "num_stages": 4, "BALANCE_N": 0, "SCHEDULE": 0}
    cuda, hip = space_for("gemm", "cuda"), space_for("gemm", "hip")
    jobs = [(shape, {**base, "SWAP_AB": swap, "TMA": tma}) for swap in (0, 1) for tma in (0, 1)]
    kernels = ["gemm_kernel", "gemm_tma_kernel", "skinny_kernel", "skinny_tma_kernel"]
    for (shape_, config), row, kernel in zip(jobs, compile_configs("gemm", jobs, TARGETS["cuda"],
                                                                   with_asm=True), kernels):
        assert cuda.allows(config, shape_), config
        assert not isinstance(row, str), (config, row)
        (main,) = row
        print(f"cuda gemm {main.kernel:20} regs={main.n_regs:3} spills={main.n_spills} "
              f"shared={main.shared:6} {config}")
        assert main.kernel == kernel and main.n_spills == 0
        assert "atom.global.gpu.acq_rel.add" in main.asm and "bar.sync" in main.asm
        assert "ld.global.cg" in main.asm
    amd = {**base, "BLOCK_K": 64, "num_stages": 2, "waves_per_eu": 0, "matrix_instr_nonkdim": 16,
           "kpack": 1}
    jobs = [(shape, {**amd, "SWAP_AB": swap}) for swap in (0, 1)]
    for (shape_, config), row, kernel in zip(jobs, compile_configs("gemm", jobs, TARGETS["hip"]),
                                             ("gemm_kernel", "skinny_kernel")):
        assert hip.allows(config, shape_), config
        assert not isinstance(row, str), (config, row)
        (main,) = row
        assert main.kernel == kernel and main.n_spills == 0 and main.shared <= SHARED_LIMIT["hip"]


def _compile_masked(_request: dict) -> list:
    """In a child without TRITON_INTERPRET (tuner_kernels.common.run_without_interpreter): the
    masked decode attention's kernels for sm90 and gfx942, [backend, mask kind, config, kernel,
    registers, spills, shared, MASK]."""
    import torch
    from triton.backends.compiler import GPUTarget

    from tuner_kernels import attention, common
    from tuner.spaces import space_for

    common._TORCH_TO_TRITON.setdefault(torch.uint8, "u8")  # a boolean mask is read as uint8
    shapes = [{"batch": 32, "heads": 32, "kv_heads": 8, "kv_len": 162, "head_dim": 128, "dtype": "bfloat16"},
              {"batch": 1, "heads": 64, "kv_heads": 1, "kv_len": 8192, "head_dim": 64, "dtype": "bfloat16"}]
    # the configs served on the H200 (batch 32 and batch 1), then stacked and split ones
    served = [{"HEADS_PER_BLOCK": 1, "BLOCK_N": 16, "SPLIT_KV": 1, "num_warps": 2, "num_stages": 3},
              {"HEADS_PER_BLOCK": 1, "BLOCK_N": 64, "SPLIT_KV": 1, "num_warps": 4, "num_stages": 3},
              {"HEADS_PER_BLOCK": 4, "BLOCK_N": 32, "SPLIT_KV": 2, "num_warps": 4, "num_stages": 3},
              {"HEADS_PER_BLOCK": 2, "BLOCK_N": 32, "SPLIT_KV": 1, "num_warps": 4, "num_stages": 2},
              {"HEADS_PER_BLOCK": 1, "BLOCK_N": 64, "SPLIT_KV": 2, "num_warps": 8, "num_stages": 2},
              {"HEADS_PER_BLOCK": 1, "BLOCK_N": 32, "SPLIT_KV": 4, "num_warps": 4, "num_stages": 2}]
    out = []
    for backend, target in (("cuda", GPUTarget("cuda", 90, 32)), ("hip", GPUTarget("hip", "gfx942", 64))):
        space = space_for("attention", backend)
        for shape in shapes:
            inputs = attention.make_inputs(shape, "meta")
            b, n = shape["batch"], shape["kv_len"]
            masks = {"additive": torch.empty(b, 1, 1, n, device="meta", dtype=torch.bfloat16),
                     "bool": torch.empty(b, 1, 1, n, device="meta", dtype=torch.bool),
                     "bool-broadcast": torch.empty(1, 1, 1, n, device="meta", dtype=torch.bool)}
            if backend == "hip":
                configs = [dict(c, num_stages=min(c["num_stages"], 2), waves_per_eu=0,
                                matrix_instr_nonkdim=16) for c in served]
            else:
                configs = list(served)
            configs = [c for c in configs if space.allows(c, shape)]
            if backend == "hip":  # 64-long tiles of 128 dims below 8 warps spill masked (the yaml)
                configs = [c for c in configs
                           if c["BLOCK_N"] * shape["head_dim"] <= 4096 or c["num_warps"] >= 8]
            for name, mask in masks.items():
                for config in configs if name == "bool" else configs[:2]:
                    _, calls = attention.launch_plan(dict(inputs, mask=mask, scale=0.1), config,
                                                     backend=backend)
                    for call in calls:
                        r = common.compile_call(call, target)
                        out.append([backend, name, config, r.kernel, r.n_regs, r.n_spills, r.shared,
                                    call.constexprs.get("MASK")])
    return out


def test_the_masked_decode_attention_compiles_for_sm90_and_gfx942():
    """The static-cache decode call's variants (additive and boolean masks, per sequence or
    broadcast; SDPA's scale) compile for sm90 and gfx942 with the configs served on the H200 and
    stacked and split ones, where each space keeps them: no spills, within shared memory / LDS
    (search_spaces/attention.yaml: how the register limits for masked calls were derived, and
    the few sm90 configs that still spill a little when masked)."""
    from tuner_kernels.common import run_without_interpreter

    rows = run_without_interpreter("tests.test_kernel_compile:_compile_masked", {})
    kinds = {(backend, name, row_mask) for backend, name, _c, kernel, _r, _s, _sh, row_mask in rows
             if kernel == "decode_attention_kernel"}
    assert kinds == {(b, n, k) for b in ("cuda", "hip")
                     for n, k in (("additive", 2), ("bool", 1), ("bool-broadcast", 1))}
    for backend in ("cuda", "hip"):  # the space keeps enough of the list to mean something
        assert len({json.dumps(r[2], sort_keys=True) for r in rows if r[0] == backend}) >= 3
    for backend, name, config, kernel, regs, spills, shared, _mask in rows:
        assert spills == 0 and regs > 0, (backend, name, config, kernel)
        assert shared <= SHARED_LIMIT[backend], (backend, name, config, kernel, shared)


def test_the_hip_space_refuses_tiles_that_spill_at_two_waves_per_eu():
    """waves_per_eu 2 halves a lane's registers (256): a 128 x 128 x 128 tile on 4 warps spills
    on gfx942 (found by the sampled-space test), its BLOCK_K 64 twin and its 8-warp twin fit."""
    shape = SHAPES["gemm"][0]
    tile = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 2, "SPLIT_K": 1,
            "REDUCE_LAST": 0, "SWAP_AB": 0, "BALANCE_N": 0, "SCHEDULE": 0, "num_warps": 4,
            "num_stages": 2, "waves_per_eu": 2, "matrix_instr_nonkdim": 16, "kpack": 1}
    hip = space_for("gemm", "hip")
    twins = [{**tile, "BLOCK_K": 64}, {**tile, "num_warps": 8}]
    assert not hip.allows(tile, shape) and all(hip.allows(t, shape) for t in twins)
    rows = compile_configs("gemm", [(shape, c) for c in [tile] + twins], TARGETS["hip"])
    assert [row[0].n_spills > 0 for row in rows] == [True, False, False], rows
