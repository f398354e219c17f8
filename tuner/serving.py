"""Serving: put the exported kernels into any torch model, as torch custom ops.

    handle = tuner.serving.install(model)          # artifacts/export/<this device>/ by default
    handle.warmup(lambda: model(**decode_inputs))  # compile every kernel before any capture
    ... capture / replay / torch.compile the model as usual ...
    handle.hits(), handle.misses()                 # per shape: which calls the tuned path served
    handle.uninstall()                             # the model is exactly as it was

The custom ops of the ``tuner`` namespace (registered with fake implementations when this module
is imported: a model compiles with ``torch.compile(fullgraph=True)`` and captures as a CUDA/HIP
graph), each with the exported config of the call's shape (exact, else nearest m or kv_len:
tuner.runtime):

- ``tuner.linear(x, weight, bias)``: x[..., k] with at most 8 rows on the gemv family, more on
  the gemm family (layout NT);
- ``tuner.linear_add(x, weight, bias, residual)``: residual + that linear, the add in the gemv
  kernel's epilogue (what tuner.serving_fusion makes of a compiled step's residual adds);
- ``tuner.norm_linear(x, norm_weight, eps, weight, bias, folded_weight)``: the same linear of an
  RMSNorm'd x, the norm carried by the gemv kernel on the weight with the norm's folded in
  (`install`'s fold_norms);
- ``tuner.decode_attention(q, k, v, mask, scale)``: one query token per sequence over a KV cache
  (GQA; an optional mask of that query row, SDPA's scale);
- ``tuner.moe(x, w1, w2, topk_ids, topk_weights, block)``: the expert MLPs of one MoE block
  (tuner_kernels.moe).

A shape without an exported entry, and a call autograd records (the ops have no backward), runs
the baseline path (torch's linear / SDPA, transformers' experts forward): only a measured, ranked
and exported config is trusted to beat what serving runs today. The serving path never raises
into the caller: a kernel that fails runs the baseline instead, with one logged warning (logger
"tuner.serving"), and that shape stays on the baseline.
Nothing compiles inside a capture: a kernel first met while a CUDA graph is being captured (not
warmed up) runs the baseline for that capture, with one warning. In a graph replay no Python
runs, so hit counts count eager calls and captures.

`install` gives modules an instance ``forward`` (uninstall deletes it): every nn.Linear calls
``tuner.linear`` (compiled: a call the export serves); with fold_norms, tuner.serving_fusion
folds a decoder layer's RMSNorms into the tuned projections they feed (``tuner.norm_linear``)
and, compiled, its residual adds into their kernels; with "moe", the experts module of every
MoE block whose stored weights the kernel reads as they are (tuner.layouts.moe_layout) calls
``tuner.moe`` with its own parameters (no copy), and every dense gated MLP
(tuner.layouts.gated_mlp_layout) that the export serves at experts 1 calls it too, its gate and
up weights moved into one [2 · inter, hidden] tensor they are views of (tuner.serving_mlp: the
only parameters install touches; same values, same Parameter objects; uninstall leaves them
so); its router, a module of its own (tuner.layouts.moe_routers), has its ``F.linear`` routed
as an nn.Linear's (tuner.layouts.LinearOnWeight). With
"attention" it routes ``torch.nn.functional.scaled_dot_product_attention`` (looked up by name at
each call) and, in a process that has imported transformers, transformers' "sdpa" attention
function: a decode call (one query token, no dropout, not causal, no mask or one of that query
row, as a static cache passes) goes to ``tuner.decode_attention`` where the export has its
shape, on the model's own grouped KV cache (no repeat_kv copy; tuner.runtime serves it with the
entry of its repeated-KV form, the shape a baseline trace records); every other call to the
caller's own SDPA, unchanged. Under torch.compile the routing decisions are constants of the
install (`_linear_routed`, `_attention_routed`, `_moe_routed`): the step recompiles once when
installing, not per call, and traces with dynamic shapes (a linear's served m ranges are guards
on m); the op resolves each call's shape.
"""
from __future__ import annotations

import contextlib
import logging
import os
import types
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from . import runtime, serving_fusion
from .layouts import (DTYPES, FOLD_LAYERS, GEMV_MAX_ROWS, MODES_TRACE, LinearOnWeight,
                      decode_call_dims, decode_mask, gemv_shape, hf_attention_interface,
                      hf_structure, linear_call_shape, linear_lookup_parts, linear_structure,
                      moe_call_args, moe_call_shape, moe_layout, moe_routers, moe_tensors_fit,
                      no_autograd, norm_folds, plain_kwargs, runs_on as _runs_on)

