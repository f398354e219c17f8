"""What a tuned kernel must beat: the strongest path a serving team could run instead.

A result counts against the strongest baseline a user could pick with a flag or a library call,
named beside the figure. Two kinds live here, one implementation each:

**Step baselines** (`tuner ab --baseline`, `tuner rank --baseline`): how the decode step (or one
linear call) runs before any tuning.

| name | what runs |
| --- | --- |
| ``eager`` | the model's own code, op by op |
| ``compile`` | ``torch.compile`` (Inductor, default mode): the elementwise work between the linears fuses; each matmul goes to the vendor library |
| ``max-autotune`` | ``torch.compile(mode="max-autotune-no-cudagraphs")``: Inductor also times every matmul shape against its Triton templates and the vendor library and keeps the fastest; its own CUDA graphs stay off, so the harness's one graph holds the step (``mode="max-autotune"`` adds Inductor's graph trees, which cannot run inside another capture) |

The strongest that runs on a machine is ``max-autotune`` wherever Inductor can generate GPU code
(a CUDA or ROCm GPU with Triton), else ``eager``.

**Decode attention** over a grouped KV cache (fewer KV heads than query heads): servers run the
grouped call (FlashAttention / FlashInfer decode read each KV head once), never a copy of the
cache per query head as transformers' ``repeat_kv`` makes before SDPA. The baseline here is SDPA on
the grouped cache in the fastest of its forms on this device: ``gqa`` (``enable_gqa=True``) or
``packed`` (the query heads of one KV head stacked as query rows, so one KV head is read once per
group, as FlashInfer's decode does), each under every SDPA backend that accepts the call; the
fastest by the timing protocol (tuner.bench) wins, and its name goes beside the figure.
FlashInfer itself is not a dependency (its wheels are built per CUDA and torch version); where it
is not installed the A/B says so.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

from .errors import TunerError, one_line

__all__ = ["BASELINES", "COMPILE_MODES", "SDPAForm", "check_baseline", "compile_step",
           "eager_share_note", "fastest_sdpa_form", "grouped_sdpa", "grouped_sdpa_op",
           "parse_baselines", "sdpa_forms", "strongest_available"]

BASELINES = ("eager", "compile", "max-autotune")
# torch.compile's mode per baseline (None: not compiled)
COMPILE_MODES = {"eager": None, "compile": "default", "max-autotune": "max-autotune-no-cudagraphs"}


def check_baseline(name: str) -> str:
    """`name` if it is a step baseline, else a TunerError naming the choices."""
    if name not in BASELINES:
        raise TunerError(f"unknown baseline {name!r}: choose from {', '.join(BASELINES)}")
    return name


def parse_baselines(text: str) -> list[str]:
    """'eager,max-autotune' -> ['eager', 'max-autotune'] (each checked, no repeats)."""
    names = [part.strip() for part in str(text).split(",") if part.strip()]
    if not names:
        raise TunerError(f"--baseline needs one or more of {', '.join(BASELINES)}")
    out = []
    for name in names:
        check_baseline(name)
        if name in out:
            raise TunerError(f"--baseline names {name!r} twice")
        out.append(name)
    return out


def strongest_available(gpu: bool) -> str:
    """The strongest step baseline this process can run: 'max-autotune' on a GPU where Inductor
    generates code (Triton importable), else 'eager'."""
    if not gpu:
        return "eager"
    try:
        from torch.utils._triton import has_triton

        return "max-autotune" if has_triton() else "eager"
    except Exception:  # noqa: BLE001 - a torch without the helper: Inductor cannot be relied on
        return "eager"


def compile_step(fn, baseline: str, backend: str = "inductor"):
    """`fn` as the baseline runs it: itself (eager) or its torch.compile'd form (static shapes;
    the mode only where the backend is Inductor, which alone has modes)."""
    mode = COMPILE_MODES[check_baseline(baseline)]
    if mode is None:
        return fn
    import torch

    options = {"mode": mode} if backend == "inductor" else {}
    return torch.compile(fn, backend=backend, dynamic=False, **options)


# ------------------------------------------------------------------- grouped decode attention
@dataclass(frozen=True)
class SDPAForm:
    """One way to run a grouped decode SDPA call: `layout` 'gqa' or 'packed', under the SDPA
    `backend` (a torch.nn.attention.SDPBackend name, e.g. 'EFFICIENT_ATTENTION')."""

    layout: str
    backend: str

    def __str__(self) -> str:
        return f"SDPA {self.layout} ({self.backend.lower()})"


def _sdpa_backend(name: str):
    from torch.nn.attention import SDPBackend

    return getattr(SDPBackend, name)


def _row_mask(mask):
    """SDPA's attn_mask for one query row: [b|1, h|1, kv_len] (the family's form) as
    [b|1, h|1, 1, kv_len]; a 4-D mask or None as it is. A per-head mask cannot be packed."""
    return mask.unsqueeze(2) if mask is not None and mask.dim() == 3 else mask


def grouped_sdpa(inputs: dict, form: SDPAForm):
    """The attention family's decode call (q [b, h, d], k / v [b, kv_heads, kv_len, d], optional
    mask and scale, as tuner_kernels.attention.make_inputs gives) on the grouped cache in `form`;
    returns [b, h, d]. No copy of the cache is made in either layout."""
    import torch
    from torch.nn.attention import sdpa_kernel

    from tuner_kernels.attention import _TORCH_SDPA

    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    b, h, d = q.shape
    kv_heads = k.shape[1]
    mask = _row_mask(inputs.get("mask"))
    scale = inputs.get("scale")
    with sdpa_kernel([_sdpa_backend(form.backend)]):
        if form.layout == "packed":
            if mask is not None and mask.shape[1] != 1:
                raise ValueError("a per-head mask cannot be packed")
            group = h // kv_heads
            out = _TORCH_SDPA(q.reshape(b, kv_heads, group, d), k, v, attn_mask=mask, scale=scale)
            return out.reshape(b, h, d)
        out = _TORCH_SDPA(q.unsqueeze(2), k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        return out.squeeze(2) if out.dim() == 4 else out


_OP = None


def grouped_sdpa_op():
    """torch.ops.tuner.grouped_sdpa(q [b, h, 1, d], k, v, mask, scale, layout, backend) -> [b, h,
    1, d]: `grouped_sdpa` as a custom op (registered on first use), opaque to torch.compile, so
    the chosen SDPA backend runs as chosen inside a compiled step, and a profiler trace records
    the grouped decode call itself (q with its heads, k / v with their KV heads: tuner.harvest
    reads it as the call tuner.serving's decode attention replaces)."""
    global _OP
    if _OP is None:
        import torch

        @torch.library.custom_op("tuner::grouped_sdpa", mutates_args=(), schema=(
            "(Tensor q, Tensor k, Tensor v, Tensor? mask, float? scale, str layout, str backend)"
            " -> Tensor"))
        def _op(q, k, v, mask, scale, layout, backend):
            out = grouped_sdpa({"q": q[:, :, 0], "k": k, "v": v, "mask": mask, "scale": scale},
                               SDPAForm(layout, backend))
            return out.unsqueeze(2)

        @_op.register_fake
        def _(q, k, v, mask, scale, layout, backend):
            return torch.empty_like(q, memory_format=torch.contiguous_format)

        _OP = torch.ops.tuner.grouped_sdpa
    return _OP


def sdpa_forms() -> list[SDPAForm]:
    """Every form to try: both layouts under each SDPA backend this torch names."""
    from torch.nn.attention import SDPBackend

    names = [n for n in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")
             if hasattr(SDPBackend, n)]
    return [SDPAForm(layout, name) for layout in ("packed", "gqa") for name in names]


def fastest_sdpa_form(shape: dict, *, masked: bool = True, device=None, groups: int = 7,
                      replays: int = 20) -> tuple[SDPAForm, list[dict]]:
    """The fastest grouped SDPA form for an attention-family decode shape (batch, heads, kv_heads,
    kv_len, head_dim, dtype) on this device, by the timing protocol (tuner.timing: graph
    replays, inputs rotated past the L2): each form that runs and matches the fp32 reference within the
    family's SDPA error is timed; `masked` adds a boolean mask of the static-cache kind (the
    first three quarters of the slots valid). Returns (form, one record per form tried: form,
    median_us or the reason it was left out). Raises TunerError when no form runs."""
    import torch

    from tuner_kernels.attention import make_inputs, reference

    from .hardware import l2_cache_bytes
    from .timing import cold_sets, set_bytes, time_callable

    dev = torch.device(device or "cuda")
    shape = {k: v for k, v in shape.items() if k != "baseline_kv_heads"}
    kv_len = int(shape["kv_len"])

    def with_mask(inputs: dict) -> dict:
        if masked:
            valid = torch.zeros(1, 1, kv_len, dtype=torch.bool, device=dev)
            valid[..., : max(1, (3 * kv_len) // 4)] = True
            inputs = dict(inputs, mask=valid.expand(int(shape["batch"]), 1, kv_len))
        return inputs

    first = with_mask(make_inputs(shape, dev, 0))
    count = cold_sets(set_bytes(first), l2_cache_bytes(dev))
    sets = [first] + [with_mask(make_inputs(shape, dev, i)) for i in range(1, count)]
    want = reference(first)
    records, best = [], None
    for form in sdpa_forms():
        try:
            with warnings.catch_warnings():  # torch says why each backend declines, per call
                warnings.simplefilter("ignore", UserWarning)
                got = grouped_sdpa(first, form).float()
        except Exception as exc:  # noqa: BLE001 - a backend that does not take the call
            records.append({"form": str(form), "skipped": one_line(exc, 120)})
            continue
        error = float((got - want).abs().max())
        if not math.isfinite(error) or error > 0.05:
            records.append({"form": str(form), "skipped": f"max error {error:.3g} vs fp32"})
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                timing = time_callable(lambda inputs, f=form: grouped_sdpa(inputs, f), sets,
                                       groups=groups, replays=replays)
        except Exception as exc:  # noqa: BLE001 - e.g. a backend that cannot be captured
            records.append({"form": str(form), "skipped": one_line(exc, 120)})
            continue
        records.append({"form": str(form), "median_us": timing.median_us,
                        "spread_pct": timing.spread_pct})
        if best is None or timing.median_us < best[1]:
            best = (form, timing.median_us)
    if best is None:
        raise TunerError("no SDPA form runs this grouped decode call: "
                         + "; ".join(f"{r['form']}: {r.get('skipped')}" for r in records))
    return best[0], records


def eager_share_note(step: str, threshold, eager_step_us: list[float], studies: int) -> str:
    """A warning line where a share-of-the-step bar (`threshold`, tuner.units.Threshold) meets
    a compiled `step` baseline and studies of an eager trace (their step times `eager_step_us`,
    of `studies` in all): their step is the eager one, longer than the compiled step the
    candidates are measured against, so the bar is a larger share of the step that counts.
    '' otherwise."""
    from .units import pct

    eager = [us for us in eager_step_us if us > 0]
    if step == "eager" or threshold.share is None or not eager:
        return ""
    return (f"{len(eager)} of {studies} studies are of an eager trace (step {max(eager):.0f} "
            f"us): the bar {threshold.target()} is of that step, not of the shorter {step} step "
            f"the candidates must beat; trace the {step} step, or give the bar as a time per "
            f"token (--min-saving {threshold.share * 4000:g}us is {pct(threshold.share)} of a "
            f"4 ms step)")
