"""tuner.serving on a small torch model: install / uninstall, the custom ops, the fallbacks.

The export is written by tuner.export from verdicts of recorded numbers (the kernel hashes and
default configs are the real ones); under TRITON_INTERPRET=1 the custom ops run the Triton
kernels on the CPU. The device identity is given (this machine has no GPU).
"""

from __future__ import annotations

import logging
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tuner_kernels import get_family
from tuner import export, rank, runtime, serving, serving_fusion
from tuner.parity import ParityFacts

IDENTITY = {"key": "nvidia-h200", "name": "NVIDIA H200", "arch": "sm90", "backend": "cuda",
            "torch": "2.11.0+cu130", "triton": "3.6.0"}
BATCH, HEADS, KV_HEADS, HEAD_DIM, KV_LEN, HIDDEN = 2, 4, 2, 16, 24, 64
FACTS = ParityFacts(False, True, "a1b2c3d4e5f60718", "a1b2c3d4e5f60718", 1.6e-3, 1.5e-3, 1.07,
                    0, 3)


class TinyDecoder(nn.Module):
    """One attention block of a decoder at decode time: q projection, SDPA over a KV cache with
    GQA, output projection, then an MLP (up with bias, down without)."""

    def __init__(self):
        super().__init__()
        self.q = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=True)
        self.o = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)
        self.up = nn.Linear(HIDDEN, 96, bias=True)
        self.down = nn.Linear(96, HIDDEN, bias=False)

    def forward(self, x, k_cache, v_cache):
        b = x.shape[0]
        q = self.q(x).view(b, 1, HEADS, HEAD_DIM).transpose(1, 2)
        att = F.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=True)
        h = x + self.o(att.transpose(1, 2).reshape(b, 1, HEADS * HEAD_DIM))
        return h + self.down(torch.relu(self.up(h)))


@torch.no_grad()
def make_model_and_inputs(seed: int = 0):
    torch.manual_seed(seed)
    model = TinyDecoder().to(torch.bfloat16).eval().requires_grad_(False)  # inference
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(BATCH, 1, HIDDEN, generator=g).to(torch.bfloat16)
    k = torch.randn(BATCH, KV_HEADS, KV_LEN, HEAD_DIM, generator=g).to(torch.bfloat16)
    v = torch.randn(BATCH, KV_HEADS, KV_LEN, HEAD_DIM, generator=g).to(torch.bfloat16)
    return model, (x, k, v)


def model_shapes() -> list[tuple[str, dict]]:
    """The decode shapes of TinyDecoder at BATCH rows, as the families key them."""
    gemv = [
        {"m": BATCH, "n": HEADS * HEAD_DIM, "k": HIDDEN, "dtype": "bfloat16", "bias": 1},
        {"m": BATCH, "n": HIDDEN, "k": HEADS * HEAD_DIM, "dtype": "bfloat16"},
        {"m": BATCH, "n": 96, "k": HIDDEN, "dtype": "bfloat16", "bias": 1},
        {"m": BATCH, "n": HIDDEN, "k": 96, "dtype": "bfloat16"},
    ]
    att = {"batch": BATCH, "heads": HEADS, "kv_heads": KV_HEADS, "kv_len": KV_LEN,
           "head_dim": HEAD_DIM, "dtype": "bfloat16"}
    return [("gemv", s) for s in gemv] + [("attention", att)]


def write_export(root, entries, identity: dict | None = None) -> None:
    """Accepted verdicts for (family, shape[, config]) entries (default: the family's default
    config), exported by tuner.export for `identity` (default: the faked H200)."""
    export.export(accepted_verdicts(entries, identity), out_root=root)


def accepted_verdicts(entries, identity: dict | None = None):
    """The verdict table write_export exports: one accepted row per entry, 5.0 -> 4.0 µs."""
    identity = identity or IDENTITY
    studies = []
    for entry in entries:
        family, shape = entry[0], entry[1]
        fam = get_family(family)
        config = entry[2] if len(entry) > 2 else fam.default_config(shape, identity["backend"])
        key = fam.shape_key(shape)
        s = rank.StudyInfo(name=f"{identity['key']}:{family}:{key}", family=family, shape=shape,
                           shape_key=key, device=identity["key"], calls_per_step=1.0,
                           step_us=100.0, phase="decode")
        c = rank.Candidate(config=config, search_us=4.0, trial=1)
        m = rank.Measured(config=c.config, parity=FACTS,
                          vs_baseline=rank.Pair(5.0, 4.0, 1.25, 1.23, 1.27, 0.5))
        studies.append((s, [(c, m)]))
    table = rank.decide(studies, threshold="0.1us")
    assert (table["decision"] == "accept").all()
    for column, value in (("device_name", identity["name"]), ("arch", identity["arch"]),
                          ("backend", identity["backend"]), ("torch", identity["torch"]),
                          ("triton", identity["triton"]), ("fp_fusion", True),
                          ("measured_at", "2026-12-01T00:00:00+00:00")):
        table[column] = value
    table["kernel_hash"] = [get_family(f).source_hash() for f in table["family"]]
    return table


@pytest.fixture
def device(monkeypatch, tmp_path):
    """'An H200' whose exports live under tmp_path/export/nvidia-h200."""
    monkeypatch.setattr(runtime, "current_identity", lambda: dict(IDENTITY))
    monkeypatch.delenv("TUNER_EXPORT_DIR", raising=False)
    runtime.reset()
    serving._warned.clear()
    serving._failed.clear()
    yield tmp_path / "export"
    runtime.reset()


