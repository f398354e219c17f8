"""Triton kernel families and their registry.

Every family module (gemv, gemm, attention, moe) defines ``FAMILY = KernelFamily(...)``; the pipeline
(bench, parity, search, rank, export, serving) only ever talks to a family through it, so no stage
special-cases one. Shared host-side helpers live in `tuner_kernels.common`, the byte / flop model in
`tuner_kernels.cost`. This module imports neither torch nor triton (a family module does, when it is
first asked for), and nothing in `tuner_kernels` imports the `tuner` pipeline at module level.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

__all__ = ["COMMON_SOURCES", "FAMILY_MODULES", "KernelFamily", "code_digest", "family_names",
           "format_shape_key", "get_family"]

FAMILY_MODULES = {
    "gemv": "tuner_kernels.gemv",
    "gemm": "tuner_kernels.gemm",
    "attention": "tuner_kernels.attention",
    "moe": "tuner_kernels.moe",
}

_HERE = Path(__file__).resolve().parent
# Modules every family's kernels and host code depend on: part of every family's source hash, so
# a change in them makes the runtime loader refuse exports measured with the old code.
COMMON_SOURCES = (_HERE / "__init__.py", _HERE / "common.py", _HERE / "cost.py")


@dataclass(frozen=True)
class KernelFamily:
    """The contract between a kernel family and the pipeline. Every callable is pure host code
    around the family's Triton kernels; shapes are plain dicts (docs/interfaces.md).

    - ``make_inputs(shape, device, seed) -> dict``: fresh random inputs (never zeros) for a shape;
      the same seed and device give the same tensors. ``device="meta"`` gives shapes only.
    - ``launch(inputs, config, out=None) -> Tensor``: run the Triton kernels with a config dict;
      writes into ``out`` when given (parity poisons it first) and returns the output.
    - ``launch_plan(inputs, config, out=None, backend=None) -> (out, [KernelCall])``: the kernel
      calls ``launch`` would make, without launching (works on meta tensors: offline compiles).
    - ``default_config(shape, backend, sm_count=None) -> dict``: the config used when nothing is
      tuned (the "deployed" config whose output defines the ``kernel`` parity class). ``backend``
      is cuda, hip or dcu; ``sm_count`` the device's multiprocessors (None: the current GPU's,
      where the heuristic uses it at all).
    - ``baseline(inputs) -> Tensor``: the path serving uses today (torch / cuBLAS / hipBLASLt).
    - ``reference(inputs) -> Tensor``: a high-precision (fp32 or better) result.
    - ``bytes_moved(shape)`` / ``flops(shape)``: each input read once, the output written once
      (tuner_kernels.cost).
    - ``shape_from_row(row) -> dict | None``: a ShapeTable row to this family's shape dict, or
      None when the row is not this family's.
    - ``shape_key(shape) -> str``: a stable string such as ``m=1,n=4096,k=4096,dtype=bfloat16``.
    - ``source_files``: every file whose code makes up the kernel source hash in exports: the
      family's module and every kernels module it uses (COMMON_SOURCES at least). The hash reads
      their code, not their comments, docstrings or layout (`code_digest`): an export survives
      an edit of those, and no edit of a statement.
    """

    name: str
    make_inputs: Callable[..., dict]
    launch: Callable[..., Any]
    launch_plan: Callable[..., tuple]
    default_config: Callable[..., dict]
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
            h.update(code_digest(Path(path).read_bytes()))
        return h.hexdigest()[:16]


def code_digest(source: bytes) -> bytes:
    """A Python module's code as a canonical string: its syntax tree without the docstrings of
    the module, its classes and functions, without comments, line numbers or formatting
    (ast.dump). Two sources with the same digest run the same statements."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree, annotate_fields=False, include_attributes=False).encode()


def family_names() -> list[str]:
    return list(FAMILY_MODULES)


def get_family(name: str) -> KernelFamily:
    """Import a family module lazily (it imports triton) and return its FAMILY."""
    if name not in FAMILY_MODULES:
        from tuner.errors import TunerError  # a user's typo: one clear line from the CLI

        raise TunerError(f"unknown kernel family {name!r}; known: {', '.join(FAMILY_MODULES)}")
    module = importlib.import_module(FAMILY_MODULES[name])
    return module.FAMILY


def format_shape_key(shape: dict, order: tuple[str, ...]) -> str:
    """Shared helper for ``shape_key``: 'a=1,b=2' in a fixed order, skipping absent keys."""
    return ",".join(f"{k}={shape[k]}" for k in order if k in shape)
