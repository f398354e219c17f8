"""The cost model of a call: the fewest bytes it must move and the flops it must do.

One implementation for the whole project: every kernel family's ``bytes_moved`` / ``flops`` and
the budget's per-row floors (tuner.budget) call these functions, so a shape is costed the same way
whether it comes from a ShapeTable row or a family's shape dict. Plain Python, no torch, no triton.

"Fewest bytes": each input read once from device memory, the output written once (DESIGN.md
"Budget before search"); a real kernel moves at least this much.
"""

from __future__ import annotations

__all__ = ["DTYPE_BYTES", "attention_cost", "dtype_bytes", "dtype_name", "gemm_cost",
           "moe_cost", "touched_experts"]

# Bytes per element for the dtype names a trace can carry (torch names, c10 names, short names).
DTYPE_BYTES: dict[str, int] = {
    "float64": 8, "double": 8,
    "float32": 4, "float": 4,
    "bfloat16": 2, "float16": 2, "half": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "int64": 8, "long": 8, "int32": 4, "int": 4, "int16": 2, "short": 2,
    "int8": 1, "uint8": 1, "bool": 1,
}


def dtype_name(dtype) -> str:
    """'torch.bfloat16' / 'c10::BFloat16' / 'bfloat16' -> 'bfloat16'."""
    return str(dtype).strip().lower().removeprefix("torch.").removeprefix("c10::")


def dtype_bytes(dtype) -> int | None:
    """Bytes per element, or None for a dtype the model does not know."""
    return DTYPE_BYTES.get(dtype_name(dtype))


def gemm_cost(m: int, n: int, k: int, *, batch: int = 1, elem_bytes: int = 2,
              bias: bool = False) -> tuple[int, int]:
    """(bytes, flops) of out[m, n] = A[m, k] · B[k, n] (+ bias[n]), per batch entry times batch."""
    batch = max(int(batch), 1)
    elements = batch * (m * k + k * n + m * n) + (n if bias else 0)
    return int(elements * elem_bytes), 2 * int(m) * int(n) * int(k) * batch


def attention_cost(*, batch: int, heads: int, kv_heads: int, q_len: int, kv_len: int,
                   head_dim: int, elem_bytes: int = 2) -> tuple[int, int]:
    """(bytes, flops) of softmax(q kᵀ) v: q and out [batch, heads, q_len, head_dim], the K and V
    cache [batch, kv_heads, kv_len, head_dim]; flops of q kᵀ and p v."""
    batch = max(int(batch), 1)
    elements = 2 * batch * heads * q_len * head_dim + 2 * batch * kv_heads * kv_len * head_dim
    return int(elements * elem_bytes), 4 * batch * heads * q_len * kv_len * head_dim


def touched_experts(m: int, experts: int, topk: int) -> float:
    """Expected number of distinct experts m tokens pick, each topk distinct ones uniformly at
    random: E · (1 - (1 - topk / E) ** m) (exactly topk for one token, all E as m grows)."""
    experts = max(int(experts), 1)
    return experts * (1.0 - (1.0 - min(int(topk), experts) / experts) ** max(int(m), 0))


def moe_cost(*, m: int, experts: int, topk: int, hidden: int, inter: int,
             elem_bytes: int = 2) -> tuple[int, int]:
    """(bytes, flops) of the expert MLPs of one MoE block: x [m, hidden] read, the touched
    experts' w1 [2 · inter, hidden] and w2 [hidden, inter] read once, out [m, hidden] written;
    flops of both projections for the m · topk (token, expert) pairs. Routing ids and weights
    (a few bytes a token) are left out."""
    per_expert = 3 * int(inter) * int(hidden)
    elements = 2 * int(m) * int(hidden) + touched_experts(m, experts, topk) * per_expert
    return int(round(elements * elem_bytes)), 2 * int(m) * int(topk) * per_expert
