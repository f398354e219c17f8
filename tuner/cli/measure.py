"""Commands that read and measure: harvest, device, bench, budget, estimate."""

from __future__ import annotations

import argparse
import sys

from ..errors import TunerError
from ..units import parse_positive, parse_share, parse_threshold
from .flags import (device_flag, family_flag, gated_mlp_flag, kv_heads_flag, min_saving_flag,
                    topk_flag)

__all__ = ["_add_harvest", "cmd_harvest", "_add_device", "cmd_device", "_add_bench", "cmd_bench",
           "_add_budget", "cmd_budget", "_add_estimate", "cmd_estimate"]


# ----------------------------------------------------------------------------------------- harvest
HARVEST_EPILOG = """\
examples:
  tuner harvest shapes/examples/qwen25_05b_b4_decode.pt.trace.json.gz
  tuner harvest vllm_profile/ --rank 0 --phase decode -o shapes/llama_decode.parquet
  tuner harvest --live shapes/examples/qwen_live.py:QwenDecode --steps 8 -o shapes/qwen_live.parquet
  tuner harvest --watch /tmp/traces -o shapes/server.parquet
  tuner harvest replay.json.gz --capture capture.json.gz      a CUDA/HIP-graph replay and its capture
  tuner harvest --live model.py:Step --steps 8 --graph        capture the step as a CUDA graph

Reads torch profiler Chrome/Kineto traces (.json, .json.gz; CUDA or ROCm; torch 1.8+). A directory
holds one file per rank: rank 0 (or the first file) is harvested, --rank chooses; ranks are never
merged. A graph replay's kernels get their shapes from the trace of the graph's capture
(--capture, or a capture_traces/ folder in the directory). See docs/harvest.md.
The table (parquet) has one row per call signature and phase, with calls per step, median GPU
us per call and its share of the step; the top rows by share are printed.
"""


def _add_harvest(sub) -> None:
    p = sub.add_parser(
        "harvest", help="extract call shapes from torch profiler traces",
        description="Turn profiler traces of a real run into the ShapeTable: the GEMM and\n"
        "attention call shapes, how often each runs per step and how much of the step it takes.",
        epilog=HARVEST_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="*", metavar="TRACE",
                   help="trace files (.json, .json.gz) or profiler directories (one file per rank)")
    p.add_argument("-o", "--output", metavar="PATH",
                   help="shape table to write (default: shapes/<trace stem>.parquet)")
    p.add_argument("--rank", type=int, metavar="R",
                   help="which rank's trace to harvest from a directory (default: 0 or the first)")
    p.add_argument("--steps", type=int, metavar="N",
                   help="a trace without step markers holds N steps; with --live: calls to profile")
    p.add_argument("--phase", choices=("prefill", "decode", "other"),
                   help="keep only the rows of this phase")
    p.add_argument("--live", metavar="MODULE:CALLABLE",
                   help="profile CALLABLE (MODULE:NAME or path/to/file.py:NAME; a class is "
                   "instantiated once) for --steps calls, one profiler step each, and harvest it")
    p.add_argument("--save-trace", metavar="PATH",
                   help="with --live: also keep the raw trace here (.json or .json.gz); with "
                   "--graph a directory (the replay trace, and capture_traces/ beside it)")
    p.add_argument("--capture", nargs="+", metavar="CAPTURE",
                   help="traces (or directories) of the CUDA/HIP-graph captures whose replays "
                   "TRACE holds: their shapes are joined with the replay's kernel times "
                   "(default: a capture_traces/ folder beside the traces of a directory)")
    p.add_argument("--graph", action="store_true",
                   help="with --live: capture the callable's step as a CUDA graph, profile the "
                   "capture and --steps replays, and join them")
    p.add_argument("--device-name", metavar="NAME",
                   help="the GPU's name when the trace does not say it (e.g. 'AMD Instinct "
                   "MI300X'); it picks the device profile in budget")
    kv_heads_flag(p)
    topk_flag(p)
    gated_mlp_flag(p)
    p.add_argument("--watch", metavar="DIR",
                   help="keep harvesting new trace files written into DIR into one table at -o, "
                   "until Ctrl-C")
    p.add_argument("--interval", type=float, default=2.0, metavar="S",
                   help="with --watch: seconds between polls (default 2)")
    p.add_argument("--top", type=int, default=12, metavar="N",
                   help="how many rows to print (default 12)")
    p.set_defaults(func=cmd_harvest)


