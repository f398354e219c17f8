"""Helpers every kernel family shares: one copy each, listed in every family's source hash.

- `DTYPES`, `KernelCall`, `launch_options`, `tensor_backend`, `interpreting`, `row_value`,
  `cdiv`, `pow2_at_least`: small pieces the families' host code uses.
- `fix_interpreter`: Triton interpreter workarounds (TRITON_INTERPRET=1 only).
- `store_split`: the epilogue of a K-split kernel (the output, or a split's fp32 partial, and
  with REDUCE_LAST the in-kernel sum of the partials by the tile's last split).
- The offline compile path: `compile_call` (one planned kernel call -> `CompileReport`) and
  `compile_configs` (a family's (shape, config) jobs for a GPU target, in a child process when
  this one runs Triton's interpreter). A family takes part by giving `launch_plan(inputs, config,
  out=None, backend=None) -> (out, [KernelCall])` that works on 'meta' tensors.

Nothing here imports the `tuner` package: serving code imports kernels, and kernels must not
drag the pipeline in with them.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

__all__ = [
    "DTYPES", "CompileReport", "KernelCall", "cdiv", "column_group", "compile_call", "compile_configs",
    "fix_interpreter", "interpreting", "launch_options", "pow2_at_least", "row_value",
    "run_without_interpreter", "sm_count", "split_counters", "store_split", "tensor_backend",
]

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
HIP_KNOBS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")
HIP_BACKENDS = ("hip", "dcu")


_SM_COUNTS: dict[int, int] = {}
DEFAULT_SM_COUNT = 132  # an H100 / H200: the count for meta tensors, the CPU and offline compiles


def sm_count(device=None) -> int:
    """Multiprocessors (CUs on AMD) of `device` (a torch.device, or None: the current GPU);
    DEFAULT_SM_COUNT where there is no GPU (CPU and meta tensors). Cached: launches call it."""
    try:
        if device is not None and torch.device(device).type != "cuda":
            return DEFAULT_SM_COUNT
        if not torch.cuda.is_available():
            return DEFAULT_SM_COUNT
        index = torch.device(device).index if device is not None else None
        index = torch.cuda.current_device() if index is None else int(index)
        if index not in _SM_COUNTS:
            _SM_COUNTS[index] = int(torch.cuda.get_device_properties(index).multi_processor_count)
        return _SM_COUNTS[index]
    except Exception:  # noqa: BLE001 - a launch heuristic's input, never an error
        return DEFAULT_SM_COUNT


def interpreting() -> bool:
    """Whether Triton runs kernels on the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def pow2_at_least(x: int) -> int:
    return 1 << (max(int(x), 1) - 1).bit_length()


def row_value(row, key, default=None):
    """row[key] of a ShapeTable row (pandas Series or dict); NaN / missing -> default."""
    try:
        value = row[key]
    except (KeyError, IndexError, TypeError):
        return default
    if value is None:
        return default
    try:
        if value != value:  # NaN (pandas NA raises TypeError here)
            return default
    except TypeError:
        return default
    return value


def tensor_backend(t: torch.Tensor) -> str:
    """'cuda' or 'hip' for a GPU tensor (torch.version.hip tells ROCm apart), else 'cpu'."""
    if t.device.type != "cuda":
        return "cpu"
    return "hip" if torch.version.hip else "cuda"


def launch_options(config: dict, backend: str, *, num_stages: int = 2) -> dict:
    """num_warps / num_stages, plus the AMD-only knobs on hip (CUDA's launcher rejects them)."""
    opts = {"num_warps": int(config.get("num_warps", 4)),
            "num_stages": int(config.get("num_stages", num_stages))}
    if backend in HIP_BACKENDS:
        for knob in HIP_KNOBS:
            if knob in config:
                opts[knob] = int(config[knob])
    return opts


@dataclass
class KernelCall:
    """One kernel launch of a plan: ``kernel[grid](*args, **constexprs, **options)``."""

    kernel: object
    grid: tuple
    args: tuple
    constexprs: dict
    options: dict

    def run(self) -> None:
        self.kernel[self.grid](*self.args, **self.constexprs, **self.options)


