"""Graph safety on the GPU: every family's kernels through tuner.serving, captured in a CUDA/HIP
graph and replayed many times, against the same model run eagerly (marker `gpu`).

Includes the batch-32 gemm set that once crashed the replay of a captured decode step with a
segmentation fault (one config with TMA=1 and SPLIT_K=2, others TMA=0 with SPLIT_K 1 and 8).
Each case runs in a child process, so a segfault fails the test instead of killing pytest.
Run on a GPU machine with: TRITON_INTERPRET=0 python3 -m pytest -m gpu tests/test_serving_gpu.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parent.parent

# Qwen3-8B-shaped decode linears (in -> out), the one crashing set of batch-32 configs
LINEARS = [(4096, 4096), (4096, 12288), (12288, 4096), (4096, 1024)]  # chained: out -> next in
GEMM_CONFIGS = [
    {"BLOCK_M": 32, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 1, "SPLIT_K": 2, "TMA": 1,
     "SWAP_AB": 0, "num_warps": 4, "num_stages": 4, "BALANCE_N": 0, "SCHEDULE": 0, "REDUCE_LAST": 0},
    {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 1, "SPLIT_K": 1, "TMA": 0,
     "SWAP_AB": 0, "num_warps": 4, "num_stages": 4, "BALANCE_N": 0, "SCHEDULE": 0, "REDUCE_LAST": 0},
    {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 1, "SPLIT_K": 8, "TMA": 0,
     "SWAP_AB": 0, "num_warps": 4, "num_stages": 3, "BALANCE_N": 0, "SCHEDULE": 0, "REDUCE_LAST": 0},
    {"BLOCK_M": 32, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 1, "SPLIT_K": 1, "TMA": 1,
     "SWAP_AB": 1, "num_warps": 4, "num_stages": 4, "BALANCE_N": 1, "SCHEDULE": 0, "REDUCE_LAST": 0},  # skinny, balanced rows
]
# K splits summed by each tile's last split in the same launch (REDUCE_LAST), one per kernel:
# the tiled pointer and descriptor kernels, the skinny descriptor and pointer kernels (m = 128)
REDUCE_LAST_CONFIGS = [
    {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 1, "SPLIT_K": 4, "TMA": tma,
     "SWAP_AB": swap, "num_warps": 4, "num_stages": 4, "BALANCE_N": 0, "SCHEDULE": 0,
     "REDUCE_LAST": 1} for swap, tma in ((0, 0), (0, 1), (1, 1), (1, 0))]
# the gemv skinny kernel with balanced rows (m = 2..8)
GEMV_BALANCED = {"ROWS_PER_BLOCK": 128, "BLOCK_K": 128, "SPLIT_K": 1, "num_warps": 4,
                 "num_stages": 4, "USE_DOT": 2, "BALANCE_N": 1}

CHILD = r'''
import json, sys, torch
sys.path.insert(0, sys.argv[1] + "/tests")
from torch import nn
from tuner import runtime, serving
from test_serving import write_export
req = json.loads(sys.argv[2])
ident = runtime.current_identity()
torch.manual_seed(0)
layers = [nn.Linear(i, o, bias=False) for i, o in req["linears"]]
model = nn.Sequential(*layers).to("cuda", torch.bfloat16).eval().requires_grad_(False)
entries = []
for (i, o), config in zip(req["linears"], req["configs"]):
    shape = {"m": req["m"], "n": o, "k": i, "dtype": "bfloat16"}
    if req["family"] == "gemm":
        shape["layout"] = "NT"
    entries.append([req["family"], shape] + ([config] if config else []))
write_export(req["root"], entries, identity=ident)
x = torch.randn(req["m"], req["linears"][0][0], device="cuda", dtype=torch.bfloat16)
x_new = torch.randn_like(x)
with torch.no_grad():
    eager = model(x)
    with serving.installed(model, export_dir=req["root"] + "/" + ident["key"]) as handle:
        tuned_eager = model(x)
        tuned_new = model(x_new)
        handle.warmup(lambda: model(x))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(x)
        hits = handle.hits()
    for _ in range(req["replays"]):
        graph.replay()
    torch.cuda.synchronize()
    same = bool(torch.equal(out, tuned_eager))
    x.copy_(x_new)  # a replay on new data must compute it (not leave the last output standing)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
err = float((out.float() - model(x_new).float()).norm() / model(x_new).float().norm())
print(json.dumps({"hits": hits, "rel_err": err, "bitwise_graph_vs_eager": same,
                  "bitwise_new_input": bool(torch.equal(out, tuned_new))}))
'''


def run_case(tmp_path, family: str, m: int, configs: list) -> dict:
    request = {"root": str(tmp_path / "export"), "family": family, "m": m,
               "linears": LINEARS[:len(configs)], "configs": configs, "replays": 200}
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), json.dumps(request)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, f"replay child died ({proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


# a small Llama (8 query heads on 2 KV heads, 2 layers) for the transformers children
SMALL_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
               "intermediate_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2,
               "num_hidden_layers": 2, "vocab_size": 1024, "max_position_embeddings": 256,
               "rms_norm_eps": 1e-5, "head_dim": 64}


def run_llama_child(child: str, tmp_path) -> dict:
    """Run `child` (argv: repository, export root, SMALL_LLAMA's config file; `capture_decode`
    defined) compiled, in its own process; its JSON result (skips where the child says so)."""
    path = tmp_path / "llama.json"
    path.write_text(json.dumps(SMALL_LLAMA))
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", CAPTURE_DECODE + child, str(ROOT), str(tmp_path / "e"),
                           str(path)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in result:
        pytest.skip(result["skip"])
    return result


def _gpu_or_skip():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA or ROCm GPU")
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("run the GPU tests compiled: TRITON_INTERPRET=0 python3 -m pytest -m gpu")


def test_the_batch_32_gemm_set_captures_and_replays(tmp_path):
    _gpu_or_skip()
    result = run_case(tmp_path, "gemm", 32, GEMM_CONFIGS)
    # every exported entry served its linear (eagerly, in the warm-up and in the capture)
    assert len(result["hits"]["gemm"]) == len(GEMM_CONFIGS), result
    assert result["bitwise_graph_vs_eager"], result  # the replay computes what eager did
    assert result["bitwise_new_input"] and result["rel_err"] < 2e-2, result


def test_k_splits_summed_in_one_launch_capture_and_replay(tmp_path):
    """REDUCE_LAST's arrival counts are zeroed inside the graph with each launch: 200 replays and a
    replay on new data compute what eager did, bit for bit."""
    _gpu_or_skip()
    result = run_case(tmp_path, "gemm", 128, REDUCE_LAST_CONFIGS)
    assert len(result["hits"]["gemm"]) == len(REDUCE_LAST_CONFIGS), result
    assert result["bitwise_graph_vs_eager"], result
    assert result["bitwise_new_input"] and result["rel_err"] < 2e-2, result


@pytest.mark.parametrize("m", [1, 4, 8])
def test_gemv_captures_and_replays(tmp_path, m):
    _gpu_or_skip()
    result = run_case(tmp_path, "gemv", m, [None] * len(LINEARS))
    assert len(result["hits"]["gemv"]) == len(LINEARS), result
    assert result["bitwise_graph_vs_eager"] and result["bitwise_new_input"], result
    assert result["rel_err"] < 2e-2, result


def test_gemv_balanced_skinny_captures_and_replays(tmp_path):
    _gpu_or_skip()
    result = run_case(tmp_path, "gemv", 4, [GEMV_BALANCED] * len(LINEARS))
    assert len(result["hits"]["gemv"]) == len(LINEARS), result
    assert result["bitwise_graph_vs_eager"] and result["bitwise_new_input"], result
    assert result["rel_err"] < 2e-2, result


ATTENTION_CHILD = r'''
import json, sys, torch
sys.path.insert(0, sys.argv[1] + "/tests")
import torch.nn.functional as F
from torch import nn
from tuner import runtime, serving
from test_serving import write_export
req = json.loads(sys.argv[3])
b, h, kvh, n = req["batch"], req["heads"], req["kv_heads"], req["kv_len"]
ident = runtime.current_identity()
shape = {"batch": b, "heads": h, "kv_heads": kvh, "kv_len": n, "head_dim": 128, "dtype": "bfloat16"}
write_export(sys.argv[2], [["attention", shape]], identity=ident)
q = torch.randn(b, h, 1, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(b, kvh, n, 128, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
kw = {"enable_gqa": kvh != h}
if req["masked"]:  # a static KV cache: positions past each sequence's length are masked
    lengths = torch.arange(b, device="cuda") % (n // 2) + n // 2
    mask = (torch.arange(n, device="cuda")[None, :] < lengths[:, None])[:, None, None, :]
    kw.update(attn_mask=mask, scale=128 ** -0.5)
model = nn.Identity()
eager = F.scaled_dot_product_attention(q, k, v, **kw)
with serving.installed(model, export_dir=sys.argv[2] + "/" + ident["key"], families=("attention",)) as hd:
    step = lambda: F.scaled_dot_product_attention(q, k, v, **kw)
    hd.warmup(step)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    hits = hd.hits()
for _ in range(200):
    graph.replay()
torch.cuda.synchronize()
result = {"hits": hits, "rel_err": float((out.float() - eager.float()).norm() / eager.float().norm())}
if req["masked"]:  # the next step: one more position valid in place, replayed, against eager SDPA
    kw["attn_mask"][:, :, :, : n - 1] = True
    graph.replay()
    torch.cuda.synchronize()
    fresh = F.scaled_dot_product_attention(q, k, v, **kw)
    result["rel_err_next"] = float((out.float() - fresh.float()).norm() / fresh.float().norm())
print(json.dumps(result))
'''


@pytest.mark.parametrize("case", [
    {"batch": 8, "heads": 32, "kv_heads": 8, "kv_len": 4096, "masked": False},
    # transformers over a StaticCache (tuner ab): KV repeated to 32 heads, a bool mask, a scale
    {"batch": 32, "heads": 32, "kv_heads": 32, "kv_len": 162, "masked": True},
], ids=["gqa", "static_cache_mask"])
def test_decode_attention_captures_and_replays(tmp_path, case):
    _gpu_or_skip()
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", ATTENTION_CHILD, str(ROOT), str(tmp_path / "e"),
                           json.dumps(case)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(result["hits"]["attention"]) == 1 and result["rel_err"] < 2e-2, result
    if case["masked"]:
        assert result["rel_err_next"] < 2e-2, result


# what the transformers children share: the imports, their argv (repository, export root,
# config), a skip without a device identity, and the capture of a harness's decode step as tuner
# ab captures it (two warm-ups on a side stream, then the capture: the graph and its output)
CAPTURE_DECODE = r'''
import json, sys, torch
sys.path.insert(0, sys.argv[1] + "/tests")
from tuner import runtime, serving
from tuner.ab.harness import hf_factory, make_harness
from test_serving import write_export
root, config_path = sys.argv[2], sys.argv[3]
ident = runtime.current_identity()
if not ident:
    print(json.dumps({"skip": "no device identity"}))
    sys.exit(0)


def capture_decode(h):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            h.prefill()
            h.decode()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    h.prefill()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = h.decode()
    return graph, out
'''

HF_CHILD = r'''
h = make_harness(hf_factory(config_path), batch=4, prompt=16, steps=8, dtype=torch.bfloat16,
                 device="cuda")
with torch.no_grad():
    h.prefill()
    with serving.installed(h.model, export_dir=root + "/" + ident["key"], families=("attention",)) as hd:
        h.decode()  # no export yet: the misses name the grouped call
        miss = [dict(kv.split("=") for kv in m.split(",")) for m in hd.misses()["attention"]]
    grouped = min(({k: v if k == "dtype" else int(v) for k, v in m.items()} for m in miss),
                  key=lambda m: m["kv_heads"])
    repeated = dict(grouped, kv_heads=grouped["heads"])  # what a baseline trace records
    write_export(root, [("attention", repeated, {"HEADS_PER_BLOCK": 1, "BLOCK_N": 32,
                                                 "SPLIT_KV": 1, "num_warps": 4, "num_stages": 2})],
                 identity=ident)
    runtime.reset()
    h.prefill()
    baseline = h.decode().clone()
    h.prefill()
    with serving.installed(h.model, export_dir=root + "/" + ident["key"], families=("attention",)) as hd:
        hd.warmup(h.decode)
        h.prefill()
        tuned_eager = h.decode().clone()
        graph, out = capture_decode(h)
        hits = hd.hits()
    warned_capture = [w for w in serving._warned if w and w[0] == "capture"]
    h.prefill()
    for _ in range(50):
        graph.replay()
    torch.cuda.synchronize()
    h.prefill()
    out.fill_(float("nan"))  # the last replay must compute its output again
    graph.replay()
    torch.cuda.synchronize()
err = float((out.float() - baseline.float()).norm() / baseline.float().norm())
print(json.dumps({"grouped": grouped, "hits": hits, "rel_err": err,
                  "warned_capture": len(warned_capture),
                  "bitwise_graph_vs_eager": bool(torch.equal(out, tuned_eager))}))
'''


def test_a_transformers_decode_step_on_the_grouped_cache_captures_and_replays(tmp_path):
    """transformers' attention taken by tuner.serving (decode on the grouped static cache, the
    repeated-KV entry), in a captured decode step replayed 50 times: the replay equals the
    tuned eager step bit for bit and the baseline step within bf16 rounding."""
    _gpu_or_skip()
    pytest.importorskip("transformers")
    result = run_llama_child(HF_CHILD, tmp_path)
    assert result["grouped"]["kv_heads"] == 2 and result["grouped"]["heads"] == 8, result
    # 2 layers x (warm-up, eager, 2 side-stream warm-ups, capture): every call on the kernel
    assert sum(result["hits"]["attention"].values()) == 10 and not result["warned_capture"], result
    assert result["bitwise_graph_vs_eager"] and result["rel_err"] < 2e-2, result


# both fold children: a small Llama's harness, every linear shape of its decode step exported
# with the one-row config (from the misses of an install without an export), the baseline step
EXPORT_ONE_ROW = r'''
one_row = {"ROWS_PER_BLOCK": 1, "BLOCK_K": 512, "SPLIT_K": 1, "num_warps": 2, "USE_DOT": 0,
           "num_stages": 1, "BALANCE_N": 0}
h = make_harness(hf_factory(config_path), batch=1, prompt=16, steps=8, dtype=torch.bfloat16,
                 device="cuda")
torch.set_grad_enabled(False)
h.prefill()
with serving.installed(h.model, export_dir=root + "/" + ident["key"], families=("gemv",)) as hd:
    h.decode()  # no export yet: the misses name every linear shape
    keys = list(hd.misses()["gemv"])
shapes = [{k: v if k == "dtype" else int(v) for k, v in (kv.split("=") for kv in key.split(","))}
          for key in keys]
write_export(root, [("gemv", s, one_row) for s in shapes], identity=ident)
runtime.reset()
h.prefill()
baseline = h.decode().clone()
'''


FOLD_CHILD = EXPORT_ONE_ROW + r'''
with torch.no_grad():
    h.prefill()
    with serving.installed(h.model, export_dir=root + "/" + ident["key"], families=("gemv",),
                           fold_norms=False):
        unfolded = h.decode().clone()
    h.prefill()
    with serving.installed(h.model, export_dir=root + "/" + ident["key"], families=("gemv",),
                           fold_norms=True) as hd:
        folded = len(hd.norms)
        hd.warmup(h.decode)
        h.prefill()
        tuned_eager = h.decode().clone()
        graph, out = capture_decode(h)
        hits = hd.hits()
    warned = [w for w in serving._warned if w and w[0] in ("capture", "launch")]
    h.prefill()
    for _ in range(50):
        graph.replay()
    torch.cuda.synchronize()
    h.prefill()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())
print(json.dumps({"folded": folded, "hits": sum(hits["gemv"].values()), "warned": len(warned),
                  "rel_err": rel(out, baseline), "rel_err_unfolded": rel(unfolded, baseline),
                  "bitwise_graph_vs_eager": bool(torch.equal(out, tuned_eager))}))
'''


FOLD_COMPILED_CHILD = EXPORT_ONE_ROW + r'''
from tuner import serving_fusion
from tuner.baselines import compile_step
import torch._inductor.config as inductor_config
inductor_config.force_disable_caches = True  # a graph from the cache runs no pass to count
counted = []
fuse = serving_fusion.fuse_residual_adds
serving_fusion.fuse_residual_adds = lambda graph: counted.append(fuse(graph)) or counted[-1]
with torch.no_grad():
    h.decode = compile_step(h.decode, "compile", "inductor")
    with serving.installed(h.model, export_dir=root + "/" + ident["key"], families=("gemv",),
                           fold_norms=True) as hd:
        folded = len(hd.norms)
        h.prefill()
        hd.warmup(h.decode)
        h.prefill()
        compiled_eager = h.decode().clone()
        graph, out = capture_decode(h)
    warned = [w for w in serving._warned if w and w[0] in ("capture", "launch")]
    h.prefill()
    out.fill_(float("nan"))
    for _ in range(20):
        graph.replay()
    torch.cuda.synchronize()
print(json.dumps({"folded": folded, "fused": max(counted, default=0), "warned": len(warned),
                  "rel_err": float((out.float() - baseline.float()).norm() / baseline.float().norm()),
                  "bitwise_graph_vs_compiled": bool(torch.equal(out, compiled_eager))}))
'''


def test_a_compiled_folded_step_adds_its_residuals_in_the_kernels_and_replays(tmp_path):
    """Under Inductor with the norms folded, the step's residual adds after the tuned o / down
    projections go into their kernels (two a layer, in each graph Inductor compiles), and the
    compiled step captures and replays: the replay equals the compiled step bit for bit and the
    baseline within bf16."""
    _gpu_or_skip()
    pytest.importorskip("transformers")
    result = run_llama_child(FOLD_COMPILED_CHILD, tmp_path)
    assert result["folded"] == 4 and result["fused"] == 4 and not result["warned"], result
    assert result["bitwise_graph_vs_compiled"] and result["rel_err"] < 2e-2, result


def test_a_folded_decode_step_captures_and_replays(tmp_path):
    """Every decoder-layer RMSNorm of a small Llama folded into its projections (the gemv kernel
    carrying the norm), a decode step captured and replayed 50 times: the replay equals the
    folded eager step bit for bit and the baseline step as closely as the unfolded tuned one."""
    _gpu_or_skip()
    pytest.importorskip("transformers")
    result = run_llama_child(FOLD_CHILD, tmp_path)
    assert result["folded"] == 4 and not result["warned"], result  # 2 layers x 2 norms
    assert result["bitwise_graph_vs_eager"], result
    assert result["rel_err"] < max(2e-2, 1.5 * result["rel_err_unfolded"]), result
