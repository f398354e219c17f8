"""Known configs (tuner_kernels/candidates.py) and compiling ahead (tuner/precompile.py).

The known lists are what a search queues first and what scripts/gpu/sweep_linears.sh sweeps: on the
8B decode shapes every one must be a valid config of the cuda space (or the search would drop
it), and the measured m = 32 winners must be among them. Compiling ahead is checked on CPU with
a stand-in kernel (the scheduling: order, failures as data, deadline, stop); that a real launch
then finds the compiled kernel is the gpu test.
"""

from __future__ import annotations

import threading
import time

import pytest

from tuner_kernels import gemm, gemv
from tuner_kernels.candidates import GEMV_DOT_ROWS, candidate_configs, split_counts
from tuner_kernels.common import KernelCall
from tuner import precompile
from tuner.search import make_plan, known_params
from tuner.spaces import space_for

DECODE_NK = [(4096, 4096), (1024, 4096), (6144, 4096), (12288, 4096), (4096, 12288),
             (14336, 4096), (4096, 14336), (24576, 4096), (2048, 5376), (21504, 5376)]


def _shape(m: int, n: int, k: int) -> dict:
    if m <= gemv.MAX_M:
        return {"m": m, "n": n, "k": k, "dtype": "bfloat16"}
    return {"m": m, "n": n, "k": k, "dtype": "bfloat16", "layout": "NT"}


def test_gemv_dot_rows_agree():
    assert GEMV_DOT_ROWS == gemv.DOT_ROWS


@pytest.mark.parametrize("m", [1, 4, 8, 16, 32, 64, 128, 256])
def test_known_configs_of_the_decode_shapes_are_valid_cuda_configs(m):
    module = gemv if m <= gemv.MAX_M else gemm
    space = space_for(module.FAMILY.name, "cuda")
    for n, k in DECODE_NK:
        shape = _shape(m, n, k)
        default = module.default_config(shape, "cuda", sm_count=132)
        raw = candidate_configs(module.FAMILY.name, shape, "cuda", 132)
        known = space.known(raw, shape, default)
        assert len(known) >= 8, (m, n, k, len(raw), len(known))
        full_default = {p: default[p] for p in space.params}
        assert full_default not in known
        assert len({tuple(sorted(c.items())) for c in known}) == len(known)
        for config in known:
            assert space.check(config, shape) == "", (m, n, k, config)


def test_the_measured_m32_winners_are_known():
    """The 2026-12-01 afternoon search's m = 32 winners (BLOCK_M 16 on 4096x4096 and 4096x12288,
    the split-8 config on 1024x4096), which the evening's 40 s search did not reach. (That k/v
    winner had BALANCE_N 1, which on 132 SMs gives every program its 64 rows: the same launch.)"""
    space = space_for("gemm", "cuda")
    winners = {
        (4096, 4096): {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 256, "SPLIT_K": 1, "SWAP_AB": 1,
                       "TMA": 1, "num_stages": 4, "num_warps": 4, "BALANCE_N": 0, "REDUCE_LAST": 0, "GROUP_M": 1, "SCHEDULE": 0},
        (4096, 12288): {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 256, "SPLIT_K": 1, "SWAP_AB": 1,
                        "TMA": 1, "num_stages": 4, "num_warps": 4, "BALANCE_N": 0, "REDUCE_LAST": 0, "GROUP_M": 1, "SCHEDULE": 0},
        (1024, 4096): {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 64, "SPLIT_K": 8, "SWAP_AB": 1,
                       "TMA": 0, "num_stages": 6, "num_warps": 4, "BALANCE_N": 0, "REDUCE_LAST": 0, "GROUP_M": 1, "SCHEDULE": 0},
    }
    for (n, k), winner in winners.items():
        shape = _shape(32, n, k)
        default = gemm.default_config(shape, "cuda", sm_count=132)
        known = space.known(candidate_configs("gemm", shape, "cuda", 132), shape, default)
        assert winner in known, (n, k)


def test_no_known_configs_where_nothing_was_measured():
    shape = _shape(32, 4096, 4096)
    assert candidate_configs("gemm", shape, "hip", 304) == []
    assert candidate_configs("gemm", shape, "dcu", 64) == []
    assert candidate_configs("attention", {"batch": 1}, "cuda", 132) == []


