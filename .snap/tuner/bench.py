"""Timing: the DESIGN.md protocol as a small API.

For one callable (the baseline, the default config or a candidate config of a kernel family):

1. Input sets. ``cache="cold"`` makes enough independent input sets that their bytes exceed twice
   the L2 size (so each call reads its weights from HBM, as in a real decode step, where the other
   layers' weights have evicted them); ``cache="warm"`` uses one set.
2. Warm-up: every set is run eagerly once (compiles the kernel, loads cuBLAS heuristics), then a
   short eager loop estimates the time per call.
3. A CUDA graph captures ``calls`` consecutive calls cycling through the sets (enough calls that one
   replay lasts about ``target_graph_us``, a multiple of the number of sets; on ROCm at most ~1000
   launches per graph, counting two launches per call).
4. ``groups`` groups of ``replays`` replays, each replay timed with a pair of device events; the
   time per call of a replay is its event time / calls. Each group gives a median; the result is
   the median of the group medians, and the spread is (max - min) / 2 of the group medians as a
   percentage of that median.

A paired comparison builds both graphs on the same input sets and alternates their groups in one
process (which one goes first alternates too), so drift in clocks or temperature hits both. The
speedup is the median of the per-group ratios reference / candidate, with a 95% bootstrap
confidence interval of that median. `aa_noise` runs the same config against itself (two graphs)
and so measures the protocol's noise.

Anything that fails to compile or launch raises `CandidateFailure(reason)`.

The top floor of the measuring core (docs/interfaces.md): the timer and `time_callable` are
tuner.timing's, the detection tuner.hardware's (both re-exported here), parity tuner.parity's;
nothing below imports this module.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from . import hardware
from .errors import CandidateFailure, TunerError, one_line, warn
from .hardware import FALLBACK_L2_BYTES
from .timing import (DEFAULT_GROUPS, DEFAULT_REPLAYS, MAX_INPUT_SETS, GraphTimer, Timing,
                     bootstrap_median_interval, cold_sets, median, set_bytes, time_callable)

__all__ = ["COMPILED_BASELINE", "DEFAULT_GROUPS", "DEFAULT_REPLAYS", "FALLBACK_L2_BYTES",
           "MAX_AUTOTUNE_BASELINE", "MAX_INPUT_SETS", "REFERENCES", "BenchRow", "Paired", "Timing",
           "aa_noise", "backend_name", "baseline_path", "bench_one", "compare", "compiled_baseline",
           "format_rows", "kernels_by_time", "l2_bytes", "launched_kernels", "make_input_sets",
           "paired_from_groups", "parse_config", "parse_shape", "run_command",
           "strongest_attention", "sweep", "time_baseline", "time_callable", "time_config"]


@dataclass
class Paired:
    reference_us: float
    candidate_us: float
    speedup: float  # reference_us / candidate_us (median of paired group ratios)
    speedup_low: float
    speedup_high: float  # 95% bootstrap interval of that median
    noise_pct: float  # spread of the reference's own group medians (A/A), %
    reference: Timing | None = None
    candidate: Timing | None = None


def _torch():
    import torch

    if not torch.cuda.is_available():
        from .errors import NoGPUError

        raise NoGPUError("timing needs a CUDA or ROCm GPU and torch sees none")
    return torch


def _device(device):
    """A torch.device: the given one, or the current GPU. 'cpu' is allowed only under
    TRITON_INTERPRET=1 (tests of the protocol's logic; the numbers mean nothing)."""
    import os

    import torch

    if device is not None:
        dev = torch.device(device if not isinstance(device, int) else f"cuda:{device}")
        if dev.type == "cpu":
            if os.environ.get("TRITON_INTERPRET") != "1":
                raise TunerError("timing on the CPU is only for TRITON_INTERPRET=1 tests")
            return dev
        if dev.type != "cuda":
            raise TunerError(f"timing needs a GPU device, got {dev}")
    else:
        dev = None
    _torch()
    if dev is None or dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _on(dev):
    import torch

    return torch.cuda.device(dev) if dev.type == "cuda" else _nullcontext()


def backend_name(device=None) -> str:
    """'cuda', 'hip', or 'dcu' (a Hygon DCU: hip narrowed) for the visible GPU; 'cuda' for the
    CPU interpreter."""
    return hardware.space_backend(_device(device))


def l2_bytes(device=None) -> int:
    """L2 bytes of the timing's device (FALLBACK_L2_BYTES for the CPU interpreter)."""
    return hardware.l2_cache_bytes(_device(device))


def make_input_sets(family, shape: dict, cache: str = "cold", device=None,
                    seed: int = 1000, l2: int | None = None) -> list[dict]:
    """One set (warm) or enough sets that their bytes exceed 2 x L2 (cold; capped at
    MAX_INPUT_SETS sets for tiny shapes, in which case the rotation is short of 2 x L2)."""
    if cache not in ("cold", "warm"):
        raise TunerError(f"cache must be 'cold' or 'warm', got {cache!r}")
    dev = _device(device)
    first = family.make_inputs(shape, dev, seed)
    sets = [first]
    if cache == "warm":
        return sets
    l2 = l2 if l2 is not None else l2_bytes(dev)
    for i in range(1, cold_sets(set_bytes(first), l2)):
        sets.append(family.make_inputs(shape, dev, seed + i))
    return sets


COMPILED_BASELINE = "compiled-baseline"
MAX_AUTOTUNE_BASELINE = "max-autotune-baseline"
# a step baseline (tuner.baselines.BASELINES, `tuner rank --baseline`) -> the reference timed here
REFERENCES = {"eager": "baseline", "compile": COMPILED_BASELINE,
              "max-autotune": MAX_AUTOTUNE_BASELINE}
_STEP_BASELINE = {COMPILED_BASELINE: "compile", MAX_AUTOTUNE_BASELINE: "max-autotune"}
_PATH_NAMES = {"compile": "torch.compile", "max-autotune": "torch.compile max-autotune"}
_COMPILED_BASELINES: dict = {}  # (family name, step baseline) -> the wrapper
_COMPILE_FAILURES: dict = {}  # (family name, step baseline) -> why torch.compile failed
_ATTENTION_FORMS: dict = {}  # attention shape key -> (SDPAForm, the forms tried)


def compiled_baseline(family, baseline: str = "compile"):
    """The family's baseline under torch.compile (Inductor, static shapes; tuner.baselines
    .compile_step): `baseline` 'compile' (default mode) as a compiling server runs it, where
    Inductor fuses the ops around the library call (the KV-cache copies of a repeated-KV
    attention call), or 'max-autotune' (without Inductor's CUDA graphs), where Inductor also
    times its Triton matmul templates against the vendor library for each shape and keeps the
    fastest: the kernel a user of that one flag runs. One wrapper a family and mode; it compiles
    on its first call for each shape (the timer's warm-up), never inside a graph capture. Dynamo
    compiles one function for at most `recompile_limit` shapes (8) and runs it eagerly beyond:
    a rank over more shapes would time eager baselines unsaid, so this process raises the limit
    (a tuner process; serving never calls this). Where torch.compile fails (a compile error, a
    build without a working Inductor), the eager baseline is timed from then on, with one
    warning, and `baseline_path` says so."""
    key = (family.name, baseline)
    fn = _COMPILED_BASELINES.get(key)
    if fn is None:
        import torch
        import torch._dynamo.config as dynamo_config

        from .baselines import compile_step

        for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                     "accumulated_cache_size_limit"):
            if isinstance(getattr(dynamo_config, name, None), int):
                setattr(dynamo_config, name, max(getattr(dynamo_config, name), 4096))
        compiled = compile_step(family.baseline, baseline)

        def fn(inputs):
            if key not in _COMPILE_FAILURES:
                try:
                    return compiled(inputs)
                except Exception as exc:  # noqa: BLE001 - any compile error: time the eager path
                    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                        raise  # compiled before every capture (the timer's warm-up): a real fault
                    _COMPILE_FAILURES[key] = one_line(exc)
                    warn(f"{family.name}: torch.compile ({baseline}) of the baseline failed "
                         f"({_COMPILE_FAILURES[key]}); timing the eager baseline")
            return family.baseline(inputs)

        _COMPILED_BASELINES[key] = fn
    return fn


