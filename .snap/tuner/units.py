"""Numbers a user types: durations, thresholds, shares, rates. One reader for each, one wording.

Every command that takes ``--timeout``, ``--min-saving``, ``--safety``, ``--hit-rate``,
``--bandwidth`` or ``--matmul-rate`` reads it here, so ``tuner budget``, ``search``, ``rank`` and
``run`` accept the same spellings and say the same thing when a value cannot be read:

- a duration: ``8h``, ``90m``, ``30s``, ``1h30m``, or a bare number of seconds;
- a threshold (``--min-saving``): a share of the step (``0.5%``) or a time per token (``40us``,
  ``40µs``, ``0.04ms``);
- a share: ``0.88`` or ``88%``;
- a bandwidth: ``4.8TB/s``, ``4800 GB/s``, ``3.2TiB/s``; a matmul rate: ``989TFLOPs``.

`Threshold` is the one bar a shape (budget: its headroom) or a candidate (rank: its measured
saving) must clear. Budget scales the headroom by ``safety`` first (no real kernel reaches the
physical floor); rank compares a measured saving as it is.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .errors import TunerError

__all__ = [
    "DEFAULT_SAFETY", "DEFAULT_SHARE", "DEFAULT_THRESHOLD", "Threshold", "is_number",
    "parse_bandwidth", "parse_duration", "parse_matmul_rate", "parse_positive", "parse_share",
    "parse_threshold", "pct",
]

# The default bar (README "The default threshold"): keep a shape when half of its headroom still
# moves the step by 0.5%.
DEFAULT_SHARE = 0.005
DEFAULT_SAFETY = 0.5

_NUMBER = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
_TIME_UNITS = {"us": 1.0, "µs": 1.0, "μs": 1.0, "ms": 1000.0, "s": 1e6}
_BANDWIDTH_UNITS = {"b/s": 1.0, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9, "tb/s": 1e12,
                    "kib/s": 2.0**10, "mib/s": 2.0**20, "gib/s": 2.0**30, "tib/s": 2.0**40}
_RATE_PREFIXES = {"": 1.0, "g": 1e9, "t": 1e12, "p": 1e15}
_DURATION_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0}


def is_number(value) -> bool:
    """A finite real number (int, float or numpy scalar; not bool, not a string)."""
    try:
        return not isinstance(value, (bool, str)) and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def pct(share: float) -> str:
    """0.0123 -> '1.23%'; NaN -> 'n/a'."""
    if share is None or not math.isfinite(share):
        return "n/a"
    return f"{share * 100:.3g}%"


def _split(text, what: str, example: str) -> tuple[float, str]:
    match = re.fullmatch(_NUMBER + r"\s*(.*)", str(text).strip())
    if not match:
        raise TunerError(f"cannot read {what} {text!r}: expected a number with a unit, e.g. {example}")
    value = float(match.group(1))
    if not math.isfinite(value):
        raise TunerError(f"cannot read {what} {text!r}: not a finite number")
    return value, match.group(2).strip()


# ------------------------------------------------------------------------------------ durations
def parse_duration(text, what: str = "--timeout") -> float:
    """'8h', '90m', '30s', '1h30m', or a bare number (seconds) -> seconds (> 0)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        s = str(text).strip().lower().replace(" ", "")
        if re.fullmatch(r"\d*\.?\d+", s):
            seconds = float(s)
        else:
            parts = re.findall(r"(\d*\.?\d+)([hms])", s)
            if not parts or "".join(v + u for v, u in parts) != s:
                raise TunerError(f"cannot read {what} {text!r}: give a duration such as 8h, 90m, "
                                 f"30s or 1h30m (a bare number is seconds)")
            seconds = sum(float(v) * _DURATION_UNITS[u] for v, u in parts)
    if not (math.isfinite(seconds) and seconds > 0):
        raise TunerError(f"{what} must be a positive duration, got {text!r}")
    return seconds


