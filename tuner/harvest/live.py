"""`tuner harvest --live MODULE:CALLABLE`: profile a callable and harvest its trace."""

from __future__ import annotations

import gzip
import importlib
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

from ..errors import TunerError, info
from .pipeline import HarvestResult, harvest

__all__ = ["load_callable", "live"]


def load_callable(target: str):
    """Import MODULE:CALLABLE or path/to/file.py:CALLABLE; a class is instantiated once."""
    if ":" not in target:
        raise TunerError(f"--live wants MODULE:CALLABLE or path/to/file.py:CALLABLE, got {target!r}")
    mod_name, _, attr = target.rpartition(":")
    try:
        if mod_name.endswith(".py") or os.sep in mod_name:
            file = Path(mod_name)
            if not file.exists():
                raise TunerError(f"--live: file not found: {file}")
            spec = importlib.util.spec_from_file_location(f"_tuner_live_{file.stem}", file)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(mod_name)
    except TunerError:
        raise
    except ImportError as exc:
        raise TunerError(f"--live: cannot import {mod_name}: {exc}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise TunerError(f"--live: {mod_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if isinstance(obj, type):
        try:
            obj = obj()
        except Exception as exc:  # noqa: BLE001 - the user's code; --debug shows the traceback
            raise TunerError(f"--live: creating {target} failed: {type(exc).__name__}: "
                             f"{exc}") from exc
    if not callable(obj):
        raise TunerError(f"--live: {target} is not callable")
    return obj


def _save(raw: Path, save: Path) -> Path:
    """Copy the exported trace to `save` (gzipped when the name ends in .gz)."""
    save.parent.mkdir(parents=True, exist_ok=True)
    if save.name.endswith(".gz"):
        with open(raw, "rb") as src, gzip.open(save, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
    else:
        shutil.copyfile(raw, save)
    info(f"saved the raw trace to {save}")
    return save


def live(target: str, steps: int, output=None, *, save_trace=None, phase: str | None = None,
         quiet: bool = False, graph: bool = False, device_name: str | None = None) -> HarvestResult:
    """Run CALLABLE `steps` times under torch.profiler (record_shapes on, one profiler step per
    call), export the trace and harvest it."""
    import torch
    from torch.profiler import ProfilerAction, ProfilerActivity, profile

    if steps is None or steps < 1:
        raise TunerError("--live needs --steps N (N >= 1): how many calls to profile")
    fn = load_callable(target)
    activities = [ProfilerActivity.CPU]
    gpu = torch.cuda.is_available()
    if gpu:
        activities.append(ProfilerActivity.CUDA)
    tmpdir = tempfile.mkdtemp(prefix="tuner_live_")
    try:
        raw = Path(tmpdir) / "live.pt.trace.json"
        # A schedule makes the profiler record ProfilerStep#N markers; this one records always.
        with profile(activities=activities, record_shapes=True,
                     schedule=lambda step: ProfilerAction.RECORD) as prof:
            for i in range(steps):
                if i:
                    prof.step()     # closes ProfilerStep#(i-1), opens ProfilerStep#i
                try:
                    fn()
                except Exception as exc:  # noqa: BLE001 - the user's code; --debug re-raises
                    raise TunerError(f"--live: call {i + 1} of {target} failed: "
                                     f"{type(exc).__name__}: {exc}") from exc
                if gpu:
                    torch.cuda.synchronize()
        prof.export_chrome_trace(str(raw))
        trace = _save(raw, Path(save_trace)) if save_trace else raw
        return harvest([trace], output, phase=phase, quiet=quiet, device_name=device_name)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
