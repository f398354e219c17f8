"""The decode GEMV kernel under the Triton interpreter (CPU), its family interface and its space."""

from __future__ import annotations

import os


import pytest  # noqa: E402
import torch  # noqa: E402

from tuner_kernels import get_family  # noqa: E402
from tuner_kernels import gemv  # noqa: E402
from tuner import parity  # noqa: E402
from tuner.spaces import space_for  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="interpreter tests need TRITON_INTERPRET=1 at import")

FAMILY = get_family("gemv")

# Ragged on purpose: n = 37 is no multiple of any ROWS_PER_BLOCK, k = 100 none of any BLOCK_K.
CONFIGS = [
    {"ROWS_PER_BLOCK": 1, "BLOCK_K": 64, "SPLIT_K": 1, "num_warps": 1},
    {"ROWS_PER_BLOCK": 4, "BLOCK_K": 32, "SPLIT_K": 3, "num_warps": 2},  # split-k, ragged slices
    {"ROWS_PER_BLOCK": 16, "BLOCK_K": 128, "SPLIT_K": 1, "num_warps": 4},  # BLOCK_K > k
    {"ROWS_PER_BLOCK": 8, "BLOCK_K": 16, "SPLIT_K": 2, "num_warps": 4},
]


def _rel_err(out, ref):
    return float((out.float() - ref).norm() / ref.norm())


@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "R{ROWS_PER_BLOCK}-K{BLOCK_K}-S{SPLIT_K}"
                         .format(**c))
def test_matches_fp32_reference_on_ragged_shapes(m, config):
    shape = {"m": m, "n": 37, "k": 100, "dtype": "bfloat16"}
    inputs = FAMILY.make_inputs(shape, "cpu", seed=m)
    out = torch.full((m, 37), float("nan"), dtype=torch.bfloat16)
    result = FAMILY.launch(inputs, config, out=out)
    assert result.data_ptr() == out.data_ptr()
    assert bool(torch.isfinite(out).all()), "some outputs were never written"
    ref = FAMILY.reference(inputs)
    # bf16 output rounding alone is ~2e-3 norm-wise; a wrong or missing k block is ~1e-1
    assert _rel_err(out, ref) < 6e-3


def test_float16_and_exact_tiles():
    shape = {"m": 2, "n": 64, "k": 256, "dtype": "float16"}
    inputs = FAMILY.make_inputs(shape, "cpu", seed=7)
    for config in ({"ROWS_PER_BLOCK": 8, "BLOCK_K": 64, "SPLIT_K": 1},
                   {"ROWS_PER_BLOCK": 16, "BLOCK_K": 64, "SPLIT_K": 4}):
        out = FAMILY.launch(inputs, config)
        assert out.dtype == torch.float16
        assert _rel_err(out, FAMILY.reference(inputs)) < 1e-3


@pytest.mark.parametrize("m", [1, 3, 8])
def test_dot_variant_matches_fp32_reference(m):
    # fp16 only: the 3.6 interpreter multiplies bf16 dot operands as their raw uint16 bits (a
    # interpreter bug; bf16 tl.dot is checked on the GPU by tests/test_device.py and by parity)
    shape = {"m": m, "n": 37, "k": 100, "dtype": "float16"}
    inputs = FAMILY.make_inputs(shape, "cpu", seed=m)
    for config in ({"ROWS_PER_BLOCK": 16, "BLOCK_K": 32, "SPLIT_K": 1, "USE_DOT": 1},
                   {"ROWS_PER_BLOCK": 32, "BLOCK_K": 64, "SPLIT_K": 2, "USE_DOT": 1,
                    "num_stages": 3}):
        out = torch.full((m, 37), float("nan"), dtype=torch.float16)
        FAMILY.launch(inputs, config, out=out)
        assert bool(torch.isfinite(out).all())
        assert _rel_err(out, FAMILY.reference(inputs)) < 1e-3
    with pytest.raises(ValueError, match="USE_DOT"):
        FAMILY.launch(inputs, {"ROWS_PER_BLOCK": 8, "BLOCK_K": 32, "SPLIT_K": 1, "USE_DOT": 1})