__all__ = ["FOLD_LAYERS", "Installed", "decode_attention", "install", "installed", "linear", "moe",
           "moe_layout", "norm_folds", "norm_linear"]

log = logging.getLogger("tuner.serving")

FAMILIES = ("gemv", "gemm", "attention", "moe")

_SDPA = F.scaled_dot_product_attention  # torch's own, whatever install does to the name
_warmed: set[tuple] = set()  # (family, shape items, config items) compiled outside any capture
_failed: set[tuple] = set()  # (family, shape items): a kernel failed; the baseline serves it
_warned: set[tuple] = set()
_enabled: set[str] = set(FAMILIES)  # families the installed handle routes
_route_key = ""  # what the installed routing reads: export folder and families (see _attention_routed)
_moe_blocks: dict[int, torch.nn.Module] = {}  # installed experts modules by their index (tuner.moe's `block`)


def _warn_once(key: tuple, message: str, *args) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _tuned(family: str, shape: dict, launch, baseline, variant: str = ""):
    """Run `launch(config)` with the exported config of `shape`, else `baseline()`; never raise
    (a failing kernel runs the baseline, warns once, and its shape stays on the baseline).
    `variant` names another kernel of the same shape and config (the gemv kernel carrying a
    norm): it is warmed up, and fails, apart from the plain one."""
    if family not in _enabled:
        return baseline()
    shape_items = tuple(shape.items())
    failed = (family, shape_items) + ((variant,) if variant else ())
    if failed in _failed:
        return baseline()
    try:
        config = runtime.lookup(family, shape)
    except Exception as exc:  # noqa: BLE001 - the loader must never take serving down
        _warn_once(("lookup", family), "%s: config lookup failed (%s); the baseline path runs",
                   family, exc)
        return baseline()
    if config is None:
        return baseline()
    key = (family, shape_items, tuple(sorted(config.items())), variant)
    if key not in _warmed and _capturing():
        _warn_once(("capture",) + key, "%s %s: kernel not warmed up before this CUDA-graph "
                   "capture; the capture records the baseline path (call warmup first)",
                   family, shape)
        return baseline()
    try:
        out = launch(config)
    except Exception as exc:  # noqa: BLE001 - a kernel failure must not reach the caller
        _failed.add(failed)
        _warn_once(("launch",) + key, "%s %s with %s failed (%s: %s); the baseline path runs "
                   "for this shape from now on", family, shape, config, type(exc).__name__, exc)
        return baseline()
    if not _capturing():
        _warmed.add(key)
    return out


# ------------------------------------------------------------------------------ entry points
def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           residual: torch.Tensor | None = None) -> torch.Tensor:
    """torch.nn.functional.linear: the tuned gemv (<= 8 rows) or gemm where the export has it.
    With `residual` (the linear's output shape and dtype): residual + linear(x, weight, bias),
    the add in the gemv kernel's epilogue where its config takes one (tuner.serving_fusion makes
    such calls of a compiled step's residual adds)."""
    rows = _linear_rows(x, weight, bias)
    k, n = int(x.shape[-1]), int(weight.shape[0])
    if residual is not None and (residual.shape != (*x.shape[:-1], n)
                                 or residual.dtype != x.dtype or residual.device != x.device):
        return residual + linear(x, weight, bias)  # not the add the kernels take

    def baseline():
        out = F.linear(x, weight, bias)
        return out if residual is None else residual + out

    if not rows:
        return baseline()
    x2 = x.reshape(rows, k)
    r2 = None if residual is None else residual.reshape(rows, n)
    family, shape = linear_call_shape(rows, n, k, x.dtype, bias)
    if family == "gemv":
        from tuner_kernels import gemv

        def launch(config):
            if r2 is None or gemv.residual_capable(config):
                return gemv.gemv(x2, weight, config, bias=bias, residual=r2)
            return r2 + gemv.gemv(x2, weight, config, bias=bias)

        out = _tuned(family, shape, launch, baseline, variant="" if r2 is None else "residual")
    else:
        from tuner_kernels import gemm

        def launch(config):
            a = x2 if x2.stride(-1) == 1 else x2.contiguous()
            result = gemm.launch({"a": a, "b": weight.t()}, config)
            if bias is not None:
                result += bias
            if r2 is not None:
                result += r2
            return result

        out = _tuned("gemm", shape, launch, baseline)
    return out.reshape(*x.shape[:-1], n)


