"""GEMM family under the Triton interpreter (CPU): correctness, split-K determinism, the interface."""



import hashlib  # noqa: E402

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import triton  # noqa: E402
import torch  # noqa: E402

from tuner_kernels import get_family  # noqa: E402
from tuner_kernels import gemm  # noqa: E402
from tuner.spaces import space_for  # noqa: E402

from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

# bf16 output rounding alone is 2^-9 relative; fp32 accumulation adds little on these k.
TOLERANCE = {"bfloat16": 8e-3, "float16": 1e-3}

CONFIGS = [
    {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 1, "SPLIT_K": 1},
    {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 32, "GROUP_M": 2, "SPLIT_K": 1},
    {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 4, "SPLIT_K": 3},
]


def test_kernels_run_under_the_interpreter():
    # If another module imported tuner_kernels.gemm before TRITON_INTERPRET=1 was set, every test here
    # would try to launch compiled kernels on CPU tensors: say so plainly instead.
    assert isinstance(gemm.gemm_kernel, InterpretedFunction)
    assert isinstance(gemm.splitk_reduce_kernel, InterpretedFunction)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


@pytest.mark.parametrize("layout", ["NT", "NN", "TN"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']}-sk{c['SPLIT_K']}")
def test_ragged_shape_matches_fp32_reference(layout, config):
    shape = {"m": 17, "n": 33, "k": 40, "dtype": "bfloat16", "layout": layout}
    inputs = gemm.make_inputs(shape, "cpu", seed=1)
    ref = gemm.reference(inputs)
    out = gemm.launch(inputs, config)
    assert out.shape == (17, 33) and out.dtype == torch.bfloat16
    assert rel_err(out, ref) < TOLERANCE["bfloat16"]
    # Every element is written, including the ragged edges: compare element-wise too.
    assert torch.allclose(out.float(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("layout", ["NT", "TT"])
def test_even_shape_takes_the_unmasked_path(layout):
    # m, n, k multiples of the tile: EVEN_K and EVEN_MN, no masks in the loop.
    shape = {"m": 32, "n": 64, "k": 64, "dtype": "bfloat16", "layout": layout}
    inputs = gemm.make_inputs(shape, "cpu", seed=6)
    config = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 2, "SPLIT_K": 2}
    _, calls = gemm.launch_plan(inputs, config)
    assert calls[0].constexprs["EVEN_K"] and calls[0].constexprs["EVEN_MN"]
    assert rel_err(gemm.launch(inputs, config), gemm.reference(inputs)) < TOLERANCE["bfloat16"]


@pytest.mark.parametrize("layout", ["NT", "NN"])
def test_tma_descriptor_kernel(layout):
    # n = 40 keeps the NN rows 16-byte aligned, so both layouts take the descriptor kernel;
    # ragged m / n / k come back as zeros from out-of-range descriptor reads.
    shape = {"m": 17, "n": 40, "k": 40, "dtype": "bfloat16", "layout": layout}
    inputs = gemm.make_inputs(shape, "cpu", seed=8)
    for split_k in (1, 3):
        config = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 2, "SPLIT_K": split_k, "TMA": 1}
        _, calls = gemm.launch_plan(inputs, config)
        assert calls[0].kernel is gemm.gemm_tma_kernel
        assert rel_err(gemm.launch(inputs, config), gemm.reference(inputs)) < TOLERANCE["bfloat16"]
    # Rows of 33 bf16 (66 bytes) are not 16-byte aligned: the pointer kernel serves TMA=1.
    odd = gemm.make_inputs({**shape, "n": 33, "layout": "NN"}, "cpu", seed=8)
    _, calls = gemm.launch_plan(odd, {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "TMA": 1})
    assert calls[0].kernel is gemm.gemm_kernel


def test_out_argument_is_written_completely():
    shape = {"m": 19, "n": 21, "k": 37, "dtype": "float16", "layout": "NT"}
    inputs = gemm.make_inputs(shape, "cpu", seed=2)
    out = torch.full((19, 21), float("nan"), dtype=torch.float16)
    result = gemm.launch(inputs, {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "SPLIT_K": 2}, out=out)
    assert result.data_ptr() == out.data_ptr()
    assert not torch.isnan(out).any()
    assert rel_err(out, gemm.reference(inputs)) < TOLERANCE["float16"]


def test_batched_bmm_shape():
    shape = {"m": 9, "n": 20, "k": 24, "dtype": "float16", "layout": "NN", "batch": 3}
    inputs = gemm.make_inputs(shape, "cpu", seed=3)
    assert inputs["a"].shape == (3, 9, 24) and inputs["b"].shape == (3, 24, 20)
    for config in (CONFIGS[0], CONFIGS[2]):
        out = gemm.launch(inputs, config)
        assert out.shape == (3, 9, 20)
        assert rel_err(out, gemm.reference(inputs)) < TOLERANCE["float16"]


def test_split_k_is_deterministic_and_close_to_no_split():
    shape = {"m": 17, "n": 33, "k": 96, "dtype": "bfloat16", "layout": "NT"}
    inputs = gemm.make_inputs(shape, "cpu", seed=4)
    config = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 1, "SPLIT_K": 4}
    first, second = gemm.launch(inputs, config), gemm.launch(inputs, config)
    assert digest(first) == digest(second)
    no_split = gemm.launch(inputs, {**config, "SPLIT_K": 1})
    assert rel_err(first, gemm.reference(inputs)) < TOLERANCE["bfloat16"]
    assert rel_err(first, no_split.float()) < TOLERANCE["bfloat16"]


def test_default_configs_run_and_satisfy_their_space():
    shape = {"m": 24, "n": 40, "k": 72, "dtype": "bfloat16", "layout": "NT"}
    inputs = gemm.make_inputs(shape, "cpu", seed=5)
    ref = gemm.reference(inputs)
    for backend in ("cuda", "hip", "dcu"):
        config = gemm.default_config(shape, backend)
        assert space_for("gemm", backend).allows(config, shape)
        assert rel_err(gemm.launch(inputs, config), ref) < TOLERANCE["bfloat16"]
    # Real 8B-model shapes: the defaults stay inside every backend's space.
    for m in (16, 64, 512, 4096):
        for n, k in ((4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336)):
            big = {"m": m, "n": n, "k": k, "dtype": "bfloat16", "layout": "NT"}
            for backend in ("cuda", "hip", "dcu"):
                assert space_for("gemm", backend).allows(gemm.default_config(big, backend), big), (backend, big)


def test_fresh_inputs_are_random_and_reproducible():
    shape = {"m": 16, "n": 32, "k": 48, "dtype": "bfloat16", "layout": "NT"}
    one, again, other = (gemm.make_inputs(shape, "cpu", seed=s) for s in (7, 7, 8))
    assert torch.equal(one["a"], again["a"]) and torch.equal(one["b"], again["b"])
    assert not torch.equal(one["a"], other["a"])
    assert (one["a"] != 0).float().mean() > 0.99
    # NT: b is the [k, n] view of a [n, k] weight, as F.linear sees it.
    assert one["b"].shape == (48, 32) and one["b"].stride() == (1, 48)
    assert torch.allclose(gemm.baseline(one).float(), gemm.reference(one), atol=2e-2, rtol=2e-2)


def test_shape_from_row_and_shape_key():
    family = get_family("gemm")
    assert family is gemm.FAMILY and family.name == "gemm"
    row = pd.Series({"family": "gemm", "op": "aten::mm", "m": 512, "n": 4096, "k": 4096, "batch": 1,
                     "dtype": "bfloat16", "layout": "NT"})
    shape = family.shape_from_row(row)
    assert shape == {"m": 512, "n": 4096, "k": 4096, "dtype": "bfloat16", "layout": "NT"}
    assert family.shape_key(shape) == "m=512,n=4096,k=4096,dtype=bfloat16,layout=NT"
    assert family.shape_from_row({**row.to_dict(), "m": 8}) is None  # gemv territory
    bmm = family.shape_from_row({**row.to_dict(), "m": 1, "batch": 32, "op": "aten::bmm", "layout": "NN"})
    assert bmm == {"m": 1, "n": 4096, "k": 4096, "dtype": "bfloat16", "layout": "NN", "batch": 32}
    assert family.shape_key(bmm).startswith("batch=32,m=1,")
    assert family.shape_from_row({**row.to_dict(), "family": "attention"}) is None
    assert family.shape_from_row({**row.to_dict(), "dtype": "float32"}) is None
    assert family.flops(shape) == 2 * 512 * 4096 * 4096
    assert family.bytes_moved(shape) == 2 * (512 * 4096 + 4096 * 4096 + 512 * 4096)
    assert len(family.source_hash()) == 16


def test_parity_checker_on_gemm():
    from tuner import parity

    shape = {"m": 17, "n": 33, "k": 64, "dtype": "bfloat16", "layout": "NT"}
    split = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 1, "SPLIT_K": 2}
    facts = parity.Checker(gemm.FAMILY, shape, device="cpu", seeds=2).facts(split)
    assert facts.passes("accuracy") and facts.error_vs_reference < 1e-2, facts
    # A config is bit-identical to itself (split-K reduction in a fixed order).
    again = parity.Checker(gemm.FAMILY, shape, device="cpu", seeds=2, default_config=split)
    assert again.facts(split).passes("kernel")