def test_split_k_is_deterministic():
    shape = {"m": 3, "n": 37, "k": 100, "dtype": "bfloat16"}
    config = {"ROWS_PER_BLOCK": 4, "BLOCK_K": 16, "SPLIT_K": 4}
    inputs = FAMILY.make_inputs(shape, "cpu", seed=11)
    first = parity.output_hash(FAMILY.launch(inputs, config))
    second = parity.output_hash(FAMILY.launch(inputs, config))
    assert first == second


def test_inputs_are_random_and_seeded():
    shape = {"m": 2, "n": 16, "k": 32, "dtype": "bfloat16"}
    a = FAMILY.make_inputs(shape, "cpu", seed=1)
    b = FAMILY.make_inputs(shape, "cpu", seed=1)
    c = FAMILY.make_inputs(shape, "cpu", seed=2)
    assert torch.equal(a["weight"], b["weight"]) and not torch.equal(a["weight"], c["weight"])
    for name in ("x", "weight"):  # never zeros: a kernel that reads nothing must not pass
        assert float((a[name] == 0).float().mean()) < 0.01
        assert float(a[name].float().std()) > 0


def test_bad_configs_are_refused():
    inputs = FAMILY.make_inputs({"m": 1, "n": 8, "k": 16, "dtype": "bfloat16"}, "cpu")
    with pytest.raises(ValueError, match="power of two"):
        FAMILY.launch(inputs, {"ROWS_PER_BLOCK": 3, "BLOCK_K": 16, "SPLIT_K": 1})
    with pytest.raises(ValueError, match="unknown keys"):
        FAMILY.launch(inputs, {"ROWS_PER_BLOCK": 2, "BLOCK_K": 16, "SPLIT_K": 1, "BLOCK_N": 4})
    too_many = FAMILY.make_inputs({"m": 9, "n": 8, "k": 16, "dtype": "bfloat16"}, "cpu")
    with pytest.raises(ValueError, match="m = 1..8"):
        FAMILY.launch(too_many, {"ROWS_PER_BLOCK": 2, "BLOCK_K": 16, "SPLIT_K": 1})


def test_shape_from_row_and_key():
    row = {"op": "aten::mm", "family": "gemm", "m": 4, "n": 4096, "k": 14336, "batch": 1,
           "dtype": "bfloat16"}
    shape = FAMILY.shape_from_row(row)
    assert shape == {"m": 4, "n": 4096, "k": 14336, "dtype": "bfloat16"}
    assert FAMILY.shape_key(shape) == "m=4,n=4096,k=14336,dtype=bfloat16"
    assert FAMILY.shape_from_row({**row, "m": 9}) is None
    assert FAMILY.shape_from_row({**row, "batch": 8}) is None
    assert FAMILY.shape_from_row({**row, "family": "attention"}) is None
    assert FAMILY.shape_from_row({**row, "dtype": "float32"}) is None


def test_bytes_and_flops():
    shape = {"m": 1, "n": 14336, "k": 4096, "dtype": "bfloat16"}
    assert FAMILY.bytes_moved(shape) == 2 * (14336 * 4096 + 4096 + 14336)
    assert FAMILY.flops(shape) == 2 * 14336 * 4096
    assert len(FAMILY.source_hash()) == 16


DECODE_SHAPES = [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (14336, 5120),
                 (34816, 5120), (5120, 17408), (151936, 4096), (37, 100), (1, 64)]


@pytest.mark.parametrize("backend,sms", [("cuda", 132), ("hip", 304), ("dcu", 120)])
def test_default_config_lies_in_the_search_space(backend, sms):
    space = space_for("gemv", backend)
    for m in (1, 3, 4, 8):
        for n, k in DECODE_SHAPES:
            shape = {"m": m, "n": n, "k": k, "dtype": "bfloat16"}
            config = gemv.default_config(shape, backend, sm_count=sms)
            assert set(config) == set(space.params), (shape, config)
            assert all(config[p] in space.params[p] for p in space.params), (shape, config)
            assert space.allows(config, shape), (shape, config)
            assert ("waves_per_eu" in config) == (backend != "cuda")


def test_default_config_is_allowed_on_random_shapes():
    import random

    rng = random.Random(0)
    spaces = {b: space_for("gemv", b) for b in ("cuda", "hip", "dcu")}
    for _ in range(400):
        shape = {"m": rng.randint(1, 8), "n": rng.choice([rng.randint(1, 300),
                                                          rng.randint(1, 200_000)]),
                 "k": rng.choice([rng.randint(1, 300), rng.randint(1, 30_000)])}
        for backend, sms in (("cuda", 132), ("hip", 304), ("dcu", 120)):
            config = gemv.default_config(shape, backend, sm_count=sms)
            space = spaces[backend]
            assert space.allows(config, shape), (backend, shape, config)
            assert set(config) == set(space.params), (backend, config)
            assert all(config[p] in space.params[p] for p in space.params), (backend, config)


