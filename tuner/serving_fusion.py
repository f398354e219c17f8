"""Serving's fusions for a compiled step: a decoder layer's RMSNorms folded into the tuned
projections they feed (`fold_norms`), and its residual adds into the kernels of the tuned
projections before them (an Inductor post-grad pass).

tuner.serving.install(fold_norms=True) calls `fold_norms`: each folded projection calls
``tuner.norm_linear`` on a copy of its weight with the norm's weight in it (the gemv kernel
carries the norm with no more reads than the plain kernel), the norm passes its input through.
A tuned linear is an opaque custom op to Inductor, which therefore computes a decoder layer's
residual add after it (``hidden = residual + o_proj(attn)``) in a kernel of its own, or fused
into the next RMSNorm. With the norms folded into the next projections (tuner.serving.install's
fold_norms) that add would be the one kernel left between two tuned projections, so install
puts `ResidualAddPass` into ``torch._inductor.config.post_grad_custom_post_pass`` (after the
pass already there, which it calls first; `unset_residual_pass` puts that back): it rewrites
each ``add(a, tuner.linear(x, W, b))`` into ``tuner.linear_add(x, W, b, a)``, the add in the
gemv kernel's epilogue (`fuse_residual_adds`). Eagerly, and under other compile backends,
nothing changes. Importing this module registers nothing; the ops are tuner.serving's."""

from __future__ import annotations

import hashlib
import types
from pathlib import Path

import torch

from . import runtime
from .layouts import GEMV_MAX_ROWS, linear_lookup_parts, no_autograd, norm_folds, rms_norm_eps

__all__ = ["fold_norms", "fuse_residual_adds", "set_residual_pass", "unset_residual_pass"]


def fold_norms(model: torch.nn.Module, handle, routed_linear, served_rows) -> None:
    """tuner.serving.install's fold_norms, on its `handle` (an Installed): each norm of
    tuner.layouts.norm_folds whose every projection is routed and served with norm-capable
    configs (`_fold_served`), and not a dense MLP's that tuner.moe serves, is folded: at a call
    the projections' gemv entries serve (`_fold_applies`: decode rows) it passes its input
    through and its projections call tuner.norm_linear on a copy of their weight with the
    norm's weight folded in (one more copy of those weights in memory, made now: install again
    after loading other weights); at any other call (a prefill) the norm runs and the
    projections take its output, as unfolded. Then the residual adds after tuned projections go
    into their kernels under Inductor (`set_residual_pass`). `routed_linear(module, x, weight,
    bias)` is an installed linear's call (tuner.serving's), `served_rows(structure, device_type)`
    the rows ranges the export serves a linear structure at (tuner.serving._linear_routed)."""
    from tuner_kernels.gemv import fold_norm_weight

    routed = {id(lin) for lin in handle.linears}
    on_moe = {id(getattr(mlp, name, None)) for mlp in handle.mlps
              for name in ("gate_proj", "up_proj")}
    for norm, projections in norm_folds(model):
        if ("forward" in norm.__dict__ or not all(id(lin) in routed for lin in projections)
                or any(id(lin) in on_moe for lin in projections)
                or any(norm.weight.dtype != lin.weight.dtype
                       or norm.weight.device != lin.weight.device for lin in projections)
                or not all(_fold_served(lin) for lin in projections)):
            continue
        eps = rms_norm_eps(norm)
        with torch.no_grad():
            for lin in projections:  # not a submodule or buffer: no state_dict entry
                lin.__dict__["_tuner_norm"] = (norm, eps, fold_norm_weight(lin.weight, norm.weight),
                                               routed_linear)
                lin.forward = types.MethodType(_norm_linear_forward, lin)
        # the projections are not submodules here: no state_dict entry
        norm.__dict__["_tuner_fold"] = (tuple(projections), served_rows)
        norm.forward = types.MethodType(_folded_norm_forward, norm)
        handle.norms.append(norm)
    handle.residual_pass = set_residual_pass()


def _norm_linear_forward(self, x):
    """A folded projection: x is the norm's input where `_fold_applies` (the same decision the
    norm took), else the norm's output."""
    norm, eps, folded, routed_linear = self.__dict__["_tuner_norm"]
    if not _fold_applies(norm, x):  # the norm ran: the projection as installed unfolded
        return routed_linear(self, x, self.weight, self.bias)
    return torch.ops.tuner.norm_linear(x, norm.weight, eps, self.weight, self.bias, folded)


def _folded_norm_forward(self, hidden_states):
    """A folded norm: its input, where the projections apply it (`_fold_applies`), else its
    class's own forward."""
    if _fold_applies(self, hidden_states):
        return hidden_states
    return type(self).forward(self, hidden_states)


def _fold_applies(norm, x) -> bool:
    """Whether a call of a folded norm (and of its projections, on the same rows) is folded: no
    autograd records it (the ops have no backward) and x's rows are within the decode rows every
    projection's gemv entries serve (tuner.serving._linear_routed's ranges: constants of the
    install under torch.compile, guards on the rows where they are dynamic: `served_rows`)."""
    projections, served_rows = norm.__dict__["_tuner_fold"]
    if not no_autograd(x, norm.weight, *(p for lin in projections for p in (lin.weight, lin.bias))):
        return False
    k = x.shape[-1]
    return all(any(low * k <= x.numel() <= min(high, GEMV_MAX_ROWS) * k for low, high in
                   served_rows(lin.__dict__["_tuner_linear"], x.device.type))
               for lin in projections)


