"""The runtime loader: exported configs for a serving build (docs/interfaces.md "Runtime loader").

Serving code calls a family's entry point, e.g. ``tuner_kernels.gemv.linear(x, weight)``, which asks
``lookup("gemv", shape)`` for the config to launch with. The answer is:

1. the exported config for exactly this shape, else
2. the exported config of the nearest ``m`` bucket (``M_BUCKET_RULE``: powers of two; then the
   nearest m) at most ``M_NEAREST_OCTAVES`` buckets away, or the nearest ``kv_len`` for
   attention, with the same other keys (n, k, dtype, ...), else
3. ``None``: no measurement says a Triton config beats the path serving uses today, so the entry
   point runs that path (torch's linear / matmul / SDPA). On the H200 the families' untuned
   default configs were slower than torch on several decode shapes (BENCHMARKS.md), so falling back
   to a default Triton config would lose time the export never promised to save.

``config_for(family, shape)`` is the same lookup with the family's default config instead of
``None``, for callers that always launch the Triton kernel (benchmarks, tests).

The export (``<family>.json`` written by ``tuner export``) is read once per family from
``$TUNER_EXPORT_DIR`` or ``artifacts/export/<current device key>/``. A file whose device name,
arch, Triton version or kernel source hash does not match this process, or that
``manifest.json`` beside it does not vouch for (its sha256, kernel hash, device and versions), is
refused: one warning, then every shape is a miss. Every entry is checked once, at load, against
the family's shape schema and search space (tuner.spaces: known parameters, numbers from the
space's lists, its constraints); a bad entry is dropped with one warning naming it and the rest
of the file is used. Temp files of an interrupted export (``.<name>.<random>.tmp``) are never
read. Nothing here raises into the caller: any failure is a miss (the baseline path) and a
logged warning. Every answer served from an exported entry counts as a hit of that
entry (``hit_counts()``), so a user can prove that the tuned path actually ran; misses are
counted in ``miss_counts()``.

After the first call for a shape the lookup is one dict access plus a counter increment. The
returned dict is shared: do not modify it. Importing this module needs no GPU (nor triton).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["EXPORT_FORMAT", "EXPORT_ROOT", "MANIFEST", "MAX_EXPORT_BYTES", "M_BUCKET_RULE",
           "M_NEAREST_OCTAVES", "NEAREST_KEYS", "m_bucket",
           "LoadedExport", "config_for", "current_identity", "default_config", "detect_identity",
           "device_key_for", "entry_problem", "export_dir", "export_signature", "has_entries",
           "hit_counts",
           "matching_configs", "served_m_ranges",
           "kernel_hash", "load_family", "lookup", "manifest_problems", "mismatches",
           "miss_counts", "normalize_value", "read_export", "reset", "resolve", "resolved",
           "shape_tuple", "space_backend", "status"]

# Serving code imports this module: it reports through `logging` (its own logger, no handler of
# ours), never through the CLI's stderr printer, and never raises into the caller.
log = logging.getLogger("tuner.runtime")

EXPORT_ROOT = Path("artifacts") / "export"
EXPORT_FORMAT = "tuner-export/1"
MANIFEST = "manifest.json"
MAX_EXPORT_BYTES = 64 << 20  # an export file larger than this is not one of ours


def device_key_for(name: str) -> str:
    """File-system friendly device name, the same rule as DeviceProfile.key ('nvidia-h200')."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def detect_identity() -> dict | None:
    """The identity of the current GPU and software stack, or None without a GPU.

    Keys: key, name, arch, backend, torch, triton (tuner.hardware's detection, the device
    profiles' own, so names and arches match them). Tests monkeypatch `current_identity`.
    """
    from .errors import TunerError
    from .hardware import detect, versions

    try:
        fields = detect()
    except TunerError:  # no GPU visible
        return None
    found = versions()
    return {"key": device_key_for(fields["name"]), "name": fields["name"], "arch": fields["arch"],
            "backend": fields["backend"], "torch": found.get("torch", ""),
            "triton": found.get("triton", ""), "is_dcu": bool(fields.get("is_dcu"))}


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
    from tuner_kernels import get_family

    return get_family(family).source_hash()


def default_config(family: str, shape: dict, backend: str) -> dict:
    """The family's default config for a shape. Monkeypatchable in tests."""
    from tuner_kernels import get_family

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


def export_signature() -> str:
    """The export an install's routing reads: the folder loaded from (`export_dir`), its
    manifest's size, modification time and inode (a rewritten export is another export: the
    export writes the manifest last, through a new file); None parts where there is none."""
    folder = written = None
    try:
        folder = export_dir()
        stat = (folder / "manifest.json").stat()
        written = (stat.st_size, stat.st_mtime_ns, stat.st_ino)
    except Exception:  # noqa: BLE001 - no manifest (or no device to name the folder): no export
        pass
    return repr((str(folder), written))


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
    device = meta.get("device") if isinstance(meta.get("device"), dict) else {}
    versions = meta.get("versions") if isinstance(meta.get("versions"), dict) else {}
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


