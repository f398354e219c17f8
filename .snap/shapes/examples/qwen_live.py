"""A Qwen2.5-0.5B-shaped model for `tuner harvest --live` (random bf16 weights, no download).

Built from transformers' Qwen2Config with the numbers of qwen25_05b_b4_decode.meta.json: hidden 896,
intermediate 4864, 24 layers, 14 query heads, 2 KV heads, vocab 151936, tied embeddings. Batch 4,
prompt 128 tokens. `QwenDecode` is instantiated once (model built and warmed up outside the
profiler); its first call is the prefill, each later call decodes one token with the KV cache.
Calls are wrapped in "prefill" / "decode" record_function ranges, as a serving loop would mark them.

    tuner harvest --live shapes/examples/qwen_live.py:QwenDecode --steps 8 \
        --save-trace shapes/examples/qwen25_05b_b4_live.pt.trace.json.gz \
        -o shapes/examples/qwen25_05b_b4_live.parquet

It is also a `tuner ab` harness (docs/ab.md): `model`, `prefill()`, `decode()` (one step over a
static KV cache, capturable as a graph) and `feed(tokens)`:

    tuner ab shapes/examples/qwen_live.py:QwenDecode --batch 4

Needs `transformers` (not a dependency of this project). On a machine without a GPU it runs on
the CPU in float32; TUNER_QWEN_TINY=1 shrinks the model (2 layers, hidden 64) for a quick check.
"""

from __future__ import annotations

import inspect
import os

import torch

BATCH = 4
PROMPT = 128
QWEN25_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                  num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=True,
                  hidden_act="silu", use_cache=True)
TINY = dict(QWEN25_05B, vocab_size=1024, hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def build_model(device: torch.device, dtype: torch.dtype, tiny: bool = False, seed: int = 0):
    """Random weights from `seed`, made in fp32 and then cast: every dtype gets the same ones."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**(TINY if tiny else QWEN25_05B))
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    return model.to(dtype=dtype).eval().requires_grad_(False), config


class QwenDecode:
    """First call: prefill of BATCH x PROMPT tokens; every later call: one greedy decode step."""

    def __init__(self, batch: int = BATCH, prompt: int = PROMPT, steps: int = 32,
                 dtype: torch.dtype | None = None, device=None, seed: int = 0):
        cuda = torch.cuda.is_available()
        self.device = torch.device(device or ("cuda" if cuda else "cpu"))
        dtype = dtype or (torch.bfloat16 if cuda else torch.float32)
        tiny = os.environ.get("TUNER_QWEN_TINY") == "1"
        self.model, self.config = build_model(self.device, dtype, tiny, seed)
        self._static = None  # the `tuner ab` harness over a static cache, made when first used
        self._static_args = dict(batch=batch, prompt=prompt, steps=steps, seed=seed)
        # newer transformers call the KV cache argument `cache` (older: `past_key_values`)
        params = inspect.signature(self.model.forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"
        g = torch.Generator(device="cpu").manual_seed(1)
        self.prompt = torch.randint(0, self.config.vocab_size, (batch, prompt), generator=g)
        self.prompt = self.prompt.to(self.device)
        # warm up (cuBLAS/cuDNN handles, kernel selection) outside the profiled calls
        self.reset()
        for _ in range(3):
            self()
        self.reset()

    # ------------------------------------------------------------ the `tuner ab` harness
    def _harness(self):
        if self._static is None:
            from tuner.ab.harness import HFDecode

            self._static = HFDecode(self.model, **self._static_args)
        return self._static

    def prefill(self) -> torch.Tensor:
        return self._harness().prefill()

    def decode(self) -> torch.Tensor:
        return self._harness().decode()

    def feed(self, tokens: torch.Tensor) -> None:
        self._harness().feed(tokens)

    def reset(self) -> None:
        self.cache = None
        self.next_tokens = None
        self.position = 0

    @torch.no_grad()
    def __call__(self):
        if self.cache is None:
            with torch.profiler.record_function("prefill"):
                out = self.model(input_ids=self.prompt, use_cache=True, logits_to_keep=1)
            self.position = self.prompt.shape[1]
        else:
            with torch.profiler.record_function("decode"):
                out = self.model(input_ids=self.next_tokens, use_cache=True,
                                 **{self.cache_arg: self.cache})
            self.position += 1
        self.cache = getattr(out, "cache", None) or out.past_key_values
        self.next_tokens = out.logits[:, -1:, :].argmax(dim=-1)
        return self.next_tokens
