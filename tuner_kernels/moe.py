"""Fused mixture-of-experts family: the expert MLPs of one MoE block, tokens grouped by expert.

    out[t] = sum over j < topk of  w[t, j] · W2[e] · (silu(W1g[e] · x[t]) * (W1u[e] · x[t])),
             e = ids[t, j]

with ``x`` [m, hidden], ``w1`` [E, 2 · inter, hidden] (gate rows then up rows, as vLLM's and
SGLang's ``w13`` and transformers' fused ``gate_up_proj``), ``w2`` [E, hidden, inter], the router's
choice ``topk_ids`` [m, topk] and its weights ``topk_weights`` [m, topk] (fp32). The router GEMM
and its top-k are not part of the family: they come as inputs, as they do to the engines'
``fused_experts``.

The structure is the one the serving engines' fused MoE Triton kernel has, so that a config
(BLOCK_SIZE_M/N/K, GROUP_SIZE_M, num_warps, num_stages) means the same tiling here and there:

1. align: the m · topk (token, expert) pairs sorted by expert, each expert's run padded to a
   multiple of BLOCK_SIZE_M with the sentinel m · topk; one expert id per block; the padded total
   as a 1-element tensor. ``moe_align_kernel`` does it in one launch of one program (the
   engines' ``moe_align_block_size``) up to ALIGN_MAX_PAIRS pairs and ALIGN_MAX_EXPERTS experts
   (decode); above, ``align`` does it with torch ops of fixed sizes (a dozen launches, no host
   sync). Both give the same bytes and are graph-capturable.
2. ``moe_gemm_kernel`` (up): each program takes one BLOCK_SIZE_M block of sorted pairs (all one
   expert) and a BLOCK_SIZE_N slice of w1's 2 · inter rows; writes the [m · topk, 2 · inter]
   intermediate, row = pair index. Blocks past the padded total return at once. SPLIT_K_UP (our
   addition) splits hidden over that many programs: the intermediate is then fp32 partials
   [SPLIT_K_UP, m · topk, 2 · inter] (at m = 1 the up projection has only topk · 2 · inter /
   BLOCK_SIZE_N programs to read most of the block's weight bytes).
3. ``moe_gemm_kernel`` (down, ACT): the same tiling over w2; its A loads sum the intermediate's
   SPLIT_K_UP partials in a fixed order, apply silu(gate) · up in fp32 and round to the weights'
   dtype (the engines' silu_and_mul, without its own launch and round trip), multiply by the
   routing weight and write fp32 partials [SPLIT_K, m · topk, hidden]. SPLIT_K (ours too) splits
   inter.
4. ``moe_reduce_kernel``: out[t] = the sum over j and the K splits, in a fixed order (no
   atomics: deterministic bytes), rounded once.

Baselines (what serving without this kernel runs, graph-safe so tuner.timing can capture them):
``grouped_baseline`` sorts the pairs and runs torch's grouped matmul (``torch._grouped_mm``,
where the installed torch and GPU have it: sm90+ or the CPU); ``loop_baseline`` is a per-expert
torch loop over all E experts with the routing weight as a dense [m, E] mask (transformers'
eager loop without its host syncs, which no graph can capture); ``dense_baseline`` (experts 1,
top-k 1: a dense decoder layer's gated MLP, as tuner.harvest.mlp reads it) is transformers'
Llama / Qwen3 MLP, three F.linear calls and silu · up. ``baseline`` is the dense one at experts
1 and top-k 1, else the grouped one where it runs, else the loop. ``reference``: fp32 throughout, per expert.

Bytes: tuner_kernels.cost.moe_cost (x read, the touched experts' weights read once, out written; the
touched count is the expected number of distinct experts m tokens pick at random).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from tuner_kernels import COMMON_SOURCES, KernelFamily, format_shape_key
from tuner_kernels.common import (DTYPES, KernelCall, interpreting, launch_options, pow2_at_least,
                                  row_value, tensor_backend)
from tuner_kernels.cost import dtype_bytes, moe_cost

__all__ = ["ALIGN_MAX_EXPERTS", "ALIGN_MAX_PAIRS", "ALIGN_TILE", "FAMILY", "ENGINE_KEYS",
           "REDUCE_BLOCK", "align", "align_chunk", "align_in_kernel", "baseline", "bytes_moved",
           "default_config", "dense_baseline", "dense_mlp", "flops", "grouped_baseline", "grouped_mm_available", "launch",
           "launch_plan", "loop_baseline", "make_inputs", "max_padded", "moe_align_kernel",
           "moe_gemm_kernel", "moe_gemv_down_kernel", "moe_gemv_up_kernel",
           "moe_reduce_kernel", "reference", "shape_from_row", "shape_key"]

# The config keys the engines' fused MoE kernel reads (vLLM, SGLang tuned-config files).
ENGINE_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps",
               "num_stages")
REDUCE_BLOCK = 256
ALIGN_MAX_PAIRS = 4096    # moe_align_kernel's reach: one program loops over the pairs in chunks
ALIGN_MAX_EXPERTS = 1024  # its one-hot tiles are [align_chunk(experts), experts]
ALIGN_TILE = 4096  # elements of one one-hot tile: 32 pairs a chunk up to 128 experts, fewer above


def align_chunk(experts: int) -> int:
    """Pairs per chunk of moe_align_kernel: [chunk, experts] tiles of ALIGN_TILE elements (32
    pairs up to 128 experts, 4 at 1024), so its registers do not grow with the expert count."""
    return max(1, min(32, ALIGN_TILE // pow2_at_least(experts)))


@triton.jit
def moe_align_kernel(ids_ptr, sorted_ids_ptr, expert_ids_ptr, total_ptr, num_pairs, experts,
                     slots, blocks, BLOCK_SIZE_M: tl.constexpr, E_BLOCK: tl.constexpr,
                     CHUNK: tl.constexpr):
    """`align` in one program (grid (1,)): the same three outputs, byte for byte. ids_ptr: the
    flat topk ids (pair p = t * topk + j). Pass 1 counts each expert's pairs; the padded runs'
    starts are their exclusive prefix sum. The sentinel fill and the block experts come next, a
    barrier, then pass 2 scatters pair p to start[e] + (pairs of e before p), ascending in p as
    the stable sort: a running count per expert across chunks, a triangular compare inside one."""
    e = tl.arange(0, E_BLOCK)
    lane = tl.arange(0, CHUNK)
    counts = tl.zeros([E_BLOCK], dtype=tl.int32)
    for start in range(0, num_pairs, CHUNK):
        p = start + lane
        ids = tl.load(ids_ptr + p, mask=p < num_pairs, other=-1).to(tl.int32)
        counts += tl.sum((ids[:, None] == e[None, :]).to(tl.int32), axis=0)
    padded = (counts + BLOCK_SIZE_M - 1) // BLOCK_SIZE_M * BLOCK_SIZE_M
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    tl.store(total_ptr, tl.sum(padded, axis=0))
    sentinel = tl.zeros([CHUNK], dtype=tl.int32) + num_pairs
    for s0 in range(0, slots, CHUNK):
        s = s0 + lane
        tl.store(sorted_ids_ptr + s, sentinel, mask=s < slots)
    for b0 in range(0, blocks, CHUNK):
        b = b0 + lane
        below = (ends[None, :] <= (b * BLOCK_SIZE_M)[:, None]) & (e[None, :] < experts)
        expert = tl.minimum(tl.sum(below.to(tl.int32), axis=1), experts - 1)
        tl.store(expert_ids_ptr + b, expert, mask=b < blocks)
    tl.debug_barrier()  # the sentinels land before the pairs that overwrite some of them
    running = starts
    for start in range(0, num_pairs, CHUNK):
        p = start + lane
        valid = p < num_pairs
        ids = tl.load(ids_ptr + p, mask=valid, other=-1).to(tl.int32)
        hit = (ids[:, None] == e[None, :]).to(tl.int32)
        base = tl.sum(hit * running[None, :], axis=1)
        earlier = (ids[:, None] == ids[None, :]) & (lane[None, :] < lane[:, None])
        position = base + tl.sum(earlier.to(tl.int32), axis=1)
        tl.store(sorted_ids_ptr + position, p, mask=valid)
        running += tl.sum(hit, axis=0)


@triton.jit
def moe_gemm_kernel(
    a_ptr, b_ptr, c_ptr, weights_ptr, sorted_ids_ptr, expert_ids_ptr, padded_total_ptr,
    N, K, num_pairs, num_blocks_m,
    stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cs, stride_cm, stride_cn,
    stride_as,
    A_ROW_DIV: tl.constexpr, ACT: tl.constexpr, MUL_WEIGHT: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
    A_SPLITS: tl.constexpr,
):
    """One BLOCK_SIZE_M block of sorted (token, expert) pairs times one BLOCK_SIZE_N slice of the
    expert's weight [N, K], over one K split. grid = (num_blocks_m * cdiv(N, BLOCK_SIZE_N), SPLIT_K).

    A row of pair p is a[p // A_ROW_DIV] (A_ROW_DIV = topk: the token's activations; 1: the pair's
    intermediate row). ACT: a holds [gate | up] of width 2 K, as A_SPLITS partials stride_as
    apart (summed in order, fp32), and the A operand is silu(gate) * up (fp32, rounded to b's
    dtype). MUL_WEIGHT: scale rows by weights[p].
    c is written at row p: c + split * stride_cs + p * stride_cm."""
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_blocks_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    padded_total = tl.load(padded_total_ptr)
    if pid_m * BLOCK_SIZE_M >= padded_total:
        return
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    pairs = tl.load(sorted_ids_ptr + offs_m).to(tl.int64)
    pair_mask = pairs < num_pairs
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)

    k_tiles = tl.cdiv(K, BLOCK_SIZE_K)
    tiles_per_split = tl.cdiv(k_tiles, SPLIT_K)
    tile_start = pid_k * tiles_per_split
    tile_end = min(tile_start + tiles_per_split, k_tiles)

    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    mask_n = offs_n < N
    rows = pairs // A_ROW_DIV
    a_ptrs = a_ptr + rows[:, None] * stride_am + (tile_start * BLOCK_SIZE_K + offs_k)[None, :] * stride_ak
    b_ptrs = (b_ptr + expert * stride_be + offs_n[None, :] * stride_bn
              + (tile_start * BLOCK_SIZE_K + offs_k)[:, None] * stride_bk)

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for t in range(tile_start, tile_end):
        if EVEN_K:
            a_mask = pair_mask[:, None]
            b_mask = mask_n[None, :]
        else:
            k_left = K - t * BLOCK_SIZE_K
            a_mask = pair_mask[:, None] & (offs_k[None, :] < k_left)
            b_mask = (offs_k[:, None] < k_left) & mask_n[None, :]
        a = tl.load(a_ptrs, mask=a_mask, other=0.0)
        if ACT:
            up = tl.load(a_ptrs + K * stride_ak, mask=a_mask, other=0.0).to(tl.float32)
            gate = a.to(tl.float32)
            for s in tl.static_range(1, A_SPLITS):
                split = a_ptrs + s * stride_as.to(tl.int64)
                gate += tl.load(split, mask=a_mask, other=0.0).to(tl.float32)
                up += tl.load(split + K * stride_ak, mask=a_mask, other=0.0).to(tl.float32)
            a = (gate / (1.0 + tl.exp(-gate)) * up).to(b_ptr.dtype.element_ty)
        b = tl.load(b_ptrs, mask=b_mask, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk

    if MUL_WEIGHT:
        scale = tl.load(weights_ptr + pairs, mask=pair_mask, other=0.0)
        acc = acc * scale[:, None]
    # the split's offset in int64: SPLIT_K · stride_cs passes 2**31 at prefill sizes
    c_ptrs = (c_ptr + pid_k.to(tl.int64) * stride_cs + pairs[:, None] * stride_cm
              + offs_n[None, :] * stride_cn)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=pair_mask[:, None] & mask_n[None, :])


@triton.jit
def moe_reduce_kernel(ws_ptr, out_ptr, N, stride_ws, TOPK: tl.constexpr, SPLIT_K: tl.constexpr,
                      BLOCK: tl.constexpr):
    """out[t, :] = sum over split s, then pair j of ws[s, t * TOPK + j, :], in that fixed order.
    grid = (m, cdiv(N, BLOCK))."""
    token = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        for j in tl.static_range(TOPK):
            acc += tl.load(ws_ptr + s * stride_ws + (token * TOPK + j) * N + offs, mask=mask,
                           other=0.0)
    tl.store(out_ptr + token * N + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def moe_gemv_up_kernel(x_ptr, w1_ptr, act_ptr, ids_ptr, INTER, K, stride_xm, stride_we,
                       stride_wn, stride_wk, stride_am,
                       TOPK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       EVEN_K: tl.constexpr, STAGES: tl.constexpr, STATIC_K: tl.constexpr = 0):
    """The GEMV path's up projection: act[p, rows] = silu(W1g[e] · x[t]) * (W1u[e] · x[t]) for one
    (token, expert) pair p = t * TOPK + j (e = ids[p]) and BLOCK_N rows of the gate and of the up
    half. grid = (pairs, cdiv(INTER, BLOCK_N)): the pairs of one row slice launch together, so a
    second pair of the same expert reads its tile from L2. Gate and up sums in fp32 [BLOCK_N,
    BLOCK_K] accumulators (W tiles contiguous along K, x repeated across the rows so its loads
    take the tile's layout), reduced once after the loop; the product rounded once to act's
    dtype. STAGES: loop-level pipeline depth (1: the plain loop). STATIC_K: K as a constant
    for the CPU interpreter (0 on a GPU)."""
    pair = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    token = (pair // TOPK).to(tl.int64)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_safe = tl.minimum(rows, INTER - 1)  # clamped: the W loads need no row mask
    offs = tl.arange(0, BLOCK_K)
    zero_rows = tl.zeros([BLOCK_N], dtype=tl.int32)
    rows64 = rows_safe.to(tl.int64)
    gate_rows = w1_ptr + expert * stride_we + rows64[:, None] * stride_wn
    up_rows = w1_ptr + expert * stride_we + (rows64 + INTER)[:, None] * stride_wn
    x_row = x_ptr + token * stride_xm
    acc_g = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    k_loop = K if STATIC_K == 0 else STATIC_K
    for k0 in tl.range(0, k_loop, BLOCK_K, num_stages=STAGES):
        offs_k = k0 + offs
        offs_2d = zero_rows[:, None] + offs_k[None, :]
        if EVEN_K:
            k_mask = None
            k_other = None
        else:
            k_mask = offs_2d < K
            k_other = 0.0
        xv = tl.load(x_row + offs_2d, mask=k_mask, other=k_other).to(tl.float32)
        g = tl.load(gate_rows + offs_k[None, :] * stride_wk, mask=k_mask, other=k_other,
                    eviction_policy="evict_first").to(tl.float32)
        u = tl.load(up_rows + offs_k[None, :] * stride_wk, mask=k_mask, other=k_other,
                    eviction_policy="evict_first").to(tl.float32)
        acc_g += g * xv
        acc_u += u * xv
    gate = tl.sum(acc_g, axis=1)
    up = tl.sum(acc_u, axis=1)
    act = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(act_ptr + pair.to(tl.int64) * stride_am + rows, act.to(act_ptr.dtype.element_ty),
             mask=rows < INTER)


@triton.jit
def moe_gemv_down_kernel(act_ptr, w2_ptr, out_ptr, ids_ptr, weights_ptr, N, K, stride_am,
                         stride_we, stride_wn, stride_wk, stride_om,
                         TOPK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         EVEN_K: tl.constexpr, STAGES: tl.constexpr, STATIC_K: tl.constexpr = 0):
    """The GEMV path's down projection and the sum over the topk experts in one launch:
    out[t, rows] = sum over j < TOPK of weights[p] · W2[e] · act[p], p = t * TOPK + j, e = ids[p]
    (fp32, rounded once: no atomics, no reduce kernel). grid = (m, cdiv(N, BLOCK_N)), tokens of
    one row slice together. The K chunks are the outer loop and the experts the inner, unrolled
    one: the TOPK experts' W tiles of a chunk are independent loads, in flight together (a loop
    over experts outside would wait for each expert's loads in turn). One [BLOCK_N, BLOCK_K]
    accumulator sums, chunk by chunk, expert j's W tile times act[p] · weights[p], in j order:
    a fixed order, the same bytes every run."""
    token = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_safe = tl.minimum(rows, N - 1)
    offs = tl.arange(0, BLOCK_K)
    zero_rows = tl.zeros([BLOCK_N], dtype=tl.int32)
    k_loop = K if STATIC_K == 0 else STATIC_K
    first = token.to(tl.int64) * TOPK
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in tl.range(0, k_loop, BLOCK_K, num_stages=STAGES):
        offs_k = k0 + offs
        offs_2d = zero_rows[:, None] + offs_k[None, :]
        if EVEN_K:
            k_mask = None
            k_other = None
        else:
            k_mask = offs_2d < K
            k_other = 0.0
        for j in tl.static_range(TOPK):
            expert = tl.load(ids_ptr + first + j).to(tl.int64)
            scale = tl.load(weights_ptr + first + j).to(tl.float32)
            w = tl.load(w2_ptr + expert * stride_we + rows_safe.to(tl.int64)[:, None] * stride_wn
                        + offs_k[None, :] * stride_wk, mask=k_mask, other=k_other,
                        eviction_policy="evict_first").to(tl.float32)
            a = tl.load(act_ptr + (first + j) * stride_am + offs_2d, mask=k_mask,
                        other=k_other).to(tl.float32)
            acc += w * (a * scale)
    tl.store(out_ptr + token.to(tl.int64) * stride_om + rows,
             tl.sum(acc, axis=1).to(out_ptr.dtype.element_ty), mask=rows < N)


# ----------------------------------------------------------------------------------------------
# Shapes and inputs

def _dims(shape: dict) -> tuple[int, int, int, int, int]:
    return (int(shape["m"]), int(shape["experts"]), int(shape["topk"]), int(shape["hidden"]),
            int(shape["inter"]))


def _dtype(shape: dict) -> torch.dtype:
    name = shape.get("dtype", "bfloat16")
    if name not in DTYPES:
        raise ValueError(f"moe supports {', '.join(DTYPES)}, not {name!r}")
    return DTYPES[name]


def make_inputs(shape: dict, device="cpu", seed: int = 0) -> dict:
    """Random activations in [-1, 1), weights scaled by 1/sqrt(fan-in), each token routed to topk
    distinct experts drawn uniformly, routing weights a softmax over its topk (renormalised, as
    Qwen3-MoE's norm_topk_prob), fp32."""
    m, experts, topk, hidden, inter = _dims(shape)
    if topk > experts:
        raise ValueError(f"moe: topk {topk} exceeds experts {experts}")
    dtype = _dtype(shape)
    if torch.device(device).type == "meta":
        return {"x": torch.empty(m, hidden, dtype=dtype, device="meta"),
                "w1": torch.empty(experts, 2 * inter, hidden, dtype=dtype, device="meta"),
                "w2": torch.empty(experts, hidden, inter, dtype=dtype, device="meta"),
                "topk_ids": torch.empty(m, topk, dtype=torch.int32, device="meta"),
                "topk_weights": torch.empty(m, topk, dtype=torch.float32, device="meta")}
    gen = torch.Generator(device=device).manual_seed(seed)

    def rand(dims, scale):
        t = torch.rand(*dims, generator=gen, dtype=torch.float32, device=device)
        return ((t * 2 - 1) * scale).to(dtype)

    dense = dense_mlp(shape)  # every token to expert 0 with weight 1 (`dense_baseline`)
    if not dense:
        scores = torch.rand(m, experts, generator=gen, device=device)
        topk_ids = scores.topk(topk, dim=-1).indices.to(torch.int32)
        logits = torch.randn(m, topk, generator=gen, device=device)
    inputs = {"x": rand((m, hidden), 1.0),
              "w1": rand((experts, 2 * inter, hidden), 1.0 / math.sqrt(hidden)),
              "w2": rand((experts, hidden, inter), 1.0 / math.sqrt(inter))}
    if dense:
        return {**inputs, "topk_ids": torch.zeros(m, 1, dtype=torch.int32, device=device),
                "topk_weights": torch.ones(m, 1, dtype=torch.float32, device=device)}
    return {**inputs, "topk_ids": topk_ids, "topk_weights": torch.softmax(logits, dim=-1).float()}


def max_padded(pairs: int, experts: int, block_m: int) -> int:
    """Slots of the sorted, padded pair list: every non-empty expert (at most min(pairs, E)) pads
    its run by at most block_m - 1; rounded up to whole blocks."""
    bound = pairs + min(pairs, experts) * (block_m - 1)
    return -(-bound // block_m) * block_m


def align(topk_ids: torch.Tensor, experts: int, block_m: int):
    """(sorted_ids int32 [max_padded], expert_ids int32 [blocks], padded_total int32 [1]) with
    torch ops of fixed sizes only (no host sync: capturable in a CUDA graph). sorted_ids holds
    pair indices t * topk + j grouped by expert (stable: ascending within an expert), each run
    padded with the sentinel m * topk to a multiple of block_m."""
    flat = topk_ids.reshape(-1).to(torch.int64)
    pairs = flat.numel()
    slots = max_padded(pairs, experts, block_m)
    counts = torch.zeros(experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    order = torch.argsort(flat, stable=True)
    sorted_experts = flat[order]
    first = torch.cumsum(counts, 0) - counts
    rank = torch.arange(pairs, device=flat.device) - first[sorted_experts]
    position = (ends - padded)[sorted_experts] + rank
    sorted_ids = torch.full((slots,), pairs, dtype=torch.int32, device=flat.device)
    sorted_ids.scatter_(0, position, order.to(torch.int32))
    starts = torch.arange(0, slots, block_m, device=flat.device)
    expert_ids = torch.searchsorted(ends, starts, right=True).clamp_(max=experts - 1)
    return sorted_ids, expert_ids.to(torch.int32), ends[-1:].to(torch.int32)


def align_in_kernel(pairs: int, experts: int) -> bool:
    """Whether a call's align step is moe_align_kernel (one launch) rather than `align`'s torch
    ops: up to ALIGN_MAX_PAIRS (token, expert) pairs and ALIGN_MAX_EXPERTS experts."""
    return pairs <= ALIGN_MAX_PAIRS and experts <= ALIGN_MAX_EXPERTS


def launch_plan(inputs: dict, config: dict, out: torch.Tensor | None = None,
                backend: str | None = None) -> tuple[torch.Tensor, list[KernelCall]]:
    """The output and the kernel calls: align (moe_align_kernel where `align_in_kernel`), up,
    down, reduce. Above the align kernel's reach `align` runs here (torch ops) and the plan has
    three calls; on 'meta' tensors its outputs are placeholders of the right sizes (offline
    compiles)."""
    x, w1, w2 = inputs["x"], inputs["w1"], inputs["w2"]
    ids, weights = inputs["topk_ids"], inputs["topk_weights"]
    m, hidden = x.shape
    experts, two_inter, _ = w1.shape
    inter = two_inter // 2
    topk = ids.shape[1]
    pairs = m * topk
    if tuple(w2.shape) != (experts, hidden, inter) or tuple(w1.shape[2:]) != (hidden,):
        raise ValueError(f"moe: w1 {tuple(w1.shape)} and w2 {tuple(w2.shape)} do not fit x {tuple(x.shape)}")
    if out is None:
        out = torch.empty((m, hidden), device=x.device, dtype=x.dtype)
    elif tuple(out.shape) != (m, hidden) or not out.is_contiguous():
        raise ValueError(f"moe: out must be a contiguous ({m}, {hidden}) tensor")
    block_m, block_n, block_k = (int(config["BLOCK_SIZE_M"]), int(config["BLOCK_SIZE_N"]),
                                 int(config["BLOCK_SIZE_K"]))
    opts = launch_options(config, backend or tensor_backend(x))
    if int(config.get("GEMV", 0)):
        return out, _gemv_plan(inputs, config, out, opts)
    group_m, split_k = int(config.get("GROUP_SIZE_M", 1)), int(config.get("SPLIT_K", 1))
    split_up = int(config.get("SPLIT_K_UP", 1))
    slots = max_padded(pairs, experts, block_m)
    blocks = slots // block_m
    calls = []
    if x.device.type == "meta" or align_in_kernel(pairs, experts):
        sorted_ids = torch.empty(slots, dtype=torch.int32, device=x.device)
        expert_ids = torch.empty(blocks, dtype=torch.int32, device=x.device)
        total = torch.empty(1, dtype=torch.int32, device=x.device)
    if align_in_kernel(pairs, experts):
        calls.append(KernelCall(
            moe_align_kernel, (1,),
            (ids.contiguous().view(-1), sorted_ids, expert_ids, total, pairs, experts, slots,
             blocks),
            dict(BLOCK_SIZE_M=block_m, E_BLOCK=pow2_at_least(experts),
                 CHUNK=align_chunk(experts)),
            {"num_warps": 4}))
    elif x.device.type != "meta":
        sorted_ids, expert_ids, total = align(ids, experts, block_m)
    weights = weights.reshape(-1)
    mid = torch.empty((split_up, pairs, two_inter), device=x.device,
                      dtype=x.dtype if split_up == 1 else torch.float32)
    ws = torch.empty((split_k, pairs, hidden), device=x.device, dtype=torch.float32)
    meta = dict(BLOCK_SIZE_M=block_m, BLOCK_SIZE_N=block_n, BLOCK_SIZE_K=block_k,
                GROUP_SIZE_M=group_m)
    up = KernelCall(
        moe_gemm_kernel, (blocks * triton.cdiv(two_inter, block_n), split_up),
        (x, w1, mid, weights, sorted_ids, expert_ids, total, two_inter, hidden, pairs, blocks,
         x.stride(0), x.stride(1), w1.stride(0), w1.stride(1), w1.stride(2), mid.stride(0),
         mid.stride(1), mid.stride(2), 0),
        dict(A_ROW_DIV=topk, ACT=False, MUL_WEIGHT=False, SPLIT_K=split_up,
             EVEN_K=hidden % block_k == 0, A_SPLITS=1, **meta), opts)
    down = KernelCall(
        moe_gemm_kernel, (blocks * triton.cdiv(hidden, block_n), split_k),
        (mid, w2, ws, weights, sorted_ids, expert_ids, total, hidden, inter, pairs, blocks,
         mid.stride(1), mid.stride(2), w2.stride(0), w2.stride(1), w2.stride(2), ws.stride(0),
         ws.stride(1), ws.stride(2), mid.stride(0)),
        dict(A_ROW_DIV=1, ACT=True, MUL_WEIGHT=True, SPLIT_K=split_k,
             EVEN_K=inter % block_k == 0, A_SPLITS=split_up, **meta), opts)
    reduce = KernelCall(moe_reduce_kernel, (m, triton.cdiv(hidden, REDUCE_BLOCK)),
                        (ws, out, hidden, pairs * hidden),
                        dict(TOPK=topk, SPLIT_K=split_k, BLOCK=REDUCE_BLOCK), {"num_warps": 4})
    return out, calls + [up, down, reduce]


def _gemv_plan(inputs: dict, config: dict, out: torch.Tensor, opts: dict) -> list[KernelCall]:
    """The GEMV path (config GEMV = 1): two launches, no align and no reduce. Up: one program a
    (pair, BLOCK_SIZE_N rows of inter), writing silu(gate) · up as the [pairs, inter]
    intermediate in x's dtype; down: one program a (token, BLOCK_SIZE_N rows of hidden), summing
    the token's topk experts in order. BLOCK_SIZE_K is the K chunk of both loops, num_stages
    their loop-level pipeline depth."""
    x, w1, w2 = inputs["x"], inputs["w1"], inputs["w2"]
    ids = inputs["topk_ids"].contiguous().view(-1)
    weights = inputs["topk_weights"].contiguous().view(-1)
    m, hidden = x.shape
    inter = w1.shape[1] // 2
    topk = inputs["topk_ids"].shape[1]
    pairs = m * topk
    block_n, block_k = int(config["BLOCK_SIZE_N"]), int(config["BLOCK_SIZE_K"])
    stages = int(config.get("num_stages", 1))
    act = torch.empty((pairs, inter), device=x.device, dtype=x.dtype)
    static = interpreting()
    up = KernelCall(
        moe_gemv_up_kernel, (pairs, triton.cdiv(inter, block_n)),
        (x, w1, act, ids, inter, hidden, x.stride(0), w1.stride(0), w1.stride(1), w1.stride(2),
         act.stride(0)),
        dict(TOPK=topk, BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=hidden % block_k == 0,
             STAGES=stages, STATIC_K=hidden if static else 0), opts)
    down = KernelCall(
        moe_gemv_down_kernel, (m, triton.cdiv(hidden, block_n)),
        (act, w2, out, ids, weights, hidden, inter, act.stride(0), w2.stride(0), w2.stride(1),
         w2.stride(2), out.stride(0)),
        dict(TOPK=topk, BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=inter % block_k == 0,
             STAGES=stages, STATIC_K=inter if static else 0), opts)
    return [up, down]


def launch(inputs: dict, config: dict, out: torch.Tensor | None = None) -> torch.Tensor:
    out, calls = launch_plan(inputs, config, out)
    for call in calls:
        call.run()
    return out


def default_config(shape: dict, backend: str = "cuda", sm_count: int | None = None) -> dict:
    """The untuned config: the engines' default tiling for sparse batches (pairs per expert at
    most 16: BLOCK_SIZE_M 16, GROUP_SIZE_M 1), wider M tiles as experts fill up. It satisfies
    search_spaces/moe.yaml for the backend (tested); `sm_count` is not used."""
    m, experts, topk, hidden, inter = _dims(shape)
    per_expert = m * topk / experts
    hip = backend in ("hip", "dcu")
    if per_expert <= 16:
        config = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}
    elif per_expert <= 48:
        config = {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8}
    else:
        config = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8}
    config["BLOCK_SIZE_K"] = min(config["BLOCK_SIZE_K"], max(32, pow2_at_least(min(hidden, inter))))
    config.update({"GEMV": 0, "SPLIT_K": 1, "SPLIT_K_UP": 1, "num_warps": 4,
                   "num_stages": 2 if hip else 3})
    if hip:
        config.update({"waves_per_eu": 0, "matrix_instr_nonkdim": 16, "kpack": 1})
    return config


# ----------------------------------------------------------------------------------- baselines
@functools.lru_cache(maxsize=None)
def _grouped_mm_on(device_type: str, index: int | None) -> bool:
    if not hasattr(torch, "_grouped_mm"):
        return False
    if device_type == "cpu":
        return True
    if device_type != "cuda" or torch.version.hip:
        return False
    return torch.cuda.get_device_capability(index) >= (9, 0)


def grouped_mm_available(device) -> bool:
    """Whether torch's grouped matmul runs here: torch has ``_grouped_mm`` and the device is the
    CPU or a CUDA GPU of sm90 or newer (ROCm builds are left to the loop)."""
    device = torch.device(device)
    return _grouped_mm_on(device.type, device.index)


def grouped_baseline(inputs: dict) -> torch.Tensor:
    """Pairs sorted by expert, torch._grouped_mm for the up and the down projection, silu · up in
    fp32 rounded to the dtype, weights applied in fp32, the topk outputs summed in fp32."""
    x, w1, w2 = inputs["x"], inputs["w1"], inputs["w2"]
    ids, weights = inputs["topk_ids"], inputs["topk_weights"]
    m, topk = ids.shape
    experts, inter = w1.shape[0], w1.shape[1] // 2
    flat = ids.reshape(-1).to(torch.int64)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(experts, dtype=torch.int64, device=x.device).scatter_add_(
        0, flat, torch.ones_like(flat))
    offs = torch.cumsum(counts, 0).to(torch.int32)
    h = torch._grouped_mm(x[order // topk], w1.transpose(1, 2), offs=offs)
    act = (F.silu(h[:, :inter].float()) * h[:, inter:].float()).to(x.dtype)
    y = torch._grouped_mm(act, w2.transpose(1, 2), offs=offs).float()
    y = y * weights.reshape(-1)[order][:, None]
    unsorted = torch.empty_like(y)
    unsorted[order] = y
    return unsorted.view(m, topk, -1).sum(1).to(x.dtype)


def loop_baseline(inputs: dict) -> torch.Tensor:
    """A per-expert torch loop over every expert (F.linear, bf16), each token's output scaled by
    its dense routing weight (0 where the expert was not picked): fixed shapes, no host sync."""
    x, w1, w2 = inputs["x"], inputs["w1"], inputs["w2"]
    ids, weights = inputs["topk_ids"], inputs["topk_weights"]
    experts, inter = w1.shape[0], w1.shape[1] // 2
    dense = torch.zeros(x.shape[0], experts, dtype=torch.float32, device=x.device)
    dense.scatter_(1, ids.to(torch.int64), weights)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in range(experts):
        h = F.linear(x, w1[e])
        act = (F.silu(h[:, :inter].float()) * h[:, inter:].float()).to(x.dtype)
        out += F.linear(act, w2[e]).float() * dense[:, e:e + 1]
    return out.to(x.dtype)


def dense_baseline(inputs: dict) -> torch.Tensor:
    """One expert, top-1, routing weight 1 (a dense decoder layer's gated MLP, read as the family
    at experts 1 by tuner.harvest.mlp): what transformers' Llama / Qwen3 MLP runs,
    down(silu(gate(x)) * up(x)) with three F.linear calls on the gate rows, the up rows and w2,
    in the weights' dtype. The routing weight is not applied (it is 1 by the shape's meaning;
    make_inputs gives ones at experts 1)."""
    x, w1, w2 = inputs["x"], inputs["w1"], inputs["w2"]
    inter = w1.shape[1] // 2
    return F.linear(F.silu(F.linear(x, w1[0, :inter])) * F.linear(x, w1[0, inter:]), w2[0])


def dense_mlp(shape: dict) -> bool:
    """Whether a shape is a dense gated MLP (experts 1, top-k 1): `dense_baseline`'s."""
    return int(shape["experts"]) == 1 and int(shape["topk"]) == 1


def baseline(inputs: dict) -> torch.Tensor:
    """A dense gated MLP (experts 1, top-k 1): `dense_baseline`; else the grouped-matmul path
    where torch has it on this device, else the per-expert loop."""
    if inputs["w1"].shape[0] == 1 and inputs["topk_ids"].shape[1] == 1:  # `dense_mlp`
        return dense_baseline(inputs)
    if grouped_mm_available(inputs["x"].device):
        return grouped_baseline(inputs)
    return loop_baseline(inputs)


def reference(inputs: dict) -> torch.Tensor:
    """fp32 throughout (no rounding of the intermediate), one expert at a time."""
    x, w1, w2 = inputs["x"].float(), inputs["w1"], inputs["w2"]
    ids, weights = inputs["topk_ids"].to(torch.int64), inputs["topk_weights"].float()
    inter = w1.shape[1] // 2
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in torch.unique(ids).tolist():
        token, slot = torch.nonzero(ids == e, as_tuple=True)
        h = x[token] @ w1[e].float().t()
        y = (F.silu(h[:, :inter]) * h[:, inter:]) @ w2[e].float().t()
        out.index_add_(0, token, y * weights[token, slot][:, None])
    return out


# ----------------------------------------------------------------------------------- cost, rows
def _cost(shape: dict) -> tuple[int, int]:
    m, experts, topk, hidden, inter = _dims(shape)
    return moe_cost(m=m, experts=experts, topk=topk, hidden=hidden, inter=inter,
                    elem_bytes=dtype_bytes(shape.get("dtype", "bfloat16")))


def bytes_moved(shape: dict) -> int:
    return _cost(shape)[0]


def flops(shape: dict) -> int:
    return _cost(shape)[1]


def shape_from_row(row) -> dict | None:
    """A ShapeTable row of family moe (tuner.harvest.moe: m tokens, n = inter, k = hidden, and the
    experts / topk columns) to a shape dict; None for any other row."""
    if row_value(row, "family") != "moe":
        return None
    dtype = row_value(row, "dtype")
    if dtype not in DTYPES:
        return None
    try:
        shape = {"m": int(row_value(row, "m", 0)), "experts": int(row_value(row, "experts", 0)),
                 "topk": int(row_value(row, "topk", 0)), "hidden": int(row_value(row, "k", 0)),
                 "inter": int(row_value(row, "n", 0)), "dtype": dtype}
    except (TypeError, ValueError):
        return None
    if min(v for k, v in shape.items() if k != "dtype") <= 0 or shape["topk"] > shape["experts"]:
        return None
    return shape


def shape_key(shape: dict) -> str:
    return format_shape_key(shape, ("m", "experts", "topk", "hidden", "inter", "dtype"))


FAMILY = KernelFamily(
    name="moe",
    make_inputs=make_inputs,
    launch=launch,
    launch_plan=launch_plan,
    default_config=default_config,
    baseline=baseline,
    reference=reference,
    bytes_moved=bytes_moved,
    flops=flops,
    shape_from_row=shape_from_row,
    shape_key=shape_key,
    source_files=(Path(__file__).resolve(), *COMMON_SOURCES),
)
