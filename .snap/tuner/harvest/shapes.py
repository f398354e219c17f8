"""Call shapes from an op's Input Dims, Input type and Input Strides (DESIGN.md's convention:
out[m, n] = A[m, k] . B[k, n]; a linear's weight [out, in] gives n = out, k = in)."""

from __future__ import annotations

import dataclasses

from . import config
from .records import Call, Op

__all__ = ["is_attention", "gemm_shape", "attention_shape", "make_call", "call_and_empty_size",
           "complete_decode_attention", "regroup_kv_heads", "reduction_linears", "split_linears"]


def is_attention(name: str) -> bool:
    """Whether a CPU op of this name is an attention call (config.py's attention op sets)."""
    if name in config.ATTN_BHLD or name in config.ATTN_BLHD:
        return True
    lower = name.lower()
    if "backward" in lower or "bwd" in lower or config.INDUCTOR_KERNEL_RE.match(name):
        return False
    if name.startswith("aten::"):
        return "attention" in name
    return bool(config.ATTN_NAME_RE.search(name))


MAX_DIM = 2 ** 40      # a larger dim (or a product over 2**62) is a broken trace, not a tensor


def _dim(x) -> int | None:
    """A tensor size: a non-negative integer (an integral float counts), else None."""
    if type(x) is int:
        return x if 0 <= x <= MAX_DIM else None
    if type(x) is float and x.is_integer() and 0 <= x <= MAX_DIM:
        return int(x)
    return None


def _sizes(d) -> list[int] | None:
    """A tensor's Input Dims entry as a list of sizes, or None when any size is unusable."""
    if type(d) is not list:
        return None
    out = [_dim(x) for x in d]
    return None if None in out else out


def _input(dims: list, i: int) -> list[int] | None:
    return _sizes(dims[i]) if i < len(dims) else None


def _damaged(d) -> bool:
    """Whether an Input Dims entry cannot be a tensor's sizes, a non-tensor's [] or a tensor
    list's [[...], ...]: not a list, or a flat list holding a string, a negative, a fraction."""
    if type(d) is not list:
        return True
    if not d or all(type(x) is list for x in d):
        return False
    return _sizes(d) is None


def _dtype(types: list, i: int) -> str:
    if i < len(types) and type(types[i]) is str and types[i]:
        return config.DTYPES.get(types[i], types[i])
    return "unknown"


def _mat_flag(dims: list, strides: list, i: int) -> str:
    """'N' if matrix input i is row-major in its last two dims, 'T' if it is a transposed view."""
    d = _input(dims, i)
    s = _input(strides, i)
    if d is None or s is None or len(d) < 2 or len(s) < 2:
        return "N"
    rows, cols = d[-2], d[-1]
    s_row, s_col = s[-2], s[-1]
    if s_col == 1 and (s_row >= cols or rows == 1):
        return "N"
    if s_row == 1 and (s_col >= rows or cols == 1):
        return "T"
    return "N" if s_col == 1 else "T"


def _prod(xs) -> int | None:
    out = 1
    for x in xs:
        out *= x
    return out if out <= 2 ** 62 else None


