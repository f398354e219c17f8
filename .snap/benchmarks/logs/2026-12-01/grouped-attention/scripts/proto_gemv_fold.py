"""Prototype (session helper, not a product kernel): kernels/gemv.py's FMA kernel with each
step's 8 contiguous k values a thread holds folded into one accumulator lane (SEQ=1: a
sequential FMA chain over tl.split parts), so the per-x-row accumulators are [R, BLOCK_K/8]
instead of [R, BLOCK_K]: 2-4x fewer registers at m = 4..8 (sm90 offline compiles: no spills),
more programs resident, more weight bytes in flight. SPLIT_K 1, EVEN_K, no bias.
Timed by scripts/gpu/fma_fold.py."""
import triton
import triton.language as tl


@triton.jit
def split8(v, R: tl.constexpr, AK: tl.constexpr):
    # [R, AK*8] -> eight [R, AK] tensors (k = 8*j + 4*a + 2*b + c), all within a thread
    v = tl.reshape(v, [R, AK, 2, 2, 2])
    v0, v1 = tl.split(v)
    v00, v01 = tl.split(v0)
    v10, v11 = tl.split(v1)
    a0, a1 = tl.split(v00)
    a2, a3 = tl.split(v01)
    a4, a5 = tl.split(v10)
    a6, a7 = tl.split(v11)
    return a0, a1, a2, a3, a4, a5, a6, a7


@triton.jit
def fma8(acc, w8, x, R: tl.constexpr, AK: tl.constexpr):
    # acc[R, AK] += sum over the 8 k of each group of w * x, as a sequential FMA chain
    x8 = split8(x, R, AK)
    acc = acc + w8[0] * x8[0]
    acc = acc + w8[1] * x8[1]
    acc = acc + w8[2] * x8[2]
    acc = acc + w8[3] * x8[3]
    acc = acc + w8[4] * x8[4]
    acc = acc + w8[5] * x8[5]
    acc = acc + w8[6] * x8[6]
    acc = acc + w8[7] * x8[7]
    return acc


@triton.jit
def _gemv_proto(x_ptr, w_ptr, out_ptr, N, K, k_per_split, stride_xm, stride_wn, stride_om,
                M: tl.constexpr, ROWS_PER_BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
                STATIC_KPS: tl.constexpr = 0):
    """The measured form (session 17, call 2): x through kernels/gemv.py's [R, BK] pointer tensor,
    each step's 8 k values a thread holds folded into the [R, BK / 8] accumulators by an FMA
    chain; row sums after the loop."""
    pid_n = tl.program_id(0)
    rows = pid_n * ROWS_PER_BLOCK + tl.arange(0, ROWS_PER_BLOCK)
    n_mask = rows < N
    rows_safe = tl.minimum(rows, N - 1)
    offs = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + rows_safe.to(tl.int64)[:, None] * stride_wn
    zero_rows = tl.zeros([ROWS_PER_BLOCK], dtype=tl.int32)
    ACC_K: tl.constexpr = BLOCK_K // 8
    acc0 = tl.zeros([ROWS_PER_BLOCK, ACC_K], dtype=tl.float32)
    acc1 = tl.zeros([ROWS_PER_BLOCK, ACC_K], dtype=tl.float32)
    acc2 = tl.zeros([ROWS_PER_BLOCK, ACC_K], dtype=tl.float32)
    acc3 = tl.zeros([ROWS_PER_BLOCK, ACC_K], dtype=tl.float32)
    acc4 = tl.zeros([ROWS_PER_BLOCK, ACC_K], dtype=tl.float32)
    acc5 = tl.zeros([ROWS_PER_BLOCK, ACC_K], dtype=tl.float32)
    acc6 = tl.zeros([ROWS_PER_BLOCK, ACC_K], dtype=tl.float32)
    acc7 = tl.zeros([ROWS_PER_BLOCK, ACC_K], dtype=tl.float32)
    kps_loop = k_per_split if STATIC_KPS == 0 else STATIC_KPS
    for k0 in range(0, kps_loop, BLOCK_K):
        offs_k = k0 + offs
        w = tl.load(w_rows + offs_k[None, :], eviction_policy="evict_first").to(tl.float32)
        w8 = split8(w, ROWS_PER_BLOCK, ACC_K)
        x_off = zero_rows[:, None] + offs_k[None, :]
        acc0 = fma8(acc0, w8, tl.load(x_ptr + x_off).to(tl.float32), ROWS_PER_BLOCK, ACC_K)
        if M > 1:
            acc1 = fma8(acc1, w8, tl.load(x_ptr + 1 * stride_xm + x_off).to(tl.float32),
                         ROWS_PER_BLOCK, ACC_K)
        if M > 2:
            acc2 = fma8(acc2, w8, tl.load(x_ptr + 2 * stride_xm + x_off).to(tl.float32),
                         ROWS_PER_BLOCK, ACC_K)
        if M > 3:
            acc3 = fma8(acc3, w8, tl.load(x_ptr + 3 * stride_xm + x_off).to(tl.float32),
                         ROWS_PER_BLOCK, ACC_K)
        if M > 4:
            acc4 = fma8(acc4, w8, tl.load(x_ptr + 4 * stride_xm + x_off).to(tl.float32),
                         ROWS_PER_BLOCK, ACC_K)
        if M > 5:
            acc5 = fma8(acc5, w8, tl.load(x_ptr + 5 * stride_xm + x_off).to(tl.float32),
                         ROWS_PER_BLOCK, ACC_K)
        if M > 6:
            acc6 = fma8(acc6, w8, tl.load(x_ptr + 6 * stride_xm + x_off).to(tl.float32),
                         ROWS_PER_BLOCK, ACC_K)
        if M > 7:
            acc7 = fma8(acc7, w8, tl.load(x_ptr + 7 * stride_xm + x_off).to(tl.float32),
                         ROWS_PER_BLOCK, ACC_K)
    ty = out_ptr.dtype.element_ty
    tl.store(out_ptr + rows, tl.sum(acc0, axis=1).to(ty), mask=n_mask)
    if M > 1:
        tl.store(out_ptr + 1 * stride_om + rows, tl.sum(acc1, axis=1).to(ty), mask=n_mask)
    if M > 2:
        tl.store(out_ptr + 2 * stride_om + rows, tl.sum(acc2, axis=1).to(ty), mask=n_mask)
    if M > 3:
        tl.store(out_ptr + 3 * stride_om + rows, tl.sum(acc3, axis=1).to(ty), mask=n_mask)
    if M > 4:
        tl.store(out_ptr + 4 * stride_om + rows, tl.sum(acc4, axis=1).to(ty), mask=n_mask)
    if M > 5:
        tl.store(out_ptr + 5 * stride_om + rows, tl.sum(acc5, axis=1).to(ty), mask=n_mask)
    if M > 6:
        tl.store(out_ptr + 6 * stride_om + rows, tl.sum(acc6, axis=1).to(ty), mask=n_mask)
    if M > 7:
        tl.store(out_ptr + 7 * stride_om + rows, tl.sum(acc7, axis=1).to(ty), mask=n_mask)


def plan(x, w, out, R, BK, nw):
    from kernels.common import KernelCall
    m, k = x.shape
    n = w.shape[0]
    assert k % BK == 0
    meta = dict(M=m, ROWS_PER_BLOCK=R, BLOCK_K=BK, STATIC_KPS=0)
    return KernelCall(_gemv_proto, (triton.cdiv(n, R), 1),
                      (x, w, out, n, k, k, x.stride(0), w.stride(0), out.stride(0)), meta,
                      {"num_warps": nw, "num_stages": 1})
