"""The runtime loader: exported configs for a serving build (docs/interfaces.md "Runtime loader").

Serving code calls a family's entry point, e.g. ``kernels.gemv.linear(x, weight)``, which asks
``lookup("gemv", shape)`` for the config to launch with. The answer is:

1. the exported config for exactly this shape, else
2. the exported config of the nearest ``m`` (``kv_len`` for attention) with the same other keys
   (n, k, dtype, ...), else
3. ``None``: no measurement says a Triton config beats the path serving uses today, so the entry
   point runs that path (torch's linear / matmul / SDPA). On the H200 the families' untuned
   default configs were slower than torch on several decode shapes (BENCHMARKS.md), so falling back
   to a default Triton config would lose time the export never promised to save.

``config_for(family, shape)`` is the same lookup with the family's default config instead of
``None``, for callers that always launch the Triton kernel (benchmarks, tests).

The export (``<family>.json`` written by ``tuner export``) is read once per family from
``$TUNER_EXPORT_DIR`` or ``artifacts/export/<current device key>/``. A file whose device name,
arch, Triton version or kernel source hash does not match this process is refused: one warning,
then every shape is a miss. Every answer served from an exported entry counts as a hit of that
entry (``hit_counts()``), so a user can prove that the tuned path actually ran; misses are
counted in ``miss_counts()``.

After the first call for a shape the lookup is one dict access plus a counter increment. The
returned dict is shared: do not modify it. Importing this module needs no GPU (nor triton).
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

# Serving code imports this module: it reports through `logging` (its own logger, no handler of
# ours), never through the CLI's stderr printer, and never raises into the caller.
log = logging.getLogger("tuner.runtime")

EXPORT_ROOT = Path("artifacts") / "export"
EXPORT_FORMAT = "tuner-export/1"


def device_key_for(name: str) -> str:
    """File-system friendly device name, the same rule as DeviceProfile.key ('nvidia-h200')."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def detect_identity() -> dict | None:
    """The identity of the current GPU and software stack, or None without a GPU.

    Keys: key, name, arch, backend, torch, triton (tuner.device's detection, so names and arches
    match the device profiles). Tests monkeypatch `current_identity`.
    """
    from .device import detect, versions
    from .errors import TunerError

    try:
        fields = detect()
    except TunerError:  # no GPU visible
        return None
    found = versions()
    return {"key": device_key_for(fields["name"]), "name": fields["name"], "arch": fields["arch"],
            "backend": fields["backend"], "torch": found.get("torch", ""),
            "triton": found.get("triton", "")}


_IDENTITY: dict | None = None
_IDENTITY_DONE = False


def current_identity() -> dict | None:
    """Cached `detect_identity()`. Monkeypatch this function in tests."""
    global _IDENTITY, _IDENTITY_DONE
    if not _IDENTITY_DONE:
        _IDENTITY = detect_identity()
        _IDENTITY_DONE = True
    return _IDENTITY


def kernel_hash(family: str) -> str:
    """Source hash of a kernel family (KernelFamily.source_hash()). Monkeypatchable in tests."""
    from kernels import get_family

    return get_family(family).source_hash()


def default_config(family: str, shape: dict, backend: str) -> dict:
    """The family's default config for a shape. Monkeypatchable in tests."""
    from kernels import get_family

    return get_family(family).default_config(dict(shape), backend)


def export_dir(identity: dict | None = None) -> Path | None:
    """Where exports are read from: $TUNER_EXPORT_DIR, else artifacts/export/<device key>/."""
    env = os.environ.get("TUNER_EXPORT_DIR")
    if env:
        return Path(env)
    identity = identity if identity is not None else current_identity()
    if not identity:
        return None
    return EXPORT_ROOT / identity["key"]


def normalize_value(value):
    """torch dtypes become their name ('bfloat16'); numbers and strings stay as they are."""
    text = str(value)
    if text.startswith("torch."):
        return text[len("torch."):]
    if hasattr(value, "item") and not isinstance(value, (int, float, str)):
        return value.item()
    return value


def shape_tuple(shape: dict) -> tuple:
    return tuple(sorted((k, normalize_value(v)) for k, v in shape.items()))


def mismatches(meta: dict, identity: dict, current_kernel_hash: str) -> list[str]:
    """Which identity fields of an export file differ from this process (empty: usable)."""
    out = []
    device = meta.get("device") or {}
    versions = meta.get("versions") or {}
    if device.get("name") != identity.get("name"):
        out.append(f"device {device.get('name')!r} != {identity.get('name')!r}")
    if device.get("arch") != identity.get("arch"):
        out.append(f"arch {device.get('arch')!r} != {identity.get('arch')!r}")
    if versions.get("triton") != identity.get("triton"):
        out.append(f"triton {versions.get('triton')!r} != {identity.get('triton')!r}")
    if meta.get("kernel_hash") != current_kernel_hash:
        out.append(f"kernel hash {meta.get('kernel_hash')!r} != {current_kernel_hash!r}")
    return out


@dataclass
class LoadedExport:
    family: str
    path: Path | None
    status: str  # "loaded", "missing", "refused", "no-device", "unreadable"
    detail: str = ""
    backend: str = "cuda"
    entries: dict[tuple, tuple[str, dict]] = field(default_factory=dict)  # shape tuple -> (key, config)
    by_rest: dict[tuple, list[tuple[int, str, dict]]] = field(default_factory=dict)  # sans m -> [(m, key, config)]