def test_cuda_space_is_small_enough_for_an_exhaustive_grid():
    space = space_for("gemv", "cuda")
    assert "waves_per_eu" not in space.params
    assert "waves_per_eu" in space_for("gemv", "hip").params
    # the largest cuda spaces are m = 1 on the small projections (measured: <= ~750 before
    # BALANCE_N, 858 with it). BALANCE_N doubles only the USE_DOT=2 configs (the skinny kernel's
    # balanced rows), so the bound grew from 800 to 900, and the balanced configs are exactly one
    # copy of the unbalanced USE_DOT=2 ones
    for m, n, k in [(1, 1024, 4096), (1, 5120, 17408), (1, 151936, 4096), (8, 4096, 4096)]:
        configs = space.configs({"m": m, "n": n, "k": k})
        count = len(configs)
        assert 10 <= count <= 900, (m, n, k, count)
        balanced = [c for c in configs if c["BALANCE_N"] == 1]
        assert all(c["USE_DOT"] == 2 for c in balanced), (m, n, k)
        skinny = [c for c in configs if c["USE_DOT"] == 2 and c["BALANCE_N"] == 0]
        assert len(balanced) == len(skinny), (m, n, k, len(balanced), len(skinny))
        assert count - len(balanced) <= 800, (m, n, k, count)  # the old bound without the knob


@pytest.mark.parametrize("split_k, use_dot", [(1, 0), (2, 0), (1, 1), (3, 1)])
def test_bias_is_fused_and_matches_the_reference(split_k, use_dot):
    """addmm rows (q/k/v projections with bias) are measured and served with the bias fused in
    the epilogue: a separate add kernel cost more than the GEMV saved on the H200 (BENCHMARKS.md)."""
    shape = {"m": 3, "n": 37, "k": 100, "dtype": "float16", "bias": 1}  # fp16: interpreter's bf16 dot is wrong
    inputs = FAMILY.make_inputs(shape, seed=3)
    assert inputs["bias"].shape == (37,) and inputs["bias"].abs().sum() > 0
    config = {"ROWS_PER_BLOCK": 16 if use_dot else 4, "BLOCK_K": 32, "SPLIT_K": split_k,
              "num_warps": 1, "num_stages": 1, "USE_DOT": use_dot}
    out = FAMILY.launch(inputs, config)
    ref = FAMILY.reference(inputs)
    assert (out.float() - ref).norm() / ref.norm() < 1e-3
    without = FAMILY.launch({"x": inputs["x"], "weight": inputs["weight"]}, config)
    assert not torch.allclose(out, without)  # the bias really went in
    assert FAMILY.shape_key(shape) == "m=3,n=37,k=100,dtype=float16,bias=1"
    assert FAMILY.bytes_moved(shape) == FAMILY.bytes_moved({**shape, "bias": 0}) + 37 * 2


def test_addmm_rows_carry_bias_and_mm_rows_do_not():
    row = {"family": "gemm", "op": "aten::addmm", "m": 4, "n": 128, "k": 896, "batch": 1,
           "dtype": "bfloat16"}
    assert FAMILY.shape_from_row(row) == {"m": 4, "n": 128, "k": 896, "dtype": "bfloat16", "bias": 1}
    assert FAMILY.shape_from_row({**row, "op": "aten::mm"}) == {"m": 4, "n": 128, "k": 896,
                                                                 "dtype": "bfloat16"}


