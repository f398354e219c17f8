"""Known configs: what a search measures first, before its sampler proposes anything.

Per family, a short list of reasoned candidates for a shape: the winners of the H200 sweeps
(scripts/gpu/sweep_linears.sh, BENCHMARKS.md) and their neighbours, with the split-K counts that
fill the machine. `tuner search` queues them right after the default config (so a short search
measures at least these), and sweep_linears.sh sweeps exactly these lists: one implementation.

The lists are partial configs (the family's own parameters only); callers complete them with
the default config's values and keep those the search space allows
(`tuner.spaces.SearchSpace.known`). Only the cuda backend has measured lists: hip and dcu get
none (nothing was measured on that hardware), and attention has none yet.

This module is not part of any family's kernel source hash: it names configs, it does not change
what a kernel computes, so exports stay valid when the lists change.
"""

from __future__ import annotations

import math

from .common import cdiv, column_group, pow2_at_least
from .common import sm_count as device_sm_count

__all__ = ["candidate_configs", "split_counts"]

GEMV_DOT_ROWS = 16  # tuner_kernels.gemv.DOT_ROWS (not imported: importing a family compiles nothing,
# but keeps this module out of the families' way; tests/test_candidates.py checks they agree)


def candidate_configs(family: str, shape: dict, backend: str = "cuda",
                      sm_count: int | None = None) -> list[dict]:
    """Reasoned candidates for `shape` (partial configs, possibly outside the space; no default).
    `sm_count`: the device's multiprocessors (None: the current GPU's, or an H200's)."""
    if backend != "cuda" or family not in _LISTS:
        return []
    sms = int(sm_count or device_sm_count())
    raw = _LISTS[family](shape, sms)
    return raw + _balanced(family, shape, raw, sms)


def split_counts(programs: int, k: int, block_k: int, min_tiles_per_split: int, sm_count: int,
                 count: int = 1) -> list[int]:
    """For a grid of fewer programs than multiprocessors: the `count` split-K values that bring it
    nearest 1.5 programs a multiprocessor, keeping `min_tiles_per_split` BLOCK_Ks a slice."""
    if programs >= sm_count:
        return []
    fits = [s for s in (2, 4, 8, 16) if cdiv(k, block_k) >= min_tiles_per_split * s]
    return sorted(sorted(fits, key=lambda s: abs(math.log(programs * s / (1.5 * sm_count))))[:count])


def _gemv(shape: dict, sms: int) -> list[dict]:
    """m = 1..8 (tuner_kernels.gemv): FMA, FMA with register / cp.async stages, tl.dot, swap-AB wgmma."""
    m, n, k = int(shape["m"]), int(shape["n"]), int(shape["k"])

    def fma(r, bk, w, s=1):
        return {"ROWS_PER_BLOCK": r, "BLOCK_K": bk, "num_warps": w, "num_stages": s, "USE_DOT": 0}

    def dot(r, bk, w, s, d):
        return {"ROWS_PER_BLOCK": r, "BLOCK_K": bk, "num_warps": w, "num_stages": s, "USE_DOT": d}

    # plain FMA: the m = 1 winners of the 2026-11-29 sweep (R1/R2 BK1024) and of the 2026-12-01
    # search (R1 BK2048 w8 on 1024x4096, R2 BK512 w2 on 4096x4096, R4 BK512 w8 on 4096x12288)
    base = [(fma(1, 1024, 4), False)]
    if m == 1:
        base += [(fma(2, 1024, 4), False), (fma(1, 2048, 8), False), (fma(2, 512, 2), False),
                 (fma(4, 512, 8), False)]
    # more W in flight for the FMA loop: a register double buffer (num_stages 2) or cp.async
    # stages (3-4)
    base += [(fma(1, 1024, 4, 2), False), (fma(1, 1024, 4, 3), False)]
    if m == 1:
        base += [(fma(2, 1024, 4, 2), False), (fma(2, 512, 2, 2), False),
                 (fma(1, 512, 2, 2), False), (fma(1, 1024, 4, 4), False)]
    # USE_DOT 1 (mma.sync, cp.async stages): the m >= 2 default and a searched winner
    base += [(dot(32, 128, 4, 4, 1), True), (dot(64, 128, 4, 4, 1), False)]
    # USE_DOT 2 (swap-AB wgmma, W by TMA): 64 / 128 weight rows a program, 4-6 stages in flight
    # (the 6-stage one split as well was measured slower on all 20 m = 4-8 cases it ran on,
    # by 6-50%: BENCHMARKS.md, "Tried and refuted")
    base += [(dot(64, 128, 4, 4, 2), True), (dot(64, 128, 4, 6, 2), False),
             (dot(128, 128, 4, 4, 2), True), (dot(128, 128, 8, 4, 2), False),
             (dot(64, 256, 4, 4, 2), False)]
    configs = []
    for c, splittable in base:
        configs.append({**c, "SPLIT_K": 1})
        if splittable:
            configs += [{**c, "SPLIT_K": s} for s in
                        split_counts(cdiv(n, c["ROWS_PER_BLOCK"]), k, c["BLOCK_K"], 2, sms)]
    # (a K split of 2 of the skinny configs that win the 4096-row down projections unsplit, 64 ->
    # 128 programs, was measured on the H200: within +-0.6% of the unsplit config in all 8
    # cases at m = 1, 4, 8, best in none; a read of that weight by 64 programs costs only ~1 us
    # more than by 128 (BENCHMARKS.md, "Tried and refuted"))
    return configs