def test_real_prefill_rows_from_the_bundled_table():
    # The bundled Qwen2.5-0.5B trace: prefill linears (m = 512) are gemm's; decode ones (m = 4) gemv's.
    from pathlib import Path

    from tuner import shapetable

    table = shapetable.read(Path(__file__).resolve().parent.parent / "shapes" / "examples" / "qwen25_05b_b4_decode.parquet")
    gemm_rows = table[table["family"] == "gemm"]
    shapes = [s for s in (gemm.shape_from_row(row) for _, row in gemm_rows.iterrows()) if s]
    # m > 8 in bf16 / fp16 (the fp32 rotary-embedding bmm rows stay with torch)
    wanted = (gemm_rows["m"] > 8) & gemm_rows["dtype"].isin(list(gemm.DTYPES))
    assert shapes and len(shapes) == int(wanted.sum())
    assert all(s["m"] > 8 and s["layout"] in gemm.LAYOUTS for s in shapes)
    assert {"m": 512, "n": 4864, "k": 896, "dtype": "bfloat16", "layout": "NT"} in shapes
    for shape in shapes:
        for backend in ("cuda", "hip", "dcu"):
            assert space_for("gemm", backend).allows(gemm.default_config(shape, backend), shape)


# ----------------------------------------------------------- SWAP_AB, the skinny decode kernel
SKINNY = [
    {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 16, "GROUP_M": 1, "SPLIT_K": 1, "SWAP_AB": 1, "TMA": 1},
    {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 1, "SPLIT_K": 3, "SWAP_AB": 1, "TMA": 1},
    {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 16, "GROUP_M": 1, "SPLIT_K": 2, "SWAP_AB": 1, "TMA": 0},
]