def strongest_attention(family, shape: dict, device=None):
    """The strongest decode attention baseline for an attention shape: SDPA on the grouped cache
    in its fastest form and backend on this device (tuner.baselines.fastest_sdpa_form; for a
    call traced on a repeated cache too: servers run the grouped call). (form, fn(inputs))."""
    from .baselines import fastest_sdpa_form, grouped_sdpa

    key = family.shape_key(shape)
    if key not in _ATTENTION_FORMS:
        grouped = {k: v for k, v in shape.items() if k != "baseline_kv_heads"}
        _ATTENTION_FORMS[key] = fastest_sdpa_form(grouped, masked=False, device=device)
    form = _ATTENTION_FORMS[key][0]
    return form, lambda inputs: grouped_sdpa(inputs, form)


def _which(shape: dict, which):
    """'baseline' of a shape that says baseline_compiled is the compiled one: what its step ran."""
    if which == "baseline" and shape.get("baseline_compiled"):
        return COMPILED_BASELINE
    return which


def baseline_path(family, shape: dict, which="baseline") -> str:
    """How `which` (a reference: 'baseline', 'compiled-baseline', 'max-autotune-baseline') of
    `shape` is timed: 'eager', 'torch.compile', 'torch.compile max-autotune', the grouped SDPA
    form of the strongest attention baseline ('SDPA packed (efficient_attention)'), or
    'eager (torch.compile failed: ...)' after a failed compile."""
    which = _which(shape, which)
    step = _STEP_BASELINE.get(which)
    if step is None:
        return "eager"
    if family.name == "attention" and step == "max-autotune":
        form = _ATTENTION_FORMS.get(family.shape_key(shape))
        return str(form[0]) if form else "grouped SDPA (not timed yet)"
    why = _COMPILE_FAILURES.get((family.name, step))
    return f"eager (torch.compile failed: {why})"[:200] if why else _PATH_NAMES[step]