def rel_err(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def assert_replays_as_eager(fn, static) -> None:
    """Capture `fn(static)` in a CUDA graph (one warm call on a side stream first), then for
    three fresh inputs copied into `static`: the replay's output has the bytes of an eager call."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(static)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(static)
    for seed in (1, 2, 3):
        fresh = torch.randn(static.shape, generator=torch.Generator().manual_seed(seed))
        static.copy_(fresh.to(static))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, fn(static)), f"seed {seed}: the replay differs from eager"


def test_without_an_export_the_model_computes_exactly_what_torch_computes(device, caplog):
    model, inputs = make_model_and_inputs()
    expected = model(*inputs)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    (device / "nvidia-h200").mkdir(parents=True)
    handle = serving.install(model, export_dir=device / "nvidia-h200")
    assert len(handle.linears) == 4 and handle.sdpa
    assert F.scaled_dot_product_attention is not serving._SDPA
    out = model(*inputs)
    assert torch.equal(out, expected)  # every call a miss: the baseline path, bit for bit
    misses = handle.misses()
    assert sum(misses["gemv"].values()) == 4 and sum(misses["attention"].values()) == 1
    assert handle.hits() == {}
    handle.uninstall()
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert F.scaled_dot_product_attention is serving._SDPA
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert torch.equal(model(*inputs), expected)


def test_with_an_export_the_custom_ops_run_the_triton_kernels(device, monkeypatch):
    from tuner_kernels import attention, gemv

    launched = []
    for module, name in ((gemv, "gemv"), (attention, "launch")):
        original = getattr(module, name)

        def spy(*args, _original=original, _name=name, **kwargs):
            launched.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    model, inputs = make_model_and_inputs()
    expected = model(*inputs)
    write_export(device, model_shapes())
    with serving.installed(model, export_dir=device / "nvidia-h200") as handle:
        assert handle.status()["gemv"].startswith("loaded: 4 entries")
        out = model(*inputs)
        hits = handle.hits()
    assert sum(hits["gemv"].values()) == 4 and sum(hits["attention"].values()) == 1
    assert sorted(launched) == ["gemv"] * 4 + ["launch"]  # the Triton kernels ran
    assert rel_err(out, expected) < 2e-2


def test_the_ops_trace_under_torch_compile_fullgraph(device):
    model, inputs = make_model_and_inputs()
    write_export(device, model_shapes())
    with serving.installed(model, export_dir=device / "nvidia-h200"):
        eager = model(*inputs)
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        out = compiled(*inputs)  # fullgraph: a graph break would raise here
    torch._dynamo.reset()
    assert torch.equal(out, eager)


def test_a_failing_kernel_runs_the_baseline_with_one_warning(device, caplog, monkeypatch):
    from tuner_kernels import gemv

    model, inputs = make_model_and_inputs()
    expected = model(*inputs)
    write_export(device, model_shapes()[:1])  # the q projection only

    def broken(*args, **kwargs):
        raise RuntimeError("out of resources: shared memory")

    monkeypatch.setattr(gemv, "gemv", broken)
    caplog.set_level(logging.WARNING, logger="tuner.serving")
    with serving.installed(model, export_dir=device / "nvidia-h200", families=("gemv",)):
        first = model(*inputs)
        second = model(*inputs)
    assert torch.equal(first, expected) and torch.equal(second, expected)
    warnings = [r.getMessage() for r in caplog.records if r.name == "tuner.serving"]
    assert len(warnings) == 1 and "out of resources" in warnings[0]
    assert "baseline path runs" in warnings[0]


def test_nothing_compiles_inside_a_capture(device, caplog, monkeypatch):
    """A kernel first met while a graph is being captured is not compiled there: the capture
    records the baseline path, with one warning; after warmup the kernel runs."""
    model, inputs = make_model_and_inputs()
    expected = model(*inputs)
    write_export(device, model_shapes())
    caplog.set_level(logging.WARNING, logger="tuner.serving")
    serving._warmed.clear()
    with serving.installed(model, export_dir=device / "nvidia-h200") as handle:
        monkeypatch.setattr(serving, "_capturing", lambda: True)
        assert torch.equal(model(*inputs), expected)
        warned = [r.getMessage() for r in caplog.records if r.name == "tuner.serving"]
        assert len(warned) == 5 and all("not warmed up" in w for w in warned)
        monkeypatch.setattr(serving, "_capturing", lambda: False)
        handle.warmup(lambda: model(*inputs))
        assert len(serving._warmed) == 5  # every kernel of the step compiled outside the capture
        monkeypatch.setattr(serving, "_capturing", lambda: True)
        caplog.clear()
        warm = model(*inputs)
    assert not [r for r in caplog.records if r.name == "tuner.serving"]  # the kernels ran
    assert rel_err(warm, expected) < 2e-2


def test_install_refuses_unknown_families(device):
    model, _ = make_model_and_inputs()
    from tuner.errors import TunerError

    with pytest.raises(TunerError, match="unknown families"):
        serving.install(model, families=("gemv", "conv"))


def test_a_static_cache_decode_call_with_a_mask_and_a_scale_runs_the_attention_kernel(device):
    """transformers' SDPA attention over a StaticCache passes the unfilled positions as a mask of
    the one query row and its scale explicitly: such a call goes to the tuned kernel and matches
    torch's SDPA with the same mask; a causal or multi-row call stays on torch's SDPA."""
    model, (x, k, v) = make_model_and_inputs()
    write_export(device, model_shapes())
    g = torch.Generator().manual_seed(5)
    q = torch.randn(BATCH, HEADS, 1, HEAD_DIM, generator=g).to(torch.bfloat16)
    lengths = torch.arange(BATCH) % KV_LEN + 1
    keep = (torch.arange(KV_LEN)[None, :] < lengths[:, None])[:, None, None, :]
    additive = torch.where(keep, 0.0, torch.finfo(torch.bfloat16).min).to(torch.bfloat16)
    scale = HEAD_DIM ** -0.5
    with serving.installed(model, export_dir=device / "nvidia-h200") as handle:
        outs = [F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                               enable_gqa=True) for mask in (keep, additive)]
        hits = sum(handle.hits()["attention"].values())
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        rows = torch.ones(BATCH, 1, 2, KV_LEN, dtype=torch.bool)
        F.scaled_dot_product_attention(q.expand(-1, -1, 2, -1), k, v, attn_mask=rows,
                                       enable_gqa=True)
        assert sum(handle.hits()["attention"].values()) == hits == 2
    for mask, out in zip((keep, additive), outs):
        expected = serving._SDPA(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        assert rel_err(out, expected) < 2e-2


class StackedAttention(nn.Module):
    """Three decode attention calls over static caches with a mask and a scale, as a
    transformers decoder's layers make them inside one compiled step."""

    def __init__(self):
        super().__init__()
        self.q = nn.ModuleList(nn.Linear(HIDDEN, HEADS * HEAD_DIM) for _ in range(3))

    def forward(self, x, k_cache, v_cache, mask):
        b = x.shape[0]
        for q_proj in self.q:
            q = q_proj(x).view(b, 1, HEADS, HEAD_DIM).transpose(1, 2)
            att = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask,
                                                 scale=HEAD_DIM ** -0.5, enable_gqa=True)
            x = x + att.transpose(1, 2).reshape(b, 1, HEADS * HEAD_DIM)[..., :HIDDEN]
        return x


ATTENTION = {"batch": BATCH, "heads": HEADS, "kv_heads": KV_HEADS, "kv_len": KV_LEN,
             "head_dim": HEAD_DIM, "dtype": "bfloat16"}


def compiled_stack(**compile_kwargs):
    """StackedAttention compiled with a backend that keeps every graph Dynamo hands it:
    (model, step, graphs)."""
    torch.manual_seed(0)
    model = StackedAttention().to(torch.bfloat16).eval().requires_grad_(False)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    return model, torch.compile(model, backend=backend, **compile_kwargs), graphs


