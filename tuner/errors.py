"""User-facing errors and warnings.

A `TunerError` is something the user can act on (bad trace, wrong flag, no GPU). The CLI prints
it as one line, ``tuner: error: <message>``, and exits with code 2; it never shows a traceback.
Warnings are one line on stderr, ``tuner: warning: <message>``.
"""

from __future__ import annotations

import sys


class TunerError(Exception):
    """An error the user can fix; printed as one line, exit code 2."""


class NoGPUError(TunerError):
    """The command needs a CUDA or ROCm GPU and none is visible."""


def warn(message: str) -> None:
    print(f"tuner: warning: {message}", file=sys.stderr, flush=True)


def info(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
