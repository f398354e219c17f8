"""Compile configs ahead of their measurement, in a thread pool, into this process's Triton caches.

A trial of a config whose kernel is not compiled yet spends most of its wall time compiling
(Triton front end, LLVM, ptxas: 0.2-0.3 s of 0.3-0.45 s on the H200 machine; BENCHMARKS.md).
The configs a study measures first are known before it starts (the default, the known configs of
tuner_kernels/candidates.py, the sampler's random startup: the study's queue), so a worker compiles
them in the background while it measures the earlier ones.

Each job is one (family, shape, config): its kernel calls (``family.launch_plan`` on 'meta'
tensors) are compiled with ``JITFunction.warmup``, the JIT's own launch path without a launch,
so the compiled kernel lands under the same key as a real launch of that config would use (and
in Triton's on-disk cache). A warmup in a pool thread is an ordinary synchronous compile: a
launch on the main thread either finds the finished kernel or compiles it itself; nothing it
can see is half done. A job that fails to plan or compile is only recorded: the trial compiles
it again and reports the failure as usual.

- `precompile(jobs, ...)`: compile them all (blocking), `threads` at a time, until `deadline`.
- `CompileAhead`: the same in the background for a search worker: `submit(jobs)`, `close()`.

Under TRITON_INTERPRET=1 there is nothing to compile: both do nothing.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

__all__ = ["CompileAhead", "PrecompileReport", "auto_threads", "precompile"]


@dataclass
class PrecompileReport:
    jobs: int = 0
    compiled: int = 0  # kernel calls warmed up (a split-K config has two)
    skipped: int = 0  # jobs not started before the deadline or the stop
    seconds: float = 0.0
    threads: int = 0
    failures: dict = field(default_factory=dict)  # job index -> one-line reason


def auto_threads(workers: int = 1) -> int:
    """Compile threads for each of `workers` search workers on this host: the cores left after
    one per worker, at most 8 each (ptxas runs as a child process of a thread)."""
    cores = os.cpu_count() or 2
    return max(1, min(8, cores // max(1, workers) - 1))


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _warm(job, backend: str) -> int:
    """Compile every kernel call of one (family, shape, config) job; returns how many."""
    family, shape, config = job
    inputs = family.make_inputs(shape, "meta")
    _, calls = family.launch_plan(inputs, config, backend=backend)
    for call in calls:
        call.kernel.warmup(*call.args, grid=call.grid, **call.constexprs, **call.options)
    return len(calls)


def _attempt(index: int, job, backend: str, report: PrecompileReport, lock, *, skip: bool) -> None:
    """Compile one job into `report` (or count it skipped): the one place a job is tried."""
    if skip:
        with lock:
            report.skipped += 1
        return
    try:
        n = _warm(job, backend)
    except Exception as exc:  # noqa: BLE001 - the trial compiles it again and says why
        with lock:
            report.failures[index] = _reason(exc)
        return
    with lock:
        report.compiled += n


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else ''}"


def precompile(jobs: list, backend: str = "cuda", *, threads: int | None = None,
               deadline: float | None = None, stop: threading.Event | None = None
               ) -> PrecompileReport:
    """Compile every kernel of each (family, shape, config) job, `threads` at a time; jobs not
    started by `deadline` (time.time()) or after `stop` is set are skipped. `backend`: cuda or
    hip (the launch plan's). Blocks until every started compile ended."""
    threads = threads or auto_threads()
    report = PrecompileReport(jobs=len(jobs), threads=threads)
    if _interpreting() or not jobs:
        report.skipped = len(jobs)
        return report
    started = time.time()
    lock = threading.Lock()

    def run(index: int, job) -> None:
        late = (stop is not None and stop.is_set()) or (deadline is not None and time.time() > deadline)
        _attempt(index, job, backend, report, lock, skip=late)

    with ThreadPoolExecutor(threads, thread_name_prefix="precompile") as pool:
        for index, job in enumerate(jobs):
            pool.submit(run, index, job)
    report.seconds = time.time() - started
    return report


class CompileAhead:
    """Background compiles for a search worker: `submit` queues jobs (first submitted, first
    compiled), `close` drops what has not started and returns without waiting for the rest.
    `report` counts as `precompile` does. Never raises from `submit` or `close`."""

    def __init__(self, backend: str = "cuda", threads: int | None = None):
        self.backend = backend
        self.report = PrecompileReport(threads=threads or auto_threads())
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pool = None
        if not _interpreting():
            self._pool = ThreadPoolExecutor(self.report.threads, thread_name_prefix="compile-ahead")

    def submit(self, jobs: list) -> None:
        if self._pool is None or self._stop.is_set():
            return
        for job in jobs:
            index = self.report.jobs
            self.report.jobs += 1
            try:
                self._pool.submit(self._run, index, job)
            except RuntimeError:  # the pool was shut down meanwhile
                return

    def _run(self, index: int, job) -> None:
        _attempt(index, job, self.backend, self.report, self._lock, skip=self._stop.is_set())

    def close(self) -> None:
        self._stop.set()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
