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
    order_params: [BLOCK_K, SPLIT_K]   # params that change the summation order (output bytes)

`space_for(family, backend, shape)` gives the parameter lists; `configs(...)` enumerates the
grid and keeps configs that satisfy every constraint; `check(config, shape)` says why a config
from outside (an export file, a command line) is not one of them.

The YAML files ship inside the installed package (`search_spaces` is a package whose data are
the YAML files) and are read through `importlib.resources`, so a plain `pip install .` finds
them wherever it runs. `check_shape(family, shape)` is the shape schema of each family
(docs/interfaces.md "Shape dicts").
"""

from __future__ import annotations

import functools
import importlib.resources
import itertools
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from .errors import TunerError

__all__ = ["BACKENDS", "COMMON_MEASURE_KEYS", "MEASURE_KEYS", "SHAPE_DTYPES", "SHAPE_LAYOUTS",
           "SPACES_PACKAGE", "SearchSpace", "check_shape", "family_names", "load_raw",
           "measure_keys", "served_shape", "space_for", "with_row_measure_keys"]

SPACES_PACKAGE = "search_spaces"  # the top-level search_spaces/ directory, a package of YAML data
BACKENDS = ("cuda", "hip", "dcu")

_SAFE_FUNCS = {"min": min, "max": max, "abs": abs, "ceil": math.ceil, "log2": math.log2,
               "cdiv": lambda a, b: -(-a // b)}


@dataclass(frozen=True)
class SearchSpace:
    family: str
    backend: str
    params: dict[str, list]
    constraints: tuple[str, ...]
    # Parameters whose value changes the summation order, so the output bytes: configs that agree
    # with the default config on these share its parity class (`--parity kernel`).
    order_params: tuple[str, ...] = ()

    def within_class_of(self, default: dict) -> "SearchSpace":
        """This space with the order parameters fixed at `default`'s values: the configs a
        `--parity kernel` search can find (the default's class, as far as the space declares)."""
        params = {k: ([default[k]] if k in self.order_params and k in default else list(v))
                  for k, v in self.params.items()}
        return SearchSpace(self.family, self.backend, params, self.constraints, self.order_params)

    def allows(self, config: dict, shape: dict) -> bool:
        scope = {**_SAFE_FUNCS, **shape, **config}
        for expr in self.constraints:
            try:
                if not eval(_compiled(expr), {"__builtins__": {}}, scope):  # noqa: S307 - our data
                    return False
            except Exception as exc:
                raise TunerError(
                    f"search space {self.family}/{self.backend}: constraint {expr!r} failed: {exc}"
                ) from None
        return True

    def check(self, config, shape: dict) -> str:
        """'' when `config` is one of this space's configs for `shape`, else why not (one line):
        not a mapping, unknown or missing parameters, a value that is not a number of the
        parameter's list (strings, NaN, booleans, BLOCK_K=3), or a constraint it fails."""
        if not isinstance(config, dict):
            return f"config is not a mapping: {config!r}"[:200]
        unknown = sorted(str(k) for k in config if k not in self.params)
        if unknown:
            return f"unknown parameter(s) {', '.join(unknown)} for {self.family}/{self.backend}"
        missing = [k for k in self.params if k not in config]
        if missing:
            return f"missing parameter(s) {', '.join(missing)}"
        for name, value in config.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
                return f"{name}={value!r} is not a number"
            if value not in self.params[name]:
                return (f"{name}={value!r} is not in the {self.family}/{self.backend} space "
                        f"({', '.join(map(str, self.params[name]))})")
        for expr in self.constraints:
            try:
                if not SearchSpace(self.family, self.backend, self.params, (expr,)).allows(
                        config, shape):
                    return f"fails the {self.family}/{self.backend} constraint {expr!r}"
            except TunerError as exc:
                return str(exc)
        return ""

    def configs(self, shape: dict) -> list[dict]:
        names = list(self.params)
        out = []
        for values in itertools.product(*(self.params[n] for n in names)):
            config = dict(zip(names, values))
            if self.allows(config, shape):
                out.append(config)
        return out

    def known(self, configs: list[dict], shape: dict, default: dict) -> list[dict]:
        """`configs` (partial, e.g. tuner_kernels.candidates' lists) completed with the default's
        values, in order: those this space allows for `shape`, without duplicates or the
        default itself. Only the space's parameters are kept."""
        def full(config: dict) -> dict:
            return {p: config.get(p, default.get(p)) for p in self.params}

        seen, out = {_key(full(default))}, []
        for config in configs:
            candidate = full(config)
            key = _key(candidate)
            if key in seen or any(v not in self.params[p] for p, v in candidate.items()):
                continue
            if self.allows(candidate, shape):
                seen.add(key)
                out.append(candidate)
        return out

    def size(self) -> int:
        return math.prod(len(v) for v in self.params.values())


def _key(config: dict) -> tuple:
    return tuple(sorted(config.items()))


@functools.lru_cache(maxsize=None)
def _compiled(expr: str):
    """A constraint's code object, compiled once (enumerating a space evaluates each constraint
    for every combination of the grid: compiling the text each time was most of the cost)."""
    try:
        return compile(expr, "<constraint>", "eval")
    except SyntaxError:
        return expr  # eval() of the text raises the SyntaxError, and allows() says which constraint


def family_names() -> list[str]:
    """The families with a search space in the installed package (one YAML file each)."""
    root = importlib.resources.files(SPACES_PACKAGE)
    return sorted(entry.name[:-len(".yaml")] for entry in root.iterdir()
                  if entry.name.endswith(".yaml") and entry.is_file())


def load_raw(family: str, directory: Path | None = None) -> dict:
    """The parsed YAML of a family's space: from the installed `search_spaces` package, or from
    `directory` (a folder of <family>.yaml files, for tests and experiments)."""
    if directory is not None:
        source = Path(directory) / f"{family}.yaml"
    else:
        source = importlib.resources.files(SPACES_PACKAGE) / f"{family}.yaml"
    if not source.is_file():
        known = ", ".join(family_names()) if directory is None else f"files in {directory}"
        raise TunerError(f"no search space for family {family!r}: {source} is missing "
                         f"(known: {known})")
    try:
        data = yaml.safe_load(source.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise TunerError(f"cannot parse {source}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("params"), dict):
        raise TunerError(f"{source}: a search space needs a 'params' mapping")
    return data


def space_for(family: str, backend: str, directory: Path | None = None) -> SearchSpace:
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
    # order params of another backend's knobs (TMA on hip) do not apply here
    order = tuple(k for k in data.get("order_params") or () if k in params)
    return SearchSpace(family, backend, params, tuple(constraints), order)


# ---------------------------------------------------------------------------- shape schemas
# The shape dict of each kernel family (docs/interfaces.md "Shape dicts and kernel families"):
# required keys, optional keys, and the dtypes and layouts the kernels serve.
SHAPE_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "gemv": (("m", "n", "k", "dtype"), ("bias",)),
    "gemm": (("m", "n", "k", "dtype", "layout"), ("batch",)),
    "attention": (("batch", "heads", "kv_heads", "kv_len", "head_dim", "dtype"), ()),
    "moe": (("m", "experts", "topk", "hidden", "inter", "dtype"), ()),
}
# Keys that say how the baseline was measured, not which call is served: accepted in a shape
# dict (search and rank measure with them), never in an export's entries (`served_shape`).
# attention's baseline_kv_heads: a call harvest regrouped from a repeated KV cache, whose
# baseline repeats the cache as the trace did (tuner_kernels.attention.shape_from_row).
MEASURE_KEYS: dict[str, tuple[str, ...]] = {"attention": ("baseline_kv_heads",)}
# And of every family: baseline_compiled = 1, the call's trace is of a torch.compile'd step (the
# ShapeTable's traced_compiled), so rank times its baseline under torch.compile, as that step
# runs it (tuner.bench.compiled_baseline).
COMMON_MEASURE_KEYS: tuple[str, ...] = ("baseline_compiled",)


def measure_keys(family: str) -> tuple[str, ...]:
    """The measurement keys a shape dict of `family` may hold."""
    return MEASURE_KEYS.get(family, ()) + COMMON_MEASURE_KEYS


def with_row_measure_keys(shape: dict | None, row) -> dict | None:
    """`shape` (a family's shape_from_row of the ShapeTable `row`) with the measurement keys the
    table's family-independent columns give: baseline_compiled when the row's trace was a
    torch.compile'd step. None stays None."""
    if shape is None:
        return None
    try:
        compiled = int(row.get("traced_compiled")) == 1
    except (TypeError, ValueError):  # absent, empty (pd.NA) or not a number
        compiled = False
    return {**shape, "baseline_compiled": 1} if compiled else shape


def served_shape(family: str, shape: dict) -> dict:
    """The shape dict of the call serving looks up: `shape` without the family's measurement
    keys (what an export stores and the runtime loader indexes), and without a "bias": 0 (a
    linear without bias is keyed without the key, as serving looks it up)."""
    drop = measure_keys(family)
    return {k: v for k, v in shape.items() if k not in drop and not (k == "bias" and v == 0)}


SHAPE_DTYPES = ("bfloat16", "float16")  # tuner_kernels.common.DTYPES (not imported: it pulls in torch)
SHAPE_LAYOUTS = ("NT", "NN")


def check_shape(family: str, shape) -> str:
    """'' when `shape` is a well-formed shape dict of `family`, else why not (one line): unknown
    or missing keys, sizes that are not positive integers, an unknown dtype or layout."""
    if family not in SHAPE_KEYS:
        return f"no shape schema for family {family!r}"
    if not isinstance(shape, dict):
        return f"shape is not a mapping: {shape!r}"[:200]
    required, optional = SHAPE_KEYS[family]
    unknown = sorted(str(k) for k in shape if k not in required + optional + measure_keys(family))
    if unknown:
        return f"unknown shape key(s) {', '.join(unknown)} for {family}"
    missing = [k for k in required if k not in shape]
    if missing:
        return f"shape lacks {', '.join(missing)}"
    for key, value in shape.items():
        if key == "dtype":
            if value not in SHAPE_DTYPES:
                return f"dtype {value!r} is not one of {', '.join(SHAPE_DTYPES)}"
        elif key == "layout":
            if value not in SHAPE_LAYOUTS:
                return f"layout {value!r} is not one of {', '.join(SHAPE_LAYOUTS)}"
        elif key == "bias":
            if isinstance(value, bool) or value not in (0, 1) or not isinstance(value, int):
                return f"bias={value!r} is not 0 or 1"
        elif key == "baseline_compiled":
            if isinstance(value, bool) or value != 1 or not isinstance(value, int):
                return f"baseline_compiled={value!r} is not 1 (leave it out for an eager baseline)"
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"{key}={value!r} is not a positive integer"
    if family == "attention" and shape["heads"] % shape["kv_heads"]:
        return f"heads {shape['heads']} is not a multiple of kv_heads {shape['kv_heads']}"
    if family == "moe" and shape["topk"] > shape["experts"]:
        return f"topk {shape['topk']} exceeds experts {shape['experts']}"
    repeated = shape.get("baseline_kv_heads")
    if family == "attention" and repeated is not None and not (
            repeated > shape["kv_heads"] and repeated % shape["kv_heads"] == 0
            and shape["heads"] % repeated == 0):
        return (f"baseline_kv_heads {repeated} is not a multiple of kv_heads {shape['kv_heads']} "
                f"above it that divides heads {shape['heads']}")
    return ""