def _read_json(path: Path) -> tuple[dict, bytes]:
    """(document, its bytes) of a JSON export file; ValueError / OSError for anything else."""
    if not path.is_file():
        raise ValueError("not a regular file")
    if path.stat().st_size > MAX_EXPORT_BYTES:
        raise ValueError(f"larger than {MAX_EXPORT_BYTES >> 20} MiB")
    data = path.read_bytes()
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"not JSON text ({type(exc).__name__})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"not a JSON object but {type(doc).__name__}")
    return doc, data


def read_export(path: Path) -> dict:
    doc, _ = _read_json(Path(path))
    if not isinstance(doc.get("configs"), dict):
        raise ValueError("no 'configs' mapping")
    return doc


def manifest_problems(directory: Path, family: str, doc: dict, data: bytes) -> list[str]:
    """Why manifest.json beside a family file does not vouch for it (empty: it does): missing or
    unreadable, no entry for the family, another file name, sha256 of the bytes read, kernel
    hash, device or versions that differ from the family file's."""
    path = directory / MANIFEST
    if not path.exists():
        return [f"no {MANIFEST} beside it (an export writes it last)"]
    try:
        manifest, _ = _read_json(path)
    except (OSError, ValueError) as exc:
        return [f"{path} is unreadable ({exc})"]
    families = manifest.get("families")
    entry = families.get(family) if isinstance(families, dict) else None
    if not isinstance(entry, dict):
        return [f"{MANIFEST} lists no {family} file"]
    problems = []
    if entry.get("file", f"{family}.json") != f"{family}.json":
        problems.append(f"{MANIFEST} names {entry.get('file')!r} for {family}")
    digest = hashlib.sha256(data).hexdigest()
    if entry.get("sha256") != digest:
        problems.append(f"sha256 {digest[:16]}... is not the one in {MANIFEST} "
                        f"({str(entry.get('sha256'))[:16]}...): the file changed after export")
    if entry.get("kernel_hash") != doc.get("kernel_hash"):
        problems.append(f"{MANIFEST} kernel hash {entry.get('kernel_hash')!r} != the file's "
                        f"{doc.get('kernel_hash')!r}")
    for key in ("versions", "device"):
        if key in manifest and manifest.get(key) != doc.get(key):
            problems.append(f"{MANIFEST} {key} {manifest.get(key)!r} != the file's "
                            f"{doc.get(key)!r}")
    return problems


def space_backend(identity: dict | None, doc: dict) -> str:
    """The search-space section the entries are checked against: dcu on a Hygon DCU, else the
    device's backend (cuda / hip)."""
    if identity and identity.get("is_dcu"):
        return "dcu"
    backend = (identity or {}).get("backend") or (doc.get("device") or {}).get("backend")
    return backend if backend in ("cuda", "hip") else "cuda"


def entry_problem(family: str, key, entry, space) -> str:
    """'' for a usable entry of a family file, else why it is dropped."""
    from .spaces import check_shape

    if not isinstance(entry, dict):
        return f"the entry is not a mapping ({type(entry).__name__})"
    shape, config = entry.get("shape"), entry.get("config")
    why = check_shape(family, shape)
    if why:
        return f"shape: {why}"
    return space.check(config, shape)


def load_family(family: str) -> LoadedExport:
    """Read and check one family's export file (no caching; `config_for` caches). Never raises."""
    try:
        return _load_family(family)
    except Exception as exc:  # noqa: BLE001 - a serving process must never go down for this
        return LoadedExport(family, None, "unreadable", f"cannot load the {family} export: "
                            f"{type(exc).__name__}: {exc}")


