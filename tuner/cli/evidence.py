"""Commands that show the evidence: ab, report."""

from __future__ import annotations

import argparse

from ..errors import TunerError
from ..units import parse_duration
from .flags import family_flag, timeout_flag

__all__ = ["_add_ab", "cmd_ab", "_add_report", "cmd_report"]


# ---------------------------------------------------------------------------------------------- ab
AB_EPILOG = """\
examples:
  tuner ab shapes/examples/qwen_live.py:QwenDecode --batch 4
  tuner ab --hf-config qwen3_8b.json --batch 1,32 --export artifacts/export/nvidia-h200
  tuner ab --hf-config qwen3_8b.json --baseline eager,compile,max-autotune

baselines (--baseline; default: the strongest this machine runs, max-autotune on a GPU with Triton):
  eager         the model's own code
  compile       torch.compile (Inductor, default mode)
  max-autotune  torch.compile(mode="max-autotune-no-cudagraphs"): Inductor autotunes every matmul
                against its Triton templates and cuBLAS/hipBLAS, inside the harness's one graph
A transformers model with grouped KV heads runs its decode attention as SDPA on the grouped cache
(the fastest form and backend on the device) in every arm; transformers' own repeat_kv path is
timed beside it as context, never counted as a saving.

MODULE:CALLABLE returns a harness: model, prefill(), decode() (one step over static buffers,
capturable as a graph) and feed(tokens); it is called with the keyword arguments it accepts among
batch, prompt, steps, dtype, device, seed. docs/ab.md has the contract and the verdict rules.
exit codes: 0 faster beyond the A/A margin with outputs within the floor; 3 slower, diverged or
crashed; 2 a usage error or no GPU.
"""


def _add_ab(sub) -> None:
    p = sub.add_parser(
        "ab", help="the model's decode step both ways under CUDA graphs: measured vs projected",
        description="Capture the model's decode step (static KV cache) as one CUDA/HIP graph "
        "three ways in one process: baseline, tuned (tuner.serving with the export) and baseline "
        "again (A/A, the noise floor); time interleaved groups of replays, compare each arm's "
        "logits and tokens with an fp32 reference of the same weights, and attribute the saving "
        "per call shape against the export's projection. A crash is a reported result (the "
        "measurement runs in a child process).",
        epilog=AB_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", nargs="?", metavar="MODULE:CALLABLE",
                   help="the harness factory (module or path/to/file.py, then :name)")
    p.add_argument("--hf-config", metavar="CONFIG.json",
                   help="a transformers model config (model_type, sizes): random weights, no "
                   "download; needs transformers")
    p.add_argument("--batch", default="1", metavar="B[,B...]",
                   help="batch sizes, one A/B each (default 1)")
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens (default 128)")
    p.add_argument("--steps", type=int, default=32,
                   help="decode steps compared per arm (default 32)")
    p.add_argument("--phase", choices=("decode", "prefill", "mixed"), default="decode",
                   help="the step measured: decode (default); prefill, the first forward of a "
                   "--prompt-tokens prompt; mixed, the decode batch plus one --prompt-tokens "
                   "prefill chunk (the chunked-prefill step); prefill and mixed need --hf-config")
    p.add_argument("--prompt-tokens", type=int, default=2048, metavar="P",
                   help="tokens of the prompt (prefill) or of the chunk (mixed) (default 2048)")
    p.add_argument("--export", metavar="DIR",
                   help="export directory to test (default: artifacts/export/<this GPU>)")
    family_flag(p, default="gemv,gemm,attention,moe", what="kernel families to install")
    p.add_argument("--groups", type=int, default=20, help="timing groups per arm (default 20)")
    p.add_argument("--replays", type=int, default=10,
                   help="graph replays per timing group (default 10)")
    p.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16",
                   help="the model's dtype (default bfloat16)")
    p.add_argument("--no-reference", action="store_true",
                   help="skip the fp32 reference (outputs then are not judged: exit 3)")
    p.add_argument("--no-profile", action="store_true",
                   help="skip the profiled replays (no per-shape attribution)")
    p.add_argument("--trace-only", action="store_true",
                   help="only profile the baseline step's graph capture and replays, and print "
                   "the `tuner harvest` command that turns them into the model's shape table")
    p.add_argument("--baseline", metavar="NAME[,NAME...]",
                   help="what the tuned step must beat, one A/B each: eager, compile, "
                   "max-autotune (default: the strongest this machine runs)")
    p.add_argument("--tuned-step", metavar="NAME", default="",
                   help="the step the tuned arm runs the export under: eager, compile, "
                   "max-autotune (default: each baseline's own). E.g. --baseline max-autotune "
                   "--tuned-step compile: the export under Inductor's default mode against "
                   "max-autotune, the switch a max-autotune user makes (the A/A arm stays the "
                   "baseline's)")
    p.add_argument("--fold-norms", action="store_true",
                   help="in the tuned arm, fold each decoder-layer RMSNorm whose projections the "
                   "export serves with norm-capable gemv configs into them, and each residual "
                   "add after a tuned projection into its kernel (tuner.serving.install's "
                   "fold_norms; off by default until measured on a GPU: docs/ab.md)")
    p.add_argument("--compile", action="store_true",
                   help="the same as --baseline compile (kept for older scripts)")
    p.add_argument("--compile-backend", default="inductor", metavar="NAME",
                   help="the torch.compile backend of a compiled baseline (default inductor; "
                   "modes such as max-autotune are Inductor's)")
    p.add_argument("--transformers-attention", action="store_true",
                   help="keep transformers' own attention (repeat_kv, then SDPA) in the baseline "
                   "instead of SDPA on the grouped cache")
    timeout_flag(p, "per A/B (one batch size against one baseline), for the whole measurement",
                 "20m")
    p.add_argument("-o", "--output", metavar="DIR", default="artifacts/ab",
                   help="where <model>-b<batch>-<baseline>/ab.json and ab.md go (default "
                   "artifacts/ab)")
    p.set_defaults(func=cmd_ab)


