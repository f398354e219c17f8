"""`tuner harvest --live MODULE:CALLABLE`: profile a callable and harvest its trace."""

from __future__ import annotations

import gzip
import importlib
import importlib.util
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from ..errors import TunerError, info
from .files import CAPTURE_DIR
from .pipeline import HarvestResult, check_topk, harvest

__all__ = ["load_callable", "live"]


def load_callable(target: str, *, instantiate: bool = True, flag: str = "--live"):
    """Import MODULE:CALLABLE or path/to/file.py:CALLABLE; a class is instantiated once (unless
    `instantiate` is False: `tuner ab` calls it with its own arguments). `flag` names the
    option in errors."""
    if ":" not in target:
        raise TunerError(f"{flag} wants MODULE:CALLABLE or path/to/file.py:CALLABLE, got "
                         f"{target!r}")
    mod_name, _, attr = target.rpartition(":")
    try:
        if mod_name.endswith(".py") or os.sep in mod_name:
            file = Path(mod_name)
            if not file.exists():
                raise TunerError(f"{flag}: file not found: {file}")
            spec = importlib.util.spec_from_file_location(f"_tuner_live_{file.stem}", file)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(mod_name)
    except TunerError:
        raise
    except ImportError as exc:
        raise TunerError(f"{flag}: cannot import {mod_name}: {exc}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise TunerError(f"{flag}: {mod_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if isinstance(obj, type) and instantiate:
        try:
            obj = obj()
        except Exception as exc:  # noqa: BLE001 - the user's code; --debug shows the traceback
            raise TunerError(f"{flag}: creating {target} failed: {type(exc).__name__}: "
                             f"{exc}") from exc
    if not callable(obj):
        raise TunerError(f"{flag}: {target} is not callable")
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
         quiet: bool = False, graph: bool = False, device_name: str | None = None,
         kv_heads: int | None = None, topk: int | None = None,
         gated_mlp: bool = False) -> HarvestResult:
    """Run CALLABLE `steps` times under torch.profiler (record_shapes on, one profiler step per
    call), export the trace and harvest it.

    `graph`: capture one call as a CUDA/HIP graph (after three warm-up calls on a side stream),
    profile the capture, then profile `steps` replays, and harvest the replays joined with the
    capture; `save_trace` is then a directory: DIR/<name>.pt.trace.json.gz (the replays) and
    DIR/capture_traces/<name>.pt.trace.json.gz (the capture), the layout `tuner harvest DIR`
    pairs. A callable with a `step_annotation` attribute (a string) runs each step inside
    record_function(step_annotation), e.g. a vLLM-style execute_context_0(0)_generation_8(8).
    `kv_heads`, `topk`, `gated_mlp`: as harvest's.
    """
    import torch

    if steps is None or steps < 1:
        raise TunerError("--live needs --steps N (N >= 1): how many calls to profile")
    check_topk(topk)   # before any profiling
    if graph and not torch.cuda.is_available():
        raise TunerError("--live --graph needs a CUDA or ROCm GPU: graphs capture device work, "
                         "and none is visible")
    fn = load_callable(target)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", target.rpartition(":")[2]) or "live"
    tmpdir = Path(tempfile.mkdtemp(prefix="tuner_live_"))
    try:
        if graph:
            replay, capture = _profile_graph(fn, target, steps, tmpdir)
            if save_trace:
                folder = Path(save_trace)
                replay = _save(replay, folder / f"{name}.pt.trace.json.gz")
                capture = _save(capture, folder / CAPTURE_DIR / f"{name}.pt.trace.json.gz")
            return harvest([replay], output, phase=phase, quiet=quiet, capture=[capture],
                           device_name=device_name, kv_heads=kv_heads, topk=topk,
                           gated_mlp=gated_mlp)
        trace = _profile_calls(fn, target, steps, tmpdir / "live.pt.trace.json")
        if save_trace:
            trace = _save(trace, Path(save_trace))
        return harvest([trace], output, phase=phase, quiet=quiet, device_name=device_name,
                       kv_heads=kv_heads, topk=topk, gated_mlp=gated_mlp)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def _activities():
    import torch
    from torch.profiler import ProfilerActivity

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    return activities


def _run_steps(step, target: str, steps: int, annotation: str | None, out: Path) -> Path:
    """Call `step` `steps` times under the profiler, one profiler step each; export to `out`."""
    import torch
    from torch.profiler import ProfilerAction, profile, record_function

    gpu = torch.cuda.is_available()
    # A schedule makes the profiler record ProfilerStep#N markers; this one records always.
    with profile(activities=_activities(), record_shapes=True,
                 schedule=lambda _step: ProfilerAction.RECORD) as prof:
        for i in range(steps):
            if i:
                prof.step()     # closes ProfilerStep#(i-1), opens ProfilerStep#i
            try:
                if annotation:
                    with record_function(annotation):
                        step()
                else:
                    step()
            except Exception as exc:  # noqa: BLE001 - the user's code; --debug re-raises
                raise TunerError(f"--live: call {i + 1} of {target} failed: "
                                 f"{type(exc).__name__}: {exc}") from exc
            if gpu:
                torch.cuda.synchronize()
    prof.export_chrome_trace(str(out))
    return out


def _profile_calls(fn, target: str, steps: int, out: Path) -> Path:
    return _run_steps(fn, target, steps, _annotation(fn), out)


def _annotation(fn) -> str | None:
    value = getattr(fn, "step_annotation", None)
    return value if isinstance(value, str) and value else None


def _profile_graph(fn, target: str, steps: int, tmpdir: Path) -> tuple[Path, Path]:
    """Warm up, capture one call as a graph under the profiler, then profile the replays."""
    import torch
    from torch.profiler import profile

    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):      # warm up (allocator, cuBLAS workspaces, autotuning)
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        capture = tmpdir / "capture.pt.trace.json"
        with profile(activities=_activities(), record_shapes=True) as prof:
            # thread_local: the profiler's own threads cannot invalidate the capture
            with torch.cuda.graph(g, capture_error_mode="thread_local"):
                fn()
            torch.cuda.synchronize()
        prof.export_chrome_trace(str(capture))
    except TunerError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's code; --debug re-raises
        raise TunerError(f"--live --graph: capturing {target} as a graph failed: "
                         f"{type(exc).__name__}: {exc}") from exc
    replay = _run_steps(g.replay, target, steps, _annotation(fn), tmpdir / "replay.pt.trace.json")
    return replay, capture