def cmd_harvest(args) -> int:
    from pathlib import Path

    from .. import harvest

    harvest.check_kv_heads(args.kv_heads)
    harvest.check_topk(args.topk)
    modes = sum(bool(x) for x in (args.traces, args.live, args.watch))
    if modes != 1:
        raise TunerError("harvest needs exactly one of: TRACE..., --live MODULE:CALLABLE, "
                         "--watch DIR")
    if args.steps is not None and args.steps < 1:
        raise TunerError("--steps must be >= 1")
    if args.graph and not args.live:
        raise TunerError("--graph goes with --live MODULE:CALLABLE")
    if args.capture and not args.traces:
        raise TunerError("--capture goes with the replay TRACE... it joins")
    from ..tables import check_output_file

    if args.live:
        out = args.output or Path("shapes") / f"live_{args.live.rpartition(':')[2]}.parquet"
        check_output_file(out, "-o")  # before any profiling
        result = harvest.live(args.live, args.steps, out, save_trace=args.save_trace,
                              phase=args.phase, quiet=True, graph=args.graph,
                              device_name=args.device_name, kv_heads=args.kv_heads,
                              topk=args.topk, gated_mlp=args.gated_mlp)
    elif args.watch:
        if args.kv_heads is not None:
            raise TunerError("--kv-heads goes with TRACE... or --live, not --watch")
        if args.gated_mlp:
            raise TunerError("--gated-mlp goes with TRACE... or --live, not --watch")
        out = args.output or Path("shapes") / f"{Path(args.watch).resolve().name}.parquet"
        harvest.watching.check_interval(args.interval)  # watch checks -o before its first poll
        harvest.watch(args.watch, out, rank=args.rank, steps=args.steps, phase=args.phase,
                      interval=args.interval, device_name=args.device_name, topk=args.topk)
        return 0
    else:
        files, captures = harvest.resolve_pairs(args.traces, args.rank, args.capture)
        out = args.output or harvest.default_output(files[0])
        check_output_file(out, "-o")  # before reading a trace
        result = harvest.harvest(files, out, rank=args.rank, steps=args.steps, phase=args.phase,
                                 quiet=True, capture=captures, device_name=args.device_name,
                                 kv_heads=args.kv_heads, topk=args.topk,
                                 gated_mlp=args.gated_mlp)
    harvest.report(result, top=args.top)
    return 0


# ------------------------------------------------------------------------------------------ device
def _add_device(sub) -> None:
    p = sub.add_parser(
        "device", help="detect the GPU and measure its bandwidth and matmul rate",
        description="Detect this machine's GPU (backend CUDA or ROCm, Hygon DCU, arch, warp size, "
        "multiprocessors, L2) and measure its read curve (how fast one kernel reads 256 KiB to "
        "2 GiB, cold, in CUDA-graph replays: the read bandwidth as its slope and the read latency "
        "every reading kernel pays, which the budget's floor adds), bf16 matmul rate and the fixed "
        "cost of one kernel; save the profile as JSON for budget, search and bench. Needs a GPU.")
    p.add_argument("--json", action="store_true", help="print the profile as JSON (default: text)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="directory for the saved profile (default artifacts/devices)")
    p.add_argument("--buffer-gib", type=float, default=4.0,
                   help="size of the read-bandwidth buffer in GiB (default 4; far above L2)")
    p.set_defaults(func=cmd_device)


def cmd_device(args) -> int:
    from .. import device

    profile = device.measure(buffer_bytes=int(args.buffer_gib * 2**30),
                             progress=lambda text: print(f"tuner device: {text}", file=sys.stderr,
                                                         flush=True))
    path = device.save_profile(profile, args.out or device.DEVICES_DIR)
    if args.json:
        print(profile.to_json())
    else:
        print(device.describe(profile))
        print(f"saved      {path}")
    return 0


# ------------------------------------------------------------------------------------------- bench
def _add_bench(sub) -> None:
    p = sub.add_parser(
        "bench", help="time baseline, default and given configs for one shape",
        description="Time one shape under the timing protocol (CUDA-graph replays, device events, "
        "median of group medians, cold L2 by default): the baseline (the path serving uses "
        "today), the family's default config and each --config, with the spread, TB/s and the "
        "parity facts; --sweep times the whole search space. Needs a GPU (or --torch-device cpu "
        "under TRITON_INTERPRET=1 to check the command). See docs/measure.md.")
    family_flag(p, what="kernel family")
    p.add_argument("--shape", required=True, metavar="KEY=V,...",
                   help="the shape, e.g. m=1,n=14336,k=5120 (gemv), m=512,n=896,k=896,layout=NT "
                   "(gemm), batch=4,heads=14,kv_heads=2,kv_len=300,head_dim=64 (attention)")
    p.add_argument("--dtype", default=None, help="bfloat16 (default) or float16")
    p.add_argument("--config", action="append", default=[], metavar="KEY=V,...",
                   help="a config to time besides baseline and default (repeatable)")
    p.add_argument("--cache", choices=("cold", "warm"), default="cold",
                   help="cold (default): rotate inputs past 2x L2 (weights from HBM); warm: one "
                   "input set")
    p.add_argument("--sweep", action="store_true",
                   help="also time every config of the search space (default: off)")
    p.add_argument("--top", type=int, default=5,
                   help="best configs to print after --sweep (default 5)")
    p.add_argument("--max-configs", type=int, default=None,
                   help="--sweep a seeded random sample of this many configs (+ the default); "
                   "default: every config")
    p.add_argument("--groups", type=int, default=10, help="timing groups (default 10)")
    p.add_argument("--replays", type=int, default=10, help="graph replays per group (default 10)")
    device_flag(p, "for the bandwidth share")
    p.add_argument("--torch-device", default=None, metavar="DEV",
                   help="torch device to run on (default: the current GPU); 'cpu' only with "
                        "TRITON_INTERPRET=1, to check the command, not to time anything")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args) -> int:
    from .. import bench

    bench.parse_shape(args.shape, args.dtype, family=args.family)  # one clear line, before any GPU
    for text in args.config:
        bench.parse_config(text, family=args.family)
    for flag, value in (("--top", args.top), ("--groups", args.groups), ("--replays", args.replays),
                        ("--max-configs", args.max_configs)):
        if value is not None and value < 1:
            raise TunerError(f"{flag} must be at least 1, got {value}")
    bench.run_command(args.family, args.shape, dtype=args.dtype, configs=args.config,
                      cache=args.cache, groups=args.groups, replays=args.replays,
                      device=args.torch_device, device_profile=args.device, do_sweep=args.sweep,
                      max_configs=args.max_configs, top=args.top)
    return 0


