"""The same-process A/B of a model's decode step: three arms, each captured as one graph.

Runs in a child process (tuner.ab.child) so a crashing arm is a reported result. Steps, each
announced through `progress(stage)` before it starts (the parent names the stage a crash ends):

1. build the harness (bf16/fp16 weights) and, with `reference`, the same weights in fp32: the fp32
   model decodes `steps` greedy tokens eagerly (its tokens and logits are the reference);
2. capture three arms of the decode step as CUDA/HIP graphs over the same static buffers:
   ``baseline`` (the model as it is), ``tuned`` (tuner.serving.install with the export; kernels
   warmed up before the capture) and ``aa`` (the baseline again: the noise floor);
3. outputs: from the same (baseline) prefill, each arm decodes `steps` steps teacher-forced on the
   reference tokens (logits error against the fp32 reference and top-1 agreement with it, per
   step) and `steps` steps free-running (its own greedy tokens);
4. timing: groups of graph replays, each group timed with device events per arm, the arms'
   order rotating from group to group (tuner.timing.ReplayTimer);
5. attribution (with `profile`): each arm captured again under the profiler (record_shapes) and
   a few replays profiled; the parent joins each pair with tuner.harvest (per-shape kernel time).

The step baseline (`baseline`: tuner.baselines, `tuner ab --baseline`) says how the decode step
runs in every arm: eager, or compiled with the `compile` backend before anything runs, in
Inductor's default mode (`compile`) or max-autotune without Inductor's CUDA graphs
(`max-autotune`), as a server that compiles its model (vLLM, SGLang's torch.compile mode) runs it: the elementwise work between the linears (norms, rotary,
activations, residual adds) fuses into few kernels, so the linears are a larger share of the step
than in the eager model. Both arms run the same compiled step: tuner.serving's custom ops are
opaque to the compiler, installing them recompiles once (Dynamo guards on the patched forwards)
and uninstalling finds the baseline's compiled code again. The compiles happen in the warm-up
before each capture, never inside one. `tuned_step` (tuner ab --tuned-step) runs the tuned arm
under another step than the baseline's, compiled on its own (e.g. the export under Inductor's
default mode against a max-autotune baseline: what a user who adopts the export would run
instead, where max-autotune has no linear left to autotune); the A/A arm stays the baseline's.

A transformers model with grouped KV heads (tuner.ab.harness.grouped_attention_shape) runs its
decode attention in every arm as SDPA on the grouped cache in the fastest form this device has
(tuner.baselines.fastest_sdpa_form, timed before the captures), in place of transformers'
repeat_kv path; beside an eager baseline a `repeat_kv` arm (transformers' own path) is captured
and timed as context (CONTEXT_ARM), never profiled or counted.

`phase` (tuner ab --phase) picks the step every arm captures: decode (above), prefill (the first
forward of a `prompt_tokens`-token prompt, tuner.ab.harness.HFPrefill) or mixed (the decode batch
plus one prefill chunk, HFMixed); the outputs, timing and attribution are the same for all three.

Returns plain JSON data. `device="cpu"` runs the same code without graphs (eager "replays",
perf_counter clocks) for tests: its numbers mean nothing.
"""

from __future__ import annotations

import contextlib
import gc
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..serving_mlp import dense_mlp_export, merge_gated_mlps
from .harness import (grouped_attention_shape, grouped_sdpa_attention, hf_factory, load_factory,
                      make_harness, phase_harness, transformers_attention)

__all__ = ["ARMS", "CONTEXT_ARM", "ABSettings", "compile_backend", "compile_decode", "measure",
           "step_baseline", "tuned_step"]

ARMS = ("baseline", "tuned", "aa")
# transformers' own attention (repeat_kv: the grouped cache copied to one KV head per query head,
# then SDPA), timed beside an eager grouped-SDPA baseline as context: never counted as a saving
CONTEXT_ARM = "repeat_kv"


@dataclass
class ABSettings:
    batch: int = 1
    prompt: int = 128
    steps: int = 32  # decode steps compared (teacher-forced and free-running)
    groups: int = 20
    replays: int = 10
    export_dir: str | None = None
    families: tuple[str, ...] = ("gemv", "gemm", "attention", "moe")
    reference: bool = True  # decode the fp32 reference of the same weights
    profile: bool = True  # profile each arm for the per-shape attribution
    profile_steps: int = 5
    out_dir: str = "artifacts/ab"
    seed: int = 0
    dtype: str = "bfloat16"
    device: str = "cuda"
    trace_only: bool = False  # only the baseline arm's capture + replay traces (for harvest)
    compile: str = ""  # a torch.compile backend for the decode step ("inductor"); "" = eager
    # the step baseline (tuner.baselines.BASELINES): "eager", "compile" or "max-autotune";
    # "" = "compile" when `compile` names a backend, else "eager"
    baseline: str = ""
    # the step the tuned arm runs the export under (tuner.baselines.BASELINES); "" = the
    # baseline's. E.g. "compile" beside baseline "max-autotune": the export under Inductor's
    # default mode against a step a user would otherwise run in max-autotune
    tuned_step: str = ""
    grouped_attention: bool = True  # a grouped-KV transformers model: SDPA on the grouped cache
    fold_norms: bool = False  # tuner.serving.install's fold_norms in the tuned arm
    # the step measured (tuner.ab.harness.PHASES): "decode" (the harness's decode step),
    # "prefill" (the first forward of a prompt_tokens-token prompt) or "mixed" (the decode batch
    # plus one prefill chunk of prompt_tokens tokens); prefill and mixed: --hf-config only
    phase: str = "decode"
    prompt_tokens: int = 2048


