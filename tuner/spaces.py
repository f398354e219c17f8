"""Search spaces: YAML data files under search_spaces/, one per kernel family.

Format (search_spaces/<family>.yaml)::

    family: gemv
    params:                      # shared by every backend
      ROWS_PER_BLOCK: [1, 2, 4, 8]
      num_warps: [2, 4, 8]
    backends:
      cuda: {}                   # adds or overrides params for CUDA
      hip:                       # AMD Instinct (wave64); AMD-only Triton knobs live here only
        params:
          waves_per_eu: [0, 1, 2]
      dcu:                       # Hygon DCU: a narrowing of hip (applied on top of hip)
        params:
          num_stages: [1, 2]
    constraints:                 # Python expressions over params and the shape (m, n, k, ...)
      - "BLOCK_K * SPLIT_K <= max(k, BLOCK_K)"

`space_for(family, backend, shape)` gives the parameter lists; `configs(...)` enumerates the
grid and keeps configs that satisfy every constraint.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from .errors import TunerError

SPACES_DIR = Path(__file__).resolve().parent.parent / "search_spaces"
BACKENDS = ("cuda", "hip", "dcu")

_SAFE_FUNCS = {"min": min, "max": max, "abs": abs, "ceil": math.ceil, "log2": math.log2,
               "cdiv": lambda a, b: -(-a // b)}


@dataclass(frozen=True)
class SearchSpace:
    family: str
    backend: str
    params: dict[str, list]
    constraints: tuple[str, ...]

    def allows(self, config: dict, shape: dict) -> bool:
        scope = {**_SAFE_FUNCS, **shape, **config}
        for expr in self.constraints:
            try:
                if not eval(expr, {"__builtins__": {}}, scope):  # noqa: S307 - our own data files
                    return False
            except Exception as exc:
                raise TunerError(
                    f"search space {self.family}/{self.backend}: constraint {expr!r} failed: {exc}"
                ) from None
        return True

    def configs(self, shape: dict) -> list[dict]:
        names = list(self.params)
        out = []
        for values in itertools.product(*(self.params[n] for n in names)):
            config = dict(zip(names, values))
            if self.allows(config, shape):
                out.append(config)
        return out

    def size(self) -> int:
        return math.prod(len(v) for v in self.params.values())


def load_raw(family: str, directory: Path = SPACES_DIR) -> dict:
    path = Path(directory) / f"{family}.yaml"
    if not path.exists():
        raise TunerError(f"no search space for family {family!r}: {path} is missing")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise TunerError(f"cannot parse {path}: {exc}") from None
    if not isinstance(data, dict) or "params" not in data:
        raise TunerError(f"{path}: a search space needs a 'params' mapping")
    return data


def space_for(family: str, backend: str, directory: Path = SPACES_DIR) -> SearchSpace:
    """The space for a backend: 'cuda', 'hip', or 'dcu' (hip narrowed by the dcu section)."""
    if backend not in BACKENDS:
        raise TunerError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    data = load_raw(family, directory)
    params = {k: list(v) for k, v in data["params"].items()}
    sections = data.get("backends") or {}
    chain = ["hip", "dcu"] if backend == "dcu" else [backend]
    constraints = list(data.get("constraints") or [])
    for name in chain:
        section = sections.get(name) or {}
        for k, v in (section.get("params") or {}).items():
            params[k] = list(v)
        for k in section.get("drop") or []:
            params.pop(k, None)
        constraints += list(section.get("constraints") or [])
    for k, v in params.items():
        if not v:
            raise TunerError(f"search space {family}/{backend}: parameter {k} has no values")
    return SearchSpace(family, backend, params, tuple(constraints))