@pytest.mark.parametrize("m", [16, 17, 33])
@pytest.mark.parametrize("layout", ["NT", "NN", "TN"])
@pytest.mark.parametrize("config", SKINNY, ids=lambda c: f"{c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']}-sk{c['SPLIT_K']}-tma{c['TMA']}")
def test_skinny_kernel_matches_fp32_reference(m, layout, config):
    # n = 70 is no multiple of BLOCK_N, k = 40 none of BLOCK_K; m = 17 / 33 need a second,
    # ragged activation tile. NT with TMA = 1 takes the descriptor kernel (80-byte rows).
    shape = {"m": m, "n": 70, "k": 40, "dtype": "bfloat16", "layout": layout}
    inputs = gemm.make_inputs(shape, "cpu", seed=m)
    out = torch.full((m, 70), float("nan"), dtype=torch.bfloat16)
    result = gemm.launch(inputs, config, out=out)
    assert result.data_ptr() == out.data_ptr() and not torch.isnan(out).any()
    _, calls = gemm.launch_plan(inputs, config)
    want = "skinny_tma_kernel" if layout == "NT" and config["TMA"] else "skinny_kernel"
    assert calls[0].kernel.fn.__name__ == want
    assert calls[0].grid == (triton.cdiv(m, config["BLOCK_M"]), 2, config["SPLIT_K"])
    assert rel_err(out, gemm.reference(inputs)) < TOLERANCE["bfloat16"]