# ----------------------------------------------------------------------------------- thresholds
@dataclass(frozen=True)
class Threshold:
    """What a saving per token must reach to be worth a search (budget) or an export (rank).

    Exactly one of `us_per_token` (µs per step of the phase) or `share` (a fraction of the step
    time) is set. `safety` is the part of the headroom a real kernel is assumed to reach in a real
    step: budget keeps a shape when safety x headroom reaches the bar; rank's measured savings are
    compared as they are (`passes`).
    """

    us_per_token: float | None = None
    share: float | None = None
    safety: float = DEFAULT_SAFETY

    def __post_init__(self):
        if (self.us_per_token is None) == (self.share is None):
            raise TunerError("a threshold needs exactly one of: µs per token, share of the step")
        value = self.us_per_token if self.share is None else self.share
        if not (is_number(value) and value > 0):
            raise TunerError(f"--min-saving must be positive, got {value!r}")
        if self.share is not None and self.share >= 1:
            raise TunerError(f"--min-saving as a share of the step must be below 100%, got "
                             f"{self.share:.4g}")
        if not (is_number(self.safety) and 0 < self.safety <= 1):
            raise TunerError(f"--safety must be in (0, 1], got {self.safety!r}")

    def target(self) -> str:
        """'0.5% of the step' or '40 us/token'."""
        if self.share is not None:
            return f"{pct(self.share)} of the step"
        return f"{self.us_per_token:g} us/token"

    def describe(self) -> str:
        return f"keep a shape if {self.safety:g} x its headroom >= {self.target()}"

    def passes(self, saving_us_per_token: float, step_us: float) -> bool:
        """Does a measured saving (no safety factor) clear the bar? NaN never does."""
        if not is_number(saving_us_per_token):
            return False
        if self.us_per_token is not None:
            return saving_us_per_token >= self.us_per_token
        if not (is_number(step_us) and step_us > 0):
            return False
        return saving_us_per_token / step_us >= self.share


DEFAULT_THRESHOLD = Threshold(share=DEFAULT_SHARE, safety=DEFAULT_SAFETY)


def parse_threshold(text=None, safety: float = DEFAULT_SAFETY) -> Threshold:
    """'0.5%' -> a share of the step; '40us' / '40µs' / '0.04ms' -> µs per token; None -> the
    default (0.5% of the step); a Threshold is returned as it is."""
    if isinstance(text, Threshold):
        return text
    if text is None:
        return Threshold(share=DEFAULT_SHARE, safety=safety)
    value, unit = _split(text, "--min-saving", "0.5% or 40us")
    if value <= 0:
        raise TunerError(f"--min-saving must be positive, got {text!r}")
    if unit == "%":
        return Threshold(share=value / 100.0, safety=safety)
    scale = _TIME_UNITS.get(unit) or _TIME_UNITS.get(unit.lower())
    if scale is not None:
        return Threshold(us_per_token=value * scale, safety=safety)
    raise TunerError(f"cannot read --min-saving {text!r}: give a share of the step like 0.5% or "
                     f"a time per token like 40us or 0.04ms")


# ---------------------------------------------------------------------------- plain numbers
def parse_share(text, what: str) -> float:
    """'0.88' or '88%' -> 0.88, in (0, 1]."""
    value, unit = _split(text, what, "0.88 or 88%")
    if unit == "%":
        value /= 100.0
    elif unit:
        raise TunerError(f"cannot read {what} {text!r}: give a fraction like 0.88 or a percent "
                         f"like 88%")
    if not 0 < value <= 1:
        raise TunerError(f"{what} must be a share in (0, 1] (or (0%, 100%]), got {text!r}")
    return value


def parse_positive(text, what: str, *, allow_zero: bool = False) -> float:
    """A plain positive (or, with allow_zero, non-negative) finite number, e.g. --saving-us 3.1."""
    try:
        value = float(str(text).strip())
    except ValueError:
        raise TunerError(f"{what} must be a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        kind = "a number >= 0" if allow_zero else "a positive number"
        raise TunerError(f"{what} must be {kind}, got {text!r}")
    return value


def parse_bandwidth(text) -> float:
    """'4.8TB/s', '4800 GB/s', '3.2TiB/s' -> bytes per second (decimal TB unless TiB)."""
    value, unit = _split(text, "--bandwidth", "4.8TB/s")
    scale = _BANDWIDTH_UNITS.get(unit.lower().replace("ps", "/s"))
    if scale is None:
        raise TunerError(f"cannot read --bandwidth {text!r}: give a unit, e.g. 4.8TB/s or 4800GB/s")
    if value <= 0:
        raise TunerError(f"--bandwidth must be positive, got {text!r}")
    return value * scale


def parse_matmul_rate(text) -> float:
    """'989TFLOPs', '989 TFLOP/s', '0.99PFLOPS' -> flops per second."""
    value, unit = _split(text, "--matmul-rate", "989TFLOPs")
    match = re.fullmatch(r"([gtp]?)flop(?:s|/s)?", unit.lower())
    if not match:
        raise TunerError(f"cannot read --matmul-rate {text!r}: give a unit, e.g. 989TFLOPs or "
                         f"989TFLOP/s")
    if value <= 0:
        raise TunerError(f"--matmul-rate must be positive, got {text!r}")
    return value * _RATE_PREFIXES[match.group(1)]
