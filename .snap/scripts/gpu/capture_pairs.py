"""CUDA-graph capture + replay trace pairs for tests/test_harvest_graphs.py (on the GPU machine).

    PYTHONPATH=$PWD python3 scripts/gpu/capture_pairs.py --out DIR [--steps 5]

For each small model below it runs the product's own path, `tuner.harvest.live(..., graph=True)`
(what `tuner harvest --live FILE:CLASS --steps N --graph --save-trace DIR` does): three warm-up
calls, one call captured as a CUDA graph under torch.profiler (record_shapes on), then N graph
replays profiled with ProfilerStep#N markers (or a vLLM-style annotation). It writes, flat in DIR:

    <name>_capture.pt.trace.json.gz   the capture (CPU ops with Input Dims, the launches)
    <name>_replay.pt.trace.json.gz    the replays (kernels carrying the graph launch's id)
    <name>.meta.json                  what the test expects (GEMM shapes and calls per step,
                                      the attention shape), as make_synthetic.py writes it
    <name>.parquet                    the table harvest made of the pair, and capture_pairs.log

and checks the table against the meta. Copy the three files of each pair into
tests/fixtures/traces/ and add <name> to CUDA_PAIRS in tests/test_harvest_graphs.py.
Takes well under a minute on an H200 (the models are tiny; each trace < 300 KB gzipped).
Rows it produces in BENCHMARKS.md: none; it writes test fixtures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve()


class _Decoder:
    """A decode step of a small Llama-like decoder with a static KV cache: per layer RMSNorm,
    a fused qkv linear, SDPA over the cache (GQA), o, RMSNorm, a fused gate/up linear, SiLU x
    mul, down; then the final norm and the lm_head. Capture-safe: fixed shapes, no host syncs."""

    batch, layers, hidden, heads, kv_heads, head_dim, ffn, kv_len, vocab = \
        8, 2, 512, 8, 2, 64, 1024, 256, 8192
    bias = False

    def __init__(self):
        if not torch.cuda.is_available():
            raise RuntimeError("needs a CUDA GPU")
        g = torch.Generator(device="cuda").manual_seed(0)
        dt, dev = torch.bfloat16, "cuda"

        def w(*shape):
            return torch.randn(*shape, generator=g, device=dev, dtype=dt) * 0.02

        qkv_n = (self.heads + 2 * self.kv_heads) * self.head_dim
        self.w = [dict(qkv=w(qkv_n, self.hidden), qkv_b=w(qkv_n) if self.bias else None,
                       o=w(self.hidden, self.heads * self.head_dim),
                       gate_up=w(2 * self.ffn, self.hidden), down=w(self.hidden, self.ffn),
                       k=w(self.batch, self.kv_heads, self.kv_len, self.head_dim),
                       v=w(self.batch, self.kv_heads, self.kv_len, self.head_dim))
                  for _ in range(self.layers)]
        self.head = w(self.vocab, self.hidden)
        self.x = torch.randn(self.batch, self.hidden, generator=g, device=dev, dtype=dt)

    @torch.no_grad()
    def __call__(self):
        b, hd = self.batch, self.head_dim
        x = self.x
        for p in self.w:
            h = F.rms_norm(x, (self.hidden,))
            qkv = F.linear(h, p["qkv"], p["qkv_b"])
            q = qkv[:, : self.heads * hd].view(b, self.heads, 1, hd)
            a = F.scaled_dot_product_attention(q, p["k"], p["v"], enable_gqa=True)
            x = x + F.linear(a.reshape(b, self.heads * hd), p["o"])
            gate, up = F.linear(F.rms_norm(x, (self.hidden,)), p["gate_up"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, p["down"])
        return F.linear(F.rms_norm(x, (self.hidden,)), self.head)

    @classmethod
    def meta(cls, steps: int) -> dict:
        qkv_n = (cls.heads + 2 * cls.kv_heads) * cls.head_dim
        m = cls.batch
        return dict(what=f"{cls.__name__}: scripts/gpu/capture_pairs.py on {_device()}",
                    steps=steps, device=_device(),
                    gemms=[[m, qkv_n, cls.hidden, cls.layers],
                           [m, cls.hidden, cls.heads * cls.head_dim, cls.layers],
                           [m, 2 * cls.ffn, cls.hidden, cls.layers],
                           [m, cls.hidden, cls.ffn, cls.layers],
                           [m, cls.vocab, cls.hidden, 1]],
                    attention=dict(batch=m, heads=cls.heads, kv_heads=cls.kv_heads, q_len=1,
                                   kv_len=cls.kv_len, head_dim=cls.head_dim,
                                   calls_per_step=cls.layers))


class DecoderFull(_Decoder):
    """Batch 8, no biases (aten::mm), ProfilerStep#N markers."""


