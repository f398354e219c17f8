"""GEMM family: out[m, n] = A[m, k] · B[k, n], bf16/fp16 in, fp32 accumulation, tiled.

Layouts (the ShapeTable ``layout`` column, first letter for A, second for B):
- ``NT`` (the common case, a linear layer): B is given as a weight ``[n, k]``; the kernel reads
  the ``[k, n]`` view ``weight.t()`` through its strides.
- ``NN``: B is a plain ``[k, n]`` row-major matrix.
- ``TN`` / ``TT``: A is stored as ``[k, m]`` and read through the transposed view.
Inputs hold ``a`` as the logical ``[m, k]`` view and ``b`` as the logical ``[k, n]`` view (with a
leading batch dimension when ``batch > 1``), so torch's matmul on the same tensors is the
baseline (cuBLAS / hipBLASLt pick the transposed operation from the strides).

Parameters (search_spaces/gemm.yaml): BLOCK_M, BLOCK_N, BLOCK_K (tile), GROUP_M (grouped launch
order: GROUP_M row-tiles share the same B column-tiles while they are in L2), SPLIT_K (K split
over SPLIT_K programs writing fp32 partials; a second kernel sums them in a fixed order, so the
result is deterministic), REDUCE_LAST (with SPLIT_K > 1: the last split of each output tile to
finish sums the partials inside the same launch, in the same order: one launch, the same bytes;
tuner_kernels.common.store_split), num_warps, num_stages; on hip also waves_per_eu,
matrix_instr_nonkdim, kpack (Triton HIP compile options, passed as launch keyword arguments);
on cuda also TMA (read A and B through tensor descriptors, `gemm_tma_kernel`); SWAP_AB = 1 runs
the swap-AB skinny kernel of tuner_kernels/skinny.py instead (decode batch sizes: the weight rows on the
MMA's M side; TMA = 1 takes its descriptor form). SCHEDULE (prefill-sized m): 0 launches one
program per output tile; 1 launches `gemm_persistent_kernel`, min(multiprocessors, tiles) programs
that each walk tiles in grouped order (a persistent tile scheduler: no tail wave, tile setup
amortised), with TMA = 1 reading through tensor descriptors where `tma_supported`; 2 is 1 with
the epilogue subtiled (the accumulator stored as two halves along N). Persistent schedules are
2-D only (batched shapes run the tiled kernel) and never split K. 3 is the tail split: the whole
waves of tiles run the tiled kernel over all of K, the partial last wave's tiles SPLIT_K programs
each, summed in the same launch (`_tail_split_plan`; two launches, 2-D only). Ragged m / n / k
are handled with masks (or by the descriptors' zero fill).

Also here: `launch_plan` (the kernel calls of a config, also on meta tensors, which is how
tuner_kernels.common compiles a config for a GPU target on a CPU host). Serving code reaches the
kernels through tuner.serving. See docs/kernels.md.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import triton
import triton.language as tl

from tuner_kernels import COMMON_SOURCES, KernelFamily, format_shape_key, skinny
from tuner_kernels.common import (DTYPES, KernelCall, column_group, launch_options, pow2_at_least,
                            row_value, sm_count, split_counters, store_split, tensor_backend)
from tuner_kernels.cost import gemm_cost

__all__ = ["FAMILY", "LAYOUTS", "REDUCE_BLOCK", "baseline", "bytes_moved", "default_config",
           "flops", "gemm_kernel", "gemm_persistent_kernel", "gemm_tma_kernel", "launch", "launch_plan", "make_inputs",
           "reference", "SCHEDULES", "shape_from_row", "shape_key", "splitk_reduce_kernel", "tma_supported"]

LAYOUTS = ("NN", "NT", "TN", "TT")
# SCHEDULE: 0 one program per output tile (gemm_kernel / gemm_tma_kernel, split K, swap-AB);
# 1 persistent (gemm_persistent_kernel: sm_count programs walk the tiles); 2 persistent with the
# epilogue stored in two halves along N; 3 the tail split (whole waves of tiles over all of K,
# the partial last wave's tiles split over K: _tail_split_plan)
SCHEDULES = (0, 1, 2, 3)
REDUCE_BLOCK = 1024


@triton.jit
def gemm_kernel(
    a_ptr, b_ptr, out_ptr, part_ptr, count_ptr,
    M, N, K,
    stride_ab, stride_am, stride_ak,
    stride_bb, stride_bk, stride_bn, tile_base,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, REDUCE_LAST: tl.constexpr,
    EVEN_K: tl.constexpr, EVEN_MN: tl.constexpr, TILE_PARTS: tl.constexpr,
):
    """One (BLOCK_M x BLOCK_N) output tile of one batch entry over one K split.

    grid = (tiles, SPLIT_K, batch): program p computes tile tile_base + p of the grouped order
    (tile_base 0 and every tile, except in SCHEDULE 3's two launches); out is the contiguous
    [batch, M, N] output. With SPLIT_K > 1 each split stores its fp32 partial in part, the
    workspace [batch * SPLIT_K, M, N], and the partials are summed by splitk_reduce_kernel, or in
    this launch by each tile's last split with REDUCE_LAST (tuner_kernels.common.store_split;
    count_ptr: one count a program's tile). TILE_PARTS (with REDUCE_LAST, batch 1): the workspace
    is [SPLIT_K, programs, BLOCK_M * BLOCK_N] instead, one block a program's tile, so a launch
    over a few tiles of a large output needs no workspace of the whole output.
    """
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_b = tl.program_id(2).to(tl.int64)

    # Grouped ordering: walk GROUP_M row-tiles down a column of tiles before moving right.
    pid_m, pid_n = _tile_of(pid + tile_base, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)

    # This program's K tiles: [tile_start, tile_end).
    k_tiles = tl.cdiv(K, BLOCK_K)
    tiles_per_split = tl.cdiv(k_tiles, SPLIT_K)
    tile_start = pid_k * tiles_per_split
    tile_end = min(tile_start + tiles_per_split, k_tiles)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N

    a_ptrs = (a_ptr + pid_b * stride_ab + offs_m[:, None] * stride_am
              + (tile_start * BLOCK_K + offs_k)[None, :] * stride_ak)
    b_ptrs = (b_ptr + pid_b * stride_bb + (tile_start * BLOCK_K + offs_k)[:, None] * stride_bk
              + offs_n[None, :] * stride_bn)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t in range(tile_start, tile_end):
        if EVEN_K and EVEN_MN:  # no masks at all (m, n, k multiples of the tile)
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        elif EVEN_K:
            a = tl.load(a_ptrs, mask=mask_m[:, None], other=0.0)
            b = tl.load(b_ptrs, mask=mask_n[None, :], other=0.0)
        else:
            k_left = K - t * BLOCK_K
            a = tl.load(a_ptrs, mask=mask_m[:, None] & (offs_k[None, :] < k_left), other=0.0)
            b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & mask_n[None, :], other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    tile_offs = offs_m[:, None] * N + offs_n[None, :]
    parts, split_stride = _split_parts(part_ptr + pid_b * SPLIT_K * M * N, pid, tile_offs, M * N,
                                       BLOCK_M, BLOCK_N, TILE_PARTS)
    store_split(acc, out_ptr + pid_b * M * N + tile_offs, parts, split_stride, pid_k,
                mask_m[:, None] & mask_n[None, :], count_ptr + pid_b * tl.num_programs(0) + pid,
                SPLIT_K, REDUCE_LAST)


@triton.jit
def gemm_tma_kernel(
    a_desc, b_desc, out_ptr, part_ptr, count_ptr,
    M, N, K, tile_base,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, REDUCE_LAST: tl.constexpr,
    B_IS_WEIGHT: tl.constexpr, TILE_PARTS: tl.constexpr,
):
    """gemm_kernel with A and B read through tensor descriptors (TMA on sm90+): 2-D, batch 1.

    a_desc: A [M, K] row-major, block [BLOCK_M, BLOCK_K]. b_desc: the weight [N, K] row-major with
    block [BLOCK_N, BLOCK_K] (B_IS_WEIGHT, layout NT) or B [K, N] row-major with block
    [BLOCK_K, BLOCK_N] (layout NN). Out-of-range rows / columns of a block read as zero, so ragged
    shapes need no masks on loads. grid = (tiles, SPLIT_K); tile_base, the output, partials
    (TILE_PARTS) and counts as gemm_kernel's.
    """
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m, pid_n = _tile_of(pid + tile_base, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)

    k_tiles = tl.cdiv(K, BLOCK_K)
    tiles_per_split = tl.cdiv(k_tiles, SPLIT_K)
    tile_start = pid_k * tiles_per_split
    tile_end = min(tile_start + tiles_per_split, k_tiles)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t in range(tile_start, tile_end):
        a = a_desc.load([off_m, t * BLOCK_K])
        if B_IS_WEIGHT:
            b = b_desc.load([off_n, t * BLOCK_K]).T
        else:
            b = b_desc.load([t * BLOCK_K, off_n])
        acc = tl.dot(a, b, acc)

    offs_m = off_m + tl.arange(0, BLOCK_M)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    tile_offs = offs_m[:, None] * N + offs_n[None, :]
    parts, split_stride = _split_parts(part_ptr, pid, tile_offs, M * N, BLOCK_M, BLOCK_N,
                                       TILE_PARTS)
    store_split(acc, out_ptr + tile_offs, parts, split_stride, pid_k,
                (offs_m[:, None] < M) & (offs_n[None, :] < N), count_ptr + pid, SPLIT_K, REDUCE_LAST)


@triton.jit
def _split_parts(part_ptr, pid, tile_offs, output_stride, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, TILE_PARTS: tl.constexpr):
    """Where a program's K-split partials of its tile go (split 0's pointers, the stride between
    splits): the tile's place in a workspace of the output's size (stride `output_stride`), or
    with TILE_PARTS one BLOCK_M x BLOCK_N block a program (stride programs x block)."""
    if TILE_PARTS:
        block = BLOCK_M * BLOCK_N
        parts = (part_ptr + pid.to(tl.int64) * block + tl.arange(0, BLOCK_M)[:, None] * BLOCK_N
                 + tl.arange(0, BLOCK_N)[None, :])
        stride = tl.num_programs(0).to(tl.int64) * block
    else:
        parts = part_ptr + tile_offs
        stride = output_stride
    return parts, stride


@triton.jit
def _tile_of(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of a tile id in grouped order: GROUP_M row-tiles down a column of tiles
    before moving right (the order gemm_kernel's grid walks)."""
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((tile_id % num_pid_in_group) % group_size_m)
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def gemm_persistent_kernel(
    a, b, c_ptr,
    M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, programs,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, TMA: tl.constexpr, B_IS_WEIGHT: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr, EVEN_K: tl.constexpr,
):
    """Persistent tile scheduler for large m (prefill): grid = `programs` = min(multiprocessors,
    tiles) programs, each walking the output tiles start, start + programs, ... in grouped order,
    so one wave covers the device and no tail wave of short-lived programs is launched. 2-D, no
    split K. `programs` is a runtime argument: calls whose m gives other tile counts (chunked
    prefill varies m step to step) reuse one compiled kernel.

    TMA: `a` / `b` are tensor descriptors (gemm_tma_kernel's: A [M, K] block [BLOCK_M, BLOCK_K];
    the weight [N, K] block [BLOCK_N, BLOCK_K] with B_IS_WEIGHT, else B [K, N] block
    [BLOCK_K, BLOCK_N]; out-of-range reads give zeros); otherwise pointers with strides, rows and
    columns past M / N clamped to row / column 0 (read, never stored), K masked unless EVEN_K.
    EPILOGUE_SUBTILE: the fp32 accumulator is converted and stored as two [BLOCK_M, BLOCK_N / 2]
    halves (fewer live output registers at the store). Summation order per output element: the
    same K tiles in the same order as gemm_kernel with SPLIT_K = 1.
    """
    start_pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_tiles = num_pid_m * num_pid_n
    offs_k = tl.arange(0, BLOCK_K)
    for tile_id in tl.range(start_pid, num_tiles, programs):
        pid_m, pid_n = _tile_of(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if TMA:
            for t in range(k_tiles):
                x = a.load([off_m, t * BLOCK_K])
                if B_IS_WEIGHT:
                    w = b.load([off_n, t * BLOCK_K]).T
                else:
                    w = b.load([t * BLOCK_K, off_n])
                acc = tl.dot(x, w, acc)
        else:
            rows = off_m + tl.arange(0, BLOCK_M)
            cols = off_n + tl.arange(0, BLOCK_N)
            rows = tl.where(rows < M, rows, 0)
            cols = tl.where(cols < N, cols, 0)
            a_ptrs = a + rows[:, None] * stride_am + offs_k[None, :] * stride_ak
            b_ptrs = b + offs_k[:, None] * stride_bk + cols[None, :] * stride_bn
            for t in range(k_tiles):
                if EVEN_K:
                    x = tl.load(a_ptrs)
                    w = tl.load(b_ptrs)
                else:
                    k_left = K - t * BLOCK_K
                    x = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
                    w = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
                acc = tl.dot(x, w, acc)
                a_ptrs += BLOCK_K * stride_ak
                b_ptrs += BLOCK_K * stride_bk
        offs_m = off_m + tl.arange(0, BLOCK_M)
        mask_m = offs_m[:, None] < M
        if EPILOGUE_SUBTILE:
            halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
            left, right = tl.split(halves)
            offs_n = off_n + tl.arange(0, BLOCK_N // 2)
            c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
            tl.store(c_ptrs, left.to(c_ptr.dtype.element_ty), mask=mask_m & (offs_n[None, :] < N))
            offs_n += BLOCK_N // 2
            c_ptrs += (BLOCK_N // 2) * stride_cn
            tl.store(c_ptrs, right.to(c_ptr.dtype.element_ty), mask=mask_m & (offs_n[None, :] < N))
        else:
            offs_n = off_n + tl.arange(0, BLOCK_N)
            c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
            tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m & (offs_n[None, :] < N))


@triton.jit
def splitk_reduce_kernel(ws_ptr, c_ptr, MN, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    """out[b, i] = sum over s of ws[b, s, i], in a fixed order (deterministic). grid=(cdiv(MN, BLOCK), batch)."""
    pid = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ws_ptr + (pid_b * SPLIT_K + s) * MN + offs, mask=mask, other=0.0)
    tl.store(c_ptr + pid_b * MN + offs, acc.to(c_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------------------------
# Shapes and inputs


def _dtype(shape: dict) -> torch.dtype:
    name = shape.get("dtype", "bfloat16")
    if name not in DTYPES:
        raise ValueError(f"gemm supports {', '.join(DTYPES)}, not {name!r}")
    return DTYPES[name]


def _batch(shape: dict) -> int:
    return int(shape.get("batch", 1) or 1)


def make_inputs(shape: dict, device="cpu", seed: int = 0) -> dict:
    """Random a (logical [m, k]) and b (logical [k, n]) stored as the layout says."""
    m, n, k = int(shape["m"]), int(shape["n"]), int(shape["k"])
    layout = shape.get("layout", "NT")
    if layout not in LAYOUTS:
        raise ValueError(f"gemm layout must be one of {LAYOUTS}, not {layout!r}")
    dtype = _dtype(shape)
    batch = _batch(shape)
    lead = (batch,) if batch > 1 else ()
    # Drawn on the target device (fast for GB-sized inputs); the same seed and device give
    # the same numbers.
    gen = None if torch.device(device).type == "meta" else torch.Generator(device=device).manual_seed(seed)

    def rand(dims, scale):
        if torch.device(device).type == "meta":  # shapes and strides only (compile checks)
            return torch.empty(*lead, *dims, dtype=dtype, device="meta")
        # Uniform in [-scale, scale).
        t = torch.rand(*lead, *dims, generator=gen, dtype=torch.float32, device=device)
        return ((t * 2 - 1) * scale).to(dtype)

    # A in [-1, 1), B in [-1, 1) / sqrt(k): outputs stay O(1) for any k.
    a = rand((m, k), 1.0) if layout[0] == "N" else rand((k, m), 1.0).transpose(-1, -2)
    b_scale = 1.0 / math.sqrt(k)
    b = rand((k, n), b_scale) if layout[1] == "N" else rand((n, k), b_scale).transpose(-1, -2)
    return {"a": a, "b": b}


def _shape_of(inputs: dict) -> tuple[int, int, int, int]:
    a, b = inputs["a"], inputs["b"]
    batch = a.shape[0] if a.dim() == 3 else 1
    return batch, a.shape[-2], b.shape[-1], a.shape[-1]


def launch_plan(inputs: dict, config: dict, out: torch.Tensor | None = None,
                backend: str | None = None) -> tuple[torch.Tensor, list[KernelCall]]:
    """The output tensor and the kernel calls that compute it (no launch).

    Works on 'meta' tensors too, which is how tests compile a config for a GPU target on CPU.
    """
    a, b = inputs["a"], inputs["b"]
    batch, m, n, k = _shape_of(inputs)
    if b.shape[-2] != k:
        raise ValueError(f"gemm: a is [.., {m}, {k}] but b is {tuple(b.shape)}")
    out_shape = (batch, m, n) if a.dim() == 3 else (m, n)
    if out is None:
        out = torch.empty(out_shape, device=a.device, dtype=a.dtype)
    elif tuple(out.shape) != out_shape or not out.is_contiguous():
        raise ValueError(f"gemm: out must be a contiguous {out_shape} tensor")

    block_m, block_n, block_k = int(config["BLOCK_M"]), int(config["BLOCK_N"]), int(config["BLOCK_K"])
    group_m, split_k = int(config.get("GROUP_M", 8)), int(config.get("SPLIT_K", 1))
    opts = launch_options(config, backend or tensor_backend(a))
    sab, sam, sak = (a.stride(0), a.stride(1), a.stride(2)) if a.dim() == 3 else (0, a.stride(0), a.stride(1))
    sbb, sbk, sbn = (b.stride(0), b.stride(1), b.stride(2)) if b.dim() == 3 else (0, b.stride(0), b.stride(1))
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n), split_k, batch)
    meta = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=group_m, SPLIT_K=split_k,
                EVEN_K=k % block_k == 0, EVEN_MN=m % block_m == 0 and n % block_n == 0)

    schedule = int(config.get("SCHEDULE", 0))
    if schedule not in SCHEDULES:
        raise ValueError(f"gemm SCHEDULE must be one of {SCHEDULES}, not {schedule}")
    use_tma = int(config.get("TMA", 0)) == 1 and (backend or tensor_backend(a)) in ("cuda", "cpu")
    b_is_weight = b.dim() == 2 and b.stride(0) == 1  # the [k, n] view of a row-major [n, k] weight
    swap = int(config.get("SWAP_AB", 0)) == 1 and a.dim() == 2 and b.dim() == 2
    if schedule == 3 and a.dim() == 2 and b.dim() == 2 and not swap:
        return out, _tail_split_plan(a, b, out, grid[0], meta, opts, use_tma, b_is_weight)

    workspace = None
    if split_k > 1:
        workspace = torch.empty((batch * split_k, m, n), device=a.device, dtype=torch.float32)
    part = out if workspace is None else workspace
    # REDUCE_LAST: each tile's last K split sums the partials in this launch (common.store_split)
    reduce_last = split_k > 1 and int(config.get("REDUCE_LAST", 0)) == 1
    if swap:
        # out^T = W . A^T with the weight rows as the MMA's M side (tuner_kernels/skinny.py); batched
        # (bmm) shapes keep the tiled kernel
        kernel, sk_grid, args, sk_meta, sk_opts = skinny.plan(
            b.t(), a, out, workspace, None, block_n=block_n, block_m=block_m, block_k=block_k,
            split_k=split_k, use_tma=use_tma, options=opts,
            balance=int(config.get("BALANCE_N", 0)) == 1, reduce_last=reduce_last)
        calls = [KernelCall(kernel, sk_grid, args, sk_meta, sk_opts)]
    elif schedule in (1, 2) and a.dim() == 2 and b.dim() == 2:
        if split_k != 1:
            raise ValueError(f"gemm SCHEDULE={schedule} (persistent) runs without split K, "
                             f"not SPLIT_K={split_k}")
        tma = use_tma and tma_supported(a, b)
        x, w = _descriptors(a, b, block_m, block_n, block_k) if tma else (a, b)
        programs = min(sm_count(a.device), grid[0])
        p_meta = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=group_m,
                      TMA=tma, B_IS_WEIGHT=b_is_weight, EPILOGUE_SUBTILE=schedule == 2,
                      EVEN_K=k % block_k == 0)
        args = (x, w, out, m, n, k, sam, sak, sbk, sbn, n, 1, programs)
        calls = [KernelCall(gemm_persistent_kernel, (programs,), args, p_meta, opts)]
    elif use_tma and tma_supported(a, b):
        a_desc, b_desc = _descriptors(a, b, block_m, block_n, block_k)
        tma_meta = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=group_m,
                        SPLIT_K=split_k, REDUCE_LAST=reduce_last, B_IS_WEIGHT=b_is_weight,
                        TILE_PARTS=False)
        counts = split_counters(grid[0], a.device) if reduce_last else out
        args = (a_desc, b_desc, out, part, counts, m, n, k, 0)
        calls = [KernelCall(gemm_tma_kernel, grid[:2], args, tma_meta, opts)]
    else:
        counts = split_counters(grid[0] * batch, a.device) if reduce_last else out
        args = (a, b, out, part, counts, m, n, k, sab, sam, sak, sbb, sbk, sbn, 0)
        calls = [KernelCall(gemm_kernel, grid, args,
                            {**meta, "REDUCE_LAST": reduce_last, "TILE_PARTS": False}, opts)]
    if workspace is not None and not reduce_last:
        calls.append(KernelCall(splitk_reduce_kernel, (triton.cdiv(m * n, REDUCE_BLOCK), batch),
                                (workspace, out, m * n), dict(SPLIT_K=split_k, BLOCK=REDUCE_BLOCK),
                                {"num_warps": 4}))
    return out, calls