def _linear_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> int:
    """The rows of a linear call the kernels can take (dtypes, device, dimensions), else 0."""
    k = x.shape[-1]
    rows = x.numel() // k if k else 0
    if (rows < 1 or weight.dim() != 2 or weight.shape[1] != k or weight.dtype != x.dtype
            or x.dtype not in DTYPES or (bias is not None and bias.dtype != x.dtype)
            or not _runs_on(x.device.type)):
        return 0
    return rows


def norm_linear(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                bias: torch.Tensor | None = None,
                folded_weight: torch.Tensor | None = None) -> torch.Tensor:
    """linear(rms_norm(x, norm_weight, eps), weight, bias), a decoder layer's norm folded into a
    projection: one gemv launch from the raw x on `folded_weight` (weight with the norm's weight
    in it, tuner_kernels.gemv.fold_norm_weight; made by `install`) where the exported config can
    carry the norm (gemv.norm_capable), else the norm (gemv.rms_norm), then `linear`."""
    from tuner_kernels import gemv
    from tuner_kernels.gemv import rms_norm

    rows = _linear_rows(x, weight, bias)
    if (not rows or rows > GEMV_MAX_ROWS or norm_weight.shape != x.shape[-1:]
            or norm_weight.device != x.device or folded_weight is None
            or folded_weight.shape != weight.shape or folded_weight.dtype != weight.dtype
            or folded_weight.device != weight.device):
        return linear(rms_norm(x, norm_weight, eps), weight, bias)

    k, n = int(x.shape[-1]), int(weight.shape[0])
    x2 = x.reshape(rows, k)

    def launch(config):
        if gemv.norm_capable(config):
            return gemv.gemv(x2, folded_weight, config, bias=bias, norm_eps=eps)
        return gemv.gemv(rms_norm(x2, norm_weight, eps), weight, config, bias=bias)

    out = _tuned("gemv", gemv_shape(rows, n, k, x.dtype, bias), launch,
                 lambda: F.linear(rms_norm(x, norm_weight, eps), weight, bias), variant="norm")
    return out.reshape(*x.shape[:-1], n)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     mask: torch.Tensor | None = None, scale: float | None = None) -> torch.Tensor:
    """q [batch, heads(, 1), head_dim] over k / v [batch, kv_heads, kv_len, head_dim], out like
    q; `mask`: SDPA's attn_mask of that query row ([batch|1, heads|1, 1, kv_len], bool or
    additive); `scale`: SDPA's. The tuned kernel where the export has the shape, else SDPA."""
    from tuner_kernels import attention

    squeeze = q.dim() == 4
    q3 = q.squeeze(2) if squeeze else q
    inputs = {"q": q3, "k": k, "v": v, "mask": mask, "scale": scale}

    def baseline():
        if mask is not None and q3.dim() == 3 and k.dim() == 4 and k.shape[1] < q3.shape[1]:
            # transformers' own path for such a call: the KV heads repeated, then SDPA (torch's
            # SDPA given grouped heads and a mask falls back to its math kernel)
            return attention.baseline(dict(inputs, baseline_kv_heads=q3.shape[1]))
        return attention.baseline(inputs)

    if (q.dtype not in DTYPES or not _runs_on(q.device.type) or k.stride(-1) != 1
            or v.stride(-1) != 1 or q3.dim() != 3 or k.dim() != 4 or q3.shape[1] % k.shape[1]):
        out = baseline()
    else:
        shape = {"batch": int(q3.shape[0]), "heads": int(q3.shape[1]), "kv_heads": int(k.shape[1]),
                 "kv_len": int(k.shape[2]), "head_dim": int(q3.shape[2]),
                 "dtype": str(q.dtype).removeprefix("torch.")}
        out = _tuned("attention", shape, lambda config: attention.launch(inputs, config), baseline)
    return out.unsqueeze(2) if squeeze else out


