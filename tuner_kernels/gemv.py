"""Decode GEMV: y[m, n] = x[m, k] · W[n, k]ᵀ for m = 1..8, bf16/fp16 in and out, fp32 accumulation.

One program owns ROWS_PER_BLOCK rows of W and one of SPLIT_K slices of k. Each loop step loads a
ROWS_PER_BLOCK × BLOCK_K tile of W once (contiguous along k, so loads are wide and coalesced) and
multiplies it by each of the m rows of x (small, served from L1/L2). Each x row has its own
[ROWS_PER_BLOCK, BLOCK_K] fp32 accumulator (m is a compile-time constant, 1..8, so unused
accumulators vanish); the k reduction happens once, after the loop. Rows beyond n are clamped for
the loads (no row mask on the hot path) and masked on the store; a ragged k is masked only when
the SPLIT_K slices of whole BLOCK_Ks do not tile k exactly (EVEN_K).

SPLIT_K > 1 writes fp32 partials to a workspace [SPLIT_K, m, n] and a second kernel sums them in a
fixed order: no atomics, so the output is bit-reproducible run to run.

num_stages of the FMA kernel is how many W tiles a thread has in flight: 1 the plain loop, 2 a
register double buffer (the next step's W tile is loaded before this step's FMAs), 3-4 Triton's
cp.async pipeline through a loop-level num_stages (W and x tiles staged in shared memory). All
three sum in the same order (same output bytes).

USE_DOT picks the kernel: 0 the FMA kernel above; 1 `_gemv_dot_kernel` (x padded to 16 rows,
tl.dot(x, Wᵀ), mma.sync on sm90); 2 the swap-AB skinny kernel of tuner_kernels/skinny.py (W · xᵀ with
the W rows as wgmma's M side, W through TMA stages on sm90; pointer loads on hip), which the gemm
family also uses (SWAP_AB = 1).

The FMA kernel without split-K can carry the RMSNorm before the linear (NORM, `norm_capable`):
y = rmsnorm(x) @ W'ᵀ from the raw x rows, W' = W · diag(norm weight) folded once by the caller
(`fold_norm_weight`, so the kernel reads no more than the plain one), each row's sum of squares
accumulated in the same loop and its 1 / rms applied to the row sums. Its epilogue, and the
split-K reduce, can add a residual [m, n] (HAS_RES, `residual_capable`). tuner.serving folds a
decoder layer's norms into its projections and its residual adds into the projections before
them with these.

Parameters (config dict): ROWS_PER_BLOCK, BLOCK_K, SPLIT_K, USE_DOT, num_warps, num_stages, and
on hip waves_per_eu. The baseline is torch.nn.functional.linear (cuBLAS / hipBLASLt); the
reference is fp32 (x.float() @ W.float().T).
"""

from __future__ import annotations

from pathlib import Path

import torch
import triton
import triton.language as tl

from tuner_kernels import COMMON_SOURCES, KernelFamily, format_shape_key, skinny
from tuner_kernels.common import DTYPES, KernelCall, cdiv, interpreting, launch_options, tensor_backend
from tuner_kernels.common import sm_count as common_sm_count
from tuner_kernels.cost import gemm_cost

__all__ = ["DOT_ROWS", "FAMILY", "HIP_OPTIONS", "KERNEL_PARAMS", "LAUNCH_OPTIONS", "MAX_M",
           "OPTIONAL_PARAMS", "REDUCE_BLOCK_N", "SKINNY_SOURCE", "baseline", "bytes_moved",
           "check_config", "default_config", "flops", "gemv", "k_per_split", "launch",
           "launch_plan", "make_inputs", "norm_capable", "fold_norm_weight", "reference",
           "residual_capable", "rms_norm", "shape_from_row", "shape_key"]

MAX_M = 8
KERNEL_PARAMS = ("ROWS_PER_BLOCK", "BLOCK_K", "SPLIT_K")
OPTIONAL_PARAMS = ("USE_DOT", "BALANCE_N")  # USE_DOT 0 (default): FMA + row sums; 1: tl.dot
# variant; 2: skinny. BALANCE_N 1: the skinny kernel's balanced rows (tuner_kernels/skinny.py)
LAUNCH_OPTIONS = ("num_warps", "num_stages")
HIP_OPTIONS = ("waves_per_eu",)
REDUCE_BLOCK_N = 1024
DOT_ROWS = 16  # x rows of the dot variants, padded (tl.dot needs >= 16)
SKINNY_SOURCE = Path(skinny.__file__).resolve()


