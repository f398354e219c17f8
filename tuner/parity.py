"""Output parity: does a candidate config compute the same thing as the path it replaces?

Two modes (DESIGN.md):
- ``exact``: the sha256 of the candidate's output bytes equals that of the reference path on the
  same inputs (``reference="default"``: the family's default config; ``"baseline"``: torch's path).
  Bit-identical output: the config can replace the reference without any numerical review.
- ``tolerance``: the norm-wise relative error ||out - ref|| / ||ref|| against the family's fp32 (or
  better) reference is within the output dtype's bound.

Bounds (norm-wise relative error; u = unit roundoff of the output dtype):
- bfloat16: 1e-2. u = 2^-8 = 3.9e-3; rounding an exact result to bf16 alone gives up to u per
  element (about u/sqrt(3) = 2.3e-3 norm-wise for uniform rounding error). 1e-2 is ~2.5 u: room
  for a different fp32 summation order (error ~ sqrt(k) * 2^-24, negligible) and for paths that
  round an intermediate to bf16 once, but a wrong element (a missed k block, a wrong row) on a
  realistic shape moves the error far above it.
- float16: 1e-3 (u = 2^-11 = 4.9e-4, the same ~2 u argument).
- float32: 1e-5 (fp32 accumulation over k up to ~1e5 with TF32 off).

Every check draws fresh random inputs (never zeros: families draw from a normal distribution),
fills the output with NaN before the run so elements the kernel never writes show up, and fails
any NaN or inf in the output.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from .errors import CandidateFailure, NoGPUError, TunerError, one_line

REL_ERR_BOUNDS = {"bfloat16": 1e-2, "float16": 1e-3, "float32": 1e-5}


@dataclass
class ParityResult:
    passed: bool
    mode: str  # "exact" or "tolerance"
    output_hash: str  # sha256 of the candidate output bytes (first 16 hex)
    reference_hash: str  # hash of the reference path's output on the same inputs
    rel_err: float  # ||out - ref_fp32|| / ||ref_fp32||
    reason: str  # "" when passed, else why

    @property
    def parity_class(self) -> str:
        """'exact', 'tolerance' (passes the bound, different bytes) or 'mismatch'."""
        if not self.finite_and_bounded:
            return "mismatch"
        return "exact" if self.output_hash == self.reference_hash else "tolerance"

    finite_and_bounded: bool = True


def output_hash(tensor) -> str:
    """sha256 (first 16 hex) of a tensor's bytes, in row-major order, with its shape and dtype."""
    import torch

    flat = tensor.detach().contiguous().cpu()
    data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    h = hashlib.sha256()
    h.update(f"{tuple(flat.shape)}|{flat.dtype}|".encode())
    h.update(data)
    return h.hexdigest()[:16]


def rel_error(out, reference) -> float:
    """||out - reference|| / ||reference|| in float64 (inf when out has NaN/inf)."""
    import torch

    out64 = out.detach().to(torch.float64)
    ref64 = reference.detach().to(device=out64.device, dtype=torch.float64)
    if out64.shape != ref64.shape:
        raise TunerError(f"output shape {tuple(out64.shape)} != reference {tuple(ref64.shape)}")
    if not bool(torch.isfinite(out64).all()):
        return float("inf")
    denom = float(torch.linalg.vector_norm(ref64))
    diff = float(torch.linalg.vector_norm(out64 - ref64))
    return diff / denom if denom > 0 else (0.0 if diff == 0 else float("inf"))


def bound_for(dtype) -> float:
    name = str(dtype).removeprefix("torch.")
    if name not in REL_ERR_BOUNDS:
        raise TunerError(f"no tolerance bound for dtype {name}")
    return REL_ERR_BOUNDS[name]


def resolve_device(device=None):
    """The given device; else the current GPU; else the CPU when TRITON_INTERPRET=1."""
    import torch

    if device is not None:
        return torch.device(device if not isinstance(device, int) else f"cuda:{device}")
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if os.environ.get("TRITON_INTERPRET") == "1":
        return torch.device("cpu")
    raise NoGPUError("parity checks run kernels: no CUDA or ROCm GPU is visible "
                     "(set TRITON_INTERPRET=1 to run small shapes on the CPU)")