# ------------------------------------------------------------------------ split-K epilogue
@triton.jit
def store_split(acc, out_ptrs, part_ptrs, split_stride, pid_k, mask, count_ptr,
                SPLIT_K: tl.constexpr, REDUCE_LAST: tl.constexpr):
    """Store one program's share of an output tile that SPLIT_K programs (pid_k = 0..SPLIT_K-1)
    compute over slices of K.

    SPLIT_K == 1: `acc` is the whole sum, stored at `out_ptrs` in the output's dtype. Otherwise
    `acc` is split pid_k's fp32 partial, stored at `part_ptrs + pid_k * split_stride` (the
    workspace [SPLIT_K, ...], `part_ptrs` pointing into split 0). Then, without REDUCE_LAST, a
    second kernel of the family sums the partials. With REDUCE_LAST the tile's splits count
    themselves at `count_ptr` (one int32 a tile, zero at launch: `split_counters`): the last to
    arrive reads the SPLIT_K partials back in split order, sums them from zero as the reduce
    kernels do (the same additions in the same order: the same bytes) and stores the output, so
    the whole product is one launch. The barrier makes every thread's partial stored before the
    count is raised (release); the count's acquire and L2 reads (.cg) see the other splits'.
    """
    if SPLIT_K == 1:
        tl.store(out_ptrs, acc.to(out_ptrs.dtype.element_ty), mask=mask)
    else:
        tl.store(part_ptrs + pid_k * split_stride, acc, mask=mask)
        if REDUCE_LAST:
            tl.debug_barrier()
            arrived = tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT_K - 1:
                total = tl.zeros_like(acc)
                for s in tl.static_range(SPLIT_K):
                    total += tl.load(part_ptrs + s * split_stride, mask=mask, other=0.0,
                                     cache_modifier=".cg")
                tl.store(out_ptrs, total.to(out_ptrs.dtype.element_ty), mask=mask)


def split_counters(tiles: int, device) -> torch.Tensor:
    """The zeroed arrival counts of `store_split` with REDUCE_LAST: one int32 per output tile,
    new each launch (inside a CUDA graph capture the zeroing is captured with the kernel, so
    every replay starts from zero, and two launches never share counts)."""
    return torch.zeros(max(1, tiles), dtype=torch.int32, device=device)


# ------------------------------------------------------------------------ interpreter fixes
def fix_interpreter() -> None:
    """Work around three Triton interpreter bugs (TRITON_INTERPRET=1 only; idempotent).

    1. Scalars are 1-element arrays converted with ``int(array)``, which NumPy >= 2.3 refuses
       ("only 0-dimensional arrays can be converted to Python scalars"), so ``range(start, end)``
       over runtime values fails. We read the single element instead.
    2. ``tl.dot`` on bfloat16 multiplies the raw uint16 storage bits (NumPy has no bfloat16). We
       widen bfloat16 operands to float32 first (exact), as the GPU's MMA does.
    3. A float32 -> bfloat16 cast truncates the mantissa (Triton 3.6-3.9), where the GPU's
       ``cvt.rn.bf16.f32`` rounds to nearest even: outputs came out twice as far from the fp32
       reference as torch's, and the parity facts said so. We round to nearest even, as the GPU.
    Compiled kernels are unaffected: this patches the interpreter only.
    """
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    if getattr(interpreter, "_kernels_fixed", False):
        return
    original_patch = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        original_patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    builder = interpreter.InterpreterBuilder
    original_dot = builder.create_dot

    def widen(handle):
        if handle.dtype.scalar == tl.bfloat16:
            bits = handle.data.astype(np.uint32) << 16
            return interpreter.TensorHandle(bits.view(np.float32), tl.float32)
        return handle

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original_dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    original_cast = builder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            bits = np.ascontiguousarray(src.data, dtype=np.float32).view(np.uint32)
            rounded = ((bits.astype(np.uint64) + 0x7FFF + ((bits >> 16) & 1)) >> 16)
            out = rounded.astype(np.uint16)
            nan = np.isnan(src.data)
            if np.any(nan):  # keep NaN a (quiet) NaN
                out[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
            return interpreter.TensorHandle(out.reshape(np.shape(src.data)), tl.bfloat16)
        return original_cast(self, src, dst_type)

    interpreter._patch_lang_tensor = patch_lang_tensor
    builder.create_dot = create_dot
    builder.cast_impl = cast_impl
    interpreter._kernels_fixed = True


if interpreting():
    fix_interpreter()


# ------------------------------------------------------------ offline compiles (no GPU needed)
@dataclass
class CompileReport:
    """Resource figures of one compiled kernel, from ptxas / the AMDGCN metadata."""

    kernel: str
    target: str  # "cuda:90", "hip:gfx942"
    n_regs: int  # registers per thread (CUDA) / VGPRs incl. AGPRs per lane (AMD)
    n_spills: int  # stack + local (spill) bytes per thread (CUDA) / spilled VGPRs + SGPRs (AMD)
    shared: int  # shared memory / LDS bytes per block as Triton allocated it
    wide_loads: int = 0  # 16-byte global loads in the code (ld.global.v4 / *_load_dwordx4)
    waves_per_eu_attr: bool = False  # hip: the occupancy hint reached the LLVM IR
    asm: str = ""  # PTX / AMDGCN text, only when asked for


_TORCH_TO_TRITON = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
                    torch.int32: "i32", torch.int64: "i64"}