def test_split_counts_fill_the_machine_and_keep_k_tiles():
    assert split_counts(200, 4096, 128, 4, 132) == []  # enough programs already
    assert split_counts(32, 4096, 128, 4, 132) == [8]  # 32 x 8 = 256, nearest 1.5 x 132
    assert split_counts(32, 4096, 128, 4, 132, count=2) == [4, 8]
    assert split_counts(32, 1024, 128, 4, 132) == [2]  # 8 K tiles: 4 a slice at most


def test_a_plan_queues_the_known_configs_the_space_allows():
    shape = _shape(32, 4096, 4096)
    space = space_for("gemm", "cuda")
    default = gemm.default_config(shape, "cuda", sm_count=132)
    plan = make_plan(family="gemm", shape=shape, shape_key=gemm.shape_key(shape), device_key="d",
                     backend="cuda", space=space, default_config=default, weight=1.0,
                     known_configs=candidate_configs("gemm", shape, "cuda", 132))
    assert known_params(plan) == space.known(candidate_configs("gemm", shape, "cuda", 132),
                                             shape, default)
    under_kernel_gate = make_plan(family="gemm", shape=shape, shape_key=gemm.shape_key(shape),
                                  device_key="d", backend="cuda", space=space,
                                  default_config=default, weight=1.0, parity_mode="kernel",
                                  known_configs=candidate_configs("gemm", shape, "cuda", 132))
    for config in known_params(under_kernel_gate):  # only the default's output class
        assert all(config[p] == default[p] for p in space.order_params if p in default)


# ---------------------------------------------------------------------------- compile ahead
class _StandInKernel:
    """Records warmups like JITFunction.warmup is called; fails or sleeps on request."""

    def __init__(self, log: list, fail_on=(), sleep_s: float = 0.0):
        self.log, self.fail_on, self.sleep_s = log, set(fail_on), sleep_s

    def warmup(self, *args, grid, **kwargs):
        time.sleep(self.sleep_s)
        if kwargs.get("BLOCK") in self.fail_on:
            raise RuntimeError("PTX assembly aborted: out of resources\nmore lines")
        self.log.append((kwargs["BLOCK"], kwargs["num_warps"]))


class _StandInFamily:
    name = "stand-in"

    def __init__(self, kernel):
        self.kernel = kernel

    def make_inputs(self, shape, device, seed=0):
        assert device == "meta"
        return {"n": shape["n"]}

    def launch_plan(self, inputs, config, out=None, backend=None):
        calls = [KernelCall(self.kernel, (1,), (), {"BLOCK": config["BLOCK"]}, {"num_warps": 4})]
        if config.get("SPLIT_K", 1) > 1:  # a second (reduce) kernel
            calls.append(KernelCall(self.kernel, (1,), (), {"BLOCK": -1}, {"num_warps": 1}))
        return None, calls


@pytest.fixture
def compiling(monkeypatch):
    monkeypatch.setattr(precompile, "_interpreting", lambda: False)


def test_precompile_warms_every_kernel_call_and_keeps_failures_as_data(compiling):
    log = []
    family = _StandInFamily(_StandInKernel(log, fail_on={64}))
    jobs = [(family, {"n": 8}, {"BLOCK": 32}), (family, {"n": 8}, {"BLOCK": 64}),
            (family, {"n": 8}, {"BLOCK": 128, "SPLIT_K": 2})]
    report = precompile.precompile(jobs, "cuda", threads=2)
    assert sorted(log) == [(-1, 1), (32, 4), (128, 4)]
    assert report.compiled == 3 and report.jobs == 3 and report.skipped == 0
    assert report.failures == {1: "RuntimeError: PTX assembly aborted: out of resources"}


def test_precompile_skips_what_the_deadline_or_a_stop_leaves(compiling):
    log = []
    family = _StandInFamily(_StandInKernel(log, sleep_s=0.05))
    jobs = [(family, {"n": 8}, {"BLOCK": b}) for b in range(20)]
    report = precompile.precompile(jobs, "cuda", threads=1, deadline=time.time() + 0.12)
    assert 1 <= report.compiled <= 5 and report.compiled + report.skipped == 20
    stop = threading.Event()
    stop.set()
    assert precompile.precompile(jobs, "cuda", threads=2, stop=stop).skipped == 20