# ------------------------------------------------------------------------------------------ budget
def _add_budget(sub) -> None:
    p = sub.add_parser(
        "budget", help="physical floors and projected us/token; prune shapes",
        description="For each shape: the physical floor of one call (bytes / bandwidth, flops / "
        "matmul rate), the trace's baseline, and the most a kernel could save per token (per step "
        "of the phase) and as a share of the step; keep or prune against --min-saving. "
        "See docs/budget.md.")
    p.add_argument("shapes", help="a ShapeTable parquet from `tuner harvest`")
    device_flag(p, "for the floors")
    p.add_argument("--bandwidth", metavar="RATE", help="read bandwidth, e.g. 4.8TB/s (overrides)")
    p.add_argument("--matmul-rate", metavar="RATE", help="bf16 matmul rate, e.g. 989TFLOPs (overrides)")
    min_saving_flag(p, "keep a shape if --safety x its headroom saves this per token")
    p.add_argument("--safety", metavar="F", default="0.5",
                   help="part of the headroom a real kernel is assumed to reach (0-1]; default 0.5")
    p.add_argument("--phase", choices=("decode", "prefill", "other", "all"), default="all",
                   help="budget only the rows of this phase (default: all, each against its own step)")
    p.add_argument("--hit-rate", metavar="F", default="1.0",
                   help="share of the calls a tuned config would serve (0-1]; default 1.0")
    p.add_argument("--graph-captured", action="store_true",
                   help="compare with the step's GPU-busy time (the step under CUDA graphs) "
                   "instead of its wall time")
    p.add_argument("--min-kernel-us", metavar="US", default=None,
                   help="the fixed floor of one call: the shortest time one kernel takes inside a "
                   "graph on the device (default: the profile's measured kernel floor; 0: the "
                   "bytes/flops floor only)")
    p.add_argument("--measure", action="store_true",
                   help="re-measure the baseline us per call on this machine's GPU")
    p.add_argument("-o", "--output", metavar="PATH",
                   help="where to write the budget parquet (default artifacts/budget/<shapes>.parquet)")
    p.set_defaults(func=cmd_budget)