def cmd_ab(args) -> int:
    from .. import ab

    if bool(args.target) == bool(args.hf_config):
        raise TunerError("tuner ab needs exactly one of: MODULE:CALLABLE, --hf-config CONFIG.json")
    spec = ("hf", args.hf_config) if args.hf_config else ("callable", args.target)
    try:
        batches = [int(b) for b in str(args.batch).split(",") if b.strip()]
    except ValueError:
        raise TunerError(f"--batch wants comma-separated integers, got {args.batch!r}") from None
    families = tuple(f.strip() for f in str(args.family).split(",") if f.strip())
    baselines = None
    if args.baseline is not None:
        from ..baselines import parse_baselines

        baselines = parse_baselines(args.baseline)
        if args.compile and baselines != ["compile"]:
            raise TunerError("--compile is --baseline compile: give one of the two")
    elif args.compile:
        baselines = ["compile"]
    tuned = ""
    if args.tuned_step:
        from ..baselines import BASELINES

        if args.tuned_step not in BASELINES:
            raise TunerError(f"--tuned-step {args.tuned_step!r}: choose from "
                             f"{', '.join(BASELINES)}")
        if args.trace_only:
            raise TunerError("--trace-only traces the baseline step alone: --tuned-step does "
                             "not apply")
        tuned = args.tuned_step
    settings = ab.ABSettings(prompt=args.prompt, steps=args.steps, groups=args.groups,
                             replays=args.replays, export_dir=args.export, families=families,
                             reference=not args.no_reference, profile=not args.no_profile,
                             dtype=args.dtype, trace_only=args.trace_only,
                             compile=args.compile_backend,
                             grouped_attention=not args.transformers_attention,
                             phase=args.phase, prompt_tokens=args.prompt_tokens,
                             tuned_step=tuned, fold_norms=args.fold_norms)
    return ab.run(spec, batches=batches, settings=settings, baselines=baselines,
                  out_root=args.output, timeout_s=parse_duration(args.timeout))


# ------------------------------------------------------------------------------------------ report
def _add_report(sub) -> None:
    p = sub.add_parser(
        "report", help="re-render report.html of a run or A/B directory",
        description="Write DIR/report.html again from what DIR holds: the budget, the plan, the "
        "search (the Optuna studies in the storage the run recorded in run.json), the verdicts "
        "and the A/Bs (DIR/ab.json, DIR/ab/*/ab.json). One self-contained file; charts need "
        "matplotlib (the `report` extra). See docs/report.md.")
    p.add_argument("directory", metavar="DIR",
                   help="the -o folder of `tuner run` (artifacts/run/<trace>/) or of `tuner ab` "
                   "(artifacts/ab/<label>/)")
    p.add_argument("--storage", metavar="URL",
                   help="the study storage, instead of the one recorded in DIR/run.json (e.g. a "
                   "PostgreSQL URL with its password, or a moved SQLite file)")
    p.add_argument("--ab", action="append", default=[], metavar="PATH",
                   help="an A/B to include (a folder `tuner ab` wrote, or its ab.json); repeatable")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="where to write (default DIR/report.html)")
    p.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    from .. import report

    path = report.render(args.directory, storage=args.storage, ab=args.ab, output=args.output)
    print(f"report: {path}")
    return 0