def step_baseline(settings: ABSettings) -> str:
    """The step baseline the settings ask for (tuner.baselines.BASELINES)."""
    from ..baselines import check_baseline

    return check_baseline(settings.baseline or ("compile" if settings.compile else "eager"))


def compile_backend(settings: ABSettings, step: str = "") -> str:
    """The torch.compile backend of a compiled step ('' for an eager one): of `step`
    (tuner.baselines.BASELINES), else of the settings' baseline."""
    step = step or step_baseline(settings)
    return "" if step == "eager" else (settings.compile or "inductor")


def tuned_step(settings: ABSettings) -> str:
    """The step the tuned arm runs (tuner.baselines.BASELINES): the settings' tuned_step, else
    the baseline's."""
    from ..baselines import check_baseline

    return check_baseline(settings.tuned_step) if settings.tuned_step else step_baseline(settings)


def tuned_decode(decode, settings: ABSettings):
    """The tuned arm's decode step when it runs another step than the baseline (`decode`: the
    harness's step before compile_decode), else None (the arm runs the baseline's step)."""
    from ..baselines import compile_step

    mode = tuned_step(settings)
    if mode == step_baseline(settings):
        return None
    return compile_step(decode, mode, compile_backend(settings, mode) or "inductor")


def compile_decode(harness, settings: ABSettings) -> None:
    """Replace the harness's decode step by its form under the settings' step baseline
    (tuner.baselines.compile_step: torch.compile'd, in max-autotune mode without Inductor's own
    CUDA graphs for "max-autotune"; the module docstring)."""
    from ..baselines import compile_step

    baseline = step_baseline(settings)
    if baseline != "eager":
        harness.decode = compile_step(harness.decode, baseline, compile_backend(settings))


def _build(factory, settings: ABSettings, dtype, common: dict):
    """The harness of the settings' phase (tuner.ab.harness.phase_harness) in `dtype`."""
    harness = make_harness(factory, dtype=dtype, **common)
    return phase_harness(harness, settings.phase, settings.prompt_tokens, settings.seed)


def _factory(spec: tuple[str, str]):
    kind, value = spec
    return hf_factory(value) if kind == "hf" else load_factory(value)


class _Arm:
    """One arm: its graph (or, on the CPU, the eager step) and the tensor its replay writes.
    `serve`: a context manager factory that installs the tuned kernels (tuned arm only);
    `decode`: the step this arm runs where it is not the harness's (ABSettings.tuned_step)."""

    def __init__(self, name: str, harness, gpu: bool, serve=None, decode=None):
        self.name = name
        self.harness = harness
        self.decode = decode if decode is not None else harness.decode
        self.gpu = gpu
        self.serve = serve or contextlib.nullcontext
        self.graph = None
        self.logits = None
        self.serving: dict = {}

    def capture(self) -> None:
        """Warm up and capture the decode step (on the CPU: only note what serving serves)."""
        with self.serve() as handle:
            if handle is not None:
                handle.warmup(self.decode)
            if self.gpu:
                self._capture()
            if handle is not None:
                self.serving = {"status": handle.status(), "hits": handle.hits(),
                                "misses": handle.misses(), "linears": len(handle.linears),
                                "norms_folded": len(handle.norms),
                                "residual_adds_fused": handle.residual_adds_fused()}

    def _capture(self) -> None:
        h = self.harness
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # allocator, cuBLAS workspaces, Triton compiles: never in capture
                self.decode()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self.decode()
        torch.cuda.synchronize()

    def step(self) -> torch.Tensor:
        """One decode step: a graph replay (or, on the CPU, the eager step of this arm)."""
        if self.graph is None:
            with self.serve():
                return self.decode()
        self.graph.replay()
        return self.logits


def _sync(gpu: bool) -> None:
    if gpu:
        torch.cuda.synchronize()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a64, b64 = a.double(), b.double()
    denom = float(torch.linalg.vector_norm(b64))
    if not bool(torch.isfinite(a64).all()):
        return math.inf
    return float(torch.linalg.vector_norm(a64 - b64)) / denom if denom > 0 else 0.0


