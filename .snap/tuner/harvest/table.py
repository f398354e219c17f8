"""Calls of one or more traces (of one rank) -> the ShapeTable: one row per call signature and
phase, with calls per step, the median GPU time per call and its share of the step."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pandas as pd

from .. import shapetable
from ..errors import TunerError
from .records import Step, TraceData

__all__ = ["KEY_FIELDS", "MAX_KV_ROWS", "kv_buckets", "aggregate"]

# what makes two calls the same row (with the phase of their step)
KEY_FIELDS = ("op", "family", "m", "n", "k", "batch", "dtype", "layout",
              "heads", "kv_heads", "q_len", "kv_len", "head_dim", "traced_kv_heads",
              "traced_compiled", "bias", "experts", "topk")
# decode attention: a serving trace has another KV length at every step; above this many, the
# calls of one signature are bucketed into this many rows by KV length
MAX_KV_ROWS = 8


def kv_buckets(kv_lens: list[int], max_rows: int = MAX_KV_ROWS) -> dict[int, int]:
    """{KV length: the KV length of its row}, at most `max_rows` rows.

    A row's KV length is a KV length seen (the median of its calls'), and every call sits in
    the row whose KV length is nearest its own, the smaller on a tie: the rule tuner.runtime's
    loader uses to pick an exported config by nearest kv_len, so a call served from a row's
    config is one that row counted. Lloyd iterations (1-D k-medians) from quantile starts.
    """
    values = sorted(kv_lens)
    distinct = sorted(set(values))
    if len(distinct) <= max_rows:
        return {v: v for v in distinct}
    reps = sorted({values[(2 * i + 1) * len(values) // (2 * max_rows)] for i in range(max_rows)})
    for _ in range(50):
        groups: dict = {}
        for v in values:
            groups.setdefault(_nearest(reps, v), []).append(v)
        new = sorted({statistics.median_low(g) for g in groups.values()})
        if new == reps:
            break
        reps = new
    return {v: _nearest(reps, v) for v in distinct}


def _nearest(reps: list[int], v: int) -> int:
    return min(reps, key=lambda r: (abs(r - v), r))


def _decode_kv_rows(traces: list[TraceData]) -> dict:
    """{(signature without the KV length): {kv_len: row kv_len}} for decode attention calls."""
    seen: dict = {}
    for t in traces:
        for c in t.calls:
            if c.family == "attention" and c.kv_len is not None \
                    and t.steps[c.step].phase == "decode":
                seen.setdefault(_kv_free_key(c), []).append(c.kv_len)
    return {key: kv_buckets(lens) for key, lens in seen.items()}


def _kv_free_key(c) -> tuple:
    return tuple(getattr(c, f) for f in KEY_FIELDS if f not in ("n", "kv_len"))


def aggregate(traces: list[TraceData], phase: str | None = None) -> pd.DataFrame:
    """Group the calls of one or more traces (of one rank) into the ShapeTable."""
    phase_steps: dict[str, list[Step]] = {}
    for t in traces:
        for s in t.steps:
            phase_steps.setdefault(s.phase, []).append(s)
    has_gpu = any(t.has_gpu for t in traces)
    kv_rows = _decode_kv_rows(traces)
    groups: dict = {}
    for t in traces:
        for c in t.calls:
            ph = t.steps[c.step].phase
            fields = {f: getattr(c, f) for f in KEY_FIELDS}
            if ph == "decode" and c.family == "attention" and c.kv_len is not None:
                fields["kv_len"] = fields["n"] = kv_rows[_kv_free_key(c)][c.kv_len]
            key = tuple(fields.values()) + (ph,)
            groups.setdefault(key, []).append(c)
    source = ", ".join(dict.fromkeys(Path(t.path).name for t in traces))
    device = ", ".join(dict.fromkeys(t.device for t in traces))
    rows = []
    for key, cs in groups.items():
        ph = key[-1]
        if phase and ph != phase:
            continue
        rows.append(_row(dict(zip(KEY_FIELDS, key[:-1])), ph, cs, phase_steps[ph], has_gpu,
                         source, device))
    if not rows:
        found = sorted(phase_steps)
        raise TunerError(f"no calls in phase {phase!r} (phases in the trace: {', '.join(found)})")
    df = pd.DataFrame(rows)
    if df["traced_kv_heads"].isna().all():   # only harvest --kv-heads regroups calls
        df = df.drop(columns="traced_kv_heads")
    if df["traced_compiled"].isna().all():   # only a torch.compile'd step's trace sets it
        df = df.drop(columns="traced_compiled")
    if df["bias"].isna().all():              # only a linear op given a bias sets it
        df = df.drop(columns="bias")
    if df["experts"].isna().all():           # only moe rows have experts and topk
        df = df.drop(columns=list(shapetable.MOE_COLUMNS))
    df = df.sort_values(["share", "calls_per_step", "us_per_call"], ascending=False,
                        na_position="last", kind="stable")
    return shapetable.normalize(df)


def _row(fields: dict, ph: str, cs: list, st: list[Step], has_gpu: bool, source: str,
         device: str) -> dict:
    n_steps = sum(s.weight for s in st)
    wall = [s.wall_us for s in st for _ in range(s.weight)]
    busy = [s.gpu_busy_us for s in st for _ in range(s.weight)]
    step_us = statistics.median(wall) if wall else math.nan
    timed = [c.gpu_us for c in cs if c.n_kernels]
    us = statistics.median(timed) if (has_gpu and timed) else math.nan
    step_gpu = statistics.median(busy) if has_gpu and busy else math.nan
    cps = len(cs) / n_steps
    kernels: dict = {}
    for c in cs:
        for kn, cnt in c.kernels.items():
            kernels[kn] = kernels.get(kn, 0) + cnt
    return dict(
        **{k: v for k, v in fields.items()
           if k not in shapetable.ATTENTION_COLUMNS and k not in shapetable.OPTIONAL_COLUMNS
           and k not in shapetable.MOE_COLUMNS},
        phase=ph, calls=len(cs), steps=n_steps, calls_per_step=cps, us_per_call=us,
        step_us=step_us, step_gpu_us=step_gpu,
        share=(us * cps / step_us) if step_us and step_us > 0 else math.nan,
        kernels="; ".join(sorted(kernels, key=lambda n: -kernels[n])),
        source=source, device=device,
        **{k: fields[k] for k in shapetable.ATTENTION_COLUMNS},
        **{k: fields[k] for k in shapetable.OPTIONAL_COLUMNS},
        **{k: fields[k] for k in shapetable.MOE_COLUMNS},
    )