def test_skinny_split_k_is_deterministic_and_batched_shapes_keep_the_tiled_kernel():
    shape = {"m": 20, "n": 64, "k": 128, "dtype": "float16", "layout": "NT"}
    inputs = gemm.make_inputs(shape, "cpu", seed=9)
    config = {**SKINNY[1], "SPLIT_K": 4}
    first, second = gemm.launch(inputs, config), gemm.launch(inputs, config)
    assert digest(first) == digest(second)
    assert rel_err(first, gemm.reference(inputs)) < TOLERANCE["float16"]
    bmm = gemm.make_inputs({**shape, "batch": 2, "layout": "NN"}, "cpu", seed=9)
    _, calls = gemm.launch_plan(bmm, SKINNY[0])
    assert calls[0].kernel is gemm.gemm_kernel
    assert rel_err(gemm.launch(bmm, SKINNY[0]), gemm.reference(bmm)) < TOLERANCE["float16"]


@pytest.mark.parametrize("tma", [0, 1])
def test_skinny_balanced_rows_give_the_same_bytes(tma):
    # 70 rows in 64-row tiles: 2 programs; balanced on 132 SMs (2 activation tiles share each
    # row range): 9 programs of 8 rows a tile column
    shape = {"m": 20, "n": 70, "k": 40, "dtype": "bfloat16", "layout": "NT"}
    inputs = gemm.make_inputs(shape, "cpu", seed=3)
    config = {**SKINNY[0], "TMA": tma, "BALANCE_N": 1}
    _, calls = gemm.launch_plan(inputs, config)
    assert calls[0].grid == (2, 9, 1)
    out = torch.full((20, 70), float("nan"), dtype=torch.bfloat16)
    gemm.launch(inputs, config, out=out)
    assert not torch.isnan(out).any()
    assert digest(out) == digest(gemm.launch(inputs, {**config, "BALANCE_N": 0}))
    assert rel_err(out, gemm.reference(inputs)) < TOLERANCE["bfloat16"]


# REDUCE_LAST: the tile's last K split sums the partials in the same launch
REDUCE_CASES = {  # (shape, config): the tiled pointer and descriptor kernels, the skinny pair, a bmm
    "tiled": ({"m": 40, "n": 70, "k": 200, "layout": "NT"},
              {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 2, "SPLIT_K": 3, "TMA": 0}),
    "tiled-tma": ({"m": 40, "n": 64, "k": 256, "layout": "NT"},
                  {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 1, "SPLIT_K": 2, "TMA": 1}),
    "skinny": ({"m": 20, "n": 70, "k": 192, "layout": "NT"}, {**SKINNY[2], "SPLIT_K": 4}),
    "skinny-tma": ({"m": 20, "n": 64, "k": 192, "layout": "NT"}, SKINNY[1]),
    "bmm": ({"m": 9, "n": 20, "k": 96, "layout": "NN", "batch": 3},
            {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "SPLIT_K": 2}),
}


@pytest.mark.parametrize("case", sorted(REDUCE_CASES))
def test_reduce_last_is_one_launch_with_the_same_bytes(case):
    shape, config = REDUCE_CASES[case]
    shape = {**shape, "dtype": "bfloat16"}
    inputs = gemm.make_inputs(shape, "cpu", seed=5)
    _, two = gemm.launch_plan(inputs, config)
    _, one = gemm.launch_plan(inputs, {**config, "REDUCE_LAST": 1})
    assert [c.kernel for c in two][1:] == [gemm.splitk_reduce_kernel]
    assert len(one) == 1 and one[0].kernel is two[0].kernel and one[0].constexprs["REDUCE_LAST"]
    counts = one[0].args[4]
    assert counts.dtype == torch.int32 and not counts.any()  # zeroed with the launch
    assert counts.numel() == one[0].grid[0] * (one[0].grid[1] if config.get("SWAP_AB") else
                                               one[0].grid[2] if len(one[0].grid) == 3 else 1)
    out = torch.full((shape.get("batch", 1), shape["m"], shape["n"]) if "batch" in shape
                     else (shape["m"], shape["n"]), float("nan"), dtype=torch.bfloat16)
    gemm.launch(inputs, {**config, "REDUCE_LAST": 1}, out=out)
    assert not torch.isnan(out).any()  # every tile stored, by exactly its last split
    assert digest(out) == digest(gemm.launch(inputs, config))
    assert rel_err(out, gemm.reference(inputs)) < TOLERANCE["bfloat16"]


