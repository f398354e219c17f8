"""What harvest keeps from a trace, declared as data (in the spirit of HolisticTraceAnalysis's
parser_config.py): the dialects and their event categories and argument names, the op sets, the
step markers, the dtype names. The code that reads a trace looks everything up here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "Dialect", "KINETO", "KINETO_2021", "DIALECTS", "CATEGORY_KINDS",
    "GEMM_CORE", "GEMM_WRAPPERS", "GEMM_OPS", "LINEAR_OPS", "LINEAR_WEIGHT_INPUT",
    "LINEAR_BIAS_INPUT", "ATTN_BHLD", "ATTN_BLHD",
    "ATTN_NAME_RE", "MOE_OPS", "MOE_PARTS", "MOE_TOPK_OPS", "MOE_PACKED_VIEW", "GROUPED_MM_OP",
    "INDUCTOR_KERNEL_RE", "INDUCTOR_FUSED_RE", "INDUCTOR_GEMM_RE", "INDUCTOR_GEMM_OP", "COMPILED_REGION_PREFIX",
    "StepMarker", "STEP_MARKERS", "PHASE_WORDS", "ANNOTATION_PREFIXES",
    "DTYPES", "TRACE_SUFFIXES", "RANK_RE", "GPU_NAME_RE", "LAUNCH_BOUND", "UNATTRIBUTED_WARN",
]


# -------------------------------------------------------------------------------------- dialects
@dataclass(frozen=True)
class Dialect:
    """How one trace dialect names the events harvest keeps.

    Every event category a dialect declares maps to one of four kinds: "op" (a CPU operator,
    with Input Dims), "runtime" (a launch or other runtime/driver API call), "gpu" (a kernel,
    memset or memcpy on the device) or "annotation" (a user annotation: step markers, phases).
    Argument names differ between dialects (the External id, the Input Dims), so they are
    declared too; the first name present wins.
    """
    name: str
    categories: dict          # category -> kind
    ext_keys: tuple           # argument names of the External id
    dims_keys: tuple          # argument names of the Input Dims
    # ProfilerStep#N recorded as an "op" event (2021 schema) instead of a user annotation
    steps_in_ops: bool = False


KINETO = Dialect(
    "Kineto (torch >= 1.10)",
    categories={
        "cpu_op": "op", "operator": "op",
        "cuda_runtime": "runtime", "cuda_driver": "runtime", "hip_runtime": "runtime",
        "hip_driver": "runtime", "runtime": "runtime",
        "kernel": "gpu", "gpu_memset": "gpu", "gpu_memcpy": "gpu",
        "user_annotation": "annotation",
    },
    ext_keys=("External id",),
    dims_keys=("Input Dims",),
)

# torch 1.8 / 1.9 (2021): capitalised categories, a lowercase "external id" on launches and
# kernels, string tids ("123", "stream 7"), ProfilerStep#N and record_function scopes recorded
# as Operator events.
KINETO_2021 = Dialect(
    "Kineto 2021 (torch 1.8/1.9)",
    categories={"Operator": "op", "Runtime": "runtime", "Kernel": "gpu", "Memcpy": "gpu",
                "Memset": "gpu"},
    ext_keys=("External id", "external id"),
    dims_keys=("Input Dims", "Input dims"),
    steps_in_ops=True,
)

DIALECTS = (KINETO, KINETO_2021)

# category -> (dialect, kind), for the one lookup per event the reader makes
CATEGORY_KINDS: dict = {cat: (d, kind) for d in DIALECTS for cat, kind in d.categories.items()}


# ---------------------------------------------------------------------------------------- op sets
GEMM_CORE = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm"})
# tuner::linear is tuner.serving's custom op (input [..., k], weight [n, k], like aten::linear):
# a tuned call runs Triton kernels directly under it; a miss runs aten::linear inside it.
# tuner::norm_linear (x [..., k], norm_weight [k], eps, weight [n, k], bias) is the same linear
# with a decoder layer's RMSNorm folded in: its weight is input 3 (LINEAR_WEIGHT_INPUT);
# tuner::linear_add (x, weight, bias, residual) is tuner::linear with the residual add after it.
LINEAR_OPS = frozenset({"aten::linear", "tuner::linear", "tuner::norm_linear",
                        "tuner::linear_add"})
LINEAR_WEIGHT_INPUT = {"tuner::norm_linear": 3}
# and the bias input of each: a tuned call (a hit) launches its kernel with the bias fused, no
# aten::addmm below it to tell the bias by, so the row says it (`bias` = 1)
LINEAR_BIAS_INPUT = {"aten::linear": 2, "tuner::linear": 2, "tuner::norm_linear": 4,
                     "tuner::linear_add": 2}
GEMM_WRAPPERS = frozenset({"aten::matmul"}) | LINEAR_OPS
GEMM_OPS = GEMM_CORE | GEMM_WRAPPERS

# Attention ops whose q/k are [batch, heads, len, head_dim].
ATTN_BHLD = frozenset({
    "aten::scaled_dot_product_attention",
    "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention",
    "aten::_scaled_dot_product_attention_math",
    "aten::_scaled_dot_product_fused_attention_overrideable",
    "aten::_cudnn_attention_forward",
    "tuner::decode_attention",  # tuner.serving's custom op (q [batch, heads, 1, head_dim])
    "tuner::grouped_sdpa",  # tuner.baselines' grouped decode SDPA (tuner ab's baseline arms)
})
# Attention ops whose q/k are [batch, len, heads, head_dim] (or [tokens, heads, head_dim] varlen).
ATTN_BLHD = frozenset({
    "aten::_flash_attention_forward",
    "aten::_efficient_attention_forward",
})
# Other attention ops (flash-attn, vLLM, SGLang, FlashInfer, custom): "attn"/"attention" in a CPU
# op's name (vllm::unified_attention_with_output, flash_attn::...), the vLLM flash-attention
# extension's ops, FlashInfer's ragged / paged runs, sgl_kernel's flash-attention; never a
# backward op.
ATTN_NAME_RE = re.compile(r"attn|attention|_vllm_fa\d|mha_(?:varlen_)?fwd|paged_run|ragged_run"
                          r"|batch_(?:decode|prefill)_with|sgl_kernel::fwd|fwd_kvcache",
                          re.IGNORECASE)
# Fused mixture-of-experts calls (tuner/harvest/moe.py reads their dims; docs/harvest.md lists
# what each gives). The outermost of these ops is one `moe` call: vLLM's layer op (hidden_states
# [m, hidden], router_logits [m, E]; read off the real gpt-oss-20b capture in ../shared/traces)
# and the engines' fused-experts custom ops (hidden_states [m, hidden], w1 [E, 2 inter, hidden],
# w2 [E, hidden, inter], topk_weights [m, topk], topk_ids [m, topk]: vLLM's and SGLang's
# fused_moe.py signatures), and tuner.serving's own op (x [m, hidden], w1, w2 as theirs, then
# topk_ids [m, topk], topk_weights, block: what `tuner ab`'s tuned arm runs). The Triton
# fused_moe_kernel they launch belongs to the call.
MOE_OPS = frozenset({
    "vllm::moe_forward", "vllm::moe_forward_shared",
    "vllm::outplace_fused_experts", "vllm::inplace_fused_experts",
    "sglang::outplace_fused_experts", "sglang::inplace_fused_experts",
    "tuner::moe",
})
# Ops inside a MoE call whose dims add to its shape and whose kernels count with it: the align /
# sort of the (token, expert) pairs (topk_ids [m, topk]; triton_kernels' SortTokens: expt_scal,
# expt_indx [m, topk]).
MOE_PARTS = frozenset({"_moe_C::moe_align_block_size", "sgl_kernel::moe_align_block_size",
                       "SortTokens"})
# The router's top-k inside a MoE call: its dims add to the shape (topk_softmax: topk_weights
# [m, topk]; triton_kernels' TopK: logits [m, E]), its kernels are the router's (other ops), as
# the moe family takes topk_ids as an input.
MOE_TOPK_OPS = frozenset({"_moe_C::topk_softmax", "sgl_kernel::topk_softmax", "TopK"})
# vLLM's MXFP4 path (gpt-oss, triton_kernels matmul_ogs) passes no weight to any op: its expert
# weights show only as views of their packed storage, uint8 [E, hidden / 2, 2 inter] (w1) and
# [E, inter / 2, hidden] (w2), inside the layer's moe_forward.
MOE_PACKED_VIEW = ("aten::view", "unsigned char")
# transformers' grouped-mm experts (its default from 5.0) run a MoE block as plain ops, with two
# grouped matmuls of the sorted (token, expert) pairs: up [m * topk, hidden] x [E, hidden,
# 2 inter] and down [m * topk, inter] x [E, inter, hidden], offsets [E]. Kept as ops of kind
# "grouped_mm"; `harvest --topk K` reads each such pair as one moe call (moe.grouped_mm_calls).
GROUPED_MM_OP = "aten::_grouped_mm"
# The kernels torch.compile (Inductor) generates are recorded as CPU ops named after the kernel,
# and the name lists the ops it fused: "triton_poi_fused__scaled_dot_product_cudnn_attention_
# _to_copy_..._rsqrt..." is a fused elementwise kernel (rotary, norm, casts) next to an attention
# call, not one. They are never a GEMM or attention call (their time counts as other kernels).
INDUCTOR_TRITON_PREFIX = r"^triton_(?:poi|per|red|tem|for|spl|unk)_"
INDUCTOR_KERNEL_RE = re.compile(INDUCTOR_TRITON_PREFIX + r"|^cpp_fused_")
# The ops one of them fused, as the name lists them ("_to_copy__unsafe_view_add_mean_mm_mul_pow_
# rsqrt" of "triton_red_fused__to_copy__unsafe_view_add_mean_mm_mul_pow_rsqrt_18"):
# trace.fused_neighbours reads what a compiled linear's kernel computed besides its matmul.
INDUCTOR_FUSED_RE = re.compile(INDUCTOR_TRITON_PREFIX + r"fused_(.*?)(?:_\d+)?$")
# Except Inductor's Triton GEMM templates (max-autotune's picks: "triton_tem_fused_mm_t_view_3",
# "triton_tem_fused__unsafe_view_mm_mul_silu_t_view_10", a norm or activation fused in): each is
# one linear call, its args the input [..., k] (any view), the weight [n, k] and the output
# [m, n] (read off a real max-autotune trace, tests/fixtures/traces/h200_tiny_llama_max_autotune*).
# They are read as the op INDUCTOR_GEMM_OP, one row a shape whatever kernel ran it.
INDUCTOR_GEMM_RE = re.compile(r"^triton_tem_fused_(?:\w*?_)?(?:add)?mm(?:_|$)")
INDUCTOR_GEMM_OP = "inductor::mm_template"
# And the matrix-vector products Inductor decomposes a matmul into where the matmul has one row
# (torch/_inductor/decomposition.py, `mm`: under coordinate descent tuning, which max-autotune
# turns on, an m = 1 mm becomes a multiply and a sum), fused with the norm, activation or
# residual around it: "triton_red_fused__to_copy_add_mean_mm_mul_pow_rsqrt_t_view_15" (RMSNorm,
# then gate and up). One kernel may compute several linears that read the same input (gate and
# up, k and v): each weight [n, k] whose output [1, n] is among the args is one linear call
# (shapes.reduction_linears; read off a real max-autotune trace of a 2-layer Llama-3.1-8B-shaped
# step, tests/fixtures/traces/h200_llama31_8b_2l_b1_max_autotune*). Read as INDUCTOR_GEMV_OP.
INDUCTOR_GEMV_RE = re.compile(r"^triton_(?:red|per)_fused_(?:\w*?_)?mm(?:_|$)")
INDUCTOR_GEMV_OP = "inductor::mm_reduction"
# The range Inductor records around each call of a compiled graph (torch/_inductor/output_code.py,
# CompiledFxGraph.__call__, while a profiler runs; a user_annotation, or an op in older dialects).
# The GEMM and attention ops inside one are the compiled graph's (its extern mm, its SDPA); ops
# outside ran eager, such as a server's attention custom op between vLLM's piecewise graphs.
# Dynamo's "Torch-Compiled Region: F/N" range is not used: it also encloses graph-break code.
COMPILED_REGION_PREFIX = "## Call CompiledFxGraph "


# ------------------------------------------------------------------------------------ step markers
@dataclass(frozen=True)
class StepMarker:
    """An annotation that opens a step. `phase_of(match)` gives the step's phase, or "" when the
    marker does not say (then the phase is inferred); `batch_of(match)` gives (tokens in the
    step, mean KV length of its decode requests), either None when the marker does not say.
    Markers earlier in STEP_MARKERS win."""
    pattern: re.Pattern
    label: str                # who writes it (vLLM, SGLang, torch.profiler)
    source: str               # how the summary names where the steps came from
    phase_of: object          # callable(re.Match) -> str
    batch_of: object = None   # callable(re.Match) -> (int | None, int | None)


def _vllm_phase(m: re.Match) -> str:
    ctx, gen = int(m.group(1)), int(m.group(3))
    return "prefill" if ctx > 0 else ("decode" if gen > 0 else "other")


# inside vLLM's (): the token count ("32"), or sq<tokens>sk<KV tokens>sqsq<..>sqsk<..> (sums over
# the requests of query lengths, KV lengths, squared query lengths, query x KV lengths)
_VLLM_COUNTS = re.compile(r"^(?:(\d+)|sq(\d+)sk(\d+))")


def _vllm_batch(m: re.Match) -> tuple:
    prefill, decode = _VLLM_COUNTS.match(m.group(2)), _VLLM_COUNTS.match(m.group(4))
    if prefill is None or decode is None:
        return None, None
    tokens = int(prefill.group(1) or prefill.group(2)) + int(decode.group(1) or decode.group(2))
    requests = int(m.group(3))
    kv_mean = None
    if not int(m.group(1)) and requests and decode.group(3) is not None:
        kv_mean = max(1, round(int(decode.group(3)) / requests))   # pure decode: mean KV length
    return tokens, kv_mean


def _sglang_batch(m: re.Match) -> tuple:
    bs = re.search(r"\bbs=(\d+)", m.string)
    return (int(bs.group(1)) if bs and m.group(1).upper() == "DECODE" else None), None


_SGLANG_PHASES = {"DECODE": "decode", "EXTEND": "prefill", "PREFILL": "prefill", "MIXED": "prefill"}

STEP_MARKERS = (
    # vLLM: execute_context_X(Y)_generation_Z(W) (X prefill requests with Y tokens, Z decode
    # requests with W tokens); newer builds insert a counter (execute_7_context_...) and shape
    # details in ().
    StepMarker(re.compile(r"^execute_(?:\d+_)?context_(\d+)\(([^)]*)\)_generation_(\d+)\(([^)]*)\)"),
               "vLLM", "vLLM execute_context_*_generation_* annotations", _vllm_phase, _vllm_batch),
    # SGLang: step[DECODE bs=...], step[EXTEND ...], step[MIXED ...]
    StepMarker(re.compile(r"^step\[(DECODE|EXTEND|PREFILL|MIXED|IDLE)\b", re.IGNORECASE),
               "SGLang", "SGLang step[...] annotations",
               lambda m: _SGLANG_PHASES.get(m.group(1).upper(), "other"), _sglang_batch),
    StepMarker(re.compile(r"^ProfilerStep#(\d+)$"), "torch.profiler", "ProfilerStep#N markers",
               lambda m: ""),
)
# user annotations that name the phase of the step they are in
PHASE_WORDS = {"prefill": "prefill", "decode": "decode", "extend": "prefill", "generate": "decode"}
# annotation names worth keeping at all (a cheap prefix test before the patterns)
ANNOTATION_PREFIXES = ("ProfilerStep#", "execute_", "step[")


# ----------------------------------------------------------------------------------------- dtypes
DTYPES = {
    "c10::BFloat16": "bfloat16",
    "c10::Half": "float16",
    "float": "float32",
    "double": "float64",
    "c10::Float8_e4m3fn": "float8_e4m3fn",
    "c10::Float8_e5m2": "float8_e5m2",
    "c10::Float8_e4m3fnuz": "float8_e4m3fnuz",
    "c10::Float8_e5m2fnuz": "float8_e5m2fnuz",
    "signed char": "int8",
    "unsigned char": "uint8",
    "short int": "int16",
    "int": "int32",
    "long int": "int64",
    "bool": "bool",
    "c10::complex<float>": "complex64",
    "c10::complex<double>": "complex128",
}


# ------------------------------------------------------------------------------------------ files
TRACE_SUFFIXES = (".json", ".json.gz")
# vLLM: <instance>-rank-3.<time>.pt.trace.json.gz; SGLang: <time>-TP-3[-DP-0...].trace.json.gz;
# torch DDP scripts: rank_3, rank3.
RANK_RE = re.compile(r"(?:\brank[-_]?|[-_]rank[-_]?|-TP-)(\d+)", re.IGNORECASE)


# a GPU model in a metadata label ("GPU 0" alone names none)
GPU_NAME_RE = re.compile(r"NVIDIA|AMD|Instinct|Radeon|Tesla|GeForce|Quadro|\b[AHBL]\d{2,3}\b|"
                         r"\bMI\d{3}|\bRTX\b", re.IGNORECASE)


# ------------------------------------------------------------------------------------ thresholds
LAUNCH_BOUND = 0.60         # GPU busy below this fraction of the step: launch-bound warning
UNATTRIBUTED_WARN = 0.005   # GPU time with no owning op above this share: a warning
