"""`tuner export`: accepted configs as files a serving build loads (tuner.runtime reads them).

Layout (DESIGN.md "Export")::

    artifacts/export/<device key>/<family>.json     configs keyed by shape key
    artifacts/export/<device key>/manifest.json     what is there, with hashes; written last
    artifacts/export/<device key>/vllm/<family>/N=..,K=..,device_name=..,dtype=...json
                                                    (--format vllm, gemv / gemm: {"M": config},
                                                     like vLLM's w8a8 tuned-config files)
    artifacts/export/<device key>/vllm/moe/E=..,N=..,device_name=...json
    artifacts/export/<device key>/sglang/moe/triton_<x_y_z>/E=..,N=..,device_name=...json
                                                    (--format vllm / sglang, moe: the fused MoE
                                                     tuned-config files those engines read,
                                                     named and keyed as they are; `engine_moe_documents`)

A family file carries the device name and arch, backend, torch and triton versions, the kernel
source hash, the compile options that change numerics (Triton's FP fusion), the parity mode and the
measured numbers behind each entry. Every file is written to a temporary file in the same folder and
moved into place with os.replace (mode 0644); the manifest is written last, so a reader never sees a
manifest that names a half-written file. Temp files a killed export left behind are removed by the
next one; the loader never reads them.

Before writing anything, every accepted row is checked: a known family, a device key that is a
plain folder name, a config and a shape that parse, fit the family's shape schema and are allowed
by the family's search space (the backend's section: cuda, hip, or dcu on a Hygon arch). A row
that fails is refused with a warning naming it; the others are exported. No path is written
outside the output directory, whatever a device or family name holds.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from . import rank as rank_mod
from .errors import TunerError, info, warn
from .hardware import DCU_ARCHS
from .runtime import EXPORT_FORMAT, EXPORT_ROOT, device_key_for
from .tables import atomic_write_bytes, check_output_dir, remove_stale_temps

__all__ = ["DCU_ARCHS", "ENGINES", "FORMATS", "MEASURED_FIELDS", "VLLM_FAMILIES", "accepted",
           "atomic_write_json", "atomic_write_text", "drop_entries", "engine_device_name",
           "engine_moe_documents", "export", "family_document", "load_verdicts",
           "moe_config_file_name", "row_problem", "run_cli", "step_losses", "summary_lines",
           "valid_rows",
           "vllm_documents"]

VLLM_FAMILIES = ("gemv", "gemm")
ENGINES = ("vllm", "sglang")  # serving engines whose fused MoE config files `export` writes
FORMATS = ("native", *ENGINES)
# The keys of a config in the engines' fused MoE files (tuner_kernels.moe.ENGINE_KEYS; not imported:
# it pulls in triton)
MOE_ENGINE_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps",
                   "num_stages")
MEASURED_FIELDS = ("baseline_us", "candidate_us", "default_us", "speedup", "speedup_low",
                   "speedup_high", "speedup_vs_default", "noise_pct", "saving_us_per_call",
                   "calls_per_step", "hit_rate", "saving_us_per_token", "share_of_step",
                   "step_us", "parity_mode", "parity_error", "search_us", "measured_at", "study",
                   "baseline_path",  # how the baseline was timed (tuner rank; absent: eager)
                   "baseline_kernel",  # the kernels that baseline ran (tuner rank, on the GPU)
                   # the three parity facts of the entry (tuner.parity), whatever gate passed it
                   "parity_margin", "bitwise_vs_baseline", "bitwise_vs_default", "parity_class",
                   "default_class", "error_vs_reference", "baseline_error_vs_reference",
                   "error_ratio", "parity_seeds")


# ----------------------------------------------------------------------------------- atomic I/O
def atomic_write_text(path: Path, text: str) -> Path:
    """Write `text` to `path` via a temp file in the same folder and os.replace (mode 0644). On
    any error the temp file is removed and an existing `path` is left as it was."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, data) -> Path:
    # Serialise fully before touching the disk: a value JSON cannot hold fails here.
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


# ----------------------------------------------------------------------------- selecting rows
def load_verdicts(paths: list[str | Path] | None = None,
                  directory: str | Path = rank_mod.VERDICTS_DIR) -> pd.DataFrame:
    """Verdict tables from the given files, else every *.parquet under artifacts/verdicts/."""
    if not paths:
        directory = Path(directory)
        paths = sorted(directory.glob("*.parquet")) if directory.is_dir() else []
        if not paths:
            raise TunerError(f"no verdict tables under {directory}: run `tuner rank` first")
    return pd.concat([rank_mod.read(p) for p in paths], ignore_index=True)


