"""Benchmark `tuner harvest` on a large trace against plain json.load (not a test).

    python3 scripts/make_big_trace.py -o /tmp/big_trace.json        # ~1 GB, not committed
    python3 scripts/bench_harvest.py /tmp/big_trace.json

Each contender runs in its own child process; wall time is measured around the child and the
peak resident memory is the child's ru_maxrss (os.wait4). Prints a markdown table for
BENCHMARKS.md with the versions and the machine.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

JSON_LOAD = ("import json, sys; d = json.load(open(sys.argv[1])); "
             "print(len(d['traceEvents']), 'events')")


def run(cmd: list[str]) -> tuple[float, float, int, str]:
    """(wall s, peak RSS GB, exit code, last output line) of one child process."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    return wall, usage.ru_maxrss / 1024 / 1024, proc.returncode, (lines[-1] if lines else "")


def versions() -> str:
    import ijson
    import pandas
    backend = getattr(ijson, "backend", "?")
    try:
        import ijson.backends.yajl2_c  # noqa: F401
        backend = "yajl2_c"
    except ImportError:
        pass
    return (f"Python {platform.python_version()}, ijson {ijson.__version__} ({backend} backend), "
            f"pandas {pandas.__version__}, {os.cpu_count()} CPUs, {platform.machine()} "
            f"{platform.system()} {platform.release()}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", type=Path)
    ap.add_argument("--skip-json-load", action="store_true")
    args = ap.parse_args(argv)
    if not args.trace.exists():
        print(f"no trace at {args.trace}; make one with scripts/make_big_trace.py", file=sys.stderr)
        return 2
    size_gb = args.trace.stat().st_size / 1e9
    out = Path("/tmp/bench_harvest.parquet")
    contenders = [("tuner harvest (ijson streaming)",
                   [sys.executable, "-m", "tuner.cli", "harvest", str(args.trace), "-o", str(out),
                    "--top", "3"])]
    if not args.skip_json_load:
        contenders.append(("json.load (whole document)",
                           [sys.executable, "-c", JSON_LOAD, str(args.trace)]))
    print(f"trace: {args.trace} ({size_gb:.2f} GB); {versions()}")
    print(f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; load average "
          f"before: {os.getloadavg()[0]:.1f} (other jobs on the machine slow every figure)")
    print()
    print("| what | wall s | peak RSS GB | exit | last line |")
    print("| --- | ---: | ---: | ---: | --- |")
    for name, cmd in contenders:
        wall, rss, rc, last = run(cmd)
        print(f"| {name} | {wall:.1f} | {rss:.2f} | {rc} | {last[:80]} |", flush=True)
    print(f"\nload average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
