"""The decode step of a transformers config under several Inductor option sets, with and
without an export, in one process: which compile option makes the step's non-linear kernels
slower or faster. Each variant is compiled afresh (torch._dynamo.reset), captured as one CUDA
graph, then all graphs are timed interleaved (groups of replays, medians) and each is profiled
for its kernels.

  PYTHONPATH=$PWD python3 scripts/gpu/compile_options.py --hf-config shapes/examples/models/qwen3_8b.json \
      --batch 8 --export DIR [--layers 4] [--variants base:default,tuned:max-autotune,...]

A variant is ARM:OPTIONS, ARM `base` (no export) or `tuned` (the export installed), OPTIONS
`default`, `max-autotune` (max-autotune-no-cudagraphs) or `k=v+k=v` Inductor options (e.g.
`max_autotune=1+coordinate_descent_tuning=0`). Prints each variant's step µs and the kernels whose
time differs most between the pairs named by --diff A/B (variant indices).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from tuner import serving
from tuner.ab.harness import hf_factory, make_harness
from tuner.harvest import kernel_totals
from tuner.timing import ReplayTimer, median, spread_pct


def _options(text: str) -> dict:
    if text == "default":
        return {}
    if text == "max-autotune":
        return {"mode": "max-autotune-no-cudagraphs"}
    opts = {}
    for item in text.split("+"):
        key, _, value = item.partition("=")
        opts[key] = bool(int(value)) if value in ("0", "1") else value
    return {"options": opts}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--hf-config", required=True)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--export", required=True)
    p.add_argument("--layers", type=int, default=0)
    p.add_argument("--variants", default="base:default,base:max-autotune,tuned:default,"
                   "tuned:max-autotune,tuned:max_autotune=1+coordinate_descent_tuning=0,"
                   "tuned:coordinate_descent_tuning=1")
    p.add_argument("--diff", default="0/2,1/3,2/3,4/3")
    p.add_argument("--groups", type=int, default=10)
    p.add_argument("--replays", type=int, default=8)
    p.add_argument("--top", type=int, default=8)
    p.add_argument("--out", default="", help="write each variant's kernel totals here (json)")
    a = p.parse_args()
    config = json.loads(Path(a.hf_config).read_text())
    if a.layers:
        config["num_hidden_layers"] = a.layers
    tmp = Path(tempfile.mkdtemp())
    (tmp / "config.json").write_text(json.dumps(config))
    harness = make_harness(hf_factory(tmp / "config.json"), batch=a.batch, prompt=128, steps=8,
                           dtype=torch.bfloat16, device="cuda", seed=0)
    decode = harness.decode
    variants = [v.split(":", 1) for v in a.variants.split(",")]
    graphs, steps = [], []
    with torch.no_grad():
        harness.prefill()
        for arm, opts in variants:
            torch._dynamo.reset()
            step = torch.compile(decode, backend="inductor", dynamic=False, **_options(opts))
            handle = serving.install(harness.model, export_dir=a.export) if arm == "tuned" else None
            try:
                if handle is not None:
                    handle.warmup(step)
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(3):
                        step()
                torch.cuda.current_stream().wait_stream(side)
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    step()
                torch.cuda.synchronize()
                hits = sum(sum(v.values()) for v in handle.hits().values()) if handle else 0
            finally:
                if handle is not None:
                    handle.uninstall()
            graphs.append(g)
            steps.append(step)  # its compiled code stays loaded while its graph replays
            print(f"captured {arm}:{opts} (serving hits {hits})", flush=True)
        timers = [ReplayTimer(g.replay) for g in graphs]
        for g in graphs:
            for _ in range(3):
                g.replay()
        torch.cuda.synchronize()
        times = [[] for _ in graphs]
        for k in range(a.groups):
            order = list(range(len(graphs)))
            order = order[k % len(order):] + order[:k % len(order)]
            for i in order:
                times[i].append(timers[i].group(a.replays))
        kernels = []
        from torch.profiler import ProfilerAction, ProfilerActivity, profile
        for i, g in enumerate(graphs):
            with profile(activities=[ProfilerActivity.CUDA],
                         schedule=lambda s: ProfilerAction.RECORD) as prof:
                for r in range(3):
                    if r:
                        prof.step()
                    g.replay()
                    torch.cuda.synchronize()
            path = tmp / f"v{i}.json"
            prof.export_chrome_trace(str(path))
            kernels.append(kernel_totals(path)[0])
            if a.out:
                Path(a.out).mkdir(parents=True, exist_ok=True)
                (Path(a.out) / f"v{i}-kernels.json").write_text(json.dumps(
                    {"variant": ":".join(variants[i]), "kernels": kernels[-1]}, indent=1))
    print(f"\n{'#':>2} {'variant':<60} {'step us':>9} {'spread':>7} {'GPU busy':>9} {'kernels':>8}")
    for i, (arm, opts) in enumerate(variants):
        busy = sum(us for us, _ in kernels[i].values())
        launches = sum(n for _, n in kernels[i].values())
        print(f"{i:>2} {arm + ':' + opts:<60} {median(times[i]):9.1f} "
              f"±{spread_pct(times[i]):5.2f}% {busy:9.1f} {launches:8.0f}")
    for pair in a.diff.split(","):
        x, y = (int(v) for v in pair.split("/"))
        if max(x, y) >= len(variants):
            continue
        names = set(kernels[x]) | set(kernels[y])
        rows = sorted(((kernels[y].get(n, (0, 0))[0] - kernels[x].get(n, (0, 0))[0], n)
                       for n in names), key=lambda r: -abs(r[0]))
        print(f"\nkernels, {y} minus {x} (us/step; launches/step {x} -> {y}):")
        for change, n in rows[:a.top]:
            print(f"  {change:+8.1f}  {kernels[x].get(n, (0, 0))[1]:g} -> "
                  f"{kernels[y].get(n, (0, 0))[1]:g}  {n[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