@pytest.mark.parametrize("exported", [False, True], ids=["attention-miss", "attention-hit"])
def test_the_compiled_step_compiles_once_per_install_with_attention_routed(device, exported):
    """Under torch.compile the attention routing decision is a constant of the install: the
    tuned step compiles once whether the export has the shape or not (no recompile per call,
    no graph break per layer), and after uninstall the baseline's compiled code runs again.
    Tracing the export lookup recompiled per layer until Dynamo's limit and left the frame eager
    in every later arm of `tuner ab --compile` (2026-12-01)."""
    model, step, graphs = compiled_stack(dynamic=False)
    _, (x, k, v) = make_model_and_inputs()
    mask = (torch.arange(KV_LEN) < KV_LEN - 3)[None, None, None, :].expand(BATCH, 1, 1, KV_LEN)
    (device / "nvidia-h200").mkdir(parents=True)
    if exported:
        write_export(device, [("attention", ATTENTION)])
    with torch.no_grad():
        expected = step(x, k, v, mask)
        assert len(graphs) == 1
        with serving.installed(model, export_dir=device / "nvidia-h200",
                               families=("attention",)) as handle:
            outs = [step(x, k, v, mask) for _ in range(3)]
            hits = sum(handle.hits().get("attention", {}).values())
            misses = sum(handle.misses().get("attention", {}).values())
        assert len(graphs) == 2  # installing recompiled once, for every call after it
        ops = [str(n.target) for n in graphs[1].graph.nodes if n.op == "call_function"]
        assert sum("tuner.decode_attention" in op for op in ops) == (3 if exported else 0)
        if exported:
            assert hits == 9 and misses == 0  # the custom op counts each call
        else:
            assert hits == 0 and misses == 0  # not routed: the caller's own SDPA ran
        again = step(x, k, v, mask)
        assert len(graphs) == 2  # uninstalling found the baseline's compiled code
        with serving.installed(model, export_dir=device / "nvidia-h200", families=("attention",)):
            assert torch.equal(step(x, k, v, mask), outs[0])
        assert len(graphs) == 2  # the same export again (tuner ab's profiled capture): no compile
    assert torch.equal(again, expected)
    for out in outs:
        assert rel_err(out, expected) < 2e-2
    torch._dynamo.reset()


def test_a_grouped_call_takes_the_entry_of_its_repeated_kv_form(device):
    """A baseline trace of a transformers model records decode SDPA after repeat_kv (kv_heads =
    heads); its entry (one head per program) serves the grouped call on the cache itself. An
    entry of the grouped shape itself comes first."""
    repeated = {"batch": BATCH, "heads": HEADS, "kv_heads": HEADS, "kv_len": KV_LEN,
                "head_dim": HEAD_DIM, "dtype": "bfloat16"}
    grouped = dict(repeated, kv_heads=KV_HEADS)
    one_head = {"HEADS_PER_BLOCK": 1, "BLOCK_N": 16, "SPLIT_KV": 1, "num_warps": 2,
                "num_stages": 1}
    write_export(device, [("attention", repeated, one_head)])
    os_env = {"TUNER_EXPORT_DIR": str(device / "nvidia-h200")}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in os_env.items():
            mp.setenv(k, v)
        runtime.reset()
        config, key = runtime.resolve("attention", grouped)
        assert config == one_head and key == get_family("attention").shape_key(repeated)
        assert runtime.resolve("attention", dict(grouped, heads=2 * HEADS))[0] is None
        two_heads = dict(one_head, HEADS_PER_BLOCK=2)
        write_export(device, [("attention", repeated, one_head), ("attention", grouped, two_heads)])
        runtime.reset()
        assert runtime.resolve("attention", grouped)[0] == two_heads


def tiny_llama(folder, layers: int):
    """A small Llama (4 query heads on 2 KV heads) decoding over a static cache on the CPU."""
    pytest.importorskip("transformers")
    import json

    from tuner.ab.harness import hf_factory, make_harness

    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": layers, "vocab_size": 256, "max_position_embeddings": 256,
              "rms_norm_eps": 1e-5, "head_dim": 16}
    path = folder / "tiny_llama.json"
    path.write_text(json.dumps(config))
    return make_harness(hf_factory(path), batch=1, prompt=4, steps=3, dtype=torch.bfloat16,
                        device="cpu")


def compile_decode_keeping_graphs(h) -> list:
    """Compile the harness's decode step with a backend that keeps every graph; the list."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    h.decode = torch.compile(h.decode, backend=backend, dynamic=False)
    return graphs


def test_a_transformers_decode_step_runs_attention_on_the_grouped_cache(device, tmp_path):
    """transformers' "sdpa" attention function, taken while installed: the compiled decode step
    of a small Llama (grouped heads, static cache) calls tuner.decode_attention on the cache
    itself (no repeat_kv copy) with the entry of the repeated-KV shape its baseline trace shows,
    compiles once for the install, and after uninstall is the baseline's compiled step again."""
    h = tiny_llama(tmp_path, layers=3)
    (device / "nvidia-h200").mkdir(parents=True)
    with torch.no_grad():
        h.prefill()
        with serving.installed(h.model, export_dir=device / "nvidia-h200",
                               families=("attention",)) as handle:
            h.decode()  # no export: each decode call misses, under its grouped shape first
            misses = [dict(kv.split("=") for kv in m.split(",")) for m in handle.misses()["attention"]]
        grouped = min(({k: v if k == "dtype" else int(v) for k, v in m.items()} for m in misses),
                      key=lambda m: m["kv_heads"])
        assert grouped["heads"] == 4 and grouped["kv_heads"] == 2
        repeated = dict(grouped, kv_heads=4)  # what a compiled baseline step's trace records
        write_export(device, [("attention", repeated,
                               {"HEADS_PER_BLOCK": 1, "BLOCK_N": 16, "SPLIT_KV": 1,
                                "num_warps": 2, "num_stages": 1})])
        runtime.reset()
        graphs = compile_decode_keeping_graphs(h)
        h.prefill()
        expected = [h.decode().clone() for _ in range(2)]
        assert len(graphs) == 1
        h.prefill()
        with serving.installed(h.model, export_dir=device / "nvidia-h200",
                               families=("attention",)) as handle:
            tuned = [h.decode().clone() for _ in range(2)]
            hits = sum(handle.hits()["attention"].values())
        assert len(graphs) == 2 and hits == 6  # 3 layers x 2 steps, one compile
        ops = [str(n.target) for n in graphs[1].graph.nodes if n.op == "call_function"]
        assert sum("tuner.decode_attention" in op for op in ops) == 3
        assert not any("expand" in op for op in ops)  # no repeat_kv before the kernel
        h.prefill()
        again = [h.decode().clone() for _ in range(2)]
        assert len(graphs) == 2  # uninstalled: the baseline's compiled step again
    torch._dynamo.reset()
    for a, b, t in zip(again, expected, tuned):
        assert torch.equal(a, b)
        assert rel_err(t, b) < 2e-2


