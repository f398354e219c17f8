"""Triton kernel families and their registry.

Every family module (gemv, gemm, attention) defines ``FAMILY = KernelFamily(...)`` with the same
small interface, so the pipeline (bench, parity, search, rank, export) never special-cases one:

- ``make_inputs(shape, device, seed)``: fresh random inputs (never zeros) for a shape dict such as
  ``{"m": 1, "n": 4096, "k": 4096, "dtype": "bfloat16"}``; returns a dict of tensors.
- ``launch(inputs, config, out=None)``: run the Triton kernel with a config dict; writes into
  ``out`` when given (so parity can poison it first) and returns the output tensor.
- ``default_config(shape, backend)``: the config used when nothing is tuned.
- ``baseline(inputs)``: the path serving uses today (e.g. torch's linear / cuBLAS / hipBLASLt).
- ``reference(inputs)``: a high-precision (fp32 or better) result for tolerance parity.
- ``bytes_moved(shape)`` / ``flops(shape)``: each input read once, output written once.
- ``shape_from_row(row)``: a ShapeTable row (pandas Series or dict) to a shape dict, or None
  when the row does not belong to this family.
- ``shape_key(shape)``: a stable string such as ``m=1,n=4096,k=4096,dtype=bfloat16``.
- ``source_files``: files whose bytes make up the kernel source hash in exports.
"""

from __future__ import annotations

import hashlib
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

FAMILY_MODULES = {
    "gemv": "kernels.gemv",
    "gemm": "kernels.gemm",
    "attention": "kernels.attention",
}


@dataclass(frozen=True)
class KernelFamily:
    name: str
    make_inputs: Callable[..., dict]
    launch: Callable[..., Any]
    default_config: Callable[[dict, str], dict]
    baseline: Callable[[dict], Any]
    reference: Callable[[dict], Any]
    bytes_moved: Callable[[dict], int]
    flops: Callable[[dict], int]
    shape_from_row: Callable[[Any], dict | None]
    shape_key: Callable[[dict], str]
    source_files: tuple[Path, ...] = field(default_factory=tuple)

    def source_hash(self) -> str:
        h = hashlib.sha256()
        for path in self.source_files:
            h.update(Path(path).read_bytes())
        return h.hexdigest()[:16]


def family_names() -> list[str]:
    return list(FAMILY_MODULES)


def get_family(name: str) -> KernelFamily:
    """Import a family module lazily (it imports triton) and return its FAMILY."""
    from tuner.errors import TunerError

    if name not in FAMILY_MODULES:
        raise TunerError(f"unknown kernel family {name!r}; known: {', '.join(FAMILY_MODULES)}")
    module = importlib.import_module(FAMILY_MODULES[name])
    return module.FAMILY


def format_shape_key(shape: dict, order: tuple[str, ...]) -> str:
    """Shared helper for ``shape_key``: 'a=1,b=2' in a fixed order, skipping absent keys."""
    return ",".join(f"{k}={shape[k]}" for k in order if k in shape)