def _fold_served(linear_module: torch.nn.Linear) -> bool:
    """Whether the export serves a projection's decode calls with the norm carried: gemv entries
    of its structure, every one norm-capable, and no gemm entry (a gemm call would run the norm
    on its own inside the op, once per projection, where the compiled step fuses it once)."""
    from tuner_kernels import gemv

    gemv_part, gemm_part = linear_lookup_parts(linear_module.__dict__["_tuner_linear"])
    configs = runtime.matching_configs("gemv", gemv_part)
    return (bool(configs) and all(gemv.norm_capable(c) for c in configs)
            and not runtime.has_entries("gemm", gemm_part))


def fuse_residual_adds(graph: torch.fx.Graph) -> int:
    """Rewrite a post-grad FX graph: every ``add(a, b)`` of two same-shape, same-dtype tensors
    where one is a ``tuner.linear`` call used by that add alone, of a weight whose every call the
    export serves with a launch that takes the add (`_residual_served`), becomes one
    ``tuner.linear_add(x, weight, bias, other)``: a decoder layer's residual add after its o or
    down projection, done in the kernel's epilogue (no kernel of its own between two tuned
    projections). Returns how many adds it rewrote."""
    linear_op, add_op = torch.ops.tuner.linear.default, torch.ops.aten.add.Tensor
    fused = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not add_op or node.kwargs \
                or len(node.args) != 2:
            continue
        for lin, other in (node.args, node.args[::-1]):
            if (isinstance(lin, torch.fx.Node) and lin.target is linear_op and not lin.kwargs
                    and len(lin.args) == 3 and len(lin.users) == 1
                    and isinstance(other, torch.fx.Node) and _same_meta(lin, other, node)
                    and _residual_served(lin.args[1], lin.args[2])):
                with graph.inserting_before(node):
                    new = graph.call_function(torch.ops.tuner.linear_add.default,
                                              (*lin.args, other))
                new.meta.update(node.meta)
                node.replace_all_uses_with(new)
                graph.erase_node(node)
                graph.erase_node(lin)
                fused += 1
                break
    return fused


def _residual_served(weight: torch.fx.Node, bias) -> bool:
    """Whether the export serves every call of a linear of this weight (a graph node) with a
    launch that adds a residual itself: gemv configs of its (n, k, dtype, bias), every one
    residual-capable, and no gemm entry. Elsewhere the add would run after the kernel, inside
    the op: a kernel of its own, where Inductor fuses it into the next norm."""
    from tuner_kernels import gemv

    val = weight.meta.get("val") if isinstance(weight, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.dim() != 2:
        return False
    try:
        n, k = (int(d) for d in val.shape)
    except (TypeError, ValueError):  # a symbolic weight shape: no structure to look up
        return False
    structure = (("n", n), ("k", k), ("dtype", str(val.dtype).removeprefix("torch.")),
                 ("bias", None if bias is None else 1))
    gemv_part, gemm_part = linear_lookup_parts(structure)
    configs = runtime.matching_configs("gemv", gemv_part)
    return (bool(configs) and all(gemv.residual_capable(c) for c in configs)
            and not runtime.has_entries("gemm", gemm_part))


def _same_meta(*nodes: torch.fx.Node) -> bool:
    """Whether the nodes' traced values have one dtype, device and shape (no broadcast, no
    promotion), as far as the shapes are known statically."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    vals = [n.meta.get("val") for n in nodes]
    if not all(isinstance(v, torch.Tensor) for v in vals):
        return False
    first = vals[0]
    return all(v.dtype == first.dtype and v.device == first.device and v.dim() == first.dim()
               and all(statically_known_true(a == b) for a, b in zip(v.shape, first.shape))
               for v in vals[1:])


def _residual_pass_class():
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class ResidualAddPass(CustomGraphPass):
        """Inductor's post_grad_custom_post_pass while a fold_norms install is active: the
        pass that was there before (if any), then `fuse_residual_adds`."""

        def __init__(self, prior=None):
            self.prior = prior
            self.fused = 0  # adds rewritten since (Installed.residual_adds_fused)

        def __call__(self, graph: torch.fx.Graph) -> None:
            if self.prior is not None:
                self.prior(graph)
            self.fused += fuse_residual_adds(graph)

        def uuid(self):
            prior = None
            if self.prior is not None:
                prior = getattr(self.prior, "uuid", lambda: None)()
                if prior is None:  # a prior pass without an id: no FX graph caching
                    return None
            return (hashlib.sha256(Path(__file__).read_bytes()).hexdigest(), prior)

    return ResidualAddPass


def set_residual_pass():
    """Put a ResidualAddPass in Inductor's post-grad custom pass (chaining the one there);
    returns it, for `unset_residual_pass` (Installed.uninstall) to take out again."""
    import torch._inductor.config as inductor_config

    ours = _residual_pass_class()(inductor_config.post_grad_custom_post_pass)
    inductor_config.post_grad_custom_post_pass = ours
    return ours


def unset_residual_pass(ours) -> None:
    """Put back the post-grad custom pass `set_residual_pass` found, if `ours` is still there."""
    import torch._inductor.config as inductor_config

    if inductor_config.post_grad_custom_post_pass is ours:
        inductor_config.post_grad_custom_post_pass = ours.prior
