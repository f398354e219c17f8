"""Serving's dense gated MLP route: a decoder layer's MLP, down(silu(gate(x)) * up(x)), on the
moe family's kernels at experts 1, top-k 1 (tuner_kernels.moe: one launch reads the gate and
the up rows of one [2 · inter, hidden] weight and writes silu(gate) · up, a second the down
projection), where the export has an entry of its structure (`tuner harvest --gated-mlp` reads
such calls off a trace). tuner.serving.install calls `route_mlp` for each module with "moe"
among its families; uninstall removes the forward and the `_tuner_mlp` state (the merged weight
stays: its views are the gate and up parameters)."""

from __future__ import annotations

import types

import torch

from . import runtime
from .layouts import DTYPES, gated_mlp_layout, no_autograd, runs_on

__all__ = ["gated_mlp_forward", "route_mlp"]


def route_mlp(module) -> bool:
    """Route a dense gated MLP through tuner.moe at experts 1 where the export serves its
    structure (at the rows `served_m_ranges` gives): its gate and up weights become views of one
    [1, 2 · inter, hidden] tensor, and routing ids / weights (zeros, ones) are made once for the
    most rows served, so that a call launches nothing but the kernels."""
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
    with torch.no_grad():
        w13 = gate.data.new_empty((1, 2 * inter, hidden))
        w13[0, :inter].copy_(gate.data)
        w13[0, inter:].copy_(up.data)
        gate.data, up.data = w13[0, :inter], w13[0, inter:]
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