def test_reduce_last_in_the_space_not_in_the_known_configs():
    from tuner_kernels.candidates import candidate_configs

    shape = {"m": 128, "n": 4096, "k": 4096, "dtype": "bfloat16", "layout": "NT"}
    space = space_for("gemm", "cuda")
    default = gemm.default_config(shape, "cuda")
    assert default["REDUCE_LAST"] == 0 and space.allows(default, shape)
    split = {**default, "SPLIT_K": 4}
    assert space.allows({**split, "REDUCE_LAST": 1}, shape)
    assert not space.allows({**default, "SPLIT_K": 1, "REDUCE_LAST": 1}, shape)  # nothing to sum
    assert "REDUCE_LAST" not in space.order_params  # the same bytes (test above)
    known = candidate_configs("gemm", shape, "cuda", 132)
    splits = [c for c in known if c.get("SPLIT_K", 1) > 1]
    assert splits and all(c["REDUCE_LAST"] == 0 for c in splits)  # slower on the H200: not known


def test_swap_ab_in_the_spaces():
    shape = {"m": 32, "n": 14336, "k": 4096, "dtype": "bfloat16", "layout": "NT"}
    config = {"BLOCK_M": 32, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 1, "SPLIT_K": 1,
              "SWAP_AB": 1, "num_warps": 4, "num_stages": 4, "TMA": 1, "BALANCE_N": 1, "REDUCE_LAST": 0, "SCHEDULE": 0}
    cuda = space_for("gemm", "cuda")
    assert cuda.check(config, shape) == ""
    assert cuda.check({**config, "SWAP_AB": 0, "BLOCK_K": 64}, shape) != ""  # balance: skinny only
    assert cuda.check({**config, "num_stages": 6}, shape) != ""  # 6 x 160 x 128 x 2 B > 227 KB
    assert cuda.check({**config, "BLOCK_N": 32}, shape) != ""  # below wgmma's 64 rows
    assert cuda.check({**config, "SWAP_AB": 0, "BLOCK_K": 256}, shape) != ""  # 256: skinny only
    assert not cuda.allows(config, {**shape, "m": 512})  # decode batch sizes only
    hip = space_for("gemm", "hip")
    amd = {**{k: v for k, v in config.items() if k != "TMA"}, "BLOCK_K": 64, "num_stages": 2,
           "waves_per_eu": 0, "matrix_instr_nonkdim": 16, "kpack": 1}
    assert hip.check(amd, shape) == ""
    assert "SWAP_AB" in space_for("gemm", "dcu").params
    # every default config names SWAP_AB (the loader refuses configs with missing parameters);
    # on cuda a decode batch defaults to the skinny kernel (the H200 sweep's winner)
    for backend in ("cuda", "hip", "dcu"):
        assert gemm.default_config(shape, backend)["SWAP_AB"] == (1 if backend == "cuda" else 0)
        assert space_for("gemm", backend).check(gemm.default_config(shape, backend), shape) == ""


# ------------------------------------------------- SCHEDULE, the persistent tile scheduler
@pytest.mark.parametrize("layout", ["NT", "NN", "TN"])
@pytest.mark.parametrize("tma", [0, 1])
def test_persistent_schedule_walks_every_tile(monkeypatch, layout, tma):
    # 2 "multiprocessors": 2 programs walk the 3 x 3 tiles of a ragged 40 x 72 x 40 output (odd
    # k: masked K tiles on the pointer path, zero-filled ones through descriptors). The output
    # is poisoned first, so an unvisited tile shows; the summation order is the tiled kernel's
    # with the same tile (SPLIT_K 1), so under the interpreter the bytes are the same, and the
    # subtiled epilogue (SCHEDULE 2) writes the same bytes as the whole-tile one.
    monkeypatch.setattr(gemm, "sm_count", lambda device=None: 2)
    shape = {"m": 40, "n": 72, "k": 40, "dtype": "bfloat16", "layout": layout}
    inputs = gemm.make_inputs(shape, "cpu", seed=11)
    tiled = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 2, "SPLIT_K": 1, "TMA": tma}
    written = {}
    for schedule in (1, 2):
        config = {**tiled, "SCHEDULE": schedule}
        _, calls = gemm.launch_plan(inputs, config)
        (call,) = calls
        assert call.kernel is gemm.gemm_persistent_kernel and call.grid == (2,)
        assert call.constexprs["TMA"] == (tma == 1 and layout != "TN")  # TN: A is no row-major [m, k]
        assert call.constexprs["EPILOGUE_SUBTILE"] == (schedule == 2)
        out = torch.full((40, 72), float("nan"), dtype=torch.bfloat16)
        gemm.launch(inputs, config, out=out)
        assert not torch.isnan(out).any()
        assert rel_err(out, gemm.reference(inputs)) < TOLERANCE["bfloat16"]
        written[schedule] = digest(out)
    assert written[1] == written[2] == digest(gemm.launch(inputs, {**tiled, "SCHEDULE": 0}))


