"""The GPUs a search runs on: which ones this machine shows, and refusing those it lacks.

Below both the stage front (tuner.search.stage, `tuner search`) and the supervisor (one worker a
GPU): each imports this module, and it imports neither, so the two ask the same questions one
way. Whether torch sees a GPU at all is tuner.hardware's `have_gpu`.
"""

from __future__ import annotations

import os

from ..errors import NoGPUError, TunerError
from ..hardware import have_gpu

__all__ = ["have_gpu", "parse_gpus", "require_gpu", "visible_gpus"]


def visible_gpus() -> list[str]:
    """GPU ids for the workers: CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES, else torch's count."""
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        text = os.environ.get(var)
        if text:
            return [g.strip() for g in text.split(",") if g.strip()]
    try:
        import torch

        count = torch.cuda.device_count()
    except Exception:  # noqa: BLE001
        count = 0
    return [str(i) for i in range(count)]


def require_gpu(gpus: list[str] | None = None) -> None:
    """Refuse a GPU search on a machine without a GPU, or with GPU ids it does not have."""
    if not have_gpu():
        raise NoGPUError("tuner search needs a GPU (CUDA or ROCm) to time the candidates and "
                         "none is visible here; `tuner budget SHAPES` and `tuner run TRACE` "
                         "screen shapes without one")
    if not gpus:
        return
    allowed = visible_gpus()
    missing = [g for g in gpus if g not in allowed]
    if missing:
        raise TunerError(f"--gpus {','.join(gpus)}: no GPU {', '.join(missing)} here "
                         f"(visible: {', '.join(allowed) or 'none'})")


def parse_gpus(text: str | None) -> list[str] | None:
    """'0,1' -> ['0', '1']; None stays None (every visible GPU)."""
    if text is None:
        return None
    gpus = [g.strip() for g in str(text).split(",") if g.strip()]
    if not gpus:
        raise TunerError(f"--gpus needs GPU ids like 0,1; got {text!r}")
    return gpus
