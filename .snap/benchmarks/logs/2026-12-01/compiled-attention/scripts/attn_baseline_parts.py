"""Where rank's attention baseline for a regrouped call spends its time (session 18 probe).

Rank measured 125.8 us a call for the grouped Qwen3-8B / Llama-3.1-8B batch-32 decode call
(repeat the KV cache as transformers' repeat_kv does, then SDPA: kernels.attention.baseline with
baseline_kv_heads), and projected a saving about 2x what the compiled step then saved. In that
step's trace SDPA took about 44 us a call and Inductor's fused copies about 28 us. This times the
pieces under the project's protocol (tuner.bench.time_callable: CUDA-graph replays, cold L2,
medians of groups) on the same shape:

  rank       kernels.attention.baseline (eager expand + reshape, SDPA, no mask): rank's figure
  +mask      the same with the served call's boolean mask (a static cache's)
  repeat     the two expand + reshape copies alone
  sdpa       SDPA alone on an already repeated (contiguous) cache, no mask / +mask
  compiled   torch.compile of the masked baseline (Inductor: the copies fused, as in the step)
  tuned      the grouped kernel's config that the exports serve (HEADS_PER_BLOCK 4, BLOCK_N 64)

  PYTHONPATH=$PWD python3 scripts/gpu/attn_baseline_parts.py       (GPU; prints a table last)
"""

from __future__ import annotations

import sys

import torch

from kernels import attention
from tuner import bench

SHAPE = {"batch": 32, "heads": 32, "kv_heads": 8, "kv_len": 162, "head_dim": 128,
         "dtype": "bfloat16", "baseline_kv_heads": 32}
TUNED = {"BLOCK_N": 64, "HEADS_PER_BLOCK": 4, "SPLIT_KV": 1, "num_stages": 3, "num_warps": 4}
PADDED = 6  # cache slots past the current position: masked out, as a static cache's are


def repeat(t: torch.Tensor, heads: int) -> torch.Tensor:
    b, kv_heads, n, d = t.shape
    return t[:, :, None].expand(b, kv_heads, heads // kv_heads, n, d).reshape(b, heads, n, d)


def main() -> int:
    if not torch.cuda.is_available():
        print("attn_baseline_parts.py needs a CUDA GPU")
        return 1
    sets = bench.make_input_sets(attention.FAMILY, SHAPE, "cold", torch.device("cuda"))
    mask = torch.ones(SHAPE["batch"], 1, SHAPE["kv_len"], dtype=torch.bool, device="cuda")
    mask[:, :, -PADDED:] = False
    masked = [dict(s, mask=mask) for s in sets]
    repeated = [dict(s, k=repeat(s["k"], 32).contiguous(), v=repeat(s["v"], 32).contiguous())
                for s in sets]
    repeated_masked = [dict(s, mask=mask) for s in repeated]
    for s in repeated + repeated_masked:
        s.pop("baseline_kv_heads", None)

    def copies(inputs):
        return repeat(inputs["k"], 32), repeat(inputs["v"], 32)

    compiled = torch.compile(attention.baseline, dynamic=False)
    variants = [
        ("rank", attention.baseline, sets),
        ("+mask", attention.baseline, masked),
        ("repeat", copies, sets),
        ("sdpa", attention.baseline, repeated),
        ("sdpa+mask", attention.baseline, repeated_masked),
        ("compiled+mask", compiled, masked),
        ("tuned", lambda inputs: attention.launch(inputs, TUNED), sets),
        ("tuned+mask", lambda inputs: attention.launch(inputs, TUNED), masked),
    ]
    rows = []
    for name, fn, inputs in variants:
        try:
            first = bench.time_callable(fn, inputs, groups=7, replays=5)
            again = bench.time_callable(fn, inputs, groups=7, replays=5)
            rows.append((name, first.median_us, again.median_us, first.spread_pct))
        except Exception as exc:  # noqa: BLE001 - one failed variant must not hide the others
            rows.append((name, float("nan"), float("nan"), float("nan")))
            print(f"{name}: failed: {type(exc).__name__}: {str(exc)[:200]}")
    mb = (sets[0]["k"].numel() + sets[0]["v"].numel()) * sets[0]["k"].element_size()
    print(f"shape {SHAPE}, {len(sets)} cold input sets, K+V {mb / 1e6:.1f} MB a set, "
          f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print(f"{'variant':<14} {'us':>8} {'again':>8} {'spread%':>8}")
    for name, us, again, spread in rows:
        print(f"{name:<14} {us:8.2f} {again:8.2f} {spread:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