# ------------------------------------------- the skinny (USE_DOT 2) and pipelined FMA variants
# USE_DOT 2 (the swap-AB skinny kernel of tuner_kernels/skinny.py) and the pipelined FMA loop
# (num_stages > 1 with USE_DOT 0). k = 100 takes the pointer kernel (rows of 200 bytes are no
# TMA rows); k = 104 (208-byte rows) the descriptor kernel. Tiny tiles keep the interpreter quick.
SKINNY = [
    {"ROWS_PER_BLOCK": 64, "BLOCK_K": 32, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3, "USE_DOT": 2},
    {"ROWS_PER_BLOCK": 16, "BLOCK_K": 16, "SPLIT_K": 3, "num_warps": 4, "num_stages": 4, "USE_DOT": 2},
]
PIPELINED = [  # num_stages 2: the register double buffer; 3, 4: Triton's cp.async pipeline
    {"ROWS_PER_BLOCK": 2, "BLOCK_K": 32, "SPLIT_K": 1, "num_warps": 1, "num_stages": 2, "USE_DOT": 0},
    {"ROWS_PER_BLOCK": 1, "BLOCK_K": 16, "SPLIT_K": 3, "num_warps": 1, "num_stages": 2, "USE_DOT": 0},
    {"ROWS_PER_BLOCK": 2, "BLOCK_K": 32, "SPLIT_K": 1, "num_warps": 1, "num_stages": 3, "USE_DOT": 0},
    {"ROWS_PER_BLOCK": 1, "BLOCK_K": 16, "SPLIT_K": 2, "num_warps": 2, "num_stages": 4, "USE_DOT": 0},
]


@pytest.mark.parametrize("k, kernel", [(100, "skinny_kernel"), (104, "skinny_tma_kernel")])
@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("config", SKINNY, ids=lambda c: "R{ROWS_PER_BLOCK}-K{BLOCK_K}-S{SPLIT_K}".format(**c))
def test_skinny_variant_matches_fp32_reference(m, k, kernel, config):
    shape = {"m": m, "n": 37, "k": k, "dtype": "bfloat16", "bias": 1}
    inputs = FAMILY.make_inputs(shape, "cpu", seed=m + k)
    out = torch.full((m, 37), float("nan"), dtype=torch.bfloat16)
    FAMILY.launch(inputs, config, out=out)
    _, calls = gemv.launch_plan(inputs, config)
    assert calls[0].kernel.fn.__name__ == kernel
    assert len(calls) == (2 if config["SPLIT_K"] > 1 else 1)  # split-K: the fixed-order reduce
    assert bool(torch.isfinite(out).all()), "some outputs were never written"
    assert _rel_err(out, FAMILY.reference(inputs)) < 6e-3


@pytest.mark.parametrize("k", [100, 96])  # ragged (masked) and even k
@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("config", PIPELINED, ids=lambda c: "R{ROWS_PER_BLOCK}-K{BLOCK_K}-S{SPLIT_K}-s{num_stages}".format(**c))
def test_pipelined_fma_loop_matches_fp32_reference(m, k, config):
    shape = {"m": m, "n": 37, "k": k, "dtype": "bfloat16", "bias": 1}
    inputs = FAMILY.make_inputs(shape, "cpu", seed=20 + m)
    out = torch.full((m, 37), float("nan"), dtype=torch.bfloat16)
    FAMILY.launch(inputs, config, out=out)
    _, calls = gemv.launch_plan(inputs, config)
    meta = calls[0].constexprs
    stages = config["num_stages"]
    assert (meta["W_PREFETCH"], meta["PIPE_STAGES"]) == ((1, 1) if stages == 2 else (0, stages))
    assert bool(torch.isfinite(out).all())
    assert _rel_err(out, FAMILY.reference(inputs)) < 6e-3
    # the same summation order as the plain loop: pipelining moves loads, not arithmetic
    plain = FAMILY.launch(inputs, {**config, "num_stages": 1})
    assert parity.output_hash(plain) == parity.output_hash(out)


def test_skinny_split_k_is_deterministic_and_fp16_works():
    shape = {"m": 5, "n": 70, "k": 96, "dtype": "float16"}
    inputs = FAMILY.make_inputs(shape, "cpu", seed=5)
    config = {**SKINNY[1], "SPLIT_K": 4}
    first = FAMILY.launch(inputs, config)
    assert parity.output_hash(first) == parity.output_hash(FAMILY.launch(inputs, config))
    assert _rel_err(first, FAMILY.reference(inputs)) < 1e-3