def gemm_shape(op: Op) -> dict | None:
    """m, n, k, batch, dtype, layout of a GEMM-family op (DESIGN.md convention), or None.

    A trailing `out=` tensor (Inductor's aten::mm(a, b, out=c): three Input Dims) is ignored.
    """
    name, dims, types, strides = op.name, op.dims, op.types, op.strides
    if name == config.INDUCTOR_GEMM_OP:
        return _template_shape(dims, types, strides)
    if name == config.INDUCTOR_GEMV_OP:
        return reduction_linears(dims, types, strides)
    a, b = (1, 2) if name in ("aten::addmm", "aten::baddbmm") else (
        0, config.LINEAR_WEIGHT_INPUT.get(name, 1))
    da, db = _input(dims, a), _input(dims, b)
    if da is None or db is None:
        return None
    if name in config.LINEAR_OPS:
        # input [..., k], weight [n, k]: B is the transposed view of the weight
        if len(da) < 1 or len(db) != 2:
            return None
        m = _prod(da[:-1]) if len(da) > 1 else 1
        n, k = db[0], db[1]
        flag_a = _mat_flag(dims, strides, a) if len(da) >= 2 else "N"
        flag_b = "T" if _mat_flag(dims, strides, b) == "N" else "N"
        shape = dict(m=m, n=n, k=k, batch=1, dtype=_dtype(types, a), layout=flag_a + flag_b)
        if _input(dims, config.LINEAR_BIAS_INPUT[name]):
            shape["bias"] = 1
        return shape if m is not None else None
    if len(da) < 2 or len(db) < 2:
        return None
    if name in ("aten::bmm", "aten::baddbmm"):
        if len(da) != 3 or len(db) != 3:
            return None
        batch, m, k, n = da[0], da[1], da[2], db[2]
    elif name == "aten::matmul":
        if len(db) == 2:      # [..., m, k] @ [k, n]: folds into one GEMM
            batch, m, k, n = 1, _prod(da[:-1]), da[-1], db[1]
        else:
            lead = da[:-2] if len(da) >= len(db) else db[:-2]
            batch, m, k, n = _prod(lead), da[-2], da[-1], db[-1]
    else:                     # mm, addmm, _scaled_mm
        if len(da) != 2 or len(db) != 2:
            return None
        batch, m, k, n = 1, da[0], da[1], db[1]
    if m is None or batch is None:
        return None
    layout = _mat_flag(dims, strides, a) + _mat_flag(dims, strides, b)
    return dict(m=m, n=n, k=k, batch=batch, dtype=_dtype(types, a), layout=layout)


def _template_shape(dims: list, types: list, strides: list) -> dict | None:
    """An Inductor GEMM template's call (config.INDUCTOR_GEMM_RE): input [..., k] (any view of
    m x k elements), weight [n, k] (B is its transposed view), output [m, n]; None where the
    dims do not say so (a fused kernel of another argument order is not guessed at)."""
    da, dw, do = _input(dims, 0), _input(dims, 1), _input(dims, 2)
    if da is None or dw is None or do is None or len(dw) != 2 or len(do) != 2:
        return None
    (n, k), m = dw, do[0]
    if do[1] != n or not da or _prod(da) != m * k or m < 1:
        return None
    flag_b = "T" if _mat_flag(dims, strides, 1) == "N" else "N"
    return dict(m=m, n=n, k=k, batch=1, dtype=_dtype(types, 1), layout="N" + flag_b)


def reduction_linears(dims: list, types: list, strides: list) -> dict | None:
    """The linears of an Inductor matrix-vector reduction (config.INDUCTOR_GEMV_RE), or None.

    Its args are whatever the fused kernel reads and writes (norm weights, residuals, the KV
    cache, an embedding table it gathers from), in no fixed order. A weight is a 2-D arg [n, k]
    whose output is an arg too: [..., n] holding m rows (Inductor decomposes only m = 1). A
    gathered table [vocab, hidden] has no such output and is no linear. The result's `linears`
    says how many weights of that one shape the kernel reads (gate and up, k and v); weights of
    two different shapes in one kernel are not split up by guessing: no shape.
    """
    sizes = [_input(dims, i) for i in range(len(dims))]
    found = []
    for i, w in enumerate(sizes):
        if w is None or len(w) != 2 or min(w) < 2:
            continue
        n = w[0]
        rows = [_prod(o[:-1]) for j, o in enumerate(sizes)
                if j != i and o is not None and len(o) >= 2 and o[-1] == n and o != w]
        rows = [r for r in rows if r is not None and 1 <= r < n]
        if rows:
            found.append((i, n, w[1], min(rows)))
    if not found or len({(n, k, m) for _i, n, k, m in found}) != 1:
        return None
    i, n, k, m = found[0]
    flag_b = "T" if _mat_flag(dims, strides, i) == "N" else "N"
    return dict(m=m, n=n, k=k, batch=1, dtype=_dtype(types, i), layout="N" + flag_b,
                linears=len(found))


