"""`tuner ab`: does the projected saving show up in the model's own decode step?

(`--phase prefill|mixed`: the same A/B of the first forward of a P-token prompt, or of the
chunked-prefill step: the decode batch plus one P-token chunk; tuner.ab.harness.)

A projection is a hypothesis. `tuner ab` builds the model (MODULE:CALLABLE, or a transformers
config with random weights), captures its decode step over a static KV cache as one CUDA/HIP
graph three ways in one process — baseline, tuned (tuner.serving with the export) and baseline
again (A/A) — and reports step time per arm with the A/A noise floor, the tokens and logits of
each arm against an fp32 reference of the same weights, and, per call shape, the kernel time of
each arm (the arms' graph replays profiled and joined with their captures by tuner.harvest)
against what the export projected. Modules: harness (what a model must give), measure (the
measurement, in a child process: child), verdict (the pure decision and its tables).

Writes artifacts/ab/<label>/ab.json and ab.md (one A/B per batch size) and returns the exit
code: 0 faster beyond the A/A margin with outputs within the floor, 3 otherwise (slower,
diverged, crashed). Without a GPU it says what it would run and exits 2.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..baselines import check_baseline, strongest_available
from ..errors import NoGPUError, TunerError, info, warn
from ..serving_mlp import dense_mlp_export
from ..hardware import have_gpu
from ..report import write_ab_report
from .child import run_child
from .harness import check_spec
from .measure import ABSettings, compile_backend, step_baseline, tuned_step
from .verdict import (EXIT_FAIL, EXIT_PASS, ABVerdict, decide, markdown, moe_calls,
                      paired_moe_keys, step_words, summary_lines)

__all__ = ["ABSettings", "ABVerdict", "AB_DIR", "check_phase", "default_baselines", "linear_floors",
           "moe_attribution_note", "moe_topk", "plan_lines", "Projection", "projected_savings",
           "run"]

AB_DIR = Path("artifacts") / "ab"


def _label(spec: tuple[str, str]) -> str:
    kind, value = spec
    name = Path(value).stem if kind == "hf" else value.rpartition(":")[2]
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name) or "model"


def plan_lines(spec: tuple[str, str], batches: list[int], settings: ABSettings,
               baselines: list[str] | None = None) -> list[str]:
    what = f"--hf-config {spec[1]}" if spec[0] == "hf" else spec[1]
    export = settings.export_dir or "artifacts/export/<this GPU>"
    names = baselines or [step_baseline(settings)]
    return [f"tuner ab would build {what} (dtype {settings.dtype}, prompt {settings.prompt}) at "
            f"batch {', '.join(map(str, batches))}, against the baseline "
            f"{' and '.join(names)} (each its own A/B), capture its {_step_words(settings)} as a CUDA/HIP "
            f"graph three ways (baseline, tuned with {export}"
            + (f" under {tuned_step(settings)}" if settings.tuned_step else "")
            + f", A/A), decode {settings.steps} steps "
            f"per arm against an fp32 reference, time {settings.groups} x {settings.replays} "
            f"replays per arm and profile each arm for the per-shape attribution"
            + _moe_plan(spec, settings)]


def _moe_plan(spec: tuple[str, str], settings: ABSettings) -> str:
    """'; the tuned arm routes its N MoE blocks ...' for a transformers MoE config (Qwen2/3-MoE,
    Mixtral: num_experts or num_local_experts) with moe among the families, else ''."""
    config, topk = _hf_config(spec), moe_topk(spec)
    if topk is None or "moe" not in settings.families:
        return ""
    try:
        experts = int(config.get("num_experts") or config.get("num_local_experts"))
        hidden = int(config["hidden_size"])
        inter = int(config.get("moe_intermediate_size") or config["intermediate_size"])
        layers = int(config["num_hidden_layers"])
        step = int(config.get("decoder_sparse_step") or 1)
        dense = set(config.get("mlp_only_layers") or ())
    except (ValueError, KeyError, TypeError):
        return ""
    blocks = sum(1 for i in range(layers) if i not in dense and (i + 1) % step == 0)
    if experts < 1 or blocks < 1:
        return ""
    return (f"; the tuned arm routes its {blocks} MoE blocks ({experts} experts, top-{topk}, "
            f"hidden {hidden}, inter {inter}) through tuner.moe where the export has their "
            f"structure (transformers' own experts elsewhere); the verdict attributes MoE calls "
            f"per shape only where both arms' harvested tables have MoE rows")


def moe_attribution_note(serving: dict, tables: dict) -> str:
    """A line for an A/B whose tuned arm ran tuner.moe (serving: the tuned arm's hits) when no
    MoE call is attributed per shape (verdict.paired_moe_keys: no moe rows of one shape in both
    arms' harvested tables), else ''."""
    calls = moe_calls(serving)
    if not calls or paired_moe_keys(tables):
        return ""
    return (f"MoE: {calls} calls ran tuner.moe in the tuned arm; they are not attributed per "
            f"shape (the baseline and tuned arms' harvested tables have no moe rows of one "
            f"shape; a compiled step's grouped-mm templates carry no op the harvest reads): "
            f"their saving is in the step time and the residual only")


def _step_words(settings: ABSettings) -> str:
    """What the captured step is, in words (tuner ab --phase)."""
    if settings.phase == "prefill":
        return f"prefill step (the first forward of a {settings.prompt_tokens}-token prompt)"
    if settings.phase == "mixed":
        return (f"mixed step (the decode step plus one {settings.prompt_tokens}-token prefill "
                f"chunk)")
    return "decode step"


def _phase_label(settings: ABSettings) -> str:
    """'' for decode (the folders of earlier A/Bs keep their names), else '-prefill2048' etc."""
    return "" if settings.phase == "decode" else f"-{settings.phase}{settings.prompt_tokens}"


def check_phase(spec: tuple[str, str], settings: ABSettings) -> None:
    """--phase and --prompt-tokens: one of PHASES; prefill / mixed only for --hf-config."""
    from .harness import phase_problem

    problem = phase_problem(settings.phase, spec[0] == "hf")
    if problem:
        raise TunerError(problem)
    if settings.prompt_tokens < 1:
        raise TunerError(f"--prompt-tokens must be >= 1, got {settings.prompt_tokens}")


def default_baselines(settings: ABSettings, gpu: bool) -> list[str]:
    """The baseline the settings name, else the strongest this machine runs
    (tuner.baselines.strongest_available); `compile` alone names only the backend."""
    if settings.baseline:
        return [check_baseline(settings.baseline)]
    return [strongest_available(gpu)]


def _have_gpu() -> bool:
    return have_gpu()


def _export_dir(settings: ABSettings) -> str:
    if settings.export_dir:
        return settings.export_dir
    from .. import runtime

    directory = runtime.export_dir()
    if directory is None:
        raise TunerError("cannot name this GPU's export directory: give --export DIR")
    return str(directory)


def _kernel_totals(traces: dict) -> dict:
    """arm -> {kernel name: (µs, launches) per profiled replay}; {} where a trace cannot be
    read (the listing informs, it never costs the verdict)."""
    from ..harvest import kernel_totals

    out = {}
    for arm, paths in traces.items():
        try:
            out[arm] = kernel_totals(paths["replay"])[0]
        except Exception:  # noqa: BLE001 - the timed verdict must not be lost with it
            return {}
    return out


def _harvest(traces: dict, topk: int | None = None,
             gated_mlp: bool = False) -> tuple[dict, str]:
    """Each arm's graph replay joined with its capture: arm -> ShapeTable rows (dicts). `topk`
    (a MoE model's num_experts_per_tok): transformers' grouped-mm experts read as moe rows
    (tuner harvest --topk), which pair with the tuned arm's tuner::moe rows. `gated_mlp`: each
    dense layer's gate, up and down linear calls read as one moe call of experts 1 (tuner
    harvest --gated-mlp), which pairs with the tuned arm's tuner::moe call of its MLP."""
    from .. import harvest

    tables = {}
    for arm, paths in traces.items():
        try:
            result = harvest.harvest([paths["replay"]], capture=[paths["capture"]], quiet=True,
                                     topk=topk, gated_mlp=gated_mlp)
        except TunerError as exc:
            return {}, f"attribution unavailable ({arm} arm): {exc}"
        except Exception as exc:  # noqa: BLE001 - the timed verdict must not be lost with it
            return {}, (f"attribution unavailable ({arm} arm): harvest failed with "
                        f"{type(exc).__name__}: {exc}")
        tables[arm] = result.table.to_dict("records")
    return tables, ""


@dataclass
class Projection:
    """What an export projects for an A/B's baseline step (`projected_savings`), per attribution
    key ('m=..,n=..,k=..', 'attention b=.. h=.. kv=.. d=..', 'moe m=.. E=.. ...')."""

    savings: dict = field(default_factory=dict)  # key -> projected saving, µs per step
    paths: list = field(default_factory=list)  # the baseline path of each entry's measurement
    entries: dict = field(default_factory=dict)  # key -> [{"family", "key"}] serving resolved
    alone: dict = field(default_factory=dict)  # key -> {"baseline_us", "candidate_us"} per step


def projected_savings(export_dir: str | Path, baseline_rows: list[dict],
                      tuned_rows: list[dict] | None = None) -> Projection:
    """`savings`: attribution key -> the saving the export projects per step for that call:
    the saving per call rank measured for the entry serving uses (exact, else nearest m /
    kv_len), times the calls per step in this A/B's own baseline step. `tuned_rows` (the tuned
    step's harvested rows) say which KV head count the tuned step ran a decode attention call
    with: transformers' baseline call is recorded after repeat_kv (kv_heads = heads), the served
    one on the model's cache. MoE calls are projected from the baseline step's moe rows
    (transformers' grouped-mm experts read with the config's top-k), or, where it has none (a
    compiled step's grouped-mm templates: docs/harvest.md), from the tuned step's: its
    tuner::moe calls are the same calls of the same step, at the shape serving resolved.
    `paths`: the baseline path each projected entry was measured against; `entries`: key -> the
    export entries serving resolved that call to (`tuner export --drop-step-losses` reads them);
    `alone`: key -> the baseline's and the candidate's time per step as rank timed them alone
    (its µs per call times the step's calls), what the projection is the difference of."""
    import os

    from tuner_kernels import get_family

    from .. import runtime

    previous = os.environ.get("TUNER_EXPORT_DIR")
    os.environ["TUNER_EXPORT_DIR"] = str(export_dir)
    runtime.reset()
    try:
        projection = Projection()
        projection.savings = _projected(export_dir, baseline_rows, get_family, runtime,
                                        tuned_rows or [], projection)
        return projection
    finally:
        if previous is None:
            os.environ.pop("TUNER_EXPORT_DIR", None)
        else:
            os.environ["TUNER_EXPORT_DIR"] = previous
        runtime.reset()


def _projected(export_dir, baseline_rows, get_family, runtime, tuned_rows,
               projection: Projection) -> dict:
    """attribution key -> the export's projected saving per step for the baseline step's calls
    (the entry each call resolves to: exact, else nearest m / kv_len, as serving resolves it;
    MoE calls: projected_savings); fills `projection`'s paths, entries and alone."""
    from ..shapetable import attribution_key

    paths, entries, alone = projection.paths, projection.entries, projection.alone

    served_kv_heads = {attribution_key(r): int(r["kv_heads"]) for r in tuned_rows
                       if r.get("family") == "attention" and r.get("kv_heads") is not None
                       and r.get("heads") is not None and int(r["kv_heads"]) < int(r["heads"])}

    families = {"gemm": ("gemv", "gemm"), "attention": ("attention",), "moe": ("moe",)}
    if not any(r.get("family") == "moe" for r in baseline_rows):
        baseline_rows = baseline_rows + [r for r in tuned_rows if r.get("family") == "moe"]
    docs = {}
    for family in ("gemv", "gemm", "attention", "moe"):
        path = Path(export_dir) / f"{family}.json"
        try:
            docs[family] = json.loads(path.read_text()).get("configs", {})
        except (OSError, ValueError):
            docs[family] = {}
    out: dict = {}
    for row in baseline_rows:
        for family in families.get(row.get("family"), ()):
            shape = get_family(family).shape_from_row(row)
            if shape is None:
                continue
            try:
                _config, key = runtime.resolve(family, shape)
                grouped = served_kv_heads.get(attribution_key(row))
                if key is None and family == "attention" and grouped is not None \
                        and int(shape["kv_heads"]) == int(shape["heads"]):
                    # the tuned step ran it on the grouped cache: the entry serving resolved
                    _config, key = runtime.resolve(family, {**shape, "kv_heads": grouped})
            except Exception:  # noqa: BLE001 - no usable export: nothing projected
                key = None
            entry = docs[family].get(key) if key else None
            if entry is not None:
                served = entries.setdefault(attribution_key(row), [])
                if {"family": family, "key": key} not in served:
                    served.append({"family": family, "key": key})
            measured = (entry or {}).get("measured") or {}
            saving = measured.get("saving_us_per_call")
            if saving is not None:
                paths.append(str(measured.get("baseline_path") or "eager"))
                name = attribution_key(row)
                calls = float(row["calls_per_step"])
                out[name] = out.get(name, 0.0) + float(saving) * calls
                timed = alone.setdefault(name, {"baseline_us": 0.0, "candidate_us": 0.0})
                for field in timed:  # an entry without the time (null in JSON): NaN
                    value = measured.get(field)
                    timed[field] += (math.nan if value is None else float(value)) * calls
    return out


def linear_floors(baseline_rows: list[dict], device_name: str,
                  phase: str = "decode") -> tuple[dict, str]:
    """'m=..,n=..,k=..' -> the physical floor of that linear shape per step (calls x the longest
    of bytes / bandwidth, flops / matmul rate and the kernel floor: tuner.budget's floor) on the
    A/B's device profile (tuner.device.choose_profile: a measured profile when `tuner device`
    saved one, else the datasheet's), and the profile's label; ({}, why) when there is none."""
    from .. import budget
    from ..device import choose_profile

    try:
        profile, label = choose_profile(trace_devices=[device_name])
        budget.check_profile(profile)
    except TunerError as exc:
        return {}, f"no linear floors: {exc}"
    kernel_floor = float(getattr(profile, "kernel_floor_us", 0.0) or 0.0)
    floors: dict = {}
    for row in baseline_rows:
        # a decode A/B's step is decode; a prefill or mixed step's rows may read as prefill
        phases = (None, "decode", "other") + (("prefill",) if phase != "decode" else ())
        if row.get("family") != "gemm" or row.get("phase") not in phases:
            continue
        _bytes, _flops, per_call, why = budget.call_floor_us(row, profile, kernel_floor)
        if why:
            continue
        key = f"m={row['m']},n={row['n']},k={row['k']}"
        floors[key] = floors.get(key, 0.0) + per_call * float(row.get("calls_per_step") or 0.0)
    if not floors:
        return {}, "no linear floors: the baseline step's attribution has no linear shapes"
    return floors, label


def _trace_only(spec, batches, settings, out_root, timeout_s, out) -> int:
    """The baseline decode step's graph capture and replays, profiled: the traces to harvest
    (`tuner harvest REPLAY --capture CAPTURE`) before a search of this model's shapes."""
    label = _label(spec)
    for batch in batches:
        directory = (Path(out_root)
                     / f"{label}{_phase_label(settings)}-b{batch}-{step_baseline(settings)}")
        s = ABSettings(**{**settings.__dict__, "batch": batch, "out_dir": str(directory)})
        s.compile = compile_backend(s)
        child = run_child(spec, s, directory, timeout_s, echo=lambda line: info(f"  .. {line}"))
        if child.usage_error:
            raise TunerError(child.usage_error)
        if not child.ok:
            raise TunerError(f"tracing {label} at batch {batch} failed: {child.reason}")
        paths = child.data["traces"]["baseline"]
        out(f"{label} batch {batch}: tuner harvest {paths['replay']} --capture {paths['capture']}"
            + _kv_heads_flag(spec) + _topk_flag(spec))
    return EXIT_PASS


def _kv_heads_flag(spec: tuple[str, str]) -> str:
    """' --kv-heads N' for a transformers config with grouped KV heads (the baseline step records
    its decode attention after repeat_kv; harvest reads it as the grouped call serving runs),
    else ''."""
    config = _hf_config(spec)
    try:
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
    except (ValueError, KeyError, TypeError):
        return ""
    return f" --kv-heads {kv_heads}" if kv_heads < heads else ""


def moe_topk(spec: tuple[str, str]) -> int | None:
    """The top-k of a transformers MoE config (num_experts_per_tok, with num_experts or
    num_local_experts), else None: what `tuner harvest --topk` needs to read the traced step's
    grouped-mm experts (two aten::_grouped_mm calls a block) as one moe call each. tuner ab's
    own attribution does not use it (docs/harvest.md: those calls' time leaves out the sort
    and gather around them)."""
    config = _hf_config(spec)
    try:
        if not int(config.get("num_experts") or config.get("num_local_experts") or 0):
            return None
        topk = int(config["num_experts_per_tok"])
    except (AttributeError, ValueError, KeyError, TypeError):
        return None
    return topk if topk >= 1 else None


def _topk_flag(spec: tuple[str, str]) -> str:
    topk = moe_topk(spec)
    return f" --topk {topk}" if topk else ""


def _hf_config(spec: tuple[str, str]) -> dict | None:
    """The transformers config of an --hf-config spec (a dict), else None (a harness module, or
    a file that no longer reads: tuner ab checked it first)."""
    if spec[0] != "hf":
        return None
    try:
        config = json.loads(Path(spec[1]).read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def run(spec: tuple[str, str], *, batches: list[int], settings: ABSettings,
        baselines: list[str] | None = None, out_root: str | Path = AB_DIR,
        timeout_s: float | None = None, out=print) -> int:
    """The A/B at every batch size against every baseline (tuner.baselines.BASELINES; default:
    `default_baselines`); prints and writes each verdict under out_root/<model>-b<batch>-<baseline>/;
    returns the exit code."""
    if not batches or any(b < 1 for b in batches):
        raise TunerError(f"--batch needs positive batch sizes, got {batches}")
    if settings.steps < 1 or settings.groups < 2 or settings.replays < 1:
        raise TunerError("--steps must be >= 1, --groups >= 2 and --replays >= 1")
    for name in baselines or ():
        check_baseline(name)
    check_phase(spec, settings)
    check_spec(spec)  # a missing module, file or attribute: one line, before the GPU check
    gpu = settings.device == "cuda" and _have_gpu()
    chosen = bool(baselines) or bool(settings.baseline)  # the user named it: no fallback
    baselines = list(baselines or default_baselines(settings, gpu))
    if settings.device == "cuda" and not gpu:
        for line in plan_lines(spec, batches, settings, baselines):
            out(line)
        raise NoGPUError("tuner ab needs a CUDA or ROCm GPU: it captures and times the decode "
                         "step as a graph; none is visible here")
    if settings.trace_only:
        if len(baselines) > 1:
            raise TunerError("--trace-only traces one step: give one --baseline")
        traced = ABSettings(**{**settings.__dict__, "baseline": baselines[0]})
        return _trace_only(spec, batches, traced, out_root, timeout_s, out)
    export_dir = _export_dir(settings) if settings.device == "cuda" else (settings.export_dir or "")
    if settings.device == "cuda" and not Path(export_dir).is_dir():
        raise TunerError(f"no export at {export_dir}: run `tuner run` / `tuner export` first, or "
                         f"give --export DIR")
    label = _label(spec)
    worst = EXIT_PASS
    for batch in batches:
        for baseline in baselines:
            verdict = _one(spec, label, batch, baseline, settings, export_dir, out_root,
                           timeout_s, out)
            if not chosen and baseline != "eager" and _compile_crash(verdict):
                # the default (the strongest this machine runs) does not run this harness:
                # say so and measure against the one that does, never silently
                warn(f"the default baseline {baseline} did not run this step ({verdict.crashed}); "
                     f"measuring against eager instead (give --baseline to choose)")
                verdict = _one(spec, label, batch, "eager", settings, export_dir, out_root,
                               timeout_s, out)
            worst = max(worst, verdict.exit_code)
    return EXIT_FAIL if worst != EXIT_PASS else EXIT_PASS


def _compile_crash(verdict: ABVerdict) -> bool:
    """Whether the A/B crashed while the baseline arm was compiled and captured (where a step
    that torch.compile cannot take fails), not later."""
    return bool(verdict.crashed) and "capture: baseline arm" in verdict.crashed


def _one(spec, label, batch, baseline, settings, export_dir, out_root, timeout_s,
         out) -> ABVerdict:
    """One A/B (one batch size, one baseline): measured in a child, decided, written."""
    s = ABSettings(**{**settings.__dict__, "batch": batch, "export_dir": export_dir or None,
                      "baseline": baseline})
    own = tuned_step(s)
    run_label = f"{label}{_phase_label(settings)}-b{batch}-{baseline}" + (
        f"-tuned-{own}" if own != baseline else "")
    directory = Path(out_root) / run_label
    s.out_dir = str(directory)
    s.compile = compile_backend(s) or compile_backend(s, own)
    info(f"tuner ab {run_label}: {plan_lines(spec, [batch], s)[0]}")
    child = run_child(spec, s, directory, timeout_s, echo=lambda line: info(f"  .. {line}"))
    if child.usage_error:
        raise TunerError(child.usage_error)
    tables, note = ({}, "")
    projection = Projection()
    floors, floor_label = {}, ""
    kernels: dict = {}
    if child.ok and child.data.get("traces"):
        tables, note = _harvest(child.data["traces"], moe_topk(spec),
                                dense_mlp_export(export_dir))
        kernels = _kernel_totals(child.data["traces"])
        if note:
            warn(note)
        if tables.get("baseline") and export_dir:
            projection = projected_savings(export_dir, tables["baseline"],
                                           tables.get("tuned") or [])
        if tables.get("baseline"):
            floors, floor_label = linear_floors(tables["baseline"],
                                                str(child.data.get("device_name") or ""),
                                                settings.phase)
            if not floors and floor_label:
                info(f"  {floor_label}")
    moe_note = moe_attribution_note(child.data.get("serving") or {}, tables) if child.ok else ""
    if moe_note:
        info(f"  {moe_note}")
    verdict = decide(child.data if child.ok else None, label=run_label,
                     crashed="" if child.ok else child.reason, tables=tables,
                     projected=projection.savings, floors=floors, floor_profile=floor_label,
                     projection_baselines=projection.paths, kernels=kernels,
                     alone=projection.alone)
    if verdict.crashed and not child.ok:  # no data to name the steps: the request's
        verdict.baseline, verdict.tuned_step = baseline, own
        verdict.step_mode = step_words(baseline, s.compile)
        verdict.tuned_step_mode = step_words(own, s.compile)
    for row in verdict.attribution:  # which export entries served each call
        row["export_entries"] = projection.entries.get(row["shape"], [])
    directory.mkdir(parents=True, exist_ok=True)
    record = verdict.to_json()
    record["seconds"] = child.seconds
    if note:
        record["attribution_note"] = note
    if moe_note:
        record["moe_note"] = moe_note
    (directory / "ab.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    (directory / "ab.md").write_text(markdown(verdict))
    for line in summary_lines(verdict):
        out(line)
    out(f"  written: {directory / 'ab.json'} and {directory / 'ab.md'}")
    write_ab_report(directory, out=lambda line: out(f"  {line}"))  # report.html beside it
    return verdict
