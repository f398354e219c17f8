"""Run the A/B measurement in a child process: a segfault or a lost GPU context is a result.

The parent writes a request (the harness spec and ABSettings as JSON) and starts
``python -m tuner.ab.child REQUEST``; the child appends each stage it starts to the progress
file and writes the measurement as JSON. A child that dies (a signal, a CUDA error, an exception)
leaves its last stage in the progress file: `run_child` reports which stage of which arm failed.
The measurement file is written atomically; a child that hangs on its way out after writing it
(a CUDA or Inductor teardown) is killed EXIT_GRACE_S later and its result kept: the timeout
bounds the measurement, not the exit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["ChildResult", "USAGE_EXIT", "run_child"]

USAGE_EXIT = 2  # the child's exit code for an error the user can act on (usage_error.txt)


@dataclass
class ChildResult:
    ok: bool
    data: dict | None  # the measurement (tuner.ab.measure), when ok
    returncode: int
    stage: str  # the last stage the child started
    reason: str  # why it failed ('' when ok)
    seconds: float
    usage_error: str = ""  # the user's to fix (a harness that cannot be built): one line


EXIT_GRACE_S = 30.0  # how long a child that wrote its result may take to exit before it is killed


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def run_child(spec: tuple[str, str], settings, work: Path, timeout_s: float | None = None,
              echo=None) -> ChildResult:
    """Measure in a child process; `echo(stage)` is called as stages start (progress)."""
    work.mkdir(parents=True, exist_ok=True)
    request = work / "request.json"
    progress = work / "progress.log"
    output = work / "measurement.json"
    for path in (progress, output, work / "usage_error.txt", work / "error.txt"):
        path.unlink(missing_ok=True)
    request.write_text(json.dumps({"spec": list(spec), "settings": asdict(settings),
                                   "progress": str(progress), "output": str(output)}))
    root = str(Path(__file__).resolve().parent.parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    started = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "tuner.ab.child", str(request)], env=env)
    seen = 0
    written_at = None  # when the result file appeared: a slow exit after it loses nothing
    try:
        while proc.poll() is None:
            time.sleep(0.2)
            seen = _echo_new(progress, seen, echo)
            if written_at is None and output.exists():
                written_at = time.time()
            if written_at is not None and time.time() - written_at > EXIT_GRACE_S:
                proc.kill()  # the measurement is written (atomically); its shutdown hangs
                proc.wait()
                break
            if written_at is None and timeout_s is not None and time.time() - started > timeout_s:
                proc.kill()
                proc.wait()
                stage = _last_stage(progress)
                return ChildResult(False, None, proc.returncode, stage,
                                   f"timed out: no result after {timeout_s:g}s (at: {stage}; "
                                   f"tuner ab --timeout gives each A/B longer)",
                                   time.time() - started)
    except KeyboardInterrupt:
        proc.kill()
        proc.wait()
        raise
    _echo_new(progress, seen, echo)
    stage = _last_stage(progress)
    seconds = time.time() - started
    if (proc.returncode == 0 or written_at is not None) and output.exists():
        return ChildResult(True, json.loads(output.read_text()), 0, stage, "", seconds)
    error = work / "error.txt"
    usage = work / "usage_error.txt"
    if proc.returncode == USAGE_EXIT and usage.exists():
        text = usage.read_text().strip()
        return ChildResult(False, None, proc.returncode, stage, text, seconds, usage_error=text)
    reason = f"the measurement process died at '{stage}' ({_exit_text(proc.returncode)})"
    if error.exists():
        reason += f": {error.read_text().strip()[:500]}"
    return ChildResult(False, None, proc.returncode, stage, reason, seconds)


def _echo_new(progress: Path, seen: int, echo) -> int:
    if echo is None or not progress.exists():
        return seen
    lines = progress.read_text().splitlines()
    for line in lines[seen:]:
        echo(line)
    return len(lines)


def _last_stage(progress: Path) -> str:
    if not progress.exists():
        return "start"
    lines = progress.read_text().splitlines()
    return lines[-1] if lines else "start"


def main(argv: list[str]) -> int:
    from ..errors import TunerError
    from .measure import ABSettings, measure

    request = json.loads(Path(argv[0]).read_text())
    progress = Path(request["progress"])
    settings = ABSettings(**{**request["settings"],
                             "families": tuple(request["settings"]["families"])})

    started = time.time()

    def stage(text: str) -> None:  # each stage with the seconds since the child started
        with open(progress, "a") as fh:
            fh.write(f"[{time.time() - started:5.0f}s] {text}\n")

    try:
        data = measure(tuple(request["spec"]), settings, stage)
    except TunerError as exc:  # the user's harness or flags: one line, no traceback
        (progress.parent / "usage_error.txt").write_text(str(exc))
        return USAGE_EXIT
    except Exception as exc:  # noqa: BLE001 - reported by the parent with the stage
        (progress.parent / "error.txt").write_text(f"{type(exc).__name__}: {exc}")
        raise
    tmp = Path(request["output"]).with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(request["output"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