def test_persistent_schedule_grid_edges_and_refusals():
    # More multiprocessors (132 on the CPU) than tiles: one program per tile, never an idle one.
    shape = {"m": 32, "n": 64, "k": 32, "dtype": "float16", "layout": "NT"}
    inputs = gemm.make_inputs(shape, "cpu", seed=12)
    config = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 1, "SPLIT_K": 1, "SCHEDULE": 1}
    _, (call,) = gemm.launch_plan(inputs, config)
    assert call.grid == (4,) and call.constexprs["EVEN_K"]
    # the program count is a runtime argument: another m (6 tiles) compiles nothing new
    _, (other,) = gemm.launch_plan(gemm.make_inputs({**shape, "m": 48}, "cpu", seed=12), config)
    assert call.args[-1] == 4 and other.args[-1] == other.grid[0] == 6
    assert other.constexprs == call.constexprs
    assert rel_err(gemm.launch(inputs, config), gemm.reference(inputs)) < TOLERANCE["float16"]
    with pytest.raises(ValueError, match="without split K"):
        gemm.launch_plan(inputs, {**config, "SPLIT_K": 2})
    with pytest.raises(ValueError, match="SCHEDULE must be one of"):
        gemm.launch_plan(inputs, {**config, "SCHEDULE": 4})
    # batched (bmm) shapes keep the tiled kernel
    bmm = gemm.make_inputs({**shape, "batch": 2, "layout": "NN"}, "cpu", seed=12)
    _, calls = gemm.launch_plan(bmm, config)
    assert calls[0].kernel is gemm.gemm_kernel


def test_persistent_schedule_in_the_spaces():
    shape = {"m": 4096, "n": 4096, "k": 4096, "dtype": "bfloat16", "layout": "NT"}
    config = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": 1,
              "SWAP_AB": 0, "BALANCE_N": 0, "REDUCE_LAST": 0, "SCHEDULE": 2, "TMA": 1, "num_warps": 8, "num_stages": 3}
    cuda = space_for("gemm", "cuda")
    assert cuda.check(config, shape) == ""
    assert cuda.check({**config, "SPLIT_K": 2}, shape) != ""  # persistent: no split K
    assert cuda.check({**config, "BLOCK_N": 32, "num_warps": 4}, shape) != ""  # halves < 32 columns
    assert cuda.check({**config, "SCHEDULE": 1, "BLOCK_N": 32, "num_warps": 4}, shape) == ""
    assert not cuda.allows(config, {**shape, "m": 64})  # prefill-sized m only
    assert "SCHEDULE" in cuda.order_params
    for backend in ("hip", "dcu"):  # the persistent path on AMD: pointer loads, no TMA parameter
        space = space_for("gemm", backend)
        assert "TMA" not in space.params and space.params["SCHEDULE"] == [0, 1, 2, 3]
        amd = {**{k: v for k, v in config.items() if k != "TMA"}, "BLOCK_N": 128, "BLOCK_K": 32,
               "num_stages": 2, "waves_per_eu": 0, "matrix_instr_nonkdim": 16, "kpack": 1}
        assert space.check(amd, shape) == ""


