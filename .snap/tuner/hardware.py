"""What backend and device this is: the ground floor of the measuring core (docs/interfaces.md).

Detection only, no measurement: whether torch sees a GPU (`have_gpu`, `require_gpu`), whether it
is a ROCm build (`is_hip`), the identity fields of a device (`detect`: backend, vendor, name,
arch, warp size, multiprocessor count, L2 bytes, whether it is a Hygon DCU), the search-space
backend of a torch.device (`space_backend`: cuda, hip or dcu), its L2 size (`l2_cache_bytes`)
and the library versions (`versions`). It imports nothing of the project but `tuner.errors`, and
torch only inside its functions: every floor above (the timer, the read-only kernels, the read
curve, the device profile, parity, the timing protocol) may import it, and it imports none of
them. The multiprocessor count a kernel launch uses is `tuner_kernels.common.sm_count` (kernels import
nothing of the pipeline).
"""

from __future__ import annotations

from .errors import NoGPUError, TunerError

__all__ = ["DCU_ARCHS", "FALLBACK_L2_BYTES", "detect", "detect_fields", "have_gpu", "is_hip",
           "l2_cache_bytes", "require_gpu", "space_backend", "versions"]

# Hygon DCU arch names (ROCm, wave64). Upstream Triton does not know them.
DCU_ARCHS = ("gfx926", "gfx928", "gfx936", "gfx938")
FALLBACK_L2_BYTES = 64 << 20  # what a device that reports no L2 size (and the CPU) is taken to have


def have_gpu() -> bool:
    """Does torch see a CUDA or ROCm device here?"""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - no torch, or a broken driver: no GPU
        return False


def require_gpu(advice: str = ""):
    """torch, when it sees a CUDA or ROCm GPU; else a NoGPUError that says so (and `advice`:
    what to do instead, e.g. which spec profiles screen without one)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        raise TunerError("torch is not installed") from None
    if not torch.cuda.is_available():
        raise NoGPUError("no CUDA or ROCm GPU is visible to torch (torch.cuda.is_available() is "
                         "False)" + (f"; {advice}" if advice else ""))
    return torch


def is_hip() -> bool:
    """Whether this torch is a ROCm (HIP) build: AMD GPUs and Hygon DCUs."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return bool(getattr(torch.version, "hip", None))


def versions() -> dict:
    """python, torch, cuda, hip and triton versions (those installed)."""
    import platform

    out = {"python": platform.python_version()}
    try:
        import torch

        out["torch"] = torch.__version__
        out["cuda"] = torch.version.cuda or ""
        out["hip"] = getattr(torch.version, "hip", None) or ""
    except ImportError:
        pass
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        pass
    return out


def detect_fields(props, hip_version: str | None, cuda_version: str | None) -> dict:
    """Map a torch device-properties object (or anything with the same attributes) and torch's
    version strings to the identity fields of a DeviceProfile. Pure: testable without a GPU.

    props needs `name`, `multi_processor_count`, and where available `L2_cache_size`,
    `warp_size`, `gcnArchName` (ROCm) or `major`/`minor` (CUDA)."""
    name = str(getattr(props, "name", "") or "unknown GPU").strip()
    if hip_version:
        backend = "hip"
        arch_full = str(getattr(props, "gcnArchName", "") or "")
        arch = arch_full.split(":")[0].strip() or "gfx-unknown"
        is_dcu = arch in DCU_ARCHS
        vendor = "hygon" if is_dcu else "amd"
        default_warp = 64
    elif cuda_version or hasattr(props, "major"):
        backend = "cuda"
        arch = f"sm{int(getattr(props, 'major', 0))}{int(getattr(props, 'minor', 0))}"
        is_dcu = False
        vendor = "nvidia"
        default_warp = 32
    else:
        raise TunerError("cannot tell the GPU backend: torch reports neither HIP nor CUDA")
    warp = getattr(props, "warp_size", None)
    return {
        "backend": backend,
        "vendor": vendor,
        "name": name,
        "arch": arch,
        "warp_size": int(warp) if warp else default_warp,
        "multiprocessors": int(getattr(props, "multi_processor_count", 0) or 0),
        "l2_bytes": int(getattr(props, "L2_cache_size", 0) or 0),
        "is_dcu": is_dcu,
    }


def detect(device: int | None = None) -> dict:
    """Identity fields of the visible GPU (no measurement). Raises NoGPUError without one."""
    torch = require_gpu()
    index = torch.cuda.current_device() if device is None else int(device)
    props = torch.cuda.get_device_properties(index)
    return detect_fields(props, getattr(torch.version, "hip", None), torch.version.cuda)


def space_backend(device) -> str:
    """The search-space backend of a torch.device: 'cuda', 'hip', or 'dcu' (a Hygon DCU: hip
    narrowed); 'cuda' for a CPU device (the Triton interpreter runs the CUDA space's configs)."""
    if device.type != "cuda":
        return "cuda"
    fields = detect(device.index)
    return "dcu" if fields["is_dcu"] else fields["backend"]


def l2_cache_bytes(device) -> int:
    """L2 bytes of a torch.device (FALLBACK_L2_BYTES where it reports none, and off the GPU)."""
    if device.type != "cuda":
        return FALLBACK_L2_BYTES
    props = require_gpu().cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 0) or 0) or FALLBACK_L2_BYTES
