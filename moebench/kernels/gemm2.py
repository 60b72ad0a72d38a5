"""GEMM2 of the fused MoE: ``y[t] += w[t, j] * h[s] @ w2[e].T`` per tile of one expert's slots, and the top-k sum.

1. A program takes a row tile of slots and one or more (``N_TILES``) column tiles of the output;
2. its K loop (over I) multiplies h by the expert's w2 rows, with a share of the K steps under split-K;
3. the epilogue scales each slot's row by its routed weight and adds it into its token's row with relaxed
   atomics (``ATOMIC_SUM``: only atomicity is needed, the sums are read after the launch), or stores it as
   the slot's row, which ``_topk_sum`` then adds over each token's top-k slots.
``h [T, I]``, ``w2 [E, hidden, I]``, output ``[M, hidden]``; slot ``s = t * topk + j``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from moebench.kernels import pdl as dependent
from moebench.kernels.tiles import (
    _block_scale,
    _grid,
    _grid_and,
    _grid_mul,
    _head_slots,
    _k_share,
    _load,
    _load_a,
    _mma,
    _tile_coords,
    _tile_rows,
    _tile_slots,
)


@triton.jit(do_not_specialize=["num_slots", "max_pid_m"])
def _gemm2_combine(
    h_ptr,  # [T, K] activation from GEMM1 (fp8 when QUANT)
    w_ptr,  # [E, N, K]
    out_ptr,  # ATOMIC_SUM: [M, N] float32 or the output, zeroed, a token's slots add into its row; else [T, N] by slot
    h_scale_ptr,  # QUANT 1: [T] (stride 0 for one tensor scale); QUANT 2: [T, cdiv(K, BLOCK_K)]
    w_scale_ptr,  # QUANT 1: [E, N] (stride 0 per tensor); QUANT 2: [E, cdiv(N, SCALE_N), cdiv(K, BLOCK_K)]
    topk_weights_ptr,  # [T] float32 routed weights, row-major [M, topk]
    sorted_ids_ptr,
    expert_ids_ptr,
    num_padded_ptr,
    num_slots,
    max_pid_m,
    N,  # hidden
    K,  # I
    stride_hm,
    stride_we,
    stride_wn,
    stride_om,
    stride_hsm,
    stride_hsk,
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
    ATOMIC_SUM: tl.constexpr,
    DIRECT: tl.constexpr,
    N_TILES: tl.constexpr,  # column tiles per program (gemm2_n_tiles)
    SPLIT_K: tl.constexpr,  # programs per tile, each over a share of the K steps (gemm2_split_k; ATOMIC_SUM)
    PDL: tl.constexpr,  # as in _gemm1_swiglu
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0
    EVEN_N: tl.constexpr,  # N % (BLOCK_N * N_TILES) == 0: every program's column tiles lie within N
    COLUMNS_FIRST: tl.constexpr,  # every row tile of a column chunk before the next (gemm2_columns_first)
    PRELOAD: tl.constexpr,  # DIRECT, N_TILES == 1: the first two K steps' weights loaded before the wait
    TAIL: tl.constexpr,  # as in _gemm1_swiglu
    SCALE_N: tl.constexpr = 128,  # QUANT 2: weight rows per scale block (the K side is BLOCK_K)
):
    pid_m, pid_n = _tile_coords(tl.program_id(0) // SPLIT_K, max_pid_m, N, BLOCK_M, BLOCK_N * N_TILES, GROUP_M,
                                COLUMNS_FIRST)
    slot, expert, valid = _tile_slots(pid_m, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, num_slots, BLOCK_M,
                                      DIRECT, PDL, WAIT_DIRECT=not PRELOAD)
    b0, b1 = None, None
    if PRELOAD:  # the first two K steps' weights, an input of the layer, read while the launch before ends
        b0, b1 = _gemm2_preload(w_ptr, expert, valid, pid_n, N, K, stride_we, stride_wn, BLOCK_N, BLOCK_K, SWAP_AB,
                                SPLIT_K)
        dependent.wait(PDL)  # every program waits, valid or not
    if valid:
        rows = _tile_rows(slot, num_slots, BLOCK_M, TAIL)
        for i in tl.static_range(TAIL + 1):  # a path per tile height, as in GEMM1
            if rows == BLOCK_M >> i:
                _gemm2_tile(_head_slots(slot, sorted_ids_ptr, pid_m, BLOCK_M, BLOCK_M >> i), expert, pid_n, b0, b1,
                            h_ptr, w_ptr, out_ptr, h_scale_ptr, w_scale_ptr, topk_weights_ptr, num_slots, N, K,
                            stride_hm, stride_we, stride_wn, stride_om, stride_hsm, stride_hsk, stride_wse, stride_wsn,
                            stride_wsk, TOPK, BLOCK_M >> i, BLOCK_N, BLOCK_K, SWAP_AB, QUANT, ATOMIC_SUM, N_TILES,
                            SPLIT_K, EVEN_K, EVEN_N, PRELOAD, SCALE_N)


@triton.jit
def _gemm2_tile(slot, expert, pid_n, b0, b1, h_ptr, w_ptr, out_ptr, h_scale_ptr, w_scale_ptr, topk_weights_ptr,
                num_slots, N, K, stride_hm, stride_we, stride_wn, stride_om, stride_hsm, stride_hsk, stride_wse,
                stride_wsn, stride_wsk, TOPK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, SWAP_AB: tl.constexpr, QUANT: tl.constexpr, ATOMIC_SUM: tl.constexpr,
                N_TILES: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
                PRELOAD: tl.constexpr, SCALE_N: tl.constexpr):
    """One GEMM2 program's tile of the slots ``slot`` [BLOCK_M] of ``expert``, column chunk ``pid_n``: its
    K loop(s) and epilogue(s); ``b0``, ``b1`` the preloaded weights (PRELOAD). The arguments are the kernel's."""
    row_ok = slot < num_slots
    slot_safe = tl.where(row_ok, slot, 0).to(tl.int64)
    n_first = pid_n * N_TILES * BLOCK_N
    offs_n = n_first + tl.arange(0, BLOCK_N)  # the first column tile
    offs_k = tl.arange(0, BLOCK_K)

    a_ptrs = h_ptr + _grid(slot_safe * stride_hm, offs_k, SWAP_AB)
    b_ptrs = w_ptr + expert * stride_we + _grid(offs_k, offs_n * stride_wn, SWAP_AB)
    acc = tl.zeros((BLOCK_N, BLOCK_M) if SWAP_AB else (BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_steps = tl.cdiv(K, BLOCK_K)
    if N_TILES == 1:
        # This program's share of the K steps: with SPLIT_K > 1 one split's, whose partial sum the atomic
        # epilogue adds like another slot's (the routed weight scales each share alike).
        k_first, k_last = _k_share(k_steps, SPLIT_K)
        a_ptrs += k_first * BLOCK_K
        b_ptrs += k_first * BLOCK_K
        if PRELOAD:  # its first two steps with the weights read before the wait
            for i in tl.static_range(2):
                if k_first + i < k_last:
                    a = _load_a(a_ptrs + i * BLOCK_K, row_ok, offs_k < K - (k_first + i) * BLOCK_K, EVEN_K,
                                SWAP_AB)
                    acc = _gemm2_mma(acc, a, b1 if i else b0, k_first + i, n_first, offs_n, offs_n < N, slot_safe,
                                     expert, h_scale_ptr, w_scale_ptr, stride_hsm, stride_hsk, stride_wse,
                                     stride_wsn, stride_wsk, BLOCK_N, SWAP_AB, QUANT, EVEN_N, SCALE_N)
            k_first += 2
            a_ptrs += 2 * BLOCK_K
            b_ptrs += 2 * BLOCK_K
        for k in range(k_first, k_last):
            acc = _gemm2_step(acc, a_ptrs, b_ptrs, k, offs_k, n_first, offs_n, row_ok, slot_safe, expert,
                              h_scale_ptr, w_scale_ptr, K, N, stride_hsm, stride_hsk, stride_wse, stride_wsn,
                              stride_wsk, BLOCK_N, BLOCK_K, SWAP_AB, QUANT, EVEN_K, EVEN_N, SCALE_N)
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K
        _gemm2_epilogue(acc, slot_safe, row_ok, offs_n, expert, out_ptr, topk_weights_ptr, h_scale_ptr,
                        w_scale_ptr, N, stride_om, stride_hsm, stride_wse, stride_wsn, TOPK, BLOCK_N, SWAP_AB,
                        QUANT, ATOMIC_SUM)
    else:
        # One loop over the column tiles x the K steps, so the loads run ahead across column tiles.
        for t in range(0, N_TILES * k_steps):
            j = t // k_steps
            k = t - j * k_steps
            acc = _gemm2_step(acc, a_ptrs + k * BLOCK_K, b_ptrs + (j * BLOCK_N * stride_wn + k * BLOCK_K), k,
                              offs_k, n_first + j * BLOCK_N, offs_n + j * BLOCK_N, row_ok, slot_safe, expert,
                              h_scale_ptr, w_scale_ptr, K, N, stride_hsm, stride_hsk, stride_wse, stride_wsn,
                              stride_wsk, BLOCK_N, BLOCK_K, SWAP_AB, QUANT, EVEN_K, EVEN_N, SCALE_N)
            if k == k_steps - 1:
                _gemm2_epilogue(acc, slot_safe, row_ok, offs_n + j * BLOCK_N, expert, out_ptr,
                                topk_weights_ptr, h_scale_ptr, w_scale_ptr, N, stride_om, stride_hsm, stride_wse,
                                stride_wsn, TOPK, BLOCK_N, SWAP_AB, QUANT, ATOMIC_SUM)
                acc = tl.zeros_like(acc)


@triton.jit
def _gemm2_preload(w_ptr, expert, valid, pid_n, N, K, stride_we, stride_wn, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, SWAP_AB: tl.constexpr, SPLIT_K: tl.constexpr):
    """``gemm2_preload`` (a tile per slot, one column tile per program): the weight tiles of the program's
    first two K steps, read before it waits for the launch before it; zeros (nothing read) for a step past
    its share or a program past the slots."""
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    k_first, k_last = _k_share(tl.cdiv(K, BLOCK_K), SPLIT_K)
    b_ptrs = w_ptr + expert * stride_we + _grid(offs_k + k_first * BLOCK_K, offs_n * stride_wn, SWAP_AB)
    b0 = _gemm2_load_b(b_ptrs, k_first, offs_k, offs_n, K, N, valid & (k_first < k_last), BLOCK_K, SWAP_AB)
    b1 = _gemm2_load_b(b_ptrs + BLOCK_K, k_first + 1, offs_k, offs_n, K, N, valid & (k_first + 1 < k_last),
                       BLOCK_K, SWAP_AB)
    return b0, b1


@triton.jit
def _gemm2_step(acc, a_ptrs, b_ptrs, k, offs_k, n_first, offs_n, row_ok, slot_safe, expert, h_scale_ptr, w_scale_ptr,
                K, N, stride_hsm, stride_hsk, stride_wse, stride_wsn, stride_wsk, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, SWAP_AB: tl.constexpr, QUANT: tl.constexpr, EVEN_K: tl.constexpr,
                EVEN_N: tl.constexpr, SCALE_N: tl.constexpr):
    """acc plus K step ``k`` of one column tile (``a_ptrs`` / ``b_ptrs`` at that step, columns ``offs_n``
    from ``n_first``); the masks and block weight scales as in ``_gemm1_loop_pair``."""
    k_ok = offs_k < K - k * BLOCK_K
    n_ok = offs_n < N
    a = _load_a(a_ptrs, row_ok, k_ok, EVEN_K, SWAP_AB)
    b = _load(b_ptrs, _grid_and(k_ok, n_ok, SWAP_AB), EVEN_K and EVEN_N)
    return _gemm2_mma(acc, a, b, k, n_first, offs_n, n_ok, slot_safe, expert, h_scale_ptr, w_scale_ptr,
                      stride_hsm, stride_hsk, stride_wse, stride_wsn, stride_wsk, BLOCK_N, SWAP_AB, QUANT, EVEN_N,
                      SCALE_N)


@triton.jit
def _gemm2_load_b(b_ptrs, k, offs_k, offs_n, K, N, ok, BLOCK_K: tl.constexpr, SWAP_AB: tl.constexpr):
    """K step ``k``'s weight tile, masked, all zeros (nothing read) where ``ok`` is false: for
    ``gemm2_preload``, read before the program waits."""
    k_end = tl.where(ok, K, 0)  # the scalar folded into the K bound, not and-ed into the mask
    return tl.load(b_ptrs, mask=_grid_and(offs_k < k_end - k * BLOCK_K, offs_n < N, SWAP_AB), other=0.0)


@triton.jit
def _gemm2_mma(acc, a, b, k, n_first, offs_n, n_ok, slot_safe, expert, h_scale_ptr, w_scale_ptr, stride_hsm,
               stride_hsk, stride_wse, stride_wsn, stride_wsk, BLOCK_N: tl.constexpr, SWAP_AB: tl.constexpr,
               QUANT: tl.constexpr, EVEN_N: tl.constexpr, SCALE_N: tl.constexpr):
    """acc plus K step ``k`` of one column tile from its loaded operand tiles (``_gemm2_step``)."""
    if QUANT == 2:
        hs = tl.load(h_scale_ptr + slot_safe * stride_hsm + k * stride_hsk)  # [BM]
        ws = w_scale_ptr + expert * stride_wse + k * stride_wsk
        scale = _block_scale(hs, ws, n_first, offs_n, n_ok, stride_wsn, EVEN_N and BLOCK_N <= SCALE_N, SWAP_AB,
                             SCALE_N)
        return acc + _mma(a, b, tl.zeros_like(acc), SWAP_AB) * scale
    else:
        return _mma(a, b, acc, SWAP_AB)


@triton.jit
def _gemm2_epilogue(acc, slot_safe, row_ok, offs_n, expert, out_ptr, topk_weights_ptr, h_scale_ptr, w_scale_ptr,
                    N, stride_om, stride_hsm, stride_wse, stride_wsn, TOPK: tl.constexpr, BLOCK_N: tl.constexpr,
                    SWAP_AB: tl.constexpr, QUANT: tl.constexpr, ATOMIC_SUM: tl.constexpr):
    """One column tile of GEMM2's output, scaled by the routed weights (and QUANT 1's row and column
    scales), added into each token's row (ATOMIC_SUM) or stored as each slot's row."""
    n_ok = offs_n < N
    routed = tl.load(topk_weights_ptr + slot_safe, mask=row_ok, other=0.0)  # [BLOCK_M]
    if QUANT == 1:
        routed *= tl.load(h_scale_ptr + slot_safe * stride_hsm)
        ws = tl.load(w_scale_ptr + expert * stride_wse + offs_n * stride_wsn, mask=n_ok, other=0.0)
        acc *= _grid_mul(routed, ws, SWAP_AB)
    else:
        acc *= _grid_mul(routed, tl.full((BLOCK_N,), 1.0, tl.float32), SWAP_AB)
    mask = _grid_and(row_ok, n_ok, SWAP_AB)
    if ATOMIC_SUM:
        tok = slot_safe // TOPK
        tl.atomic_add(out_ptr + _grid(tok * stride_om, offs_n, SWAP_AB), acc.to(out_ptr.dtype.element_ty), mask=mask,
                      sem="relaxed")
    else:
        tl.store(out_ptr + _grid(slot_safe * stride_om, offs_n, SWAP_AB), acc.to(out_ptr.dtype.element_ty),
                 mask=mask)


# Columns per program of the top-k sum: 8 rows of 1024 bf16 columns (16 KB) in flight per program.
TOPK_SUM_BLOCK = 1024


@triton.jit
def _topk_sum(rows_ptr, out_ptr, N, stride_r, stride_o, TOPK: tl.constexpr, BLOCK_N: tl.constexpr,
              PDL: tl.constexpr):
    """out[m, cols] = sum over j of rows[m * TOPK + j, cols] in float32, for the stored top-k sum.

    Grid (M, cdiv(N, BLOCK_N)). It replaces ``torch.sum(rows.view(M, topk, N), dim=1)``, whose
    general reduction kernel is slower at both ends (large M and decode), and it can be a dependent launch.
    """
    dependent.start(PDL)
    m = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = cols < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in tl.static_range(TOPK):
        acc += tl.load(rows_ptr + (m * TOPK + j) * stride_r + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * stride_o + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)