def moe(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_ids: torch.Tensor,
        topk_weights: torch.Tensor, own=None) -> torch.Tensor:
    """The expert MLPs of one MoE block (tuner_kernels.moe's contract: x [m, hidden], w1 [experts,
    2 * inter, hidden] gate rows then up rows, w2 [experts, hidden, inter], the router's
    topk_ids and topk_weights [m, topk]): the moe kernel with the exported config of the call's
    shape (exact, else nearest m), else `own()` (the caller's own path: transformers' experts
    forward), else the family's baseline (tuner_kernels.moe.baseline)."""
    from tuner_kernels import moe as family

    inputs = {"x": x, "w1": w1, "w2": w2, "topk_ids": topk_ids,
              "topk_weights": topk_weights.to(torch.float32)}

    def baseline():
        return own() if own is not None else family.baseline(inputs)

    if not (x.dtype in DTYPES and _runs_on(x.device.type)
            and moe_tensors_fit(x, w1, w2, topk_ids, topk_weights)):
        return baseline()
    shape = moe_call_shape(x, w1, topk_ids)
    return _tuned("moe", shape, lambda config: family.launch(inputs, config), baseline)


# ------------------------------------------------------------------------------- custom ops
@torch.library.custom_op("tuner::linear", mutates_args=())
def _linear_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = linear(x, weight, bias)
    return out.clone() if out is x else out  # a custom op's output may not alias its inputs


@_linear_op.register_fake
def _(x, weight, bias):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("tuner::linear_add", mutates_args=())
def _linear_add_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   residual: torch.Tensor) -> torch.Tensor:
    """residual + tuner.linear(x, weight, bias), the add in the kernel (tuner.serving_fusion)."""
    out = linear(x, weight, bias, residual)
    return out.clone() if out is residual or out is x else out


@_linear_add_op.register_fake
def _(x, weight, bias, residual):
    return residual.new_empty(residual.shape)


@torch.library.custom_op("tuner::norm_linear", mutates_args=())
def _norm_linear_op(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                    bias: torch.Tensor | None,
                    folded_weight: torch.Tensor | None = None) -> torch.Tensor:
    return norm_linear(x, norm_weight, eps, weight, bias, folded_weight)


@_norm_linear_op.register_fake
def _(x, norm_weight, eps, weight, bias, folded_weight=None):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("tuner::decode_attention", mutates_args=())
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  mask: torch.Tensor | None = None, scale: float | None = None) -> torch.Tensor:
    return decode_attention(q, k, v, mask, scale)


@_attention_op.register_fake
def _(q, k, v, mask=None, scale=None):
    return torch.empty_like(q)


@torch.library.custom_op("tuner::moe", mutates_args=())
def _moe_op(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_ids: torch.Tensor,
            topk_weights: torch.Tensor, block: int = -1) -> torch.Tensor:
    """`block`: the installed experts module's index (its own forward is the fallback), or -1."""
    module = _moe_blocks.get(block)
    own = None if module is None else (
        lambda: type(module).forward(module, x, topk_ids, topk_weights))
    out = moe(x, w1, w2, topk_ids, topk_weights, own)
    return out.clone() if out is x else out


@_moe_op.register_fake
def _(x, w1, w2, topk_ids, topk_weights, block=-1):
    return torch.empty_like(x)


def _linear_forward(self, x):
    return _routed_linear(self, x, self.weight, self.bias)


def _routed_linear(module, x, weight, bias):
    """`F.linear(x, weight, bias)` of an installed linear (or router): through tuner.linear,
    or, compiled and at an m the export does not serve (`_linear_routed`), torch's own in the
    graph; a call autograd records (the custom ops have no backward) runs torch's linear."""
    if not no_autograd(x, weight, bias) or (torch.compiler.is_compiling() and not any(
            low * x.shape[-1] <= x.numel() <= high * x.shape[-1] for low, high in _linear_routed(
                module.__dict__["_tuner_linear"], x.device.type, _route_key))):
        return F.linear(x, weight, bias)  # autograd's, or in the graph for the compiler to fuse
    return torch.ops.tuner.linear(x, weight, bias)


def _router_forward(self, *args, **kwargs):  # the class's own, its logits GEMM routed
    with LinearOnWeight(self.weight, lambda x: _routed_linear(self, x, self.weight, None)):
        return type(self).forward(self, *args, **kwargs)


