"""Make a large torch profiler trace by repeating a real one (for scripts/bench_harvest.py).

    python3 scripts/make_big_trace.py [--source TRACE] [--size-gb 1.0] [-o /tmp/big_trace.json]

Each copy of the source's traceEvents is shifted in time (by the source's span plus a gap) and
gets fresh ids: External id, correlation, flow ids and Ev Idx are offset per copy, and
ProfilerStep#N is renumbered, so the result reads as one long capture of many steps. The output
is written uncompressed, one event per line (about as many bytes per event as torch's own
export_chrome_trace layout, so a GB holds about as many events as a real trace of that size).
Do not commit the output (about 1 GB).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = ROOT / "shapes" / "examples" / "qwen25_05b_b4_decode.pt.trace.json.gz"
STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")


def load(path: Path) -> dict:
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rt") as f:
        return json.load(f)


def shifted(event: dict, copy: int, dt: float, d_ext: int, d_corr: int, d_step: int) -> dict:
    e = dict(event)
    if copy == 0:
        return e
    if isinstance(e.get("ts"), (int, float)):
        e["ts"] = round(e["ts"] + copy * dt, 3)
    if e.get("ph") in ("s", "f", "t") and isinstance(e.get("id"), int):
        e["id"] = e["id"] + copy * d_corr
    m = STEP_RE.match(e.get("name", ""))
    if m:
        e["name"] = f"ProfilerStep#{int(m.group(1)) + copy * d_step}"
    args = e.get("args")
    if isinstance(args, dict):
        args = dict(args)
        if isinstance(args.get("External id"), int):
            args["External id"] += copy * d_ext
        if isinstance(args.get("correlation"), int):
            args["correlation"] += copy * d_corr
        if isinstance(args.get("Ev Idx"), int):
            args["Ev Idx"] += copy * d_ext
        e["args"] = args
    return e


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("-o", "--output", type=Path, default=Path("/tmp/big_trace.json"))
    args = ap.parse_args(argv)

    trace = load(args.source)
    events = [e for e in trace["traceEvents"] if e.get("ph") != "M"]
    meta = [e for e in trace["traceEvents"] if e.get("ph") == "M"]
    ts = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    ends = [e["ts"] + e.get("dur", 0) for e in events if isinstance(e.get("ts"), (int, float))]
    dt = (max(ends) - min(ts)) + 1000.0
    ext = [e.get("args", {}).get("External id", 0) for e in events]
    ext += [e.get("args", {}).get("Ev Idx", 0) for e in events]
    corr = [e.get("args", {}).get("correlation", 0) for e in events]
    corr += [e["id"] for e in events if isinstance(e.get("id"), int)]
    d_ext = max(x for x in ext if isinstance(x, int)) + 1
    d_corr = max(x for x in corr if isinstance(x, int)) + 1
    steps = [int(m.group(1)) for e in events if (m := STEP_RE.match(e.get("name", "")))]
    d_step = max(steps) if steps else 0

    header = {k: v for k, v in trace.items() if k != "traceEvents"}
    target = int(args.size_gb * 1e9)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    written = copies = n_events = 0
    with open(args.output, "w") as f:
        head = json.dumps(header, indent=2)[:-2]      # drop the closing "\n}"
        f.write(head + ',\n  "traceEvents": [\n  ')
        first = True
        for e in meta:
            f.write(("" if first else ",\n  ") + json.dumps(e))
            first = False
        while written < target:
            parts = []
            for e in events:
                parts.append(json.dumps(shifted(e, copies, dt, d_ext, d_corr, d_step)))
            chunk = ("" if first else ",\n  ") + ",\n  ".join(parts)
            first = False
            f.write(chunk)
            written += len(chunk)
            copies += 1
            n_events += len(events)
        f.write('\n  ]\n}\n')
    size = args.output.stat().st_size
    print(f"wrote {args.output}: {size / 1e9:.2f} GB, {copies} copies of {args.source.name}, "
          f"{n_events + len(meta)} events")
    return 0


if __name__ == "__main__":
    sys.exit(main())
