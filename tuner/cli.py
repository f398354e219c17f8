"""The `tuner` command line. It only parses arguments and calls the stage modules.

Each sub-command has one `_add_<name>` function that declares its flags and one `cmd_<name>`
function that delegates to the stage's Python API. A `TunerError` from any stage is printed as
one line (``tuner: error: ...``) with exit code 2; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import sys

from .errors import TunerError

EPILOG = """\
the day of a user:
  tuner harvest trace.json.gz -o shapes/my.parquet   call shapes from a profiler trace
  tuner budget shapes/my.parquet --device h200       which shapes can matter at all
  tuner search shapes/my.parquet --family gemv       Optuna search, overnight, every GPU
  tuner rank --family gemv                           parity + paired timing, ranked by us/token
  tuner export                                       configs a serving build loads
  tuner run trace.json.gz                            all of the above in one command
"""


# ----------------------------------------------------------------------------------------- harvest
def _add_harvest(sub) -> None:
    p = sub.add_parser("harvest", help="extract call shapes from torch profiler traces")
    p.set_defaults(func=cmd_harvest)


def cmd_harvest(args) -> int:
    raise TunerError("harvest is not implemented yet")


# ------------------------------------------------------------------------------------------ device
def _add_device(sub) -> None:
    p = sub.add_parser("device", help="detect the GPU and measure its bandwidth and matmul rate")
    p.set_defaults(func=cmd_device)


def cmd_device(args) -> int:
    raise TunerError("device is not implemented yet")


# ------------------------------------------------------------------------------------------- bench
def _add_bench(sub) -> None:
    p = sub.add_parser("bench", help="time baseline, default and given configs for one shape")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args) -> int:
    raise TunerError("bench is not implemented yet")


# ------------------------------------------------------------------------------------------ budget
def _add_budget(sub) -> None:
    p = sub.add_parser("budget", help="physical floors and projected us/token; prune shapes")
    p.set_defaults(func=cmd_budget)


def cmd_budget(args) -> int:
    raise TunerError("budget is not implemented yet")


# ---------------------------------------------------------------------------------------- estimate
def _add_estimate(sub) -> None:
    p = sub.add_parser("estimate", help="saving per token / Amdahl calculator")
    p.set_defaults(func=cmd_estimate)


def cmd_estimate(args) -> int:
    raise TunerError("estimate is not implemented yet")


# ------------------------------------------------------------------------------------------ search
def _add_search(sub) -> None:
    p = sub.add_parser("search", help="Optuna search over kernel parameters per surviving shape")
    p.set_defaults(func=cmd_search)


def cmd_search(args) -> int:
    raise TunerError("search is not implemented yet")


# -------------------------------------------------------------------------------------------- rank
def _add_rank(sub) -> None:
    p = sub.add_parser("rank", help="re-measure the best configs; rank by projected us/token")
    p.set_defaults(func=cmd_rank)


def cmd_rank(args) -> int:
    raise TunerError("rank is not implemented yet")


# ------------------------------------------------------------------------------------------ export
def _add_export(sub) -> None:
    p = sub.add_parser("export", help="write accepted configs for serving builds")
    p.set_defaults(func=cmd_export)


def cmd_export(args) -> int:
    raise TunerError("export is not implemented yet")


# --------------------------------------------------------------------------------------------- run
def _add_run(sub) -> None:
    p = sub.add_parser("run", help="harvest, budget, search, rank and export in one command")
    p.set_defaults(func=cmd_run)


def cmd_run(args) -> int:
    raise TunerError("run is not implemented yet")


# ------------------------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
                _add_rank, _add_export, _add_run):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except TunerError as exc:
        if args.debug:
            raise
        print(f"tuner: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tuner: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
