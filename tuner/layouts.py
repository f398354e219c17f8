"""The transformers module layouts tuner.serving routes: what a module's attributes say it
computes, read without running it (stateless; serving decides what to route from these).

- `gated_mlp_layout`: a dense decoder layer's gated MLP (gate, up and down nn.Linear, SiLU), which
  the moe kernel serves at experts 1 once its gate and up weights share one tensor;
- `moe_layout`: a fused experts module whose stored weights the moe kernel reads as they are;
  `moe_call_shape`: the moe family's shape of one call; `moe_routers`: MoE routers that are
  modules of their own, and `LinearOnWeight`, the torch function mode that reaches their GEMM;
- `norm_folds`: a decoder layer's RMSNorms and the projections that alone read their output (the
  norms `tuner.serving.install` folds into tuner.norm_linear);
- `linear_structure`, `linear_lookup_parts`, `gemv_shape`, `linear_call_shape`: an nn.Linear's
  structure, the parts of the gemv / gemm shapes its calls look up in an export, and the family
  and shape one call of m rows looks up;
- `hf_structure`, `plain_kwargs`, `decode_mask`: an attention module's head structure, whether
  the keyword arguments of an attention call leave SDPA's result unchanged, and whether its mask
  is one the decode kernel reads; `hf_attention_interface`: transformers' attention registry, if
  the process imported transformers.
"""

from __future__ import annotations

import inspect
import os
import re
import sys

import torch
import torch.nn.functional as F

__all__ = ["DTYPES", "FOLD_LAYERS", "GEMV_MAX_ROWS", "HF_PLAIN_KWARGS", "MODES_TRACE",
           "LinearOnWeight", "decode_mask", "decode_call_dims", "gated_mlp_layout", "gemv_shape",
           "hf_attention_interface", "hf_structure", "linear_call_shape", "linear_lookup_parts",
           "linear_structure", "moe_call_args", "moe_call_shape", "moe_layout", "moe_routers",
           "moe_tensors_fit", "no_autograd", "norm_folds", "plain_kwargs", "rms_norm_eps",
           "runs_on"]

DTYPES = (torch.bfloat16, torch.float16)  # the dtypes the served kernels take