def _callable_for(family, shape: dict, which, backend: str, device=None):
    """(description, fn(inputs)) for 'baseline', 'compiled-baseline', 'max-autotune-baseline',
    'default' or a config. 'baseline' of a shape that says baseline_compiled (a torch.compile'd
    step's call: tuner.spaces.COMMON_MEASURE_KEYS) is the compiled one: what that step runs.
    The attention family's 'max-autotune-baseline' is its strongest baseline
    (`strongest_attention`)."""
    if isinstance(which, str):
        which = _which(shape, which)
        if which == "baseline":
            return "baseline", family.baseline
        if which in _STEP_BASELINE:
            step = _STEP_BASELINE[which]
            if family.name == "attention" and step == "max-autotune":
                form, fn = strongest_attention(family, shape, device)
                return f"baseline ({form})", fn
            return f"baseline ({_PATH_NAMES[step]})", compiled_baseline(family, step)
        if which == "default":
            config = family.default_config(shape, backend)
            return f"default {config}", lambda inputs: family.launch(inputs, config)
        raise TunerError(f"unknown reference {which!r}: use 'baseline', "
                         f"'{COMPILED_BASELINE}', '{MAX_AUTOTUNE_BASELINE}', 'default' or a "
                         f"config")
    config = dict(which)
    return str(config), lambda inputs: family.launch(inputs, config)


def launched_kernels(family, shape: dict, which="baseline", *, device=None,
                     inputs: dict | None = None) -> list[str]:
    """The GPU kernels one call of `which` launches (names, each once, the most GPU time first),
    read from a profiler trace of one call after a warm one: what the baseline a candidate beat
    runs (the cuBLAS GEMM, Inductor's Triton template, the SDPA kernel, a grouped GEMM before
    the copies around it). [] off the GPU."""
    import torch

    if not torch.cuda.is_available() or (device is not None
                                         and torch.device(device).type != "cuda"):
        return []
    dev = _device(device)
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with _on(dev):
        args = inputs if inputs is not None else family.make_inputs(shape, dev, 0)
        _, fn = _callable_for(family, shape, which, backend_name(dev), dev)
        fn(args)
        torch.cuda.synchronize(dev)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn(args)
            torch.cuda.synchronize(dev)
    return kernels_by_time((event.name, event.time_range.elapsed_us()) for event in prof.events()
                           if getattr(event, "device_type", None) == DeviceType.CUDA)