def _gemm(shape: dict, sms: int) -> list[dict]:
    """m >= 9 (tuner_kernels.gemm): the tiled kernel's narrow and wgmma tiles, the swap-AB skinny
    kernel (weight rows on wgmma's M side) with the deepest TMA pipeline that fits."""
    m, n, k = int(shape["m"]), int(shape["n"]), int(shape["k"])
    bm = max(16, min(64 if m < 128 else 128, pow2_at_least(m)))

    def tiled(bm_, bn, bk, w, s, tma):
        return {"BLOCK_M": bm_, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 1, "num_warps": w,
                "num_stages": s, "TMA": tma, "SWAP_AB": 0}

    def skinny(bm_, bn, bk, w, s, tma=1):
        return {"BLOCK_M": bm_, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 1, "num_warps": w,
                "num_stages": s, "TMA": tma, "SWAP_AB": 1}

    base = []
    if m < 256:  # the tiled kernel's narrow tiles (the 2026-11-29 sweep's and the 2026-12-01
        # m = 32 search's winners: BLOCK_N 32 with TMA, split 2 on 4096 x 4096)
        base += [(tiled(bm, 64, 128, 4, 4, 0), 1), (tiled(bm, 64, 128, 4, 4, 1), 1),
                 (tiled(bm, 32, 128, 4, 5, 1), 1), (tiled(bm, 128, 64, 4, 4, 1), 0)]
    if m >= 128:  # wgmma tiles of the tiled kernel
        base += [(tiled(128, 128, 64, 8, 3, 1), 1), (tiled(128, 128, 64, 8, 4, 0), 0),
                 (tiled(128, 256, 64, 8, 3, 1), 0)]
    # the skinny kernel: BLOCK_M = m up to 128 (two tiles, or one of 256, at m = 256); 64
    # weight rows a program is wgmma's minimum, so n = 4096 gives only 64 programs: split K 2
    # and 4 are both tried there, against the reduce kernel's extra launch
    sm = min(128, pow2_at_least(m))
    base += [(skinny(sm, 64, 128, 4, 6 if sm <= 64 else 4), 2),
             (skinny(sm, 64, 256, 4, 4 if sm <= 32 else 3), 0),
             (skinny(sm, 128, 128, 4, 6 if sm <= 16 else 4 if sm <= 64 else 3), 1),
             (skinny(sm, 128, 64, 8, 6), 0), (skinny(sm, 64, 128, 4, 4, tma=0), 0)]
    if 16 < m <= 32:
        # half-height activation tiles: two programs read each weight tile, the second from L2
        # (the 2026-12-01 afternoon search's m = 32 winners on 4096x4096 and 4096x12288:
        # BLOCK_M 16, BLOCK_K 256, 4 TMA stages), and the k/v winner (64-wide K, split 8)
        base += [(skinny(16, 64, 256, 4, 4), 0), (skinny(16, 64, 128, 4, 6), 1),
                 (skinny(16, 128, 128, 4, 6), 0), (skinny(sm, 64, 64, 4, 6, tma=0), 0)]
        if n <= 2048:
            base += [(skinny(sm, 64, 64, 4, 6, tma=0) | {"SPLIT_K": 8}, 0)]
    if m >= 64:
        base += [(skinny(sm, 128, 128, 8, 4), 0)]
    if m >= 128:
        # 256 weight rows a program (wgmma's M side on two warpgroups): the activation tile is
        # read from L2 once per 256 weight rows, not per 64 / 128. The H200 sweep of the m >= 64 cases
        # (BENCHMARKS.md) kept it for the widest shapes (8 of 32 cases at m = 128 / 256, by
        # 0.1-7.9%, all but one unsplit); at m = 64 it won one case by 0.1%
        base += [(skinny(sm, 256, 64, 8, 4), 1)]
    # (warp-specialised twins of the skinny descriptor kernel, tl.range(warp_specialize=True),
    # were measured on the H200: > 1% slower than the same config on 192 of 209 pairs, best in
    # no case at m = 4-256; tiles of >= 128 weight rows hung the GPU on Triton 3.6. docs/kernels.md)
    if m >= 256:
        # (the tiled kernel's 256 x 128 tile, each weight tile read by one program, was measured
        # on the H200: slower than the best config on 8 of 9 8B shapes, by up to 2.7x, a tie
        # on the ninth; BENCHMARKS.md)
        base += [(skinny(256, 64, 64, 4, 4), 0), (skinny(256, 128, 64, 8, 3), 0)]
    if m >= 512:
        # prefill-sized m: the persistent tile scheduler (SCHEDULE 1, 2 with the epilogue in two
        # halves) on the wgmma tiles of Triton's persistent matmul, descriptor loads, grouped
        # order where there are row tiles to group; not measured on the H200 yet
        group = 8 if cdiv(m, 128) > 8 else 1
        base += [({**tiled(128, 256, 64, 8, 3, 1), "GROUP_M": group, "SCHEDULE": 2}, 0),
                 ({**tiled(128, 256, 64, 8, 3, 1), "GROUP_M": group, "SCHEDULE": 1}, 0),
                 ({**tiled(128, 128, 64, 8, 4, 1), "GROUP_M": group, "SCHEDULE": 1}, 0),
                 ({**tiled(128, 128, 64, 4, 4, 1), "GROUP_M": group, "SCHEDULE": 2}, 0),
                 ({**tiled(128, 256, 64, 8, 3, 0), "GROUP_M": group, "SCHEDULE": 1}, 0)]
    if m >= 256 and cdiv(m, 128) * cdiv(n, 128) % sms:
        # the tail split (SCHEDULE 3) where the 128 x 128 grid ends in a partial wave: the
        # whole waves over all of K, the last wave's tiles over 2 / 4 slices of K (the H100's
        # m = 512 qkv projection: 192 tiles, 1.45 waves); not measured on a GPU yet
        base += [({**tiled(128, 128, 64, 8, 4, 1), "GROUP_M": column_group(m, 128),
                   "SCHEDULE": 3, "SPLIT_K": splits}, 0) for splits in (2, 4)]
    # the tiled kernel's m-fastest twins (common.column_group): n fastest (GROUP_M 1), the programs of one wave read as
    # many weight column tiles as there are programs, and the next row of tiles reads them again
    # from HBM (B of 28672 x 4096 is 4.7x an H200's L2); with every row tile of a weight column
    # tile side by side (the skinny kernel's grid order) the weight is read once
    base += [({**c, "GROUP_M": column_group(m, c["BLOCK_M"])}, splits) for c, splits in base
             if c["SWAP_AB"] == 0 and c["GROUP_M"] == 1 and column_group(m, c["BLOCK_M"]) > 1]
    configs = []
    for c, splits in base:
        configs.append({"SPLIT_K": 1, **c})
        if splits:
            tiles = cdiv(n, c["BLOCK_N"]) * cdiv(m, c["BLOCK_M"])
            # partials summed by the reduce kernel: REDUCE_LAST (the tile's last split sums
            # them in the same launch) was slower in all 68 pairs measured on the H200
            # (docs/kernels.md); it stays in the space for the search, not among the candidates
            configs += [{**c, "SPLIT_K": s, "REDUCE_LAST": 0}
                        for s in split_counts(tiles, k, c["BLOCK_K"], 4, sms, splits)]
    return configs