def runs_on(device_type: str) -> bool:
    """Triton runs on GPU tensors, and on CPU tensors under the interpreter (tests)."""
    return device_type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def moe_layout(module) -> tuple[int, int, int] | None:
    """(experts, hidden, inter) of a transformers fused experts module whose stored weights the
    moe kernel reads as they are (gate_up_proj [E, 2 * inter, hidden], gate rows then up rows;
    down_proj [E, hidden, inter]; no biases; SiLU; not expert-parallel), else None."""
    w1, w2 = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not (isinstance(w1, torch.Tensor) and isinstance(w2, torch.Tensor)
            and w1.dim() == 3 and w2.dim() == 3):
        return None
    # the flags transformers' experts decorator sets (absent before it had them: the defaults)
    if (getattr(module, "is_transposed", False) or not getattr(module, "is_concatenated", True)
            or getattr(module, "has_bias", False) or not getattr(module, "has_gate", True)
            or getattr(module, "has_post_expert_norm", False)
            or getattr(module, "_is_expert_parallel", False)
            # a clamped SwiGLU (DeepSeek-V4's `limit`, config.swiglu_limit): not the kernel's
            or getattr(module, "limit", None) is not None
            or any(isinstance(getattr(module, name, None), torch.Tensor)
                   for name in ("gate_up_proj_bias", "down_proj_bias"))):
        return None
    act = getattr(module, "act_fn", None)
    if not (isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"):
        return None
    experts, two_inter, hidden = (int(d) for d in w1.shape)
    if two_inter % 2 or tuple(w2.shape) != (experts, hidden, two_inter // 2):
        return None
    return experts, hidden, two_inter // 2


# the forward a gated MLP must have (transformers' Llama / Qwen3 / Mistral MLP), spaces removed
_GATED_MLP_FORWARD = "self.down_proj(self.act_fn(self.gate_proj(x))*self.up_proj(x))"


def gated_mlp_layout(module) -> tuple[int, int] | None:
    """(hidden, inter) of a dense gated MLP, ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``
    (its class's forward says so, word for word, as transformers' Llama / Qwen3 / Mistral MLP),
    with SiLU and three torch nn.Linear without bias of one dtype and device: gate and up
    [inter, hidden], down [hidden, inter]; else None."""
    linears = [getattr(module, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    if not all(type(lin) is torch.nn.Linear and lin.bias is None for lin in linears):
        return None
    act = getattr(module, "act_fn", None)
    if not (isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"):
        return None
    gate, up, down = (lin.weight for lin in linears)
    inter, hidden = (int(d) for d in gate.shape)
    if (tuple(up.shape) != (inter, hidden) or tuple(down.shape) != (hidden, inter)
            or len({w.dtype for w in (gate, up, down)}) != 1
            or len({w.device for w in (gate, up, down)}) != 1):
        return None
    try:
        source = "".join(inspect.getsource(type(module).forward).split())
    except (OSError, TypeError):
        return None
    return (hidden, inter) if _GATED_MLP_FORWARD in source else None


def moe_call_args(module, x, ids, weights, hidden: int) -> bool:
    """Whether an experts call's arguments are what the moe kernel reads: x [m, hidden] in the
    experts' dtype, integer topk_ids [m, topk] and floating topk_weights of its shape."""
    return (isinstance(x, torch.Tensor) and isinstance(ids, torch.Tensor)
            and isinstance(weights, torch.Tensor) and x.dim() == 2 and ids.dim() == 2
            and weights.shape == ids.shape and ids.shape[0] == x.shape[0]
            and x.shape[1] == hidden and not ids.dtype.is_floating_point
            and weights.dtype.is_floating_point and x.dtype == module.gate_up_proj.dtype)


def moe_tensors_fit(x, w1, w2, topk_ids, topk_weights) -> bool:
    """Whether a tuner.moe call's tensors are what the kernel reads: x [m, hidden], w1 [experts,
    2 * inter, hidden] and w2 [experts, hidden, inter] of x's dtype, integer topk_ids and
    floating topk_weights [m, topk]."""
    return (w1.dtype == w2.dtype == x.dtype and x.dim() == 2 and w1.dim() == 3
            and w2.dim() == 3 and topk_ids.dim() == 2 and topk_ids.shape[0] == x.shape[0]
            and topk_weights.shape == topk_ids.shape and not topk_ids.dtype.is_floating_point
            and topk_weights.dtype.is_floating_point and w1.shape[2] == x.shape[1]
            and w1.shape[1] % 2 == 0
            and tuple(w2.shape) == (w1.shape[0], x.shape[1], w1.shape[1] // 2))


def no_autograd(*tensors) -> bool:
    """No autograd through the call: the custom ops have no backward (None: no tensor)."""
    return not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors))


def decode_call_dims(query, key, value) -> bool:
    """Whether an attention call's dimensions are a decode call's: query [b, heads, 1, d], key
    and value [b, kv_heads, kv_len, d] alike."""
    return (query.dim() == 4 and query.shape[2] == 1 and key.dim() == 4
            and value.shape == key.shape and key.shape[3] == query.shape[3])


def moe_call_shape(x, w1, topk_ids) -> dict:
    """The moe family's shape of a call (its schema's key order: the one serving's failures key
    on)."""
    return {"m": int(x.shape[0]), "experts": int(w1.shape[0]), "topk": int(topk_ids.shape[1]),
            "hidden": int(x.shape[1]), "inter": int(w1.shape[1]) // 2,
            "dtype": str(x.dtype).removeprefix("torch.")}


def moe_routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The routers of `model`'s MoE blocks that are modules of their own, not an nn.Linear: a
    block's `gate` beside experts `moe_layout` reads, holding a [experts, hidden] `weight` and no
    bias, whose forward takes the hidden states alone and computes its logits as
    ``F.linear(hidden_states, self.weight)`` (transformers 5's Qwen3-MoE / Qwen2-MoE / Mixtral
    top-k routers; not a hash router that also takes the input ids)."""
    found = []
    for block in model.modules():
        gate, experts = getattr(block, "gate", None), getattr(block, "experts", None)
        if not (isinstance(gate, torch.nn.Module) and isinstance(experts, torch.nn.Module)
                and not isinstance(gate, torch.nn.Linear)):
            continue
        layout = moe_layout(experts)
        weight = getattr(gate, "weight", None)
        if (layout is not None and isinstance(weight, torch.nn.Parameter)
                and tuple(weight.shape) == (layout[0], layout[1])
                and not isinstance(getattr(gate, "bias", None), torch.Tensor)
                and _one_input(type(gate).forward)):
            found.append(gate)
    return found


def _one_input(forward) -> bool:
    """Whether a forward takes one required argument besides self."""
    try:
        params = list(inspect.signature(forward).parameters.values())[1:]
    except (TypeError, ValueError):
        return False
    required = [p for p in params if p.default is p.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(required) == 1


# Dynamo traces a torch function mode's enter and exit from torch 2.6 on (pre-releases too)
MODES_TRACE = tuple(int(d) for d in re.match(r"(\d+)\.(\d+)", torch.__version__).groups()) >= (2, 6)


class LinearOnWeight(torch.overrides.TorchFunctionMode):
    """While active: ``F.linear(x, weight)`` on `weight` itself (no bias; plain tensors, not a
    subclass such as DTensor) calls `route(x)`; every other call runs as it is. How a router
    whose forward computes its logits so, not through an nn.Linear, reaches an installed linear
    (tuner.serving). The mode is off while its handler runs; Dynamo traces it (MODES_TRACE)."""

    def __init__(self, weight: torch.Tensor, route):
        super().__init__()
        self.weight, self.route = weight, route

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (func is F.linear and len(args) >= 2 and args[1] is self.weight
                and type(args[0]) is torch.Tensor
                and (args[2:] in ((), (None,))) and kwargs in ({}, {"bias": None})):
            return self.route(args[0])
        return func(*args, **kwargs)


# decoder layers whose forward feeds input_layernorm's output only to self_attn's q/k/v
# projections and post_attention_layernorm's only to the MLP's gate/up projections (transformers
# 5; tests/test_serving.py runs each that the installed transformers has, folded and not)
FOLD_LAYERS = ("LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer",
               "Qwen3DecoderLayer", "Qwen2MoeDecoderLayer", "Qwen3MoeDecoderLayer",
               "MixtralDecoderLayer")


def norm_folds(model: torch.nn.Module) -> list[tuple[torch.nn.Module, list[torch.nn.Linear]]]:
    """(RMSNorm module, the nn.Linear projections that alone read its output) of every decoder
    layer in FOLD_LAYERS: input_layernorm with self_attn's q/k/v projections, and
    post_attention_layernorm with a dense MLP's gate/up projections (a MoE block's router and
    experts read the norm's output too: that norm stays)."""
    folds = []
    for layer in model.modules():
        if type(layer).__name__ not in FOLD_LAYERS:
            continue
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        dense_mlp = all(isinstance(getattr(mlp, name, None), torch.nn.Linear)
                        for name in ("gate_proj", "up_proj", "down_proj"))
        for norm_name, owner, names in (
                ("input_layernorm", attn, ("q_proj", "k_proj", "v_proj")),
                ("post_attention_layernorm", mlp if dense_mlp else None, ("gate_proj", "up_proj"))):
            norm = getattr(layer, norm_name, None)
            linears = [getattr(owner, name, None) for name in names]
            if (rms_norm_eps(norm) is not None and owner is not None
                    and all(isinstance(lin, torch.nn.Linear) for lin in linears)
                    and all(lin.in_features == norm.weight.shape[0] for lin in linears)):
                folds.append((norm, linears))
    return folds


def rms_norm_eps(module) -> float | None:
    """The eps of a transformers RMSNorm module (`rms_norm`'s arithmetic: weight [hidden] times
    the normed x), else None."""
    if module is None or not type(module).__name__.endswith("RMSNorm"):
        return None
    weight = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if not (isinstance(weight, torch.Tensor) and weight.dim() == 1 and isinstance(eps, float)):
        return None
    return eps


# keyword arguments transformers passes its attention functions that do not change what SDPA
# computes (positions, cache bookkeeping; a sliding window is in the mask, flash-only lengths):
# a call with any other argument set (a position bias, soft-capping, attention sinks, one a
# later transformers adds) stays transformers'
HF_PLAIN_KWARGS = frozenset({"cache_position", "position_ids", "use_cache", "sliding_window",
                              "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k",
                              "past_key_values", "past_key_value", "layer_idx"})


def hf_structure(module, groups: int) -> tuple:
    """A transformers attention module's structure as plain ints (its config's head counts and
    its head_dim), or () where it does not say."""
    config = getattr(module, "config", None)
    heads = getattr(config, "num_attention_heads", None)
    head_dim = getattr(module, "head_dim", None)
    if not (isinstance(heads, int) and isinstance(head_dim, int) and heads % groups == 0):
        return ()
    return (("heads", heads), ("kv_heads", heads // groups), ("head_dim", head_dim))


def plain_kwargs(kwargs: dict) -> bool:
    return all(value is None or value is False or name in HF_PLAIN_KWARGS
               for name, value in kwargs.items())


def hf_attention_interface():
    """transformers' AttentionInterface, if the process has imported transformers (a model that
    dispatches attention through it); else None. Never imports transformers itself."""
    utils = sys.modules.get("transformers.modeling_utils")
    interface = getattr(utils, "AttentionInterface", None)
    mapping = getattr(interface, "_global_mapping", None)
    if not isinstance(mapping, dict) or not callable(mapping.get("sdpa")):
        return None
    return interface


def decode_mask(mask, query: torch.Tensor, key: torch.Tensor) -> bool:
    """No mask, or one the decode kernel reads: [batch|1, heads|1, 1, kv_len], bool or floating."""
    if mask is None:
        return True
    return (isinstance(mask, torch.Tensor) and mask.dim() == 4 and mask.shape[2] == 1
            and mask.shape[0] in (1, query.shape[0]) and mask.shape[1] in (1, query.shape[1])
            and mask.shape[3] == key.shape[2] and mask.device == query.device
            and (mask.dtype == torch.bool or mask.dtype.is_floating_point))

def gemv_shape(m: int, n: int, k: int, dtype, bias) -> dict:
    """The gemv family's shape of a linear call (its schema's key order; "bias": 1 with a bias)."""
    shape = {"m": int(m), "n": int(n), "k": int(k), "dtype": str(dtype).removeprefix("torch.")}
    if bias is not None:
        shape["bias"] = 1
    return shape


GEMV_MAX_ROWS = 8  # tuner_kernels.gemv serves m <= 8; more rows are gemm's


def linear_call_shape(m: int, n: int, k: int, dtype, bias) -> tuple[str, dict]:
    """The family and shape a linear call of m rows looks up (tuner.serving.linear): gemv's at
    m <= GEMV_MAX_ROWS, else an unbatched NT gemm shape (no bias key: bias is added after it)."""
    if m <= GEMV_MAX_ROWS:
        return "gemv", gemv_shape(m, n, k, dtype, bias)
    return "gemm", {"m": int(m), "n": int(n), "k": int(k),
                    "dtype": str(dtype).removeprefix("torch."), "layout": "NT"}


def linear_structure(module: torch.nn.Module) -> tuple:
    """An nn.Linear's (n, k, dtype, bias) as plain values: constants under torch.compile; of a
    router (`moe_routers`), its weight's, without bias."""
    bias = getattr(module, "bias", None)
    n, k = (int(d) for d in module.weight.shape)
    return (("n", n), ("k", k), ("dtype", str(module.weight.dtype).removeprefix("torch.")),
            ("bias", None if bias is None else 1))  # gemv's key: bias=1 or none


def linear_lookup_parts(structure: tuple) -> tuple[dict, dict]:
    """An installed linear's structure as the parts of the gemv and the gemm shapes its calls
    look up (tuner.serving.linear): gemm's is an unbatched NT shape and keys no bias (it is
    added after the kernel)."""
    gemv = dict(structure)
    gemm = {k: v for k, v in gemv.items() if k != "bias"}
    return gemv, dict(gemm, layout="NT", batch=None)