def kernels_by_time(launches) -> list[str]:
    """(kernel name, µs) of each launch -> the names, each once, by total µs (most first; ties
    in launch order)."""
    total: dict[str, float] = {}
    for name, us in launches:
        total[name] = total.get(name, 0.0) + float(us)
    return sorted(total, key=lambda name: -total[name])


# ------------------------------------------------------------------------------------ public API
def time_config(family, shape: dict, config, *, cache: str = "cold", device=None,
                groups: int = DEFAULT_GROUPS, replays: int = DEFAULT_REPLAYS,
                input_sets: list[dict] | None = None, **timer_options) -> Timing:
    """Time one config dict (or 'default' / 'baseline') of a family for a shape."""
    dev = _device(device)
    with _on(dev):
        sets = input_sets if input_sets is not None else make_input_sets(family, shape, cache, dev)
        _, fn = _callable_for(family, shape, config, backend_name(dev), dev)
        return time_callable(fn, sets, cache=cache, groups=groups, replays=replays,
                             **timer_options)


def time_baseline(family, shape: dict, *, cache: str = "cold", device=None,
                  groups: int = DEFAULT_GROUPS, replays: int = DEFAULT_REPLAYS,
                  input_sets: list[dict] | None = None, **timer_options) -> Timing:
    return time_config(family, shape, "baseline", cache=cache, device=device, groups=groups,
                       replays=replays, input_sets=input_sets, **timer_options)


def paired_from_groups(reference_groups: list[float], candidate_groups: list[float],
                       seed: int = 0) -> tuple[float, float, float]:
    """(median ratio, low, high) of per-group ratios reference / candidate."""
    ratios = [r / c for r, c in zip(reference_groups, candidate_groups) if c > 0]
    if not ratios:
        raise ValueError("no paired groups")
    low, high = bootstrap_median_interval(ratios, seed=seed)
    return median(ratios), low, high


def compare(family, shape: dict, candidate, reference="baseline", *, cache: str = "cold",
            device=None, groups: int = 2 * DEFAULT_GROUPS, replays: int = DEFAULT_REPLAYS,
            input_sets: list[dict] | None = None, **timer_options) -> Paired:
    """Paired, interleaved timing of candidate against reference on the same input sets.

    candidate / reference: a config dict, or 'baseline' / 'compiled-baseline' / 'default'. A
    failing reference is a TunerError; a failing candidate raises CandidateFailure."""
    dev = _device(device)
    with _on(dev):
        backend = backend_name(dev)
        sets = input_sets if input_sets is not None else make_input_sets(family, shape, cache, dev)
        ref_name, ref_fn = _callable_for(family, shape, reference, backend, dev)
        _, cand_fn = _callable_for(family, shape, candidate, backend, dev)
        try:
            ref_timer = GraphTimer(ref_fn, sets, **timer_options)
        except CandidateFailure as exc:
            raise TunerError(f"the reference ({ref_name}) failed: {exc.reason}") from None
        cand_timer = GraphTimer(cand_fn, sets, **timer_options)
        ref_groups, cand_groups = [], []
        for g in range(groups):
            if g % 2 == 0:
                ref_groups.append(ref_timer.group(replays))
                cand_groups.append(cand_timer.group(replays))
            else:
                cand_groups.append(cand_timer.group(replays))
                ref_groups.append(ref_timer.group(replays))
        speedup, low, high = paired_from_groups(ref_groups, cand_groups)
        ref_t = Timing.from_groups(ref_groups, cache, ref_timer)
        cand_t = Timing.from_groups(cand_groups, cache, cand_timer)
        return Paired(reference_us=ref_t.median_us, candidate_us=cand_t.median_us,
                      speedup=speedup, speedup_low=low, speedup_high=high,
                      noise_pct=ref_t.spread_pct, reference=ref_t, candidate=cand_t)


def aa_noise(family, shape: dict, config="baseline", *, cache: str = "cold", device=None,
             groups: int = 2 * DEFAULT_GROUPS, replays: int = DEFAULT_REPLAYS,
             **timer_options) -> Paired:
    """The protocol's noise: the same callable against itself (two graphs, same inputs,
    interleaved). The ideal is speedup 1.0; the interval's half-width is the noise band."""
    return compare(family, shape, config, config, cache=cache, device=device, groups=groups,
                   replays=replays, **timer_options)


