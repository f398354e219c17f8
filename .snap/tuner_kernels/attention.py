"""Decode attention family: one new query token per sequence over a KV cache, with GQA.

q ``[batch, heads, head_dim]``, k / v cache ``[batch, kv_heads, kv_len, head_dim]`` (contiguous),
out ``[batch, heads, head_dim]``; query head h reads KV head ``h // (heads // kv_heads)``.

Head stacking: the HEADS_PER_BLOCK query heads that share one KV head go into the M dimension of
one ``tl.dot`` (padded to BLOCK_H = max(16, next power of two), as tl.dot needs M >= 16), so a
K / V tile is read once per KV head and HEADS_PER_BLOCK query heads, not once per query head.
HEADS_PER_BLOCK = 1 is plain per-head decode (each program reads the whole KV of its head).

SPLIT_KV (flash-decoding): the KV length is cut into SPLIT_KV partitions handled by separate
programs, each writing fp32 partials (running max m, sum l, unnormalised acc); a second kernel
combines them in a fixed order, so results are deterministic.

Parameters (search_spaces/attention.yaml): HEADS_PER_BLOCK, BLOCK_N (KV tile), SPLIT_KV,
num_warps, num_stages; on hip also waves_per_eu, matrix_instr_nonkdim.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import triton
import triton.language as tl

from tuner_kernels import COMMON_SOURCES, KernelFamily, format_shape_key
from tuner_kernels.common import (DTYPES, KernelCall, launch_options, pow2_at_least,
                            row_value, tensor_backend)
from tuner_kernels.cost import attention_cost

__all__ = ["FAMILY", "LOG2E", "baseline", "bytes_moved", "combine_kernel",
           "decode_attention_kernel", "default_config", "flops", "kv_bytes", "launch",
           "launch_plan", "make_inputs", "reference", "shape_from_row", "shape_key"]

LOG2E = 1.4426950408889634
_TORCH_SDPA = torch.nn.functional.scaled_dot_product_attention


@triton.jit
def decode_attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, m_ptr, l_ptr, mask_ptr,
    kv_len, group, tiles_per_split, qk_scale,
    stride_qb, stride_qh,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_os,
    stride_mb, stride_mh,
    stride_xb, stride_xh, stride_xn,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    HEADS_PER_BLOCK: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr, PARTIALS: tl.constexpr, MASK: tl.constexpr = 0,
):
    """grid = (heads // HEADS_PER_BLOCK, batch, number of KV splits).

    PARTIALS false (SPLIT_KV == 1): o is the output [batch, heads, head_dim]. PARTIALS true: o is
    the fp32 partial acc [batch, heads, SPLIT_KV, head_dim] and m / l the fp32 [batch, heads,
    SPLIT_KV] running max (log2 domain) and sum. The split count is a runtime value (grid axis 2),
    so different SPLIT_KV values share one compiled kernel.

    MASK (SDPA's attn_mask, read through strides x: batch, query head, key; 0 for a broadcast
    dimension): 0 none, 1 boolean (True: attend), 2 additive (added to the scaled scores).
    """
    head_block = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)

    first_head = head_block * HEADS_PER_BLOCK
    kv_head = first_head // group
    offs_h = tl.arange(0, BLOCK_H)
    heads = first_head + offs_h
    mask_h = offs_h < HEADS_PER_BLOCK
    offs_d = tl.arange(0, BLOCK_D)
    if BLOCK_D == HEAD_DIM:  # an all-true mask the compiler sees as constant: full-width loads
        mask_d = tl.full((BLOCK_D,), 1, tl.int1)
    else:
        mask_d = offs_d < HEAD_DIM

    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mask_h[:, None] & mask_d[None, :], other=0.0)
    k_base = k_ptr + b * stride_kb + kv_head * stride_kh
    v_base = v_ptr + b * stride_vb + kv_head * stride_vh

    m_i = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_H,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_H, BLOCK_D), dtype=tl.float32)

    n_start = split * tiles_per_split * BLOCK_N
    for i in range(0, tiles_per_split):
        offs_n = n_start + i * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = offs_n < kv_len
        k = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :],
                    mask=mask_n[:, None] & mask_d[None, :], other=0.0)
        qk = tl.dot(q, tl.trans(k)) * qk_scale  # [BLOCK_H, BLOCK_N], log2 domain
        if MASK != 0:
            x_ptrs = (mask_ptr + b * stride_xb + heads[:, None] * stride_xh
                      + offs_n[None, :] * stride_xn)
            x_ok = mask_h[:, None] & mask_n[None, :]
            if MASK == 1:
                keep = tl.load(x_ptrs, mask=x_ok, other=0) != 0
                qk = tl.where(keep, qk, float("-inf"))
            else:
                qk += tl.load(x_ptrs, mask=x_ok, other=0.0).to(tl.float32) * 1.4426950408889634
        qk = tl.where(mask_n[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a fully masked tile
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(qk - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :],
                    mask=mask_n[:, None] & mask_d[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    out_mask = mask_h[:, None] & mask_d[None, :]
    if not PARTIALS:
        out = acc / l_i[:, None]
        tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=out_mask)
    else:
        tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + split * stride_os
                 + offs_d[None, :], acc, mask=out_mask)
        tl.store(m_ptr + b * stride_mb + heads * stride_mh + split, m_i, mask=mask_h)
        tl.store(l_ptr + b * stride_mb + heads * stride_mh + split, l_i, mask=mask_h)


@triton.jit
def combine_kernel(
    acc_ptr, m_ptr, l_ptr, o_ptr, num_splits,
    stride_ab, stride_ah, stride_as,
    stride_mb, stride_mh,
    stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """out[b, h] = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s, M = max_s m_s. grid = (heads, batch)."""
    h = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    mask_s = offs_s < num_splits
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    m = tl.load(m_ptr + b * stride_mb + h * stride_mh + offs_s, mask=mask_s, other=float("-inf"))
    l = tl.load(l_ptr + b * stride_mb + h * stride_mh + offs_s, mask=mask_s, other=0.0)
    m_max = tl.max(m, 0)
    w = tl.where(mask_s, tl.exp2(m - m_max), 0.0)
    acc = tl.load(acc_ptr + b * stride_ab + h * stride_ah + offs_s[:, None] * stride_as + offs_d[None, :],
                  mask=mask_s[:, None] & mask_d[None, :], other=0.0)
    out = tl.sum(acc * w[:, None], 0) / tl.sum(l * w, 0)
    tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_d, out.to(o_ptr.dtype.element_ty), mask=mask_d)


# ----------------------------------------------------------------------------------------------
# Shapes and inputs


def _dtype(shape: dict) -> torch.dtype:
    name = shape.get("dtype", "bfloat16")
    if name not in DTYPES:
        raise ValueError(f"attention supports {', '.join(DTYPES)}, not {name!r}")
    return DTYPES[name]


def _dims(shape: dict) -> tuple[int, int, int, int, int]:
    return (int(shape["batch"]), int(shape["heads"]), int(shape["kv_heads"]),
            int(shape["kv_len"]), int(shape["head_dim"]))


def make_inputs(shape: dict, device="cpu", seed: int = 0) -> dict:
    """q [batch, heads, head_dim], k / v [batch, kv_heads, kv_len, head_dim], standard normal;
    with the shape's ``baseline_kv_heads`` (a call traced on a repeated KV cache, not a key
    field: `shape_from_row`) also that count, for `baseline`."""
    batch, heads, kv_heads, kv_len, head_dim = _dims(shape)
    if heads % kv_heads:
        raise ValueError(f"attention: heads {heads} is not a multiple of kv_heads {kv_heads}")
    dtype = _dtype(shape)
    # Drawn on the target device (fast for GB-sized caches); same seed and device, same numbers.
    gen = None if torch.device(device).type == "meta" else torch.Generator(device=device).manual_seed(seed)

    def randn(*dims):
        if torch.device(device).type == "meta":  # shapes and strides only (compile checks)
            return torch.empty(*dims, dtype=dtype, device="meta")
        return torch.randn(*dims, generator=gen, dtype=torch.float32, device=device).to(dtype)

    inputs = {"q": randn(batch, heads, head_dim),
              "k": randn(batch, kv_heads, kv_len, head_dim),
              "v": randn(batch, kv_heads, kv_len, head_dim)}
    repeated = int(shape.get("baseline_kv_heads") or kv_heads)
    if repeated != kv_heads:
        if repeated % kv_heads or heads % repeated:
            raise ValueError(f"attention: baseline_kv_heads {repeated} is not a multiple of "
                             f"kv_heads {kv_heads} dividing heads {heads}")
        inputs["baseline_kv_heads"] = repeated
    return inputs


def launch_plan(inputs: dict, config: dict, out: torch.Tensor | None = None,
                backend: str | None = None) -> tuple[torch.Tensor, list[KernelCall]]:
    """The output tensor and the kernel calls that compute it (no launch); works on 'meta' tensors."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    batch, heads, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != batch or k.shape[3] != head_dim:
        raise ValueError(f"attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not match")
    if heads % kv_heads or kv_len < 1:
        raise ValueError(f"attention: heads {heads}, kv_heads {kv_heads}, kv_len {kv_len}")
    group = heads // kv_heads
    heads_per_block = int(config["HEADS_PER_BLOCK"])
    if group % heads_per_block:
        raise ValueError(f"attention: HEADS_PER_BLOCK {heads_per_block} must divide heads/kv_heads = {group}")
    block_n, split_kv = int(config["BLOCK_N"]), int(config.get("SPLIT_KV", 1))
    if q.stride(2) != 1:
        q = q.contiguous()
    if k.stride(3) != 1 or v.stride(3) != 1:
        raise ValueError("attention: k and v must be contiguous in head_dim")
    if out is None:
        out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    elif tuple(out.shape) != tuple(q.shape) or out.stride(2) != 1:
        raise ValueError(f"attention: out must be a {tuple(q.shape)} tensor, contiguous in head_dim")

    total_tiles = triton.cdiv(kv_len, block_n)
    tiles_per_split = triton.cdiv(total_tiles, split_kv)
    num_splits = triton.cdiv(total_tiles, tiles_per_split)  # every launched split has KV to read
    block_d = pow2_at_least(head_dim)
    scale = inputs.get("scale")
    qk_scale = LOG2E * (float(scale) if scale is not None else 1.0 / math.sqrt(head_dim))
    opts = launch_options(config, backend or tensor_backend(q))
    grid = (heads // heads_per_block, batch, num_splits)
    mask, mask_kind, mask_strides = _mask_view(inputs.get("mask"), batch, heads, kv_len)
    meta = dict(HEAD_DIM=head_dim, BLOCK_D=block_d, HEADS_PER_BLOCK=heads_per_block,
                BLOCK_H=max(16, pow2_at_least(heads_per_block)), BLOCK_N=block_n,
                PARTIALS=split_kv > 1, MASK=mask_kind)
    mask_arg = mask if mask is not None else q
    qkv = (kv_len, group, tiles_per_split, qk_scale, q.stride(0), q.stride(1),
           k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2))

    if split_kv == 1:
        args = (q, k, v, out, out, out, mask_arg, *qkv, out.stride(0), out.stride(1), 0, 0, 0,
                *mask_strides)
        return out, [KernelCall(decode_attention_kernel, grid, args, meta, opts)]

    part_acc = torch.empty((batch, heads, split_kv, head_dim), device=q.device, dtype=torch.float32)
    part_m = torch.empty((batch, heads, split_kv), device=q.device, dtype=torch.float32)
    part_l = torch.empty((batch, heads, split_kv), device=q.device, dtype=torch.float32)
    acc_strides = (part_acc.stride(0), part_acc.stride(1), part_acc.stride(2))
    ml_strides = (part_m.stride(0), part_m.stride(1))
    args = (q, k, v, part_acc, part_m, part_l, mask_arg, *qkv, *acc_strides, *ml_strides,
            *mask_strides)
    combine_args = (part_acc, part_m, part_l, out, num_splits, *acc_strides, *ml_strides,
                    out.stride(0), out.stride(1))
    combine = KernelCall(combine_kernel, (heads, batch), combine_args,
                         dict(HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_S=pow2_at_least(split_kv)),
                         {"num_warps": 4})
    return out, [KernelCall(decode_attention_kernel, grid, args, meta, opts), combine]