# --------------------------------------------------------------------------------------- kernels
@triton.jit
def _gemv_kernel(x_ptr, w_ptr, out_ptr, part_ptr, bias_ptr, res_ptr, N, K, k_per_split, eps,
                 stride_xm, stride_wn, stride_om, stride_rm,
                 M: tl.constexpr, ROWS_PER_BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
                 SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr,
                 STATIC_KPS: tl.constexpr = 0, PIPE_STAGES: tl.constexpr = 1,
                 W_PREFETCH: tl.constexpr = 0, X_CACHE: tl.constexpr = "", NORM: tl.constexpr = 0,
                 HAS_RES: tl.constexpr = 0):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * ROWS_PER_BLOCK + tl.arange(0, ROWS_PER_BLOCK)
    n_mask = rows < N
    rows_safe = tl.minimum(rows, N - 1)  # clamped: the W loads need no row mask
    offs = tl.arange(0, BLOCK_K)
    k_start = pid_k * k_per_split
    w_rows = w_ptr + rows_safe.to(tl.int64)[:, None] * stride_wn
    zero_rows = tl.zeros([ROWS_PER_BLOCK], dtype=tl.int32)

    acc0 = tl.zeros([ROWS_PER_BLOCK, BLOCK_K], dtype=tl.float32)
    acc1 = tl.zeros([ROWS_PER_BLOCK, BLOCK_K], dtype=tl.float32)
    acc2 = tl.zeros([ROWS_PER_BLOCK, BLOCK_K], dtype=tl.float32)
    acc3 = tl.zeros([ROWS_PER_BLOCK, BLOCK_K], dtype=tl.float32)
    acc4 = tl.zeros([ROWS_PER_BLOCK, BLOCK_K], dtype=tl.float32)
    acc5 = tl.zeros([ROWS_PER_BLOCK, BLOCK_K], dtype=tl.float32)
    acc6 = tl.zeros([ROWS_PER_BLOCK, BLOCK_K], dtype=tl.float32)
    acc7 = tl.zeros([ROWS_PER_BLOCK, BLOCK_K], dtype=tl.float32)
    # NORM: the x rows' sums of squares (the RMSNorm prologue; every row of these tiles holds the
    # same x values, so each row sums to the whole x row's)
    ss0 = tl.zeros([ROWS_PER_BLOCK, BLOCK_K], dtype=tl.float32)
    ss1 = tl.zeros([ROWS_PER_BLOCK, BLOCK_K], dtype=tl.float32)
    ss2 = tl.zeros([ROWS_PER_BLOCK, BLOCK_K], dtype=tl.float32)
    ss3 = tl.zeros([ROWS_PER_BLOCK, BLOCK_K], dtype=tl.float32)
    ss4 = tl.zeros([ROWS_PER_BLOCK, BLOCK_K], dtype=tl.float32)
    ss5 = tl.zeros([ROWS_PER_BLOCK, BLOCK_K], dtype=tl.float32)
    ss6 = tl.zeros([ROWS_PER_BLOCK, BLOCK_K], dtype=tl.float32)
    ss7 = tl.zeros([ROWS_PER_BLOCK, BLOCK_K], dtype=tl.float32)
    # STATIC_KPS is 0 on a GPU (runtime trip count, one compile for every k); the CPU interpreter
    # passes k_per_split as a constant because it cannot loop to a runtime bound with numpy >= 2.4.
    # How many W tiles are in flight (the config's num_stages, mapped by launch_plan):
    # - 1: the plain loop: each thread's W load of a step waits before that step's FMAs.
    # - W_PREFETCH (num_stages 2): a register double buffer: the next step's W tile is loaded at
    #   the top of this step, before this step's FMAs wait for theirs (x stays an L1 load).
    # - PIPE_STAGES > 1 (num_stages 3, 4): Triton's pipeliner on this loop although its loads feed
    #   no tl.dot (a loop-level num_stages does that, Triton 3.6 and 3.9): the W and x tiles of
    #   the next PIPE_STAGES - 1 steps stream into shared memory with cp.async (x with the L1
    #   hint X_CACHE=".ca", which Triton 3.9 keeps and 3.6 drops: there x comes from L2).
    kps_loop = k_per_split if STATIC_KPS == 0 else STATIC_KPS
    if W_PREFETCH:
        k_first = k_start + offs
        w_next = tl.load(w_rows + k_first[None, :],
                         mask=None if EVEN_K else zero_rows[:, None] + k_first[None, :] < K,
                         other=None if EVEN_K else 0.0, eviction_policy="evict_first")
    for k0 in tl.range(0, kps_loop, BLOCK_K, num_stages=PIPE_STAGES):
        offs_k = k_start + k0 + offs
        # x rows are loaded through a [R, BK] pointer tensor that repeats the row (zero offsets
        # along the rows): the loads get the W tile's register layout, each thread reads only
        # the x elements it multiplies (L1 hits), and no shared-memory layout conversion sits
        # in the loop. (No helper @jit functions here: the interpreter does not undo its
        # patches of triton.language after a helper call, which breaks later real compiles.)
        offs_2d = zero_rows[:, None] + offs_k[None, :]
        if EVEN_K:
            k_mask = None
            k_other = None
        else:
            k_mask = offs_2d < K
            k_other = 0.0
        if W_PREFETCH:
            w = w_next.to(tl.float32)
            # the next step's tile (none after the slice's last step: the mask stops the load)
            offs_next = offs_2d + BLOCK_K
            next_ok = offs_next < k_start + kps_loop
            if not EVEN_K:
                next_ok = next_ok & (offs_next < K)
            w_next = tl.load(w_rows + offs_k[None, :] + BLOCK_K, mask=next_ok, other=0.0,
                             eviction_policy="evict_first")
        else:
            w = tl.load(w_rows + offs_k[None, :], mask=k_mask, other=k_other,
                        eviction_policy="evict_first").to(tl.float32)
        x0 = tl.load(x_ptr + offs_2d, mask=k_mask, other=k_other,
                     cache_modifier=X_CACHE).to(tl.float32)
        if NORM:
            ss0 += x0 * x0
        acc0 += w * x0
        if M > 1:
            x1 = tl.load(x_ptr + 1 * stride_xm + offs_2d, mask=k_mask, other=k_other,
                         cache_modifier=X_CACHE).to(tl.float32)
            if NORM:
                ss1 += x1 * x1
            acc1 += w * x1
        if M > 2:
            x2 = tl.load(x_ptr + 2 * stride_xm + offs_2d, mask=k_mask, other=k_other,
                         cache_modifier=X_CACHE).to(tl.float32)
            if NORM:
                ss2 += x2 * x2
            acc2 += w * x2
        if M > 3:
            x3 = tl.load(x_ptr + 3 * stride_xm + offs_2d, mask=k_mask, other=k_other,
                         cache_modifier=X_CACHE).to(tl.float32)
            if NORM:
                ss3 += x3 * x3
            acc3 += w * x3
        if M > 4:
            x4 = tl.load(x_ptr + 4 * stride_xm + offs_2d, mask=k_mask, other=k_other,
                         cache_modifier=X_CACHE).to(tl.float32)
            if NORM:
                ss4 += x4 * x4
            acc4 += w * x4
        if M > 5:
            x5 = tl.load(x_ptr + 5 * stride_xm + offs_2d, mask=k_mask, other=k_other,
                         cache_modifier=X_CACHE).to(tl.float32)
            if NORM:
                ss5 += x5 * x5
            acc5 += w * x5
        if M > 6:
            x6 = tl.load(x_ptr + 6 * stride_xm + offs_2d, mask=k_mask, other=k_other,
                         cache_modifier=X_CACHE).to(tl.float32)
            if NORM:
                ss6 += x6 * x6
            acc6 += w * x6
        if M > 7:
            x7 = tl.load(x_ptr + 7 * stride_xm + offs_2d, mask=k_mask, other=k_other,
                         cache_modifier=X_CACHE).to(tl.float32)
            if NORM:
                ss7 += x7 * x7
            acc7 += w * x7

    if SPLIT_K == 1:
        base = out_ptr
        stride = stride_om
    else:
        base = part_ptr + pid_k * M * N  # fp32 workspace [SPLIT_K, M, N]
        stride = N
    # the bias and (HAS_RES) the residual rows join in the epilogue (fp32, before the cast);
    # with split-K the reduce adds them
    bias = tl.zeros([ROWS_PER_BLOCK], dtype=tl.float32)
    if HAS_BIAS and SPLIT_K == 1:
        bias = tl.load(bias_ptr + rows_safe).to(tl.float32)
    # row sums over k (NORM: times each x row's 1 / rms, the norm's scale, which factors out of
    # the sum; its weight is folded into W by the caller), cast to the destination (out dtype,
    # or the fp32 workspace)
    ty = base.dtype.element_ty
    if NORM:  # one reduction of both sums
        y0, s0 = tl.split(tl.sum(tl.join(acc0, ss0), axis=1))
        y0 = y0 * tl.rsqrt(s0 / K + eps)
    else:
        y0 = tl.sum(acc0, axis=1)
    if HAS_RES and SPLIT_K == 1:
        y0 += tl.load(res_ptr + 0 * stride_rm + rows, mask=n_mask).to(tl.float32)
    tl.store(base + rows, (y0 + bias).to(ty), mask=n_mask)
    if M > 1:
        if NORM:  # one reduction of both sums
            y1, s1 = tl.split(tl.sum(tl.join(acc1, ss1), axis=1))
            y1 = y1 * tl.rsqrt(s1 / K + eps)
        else:
            y1 = tl.sum(acc1, axis=1)
        if HAS_RES and SPLIT_K == 1:
            y1 += tl.load(res_ptr + 1 * stride_rm + rows, mask=n_mask).to(tl.float32)
        tl.store(base + 1 * stride + rows, (y1 + bias).to(ty), mask=n_mask)
    if M > 2:
        if NORM:  # one reduction of both sums
            y2, s2 = tl.split(tl.sum(tl.join(acc2, ss2), axis=1))
            y2 = y2 * tl.rsqrt(s2 / K + eps)
        else:
            y2 = tl.sum(acc2, axis=1)
        if HAS_RES and SPLIT_K == 1:
            y2 += tl.load(res_ptr + 2 * stride_rm + rows, mask=n_mask).to(tl.float32)
        tl.store(base + 2 * stride + rows, (y2 + bias).to(ty), mask=n_mask)
    if M > 3:
        if NORM:  # one reduction of both sums
            y3, s3 = tl.split(tl.sum(tl.join(acc3, ss3), axis=1))
            y3 = y3 * tl.rsqrt(s3 / K + eps)
        else:
            y3 = tl.sum(acc3, axis=1)
        if HAS_RES and SPLIT_K == 1:
            y3 += tl.load(res_ptr + 3 * stride_rm + rows, mask=n_mask).to(tl.float32)
        tl.store(base + 3 * stride + rows, (y3 + bias).to(ty), mask=n_mask)
    if M > 4:
        if NORM:  # one reduction of both sums
            y4, s4 = tl.split(tl.sum(tl.join(acc4, ss4), axis=1))
            y4 = y4 * tl.rsqrt(s4 / K + eps)
        else:
            y4 = tl.sum(acc4, axis=1)
        if HAS_RES and SPLIT_K == 1:
            y4 += tl.load(res_ptr + 4 * stride_rm + rows, mask=n_mask).to(tl.float32)
        tl.store(base + 4 * stride + rows, (y4 + bias).to(ty), mask=n_mask)
    if M > 5:
        if NORM:  # one reduction of both sums
            y5, s5 = tl.split(tl.sum(tl.join(acc5, ss5), axis=1))
            y5 = y5 * tl.rsqrt(s5 / K + eps)
        else:
            y5 = tl.sum(acc5, axis=1)
        if HAS_RES and SPLIT_K == 1:
            y5 += tl.load(res_ptr + 5 * stride_rm + rows, mask=n_mask).to(tl.float32)
        tl.store(base + 5 * stride + rows, (y5 + bias).to(ty), mask=n_mask)
    if M > 6:
        if NORM:  # one reduction of both sums
            y6, s6 = tl.split(tl.sum(tl.join(acc6, ss6), axis=1))
            y6 = y6 * tl.rsqrt(s6 / K + eps)
        else:
            y6 = tl.sum(acc6, axis=1)
        if HAS_RES and SPLIT_K == 1:
            y6 += tl.load(res_ptr + 6 * stride_rm + rows, mask=n_mask).to(tl.float32)
        tl.store(base + 6 * stride + rows, (y6 + bias).to(ty), mask=n_mask)
    if M > 7:
        if NORM:  # one reduction of both sums
            y7, s7 = tl.split(tl.sum(tl.join(acc7, ss7), axis=1))
            y7 = y7 * tl.rsqrt(s7 / K + eps)
        else:
            y7 = tl.sum(acc7, axis=1)
        if HAS_RES and SPLIT_K == 1:
            y7 += tl.load(res_ptr + 7 * stride_rm + rows, mask=n_mask).to(tl.float32)
        tl.store(base + 7 * stride + rows, (y7 + bias).to(ty), mask=n_mask)


