"""Serving's dense gated MLP route: a decoder layer's MLP, down(silu(gate(x)) * up(x)), on the
moe family's kernels at experts 1, top-k 1 (tuner_kernels.moe: one launch reads the gate and
the up rows of one [2 · inter, hidden] weight and writes silu(gate) · up, a second the down
projection), where the export has an entry of its structure (`tuner harvest --gated-mlp` reads
such calls off a trace). tuner.serving.install calls `route_mlp` for each module with "moe"
among its families; uninstall removes the forward and the `_tuner_mlp` state (the merged weight
stays: its views are the gate and up parameters).

Merging moves the gate and up weights to new memory: a CUDA graph captured before it still reads
the old (freed) memory. Install before capturing, or merge first (`merge_gated_mlps`, as
`tuner ab` does when its export holds dense MLP entries, before its baseline arm is captured);
an MLP merged once is never merged again (`route_mlp` reuses its layout)."""

from __future__ import annotations

import types
from pathlib import Path

import torch

from . import runtime
from .layouts import DTYPES, gated_mlp_layout, no_autograd, runs_on

__all__ = ["dense_mlp_export", "gated_mlp_forward", "merge_gated_mlps", "merged_gate_up",
           "route_mlp"]


def dense_mlp_export(export_dir: str | Path | None) -> bool:
    """Whether an export folder holds moe entries of experts 1, top-k 1 (dense gated MLPs);
    False where it cannot be read."""
    try:
        configs = runtime.read_export(Path(export_dir) / "moe.json")["configs"]
        return any(int(c["shape"]["experts"]) == 1 and int(c["shape"]["topk"]) == 1
                   for c in configs.values())
    except Exception:  # noqa: BLE001 - no export, no moe file, another format: no dense MLPs
        return False


def merged_gate_up(module) -> torch.Tensor | None:
    """The [1, 2 · inter, hidden] tensor a gated MLP's gate and up weights are views of (gate rows
    then up rows, one contiguous block), else None."""
    gate, up = module.gate_proj.weight.data, module.up_proj.weight.data
    inter, hidden = gate.shape
    if not (gate.is_contiguous() and up.is_contiguous()
            and gate.untyped_storage().data_ptr() == up.untyped_storage().data_ptr()
            and up.storage_offset() == gate.storage_offset() + inter * hidden):
        return None
    return gate.as_strided((1, 2 * inter, hidden), (2 * inter * hidden, hidden, 1))


def _merge(module) -> torch.Tensor:
    """Move a gated MLP's gate and up weights into one [1, 2 · inter, hidden] tensor (same
    values, same Parameter objects, now views of it), unless they already are; returns it."""
    w13 = merged_gate_up(module)
    if w13 is not None:
        return w13
    gate, up = module.gate_proj.weight, module.up_proj.weight
    inter, hidden = gate.shape
    with torch.no_grad():
        w13 = gate.data.new_empty((1, 2 * inter, hidden))
        w13[0, :inter].copy_(gate.data)
        w13[0, inter:].copy_(up.data)
        gate.data, up.data = w13[0, :inter], w13[0, inter:]
    return w13


def merge_gated_mlps(model: torch.nn.Module) -> int:
    """Merge the gate and up weights of every gated MLP of `model` (`gated_mlp_layout`) that is
    not merged yet; returns how many MLPs it holds. Do it before capturing a CUDA graph of the
    model: the graph reads the weights where they were."""
    mlps = [m for m in model.modules() if gated_mlp_layout(m) is not None]
    for module in mlps:
        _merge(module)
    return len(mlps)


def route_mlp(module) -> bool:
    """Route a dense gated MLP through tuner.moe at experts 1 where the export serves its
    structure (at the rows `served_m_ranges` gives): its gate and up weights become views of one
    [1, 2 · inter, hidden] tensor (`_merge`; kept where they already are), and routing ids and
    weights (zeros, ones) are made once for the most rows served, so that a call launches
    nothing but the kernels."""
    layout = gated_mlp_layout(module)
    if layout is None:
        return False
    hidden, inter = layout
    gate, up = module.gate_proj.weight, module.up_proj.weight
    structure = {"experts": 1, "topk": 1, "hidden": hidden, "inter": inter,
                 "dtype": str(gate.dtype).removeprefix("torch.")}
    rows = tuple(runtime.served_m_ranges("moe", structure)) if runs_on(gate.device.type) else ()
    if gate.dtype not in DTYPES or not rows:
        return False
    most = max(high for _low, high in rows)
    w13 = _merge(module)
    ids = torch.zeros((most, 1), dtype=torch.int32, device=gate.device)
    ones = torch.ones((most, 1), dtype=torch.float32, device=gate.device)
    module.__dict__["_tuner_mlp"] = (hidden, rows, w13, ids, ones)
    module.forward = types.MethodType(gated_mlp_forward, module)
    return True


def gated_mlp_forward(self, x):
    """An installed gated MLP: its calls of rows the export serves (`route_mlp`) go to
    tuner.moe (experts 1: one launch for gate, up and SiLU · up, one for down); the rest, and a
    call autograd records, to the class's own forward."""
    hidden, rows, w13, ids, ones = self.__dict__["_tuner_mlp"]
    m = x.numel() // hidden
    if (x.dtype != w13.dtype or x.shape[-1] != hidden or not no_autograd(x, w13)
            or not any(low <= m <= high for low, high in rows)):
        return type(self).forward(self, x)
    w2 = self.down_proj.weight.unsqueeze(0)
    return torch.ops.tuner.moe(x.reshape(m, hidden), w13, w2, ids[:m], ones[:m]).view(x.shape)
