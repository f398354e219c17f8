"""Skinny products for decode linears: out[m, n] = A[m, k] · W[n, k]ᵀ with few rows m (1..256)
and a weight W of many rows, computed as outᵀ = W · Aᵀ ("swap AB").

Why: at decode batch sizes the weight is almost all the bytes (an 8B model's 4096×14336 weight is
117 MB; A at m = 64 is 1.8 MB), so the kernel must stream W at the read bandwidth. A tiled GEMM
with the activation rows as the MMA's M side needs BLOCK_M ≥ 64 for Hopper's wgmma, which at
m = 16 / 32 wastes the tile, so it runs mma.sync from cp.async stages. With the roles swapped the
weight tile [BLOCK_N, BLOCK_K] is wgmma's M side (64 rows a warpgroup) and the activation tile
[BLOCK_M, BLOCK_K] its N side (any multiple of 8 from 8 to 256; tl.dot needs ≥ 16): W goes from
HBM to shared memory (TMA on sm90 with `skinny_tma_kernel`, cp.async otherwise) and from there
straight into the tensor cores, never through registers, so a pipeline of ``num_stages`` weight
tiles keeps many bytes in flight with few registers. The fp32 accumulator is [BLOCK_N, BLOCK_M]
(BLOCK_M / (threads / BLOCK_N) values a thread), stored transposed into out[m, n].

Used by two families, selected by a config parameter (serving and the pipeline see no change):
`tuner_kernels.gemv` (USE_DOT = 2: m = 1..8, x padded to BLOCK_M = 16 rows, bias fused) and
`tuner_kernels.gemm` (SWAP_AB = 1: m > 8, layout-agnostic through strides; TMA = 1 takes the
descriptor kernel where A is row-major and B is the [k, n] view of a row-major weight).

Balanced rows (BALANCE_N = 1 in both families' configs): each program owns ROWS <= BLOCK_N
weight rows, chosen so the programs fill whole waves of the GPU's multiprocessors. Without it,
n / BLOCK_N programs often leave SMs idle for the whole kernel (14336 rows in 128-row tiles: 112
programs on the H200's 132 SMs; 4096 rows in 64-row tiles: 64). A program still computes a
BLOCK_N-row tile; the rows past its own ROWS are its neighbour's (clamped in the pointer kernel,
read again through L2 by the descriptor kernel) and are not stored. Every output element is the
same sum in the same order: the bytes do not change.

Grid: (cdiv(m, BLOCK_M), cdiv(n, ROWS), SPLIT_K), the activation tiles fastest: where m needs
several tiles (m > BLOCK_M) the programs that share a weight tile run together, so the weight
comes from HBM once and from L2 for the others. SPLIT_K > 1 writes fp32 partials
[SPLIT_K, m, n] that the family's reduce kernel sums in a fixed order (bit reproducible; no
host-side state, so a CUDA graph replays it as captured), or with REDUCE_LAST (gemm's config)
the last split of each tile sums them in the same order within the launch
(tuner_kernels.common.store_split: one arrival count a tile, zeroed with the launch). Rows past
n / m are clamped for the pointer loads (no row masks in the loop) and masked at the store; the
descriptors read out-of-range rows and columns as zeros.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tuner_kernels.common import sm_count, split_counters, store_split

__all__ = ["balanced_rows", "descriptor_ok", "plan", "skinny_kernel", "skinny_tma_kernel"]


@triton.jit
def skinny_kernel(w_ptr, a_ptr, out_ptr, part_ptr, count_ptr, bias_ptr, M, N, K, ROWS,
                  stride_wn, stride_wk, stride_am, stride_ak, stride_om,
                  BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                  SPLIT_K: tl.constexpr, REDUCE_LAST: tl.constexpr, EVEN_K: tl.constexpr,
                  HAS_BIAS: tl.constexpr):
    """Pointer loads (cp.async stages on sm90, LDS stages on gfx9): any strides."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    k_tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    tile_start = pid_k * per_split
    tile_end = tl.minimum(tile_start + per_split, k_tiles)
    offs_n = pid_n * ROWS + tl.arange(0, BLOCK_N)
    row_end = tl.minimum(pid_n * ROWS + ROWS, N)  # this program's rows: [pid_n * ROWS, row_end)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_w = tl.minimum(offs_n, row_end - 1)  # clamped: the loads need no row mask
    rows_a = tl.minimum(offs_m, M - 1)
    offs_k = tl.arange(0, BLOCK_K)
    k0 = tile_start * BLOCK_K
    w_ptrs = (w_ptr + rows_w.to(tl.int64)[:, None] * stride_wn
              + (k0 + offs_k)[None, :].to(tl.int64) * stride_wk)
    a_ptrs = (a_ptr + rows_a.to(tl.int64)[:, None] * stride_am
              + (k0 + offs_k)[None, :].to(tl.int64) * stride_ak)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for t in range(tile_start, tile_end):
        if EVEN_K:
            w = tl.load(w_ptrs)
            a = tl.load(a_ptrs)
        else:
            k_ok = offs_k[None, :] < K - t * BLOCK_K
            w = tl.load(w_ptrs, mask=k_ok, other=0.0)
            a = tl.load(a_ptrs, mask=k_ok, other=0.0)
        acc = tl.dot(w, tl.trans(a), acc)
        w_ptrs += BLOCK_K * stride_wk
        a_ptrs += BLOCK_K * stride_ak
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rows_w).to(tl.float32)[:, None]
    store_split(acc, out_ptr + offs_m[None, :] * stride_om + offs_n[:, None],
                part_ptr + offs_m[None, :] * N + offs_n[:, None], M * N, pid_k,
                (offs_m[None, :] < M) & (offs_n[:, None] < row_end),
                count_ptr + pid_m * tl.num_programs(1) + pid_n, SPLIT_K, REDUCE_LAST)