# ---------------------------------------------------------------------------- `tuner bench` API
def _pairs(text: str, what: str, example: str) -> list[tuple[str, str]]:
    """'a=1,b=2' -> [('a', '1'), ('b', '2')]; a TunerError for an empty text, an item without
    '=', an empty key or value, or a key given twice."""
    items = [p.strip() for p in str(text).split(",") if p.strip()]
    if not items:
        raise TunerError(f"{what} {text!r} is empty: give KEY=VALUE items, e.g. {example}")
    pairs, seen = [], set()
    for part in items:
        key, sep, value = (s.strip() for s in part.partition("="))
        if not sep or not key or not value:
            raise TunerError(f"{what} item {part!r} is not KEY=VALUE (e.g. {example})")
        if key in seen:
            raise TunerError(f"{what}: {key} is given twice")
        seen.add(key)
        pairs.append((key, value))
    return pairs


def parse_shape(text: str, dtype: str | None = None, family: str | None = None) -> dict:
    """'m=1,n=14336,k=5120[,dtype=bfloat16]' -> {'m': 1, 'n': 14336, 'k': 5120, 'dtype': ...}.

    Sizes must be positive integers, dtype one the kernels serve, layout NT or NN; the keys must
    be a family's shape dict (docs/interfaces.md): `family`'s, else that of the family whose keys
    it matches (a TunerError names what is missing or unknown)."""
    from .spaces import SHAPE_KEYS, check_shape

    example = "m=1,n=4096,k=4096"
    shape: dict = {}
    for key, value in _pairs(text, "--shape", example):
        if key in ("dtype", "layout"):
            shape[key] = value
            continue
        try:
            number = int(value)
        except ValueError:
            raise TunerError(f"--shape: {key}={value!r} is not an integer") from None
        if number < 1 and key != "bias":
            raise TunerError(f"--shape: {key}={value} must be a positive size")
        shape[key] = number
    if dtype:
        shape["dtype"] = dtype
    shape.setdefault("dtype", "bfloat16")
    if family == "gemm":
        shape.setdefault("layout", "NT")  # what tuner_kernels.gemm assumes without one
    candidates = [family] if family in SHAPE_KEYS else list(SHAPE_KEYS)
    problems = {name: check_shape(name, shape) for name in candidates}
    if any(not why for why in problems.values()):
        return shape
    # the family whose required keys the shape shares most says what is wrong
    name = max(candidates, key=lambda n: len(set(SHAPE_KEYS[n][0]) & set(shape)))
    raise TunerError(f"--shape {text!r}: {problems[name]} ({name} shapes are "
                     f"{','.join(k + '=..' for k in SHAPE_KEYS[name][0] if k != 'dtype')})")


def parse_config(text: str, family: str | None = None) -> dict:
    """'ROWS_PER_BLOCK=4,BLOCK_K=512' -> {'ROWS_PER_BLOCK': 4, 'BLOCK_K': 512}: every value a
    finite number (int where it is one). With `family`, a parameter no backend's search space
    of the family has is refused (values outside the space's lists are allowed: bench times
    what it is given)."""
    import math

    config: dict = {}
    for key, value in _pairs(text, "--config", "ROWS_PER_BLOCK=4,BLOCK_K=512"):
        try:
            number = int(value)
        except ValueError:
            try:
                number = float(value)
            except ValueError:
                raise TunerError(f"--config: {key}={value!r} is not a number") from None
            if not math.isfinite(number):
                raise TunerError(f"--config: {key}={value!r} is not a finite number")
        config[key] = number
    if family is not None:
        from .spaces import BACKENDS, space_for

        known = set()
        for backend in BACKENDS:
            known |= set(space_for(family, backend).params)
        unknown = sorted(set(config) - known)
        if unknown:
            raise TunerError(f"--config: unknown parameter(s) {', '.join(unknown)} for {family} "
                             f"(known: {', '.join(sorted(known))})")
    return config


