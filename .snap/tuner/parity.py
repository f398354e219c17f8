"""Output parity: what exactly does a candidate config compute the same as?

Three facts per candidate, whatever gate is used (DESIGN.md "Parity"), measured on `seeds` sets of
fresh random inputs (never zeros: families draw from normal / uniform distributions), each run
into a NaN-poisoned output so elements the kernel never writes show up:

- ``bitwise_vs_baseline``: its output bytes equal those of the path serving uses today (torch's
  linear / matmul / SDPA) on every seed: "the model computes what it computed before".
- ``parity_class``: the hash of its output on the first seed: configs with one hash form a class;
  ``default_class`` names the class of the family's default (deployed) config, and
  ``bitwise_vs_default`` says whether the candidate is in it on every seed.
- ``error_vs_reference`` / ``baseline_error_vs_reference`` / ``error_ratio``: the norm-wise relative
  error ||out - ref|| / ||ref|| against the family's fp32 (or better) reference, of the candidate
  and of the baseline path on the same inputs, and their ratio; each the worst over the seeds.
  NaN or inf in an output is an infinite error.

Gates, named for what they check (one name in every command, table and doc):
- ``baseline``: bitwise equal to the serving path. The strongest claim, rarely possible.
- ``kernel``: bitwise equal to the family's default config (same work split, same reduction
  order). A search space declares which parameters keep the reduction order (`order_params` in
  search_spaces/<family>.yaml), so a `kernel` search explores only configs that can pass.
- ``accuracy`` (the default): on every seed the candidate's error is at most ``margin`` (1.25 by
  default) times the baseline's own error on the same inputs. A serving team's honest bar: no
  worse than what it runs today, with the other two facts printed beside it.
``exact`` and ``tolerance`` are deprecated aliases of ``kernel`` and ``accuracy``.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import asdict, dataclass

from .errors import CandidateFailure, NoGPUError, TunerError, one_line, warn
from .hardware import space_backend

__all__ = ["ALIASES", "Checker", "DEFAULT_GATE", "DEFAULT_MARGIN", "DEFAULT_SEEDS", "GATES",
           "ParityFacts", "output_hash", "rel_error", "resolve_gate", "resolve_device"]

GATES = ("baseline", "kernel", "accuracy")
ALIASES = {"exact": "kernel", "tolerance": "accuracy"}
DEFAULT_GATE = "accuracy"
DEFAULT_MARGIN = 1.25
DEFAULT_SEEDS = 3
GATE_HELP = ("baseline: bitwise equal to the serving path (torch); kernel: bitwise equal to the "
             "family's default config; accuracy: error against an fp32 reference at most "
             "--parity-margin x the serving path's own, on every input seed (exact / tolerance: "
             "deprecated names of kernel / accuracy)")


def resolve_gate(name: str, *, quiet: bool = False) -> str:
    """A gate name; the deprecated aliases map to their new names with one warning."""
    text = str(name).strip().lower()
    if text in ALIASES:
        if not quiet:
            warn(f"--parity {text} is deprecated: it means --parity {ALIASES[text]}")
        return ALIASES[text]
    if text not in GATES:
        raise TunerError(f"unknown parity gate {name!r}: use {', '.join(GATES)}")
    return text


@dataclass
class ParityFacts:
    """The three parity facts of one candidate (module docstring), as plain values."""

    bitwise_vs_baseline: bool
    bitwise_vs_default: bool
    parity_class: str  # output hash (16 hex) on the first seed
    default_class: str  # the default config's hash on the first seed
    error_vs_reference: float  # worst over the seeds; inf with NaN/inf in the output
    baseline_error_vs_reference: float  # the baseline path's, worst over the same seeds
    error_ratio: float  # worst over the seeds of candidate error / baseline error
    nonfinite: int = 0  # NaN / inf / unwritten output elements, summed over the seeds
    seeds: int = 1

    def failure(self, gate: str, margin: float = DEFAULT_MARGIN) -> str:
        """Why the candidate fails `gate` ('' when it passes). NaN never passes any gate."""
        gate = resolve_gate(gate, quiet=True)
        if self.nonfinite:
            return f"{self.nonfinite} output elements are NaN/inf (unwritten or non-finite)"
        if gate == "baseline" and not self.bitwise_vs_baseline:
            return "output bytes differ from the serving path's"
        if gate == "kernel" and not self.bitwise_vs_default:
            return (f"output class {self.parity_class} differs from the default config's "
                    f"{self.default_class}")
        if gate == "accuracy" and not self.error_ratio <= margin:
            return (f"error {self.error_vs_reference:.2e} is {self.error_ratio:.2f}x the serving "
                    f"path's {self.baseline_error_vs_reference:.2e} (> {margin:g}x)")
        return ""

    def passes(self, gate: str, margin: float = DEFAULT_MARGIN) -> bool:
        return self.failure(gate, margin) == ""

    def describe(self) -> str:
        """One line with all three facts."""
        if self.bitwise_vs_baseline:
            head = "BITWISE EQUAL TO THE SERVING PATH"
        else:
            head = "bytes differ from the serving path"
        cls = (f"class {self.parity_class} (= default)" if self.bitwise_vs_default
               else f"class {self.parity_class} (default {self.default_class})")
        return (f"{head}; {cls}; error {_e(self.error_vs_reference)} vs serving path "
                f"{_e(self.baseline_error_vs_reference)} ({_ratio(self.error_ratio)})")

    def to_attrs(self) -> dict:
        """Plain JSON values (inf / NaN as None) for trial attributes and verdict columns."""
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                for k, v in asdict(self).items()}

    @classmethod
    def from_attrs(cls, attrs: dict) -> "ParityFacts":
        def num(key):
            value = attrs.get(key)
            return math.inf if value is None else float(value)

        return cls(bool(attrs["bitwise_vs_baseline"]), bool(attrs["bitwise_vs_default"]),
                   str(attrs["parity_class"]), str(attrs["default_class"]),
                   num("error_vs_reference"), num("baseline_error_vs_reference"),
                   num("error_ratio"), int(attrs.get("nonfinite") or 0),
                   int(attrs.get("seeds") or 1))


FACT_FIELDS = tuple(ParityFacts.__dataclass_fields__)


def _e(value: float) -> str:
    return "nan" if value is None or not math.isfinite(value) else f"{value:.2e}"


def _ratio(value: float) -> str:
    return "inf x" if value is None or not math.isfinite(value) else f"{value:.2f}x"


# ------------------------------------------------------------------------------------ measures
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


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class _Seed:
    inputs: dict
    reference: object  # the fp32 (or better) result
    baseline_hash: str
    baseline_error: float
    default_hash: str


class Checker:
    """Fresh inputs for `seeds` seeds, with the reference, the baseline path's output and the
    default config's output of each, computed once; `facts(config)` then judges any number of
    configs on those same inputs (a sweep or a search computes them once per shape)."""

    def __init__(self, family, shape: dict, *, seeds: int = DEFAULT_SEEDS, seed: int = 0,
                 device=None, backend: str | None = None, default_config: dict | None = None):
        import torch

        if seeds < 1:
            raise TunerError("parity needs at least one input seed")
        self.family = family
        self.shape = dict(shape)
        self.device = resolve_device(device)
        backend = backend or space_backend(self.device)
        self.default_config = dict(default_config) if default_config is not None else \
            family.default_config(self.shape, backend)
        self.seeds: list[_Seed] = []
        for i in range(seeds):
            inputs = family.make_inputs(self.shape, self.device, seed + i)
            reference = family.reference(inputs)
            baseline = family.baseline(inputs)
            _sync(self.device)
            if not bool(torch.isfinite(baseline).all()):
                raise TunerError(f"the baseline path produced NaN/inf on "
                                 f"{family.shape_key(self.shape)} (seed {seed + i})")
            self.template = baseline
            default_out = self._launch(inputs, self.default_config, "the default config")
            self.seeds.append(_Seed(inputs, reference, output_hash(baseline),
                                    rel_error(baseline, reference), output_hash(default_out)))
        self.default_class = self.seeds[0].default_hash
        self.baseline_class = self.seeds[0].baseline_hash

    @property
    def inputs(self) -> dict:
        """The first seed's inputs."""
        return self.seeds[0].inputs

    def _launch(self, inputs: dict, config: dict, what: str = "the candidate"):
        import torch

        out = torch.full_like(self.template, float("nan"))
        try:
            result = self.family.launch(inputs, dict(config), out=out)
            _sync(self.device)
        except Exception as exc:  # noqa: BLE001 - a failing config is data
            raise CandidateFailure(one_line(exc)) from None
        return out if result is None else result

    def run(self, config: dict, seed_index: int = 0):
        """Launch config on one seed's inputs into a NaN-poisoned output; returns the output."""
        return self._launch(self.seeds[seed_index].inputs, config)

    def judge(self, outputs: list) -> ParityFacts:
        """The facts of outputs computed on each seed's inputs (in seed order)."""
        import torch

        errors, ratios, hashes = [], [], []
        nonfinite = 0
        for seed, out in zip(self.seeds, outputs):
            nonfinite += int((~torch.isfinite(out)).sum()) if out.is_floating_point() else 0
            err = rel_error(out, seed.reference)
            errors.append(err)
            base = seed.baseline_error
            ratios.append(err / base if base > 0 else (1.0 if err == 0 else math.inf))
            hashes.append(output_hash(out))
        return ParityFacts(
            bitwise_vs_baseline=all(h == s.baseline_hash for h, s in zip(hashes, self.seeds)),
            bitwise_vs_default=all(h == s.default_hash for h, s in zip(hashes, self.seeds)),
            parity_class=hashes[0], default_class=self.default_class,
            error_vs_reference=max(errors),
            baseline_error_vs_reference=max(s.baseline_error for s in self.seeds),
            error_ratio=max(ratios), nonfinite=nonfinite, seeds=len(self.seeds))

    def facts(self, config: dict) -> ParityFacts:
        """Run `config` on every seed and judge it (CandidateFailure if it does not run)."""
        return self.judge([self.run(config, i) for i in range(len(self.seeds))])

    def baseline_facts(self) -> ParityFacts:
        """The facts of the serving path itself (what the baseline row of a table shows)."""
        outputs = [self.family.baseline(s.inputs) for s in self.seeds]
        _sync(self.device)
        return self.judge(outputs)