def read_export(path: Path) -> dict:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or not isinstance(data.get("configs"), dict):
        raise ValueError("no 'configs' mapping")
    return data


def load_family(family: str) -> LoadedExport:
    """Read and check one family's export file (no caching; `config_for` caches)."""
    identity = current_identity()
    backend = (identity or {}).get("backend", "cuda")
    directory = export_dir(identity)
    if directory is None:
        return LoadedExport(family, None, "no-device", "no GPU visible to identify the device",
                            backend)
    path = directory / f"{family}.json"
    if not path.exists():
        return LoadedExport(family, path, "missing", f"no export at {path}", backend)
    try:
        data = read_export(path)
    except (OSError, ValueError) as exc:
        return LoadedExport(family, path, "unreadable", f"cannot read {path}: {exc}", backend)
    if identity is None:
        return LoadedExport(family, path, "no-device",
                            f"{path}: no GPU visible to check the export against", backend)
    problems = mismatches(data, identity, kernel_hash(family))
    if problems:
        return LoadedExport(family, path, "refused", f"refusing {path}: " + "; ".join(problems),
                            backend)
    loaded = LoadedExport(family, path, "loaded", f"{len(data['configs'])} entries from {path}",
                          backend)
    for key, entry in data["configs"].items():
        shape = entry["shape"]
        config = dict(entry["config"])
        loaded.entries[shape_tuple(shape)] = (key, config)
        vary = next((k for k in NEAREST_KEYS if k in shape), None)
        if vary is not None:
            rest = shape_tuple({k: v for k, v in shape.items() if k != vary})
            loaded.by_rest.setdefault(rest, []).append((int(shape[vary]), key, config))
    for items in loaded.by_rest.values():
        items.sort(key=lambda item: item[0])
    return loaded


_LOADED: dict[str, LoadedExport] = {}
_CACHE: dict[tuple, tuple[dict | None, str | None]] = {}  # (family, raw shape items) -> (config, entry key)
_HITS: dict[str, dict[str, int]] = {}
_MISSES: dict[str, dict[tuple, int]] = {}


def _loaded(family: str) -> LoadedExport:
    loaded = _LOADED.get(family)
    if loaded is None:
        loaded = load_family(family)
        _LOADED[family] = loaded
        if loaded.status != "loaded":  # refused, missing, unreadable, no-device: one warning
            log.warning("%s; %s calls run the baseline path", loaded.detail, family)
    return loaded


NEAREST_KEYS = ("m", "kv_len")  # the dimension that varies call to call, per family


def resolve(family: str, shape: dict) -> tuple[dict | None, str | None]:
    """(config, entry key), or (None, None) on a miss, without counting. Exact, then nearest."""
    loaded = _loaded(family)
    wanted = shape_tuple(shape)
    hit = loaded.entries.get(wanted)
    if hit is not None:
        return hit[1], hit[0]
    vary = next((k for k in NEAREST_KEYS if k in shape), None)
    if vary is not None:
        rest = tuple(item for item in wanted if item[0] != vary)
        candidates = loaded.by_rest.get(rest)
        if candidates:
            value = int(shape[vary])
            # nearest value; on a tie the smaller one (its tiles fit the smaller problem)
            _, key, config = min(candidates, key=lambda item: (abs(item[0] - value), item[0]))
            return config, key
    return None, None


def lookup(family: str, shape: dict) -> dict | None:
    """The exported config for `shape` (exact or nearest), or None: then run the baseline path."""
    cache_key = (family, tuple(shape.items()))
    found = _CACHE.get(cache_key)
    if found is None:
        found = resolve(family, shape)
        _CACHE[cache_key] = found
    config, entry = found
    if entry is not None:
        counts = _HITS.setdefault(family, {})
        counts[entry] = counts.get(entry, 0) + 1
    else:
        counts = _MISSES.setdefault(family, {})
        counts[cache_key[1]] = counts.get(cache_key[1], 0) + 1
    return config


def config_for(family: str, shape: dict) -> dict:
    """`lookup`, with the family's default config on a miss (for callers that always launch)."""
    config = lookup(family, shape)
    if config is None:
        normalized = {k: normalize_value(v) for k, v in shape.items()}
        config = default_config(family, normalized, _loaded(family).backend)
    return config


def hit_counts() -> dict[str, dict[str, int]]:
    """{family: {exported shape key: calls served by that entry}}."""
    return {family: dict(counts) for family, counts in _HITS.items()}


def miss_counts() -> dict[str, dict[str, int]]:
    """{family: {shape: calls with no exported entry (run untuned)}} (shape as 'k=v,...')."""
    return {family: {",".join(f"{k}={normalize_value(v)}" for k, v in shape): n
                     for shape, n in counts.items()}
            for family, counts in _MISSES.items()}


def status() -> dict[str, str]:
    """{family: 'loaded: 7 entries from ...' / 'refused: ...' / 'missing: ...'} for loaded families."""
    return {family: f"{loaded.status}: {loaded.detail}" for family, loaded in _LOADED.items()}


def reset(counts_only: bool = False) -> None:
    """Forget hit counts; unless `counts_only`, also the loaded exports and the shape cache."""
    global _IDENTITY, _IDENTITY_DONE
    _HITS.clear()
    _MISSES.clear()
    if not counts_only:
        _LOADED.clear()
        _CACHE.clear()
        _IDENTITY = None
        _IDENTITY_DONE = False