def test_compile_ahead_compiles_in_submission_order_and_close_drops_the_rest(compiling):
    log = []
    family = _StandInFamily(_StandInKernel(log, sleep_s=0.02))
    ahead = precompile.CompileAhead("cuda", threads=1)
    ahead.submit([(family, {"n": 8}, {"BLOCK": b}) for b in range(50)])
    deadline = time.time() + 5
    while len(log) < 3 and time.time() < deadline:
        time.sleep(0.01)
    ahead.close()
    done = len(log)
    time.sleep(0.1)
    assert [b for b, _ in log[:3]] == [0, 1, 2]
    assert len(log) <= done + 1 < 50  # at most the one in progress finishes after close
    ahead.submit([(family, {"n": 8}, {"BLOCK": 99})])  # after close: ignored, no error
    assert (99, 4) not in log


def test_nothing_is_compiled_under_the_interpreter():
    log = []
    family = _StandInFamily(_StandInKernel(log))
    report = precompile.precompile([(family, {"n": 8}, {"BLOCK": 32})], "cuda", threads=2)
    assert report.skipped == 1 and report.compiled == 0 and log == []
    ahead = precompile.CompileAhead("cuda", threads=1)
    ahead.submit([(family, {"n": 8}, {"BLOCK": 32})])
    ahead.close()
    assert log == []


@pytest.mark.gpu
def test_a_launch_after_precompile_compiles_nothing():
    """On a GPU (TRITON_INTERPRET=0): the launch finds the kernels the warmups compiled."""
    import os

    import torch
    import triton

    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("needs TRITON_INTERPRET=0 (compiled kernels)")
    compiled = []
    knobs = triton.knobs.runtime
    previous = knobs.jit_post_compile_hook
    knobs.jit_post_compile_hook = lambda *a, **k: compiled.append(1)
    try:
        jobs = []
        for m, module in ((1, gemv), (4, gemv), (32, gemm)):
            shape = _shape(m, 1024, 4096)
            default = module.default_config(shape, "cuda")
            space = space_for(module.FAMILY.name, "cuda")
            known = space.known(candidate_configs(module.FAMILY.name, shape, "cuda"), shape, default)
            jobs += [(module.FAMILY, shape, c) for c in [default] + known[:3]]
        report = precompile.precompile(jobs, "cuda", threads=4)
        assert not report.failures and report.compiled >= len(jobs)
        compiled.clear()
        for family, shape, config in jobs:
            family.launch(family.make_inputs(shape, "cuda"), config)
        torch.cuda.synchronize()
        assert compiled == []
    finally:
        knobs.jit_post_compile_hook = previous


@pytest.mark.parametrize("m", [256, 512, 1024])
def test_the_tiled_prefill_configs_have_m_fastest_twins(m):
    """At m = 256 / 512 / 1024 (2 / 4 / 8 row tiles of 128) every known tiled config in row
    order (GROUP_M 1) has a twin that walks every row tile of a weight column tile first
    (GROUP_M = the row tiles), valid in the cuda space, which keeps only that smallest value of
    the m-fastest order."""
    from tuner_kernels.common import column_group

    space = space_for("gemm", "cuda")
    shape = _shape(m, 28672, 4096)
    default = gemm.default_config(shape, "cuda", sm_count=132)
    known = space.known(candidate_configs("gemm", shape, "cuda", 132), shape, default)
    group = column_group(m, 128)
    assert group == m // 128
    rows = [c for c in known if c["SWAP_AB"] == 0 and c["BLOCK_M"] == 128 and c["GROUP_M"] == 1]
    assert rows
    for c in rows:
        assert {**c, "GROUP_M": group} in known, c
    tiled = {**rows[0], "GROUP_M": group}
    assert space.check(tiled, shape) == ""
    assert space.check({**tiled, "GROUP_M": 2 * group}, shape) != ""  # the same order again