def _mask_view(mask, batch: int, heads: int, kv_len: int):
    """SDPA's attn_mask for one query token ([b|1, h|1, 1, kv_len], or [b|1, h|1, kv_len]) as the
    kernel reads it: (tensor, kind, strides over batch / query head / key, 0 where broadcast).
    kind 0: no mask, 1: boolean (True attends), 2: additive."""
    if mask is None:
        return None, 0, (0, 0, 0)
    if mask.dim() == 4:
        if mask.shape[2] != 1:
            raise ValueError(f"attention: a decode mask has one query row, not {tuple(mask.shape)}")
        mask = mask[:, :, 0]
    if (mask.dim() != 3 or mask.shape[0] not in (1, batch) or mask.shape[1] not in (1, heads)
            or mask.shape[2] != kv_len):
        raise ValueError(f"attention: mask {tuple(mask.shape)} does not broadcast to "
                         f"[{batch}, {heads}, 1, {kv_len}]")
    if mask.dtype == torch.bool:
        mask, kind = mask.view(torch.uint8), 1
    elif mask.dtype in (torch.float32, torch.float16, torch.bfloat16):
        kind = 2
    else:
        raise ValueError(f"attention: mask dtype {mask.dtype} is neither bool nor floating")
    strides = tuple(0 if mask.shape[i] == 1 else mask.stride(i) for i in range(3))
    return mask, kind, strides


