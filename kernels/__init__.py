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


def run_without_interpreter(function: str, request: dict):
    """Call ``function`` ('module:name', taking and returning plain JSON data) in a child Python
    without TRITON_INTERPRET and return its result.

    For compiling kernels for real targets (triton.compile) from a process that imported Triton
    under TRITON_INTERPRET=1: there triton.language's own jit functions are interpreter objects
    that the compiler cannot use. The child prints its result as the last line of stdout.
    """
    import json
    import os
    import subprocess
    import sys

    module, name = function.split(":")
    root = str(Path(__file__).resolve().parent.parent)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    code = (f"import json, sys; from {module} import {name}; "
            f"print(json.dumps({name}(json.loads(sys.stdin.read()))))")
    proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(request),
                          capture_output=True, text=True, env=env, cwd=root, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"compile child failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def format_shape_key(shape: dict, order: tuple[str, ...]) -> str:
    """Shared helper for ``shape_key``: 'a=1,b=2' in a fixed order, skipping absent keys."""
    return ",".join(f"{k}={shape[k]}" for k in order if k in shape)
