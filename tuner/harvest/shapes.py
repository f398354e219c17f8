"""Call shapes from an op's Input Dims, Input type and Input Strides (DESIGN.md's convention:
out[m, n] = A[m, k] . B[k, n]; a linear's weight [out, in] gives n = out, k = in)."""

from __future__ import annotations

from . import config
from .records import Call, Op

__all__ = ["is_attention", "gemm_shape", "attention_shape", "make_call"]


def is_attention(name: str) -> bool:
    """Whether a CPU op of this name is an attention call (config.py's attention op sets)."""
    if name in config.ATTN_BHLD or name in config.ATTN_BLHD:
        return True
    lower = name.lower()
    if "backward" in lower or "bwd" in lower:
        return False
    if name.startswith("aten::"):
        return "attention" in name
    return bool(config.ATTN_NAME_RE.search(name))


def _dtype(types: list, i: int) -> str:
    if i < len(types) and types[i]:
        return config.DTYPES.get(types[i], types[i])
    return "unknown"


def _mat_flag(dims: list, strides: list, i: int) -> str:
    """'N' if matrix input i is row-major in its last two dims, 'T' if it is a transposed view."""
    if i >= len(strides) or i >= len(dims):
        return "N"
    d, s = dims[i], strides[i]
    if not isinstance(d, list) or not isinstance(s, list) or len(d) < 2 or len(s) < 2:
        return "N"
    rows, cols = d[-2], d[-1]
    s_row, s_col = s[-2], s[-1]
    if s_col == 1 and (s_row >= cols or rows == 1):
        return "N"
    if s_row == 1 and (s_col >= rows or cols == 1):
        return "T"
    return "N" if s_col == 1 else "T"


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out


def _is_mat(d) -> bool:
    return isinstance(d, list) and len(d) >= 2 and all(isinstance(x, (int, float)) for x in d)


def gemm_shape(op: Op) -> dict | None:
    """m, n, k, batch, dtype, layout of a GEMM-family op (DESIGN.md convention), or None."""
    name, dims, types, strides = op.name, op.dims, op.types, op.strides
    if name in ("aten::addmm", "aten::baddbmm"):
        a, b = 1, 2
    else:
        a, b = 0, 1
    if len(dims) <= max(a, b):
        return None
    da, db = dims[a], dims[b]
    if name == "aten::linear":
        # input [..., k], weight [n, k]: B is the transposed view of the weight
        if not isinstance(da, list) or len(da) < 1 or not _is_mat(db) or len(db) != 2:
            return None
        m = _prod(da[:-1]) if len(da) > 1 else 1
        n, k = int(db[0]), int(db[1])
        flag_a = _mat_flag(dims, strides, a) if len(da) >= 2 else "N"
        flag_b = "T" if _mat_flag(dims, strides, b) == "N" else "N"
        return dict(m=m, n=n, k=k, batch=1, dtype=_dtype(types, a), layout=flag_a + flag_b)
    if not _is_mat(da) or not _is_mat(db):
        return None
    if name in ("aten::bmm", "aten::baddbmm"):
        if len(da) != 3 or len(db) != 3:
            return None
        batch, m, k, n = int(da[0]), int(da[1]), int(da[2]), int(db[2])
    elif name == "aten::matmul":
        if len(db) == 2:      # [..., m, k] @ [k, n]: folds into one GEMM
            batch, m, k, n = 1, _prod(da[:-1]), int(da[-1]), int(db[1])
        else:
            lead = da[:-2] if len(da) >= len(db) else db[:-2]
            batch, m, k, n = _prod(lead), int(da[-2]), int(da[-1]), int(db[-1])
    else:                     # mm, addmm, _scaled_mm
        if len(da) != 2 or len(db) != 2:
            return None
        batch, m, k, n = 1, int(da[0]), int(da[1]), int(db[1])
    layout = _mat_flag(dims, strides, a) + _mat_flag(dims, strides, b)
    return dict(m=m, n=n, k=k, batch=batch, dtype=_dtype(types, a), layout=layout)


def attention_shape(op: Op) -> dict | None:
    """batch, heads, kv_heads, q_len, kv_len, head_dim of an attention op, as far as dims go."""
    dims = op.dims
    if len(dims) < 2 or not _is_mat(dims[0]) or not isinstance(dims[1], list):
        return None
    q, kk = dims[0], dims[1]
    out = dict(batch=None, heads=None, kv_heads=None, q_len=None, kv_len=None, head_dim=None)
    if len(q) == 4:
        if op.name in config.ATTN_BHLD or (op.name not in config.ATTN_BLHD
                                           and "scaled_dot_product" in op.name):
            out.update(batch=q[0], heads=q[1], q_len=q[2], head_dim=q[3])
            if len(kk) == 4:
                out.update(kv_heads=kk[1], kv_len=kk[2])
        else:
            out.update(batch=q[0], q_len=q[1], heads=q[2], head_dim=q[3])
            if len(kk) == 4:
                out.update(kv_len=kk[1], kv_heads=kk[2])
    elif len(q) == 3:
        # varlen [tokens, heads, head_dim]; batch from cu_seqlens_q ([batch + 1]) when present
        out.update(heads=q[1], head_dim=q[2])
        if len(kk) == 3:
            out.update(kv_heads=kk[1])
        for d in dims[2:6]:
            if isinstance(d, list) and len(d) == 1 and d[0] and d[0] > 1:
                out["batch"] = int(d[0]) - 1
                break
        if out["batch"]:
            out["q_len"] = int(q[0]) // out["batch"] if q[0] % out["batch"] == 0 else None
    else:
        return None
    out = {k: (int(v) if v is not None else None) for k, v in out.items()}
    out["dtype"] = _dtype(op.types, 0)
    return out


def make_call(op: Op) -> Call | None:
    """The Call of a GEMM or attention op, or None when its dims give no shape."""
    if op.kind == "gemm":
        s = gemm_shape(op)
        if s is None:
            return None
        return Call(op=op.name, family="gemm", ts=op.ts, **s)
    s = attention_shape(op)
    if s is None:
        return None
    return Call(op=op.name, family="attention", ts=op.ts,
                m=s["q_len"] or 0, n=s["kv_len"] or 0, k=s["head_dim"] or 0,
                batch=s["batch"] or 0, dtype=s["dtype"], layout="",
                heads=s["heads"], kv_heads=s["kv_heads"], q_len=s["q_len"],
                kv_len=s["kv_len"], head_dim=s["head_dim"])
