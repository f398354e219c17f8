"""Steps: from the markers config.STEP_MARKERS declares, or the whole trace; and the phase of
each step (the marker, else a prefill/decode annotation, else attention q_len, else GEMM m)."""

from __future__ import annotations

import bisect
import statistics

from . import config
from .records import Call, Step

__all__ = ["steps_from_markers", "whole_trace_steps", "step_of", "classify_steps"]


def steps_from_markers(annotations: list) -> tuple[list[Step], str]:
    """The steps of the first marker kind (config.STEP_MARKERS order) the annotations hold, and
    where they came from; ([], "") when there is none."""
    for marker in config.STEP_MARKERS:
        steps = []
        for name, _tid, ts, end in annotations:
            m = marker.pattern.match(name)
            if m:
                phase = marker.phase_of(m)
                step = (Step(name, ts, end, phase, f"{marker.label} annotation") if phase
                        else Step(name, ts, end))
                if marker.batch_of is not None:
                    step.tokens, step.kv_mean = marker.batch_of(m)
                steps.append(step)
        if steps:
            return _no_overlap(steps), marker.source
    return [], ""


def whole_trace_steps(first_ts: float, last_ts: float, steps: int | None,
                      notes: list) -> tuple[list[Step], str]:
    """A trace without markers: one window, counted as `steps` steps (or one, with a note)."""
    whole = Step("whole trace", first_ts, last_ts)
    if steps:
        whole.weight = int(steps)
        return [whole], f"--steps {steps} over the whole trace"
    notes.append("no step markers (ProfilerStep#N, vLLM or SGLang annotations): the whole "
                 "trace is counted as one step; pass --steps N if it holds N steps")
    return [whole], "whole trace as one step"


def _no_overlap(steps: list[Step]) -> list[Step]:
    """Sort steps by start; a step nested in the previous one (same marker twice) is dropped."""
    steps.sort(key=lambda s: s.start)
    out: list[Step] = []
    for s in steps:
        if out and s.start < out[-1].end and s.end <= out[-1].end:
            continue
        out.append(s)
    return out


def step_of(starts: list, steps: list[Step], ts: float) -> int:
    """Index of the step whose [start, end] holds `ts` (starts: the steps' starts), or -1."""
    j = bisect.bisect_right(starts, ts) - 1
    if j >= 0 and ts <= steps[j].end:
        return j
    return -1


def classify_steps(steps: list[Step], calls: list[Call], annotations: list) -> None:
    """Give each step without an annotated phase a phase: prefill, decode or other."""
    starts = [s.start for s in steps]
    # 1. a "prefill"/"decode" user annotation inside the step
    for name, _tid, ts, _end in annotations:
        word = config.PHASE_WORDS.get(name.lower())
        if word is None:
            continue
        j = step_of(starts, steps, ts)
        if j >= 0 and not steps[j].phase_from:
            steps[j].phase, steps[j].phase_from = word, f"'{name}' annotation"
    # 2. attention q_len; 3. GEMM m relative to the other steps
    q_lens: dict = {}
    ms: dict = {}
    for c in calls:
        if c.step < 0:
            continue
        if c.family == "attention" and c.q_len:
            q_lens.setdefault(c.step, []).append(c.q_len)
        elif c.family == "gemm" and c.batch == 1:
            ms.setdefault(c.step, []).append(c.m)
    typical = {j: statistics.median_low(v) for j, v in ms.items()}
    distinct = sorted(set(typical.values()))
    for j, s in enumerate(steps):
        if s.phase_from:
            continue
        if j in q_lens:
            s.phase = "decode" if max(q_lens[j]) == 1 else "prefill"
            s.phase_from = "attention q_len"
        elif j in typical and len(distinct) > 1:
            s.phase = "decode" if typical[j] == distinct[0] else "prefill"
            s.phase_from = "GEMM m"
