"""What `tuner ab` runs: a model's decode step over a static KV cache, and how to get one.

A *harness* is any object with

- ``model``: the torch.nn.Module (tuner.serving.install routes its linears);
- ``prefill() -> logits [batch, vocab]``: reset the static KV cache, prefill the prompt, put the
  first greedy tokens into the static input buffer;
- ``decode() -> logits [batch, vocab]``: one decode step that reads only static buffers (input
  tokens, cache position) and writes its logits into a tensor it returns — capturable as one
  CUDA/HIP graph;
- ``feed(tokens)``: copy the next tokens [batch] into the input buffer and advance the cache
  position by one (outside any graph).

`tuner ab MODULE:CALLABLE` calls CALLABLE with the keyword arguments it accepts among
``batch, prompt, steps, dtype, device, seed`` (a class is instantiated) and uses what it returns;
`tuner ab --hf-config CONFIG.json` builds `HFDecode` from a transformers config with random
weights (no download; transformers is an optional extra). The same factory called with
``dtype=torch.float32`` gives the high-precision reference of the same weights.

`tuner ab --phase prefill|mixed` measures another step of the same transformers model through
the same interface (`phase_harness`): `HFPrefill` (the first forward of a P-token prompt) and
`HFMixed` (the decode batch plus one P-token prefill chunk, the chunked-prefill step).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import sys
from pathlib import Path

import torch

from ..errors import TunerError

__all__ = ["HFDecode", "HFMixed", "HFPrefill", "PHASES", "REQUIRED", "check_harness", "check_spec", "grouped_attention_shape",
           "grouped_sdpa_attention", "hf_factory", "load_factory", "make_harness",
           "phase_harness", "phase_problem", "transformers_attention"]

REQUIRED = ("model", "prefill", "decode", "feed")
FACTORY_ARGS = ("batch", "prompt", "steps", "dtype", "device", "seed")


class HFDecode:
    """A transformers causal LM decoding greedily over a StaticCache (one token per sequence a
    step), with static input buffers, so its decode step captures as one graph."""

    def __init__(self, model, *, batch: int, prompt: int, steps: int, seed: int = 0,
                 vocab_size: int | None = None):
        from transformers import StaticCache

        self.model = model.eval()
        self.batch, self.prompt_len = int(batch), int(prompt)
        device = next(model.parameters()).device
        vocab = int(vocab_size or model.config.vocab_size)
        g = torch.Generator(device="cpu").manual_seed(seed + 1)
        self.prompt = torch.randint(0, vocab, (self.batch, self.prompt_len), generator=g).to(device)
        # room for the prompt, the compared steps and the timed replays (they rewrite one slot)
        self.max_cache_len = self.prompt_len + steps + 2
        self.cache = StaticCache(config=model.config, max_cache_len=self.max_cache_len)
        self.tokens = torch.zeros(self.batch, 1, dtype=torch.long, device=device)
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        # the cache's keyword: `cache` from transformers ~5.2x (`past_key_values` deprecated, to
        # go in 5.40), `past_key_values` before
        params = inspect.signature(type(model).forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"

    @torch.no_grad()
    def prefill(self) -> torch.Tensor:
        self.cache.reset()
        positions = torch.arange(self.prompt_len, device=self.prompt.device)
        out = self.model(input_ids=self.prompt, **{self.cache_arg: self.cache},
                         cache_position=positions, use_cache=True, logits_to_keep=1)
        logits = out.logits[:, -1, :]
        self.tokens.copy_(logits.argmax(-1, keepdim=True))
        self.position.fill_(self.prompt_len)
        return logits

    @torch.no_grad()
    def decode(self) -> torch.Tensor:
        _reset_write_positions(self.cache, self.position)  # slot `position`, every replay
        out = self.model(input_ids=self.tokens, **{self.cache_arg: self.cache},
                         cache_position=self.position, use_cache=True)
        return out.logits[:, -1, :]

    def feed(self, tokens: torch.Tensor) -> None:
        self.tokens.copy_(tokens.view(self.batch, 1))
        self.position.add_(1)


PHASES = ("decode", "prefill", "mixed")


def _reset_write_positions(cache, position: torch.Tensor | int) -> None:
    """transformers >= 5 keeps each layer's write position in a device counter it advances on
    every update: set it to `position` before a step, so every run (and graph replay) of the
    step writes the same slots."""
    for layer in getattr(cache, "layers", ()):
        length = getattr(layer, "cumulative_length", None)
        if isinstance(length, torch.Tensor):
            if isinstance(position, torch.Tensor):
                length.copy_(position.view(()))
            else:
                length.fill_(position)


class HFPrefill:
    """The first forward of a `tokens`-token prompt of `batch` sequences as the step (what a
    server runs when it admits a prompt): `decode()` runs the whole prompt window at cache
    positions 0..tokens-1 over its own StaticCache (static buffers, so it captures as one
    graph and every replay rewrites the same slots) and returns the last position's logits.
    `feed(tokens)` slides the window by one token (drop the first, append the fed one): the
    next step is again the first forward of a prompt of the same length, so outputs of the arms
    and of the fp32 reference are compared step by step as in decode. `prefill()` puts the
    first prompt back and returns its step's logits."""

    def __init__(self, model, *, batch: int, tokens: int, seed: int = 0):
        from transformers import StaticCache

        self.model = model
        self.batch, self.tokens = int(batch), int(tokens)
        device = next(model.parameters()).device
        g = torch.Generator(device="cpu").manual_seed(seed + 2)
        first = torch.randint(0, int(model.config.vocab_size), (self.batch, self.tokens), generator=g)
        self.first = first.to(device)
        self.window = self.first.clone()
        self.positions = torch.arange(self.tokens, device=device)
        self.max_cache_len = self.tokens
        self.cache = StaticCache(config=model.config, max_cache_len=self.tokens)
        params = inspect.signature(type(model).forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"

    @torch.no_grad()
    def prefill(self) -> torch.Tensor:
        self.window.copy_(self.first)
        return self.decode()

    @torch.no_grad()
    def decode(self) -> torch.Tensor:
        _reset_write_positions(self.cache, 0)
        out = self.model(input_ids=self.window, **{self.cache_arg: self.cache},
                         cache_position=self.positions, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :]

    def feed(self, tokens: torch.Tensor) -> None:
        self.window[:, :-1].copy_(self.window[:, 1:].clone())
        self.window[:, -1].copy_(tokens.view(self.batch))


class HFMixed:
    """One chunked-prefill step: the decode batch of `decoder` (an HFDecode: one token per
    sequence over its static cache) and then one prefill chunk of `tokens` tokens of one more
    sequence (an HFPrefill over its own cache), in one step, so one graph. transformers runs
    them as two forwards (linears at m = batch and m = tokens), where a serving engine packs
    them into one (m = batch + tokens). Logits and tokens are [batch + 1, ...]: the decode
    sequences, then the chunk's last position."""

    def __init__(self, decoder: "HFDecode", *, tokens: int, seed: int = 0):
        self.decoder = decoder
        self.model = decoder.model
        self.chunk = HFPrefill(decoder.model, batch=1, tokens=tokens, seed=seed)
        self.batch = decoder.batch + 1

    @torch.no_grad()
    def prefill(self) -> torch.Tensor:
        return torch.cat([self.decoder.prefill(), self.chunk.prefill()])

    @torch.no_grad()
    def decode(self) -> torch.Tensor:
        return torch.cat([self.decoder.decode(), self.chunk.decode()])

    def feed(self, tokens: torch.Tensor) -> None:
        tokens = tokens.view(self.batch)
        self.decoder.feed(tokens[:-1])
        self.chunk.feed(tokens[-1:])


def phase_problem(phase: str, transformers_harness: bool) -> str:
    """Why `--phase` cannot run (not one of PHASES; prefill / mixed without a transformers
    harness, `--hf-config`), or ""."""
    if phase not in PHASES:
        return f"--phase must be one of {', '.join(PHASES)}, not {phase!r}"
    if phase != "decode" and not transformers_harness:
        return (f"--phase {phase} needs --hf-config (a MODULE:CALLABLE harness gives its decode "
                "step only)")
    return ""


def phase_harness(harness, phase: str, tokens: int, seed: int = 0):
    """The harness whose step `tuner ab --phase` measures: `harness` itself for decode; for
    prefill an HFPrefill of `tokens` tokens at the harness's batch size, for mixed an HFMixed
    (its decode batch plus one chunk of `tokens` tokens). Prefill and mixed need a transformers
    harness (`--hf-config`): a MODULE:CALLABLE harness gives a decode step only."""
    if phase == "decode":
        return harness
    problem = phase_problem(phase, isinstance(harness, HFDecode))
    if problem:
        raise TunerError(problem)
    if phase == "prefill":
        return HFPrefill(harness.model, batch=harness.batch, tokens=tokens, seed=seed)
    return HFMixed(harness, tokens=tokens, seed=seed)


def grouped_attention_shape(harness) -> dict | None:
    """The decode attention call of a transformers harness whose model groups its KV heads, as an
    attention-family shape (batch, heads, kv_heads, kv_len = the static cache's length, head_dim,
    dtype); None for any other harness (its attention is its own code) or an ungrouped model."""
    if not isinstance(harness, HFDecode):
        return None
    config = harness.model.config
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or (
        getattr(config, "hidden_size", 0) // heads if heads else None)
    if not (isinstance(heads, int) and isinstance(kv_heads, int) and head_dim) \
            or kv_heads >= heads or heads % kv_heads:
        return None
    dtype = str(next(harness.model.parameters()).dtype).removeprefix("torch.")
    return {"batch": harness.batch, "heads": heads, "kv_heads": kv_heads,
            "kv_len": harness.max_cache_len, "head_dim": int(head_dim), "dtype": dtype}


def grouped_sdpa_attention(own, form):
    """A transformers attention function (its AttentionInterface signature) that runs a decode
    call (one query token, no dropout, grouped KV heads) as SDPA on the grouped cache in `form`
    (tuner.baselines.grouped_sdpa: no repeat_kv copy), and every other call (prefill, an
    ungrouped or unusual call) through `own`, transformers' own function."""
    from ..baselines import grouped_sdpa_op
    from ..layouts import plain_kwargs

    op = grouped_sdpa_op()

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                  is_causal=None, **kwargs):
        batch, heads, rows, head_dim = query.shape
        mask = attention_mask
        if mask is not None and mask.dim() == 4:
            mask = mask[:, :, :, : key.shape[-2]]  # as transformers' SDPA path slices it
        if (rows == 1 and not dropout and key.dim() == 4 and value.shape == key.shape
                and key.shape[1] < heads and heads % key.shape[1] == 0 and plain_kwargs(kwargs)
                and not torch.is_grad_enabled()
                and (mask is None or mask.dim() == 4 and mask.shape[2] == 1
                     and (mask.shape[1] == 1 or form.layout == "gqa"))):
            out = op(query, key, value, mask, None if scaling is None else float(scaling),
                     form.layout, form.backend)
            return out.transpose(1, 2), None  # [batch, 1, heads, head_dim], as transformers'
        return own(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                   is_causal=is_causal, **kwargs)

    return attention


@contextlib.contextmanager
def transformers_attention(make):
    """While inside, transformers' "sdpa" attention function is `make(own)` (own: transformers'
    function); yields False (nothing replaced) where transformers is not imported."""
    utils = sys.modules.get("transformers.modeling_utils")
    mapping = getattr(getattr(utils, "AttentionInterface", None), "_global_mapping", None)
    if not isinstance(mapping, dict) or not callable(mapping.get("sdpa")):
        yield False
        return
    own = mapping["sdpa"]
    mapping["sdpa"] = make(own)
    try:
        yield True
    finally:
        mapping["sdpa"] = own


def _build_hf(config_dict: dict, *, batch: int, prompt: int, steps: int, dtype, device,
              seed: int = 0) -> HFDecode:
    try:
        import transformers
    except ImportError:
        raise TunerError("--hf-config needs transformers: pip install 'kernel-tuner-service[ab]' "
                         "(or pip install transformers)") from None
    config_dict = dict(config_dict)
    model_type = config_dict.pop("model_type", None)
    if not model_type:
        raise TunerError("the transformers config has no model_type (e.g. \"qwen3\", \"llama\")")
    try:
        config = transformers.AutoConfig.for_model(model_type, **config_dict)
    except (ValueError, KeyError, TypeError) as exc:
        raise TunerError(f"transformers cannot build a {model_type!r} config: {exc}") from None
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with torch.device(device):
        # built in fp32 from the seed, then cast: every dtype gets the same weights
        model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    model = model.to(dtype=dtype).eval().requires_grad_(False)
    return HFDecode(model, batch=batch, prompt=prompt, steps=steps, seed=seed)


def hf_factory(path: str | Path):
    """A factory for `make_harness` from a transformers config JSON (random weights)."""
    path = Path(path)
    try:
        config_dict = json.loads(path.read_text())
    except FileNotFoundError:
        raise TunerError(f"--hf-config: file not found: {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TunerError(f"--hf-config: {path} is not a JSON config ({exc})") from None
    if not isinstance(config_dict, dict):
        raise TunerError(f"--hf-config: {path} holds a JSON {type(config_dict).__name__}, "
                         "not a config object")

    def factory(*, batch, prompt, steps, dtype, device, seed=0):
        return _build_hf(config_dict, batch=batch, prompt=prompt, steps=steps, dtype=dtype,
                         device=device, seed=seed)

    factory.__name__ = path.stem
    return factory


def load_factory(target: str):
    """MODULE:CALLABLE or path/to/file.py:CALLABLE -> the callable (not called yet)."""
    from ..harvest import load_callable

    return load_callable(target, instantiate=False, flag="tuner ab")


def check_spec(spec: tuple[str, str]) -> None:
    """What `tuner ab` checks before anything else (before it looks for a GPU): the config file
    reads as a config, or the module imports and has the callable. A TunerError (one line)
    otherwise, whatever the user's module raised while it was imported."""
    kind, value = spec
    if kind == "hf":
        hf_factory(value)
        return
    try:
        load_factory(value)
    except TunerError:
        raise
    except BaseException as exc:  # noqa: BLE001 - the user's module: a SyntaxError, a SystemExit
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise TunerError(f"tuner ab: importing {value.rpartition(':')[0]} failed: "
                         f"{type(exc).__name__}: {exc}") from None


def make_harness(factory, **kwargs):
    """Call the factory with the keyword arguments it accepts; check what it returns."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}
    takes_all = any(p.kind == p.VAR_KEYWORD for p in params.values())
    accepted = {k: v for k, v in kwargs.items() if takes_all or k in params}
    try:
        harness = factory(**accepted)
    except TunerError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's code; --debug shows the traceback
        raise TunerError(f"building the model failed: {type(exc).__name__}: {exc}") from exc
    check_harness(harness)
    return harness


def check_harness(harness) -> None:
    missing = [name for name in REQUIRED if not hasattr(harness, name)]
    if missing:
        raise TunerError(f"the A/B callable returned a {type(harness).__name__} without "
                         f"{', '.join(missing)}: it must give model, prefill(), decode() and "
                         f"feed(tokens) (see docs/ab.md)")