def test_a_growing_cache_under_dynamic_shapes_compiles_in_one_graph(device):
    """torch.compile with dynamic shapes (a cache growing call to call, fullgraph): the routing
    decision takes no call dimension, so the step traces in one graph with the custom op, which
    resolves each call's KV length itself (nearest entry)."""
    model, step, graphs = compiled_stack(dynamic=True, fullgraph=True)
    write_export(device, [("attention", ATTENTION)])
    x = torch.randn(BATCH, 1, HIDDEN).to(torch.bfloat16)
    with torch.no_grad(), serving.installed(model, export_dir=device / "nvidia-h200",
                                            families=("attention",)) as handle:
        for kv_len in (KV_LEN, KV_LEN + 5, KV_LEN + 11):
            k = torch.randn(BATCH, KV_HEADS, kv_len, HEAD_DIM).to(torch.bfloat16)
            mask = torch.ones(BATCH, 1, 1, kv_len, dtype=torch.bool)
            out = step(x, k, torch.randn_like(k), mask)
            assert out.shape == x.shape
        hits = sum(handle.hits()["attention"].values())
    torch._dynamo.reset()
    assert len(graphs) == 1 and hits == 9
    ops = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert sum("tuner.decode_attention" in op for op in ops) == 3


def test_a_rewritten_export_in_the_same_folder_is_routed_anew(device):
    """The compiled decision is keyed by the export folder and its manifest: an export written
    into a folder that was empty when the step compiled recompiles the step, which then routes."""
    model, step, graphs = compiled_stack(dynamic=False)
    _, (x, k, v) = make_model_and_inputs()
    mask = torch.ones(BATCH, 1, 1, KV_LEN, dtype=torch.bool)
    folder = device / "nvidia-h200"
    folder.mkdir(parents=True)

    def routed() -> int:
        return sum("tuner.decode_attention" in str(n.target) for n in graphs[-1].graph.nodes)

    with torch.no_grad():
        with serving.installed(model, export_dir=folder, families=("attention",)):
            step(x, k, v, mask)
        assert routed() == 0
        write_export(device, [("attention", ATTENTION)])
        with serving.installed(model, export_dir=folder, families=("attention",)) as handle:
            step(x, k, v, mask)
            assert sum(handle.hits()["attention"].values()) == 3
        assert routed() == 3
    torch._dynamo.reset()


def test_a_call_with_autograd_stays_on_torchs_sdpa(device):
    """The custom op has no backward: a decode call that autograd records is not routed."""
    model, (x, k, v) = make_model_and_inputs()
    write_export(device, model_shapes())
    q = torch.randn(BATCH, HEADS, 1, HEAD_DIM).to(torch.bfloat16).requires_grad_(True)
    with serving.installed(model, export_dir=device / "nvidia-h200",
                           families=("attention",)) as handle:
        out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        out.float().sum().backward()
        assert q.grad is not None and not handle.hits()
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        assert sum(handle.hits()["attention"].values()) == 1


def test_a_masked_grouped_miss_inside_the_op_runs_transformers_computation(device):
    """A call the op cannot serve (no entry for its batch: a compiled step routes by structure)
    runs, for a masked grouped call, SDPA on the repeated KV heads, as transformers does (torch's
    SDPA with grouped heads and a mask would take its math kernel)."""
    _, (x, k, v) = make_model_and_inputs()
    write_export(device, [("attention", dict(ATTENTION, batch=BATCH + 1))])
    g = torch.Generator().manual_seed(9)
    q = torch.randn(BATCH, HEADS, 1, HEAD_DIM, generator=g).to(torch.bfloat16)
    keep = (torch.arange(KV_LEN) < KV_LEN - 5)[None, None, None, :].expand(BATCH, 1, 1, KV_LEN)
    group = HEADS // KV_HEADS
    expected = serving._SDPA(q, k.repeat_interleave(group, dim=1),
                             v.repeat_interleave(group, dim=1), attn_mask=keep, scale=0.25)
    with serving.installed(torch.nn.Linear(2, 2), export_dir=device / "nvidia-h200",
                           families=("attention",)) as handle:
        out = torch.ops.tuner.decode_attention(q, k, v, keep, 0.25)
        assert not handle.hits() and sum(handle.misses()["attention"].values()) == 1
    assert torch.equal(out, expected)


def test_a_compiled_transformers_step_with_an_export_of_other_shapes_computes_the_baseline(device):
    """Compiled, routing is decided per install, not per call shape (the shapes may be symbolic):
    with an export of another batch (the transformers route matches the module's structure) or
    of another head_dim (transformers' own path then calls SDPA, which any attention entry
    routes), the calls go into the op, which finds no entry and computes the baseline there:
    the step's output is the baseline's, and nothing counts as a hit."""
    h = tiny_llama(device.parent, layers=2)
    graphs = compile_decode_keeping_graphs(h)
    one_head = {"HEADS_PER_BLOCK": 1, "BLOCK_N": 16, "SPLIT_KV": 1, "num_warps": 2,
                "num_stages": 1}
    routed = {}
    with torch.no_grad():
        h.prefill()
        expected = h.decode().clone()
        for name, shape in (("other batch", {"batch": 3, "heads": 4, "kv_heads": 4,
                                              "kv_len": 9, "head_dim": 16, "dtype": "bfloat16"}),
                            ("other head_dim", {"batch": 1, "heads": 4, "kv_heads": 4,
                                                "kv_len": 9, "head_dim": 32,
                                                "dtype": "bfloat16"})):
            write_export(device, [("attention", shape, one_head)])
            h.prefill()
            with serving.installed(h.model, export_dir=device / "nvidia-h200",
                                   families=("attention",)) as handle:
                out = h.decode().clone()
                assert not handle.hits()
            ops = [str(n.target) for n in graphs[-1].graph.nodes if n.op == "call_function"]
            routed[name] = sum("tuner.decode_attention" in op for op in ops)
            assert rel_err(out, expected) < 1e-2, name
    torch._dynamo.reset()
    assert routed == {"other batch": 2, "other head_dim": 2}
    assert len(graphs) == 3  # the baseline, then one compile per install of a new export