@pytest.mark.parametrize("k", [100, 104])  # the pointer and the descriptor kernel
def test_balanced_rows_give_the_same_bytes_over_more_programs(k):
    # 200 rows in 64-row tiles: 4 programs; balanced on 132 SMs: 25 programs of 8 rows (the last
    # one ragged), each still computing a 64-row tile and storing only its own rows
    shape = {"m": 3, "n": 200, "k": k, "dtype": "bfloat16", "bias": 1}
    inputs = FAMILY.make_inputs(shape, "cpu", seed=k)
    config = {**SKINNY[0], "BALANCE_N": 1}
    _, calls = gemv.launch_plan(inputs, config)
    assert calls[0].grid == (1, 25, 1)
    out = torch.full((3, 200), float("nan"), dtype=torch.bfloat16)
    FAMILY.launch(inputs, config, out=out)
    assert bool(torch.isfinite(out).all()), "some rows were never written"
    plain = FAMILY.launch(inputs, {**config, "BALANCE_N": 0})
    assert parity.output_hash(plain) == parity.output_hash(out)


def test_balanced_rows_fill_whole_waves():
    from tuner_kernels.skinny import balanced_rows

    assert balanced_rows(14336, 128, 1, 132) == 112  # 112 programs -> 128 (of 132 SMs)
    assert balanced_rows(4096, 64, 1, 132) == 32  # 64 programs -> 128
    assert balanced_rows(28672, 128, 1, 132) == 112  # 224 -> 256 (two waves)
    assert balanced_rows(1024, 64, 4, 132) == 32  # 16 x 4 splits -> 32 x 4
    assert balanced_rows(33792, 128, 1, 132) == 128  # 264 programs: two whole waves already


def test_new_variants_are_checked():
    inputs = FAMILY.make_inputs({"m": 1, "n": 8, "k": 16, "dtype": "bfloat16"}, "cpu")
    with pytest.raises(ValueError, match="USE_DOT must be"):
        FAMILY.launch(inputs, {"ROWS_PER_BLOCK": 64, "BLOCK_K": 16, "SPLIT_K": 1, "USE_DOT": 3})
    with pytest.raises(ValueError, match="USE_DOT=2 needs"):
        FAMILY.launch(inputs, {"ROWS_PER_BLOCK": 8, "BLOCK_K": 16, "SPLIT_K": 1, "USE_DOT": 2})
    with pytest.raises(ValueError, match="BALANCE_N"):
        FAMILY.launch(inputs, {"ROWS_PER_BLOCK": 8, "BLOCK_K": 16, "SPLIT_K": 1, "BALANCE_N": 1})


def test_space_keeps_the_new_variants_where_they_fit():
    cuda, hip = space_for("gemv", "cuda"), space_for("gemv", "hip")
    shape = {"m": 1, "n": 14336, "k": 4096}
    skinny = {"ROWS_PER_BLOCK": 128, "BLOCK_K": 128, "SPLIT_K": 1, "num_warps": 4, "num_stages": 4,
              "USE_DOT": 2, "BALANCE_N": 0}
    assert cuda.allows(skinny, shape)
    assert cuda.allows({**skinny, "BALANCE_N": 1}, shape)  # balanced rows: the skinny kernel only
    assert not cuda.allows({**skinny, "num_stages": 6}, shape)  # 6 x 144 x 128 x 2 B > 160 KiB
    assert not cuda.allows({**skinny, "ROWS_PER_BLOCK": 32}, shape)  # below wgmma's 64 rows
    pipelined = {"ROWS_PER_BLOCK": 1, "BLOCK_K": 1024, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3,
                 "USE_DOT": 0, "BALANCE_N": 0}
    assert cuda.allows(pipelined, shape)
    assert not cuda.allows({**pipelined, "BALANCE_N": 1}, shape)  # not for the FMA loop
    assert not hip.allows({**pipelined, "waves_per_eu": 0}, shape)  # gfx9: no FMA pipelining
    assert hip.allows({**skinny, "BLOCK_K": 64, "num_warps": 8, "num_stages": 2, "waves_per_eu": 0},
                      shape)


NORM_CONFIGS = [
    {"ROWS_PER_BLOCK": 1, "BLOCK_K": 64, "SPLIT_K": 1, "num_warps": 1},  # ragged k: masked
    {"ROWS_PER_BLOCK": 4, "BLOCK_K": 32, "SPLIT_K": 1, "num_warps": 2, "num_stages": 2},
    {"ROWS_PER_BLOCK": 2, "BLOCK_K": 128, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3},
]


@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("config", NORM_CONFIGS, ids=lambda c: "R{ROWS_PER_BLOCK}-K{BLOCK_K}"
                         .format(**c))
