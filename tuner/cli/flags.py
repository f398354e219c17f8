"""Flags several commands take, each declared once: one meaning, default and help everywhere."""

from __future__ import annotations

__all__ = ["DEFAULT_STORAGE_TEXT", "baseline_flag", "device_flag", "family_flag", "gated_mlp_flag",
           "kv_heads_flag", "min_saving_flag", "parity_flags", "step_baseline_of", "storage_flag",
           "timeout_flag", "topk_flag"]


DEFAULT_STORAGE_TEXT = "sqlite:///artifacts/studies.db"


def device_flag(p, what: str) -> None:
    from ..device import spec_names

    p.add_argument("--device", metavar="PROFILE",
                   help=f"device profile {what}: a JSON from `tuner device`, a saved profile name "
                   f"or a spec name ({spec_names()}: published peaks, not measured); default: the "
                   "measured profile of this machine's GPU or of the table's device, else the spec "
                   "profile matching the device's name")


def family_flag(p, default: str | None = "gemv", what: str = "kernel family to tune") -> None:
    import tuner_kernels as kernels

    names = ", ".join(kernels.family_names())
    p.add_argument("--family", default=default, metavar="NAME",
                   help=f"{what} ({names}); default {default or 'all'}")


def kv_heads_flag(p) -> None:
    p.add_argument("--kv-heads", type=int, metavar="N",
                   help="the model's KV heads (num_key_value_heads): decode attention calls the "
                   "trace records on a repeated KV cache (kv_heads = heads: transformers' "
                   "repeat_kv before SDPA, compiled or before ~5.2) are read as the grouped call "
                   "tuner.serving runs on the cache itself, so a search can tune head stacking")


def topk_flag(p) -> None:
    p.add_argument("--topk", type=int, metavar="K",
                   help="the model's experts per token (num_experts_per_tok): each MoE block of "
                   "transformers' grouped-mm experts (its default from 5.0: two aten::_grouped_mm "
                   "calls of m * K rows, no MoE op) is read as one moe row of m = rows / K "
                   "(docs/harvest.md)")


def gated_mlp_flag(p) -> None:
    p.add_argument("--gated-mlp", action="store_true",
                   help="read each decoder layer's gate, up and down projections (two calls of "
                   "[m, inter] from [m, hidden] and one back, a layer) as one dense gated-MLP "
                   "call of the moe family (experts 1, top-k 1), which tuner.serving runs as one "
                   "fused gate/up + SiLU·mul launch and a down launch (docs/harvest.md)")


def baseline_flag(p) -> None:
    p.add_argument("--baseline", choices=("eager", "compile", "max-autotune"), default=None,
                   help="what rank times each candidate against: eager (torch as written; the "
                   "default), compile (torch.compile, as vLLM, SGLang or a compiled transformers "
                   "model runs the path it replaces) or max-autotune (torch.compile "
                   "mode=max-autotune: the kernel Inductor's autotuning picks for that exact "
                   "shape, Triton template or cuBLAS; for attention the fastest SDPA on the "
                   "grouped cache). The verdict names the baseline kernel. Parity still compares "
                   "with the eager path's output")
    p.add_argument("--compiled-baseline", action="store_true",
                   help="the same as --baseline compile (kept for older scripts)")


def step_baseline_of(args) -> str:
    """The rank baseline the flags name ('' = eager); --compiled-baseline is --baseline compile."""
    from ..errors import TunerError

    if args.compiled_baseline and args.baseline not in (None, "compile"):
        raise TunerError("--compiled-baseline is --baseline compile: give one of the two")
    return args.baseline or ("compile" if args.compiled_baseline else "")


def min_saving_flag(p, what: str) -> None:
    p.add_argument("--min-saving", metavar="THRESHOLD", default="0.5%",
                   help=f"{what}: a share of the step (0.5%%) or a time per token (40us, 0.04ms); "
                   "default 0.5%%")


def storage_flag(p) -> None:
    p.add_argument("--storage", metavar="URL",
                   help="Optuna storage: sqlite:///path.db or postgresql://user:pass@host/db (shared "
                   f"between hosts); a plain path is a SQLite file; default {DEFAULT_STORAGE_TEXT}")


def parity_flags(p, what: str = "which candidates keep output parity") -> None:
    from ..parity import ALIASES, DEFAULT_GATE, DEFAULT_MARGIN, GATE_HELP, GATES

    p.add_argument("--parity", choices=(*GATES, *ALIASES), default=DEFAULT_GATE, metavar="GATE",
                   help=f"{what}: {GATE_HELP}; default {DEFAULT_GATE}")
    p.add_argument("--parity-margin", type=float, default=DEFAULT_MARGIN, metavar="X",
                   help="the accuracy gate's bar: error at most X times the serving path's own "
                   f"(default {DEFAULT_MARGIN:g})")


def timeout_flag(p, what: str, default: str | None) -> None:
    p.add_argument("--timeout", metavar="DURATION", default=default,
                   help=f"{what}: 8h, 90m, 30s, 1h30m, or a bare number of seconds"
                   + (f"; default {default}" if default else ""))