def _load_family(family: str) -> LoadedExport:
    identity = current_identity()
    backend = (identity or {}).get("backend", "cuda")
    directory = export_dir(identity)
    if directory is None:
        return LoadedExport(family, None, "no-device", "no GPU visible to identify the device",
                            backend)
    directory = Path(directory)
    path = directory / f"{family}.json"
    if not path.exists():
        return LoadedExport(family, path, "missing", f"no export at {path}", backend)
    try:
        data, raw = _read_json(path)
        if not isinstance(data.get("configs"), dict):
            raise ValueError("no 'configs' mapping")
    except (OSError, ValueError) as exc:
        return LoadedExport(family, path, "unreadable", f"cannot read {path}: {exc}", backend)
    if identity is None:
        return LoadedExport(family, path, "no-device",
                            f"{path}: no GPU visible to check the export against", backend)
    problems = mismatches(data, identity, kernel_hash(family))
    problems += manifest_problems(directory, family, data, raw)
    if problems:
        return LoadedExport(family, path, "refused", f"refusing {path}: " + "; ".join(problems),
                            backend)
    from .spaces import served_shape, space_for

    try:
        space = space_for(family, space_backend(identity, data))
    except Exception as exc:  # noqa: BLE001 - no space to check against: trust nothing
        return LoadedExport(family, path, "refused", f"refusing {path}: cannot check its entries "
                            f"against the {family} search space: {exc}", backend)
    loaded = LoadedExport(family, path, "loaded", "", backend)
    dropped = 0
    for key, entry in data["configs"].items():
        why = entry_problem(family, key, entry, space)
        if why:
            dropped += 1
            log.warning("%s: dropping entry %r: %s; that shape runs the baseline path",
                        path, str(key)[:200], why)
            continue
        shape = served_shape(family, entry["shape"])   # (an entry of an older exporter)
        config = dict(entry["config"])
        loaded.entries[shape_tuple(shape)] = (key, config)
        vary = next((k for k in NEAREST_KEYS if k in shape), None)
        if vary is not None:
            rest = shape_tuple({k: v for k, v in shape.items() if k != vary})
            loaded.by_rest.setdefault(rest, []).append((int(shape[vary]), key, config))
    for items in loaded.by_rest.values():
        items.sort(key=lambda item: item[0])
    loaded.detail = f"{len(loaded.entries)} entries from {path}" + (
        f" ({dropped} dropped)" if dropped else "")
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
# m buckets: an entry tuned at m serves the calls of its bucket first; the bucket of m is the
# power of two at least m (1, 2, 4, ..., 128, 256, ..., 8192, ...), so decode batch sizes,
# prefill chunks and mixed batches of one size class share an entry. Written into every export
# (M_BUCKET_RULE at the top, each entry's bucket) and used by the lookup of an m without an
# entry of its own: the entry of the nearest bucket (in octaves), then the nearest m, then the
# smaller m.
M_BUCKET_RULE = "pow2"
# how far from its own bucket an entry serves: one octave (half or twice its bucket). Further is a
# miss, the baseline path: on an H100 the m = 128 entry of Llama-3.1-8B's down projection (4096 x
# 14336) serving the m = 512 calls of a prefill ran them at 147.7 us against cuBLAS's 80 us and
# took the step from 14526 to 16647 us (BENCHMARKS.md, GEMM at prefill sizes)
M_NEAREST_OCTAVES = 1


def m_bucket(m: int) -> int:
    """The bucket of m under M_BUCKET_RULE: the power of two at least m."""
    from tuner_kernels.common import pow2_at_least

    return pow2_at_least(int(m))


def _octaves(m: int, other: int) -> int:
    """How many buckets (M_BUCKET_RULE: octaves) apart the buckets of two m are."""
    return abs(m_bucket(m).bit_length() - m_bucket(other).bit_length())


def _nearest_key(vary: str, value: int):
    """Sort key of an exported (value, key, config) for a call at `value`: for m the bucket
    distance in octaves first (M_BUCKET_RULE), then the distance in m; for kv_len the
    distance; on a tie the smaller one (its tiles fit the smaller problem)."""
    if vary == "m":
        return lambda item: (_octaves(item[0], value), abs(item[0] - value), item[0])
    return lambda item: (abs(item[0] - value), item[0])


_WARNED: set[tuple[str, str]] = set()  # (family, error type): lookup failures already logged


def _lookup_failed(family, exc: Exception) -> None:
    key = (str(family), type(exc).__name__)
    if key not in _WARNED:
        _WARNED.add(key)
        log.warning("tuner.runtime: lookup for %s failed (%s: %s); those calls run the baseline "
                    "path", family, type(exc).__name__, str(exc)[:200])


def resolve(family: str, shape: dict) -> tuple[dict | None, str | None]:
    """(config, entry key), or (None, None) on a miss, without counting. Exact, then nearest.
    Never raises: a shape it cannot read is a miss (one warning)."""
    try:
        return _resolve(family, shape)
    except Exception as exc:  # noqa: BLE001 - never into the serving process
        _lookup_failed(family, exc)
        return None, None


def _resolve(family: str, shape: dict) -> tuple[dict | None, str | None]:
    from .spaces import served_shape

    shape = served_shape(family, shape)  # a shape_from_row shape may carry a measurement key
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
            nearest, key, config = min(candidates, key=_nearest_key(vary, value))
            if vary != "m" or _octaves(nearest, value) <= M_NEAREST_OCTAVES:
                return config, key
    if family == "attention":
        return _repeated_kv_entry(shape)
    return None, None


