"""tuner.serving on a small torch model: install / uninstall, the custom ops, the fallbacks.

The export is written by tuner.export from verdicts of recorded numbers (the kernel hashes and
default configs are the real ones); under TRITON_INTERPRET=1 the custom ops run the Triton
kernels on the CPU. The device identity is given (this machine has no GPU).
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kernels import get_family
from tuner import export, rank, runtime, serving
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
    export.export(table, out_root=root)


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
    from kernels import attention, gemv

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
    from kernels import gemv

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
