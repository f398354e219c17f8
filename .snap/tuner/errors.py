"""User-facing errors and warnings.

A `TunerError` is something the user can act on (bad trace, wrong flag, no GPU). The CLI prints
it as one line, ``tuner: error: <message>``, and exits with code 2; it never shows a traceback.
Warnings are one line on stderr, ``tuner: warning: <message>``.
"""

from __future__ import annotations

import sys

__all__ = ["CandidateFailure", "NoGPUError", "TunerError", "info", "one_line", "warn"]


class TunerError(Exception):
    """An error the user can fix; printed as one line, exit code 2."""


class NoGPUError(TunerError):
    """The command needs a CUDA or ROCm GPU and none is visible."""


class CandidateFailure(TunerError):
    """A config (or a callable being timed) that fails to compile, launch or capture; `reason`
    is one line. A failing candidate is data: callers record it and go on."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def one_line(exc: BaseException, limit: int = 300) -> str:
    """'TypeName: first non-empty line of the message' (at most `limit` characters of it)."""
    text = str(exc).strip().splitlines()
    first = next((line for line in text if line.strip()), "")
    return f"{type(exc).__name__}: {first[:limit]}"


def warn(message: str) -> None:
    print(f"tuner: warning: {message}", file=sys.stderr, flush=True)


def info(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