def _poisoned_like(template):
    import torch

    return torch.full_like(template, float("nan"))


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Checker:
    """Fresh inputs, the fp32 reference and the reference path's hash for one shape; `check`
    then judges any number of configs on those same inputs (a sweep computes them once)."""

    def __init__(self, family, shape: dict, *, reference="default", seed: int = 0, device=None,
                 backend: str | None = None):
        self.family = family
        self.shape = dict(shape)
        self.device = resolve_device(device)
        self.inputs = family.make_inputs(self.shape, self.device, seed)
        self.ref32 = family.reference(self.inputs)
        self.reference = reference
        if reference == "baseline":
            ref_out = family.baseline(self.inputs)
        elif reference == "default":
            if backend is None:
                backend = _backend_for(self.device)
            config = family.default_config(self.shape, backend)
            template = family.baseline(self.inputs)
            ref_out = family.launch(self.inputs, config, out=_poisoned_like(template))
        elif isinstance(reference, dict):
            template = family.baseline(self.inputs)
            ref_out = family.launch(self.inputs, dict(reference), out=_poisoned_like(template))
        else:
            raise TunerError(f"unknown parity reference {reference!r}")
        _sync(self.device)
        import torch

        if not bool(torch.isfinite(ref_out).all()):
            raise TunerError(f"the parity reference path ({reference}) produced NaN/inf on "
                             f"{family.shape_key(self.shape)}")
        self.template = ref_out
        self.reference_hash = output_hash(ref_out)
        self.reference_rel_err = rel_error(ref_out, self.ref32)
        self.bound = bound_for(ref_out.dtype)

    def run(self, config: dict):
        """Launch config into a NaN-poisoned output; returns the output tensor."""
        out = _poisoned_like(self.template)
        try:
            result = self.family.launch(self.inputs, dict(config), out=out)
            _sync(self.device)
        except Exception as exc:  # noqa: BLE001 - a failing config is data
            raise CandidateFailure(one_line(exc)) from None
        return out if result is None else result

    def judge(self, result, mode: str = "exact") -> ParityResult:
        import torch

        if mode not in ("exact", "tolerance"):
            raise TunerError(f"parity mode must be 'exact' or 'tolerance', got {mode!r}")
        h = output_hash(result)
        nonfinite = int((~torch.isfinite(result)).sum()) if result.is_floating_point() else 0
        err = rel_error(result, self.ref32)
        bounded = nonfinite == 0 and err <= self.bound
        if nonfinite:
            reason = (f"{nonfinite} of {result.numel()} output elements are NaN/inf "
                      f"(unwritten or non-finite)")
        elif mode == "exact" and h != self.reference_hash:
            reason = f"hash {h} differs from the {self._ref_name()} {self.reference_hash} " \
                     f"(rel err {err:.2e})"
        elif mode == "tolerance" and not bounded:
            reason = f"rel err {err:.2e} > {self.bound:.0e}"
        else:
            reason = ""
        return ParityResult(passed=reason == "", mode=mode, output_hash=h,
                            reference_hash=self.reference_hash, rel_err=err, reason=reason,
                            finite_and_bounded=bounded)

    def check(self, config: dict, mode: str = "exact") -> ParityResult:
        return self.judge(self.run(config), mode)

    def _ref_name(self) -> str:
        return self.reference if isinstance(self.reference, str) else "reference config"


def _backend_for(device) -> str:
    if device.type != "cuda":
        return "cuda"  # interpreter runs: the default config of the CUDA space
    from .bench import backend_name

    return backend_name(device)


def check(family, shape: dict, config: dict, *, mode: str = "exact", reference="default",
          seed: int = 0, device=None) -> ParityResult:
    """Parity of one config on fresh inputs drawn with `seed` (see the module docstring)."""
    return Checker(family, shape, reference=reference, seed=seed, device=device).check(config, mode)
