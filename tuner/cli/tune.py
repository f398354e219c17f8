"""Commands that tune and decide: search, rank, export, run."""

from __future__ import annotations


from ..errors import TunerError
from ..units import parse_duration, parse_threshold
from .flags import (baseline_flag, device_flag, family_flag, gated_mlp_flag, kv_heads_flag,
                    min_saving_flag, parity_flags, step_baseline_of, storage_flag, timeout_flag,
                    topk_flag)

__all__ = ["_add_search", "cmd_search", "_add_rank", "cmd_rank", "_add_export", "cmd_export",
           "_add_run", "cmd_run"]


# ------------------------------------------------------------------------------------------ search
def _add_search(sub) -> None:
    p = sub.add_parser(
        "search", help="Optuna search over kernel parameters per surviving shape",
        description="Budget the shapes, then run one Optuna study per surviving shape (named "
        "device:family:shape) with one worker process per GPU. Running the same command again "
        "resumes. See docs/search.md.")
    p.add_argument("shapes", help="a ShapeTable parquet from `tuner harvest`")
    family_flag(p)
    storage_flag(p)
    timeout_flag(p, "wall time of the whole search, shared among the shapes in proportion to "
                  "their headroom per token", None)
    p.add_argument("--trials", type=int, metavar="N",
                   help="measured trials per shape (default 100 when no --timeout is given)")
    p.add_argument("--gpus", metavar="IDS", help="GPU ids to use, one worker each (default: all visible)")
    p.add_argument("--sampler", default="tpe", choices=("tpe", "grid", "random", "gp", "cmaes"),
                   help="tpe (default, with constraints), grid (every valid config once), random, "
                   "gp; cmaes is refused (categorical space)")
    device_flag(p, "for the budget and the study names")
    min_saving_flag(p, "search a shape if half its headroom saves this per token")
    parity_flags(p, "which outputs are feasible (as rank's gate)")
    p.add_argument("--graph-captured", action="store_true",
                   help="budget against the step's GPU-busy time (a server that replays the step "
                   "as a CUDA graph) instead of its wall time, as `tuner budget --graph-captured`")
    p.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    p.add_argument("--trial-timeout", metavar="DURATION", default="10m",
                   help="a trial (compile + parity + timing) running longer hangs: its worker is "
                   "killed and restarted (default 10m)")
    p.add_argument("--compile-threads", type=int, metavar="N",
                   help="threads per worker compiling the queued configs (default, known, "
                   "startup) ahead of their trials; 0: off (default: the cores left after one per "
                   "worker, at most 8)")
    p.add_argument("--heartbeat", type=int, default=10, metavar="S",
                   help="Optuna heartbeat interval in seconds (default 10)")
    p.add_argument("--grace", type=int, default=60, metavar="S",
                   help="a RUNNING trial without a heartbeat for this long is failed (default 60)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--objective", metavar="MODULE:FUNC",
                   help="for tests only: an objective factory replacing the GPU timing")
    p.set_defaults(func=cmd_search)


def cmd_search(args) -> int:
    from ..parity import resolve_gate
    from .. import search

    threshold = parse_threshold(args.min_saving)
    summary = search.search(
        args.shapes, args.family, device=args.device, storage=args.storage,
        timeout_s=parse_duration(args.timeout) if args.timeout else None,
        trials=args.trials, gpus=search.parse_gpus(args.gpus), sampler=args.sampler,
        threshold=threshold, seed=args.seed, parity_mode=resolve_gate(args.parity),
        parity_margin=args.parity_margin,
        trial_timeout_s=parse_duration(args.trial_timeout),
        objective_factory=args.objective, progress=not args.no_progress,
        heartbeat_s=args.heartbeat, grace_s=args.grace, graph_captured=args.graph_captured,
        compile_threads=args.compile_threads)
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
    storage_flag(p)
    family_flag(p, default=None, what="rank only this kernel family's studies")
    device_flag(p, "whose studies to rank (its key names them)")
    p.add_argument("--top", type=int, default=3,
                   help="distinct configs per study to re-measure (default 3)")
    parity_flags(p, "rank's parity gate")
    p.add_argument("--min-speedup", type=float, default=1.01,
                   help="the lower confidence bound of the paired speedup must reach this "
                   "(default 1.01)")
    min_saving_flag(p, "least measured saving per token to accept")
    baseline_flag(p)
    p.add_argument("-o", "--output", metavar="DIR", default="artifacts/verdicts",
                   help="where to write <name>.parquet and <name>.md (default artifacts/verdicts)")
    p.add_argument("--name", help="file name stem (default <device>-<family or all>)")
    p.set_defaults(func=cmd_rank)