def test_the_prefill_gemm_script_runs_its_cpu_smoke(tmp_path):
    """scripts/gpu/prefill_gemm.py --smoke (interpreter, tiny shapes): every case timed against
    torch with the persistent schedule among the configs, paired, judged and ranked."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "scripts/gpu/prefill_gemm.py", "--smoke", "--out",
                           str(tmp_path)], cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert sorted(r["m"] for r in rows) == [144, 160]
    for r in rows:
        assert r["best_persistent_us"] > 0 and r["best_tiled_us"] > 0
        assert r["low"] <= r["speedup"] <= r["high"] and r["error_ratio"] < 1.25
    assert proc.stdout.count("rank m=") == 2 and "== gemm vs torch.matmul" in proc.stdout


@pytest.mark.parametrize("schedule", [0, 1])
def test_the_m_fastest_tile_order_writes_the_same_bytes(schedule):
    """GROUP_M moves work only: with three row tiles, the row order (GROUP_M 1), a grouped
    order (2) and the m-fastest order (4, at least the row tiles: search_spaces/gemm.yaml keeps
    only the smallest such value) give the same output bytes, one and persistent schedules."""
    shape = {"m": 48, "n": 64, "k": 64, "dtype": "bfloat16", "layout": "NT"}
    inputs = gemm.make_inputs(shape, "cpu", seed=3)
    base = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "SPLIT_K": 1, "SCHEDULE": schedule}
    outs = [gemm.launch(inputs, {**base, "GROUP_M": g}) for g in (1, 2, 4)]
    assert digest(outs[0]) == digest(outs[1]) == digest(outs[2])
    assert rel_err(outs[0], gemm.reference(inputs)) < TOLERANCE["bfloat16"]


# ------------------------------------------------- SCHEDULE 3, the tail split
def tile_owner(m: int, n: int, block_m: int, block_n: int, group_m: int) -> torch.Tensor:
    """[m, n]: the grouped-order tile id of each output element (gemm._tile_of's order)."""
    tiles_m, tiles_n = triton.cdiv(m, block_m), triton.cdiv(n, block_n)
    owner = torch.empty(m, n, dtype=torch.long)
    for tile in range(tiles_m * tiles_n):
        in_group = group_m * tiles_n
        first = tile // in_group * group_m
        size = min(tiles_m - first, group_m)
        pid_m, pid_n = first + tile % in_group % size, tile % in_group // size
        owner[pid_m * block_m:(pid_m + 1) * block_m, pid_n * block_n:(pid_n + 1) * block_n] = tile
    return owner


@pytest.mark.parametrize("layout", ["NT", "NN", "TN"])
@pytest.mark.parametrize("tma", [0, 1])
def test_the_tail_split_runs_whole_waves_over_k_and_splits_the_last_wave(monkeypatch, layout, tma):
    # 4 "multiprocessors", the 3 x 3 tiles of a ragged 40 x 72 x 72 output (k of 4.5 K tiles: two
    # splits of 3 and 2 tiles, masked on the pointer path, zero-filled by descriptors): tiles 0-7
    # (two whole waves) in one launch over all of K, tile 8 (the partial wave) in a second as 2
    # K splits summed by the last to arrive. The output is poisoned first; each whole-wave tile
    # has the bytes SPLIT_K 1 gives it, the split tile those SPLIT_K 2 (REDUCE_LAST) gives.
    monkeypatch.setattr(gemm, "sm_count", lambda device=None: 4)
    shape = {"m": 40, "n": 72, "k": 72, "dtype": "bfloat16", "layout": layout}
    inputs = gemm.make_inputs(shape, "cpu", seed=13)
    tiled = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 2, "TMA": tma}
    config = {**tiled, "SPLIT_K": 2, "SCHEDULE": 3}
    _, calls = gemm.launch_plan(inputs, config)
    assert [c.grid[:2] for c in calls] == [(8, 1), (1, 2)]
    assert [c.args[-1] for c in calls] == [0, 8]  # tile_base
    assert [c.constexprs["TILE_PARTS"] for c in calls] == [False, True]
    descriptors = tma == 1 and layout != "TN"
    assert {c.kernel for c in calls} == {gemm.gemm_tma_kernel if descriptors else gemm.gemm_kernel}
    whole = gemm.launch(inputs, {**tiled, "SPLIT_K": 1, "SCHEDULE": 0})
    split = gemm.launch(inputs, {**tiled, "SPLIT_K": 2, "REDUCE_LAST": 1, "SCHEDULE": 0})
    last = tile_owner(40, 72, 16, 32, 2) == 8
    for index, tiles, expected in ((0, ~last, whole), (1, last, split)):
        out, plan = gemm.launch_plan(inputs, config, torch.full((40, 72), float("nan"),
                                                                dtype=torch.bfloat16))
        plan[index].run()  # this launch alone, on a poisoned output
        assert torch.equal(~torch.isnan(out), tiles)  # exactly its tiles written
        assert torch.equal(out[tiles], expected[tiles])
    out = torch.full((40, 72), float("nan"), dtype=torch.bfloat16)
    gemm.launch(inputs, config, out=out)
    assert torch.equal(out, torch.where(last, split, whole))
    assert rel_err(out, gemm.reference(inputs)) < TOLERANCE["bfloat16"]


