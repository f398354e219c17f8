"""The `tuner` command line. It only parses arguments and calls the stage modules.

Each sub-command has one `_add_<name>` function that declares its flags and one `cmd_<name>`
function that delegates to the stage's Python API. A `TunerError` from any stage is printed as
one line (``tuner: error: ...``) with exit code 2; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import sys

from .errors import TunerError
from .units import parse_duration, parse_positive, parse_share, parse_threshold

EPILOG = """\
the day of a user:
  tuner harvest trace.json.gz -o shapes/my.parquet   call shapes from a profiler trace
  tuner budget shapes/my.parquet --device h200       which shapes can matter at all
  tuner search shapes/my.parquet --family gemv       Optuna search, overnight, every GPU
  tuner rank --family gemv                           parity + paired timing, ranked by us/token
  tuner export                                       configs a serving build loads
  tuner run trace.json.gz                            all of the above in one command
"""


# --------------------------------------------------------------------- flags shared by commands
# Each flag that several commands take is declared once here, so its meaning, default and help
# read the same in every command.
DEFAULT_STORAGE_TEXT = "sqlite:///artifacts/studies.db"


def _device_flag(p, what: str) -> None:
    from .device import spec_names

    p.add_argument("--device", metavar="PROFILE",
                   help=f"device profile {what}: a JSON from `tuner device`, a saved profile name "
                   f"or a spec name ({spec_names()}: published peaks, not measured); default: the "
                   "measured profile of this machine's GPU or of the table's device, else the spec "
                   "profile matching the device's name")


def _family_flag(p, default: str | None = "gemv", what: str = "kernel family to tune") -> None:
    import kernels

    names = ", ".join(kernels.family_names())
    p.add_argument("--family", default=default, metavar="NAME",
                   help=f"{what} ({names}); default {default or 'all'}")


def _min_saving_flag(p, what: str) -> None:
    p.add_argument("--min-saving", metavar="THRESHOLD", default="0.5%",
                   help=f"{what}: a share of the step (0.5%%) or a time per token (40us, 0.04ms); "
                   "default 0.5%%")


def _storage_flag(p) -> None:
    p.add_argument("--storage", metavar="URL",
                   help="Optuna storage: sqlite:///path.db or postgresql://user:pass@host/db (shared "
                   f"between hosts); a plain path is a SQLite file; default {DEFAULT_STORAGE_TEXT}")


def _parity_flags(p, what: str = "which candidates keep output parity") -> None:
    from .parity import ALIASES, DEFAULT_GATE, DEFAULT_MARGIN, GATE_HELP, GATES

    p.add_argument("--parity", choices=(*GATES, *ALIASES), default=DEFAULT_GATE, metavar="GATE",
                   help=f"{what}: {GATE_HELP}; default {DEFAULT_GATE}")
    p.add_argument("--parity-margin", type=float, default=DEFAULT_MARGIN, metavar="X",
                   help="the accuracy gate's bar: error at most X times the serving path's own "
                   f"(default {DEFAULT_MARGIN:g})")


def _timeout_flag(p, what: str, default: str | None) -> None:
    p.add_argument("--timeout", metavar="DURATION", default=default,
                   help=f"{what}: 8h, 90m, 30s, 1h30m, or a bare number of seconds"
                   + (f"; default {default}" if default else ""))


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

    from . import harvest

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
    if args.live:
        out = args.output or Path("shapes") / f"live_{args.live.rpartition(':')[2]}.parquet"
        result = harvest.live(args.live, args.steps, out, save_trace=args.save_trace,
                              phase=args.phase, quiet=True, graph=args.graph,
                              device_name=args.device_name)
    elif args.watch:
        out = args.output or Path("shapes") / f"{Path(args.watch).resolve().name}.parquet"
        harvest.watch(args.watch, out, rank=args.rank, steps=args.steps, phase=args.phase,
                      interval=args.interval, device_name=args.device_name)
        return 0
    else:
        files, captures = harvest.resolve_pairs(args.traces, args.rank, args.capture)
        out = args.output or harvest.default_output(files[0])
        result = harvest.harvest(files, out, rank=args.rank, steps=args.steps, phase=args.phase,
                                 quiet=True, capture=captures, device_name=args.device_name)
    harvest.report(result, top=args.top)
    return 0


# ------------------------------------------------------------------------------------------ device
def _add_device(sub) -> None:
    p = sub.add_parser(
        "device", help="detect the GPU and measure its bandwidth and matmul rate",
        description="Detect this machine's GPU (backend CUDA or ROCm, Hygon DCU, arch, warp size, "
        "multiprocessors, L2) and measure its read bandwidth, bf16 matmul rate and the fixed "
        "cost of one kernel; save the profile as JSON for budget, search and bench. Needs a GPU.")
    p.add_argument("--json", action="store_true", help="print the profile as JSON (default: text)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="directory for the saved profile (default artifacts/devices)")
    p.add_argument("--buffer-gib", type=float, default=4.0,
                   help="size of the read-bandwidth buffer in GiB (default 4; far above L2)")
    p.set_defaults(func=cmd_device)


def cmd_device(args) -> int:
    from . import device

    profile = device.measure(buffer_bytes=int(args.buffer_gib * 2**30))
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
    _family_flag(p, what="kernel family")
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
    _device_flag(p, "for the bandwidth share")
    p.add_argument("--torch-device", default=None, metavar="DEV",
                   help="torch device to run on (default: the current GPU); 'cpu' only with "
                        "TRITON_INTERPRET=1, to check the command, not to time anything")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args) -> int:
    from . import bench

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
    _device_flag(p, "for the floors")
    p.add_argument("--bandwidth", metavar="RATE", help="read bandwidth, e.g. 4.8TB/s (overrides)")
    p.add_argument("--matmul-rate", metavar="RATE", help="bf16 matmul rate, e.g. 989TFLOPs (overrides)")
    _min_saving_flag(p, "keep a shape if --safety x its headroom saves this per token")
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
    from . import budget

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
    from . import budget

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


# ------------------------------------------------------------------------------------------ search
def _add_search(sub) -> None:
    p = sub.add_parser(
        "search", help="Optuna search over kernel parameters per surviving shape",
        description="Budget the shapes, then run one Optuna study per surviving shape (named "
        "device:family:shape) with one worker process per GPU. Running the same command again "
        "resumes. See docs/search.md.")
    p.add_argument("shapes", help="a ShapeTable parquet from `tuner harvest`")
    _family_flag(p)
    _storage_flag(p)
    _timeout_flag(p, "wall time of the whole search, shared among the shapes in proportion to "
                  "their headroom per token", None)
    p.add_argument("--trials", type=int, metavar="N",
                   help="measured trials per shape (default 100 when no --timeout is given)")
    p.add_argument("--gpus", metavar="IDS", help="GPU ids to use, one worker each (default: all visible)")
    p.add_argument("--sampler", default="tpe", choices=("tpe", "grid", "random", "gp", "cmaes"),
                   help="tpe (default, with constraints), grid (every valid config once), random, "
                   "gp; cmaes is refused (categorical space)")
    _device_flag(p, "for the budget and the study names")
    _min_saving_flag(p, "search a shape if half its headroom saves this per token")
    _parity_flags(p, "which outputs are feasible (as rank's gate)")
    p.add_argument("--graph-captured", action="store_true",
                   help="budget against the step's GPU-busy time (a server that replays the step "
                   "as a CUDA graph) instead of its wall time, as `tuner budget --graph-captured`")
    p.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    p.add_argument("--trial-timeout", metavar="DURATION", default="10m",
                   help="a trial (compile + parity + timing) running longer hangs: its worker is "
                   "killed and restarted (default 10m)")
    p.add_argument("--heartbeat", type=int, default=10, metavar="S",
                   help="Optuna heartbeat interval in seconds (default 10)")
    p.add_argument("--grace", type=int, default=60, metavar="S",
                   help="a RUNNING trial without a heartbeat for this long is failed (default 60)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--objective", metavar="MODULE:FUNC",
                   help="for tests only: an objective factory replacing the GPU timing")
    p.set_defaults(func=cmd_search)


def cmd_search(args) -> int:
    from .parity import resolve_gate
    from . import search

    threshold = parse_threshold(args.min_saving)
    summary = search.search(
        args.shapes, args.family, device=args.device, storage=args.storage,
        timeout_s=parse_duration(args.timeout) if args.timeout else None,
        trials=args.trials, gpus=search.parse_gpus(args.gpus), sampler=args.sampler,
        threshold=threshold, seed=args.seed, parity_mode=resolve_gate(args.parity),
        parity_margin=args.parity_margin,
        trial_timeout_s=parse_duration(args.trial_timeout),
        objective_factory=args.objective, progress=not args.no_progress,
        heartbeat_s=args.heartbeat, grace_s=args.grace, graph_captured=args.graph_captured)
    print(search.format_summary(summary))
    if summary.interrupted:
        return 130
    why = search.problem(summary)
    if why:
        raise TunerError(f"the search found nothing: {why}")
    return 0


# -------------------------------------------------------------------------------------------- rank
def _add_rank(sub) -> None:
    p = sub.add_parser(
        "rank", help="re-measure the best configs; rank by projected us/token",
        description="For every study (tuner search) re-measure its best few distinct configs "
        "against the baseline (the path serving uses today) and the family's default config, "
        "paired and interleaved. Gates: output parity, the lower confidence bound of the speedup "
        ">= --min-speedup, and projected saving per token >= --min-saving. Survivors are ranked "
        "by projected us saved per token; rejected candidates keep their reason. Writes the "
        "verdict table (parquet + markdown). Needs a GPU. See docs/rank_export.md.")
    _storage_flag(p)
    _family_flag(p, default=None, what="rank only this kernel family's studies")
    _device_flag(p, "whose studies to rank (its key names them)")
    p.add_argument("--top", type=int, default=3,
                   help="distinct configs per study to re-measure (default 3)")
    _parity_flags(p, "rank's parity gate")
    p.add_argument("--min-speedup", type=float, default=1.01,
                   help="the lower confidence bound of the paired speedup must reach this "
                   "(default 1.01)")
    _min_saving_flag(p, "least measured saving per token to accept")
    p.add_argument("-o", "--output", metavar="DIR", default="artifacts/verdicts",
                   help="where to write <name>.parquet and <name>.md (default artifacts/verdicts)")
    p.add_argument("--name", help="file name stem (default <device>-<family or all>)")
    p.set_defaults(func=cmd_rank)


def cmd_rank(args) -> int:
    from pathlib import Path

    from . import rank
    from .parity import resolve_gate
    from .runtime import current_identity

    from .tables import check_output_dir

    if args.top < 1:
        raise TunerError(f"--top must be at least 1, got {args.top}")
    if args.name is not None and (not args.name or args.name != Path(args.name).name
                                  or args.name in (".", "..")):
        raise TunerError(f"--name {args.name!r}: give a file name stem, not a path")
    check_output_dir(args.output, "-o")  # before any measurement
    if args.device:
        from .device import choose_profile

        device = choose_profile(args.device)[0].device_key
    else:
        rank._require_gpu()  # the default device is this machine's GPU
        device = (current_identity() or {}).get("key")
    table = rank.rank(args.storage, family=args.family, device=device, top=args.top,
                      parity_mode=resolve_gate(args.parity), margin=args.parity_margin,
                      min_speedup=args.min_speedup,
                      threshold=args.min_saving)
    name = args.name or f"{device or 'all'}-{args.family or 'all'}"
    parquet, md = rank.write(table, args.output, name)
    for line in rank.summary_lines(table):
        print(line)
    print(f"verdicts: {parquet} and {md}")
    return 0


# ------------------------------------------------------------------------------------------ export
def _add_export(sub) -> None:
    p = sub.add_parser(
        "export", help="write accepted configs for serving builds",
        description="Write the accepted configs of verdict tables (tuner rank) per family under "
        "<dir>/<device>/<family>.json with a manifest.json: configs keyed by shape, device, arch, "
        "backend, torch/triton versions, kernel source hash, numerics-changing compile options, "
        "parity mode and the measured numbers. Written atomically. tuner.runtime.config_for "
        "reads them. See docs/rank_export.md.")
    p.add_argument("verdicts", nargs="*",
                   help="verdict parquet files (default: every *.parquet under artifacts/verdicts)")
    _family_flag(p, default=None, what="export only this family")
    p.add_argument("--format", choices=("native", "vllm"), default="native",
                   help="native (default): <family>.json per device; vllm: also write vLLM-style "
                   "N=..,K=..,device_name=..,dtype=...json files keyed by M (gemv, gemm)")
    p.add_argument("-o", "--output", metavar="DIR", default="artifacts/export",
                   help="export root (default artifacts/export)")
    p.add_argument("--no-kernel-check", action="store_true",
                   help="export even if the kernel source changed since ranking (the loader will "
                   "then refuse the file unless the hashes match)")
    p.set_defaults(func=cmd_export)


def cmd_export(args) -> int:
    from . import export

    formats = ("native", "vllm") if args.format == "vllm" else ("native",)
    export.run_cli(args.verdicts, family=args.family, formats=formats, out_root=args.output,
                   check_kernel_hash=not args.no_kernel_check)
    return 0


# --------------------------------------------------------------------------------------------- run
def _add_run(sub) -> None:
    p = sub.add_parser(
        "run", help="harvest, budget, search, rank and export in one command",
        description="The main job: harvest TRACE, budget its shapes, search the survivors under "
        "--timeout, rank the results and export the winners, then summarise. Without a GPU it "
        "harvests, budgets and prints the search plan (exit 0). See docs/rank_export.md.")
    p.add_argument("trace", help="a torch profiler trace (.json / .json.gz)")
    _family_flag(p)
    _timeout_flag(p, "search time budget", "30m")
    _storage_flag(p)
    _device_flag(p, "for the budget")
    _min_saving_flag(p, "budget and rank threshold")
    p.add_argument("--graph-captured", action="store_true",
                   help="budget against the GPU-busy step (the step under CUDA/HIP graphs) "
                   "instead of its wall time")
    _parity_flags(p, "the search's and rank's parity gate")
    p.add_argument("--min-speedup", type=float, default=1.01,
                   help="rank's speedup gate on the lower confidence bound (default 1.01)")
    p.add_argument("--top", type=int, default=3, help="configs per shape to re-measure (default 3)")
    p.add_argument("--trials", type=int,
                   help="stop each shape's search after this many trials (default: the time budget)")
    p.add_argument("-o", "--output", metavar="DIR",
                   help="where shapes, budget, plan and verdicts go (default artifacts/run/<trace>)")
    p.add_argument("--export-dir", metavar="DIR", default="artifacts/export",
                   help="export root (default artifacts/export, where the loader looks)")
    p.add_argument("--ab", metavar="MODULE:CALLABLE",
                   help="end with `tuner ab` of this harness with the export (docs/ab.md); the exit "
                   "code is then the A/B's (0 faster with outputs in the floor, 3 not)")
    p.add_argument("--ab-batch", type=int, default=1, metavar="B",
                   help="the batch size of the A/B (default 1; the trace's batch is the one to use)")
    p.set_defaults(func=cmd_run)


def cmd_run(args) -> int:
    from .parity import resolve_gate
    from . import run

    result = run.run(args.trace, family=args.family, timeout=args.timeout, storage=args.storage,
                     device=args.device, min_saving=args.min_saving, out_dir=args.output,
                     export_root=args.export_dir, top=args.top, parity=resolve_gate(args.parity),
                     parity_margin=args.parity_margin,
                     min_speedup=args.min_speedup, graph_captured=args.graph_captured,
                     trials=args.trials, ab=args.ab, ab_batch=args.ab_batch)
    return result.ab_exit or 0


# ---------------------------------------------------------------------------------------------- ab
AB_EPILOG = """\
examples:
  tuner ab shapes/examples/qwen_live.py:QwenDecode --batch 4
  tuner ab --hf-config qwen3_8b.json --batch 1,32 --export artifacts/export/nvidia-h200