def test_has_entries_matches_a_part_of_the_shape_and_the_repeated_kv_form(device):
    write_export(device, [("attention", dict(ATTENTION, kv_heads=HEADS),
                           {"HEADS_PER_BLOCK": 1, "BLOCK_N": 16, "SPLIT_KV": 1, "num_warps": 2,
                            "num_stages": 1})])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNER_EXPORT_DIR", str(device / "nvidia-h200"))
        runtime.reset()
        grouped = {"heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM,
                   "dtype": "bfloat16"}
        assert runtime.has_entries("attention") and runtime.has_entries("attention", grouped)
        assert not runtime.has_entries("attention", dict(grouped, head_dim=2 * HEAD_DIM))
        assert not runtime.has_entries("attention", dict(grouped, batch=BATCH + 1))
        assert not runtime.has_entries("gemv")
    runtime.reset()


# ------------------------------------------------------------------ RMSNorm folded into gemv
FOLD_ARCHS = {"llama": "LlamaDecoderLayer", "mistral": "MistralDecoderLayer",
              "qwen2": "Qwen2DecoderLayer", "qwen3": "Qwen3DecoderLayer",
              "qwen2_moe": "Qwen2MoeDecoderLayer", "qwen3_moe": "Qwen3MoeDecoderLayer",
              "mixtral": "MixtralDecoderLayer"}


def tiny_hf_model(model_type: str):
    """A two-layer transformers model of `model_type` with random bf16 weights (MoE types: the
    second layer's MLP dense where the type has mlp_only_layers)."""
    transformers = pytest.importorskip("transformers")
    dims = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                num_key_value_heads=2, num_hidden_layers=2, vocab_size=256,
                max_position_embeddings=64, head_dim=16, rms_norm_eps=1e-5)
    if model_type.endswith("moe") or model_type == "mixtral":
        dims.update(num_experts=4, num_local_experts=4, num_experts_per_tok=2,
                    moe_intermediate_size=32, shared_expert_intermediate_size=32,
                    decoder_sparse_step=1, mlp_only_layers=[1])
    config = transformers.AutoConfig.for_model(model_type, **dims)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    return model.to(torch.bfloat16).eval().requires_grad_(False)


def export_linears_of(model, device, config_of=lambda shape: None, extra=()) -> list[dict]:
    """Export every linear shape one decode token of `model` calls (from the misses of an
    install without an export), with `config_of(shape)` or else the default config, and the
    `extra` entries."""
    folder = device / "nvidia-h200"
    folder.mkdir(parents=True, exist_ok=True)
    token = torch.tensor([[3]])
    with serving.installed(model, export_dir=folder, families=("gemv",)) as handle:
        model(token)
        keys = list(handle.misses()["gemv"])
    shapes = [{k: v if k == "dtype" else int(v) for k, v in (kv.split("=") for kv in key.split(","))}
              for key in keys]
    write_export(device, [("gemv", s) if config_of(s) is None else ("gemv", s, config_of(s))
                          for s in shapes] + list(extra))
    runtime.reset()
    return shapes


def harvested_tuned_step(model, token, device, path, fold: bool):
    """The ShapeTable of one profiled forward of `model` installed with the export under
    `device` (norms folded or not), its trace written to `path`."""
    from tuner import harvest

    with serving.installed(model, export_dir=device / "nvidia-h200", fold_norms=fold):
        with torch.profiler.profile(record_shapes=True) as prof:
            model(token)
    prof.export_chrome_trace(str(path))
    return harvest.harvest([str(path)]).table


@pytest.mark.parametrize("model_type", sorted(FOLD_ARCHS))
def test_a_folded_norm_computes_what_the_layer_computes(device, model_type):
    """Each decoder layer FOLD_LAYERS names, as the installed transformers builds it: with the
    norms folded into the projections (the gemv kernel carrying the norm) the logits agree with
    the unfolded tuned model's and the plain model's; uninstall restores the model exactly."""
    assert FOLD_ARCHS[model_type] in serving.FOLD_LAYERS
    model = tiny_hf_model(model_type)
    token = torch.tensor([[3]])
    state = {k: v.clone() for k, v in model.state_dict().items()}
    expected = model(token).logits
    export_linears_of(model, device)
    folder = device / "nvidia-h200"
    with serving.installed(model, export_dir=folder) as handle:
        assert handle.norms == []  # off by default
        unfolded = model(token).logits
    with serving.installed(model, export_dir=folder, fold_norms=True) as handle:
        dense_mlps = sum(hasattr(layer.mlp, "gate_proj") for layer in model.model.layers)
        assert len(handle.norms) == len(model.model.layers) + dense_mlps
        folded = model(token).logits
        hits = sum(handle.hits()["gemv"].values())
    assert hits == sum(1 for m in handle.linears + handle.routers if m is not model.lm_head) + 1
    assert rel_err(folded, expected) < 2e-2 and rel_err(folded, unfolded) < 2e-2
    assert not torch.equal(folded, unfolded)  # the norm is the kernel's, rounded once
    assert all(not ({"forward", "_tuner_linear", "_tuner_norm", "_tuner_fold"} & set(m.__dict__))
               for m in model.modules())
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert torch.equal(model(token).logits, expected)


def test_a_step_autograd_records_runs_torchs_path_and_its_gradients(device):
    """The custom ops have no backward: with autograd recording, every installed linear and
    folded norm runs torch's own computation (no tuned call), so backward works and gives the
    plain model's gradients; without it, the same install serves the calls."""
    model = tiny_hf_model("llama")
    token, prompt = torch.tensor([[3]]), torch.tensor([[3, 17, 5, 40]])  # q/k grads need 2+ tokens
    export_linears_of(model, device)
    model.requires_grad_(True)

    def grads():
        model.zero_grad(set_to_none=True)
        model(prompt).logits.float().sum().backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    expected = grads()
    with serving.installed(model, export_dir=device / "nvidia-h200", fold_norms=True) as handle:
        assert handle.norms
        got = grads()
        assert not handle.hits()
        with torch.no_grad():
            model(token)
        assert sum(handle.hits()["gemv"].values()) > 0
    assert got.keys() == expected.keys()
    errors = {name: rel_err(got[name], expected[name]) for name in expected}
    assert all(e < 2e-2 for e in errors.values()), sorted(errors.items(), key=lambda kv: -kv[1])[:4]