def _greedy(step, harness, steps: int, keep_logits: bool = False) -> tuple[list, list]:
    """Free-running greedy decode from a fresh prefill: tokens [steps][batch] (and, with
    `keep_logits`, each step's logits in fp32)."""
    harness.prefill()
    tokens, logits = [], []
    for _ in range(steps):
        out = step()
        tok = out.argmax(-1)
        tokens.append(tok.tolist())
        if keep_logits:
            logits.append(out.float().clone())
        harness.feed(tok)
    return tokens, logits


def _teacher_forced(arm: _Arm, ref_tokens: list, ref_logits: list) -> dict:
    """Each step fed the reference's tokens: the arm's logits error and top-1 agreement."""
    h = arm.harness
    h.prefill()
    errors, agreement = [], []
    for i, tokens in enumerate(ref_tokens):
        out = arm.step()
        errors.append(_rel(out.float(), ref_logits[i]))
        want = torch.tensor(tokens, device=out.device)
        agreement.append(float((out.argmax(-1) == want).float().mean()))
        h.feed(want)
    return {"error": errors, "agreement": agreement}


def _time(arms: list[_Arm], groups: int, replays: int, gpu: bool) -> dict[str, list[float]]:
    from ..timing import ReplayTimer

    timers = {a.name: ReplayTimer(a.step, 1, gpu=gpu) for a in arms}
    for a in arms:  # warm: the first replays upload the graphs
        for _ in range(3):
            a.step()
    _sync(gpu)
    out: dict[str, list[float]] = {a.name: [] for a in arms}
    for g in range(groups):
        order = arms[g % len(arms):] + arms[:g % len(arms)]
        for a in order:
            out[a.name].append(timers[a.name].group(replays))
    return out


def _profile(arm: _Arm, directory: Path, steps: int, gpu: bool) -> dict:
    """Capture the arm again under the profiler (record_shapes) and profile `steps` replays
    (one ProfilerStep each): the pair tuner.harvest joins."""
    from torch.profiler import ProfilerAction, ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    directory.mkdir(parents=True, exist_ok=True)
    capture_path = directory / f"{arm.name}_capture.pt.trace.json"
    replay_path = directory / f"{arm.name}_replay.pt.trace.json"
    graph = None
    with arm.serve(), profile(activities=activities, record_shapes=True) as prof:
        if gpu:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                arm.decode()
            torch.cuda.synchronize()
        else:
            arm.decode()
    prof.export_chrome_trace(str(capture_path))
    replay = graph.replay if graph is not None else arm.step
    with profile(activities=activities, record_shapes=True,
                 schedule=lambda step: ProfilerAction.RECORD) as prof:
        for i in range(steps):
            if i:
                prof.step()
            replay()
            _sync(gpu)
    prof.export_chrome_trace(str(replay_path))
    return {"capture": str(capture_path), "replay": str(replay_path)}


def _attention_baseline(harness, settings: ABSettings, gpu: bool, progress, result: dict):
    """For a transformers model with grouped KV heads: the fastest grouped SDPA form on this
    device for its decode call (tuner.baselines.fastest_sdpa_form), which the baseline arms run
    in place of transformers' repeat_kv path; recorded in result["attention_baseline"]. None
    (transformers' own attention everywhere) for other harnesses, ungrouped models, or
    `grouped_attention` off. On the CPU the form is the math backend's, untimed."""
    from ..baselines import SDPAForm, fastest_sdpa_form
    from ..errors import TunerError

    shape = grouped_attention_shape(harness) if settings.grouped_attention else None
    if shape is None:
        return None
    progress("attention baseline: timing SDPA on the grouped cache, each form and backend")
    if gpu:
        try:
            form, tried = fastest_sdpa_form(shape)
        except TunerError as exc:  # no form runs: transformers' own attention stays the baseline
            result["attention_baseline"] = {"form": "", "shape": shape, "why": str(exc)}
            return None
    else:
        form, tried = SDPAForm("packed", "MATH"), [{"form": "SDPA packed (math)",
                                                     "skipped": "not timed on the CPU"}]
    result["attention_baseline"] = {"form": str(form), "layout": form.layout,
                                    "backend": form.backend, "shape": shape, "tried": tried}
    return form


def _identity(device: str) -> dict:
    from ..device import versions

    info = {"versions": {k: v for k, v in versions().items() if v}}
    if device == "cuda":
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        info["device_name"] = props.name
    else:
        info["device_name"] = "cpu"
    return info


