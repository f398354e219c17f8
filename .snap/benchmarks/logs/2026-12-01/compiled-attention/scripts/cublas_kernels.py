"""Which kernels torch's cuBLAS path runs for the 8B decode linears at m = 64, 128, 256.

At m = 128 / 256 our best Triton configs stay below torch (BENCHMARKS.md, session 18). The
kernel names cuBLAS picks say how it gets there (tile shape, cluster shape, split-K or stream-K
kernels, extra reduction kernels). One profiled F.linear per shape, after warm-up; prints the
kernels of each call with their GPU time.

  PYTHONPATH=$PWD python3 scripts/gpu/cublas_kernels.py          (GPU)
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

SHAPES = [(4096, 4096), (1024, 4096), (6144, 4096), (12288, 4096), (14336, 4096),
          (4096, 12288), (4096, 14336), (24576, 4096), (28672, 4096)]


def main() -> int:
    if not torch.cuda.is_available():
        print("cublas_kernels.py needs a CUDA GPU")
        return 1
    from torch.profiler import ProfilerActivity, profile

    lines = []
    for m in (64, 128, 256):
        for n, k in SHAPES:
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            for _ in range(3):
                F.linear(x, w)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                F.linear(x, w)
                torch.cuda.synchronize()
            kernels = [(e.name, getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0))
                       for e in prof.events() if str(e.device_type).endswith("CUDA")]
            text = "; ".join(f"{name} {us:.1f}us" for name, us in kernels)
            lines.append(f"m={m:<4} {n:>6}x{k:<6} {text}")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