def test_a_norm_folds_only_where_every_projection_carries_it(device):
    """A projection whose exported config cannot carry the norm (here the dot variant) or that
    also has a gemm entry keeps its norm unfolded, with its siblings; the rest fold."""
    model = tiny_hf_model("llama")
    k_proj = model.model.layers[0].self_attn.k_proj
    dot = {"ROWS_PER_BLOCK": 16, "BLOCK_K": 64, "SPLIT_K": 1, "num_warps": 4, "USE_DOT": 1,
           "num_stages": 2, "BALANCE_N": 0}
    shapes = export_linears_of(model, device, lambda s: dot if s["n"] == k_proj.out_features
                               and s["k"] == k_proj.in_features else None)
    with serving.installed(model, export_dir=device / "nvidia-h200", fold_norms=True) as handle:
        assert runtime.matching_configs("gemv", {"n": 32, "k": 64}) == [dot]  # k_proj, v_proj
        folded = {id(n) for n in handle.norms}
        layers = model.model.layers
        assert all(id(layer.input_layernorm) not in folded for layer in layers)  # k/v: n = 32
        assert all(id(layer.post_attention_layernorm) in folded for layer in layers)
    prefill = {"m": 16, "n": 128, "k": 64, "dtype": "bfloat16", "layout": "NT"}  # gate/up
    write_export(device, [("gemv", shape) for shape in shapes] + [("gemm", prefill)])
    runtime.reset()
    with serving.installed(model, export_dir=device / "nvidia-h200", fold_norms=True) as handle:
        assert handle.norms and all(id(layer.post_attention_layernorm) not in
                                    {id(n) for n in handle.norms} for layer in layers)


def test_the_folded_step_compiles_in_one_graph_without_the_norm(device):
    """Under torch.compile (fullgraph) the folded layers call tuner.norm_linear and the norm's
    own arithmetic is gone from the graph but for the final norm; the output equals eager."""
    model = tiny_hf_model("qwen3")
    token = torch.tensor([[3]])
    export_linears_of(model, device)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with serving.installed(model, export_dir=device / "nvidia-h200", fold_norms=True):
        eager = model(token).logits
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, backend=backend)
        out = compiled(token).logits
    torch._dynamo.reset()
    assert torch.equal(out, eager)
    ops = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert sum("tuner.norm_linear" in op for op in ops) == 2 * 5
    assert sum("rsqrt" in op for op in ops) == 1 + 2 * 2  # the final norm; q_norm, k_norm


def test_a_folded_model_runs_its_norms_unfolded_at_rows_the_export_does_not_serve(device):
    """A prompt's forward (12 rows: no gemv entry serves it) of a folded model runs each norm
    once and its projections on its output, as the unfolded install does (bit for bit, eager),
    and its compiled graph holds no tuner.norm_linear; the decode token's still folds."""
    model = tiny_hf_model("qwen3")
    prompt = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    export_linears_of(model, device)
    folder = device / "nvidia-h200"
    with serving.installed(model, export_dir=folder) as handle:
        unfolded = model(prompt).logits
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with serving.installed(model, export_dir=folder, fold_norms=True) as handle:
        assert len(handle.norms) == 4
        folded = model(prompt).logits
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, backend=backend)
        out = compiled(prompt).logits
        compiled(torch.tensor([[3]]))
    torch._dynamo.reset()
    assert torch.equal(folded, unfolded) and torch.equal(out, folded)
    ops = [[str(n.target) for n in g.graph.nodes if n.op == "call_function"] for g in graphs]
    assert sum("tuner.norm_linear" in op for op in ops[0]) == 0
    assert sum("tuner.norm_linear" in op for op in ops[-1]) == 2 * 5


def test_norm_linear_outside_the_kernels_reach_runs_the_norm_then_the_linear(device):
    """More rows than gemv takes, or no export: rms_norm (transformers' arithmetic) and then
    linear, bit for bit what the unfolded layer computes."""
    g = torch.Generator().manual_seed(0)
    norm_w = (1 + 0.1 * torch.randn(64, generator=g)).to(torch.bfloat16)
    weight = (torch.randn(32, 64, generator=g) / 8).to(torch.bfloat16)
    for rows in (1, 12):
        x = torch.randn(rows, 1, 64, generator=g).to(torch.bfloat16)
        norm = pytest.importorskip("transformers").models.llama.modeling_llama.LlamaRMSNorm(64, 1e-5)
        norm.weight.data = norm_w.clone()
        expected = F.linear(norm(x), weight)
        assert torch.equal(serving.norm_linear(x, norm_w, 1e-5, weight), expected)


def test_a_folded_step_harvests_its_projections_as_linears(device, tmp_path):
    """A profile of the folded model reads tuner::norm_linear as the linear it is (x [..., k],
    weight [n, k] as its fourth input): each projection's (m, n, k), as the unfolded op's."""
    model = tiny_hf_model("llama")
    token = torch.tensor([[3]])
    export_linears_of(model, device)
    tables = {}
    for fold in (True, False):
        rows = harvested_tuned_step(model, token, device, tmp_path / f"fold_{fold}.json", fold)
        gemm = rows[rows["family"] == "gemm"]
        tables[fold] = {(r["op"], r["m"], r["n"], r["k"]): r["calls_per_step"]
                        for r in gemm.to_dict("records")}
    folded = {key[1:]: calls for key, calls in tables[True].items()
              if key[0] == "tuner::norm_linear"}
    assert folded == {(1, 64, 64): 2.0, (1, 32, 64): 4.0, (1, 128, 64): 4.0}  # q; k, v; gate, up
    merged = {}
    for (op, *dims), calls in tables[True].items():
        merged[tuple(dims)] = merged.get(tuple(dims), 0) + calls
    assert merged == {tuple(key[1:]): calls for key, calls in tables[False].items()}


def test_a_compiled_step_keeps_the_linears_the_export_lacks_in_the_graph(device):
    """Compiled, an nn.Linear whose (n, k, dtype) the export has no entry of is traced as torch's
    linear (the compiler fuses its neighbours into it); an exported one calls tuner.linear, and
    eagerly every linear goes through the op, which counts the misses."""
    model, inputs = make_model_and_inputs()
    shapes = [s for fam, s in model_shapes() if fam == "gemv"]
    write_export(device, [("gemv", shapes[0]), ("gemv", shapes[2])])  # q and up only
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with serving.installed(model, export_dir=device / "nvidia-h200", families=("gemv",)) as h:
        eager = model(*inputs)
        assert sum(h.misses()["gemv"].values()) == 2  # o and down, eagerly through the op
        torch._dynamo.reset()
        out = torch.compile(model, fullgraph=True, backend=backend)(*inputs)
    torch._dynamo.reset()
    assert torch.equal(out, eager)
    ops = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert sum("tuner.linear" in op for op in ops) == 2
    assert sum(op == "<built-in function linear>" for op in ops) == 2  # torch.nn.functional.linear