@triton.jit
def skinny_tma_kernel(w_desc, a_desc, out_ptr, part_ptr, count_ptr, bias_ptr, M, N, K, ROWS,
                      stride_om,
                      BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                      SPLIT_K: tl.constexpr, REDUCE_LAST: tl.constexpr, HAS_BIAS: tl.constexpr):
    """Tensor-descriptor loads (TMA on sm90): w_desc the row-major weight [n, k], block
    [BLOCK_N, BLOCK_K]; a_desc the row-major A [m, k], block [BLOCK_M, BLOCK_K]."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    k_tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    tile_start = pid_k * per_split
    tile_end = tl.minimum(tile_start + per_split, k_tiles)
    off_n = pid_n * ROWS
    row_end = tl.minimum(off_n + ROWS, N)  # this program's rows: [off_n, row_end)
    off_m = pid_m * BLOCK_M
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for t in range(tile_start, tile_end):
        w = w_desc.load([off_n, t * BLOCK_K])
        a = a_desc.load([off_m, t * BLOCK_K])
        acc = tl.dot(w, a.T, acc)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    offs_m = off_m + tl.arange(0, BLOCK_M)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + tl.minimum(offs_n, N - 1)).to(tl.float32)[:, None]
    store_split(acc, out_ptr + offs_m[None, :] * stride_om + offs_n[:, None],
                part_ptr + offs_m[None, :] * N + offs_n[:, None], M * N, pid_k,
                (offs_m[None, :] < M) & (offs_n[:, None] < row_end),
                count_ptr + pid_m * tl.num_programs(1) + pid_n, SPLIT_K, REDUCE_LAST)


def balanced_rows(n: int, block_n: int, other_programs: int, sm_count: int) -> int:
    """Weight rows a program owns so that the programs fill whole waves of `sm_count`
    multiprocessors: `other_programs` programs (activation tiles x K splits) share each row
    range. A multiple of 8, at most `block_n`; `block_n` itself when the tiles already do."""
    programs = triton.cdiv(n, block_n)
    waves = triton.cdiv(programs * other_programs, sm_count)
    wanted = max(programs, (waves * sm_count) // max(other_programs, 1))
    rows = triton.cdiv(triton.cdiv(n, wanted), 8) * 8
    return max(8, min(rows, block_n))


def descriptor_ok(*tensors) -> bool:
    """Whether 2-D row-major tensors can back TMA descriptors: unit last stride, 16-byte
    aligned base and row stride."""
    for t in tensors:
        if t.dim() != 2 or t.stride(1) != 1:
            return False
        if (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16:
            return False
    return True


def plan(weight, a, out, part, bias, *, block_n: int, block_m: int, block_k: int, split_k: int,
         use_tma: bool, options: dict, balance: bool = False, reduce_last: bool = False):
    """(kernel, grid, args, constexprs, options) of one skinny launch: `weight` the [n, k] view
    (any strides), `a` the [m, k] view, `out` the [m, n] output (unit column stride), `part`
    the contiguous fp32 workspace [split_k, m, n] when split_k > 1 (None otherwise), `bias` [n]
    or None (added only when split_k == 1); `balance`: balanced rows (module docstring) on the
    multiprocessors of `weight`'s device; `reduce_last`: the last split of each tile sums the
    partials into `out` in this launch (tuner_kernels.common.store_split), else the caller's
    reduce kernel does."""
    n, k = weight.shape
    m = a.shape[0]
    rows = block_n
    if balance:
        rows = balanced_rows(n, block_n, triton.cdiv(m, block_m) * split_k,
                             sm_count(weight.device))
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, rows), split_k)
    has_bias = bias is not None and split_k == 1
    reduce_last = reduce_last and split_k > 1
    part = out if part is None else part
    counts = split_counters(grid[0] * grid[1], out.device) if reduce_last else out
    bias_arg = bias if has_bias else out  # never read when HAS_BIAS is False
    meta = dict(BLOCK_N=block_n, BLOCK_M=block_m, BLOCK_K=block_k, SPLIT_K=split_k,
                REDUCE_LAST=reduce_last, HAS_BIAS=has_bias)
    if use_tma and descriptor_ok(weight, a):
        from triton.tools.tensor_descriptor import TensorDescriptor

        w_desc = TensorDescriptor(weight, [n, k], [weight.stride(0), 1], [block_n, block_k])
        a_desc = TensorDescriptor(a, [m, k], [a.stride(0), 1], [block_m, block_k])
        args = (w_desc, a_desc, out, part, counts, bias_arg, m, n, k, rows, out.stride(0))
        return skinny_tma_kernel, grid, args, meta, options
    args = (weight, a, out, part, counts, bias_arg, m, n, k, rows, weight.stride(0),
            weight.stride(1), a.stride(0), a.stride(1), out.stride(0))
    tiles_even = k % block_k == 0
    return skinny_kernel, grid, args, {**meta, "EVEN_K": tiles_even}, options