@triton.jit
def _gemv_dot_kernel(x_ptr, w_ptr, out_ptr, part_ptr, bias_ptr, N, K, k_per_split,
                     stride_xm, stride_wn, stride_om,
                     M: tl.constexpr, ROWS_PER_BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
                     SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr,
                     STATIC_KPS: tl.constexpr = 0):
    """USE_DOT=1 variant: x padded to 16 rows (masked) times the W tile with tl.dot (tensor
    cores / MFMA, fp32 accumulation). Its W loads feed a dot, so Triton's software pipeliner
    (num_stages) overlaps the next tiles' loads with this one's math. ROWS_PER_BLOCK >= 16."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * ROWS_PER_BLOCK + tl.arange(0, ROWS_PER_BLOCK)
    n_mask = rows < N
    rows_safe = tl.minimum(rows, N - 1)
    offs = tl.arange(0, BLOCK_K)
    offs_m = tl.arange(0, 16)
    m_mask = offs_m[:, None] < M
    k_start = pid_k * k_per_split
    w_rows = w_ptr + rows_safe.to(tl.int64)[:, None] * stride_wn
    x_rows = x_ptr + offs_m[:, None] * stride_xm
    acc = tl.zeros([16, ROWS_PER_BLOCK], dtype=tl.float32)
    for k0 in range(0, k_per_split if STATIC_KPS == 0 else STATIC_KPS, BLOCK_K):
        offs_k = k_start + k0 + offs
        if EVEN_K:
            w = tl.load(w_rows + offs_k[None, :], eviction_policy="evict_first")
            x = tl.load(x_rows + offs_k[None, :], mask=m_mask, other=0.0)
        else:
            k_ok = offs_k[None, :] < K
            w = tl.load(w_rows + offs_k[None, :], mask=k_ok, other=0.0,
                        eviction_policy="evict_first")
            x = tl.load(x_rows + offs_k[None, :], mask=m_mask & k_ok, other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
    if SPLIT_K == 1:
        base = out_ptr
        stride = stride_om
    else:
        base = part_ptr + pid_k * M * N
        stride = N
    if HAS_BIAS and SPLIT_K == 1:
        acc += tl.load(bias_ptr + rows_safe).to(tl.float32)[None, :]
    ptrs = base + offs_m[:, None] * stride + rows[None, :]
    tl.store(ptrs, acc.to(base.dtype.element_ty), mask=m_mask & n_mask[None, :])


@triton.jit
def _splitk_reduce_kernel(part_ptr, out_ptr, bias_ptr, res_ptr, N, stride_om, stride_rm,
                          M: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr,
                          HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr = 0):
    """out[m, n] = sum over s = 0..SPLIT_K-1 of part[s, m, n], always in that order (+ bias,
    + residual[m, n])."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = offs < N
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(part_ptr + (s * M + pid_m) * N + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        acc += tl.load(res_ptr + pid_m * stride_rm + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid_m * stride_om + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------------- host side
def k_per_split(k: int, block_k: int, split_k: int) -> int:
    """Length of each split-k slice: a multiple of BLOCK_K."""
    return cdiv(cdiv(k, split_k), block_k) * block_k


def check_config(config: dict) -> None:
    """Raise ValueError for missing or unknown keys (a config from the wrong space, a typo)."""
    allowed = set(KERNEL_PARAMS) | set(OPTIONAL_PARAMS) | set(LAUNCH_OPTIONS) | set(HIP_OPTIONS)
    unknown = set(config) - allowed
    if unknown:
        raise ValueError(f"gemv config has unknown keys: {', '.join(sorted(unknown))}")
    missing = [p for p in KERNEL_PARAMS if p not in config]
    if missing:
        raise ValueError(f"gemv config lacks: {', '.join(missing)}")
    for p in ("ROWS_PER_BLOCK", "BLOCK_K"):
        v = int(config[p])
        if v < 1 or v & (v - 1):
            raise ValueError(f"gemv {p} must be a power of two, got {v}")
    if int(config["SPLIT_K"]) < 1:
        raise ValueError("gemv SPLIT_K must be >= 1")
    use_dot = int(config.get("USE_DOT", 0))
    if use_dot not in (0, 1, 2):
        raise ValueError(f"gemv USE_DOT must be 0, 1 or 2, got {use_dot}")
    if use_dot and (int(config["ROWS_PER_BLOCK"]) < 16 or int(config["BLOCK_K"]) < 16):
        raise ValueError(f"gemv USE_DOT={use_dot} needs ROWS_PER_BLOCK >= 16 and BLOCK_K >= 16")
    if int(config.get("num_stages", 1)) < 1:
        raise ValueError("gemv num_stages must be >= 1")
    if int(config.get("BALANCE_N", 0)) not in (0, 1) or (int(config.get("BALANCE_N", 0))
                                                         and use_dot != 2):
        raise ValueError("gemv BALANCE_N is 0, or 1 with USE_DOT=2 (the skinny kernel's "
                         "balanced rows)")


def norm_capable(config: dict) -> bool:
    """Whether the config's kernel can carry an RMSNorm prologue (`launch_plan`'s norm_eps):
    the FMA kernel (USE_DOT 0) without split-K, whose programs each see whole x rows."""
    return int(config.get("USE_DOT", 0)) == 0 and int(config.get("SPLIT_K", 1)) == 1


def residual_capable(config: dict) -> bool:
    """Whether the config's launches can add a residual in their epilogue (`launch_plan`'s
    residual): the FMA kernel's, or the split-K reduce of any kernel."""
    return int(config.get("USE_DOT", 0)) == 0 or int(config.get("SPLIT_K", 1)) > 1


def fold_norm_weight(weight: torch.Tensor, norm_weight: torch.Tensor) -> torch.Tensor:
    """W · diag(norm_weight) in W's dtype, rounded once from fp32: the projection weight that
    takes the RMSNorm's weight into it, so the kernel carrying the norm reads no more than the
    plain kernel (linear(rmsnorm(x) * g, W) = linear(rmsnorm(x), W · diag(g)))."""
    return (weight.to(torch.float32) * norm_weight.to(torch.float32)).to(weight.dtype)


def launch_plan(inputs: dict, config: dict, out: torch.Tensor | None = None,
                backend: str | None = None) -> tuple[torch.Tensor, list[KernelCall]]:
    """The output and the kernel calls of y = x @ weight.T (+ bias, fused in the epilogue) for
    inputs {"x": [m, k] (m <= 8), "weight": [n, k] contiguous in k, "bias": [n] or absent};
    works on meta tensors (offline compiles).

    With "norm_eps" (a float) the kernel computes y = rmsnorm(x) @ weight.T (+ bias) from the
    raw x rows, the norm's own weight already folded into `weight` (`fold_norm_weight`): each x
    row's sum of squares accumulates in the same loop as its products with W, and the row's
    1 / sqrt(mean(x²) + eps) scales the row sums at the end (the norm's own launch, and its
    rounding of the normed x to x's dtype, are gone). Only a `norm_capable` config.
    With "residual" [m, n] the epilogue adds it (fp32, before the one rounding): a decoder
    layer's residual add after its o / down projection. Only a `residual_capable` config."""
    check_config(config)
    x, weight, bias = inputs["x"], inputs["weight"], inputs.get("bias")
    norm_eps, residual = inputs.get("norm_eps"), inputs.get("residual")
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"gemv needs x[m, k] and weight[n, k], got {tuple(x.shape)} and "
                         f"{tuple(weight.shape)}")
    m, k = x.shape
    n = weight.shape[0]
    if not 1 <= m <= MAX_M:
        raise ValueError(f"gemv handles m = 1..{MAX_M}, got m={m}")
    if x.stride(1) != 1:
        x = x.contiguous()
    if weight.stride(1) != 1:
        weight = weight.contiguous()
    if bias is not None:
        if bias.shape != (n,):
            raise ValueError(f"gemv bias must be [{n}], got {tuple(bias.shape)}")
        bias = bias.contiguous()
    if norm_eps is not None and not norm_capable(config):
        raise ValueError("gemv's RMSNorm prologue needs USE_DOT 0 and SPLIT_K 1, got "
                         f"USE_DOT {config.get('USE_DOT', 0)}, SPLIT_K {config['SPLIT_K']}")
    if residual is not None:
        if not residual_capable(config):
            raise ValueError("gemv's residual epilogue needs USE_DOT 0 or SPLIT_K > 1, got "
                             f"USE_DOT {config.get('USE_DOT', 0)}, SPLIT_K {config['SPLIT_K']}")
        if residual.shape != (m, n) or residual.dtype != x.dtype:
            raise ValueError(f"gemv residual must be [{m}, {n}] {x.dtype}, got "
                             f"{tuple(residual.shape)} {residual.dtype}")
        if residual.stride(1) != 1:
            residual = residual.contiguous()
    if out is None:
        out = torch.empty((m, n), device=x.device, dtype=x.dtype)
    elif out.shape != (m, n) or out.stride(1) != 1:
        raise ValueError(f"gemv out must be [{m}, {n}] with unit stride, got {tuple(out.shape)}")
    backend = backend or tensor_backend(x)
    if backend == "cuda" and "waves_per_eu" in config:
        raise ValueError("waves_per_eu is an AMD-only option; this is a CUDA device")
    rows = int(config["ROWS_PER_BLOCK"])
    block_k = int(config["BLOCK_K"])
    split_k = int(config["SPLIT_K"])
    kps = k_per_split(k, block_k, split_k)
    part = out
    if split_k > 1:
        part = torch.empty((split_k, m, n), device=x.device, dtype=torch.float32)
    use_dot = int(config.get("USE_DOT", 0))
    has_bias = bias is not None
    if use_dot == 2:  # the swap-AB skinny kernel (tuner_kernels/skinny.py): W is the MMA's M side
        kernel, grid, args, meta, options = skinny.plan(
            weight, x, out, part if split_k > 1 else None, bias, block_n=rows, block_m=DOT_ROWS,
            block_k=block_k, split_k=split_k, use_tma=backend in ("cuda", "cpu"),
            options=launch_options(config, backend), balance=int(config.get("BALANCE_N", 0)) == 1)
        calls = [KernelCall(kernel, grid, args, meta, options)]
        if split_k > 1:
            calls.append(_reduce_call(part, out, bias, m, n, split_k, residual))
        return out, calls
    kernel = _gemv_dot_kernel if use_dot else _gemv_kernel
    bias_arg = bias if has_bias else out  # never read when HAS_BIAS is False
    meta = dict(M=m, ROWS_PER_BLOCK=rows, BLOCK_K=block_k, SPLIT_K=split_k,
                EVEN_K=kps * split_k == k,  # every slice is whole BLOCK_Ks inside k: no k mask
                HAS_BIAS=has_bias, STATIC_KPS=kps if interpreting() else 0)
    strides = (x.stride(0), weight.stride(0), out.stride(0))
    if kernel is _gemv_kernel:  # num_stages: 1 plain, 2 register double buffer, 3+ cp.async
        stages = int(config.get("num_stages", 1))
        meta.update(PIPE_STAGES=stages if stages > 2 else 1, W_PREFETCH=int(stages == 2),
                    X_CACHE=".ca" if stages > 2 else "", NORM=int(norm_eps is not None),
                    HAS_RES=int(residual is not None))
        args = (x, weight, out, part, bias_arg, out if residual is None else residual,
                n, k, kps, 1e-6 if norm_eps is None else float(norm_eps), *strides,
                0 if residual is None else residual.stride(0))
    else:
        args = (x, weight, out, part, bias_arg, n, k, kps, *strides)
    calls = [KernelCall(kernel, (cdiv(n, rows), split_k), args, meta,
                        launch_options(config, backend, num_stages=1))]
    if split_k > 1:
        calls.append(_reduce_call(part, out, bias, m, n, split_k, residual))
    return out, calls


def _reduce_call(part, out, bias, m: int, n: int, split_k: int, residual=None) -> KernelCall:
    """The fixed-order sum of the split-K partials [split_k, m, n] into out (+ bias,
    + residual)."""
    has_bias, has_res = bias is not None, residual is not None
    return KernelCall(_splitk_reduce_kernel, (cdiv(n, REDUCE_BLOCK_N), m),
                      (part, out, bias if has_bias else out, residual if has_res else out, n,
                       out.stride(0), residual.stride(0) if has_res else 0),
                      dict(M=m, SPLIT_K=split_k, BLOCK_N=REDUCE_BLOCK_N, HAS_BIAS=has_bias,
                           HAS_RES=int(has_res)),
                      {"num_warps": 4})


def gemv(x: torch.Tensor, weight: torch.Tensor, config: dict, out: torch.Tensor | None = None,
         bias: torch.Tensor | None = None, norm_eps: float | None = None,
         residual: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ weight.T (+ bias, fused in the epilogue) with the Triton kernel; x [m, k] (m <= 8),
    weight [n, k] contiguous in k, bias [n]. With norm_eps: y = rmsnorm(x, eps) @ weight.T
    (+ bias), the norm carried by the kernel, its weight folded into `weight` by the caller
    (`fold_norm_weight`); with residual [m, n]: + residual in the epilogue (`launch_plan`)."""
    inputs = {"x": x, "weight": weight}
    if bias is not None:
        inputs["bias"] = bias
    if norm_eps is not None:
        inputs["norm_eps"] = norm_eps
    if residual is not None:
        inputs["residual"] = residual
    out, calls = launch_plan(inputs, config, out)
    for call in calls:
        call.run()
    return out


# ------------------------------------------------------------------------------ default config
def _next_pow2(v: int) -> int:
    return 1 << max(0, int(v) - 1).bit_length()


def default_config(shape: dict, backend: str = "cuda", sm_count: int | None = None) -> dict:
    """A sane config without tuning: enough programs to fill the machine, wide loads along k,
    an fp32 accumulator budget of about 64 registers per thread."""
    m, n, k = int(shape["m"]), int(shape["n"]), int(shape["k"])
    sms = sm_count or common_sm_count()
    wave = 64 if backend in ("hip", "dcu") else 32
    num_warps = 4
    threads = wave * num_warps
    target_programs = 4 * sms
    rows = 1
    for r in (8, 4, 2, 1):
        if cdiv(n, r) >= target_programs:
            rows = r
            break
    k_cap = max(64, _next_pow2(k))
    max_block_k = 1024 if backend == "dcu" else 2048  # the dcu space stops at 1024 / 8 rows
    max_rows = 8 if backend == "dcu" else 16
    # fp32 accumulators: m * rows * BLOCK_K values shared by `threads` threads, <= ~64 each
    block_k = 512
    while block_k > 64 and m * rows * block_k > 64 * threads:
        block_k //= 2
    block_k = min(block_k, k_cap)
    # every thread should load at least one 16-byte vector (8 elements) of W per step
    while rows * block_k < 8 * threads:
        if block_k < min(k_cap, max_block_k) and m * rows * block_k * 2 <= 64 * threads:
            block_k *= 2
        elif rows < max_rows and rows * 2 <= n and m * rows * block_k * 2 <= 64 * threads:
            rows *= 2  # short k: more rows per program instead of idle threads
        elif num_warps > 1:
            num_warps //= 2
            threads = wave * num_warps
        else:
            break
    split_k = 1
    programs = cdiv(n, rows)
    if programs < target_programs:
        want = cdiv(target_programs, programs)
        max_split = max(1, k // (2 * block_k))  # keep at least two loop steps per slice
        split_k = 1
        while split_k * 2 <= min(want, max_split, 16) or (split_k < want and split_k * 2 <= max_split
                                                          and split_k * 2 <= 16):
            split_k *= 2
    # num_stages 1: Triton does not pipeline this loop (no tl.dot), see search_spaces/gemv.yaml
    config = {"ROWS_PER_BLOCK": rows, "BLOCK_K": block_k, "SPLIT_K": split_k,
              "num_warps": num_warps, "USE_DOT": 0, "num_stages": 1}
    if m == 1 and backend == "cuda" and n >= 1024 and k >= 2048:
        # One row of W a program, 2048-wide k steps, 8 warps: the H200 sweep's m = 1 winner on
        # every 8B decode shape (scripts/gpu/kernels15.sh, 2026-12-01: 1.05-1.88x torch, 78-99%
        # of the measured read bandwidth; BENCHMARKS.md).
        config = {"ROWS_PER_BLOCK": 1, "BLOCK_K": 2048, "SPLIT_K": 1, "num_warps": 8,
                  "USE_DOT": 0, "num_stages": 1}
    elif m >= 2 and n >= 4096 and k >= 256:
        if backend == "cuda" and k % 8 == 0:
            # The swap-AB skinny kernel (W rows on wgmma's wide side, TMA stages): the H200
            # sweep's m = 4 and 8 winner on most 8B shapes (1.02-1.18x torch, BENCHMARKS.md).
            config = {"ROWS_PER_BLOCK": 64, "BLOCK_K": 256, "SPLIT_K": 1, "num_warps": 4,
                      "USE_DOT": 2, "num_stages": 4}
        else:
            # Several x rows on a wide n: the tl.dot variant with pipelined W loads (the FMA
            # variant re-reads x for every W element, m times per step).
            config = {"ROWS_PER_BLOCK": 32, "BLOCK_K": 128, "SPLIT_K": 1, "num_warps": 4,
                      "USE_DOT": 1, "num_stages": 2 if backend in ("hip", "dcu") else 4}
    config["BALANCE_N"] = 0  # the measured winners above; balanced rows are a search knob
    if backend in ("hip", "dcu"):
        config["waves_per_eu"] = 0
    return config


# ------------------------------------------------------------------------------------- family
def make_inputs(shape: dict, device="cpu", seed: int = 0) -> dict:
    """x[m, k] and weight[n, k] with values ~ N(0, 1) / sqrt-scaled W (never zeros); with
    shape["bias"] also bias[n] (the addmm rows of a trace: q/k/v projections with bias); with
    shape["norm"] also norm_weight[k] ~ 1 + N(0, 0.1), eps 1e-6 and folded_weight (W with the
    norm weight folded in, `fold_norm_weight`: the RMSNorm prologue tuner.serving folds into the
    kernel); with shape["residual"] also residual[m, n] ~ N(0, 1) (the residual add the kernel's
    epilogue takes). Neither is a trace shape's: tests, offline compiles and
    scripts/gpu/norm_gemv_bench.py. device="meta": shapes only (offline compiles)."""
    m, n, k = int(shape["m"]), int(shape["n"]), int(shape["k"])
    dtype = DTYPES[str(shape.get("dtype", "bfloat16"))]
    dims = {"x": (m, k), "weight": (n, k)}
    if shape.get("bias"):
        dims["bias"] = (n,)
    if shape.get("norm"):
        dims.update(norm_weight=(k,), folded_weight=(n, k))
    if shape.get("residual"):
        dims["residual"] = (m, n)
    if torch.device(device).type == "meta":
        inputs = {name: torch.empty(size, dtype=dtype, device="meta")
                  for name, size in dims.items()}
        return dict(inputs, eps=1e-6) if shape.get("norm") else inputs
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    x = torch.randn(dims["x"], generator=gen, device=device, dtype=torch.float32).to(dtype)
    weight = (torch.randn(dims["weight"], generator=gen, device=device, dtype=torch.float32)
              / (k ** 0.5)).to(dtype)
    inputs = {"x": x, "weight": weight}
    if "bias" in dims:
        inputs["bias"] = torch.randn((n,), generator=gen, device=device,
                                     dtype=torch.float32).to(dtype)
    if "norm_weight" in dims:
        inputs["norm_weight"] = (1 + 0.1 * torch.randn((k,), generator=gen, device=device,
                                                       dtype=torch.float32)).to(dtype)
        inputs["eps"] = 1e-6
        inputs["folded_weight"] = fold_norm_weight(weight, inputs["norm_weight"])
    if "residual" in dims:
        inputs["residual"] = torch.randn(dims["residual"], generator=gen, device=device,
                                         dtype=torch.float32).to(dtype)
    return inputs


def launch(inputs: dict, config: dict, out: torch.Tensor | None = None) -> torch.Tensor:
    """The kernel on `make_inputs`' inputs: with a norm, on the folded weight."""
    normed = inputs.get("norm_weight") is not None
    return gemv(inputs["x"], inputs["folded_weight"] if normed else inputs["weight"], config,
                out=out, bias=inputs.get("bias"),
                norm_eps=inputs.get("eps", 1e-6) if normed else None,
                residual=inputs.get("residual"))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm (Llama, Mistral, Qwen2/3), operation for operation: the mean of
    squares in fp32, the normed x cast back to x's dtype, then times the weight."""
    normed = x.to(torch.float32)
    normed = normed * torch.rsqrt(normed.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def _rms_normed(x: torch.Tensor, inputs: dict) -> torch.Tensor:
    """x through the inputs' RMSNorm, if they have one (the reference: in fp32 throughout)."""
    if inputs.get("norm_weight") is None:
        return x
    return rms_norm(x, inputs["norm_weight"].to(x.dtype), inputs.get("eps", 1e-6))


def baseline(inputs: dict) -> torch.Tensor:
    """The layer's own path: the norm (if any), torch's linear, then the residual add (if any)."""
    out = torch.nn.functional.linear(_rms_normed(inputs["x"], inputs), inputs["weight"],
                                     inputs.get("bias"))
    return out if inputs.get("residual") is None else inputs["residual"] + out


def reference(inputs: dict) -> torch.Tensor:
    out = _rms_normed(inputs["x"].float(), inputs) @ inputs["weight"].float().T
    if inputs.get("bias") is not None:
        out = out + inputs["bias"].float()
    if inputs.get("residual") is not None:
        out = out + inputs["residual"].float()
    return out


def _elem_bytes(shape: dict) -> int:
    return torch.empty((), dtype=DTYPES[str(shape.get("dtype", "bfloat16"))]).element_size()


def _cost(shape: dict) -> tuple[int, int]:
    return gemm_cost(int(shape["m"]), int(shape["n"]), int(shape["k"]),
                     elem_bytes=_elem_bytes(shape), bias=bool(shape.get("bias")))


def bytes_moved(shape: dict) -> int:
    return _cost(shape)[0]


def flops(shape: dict) -> int:
    return _cost(shape)[1]


def shape_from_row(row) -> dict | None:
    """GEMM rows of a ShapeTable with m <= 8 and batch == 1 (decode linears); an addmm row or
    a row with bias = 1 (a linear given a bias) gets "bias": 1, so it is measured as it is
    called."""
    get = row.get if hasattr(row, "get") else (lambda key, default=None: getattr(row, key, default))
    if str(get("family", "")) != "gemm":
        return None
    try:
        m, n, k = int(get("m")), int(get("n")), int(get("k"))
        batch = int(get("batch", 1) if get("batch", 1) is not None else 1)
    except (TypeError, ValueError):
        return None
    dtype = str(get("dtype", "bfloat16"))
    if not 1 <= m <= MAX_M or batch != 1 or dtype not in DTYPES or n < 1 or k < 1:
        return None
    shape = {"m": m, "n": n, "k": k, "dtype": dtype}
    try:
        given_bias = int(get("bias", 0) or 0)  # a linear op the row says was given a bias
    except (TypeError, ValueError):  # a missing cell (NA, NaN)
        given_bias = 0
    if str(get("op", "")).endswith("addmm") or given_bias:
        shape["bias"] = 1
    return shape


def shape_key(shape: dict) -> str:
    return format_shape_key({k: v for k, v in shape.items() if k != "bias" or v},
                            ("m", "n", "k", "dtype", "bias"))


FAMILY = KernelFamily(
    name="gemv",
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
    source_files=(Path(__file__).resolve(), SKINNY_SOURCE, *COMMON_SOURCES),
)