def test_a_compiled_linear_is_routed_where_its_calls_m_is_served(device):
    """Compiled, a linear is routed where its call's m finds an entry (within one octave): q's
    entry at m = 8 is two octaves from calls at m = 2 and leaves q in the graph as torch's
    linear, up's at m = 4 routes up. With dynamic shapes the same rule holds as a guard on m: the
    step at m = 8 recompiles and routes both."""
    model, inputs = make_model_and_inputs()
    shapes = [s for fam, s in model_shapes() if fam == "gemv"]
    write_export(device, [("gemv", dict(shapes[0], m=4 * BATCH)),
                          ("gemv", dict(shapes[2], m=2 * BATCH))])
    wider = tuple(t.repeat(4, *(1,) * (t.dim() - 1)) for t in inputs)  # m = 8
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def routed():
        ops = [str(n.target) for n in graphs[-1].graph.nodes if n.op == "call_function"]
        return (sum("tuner.linear" in op for op in ops),
                sum(op == "<built-in function linear>" for op in ops))

    with serving.installed(model, export_dir=device / "nvidia-h200", families=("gemv",)) as h:
        eager, eager_wider = model(*inputs), model(*wider)
        assert sum(h.misses()["gemv"].values()) == 3 + 2  # o, down; and q at m = 2
        for dynamic in (False, True):
            torch._dynamo.reset()
            step = torch.compile(model, fullgraph=True, backend=backend, dynamic=dynamic)
            assert torch.equal(step(*inputs), eager)
            assert routed() == (1, 3), dynamic
        assert torch.equal(step(*wider), eager_wider)
        assert routed() == (2, 2)
    torch._dynamo.reset()


def test_the_compiled_routing_reads_the_installed_families_and_the_call_structure(device):
    """A gemv export installed with families=("gemm",) routes no linear (compiled); a gemm entry
    of another layout or a batched one does not route a linear either (its calls look up NT,
    unbatched shapes); a Linear subclass with a forward of its own is left alone."""
    model, inputs = make_model_and_inputs()
    shapes = [s for fam, s in model_shapes() if fam == "gemv"]
    write_export(device, [("gemv", shapes[0]),
                          ("gemm", {"m": 16, "n": 64, "k": 64, "dtype": "bfloat16", "layout": "NN"}),
                          ("gemm", {"m": 16, "n": 96, "k": 64, "dtype": "bfloat16",
                                    "layout": "NT", "batch": 4})])
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    for families, routed in ((("gemm",), 0), (("gemv", "gemm"), 1)):
        with serving.installed(model, export_dir=device / "nvidia-h200", families=families):
            torch._dynamo.reset()
            torch.compile(model, fullgraph=True, backend=backend)(*inputs)
        ops = [str(n.target) for n in graphs[-1].graph.nodes if n.op == "call_function"]
        assert sum("tuner.linear" in op for op in ops) == routed, families
    torch._dynamo.reset()

    class Quantized(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    wrapped = nn.Sequential(Quantized(HIDDEN, HIDDEN), nn.Linear(HIDDEN, HIDDEN))
    with serving.installed(wrapped, export_dir=device / "nvidia-h200") as handle:
        assert handle.linears == [wrapped[1]]


def test_a_norm_kernel_that_fails_leaves_the_plain_kernel_of_its_shape_alone(device, monkeypatch,
                                                                           caplog):
    """The kernel carrying the norm and the plain kernel of the same shape and config fail apart:
    a failing norm launch runs the norm then torch's linear, with one warning, while the plain
    linear of that shape keeps its kernel."""
    from tuner_kernels import gemv

    shape = {"m": 1, "n": 32, "k": 64, "dtype": "bfloat16"}
    write_export(device, [("gemv", shape)])
    original = gemv.gemv
    launched = []

    def flaky(*args, norm_eps=None, **kwargs):
        if norm_eps is not None:
            raise RuntimeError("no norm today")
        launched.append("plain")
        return original(*args, **kwargs)

    monkeypatch.setattr(gemv, "gemv", flaky)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 64, generator=g).to(torch.bfloat16)
    weight = (torch.randn(32, 64, generator=g) / 8).to(torch.bfloat16)
    norm_w = torch.ones(64, dtype=torch.bfloat16)
    model = nn.Linear(64, 32, bias=False).to(torch.bfloat16)
    with serving.installed(model, export_dir=device / "nvidia-h200", families=("gemv",)):
        with caplog.at_level(logging.WARNING, logger="tuner.serving"):
            for _ in range(2):
                out = serving.norm_linear(x, norm_w, 1e-6, weight, None,
                                          gemv.fold_norm_weight(weight, norm_w))
        assert torch.equal(out, F.linear(gemv.rms_norm(x, norm_w, 1e-6), weight))
        assert sum("failed" in r.message for r in caplog.records) == 1
        serving.linear(x, weight)
    assert launched == ["plain"]


def test_a_norm_of_another_dtype_than_its_projections_is_not_folded(device):
    model = tiny_hf_model("llama")
    export_linears_of(model, device)
    for layer in model.model.layers:
        layer.input_layernorm.float()  # an fp32 norm weight in a bf16 model
    with serving.installed(model, export_dir=device / "nvidia-h200", fold_norms=True) as handle:
        folded = {id(n) for n in handle.norms}
    assert folded == {id(layer.post_attention_layernorm) for layer in model.model.layers}


def test_an_entry_keyed_bias_0_serves_the_linear_without_bias(device):
    """An export entry whose shape says "bias": 0 (the schema allows it) is the linear without a
    bias: serving's lookup, which leaves the key out, finds it (compiled routing included)."""
    shape = {"m": 1, "n": 32, "k": 64, "dtype": "bfloat16", "bias": 0}
    write_export(device, [("gemv", shape)])
    os.environ["TUNER_EXPORT_DIR"] = str(device / "nvidia-h200")
    try:
        runtime.reset()
        plain = {"m": 1, "n": 32, "k": 64, "dtype": "bfloat16"}
        assert runtime.lookup("gemv", plain) is not None
        assert runtime.has_entries("gemv", {"n": 32, "k": 64, "bias": None})
    finally:
        os.environ.pop("TUNER_EXPORT_DIR", None)


def test_a_tuned_steps_trace_keeps_the_bias_of_its_linears(device, tmp_path):
    """A profile of a tuned Qwen2 (q/k/v with a bias), the norms folded or not: the hits of
    tuner::linear / tuner::norm_linear launch no addmm, and the rows still say bias = 1, so the
    gemv family keys them as serving looks them up (a re-tune from this trace exports keys that
    hit)."""
    model = tiny_hf_model("qwen2")
    token = torch.tensor([[3]])
    shapes = export_linears_of(model, device)
    biased = {(s["n"], s["k"]) for s in shapes if s.get("bias")}
    assert biased == {(64, 64), (32, 64)}  # q; k, v
    for fold in (False, True):
        rows = harvested_tuned_step(model, token, device, tmp_path / f"qwen2_{fold}.json", fold)
        keys = {tuple(sorted(s.items())) for s in
                (get_family("gemv").shape_from_row(r) for r in rows.to_dict("records")) if s}
        assert keys == {tuple(sorted(s.items())) for s in shapes}, fold