@torch.compiler.assume_constant_result
def _linear_routed(structure: tuple, device_type: str, route_key: str) -> tuple:
    """The compiled step's decision for one nn.Linear, as `_attention_routed`: the ranges of rows,
    ((low, high), ...), at which the export serves its calls (tuner.runtime.served_m_ranges: within
    one octave of an entry), compared with a call's rows in the traced code (a guard where shapes
    are dynamic). Any other call is traced as torch's linear, for the compiler to fuse its
    neighbours into (an opaque op running torch's linear cost the Llama-3.1-8B batch-1
    max-autotune step 148 µs on its q/o projections, BENCHMARKS.md); eagerly every linear goes
    through the op."""
    del route_key  # (it names the families `_enabled` holds)
    if not _runs_on(device_type):
        return ()
    gemv, gemm = linear_lookup_parts(structure)
    cut = GEMV_MAX_ROWS  # gemv's calls have at most this many rows, gemm's more
    ranges = [(low, min(high, cut)) for low, high in runtime.served_m_ranges("gemv", gemv)
              if "gemv" in _enabled and low <= cut]
    ranges += [(max(low, cut + 1), high) for low, high in runtime.served_m_ranges("gemm", gemm)
               if "gemm" in _enabled and high > cut]
    return tuple(ranges)


def _experts_forward(self, *args, **kwargs):
    """An installed experts module's forward: a call ``(hidden_states, top_k_index,
    top_k_weights)`` goes to tuner.moe where the export has its structure; every other call to
    transformers' own forward (the class's), unchanged."""
    if not kwargs and len(args) == 3 and _moe_call(self, *args):
        x, ids, weights = args
        return torch.ops.tuner.moe(x, self.gate_up_proj, self.down_proj, ids, weights,
                                   self._tuner_moe[0])
    return type(self).forward(self, *args, **kwargs)


def _moe_call(module, x, ids, weights) -> bool:
    """Whether an experts call goes to tuner.moe; never raises (anything unexpected:
    transformers' own forward, one warning)."""
    try:
        _index, experts, hidden, inter = module._tuner_moe
        if not (moe_call_args(module, x, ids, weights, hidden) and x.dtype in DTYPES
                and no_autograd(x, weights) and "moe" in _enabled):
            return False
        dtype = str(x.dtype).removeprefix("torch.")
        if torch.compiler.is_compiling():
            structure = (("experts", experts), ("topk", int(ids.shape[1])), ("hidden", hidden),
                         ("inter", inter), ("dtype", dtype))
            return _moe_routed(structure, x.device.type, _route_key)
        if not _runs_on(x.device.type):
            return False
        shape = moe_call_shape(x, module.gate_up_proj, ids)
        if ("moe", tuple(shape.items())) in _failed:
            return False
        if runtime.resolved("moe", shape)[0] is not None:
            return True
        runtime.lookup("moe", shape)  # counts the miss
        return False
    except Exception as exc:  # noqa: BLE001 - serving must never raise into the caller
        _warn_once(("moe-call", type(exc).__name__), "MoE experts call not read (%s: %s); "
                   "transformers' own experts forward runs", type(exc).__name__, exc)
        return False


@torch.compiler.assume_constant_result
def _moe_routed(structure: tuple, device_type: str, route_key: str) -> bool:
    """The compiled step's MoE routing decision, as `_attention_routed`: whether the install's
    moe export has an entry of `structure` (experts, topk, hidden, inter, dtype; any m) and the
    kernels run on `device_type`. The op resolves the call's m when it runs."""
    del route_key
    return _runs_on(device_type) and runtime.has_entries("moe", dict(structure))


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False, **kwargs):
    """SDPA as installed: a decode call (one query token, no dropout, not causal, no mask or a
    mask of that one query row, as a static KV cache passes) goes to tuner.decode_attention;
    every other call to torch's own SDPA, unchanged."""
    try:
        decode = bool(dropout_p == 0.0 and not is_causal and not kwargs
                      and decode_call_dims(query, key, value) and no_autograd(query, key, value)
                      and key.shape[1] > 0 and query.shape[1] % key.shape[1] == 0
                      and (enable_gqa or key.shape[1] == query.shape[1])
                      and decode_mask(attn_mask, query, key) and _has_attention_entry(query, key))
    except Exception as exc:  # noqa: BLE001 - serving must never raise into the caller
        _warn_once(("sdpa", type(exc).__name__), "SDPA call not read (%s: %s); torch's SDPA runs",
                   type(exc).__name__, exc)
        decode = False
    if decode:
        return torch.ops.tuner.decode_attention(
            query, key, value, attn_mask, None if scale is None else float(scale))
    return _SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                 scale=scale, enable_gqa=enable_gqa, **kwargs)