def accepted(verdicts: pd.DataFrame, family: str | None = None) -> pd.DataFrame:
    """Accepted rows, one per (device, family, shape): the latest measurement, then the larger
    saving."""
    rows = verdicts[verdicts["decision"] == rank_mod.ACCEPT]
    if family:
        rows = rows[rows["family"] == family]
    if rows.empty:
        return rows
    rows = rows.sort_values(["measured_at", "saving_us_per_token"], ascending=[False, False])
    return rows.drop_duplicates(["device", "family", "shape"], keep="first")


def row_problem(row: dict) -> str:
    """'' when an accepted verdict row can be exported, else why not (one line)."""
    import tuner_kernels as kernels

    from .spaces import check_shape, space_for

    family, device = row.get("family"), row.get("device")
    if family not in kernels.family_names():
        return f"unknown family {family!r}"
    if not isinstance(device, str) or not device or device_key_for(device) != device:
        return f"device key {device!r} is not a plain name like 'nvidia-h200'"
    try:
        config = json.loads(row.get("config"))
        shape = json.loads(row.get("shape_json"))
    except (TypeError, ValueError) as exc:
        return f"config or shape does not parse as JSON ({exc})"
    why = check_shape(family, shape)
    if why:
        return f"shape: {why}"
    backend = "dcu" if str(row.get("arch")) in DCU_ARCHS else str(row.get("backend"))
    if backend not in ("cuda", "hip", "dcu"):
        return f"backend {row.get('backend')!r} is not cuda or hip"
    return space_for(family, backend).check(config, shape)