def launch(inputs: dict, config: dict, out: torch.Tensor | None = None) -> torch.Tensor:
    out, calls = launch_plan(inputs, config, out)
    for call in calls:
        call.run()
    return out


def _largest_divisor_at_most(x: int, limit: int) -> int:
    return max(d for d in range(1, min(x, limit) + 1) if x % d == 0)


def default_config(shape: dict, backend: str = "cuda", sm_count: int | None = None) -> dict:
    """Stack all query heads of a KV head (up to 64), then split KV until ~2 programs per SM of
    an H100-class GPU (256 programs; `sm_count`, part of the family interface, is not used)."""
    batch, heads, kv_heads, kv_len, head_dim = _dims(shape)
    group = heads // kv_heads
    heads_per_block = _largest_divisor_at_most(group, 64)
    block_n = 64 if head_dim <= 128 else 32
    block_n = min(block_n, max(16, pow2_at_least(kv_len)))
    programs = batch * (heads // heads_per_block)
    split_kv = 1
    while programs * split_kv < 256 and split_kv < 64 and triton.cdiv(kv_len, block_n) >= 4 * split_kv:
        split_kv *= 2
    hip = backend in ("hip", "dcu")
    config = {"HEADS_PER_BLOCK": heads_per_block, "BLOCK_N": block_n, "SPLIT_KV": split_kv,
              "num_warps": 4, "num_stages": 2 if hip else 3}
    if hip:
        config.update({"waves_per_eu": 0, "matrix_instr_nonkdim": 16})
    return config


def baseline(inputs: dict) -> torch.Tensor:
    """torch's scaled_dot_product_attention (its default backend choice) with enable_gqa: torch's
    own function, as taken when this module was imported (tuner.serving may route the name).
    An optional ``mask`` (SDPA's attn_mask) and ``scale`` in `inputs` are passed on. With
    ``baseline_kv_heads`` (a call traced on a repeated KV cache: transformers' path, which
    tuner.serving replaces) the cache is first repeated to that many KV heads, as transformers'
    repeat_kv does (a copy each call), and SDPA runs on the copy."""
    q = inputs["q"].unsqueeze(2)
    k, v = inputs["k"], inputs["v"]
    repeated = int(inputs.get("baseline_kv_heads") or k.shape[1])
    if repeated != k.shape[1]:   # transformers' repeat_kv: expand, then a copy by reshape
        b, kv_heads, n, d = k.shape
        group = repeated // kv_heads
        k = k[:, :, None].expand(b, kv_heads, group, n, d).reshape(b, repeated, n, d)
        v = v[:, :, None].expand(b, kv_heads, group, n, d).reshape(b, repeated, n, d)
    mask = inputs.get("mask")
    if mask is not None and mask.dim() == 3:
        mask = mask.unsqueeze(2)
    out = _TORCH_SDPA(q, k, v, attn_mask=mask, scale=inputs.get("scale"), enable_gqa=True)
    return out.squeeze(2)


def reference(inputs: dict) -> torch.Tensor:
    """fp32 softmax(q kᵀ · scale + mask) v (scale 1 / sqrt(d) unless given), KV heads repeated
    for their query heads."""
    q, k, v = inputs["q"].float(), inputs["k"].float(), inputs["v"].float()
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scale = inputs.get("scale")
    scores = torch.einsum("bhd,bhnd->bhn", q, k) * (
        float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    mask = inputs.get("mask")
    if mask is not None:
        mask = mask[:, :, 0] if mask.dim() == 4 else mask
        scores = (scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool
                  else scores + mask.float())
    return torch.einsum("bhn,bhnd->bhd", torch.softmax(scores, dim=-1), v)


def _cost(shape: dict) -> tuple[int, int]:
    batch, heads, kv_heads, kv_len, head_dim = _dims(shape)
    return attention_cost(batch=batch, heads=heads, kv_heads=kv_heads, q_len=1, kv_len=kv_len,
                          head_dim=head_dim,
                          elem_bytes=torch.empty((), dtype=_dtype(shape)).element_size())


def bytes_moved(shape: dict) -> int:
    return _cost(shape)[0]


def kv_bytes(shape: dict) -> int:
    """Bytes of the K and V cache alone (what a decode step must read)."""
    batch, _, kv_heads, kv_len, head_dim = _dims(shape)
    return 2 * batch * kv_heads * kv_len * head_dim * torch.empty((), dtype=_dtype(shape)).element_size()


def flops(shape: dict) -> int:
    return _cost(shape)[1]


def shape_from_row(row) -> dict | None:
    """Attention rows with q_len == 1 (decode) and all of heads, kv_heads, kv_len, head_dim known;
    a row harvest regrouped from a repeated KV cache (`traced_kv_heads`) also gets
    ``baseline_kv_heads``: the baseline is the traced call (`baseline`), the key the grouped one."""
    if row_value(row, "family") != "attention":
        return None
    dtype = row_value(row, "dtype")
    if dtype not in DTYPES:
        return None
    values = {key: row_value(row, key) for key in ("q_len", "heads", "kv_heads", "kv_len", "head_dim")}
    if any(value is None for value in values.values()) or int(values["q_len"]) != 1:
        return None
    batch = int(row_value(row, "batch", 1) or 1)
    heads, kv_heads = int(values["heads"]), int(values["kv_heads"])
    if kv_heads <= 0 or heads % kv_heads or int(values["kv_len"]) <= 0:
        return None
    shape = {"batch": batch, "heads": heads, "kv_heads": kv_heads, "kv_len": int(values["kv_len"]),
             "head_dim": int(values["head_dim"]), "dtype": dtype}
    traced = row_value(row, "traced_kv_heads")
    if traced is not None and int(traced) > kv_heads and int(traced) % kv_heads == 0 \
            and heads % int(traced) == 0:
        shape["baseline_kv_heads"] = int(traced)
    return shape


def shape_key(shape: dict) -> str:
    return format_shape_key(shape, ("batch", "heads", "kv_heads", "kv_len", "head_dim", "dtype"))


FAMILY = KernelFamily(
    name="attention",
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
    source_files=(Path(__file__).resolve(), *COMMON_SOURCES),
)