def compile_call(call: KernelCall, target, with_asm: bool = False) -> CompileReport:
    """Compile one planned call for ``target`` (a triton GPUTarget) without a GPU.

    Argument specialisation follows Triton's JIT launcher: integers equal to 1 become constants,
    pointers and integers divisible by 16 get the divisibility hint, and on hip pointers to
    tensors under 2 GB get the 32-bit range hint. Use meta tensors in the plan.
    """
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    kernel = call.kernel
    if not isinstance(kernel, JITFunction):  # an InterpretedFunction under TRITON_INTERPRET=1
        kernel = JITFunction(kernel.fn)
    hip = target.backend == "hip"
    signature, constexprs, attrs = {}, {}, {}
    positional = list(call.args)
    for index, name in enumerate(kernel.arg_names):
        if name in call.constexprs:
            signature[name], constexprs[name] = "constexpr", call.constexprs[name]
            continue
        if not positional:  # a defaulted constexpr the plan leaves out
            continue
        value = positional.pop(0)
        if type(value).__name__ == "TensorDescriptor":
            block = ",".join(str(int(d)) for d in value.block_shape)
            signature[name] = f"tensordesc<{_TORCH_TO_TRITON[value.base.dtype]}[{block}]>"
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + _TORCH_TO_TRITON[value.dtype]
            attrs[(index,)] = [["tt.divisibility", 16]]
            if hip and value.numel() * value.element_size() < 2**31:
                attrs[(index,)].append(["tt.pointer_range", 32])
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            if value == 1:
                signature[name], constexprs[name] = "constexpr", 1
                continue
            signature[name] = "i32" if -2**31 <= value < 2**31 else "i64"
            if value % 16 == 0:
                attrs[(index,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            raise TypeError(f"compile_call: cannot type argument {name}={value!r}")
    compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target,
                              options=dict(call.options))
    shared = int(compiled.metadata.shared)
    name = kernel.__name__
    if hip:
        asm = compiled.asm["amdgcn"]

        def field(key):
            found = re.search(rf"{re.escape(key)}\s*(\d+)", asm)
            return int(found.group(1)) if found else 0

        return CompileReport(
            name, f"hip:{target.arch}", field("; TotalNumVgprs:") or field(".vgpr_count:"),
            field(".vgpr_spill_count:") + field(".sgpr_spill_count:"),
            max(shared, field(".group_segment_fixed_size:")),
            wide_loads=len(re.findall(r"(?:global|buffer)_load_dwordx4", asm)),
            waves_per_eu_attr="amdgpu-waves-per-eu" in compiled.asm.get("llir", ""),
            asm=asm if with_asm else "")
    # Registers and local memory (spills) of the cubin Triton's ptxas produced.
    ptx = compiled.asm["ptx"]
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        usage = subprocess.run([str(cuobjdump), "-res-usage", str(cubin)], capture_output=True,
                               text=True, check=True).stdout

    def usage_field(key):
        found = re.search(rf"{key}:(\d+)", usage)
        return int(found.group(1)) if found else 0

    # Spilled registers live in the per-thread stack frame (STACK) or local memory (LOCAL).
    return CompileReport(name, f"cuda:{target.arch}", usage_field("REG"),
                         usage_field("STACK") + usage_field("LOCAL"), shared,
                         wide_loads=len(re.findall(r"ld\.global[.:\w]*\.v4", ptx)),
                         asm=ptx if with_asm else "")


def compile_config(family: str, shape: dict, config: dict, target,
                   with_asm: bool = False) -> list[CompileReport]:
    """Compile every kernel a config launches for ``shape`` on ``target`` (meta tensors, no GPU).

    Needs a process where triton.language was imported without TRITON_INTERPRET=1;
    `compile_configs` runs a child process otherwise."""
    module = importlib.import_module(f"tuner_kernels.{family}")
    inputs = module.make_inputs(shape, "meta")
    backend = "hip" if target.backend == "hip" else "cuda"
    _, calls = module.launch_plan(inputs, config, backend=backend)
    return [compile_call(call, target, with_asm) for call in calls]


def _compiler_usable_here() -> bool:
    """False where this process imported triton.language under TRITON_INTERPRET=1: its own jit
    functions (tl.sum's combine function, cdiv, ...) are then interpreter objects."""
    import triton.language.standard as standard
    from triton.runtime.jit import JITFunction

    return isinstance(standard.cdiv, JITFunction)


def _compile_in_process(family: str, jobs: list, target, with_asm: bool) -> list:
    results = []
    for shape, config in jobs:
        try:
            results.append(compile_config(family, shape, config, target, with_asm))
        except Exception as exc:  # noqa: BLE001 - a config that does not compile is data
            text = str(exc).strip()
            results.append(f"{type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}")
    return results


def compile_configs(family: str, jobs: list[tuple[dict, dict]], target,
                    with_asm: bool = False) -> list:
    """Compile (shape, config) jobs of a family for a GPUTarget, e.g. GPUTarget("hip", "gfx942",
    64) or GPUTarget("cuda", 90, 32).

    Returns, per job, a list of CompileReport (one per kernel the config launches, the main kernel
    first) or a failure reason string. Runs in this process when it can, else in one child process
    (without TRITON_INTERPRET) for all jobs.
    """
    if _compiler_usable_here():
        return _compile_in_process(family, jobs, target, with_asm)
    request = {"family": family, "jobs": [list(job) for job in jobs], "with_asm": with_asm,
               "target": [target.backend, target.arch, target.warp_size]}
    rows = run_without_interpreter("tuner_kernels.common:_compile_request", request)
    return [row if isinstance(row, str) else [CompileReport(**r) for r in row] for row in rows]


def _compile_request(request: dict) -> list:
    """compile_configs in a child process (run_without_interpreter): JSON in, JSON out."""
    from triton.backends.compiler import GPUTarget

    if not _compiler_usable_here():
        raise SystemExit("triton.language was imported in interpreter mode; unset TRITON_INTERPRET")
    target = GPUTarget(*request["target"])
    results = _compile_in_process(request["family"], [tuple(job) for job in request["jobs"]],
                                  target, bool(request.get("with_asm")))
    return [row if isinstance(row, str) else [dataclasses.asdict(r) for r in row]
            for row in results]


def run_without_interpreter(function: str, request: dict):
    """Call ``function`` ('module:name', taking and returning plain JSON data) in a child Python
    without TRITON_INTERPRET and return its result (the child prints it as its last line)."""
    module, name = function.split(":")
    root = str(Path(__file__).resolve().parent.parent)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    code = (f"import json, sys; from {module} import {name}; "
            f"print(json.dumps({name}(json.loads(sys.stdin.read()))))")
    proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(request),
                          capture_output=True, text=True, env=env, cwd=root, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"compile child failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def column_group(m: int, block_m: int) -> int:
    """The GROUP_M that walks every row tile of a weight column tile before the next column
    (the m-fastest tile order; search_spaces/gemm.yaml keeps only the smallest such value),
    capped at 8 row tiles; 1 where there is one row tile."""
    tiles = cdiv(m, block_m)
    return 1 if tiles <= 1 else min(8, pow2_at_least(tiles))