@dataclass
class BenchRow:
    label: str
    config: dict | None
    median_us: float = float("nan")
    spread_pct: float = float("nan")
    tbps: float = float("nan")  # bytes_moved / time, TB/s
    bandwidth_share: float = float("nan")  # of the profile's measured read bandwidth
    facts: object = None  # tuner.parity.ParityFacts (None: failed before parity)
    failure: str = ""
    extra: dict = field(default_factory=dict)


def _row(label, config, family, shape, timing: Timing | None, facts, profile,
         failure: str = "") -> BenchRow:
    row = BenchRow(label=label, config=config, failure=failure)
    if timing is not None:
        row.median_us = timing.median_us
        row.spread_pct = timing.spread_pct
        row.tbps = family.bytes_moved(shape) / (timing.median_us * 1e-6) / 1e12
        if profile is not None and profile.read_bandwidth_bytes_per_s > 0:
            row.bandwidth_share = row.tbps * 1e12 / profile.read_bandwidth_bytes_per_s
    row.facts = facts
    return row


def bench_one(family, shape: dict, label: str, which, *, checker, input_sets, cache: str,
              profile=None, groups: int = DEFAULT_GROUPS, replays: int = DEFAULT_REPLAYS,
              device=None, **timer_options) -> BenchRow:
    """Time and parity-check one callable ('baseline', 'default' or a config); failures are rows."""
    backend = backend_name(device)
    config = None if which == "baseline" else (
        family.default_config(shape, backend) if which == "default" else dict(which))
    try:
        facts = checker.baseline_facts() if which == "baseline" else checker.facts(config)
        timing = time_config(family, shape, which if which == "baseline" else config,
                             cache=cache, groups=groups, replays=replays, input_sets=input_sets,
                             device=device, **timer_options)
    except CandidateFailure as exc:
        return _row(label, config, family, shape, None, None, profile, failure=exc.reason)
    return _row(label, config, family, shape, timing, facts, profile)


def sweep(family, shape: dict, *, checker, input_sets, cache: str, profile=None,
          max_configs: int | None = None, seed: int = 0, groups: int = 5, replays: int = 5,
          progress: bool = True, device=None, **timer_options) -> list[BenchRow]:
    """Time every config of the family's search space for this shape (or a seeded sample of
    `max_configs`, always including the default config). Failures are rows with `failure`."""
    from .spaces import space_for

    backend = backend_name(device)
    configs = space_for(family.name, backend).configs(shape)
    if not configs:
        raise TunerError(f"the {backend} search space of {family.name} allows no config for "
                         f"{family.shape_key(shape)}")
    default = family.default_config(shape, backend)
    if max_configs is not None and max_configs < len(configs):
        rng = random.Random(seed)
        configs = rng.sample(configs, max_configs)
    if default not in configs:
        configs.append(default)
    rows = []
    iterator = configs
    if progress:
        from tqdm import tqdm

        iterator = tqdm(configs, desc=f"sweep {family.shape_key(shape)}", unit="cfg",
                        file=__import__("sys").stderr)
    for config in iterator:
        label = "default" if config == default else "sweep"
        rows.append(bench_one(family, shape, label, config, checker=checker,
                              input_sets=input_sets, cache=cache, profile=profile,
                              groups=groups, replays=replays, device=device, **timer_options))
    return rows