def attention_shape(op: Op) -> dict | None:
    """batch, heads, kv_heads, q_len, kv_len, head_dim of an attention op, as far as dims go.

    q [batch, heads, len, head_dim] (SDPA) or [batch, len, heads, head_dim] (flash), or
    varlen / ragged / paged: q [tokens, heads, head_dim] with k either [kv_tokens, kv_heads,
    head_dim] or a paged cache [blocks, (2,) block_size, kv_heads, head_dim]; the batch comes
    from a [batch + 1] offsets input (cu_seqlens, qo_indptr) and the mean KV length from a second
    one; what the dims do not give stays None.
    """
    dims = op.dims
    q = _input(dims, 0)
    if q is None or len(q) < 2 or len(dims) < 2 or type(dims[1]) is not list:
        return None
    if any(_damaged(d) for d in dims[:8]):
        # a key, value, cache or offsets entry that holds no sizes: read without it, the call
        # lost its KV length, heads or batch and became a row of zeros (kv_len 0, batch 0)
        return None
    kk = _input(dims, 1) or []
    out = dict(batch=None, heads=None, kv_heads=None, q_len=None, kv_len=None, head_dim=None,
               tokens=None)
    if len(q) == 4:
        if op.name in config.ATTN_BHLD or (op.name not in config.ATTN_BLHD
                                           and "scaled_dot_product" in op.name):
            out.update(batch=q[0], heads=q[1], q_len=q[2], head_dim=q[3])
            if len(kk) == 4:
                out.update(kv_heads=kk[1], kv_len=kk[2])
                _unpack_gqa(dims, op.strides, out)
        else:
            out.update(batch=q[0], q_len=q[1], heads=q[2], head_dim=q[3])
            if len(kk) == 4:
                out.update(kv_len=kk[1], kv_heads=kk[2])
    elif len(q) == 3:
        _varlen_shape(q, kk, dims, out)
    else:
        return None
    if out["kv_heads"] and out["heads"] and out["heads"] % out["kv_heads"]:
        out["kv_heads"] = None        # not a GQA group: the dims were read wrong, say nothing
    out["dtype"] = _dtype(op.types, 0)
    return out


def _unpack_gqa(dims: list, strides: list, out: dict) -> None:
    """transformers' single-token GQA packing (its SDPA attention from about 5.2x, eager): a
    decode call's query [batch, heads, 1, d] goes to SDPA as [batch, kv_heads, heads/kv_heads,
    d] over the unrepeated cache, with the static cache's mask of the one query row [batch|1, 1,
    1, kv_len] broadcast over the packed rows. Read back as what it is: one query token, `heads`
    query heads on kv_heads KV heads. The signs, all needed: a one-row mask over several query
    rows, at most 128 of them (a GQA group: 48 query heads on one KV head, say), a KV length unlike the query length (self-attention
    over the same tokens is left alone) and, where the trace has strides, the packed query's
    (rows d apart, heads rows x d apart: a query transposed from [batch, len, heads, d], as a
    cross-attention's is, is not packed)."""
    mask = _input(dims, 3)
    q_len, heads, head_dim = out["q_len"], out["heads"], out["head_dim"]
    if not (mask and len(mask) == 4 and mask[2] == 1 and mask[1] == 1 and q_len
            and 1 < q_len <= 128 and heads and out["kv_heads"] == heads
            and out["kv_len"] != q_len and mask[3] == out["kv_len"]):
        return
    q_strides = _sizes(strides[0]) if strides else None
    if q_strides is not None and len(q_strides) == 4 and not (
            q_strides[3] == 1 and q_strides[2] == head_dim and q_strides[1] == q_len * head_dim):
        return
    out.update(heads=heads * q_len, q_len=1)


def regroup_kv_heads(calls: list[Call], kv_heads: int) -> int:
    """Read decode attention calls recorded on a repeated KV cache as the grouped call.

    transformers' SDPA path (compiled, or eager before about 5.2x) copies the cache with
    `repeat_kv` to one KV head per query head before calling SDPA, so the trace records
    kv_heads = heads; tuner.serving runs the call on the model's cache itself, with `kv_heads`
    KV heads (the model's num_key_value_heads), where head stacking (HEADS_PER_BLOCK > 1) can
    read each KV head once for its group. Rewrites, in place, the decode calls (one query token)
    with kv_heads == heads of which `kv_heads` is a proper divisor, keeping the recorded KV heads
    as `traced_kv_heads` (the path serving replaces: the family's baseline repeats the cache, as
    the trace did); returns how many."""
    changed = 0
    for c in calls:
        if (c.family == "attention" and c.q_len == 1 and c.heads and c.kv_heads == c.heads
                and kv_heads < c.heads and c.heads % kv_heads == 0):
            c.traced_kv_heads, c.kv_heads = c.kv_heads, kv_heads
            changed += 1
    return changed


