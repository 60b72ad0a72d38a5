"""Tile helpers shared by the two grouped GEMMs (``gemm1.py``, ``gemm2.py``).

A tile is ``BLOCK_M`` token slots of one expert by ``BLOCK_N`` output columns. Swap-AB (``SWAP_AB``)
computes it transposed, ``C^T = W . X^T``, so the expert's rows fill the 64-row operand of Hopper's
``wgmma`` and the few slots are the narrow side: every tile index goes through ``_grid``, which lays a
(slot, column) pair out as ``[BM, BN]`` or, swapped, ``[BN, BM]``, and nothing is transposed in registers.
``_tile_slots`` gives a program its row tile's slots and expert, from the align's output or, with a tile
per slot (``DIRECT``), from ``topk_ids``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from moebench.kernels import pdl as dependent
from moebench.kernels.act_quant import quantize_groups_of

# The kernels' QUANT: no fp8; one scale per token row of A and per output column of B, applied once after
# the K loop (a per-tensor scale passes one value with stride 0); weight blocks of SCALE_N x SCALE_K
# (128x128 by default) and 1 x SCALE_K activation groups, applied at every K step (BLOCK_K = SCALE_K).
QUANT_NONE, QUANT_ROWCOL, QUANT_BLOCK = 0, 1, 2
QUANT_OF_SCHEME = {None: QUANT_NONE, "tensor": QUANT_ROWCOL, "channel": QUANT_ROWCOL, "block128": QUANT_BLOCK}


@triton.jit
def _grid(m_vec, n_vec, SWAP_AB: tl.constexpr):
    """Outer sum of a per-token vector [BM] and a per-column vector [BN] in the tile's layout."""
    if SWAP_AB:
        return n_vec[:, None] + m_vec[None, :]  # [BN, BM]
    else:
        return m_vec[:, None] + n_vec[None, :]  # [BM, BN]


@triton.jit
def _grid_and(m_vec, n_vec, SWAP_AB: tl.constexpr):
    if SWAP_AB:
        return n_vec[:, None] & m_vec[None, :]
    else:
        return m_vec[:, None] & n_vec[None, :]


@triton.jit
def _grid_mul(m_vec, n_vec, SWAP_AB: tl.constexpr):
    if SWAP_AB:
        return n_vec[:, None] * m_vec[None, :]
    else:
        return m_vec[:, None] * n_vec[None, :]


@triton.jit
def _per_token(v, SWAP_AB: tl.constexpr):
    """A per-token vector [BM] broadcast over the tile's columns: [BM, 1] or, swapped, [1, BM]."""
    if SWAP_AB:
        return v[None, :]
    else:
        return v[:, None]


@triton.jit
def _load(ptrs, mask, IN_BOUNDS: tl.constexpr):
    """``ptrs`` loaded under ``mask`` (0 where false), or with no mask where the caller knows every pointer
    is in bounds: the mask's predicates then cost no instructions in the K loop."""
    if IN_BOUNDS:
        return tl.load(ptrs)
    else:
        return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _load_a(a_ptrs, row_ok, k_ok, EVEN_K: tl.constexpr, SWAP_AB: tl.constexpr):
    """A K step's token rows. The rows of padding slots point at token 0, in bounds, but stay masked:
    unmasked, every padding row of every tile would read token 0's row again. With ``EVEN_K`` that
    loop-invariant row mask is the only one."""
    if EVEN_K:
        return tl.load(a_ptrs, mask=_per_token(row_ok, SWAP_AB), other=0.0)
    else:
        return tl.load(a_ptrs, mask=_grid_and(row_ok, k_ok, SWAP_AB), other=0.0)


@triton.jit
def _a_block128(a_ptrs, x_scale_ptr, tok, k, row_ok, k_ok, stride_xsm, stride_xsk, fp8_dtype: tl.constexpr,
                EVEN_K: tl.constexpr, SWAP_AB: tl.constexpr, X_QUANT: tl.constexpr, ROUND_FIRST: tl.constexpr):
    """fp8 block-scaled K step ``k``: the token rows in fp8 and their 1 x BLOCK_K group scales [BM].

    ``X_QUANT`` (``gemm1_quant_x``, with a tile per slot): the rows are read in x's dtype and quantized
    here by ``act_quant.quantize_groups_of``, as the quantization launch does (the same bits), so x needs no
    quantization launch. The conversion stands between each step's load and its MMA, so it pays where a
    program walks few K steps (decode): a tile-config field the tuner tries there."""
    a = _load_a(a_ptrs, row_ok, k_ok, EVEN_K, SWAP_AB)
    if X_QUANT:  # a [BK, BM] swapped, else [BM, BK]: a token's group is a column, else a row
        a, xs = quantize_groups_of(a.to(tl.float32), 0 if SWAP_AB else 1, fp8_dtype, ROUND_FIRST)
    else:
        xs = tl.load(x_scale_ptr + tok * stride_xsm + k * stride_xsk)
    return a, xs