def test_the_tail_split_at_its_edges_and_refusals(monkeypatch):
    shape = {"m": 48, "n": 64, "k": 64, "dtype": "bfloat16", "layout": "NT"}
    inputs = gemm.make_inputs(shape, "cpu", seed=14)
    tiled = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 1}
    config = {**tiled, "SPLIT_K": 4, "SCHEDULE": 3}
    # fewer tiles (6) than one wave (132 on the CPU): every tile split, one launch, the bytes of
    # SPLIT_K 4 with REDUCE_LAST
    _, (call,) = gemm.launch_plan(inputs, config)
    assert call.grid[:2] == (6, 4) and call.constexprs["REDUCE_LAST"]
    reduce_last = gemm.launch(inputs, {**tiled, "SPLIT_K": 4, "REDUCE_LAST": 1})
    assert torch.equal(gemm.launch(inputs, config), reduce_last)
    # a whole number of waves (6 tiles on 3): one launch over all of K, SPLIT_K 1's bytes
    monkeypatch.setattr(gemm, "sm_count", lambda device=None: 3)
    _, (call,) = gemm.launch_plan(inputs, config)
    assert call.grid[:2] == (6, 1) and not call.constexprs["REDUCE_LAST"]
    assert torch.equal(gemm.launch(inputs, config), gemm.launch(inputs, {**tiled, "SPLIT_K": 1}))
    with pytest.raises(ValueError, match="needs SPLIT_K >= 2"):
        gemm.launch_plan(inputs, {**config, "SPLIT_K": 1})
    # batched (bmm) shapes keep the tiled kernel with the config's split
    bmm = gemm.make_inputs({**shape, "batch": 2, "layout": "NN"}, "cpu", seed=14)
    _, calls = gemm.launch_plan(bmm, config)
    assert calls[0].kernel is gemm.gemm_kernel and calls[0].grid == (6, 4, 2)


def test_the_tail_split_in_the_spaces():
    # Llama-3.1-8B's qkv at m = 512: 4 x 48 = 192 tiles of 128 x 128, 1.45 waves of an H100's 132
    shape = {"m": 512, "n": 6144, "k": 4096, "dtype": "bfloat16", "layout": "NT"}
    config = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 4, "SPLIT_K": 2,
              "SWAP_AB": 0, "BALANCE_N": 0, "REDUCE_LAST": 0, "SCHEDULE": 3, "TMA": 1,
              "num_warps": 8, "num_stages": 3}
    cuda = space_for("gemm", "cuda")
    assert cuda.check(config, shape) == ""  # split K past 256 tiles too: only the tail splits
    assert cuda.check(config, {**shape, "n": 28672}) == ""  # 896 tiles
    assert cuda.check({**config, "SPLIT_K": 1}, shape) != ""
    assert cuda.check({**config, "REDUCE_LAST": 1}, shape) != ""  # the same plan twice
    assert not cuda.allows(config, {**shape, "m": 64})
    assert cuda.check({**config, "SCHEDULE": 0}, {**shape, "n": 28672}) != ""  # 0 keeps its rule
    for backend in ("hip", "dcu"):
        amd = {**{k: v for k, v in config.items() if k != "TMA"}, "BLOCK_K": 32,
               "num_stages": 2, "waves_per_eu": 0, "matrix_instr_nonkdim": 16, "kpack": 1}
        assert space_for("gemm", backend).check(amd, shape) == ""
