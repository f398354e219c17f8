"""Graph safety of the moe family on the GPU (marker `gpu`): the whole launch (the align kernel
and the three GEMM and reduce kernels, or the GEMV path's two) captured in a CUDA/HIP graph and replayed on new inputs
copied into the captured buffers gives the bytes an eager launch gives, every replay; the align
kernel gives the bytes of `align`'s torch ops.
Run with: TRITON_INTERPRET=0 python3 -m pytest -m gpu tests/test_moe_gpu.py"""

import pytest
import torch

from tuner.spaces import space_for
from tuner_kernels import moe

SHAPES = [{"m": 1, "experts": 128, "topk": 8, "hidden": 2048, "inter": 768, "dtype": "bfloat16"},
          {"m": 32, "experts": 128, "topk": 8, "hidden": 2048, "inter": 768, "dtype": "bfloat16"}]


# the GEMV path: two launches (no align, no reduce), the plain loop and cp.async stages (the
# down program's 3 stages of 8 experts' 16 x 128 W and act tiles: 131072 bytes, within sm90's)
GEMV = [{"GEMV": 1, "BLOCK_SIZE_N": 8, "BLOCK_SIZE_K": 512, "num_stages": 1},
        {"GEMV": 1, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 128, "num_stages": 3}]


@pytest.mark.gpu
@pytest.mark.parametrize("change", [{}, {"SPLIT_K": 2}, {"SPLIT_K": 2, "SPLIT_K_UP": 4}] + GEMV,
                         ids=["mma", "split-k", "split-up", "gemv", "gemv-stages"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"m{s['m']}")
def test_a_captured_launch_replays_the_eager_bytes_on_new_routing(shape, change):
    backend = "hip" if torch.version.hip else "cuda"
    config = {**moe.default_config(shape, backend), **change}
    assert space_for("moe", backend).allows(config, shape), "a config the space keeps"
    static = moe.make_inputs(shape, "cuda", seed=0)
    out = torch.empty(shape["m"], shape["hidden"], dtype=torch.bfloat16, device="cuda")
    moe.launch(static, config, out=out)  # compiles before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        moe.launch(static, config, out=out)
    for seed in (1, 2, 3):
        fresh = moe.make_inputs(shape, "cuda", seed=seed)
        for name in ("x", "topk_ids", "topk_weights"):
            static[name].copy_(fresh[name])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        eager = moe.launch(static, config)   # the captured weights, the new routing
        assert torch.equal(out, eager), f"seed {seed}: the replay differs from an eager launch"
        ref = moe.reference(static)
        assert ((out.float() - ref).norm() / ref.norm()).item() < 8e-3


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8, 64, 512])
def test_the_align_kernel_gives_the_torch_align_bytes_on_the_gpu(m):
    """moe_align_kernel on the GPU (its barrier between the sentinel fill and the scatter is a
    GPU matter; the interpreter runs one thread) against `align`'s torch ops, int64 ids as
    transformers' router gives them; 512 tokens (4096 pairs) is the kernel's reach."""
    experts, topk, block_m = 128, 8, 16
    ids = torch.rand(m, experts, device="cuda").topk(topk, dim=-1).indices
    pairs = ids.numel()
    slots = moe.max_padded(pairs, experts, block_m)
    got = (torch.full((slots,), -7, dtype=torch.int32, device="cuda"),
           torch.full((slots // block_m,), -7, dtype=torch.int32, device="cuda"),
           torch.full((1,), -7, dtype=torch.int32, device="cuda"))
    moe.moe_align_kernel[(1,)](ids.contiguous().view(-1), *got, pairs, experts, slots,
                               slots // block_m, BLOCK_SIZE_M=block_m, E_BLOCK=experts,
                               CHUNK=moe.align_chunk(experts))
    for name, want, have in zip(("sorted_ids", "expert_ids", "total"),
                                moe.align(ids, experts, block_m), got):
        assert torch.equal(want.to(torch.int32), have), name
