"""The read-only kernels: kernels that only read device memory, for the read curve and the
read bandwidth (the first floor of the measuring core above the ground, docs/interfaces.md).

- `stream_read_kernel`: many programs, each summing STEPS x BLOCK int32 values with wide loads,
  all its loads issued before the first add (`tuner device`'s bandwidth kernel);
- the `tma` kernel: one or two programs a multiprocessor, each walking its contiguous share of
  the buffer in [BLOCK_R, 256] int32 tiles through a pipeline of STAGES tensor-memory-accelerator
  copies into shared memory (sm90; the weight path of the skinny GEMM kernel without its MMAs);
  with pointer loads (`use_desc` False: hip, the CPU interpreter) Triton pipelines the same walk
  through cp.async stages (sm90; LDS on gfx9): the `cpasync` readers.

`READERS` names the configurations the read curve (tuner.ceilings) times; `reader_plan` is one
reader's launch as a `tuner_kernels.common.KernelCall` (offline compiles use it too), `reader_call` a
callable for the timer, `read_sets` its input sets. This module imports nothing of the
pipeline; torch, triton and tuner_kernels.common only inside its functions.
"""

from __future__ import annotations

import math

__all__ = ["CHUNK_BYTES", "READERS", "TMA_COLUMNS", "read_sets", "reader_call", "reader_plan",
           "stream_read_kernel"]

TMA_COLUMNS = 256  # int32 values a row of the tma reader's 2-D view (1 KiB)
CHUNK_BYTES = 256 << 10  # every reader's unit: sizes are rounded down to whole chunks

# name: (kind, constexprs, num_warps, programs a multiprocessor for the persistent kinds)
READERS = {
    "stream-4096x8-w8": ("stream", {"BLOCK": 4096, "STEPS": 8}, 8, None),
    "stream-2048x8-w4": ("stream", {"BLOCK": 2048, "STEPS": 8}, 4, None),
    "stream-4096x16-w8": ("stream", {"BLOCK": 4096, "STEPS": 16}, 8, None),
    "tma-32x256-s4-p1": ("tma", {"BLOCK_R": 32, "STAGES": 4}, 4, 1),
    "tma-32x256-s6-p1": ("tma", {"BLOCK_R": 32, "STAGES": 6}, 4, 1),
    "tma-16x256-s4-p2": ("tma", {"BLOCK_R": 16, "STAGES": 4}, 4, 2),
    "cpasync-32x256-s4-p1": ("cpasync", {"BLOCK_R": 32, "STAGES": 4}, 4, 1),
}

_KERNELS: dict = {}  # kind: the jitted kernel, made on first use


def stream_read_kernel():
    """A read-only streaming kernel: each program sums STEPS blocks of BLOCK int32 values (an
    integer sum, so the compiler cannot drop a load) and writes one int32."""
    if "stream" not in _KERNELS:
        import triton
        import triton.language as tl

        @triton.jit
        def stream_read(src, dst, BLOCK: tl.constexpr, STEPS: tl.constexpr):
            pid = tl.program_id(0).to(tl.int64)
            offs = tl.arange(0, BLOCK)
            acc = tl.zeros([BLOCK], dtype=tl.int32)
            base = src + pid * BLOCK * STEPS
            for i in tl.static_range(STEPS):
                acc += tl.load(base + i * BLOCK + offs, eviction_policy="evict_first")
            tl.store(dst + pid, tl.sum(acc, axis=0))

        _KERNELS["stream"] = stream_read
    return _KERNELS["stream"]