def _has_attention_entry(query: torch.Tensor, key: torch.Tensor, structure: tuple = ()) -> bool:
    """Whether the attention export has a config for this decode call. A miss runs the caller's
    own SDPA call, unchanged (compiled, it stays in the graph: routing it through the op only to
    run torch's SDPA inside cost 3.5 µs a call in the compiled Qwen3-8B batch-32 step,
    BENCHMARKS.md). Eagerly the decision is per call (exact shape, else nearest kv_len; a miss
    is counted); while torch.compile traces, it is `_attention_routed` of `structure`, the
    call's attention structure as plain (name, value) ints from the transformers module (heads,
    kv_heads, head_dim, dtype; empty from a bare SDPA call, whose dimensions may be symbolic).
    The op then resolves each call's shape; without an entry of that batch it runs the baseline
    inside (for a masked grouped call, transformers' repeat-then-SDPA)."""
    if "attention" not in _enabled or query.dtype not in DTYPES:
        return False
    dtype = str(query.dtype).removeprefix("torch.")
    if torch.compiler.is_compiling():
        return _attention_routed(structure + (("dtype", dtype),) if structure else (), _route_key)
    shape = {"batch": int(query.shape[0]), "heads": int(query.shape[1]),
             "kv_heads": int(key.shape[1]), "kv_len": int(key.shape[2]),
             "head_dim": int(query.shape[3]), "dtype": dtype}
    if ("attention", tuple(shape.items())) in _failed:
        return False
    if runtime.resolved("attention", shape)[0] is not None:
        return True
    runtime.lookup("attention", shape)  # counts the miss
    return False


@torch.compiler.assume_constant_result
def _attention_routed(structure: tuple, route_key: str) -> bool:
    """The compiled step's routing decision (plain values in, a bool out): whether the
    install's attention export has an entry of `structure` (any entry when it is empty).

    Dynamo calls this once per compile and keeps the answer as a constant: tracing the export
    lookup guarded the compiled step on tuner.runtime's call counters, so every call recompiled
    the attention frame until Dynamo's recompile limit, after which it ran eagerly in every arm
    (BENCHMARKS.md, 2026-12-01 night). It takes no tensor dimension (symbolic under dynamic
    shapes). `route_key` (the export folder, its manifest's size, time and inode, the families)
    makes an install of another or a rewritten export recompile, while installing the same
    export again (as `tuner ab` does to profile its tuned arm) reuses the compiled step."""
    del route_key
    return runtime.has_entries("attention", dict(structure))


def _hf_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
             is_causal=None, **kwargs):
    """transformers' "sdpa" attention function as installed: a decode call goes to
    tuner.decode_attention on the model's own KV cache, grouped heads and all, where the export
    has its shape (or its repeated-KV form: tuner.runtime); every other call to transformers'
    own function, which repeats the grouped K/V heads (a copy of the cache per layer) before
    SDPA when a mask is given, as a static cache's decode call always has."""
    if _hf_decode_call(module, query, key, value, attention_mask, dropout, is_causal, kwargs):
        out = torch.ops.tuner.decode_attention(
            query, key, value, attention_mask, None if scaling is None else float(scaling))
        return out.transpose(1, 2).contiguous(), None
    return _hf_own_sdpa(module, query, key, value, attention_mask, dropout=dropout,
                        scaling=scaling, is_causal=is_causal, **kwargs)


def _hf_decode_call(module, query, key, value, mask, dropout, is_causal, kwargs) -> bool:
    """Whether transformers' attention call is a decode call the kernel serves with an exported
    config; never raises (anything unexpected: transformers' own path, one warning)."""
    try:
        groups = int(getattr(module, "num_key_value_groups", 1) or 1)
        # is_causal: transformers itself ignores it for one query token
        return bool(dropout == 0.0 and plain_kwargs(kwargs) and no_autograd(query, key, value)
                    and decode_call_dims(query, key, value)
                    and key.shape[1] * groups == query.shape[1] and decode_mask(mask, query, key)
                    and _has_attention_entry(query, key, hf_structure(module, groups)))
    except Exception as exc:  # noqa: BLE001 - serving must never raise into the caller
        _warn_once(("hf-attention", type(exc).__name__), "transformers attention call not read "
                   "(%s: %s); transformers' own attention runs", type(exc).__name__, exc)
        return False