def _tail_split_plan(a, b, out, tiles: int, meta: dict, opts: dict, use_tma: bool,
                     b_is_weight: bool) -> list[KernelCall]:
    """SCHEDULE 3, the tail split (2-D): the whole waves of output tiles (multiprocessors x
    waves) run one program a tile over all of K; the tiles of the last, partial wave run
    SPLIT_K programs each over slices of K, the tile's last split summing the partials in the
    same launch (REDUCE_LAST, partials one block a tile: TILE_PARTS). So the partial wave is as
    many programs as SPLIT_K makes it, each 1 / SPLIT_K as long, where SCHEDULE 0 runs it as a
    wave of whole-K programs with multiprocessors idle. Fewer tiles than one wave: every tile is
    split; a whole number of waves: no tile is (SCHEDULE 0's launch)."""
    split_k = int(meta["SPLIT_K"])
    if split_k < 2:
        raise ValueError(f"gemm SCHEDULE=3 (tail split) needs SPLIT_K >= 2, not {split_k}")
    (m, k), n = a.shape, b.shape[1]
    sms = sm_count(a.device)
    waves = tiles // sms * sms
    tail = tiles - waves
    tma = use_tma and tma_supported(a, b)
    if tma:
        a_desc, b_desc = _descriptors(a, b, meta["BLOCK_M"], meta["BLOCK_N"], meta["BLOCK_K"])
        shared = {key: meta[key] for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")}
    calls = []
    for first, count, splits in ((0, waves, 1), (waves, tail, split_k)):
        if count == 0:
            continue
        split = splits > 1
        part = (torch.empty((splits, count, meta["BLOCK_M"] * meta["BLOCK_N"]), device=a.device,
                            dtype=torch.float32) if split else out)
        counts = split_counters(count, a.device) if split else out
        flags = dict(SPLIT_K=splits, REDUCE_LAST=split, TILE_PARTS=split)
        if tma:
            args = (a_desc, b_desc, out, part, counts, m, n, k, first)
            calls.append(KernelCall(gemm_tma_kernel, (count, splits), args,
                                    {**shared, **flags, "B_IS_WEIGHT": b_is_weight}, opts))
        else:
            args = (a, b, out, part, counts, m, n, k, 0, a.stride(0), a.stride(1), 0,
                    b.stride(0), b.stride(1), first)
            calls.append(KernelCall(gemm_kernel, (count, splits, 1), args, {**meta, **flags}, opts))
    return calls


def _descriptors(a: torch.Tensor, b: torch.Tensor, block_m: int, block_n: int, block_k: int):
    """Host-side tensor descriptors of A [m, k] and B (the weight [n, k] when b is the [k, n]
    view of a row-major weight, else row-major [k, n]); `tma_supported(a, b)` holds."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    (m, k), n = a.shape, b.shape[1]
    a_desc = TensorDescriptor(a, [m, k], [a.stride(0), 1], [block_m, block_k])
    if b.stride(0) == 1:
        return a_desc, TensorDescriptor(b, [n, k], [b.stride(1), 1], [block_n, block_k])
    return a_desc, TensorDescriptor(b, [k, n], [b.stride(0), 1], [block_k, block_n])


def tma_supported(a: torch.Tensor, b: torch.Tensor) -> bool:
    """TMA descriptors need 2-D operands with a contiguous last dimension, 16-byte aligned rows
    and base: A row-major [m, k]; B the [k, n] view of a row-major weight, or row-major [k, n]."""
    if a.dim() != 2 or b.dim() != 2 or a.stride(1) != 1 or (b.stride(0) != 1 and b.stride(1) != 1):
        return False
    elem = a.element_size()
    row_strides = (a.stride(0), b.stride(1) if b.stride(0) == 1 else b.stride(0))
    aligned = all(stride * elem % 16 == 0 for stride in row_strides)
    return aligned and a.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0


def launch(inputs: dict, config: dict, out: torch.Tensor | None = None) -> torch.Tensor:
    out, calls = launch_plan(inputs, config, out)
    for call in calls:
        call.run()
    return out


def default_config(shape: dict, backend: str = "cuda", sm_count: int | None = None) -> dict:
    """A reasonable untuned config: big tiles for big m, narrow tiles (and split K) for small m.

    It satisfies the constraints of search_spaces/gemm.yaml for the backend (tested). `sm_count`
    is part of the family interface; this heuristic does not depend on the device's size.
    """
    m, n, k = int(shape["m"]), int(shape["n"]), int(shape["k"])
    hip = backend in ("hip", "dcu")
    if m >= 256:
        block_m, block_n, block_k, warps = 128, 128, (32 if hip else 64), 8
    else:
        block_m, block_n, block_k, warps = max(16, min(64, pow2_at_least(m))), 64, 128, 4
        if hip:
            block_k = 64
    block_n = min(block_n, max(32, pow2_at_least(n)))
    block_k = min(block_k, max(32, pow2_at_least(k)))
    if block_m * block_n < 8192:
        warps = 4
    tiles_m, tiles_n = triton.cdiv(m, block_m), triton.cdiv(n, block_n)
    split_k = 1
    # the m-fastest tile order (every row tile of a weight column tile side by side, up to 8):
    # in row order a wave's weight column tiles are read again from HBM for every row of tiles;
    # on an H100 the order alone took the tiled 28672 x 4096 projection at m = 512 from 324 to
    # 193 us, and left the 4096-wide ones within -3 / +3% (BENCHMARKS.md)
    # Small output grids: split K until there are ~128 programs, keeping >= 4 K tiles per split.
    while (tiles_m * tiles_n * _batch(shape) * split_k < 128 and split_k < 8
           and tiles_m * tiles_n < 256 and triton.cdiv(k, block_k) >= 4 * split_k * 2):
        split_k *= 2
    config = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k,
              "GROUP_M": column_group(m, block_m), "SPLIT_K": split_k, "SWAP_AB": 0,
              "SCHEDULE": 0, "num_warps": warps, "num_stages": 2 if hip else 3}
    if hip:
        config.update({"waves_per_eu": 0, "matrix_instr_nonkdim": 16, "kpack": 1})
    else:
        config["TMA"] = 0  # the pointer kernel: runs on every layout and alignment
    if (not hip and 9 <= m <= 64 and _batch(shape) == 1 and shape.get("layout", "NT") == "NT"
            and n >= 1024 and k >= 1024 and k % 8 == 0):
        # Decode batches: the swap-AB skinny kernel (W rows on wgmma's wide side, TMA stages).
        # The H200 sweep's m = 16..64 winner on the 8B decode linears (scripts/gpu/kernels15.sh,
        # 2026-12-01: 1.04-1.20x torch where the tiled default was 0.79-1.05x; BENCHMARKS.md).
        wide, block_m = n >= 12288, max(16, pow2_at_least(m))
        block_k = 256 if not wide and n > 1024 and block_m <= 32 else 128
        config = {"BLOCK_M": block_m, "BLOCK_N": 128 if wide else 64, "BLOCK_K": block_k,
                  "GROUP_M": 1, "SPLIT_K": 4 if n <= 1024 else 1, "SWAP_AB": 1, "TMA": 1, "SCHEDULE": 0,
                  "num_warps": 4, "num_stages": 4 if wide or block_k == 256 else 6}
    config["BALANCE_N"] = 0  # the measured winners above; balanced rows are a search knob
    config["REDUCE_LAST"] = 0
    return config


def baseline(inputs: dict) -> torch.Tensor:
    """torch's matmul on the same (strided) views: cuBLAS / hipBLASLt, as F.linear would call."""
    return torch.matmul(inputs["a"], inputs["b"])


def reference(inputs: dict) -> torch.Tensor:
    return torch.matmul(inputs["a"].float(), inputs["b"].float())


def _cost(shape: dict) -> tuple[int, int]:
    elem = torch.empty((), dtype=_dtype(shape)).element_size()
    return gemm_cost(int(shape["m"]), int(shape["n"]), int(shape["k"]), batch=_batch(shape),
                     elem_bytes=elem)


def bytes_moved(shape: dict) -> int:
    return _cost(shape)[0]


def flops(shape: dict) -> int:
    return _cost(shape)[1]


def shape_from_row(row) -> dict | None:
    """GEMM rows with m > 8 (m <= 8 belongs to gemv), or any m for batched rows (bmm, batch > 1)."""
    if row_value(row, "family") != "gemm":
        return None
    dtype = row_value(row, "dtype")
    if dtype not in DTYPES:
        return None
    m, n, k = int(row_value(row, "m", 0)), int(row_value(row, "n", 0)), int(row_value(row, "k", 0))
    batch = int(row_value(row, "batch", 1) or 1)
    if min(m, n, k) <= 0:
        return None
    if batch <= 1 and m <= 8:
        return None
    layout = row_value(row, "layout") or "NT"
    if layout not in LAYOUTS:
        return None
    shape = {"m": m, "n": n, "k": k, "dtype": dtype, "layout": layout}
    if batch > 1:
        shape["batch"] = batch
    return shape


def shape_key(shape: dict) -> str:
    return format_shape_key(shape, ("batch", "m", "n", "k", "dtype", "layout"))


FAMILY = KernelFamily(
    name="gemm",
    make_inputs=make_inputs,
    launch=launch,
    default_config=default_config,
    baseline=baseline,
    reference=reference,
    bytes_moved=bytes_moved,
    flops=flops,
    shape_from_row=shape_from_row,
    shape_key=shape_key,
    launch_plan=launch_plan,
    source_files=(Path(__file__).resolve(), Path(skinny.__file__).resolve(), *COMMON_SOURCES),
)