def _varlen_shape(q: list, kk: list, dims: list, out: dict) -> None:
    tokens, heads, head_dim = q
    out.update(heads=heads, head_dim=head_dim, tokens=tokens)
    if len(kk) == 3:
        out["kv_heads"] = kk[1]
    else:                             # a paged cache among the inputs: [..., kv_heads, head_dim]
        for d in (_sizes(x) for x in dims[1:6]):
            if d is not None and len(d) in (4, 5) and d[-1] == head_dim:
                out["kv_heads"] = d[-2]
                break
    offsets = [d for d in (_sizes(x) for x in dims[2:8])
               if d is not None and len(d) == 1 and d[0] > 1]
    if offsets:
        batch = offsets[0][0] - 1
        out["batch"] = batch
        out["q_len"] = tokens // batch if tokens % batch == 0 else None
        if len(kk) == 3 and len(offsets) > 1 and offsets[1][0] == offsets[0][0]:
            out["kv_len"] = max(1, round(kk[0] / batch))   # ragged keys: the mean KV length


def make_call(op: Op) -> Call | None:
    """The Call of a GEMM or attention op, or None when its dims give no shape."""
    return call_and_empty_size(op)[0]


def call_and_empty_size(op: Op) -> tuple[Call | None, str]:
    """`make_call`, and the name of a size the dims give as zero ("m", "heads", ...) or "".

    A call on an empty tensor does no work, and a zero in a trace's dims is as often damage;
    kept, it would be an m = 0 row that budget and search take for a shape. Unknown sizes of
    an attention call (None: a paged decode's batch or KV length) are not zero."""
    if op.kind == "gemm":
        s = gemm_shape(op)
        if s is None:
            return None, ""
        empty = next((key for key in ("m", "n", "k", "batch") if s[key] == 0), "")
        return Call(op=op.name, family="gemm", ts=op.ts, **s), empty
    s = attention_shape(op)
    if s is None:
        return None, ""
    empty = next((key for key in ("batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim",
                                  "tokens") if s[key] == 0), "")
    return Call(op=op.name, family="attention", ts=op.ts,
                m=s["q_len"] or 0, n=s["kv_len"] or 0, k=s["head_dim"] or 0,
                batch=s["batch"] or 0, dtype=s["dtype"], layout="",
                heads=s["heads"], kv_heads=s["kv_heads"], q_len=s["q_len"],
                kv_len=s["kv_len"], head_dim=s["head_dim"], tokens=s["tokens"]), empty


def split_linears(calls: list) -> list:
    """Each call whose kernel computes several linears (Call.linears > 1) as that many calls of
    its shape, each with an equal share of the GPU time (its weights are of one shape, so each
    reads as many bytes); the other calls as they are."""
    out = []
    for c in calls:
        if c.linears <= 1:
            out.append(c)
            continue
        share = c.linears
        for _ in range(share):
            out.append(dataclasses.replace(c, linears=1, gpu_us=c.gpu_us / share,
                                           kernels=dict(c.kernels)))
    return out


def complete_decode_attention(calls: list, steps: list) -> int:
    """Varlen attention calls of decode steps whose dims give no batch (paged decode, e.g.
    vllm::unified_attention_with_output: q [tokens, heads, head_dim], the KV cache not among
    the inputs): one query token per request, so q_len = 1 and batch = tokens; the KV length
    from the step's marker (vLLM: the mean over its requests) when the dims do not give it.
    Returns how many calls were completed."""
    done = 0
    for c in calls:
        if c.family != "attention" or c.q_len is not None or not c.tokens or c.step < 0:
            continue
        step = steps[c.step]
        if step.phase != "decode":
            continue
        c.q_len, c.m, c.batch = 1, 1, c.tokens
        if c.kv_len is None and step.kv_mean:
            c.kv_len = c.n = step.kv_mean
        done += 1
    return done
