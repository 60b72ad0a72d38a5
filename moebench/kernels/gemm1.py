"""GEMM1 of the fused MoE: ``h = silu(x @ w13[e, :I].T) * (x @ w13[e, I:].T)`` per tile of one expert's slots.

1. A program takes a row tile of slots (``_tile_slots``) and BLOCK_N columns of h;
2. its K loop accumulates the gate and up products side by side (two MMAs, or one over both: ``MERGED``);
3. the epilogue applies SiLU-and-multiply and writes ``h [T, I]`` (bf16, or fp8 where GEMM2 reads fp8);
   the ``[T, 2I]`` product never reaches memory, except with split-K: each split then stores its partial
   sums and ``_swiglu`` adds them and applies the activation.
``x [M, hidden]``, ``w13 [E, 2I, hidden]`` (gate rows, then up rows); slot ``s`` is token ``s // topk``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from moebench.kernels import pdl as dependent
from moebench.kernels.act_quant import quantize_groups_of, to_fp8
from moebench.kernels.tiles import (
    _a_block128,
    _block_scale,
    _grid,
    _grid_and,
    _grid_mul,
    _halves,
    _head_slots,
    _k_share,
    _load,
    _load_a,
    _mma,
    _tile_coords,
    _tile_rows,
    _tile_slots,
)


@triton.jit(do_not_specialize=["num_slots", "max_pid_m", "stride_split", "zero_numel"])
def _gemm1_swiglu(
    x_ptr,  # [M, K] activations (fp8 when QUANT, unless X_QUANT)
    w_ptr,  # [E, 2N, K] gate rows then up rows
    h_ptr,  # [T, N] output activation, row = token slot; SPLIT_K > 1: [SPLIT_K, T, 2N] float32, gate|up partials
    h_scale_ptr,  # STATIC_OUT: [1] float32, the static scale fp8 h is written at; GROUP_OUT: [T, cdiv(N, BLOCK_N)]
    x_scale_ptr,  # QUANT 1: [M] (stride 0 for one tensor scale); QUANT 2: [M, cdiv(K, BLOCK_K)]
    w_scale_ptr,  # QUANT 1: [E, 2N] (stride 0 per tensor); QUANT 2: [E, cdiv(2N, SCALE_N), cdiv(K, BLOCK_K)]
    sorted_ids_ptr,  # [max_padded] slot ids grouped by expert; == num_slots for padding
    expert_ids_ptr,  # [max_blocks]
    num_padded_ptr,  # [1]
    num_slots,  # T = M * topk
    max_pid_m,  # max_blocks: the grid's bound on row tiles
    N,  # I
    K,  # hidden
    stride_xm,
    stride_we,
    stride_wn,
    stride_hm,
    stride_split,  # SPLIT_K > 1: elements between the splits' [T, 2N] slices (T * 2N)
    stride_hsm,  # GROUP_OUT: h_scale's row stride
    stride_xsm,
    stride_xsk,
    stride_wse,
    stride_wsn,
    stride_wsk,
    TOPK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SWAP_AB: tl.constexpr,
    QUANT: tl.constexpr,
    SPLIT_K: tl.constexpr,
    DIRECT: tl.constexpr,
    MERGED: tl.constexpr,  # one MMA per K step over gate and up rows together (gemm1_merged)
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no K mask on the operand loads
    EVEN_N: tl.constexpr,  # N % BLOCK_N == 0: no column mask on weight loads; one block scale per tile (BN <= SCALE_N)
    PDL: tl.constexpr,  # launched as a programmatic dependent: wait for the previous launch before its data
    STATIC_OUT: tl.constexpr,  # h written in fp8 at a static per-tensor scale (fp8-tensor-static, SPLIT_K == 1)
    GROUP_OUT: tl.constexpr,  # QUANT 2, BLOCK_N == GEMM2's group, SPLIT_K == 1: h in fp8, a tile row one group
    ROUND_FIRST: tl.constexpr,
    X_QUANT: tl.constexpr,  # QUANT 2: x read in its own dtype and quantized in the K loop (x_scale_ptr unused)
    w_desc,  # TMA_W: a tensor descriptor of w13 as [E * 2N, K], blocks [BLOCK_N, BLOCK_K]; else None
    TMA_W: tl.constexpr,  # the weight tiles read by TMA (gemm1_tma)
    zero_ptr,  # ZERO: GEMM2's atomic top-k sums [M, hidden] (the output, or float32), contiguous
    zero_numel,  # ZERO: M * hidden
    ZERO: tl.constexpr,  # every program zeroes its share of zero_ptr, for GEMM2 to add into
    TAIL: tl.constexpr,  # an expert's last row tile at BLOCK_M / 2 (or / 4 with 2) rows where its slots fit
    amax_ptr,  # AMAX_OUT: [grid] float32, each program's absolute maximum of the h it wrote (0 where none)
    AMAX_OUT: tl.constexpr,  # SPLIT_K == 1, h not quantized here: for a dynamic per-tensor scale of h
    SCALE_N: tl.constexpr = 128,  # QUANT 2: weight rows per scale block (the K side is BLOCK_K)
):
    pid_m, pid_n = _tile_coords(tl.program_id(0) // SPLIT_K, max_pid_m, N, BLOCK_M, BLOCK_N, GROUP_M)
    slot, expert, valid = _tile_slots(pid_m, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, num_slots, BLOCK_M,
                                      DIRECT, PDL)
    if ZERO:  # after _tile_slots' wait: an earlier launch may still be writing the sums' memory
        _zero_share(zero_ptr, zero_numel)
    if valid:
        rows = _tile_rows(slot, num_slots, BLOCK_M, TAIL)
        for i in tl.static_range(TAIL + 1):  # a path per tile height: BLOCK_M, then the tails'
            if rows == BLOCK_M >> i:
                _gemm1_tile(_head_slots(slot, sorted_ids_ptr, pid_m, BLOCK_M, BLOCK_M >> i), expert, pid_n, x_ptr,
                            w_ptr, h_ptr, h_scale_ptr, x_scale_ptr, w_scale_ptr, num_slots, N, K, stride_xm, stride_we,
                            stride_wn, stride_hm, stride_split, stride_hsm, stride_xsm, stride_xsk, stride_wse,
                            stride_wsn, stride_wsk, w_desc, amax_ptr, TOPK, BLOCK_M >> i, BLOCK_N, BLOCK_K, SWAP_AB,
                            QUANT, SPLIT_K, MERGED, EVEN_K, EVEN_N, STATIC_OUT, GROUP_OUT, ROUND_FIRST, X_QUANT, TMA_W,
                            AMAX_OUT, SCALE_N)
    elif AMAX_OUT:
        tl.store(amax_ptr + tl.program_id(0), 0.0)



@triton.jit
def _gemm1_tile(slot, expert, pid_n, x_ptr, w_ptr, h_ptr, h_scale_ptr, x_scale_ptr, w_scale_ptr, num_slots, N, K,
                stride_xm, stride_we, stride_wn, stride_hm, stride_split, stride_hsm, stride_xsm, stride_xsk,
                stride_wse, stride_wsn, stride_wsk, w_desc, amax_ptr, TOPK: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SWAP_AB: tl.constexpr, QUANT: tl.constexpr,
                SPLIT_K: tl.constexpr, MERGED: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
                STATIC_OUT: tl.constexpr, GROUP_OUT: tl.constexpr, ROUND_FIRST: tl.constexpr, X_QUANT: tl.constexpr,
                TMA_W: tl.constexpr, AMAX_OUT: tl.constexpr, SCALE_N: tl.constexpr):
    """One GEMM1 tile of the slots ``slot`` [BLOCK_M] of ``expert``, columns ``pid_n``: its K loop and epilogue
    (the arguments are the kernel's)."""
    row_ok = slot < num_slots
    tok = tl.where(row_ok, slot // TOPK, 0).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)

    k_first, k_last = _k_share(tl.cdiv(K, BLOCK_K), SPLIT_K)  # this program's K steps

    a_ptrs = x_ptr + _grid(tok * stride_xm, offs_k + k_first * BLOCK_K, SWAP_AB)  # [BM, BK] or [BK, BM]
    w_ptr += expert * stride_we
    if MERGED:
        acc_g, acc_u = _gemm1_loop_merged(a_ptrs, w_ptr, x_scale_ptr, w_scale_ptr, tok, expert, row_ok, pid_n,
                                          offs_k, k_first, k_last, N, K, stride_wn, stride_xsm, stride_xsk,
                                          stride_wse, stride_wsn, stride_wsk, BLOCK_M, BLOCK_N, BLOCK_K, SWAP_AB,
                                          QUANT, EVEN_K, EVEN_N, X_QUANT, ROUND_FIRST, SCALE_N)
    else:
        acc_g, acc_u = _gemm1_loop_pair(a_ptrs, w_ptr, x_scale_ptr, w_scale_ptr, tok, expert, row_ok,
                                        pid_n * BLOCK_N, offs_n, n_ok, offs_k, k_first, k_last, N, K, stride_wn,
                                        stride_xsm, stride_xsk, stride_wse, stride_wsn, stride_wsk, BLOCK_M,
                                        BLOCK_N, BLOCK_K, SWAP_AB, QUANT, EVEN_K, EVEN_N, X_QUANT,
                                        ROUND_FIRST, w_desc, TMA_W, SCALE_N)  # [BM, BN] or [BN, BM] each

    slot_safe = tl.where(row_ok, slot, 0).to(tl.int64)
    mask = _grid_and(row_ok, n_ok, SWAP_AB)
    if SPLIT_K == 1:
        h = acc_g * tl.sigmoid(acc_g) * acc_u  # silu(gate) * up
        h_ptrs = h_ptr + _grid(slot_safe * stride_hm, offs_n, SWAP_AB)
        if STATIC_OUT:  # GEMM2's fp8 input, with no quantization launch
            h = tl.minimum(tl.maximum(h / tl.load(h_scale_ptr), -448.0), 448.0)
            tl.store(h_ptrs, to_fp8(h, h_ptr.dtype.element_ty, ROUND_FIRST), mask=mask)
        elif GROUP_OUT:  # GEMM2's block-scaled fp8 input: each token row of the tile is one group
            h = tl.where(mask, h, 0.0)  # columns past N (with TMA_W, read from other rows) out of the max
            q, scale = quantize_groups_of(h, 0 if SWAP_AB else 1, h_ptr.dtype.element_ty, ROUND_FIRST)  # [BM]
            tl.store(h_ptrs, q, mask=mask)
            tl.store(h_scale_ptr + slot_safe * stride_hsm + pid_n, scale, mask=row_ok)
        else:
            h = h.to(h_ptr.dtype.element_ty)
            tl.store(h_ptrs, h, mask=mask)
            if AMAX_OUT:  # the maximum of the values stored, so h's scale is the one a launch would find
                tl.store(amax_ptr + tl.program_id(0), tl.max(tl.where(mask, tl.abs(h.to(tl.float32)), 0.0)))
    else:  # this split's partial sums; _swiglu adds the splits' and applies the activation
        split = (tl.program_id(0) % SPLIT_K).to(tl.int64)
        gu_ptrs = h_ptr + split * stride_split + _grid(slot_safe * stride_hm, offs_n, SWAP_AB)
        tl.store(gu_ptrs, acc_g, mask=mask)
        tl.store(gu_ptrs + N, acc_u, mask=mask)


# Elements per store of GEMM1's zeroing of the sums (``_zero_share``): 2 KB of bf16, 4 KB of float32.
ZERO_BLOCK = tl.constexpr(1024)
# The largest sums GEMM1 zeroes (bytes); larger ones are zeroed before it, by x's quantization launch at
# fp8-block128, else by a launch of their own: beyond about this size the zeroing stops hiding in GEMM1.
ZERO_IN_GEMM1_BYTES = 1 << 20


@triton.jit
def _zero_share(ptr, numel):
    """Zero this program's share of the ``numel`` elements from ``ptr``: each program of the grid (valid
    tile or not) a run of whole ZERO_BLOCKs, stored with no mask (so in 16-byte vectors), and program 0
    the last partial block."""
    zeros = tl.zeros((ZERO_BLOCK,), dtype=ptr.dtype.element_ty)
    full = numel // ZERO_BLOCK  # blocks wholly inside
    share = tl.cdiv(full, tl.num_programs(0))  # blocks per program
    first = tl.program_id(0).to(tl.int64) * share
    for block in range(first, tl.minimum(first + share, full)):
        tl.store(ptr + block * ZERO_BLOCK + tl.arange(0, ZERO_BLOCK), zeros)
    if tl.program_id(0) == 0:
        offs = full.to(tl.int64) * ZERO_BLOCK + tl.arange(0, ZERO_BLOCK)
        tl.store(ptr + offs, zeros, mask=offs < numel)


@triton.jit
def _gemm1_loop_pair(a_ptrs, w_ptr, x_scale_ptr, w_scale_ptr, tok, expert, row_ok, n_first, offs_n, n_ok, offs_k,
                     k_first, k_last, N, K, stride_wn, stride_xsm, stride_xsk, stride_wse, stride_wsn, stride_wsk,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SWAP_AB: tl.constexpr,
                     QUANT: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, X_QUANT: tl.constexpr,
                     ROUND_FIRST: tl.constexpr, w_desc, TMA_W: tl.constexpr, SCALE_N: tl.constexpr):
    """GEMM1's K steps ``[k_first, k_last)`` of one tile as a gate MMA and an up MMA per step:
    the gate and up accumulators, [BM, BN] each ([BN, BM] swapped). ``w_ptr`` is the expert's w13.

    With ``EVEN_K`` the loads carry no K mask (``_load_a``); with ``EVEN_N`` too, the weight loads carry
    no mask at all, and with block scales the tile's gate (and up) columns lie in one SCALE_N-row weight block
    (BLOCK_N divides SCALE_N and N), so each K step reads one gate and one up scale and scales the product by
    a per-token vector: one FMA per element.

    ``TMA_W``: the gate and up tiles are read by TMA through ``w_desc`` (rows of w13 as [E * 2N, K]), with
    no pointer tensors; past K, TMA reads zeros, and rows past N (the up rows, or the next expert's) feed
    only columns the store masks."""
    g_row = (expert * 2 * N + n_first).to(tl.int32)  # TMA_W: the gate tile's first row of w13 as [E * 2N, K]
    g_ptrs = w_ptr + _grid(offs_k + k_first * BLOCK_K, offs_n * stride_wn, SWAP_AB)  # [BK, BN] or [BN, BK]
    u_ptrs = g_ptrs + N * stride_wn
    acc_g = tl.zeros((BLOCK_N, BLOCK_M) if SWAP_AB else (BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N, BLOCK_M) if SWAP_AB else (BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_first, k_last):
        k_ok = offs_k < K - k * BLOCK_K
        if TMA_W:
            g = w_desc.load([g_row, k * BLOCK_K])  # [BN, BK]
            u = w_desc.load([g_row + N, k * BLOCK_K])
            if not SWAP_AB:
                g = g.T
                u = u.T
        else:
            b_mask = _grid_and(k_ok, n_ok, SWAP_AB)
            g = _load(g_ptrs, b_mask, EVEN_K and EVEN_N)
            u = _load(u_ptrs, b_mask, EVEN_K and EVEN_N)
        if QUANT == 2:  # SCALE_N x BLOCK_K blocks: scale each K step's partial product
            a, xs = _a_block128(a_ptrs, x_scale_ptr, tok, k, row_ok, k_ok, stride_xsm, stride_xsk,
                                w_ptr.dtype.element_ty, EVEN_K, SWAP_AB, X_QUANT, ROUND_FIRST)  # xs [BM]
            ws = w_scale_ptr + expert * stride_wse + k * stride_wsk
            # one block per tile: passed as an expression, which stays a constexpr (a local does not)
            g_scale = _block_scale(xs, ws, n_first, offs_n, n_ok, stride_wsn, EVEN_N and BLOCK_N <= SCALE_N, SWAP_AB,
                                   SCALE_N)
            u_scale = _block_scale(xs, ws, N + n_first, N + offs_n, n_ok, stride_wsn, EVEN_N and BLOCK_N <= SCALE_N,
                                   SWAP_AB, SCALE_N)
            acc_g += _mma(a, g, tl.zeros_like(acc_g), SWAP_AB) * g_scale
            acc_u += _mma(a, u, tl.zeros_like(acc_u), SWAP_AB) * u_scale
        else:
            a = _load_a(a_ptrs, row_ok, k_ok, EVEN_K, SWAP_AB)
            acc_g = _mma(a, g, acc_g, SWAP_AB)
            acc_u = _mma(a, u, acc_u, SWAP_AB)
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    if QUANT == 1:  # per-token activation scale x per-column weight scale, once
        xs = tl.load(x_scale_ptr + tok * stride_xsm)  # [BM]
        ws = w_scale_ptr + expert * stride_wse
        acc_g *= _grid_mul(xs, tl.load(ws + offs_n * stride_wsn, mask=n_ok, other=0.0), SWAP_AB)
        acc_u *= _grid_mul(xs, tl.load(ws + (N + offs_n) * stride_wsn, mask=n_ok, other=0.0), SWAP_AB)
    return acc_g, acc_u


@triton.jit
def _gemm1_loop_merged(a_ptrs, w_ptr, x_scale_ptr, w_scale_ptr, tok, expert, row_ok, pid_n, offs_k, k_first,
                       k_last, N, K, stride_wn, stride_xsm, stride_xsk, stride_wse, stride_wsn, stride_wsk,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SWAP_AB: tl.constexpr,
                       QUANT: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, X_QUANT: tl.constexpr,
                       ROUND_FIRST: tl.constexpr, SCALE_N: tl.constexpr):
    """As ``_gemm1_loop_pair``, with one MMA per K step over a B tile of 2*BLOCK_N weight rows, gate row n
    and up row n side by side ([BM, BK] x [BK, 2BN], swapped [2BN, BK] x [BK, BM]); the accumulator is
    parted into gate and up after the loop (``_halves``)."""
    offs_c = tl.arange(0, 2 * BLOCK_N)
    col = pid_n * BLOCK_N + offs_c // 2  # [2BN] the column of h each B column feeds
    w_rows = col + (offs_c % 2) * N  # [2BN] even: gate row, odd: up row
    c_ok = col < N
    b_ptrs = w_ptr + _grid(offs_k + k_first * BLOCK_K, w_rows * stride_wn, SWAP_AB)  # [BK, 2BN] or [2BN, BK]
    acc = tl.zeros((2 * BLOCK_N, BLOCK_M) if SWAP_AB else (BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
    for k in range(k_first, k_last):
        k_ok = offs_k < K - k * BLOCK_K
        b = _load(b_ptrs, _grid_and(k_ok, c_ok, SWAP_AB), EVEN_K and EVEN_N)
        if QUANT == 2:
            a, xs = _a_block128(a_ptrs, x_scale_ptr, tok, k, row_ok, k_ok, stride_xsm, stride_xsk,
                                w_ptr.dtype.element_ty, EVEN_K, SWAP_AB, X_QUANT, ROUND_FIRST)  # xs [BM]
            ws = tl.load(w_scale_ptr + expert * stride_wse + k * stride_wsk + (w_rows // SCALE_N) * stride_wsn,
                         mask=c_ok, other=0.0)  # [2BN]
            acc += _mma(a, b, tl.zeros_like(acc), SWAP_AB) * _grid_mul(xs, ws, SWAP_AB)
        else:
            acc = _mma(_load_a(a_ptrs, row_ok, k_ok, EVEN_K, SWAP_AB), b, acc, SWAP_AB)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if QUANT == 1:
        xs = tl.load(x_scale_ptr + tok * stride_xsm)  # [BM]
        ws = tl.load(w_scale_ptr + expert * stride_wse + w_rows * stride_wsn, mask=c_ok, other=0.0)  # [2BN]
        acc *= _grid_mul(xs, ws, SWAP_AB)
    return _halves(acc, BLOCK_M, BLOCK_N, SWAP_AB)


@triton.jit
def _split_sum(gu_ptr, offs, ok, stride_split, SPLIT_K: tl.constexpr):
    """The splits' partials at ``offs`` of one [T, 2N] slice, added in split order."""
    acc = tl.load(gu_ptr + offs, mask=ok, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(gu_ptr + s * stride_split + offs, mask=ok, other=0.0)
    return acc


@triton.jit(do_not_specialize=["stride_split"])
def _swiglu(gu_ptr, h_ptr, h_scale_ptr, N, stride_hsm, stride_split, SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr,
            QUANT_OUT: tl.constexpr, BLOCK_G: tl.constexpr, ROUND_FIRST: tl.constexpr, PDL: tl.constexpr,
            GROUP: tl.constexpr = 128):
    """h[r] = silu(gate) * up for one row r per program after a split-K GEMM1, where gate and up are the
    sums over the SPLIT_K slices of ``gu`` [SPLIT_K, T, 2N] of its row's [:N] and [N:].

    With ``QUANT_OUT`` h is written as fp8 with one scale per 1 x GROUP group (GEMM2's block-scaled fp8
    input, with no quantization launch of its own), BLOCK_G groups at a time as one [BLOCK_G, GROUP] tile.
    """
    row = tl.program_id(0).to(tl.int64)
    dependent.start(PDL)
    if QUANT_OUT:
        for n in range(0, N, BLOCK_G * GROUP):
            groups = n // GROUP + tl.arange(0, BLOCK_G)  # [BLOCK_G]
            offs = groups[:, None] * GROUP + tl.arange(0, GROUP)[None, :]  # [BLOCK_G, GROUP]
            ok = offs < N
            g = _split_sum(gu_ptr, row * 2 * N + offs, ok, stride_split, SPLIT_K)
            u = _split_sum(gu_ptr, row * 2 * N + N + offs, ok, stride_split, SPLIT_K)
            h = g * tl.sigmoid(g) * u
            q, scale = quantize_groups_of(h, 1, h_ptr.dtype.element_ty, ROUND_FIRST)  # scale [BLOCK_G]
            tl.store(h_ptr + row * N + offs, q, mask=ok)
            tl.store(h_scale_ptr + row * stride_hsm + groups, scale, mask=groups * GROUP < N)
    else:
        for n in range(0, N, BLOCK_N):
            offs = n + tl.arange(0, BLOCK_N)
            ok = offs < N
            g = _split_sum(gu_ptr, row * 2 * N + offs, ok, stride_split, SPLIT_K)
            u = _split_sum(gu_ptr, row * 2 * N + N + offs, ok, stride_split, SPLIT_K)
            tl.store(h_ptr + row * N + offs, (g * tl.sigmoid(g) * u).to(h_ptr.dtype.element_ty), mask=ok)