_hf_own_sdpa = None  # transformers' own "sdpa" attention function (kept by install)
# -------------------------------------------------------------------------------- install
@dataclass
class Installed:
    """What `install` did, and how to undo it."""

    model: torch.nn.Module
    families: tuple[str, ...]
    export_dir: Path | None
    linears: list[torch.nn.Module] = field(default_factory=list)
    experts: list[torch.nn.Module] = field(default_factory=list)  # MoE experts modules routed
    mlps: list[torch.nn.Module] = field(default_factory=list)  # dense gated MLPs on tuner.moe
    routers: list[torch.nn.Module] = field(default_factory=list)  # MoE routers' F.linear routed
    norms: list[torch.nn.Module] = field(default_factory=list)  # RMSNorms folded (fold_norms)
    residual_pass: object = None  # the Inductor pass fold_norms put in (_set_residual_pass)
    sdpa: bool = False
    hf_sdpa: object = None  # transformers' AttentionInterface whose "sdpa" entry is ours
    _old_env: str | None = None
    active: bool = True

    def status(self) -> dict[str, str]:
        """{family: 'loaded: N entries from ...' / 'missing: ...' / 'refused: ...'}; moe only
        where the model has MoE experts the install routed."""
        families = [f for f in self.families if f != "moe" or self.experts or self.mlps]
        for family in families:
            runtime.resolve(family, {})  # load (and report) each family's export once
        return {f: s for f, s in runtime.status().items() if f in families}

    def hits(self) -> dict[str, dict[str, int]]:
        """{family: {exported shape key: calls served by that entry}} since install."""
        return {f: c for f, c in runtime.hit_counts().items() if f in self.families}

    def misses(self) -> dict[str, dict[str, int]]:
        """{family: {shape: calls with no exported entry (the baseline ran)}} since install."""
        return {f: c for f, c in runtime.miss_counts().items() if f in self.families}

    def residual_adds_fused(self) -> int:
        """Residual adds the fold_norms pass moved into tuned kernels (tuner.linear_add) in the
        graphs Inductor compiled since install (a graph Inductor's cache served is not counted)."""
        return self.residual_pass.fused if self.residual_pass is not None else 0

    def warmup(self, step=None, *, rows: tuple[int, ...] = ()) -> None:
        """Compile every kernel before any capture: run `step()` (e.g. one decode step) eagerly,
        and/or every installed linear and dense MLP on `rows` random rows (MoE experts modules
        take the router's choice too: `step` warms them). Call it again after a new shape."""
        with torch.no_grad():
            if step is not None:
                step()
            inputs = [(module, module.weight, module.weight.shape[1])  # a router (moe_routers)
                      for module in self.linears + self.routers]  # takes the hidden states alone
            inputs += [(mlp, mlp.down_proj.weight, mlp.down_proj.weight.shape[0])  # hidden
                       for mlp in self.mlps]
            for module, weight, width in inputs:
                for m in rows:
                    module(torch.randn(m, width, device=weight.device, dtype=weight.dtype))
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def uninstall(self) -> None:
        """Restore the model's forwards (and SDPA, and the export directory); merged gate / up
        weights stay merged (tuner.serving_mlp: the same values, the same Parameters)."""
        if not self.active:
            return
        for module in self.linears + self.routers + self.norms + self.experts + self.mlps:
            for name in ("forward", "_tuner_linear", "_tuner_norm", "_tuner_fold", "_tuner_moe",
                         "_tuner_mlp"):
                module.__dict__.pop(name, None)
        _moe_blocks.clear()
        if self.residual_pass is not None:
            serving_fusion.unset_residual_pass(self.residual_pass)
            self.residual_pass = None
        if self.sdpa:
            F.scaled_dot_product_attention = _SDPA
        if self.hf_sdpa is not None and self.hf_sdpa._global_mapping.get("sdpa") is _hf_sdpa:
            self.hf_sdpa._global_mapping["sdpa"] = _hf_own_sdpa  # unless re-registered since
        if self.export_dir is not None:
            if self._old_env is None:
                os.environ.pop("TUNER_EXPORT_DIR", None)
            else:
                os.environ["TUNER_EXPORT_DIR"] = self._old_env
            runtime.reset()
        _enabled.clear()
        _enabled.update(FAMILIES)
        self.active = False