@triton.jit
def _block_scale(xs, ws, n_first, offs_n, n_ok, stride_wsn, ONE_BLOCK: tl.constexpr, SWAP_AB: tl.constexpr,
                 SCALE_N: tl.constexpr):
    """fp8 block scales: the scale of one K step's product, the token rows' group scales ``xs`` [BM] times the
    weight-block scale of each column (``ws``: the expert's scales at this K step, a row per SCALE_N weight
    rows). With ``ONE_BLOCK`` the tile's columns from ``n_first`` lie in one block (EVEN_N, BLOCK_N <= SCALE_N):
    one weight scale, so a per-token vector; else one per column ``offs_n``, masked by ``n_ok``."""
    if ONE_BLOCK:
        return _per_token(xs * tl.load(ws + (n_first // SCALE_N) * stride_wsn), SWAP_AB)
    else:
        return _grid_mul(xs, tl.load(ws + (offs_n // SCALE_N) * stride_wsn, mask=n_ok, other=0.0), SWAP_AB)


@triton.jit
def _mma(a, b, acc, SWAP_AB: tl.constexpr):
    """acc += a @ b, with a [BM, BK] / b [BK, BN] or, swapped, b [BN, BK] @ a [BK, BM]."""
    if SWAP_AB:
        return tl.dot(b, a, acc)
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _halves(acc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP_AB: tl.constexpr):
    """The gate and up tiles of GEMM1's merged accumulator, whose columns (rows when swapped) alternate
    gate n, up n: [BM, 2BN] -> two [BM, BN], or [2BN, BM] -> two [BN, BM]."""
    if SWAP_AB:
        return tl.split(tl.permute(tl.reshape(acc, (BLOCK_N, 2, BLOCK_M)), (0, 2, 1)))
    else:
        return tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))


@triton.jit
def _tile_coords(pid, max_pid_m, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
                 COLUMNS_FIRST: tl.constexpr = False):
    """Map tile number ``pid`` to (pid_m, pid_n), grouping GROUP_M row tiles for weight reuse in L2, or
    with ``COLUMNS_FIRST`` every row tile of column tile 0, then of column tile 1, and so on.

    The layout covers ``max_pid_m`` row tiles (the grid's bound, not the used count), so no
    load precedes the slot and expert loads; programs whose row tile lies past the align's
    used length skip it (``_tile_slots``).
    """
    if COLUMNS_FIRST:
        return pid % max_pid_m, pid // max_pid_m
    num_pid_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_pid_n
    first_m = (pid // in_group) * GROUP_M
    group_rows = tl.minimum(max_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_rows
    pid_n = (pid % in_group) // group_rows
    return pid_m, pid_n


@triton.jit
def _k_share(k_steps, SPLIT_K: tl.constexpr):
    """This program's K steps [k_first, k_last): all ``k_steps``, or with SPLIT_K > 1 its split's share,
    the split being the program id modulo SPLIT_K (a tile's splits are adjacent programs)."""
    if SPLIT_K == 1:
        return 0, k_steps
    else:
        per_split = tl.cdiv(k_steps, SPLIT_K)
        k_first = (tl.program_id(0) % SPLIT_K) * per_split
        return k_first, tl.minimum(k_first + per_split, k_steps)


@triton.jit
def _tile_slots(pid_m, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, num_slots, BLOCK_M: tl.constexpr,
                DIRECT: tl.constexpr, PDL: tl.constexpr, WAIT_DIRECT: tl.constexpr = True):
    """The row tile's slot ids [BLOCK_M], its expert, and whether it lies within the used length.

    The three loads are independent, so they are in flight together: no second memory round trip
    (the used length first) ahead of every program's first operand load.

    ``DIRECT`` (no align step): row tile ``pid_m`` is token slot ``pid_m`` alone, in its first row,
    and ``expert_ids_ptr`` is ``topk_ids`` flattened ``[T]``; a slot of expert -1 (an expert of another
    rank, ``expert_map``) is not valid. The align step leaves such slots out of its tiles.

    ``PDL`` (a dependent launch, ``kernels/pdl.py``): the align's output comes from earlier launches, so
    the program waits before loading it; ``topk_ids`` is an input of the layer, so with ``DIRECT`` the
    expert is loaded first and the program waits after (without ``WAIT_DIRECT`` the caller waits, once it
    has loaded what else it may read early). Every program waits either way.
    """
    dependent.start(PDL, WAIT=not DIRECT)
    if DIRECT:
        valid = pid_m < num_slots
        slot = tl.where(tl.arange(0, BLOCK_M) == 0, pid_m, num_slots)  # [BLOCK_M]; one real row
        expert = tl.load(expert_ids_ptr + pid_m, mask=valid, other=0).to(tl.int64)
        valid = valid & (expert >= 0)
        if WAIT_DIRECT:
            dependent.wait(PDL)
    else:
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        slot = tl.load(sorted_ids_ptr + offs_m)  # [BLOCK_M]; within the grid's bound, so never past the end
        expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
        valid = pid_m * BLOCK_M < tl.load(num_padded_ptr)
    return slot, expert, valid



@triton.jit
def _tile_rows(slot, num_slots, BLOCK_M: tl.constexpr, TAIL: tl.constexpr):
    """The rows a row tile runs at (``tail_tiles``): BLOCK_M, or BLOCK_M >> i for the largest i <= TAIL at
    which its real slots (first in the tile: the align pads after them) fit. Without TAIL, BLOCK_M."""
    rows = tl.full((), BLOCK_M, tl.int32)
    if TAIL > 0:
        real = tl.sum((slot < num_slots).to(tl.int32))
        for i in tl.static_range(1, TAIL + 1):
            rows = tl.where(real <= BLOCK_M >> i, BLOCK_M >> i, rows)
    return rows


@triton.jit
def _head_slots(slot, sorted_ids_ptr, pid_m, BLOCK_M: tl.constexpr, ROWS: tl.constexpr):
    """The first ROWS of row tile ``pid_m``'s slot ids ``slot`` [BLOCK_M], read again for a tail tile."""
    if ROWS == BLOCK_M:
        return slot
    else:
        return tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, ROWS))