def cmd_rank(args) -> int:
    from pathlib import Path

    from .. import rank
    from ..parity import resolve_gate
    from ..runtime import current_identity

    from ..tables import check_output_dir

    if args.top < 1:
        raise TunerError(f"--top must be at least 1, got {args.top}")
    if args.name is not None and (not args.name or args.name != Path(args.name).name
                                  or args.name in (".", "..")):
        raise TunerError(f"--name {args.name!r}: give a file name stem, not a path")
    check_output_dir(args.output, "-o")  # before any measurement
    step = step_baseline_of(args)
    if args.device:
        from ..device import choose_profile

        device = choose_profile(args.device)[0].device_key
    else:
        rank._require_gpu()  # the default device is this machine's GPU
        device = (current_identity() or {}).get("key")
    table = rank.rank(args.storage, family=args.family, device=device, top=args.top,
                      parity_mode=resolve_gate(args.parity), margin=args.parity_margin,
                      min_speedup=args.min_speedup,
                      threshold=args.min_saving, baseline=step)
    name = args.name or f"{device or 'all'}-{args.family or 'all'}"
    parquet, md = rank.write(table, args.output, name)
    for line in rank.summary_lines(table):
        print(line)
    if step:
        print(f"baseline: {step} (--baseline {step})")
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
    family_flag(p, default=None, what="export only this family")
    p.add_argument("--format", choices=("native", "vllm", "sglang"), default="native",
                   help="native (default): <family>.json per device; vllm: also write vLLM-style "
                   "N=..,K=..,device_name=..,dtype=...json files keyed by M (gemv, gemm) and "
                   "vLLM's fused MoE files E=..,N=..,device_name=...json (moe); sglang: also "
                   "SGLang's fused MoE files under triton_<version>/ (moe). See "
                   "docs/rank_export.md")
    p.add_argument("-o", "--output", metavar="DIR", default="artifacts/export",
                   help="export root (default artifacts/export)")
    p.add_argument("--no-kernel-check", action="store_true",
                   help="export even if the kernel source changed since ranking (the loader will "
                   "then refuse the file unless the hashes match)")
    p.add_argument("--drop-step-losses", metavar="AB_JSON", action="append", default=[],
                   help="leave out every entry whose calls the whole step of this `tuner ab` "
                   "result (its ab.json) ran slower than the baseline, per its per-shape "
                   "attribution (repeatable; docs/rank_export.md)")
    p.set_defaults(func=cmd_export)


def cmd_export(args) -> int:
    from .. import export

    formats = ("native",) if args.format == "native" else ("native", args.format)
    export.run_cli(args.verdicts, family=args.family, formats=formats, out_root=args.output,
                   check_kernel_hash=not args.no_kernel_check,
                   drop_step_losses=args.drop_step_losses)
    return 0


# --------------------------------------------------------------------------------------------- run
def _add_run(sub) -> None:
    p = sub.add_parser(
        "run", help="harvest, budget, search, rank and export in one command",
        description="The main job: harvest TRACE, budget its shapes, search the survivors under "
        "--timeout, rank the results and export the winners, then summarise. Without a GPU it "
        "harvests, budgets and prints the search plan (exit 0). See docs/rank_export.md.")
    p.add_argument("trace", help="a torch profiler trace (.json / .json.gz)")
    family_flag(p)
    timeout_flag(p, "search time budget", "30m")
    storage_flag(p)
    device_flag(p, "for the budget")
    min_saving_flag(p, "budget and rank threshold")
    p.add_argument("--graph-captured", action="store_true",
                   help="budget against the GPU-busy step (the step under CUDA/HIP graphs) "
                   "instead of its wall time")
    parity_flags(p, "the search's and rank's parity gate")
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
    kv_heads_flag(p)
    topk_flag(p)
    gated_mlp_flag(p)
    baseline_flag(p)
    p.set_defaults(func=cmd_run)


def cmd_run(args) -> int:
    from ..parity import resolve_gate
    from .. import run

    result = run.run(args.trace, family=args.family, timeout=args.timeout, storage=args.storage,
                     device=args.device, min_saving=args.min_saving, out_dir=args.output,
                     export_root=args.export_dir, top=args.top, parity=resolve_gate(args.parity),
                     parity_margin=args.parity_margin,
                     min_speedup=args.min_speedup, graph_captured=args.graph_captured,
                     trials=args.trials, ab=args.ab, ab_batch=args.ab_batch,
                     kv_heads=args.kv_heads, baseline=step_baseline_of(args), topk=args.topk,
                     gated_mlp=args.gated_mlp)
    return result.ab_exit or 0