def install(model: torch.nn.Module, export_dir: str | Path | None = None,
            families: tuple[str, ...] = FAMILIES, fold_norms: bool = False) -> Installed:
    """Route `model`'s nn.Linear modules (decode SDPA with "attention" in `families`, the experts
    of its MoE blocks with "moe": `moe_layout`) through the exported configs; returns the
    handle. `export_dir`: a folder holding <family>.json and manifest.json (default:
    $TUNER_EXPORT_DIR, else artifacts/export/<this device>/).

    `fold_norms`: fold each decoder-layer RMSNorm (tuner.layouts.norm_folds) whose every
    projection the export serves with norm-capable gemv configs into those
    projections (tuner.norm_linear, on weight copies with the norm's weight folded in), and
    have Inductor fold the residual adds after tuned projections into their kernels
    (tuner.serving_fusion; docs/ab.md, "Folded norms")."""
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        from .errors import TunerError

        raise TunerError(f"unknown families {unknown}: serving knows {', '.join(FAMILIES)}")
    handle = Installed(model, tuple(families), Path(export_dir) if export_dir else None)
    if export_dir is not None:
        handle._old_env = os.environ.get("TUNER_EXPORT_DIR")
        os.environ["TUNER_EXPORT_DIR"] = str(export_dir)
        runtime.reset()
    global _route_key
    key = repr((runtime.export_signature(), tuple(families)))  # what the routing reads
    if export_dir is None:
        # the same export as the last install: keep what is loaded; another or a rewritten one
        # (the key names the manifest's size, time and inode): load it afresh
        runtime.reset(counts_only=key == _route_key)
    _route_key = key
    _enabled.clear()
    _enabled.update(families)
    if "gemv" in families or "gemm" in families:
        for module in model.modules():
            # (a subclass with a forward of its own, e.g. a quantized linear, is not torch's)
            if (isinstance(module, torch.nn.Linear) and "forward" not in module.__dict__
                    and type(module).forward is torch.nn.Linear.forward):
                module.__dict__["_tuner_linear"] = linear_structure(module)  # `_linear_routed`
                module.forward = types.MethodType(_linear_forward, module)
                handle.linears.append(module)
        # where the export has the router's GEMM (the mode costs host time at its every call)
        for router in moe_routers(model) if MODES_TRACE else ():
            structure = linear_structure(router)
            if "forward" not in router.__dict__ and _linear_routed(
                    structure, router.weight.device.type, _route_key):
                router.__dict__["_tuner_linear"] = structure  # `_linear_routed`
                router.forward = types.MethodType(_router_forward, router)
                handle.routers.append(router)
    if "moe" in families:
        from . import serving_mlp

        _moe_blocks.clear()
        for module in model.modules():
            layout = moe_layout(module)
            if layout is not None and "forward" not in module.__dict__:
                index = len(handle.experts)
                module.forward = types.MethodType(_experts_forward, module)
                module._tuner_moe = (index, *layout)  # plain ints: constants under torch.compile
                _moe_blocks[index] = module
                handle.experts.append(module)
        for module in model.modules():
            if "forward" not in module.__dict__ and serving_mlp.route_mlp(module):
                handle.mlps.append(module)
    if fold_norms and "gemv" in families:
        serving_fusion.fold_norms(model, handle, _routed_linear, lambda structure, device_type:
                                  _linear_routed(structure, device_type, _route_key))
    if "attention" in families:
        import tuner_kernels.attention  # noqa: F401 - it keeps torch's own SDPA before the name moves

        F.scaled_dot_product_attention = _sdpa
        handle.sdpa = True
        interface = hf_attention_interface()
        if interface is not None and interface._global_mapping["sdpa"] is not _hf_sdpa:
            global _hf_own_sdpa
            _hf_own_sdpa = interface._global_mapping["sdpa"]
            interface._global_mapping["sdpa"] = _hf_sdpa
            handle.hf_sdpa = interface
    return handle


@contextlib.contextmanager
def installed(model: torch.nn.Module, export_dir: str | Path | None = None,
              families: tuple[str, ...] = FAMILIES, fold_norms: bool = False):
    """`with installed(model): ...` installs for the block and uninstalls after it."""
    handle = install(model, export_dir, families, fold_norms)
    try:
        yield handle
    finally:
        handle.uninstall()