def _balanced(family: str, shape: dict, raw: list[dict], sms: int) -> list[dict]:
    """BALANCE_N = 1 twins of the skinny candidates whose tiles leave multiprocessors idle: the
    same tile, fewer rows a program, whole waves (tuner_kernels/skinny.py; the same bytes)."""
    from .skinny import balanced_rows

    out = []
    for c in raw:
        if family == "gemv":
            if int(c.get("USE_DOT", 0)) != 2:
                continue
            block_n, block_m = c["ROWS_PER_BLOCK"], GEMV_DOT_ROWS
        else:
            if int(c.get("SWAP_AB", 0)) != 1:
                continue
            block_n, block_m = c["BLOCK_N"], c["BLOCK_M"]
        others = cdiv(shape["m"], block_m) * c.get("SPLIT_K", 1)
        if balanced_rows(shape["n"], block_n, others, sms) < block_n:
            out.append({**c, "BALANCE_N": 1})
    return out


def _moe(shape: dict, sms: int) -> list[dict]:
    """The fused MoE (tuner_kernels.moe): at decode sizes the GEMV path (rows a program x K chunk,
    the gemv family's m = 1 winners' proportions: 4-16 rows, 256-1024 long chunks, the plain loop
    or a few stages), then the MMA path's measured winners on the H200 (BENCHMARKS.md, "Fused
    MoE": M16 N256 K64 split K 2 at m = 1, the N128 twin splitting the up projection too, the
    unsplit N256 at m = 8). Not a function of `sms`."""
    pairs = int(shape["m"]) * int(shape["topk"])
    configs = []
    if pairs <= 512:
        def gemv(n, k, w, s):
            return {"GEMV": 1, "BLOCK_SIZE_N": n, "BLOCK_SIZE_K": k, "num_warps": w,
                    "num_stages": s}

        configs += [gemv(8, 512, 4, 1), gemv(4, 1024, 4, 1), gemv(16, 256, 4, 1),
                    gemv(8, 256, 4, 3), gemv(16, 512, 8, 1), gemv(8, 1024, 8, 1),
                    gemv(4, 512, 4, 2), gemv(16, 256, 4, 3), gemv(32, 256, 8, 1),
                    gemv(8, 512, 4, 2), gemv(4, 256, 4, 4), gemv(16, 128, 4, 4)]

    def mma(n, k, w, s, split=1, split_up=1, m=16):
        return {"GEMV": 0, "BLOCK_SIZE_M": m, "BLOCK_SIZE_N": n, "BLOCK_SIZE_K": k,
                "SPLIT_K": split, "SPLIT_K_UP": split_up, "num_warps": w, "num_stages": s}

    configs += [mma(256, 64, 8, 5, split=2), mma(128, 64, 4, 4, split=2, split_up=2),
                mma(256, 64, 8, 4), mma(128, 64, 4, 4, split=4)]
    return configs


_LISTS = {"gemv": _gemv, "gemm": _gemm, "moe": _moe}
