"""Device detection and measurement: the DeviceProfile contract (DESIGN.md).

A DeviceProfile is saved as JSON under artifacts/devices/<name>.json. Measured profiles come from
`tuner device` on the GPU; `SPEC_PROFILES` holds published datasheet peaks, labelled as such,
for screening on a machine without the GPU.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from .errors import TunerError

DEVICES_DIR = Path("artifacts") / "devices"

# Hygon DCU arch names (ROCm, wave64). Upstream Triton does not know them.
DCU_ARCHS = ("gfx926", "gfx928", "gfx936", "gfx938")


@dataclass
class DeviceProfile:
    backend: str  # "cuda" or "hip"
    vendor: str  # "nvidia", "amd", "hygon"
    name: str  # e.g. "NVIDIA H200"
    arch: str  # "sm90", "gfx942", "gfx936"
    warp_size: int
    multiprocessors: int
    l2_bytes: int
    read_bandwidth_bytes_per_s: float  # measured (or spec) read bandwidth
    bf16_matmul_flops_per_s: float  # measured (or spec) dense bf16 matmul rate
    source: str = "measured"  # "measured" or "spec"
    versions: dict = field(default_factory=dict)  # torch, triton, cuda/hip, driver
    measured_at: str = ""  # ISO time, empty for spec profiles
    is_dcu: bool = False

    @property
    def key(self) -> str:
        """File-system friendly name, e.g. 'nvidia-h200'."""
        return re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> "DeviceProfile":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise TunerError(f"device profile has unknown fields: {', '.join(sorted(unknown))}")
        return cls(**data)


# Published datasheet peaks (dense, no sparsity). Labelled source="spec": leads, not measurements.
SPEC_PROFILES: dict[str, DeviceProfile] = {
    "h100": DeviceProfile("cuda", "nvidia", "NVIDIA H100 80GB HBM3 (spec)", "sm90", 32, 132,
                          50 * 2**20, 3.35e12, 989e12, source="spec"),
    "h200": DeviceProfile("cuda", "nvidia", "NVIDIA H200 (spec)", "sm90", 32, 132,
                          60 * 2**20, 4.8e12, 989e12, source="spec"),
    "a100": DeviceProfile("cuda", "nvidia", "NVIDIA A100-SXM4-80GB (spec)", "sm80", 32, 108,
                          40 * 2**20, 2.039e12, 312e12, source="spec"),
    "mi300x": DeviceProfile("hip", "amd", "AMD Instinct MI300X (spec)", "gfx942", 64, 304,
                            4 * 2**20, 5.3e12, 1307e12, source="spec"),
}


def save_profile(profile: DeviceProfile, directory: str | Path = DEVICES_DIR) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{profile.key}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(profile.to_json() + "\n")
    tmp.replace(path)
    return path


def load_profile(name_or_path: str | Path, directory: str | Path = DEVICES_DIR) -> DeviceProfile:
    """Load a profile from a JSON path, a saved profile key, or a spec name (h100, h200, mi300x)."""
    text = str(name_or_path)
    path = Path(text)
    if not path.exists():
        candidate = Path(directory) / f"{text}.json"
        if candidate.exists():
            path = candidate
        elif text.lower() in SPEC_PROFILES:
            return dataclasses.replace(SPEC_PROFILES[text.lower()])
        else:
            known = ", ".join(sorted(SPEC_PROFILES))
            raise TunerError(
                f"unknown device profile {text!r}: give a JSON file from `tuner device`, "
                f"a saved profile under {directory}, or a spec name ({known})")
    try:
        return DeviceProfile.from_dict(json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError) as exc:
        raise TunerError(f"cannot read device profile {path}: {exc}") from None