def _tma_kernel():
    if "tma" not in _KERNELS:
        import triton
        import triton.language as tl

        @triton.jit
        def tma_stream_read(desc, src, dst, blocks, per_program, BLOCK_R: tl.constexpr,
                            COLUMNS: tl.constexpr, STAGES: tl.constexpr, USE_DESC: tl.constexpr):
            """Program p sums the row blocks [p * per_program, (p + 1) * per_program) of the
            [rows, COLUMNS] int32 view: a descriptor load a block (USE_DESC), or pointer loads."""
            pid = tl.program_id(0)
            start = pid * per_program
            end = tl.minimum(start + per_program, blocks)
            acc = tl.zeros([BLOCK_R, COLUMNS], dtype=tl.int32)
            offs = tl.arange(0, BLOCK_R)[:, None] * COLUMNS + tl.arange(0, COLUMNS)[None, :]
            for b in tl.range(start, end, num_stages=STAGES):
                if USE_DESC:
                    acc += desc.load([b * BLOCK_R, 0])
                else:
                    acc += tl.load(src + b * (BLOCK_R * COLUMNS) + offs)  # < 2**31 values
            tl.store(dst + pid, tl.sum(tl.sum(acc, axis=1), axis=0))

        _KERNELS["tma"] = tma_stream_read
    return _KERNELS["tma"]


def read_sets(nbytes: int, count: int, device) -> list[dict]:
    """`count` buffers of `nbytes` (rounded down to whole 256 KiB chunks, at least one) of random
    int32 values on `device`, as input sets {"buf": tensor}."""
    import torch

    elements = max(1, int(nbytes) // CHUNK_BYTES) * (CHUNK_BYTES // 4)
    return [{"buf": torch.randint(-1000, 1000, (elements,), dtype=torch.int32, device=device)}
            for _ in range(max(1, int(count)))]


def reader_plan(name: str, buf, sms: int, *, use_desc: bool = True, programs: int | None = None,
                part=None):
    """(KernelCall, partials): the one launch with which reader `name` (READERS) reads `buf`
    (int32, whole 256 KiB chunks) on a device of `sms` multiprocessors, and the int32 tensor of
    its partial sums (one a program; they add up to the buffer's sum, wrapping at 32 bits;
    `part` is used where it has that size). `use_desc` False: the tma reader with pointer
    loads (hip, the CPU interpreter); `programs`: the persistent kinds' grid instead of their
    programs a multiprocessor (a probe of how many programs a read needs). Works on meta
    tensors (offline compiles, tuner_kernels.common.compile_call)."""
    import torch

    from tuner_kernels.common import KernelCall

    kind, meta, warps, per_sm = READERS[name]
    if kind == "stream":
        grid = buf.numel() // (meta["BLOCK"] * meta["STEPS"])  # CHUNK_BYTES: whole programs
    else:
        blocks = buf.numel() // TMA_COLUMNS // meta["BLOCK_R"]
        grid = max(1, min(blocks, programs or sms * per_sm))
        per_program = math.ceil(blocks / grid)
        grid = math.ceil(blocks / per_program)
    if part is None or part.numel() != grid or part.device != buf.device:
        part = torch.empty(grid, dtype=torch.int32, device=buf.device)
    options = {"num_warps": warps}
    if kind == "stream":
        return KernelCall(stream_read_kernel(), (grid,), (buf, part), dict(meta), options), part
    use_desc = use_desc and kind == "tma"
    desc = buf
    if use_desc:
        from triton.tools.tensor_descriptor import TensorDescriptor

        rows = buf.numel() // TMA_COLUMNS
        desc = TensorDescriptor(buf.view(rows, TMA_COLUMNS), [rows, TMA_COLUMNS],
                                [TMA_COLUMNS, 1], [meta["BLOCK_R"], TMA_COLUMNS])
    constexprs = dict(BLOCK_R=meta["BLOCK_R"], COLUMNS=TMA_COLUMNS, STAGES=meta["STAGES"],
                      USE_DESC=use_desc)
    return KernelCall(_tma_kernel(), (grid,), (desc, buf, part, blocks, per_program), constexprs,
                      options), part


def reader_call(name: str, sms: int, *, use_desc: bool = True, programs: int | None = None):
    """fn(inputs) that reads inputs["buf"] once with reader `name` (`reader_plan`) and returns
    its int32 partial sums; the partials' tensor is kept from call to call (graph capture)."""
    partials: dict = {}

    def run(inputs):
        buf = inputs["buf"]
        key = (buf.numel(), str(buf.device))
        call, partials[key] = reader_plan(name, buf, sms, use_desc=use_desc, programs=programs,
                                          part=partials.get(key))
        call.run()
        return partials[key]
    return run


