"""The `tuner` command line. It only parses arguments and calls the stage modules.

Each sub-command has one `_add_<name>` function that declares its flags and one `cmd_<name>`
function that delegates to the stage's Python API, grouped in three modules (measure: harvest,
device, bench, budget, estimate; tune: search, rank, export, run; evidence: ab, report); the
flags several commands share are declared once in `flags`. A `TunerError` from any stage is printed as
one line (``tuner: error: ...``) with exit code 2; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import TunerError
from .evidence import _add_ab, _add_report
from .measure import _add_bench, _add_budget, _add_device, _add_estimate, _add_harvest
from .tune import _add_export, _add_rank, _add_run, _add_search

__all__ = ["build_parser", "main"]

EPILOG = """\
the day of a user:
  tuner harvest trace.json.gz -o shapes/my.parquet   call shapes from a profiler trace
  tuner budget shapes/my.parquet --device h200       which shapes can matter at all
  tuner search shapes/my.parquet --family gemv       Optuna search, overnight, every GPU
  tuner rank --family gemv                           parity + paired timing, ranked by us/token
  tuner export                                       configs a serving build loads
  tuner run trace.json.gz                            all of the above in one command
"""



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
        from ..errors import one_line

        if args.debug:
            import traceback

            traceback.print_exc()
        print(f"tuner: error: internal error ({one_line(exc)}); rerun with --debug for the "
              f"traceback and report it", file=sys.stderr)
        return 1