def _repeated_kv_entry(shape: dict) -> tuple[dict | None, str | None]:
    """A GQA decode call (kv_heads < heads) with no entry of its own takes the entry of its
    repeated-KV form, the same call after transformers' repeat_kv (kv_heads = heads): that is the
    shape a baseline trace of such a model records. Its config has one head per program
    (HEADS_PER_BLOCK 1, the only value a group of one allows), so on the unrepeated cache the
    kernel reads, for each query head, the same K/V values in the same order: the same output,
    bit for bit, without the copy (tests/test_attention.py)."""
    heads, kv_heads = shape.get("heads"), shape.get("kv_heads")
    if heads is None or kv_heads is None or int(kv_heads) >= int(heads):
        return None, None
    config, key = _resolve("attention", {**shape, "kv_heads": heads})
    if config is None or int(config.get("HEADS_PER_BLOCK", 1)) != 1:
        return None, None
    return config, key


def matching_configs(family: str, fixed: dict | None = None) -> list[dict]:
    """The configs of the family's export entries whose shape agrees with `fixed` (a part of a
    shape, e.g. an attention call's heads, kv_heads, head_dim and dtype, whatever its batch and
    KV length; a linear's n, k and dtype, whatever its m; None or {}: every entry), counting,
    for attention, the repeated-KV form of a grouped call as `resolve` does. Never raises ([])."""
    try:
        return [dict(config) for _shape, config in _matching(family, fixed)]  # copies
    except Exception as exc:  # noqa: BLE001 - never into the serving process
        _lookup_failed(family, exc)
        return []


def served_m_ranges(family: str, fixed: dict | None = None) -> list[tuple[int, int]]:
    """The ranges of m, (low, high) inclusive, merged and ascending, at which a call of a shape
    agreeing with `fixed` (`matching_configs`, without m) finds an entry: `resolve`'s rule, m
    within M_NEAREST_OCTAVES buckets of an entry's. Never raises ([])."""
    try:
        spans = []
        for shape, _config in _matching(family, fixed):
            if "m" in shape:  # bucket 2 ** (bits - 1) holds m in (2 ** (bits - 2), 2 ** (bits - 1)]
                bits = m_bucket(shape["m"]).bit_length()
                low, high = max(1, bits - M_NEAREST_OCTAVES), bits + M_NEAREST_OCTAVES
                spans.append((1 if low == 1 else 2 ** (low - 2) + 1, 2 ** (high - 1)))
        merged: list[tuple[int, int]] = []
        for low, high in sorted(spans):
            if merged and low <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], high))
            else:
                merged.append((low, high))
        return merged
    except Exception as exc:  # noqa: BLE001 - never into the serving process
        _lookup_failed(family, exc)
        return []


def _matching(family: str, fixed: dict | None) -> list[tuple[dict, dict]]:
    """(shape, config) of the entries `matching_configs` describes (the loaded config itself)."""
    entries = _loaded(family).entries
    fixed = {k: normalize_value(v) for k, v in (fixed or {}).items()}
    wanted = [fixed]
    if (family == "attention" and "heads" in fixed and "kv_heads" in fixed
            and int(fixed["kv_heads"]) < int(fixed["heads"])):
        wanted.append({**fixed, "kv_heads": fixed["heads"]})
    found = []
    for items, (_key, config) in entries.items():
        shape = dict(items)
        if any(all(shape.get(k) == v for k, v in part.items()) and (
                i == 0 or int(config.get("HEADS_PER_BLOCK", 1)) == 1)
               for i, part in enumerate(wanted)):
            found.append((shape, config))
    return found


def has_entries(family: str, fixed: dict | None = None) -> bool:
    """Whether the family's export has an entry whose shape agrees with `fixed`
    (`matching_configs`). Never raises (False)."""
    return bool(matching_configs(family, fixed))


def lookup(family: str, shape: dict) -> dict | None:
    """The exported config for `shape` (exact or nearest), or None: then run the baseline path.
    Never raises into the caller: anything unexpected is None (the baseline path) and one
    logged warning."""
    try:
        return _lookup(family, shape)
    except Exception as exc:  # noqa: BLE001 - never into the serving process
        _lookup_failed(family, exc)
        return None


def resolved(family: str, shape: dict) -> tuple[dict | None, str | None]:
    """`resolve`, cached per raw shape (the hot path's form), without counting. Never raises."""
    cache_key = (family, tuple(shape.items()))
    found = _CACHE.get(cache_key)
    if found is None:
        found = resolve(family, shape)
        _CACHE[cache_key] = found
    return found


def _lookup(family: str, shape: dict) -> dict | None:
    config, entry = resolved(family, shape)
    if entry is not None:
        counts = _HITS.setdefault(family, {})
        counts[entry] = counts.get(entry, 0) + 1
    else:
        counts = _MISSES.setdefault(family, {})
        shape_items = tuple(shape.items())
        counts[shape_items] = counts.get(shape_items, 0) + 1
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
        _WARNED.clear()
        _IDENTITY = None
        _IDENTITY_DONE = False
