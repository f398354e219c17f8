"""Graph safety of the moe family on the GPU (marker `gpu`): the whole launch (the align step's
torch ops and the three Triton kernels) captured in a CUDA/HIP graph and replayed on new inputs
copied into the captured buffers gives the bytes an eager launch gives, every replay.
Run with: TRITON_INTERPRET=0 python3 -m pytest -m gpu tests/test_moe_gpu.py"""

import pytest
import torch

from kernels import moe

SHAPES = [{"m": 1, "experts": 128, "topk": 8, "hidden": 2048, "inter": 768, "dtype": "bfloat16"},
          {"m": 32, "experts": 128, "topk": 8, "hidden": 2048, "inter": 768, "dtype": "bfloat16"}]


@pytest.mark.gpu
@pytest.mark.parametrize("split_k", [1, 2])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"m{s['m']}")
def test_a_captured_launch_replays_the_eager_bytes_on_new_routing(shape, split_k):
    config = {**moe.default_config(shape, "hip" if torch.version.hip else "cuda"),
              "SPLIT_K": split_k}
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