def cmd_budget(args) -> int:
    from .. import budget

    budget.run_command(
        args.shapes, device=args.device, bandwidth=args.bandwidth, matmul_rate=args.matmul_rate,
        threshold=parse_threshold(args.min_saving, safety=parse_positive(args.safety, "--safety")),
        hit_rate=parse_positive(args.hit_rate, "--hit-rate"), phase=args.phase,
        graph_captured=args.graph_captured,
        min_kernel_us=(None if args.min_kernel_us is None else
                       parse_positive(args.min_kernel_us, "--min-kernel-us", allow_zero=True)),
        measure=args.measure, output=args.output)
    return 0


# ---------------------------------------------------------------------------------------- estimate
def _add_estimate(sub) -> None:
    p = sub.add_parser(
        "estimate", help="saving per token / Amdahl calculator",
        description="Three questions: (1) --saving-us S --calls-per-step C --step-ms T: what a "
        "saving of S us per call is worth per token and as a share of the step; (2) --target P "
        "--calls-per-step C --step-ms T: the saving per call needed to move the step by P; "
        "(3) --speedup X --share F: Amdahl's bound on the whole step when a part taking share F "
        "of it gets X times faster.",
        epilog="examples:\n  tuner estimate --saving-us 3.1 --calls-per-step 48 --step-ms 44\n"
        "  tuner estimate --target 1% --calls-per-step 48 --step-ms 44\n"
        "  tuner estimate --speedup 1.08 --share 0.88",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--saving-us", metavar="US", help="saving per call, in us")
    p.add_argument("--target", metavar="SHARE", help="wanted share of the step, e.g. 1%% or 0.01")
    p.add_argument("--calls-per-step", metavar="N", help="calls of the kernel per step (per token)")
    p.add_argument("--step-ms", metavar="MS", help="step (token) time in ms")
    p.add_argument("--step-us", metavar="US", help="step (token) time in us")
    p.add_argument("--hit-rate", metavar="F", default="1.0",
                   help="share of the calls the faster kernel serves (0-1]; default 1.0")
    p.add_argument("--speedup", metavar="X", help="kernel speedup (old time / new time)")
    p.add_argument("--share", metavar="F", help="share of the step the kernel takes, e.g. 0.88 or 88%%")
    p.set_defaults(func=cmd_estimate)


def cmd_estimate(args) -> int:
    from .. import budget

    amdahl_mode = args.speedup is not None or args.share is not None
    saving_mode = args.saving_us is not None
    target_mode = args.target is not None
    if amdahl_mode + saving_mode + target_mode != 1:
        raise TunerError("give exactly one of: --saving-us (with --calls-per-step and --step-ms), "
                         "--target (with --calls-per-step and --step-ms), or --speedup with --share")
    if amdahl_mode:
        if args.speedup is None or args.share is None:
            raise TunerError("the Amdahl bound needs both --speedup and --share")
        speedup = parse_positive(args.speedup, "--speedup")
        share = parse_share(args.share, "--share")
        whole = budget.amdahl(share, speedup)
        print(f"a {speedup:g}x kernel on {share * 100:.4g}% of the step: the step gets "
              f"{whole:.4g}x faster, its time {(1 - 1 / whole) * 100:.3g}% shorter "
              f"(Amdahl: 1 / ((1 - {share:g}) + {share:g} / {speedup:g}))")
        return 0

    if args.calls_per_step is None or (args.step_ms is None) == (args.step_us is None):
        raise TunerError("give --calls-per-step and one of --step-ms / --step-us")
    calls = parse_positive(args.calls_per_step, "--calls-per-step")
    step_us = (parse_positive(args.step_ms, "--step-ms") * 1000.0 if args.step_ms is not None
               else parse_positive(args.step_us, "--step-us"))
    hit_rate = parse_positive(args.hit_rate, "--hit-rate")
    if hit_rate > 1:
        raise TunerError(f"--hit-rate must be in (0, 1], got {args.hit_rate!r}")
    hits = f" x hit rate {hit_rate:g}" if hit_rate != 1 else ""
    if saving_mode:
        saving = parse_positive(args.saving_us, "--saving-us")
        per_token = budget.saving_per_token(saving, calls, hit_rate)
        print(f"saving per token: {per_token:.4g} us ({saving:g} us x {calls:g} calls{hits})")
        print(f"share of the step: {per_token / step_us * 100:.3g}% of {step_us / 1000:g} ms")
    else:
        share = parse_share(args.target, "--target")
        needed = budget.saving_per_call_needed(share, step_us, calls, hit_rate)
        print(f"to save {share * 100:.4g}% of a {step_us / 1000:g} ms step "
              f"({share * step_us:.4g} us per token) over {calls:g} calls{hits}: "
              f"save {needed:.3g} us per call")
    return 0