def format_rows(rows: list[BenchRow], *, with_config: bool = True) -> str:
    """The rows as a table with the three parity facts: bitwise equal to the serving path (=base),
    the output class (and whether it is the default config's, =dflt), the error against the fp32
    reference and its ratio to the serving path's own error."""
    head = (f"{'path':<10} {'median us':>10} {'spread':>7} {'TB/s':>6} {'of BW':>6} "
            f"{'=base':>5} {'class':<16} {'=dflt':>5} {'error':>8} {'x base':>7}  config")
    lines = [head]
    for r in rows:
        if r.failure:
            lines.append(f"{r.label:<10} {'failed':>10}  {r.failure}   {r.config or ''}")
            continue
        share = f"{100 * r.bandwidth_share:5.1f}%" if r.bandwidth_share == r.bandwidth_share \
            else f"{'-':>6}"
        cfg = "" if not with_config or r.config is None else ",".join(
            f"{k}={v}" for k, v in r.config.items())
        f = r.facts
        yes = {True: "yes", False: "no"}
        ratio = f"{f.error_ratio:.2f}x" if f.error_ratio == f.error_ratio else "nan"
        lines.append(f"{r.label:<10} {r.median_us:>10.2f} {r.spread_pct:>6.2f}% {r.tbps:>6.2f} "
                     f"{share} {yes[f.bitwise_vs_baseline]:>5} {f.parity_class:<16} "
                     f"{yes[f.bitwise_vs_default]:>5} {f.error_vs_reference:>8.1e} {ratio:>7}  {cfg}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ tuner bench
def run_command(family_name: str, shape_text: str, *, dtype=None, configs=(), cache="cold",
                groups=10, replays=10, device=None, device_profile=None, do_sweep=False,
                max_configs=None, top=5, gate="accuracy", margin=1.25, out=print) -> None:
    """`tuner bench`: baseline, default and the given configs (and with `sweep` the whole
    space, `do_sweep`) for one shape under the timing protocol, printed as a table through `out`
    with the three parity facts; the sweep's best configs are those passing `gate`."""
    import tuner_kernels as kernels

    from . import device as device_mod, parity
    from .errors import warn

    family = kernels.get_family(family_name)
    shape = parse_shape(shape_text, dtype)
    config_list = [parse_config(text) for text in configs]
    dev = _device(device)  # NoGPUError (one line, exit 2) before anything else
    options = {} if dev.type == "cuda" else {"target_graph_us": 1.0, "min_calls": 1}
    if device_profile:
        profile = device_mod.load_profile(device_profile)
    else:
        profile = device_mod.find_saved_profile() if dev.type == "cuda" else None
        if profile is None:
            warn("no measured profile for this GPU: run `tuner device` for the bandwidth share")
    sets = make_input_sets(family, shape, cache, dev)
    checker = parity.Checker(family, shape, device=dev)
    out(f"{family.name} {family.shape_key(shape)}  cache={cache}  "
        f"input sets={len(sets)}  backend={backend_name(dev)}  "
        f"bytes={family.bytes_moved(shape)}")
    if profile is not None:
        out(f"profile: {profile.name}, read bandwidth "
            f"{profile.read_bandwidth_bytes_per_s / 1e12:.3f} TB/s ({profile.source})")
    timing = {"cache": cache, "groups": groups, "replays": replays, "device": dev, **options}
    rows = [bench_one(family, shape, "baseline", "baseline", checker=checker, input_sets=sets,
                      profile=profile, **timing),
            bench_one(family, shape, "default", "default", checker=checker, input_sets=sets,
                      profile=profile, **timing)]
    for i, config in enumerate(config_list):
        label = f"config{i + 1}" if len(config_list) > 1 else "config"
        rows.append(bench_one(family, shape, label, config, checker=checker, input_sets=sets,
                              profile=profile, **timing))
    out(format_rows(rows))
    if do_sweep:
        swept = sweep(family, shape, checker=checker, input_sets=sets, cache=cache,
                      profile=profile, max_configs=max_configs, device=dev, **options)
        ok = sorted((r for r in swept if not r.failure and r.facts.passes(gate, margin)),
                    key=lambda r: r.median_us)
        classes = {r.facts.parity_class for r in swept if r.facts is not None}
        failed = sum(1 for r in swept if r.failure)
        in_default = sum(1 for r in swept if r.facts is not None and r.facts.bitwise_vs_default)
        bitwise = sum(1 for r in swept if r.facts is not None and r.facts.bitwise_vs_baseline)
        out(f"\nsweep: {len(swept)} configs, {failed} failed, {len(swept) - failed - len(ok)} fail "
            f"--parity {gate}; {len(classes)} output classes, {in_default} configs in the default's, "
            f"{bitwise} bitwise equal to the serving path; best {min(top, len(ok))}:")
        out(format_rows(ok[: top]))
        if ok and rows[0].median_us == rows[0].median_us:
            out(f"best vs baseline: {rows[0].median_us / ok[0].median_us:.3f}x   "
                f"best vs default: {rows[1].median_us / ok[0].median_us:.3f}x")