def valid_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows `row_problem` finds nothing wrong with; a warning for each refused one."""
    keep = []
    for index, row in zip(rows.index, rows.to_dict("records")):
        why = row_problem(row)
        if why:
            warn(f"not exporting {row.get('family')} {row.get('shape')!s:.120} "
                 f"(device {str(row.get('device'))[:60]!r}): {why}")
        else:
            keep.append(index)
    return rows.loc[keep]


def _inside(root: Path, path: Path) -> Path:
    """`path`, if it lies inside `root` (else a TunerError: never write outside the output)."""
    resolved, base = path.resolve(), root.resolve()
    if resolved != base and base not in resolved.parents:
        raise TunerError(f"refusing to write {path}: outside the export directory {root}")
    return path


def _safe_name(text: str) -> str:
    """A device name as one file-name component (vLLM's 'NVIDIA_H200'): no separators or dots
    runs that could leave the folder."""
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", str(text).replace(" ", "_")).strip(".") or "device"


def _plain(value):
    """numpy scalars to Python, NaN to None (JSON has no NaN)."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _one(rows: pd.DataFrame, column: str, what: str):
    values = sorted({str(v) for v in rows[column].tolist()})
    if len(values) > 1:
        raise TunerError(f"{what}: the accepted verdicts disagree on {column} ({', '.join(values)}); "
                         f"re-run `tuner rank` so they come from one build")
    return rows[column].iloc[0]


def family_document(rows: pd.DataFrame, family: str, device_key: str, *,
                    check_kernel_hash: bool = True) -> dict:
    """The <family>.json document for one device from its accepted verdict rows."""
    from . import runtime
    from .spaces import served_shape

    what = f"{device_key}/{family}"
    kernel_hash = str(_one(rows, "kernel_hash", what))
    if check_kernel_hash:
        now = runtime.kernel_hash(family)
        if now != kernel_hash:
            raise TunerError(f"{what}: the {family} kernel source changed since these verdicts were "
                             f"measured (hash {kernel_hash}, now {now}); re-run `tuner rank`")
    modes = sorted(set(rows["parity_mode"]))
    configs = {}
    for r in rows.to_dict("records"):
        shape = served_shape(r["family"], json.loads(r["shape_json"]))
        configs[r["shape"]] = {
            "shape": shape,
            "config": json.loads(r["config"]),
            "measured": {k: _plain(r[k]) for k in MEASURED_FIELDS if k in r},
        }
        if "m" in shape:  # the bucket this entry serves first (runtime.M_BUCKET_RULE)
            configs[r["shape"]]["m_bucket"] = runtime.m_bucket(shape["m"])
    return {
        "format": EXPORT_FORMAT,
        "family": family,
        "device": {"key": device_key, "name": str(_one(rows, "device_name", what)),
                   "arch": str(_one(rows, "arch", what)),
                   "backend": str(_one(rows, "backend", what))},
        "versions": {"torch": str(_one(rows, "torch", what)),
                     "triton": str(_one(rows, "triton", what))},
        "kernel_hash": kernel_hash,
        "compile_options": {"enable_fp_fusion": bool(_one(rows, "fp_fusion", what))},
        # the file's claim is its weakest entry's gate (baseline > kernel > accuracy)
        "parity_mode": max(modes, key=lambda m: ("baseline", "kernel", "accuracy").index(m)
                           if m in ("baseline", "kernel", "accuracy") else 3),
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "m_bucket_rule": runtime.M_BUCKET_RULE,
        "configs": dict(sorted(configs.items())),
    }


def vllm_documents(doc: dict) -> dict[str, dict]:
    """vLLM-style files for a gemv/gemm export: {file name: {"M": config}} per (N, K, dtype)."""
    device = _safe_name(doc["device"]["name"])
    files: dict[str, dict] = {}
    for entry in doc["configs"].values():
        shape = entry["shape"]
        if int(shape.get("batch", 1)) != 1 or "m" not in shape:
            continue
        name = f"N={shape['n']},K={shape['k']},device_name={device},dtype={shape['dtype']}"
        if shape.get("layout") and doc["family"] == "gemm":
            name += f",layout={shape['layout']}"
        if shape.get("bias"):  # a linear with bias is tuned as its own shape (tuner_kernels.gemv)
            name += ",bias=1"
        files.setdefault(name + ".json", {})[str(shape["m"])] = entry["config"]
    return {name: dict(sorted(ms.items(), key=lambda kv: int(kv[0])))
            for name, ms in files.items()}


def engine_device_name(name: str, engine: str) -> str:
    """The device_name part of an engine's MoE config file name: torch.cuda.get_device_name()
    with spaces replaced by underscores; vLLM also names every H200 variant 'NVIDIA_H200'."""
    device = str(name).replace(" ", "_")
    if engine == "vllm" and "H200" in device.split("_"):
        device = "NVIDIA_H200"
    return _safe_name(device)


def moe_config_file_name(experts: int, inter: int, device_name: str,
                         dtype: str | None = None) -> str:
    """'E={E},N={N},device_name={device}[,dtype={dtype}].json', both engines' get_config_file_name
    for an unquantised MoE (dtype None for bf16 / fp16: their config dtype string is then None;
    no block_shape: that is for block-quantised weights)."""
    selector = f",dtype={dtype}" if dtype else ""
    return f"E={int(experts)},N={int(inter)},device_name={device_name}{selector}.json"


def engine_moe_documents(doc: dict, engine: str) -> dict[str, dict]:
    """{path under <device>/<engine>/moe/: {"m": config}} for a moe export: one file per (E, N),
    keys the token counts the verdicts measured (ascending), values the six keys the engines'
    kernel reads. SGLang looks in a triton_<version> folder. Entries the engines' kernel cannot
    run (GEMV = 1, SPLIT_K or SPLIT_K_UP > 1) are left out with a warning; bf16 and fp16 share a file name, bf16 wins."""
    if engine not in ENGINES:
        raise TunerError(f"unknown engine {engine!r}; expected {' or '.join(ENGINES)}")
    device = engine_device_name(doc["device"]["name"], engine)
    folder = ""
    if engine == "sglang":
        folder = "triton_" + _safe_name(str(doc["versions"]["triton"]).replace(".", "_")) + "/"
    entries = sorted(doc["configs"].values(),
                     key=lambda e: (e["shape"].get("dtype") != "bfloat16", e["shape"]["m"]))
    files: dict[str, dict] = {}
    owner: dict[tuple, dict] = {}
    for entry in entries:
        shape, config = entry["shape"], entry["config"]
        if int(config.get("GEMV", 0)):
            warn(f"{engine} moe file: leaving out {shape} (GEMV: the engine's fused MoE kernel "
                 f"has no GEMV path)")
            continue
        splits = {k: int(config.get(k, 1)) for k in ("SPLIT_K", "SPLIT_K_UP")}
        if any(v != 1 for v in splits.values()):
            said = ", ".join(f"{k} {v}" for k, v in splits.items() if v != 1)
            warn(f"{engine} moe file: leaving out {shape} ({said}: the engine's fused MoE "
                 f"kernel has no K split)")
            continue
        name = folder + moe_config_file_name(shape["experts"], shape["inter"], device)
        slot = (name, int(shape["m"]))
        if slot in owner:
            warn(f"{engine} moe file {name}: m={shape['m']} of {shape} shares the key of "
                 f"{owner[slot]} (the file name has E and N only); keeping the latter")
            continue
        owner[slot] = shape
        files.setdefault(name, {})[str(int(shape["m"]))] = {k: int(config[k])
                                                            for k in MOE_ENGINE_KEYS}
    return {name: dict(sorted(ms.items(), key=lambda kv: int(kv[0])))
            for name, ms in files.items()}


def _format_files(doc: dict, family: str, fmt: str) -> dict[str, dict]:
    """{path under <device>/: data} of one engine format for one family's document."""
    if family == "moe":
        return {f"{fmt}/moe/{name}": data for name, data in engine_moe_documents(doc, fmt).items()}
    if fmt == "vllm" and family in VLLM_FAMILIES:
        return {f"vllm/{family}/{name}": data for name, data in vllm_documents(doc).items()}
    warn(f"--format {fmt} does not fit family {family} (no m-keyed file of that engine); skipped")
    return {}


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def export(verdicts: pd.DataFrame, *, out_root: str | Path = EXPORT_ROOT,
           family: str | None = None, formats: tuple[str, ...] = ("native",),
           check_kernel_hash: bool = True, retire: tuple = ()) -> list[Path]:
    """Write the accepted configs; returns the paths written (manifests last). `retire`:
    (device key, family) pairs left with no entry (drop_entries took them all): a file of that
    family an earlier export left in the directory is removed with its manifest entry, so the
    loader cannot serve what was dropped."""
    for fmt in formats:
        if fmt not in FORMATS:
            raise TunerError(f"unknown export format {fmt!r}; expected {', '.join(FORMATS)}")
    root = check_output_dir(out_root, "-o")
    rows = accepted(verdicts, family)
    what = f" for family {family}" if family else ""
    if rows.empty:
        raise TunerError(f"no accepted configs{what} in the verdicts: nothing to export "
                         f"(see the reasons in the verdict table)")
    rows = valid_rows(rows)
    if rows.empty:
        raise TunerError(f"no exportable configs{what}: every accepted row was refused (above)")
    written: list[Path] = []
    for device_key, device_rows in rows.groupby("device", sort=True):
        directory = _inside(root, root / str(device_key))
        remove_stale_temps(directory)
        docs = {}
        for fam, fam_rows in device_rows.groupby("family", sort=True):
            docs[fam] = family_document(fam_rows, fam, str(device_key),
                                        check_kernel_hash=check_kernel_hash)
        manifest_path = directory / "manifest.json"
        manifest = _read_manifest(manifest_path)
        for dev, fam in retire:
            if dev == device_key and fam not in docs and fam in manifest["families"]:
                (directory / f"{fam}.json").unlink(missing_ok=True)
                del manifest["families"][fam]
                info(f"removed {directory / f'{fam}.json'}: every entry of it was dropped")
        for fam, doc in docs.items():
            path = atomic_write_json(_inside(root, directory / f"{fam}.json"), doc)
            written.append(path)
            manifest["families"][fam] = {
                "file": path.name, "sha256": _sha256(path), "entries": len(doc["configs"]),
                "kernel_hash": doc["kernel_hash"], "parity_mode": doc["parity_mode"],
                "compile_options": doc["compile_options"], "created_at": doc["created_at"],
            }
            for fmt in (f for f in formats if f in ENGINES):
                for name, data in _format_files(doc, fam, fmt).items():
                    # keys in ascending m, not sorted as text: the engines take the first of two
                    # equally near keys in file order
                    written.append(atomic_write_text(_inside(root, directory / name),
                                                     json.dumps(data, indent=2) + "\n"))
            manifest["device"] = doc["device"]
            manifest["versions"] = doc["versions"]
        manifest["format"] = EXPORT_FORMAT
        manifest["updated_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        written.append(atomic_write_json(manifest_path, manifest))
    return written


def _read_manifest(path: Path) -> dict:
    """An existing manifest to update (other families stay), or a fresh one."""
    fresh = {"format": EXPORT_FORMAT, "families": {}}
    if not path.exists():
        return fresh
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        warn(f"{path} is unreadable; writing a new manifest")
        return fresh
    if not isinstance(data, dict) or not isinstance(data.get("families"), dict):
        return fresh
    # keep only families whose file is still there
    data["families"] = {f: e for f, e in data["families"].items()
                        if isinstance(e, dict) and e.get("file", f"{f}.json") == f"{f}.json"
                        and (path.parent / f"{f}.json").exists()}
    return data


def summary_lines(paths: list[Path]) -> list[str]:
    out = []
    for p in paths:
        if p.name == "manifest.json":
            out.append(f"  {p}")
        elif any(engine in p.parts[-4:-1] for engine in ENGINES):
            engine = next(e for e in ENGINES if e in p.parts[-4:-1])
            out.append(f"  {p} ({'vLLM' if engine == 'vllm' else 'SGLang'} layout)")
        else:
            try:
                n = len(json.loads(p.read_text())["configs"])
                out.append(f"  {p}: {n} config(s)")
            except (OSError, KeyError, json.JSONDecodeError):
                out.append(f"  {p}")
    return out


def step_losses(ab_paths: list[str | Path]) -> dict[tuple[str, str], str]:
    """(family, entry key) -> why, for every export entry whose calls the whole step ran slower
    in a `tuner ab` (its ab.json): the attribution row of that call measured a negative saving
    (the tuned step's kernels for it took longer than the baseline's). A kernel timed alone can
    win where the step loses, e.g. where the baseline compiler fused a norm into the linear the
    export makes opaque; the A/B's per-shape attribution is what shows it (docs/ab.md)."""
    out: dict[tuple[str, str], str] = {}
    for path in ab_paths:
        try:
            record = json.loads(Path(path).read_text())
            rows = record["attribution"]
            if not isinstance(rows, list):
                raise TypeError("attribution is not a list")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise TunerError(f"--drop-step-losses {path}: not a `tuner ab` result "
                             f"(ab.json): {exc}") from None
        if rows and not any("export_entries" in r for r in rows):
            raise TunerError(f"--drop-step-losses {path}: its attribution does not name the "
                             "export entries serving each call (an older `tuner ab`): run the "
                             "A/B again")
        label = record.get("label") or Path(path).parent.name
        lost = 0.0
        for r in rows:
            saving = r.get("measured_saving_us")
            if saving is None or not math.isfinite(float(saving)) or float(saving) >= 0:
                continue
            if r.get("export_entries"):
                lost += -float(saving)
            projected = r.get("projected_saving_us")
            proj = (f", projected {float(projected):+.1f}" if projected is not None
                    and math.isfinite(float(projected)) else "")
            for entry in r.get("export_entries") or ():
                out[(str(entry["family"]), str(entry["key"]))] = (
                    f"the whole step ({label}) ran its calls {r['shape']} "
                    f"{-float(saving):.1f} µs a step slower{proj}")
        estimate = _without_losses(record, lost)
        if estimate:
            info(f"{label}: {estimate}")
    return out


def _without_losses(record: dict, lost_us: float) -> str:
    """What an A/B's step would take without the entries whose calls it ran `lost_us` slower,
    if those calls ran the baseline's kernels again and nothing else moved: an estimate from
    the per-shape rows, which the confirming A/B measures; '' without the arms' times."""
    arms = record.get("arms") or {}
    try:
        base = float(arms["baseline"]["median_us"])
        tuned = float(arms["tuned"]["median_us"])
    except (KeyError, TypeError, ValueError):
        return ""
    if not (lost_us > 0 and math.isfinite(base) and math.isfinite(tuned) and tuned > lost_us):
        return ""
    return (f"without those entries the tuned step would take about {tuned - lost_us:.1f} µs "
            f"against the baseline's {base:.1f} ({base / (tuned - lost_us):.4f}×, from "
            f"{tuned:.1f} µs and {base / tuned:.4f}×; an estimate from the per-shape rows: "
            f"A/B the new export to measure it)")


def drop_entries(verdicts: pd.DataFrame, losses: dict[tuple[str, str], str]) -> pd.DataFrame:
    """`verdicts` without the accepted rows `losses` names (step_losses), one warning each."""
    if not losses or verdicts.empty:
        return verdicts
    keys = list(zip(verdicts["family"].astype(str), verdicts["shape"].astype(str)))
    drop = [k in losses and d == rank_mod.ACCEPT for k, d in zip(keys, verdicts["decision"])]
    for (fam, shape), dropped in zip(keys, drop):
        if dropped:
            warn(f"not exported: {fam} {shape}: {losses[(fam, shape)]}")
    return verdicts[[not d for d in drop]]


def run_cli(paths, *, family, formats, out_root, check_kernel_hash=True,
            drop_step_losses=()) -> list[Path]:
    check_output_dir(out_root, "-o")  # before reading anything
    losses = step_losses(list(drop_step_losses))
    verdicts = load_verdicts(paths)
    kept = drop_entries(verdicts, losses)
    before, after = (set(zip(accepted(v, family)["device"], accepted(v, family)["family"]))
                     for v in (verdicts, kept))
    written = export(kept, out_root=out_root, family=family, formats=formats,
                     check_kernel_hash=check_kernel_hash, retire=tuple(sorted(before - after)))
    info(f"exported to {out_root}:")
    for line in summary_lines(written):
        print(line)
    return written