def measure(spec: tuple[str, str], settings: ABSettings, progress=lambda stage: None) -> dict:
    """The whole A/B in this process (module docstring); returns plain JSON data."""
    from .. import serving

    gpu = settings.device == "cuda"
    dtype = getattr(torch, settings.dtype)
    factory = _factory(spec)
    common = dict(batch=settings.batch, prompt=settings.prompt, steps=settings.steps,
                  device=settings.device, seed=settings.seed)
    result: dict = {"settings": asdict(settings), "spec": list(spec), **_identity(settings.device)}

    ref_tokens = ref_logits = None
    if settings.trace_only:
        progress("build: the model in " + settings.dtype)
        harness = _build(factory, settings, dtype, common)
        compile_decode(harness, settings)
        with torch.no_grad():
            harness.prefill()
            arm = _Arm("baseline", harness, gpu)
            for _ in range(2):  # warm up outside the profiled capture
                harness.decode()
            progress("profile: baseline arm")
            result["traces"] = {"baseline": _profile(arm, Path(settings.out_dir) / "traces",
                                                     settings.profile_steps, gpu)}
        progress("done")
        return result
    if settings.reference:
        progress("reference: fp32 model, greedy decode")
        ref = _build(factory, settings, torch.float32, common)
        with torch.no_grad():
            ref_tokens, ref_logits = _greedy(ref.decode, ref, settings.steps, keep_logits=True)
        result["reference_tokens"] = ref_tokens
        del ref
        gc.collect()
        if gpu:
            torch.cuda.empty_cache()

    progress("build: the model in " + settings.dtype)
    harness = _build(factory, settings, dtype, common)
    if settings.export_dir and "moe" in settings.families and dense_mlp_export(settings.export_dir):
        # before any arm's capture: the tuned arm's install would move the gate / up weights
        # the baseline arm's graph reads (tuner.serving_mlp); the same values in every arm
        progress(f"merge: gate and up weights of {merge_gated_mlps(harness.model)} gated MLPs")
    own_step = tuned_decode(harness.decode, settings)
    compile_decode(harness, settings)
    model = harness.model
    result["model"] = {"class": type(model).__name__,
                       "parameters": int(sum(p.numel() for p in model.parameters())),
                       "dtype": settings.dtype}
    result["baseline"] = step_baseline(settings)
    result["tuned_step"] = tuned_step(settings)
    form = _attention_baseline(harness, settings, gpu, progress, result)

    @contextlib.contextmanager
    def serve():
        handle = serving.install(model, export_dir=settings.export_dir, families=settings.families,
                                 fold_norms=settings.fold_norms)
        try:
            yield handle
        finally:
            handle.uninstall()

    own: dict = {}

    def grouped(transformers_own):
        own["sdpa"] = transformers_own
        return grouped_sdpa_attention(transformers_own, form)

    @contextlib.contextmanager
    def transformers_own():
        with transformers_attention(lambda current: own["sdpa"]):
            yield None

    # the context arm only beside the eager baseline: under torch.compile it would cost one more
    # whole compile (minutes in max-autotune) to time a path no server runs
    context = form is not None and result["baseline"] == "eager"
    names = ARMS + ((CONTEXT_ARM,) if context else ())
    arms = [_Arm(name, harness, gpu, {"tuned": serve, CONTEXT_ARM: transformers_own}.get(name),
                 own_step if name == "tuned" else None)
            for name in names]
    with torch.no_grad(), (transformers_attention(grouped) if form is not None
                           else contextlib.nullcontext()):
        harness.prefill()
        for arm in arms:
            mode = result["tuned_step"] if arm.name == "tuned" else result["baseline"]
            arm_backend = compile_backend(settings, mode)
            progress(f"capture: {arm.name} arm" + (f" ({mode}, torch.compile "
                                                     f"{arm_backend}: the warm-up compiles)"
                                                     if arm_backend else ""))
            arm.capture()
        result["serving"] = arms[1].serving

        outputs: dict = {"free_running": {}, "teacher_forced": {}}
        for arm in arms:
            progress(f"outputs: {arm.name} arm, {settings.steps} steps")
            outputs["free_running"][arm.name] = _greedy(arm.step, harness, settings.steps)[0]
            if ref_tokens is not None:
                outputs["teacher_forced"][arm.name] = _teacher_forced(arm, ref_tokens, ref_logits)
        result["outputs"] = outputs

        progress(f"timing: {settings.groups} groups of {settings.replays} replays per arm")
        harness.prefill()
        result["group_us"] = _time(arms, settings.groups, settings.replays, gpu)

        if settings.profile:
            traces = {}
            for arm in arms:
                if arm.name == CONTEXT_ARM:
                    continue  # context only: timed, not attributed
                progress(f"profile: {arm.name} arm")
                harness.prefill()
                traces[arm.name] = _profile(arm, Path(settings.out_dir) / "traces",
                                            settings.profile_steps, gpu)
            result["traces"] = traces
    progress("done")
    return result