MODULE:CALLABLE returns a harness: model, prefill(), decode() (one step over static buffers,
capturable as a graph) and feed(tokens); it is called with the keyword arguments it accepts among
batch, prompt, steps, dtype, device, seed. docs/ab.md has the contract and the verdict rules.
exit codes: 0 faster beyond the A/A margin with outputs within the floor; 3 slower, diverged or
crashed; 2 a usage error or no GPU.
"""


def _add_ab(sub) -> None:
    p = sub.add_parser(
        "ab", help="the model's decode step both ways under CUDA graphs: measured vs projected",
        description="Capture the model's decode step (static KV cache) as one CUDA/HIP graph "
        "three ways in one process: baseline, tuned (tuner.serving with the export) and baseline "
        "again (A/A, the noise floor); time interleaved groups of replays, compare each arm's "
        "logits and tokens with an fp32 reference of the same weights, and attribute the saving "
        "per call shape against the export's projection. A crash is a reported result (the "
        "measurement runs in a child process).",
        epilog=AB_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", nargs="?", metavar="MODULE:CALLABLE",
                   help="the harness factory (module or path/to/file.py, then :name)")
    p.add_argument("--hf-config", metavar="CONFIG.json",
                   help="a transformers model config (model_type, sizes): random weights, no "
                   "download; needs transformers")
    p.add_argument("--batch", default="1", metavar="B[,B...]",
                   help="batch sizes, one A/B each (default 1)")
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens (default 128)")
    p.add_argument("--steps", type=int, default=32,
                   help="decode steps compared per arm (default 32)")
    p.add_argument("--export", metavar="DIR",
                   help="export directory to test (default: artifacts/export/<this GPU>)")
    _family_flag(p, default="gemv,gemm,attention", what="kernel families to install")
    p.add_argument("--groups", type=int, default=20, help="timing groups per arm (default 20)")
    p.add_argument("--replays", type=int, default=10,
                   help="graph replays per timing group (default 10)")
    p.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16",
                   help="the model's dtype (default bfloat16)")
    p.add_argument("--no-reference", action="store_true",
                   help="skip the fp32 reference (outputs then are not judged: exit 3)")
    p.add_argument("--no-profile", action="store_true",
                   help="skip the profiled replays (no per-shape attribution)")
    p.add_argument("--trace-only", action="store_true",
                   help="only profile the baseline step's graph capture and replays, and print "
                   "the `tuner harvest` command that turns them into the model's shape table")
    _timeout_flag(p, "per batch size, for the whole measurement", "20m")
    p.add_argument("-o", "--output", metavar="DIR", default="artifacts/ab",
                   help="where <model>-b<batch>/ab.json and ab.md go (default artifacts/ab)")
    p.set_defaults(func=cmd_ab)


def cmd_ab(args) -> int:
    from . import ab

    if bool(args.target) == bool(args.hf_config):
        raise TunerError("tuner ab needs exactly one of: MODULE:CALLABLE, --hf-config CONFIG.json")
    spec = ("hf", args.hf_config) if args.hf_config else ("callable", args.target)
    try:
        batches = [int(b) for b in str(args.batch).split(",") if b.strip()]
    except ValueError:
        raise TunerError(f"--batch wants comma-separated integers, got {args.batch!r}") from None
    families = tuple(f.strip() for f in str(args.family).split(",") if f.strip())
    settings = ab.ABSettings(prompt=args.prompt, steps=args.steps, groups=args.groups,
                             replays=args.replays, export_dir=args.export, families=families,
                             reference=not args.no_reference, profile=not args.no_profile,
                             dtype=args.dtype, trace_only=args.trace_only)
    return ab.run(spec, batches=batches, settings=settings, out_root=args.output,
                  timeout_s=parse_duration(args.timeout))


# ------------------------------------------------------------------------------------------ report
def _add_report(sub) -> None:
    p = sub.add_parser(
        "report", help="re-render report.html of a run or A/B directory",
        description="Write DIR/report.html again from what DIR holds: the budget, the plan, the "
        "search (the Optuna studies in the storage the run recorded in run.json), the verdicts "
        "and the A/Bs (DIR/ab.json, DIR/ab/*/ab.json). One self-contained file; charts need "
        "matplotlib (the `report` extra). See docs/report.md.")
    p.add_argument("directory", metavar="DIR",
                   help="the -o folder of `tuner run` (artifacts/run/<trace>/) or of `tuner ab` "
                   "(artifacts/ab/<label>/)")
    p.add_argument("--storage", metavar="URL",
                   help="the study storage, instead of the one recorded in DIR/run.json (e.g. a "
                   "PostgreSQL URL with its password, or a moved SQLite file)")
    p.add_argument("--ab", action="append", default=[], metavar="PATH",
                   help="an A/B to include (a folder `tuner ab` wrote, or its ab.json); repeatable")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="where to write (default DIR/report.html)")
    p.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    from . import report

    path = report.render(args.directory, storage=args.storage, ab=args.ab, output=args.output)
    print(f"report: {path}")
    return 0


# ------------------------------------------------------------------------------------------- main
class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's one wording for an error: one line `tuner: error: ...`, exit 2
    (argparse's own prints its usage block first)."""

    def error(self, message):
        where = self.prog.removeprefix("tuner").strip()
        context = f"{where}: " if where else ""
        sys.stderr.write(f"tuner: error: {context}{message} (see `{self.prog} --help`)\n")
        sys.exit(2)


def _command_list(parser) -> str:
    """'  name   help' per sub-command, in the order they were declared."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    rows = [(choice.dest, choice.help or "") for choice in sub._choices_actions]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"  {name.ljust(width)}  {text}" for name, text in rows)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tuner",
        description="Kernel autotuner and shape screening for LLM inference: find which kernel "
        "config, on which real call shape, saves how many microseconds per generated token "
        "without changing the output.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in (_add_harvest, _add_budget, _add_estimate, _add_device, _add_bench, _add_search,
                _add_rank, _add_export, _add_run, _add_ab, _add_report):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        print("tuner: error: give a command (`tuner COMMAND --help` for its flags, `tuner --help` "
              "for the day of a user); commands:", file=sys.stderr)
        print(_command_list(parser), file=sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except TunerError as exc:
        if args.debug:
            import traceback

            traceback.print_exc()
        print(f"tuner: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tuner: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `tuner budget ... | head`
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # a bug: one line, and the traceback with --debug
        from .errors import one_line

        if args.debug:
            import traceback

            traceback.print_exc()
        print(f"tuner: error: internal error ({one_line(exc)}); rerun with --debug for the "
              f"traceback and report it", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