class DecoderFullBiasVllm(_Decoder):
    """Batch 4, 3 layers, a biased qkv (aten::addmm), each replay inside a vLLM-style
    execute_context_0(0)_generation_4(4) annotation."""

    batch, layers = 4, 3
    bias = True
    step_annotation = "execute_context_0(0)_generation_4(4)"


PAIRS = {"h200_decoder_full": DecoderFull, "h200_decoder_full_bias_vllm": DecoderFullBiasVllm}


def _device() -> str:
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"


def capture_pair(name: str, cls, steps: int, out: Path, log) -> bool:
    from tuner import harvest, shapetable

    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        saved = Path(tmp) / "saved"
        result = harvest.live(f"{HERE}:{cls.__name__}", steps, out / f"{name}.parquet",
                              save_trace=saved, graph=True, quiet=True)
        shutil.copy(saved / f"{cls.__name__}.pt.trace.json.gz",
                    out / f"{name}_replay.pt.trace.json.gz")
        shutil.copy(saved / harvest.CAPTURE_DIR / f"{cls.__name__}.pt.trace.json.gz",
                    out / f"{name}_capture.pt.trace.json.gz")
    meta = cls.meta(steps)
    (out / f"{name}.meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    for line in harvest.summarize(result):
        log(line)
    log(harvest.format_table(result.table, 30))
    ok = _check(shapetable.read(out / f"{name}.parquet"), meta, log)
    sizes = ", ".join(f"{p.name} {p.stat().st_size / 1024:.0f} KB"
                      for p in sorted(out.glob(f"{name}_*.gz")))
    log(f"{name}: {'ok' if ok else 'MISMATCH'} in {time.time() - t0:.1f} s ({sizes})")
    return ok


def _check(df, meta: dict, log) -> bool:
    ok = True
    decode = df[df.phase == "decode"]
    for m, n, k, cps in meta["gemms"]:
        rows = decode[(decode.family == "gemm") & (decode.m == m) & (decode.n == n)
                      & (decode.k == k)]
        if len(rows) != 1 or rows.calls_per_step.iloc[0] != cps:
            log(f"  expected one decode GEMM row m={m} n={n} k={k} with {cps} calls per step, "
                f"got {rows[['op', 'calls_per_step']].to_dict('records')}")
            ok = False
    att = decode[decode.family == "attention"]
    want = meta["attention"]
    if len(att) != 1 or any(att[key].iloc[0] != want[key] for key in
                            ("batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim")):
        log(f"  expected one decode attention row {want}, got "
            f"{att[['op', 'batch', 'heads', 'kv_heads', 'q_len', 'kv_len']].to_dict('records')}")
        ok = False
    if set(decode.steps) != {meta["steps"]}:
        log(f"  expected {meta['steps']} decode steps, got {sorted(set(decode.steps))}")
        ok = False
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="directory for the pairs")
    ap.add_argument("--steps", type=int, default=5, help="graph replays to profile (default 5)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    log_file = open(args.out / "capture_pairs.log", "w")

    def log(line: str) -> None:
        print(line, flush=True)
        print(line, file=log_file, flush=True)

    log(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {_device()}")
    if not torch.cuda.is_available():
        log("no GPU visible: nothing captured")
        return 2
    results = {}
    for name, cls in PAIRS.items():
        try:
            results[name] = capture_pair(name, cls, args.steps, args.out, log)
        except Exception as exc:  # noqa: BLE001 - report and go on with the next pair
            log(f"{name}: FAILED: {type(exc).__name__}: {exc}")
            results[name] = False
    log("pairs: " + ", ".join(f"{n} {'ok' if r else 'FAILED'}" for n, r in results.items()))
    log("copy <name>_capture/_replay.pt.trace.json.gz and <name>.meta.json into "
        "tests/fixtures/traces/ and set CUDA_PAIRS in tests/test_harvest_graphs.py to: "
        + json.dumps([n for n, r in results.items() if r]))
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