# ------------------------------------------------- residual adds into the projection's kernel
def _residual_backend(fused: list):
    """A torch.compile backend that runs `fuse_residual_adds` on the post-grad (AOT) graph, as
    Inductor's post-grad custom pass does, then runs that graph eagerly (no C++ compile)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    def forward_compiler(gm, example_inputs):
        fused.append(serving_fusion.fuse_residual_adds(gm.graph))
        gm.recompile()
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=forward_compiler)


def test_the_residual_adds_of_a_folded_step_go_into_the_projections_kernels(device):
    """Compiled with the norms folded, each decoder layer's two residual adds (after o_proj and
    after down_proj, both tuned) become tuner.linear_add calls: the step has no add between two
    tuned projections, and its logits agree with the eager folded step's; on the CPU the
    kernel's epilogue (HAS_RES) served those calls."""
    from tuner_kernels import gemv

    model = tiny_hf_model("qwen3")
    token = torch.tensor([[3]])
    export_linears_of(model, device)
    fused, residuals = [], []
    original = gemv.gemv

    def spy(*args, residual=None, **kwargs):
        residuals.append(residual is not None)
        return original(*args, residual=residual, **kwargs)

    with serving.installed(model, export_dir=device / "nvidia-h200", fold_norms=True) as handle:
        assert len(handle.norms) == 4
        eager = model(token).logits
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, backend=_residual_backend(fused))
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(gemv, "gemv", spy)
            out = compiled(token).logits
    torch._dynamo.reset()
    assert fused == [2 * 2]  # two layers, o_proj and down_proj each
    assert sum(residuals) == 4 and len(residuals) == 2 * 7 + 1  # 7 projections a layer, lm_head
    assert rel_err(out, eager) < 1e-2


def test_install_with_folded_norms_puts_the_residual_pass_into_inductor_and_takes_it_out(device):
    """install(fold_norms=True) chains its pass after a post-grad custom pass already set, and
    uninstall puts the old one back; a step compiled by Inductor meanwhile runs it (the add
    becomes tuner.linear_add) and computes residual + linear."""
    import torch._inductor.config as inductor_config

    calls = []

    class Theirs:  # someone else's pass (a serving engine's)
        def __call__(self, graph):
            calls.append("theirs")

        def uuid(self):
            return "theirs-1"

    shape = {"m": 1, "n": 32, "k": 64, "dtype": "bfloat16"}
    write_export(device, [("gemv", shape)])
    model = nn.Sequential(nn.Linear(64, 32, bias=False)).to(torch.bfloat16).requires_grad_(False)
    theirs = Theirs()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 64, generator=g).to(torch.bfloat16)
    r = torch.randn(1, 32, generator=g).to(torch.bfloat16)
    counted = []
    original = serving_fusion.fuse_residual_adds

    def counting(graph):
        counted.append(original(graph))
        return counted[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(inductor_config, "post_grad_custom_post_pass", theirs)
        mp.setattr(inductor_config, "force_disable_caches", True)  # a cached graph runs no pass
        mp.setattr(serving_fusion, "fuse_residual_adds", counting)
        with serving.installed(model, export_dir=device / "nvidia-h200", fold_norms=True) as handle:
            ours = inductor_config.post_grad_custom_post_pass
            assert ours is not theirs and ours.prior is theirs and ours.uuid()[1] == "theirs-1"
            torch._dynamo.reset()
            step = torch.compile(lambda x, r: r + torch.ops.tuner.linear(x, model[0].weight, None),
                                 backend="inductor", fullgraph=True)
            out = step(x, r)
            assert handle.residual_adds_fused() == 1
        assert inductor_config.post_grad_custom_post_pass is theirs
    torch._dynamo.reset()
    assert calls == ["theirs"] and counted == [1]
    expected = r.float() + x.float() @ model[0].weight.float().T
    assert rel_err(out, expected) < 1e-2


def test_a_profiled_linear_add_harvests_as_the_linear_it_is(device, tmp_path):
    """tuner::linear_add (x, weight, bias, residual) in a trace is the linear of its x and
    weight: harvest reads its (m, n, k) and calls, as tuner::linear's."""
    from tuner import harvest

    write_export(device, [("gemv", {"m": 1, "n": 32, "k": 64, "dtype": "bfloat16"})])
    model = nn.Linear(64, 32, bias=False).to(torch.bfloat16).requires_grad_(False)
    x = torch.randn(1, 1, 64).to(torch.bfloat16)
    r = torch.randn(1, 1, 32).to(torch.bfloat16)
    with serving.installed(model, export_dir=device / "nvidia-h200", families=("gemv",)):
        with torch.profiler.profile(record_shapes=True) as prof:
            for _ in range(3):
                out = torch.ops.tuner.linear_add(x, model.weight, None, r)
    assert rel_err(out, r.float() + x.float() @ model.weight.float().T) < 1e-2
    path = tmp_path / "linear_add.json"
    prof.export_chrome_trace(str(path))
    rows = harvest.harvest([str(path)]).table
    gemm = rows[rows["op"] == "tuner::linear_add"].to_dict("records")
    assert [(r["m"], r["n"], r["k"]) for r in gemm] == [(1, 32, 64)]


def test_a_residual_add_stays_in_the_graph_where_the_config_cannot_take_it(device):
    """down_proj exported with the dot variant (no residual epilogue without split K): its
    residual adds stay adds in the compiled step, for Inductor to fuse into the next norm; the
    adds after o_proj (an FMA config) still go into its kernel."""
    model = tiny_hf_model("qwen3")
    down = model.model.layers[0].mlp.down_proj
    dot = {"ROWS_PER_BLOCK": 16, "BLOCK_K": 64, "SPLIT_K": 1, "num_warps": 4, "USE_DOT": 1,
           "num_stages": 2, "BALANCE_N": 0}
    export_linears_of(model, device, lambda s: dot if (s["n"], s["k"]) == (
        down.out_features, down.in_features) else None)
    fused = []
    with serving.installed(model, export_dir=device / "nvidia-h200", fold_norms=True):
        eager = model(torch.tensor([[3]])).logits
        torch._dynamo.reset()
        out = torch.compile(model, fullgraph=True, backend=_residual_backend(fused))(
            torch.tensor([[3]])).logits
    torch._dynamo.reset()
    assert fused == [2]  # o_proj's, one a layer
    assert rel_err(out, eager) < 1e-2