def test_the_fma_kernel_carries_the_rms_norm(m, config):
    """y = (rmsnorm(x) * norm_weight) @ Wᵀ + bias from the raw x rows, the norm's weight folded
    into W once (fold_norm_weight): at least as close to the fp32 reference as the unfolded
    torch path (norm, rounded to bf16, then linear), over x rows of very different scales (each
    row's own 1 / rms)."""
    shape = {"m": m, "n": 37, "k": 100, "dtype": "bfloat16", "bias": 1, "norm": 1}
    inputs = FAMILY.make_inputs(shape, "cpu", seed=m)
    inputs["x"] = inputs["x"] * torch.logspace(-2, 2, m).to(torch.bfloat16)[:, None]
    assert not torch.equal(inputs["folded_weight"], inputs["weight"])
    out = FAMILY.launch(inputs, config)
    ref = FAMILY.reference(inputs)
    unfused = FAMILY.baseline(inputs)
    assert _rel_err(out, ref) <= max(1.25 * _rel_err(unfused, ref), 3e-3)
    plain = FAMILY.launch(dict(inputs, norm_weight=None), config)
    assert _rel_err(plain, ref) > 0.1  # the norm is really applied


RESIDUAL_CONFIGS = [
    {"ROWS_PER_BLOCK": 4, "BLOCK_K": 32, "SPLIT_K": 1, "num_warps": 2},  # in the epilogue
    {"ROWS_PER_BLOCK": 2, "BLOCK_K": 32, "SPLIT_K": 3, "num_warps": 1},  # in the split-K reduce
    {"ROWS_PER_BLOCK": 16, "BLOCK_K": 32, "SPLIT_K": 2, "num_warps": 1, "USE_DOT": 1},  # reduce
]


@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("config", RESIDUAL_CONFIGS, ids=lambda c: "S{SPLIT_K}-D{}".format(
    c.get("USE_DOT", 0), **c))
def test_the_kernel_adds_a_residual_before_its_one_rounding(m, config):
    """residual + x @ Wᵀ + bias (a decoder layer's add after its o / down projection): at least
    as close to the fp32 reference as torch's linear then add (two roundings), with and without
    the norm; a residual of strided rows is read as it is."""
    for extra in ({}, {"norm": 1}) if int(config["SPLIT_K"]) == 1 else ({},):
        shape = {"m": m, "n": 37, "k": 100, "dtype": "bfloat16", "bias": 1, "residual": 1, **extra}
        inputs = FAMILY.make_inputs(shape, "cpu", seed=m)
        out = FAMILY.launch(inputs, config)
        ref = FAMILY.reference(inputs)
        assert _rel_err(out, ref) <= max(1.25 * _rel_err(FAMILY.baseline(inputs), ref), 3e-3)
        assert _rel_err(FAMILY.launch(dict(inputs, residual=None), config), ref) > 0.1
    wide = torch.randn(m, 50).to(torch.bfloat16)
    strided = dict(inputs, residual=wide[:, 3:40])
    assert _rel_err(FAMILY.launch(strided, config), FAMILY.reference(strided)) < 1e-2


def test_the_norm_and_the_residual_need_capable_configs():
    shape = {"m": 1, "n": 16, "k": 64, "dtype": "bfloat16", "norm": 1, "residual": 1}
    inputs = FAMILY.make_inputs(shape, "cpu")
    for config in ({"ROWS_PER_BLOCK": 1, "BLOCK_K": 32, "SPLIT_K": 2},
                   {"ROWS_PER_BLOCK": 16, "BLOCK_K": 32, "SPLIT_K": 1, "USE_DOT": 1}):
        assert not gemv.norm_capable(config)
        with pytest.raises(ValueError, match="RMSNorm prologue"):
            FAMILY.launch(inputs, config)
    dot = {"ROWS_PER_BLOCK": 16, "BLOCK_K": 32, "SPLIT_K": 1, "USE_DOT": 1}
    assert not gemv.residual_capable(dot) and gemv.residual_capable({**dot, "SPLIT_K": 2})
    with pytest.raises(ValueError, match="residual epilogue"):
        FAMILY.launch(dict(inputs, norm_weight=None), dot)
    with pytest.raises(ValueError, match="residual must be"):
        gemv.gemv(inputs["x"], inputs["weight"], {"ROWS_PER_BLOCK": 1, "BLOCK_K": 32,
                                                  "SPLIT_K": 1}, residual=inputs["x"][:, :8])
